#version 450
// attention_combine: stage 2 of the split decode attention. For query t, head h, merges the
// n_splits partial states {m, l, acc[D]} of attention_decode.comp or attention_split.comp:
//   out[t, h, :] = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s,  M = max_s m_s.
// With flags 1 it also writes row 0 of out as int8 blocks for matvec_q8a (act_q8.comp's
// layout, K = H * D, D % 32 == 0: a head's blocks are its own), the o projection's input, so
// that product needs no act_q8 dispatch.
// Bindings: 0 part f32 | 1 out f32 [n, H, D] | 2 int8 output (flags 1)
// One workgroup of 128 per (head, token); D <= 512, n_splits <= 64.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 128) in;

#include "common.glsl"

layout(binding = 0) readonly buffer P_ { float part[]; };
layout(binding = 1) writeonly buffer O_ { float o[]; };
layout(binding = 2) writeonly buffer Q8_ { uvec4 q8[]; };
layout(binding = 2) writeonly buffer Q8S_ { vec4 q8s[]; };

layout(push_constant) uniform PC { uint n_heads, head_dim, n_splits, flags; } pc;

const uint MAX_SPLITS = 64u; // forge.c's FORGE__ATTN_SPLITS
shared float sm_out[512]; // forge.c FORGE__MAX_HEAD_DIM
shared float sm_m[MAX_SPLITS], sm_w[MAX_SPLITS];

void main() {
    uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, D = pc.head_dim, tid = gl_LocalInvocationID.x;
    uint base = (t * pc.n_heads + h) * pc.n_splits * (D + 2u);
    // every split's (m, l) in one parallel load (a serial loop over up to 64 splits, each a
    // dependent L2 round trip, took 19 us a layer on the H100)
    for (uint s = tid; s < pc.n_splits; s += 128u) {
        sm_m[s] = part[base + s * (D + 2u)];
        sm_w[s] = part[base + s * (D + 2u) + 1u];
    }
    barrier();
    float M = -1.0 / 0.0;
    uint n = 0u; // splits up to the last with keys (the empty ones trail: short contexts leave them)
    for (uint s = 0; s < pc.n_splits; s++) {
        M = max(M, sm_m[s]);
        if (sm_m[s] > -1.0 / 0.0) n = s + 1u;
    }
    float L = 0.0;
    for (uint s = 0; s < n; s++)
        if (sm_m[s] > -1.0 / 0.0) L += exp(sm_m[s] - M) * sm_w[s];
    barrier(); // every thread has read the l's
    for (uint s = tid; s < n; s += 128u) sm_w[s] = sm_m[s] > -1.0 / 0.0 ? exp(sm_m[s] - M) / L : 0.0;
    barrier();
    for (uint d = tid; d < D; d += 128u) {
        float acc = 0.0;
        uint s = 0u, at = base + 2u + d;
        for (; s + 8u <= n; s += 8u) { // eight independent loads in flight
            float a[8];
            [[unroll]] for (uint i = 0u; i < 8u; i++) a[i] = part[at + (s + i) * (D + 2u)];
            [[unroll]] for (uint i = 0u; i < 8u; i++) acc += sm_w[s + i] * a[i];
        }
        for (; s < n; s++) acc += sm_w[s] * part[at + s * (D + 2u)];
        o[(t * pc.n_heads + h) * D + d] = acc;
        sm_out[d] = acc;
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
