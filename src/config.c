/* src/config.c: Model configuration.
 * Owns: forge__config (one decoder's parameters for every family) and reading it from
 * config.json or GGUF metadata; RoPE variants; the KV layout a config implies.
 * May call: base.c, files.c.
 *
 * One decoder covers every supported family; the config says which parts it uses.
 */

typedef enum forge__arch {
    FORGE__ARCH_LLAMA = 0,
    FORGE__ARCH_QWEN2,
    FORGE__ARCH_QWEN3,
    FORGE__ARCH_GEMMA2,
    FORGE__ARCH_GEMMA3,
    FORGE__ARCH_QWEN3MOE,
    FORGE__ARCH_GEMMA4,
    FORGE__ARCH_MISTRAL,     /* Llama's layers, a sliding window on every layer (or none) */
    FORGE__ARCH_QWEN35,      /* Qwen 3.5 / 3.6: linear-attention (Gated DeltaNet) and gated full-attention layers */
    FORGE__ARCH_QWEN35MOE,   /* ... with a mixture of experts and a shared expert in every layer */
    FORGE__ARCH_COUNT
} forge__arch;

/* As GGUF's general.architecture names them (and forge_model_info reports them). GGUF files of
 * Mistral 7B say "llama" (llama.cpp's converter writes them so), and load as such. */
static const char *const forge__arch_names[FORGE__ARCH_COUNT] = {"llama", "qwen2", "qwen3", "gemma2", "gemma3", "qwen3moe", "gemma4",
                                                                 "mistral", "qwen35", "qwen35moe"};

static bool forge__arch_qwen35(int arch) { return arch == FORGE__ARCH_QWEN35 || arch == FORGE__ARCH_QWEN35MOE; }

typedef enum forge__rope_scaling {
    FORGE__ROPE_NONE = 0,
    FORGE__ROPE_LINEAR,   /* positions divided by factor */
    FORGE__ROPE_LLAMA3,   /* Llama 3.1 frequency-dependent scaling */
    FORGE__ROPE_PROPORTIONAL, /* Gemma 4: the first partial * head_dim / 2 pairs rotate at 1 / theta^(2i / head_dim), the rest not at all */
    FORGE__ROPE_PARTIAL,  /* Qwen 3.5: the first R = partial * head_dim dims rotate as a head of R would (HF pairs (i, i + R/2) at
                           * 1 / theta^(2i / R)); q and k are permuted per head at load (forge__rope_perm) so that those pairs are
                           * forge's (i, i + head_dim/2): the first R/2 pairs rotate, the rest not at all */
} forge__rope_scaling;

typedef struct forge__rope {
    double theta;                 /* base */
    forge__rope_scaling scaling;
    double factor, low_freq_factor, high_freq_factor;
    int original_max_pos;
    double partial;               /* PROPORTIONAL, PARTIAL: partial_rotary_factor */
} forge__rope;

typedef enum forge__act { FORGE__ACT_SILU = 0, FORGE__ACT_GELU_TANH = 1 } forge__act;

/* How a mixture-of-experts layer weighs its experts (moe_route.comp). */
typedef enum forge__router {
    FORGE__ROUTER_NONE = 0,
    FORGE__ROUTER_SOFTMAX,   /* Qwen3-MoE: softmax(x_n W_r^T) over all experts, the top k, renormalized if moe_norm_topk */
    FORGE__ROUTER_GEMMA4,    /* Gemma 4: the router reads rmsnorm(x) * scale * hidden^-0.5 (no norm weight), softmax, top k
                              * renormalized, times per_expert_scale; the layer's dense MLP runs beside the experts */
} forge__router;

typedef struct forge__config {
    forge__arch arch;
    int n_layers, hidden, n_heads, n_kv_heads, head_dim, ffn, n_vocab, n_ctx_train;
    double norm_eps;
    forge__rope rope_full;        /* full-attention layers (all layers for Llama/Qwen) */
    forge__rope rope_sliding;     /* sliding-window layers (Gemma 3: rope_local_base_freq) */
    bool rope_adjacent_pairs;     /* GGUF `llama`: rotate (x[2i], x[2i+1]); else HF rotate-half */
    bool tied;                    /* lm head = embedding table */
    bool qkv_bias;                /* Qwen 2 */
    bool o_bias;                  /* Llama attention_bias */
    bool qk_norm;                 /* Qwen 3, Gemma 3 */
    bool norm_plus_one;           /* Gemma: RMSNorm multiplies by (1 + w); folded at load for HF files */
    bool sandwich_norms;          /* Gemma 2/3: post-attention and post-feedforward norms */
    forge__act act;
    int sliding_window;           /* 0: none */
    uint8_t layer_sliding[FORGE__MAX_LAYERS];
    double attn_softcap, final_softcap; /* 0: none */
    double attn_scale;            /* multiplies q.k */
    double embed_scale;           /* multiplies the embedding rows (Gemma: sqrt(hidden) in the model dtype) */
    forge__dtype dtype;           /* the checkpoint's compute dtype (torch_dtype) */
    bool multimodal;              /* model_type gemma3: the text model sits under language_model (adapter names) */
    /* Per-layer shapes. Gemma 4's full-attention layers have their own head_dim and kv heads
     * (global_head_dim, num_global_key_value_heads) and its KV-shared layers a double-wide MLP;
     * every other family repeats head_dim, n_kv_heads and ffn (forge__config_finish fills them). */
    uint16_t layer_head_dim[FORGE__MAX_LAYERS];
    uint16_t layer_kv_heads[FORGE__MAX_LAYERS];
    int32_t layer_ffn[FORGE__MAX_LAYERS];     /* the dense MLP's width */
    int16_t kv_source[FORGE__MAX_LAYERS];     /* the layer whose K/V cache layer l attends to: l itself, or for Gemma 4's
                                               * KV-shared tail the last earlier layer of the same type */
    uint8_t layer_k_eq_v[FORGE__MAX_LAYERS];  /* Gemma 4 attention_k_eq_v: no v_proj, the values are the keys' projection */
    uint8_t layer_moe[FORGE__MAX_LAYERS];     /* a mixture-of-experts MLP */
    int head_dim_max;             /* the largest layer_head_dim (the attention kernels' specialization) */
    bool v_norm;                  /* Gemma 4: RMSNorm without weight on each value head before caching */
    /* Mixture of experts (layer_moe layers) */
    forge__router router;
    int n_experts, n_experts_used, moe_ffn;
    bool moe_norm_topk;           /* the chosen experts' weights renormalized to sum 1 */
    /* Gemma 4 */
    int ple_dim;                  /* hidden_size_per_layer_input: per-layer input embeddings of this width (0: none) */
    int ple_vocab;                /* rows of the per-layer embedding table */
    /* Qwen 3.5: linear-attention layers (Gated DeltaNet), which keep a recurrent state per sequence
     * instead of a KV cache: q and k of lin_k_heads heads of lin_k_dim, v of lin_v_heads heads of
     * lin_v_dim (each key head serves lin_v_heads / lin_k_heads consecutive value heads), a causal
     * depthwise convolution of lin_conv taps over q|k|v; the state [lin_v_heads, lin_k_dim, lin_v_dim] */
    uint8_t layer_linear[FORGE__MAX_LAYERS];
    int lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, lin_conv;
    bool lin_v_tiled;             /* llama.cpp's qwen35 files order the value heads tiled (value head h uses key head
                                   * h % lin_k_heads: the V heads' rows, z, b, a, dt, A, the conv channels and out_proj's
                                   * columns alike), not grouped as transformers does (key head h / (v_heads / k_heads)) */
    bool attn_gate;               /* Qwen 3.5's full attention: q_proj gives each head's query and an output gate (sigmoid) */
    int shared_ffn;               /* Qwen 3.5-MoE: the shared expert's width beside the experts (0: none), its output times
                                   * sigmoid(x . shared_expert_gate) */
    /* Embedding and reranking checkpoints (embed.c) */
    bool bidirectional;           /* use_bidirectional_attention true (EmbeddingGemma): every token sees the whole text;
                                   * a sliding layer sees |i - j| < sliding_window / 2 + 1 (transformers 5.17's
                                   * Gemma3TextConfig halves the window: the fixture's window 8 reaches 4 tokens each
                                   * side); only forge_embed runs such a model */
    int n_labels;                 /* an XForSequenceClassification: its `score` head's rows (the model's only head) */
    int pad_id;                   /* pad_token_id (-1: none): the sequence-classification head reads the last other token */
    bool no_head;                 /* a sentence-transformers checkpoint saved without its untied LM head (model.c): it only embeds */
} forge__config;

/* Qwen 3.5's linear-attention widths: the convolved q|k|v row, the value row. */
static uint32_t forge__lin_conv_dim(const forge__config *c) { return (uint32_t)(2 * c->lin_k_heads * c->lin_k_dim + c->lin_v_heads * c->lin_v_dim); }
static uint32_t forge__lin_v_dim(const forge__config *c) { return (uint32_t)(c->lin_v_heads * c->lin_v_dim); }
/* The rows of the model's head: the vocabulary's, or a sequence-classification head's labels. */
static int forge__head_rows(const forge__config *c) { return c->n_labels ? c->n_labels : c->n_vocab; }

/* Whether any layer is a linear-attention layer (a recurrent state, not a KV cache). */
static bool forge__has_linear(const forge__config *c) {
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_linear[l]) return true;
    return false;
}

/* Layer l's attention shape. A KV-shared layer (kv_source != l) projects only queries. */
static uint32_t forge__hd(const forge__config *c, int l) { return c->layer_head_dim[l]; }
static uint32_t forge__nkv(const forge__config *c, int l) { return c->layer_kv_heads[l]; }
static bool forge__kv_shared(const forge__config *c, int l) { return c->kv_source[l] != l; }
static uint32_t forge__q_dim(const forge__config *c, int l) { return (uint32_t)c->n_heads * forge__hd(c, l); }
static uint32_t forge__kv_dim(const forge__config *c, int l) { return forge__nkv(c, l) * forge__hd(c, l); }
/* The fused q|k|v row of layer l (q only on a KV-shared layer; Qwen 3.5: then each head's output gate). */
static uint32_t forge__qkv_dim(const forge__config *c, int l) {
    return forge__q_dim(c, l) + (forge__kv_shared(c, l) ? 0 : 2 * forge__kv_dim(c, l)) + (c->attn_gate ? forge__q_dim(c, l) : 0);
}
/* Whether every layer caches its own keys and values in rows of one shape (every family but
 * Gemma 4): what the context shift, state files and key inspection read and write. */
static bool forge__uniform_kv(const forge__config *c) {
    if (forge__has_linear(c)) return false; /* Qwen 3.5: linear layers keep a recurrent state, not keys and values */
    for (int l = 0; l < c->n_layers; l++)
        if (forge__kv_shared(c, l) || forge__hd(c, l) != (uint32_t)c->head_dim || forge__nkv(c, l) != (uint32_t)c->n_kv_heads) return false;
    return true;
}
static double forge__round_to_dtype(double x, forge__dtype t) {
    if (t == FORGE__BF16) return forge__bf16_to_f32(forge__f32_to_bf16((float)x));
    if (t == FORGE__F16) return forge__f16_to_f32(forge__f32_to_f16((float)x));
    return (float)x;
}

