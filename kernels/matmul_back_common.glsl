// matmul_back_common.glsl: what matmul_back.comp and matmul_back_big.comp share before their
// tiles: 256 threads a workgroup, the push constants (pc), the weight reader of any format
// (weights.glsl, W at binding 1, MLX scales and biases at 3 and 4) and bindings 0 dY f32
// [*, ldy] and 2 C f32 [*, ldc] (in/out). The kernel enables GL_GOOGLE_include_directive (and
// any extension of its own) before including this.
// The push constants are mirrored field for field by forge__pc_back (src/ops.c), which the host
// pushes whole to both kernels; tools/build_kernels.sh records each module's block size
// (FORGE_SPV_PUSH_BYTES_<module>) and src/ops.c checks it equals sizeof(forge__pc_back).
// flags: 1 accumulate into C; 2 (matmul_back's MOE build) dY rows times their pair's weight.
layout(local_size_x = 256) in;

layout(push_constant) uniform PC {
    uint M, K, N, y_col0, ldy, ldc, c_col0, flags;
    uint qbits, qgroup, qflags;   // MLX affine: bits, group size, 1 = bf16 scales
    uint e0, n_exp, order_off, y_div; // matmul_back's MOE build: the chunk's experts, the sorted pairs in binding 5, dY row = pair / y_div
} pc;

#include "common.glsl"
#define W_BINDING 1
#define AUX0_BINDING 3
#define AUX1_BINDING 4
#define QBITS pc.qbits
#define QGROUP pc.qgroup
#define QFLAGS pc.qflags
#include "weights.glsl"

layout(binding = 0) readonly buffer Y_ { float dy[]; };
layout(binding = 2) buffer C_ { float c[]; };
