#version 450
// attention_tiled: prefill attention, a block of BQ = 8 consecutive queries of one head per
// workgroup, keys in tiles of BK = 16 staged through shared memory, so each key and value
// row is read once per block instead of once per query. Same function as attention.comp
// (causal, GQA, sliding window, soft-cap, rotating slots, online softmax).
//   Scores: thread t computes query t / 8 against keys 2 (t % 8) and 2 (t % 8) + 1 of the tile.
//   Output: thread t owns query t / 8, dimensions t % 8 + 8 i.
// Shared memory: 8 + 16 rows of 257 floats (padded against bank conflicts): 25 KiB, within
// every device's 32 KiB. Heads wider than 256 (DMAX up to 512, Gemma 4's full layers) take
// blocks of BQ = 4 queries and tiles of BK = 8 keys (12 rows of 513 floats: 24 KiB); thread t
// < 32 then scores query t / 8 against key t % 8, and owns query t / 16, dimensions t % 16 + 16 i
// (forge.c's forge__attn_block_queries gives the host the block size).
// Training runs a batch of sequences at once (workgroup z = sequence b): its queries and
// outputs are rows b * n_tokens + t, its keys and values start at b * kv_batch_stride, and with
// flags 1 each query's softmax log-sum-exp (m + log l) goes to lse, for the backward pass.
// Batch generation (flags 2) prefills one sequence of several: the rows are at positions
// tab[TAB + 2t] (consecutive) of sequence tab[TAB + 1], whose keys fill slots from seq * cache_slots.
// Bidirectional attention (flags 512, embedding models: EmbeddingGemma) has no causal rule:
// query p of sequence b sees keys 0 .. last_b, last_b its last real row (tab[TAB + b] - b *
// n_tokens: the row table classify and forge_embed fill), and within a window w the keys with
// |p - j| < w (w = sliding_window / 2 + 1: transformers' Gemma3TextConfig halves the window of a
// bidirectional model); a padding query past the window of every real key writes zeros.
// Bindings: 0 params {pos0, n} | 1 q f32 [n, q_stride] (heads at h * D) | 2 K cache [slots, Hkv, D]
//           3 V cache [slots, Hkv, D] | 4 out f32 [n, H, D] | 5 lse f32 [n, H] (flags 1)
// One workgroup of 64 per (block of BQ queries, head, sequence); D <= DMAX <= 512.
// The cache is f32, or f16 built with -DKV_F16, or q8_0 with -DKV_Q8 (session caches only;
// training's stay f32).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 64) in;

#include "common.glsl"

layout(binding = 0) readonly buffer P_ { uint pos0; uint n_tok; uint tab[]; } params;
const uint TAB = 14; // the row table at byte 64
layout(binding = 1) readonly buffer Q_ { float q[]; };
#if defined(KV_F16) || defined(KV_Q8) // an f16 cache (common.glsl): rows are read a word (2 values) at a time; q8_0: a word of 4 codes
layout(binding = 2) readonly buffer K_ { uint kc[]; };
layout(binding = 3) readonly buffer V_ { uint vc[]; };
#else
layout(binding = 2) readonly buffer K_ { float kc[]; };
layout(binding = 3) readonly buffer V_ { float vc[]; };
#endif
layout(binding = 4) writeonly buffer O_ { float o[]; };
layout(binding = 5) writeonly buffer L_ { float lse[]; };

#include "pc_attention.glsl"

layout(constant_id = 0) const uint DMAX = 256; // head_dim rounded up to a multiple of 8 (the model's, pinned at pipeline creation)
const bool WIDE = DMAX > 256u;
const uint BQ = WIDE ? 4u : 8u, BK = WIDE ? 8u : 16u;
const uint TPQ = 64u / BQ; // threads per query (the output's)
const uint TPK = 64u / BK; // threads staging one key or value row
const uint DS = DMAX + 1;    // padded row stride: rows start in different banks
shared float qs[BQ * DS];
shared float kv[BK * DS];    // the K tile, then the V tile
shared float sc[BQ][BK];

