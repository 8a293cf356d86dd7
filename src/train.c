/* src/train.c: Training.
 * Owns: the trainer: its device plan (adapters, gradients and AdamW moments in a flat
 * vector; the activations the backward pass reads; scratch), the recorded step (the forward pass
 * keeping its activations, the loss over chunks of rows, the hand-written backward pass layer
 * by layer, gradient checkpointing), the optimizer, and the forge_train_* calls.
 * May call: every file before it but discover.c, batch.c, classify.c and chat.c.
 */

/* ---- The trainer ---- */

#define FORGE__TRAIN_RECORDINGS 4
#define FORGE__TRAIN_PAD 32            /* a batch's length is padded up to a multiple of this (fewer recordings) */
/* logits rows per loss chunk: at most this many bytes, whole 128-row tiles where more than one
 * (256 rows of a 128k vocabulary: the head's forward products stay large, its backward ones on
 * the tensor cores are split along the vocabulary, and their f16 input fits the scratch the
 * layers' need) */
#define FORGE__LOSS_CHUNK_BYTES ((uint64_t)128 << 20)

/* A run of the flat parameter vector in one device buffer each for the parameters, their
 * gradients and AdamW's two moments. */
typedef struct forge__param_seg {
    forge__range p, g, m1, m2;
    uint64_t count;
} forge__param_seg;

/* Everything the trainer's device plan follows from, computed by forge__train_layout. */
typedef struct forge__train_layout {
    forge_train_params p;          /* resolved: defaults filled, the adapter's rank, alpha and targets */
    uint32_t targets;
    int first_layer;               /* layers below have no adapters (and no backward pass) */
    bool from_adapter;
    forge__adapter_host ah;        /* the adapter to start from */
    bool ckpt;
    uint32_t max_rows;             /* max_batch * max_seq */
    uint32_t loss_rows;            /* rows of logits per loss chunk */
    uint32_t targets_width;        /* MSE: floats per row of targets (hidden or vocab); 0 otherwise */
    forge__lora lora;              /* ranks, shapes, scales and element offsets (segments from seg) */
    int n_segs;
    uint64_t seg_count[64];
    uint64_t n_params;
    uint32_t n_parts;              /* partial sums of the gradient's norm (adamw.comp mode 0) */
    uint32_t delta_chunk;          /* Qwen 3.5: delta_rule_back.comp's rows between checkpoints (~sqrt(max_seq)) */
} forge__train_layout;

/* The trainer's device buffers, in pack order. Per layer then: x_in, and without gradient
 * checkpointing the rest of forge__train_layer_buf, sized for the layer's type (Qwen 3.5's
 * linear-attention layers keep the LIN_ ones, attention layers the attention's). Where a
 * working buffer serves both (DQKV: q|k|v or the in-projection's row; DATT: the attention's or
 * the delta rule's output), it is as wide as the wider. */
typedef enum forge__train_buf {
    FORGE__TB_X, FORGE__TB_XN, FORGE__TB_XF, FORGE__TB_DX, FORGE__TB_DXN, FORGE__TB_DQKV, FORGE__TB_DATT, FORGE__TB_DH,
    FORGE__TB_DGU, FORGE__TB_DU, FORGE__TB_LOGITS, FORGE__TB_LOSS, FORGE__TB_NORM, FORGE__TB_GEMM_PART, FORGE__TB_DUMMY, FORGE__TB_A16,
    FORGE__TB_DLIN,                /* [N, conv_dim] the gradient of the convolution's output */
    FORGE__TB_DQK,                 /* [N, NV, 2, DK] each value head's dq, dk (delta_rule_back.comp -> l2norm_back.comp) */
    FORGE__TB_CONV_STATE,          /* the forward's convolution states [max_batch, K - 1, conv_dim] (written, never read) */
    FORGE__TB_DELTA,               /* delta_rule_back.comp's work buffer, and the forward's delta-rule states before it */
    FORGE__TB_DPAIR,               /* [N * top_k, H] mixture of experts: each pair's input gradient, before they are summed per token */
    FORGE__TB_DLOGITS,             /* [N, E] the router logits' gradient */
    FORGE__TB_DS,                  /* [N] the shared expert's gate's gradient */
    FORGE__TB_COUNT
} forge__train_buf;
typedef enum forge__train_layer_buf {
    FORGE__TL_X_IN, FORGE__TL_X_MID, FORGE__TL_QKV, FORGE__TL_QKV_RAW, FORGE__TL_ATT, FORGE__TL_LSE, FORGE__TL_GU, FORGE__TL_H,
    FORGE__TL_K, FORGE__TL_V, FORGE__TL_O, FORGE__TL_D, FORGE__TL_U,
    FORGE__TL_ATT_G,               /* Qwen 3.5's attention layers: att times its output gate */
    FORGE__TL_LIN_MIX, FORGE__TL_LIN_QKV, FORGE__TL_LIN_OUT, /* Qwen 3.5's linear-attention layers (forge__acts) */
    FORGE__TL_ROUTER, FORGE__TL_ROUTE, FORGE__TL_MOE, FORGE__TL_MOE_Y, FORGE__TL_EXP_GU, FORGE__TL_EXP_H, /* mixture-of-experts layers (forge__acts) */
    FORGE__TL_SHARED_S,            /* Qwen 3.5-MoE: x . shared_expert_gate */
    FORGE__TL_COUNT
} forge__train_layer_buf;

struct forge_trainer {
    forge__err err;
    forge_model *m;
    forge__arena arena;
    forge__train_layout L;
    forge__param_seg *segs;
    forge__mem_counter mem;
    forge__pack pack;
    forge__buffer *blocks;
    int n_blocks;
    forge__buffer io;              /* host-visible: step params | optimizer params | tokens | labels | weights | targets */
    forge__buffer readback;        /* host-visible: per-row losses [max_rows] | the gradient's squared norm */
    forge__range params_r, opt_r, tokens_r, labels_r, weights_r, targets_r;
    uint64_t rb_norm_offset;
    forge__range r[FORGE__TB_COUNT];
    forge__acts *acts;             /* per layer: where its forward pass goes (kept, or the shared set) */
    VkCommandPool cmd_pool;
    VkFence fence;
    forge__recording rec[FORGE__TRAIN_RECORDINGS]; /* key: n_tokens = sequences, out_row0 = length, mode = 1 step / 0 eval */
    forge__recording opt_rec;
    uint64_t use_clock;
    int step;                      /* optimizer steps applied */
    int micro;                     /* micro-batches accumulated toward the next one */
    uint64_t n_micro;              /* every micro-batch so far: the dropout seed's counter */
    bool profile;
    forge__profile prof;
};

FORGE_API forge_train_params forge_train_default_params(void) {
    forge_train_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.rank = 8;
    p.alpha = 16.0f;
    p.targets = "q_proj,v_proj";
    p.lr = 1e-3;
    p.beta1 = 0.9;
    p.beta2 = 0.999;
    p.eps = 1e-8;
    p.weight_decay = 0.01;
    p.accum_steps = 1;
    p.max_batch = 4;
    p.max_seq = 512;
    p.grad_checkpoint = -1;
    return p;
}

/* Bytes of each per-layer buffer of layer l (0: not kept for its type) for `rows` rows. */
static void forge__train_layer_sizes(const forge_model *m, const forge__train_layout *L, int l, uint64_t rows, uint64_t *sz) {
    const forge__config *c = &m->cfg;
    bool lin = c->layer_linear[l], sw = c->sandwich_norms, moe = c->layer_moe[l] != 0;
    uint64_t H = (uint64_t)c->hidden, F = moe && !c->shared_ffn ? 0 : (uint64_t)c->layer_ffn[l];
    uint64_t QD = lin ? 0 : forge__q_dim(c, l), KVD = lin ? 0 : forge__kv_dim(c, l), QKVD = lin ? 0 : forge__qkv_dim(c, l);
    uint64_t K = moe ? (uint64_t)c->n_experts_used : 0, I = (uint64_t)c->moe_ffn, E = (uint64_t)c->n_experts;
    uint64_t w[FORGE__TL_COUNT] = {
        [FORGE__TL_X_IN] = H, [FORGE__TL_X_MID] = H, [FORGE__TL_QKV] = QKVD, [FORGE__TL_QKV_RAW] = c->qk_norm ? QKVD : 0,
        [FORGE__TL_ATT] = QD, [FORGE__TL_LSE] = lin ? 0 : 2 * (uint64_t)c->n_heads, [FORGE__TL_GU] = 2 * F, [FORGE__TL_H] = F,
        [FORGE__TL_K] = KVD, [FORGE__TL_V] = KVD, [FORGE__TL_O] = sw ? H : 0, [FORGE__TL_D] = sw ? H : 0,
        [FORGE__TL_U] = (uint64_t)FORGE__T_COUNT * L->lora.max_rank, [FORGE__TL_ATT_G] = c->attn_gate ? QD : 0,
        [FORGE__TL_LIN_MIX] = lin ? forge__lin_mix_dim(c) : 0, [FORGE__TL_LIN_QKV] = lin ? forge__lin_conv_dim(c) : 0,
        [FORGE__TL_LIN_OUT] = lin ? forge__lin_v_dim(c) : 0,
        [FORGE__TL_ROUTER] = moe ? E : 0, [FORGE__TL_ROUTE] = 2 * K, [FORGE__TL_MOE_Y] = K * H, [FORGE__TL_EXP_GU] = 2 * K * I,
        [FORGE__TL_EXP_H] = K * I, [FORGE__TL_SHARED_S] = moe && c->shared_ffn ? 1 : 0,
    };
    for (int i = 0; i < FORGE__TL_COUNT; i++) sz[i] = 4 * rows * w[i];
    /* moe_group.comp's table: its tiles, then the pairs sorted by expert */
    sz[FORGE__TL_MOE] = moe ? 4ull * (forge__moe_order_off((uint32_t)E, rows * K) + rows * K) : 0;
}

/* delta_rule_back.comp's work buffer, floats per (sequence, value head) for sequences of seq
 * rows with a checkpoint every `chunk` rows: the checkpoints, the chunk's states, the state's
 * gradient, and each row's gradient of the rule's output (the kernel's layout). */
static uint64_t forge__delta_work_floats(const forge__config *c, uint32_t chunk, uint32_t seq) {
    uint64_t n_ck = (seq + chunk - 1) / chunk, DKDV = (uint64_t)c->lin_k_dim * c->lin_v_dim;
    return (n_ck + chunk + 2) * DKDV + (uint64_t)chunk * c->lin_v_dim;
}

