#version 450
// attention_decode: decode attention split along the keys (flash-decoding), stage 1, on
// subgroups. Same inputs and partial states as attention_split.comp (the kernel for devices
// without subgroup arithmetic), which is latency-bound on a GPU: a thread walks a whole key
// row for its score and then every key serially for each output element (27 us a layer for
// the Llama-3.1-8B shape on the H100, 16 splits x 32 heads, context under 100).
// Here a subgroup takes one key at a time with its lanes holding the head's D values in vec4
// pieces (lane i: pieces i, i + W, ...), so a key's K and V rows are one coalesced load per
// piece and its score one subgroupAdd; it takes U = 8 keys at a time, all their K and V loads
// issued before any is used (4 at a time: 12.95 us a layer on the 1B F16 shape at context
// 512-576 on the H100, 8: 11.74), with the online softmax state (m, l, acc) per subgroup. The
// workgroup's subgroups take its keys in turn and merge their states through shared memory.
// Query t, head h (causal, GQA, window, soft-cap, rotating slots: as attention_tiled.comp):
// the keys lo..p are cut into n_splits runs of equal length, at least NSG * U keys each (one
// round of the workgroup) and at least min_run (a short context leaves the last splits empty);
// workgroup (s, h, t) takes run s and writes part[((t * H + h) * S + s)] = {m, l, acc[D]}: m =
// max score, l = sum exp(score - m), acc = sum exp(score - m) V (m = -inf, l = 0, acc = 0: no
// keys). attention_combine.comp merges the runs.
// Batch generation (flags 2): query t is at position tab[TAB + 2t] of sequence tab[TAB + 2t + 1],
// whose keys and values fill slots [seq * cache_slots, (seq + 1) * cache_slots) of the caches.
// RoPE fused (one token, flags 4: a dispatch and its barrier fewer a layer than rope.comp
// first): binding 1 is the raw q | k | v row (q at h * D, k at n_heads * D, v after the keys)
// and every workgroup rotates its query as it loads it (rope.comp's rotation, flags 8: adjacent
// pairs, else rotate-half); with flags 16 the new key p is the row's too: rotated, rounded as the
// cache stores it, folded into the state of the workgroup whose run holds p from registers (no
// workgroup reads slot p here), and written to the cache by that run's workgroup of the first
// head of its group (bindings 6 and 7, the cache again). Without 16 (a layer that attends to an
// earlier layer's cache) key p is in the cache already. Flags 32: the query and key heads are
// RMS-normed first (Qwen 3's and Gemma's q_norm / k_norm, x * inv_rms * w as rmsnorm.comp, to
// rounding; eps from the push constants; another dispatch and barrier fewer), 64: the value
// head too, without weight (Gemma 4).
// Merged here (flags 128: the combine's dispatch and its barrier fewer a layer; on the H100 the
// 1B F16 decode went from 565 to 577 tok/s): each workgroup with keys writes its state, then counts itself done on the (h, t)
// counter; the last of them (its count: the runs with keys, which every workgroup derives from
// p alike) resets the counter for the next dispatch and merges the runs as attention_combine.comp
// would (attention_merge.glsl, the same code), with flags 256 also the o projection's int8 input.
// Workgroups past a short context then exit at once. The partial states are `coherent` so that
// the last workgroup reads what the others wrote (their writes and the count ordered by
// memoryBarrierBuffer).
// Bindings: 0 params {pos0, n} | 1 q f32 [n, q_stride] (heads at h * D) | 2 K cache | 3 V cache | 4 part f32
//           5 inv_freq f32 [D/2] | 6 K cache (written) | 7 V cache (written) | 8 q_norm f32 [D] | 9 k_norm f32 [D]
//           10 out f32 [n, H, D] | 11 int8 output | 12 counters uint [n, H], zero between dispatches
//           (5-7 read with flags 4 only, 8-9 with 32, 10-12 with 128, 11 with 256)
// The cache is f32, or f16 built with -DKV_F16 (the loads stay as they are, half the bytes), or
// q8_0 built with -DKV_Q8 (a word of codes and a scale a piece; the step's own key and value
// quantized in shared memory before use, as rope.comp stores them).
// One workgroup of 64 per (split, head, token); D % 4 == 0, D <= DMAX.
// Spec constants: 0 = DMAX (the model's head_dim rounded up to 8), 1 = W, the subgroup width (4..64).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint DMAX = 256;
layout(constant_id = 1) const uint W = 32;

#include "common.glsl"

