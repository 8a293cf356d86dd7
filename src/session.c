/* src/session.c: Sessions.
 * Owns: struct forge_session, recordings, the session's memory plan (KV cache, activations,
 * io and readback buffers) and its sizes.
 * May call: base.c, config.c, device.c, ops.c, model.c.
 *
 * A session owns the KV cache and the activations, all planned when it is created from
 * n_ctx, n_batch and n_outputs_max. One forward pass is recorded per shape (tokens in the
 * step, which rows produce logits); positions and token ids live in a small host-visible
 * buffer, so a recorded pass is replayed for every step of that shape: the decode step is
 * recorded once and then costs a submit and a readback of the logits.
 */

#define FORGE__RECORDINGS 8

typedef struct forge__recording {
    uint32_t n_tokens, out_row0, n_out, mode;  /* the shape (key) */
    uint64_t last_use;
    VkCommandBuffer cb;
    VkDescriptorPool pool;
    VkQueryPool qpool;                         /* profiling sessions only */
    uint16_t *ops;                             /* profiling: op per dispatch (malloc'd) */
    forge__mat_work *shapes;                   /* profiling: matrix product per dispatch (malloc'd) */
    uint32_t n_dispatches;
    forge__host_seq host;                      /* CPU devices: the products run on the host, and the command buffers between */
} forge__recording;

/* The step inputs the kernels read (params buffer, binding 0 of rope, attention and the
 * sampler kernels), written by the host before each submit. */
typedef struct forge__step_params {
    uint32_t pos0, n_tokens;
    uint32_t n_penalty;      /* distinct ids in the penalty window */
    float penalty;           /* repeat penalty (1: none) */
    float inv_temp;          /* 1 / temperature of the softmax normalizer; 0: greedy, the reduction finds the best
                              * candidate alone (topk.comp) */
    uint32_t seed;           /* training: this step's dropout seed (gemm.comp reads it) */
    uint32_t pad[2];
} forge__step_params;

/* What a recorded step leaves for the host: the logits rows, the sampler's candidates, or the
 * logits of the last token of each prompt of a batch (classify: n tokens are n_out prompts of
 * out_row0 tokens each, right-padded). */
typedef enum forge__out_mode {
    FORGE__OUT_LOGITS = 0, FORGE__OUT_SAMPLE = 1, FORGE__OUT_CLASSIFY = 2,
    /* batch generation (batch.c): one sequence's prompt tokens (PREFILL) or one token of each
     * of n sequences (DECODE); each out row reduced as OUT_SAMPLE's row (candidates and normalizer
     * per row, at the row's temperature), or its logits read back (_LOGITS: the host's penalty) */
    FORGE__OUT_BATCH_PREFILL = 3, FORGE__OUT_BATCH_DECODE = 4, FORGE__OUT_BATCH_PREFILL_LOGITS = 5, FORGE__OUT_BATCH_DECODE_LOGITS = 6,
    /* OUT_SAMPLE with a constraint's mask (the io buffer's mask words, written by the host
     * before the step) applied to the row first: every disallowed logit -inf (logit_mask.comp) */
    FORGE__OUT_SAMPLE_MASKED = 7,
    /* forge_embed (embed.c): classify's batch of n_out texts of out_row0 rows each, each text
     * pooled from the final norm's rows into one row of H: its row in the row table (the last
     * token's, or the first's for CLS) gathered (_ROWS), or all its rows averaged (_MEAN) */
    FORGE__OUT_POOL_ROWS = 8, FORGE__OUT_POOL_MEAN = 9
} forge__out_mode;

#define FORGE__CANDIDATES 256          /* topk_merge.comp MAXC: candidates read back per token */
#define FORGE__TOPK_CHUNK 1024         /* topk.comp CHUNK */
#define FORGE__MAX_PENALTY_WINDOW 1024 /* penalty ids the io buffer holds */
#define FORGE__BATCH_MAX_SEQ 512       /* rows of batch generation's table, which fills the penalty ids' place */
#define FORGE__LOOKUP_MAX 15           /* draft tokens of prompt lookup a step verifies (generate.c), with the drawn one 16 rows */

/* Device time per kernel (and per matrix shape), summed over a session's or trainer's steps;
 * entries FORGE__OP_COUNT + op: op's products run on the host (src/host.c, "host " + its name). */
typedef struct forge__profile {
    double ms[2 * FORGE__OP_COUNT];
    uint64_t calls[2 * FORGE__OP_COUNT];
    struct forge__prof_shape {
        uint16_t op;
        uint32_t N, K, bits16;            /* a matrix kernel's shape and weight format (forge__mat_work) */
        uint32_t M;                       /* gemm.comp's products (bits16 0): their M too; else 0 */
        double ms;
        uint64_t calls, rows;             /* rows: the products' M summed over the calls */
        uint64_t mats;                    /* weight matrices read, summed over the calls (forge__mat_work) */
    } shape[128];
    int n_shapes;
} forge__profile;