/* Validates the params, reads the adapter to start from, and lays out the parameters. */
static forge_status forge__train_layout_make(forge_model *m, const forge_train_params *pp, forge__arena *arena, forge__train_layout *L,
                                             forge__err *err) {
    const forge__config *c = &m->cfg;
    memset(L, 0, sizeof *L);
    L->p = *pp;
    forge_train_params *p = &L->p;
    forge_status st;
    const char *why = forge__lora_unsupported(c);
    if (why) return forge__fail(err, FORGE_ERR_UNSUPPORTED, "training is not supported for architecture %s (%s)", forge__arch_names[c->arch], why);
    bool attention = false;
    for (int l = 0; l < c->n_layers; l++) attention |= !c->layer_linear[l];
    if (attention && c->head_dim > FORGE__MAX_TRAIN_HEAD_DIM)
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "training supports head_dim up to %d (attention_back.comp); this model's is %d",
                           FORGE__MAX_TRAIN_HEAD_DIM, c->head_dim);
    if (p->adapter_path) {
        if ((st = forge__adapter_read(m, p->adapter_path, arena, &L->ah, err))) return forge__wrap(err, st, "adapter %s", p->adapter_path);
        L->from_adapter = true;
        p->rank = (int)L->ah.rank;
        p->alpha = L->ah.alpha;
        L->targets = L->ah.targets;
        L->first_layer = L->ah.first_layer;
    } else {
        if ((st = forge__targets_parse(p->targets, &L->targets, err))) return st;
        if (p->n_layers < 0 || p->n_layers > c->n_layers)
            return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "train params: n_layers %d: the model has %d layers", p->n_layers, c->n_layers);
        L->first_layer = p->n_layers ? c->n_layers - p->n_layers : 0;
    }
    struct { const char *what; bool ok; } checks[] = {
        {"rank must be in [1, 4096]", p->rank >= 1 && p->rank <= 4096},
        {"alpha must be > 0", p->alpha > 0},
        {"dropout must be in [0, 1)", p->dropout >= 0 && p->dropout < 1},
        {"lr must be >= 0", p->lr >= 0},
        {"beta1 and beta2 must be in [0, 1)", p->beta1 >= 0 && p->beta1 < 1 && p->beta2 >= 0 && p->beta2 < 1},
        {"eps must be > 0", p->eps > 0},
        {"weight_decay must be >= 0", p->weight_decay >= 0},
        {"warmup_steps must be >= 0", p->warmup_steps >= 0},
        {"schedule must be FORGE_LR_CONSTANT, FORGE_LR_LINEAR or FORGE_LR_COSINE", p->schedule >= FORGE_LR_CONSTANT && p->schedule <= FORGE_LR_COSINE},
        {"a linear or cosine schedule needs total_steps > warmup_steps",
         p->schedule == FORGE_LR_CONSTANT || p->total_steps > p->warmup_steps},
        {"max_grad_norm must be >= 0", p->max_grad_norm >= 0},
        {"accum_steps must be >= 1", p->accum_steps >= 1},
        {"loss must be FORGE_LOSS_CROSS_ENTROPY, FORGE_LOSS_MSE_HIDDEN or FORGE_LOSS_MSE_LOGITS",
         p->loss >= FORGE_LOSS_CROSS_ENTROPY && p->loss <= FORGE_LOSS_MSE_LOGITS},
        {"max_batch must be >= 1", p->max_batch >= 1},
        {"max_seq must be >= 2", p->max_seq >= 2},
    };
    for (size_t i = 0; i < FORGE__ARRAY_LEN(checks); i++)
        if (!checks[i].ok) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "train params: %s", checks[i].what);
    if (p->max_seq > c->n_ctx_train)
        return forge__fail(err, FORGE_ERR_LIMIT, "train params: max_seq %d is longer than the model's context of %d", p->max_seq, c->n_ctx_train);
    uint64_t rows = (uint64_t)p->max_batch * (uint64_t)p->max_seq;
    if (rows > (1u << 24)) return forge__fail(err, FORGE_ERR_LIMIT, "train params: max_batch x max_seq = %llu rows (at most 2^24)", (unsigned long long)rows);
    L->max_rows = (uint32_t)rows;
    L->ckpt = p->grad_checkpoint < 0 ? rows >= 4096 : p->grad_checkpoint != 0;
    const forge__caps *caps = &m->dev.caps;
    uint64_t range = FORGE__MIN(caps->max_storage_range, caps->max_alloc);
    uint64_t widest = 0, ls[FORGE__TL_COUNT];
    L->lora.max_rank = (uint32_t)p->rank; /* (forge__train_layer_sizes: the adapters' columns; the pairs below set it) */
    for (int l = 0; l < c->n_layers; l++) {
        forge__train_layer_sizes(m, L, l, 1, ls);
        for (int i = 0; i < FORGE__TL_COUNT; i++) widest = FORGE__MAX(widest, ls[i]);
    }
    if (forge__has_linear(c)) widest = FORGE__MAX(widest, 8ull * c->lin_v_heads * c->lin_k_dim); /* TB_DQK */
    if (rows * widest > range)
        return forge__fail(err, FORGE_ERR_LIMIT,
                           "train params: max_batch x max_seq = %llu rows of up to %llu bytes exceed the device's binding limit of %llu bytes: "
                           "lower max_batch or max_seq", (unsigned long long)rows, (unsigned long long)widest, (unsigned long long)range);
    /* the delta rule's checkpoints every ~sqrt(max_seq) rows: as many checkpoints as states of a chunk (forge__delta_work_floats) */
    L->delta_chunk = (uint32_t)ceil(sqrt((double)p->max_seq));
    uint64_t work = 4ull * (uint64_t)p->max_batch * (uint64_t)c->lin_v_heads * forge__delta_work_floats(c, L->delta_chunk, (uint32_t)p->max_seq);
    if (forge__has_linear(c) && work > range)
        return forge__fail(err, FORGE_ERR_LIMIT, "train params: the delta rule's backward pass needs %llu bytes of states for max_batch %d x max_seq %d, "
                           "more than the device's binding limit of %llu bytes: lower max_batch or max_seq", (unsigned long long)work,
                           p->max_batch, p->max_seq, (unsigned long long)range);
    uint64_t V = (uint64_t)c->n_vocab;
    if (4 * V > range) return forge__fail(err, FORGE_ERR_LIMIT, "a logits row of %llu bytes exceeds the binding limit", (unsigned long long)(4 * V));
    L->loss_rows = (uint32_t)FORGE__MIN(rows, FORGE__MAX(1, FORGE__MIN(FORGE__LOSS_CHUNK_BYTES, range) / (4 * V)));
    if (L->loss_rows > 128 && L->loss_rows < rows) L->loss_rows = L->loss_rows / 128 * 128;
    if (p->loss == FORGE_LOSS_MSE_HIDDEN) L->targets_width = (uint32_t)c->hidden;
    if (p->loss == FORGE_LOSS_MSE_LOGITS) {
        L->targets_width = (uint32_t)V;
        if (rows * 4 * V > range)
            return forge__fail(err, FORGE_ERR_LIMIT, "MSE on logits: targets of %llu x %llu floats exceed the binding limit of %llu bytes",
                               (unsigned long long)rows, (unsigned long long)V, (unsigned long long)range);
    }
    /* the pairs, packed into segments that each fit one binding */
    size_t n = (size_t)c->n_layers * FORGE__T_COUNT;
    L->lora.n_layers = c->n_layers;
    L->lora.dropout = p->dropout;
    L->lora.pairs = (forge__lora_pair *)forge__arena_alloc(arena, sizeof *L->lora.pairs * n, 16);
    if (!L->lora.pairs) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    memset(L->lora.pairs, 0, sizeof *L->lora.pairs * n);
    L->lora.max_rank = 0;
    uint64_t seg_limit = range / 4;
    for (size_t i = 0; i < n; i++) {
        int l = (int)(i / FORGE__T_COUNT), t = (int)(i % FORGE__T_COUNT);
        forge__lora_pair *lp = &L->lora.pairs[i];
        bool wanted = l >= L->first_layer && (L->targets >> t & 1u) && forge__target_on(c, l, (forge__target)t);
        uint32_t rank = L->from_adapter ? L->ah.pairs[i].rank : wanted ? (uint32_t)p->rank : 0;
        if (!rank) continue;
        lp->rank = rank;
        forge__target_dims(c, (forge__target)t, &lp->in, &lp->out);
        lp->scale = L->from_adapter ? L->ah.pairs[i].scale : p->alpha / (float)rank;
        uint64_t size = (uint64_t)rank * (lp->in + lp->out);
        if (size > seg_limit) return forge__fail(err, FORGE_ERR_LIMIT, "one LoRA pair of %llu floats exceeds the binding limit", (unsigned long long)size);
        if (L->n_segs == 0 || L->seg_count[L->n_segs - 1] + size > seg_limit) {
            if (L->n_segs == (int)FORGE__ARRAY_LEN(L->seg_count)) return forge__fail(err, FORGE_ERR_LIMIT, "too many LoRA parameters for the binding limit");
            L->n_segs++;
        }
        lp->seg = L->n_segs - 1;
        lp->a_el = (uint32_t)L->seg_count[lp->seg];
        lp->b_el = lp->a_el + rank * lp->in;
        L->seg_count[lp->seg] += size;
        L->n_params += size;
        L->lora.max_rank = FORGE__MAX(L->lora.max_rank, rank);
    }
    if (!L->n_params) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "train params: no projection to adapt");
    for (int t = 0; t < FORGE__T_COUNT && !L->from_adapter && strcmp(p->targets, "all"); t++) { /* a target named that no layer has */
        bool found = !(L->targets >> t & 1u);
        for (int l = L->first_layer; l < c->n_layers && !found; l++) found = forge__lora_at(&L->lora, l, (forge__target)t) != NULL;
        if (!found)
            return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "train params: target %s: no %slayer of this %s model has it", forge__target_names[t],
                               L->first_layer ? "adapted " : "", forge__arch_names[c->arch]);
    }
    for (int s = 0; s < L->n_segs; s++) L->n_parts += (uint32_t)((L->seg_count[s] + FORGE__ADAMW_PER_WG - 1) / FORGE__ADAMW_PER_WG);
    return FORGE_OK;
}

/* forge__linear_back_cm's scratch for M rows of a chunk of `rows` outputs into K inputs, split
 * in `splits` along the reduction: dy's rows in f16 [M, rows rounded up to 8], then (each part
 * 256-byte aligned, for binding) the rows' inverse scales [M] f32 and, split, the partial sums
 * [splits, M, K] f32. The trainer keeps FORGE__BACK_CM_PART_BYTES for the partials: splits are
 * chosen to make about 256 tiles of 128 x 128, so their sums hold about 256 tiles' worth. */
#define FORGE__BACK_CM_PART_BYTES ((uint64_t)4 * 256 * 128 * 128)
static uint64_t forge__back_cm_scales_at(uint32_t M, uint32_t rows) { return forge__align_up(2ull * M * forge__align_up(rows, 8), 256); }
static uint64_t forge__back_cm_part_at(uint32_t M, uint32_t rows) { return forge__back_cm_scales_at(M, rows) + forge__align_up(4ull * M, 256); }
static uint64_t forge__back_cm_bytes(uint32_t M, uint32_t rows, uint32_t K, uint32_t splits) {
    return forge__back_cm_part_at(M, rows) + (splits > 1 ? 4ull * splits * M * K : 0);
}

/* Adds every device buffer of the trainer to `pack`: the segments (parameters, gradients, two
 * moments each), the working buffers (forge__train_buf), the shared layer set (every layer's
 * activations under checkpointing, or of the layers without adapters), then per adapted layer
 * its input, and without checkpointing the rest. */
static forge_status forge__train_pack(const forge_model *m, const forge__train_layout *L, forge__pack *pack, forge__arena *a, forge__err *err) {
    const forge__config *c = &m->cfg;
    uint64_t N = L->max_rows, H = (uint64_t)c->hidden, F = (uint64_t)c->ffn, U = (uint64_t)FORGE__T_COUNT * L->lora.max_rank;
    uint64_t KI = c->n_experts ? (uint64_t)c->n_experts_used * c->moe_ffn : 0, KH = c->n_experts ? (uint64_t)c->n_experts_used * H : 0;
    bool ok = true, lin = forge__has_linear(c);
    for (int s = 0; s < L->n_segs; s++)
        for (int k = 0; k < 4; k++) ok &= forge__pack_add(pack, a, 4 * L->seg_count[s]) >= 0;
    /* the shared layer set: every buffer as large as the largest layer's */
    uint64_t shared[FORGE__TL_COUNT] = {0}, ls[FORGE__TL_COUNT];
    for (int l = 0; l < c->n_layers; l++) {
        forge__train_layer_sizes(m, L, l, N, ls);
        for (int i = 0; i < FORGE__TL_COUNT; i++) shared[i] = FORGE__MAX(shared[i], ls[i]);
    }
    uint64_t widest_pair = 0; /* the widest features of any adapted projection */
    for (int i = 0; i < c->n_layers * FORGE__T_COUNT; i++)
        if (L->lora.pairs[i].rank) widest_pair = FORGE__MAX(widest_pair, FORGE__MAX(L->lora.pairs[i].in, L->lora.pairs[i].out));
    uint64_t sizes[FORGE__TB_COUNT] = {
        [FORGE__TB_X] = 4 * N * H, [FORGE__TB_XN] = 4 * N * H, [FORGE__TB_XF] = 4 * N * H, [FORGE__TB_DX] = 4 * N * H, [FORGE__TB_DXN] = 4 * N * H,
        [FORGE__TB_DQKV] = FORGE__MAX(shared[FORGE__TL_QKV], shared[FORGE__TL_LIN_MIX]),
        [FORGE__TB_DATT] = FORGE__MAX(shared[FORGE__TL_ATT], shared[FORGE__TL_LIN_OUT]),
        /* (the shared expert's or the dense MLP's middle, or the experts' of every pair: one after the other) */
        [FORGE__TB_DH] = 4 * N * FORGE__MAX(F, KI), [FORGE__TB_DGU] = 8 * N * FORGE__MAX(F, KI), [FORGE__TB_DU] = 4 * N * U,
        [FORGE__TB_LOGITS] = L->p.loss == FORGE_LOSS_MSE_HIDDEN ? 16 : 4ull * L->loss_rows * c->n_vocab,
        [FORGE__TB_LOSS] = 4 * N, [FORGE__TB_NORM] = 4ull * (1 + L->n_parts), [FORGE__TB_DUMMY] = 256,
        /* split-K partial sums of the widest low-rank product: tokens, or a projection's features, by rank */
        [FORGE__TB_GEMM_PART] = 4ull * FORGE__GEMM_MAX_SPLITS * L->lora.max_rank * FORGE__MAX(N, widest_pair),
        [FORGE__TB_A16] = forge__a16_bytes(m, N),
        [FORGE__TB_DLIN] = shared[FORGE__TL_LIN_QKV],
        [FORGE__TB_DQK] = lin ? 8 * N * c->lin_v_heads * c->lin_k_dim : 0,
        [FORGE__TB_CONV_STATE] = lin ? (uint64_t)L->p.max_batch * forge__conv_state_bytes(c) : 0,
        [FORGE__TB_DELTA] = lin ? 4ull * L->p.max_batch * c->lin_v_heads * forge__delta_work_floats(c, L->delta_chunk, (uint32_t)L->p.max_seq) : 0,
        [FORGE__TB_DPAIR] = 4 * N * KH, [FORGE__TB_DLOGITS] = 4 * N * (uint64_t)c->n_experts, [FORGE__TB_DS] = c->shared_ffn ? 4 * N : 0,
    };
    /* the tensor cores' scratch also holds the widest output gradient of the layers' products in
     * f16 (forge__linear_back_cm; the head's goes in groups of rows) */
    if (forge__uses_a16(m))
        sizes[FORGE__TB_A16] = FORGE__MAX(sizes[FORGE__TB_A16],
                                          forge__back_cm_bytes((uint32_t)N, (uint32_t)(FORGE__MAX(FORGE__MAX(sizes[FORGE__TB_DQKV], sizes[FORGE__TB_DGU]), 4 * N * H) / (4 * N)), 0, 1) +
                                              FORGE__BACK_CM_PART_BYTES);
    for (int i = 0; i < FORGE__TB_COUNT; i++) ok &= forge__pack_add(pack, a, sizes[i] ? sizes[i] : 16) >= 0;
    for (int i = 0; i < FORGE__TL_COUNT; i++) ok &= forge__pack_add(pack, a, shared[i] ? shared[i] : 16) >= 0;
    for (int l = L->first_layer; l < c->n_layers; l++) {
        forge__train_layer_sizes(m, L, l, N, ls);
        for (int i = 0; i < (L->ckpt ? 1 : FORGE__TL_COUNT); i++) ok &= forge__pack_add(pack, a, ls[i] ? ls[i] : 16) >= 0;
    }
    if (!ok) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    return forge__pack_plan(pack, a, &m->dev.caps, err);
}

