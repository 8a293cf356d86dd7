/* src/forward.c: The forward pass.
 * Owns: recording one layer and the whole forward pass: linear products (matrix-vector,
 * matrix, tensor-core, int8-activation chains), norms, attention, the adapters' low-rank path,
 * mixture-of-experts routing, embeddings and the head.
 * May call: base.c, files.c, config.c, device.c, ops.c, model.c, session.c.
 */
/* ---- Recording the forward pass ----
 * One layer's forward pass is written once and serves inference (a session's scratch and KV
 * cache) and training (activations kept per layer for the backward pass, train.c): what
 * differs is in forge__pass (the shape of the rows) and forge__acts (where each tensor goes). */

/* What a recorded pass works with: the model, the recorder and the rows it runs. */
typedef struct forge__pass {
    forge_model *m;
    forge__rec *r;
    forge__range dummy;        /* bound where a kernel's optional input is unused */
    forge__range params;       /* the step params (forge__step_params): positions, dropout seed */
    const forge__lora *lora;   /* adapters beside the projections, or NULL */
    uint32_t n;                /* rows (tokens) in the pass */
    uint32_t seq;              /* tokens per sequence of a training batch (n = batch * seq); 0: one sequence */
    uint32_t batch;            /* sequences: 1 for inference */
    bool fuse;                 /* block norms fused into the subgroup matvec (decode without adapters) */
    bool train;                /* a training batch: keep what the backward pass reads */
    bool dropout;              /* apply the adapters' dropout (training steps, not evaluation) */
    forge__range gemm_part;    /* the trainer: scratch for split-K partial sums (unset: no split) */
    uint32_t table;            /* batch generation: rows of several sequences, positions and cache regions from
                                * the row table (FORGE__TABLE_PREFILL: one sequence's prompt, FORGE__TABLE_DECODE:
                                * one row per sequence); 0: one sequence at pos0 */
    forge__range split_part;   /* batch decode: scratch for the matmul's split-k partial sums (unset: no split), */
    forge__range split_alt;    /* or this one where the first overlaps the product's input or output */
    forge__range act_q8;       /* one token's int8 activations (act_q8.comp), where the model uses them; unset: never */
    forge__range a16;          /* the tensor cores' input rows in f16 (act_f16.comp); unset: products on the SIMT kernels */
    forge_kv_type kv;          /* what the KV cache holds (a session's kv_type; training's caches: 0, read as f32) */
    forge__range act_q8_res;   /* one token's int8 activations of the residual stream, for a decode layer's chain (forge__q8_chain); unset: no chain */
    forge__range post_p;       /* forge__linear, one token: x + rmsnorm(post_p) * post_w is the input, and goes to post_out
                                * (matvec_sg's POST_ADD, forge__post_fused); unset: x */
    forge__range post_w, post_out;
} forge__pass;

/* Whether two ranges share no byte. */
static bool forge__apart(forge__range a, forge__range b) {
    return a.buf != b.buf || a.offset >= b.offset + b.size || b.offset >= a.offset + a.size;
}

#define FORGE__TABLE_PREFILL 1u
#define FORGE__TABLE_DECODE 2u

/* Where one layer's forward pass reads and writes, each [n, width] f32. */
typedef struct forge__acts {
    forge__range x;            /* [n, H] the residual stream, updated in place */
    forge__range xn;           /* [n, H] a block norm's output (the projections' input) */
    forge__range qkv;          /* [n, QKVD] q | k | v rows; q normed and rotated in place */
    forge__range att;          /* [n, QD] the attention's output */
    forge__range att_g;        /* training, Qwen 3.5: [n, QD] att times its output gate (o_proj's input), kept apart from att
                                * for the backward pass; unset: gated in place */
    forge__range gu;           /* [n, 2F] gate and up (pairs from the fused weight, else halves) */
    forge__range h;            /* [n, F] act(gate) * up */
    forge__range kc, vc;       /* K and V [slots, NKV, D]: the KV cache, or training's [n, NKV, D] */
    uint32_t slots;
    forge__range attn_part;    /* decode: the split attention's partials [NH, splits, D + 2] */
    forge__range attn_done;    /* decode: attention_decode's counters [n, NH], zero between dispatches */
    forge__range u;            /* [n, FORGE__T_COUNT * max_rank] the adapters' x A^T, per target */
    forge__range o, d;         /* [n, H] sandwich norms' inputs: attention and MLP outputs (inference: xn) */
    /* training: kept for the backward pass (unset when not) */
    forge__range x_in;         /* [n, H] the layer's input */
    forge__range x_mid;        /* [n, H] the residual after the attention block */
    forge__range qkv_raw;      /* [n, QKVD] q | k | v before the q/k norms (qk_norm models) */
    forge__range lse;          /* [2, n, NH] the attention's log-sum-exp per query and head (then delta) */
    /* mixture of experts (forge__record_moe) */
    forge__range router;       /* [n, E] the router's logits */
    forge__range route;        /* [n * top_k] (expert, weight bits) per (token, choice) pair */
    forge__range moe;          /* moe_group.comp's tiles and sorted pairs (prefill) */
    forge__range moe_y;        /* [n * top_k, H] each pair's expert output (prefill) */
    forge__range exp_gu;       /* training: [n * top_k, 2 I] each pair's gate and up, and */
    forge__range exp_h;        /* [n * top_k, I] its middle, kept apart from the shared expert's gu and h; unset: in gu and h */
    forge__range moe_out;      /* [n, H] Gemma 4: the experts' weighted sum */
    forge__range mlp_sum;      /* [n, H] Gemma 4: the dense MLP's and the experts' normed outputs added */
    /* Gemma 4's per-layer inputs */
    forge__range ple;          /* [n, layers * P] every layer's input (forge__record_ple) */
    forge__range ple_tmp;      /* [n, layers * P] scratch */
    forge__range ple_g;        /* [n, P] the layer's gate */
    /* Qwen 3.5 */
    forge__range lin_mix;      /* [n, conv_dim + VD + 2 NV] a linear layer's in-projection: q|k|v, z, b, a (training: kept) */
    forge__range lin_qkv;      /* [n, conv_dim] q|k|v after the convolution and SiLU (training: kept) */
    forge__range lin_out;      /* [n, VD] the delta rule's gated-norm output, out_proj's input (training: kept) */
    forge__range lin_chunk;    /* [n, NV, 2 * 64 + 4] the chunked delta rule's work (none: the recurrent form only) */
    forge__range shared_s;     /* [n] x . shared_expert_gate (MoE) */
    /* kc, vc: a linear layer's convolution and delta-rule states (forge_session.kc) */
} forge__acts;

/* Whether a product of M rows runs on the subgroup matvec, the one kernel that can fuse the
 * RMSNorm of its input (forge__linear's `norm`). */
/* The most rows of A a matrix-vector kernel takes (more go to matmul): FORGE__MATVEC_MAX_M, but
 * one on a CPU device, whose matvec_sg modules leave the several-token mapping out
 * (forge__matvec_paths). */
static uint32_t forge__matvec_max_m(const forge_model *m) { return m->dev.caps.type == FORGE_DEVICE_CPU ? 1u : FORGE__MATVEC_MAX_M; }

/* The matvec_sg code a model's pipelines compile in (the modules' PATHS, kernels/matvec_sg.comp):
 * all on a GPU; on a CPU device, where lavapipe compiles each module whole at its first dispatch
 * (matvec_sg_f32 took 82 s with all of it, the first run's whole wait), one token's mapping a
 * step at a time, and the experts' only in a mixture-of-experts model. */
static uint32_t forge__matvec_paths(const forge_model *m) {
    if (m->dev.caps.type != FORGE_DEVICE_CPU) return 7u;
    return m->cfg.n_experts > 0 ? 1u : 0u;
}

static bool forge__fuses_norm(const forge_model *m, uint32_t M) { return M <= forge__matvec_max_m(m) && m->dev.caps.subgroup_arith; }

/* Whether M rows of x times w can run on int8 activations (forge__linear_q8a): Q4_0 / Q8_0
 * weights, up to FORGE__MATVEC_MAX_M rows as far as the scratch holds their blocks (on any
 * device: matvec_q8a_rows is a module of its own, whatever forge__matvec_paths leaves out). */
static bool forge__q8a_fits(const forge__pass *p, const forge__weight *w, uint32_t M) {
    return M >= 1 && M <= FORGE__MATVEC_MAX_M && p->act_q8.buf && (w->fmt == FORGE__W_Q4_0 || w->fmt == FORGE__W_Q8_0) &&
           w->cols % 32 == 0 && M * forge__act_q8_bytes(w->cols) <= p->act_q8.size;
}
/* Whether one token's product with w runs on int8 activations: the decode layer's fused paths
 * (the chain, the attention's quantized merge, the shared expert's) take one row. */
static bool forge__uses_q8a(const forge__pass *p, const forge__weight *w, uint32_t M) { return M == 1 && forge__q8a_fits(p, w, M); }

/* Whether a one-token product of w into y [ldc] (y's columns col_off..) can quantize its
 * output row for the next product (matvec_q8a's Q8_OUT): it writes all ldc columns, ldc a
 * multiple of 32 that both scratches hold, and every chunk's outputs start at a multiple of 8
 * (each workgroup's 8 outputs are one group). */
#if FORGE__SG_PER_WG != 8
#error "matvec_q8a's Q8_OUT quantizes a workgroup's outputs as one group of 8"
#endif
static bool forge__q8_out_fits(const forge__pass *p, const forge__weight *w, uint32_t ldc, uint32_t col_off, bool gated) {
    uint64_t bytes = forge__act_q8_g8_bytes(ldc);
    if (!p->act_q8_res.buf || col_off != 0 || ldc % 32 != 0 || bytes > p->act_q8_res.size || bytes > p->act_q8.size ||
        (gated ? w->rows / 2 : w->rows) != ldc)
        return false;
    for (int i = 0; i < w->n_chunks; i++)
        if ((gated ? w->chunks[i].row0 / 2 : w->chunks[i].row0) % FORGE__SG_PER_WG != 0) return false;
    return true;
}

/* matvec_sg_pair (two outputs a subgroup: two rows, or gated four, the activations loaded once
 * for them, twice the loads in flight) for one token's products of plain-format weights with
 * forge_model.pairs_min_rows rows or more: on the H100 the F16 128256 x 2048 head went from 1.55
 * to 2.95 TB/s (decode, 1B F16 617.7 -> 633.8 tok/s, Qwen3-0.6B 630.4 -> 656.4, Gemma3-1B 402.6
 * -> 431.1), and with Qwen3-0.6B's 4096-output q|k|v paired too 662-666 -> 679-681; but the 1B
 * F16's products of 2048 outputs paired (128 workgroups for 132 SMs) fell to 594-600; the 1B
 * F16's gate|up (16384 rows) 39.2 -> 29.3 us a call, Qwen3-0.6B's (6144) 12.4 -> 10.8
 * (bench/RESULTS.md). The gated rows' loads take whole steps of 8 weights: K % 8 == 0.
 * matvec_q8a (Q4_0 / Q8_0 on int8 activations) takes gated products' outputs in pairs by the
 * same rule (forge__pair_outputs): the 1B Q4_0's gate|up 15.5 -> 13.8 us a call, decode +3%
 * (noisy); the 8B's 28672 x 4096 unchanged (34.3 / 34.8 us), its decode within noise. */
static bool forge__pair_outputs(const forge_model *m, uint32_t M, uint32_t outs, bool gated) {
    return m->pairs_min_rows && M == 1 && (gated ? 2 : 1) * outs >= m->pairs_min_rows && outs % 2 == 0;
}
static bool forge__matvec_pairs(const forge_model *m, const forge__weight *w, uint32_t M, uint32_t outs, bool gated) {
    return w->fmt <= FORGE__W_BF16 && forge__pair_outputs(m, M, outs, gated) && (!gated || w->cols % 8 == 0);
}

/* Rows a_row0 .. a_row0 + M of x [*, K] (times norm's weight if given, and over its RMS) to
 * int8 blocks of 32 in p->act_q8 (act_q8.comp, a row every forge__act_q8_bytes(K)), for the
 * products of flag QUANTIZED (one row) or matvec_q8a_rows after a barrier. */
static void forge__record_act_q8(const forge__pass *p, forge__range x, uint32_t a_row0, uint32_t M, uint32_t K, const forge__vec *norm) {
    forge__pc_act_q8 pq = {K, a_row0, norm ? FORGE__LINEAR_PRENORM : 0};
    forge__range bq[3] = {x, norm ? norm->r : p->dummy, p->act_q8};
    forge__dispatch(p->r, FORGE__OP_ACT_Q8, bq, &pq, (K / 32 + 63) / 64, M, 1);
}

/* M tokens' product on int8 activations (forge_model.act_q8, forge__q8a_fits): act_q8.comp
 * quantizes rows a_row0.. of x (times `norm`'s weight if given) into p->act_q8, then
 * matvec_q8a (M > 1: matvec_q8a_rows) multiplies each row-chunk of W with them (and divides by
 * each row's RMS). Arguments as forge__linear's; the flags below take one token;
 * in a decode layer's chain (forge__q8_chain) x comes quantized already (flags QUANTIZED:
 * in p->act_q8, QUANTIZED_RES: in p->act_q8_res, normed by `norm`; A_G8 where a product
 * wrote them, in groups of 8), and with Q8_OUT the product quantizes y for the next one, in
 * groups of 8 (into p->act_q8, or into p->act_q8_res times out_norm's weight: Q8_OUT_NORM). */