/* The attention kernels' largest DMAX: Gemma 4's full-attention heads (global_head_dim 512).
 * attention_tiled.comp takes smaller blocks above 256 to stay within 32 KiB of shared memory;
 * training's attention_back.comp stops at 256 (forge__train_layout_make). */
#define FORGE__MAX_HEAD_DIM 512
#define FORGE__MAX_TRAIN_HEAD_DIM 256
#define FORGE__MAX_EXPERTS 1024     /* moe_route.comp: one router row in shared memory */
#define FORGE__MAX_EXPERTS_USED 32  /* moe_route.comp MAXK */
#define FORGE__MAX_LINEAR_HEAD_DIM 256 /* delta_rule.comp: a key head's row in shared memory, a value head's columns a workgroup */
#define FORGE__MAX_LINEAR_CONV 8       /* conv1d.comp: the taps a channel keeps in registers */
#define FORGE__MAX_LINEAR_VALUE_HEADS 1024

/* Limits of the kernels and of 32-bit indexing, checked for every config whatever its source
 * (after forge__config_finish has filled the per-layer shapes). */
static forge_status forge__config_validate(const forge__config *c, const char *path, forge__err *err) {
    struct { const char *name; int v, lo, hi; } f[] = {
        {"hidden size", c->hidden, 1, 1 << 16}, {"layers", c->n_layers, 1, FORGE__MAX_LAYERS},
        {"attention heads", c->n_heads, 1, 1024}, {"kv heads", c->n_kv_heads, 1, 1024},
        {"head_dim", c->head_dim, 2, FORGE__MAX_HEAD_DIM}, {"intermediate size", c->ffn, 1, 1 << 20},
        {"vocab size", c->n_vocab, 1, 1 << 24}, {"context length", c->n_ctx_train, 1, 1 << 24},
        {"per-layer input width", c->ple_dim, 0, 1 << 12}, {"experts", c->n_experts, 0, FORGE__MAX_EXPERTS},
    };
    for (size_t i = 0; i < FORGE__ARRAY_LEN(f); i++)
        if (f[i].v < f[i].lo || f[i].v > f[i].hi)
            return forge__fail(err, f[i].v > f[i].hi && f[i].v > 0 ? FORGE_ERR_UNSUPPORTED : FORGE_ERR_FORMAT,
                               "%s: %s %d is outside what forge supports [%d, %d]", path, f[i].name, f[i].v, f[i].lo, f[i].hi);
    for (int l = 0; l < c->n_layers; l++) {
        int d = c->layer_head_dim[l], kv = c->layer_kv_heads[l], src = c->kv_source[l];
        if (d < 2 || d > FORGE__MAX_HEAD_DIM || d % 2)
            return forge__fail(err, d > FORGE__MAX_HEAD_DIM ? FORGE_ERR_UNSUPPORTED : FORGE_ERR_FORMAT,
                               "%s: layer %d's head_dim %d must be even and in [2, %d]", path, l, d, FORGE__MAX_HEAD_DIM);
        if (kv < 1 || c->n_heads % kv)
            return forge__fail(err, FORGE_ERR_FORMAT, "%s: layer %d: the heads (%d) must be a multiple of the kv heads (%d)", path, l,
                               c->n_heads, kv);
        if (c->layer_ffn[l] < 1 || c->layer_ffn[l] > (1 << 20))
            return forge__fail(err, FORGE_ERR_FORMAT, "%s: layer %d's intermediate size %d is outside [1, %d]", path, l, c->layer_ffn[l], 1 << 20);
        if (src < 0 || src > l || (src != l && (c->layer_head_dim[src] != d || c->layer_kv_heads[src] != kv ||
                                                c->layer_sliding[src] != c->layer_sliding[l] || forge__kv_shared(c, src))))
            return forge__fail(err, FORGE_ERR_FORMAT, "%s: layer %d cannot share the KV cache of layer %d (another shape, type, or itself shared)",
                               path, l, src);
        if (c->layer_moe[l] && !c->n_experts)
            return forge__fail(err, FORGE_ERR_FORMAT, "%s: layer %d is a mixture of experts but the config has no experts", path, l);
    }
    if (c->n_experts && (c->n_experts_used < 1 || c->n_experts_used > FORGE__MIN(c->n_experts, FORGE__MAX_EXPERTS_USED) ||
                         c->moe_ffn < 1 || c->moe_ffn > (1 << 20)))
        return forge__fail(err, c->n_experts_used > FORGE__MAX_EXPERTS_USED ? FORGE_ERR_UNSUPPORTED : FORGE_ERR_FORMAT,
                           "%s: %d experts used of %d (forge supports 1 to %d) with expert intermediate size %d", path, c->n_experts_used,
                           c->n_experts, FORGE__MAX_EXPERTS_USED, c->moe_ffn);
    if (!(c->norm_eps > 0 && c->norm_eps < 1)) return forge__fail(err, FORGE_ERR_FORMAT, "%s: rms norm epsilon %g out of range", path, c->norm_eps);
    if (!(c->rope_full.theta > 1) || !(c->rope_sliding.theta > 1))
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: rope theta must be > 1", path);
    if (c->rope_full.scaling == FORGE__ROPE_PARTIAL) {
        int rot = (int)(c->head_dim * c->rope_full.partial);
        if (rot < 2 || rot % 2 || rot > c->head_dim)
            return forge__fail(err, FORGE_ERR_FORMAT, "%s: partial_rotary_factor %g of head_dim %d rotates %d dims (an even number >= 2 is needed)",
                               path, c->rope_full.partial, c->head_dim, rot);
    }
    if (forge__has_linear(c)) {
        struct { const char *name; int v, lo, hi; } g[] = {
            {"linear_num_key_heads", c->lin_k_heads, 1, FORGE__MAX_LINEAR_VALUE_HEADS},
            {"linear_num_value_heads", c->lin_v_heads, 1, FORGE__MAX_LINEAR_VALUE_HEADS},
            {"linear_key_head_dim", c->lin_k_dim, 2, FORGE__MAX_LINEAR_HEAD_DIM}, {"linear_value_head_dim", c->lin_v_dim, 2, FORGE__MAX_LINEAR_HEAD_DIM},
            {"linear_conv_kernel_dim", c->lin_conv, 1, FORGE__MAX_LINEAR_CONV},
        };
        for (size_t i = 0; i < FORGE__ARRAY_LEN(g); i++)
            if (g[i].v < g[i].lo || g[i].v > g[i].hi)
                return forge__fail(err, g[i].v > g[i].hi ? FORGE_ERR_UNSUPPORTED : FORGE_ERR_FORMAT, "%s: %s %d is outside what forge supports [%d, %d]",
                                   path, g[i].name, g[i].v, g[i].lo, g[i].hi);
        if (c->lin_v_heads % c->lin_k_heads)
            return forge__fail(err, FORGE_ERR_FORMAT, "%s: linear_num_value_heads %d must be a multiple of linear_num_key_heads %d", path,
                               c->lin_v_heads, c->lin_k_heads);
        if (c->lin_k_dim % 4 || c->lin_v_dim % 4)
            return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: linear key and value head dims (%d, %d) must be multiples of 4", path, c->lin_k_dim,
                               c->lin_v_dim);
    }
    return FORGE_OK;
}

/* Fills what is derived from the rest of the config: scales, and the per-layer shapes where
 * the parser left them 0 (every family but Gemma 4 repeats head_dim, n_kv_heads and ffn). */
static void forge__config_finish(forge__config *c, double query_pre_attn_scalar) {
    c->head_dim_max = 0;
    for (int l = 0; l < c->n_layers && l < FORGE__MAX_LAYERS; l++) {
        if (!c->layer_head_dim[l]) c->layer_head_dim[l] = (uint16_t)FORGE__MIN(FORGE__MAX(c->head_dim, 0), 65535);
        if (!c->layer_kv_heads[l]) c->layer_kv_heads[l] = (uint16_t)FORGE__MIN(FORGE__MAX(c->n_kv_heads, 0), 65535);
        if (!c->layer_ffn[l]) c->layer_ffn[l] = c->ffn;
        c->head_dim_max = FORGE__MAX(c->head_dim_max, (int)c->layer_head_dim[l]);
    }
    if (c->arch == FORGE__ARCH_GEMMA2 || c->arch == FORGE__ARCH_GEMMA3 || c->arch == FORGE__ARCH_GEMMA4) {
        /* Gemma 4 normalizes q and k per head and scales the scores by 1 */
        c->attn_scale = c->arch == FORGE__ARCH_GEMMA4 ? 1.0
                                                      : 1.0 / sqrt(query_pre_attn_scalar > 0 ? query_pre_attn_scalar : (double)c->head_dim);
        /* HF: hidden * torch.tensor(hidden**0.5, dtype=hidden.dtype) */
        c->embed_scale = forge__round_to_dtype(sqrt((double)c->hidden), c->dtype);
    } else {
        c->attn_scale = 1.0 / sqrt((double)c->head_dim);
        c->embed_scale = 1.0;
    }
}

/* An integer field; -1 when present but not an integer that fits an int (callers validate). */
static int forge__json_int(const cJSON *o, const char *key, int def) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(x)) return def;
    double v = x->valuedouble;
    if (!(v >= INT_MIN && v <= INT_MAX) || v != floor(v)) return -1;
    return (int)v;
}
/* A token id: a JSON integer in [0, INT32_MAX]; -1 for anything else (callers reject it). */
static int32_t forge__json_id(const cJSON *x) {
    if (!cJSON_IsNumber(x)) return -1;
    double v = x->valuedouble;
    return v >= 0 && v <= INT32_MAX && v == floor(v) ? (int32_t)v : -1;
}
static double forge__json_num(const cJSON *o, const char *key, double def) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(x) ? x->valuedouble : def;
}
static bool forge__json_bool(const cJSON *o, const char *key, bool def) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsBool(x)) return cJSON_IsTrue(x);
    return def;
}
static const char *forge__json_str(const cJSON *o, const char *key) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

/* Reads one RoPE description, in either key style: a `rope_scaling` / `rope_parameters`
 * object ({"rope_type" or "type", "factor", ...}) and a theta that is inside it
 * (`rope_parameters.rope_theta`, transformers 5) or beside it (`rope_theta`). */
