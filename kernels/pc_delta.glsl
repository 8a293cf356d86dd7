// pc_delta.glsl: the push constants of Qwen 3.5's gated delta rule (pc), mirrored field for
// field by forge__pc_delta (src/ops.c), which the host pushes whole to delta_rule.comp,
// delta_rule_sg.comp, gated_norm.comp, delta_rule_prep.comp, delta_rule_chunk.comp and to the
// backward kernels of what it computes: delta_rule_back.comp (every field but table) and
// l2norm_back.comp (n_tokens, the heads and their dims, v_tiled). chunk: delta_rule_back's rows
// between two of its checkpoints; the chunked form's rows a chunk (<= 64); 0 elsewhere.
// tools/build_kernels.sh records each module's block size (FORGE_SPV_PUSH_BYTES_<module>) and
// src/ops.c checks it equals sizeof(forge__pc_delta).
layout(push_constant) uniform PC {
    uint n_tokens, k_heads, v_heads, k_dim, v_dim, group_rows, table;
    uint mix_stride, z_off, b_off, a_off;   // the in-projection's row: z, b and a columns
    float eps;                              // the gated norm's
    uint v_tiled;                           // value head h reads key head h % k_heads (llama.cpp's order), not h / (v_heads / k_heads)
    uint lanes;                             // delta_rule_sg: invocations a state column (1, 2, 4 or 8; k_dim / lanes <= 32, at most the subgroup's width)
    uint chunk;                             // delta_rule_back, delta_rule_prep / _chunk
} pc;