struct forge_session {
    forge__err err;
    forge_model *m;
    forge__arena arena;
    int n_ctx, n_batch, n_out_max;
    int n_seq;                        /* batch generation: sequences, each with slots[l] of every layer's cache */
    int n_reduced;                    /* out rows one step can reduce on the device (the plan's; <= n_batch) */
    int n_past;
    int32_t *history;                 /* [n_ctx] the tokens in the cache */
    forge__mem_counter mem;
    forge__pack pack;
    forge__buffer *blocks;
    int n_blocks;
    forge__buffer io;                 /* host-visible: step params | penalty ids | tokens [n_batch] u32 | .. | mask (mask_r) */
    forge__buffer readback;           /* host-visible: sampler output [1 + C] | logits [n_out_max, vocab] */
    forge__range params_r, penalty_r, tokens_r, mask_r, dummy;
    forge__range cand, cand_stats, sample_out; /* sampler: [n_chunks, C] uvec2, [n_chunks] vec2, [1 + C] uvec2 */
    forge__range attn_part;           /* decode attention partials [heads, splits, head_dim + 2] f32 */
    forge__range attn_done;           /* attention_decode's finished runs per (row, head) [n_batch, heads] u32, zero between steps */
    forge__range act_q8;              /* one token's int8 activations (forge_model.act_q8; else 16 bytes) */
    forge__range act_q8_res;          /* ... the residual stream's, normed, written by the product before (forge__q8_chain) */
    forge__range a16;                 /* [n_batch, longest product input] f16: the tensor cores' A (else 16 bytes) */
    uint32_t n_chunks;                /* vocabulary chunks of the top-k reduction */
    VkCommandBuffer copy_logits_cb;   /* copies logits row 0 to the host (sampler fallback) */
    forge__range x, xn, att;           /* [n_batch, dim] f32 each */
    forge__range qkv;                   /* [n_batch, q_dim + 2 kv_dim]: each token's q | k | v */
    forge__range h, gu;                 /* MLP: act(gate) * up [n_batch, ffn]; gate and up [n_batch, 2 ffn] */
    bool embed_dense;                   /* forge_embed's Dense steps run on the device (forge__session_embed_dense) */
    forge__range lora_u;                /* the adapter's x A^T [n_batch, FORGE__T_COUNT * max_rank] (16 bytes without one) */
    forge__range logits;                /* [n_out_max, vocab] */
    forge__range router, route, moe, moe_y, moe_out, mlp_sum; /* mixture of experts (forge__session_pack) */
    forge__range ple, ple_tmp, ple_g;   /* Gemma 4's per-layer inputs [n_batch, layers * ple_dim], their scratch, one layer's gate */
    forge__range lin_mix, lin_qkv, lin_out; /* Qwen 3.5's linear layers: the in-projection's rows [n_batch, conv_dim + VD + 2 NV],
                                             * the convolved q|k|v [n_batch, conv_dim], the mixer's output [n_batch, VD] */
    forge__range shared_s;              /* Qwen 3.5-MoE: x . shared_expert_gate per row [n_batch] */
    forge__range lin_ckpt;              /* Qwen 3.5: the prompt cache's checkpoint, sequence 0's recurrent states after the
                                         * first ckpt_pos tokens: per linear layer its convolution's state, then its delta rule's */
    forge__range lin_chunk;             /* Qwen 3.5: the delta rule's chunked form's work [n_batch, NV, 2 * 64 + 4] (16 bytes when
                                         * n_batch < FORGE__DELTA_CHUNK_MIN) */
    int ckpt_pos;                       /* -1: no checkpoint */
    int32_t *ckpt_tokens;               /* [n_ctx] the tokens the checkpoint follows (ckpt_pos of them) */
    forge__range *kc, *vc;            /* per layer [n_seq, slots, n_kv_heads, head_dim], f32, f16 or q8_0 (kv); a linear-attention
                                       * layer (Qwen 3.5) holds its recurrent state there instead, always f32: kc the convolution's
                                       * last inputs [n_seq, lin_conv - 1, conv_dim], vc the delta rule's [n_seq, NV, lin_k_dim, lin_v_dim] */
    forge_kv_type kv;                 /* forge_session_params.kv_type resolved (forge__session_sizes): F32, F16 or Q8_0 */
    uint64_t kv_bytes, kv_sliding_bytes, state_bytes;
    uint32_t *slots;                  /* per layer: n_ctx, or window + n_batch - 1 for sliding layers */
    VkCommandPool cmd_pool;
    VkFence fence;
    forge__recording rec[FORGE__RECORDINGS];
    uint64_t use_clock;
    uint64_t rng[4];                  /* xoshiro256** state of the sampler */
    bool profile;                     /* time every dispatch (forge_session_params.profile) */
    forge__profile prof;              /* device time per kernel, summed over steps */
    forge_metrics metrics;            /* of the last generate/chat/classify call */
    forge__buf class_text;            /* the texts of the last classify call's tokens */
    forge__buf chat_reply;            /* the last forge_chat_tools reply's strings (chat.c) */
    const char **chat_reply_ptrs;     /* its tool names, then arguments */
    uint64_t prompt_cache_hits;
    const char *constraint_arm;       /* during forge_chat: a thinking reply's end, after which a constraint's own
                                       * trigger counts (generate.c passes it to the matcher); NULL otherwise */
    int kv_from;                      /* sliding-window layers hold no position before this: after
                                       * forge_session_load, or a context shift that turned a ring */
    int kv_high;                      /* positions written since the sequence began (>= n_past after a truncation):
                                       * a ring of `slots` holds positions kv_high - slots .. kv_high - 1 */
    forge_overflow overflow;          /* what a full context does (forge_session_params) */
    int n_keep;                       /* forge_session_params.n_keep */
    int slides;                       /* contexts slid (cumulative) */
    int drop_at;                      /* slides dropped dropped[0..n_dropped) from position drop_at */
    int32_t *dropped;                 /* malloc'd, dropped_cap: the tokens slides dropped, in order */
    int n_dropped, dropped_cap;
};

