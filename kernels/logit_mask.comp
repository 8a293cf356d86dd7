#version 450
// logit_mask: a constraint's allowed tokens applied in place to the row of logits the sampler
// reduces next (after penalty.comp, before topk.comp): logits[i] = -inf where bit i of the mask
// is clear. The host writes the mask of the grammar's state before the step, so the device's
// best candidates are allowed tokens: a greedy constrained draw is the plain argmax, and a
// sampled one's normalizer sums the allowed tokens alone (src/generate.c).
// Bindings: 0 mask u32 [ceil(V / 32)] (bit i of word i / 32: token i allowed) | 1 logits f32 [V]
layout(local_size_x = 256) in;

layout(binding = 0) readonly buffer M_ { uint mask[]; };
layout(binding = 1) buffer L_ { float logits[]; };

// push constants: the host pushes one uint32_t (src/forward.c), its op row's size (checked against the block's)
layout(push_constant) uniform PC { uint n_vocab; } pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.n_vocab) return;
    if (((mask[i >> 5] >> (i & 31u)) & 1u) == 0u) logits[i] = -1.0 / 0.0;
}
