#version 450
// adamw: the optimizer step over the flat vector of LoRA parameters, torch.optim.AdamW's
// arithmetic (decoupled weight decay, bias correction), after torch's clip_grad_norm_:
//   mode 0 (sum of squares): partials[part0 + wg] = sum of g^2 over this workgroup's 4096 elements
//   mode 1 (total): one workgroup: norm2 = sum of partials[0 .. n_parts)
//   mode 2 (update), per element, with c = min(1, max_norm / (sqrt(norm2) + 1e-6)) (c = 1 when
//   clipping is off):
//     g = c * G;  p *= 1 - lr * wd;  m += (1 - b1) (g - m);  v = b2 v + (1 - b2) g^2
//     p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps);  G = 0 (ready to accumulate again)
// The scalars come computed in f64 on the host and rounded once, as torch's Python floats are
// (1 - b2 in f32 arithmetic would differ from torch's by 1e-5 relative).
// The parameters may span several buffers (segments), each dispatched with its own bindings and
// part0 (mode 0); all partials land in one array. The hyper-parameters of the step (bias
// corrections from the step count, the scheduled lr) come from a host-written buffer, so the
// recorded step is replayed unchanged.
// Bindings: 0 P f32 | 1 G f32 | 2 M f32 | 3 V f32
//           4 opt {1 - lr wd, 1 - b1, b2, 1 - b2, lr / bc1, sqrt(bc2), eps, max_norm}
//           5 norm f32 [1 + parts]: norm2, then the partials
layout(local_size_x = 256) in;

layout(binding = 0) buffer P_ { float p[]; };
layout(binding = 1) buffer G_ { float g[]; };
layout(binding = 2) buffer M_ { float m[]; };
layout(binding = 3) buffer V_ { float v[]; };
layout(binding = 4) readonly buffer O_ { float decay, one_minus_b1, b2, one_minus_b2, step_size, bc2_sqrt, eps, max_norm; } opt;
layout(binding = 5) buffer N_ { float norm[]; };

// push constants: forge__pc_adamw (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC { uint count, mode, part0, n_parts; } pc;

shared float red[256];

const uint PER_WG = 4096;

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (pc.mode == 0u || pc.mode == 1u) {
        float s = 0.0;
        if (pc.mode == 0u) {
            uint e0 = wg * PER_WG;
            for (uint e = e0 + tid; e < min(e0 + PER_WG, pc.count); e += 256u) s += g[e] * g[e];
        } else {
            for (uint i = tid; i < pc.n_parts; i += 256u) s += norm[1u + i];
        }
        red[tid] = s;
        barrier();
        for (uint k = 128u; k > 0u; k >>= 1) {
            if (tid < k) red[tid] += red[tid + k];
            barrier();
        }
        if (tid == 0u) {
            if (pc.mode == 0u) norm[1u + pc.part0 + wg] = red[0];
            else norm[0] = red[0];
        }
        return;
    }
    uint i = wg * 256u + tid;
    if (i >= pc.count) return;
    float c = 1.0;
    if (opt.max_norm > 0.0) c = min(1.0, opt.max_norm / (sqrt(norm[0]) + 1e-6));
    float gi = g[i] * c;
    float pi = p[i] * opt.decay;
    float mi = m[i];
    mi += opt.one_minus_b1 * (gi - mi);
    float vi = v[i] * opt.b2 + opt.one_minus_b2 * (gi * gi);
    pi -= opt.step_size * mi / (sqrt(vi) / opt.bc2_sqrt + opt.eps);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    g[i] = 0.0;
}
