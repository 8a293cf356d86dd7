#version 450
// l2norm_back: the backward twin of the L2 norms of q and k in delta_rule.comp, for training:
//   q = l2norm(q_raw) / sqrt(k_dim),  k = l2norm(k_raw),  l2norm(x) = x / sqrt(sum x^2 + 1e-6)
// delta_rule_back.comp leaves the gradients of each value head's q and k; a key head serves
// v_heads / k_heads value heads (consecutive ones, or with v_tiled every k_heads-th: llama.cpp's
// order), so g, their sum over those heads, is the gradient of the key head's vector, and that
// of its raw input is
//   dx = s (r g - x r^3 sum(g x)),  r = 1 / sqrt(sum x^2 + 1e-6),  s = 1 / sqrt(k_dim) for q, 1 for k
// One workgroup per (row, key head, q or k): x = qkv[t, (which * k_heads + kh) * k_dim ..].
// Bindings: 0 qkv f32 [n, conv_dim] (conv1d's output: q | k | v) | 1 dqk f32 [n, v_heads, 2, k_dim] (dq, dk per value head)
//           2 dqkv f32 [n, conv_dim] (the q and k columns written)
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;

layout(binding = 0) readonly buffer Q_ { float qkv[]; };
layout(binding = 1) readonly buffer G_ { float dqk[]; };
layout(binding = 2) writeonly buffer D_ { float dqkv[]; };

#include "pc_delta.glsl"

const uint WG = 64u;
shared float red[2][WG];

// the j-th of the per value heads key head kh serves
uint head(uint kh, uint j, uint per) { return pc.v_tiled != 0u ? kh + j * pc.k_heads : kh * per + j; }

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint id = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint which = id % 2u, kh = (id / 2u) % pc.k_heads, t = id / (2u * pc.k_heads);
    if (t >= pc.n_tokens) return;
    uint DK = pc.k_dim, per = pc.v_heads / pc.k_heads, conv_dim = 2u * pc.k_heads * DK + pc.v_heads * pc.v_dim;
    uint xb = t * conv_dim + (which * pc.k_heads + kh) * DK;
    float ss = 0.0, sg = 0.0;
    for (uint i = tid; i < DK; i += WG) {
        float g = 0.0;
        for (uint j = 0u; j < per; j++) g += dqk[((t * pc.v_heads + head(kh, j, per)) * 2u + which) * DK + i];
        float xv = qkv[xb + i];
        ss += xv * xv;
        sg += g * xv;
    }
    red[0][tid] = ss;
    red[1][tid] = sg;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (tid < s) {
            red[0][tid] += red[0][tid + s];
            red[1][tid] += red[1][tid + s];
        }
        barrier();
    }
    float r = inversesqrt(red[0][0] + 1e-6), sc = which == 0u ? inversesqrt(float(DK)) : 1.0;
    float k = r * r * r * red[1][0];
    for (uint i = tid; i < DK; i += WG) {
        float g = 0.0;
        for (uint j = 0u; j < per; j++) g += dqk[((t * pc.v_heads + head(kh, j, per)) * 2u + which) * DK + i];
        dqkv[xb + i] = sc * (r * g - qkv[xb + i] * k);
    }
}
