#version 450
// matmul_cm: the prefill (and training) product on tensor cores (VK_NV_cooperative_matrix,
// fp16 x fp16 + fp32):
//   C[m, c_col0 + n] (+)= sum_k A[a_row0 + m, k] * W[n, k] (+ bias[bias_off + n])
// Tiles of 128 (m) x 128 (n), k in steps of 64: A rounded to f16 (clamped to its range) and W
// dequantized to f16 go through shared memory; each of the 8 subgroups multiplies a 64 x 32
// part as 4 x 2 fragments of 16 x 16 with f32 accumulators; the next step's values are read
// from memory into registers while the tensor cores work on the current one. The epilogue
// (bias, soft-cap, residual) runs on the f32 results, one fragment at a time through a
// per-subgroup scratch.
// Needs subgroups of 32 (checked by the host).
// Bindings: 0 A [*, K] f32 | 1 W chunk [N, K] (format per build) | 2 C [*, ldc] f32
//           3 bias f32 | 4, 5 MLX scales and biases, unused by other formats
#extension GL_GOOGLE_include_directive : require
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;

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

const uint BM = 128, BN = 128, BK = 64, LDS = BK + 8; // padded row stride (halves): 144 bytes
const uint LDS4 = LDS / 4u;          // the same in units of 4 halves
shared uvec2 As[BM * LDS4];          // A tile, row-major [m][k], 4 halves per element
shared uvec2 Ws[BN * LDS4];          // W tile, row-major [n][k] = B column-major
// the epilogue reuses As: each subgroup's 16 x 16 f32 fragment, two floats per element

// four values rounded to f16 (clamped to its range), packed in two words
uvec2 to_f16(vec4 x) {
    f16vec4 h = f16vec4(clamp(x, vec4(-65504.0), vec4(65504.0)));
    return uvec2(packFloat2x16(h.xy), packFloat2x16(h.zw));
}

uint tid_() { return gl_LocalInvocationID.x; }

// this thread's share of the next k step, brought to registers while the tensor cores work
// on the current one: 8 x 4 values of A (rows tid / 16 + 16 r, columns 4 (tid % 16)) and 4 x 8
// of W (rows tid / 8 + 32 r, columns 8 (tid % 8))
vec4 ra[8], rw[8];

void fetch(uint m0, uint n0, uint k0, bool vec_a) {
    [[unroll]] for (uint r = 0; r < 8u; r++) {
        uint mm = tid_() / 16u + 16u * r, kk = (tid_() % 16u) * 4u, m = m0 + mm, k = k0 + kk;
        vec4 v = vec4(0.0);
        if (m < pc.M && k < pc.K) {
            uint ab = (pc.a_row0 + m) * pc.K + k;
            if (vec_a && k + 4u <= pc.K) v = a4[ab >> 2];
            else for (uint i = 0; i < 4u; i++) v[i] = k + i < pc.K ? a[ab + i] : 0.0;
        }
        ra[r] = v;
    }
    [[unroll]] for (uint r = 0; r < 4u; r++) {
        uint nn = tid_() / 8u + 32u * r, kk = (tid_() % 8u) * 8u;
        vec4 lo = vec4(0.0), hi = vec4(0.0);
        if (n0 + nn < pc.N && k0 + kk < pc.K) w_get8_any(n0 + nn, k0 + kk, pc.K, lo, hi);
        rw[2u * r] = lo;
        rw[2u * r + 1u] = hi;
    }
}

void stash() {
    [[unroll]] for (uint r = 0; r < 8u; r++) As[(tid_() / 16u + 16u * r) * LDS4 + tid_() % 16u] = to_f16(ra[r]);
    [[unroll]] for (uint r = 0; r < 4u; r++) {
        uint row = (tid_() / 8u + 32u * r) * LDS4 + (tid_() % 8u) * 2u;
        Ws[row] = to_f16(rw[2u * r]);
        Ws[row + 1u] = to_f16(rw[2u * r + 1u]);
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x, warp = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
    uint wm = (warp / 4u) * 64u, wn = (warp % 4u) * 32u; // this subgroup's part
    bool vec_a = (pc.K & 3u) == 0u;
    fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[4][2];
    [[unroll]] for (uint i = 0; i < 4u; i++)
        [[unroll]] for (uint j = 0; j < 2u; j++) acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
    fetch(m0, n0, 0u, vec_a);
    stash();
    barrier();
    for (uint k0 = 0; k0 < pc.K; k0 += BK) {
        bool more = k0 + BK < pc.K;
        if (more) fetch(m0, n0, k0 + BK, vec_a); /* in flight during the products below */
        [[unroll]] for (uint ks = 0; ks < BK; ks += 16u) {
            fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> fa[4], fb[2];
            [[unroll]] for (uint i = 0; i < 4u; i++) coopMatLoadNV(fa[i], As, (wm + 16u * i) * LDS4 + ks / 4u, LDS4, false);
            [[unroll]] for (uint j = 0; j < 2u; j++) coopMatLoadNV(fb[j], Ws, (wn + 16u * j) * LDS4 + ks / 4u, LDS4, true);
            [[unroll]] for (uint i = 0; i < 4u; i++)
                [[unroll]] for (uint j = 0; j < 2u; j++) acc[i][j] = coopMatMulAddNV(fa[i], fb[j], acc[i][j]);
        }
        barrier();
        if (more) {
            stash();
            barrier();
        }
    }
    [[unroll]] for (uint i = 0; i < 4u; i++)
        [[unroll]] for (uint j = 0; j < 2u; j++) {
            coopMatStoreNV(acc[i][j], As, warp * 128u, 8u, false); /* the loop ended with a barrier: As is free */
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            for (uint e = lane; e < 256u; e += 32u) {
                uint m = m0 + wm + 16u * i + e / 16u, n = n0 + wn + 16u * j + e % 16u;
                if (m >= pc.M || n >= pc.N) continue;
                uvec2 pair = As[warp * 128u + e / 2u];
                float v = uintBitsToFloat((e & 1u) != 0u ? pair.y : pair.x);
                if ((pc.flags & 1u) != 0u) v += bias[pc.bias_off + n];
                if ((pc.flags & 4u) != 0u) v = safe_tanh(v / pc.softcap) * pc.softcap;
                uint ci = m * pc.ldc + pc.c_col0 + n;
                if ((pc.flags & 2u) != 0u) v += c[ci];
                c[ci] = v;
            }
            subgroupBarrier();
        }
}
