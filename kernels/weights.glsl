// weights.glsl: reading rows of a weight matrix chunk, one storage format per build.
// The including kernel defines W_BINDING, and for formats with separate scales AUX0_BINDING
// and AUX1_BINDING, then one of W_F32, W_F16, W_BF16 (plain), W_Q4_0, W_Q8_0, W_Q4_K, W_Q6_K
// (llama.cpp's blocks, dequantized exactly as ggml does, in f32), W_MLX (MLX affine: a
// little-endian bit stream of `bits`-bit codes per row, w = scale * q + bias per group).
// A chunk holds `rows` rows of K elements, row-major, starting at byte 0 of the binding.
// The kernel's push constants provide QBITS, QGROUP, QFLAGS for W_MLX (QFLAGS bit 0: scales
// and biases are bf16, else f16).
//
//   float w_get(row, k, K)            one element
//   void  w_get8(row, k, K, lo, hi)   elements k..k+7 (k a multiple of 8; plain formats also
//                                     need K % 8 == 0; block formats have whole blocks)
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
#elif defined(W_Q4_0) || defined(W_Q8_0) || defined(W_Q4_K) || defined(W_Q6_K) || defined(W_MLX)
layout(binding = W_BINDING) readonly buffer WeightU32 { uint w_u32[]; };
#define W_BLOCK_FORMAT 1

// little-endian reads at a byte offset (the binding's size is a multiple of 4)
uint w_u32_at(uint off) {
    uint s = (off & 3u) * 8u, lo = w_u32[off >> 2];
    return s == 0u ? lo : (lo >> s) | (w_u32[(off >> 2) + 1u] << (32u - s));
}
uint w_byte(uint off) { return (w_u32[off >> 2] >> ((off & 3u) * 8u)) & 0xffu; }
float w_half(uint off) { return unpackHalf2x16((w_u32[off >> 2] >> ((off & 2u) * 8u)) & 0xffffu).x; }
int w_i8(uint off) { return int(w_byte(off) << 24) >> 24; }
// The 4 bytes of u as floats minus `bias`, without integer-to-float conversions (a quarter-
// rate instruction on NVIDIA, and 8 per 8 weights made the Q4_0/Q8_0 matrix-vector products
// compute-bound at a third of the bandwidth): 2^23 + b has b in its mantissa, so
// float(0x4B000000 | b) - 2^23 is b exactly, and the bias folds into that subtraction.
vec4 bytes_f(uint u, float bias) {
    return uintBitsToFloat(uvec4(u & 255u, (u >> 8) & 255u, (u >> 16) & 255u, u >> 24) | 0x4B000000u) - (8388608.0 + bias);
}
vec4 nib_lo(uint u) { return bytes_f(u & 0x0F0F0F0Fu, 0.0); }
vec4 nib_hi(uint u) { return bytes_f((u >> 4) & 0x0F0F0F0Fu, 0.0); }
vec4 i8x4(uint u) { return bytes_f(u ^ 0x80808080u, 128.0); } // int8 + 128 as unsigned, then - 128
// 8 bytes at a 2-byte aligned offset (the 18- and 34-byte blocks) as two words: 3 aligned
// loads and selects, no divergent branch (neighbouring blocks alternate alignment)
void w_u32x2_at2(uint off, out uint a, out uint b) {
    uint w = off >> 2, x0 = w_u32[w], x1 = w_u32[w + 1u];
    bool odd = (off & 2u) != 0u;
    uint x2 = odd ? w_u32[w + 2u] : 0u;   // not read when aligned: it may lie past the binding
    a = odd ? (x0 >> 16) | (x1 << 16) : x0;
    b = odd ? (x1 >> 16) | (x2 << 16) : x1;
}

