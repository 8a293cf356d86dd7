#version 450
#extension GL_GOOGLE_include_directive : require
// delta_rule_chunk: the gated delta rule's chunked form (Qwen 3.5's Gated DeltaNet prefill), the
// part that walks the state: after delta_rule_prep.comp has written each chunk's T, P, G and
// gates (its header has the algebra), one pass over a group's chunks in order, each as matrix
// products with the state block S0 [k_dim, 16 columns] in shared memory:
//   X = K S0, Y = Q S0                        (K, Q: the chunk's rows, L2-normed; Q scaled)
//   R = beta (V - e^G X);  Delta = R + T R    (the rows' deltas; T strictly lower here)
//   O = e^G Y + P Delta                       (the outputs, before the gated norm)
//   S0 = e^{G_last} S0 + K^T (e^{G_last - G} Delta)
// so a prompt of n rows takes n / 64 dependent steps where the recurrent form
// (delta_rule_sg.comp) takes n. The output is o itself, as delta_rule_sg.comp's:
// gated_norm.comp applies the gated RMSNorm. One workgroup per (value head, block of 16 of its
// columns) and group of rows; invocation (j, r) = (tid % 16, tid / 16) owns column j and the
// chunk's rows r, r + 16, r + 32, r + 48 (a vec4 of each product), and state rows 2r, 2r + 1 of
// each 32-dim slice in its update.
// Shared memory holds the chunk's rows in "pos" order, row t at 4 (t % 16) + t / 16, so that an
// invocation's four rows are one vec4: the slices of K and Q [32 dims][64 rows], T and P
// [64 rows][64 columns in pos order] and R / Delta [16 columns][64 rows]; the sums over a chunk's
// rows run in pos order. Every global load is issued a phase ahead of its use (X and Y's next
// slice during this one's products, T during X and Y, P during Delta, K during O, the next
// chunk's first slice during the last update): a workgroup is alone on its multiprocessor.
// k_dim <= 128 (forge__delta_chunked: wider heads take the recurrent form); 30 KB of shared
// memory, under lavapipe's 32 KB.
// (Measured on the H200 with the Qwen3.5-2B shape's 512-token prefill: 121 us a layer, where the
// scalar form before this one, a row of four a load and T, P read from global memory in the
// loop, took 274 us; the 35B-A3B shape's 16.6 -> 7.2 ms over 30 layers: bench/RESULTS.md.)
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

const uint MAXC = 64u, CW = 2u * MAXC + 4u, SL = 32u, VB = 16u, MAXD = 128u;
const uint LD = 17u;                 // a staged line's vec4s: 64 floats and 4 of padding (68: banks)
const uint QOFF = SL * LD;           // Q's slice after K's in buf
shared vec4 buf[MAXC * LD];          // K | Q slices [32][68] each, or T / P [64][68]
shared vec4 sR[VB * LD];             // R, then Delta, then its rows weighted for the state [16][68]
shared float sS[MAXD * VB];          // the state's block [k_dim, 16]
shared float sG[MAXC], sB[MAXC], sNK[MAXC], sNQ[MAXC];

uint tid, j, r, Cn, t0, conv_dim, kqb, KD;

void put(uint f, float v) { buf[f / 4u][f % 4u] = v; }

// A slice's element it (< 8) of this invocation: row t, dim c of [64 rows, 32 dims]; a warp's
// 32 take 4 rows (t % 16 equal, one of each t / 16) by 8 dims, so their pos-order stores fall
// in 32 banks and their loads in 4 runs of 32 bytes.
void slice_elem(uint it, out uint t, out uint c) {
    uint lane = tid % 32u, wv = tid / 32u + 8u * it;
    t = wv % 16u + 16u * (lane / 8u);
    c = (wv / 16u) * 8u + lane % 8u;
}
float slice_load(uint it, uint i0, uint base) {
    uint t, c;
    slice_elem(it, t, c);
    return t < Cn && i0 + c < pc.k_dim ? qkv[(t0 + t) * conv_dim + base + i0 + c] : 0.0;
}
void slice_store(uint it, uint off, float v) {
    uint t, c;
    slice_elem(it, t, c);
    put(off + c * (4u * LD) + (t % 16u) * 4u + t / 16u, v);
}
// T's or P's element it (< 16): row t, column u of [64, 64], stored at column pos(u)
float tp_load(uint it, uint h, uint NV, uint off) {
    uint e = tid + 256u * it, t = e / MAXC, u = e % MAXC;
    return t < Cn && u < Cn ? work[((t0 + t) * NV + h) * CW + off + u] : 0.0;
}
void tp_store(uint it, float v) {
    uint e = tid + 256u * it, t = e / MAXC, u = e % MAXC;
    put(t * (4u * LD) + (u % 16u) * 4u + u / 16u, v);
}