static void forge__linear_q8a(const forge__pass *p, const forge__weight *w, forge__range x, uint32_t a_row0, uint32_t M, forge__range y, uint32_t ldc,
                              uint32_t col_off, const forge__vec *bias, const forge__vec *norm, uint32_t flags, float softcap,
                              const forge__vec *out_norm) {
    forge_model *m = p->m;
    uint32_t K = w->cols, gx, gy;
    forge__range in = flags & FORGE__LINEAR_QUANTIZED_RES ? p->act_q8_res : p->act_q8;
    if (!(flags & (FORGE__LINEAR_QUANTIZED | FORGE__LINEAR_QUANTIZED_RES))) {
        forge__barrier(p->r); /* an earlier product may still read the scratch (free after the caller's barrier) */
        forge__record_act_q8(p, x, a_row0, M, K, norm);
        forge__barrier(p->r);
    }
    bool g8 = flags & (FORGE__LINEAR_QUANTIZED_RES | FORGE__LINEAR_A_G8);
    flags &= ~(FORGE__LINEAR_QUANTIZED | FORGE__LINEAR_QUANTIZED_RES | FORGE__LINEAR_A_G8);
    if (out_norm) flags |= FORGE__LINEAR_Q8_OUT | FORGE__LINEAR_Q8_OUT_NORM;
    bool gated = flags & FORGE__LINEAR_GATED;
    forge__range q8_out = !(flags & FORGE__LINEAR_Q8_OUT) ? p->dummy : out_norm ? p->act_q8_res : p->act_q8;
    forge__op op = M > 1 ? (forge__op)(FORGE__OP_MATVEC_Q8A_ROWS + (w->fmt == FORGE__W_Q8_0 ? 1 : 0))
                         : (forge__op)(FORGE__OP_MATVEC_Q8A + (w->fmt == FORGE__W_Q8_0 ? 4 : 0) + (g8 ? 2 : 0) + (flags & FORGE__LINEAR_Q8_OUT ? 1 : 0));
    for (int i = 0; i < w->n_chunks; i++) {
        const forge__wchunk *c = &w->chunks[i];
        uint32_t outs = gated ? c->rows / 2 : c->rows, out0 = gated ? c->row0 / 2 : c->row0;
        forge__range b[6] = {in, c->w, y, bias && bias->present ? bias->r : p->dummy, q8_out, out_norm ? out_norm->r : p->dummy};
        forge__pc_linear pc = {M, K, outs, 0, ldc, col_off + out0,
                               flags | (bias && bias->present ? FORGE__LINEAR_BIAS : 0) | (norm ? FORGE__LINEAR_PRENORM : 0),
                               col_off + out0, softcap, 0, 0, 0, (float)m->cfg.norm_eps, 0, 0, 0, 0, 0, 0, 0};
        bool paired = gated && forge__pair_outputs(m, M, outs, true); /* (+ 8: two outputs a subgroup, 16 a workgroup; one token) */
        uint32_t per_wg = paired ? 2 * FORGE__SG_PER_WG : FORGE__SG_PER_WG;
        forge__grid((outs + per_wg - 1) / per_wg, &gx, &gy);
        forge__dispatch(p->r, paired ? (forge__op)(op + 8) : op, b, &pc, gx, gy, 1);
    }
}

/* Rows a_row0 .. a_row0 + M of x [*, K] rounded to f16 into a16 [M, K] (act_f16.comp), for
 * matmul_cm, then a barrier. K % 8 == 0. */
static void forge__record_act_f16(forge__rec *r, forge__range x, uint32_t a_row0, uint32_t M, uint32_t K, forge__range a16) {
    forge__pc_act_f16 pc = {K, a_row0, M, 0, 0, 0};
    forge__range b[2] = {x, a16};
    uint32_t gx, gy;
    forge__grid(((uint64_t)M * (K / 8) + 255) / 256, &gx, &gy);
    forge__dispatch(r, FORGE__OP_ACT_F16, b, &pc, gx, gy, 1);
    forge__barrier(r);
}

/* C (+)= the sum of `splits` partial sums part [splits, M, N] (pc's M, N and epilogue: bias,
 * soft-cap, accumulate), linear_reduce.comp. */
static void forge__record_linear_reduce(forge__rec *r, forge__range part, forge__range c, forge__range bias, const forge__pc_linear *pc,
                                        uint32_t splits) {
    forge__pc_linear pr = *pc;
    pr.k_split = splits;
    forge__range b[4] = {part, part, c, bias};
    uint64_t threads = pc->N % 4 == 0 ? (uint64_t)pc->M * pc->N / 4 : (uint64_t)pc->M * pc->N;
    uint32_t gx, gy;
    forge__grid((threads + 255) / 256, &gx, &gy);
    forge__dispatch(r, FORGE__OP_LINEAR_REDUCE, b, &pr, gx, gy, 1);
}

/* y[M, ldc] (+)= x[a_row0 .., K] . W^T into columns col_off.. of y (the bias is indexed by
 * that column too), one dispatch per row-chunk of W. With `norm` (only where
 * forge__fuses_norm) x is RMS-normalized and scaled by norm first; GATED (the fused gate_up
 * weight) writes act(gate) * up, one output per row pair. One token of Q4_0 / Q8_0 weights
 * goes to forge__linear_q8a where the pass has int8 activations. */
static void forge__linear(const forge__pass *p, const forge__weight *w, forge__range x, uint32_t a_row0, uint32_t M, forge__range y,
                          uint32_t ldc, uint32_t col_off, const forge__vec *bias, const forge__vec *norm, uint32_t flags, float softcap) {
    forge_model *m = p->m;
    if (forge__q8a_fits(p, w, M) && (M == 1 || !(flags & (FORGE__LINEAR_QUANTIZED | FORGE__LINEAR_QUANTIZED_RES)))) {
        forge__linear_q8a(p, w, x, a_row0, M, y, ldc, col_off, bias, norm, flags, softcap, NULL);
        return;
    }
    flags &= ~(FORGE__LINEAR_QUANTIZED | FORGE__LINEAR_QUANTIZED_RES);
    bool vec = M <= forge__matvec_max_m(m), sg = forge__fuses_norm(m, M);
    /* Every product of more than FORGE__MATVEC_MAX_M rows runs on the tensor cores where the
     * device has them and the model is not exact: prefill, classify, training's forward and batch
     * decode's rows (on the H100 even 32 rows beat the SIMT kernels: 32 x 2048 x 16384 in 0.10 ms
     * against 0.17 for matmul_s; bench/RESULTS.md). */
    /* ... on x rounded to f16 first, into the pass's scratch (set where forge__uses_a16; after
     * a barrier: an earlier product may still read it); where that cannot hold x, on the SIMT
     * kernels */
    forge__range a16 = p->a16;
    bool cm = !vec && a16.buf && w->cols % 8 == 0 && 2ull * M * w->cols <= a16.size && forge__apart(a16, x) && forge__apart(a16, y);
    if (cm) {
        forge__barrier(p->r);
        forge__record_act_f16(p->r, x, a_row0, M, w->cols, a16);
    }
    bool gated = flags & FORGE__LINEAR_GATED;
    if (norm) flags |= FORGE__LINEAR_PRENORM;
    for (int i = 0; i < w->n_chunks; i++) {
        const forge__wchunk *c = &w->chunks[i];
        bool mlx = w->fmt == FORGE__W_MLX;
        uint32_t outs = gated ? c->rows / 2 : c->rows, out0 = gated ? c->row0 / 2 : c->row0;
        bool post = p->post_p.buf; /* (forge__post_fused: one token on matvec_sg, F32 / F16 / BF16, with a norm) */
        forge__range b[11] = {x, c->w, y, bias && bias->present ? bias->r : p->dummy, mlx ? c->scales : p->dummy,
                              mlx ? c->biases : p->dummy, norm ? norm->r : p->dummy, p->dummy,
                              post ? p->post_p : p->dummy, post ? p->post_w : p->dummy, post ? p->post_out : p->dummy};
        uint32_t split = forge__matvec_use_split(m->dev.caps.type == FORGE_DEVICE_CPU, w->fmt, M, outs, w->cols) ? forge__matvec_split_rows(outs) : 0;
        uint32_t rows_per_wg = forge__matvec_rows_per_wg(sg, split);
        forge__pc_linear pc = {M, w->cols, outs, a_row0, ldc, col_off + out0, flags | (bias && bias->present ? FORGE__LINEAR_BIAS : 0),
                               col_off + out0, softcap, w->bits, w->group, w->qflags, (float)m->cfg.norm_eps, split, 0, 0, 0, 0, 0, 0};
        uint32_t gx, gy;
        if (vec) { /* matvec_sg_post with the post-norm's input, matvec_sg_pair two rows a subgroup, else a row */
            bool pairs = sg && !post && forge__matvec_pairs(m, w, M, outs, gated);
            forge__op op = post ? FORGE__OP_MATVEC_SG_POST : pairs ? FORGE__OP_MATVEC_SG_PAIR : sg ? FORGE__OP_MATVEC_SG : FORGE__OP_MATVEC;
            uint32_t per_wg = pairs || post ? 2 * rows_per_wg : rows_per_wg; /* (matvec_sg_post: two gated outputs a subgroup) */
            forge__grid((outs + per_wg - 1) / per_wg, &gx, &gy);
            forge__dispatch(p->r, (forge__op)(op + w->fmt), b, &pc, gx, gy, 1);
            continue;
        }
        /* 128 x 128 tiles once there are enough of them to fill a large GPU (on the H100:
         * 512 x 16384 x 2048 in 1.23 ms against 1.69 ms with 64 x 64 tiles, while
         * 512 x 2048 x 8192, 64 big tiles, ran slower than with 256 small ones) */
        bool skinny = p->table == FORGE__TABLE_DECODE && M <= 32 && !cm; /* batch decode: 32 x 128 tiles */
        /* up to 32 rows of f16 weights: matmul_cm's 32 x 64 tiles that read W without staging it */
        bool cm_s = cm && M <= 32 && w->fmt == FORGE__W_F16 && c->rows % 16 == 0 && w->cols % 64 == 0;
        uint32_t tn = cm_s ? 64 : skinny || cm ? 128 : 64, tm = skinny || cm_s ? 32 : cm ? 128 : 64;
        forge__op plain = (forge__op)((skinny ? FORGE__OP_MATMUL_S : FORGE__OP_MATMUL) + w->fmt);
        forge__op cm_op = cm_s ? FORGE__OP_MATMUL_CM_S : (forge__op)(FORGE__OP_MATMUL_CM + w->fmt);
        forge__op split_op = cm ? cm_op : plain;
        uint64_t tiles = (uint64_t)((c->rows + tn - 1) / tn) * ((M + tm - 1) / tm);
        uint32_t splits = 1;
        forge__range part = forge__apart(p->split_part, y) && forge__apart(p->split_part, x) ? p->split_part
                          : forge__apart(p->split_alt, y) && forge__apart(p->split_alt, x) ? p->split_alt : (forge__range){0};
        if (part.buf && !gated && tiles < 256 && w->cols >= 128 && !forge__host_takes(p->r, plain, &pc)) { /* a few rows: split k to fill the device */
            splits = (uint32_t)FORGE__MIN(FORGE__MIN((uint64_t)8, (256 + tiles - 1) / tiles), w->cols / 64);
            while (splits > 1 && 4ull * splits * M * outs > part.size) splits--;
        }
        if (splits > 1) {
            uint32_t k_chunk = (uint32_t)forge__align_up((w->cols + splits - 1) / splits, cm ? 64 : 32); /* matmul_cm: whole k steps */
            splits = (w->cols + k_chunk - 1) / k_chunk;
            forge__pc_linear pp = pc;
            pp.flags = FORGE__LINEAR_SPLIT_K;
            pp.k_split = k_chunk;
            if (cm) pp.a_row0 = 0;
            forge__range bp[7] = {cm ? a16 : x, c->w, part, p->dummy, b[4], b[5], p->dummy};
            forge__dispatch(p->r, split_op, bp, &pp, (c->rows + tn - 1) / tn, (M + tm - 1) / tm, splits);
            forge__barrier(p->r);
            forge__record_linear_reduce(p->r, part, y, b[3], &pc, splits);
            forge__barrier(p->r);
            continue;
        }
        uint64_t big_tiles = (uint64_t)((c->rows + 127) / 128) * ((M + 127) / 128);
        bool big = !cm && big_tiles >= FORGE__BIG_TILES_MIN && !(p->table == FORGE__TABLE_DECODE && M <= 64); /* (a few rows: more, smaller tiles) */
        uint32_t tile = big ? 128 : 64;
        if (skinny) {
            forge__dispatch(p->r, plain, b, &pc, (c->rows + tn - 1) / tn, (M + tm - 1) / tm, 1);
            continue;
        }
        if (cm) {
            b[0] = a16;
            pc.a_row0 = 0;
            forge__dispatch(p->r, cm_op, b, &pc, (c->rows + tn - 1) / tn, (M + tm - 1) / tm, 1);
            continue;
        }
        forge__op op = (forge__op)((big ? FORGE__OP_MATMUL_BIG : FORGE__OP_MATMUL) + w->fmt);
        forge__dispatch(p->r, op, b, &pc, (c->rows + tile - 1) / tile, (M + tile - 1) / tile, 1);
    }
}

