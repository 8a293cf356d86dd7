#version 450
// act_mul_back: the backward twin of act_mul.comp. With h = act(g) * u,
//   dg = dh * u * act'(g),  du = dh * act(g)
// SiLU (act 0): act = g s, act' = s (1 + g (1 - s)), s = sigmoid(g).
// GELU-tanh (act 1): act = g (1 + t) / 2, t = tanh(k (g + 0.044715 g^3)),
//   act' = (1 + t) / 2 + g (1 - t^2) k (1 + 3 * 0.044715 g^2) / 2.
// Layouts of g and u (and of dg, du, written the same way): pairs (1), gate i at 2i and up i
// at 2i + 1 of each row, as the fused gate_up weight makes them; halves (2), rows of 2 ffn with
// the gates first, then the ups (two separate weights written side by side).
// Bindings: 0 dh f32 [count] | 1 gu f32 [count / ffn, 2 ffn] | 2 dgu f32 (same layout as gu)
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;

#include "common.glsl"

layout(binding = 0) readonly buffer DH_ { float dh[]; };
layout(binding = 1) readonly buffer GU_ { float gu[]; };
layout(binding = 2) writeonly buffer DGU_ { float dgu[]; };

#include "pc_act.glsl"

void main() {
    uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 256u;
    if (i >= pc.count) return;
    uint gi, ui;
    if (pc.layout_ == 1u) {
        gi = 2u * i;
        ui = gi + 1u;
    } else {
        uint r = i / pc.ffn, c = i % pc.ffn;
        gi = r * 2u * pc.ffn + c;
        ui = gi + pc.ffn;
    }
    float g = gu[gi], u = gu[ui], a, da;
    if (pc.act == 0u) {
        float s = 1.0 / (1.0 + exp(-g));
        a = g * s;
        da = s * (1.0 + g * (1.0 - s));
    } else {
        const float k = 0.7978845608028654; // sqrt(2 / pi)
        float t = safe_tanh(k * (g + 0.044715 * g * g * g));
        a = 0.5 * g * (1.0 + t);
        da = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * g * g);
    }
    dgu[gi] = dh[i] * u * da;
    dgu[ui] = dh[i] * a;
}