/* Session sizes derived from the params and the device limits. */
typedef struct forge__session_plan {
    int n_ctx, n_batch, n_out_max;
    int n_seq;                        /* sequences of batch generation, each with its own slots */
    int n_reduced;                    /* out rows a step can reduce (sampler buffers): n_seq, or a lookup step's rows */
    forge_kv_type kv;                 /* the KV cache's type: F32, F16 or Q8_0 (DEFAULT resolved) */
    uint32_t slots[FORGE__MAX_LAYERS];
} forge__session_plan;

/* Words of one head of D values in a q8_0 cache: D/4 words of codes, then the f16 scales of its
 * D/32 blocks two a word (kernels/common.glsl's kv8_words, whose comment gives the layout). */
static uint64_t forge__kv8_words(uint64_t D) { return D / 4 + (D / 32 + 1) / 2; }

/* Bytes of `heads` heads of D values in a cache of type kv (F32, F16 or Q8_0). */
static uint64_t forge__kv_bytes(forge_kv_type kv, uint64_t heads, uint64_t D) {
    return heads * (kv == FORGE_KV_Q8_0 ? 4 * forge__kv8_words(D) : (kv == FORGE_KV_F16 ? 2 : 4) * D);
}

/* Bytes of one position of layer l's K (or V) cache. */
static uint64_t forge__kv_row_bytes(const forge__config *c, int l, forge_kv_type kv) { return forge__kv_bytes(kv, forge__nkv(c, l), forge__hd(c, l)); }

/* Qwen 3.5's linear-attention layers: the in-projection's row (q|k|v, z, b, a), and per sequence
 * the convolution's state (its last lin_conv - 1 inputs) and the delta rule's state. */
static uint64_t forge__lin_mix_dim(const forge__config *c) { return forge__lin_conv_dim(c) + forge__lin_v_dim(c) + 2ull * c->lin_v_heads; }
static uint64_t forge__conv_state_bytes(const forge__config *c) { return 4ull * (uint64_t)(c->lin_conv - 1) * forge__lin_conv_dim(c); }
static uint64_t forge__delta_state_bytes(const forge__config *c) { return 4ull * c->lin_v_heads * c->lin_k_dim * c->lin_v_dim; }
/* The delta rule's chunked form (delta_rule_prep.comp, delta_rule_chunk.comp) takes a step's
 * groups of at least FORGE__DELTA_CHUNK_MIN rows (a prompt, a classify batch's sequences) in
 * chunks of FORGE__DELTA_CHUNK rows where key heads are at most FORGE__DELTA_CHUNK_MAX_K_DIM wide
 * (Qwen 3.5's are 128); shorter groups (decode, batch generation's steps) and wider heads take the
 * recurrent form. Its work buffer holds, per row and value head, T's and P's rows and four
 * scalars (delta_rule_prep.comp's header). */
#define FORGE__DELTA_CHUNK 64u
#define FORGE__DELTA_CHUNK_MIN 16u
#define FORGE__DELTA_CHUNK_COLS 16u /* delta_rule_chunk.comp's state columns a workgroup */
#define FORGE__DELTA_CHUNK_MAX_K_DIM 128u /* delta_rule_chunk.comp's state block in 32 KB of shared memory */
static bool forge__delta_chunked(const forge__config *c, uint64_t rows) {
    return rows >= FORGE__DELTA_CHUNK_MIN && (uint64_t)c->lin_k_dim <= FORGE__DELTA_CHUNK_MAX_K_DIM;
}
static uint64_t forge__delta_chunk_bytes(const forge__config *c, uint64_t rows) {
    return forge__delta_chunked(c, rows) ? 4ull * rows * c->lin_v_heads * (2 * FORGE__DELTA_CHUNK + 4) : 16;
}
/* One sequence's recurrent states over all linear layers (the checkpoint's size). */
static uint64_t forge__recurrent_seq_bytes(const forge__config *c) {
    uint64_t n = 0;
    for (int l = 0; l < c->n_layers; l++) n += c->layer_linear[l] ? forge__conv_state_bytes(c) + forge__delta_state_bytes(c) : 0;
    return n;
}

