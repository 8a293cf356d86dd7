#version 450
// gemm_rank: gemm.comp's product, C(m, n) (+)= alpha * sum_k A(m, k) B(k, n) with every operand
// through strides (the same push constants, forge__pc_gemm), for the shapes of the LoRA path,
// where one dimension is the adapter's rank (<= RMAX, 16 or 64 by build) and the product reads
// or writes one large operand once: it should run at the memory's speed, which gemm.comp's
// 32 x 32 tiles (half their lanes idle at rank 16, k padded to 32) do not come near.
//   WIDE (K <= RMAX): y += s u B^T and dx += du A, an output of tokens x features from tokens x
//       rank. A workgroup: TM rows x 256 columns, a thread a column: its B column in registers,
//       the TM x K block of A in shared memory, every C value it adds to loaded before any store.
//   ROWS (N <= RMAX, A's k the contiguous one): u = x A^T and du = s dy B. A workgroup: 8 rows of
//       A, each row's k strided over 32 lanes (coalesced); B's elements through the cache (every
//       row reads the same ones); the 32 lanes' partial sums added in shared memory in a fixed
//       order.
//   COLS (N <= RMAX, A's m the contiguous one): dB = s dy^T u, and dA = du^T x with the host
//       transposing it (C^T = B^T A^T). A thread one m, walking its chunk of k; row k of B is the
//       same for every thread (one load serves the subgroup).
// Split-K as gemm.comp: with splits > 1 workgroup z (ROWS, COLS) sums k in [z k_chunk, (z + 1)
// k_chunk) into part[z, M, N], and gemm.comp's reduce dispatch adds the splits in a fixed order
// and finishes; unsplit, each thread finishes its own outputs as gemm.comp's finish() does.
// Dropout (PEFT's, on the adapter's input x): gemm.comp's mask, the element's index taken as
// m * a_sm + k * a_sk (drop_on 1: x is A) or m * c_sm + n * c_sn (3: masking the output, WIDE);
// the host sends here only views where that is gemm.comp's index (src/forward.c, forge__gemm).
// Bindings: 0 A f32 | 1 B f32 | 2 C f32 (in/out) | 3 the step params (the dropout seed)
//           4 partial sums f32 [splits, M, N] (split-K)
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;

#include "common.glsl"

layout(binding = 0) readonly buffer A_ { float a[]; };
layout(binding = 1) readonly buffer B_ { float b[]; };
layout(binding = 2) buffer C_ { float c[]; };
layout(binding = 3) readonly buffer P_ { uint pos0, n_tok, n_penalty; float penalty, inv_temp; uint seed; } params;   // the step params
layout(binding = 4) buffer Part_ { float part[]; };

// push constants: forge__pc_gemm (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC {
    uint M, N, K;
    uint a_off, a_sm, a_sk;
    uint b_off, b_sk, b_sn;
    uint c_off, c_sm, c_sn;
    float alpha;
    uint accumulate;
    uint drop_on, drop_ld, drop_stream, drop_threshold;   // threshold = p * 2^32
    float drop_scale;                                      // 1 / (1 - p)
    uint splits, k_chunk, reduce;
} pc;

#ifndef RMAX
#define RMAX 16
#endif

float keep(uint idx, uint key) { return lowbias_hash(idx ^ key) >= pc.drop_threshold ? pc.drop_scale : 0.0; }

uint drop_key() { return pc.drop_on != 0u ? lowbias_hash(params.seed ^ lowbias_hash(pc.drop_stream + 0x9e3779b9u)) : 0u; }

// A split's partial sum, or alpha * v (masked by output dropout) written or added to C(m, n).
void finish(uint m, uint n, float v, uint key) {
    if (pc.splits > 1u) {
        part[(gl_WorkGroupID.z * pc.M + m) * pc.N + n] = v;
        return;
    }
    v *= pc.alpha;
    if (pc.drop_on == 3u) v *= keep(m * pc.c_sm + n * pc.c_sn, key);
    uint ci = pc.c_off + m * pc.c_sm + n * pc.c_sn;
    if (pc.accumulate != 0u) v += c[ci];
    c[ci] = v;
}

