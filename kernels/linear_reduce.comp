#version 450
// linear_reduce: a product split along k (matmul.comp / matmul_cm.comp with flags 64) added up:
//   C[m, c_col0 + n] (+)= sum over z < splits of P[z, m, n] (+ bias[bias_off + n], soft-cap)
// in split order, then the products' epilogue (linear_out.glsl). Its own module: inside the
// tiled matmul modules this pass ran at their occupancy (their shared tiles and registers) and
// read a float a thread: 0.6 TB/s on the 8B shape's prefill (41 us for 2 x 512 x 4096 sums).
// Each thread adds 4 outputs of a row (N % 4 == 0, vec4 loads) or, else, one.
// Bindings: 0 P f32 [splits, M, N] | 2 C f32 [*, ldc] | 3 bias f32
// flags (forge__pc_linear's): 1 bias, 2 accumulate into C, 4 soft-cap; k_split = splits
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;

#include "pc_linear.glsl"

#include "common.glsl"
#include "linear_out.glsl"

layout(binding = 0) readonly buffer P_ { float p[]; };
layout(binding = 0) readonly buffer P4_ { vec4 p4[]; };

void main() {
    uint t = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 256u;
    uint MN = pc.M * pc.N;
    if ((pc.N & 3u) == 0u) {
        if (4u * t >= MN) return;
        vec4 v = vec4(0.0);
        for (uint z = 0; z < pc.k_split; z++) v += p4[(z * MN >> 2) + t];
        uint m = 4u * t / pc.N, n = 4u * t % pc.N;
        [[unroll]] for (uint i = 0; i < 4u; i++) store(n + i, m, v[i]);
        return;
    }
    if (t >= MN) return;
    float v = 0.0;
    for (uint z = 0; z < pc.k_split; z++) v += p[z * MN + t];
    store(t % pc.N, t / pc.N, v);
}
