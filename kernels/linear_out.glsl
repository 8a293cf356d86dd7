// linear_out.glsl: the epilogue of the matrix-vector kernels (matvec_sg, matvec_q8a), of matmul
// and linear_reduce, which include pc_linear.glsl (forge__pc_linear's push constants, pc) before
// it and share bindings 2 C f32 and 3 bias f32.
// flags: 1 bias, 2 accumulate into C, 4 soft-cap, bit 5 the gated activation (0 SiLU, 1 GELU-tanh)
layout(binding = 2) buffer C_ { float c[]; };
layout(binding = 3) readonly buffer Bias_ { float bias[]; };

float act(float x) {
    if ((pc.flags & 32u) == 0u) return x / (1.0 + exp(-x));
    const float k = 0.7978845608028654; // sqrt(2 / pi)
    return 0.5 * x * (1.0 + safe_tanh(k * (x + 0.044715 * x * x * x)));
}

// output out_row of token m: bias, soft-cap, then written or added to C[m, c_col0 + out_row];
// returns what was written
float store(uint out_row, uint m, float v) {
    if ((pc.flags & 1u) != 0u) v += bias[pc.bias_off + out_row];
    if ((pc.flags & 4u) != 0u) v = safe_tanh(v / pc.softcap) * pc.softcap;
    uint ci = m * pc.ldc + pc.c_col0 + out_row;
    if ((pc.flags & 2u) != 0u) v += c[ci];
    c[ci] = v;
    return v;
}
