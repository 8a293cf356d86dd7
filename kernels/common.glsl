// common.glsl: helpers shared by forge's kernels.
// Weights are read through uint words and unpacked, so f16 and bf16 need no 16-bit storage
// feature: unpackHalf2x16 is core GLSL, and bf16 is the high half of an f32.

float bf16_lo(uint w) { return uintBitsToFloat(w << 16); }
float bf16_hi(uint w) { return uintBitsToFloat(w & 0xffff0000u); }

// Round an f32 to the nearest f16 value, ties to even (packHalf2x16's rounding is left to
// the implementation; NVIDIA's truncates). Normal range only: the values rounded are
// embeddings scaled by sqrt(hidden), far from f16's limits.
float round_f16(float v) {
    uint b = floatBitsToUint(v);
    uint e = (b >> 23) & 255u;
    if (e < 113u || e > 142u) return unpackHalf2x16(packHalf2x16(vec2(v, 0.0))).x;
    b += 0xfffu + ((b >> 13) & 1u);
    return uintBitsToFloat(b & 0xffffe000u);
}

#ifdef FORGE_F16_TYPES
// four values rounded to f16 (to nearest even, clamped to its range), packed in two words:
// the tensor cores' operands (kernels that enable GL_EXT_shader_explicit_arithmetic_types_float16
// and define FORGE_F16_TYPES before including this file)
uvec2 to_f16(vec4 x) {
    f16vec4 h = f16vec4(clamp(x, vec4(-65504.0), vec4(65504.0)));
    return uvec2(packFloat2x16(h.xy), packFloat2x16(h.zw));
}
#endif

// tanh that cannot overflow for large |x| (some drivers build tanh from exp(2x)).
float safe_tanh(float x) {
    float t = exp(-2.0 * abs(x));
    return sign(x) * (1.0 - t) / (1.0 + t);
}

// cos and sin of a possibly large angle: RoPE angles reach pos * 1.0, and native sin/cos lose
// accuracy far from zero. Reduce by 2*pi first (Cody-Waite, three parts with few significant
// bits so that k * C1 and k * C2 are exact in f32 without relying on fma): exact for k < 2^16,
// i.e. angles up to about 4e5.
vec2 cos_sin(float theta) {
    const float INV_2PI = 0.15915494309189535;
    const float C1 = 6.28125;                  // 201 / 32
    const float C2 = 0.0019302368164062500;    // 253 / 131072
    const float C3 = 5.0703631799819962e-06;   // 2*pi - C1 - C2
    precise float k = round(theta * INV_2PI);
    precise float r = theta - k * C1;
    r = r - k * C2;
    r = r - k * C3;
    return vec2(cos(r), sin(r));
}

// RoPE of one pair x = (first, second) by the angle whose cos_sin is cs. `precise`: rope.comp
// and attention_decode.comp (which rotates a decode step's query and key itself) must round
// alike, so no fused multiply-add here.
vec2 rope_pair(vec2 x, vec2 cs) {
    precise vec2 y = vec2(x.x * cs.x - x.y * cs.y, x.y * cs.x + x.x * cs.y);
    return y;
}

