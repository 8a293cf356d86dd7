#version 450
// matmul_back_big: matmul_back.comp (dX = dY . W through a frozen weight of any format) for
// products large enough to fill the device with 128 x 128 tiles, as matmul_big.comp is to
// matmul.comp: C[m, c_col0 + k] (+)= sum_n dY[m, y_col0 + n] * W[n, k]. n steps by 16 through
// shared memory; 256 threads, each computing an 8 x 8 block of C.
// Bindings: 0 dY f32 [*, ldy] | 1 W chunk [N, K] (format per build) | 2 C f32 [*, ldc] (in/out)
//           3, 4 MLX scales and biases, unused by other formats
// flags: 1 accumulate into C.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "matmul_back_common.glsl"

const uint BM = 128, BK = 128, BN = 16;
shared vec4 Ys[BN][BM / 4];   // Ys[n][m/4]: dY tile, transposed
shared vec4 Ws[BN][BK / 4];   // Ws[n][k/4]: W tile

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint tx = tid % 16u, ty = tid / 16u;            // this thread's 8 x 8 block: rows ty*8.., columns tx*8..
    uint m0 = gl_WorkGroupID.y * BM, k0 = gl_WorkGroupID.x * BK;
    vec4 c0[8], c1[8];
    [[unroll]] for (uint i = 0; i < 8u; i++) { c0[i] = vec4(0.0); c1[i] = vec4(0.0); }
    // loaders: W row wn (of 16), 8 elements from column wk; dY row ym (of 128), 8 columns from yn
    uint wn = tid / 16u, wk = (tid % 16u) * 8u;
    uint ym = tid / 2u, yn = (tid % 2u) * 8u;
    for (uint n0 = 0; n0 < pc.N; n0 += BN) {
        vec4 lo = vec4(0.0), hi = vec4(0.0);
        if (n0 + wn < pc.N && k0 + wk < pc.K) w_get8_any(n0 + wn, k0 + wk, pc.K, lo, hi);
        Ws[wn][wk / 4u] = lo;
        Ws[wn][wk / 4u + 1u] = hi;
        uint m = m0 + ym;
        [[unroll]] for (uint i = 0; i < 8u; i++) {
            uint n = n0 + yn + i;
            Ys[yn + i][ym / 4u][ym % 4u] = (m < pc.M && n < pc.N) ? dy[m * pc.ldy + pc.y_col0 + n] : 0.0;
        }
        barrier();
        [[unroll]] for (uint n = 0; n < BN; n++) {
            vec4 a0 = Ys[n][2u * ty], a1 = Ys[n][2u * ty + 1u];
            vec4 b0 = Ws[n][2u * tx], b1 = Ws[n][2u * tx + 1u];
            c0[0] += a0.x * b0; c1[0] += a0.x * b1;
            c0[1] += a0.y * b0; c1[1] += a0.y * b1;
            c0[2] += a0.z * b0; c1[2] += a0.z * b1;
            c0[3] += a0.w * b0; c1[3] += a0.w * b1;
            c0[4] += a1.x * b0; c1[4] += a1.x * b1;
            c0[5] += a1.y * b0; c1[5] += a1.y * b1;
            c0[6] += a1.z * b0; c1[6] += a1.z * b1;
            c0[7] += a1.w * b0; c1[7] += a1.w * b1;
        }
        barrier();
    }
    [[unroll]] for (uint i = 0; i < 8u; i++) {
        uint m = m0 + ty * 8u + i;
        [[unroll]] for (uint j = 0; j < 8u; j++) {
            uint k = k0 + tx * 8u + j;
            if (m < pc.M && k < pc.K) {
                float v = j < 4u ? c0[i][j] : c1[i][j - 4u];
                uint ci = m * pc.ldc + pc.c_col0 + k;
                if ((pc.flags & 1u) != 0u) v += c[ci];
                c[ci] = v;
            }
        }
    }
}
