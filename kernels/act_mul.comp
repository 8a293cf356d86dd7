#version 450
// act_mul: gate[i] = act(gate[i]) * up[i], the gated MLP's middle. act: 0 SiLU, 1 GELU (tanh
// approximation, Gemma's gelu_pytorch_tanh).
// Bindings: 0 gate f32 [n] (in/out) | 1 up f32 [n]
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;

#include "common.glsl"

layout(binding = 0) buffer G_ { float g[]; };
layout(binding = 1) readonly buffer U_ { float u[]; };

layout(push_constant) uniform PC { uint count, act; } pc;

void main() {
    uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 256u;
    if (i >= pc.count) return;
    float x = g[i];
    float y;
    if (pc.act == 0u) {
        y = x / (1.0 + exp(-x));
    } else {
        const float k = 0.7978845608028654; // sqrt(2 / pi)
        y = 0.5 * x * (1.0 + safe_tanh(k * (x + 0.044715 * x * x * x)));
    }
    g[i] = y * u[i];
}