static forge_status forge__rope_from_json(const cJSON *params, double theta_default, forge__rope *r,
                                          const char *where, forge__err *err) {
    memset(r, 0, sizeof *r);
    r->theta = theta_default;
    if (!params || cJSON_IsNull(params)) return FORGE_OK;
    if (!cJSON_IsObject(params)) return forge__fail(err, FORGE_ERR_FORMAT, "%s is not an object", where);
    r->theta = forge__json_num(params, "rope_theta", theta_default);
    const char *type = forge__json_str(params, "rope_type");
    if (!type) type = forge__json_str(params, "type");
    if (!type || strcmp(type, "default") == 0) return FORGE_OK;
    r->factor = forge__json_num(params, "factor", 1.0);
    if (strcmp(type, "linear") == 0) {
        r->scaling = FORGE__ROPE_LINEAR;
    } else if (strcmp(type, "proportional") == 0) {
        r->scaling = FORGE__ROPE_PROPORTIONAL;
        r->partial = forge__json_num(params, "partial_rotary_factor", 1.0);
        if (!(r->partial > 0 && r->partial <= 1))
            return forge__fail(err, FORGE_ERR_FORMAT, "%s: partial_rotary_factor %g must be in (0, 1]", where, r->partial);
    } else if (strcmp(type, "llama3") == 0) {
        r->scaling = FORGE__ROPE_LLAMA3;
        r->low_freq_factor = forge__json_num(params, "low_freq_factor", 1.0);
        r->high_freq_factor = forge__json_num(params, "high_freq_factor", 4.0);
        r->original_max_pos = forge__json_int(params, "original_max_position_embeddings", 8192);
        if (r->high_freq_factor <= r->low_freq_factor || r->original_max_pos <= 0)
            return forge__fail(err, FORGE_ERR_FORMAT, "%s: llama3 rope scaling needs high_freq_factor > low_freq_factor and original_max_position_embeddings > 0", where);
    } else {
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: rope type '%s' is not supported (default, linear, llama3, proportional)",
                           where, type);
    }
    if (!(r->factor > 0)) return forge__fail(err, FORGE_ERR_FORMAT, "%s: rope factor must be > 0", where);
    return FORGE_OK;
}

static forge__dtype forge__dtype_from_torch(const char *s) {
    if (!s) return FORGE__DTYPE_INVALID;
    if (!strcmp(s, "float32")) return FORGE__F32;
    if (!strcmp(s, "bfloat16")) return FORGE__BF16;
    if (!strcmp(s, "float16")) return FORGE__F16;
    return FORGE__DTYPE_INVALID;
}

/* Gemma 4's KV-shared tail: the last `shared` layers attend to the cache of the last earlier
 * layer of their type (transformers' rule; llama.cpp's n_layer_kv_from_start - (swa ? 2 : 1)
 * agrees on the published models). `what` names the setting in messages. */
static forge_status forge__kv_share_tail(forge__config *c, int shared, const char *path, const char *what, forge__err *err) {
    if (shared < 0 || shared >= c->n_layers)
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: %s %d must be in [0, %d)", path, what, shared, c->n_layers);
    int first = c->n_layers - shared;
    for (int l = first; l < c->n_layers; l++) {
        int src = -1;
        for (int j = first - 1; j >= 0 && src < 0; j--)
            if (c->layer_sliding[j] == c->layer_sliding[l]) src = j;
        if (src < 0)
            return forge__fail(err, FORGE_ERR_FORMAT, "%s: KV-shared layer %d has no earlier %s layer to share", path, l,
                               c->layer_sliding[l] ? "sliding" : "full-attention");
        c->kv_source[l] = (int16_t)src;
    }
    return FORGE_OK;
}

/* Gemma 4's per-layer shapes and extras from its text config `o` (transformers'
 * Gemma4TextConfig): full-attention layers take global_head_dim (default 512) and, with
 * attention_k_eq_v, num_global_key_value_heads, unless config.json spells the overrides out in
 * per_layer_config (what transformers 5.17 writes: {"<layer index>" or "<layer type>":
 * {"head_dim", "num_key_value_heads", "intermediate_size"}}); the last num_kv_shared_layers
 * layers attend to the cache of the last earlier layer of their type and, with
 * use_double_wide_mlp, have twice the MLP; per-layer input embeddings; mixture of experts. */
static forge_status forge__config_gemma4_json(const cJSON *o, const char *path, forge__config *c, forge__err *err) {
    const char *bidi = forge__json_str(o, "use_bidirectional_attention");
    if (bidi && !strcmp(bidi, "all"))
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: use_bidirectional_attention 'all' (an encoder) is not supported", path);
    bool k_eq_v = forge__json_bool(o, "attention_k_eq_v", false);
    const cJSON *plc = cJSON_GetObjectItemCaseSensitive(o, "per_layer_config");
    int global_hd = forge__json_int(o, "global_head_dim", 512), global_kv = forge__json_int(o, "num_global_key_value_heads", 0);
    for (int l = 0; l < c->n_layers; l++) {
        bool full = !c->layer_sliding[l];
        c->layer_k_eq_v[l] = k_eq_v && full;
        if (!cJSON_IsObject(plc) && full) { /* the defaults transformers applies without per_layer_config */
            c->layer_head_dim[l] = (uint16_t)FORGE__MIN(FORGE__MAX(global_hd, 0), 65535);
            if (k_eq_v && global_kv > 0) c->layer_kv_heads[l] = (uint16_t)FORGE__MIN(global_kv, 65535);
        }
    }
    if (cJSON_IsObject(plc)) {
        for (const cJSON *e = plc->child; e; e = e->next) {
            const char *key = e->string ? e->string : "";
            char *end = NULL;
            long idx = strtol(key, &end, 10);
            bool by_index = *key && end && !*end;
            bool full_type = !strcmp(key, "full_attention"), slide_type = !strcmp(key, "sliding_attention");
            if (!cJSON_IsObject(e) || (!by_index && !full_type && !slide_type) || (by_index && (idx < 0 || idx >= c->n_layers)))
                return forge__fail(err, FORGE_ERR_FORMAT, "%s: per_layer_config entry '%s' is not a layer index or layer type with an object",
                                   path, key);
            for (const cJSON *f = e->child; f; f = f->next) {
                int v = forge__json_int(e, f->string, -1);
                bool hd = !strcmp(f->string, "head_dim"), kv = !strcmp(f->string, "num_key_value_heads"),
                     ff = !strcmp(f->string, "intermediate_size");
                if (!hd && !kv && !ff)
                    return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: per_layer_config '%s' overrides '%s', which forge does not support "
                                       "(head_dim, num_key_value_heads, intermediate_size)", path, key, f->string);
                if (v <= 0 || v > 65535)
                    return forge__fail(err, FORGE_ERR_FORMAT, "%s: per_layer_config '%s'.%s must be a positive integer", path, key, f->string);
                for (int l = 0; l < c->n_layers; l++) {
                    if (by_index ? l != idx : (c->layer_sliding[l] != slide_type)) continue;
                    if (hd) c->layer_head_dim[l] = (uint16_t)v;
                    if (kv) c->layer_kv_heads[l] = (uint16_t)v;
                    if (ff) c->layer_ffn[l] = v;
                }
            }
        }
    }
    int shared = forge__json_int(o, "num_kv_shared_layers", 0);
    forge_status st = forge__kv_share_tail(c, shared, path, "num_kv_shared_layers", err);
    if (st) return st;
    bool wide = forge__json_bool(o, "use_double_wide_mlp", false);
    for (int l = c->n_layers - shared; l < c->n_layers; l++) {
        int src = c->kv_source[l];
        c->layer_head_dim[l] = c->layer_head_dim[src] ? c->layer_head_dim[src] : (uint16_t)c->head_dim;
        c->layer_kv_heads[l] = c->layer_kv_heads[src] ? c->layer_kv_heads[src] : (uint16_t)c->n_kv_heads;
        int ffn = c->layer_ffn[l] ? c->layer_ffn[l] : c->ffn;
        if (wide && ffn > INT_MAX / 2)
            return forge__fail(err, FORGE_ERR_FORMAT, "%s: intermediate_size %d out of range for use_double_wide_mlp", path, ffn);
        if (wide) c->layer_ffn[l] = 2 * ffn;
    }
    c->v_norm = true;
    c->ple_dim = forge__json_int(o, "hidden_size_per_layer_input", 0);
    c->ple_vocab = forge__json_int(o, "vocab_size_per_layer_input", c->n_vocab);
    if (c->ple_dim < 0 || (c->ple_dim && c->ple_vocab <= 0))
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: hidden_size_per_layer_input %d / vocab_size_per_layer_input %d out of range", path,
                           c->ple_dim, c->ple_vocab);
    if (forge__json_bool(o, "enable_moe_block", false)) {
        c->n_experts = forge__json_int(o, "num_experts", 0);
        c->n_experts_used = forge__json_int(o, "top_k_experts", 0);
        c->moe_ffn = forge__json_int(o, "moe_intermediate_size", 0);
        c->moe_norm_topk = true;
        c->router = FORGE__ROUTER_GEMMA4;
        if (c->n_experts <= 0) return forge__fail(err, FORGE_ERR_FORMAT, "%s: enable_moe_block needs num_experts > 0", path);
        memset(c->layer_moe, 1, (size_t)c->n_layers);
    }
    return FORGE_OK;
}

/* Qwen 3.5's text config `o` (transformers' Qwen3_5TextConfig / Qwen3_5MoeTextConfig): layer_types
 * (or full_attention_interval, default 4: every fourth layer full attention), the linear layers'
 * heads and convolution, partial RoPE (partial_rotary_factor, default 0.25, in rope_parameters or
 * beside it; the multimodal RoPE sections do not matter for text, whose three position ids are
 * equal), the experts and the shared expert. */