/* out[out_row0 + r] = (rmsnorm(x[x_row0 + r]) * w (+ out)) (* scale) for r < rows: flags
 * FORGE__NORM_ADD, FORGE__NORM_SCALE. eps: the model's, or eps / a^2 where x stands for a * x
 * (rmsnorm(a x) = x / sqrt(mean(x^2) + eps / a^2): a constant factor folded in exactly). */
static void forge__rmsnorm_ex(const forge__pass *p, forge__range x, uint32_t x_row0, const forge__vec *w, forge__range out, uint32_t out_row0,
                              uint32_t rows, uint32_t dim, uint32_t flags, float scale, double eps) {
    forge__range b[4] = {x, w->r, out, out};
    forge__pc_rmsnorm pc = {dim, x_row0, out_row0, flags, (float)eps, 0, 0, 0, scale};
    uint32_t gx, gy;
    forge__grid(rows, &gx, &gy);
    forge__dispatch(p->r, FORGE__OP_RMSNORM, b, &pc, gx, gy, 1);
}

/* out[out_row0 + r] (+)= rmsnorm(x[x_row0 + r]) * w for r < rows (flags 1: add). */
static void forge__rmsnorm(const forge__pass *p, forge__range x, uint32_t x_row0, const forge__vec *w, forge__range out, uint32_t out_row0,
                           uint32_t rows, uint32_t dim, uint32_t flags) {
    forge__rmsnorm_ex(p, x, x_row0, w, out, out_row0, rows, dim, flags, 1.0f, p->m->cfg.norm_eps);
}

/* out[0] = resid[0] + rmsnorm(x[0]) * w, one row of dim (a residual stream that a product with
 * matvec_sg's POST_ADD wrote to resid, forge__post_fused). */
static void forge__rmsnorm_resid(const forge__pass *p, forge__range x, const forge__vec *w, forge__range resid, forge__range out, uint32_t dim) {
    forge__range b[4] = {x, w->r, out, resid};
    forge__pc_rmsnorm pc = {dim, 0, 0, FORGE__NORM_ADD | FORGE__NORM_RESID, (float)p->m->cfg.norm_eps, 0, 0, 0, 1.0f};
    forge__dispatch(p->r, FORGE__OP_RMSNORM, b, &pc, 1, 1, 1);
}

/* Per-head RMSNorm in place over `heads` heads of `dim` starting at column col0 of each fused
 * qkv row of `stride` columns. */
static void forge__head_norm(const forge__pass *p, forge__range qkv, const forge__vec *w, uint32_t heads, uint32_t col0, uint32_t dim,
                             uint32_t stride) {
    uint32_t gx, gy;
    forge__range b[4] = {qkv, w->r, qkv, qkv};
    forge__pc_rmsnorm pc = {dim, 0, 0, 0, (float)p->m->cfg.norm_eps, heads, stride, col0, 1.0f};
    forge__grid((uint64_t)p->n * heads, &gx, &gy);
    forge__dispatch(p->r, FORGE__OP_RMSNORM, b, &pc, gx, gy, 1);
}

/* ---- The adapters' low-rank path (gemm.comp) ---- */

/* A strided view of an f32 matrix for gemm.comp: element (i, j) at off + i * si + j * sj. */
typedef struct forge__mview {
    forge__range r;
    uint32_t off, si, sj;
} forge__mview;

static forge__mview forge__rows(forge__range r, uint32_t off, uint32_t ld) { return (forge__mview){r, off, ld, 1}; }
static forge__mview forge__cols(forge__range r, uint32_t off, uint32_t ld) { return (forge__mview){r, off, 1, ld}; } /* transposed */

#define FORGE__GEMM_MAX_SPLITS 16 /* the partial sums' buffer holds this many of the widest product (fewer splits fit a wider one) */
/* A product is split until it has about FORGE__GEMM_FILL workgroups, in k chunks of at least
 * FORGE__GEMM_MIN_CHUNK, at most FORGE__GEMM_MOST_SPLITS: the low-rank products are thin (an
 * output of rank columns or rows) and read one large operand once, so they are bound by how
 * many loads are in flight, not by arithmetic. */
#ifndef FORGE__GEMM_FILL
#define FORGE__GEMM_FILL 4096
#endif
#ifndef FORGE__GEMM_MIN_CHUNK
#define FORGE__GEMM_MIN_CHUNK 64
#endif
#ifndef FORGE__GEMM_MOST_SPLITS
#define FORGE__GEMM_MOST_SPLITS 64
#endif

/* gemm_rank.comp's shapes: which of the three dimensions is the rank (<= FORGE__RANK_MAX). */
typedef enum forge__rank_shape {
    FORGE__RANK_WIDE, /* K: an output of tokens x features (y += s u B^T, dx += du A) */
    FORGE__RANK_ROWS, /* N, A's k contiguous (u = x A^T, du = s dy B) */
    FORGE__RANK_COLS, /* N, A's m contiguous (dB = s dy^T u; dA = du^T x transposed) */
    FORGE__RANK_NONE  /* gemm.comp */
} forge__rank_shape;
#define FORGE__RANK_MAX 64 /* gemm_rank.comp's widest build (RMAX) */
#define FORGE__RANK_WG_FILL 1024 /* gemm_rank's ROWS and COLS shapes are split along k to about this many workgroups */

/* Picks gemm_rank.comp's shape for a product, transposing it (C^T = B^T A^T: the views' strides
 * swapped) when the rank is M. NONE (the views unchanged) where no shape fits, or where dropout's index would not be
 * gemm.comp's (gemm_rank takes an element's index from its view's strides: x and dx are rows of
 * drop_ld floats). */
static forge__rank_shape forge__rank_pick(forge__mview *a, forge__mview *b, forge__mview *c, uint32_t *M, uint32_t *N, uint32_t K,
                                          uint32_t *drop_on, uint32_t drop_ld) {
    forge__mview ta = *a, tb = *b, tc = *c;
    uint32_t tM = *M, tN = *N, drop = *drop_on;
    bool transposed = tM <= FORGE__RANK_MAX && tN > FORGE__RANK_MAX && K > FORGE__RANK_MAX && drop != 1 && drop != 3;
    if (transposed) {
        ta = (forge__mview){b->r, b->off, b->sj, b->si}, tb = (forge__mview){a->r, a->off, a->sj, a->si};
        tc = (forge__mview){c->r, c->off, c->sj, c->si};
        tM = *N, tN = *M;
        if (drop == 2) drop = 1;
    }
    forge__rank_shape sh = K <= FORGE__RANK_MAX ? FORGE__RANK_WIDE : tN > FORGE__RANK_MAX ? FORGE__RANK_NONE
                         : ta.sj <= ta.si ? FORGE__RANK_ROWS : FORGE__RANK_COLS;
    /* gemm.comp's index of x: m drop_ld + k as A, k drop_ld + n as B (A here once transposed);
     * WIDE masks only its output */
    bool rows_of_ld = drop == 1 ? sh != FORGE__RANK_WIDE && (transposed ? ta.si == 1 && ta.sj == drop_ld : ta.si == drop_ld && ta.sj == 1)
                    : drop == 3 ? sh == FORGE__RANK_WIDE && tc.si == drop_ld && tc.sj == 1 : drop == 0;
    if (sh == FORGE__RANK_NONE || !rows_of_ld) return FORGE__RANK_NONE; /* (the views left as given) */
    *a = ta, *b = tb, *c = tc, *M = tM, *N = tN, *drop_on = drop;
    return sh;
}

/* C [M, N] (+)= alpha A [M, K] B [K, N]; drop_on / stream: dropout of x (gemm.comp). A product
 * with a long k and too few 32 x 32 tiles to fill the device is split along k into partial sums
 * (p->gemm_part, when the pass has one), then reduced in a fixed order; the partial buffer is
 * shared, so a split product ends with a barrier. Products with the rank as one dimension go to
 * gemm_rank.comp (forge__rank_pick), the same way split. */
static void forge__gemm(const forge__pass *p, forge__mview a, forge__mview b, forge__mview c, uint32_t M, uint32_t N, uint32_t K,
                        float alpha, bool accumulate, uint32_t drop_on, uint32_t drop_ld, uint32_t stream) {
    float rate = p->lora ? p->lora->dropout : 0.0f;
    bool drop = drop_on && p->dropout && rate > 0.0f;
    uint32_t r_drop = drop ? drop_on : 0, splits = 1, k_chunk = K, fill, wgs, gx, gy;
    forge__rank_shape shape = forge__rank_pick(&a, &b, &c, &M, &N, K, &r_drop, drop_ld);
    forge__op op = FORGE__OP_GEMM;
    if (shape == FORGE__RANK_NONE) { /* (the views as given: forge__rank_pick transposes only what it takes) */
        gx = (N + 31) / 32, gy = (M + 31) / 32, wgs = gx * gy, fill = FORGE__GEMM_FILL;
    } else { /* gemm_rank.comp's RMAX build; ROWS and COLS take 2 rows or m's a thread at RMAX 16, 1 at 64 */
        uint32_t rmax = (shape == FORGE__RANK_WIDE ? K : N) <= 16 ? 16 : 64, rpt = rmax == 16 ? 2 : 1, tm = rmax > 16 ? 16 : 32;
        op = (forge__op)(FORGE__OP_GEMM_RANK + 2 * shape + (rmax > 16));
        gx = shape == FORGE__RANK_WIDE ? (N + 255) / 256 : shape == FORGE__RANK_ROWS ? (M + 8 * rpt - 1) / (8 * rpt) : (M + 256 * rpt - 1) / (256 * rpt);
        gy = shape == FORGE__RANK_WIDE ? (M + tm - 1) / tm : 1;
        wgs = gx * gy, fill = shape == FORGE__RANK_WIDE ? 0 : FORGE__RANK_WG_FILL; /* (WIDE: k is the rank, never split) */
    }
    if (p->gemm_part.buf && K >= 2 * FORGE__GEMM_MIN_CHUNK && wgs < fill) {
        splits = FORGE__MIN(FORGE__MIN(FORGE__GEMM_MOST_SPLITS, K / FORGE__GEMM_MIN_CHUNK), (fill + wgs - 1) / wgs);
        while (splits > 1 && (uint64_t)splits * M * N * 4 > p->gemm_part.size) splits--;
        k_chunk = (uint32_t)forge__align_up((K + splits - 1) / splits, 32); /* (gemm_rank: B's chunk of 32 in shared memory) */
        splits = (K + k_chunk - 1) / k_chunk;
    }
    forge__pc_gemm pc = {M, N, K, a.off, a.si, a.sj, b.off, b.si, b.sj, c.off, c.si, c.sj, alpha, accumulate,
                         r_drop, drop_ld, stream, drop ? (uint32_t)fmin(4294967295.0, (double)rate * 4294967296.0) : 0u,
                         drop ? 1.0f / (1.0f - rate) : 1.0f, splits, k_chunk, 0};
    forge__range bind[5] = {a.r, b.r, c.r, p->params, splits > 1 ? p->gemm_part : p->dummy};
    forge__dispatch(p->r, op, bind, &pc, gx, gy, splits);
    if (splits > 1) { /* gemm.comp's reduction (gemm_rank writes the same partial-sum layout) */
        forge__barrier(p->r);
        pc.reduce = 1;
        forge__grid(((uint64_t)M * N + 63) / 64, &gx, &gy);
        forge__dispatch(p->r, FORGE__OP_GEMM, bind, &pc, gx, gy, 1);
        forge__barrier(p->r);
    }
}

/* The scratch columns of target t in acts.u ([n, FORGE__T_COUNT * max_rank]). */
static uint32_t forge__u_col(const forge__pass *p, forge__target t) { return (uint32_t)t * p->lora->max_rank; }
static uint32_t forge__u_ld(const forge__pass *p) { return FORGE__T_COUNT * p->lora->max_rank; }
static uint32_t forge__stream(int layer, forge__target t) { return (uint32_t)layer * FORGE__T_COUNT + (uint32_t)t; }

/* u_t = dropout(x) A^T for the adapted target t of layer l (x [n, in] rows). */
static void forge__lora_down(const forge__pass *p, const forge__acts *a, int l, forge__target t, forge__range x) {
    const forge__lora_pair *lp = forge__lora_at(p->lora, l, t);
    if (!lp) return;
    forge__gemm(p, forge__rows(x, 0, lp->in), forge__cols(lp->a, lp->a_el, lp->in), forge__rows(a->u, forge__u_col(p, t), forge__u_ld(p)),
                p->n, lp->rank, lp->in, 1.0f, false, 1, lp->in, forge__stream(l, t));
}

/* Target t's outputs in runs of its place in the fused output row: B's rows b0[k] .. b0[k] +
 * rows[k] are the row's outputs col[k] .. col[k] + rows[k] counted from the target's first.
 * One run (all `out` rows), but for Qwen 3.5's q_proj: its B holds the queries, then the output
 * gates (adapter.c: forge__b_row), which sit after v in the q|k|v|gate row. Returns the runs. */
static int forge__lora_runs(const forge__config *c, forge__target t, uint32_t out, uint32_t b0[2], uint32_t rows[2], uint32_t col[2]) {
    b0[0] = col[0] = 0;
    rows[0] = out;
    if (t != FORGE__T_Q || !c->attn_gate) return 1;
    uint32_t QD = (uint32_t)(c->n_heads * c->head_dim), KVD = (uint32_t)(c->n_kv_heads * c->head_dim);
    rows[0] = rows[1] = b0[1] = QD;
    col[1] = QD + 2 * KVD;
    return 2;
}

