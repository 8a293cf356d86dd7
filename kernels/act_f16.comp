#version 450
// act_f16: rows of activations rounded to f16, the A operand of matmul_cm (the tensor cores'
// products read their A tile as f16; reading it as f32 and converting in each workgroup made
// every tile's loads twice as long: the 8B shape's 512 x 4096 -> 28672 Q4_0 product took 1.19
// ms with f32 A against 0.87 ms with f16, bench/RESULTS.md).
//   out[i] = f16(clamp(A[a_row0 * K + i], -65504, 65504)),  i < M K  (M rows of K, K % 8 == 0)
// Each thread converts 8 values: two vec4 loads, one 16-byte store. The rounding is the one
// matmul_cm applied to f32 A before (to nearest even), so the products are unchanged.
// Bindings: 0 A f32 [*, K] | 1 out f16 [M, K] (packed in uvec4)
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 256) in;

// push constants: forge__pc_act_f16 (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC {
    uint K, a_row0, M;
} pc;

#define FORGE_F16_TYPES 1
#include "common.glsl"

layout(binding = 0) readonly buffer A4_ { vec4 a4[]; };
layout(binding = 1) writeonly buffer O_ { uvec4 o8[]; };

void main() {
    uint t = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 256u;
    if (t >= pc.M * (pc.K >> 3)) return;
    uint base4 = pc.a_row0 * (pc.K >> 2) + 2u * t;
    o8[t] = uvec4(to_f16(a4[base4]), to_f16(a4[base4 + 1u]));
}