static forge_status forge__config_qwen35_json(const cJSON *o, const char *path, forge__config *c, forge__err *err) {
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(o, "layer_types");
    if (cJSON_IsArray(lt)) {
        if (cJSON_GetArraySize(lt) != c->n_layers)
            return forge__fail(err, FORGE_ERR_FORMAT, "%s: layer_types has %d entries for %d layers", path, cJSON_GetArraySize(lt), c->n_layers);
        for (int i = 0; i < c->n_layers; i++) {
            const cJSON *x = cJSON_GetArrayItem(lt, i);
            if (!cJSON_IsString(x) || (strcmp(x->valuestring, "linear_attention") && strcmp(x->valuestring, "full_attention")))
                return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: layer_types[%d] is not 'linear_attention' or 'full_attention'", path, i);
            c->layer_linear[i] = strcmp(x->valuestring, "linear_attention") == 0;
        }
    } else {
        int interval = forge__json_int(o, "full_attention_interval", 4);
        if (interval <= 0) return forge__fail(err, FORGE_ERR_FORMAT, "%s: full_attention_interval %d must be positive", path, interval);
        for (int i = 0; i < c->n_layers; i++) c->layer_linear[i] = (i + 1) % interval != 0;
    }
    c->lin_k_heads = forge__json_int(o, "linear_num_key_heads", 16);
    c->lin_v_heads = forge__json_int(o, "linear_num_value_heads", 32);
    c->lin_k_dim = forge__json_int(o, "linear_key_head_dim", 128);
    c->lin_v_dim = forge__json_int(o, "linear_value_head_dim", 128);
    c->lin_conv = forge__json_int(o, "linear_conv_kernel_dim", 4);
    c->attn_gate = true;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(o, "rope_parameters");
    double partial = forge__json_num(cJSON_IsObject(rp) ? rp : o, "partial_rotary_factor", forge__json_num(o, "partial_rotary_factor", 0.25));
    if (!(partial > 0 && partial <= 1)) return forge__fail(err, FORGE_ERR_FORMAT, "%s: partial_rotary_factor %g must be in (0, 1]", path, partial);
    if (c->rope_full.scaling != FORGE__ROPE_NONE)
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: Qwen 3.5 with a scaled RoPE is not supported (rope_type default)", path);
    c->rope_full.scaling = FORGE__ROPE_PARTIAL;
    c->rope_full.partial = partial;
    c->rope_sliding = c->rope_full;
    if (c->arch == FORGE__ARCH_QWEN35MOE) {
        c->n_experts = forge__json_int(o, "num_experts", 0);
        c->n_experts_used = forge__json_int(o, "num_experts_per_tok", 0);
        c->moe_ffn = forge__json_int(o, "moe_intermediate_size", 0);
        c->shared_ffn = forge__json_int(o, "shared_expert_intermediate_size", 0);
        c->moe_norm_topk = true; /* Qwen3_5MoeTopKRouter always renormalizes the chosen weights */
        c->router = FORGE__ROUTER_SOFTMAX;
        if (c->n_experts <= 0 || c->shared_ffn < 0)
            return forge__fail(err, FORGE_ERR_FORMAT, "%s: qwen3_5_moe needs num_experts > 0 (%d) and shared_expert_intermediate_size >= 0 (%d)",
                               path, c->n_experts, c->shared_ffn);
        memset(c->layer_moe, 1, (size_t)c->n_layers);
    }
    return FORGE_OK;
}

/* Parses an HF config.json (text) into *c. `path` names the file in messages. */
FORGE__INTERNAL forge_status forge__config_from_hf_json(const char *text, size_t len, const char *path,
                                                        forge__config *c, forge__err *err) {
    memset(c, 0, sizeof *c);
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: not a JSON object", path);
    }
    forge_status st = FORGE_OK;
    const cJSON *o = root;
    const char *mt = forge__json_str(root, "model_type");
    if (!mt) {
        st = forge__fail(err, FORGE_ERR_FORMAT, "%s: field 'model_type' is missing", path);
        goto done;
    }
    if (!strcmp(mt, "gemma3") || !strcmp(mt, "gemma4") || !strcmp(mt, "qwen3_5") || !strcmp(mt, "qwen3_5_moe")) {
        /* multimodal wrapper: the text model's config is nested */
        o = cJSON_GetObjectItemCaseSensitive(root, "text_config");
        if (!cJSON_IsObject(o)) {
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: model_type '%s' needs a 'text_config' object", path, mt);
            goto done;
        }
        c->arch = !strcmp(mt, "gemma3") ? FORGE__ARCH_GEMMA3 : !strcmp(mt, "gemma4") ? FORGE__ARCH_GEMMA4
                : !strcmp(mt, "qwen3_5") ? FORGE__ARCH_QWEN35 : FORGE__ARCH_QWEN35MOE;
        c->multimodal = true;
    } else if (!strcmp(mt, "llama")) c->arch = FORGE__ARCH_LLAMA;
    else if (!strcmp(mt, "mistral")) c->arch = FORGE__ARCH_MISTRAL;
    else if (!strcmp(mt, "qwen3_5_text")) c->arch = FORGE__ARCH_QWEN35;
    else if (!strcmp(mt, "qwen3_5_moe_text")) c->arch = FORGE__ARCH_QWEN35MOE;
    else if (!strcmp(mt, "qwen2")) c->arch = FORGE__ARCH_QWEN2;
    else if (!strcmp(mt, "qwen3")) c->arch = FORGE__ARCH_QWEN3;
    else if (!strcmp(mt, "qwen3_moe")) c->arch = FORGE__ARCH_QWEN3MOE;
    else if (!strcmp(mt, "gemma2")) c->arch = FORGE__ARCH_GEMMA2;
    else if (!strcmp(mt, "gemma3_text")) c->arch = FORGE__ARCH_GEMMA3;
    else if (!strcmp(mt, "gemma4_text")) c->arch = FORGE__ARCH_GEMMA4;
    else {
        st = forge__fail(err, FORGE_ERR_UNSUPPORTED,
                         "%s: model_type '%s' is not supported (llama, mistral, qwen2, qwen3, qwen3_moe, qwen3_5, qwen3_5_text, "
                         "qwen3_5_moe, qwen3_5_moe_text, gemma2, gemma3, gemma3_text, gemma4, gemma4_text)", path, mt);
        goto done;
    }
    bool gemma = c->arch == FORGE__ARCH_GEMMA2 || c->arch == FORGE__ARCH_GEMMA3 || c->arch == FORGE__ARCH_GEMMA4;
    c->hidden = forge__json_int(o, "hidden_size", 0);
    c->n_layers = forge__json_int(o, "num_hidden_layers", 0);
    c->n_heads = forge__json_int(o, "num_attention_heads", 0);
    c->n_kv_heads = forge__json_int(o, "num_key_value_heads", c->n_heads);
    c->ffn = forge__json_int(o, "intermediate_size", 0);
    /* Qwen 3.5-MoE has no dense MLP but the shared expert: the layers' dense MLP is that one */
    if (c->arch == FORGE__ARCH_QWEN35MOE && !cJSON_GetObjectItemCaseSensitive(o, "intermediate_size"))
        c->ffn = forge__json_int(o, "shared_expert_intermediate_size", 0);
    c->n_vocab = forge__json_int(o, "vocab_size", 0);
    c->n_ctx_train = forge__json_int(o, "max_position_embeddings", 2048);
    c->norm_eps = forge__json_num(o, "rms_norm_eps", 1e-6);
    {
        static const char *need[] = {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"};
        int vals[] = {c->hidden, c->n_layers, c->n_heads, c->ffn, c->n_vocab};
        for (int i = 0; i < 5; i++)
            if (vals[i] <= 0) {
                st = forge__fail(err, FORGE_ERR_FORMAT, "%s: field '%s' is missing or not a positive integer", path, need[i]);
                goto done;
            }
    }
    if (c->n_layers > FORGE__MAX_LAYERS) {
        st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: %d layers (forge supports up to %d)", path, c->n_layers, FORGE__MAX_LAYERS);
        goto done;
    }
    for (int l = 0; l < c->n_layers; l++) c->kv_source[l] = (int16_t)l;
    c->head_dim = forge__json_int(o, "head_dim", c->n_heads ? c->hidden / c->n_heads : 0);
    const char *dt = forge__json_str(o, "torch_dtype");
    if (!dt) dt = forge__json_str(o, "dtype");
    if (!dt) dt = forge__json_str(root, "torch_dtype");
    if (!dt) dt = forge__json_str(root, "dtype");
    c->dtype = dt ? forge__dtype_from_torch(dt) : FORGE__F32;
    if (c->dtype == FORGE__DTYPE_INVALID) {
        st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: dtype '%s' is not supported (float32, float16, bfloat16)", path, dt);
        goto done;
    }
    c->tied = forge__json_bool(o, "tie_word_embeddings", forge__json_bool(root, "tie_word_embeddings", gemma));
    {
        const cJSON *bd = cJSON_GetObjectItemCaseSensitive(o, "use_bidirectional_attention");
        c->bidirectional = cJSON_IsTrue(bd); /* Gemma 4's string values ("vision") concern its image tokens */
        const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
        const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
        const char *an = cJSON_IsString(a0) ? a0->valuestring : "";
        size_t al = strlen(an), sl = strlen("ForSequenceClassification");
        c->pad_id = forge__json_int(o, "pad_token_id", forge__json_int(root, "pad_token_id", -1));
        if (al > sl && !strcmp(an + al - sl, "ForSequenceClassification")) {
            const cJSON *labels = cJSON_GetObjectItemCaseSensitive(root, "id2label");
            c->n_labels = forge__json_int(root, "num_labels", cJSON_IsObject(labels) ? cJSON_GetArraySize(labels) : 2);
            if (c->n_labels <= 0 || c->n_labels > 65536) {
                st = forge__fail(err, FORGE_ERR_FORMAT, "%s: %s with %d labels", path, an, c->n_labels);
                goto done;
            }
            c->tied = false; /* the score head is the model's head */
        }
    }
    c->qkv_bias = c->arch == FORGE__ARCH_QWEN2 || forge__json_bool(o, "attention_bias", false);
    c->o_bias = c->arch == FORGE__ARCH_LLAMA && forge__json_bool(o, "attention_bias", false);
    c->qk_norm = c->arch == FORGE__ARCH_QWEN3 || c->arch == FORGE__ARCH_QWEN3MOE || c->arch == FORGE__ARCH_GEMMA3 ||
                 c->arch == FORGE__ARCH_GEMMA4 || forge__arch_qwen35(c->arch);
    /* Gemma 2 / 3 and Qwen 3.5 (zero-centred) multiply by (1 + w); Gemma 4's RMSNorm by w itself */
    c->norm_plus_one = (gemma && c->arch != FORGE__ARCH_GEMMA4) || forge__arch_qwen35(c->arch);
    c->sandwich_norms = gemma;
    c->act = FORGE__ACT_SILU;
    if (gemma) {
        const char *act = forge__json_str(o, "hidden_activation");
        if (!act) act = forge__json_str(o, "hidden_act");
        if (act && strcmp(act, "gelu_pytorch_tanh") && strcmp(act, "gelu_tanh")) {
            st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: hidden_activation '%s' is not supported (gelu_pytorch_tanh)", path, act);
            goto done;
        }
        c->act = FORGE__ACT_GELU_TANH;
    } else {
        const char *act = forge__json_str(o, "hidden_act");
        if (act && strcmp(act, "silu")) {
            st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: hidden_act '%s' is not supported (silu)", path, act);
            goto done;
        }
    }
    /* RoPE: old style (rope_theta + rope_scaling) or rope_parameters, which transformers 5
     * writes either flat or keyed by layer type ("full_attention", "sliding_attention"). */
    double theta = forge__json_num(o, "rope_theta", 10000.0);
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(o, "rope_parameters");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, "rope_scaling");
    if (c->arch == FORGE__ARCH_GEMMA4 && !cJSON_IsObject(rp)) {
        /* transformers' Gemma4TextConfig defaults: sliding layers plain RoPE at 1e4, full layers
         * proportional RoPE at 1e6 rotating a quarter of each head */
        c->rope_sliding = (forge__rope){.theta = 10000.0};
        c->rope_full = (forge__rope){.theta = 1000000.0, .scaling = FORGE__ROPE_PROPORTIONAL, .factor = 1.0, .partial = 0.25};
    } else if (cJSON_IsObject(rp) && cJSON_GetObjectItemCaseSensitive(rp, "full_attention")) {
        st = forge__rope_from_json(cJSON_GetObjectItemCaseSensitive(rp, "full_attention"), theta, &c->rope_full,
                                   "rope_parameters.full_attention", err);
        if (!st) {
            const cJSON *sl = cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention");
            st = forge__rope_from_json(sl, forge__json_num(o, "rope_local_base_freq", 10000.0), &c->rope_sliding,
                                       "rope_parameters.sliding_attention", err);
        }
    } else {
        st = forge__rope_from_json(cJSON_IsObject(rp) ? rp : rs, theta, &c->rope_full,
                                   cJSON_IsObject(rp) ? "rope_parameters" : "rope_scaling", err);
        c->rope_sliding = c->rope_full;
        if (c->arch == FORGE__ARCH_GEMMA3) { /* local layers: plain RoPE with rope_local_base_freq */
            memset(&c->rope_sliding, 0, sizeof c->rope_sliding);
            c->rope_sliding.theta = forge__json_num(o, "rope_local_base_freq", 10000.0);
        }
    }
    if (st) {
        forge__wrap(err, st, "%s", path);
        goto done;
    }
    /* Sliding windows */
    if (gemma) {
        c->sliding_window = forge__json_int(o, "sliding_window", 4096);
        c->attn_softcap = forge__json_num(o, "attn_logit_softcapping", 0.0);
        c->final_softcap = forge__json_num(o, "final_logit_softcapping", 0.0);
        const cJSON *lt = cJSON_GetObjectItemCaseSensitive(o, "layer_types");
        if (cJSON_IsArray(lt)) {
            if (cJSON_GetArraySize(lt) != c->n_layers) {
                st = forge__fail(err, FORGE_ERR_FORMAT, "%s: layer_types has %d entries for %d layers", path,
                                 cJSON_GetArraySize(lt), c->n_layers);
                goto done;
            }
            for (int i = 0; i < c->n_layers; i++) {
                const cJSON *x = cJSON_GetArrayItem(lt, i);
                if (!cJSON_IsString(x) || (strcmp(x->valuestring, "sliding_attention") && strcmp(x->valuestring, "full_attention"))) {
                    st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: layer_types[%d] is not 'sliding_attention' or 'full_attention'", path, i);
                    goto done;
                }
                c->layer_sliding[i] = strcmp(x->valuestring, "sliding_attention") == 0;
            }
        } else if (c->arch == FORGE__ARCH_GEMMA2) {
            for (int i = 0; i < c->n_layers; i++) c->layer_sliding[i] = (i % 2) == 0; /* even layers slide */
        } else {
            int pattern = forge__json_int(o, "sliding_window_pattern", 6);
            if (pattern <= 0) pattern = 6;
            for (int i = 0; i < c->n_layers; i++) c->layer_sliding[i] = ((i + 1) % pattern) != 0;
        }
        if (c->arch == FORGE__ARCH_GEMMA4) c->layer_sliding[c->n_layers - 1] = 0; /* as transformers forces it */
        if (c->sliding_window <= 0) memset(c->layer_sliding, 0, sizeof c->layer_sliding);
    }
    if (c->arch == FORGE__ARCH_GEMMA4 && (st = forge__config_gemma4_json(o, path, c, err))) goto done;
    if (forge__arch_qwen35(c->arch) && (st = forge__config_qwen35_json(o, path, c, err))) goto done;
    if (c->arch == FORGE__ARCH_MISTRAL) { /* sliding_window: null (v0.2 on) for full attention, else that window on every layer */
        const cJSON *sw = cJSON_GetObjectItemCaseSensitive(o, "sliding_window");
        if (sw && !cJSON_IsNull(sw)) {
            c->sliding_window = forge__json_int(o, "sliding_window", -1);
            if (c->sliding_window <= 0) {
                st = forge__fail(err, FORGE_ERR_FORMAT, "%s: sliding_window must be null or a positive integer", path);
                goto done;
            }
            memset(c->layer_sliding, 1, (size_t)c->n_layers);
        }
    }
    if (c->arch == FORGE__ARCH_QWEN3MOE) {
        c->n_experts = forge__json_int(o, "num_experts", forge__json_int(o, "num_local_experts", 0));
        c->n_experts_used = forge__json_int(o, "num_experts_per_tok", 0);
        c->moe_ffn = forge__json_int(o, "moe_intermediate_size", 0);
        c->moe_norm_topk = forge__json_bool(o, "norm_topk_prob", false);
        c->router = FORGE__ROUTER_SOFTMAX;
        int step = forge__json_int(o, "decoder_sparse_step", 1);
        if (c->n_experts <= 0 || step <= 0) {
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: qwen3_moe needs num_experts > 0 and decoder_sparse_step > 0 (%d, %d)", path,
                             c->n_experts, step);
            goto done;
        }
        for (int l = 0; l < c->n_layers; l++) c->layer_moe[l] = (l + 1) % step == 0;
        const cJSON *only = cJSON_GetObjectItemCaseSensitive(o, "mlp_only_layers"), *x;
        if (!cJSON_IsArray(only)) only = NULL;
        cJSON_ArrayForEach(x, only) {
            int l = forge__json_id(x);
            if (l < 0 || l >= c->n_layers) {
                st = forge__fail(err, FORGE_ERR_FORMAT, "%s: mlp_only_layers holds %s, not a layer index", path, cJSON_IsNumber(x) ? "a number out of range" : "a non-integer");
                goto done;
            }
            c->layer_moe[l] = 0;
        }
    }
    /* MLX affine quantization */
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization");
    if (!q) q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (cJSON_IsObject(q)) {
        const char *mode = forge__json_str(q, "mode");
        const char *method = forge__json_str(q, "quant_method");
        if ((mode && strcmp(mode, "affine")) || method) {
            st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: quantization %s '%s' is not supported (MLX affine)", path,
                             mode ? "mode" : "method", mode ? mode : method);
            goto done;
        }
        /* bits and group size (also per module) are read from each weight's shapes at load */
    }
    forge__config_finish(c, forge__json_num(o, "query_pre_attn_scalar", 0.0));
    if ((st = forge__config_validate(c, path, err))) goto done;