#if defined(W_Q4_0)
// block of 32: f16 d, 16 bytes; element j < 16 is the low nibble of byte j, j >= 16 the high
// nibble of byte j - 16; x = d * (q - 8)
void w_get8(uint row, uint k, uint K, out vec4 lo, out vec4 hi) {
    uint bo = (row * (K >> 5) + (k >> 5)) * 18u, j = k & 31u;
    float d = w_half(bo);
    uint a, b;
    w_u32x2_at2(bo + 2u + (j & 15u), a, b);
    uint sh = j < 16u ? 0u : 4u;
    lo = d * bytes_f((a >> sh) & 0x0F0F0F0Fu, 8.0);
    hi = d * bytes_f((b >> sh) & 0x0F0F0F0Fu, 8.0);
}
// Elements k..k+7 (lo0, hi0) and k+16..k+23 (lo1, hi1), k & 31 = 0 or 8: the low and high
// nibbles of the same 8 bytes, so a lane loads d and the bytes once for 16 weights (half
// the load instructions of two w_get8; the matrix-vector kernels were bound by them).
#define W_PAIRED 1
void w_get8x2(uint row, uint k, uint K, out vec4 lo0, out vec4 hi0, out vec4 lo1, out vec4 hi1) {
    uint bo = (row * (K >> 5) + (k >> 5)) * 18u;
    float d = w_half(bo);
    uint a, b;
    w_u32x2_at2(bo + 2u + (k & 15u), a, b);
    lo0 = d * bytes_f(a & 0x0F0F0F0Fu, 8.0);
    hi0 = d * bytes_f(b & 0x0F0F0F0Fu, 8.0);
    lo1 = d * bytes_f((a >> 4) & 0x0F0F0F0Fu, 8.0);
    hi1 = d * bytes_f((b >> 4) & 0x0F0F0F0Fu, 8.0);
}
#elif defined(W_Q8_0)
// block of 32: f16 d, 32 int8; x = d * q
void w_get8(uint row, uint k, uint K, out vec4 lo, out vec4 hi) {
    uint bo = (row * (K >> 5) + (k >> 5)) * 34u, j = k & 31u;
    float d = w_half(bo);
    uint a, b;
    w_u32x2_at2(bo + 2u + j, a, b);
    lo = d * i8x4(a);
    hi = d * i8x4(b);
}
#elif defined(W_Q4_K)
// super-block of 256: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks
// of 32, 128 bytes of nibbles: group g (64 elements) uses bytes 32g.., low nibbles for
// sub-block 2g, high for 2g + 1; x = d * sc * q - dmin * m
void w_get8(uint row, uint k, uint K, out vec4 lo, out vec4 hi) {
    uint bo = (row * (K >> 8) + (k >> 8)) * 144u, e = k & 255u;
    uint g = e >> 6, r = e & 63u, sb = 2u * g + (r >> 5), l = r & 31u;
    uint sc, m;
    if (sb < 4u) {
        sc = w_byte(bo + 4u + sb) & 63u;
        m = w_byte(bo + 8u + sb) & 63u;
    } else {
        sc = (w_byte(bo + 8u + sb) & 15u) | ((w_byte(bo + sb) >> 6) << 4);
        m = (w_byte(bo + 8u + sb) >> 4) | ((w_byte(bo + 4u + sb) >> 6) << 4);
    }
    float d1 = w_half(bo) * float(sc), m1 = w_half(bo + 2u) * float(m);
    uint a = w_u32_at(bo + 16u + 32u * g + l), b = w_u32_at(bo + 20u + 32u * g + l);
    bool high = r >= 32u;
    lo = d1 * (high ? nib_hi(a) : nib_lo(a)) - m1;
    hi = d1 * (high ? nib_hi(b) : nib_lo(b)) - m1;
}
#elif defined(W_Q6_K)
// super-block of 256: 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 int8 scales,
// f16 d. Half h (128 elements) = 4 quarters of 32: quarter t takes ql[64h + l + 32 (t & 1)]'s
// low (t < 2) or high nibble and bits 2t..2t+1 of qh[32h + l]; scale 8h + l / 16 + 2t;
// x = d * scale * (q - 32)
void w_get8(uint row, uint k, uint K, out vec4 lo, out vec4 hi) {
    uint bo = (row * (K >> 8) + (k >> 8)) * 210u, e = k & 255u;
    uint h = e >> 7, t = (e >> 5) & 3u, l = e & 31u;
    float ds = w_half(bo + 208u) * float(w_i8(bo + 192u + 8u * h + (l >> 4) + 2u * t));
    uint qlo = bo + 64u * h + l + 32u * (t & 1u), qho = bo + 128u + 32u * h + l;
    uint a = w_u32_at(qlo), b = w_u32_at(qlo + 4u), ha = w_u32_at(qho), hb = w_u32_at(qho + 4u);
    // the 6-bit codes put together in the bytes of a word: the nibble | the two high bits << 4
    uint ns = t < 2u ? 0u : 4u, sh = 2u * t;
    uint qa = ((a >> ns) & 0x0F0F0F0Fu) | (((ha >> sh) & 0x03030303u) << 4);
    uint qb = ((b >> ns) & 0x0F0F0F0Fu) | (((hb >> sh) & 0x03030303u) << 4);
    lo = ds * bytes_f(qa, 32.0);
    hi = ds * bytes_f(qb, 32.0);
}
#elif defined(W_MLX)
layout(binding = AUX0_BINDING) readonly buffer Scales_ { uint scales_u32[]; };
layout(binding = AUX1_BINDING) readonly buffer Biases_ { uint biases_u32[]; };
float aux_get(uint i, bool scales) {
    uint w = scales ? scales_u32[i >> 1] : biases_u32[i >> 1];
    uint h = (i & 1u) != 0u ? w >> 16 : w & 0xffffu;
    return (QFLAGS & 1u) != 0u ? uintBitsToFloat(h << 16) : unpackHalf2x16(h).x;
}
uint w_code(uint lo32, uint hi32, uint p, uint mask) {
    if (p + QBITS <= 32u) return (lo32 >> p) & mask;
    if (p >= 32u) return (hi32 >> (p - 32u)) & mask;
    return ((lo32 >> p) | (hi32 << (32u - p))) & mask;
}
// a row is K * QBITS / 8 bytes; element j is bits [j * QBITS, (j + 1) * QBITS) of it
void w_get8(uint row, uint k, uint K, out vec4 lo, out vec4 hi) {
    uint off = row * (K * QBITS / 8u) + k * QBITS / 8u;
    uint a = w_u32_at(off), b = QBITS > 4u ? w_u32_at(off + 4u) : 0u, mask = (1u << QBITS) - 1u;
    uint gi = row * (K / QGROUP) + k / QGROUP;
    float sc = aux_get(gi, true), bi = aux_get(gi, false);
    float v[8];
    for (uint i = 0u; i < 8u; i++) v[i] = sc * (uintBitsToFloat(w_code(a, b, i * QBITS, mask) | 0x4B000000u) - 8388608.0) + bi;
    lo = vec4(v[0], v[1], v[2], v[3]);
    hi = vec4(v[4], v[5], v[6], v[7]);
}
#endif
float w_get(uint row, uint k, uint K) {
    vec4 lo, hi;
    w_get8(row, k & ~7u, K, lo, hi);
    uint i = k & 7u;
    return i < 4u ? lo[i] : hi[i - 4u];
}
#else
#error "define one weight format"
#endif

// Eight elements starting at k, zero past K; takes the vector path when it can. (Block
// formats always have whole blocks: K is a multiple of 32.)
void w_get8_any(uint row, uint k, uint K, out vec4 lo, out vec4 hi) {
#ifdef W_BLOCK_FORMAT
    w_get8(row, k, K, lo, hi);
    return;
#endif
    if ((K & 7u) == 0u && k + 8u <= K) {
        w_get8(row, k, K, lo, hi);
    } else {
        float v[8];
        for (uint i = 0u; i < 8u; i++) v[i] = k + i < K ? w_get(row, k + i, K) : 0.0;
        lo = vec4(v[0], v[1], v[2], v[3]);
        hi = vec4(v[4], v[5], v[6], v[7]);
    }
}
