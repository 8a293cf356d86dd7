#version 450
// matmul_big: C[m, c_col0 + n] (+)= sum_k A[a_row0 + m, k] * W[n, k] (+ bias[bias_off + n])
// for many rows of A: the prefill, where the product is large enough to fill the device with
// 128 x 128 tiles (matmul.comp takes 64 x 64 otherwise). k steps by 16 through shared memory;
// 256 threads, each computing an 8 x 8 block of C (8 FMAs per value loaded from shared
// memory, twice matmul.comp's).
// Bindings: 0 A [*, K] f32 | 1 W chunk [N, K] (format per build) | 2 C [*, ldc] f32
//           3 bias f32 | 4, 5 MLX scales and biases (f16/bf16), unused by other formats
// flags: 1 add bias, 2 accumulate into C (residual), 4 soft-cap tanh(v / cap) * cap.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
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

layout(binding = 0) readonly buffer A_ { float a[]; };
layout(binding = 2) buffer C_ { float c[]; };
layout(binding = 3) readonly buffer Bias_ { float bias[]; };


const uint BM = 128, BN = 128, BK = 16;
shared vec4 As[BK][BM / 4];   // As[k][m/4]: A tile, transposed
shared vec4 Ws[BK][BN / 4];   // Ws[k][n/4]: W tile, transposed

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint tx = tid % 16u, ty = tid / 16u;            // this thread's 8 x 8 block: rows ty*8.., cols tx*8..
    uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
    // 64 accumulators as 16 named-by-constant vec4s (every index below is an unrolled constant,
    // so they stay in registers)
    vec4 c0[8], c1[8];
    [[unroll]] for (uint i = 0; i < 8u; i++) { c0[i] = vec4(0.0); c1[i] = vec4(0.0); }

    // loaders: each thread brings one 8-element unit of W (row wn, k offset wk) and
    // 8 elements of A (row am, k offset ak) per step of BK
    uint wn = tid / 2u, wk = (tid % 2u) * 8u;
    uint am = tid / 2u, ak = (tid % 2u) * 8u;
    for (uint k0 = 0; k0 < pc.K; k0 += BK) {
        vec4 lo = vec4(0.0), hi = vec4(0.0);
        if (n0 + wn < pc.N) w_get8_any(n0 + wn, k0 + wk, pc.K, lo, hi);
        vec4 alo = vec4(0.0), ahi = vec4(0.0);
        uint arow = pc.a_row0 + m0 + am;
        if (m0 + am < pc.M) {
            [[unroll]] for (uint i = 0; i < 4u; i++) {
                uint k = k0 + ak + i;
                alo[i] = k < pc.K ? a[arow * pc.K + k] : 0.0;
                uint k2 = k + 4u;
                ahi[i] = k2 < pc.K ? a[arow * pc.K + k2] : 0.0;
            }
        }
        [[unroll]] for (uint i = 0; i < 4u; i++) {
            Ws[wk + i][wn / 4u][wn % 4u] = lo[i];
            Ws[wk + 4u + i][wn / 4u][wn % 4u] = hi[i];
            As[ak + i][am / 4u][am % 4u] = alo[i];
            As[ak + 4u + i][am / 4u][am % 4u] = ahi[i];
        }
        barrier();
        [[unroll]] for (uint k = 0; k < BK; k++) {
            vec4 a0 = As[k][2u * ty], a1 = As[k][2u * ty + 1u];
            vec4 b0 = Ws[k][2u * tx], b1 = Ws[k][2u * tx + 1u];
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
            uint n = n0 + tx * 8u + j;
            if (m < pc.M && n < pc.N) {
                float v = j < 4u ? c0[i][j] : c1[i][j - 4u];
                if ((pc.flags & 1u) != 0u) v += bias[pc.bias_off + n];
                if ((pc.flags & 4u) != 0u) v = safe_tanh(v / pc.softcap) * pc.softcap;
                uint ci = m * pc.ldc + pc.c_col0 + n;
                if ((pc.flags & 2u) != 0u) v += c[ci];
                c[ci] = v;
            }
        }
    }
}
