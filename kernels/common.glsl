// common.glsl: helpers shared by forge's kernels.
// Weights are read through uint words and unpacked, so f16 and bf16 need no 16-bit storage
// feature: unpackHalf2x16 is core GLSL, and bf16 is the high half of an f32.

float bf16_lo(uint w) { return uintBitsToFloat(w << 16); }
float bf16_hi(uint w) { return uintBitsToFloat(w & 0xffff0000u); }

// tanh that cannot overflow for large |x| (some drivers build tanh from exp(2x)).
float safe_tanh(float x) {
    float t = exp(-2.0 * abs(x));
    return sign(x) * (1.0 - t) / (1.0 + t);
}

// cos and sin of a possibly large angle: reduce by 2*pi in two parts first (Cody-Waite),
// because native sin/cos lose accuracy far from zero and RoPE angles reach pos * 1.0.
vec2 cos_sin(float theta) {
    const float INV_2PI = 0.15915494309189535;
    const float PI2_HI = 6.28318548202514648;     // float(2*pi)
    const float PI2_LO = -1.7484555314695172e-7;  // 2*pi - PI2_HI
    float k = round(theta * INV_2PI);
    float r = fma(-k, PI2_HI, theta);
    r = fma(-k, PI2_LO, r);
    return vec2(cos(r), sin(r));
}
