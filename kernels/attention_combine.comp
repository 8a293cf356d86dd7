#version 450
// attention_combine: stage 2 of the split decode attention. For query t, head h, merges the
// n_splits partial states {m, l, acc[D]} of attention_split.comp:
//   out[t, h, :] = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s,  M = max_s m_s.
// Bindings: 0 part f32 | 1 out f32 [n, H, D]
// One workgroup of 64 per (head, token).
layout(local_size_x = 64) in;

layout(binding = 0) readonly buffer P_ { float part[]; };
layout(binding = 1) writeonly buffer O_ { float o[]; };

layout(push_constant) uniform PC { uint n_heads, head_dim, n_splits; } pc;

void main() {
    uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, D = pc.head_dim;
    uint base = (t * pc.n_heads + h) * pc.n_splits * (D + 2u);
    float M = -1.0 / 0.0;
    for (uint s = 0; s < pc.n_splits; s++) M = max(M, part[base + s * (D + 2u)]);
    float L = 0.0;
    for (uint s = 0; s < pc.n_splits; s++) {
        float ms = part[base + s * (D + 2u)];
        if (ms > -1.0 / 0.0) L += exp(ms - M) * part[base + s * (D + 2u) + 1u];
    }
    for (uint d = gl_LocalInvocationID.x; d < D; d += 64u) {
        float acc = 0.0;
        for (uint s = 0; s < pc.n_splits; s++) {
            float ms = part[base + s * (D + 2u)];
            if (ms > -1.0 / 0.0) acc += exp(ms - M) * part[base + s * (D + 2u) + 2u + d];
        }
        o[(t * pc.n_heads + h) * D + d] = acc / L;
    }
}
