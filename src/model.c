/* src/model.c: Models.
 * Owns: struct forge_model, weight roles and naming conventions, validation against the
 * config, the LoRA pairs' device layout, the upload plan and upload; the model's error slot and
 * readiness checks; the model's fingerprint (state files name it).
 * May call: base.c, files.c, config.c, tokenizer.c, device.c, ops.c.
 *
 * From the tensor table and the config to weights on the device. Each weight is looked up by
 * its role under the format's naming convention (HF or llama.cpp), its shape and dtype are
 * checked against the config, and it is split by rows into chunks that fit one binding.
 * All chunks are packed into at most max_alloc-sized blocks (the model's memory plan), then
 * copied through a staging buffer (or written in place on devices whose memory the host sees).
 */

/* A row-chunk of a weight matrix: rows [row0, row0 + rows) bound as one range; MLX weights
 * bind the same rows of their scales and biases too. */
typedef struct forge__wchunk {
    uint32_t row0, rows;
    forge__range w, scales, biases;
} forge__wchunk;

typedef struct forge__weight {
    const char *name;        /* tensor name, for messages */
    forge__wfmt fmt;
    uint32_t rows, cols;     /* logical shape [rows, cols] = [out, in] */
    uint32_t bits, group;    /* MLX affine: bits per code, elements per scale/bias */
    uint32_t qflags;         /* MLX affine: 1 when scales and biases are bf16 (else f16) */
    int n_chunks;
    forge__wchunk *chunks;
} forge__weight;

/* A small f32 vector on the device (norm weights, biases, RoPE frequencies). */
typedef struct forge__vec {
    forge__range r;
    uint32_t n;
    bool present;
} forge__vec;

typedef struct forge__layer {
    forge__vec attn_norm, ffn_norm, post_attn_norm, post_ffn_norm, q_norm, k_norm;
    forge__vec bo;
    forge__weight wq, wk, wv, wo, gate, up, down;
    forge__weight gate_up;   /* gate and up rows interleaved [2 * ffn, hidden], when fused_gate_up */
    bool fused_gate_up;
    forge__weight wqkv;      /* q, k and v rows concatenated [q_dim + 2 kv_dim, hidden], when fused_qkv (Gemma 4's
                              * k = v layers: the k rows twice); a KV-shared layer has wq only */
    forge__vec bqkv;         /* their biases, concatenated likewise (Qwen 2) */
    bool fused_qkv;
    bool sliding;
    bool dense_mlp;          /* gate, up, down (all layers but Qwen3-MoE's sparse ones) */
    /* Gemma 4 */
    float out_scale;         /* layer_scalar: the layer's output (residual included) times this (1: none) */
    forge__weight ple_gate;  /* per-layer input: gate [ple_dim, hidden] and projection [hidden, ple_dim] */
    forge__weight ple_proj;
    forge__vec ple_norm;     /* [hidden] after the projection */
    /* Mixture of experts (cfg.layer_moe) */
    forge__weight router;    /* [n_experts, hidden] */
    forge__vec router_norm;  /* Gemma 4: the router input's norm weight, router.scale * hidden^-0.5 [hidden] */
    forge__vec expert_scale; /* Gemma 4: per_expert_scale [n_experts] */
    forge__vec pre_ffn_norm_2, post_ffn_norm_1, post_ffn_norm_2; /* Gemma 4: the experts' own norms beside the dense MLP's */
    forge__weight exp_gate_up; /* [n_experts * 2 moe_ffn, hidden]: expert e's rows from 2 e moe_ffn, its gate and up rows
                                * interleaved as in gate_up; row-chunks hold whole experts */
    forge__weight exp_down;  /* [n_experts * hidden, moe_ffn]: expert e's rows from e hidden */
    /* Qwen 3.5 */
    forge__weight shared_gate; /* Qwen 3.5-MoE: shared_expert_gate [1, hidden]; the shared expert is the layer's dense MLP */
    bool linear;             /* a linear-attention (Gated DeltaNet) layer: the mixer below, wo its out_proj [hidden, lin_v_dim] */
    forge__weight lin_in;    /* in_proj_qkv | in_proj_z | in_proj_b | in_proj_a rows [conv_dim + VD + 2 NV, hidden], when
                              * fused_lin; else the four apart, each filling its columns of the same row */
    forge__weight lin_qkv, lin_z, lin_b, lin_a;
    bool fused_lin;
    forge__vec conv_w;       /* conv1d taps [conv_dim, lin_conv] */
    forge__vec lin_neg_a;    /* -exp(A_log) [NV] (the decay's rate, computed at load) */
    forge__vec dt_bias;      /* [NV] */
    forge__vec lin_norm;     /* RMSNormGated's weight [lin_v_dim], shared by the value heads */
} forge__layer;

/* ---- LoRA adapters ----
 * An adapted projection computes y = x W^T + scale * (x A^T) B^T beside its frozen weight W.
 * The targets are named as HF names the projections; one pair of f32 matrices per (layer,
 * target). The model holds one set for inference (forge_model_params.adapter_path); a trainer
 * holds its own, with gradients and optimizer state at the same offsets (train.c). Qwen 3.5's
 * linear-attention layers have their own projections (linear_attn.*) in place of attention's. */

typedef enum forge__target {
    FORGE__T_Q, FORGE__T_K, FORGE__T_V, FORGE__T_O, FORGE__T_GATE, FORGE__T_UP, FORGE__T_DOWN,
    FORGE__T_LIN_QKV, FORGE__T_LIN_Z, FORGE__T_LIN_B, FORGE__T_LIN_A, FORGE__T_LIN_OUT, /* Qwen 3.5's linear attention */
    FORGE__T_COUNT
} forge__target;

static const char *const forge__target_names[FORGE__T_COUNT] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                                                                "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"};
#define FORGE__T_ALL ((1u << FORGE__T_COUNT) - 1u)

typedef struct forge__lora_pair {
    uint32_t rank, in, out;     /* A [rank, in], B [out, rank] */
    float scale;                /* alpha / rank (PEFT), scale (mlx-lm) */
    forge__range a, b;          /* the ranges holding A and B (f32, device) */
    uint32_t a_el, b_el;        /* where A and B start in them, in elements */
    forge__range ga, gb;        /* trainer: the ranges holding their gradients (same element offsets) */
    int seg;                    /* trainer: the parameter segment holding them */
} forge__lora_pair;

typedef struct forge__lora {
    int n_layers;
    forge__lora_pair *pairs;    /* [n_layers * FORGE__T_COUNT]; rank 0 where a projection is not adapted */
    uint32_t max_rank;          /* the widest pair: the scratch's column stride per target */
    float dropout;              /* training only */
} forge__lora;

static const forge__lora_pair *forge__lora_at(const forge__lora *lo, int layer, forge__target t) {
    if (!lo || !lo->pairs) return NULL;
    const forge__lora_pair *p = &lo->pairs[layer * FORGE__T_COUNT + t];
    return p->rank ? p : NULL;
}

struct forge_model {
    forge__err err;
    pthread_mutex_t err_lock;     /* model-level calls may fail on several threads */
    bool failed;                  /* a failed load: only errmsg and free are valid */
    forge__arena arena;
    forge__logger log;
    forge__config cfg;
    char name[128];
    char source_format[16];
    forge__file *files;
    int n_files;
    forge__tensor_table tensors;
    forge__tokenizer tok;
    forge__st embed;              /* the sentence-transformers pipeline forge_embed follows (config.c) */
    forge__weight embed_w[FORGE__ST_MAX_STEPS]; /* its Dense projections on the device (forge__st_device_steps), */
    forge__vec embed_b[FORGE__ST_MAX_STEPS];    /* and their biases */
    bool vocab_only;              /* loaded with forge_model_params.vocab_only: tokenizer only */
    forge__device dev;
    forge__mem_counter mem;       /* the model's own device memory (weights) */
    forge__mem_counter mem_total; /* model + all its sessions: the device-wide peak */
    forge__buffer *blocks;
    int n_blocks;
    forge__weight tok_embd, output;
    forge__vec output_norm, rope_full, rope_sliding;
    forge__vec ones;              /* [head_dim_max] 1.0: the weight of Gemma 4's scale-free value norm */
    forge__weight ple_embd;       /* Gemma 4 per-layer inputs: the table [ple_vocab, n_layers * ple_dim], */
    forge__weight ple_model_proj; /* the projection of the embeddings [n_layers * ple_dim, hidden] */
    forge__vec ple_proj_norm;     /* and its norm [ple_dim] */
    forge__layer *layers;
    forge__pipeline pipes[FORGE__OP_COUNT];
    pthread_mutex_t pipe_lock;
    /* forge_model_params.parallel_slots: how many inference calls (eval, generate, classify,
     * a training step) may run on the device at once; the rest wait on slot_free or fail. */
    pthread_mutex_t slot_lock;
    pthread_cond_t slot_free;
    int slots_max, slots_busy;    /* slots_max 0: no cap */
    bool slots_fail;              /* forge_model_params.parallel_fail */
    uint64_t n_params, weight_bytes;
    /* A decode step's sampler reduction (the top candidates and the softmax normalizer) on the
     * host over the read-back row instead of topk.comp + topk_merge.comp: on a CPU device
     * (lavapipe) the two sorting dispatches cost more than the host's pass over the same memory
     * (1.6 of 9 ms a token for stories260K's 512 logits). Set at load; tests may switch it. */
    bool sample_on_host;
    /* Decode products of Q4_0 and Q8_0 weights on int8 activations (act_q8 + matvec_q8a):
     * GPUs with integer dot products, unless `exact` (the activations are rounded to 8 bits a
     * block, as llama.cpp's quantized products round them). Not on CPU devices, where the
     * host's products round them instead (host_q8). Set at load; tests may switch it. */
    bool act_q8;
    /* ... and one token's layers as a chain of such products, each quantizing its output for the
     * next (forge__q8_chain). Set at load; tests switch it off to compare the two. */
    bool q8_chain;
    /* One-token products of at least this many weight rows (gated: two an output) two outputs a
     * subgroup (forge__pair_outputs): 4096 on GPUs, 0 (never) on CPU devices. Set at load; tests
     * lower it. */
    uint32_t pairs_min_rows;
    /* The prefill attention on tensor cores (forge__attn_cm_op) where the device has them. Set
     * at load; tests switch it off to compare with attention_tiled. */
    bool attn_cm;
    /* Training's input gradients through frozen weights on tensor cores (forge__linear_back_cm)
     * where the pass has their scratch (not exact). Set at load; tests switch it off to compare
     * with the SIMT kernels. */
    bool back_cm;
    /* The decode attention on subgroups (attention_decode.comp) where the device has subgroup
     * arithmetic at a width of 4 to 64; else attention_split.comp. Set at load; tests may switch it. */
    bool attn_subgroups;
    /* Products on the host, in C over the mapped buffers (src/host.c): CPU devices, one
     * token's and a prompt's products of host_min_bytes of weights or more
     * (FORGE__HOST_MIN_BYTES); with host_q8 (unless `exact`) those of Q4_0 / Q8_0 weights on
     * int8 activations, as act_q8 on GPUs. Set at load; tests switch them or lower the bound.
     * The pool starts with the first such recording. */
    bool host_products, host_q8;
    uint64_t host_min_bytes;
    forge__host_pool host_pool;   /* started under pipe_lock */
    const char *chat_template;    /* the checkpoint's Jinja chat template, NULL if none (recognition only) */
    /* The tokens as bytes and their trie, for constraints (grammar.c's forge__vocab, one block
     * freed with free()); built on first use, under vocab_lock (the model is shared). */
    struct forge__vocab *vocab;
    pthread_mutex_t vocab_lock;
    bool exact;                   /* forge_model_params.exact: no fp16 rounding of activations (no tensor-core matmul) */
    forge__lora adapter;          /* forge_model_params.adapter_path, applied in every forward pass (none: no pairs) */
    char main_format[16];         /* storage format of most matrix elements ("f16", "q4_k", "mlx4"), for info */
    uint64_t fingerprint;         /* the config, tensor headers and a few weight bytes, hashed (state.c: state files) */
    uint64_t adapter_id;          /* the adapter's identity, hashed; 0: none (state.c) */
};

/* ---- Weight roles and their names under each convention ---- */

typedef enum forge__role {
    FORGE__R_EMBED, FORGE__R_OUT_NORM, FORGE__R_OUTPUT, FORGE__R_ROPE_FREQS,
    FORGE__R_ATTN_NORM, FORGE__R_WQ, FORGE__R_WK, FORGE__R_WV, FORGE__R_WO,
    FORGE__R_BQ, FORGE__R_BK, FORGE__R_BV, FORGE__R_BO, FORGE__R_Q_NORM, FORGE__R_K_NORM,
    FORGE__R_POST_ATTN_NORM, FORGE__R_FFN_NORM, FORGE__R_POST_FFN_NORM,
    FORGE__R_GATE, FORGE__R_UP, FORGE__R_DOWN,
    /* Gemma 4 */
    FORGE__R_LAYER_SCALAR, FORGE__R_PLE_EMBED, FORGE__R_PLE_MODEL_PROJ, FORGE__R_PLE_PROJ_NORM,
    FORGE__R_PLE_GATE, FORGE__R_PLE_PROJ, FORGE__R_PLE_NORM,
    FORGE__R_PRE_FFN_NORM_2, FORGE__R_POST_FFN_NORM_1, FORGE__R_POST_FFN_NORM_2,
    /* Qwen 3.5 */
    FORGE__R_LIN_QKV, FORGE__R_LIN_Z, FORGE__R_LIN_B, FORGE__R_LIN_A, FORGE__R_LIN_CONV, FORGE__R_LIN_DT, FORGE__R_LIN_ALOG,
    FORGE__R_LIN_NORM, FORGE__R_LIN_OUT, FORGE__R_SHARED_GATE,
    FORGE__R_COUNT
} forge__role;

