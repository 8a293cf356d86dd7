#version 450
// conv1d_back: the backward twin of conv1d.comp for training, whose sequences each start at
// position 0 (zero state) in their own group of group_rows rows. With
//   y[t, c] = silu(p[t, c]),  p[t, c] = sum_j w[c, j] x[t - (K - 1) + j, c]   (x before the group's first row: 0)
// the input gradient is, over the rows t of s's group,
//   dx[s, c] = sum_j w[c, j] dp[s + (K - 1) - j, c],  dp = dy * silu'(p),  silu'(p) = sig(p) (1 + p (1 - sig(p)))
// p is recomputed from x (K taps a row: cheaper than keeping it). One invocation per (row,
// channel); the weights are frozen (no gradient for them).
// Bindings: 0 x f32 [n, in_stride] (the in-projection's rows: q|k|v are its first `channels` columns)
//           1 w f32 [channels, K] | 2 dy f32 [n, channels] | 3 dx f32 [n, in_stride] (its first `channels` columns written)
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;

layout(binding = 0) readonly buffer I_ { float x[]; };
layout(binding = 1) readonly buffer W_ { float w[]; };
layout(binding = 2) readonly buffer DY_ { float dy[]; };
layout(binding = 3) writeonly buffer DX_ { float dx[]; };

#include "pc_conv.glsl"

// dy * silu'(p) at row t of channel c, the group starting at row0
float dp(uint t, uint c, uint row0) {
    uint K = pc.taps;
    float p = 0.0;
    for (uint j = 0u; j < K; j++)
        if (t + j + 1u >= row0 + K) p += w[c * K + j] * x[(t + j + 1u - K) * pc.in_stride + c];
    float s = 1.0 / (1.0 + exp(-p));
    return dy[t * pc.channels + c] * s * (1.0 + p * (1.0 - s));
}

void main() {
    uint idx = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64u;
    if (idx >= pc.n_tokens * pc.channels) return;
    uint c = idx % pc.channels, s = idx / pc.channels, K = pc.taps;
    uint row0 = s - s % pc.group_rows, end = row0 + pc.group_rows;
    float g = 0.0;
    for (uint j = 0u; j < K; j++) {
        uint t = s + K - 1u - j;
        if (t < end) g += w[c * K + j] * dp(t, c, row0);
    }
    dx[s * pc.in_stride + c] = g;
}
