#version 450
#extension GL_GOOGLE_include_directive : require
// delta_rule_prep: the first half of the gated delta rule's chunked form (Qwen 3.5's Gated
// DeltaNet prefill; delta_rule_chunk.comp is the second): everything within a chunk of C <= 64
// rows that does not depend on the state, for all chunks and value heads at once. With the
// recurrent form's notation (delta_rule.comp: q, k L2-normed, q scaled by 1 / sqrt(k_dim),
// beta = sigmoid(b), log decay gamma = neg_a softplus(a + dt_bias)) and G_t = gamma_0 + ... +
// gamma_t, the chunk's cumulative log decay (every exp below is of a difference <= 0):
//   A[t][s] = beta_t exp(G_t - G_s) k_t . k_s   (s < t; strictly lower)
//   T = (I + A)^-1                              (unit lower, by forward substitution)
//   P[t][s] = exp(G_t - G_s) q_t . k_s          (s <= t)
// Unrolling the recurrence over the chunk from its state S0 gives the rows' delta
// (S_t = e^{g_t} S_{t-1} + k_t delta_t^T) as  Delta = T beta (V - diag(e^G) K S0),  the
// outputs as  O = diag(e^G) Q S0 + P Delta,  and the next state as
// e^{G_last} S0 + sum_s e^{G_last - G_s} k_s delta_s^T: delta_rule_chunk.comp's matrix products.
// One workgroup per (chunk, value head) of each group of rows (conv1d.comp's groups: one
// sequence's rows in order; a group's chunks start at its first row, the last may be short).
// The dot products run over k_dim in slices of 16 staged in shared memory, a 4 x 4 block of
// (t, s) per invocation; the substitution goes row by row, an invocation per column.
// Bindings: 0 qkv f32 [n, conv_dim]: conv1d's output, q [k_heads, k_dim] | k [k_heads, k_dim] | v
//           1 mix f32 [n, mix_stride]: b at b_off [v_heads], a at a_off | 2 neg_a f32 [v_heads] | 3 dt_bias f32 [v_heads]
//           4 work f32 [n, v_heads, 2 * 64 + 4]: per row and value head, T's row (64: columns < t,
//             the unit diagonal implied), P's row (64: columns <= t), then G_t, beta_t, 1 / |k_t|,
//             1 / (|q_t| sqrt(k_dim)); columns past the chunk's rows are left unwritten
layout(local_size_x = 256) in;

layout(binding = 0) readonly buffer Q_ { float qkv[]; };
layout(binding = 1) readonly buffer M_ { float mix[]; };
layout(binding = 2) readonly buffer A_ { float neg_a[]; };
layout(binding = 3) readonly buffer D_ { float dt_bias[]; };
layout(binding = 4) writeonly buffer W_ { float work[]; };

// push constants: forge__pc_delta (src/ops.c), field for field (checked against its size);
// chunk: the rows of a chunk (<= 64)
#include "pc_delta.glsl"

const uint MAXC = 64u, CW = 2u * MAXC + 4u, SL = 16u;
shared float sk[MAXC][SL + 1u], sq[MAXC][SL + 1u]; // a slice of the chunk's k and q (raw)
shared float M[MAXC][MAXC + 1u];                   // A, turned into T row by row
shared float sG[MAXC], sB[MAXC], sNK[MAXC], sNQ[MAXC];

