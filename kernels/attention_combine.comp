#version 450
// attention_combine: stage 2 of the split decode attention, its own dispatch (attention_split.comp's
// runs, and attention_decode.comp's where it does not merge them itself). For query t, head h,
// merges the n_splits partial states {m, l, acc[D]} (attention_merge.glsl says how):
//   out[t, h, :] = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s,  M = max_s m_s.
// With flags 1 it also writes row 0 of out as int8 blocks for matvec_q8a (act_q8.comp's
// layout, K = H * D, D % 32 == 0: a head's blocks are its own), the o projection's input, so
// that product needs no act_q8 dispatch.
// Bindings: 0 part f32 | 1 out f32 [n, H, D] | 2 int8 output (flags 1)
// One workgroup of 128 per (head, token); D <= 512, n_splits <= 64.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 128) in;

#include "common.glsl"

layout(binding = 0) readonly buffer P_ { float part[]; };
layout(binding = 0) readonly buffer P2_ { vec2 part2[]; };
layout(binding = 1) writeonly buffer O_ { float o[]; };
layout(binding = 2) writeonly buffer Q8_ { uvec4 q8[]; };
layout(binding = 2) writeonly buffer Q8S_ { vec4 q8s[]; };

// push constants: forge__pc_combine (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC { uint n_heads, head_dim, n_splits, flags; } pc;

#define MERGE_DMAX 512u   // forge.c FORGE__MAX_HEAD_DIM
#define MERGE_SPLITS 64u  // forge.c FORGE__ATTN_SPLITS
#include "attention_merge.glsl"

void main() {
    uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, D = pc.head_dim;
    uint base = (t * pc.n_heads + h) * pc.n_splits * (D + 2u);
    merge_runs(base, pc.n_splits, D, (t * pc.n_heads + h) * D, (pc.flags & 1u) != 0u && t == 0u, h, pc.n_heads * D);
}