// A 32-bit integer hash with good avalanche (Chris Wellons' "lowbias32"): dropout masks are
// hashes of (seed, stream, element index), recomputed by the backward pass instead of stored.
uint lowbias_hash(uint x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

// One block of 32 activations as int8 codes for matvec_q8a (act_q8.comp says the layout):
// q = round(v / d) in -127..127 with d = max |v| / 127; w gets the codes 4 to a word
// (little-endian), ds = (d, d * sum of the codes).
void quantize_q8_block(vec4 v[8], out uint w[8], out vec2 ds) {
    float amax = 0.0;
    for (uint i = 0u; i < 8u; i++) {
        vec4 av = abs(v[i]);
        amax = max(amax, max(max(av.x, av.y), max(av.z, av.w)));
    }
    float d = amax / 127.0, id = amax > 0.0 ? 127.0 / amax : 0.0;
    ivec4 sum = ivec4(0);
    for (uint i = 0u; i < 8u; i++) {
        ivec4 q = ivec4(round(v[i] * id));
        sum += q;
        uvec4 u = uvec4(q) & 255u;
        w[i] = u.x | (u.y << 8) | (u.z << 16) | (u.w << 24);
    }
    ds = vec2(d, d * float(sum.x + sum.y + sum.z + sum.w));
}

// The KV cache in f16 (forge_session_params.kv_type; kernels built with -DKV_F16): element e
// of a row is the half (e & 1) of word e / 2, low half first, rounded to nearest (round_f16:
// packHalf2x16 alone may truncate). rope.comp and the context shift (rope_back.comp) write a
// head two RoPE pairs at a time, so that each invocation owns whole words: pairs 2j and
// 2j + 1 are, for rotate-half (pair i = (i, i + D/2)), words j (their first elements) and
// D/4 + j (their second), and for adjacent pairs (pair i = (2i, 2i + 1)) words 2j and 2j + 1.
// Needs D % 4 == 0 (forge.c keeps f32 otherwise).
uint pack_f16(vec2 v) { return packHalf2x16(vec2(round_f16(v.x), round_f16(v.y))); }
vec4 unpack_f16x4(uvec2 w) { return vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y)); }
// Element e of a row from its word (a select, not a dynamic index: that can go through local memory).
float f16_at(uint w, uint e) {
    vec2 v = unpackHalf2x16(w);
    return (e & 1u) != 0u ? v.y : v.x;
}
// The two words of pairs 2j and 2j + 1 of a head starting at word `head`.
uvec2 kv16_words(uint head, uint j, uint half_d, bool adjacent) {
    return adjacent ? uvec2(head + 2u * j, head + 2u * j + 1u) : uvec2(head + j, head + half_d / 2u + j);
}
// Pairs a = 2j and b = 2j + 1 (each (first, second)) into their two words, and back.
uvec2 kv16_pack(vec2 a, vec2 b, bool adjacent) {
    return adjacent ? uvec2(pack_f16(a), pack_f16(b)) : uvec2(pack_f16(vec2(a.x, b.x)), pack_f16(vec2(a.y, b.y)));
}
void kv16_unpack(uvec2 w, bool adjacent, out vec2 a, out vec2 b) {
    vec2 w0 = unpackHalf2x16(w.x), w1 = unpackHalf2x16(w.y);
    a = adjacent ? w0 : vec2(w0.x, w1.x);
    b = adjacent ? w1 : vec2(w0.y, w1.y);
}

// The KV cache in q8_0 (kv_type FORGE_KV_Q8_0; kernels built with -DKV_Q8), llama.cpp's block
// format laid out for words: a head of D values (D % 32 == 0) is kv8_words(D) = D/4 + ceil(D/64)
// words, its D codes 4 to a word (element e in byte e % 4 of word e / 4, two's complement), then
// its D/32 blocks' scales in f16, block b's in half b & 1 of word D/4 + b / 2 (the last half unused
// when D/32 is odd). A cache row (one position) is n_kv_heads such heads. A block's scale is
// d = f16(max |v| / 127) and its codes q = clamp(round(v / d), -127, 127); it reads as q d, exact
// in f32 (so a value quantized again from q d gives q back). Writers own whole blocks and scale
// words: rope.comp an invocation per scale word of a head, attention_decode.comp and the context
// shift (rope_back.comp) a workgroup per head.
uint kv8_words(uint D) { return D / 4u + (D / 32u + 1u) / 2u; }
float kv8_scale(float amax) { return round_f16(min(amax / 127.0, 65504.0)); }
int kv8_code(float v, float d) { return d > 0.0 ? clamp(int(roundEven(v / d)), -127, 127) : 0; }
uint kv8_pack(ivec4 q) {
    uvec4 u = uvec4(q) & 255u;
    return u.x | (u.y << 8) | (u.z << 16) | (u.w << 24);
}
vec4 kv8_codes(uint w) {
    int s = int(w);
    return vec4(bitfieldExtract(s, 0, 8), bitfieldExtract(s, 8, 8), bitfieldExtract(s, 16, 8), bitfieldExtract(s, 24, 8));
}
// Block b's scale of the head whose words start at hb in cache c (a uint[] buffer).
#define KV8_SCALE(c, hb, D, b) f16_at(c[(hb) + (D) / 4u + ((b) >> 1)], (b))
// Piece i (elements 4i .. 4i + 3) and element e of that head, as values.
#define KV8_PIECE(c, hb, D, i) (kv8_codes(c[(hb) + (i)]) * KV8_SCALE(c, hb, D, (i) >> 3))
#define KV8_AT(c, hb, D, e) (float(bitfieldExtract(int(c[(hb) + ((e) >> 2)]), 8 * int((e) & 3u), 8)) * KV8_SCALE(c, hb, D, (e) >> 5))