/* y[:, col0 + j * step] += scale * u_t B^T: the adapter's output added to the projection's. */
static void forge__lora_up(const forge__pass *p, const forge__acts *a, int l, forge__target t, forge__range y, uint32_t ldy, uint32_t col0,
                           uint32_t step) {
    const forge__lora_pair *lp = forge__lora_at(p->lora, l, t);
    if (!lp) return;
    uint32_t b0[2], rows[2], col[2];
    for (int k = 0, n = forge__lora_runs(&p->m->cfg, t, lp->out, b0, rows, col); k < n; k++)
        forge__gemm(p, forge__rows(a->u, forge__u_col(p, t), forge__u_ld(p)), forge__cols(lp->b, lp->b_el + b0[k] * lp->rank, lp->rank),
                    (forge__mview){y, col0 + col[k] * step, ldy, step}, p->n, rows[k], lp->rank, lp->scale, true, 0, 0, 0);
}

/* Whether layer l has an adapter on any of the targets in mask. */
static bool forge__lora_any(const forge__pass *p, int l, uint32_t mask) {
    for (int t = 0; t < FORGE__T_COUNT; t++)
        if ((mask >> t & 1u) && forge__lora_at(p->lora, l, (forge__target)t)) return true;
    return false;
}

#define FORGE__T_QKV (1u << FORGE__T_Q | 1u << FORGE__T_K | 1u << FORGE__T_V)
#define FORGE__T_GU (1u << FORGE__T_GATE | 1u << FORGE__T_UP)
#define FORGE__T_LIN_IN (1u << FORGE__T_LIN_QKV | 1u << FORGE__T_LIN_Z | 1u << FORGE__T_LIN_B | 1u << FORGE__T_LIN_A)

/* h = act(gate) * up over `count` elements of rows of `ffn`, the gates and ups in gu as `layout`
 * (FORGE__GU_PAIRS, FORGE__GU_HALVES) places them (act_mul.comp). */
static void forge__record_act_mul_ex(const forge__pass *p, forge__range h, forge__range gu, forge__range u2, uint32_t count, uint32_t ffn,
                                     uint32_t layout, uint32_t act, uint32_t u2_stride, uint32_t u2_col0) {
    uint32_t gx, gy;
    forge__pc_act pc = {count, act, layout, ffn, u2_stride, u2_col0};
    forge__range b[3] = {h, gu, u2.buf ? u2 : p->dummy};
    forge__grid(((uint64_t)count + 255) / 256, &gx, &gy);
    forge__dispatch(p->r, FORGE__OP_ACT_MUL, b, &pc, gx, gy, 1);
}
static void forge__record_act_mul(const forge__pass *p, forge__range h, forge__range gu, uint32_t count, uint32_t ffn, uint32_t layout) {
    forge__record_act_mul_ex(p, h, gu, (forge__range){0}, count, ffn, layout, (uint32_t)p->m->cfg.act, 0, 0);
}

/* ---- Mixture of experts ----
 * A mixture-of-experts layer's router picks each token's top_k experts: moe_route.comp writes
 * (expert, weight) per (token, choice) pair p = t * top_k + j into acts.route. The experts'
 * gated MLPs then run on the chosen pairs only. A few tokens on a subgroup device (decode):
 * matvec_sg reads just the chosen experts' rows, a workgroup layer per pair for gate|up and
 * each for down too (a token's choices in parallel, not in turn: the H200 read the 30B-A3B
 * shape's down experts at 0.31 TB/s summing in the kernel). Otherwise (prefill): moe_group.comp
 * sorts the pairs by expert into tiles of at most 32 or 64 pairs (forge__moe_tile_rows), and
 * matmul.comp's MOE build (SKINNY for 32) multiplies each tile with its expert's rows; with
 * tensor cores, matmul_cm.comp's MOE build does, on f16 copies of the inputs, in 32-pair tiles. Either way moe_combine.comp then sums each
 * token's outputs by weight. Expert weights are row-chunked by whole experts
 * (forge__plan_expert_weight); every dispatch runs per chunk and skips the others' experts. */

/* acts.route from the router's logits in acts.router (moe_route.comp). */
static void forge__record_route_pick(const forge__pass *p, int l, const forge__acts *a) {
    const forge__config *c = &p->m->cfg;
    const forge__layer *ly = &p->m->layers[l];
    bool scaled = c->router == FORGE__ROUTER_GEMMA4;
    forge__pc_moe_route pc = {(uint32_t)c->n_experts, (uint32_t)c->n_experts_used, (c->moe_norm_topk ? 1u : 0u) | (scaled ? 2u : 0u), p->n};
    forge__range b[3] = {a->router, a->route, scaled ? ly->expert_scale.r : p->dummy};
    uint32_t gx, gy;
    forge__grid(p->n, &gx, &gy);
    forge__dispatch(p->r, FORGE__OP_MOE_ROUTE, b, &pc, gx, gy, 1);
}

/* The router: acts.route from the normed input xin [n, H]. */
static void forge__record_route(const forge__pass *p, int l, const forge__acts *a, forge__range xin) {
    const forge__config *c = &p->m->cfg;
    const forge__layer *ly = &p->m->layers[l];
    uint32_t E = (uint32_t)c->n_experts;
    forge__linear(p, &ly->router, xin, 0, p->n, a->router, E, 0, NULL, NULL, 0, 0);
    forge__barrier(p->r);
    forge__record_route_pick(p, l, a);
    forge__barrier(p->r);
}

/* A few tokens' experts on matvec_sg (forge__experts_by_pair), acts.route set: h [pairs, I] =
 * act(gate) * up of each pair's expert on xin's rows ... */
static void forge__record_experts_gate_up(const forge__pass *p, int l, const forge__acts *a, forge__range xin, forge__range h) {
    const forge__config *c = &p->m->cfg;
    const forge__weight *gu = &p->m->layers[l].exp_gate_up;
    uint32_t K = (uint32_t)c->n_experts_used, I = (uint32_t)c->moe_ffn, H = (uint32_t)c->hidden, rows = forge__matvec_rows_per_wg(true, 0), gx, gy;
    uint32_t act_flag = c->act == FORGE__ACT_GELU_TANH ? FORGE__LINEAR_GELU : 0;
    for (int i = 0; i < gu->n_chunks; i++) {
        const forge__wchunk *ch = &gu->chunks[i];
        bool mlx = gu->fmt == FORGE__W_MLX;
        forge__range b[8] = {xin, ch->w, h, p->dummy, mlx ? ch->scales : p->dummy, mlx ? ch->biases : p->dummy, p->dummy, a->route};
        forge__pc_linear pc = {1, H, I, 0, I, 0, FORGE__LINEAR_GATED | FORGE__LINEAR_EXPERTS | act_flag, 0, 0, gu->bits, gu->group,
                               gu->qflags, 0, 0, 0, ch->row0 / (2 * I), ch->rows / (2 * I), K, K, 0};
        forge__grid((I + rows - 1) / rows, &gx, &gy);
        forge__dispatch(p->r, (forge__op)(FORGE__OP_MATVEC_SG + gu->fmt), b, &pc, gx, gy, p->n * K);
    }
}
/* ... then moe_y [pairs, H] = down(h) of each pair's expert */
static void forge__record_experts_down(const forge__pass *p, int l, const forge__acts *a, forge__range h) {
    const forge__config *c = &p->m->cfg;
    const forge__weight *dn = &p->m->layers[l].exp_down;
    uint32_t K = (uint32_t)c->n_experts_used, I = (uint32_t)c->moe_ffn, H = (uint32_t)c->hidden, rows = forge__matvec_rows_per_wg(true, 0), gx, gy;
    for (int i = 0; i < dn->n_chunks; i++) {
        const forge__wchunk *ch = &dn->chunks[i];
        bool mlx = dn->fmt == FORGE__W_MLX;
        forge__range b[8] = {h, ch->w, a->moe_y, p->dummy, mlx ? ch->scales : p->dummy, mlx ? ch->biases : p->dummy, p->dummy, a->route};
        forge__pc_linear pc = {1, I, H, 0, H, 0, FORGE__LINEAR_EXPERTS, 0, 0, dn->bits, dn->group, dn->qflags, 0, 0, 0,
                               ch->row0 / H, ch->rows / H, K, 1, 0};
        forge__grid((H + rows - 1) / rows, &gx, &gy);
        forge__dispatch(p->r, (forge__op)(FORGE__OP_MATVEC_SG + dn->fmt), b, &pc, gx, gy, p->n * K);
    }
}
/* out [n, H] (+)= each token's moe_y rows by their weights (moe_combine.comp). */
static void forge__record_experts_combine(const forge__pass *p, const forge__acts *a, forge__range out, bool accumulate) {
    const forge__config *c = &p->m->cfg;
    uint32_t H = (uint32_t)c->hidden, gx, gy;
    forge__pc_moe_combine pcm = {p->n, H, (uint32_t)c->n_experts_used, accumulate ? 1u : 0u};
    forge__range bc[3] = {a->route, a->moe_y, out};
    forge__grid(p->n, &gx, &gy);
    forge__dispatch(p->r, FORGE__OP_MOE_COMBINE, bc, &pcm, (H + 255) / 256, gx, gy);
}
/* (training groups the pairs however few: the backward pass reads the gate|up rows and the table) */
static bool forge__experts_by_pair(const forge__pass *p) { return !p->train && p->n <= forge__matvec_max_m(p->m) && p->m->dev.caps.subgroup_arith; }

/* out [n, H] (+)= sum over each token's choices of weight * expert(xin row) (acts.route set). */
static void forge__record_experts(const forge__pass *p, int l, const forge__acts *a, forge__range xin, forge__range out, bool accumulate) {
    forge_model *m = p->m;
    const forge__config *c = &m->cfg;
    const forge__layer *ly = &m->layers[l];
    const forge__weight *gu = &ly->exp_gate_up, *dn = &ly->exp_down;
    uint32_t n = p->n, K = (uint32_t)c->n_experts_used, I = (uint32_t)c->moe_ffn, H = (uint32_t)c->hidden, pairs = n * K;
    forge__rec *r = p->r;
    if (forge__experts_by_pair(p)) {
        forge__record_experts_gate_up(p, l, a, xin, a->h);
        forge__barrier(r);
        forge__record_experts_down(p, l, a, a->h);
    } else {
        /* the pairs grouped by expert; on the tensor cores (matmul_cm_moe, 32-pair tiles) where
         * the pass has them and f16 copies of both inputs fit its scratch */
        uint32_t E = (uint32_t)c->n_experts, order_off = forge__moe_order_off(E, pairs);
        forge__range a16 = p->a16, egu = a->exp_gu.buf ? a->exp_gu : a->gu, eh = a->exp_h.buf ? a->exp_h : a->h;
        bool cm = a16.buf && H % 8 == 0 && I % 8 == 0 && 2ull * n * H <= a16.size && 2ull * pairs * I <= a16.size && forge__apart(a16, xin) &&
                  forge__apart(a16, eh) && forge__apart(a16, egu) && forge__apart(a16, a->moe_y);
        uint32_t bm = cm ? FORGE__MOE_BM_S : forge__moe_tile_rows(E, pairs);
        uint32_t tiles = (pairs + bm - 1) / bm + E, bn = cm || bm == FORGE__MOE_BM_S ? 128 : 64; /* tiles: 32 x 128 or 64 x 64 */
        forge__op moe_op = cm ? FORGE__OP_MATMUL_CM_MOE : bm == FORGE__MOE_BM_S ? FORGE__OP_MATMUL_MOE_S : FORGE__OP_MATMUL_MOE;
        forge__pc_moe_group pg = {pairs, (uint32_t)c->n_experts, bm, order_off};
        forge__range bg[2] = {a->route, a->moe};
        forge__dispatch(r, FORGE__OP_MOE_GROUP, bg, &pg, 1, 1, 1);
        if (cm) forge__record_act_f16(r, xin, 0, n, H, a16); /* (its barrier orders moe_group too) */
        forge__barrier(r);
        for (int i = 0; i < gu->n_chunks; i++) { /* gu [pairs, 2I]: each pair's gate and up, interleaved */
            const forge__wchunk *ch = &gu->chunks[i];
            bool mlx = gu->fmt == FORGE__W_MLX;
            forge__range b[7] = {cm ? a16 : xin, ch->w, egu, p->dummy, mlx ? ch->scales : p->dummy, mlx ? ch->biases : p->dummy, a->moe};
            forge__pc_linear pc = {pairs, H, 2 * I, 0, 2 * I, 0, 0, 0, 0, gu->bits, gu->group, gu->qflags, 0, 0, 0,
                                   ch->row0 / (2 * I), ch->rows / (2 * I), K, K, order_off};
            forge__dispatch(r, (forge__op)(moe_op + gu->fmt), b, &pc, (2 * I + bn - 1) / bn, tiles, 1);
        }
        forge__barrier(r);
        forge__record_act_mul(p, eh, egu, pairs * I, I, FORGE__GU_PAIRS);
        forge__barrier(r);
        if (cm) forge__record_act_f16(r, eh, 0, pairs, I, a16);
        for (int i = 0; i < dn->n_chunks; i++) { /* moe_y [pairs, H] */
            const forge__wchunk *ch = &dn->chunks[i];
            bool mlx = dn->fmt == FORGE__W_MLX;
            forge__range b[7] = {cm ? a16 : eh, ch->w, a->moe_y, p->dummy, mlx ? ch->scales : p->dummy, mlx ? ch->biases : p->dummy, a->moe};
            forge__pc_linear pc = {pairs, I, H, 0, H, 0, 0, 0, 0, dn->bits, dn->group, dn->qflags, 0, 0, 0, ch->row0 / H, ch->rows / H, K, 1,
                                   order_off};
            forge__dispatch(r, (forge__op)(moe_op + dn->fmt), b, &pc, (H + bn - 1) / bn, tiles, 1);
        }
    }
    forge__barrier(r);
    forge__record_experts_combine(p, a, out, accumulate);
}