static const char *const forge__names_hf[FORGE__R_COUNT] = {
    "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", NULL,
    "model.layers.%d.input_layernorm.weight",
    "model.layers.%d.self_attn.q_proj.weight", "model.layers.%d.self_attn.k_proj.weight",
    "model.layers.%d.self_attn.v_proj.weight", "model.layers.%d.self_attn.o_proj.weight",
    "model.layers.%d.self_attn.q_proj.bias", "model.layers.%d.self_attn.k_proj.bias",
    "model.layers.%d.self_attn.v_proj.bias", "model.layers.%d.self_attn.o_proj.bias",
    "model.layers.%d.self_attn.q_norm.weight", "model.layers.%d.self_attn.k_norm.weight",
    "model.layers.%d.post_attention_layernorm.weight", /* Gemma: after attention */
    "model.layers.%d.post_attention_layernorm.weight", /* Llama/Qwen: before the MLP (see forge__name) */
    "model.layers.%d.post_feedforward_layernorm.weight",
    "model.layers.%d.mlp.gate_proj.weight", "model.layers.%d.mlp.up_proj.weight", "model.layers.%d.mlp.down_proj.weight",
    "model.layers.%d.layer_scalar", "model.embed_tokens_per_layer.weight", "model.per_layer_model_projection.weight",
    "model.per_layer_projection_norm.weight", "model.layers.%d.per_layer_input_gate.weight",
    "model.layers.%d.per_layer_projection.weight", "model.layers.%d.post_per_layer_input_norm.weight",
    "model.layers.%d.pre_feedforward_layernorm_2.weight", "model.layers.%d.post_feedforward_layernorm_1.weight",
    "model.layers.%d.post_feedforward_layernorm_2.weight",
    "model.layers.%d.linear_attn.in_proj_qkv.weight", "model.layers.%d.linear_attn.in_proj_z.weight",
    "model.layers.%d.linear_attn.in_proj_b.weight", "model.layers.%d.linear_attn.in_proj_a.weight",
    "model.layers.%d.linear_attn.conv1d.weight", "model.layers.%d.linear_attn.dt_bias", "model.layers.%d.linear_attn.A_log",
    "model.layers.%d.linear_attn.norm.weight", "model.layers.%d.linear_attn.out_proj.weight",
    "model.layers.%d.mlp.shared_expert_gate.weight",
};

static const char *const forge__names_gguf[FORGE__R_COUNT] = {
    "token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight",
    "blk.%d.attn_norm.weight",
    "blk.%d.attn_q.weight", "blk.%d.attn_k.weight", "blk.%d.attn_v.weight", "blk.%d.attn_output.weight",
    "blk.%d.attn_q.bias", "blk.%d.attn_k.bias", "blk.%d.attn_v.bias", "blk.%d.attn_output.bias",
    "blk.%d.attn_q_norm.weight", "blk.%d.attn_k_norm.weight",
    "blk.%d.post_attention_norm.weight", "blk.%d.ffn_norm.weight", "blk.%d.post_ffw_norm.weight",
    "blk.%d.ffn_gate.weight", "blk.%d.ffn_up.weight", "blk.%d.ffn_down.weight",
    "blk.%d.layer_output_scale.weight", "per_layer_token_embd.weight", "per_layer_model_proj.weight",
    "per_layer_proj_norm.weight", "blk.%d.inp_gate.weight", "blk.%d.proj.weight", "blk.%d.post_norm.weight",
    "blk.%d.pre_ffw_norm_2.weight", "blk.%d.post_ffw_norm_1.weight", "blk.%d.post_ffw_norm_2.weight",
    /* llama.cpp's qwen35: the norms are stored with their 1 added, ssm_a is -exp(A_log) */
    "blk.%d.attn_qkv.weight", "blk.%d.attn_gate.weight", "blk.%d.ssm_beta.weight", "blk.%d.ssm_alpha.weight",
    "blk.%d.ssm_conv1d.weight", "blk.%d.ssm_dt.bias", "blk.%d.ssm_a", "blk.%d.ssm_norm.weight", "blk.%d.ssm_out.weight",
    "blk.%d.ffn_gate_inp_shexp.weight",
};

typedef struct forge__loader {
    forge_model *m;
    bool gguf;
    forge__pack pack;
    struct forge__upload *ups;
    int n_ups, cap_ups;
} forge__loader;

/* One copy into the planned device memory: raw bytes, a vector converted to f32, or the
 * rows of two tensors interleaved (src row 0, src2 row 0, src row 1, ...: the fused gate_up). */
typedef struct forge__upload {
    const uint8_t *src;
    const uint8_t *src2;     /* interleaved with src, row_bytes at a time */
    uint64_t row_bytes;
    uint64_t bytes;          /* device bytes */
    forge__dtype src_dtype;  /* for conversion to f32 */
    bool to_f32;
    float add;               /* added after conversion (Gemma's 1 + w norms), */
    float scale;             /* then multiplied (constants folded into a norm weight) */
    int pack_item;
    uint64_t item_offset;    /* where in the pack item (several uploads may fill one: fused q|k|v) */
    forge__range *dst;       /* filled once the blocks exist (NULL for the later parts of an item) */
} forge__upload;

static void forge__name(const forge__loader *L, forge__role role, int layer, char *buf, size_t size) {
    const char *fmt = L->gguf ? forge__names_gguf[role] : forge__names_hf[role];
    if (!L->gguf && role == FORGE__R_FFN_NORM && L->m->cfg.sandwich_norms) fmt = "model.layers.%d.pre_feedforward_layernorm.weight";
    if (L->m->cfg.arch == FORGE__ARCH_QWEN35MOE && (role == FORGE__R_GATE || role == FORGE__R_UP || role == FORGE__R_DOWN)) {
        /* Qwen 3.5-MoE's dense MLP is its shared expert */
        static const char *const hf[3] = {"model.layers.%d.mlp.shared_expert.gate_proj.weight", "model.layers.%d.mlp.shared_expert.up_proj.weight",
                                          "model.layers.%d.mlp.shared_expert.down_proj.weight"};
        static const char *const gg[3] = {"blk.%d.ffn_gate_shexp.weight", "blk.%d.ffn_up_shexp.weight", "blk.%d.ffn_down_shexp.weight"};
        fmt = (L->gguf ? gg : hf)[role - FORGE__R_GATE];
    }
    if (L->gguf && role == FORGE__R_FFN_NORM && forge__arch_qwen35(L->m->cfg.arch)) fmt = "blk.%d.post_attention_norm.weight";
    if (!L->gguf && role == FORGE__R_OUTPUT && L->m->cfg.n_labels) fmt = "score.weight"; /* a sequence-classification head */
    snprintf(buf, size, fmt ? fmt : "", layer);
}

