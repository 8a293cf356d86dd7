#version 450
// attention_cm: prefill attention on tensor cores (VK_NV_cooperative_matrix, f16 x f16 + f32):
// the function of attention_tiled.comp (causal, GQA, sliding window, soft-cap, rotating slots,
// batch prefill's row table, the log-sum-exp with flags 1, bidirectional attention with flags
// 512: each sequence's real keys from the row table, |p - j| < window) over an f16 KV cache, for heads of
// HD = 64, 128 or 256 elements (a module each: fragments are named by constant indices, which
// the driver keeps in registers; matmul_cm.comp says what a dynamic index cost).
//   A workgroup of 4 subgroups takes BQ = 64 consecutive queries of one head, 16 a subgroup,
//   whose query fragments (16 x HD, rounded to f16) stay in registers; keys and values come in
//   tiles of 32 through shared memory; S = Q K^T and O += P V run on the tensor cores.
// Two passes over the keys, not one: NV_cooperative_matrix gives no per-row access to an
// accumulator, so O could not be rescaled each time a row's running maximum grows (flash
// attention's online softmax) short of a round trip through shared memory per tile. The first
// pass keeps each row's online maximum m and sum l (two lanes a row, from S stored to shared
// memory); the second recomputes S, forms P = exp(S - m) / l, already final, rounds it to f16
// and accumulates O += P V without any rescaling, stored straight to out (rows past the last
// query through shared memory). The scores are computed twice: 3 products the size of Q K^T
// instead of 2, all on the tensor cores.
// Not exact: q and P are rounded to f16 (the cache already holds f16); forge.c keeps
// attention_tiled for exact models, f32 caches and other head sizes.
// Bindings: 0 params {pos0, n} | 1 q f32 [n, q_stride] (heads at h * HD) | 2 K cache f16 [slots, Hkv, HD]
//           (q8_0: [slots, Hkv, kv8_words(HD)] words) | 3 V cache, the same | 4 out f32 [n, H, HD] | 5 lse f32 [n, H] (flags 1)
// One workgroup of 128 (subgroups of 32, checked by the host) per (block of 64 queries, head, sequence).
#extension GL_GOOGLE_include_directive : require
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 128) in;

#define FORGE_F16_TYPES 1
#include "common.glsl"

layout(binding = 0) readonly buffer P_ { uint pos0; uint n_tok; uint tab[]; } params;
const uint TAB = 14; // the row table at byte 64
layout(binding = 1) readonly buffer Q_ { vec4 q4[]; };
#ifdef KV_Q8
layout(binding = 2) readonly buffer K_ { uint kc[]; };    // a head: HD / 4 words of codes, then its scales
layout(binding = 3) readonly buffer V_ { uint vc[]; };
#else
layout(binding = 2) readonly buffer K_ { uvec4 kc8[]; };  // 8 halves an element
layout(binding = 3) readonly buffer V_ { uvec4 vc8[]; };
#endif
layout(binding = 4) buffer O_ { float o[]; };
layout(binding = 5) writeonly buffer L_ { float lse[]; };

#include "pc_attention.glsl"

#ifndef HD
#error "attention_cm: HD (the head size) is set per module"
#endif
const uint DF = HD / 16u;         // fragments along a head
const uint BQ = 64u, BKEYS = 32u; // queries a workgroup, keys a tile
const uint LDK = HD / 4u + 2u;    // a tile row: HD + 8 halves, in units of 4 halves
const uint LDP = BKEYS / 4u + 2u; // a row of P: 32 + 8 halves, the same units
const uint LDS = BKEYS + 4u;      // a row of scores: 36 floats (the 16 rows' lanes 4 banks apart)
const float NEG_INF = -1.0 / 0.0;
shared uvec2 tile[BKEYS * LDK];          // 32 rows of K, then of V (first: 32 of the queries)
shared float sc[4u * 16u * LDS];         // each subgroup's scores [16][32] (and its last output fragments)
shared uvec2 pr[4u * 16u * LDP];         // each subgroup's P [16][32] in f16

// The first and last key query position p sees (attention_tiled.comp's rule): causal, or
// bidirectional within the sequence's real rows 0 .. seq_last.
uint key_lo(uint p) { return (pc.window != 0u && p + 1u > pc.window) ? p + 1u - pc.window : 0u; }
uint key_hi(uint p, bool bidi, uint seq_last) {
    if (!bidi) return p;
    return pc.window != 0u ? min(seq_last, p + pc.window - 1u) : seq_last;
}

