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
#extension GL_GOOGLE_include_directive : require
#include "matmul_back_common.glsl"

const uint BM = 64, BK = 64, BN = 32;
shared vec4 Ys[BN][BM / 4];   // Ys[n][m/4]: dY tile, transposed
shared vec4 Ws[BN][BK / 4];   // Ws[n][k/4]: W tile

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint tx = tid % 16u, ty = tid / 16u;   // tx: k block, ty: m block
    uint m0 = gl_WorkGroupID.y * BM, k0 = gl_WorkGroupID.x * BK;
    vec4 acc[4];
    for (uint i = 0; i < 4u; i++) acc[i] = vec4(0.0);
    // loaders: W row wn (of 32), 8 elements from column wk; dY row ym (of 64), 8 columns from yn
    uint wn = tid / 8u, wk = (tid % 8u) * 8u;
    uint ym = tid / 4u, yn = (tid % 4u) * 8u;
    for (uint n0 = 0; n0 < pc.N; n0 += BN) {
        vec4 lo = vec4(0.0), hi = vec4(0.0);
        if (n0 + wn < pc.N && k0 + wk < pc.K) w_get8_any(n0 + wn, k0 + wk, pc.K, lo, hi);
        Ws[wn][wk / 4u] = lo;
        Ws[wn][wk / 4u + 1u] = hi;
        uint m = m0 + ym;
        for (uint i = 0; i < 8u; i++) {
            uint n = n0 + yn + i;
            Ys[yn + i][ym / 4u][ym % 4u] = (m < pc.M && n < pc.N) ? dy[m * pc.ldy + pc.y_col0 + n] : 0.0;
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
        if (m >= pc.M) break;
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
