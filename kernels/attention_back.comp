#version 450
// attention_back: the backward twin of attention_tiled.comp for training (causal, GQA, sliding
// window, soft-cap; a batch of sequences of n_tokens tokens each, positions 0..n_tokens-1).
// Nothing of size [T, T] is kept: the forward pass leaves each query's log-sum-exp, and the
// probabilities are recomputed tile by tile (as flash attention's backward pass does):
//   z = scale * q.k, S = softcap ? c * tanh(z / c) : z, P = exp(S - lse)
//   delta_i = sum_d dO[i, d] * O[i, d]
//   dS = P * (dO.v - delta) * (softcap ? 1 - (S / c)^2 : 1)
//   dq_i = scale * sum_j dS_ij k_j,  dk_j = scale * sum_i dS_ij q_i,  dv_j = sum_i P_ij dO_i
// summed over the query heads that share a kv head. Three modes, dispatched in this order:
//   0 delta: one invocation per (row, head): delta into the second half of stats.
//   1 dq:    one workgroup per (8 queries, head, sequence); keys in tiles of 8.
//   2 dk dv: one workgroup per (8 keys, kv head, sequence); queries in tiles of 8, every head
//            of the group, so no two workgroups write the same gradient row (no atomics).
// Shared memory: three tiles of 8 rows of DMAX + 1 floats (< 25 KiB); D <= DMAX <= 256.
// Bindings: 0 q f32 [rows, q_stride] (heads at h * D) | 1 K f32 [b * kv_batch_stride + (t, Hkv, D)]
//           2 V (as K) | 3 O f32 [rows, H, D] | 4 dO f32 [rows, H, D]
//           5 stats f32 [2, rows, H]: lse (from the forward pass), then delta (mode 0 writes it)
//           6 out f32 [rows, q_stride]: dq at h * D, dk at k_off + kvh * D, dv at v_off + kvh * D
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 64) in;

#include "common.glsl"

layout(binding = 0) readonly buffer Q_ { float q[]; };
layout(binding = 1) readonly buffer K_ { float kc[]; };
layout(binding = 2) readonly buffer V_ { float vc[]; };
layout(binding = 3) readonly buffer O_ { float o[]; };
layout(binding = 4) readonly buffer DO_ { float dout[]; };
layout(binding = 5) buffer S_ { float stats[]; };
layout(binding = 6) buffer G_ { float grad[]; };

// push constants: forge__pc_attn_back (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC {
    uint n_tokens, n_heads, n_kv_heads, head_dim, window;
    float scale, softcap;
    uint q_stride, k_off, v_off, kv_batch_stride, n_rows, mode;
} pc;

layout(constant_id = 0) const uint DMAX = 256; // head_dim rounded up to a multiple of 8 (the model's, pinned at pipeline creation)
const uint T8 = 8, DS = DMAX + 1, PER = DMAX / T8;
shared float qs[T8 * DS];     // mode 1: queries; mode 2: the query or dO tile
shared float ds_[T8 * DS];    // mode 1: dO of the queries; mode 2: the keys
shared float ts[T8 * DS];     // mode 1: the K or V tile; mode 2: the values
shared float pt[T8][T8];      // mode 2: P
shared float st[T8][T8];      // dS
shared float ql[T8], qd[T8];  // mode 2: lse and delta of the query tile

float score(float dot, out float capf) {
    float z = dot * pc.scale;
    capf = 1.0;
    if (pc.softcap > 0.0) {
        float t = safe_tanh(z / pc.softcap);
        capf = 1.0 - t * t;
        return t * pc.softcap;
    }
    return z;
}