// keys (or values) j0 .. j0 + 31 into the tile, rows past p_last zero (their P is 0, and 0 x a
// stale NaN would not be)
void stage_keys(bool values, uint j0, uint p_last, uint kv0, uint kvh) {
    for (uint e = gl_LocalInvocationID.x; e < BKEYS * (HD / 8u); e += 128u) {
        uint kj = e / (HD / 8u), c8 = e % (HD / 8u), j = j0 + kj;
        uint head = kv0 + ((j % pc.cache_slots) * pc.n_kv_heads + kvh) * HD; // its first element
#ifdef KV_Q8 // 8 values: pieces 2 c8 and 2 c8 + 1 of the head, both in block c8 / 4
        uint hb = head / HD * kv8_words(HD);
        uvec4 w = uvec4(0u);
        if (j <= p_last) {
            float d = values ? KV8_SCALE(vc, hb, HD, c8 >> 2) : KV8_SCALE(kc, hb, HD, c8 >> 2);
            uvec2 c = values ? uvec2(vc[hb + 2u * c8], vc[hb + 2u * c8 + 1u]) : uvec2(kc[hb + 2u * c8], kc[hb + 2u * c8 + 1u]);
            w = uvec4(to_f16(kv8_codes(c.x) * d), to_f16(kv8_codes(c.y) * d));
        }
#else
        uint src = head / 8u + c8;
        uvec4 w = j <= p_last ? (values ? vc8[src] : kc8[src]) : uvec4(0u);
#endif
        tile[kj * LDK + 2u * c8] = w.xy;
        tile[kj * LDK + 2u * c8 + 1u] = w.zw;
    }
}

