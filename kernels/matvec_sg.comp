#version 450
// matvec_sg: the decode matrix-vector product with subgroup reductions.
//   C[m, c_col0 + n] (+)= sum_k A[a_row0 + m, k] * W[n, k] (+ bias[bias_off + n]),  m < M <= 8
// A workgroup owns ROWS consecutive rows of W; its subgroups take them in turn, each lane
// reading 8 consecutive weights per step (coalesced across the subgroup) and the subgroup
// summing with subgroupAdd: no shared memory, no barriers. Correct for any subgroup size.
// Bindings: 0 A [*, K] f32 | 1 W chunk [N, K] (format per build) | 2 C [*, ldc] f32
//           3 bias f32 | 4, 5 MLX scales and biases (f16/bf16), unused by other formats
// Spec constants: 0 = workgroup size, 1 = ROWS per workgroup (pinned by the host).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 8;

layout(push_constant) uniform PC {
    uint M, K, N, a_row0, ldc, c_col0, flags, bias_off;
    float softcap;
    uint qbits, qgroup, qflags;   // MLX affine: bits, group size, 1 = bf16 scales
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

const uint MAX_M = 8;

void main() {
    uint lane = gl_SubgroupInvocationID, width = gl_SubgroupSize;
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    bool vec_a = (pc.K & 7u) == 0u;
    for (uint r = gl_SubgroupID; r < ROWS; r += gl_NumSubgroups) {
        uint row = wg * ROWS + r;
        if (row >= pc.N) break; // uniform across the subgroup
        float acc[MAX_M];
        for (uint m = 0; m < MAX_M; m++) acc[m] = 0.0;
        for (uint k = lane * 8u; k < pc.K; k += width * 8u) {
            vec4 wlo, whi;
            w_get8_any(row, k, pc.K, wlo, whi);
            for (uint m = 0; m < pc.M; m++) {
                uint ab = (pc.a_row0 + m) * pc.K + k;
                vec4 alo, ahi;
                if (vec_a) {
                    alo = a4[ab >> 2];
                    ahi = a4[(ab >> 2) + 1u];
                } else {
                    float v[8];
                    for (uint i = 0; i < 8u; i++) v[i] = k + i < pc.K ? a[ab + i] : 0.0;
                    alo = vec4(v[0], v[1], v[2], v[3]);
                    ahi = vec4(v[4], v[5], v[6], v[7]);
                }
                acc[m] += dot(wlo, alo) + dot(whi, ahi);
            }
        }
        for (uint m = 0; m < pc.M; m++) {
            float v = subgroupAdd(acc[m]);
            if (lane == 0u) {
                if ((pc.flags & 1u) != 0u) v += bias[pc.bias_off + row];
                if ((pc.flags & 4u) != 0u) v = safe_tanh(v / pc.softcap) * pc.softcap;
                uint ci = m * pc.ldc + pc.c_col0 + row;
                if ((pc.flags & 2u) != 0u) v += c[ci];
                c[ci] = v;
            }
        }
    }
}