/* The widest rows of the per-layer activations over all layers: the fused q|k|v row, the
 * attention's output, and the MLP's middle (a mixture-of-experts layer's middle holds
 * n_experts_used experts' rows per token). */
static uint64_t forge__max_qkv(const forge__config *c) {
    uint64_t w = 0;
    for (int l = 0; l < c->n_layers; l++) w = FORGE__MAX(w, (uint64_t)forge__qkv_dim(c, l));
    return w;
}
static uint64_t forge__max_q(const forge__config *c) { return (uint64_t)c->n_heads * c->head_dim_max; }
static uint64_t forge__max_ffn(const forge__config *c) {
    uint64_t f = (uint64_t)c->n_experts_used * c->moe_ffn;
    for (int l = 0; l < c->n_layers; l++) f = FORGE__MAX(f, (uint64_t)c->layer_ffn[l]);
    return f;
}
/* Whether any layer's head_dim is not a multiple of 4 (what an f16 cache's kernels need). */
static bool forge__head_dims_by4(const forge__config *c) {
    for (int l = 0; l < c->n_layers; l++)
        if (forge__hd(c, l) % 4) return false;
    return true;
}

/* The sampler's chunks of the vocabulary, each reduced to its top candidates. */
static uint32_t forge__topk_chunks(const forge_model *m) {
    return (uint32_t)((m->cfg.n_vocab + FORGE__TOPK_CHUNK - 1) / FORGE__TOPK_CHUNK);
}

static forge_status forge__session_sizes(forge_model *m, const forge_session_params *p, forge__session_plan *sp, forge__err *err) {
    const forge__config *c = &m->cfg;
    const forge__caps *caps = &m->dev.caps;
    memset(sp, 0, sizeof *sp);
    if (p->n_ctx < 0 || p->n_batch < 0 || p->n_outputs_max < 0 || p->n_seq_max < 0)
        return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "session params: n_ctx, n_batch, n_outputs_max and n_seq_max must be >= 0");
    sp->n_seq = p->n_seq_max ? p->n_seq_max : 1;
    if (sp->n_seq > FORGE__BATCH_MAX_SEQ)
        return forge__fail(err, FORGE_ERR_LIMIT, "session params: n_seq_max %d is over the most sequences a batch runs, %d", sp->n_seq,
                           FORGE__BATCH_MAX_SEQ);
    sp->n_ctx = p->n_ctx ? p->n_ctx : FORGE__MIN(c->n_ctx_train, 4096);
    if (sp->n_ctx <= 0) sp->n_ctx = 4096;
    sp->n_batch = FORGE__MIN(p->n_batch ? p->n_batch : 512, sp->n_ctx);
    uint64_t range = FORGE__MIN(caps->max_storage_range, caps->max_alloc);
    uint64_t widest = FORGE__MAX(FORGE__MAX((uint64_t)c->hidden, 2 * forge__max_ffn(c)), forge__max_qkv(c)) * 4;
    if (c->ple_dim) widest = FORGE__MAX(widest, 4ull * c->n_layers * c->ple_dim);
    if (c->n_experts) widest = FORGE__MAX(widest, FORGE__MAX(4ull * c->n_experts, 4ull * c->n_experts_used * c->hidden));
    if (forge__has_linear(c)) widest = FORGE__MAX(widest, 4ull * forge__lin_mix_dim(c));
    if ((uint64_t)sp->n_batch * widest > range) sp->n_batch = (int)(range / widest); /* every activation fits one binding */
    if (sp->n_batch < 1)
        return forge__fail(err, FORGE_ERR_LIMIT, "one activation row of %llu bytes exceeds the binding limit %llu",
                           (unsigned long long)widest, (unsigned long long)range);
    uint64_t row = 4ull * c->n_vocab;
    if (row > range) return forge__fail(err, FORGE_ERR_LIMIT, "a logits row of %llu bytes exceeds the binding limit %llu", (unsigned long long)row, (unsigned long long)range);
    int n_out = p->n_outputs_max ? p->n_outputs_max : (int)FORGE__MAX((uint64_t)sp->n_seq, ((uint64_t)64 << 20) / row);
    n_out = FORGE__MIN(n_out, sp->n_batch);
    n_out = (int)FORGE__MIN((uint64_t)n_out, range / row);
    sp->n_out_max = FORGE__MAX(n_out, 1);
    /* a lookup step's rows too, as far as one binding holds each row's candidates (lowered limits) */
    uint64_t reduced_row = 8ull * FORGE__MAX((uint64_t)forge__topk_chunks(m) * FORGE__CANDIDATES, 1ull + FORGE__CANDIDATES);
    int lookup_rows = (int)FORGE__MIN((uint64_t)FORGE__MIN(FORGE__LOOKUP_MAX + 1, sp->n_batch), range / reduced_row);
    sp->n_reduced = FORGE__MAX(sp->n_seq, lookup_rows);
    if (sp->n_seq > sp->n_out_max) /* a batched decode step reads one logits row per sequence */
        return forge__fail(err, FORGE_ERR_LIMIT, "session params: n_seq_max %d needs as many logit rows per step; n_batch and "
                           "n_outputs_max allow %d", sp->n_seq, sp->n_out_max);
    if (p->kv_type < FORGE_KV_DEFAULT || p->kv_type > FORGE_KV_Q8_0)
        return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "session params: kv_type %d is not a forge_kv_type (0 default, 1 f32, 2 f16, 3 q8_0)",
                           p->kv_type);
    if (p->kv_type == FORGE_KV_F16 && !forge__head_dims_by4(c))
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "session params: an f16 KV cache needs head_dim a multiple of 4; this model's is %d",
                           c->head_dim);
    for (int l = 0; p->kv_type == FORGE_KV_Q8_0 && l < c->n_layers; l++)
        if (!c->layer_linear[l] && forge__hd(c, l) % 32) /* q8_0's blocks are 32 values of one head */
            return forge__fail(err, FORGE_ERR_UNSUPPORTED, "session params: a q8_0 KV cache needs head_dim a multiple of 32; layer %d's is %u", l,
                               forge__hd(c, l));
    if (p->kv_type != FORGE_KV_DEFAULT) sp->kv = (forge_kv_type)p->kv_type;
    else sp->kv = forge__head_dims_by4(c) && !m->exact && caps->type != FORGE_DEVICE_CPU ? FORGE_KV_F16 : FORGE_KV_F32;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_linear[l]) { /* a recurrent state of fixed size, not a cache of positions */
            uint64_t b = FORGE__MAX(forge__conv_state_bytes(c), forge__delta_state_bytes(c)) * (uint64_t)sp->n_seq;
            if (b > range)
                return forge__fail(err, FORGE_ERR_LIMIT, "n_seq_max %d needs a recurrent state of %llu bytes per linear-attention layer, over the device "
                                   "binding limit of %llu bytes: lower n_seq_max", sp->n_seq, (unsigned long long)b, (unsigned long long)range);
            sp->slots[l] = 0;
            continue;
        }
        uint64_t kv_row = forge__kv_row_bytes(c, l, sp->kv);
        uint64_t s = (uint64_t)sp->n_ctx;
        if (c->layer_sliding[l] && c->sliding_window > 0)
            s = FORGE__MIN(s, (uint64_t)c->sliding_window + (uint64_t)sp->n_batch - 1);
        if (s * kv_row * (uint64_t)sp->n_seq > range)
            return forge__fail(err, FORGE_ERR_LIMIT,
                               "n_ctx %d x n_seq_max %d needs a KV cache of %llu bytes per layer, over the device binding limit of %llu bytes: "
                               "lower n_ctx or n_seq_max", sp->n_ctx, sp->n_seq, (unsigned long long)(s * kv_row * (uint64_t)sp->n_seq),
                               (unsigned long long)range);
        sp->slots[l] = (uint32_t)s;
    }
    return FORGE_OK;
}

