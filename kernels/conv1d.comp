#version 450
// conv1d: a linear-attention layer's causal depthwise convolution over time, then SiLU (Qwen 3.5's
// Gated DeltaNet): out[t, c] = silu(sum_j w[c, j] * in[t - (K - 1) + j, c]), j = 0 .. K - 1, where
// the rows before a sequence's first row of the step read its convolution state (the K - 1
// inputs before it; zeros for a sequence whose first row is position 0).
// A workgroup owns 32 channels of one group of rows (one sequence's consecutive rows, taken in
// order: one sequence's step (prefill, decode), a batch of sequences (classify, training: each
// from position 0, in its own place), or batch generation's rows (table != 0: a prompt's rows,
// or one row per sequence, each sequence's position and place from the row table)); its 16 rows
// of invocations split the group's rows into 16 runs, each walking its run with the window of
// the last K - 1 inputs in registers (a prompt of 512 rows: 32 rows an invocation, not 512).
// After all have read the old state, the group's last K - 1 inputs become that sequence's state.
// Bindings: 0 params {pos0, n, ...}, batch generation's row table at byte 64 (row t: position, place)
//           1 in f32 [n, in_stride] (the in-projection's rows: q|k|v are its first `channels` columns)
//           2 w f32 [channels, K] | 3 state f32 [places, K - 1, channels] | 4 out f32 [n, channels]
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 32, local_size_y = 16) in;

layout(binding = 0) readonly buffer P_ { uint pos0; uint n_tok; uint tab[]; } params;
const uint TAB = 14; // the row table at byte 64
layout(binding = 1) readonly buffer I_ { float x[]; };
layout(binding = 2) readonly buffer W_ { float w[]; };
layout(binding = 3) buffer S_ { float state[]; };
layout(binding = 4) writeonly buffer O_ { float y[]; };

#include "pc_conv.glsl"

const uint MAXK = 8u, RUNS = 16u; // MAXK: FORGE__MAX_LINEAR_CONV

uint c, row0, sb, pos, K;

// The input of row r of the group's sequence: x, or for the K - 1 rows before the group the
// state (zeros for a sequence that starts at position 0).
// (r is signed: the rows before the group of row 0 are negative)
float input_row(int r) {
    if (r >= int(row0)) return x[uint(r) * pc.in_stride + c];
    return pos == 0u ? 0.0 : state[sb + uint(r + int(K) - 1 - int(row0)) * pc.channels];
}

void main() {
    c = gl_WorkGroupID.x * 32u + gl_LocalInvocationID.x;
    uint g = gl_WorkGroupID.y, run = gl_LocalInvocationID.y;
    bool live = c < pc.channels;
    row0 = g * pc.group_rows;
    K = pc.taps;
    uint place = pc.table != 0u ? params.tab[TAB + 2u * row0 + 1u] : g;
    pos = pc.table != 0u ? params.tab[TAB + 2u * row0] : params.pos0;
    sb = place * (K - 1u) * pc.channels + c;
    uint len = (pc.group_rows + RUNS - 1u) / RUNS, r0 = row0 + run * len, r1 = min(row0 + pc.group_rows, r0 + len);
    if (live && r0 < r1) {
        float win[MAXK]; // win[0 .. K-2]: the inputs before the current row, oldest first
        for (uint j = 0u; j + 1u < K; j++) win[j] = input_row(int(r0 + j + 1u) - int(K));
        float wc[MAXK];
        for (uint j = 0u; j < K; j++) wc[j] = w[c * K + j];
        for (uint t = r0; t < r1; t++) {
            float v = x[t * pc.in_stride + c];
            float s = wc[K - 1u] * v;
            for (uint j = 0u; j + 1u < K; j++) s += wc[j] * win[j];
            y[t * pc.channels + c] = s / (1.0 + exp(-s));
            for (uint j = 0u; j + 2u < K; j++) win[j] = win[j + 1u];
            if (K > 1u) win[K - 2u] = v;
        }
    }
    // the group's last K - 1 inputs, read before any is written (they may be old state), then stored
    float last[MAXK];
    uint end = row0 + pc.group_rows;
    if (live && run == 0u)
        for (uint j = 0u; j + 1u < K; j++) last[j] = input_row(int(end + j + 1u) - int(K));
    barrier();
    if (live && run == 0u)
        for (uint j = 0u; j + 1u < K; j++) state[sb + j * pc.channels] = last[j];
}
