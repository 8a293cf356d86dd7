#version 450
// matvec: C[m, c_col0 + n] (+)= sum_k A[a_row0 + m, k] * W[n, k] (+ bias[bias_off + n])
// for a few rows of A (M <= 8): the decode step. Memory bound: every weight is read once,
// eight consecutive elements at a time, and reduced across the workgroup.
// Bindings: 0 A [*, K] f32 | 1 W chunk [N, K] (format per build) | 2 C [*, ldc] f32
//           3 bias f32 | 4, 5 MLX scales and biases (f16/bf16), unused by other formats
// Workgroup: WG threads (spec constant 0) for ROWS (spec constant 1) rows of W.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint ROWS = 1;

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
layout(binding = 0) readonly buffer A4_ { vec4 a4[]; };
layout(binding = 2) buffer C_ { float c[]; };
layout(binding = 3) readonly buffer Bias_ { float bias[]; };


const uint MAX_M = 8;
const uint MAX_ROWS = 4;
shared float red[MAX_M * MAX_ROWS][WG];

void main() {
    uint tid = gl_LocalInvocationID.x;
    // the grid may be 2-D when N / ROWS exceeds the 65535 groups of one dimension
    uint row0 = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * ROWS;
    if (row0 >= pc.N) return;
    float acc[MAX_M * MAX_ROWS];
    for (uint i = 0; i < MAX_M * MAX_ROWS; i++) acc[i] = 0.0;
    bool vec_a = (pc.K & 7u) == 0u;
    for (uint r = 0; r < ROWS; r++) {
        uint row = row0 + r;
        if (row >= pc.N) break;
        for (uint k = tid * 8u; k < pc.K; k += WG * 8u) {
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
                acc[m * MAX_ROWS + r] += dot(wlo, alo) + dot(whi, ahi);
            }
        }
    }
    for (uint m = 0; m < pc.M; m++)
        for (uint r = 0; r < ROWS; r++) red[m * MAX_ROWS + r][tid] = acc[m * MAX_ROWS + r];
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (tid < s)
            for (uint m = 0; m < pc.M; m++)
                for (uint r = 0; r < ROWS; r++) red[m * MAX_ROWS + r][tid] += red[m * MAX_ROWS + r][tid + s];
        barrier();
    }
    // one thread per (m, r) output
    uint m = tid / ROWS, r = tid % ROWS;
    if (m < pc.M && row0 + r < pc.N) {
        uint n = row0 + r;
        float v = red[m * MAX_ROWS + r][0];
        if ((pc.flags & 1u) != 0u) v += bias[pc.bias_off + n];
        if ((pc.flags & 4u) != 0u) v = safe_tanh(v / pc.softcap) * pc.softcap;
        uint ci = m * pc.ldc + pc.c_col0 + n;
        if ((pc.flags & 2u) != 0u) v += c[ci];
        c[ci] = v;
    }
}
