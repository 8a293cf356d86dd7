#version 450
#extension GL_GOOGLE_include_directive : require
// delta_rule_chunk: the gated delta rule's chunked form (Qwen 3.5's Gated DeltaNet prefill), the
// part that walks the state: after delta_rule_prep.comp has written each chunk's T, P, G and
// gates (its header has the algebra), one pass over a group's chunks in order, each as matrix
// products with the state block S0 [k_dim, 16 columns] in shared memory:
//   X = K S0, Y = Q S0                        (K, Q: the chunk's rows, L2-normed; Q scaled)
//   R = beta (V - e^G X);  Delta = T R        (the rows' deltas)
//   O = e^G Y + P Delta                       (the outputs, before the gated norm)
//   S0 = e^{G_last} S0 + K^T (e^{G_last - G} Delta)
// so a prompt of n rows takes n / 64 dependent steps where the recurrent form
// (delta_rule_sg.comp) takes n. The output is o itself, as delta_rule_sg.comp's:
// gated_norm.comp applies the gated RMSNorm. One workgroup per (value head, block of 16 of its
// columns) and group of rows; invocation (j, r) = (tid % 16, tid / 16) owns column j and rows
// r, r + 16, r + 32, r + 48 of the chunk (and rows r + 16 i of the state in its update). A
// sequence whose group starts at position 0 starts from S = 0; its final state is written back.
// (Measured on the H200 with the Qwen3.5-2B shape's 512-token prefill: 274 us a layer; blocks of
// 8 columns in workgroups of 128, with slices of 32 dims whose loads were in flight during the
// products before them, took 448 us: bench/RESULTS.md.)
// Bindings: 0 params (as conv1d.comp: pos0, the row table at byte 64)
//           1 qkv f32 [n, conv_dim]: q [k_heads, k_dim] | k [k_heads, k_dim] | v [v_heads, v_dim]
//           2 work f32 [n, v_heads, 2 * 64 + 4]: delta_rule_prep.comp's
//           3 state f32 [places, v_heads, k_dim, v_dim] | 4 out f32 [n, v_heads * v_dim]
layout(local_size_x = 256) in;

layout(binding = 0) readonly buffer P_ { uint pos0; uint n_tok; uint tab[]; } params;
const uint TAB = 14; // the row table at byte 64
layout(binding = 1) readonly buffer Q_ { float qkv[]; };
layout(binding = 2) readonly buffer W_ { float work[]; };
layout(binding = 3) buffer S_ { float S[]; };
layout(binding = 4) writeonly buffer O_ { float o[]; };

// push constants: forge__pc_delta (src/ops.c), field for field (checked against its size);
// chunk: the rows of a chunk, as delta_rule_prep.comp took them
#include "pc_delta.glsl"

const uint MAXC = 64u, CW = 2u * MAXC + 4u, SL = 16u, VB = 16u;
const uint MAXD = 256u; // FORGE__MAX_LINEAR_HEAD_DIM
shared float sS[MAXD * VB];                 // the state's block [k_dim, 16]
shared float stage[2u * MAXC * (SL + 1u)];  // a slice of the chunk's k | q [64, 17] each; then R [64, 16]
shared float sD[MAXC * VB];                 // Delta [64, 16]
shared float sG[MAXC], sB[MAXC], sNK[MAXC], sNQ[MAXC];
const uint QS = MAXC * (SL + 1u);           // q's slice after k's in stage

