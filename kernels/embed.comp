#version 450
// embed: out[t, :] = table[tokens[t] - row_begin, :] * scale, for the tokens whose rows lie
// in this chunk of the table (a table larger than one binding is dispatched per chunk).
// Bindings: 0 tokens u32 [n] | 1 table chunk [row_count, hidden] (format per build)
//           2 out f32 [n, hidden] | 3, 4 MLX scales and biases, unused by other formats
// One workgroup per token; round_bf16 = 1 rounds the product to bf16 (Gemma in bf16).
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;

// push constants: forge__pc_embed (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC {
    uint n_tokens, hidden, row_begin, row_count;
    float scale;
    uint round_mode;              // 0: none, 1: round to bf16, 2: round to f16
    uint qbits, qgroup, qflags;   // MLX affine: bits, group size, 1 = bf16 scales
} pc;

#include "common.glsl"
#define W_BINDING 1
#define AUX0_BINDING 3
#define AUX1_BINDING 4
#define QBITS pc.qbits
#define QGROUP pc.qgroup
#define QFLAGS pc.qflags
#include "weights.glsl"

layout(binding = 0) readonly buffer Tok_ { uint tokens[]; };
layout(binding = 2) writeonly buffer Out_ { float o[]; };


float round_to(float v) {
    if (pc.round_mode == 1u) {
        uint b = floatBitsToUint(v);
        b += 0x7fffu + ((b >> 16) & 1u);
        return uintBitsToFloat(b & 0xffff0000u);
    }
    if (pc.round_mode == 2u) return round_f16(v);
    return v;
}

void main() {
    uint t = gl_WorkGroupID.x;
    uint tok = tokens[t];
    if (tok < pc.row_begin || tok >= pc.row_begin + pc.row_count) return;
    uint r = tok - pc.row_begin;
    for (uint k = gl_LocalInvocationID.x; k < pc.hidden; k += 64u)
        o[t * pc.hidden + k] = round_to(w_get(r, k, pc.hidden) * pc.scale);
}
