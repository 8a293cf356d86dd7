#version 450
// attention_decode: decode attention split along the keys (flash-decoding), stage 1, on
// subgroups. Same inputs and partial states as attention_split.comp (the kernel for devices
// without subgroup arithmetic), which is latency-bound on a GPU: a thread walks a whole key
// row for its score and then every key serially for each output element (27 us a layer for
// the Llama-3.1-8B shape on the H100, 16 splits x 32 heads, context under 100).
// Here a subgroup takes one key at a time with its lanes holding the head's D values in vec4
// pieces (lane i: pieces i, i + W, ...), so a key's K and V rows are one coalesced load per
// piece and its score one subgroupAdd; it takes U keys at a time, all their K and V loads
// issued before any is used, with the online softmax state (m, l, acc) per subgroup. The
// workgroup's subgroups take its keys in turn and merge their states through shared memory.
// Query t, head h (causal, GQA, window, soft-cap, rotating slots: as attention_tiled.comp):
// the keys lo..p are cut into n_splits runs of equal length; workgroup (s, h, t) takes run s
// and writes part[((t * H + h) * S + s)] = {m, l, acc[D]}: m = max score, l = sum exp(score -
// m), acc = sum exp(score - m) V (m = -inf, l = 0, acc = 0: no keys).
// The runs are merged here too, by the last of the S workgroups of (h, t) to finish (each
// counts itself in count[t * H + h] after its partial state is written; the last resets the
// counter to 0 for the next dispatch): out[t, h, :] = sum_s exp(m_s - M) acc_s / sum_s
// exp(m_s - M) l_s, M = max_s m_s, as attention_combine.comp does after attention_split
// (one dispatch and one barrier a layer fewer). With flags 4 it also writes row 0 of out as
// int8 blocks for matvec_q8a (act_q8.comp's layout, K = H * D; D % 32 == 0), the o
// projection's input, so that it needs no act_q8 dispatch.
// Batch generation (flags 2): query t is at position tab[TAB + 2t] of sequence tab[TAB + 2t + 1],
// whose keys and values fill slots [seq * cache_slots, (seq + 1) * cache_slots) of the caches.
// Bindings: 0 params {pos0, n} | 1 q f32 [n, q_stride] (heads at h * D) | 2 K cache | 3 V cache
//           4 part f32 | 5 count u32 [n, H] (zero before the first dispatch) | 6 out f32 [n, H, D]
//           7 int8 output (flags 4)
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
layout(binding = 2) readonly buffer K_ { vec4 kc4[]; };
layout(binding = 3) readonly buffer V_ { vec4 vc4[]; };
layout(binding = 4) coherent buffer Part_ { float part[]; };  // read back by the last workgroup
layout(binding = 5) coherent buffer Count_ { uint count[]; };
layout(binding = 6) writeonly buffer O_ { float o[]; };
layout(binding = 7) writeonly buffer Q8_ { uvec4 q8[]; };
layout(binding = 7) writeonly buffer Q8S_ { vec4 q8s[]; };

layout(push_constant) uniform PC {
    uint n_tokens, n_heads, n_kv_heads, head_dim, cache_slots, window;
    float scale, softcap;
    uint n_splits;
    uint q_stride;   // floats between the query rows of two tokens (the fused qkv rows)
    uint kv_batch_stride, flags;
} pc;

const uint NC = (DMAX / 4u + W - 1u) / W;   // vec4 pieces of a row per lane
const uint NSG = 64u / W;                   // subgroups per workgroup
const uint U = 4u;                          // keys a subgroup takes at a time
const float NEG_INF = -1.0 / 0.0;
shared float sm_m[NSG], sm_l[NSG];
shared vec4 sm_acc[NSG * (DMAX / 4u)];
shared float sm_out[DMAX];
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
    uint run = (p + 1u - lo + pc.n_splits - 1u) / pc.n_splits;
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
        vec4 kk[U][NC], vv[U][NC];
        [[unroll]] for (uint u = 0u; u < U; u++) {
            uint j = j0 + NSG * u;
            uint rb = ((kv0 + j % pc.cache_slots) * pc.n_kv_heads + kvh) * D4;
            [[unroll]] for (uint c = 0u; c < NC; c++) {
                uint i = lane + c * W;
                bool ok = j < k_end && i < D4;
                kk[u][c] = ok ? kc4[rb + i] : vec4(0.0);
                vv[u][c] = ok ? vc4[rb + i] : vec4(0.0);
            }
        }
        float sc[U];
        float m_new = m;
        [[unroll]] for (uint u = 0u; u < U; u++) {
            float d = 0.0;
            [[unroll]] for (uint c = 0u; c < NC; c++) d += dot(q[c], kk[u][c]);
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
            [[unroll]] for (uint c = 0u; c < NC; c++) acc[c] += e * vv[u][c];
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
    // the last workgroup of (h, t) merges the S partial states
    memoryBarrierBuffer();
    barrier();
    uint ci = t * pc.n_heads + h;
    if (tid == 0u) sm_last = atomicAdd(count[ci], 1u) == pc.n_splits - 1u;
    barrier();
    if (!sm_last) return;
    if (tid == 0u) count[ci] = 0u;
    memoryBarrierBuffer();
    uint base = ci * pc.n_splits * (D + 2u);
    M = NEG_INF;
    for (uint r = 0u; r < pc.n_splits; r++) M = max(M, part[base + r * (D + 2u)]);
    L = 0.0;
    for (uint r = 0u; r < pc.n_splits; r++) {
        float mr = part[base + r * (D + 2u)];
        if (mr != NEG_INF) L += part[base + r * (D + 2u) + 1u] * exp(mr - M);
    }
    for (uint d = tid; d < D; d += 64u) {
        float a = 0.0;
        for (uint r = 0u; r < pc.n_splits; r++) {
            float mr = part[base + r * (D + 2u)];
            if (mr != NEG_INF) a += part[base + r * (D + 2u) + 2u + d] * exp(mr - M);
        }
        a /= L;
        o[ci * D + d] = a;
        sm_out[d] = a;
    }
    if ((pc.flags & 4u) == 0u || t != 0u) return;
    barrier();
    uint b = tid, K = pc.n_heads * D; // this head's blocks of 32: b < D / 32
    if (b >= D / 32u) return;
    vec4 v[8];
    for (uint i = 0u; i < 8u; i++) v[i] = vec4(sm_out[32u * b + 4u * i], sm_out[32u * b + 4u * i + 1u], sm_out[32u * b + 4u * i + 2u], sm_out[32u * b + 4u * i + 3u]);
    uint w[8];
    vec2 ds;
    quantize_q8_block(v, w, ds);
    uint gb = h * (D / 32u) + b; // the block's index in the row
    q8[2u * gb] = uvec4(w[0], w[1], w[2], w[3]);
    q8[2u * gb + 1u] = uvec4(w[4], w[5], w[6], w[7]);
    q8s[(K >> 4) + gb] = vec4(ds, 0.0, 0.0);
}