/* Qwen 3.5-MoE's MLP for a few tokens (the experts on matvec_sg: decode): x += shared(xn) +
 * experts(xn), xn = ffn_norm(x). The shared expert and the routed ones read the same row, so
 * each stage holds one of each where neither waits on the other: 7 barriers a layer where one
 * after the other took 13 (and the shared expert's gate reads the int8 row its gate|up does).
 * The experts' middle goes to h after the shared expert's (rows n ..). False, recording nothing,
 * with adapters or where h cannot hold both. */
static bool forge__record_shared_moe_by_pair(const forge__pass *p, int l, const forge__acts *a, bool adapters) {
    forge_model *m = p->m;
    const forge__config *c = &m->cfg;
    const forge__layer *ly = &m->layers[l];
    forge__rec *r = p->r;
    uint32_t n = p->n, H = (uint32_t)c->hidden, F = (uint32_t)c->layer_ffn[l], K = (uint32_t)c->n_experts_used, I = (uint32_t)c->moe_ffn;
    uint64_t h2_off = forge__align_up(4ull * n * F, m->dev.caps.storage_align);
    if (adapters || !forge__experts_by_pair(p) || !ly->dense_mlp || h2_off + 4ull * n * K * I > a->h.size) return false;
    forge__range h2 = {a->h.buf, a->h.offset + h2_off, 4ull * n * K * I};
    bool q8 = ly->fused_gate_up ? forge__uses_q8a(p, &ly->gate_up, n) : forge__uses_q8a(p, &ly->gate, n) || forge__uses_q8a(p, &ly->up, n);
    q8 |= forge__uses_q8a(p, &ly->shared_gate, n);
    bool q8_down = forge__uses_q8a(p, &ly->down, n);
    uint32_t qf = q8 ? FORGE__LINEAR_QUANTIZED : 0, layout = ly->fused_gate_up ? FORGE__GU_PAIRS : FORGE__GU_HALVES;
    forge__rmsnorm(p, a->x, 0, &ly->ffn_norm, a->xn, 0, n, H, 0);
    forge__barrier(r);
    /* the router's logits; the row in int8 for the shared expert */
    forge__linear(p, &ly->router, a->xn, 0, n, a->router, (uint32_t)c->n_experts, 0, NULL, NULL, 0, 0);
    if (q8) forge__record_act_q8(p, a->xn, 0, 1, H, NULL);
    forge__barrier(r);
    /* the route; the shared expert's gate|up and its gate */
    forge__record_route_pick(p, l, a);
    if (ly->fused_gate_up) {
        forge__linear(p, &ly->gate_up, a->xn, 0, n, a->gu, 2 * F, 0, NULL, NULL, qf, 0);
    } else {
        forge__linear(p, &ly->gate, a->xn, 0, n, a->gu, 2 * F, 0, NULL, NULL, qf, 0);
        forge__linear(p, &ly->up, a->xn, 0, n, a->gu, 2 * F, F, NULL, NULL, qf, 0);
    }
    forge__linear(p, &ly->shared_gate, a->xn, 0, n, a->shared_s, 1, 0, NULL, NULL, qf, 0);
    forge__barrier(r);
    /* the experts' gate|up; the shared expert's middle, times sigmoid(gate) */
    forge__record_experts_gate_up(p, l, a, a->xn, h2);
    forge__record_act_mul_ex(p, a->h, a->gu, a->shared_s, n * F, F, layout, (uint32_t)c->act | FORGE__ACT_ROW_SIGMOID, 1, 0);
    forge__barrier(r);
    /* the experts' down; the shared middle in int8 */
    forge__record_experts_down(p, l, a, h2);
    if (q8_down) forge__record_act_q8(p, a->h, 0, 1, F, NULL);
    forge__barrier(r);
    forge__linear(p, &ly->down, a->h, 0, n, a->x, H, 0, NULL, NULL, FORGE__LINEAR_ACCUMULATE | (q8_down ? FORGE__LINEAR_QUANTIZED : 0), 0);
    forge__barrier(r);
    forge__record_experts_combine(p, a, a->x, true);
    return true;
}

/* ---- Qwen 3.5's linear attention (Gated DeltaNet) ----
 * In place of a layer's attention: x += out_proj(gated_norm(delta_rule(silu(conv(q|k|v)), z, b, a))),
 * q|k|v, z, b, a from one in-projection of norm(x). The recurrent states (the convolution's last
 * inputs, the delta rule's S) are the layer's in the session (kc, vc), per sequence: the step's
 * rows come in groups of one sequence each, taken in order by conv1d.comp and delta_rule.comp:
 * all rows (one sequence's prefill or decode step), seq rows each (a classify batch, every
 * sequence from position 0), or batch generation's rows (one prompt's, or one row per
 * sequence). A sequence whose group starts at position 0 starts from zero states. */
/* The invocations a state column of delta_rule_sg.comp takes (k_dim / lanes <= 32 rows each,
 * a power of two within the subgroup), or 0 for delta_rule.comp: a device without subgroup
 * shuffles, a key head dim over 256 or not a multiple of the lanes. */
static uint32_t forge__delta_lanes(const forge_model *m) {
    uint32_t DK = (uint32_t)m->cfg.lin_k_dim, lanes = 1;
    while (lanes * 32 < DK) lanes *= 2;
    if (!m->dev.caps.subgroup_shuffle || lanes > 8 || lanes > m->dev.caps.subgroup_size || DK % lanes) return 0;
    return lanes;
}

static void forge__record_linear(const forge__pass *p, int l, const forge__acts *a) {
    forge_model *m = p->m;
    forge__rec *r = p->r;
    const forge__config *c = &m->cfg;
    const forge__layer *ly = &m->layers[l];
    uint32_t n = p->n, H = (uint32_t)c->hidden, CD = forge__lin_conv_dim(c), VD = forge__lin_v_dim(c), NV = (uint32_t)c->lin_v_heads;
    uint32_t MIX = (uint32_t)forge__lin_mix_dim(c);
    forge__range in = a->x;
    const forge__vec *norm = &ly->attn_norm;
    if (!p->fuse) {
        forge__rmsnorm(p, a->x, 0, &ly->attn_norm, a->xn, 0, n, H, 0);
        forge__barrier(r);
        in = a->xn;
        norm = NULL;
    }
    const uint32_t col0[4] = {0, CD, CD + VD, CD + VD + NV}; /* in_proj_qkv, _z, _b, _a in the row */
    if (ly->fused_lin) {
        forge__linear(p, &ly->lin_in, in, 0, n, a->lin_mix, MIX, 0, NULL, norm, 0, 0);
    } else {
        const forge__weight *ws[4] = {&ly->lin_qkv, &ly->lin_z, &ly->lin_b, &ly->lin_a};
        for (int i = 0; i < 4; i++) forge__linear(p, ws[i], in, 0, n, a->lin_mix, MIX, col0[i], NULL, norm, 0, 0);
    }
    if (forge__lora_any(p, l, FORGE__T_LIN_IN)) { /* (p->fuse is off with adapters: in is xn) */
        for (int i = 0; i < 4; i++) forge__lora_down(p, a, l, (forge__target)(FORGE__T_LIN_QKV + i), a->xn);
        forge__barrier(r);
        for (int i = 0; i < 4; i++) forge__lora_up(p, a, l, (forge__target)(FORGE__T_LIN_QKV + i), a->lin_mix, MIX, col0[i], 1);
    }
    forge__barrier(r);
    uint32_t group = p->table == FORGE__TABLE_DECODE ? 1 : p->seq ? p->seq : n, table = p->table ? 1u : 0u;
    forge__pc_conv pc = {n, CD, (uint32_t)c->lin_conv, MIX, group, table};
    forge__range bc[5] = {p->params, a->lin_mix, ly->conv_w.r, a->kc, a->lin_qkv};
    forge__dispatch(r, FORGE__OP_CONV1D, bc, &pc, (CD + 31) / 32, n / group, 1);
    forge__barrier(r);
    const uint32_t DK = (uint32_t)c->lin_k_dim, DV = (uint32_t)c->lin_v_dim, lanes = forge__delta_lanes(m);
    /* a prompt's groups in chunks (delta_rule_prep then delta_rule_chunk: n / 64 dependent steps
     * instead of n), where the pass has the work buffer for them; else the recurrent form */
    const bool chunked = forge__delta_chunked(c, group) && a->lin_chunk.size >= forge__delta_chunk_bytes(c, n);
    forge__pc_delta pd = {n, (uint32_t)c->lin_k_heads, NV, DK, DV, group, table, MIX, CD, CD + VD, CD + VD + NV, (float)c->norm_eps,
                          c->lin_v_tiled ? 1u : 0u, lanes, chunked ? FORGE__DELTA_CHUNK : 0};
    forge__range bd[8] = {p->params, a->lin_qkv, a->lin_mix, ly->lin_neg_a.r, ly->dt_bias.r, ly->lin_norm.r, a->vc, a->lin_out};
    if (chunked) {
        uint32_t chunks = (group + FORGE__DELTA_CHUNK - 1) / FORGE__DELTA_CHUNK;
        forge__range bp[5] = {a->lin_qkv, a->lin_mix, ly->lin_neg_a.r, ly->dt_bias.r, a->lin_chunk};
        forge__dispatch(r, FORGE__OP_DELTA_RULE_PREP, bp, &pd, chunks * NV, n / group, 1);
        forge__barrier(r);
        forge__range bk[5] = {p->params, a->lin_qkv, a->lin_chunk, a->vc, a->lin_out};
        forge__dispatch(r, FORGE__OP_DELTA_RULE_CHUNK, bk, &pd, NV * ((DV + FORGE__DELTA_CHUNK_COLS - 1) / FORGE__DELTA_CHUNK_COLS), n / group, 1);
    } else if (lanes) { /* the state's columns in registers over many workgroups, then the gated norm per head */
        forge__dispatch(r, FORGE__OP_DELTA_RULE_SG, bd, &pd, (NV * DV + 64 / lanes - 1) / (64 / lanes), n / group, 1);
    } else {
        forge__dispatch(r, FORGE__OP_DELTA_RULE, bd, &pd, NV, n / group, 1);
    }
    if (chunked || lanes) {
        forge__barrier(r);
        forge__range bn[3] = {a->lin_mix, ly->lin_norm.r, a->lin_out};
        forge__dispatch(r, FORGE__OP_GATED_NORM, bn, &pd, NV, n, 1);
    }
    forge__barrier(r);
    forge__linear(p, &ly->wo, a->lin_out, 0, n, a->x, H, 0, NULL, NULL, FORGE__LINEAR_ACCUMULATE, 0);
    if (forge__lora_any(p, l, 1u << FORGE__T_LIN_OUT)) {
        forge__lora_down(p, a, l, FORGE__T_LIN_OUT, a->lin_out);
        forge__barrier(r);
        forge__lora_up(p, a, l, FORGE__T_LIN_OUT, a->x, H, 0, 1);
    }
}

/* ---- One layer ---- */

/* Whether layer l of a one-token decode runs as a chain of int8 products that quantize their
 * outputs for the next (matvec_q8a's Q8_OUT) instead of an act_q8 dispatch before each: q|k|v
 * read the residual stream as the last layer's down product quantized it (times this layer's
 * attention norm), o gets its input from the attention's merge and quantizes the residual for
 * gate|up (times the MLP norm), gate|up quantizes the MLP's middle for down, and down the
 * residual for the next layer's q|k|v (not the head's: the 128256-row product read the G8
 * scales 6-25% slower than act_q8's, more than the dispatch before it costs; measured while the
 * G8 path was a flag of the plain module, not since).
 * Two act_q8 dispatches and barriers fewer a layer (about 4 us each on the H100: 49 of them
 * were 184 us of a 1.2 ms token of the 1B Q4_0 shape, bench/RESULTS.md). The chained
 * activations are rounded in groups of 8 (a product's workgroup's outputs), not act_q8's blocks
 * of 32: finer, so the logits differ from the unchained path's by that rounding (H100, decode:
 * the 1B Q4_0 shape 920 -> 1029 tok/s, 1B Q8_0 801 -> 889, 8B Q4_0 303 -> 319). The plain Llama /
 * Qwen 3 layer only: norms fused (no adapter), dense MLP with fused gate|up, no sandwich norms or
 * per-layer inputs, every product on int8 activations. */
static bool forge__q8_chain(const forge__pass *p, int l) {
    const forge_model *m = p->m;
    const forge__config *c = &m->cfg;
    if (l < 0 || l >= c->n_layers) return false;
    const forge__layer *ly = &m->layers[l];
    if (!m->q8_chain || p->n != 1 || p->table || p->train || !p->fuse || !p->act_q8_res.buf || !ly->dense_mlp || !ly->fused_gate_up || c->sandwich_norms ||
        c->ple_dim || forge__kv_shared(c, l) || ly->linear || c->attn_gate || c->layer_moe[l])
        return false;
    uint32_t H = (uint32_t)c->hidden, F = (uint32_t)c->layer_ffn[l];
    bool qkv = ly->fused_qkv ? forge__uses_q8a(p, &ly->wqkv, 1)
                             : forge__uses_q8a(p, &ly->wq, 1) && forge__uses_q8a(p, &ly->wk, 1) && forge__uses_q8a(p, &ly->wv, 1);
    return qkv && forge__uses_q8a(p, &ly->wo, 1) && forge__uses_q8a(p, &ly->gate_up, 1) && forge__uses_q8a(p, &ly->down, 1) &&
           forge__q8_out_fits(p, &ly->wo, H, 0, false) && forge__q8_out_fits(p, &ly->gate_up, F, 0, true) && forge__q8_out_fits(p, &ly->down, H, 0, false);
}

