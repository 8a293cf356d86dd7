#version 450
// penalty: the repeat penalty, in place on one row of logits, for the distinct token ids of
// the recent window: positive logits are divided by the penalty, negative ones multiplied
// (go-mlx's rule). Ids and count come from the step params (written by the host each step),
// so the recorded decode step serves every call.
// Bindings: 0 params {.., n_penalty, penalty, ..} | 1 ids u32 [n_penalty] | 2 logits f32 [V]
layout(local_size_x = 64) in;

layout(binding = 0) readonly buffer P_ { uint pos0; uint n_tok; uint n_penalty; float penalty; float inv_temp; } params;
layout(binding = 1) readonly buffer I_ { uint ids[]; };
layout(binding = 2) buffer L_ { float logits[]; };

// push constants: the host pushes one uint32_t (src/forward.c), its op row's size (checked against the block's)
layout(push_constant) uniform PC { uint n_vocab; } pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= params.n_penalty) return;
    uint t = ids[i];
    if (t >= pc.n_vocab) return;
    float l = logits[t];
    logits[t] = l > 0.0 ? l / params.penalty : l * params.penalty;
}
