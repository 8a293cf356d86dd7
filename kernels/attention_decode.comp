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
// round of the workgroup; a short context leaves the last splits empty); workgroup (s, h, t) takes run s
// and writes part[((t * H + h) * S + s)] = {m, l, acc[D]}: m = max score, l = sum exp(score -
// m), acc = sum exp(score - m) V (m = -inf, l = 0, acc = 0: no keys). attention_combine.comp
// merges the runs.
// Batch generation (flags 2): query t is at position tab[TAB + 2t] of sequence tab[TAB + 2t + 1],
// whose keys and values fill slots [seq * cache_slots, (seq + 1) * cache_slots) of the caches.
// Bindings: 0 params {pos0, n} | 1 q f32 [n, q_stride] (heads at h * D) | 2 K cache | 3 V cache | 4 part f32
// The cache is f32, or f16 built with -DKV_F16 (the loads stay as they are, half the bytes).
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
#ifdef KV_F16 // an f16 cache (common.glsl): a piece of 4 values is 2 words
layout(binding = 2) readonly buffer K_ { uvec2 kc4[]; };
layout(binding = 3) readonly buffer V_ { uvec2 vc4[]; };
#define KV_PIECE(w) unpack_f16x4(w)
#define KV_PIECE_T uvec2
#else
layout(binding = 2) readonly buffer K_ { vec4 kc4[]; };
layout(binding = 3) readonly buffer V_ { vec4 vc4[]; };
#define KV_PIECE(v) (v)
#define KV_PIECE_T vec4
#endif
layout(binding = 4) writeonly buffer O_ { float part[]; };

layout(push_constant) uniform PC {
    uint n_tokens, n_heads, n_kv_heads, head_dim, cache_slots, window;
    float scale, softcap;
    uint n_splits;
    uint q_stride;   // floats between the query rows of two tokens (the fused qkv rows)
    uint kv_batch_stride, flags;
} pc;

const uint NC = (DMAX / 4u + W - 1u) / W;   // vec4 pieces of a row per lane
const uint NSG = 64u / W;                   // subgroups per workgroup
const uint U = 8u;                          // keys a subgroup takes at a time
const float NEG_INF = -1.0 / 0.0;
shared float sm_m[NSG], sm_l[NSG];
shared vec4 sm_acc[NSG * (DMAX / 4u)];

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
    // at least one round of keys (NSG * U) a workgroup: splits past the keys exit at once
    uint run = max(NSG * U, (p + 1u - lo + pc.n_splits - 1u) / pc.n_splits);
    uint k_begin = lo + s * run, k_end = min(p + 1u, k_begin + run);
    uint kvh = h / (pc.n_heads / pc.n_kv_heads);
    uint qb = (t * pc.q_stride + h * D) / 4u;
    vec4 q[NC], acc[NC];
    [[unroll]] for (uint c = 0u; c < NC; c++) {
        uint i = lane + c * W;
        q[c] = i < D4 ? q4[qb + i] : vec4(0.0);
        acc[c] = vec4(0.0);
    }
    float m = NEG_INF, l = 0.0;
    for (uint j0 = k_begin + sg; j0 < k_end; j0 += NSG * U) {
        // keys j0 + NSG u, u < U: every K and V piece loaded first
        KV_PIECE_T kk[U][NC], vv[U][NC];
        [[unroll]] for (uint u = 0u; u < U; u++) {
            uint j = j0 + NSG * u;
            uint rb = ((kv0 + j % pc.cache_slots) * pc.n_kv_heads + kvh) * D4;
            [[unroll]] for (uint c = 0u; c < NC; c++) {
                uint i = lane + c * W;
                bool ok = j < k_end && i < D4;
                kk[u][c] = ok ? kc4[rb + i] : KV_PIECE_T(0);
                vv[u][c] = ok ? vc4[rb + i] : KV_PIECE_T(0);
            }
        }
        float sc[U];
        float m_new = m;
        [[unroll]] for (uint u = 0u; u < U; u++) {
            float d = 0.0;
            [[unroll]] for (uint c = 0u; c < NC; c++) d += dot(q[c], KV_PIECE(kk[u][c]));
            float v = subgroupAdd(d) * pc.scale;
            if (pc.softcap > 0.0) v = safe_tanh(v / pc.softcap) * pc.softcap;
            sc[u] = j0 + NSG * u < k_end ? v : NEG_INF;
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
}
