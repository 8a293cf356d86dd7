#version 450
// rope_back: the backward twin of rope.comp. A rotation's transpose is the rotation by the
// opposite angle, so the gradients of the queries and keys before RoPE are the gradients
// after it rotated by -(pos * inv_freq[i]), in place, pairs as in the forward pass:
//   rotate-half (HF): (i, i + D/2); adjacent pairs (GGUF llama): (2i, 2i + 1).
// dq and dk are column ranges of one row per token (the fused qkv gradient rows): row t at
// t * stride, dq at column 0 (n_heads heads), dk at k_off (n_kv_heads). Token t of a batch of
// sequences of seq_len tokens is at position pos0 + t % seq_len (seq_len 0: one sequence).
// Bindings: 0 params {pos0, n} | 1 inv_freq f32 [D/2] | 2 dqkv f32 [n, stride] (in place)
// One invocation per pair: the n * n_heads * D/2 query pairs, then the n * n_kv_heads * D/2 key pairs.
// Also the context shift's re-rotation (forge.c, forge__rope_shift): over K cache rows as n
// "tokens" of key heads only (n_heads 0, k_off the first row), seq_len 1 and pos0 = d, it
// turns keys rotated for position p into keys rotated for p - d, in place. Built with -DKV_F16
// it is only that, on an f16 cache: one invocation per two pairs of a key head (common.glsl's
// kv16_ helpers), the n * n_kv_heads * D/4 of them; stride and k_off count elements. Built with
// -DKV_Q8, on a q8_0 cache (kv8_ helpers): a workgroup per key head, the n * n_kv_heads of them,
// which reads the head's values into shared memory, rotates them and quantizes its blocks again
// (a rotation mixes blocks: rotate-half pairs lie D/2 apart); stride and k_off count elements
// still (head (t * stride + k_off) / D + h), D <= 512.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;

#include "common.glsl"

layout(binding = 0) readonly buffer P_ { uint pos0; uint n_tok; } params;
layout(binding = 1) readonly buffer F_ { float inv_freq[]; };
#if defined(KV_F16) || defined(KV_Q8)
layout(binding = 2) buffer X_ { uint xw[]; };
#else
layout(binding = 2) buffer X_ { float x[]; };
#endif

// push constants: forge__pc_rope_back (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC {
    uint n_tokens, n_heads, n_kv_heads, head_dim, adjacent, stride, k_off, seq_len;
} pc;

// A pair (first, second) rotated by -(pos * inv_freq[i]).
vec2 unrotated(vec2 g, uint i, uint pos) {
    vec2 cs = cos_sin(float(pos) * inv_freq[i]);
    return vec2(g.x * cs.x + g.y * cs.y, g.y * cs.x - g.x * cs.y);
}

#ifdef KV_Q8
shared float sh_in[512], sh_out[512];
shared float sh_d[16];

void main() {
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (wg >= pc.n_tokens * pc.n_kv_heads) return; // the whole workgroup
    uint tid = gl_LocalInvocationID.x, D = pc.head_dim, half_d = D / 2u, nb = D / 32u;
    uint h = wg % pc.n_kv_heads, t = wg / pc.n_kv_heads;
    uint pos = params.pos0 + (pc.seq_len != 0u ? t % pc.seq_len : t);
    uint hb = ((t * pc.stride + pc.k_off) / D + h) * kv8_words(D);
    bool adj = pc.adjacent != 0u;
    for (uint e = tid; e < D; e += 64u) sh_in[e] = KV8_AT(xw, hb, D, e);
    barrier();
    for (uint e = tid; e < D; e += 64u) {
        bool first = adj ? (e & 1u) == 0u : e < half_d;
        uint i = adj ? e / 2u : (first ? e : e - half_d);
        uint i0 = adj ? 2u * i : i, i1 = adj ? 2u * i + 1u : i + half_d;
        vec2 g = unrotated(vec2(sh_in[i0], sh_in[i1]), i, pos);
        sh_out[e] = first ? g.x : g.y;
    }
    barrier();
    if (tid < nb) {
        float amax = 0.0;
        for (uint e = 0u; e < 32u; e++) amax = max(amax, abs(sh_out[32u * tid + e]));
        float d = kv8_scale(amax);
        sh_d[tid] = d;
        for (uint w = 0u; w < 8u; w++) {
            uint o = 32u * tid + 4u * w;
            xw[hb + 8u * tid + w] = kv8_pack(ivec4(kv8_code(sh_out[o], d), kv8_code(sh_out[o + 1u], d), kv8_code(sh_out[o + 2u], d),
                                                   kv8_code(sh_out[o + 3u], d)));
        }
    }
    barrier();
    if (2u * tid < nb) xw[hb + D / 4u + tid] = packHalf2x16(vec2(sh_d[2u * tid], 2u * tid + 1u < nb ? sh_d[2u * tid + 1u] : 0.0));
}
#else
void main() {
    uint half_d = pc.head_dim / 2u;
    uint idx = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64u;
#ifdef KV_F16
    uint per_head = half_d / 2u;
    if (idx >= pc.n_tokens * pc.n_kv_heads * per_head) return;
    uint j = idx % per_head, th = idx / per_head;
    uint h = th % pc.n_kv_heads, t = th / pc.n_kv_heads;
    uint pos = params.pos0 + (pc.seq_len != 0u ? t % pc.seq_len : t);
    bool adj = pc.adjacent != 0u;
    uvec2 w = kv16_words((t * pc.stride + pc.k_off + h * pc.head_dim) / 2u, j, half_d, adj);
    vec2 a, b;
    kv16_unpack(uvec2(xw[w.x], xw[w.y]), adj, a, b);
    uvec2 r = kv16_pack(unrotated(a, 2u * j, pos), unrotated(b, 2u * j + 1u, pos), adj);
    xw[w.x] = r.x;
    xw[w.y] = r.y;
#else
    uint n_q = pc.n_tokens * pc.n_heads * half_d;
    bool is_k = idx >= n_q;
    if (is_k) idx -= n_q;
    uint heads = is_k ? pc.n_kv_heads : pc.n_heads;
    if (idx >= pc.n_tokens * heads * half_d) return;
    uint i = idx % half_d;
    uint th = idx / half_d;
    uint h = th % heads, t = th / heads;
    uint pos = params.pos0 + (pc.seq_len != 0u ? t % pc.seq_len : t);
    uint i0 = pc.adjacent != 0u ? 2u * i : i;
    uint i1 = pc.adjacent != 0u ? 2u * i + 1u : i + half_d;
    uint src = t * pc.stride + (is_k ? pc.k_off : 0u) + h * pc.head_dim;
    vec2 g = unrotated(vec2(x[src + i0], x[src + i1]), i, pos);
    x[src + i0] = g.x;
    x[src + i1] = g.y;
#endif
}
#endif