// The key (or value) row starting at element `src` of the cache into row kj of the tile (zeros
// when it is not live_row: past the block's last query); TPK threads per row, `part` a share each.
void stage_row(bool values, uint kj, uint part, uint src, bool live_row) {
    uint D = pc.head_dim;
#ifdef KV_Q8
    uint W = D / 4u, w4 = (W + TPK - 1u) / TPK, hb = src / D * kv8_words(D); // src: a head's first element
    for (uint w = part * w4; w < min(W, (part + 1u) * w4); w++) {
        vec4 v = live_row ? (values ? KV8_PIECE(vc, hb, D, w) : KV8_PIECE(kc, hb, D, w)) : vec4(0.0);
        kv[kj * DS + 4u * w] = v.x;
        kv[kj * DS + 4u * w + 1u] = v.y;
        kv[kj * DS + 4u * w + 2u] = v.z;
        kv[kj * DS + 4u * w + 3u] = v.w;
    }
#elif defined(KV_F16)
    uint W = D / 2u, w4 = (W + TPK - 1u) / TPK;
    for (uint w = part * w4; w < min(W, (part + 1u) * w4); w++) {
        vec2 v = live_row ? unpackHalf2x16(values ? vc[src / 2u + w] : kc[src / 2u + w]) : vec2(0.0);
        kv[kj * DS + 2u * w] = v.x;
        kv[kj * DS + 2u * w + 1u] = v.y;
    }
#else
    uint q4 = (D + TPK - 1u) / TPK;
    for (uint d = part * q4; d < min(D, (part + 1u) * q4); d++) kv[kj * DS + d] = live_row ? (values ? vc[src + d] : kc[src + d]) : 0.0;
#endif
}

