#version 450
// act_f16: rows of activations rounded to f16, the A operand of matmul_cm (the tensor cores'
// products read their A tile as f16; reading it as f32 and converting in each workgroup made
// every tile's loads twice as long: the 8B shape's 512 x 4096 -> 28672 Q4_0 product took 1.19
// ms with f32 A against 0.87 ms with f16, bench/RESULTS.md).
//   out[i] = f16(clamp(A[a_row0 * K + i], -65504, 65504)),  i < M K  (M rows of K, K % 8 == 0)
// Each thread converts 8 values: two vec4 loads, one 16-byte store. The rounding is the one
// matmul_cm applied to f32 A before (to nearest even), so the products are unchanged.
// Bindings: 0 A f32 [*, K] | 1 out f16 [M, K] (packed in uvec4)
// ROW_SCALE (act_f16_scaled): training's output gradients for matmul_cm's BACK build, each row
// by a power of two that puts its largest magnitude in [2^14, 2^15): a gradient's values lie
// far below f16's normal range (6.1e-5; the head's are softmax differences over the tokens),
// where rounding them as they are would keep a few bits or none. One workgroup a row m < M:
//   amax = max |A[m ld + col0 + i]| = f 2^e (f in [0.5, 1)),  i < width  (any ld, col0)
//   out[m, i] = f16(A[m ld + col0 + i] 2^(15 - e)) (i < width; 0 up to K, width rounded up to 8),
//   inv[m] = 2^(e - 15)   (a zero row: e = 15)
// e is held to [-100, 100] (a row under 2^-100 is zero to the product anyway).
// Bindings: 0 A f32 | 1 out f16 [M, K] (two a word) | 2 inv f32 [M]
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 256) in;

// push constants: forge__pc_act_f16 (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC {
    uint K, a_row0, M;
    uint ld, col0;    // ROW_SCALE: A's row stride and first column (floats),
    uint width;       // and the values a row (K: width rounded up to 8)
} pc;

#define FORGE_F16_TYPES 1
#include "common.glsl"

#ifdef ROW_SCALE
layout(binding = 0) readonly buffer A_ { float a[]; };
layout(binding = 1) writeonly buffer O_ { uint o2[]; };
layout(binding = 2) writeonly buffer S_ { float inv[]; };
shared float amax_s[256];

void main() {
    uint m = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x, t = gl_LocalInvocationID.x;
    if (m >= pc.M) return; // (the whole workgroup)
    uint base = m * pc.ld + pc.col0;
    float amax = 0.0;
    for (uint i = t; i < pc.width; i += 256u) amax = max(amax, abs(a[base + i]));
    amax_s[t] = amax;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (t < s) amax_s[t] = max(amax_s[t], amax_s[t + s]);
        barrier();
    }
    amax = amax_s[0];
    int e = 15;
    if (amax > 0.0) frexp(amax, e);
    e = clamp(e, -100, 100);
    ivec2 up = ivec2(15 - e);
    uint row = m * (pc.K >> 1);
    for (uint i = t; 2u * i < pc.K; i += 256u) {
        uint k = 2u * i;
        vec2 v = vec2(k < pc.width ? a[base + k] : 0.0, k + 1u < pc.width ? a[base + k + 1u] : 0.0);
        o2[row + i] = packFloat2x16(f16vec2(ldexp(v, up)));
    }
    if (t == 0u) inv[m] = ldexp(1.0, e - 15);
}
#else
layout(binding = 0) readonly buffer A4_ { vec4 a4[]; };
layout(binding = 1) writeonly buffer O_ { uvec4 o8[]; };

void main() {
    uint t = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 256u;
    if (t >= pc.M * (pc.K >> 3)) return;
    uint base4 = pc.a_row0 * (pc.K >> 2) + 2u * t;
    o8[t] = uvec4(to_f16(a4[base4]), to_f16(a4[base4 + 1u]));
}
#endif