/* The host-visible buffers: io (step params, optimizer params, tokens, labels, row weights,
 * MSE targets; each part aligned for binding) and readback (row losses, the squared norm). */
static uint64_t forge__train_io_offset(const forge_model *m, const forge__train_layout *L, int part) {
    uint64_t al = m->dev.caps.storage_align, N = L->max_rows, off = 0;
    uint64_t sizes[6] = {sizeof(forge__step_params), 32, 4 * N, 4 * N, 4 * N, 4 * N * L->targets_width};
    for (int i = 0; i < part; i++) off = forge__align_up(off + forge__align_up(sizes[i] ? sizes[i] : 16, 16), al);
    return off;
}
static uint64_t forge__train_readback_bytes(const forge__train_layout *L) { return 4ull * L->max_rows + 256; }

/* The device memory a trainer needs, and the model's own beside it. */
static forge_status forge__train_memory_check(forge_model *m, uint64_t need, forge__err *err) {
    return forge__memory_check(m, need, "the trainer", "lower max_batch or max_seq, use grad_checkpoint, or adapt fewer layers or targets", err);
}

FORGE_API forge_status forge_trainer_plan(forge_model *m, const forge_train_params *params, forge_memory_stats *plan) {
    if (!forge__model_ready(m) || !plan) return FORGE_ERR_INVALID_ARGUMENT;
    if (forge__model_check_sized(m, plan, "forge_memory_stats")) return FORGE_ERR_INVALID_ARGUMENT;
    if (!forge__model_has_weights(m, "forge_trainer_plan")) return FORGE_ERR_UNSUPPORTED;
    forge_train_params p;
    FORGE__COPY_PARAMS(p, params, forge_train_default_params);
    forge__arena a = {0};
    forge__pack pack = {0};
    forge__train_layout L;
    forge__err err;
    forge_status st = forge__train_layout_make(m, &p, &a, &L, &err);
    if (!st) st = forge__train_pack(m, &L, &pack, &a, &err);
    if (!st) {
        forge_memory_stats full = {.struct_size = sizeof full};
        full.device_planned_bytes = forge__pack_total(&pack) + forge__train_io_offset(m, &L, 6) + forge__train_readback_bytes(&L);
        full.host_arena_bytes = a.bytes;
        full.device_buffers = (uint64_t)pack.n_blocks + 2;
        FORGE__PUT(plan, full);
    } else {
        forge__model_fail(m, st, "%s", err.msg);
    }
    forge__arena_free(&a);
    return st;
}

/* Copies bytes between host memory and a device range through a staging buffer (to_device:
 * host -> device). Used at creation and by save, not per step. */
static forge_status forge__train_transfer(forge_trainer *tr, forge__range dev, void *host, uint64_t bytes, bool to_device) {
    forge__device *d = &tr->m->dev;
    forge__buffer stage;
    forge_status st = forge__buffer_create(d, bytes, d->caps.mem_readback, true, &tr->mem, &tr->m->mem_total, &stage, &tr->err);
    if (st) return st;
    if (to_device) memcpy(stage.mapped, host, (size_t)bytes);
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = tr->cmd_pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    VkCommandBuffer cb;
    if (d->vk.vkAllocateCommandBuffers(d->dev, &cai, &cb) != VK_SUCCESS) st = forge__fail(&tr->err, FORGE_ERR_DEVICE, "vkAllocateCommandBuffers failed");
    if (!st) {
        VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
        d->vk.vkBeginCommandBuffer(cb, &bi);
        VkBufferCopy region = {to_device ? 0 : dev.offset, to_device ? dev.offset : 0, bytes};
        d->vk.vkCmdCopyBuffer(cb, to_device ? stage.buf : dev.buf, to_device ? dev.buf : stage.buf, 1, &region);
        if (!to_device) {
            VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
                                  .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
            d->vk.vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
        }
        d->vk.vkEndCommandBuffer(cb);
        st = forge__submit_wait(d, cb, tr->fence, &tr->err);
        d->vk.vkFreeCommandBuffers(d->dev, tr->cmd_pool, 1, &cb);
    }
    if (!st && !to_device) {
        forge__readback_invalidate(d, &stage, 0, bytes);
        memcpy(host, stage.mapped, (size_t)bytes);
    }
    forge__buffer_destroy(d, &stage, &tr->mem, &tr->m->mem_total);
    return st;
}

/* Fills the device buffers with zeros (gradients and moments at creation). */
static forge_status forge__train_zero(forge_trainer *tr, const forge__range *ranges, int n) {
    return forge__zero_ranges(&tr->m->dev, tr->cmd_pool, tr->fence, ranges, n, &tr->err);
}

/* The adapters' starting values, written to the parameter segments: the adapter's, or PEFT's
 * initialisation (A uniform in +-1/sqrt(in), Kaiming-uniform with a = sqrt(5); B zero). */
