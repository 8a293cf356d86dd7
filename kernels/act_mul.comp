#version 450
// act_mul: the gated MLP's middle, h[i] = act(gate[i]) * up[i]. act: 0 SiLU, 1 GELU (tanh
// approximation, Gemma's gelu_pytorch_tanh). Two layouts: separate (h holds gate, in place,
// binding 1 holds up) or pairs (binding 1 holds gate_up interleaved per row: gate i at 2i,
// up i at 2i + 1, as the fused gate_up weight produces them).
// Bindings: 0 h f32 [count] (out; the gate in the separate layout) | 1 up f32 [count] or gate_up f32 [2 count]
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;

#include "common.glsl"

layout(binding = 0) buffer H_ { float h[]; };
layout(binding = 1) readonly buffer U_ { float u[]; };

layout(push_constant) uniform PC { uint count, act, pairs; } pc;

void main() {
    uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 256u;
    if (i >= pc.count) return;
    float x = pc.pairs != 0u ? u[2u * i] : h[i];
    float up = pc.pairs != 0u ? u[2u * i + 1u] : u[i];
    float y;
    if (pc.act == 0u) {
        y = x / (1.0 + exp(-x));
    } else {
        const float k = 0.7978845608028654; // sqrt(2 / pi)
        y = 0.5 * x * (1.0 + safe_tanh(k * (x + 0.044715 * x * x * x)));
    }
    h[i] = y * up;
}