#if defined(WIDE)
// TM rows a workgroup: more rows read each B column fewer times, at a register each
const uint TM = RMAX <= 16 ? 32u : 16u;
shared float As[TM][RMAX];

void main() {
    uint t = gl_LocalInvocationID.x, key = drop_key();
    uint m0 = gl_WorkGroupID.y * TM, n = gl_WorkGroupID.x * 256u + t;
    for (uint e = t; e < TM * RMAX; e += 256u) {
        uint i = e / RMAX, k = e % RMAX, m = m0 + i;
        As[i][k] = m < pc.M && k < pc.K ? a[pc.a_off + m * pc.a_sm + k * pc.a_sk] : 0.0;
    }
    float bk[RMAX];
    for (uint k = 0; k < RMAX; k++) bk[k] = n < pc.N && k < pc.K ? b[pc.b_off + k * pc.b_sk + n * pc.b_sn] : 0.0;
    barrier();
    if (n >= pc.N) return;
    uint rows = min(TM, pc.M - m0);
    float cv[TM];
    for (uint i = 0; i < TM; i++) cv[i] = pc.accumulate != 0u && i < rows ? c[pc.c_off + (m0 + i) * pc.c_sm + n * pc.c_sn] : 0.0;
    for (uint i = 0; i < TM; i++) {
        if (i >= rows) break;
        float v = 0.0;
        for (uint k = 0; k < RMAX; k++) v += As[i][k] * bk[k];
        uint m = m0 + i;
        v *= pc.alpha;
        if (pc.drop_on == 3u) v *= keep(m * pc.c_sm + n * pc.c_sn, key);
        c[pc.c_off + m * pc.c_sm + n * pc.c_sn] = cv[i] + v;
    }
}

#else
// ROWS and COLS: a chunk of 32 k's of B staged in shared memory, rows padded to RMAX + 4 floats
// so that a quarter subgroup's vec4 reads of 8 rows fall in distinct banks; each thread's element
// of A multiplies RMAX values of B in RMAX / 4 vec4 reads, for RPT rows at once. (Measured on an
// H200 against a first version that read B from global memory a value a multiply-add: the same
// time, 0.33 ms for 2048 x 16 from K 8192; what bounds these two shapes is not yet known.)
const uint BK = 32u, BW = (RMAX + 4u) / 4u;   // B's chunk: BK rows of BW vec4s
const uint RPT = RMAX <= 16 ? 2u : 1u;        // rows (ROWS) or m's (COLS) a thread: B's reads serve each
shared vec4 Bs[BK][BW];

// B(k0 .. k0 + 31, 0 .. N - 1) into Bs, zero past kend and N; consecutive threads along B's
// contiguous dimension.
void stage_b(uint k0, uint kend, uint t) {
    bool k_fast = pc.b_sk <= pc.b_sn;
    for (uint e = t; e < BK * RMAX; e += 256u) {
        uint kk = k_fast ? e % BK : e / RMAX, j = k_fast ? e / BK : e % RMAX, k = k0 + kk;
        Bs[kk][j / 4u][j % 4u] = k < kend && j < pc.N ? b[pc.b_off + k * pc.b_sk + j * pc.b_sn] : 0.0;
    }
}

float a_at(uint m, uint k, uint kend, uint key) {
    if (m >= pc.M || k >= kend) return 0.0;
    float v = a[pc.a_off + m * pc.a_sm + k * pc.a_sk];
    if (pc.drop_on == 1u) v *= keep(m * pc.a_sm + k * pc.a_sk, key);
    return v;
}

#if defined(ROWS)
// 8 groups of 32 lanes, a group RPT rows of A: its lanes take the chunk's 32 k's (coalesced)
const uint ROWS_WG = 8u * RPT;
shared float red[256][17];     // the lanes' partial sums, 16 outputs at a time (17: no bank conflicts)

