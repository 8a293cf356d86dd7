/* src/ops.c: Op table.
 * Owns: forge__ops (one row per kernel), push-constant structs, pipelines, descriptor
 * sets and forge__dispatch (recording, or counting before recording).
 * May call: base.c, files.c, device.c.
 *
 * One row per kernel: its SPIR-V (embedded), binding count, push-constant size and pinned
 * specialization constants. Pipelines are created on first use, under the model's lock, and
 * shared by all sessions. Recording goes through forge__dispatch, which can also run in a
 * counting mode: a command buffer's descriptor pool is sized exactly before it is recorded.
 */

/* Push constants, mirroring the `PC` blocks of the kernels field for field: a family that several
 * kernels share is declared once in kernels/pc_*.glsl (or matmul_back_common.glsl), the others in
 * their kernel. The host pushes the whole struct; each module's block is checked to be exactly
 * its size (the static asserts after forge__ops, and tests/test_push_constants.cpp per op row). */
typedef struct forge__pc_linear {   /* kernels/pc_linear.glsl: matvec, matvec_sg, matvec_q8a, matmul (_big, _cm), linear_reduce */
    uint32_t M, K, N, a_row0, ldc, c_col0, flags, bias_off;
    float softcap;
    uint32_t qbits, qgroup, qflags; /* MLX affine */
    float eps;                      /* matvec_sg PRENORM */
    uint32_t rows_per_wg;           /* matvec_sg, one token: outputs per workgroup */
    uint32_t k_split;               /* matmul with FORGE__LINEAR_SPLIT_K: k per split; ..._REDUCE: splits */
    /* mixture of experts (matvec_sg EXPERTS, matmul_moe): the chunk's experts e0 ..
     * e0 + n_exp - 1, choices per token, the divisor from a pair to its A row, and (matmul_moe)
     * where the sorted pairs start in the group table */
    uint32_t e0, n_exp, top_k, a_div, order_off;
} forge__pc_linear;
typedef struct forge__pc_act_q8 {   /* act_q8.comp */
    uint32_t K, a_row0, flags;      /* flags: FORGE__LINEAR_PRENORM */
} forge__pc_act_q8;
typedef struct forge__pc_act_f16 {  /* act_f16.comp: rows a_row0 .. a_row0 + M of [*, K] */
    uint32_t K, a_row0, M;
    uint32_t ld, col0, width;       /* act_f16_scaled: the source's row stride, first column and values a row (K: width rounded up to 8) */
} forge__pc_act_f16;
typedef struct forge__pc_embed {    /* embed.comp */
    uint32_t n_tokens, hidden, row_begin, row_count;
    float scale;
    uint32_t round_mode;
    uint32_t qbits, qgroup, qflags; /* MLX affine */
} forge__pc_embed;
typedef struct forge__pc_rmsnorm {  /* rmsnorm.comp */
    uint32_t dim, x_row0, out_row0, flags;   /* flags: 1 add to out, 2 then times scale */
    float eps;
    uint32_t heads, row_stride, col0;   /* per-head norms over the fused qkv rows */
    float scale;
} forge__pc_rmsnorm;
#define FORGE__NORM_ADD 1u
#define FORGE__NORM_RESID 4u /* (with ADD) add binding 3's row, not out's */
#define FORGE__NORM_SCALE 2u
typedef struct forge__pc_rope {     /* rope.comp */
    uint32_t n_tokens, n_heads, n_kv_heads, head_dim, adjacent, cache_slots, stride, k_off, v_off;
    uint32_t seq_len;               /* training batches: tokens per sequence (0: one sequence) */
    uint32_t table;                 /* batch generation: positions and sequences from the row table */
} forge__pc_rope;
typedef struct forge__pc_attention { /* kernels/pc_attention.glsl: attention_tiled, _split, _cm, _decode (n_splits: the split ones) */
    uint32_t n_tokens, n_heads, n_kv_heads, head_dim, cache_slots, window;
    float scale, softcap;
    uint32_t n_splits;
    uint32_t q_stride;              /* floats between two tokens' query rows (the fused qkv rows) */
    uint32_t kv_batch_stride;       /* training: floats between two sequences' K (and V) rows */
    uint32_t flags;                 /* 1: write each query's log-sum-exp (training); 2: the row table (batch generation);
                                     * attention_decode: FORGE__ATTN_ROPE_* */
    float eps;                      /* attention_decode, FORGE__ATTN_QK_NORM: the head norms' */
    uint32_t min_run;               /* attention_decode: keys a workgroup takes at least (below one round: one round) */
} forge__pc_attention;
/* attention_decode.comp rotates one token's query itself (q from the raw q | k | v row), in
 * adjacent pairs, and takes the new key and value from that row too (writing them to the cache) */
#define FORGE__ATTN_ROPE_Q 4u
#define FORGE__ATTN_ROPE_ADJACENT 8u
#define FORGE__ATTN_ROPE_KEY 16u
/* ... and RMS-norms the query and key heads first (q_norm, k_norm), and the value head (no weight) */
#define FORGE__ATTN_QK_NORM 32u
#define FORGE__ATTN_V_NORM 64u
/* attention_decode merges its runs itself (the last workgroup of a head to finish), instead of
 * attention_combine after it; and writes row 0 as the o projection's int8 input too */
#define FORGE__ATTN_MERGE 128u
#define FORGE__ATTN_MERGE_Q8 256u
/* bidirectional attention (FORGE__OUT_POOL_*, embedding models): no causal rule, the keys of
 * each sequence's real rows (the row table), a window on both sides (attention_tiled.comp,
 * attention_cm.comp) */
#define FORGE__ATTN_BIDIRECTIONAL 512u
typedef struct forge__pc_pool {     /* pool_mean.comp */
    uint32_t rows_per_text, hidden;
} forge__pc_pool;
typedef struct forge__pc_combine {   /* attention_combine.comp */
    uint32_t n_heads, head_dim, n_splits;
    uint32_t flags;                 /* 1: row 0 also as int8 blocks (the o projection's act_q8) */
} forge__pc_combine;

#define FORGE__ATTN_SPLITS 64       /* workgroups per head of the decode attention (at most; forge__attn_splits) */
#define FORGE__ATTN_SPLITS_BATCH 16 /* ... per head and sequence of a batched decode step */
_Static_assert(FORGE__ATTN_SPLITS <= 64 && FORGE__ATTN_SPLITS_BATCH <= FORGE__ATTN_SPLITS, "attention_merge.glsl merges at most 64 splits");
#ifndef FORGE__ATTN_SPLITS_CPU
#define FORGE__ATTN_SPLITS_CPU 2    /* ... on CPU devices */
#endif
typedef struct forge__pc_act {      /* kernels/pc_act.glsl: act_mul.comp, act_mul_back.comp */
    uint32_t count, act, layout, ffn;   /* layout: 1 gate|up pairs, 2 halves (gates, then ups), 3 apart, 4 apart the other way */
    uint32_t up_stride, up_col0;        /* layouts 3 and 4: the other operand's rows */
} forge__pc_act;
#define FORGE__GU_PAIRS 1u
#define FORGE__GU_HALVES 2u
#define FORGE__GU_APART 3u
#define FORGE__GU_APART_GATE 4u  /* the ups in binding 1, the gates in other rows (act_mul: binding 2; act_mul_back: 3, their gradient 4):
                                  * Qwen 3.5's attention output gate */
#define FORGE__ACT_SIGMOID 2u    /* act_mul's act beside forge__act's SiLU and GELU */
#define FORGE__ACT_ROW_SIGMOID 8u /* act_mul, added to act: every row times sigmoid(binding 2's scalar of the row) */
typedef struct forge__pc_conv {     /* kernels/pc_conv.glsl: conv1d.comp, conv1d_back.comp */
    uint32_t n_tokens, channels, taps, in_stride;
    uint32_t group_rows;            /* rows per sequence of the step (conv1d.comp's groups) */
    uint32_t table;                 /* batch generation: positions and places from the row table */
} forge__pc_conv;
typedef struct forge__pc_delta {    /* kernels/pc_delta.glsl: delta_rule(_sg).comp, gated_norm.comp, delta_rule_back.comp, l2norm_back.comp */
    uint32_t n_tokens, k_heads, v_heads, k_dim, v_dim, group_rows, table;
    uint32_t mix_stride, z_off, b_off, a_off; /* the in-projection's row: z, b and a columns */
    float eps;
    uint32_t v_tiled;               /* value head h reads key head h % k_heads (llama.cpp's order), not h / (v_heads / k_heads) */
    uint32_t lanes;                 /* delta_rule_sg: invocations a state column */
    uint32_t chunk;                 /* delta_rule_back: rows between its checkpoints; delta_rule_prep / _chunk: a chunk's rows */
} forge__pc_delta;
typedef struct forge__pc_moe_route { /* moe_route.comp */
    uint32_t n_experts, top_k, flags;   /* flags: 1 renormalize the chosen weights, 2 times expert_scale */
    uint32_t n_tokens;
} forge__pc_moe_route;
typedef struct forge__pc_moe_group { /* moe_group.comp */
    uint32_t n_pairs, n_experts, bm, order_off;
} forge__pc_moe_group;
typedef struct forge__pc_moe_combine { /* moe_combine.comp */
    uint32_t n_tokens, dim, top_k, flags; /* flags: 1 add to out, 2 every weight 1 (training: the pairs' input gradients summed) */
} forge__pc_moe_combine;
typedef struct forge__pc_moe_route_back { /* moe_route_back.comp */
    uint32_t n_experts, top_k, flags;   /* flags: 1 the chosen weights were renormalized; 4 the shared expert's gate instead */
    uint32_t n_tokens, dim;
} forge__pc_moe_route_back;

