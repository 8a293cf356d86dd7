#version 450
// lora_merge: folds an adapter into a float weight once, at load (forge_model_params
// .adapter_merge): W[w, k] += scale * sum_j B[r, j] A[j, k] for the weight rows w of one
// target, r its row in the target (B's row). Targets inside fused weights: rows t_row0 ..
// t_row0 + t_rows of the q|k|v rows, or every second row from row_phase (the gate and up rows
// of the interleaved gate_up weight). The sum in f32, the result rounded to the weight's type
// to nearest even (as forge's and torch's host conversions do).
// fmt: 0 f32, 1 f16, 2 bf16 (two elements per 32-bit word). One invocation per word of the
// chunk's n_elems elements.
// Bindings: 0 W chunk (in/out, words) | 1 A f32 | 2 B f32
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;

layout(binding = 0) buffer W_ { uint w[]; };
layout(binding = 1) readonly buffer A_ { float a[]; };
layout(binding = 2) readonly buffer B_ { float b[]; };

// push constants: forge__pc_merge (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC {
    uint K, n_elems, chunk_row0, t_row0, t_rows, row_step, row_phase, rank, a_el, b_el, fmt;
    float scale;
} pc;

uint f32_to_f16(float f) {
    uint x = floatBitsToUint(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u;
    if (ax >= 0x477ff000u) return sign | 0x7c00u;
    if (ax < 0x38800000u) return sign | uint(roundEven(uintBitsToFloat(ax) * 16777216.0));
    return sign | ((ax + 0xfffu + ((ax >> 13) & 1u) - 0x38000000u) >> 13);
}

uint f32_to_bf16(float f) {
    uint x = floatBitsToUint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (x >> 16) | 0x40u;
    return (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
}

// the merged value of element e of the chunk (v: its value before)
float merged(uint e, float v) {
    uint row = pc.chunk_row0 + e / pc.K, k = e % pc.K, r;
    if (pc.row_step == 2u) {
        if (row % 2u != pc.row_phase) return v;
        r = row / 2u;
    } else {
        if (row < pc.t_row0 || row >= pc.t_row0 + pc.t_rows) return v;
        r = row - pc.t_row0;
    }
    float s = 0.0;
    for (uint j = 0; j < pc.rank; j++) s += b[pc.b_el + r * pc.rank + j] * a[pc.a_el + j * pc.K + k];
    return v + pc.scale * s;
}

void main() {
    uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 256u;
    if (i >= (pc.fmt == 0u ? pc.n_elems : (pc.n_elems + 1u) / 2u)) return;
    uint word = w[i];
    if (pc.fmt == 0u) {
        w[i] = floatBitsToUint(merged(i, uintBitsToFloat(word)));
        return;
    }
    uint lo = word & 0xffffu, hi = word >> 16, e = 2u * i;
    float vlo = pc.fmt == 1u ? unpackHalf2x16(lo).x : uintBitsToFloat(lo << 16);
    float vhi = pc.fmt == 1u ? unpackHalf2x16(hi).x : uintBitsToFloat(hi << 16);
    float mlo = merged(e, vlo), mhi = e + 1u < pc.n_elems ? merged(e + 1u, vhi) : vhi; /* an odd count: the last half is padding */
    uint nlo = pc.fmt == 1u ? f32_to_f16(mlo) : f32_to_bf16(mlo);
    uint nhi = pc.fmt == 1u ? f32_to_f16(mhi) : f32_to_bf16(mhi);
    w[i] = (nlo & 0xffffu) | (nhi << 16);
}