done:
    cJSON_Delete(root);
    return st;
}

/* "{arch}.<suffix>": one integer for every layer, or (Gemma 4's files) an array of one per
 * layer, into per[0..n_layers); *found false when the key is absent. */
static forge_status forge__gguf_layer_ints(const forge__gguf *g, const char *arch, const char *suffix, int n_layers, int32_t *per,
                                           bool *found, const char *path, forge__err *err) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    const forge__gguf_kv *kv = forge__gguf_find(g, key);
    *found = kv != NULL;
    if (!kv) return FORGE_OK;
    int64_t v;
    for (int l = 0; l < n_layers; l++) {
        if (kv->type != FORGE__GGUF_ARRAY) {
            if (!forge__gguf_get_int(g, key, &v)) return forge__fail(err, FORGE_ERR_FORMAT, "%s: %s is not an integer", path, key);
        } else if (kv->count != (uint64_t)n_layers || (kv->elem_type != FORGE__GGUF_INT32 && kv->elem_type != FORGE__GGUF_UINT32)) {
            return forge__fail(err, FORGE_ERR_FORMAT, "%s: %s must be an integer or %d 32-bit integers (one per layer)", path, key, n_layers);
        } else {
            int32_t x;
            memcpy(&x, kv->value + 4 * (size_t)l, 4);
            v = kv->elem_type == FORGE__GGUF_UINT32 ? (int64_t)(uint32_t)x : x;
        }
        if (v <= 0 || v > INT32_MAX) return forge__fail(err, FORGE_ERR_FORMAT, "%s: %s = %lld (layer %d) is out of range", path, key, (long long)v, l);
        per[l] = (int32_t)v;
    }
    return FORGE_OK;
}

/* Gemma 4 from llama.cpp's `gemma4` GGUF keys: the layer types (sliding_window_pattern, one bool
 * a layer), head sizes by type (key_length full, key_length_swa sliding), kv heads and MLP width
 * as one value or one a layer, the KV-shared tail (shared_kv_layers, forge__kv_share_tail),
 * K = V where a layer has no attn_v, per-layer
 * inputs, the experts. RoPE: sliding layers plain at freq_base_swa; full layers at freq_base
 * over the whole head with rope_freqs' divisors (1e30 for the pairs proportional RoPE leaves
 * alone). Norm weights are stored as HF has them (no + 1). */