// may key j be seen by query i (positions within one sequence)?
bool visible(uint i, uint j) {
    return i < pc.n_tokens && j <= i && (pc.window == 0u || i - j < pc.window);
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint D = pc.head_dim, H = pc.n_heads;
    uint group = pc.n_heads / pc.n_kv_heads;
    if (pc.mode == 0u) {
        uint idx = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64u;
        if (idx >= pc.n_rows * H) return;
        uint base = idx * D; // (row, head) rows of O and dO are contiguous [rows, H, D]
        float s = 0.0;
        for (uint d = 0; d < D; d++) s += dout[base + d] * o[base + d];
        stats[pc.n_rows * H + idx] = s;
        return;
    }
    uint b = gl_WorkGroupID.z, row0 = b * pc.n_tokens, kv0 = b * pc.kv_batch_stride;
    if (pc.mode == 1u) {
        uint h = gl_WorkGroupID.y, kvh = h / group, t0 = gl_WorkGroupID.x * T8;
        uint my_q = tid / T8, my_k = tid % T8;
        uint nq = min(T8, pc.n_tokens - t0);
        for (uint e = tid; e < T8 * D; e += 64u) {
            uint qi = e / D, d = e % D;
            uint r = (row0 + t0 + qi);
            qs[qi * DS + d] = qi < nq ? q[r * pc.q_stride + h * D + d] : 0.0;
            ds_[qi * DS + d] = qi < nq ? dout[(r * H + h) * D + d] : 0.0;
        }
        uint i = t0 + my_q;
        bool live = my_q < nq;
        float lse = live ? stats[(row0 + i) * H + h] : 0.0;
        float delta = live ? stats[pc.n_rows * H + (row0 + i) * H + h] : 0.0;
        float acc[PER];
        [[unroll]] for (uint a = 0; a < PER; a++) acc[a] = 0.0;
        uint last = t0 + nq - 1u;
        uint lo = (pc.window != 0u && t0 + 1u > pc.window) ? t0 + 1u - pc.window : 0u;
        for (uint j0 = lo; j0 <= last; j0 += T8) {
            barrier(); // the previous tile's reads are done
            for (uint e = tid; e < T8 * D; e += 64u) {
                uint kj = e / D, d = e % D, j = j0 + kj;
                ts[kj * DS + d] = j <= last ? kc[kv0 + (j * pc.n_kv_heads + kvh) * D + d] : 0.0;
            }
            barrier();
            float dot = 0.0;
            for (uint d = 0; d < D; d++) dot += qs[my_q * DS + d] * ts[my_k * DS + d];
            float capf;
            float S = score(dot, capf);
            uint j = j0 + my_k;
            float P = (live && visible(i, j)) ? exp(S - lse) : 0.0;
            barrier();
            for (uint e = tid; e < T8 * D; e += 64u) {
                uint kj = e / D, d = e % D, jj = j0 + kj;
                ts[kj * DS + d] = jj <= last ? vc[kv0 + (jj * pc.n_kv_heads + kvh) * D + d] : 0.0;
            }
            barrier();
            float dp = 0.0;
            for (uint d = 0; d < D; d++) dp += ds_[my_q * DS + d] * ts[my_k * DS + d];
            st[my_q][my_k] = P * (dp - delta) * capf * pc.scale;
            barrier();
            for (uint e = tid; e < T8 * D; e += 64u) {
                uint kj = e / D, d = e % D, jj = j0 + kj;
                ts[kj * DS + d] = jj <= last ? kc[kv0 + (jj * pc.n_kv_heads + kvh) * D + d] : 0.0;
            }
            barrier();
            [[unroll]] for (uint a = 0; a < PER; a++) {
                uint d = my_k + T8 * a;
                if (d < D) {
                    float s = acc[a];
                    [[unroll]] for (uint kj = 0; kj < T8; kj++) s += st[my_q][kj] * ts[kj * DS + d];
                    acc[a] = s;
                }
            }
        }
        if (live)
            [[unroll]] for (uint a = 0; a < PER; a++) {
                uint d = my_k + T8 * a;
                if (d < D) grad[(row0 + i) * pc.q_stride + h * D + d] = acc[a];
            }
        return;
    }
    // mode 2: dk and dv for 8 keys of one kv head
    uint kvh = gl_WorkGroupID.y, j0 = gl_WorkGroupID.x * T8;
    uint my_k = tid / T8, my_q = tid % T8;
    uint nk = min(T8, pc.n_tokens - j0);
    for (uint e = tid; e < T8 * D; e += 64u) {
        uint kj = e / D, d = e % D, j = j0 + kj;
        uint src = kv0 + (j * pc.n_kv_heads + kvh) * D + d;
        ds_[kj * DS + d] = kj < nk ? kc[src] : 0.0;
        ts[kj * DS + d] = kj < nk ? vc[src] : 0.0;
    }
    float dk[PER], dv[PER];
    [[unroll]] for (uint a = 0; a < PER; a++) { dk[a] = 0.0; dv[a] = 0.0; }
    uint j = j0 + my_k;
    uint i_end = pc.window != 0u ? min(pc.n_tokens, j0 + nk - 1u + pc.window) : pc.n_tokens; // exclusive
    for (uint h = kvh * group; h < (kvh + 1u) * group; h++) {
        for (uint i0 = j0; i0 < i_end; i0 += T8) {
            barrier();
            for (uint e = tid; e < T8 * D; e += 64u) {
                uint qi = e / D, d = e % D, i = i0 + qi;
                qs[qi * DS + d] = i < pc.n_tokens ? q[(row0 + i) * pc.q_stride + h * D + d] : 0.0;
            }
            if (tid < T8) {
                uint i = i0 + tid;
                ql[tid] = i < pc.n_tokens ? stats[(row0 + i) * H + h] : 0.0;
                qd[tid] = i < pc.n_tokens ? stats[pc.n_rows * H + (row0 + i) * H + h] : 0.0;
            }
            barrier();
            float dot = 0.0;
            for (uint d = 0; d < D; d++) dot += qs[my_q * DS + d] * ds_[my_k * DS + d];
            float capf;
            float S = score(dot, capf);
            uint i = i0 + my_q;
            float P = (my_k < nk && visible(i, j)) ? exp(S - ql[my_q]) : 0.0;
            barrier();
            for (uint e = tid; e < T8 * D; e += 64u) {
                uint qi = e / D, d = e % D, ii = i0 + qi;
                qs[qi * DS + d] = ii < pc.n_tokens ? dout[((row0 + ii) * H + h) * D + d] : 0.0;
            }
            barrier();
            float dp = 0.0;
            for (uint d = 0; d < D; d++) dp += qs[my_q * DS + d] * ts[my_k * DS + d];
            pt[my_k][my_q] = P;
            st[my_k][my_q] = P * (dp - qd[my_q]) * capf * pc.scale;
            barrier();
            [[unroll]] for (uint a = 0; a < PER; a++) {
                uint d = my_q + T8 * a;
                if (d < D) {
                    float s = dv[a];
                    [[unroll]] for (uint qi = 0; qi < T8; qi++) s += pt[my_k][qi] * qs[qi * DS + d];
                    dv[a] = s;
                }
            }
            barrier();
            for (uint e = tid; e < T8 * D; e += 64u) {
                uint qi = e / D, d = e % D, ii = i0 + qi;
                qs[qi * DS + d] = ii < pc.n_tokens ? q[(row0 + ii) * pc.q_stride + h * D + d] : 0.0;
            }
            barrier();
            [[unroll]] for (uint a = 0; a < PER; a++) {
                uint d = my_q + T8 * a;
                if (d < D) {
                    float s = dk[a];
                    [[unroll]] for (uint qi = 0; qi < T8; qi++) s += st[my_k][qi] * qs[qi * DS + d];
                    dk[a] = s;
                }
            }
        }
    }
    if (my_k < nk)
        [[unroll]] for (uint a = 0; a < PER; a++) {
            uint d = my_q + T8 * a;
            if (d < D) {
                uint r = (row0 + j) * pc.q_stride + kvh * D + d;
                grad[r + pc.k_off] = dk[a];
                grad[r + pc.v_off] = dv[a];
            }
        }
}
