#version 450
#extension GL_GOOGLE_include_directive : require
// gated_norm: the gated RMSNorm of a linear-attention layer's output (Qwen 3.5's RMSNormGated),
// after delta_rule_sg.comp: per row t and value head h, over the head's v_dim outputs,
//   o = o / sqrt(mean(o^2) + eps) * w * silu(z_h)
// with one weight w [v_dim] for every head and the gate z from the in-projection's row.
// (delta_rule.comp applies the same norm itself.) One workgroup per (head, row), in place.
// Bindings: 0 mix f32 [n, mix_stride] (z at z_off [v_heads, v_dim]) | 1 w f32 [v_dim]
//           2 o f32 [n, v_heads * v_dim]
layout(local_size_x = 64) in;

layout(binding = 0) readonly buffer M_ { float mix[]; };
layout(binding = 1) readonly buffer W_ { float nw[]; };
layout(binding = 2) buffer O_ { float o[]; };

// push constants: forge__pc_delta (src/ops.c), field for field (checked against its size)
#include "pc_delta.glsl"

const uint WG = 64u;
shared float red[WG];

void main() {
    uint tid = gl_LocalInvocationID.x, h = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
    uint DV = pc.v_dim, ob = t * pc.v_heads * DV + h * DV, zb = t * pc.mix_stride + pc.z_off + h * DV;
    float ss = 0.0;
    for (uint j = tid; j < DV; j += WG) ss += o[ob + j] * o[ob + j];
    red[tid] = ss;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        barrier();
    }
    float inv = inversesqrt(red[0] / float(DV) + pc.eps);
    for (uint j = tid; j < DV; j += WG) {
        float z = mix[zb + j];
        o[ob + j] = o[ob + j] * inv * nw[j] * (z / (1.0 + exp(-z)));
    }
}