static forge_status forge__train_init_params(forge_trainer *tr) {
    const forge__train_layout *L = &tr->L;
    uint64_t rng[4];
    forge__rng_seed(rng, L->p.seed);
    forge_status st = FORGE_OK;
    for (int s = 0; s < L->n_segs && !st; s++) {
        float *host = (float *)calloc((size_t)L->seg_count[s], sizeof(float));
        if (!host) return forge__fail(&tr->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        for (int i = 0; i < L->lora.n_layers * FORGE__T_COUNT; i++) {
            const forge__lora_pair *lp = &L->lora.pairs[i];
            if (!lp->rank || lp->seg != s) continue;
            uint64_t na = (uint64_t)lp->rank * lp->in, nb = (uint64_t)lp->out * lp->rank;
            if (L->from_adapter) {
                memcpy(host + lp->a_el, L->ah.pairs[i].a, 4 * na);
                memcpy(host + lp->b_el, L->ah.pairs[i].b, 4 * nb);
            } else {
                double bound = 1.0 / sqrt((double)lp->in);
                for (uint64_t k = 0; k < na; k++) host[lp->a_el + k] = (float)((2.0 * forge__rng_uniform(rng) - 1.0) * bound);
            }
        }
        st = forge__train_transfer(tr, tr->segs[s].p, host, 4 * L->seg_count[s], true);
        free(host);
    }
    return st;
}

/* ---- Recording a training step ---- */

/* The tensor cores' share of forge__linear_back: M rows of dx (+)= dy . W for one row-chunk c
 * of W (matmul_cm_back, W's format), on dy's columns for those rows rounded to f16 by a power of
 * two a row (act_f16_scaled) into a16, the rows' inverse scales after them. Where the product
 * has too few 128 x 128 tiles to fill a large GPU (the head's: a loss chunk's rows by the
 * hidden size) it is split along the reduction as far as a16 holds the partial sums, which
 * linear_reduce.comp then adds into dx. The caller has seen that a16 holds
 * forge__back_cm_bytes(M, c->rows, w->cols, 1) and is apart from dy and dx, that w->cols is a
 * multiple of 8, and has put a barrier before (a16 may still be read by an earlier product). */
static void forge__linear_back_cm(forge__rec *r, const forge__weight *w, const forge__wchunk *c, forge__range dy, uint32_t ldy, uint32_t y_col0,
                                  uint32_t M, forge__range dx, uint32_t ldc, uint32_t c_off, bool accumulate, forge__range a16, forge__range dummy) {
    uint32_t K = w->cols, N = c->rows, tiles = ((K + 127) / 128) * ((M + 127) / 128), splits = 1, k_split = 0;
    if (tiles < 256 && N >= 256) {
        splits = FORGE__MIN(FORGE__MIN(16u, (256 + tiles - 1) / tiles), N / 64);
        for (; splits > 1; splits--) {
            k_split = (uint32_t)forge__align_up((N + splits - 1) / splits, 64); /* whole k steps */
            if (forge__back_cm_bytes(M, N, K, (N + k_split - 1) / k_split) <= a16.size) break;
        }
        if (splits > 1) splits = (N + k_split - 1) / k_split;
    }
    forge__range inv = {a16.buf, a16.offset + forge__back_cm_scales_at(M, N), 4ull * M};
    forge__pc_act_f16 pa = {(uint32_t)forge__align_up(N, 8), 0, M, ldy, y_col0 + c->row0, N};
    forge__range ba[3] = {dy, a16, inv};
    uint32_t gx, gy;
    forge__grid(M, &gx, &gy);
    forge__dispatch(r, FORGE__OP_ACT_F16_SCALED, ba, &pa, gx, gy, 1);
    forge__barrier(r);
    bool mlx = w->fmt == FORGE__W_MLX;
    forge__range part = {a16.buf, a16.offset + forge__back_cm_part_at(M, N), 4ull * splits * M * K};
    forge__range b[6] = {a16, c->w, splits > 1 ? part : dx, inv, mlx ? c->scales : dummy, mlx ? c->biases : dummy};
    forge__pc_linear pc = {M, K, N, 0, ldc, c_off, accumulate ? FORGE__LINEAR_ACCUMULATE : 0, 0, 0, w->bits, w->group, w->qflags,
                           0, 0, 0, 0, 0, 0, 0, 0};
    forge__op op = (forge__op)(FORGE__OP_MATMUL_CM_BACK + w->fmt);
    if (splits == 1) {
        forge__dispatch(r, op, b, &pc, (K + 127) / 128, (M + 127) / 128, 1);
        return;
    }
    forge__pc_linear pp = pc;
    pp.flags = FORGE__LINEAR_SPLIT_K;
    pp.k_split = k_split;
    forge__dispatch(r, op, b, &pp, (K + 127) / 128, (M + 127) / 128, splits);
    forge__barrier(r);
    forge__pc_linear pr = {M, 0, K, 0, ldc, c_off, pc.flags, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}; /* (the reduce's N: dx's width) */
    forge__record_linear_reduce(r, part, dx, dummy, &pr, splits);
}

/* dx[M, ldc] (+)= dy . W (matmul_back.comp): dy holds W's outputs at columns y_col0 + row of
 * each row of ldy floats (y_col0 may also skip whole rows: it is a flat offset), dx W's inputs
 * at c_off + k (flat too). Chunks add up, a barrier between them. With `cm` (the caller's
 * choice: the tensor cores' scratch a16 is set, apart from dy and dx) the product runs on the
 * tensor cores (forge__linear_back_cm), in groups of rows (whole 128-row tiles) as many as a16
 * holds (the head's: a loss chunk of a vocabulary's columns); else, or where a chunk does not
 * fit, on the SIMT kernels. */
static void forge__linear_back_rec(forge__rec *r, bool cm, const forge__weight *w, forge__range dy, uint32_t ldy, uint32_t y_col0, uint32_t M,
                                   forge__range dx, uint32_t ldc, uint32_t c_off, bool accumulate, forge__range a16, forge__range dummy) {
    cm = cm && w->cols % 8 == 0;
    for (int i = 0; i < w->n_chunks; i++) {
        const forge__wchunk *c = &w->chunks[i];
        bool acc = accumulate || i > 0;
        uint32_t group = M;
        while (group > 128 && forge__back_cm_bytes(group, c->rows, w->cols, 1) > a16.size) group = (group - 1) / 128 * 128;
        if (cm && forge__back_cm_bytes(group, c->rows, w->cols, 1) <= a16.size) {
            for (uint32_t m0 = 0; m0 < M; m0 += group) {
                forge__barrier(r);
                forge__linear_back_cm(r, w, c, dy, ldy, y_col0 + m0 * ldy, FORGE__MIN(group, M - m0), dx, ldc, c_off + m0 * ldc, acc, a16, dummy);
            }
            continue;
        }
        bool mlx = w->fmt == FORGE__W_MLX;
        forge__range b[5] = {dy, c->w, dx, mlx ? c->scales : dummy, mlx ? c->biases : dummy};
        forge__pc_back pc = {M, w->cols, c->rows, y_col0 + c->row0, ldy, ldc, c_off, acc ? 1u : 0u, w->bits, w->group, w->qflags, 0, 0, 0, 1};
        if (i) forge__barrier(r);
        /* 128 x 128 tiles where there are enough of them, as in the forward products */
        bool big = (uint64_t)((w->cols + 127) / 128) * ((M + 127) / 128) >= FORGE__BIG_TILES_MIN;
        uint32_t tile = big ? 128 : 64;
        forge__dispatch(r, (forge__op)((big ? FORGE__OP_MATMUL_BACK_BIG : FORGE__OP_MATMUL_BACK) + w->fmt), b, &pc, (w->cols + tile - 1) / tile,
                        (M + tile - 1) / tile, 1);
    }
}
/* ... for a pass: on the tensor cores where it has their scratch (not exact) and more rows than
 * a matrix-vector kernel takes */
static void forge__linear_back(const forge__pass *p, const forge__weight *w, forge__range dy, uint32_t ldy, uint32_t y_col0, uint32_t M,
                               forge__range dx, uint32_t ldc, uint32_t c_off, bool accumulate) {
    forge__range a16 = p->a16;
    bool cm = a16.buf && p->m->back_cm && M > forge__matvec_max_m(p->m) && forge__apart(a16, dy) && forge__apart(a16, dx);
    forge__linear_back_rec(p->r, cm, w, dy, ldy, y_col0, M, dx, ldc, c_off, accumulate, a16, p->dummy);
}

/* dx (+)= the RMSNorm's input gradient for rows of x (block norm: rows of dim; heads > 0: the
 * per-head norms inside rows of row_stride at col0). dy and out may be the same range. */
static void forge__rmsnorm_back(const forge__pass *p, forge__range x, const forge__vec *w, forge__range dy, forge__range out, uint32_t rows,
                                uint32_t dim, uint32_t heads, uint32_t row_stride, uint32_t col0, bool accumulate) {
    forge__range b[4] = {x, w->r, dy, out};
    forge__pc_norm_back pc = {dim, accumulate ? 1u : 0u, (float)p->m->cfg.norm_eps, heads, row_stride, col0};
    uint32_t gx, gy;
    forge__grid(heads ? (uint64_t)rows * heads : rows, &gx, &gy);
    forge__dispatch(p->r, FORGE__OP_RMSNORM_BACK, b, &pc, gx, gy, 1);
}

/* The adapters' backward pass, after the forward pass kept u = dropout(x) A^T (acts.u):
 *   1. dB += scale dy^T u,  du = scale dy B
 *   2. dA += du^T dropout(x),  dx += dropout'(du A)
 * dy is the projection's output gradient: columns col0 + j * step of rows of ldy floats. */
static void forge__lora_back_b(const forge__pass *p, forge__range du, int l, forge__target t, forge__range dy, uint32_t ldy, uint32_t col0,
                               uint32_t step, forge__range u) {
    const forge__lora_pair *lp = forge__lora_at(p->lora, l, t);
    if (!lp) return;
    uint32_t uc = forge__u_col(p, t), ul = forge__u_ld(p), b0[2], rows[2], col[2];
    int runs = forge__lora_runs(&p->m->cfg, t, lp->out, b0, rows, col); /* (Qwen 3.5's q_proj: queries, then gates) */
    for (int k = 0; k < runs; k++) {
        uint32_t yc = col0 + col[k] * step, be = lp->b_el + b0[k] * lp->rank;
        forge__gemm(p, (forge__mview){dy, yc, step, ldy}, forge__rows(u, uc, ul), forge__rows(lp->gb, be, lp->rank), rows[k], lp->rank, p->n,
                    lp->scale, true, 0, 0, 0);
        if (k) forge__barrier(p->r); /* (du's rows add up) */
        forge__gemm(p, (forge__mview){dy, yc, ldy, step}, forge__rows(lp->b, be, lp->rank), forge__rows(du, uc, ul), p->n, lp->rank, rows[k],
                    lp->scale, k > 0, 0, 0, 0);
    }
}

static void forge__lora_back_a(const forge__pass *p, forge__range du, int l, forge__target t, forge__range x, forge__range dx, bool with_dx) {
    const forge__lora_pair *lp = forge__lora_at(p->lora, l, t);
    if (!lp) return;
    uint32_t uc = forge__u_col(p, t), ul = forge__u_ld(p);
    if (!with_dx) {
        forge__gemm(p, forge__cols(du, uc, ul), forge__rows(x, 0, lp->in), forge__rows(lp->ga, lp->a_el, lp->in), lp->rank, lp->in, p->n, 1.0f, true,
                    2, lp->in, forge__stream(l, t));
        return;
    }
    forge__gemm(p, forge__rows(du, uc, ul), forge__rows(lp->a, lp->a_el, lp->in), forge__rows(dx, 0, lp->in), p->n, lp->in, lp->rank, 1.0f, true,
                3, lp->in, forge__stream(l, t));
}

/* Both stages for the adapted targets of one group sharing an input x and an input gradient
 * dx; the dx contributions one at a time (they add into the same rows). */
static void forge__lora_back_group(forge_trainer *tr, const forge__pass *p, int l, const forge__target *ts, int n_t, forge__range x, forge__range u,
                                   forge__range dx, const forge__range *dy, const uint32_t *ldy, const uint32_t *col0, const uint32_t *step) {
    for (int i = 0; i < n_t; i++) forge__lora_back_b(p, tr->r[FORGE__TB_DU], l, ts[i], dy[i], ldy[i], col0[i], step[i], u);
    forge__barrier(p->r);
    for (int i = 0; i < n_t; i++) forge__lora_back_a(p, tr->r[FORGE__TB_DU], l, ts[i], x, dx, false);
    for (int i = 0; i < n_t; i++) {
        if (!forge__lora_at(p->lora, l, ts[i])) continue;
        forge__lora_back_a(p, tr->r[FORGE__TB_DU], l, ts[i], x, dx, true);
        forge__barrier(p->r);
    }
}

/* ... for targets whose outputs sit side by side in the rows of dy [n, ldy], target i's from
 * column col0[i] (q|k|v, the linear in-projection's row; one target: its whole rows). */
static void forge__lora_back_row(forge_trainer *tr, const forge__pass *p, int l, const forge__target *ts, int n_t, forge__range x, forge__range u,
                                 forge__range dx, forge__range dy, uint32_t ldy, const uint32_t *col0) {
    forge__range dys[FORGE__T_COUNT];
    uint32_t ldys[FORGE__T_COUNT], steps[FORGE__T_COUNT];
    bool any = false;
    for (int i = 0; i < n_t; i++) {
        dys[i] = dy, ldys[i] = ldy, steps[i] = 1;
        any |= forge__lora_at(p->lora, l, ts[i]) != NULL;
    }
    if (any) forge__lora_back_group(tr, p, l, ts, n_t, x, u, dx, dys, ldys, col0, steps);
}
static void forge__lora_back_one(forge_trainer *tr, const forge__pass *p, int l, forge__target t, forge__range x, forge__range u, forge__range dx,
                                 forge__range dy, uint32_t ldy) {
    const uint32_t col0 = 0;
    forge__lora_back_row(tr, p, l, &t, 1, x, u, dx, dy, ldy, &col0);
}

/* The attention block's backward pass: tr->r[DX] holds the gradient of x_mid; leaves dxn holding
 * the gradient of the q, k and v products' input, xn = norm(x_in) (recomputed into xn).
 * x_mid = x_in + [post-norm](o(gate * attn(rope(norm_qk(qkv(xn)))))), gate = sigmoid (Qwen 3.5) or 1 */
static void forge__record_attention_back(forge_trainer *tr, const forge__pass *p, int l, const forge__acts *a) {
    forge_model *m = p->m;
    forge__rec *r = p->r;
    const forge__config *c = &m->cfg;
    const forge__layer *ly = &m->layers[l];
    uint32_t n = p->n, H = (uint32_t)c->hidden, D = forge__hd(c, l), NH = (uint32_t)c->n_heads, NKV = forge__nkv(c, l);
    uint32_t QD = NH * D, KVD = NKV * D, QKVD = forge__qkv_dim(c, l), gx, gy;
    forge__range dx = tr->r[FORGE__TB_DX], dxn = tr->r[FORGE__TB_DXN], xn = tr->r[FORGE__TB_XN];
    forge__range dqkv = tr->r[FORGE__TB_DQKV], datt = tr->r[FORGE__TB_DATT];
    forge__range dout = dx; /* the gradient of o_proj's output */
    if (c->sandwich_norms) {
        forge__rmsnorm_back(p, a->o, &ly->post_attn_norm, dx, dxn, n, H, 0, 0, 0, false);
        forge__barrier(r);
        dout = dxn;
    }
    forge__linear_back(p, &ly->wo, dout, H, 0, n, datt, QD, 0, false);
    forge__barrier(r);
    forge__range o_in = c->attn_gate ? a->att_g : a->att; /* o_proj's input */
    forge__lora_back_one(tr, p, l, FORGE__T_O, o_in, a->u, datt, dout, H);
    if (c->attn_gate) { /* Qwen 3.5's output gate, att * sigmoid(gate): datt in place, the gates' gradient into dqkv's gate columns */
        forge__pc_act pg = {n * QD, FORGE__ACT_SIGMOID, FORGE__GU_APART_GATE, QD, QKVD, QD + 2 * KVD};
        forge__range bg[5] = {datt, a->att, datt, a->qkv, dqkv};
        forge__grid(((uint64_t)n * QD + 255) / 256, &gx, &gy);
        forge__dispatch(r, FORGE__OP_ACT_MUL_BACK, bg, &pg, gx, gy, 1);
        forge__barrier(r);
    }
    forge__pc_attn_back pb = {p->seq, NH, NKV, D, ly->sliding ? (uint32_t)c->sliding_window : 0, (float)c->attn_scale, (float)c->attn_softcap,
                              QKVD, QD, QD + KVD, p->seq * KVD, n, 0};
    forge__range bb[7] = {a->qkv, a->kc, a->vc, a->att, datt, a->lse, dqkv};
    forge__grid(((uint64_t)n * NH + 63) / 64, &gx, &gy);
    forge__dispatch(r, FORGE__OP_ATTN_BACK, bb, &pb, gx, gy, 1); /* delta */
    forge__rmsnorm(p, a->x_in, 0, &ly->attn_norm, xn, 0, n, H, 0);  /* the q, k and v products' input, again */
    forge__barrier(r);
    pb.mode = 1;
    forge__dispatch(r, FORGE__OP_ATTN_BACK, bb, &pb, (p->seq + 7) / 8, NH, p->batch);
    pb.mode = 2;
    forge__dispatch(r, FORGE__OP_ATTN_BACK, bb, &pb, (p->seq + 7) / 8, NKV, p->batch);
    forge__barrier(r);
    /* RoPE (Qwen 3.5's partial RoPE too: the dims it leaves alone are pairs of zero frequency, forge__rope_inv_freq) */
    const forge__vec *rope = ly->sliding ? &m->rope_sliding : &m->rope_full;
    forge__pc_rope_back prb = {n, NH, NKV, D, c->rope_adjacent_pairs, QKVD, QD, p->seq};
    forge__range brb[3] = {p->params, rope->r, dqkv};
    forge__grid(((uint64_t)n * (NH + NKV) * (D / 2) + 63) / 64, &gx, &gy);
    forge__dispatch(r, FORGE__OP_ROPE_BACK, brb, &prb, gx, gy, 1);
    forge__barrier(r);
    if (c->qk_norm) {
        forge__rmsnorm_back(p, a->qkv_raw, &ly->q_norm, dqkv, dqkv, n, D, NH, QKVD, 0, false);
        forge__rmsnorm_back(p, a->qkv_raw, &ly->k_norm, dqkv, dqkv, n, D, NKV, QKVD, QD, false);
        forge__barrier(r);
    }
    if (ly->fused_qkv) {
        forge__linear_back(p, &ly->wqkv, dqkv, QKVD, 0, n, dxn, H, 0, false);
    } else {
        forge__linear_back(p, &ly->wq, dqkv, QKVD, 0, n, dxn, H, 0, false);
        forge__barrier(r);
        forge__linear_back(p, &ly->wk, dqkv, QKVD, QD, n, dxn, H, 0, true);
        forge__barrier(r);
        forge__linear_back(p, &ly->wv, dqkv, QKVD, QD + KVD, n, dxn, H, 0, true);
    }
    forge__barrier(r);
    const forge__target ts[3] = {FORGE__T_Q, FORGE__T_K, FORGE__T_V};
    const uint32_t col0[3] = {0, QD, QD + KVD};
    forge__lora_back_row(tr, p, l, ts, 3, xn, a->u, dxn, dqkv, QKVD, col0);
}

/* Qwen 3.5's linear-attention block's backward pass, as forge__record_attention_back's:
 * x_mid = x_in + out_proj(delta_rule(silu(conv(q|k|v)), z, b, a)), q|k|v, z, b, a = in_proj(xn).
 * out_proj's input gradient, then delta_rule_back.comp (the gated norm, the rule, the gates:
 * dv, dz, db, da, and each value head's dq, dk), l2norm_back.comp (dq, dk of the conv's output),
 * conv1d_back.comp (of the in-projection's q|k|v), and the in-projection's. */
static void forge__record_linear_back(forge_trainer *tr, const forge__pass *p, int l, const forge__acts *a) {
    forge_model *m = p->m;
    forge__rec *r = p->r;
    const forge__config *c = &m->cfg;
    const forge__layer *ly = &m->layers[l];
    uint32_t n = p->n, H = (uint32_t)c->hidden, CD = forge__lin_conv_dim(c), VD = forge__lin_v_dim(c), NV = (uint32_t)c->lin_v_heads;
    uint32_t NK = (uint32_t)c->lin_k_heads, MIX = (uint32_t)forge__lin_mix_dim(c), gx, gy;
    forge__range dx = tr->r[FORGE__TB_DX], dxn = tr->r[FORGE__TB_DXN], xn = tr->r[FORGE__TB_XN];
    forge__range dmix = tr->r[FORGE__TB_DQKV], dlin_out = tr->r[FORGE__TB_DATT], dconv = tr->r[FORGE__TB_DLIN];
    forge__linear_back(p, &ly->wo, dx, H, 0, n, dlin_out, VD, 0, false);
    forge__barrier(r);
    forge__lora_back_one(tr, p, l, FORGE__T_LIN_OUT, a->lin_out, a->u, dlin_out, dx, H);
    forge__pc_delta pd = {n, NK, NV, (uint32_t)c->lin_k_dim, (uint32_t)c->lin_v_dim, p->seq, 0, MIX, CD, CD + VD, CD + VD + NV,
                          (float)c->norm_eps, c->lin_v_tiled ? 1u : 0u, 0, tr->L.delta_chunk};
    forge__range bd[10] = {a->lin_qkv, a->lin_mix, ly->lin_neg_a.r, ly->dt_bias.r, ly->lin_norm.r, dlin_out, dconv, dmix, tr->r[FORGE__TB_DQK],
                           tr->r[FORGE__TB_DELTA]};
    forge__dispatch(r, FORGE__OP_DELTA_RULE_BACK, bd, &pd, NV, p->batch, 1);
    forge__rmsnorm(p, a->x_in, 0, &ly->attn_norm, xn, 0, n, H, 0); /* the in-projection's input, again */
    forge__barrier(r);
    forge__range bl[3] = {a->lin_qkv, tr->r[FORGE__TB_DQK], dconv};
    forge__grid((uint64_t)n * NK * 2, &gx, &gy);
    forge__dispatch(r, FORGE__OP_L2NORM_BACK, bl, &pd, gx, gy, 1);
    forge__barrier(r);
    forge__pc_conv pc = {n, CD, (uint32_t)c->lin_conv, MIX, p->seq, 0};
    forge__range bc[4] = {a->lin_mix, ly->conv_w.r, dconv, dmix};
    forge__grid(((uint64_t)n * CD + 63) / 64, &gx, &gy);
    forge__dispatch(r, FORGE__OP_CONV1D_BACK, bc, &pc, gx, gy, 1);
    forge__barrier(r);
    const uint32_t col0[4] = {0, CD, CD + VD, CD + VD + NV}; /* in_proj_qkv, _z, _b, _a */
    if (ly->fused_lin) {
        forge__linear_back(p, &ly->lin_in, dmix, MIX, 0, n, dxn, H, 0, false);
    } else {
        const forge__weight *ws[4] = {&ly->lin_qkv, &ly->lin_z, &ly->lin_b, &ly->lin_a};
        for (int i = 0; i < 4; i++) {
            if (i) forge__barrier(r);
            forge__linear_back(p, ws[i], dmix, MIX, col0[i], n, dxn, H, 0, i > 0);
        }
    }
    forge__barrier(r);
    const forge__target ts[4] = {FORGE__T_LIN_QKV, FORGE__T_LIN_Z, FORGE__T_LIN_B, FORGE__T_LIN_A};
    forge__lora_back_row(tr, p, l, ts, 4, xn, a->u, dxn, dmix, MIX, col0);
}

/* The routed experts' backward pass (frozen experts, softmax router): dd [n, H] holds the gradient
 * of the layer's expert output out_t = sum_j w_j y_{tK+j}, y_p = down_e(act(gate_e xn) * up_e xn)
 * for pair p's expert e, w the route's weights; writes dxn [n, H], the gradient of xn through the
 * experts and their router:
 *   the router (moe_route_back.comp): dw_j = dd_t . y_p, through the renormalized top-k softmax into
 *     dlogits [n, E], then dxn += dlogits . W_router;
 *   the experts (matmul_back_moe, grouped by moe_group.comp's table from the forward pass):
 *     dh_p = (w_p dd_t) . W_down(e) [pairs, I], dgu_p = act_mul_back(dh_p, gu_p) [pairs, 2 I],
 *     dxn_p = dgu_p . W_gate_up(e) [pairs, H], summed per token (moe_combine.comp, weights 1). */
static void forge__record_experts_back(forge_trainer *tr, const forge__pass *p, int l, const forge__acts *a, forge__range dd) {
    forge_model *m = p->m;
    forge__rec *r = p->r;
    const forge__config *c = &m->cfg;
    const forge__layer *ly = &m->layers[l];
    uint32_t n = p->n, H = (uint32_t)c->hidden, K = (uint32_t)c->n_experts_used, I = (uint32_t)c->moe_ffn, E = (uint32_t)c->n_experts, gx, gy;
    uint32_t pairs = n * K, order_off = forge__moe_order_off(E, pairs), tiles = (uint32_t)forge__moe_max_tiles(E, pairs);
    forge__range dxn = tr->r[FORGE__TB_DXN], dh = tr->r[FORGE__TB_DH], dgu = tr->r[FORGE__TB_DGU], dpair = tr->r[FORGE__TB_DPAIR];
    forge__range dlogits = tr->r[FORGE__TB_DLOGITS];
    forge__pc_moe_route_back prb = {E, K, c->moe_norm_topk ? 1u : 0u, n, H};
    forge__range brb[5] = {a->router, a->route, dd, a->moe_y, dlogits};
    forge__grid(n, &gx, &gy);
    forge__dispatch(r, FORGE__OP_MOE_ROUTE_BACK, brb, &prb, gx, gy, 1);
    /* the experts' down, then gate|up, each chunk its own experts' pairs (no chunk writes another's rows) */
    const forge__weight *dn = &ly->exp_down, *gu = &ly->exp_gate_up;
    for (int i = 0; i < dn->n_chunks; i++) {
        const forge__wchunk *ch = &dn->chunks[i];
        bool mlx = dn->fmt == FORGE__W_MLX;
        forge__range b[7] = {dd, ch->w, dh, mlx ? ch->scales : p->dummy, mlx ? ch->biases : p->dummy, a->moe, a->route};
        forge__pc_back pc = {pairs, I, H, 0, H, I, 0, 2, dn->bits, dn->group, dn->qflags, ch->row0 / H, ch->rows / H, order_off, K};
        forge__dispatch(r, (forge__op)(FORGE__OP_MATMUL_BACK_MOE + dn->fmt), b, &pc, (I + 63) / 64, tiles, 1);
    }
    forge__barrier(r);
    forge__pc_act pact = {pairs * I, (uint32_t)c->act, FORGE__GU_PAIRS, I, 0, 0};
    forge__range bact[5] = {dh, a->exp_gu, dgu, p->dummy, p->dummy};
    forge__grid(((uint64_t)pairs * I + 255) / 256, &gx, &gy);
    forge__dispatch(r, FORGE__OP_ACT_MUL_BACK, bact, &pact, gx, gy, 1);
    forge__barrier(r);
    for (int i = 0; i < gu->n_chunks; i++) {
        const forge__wchunk *ch = &gu->chunks[i];
        bool mlx = gu->fmt == FORGE__W_MLX;
        forge__range b[7] = {dgu, ch->w, dpair, mlx ? ch->scales : p->dummy, mlx ? ch->biases : p->dummy, a->moe, a->route};
        forge__pc_back pc = {pairs, H, 2 * I, 0, 2 * I, H, 0, 0, gu->bits, gu->group, gu->qflags, ch->row0 / (2 * I), ch->rows / (2 * I), order_off, 1};
        forge__dispatch(r, (forge__op)(FORGE__OP_MATMUL_BACK_MOE + gu->fmt), b, &pc, (H + 63) / 64, tiles, 1);
    }
    forge__barrier(r);
    forge__pc_moe_combine pcm = {n, H, K, 2};
    forge__range bc[3] = {a->route, dpair, dxn};
    forge__grid(n, &gx, &gy);
    forge__dispatch(r, FORGE__OP_MOE_COMBINE, bc, &pcm, (H + 255) / 256, gx, gy);
    forge__barrier(r);
    forge__linear_back(p, &ly->router, dlogits, E, 0, n, dxn, H, 0, true);
    forge__barrier(r);
}

/* One layer's backward pass: tr->r[DX] holds the gradient of the layer's output (the residual
 * stream after it) and leaves holding the gradient of its input. `a` holds the layer's forward
 * activations (kept, or just recomputed). */
static void forge__record_layer_back(forge_trainer *tr, const forge__pass *p, int l, const forge__acts *a) {
    forge_model *m = p->m;
    forge__rec *r = p->r;
    const forge__config *c = &m->cfg;
    const forge__layer *ly = &m->layers[l];
    uint32_t n = p->n, H = (uint32_t)c->hidden, F = (uint32_t)c->layer_ffn[l], gx, gy;
    forge__range dx = tr->r[FORGE__TB_DX], dxn = tr->r[FORGE__TB_DXN], xn = tr->r[FORGE__TB_XN];
    forge__range dh = tr->r[FORGE__TB_DH], dgu = tr->r[FORGE__TB_DGU];

    /* ---- the MLP: x_out = x_mid + [post-norm](down(act(gate xn2) * up xn2)), xn2 = norm(x_mid);
     * a mixture-of-experts layer adds its experts' output (Qwen 3 MoE's sparse layers: theirs alone),
     * and Qwen 3.5-MoE's dense MLP is the shared expert, its middle times sigmoid(xn2 . shared_gate) */
    forge__range dd = dx; /* the gradient of down's output */
    if (c->sandwich_norms) {
        forge__rmsnorm_back(p, a->d, &ly->post_ffn_norm, dx, dxn, n, H, 0, 0, 0, false);
        forge__barrier(r);
        dd = dxn;
    }
    bool experts = c->layer_moe[l] != 0, shared = experts && ly->dense_mlp;
    bool pairs = ly->fused_gate_up;
    if (experts) forge__record_experts_back(tr, p, l, a, dd); /* dxn: the experts' share */
    if (ly->dense_mlp) {
        forge__linear_back(p, &ly->down, dd, H, 0, n, dh, F, 0, false);
        forge__rmsnorm(p, a->x_mid, 0, &ly->ffn_norm, xn, 0, n, H, 0); /* the gate and up products' input, again */
        forge__barrier(r);
        forge__lora_back_one(tr, p, l, FORGE__T_DOWN, a->h, a->u, dh, dd, H);
        forge__barrier(r);
        if (shared) { /* the gate's gradient, ds = (1 - sigmoid(s)) dh . h (moe_route_back.comp) */
            forge__pc_moe_route_back pds = {1, 1, 4, n, F};
            forge__range bds[5] = {a->shared_s, p->dummy, dh, a->h, tr->r[FORGE__TB_DS]};
            forge__grid(n, &gx, &gy);
            forge__dispatch(r, FORGE__OP_MOE_ROUTE_BACK, bds, &pds, gx, gy, 1);
        }
        forge__pc_act pact = {n * F, (uint32_t)c->act | (shared ? FORGE__ACT_ROW_SIGMOID : 0), pairs ? FORGE__GU_PAIRS : FORGE__GU_HALVES, F, 1, 0};
        forge__range bact[5] = {dh, a->gu, dgu, shared ? a->shared_s : p->dummy, p->dummy};
        forge__grid(((uint64_t)n * F + 255) / 256, &gx, &gy);
        forge__dispatch(r, FORGE__OP_ACT_MUL_BACK, bact, &pact, gx, gy, 1);
        forge__barrier(r);
        if (pairs) {
            forge__linear_back(p, &ly->gate_up, dgu, 2 * F, 0, n, dxn, H, 0, experts);
        } else {
            forge__linear_back(p, &ly->gate, dgu, 2 * F, 0, n, dxn, H, 0, experts);
            forge__barrier(r);
            forge__linear_back(p, &ly->up, dgu, 2 * F, F, n, dxn, H, 0, true);
        }
        if (shared) {
            forge__barrier(r);
            forge__linear_back(p, &ly->shared_gate, tr->r[FORGE__TB_DS], 1, 0, n, dxn, H, 0, true);
        }
    }
    forge__barrier(r);
    if (ly->dense_mlp && forge__lora_any(p, l, FORGE__T_GU)) {
        forge__target ts[2] = {FORGE__T_GATE, FORGE__T_UP};
        forge__range dys[2] = {dgu, dgu};
        uint32_t ldy[2] = {2 * F, 2 * F}, col0[2] = {0, pairs ? 1 : F}, step[2] = {pairs ? 2u : 1u, pairs ? 2u : 1u};
        forge__lora_back_group(tr, p, l, ts, 2, xn, a->u, dxn, dys, ldy, col0, step);
    }
    forge__rmsnorm_back(p, a->x_mid, &ly->ffn_norm, dxn, dx, n, H, 0, 0, 0, true);
    forge__barrier(r);

    /* ---- the mixer (attention, or Qwen 3.5's linear attention), then the input norm shared by both */
    if (ly->linear) forge__record_linear_back(tr, p, l, a);
    else forge__record_attention_back(tr, p, l, a);
    if (l > tr->L.first_layer) { /* the layer below needs its output's gradient; the lowest adapted layer's input needs none */
        forge__rmsnorm_back(p, a->x_in, &ly->attn_norm, dxn, dx, n, H, 0, 0, 0, true);
        forge__barrier(r);
    }
}

/* The loss over the final hidden states xf [n, H], chunk by chunk of rows: logits (the head,
 * soft-capped), the loss kernel (per-row losses; with `grad` the gradient over the logits),
 * and the gradient back through the head into tr->r[DXN]. MSE on hidden states needs no head:
 * its gradient is written over xf, which is returned. */
static forge__range forge__record_loss(forge_trainer *tr, const forge__pass *p, bool grad) {
    forge_model *m = p->m;
    const forge__config *c = &m->cfg;
    forge__rec *r = p->r;
    uint32_t n = p->n, H = (uint32_t)c->hidden, V = (uint32_t)c->n_vocab;
    forge__range xf = tr->r[FORGE__TB_XF], logits = tr->r[FORGE__TB_LOGITS], dxf = tr->r[FORGE__TB_DXN];
    bool ce = tr->L.p.loss == FORGE_LOSS_CROSS_ENTROPY;
    forge__range loss_rows = tr->r[FORGE__TB_LOSS];
    uint32_t gx, gy;
    if (tr->L.p.loss == FORGE_LOSS_MSE_HIDDEN) {
        forge__pc_loss pl = {H, 0, n, 1, grad ? 1u : 0u, 0};
        forge__range b[4] = {xf, tr->targets_r, tr->weights_r, loss_rows};
        forge__grid(n, &gx, &gy);
        forge__dispatch(r, FORGE__OP_LOSS, b, &pl, gx, gy, 1);
        forge__barrier(r);
        return xf;
    }
    const forge__weight *head = c->tied ? &m->tok_embd : &m->output;
    uint32_t head_flags = c->final_softcap > 0 ? FORGE__LINEAR_SOFTCAP : 0;
    for (uint32_t row0 = 0; row0 < n; row0 += tr->L.loss_rows) {
        uint32_t rows = FORGE__MIN(tr->L.loss_rows, n - row0);
        forge__linear(p, head, xf, row0, rows, logits, V, 0, NULL, NULL, head_flags, (float)c->final_softcap);
        forge__barrier(r);
        forge__pc_loss pl = {V, row0, rows, ce ? 0u : 1u, grad ? 1u : 0u, (float)c->final_softcap};
        forge__range b[4] = {logits, ce ? tr->labels_r : tr->targets_r, tr->weights_r, loss_rows};
        forge__grid(rows, &gx, &gy);
        forge__dispatch(r, FORGE__OP_LOSS, b, &pl, gx, gy, 1);
        forge__barrier(r);
        if (grad) {
            forge__linear_back(p, head, logits, V, 0, rows, dxf, H, row0 * H, false);
            forge__barrier(r);
        }
    }
    return dxf;
}

typedef struct forge__train_args {
    forge_trainer *tr;
    uint32_t batch, seq;
    bool step;                     /* forward, loss, backward; else forward and loss (evaluation) */
} forge__train_args;

static void forge__record_train_fn(void *ctx, forge__rec *r) {
    forge__train_args *ta = (forge__train_args *)ctx;
    forge_trainer *tr = ta->tr;
    forge_model *m = tr->m;
    const forge__config *c = &m->cfg;
    uint32_t n = ta->batch * ta->seq, H = (uint32_t)c->hidden;
    forge__pass p = {m, r, tr->r[FORGE__TB_DUMMY], tr->params_r, &tr->L.lora, n, ta->seq, ta->batch, false, true, ta->step,
                     tr->r[FORGE__TB_GEMM_PART], 0, {0}, {0}, {0}, {0}, false, {0}, {0}, {0}, {0}};
    if (forge__uses_a16(m)) p.a16 = tr->r[FORGE__TB_A16];
    forge__range x = tr->r[FORGE__TB_X];
    forge__record_embed(&p, tr->tokens_r, x);
    forge__barrier(r);
    for (int l = 0; l < c->n_layers; l++) forge__record_layer(&p, l, &tr->acts[l]);
    forge__rmsnorm(&p, x, 0, &m->output_norm, tr->r[FORGE__TB_XF], 0, n, H, 0);
    forge__barrier(r);
    forge__range dxf = forge__record_loss(tr, &p, ta->step);
    if (ta->step) {
        forge__rmsnorm_back(&p, x, &m->output_norm, dxf, tr->r[FORGE__TB_DX], n, H, 0, 0, 0, false);
        forge__barrier(r);
        for (int l = c->n_layers - 1; l >= tr->L.first_layer; l--) {
            forge__acts a = tr->acts[l];
            if (tr->L.ckpt) { /* recompute the layer from its kept input */
                forge__copy(r, a.x_in, x, 4ull * n * H);
                forge__barrier(r);
                a.x_in = (forge__range){0};
                forge__record_layer(&p, l, &a);
                a.x_in = tr->acts[l].x_in;
            }
            forge__record_layer_back(tr, &p, l, &a);
        }
    }
    forge__barrier(r);
    forge__copy(r, tr->r[FORGE__TB_LOSS], (forge__range){tr->readback.buf, 0, tr->readback.size}, 4ull * n);
    forge__host_barrier(r);
}

static void forge__record_opt_fn(void *ctx, forge__rec *r) {
    forge_trainer *tr = (forge_trainer *)ctx;
    const forge__train_layout *L = &tr->L;
    forge__range norm = tr->r[FORGE__TB_NORM];
    uint32_t gx, gy, part0 = 0;
    for (int s = 0; s < L->n_segs; s++) {
        const forge__param_seg *sg = &tr->segs[s];
        uint32_t groups = (uint32_t)((sg->count + FORGE__ADAMW_PER_WG - 1) / FORGE__ADAMW_PER_WG);
        forge__pc_adamw pc = {(uint32_t)sg->count, 0, part0, 0};
        forge__range b[6] = {sg->p, sg->g, sg->m1, sg->m2, tr->opt_r, norm};
        forge__grid(groups, &gx, &gy);
        forge__dispatch(r, FORGE__OP_ADAMW, b, &pc, gx, gy, 1);
        part0 += groups;
    }
    forge__barrier(r);
    forge__pc_adamw pt = {0, 1, 0, L->n_parts};
    forge__range bt[6] = {tr->segs[0].p, tr->segs[0].g, tr->segs[0].m1, tr->segs[0].m2, tr->opt_r, norm};
    forge__dispatch(r, FORGE__OP_ADAMW, bt, &pt, 1, 1, 1);
    forge__barrier(r);
    for (int s = 0; s < L->n_segs; s++) {
        const forge__param_seg *sg = &tr->segs[s];
        forge__pc_adamw pc = {(uint32_t)sg->count, 2, 0, 0};
        forge__range b[6] = {sg->p, sg->g, sg->m1, sg->m2, tr->opt_r, norm};
        forge__grid((sg->count + 255) / 256, &gx, &gy);
        forge__dispatch(r, FORGE__OP_ADAMW, b, &pc, gx, gy, 1);
    }
    forge__barrier(r);
    forge__copy(r, (forge__range){norm.buf, norm.offset, 4}, (forge__range){tr->readback.buf, tr->rb_norm_offset, 4}, 4);
    forge__host_barrier(r);
}

/* ---- The public calls ---- */

static void forge__trainer_destroy(forge_trainer *tr) {
    if (!tr) return;
    forge_model *m = tr->m;
    forge__device *d = &m->dev;
    if (d->dev) d->vk.vkDeviceWaitIdle(d->dev);
    for (int i = 0; i < FORGE__TRAIN_RECORDINGS; i++) forge__recording_free(d, tr->cmd_pool, &tr->rec[i]);
    forge__recording_free(d, tr->cmd_pool, &tr->opt_rec);
    if (tr->cmd_pool) d->vk.vkDestroyCommandPool(d->dev, tr->cmd_pool, NULL);
    if (tr->fence) d->vk.vkDestroyFence(d->dev, tr->fence, NULL);
    for (int b = 0; b < tr->n_blocks; b++) forge__buffer_destroy(d, &tr->blocks[b], &tr->mem, &m->mem_total);
    forge__buffer_destroy(d, &tr->io, &tr->mem, &m->mem_total);
    forge__buffer_destroy(d, &tr->readback, &tr->mem, &m->mem_total);
    forge__arena_free(&tr->arena);
    free(tr);
}

/* Allocates the planned buffers and binds every range: the segments, the working buffers,
 * the shared layer set and each adapted layer's kept activations (forge__train_pack's order). */
static forge_status forge__trainer_init(forge_trainer *tr) {
    forge_model *m = tr->m;
    forge__device *d = &m->dev;
    const forge__config *c = &m->cfg;
    forge__train_layout *L = &tr->L;
    forge_status st;
    if ((st = forge__train_pack(m, L, &tr->pack, &tr->arena, &tr->err))) return st;
    uint64_t io_bytes = forge__train_io_offset(m, L, 6), rb_bytes = forge__train_readback_bytes(L);
    tr->mem.planned = forge__pack_total(&tr->pack) + io_bytes + rb_bytes;
    if ((st = forge__train_memory_check(m, tr->mem.planned, &tr->err))) return st;
    tr->n_blocks = tr->pack.n_blocks;
    tr->blocks = (forge__buffer *)forge__arena_alloc(&tr->arena, sizeof *tr->blocks * (size_t)(tr->n_blocks + 1), 16);
    tr->segs = (forge__param_seg *)forge__arena_alloc(&tr->arena, sizeof *tr->segs * (size_t)L->n_segs, 16);
    tr->acts = (forge__acts *)forge__arena_alloc(&tr->arena, sizeof *tr->acts * (size_t)c->n_layers, 16);
    if (!tr->blocks || !tr->segs || !tr->acts) return forge__fail(&tr->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int b = 0; b < tr->n_blocks; b++)
        if ((st = forge__buffer_create(d, tr->pack.block_sizes[b], d->caps.mem_device, false, &tr->mem, &m->mem_total, &tr->blocks[b], &tr->err)))
            return forge__wrap(&tr->err, st, "allocating trainer block %d of %d", b + 1, tr->n_blocks);
    int it = 0;
#define FORGE__NEXT() ((forge__range){tr->blocks[tr->pack.items[it].block].buf, tr->pack.items[it].offset, tr->pack.items[it].size})
    for (int s = 0; s < L->n_segs; s++) {
        forge__param_seg *sg = &tr->segs[s];
        sg->count = L->seg_count[s];
        sg->p = FORGE__NEXT(); it++;
        sg->g = FORGE__NEXT(); it++;
        sg->m1 = FORGE__NEXT(); it++;
        sg->m2 = FORGE__NEXT(); it++;
    }
    for (int i = 0; i < FORGE__TB_COUNT; i++, it++) tr->r[i] = FORGE__NEXT();
    forge__range shared[FORGE__TL_COUNT];
    for (int i = 0; i < FORGE__TL_COUNT; i++, it++) shared[i] = FORGE__NEXT();
    for (int l = 0; l < c->n_layers; l++) {
        forge__range own[FORGE__TL_COUNT];
        memcpy(own, shared, sizeof own);
        bool adapted = l >= L->first_layer;
        if (adapted)
            for (int i = 0; i < (L->ckpt ? 1 : FORGE__TL_COUNT); i++, it++) own[i] = FORGE__NEXT();
        bool lin = c->layer_linear[l];
        tr->acts[l] = (forge__acts){
            .x = tr->r[FORGE__TB_X], .xn = tr->r[FORGE__TB_XN], .qkv = own[FORGE__TL_QKV], .att = own[FORGE__TL_ATT],
            .gu = own[FORGE__TL_GU], .h = own[FORGE__TL_H], .kc = own[FORGE__TL_K], .vc = own[FORGE__TL_V], .slots = L->max_rows,
            .attn_part = tr->r[FORGE__TB_DUMMY], .u = own[FORGE__TL_U], .o = own[FORGE__TL_O], .d = own[FORGE__TL_D],
            .lin_mix = own[FORGE__TL_LIN_MIX], .lin_qkv = own[FORGE__TL_LIN_QKV], .lin_out = own[FORGE__TL_LIN_OUT],
            /* what only the backward pass reads: not for the layers below the adapters */
            .x_in = adapted ? own[FORGE__TL_X_IN] : (forge__range){0}, .x_mid = adapted ? own[FORGE__TL_X_MID] : (forge__range){0},
            .qkv_raw = adapted && c->qk_norm ? own[FORGE__TL_QKV_RAW] : (forge__range){0},
            .lse = adapted ? own[FORGE__TL_LSE] : (forge__range){0},
            .att_g = adapted && c->attn_gate ? own[FORGE__TL_ATT_G] : (forge__range){0},
        };
        if (c->layer_moe[l]) { /* the route, the experts' rows and outputs: kept where the layer is adapted (the backward pass reads them) */
            forge__acts *a = &tr->acts[l];
            a->router = own[FORGE__TL_ROUTER];
            a->route = own[FORGE__TL_ROUTE];
            a->moe = own[FORGE__TL_MOE];
            a->moe_y = own[FORGE__TL_MOE_Y];
            a->exp_gu = own[FORGE__TL_EXP_GU];
            a->exp_h = own[FORGE__TL_EXP_H];
            a->shared_s = own[FORGE__TL_SHARED_S];
        }
        if (lin) { /* the recurrent states, one place per sequence, written by the forward pass and never read */
            tr->acts[l].kc = tr->r[FORGE__TB_CONV_STATE];
            tr->acts[l].vc = tr->r[FORGE__TB_DELTA];
        }
    }
#undef FORGE__NEXT
    for (int i = 0; i < c->n_layers * FORGE__T_COUNT; i++) {
        forge__lora_pair *lp = &L->lora.pairs[i];
        if (!lp->rank) continue;
        lp->a = lp->b = tr->segs[lp->seg].p;
        lp->ga = lp->gb = tr->segs[lp->seg].g;
    }
    if ((st = forge__buffer_create(d, io_bytes, d->caps.mem_upload, true, &tr->mem, &m->mem_total, &tr->io, &tr->err))) return st;
    if ((st = forge__buffer_create(d, rb_bytes, d->caps.mem_readback, true, &tr->mem, &m->mem_total, &tr->readback, &tr->err))) return st;
    uint64_t N = L->max_rows;
    tr->params_r = (forge__range){tr->io.buf, forge__train_io_offset(m, L, 0), sizeof(forge__step_params)};
    tr->opt_r = (forge__range){tr->io.buf, forge__train_io_offset(m, L, 1), 32};
    tr->tokens_r = (forge__range){tr->io.buf, forge__train_io_offset(m, L, 2), 4 * N};
    tr->labels_r = (forge__range){tr->io.buf, forge__train_io_offset(m, L, 3), 4 * N};
    tr->weights_r = (forge__range){tr->io.buf, forge__train_io_offset(m, L, 4), 4 * N};
    tr->targets_r = L->targets_width ? (forge__range){tr->io.buf, forge__train_io_offset(m, L, 5), 4 * N * L->targets_width} : tr->r[FORGE__TB_DUMMY];
    tr->rb_norm_offset = 4 * N;
    VkCommandPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                   .queueFamilyIndex = d->caps.queue_family};
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if (d->vk.vkCreateCommandPool(d->dev, &pci, NULL, &tr->cmd_pool) != VK_SUCCESS || d->vk.vkCreateFence(d->dev, &fci, NULL, &tr->fence) != VK_SUCCESS)
        return forge__fail(&tr->err, FORGE_ERR_DEVICE, "creating the trainer's command pool or fence failed");
    forge__range zero[192];
    int nz = 0;
    for (int s = 0; s < L->n_segs && nz + 3 <= (int)FORGE__ARRAY_LEN(zero); s++) {
        zero[nz++] = tr->segs[s].g;
        zero[nz++] = tr->segs[s].m1;
        zero[nz++] = tr->segs[s].m2;
    }
    if ((st = forge__train_zero(tr, zero, nz))) return st;
    if ((st = forge__train_init_params(tr))) return st;
    return forge__record(m, tr->cmd_pool, tr->profile, forge__record_opt_fn, tr, &tr->opt_rec, NULL, &tr->err);
}

