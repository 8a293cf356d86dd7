#version 450
// rope: rotates pairs of each head by angle (pos0 + t) * inv_freq[i], for the queries (in
// place) and the keys (into the KV cache, with the values copied beside them), in one pass.
//   rotate-half (HF):        pair (i, i + D/2)
//   adjacent pairs (GGUF):   pair (2i, 2i + 1)
// q, k and v are column ranges of one row per token (the fused qkv product): row t starts at
// t * stride; q at column 0 (n_heads heads), k at k_off and v at v_off (n_kv_heads each). Keys
// and values land in slot pos % cache_slots (a rotating cache when it is smaller than the
// context). Positions come from the params buffer, so a recorded command buffer serves every
// step. Training runs a batch of sequences of seq_len tokens as one: token t is at position
// pos0 + t % seq_len and its keys go to slot (pos0 + t) % cache_slots (seq_len 0: one sequence).
// Batch generation (table 1) runs rows of several sequences, each with its own cache region of
// cache_slots slots: row t is at position tab[TAB + 2t] of sequence tab[TAB + 2t + 1], read
// from the params buffer after the step params (byte 64).
// Bindings: 0 params {pos0, n} | 1 inv_freq f32 [D/2] | 2 qkv f32 [n, stride] (q rotated in place)
//           3 K cache [slots, n_kv_heads, D] | 4 V cache [slots, n_kv_heads, D]
// One invocation per pair: the n * n_heads * D/2 query pairs, then the n * n_kv_heads * D/2 key
// pairs; with -DKV_F16 (an f16 cache, common.glsl's kv16_ helpers) one per two key pairs, the
// n * n_kv_heads * D/4 of them, so that an invocation writes whole words of the cache; with
// -DKV_Q8 (a q8_0 cache, common.glsl's kv8_ helpers) one per scale word of a key head (two
// blocks of 32: its keys and values quantized), the n * n_kv_heads * ceil(D/64) of them.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;

#include "common.glsl"

layout(binding = 0) readonly buffer P_ { uint pos0; uint n_tok; uint tab[]; } params;
const uint TAB = 14; // the row table at byte 64
layout(binding = 1) readonly buffer F_ { float inv_freq[]; };
layout(binding = 2) buffer X_ { float x[]; };
#if defined(KV_F16) || defined(KV_Q8)
layout(binding = 3) writeonly buffer KC_ { uint kc[]; };
layout(binding = 4) writeonly buffer VC_ { uint vc[]; };
#else
layout(binding = 3) writeonly buffer KC_ { float kc[]; };
layout(binding = 4) writeonly buffer VC_ { float vc[]; };
#endif

// push constants: forge__pc_rope (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC {
    uint n_tokens, n_heads, n_kv_heads, head_dim, adjacent, cache_slots, stride, k_off, v_off, seq_len, table;
} pc;

// Pair i of the head whose row starts at x[src], rotated for position pos: (first, second).
vec2 rotated(uint src, uint i, uint half_d, uint pos) {
    uint i0 = pc.adjacent != 0u ? 2u * i : i;
    uint i1 = pc.adjacent != 0u ? 2u * i + 1u : i + half_d;
    return rope_pair(vec2(x[src + i0], x[src + i1]), cos_sin(float(pos) * inv_freq[i]));
}

// Pair i of the head whose row starts at x[src], as it is.
vec2 pair_at(uint src, uint i, uint half_d) {
    return pc.adjacent != 0u ? vec2(x[src + 2u * i], x[src + 2u * i + 1u]) : vec2(x[src + i], x[src + i + half_d]);
}

#ifdef KV_Q8
// Element e of the head whose row starts at x[src], rotated for position pos (its pair's
// rotation, the arithmetic of the f32 store).
float rotated_element(uint src, uint e, uint half_d, uint pos) {
    bool adj = pc.adjacent != 0u, first = adj ? (e & 1u) == 0u : e < half_d;
    vec2 y = rotated(src, adj ? e / 2u : (first ? e : e - half_d), half_d, pos);
    return first ? y.x : y.y;
}

