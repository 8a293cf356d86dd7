#version 450
// attention_split: decode attention split along the keys (flash-decoding), stage 1.
// Query t, head h (causal, GQA, window, soft-cap, rotating slots: as attention.comp) has its
// keys in tiles of 64 from lo; workgroup (s, h, t) takes tiles s, s + S, s + 2S, ... with an
// online softmax and writes its partial state part[((t * H + h) * S + s)] = {m, l, acc[D]}:
// m = max score, l = sum exp(score - m), acc = sum exp(score - m) V (m = -inf: no keys).
// attention_combine.comp merges the S splits. K is read as vec4 (D % 4 == 0).
// Batch generation (flags 2): query t is at position tab[TAB + 2t] of sequence tab[TAB + 2t + 1],
// whose keys and values fill slots [seq * cache_slots, (seq + 1) * cache_slots) of the caches.
// Bindings: 0 params {pos0, n} | 1 q f32 [n, q_stride] (heads at h * D) | 2 K cache | 3 V cache | 4 part f32
// One workgroup of 64 per (split, head, token); D <= DMAX <= 512. The cache is f32, f16 with -DKV_F16
// or q8_0 with -DKV_Q8.
// Spec constant 0 = DMAX (the model's head_dim rounded up to 8).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 64) in;

#include "common.glsl"

layout(binding = 0) readonly buffer P_ { uint pos0; uint n_tok; uint tab[]; } params;
const uint TAB = 14; // the row table at byte 64
layout(binding = 1) readonly buffer Q_ { vec4 q4[]; };
// Head hd of the cache (a key position's kv head): its key's piece i of 4 values and its value's element e.
#ifdef KV_F16 // an f16 cache (common.glsl)
layout(binding = 2) readonly buffer K_ { uvec2 kc4[]; };
layout(binding = 3) readonly buffer V_ { uint vcw[]; };
#define K_PIECE(hd, i) unpack_f16x4(kc4[(hd) * D4 + (i)])
#define V_AT(hd, e) f16_at(vcw[((hd) * D + (e)) >> 1], e)
#elif defined(KV_Q8) // a q8_0 cache (common.glsl)
layout(binding = 2) readonly buffer K_ { uint kcw[]; };
layout(binding = 3) readonly buffer V_ { uint vcw[]; };
#define K_PIECE(hd, i) KV8_PIECE(kcw, (hd) * kv8_words(D), D, i)
#define V_AT(hd, e) KV8_AT(vcw, (hd) * kv8_words(D), D, e)
#else
layout(binding = 2) readonly buffer K_ { vec4 kc4[]; };
layout(binding = 3) readonly buffer V_ { float vc[]; };
#define K_PIECE(hd, i) kc4[(hd) * D4 + (i)]
#define V_AT(hd, e) vc[(hd) * D + (e)]
#endif
layout(binding = 4) writeonly buffer O_ { float part[]; };

#include "pc_attention.glsl"

layout(constant_id = 0) const uint DMAX = 256;
const uint T = 64;
const uint NACC = (DMAX + T - 1u) / T; // output dimensions a thread owns
shared vec4 qs[DMAX / 4u];
shared float ps[T];
shared float red[T];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint s = gl_WorkGroupID.x, h = gl_WorkGroupID.y, t = gl_WorkGroupID.z;
    uint D = pc.head_dim, D4 = D / 4u;
    uint p = params.pos0 + t, kv0 = 0u; // kv0: the sequence's first slot
    if ((pc.flags & 2u) != 0u) {
        p = params.tab[TAB + 2u * t];
        kv0 = params.tab[TAB + 2u * t + 1u] * pc.cache_slots;
    }
    uint lo = (pc.window != 0u && p + 1u > pc.window) ? p + 1u - pc.window : 0u;
    uint kvh = h / (pc.n_heads / pc.n_kv_heads);
    uint qb = (t * pc.q_stride + h * D) / 4u;
    for (uint d = tid; d < D4; d += T) qs[d] = q4[qb + d];
    barrier();
    float m = -1.0 / 0.0, l = 0.0;
    float acc[NACC];
    [[unroll]] for (uint k = 0; k < NACC; k++) acc[k] = 0.0;
    for (uint j0 = lo + s * T; j0 <= p; j0 += pc.n_splits * T) {
        uint j = j0 + tid;
        float sc = -1.0 / 0.0;
        if (j <= p) {
            uint kh = (kv0 + j % pc.cache_slots) * pc.n_kv_heads + kvh;
            float dot_qk = 0.0;
            for (uint d = 0; d < D4; d++) dot_qk += dot(qs[d], K_PIECE(kh, d));
            sc = dot_qk * pc.scale;
            if (pc.softcap > 0.0) sc = safe_tanh(sc / pc.softcap) * pc.softcap;
        }
        red[tid] = sc;
        barrier();
        for (uint w = T / 2u; w > 0u; w >>= 1) {
            if (tid < w) red[tid] = max(red[tid], red[tid + w]);
            barrier();
        }
        float m_new = max(m, red[0]);
        barrier();
        float e = j <= p ? exp(sc - m_new) : 0.0;
        ps[tid] = e;
        red[tid] = e;
        barrier();
        for (uint w = T / 2u; w > 0u; w >>= 1) {
            if (tid < w) red[tid] += red[tid + w];
            barrier();
        }
        float corr = exp(m - m_new);
        l = l * corr + red[0];
        m = m_new;
        uint nk = min(T, p + 1u - j0);
        for (uint k = 0; k < NACC; k++) {
            uint d = tid + k * T;
            if (d >= D) break;
            float a = acc[k] * corr;
            for (uint jj = 0; jj < nk; jj++) a += ps[jj] * V_AT((kv0 + (j0 + jj) % pc.cache_slots) * pc.n_kv_heads + kvh, d);
            acc[k] = a;
        }
        barrier();
    }
    uint pb = ((t * pc.n_heads + h) * pc.n_splits + s) * (D + 2u);
    for (uint k = 0; k < NACC; k++) {
        uint d = tid + k * T;
        if (d < D) part[pb + 2u + d] = acc[k];
    }
    if (tid == 0u) { part[pb] = m; part[pb + 1u] = l; }
}