/* act_q8.comp's output for K activations: K int8 codes, then a vec4 per block of 32; matvec_q8a's
 * Q8_OUT (G8): the codes, then two vec4 per block of 32 (a value per group of 8). */
static uint64_t forge__act_q8_bytes(uint64_t K) { return K + K / 2; }
static uint64_t forge__act_q8_g8_bytes(uint64_t K) { return 2 * K; }
/* The longest input row of a layer's products: the hidden size (q|k|v, gate|up, the head),
 * the attention's output (o) or the MLP's middle (down). */
static uint64_t forge__max_product_k(const forge__config *c) {
    return FORGE__MAX(FORGE__MAX((uint64_t)c->hidden, forge__max_q(c)), forge__max_ffn(c));
}

/* Whether products of many rows run on the tensor cores (matmul_cm), which take their input
 * rows in f16 from a scratch of the session or trainer (forge__pass.a16): [rows, K] halves. */
static bool forge__uses_a16(const forge_model *m) { return m->dev.caps.coopmat_nv && !m->exact; }
static uint64_t forge__a16_bytes(const forge_model *m, uint64_t rows) {
    return forge__uses_a16(m) ? forge__align_up(2 * rows * forge__max_product_k(&m->cfg), 16) : 16;
}

/* Workgroups per head of the decode attention: FORGE__ATTN_SPLITS on GPUs, which need them to
 * fill the device (attention_decode.comp gives each at least one round of keys, so at a short
 * context most exit at once; at 4096 positions of the Llama-3.1-8B shape 16 splits kept the
 * H100's bandwidth under a third busy); FORGE__ATTN_SPLITS_BATCH per sequence of a batched
 * step, whose sequences fill the device themselves; FORGE__ATTN_SPLITS_CPU on CPU devices,
 * where every workgroup is a serial loop over its invocations (lavapipe, stories260K decode:
 * 2 splits 191 tok/s against 120 with 16, medians of 3 runs of `forge bench -p 32 -n 256 -r 3`
 * on a shared 2-core machine). */
