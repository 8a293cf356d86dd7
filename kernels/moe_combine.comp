#version 450
// moe_combine: a mixture-of-experts layer's output from its experts' (the prefill's grouped
// products): out[t, i] (+)= sum over j < top_k of weight(t, j) * y[t * top_k + j, i], the
// choices in rank order (route from moe_route.comp). flags 1: add to out (the residual);
// 2: every weight 1 (training: the pairs' input gradients summed into their token's).
// Bindings: 0 route uvec2 [n_tokens * top_k] | 1 y f32 [n_tokens * top_k, dim] | 2 out f32 [n_tokens, dim]
layout(local_size_x = 256) in;

layout(binding = 0) readonly buffer R_ { uvec2 route[]; };
layout(binding = 1) readonly buffer Y_ { float y[]; };
layout(binding = 2) buffer O_ { float o[]; };

// push constants: forge__pc_moe_combine (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC { uint n_tokens, dim, top_k, flags; } pc;

void main() {
    uint i = gl_GlobalInvocationID.x, t = gl_WorkGroupID.y + gl_WorkGroupID.z * gl_NumWorkGroups.y;
    if (i >= pc.dim || t >= pc.n_tokens) return;
    float acc = 0.0;
    for (uint j = 0; j < pc.top_k; j++) {
        uint p = t * pc.top_k + j;
        acc += ((pc.flags & 2u) != 0u ? 1.0 : uintBitsToFloat(route[p].y)) * y[p * pc.dim + i];
    }
    uint oi = t * pc.dim + i;
    o[oi] = (pc.flags & 1u) != 0u ? o[oi] + acc : acc;
}
