#version 450
// act_mul_back: the backward twin of act_mul.comp. With h = act(g) * u,
//   dg = dh * u * act'(g),  du = dh * act(g)
// SiLU (act 0): act = g s, act' = s (1 + g (1 - s)), s = sigmoid(g).
// GELU-tanh (act 1): act = g (1 + t) / 2, t = tanh(k (g + 0.044715 g^3)),
//   act' = (1 + t) / 2 + g (1 - t^2) k (1 + 3 * 0.044715 g^2) / 2.
// sigmoid (act 2): act = s, act' = s (1 - s).
// Layouts of g and u (and of dg, du, written the same way): pairs (1), gate i at 2i and up i
// at 2i + 1 of each row, as the fused gate_up weight makes them; halves (2), rows of 2 ffn with
// the gates first, then the ups (two separate weights written side by side); apart the other
// way (4: Qwen 3.5's attention output times sigmoid of its gate): the ups u [count / ffn, ffn]
// in binding 1, du to binding 2, which may be dh's own range (each element is read before it is
// written, by the same invocation), and the gates in binding 3's rows of up_stride at column
// up_col0 (the q|k|v|gate rows), dg to binding 4 at the same places (their gradient's rows).
// act + 8 (act_mul's rows times sigmoid(a scalar), Qwen 3.5-MoE's shared expert): h's row r was
// also multiplied by sigmoid(s_r), s_r at binding 3's [r * up_stride + up_col0], so dh is first;
// the scalar's own gradient is moe_route_back.comp's (flags 4).
// Bindings: 0 dh f32 [count] | 1 gu f32 [count / ffn, 2 ffn] (layout 4: u) | 2 dgu f32 (same layout as gu; 4: du)
//           3 layout 4: the gates' rows; act + 8: the rows' scalars | 4 layout 4: their gradient's rows
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;

#include "common.glsl"

layout(binding = 0) buffer DH_ { float dh[]; };
layout(binding = 1) readonly buffer GU_ { float gu[]; };
layout(binding = 2) buffer DGU_ { float dgu[]; };
layout(binding = 3) readonly buffer G_ { float gates[]; };
layout(binding = 4) buffer DG_ { float dgates[]; };

#include "pc_act.glsl"

void main() {
    uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 256u;
    if (i >= pc.count) return;
    uint gi, ui;
    float g, u;
    if (pc.layout_ == 4u) {
        gi = (i / pc.ffn) * pc.up_stride + pc.up_col0 + i % pc.ffn;
        ui = i;
        g = gates[gi];
        u = gu[ui];
    } else {
        if (pc.layout_ == 1u) {
            gi = 2u * i;
            ui = gi + 1u;
        } else {
            uint r = i / pc.ffn, c = i % pc.ffn;
            gi = r * 2u * pc.ffn + c;
            ui = gi + pc.ffn;
        }
        g = gu[gi];
        u = gu[ui];
    }
    uint act = pc.act & 7u;
    float a, da;
    if (act == 0u) {
        float s = 1.0 / (1.0 + exp(-g));
        a = g * s;
        da = s * (1.0 + g * (1.0 - s));
    } else if (act == 2u) {
        a = 1.0 / (1.0 + exp(-g));
        da = a * (1.0 - a);
    } else {
        const float k = 0.7978845608028654; // sqrt(2 / pi)
        float t = safe_tanh(k * (g + 0.044715 * g * g * g));
        a = 0.5 * g * (1.0 + t);
        da = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * g * g);
    }
    float d = dh[i];
    if ((pc.act & 8u) != 0u) d *= 1.0 / (1.0 + exp(-gates[(i / pc.ffn) * pc.up_stride + pc.up_col0]));
    if (pc.layout_ == 4u) {
        dgates[gi] = d * u * da;
        dgu[ui] = d * a;
    } else {
        dgu[gi] = d * u * da;
        dgu[ui] = d * a;
    }
}
