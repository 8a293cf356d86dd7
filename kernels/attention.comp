#version 450
// attention: causal softmax attention of n query tokens over the KV cache, with grouped
// query heads, an optional sliding window and optional tanh soft-capping (Gemma 2).
//   out[t, h, :] = sum_j softmax_j(s_j) V[j, h / group, :],
//   s_j = cap(scale * q[t, h, :] . K[j, h / group, :]), j in [lo, p], p = pos0 + t,
//   lo = window ? max(0, p - window + 1) : 0; key j lives at cache slot j % cache_slots.
// Online softmax over tiles of 64 keys: nothing of size n x context is materialized.
// Bindings: 0 params {pos0, n} | 1 q f32 [n, H, D] | 2 K cache f32 [slots, Hkv, D]
//           3 V cache f32 [slots, Hkv, D] | 4 out f32 [n, H, D]
// One workgroup of 64 per (token, head); D <= 256.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;

#include "common.glsl"

layout(binding = 0) readonly buffer P_ { uint pos0; uint n_tok; } params;
layout(binding = 1) readonly buffer Q_ { float q[]; };
layout(binding = 2) readonly buffer K_ { float kc[]; };
layout(binding = 3) readonly buffer V_ { float vc[]; };
layout(binding = 4) writeonly buffer O_ { float o[]; };

layout(push_constant) uniform PC {
    uint n_tokens, n_heads, n_kv_heads, head_dim, cache_slots, window;
    float scale, softcap;
} pc;

const uint T = 64;
shared float qs[256];
shared float ps[T];
shared float red[T];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint t = gl_WorkGroupID.x, h = gl_WorkGroupID.y;
    uint D = pc.head_dim;
    uint p = params.pos0 + t;
    uint lo = (pc.window != 0u && p + 1u > pc.window) ? p + 1u - pc.window : 0u;
    uint kvh = h / (pc.n_heads / pc.n_kv_heads);
    uint qb = (t * pc.n_heads + h) * D;
    for (uint d = tid; d < D; d += T) qs[d] = q[qb + d];
    barrier();

    float m = -1.0 / 0.0, l = 0.0;
    float acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
    for (uint j0 = lo; j0 <= p; j0 += T) {
        uint j = j0 + tid;
        float s = -1.0 / 0.0;
        if (j <= p) {
            uint kb = ((j % pc.cache_slots) * pc.n_kv_heads + kvh) * D;
            float dot_qk = 0.0;
            for (uint d = 0; d < D; d++) dot_qk += qs[d] * kc[kb + d];
            s = dot_qk * pc.scale;
            if (pc.softcap > 0.0) s = safe_tanh(s / pc.softcap) * pc.softcap;
        }
        red[tid] = s;
        barrier();
        for (uint w = T / 2u; w > 0u; w >>= 1) {
            if (tid < w) red[tid] = max(red[tid], red[tid + w]);
            barrier();
        }
        float m_new = max(m, red[0]);
        barrier();
        float pj = j <= p ? exp(s - m_new) : 0.0;
        ps[tid] = pj;
        red[tid] = pj;
        barrier();
        for (uint w = T / 2u; w > 0u; w >>= 1) {
            if (tid < w) red[tid] += red[tid + w];
            barrier();
        }
        float corr = exp(m - m_new);
        l = l * corr + red[0];
        m = m_new;
        uint nk = min(T, p + 1u - j0);
        for (uint e = 0; e < 4u; e++) {
            uint d = tid + e * T;
            if (d >= D) break;
            float a = acc[e] * corr;
            for (uint jj = 0; jj < nk; jj++)
                a += ps[jj] * vc[(((j0 + jj) % pc.cache_slots) * pc.n_kv_heads + kvh) * D + d];
            acc[e] = a;
        }
        barrier();
    }
    for (uint e = 0; e < 4u; e++) {
        uint d = tid + e * T;
        if (d < D) o[qb + d] = acc[e] / l;
    }
}