void main() {
    uint t = gl_LocalInvocationID.x, key = drop_key();
    uint lane = t % 32u, g = t / 32u, m0 = gl_WorkGroupID.x * ROWS_WG + g * RPT;
    uint kz = gl_WorkGroupID.z * pc.k_chunk, kend = min(pc.K, kz + pc.k_chunk);
    vec4 acc[RPT][RMAX / 4u];
    for (uint r = 0; r < RPT; r++)
        for (uint j = 0; j < RMAX / 4u; j++) acc[r][j] = vec4(0.0);
    float x[RPT];
    for (uint r = 0; r < RPT; r++) x[r] = a_at(m0 + r, kz + lane, kend, key);
    for (uint k0 = kz; k0 < kend; k0 += BK) {
        stage_b(k0, kend, t);
        barrier();
        float xn[RPT];   // the next chunk's elements in flight behind this chunk's products
        for (uint r = 0; r < RPT; r++) xn[r] = a_at(m0 + r, k0 + BK + lane, kend, key);
        for (uint j = 0; j < RMAX / 4u; j++) {
            vec4 bv = Bs[lane][j];
            for (uint r = 0; r < RPT; r++) acc[r][j] += x[r] * bv;
        }
        for (uint r = 0; r < RPT; r++) x[r] = xn[r];
        barrier();
    }
    for (uint r = 0; r < RPT; r++)
        for (uint j0 = 0; j0 < RMAX; j0 += 16u) {
            for (uint jj = 0; jj < 16u; jj++) red[t][jj] = acc[r][(j0 + jj) / 4u][jj % 4u];
            barrier();
            if (t < 128u) { // group t / 16's row r, output j0 + t % 16: its 32 lanes in order
                uint gg = t / 16u, j = j0 + t % 16u, m = gl_WorkGroupID.x * ROWS_WG + gg * RPT + r;
                float s = 0.0;
                for (uint l = 0; l < 32u; l++) s += red[gg * 32u + l][t % 16u];
                if (m < pc.M && j < pc.N) finish(m, j, s, key);
            }
            barrier();
        }
}

#elif defined(COLS)
// a thread RPT m's, 256 apart (each coalesced), walking the chunk's k's; B's row k is the same
// for every thread (a broadcast read)
void main() {
    uint t = gl_LocalInvocationID.x, key = drop_key();
    uint m0 = gl_WorkGroupID.x * 256u * RPT + t;
    uint kz = gl_WorkGroupID.z * pc.k_chunk, kend = min(pc.K, kz + pc.k_chunk);
    vec4 acc[RPT][RMAX / 4u];
    for (uint r = 0; r < RPT; r++)
        for (uint j = 0; j < RMAX / 4u; j++) acc[r][j] = vec4(0.0);
    for (uint k0 = kz; k0 < kend; k0 += BK) {
        stage_b(k0, kend, t);
        barrier();
        for (uint kk = 0; kk < BK; kk += 4u) {
            float x[4][RPT];   // four k's elements in flight together
            for (uint u = 0; u < 4u; u++)
                for (uint r = 0; r < RPT; r++) x[u][r] = a_at(m0 + 256u * r, k0 + kk + u, kend, key);
            for (uint u = 0; u < 4u; u++)
                for (uint j = 0; j < RMAX / 4u; j++) {
                    vec4 bv = Bs[kk + u][j];
                    for (uint r = 0; r < RPT; r++) acc[r][j] += x[u][r] * bv;
                }
        }
        barrier();
    }
    for (uint r = 0; r < RPT; r++) {
        uint m = m0 + 256u * r;
        if (m >= pc.M) continue;
        for (uint j = 0; j < RMAX; j++)
            if (j < pc.N) finish(m, j, acc[r][j / 4u][j % 4u], key);
    }
}
#endif
#endif
