#version 450
// rmsnorm_back: the backward twin of rmsnorm.comp for a frozen weight. With y = x * r * w,
// r = 1 / sqrt(mean(x^2) + eps), the gradient of the input is
//   dx = r * (dy * w) - x * r^3 / dim * sum(dy * w * x)
// written to out, or added to it (flags 1: the residual stream's gradient, which also flows
// around the norm). Rows as in rmsnorm.comp: block norms (heads = 0) are rows gid of dim
// contiguous elements in x, dy and out; per-head q/k norms (heads > 0) are head gid % heads of
// token gid / heads at (token * row_stride + col0 + head * dim) in all three, so dy and out may
// be the same range (each element is read before it is written, by the same thread).
// Gemma's (1 + w) norms arrive with the 1 already added at load.
// Bindings: 0 x f32 (the norm's input) | 1 w f32 [dim] | 2 dy f32 | 3 out f32
layout(local_size_x = 128) in;

layout(binding = 0) readonly buffer X_ { float x[]; };
layout(binding = 1) readonly buffer W_ { float w[]; };
layout(binding = 2) readonly buffer DY_ { float dy[]; };
layout(binding = 3) buffer O_ { float o[]; };

// push constants: forge__pc_norm_back (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC {
    uint dim, flags;
    float eps;
    uint heads, row_stride, col0;
} pc;

shared float red[2][128];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint g = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint base = g * pc.dim;
    if (pc.heads != 0u) base = (g / pc.heads) * pc.row_stride + pc.col0 + (g % pc.heads) * pc.dim;
    float ss = 0.0, sd = 0.0;
    for (uint i = tid; i < pc.dim; i += 128u) {
        float xv = x[base + i];
        ss += xv * xv;
        sd += dy[base + i] * w[i] * xv;
    }
    red[0][tid] = ss;
    red[1][tid] = sd;
    barrier();
    for (uint s = 64u; s > 0u; s >>= 1) {
        if (tid < s) {
            red[0][tid] += red[0][tid + s];
            red[1][tid] += red[1][tid + s];
        }
        barrier();
    }
    float r = 1.0 / sqrt(red[0][0] / float(pc.dim) + pc.eps);
    float k = r * r * r / float(pc.dim) * red[1][0];
    for (uint i = tid; i < pc.dim; i += 128u) {
        float v = r * dy[base + i] * w[i] - x[base + i] * k;
        if ((pc.flags & 1u) != 0u) v += o[base + i];
        o[base + i] = v;
    }
}
