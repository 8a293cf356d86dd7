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
// the last K - 1 inputs in registers (a prompt of 512 rows: 32 rows an invocation, not 512), four
// rows' loads at a time. (The window and taps indexed by the runtime K sat in local memory: the
// Qwen3.5-2B shape's 512-row prefill took 45 us a layer on the H200.)
// After all have read the old state, the group's last K - 1 inputs become that sequence's state.
// Bindings: 0 params {pos0, n, ...}, batch generation's row table at byte 64 (row t: position, place)
//           1 in f32 [n, in_stride] (the in-projection's rows: q|k|v are its first `channels` columns)
//           2 w f32 [channels, K] | 3 state f32 [places, K - 1, channels] | 4 out f32 [n, channels]
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
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

// One row's output silu(taps . (window, v)); v then joins the window.
float conv_step(inout float win[MAXK - 1u], float wc[MAXK], float v) {
    float s = wc[MAXK - 1u] * v;
    [[unroll]] for (uint j = 0u; j < MAXK - 1u; j++) s += wc[j] * win[j];
    [[unroll]] for (uint j = 0u; j + 1u < MAXK - 1u; j++) win[j] = win[j + 1u];
    win[MAXK - 2u] = v;
    return s / (1.0 + exp(-s));
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
        // the window and the taps right-aligned in MAXK slots (zeros before a shorter kernel's),
        // indexed by constants only: registers, where runtime-K indices put them in local memory
        float win[MAXK - 1u]; // the MAXK - 1 inputs before the current row, oldest first
        float wc[MAXK];
        [[unroll]] for (uint j = 0u; j < MAXK - 1u; j++) win[j] = j + K >= MAXK ? input_row(int(r0 + j + 1u) - int(MAXK)) : 0.0;
        [[unroll]] for (uint j = 0u; j < MAXK; j++) wc[j] = j + K >= MAXK ? w[c * K + j + K - MAXK] : 0.0;
        uint t = r0;
        for (; t + 4u <= r1; t += 4u) { // four rows' loads in flight at once
            float v4[4];
            [[unroll]] for (uint i = 0u; i < 4u; i++) v4[i] = x[(t + i) * pc.in_stride + c];
            [[unroll]] for (uint i = 0u; i < 4u; i++) y[(t + i) * pc.channels + c] = conv_step(win, wc, v4[i]);
        }
        for (; t < r1; t++) y[t * pc.channels + c] = conv_step(win, wc, x[t * pc.in_stride + c]);
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