static forge_status forge__config_gemma4_gguf(const forge__gguf *g, const forge__tensor_table *tt, const char *path, const char *arch,
                                              forge__config *c, forge__err *err) {
    char key[160], name[64];
    int64_t v;
    double d;
    forge_status st;
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", arch);
    const forge__gguf_kv *pk = forge__gguf_find(g, key);
    if (!pk || pk->type != FORGE__GGUF_ARRAY || pk->count != (uint64_t)c->n_layers ||
        (pk->elem_type != FORGE__GGUF_BOOL && pk->elem_type != FORGE__GGUF_UINT8 && pk->elem_type != FORGE__GGUF_INT8))
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: %s must be %d bools (true: a sliding layer)", path, key, c->n_layers);
    for (int l = 0; l < c->n_layers; l++) c->layer_sliding[l] = pk->value[l] != 0;
    snprintf(key, sizeof key, "%s.attention.sliding_window", arch);
    if (!forge__gguf_get_int(g, key, &v) || v <= 0 || v > INT32_MAX)
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: %s is missing or out of range", path, key);
    c->sliding_window = (int)v;
    /* head sizes: full layers key_length, sliding ones key_length_swa; values as wide, rotation over the whole head */
    int d_full = c->head_dim, d_swa = d_full;
    snprintf(key, sizeof key, "%s.attention.key_length_swa", arch);
    if (forge__gguf_get_int(g, key, &v)) {
        if (v <= 0 || v > FORGE__MAX_HEAD_DIM) return forge__fail(err, FORGE_ERR_FORMAT, "%s: %s = %lld is out of range", path, key, (long long)v);
        d_swa = (int)v;
    }
    const struct { const char *suffix; int want; } whole[4] = {
        {"attention.value_length", d_full}, {"attention.value_length_swa", d_swa},
        {"rope.dimension_count", d_full}, {"rope.dimension_count_swa", d_swa}};
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, whole[i].suffix);
        if (forge__gguf_get_int(g, key, &v) && v != whole[i].want)
            return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: %s = %lld differs from the head size %d (forge rotates and reads whole heads)",
                               path, key, (long long)v, whole[i].want);
    }
    int32_t per[FORGE__MAX_LAYERS];
    bool found;
    if ((st = forge__gguf_layer_ints(g, arch, "feed_forward_length", c->n_layers, per, &found, path, err))) return st;
    if (!found) return forge__fail(err, FORGE_ERR_FORMAT, "%s: metadata key '%s.feed_forward_length' is missing", path, arch);
    for (int l = 0; l < c->n_layers; l++) c->layer_ffn[l] = per[l];
    c->ffn = per[0];
    if ((st = forge__gguf_layer_ints(g, arch, "attention.head_count_kv", c->n_layers, per, &found, path, err))) return st;
    int first_sliding = 0;
    while (first_sliding < c->n_layers - 1 && !c->layer_sliding[first_sliding]) first_sliding++;
    for (int l = 0; l < c->n_layers; l++) {
        c->layer_kv_heads[l] = (uint16_t)FORGE__MIN(found ? per[l] : c->n_heads, 65535);
        c->layer_head_dim[l] = (uint16_t)(c->layer_sliding[l] ? d_swa : d_full);
    }
    c->head_dim = d_swa; /* transformers' head_dim: the sliding layers' */
    c->n_kv_heads = c->layer_kv_heads[first_sliding];
    snprintf(key, sizeof key, "%s.attention.shared_kv_layers", arch);
    int shared = forge__gguf_get_int(g, key, &v) ? (int)FORGE__MIN(FORGE__MAX(v, -1), INT32_MAX) : 0;
    if ((st = forge__kv_share_tail(c, shared, path, key, err))) return st;
    for (int l = 0; l < c->n_layers - shared; l++) {
        snprintf(name, sizeof name, "blk.%d.attn_v.weight", l);
        c->layer_k_eq_v[l] = forge__tensor_find(tt, name) == NULL; /* the converter writes no attn_v for K = V layers */
    }
    c->v_norm = true;
    snprintf(key, sizeof key, "%s.embedding_length_per_layer_input", arch);
    c->ple_dim = forge__gguf_get_int(g, key, &v) ? (int)FORGE__MIN(FORGE__MAX(v, -1), INT32_MAX) : 0;
    const forge__tensor *pt = forge__tensor_find(tt, "per_layer_token_embd.weight");
    c->ple_vocab = pt && pt->n_dims == 2 ? (int)FORGE__MIN(pt->shape[0], INT32_MAX) : c->n_vocab;
    snprintf(key, sizeof key, "%s.expert_count", arch);
    if (forge__gguf_get_int(g, key, &v)) {
        static const char *const moe_keys[3] = {"expert_count", "expert_used_count", "expert_feed_forward_length"};
        int *moe_fields[3] = {&c->n_experts, &c->n_experts_used, &c->moe_ffn};
        for (int i = 0; i < 3; i++) {
            snprintf(key, sizeof key, "%s.%s", arch, moe_keys[i]);
            if (!forge__gguf_get_int(g, key, &v) || v <= 0 || v > INT32_MAX)
                return forge__fail(err, FORGE_ERR_FORMAT, "%s: %s is missing or out of range", path, key);
            *moe_fields[i] = (int)v;
        }
        c->router = FORGE__ROUTER_GEMMA4;
        c->moe_norm_topk = true;
        for (int l = 0; l < c->n_layers; l++) {
            snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", l);
            c->layer_moe[l] = forge__tensor_find(tt, name) != NULL;
        }
    }
    memset(&c->rope_sliding, 0, sizeof c->rope_sliding);
    snprintf(key, sizeof key, "%s.rope.freq_base_swa", arch);
    c->rope_sliding.theta = forge__gguf_get_float(g, key, &d) ? d : 10000.0;
    snprintf(key, sizeof key, "%s.final_logit_softcapping", arch);
    c->final_softcap = forge__gguf_get_float(g, key, &d) ? d : 0.0;
    return FORGE_OK;
}

/* Qwen 3.5 from llama.cpp's `qwen35` / `qwen35moe` GGUF keys (its converter's Qwen3NextModel and
 * Qwen3_5TextModel; read as src/models/qwen35.cpp does): the layer types from
 * attention.recurrent_layers (one bool a layer, true: linear attention) or else
 * full_attention_interval (default 4: every fourth layer full attention); the linear layers from
 * ssm.conv_kernel, ssm.state_size (the key head dim), ssm.group_count (key heads),
 * ssm.time_step_rank (value heads) and ssm.inner_size (value heads x value head dim), their value
 * heads tiled (lin_v_tiled); partial RoPE over rope.dimension_count of the head (NEOX pairs within
 * them; the multimodal sections do not matter for text, whose positions are equal); the shared
 * expert's width expert_shared_feed_forward_length (else feed_forward_length). The norms hold
 * their 1 already (the converter adds it) and ssm_a is -exp(A_log) (model.c). */
static forge_status forge__config_qwen35_gguf(const forge__gguf *g, const char *path, const char *arch, int n_all, forge__config *c,
                                              forge__err *err) {
    char key[160];
    int64_t v;
    snprintf(key, sizeof key, "%s.attention.recurrent_layers", arch);
    const forge__gguf_kv *rk = forge__gguf_find(g, key);
    if (rk && rk->type == FORGE__GGUF_ARRAY) {
        /* one entry for each block of the file, the multi-token-prediction blocks' (false) included */
        if (rk->count != (uint64_t)n_all || (rk->elem_type != FORGE__GGUF_BOOL && rk->elem_type != FORGE__GGUF_UINT8 && rk->elem_type != FORGE__GGUF_INT8))
            return forge__fail(err, FORGE_ERR_FORMAT, "%s: %s must be %d bools (one per block; true: a linear-attention layer)", path, key, n_all);
        for (int l = 0; l < c->n_layers; l++) c->layer_linear[l] = rk->value[l] != 0;
    } else if (rk) {
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: %s must be an array of bools", path, key);
    } else {
        snprintf(key, sizeof key, "%s.full_attention_interval", arch);
        int64_t interval = forge__gguf_get_int(g, key, &v) ? v : 4;
        if (interval <= 0 || interval > INT32_MAX) return forge__fail(err, FORGE_ERR_FORMAT, "%s: %s = %lld must be positive", path, key, (long long)interval);
        for (int l = 0; l < c->n_layers; l++) c->layer_linear[l] = (l + 1) % interval != 0;
    }
    static const char *const ssm_keys[5] = {"ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size"};
    int ssm[5];
    for (int i = 0; i < 5; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, ssm_keys[i]);
        if (!forge__gguf_get_int(g, key, &v)) return forge__fail(err, FORGE_ERR_FORMAT, "%s: metadata key '%s' is missing", path, key);
        if (v <= 0 || v > INT32_MAX) return forge__fail(err, FORGE_ERR_FORMAT, "%s: %s = %lld is out of range", path, key, (long long)v);
        ssm[i] = (int)v;
    }
    if (ssm[4] % ssm[3])
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: %s.ssm.inner_size %d is not a multiple of %s.ssm.time_step_rank %d (the value heads)", path,
                           arch, ssm[4], arch, ssm[3]);
    c->lin_conv = ssm[0], c->lin_k_dim = ssm[1], c->lin_k_heads = ssm[2], c->lin_v_heads = ssm[3], c->lin_v_dim = ssm[4] / ssm[3];
    c->lin_v_tiled = c->lin_k_heads != c->lin_v_heads;
    c->attn_gate = true;
    c->qk_norm = true; /* (layer 0 is usually a linear layer, without attn_q_norm) */
    snprintf(key, sizeof key, "%s.attention.value_length", arch);
    if (forge__gguf_get_int(g, key, &v) && v != c->head_dim)
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: %s = %lld differs from the key length %d", path, key, (long long)v, c->head_dim);
    if (c->rope_full.scaling != FORGE__ROPE_NONE)
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: Qwen 3.5 with a scaled RoPE (%s.rope.scaling.type) is not supported", path, arch);
    snprintf(key, sizeof key, "%s.rope.dimension_count", arch);
    int64_t n_rot = forge__gguf_get_int(g, key, &v) ? v : c->head_dim;
    if (n_rot < 2 || n_rot > c->head_dim || n_rot % 2)
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: %s = %lld must be even and in [2, %d] (the head size)", path, key, (long long)n_rot, c->head_dim);
    c->rope_full.scaling = FORGE__ROPE_PARTIAL;
    c->rope_full.partial = (double)n_rot / c->head_dim;
    if ((int64_t)(c->head_dim * c->rope_full.partial) != n_rot) c->rope_full.partial = nextafter(c->rope_full.partial, 2.0);
    c->rope_sliding = c->rope_full;
    if (c->arch == FORGE__ARCH_QWEN35MOE) { /* the experts' keys are read as qwen3moe's; every layer's MLP is the shared expert's */
        snprintf(key, sizeof key, "%s.expert_shared_feed_forward_length", arch);
        c->shared_ffn = forge__gguf_get_int(g, key, &v) ? (int)FORGE__MIN(FORGE__MAX(v, -1), INT32_MAX) : c->ffn;
        if (c->shared_ffn <= 0)
            return forge__fail(err, FORGE_ERR_FORMAT, "%s: metadata key '%s' (or %s.feed_forward_length) is missing or not positive", path, key, arch);
        c->ffn = c->shared_ffn;
    }
    return FORGE_OK;
}

