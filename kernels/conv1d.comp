#version 450
// conv1d: a linear-attention layer's causal depthwise convolution over time, then SiLU (Qwen 3.5's
// Gated DeltaNet): out[t, c] = silu(sum_j w[c, j] * in[t - (K - 1) + j, c]), j = 0 .. K - 1, where
// the rows before a sequence's first row of the step read its convolution state (the K - 1
// inputs before it; zeros for a sequence whose first row is position 0).
// An invocation owns one channel c of one group of rows (one sequence's consecutive rows, taken in
// order, the window of the last K - 1 inputs in registers) and leaves the group's last K - 1
// inputs as that sequence's state. Groups of group_rows rows: one sequence's step (prefill,
// decode), a batch of sequences (classify, training: each from position 0, in its own place), or
// batch generation's rows (table != 0: a prompt's rows, or one row per sequence, each sequence's
// position and place from the row table).
// Bindings: 0 params {pos0, n, ...}, batch generation's row table at byte 64 (row t: position, place)
//           1 in f32 [n, in_stride] (the in-projection's rows: q|k|v are its first `channels` columns)
//           2 w f32 [channels, K] | 3 state f32 [places, K - 1, channels] | 4 out f32 [n, channels]
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;

layout(binding = 0) readonly buffer P_ { uint pos0; uint n_tok; uint tab[]; } params;
const uint TAB = 14; // the row table at byte 64
layout(binding = 1) readonly buffer I_ { float x[]; };
layout(binding = 2) readonly buffer W_ { float w[]; };
layout(binding = 3) buffer S_ { float state[]; };
layout(binding = 4) writeonly buffer O_ { float y[]; };

#include "pc_conv.glsl"

const uint MAXK = 8u; // FORGE__MAX_LINEAR_CONV

void main() {
    uint c = gl_GlobalInvocationID.x;
    uint g = gl_GlobalInvocationID.y;
    if (c >= pc.channels || (g + 1u) * pc.group_rows > pc.n_tokens) return;
    uint row0 = g * pc.group_rows, K = pc.taps;
    uint place = pc.table != 0u ? params.tab[TAB + 2u * row0 + 1u] : g;
    uint pos = pc.table != 0u ? params.tab[TAB + 2u * row0] : params.pos0;
    uint sb = place * (K - 1u) * pc.channels + c;
    float win[MAXK]; // win[0 .. K-2]: the inputs before the current row, oldest first
    for (uint j = 0u; j + 1u < K; j++) win[j] = pos == 0u ? 0.0 : state[sb + j * pc.channels];
    float wc[MAXK];
    for (uint j = 0u; j < K; j++) wc[j] = w[c * K + j];
    for (uint t = row0; t < row0 + pc.group_rows; t++) {
        float v = x[t * pc.in_stride + c];
        float s = wc[K - 1u] * v;
        for (uint j = 0u; j + 1u < K; j++) s += wc[j] * win[j];
        y[t * pc.channels + c] = s / (1.0 + exp(-s));
        for (uint j = 0u; j + 2u < K; j++) win[j] = win[j + 1u];
        if (K > 1u) win[K - 2u] = v;
    }
    for (uint j = 0u; j + 1u < K; j++) state[sb + j * pc.channels] = win[j];
}
