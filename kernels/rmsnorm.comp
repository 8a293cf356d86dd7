#version 450
// rmsnorm: out[r, :] (+)= x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w[:]
// Block norms (heads = 0): rows x_row0 + gid and out_row0 + gid of dim contiguous elements.
// Per-head q/k norms (heads > 0, in place): row gid is head gid % heads of token gid / heads,
// at (token * row_stride + col0 + head * dim) in the fused qkv rows. flags: 1 add to out
// (Gemma's post-norms feed the residual stream), 2 then multiply the row by `scale` (Gemma 4's
// layer_scalar; its per-layer inputs' 2^-0.5), 4 (with 1) add binding 3's row instead of out's (a
// residual stream that a product wrote elsewhere: matvec_sg's POST_ADD).
// Bindings: 0 x f32 | 1 w f32 [dim] | 2 out f32 | 3 the row added with flags 4 f32
// A workgroup of 256 a row; rows of dim % 4 == 0 (and the w row, out's row) read as vec4: a
// decode step's single row of 2048 took 11 us on the H200 with 128 invocations a float each.
layout(local_size_x = 256) in;
layout(binding = 0) readonly buffer X_ { float x[]; };
layout(binding = 0) readonly buffer X4_ { vec4 x4[]; };
layout(binding = 1) readonly buffer W_ { float w[]; };
layout(binding = 1) readonly buffer W4_ { vec4 w4[]; };
layout(binding = 2) buffer O_ { float o[]; };
layout(binding = 2) buffer O4_ { vec4 o4[]; };
layout(binding = 3) readonly buffer R_ { float resid[]; };
layout(binding = 3) readonly buffer R4_ { vec4 resid4[]; };

// push constants: forge__pc_rmsnorm (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC {
    uint dim, x_row0, out_row0, flags;
    float eps;
    uint heads, row_stride, col0;
    float scale;
} pc;

const uint WG = 256u;
shared float red[WG];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint g = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint xb = (pc.x_row0 + g) * pc.dim, ob = (pc.out_row0 + g) * pc.dim;
    if (pc.heads != 0u) xb = ob = (g / pc.heads) * pc.row_stride + pc.col0 + (g % pc.heads) * pc.dim;
    bool v4 = pc.dim % 4u == 0u && xb % 4u == 0u && ob % 4u == 0u;
    float ss = 0.0;
    if (v4) {
        for (uint i = tid; i < pc.dim / 4u; i += WG) ss += dot(x4[xb / 4u + i], x4[xb / 4u + i]);
    } else {
        for (uint i = tid; i < pc.dim; i += WG) ss += x[xb + i] * x[xb + i];
    }
    red[tid] = ss;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        barrier();
    }
    float inv = 1.0 / sqrt(red[0] / float(pc.dim) + pc.eps);
    if (v4) {
        for (uint i = tid; i < pc.dim / 4u; i += WG) {
            vec4 v = x4[xb / 4u + i] * inv * w4[i];
            if ((pc.flags & 1u) != 0u) v += (pc.flags & 4u) != 0u ? resid4[ob / 4u + i] : o4[ob / 4u + i];
            if ((pc.flags & 2u) != 0u) v *= pc.scale;
            o4[ob / 4u + i] = v;
        }
    } else {
        for (uint i = tid; i < pc.dim; i += WG) {
            float v = x[xb + i] * inv * w[i];
            if ((pc.flags & 1u) != 0u) v += (pc.flags & 4u) != 0u ? resid[ob + i] : o[ob + i];
            if ((pc.flags & 2u) != 0u) v *= pc.scale;
            o[ob + i] = v;
        }
    }
}