/* The prefill attention on tensor cores (attention_cm.comp: queries a workgroup below) for heads
 * of D elements where the pass can take it: an f16 or q8_0 cache (q8_0 staged to f16 tiles),
 * tensor cores and not `exact` (q and P are rounded to f16), a head of 64, 128 or 256; else
 * FORGE__OP_COUNT (attention_tiled). */
#define FORGE__ATTN_CM_QUERIES 64
static forge__op forge__attn_cm_head_op(uint32_t D) {
    return D == 64 ? FORGE__OP_ATTN_CM : D == 128 ? FORGE__OP_ATTN_CM_128 : D == 256 ? FORGE__OP_ATTN_CM_256 : FORGE__OP_COUNT;
}
/* A kernel that reads or writes the KV cache: its build for the pass's cache type. */
static forge__op forge__kv_op(const forge__pass *p, forge__op f32, forge__op f16, forge__op q8) {
    return p->kv == FORGE_KV_Q8_0 ? q8 : p->kv == FORGE_KV_F16 ? f16 : f32;
}
static forge__op forge__attn_cm_op(const forge__pass *p, uint32_t D) {
    forge__op f16 = forge__attn_cm_head_op(D);
    if ((p->kv != FORGE_KV_F16 && p->kv != FORGE_KV_Q8_0) || !p->m->attn_cm || !forge__uses_a16(p->m) || f16 == FORGE__OP_COUNT) return FORGE__OP_COUNT;
    return forge__kv_op(p, FORGE__OP_COUNT, f16, (forge__op)(f16 + (FORGE__OP_ATTN_CM_KV8 - FORGE__OP_ATTN_CM)));
}

/* Gemma 2 / 3 decode: the post-attention norm added to the residual stream inside the gate|up
 * product (matvec_sg's POST_ADD: it reads the residual and the attention block's output and
 * writes their sum to a->gu, free in a fused gate|up product), and the post-MLP norm then adds
 * that to its own output into a->x (rmsnorm's FORGE__NORM_RESID): one dependent rmsnorm dispatch
 * fewer a layer (on the H100 each took 10.8 us; the Gemma3-1B shape's token had 52). One token
 * on matvec_sg, F32 / F16 / BF16 weights (int8 activations norm their input in act_q8), no
 * adapter on o or gate|up, nothing else between the norms (Gemma 4's experts, per-layer inputs
 * and layer scalars). */
static bool forge__post_fused(const forge__pass *p, int l, const forge__acts *a) {
    const forge__config *c = &p->m->cfg;
    const forge__layer *ly = &p->m->layers[l];
    for (int i = 0; i < ly->gate_up.n_chunks; i++) /* matvec_sg_post takes two gated outputs (four rows) a subgroup */
        if (ly->gate_up.chunks[i].rows % 4 != 0) return false;
    return c->sandwich_norms && p->n == 1 && !p->table && !p->train && p->fuse && ly->dense_mlp && ly->fused_gate_up && !c->ple_dim &&
           !c->layer_moe[l] && ly->out_scale == 1.0f && ly->gate_up.fmt <= FORGE__W_BF16 && !forge__uses_q8a(p, &ly->gate_up, 1) &&
           c->hidden % 8 == 0 && !forge__lora_any(p, l, FORGE__T_GU | (1u << FORGE__T_O)) && !a->x_mid.buf &&
           a->gu.size >= 4ull * c->hidden && forge__apart(a->gu, a->x) && forge__apart(a->gu, a->o) && forge__apart(a->gu, a->h);
}