/* Fills *c from GGUF metadata (llama.cpp's keys: "{arch}.embedding_length", ...). */
FORGE__INTERNAL forge_status forge__config_from_gguf(const forge__gguf *g, const forge__tensor_table *tt,
                                                     const char *path, forge__config *c, forge__err *err) {
    memset(c, 0, sizeof *c);
    const char *as;
    uint64_t alen;
    if (!forge__gguf_get_str(g, "general.architecture", &as, &alen))
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: metadata key 'general.architecture' is missing", path);
    char arch[64];
    snprintf(arch, sizeof arch, "%.*s", (int)FORGE__MIN(alen, 63), as);
    int a = -1;
    for (int i = 0; i < FORGE__ARCH_COUNT; i++)
        if (!strcmp(arch, forge__arch_names[i])) a = i;
    if (a < 0)
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: architecture '%s' is not supported in GGUF files (llama, qwen2, qwen3, qwen3moe, "
                           "gemma2, gemma3, gemma4, qwen35, qwen35moe)", path, arch);
    c->arch = (forge__arch)a;
    char key[160];
    int64_t v;
#define FORGE__GGUF_INT(field, suffix, required)                                                              \
    snprintf(key, sizeof key, "%s." suffix, arch);                                                            \
    if (forge__gguf_get_int(g, key, &v)) {                                                                    \
        if (v <= 0 || v > INT32_MAX) return forge__fail(err, FORGE_ERR_FORMAT, "%s: %s = %lld is out of range", path, key, (long long)v); \
        c->field = (int)v;                                                                                    \
    } else if (required) return forge__fail(err, FORGE_ERR_FORMAT, "%s: metadata key '%s' is missing", path, key);
    FORGE__GGUF_INT(hidden, "embedding_length", true)
    FORGE__GGUF_INT(n_layers, "block_count", true)
    FORGE__GGUF_INT(n_heads, "attention.head_count", true)
    /* gemma4: maybe one a layer (below); qwen35moe: the shared expert's width may stand in (forge__config_qwen35_gguf) */
    FORGE__GGUF_INT(ffn, "feed_forward_length", a != FORGE__ARCH_GEMMA4 && a != FORGE__ARCH_QWEN35MOE)
    FORGE__GGUF_INT(n_ctx_train, "context_length", false)
    c->n_kv_heads = c->n_heads;
    if (a != FORGE__ARCH_GEMMA4) { FORGE__GGUF_INT(n_kv_heads, "attention.head_count_kv", false) }
    c->head_dim = c->hidden / c->n_heads;
    FORGE__GGUF_INT(head_dim, "attention.key_length", false)
    FORGE__GGUF_INT(n_vocab, "vocab_size", false)
    if (c->arch == FORGE__ARCH_QWEN3MOE || c->arch == FORGE__ARCH_QWEN35MOE) {
        /* llama.cpp's qwen3moe and qwen35moe graphs: softmax over all experts, the top expert_used_count
         * renormalized (norm_topk_prob is not stored; expert_weights_norm where a file has it) */
        FORGE__GGUF_INT(n_experts, "expert_count", true)
        FORGE__GGUF_INT(n_experts_used, "expert_used_count", true)
        FORGE__GGUF_INT(moe_ffn, "expert_feed_forward_length", false)
        if (!c->moe_ffn) c->moe_ffn = c->ffn / c->n_experts_used; /* llama.cpp's fallback */
        c->router = FORGE__ROUTER_SOFTMAX;
        snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
        c->moe_norm_topk = !forge__gguf_get_int(g, key, &v) || v != 0;
    }
#undef FORGE__GGUF_INT
    int n_all = c->n_layers; /* the file's blocks: Qwen 3.5's multi-token-prediction blocks come after the decoder's */
    snprintf(key, sizeof key, "%s.nextn_predict_layers", arch);
    if (forge__arch_qwen35(a) && forge__gguf_get_int(g, key, &v)) {
        if (v < 0 || v >= n_all) return forge__fail(err, FORGE_ERR_FORMAT, "%s: %s = %lld must be in [0, %d)", path, key, (long long)v, n_all);
        c->n_layers -= (int)v; /* forge runs the decoder and leaves them alone */
    }
    if (c->n_layers > FORGE__MAX_LAYERS)
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: %d layers (forge supports up to %d)", path, c->n_layers, FORGE__MAX_LAYERS);
    for (int l = 0; l < c->n_layers; l++) {
        c->kv_source[l] = (int16_t)l;
        if (c->n_experts) { /* a sparse layer has a router (llama.cpp's have one everywhere; dense layers as forge's converter writes them) */
            char name[64];
            snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", l);
            c->layer_moe[l] = forge__tensor_find(tt, name) != NULL;
        }
    }
    if (!c->n_ctx_train) c->n_ctx_train = 2048;
    const forge__tensor *emb = forge__tensor_find(tt, "token_embd.weight");
    if (!c->n_vocab) {
        const forge__gguf_kv *tok = forge__gguf_find(g, "tokenizer.ggml.tokens");
        if (tok && tok->type == FORGE__GGUF_ARRAY) c->n_vocab = (int)tok->count;
        else if (emb && emb->n_dims == 2) c->n_vocab = (int)emb->shape[0];
        else return forge__fail(err, FORGE_ERR_FORMAT, "%s: cannot tell the vocabulary size (no %s.vocab_size, tokens or token_embd)", path, arch);
    }
    double d;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    c->norm_eps = forge__gguf_get_float(g, key, &d) ? d : 1e-5;
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    c->rope_full.theta = forge__gguf_get_float(g, key, &d) ? d : 10000.0;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    const char *rst;
    uint64_t rsl;
    if (forge__gguf_get_str(g, key, &rst, &rsl) && !(rsl == 4 && !memcmp(rst, "none", 4))) {
        if (rsl == 6 && !memcmp(rst, "linear", 6)) {
            c->rope_full.scaling = FORGE__ROPE_LINEAR;
            snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
            c->rope_full.factor = forge__gguf_get_float(g, key, &d) ? d : 1.0;
        } else {
            return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: %s '%.*s' is not supported", path, key, (int)FORGE__MIN(rsl, 64), rst);
        }
    }
    c->rope_sliding = c->rope_full;
    /* llama.cpp's converters permute q/k rows of `llama` checkpoints so that RoPE rotates
     * adjacent pairs; the other architectures keep HF's rotate-half layout (NEOX). */
    c->rope_adjacent_pairs = c->arch == FORGE__ARCH_LLAMA;
    c->tied = forge__tensor_find(tt, "output.weight") == NULL;
    c->qkv_bias = forge__tensor_find(tt, "blk.0.attn_q.bias") != NULL;
    c->o_bias = forge__tensor_find(tt, "blk.0.attn_output.bias") != NULL;
    c->qk_norm = forge__tensor_find(tt, "blk.0.attn_q_norm.weight") != NULL;
    bool gemma = c->arch == FORGE__ARCH_GEMMA2 || c->arch == FORGE__ARCH_GEMMA3;
    c->norm_plus_one = false; /* llama.cpp's Gemma 2/3 converters already add 1 to the norm weights; Gemma 4's multiply by w */
    c->sandwich_norms = gemma || c->arch == FORGE__ARCH_GEMMA4;
    c->act = c->sandwich_norms ? FORGE__ACT_GELU_TANH : FORGE__ACT_SILU;
    c->dtype = emb && (emb->dtype == FORGE__F16 || emb->dtype == FORGE__BF16) ? emb->dtype : FORGE__F32;
    if (c->arch == FORGE__ARCH_GEMMA4) {
        forge_status st4 = forge__config_gemma4_gguf(g, tt, path, arch, c, err);
        if (st4) return st4;
    }
    if (forge__arch_qwen35(c->arch)) {
        forge_status st35 = forge__config_qwen35_gguf(g, path, arch, n_all, c, err);
        if (st35) return st35;
    }
    if (gemma) {
        snprintf(key, sizeof key, "%s.attention.sliding_window", arch);
        c->sliding_window = forge__gguf_get_int(g, key, &v) ? (int)v : 4096;
        snprintf(key, sizeof key, "%s.attn_logit_softcapping", arch);
        c->attn_softcap = forge__gguf_get_float(g, key, &d) ? d : 0.0;
        snprintf(key, sizeof key, "%s.final_logit_softcapping", arch);
        c->final_softcap = forge__gguf_get_float(g, key, &d) ? d : 0.0;
        if (c->arch == FORGE__ARCH_GEMMA2) {
            for (int i = 0; i < c->n_layers; i++) c->layer_sliding[i] = (i % 2) == 0;
        } else {
            /* the pattern: a period, or one bool per layer (newer llama.cpp); else every 6th layer is full */
            snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", arch);
            const forge__gguf_kv *pk = forge__gguf_find(g, key);
            if (pk && pk->type == FORGE__GGUF_ARRAY) {
                if (pk->count != (uint64_t)c->n_layers || (pk->elem_type != FORGE__GGUF_BOOL && pk->elem_type != FORGE__GGUF_UINT8 && pk->elem_type != FORGE__GGUF_INT8))
                    return forge__fail(err, FORGE_ERR_FORMAT, "%s: %s must be an integer period or %d bools", path, key, c->n_layers);
                for (int i = 0; i < c->n_layers; i++) c->layer_sliding[i] = pk->value[i] != 0;
            } else {
                int pattern = forge__gguf_get_int(g, key, &v) && v > 0 ? (int)v : 6;
                for (int i = 0; i < c->n_layers; i++) c->layer_sliding[i] = ((i + 1) % pattern) != 0;
            }
            /* local layers: plain RoPE at rope.freq_base_swa (older converters wrote none: 10000) */
            memset(&c->rope_sliding, 0, sizeof c->rope_sliding);
            snprintf(key, sizeof key, "%s.rope.freq_base_swa", arch);
            c->rope_sliding.theta = forge__gguf_get_float(g, key, &d) ? d : 10000.0;
        }
    }
    /* llama.cpp scales Gemma's queries by 1/sqrt(head_dim), or 1/sqrt(hidden/heads) for the
     * 27B models (46 and 62 layers), unless the file says otherwise in attention.scale */
    double qpas = 0.0;
    if (gemma && ((c->arch == FORGE__ARCH_GEMMA2 && c->n_layers == 46) || (c->arch == FORGE__ARCH_GEMMA3 && c->n_layers == 62)))
        qpas = (double)c->hidden / c->n_heads;
    forge__config_finish(c, qpas);
    forge_status st = forge__config_validate(c, path, err);
    if (st) return st;
    snprintf(key, sizeof key, "%s.attention.scale", arch);
    if (forge__gguf_get_float(g, key, &d)) {
        if (!(d > 0 && d < 10)) return forge__fail(err, FORGE_ERR_FORMAT, "%s: %s = %g is out of range", path, key, d);
        c->attn_scale = d;
    }
    return FORGE_OK;
}


/* ---- sentence-transformers: how a checkpoint embeds (forge_embed) ----
 *
 * A checkpoint published for sentence-transformers names its pipeline in modules.json: the
 * Transformer (the model forge loads), Pooling (1_Pooling/config.json), Dense projections
 * (N_Dense/config.json and model.safetensors: linear.weight [out, in], linear.bias [out]) and
 * Normalize, in order; config_sentence_transformers.json its prompts, sentence_bert_config.json
 * its max_seq_length. Read at load; a fault in them does not stop the model from loading
 * (it can still generate) but is what forge_embed returns. */

#define FORGE__ST_MAX_STEPS 8
typedef struct forge__st_dense {
    int in, out;
    float *w;                     /* [out, in] */
    float *b;                     /* [out] or NULL */
    bool tanh;                    /* activation_function Tanh; else Identity */
    forge__tensor wt, bt;         /* w and b as f32 tensors of the arena, for the device's copy (model.c) */
} forge__st_dense;

typedef struct forge__st {
    bool present;                 /* modules.json was read */
    forge_status st;              /* reading them: FORGE_OK, or the fault forge_embed returns */
    char msg[512];
    int pooling;                  /* forge_pooling, never DEFAULT: LAST without a Pooling module */
    int n_steps;                  /* after pooling, in order: a Dense (its index) or Normalize (-1) */
    int steps[FORGE__ST_MAX_STEPS];
    int n_dense;
    forge__st_dense dense[FORGE__ST_MAX_STEPS];
    int max_seq;                  /* max_seq_length; 0: none */
    int n_prompts;
    const char **prompt_names, **prompts;
    char *prompt_names_csv;       /* "query,document" */
    const char *default_prompt;   /* default_prompt_name's, or NULL */
} forge__st;

static cJSON *forge__st_json(const char *dir, const char *name, forge__err *err, forge_status *st) {
    char path[4200], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *st = FORGE_OK;
    if (!forge__file_exists(path)) return NULL;
    if ((*st = forge__read_text(path, &text, &len, err))) return NULL;
    cJSON *o = cJSON_ParseWithLength(text, len);
    free(text);
    if (!o) *st = forge__fail(err, FORGE_ERR_FORMAT, "%s: not JSON", path);
    return o;
}