static uint32_t forge__attn_splits(const forge_model *m, bool batched) {
    uint32_t splits = m->dev.caps.type == FORGE_DEVICE_CPU ? FORGE__ATTN_SPLITS_CPU : batched ? FORGE__ATTN_SPLITS_BATCH : FORGE__ATTN_SPLITS;
    /* one sequence's partial states [heads, splits, D + 2] f32 stay one binding (a device's
     * binding range can be small: tests lower it to 16 KiB) */
    uint64_t per_split = 4ull * m->cfg.n_heads * (m->cfg.head_dim_max + 2);
    return (uint32_t)FORGE__MAX(1, FORGE__MIN((uint64_t)splits, m->dev.caps.max_storage_range / per_split));
}
/* Keys an attention_decode workgroup takes at least (its runs' length at short contexts): 32 for
 * models whose query row is 4096 wide or more, else one round of the workgroup (16 on the
 * H100). At 512-640 positions the Llama-3.1-8B shape (32 heads of 128) decoded 316-319 tok/s
 * with 64 splits (runs of 16), 323-324 with 32, 328-330 with 16, while the 1B Q4_0 (32 heads of
 * 64), Qwen3-0.6B (16 of 128) and Gemma3-1B (4 of 256) shapes were fastest or level with 64; a
 * minimum run keeps long contexts on all 64 splits: the 8B shape, min_run 0 / 32, 319-321 /
 * 328-331 tok/s at 512-640 positions, 270-271 / 267-268 at 4096-4224 (bench/RESULTS.md). */
static uint32_t forge__attn_min_run(const forge_model *m) {
    return (uint64_t)m->cfg.n_heads * m->cfg.head_dim_max >= 4096 ? 32 : 0;
}

/* The session's activation buffers, in pack order (then the per-layer K and V caches). */
typedef enum forge__session_buf {
    FORGE__SB_X, FORGE__SB_XN, FORGE__SB_QKV, FORGE__SB_ATT, FORGE__SB_H, FORGE__SB_GU, FORGE__SB_LOGITS, FORGE__SB_DUMMY,
    FORGE__SB_CAND, FORGE__SB_CAND_STATS, FORGE__SB_SAMPLE_OUT, FORGE__SB_ATTN_PART, FORGE__SB_ATTN_DONE, FORGE__SB_LORA_U, FORGE__SB_ACT_Q8,
    FORGE__SB_ACT_Q8_RES, FORGE__SB_A16,
    FORGE__SB_ROUTER, FORGE__SB_ROUTE, FORGE__SB_MOE, FORGE__SB_MOE_Y, FORGE__SB_MOE_OUT, FORGE__SB_MLP_SUM,
    FORGE__SB_PLE, FORGE__SB_PLE_TMP, FORGE__SB_PLE_G, FORGE__SB_LIN_MIX, FORGE__SB_LIN_QKV, FORGE__SB_LIN_OUT, FORGE__SB_SHARED_S,
    FORGE__SB_LIN_CKPT, FORGE__SB_LIN_CHUNK, FORGE__SB_COUNT
} forge__session_buf;

#define FORGE__MOE_BM 64   /* matmul.comp's tile rows: moe_group.comp's tiles hold at most this many pairs */
#define FORGE__MOE_BM_S 32 /* its SKINNY build's (matmul_moe_s) */
/* The tile rows of a grouped product of n pairs: 32 where the experts get 32 pairs or fewer on
 * average (Qwen 3.5-35B-A3B's 256 experts take 16 each from a 512-token prompt: 64-row tiles
 * would compute three rows of zeros for each one they use), else 64 (each tile reads its
 * expert's rows once for twice as many pairs). */
static uint32_t forge__moe_tile_rows(uint32_t n_experts, uint64_t pairs) {
    return pairs <= (uint64_t)FORGE__MOE_BM_S * n_experts ? FORGE__MOE_BM_S : FORGE__MOE_BM;
}
/* moe_group.comp's table for n pairs, sized for the smaller tiles: a count, a tile per 32 pairs
 * and per expert at most, the sorted pairs. */
static uint64_t forge__moe_max_tiles(uint32_t n_experts, uint64_t pairs) { return (pairs + FORGE__MOE_BM_S - 1) / FORGE__MOE_BM_S + n_experts; }
static uint32_t forge__moe_order_off(uint32_t n_experts, uint64_t pairs) { return (uint32_t)(4 + 4 * forge__moe_max_tiles(n_experts, pairs)); }

/* The int8 activations' scratch: one token's in groups of 8 (a decode layer's chain), and up
 * to FORGE__MATVEC_MAX_M tokens' in act_q8's blocks as far as one binding holds them
 * (matvec_q8a_rows; forward.c checks what fits). */
static uint64_t forge__act_q8_scratch_bytes(const forge_model *m) {
    if (!m->act_q8) return 16;
    uint64_t K = forge__max_product_k(&m->cfg), range = FORGE__MIN(m->dev.caps.max_storage_range, m->dev.caps.max_alloc);
    return FORGE__MAX(forge__act_q8_g8_bytes(K), FORGE__MIN(FORGE__MATVEC_MAX_M * forge__act_q8_bytes(K), range / 16 * 16));
}