FORGE_API forge_status forge_trainer_create(forge_model *m, const forge_train_params *params, forge_trainer **out) {
    if (!out) return FORGE_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (!forge__model_ready(m)) return FORGE_ERR_INVALID_ARGUMENT;
    if (!forge__model_has_weights(m, "forge_trainer_create")) return FORGE_ERR_UNSUPPORTED;
    if (m->cfg.bidirectional || m->cfg.n_labels || m->cfg.no_head) /* the trainer's loss is the causal LM's */
        return forge__model_fail(m, FORGE_ERR_UNSUPPORTED, "forge_trainer_create: the model has %s; forge trains causal language models",
                                 m->cfg.bidirectional ? "bidirectional attention" : m->cfg.no_head ? "no LM head" : "a sequence classifier's head");
    forge_train_params p;
    FORGE__COPY_PARAMS(p, params, forge_train_default_params);
    forge_trainer *tr = (forge_trainer *)calloc(1, sizeof *tr);
    if (!tr) return forge__model_fail(m, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    tr->m = m;
    tr->profile = p.profile && m->dev.caps.timestamps;
    /* the strings outlive the caller's */
    p.targets = p.targets ? forge__arena_strdup(&tr->arena, p.targets) : NULL;
    p.adapter_path = p.adapter_path ? forge__arena_strdup(&tr->arena, p.adapter_path) : NULL;
    forge_status st = forge__train_layout_make(m, &p, &tr->arena, &tr->L, &tr->err);
    if (!st) st = forge__trainer_init(tr);
    if (st) {
        forge__model_fail(m, st, "creating a trainer: %s", tr->err.msg);
        forge__trainer_destroy(tr);
        return st;
    }
    forge__log(&m->log, FORGE_LOG_INFO, "trainer: %llu LoRA parameters, batch %d x %d, %s, %llu device bytes",
               (unsigned long long)tr->L.n_params, tr->L.p.max_batch, tr->L.p.max_seq, tr->L.ckpt ? "gradient checkpointing" : "activations kept",
               (unsigned long long)tr->mem.in_use);
    *out = tr;
    return FORGE_OK;
}

FORGE_API void forge_trainer_free(forge_trainer *tr) { forge__trainer_destroy(tr); }
FORGE_API const char *forge_trainer_errmsg(const forge_trainer *tr) { return tr ? tr->err.msg : "no trainer"; }

/* Checks a batch and writes it to the io buffer: tokens (padding -> 0), the shifted label of
 * every row (-1: not counted) and its weight. Returns the padded length, the counted targets
 * and, for the loss's mean, the divisor. */
static forge_status forge__train_fill(forge_trainer *tr, const forge_train_batch *b, uint32_t *seq, int64_t *counted) {
    const forge__train_layout *L = &tr->L;
    const int V = tr->m->cfg.n_vocab;
    if (!b || !b->tokens || b->n_seqs <= 0 || b->seq_len <= 0)
        return forge__fail(&tr->err, FORGE_ERR_INVALID_ARGUMENT, "a batch needs n_seqs > 0, seq_len > 0 and tokens");
    if (b->n_seqs > L->p.max_batch)
        return forge__fail(&tr->err, FORGE_ERR_LIMIT, "the batch has %d sequences; the trainer was planned for max_batch %d", b->n_seqs, L->p.max_batch);
    bool mse = L->p.loss != FORGE_LOSS_CROSS_ENTROPY;
    if (mse && !b->targets) return forge__fail(&tr->err, FORGE_ERR_INVALID_ARGUMENT, "an MSE loss needs batch targets");
    int longest = 0;
    for (int i = 0; i < b->n_seqs; i++) {
        int len = b->lengths ? b->lengths[i] : b->seq_len;
        if (len < 0 || len > b->seq_len)
            return forge__fail(&tr->err, FORGE_ERR_INVALID_ARGUMENT, "sequence %d has length %d (seq_len %d)", i, len, b->seq_len);
        longest = FORGE__MAX(longest, len);
    }
    if (longest > L->p.max_seq)
        return forge__fail(&tr->err, FORGE_ERR_LIMIT, "a sequence of %d tokens: the trainer was planned for max_seq %d", longest, L->p.max_seq);
    if (longest < 1) return forge__fail(&tr->err, FORGE_ERR_INVALID_ARGUMENT, "every sequence of the batch is empty");
    uint32_t T = (uint32_t)FORGE__MIN(forge__align_up((uint64_t)longest, FORGE__TRAIN_PAD), (uint64_t)L->p.max_seq), B = (uint32_t)b->n_seqs;
    uint8_t *io = (uint8_t *)tr->io.mapped;
    uint32_t *tok = (uint32_t *)(io + tr->tokens_r.offset);
    int32_t *lab = (int32_t *)(io + tr->labels_r.offset);
    float *w = (float *)(io + tr->weights_r.offset);
    int64_t count = 0;
    for (uint32_t i = 0; i < B; i++) {
        int len = b->lengths ? b->lengths[i] : b->seq_len;
        for (uint32_t t = 0; t < T; t++) {
            size_t src = (size_t)i * b->seq_len + t, row = (size_t)i * T + t;
            bool real = (int)t < len;
            int32_t id = real ? b->tokens[src] : 0;
            if (id < 0 || id >= V)
                return forge__fail(&tr->err, FORGE_ERR_INVALID_ARGUMENT, "token %d (sequence %u, position %u) is outside the vocabulary of %d", id, i, t, V);
            tok[row] = (uint32_t)id;
            int32_t y = -1;
            if (!mse && (int)t + 1 < len) { /* HF: position t predicts label t + 1 */
                int32_t lv = b->labels ? b->labels[src + 1] : b->tokens[src + 1];
                if (lv != -100 && (lv < 0 || lv >= V))
                    return forge__fail(&tr->err, FORGE_ERR_INVALID_ARGUMENT, "label %d (sequence %u, position %u) is neither -100 nor a token id", lv, i,
                                       t + 1);
                if (lv != -100 && (!b->mask || b->mask[src + 1])) y = lv;
            }
            bool counts = mse ? real && (!b->mask || b->mask[src]) : y >= 0;
            lab[row] = y;
            w[row] = counts ? 1.0f : 0.0f;
            count += counts;
        }
    }
    if (!count) return forge__fail(&tr->err, FORGE_ERR_INVALID_ARGUMENT, "the batch has no counted target (every label is -100 or masked)");
    double div = (double)count * (mse ? L->targets_width : 1) * L->p.accum_steps;
    for (size_t i = 0; i < (size_t)B * T; i++) w[i] = (float)(w[i] / div);
    if (mse) {
        float *tg = (float *)(io + tr->targets_r.offset);
        size_t wd = L->targets_width;
        for (uint32_t i = 0; i < B; i++)
            for (uint32_t t = 0; t < T; t++)
                if ((int)t < b->seq_len) memcpy(tg + ((size_t)i * T + t) * wd, b->targets + ((size_t)i * b->seq_len + t) * wd, 4 * wd);
                else memset(tg + ((size_t)i * T + t) * wd, 0, 4 * wd);
    }
    forge__step_params sp = {0, B * T, 0, 1.0f, 1.0f, 0, {0, 0}};
    memcpy(io + tr->params_r.offset, &sp, sizeof sp);
    *seq = T;
    *counted = count;
    return FORGE_OK;
}

/* Runs the recorded step (or evaluation) for a batch already in the io buffer; returns the
 * mean loss over its counted targets. */
static forge_status forge__train_run(forge_trainer *tr, uint32_t B, uint32_t T, bool step, int64_t count, double *loss) {
    forge__device *d = &tr->m->dev;
    forge__recording *rc = NULL;
    for (int i = 0; i < FORGE__TRAIN_RECORDINGS && !rc; i++)
        if (tr->rec[i].cb && tr->rec[i].n_tokens == B && tr->rec[i].out_row0 == T && tr->rec[i].mode == (uint32_t)step) rc = &tr->rec[i];
    forge_status st;
    if (!rc) {
        rc = forge__recording_slot(d, tr->cmd_pool, tr->rec, FORGE__TRAIN_RECORDINGS);
        forge__train_args args = {tr, B, T, step};
        if ((st = forge__record(tr->m, tr->cmd_pool, tr->profile, forge__record_train_fn, &args, rc, NULL, &tr->err))) return st;
        rc->n_tokens = B;
        rc->out_row0 = T;
        rc->mode = (uint32_t)step;
    }
    rc->last_use = ++tr->use_clock;
    if (step) { /* this micro-batch's dropout masks */
        forge__step_params *sp = (forge__step_params *)((uint8_t *)tr->io.mapped + tr->params_r.offset);
        uint64_t h = tr->L.p.seed * 0x9e3779b97f4a7c15ull + tr->n_micro + 1;
        h ^= h >> 31;
        h *= 0xbf58476d1ce4e5b9ull;
        sp->seed = (uint32_t)(h ^ (h >> 32));
    }
    if ((st = forge__submit_wait(d, rc->cb, tr->fence, &tr->err))) return st;
    if (rc->qpool) forge__profile_collect(d, &tr->prof, rc);
    size_t n = (size_t)B * T;
    forge__readback_invalidate(d, &tr->readback, 0, 4 * n);
    const float *rows = (const float *)tr->readback.mapped;
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += rows[i];
    *loss = sum / ((double)count * (tr->L.p.loss == FORGE_LOSS_CROSS_ENTROPY ? 1 : tr->L.targets_width));
    return FORGE_OK;
}

/* adamw.comp's scalars for step k (from 1) at learning rate lr, computed in f64 and rounded
 * once, as torch's Python floats are: {1 - lr wd, 1 - b1, b2, 1 - b2, lr / bc1, sqrt(bc2), eps,
 * max_norm}. */
static void forge__adamw_scalars(const forge_train_params *p, double lr, int k, float out[8]) {
    out[0] = (float)(1.0 - lr * p->weight_decay);
    out[1] = (float)(1.0 - p->beta1);
    out[2] = (float)p->beta2;
    out[3] = (float)(1.0 - p->beta2);
    out[4] = (float)(lr / (1.0 - pow(p->beta1, k)));
    out[5] = (float)sqrt(1.0 - pow(p->beta2, k));
    out[6] = (float)p->eps;
    out[7] = (float)p->max_grad_norm;
}

/* The learning rate of optimizer step s (0-based), as HF's schedulers compute it. */
static double forge__lr_at(const forge_train_params *p, int s) {
    if (s < p->warmup_steps) return p->lr * (double)s / (double)FORGE__MAX(1, p->warmup_steps);
    double span = (double)FORGE__MAX(1, p->total_steps - p->warmup_steps), done = (double)(s - p->warmup_steps);
    switch (p->schedule) {
    case FORGE_LR_LINEAR: return p->lr * FORGE__MAX(0.0, (double)(p->total_steps - s) / span);
    case FORGE_LR_COSINE: return p->lr * FORGE__MAX(0.0, 0.5 * (1.0 + cos(M_PI * done / span)));
    default: return p->lr;
    }
}

static forge_status forge__train_step(forge_trainer *tr, const forge_train_batch *b, forge_train_stats *stats) {
    double t0 = forge__now_s();
    uint32_t T;
    int64_t count;
    forge_status st = forge__train_fill(tr, b, &T, &count);
    if (st) return st;
    forge_train_stats ts;
    memset(&ts, 0, sizeof ts);
    ts.struct_size = sizeof ts;
    if ((st = forge__train_run(tr, (uint32_t)b->n_seqs, T, true, count, &ts.loss))) return st;
    tr->n_micro++;
    ts.tokens = count;
    if (++tr->micro == tr->L.p.accum_steps) {
        const forge_train_params *p = &tr->L.p;
        double lr = forge__lr_at(p, tr->step);
        int k = tr->step + 1; /* torch counts steps from 1 in the bias corrections */
        float opt[8];
        forge__adamw_scalars(p, lr, k, opt);
        memcpy((uint8_t *)tr->io.mapped + tr->opt_r.offset, opt, sizeof opt);
        forge__device *d = &tr->m->dev;
        if ((st = forge__submit_wait(d, tr->opt_rec.cb, tr->fence, &tr->err))) return st;
        if (tr->opt_rec.qpool) forge__profile_collect(d, &tr->prof, &tr->opt_rec);
        forge__readback_invalidate(d, &tr->readback, tr->rb_norm_offset, 4);
        float norm2;
        memcpy(&norm2, (const uint8_t *)tr->readback.mapped + tr->rb_norm_offset, 4);
        ts.grad_norm = sqrt((double)norm2);
        ts.lr = lr;
        ts.applied = 1;
        tr->step = k;
        tr->micro = 0;
    }
    ts.step = tr->step;
    ts.ms = (forge__now_s() - t0) * 1e3;
    ts.peak_device_bytes = forge__mem_peak(&tr->m->mem_total);
    if (stats) FORGE__PUT(stats, ts);
    return FORGE_OK;
}

/* The caller's batch (its struct_size) as forge's struct, into *own. */
static forge_status forge__train_batch_in(forge_trainer *tr, const forge_train_batch *b, forge_train_batch *own) {
    if (!b) return forge__fail(&tr->err, FORGE_ERR_INVALID_ARGUMENT, "no batch");
    forge_status st = forge__check_sized(b, "forge_train_batch", &tr->err);
    if (!st) forge__get_sized(own, sizeof *own, b, forge__struct_size(b));
    return st;
}

FORGE_API forge_status forge_train_step(forge_trainer *tr, const forge_train_batch *b, forge_train_stats *stats) {
    if (!tr) return FORGE_ERR_INVALID_ARGUMENT;
    forge_train_batch own;
    forge_status st = forge__train_batch_in(tr, b, &own);
    if (!st) st = forge__check_sized(stats, "forge_train_stats", &tr->err);
    if (st) return st;
    if ((st = forge__slot_acquire(tr->m, &tr->err))) return st;
    st = forge__train_step(tr, &own, stats);
    forge__slot_release(tr->m);
    return st;
}

FORGE_API forge_status forge_train_eval(forge_trainer *tr, const forge_train_batch *b, double *loss, int64_t *tokens) {
    if (!tr || !loss) return FORGE_ERR_INVALID_ARGUMENT;
    forge_train_batch own;
    forge_status st = forge__train_batch_in(tr, b, &own);
    if (st) return st;
    if ((st = forge__slot_acquire(tr->m, &tr->err))) return st;
    uint32_t T;
    int64_t count;
    st = forge__train_fill(tr, &own, &T, &count);
    if (!st) st = forge__train_run(tr, (uint32_t)own.n_seqs, T, false, count, loss);
    if (!st && tokens) *tokens = count;
    forge__slot_release(tr->m);
    return st;
}

FORGE_API forge_status forge_trainer_save(forge_trainer *tr, const char *dir, forge_adapter_format format) {
    if (!tr) return FORGE_ERR_INVALID_ARGUMENT;
    if (!dir || !*dir) return forge__fail(&tr->err, FORGE_ERR_INVALID_ARGUMENT, "save needs a directory");
    if (format != FORGE_ADAPTER_PEFT && format != FORGE_ADAPTER_MLX)
        return forge__fail(&tr->err, FORGE_ERR_INVALID_ARGUMENT, "unknown adapter format %d", (int)format);
    const forge__train_layout *L = &tr->L;
    const forge__config *c = &tr->m->cfg;
    float **host = (float **)calloc((size_t)L->n_segs, sizeof *host);
    forge__host_pair *pairs = (forge__host_pair *)calloc((size_t)c->n_layers * FORGE__T_COUNT, sizeof *pairs);
    forge_status st = host && pairs ? FORGE_OK : forge__fail(&tr->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int s = 0; s < L->n_segs && !st; s++) {
        if (!(host[s] = (float *)malloc(4 * L->seg_count[s]))) st = forge__fail(&tr->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        else st = forge__train_transfer(tr, tr->segs[s].p, host[s], 4 * L->seg_count[s], false);
    }
    if (!st) {
        forge__adapter_host ah = {c->n_layers, pairs, (uint32_t)L->p.rank, L->p.alpha, L->p.dropout, 0, c->n_layers};
        for (int i = 0; i < c->n_layers * FORGE__T_COUNT; i++) {
            const forge__lora_pair *lp = &L->lora.pairs[i];
            if (!lp->rank) continue;
            pairs[i] = (forge__host_pair){lp->rank, lp->scale, host[lp->seg] + lp->a_el, host[lp->seg] + lp->b_el};
            ah.targets |= 1u << (i % FORGE__T_COUNT);
            ah.first_layer = FORGE__MIN(ah.first_layer, i / FORGE__T_COUNT);
        }
        st = forge__adapter_write(tr->m, &ah, dir, format, &tr->err);
    }
    for (int s = 0; host && s < L->n_segs; s++) free(host[s]);
    free(host);
    free(pairs);
    return st;
}

FORGE_API forge_status forge_trainer_memory(const forge_trainer *ctr, forge_memory_stats *out) {
    if (!ctr || !out) return FORGE_ERR_INVALID_ARGUMENT;
    forge_trainer *tr = (forge_trainer *)ctr; /* the error slot is the one part a const call may write */
    forge_status st = forge__check_sized(out, "forge_memory_stats", &tr->err);
    if (st) return st;
    forge_memory_stats full = {sizeof full, tr->arena.bytes, tr->mem.planned, tr->mem.in_use, tr->mem.peak, tr->mem.n_buffers,
                               tr->mem.n_allocations, 0, 0, 0};
    FORGE__PUT(out, full);
    return FORGE_OK;
}

FORGE_API forge_status forge_trainer_profile(const forge_trainer *tr, char *out, size_t capacity, size_t *len) {
    if (!tr || !len) return FORGE_ERR_INVALID_ARGUMENT;
    return forge__profile_json(&tr->prof, out, capacity, len);
}