/* Room for one more upload. */
static forge_status forge__upload_reserve(forge__loader *L) {
    forge_model *m = L->m;
    if (L->n_ups < L->cap_ups) return FORGE_OK;
    int cap = L->cap_ups ? L->cap_ups * 2 : 512;
    forge__upload *u = (forge__upload *)forge__arena_alloc(&m->arena, sizeof *u * (size_t)cap, 16);
    if (!u) return forge__fail(&m->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    if (L->n_ups) memcpy(u, L->ups, sizeof *u * (size_t)L->n_ups);
    L->ups = u;
    L->cap_ups = cap;
    return FORGE_OK;
}

static forge_status forge__upload_add(forge__loader *L, const uint8_t *src, uint64_t bytes, forge__dtype src_dtype,
                                      bool to_f32, float add, forge__range *dst) {
    forge_model *m = L->m;
    forge_status st = forge__upload_reserve(L);
    if (st) return st;
    int item = forge__pack_add(&L->pack, &m->arena, bytes);
    if (item < 0) return forge__fail(&m->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    L->ups[L->n_ups++] = (forge__upload){src, NULL, 0, bytes, src_dtype, to_f32, add, 1.0f, item, 0, dst};
    return FORGE_OK;
}

/* Several sources concatenated into one device range (the fused q|k|v weights and biases):
 * the first part creates the pack item for `total` bytes, the others fill it at their offset. */
typedef struct forge__part {
    const uint8_t *src;
    uint64_t bytes;          /* device bytes of this part */
    const uint8_t *src2;     /* with row_bytes: the rows of src and src2 interleaved (an expert's gate and up) */
    uint64_t row_bytes;
} forge__part;

static forge_status forge__upload_parts(forge__loader *L, const forge__part *parts, int n_parts, forge__dtype src_dtype, bool to_f32,
                                        float add, forge__range *dst) {
    uint64_t total = 0;
    for (int i = 0; i < n_parts; i++) total += parts[i].bytes;
    forge_status st = FORGE_OK;
    uint64_t off = 0;
    int item = -1;
    for (int i = 0; i < n_parts && !st; i++) {
        if (!parts[i].bytes) continue;
        if (item < 0) {
            st = forge__upload_add(L, parts[i].src, parts[i].bytes, src_dtype, to_f32, add, dst);
            if (st) break;
            item = L->ups[L->n_ups - 1].pack_item;
            L->pack.items[item].size = total;
        } else {
            forge__upload u = L->ups[L->n_ups - 1];
            u.src = parts[i].src;
            u.bytes = parts[i].bytes;
            u.item_offset = off;
            u.dst = NULL;
            if ((st = forge__upload_reserve(L))) break;
            L->ups[L->n_ups++] = u;
        }
        L->ups[L->n_ups - 1].src2 = parts[i].src2;
        L->ups[L->n_ups - 1].row_bytes = parts[i].row_bytes;
        off += parts[i].bytes;
    }
    return st;
}

/* An upload of `rows` rows of `a` and of `b` interleaved (each row_bytes). */
static forge_status forge__upload_interleaved(forge__loader *L, const uint8_t *a, const uint8_t *b, uint64_t rows, uint64_t row_bytes,
                                              forge__range *dst) {
    forge_status st = forge__upload_add(L, a, 2 * rows * row_bytes, FORGE__U8, false, 0, dst);
    if (!st) {
        L->ups[L->n_ups - 1].src2 = b;
        L->ups[L->n_ups - 1].row_bytes = row_bytes;
    }
    return st;
}

static forge__tensor *forge__lookup(forge__loader *L, forge__role role, int layer, bool required, forge_status *st) {
    char name[256];
    forge__name(L, role, layer, name, sizeof name);
    forge__tensor *t = forge__tensor_find(&L->m->tensors, name);
    if (!t && required)
        *st = forge__fail(&L->m->err, FORGE_ERR_MODEL, "tensor '%s' is missing (architecture %s)", name,
                          forge__arch_names[L->m->cfg.arch]);
    if (t) t->used = true;
    return t;
}

static forge_status forge__expect_shape(forge_model *m, const forge__tensor *t, int n_dims, int64_t d0, int64_t d1,
                                        const char *why) {
    bool ok = t->n_dims == n_dims && t->shape[0] == d0 && (n_dims < 2 || t->shape[1] == d1);
    /* a matrix of one row may come as a vector (Qwen 3.5-MoE's shared expert gate, llama.cpp's ffn_gate_inp_shexp) */
    ok |= n_dims == 2 && d0 == 1 && t->n_dims == 1 && t->shape[0] == d1;
    if (ok) return FORGE_OK;
    char got[96];
    forge__shape_str(t, got, sizeof got);
    if (n_dims == 1)
        return forge__fail(&m->err, FORGE_ERR_MODEL, "%s: tensor '%s' has shape %s but the config (%s) needs [%lld]",
                           t->file, t->name, got, why, (long long)d0);
    return forge__fail(&m->err, FORGE_ERR_MODEL, "%s: tensor '%s' has shape %s but the config (%s) needs [%lld, %lld]",
                       t->file, t->name, got, why, (long long)d0, (long long)d1);
}

/* A weight's storage: the tensor, and for MLX affine its scales and biases. */
typedef struct forge__wsrc {
    forge__tensor *t, *scales, *biases;
} forge__wsrc;

/* Describes a weight matrix [rows, cols] stored as `t` (format from the dtype, GGUF block
 * types included; MLX affine when "<prefix>.scales" and ".biases" exist: bits and group size
 * follow from the shapes, weight [rows, cols * bits / 32] u32, scales and biases
 * [rows, cols / group]), checking everything against the config. Uploads nothing. */
static forge_status forge__weight_describe(forge__loader *L, forge__weight *w, forge__tensor *t, uint32_t rows, uint32_t cols,
                                           const char *why, forge__wsrc *src) {
    forge_model *m = L->m;
    memset(w, 0, sizeof *w);
    *src = (forge__wsrc){t, NULL, NULL};
    w->name = t->name;
    w->rows = rows;
    w->cols = cols;
    if (!L->gguf && forge__ends_with(t->name, ".weight")) {
        char name[512];
        size_t plen = strlen(t->name) - 7;
        snprintf(name, sizeof name, "%.*s.scales", (int)plen, t->name);
        forge__tensor *sc = forge__tensor_find(&m->tensors, name);
        snprintf(name, sizeof name, "%.*s.biases", (int)plen, t->name);
        forge__tensor *bi = forge__tensor_find(&m->tensors, name);
        if (sc || bi) {
            char got[96];
            if (!sc || !bi)
                return forge__fail(&m->err, FORGE_ERR_MODEL, "%s: MLX-quantized '%s' needs both .scales and .biases", t->file, t->name);
            sc->used = bi->used = true;
            *src = (forge__wsrc){t, sc, bi};
            w->fmt = FORGE__W_MLX;
            if (t->dtype == FORGE__U32 && t->n_dims == 2 && t->shape[0] == rows && (t->shape[1] * 32) % cols == 0)
                w->bits = (uint32_t)(t->shape[1] * 32 / cols);
            if (w->bits != 2 && w->bits != 3 && w->bits != 4 && w->bits != 5 && w->bits != 6 && w->bits != 8) {
                forge__shape_str(t, got, sizeof got);
                return forge__fail(&m->err, FORGE_ERR_MODEL,
                                   "%s: MLX-quantized tensor '%s' is %s %s; the config (%s) needs u32 [%u, %u * bits / 32] with bits 2, 3, 4, 5, 6 or 8",
                                   t->file, t->name, forge__dtype_name(t->dtype), got, why, rows, cols);
            }
            if (sc->n_dims != 2 || sc->shape[0] != rows || sc->shape[1] <= 0 || cols % sc->shape[1] ||
                (sc->dtype != FORGE__F16 && sc->dtype != FORGE__BF16))
                return forge__fail(&m->err, FORGE_ERR_MODEL, "%s: MLX scales '%s' must be f16/bf16 [%u, %u / group_size]", sc->file, sc->name, rows, cols);
            w->group = (uint32_t)(cols / sc->shape[1]);
            if (w->group != 32 && w->group != 64 && w->group != 128)
                return forge__fail(&m->err, FORGE_ERR_UNSUPPORTED, "%s: '%s' implies MLX group size %u (32, 64 and 128 are supported)", sc->file,
                                   sc->name, w->group);
            if (bi->n_dims != 2 || bi->shape[0] != sc->shape[0] || bi->shape[1] != sc->shape[1] || bi->dtype != sc->dtype)
                return forge__fail(&m->err, FORGE_ERR_MODEL, "%s: MLX biases '%s' must match the scales '%s' in shape and dtype", bi->file, bi->name,
                                   sc->name);
            w->qflags = sc->dtype == FORGE__BF16;
            return FORGE_OK;
        }
    }
    forge_status st = forge__expect_shape(m, t, 2, rows, cols, why);
    if (st) return st;
    for (int f = 0; f < FORGE__W_COUNT; f++)
        if (f != FORGE__W_MLX && forge__wfmt_dtype[f] == t->dtype) {
            w->fmt = (forge__wfmt)f;
            return FORGE_OK;
        }
    return forge__fail(&m->err, FORGE_ERR_UNSUPPORTED,
                       "%s: tensor '%s' has type %s; forge reads weight matrices in f32, f16, bf16, q4_0, q8_0, q4_k, q6_k "
                       "and MLX affine",
                       t->file, t->name, forge__dtype_name(t->dtype));
}

/* Splits a described weight into row-chunks that fit one binding (and, for interleaved
 * pairs, the staging buffer) and plans their uploads. With `b` the weight is the rows of `a`
 * and `b` interleaved (w->rows counts both); chunks then hold whole pairs. */
static forge_status forge__weight_plan_chunks(forge__loader *L, forge__weight *w, const forge__wsrc *a, const forge__wsrc *b) {
    forge_model *m = L->m;
    forge_status st;
    uint64_t wrow = 0, arow = 0;
    if (w->fmt == FORGE__W_MLX) {
        wrow = (uint64_t)w->cols * w->bits / 8;
        arow = (uint64_t)(w->cols / w->group) * 2;
    } else {
        forge__row_bytes(a->t->dtype, w->cols, &wrow);
    }
    uint64_t limit = FORGE__MIN(m->dev.caps.max_storage_range, m->dev.caps.max_alloc) - 16;
    uint64_t per_chunk = limit / wrow;
    if (b) per_chunk &= ~(uint64_t)1;
    if (per_chunk == 0)
        return forge__fail(&m->err, FORGE_ERR_LIMIT, "tensor '%s': one row of %llu bytes exceeds the device binding limit of %llu bytes",
                           w->name, (unsigned long long)wrow, (unsigned long long)limit);
    w->n_chunks = (int)((w->rows + per_chunk - 1) / per_chunk);
    w->chunks = (forge__wchunk *)forge__arena_alloc(&m->arena, sizeof *w->chunks * (size_t)w->n_chunks, 16);
    if (!w->chunks) return forge__fail(&m->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int i = 0; i < w->n_chunks; i++) {
        forge__wchunk *c = &w->chunks[i];
        c->row0 = (uint32_t)(i * per_chunk);
        c->rows = (uint32_t)FORGE__MIN(per_chunk, w->rows - c->row0);
        if (b) { /* source rows row0 / 2 .. of both tensors */
            uint64_t r0 = c->row0 / 2, n = c->rows / 2;
            if ((st = forge__upload_interleaved(L, forge__tensor_at(a->t, r0 * wrow), forge__tensor_at(b->t, r0 * wrow), n, wrow, &c->w))) return st;
            if (w->fmt == FORGE__W_MLX) {
                if ((st = forge__upload_interleaved(L, forge__tensor_at(a->scales, r0 * arow), forge__tensor_at(b->scales, r0 * arow), n, arow,
                                                    &c->scales))) return st;
                if ((st = forge__upload_interleaved(L, forge__tensor_at(a->biases, r0 * arow), forge__tensor_at(b->biases, r0 * arow), n, arow,
                                                    &c->biases))) return st;
            }
            continue;
        }
        if ((st = forge__upload_add(L, forge__tensor_at(a->t, c->row0 * wrow), c->rows * wrow, a->t->dtype, false, 0, &c->w))) return st;
        if (w->fmt == FORGE__W_MLX) {
            if ((st = forge__upload_add(L, forge__tensor_at(a->scales, c->row0 * arow), c->rows * arow, a->scales->dtype, false, 0, &c->scales)))
                return st;
            if ((st = forge__upload_add(L, forge__tensor_at(a->biases, c->row0 * arow), c->rows * arow, a->biases->dtype, false, 0, &c->biases)))
                return st;
        }
    }
    const forge__wsrc *srcs[2] = {a, b};
    for (int k = 0; k < 2 && srcs[k]; k++) {
        m->n_params += (uint64_t)(b ? w->rows / 2 : w->rows) * w->cols;
        m->weight_bytes += srcs[k]->t->nbytes + (srcs[k]->scales ? srcs[k]->scales->nbytes + srcs[k]->biases->nbytes : 0);
    }
    return FORGE_OK;
}

static forge_status forge__plan_weight(forge__loader *L, forge__weight *w, forge__tensor *t, uint32_t rows, uint32_t cols,
                                       const char *why) {
    forge__wsrc src;
    forge_status st = forge__weight_describe(L, w, t, rows, cols, why, &src);
    return st ? st : forge__weight_plan_chunks(L, w, &src, NULL);
}

/* The attention's q, k and v projections as one weight, rows concatenated [q; k; v], so one
 * product fills each token's q|k|v row (one dispatch instead of three); their biases likewise.
 * Falls back to three weights when they are stored differently. */
static forge_status forge__plan_qkv(forge__loader *L, forge__layer *ly, int layer, uint32_t q_dim, uint32_t kv_dim, uint32_t hidden,
                                    const char *why_q, const char *why_kv) {
    forge_model *m = L->m;
    forge_status st = FORGE_OK;
    forge__tensor *t[3];
    forge__weight *w[3] = {&ly->wq, &ly->wk, &ly->wv};
    forge__wsrc src[3];
    uint32_t rows[3] = {q_dim, kv_dim, kv_dim};
    /* Gemma 4's k = v layers have no v_proj: the values are the keys' projection, so the v rows
     * repeat the k rows (the value norm, unlike the key norm, then applies to them) */
    bool k_eq_v = m->cfg.layer_k_eq_v[layer];
    const forge__role roles[3] = {FORGE__R_WQ, FORGE__R_WK, k_eq_v ? FORGE__R_WK : FORGE__R_WV};
    for (int i = 0; i < 3; i++) {
        t[i] = forge__lookup(L, roles[i], layer, true, &st);
        if (st) return st;
        if ((st = forge__weight_describe(L, w[i], t[i], rows[i], hidden, i ? why_kv : why_q, &src[i]))) return st;
    }
    bool same = true;
    for (int i = 1; i < 3; i++)
        same &= w[i]->fmt == w[0]->fmt && w[i]->bits == w[0]->bits && w[i]->group == w[0]->group && w[i]->qflags == w[0]->qflags &&
                t[i]->dtype == t[0]->dtype;
    if (!same) {
        for (int i = 0; i < 3; i++)
            if ((st = forge__weight_plan_chunks(L, w[i], &src[i], NULL))) return st;
        return FORGE_OK;
    }
    forge__weight *f = &ly->wqkv;
    *f = *w[0];
    f->rows = q_dim + 2 * kv_dim;
    ly->fused_qkv = true;
    uint64_t wrow = 0, arow = 0;
    if (f->fmt == FORGE__W_MLX) {
        wrow = (uint64_t)hidden * f->bits / 8;
        arow = (uint64_t)(hidden / f->group) * 2;
    } else {
        forge__row_bytes(t[0]->dtype, hidden, &wrow);
    }
    uint64_t limit = FORGE__MIN(m->dev.caps.max_storage_range, m->dev.caps.max_alloc) - 16;
    uint64_t per_chunk = limit / wrow;
    if (per_chunk == 0)
        return forge__fail(&m->err, FORGE_ERR_LIMIT, "tensor '%s': one row of %llu bytes exceeds the device binding limit", f->name,
                           (unsigned long long)wrow);
    f->n_chunks = (int)((f->rows + per_chunk - 1) / per_chunk);
    f->chunks = (forge__wchunk *)forge__arena_alloc(&m->arena, sizeof *f->chunks * (size_t)f->n_chunks, 16);
    if (!f->chunks) return forge__fail(&m->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    uint32_t starts[4] = {0, q_dim, q_dim + kv_dim, q_dim + 2 * kv_dim};
    for (int c = 0; c < f->n_chunks; c++) {
        forge__wchunk *ch = &f->chunks[c];
        ch->row0 = (uint32_t)(c * per_chunk);
        ch->rows = (uint32_t)FORGE__MIN(per_chunk, f->rows - ch->row0);
        forge__part pw[3], ps[3], pb[3];
        for (int i = 0; i < 3; i++) { /* rows of projection i inside this chunk */
            uint32_t a = FORGE__MAX(ch->row0, starts[i]), b = FORGE__MIN(ch->row0 + ch->rows, starts[i + 1]);
            uint32_t n = b > a ? b - a : 0, r0 = a - starts[i];
            pw[i] = (forge__part){n ? forge__tensor_at(t[i], r0 * wrow) : NULL, n * wrow, NULL, 0};
            if (f->fmt == FORGE__W_MLX) {
                ps[i] = (forge__part){n ? forge__tensor_at(src[i].scales, r0 * arow) : NULL, n * arow, NULL, 0};
                pb[i] = (forge__part){n ? forge__tensor_at(src[i].biases, r0 * arow) : NULL, n * arow, NULL, 0};
            }
        }
        if ((st = forge__upload_parts(L, pw, 3, t[0]->dtype, false, 0, &ch->w))) return st;
        if (f->fmt == FORGE__W_MLX) {
            if ((st = forge__upload_parts(L, ps, 3, src[0].scales->dtype, false, 0, &ch->scales))) return st;
            if ((st = forge__upload_parts(L, pb, 3, src[0].biases->dtype, false, 0, &ch->biases))) return st;
        }
    }
    for (int i = 0; i < (k_eq_v ? 2 : 3); i++) {
        m->n_params += (uint64_t)rows[i] * hidden;
        m->weight_bytes += t[i]->nbytes + (src[i].scales ? src[i].scales->nbytes + src[i].biases->nbytes : 0);
    }
    return FORGE_OK;
}

/* The q, k, v biases (Qwen 2) as one f32 vector [q_dim + 2 kv_dim], matching the fused rows. */
static forge_status forge__plan_qkv_bias(forge__loader *L, forge__layer *ly, int layer, uint32_t q_dim, uint32_t kv_dim) {
    forge_model *m = L->m;
    forge_status st = FORGE_OK;
    const forge__role roles[3] = {FORGE__R_BQ, FORGE__R_BK, FORGE__R_BV};
    uint32_t n[3] = {q_dim, kv_dim, kv_dim};
    forge__part parts[3];
    forge__dtype dt = FORGE__F32;
    for (int i = 0; i < 3; i++) {
        forge__tensor *t = forge__lookup(L, roles[i], layer, true, &st);
        if (st) return st;
        if ((st = forge__expect_shape(m, t, 1, n[i], 0, "q, k and v sizes"))) return st;
        if (t->dtype != FORGE__F32 && t->dtype != FORGE__F16 && t->dtype != FORGE__BF16)
            return forge__fail(&m->err, FORGE_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; forge reads vectors in f32, f16 or bf16",
                               t->file, t->name, forge__dtype_name(t->dtype));
        if (i && t->dtype != dt)
            return forge__fail(&m->err, FORGE_ERR_MODEL, "%s: the q, k and v biases must share one dtype ('%s' is %s)", t->file, t->name,
                               forge__dtype_name(t->dtype));
        dt = t->dtype;
        parts[i] = (forge__part){t->data, 4ull * n[i], NULL, 0};
        m->n_params += n[i];
        m->weight_bytes += 4ull * n[i];
    }
    ly->bqkv = (forge__vec){.n = q_dim + 2 * kv_dim, .present = true};
    return forge__upload_parts(L, parts, 3, dt, true, 0, &ly->bqkv.r);
}

/* The MLP's gate and up projections as one weight with their rows interleaved, so a single
 * kernel computes act(gate) * up (decode) or both products at once (prefill). Falls back to
 * two weights when the two are stored differently. */
static forge_status forge__plan_gate_up(forge__loader *L, forge__layer *ly, int layer, uint32_t ffn, uint32_t hidden, const char *why) {
    forge_status st = FORGE_OK;
    forge__tensor *tg = forge__lookup(L, FORGE__R_GATE, layer, true, &st);
    if (st) return st;
    forge__tensor *tu = forge__lookup(L, FORGE__R_UP, layer, true, &st);
    if (st) return st;
    forge__wsrc sg, su;
    if ((st = forge__weight_describe(L, &ly->gate, tg, ffn, hidden, why, &sg))) return st;
    if ((st = forge__weight_describe(L, &ly->up, tu, ffn, hidden, why, &su))) return st;
    if (ly->gate.fmt != ly->up.fmt || ly->gate.bits != ly->up.bits || ly->gate.group != ly->up.group || ly->gate.qflags != ly->up.qflags ||
        tg->dtype != tu->dtype) {
        if ((st = forge__weight_plan_chunks(L, &ly->gate, &sg, NULL))) return st;
        return forge__weight_plan_chunks(L, &ly->up, &su, NULL);
    }
    ly->gate_up = ly->gate;
    ly->gate_up.rows = 2 * ffn;
    ly->fused_gate_up = true;
    return forge__weight_plan_chunks(L, &ly->gate_up, &sg, &su);
}

/* Plans an f32 vector from an f32/f16/bf16 tensor of n elements, adding `add` to each. */
static forge_status forge__plan_vec(forge__loader *L, forge__vec *v, forge__tensor *t, uint32_t n, float add, const char *why) {
    forge_model *m = L->m;
    forge_status st = forge__expect_shape(m, t, 1, n, 0, why);
    if (st) return st;
    if (t->dtype != FORGE__F32 && t->dtype != FORGE__F16 && t->dtype != FORGE__BF16)
        return forge__fail(&m->err, FORGE_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; forge reads vectors in f32, f16 or bf16",
                           t->file, t->name, forge__dtype_name(t->dtype));
    v->n = n;
    v->present = true;
    m->n_params += n;
    m->weight_bytes += 4ull * n;
    return forge__upload_add(L, t->data, 4ull * n, t->dtype, true, add, &v->r);
}

/* The same, each element times `scale` (a constant of the forward pass folded into a weight). */
static forge_status forge__plan_vec_scaled(forge__loader *L, forge__vec *v, forge__tensor *t, uint32_t n, float scale, const char *why) {
    forge_status st = forge__plan_vec(L, v, t, n, 0, why);
    if (!st) L->ups[L->n_ups - 1].scale = scale;
    return st;
}

/* A one-element f32/f16/bf16 tensor's value, read on the host (Gemma 4's layer_scalar); 1 when
 * its bytes are not mapped (discovery reads headers only). */
static forge_status forge__read_scalar(forge_model *m, const forge__tensor *t, float *out) {
    if (forge__tensor_elements(t) != 1 || (t->dtype != FORGE__F32 && t->dtype != FORGE__F16 && t->dtype != FORGE__BF16))
        return forge__fail(&m->err, FORGE_ERR_MODEL, "%s: tensor '%s' must be one f32, f16 or bf16 value", t->file, t->name);
    *out = 1.0f;
    if (!t->data) return FORGE_OK;
    if (t->dtype == FORGE__F32) {
        memcpy(out, t->data, 4);
    } else {
        uint16_t h;
        memcpy(&h, t->data, 2);
        *out = t->dtype == FORGE__F16 ? forge__f16_to_f32(h) : forge__bf16_to_f32(h);
    }
    if (!isfinite(*out)) return forge__fail(&m->err, FORGE_ERR_MODEL, "%s: tensor '%s' is not finite", t->file, t->name);
    return FORGE_OK;
}

static forge_status forge__plan_vec_role(forge__loader *L, forge__vec *v, forge__role role, int layer, uint32_t n,
                                         bool required, float add, const char *why) {
    forge_status st = FORGE_OK;
    forge__tensor *t = forge__lookup(L, role, layer, required, &st);
    if (st || !t) return st;
    return forge__plan_vec(L, v, t, n, add, why);
}

static forge_status forge__plan_weight_role(forge__loader *L, forge__weight *w, forge__role role, int layer, uint32_t rows,
                                            uint32_t cols, const char *why) {
    forge_status st = FORGE_OK;
    forge__tensor *t = forge__lookup(L, role, layer, true, &st);
    if (st) return st;
    return forge__plan_weight(L, w, t, rows, cols, why);
}

/* ---- Weights made of row runs: fused projections, rows permuted at load ---- */

/* Rows [row0, row0 + rows) of a described source weight. */
typedef struct forge__run {
    const forge__wsrc *src;
    uint32_t row0, rows;
} forge__run;

/* Plans w [sum of the runs' rows, w->cols] (described like its sources: one format) as the runs'
 * rows in order, split into row-chunks that fit one binding; a chunk's rows come from as many
 * runs as it crosses, copied one after the other into its range. */
static forge_status forge__plan_runs(forge__loader *L, forge__weight *w, const forge__run *runs, int n_runs) {
    forge_model *m = L->m;
    forge_status st = FORGE_OK;
    uint64_t wrow = 0, arow = 0;
    if (w->fmt == FORGE__W_MLX) {
        wrow = (uint64_t)w->cols * w->bits / 8;
        arow = (uint64_t)(w->cols / w->group) * 2;
    } else {
        forge__row_bytes(runs[0].src->t->dtype, w->cols, &wrow);
    }
    w->rows = 0;
    for (int i = 0; i < n_runs; i++) w->rows += runs[i].rows;
    uint64_t limit = FORGE__MIN(m->dev.caps.max_storage_range, m->dev.caps.max_alloc) - 16;
    uint64_t per_chunk = limit / wrow;
    if (per_chunk == 0)
        return forge__fail(&m->err, FORGE_ERR_LIMIT, "tensor '%s': one row of %llu bytes exceeds the device binding limit", w->name,
                           (unsigned long long)wrow);
    w->n_chunks = (int)((w->rows + per_chunk - 1) / per_chunk);
    w->chunks = (forge__wchunk *)forge__arena_alloc(&m->arena, sizeof *w->chunks * (size_t)w->n_chunks, 16);
    forge__part *pw = (forge__part *)calloc(3 * (size_t)n_runs, sizeof *pw), *ps = pw + n_runs, *pb = ps + n_runs;
    if (!w->chunks || !pw) {
        free(pw);
        return forge__fail(&m->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    for (int c = 0; c < w->n_chunks && !st; c++) {
        forge__wchunk *ch = &w->chunks[c];
        ch->row0 = (uint32_t)(c * per_chunk);
        ch->rows = (uint32_t)FORGE__MIN(per_chunk, w->rows - ch->row0);
        uint32_t start = 0;
        for (int i = 0; i < n_runs; i++) { /* the rows of run i inside this chunk */
            uint32_t a = FORGE__MAX(ch->row0, start), b = FORGE__MIN(ch->row0 + ch->rows, start + runs[i].rows);
            uint32_t n = b > a ? b - a : 0, r0 = runs[i].row0 + (a - start);
            const forge__wsrc *src = runs[i].src;
            pw[i] = (forge__part){n ? forge__tensor_at(src->t, r0 * wrow) : NULL, n * wrow, NULL, 0};
            if (w->fmt == FORGE__W_MLX) {
                ps[i] = (forge__part){n ? forge__tensor_at(src->scales, r0 * arow) : NULL, n * arow, NULL, 0};
                pb[i] = (forge__part){n ? forge__tensor_at(src->biases, r0 * arow) : NULL, n * arow, NULL, 0};
            }
            start += runs[i].rows;
        }
        st = forge__upload_parts(L, pw, n_runs, runs[0].src->t->dtype, false, 0, &ch->w);
        if (!st && w->fmt == FORGE__W_MLX) st = forge__upload_parts(L, ps, n_runs, runs[0].src->scales->dtype, false, 0, &ch->scales);
        if (!st && w->fmt == FORGE__W_MLX) st = forge__upload_parts(L, pb, n_runs, runs[0].src->biases->dtype, false, 0, &ch->biases);
    }
    free(pw);
    return st;
}

/* Whether described weights can be one fused weight: one format, bits, group and dtype. */
static bool forge__same_storage(const forge__weight *a, const forge__tensor *ta, const forge__weight *b, const forge__tensor *tb) {
    return a->fmt == b->fmt && a->bits == b->bits && a->group == b->group && a->qflags == b->qflags && ta->dtype == tb->dtype;
}

/* Counts a source tensor (and its MLX scales and biases) in the model's parameters and bytes. */
static void forge__count_weight(forge_model *m, const forge__wsrc *src, uint64_t rows, uint64_t cols) {
    m->n_params += rows * cols;
    m->weight_bytes += src->t->nbytes + (src->scales ? src->scales->nbytes + src->biases->nbytes : 0);
}

/* Qwen 3.5's partial RoPE (FORGE__ROPE_PARTIAL): the order forge keeps a head's D dims in, as
 * runs of HF's dims, [0, R/2), [R, R + (D - R)/2), [R/2, R), [R + (D - R)/2, D), which puts
 * HF's rotated pairs (i, i + R/2) at forge's (i, i + D/2) and the dims RoPE leaves alone at the
 * pairs past R/2 (rotated by no angle). Attention is unchanged: q and k are permuted alike.
 * Writes the runs' first dims and lengths (4; empty ones included). */
static void forge__rope_perm_runs(uint32_t D, uint32_t R, uint32_t first[4], uint32_t len[4]) {
    uint32_t rest = (D - R) / 2;
    first[0] = 0, len[0] = R / 2;
    first[1] = R, len[1] = rest;
    first[2] = R / 2, len[2] = R / 2;
    first[3] = R + rest, len[3] = D - R - rest;
}
/* The rotated dims of a head: all of them but under PARTIAL. */
static uint32_t forge__rope_dims(const forge__config *c, uint32_t D) {
    return c->rope_full.scaling == FORGE__ROPE_PARTIAL ? (uint32_t)(D * c->rope_full.partial) : D;
}

/* A per-head vector [D] (q_norm, k_norm) in forge's dim order (forge__rope_perm_runs). */
static forge_status forge__plan_head_vec(forge__loader *L, forge__vec *v, forge__role role, int layer, uint32_t D, float add, const char *why) {
    forge_model *m = L->m;
    forge_status st = FORGE_OK;
    forge__tensor *t = forge__lookup(L, role, layer, true, &st);
    if (st) return st;
    if ((st = forge__expect_shape(m, t, 1, D, 0, why))) return st;
    if (t->dtype != FORGE__F32 && t->dtype != FORGE__F16 && t->dtype != FORGE__BF16)
        return forge__fail(&m->err, FORGE_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; forge reads vectors in f32, f16 or bf16", t->file,
                           t->name, forge__dtype_name(t->dtype));
    uint32_t first[4], len[4], esz = forge__dtype_info(t->dtype).block_bytes;
    forge__rope_perm_runs(D, forge__rope_dims(&m->cfg, D), first, len);
    forge__part parts[4];
    for (int i = 0; i < 4; i++) parts[i] = (forge__part){t->data ? t->data + (uint64_t)first[i] * esz : NULL, 4ull * len[i], NULL, 0};
    *v = (forge__vec){.n = D, .present = true};
    m->n_params += D;
    m->weight_bytes += 4ull * D;
    return forge__upload_parts(L, parts, 4, t->dtype, true, add, &v->r);
}

/* Qwen 3.5's full attention as one weight, rows [q | k | v | gate] (the q|k|v row forward.c reads,
 * then each head's output gate): q_proj holds per head its query rows and then its gate rows;
 * the query and key rows of every head in forge's dim order (forge__rope_perm_runs). */
static forge_status forge__plan_qkv_gated(forge__loader *L, forge__layer *ly, int layer, uint32_t H, const char *why_q, const char *why_kv) {
    forge_model *m = L->m;
    const forge__config *c = &m->cfg;
    uint32_t D = forge__hd(c, layer), NH = (uint32_t)c->n_heads, NKV = forge__nkv(c, layer);
    forge_status st = FORGE_OK;
    forge__tensor *t[3];
    forge__weight w[3];
    forge__wsrc src[3];
    const forge__role roles[3] = {FORGE__R_WQ, FORGE__R_WK, FORGE__R_WV};
    const uint32_t rows[3] = {2 * NH * D, NKV * D, NKV * D};
    for (int i = 0; i < 3; i++) {
        if (!(t[i] = forge__lookup(L, roles[i], layer, true, &st))) return st;
        if ((st = forge__weight_describe(L, &w[i], t[i], rows[i], H, i ? why_kv : why_q, &src[i]))) return st;
        if (i && !forge__same_storage(&w[0], t[0], &w[i], t[i]))
            return forge__fail(&m->err, FORGE_ERR_UNSUPPORTED, "%s: layer %d's q, k and v projections are stored in different formats ('%s' is %s)",
                               t[i]->file, layer, t[i]->name, forge__dtype_name(t[i]->dtype));
    }
    uint32_t first[4], len[4];
    forge__rope_perm_runs(D, forge__rope_dims(c, D), first, len);
    int n_runs = 0;
    forge__run *runs = (forge__run *)calloc(4 * NH + 4 * NKV + 1 + NH, sizeof *runs);
    if (!runs) return forge__fail(&m->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (uint32_t h = 0; h < NH; h++)
        for (int r = 0; r < 4; r++) runs[n_runs++] = (forge__run){&src[0], h * 2 * D + first[r], len[r]};
    for (uint32_t h = 0; h < NKV; h++)
        for (int r = 0; r < 4; r++) runs[n_runs++] = (forge__run){&src[1], h * D + first[r], len[r]};
    runs[n_runs++] = (forge__run){&src[2], 0, NKV * D};
    for (uint32_t h = 0; h < NH; h++) runs[n_runs++] = (forge__run){&src[0], h * 2 * D + D, D};
    ly->wqkv = w[0];
    ly->fused_qkv = true;
    st = forge__plan_runs(L, &ly->wqkv, runs, n_runs);
    free(runs);
    for (int i = 0; i < 3 && !st; i++) forge__count_weight(m, &src[i], rows[i], H);
    return st;
}

/* A small f32 vector computed on the host (arena) and uploaded. */
static forge_status forge__plan_host_vec(forge__loader *L, forge__vec *v, const float *values, uint32_t n) {
    forge_model *m = L->m;
    float *copy = (float *)forge__arena_alloc(&m->arena, 4ull * n, 16);
    if (!copy) return forge__fail(&m->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    memcpy(copy, values, 4ull * n);
    *v = (forge__vec){.n = n, .present = true};
    return forge__upload_add(L, (const uint8_t *)copy, 4ull * n, FORGE__F32, true, 0, &v->r);
}

/* One element of an f32 / f16 / bf16 tensor, as f32. */
static float forge__tensor_f32(const forge__tensor *t, uint64_t i) {
    if (t->dtype == FORGE__F32) {
        float v;
        memcpy(&v, t->data + 4 * i, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, t->data + 2 * i, 2);
    return t->dtype == FORGE__F16 ? forge__f16_to_f32(h) : forge__bf16_to_f32(h);
}

/* Qwen 3.5's linear-attention (Gated DeltaNet) layer: the four in-projections (one weight when
 * stored alike: rows [q|k|v (conv_dim) | z (VD) | b (NV) | a (NV)]), the convolution's taps, the
 * decay's rate -exp(A_log) (GGUF stores it so), dt_bias, the gated norm's weight, out_proj. */
static forge_status forge__plan_linear(forge__loader *L, forge__layer *ly, int l, uint32_t H) {
    forge_model *m = L->m;
    const forge__config *c = &m->cfg;
    uint32_t CD = forge__lin_conv_dim(c), VD = forge__lin_v_dim(c), NV = (uint32_t)c->lin_v_heads, K = (uint32_t)c->lin_conv;
    forge_status st = FORGE_OK;
    char why[160];
    snprintf(why, sizeof why, "linear attention: %d key heads x %d, %d value heads x %d, hidden %u", c->lin_k_heads, c->lin_k_dim, c->lin_v_heads,
             c->lin_v_dim, H);
    const forge__role roles[4] = {FORGE__R_LIN_QKV, FORGE__R_LIN_Z, FORGE__R_LIN_B, FORGE__R_LIN_A};
    const uint32_t rows[4] = {CD, VD, NV, NV};
    forge__weight *ws[4] = {&ly->lin_qkv, &ly->lin_z, &ly->lin_b, &ly->lin_a};
    forge__tensor *t[4];
    forge__wsrc src[4];
    bool same = true;
    for (int i = 0; i < 4; i++) {
        if (!(t[i] = forge__lookup(L, roles[i], l, true, &st))) return st;
        if ((st = forge__weight_describe(L, ws[i], t[i], rows[i], H, why, &src[i]))) return st;
        same &= !i || forge__same_storage(ws[0], t[0], ws[i], t[i]);
    }
    if (same) {
        forge__run runs[4];
        for (int i = 0; i < 4; i++) runs[i] = (forge__run){&src[i], 0, rows[i]};
        ly->lin_in = *ws[0];
        ly->fused_lin = true;
        if ((st = forge__plan_runs(L, &ly->lin_in, runs, 4))) return st;
        for (int i = 0; i < 4; i++) forge__count_weight(m, &src[i], rows[i], H);
    } else {
        for (int i = 0; i < 4; i++)
            if ((st = forge__weight_plan_chunks(L, ws[i], &src[i], NULL))) return st;
    }
    /* the convolution's taps: HF's conv1d weight [conv_dim, 1, K] (GGUF: [conv_dim, K]; mlx-lm: [conv_dim, K, 1]) as
     * [conv_dim, K] f32 */
    forge__tensor *tc = forge__lookup(L, FORGE__R_LIN_CONV, l, true, &st);
    if (!tc) return st;
    bool conv_shape = tc->shape[0] == CD && ((tc->n_dims == 3 && ((tc->shape[1] == 1 && tc->shape[2] == K) || (tc->shape[1] == K && tc->shape[2] == 1))) ||
                                             (tc->n_dims == 2 && tc->shape[1] == K));
    if (!conv_shape || (tc->dtype != FORGE__F32 && tc->dtype != FORGE__F16 && tc->dtype != FORGE__BF16)) {
        char got[96];
        forge__shape_str(tc, got, sizeof got);
        return forge__fail(&m->err, FORGE_ERR_MODEL, "%s: tensor '%s' is %s %s but the config (%s, conv kernel %u) needs f32/f16/bf16 [%u, 1, %u]",
                           tc->file, tc->name, forge__dtype_name(tc->dtype), got, why, K, CD, K);
    }
    ly->conv_w = (forge__vec){.n = CD * K, .present = true};
    m->n_params += (uint64_t)CD * K;
    m->weight_bytes += 4ull * CD * K;
    if ((st = forge__upload_add(L, tc->data, 4ull * CD * K, tc->dtype, true, 0, &ly->conv_w.r))) return st;
    char why_v[64];
    snprintf(why_v, sizeof why_v, "%u value heads", NV);
    if ((st = forge__plan_vec_role(L, &ly->dt_bias, FORGE__R_LIN_DT, l, NV, true, 0, why_v))) return st;
    forge__tensor *ta = forge__lookup(L, FORGE__R_LIN_ALOG, l, true, &st);
    if (!ta) return st;
    if ((st = forge__expect_shape(m, ta, 1, NV, 0, why_v))) return st;
    if (ta->dtype != FORGE__F32 && ta->dtype != FORGE__F16 && ta->dtype != FORGE__BF16)
        return forge__fail(&m->err, FORGE_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; forge reads vectors in f32, f16 or bf16", ta->file, ta->name,
                           forge__dtype_name(ta->dtype));
    if (ta->data) { /* (discovery plans without the data) */
        float neg_a[FORGE__MAX_LINEAR_VALUE_HEADS];
        if (NV > FORGE__MAX_LINEAR_VALUE_HEADS)
            return forge__fail(&m->err, FORGE_ERR_UNSUPPORTED, "%u linear value heads (forge supports up to %d)", NV, FORGE__MAX_LINEAR_VALUE_HEADS);
        for (uint32_t h = 0; h < NV; h++) {
            float a = forge__tensor_f32(ta, h);
            neg_a[h] = L->gguf ? a : -expf(a); /* GGUF's ssm_a is -exp(A_log) already */
        }
        if ((st = forge__plan_host_vec(L, &ly->lin_neg_a, neg_a, NV))) return st;
    } else {
        ly->lin_neg_a = (forge__vec){.n = NV, .present = true};
        if ((st = forge__upload_add(L, NULL, 4ull * NV, FORGE__F32, true, 0, &ly->lin_neg_a.r))) return st;
    }
    m->n_params += NV;
    m->weight_bytes += ta->nbytes;
    snprintf(why_v, sizeof why_v, "linear value head dim %d", c->lin_v_dim);
    if ((st = forge__plan_vec_role(L, &ly->lin_norm, FORGE__R_LIN_NORM, l, (uint32_t)c->lin_v_dim, true, 0, why_v))) return st;
    char why_o[128];
    snprintf(why_o, sizeof why_o, "hidden %u, %u value heads x %d", H, NV, c->lin_v_dim);
    return forge__plan_weight_role(L, &ly->wo, FORGE__R_LIN_OUT, l, H, VD, why_o);
}

/* ---- Mixture-of-experts weights ----
 * A layer's experts become two weights whose rows hold one expert after another: gate|up
 * [E * 2 moe_ffn, hidden] (each expert's gate and up rows interleaved, as gate_up) and down
 * [E * hidden, moe_ffn]. Row-chunks hold whole experts, so a kernel bound to one chunk finds
 * expert e at row (e - e0) * rows_per_expert (e0 the chunk's first). Checkpoints store them
 * as fused 3-D tensors (transformers 5's `experts.gate_up_proj` [E, 2I, H] and
 * `experts.down_proj` [E, H, I], llama.cpp's `ffn_gate_up_exps`), separate 3-D tensors
 * (mlx-lm's `switch_mlp.gate_proj` [E, I, H], llama.cpp's `ffn_gate_exps`), or one 2-D tensor
 * per expert (`experts.<e>.gate_proj`, the published Qwen3-MoE checkpoints); all are read in
 * place from the mapping. */

/* Rows from row0 of one expert's projection in a described tensor. */
typedef struct forge__xpart {
    forge__wsrc src;
    uint64_t row0;
} forge__xpart;

/* A 3-D tensor [E, R, C] seen as the 2-D [E * R, C] of the same bytes (the weight planner's
 * view); false when it is not 3-D with E outer rows. */
static bool forge__flatten_experts(forge__tensor *t, int64_t E) {
    if (!t || t->n_dims != 3 || t->shape[0] != E) return false;
    t->shape[0] = E * t->shape[1];
    t->shape[1] = t->shape[2];
    t->shape[2] = 0;
    t->n_dims = 2;
    return true;
}

/* Finds and describes the expert tensor `name` as [E * R, C] (flattening it and, for MLX
 * affine, its scales and biases); NULL with *st untouched when there is no such tensor. */
static forge__tensor *forge__expert_tensor(forge__loader *L, const char *name, int E, uint32_t R, uint32_t C, const char *why,
                                           forge__weight *desc, forge__wsrc *src, forge_status *st) {
    forge_model *m = L->m;
    forge__tensor *t = forge__tensor_find(&m->tensors, name);
    if (!t) return NULL;
    t->used = true;
    if (t->n_dims == 3 && !forge__flatten_experts(t, E)) {
        *st = forge__fail(&m->err, FORGE_ERR_MODEL, "%s: expert tensor '%s' has %lld experts; the config has %d", t->file, t->name,
                          (long long)t->shape[0], E);
        return NULL;
    }
    if (forge__ends_with(name, ".weight")) { /* MLX affine: the scales and biases are [E, R, C / group] too */
        char aux[512];
        size_t plen = strlen(name) - 7;
        for (int k = 0; k < 2; k++) {
            snprintf(aux, sizeof aux, "%.*s.%s", (int)plen, name, k ? "biases" : "scales");
            forge__tensor *a = forge__tensor_find(&m->tensors, aux);
            if (a && a->n_dims == 3) forge__flatten_experts(a, E);
        }
    }
    *st = forge__weight_describe(L, desc, t, (uint32_t)E * R, C, why, src);
    return *st ? NULL : t;
}

/* Plans the uploads of an expert weight of E experts of R rows each: rows R from a[e] (or,
 * with b, R / 2 rows each of a[e] and b[e] interleaved). desc: the format they share. */
static forge_status forge__plan_expert_weight(forge__loader *L, forge__weight *w, const forge__weight *desc, int E, uint32_t R,
                                              const forge__xpart *a, const forge__xpart *b) {
    forge_model *m = L->m;
    forge_status st;
    *w = *desc;
    w->rows = (uint32_t)E * R;
    uint64_t wrow = 0, arow = 0;
    bool mlx = w->fmt == FORGE__W_MLX;
    if (mlx) {
        wrow = (uint64_t)w->cols * w->bits / 8;
        arow = (uint64_t)(w->cols / w->group) * 2;
    } else {
        forge__row_bytes(a[0].src.t->dtype, w->cols, &wrow);
    }
    uint64_t limit = FORGE__MIN(m->dev.caps.max_storage_range, m->dev.caps.max_alloc) - 16;
    uint64_t per_chunk = limit / (R * wrow); /* experts per chunk (each binding: the codes are the widest) */
    if (per_chunk == 0)
        return forge__fail(&m->err, FORGE_ERR_LIMIT, "tensor '%s': one expert's %u rows of %llu bytes exceed the device binding limit of %llu bytes",
                           w->name, R, (unsigned long long)wrow, (unsigned long long)limit);
    w->n_chunks = (int)((E + per_chunk - 1) / per_chunk);
    w->chunks = (forge__wchunk *)forge__arena_alloc(&m->arena, sizeof *w->chunks * (size_t)w->n_chunks, 16);
    forge__part *pw = (forge__part *)malloc(sizeof *pw * 3 * (size_t)E);
    if (!w->chunks || !pw) {
        free(pw);
        return forge__fail(&m->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    forge__part *ps = pw + E, *pb = pw + 2 * E;
    st = FORGE_OK;
    for (int c = 0; c < w->n_chunks && !st; c++) {
        int e0 = (int)(c * per_chunk), e1 = (int)FORGE__MIN((uint64_t)E, (c + 1) * per_chunk);
        forge__wchunk *ch = &w->chunks[c];
        ch->row0 = (uint32_t)e0 * R;
        ch->rows = (uint32_t)(e1 - e0) * R;
        for (int e = e0; e < e1; e++) {
            const forge__xpart *x = &a[e], *y = b ? &b[e] : NULL;
            uint64_t n = b ? R / 2 : R;
            pw[e - e0] = (forge__part){forge__tensor_at(x->src.t, x->row0 * wrow), n * wrow * (b ? 2 : 1),
                                       y ? forge__tensor_at(y->src.t, y->row0 * wrow) : NULL, y ? wrow : 0};
            if (mlx) {
                ps[e - e0] = (forge__part){forge__tensor_at(x->src.scales, x->row0 * arow), n * arow * (b ? 2 : 1),
                                           y ? forge__tensor_at(y->src.scales, y->row0 * arow) : NULL, y ? arow : 0};
                pb[e - e0] = (forge__part){forge__tensor_at(x->src.biases, x->row0 * arow), n * arow * (b ? 2 : 1),
                                           y ? forge__tensor_at(y->src.biases, y->row0 * arow) : NULL, y ? arow : 0};
            }
        }
        st = forge__upload_parts(L, pw, e1 - e0, a[0].src.t->dtype, false, 0, &ch->w);
        if (!st && mlx) st = forge__upload_parts(L, ps, e1 - e0, a[0].src.scales->dtype, false, 0, &ch->scales);
        if (!st && mlx) st = forge__upload_parts(L, pb, e1 - e0, a[0].src.biases->dtype, false, 0, &ch->biases);
    }
    free(pw);
    m->n_params += (uint64_t)E * R * w->cols;
    m->weight_bytes += (uint64_t)E * R * (wrow + 2 * arow);
    return st;
}

/* Expert e's own 2-D tensor `<base>experts.<e>.<proj>_proj.weight` [rows, cols] (the published
 * Qwen3-MoE checkpoints' layout) into *x. *first: expert 0's description (set when e = 0), which
 * every other expert's must equal, as its tensor type must x0's. */
static forge_status forge__expert_own_tensor(forge__loader *L, const char *base, int l, int e, const char *proj, uint32_t rows, uint32_t cols,
                                             const char *why, forge__weight *first, const forge__xpart *x0, forge__xpart *x) {
    forge_model *m = L->m;
    char name[256];
    snprintf(name, sizeof name, "%sexperts.%d.%s_proj.weight", base, e, proj);
    forge__tensor *t = forge__tensor_find(&m->tensors, name);
    if (!t)
        return forge__fail(&m->err, FORGE_ERR_MODEL, "tensor '%s' is missing (architecture %s: the experts of layer %d)", name,
                           forge__arch_names[m->cfg.arch], l);
    t->used = true;
    forge__weight w;
    forge__wsrc src;
    forge_status st = forge__weight_describe(L, &w, t, rows, cols, why, &src);
    if (st) return st;
    *x = (forge__xpart){src, 0};
    if (e == 0) {
        *first = w;
        return FORGE_OK;
    }
    if (w.fmt != first->fmt || w.bits != first->bits || w.group != first->group || w.qflags != first->qflags || t->dtype != x0->src.t->dtype)
        return forge__fail(&m->err, FORGE_ERR_UNSUPPORTED, "%s: expert tensor '%s' is stored unlike expert 0's %s projection", t->file, t->name,
                           proj);
    return FORGE_OK;
}

/* Layer l's experts: gate|up and down from whichever layout the checkpoint has (above). */
static forge_status forge__plan_experts(forge__loader *L, forge__layer *ly, int l) {
    forge_model *m = L->m;
    const forge__config *c = &m->cfg;
    const int E = c->n_experts;
    const uint32_t I = (uint32_t)c->moe_ffn, H = (uint32_t)c->hidden;
    forge_status st = FORGE_OK;
    char base[96], name[256], why_gu[128], why_d[128];
    /* where the experts sit: Qwen3-MoE under mlp., Gemma 4 beside the dense mlp */
    bool under_mlp = c->arch == FORGE__ARCH_QWEN3MOE || c->arch == FORGE__ARCH_QWEN35MOE;
    snprintf(base, sizeof base, under_mlp ? "model.layers.%d.mlp." : "model.layers.%d.", l);
    snprintf(why_gu, sizeof why_gu, "%d experts x expert intermediate %u, hidden %u", E, I, H);
    snprintf(why_d, sizeof why_d, "%d experts x hidden %u, expert intermediate %u", E, H, I);
    forge__xpart *parts = (forge__xpart *)calloc(3 * (size_t)E, sizeof *parts);
    if (!parts) return forge__fail(&m->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    forge__xpart *gate = parts, *up = parts + E, *down = parts + 2 * E;
    forge__weight dg, du, dd;
    forge__wsrc sg, su, sd;
    const char *mlx_dir = under_mlp ? "switch_mlp" : "experts.switch_glu";
    /* gate and up: fused 3-D, separate 3-D, or per expert */
    if (L->gguf) snprintf(name, sizeof name, "blk.%d.ffn_gate_up_exps.weight", l);
    else snprintf(name, sizeof name, "%sexperts.gate_up_proj", base);
    forge__tensor *t = forge__expert_tensor(L, name, E, 2 * I, H, why_gu, &dg, &sg, &st);
    if (t) {
        du = dg;
        for (int e = 0; e < E; e++) {
            gate[e] = (forge__xpart){sg, (uint64_t)e * 2 * I};
            up[e] = (forge__xpart){sg, (uint64_t)e * 2 * I + I};
        }
    } else if (!st) {
        char nu[256];
        if (L->gguf) {
            snprintf(name, sizeof name, "blk.%d.ffn_gate_exps.weight", l);
            snprintf(nu, sizeof nu, "blk.%d.ffn_up_exps.weight", l);
        } else {
            snprintf(name, sizeof name, "%s%s.gate_proj.weight", base, mlx_dir);
            snprintf(nu, sizeof nu, "%s%s.up_proj.weight", base, mlx_dir);
        }
        t = forge__expert_tensor(L, name, E, I, H, why_gu, &dg, &sg, &st);
        forge__tensor *tu = t ? forge__expert_tensor(L, nu, E, I, H, why_gu, &du, &su, &st) : NULL;
        if (t && tu) {
            for (int e = 0; e < E; e++) {
                gate[e] = (forge__xpart){sg, (uint64_t)e * I};
                up[e] = (forge__xpart){su, (uint64_t)e * I};
            }
        } else if (!st && t) {
            st = forge__fail(&m->err, FORGE_ERR_MODEL, "tensor '%s' is missing beside '%s'", nu, name);
        } else if (!st && !L->gguf) { /* one tensor per expert */
            for (int e = 0; e < E && !st; e++) {
                st = forge__expert_own_tensor(L, base, l, e, "gate", I, H, why_gu, &dg, &gate[0], &gate[e]);
                if (!st) st = forge__expert_own_tensor(L, base, l, e, "up", I, H, why_gu, &du, &up[0], &up[e]);
            }
        } else if (!st) {
            st = forge__fail(&m->err, FORGE_ERR_MODEL, "tensor '%s' (or blk.%d.ffn_gate_up_exps.weight) is missing (architecture %s)", name, l,
                             forge__arch_names[c->arch]);
        }
    }
    if (!st && (dg.fmt != du.fmt || dg.bits != du.bits || dg.group != du.group || dg.qflags != du.qflags ||
                gate[0].src.t->dtype != up[0].src.t->dtype))
        st = forge__fail(&m->err, FORGE_ERR_UNSUPPORTED, "layer %d: the experts' gate and up projections are stored in different formats", l);
    if (!st) {
        dg.name = gate[0].src.t->name;
        st = forge__plan_expert_weight(L, &ly->exp_gate_up, &dg, E, 2 * I, gate, up);
    }
    /* down: 3-D or per expert */
    if (!st) {
        if (L->gguf) snprintf(name, sizeof name, "blk.%d.ffn_down_exps.weight", l);
        else snprintf(name, sizeof name, "%sexperts.down_proj", base);
        t = forge__expert_tensor(L, name, E, H, I, why_d, &dd, &sd, &st);
        if (!t && !st && !L->gguf) {
            snprintf(name, sizeof name, "%s%s.down_proj.weight", base, mlx_dir);
            t = forge__expert_tensor(L, name, E, H, I, why_d, &dd, &sd, &st);
        }
        if (t) {
            for (int e = 0; e < E; e++) down[e] = (forge__xpart){sd, (uint64_t)e * H};
        } else if (!st && !L->gguf) { /* one tensor per expert */
            for (int e = 0; e < E && !st; e++) st = forge__expert_own_tensor(L, base, l, e, "down", H, I, why_d, &dd, &down[0], &down[e]);
        } else if (!st) {
            st = forge__fail(&m->err, FORGE_ERR_MODEL, "tensor '%s' is missing (architecture %s)", name, forge__arch_names[c->arch]);
        }
        if (!st) {
            dd.name = down[0].src.t->name;
            st = forge__plan_expert_weight(L, &ly->exp_down, &dd, E, H, down, NULL);
        }
    }
    free(parts);
    if (st) return st;
    /* the router */
    if (L->gguf) snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", l);
    else snprintf(name, sizeof name, c->router == FORGE__ROUTER_GEMMA4 ? "%srouter.proj.weight" : "%sgate.weight", base);
    forge__tensor *tr = forge__tensor_find(&m->tensors, name);
    if (!tr) return forge__fail(&m->err, FORGE_ERR_MODEL, "tensor '%s' is missing (architecture %s: layer %d's router)", name,
                                forge__arch_names[c->arch], l);
    tr->used = true;
    char why_r[96];
    snprintf(why_r, sizeof why_r, "%d experts, hidden %u", E, H);
    if ((st = forge__plan_weight(L, &ly->router, tr, (uint32_t)E, H, why_r))) return st;
    if (c->router == FORGE__ROUTER_GEMMA4) {
        /* the router reads rmsnorm(x) * scale * hidden^-0.5: one norm weight; per_expert_scale scales the chosen weights */
        char why_h[64], why_e[64];
        snprintf(why_h, sizeof why_h, "hidden %u", H);
        snprintf(why_e, sizeof why_e, "%d experts", E);
        if (L->gguf) snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.scale", l);
        else snprintf(name, sizeof name, "%srouter.scale", base);
        forge__tensor *ts = forge__tensor_find(&m->tensors, name);
        if (!ts) return forge__fail(&m->err, FORGE_ERR_MODEL, "tensor '%s' is missing (architecture %s)", name, forge__arch_names[c->arch]);
        ts->used = true;
        if ((st = forge__plan_vec_scaled(L, &ly->router_norm, ts, H, (float)(1.0 / sqrt((double)H)), why_h))) return st;
        if (L->gguf) snprintf(name, sizeof name, "blk.%d.ffn_down_exps.scale", l);
        else snprintf(name, sizeof name, "%srouter.per_expert_scale", base);
        forge__tensor *te = forge__tensor_find(&m->tensors, name);
        if (!te) return forge__fail(&m->err, FORGE_ERR_MODEL, "tensor '%s' is missing (architecture %s)", name, forge__arch_names[c->arch]);
        te->used = true;
        if ((st = forge__plan_vec(L, &ly->expert_scale, te, (uint32_t)E, 0, why_e))) return st;
        if ((st = forge__plan_vec_role(L, &ly->pre_ffn_norm_2, FORGE__R_PRE_FFN_NORM_2, l, H, true, 0, why_h))) return st;
        if ((st = forge__plan_vec_role(L, &ly->post_ffn_norm_1, FORGE__R_POST_FFN_NORM_1, l, H, true, 0, why_h))) return st;
        if ((st = forge__plan_vec_role(L, &ly->post_ffn_norm_2, FORGE__R_POST_FFN_NORM_2, l, H, true, 0, why_h))) return st;
    }
    return FORGE_OK;
}

/* RoPE inverse frequencies [D/2] for one rope description, as HF computes them in float32:
 * inv_freq[i] = 1 / theta^(2i/D), then the scaling rule. `factors` (GGUF rope_freqs) divide. */
static void forge__rope_inv_freq(const forge__rope *r, int head_dim, const float *factors, float *out) {
    int half = head_dim / 2;
    /* proportional (transformers _compute_proportional_rope_parameters): rope_angles =
     * int(partial * head_dim // 2) pairs rotate, the exponent over the whole head_dim */
    int rotating = r->scaling == FORGE__ROPE_PROPORTIONAL ? (int)floor(r->partial * head_dim / 2.0) : half;
    /* partial (Qwen 3.5): R = int(partial * head_dim) dims rotate as a head of R would, the exponent
     * over R; the q and k dims are permuted at load so that those pairs come first (forge__rope_perm_runs) */
    int rot_dims = r->scaling == FORGE__ROPE_PARTIAL ? (int)(head_dim * r->partial) : head_dim;
    if (r->scaling == FORGE__ROPE_PARTIAL) rotating = rot_dims / 2;
    for (int i = 0; i < half; i++) {
        float inv = i < rotating ? (float)(1.0 / pow(r->theta, (double)(2 * i) / (double)rot_dims)) : 0.0f;
        if (r->scaling == FORGE__ROPE_PROPORTIONAL) {
            inv = (float)(inv / r->factor);
        } else if (r->scaling == FORGE__ROPE_LINEAR) {
            inv = (float)(inv / r->factor);
        } else if (r->scaling == FORGE__ROPE_LLAMA3) {
            /* transformers _compute_llama3_parameters */
            double low_wavelen = r->original_max_pos / r->low_freq_factor;
            double high_wavelen = r->original_max_pos / r->high_freq_factor;
            double wavelen = 2.0 * M_PI / inv;
            if (wavelen > low_wavelen) {
                inv = (float)(inv / r->factor);
            } else if (wavelen >= high_wavelen) {
                double smooth = (r->original_max_pos / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
                inv = (float)((1.0 - smooth) * inv / r->factor + smooth * inv);
            }
        }
        if (factors) inv = inv / factors[i];
        out[i] = inv;
    }
}

/* Names the storage format holding most matrix elements, with "+" when others are mixed in
 * (a Q4_K_M file is "q4_k+"). */
static void forge__main_format(forge_model *m) {
    static const char *const names[FORGE__W_COUNT] = {"f32", "f16", "bf16", "q4_0", "q8_0", "q4_k", "q6_k", "mlx"};
    uint64_t elems[FORGE__W_COUNT] = {0}, mlx_bits[9] = {0};
    enum { PER_LAYER = 12 };
    forge__weight *all[4 + PER_LAYER * FORGE__MAX_LAYERS];
    int n = 0;
    all[n++] = &m->tok_embd;
    if (m->output.n_chunks) all[n++] = &m->output;
    if (m->ple_embd.n_chunks) all[n++] = &m->ple_embd;
    if (m->ple_model_proj.n_chunks) all[n++] = &m->ple_model_proj;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        forge__layer *ly = &m->layers[l];
        forge__weight *lw[PER_LAYER] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->gate, &ly->up, &ly->down, /* gate, up: described even when fused */
                                        &ly->router, &ly->exp_gate_up, &ly->exp_down, &ly->ple_gate, &ly->ple_proj};
        for (int i = 0; i < PER_LAYER; i++)
            if (lw[i]->rows) all[n++] = lw[i];
    }
    for (int i = 0; i < n; i++) {
        uint64_t e = (uint64_t)all[i]->rows * all[i]->cols;
        elems[all[i]->fmt] += e;
        if (all[i]->fmt == FORGE__W_MLX && all[i]->bits <= 8) mlx_bits[all[i]->bits] += e;
    }
    int best = 0, kinds = 0;
    for (int f = 0; f < FORGE__W_COUNT; f++) {
        if (elems[f] > elems[best]) best = f;
        kinds += elems[f] > 0;
    }
    if (best == FORGE__W_MLX) {
        int bb = 0;
        for (int b = 1; b <= 8; b++) if (mlx_bits[b] > mlx_bits[bb]) bb = b;
        for (int b = 1; b <= 8; b++) kinds += mlx_bits[b] > 0 && b != bb;
        snprintf(m->main_format, sizeof m->main_format, "mlx%d%s", bb, kinds > 1 ? "+" : "");
    } else {
        snprintf(m->main_format, sizeof m->main_format, "%s%s", names[best], kinds > 1 ? "+" : "");
    }
}

/* The RoPE table [head_dim / 2] of one layer type into the model's vectors: HF's inverse
 * frequencies; GGUF's rope_freqs factors divide them where the file has a table of that size
 * (llama3 scaling; Gemma 4's full layers, whose 1e30 factors stop the pairs that do not rotate). */
static forge_status forge__plan_rope(forge__loader *L, const forge__rope *r, int head_dim, bool file_factors, forge__vec *v) {
    forge_model *m = L->m;
    forge_status st = FORGE_OK;
    int half = head_dim / 2;
    const float *factors = NULL;
    if (L->gguf && file_factors) {
        forge__tensor *rf = forge__lookup(L, FORGE__R_ROPE_FREQS, 0, false, &st);
        if (rf && (rf->dtype != FORGE__F32 || forge__tensor_elements(rf) != (uint64_t)half))
            return forge__fail(&m->err, FORGE_ERR_MODEL, "%s: tensor 'rope_freqs.weight' must be f32 [%d]", rf->file, half);
        if (rf) factors = (const float *)rf->data; /* (NULL in discovery, which reads headers only) */
    }
    float *inv = (float *)forge__arena_alloc(&m->arena, sizeof(float) * (size_t)half, 16);
    if (!inv) return forge__fail(&m->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    forge__rope_inv_freq(r, head_dim, factors, inv);
    *v = (forge__vec){.n = (uint32_t)half, .present = true};
    return forge__upload_add(L, (const uint8_t *)inv, 4ull * half, FORGE__F32, true, 0, &v->r);
}

/* Gemma 4's per-layer inputs: the model-level table, projection and norm (the per-layer
 * gate, projection and norm are planned with each layer). */
static forge_status forge__plan_ple(forge__loader *L) {
    forge_model *m = L->m;
    const forge__config *c = &m->cfg;
    uint32_t LP = (uint32_t)(c->n_layers * c->ple_dim);
    char why[128];
    snprintf(why, sizeof why, "per-layer vocab %d, %d layers x per-layer width %d", c->ple_vocab, c->n_layers, c->ple_dim);
    forge_status st = forge__plan_weight_role(L, &m->ple_embd, FORGE__R_PLE_EMBED, 0, (uint32_t)c->ple_vocab, LP, why);
    if (st) return st;
    snprintf(why, sizeof why, "%d layers x per-layer width %d, hidden %d", c->n_layers, c->ple_dim, c->hidden);
    if ((st = forge__plan_weight_role(L, &m->ple_model_proj, FORGE__R_PLE_MODEL_PROJ, 0, LP, (uint32_t)c->hidden, why))) return st;
    snprintf(why, sizeof why, "per-layer width %d", c->ple_dim);
    if (c->ple_vocab < c->n_vocab)
        return forge__fail(&m->err, FORGE_ERR_MODEL, "the per-layer embedding table has %d rows for a vocabulary of %d", c->ple_vocab, c->n_vocab);
    return forge__plan_vec_role(L, &m->ple_proj_norm, FORGE__R_PLE_PROJ_NORM, 0, (uint32_t)c->ple_dim, true, 0, why);
}

/* Whether a Qwen 3.5 safetensors checkpoint holds its (1 + w) norms with the 1 added: mlx-lm's
 * sanitize does so (its RMSNorm multiplies by w) when it moves the convolution's taps last, and
 * tells its own checkpoints by that layout, [conv_dim, K, 1] (HF's is [conv_dim, 1, K]); forge
 * reads them by the same sign. The gated norm of the linear layers is never so (it multiplies by w). */
static bool forge__norms_hold_one(forge__loader *L) {
    const forge__config *c = &L->m->cfg;
    if (L->gguf || !forge__arch_qwen35(c->arch)) return false;
    for (int l = 0; l < c->n_layers; l++) {
        if (!c->layer_linear[l]) continue;
        char name[256];
        forge__name(L, FORGE__R_LIN_CONV, l, name, sizeof name);
        const forge__tensor *t = forge__tensor_find(&L->m->tensors, name);
        return t && t->n_dims == 3 && t->shape[1] > 1 && t->shape[2] == 1;
    }
    return false;
}

static forge_status forge__plan_model(forge__loader *L) {
    forge_model *m = L->m;
    const forge__config *c = &m->cfg;
    forge_status st = FORGE_OK;
    char why[160];
    snprintf(why, sizeof why, "vocab %d, hidden %d", c->n_vocab, c->hidden);
    if ((st = forge__plan_weight_role(L, &m->tok_embd, FORGE__R_EMBED, 0, (uint32_t)c->n_vocab, (uint32_t)c->hidden, why))) return st;
    if (c->n_labels) snprintf(why, sizeof why, "labels %d, hidden %d", c->n_labels, c->hidden);
    /* an embedding checkpoint has no use for an untied LM head and is saved without one */
    m->cfg.no_head = !c->tied && !c->n_labels && !L->gguf && m->embed.present && !forge__tensor_find(&m->tensors, "lm_head.weight");
    if (!c->tied && !c->no_head && (st = forge__plan_weight_role(L, &m->output, FORGE__R_OUTPUT, 0, (uint32_t)forge__head_rows(c), (uint32_t)c->hidden, why)))
        return st;
    float norm_add = c->norm_plus_one && !forge__norms_hold_one(L) ? 1.0f : 0.0f;
    snprintf(why, sizeof why, "hidden %d", c->hidden);
    if ((st = forge__plan_vec_role(L, &m->output_norm, FORGE__R_OUT_NORM, 0, (uint32_t)c->hidden, true, norm_add, why))) return st;
    if (c->ple_dim && (st = forge__plan_ple(L))) return st;
    for (int k = 0; forge__st_device_steps(&m->embed) && k < m->embed.n_dense; k++) { /* forge_embed's Dense steps, from the arena */
        forge__st_dense *d = &m->embed.dense[k];
        snprintf(why, sizeof why, "Dense %d -> %d", d->in, d->out);
        if ((st = forge__plan_weight(L, &m->embed_w[k], &d->wt, (uint32_t)d->out, (uint32_t)d->in, why))) return st;
        if (d->b && (st = forge__plan_vec(L, &m->embed_b[k], &d->bt, (uint32_t)d->out, 0, why))) return st;
    }
    m->layers = (forge__layer *)forge__arena_alloc(&m->arena, sizeof *m->layers * (size_t)c->n_layers, 16);
    if (!m->layers) return forge__fail(&m->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int i = 0; i < c->n_layers && !st; i++) {
        forge__layer *ly = &m->layers[i];
        uint32_t H = (uint32_t)c->hidden, D = forge__hd(c, i), NKV = forge__nkv(c, i), F = (uint32_t)c->layer_ffn[i];
        uint32_t q_dim = forge__q_dim(c, i), kv_dim = forge__kv_dim(c, i);
        char why_q[160], why_kv[160], why_o[160], why_ffn[160], why_down[160], why_hd[64];
        snprintf(why_q, sizeof why_q, "%d heads x head_dim %u, hidden %u", c->n_heads, D, H);
        snprintf(why_kv, sizeof why_kv, "%u kv heads x head_dim %u, hidden %u", NKV, D, H);
        snprintf(why_o, sizeof why_o, "hidden %u, %d heads x head_dim %u", H, c->n_heads, D);
        snprintf(why_ffn, sizeof why_ffn, "intermediate %u, hidden %u", F, H);
        snprintf(why_down, sizeof why_down, "hidden %u, intermediate %u", H, F);
        snprintf(why_hd, sizeof why_hd, "head_dim %u", D);
        ly->sliding = c->layer_sliding[i];
        ly->out_scale = 1.0f;
        bool shared = forge__kv_shared(c, i);
        if ((st = forge__plan_vec_role(L, &ly->attn_norm, FORGE__R_ATTN_NORM, i, H, true, norm_add, why))) break;
        ly->linear = c->layer_linear[i];
        if (ly->linear) { /* Qwen 3.5's Gated DeltaNet in place of attention */
            if ((st = forge__plan_linear(L, ly, i, H))) break;
        } else {
            if (c->attn_gate) { /* Qwen 3.5: q | k | v | each head's output gate */
                if ((st = forge__plan_qkv_gated(L, ly, i, H, why_q, why_kv))) break;
            } else if (shared) { /* queries only: the keys and values are layer kv_source's */
                if ((st = forge__plan_weight_role(L, &ly->wq, FORGE__R_WQ, i, q_dim, H, why_q))) break;
            } else if ((st = forge__plan_qkv(L, ly, i, q_dim, kv_dim, H, why_q, why_kv))) {
                break;
            }
            if ((st = forge__plan_weight_role(L, &ly->wo, FORGE__R_WO, i, H, q_dim, why_o))) break;
            if (c->qkv_bias && (st = forge__plan_qkv_bias(L, ly, i, q_dim, kv_dim))) break;
            if (c->o_bias && (st = forge__plan_vec_role(L, &ly->bo, FORGE__R_BO, i, H, true, 0, why))) break;
            if (c->qk_norm && c->rope_full.scaling == FORGE__ROPE_PARTIAL) { /* in forge's dim order, as q and k */
                if ((st = forge__plan_head_vec(L, &ly->q_norm, FORGE__R_Q_NORM, i, D, norm_add, why_hd))) break;
                if ((st = forge__plan_head_vec(L, &ly->k_norm, FORGE__R_K_NORM, i, D, norm_add, why_hd))) break;
            } else if (c->qk_norm) {
                if ((st = forge__plan_vec_role(L, &ly->q_norm, FORGE__R_Q_NORM, i, D, true, norm_add, why_hd))) break;
                if (!shared && (st = forge__plan_vec_role(L, &ly->k_norm, FORGE__R_K_NORM, i, D, true, norm_add, why_hd))) break;
            }
        }
        if (c->sandwich_norms) {
            if ((st = forge__plan_vec_role(L, &ly->post_attn_norm, FORGE__R_POST_ATTN_NORM, i, H, true, norm_add, why))) break;
            if ((st = forge__plan_vec_role(L, &ly->post_ffn_norm, FORGE__R_POST_FFN_NORM, i, H, true, norm_add, why))) break;
        }
        if ((st = forge__plan_vec_role(L, &ly->ffn_norm, FORGE__R_FFN_NORM, i, H, true, norm_add, why))) break;
        /* the dense MLP: every layer but Qwen3-MoE's sparse ones (Gemma 4 runs it beside the experts, Qwen 3.5-MoE's is
         * the shared expert) */
        ly->dense_mlp = !c->layer_moe[i] || c->router == FORGE__ROUTER_GEMMA4 || c->shared_ffn > 0;
        if (c->layer_moe[i] && c->shared_ffn > 0 &&
            (st = forge__plan_weight_role(L, &ly->shared_gate, FORGE__R_SHARED_GATE, i, 1, H, why))) break;
        if (ly->dense_mlp) {
            if ((st = forge__plan_gate_up(L, ly, i, F, H, why_ffn))) break;
            if ((st = forge__plan_weight_role(L, &ly->down, FORGE__R_DOWN, i, H, F, why_down))) break;
        }
        if (c->layer_moe[i] && (st = forge__plan_experts(L, ly, i))) break;
        if (c->arch == FORGE__ARCH_GEMMA4) {
            forge__tensor *ts = forge__lookup(L, FORGE__R_LAYER_SCALAR, i, false, &st);
            if (ts && (st = forge__read_scalar(m, ts, &ly->out_scale))) break;
        }
        if (c->ple_dim) {
            uint32_t P = (uint32_t)c->ple_dim;
            char why_p[96];
            snprintf(why_p, sizeof why_p, "per-layer width %u, hidden %u", P, H);
            if ((st = forge__plan_weight_role(L, &ly->ple_gate, FORGE__R_PLE_GATE, i, P, H, why_p))) break;
            snprintf(why_p, sizeof why_p, "hidden %u, per-layer width %u", H, P);
            if ((st = forge__plan_weight_role(L, &ly->ple_proj, FORGE__R_PLE_PROJ, i, H, P, why_p))) break;
            if ((st = forge__plan_vec_role(L, &ly->ple_norm, FORGE__R_PLE_NORM, i, H, true, 0, why))) break;
        }
    }
    if (st) return st;
    /* RoPE tables, one per layer type, each over that type's head_dim */
    int d_full = c->head_dim, d_slide = c->head_dim;
    for (int l = 0; l < c->n_layers; l++) *(c->layer_sliding[l] ? &d_slide : &d_full) = forge__hd(c, l);
    if ((st = forge__plan_rope(L, &c->rope_full, d_full, true, &m->rope_full))) return st;
    /* Gemma 4's rope_freqs belongs to its full layers (its sliding layers may have the same head size) */
    if ((st = forge__plan_rope(L, &c->rope_sliding, d_slide, c->arch != FORGE__ARCH_GEMMA4, &m->rope_sliding))) return st;
    if (c->v_norm) { /* the value norm has no weight: ones */
        float *one = (float *)forge__arena_alloc(&m->arena, sizeof(float) * (size_t)c->head_dim_max, 16);
        if (!one) return forge__fail(&m->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        for (int i = 0; i < c->head_dim_max; i++) one[i] = 1.0f;
        m->ones = (forge__vec){.n = (uint32_t)c->head_dim_max, .present = true};
        if ((st = forge__upload_add(L, (const uint8_t *)one, 4ull * c->head_dim_max, FORGE__F32, true, 0, &m->ones.r))) return st;
    }
    return FORGE_OK;
}

/* Writes one upload's bytes to `dst` (host memory: staging or mapped device memory). */
/* Bytes [off, off + n) of an interleaved upload (both multiples of a row pair). */
static void forge__upload_fill_pairs(const forge__upload *u, uint64_t off, uint64_t n, uint8_t *dst) {
    uint64_t pair = 2 * u->row_bytes, r0 = off / pair;
    for (uint64_t r = 0; r < n / pair; r++) {
        memcpy(dst + r * pair, u->src + (r0 + r) * u->row_bytes, (size_t)u->row_bytes);
        memcpy(dst + r * pair + u->row_bytes, u->src2 + (r0 + r) * u->row_bytes, (size_t)u->row_bytes);
    }
}

/* Releases the file pages of bytes [off, off + n) of an upload once copied (forge__file_release_pages):
 * loading then holds the weights about once, not the file's pages and the copy. Source bytes are
 * u->bytes of raw data, half of it from each of src and src2 for interleaved rows, and from a
 * narrower type for vectors widened to f32, whose few bytes go whole. */
static void forge__upload_release(const forge_model *m, const forge__upload *u, uint64_t off, uint64_t n) {
    if (u->to_f32) return;
    for (int f = 0; f < m->n_files; f++) { /* sources in a mapped file, not converted ones on the heap */
        if (u->src2) {
            forge__file_release_pages(&m->files[f], u->src + off / 2, n / 2);
            forge__file_release_pages(&m->files[f], u->src2 + off / 2, n / 2);
        } else {
            forge__file_release_pages(&m->files[f], u->src + off, n);
        }
    }
}

static void forge__upload_fill(const forge__upload *u, uint8_t *dst) {
    if (u->src2) {
        forge__upload_fill_pairs(u, 0, u->bytes, dst);
        return;
    }
    if (!u->to_f32) {
        memcpy(dst, u->src, (size_t)u->bytes);
        return;
    }
    uint64_t n = u->bytes / 4;
    float *o = (float *)dst;
    for (uint64_t i = 0; i < n; i++) {
        float v;
        if (u->src_dtype == FORGE__F32) memcpy(&v, u->src + 4 * i, 4);
        else {
            uint16_t h;
            memcpy(&h, u->src + 2 * i, 2);
            v = u->src_dtype == FORGE__F16 ? forge__f16_to_f32(h) : forge__bf16_to_f32(h);
        }
        o[i] = (v + u->add) * u->scale;
    }
}

/* Refuses, before anything is allocated, a plan of `need` device bytes that does not fit beside
 * what the model and its sessions and trainers hold: the budget is the device's largest
 * device-local heap, or forge_model_params.max_device_memory when lower. */
static forge_status forge__memory_check(forge_model *m, uint64_t need, const char *what, const char *hint, forge__err *err) {
    uint64_t have = m->dev.caps.device_local_bytes, used = forge__mem_in_use(&m->mem_total);
    if (have && need > have - FORGE__MIN(used, have))
        return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "%s: %.2f MiB of device memory needed; the budget is %.2f MiB, of which %.2f MiB are in use (%s)",
                           what, need / 1048576.0, have / 1048576.0, used / 1048576.0, hint);
    return FORGE_OK;
}

/* Allocates the planned blocks and copies every upload into place. */
static forge_status forge__upload_all(forge__loader *L, forge_model_params const *params) {
    forge_model *m = L->m;
    forge__device *d = &m->dev;
    forge_status st = forge__pack_plan(&L->pack, &m->arena, &d->caps, &m->err);
    if (st) return forge__wrap(&m->err, st, "planning weight memory");
    m->mem.planned = forge__pack_total(&L->pack);
    if ((st = forge__memory_check(m, m->mem.planned, "the model's weights", "a device with more memory, a smaller or more quantized model, or a higher max_device_memory", &m->err)))
        return st;
    m->n_blocks = L->pack.n_blocks;
    m->blocks = (forge__buffer *)forge__arena_alloc(&m->arena, sizeof *m->blocks * (size_t)(m->n_blocks + 1), 16);
    if (!m->blocks) return forge__fail(&m->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    bool direct = d->caps.uma; /* the host can write device memory: no staging copy */
    for (int b = 0; b < m->n_blocks; b++) {
        if ((st = forge__buffer_create(d, L->pack.block_sizes[b], d->caps.mem_device, direct, &m->mem, &m->mem_total, &m->blocks[b], &m->err)))
            return forge__wrap(&m->err, st, "allocating weight block %d of %d (%llu bytes)", b + 1, m->n_blocks,
                               (unsigned long long)L->pack.block_sizes[b]);
    }
    for (int i = 0; i < L->n_ups; i++) {
        const forge__pack_item *it = &L->pack.items[L->ups[i].pack_item];
        /* the range covers the padding to 16 bytes, so kernels may read whole words at the end */
        if (L->ups[i].dst) *L->ups[i].dst = (forge__range){m->blocks[it->block].buf, it->offset, forge__align_up(it->size, 16)};
    }
    uint64_t total = 0, done = 0;
    for (int i = 0; i < L->n_ups; i++) total += L->ups[i].bytes;
    /* 0 first, whatever the device: a model that uploads in one copy still shows it started */
    if (params->progress) params->progress(params->progress_user_data, 0.0f);
    if (direct) {
        for (int i = 0; i < L->n_ups; i++) {
            const forge__pack_item *it = &L->pack.items[L->ups[i].pack_item];
            forge__upload_fill(&L->ups[i], (uint8_t *)m->blocks[it->block].mapped + it->offset + L->ups[i].item_offset);
            forge__upload_release(m, &L->ups[i], 0, L->ups[i].bytes);
            done += L->ups[i].bytes;
            if (params->progress) params->progress(params->progress_user_data, total ? (float)done / (float)total : 1.0f);
        }
        return FORGE_OK;
    }
    /* Staging: fill up to `cap` bytes, copy, wait, repeat. Uploads larger than the staging
     * buffer go in pieces (raw bytes only; f32 vectors are small). */
    uint64_t cap = FORGE__MIN((uint64_t)64 << 20, d->caps.max_alloc);
    forge__buffer staging;
    forge__mem_counter scratch = {0};
    if ((st = forge__buffer_create(d, cap, d->caps.mem_upload, true, &scratch, &m->mem_total, &staging, &m->err))) return st;
    VkCommandPool pool = VK_NULL_HANDLE;
    VkCommandBuffer cb = VK_NULL_HANDLE;
    VkFence fence = VK_NULL_HANDLE;
    VkCommandPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                   .queueFamilyIndex = d->caps.queue_family};
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if (d->vk.vkCreateCommandPool(d->dev, &pci, NULL, &pool) != VK_SUCCESS || d->vk.vkCreateFence(d->dev, &fci, NULL, &fence) != VK_SUCCESS)
        st = forge__fail(&m->err, FORGE_ERR_DEVICE, "creating the upload command pool failed");
    if (!st) {
        VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = pool,
                                           .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
        if (d->vk.vkAllocateCommandBuffers(d->dev, &cai, &cb) != VK_SUCCESS)
            st = forge__fail(&m->err, FORGE_ERR_DEVICE, "allocating the upload command buffer failed");
    }
    int i = 0;
    uint64_t part = 0; /* bytes of ups[i] already sent */
    while (!st && i < L->n_ups) {
        VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
        d->vk.vkBeginCommandBuffer(cb, &bi);
        uint64_t used = 0;
        while (i < L->n_ups && used < cap) {
            forge__upload *u = &L->ups[i];
            uint64_t n = u->bytes - part;
            if (u->to_f32) {
                if (u->bytes > cap) { st = forge__fail(&m->err, FORGE_ERR_LIMIT, "an upload of %llu bytes exceeds the staging buffer", (unsigned long long)u->bytes); break; }
                if (u->bytes > cap - used) break; /* converted vectors go whole */
                forge__upload_fill(u, (uint8_t *)staging.mapped + used);
            } else if (u->src2) { /* interleaved rows: whole row pairs at a time */
                uint64_t pair = 2 * u->row_bytes;
                if (pair > cap) { st = forge__fail(&m->err, FORGE_ERR_LIMIT, "a row pair of %llu bytes exceeds the staging buffer", (unsigned long long)pair); break; }
                n = FORGE__MIN(n, (cap - used) / pair * pair);
                if (!n) break;
                forge__upload_fill_pairs(u, part, n, (uint8_t *)staging.mapped + used);
            } else {
                n = FORGE__MIN(n, cap - used);
                memcpy((uint8_t *)staging.mapped + used, u->src + part, (size_t)n);
            }
            const forge__pack_item *it = &L->pack.items[u->pack_item];
            forge__upload_release(m, u, part, n); /* in staging now */
            VkBufferCopy region = {used, it->offset + u->item_offset + part, n};
            d->vk.vkCmdCopyBuffer(cb, staging.buf, m->blocks[it->block].buf, 1, &region);
            used = forge__align_up(used + n, 16);
            part += n;
            done += n;
            if (part == u->bytes) { i++; part = 0; }
        }
        d->vk.vkEndCommandBuffer(cb);
        st = forge__submit_wait(d, cb, fence, &m->err);
        if (params->progress) params->progress(params->progress_user_data, total ? (float)done / (float)total : 1.0f);
    }
    if (fence) d->vk.vkDestroyFence(d->dev, fence, NULL);
    if (pool) d->vk.vkDestroyCommandPool(d->dev, pool, NULL);
    forge__buffer_destroy(d, &staging, &scratch, &m->mem_total);
    return st;
}

/* Model-level calls on a shared model record their failure under the lock. */
static forge_status forge__model_fail(const forge_model *cm, forge_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static forge_status forge__model_fail(const forge_model *cm, forge_status st, const char *fmt, ...) {
    forge_model *m = (forge_model *)cm; /* the error slot is the one mutable part of a model */
    pthread_mutex_lock(&m->err_lock);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err.msg, sizeof m->err.msg, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&m->err_lock);
    return st;
}

static bool forge__model_ready(const forge_model *m) { return m && !m->failed; }

/* A ready model that has weights (not vocab_only); otherwise the reason goes on the model. */
static bool forge__model_has_weights(const forge_model *m, const char *what) {
    if (!forge__model_ready(m)) return false;
    if (m->vocab_only) {
        forge__model_fail(m, FORGE_ERR_UNSUPPORTED, "%s: this model was loaded with vocab_only (tokenizer only)", what);
        return false;
    }
    return true;
}

static const forge__tokenizer *forge__model_tokenizer(const forge_model *m) {
    if (!forge__model_ready(m)) return NULL;
    if (!m->tok.n_vocab) {
        forge__model_fail(m, FORGE_ERR_INVALID_ARGUMENT, "%s: the model has no tokenizer (no tokenizer.json / tokenizer.ggml.tokens)", m->name);
        return NULL;
    }
    return &m->tok;
}

/* The model's identity in state files: the parsed config fields that shape the forward pass,
 * then every tensor's name, dtype, shape, size and first and last 16 bytes. Tensors are hashed
 * one by one and summed, so the order the files list them in does not matter. Two checkpoints
 * of one architecture differ in their bytes, so equal fingerprints mean the same weights (as
 * far as these bytes tell). The adapter is kept apart (adapter_id) to be named on its own. */
static uint64_t forge__model_fingerprint(const forge_model *m) {
    const forge__config *c = &m->cfg;
    const forge__rope *ropes[2] = {&c->rope_full, &c->rope_sliding};
    int64_t ints[] = {c->arch, c->n_layers, c->hidden, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn, c->n_vocab, c->n_ctx_train,
                      c->rope_adjacent_pairs, c->tied, c->qkv_bias, c->o_bias, c->qk_norm, c->norm_plus_one, c->sandwich_norms,
                      c->act, c->sliding_window, c->dtype};
    double reals[] = {c->norm_eps, c->attn_softcap, c->final_softcap, c->attn_scale, c->embed_scale};
    uint64_t h = FORGE__FNV_BASIS;
    for (size_t i = 0; i < FORGE__ARRAY_LEN(ints); i++) h = forge__fnv_u64(h, (uint64_t)ints[i]);
    for (size_t i = 0; i < FORGE__ARRAY_LEN(reals); i++) h = forge__fnv_f64(h, reals[i]);
    for (int r = 0; r < 2; r++) {
        const forge__rope *ro = ropes[r];
        h = forge__fnv_u64(forge__fnv_u64(h, (uint64_t)ro->scaling), (uint64_t)ro->original_max_pos);
        h = forge__fnv_f64(forge__fnv_f64(h, ro->theta), ro->factor);
        h = forge__fnv_f64(forge__fnv_f64(h, ro->low_freq_factor), ro->high_freq_factor);
    }
    h = forge__fnv(h, c->layer_sliding, (size_t)c->n_layers);
    uint64_t sum = 0;
    for (int i = 0; i < m->tensors.count; i++) {
        const forge__tensor *t = &m->tensors.items[i];
        uint64_t th = forge__fnv(FORGE__FNV_BASIS, t->name, strlen(t->name) + 1);
        th = forge__fnv_u64(forge__fnv_u64(th, (uint64_t)t->dtype), (uint64_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) th = forge__fnv_u64(th, (uint64_t)t->shape[d]);
        th = forge__fnv_u64(th, t->nbytes);
        size_t k = (size_t)FORGE__MIN(t->nbytes, 16);
        if (k && t->data) th = forge__fnv(forge__fnv(th, t->data, k), t->data + t->nbytes - k, k);
        sum += th;
    }
    return forge__fnv_u64(h, sum);
}

