#version 450
// matmul: C[m, c_col0 + n] (+)= sum_k A[a_row0 + m, k] * W[n, k] (+ bias[bias_off + n])
// for many rows of A: the prefill. Tiles of 64 (m) x 64 (n), stepping k by 32 through
// shared memory; 256 threads, each computing a 4 x 4 block of C. Built with SKINNY: tiles of
// 32 (m) x 128 (n), for batch decode's few rows (no half-empty tiles at 32 rows).
// Bindings: 0 A [*, K] f32 | 1 W chunk [N, K] (format per build) | 2 C [*, ldc] f32
//           3 bias f32 | 4, 5 MLX scales and biases (f16/bf16), unused by other formats
// flags: 1 add bias, 2 accumulate into C (residual), 4 soft-cap tanh(v / cap) * cap.
// Split along k (batch generation's few rows, too few tiles to fill the device): flags 64, the
// split z = workgroup z takes k in [z k_split, (z + 1) k_split) and writes its raw sums to
// C = partials [z, M, N]; then linear_reduce.comp adds them up in order and applies the epilogue.
// Built with MOE: a mixture-of-experts product grouped by expert (the prefill): W is a chunk of
// an expert weight (experts e0 .. e0 + n_exp - 1 of N rows each) and workgroup y is a tile of
// moe_group.comp's table (binding 6: the tile count, then (expert, first, rows) per tile, and
// from word order_off the (token, choice) pairs sorted by expert). Tile row m is pair
// p = order[first + m]: A row a_row0 + p / a_div (a_div = top_k: the token's activations; 1:
// the pair's own row) times the expert's rows, into C row p. Tiles of other chunks' experts exit.
// MOE with SKINNY (matmul_moe_s): tiles of 32 pairs, for experts that get few pairs each
// (forge__moe_tile_rows in src/session.c).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;

#include "pc_linear.glsl"

#include "common.glsl"
#define W_BINDING 1
#define AUX0_BINDING 4
#define AUX1_BINDING 5
#define QBITS pc.qbits
#define QGROUP pc.qgroup
#define QFLAGS pc.qflags
#include "weights.glsl"

#include "linear_out.glsl"

layout(binding = 0) readonly buffer A_ { float a[]; };
#ifdef MOE
layout(binding = 6) readonly buffer Moe_ { uint moe[]; };
#endif


#ifdef SKINNY
const uint BM = 32, BN = 128, BK = 32;
#else
const uint BM = 64, BN = 64, BK = 32;
#endif
const uint TX = BN / 4u;           // threads along n (4 outputs each); 256 / TX along m
const uint AE = BM * BK / 256u;    // elements of A each thread loads per k step
const uint WU = BN / 64u;          // 8-element units of W each thread loads per k step
shared vec4 As[BK][BM / 4];   // As[k][m/4]: A tile, transposed
shared vec4 Ws[BK][BN / 4];   // Ws[k][n/4]: W tile, transposed

void main() {
    uint tid = gl_LocalInvocationID.x;
    bool part = (pc.flags & 64u) != 0u;
    uint kb = part ? gl_WorkGroupID.z * pc.k_split : 0u, ke = part ? min(pc.K, kb + pc.k_split) : pc.K;
    uint tx = tid % TX, ty = tid / TX;
    uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
#ifdef MOE
    uint tile = gl_WorkGroupID.y;
    if (tile >= moe[0]) return;
    uint expert = moe[4u + 4u * tile], first = moe[5u + 4u * tile], tile_rows = moe[6u + 4u * tile];
    if (expert < pc.e0 || expert >= pc.e0 + pc.n_exp) return; // another chunk's expert
    uint wbase = (expert - pc.e0) * pc.N;
    m0 = 0u;
#else
    const uint wbase = 0u;
#endif
    vec4 acc[4];
    for (uint i = 0; i < 4u; i++) acc[i] = vec4(0.0);

    // loaders: each thread brings WU 8-element units of W (rows wn + 64 u, k offset wk) and
    // AE elements of A (row am, k offset ak)
    uint wn = tid / 4u, wk = (tid % 4u) * 8u;
    uint am = tid / (BK / AE), ak = (tid % (BK / AE)) * AE;
    for (uint k0 = kb; k0 < ke; k0 += BK) {
        for (uint u = 0; u < WU; u++) {
            uint wr = wn + 64u * u;
            vec4 lo = vec4(0.0), hi = vec4(0.0);
            if (n0 + wr < pc.N) w_get8_any(wbase + n0 + wr, k0 + wk, pc.K, lo, hi);
            float wv[8] = float[8](lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
            for (uint i = 0; i < 8u; i++) Ws[wk + i][wr / 4u][wr % 4u] = wv[i];
        }
#ifdef MOE
        bool arow_ok = am < tile_rows;
        uint arow = pc.a_row0 + (arow_ok ? moe[pc.order_off + first + am] / pc.a_div : 0u);
#else
        bool arow_ok = m0 + am < pc.M;
        uint arow = pc.a_row0 + m0 + am;
#endif
        for (uint i = 0; i < AE; i++) {
            uint k = k0 + ak + i;
            As[ak + i][am / 4u][am % 4u] = (arow_ok && k < ke) ? a[arow * pc.K + k] : 0.0;
        }
        barrier();
        for (uint k = 0; k < BK; k++) {
            vec4 av4 = As[k][ty];
            vec4 bv4 = Ws[k][tx];
            acc[0] += av4.x * bv4;
            acc[1] += av4.y * bv4;
            acc[2] += av4.z * bv4;
            acc[3] += av4.w * bv4;
        }
        barrier();
    }
    for (uint i = 0; i < 4u; i++) {
        uint m = m0 + ty * 4u + i;
#ifdef MOE
        if (m >= tile_rows) break;
        m = moe[pc.order_off + first + m]; // the pair's own row of C
#else
        if (m >= pc.M) break;
#endif
        for (uint j = 0; j < 4u; j++) {
            uint n = n0 + tx * 4u + j;
            if (n >= pc.N) break;
            if (part) c[(gl_WorkGroupID.z * pc.M + m) * pc.N + n] = acc[i][j];
            else store(n, m, acc[i][j]);
        }
    }
}