void main() {
    uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    uint t0 = gl_WorkGroupID.x * BQ, h = gl_WorkGroupID.y;
    uint row0 = gl_WorkGroupID.z * pc.n_tokens, kv0 = gl_WorkGroupID.z * pc.kv_batch_stride;
    uint kvh = h / (pc.n_heads / pc.n_kv_heads);
    uint nq = min(BQ, pc.n_tokens - t0);
    uint p_first = params.pos0 + t0;
    if ((pc.flags & 2u) != 0u) {
        p_first = params.tab[TAB + 2u * t0];
        kv0 = params.tab[TAB + 1u] * pc.cache_slots * pc.n_kv_heads * HD;
    }
    bool bidi = (pc.flags & 512u) != 0u;
    uint seq_last = bidi ? params.tab[TAB + gl_WorkGroupID.z] - gl_WorkGroupID.z * pc.n_tokens : 0u;
    uint p_last = p_first + nq - 1u, lo_first = key_lo(p_first), hi_last = key_hi(p_last, bidi, seq_last);
    // this subgroup's queries: rows sq0 .. sq0 + 15 of the block; this lane's row r of them,
    // and its half hf of each tile's keys
    uint sq0 = 16u * sg, r = lane >> 1, hf = lane & 1u;
    bool sg_live = sq0 < nq;
    uint sg_last = p_first + min(sq0 + 15u, nq - 1u), sg_lo = key_lo(p_first + sq0), sg_hi = key_hi(sg_last, bidi, seq_last);
    uint my_p = p_first + sq0 + r, my_lo = key_lo(my_p), my_hi = key_hi(my_p, bidi, seq_last);
    bool live = sq0 + r < nq;

    // the queries in f16, 32 rows at a time through the tile, into each subgroup's fragments
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> qf[DF];
    [[unroll]] for (uint half_ = 0u; half_ < 2u; half_++) {
        barrier();
        for (uint e = gl_LocalInvocationID.x; e < 32u * (HD / 4u); e += 128u) {
            uint i = e / (HD / 4u), c4 = e % (HD / 4u), qi = 32u * half_ + i;
            vec4 v = qi < nq ? q4[((row0 + t0 + qi) * pc.q_stride + h * HD) / 4u + c4] : vec4(0.0);
            tile[i * LDK + c4] = to_f16(v);
        }
        barrier();
        if ((sg >> 1) == half_)
            [[unroll]] for (uint dc = 0u; dc < DF; dc++) coopMatLoadNV(qf[dc], tile, (sg & 1u) * 16u * LDK + 4u * dc, LDK, false);
    }

    float m = NEG_INF, l = 0.0;     // this lane's half of its row: running maximum and sum
    float rm = NEG_INF, rinv = 0.0; // the row's final maximum and 1 / sum (after pass 1)
    fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> of[DF];
    [[unroll]] for (uint dc = 0u; dc < DF; dc++) of[dc] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
    for (uint pass = 0u; pass < 2u; pass++) {
        if (pass == 1u) { // the two lanes of each row combine their halves (through the scores' scratch)
            sc[sg * 16u * LDS + 2u * lane] = m;
            sc[sg * 16u * LDS + 2u * lane + 1u] = l;
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            float m2 = sc[sg * 16u * LDS + 2u * (lane ^ 1u)], l2 = sc[sg * 16u * LDS + 2u * (lane ^ 1u) + 1u];
            rm = max(m, m2);
            float L = rm == NEG_INF ? 0.0 : l * exp(m - rm) + l2 * exp(m2 - rm);
            rinv = L > 0.0 ? 1.0 / L : 0.0;
            if ((pc.flags & 1u) != 0u && live && hf == 0u) lse[(row0 + t0 + sq0 + r) * pc.n_heads + h] = rm + log(L);
        }
        for (uint j0 = lo_first; j0 <= hi_last; j0 += BKEYS) {
            barrier(); // the tile's last readers are done
            stage_keys(false, j0, hi_last, kv0, kvh);
            barrier();
            // whether any key of the tile is one of this subgroup's (uniform in the subgroup)
            bool act = sg_live && j0 <= sg_hi && j0 + BKEYS - 1u >= sg_lo;
            if (act) {
                fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> s0 = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0), s1 = s0;
                [[unroll]] for (uint dc = 0u; dc < DF; dc++) {
                    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> k0, k1; // K^T: [d][key] = the tile's rows read column-major
                    coopMatLoadNV(k0, tile, 4u * dc, LDK, true);
                    coopMatLoadNV(k1, tile, 16u * LDK + 4u * dc, LDK, true);
                    s0 = coopMatMulAddNV(qf[dc], k0, s0);
                    s1 = coopMatMulAddNV(qf[dc], k1, s1);
                }
                coopMatStoreNV(s0, sc, sg * 16u * LDS, LDS, false);
                coopMatStoreNV(s1, sc, sg * 16u * LDS + 16u, LDS, false);
                subgroupMemoryBarrierShared();
                subgroupBarrier();
                float s[16];
                float tmax = NEG_INF;
                [[unroll]] for (uint c = 0u; c < 16u; c++) {
                    uint kj = 16u * hf + c, j = j0 + kj;
                    float v = sc[(sg * 16u + r) * LDS + kj] * pc.scale;
                    if (pc.softcap > 0.0) v = safe_tanh(v / pc.softcap) * pc.softcap;
                    s[c] = (live && j >= my_lo && j <= my_hi) ? v : NEG_INF;
                    tmax = max(tmax, s[c]);
                }
                if (pass == 0u) {
                    float m_new = max(m, tmax);
                    if (m_new != NEG_INF) {
                        float sum = 0.0;
                        [[unroll]] for (uint c = 0u; c < 16u; c++) sum += exp(s[c] - m_new);
                        l = l * exp(m - m_new) + sum;
                        m = m_new;
                    }
                } else {
                    [[unroll]] for (uint c = 0u; c < 16u; c += 4u) {
                        vec4 pv = vec4(0.0);
                        if (rm != NEG_INF) pv = exp(vec4(s[c], s[c + 1u], s[c + 2u], s[c + 3u]) - rm) * rinv;
                        pr[(sg * 16u + r) * LDP + 4u * hf + c / 4u] = to_f16(pv);
                    }
                }
            }
            if (pass == 0u) continue;
            barrier(); // every subgroup is done with K; P is written
            stage_keys(true, j0, hi_last, kv0, kvh);
            barrier();
            if (act) {
                fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> p0, p1;
                coopMatLoadNV(p0, pr, sg * 16u * LDP, LDP, false);
                coopMatLoadNV(p1, pr, sg * 16u * LDP + 4u, LDP, false);
                [[unroll]] for (uint dc = 0u; dc < DF; dc++) {
                    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> v0, v1; // V: [key][d], row-major
                    coopMatLoadNV(v0, tile, 4u * dc, LDK, false);
                    coopMatLoadNV(v1, tile, 16u * LDK + 4u * dc, LDK, false);
                    of[dc] = coopMatMulAddNV(p0, v0, of[dc]);
                    of[dc] = coopMatMulAddNV(p1, v1, of[dc]);
                }
            }
        }
    }
    if (!sg_live) return;
    uint ldo = pc.n_heads * HD, out0 = (row0 + t0 + sq0) * ldo + h * HD;
    if (sq0 + 16u <= nq) {
        [[unroll]] for (uint dc = 0u; dc < DF; dc++) coopMatStoreNV(of[dc], o, out0 + 16u * dc, ldo, false);
        return;
    }
    // a subgroup past the last query: its live rows through its scores' scratch, a fragment at
    // a time (named by constant indices, as above)
#define STORE_ROWS(dc)                                                                   \
    if ((dc) < DF) {                                                                     \
        coopMatStoreNV(of[dc], sc, sg * 16u * LDS, 16u, false);                            \
        subgroupMemoryBarrierShared();                                                   \
        subgroupBarrier();                                                               \
        for (uint e = lane; e < 256u; e += 32u)                                          \
            if (sq0 + e / 16u < nq) o[out0 + (e / 16u) * ldo + 16u * (dc) + e % 16u] = sc[sg * 16u * LDS + e];   \
        subgroupBarrier();                                                               \
    }
    STORE_ROWS(0u) STORE_ROWS(1u) STORE_ROWS(2u) STORE_ROWS(3u)
#if HD > 64
    STORE_ROWS(4u) STORE_ROWS(5u) STORE_ROWS(6u) STORE_ROWS(7u)
#endif
#if HD > 128
    STORE_ROWS(8u) STORE_ROWS(9u) STORE_ROWS(10u) STORE_ROWS(11u) STORE_ROWS(12u) STORE_ROWS(13u) STORE_ROWS(14u) STORE_ROWS(15u)
#endif
}