/* The backward kernels (training) */
typedef struct forge__pc_back {     /* kernels/matmul_back_common.glsl: matmul_back(_big).comp, C (+)= dY . W */
    uint32_t M, K, N, y_col0, ldy, ldc, c_col0, flags; /* flags: 1 accumulate, 2 (MOE) dY rows times their pair's weight */
    uint32_t qbits, qgroup, qflags;
    uint32_t e0, n_exp, order_off, y_div; /* matmul_back_moe: the chunk's experts, moe_group.comp's table, dY row = pair / y_div */
} forge__pc_back;
typedef struct forge__pc_gemm {     /* gemm.comp: C(m, n) (+)= alpha sum_k A(m, k) B(k, n), strided */
    uint32_t M, N, K;
    uint32_t a_off, a_sm, a_sk;
    uint32_t b_off, b_sk, b_sn;
    uint32_t c_off, c_sm, c_sn;
    float alpha;
    uint32_t accumulate;
    uint32_t drop_on, drop_ld, drop_stream, drop_threshold;
    float drop_scale;
    uint32_t splits, k_chunk, reduce;   /* split-K: partial sums per split, then a reduction */
} forge__pc_gemm;
typedef struct forge__pc_norm_back { /* rmsnorm_back.comp */
    uint32_t dim, flags;
    float eps;
    uint32_t heads, row_stride, col0;
} forge__pc_norm_back;
typedef struct forge__pc_rope_back { /* rope_back.comp */
    uint32_t n_tokens, n_heads, n_kv_heads, head_dim, adjacent, stride, k_off, seq_len;
} forge__pc_rope_back;
typedef struct forge__pc_attn_back { /* attention_back.comp */
    uint32_t n_tokens, n_heads, n_kv_heads, head_dim, window;
    float scale, softcap;
    uint32_t q_stride, k_off, v_off, kv_batch_stride, n_rows, mode;
} forge__pc_attn_back;
typedef struct forge__pc_loss {     /* loss.comp */
    uint32_t n, row0, rows, mode, flags;
    float softcap;
} forge__pc_loss;
typedef struct forge__pc_adamw {    /* adamw.comp */
    uint32_t count, mode, part0, n_parts;
} forge__pc_adamw;
#define FORGE__ADAMW_PER_WG 4096    /* adamw.comp PER_WG: elements summed per workgroup (mode 0) */
typedef struct forge__pc_merge {    /* lora_merge.comp */
    uint32_t K, n_elems, chunk_row0, t_row0, t_rows, row_step, row_phase, rank, a_el, b_el, fmt;
    float scale;
} forge__pc_merge;

#define FORGE__LINEAR_BIAS 1u
#define FORGE__LINEAR_ACCUMULATE 2u
#define FORGE__LINEAR_SOFTCAP 4u
#define FORGE__LINEAR_PRENORM 8u    /* matvec_sg: RMS-normalize A first (the block's norm fused in) */
#define FORGE__LINEAR_GATED 16u     /* matvec_sg: interleaved gate/up rows, output act(gate) * up */
#define FORGE__LINEAR_GELU 32u      /* with GATED: GELU-tanh instead of SiLU */
#define FORGE__LINEAR_SPLIT_K 64u   /* matmul: one split of k into partial sums (batch decode) */
#define FORGE__LINEAR_Q8_OUT 128u    /* forge__linear_q8a: also quantize the output row for the next product (the _out modules) */
#define FORGE__LINEAR_QUANTIZED 256u /* forge__linear (host only): x is already in p->act_q8 (the attention's merge wrote it) */
#define FORGE__LINEAR_EXPERTS 512u   /* matvec_sg: one expert's product per (token, choice) pair (workgroup z) */
#define FORGE__LINEAR_Q8_OUT_NORM 1024u /* matvec_q8a with Q8_OUT: the output times the next norm's weight, with its squares */
#define FORGE__LINEAR_QUANTIZED_RES 2048u /* forge__linear_q8a (host only): x (normed) is in p->act_q8_res (a product's Q8_OUT wrote it) */
#define FORGE__LINEAR_A_G8 4096u     /* forge__linear_q8a (host only): the int8 activations come in groups of 8 (a product's
                                      * Q8_OUT wrote them): the matvec_q8a_g8 modules */

/* Weight storage formats the matrix kernels read, dequantizing in the kernel; one kernel
 * variant each (kernels/weights.glsl). */
typedef enum forge__wfmt {
    FORGE__W_F32 = 0, FORGE__W_F16, FORGE__W_BF16,
    FORGE__W_Q4_0, FORGE__W_Q8_0, FORGE__W_Q4_K, FORGE__W_Q6_K, /* llama.cpp blocks */
    FORGE__W_MLX,                                                 /* MLX affine, bits and group per weight */
    FORGE__W_COUNT
} forge__wfmt;
/* The tensor type each format stores as it is in the file (MLX affine: codes with separate
 * scales and biases, no one type) */
static const forge__dtype forge__wfmt_dtype[FORGE__W_COUNT] = {
    [FORGE__W_F32] = FORGE__F32,   [FORGE__W_F16] = FORGE__F16,   [FORGE__W_BF16] = FORGE__BF16, [FORGE__W_Q4_0] = FORGE__Q4_0,
    [FORGE__W_Q8_0] = FORGE__Q8_0, [FORGE__W_Q4_K] = FORGE__Q4_K, [FORGE__W_Q6_K] = FORGE__Q6_K, [FORGE__W_MLX] = FORGE__DTYPE_INVALID};