layout(binding = 0) readonly buffer P_ { uint pos0; uint n_tok; uint tab[]; } params;
const uint TAB = 14; // the row table at byte 64
layout(binding = 1) readonly buffer Q_ { vec4 q4[]; };
// A head's pieces of 4 values: loaded (KV_LOAD, piece i of the head at hb, a head KV_HEAD apart)
// and read as values (KV_PIECE).
#ifdef KV_F16 // an f16 cache (common.glsl): a piece of 4 values is 2 words
layout(binding = 2) readonly buffer K_ { uvec2 kc4[]; };
layout(binding = 3) readonly buffer V_ { uvec2 vc4[]; };
#define KV_PIECE(w) unpack_f16x4(w)
#define KV_PIECE_T uvec2
#define KV_HEAD D4
#define KV_LOAD(c, hb, i) c[(hb) + (i)]
#elif defined(KV_Q8) // a q8_0 cache (common.glsl): a piece is a word of codes and its block's scale
layout(binding = 2) readonly buffer K_ { uint kc4[]; };
layout(binding = 3) readonly buffer V_ { uint vc4[]; };
#define KV_PIECE(w) (kv8_codes((w).x) * uintBitsToFloat((w).y))
#define KV_PIECE_T uvec2
#define KV_HEAD kv8_words(D)
#define KV_LOAD(c, hb, i) uvec2(c[(hb) + (i)], floatBitsToUint(KV8_SCALE(c, hb, D, (i) >> 3)))
#else
layout(binding = 2) readonly buffer K_ { vec4 kc4[]; };
layout(binding = 3) readonly buffer V_ { vec4 vc4[]; };
#define KV_PIECE(v) (v)
#define KV_PIECE_T vec4
#define KV_HEAD D4
#define KV_LOAD(c, hb, i) c[(hb) + (i)]
#endif
layout(binding = 4) coherent buffer PART_ { float part[]; };
layout(binding = 4) coherent buffer PART2_ { vec2 part2[]; };
layout(binding = 1) readonly buffer QF_ { float qf[]; };
layout(binding = 5) readonly buffer F_ { float inv_freq[]; };
#ifdef KV_Q8
layout(binding = 6) writeonly buffer KW_ { uint kw4[]; };
layout(binding = 7) writeonly buffer VW_ { uint vw4[]; };
shared float sm_d8[64]; // the step's key blocks' scales, then its value blocks' (q8_0)
#elif defined(KV_F16)
layout(binding = 6) writeonly buffer KW_ { uvec2 kw4[]; };
layout(binding = 7) writeonly buffer VW_ { uvec2 vw4[]; };
#else
layout(binding = 6) writeonly buffer KW_ { vec4 kw4[]; };
layout(binding = 7) writeonly buffer VW_ { vec4 vw4[]; };
#endif
layout(binding = 8) readonly buffer QN_ { float q_norm[]; };
layout(binding = 9) readonly buffer KN_ { float k_norm[]; };
layout(binding = 10) writeonly buffer O_ { float o[]; };
layout(binding = 11) writeonly buffer Q8_ { uvec4 q8[]; };
layout(binding = 11) writeonly buffer Q8S_ { vec4 q8s[]; };
layout(binding = 12) coherent buffer N_ { uint done[]; };

#include "pc_attention.glsl"

const uint NC = (DMAX / 4u + W - 1u) / W;   // vec4 pieces of a row per lane
const uint NSG = 64u / W;                   // subgroups per workgroup
// keys a subgroup takes at a time; 2 on subgroups of 8 lanes or fewer (lavapipe, where a head
// of 512 is 16 pieces a lane and LLVM takes minutes to compile rounds of 8 keys unrolled)
const uint U = W > 8u ? 8u : 2u;
const float NEG_INF = -1.0 / 0.0;
shared float sm_m[NSG], sm_l[NSG];
shared vec4 sm_acc[NSG * (DMAX / 4u)];

// The pair of element e of a head of D (rotate-half: (i, i + D/2); adjacent: (2i, 2i + 1)):
// its index i, whether e is the pair's first, and the other element.
uvec3 rope_pair_of(uint e, uint D, bool adjacent) {
    uint half_d = D / 2u;
    bool first = adjacent ? (e & 1u) == 0u : e < half_d;
    uint i = adjacent ? e / 2u : (first ? e : e - half_d);
    uint other = adjacent ? e ^ 1u : (first ? e + half_d : e - half_d);
    return uvec3(i, first ? 1u : 0u, other);
}

// A value as the cache keeps it.
float cache_round(float v) {
#ifdef KV_F16
    return round_f16(v);
#else
    return v;
#endif
}

