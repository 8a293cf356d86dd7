#version 450
// attention_combine: stage 2 of the split decode attention. For query t, head h, merges the
// n_splits partial states {m, l, acc[D]} of attention_decode.comp or attention_split.comp:
//   out[t, h, :] = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s,  M = max_s m_s.
// With flags 1 it also writes row 0 of out as int8 blocks for matvec_q8a (act_q8.comp's
// layout, K = H * D, D % 32 == 0: a head's blocks are its own), the o projection's input, so
// that product needs no act_q8 dispatch.
// Bindings: 0 part f32 | 1 out f32 [n, H, D] | 2 int8 output (flags 1)
// One workgroup of 64 per (head, token); D <= 256.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;

#include "common.glsl"

layout(binding = 0) readonly buffer P_ { float part[]; };
layout(binding = 1) writeonly buffer O_ { float o[]; };
layout(binding = 2) writeonly buffer Q8_ { uvec4 q8[]; };
layout(binding = 2) writeonly buffer Q8S_ { vec4 q8s[]; };

layout(push_constant) uniform PC { uint n_heads, head_dim, n_splits, flags; } pc;

shared float sm_out[256];

void main() {
    uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, D = pc.head_dim;
    uint base = (t * pc.n_heads + h) * pc.n_splits * (D + 2u);
    float M = -1.0 / 0.0;
    for (uint s = 0; s < pc.n_splits; s++) M = max(M, part[base + s * (D + 2u)]);
    float L = 0.0;
    for (uint s = 0; s < pc.n_splits; s++) {
        float ms = part[base + s * (D + 2u)];
        if (ms > -1.0 / 0.0) L += exp(ms - M) * part[base + s * (D + 2u) + 1u];
    }
    for (uint d = gl_LocalInvocationID.x; d < D; d += 64u) {
        float acc = 0.0;
        for (uint s = 0; s < pc.n_splits; s++) {
            float ms = part[base + s * (D + 2u)];
            if (ms > -1.0 / 0.0) acc += exp(ms - M) * part[base + s * (D + 2u) + 2u + d];
        }
        o[(t * pc.n_heads + h) * D + d] = acc / L;
        sm_out[d] = acc / L;
    }
    if ((pc.flags & 1u) == 0u || t != 0u) return;
    barrier();
    uint b = gl_LocalInvocationID.x, K = pc.n_heads * D; // this head's blocks of 32: b < D / 32
    if (b >= D / 32u) return;
    vec4 v[8];
    for (uint i = 0u; i < 8u; i++) v[i] = vec4(sm_out[32u * b + 4u * i], sm_out[32u * b + 4u * i + 1u], sm_out[32u * b + 4u * i + 2u],
                                              sm_out[32u * b + 4u * i + 3u]);
    uint w[8];
    vec2 ds;
    quantize_q8_block(v, w, ds);
    uint gb = h * (D / 32u) + b; // the block's index in the row
    q8[2u * gb] = uvec4(w[0], w[1], w[2], w[3]);
    q8[2u * gb + 1u] = uvec4(w[4], w[5], w[6], w[7]);
    q8s[(K >> 4) + gb] = vec4(ds, 0.0, 0.0);
}
