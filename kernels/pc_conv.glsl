// pc_conv.glsl: the push constants of Qwen 3.5's causal convolution (pc), mirrored field for
// field by forge__pc_conv (src/ops.c), which the host pushes whole to conv1d.comp and its
// backward twin conv1d_back.comp (which reads every field but table: training's sequences each
// start at position 0, in their own rows). tools/build_kernels.sh records each module's block
// size (FORGE_SPV_PUSH_BYTES_<module>) and src/ops.c checks it equals sizeof(forge__pc_conv).
layout(push_constant) uniform PC {
    uint n_tokens, channels, taps, in_stride, group_rows, table;
} pc;