/* The decode attention's partials: a batched step's splits (its sequences') or one sequence's,
 * and, as far as one binding holds them, a lookup step's rows' (forge__record_layer: else those
 * rows take the prefill attention). */
static uint64_t forge__attn_part_bytes(const forge_model *m, const forge__session_plan *sp) {
    uint64_t head = 4ull * m->cfg.n_heads * (m->cfg.head_dim_max + 2), batched = head * forge__attn_splits(m, true);
    uint64_t need = FORGE__MAX((uint64_t)sp->n_seq * batched, head * forge__attn_splits(m, false));
    uint64_t range = FORGE__MIN(m->dev.caps.max_storage_range, m->dev.caps.max_alloc);
    return FORGE__MAX(need, FORGE__MIN((uint64_t)sp->n_reduced * batched, range / batched * batched));
}

/* Adds every device buffer of a session to `pack`: the activations by forge__session_buf,
 * then K and V of each layer. */
static forge_status forge__session_pack(forge_model *m, const forge__session_plan *sp, forge__pack *pack, forge__arena *a, forge__err *err) {
    const forge__config *c = &m->cfg;
    uint64_t nb = (uint64_t)sp->n_batch;
    uint64_t sizes[FORGE__SB_COUNT] = {
        [FORGE__SB_X] = nb * c->hidden * 4,
        [FORGE__SB_XN] = nb * c->hidden * 4,
        [FORGE__SB_QKV] = nb * forge__max_qkv(c) * 4,
        [FORGE__SB_ATT] = nb * forge__max_q(c) * 4,
        [FORGE__SB_H] = nb * forge__max_ffn(c) * 4,
        [FORGE__SB_GU] = nb * forge__max_ffn(c) * 8,
        [FORGE__SB_LOGITS] = (uint64_t)sp->n_out_max * c->n_vocab * 4,
        [FORGE__SB_DUMMY] = 256,
        [FORGE__SB_CAND] = 8ull * (uint64_t)sp->n_reduced * forge__topk_chunks(m) * FORGE__CANDIDATES,
        [FORGE__SB_CAND_STATS] = 8ull * (uint64_t)sp->n_reduced * forge__topk_chunks(m),
        [FORGE__SB_SAMPLE_OUT] = 8ull * (uint64_t)sp->n_reduced * (1 + FORGE__CANDIDATES),
        [FORGE__SB_ATTN_PART] = forge__attn_part_bytes(m, sp),
        [FORGE__SB_ATTN_DONE] = 4ull * c->n_heads * nb,
        [FORGE__SB_LORA_U] = m->adapter.pairs ? nb * FORGE__T_COUNT * m->adapter.max_rank * 4 : 16,
        [FORGE__SB_ACT_Q8] = forge__act_q8_scratch_bytes(m),
        [FORGE__SB_ACT_Q8_RES] = m->act_q8 ? forge__act_q8_g8_bytes(forge__max_product_k(c)) : 16,
        [FORGE__SB_A16] = forge__a16_bytes(m, nb),
        /* mixture of experts: router logits [nb, E], the choices (expert, weight) [nb * k], the
         * prefill's group table and its experts' outputs [nb * k, H]; Gemma 4 also keeps the
         * experts' sum and the dense MLP's normed output [nb, H] apart */
        [FORGE__SB_ROUTER] = c->n_experts ? nb * c->n_experts * 4 : 16,
        [FORGE__SB_ROUTE] = c->n_experts ? nb * c->n_experts_used * 8 : 16,
        [FORGE__SB_MOE] = c->n_experts ? 4ull * (forge__moe_order_off((uint32_t)c->n_experts, nb * c->n_experts_used) + nb * c->n_experts_used) : 16,
        [FORGE__SB_MOE_Y] = c->n_experts ? nb * c->n_experts_used * c->hidden * 4 : 16,
        [FORGE__SB_MOE_OUT] = c->router == FORGE__ROUTER_GEMMA4 ? nb * c->hidden * 4 : 16,
        [FORGE__SB_MLP_SUM] = c->router == FORGE__ROUTER_GEMMA4 ? nb * c->hidden * 4 : 16,
        /* Gemma 4's per-layer inputs [nb, layers * ple_dim], and scratch for their projection, then each layer's gate */
        [FORGE__SB_PLE] = c->ple_dim ? nb * c->n_layers * c->ple_dim * 4 : 16,
        [FORGE__SB_PLE_TMP] = c->ple_dim ? nb * c->n_layers * c->ple_dim * 4 : 16,
        [FORGE__SB_PLE_G] = c->ple_dim ? nb * c->ple_dim * 4 : 16,
        /* Qwen 3.5's linear layers: the in-projection's rows, the convolved q|k|v, the mixer's output;
         * the MoE's shared-expert gate per row */
        [FORGE__SB_LIN_MIX] = forge__has_linear(c) ? nb * forge__lin_mix_dim(c) * 4 : 16,
        [FORGE__SB_LIN_QKV] = forge__has_linear(c) ? nb * forge__lin_conv_dim(c) * 4 : 16,
        [FORGE__SB_LIN_OUT] = forge__has_linear(c) ? nb * forge__lin_v_dim(c) * 4 : 16,
        [FORGE__SB_SHARED_S] = c->shared_ffn ? FORGE__MAX(nb * 4, 16) : 16,
        [FORGE__SB_LIN_CKPT] = FORGE__MAX(forge__recurrent_seq_bytes(c), 16),
        [FORGE__SB_LIN_CHUNK] = forge__has_linear(c) ? forge__delta_chunk_bytes(c, nb) : 16,
    };
    for (size_t i = 0; i < FORGE__SB_COUNT; i++)
        if (forge__pack_add(pack, a, sizes[i]) < 0) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int l = 0; l < c->n_layers; l++) /* a KV-shared layer's cache is its source's (16 bytes held in its place) */
        for (int kv = 0; kv < 2; kv++) {
            uint64_t b = forge__kv_shared(c, l) ? 16 : (uint64_t)sp->n_seq * sp->slots[l] * forge__kv_row_bytes(c, l, sp->kv);
            if (c->layer_linear[l]) b = FORGE__MAX(16, (uint64_t)sp->n_seq * (kv ? forge__delta_state_bytes(c) : forge__conv_state_bytes(c)));
            if (forge__pack_add(pack, a, b) < 0) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        }
    return forge__pack_plan(pack, a, &m->dev.caps, err);
}

