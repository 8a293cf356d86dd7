#version 450
// act_mul: the gated MLP's middle, h[i] = act(gate[i]) * up[i]. act: 0 SiLU, 1 GELU (tanh
// approximation, Gemma's gelu_pytorch_tanh), 2 sigmoid; with 8 added (layout 1), every row then
// times sigmoid(binding 2's value at column up_col0 of rows of up_stride: Qwen 3.5-MoE's shared
// expert times sigmoid(x . shared_expert_gate)). Layouts of gate and up: pairs (1: gate i at
// 2i and up i at 2i + 1 of each row, as the fused gate_up weight produces them) or halves (2:
// rows of 2 ffn, the gates then the ups, as two separate weights write them side by side), or
// apart (3: gates [count / ffn, ffn] in binding 1, ups in binding 2 at column up_col0 of rows of
// up_stride: Gemma 4's per-layer input gate times the layer's slice of the per-layer inputs; 4:
// the other way round, ups [count / ffn, ffn] in binding 1 and gates in binding 2: Qwen 3.5's
// attention output times sigmoid of its gate, which sits in the q|k|v|gate rows; h may be the
// ups' own range).
// Bindings: 0 h f32 [count] (out) | 1 gate and up f32 [count / ffn, 2 ffn] | 2 up (layout 3), gate (4), row scale (act + 8)
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;

#include "common.glsl"

layout(binding = 0) buffer H_ { float h[]; };
layout(binding = 1) buffer U_ { float u[]; };
layout(binding = 2) readonly buffer U2_ { float u2[]; };

#include "pc_act.glsl"

void main() {
    uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 256u;
    if (i >= pc.count) return;
    float x, up;
    if (pc.layout_ == 1u) {
        x = u[2u * i];
        up = u[2u * i + 1u];
    } else if (pc.layout_ == 3u) {
        x = u[i];
        up = u2[(i / pc.ffn) * pc.up_stride + pc.up_col0 + i % pc.ffn];
    } else if (pc.layout_ == 4u) {
        x = u2[(i / pc.ffn) * pc.up_stride + pc.up_col0 + i % pc.ffn];
        up = u[i];
    } else {
        uint gi = (i / pc.ffn) * 2u * pc.ffn + i % pc.ffn;
        x = u[gi];
        up = u[gi + pc.ffn];
    }
    float y;
    uint act = pc.act & 7u;
    if (act == 0u) {
        y = x / (1.0 + exp(-x));
    } else if (act == 2u) {
        y = 1.0 / (1.0 + exp(-x));
    } else {
        const float k = 0.7978845608028654; // sqrt(2 / pi)
        y = 0.5 * x * (1.0 + safe_tanh(k * (x + 0.044715 * x * x * x)));
    }
    if ((pc.act & 8u) != 0u) up *= 1.0 / (1.0 + exp(-u2[(i / pc.ffn) * pc.up_stride + pc.up_col0]));
    h[i] = y * up;
}
