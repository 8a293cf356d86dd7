#version 450
// matmul_cm: the prefill product on tensor cores (VK_NV_cooperative_matrix, fp16 x fp16 + fp32).
//   C[m, c_col0 + n] (+)= sum_k A[a_row0 + m, k] * W[n, k] (+ bias[bias_off + n])
// Tiles of 64 (m) x 64 (n), k in steps of 64: A rounded to f16 (clamped to its range) and W
// dequantized to f16 go through shared memory; each of the 4 subgroups multiplies a 32 x 32
// quarter as 2 x 2 fragments of 16 x 16 with f32 accumulators; the epilogue (bias, soft-cap,
// residual) runs on the f32 results. Needs subgroups of 32 (checked by the host).
// Bindings: 0 A [*, K] f32 | 1 W chunk [N, K] (format per build) | 2 C [*, ldc] f32
//           3 bias f32 | 4, 5 MLX scales and biases, unused by other formats
#extension GL_GOOGLE_include_directive : require
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
layout(local_size_x = 128) in;

layout(push_constant) uniform PC {
    uint M, K, N, a_row0, ldc, c_col0, flags, bias_off;
    float softcap;
    uint qbits, qgroup, qflags;   // MLX affine: bits, group size, 1 = bf16 scales
    float eps;                    // (matvec_sg only)
} pc;

#include "common.glsl"
#define W_BINDING 1
#define AUX0_BINDING 4
#define AUX1_BINDING 5
#define QBITS pc.qbits
#define QGROUP pc.qgroup
#define QFLAGS pc.qflags
#include "weights.glsl"

layout(binding = 0) readonly buffer A_ { float a[]; };
layout(binding = 0) readonly buffer A4_ { vec4 a4[]; };
layout(binding = 2) buffer C_ { float c[]; };
layout(binding = 3) readonly buffer Bias_ { float bias[]; };

const uint BM = 64, BN = 64, BK = 64, LDS = BK + 8; // padded row stride (halves)
shared float16_t As[BM * LDS];      // A tile, row-major [m][k]
shared float16_t Ws[BN * LDS];      // W tile, row-major [n][k] = B column-major
shared float Cs[BM * BN];           // the results, for the epilogue

float16_t to_f16(float x) { return float16_t(clamp(x, -65504.0, 65504.0)); }

void main() {
    uint tid = gl_LocalInvocationID.x, warp = gl_SubgroupID;
    uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
    uint wm = (warp / 2u) * 32u, wn = (warp % 2u) * 32u; // this subgroup's quarter
    bool vec_a = (pc.K & 3u) == 0u;
    fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[2][2];
    for (uint i = 0; i < 2u; i++)
        for (uint j = 0; j < 2u; j++) acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
    for (uint k0 = 0; k0 < pc.K; k0 += BK) {
        // A: 64 x 64 values as 1024 vec4, 8 per thread; W: 64 rows x 8 units of 8, 4 units per thread
        for (uint e = tid; e < BM * BK / 4u; e += 128u) {
            uint mm = e / (BK / 4u), kk = (e % (BK / 4u)) * 4u, m = m0 + mm, k = k0 + kk;
            vec4 v = vec4(0.0);
            if (m < pc.M) {
                uint ab = (pc.a_row0 + m) * pc.K + k;
                if (vec_a && k + 4u <= pc.K) v = a4[ab >> 2];
                else for (uint i = 0; i < 4u; i++) v[i] = k + i < pc.K ? a[ab + i] : 0.0;
            }
            for (uint i = 0; i < 4u; i++) As[mm * LDS + kk + i] = to_f16(v[i]);
        }
        for (uint u = tid; u < BN * (BK / 8u); u += 128u) {
            uint nn = u / (BK / 8u), kk = (u % (BK / 8u)) * 8u;
            vec4 lo = vec4(0.0), hi = vec4(0.0);
            if (n0 + nn < pc.N) w_get8_any(n0 + nn, k0 + kk, pc.K, lo, hi);
            for (uint i = 0; i < 4u; i++) {
                Ws[nn * LDS + kk + i] = to_f16(lo[i]);
                Ws[nn * LDS + kk + 4u + i] = to_f16(hi[i]);
            }
        }
        barrier();
        for (uint ks = 0; ks < BK; ks += 16u) {
            fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> fa[2], fb[2];
            for (uint i = 0; i < 2u; i++) coopMatLoadNV(fa[i], As, (wm + 16u * i) * LDS + ks, LDS, false);
            for (uint j = 0; j < 2u; j++) coopMatLoadNV(fb[j], Ws, (wn + 16u * j) * LDS + ks, LDS, true);
            for (uint i = 0; i < 2u; i++)
                for (uint j = 0; j < 2u; j++) acc[i][j] = coopMatMulAddNV(fa[i], fb[j], acc[i][j]);
        }
        barrier();
    }
    for (uint i = 0; i < 2u; i++)
        for (uint j = 0; j < 2u; j++) coopMatStoreNV(acc[i][j], Cs, (wm + 16u * i) * BN + wn + 16u * j, BN, false);
    barrier();
    for (uint e = tid; e < BM * BN; e += 128u) {
        uint mm = e / BN, nn = e % BN, m = m0 + mm, n = n0 + nn;
        if (m >= pc.M || n >= pc.N) continue;
        float v = Cs[e];
        if ((pc.flags & 1u) != 0u) v += bias[pc.bias_off + n];
        if ((pc.flags & 4u) != 0u) v = safe_tanh(v / pc.softcap) * pc.softcap;
        uint ci = m * pc.ldc + pc.c_col0 + n;
        if ((pc.flags & 2u) != 0u) v += c[ci];
        c[ci] = v;
    }
}