static void forge__session_kv_bytes(const forge_model *m, const forge__session_plan *sp, uint64_t *all, uint64_t *sliding, uint64_t *state) {
    const forge__config *c = &m->cfg;
    *all = *sliding = 0;
    *state = forge__recurrent_seq_bytes(c); /* the prompt cache's checkpoint */
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_linear[l]) *state += (uint64_t)sp->n_seq * (forge__conv_state_bytes(c) + forge__delta_state_bytes(c));
        if (forge__kv_shared(c, l) || c->layer_linear[l]) continue;
        uint64_t b = 2ull * sp->n_seq * sp->slots[l] * forge__kv_row_bytes(c, l, sp->kv);
        *all += b;
        if (c->layer_sliding[l] && c->sliding_window > 0) *sliding += b;
    }
}

/* The io buffer: step params at 0, penalty ids at 64, tokens after them, then batch
 * generation's 1 / temperature per row, then a constraint's mask (a bit per token, at a
 * 256-byte boundary: any storage offset alignment); and the readback buffer: the sampler's
 * output, then the logits rows. */
#define FORGE__IO_PENALTY_OFFSET 64
#define FORGE__IO_TOKENS_OFFSET (FORGE__IO_PENALTY_OFFSET + 4 * FORGE__MAX_PENALTY_WINDOW)
#define FORGE__RB_LOGITS_OFFSET 4096   /* >= 8 * (1 + FORGE__CANDIDATES), a multiple of any alignment */
static uint64_t forge__session_io_mask_offset(const forge__session_plan *sp) {
    return (FORGE__IO_TOKENS_OFFSET + 4ull * sp->n_batch + 4ull * sp->n_reduced + 255) & ~255ull;
}
static uint64_t forge__session_io_bytes(const forge_model *m, const forge__session_plan *sp) {
    return forge__session_io_mask_offset(sp) + 4ull * (((uint64_t)m->cfg.n_vocab + 31) / 32);
}
static uint64_t forge__session_readback_bytes(const forge_model *m, const forge__session_plan *sp) {
    uint64_t batch_cands = 8ull * (uint64_t)sp->n_reduced * (1 + FORGE__CANDIDATES); /* batch generation and lookup: candidates per row */
    uint64_t row = (uint64_t)FORGE__MAX(FORGE__MAX(m->cfg.n_vocab, m->cfg.hidden), forge__st_dim(&m->embed, m->cfg.hidden)); /* logits, or a vector */
    return FORGE__RB_LOGITS_OFFSET + FORGE__MAX(4ull * sp->n_out_max * row, batch_cands);
}
static uint64_t forge__session_host_visible_bytes(const forge_model *m, const forge__session_plan *sp) {
    return forge__session_io_bytes(m, sp) + forge__session_readback_bytes(m, sp);
}

/* Whether forge_embed's Dense steps run on the device in session s: the model has them there
 * (forge__st_device_steps), and each step's output for n_out_max texts fits the buffer it is
 * written to (the logits and gate|up buffers in turn). Else the host runs them. */
static bool forge__session_embed_dense(const forge_session *s) {
    const forge__st *e = &s->m->embed;
    if (!forge__st_device_steps(e)) return false;
    for (int k = 0; k < e->n_dense; k++) {
        uint64_t need = 4ull * (uint64_t)s->n_out_max * (uint64_t)e->dense[k].out;
        if (need > (k % 2 ? s->gu.size : s->logits.size)) return false;
    }
    return true;
}
