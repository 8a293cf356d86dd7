#version 450
// rmsnorm: out[r, :] (+)= x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w[:]
// Rows are x_row0 + gid (input) and out_row0 + gid (output); dim elements each, contiguous.
// Used for the block norms (rows = tokens, dim = hidden) and for the per-head q/k norms
// (rows = tokens * heads, dim = head_dim, in place). flags: 1 add to out (Gemma's
// post-norms feed the residual stream).
// Bindings: 0 x f32 | 1 w f32 [dim] | 2 out f32
layout(local_size_x = 128) in;

layout(binding = 0) readonly buffer X_ { float x[]; };
layout(binding = 1) readonly buffer W_ { float w[]; };
layout(binding = 2) buffer O_ { float o[]; };

layout(push_constant) uniform PC {
    uint dim, x_row0, out_row0, flags;
    float eps;
} pc;

shared float red[128];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint xb = (pc.x_row0 + gl_WorkGroupID.x) * pc.dim;
    uint ob = (pc.out_row0 + gl_WorkGroupID.x) * pc.dim;
    float ss = 0.0;
    for (uint i = tid; i < pc.dim; i += 128u) ss += x[xb + i] * x[xb + i];
    red[tid] = ss;
    barrier();
    for (uint s = 64u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        barrier();
    }
    float inv = 1.0 / sqrt(red[0] / float(pc.dim) + pc.eps);
    for (uint i = tid; i < pc.dim; i += 128u) {
        float v = x[xb + i] * inv * w[i];
        if ((pc.flags & 1u) != 0u) v += o[ob + i];
        o[ob + i] = v;
    }
}