/* One layer: attention block, then the MLP, each added to the residual stream a->x. */
static void forge__record_layer(const forge__pass *p, int l, const forge__acts *a) {
    forge_model *m = p->m;
    forge__rec *r = p->r;
    const forge__config *c = &m->cfg;
    const forge__layer *ly = &m->layers[l];
    bool shared = forge__kv_shared(c, l); /* Gemma 4's tail: queries only, attending to an earlier layer's cache */
    bool post_fused = forge__post_fused(p, l, a);
    uint32_t n = p->n, H = (uint32_t)c->hidden, D = forge__hd(c, l), NH = (uint32_t)c->n_heads, NKV = forge__nkv(c, l);
    uint32_t QD = NH * D, KVD = NKV * D, QKVD = forge__qkv_dim(c, l), F = (uint32_t)c->layer_ffn[l];
    uint32_t gx, gy;
    if (a->x_in.buf) forge__copy(r, a->x, a->x_in, 4ull * n * H);
    /* a chain of int8 products (forge__q8_chain): x comes quantized by the layer before */
    bool chain = forge__q8_chain(p, l);
    if (ly->linear) { /* Qwen 3.5: linear attention in place of attention */
        forge__record_linear(p, l, a);
    } else {
        forge__range qkv_in = a->x;
        const forge__vec *qkv_norm = &ly->attn_norm;
        if (!p->fuse) {
            forge__rmsnorm(p, a->x, 0, &ly->attn_norm, a->xn, 0, n, H, 0);
            forge__barrier(r);
            qkv_in = a->xn;
            qkv_norm = NULL;
        }
        const forge__vec *bqkv = c->qkv_bias ? &ly->bqkv : NULL;
        bool chained_in = chain && forge__q8_chain(p, l - 1);
        uint32_t qkv_flags = chained_in ? FORGE__LINEAR_QUANTIZED_RES : 0;
        if (ly->fused_qkv) {
            forge__linear(p, &ly->wqkv, qkv_in, 0, n, a->qkv, QKVD, 0, bqkv, qkv_norm, qkv_flags, 0);
        } else {
            forge__linear(p, &ly->wq, qkv_in, 0, n, a->qkv, QKVD, 0, bqkv, qkv_norm, qkv_flags, 0);
            if (!shared) {
                forge__linear(p, &ly->wk, qkv_in, 0, n, a->qkv, QKVD, QD, bqkv, qkv_norm, qkv_flags, 0);
                forge__linear(p, &ly->wv, qkv_in, 0, n, a->qkv, QKVD, QD + KVD, bqkv, qkv_norm, qkv_flags, 0);
            }
        }
        if (forge__lora_any(p, l, FORGE__T_QKV)) {
            for (int t = FORGE__T_Q; t <= FORGE__T_V; t++) forge__lora_down(p, a, l, (forge__target)t, a->xn);
            forge__barrier(r);
            forge__lora_up(p, a, l, FORGE__T_Q, a->qkv, QKVD, 0, 1);
            forge__lora_up(p, a, l, FORGE__T_K, a->qkv, QKVD, QD, 1);
            forge__lora_up(p, a, l, FORGE__T_V, a->qkv, QKVD, QD + KVD, 1);
        }
        forge__barrier(r);
        /* One token's decode on subgroups: RoPE (and the q / k / v head norms) in attention_decode
         * (on the H100 a dependent dispatch costs about 4 us: 3.7% of the 1B F16 token). A few
         * rows of one sequence from the row table (prompt lookup's verification) take the decode
         * attention too, a grid layer a row, where the partials fit: attention_cm's 64-query
         * tiles cost the 8B Q4_0 shape 88 us a layer for 2 rows at 400 positions against 16 us
         * for a decode row (H200, 5989f30). */
        uint64_t row_part = 4ull * forge__attn_splits(m, true) * NH * (D + 2);
        bool decode = (n == 1 && !p->train && !p->table) || p->table == FORGE__TABLE_DECODE ||
                      (p->table == FORGE__TABLE_PREFILL && n <= FORGE__LOOKUP_MAX + 1 && n * row_part <= a->attn_part.size);
        bool rope_fused = decode && !p->table && m->attn_subgroups && D % 4 == 0;
        if (c->qk_norm && !rope_fused) {
            if (a->qkv_raw.buf) { /* the norms' inputs, for their backward pass */
                forge__copy(r, a->qkv, a->qkv_raw, 4ull * n * QKVD);
                forge__barrier(r);
            }
            forge__head_norm(p, a->qkv, &ly->q_norm, NH, 0, D, QKVD);
            if (!shared) forge__head_norm(p, a->qkv, &ly->k_norm, NKV, QD, D, QKVD);
            /* Gemma 4's values: RMSNorm without weight (k = v layers: of the keys' raw projection) */
            if (c->v_norm && !shared) forge__head_norm(p, a->qkv, &m->ones, NKV, QD + KVD, D, QKVD);
            forge__barrier(r);
        }
        /* RoPE on q in place, and k (rotated) and v into the cache: one dispatch (a KV-shared
         * layer: the queries only) */
        const forge__vec *rope = ly->sliding ? &m->rope_sliding : &m->rope_full;
        uint32_t rope_kv = shared ? 0 : NKV;
        if (!rope_fused) {
            forge__pc_rope pr = {n, NH, rope_kv, D, c->rope_adjacent_pairs, a->slots, QKVD, QD, QD + KVD, p->seq, p->table ? 1u : 0u};
            forge__range br[5] = {p->params, rope->r, a->qkv, a->kc, a->vc};
            /* a key head's invocations (rope.comp): f16 two pairs each, q8_0 two blocks of 32 each */
            uint32_t key_inv = p->kv == FORGE_KV_Q8_0 ? (D / 32 + 1) / 2 : p->kv == FORGE_KV_F16 ? D / 4 : D / 2;
            forge__grid(((uint64_t)n * (NH * (D / 2) + rope_kv * key_inv) + 63) / 64, &gx, &gy);
            forge__dispatch(r, forge__kv_op(p, FORGE__OP_ROPE, FORGE__OP_ROPE_KV16, FORGE__OP_ROPE_KV8), br, &pr, gx, gy, 1);
            forge__barrier(r);
        }
        uint32_t seq = p->seq ? p->seq : n;
        uint32_t splits = forge__attn_splits(m, p->table != 0);
        uint32_t rope_flags = !rope_fused ? 0
                            : FORGE__ATTN_ROPE_Q | (c->rope_adjacent_pairs ? FORGE__ATTN_ROPE_ADJACENT : 0) | (shared ? 0 : FORGE__ATTN_ROPE_KEY) |
                                  (c->qk_norm ? FORGE__ATTN_QK_NORM : 0) | (c->qk_norm && c->v_norm && !shared ? FORGE__ATTN_V_NORM : 0);
        forge__pc_attention pa = {seq, NH, NKV, D, p->seq ? p->seq : a->slots, ly->sliding ? (uint32_t)c->sliding_window : 0,
                                  (float)c->attn_scale, (float)c->attn_softcap, splits, QKVD, p->seq * KVD,
                                  (a->lse.buf ? 1u : 0u) | (p->table ? 2u : 0u) | (c->bidirectional ? FORGE__ATTN_BIDIRECTIONAL : 0u) | rope_flags,
                                  (float)c->norm_eps, forge__attn_min_run(m)};
        if (c->bidirectional && ly->sliding) pa.window = (uint32_t)c->sliding_window / 2 + 1; /* |i - j| < w (forge__config.bidirectional) */
        /* the o projection's input quantized by the attention's merge (one act_q8 dispatch fewer) */
        bool o_quantized = decode && D % 32 == 0 && forge__uses_q8a(p, &ly->wo, n) && !c->attn_gate; /* (one token: the merge quantizes row 0) */
        if (decode && D % 4 == 0) { /* decode: the keys split over `splits` workgroups per head (and row) */
            forge__range ba[13] = {p->params, a->qkv, a->kc, a->vc, a->attn_part, rope->r, a->kc, a->vc,
                                   c->qk_norm ? ly->q_norm.r : p->dummy, c->qk_norm && !shared ? ly->k_norm.r : p->dummy,
                                   a->att, o_quantized ? p->act_q8 : p->dummy, a->attn_done};
            if (m->attn_subgroups) {
                /* the runs merged by the last workgroup of each head: no combine dispatch (on the H100
                 * 1B F16 decode 565 -> 577 tok/s, 1B Q4_0 877 -> 917, 8B Q4_0 301 -> 302) */
                pa.flags |= FORGE__ATTN_MERGE | (o_quantized ? FORGE__ATTN_MERGE_Q8 : 0);
                forge__dispatch(r, forge__kv_op(p, FORGE__OP_ATTN_DECODE, FORGE__OP_ATTN_DECODE_KV16, FORGE__OP_ATTN_DECODE_KV8), ba, &pa, splits, NH, n);
            } else {
                forge__dispatch(r, forge__kv_op(p, FORGE__OP_ATTN_SPLIT, FORGE__OP_ATTN_SPLIT_KV16, FORGE__OP_ATTN_SPLIT_KV8), ba, &pa, splits, NH, n);
                forge__barrier(r);
                forge__pc_combine pcm = {NH, D, splits, o_quantized ? 1u : 0u};
                forge__range bc[3] = {a->attn_part, a->att, o_quantized ? p->act_q8 : p->dummy};
                forge__dispatch(r, FORGE__OP_ATTN_COMBINE, bc, &pcm, NH, n, 1);
            }
        } else { /* prefill and training: tiles of queries x keys, one grid layer per sequence */
            forge__range ba[6] = {p->params, a->qkv, a->kc, a->vc, a->att, a->lse.buf ? a->lse : p->dummy};
            forge__op cm = forge__attn_cm_op(p, D);
            uint32_t bq = cm != FORGE__OP_COUNT ? FORGE__ATTN_CM_QUERIES : forge__attn_block_queries(r->dmax);
            forge__dispatch(r, cm != FORGE__OP_COUNT ? cm : forge__kv_op(p, FORGE__OP_ATTENTION, FORGE__OP_ATTENTION_KV16, FORGE__OP_ATTENTION_KV8), ba, &pa, (seq + bq - 1) / bq, NH,
                            p->batch);
        }
        forge__barrier(r);
        forge__range o_in = a->att; /* o_proj's input */
        if (c->attn_gate) { /* Qwen 3.5: each head's output times sigmoid of its gate (the q|k|v row's last QD columns) */
            if (a->att_g.buf) o_in = a->att_g;
            forge__record_act_mul_ex(p, o_in, a->att, a->qkv, n * QD, QD, FORGE__GU_APART_GATE, FORGE__ACT_SIGMOID, QKVD, QD + 2 * KVD);
            forge__barrier(r);
        }
        if (c->sandwich_norms) {
            forge__linear(p, &ly->wo, o_in, 0, n, a->o, H, 0, &ly->bo, NULL, o_quantized ? FORGE__LINEAR_QUANTIZED : 0, 0);
            if (forge__lora_any(p, l, 1u << FORGE__T_O)) {
                forge__lora_down(p, a, l, FORGE__T_O, o_in);
                forge__barrier(r);
                forge__lora_up(p, a, l, FORGE__T_O, a->o, H, 0, 1);
            }
            forge__barrier(r);
            if (!post_fused) forge__rmsnorm(p, a->o, 0, &ly->post_attn_norm, a->x, 0, n, H, 1);
        } else if (chain) { /* ... and the residual quantized for gate|up */
            forge__linear_q8a(p, &ly->wo, o_in, 0, 1, a->x, H, 0, &ly->bo, NULL,
                              FORGE__LINEAR_ACCUMULATE | (o_quantized ? FORGE__LINEAR_QUANTIZED : 0), 0, &ly->ffn_norm);
        } else {
            forge__linear(p, &ly->wo, o_in, 0, n, a->x, H, 0, &ly->bo, NULL,
                          FORGE__LINEAR_ACCUMULATE | (o_quantized ? FORGE__LINEAR_QUANTIZED : 0), 0);
            if (forge__lora_any(p, l, 1u << FORGE__T_O)) {
                forge__lora_down(p, a, l, FORGE__T_O, o_in);
                forge__barrier(r);
                forge__lora_up(p, a, l, FORGE__T_O, a->x, H, 0, 1);
            }
        }
    }
    forge__barrier(r);
    if (a->x_mid.buf) forge__copy(r, a->x, a->x_mid, 4ull * n * H);
    /* Gemma 4 multiplies the residual stream by layer_scalar at the layer's end: in the last
     * norm that adds to it (the per-layer input's, or the MLP's) */
    bool ple = c->ple_dim > 0, gemma4_moe = c->layer_moe[l] && c->router == FORGE__ROUTER_GEMMA4;
    uint32_t end_flags = ly->out_scale != 1.0f ? FORGE__NORM_ADD | FORGE__NORM_SCALE : FORGE__NORM_ADD;
    /* the MLP: h = act(gate . x') * (up . x'), x' the normed residual */
    uint32_t act_flag = c->act == FORGE__ACT_GELU_TANH ? FORGE__LINEAR_GELU : 0;
    bool lora_gu = forge__lora_any(p, l, FORGE__T_GU);
    bool shared_expert = c->layer_moe[l] && c->shared_ffn > 0; /* Qwen 3.5-MoE: the dense MLP is the shared expert, beside the experts */
    if (shared_expert && !ple && !c->sandwich_norms && !chain && !post_fused &&
        forge__record_shared_moe_by_pair(p, l, a, lora_gu || forge__lora_any(p, l, 1u << FORGE__T_DOWN))) {
        forge__barrier(r);
        return;
    }
    if (!ly->dense_mlp) {
        /* Qwen3-MoE's sparse layers: the experts alone, added to the residual */
    } else if (chain) { /* the residual as o quantized it; the middle quantized for down */
        forge__linear_q8a(p, &ly->gate_up, a->x, 0, 1, a->h, F, 0, NULL, &ly->ffn_norm,
                          FORGE__LINEAR_GATED | act_flag | FORGE__LINEAR_QUANTIZED_RES | FORGE__LINEAR_Q8_OUT, 0, NULL);
    } else if (post_fused) { /* x + post_attn_norm(o) the product's input, and written to gu */
        forge__pass pp = *p;
        pp.post_p = a->o;
        pp.post_w = ly->post_attn_norm.r;
        pp.post_out = a->gu;
        forge__linear(&pp, &ly->gate_up, a->x, 0, n, a->h, F, 0, NULL, &ly->ffn_norm, FORGE__LINEAR_GATED | act_flag, 0);
    } else if (p->fuse && ly->fused_gate_up && !lora_gu && !shared_expert) {
        forge__linear(p, &ly->gate_up, a->x, 0, n, a->h, F, 0, NULL, &ly->ffn_norm, FORGE__LINEAR_GATED | act_flag, 0);
    } else {
        forge__range mlp_in = a->x;
        const forge__vec *mlp_norm = &ly->ffn_norm;
        if (!p->fuse || shared_expert) { /* (the experts read the normed row too) */
            forge__rmsnorm(p, a->x, 0, &ly->ffn_norm, a->xn, 0, n, H, 0);
            forge__barrier(r);
            mlp_in = a->xn;
            mlp_norm = NULL;
        }
        /* both products into gu: the fused weight's rows interleaved (gate i at 2i, up i at
         * 2i + 1), or two weights side by side (gates, then ups) */
        uint32_t layout = ly->fused_gate_up ? FORGE__GU_PAIRS : FORGE__GU_HALVES;
        if (ly->fused_gate_up) {
            forge__linear(p, &ly->gate_up, mlp_in, 0, n, a->gu, 2 * F, 0, NULL, mlp_norm, 0, 0);
        } else {
            forge__linear(p, &ly->gate, mlp_in, 0, n, a->gu, 2 * F, 0, NULL, mlp_norm, 0, 0);
            forge__linear(p, &ly->up, mlp_in, 0, n, a->gu, 2 * F, F, NULL, mlp_norm, 0, 0);
        }
        if (lora_gu) {
            forge__lora_down(p, a, l, FORGE__T_GATE, a->xn);
            forge__lora_down(p, a, l, FORGE__T_UP, a->xn);
            forge__barrier(r);
            bool pairs = layout == FORGE__GU_PAIRS;
            forge__lora_up(p, a, l, FORGE__T_GATE, a->gu, 2 * F, 0, pairs ? 2 : 1);
            forge__lora_up(p, a, l, FORGE__T_UP, a->gu, 2 * F, pairs ? 1 : F, pairs ? 2 : 1);
        }
        if (shared_expert) /* Qwen 3.5-MoE: the shared expert's gate, x . shared_expert_gate, scales each row below */
            forge__linear(p, &ly->shared_gate, mlp_in, 0, n, a->shared_s, 1, 0, NULL, mlp_norm, 0, 0);
        forge__barrier(r);
        if (shared_expert)
            forge__record_act_mul_ex(p, a->h, a->gu, a->shared_s, n * F, F, layout, (uint32_t)c->act | FORGE__ACT_ROW_SIGMOID, 1, 0);
        else
            forge__record_act_mul(p, a->h, a->gu, n * F, F, layout);
    }
    forge__barrier(r);
    bool lora_down = forge__lora_any(p, l, 1u << FORGE__T_DOWN);
    if (!ly->dense_mlp) {
        forge__rmsnorm(p, a->x, 0, &ly->ffn_norm, a->xn, 0, n, H, 0);
        forge__barrier(r);
        forge__record_route(p, l, a, a->xn);
        forge__record_experts(p, l, a, a->xn, a->x, true);
    } else if (c->sandwich_norms) {
        forge__linear(p, &ly->down, a->h, 0, n, a->d, H, 0, NULL, NULL, 0, 0);
        if (lora_down) {
            forge__lora_down(p, a, l, FORGE__T_DOWN, a->h);
            forge__barrier(r);
            forge__lora_up(p, a, l, FORGE__T_DOWN, a->d, H, 0, 1);
        }
        forge__barrier(r);
        if (gemma4_moe) {
            /* Gemma 4: post_ffn_norm(post_ffn_norm_1(mlp) + post_ffn_norm_2(experts)); the
             * router reads the residual itself, the experts its pre_ffn_norm_2 */
            forge__rmsnorm(p, a->d, 0, &ly->post_ffn_norm_1, a->mlp_sum, 0, n, H, 0);
            forge__barrier(r); /* (d is xn) */
            forge__rmsnorm(p, a->x, 0, &ly->router_norm, a->xn, 0, n, H, 0);
            forge__barrier(r);
            forge__record_route(p, l, a, a->xn);
            forge__rmsnorm(p, a->x, 0, &ly->pre_ffn_norm_2, a->xn, 0, n, H, 0);
            forge__barrier(r);
            forge__record_experts(p, l, a, a->xn, a->moe_out, false);
            forge__barrier(r);
            forge__rmsnorm(p, a->moe_out, 0, &ly->post_ffn_norm_2, a->mlp_sum, 0, n, H, FORGE__NORM_ADD);
            forge__barrier(r);
            forge__rmsnorm_ex(p, a->mlp_sum, 0, &ly->post_ffn_norm, a->x, 0, n, H, ple ? FORGE__NORM_ADD : end_flags, ly->out_scale,
                              c->norm_eps);
        } else if (post_fused) { /* x = gu (the residual after the attention block) + post_ffn_norm(d) */
            forge__rmsnorm_resid(p, a->d, &ly->post_ffn_norm, a->gu, a->x, H);
        } else {
            forge__rmsnorm_ex(p, a->d, 0, &ly->post_ffn_norm, a->x, 0, n, H, ple ? FORGE__NORM_ADD : end_flags, ly->out_scale, c->norm_eps);
        }
    } else if (chain) { /* the middle as gate|up quantized it; the residual for the next layer */
        forge__linear_q8a(p, &ly->down, a->h, 0, 1, a->x, H, 0, NULL, NULL, FORGE__LINEAR_ACCUMULATE | FORGE__LINEAR_QUANTIZED | FORGE__LINEAR_A_G8, 0,
                          forge__q8_chain(p, l + 1) ? &m->layers[l + 1].attn_norm : NULL);
    } else {
        forge__linear(p, &ly->down, a->h, 0, n, a->x, H, 0, NULL, NULL, FORGE__LINEAR_ACCUMULATE, 0);
        if (lora_down) {
            forge__lora_down(p, a, l, FORGE__T_DOWN, a->h);
            forge__barrier(r);
            forge__lora_up(p, a, l, FORGE__T_DOWN, a->x, H, 0, 1);
        }
        if (shared_expert) { /* the routed experts beside it, on the same normed row (xn), added to x too */
            forge__barrier(r);
            forge__record_route(p, l, a, a->xn);
            forge__record_experts(p, l, a, a->xn, a->x, true);
        }
    }
    forge__barrier(r);
    if (ple) { /* Gemma 4: x += norm(proj(act(gate(x)) * the layer's per-layer input)), times layer_scalar */
        uint32_t P = (uint32_t)c->ple_dim;
        forge__linear(p, &ly->ple_gate, a->x, 0, n, a->ple_g, P, 0, NULL, NULL, 0, 0);
        forge__barrier(r);
        forge__pc_act pact = {n * P, (uint32_t)c->act, FORGE__GU_APART, P, (uint32_t)c->n_layers * P, (uint32_t)l * P};
        forge__range bact[3] = {a->ple_tmp, a->ple_g, a->ple};
        forge__grid(((uint64_t)n * P + 255) / 256, &gx, &gy);
        forge__dispatch(r, FORGE__OP_ACT_MUL, bact, &pact, gx, gy, 1);
        forge__barrier(r);
        forge__linear(p, &ly->ple_proj, a->ple_tmp, 0, n, a->d, H, 0, NULL, NULL, 0, 0);
        forge__barrier(r);
        forge__rmsnorm_ex(p, a->d, 0, &ly->ple_norm, a->x, 0, n, H, end_flags, ly->out_scale, c->norm_eps);
        forge__barrier(r);
    }
}

/* ---- The whole pass: embeddings, the layers, the head ---- */

/* The pass of a session: its scratch buffers and KV cache, the model's adapter if it has one. */
static forge__pass forge__session_pass(forge_session *s, forge__rec *r, uint32_t n) {
    forge_model *m = s->m;
    const forge__lora *lo = m->adapter.pairs ? &m->adapter : NULL;
    forge__pass p = {m, r, s->dummy, s->params_r, lo, n, 0, 1, forge__fuses_norm(m, n) && !lo, false, false, {0}, 0, {0}, {0}, {0}, {0}, s->kv, {0}, {0}, {0}, {0}};
    if (m->act_q8) {
        p.act_q8 = s->act_q8;
        p.act_q8_res = s->act_q8_res;
    }
    if (forge__uses_a16(m)) p.a16 = s->a16;
    return p;
}

