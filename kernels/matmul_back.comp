#version 450
// matmul_back: the backward twin of matmul.comp through a frozen weight, dX = dY . W:
//   C[m, c_col0 + k] (+)= sum_n dY[m, y_col0 + n] * W[n, k]   for m < M, k < K, n < N
// where W is one row-chunk [N, K] of a weight stored in any format forge reads (dequantized
// on the way in, as in the forward kernels), and y_col0 the chunk's first row, so every chunk
// of a weight adds its share to the same C (the recorder puts a barrier between them).
// Tiles of 64 (m) x 64 (k), n in steps of 32 through shared memory; 256 threads, each
// computing a 4 x 4 block of C. W is read along its rows (8 consecutive k per load), which
// is how every block format is laid out.
// Bindings: 0 dY f32 [*, ldy] | 1 W chunk [N, K] (format per build) | 2 C f32 [*, ldc] (in/out)
//           3, 4 MLX scales and biases, unused by other formats
// flags: 1 accumulate into C.
// Built with MOE: the twin of matmul.comp's MOE build, a mixture-of-experts product's input
// gradient grouped by expert (training): W is a chunk of an expert weight (experts e0 ..
// e0 + n_exp - 1 of N rows each) and workgroup y is a tile of moe_group.comp's table (binding 5,
// the forward's); tile row m is pair p = order[first + m], whose dY row is p / y_div (y_div =
// top_k: the token's gradient, 1: the pair's own row), times the pair's weight from the route
// (binding 6) with flags 2, into C row p. Tiles of other chunks' experts exit.
#extension GL_GOOGLE_include_directive : require
#include "matmul_back_common.glsl"
#ifdef MOE
layout(binding = 5) readonly buffer Moe_ { uint moe[]; };
layout(binding = 6) readonly buffer Route_ { uvec2 route[]; };
#endif

const uint BM = 64, BK = 64, BN = 32;
shared vec4 Ys[BN][BM / 4];   // Ys[n][m/4]: dY tile, transposed
shared vec4 Ws[BN][BK / 4];   // Ws[n][k/4]: W tile

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint tx = tid % 16u, ty = tid / 16u;   // tx: k block, ty: m block
    uint m0 = gl_WorkGroupID.y * BM, k0 = gl_WorkGroupID.x * BK;
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
    // loaders: W row wn (of 32), 8 elements from column wk; dY row ym (of 64), 8 columns from yn
    uint wn = tid / 8u, wk = (tid % 8u) * 8u;
    uint ym = tid / 4u, yn = (tid % 4u) * 8u;
    for (uint n0 = 0; n0 < pc.N; n0 += BN) {
        vec4 lo = vec4(0.0), hi = vec4(0.0);
        if (n0 + wn < pc.N && k0 + wk < pc.K) w_get8_any(wbase + n0 + wn, k0 + wk, pc.K, lo, hi);
        Ws[wn][wk / 4u] = lo;
        Ws[wn][wk / 4u + 1u] = hi;
#ifdef MOE
        bool row_ok = ym < tile_rows;
        uint pair = row_ok ? moe[pc.order_off + first + ym] : 0u, m = pair / pc.y_div;
        float wy = (row_ok && (pc.flags & 2u) != 0u) ? uintBitsToFloat(route[pair].y) : 1.0;
#else
        uint m = m0 + ym;
        bool row_ok = m < pc.M;
        const float wy = 1.0;
#endif
        for (uint i = 0; i < 8u; i++) {
            uint n = n0 + yn + i;
            Ys[yn + i][ym / 4u][ym % 4u] = (row_ok && n < pc.N) ? wy * dy[m * pc.ldy + pc.y_col0 + n] : 0.0;
        }
        barrier();
        for (uint n = 0; n < BN; n++) {
            vec4 y4 = Ys[n][ty];
            vec4 w4 = Ws[n][tx];
            acc[0] += y4.x * w4;
            acc[1] += y4.y * w4;
            acc[2] += y4.z * w4;
            acc[3] += y4.w * w4;
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
            uint k = k0 + tx * 4u + j;
            if (k >= pc.K) break;
            uint ci = m * pc.ldc + pc.c_col0 + k;
            float v = acc[i][j];
            if ((pc.flags & 1u) != 0u) v += c[ci];
            c[ci] = v;
        }
    }
}