// RoPE fused: the raw query, key and value heads (times the norms' weights), each element's
// cos and sin, then the heads rotated (and normed)
shared float sm_raw[3u * DMAX], sm_rot[3u * DMAX];
shared vec2 sm_cs[DMAX];
shared vec3 sm_ss[NSG]; // the three heads' sums of squares, per subgroup

#define MERGE_DMAX DMAX
#define MERGE_SPLITS 64u // forge.c FORGE__ATTN_SPLITS
#define MERGE_OUT sm_raw // (3 DMAX floats, the rotation's, done with by then)
#define MERGE_OUT_LEN (3u * DMAX)
#include "attention_merge.glsl"
shared bool sm_last;

void main() {
    uint lane = gl_SubgroupInvocationID, sg = gl_SubgroupID;
    uint s = gl_WorkGroupID.x, h = gl_WorkGroupID.y, t = gl_WorkGroupID.z;
    uint D = pc.head_dim, D4 = D / 4u;
    uint p = params.pos0 + t, kv0 = 0u; // kv0: the sequence's first slot
    if ((pc.flags & 2u) != 0u) {
        p = params.tab[TAB + 2u * t];
        kv0 = params.tab[TAB + 2u * t + 1u] * pc.cache_slots;
    }
    uint lo = (pc.window != 0u && p + 1u > pc.window) ? p + 1u - pc.window : 0u;
    // at least one round of keys (NSG * U) a workgroup, and min_run: splits past the keys exit at once
    uint run = max(max(NSG * U, pc.min_run), (p + 1u - lo + pc.n_splits - 1u) / pc.n_splits);
    uint k_begin = lo + s * run, k_end = min(p + 1u, k_begin + run);
    bool merge = (pc.flags & 128u) != 0u;
    if (merge && k_begin >= k_end) return; // past a short context: not counted (the whole workgroup)
    uint group = pc.n_heads / pc.n_kv_heads, kvh = h / group;
    uint qb = (t * pc.q_stride + h * D) / 4u;
    bool rope = (pc.flags & 4u) != 0u, adjacent = (pc.flags & 8u) != 0u, qk_norm = (pc.flags & 32u) != 0u;
    bool own_key = (pc.flags & 16u) != 0u && k_begin <= p && p < k_end; // key p from the row
    uint k_stop = own_key ? p : k_end;                                  // the keys read from the cache
    vec4 q[NC], acc[NC], kp[NC], vp[NC];
    [[unroll]] for (uint c = 0u; c < NC; c++) q[c] = acc[c] = kp[c] = vp[c] = vec4(0.0);
    if (k_begin >= k_end) {
        // a split past a short context: only its empty state
    } else if (rope) {
        // the whole workgroup, an element a thread (loops, not unrolled: a head of 512 on 8
        // lanes unrolled is a shader LLVM takes minutes to compile for lavapipe), in one round
        // of global loads: the raw heads times the norms' weights (x w, then times 1 / rms after
        // the rotation, which is linear: rmsnorm.comp's (x / rms) w to rounding) and every
        // element's cos and sin into shared memory, the sums of squares reduced, then the
        // rotation from shared memory (without norms rope.comp's arithmetic, bit for bit)
        uint tid = gl_LocalInvocationID.x, qe = 4u * qb;
        uint kb = t * pc.q_stride + pc.n_heads * D + kvh * D, vb = kb + pc.n_kv_heads * D;
        bool v_norm = (pc.flags & 64u) != 0u;
        vec3 ss = vec3(0.0);
        for (uint e = tid; e < D; e += 64u) {
            uvec3 pr = rope_pair_of(e, D, adjacent);
            sm_cs[e] = cos_sin(float(p) * inv_freq[pr.x]);
            float x = qf[qe + e];
            ss.x += x * x;
            sm_raw[e] = qk_norm ? x * q_norm[e] : x;
            if (own_key) {
                float y = qf[kb + e], z = qf[vb + e];
                ss.yz += vec2(y * y, z * z);
                sm_raw[DMAX + e] = qk_norm ? y * k_norm[e] : y;
                sm_raw[2u * DMAX + e] = z;
            }
        }
        ss = vec3(subgroupAdd(ss.x), subgroupAdd(ss.y), subgroupAdd(ss.z));
        if (lane == 0u) sm_ss[sg] = ss;
        barrier();
        ss = vec3(0.0);
        for (uint g = 0u; g < NSG; g++) ss += sm_ss[g];
        vec3 inv = 1.0 / sqrt(ss / float(D) + pc.eps);
        for (uint e = tid; e < D; e += 64u) {
            uvec3 pr = rope_pair_of(e, D, adjacent);
            bool first = pr.y != 0u;
            vec2 cs = sm_cs[e];
            vec2 r = rope_pair(first ? vec2(sm_raw[e], sm_raw[pr.z]) : vec2(sm_raw[pr.z], sm_raw[e]), cs);
            sm_rot[e] = (first ? r.x : r.y) * (qk_norm ? inv.x : 1.0);
            if (own_key) {
                uint o = DMAX;
                r = rope_pair(first ? vec2(sm_raw[o + e], sm_raw[o + pr.z]) : vec2(sm_raw[o + pr.z], sm_raw[o + e]), cs);
                sm_rot[o + e] = cache_round((first ? r.x : r.y) * (qk_norm ? inv.y : 1.0));
                sm_rot[2u * DMAX + e] = cache_round(sm_raw[2u * DMAX + e] * (v_norm ? inv.z : 1.0));
            }
        }
        barrier();
#ifdef KV_Q8
        if (own_key) { // the key and value heads as the cache keeps them: a thread a block of 32
            uint nb = D / 32u;
            if (tid < 2u * nb) {
                uint o = (tid < nb ? DMAX : 2u * DMAX) + 32u * (tid % nb);
                float amax = 0.0;
                for (uint e = 0u; e < 32u; e++) amax = max(amax, abs(sm_rot[o + e]));
                float d = kv8_scale(amax);
                for (uint e = 0u; e < 32u; e++) sm_rot[o + e] = float(kv8_code(sm_rot[o + e], d)) * d;
                sm_d8[tid] = d;
            }
        }
        barrier();
#endif
        [[unroll]] for (uint c = 0u; c < NC; c++) {
            uint i = lane + c * W;
            if (i >= D4) continue;
            q[c] = vec4(sm_rot[4u * i], sm_rot[4u * i + 1u], sm_rot[4u * i + 2u], sm_rot[4u * i + 3u]);
            if (!own_key) continue;
            uint o = DMAX + 4u * i;
            kp[c] = vec4(sm_rot[o], sm_rot[o + 1u], sm_rot[o + 2u], sm_rot[o + 3u]);
            o += DMAX;
            vp[c] = vec4(sm_rot[o], sm_rot[o + 1u], sm_rot[o + 2u], sm_rot[o + 3u]);
        }
        if (own_key && h % group == 0u) { // the first head of the group stores the step's key and value
            uint rb = ((kv0 + p % pc.cache_slots) * pc.n_kv_heads + kvh) * KV_HEAD;
#ifdef KV_Q8
            uint nb = D / 32u;
            if (2u * tid < nb) { // the scale words
                kw4[rb + D4 + tid] = packHalf2x16(vec2(sm_d8[2u * tid], 2u * tid + 1u < nb ? sm_d8[2u * tid + 1u] : 0.0));
                vw4[rb + D4 + tid] = packHalf2x16(vec2(sm_d8[nb + 2u * tid], 2u * tid + 1u < nb ? sm_d8[nb + 2u * tid + 1u] : 0.0));
            }
#endif
            for (uint i = tid; i < D4; i += 64u) {
                vec4 k4 = vec4(sm_rot[DMAX + 4u * i], sm_rot[DMAX + 4u * i + 1u], sm_rot[DMAX + 4u * i + 2u], sm_rot[DMAX + 4u * i + 3u]);
                uint o = 2u * DMAX + 4u * i;
                vec4 v4 = vec4(sm_rot[o], sm_rot[o + 1u], sm_rot[o + 2u], sm_rot[o + 3u]);
#ifdef KV_Q8
                float dk = sm_d8[i >> 3], dv = sm_d8[nb + (i >> 3)]; // (q d quantizes back to q)
                kw4[rb + i] = kv8_pack(ivec4(kv8_code(k4.x, dk), kv8_code(k4.y, dk), kv8_code(k4.z, dk), kv8_code(k4.w, dk)));
                vw4[rb + i] = kv8_pack(ivec4(kv8_code(v4.x, dv), kv8_code(v4.y, dv), kv8_code(v4.z, dv), kv8_code(v4.w, dv)));
#elif defined(KV_F16)
                kw4[rb + i] = uvec2(packHalf2x16(k4.xy), packHalf2x16(k4.zw)); // (exact: rounded already)
                vw4[rb + i] = uvec2(packHalf2x16(v4.xy), packHalf2x16(v4.zw));
#else
                kw4[rb + i] = k4;
                vw4[rb + i] = v4;
#endif
            }
        }
    } else {
        [[unroll]] for (uint c = 0u; c < NC; c++) {
            uint i = lane + c * W;
            if (i < D4) q[c] = q4[qb + i];
        }
    }
    float m = NEG_INF, l = 0.0;
    for (uint j0 = k_begin + sg; j0 < k_stop; j0 += NSG * U) {
        // keys j0 + NSG u, u < U: every K and V piece loaded first
        KV_PIECE_T kk[U][NC], vv[U][NC];
        [[unroll]] for (uint u = 0u; u < U; u++) {
            uint j = j0 + NSG * u;
            uint rb = ((kv0 + j % pc.cache_slots) * pc.n_kv_heads + kvh) * KV_HEAD;
            [[unroll]] for (uint c = 0u; c < NC; c++) {
                uint i = lane + c * W;
                bool ok = j < k_stop && i < D4;
                kk[u][c] = ok ? KV_LOAD(kc4, rb, i) : KV_PIECE_T(0);
                vv[u][c] = ok ? KV_LOAD(vc4, rb, i) : KV_PIECE_T(0);
            }
        }
        float sc[U];
        float m_new = m;
        [[unroll]] for (uint u = 0u; u < U; u++) {
            float d = 0.0;
            [[unroll]] for (uint c = 0u; c < NC; c++) d += dot(q[c], KV_PIECE(kk[u][c]));
            float v = subgroupAdd(d) * pc.scale;
            if (pc.softcap > 0.0) v = safe_tanh(v / pc.softcap) * pc.softcap;
            sc[u] = j0 + NSG * u < k_stop ? v : NEG_INF;
            m_new = max(m_new, sc[u]);
        }
        float corr = exp(m - m_new); // m_new is finite: key j0 is in range
        l *= corr;
        [[unroll]] for (uint c = 0u; c < NC; c++) acc[c] *= corr;
        [[unroll]] for (uint u = 0u; u < U; u++) {
            float e = exp(sc[u] - m_new); // 0 for keys out of range
            l += e;
            [[unroll]] for (uint c = 0u; c < NC; c++) acc[c] += e * KV_PIECE(vv[u][c]);
        }
        m = m_new;
    }
    if (own_key && sg == 0u) { // key p (loaded above): one online-softmax step
        float d = 0.0;
        [[unroll]] for (uint c = 0u; c < NC; c++) d += dot(q[c], kp[c]);
        float v = subgroupAdd(d) * pc.scale;
        if (pc.softcap > 0.0) v = safe_tanh(v / pc.softcap) * pc.softcap;
        float m_new = max(m, v);
        float corr = exp(m - m_new), e = exp(v - m_new);
        l = l * corr + e;
        [[unroll]] for (uint c = 0u; c < NC; c++) acc[c] = acc[c] * corr + e * vp[c];
        m = m_new;
    }
    // the subgroups' states merged: M = max m_g, l = sum l_g exp(m_g - M), acc likewise
    if (lane == 0u) { sm_m[sg] = m; sm_l[sg] = l; }
    [[unroll]] for (uint c = 0u; c < NC; c++) {
        uint i = lane + c * W;
        if (i < D4) sm_acc[sg * (DMAX / 4u) + i] = acc[c];
    }
    barrier();
    uint tid = gl_LocalInvocationID.x;
    float M = NEG_INF;
    for (uint g = 0u; g < NSG; g++) M = max(M, sm_m[g]);
    uint pb = ((t * pc.n_heads + h) * pc.n_splits + s) * (D + 2u);
    float L = 0.0;
    for (uint g = 0u; g < NSG; g++) L += M == NEG_INF ? 0.0 : sm_l[g] * exp(sm_m[g] - M);
    if (tid == 0u) { part[pb] = M; part[pb + 1u] = L; }
    for (uint i = tid; i < D4; i += 64u) {
        vec4 a = vec4(0.0);
        if (M != NEG_INF)
            for (uint g = 0u; g < NSG; g++) a += sm_acc[g * (DMAX / 4u) + i] * exp(sm_m[g] - M);
        part[pb + 2u + 4u * i] = a.x;
        part[pb + 3u + 4u * i] = a.y;
        part[pb + 4u + 4u * i] = a.z;
        part[pb + 5u + 4u * i] = a.w;
    }
    if (!merge) return;
    memoryBarrierBuffer(); // this thread's part before the count
    barrier();
    uint ci = t * pc.n_heads + h, runs = (p + 1u - lo + run - 1u) / run; // the runs with keys
    if (tid == 0u) sm_last = atomicAdd(done[ci], 1u) == runs - 1u;
    barrier();
    if (!sm_last) return;
    memoryBarrierBuffer(); // the others' parts after their counts
    if (tid == 0u) done[ci] = 0u;
    merge_runs(pb - s * (D + 2u), runs, D, ci * D, (pc.flags & 256u) != 0u && t == 0u, h, pc.n_heads * D);
}
