#version 450
// matvec_sg: the decode matrix-vector product with subgroup reductions.
//   C[m, c_col0 + n] (+)= sum_k A'[m, k] * W[n, k] (+ bias[bias_off + n]),  m < M <= 8
// where A' is row a_row0 + m of A, or with PRENORM that row RMS-normalized and scaled by
// g (the block's norm fused in: sum_k W x g / rms(x), both sums taken in the same pass).
// GATED: W holds gate and up rows interleaved (row 2j = gate j, row 2j + 1 = up j) and the
// output j is act(gate . a) * (up . a), the MLP's middle fused in (N counts outputs).
// A workgroup owns ROWS consecutive outputs; each subgroup takes R of them at a time, each
// lane reading 8 consecutive elements of A once and of each of the R rows (R loads in
// flight, A reused from registers), the subgroup summing with subgroupAdd: no shared memory,
// no barriers. Correct for any subgroup size.
// Bindings: 0 A [*, K] f32 | 1 W chunk [rows, K] (format per build) | 2 C [*, ldc] f32
//           3 bias f32 | 4, 5 MLX scales and biases | 6 g f32 [K] (PRENORM)
// flags: 1 bias, 2 accumulate into C, 4 soft-cap, 8 PRENORM, 16 GATED (act in bit 5: 0 SiLU, 1 GELU-tanh)
// Spec constants: 0 = workgroup size, 1 = ROWS per workgroup, 2 = R (pinned by the host).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 16;
layout(constant_id = 2) const uint R = 2;

layout(push_constant) uniform PC {
    uint M, K, N, a_row0, ldc, c_col0, flags, bias_off;
    float softcap;
    uint qbits, qgroup, qflags;   // MLX affine: bits, group size, 1 = bf16 scales
    float eps;                    // PRENORM
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
layout(binding = 6) readonly buffer G_ { float g[]; };
layout(binding = 6) readonly buffer G4_ { vec4 g4[]; };

const uint MAX_M = 8;

// 8 elements of A' row m at k (zero past K); ss += their squares before the norm weight
void a8(uint m, uint k, bool vec_a, bool prenorm, out vec4 lo, out vec4 hi, inout float ss) {
    uint ab = (pc.a_row0 + m) * pc.K + k;
    if (vec_a) {
        lo = a4[ab >> 2];
        hi = a4[(ab >> 2) + 1u];
        if (prenorm) {
            ss += dot(lo, lo) + dot(hi, hi);
            lo *= g4[k >> 2];
            hi *= g4[(k >> 2) + 1u];
        }
    } else {
        float v[8];
        for (uint i = 0; i < 8u; i++) {
            float x = k + i < pc.K ? a[ab + i] : 0.0;
            if (prenorm && k + i < pc.K) {
                ss += x * x;
                x *= g[k + i];
            }
            v[i] = x;
        }
        lo = vec4(v[0], v[1], v[2], v[3]);
        hi = vec4(v[4], v[5], v[6], v[7]);
    }
}

float act(float x) {
    if ((pc.flags & 32u) == 0u) return x / (1.0 + exp(-x));
    const float k = 0.7978845608028654; // sqrt(2 / pi)
    return 0.5 * x * (1.0 + safe_tanh(k * (x + 0.044715 * x * x * x)));
}

const uint MAX_R = 4;

void main() {
    uint lane = gl_SubgroupInvocationID, width = gl_SubgroupSize;
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    bool vec_a = (pc.K & 7u) == 0u, prenorm = (pc.flags & 8u) != 0u, gated = (pc.flags & 16u) != 0u;
    uint rows_w = gated ? 2u : 1u; // weight rows per output
    for (uint r0 = gl_SubgroupID * R; r0 < ROWS; r0 += gl_NumSubgroups * R) {
        uint out0 = wg * ROWS + r0;
        if (out0 >= pc.N) break; // uniform across the subgroup
        uint nr = min(R, pc.N - out0);
        float acc[MAX_M * MAX_R * 2], ss[MAX_M];
        for (uint i = 0; i < MAX_M * MAX_R * 2; i++) acc[i] = 0.0;
        for (uint m = 0; m < MAX_M; m++) ss[m] = 0.0;
        for (uint k = lane * 8u; k < pc.K; k += width * 8u) {
            vec4 wlo[MAX_R * 2], whi[MAX_R * 2];
            for (uint j = 0; j < R * rows_w; j++) { // all weight loads first: they are independent
                if (j < nr * rows_w) w_get8_any(out0 * rows_w + j, k, pc.K, wlo[j], whi[j]);
                else { wlo[j] = vec4(0.0); whi[j] = vec4(0.0); }
            }
            for (uint m = 0; m < pc.M; m++) {
                vec4 alo, ahi;
                a8(m, k, vec_a, prenorm, alo, ahi, ss[m]);
                for (uint j = 0; j < R * rows_w; j++) acc[m * MAX_R * 2 + j] += dot(wlo[j], alo) + dot(whi[j], ahi);
            }
        }
        for (uint m = 0; m < pc.M; m++) {
            float inv = prenorm ? 1.0 / sqrt(subgroupAdd(ss[m]) / float(pc.K) + pc.eps) : 1.0;
            for (uint rr = 0; rr < nr; rr++) {
                float v = subgroupAdd(acc[m * MAX_R * 2 + rr * rows_w]) * inv;
                if (gated) v = act(v) * (subgroupAdd(acc[m * MAX_R * 2 + rr * 2u + 1u]) * inv);
                uint out_row = out0 + rr;
                if (lane == 0u) {
                    if ((pc.flags & 1u) != 0u) v += bias[pc.bias_off + out_row];
                    if ((pc.flags & 4u) != 0u) v = safe_tanh(v / pc.softcap) * pc.softcap;
                    uint ci = m * pc.ldc + pc.c_col0 + out_row;
                    if ((pc.flags & 2u) != 0u) v += c[ci];
                    c[ci] = v;
                }
            }
        }
    }
}