static forge__acts forge__session_acts(forge_session *s, int l) {
    return (forge__acts){.x = s->x, .xn = s->xn, .qkv = s->qkv, .att = s->att, .gu = s->gu, .h = s->h, .kc = s->kc[l], .vc = s->vc[l],
                         .slots = s->slots[l], .attn_part = s->attn_part, .attn_done = s->attn_done, .u = s->lora_u, .o = s->xn, .d = s->xn,
                         .router = s->router, .route = s->route, .moe = s->moe, .moe_y = s->moe_y, .moe_out = s->moe_out,
                         .mlp_sum = s->mlp_sum, .ple = s->ple, .ple_tmp = s->ple_tmp, .ple_g = s->ple_g, .lin_mix = s->lin_mix,
                         .lin_qkv = s->lin_qkv, .lin_out = s->lin_out, .lin_chunk = s->lin_chunk, .shared_s = s->shared_s};
}

/* Rows `tokens` (u32) of the table emb into x [n, dim], times scale (rounded as the model's
 * dtype rounds its products, Gemma). */
static void forge__record_embed_rows(const forge__pass *p, const forge__weight *emb, forge__range tokens, forge__range x, uint32_t dim,
                                     double scale) {
    const forge__config *c = &p->m->cfg;
    forge__pc_embed pe = {p->n, dim, 0, 0, (float)scale,
                          scale != 1.0 ? (c->dtype == FORGE__BF16 ? 1u : c->dtype == FORGE__F16 ? 2u : 0u) : 0u,
                          emb->bits, emb->group, emb->qflags};
    for (int i = 0; i < emb->n_chunks; i++) {
        const forge__wchunk *ch = &emb->chunks[i];
        bool mlx = emb->fmt == FORGE__W_MLX;
        forge__range b[5] = {tokens, ch->w, x, mlx ? ch->scales : p->dummy, mlx ? ch->biases : p->dummy};
        pe.row_begin = ch->row0;
        pe.row_count = ch->rows;
        forge__dispatch(p->r, (forge__op)(FORGE__OP_EMBED + emb->fmt), b, &pe, p->n, 1, 1);
    }
}

/* The token embeddings of the pass's tokens into x [n, H], scaled (Gemma). */
static void forge__record_embed(const forge__pass *p, forge__range tokens, forge__range x) {
    const forge__config *c = &p->m->cfg;
    forge__record_embed_rows(p, &p->m->tok_embd, tokens, x, (uint32_t)c->hidden, c->embed_scale);
}

/* Gemma 4's per-layer inputs of the pass's tokens (before the layers), every layer's [P]
 * slice side by side in acts.ple [n, layers * P]: (rmsnorm_P(x W_proj^T * H^-0.5) * w +
 * E_ple[token] * sqrt(P)) * 2^-0.5, x the scaled token embeddings. */
static void forge__record_ple(const forge__pass *p, const forge__acts *a, forge__range tokens) {
    forge_model *m = p->m;
    const forge__config *c = &m->cfg;
    uint32_t LP = (uint32_t)(c->n_layers * c->ple_dim);
    forge__record_embed_rows(p, &m->ple_embd, tokens, a->ple, LP, forge__round_to_dtype(sqrt((double)c->ple_dim), c->dtype));
    forge__linear(p, &m->ple_model_proj, a->x, 0, p->n, a->ple_tmp, LP, 0, NULL, NULL, 0, 0);
    forge__barrier(p->r);
    /* the projection's H^-0.5 folded into eps (forge__rmsnorm_ex) */
    forge__rmsnorm_ex(p, a->ple_tmp, 0, &m->ple_proj_norm, a->ple, 0, p->n * (uint32_t)c->n_layers, (uint32_t)c->ple_dim,
                      FORGE__NORM_ADD | FORGE__NORM_SCALE, (float)sqrt(0.5), c->norm_eps * c->hidden);
    forge__barrier(p->r);
}

static void forge__record_forward(forge_session *s, forge__rec *r, uint32_t n, uint32_t out_row0, uint32_t n_out,
                                  forge__out_mode mode) {
    forge_model *m = s->m;
    const forge__config *c = &m->cfg;
    uint32_t H = (uint32_t)c->hidden;
    forge__pass p = forge__session_pass(s, r, n);
    bool pooled = mode == FORGE__OUT_POOL_ROWS || mode == FORGE__OUT_POOL_MEAN;
    if (mode == FORGE__OUT_CLASSIFY || pooled) { /* n_out prompts of out_row0 tokens at positions 0.. (the cache is scratch) */
        p.seq = out_row0;
        p.batch = n_out;
        if (c->bidirectional) p.params = (forge__range){s->io.buf, 0, s->io.size}; /* the attention reads the row table */
    }
    bool batch = mode >= FORGE__OUT_BATCH_PREFILL && mode <= FORGE__OUT_BATCH_DECODE_LOGITS, batch_reduce = mode == FORGE__OUT_BATCH_PREFILL || mode == FORGE__OUT_BATCH_DECODE;
    if (batch) { /* the row table follows the step params; the rows' temperatures follow the tokens */
        p.table = mode == FORGE__OUT_BATCH_PREFILL || mode == FORGE__OUT_BATCH_PREFILL_LOGITS ? FORGE__TABLE_PREFILL : FORGE__TABLE_DECODE;
        p.params = (forge__range){s->io.buf, 0, s->io.size};
        if (p.table == FORGE__TABLE_DECODE) { /* free around the products that split */
            p.split_part = s->gu;
            p.split_alt = s->h;
        }
    }
    if (!p.split_part.buf && m->dev.caps.coopmat_nv && !m->exact) {
        /* prefill on tensor cores: products with few 128 x 128 tiles split along k too (on the
         * H100, 512 x 8192 -> 2048 filled 64 tiles for 132 SMs: 1.31 ms, 13 TFLOP/s). Not on
         * the f32 path, whose results stay those of the unsplit kernels. */
        p.split_part = s->gu;
        p.split_alt = s->h;
    }
    forge__record_embed(&p, s->tokens_r, s->x);
    forge__barrier(r);
    if (c->ple_dim) {
        forge__acts a0 = forge__session_acts(s, 0);
        forge__record_ple(&p, &a0, s->tokens_r);
    }
    for (int l = 0; l < c->n_layers; l++) {
        forge__acts a = forge__session_acts(s, l);
        forge__record_layer(&p, l, &a);
    }
    if (n_out == 0) return;
    if (pooled) { /* one row per text: the final norm, pooled, [the Dense steps,] read back */
        forge__range rb = {s->readback.buf, FORGE__RB_LOGITS_OFFSET, s->readback.size - FORGE__RB_LOGITS_OFFSET}, cur;
        if (mode == FORGE__OUT_POOL_ROWS) { /* each text's row (the row table) gathered, then normed */
            forge__pc_embed pe = {n_out, H, 0, n, 1.0f, 0, 0, 0, 0};
            forge__range b[5] = {s->penalty_r, s->x, s->xn, p.dummy, p.dummy};
            forge__dispatch(r, (forge__op)(FORGE__OP_EMBED + FORGE__W_F32), b, &pe, n_out, 1, 1);
            forge__barrier(r);
            forge__rmsnorm(&p, s->xn, 0, &m->output_norm, s->xn, 0, n_out, H, 0);
            cur = s->xn;
        } else { /* every row normed, each text's rows averaged into x's first rows */
            forge__rmsnorm(&p, s->x, 0, &m->output_norm, s->xn, 0, n, H, 0);
            forge__barrier(r);
            forge__pc_pool pp = {out_row0, H};
            forge__range b[3] = {s->penalty_r, s->xn, s->x};
            forge__dispatch(r, FORGE__OP_POOL_MEAN, b, &pp, (H + 63) / 64, n_out, 1);
            cur = s->x;
        }
        forge__barrier(r);
        uint32_t width = H;
        for (int k = 0; s->embed_dense && k < m->embed.n_dense; k++) { /* [n_out, in] -> [n_out, out], in the logits and gate|up buffers in turn */
            const forge__st_dense *d = &m->embed.dense[k];
            forge__range next = k % 2 ? s->gu : s->logits;
            forge__linear(&p, &m->embed_w[k], cur, 0, n_out, next, (uint32_t)d->out, 0, d->b ? &m->embed_b[k] : NULL, NULL, 0, 0);
            forge__barrier(r);
            cur = next;
            width = (uint32_t)d->out;
        }
        forge__copy(r, cur, rb, 4ull * n_out * width);
        forge__host_barrier(r);
        return;
    }
    const forge__weight *head = c->tied ? &m->tok_embd : &m->output;
    uint32_t head_flags = c->final_softcap > 0 ? FORGE__LINEAR_SOFTCAP : 0;
    if (mode == FORGE__OUT_CLASSIFY) {
        /* each prompt's last row (indices in the io buffer) gathered into xn, the embedding
         * kernel reading the residual stream as a table; then the final norm and the head */
        forge__pc_embed pe = {n_out, H, 0, n, 1.0f, 0, 0, 0, 0};
        forge__range b[5] = {s->penalty_r, s->x, s->xn, p.dummy, p.dummy};
        forge__dispatch(r, (forge__op)(FORGE__OP_EMBED + FORGE__W_F32), b, &pe, n_out, 1, 1);
        forge__barrier(r);
        forge__rmsnorm(&p, s->xn, 0, &m->output_norm, s->xn, 0, n_out, H, 0);
        forge__barrier(r);
        forge__linear(&p, head, s->xn, 0, n_out, s->logits, (uint32_t)forge__head_rows(c), 0, NULL, NULL, head_flags, (float)c->final_softcap);
    } else if (forge__fuses_norm(m, n_out)) { /* the final norm fused into the head */
        forge__linear(&p, head, s->x, out_row0, n_out, s->logits, (uint32_t)c->n_vocab, 0, NULL, &m->output_norm, head_flags,
                      (float)c->final_softcap);
    } else {
        forge__rmsnorm(&p, s->x, out_row0, &m->output_norm, s->xn, 0, n_out, H, 0);
        forge__barrier(r);
        forge__linear(&p, head, s->xn, 0, n_out, s->logits, (uint32_t)c->n_vocab, 0, NULL, NULL, head_flags, (float)c->final_softcap);
    }
    forge__barrier(r);
    if (batch_reduce) { /* each row: the two-stage top-k at its own temperature (no penalty) */
        uint32_t V = (uint32_t)c->n_vocab, temp_word = (uint32_t)(s->tokens_r.offset + s->tokens_r.size) / 4;
        uint32_t pk[3] = {V, FORGE__CANDIDATES, temp_word};
        forge__range bk[4] = {p.params, s->logits, s->cand, s->cand_stats};
        forge__dispatch(r, FORGE__OP_TOPK, bk, pk, s->n_chunks, n_out, 1);
        forge__barrier(r);
        uint32_t pm[3] = {s->n_chunks, FORGE__CANDIDATES, temp_word};
        forge__range bm[4] = {p.params, s->cand, s->cand_stats, s->sample_out};
        forge__dispatch(r, FORGE__OP_TOPK_MERGE, bm, pm, 1, n_out, 1);
        forge__barrier(r);
        forge__copy(r, s->sample_out, (forge__range){s->readback.buf, FORGE__RB_LOGITS_OFFSET, s->readback.size - FORGE__RB_LOGITS_OFFSET},
                    8ull * n_out * (1 + FORGE__CANDIDATES));
    } else if (mode == FORGE__OUT_SAMPLE || mode == FORGE__OUT_SAMPLE_MASKED) { /* row 0 only: penalty, [mask,] the two-stage top-k */
        uint32_t V = (uint32_t)c->n_vocab;
        forge__range bp[3] = {s->params_r, s->penalty_r, s->logits};
        forge__dispatch(r, FORGE__OP_PENALTY, bp, &V, FORGE__MAX_PENALTY_WINDOW / 64, 1, 1);
        forge__barrier(r);
        if (mode == FORGE__OUT_SAMPLE_MASKED) {
            forge__range bm[2] = {s->mask_r, s->logits};
            forge__dispatch(r, FORGE__OP_LOGIT_MASK, bm, &V, (V + 255) / 256, 1, 1);
            forge__barrier(r);
        }
        if (m->sample_on_host) { /* the penalized row itself; forge__sample reduces it */
            forge__copy(r, s->logits, (forge__range){s->readback.buf, FORGE__RB_LOGITS_OFFSET, s->readback.size - FORGE__RB_LOGITS_OFFSET},
                        4ull * V);
        } else {
            uint32_t pk[3] = {V, FORGE__CANDIDATES, 0};
            forge__range bk[4] = {s->params_r, s->logits, s->cand, s->cand_stats};
            forge__dispatch(r, FORGE__OP_TOPK, bk, pk, s->n_chunks, 1, 1);
            forge__barrier(r);
            uint32_t pm[3] = {s->n_chunks, FORGE__CANDIDATES, 0};
            forge__range bm[4] = {s->params_r, s->cand, s->cand_stats, s->sample_out};
            forge__dispatch(r, FORGE__OP_TOPK_MERGE, bm, pm, 1, 1, 1);
            forge__barrier(r);
            forge__copy(r, s->sample_out, (forge__range){s->readback.buf, 0, s->readback.size}, s->sample_out.size);
        }
    } else {
        forge__copy(r, s->logits, (forge__range){s->readback.buf, FORGE__RB_LOGITS_OFFSET, s->readback.size - FORGE__RB_LOGITS_OFFSET},
                    4ull * n_out * (uint64_t)forge__head_rows(c));
    }
    forge__host_barrier(r);
}