/* A Dense module's weights from DIR/PATH into d (f32 in the arena). */
static forge_status forge__st_dense_load(const char *dir, const char *mpath, const cJSON *cfg, forge__st_dense *d, forge__arena *a,
                                         forge__err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s/config.json", dir, mpath);
    d->in = forge__json_int(cfg, "in_features", 0);
    d->out = forge__json_int(cfg, "out_features", 0);
    if (d->in <= 0 || d->out <= 0 || d->in > (1 << 20) || d->out > (1 << 20))
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: in_features %d, out_features %d", path, d->in, d->out);
    const char *act = forge__json_str(cfg, "activation_function");
    if (!act) act = "torch.nn.modules.linear.Identity";
    d->tanh = strstr(act, "Tanh") != NULL;
    if (!d->tanh && !strstr(act, "Identity"))
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: activation_function '%s' is not supported (Identity, Tanh)", path, act);
    bool bias = forge__json_bool(cfg, "bias", true);
    snprintf(path, sizeof path, "%s/%s/model.safetensors", dir, mpath);
    if (!forge__file_exists(path))
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: missing (forge reads a Dense module's weights from model.safetensors only)", path);
    forge__file f;
    forge_status st = forge__file_map(&f, path, err);
    if (st) return st;
    forge__tensor_table tt = {0};
    st = forge__safetensors_parse_meta(&f, &tt, a, NULL, err);
    for (int part = 0; part < 2 && !st; part++) {
        const char *name = part ? "linear.bias" : "linear.weight";
        if (part && !bias) break;
        const forge__tensor *t = forge__tensor_find(&tt, name);
        int64_t want = part ? d->out : (int64_t)d->out * d->in;
        if (!t) {
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: no tensor '%s'", path, name);
            break;
        }
        int64_t have = 1;
        for (int i = 0; i < t->n_dims; i++) have *= t->shape[i];
        bool shape_ok = part ? (t->n_dims == 1 && have == want) : (t->n_dims == 2 && t->shape[0] == d->out && t->shape[1] == d->in);
        if (!shape_ok || (t->dtype != FORGE__F32 && t->dtype != FORGE__F16 && t->dtype != FORGE__BF16)) {
            char shape[96];
            forge__shape_str(t, shape, sizeof shape);
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: '%s' is %s %s; want %s [%d%s%d]", path, name, forge__dtype_name(t->dtype), shape,
                             "F32/F16/BF16", d->out, part ? "" : ", ", part ? 0 : d->in);
            break;
        }
        float *v = (float *)forge__arena_alloc(a, 4ull * (size_t)want, 16);
        if (!v) {
            st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
            break;
        }
        for (int64_t i = 0; i < want; i++) {
            const uint8_t *s = t->data + i * (t->dtype == FORGE__F32 ? 4 : 2);
            uint16_t h;
            if (t->dtype == FORGE__F32) memcpy(&v[i], s, 4);
            else {
                memcpy(&h, s, 2);
                v[i] = t->dtype == FORGE__F16 ? forge__f16_to_f32(h) : forge__bf16_to_f32(h);
            }
        }
        if (part) d->b = v;
        else d->w = v;
        forge__tensor *ft = part ? &d->bt : &d->wt;
        char tn[4400];
        snprintf(tn, sizeof tn, "%s/%s", mpath, name);
        *ft = (forge__tensor){forge__arena_strdup(a, tn), FORGE__F32, part ? 1 : 2, {part ? d->out : d->out, part ? 0 : d->in},
                              (const uint8_t *)v, 4ull * (uint64_t)want, forge__arena_strdup(a, path), false};
        if (!ft->name || !ft->file) st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    forge__file_unmap(&f);
    return st;
}

static forge_status forge__st_read(forge__st *s, const char *dir, forge__arena *a, forge__err *err) {
    forge_status st;
    char path[4200];
    cJSON *mods = forge__st_json(dir, "modules.json", err, &st);
    if (st) return st;
    if (mods) {
        s->present = true;
        snprintf(path, sizeof path, "%s/modules.json", dir);
        const cJSON *it;
        int i = 0;
        if (!cJSON_IsArray(mods)) st = forge__fail(err, FORGE_ERR_FORMAT, "%s: not an array of modules", path);
        cJSON_ArrayForEach(it, (cJSON_IsArray(mods) ? mods : NULL)) {
            const char *type = forge__json_str(it, "type"), *mp = forge__json_str(it, "path");
            const char *dot = type ? strrchr(type, '.') : NULL, *kind = dot ? dot + 1 : type ? type : "";
            if (!mp) mp = "";
            if (!strcmp(kind, "Transformer")) {
                if (i != 0) st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: the Transformer is module %d (forge runs it first)", path, i);
            } else if (i == 0) {
                st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: module 0 is '%s', not a Transformer", path, type ? type : "?");
            } else if (!strcmp(kind, "Pooling")) {
                char pp[4400];
                snprintf(pp, sizeof pp, "%s/config.json", mp);
                cJSON *pc = forge__st_json(dir, pp, err, &st);
                if (!st && !pc) st = forge__fail(err, FORGE_ERR_FORMAT, "%s/%s: missing", dir, pp);
                static const char *const modes[] = {"pooling_mode_lasttoken", "pooling_mode_mean_tokens", "pooling_mode_cls_token"};
                static const char *const other[] = {"pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens"};
                int n_on = 0;
                for (int k = 0; k < 3 && !st; k++)
                    if (forge__json_bool(pc, modes[k], false)) {
                        n_on++;
                        s->pooling = k == 0 ? FORGE_POOLING_LAST : k == 1 ? FORGE_POOLING_MEAN : FORGE_POOLING_CLS;
                    }
                for (int k = 0; k < 3 && !st; k++)
                    if (forge__json_bool(pc, other[k], false)) st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s/%s: %s is not supported", dir, pp, other[k]);
                const char *pm = forge__json_str(pc, "pooling_mode"); /* the older single-string form */
                if (!st && !n_on && pm) {
                    n_on = 1;
                    if (!strcmp(pm, "lasttoken")) s->pooling = FORGE_POOLING_LAST;
                    else if (!strcmp(pm, "mean")) s->pooling = FORGE_POOLING_MEAN;
                    else if (!strcmp(pm, "cls")) s->pooling = FORGE_POOLING_CLS;
                    else st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s/%s: pooling_mode '%s' is not supported (lasttoken, mean, cls)", dir, pp, pm);
                }
                if (!st && n_on != 1) st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s/%s: %d pooling modes on (forge takes one)", dir, pp, n_on);
                if (!st && !forge__json_bool(pc, "include_prompt", true))
                    st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s/%s: include_prompt false is not supported", dir, pp);
                cJSON_Delete(pc);
            } else if (!strcmp(kind, "Dense") || !strcmp(kind, "Normalize")) {
                if (s->n_steps == FORGE__ST_MAX_STEPS) st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: more than %d modules", path, FORGE__ST_MAX_STEPS);
                else if (kind[0] == 'N') s->steps[s->n_steps++] = -1;
                else {
                    char dp[4400];
                    snprintf(dp, sizeof dp, "%s/config.json", mp);
                    cJSON *dc = forge__st_json(dir, dp, err, &st);
                    if (!st && !dc) st = forge__fail(err, FORGE_ERR_FORMAT, "%s/%s: missing", dir, dp);
                    if (!st) st = forge__st_dense_load(dir, mp, dc, &s->dense[s->n_dense], a, err);
                    cJSON_Delete(dc);
                    if (!st) s->steps[s->n_steps++] = s->n_dense++;
                }
            } else {
                st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: module '%s' is not supported (Transformer, Pooling, Dense, Normalize)", path,
                                 type ? type : "?");
            }
            if (st) break;
            i++;
        }
        cJSON_Delete(mods);
        if (st) return st;
    }
    cJSON *cst = forge__st_json(dir, "config_sentence_transformers.json", err, &st);
    if (st) return st;
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(cst, "prompts"), *it;
    int n = 0;
    cJSON_ArrayForEach(it, (cJSON_IsObject(pr) ? pr : NULL)) n += cJSON_IsString(it) && it->string;
    s->prompt_names = (const char **)forge__arena_alloc(a, sizeof(char *) * (size_t)(n + 1), 16);
    s->prompts = (const char **)forge__arena_alloc(a, sizeof(char *) * (size_t)(n + 1), 16);
    forge__buf csv;
    forge__buf_init(&csv, NULL, 0);
    cJSON_ArrayForEach(it, (cJSON_IsObject(pr) ? pr : NULL)) {
        if (!cJSON_IsString(it) || !it->string || !s->prompts) continue;
        s->prompt_names[s->n_prompts] = forge__arena_strdup(a, it->string);
        s->prompts[s->n_prompts++] = forge__arena_strdup(a, it->valuestring);
        if (csv.n) forge__buf_put(&csv, ",", 1);
        forge__buf_put(&csv, it->string, strlen(it->string));
    }
    forge__buf_put(&csv, "", 1);
    s->prompt_names_csv = csv.oom ? NULL : forge__arena_strdup(a, csv.p);
    forge__buf_free(&csv);
    const char *dp = forge__json_str(cst, "default_prompt_name");
    for (int k = 0; dp && k < s->n_prompts; k++)
        if (!strcmp(s->prompt_names[k], dp)) s->default_prompt = s->prompt_names[k];
    cJSON_Delete(cst);
    if (!s->prompt_names || !s->prompts || !s->prompt_names_csv) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    cJSON *sb = forge__st_json(dir, "sentence_bert_config.json", err, &st);
    if (st) return st;
    s->max_seq = FORGE__MAX(forge__json_int(sb, "max_seq_length", 0), 0);
    cJSON_Delete(sb);
    return FORGE_OK;
}

/* The length of the vector after the steps (the last Dense's output, else hidden). */
static int forge__st_dim(const forge__st *e, int hidden) { return e->n_dense ? e->dense[e->n_dense - 1].out : hidden; }

/* Whether the steps can run on the device after pooling: Dense without activation, then at most
 * one Normalize at the end (the host's). */
static bool forge__st_device_steps(const forge__st *e) {
    for (int k = 0; k < e->n_steps; k++) {
        if (e->steps[k] < 0 && k != e->n_steps - 1) return false;
        if (e->steps[k] >= 0 && e->dense[e->steps[k]].tanh) return false;
    }
    return e->n_dense > 0;
}

/* The sentence-transformers pipeline of the checkpoint in dir (none: last-token pooling); a
 * fault is kept in s->st and s->msg, for forge_embed to return. */
static void forge__st_load(forge__st *s, const char *dir, forge__arena *a) {
    memset(s, 0, sizeof *s);
    s->pooling = FORGE_POOLING_LAST;
    forge__err e;
    memset(&e, 0, sizeof e);
    s->st = forge__st_read(s, dir, a, &e);
    if (s->st) snprintf(s->msg, sizeof s->msg, "%s", e.msg);
}