typedef enum forge__op {
    FORGE__OP_EMBED,                                   /* + forge__wfmt */
    FORGE__OP_MATVEC = FORGE__OP_EMBED + FORGE__W_COUNT,
    FORGE__OP_MATVEC_SG = FORGE__OP_MATVEC + FORGE__W_COUNT,
    FORGE__OP_MATMUL = FORGE__OP_MATVEC_SG + FORGE__W_COUNT,
    FORGE__OP_MATMUL_BIG = FORGE__OP_MATMUL + FORGE__W_COUNT,  /* 128 x 128 tiles, for products that fill the device */
    FORGE__OP_MATMUL_CM = FORGE__OP_MATMUL_BIG + FORGE__W_COUNT, /* tensor cores (VK_NV_cooperative_matrix) */
    FORGE__OP_MATMUL_S = FORGE__OP_MATMUL_CM + FORGE__W_COUNT,   /* 32 x 128 tiles, for batch decode's few rows */
    FORGE__OP_MATMUL_MOE = FORGE__OP_MATMUL_S + FORGE__W_COUNT,  /* experts' products grouped by expert (moe_group.comp's tiles) */
    FORGE__OP_MATMUL_MOE_S = FORGE__OP_MATMUL_MOE + FORGE__W_COUNT, /* the same in 32 x 128 tiles: experts of few pairs each */
    FORGE__OP_MATMUL_CM_S = FORGE__OP_MATMUL_MOE_S + FORGE__W_COUNT, /* tensor cores, <= 32 rows of f16 weights: batch decode */
    FORGE__OP_MATMUL_CM_MOE,      /* + forge__wfmt: experts' products on tensor cores (moe_group.comp's 32-pair tiles) */
    FORGE__OP_MATMUL_CM_MOE_LAST = FORGE__OP_MATMUL_CM_MOE + FORGE__W_COUNT - 1,
    FORGE__OP_MATMUL_CM_BACK,     /* + forge__wfmt: training's input gradients through frozen weights on tensor cores */
    FORGE__OP_MATMUL_CM_BACK_LAST = FORGE__OP_MATMUL_CM_BACK + FORGE__W_COUNT - 1,
    /* matvec_sg with a post-attention norm added to its input first (F32, F16, BF16: + forge__wfmt) */
    FORGE__OP_MATVEC_SG_POST,
    FORGE__OP_MATVEC_SG_POST_LAST = FORGE__OP_MATVEC_SG_POST + FORGE__W_BF16,
    /* ... with two rows a subgroup (F32, F16, BF16: + forge__wfmt), forge__matvec_pairs */
    FORGE__OP_MATVEC_SG_PAIR,
    FORGE__OP_MATVEC_SG_PAIR_LAST = FORGE__OP_MATVEC_SG_PAIR + FORGE__W_BF16,
    /* decode products of Q4_0 (+ 0) or Q8_0 (+ 4) weights on int8 activations (integer dot
     * products); in a layer's chain (forge__q8_chain) + 2: on a product's activations in groups of
     * 8 (FORGE__LINEAR_A_G8), + 1: quantizing the output for the next product (FORGE__LINEAR_Q8_OUT);
     * + 8: gated, two outputs a subgroup (forge__matvec_pairs) */
    FORGE__OP_MATVEC_Q8A,
    FORGE__OP_MATVEC_Q8A_LAST = FORGE__OP_MATVEC_Q8A + 15,
    /* ... of 2 to FORGE__MATVEC_MAX_M tokens, Q4_0 (+ 0) or Q8_0 (+ 1): the weights read once for all */
    FORGE__OP_MATVEC_Q8A_ROWS,
    FORGE__OP_MATVEC_Q8A_ROWS_LAST = FORGE__OP_MATVEC_Q8A_ROWS + 1,
    FORGE__OP_RMSNORM,
    FORGE__OP_ROPE,
    FORGE__OP_ATTENTION,          /* prefill: tiles of 8 queries x 16 keys */
    FORGE__OP_ATTN_SPLIT,         /* decode: keys split over workgroups (devices without subgroup arithmetic) */
    FORGE__OP_ATTN_DECODE,        /* ... the same on subgroups */
    FORGE__OP_ATTN_COMBINE,
    FORGE__OP_ACT_MUL,
    FORGE__OP_PENALTY,
    FORGE__OP_TOPK,
    FORGE__OP_TOPK_MERGE,
    FORGE__OP_ACT_Q8,             /* one token's activations as int8 blocks, matvec_q8a's input */
    FORGE__OP_ACT_F16,            /* rows of activations in f16, matmul_cm's input */
    FORGE__OP_ACT_F16_SCALED,     /* ... rows of gradients, each by a power of two (matmul_cm_back's input) */
    FORGE__OP_ATTN_CM,            /* prefill attention on tensor cores, heads of 64 (+ 1: 128, + 2: 256) over an f16 cache */
    FORGE__OP_ATTN_CM_128,
    FORGE__OP_ATTN_CM_256,
    FORGE__OP_ATTN_CM_KV8,        /* the same three over a q8_0 cache */
    FORGE__OP_ATTN_CM_128_KV8,
    FORGE__OP_ATTN_CM_256_KV8,
    FORGE__OP_LINEAR_REDUCE,      /* a product split along k: the partial sums added up, then the epilogue */
    FORGE__OP_ROPE_KV16,          /* rope and the attention kernels on an f16 KV cache (forge_session_params.kv_type) */
    FORGE__OP_ATTENTION_KV16,
    FORGE__OP_ATTN_SPLIT_KV16,
    FORGE__OP_ATTN_DECODE_KV16,
    FORGE__OP_ROPE_SHIFT_KV16,    /* the context shift's re-rotation of an f16 K cache (rope_back.comp) */
    FORGE__OP_ROPE_KV8,           /* the same five on a q8_0 KV cache */
    FORGE__OP_ATTENTION_KV8,
    FORGE__OP_ATTN_SPLIT_KV8,
    FORGE__OP_ATTN_DECODE_KV8,
    FORGE__OP_ROPE_SHIFT_KV8,
    FORGE__OP_MOE_ROUTE,          /* mixture of experts: each token's experts and weights, */
    FORGE__OP_MOE_GROUP,          /* the prefill's pairs grouped by expert, */
    FORGE__OP_MOE_COMBINE,        /* and the experts' outputs weighted and summed */
    FORGE__OP_CONV1D,             /* Qwen 3.5's linear attention: the causal convolution of q|k|v, */
    FORGE__OP_DELTA_RULE,         /* then the gated delta rule and the gated norm, */
    FORGE__OP_DELTA_RULE_SG,      /* or the rule with the state in registers (subgroup shuffles) */
    FORGE__OP_GATED_NORM,         /* and then the gated norm; */
    FORGE__OP_DELTA_RULE_PREP,    /* or, over a prompt, the chunked form: each chunk's state-free part, */
    FORGE__OP_DELTA_RULE_CHUNK,   /* then the walk over the chunks (and the gated norm after) */
    /* training: the backward twins and the optimizer */
    FORGE__OP_MATMUL_BACK,                             /* + forge__wfmt */
    FORGE__OP_MATMUL_BACK_BIG = FORGE__OP_MATMUL_BACK + FORGE__W_COUNT, /* 128 x 128 tiles */
    FORGE__OP_MATMUL_BACK_MOE = FORGE__OP_MATMUL_BACK_BIG + FORGE__W_COUNT, /* experts' input gradients grouped by expert (moe_group.comp's tiles) */
    FORGE__OP_GEMM = FORGE__OP_MATMUL_BACK_MOE + FORGE__W_COUNT,
    FORGE__OP_GEMM_RANK,          /* + 2 shape (forge__rank_shape) + (rank > 16): the low-rank shapes of gemm's products */
    FORGE__OP_RMSNORM_BACK = FORGE__OP_GEMM_RANK + 6,
    FORGE__OP_ROPE_BACK,
    FORGE__OP_ATTN_BACK,
    FORGE__OP_ACT_MUL_BACK,
    FORGE__OP_MOE_ROUTE_BACK,     /* mixture of experts: the router's (and the shared expert's gate's) gradient */
    FORGE__OP_CONV1D_BACK,        /* Qwen 3.5's linear attention: the convolution, */
    FORGE__OP_DELTA_RULE_BACK,    /* the gated norm, delta rule and gates, */
    FORGE__OP_L2NORM_BACK,        /* and the L2 norms of q and k */
    FORGE__OP_LOSS,
    FORGE__OP_ADAMW,
    FORGE__OP_LORA_MERGE,                              /* an adapter folded into float weights at load */
    FORGE__OP_LOGIT_MASK,         /* a constraint's mask on the row the sampler reduces (FORGE__OUT_SAMPLE_MASKED) */
    FORGE__OP_POOL_MEAN,          /* forge_embed: each text's rows averaged (FORGE__OUT_POOL_MEAN) */
    FORGE__OP_COUNT
} forge__op;

typedef struct forge__op_desc {
    const char *name;
    const uint32_t *spv;
    size_t spv_bytes;
    uint32_t n_bindings;
    uint32_t push_bytes;
    uint32_t n_spec;
    uint32_t spec[3];      /* constant_id 0, 1, 2: pinned, never left to GLSL defaults */
    bool per_subgroup;     /* matvec_sg, matvec_q8a: spec[0] = FORGE__SG_PER_WG subgroups at the device's width */
    bool per_head_dim;     /* attention kernels: spec[0] = DMAX, the model's head_dim rounded up to 8 */
    bool sg_width;         /* spec[1] = the device's subgroup width */
    bool mv_paths;         /* matvec_sg modules: spec[2] = the mappings compiled in (forge__matvec_paths) */
} forge__op_desc;

/* matvec_sg: FORGE__SG_PER_WG subgroups per workgroup, one output each at a time */
#define FORGE__SG_PER_WG 8

#define FORGE__BIG_TILES_MIN 256    /* matmul_big once it has this many 128 x 128 tiles */

#define FORGE__SPV(name) forge_spv_##name, sizeof forge_spv_##name
#define FORGE__MATVEC_WG 128
#define FORGE__MATVEC_ROWS 1

/* matvec_sg with one token on a GPU (kernels/matvec_sg.comp says how each mapping works):
 * the K split for long rows (K >= 8192, or K >= 4096 with more outputs than K) of block
 * formats; one output per subgroup otherwise, and always for plain formats (F32, F16, BF16)
 * and on CPU devices (lavapipe: 60 tok/s on stories260K against 42 split). Measured per
 * product on the H100 (bench/RESULTS.md, one output per subgroup -> split, us, before Q4_0's
 * paired reads): Q4_0 4096 x 14336 51.4 -> 45.3, 6144 x 4096 39.0 -> 27.4, 128256 x 4096 373
 * -> 321, but 4096 x 4096 18.0 -> 20.2, F16 8192 x 2048 33.5 -> 42.8 and the F16 128256 x 2048
 * head 223 -> 292. With K = 2048 Q4_0's paired reads (16 weights a lane) leave half of a split
 * workgroup idle: its 128256 x 2048 head took 243 us split. Once one output per subgroup kept
 * four steps of k in flight (MV_STEPS) the F16 2048 x 8192 product took 21.2 us against 27.7
 * split (and the Llama-3.2-1B F16 decode 527 tok/s against 493). */
