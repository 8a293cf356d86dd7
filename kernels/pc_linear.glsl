// pc_linear.glsl: the push constants of the matrix-product kernels (pc), mirrored field for
// field by forge__pc_linear (src/ops.c), which the host pushes whole to every one of them:
// matvec.comp, matvec_sg.comp, matvec_q8a.comp, matmul.comp, matmul_big.comp, matmul_cm.comp
// and linear_reduce.comp. One block for all: a kernel reads the fields it needs and leaves the
// rest. tools/build_kernels.sh records each module's block size (FORGE_SPV_PUSH_BYTES_<module>)
// and src/ops.c checks it equals sizeof(forge__pc_linear): a field goes into both, in the same place.
layout(push_constant) uniform PC {
    uint M, K, N, a_row0, ldc, c_col0, flags, bias_off;
    float softcap;                // flags 4: tanh(v / softcap) * softcap
    uint qbits, qgroup, qflags;   // MLX affine: bits, group size, 1 = bf16 scales
    float eps;                    // matvec_sg, matvec_q8a PRENORM: the norm's epsilon
    uint rows_per_wg;             // matvec_sg, one token: outputs per workgroup (<= MAX_R), K split; 0: one a subgroup
    uint k_split;                 // matmul, matmul_cm with flags 64: k per split; linear_reduce: the number of splits
    uint e0, n_exp, top_k, a_div; // matvec_sg EXPERTS, matmul MOE: the chunk's experts e0 .. e0 + n_exp - 1,
                                  // (choices per token: read by neither), the divisor from a pair to its A row
    uint order_off;               // matmul MOE: where the sorted pairs start in binding 6 (words)
} pc;