void main() {
    uint tid = gl_LocalInvocationID.x, NV = pc.v_heads, C = pc.chunk;
    uint h = gl_WorkGroupID.x % NV, ci = gl_WorkGroupID.x / NV, g = gl_WorkGroupID.y;
    uint row0 = g * pc.group_rows, t0 = row0 + ci * C;
    if (t0 >= row0 + pc.group_rows) return; // (uniform: the group's chunks are fewer)
    uint Cn = min(C, row0 + pc.group_rows - t0);
    uint DK = pc.k_dim, KD = pc.k_heads * DK, conv_dim = 2u * KD + NV * pc.v_dim;
    uint kh = pc.v_tiled != 0u ? h % pc.k_heads : h / (NV / pc.k_heads);
    if (tid < Cn) {
        uint mb = (t0 + tid) * pc.mix_stride;
        sB[tid] = 1.0 / (1.0 + exp(-mix[mb + pc.b_off + h]));
        float ax = mix[mb + pc.a_off + h] + dt_bias[h];
        sG[tid] = neg_a[h] * (ax > 20.0 ? ax : log(1.0 + exp(ax))); // softplus, as torch's (threshold 20)
    }
    // the raw dot products k_t . k_s and q_t . k_s of a 4 x 4 block, and each row's squares
    uint tb = (tid / 16u) * 4u, sb = (tid % 16u) * 4u;
    float dk[4][4], dq[4][4];
    for (uint a = 0u; a < 4u; a++)
        for (uint b = 0u; b < 4u; b++) dk[a][b] = dq[a][b] = 0.0;
    float ssk = 0.0, ssq = 0.0;
    for (uint i0 = 0u; i0 < DK; i0 += SL) {
        barrier();
        for (uint e = tid; e < MAXC * SL; e += 256u) {
            uint r = e / SL, c = e % SL;
            float kv = 0.0, qv = 0.0;
            if (r < Cn && i0 + c < DK) {
                uint qb = (t0 + r) * conv_dim + kh * DK + i0 + c;
                qv = qkv[qb];
                kv = qkv[qb + KD];
            }
            sk[r][c] = kv;
            sq[r][c] = qv;
        }
        barrier();
        if (tid < MAXC)
            for (uint c = 0u; c < SL; c++) {
                ssk += sk[tid][c] * sk[tid][c];
                ssq += sq[tid][c] * sq[tid][c];
            }
        for (uint c = 0u; c < SL; c++) {
            vec4 ks = vec4(sk[sb][c], sk[sb + 1u][c], sk[sb + 2u][c], sk[sb + 3u][c]);
            for (uint a = 0u; a < 4u; a++) {
                float kt = sk[tb + a][c], qt = sq[tb + a][c];
                for (uint b = 0u; b < 4u; b++) {
                    dk[a][b] += kt * ks[b];
                    dq[a][b] += qt * ks[b];
                }
            }
        }
    }
    if (tid < MAXC) {
        sNK[tid] = inversesqrt(ssk + 1e-6);
        sNQ[tid] = inversesqrt(ssq + 1e-6) * inversesqrt(float(DK));
    }
    barrier();
    if (tid == 0u) { // the cumulative log decay (64 adds)
        float s = 0.0;
        for (uint t = 0u; t < Cn; t++) {
            s += sG[t];
            sG[t] = s;
        }
    }
    barrier();
    for (uint a = 0u; a < 4u; a++)
        for (uint b = 0u; b < 4u; b++) {
            uint t = tb + a, s = sb + b;
            if (t >= Cn || s >= Cn) continue;
            float d = s <= t ? exp(sG[t] - sG[s]) : 0.0;
            M[t][s] = s < t ? sB[t] * d * sNK[t] * sNK[s] * dk[a][b] : 0.0;
            work[((t0 + t) * NV + h) * CW + MAXC + s] = d * sNQ[t] * sNK[s] * dq[a][b];
        }
    barrier();
    // T = (I + A)^-1 in place: row t from the rows before it, which already hold T:
    //   T[t][u] = -(A[t][u] + sum_{u < s < t} A[t][s] T[s][u])
    for (uint t = 1u; t < Cn; t++) {
        float v = 0.0;
        if (tid < t) {
            v = M[t][tid];
            for (uint s = tid + 1u; s < t; s++) v += M[t][s] * M[s][tid];
        }
        barrier();
        if (tid < t) M[t][tid] = -v;
        barrier();
    }
    for (uint e = tid; e < Cn * Cn; e += 256u) {
        uint t = e / Cn, u = e % Cn;
        work[((t0 + t) * NV + h) * CW + u] = u < t ? M[t][u] : 0.0;
    }
    if (tid < Cn) {
        uint wb = ((t0 + tid) * NV + h) * CW + 2u * MAXC;
        work[wb] = sG[tid];
        work[wb + 1u] = sB[tid];
        work[wb + 2u] = sNK[tid];
        work[wb + 3u] = sNQ[tid];
    }
}