// Block b of a head (32 values) into the cache's codes at word hb + 8 b; returns its scale.
float store_block(bool keys, float v[32], uint hb, uint b) {
    float amax = 0.0;
    for (uint e = 0u; e < 32u; e++) amax = max(amax, abs(v[e]));
    float d = kv8_scale(amax);
    for (uint w = 0u; w < 8u; w++) {
        uint code = kv8_pack(ivec4(kv8_code(v[4u * w], d), kv8_code(v[4u * w + 1u], d), kv8_code(v[4u * w + 2u], d), kv8_code(v[4u * w + 3u], d)));
        if (keys) kc[hb + 8u * b + w] = code;
        else vc[hb + 8u * b + w] = code;
    }
    return d;
}
#endif

void main() {
    uint half_d = pc.head_dim / 2u;
    uint idx = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64u;
    uint n_q = pc.n_tokens * pc.n_heads * half_d;
    bool is_k = idx >= n_q;
    if (is_k) idx -= n_q;
    uint heads = is_k ? pc.n_kv_heads : pc.n_heads;
#ifdef KV_F16
    uint per_head = is_k ? half_d / 2u : half_d; // invocations per head
#elif defined(KV_Q8)
    uint per_head = is_k ? (pc.head_dim / 32u + 1u) / 2u : half_d;
#else
    uint per_head = half_d;
#endif
    if (idx >= pc.n_tokens * heads * per_head) return;
    uint i = idx % per_head;
    uint th = idx / per_head;
    uint h = th % heads, t = th / heads;
    uint pos = params.pos0 + (pc.seq_len != 0u ? t % pc.seq_len : t);
    uint slot = (params.pos0 + t) % pc.cache_slots;
    if (pc.table != 0u) {
        pos = params.tab[TAB + 2u * t];
        slot = params.tab[TAB + 2u * t + 1u] * pc.cache_slots + pos % pc.cache_slots;
    }
    uint src = t * pc.stride + (is_k ? pc.k_off : 0u) + h * pc.head_dim;
    if (!is_k) {
        vec2 y = rotated(src, i, half_d, pos);
        x[src + (pc.adjacent != 0u ? 2u * i : i)] = y.x;
        x[src + (pc.adjacent != 0u ? 2u * i + 1u : i + half_d)] = y.y;
        return;
    }
    uint dst = (slot * pc.n_kv_heads + h) * pc.head_dim;
    uint vs = t * pc.stride + pc.v_off + h * pc.head_dim;
#ifdef KV_Q8
    // blocks 2i and 2i + 1 of the key head and of the value head, then their scale words
    uint hb = (slot * pc.n_kv_heads + h) * kv8_words(pc.head_dim), nb = pc.head_dim / 32u;
    vec2 dk = vec2(0.0), dv = vec2(0.0);
    for (uint k = 0u; k < 2u; k++) {
        uint b = 2u * i + k;
        if (b >= nb) break;
        float kb[32], vb[32];
        for (uint e = 0u; e < 32u; e++) {
            kb[e] = rotated_element(src, 32u * b + e, half_d, pos);
            vb[e] = x[vs + 32u * b + e];
        }
        dk[k] = store_block(true, kb, hb, b);
        dv[k] = store_block(false, vb, hb, b);
    }
    kc[hb + pc.head_dim / 4u + i] = packHalf2x16(dk); // (exact: f16 values already)
    vc[hb + pc.head_dim / 4u + i] = packHalf2x16(dv);
#elif defined(KV_F16)
    bool adj = pc.adjacent != 0u;
    uvec2 w = kv16_words(dst / 2u, i, half_d, adj);
    uvec2 kw = kv16_pack(rotated(src, 2u * i, half_d, pos), rotated(src, 2u * i + 1u, half_d, pos), adj);
    uvec2 vw = kv16_pack(pair_at(vs, 2u * i, half_d), pair_at(vs, 2u * i + 1u, half_d), adj);
    kc[w.x] = kw.x;
    kc[w.y] = kw.y;
    vc[w.x] = vw.x;
    vc[w.y] = vw.y;
#else
    vec2 y = rotated(src, i, half_d, pos), v = pair_at(vs, i, half_d);
    uint i0 = pc.adjacent != 0u ? 2u * i : i;
    uint i1 = pc.adjacent != 0u ? 2u * i + 1u : i + half_d;
    kc[dst + i0] = y.x;
    kc[dst + i1] = y.y;
    vc[dst + i0] = v.x;
    vc[dst + i1] = v.y;
#endif
}