static bool forge__matvec_use_split(bool cpu, forge__wfmt fmt, uint32_t M, uint32_t outs, uint32_t K) {
    /* (the plain formats' matvec_sg modules are built without the split: kernels.list MV_NO_SPLIT) */
    if (M != 1 || cpu || fmt == FORGE__W_F32 || fmt == FORGE__W_F16 || fmt == FORGE__W_BF16) return false;
    return K >= 8192 || (K >= 4096 && outs > K);
}
/* Outputs per workgroup in the split: up to 8, fewer where that leaves under 1024 workgroups
 * (so a 2048-output product still fills a large GPU). */
static uint32_t forge__matvec_split_rows(uint32_t outs) {
    uint32_t r = 8;
    while (r > 1 && outs / r < 1024) r >>= 1;
    return r;
}
static uint32_t forge__matvec_rows_per_wg(bool sg, uint32_t split_rows) {
    return !sg ? FORGE__MATVEC_ROWS : split_rows ? split_rows : FORGE__SG_PER_WG;
}

/* matmul_cm exists where glslang knew GL_NV_cooperative_matrix (tools/build_kernels.sh) */
#if FORGE_SPV_HAVE_NV_COOPERATIVE_MATRIX
#define FORGE__CM_OP(FMT, name) \
    [FORGE__OP_MATMUL_CM + FMT] = {"matmul_cm_" #name, FORGE__SPV(matmul_cm_##name), 6, sizeof(forge__pc_linear), 0, {0}}, \
    [FORGE__OP_MATMUL_CM_MOE + FMT] = {"matmul_cm_moe_" #name, FORGE__SPV(matmul_cm_moe_##name), 7, sizeof(forge__pc_linear), 0, {0}}, \
    [FORGE__OP_MATMUL_CM_BACK + FMT] = {"matmul_cm_back_" #name, FORGE__SPV(matmul_cm_back_##name), 6, sizeof(forge__pc_linear), 0, {0}},
#define FORGE__CM_S_OP \
    [FORGE__OP_MATMUL_CM_S] = {"matmul_cm_s_f16", FORGE__SPV(matmul_cm_s_f16), 6, sizeof(forge__pc_linear), 0, {0}}, \
    [FORGE__OP_ACT_F16] = {"act_f16", FORGE__SPV(act_f16), 2, sizeof(forge__pc_act_f16), 0, {0}}, \
    [FORGE__OP_ACT_F16_SCALED] = {"act_f16_scaled", FORGE__SPV(act_f16_scaled), 3, sizeof(forge__pc_act_f16), 0, {0}}, \
    [FORGE__OP_ATTN_CM] = {"attention_cm_d64", FORGE__SPV(attention_cm_d64), 6, sizeof(forge__pc_attention), 0, {0}}, \
    [FORGE__OP_ATTN_CM_128] = {"attention_cm_d128", FORGE__SPV(attention_cm_d128), 6, sizeof(forge__pc_attention), 0, {0}}, \
    [FORGE__OP_ATTN_CM_256] = {"attention_cm_d256", FORGE__SPV(attention_cm_d256), 6, sizeof(forge__pc_attention), 0, {0}}, \
    [FORGE__OP_ATTN_CM_KV8] = {"attention_cm_d64_kv8", FORGE__SPV(attention_cm_d64_kv8), 6, sizeof(forge__pc_attention), 0, {0}}, \
    [FORGE__OP_ATTN_CM_128_KV8] = {"attention_cm_d128_kv8", FORGE__SPV(attention_cm_d128_kv8), 6, sizeof(forge__pc_attention), 0, {0}}, \
    [FORGE__OP_ATTN_CM_256_KV8] = {"attention_cm_d256_kv8", FORGE__SPV(attention_cm_d256_kv8), 6, sizeof(forge__pc_attention), 0, {0}},
#else
#define FORGE__CM_S_OP
#define FORGE__CM_OP(FMT, name)
#endif
/* the kernels of one weight format: embedding gather, matvec (two), matmul (two) */
#define FORGE__WEIGHT_OPS(FMT, name)                                                                                  \
    [FORGE__OP_EMBED + FMT] = {"embed_" #name, FORGE__SPV(embed_##name), 5, sizeof(forge__pc_embed), 0, {0}},          \
    [FORGE__OP_MATVEC + FMT] = {"matvec_" #name, FORGE__SPV(matvec_##name), 6, sizeof(forge__pc_linear), 2,             \
                                {FORGE__MATVEC_WG, FORGE__MATVEC_ROWS}},                                              \
    [FORGE__OP_MATVEC_SG + FMT] = {"matvec_sg_" #name, FORGE__SPV(matvec_sg_##name), 8, sizeof(forge__pc_linear), 3,       \
                                   {0, FORGE__SG_PER_WG, 7}, true, .mv_paths = true},                                   \
    [FORGE__OP_MATMUL_MOE + FMT] = {"matmul_moe_" #name, FORGE__SPV(matmul_moe_##name), 7, sizeof(forge__pc_linear), 0, {0}},  \
    [FORGE__OP_MATMUL_MOE_S + FMT] = {"matmul_moe_s_" #name, FORGE__SPV(matmul_moe_s_##name), 7, sizeof(forge__pc_linear), 0, {0}},  \
    [FORGE__OP_MATMUL + FMT] = {"matmul_" #name, FORGE__SPV(matmul_##name), 6, sizeof(forge__pc_linear), 0, {0}},              \
    [FORGE__OP_MATMUL_BIG + FMT] = {"matmul_big_" #name, FORGE__SPV(matmul_big_##name), 6, sizeof(forge__pc_linear), 0, {0}},  \
    [FORGE__OP_MATMUL_S + FMT] = {"matmul_s_" #name, FORGE__SPV(matmul_s_##name), 6, sizeof(forge__pc_linear), 0, {0}},  \
    [FORGE__OP_MATMUL_BACK + FMT] = {"matmul_back_" #name, FORGE__SPV(matmul_back_##name), 5, sizeof(forge__pc_back), 0, {0}},  \
    [FORGE__OP_MATMUL_BACK_BIG + FMT] = {"matmul_back_big_" #name, FORGE__SPV(matmul_back_big_##name), 5, sizeof(forge__pc_back), 0, {0}}, \
    [FORGE__OP_MATMUL_BACK_MOE + FMT] = {"matmul_back_moe_" #name, FORGE__SPV(matmul_back_moe_##name), 7, sizeof(forge__pc_back), 0, {0}}, \
    FORGE__CM_OP(FMT, name)
static const forge__op_desc forge__ops[FORGE__OP_COUNT] = {
    FORGE__WEIGHT_OPS(FORGE__W_F32, f32)
    FORGE__WEIGHT_OPS(FORGE__W_F16, f16)
    FORGE__WEIGHT_OPS(FORGE__W_BF16, bf16)
    FORGE__WEIGHT_OPS(FORGE__W_Q4_0, q4_0)
    FORGE__WEIGHT_OPS(FORGE__W_Q8_0, q8_0)
    FORGE__WEIGHT_OPS(FORGE__W_Q4_K, q4_k)
    FORGE__WEIGHT_OPS(FORGE__W_Q6_K, q6_k)
    FORGE__WEIGHT_OPS(FORGE__W_MLX, mlx)
    FORGE__CM_S_OP
#define FORGE__Q8A_OP(i, name) \
    [FORGE__OP_MATVEC_Q8A + (i)] = {"matvec_q8a_" #name, FORGE__SPV(matvec_q8a_##name), 6, sizeof(forge__pc_linear), 3, {0, FORGE__SG_PER_WG, 0}, true}, \
    [FORGE__OP_MATVEC_Q8A + 8 + (i)] = {"matvec_q8a_pair_" #name, FORGE__SPV(matvec_q8a_##name), 6, sizeof(forge__pc_linear), 3,   \
                                        {0, 2 * FORGE__SG_PER_WG, 1}, true},
    FORGE__Q8A_OP(0, q4_0) FORGE__Q8A_OP(1, out_q4_0) FORGE__Q8A_OP(2, g8_q4_0) FORGE__Q8A_OP(3, g8_out_q4_0)
    FORGE__Q8A_OP(4, q8_0) FORGE__Q8A_OP(5, out_q8_0) FORGE__Q8A_OP(6, g8_q8_0) FORGE__Q8A_OP(7, g8_out_q8_0)
    [FORGE__OP_MATVEC_Q8A_ROWS] = {"matvec_q8a_rows_q4_0", FORGE__SPV(matvec_q8a_rows_q4_0), 6, sizeof(forge__pc_linear), 3, {0, FORGE__SG_PER_WG, 0}, true},
    [FORGE__OP_MATVEC_Q8A_ROWS + 1] = {"matvec_q8a_rows_q8_0", FORGE__SPV(matvec_q8a_rows_q8_0), 6, sizeof(forge__pc_linear), 3, {0, FORGE__SG_PER_WG, 0},
                                       true},
    [FORGE__OP_ACT_Q8] = {"act_q8", FORGE__SPV(act_q8), 3, sizeof(forge__pc_act_q8), 0, {0}},
    [FORGE__OP_LINEAR_REDUCE] = {"linear_reduce", FORGE__SPV(linear_reduce), 4, sizeof(forge__pc_linear), 0, {0}},
    [FORGE__OP_MATVEC_SG_POST] = {"matvec_sg_post_f32", FORGE__SPV(matvec_sg_post_f32), 11, sizeof(forge__pc_linear), 3, {0, FORGE__SG_PER_WG, 7}, true, .mv_paths = true},
    [FORGE__OP_MATVEC_SG_POST + 1] = {"matvec_sg_post_f16", FORGE__SPV(matvec_sg_post_f16), 11, sizeof(forge__pc_linear), 3, {0, FORGE__SG_PER_WG, 7},
                                      true, .mv_paths = true},
    [FORGE__OP_MATVEC_SG_POST + 2] = {"matvec_sg_post_bf16", FORGE__SPV(matvec_sg_post_bf16), 11, sizeof(forge__pc_linear), 3, {0, FORGE__SG_PER_WG, 7},
                                      true, .mv_paths = true},
    [FORGE__OP_MATVEC_SG_PAIR] = {"matvec_sg_pair_f32", FORGE__SPV(matvec_sg_pair_f32), 8, sizeof(forge__pc_linear), 3, {0, FORGE__SG_PER_WG, 7}, true, .mv_paths = true},
    [FORGE__OP_MATVEC_SG_PAIR + 1] = {"matvec_sg_pair_f16", FORGE__SPV(matvec_sg_pair_f16), 8, sizeof(forge__pc_linear), 3, {0, FORGE__SG_PER_WG, 7},
                                      true, .mv_paths = true},
    [FORGE__OP_MATVEC_SG_PAIR + 2] = {"matvec_sg_pair_bf16", FORGE__SPV(matvec_sg_pair_bf16), 8, sizeof(forge__pc_linear), 3, {0, FORGE__SG_PER_WG, 7},
                                      true, .mv_paths = true},
    [FORGE__OP_RMSNORM] = {"rmsnorm", FORGE__SPV(rmsnorm), 4, sizeof(forge__pc_rmsnorm), 0, {0}},
    [FORGE__OP_ROPE] = {"rope", FORGE__SPV(rope), 5, sizeof(forge__pc_rope), 0, {0}},
    [FORGE__OP_ATTENTION] = {"attention_tiled", FORGE__SPV(attention_tiled), 6, sizeof(forge__pc_attention), 1, {256}, false, true},
    [FORGE__OP_ATTN_SPLIT] = {"attention_split", FORGE__SPV(attention_split), 5, sizeof(forge__pc_attention), 1, {256}, false, true},
    [FORGE__OP_ATTN_DECODE] = {"attention_decode", FORGE__SPV(attention_decode), 13, sizeof(forge__pc_attention), 2, {256, 32}, false, true, true},
    [FORGE__OP_ROPE_KV16] = {"rope_kv16", FORGE__SPV(rope_kv16), 5, sizeof(forge__pc_rope), 0, {0}},
    [FORGE__OP_ATTENTION_KV16] = {"attention_tiled_kv16", FORGE__SPV(attention_tiled_kv16), 6, sizeof(forge__pc_attention), 1, {256}, false, true},
    [FORGE__OP_ATTN_SPLIT_KV16] = {"attention_split_kv16", FORGE__SPV(attention_split_kv16), 5, sizeof(forge__pc_attention), 1, {256}, false,
                                   true},
    [FORGE__OP_ATTN_DECODE_KV16] = {"attention_decode_kv16", FORGE__SPV(attention_decode_kv16), 13, sizeof(forge__pc_attention), 2, {256, 32},
                                    false, true, true},
    [FORGE__OP_ROPE_SHIFT_KV16] = {"rope_shift_kv16", FORGE__SPV(rope_shift_kv16), 3, sizeof(forge__pc_rope_back), 0, {0}},
    [FORGE__OP_ROPE_KV8] = {"rope_kv8", FORGE__SPV(rope_kv8), 5, sizeof(forge__pc_rope), 0, {0}},
    [FORGE__OP_ATTENTION_KV8] = {"attention_tiled_kv8", FORGE__SPV(attention_tiled_kv8), 6, sizeof(forge__pc_attention), 1, {256}, false, true},
    [FORGE__OP_ATTN_SPLIT_KV8] = {"attention_split_kv8", FORGE__SPV(attention_split_kv8), 5, sizeof(forge__pc_attention), 1, {256}, false, true},
    [FORGE__OP_ATTN_DECODE_KV8] = {"attention_decode_kv8", FORGE__SPV(attention_decode_kv8), 13, sizeof(forge__pc_attention), 2, {256, 32},
                                   false, true, true},
    [FORGE__OP_ROPE_SHIFT_KV8] = {"rope_shift_kv8", FORGE__SPV(rope_shift_kv8), 3, sizeof(forge__pc_rope_back), 0, {0}},
    [FORGE__OP_ATTN_COMBINE] = {"attention_combine", FORGE__SPV(attention_combine), 3, sizeof(forge__pc_combine), 0, {0}},
    [FORGE__OP_POOL_MEAN] = {"pool_mean", FORGE__SPV(pool_mean), 3, sizeof(forge__pc_pool), 0, {0}},
    [FORGE__OP_ACT_MUL] = {"act_mul", FORGE__SPV(act_mul), 3, sizeof(forge__pc_act), 0, {0}},
    [FORGE__OP_MOE_ROUTE] = {"moe_route", FORGE__SPV(moe_route), 3, sizeof(forge__pc_moe_route), 0, {0}},
    [FORGE__OP_MOE_GROUP] = {"moe_group", FORGE__SPV(moe_group), 2, sizeof(forge__pc_moe_group), 0, {0}},
    [FORGE__OP_MOE_COMBINE] = {"moe_combine", FORGE__SPV(moe_combine), 3, sizeof(forge__pc_moe_combine), 0, {0}},
    [FORGE__OP_CONV1D] = {"conv1d", FORGE__SPV(conv1d), 5, sizeof(forge__pc_conv), 0, {0}},
    [FORGE__OP_DELTA_RULE] = {"delta_rule", FORGE__SPV(delta_rule), 8, sizeof(forge__pc_delta), 0, {0}},
    [FORGE__OP_DELTA_RULE_SG] = {"delta_rule_sg", FORGE__SPV(delta_rule_sg), 8, sizeof(forge__pc_delta), 0, {0}},
    [FORGE__OP_GATED_NORM] = {"gated_norm", FORGE__SPV(gated_norm), 3, sizeof(forge__pc_delta), 0, {0}},
    [FORGE__OP_DELTA_RULE_PREP] = {"delta_rule_prep", FORGE__SPV(delta_rule_prep), 5, sizeof(forge__pc_delta), 0, {0}},
    [FORGE__OP_DELTA_RULE_CHUNK] = {"delta_rule_chunk", FORGE__SPV(delta_rule_chunk), 5, sizeof(forge__pc_delta), 0, {0}},
    [FORGE__OP_PENALTY] = {"penalty", FORGE__SPV(penalty), 3, 4, 0, {0}},
    [FORGE__OP_LOGIT_MASK] = {"logit_mask", FORGE__SPV(logit_mask), 2, 4, 0, {0}},
    [FORGE__OP_TOPK] = {"topk", FORGE__SPV(topk), 4, 12, 0, {0}},
    [FORGE__OP_TOPK_MERGE] = {"topk_merge", FORGE__SPV(topk_merge), 4, 12, 0, {0}},
    [FORGE__OP_GEMM] = {"gemm", FORGE__SPV(gemm), 5, sizeof(forge__pc_gemm), 0, {0}},
    [FORGE__OP_GEMM_RANK + 0] = {"gemm_wide_r16", FORGE__SPV(gemm_wide_r16), 5, sizeof(forge__pc_gemm), 0, {0}},
    [FORGE__OP_GEMM_RANK + 1] = {"gemm_wide_r64", FORGE__SPV(gemm_wide_r64), 5, sizeof(forge__pc_gemm), 0, {0}},
    [FORGE__OP_GEMM_RANK + 2] = {"gemm_rows_r16", FORGE__SPV(gemm_rows_r16), 5, sizeof(forge__pc_gemm), 0, {0}},
    [FORGE__OP_GEMM_RANK + 3] = {"gemm_rows_r64", FORGE__SPV(gemm_rows_r64), 5, sizeof(forge__pc_gemm), 0, {0}},
    [FORGE__OP_GEMM_RANK + 4] = {"gemm_cols_r16", FORGE__SPV(gemm_cols_r16), 5, sizeof(forge__pc_gemm), 0, {0}},
    [FORGE__OP_GEMM_RANK + 5] = {"gemm_cols_r64", FORGE__SPV(gemm_cols_r64), 5, sizeof(forge__pc_gemm), 0, {0}},
    [FORGE__OP_RMSNORM_BACK] = {"rmsnorm_back", FORGE__SPV(rmsnorm_back), 4, sizeof(forge__pc_norm_back), 0, {0}},
    [FORGE__OP_ROPE_BACK] = {"rope_back", FORGE__SPV(rope_back), 3, sizeof(forge__pc_rope_back), 0, {0}},
    [FORGE__OP_ATTN_BACK] = {"attention_back", FORGE__SPV(attention_back), 7, sizeof(forge__pc_attn_back), 1, {256}, false, true},
    [FORGE__OP_ACT_MUL_BACK] = {"act_mul_back", FORGE__SPV(act_mul_back), 5, sizeof(forge__pc_act), 0, {0}},
    [FORGE__OP_MOE_ROUTE_BACK] = {"moe_route_back", FORGE__SPV(moe_route_back), 5, sizeof(forge__pc_moe_route_back), 0, {0}},
    [FORGE__OP_CONV1D_BACK] = {"conv1d_back", FORGE__SPV(conv1d_back), 4, sizeof(forge__pc_conv), 0, {0}},
    [FORGE__OP_DELTA_RULE_BACK] = {"delta_rule_back", FORGE__SPV(delta_rule_back), 10, sizeof(forge__pc_delta), 0, {0}},
    [FORGE__OP_L2NORM_BACK] = {"l2norm_back", FORGE__SPV(l2norm_back), 3, sizeof(forge__pc_delta), 0, {0}},
    [FORGE__OP_LOSS] = {"loss", FORGE__SPV(loss), 4, sizeof(forge__pc_loss), 0, {0}},
    [FORGE__OP_ADAMW] = {"adamw", FORGE__SPV(adamw), 6, sizeof(forge__pc_adamw), 0, {0}},
    [FORGE__OP_LORA_MERGE] = {"lora_merge", FORGE__SPV(lora_merge), 3, sizeof(forge__pc_merge), 0, {0}},
};
/* Each module's push-constant block, as tools/build_kernels.sh read its size from the SPIR-V
 * (FORGE_SPV_PUSH_BYTES_<module>), is the struct its rows push. Equal, not merely no larger: a
 * block shorter than the range pushed is valid Vulkan (the kernel ignores the tail), and that is
 * how the copies of a block drifted apart; with each family's block in one place, a difference
 * means a field went into one side only. (The rows' push_bytes themselves: test_push_constants.cpp.) */
#define FORGE__PUSH_IS(module, type) \
    _Static_assert(FORGE_SPV_PUSH_BYTES_##module == sizeof(type), "kernels: the push constants of " #module " are not " #type " (src/ops.c)")
#define FORGE__WEIGHT_PUSH(name)                          \
    FORGE__PUSH_IS(embed_##name, forge__pc_embed);        \
    FORGE__PUSH_IS(matvec_##name, forge__pc_linear);      \
    FORGE__PUSH_IS(matvec_sg_##name, forge__pc_linear);   \
    FORGE__PUSH_IS(matmul_##name, forge__pc_linear);      \
    FORGE__PUSH_IS(matmul_s_##name, forge__pc_linear);    \
    FORGE__PUSH_IS(matmul_moe_##name, forge__pc_linear);  \
    FORGE__PUSH_IS(matmul_moe_s_##name, forge__pc_linear);  \
    FORGE__PUSH_IS(matmul_big_##name, forge__pc_linear);  \
    FORGE__PUSH_IS(matmul_back_##name, forge__pc_back);   \
    FORGE__PUSH_IS(matmul_back_big_##name, forge__pc_back); \
    FORGE__PUSH_IS(matmul_back_moe_##name, forge__pc_back)
FORGE__WEIGHT_PUSH(f32);
FORGE__WEIGHT_PUSH(f16);
FORGE__WEIGHT_PUSH(bf16);
FORGE__WEIGHT_PUSH(q4_0);
FORGE__WEIGHT_PUSH(q8_0);
FORGE__WEIGHT_PUSH(q4_k);
FORGE__WEIGHT_PUSH(q6_k);
FORGE__WEIGHT_PUSH(mlx);
#if FORGE_SPV_HAVE_NV_COOPERATIVE_MATRIX
FORGE__PUSH_IS(matmul_cm_f32, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_f16, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_bf16, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_q4_0, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_q8_0, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_q4_k, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_q6_k, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_mlx, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_s_f16, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_moe_f32, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_moe_f16, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_moe_bf16, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_moe_q4_0, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_moe_q8_0, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_moe_q4_k, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_moe_q6_k, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_moe_mlx, forge__pc_linear);
FORGE__PUSH_IS(act_f16, forge__pc_act_f16);
FORGE__PUSH_IS(act_f16_scaled, forge__pc_act_f16);
FORGE__PUSH_IS(matmul_cm_back_f32, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_back_f16, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_back_bf16, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_back_q4_0, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_back_q8_0, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_back_q4_k, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_back_q6_k, forge__pc_linear);
FORGE__PUSH_IS(matmul_cm_back_mlx, forge__pc_linear);
FORGE__PUSH_IS(attention_cm_d64, forge__pc_attention);
FORGE__PUSH_IS(attention_cm_d128, forge__pc_attention);
FORGE__PUSH_IS(attention_cm_d256, forge__pc_attention);
FORGE__PUSH_IS(attention_cm_d64_kv8, forge__pc_attention);
FORGE__PUSH_IS(attention_cm_d128_kv8, forge__pc_attention);
FORGE__PUSH_IS(attention_cm_d256_kv8, forge__pc_attention);
#endif
FORGE__PUSH_IS(matvec_sg_post_f32, forge__pc_linear);
FORGE__PUSH_IS(matvec_sg_post_f16, forge__pc_linear);
FORGE__PUSH_IS(matvec_sg_post_bf16, forge__pc_linear);
FORGE__PUSH_IS(matvec_sg_pair_f32, forge__pc_linear);
FORGE__PUSH_IS(matvec_sg_pair_f16, forge__pc_linear);
FORGE__PUSH_IS(matvec_sg_pair_bf16, forge__pc_linear);
FORGE__PUSH_IS(matvec_q8a_q4_0, forge__pc_linear);
FORGE__PUSH_IS(matvec_q8a_out_q4_0, forge__pc_linear);
FORGE__PUSH_IS(matvec_q8a_g8_q4_0, forge__pc_linear);
FORGE__PUSH_IS(matvec_q8a_g8_out_q4_0, forge__pc_linear);
FORGE__PUSH_IS(matvec_q8a_q8_0, forge__pc_linear);
FORGE__PUSH_IS(matvec_q8a_out_q8_0, forge__pc_linear);
FORGE__PUSH_IS(matvec_q8a_g8_q8_0, forge__pc_linear);
FORGE__PUSH_IS(matvec_q8a_g8_out_q8_0, forge__pc_linear);
FORGE__PUSH_IS(matvec_q8a_rows_q4_0, forge__pc_linear);
FORGE__PUSH_IS(matvec_q8a_rows_q8_0, forge__pc_linear);
FORGE__PUSH_IS(linear_reduce, forge__pc_linear);
FORGE__PUSH_IS(act_q8, forge__pc_act_q8);
FORGE__PUSH_IS(rmsnorm, forge__pc_rmsnorm);
FORGE__PUSH_IS(rope, forge__pc_rope);
FORGE__PUSH_IS(rope_kv16, forge__pc_rope);
FORGE__PUSH_IS(attention_tiled, forge__pc_attention);
FORGE__PUSH_IS(attention_tiled_kv16, forge__pc_attention);
FORGE__PUSH_IS(attention_split, forge__pc_attention);
FORGE__PUSH_IS(attention_split_kv16, forge__pc_attention);
FORGE__PUSH_IS(attention_decode, forge__pc_attention);
FORGE__PUSH_IS(attention_decode_kv16, forge__pc_attention);
FORGE__PUSH_IS(attention_combine, forge__pc_combine);
FORGE__PUSH_IS(pool_mean, forge__pc_pool);
FORGE__PUSH_IS(act_mul, forge__pc_act);
FORGE__PUSH_IS(conv1d, forge__pc_conv);
FORGE__PUSH_IS(delta_rule, forge__pc_delta);
FORGE__PUSH_IS(delta_rule_sg, forge__pc_delta);
FORGE__PUSH_IS(gated_norm, forge__pc_delta);
FORGE__PUSH_IS(delta_rule_prep, forge__pc_delta);
FORGE__PUSH_IS(delta_rule_chunk, forge__pc_delta);
FORGE__PUSH_IS(moe_route, forge__pc_moe_route);
FORGE__PUSH_IS(moe_group, forge__pc_moe_group);
FORGE__PUSH_IS(moe_combine, forge__pc_moe_combine);
FORGE__PUSH_IS(penalty, uint32_t);     /* src/forward.c pushes n_vocab alone */
FORGE__PUSH_IS(logit_mask, uint32_t);  /* n_vocab alone too */
FORGE__PUSH_IS(topk, uint32_t[3]);     /* ... and {n, candidates, temp_word} */
FORGE__PUSH_IS(topk_merge, uint32_t[3]);
FORGE__PUSH_IS(gemm, forge__pc_gemm);
FORGE__PUSH_IS(gemm_wide_r16, forge__pc_gemm);
FORGE__PUSH_IS(gemm_wide_r64, forge__pc_gemm);
FORGE__PUSH_IS(gemm_rows_r16, forge__pc_gemm);
FORGE__PUSH_IS(gemm_rows_r64, forge__pc_gemm);
FORGE__PUSH_IS(gemm_cols_r16, forge__pc_gemm);
FORGE__PUSH_IS(gemm_cols_r64, forge__pc_gemm);
FORGE__PUSH_IS(rmsnorm_back, forge__pc_norm_back);
FORGE__PUSH_IS(rope_back, forge__pc_rope_back);
FORGE__PUSH_IS(rope_shift_kv16, forge__pc_rope_back);
FORGE__PUSH_IS(attention_back, forge__pc_attn_back);
FORGE__PUSH_IS(act_mul_back, forge__pc_act);
FORGE__PUSH_IS(moe_route_back, forge__pc_moe_route_back);
FORGE__PUSH_IS(conv1d_back, forge__pc_conv);
FORGE__PUSH_IS(delta_rule_back, forge__pc_delta);
FORGE__PUSH_IS(l2norm_back, forge__pc_delta);
FORGE__PUSH_IS(loss, forge__pc_loss);
FORGE__PUSH_IS(adamw, forge__pc_adamw);
FORGE__PUSH_IS(lora_merge, forge__pc_merge);
#define FORGE__MAX_BINDINGS 13 /* attention_decode's */
#define FORGE__MATVEC_MAX_M 8     /* matvec.comp MAX_M: more rows of A go to matmul */

/* Bits per weight of a format, times 16 (Q4_0: 18 bytes a block of 32 = 4.5 bits, 72); MLX
 * affine: `bits` plus an f16 scale and bias per group. For the profile's GB/s. */
static uint32_t forge__bits16(forge__wfmt f, uint32_t mlx_bits, uint32_t mlx_group) {
    if (f == FORGE__W_MLX) /* the codes, and an f16 scale and bias per group */
        return mlx_group ? 16 * mlx_bits + 512 / mlx_group : 16 * mlx_bits;
    forge__dtype_traits t = forge__dtype_info(forge__wfmt_dtype[f]);
    return 128 * t.block_bytes / t.block;
}

/* One matrix product dispatch, for the profile: C [M, N] from A [M, K] and weights [N, K] of
 * bits16 / 16 bits each (0: gemm.comp's product of two activations, its shape M x N x K). */
typedef struct forge__mat_work {
    uint32_t N, K, M, bits16;
    uint32_t mats;           /* weight matrices of N x K read (an expert product: one per chosen expert) */
} forge__mat_work;

typedef struct forge__pipeline {
    VkDescriptorSetLayout dsl;
    VkPipelineLayout layout;
    VkPipeline pipe;
    bool warm;                     /* forge_session_prewarm has dispatched it (compiled on every driver) */
} forge__pipeline;

/* Queries per workgroup of attention_tiled.comp, as its DMAX specialization picks them. */
static uint32_t forge__attn_block_queries(uint32_t dmax) { return dmax > 256 ? 4 : 8; }

/* dmax: the head_dim the attention kernels are specialized for (0: 256). */
/* mv_paths: the matvec_sg mappings to compile in (forge__matvec_paths). */
static forge_status forge__pipeline_create(forge__device *d, const forge__op_desc *op, uint32_t dmax, uint32_t mv_paths, forge__pipeline *p,
                                           forge__err *err) {
    VkDescriptorSetLayoutBinding b[FORGE__MAX_BINDINGS];
    for (uint32_t i = 0; i < op->n_bindings; i++)
        b[i] = (VkDescriptorSetLayoutBinding){.binding = i, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                              .descriptorCount = 1, .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    VkDescriptorSetLayoutCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                           .bindingCount = op->n_bindings, .pBindings = b};
    VkResult r = d->vk.vkCreateDescriptorSetLayout(d->dev, &dci, NULL, &p->dsl);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "kernel %s: vkCreateDescriptorSetLayout failed (%d)", op->name, (int)r);
    VkPushConstantRange pcr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .offset = 0, .size = op->push_bytes};
    VkPipelineLayoutCreateInfo lci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, .setLayoutCount = 1,
                                      .pSetLayouts = &p->dsl, .pushConstantRangeCount = 1, .pPushConstantRanges = &pcr};
    r = d->vk.vkCreatePipelineLayout(d->dev, &lci, NULL, &p->layout);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "kernel %s: vkCreatePipelineLayout failed (%d)", op->name, (int)r);
    VkShaderModuleCreateInfo sci = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = op->spv_bytes, .pCode = op->spv};
    VkShaderModule mod;
    r = d->vk.vkCreateShaderModule(d->dev, &sci, NULL, &mod);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "kernel %s: vkCreateShaderModule failed (%d)", op->name, (int)r);
    VkSpecializationMapEntry me[3] = {{0, 0, 4}, {1, 4, 4}, {2, 8, 4}};
    uint32_t spec[3] = {op->spec[0], op->spec[1], op->spec[2]};
    if (op->per_subgroup) spec[0] = FORGE__SG_PER_WG * d->caps.subgroup_size;
    if (op->per_head_dim && dmax) spec[0] = dmax;
    if (op->sg_width) spec[1] = d->caps.subgroup_size;
    if (op->mv_paths) spec[2] = mv_paths;
    VkSpecializationInfo si = {.mapEntryCount = op->n_spec, .pMapEntries = me, .dataSize = 4u * op->n_spec, .pData = spec};
    VkComputePipelineCreateInfo pci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = mod, .pName = "main", .pSpecializationInfo = op->n_spec ? &si : NULL},
        .layout = p->layout};
    r = d->vk.vkCreateComputePipelines(d->dev, VK_NULL_HANDLE, 1, &pci, NULL, &p->pipe);
    d->vk.vkDestroyShaderModule(d->dev, mod, NULL);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "kernel %s: vkCreateComputePipelines failed (%d)", op->name, (int)r);
    return FORGE_OK;
}

static void forge__pipeline_destroy(forge__device *d, forge__pipeline *p) {
    if (p->pipe) d->vk.vkDestroyPipeline(d->dev, p->pipe, NULL);
    if (p->layout) d->vk.vkDestroyPipelineLayout(d->dev, p->layout, NULL);
    if (p->dsl) d->vk.vkDestroyDescriptorSetLayout(d->dev, p->dsl, NULL);
    memset(p, 0, sizeof *p);
}

/* A command buffer being recorded (or counted). */
typedef struct forge__rec {
    forge__device *dev;
    forge__pipeline *pipes;        /* the model's table, FORGE__OP_COUNT entries */
    uint32_t dmax;                 /* the attention kernels' head_dim specialization (the model's, rounded up to 8); 0: 256 */
    uint32_t mv_paths;             /* the matvec_sg mappings compiled in (forge__matvec_paths) */
    pthread_mutex_t *pipe_lock;
    VkCommandBuffer cb;
    VkDescriptorPool pool;
    bool counting;
    uint32_t n_descriptors, n_dispatches;   /* one descriptor set per dispatch */
    VkQueryPool qpool;             /* profiling: a timestamp after each dispatch */
    uint16_t *ops;                 /* profiling: the op of each dispatch, in order (+ FORGE__OP_COUNT: run on the host) */
    forge__mat_work *shapes;       /* profiling: each dispatch's matrix product (N 0: none) */
    bool fenced;                   /* a barrier and nothing after it yet: another one would be redundant */
    uint32_t n_copies;             /* copies recorded (src/host.c: whether anything ran since its last product) */
    forge_status st;
    forge__err *err;
    /* CPU devices: takes a dispatch that runs on the host instead (src/host.c, forge__host_take)
     * and returns true; NULL: every dispatch is recorded */
    bool (*host_take)(struct forge__rec *r, forge__op op, const forge__range *binds, const void *push);
    void *host_ctx;
} forge__rec;

static forge__pipeline *forge__get_pipeline(forge__rec *r, forge__op op) {
    forge__pipeline *p = &r->pipes[op];
    if (p->pipe) return p;
    pthread_mutex_lock(r->pipe_lock);
    if (!p->pipe) {
        forge__pipeline np = {0};
        forge_status st = forge__pipeline_create(r->dev, &forge__ops[op], r->dmax, r->mv_paths, &np, r->err);
        if (st) {
            forge__pipeline_destroy(r->dev, &np);
            r->st = st;
        } else {
            *p = np;
        }
    }
    pthread_mutex_unlock(r->pipe_lock);
    return p->pipe ? p : NULL;
}

/* Splits a 1-D workgroup count over x and y (at most 65535 per dimension). */
static void forge__grid(uint64_t groups, uint32_t *gx, uint32_t *gy) {
    if (groups == 0) groups = 1;
    *gx = (uint32_t)FORGE__MIN(groups, 65535u);
    *gy = (uint32_t)((groups + *gx - 1) / *gx);
}

/* Profiling: what dispatch n_dispatches - 1 was (its op and product shape, `on_host`: a product
 * src/host.c runs) and a timestamp after it. */
static void forge__note_dispatch(forge__rec *r, forge__op op, const void *push, uint32_t gz, bool on_host) {
    if (!r->qpool) return;
    r->ops[r->n_dispatches - 1] = (uint16_t)(op + (on_host ? FORGE__OP_COUNT : 0));
    forge__mat_work *w = &r->shapes[r->n_dispatches - 1];
    if (op >= FORGE__OP_MATVEC && op < FORGE__OP_RMSNORM) {
        const forge__pc_linear *pl = (const forge__pc_linear *)push;
        forge__wfmt f = op >= FORGE__OP_MATVEC_Q8A ? ((op - FORGE__OP_MATVEC_Q8A) & 4 ? FORGE__W_Q8_0 : FORGE__W_Q4_0)
                      : op >= FORGE__OP_MATVEC_SG_PAIR ? (forge__wfmt)(op - FORGE__OP_MATVEC_SG_PAIR)
                      : op >= FORGE__OP_MATVEC_SG_POST ? (forge__wfmt)(op - FORGE__OP_MATVEC_SG_POST)
                      : op >= FORGE__OP_MATMUL_CM_BACK ? (forge__wfmt)(op - FORGE__OP_MATMUL_CM_BACK)
                      : op >= FORGE__OP_MATMUL_CM_MOE ? (forge__wfmt)(op - FORGE__OP_MATMUL_CM_MOE)
                      : op == FORGE__OP_MATMUL_CM_S ? FORGE__W_F16
                                                    : (forge__wfmt)((op - FORGE__OP_MATVEC) % FORGE__W_COUNT);
        /* a gated product's N counts outputs, each from two rows (gate and up) of the weight */
        uint32_t rows = pl->flags & FORGE__LINEAR_GATED ? 2 * pl->N : pl->N;
        /* expert products (the shape is one expert's): decode reads the expert of each pair
         * (workgroup z); prefill's grouped product every expert of the chunk that has pairs
         * (at most the pairs) */
        uint32_t M = pl->M, mats = 1;
        if (pl->flags & FORGE__LINEAR_EXPERTS) M = mats = gz;
        else if (op >= FORGE__OP_MATMUL_MOE && op < FORGE__OP_MATMUL_MOE_S + FORGE__W_COUNT) mats = FORGE__MIN(pl->n_exp, pl->M);
        *w = (forge__mat_work){rows, pl->K, M, forge__bits16(f, pl->qbits, pl->qgroup), mats};
    } else if (op >= FORGE__OP_MATMUL_BACK && op < FORGE__OP_GEMM) { /* both tile sizes, and the experts' (every expert of the chunk, at most the pairs) */
        const forge__pc_back *pb = (const forge__pc_back *)push;
        uint32_t mats = op >= FORGE__OP_MATMUL_BACK_MOE ? FORGE__MIN(pb->n_exp, pb->M) : 1;
        *w = (forge__mat_work){pb->N, pb->K, pb->M,
                               forge__bits16((forge__wfmt)((op - FORGE__OP_MATMUL_BACK) % FORGE__W_COUNT), pb->qbits, pb->qgroup), mats};
    } else if (op >= FORGE__OP_GEMM && op < FORGE__OP_GEMM_RANK + 6 && !((const forge__pc_gemm *)push)->reduce) { /* the low-rank products: no weight (bits16 0), keyed M x N x K */
        const forge__pc_gemm *pg = (const forge__pc_gemm *)push;
        *w = (forge__mat_work){pg->N, pg->K, pg->M, 0, 0};
    }
    /* a host product's: at the start of the command buffer after it */
    r->dev->vk.vkCmdWriteTimestamp(r->cb, on_host ? VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT : VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, r->qpool, r->n_dispatches);
}

static void forge__dispatch(forge__rec *r, forge__op op, const forge__range *binds, const void *push, uint32_t gx,
                            uint32_t gy, uint32_t gz) {
    if (r->st) return;
    if (r->host_take && r->host_take(r, op, binds, push)) return; /* a product run on the host (src/host.c) */
    const forge__op_desc *desc = &forge__ops[op];
    forge__pipeline *p = forge__get_pipeline(r, op);
    if (!p) return;
    r->n_dispatches++;
    if (r->counting) {
        r->n_descriptors += desc->n_bindings;
        return;
    }
    VkDescriptorSet set;
    VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, .descriptorPool = r->pool,
                                      .descriptorSetCount = 1, .pSetLayouts = &p->dsl};
    VkResult vr = r->dev->vk.vkAllocateDescriptorSets(r->dev->dev, &ai, &set);
    if (vr != VK_SUCCESS) {
        r->st = forge__fail(r->err, FORGE_ERR_DEVICE, "vkAllocateDescriptorSets failed (%d)", (int)vr);
        return;
    }
    VkDescriptorBufferInfo bi[FORGE__MAX_BINDINGS];
    VkWriteDescriptorSet w[FORGE__MAX_BINDINGS];
    for (uint32_t i = 0; i < desc->n_bindings; i++) {
        bi[i] = (VkDescriptorBufferInfo){binds[i].buf, binds[i].offset, binds[i].size};
        w[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = set, .dstBinding = i,
                                      .descriptorCount = 1, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                      .pBufferInfo = &bi[i]};
    }
    r->dev->vk.vkUpdateDescriptorSets(r->dev->dev, desc->n_bindings, w, 0, NULL);
    r->dev->vk.vkCmdBindPipeline(r->cb, VK_PIPELINE_BIND_POINT_COMPUTE, p->pipe);
    r->dev->vk.vkCmdBindDescriptorSets(r->cb, VK_PIPELINE_BIND_POINT_COMPUTE, p->layout, 0, 1, &set, 0, NULL);
    r->dev->vk.vkCmdPushConstants(r->cb, p->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, desc->push_bytes, push);
    r->dev->vk.vkCmdDispatch(r->cb, gx, gy, gz);
    r->fenced = false;
    forge__note_dispatch(r, op, push, gz, false);
}

/* Makes every earlier shader write visible to later shader reads and writes. */
static void forge__barrier(forge__rec *r) {
    if (r->st || r->counting || r->fenced) return;
    r->fenced = true;
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT};
    r->dev->vk.vkCmdPipelineBarrier(r->cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                                    VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0,
                                    NULL, 0, NULL);
}

/* Makes transfer writes visible to the host once the submission's fence signals. */
static void forge__host_barrier(forge__rec *r) {
    if (r->st || r->counting) return;
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
    r->dev->vk.vkCmdPipelineBarrier(r->cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
}

static void forge__copy(forge__rec *r, forge__range src, forge__range dst, uint64_t bytes) {
    if (r->st || r->counting || !bytes) return;
    r->fenced = false;
    r->n_copies++;
    VkBufferCopy c = {src.offset, dst.offset, bytes};
    r->dev->vk.vkCmdCopyBuffer(r->cb, src.buf, dst.buf, 1, &c);
}