// The first and last key query position p sees: causal (the window's last keys up to p), or
// bidirectional (|p - j| < window, within the sequence's real rows 0 .. seq_last).
uint key_lo(uint p) { return (pc.window != 0u && p + 1u > pc.window) ? p + 1u - pc.window : 0u; }
uint key_hi(uint p, bool bidi, uint seq_last) {
    if (!bidi) return p;
    return pc.window != 0u ? min(seq_last, p + pc.window - 1u) : seq_last;
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint t0 = gl_WorkGroupID.x * BQ, h = gl_WorkGroupID.y;
    uint row0 = gl_WorkGroupID.z * pc.n_tokens, kv0 = gl_WorkGroupID.z * pc.kv_batch_stride;
    uint D = pc.head_dim;
    uint kvh = h / (pc.n_heads / pc.n_kv_heads);
    uint nq = min(BQ, pc.n_tokens - t0);
    for (uint e = tid; e < BQ * D; e += 64u) {
        uint qi = e / D, d = e % D;
        qs[qi * DS + d] = qi < nq ? q[(row0 + t0 + qi) * pc.q_stride + h * D + d] : 0.0;
    }
    // the keys any query of the block needs
    uint p_first = params.pos0 + t0, p_last = p_first + nq - 1u;
    if ((pc.flags & 2u) != 0u) {
        p_first = params.tab[TAB + 2u * t0];
        p_last = p_first + nq - 1u;
        kv0 = params.tab[TAB + 1u] * pc.cache_slots * pc.n_kv_heads * D;
    }
    bool bidi = (pc.flags & 512u) != 0u;
    uint seq_last = bidi ? params.tab[TAB + gl_WorkGroupID.z] - gl_WorkGroupID.z * pc.n_tokens : 0u;
    uint lo_first = key_lo(p_first), hi_last = key_hi(p_last, bidi, seq_last);
    uint my_q = tid / TPQ, my_l = tid % TPQ;
    uint my_p = p_first + my_q;
    uint my_lo = key_lo(my_p), my_hi = key_hi(my_p, bidi, seq_last);
    bool live = my_q < nq;
    float m = -1.0 / 0.0, l = 0.0;
    float acc[DMAX / TPQ];
    [[unroll]] for (uint i = 0; i < DMAX / TPQ; i++) acc[i] = 0.0;
    for (uint j0 = lo_first; j0 <= hi_last; j0 += BK) {
        barrier(); // the previous tile's V reads are done
        { // TPK threads per key: one slot computation each, then a share of the row
            uint kj = tid / TPK, j = j0 + kj;
            stage_row(false, kj, tid % TPK, kv0 + ((j % pc.cache_slots) * pc.n_kv_heads + kvh) * D, j <= hi_last);
        }
        barrier();
        if (!WIDE) {
            float s[2] = float[2](0.0, 0.0);
            for (uint d = 0; d < D; d++) {
                float qd = qs[my_q * DS + d];
                s[0] += qd * kv[(2u * my_l) * DS + d];
                s[1] += qd * kv[(2u * my_l + 1u) * DS + d];
            }
            [[unroll]] for (uint c = 0; c < 2u; c++) {
                uint kj = 2u * my_l + c, j = j0 + kj;
                float v = s[c] * pc.scale;
                if (pc.softcap > 0.0) v = safe_tanh(v / pc.softcap) * pc.softcap;
                sc[my_q][kj] = (live && j >= my_lo && j <= my_hi) ? v : -1.0 / 0.0;
            }
        } else if (tid < BQ * BK) { // one score a thread
            uint sq = tid / BK, kj = tid % BK, j = j0 + kj, sp = p_first + sq;
            uint s_lo = key_lo(sp), s_hi = key_hi(sp, bidi, seq_last);
            float s = 0.0;
            for (uint d = 0; d < D; d++) s += qs[sq * DS + d] * kv[kj * DS + d];
            float v = s * pc.scale;
            if (pc.softcap > 0.0) v = safe_tanh(v / pc.softcap) * pc.softcap;
            sc[sq][kj] = (sq < nq && j >= s_lo && j <= s_hi) ? v : -1.0 / 0.0;
        }
        barrier();
        { // V replaces K
            uint kj = tid / TPK, j = j0 + kj;
            stage_row(true, kj, tid % TPK, kv0 + ((j % pc.cache_slots) * pc.n_kv_heads + kvh) * D, j <= hi_last);
        }
        float tmax = -1.0 / 0.0;
        [[unroll]] for (uint kj = 0; kj < BK; kj++) tmax = max(tmax, sc[my_q][kj]);
        float m_new = max(m, tmax);
        float corr = m_new == -1.0 / 0.0 ? 1.0 : exp(m - m_new);
        float pk[BK];
        float psum = 0.0;
        [[unroll]] for (uint kj = 0; kj < BK; kj++) {
            pk[kj] = m_new == -1.0 / 0.0 ? 0.0 : exp(sc[my_q][kj] - m_new);
            psum += pk[kj];
        }
        l = l * corr + psum;
        m = m_new;
        barrier(); // the V tile is in place
        [[unroll]] for (uint i = 0; i < DMAX / TPQ; i++) {
            uint d = my_l + TPQ * i;
            if (d < D) {
                float a = acc[i] * corr;
                [[unroll]] for (uint kj = 0; kj < BK; kj++) a += pk[kj] * kv[kj * DS + d];
                acc[i] = a;
            }
        }
    }
    if (live) {
        [[unroll]] for (uint i = 0; i < DMAX / TPQ; i++) {
            uint d = my_l + TPQ * i;
            if (d < D) o[((row0 + t0 + my_q) * pc.n_heads + h) * D + d] = l > 0.0 ? acc[i] / l : 0.0;
        }
        if ((pc.flags & 1u) != 0u && my_l == 0u) lse[(row0 + t0 + my_q) * pc.n_heads + h] = m + log(l);
    }
}