// stage[r * 17 + c] = k (and stage[QS + ...] = q) of the chunk's row r, dims i0 + c
void stage_slice(uint tid, uint t0, uint Cn, uint i0, uint kqb, uint conv_dim, uint KD, bool with_q) {
    for (uint e = tid; e < MAXC * SL; e += 256u) {
        uint r = e / SL, c = e % SL;
        bool in_ = r < Cn && i0 + c < pc.k_dim;
        uint b = (t0 + r) * conv_dim + kqb + i0 + c;
        stage[r * (SL + 1u) + c] = in_ ? qkv[b + KD] : 0.0;
        if (with_q) stage[QS + r * (SL + 1u) + c] = in_ ? qkv[b] : 0.0;
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x, j = tid % VB, r = tid / VB;
    uint NV = pc.v_heads, DK = pc.k_dim, DV = pc.v_dim, KD = pc.k_heads * DK, C = pc.chunk;
    uint NB = (DV + VB - 1u) / VB, h = gl_WorkGroupID.x / NB, col = (gl_WorkGroupID.x % NB) * VB + j;
    bool live = col < DV;
    uint kh = pc.v_tiled != 0u ? h % pc.k_heads : h / (NV / pc.k_heads);
    uint g = gl_WorkGroupID.y, row0 = g * pc.group_rows;
    uint place = pc.table != 0u ? params.tab[TAB + 2u * row0 + 1u] : g;
    uint pos = pc.table != 0u ? params.tab[TAB + 2u * row0] : params.pos0;
    uint conv_dim = 2u * KD + NV * DV, kqb = kh * DK;
    uint sbase = (place * NV + h) * DK * DV + col;
    for (uint i = r; i < MAXD; i += 16u) sS[i * VB + j] = (live && i < DK && pos != 0u) ? S[sbase + i * DV] : 0.0;
    for (uint t0 = row0; t0 < row0 + pc.group_rows; t0 += C) {
        uint Cn = min(C, row0 + pc.group_rows - t0);
        barrier(); // (the chunk before is done with sG ... and sS's update)
        if (tid < Cn) {
            uint wb = ((t0 + tid) * NV + h) * CW + 2u * MAXC;
            sG[tid] = work[wb];
            sB[tid] = work[wb + 1u];
            sNK[tid] = work[wb + 2u];
            sNQ[tid] = work[wb + 3u];
        }
        // X = K S0, Y = Q S0 for rows r + 16 a (raw k, q: their norms after)
        float x[4] = float[4](0.0, 0.0, 0.0, 0.0), y[4] = float[4](0.0, 0.0, 0.0, 0.0);
        for (uint i0 = 0u; i0 < DK; i0 += SL) {
            barrier();
            stage_slice(tid, t0, Cn, i0, kqb, conv_dim, KD, true);
            barrier();
            for (uint c = 0u; c < SL; c++) {
                float s = sS[(i0 + c) * VB + j];
                for (uint a = 0u; a < 4u; a++) {
                    x[a] += stage[(r + 16u * a) * (SL + 1u) + c] * s;
                    y[a] += stage[QS + (r + 16u * a) * (SL + 1u) + c] * s;
                }
            }
        }
        barrier(); // stage now holds R
        for (uint a = 0u; a < 4u; a++) {
            uint t = r + 16u * a;
            float R = 0.0;
            if (t < Cn) {
                float v = live ? qkv[(t0 + t) * conv_dim + 2u * KD + h * DV + col] : 0.0;
                R = sB[t] * (v - exp(sG[t]) * sNK[t] * x[a]);
            }
            stage[t * VB + j] = R;
        }
        barrier();
        for (uint a = 0u; a < 4u; a++) { // Delta = T R
            uint t = r + 16u * a;
            if (t >= Cn) continue;
            uint wb = ((t0 + t) * NV + h) * CW;
            float d = stage[t * VB + j];
            for (uint u = 0u; u < t; u++) d += work[wb + u] * stage[u * VB + j];
            sD[t * VB + j] = d;
        }
        barrier();
        for (uint a = 0u; a < 4u; a++) { // O = e^G Y + P Delta
            uint t = r + 16u * a;
            if (t >= Cn) continue;
            uint wb = ((t0 + t) * NV + h) * CW + MAXC;
            float acc = exp(sG[t]) * sNQ[t] * y[a];
            for (uint u = 0u; u <= t; u++) acc += work[wb + u] * sD[u * VB + j];
            if (live) o[(t0 + t) * NV * DV + h * DV + col] = acc;
        }
        float g_last = sG[Cn - 1u];
        barrier();
        for (uint a = 0u; a < 4u; a++) { // Delta's rows weighted for the state: |k|^-1 e^{G_last - G}
            uint t = r + 16u * a;
            if (t < Cn) sD[t * VB + j] *= sNK[t] * exp(g_last - sG[t]);
        }
        float dl = exp(g_last);
        for (uint i0 = 0u; i0 < DK; i0 += SL) { // S0 = e^{G_last} S0 + K^T Delta', row i0 + r
            barrier();
            stage_slice(tid, t0, Cn, i0, kqb, conv_dim, KD, false);
            barrier();
            if (i0 + r < DK) {
                float acc = 0.0;
                for (uint u = 0u; u < Cn; u++) acc += stage[u * (SL + 1u) + r] * sD[u * VB + j];
                sS[(i0 + r) * VB + j] = dl * sS[(i0 + r) * VB + j] + acc;
            }
        }
    }
    barrier();
    if (live)
        for (uint i = r; i < DK; i += 16u) S[sbase + i * DV] = sS[i * VB + j];
}
