// pc_act.glsl: the push constants of the gated MLP's middle (pc), mirrored field for field by
// forge__pc_act (src/ops.c), which the host pushes whole to both kernels that use it:
// act_mul.comp and act_mul_back.comp (which knows no layout 3).
// tools/build_kernels.sh records each module's block size (FORGE_SPV_PUSH_BYTES_<module>) and
// src/ops.c checks it equals sizeof(forge__pc_act).
// layout_: forge__pc_act's `layout` (a GLSL keyword): 1 gate|up pairs, 2 halves, 3 apart (act_mul
// only), 4 apart the other way; act: 0 SiLU, 1 GELU, 2 sigmoid, + 8 rows times sigmoid(a scalar).
layout(push_constant) uniform PC {
    uint count, act, layout_, ffn;
    uint up_stride, up_col0;   // layouts 3 and 4, act + 8: the rows of act_mul's binding 2 (act_mul_back's 3 and 4)
} pc;
