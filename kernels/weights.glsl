// weights.glsl: reading rows of a weight matrix chunk, one storage format per build.
// The including kernel defines W_BINDING (and AUX0_BINDING, AUX1_BINDING) and one of
// W_F32, W_F16, W_BF16. A chunk holds `rows` rows of K elements, row-major, starting at
// element 0 of the binding.
//
//   float w_get(row, k, K)            one element
//   void  w_get8(row, k, K, lo, hi)   elements k..k+7 (k a multiple of 8, K % 8 == 0)

#if defined(W_F32)
layout(binding = W_BINDING) readonly buffer WeightF32 { float w_f32[]; };
layout(binding = W_BINDING) readonly buffer WeightV4 { vec4 w_v4[]; };
float w_get(uint row, uint k, uint K) { return w_f32[row * K + k]; }
void w_get8(uint row, uint k, uint K, out vec4 lo, out vec4 hi) {
    uint i = (row * K + k) >> 2;
    lo = w_v4[i];
    hi = w_v4[i + 1];
}
#elif defined(W_F16)
layout(binding = W_BINDING) readonly buffer WeightU32 { uint w_u32[]; };
layout(binding = W_BINDING) readonly buffer WeightU4 { uvec4 w_u4[]; };
float w_get(uint row, uint k, uint K) {
    uint e = row * K + k;
    vec2 p = unpackHalf2x16(w_u32[e >> 1]);
    return (e & 1u) != 0u ? p.y : p.x;
}
void w_get8(uint row, uint k, uint K, out vec4 lo, out vec4 hi) {
    uvec4 u = w_u4[(row * K + k) >> 3];
    lo = vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y));
    hi = vec4(unpackHalf2x16(u.z), unpackHalf2x16(u.w));
}
#elif defined(W_BF16)
layout(binding = W_BINDING) readonly buffer WeightU32 { uint w_u32[]; };
layout(binding = W_BINDING) readonly buffer WeightU4 { uvec4 w_u4[]; };
float w_get(uint row, uint k, uint K) {
    uint e = row * K + k;
    uint w = w_u32[e >> 1];
    return (e & 1u) != 0u ? bf16_hi(w) : bf16_lo(w);
}
void w_get8(uint row, uint k, uint K, out vec4 lo, out vec4 hi) {
    uvec4 u = w_u4[(row * K + k) >> 3];
    lo = vec4(bf16_lo(u.x), bf16_hi(u.x), bf16_lo(u.y), bf16_hi(u.y));
    hi = vec4(bf16_lo(u.z), bf16_hi(u.z), bf16_lo(u.w), bf16_hi(u.w));
}
#else
#error "define one weight format"
#endif

// Eight elements starting at k, zero past K; takes the vector path when it can.
void w_get8_any(uint row, uint k, uint K, out vec4 lo, out vec4 hi) {
    if ((K & 7u) == 0u && k + 8u <= K) {
        w_get8(row, k, K, lo, hi);
    } else {
        float v[8];
        for (uint i = 0u; i < 8u; i++) v[i] = k + i < K ? w_get(row, k + i, K) : 0.0;
        lo = vec4(v[0], v[1], v[2], v[3]);
        hi = vec4(v[4], v[5], v[6], v[7]);
    }
}
