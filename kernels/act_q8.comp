#version 450
// act_q8: one token's activations as int8 blocks of 32, the input of matvec_q8a (a grid layer
// a row for the matvec_q8a_rows modules: row a_row0 + y into the layout below at 3 y K / 32 uvec4).
//   q[k] = round(v[k] / d_b) in -127..127,  d_b = max over block b of |v[k]| / 127
// where v is row a_row0 of A [*, K] (K a multiple of 32), or with PRENORM that row times g:
// the RMS norm's weight. The norm's 1 / rms(row) is a common factor of the whole row, so it is
// left to matvec_q8a, which sums the blocks' squares (below) as it reads them: no block waits
// for the rest of the row, and a thread quantizes its block alone.
// Output (binding 2): the codes, 4 to a little-endian word, block b in words 8b .. 8b + 7
// ([K / 4] u32), then per block vec4(d_b, d_b * sum of its codes, sum of the block's A^2, 0)
// ([K / 32] vec4): the second is what a Q4_0 product needs for its codes' offset of 8, the
// third what PRENORM needs for the norm.
// Bindings: 0 A f32 | 1 g f32 [K] (PRENORM) | 2 out
// flags: 8 PRENORM (forge__pc_linear's bit)
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 64) in;

#include "common.glsl"

// push constants: forge__pc_act_q8 (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC {
    uint K, a_row0, flags;
} pc;

layout(binding = 0) readonly buffer A4_ { vec4 a4[]; };
layout(binding = 1) readonly buffer G4_ { vec4 g4[]; };
layout(binding = 2) writeonly buffer Q_ { uvec4 q4[]; };
layout(binding = 2) writeonly buffer S_ { vec4 s4[]; };

void main() {
    uint b = gl_GlobalInvocationID.x, row4 = (pc.a_row0 + gl_WorkGroupID.y) * (pc.K >> 2), o = 3u * (pc.K >> 5) * gl_WorkGroupID.y;
    if (b >= (pc.K >> 5)) return;
    bool prenorm = (pc.flags & 8u) != 0u;
    vec4 v[8];
    float ss = 0.0;
    [[unroll]] for (uint i = 0u; i < 8u; i++) {
        v[i] = a4[row4 + 8u * b + i];
        ss += dot(v[i], v[i]);
        if (prenorm) v[i] *= g4[8u * b + i];
    }
    uint w[8];
    vec2 ds;
    quantize_q8_block(v, w, ds);
    q4[o + 2u * b] = uvec4(w[0], w[1], w[2], w[3]);
    q4[o + 2u * b + 1u] = uvec4(w[4], w[5], w[6], w[7]);
    s4[o + (pc.K >> 4) + b] = vec4(ds, ss, 0.0);
}