void main() {
    tid = gl_LocalInvocationID.x;
    j = tid % VB;
    r = tid / VB;
    uint NV = pc.v_heads, DK = pc.k_dim, DV = pc.v_dim, C = pc.chunk;
    KD = pc.k_heads * DK;
    uint NB = (DV + VB - 1u) / VB, h = gl_WorkGroupID.x / NB, col = (gl_WorkGroupID.x % NB) * VB + j;
    bool live = col < DV;
    uint kh = pc.v_tiled != 0u ? h % pc.k_heads : h / (NV / pc.k_heads);
    uint g = gl_WorkGroupID.y, row0 = g * pc.group_rows, end = row0 + pc.group_rows;
    uint place = pc.table != 0u ? params.tab[TAB + 2u * row0 + 1u] : g;
    uint pos = pc.table != 0u ? params.tab[TAB + 2u * row0] : params.pos0;
    conv_dim = 2u * KD + NV * DV;
    kqb = kh * DK;
    uint sbase = (place * NV + h) * DK * DV + col;
    for (uint i = r; i < MAXD; i += 16u) sS[i * VB + j] = (live && i < DK && pos != 0u) ? S[sbase + i * DV] : 0.0;
    float pre[16]; // the next slice: K's 8 elements, then Q's
    t0 = row0;
    Cn = min(C, end - t0);
    for (uint it = 0u; it < 8u; it++) {
        pre[it] = slice_load(it, 0u, kqb + KD);
        pre[8u + it] = slice_load(it, 0u, kqb);
    }
    for (; t0 < end; t0 += C) {
        Cn = min(C, end - t0);
        if (tid < MAXC) {
            uint wb = ((t0 + tid) * NV + h) * CW + 2u * MAXC;
            bool in_ = tid < Cn;
            sG[tid] = in_ ? work[wb] : 0.0;
            sB[tid] = in_ ? work[wb + 1u] : 0.0;
            sNK[tid] = in_ ? work[wb + 2u] : 0.0;
            sNQ[tid] = in_ ? work[wb + 3u] : 0.0;
        }
        float tp[16], v[4];
        for (uint it = 0u; it < 16u; it++) tp[it] = tp_load(it, h, NV, 0u);
        for (uint a = 0u; a < 4u; a++) {
            uint t = r + 16u * a;
            v[a] = live && t < Cn ? qkv[(t0 + t) * conv_dim + 2u * KD + h * DV + col] : 0.0;
        }
        // X = K S0, Y = Q S0 for rows r + 16 a (raw k, q: their norms after)
        vec4 x = vec4(0.0), y = vec4(0.0);
        for (uint i0 = 0u; i0 < DK; i0 += SL) {
            barrier(); // (buf's readers are done)
            for (uint it = 0u; it < 8u; it++) {
                slice_store(it, 0u, pre[it]);
                slice_store(it, 4u * QOFF, pre[8u + it]);
            }
            barrier();
            if (i0 + SL < DK)
                for (uint it = 0u; it < 8u; it++) {
                    pre[it] = slice_load(it, i0 + SL, kqb + KD);
                    pre[8u + it] = slice_load(it, i0 + SL, kqb);
                }
            uint cn = min(SL, DK - i0);
            for (uint c = 0u; c < cn; c++) {
                float s = sS[(i0 + c) * VB + j];
                x += buf[c * LD + r] * s;
                y += buf[QOFF + c * LD + r] * s;
            }
        }
        vec4 R;
        for (uint a = 0u; a < 4u; a++) {
            uint t = r + 16u * a;
            R[a] = t < Cn ? sB[t] * (v[a] - exp(sG[t]) * sNK[t] * x[a]) : 0.0;
        }
        barrier();
        for (uint it = 0u; it < 16u; it++) tp_store(it, tp[it]);
        sR[j * LD + r] = R;
        barrier();
        for (uint it = 0u; it < 16u; it++) tp[it] = tp_load(it, h, NV, MAXC);
        vec4 d = R; // Delta = R + T R
        for (uint p4 = 0u; p4 < MAXC / 4u; p4++) {
            vec4 rv = sR[j * LD + p4];
            for (uint a = 0u; a < 4u; a++) d[a] += dot(buf[(r + 16u * a) * LD + p4], rv);
        }
        barrier();
        for (uint it = 0u; it < 16u; it++) tp_store(it, tp[it]);
        sR[j * LD + r] = d;
        barrier();
        for (uint it = 0u; it < 8u; it++) pre[it] = slice_load(it, 0u, kqb + KD);
        vec4 out_; // O = e^G Y + P Delta
        for (uint a = 0u; a < 4u; a++) {
            uint t = r + 16u * a;
            out_[a] = exp(sG[t]) * sNQ[t] * y[a];
        }
        for (uint p4 = 0u; p4 < MAXC / 4u; p4++) {
            vec4 dv = sR[j * LD + p4];
            for (uint a = 0u; a < 4u; a++) out_[a] += dot(buf[(r + 16u * a) * LD + p4], dv);
        }
        for (uint a = 0u; a < 4u; a++) {
            uint t = r + 16u * a;
            if (live && t < Cn) o[(t0 + t) * NV * DV + h * DV + col] = out_[a];
        }
        float g_last = sG[Cn - 1u], dl = exp(g_last);
        vec4 dw; // Delta's rows weighted for the state: |k|^-1 e^{G_last - G}
        for (uint a = 0u; a < 4u; a++) {
            uint t = r + 16u * a;
            dw[a] = t < Cn ? d[a] * sNK[t] * exp(g_last - sG[t]) : 0.0;
        }
        barrier();
        sR[j * LD + r] = dw;
        // S0 = e^{G_last} S0 + K^T Delta', state rows i0 + 2r, i0 + 2r + 1
        for (uint i0 = 0u; i0 < DK; i0 += SL) {
            if (i0 != 0u) barrier();
            for (uint it = 0u; it < 8u; it++) slice_store(it, 0u, pre[it]);
            barrier();
            bool last = i0 + SL >= DK;
            uint nt0 = t0 + C;
            if (!last)
                for (uint it = 0u; it < 8u; it++) pre[it] = slice_load(it, i0 + SL, kqb + KD);
            else if (nt0 < end) { // the next chunk's first slice
                uint ct0 = t0, cCn = Cn;
                t0 = nt0;
                Cn = min(C, end - nt0);
                for (uint it = 0u; it < 8u; it++) {
                    pre[it] = slice_load(it, 0u, kqb + KD);
                    pre[8u + it] = slice_load(it, 0u, kqb);
                }
                t0 = ct0;
                Cn = cCn;
            }
            vec4 a0 = vec4(0.0), a1 = vec4(0.0);
            for (uint p4 = 0u; p4 < MAXC / 4u; p4++) {
                vec4 dv = sR[j * LD + p4];
                a0 += buf[(2u * r) * LD + p4] * dv;
                a1 += buf[(2u * r + 1u) * LD + p4] * dv;
            }
            uint i = i0 + 2u * r;
            if (i < DK) sS[i * VB + j] = dl * sS[i * VB + j] + (a0.x + a0.y + a0.z + a0.w);
            if (i + 1u < DK) sS[(i + 1u) * VB + j] = dl * sS[(i + 1u) * VB + j] + (a1.x + a1.y + a1.z + a1.w);
        }
        barrier(); // (sG ... and sS's update are done before the next chunk's)
    }
    if (live)
        for (uint i = r; i < DK; i += 16u) S[sbase + i * DV] = sS[i * VB + j];
}
