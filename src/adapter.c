/* src/adapter.c: LoRA adapter files.
 * Owns: LoRA targets, adapters on the host, PEFT and mlx-lm adapter files (read and written,
 * atomically), the model's adapter at load (forge_model_params.adapter_path) and merging it
 * into the weights, the adapter's identity (state files name it).
 * May call: base.c, files.c, config.c, tokenizer.c, device.c, ops.c, model.c, session.c, exec.c.
 *
 * An adapter is a pair of f32 matrices (A, B) per adapted projection of each layer. Files are
 * read as PEFT (adapter_config.json + adapter_model.safetensors) or mlx-lm
 * (adapter_config.json + adapters.safetensors) writes them, and written in either form to a
 * temporary name, flushed and renamed. The trainer (train.c) reads and writes these; a model
 * loaded with adapter_path adds the pair's low-rank path to every forward pass (forward.c), or
 * has it folded into its weights (forge__model_merge_adapter).
 */

/* ---- Targets ---- */

/* The module a target sits in, as HF names it: layers.N.<group>.<target>. A mixture-of-experts
 * layer's MLP projections are its shared expert's (Qwen 3.5-MoE's mlp.shared_expert.gate_proj):
 * the routed experts are fused parameters in transformers, which PEFT's target names do not reach. */
static const char *forge__target_group(const forge__config *c, forge__target t) {
    return t <= FORGE__T_O ? "self_attn" : t <= FORGE__T_DOWN ? (c->shared_ffn > 0 ? "mlp.shared_expert" : "mlp") : "linear_attn";
}

/* Whether layer l has projection t: attention's on attention layers, the linear attention's on
 * Qwen 3.5's linear ones, the MLP's on every layer with a dense MLP (Qwen 3 MoE's sparse layers
 * have none; Qwen 3.5-MoE's shared expert is one). */
static bool forge__target_on(const forge__config *c, int l, forge__target t) {
    if (t >= FORGE__T_GATE && t <= FORGE__T_DOWN) return !c->layer_moe[l] || c->shared_ffn > 0;
    return (t >= FORGE__T_LIN_QKV) == (c->layer_linear[l] != 0);
}

/* Why adapters (and so training) do not fit model c's layers, or NULL where they do: layers of
 * one shape (no Gemma 4 extras), Qwen 3.5's linear-attention layers beside full-attention layers of
 * one shape, and experts behind a softmax router (Qwen 3 MoE, Qwen 3.5-MoE: frozen, with the
 * backward pass through them and their router). */
static const char *forge__lora_unsupported(const forge__config *c) {
    if (c->n_experts && c->router != FORGE__ROUTER_SOFTMAX) return "Gemma 4's experts: forge's backward pass takes a softmax router's";
    if (c->ple_dim || c->v_norm) return "Gemma 4's per-layer inputs and value norms";
    for (int l = 0; l < c->n_layers; l++) {
        if (forge__kv_shared(c, l) || c->layer_k_eq_v[l]) return "layers sharing another layer's KV cache, or keys as values";
        if (c->layer_ffn[l] != c->ffn) return "MLPs of different widths";
        if (!c->layer_linear[l] && (forge__hd(c, l) != (uint32_t)c->head_dim || forge__nkv(c, l) != (uint32_t)c->n_kv_heads))
            return "attention layers of different shapes";
    }
    return NULL;
}

/* The targets' names, comma-separated (messages). */
static const char *forge__target_list(void) {
    return "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj";
}

/* Parses HF projection names ("q_proj,v_proj", or "all") into a mask of forge__target. */
static forge_status forge__targets_parse(const char *list, uint32_t *mask, forge__err *err) {
    *mask = 0;
    if (!list || !*list) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "no LoRA targets given");
    if (!strcmp(list, "all")) {
        *mask = FORGE__T_ALL;
        return FORGE_OK;
    }
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        int t = 0;
        while (t < FORGE__T_COUNT && (strlen(forge__target_names[t]) != n || strncmp(p, forge__target_names[t], n))) t++;
        if (t == FORGE__T_COUNT)
            return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "LoRA target '%.*s' is not one of %s (or all)", (int)n, p, forge__target_list());
        *mask |= 1u << t;
        p += n + (e ? 1 : 0);
    }
    return FORGE_OK;
}

/* The in and out features of projection t (Qwen 3.5's q_proj: each head's query and output gate). */
static void forge__target_dims(const forge__config *c, forge__target t, uint32_t *in, uint32_t *out) {
    uint32_t H = (uint32_t)c->hidden, QD = (uint32_t)(c->n_heads * c->head_dim), KVD = (uint32_t)(c->n_kv_heads * c->head_dim);
    uint32_t F = (uint32_t)c->ffn, CD = forge__lin_conv_dim(c), VD = forge__lin_v_dim(c), NV = (uint32_t)c->lin_v_heads;
    const uint32_t ins[FORGE__T_COUNT] = {H, H, H, QD, H, H, F, H, H, H, H, VD};
    const uint32_t outs[FORGE__T_COUNT] = {c->attn_gate ? 2 * QD : QD, KVD, KVD, H, F, F, H, CD, VD, NV, NV, H};
    *in = ins[t];
    *out = outs[t];
}

/* ---- Adapters on the host ----
 * A and B in forge's layout: A [rank, in], B [out, rank], f32. Where forge keeps a projection's
 * outputs in another order than HF, B's rows follow them: a GGUF llama's q and k rows rotate
 * adjacent pairs (its converter permuted them); Qwen 3.5's q and k head dims are permuted for its
 * partial RoPE (forge__rope_perm_runs), and its q_proj's output gates, which HF interleaves with
 * the queries head by head, sit after v in the fused q|k|v|gate row (B holds all the queries,
 * then all the gates); a Qwen 3.5 GGUF file orders the linear attention's value heads tiled
 * (lin_v_tiled), in in_proj_qkv's v rows, in_proj_z's, in_proj_b's and in_proj_a's rows, and
 * out_proj's inputs (A's columns). Adapter files hold HF's order: reading and writing map them. */

typedef struct forge__host_pair {
    uint32_t rank;           /* 0: not adapted */
    float scale;
    float *a, *b;
} forge__host_pair;

typedef struct forge__adapter_host {
    int n_layers;
    forge__host_pair *pairs; /* [n_layers * FORGE__T_COUNT] */
    uint32_t rank;           /* the files' rank (PEFT r, mlx-lm rank) */
    float alpha;             /* PEFT lora_alpha (scale * rank); mlx-lm files give the scale */
    float dropout;
    uint32_t targets;        /* the adapted projections */
    int first_layer;         /* the lowest adapted layer (mlx-lm adapts the last n_layers - first) */
} forge__adapter_host;

/* Qwen 3.5: forge's index of HF's value-head dim x (head x / v_dim): the same but in a GGUF file,
 * whose value heads are tiled (head j of key head kh at j k_heads + kh; HF's at kh per + j). */
static uint32_t forge__v_dim_at(const forge__config *c, uint32_t x) {
    uint32_t DV = (uint32_t)c->lin_v_dim, hh = x / DV, per = (uint32_t)(c->lin_v_heads / c->lin_k_heads);
    return c->lin_v_tiled ? ((hh % per) * (uint32_t)c->lin_k_heads + hh / per) * DV + x % DV : x;
}

/* The row of forge's B holding row r of HF's B, for target t. */
static uint32_t forge__b_row(const forge__config *c, forge__target t, uint32_t r) {
    uint32_t D = (uint32_t)c->head_dim, half = D / 2, KD2 = (uint32_t)(2 * c->lin_k_heads * c->lin_k_dim), DV = (uint32_t)c->lin_v_dim;
    switch (t) {
    case FORGE__T_LIN_QKV: return r < KD2 ? r : KD2 + forge__v_dim_at(c, r - KD2); /* q and k keep their order */
    case FORGE__T_LIN_Z: return forge__v_dim_at(c, r);
    case FORGE__T_LIN_B: case FORGE__T_LIN_A: return forge__v_dim_at(c, r * DV) / DV; /* one row a value head */
    default: break;
    }
    if ((t != FORGE__T_Q && t != FORGE__T_K) || (!c->rope_adjacent_pairs && !c->attn_gate)) return r;
    if (c->rope_adjacent_pairs) return r - r % D + 2 * (r % half) + (r % D) / half; /* HF (h, k, i) -> (h, 2i + k): hf_to_gguf.py's llama_permute */
    uint32_t h = r / D, d = r % D;
    if (t == FORGE__T_Q) { /* HF: head h's query rows, then its gate rows */
        h = r / (2 * D), d = r % (2 * D);
        if (d >= D) return (uint32_t)c->n_heads * D + h * D + d - D;
    }
    uint32_t first[4], len[4], pos = 0;
    forge__rope_perm_runs(D, forge__rope_dims(c, D), first, len);
    for (int k = 0; k < 4; pos += len[k++])
        if (d >= first[k] && d < first[k] + len[k]) return h * D + pos + d - first[k];
    return r; /* (the runs cover the head) */
}

/* B [rows, cols] (b) or A [rows, cols] (!b: out_proj's columns) from HF's order to forge's
 * (to_forge), or back. */
static void forge__lora_map(const forge__config *c, forge__target t, bool b, float *dst, const float *src, uint32_t rows, uint32_t cols, bool to_forge) {
    for (uint32_t r = 0; r < rows; r++) {
        if (!b) {
            for (uint32_t k = 0; k < cols; k++) {
                uint32_t f = t == FORGE__T_LIN_OUT ? forge__v_dim_at(c, k) : k;
                dst[(size_t)r * cols + (to_forge ? f : k)] = src[(size_t)r * cols + (to_forge ? k : f)];
            }
            continue;
        }
        uint32_t f = forge__b_row(c, t, r);
        memcpy(dst + (size_t)(to_forge ? f : r) * cols, src + (size_t)(to_forge ? r : f) * cols, sizeof(float) * cols);
    }
}

/* "...layers.N.<group>.<target>.<leaf>" (forge__target_group: self_attn.q_proj, mlp.up_proj,
 * linear_attn.in_proj_z...): layer, target and the leaf after the projection's name; NULL when
 * the name is not of that shape. *other_tower is set for the vision or audio tower of a
 * multimodal checkpoint, whose adapters forge skips with the tower. */
static const char *forge__adapter_key(const forge__config *c, const char *name, int *layer, forge__target *t, bool *other_tower) {
    *other_tower = strstr(name, "vision") || strstr(name, "visual") || strstr(name, "audio") || strstr(name, "multi_modal");
    const char *p = strstr(name, "layers.");
    while (p && p != name && p[-1] != '.') p = strstr(p + 1, "layers.");
    if (!p) return NULL;
    p += 7;
    if (!isdigit((unsigned char)*p)) return NULL;
    long l = 0;
    while (isdigit((unsigned char)*p) && l < 100000) l = l * 10 + (*p++ - '0');
    if (*p++ != '.') return NULL;
    for (int k = 0; k < FORGE__T_COUNT; k++) {
        const char *g = forge__target_group(c, (forge__target)k), *tn = forge__target_names[k];
        size_t gl = strlen(g), n = strlen(tn);
        if (!strncmp(p, g, gl) && p[gl] == '.' && !strncmp(p + gl + 1, tn, n) && p[gl + 1 + n] == '.') {
            *layer = (int)l;
            *t = (forge__target)k;
            return p + gl + 1 + n + 1;
        }
    }
    return NULL;
}

static const char *forge__json_type_name(const cJSON *x) { return cJSON_IsNull(x) ? "null" : cJSON_IsArray(x) ? "a list" : "a value"; }

/* Reads the PEFT or mlx-lm adapter in `dir` for model m into host arrays in `arena`. Errors
 * name the file and the key at fault. */
static forge_status forge__adapter_read(const forge_model *m, const char *dir, forge__arena *arena, forge__adapter_host *ah, forge__err *err) {
    const forge__config *c = &m->cfg;
    memset(ah, 0, sizeof *ah);
    const char *why = forge__lora_unsupported(c);
    if (why) return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: adapters are not supported for architecture %s (%s)", dir, forge__arch_names[c->arch], why);
    char st_path[4200], cfg_path[4200];
    snprintf(cfg_path, sizeof cfg_path, "%s/adapter_config.json", dir);
    snprintf(st_path, sizeof st_path, "%s/adapter_model.safetensors", dir);
    bool peft = forge__file_exists(st_path);
    if (!peft) snprintf(st_path, sizeof st_path, "%s/adapters.safetensors", dir);
    if (!peft && !forge__file_exists(st_path))
        return forge__fail(err, FORGE_ERR_IO, "%s: no adapter here (adapter_model.safetensors for PEFT, adapters.safetensors for mlx-lm)", dir);
    char *text = NULL;
    size_t len = 0;
    forge_status st = forge__read_text(cfg_path, &text, &len, err);
    if (st) return st;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: not a JSON object", cfg_path);
    }
    bool rslora = false;
    double scale_mlx = 0;
    if (peft) {
        const char *type = forge__json_str(root, "peft_type");
        const cJSON *mts = cJSON_GetObjectItemCaseSensitive(root, "modules_to_save");
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(root, "alpha_pattern");
        const char *bias = forge__json_str(root, "bias");
        int r = forge__json_int(root, "r", 0);
        if (type && strcmp(type, "LORA"))
            st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: peft_type '%s' (forge reads LORA adapters)", cfg_path, type);
        else if (forge__json_bool(root, "use_dora", false))
            st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: use_dora: DoRA adapters are not supported", cfg_path);
        else if (forge__json_bool(root, "fan_in_fan_out", false))
            st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: fan_in_fan_out (Conv1D-style weights) is not supported", cfg_path);
        else if (bias && strcmp(bias, "none"))
            st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: bias '%s': trained biases are not supported (only 'none')", cfg_path, bias);
        else if (mts && !cJSON_IsNull(mts) && !(cJSON_IsArray(mts) && cJSON_GetArraySize(mts) == 0))
            st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: modules_to_save is %s: adapters that carry whole modules are not supported", cfg_path,
                             forge__json_type_name(mts));
        else if (ap && cJSON_IsObject(ap) && ap->child)
            st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: alpha_pattern (a per-module alpha) is not supported", cfg_path);
        else if (r <= 0)
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: 'r' must be a positive integer", cfg_path);
        ah->rank = (uint32_t)(r > 0 ? r : 0);
        ah->alpha = (float)forge__json_num(root, "lora_alpha", 8.0);
        ah->dropout = (float)forge__json_num(root, "lora_dropout", 0.0);
        rslora = forge__json_bool(root, "use_rslora", false);
    } else {
        const char *ft = forge__json_str(root, "fine_tune_type");
        const cJSON *lp = cJSON_GetObjectItemCaseSensitive(root, "lora_parameters");
        int r = lp ? forge__json_int(lp, "rank", 0) : 0;
        if (ft && strcmp(ft, "lora"))
            st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: fine_tune_type '%s' (forge reads lora adapters)", cfg_path, ft);
        else if (!cJSON_IsObject(lp))
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: no 'lora_parameters' object", cfg_path);
        else if (r <= 0)
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: lora_parameters.rank must be a positive integer", cfg_path);
        else if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(lp, "scale")))
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: lora_parameters.scale is missing", cfg_path);
        if (!st) {
            ah->rank = (uint32_t)r;
            scale_mlx = forge__json_num(lp, "scale", 20.0);
            ah->alpha = (float)(scale_mlx * r);
            ah->dropout = (float)forge__json_num(lp, "dropout", 0.0);
        }
    }
    cJSON_Delete(root);
    if (st) return st;
    if (!(ah->dropout >= 0 && ah->dropout < 1)) return forge__fail(err, FORGE_ERR_FORMAT, "%s: dropout %g is outside [0, 1)", cfg_path, ah->dropout);

    ah->n_layers = c->n_layers;
    ah->pairs = (forge__host_pair *)forge__arena_alloc(arena, sizeof *ah->pairs * (size_t)c->n_layers * FORGE__T_COUNT, 16);
    if (!ah->pairs) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    memset(ah->pairs, 0, sizeof *ah->pairs * (size_t)c->n_layers * FORGE__T_COUNT);
    forge__file f;
    if ((st = forge__file_map(&f, st_path, err))) return st;
    forge__arena ta = {0};
    forge__tensor_table tt = {0};
    st = forge__safetensors_parse(&f, &tt, &ta, err);
    bool *seen = (bool *)calloc((size_t)c->n_layers * FORGE__T_COUNT * 2, 1);
    if (!st && !seen) st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int i = 0; i < tt.count && !st; i++) {
        const forge__tensor *t = &tt.items[i];
        int layer;
        forge__target tg;
        bool other;
        const char *leaf = forge__adapter_key(c, t->name, &layer, &tg, &other);
        int which = !leaf ? -1 : peft ? (!strcmp(leaf, "lora_A.weight") ? 0 : !strcmp(leaf, "lora_B.weight") ? 1 : -1)
                                      : (!strcmp(leaf, "lora_a") ? 0 : !strcmp(leaf, "lora_b") ? 1 : -1);
        if (other) continue; /* the vision or audio tower: forge runs the text model only */
        if (which < 0) {
            st = forge__fail(err, FORGE_ERR_MODEL, "%s: tensor '%s' is not a LoRA matrix (%s) of a projection forge knows (%s)", st_path, t->name,
                             peft ? "lora_A.weight / lora_B.weight" : "lora_a / lora_b", forge__target_list());
            break;
        }
        if (layer >= c->n_layers) {
            st = forge__fail(err, FORGE_ERR_MODEL, "%s: tensor '%s' is for layer %d but the model has %d layers (a different base?)", st_path,
                             t->name, layer, c->n_layers);
            break;
        }
        if (!forge__target_on(c, layer, tg)) {
            st = forge__fail(err, FORGE_ERR_MODEL, "%s: tensor '%s': layer %d is a%s layer, which has no %s (a different base?)", st_path, t->name,
                             layer, c->layer_linear[layer] ? " linear-attention" : "n attention", forge__target_names[tg]);
            break;
        }
        if (t->dtype != FORGE__F32 && t->dtype != FORGE__F16 && t->dtype != FORGE__BF16) {
            st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; LoRA matrices are read in f32, f16 or bf16", st_path,
                             t->name, forge__dtype_name(t->dtype));
            break;
        }
        size_t slot = (size_t)layer * FORGE__T_COUNT + tg;
        if (seen[slot * 2 + which]) {
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: two tensors for '%s'", st_path, t->name);
            break;
        }
        seen[slot * 2 + which] = true;
        uint32_t in, out;
        forge__target_dims(c, tg, &in, &out);
        /* PEFT: A [r, in], B [out, r]; mlx-lm: lora_a [in, r], lora_b [r, out] */
        int64_t r = t->n_dims == 2 ? (peft ? (which ? t->shape[1] : t->shape[0]) : (which ? t->shape[0] : t->shape[1])) : 0;
        int64_t d = t->n_dims == 2 ? (peft ? (which ? t->shape[0] : t->shape[1]) : (which ? t->shape[1] : t->shape[0])) : 0;
        forge__host_pair *hp = &ah->pairs[slot];
        char got[96];
        forge__shape_str(t, got, sizeof got);
        if (r <= 0 || r > 4096 || d != (which ? out : in)) {
            st = forge__fail(err, FORGE_ERR_MODEL, "%s: tensor '%s' has shape %s but layer %d's %s (in %u, out %u) needs %s (a different base?)",
                             st_path, t->name, got, layer, forge__target_names[tg], in, out,
                             peft ? (which ? "[out, r]" : "[r, in]") : (which ? "[r, out]" : "[in, r]"));
            break;
        }
        if ((hp->rank && hp->rank != (uint32_t)r) || (!peft && (uint32_t)r != ah->rank)) {
            st = forge__fail(err, FORGE_ERR_MODEL, "%s: tensor '%s' has rank %lld, its pair or the config says %u", st_path, t->name, (long long)r,
                             hp->rank ? hp->rank : ah->rank);
            break;
        }
        hp->rank = (uint32_t)r;
        uint64_t n = (uint64_t)r * d;
        float *v = (float *)forge__arena_alloc(arena, sizeof(float) * n, 16), *tmp = (float *)malloc(sizeof(float) * n);
        if (!v || !tmp) {
            free(tmp);
            st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
            break;
        }
        for (uint64_t k = 0; k < n; k++) { /* as stored, to f32 */
            if (t->dtype == FORGE__F32) memcpy(&tmp[k], t->data + 4 * k, 4);
            else {
                uint16_t h;
                memcpy(&h, t->data + 2 * k, 2);
                tmp[k] = t->dtype == FORGE__F16 ? forge__f16_to_f32(h) : forge__bf16_to_f32(h);
            }
        }
        if (!peft) /* mlx-lm stores the transposes */
            for (uint64_t i0 = 0; i0 < (uint64_t)(which ? r : d); i0++)
                for (uint64_t j0 = 0; j0 < (uint64_t)(which ? d : r); j0++) v[j0 * (which ? r : d) + i0] = tmp[i0 * (which ? d : r) + j0];
        else
            memcpy(v, tmp, sizeof(float) * n);
        memcpy(tmp, v, sizeof(float) * n);
        forge__lora_map(c, tg, which, v, tmp, (uint32_t)(which ? d : r), (uint32_t)(which ? r : d), true);
        free(tmp);
        if (which) hp->b = v;
        else hp->a = v;
    }
    ah->first_layer = c->n_layers;
    for (int l = 0; l < c->n_layers && !st; l++)
        for (int t = 0; t < FORGE__T_COUNT && !st; t++) {
            forge__host_pair *hp = &ah->pairs[l * FORGE__T_COUNT + t];
            if (!hp->rank) continue;
            if (!hp->a || !hp->b) {
                st = forge__fail(err, FORGE_ERR_MODEL, "%s: layer %d's %s has lora_%s but no lora_%s", st_path, l, forge__target_names[t],
                                 hp->a ? "A" : "B", hp->a ? "B" : "A");
                break;
            }
            hp->scale = peft ? (float)(ah->alpha / (rslora ? sqrt((double)hp->rank) : (double)hp->rank)) : (float)scale_mlx;
            ah->targets |= 1u << t;
            if (l < ah->first_layer) ah->first_layer = l;
        }
    if (!st && !ah->targets) st = forge__fail(err, FORGE_ERR_MODEL, "%s: no LoRA matrices for the text model", st_path);
    free(seen);
    forge__arena_free(&ta);
    forge__file_unmap(&f);
    return st;
}

/* The adapter's identity: every adapted projection's place, rank, scale and all of A and B
 * (adapters are small beside the weights). */
static uint64_t forge__adapter_identity(const forge__config *c, const forge__adapter_host *ah) {
    uint64_t h = FORGE__FNV_BASIS;
    for (int i = 0; i < ah->n_layers * FORGE__T_COUNT; i++) {
        const forge__host_pair *hp = &ah->pairs[i];
        if (!hp->rank) continue;
        uint32_t in, out;
        forge__target_dims(c, (forge__target)(i % FORGE__T_COUNT), &in, &out);
        h = forge__fnv_u64(forge__fnv_u64(h, (uint64_t)i), hp->rank);
        h = forge__fnv_f64(h, hp->scale);
        h = forge__fnv(h, hp->a, 4ull * hp->rank * in);
        h = forge__fnv(h, hp->b, 4ull * out * hp->rank);
    }
    return h ? h : 1; /* 0 means none */
}

/* ---- Writing adapters ----
 * Each file goes to a temporary name in the same directory, is flushed, then renamed over the
 * old one: a crash or a full disk mid-write leaves the previous checkpoint whole. */

static forge_status forge__write_atomic(const char *path, const void *const *parts, const size_t *sizes, int n_parts, forge__err *err) {
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *fp = fopen(tmp, "wb");
    if (!fp) return forge__fail(err, FORGE_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    bool ok = true;
    for (int i = 0; i < n_parts && ok; i++) ok = !sizes[i] || fwrite(parts[i], 1, sizes[i], fp) == sizes[i];
    ok = ok && fflush(fp) == 0 && fsync(fileno(fp)) == 0;
    int e = errno;
    ok = (fclose(fp) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        if (ok) e = errno;
        remove(tmp);
        return forge__fail(err, FORGE_ERR_IO, "%s: writing failed: %s", path, strerror(e));
    }
    return FORGE_OK;
}

typedef struct forge__out_tensor {
    char name[160];
    uint32_t rows, cols;
    float *data;             /* malloc'd, [rows, cols] */
} forge__out_tensor;

/* A safetensors file of f32 tensors: the header JSON (8-byte padded, names in the order
 * given), then the data. */
static forge_status forge__safetensors_write(const char *path, const forge__out_tensor *ts, int n, const char *format, forge__err *err) {
    cJSON *h = cJSON_CreateObject(), *md = cJSON_CreateObject();
    cJSON_AddStringToObject(md, "format", format);
    cJSON_AddItemToObject(h, "__metadata__", md);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "dtype", "F32");
        double shape[2] = {ts[i].rows, ts[i].cols}, offs[2] = {(double)off, (double)(off + 4ull * ts[i].rows * ts[i].cols)};
        cJSON_AddItemToObject(t, "shape", cJSON_CreateDoubleArray(shape, 2));
        cJSON_AddItemToObject(t, "data_offsets", cJSON_CreateDoubleArray(offs, 2));
        cJSON_AddItemToObject(h, ts[i].name, t);
        off += 4ull * ts[i].rows * ts[i].cols;
    }
    char *json = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    if (!json) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    size_t jl = strlen(json), padded = (jl + 7) / 8 * 8;
    char *header = (char *)malloc(8 + padded);
    const void **parts = (const void **)malloc(sizeof(void *) * (size_t)(n + 1));
    size_t *sizes = (size_t *)malloc(sizeof(size_t) * (size_t)(n + 1));
    forge_status st = FORGE_OK;
    if (!header || !parts || !sizes) {
        st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    } else {
        for (int i = 0; i < 8; i++) header[i] = (char)(((uint64_t)padded >> (8 * i)) & 0xff);
        memcpy(header + 8, json, jl);
        memset(header + 8 + jl, ' ', padded - jl);
        parts[0] = header;
        sizes[0] = 8 + padded;
        for (int i = 0; i < n; i++) {
            parts[i + 1] = ts[i].data;
            sizes[i + 1] = 4ull * ts[i].rows * ts[i].cols;
        }
        st = forge__write_atomic(path, parts, sizes, n + 1, err);
    }
    free(header);
    free(parts);
    free(sizes);
    cJSON_free(json);
    return st;
}

/* Writes `ah` to dir as PEFT or mlx-lm files for model m. */
static forge_status forge__adapter_write(const forge_model *m, const forge__adapter_host *ah, const char *dir, forge_adapter_format fmt,
                                         forge__err *err) {
    const forge__config *c = &m->cfg;
    struct stat sb;
    if (stat(dir, &sb) != 0 && mkdir(dir, 0777) != 0 && errno != EEXIST)
        return forge__fail(err, FORGE_ERR_IO, "%s: cannot create the directory: %s", dir, strerror(errno));
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) return forge__fail(err, FORGE_ERR_IO, "%s: not a directory", dir);
    bool peft = fmt == FORGE_ADAPTER_PEFT;
    int n_pairs = 0;
    float scale = 0;
    for (int i = 0; i < ah->n_layers * FORGE__T_COUNT; i++)
        if (ah->pairs[i].rank) {
            n_pairs++;
            if (scale == 0) scale = ah->pairs[i].scale;
            if (!peft && (ah->pairs[i].scale != scale || ah->pairs[i].rank != ah->rank))
                return forge__fail(err, FORGE_ERR_UNSUPPORTED, "mlx-lm adapters have one rank and scale for every projection; this one varies");
        }
    if (!peft)
        for (int l = ah->first_layer; l < ah->n_layers; l++)
            for (int t = 0; t < FORGE__T_COUNT; t++)
                if ((ah->targets >> t & 1u) && forge__target_on(c, l, (forge__target)t) && !ah->pairs[l * FORGE__T_COUNT + t].rank)
                    return forge__fail(err, FORGE_ERR_UNSUPPORTED, "mlx-lm adapters cover every target of the last num_layers layers; "
                                                                  "layer %d's %s is not adapted", l, forge__target_names[t]);
    forge__out_tensor *ts = (forge__out_tensor *)calloc((size_t)n_pairs * 2, sizeof *ts);
    if (!ts) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    const char *prefix = peft ? (c->multimodal ? "base_model.model.model.language_model." : "base_model.model.model.")
                              : (c->multimodal ? "language_model.model." : "model.");
    int n = 0;
    forge_status st = FORGE_OK;
    for (int l = 0; l < ah->n_layers && !st; l++)
        for (int t = 0; t < FORGE__T_COUNT && !st; t++) {
            const forge__host_pair *hp = &ah->pairs[l * FORGE__T_COUNT + t];
            if (!hp->rank) continue;
            uint32_t in, out, r = hp->rank;
            forge__target_dims(c, (forge__target)t, &in, &out);
            for (int which = 0; which < 2; which++) {
                forge__out_tensor *o = &ts[n++];
                uint32_t rows = which ? out : r, cols = which ? r : in; /* forge's layout: A [r, in], B [out, r] */
                const float *src = which ? hp->b : hp->a;
                float *hf = (float *)malloc(4ull * rows * cols);
                o->data = (float *)malloc(4ull * rows * cols);
                if (!hf || !o->data) {
                    free(hf);
                    st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
                    break;
                }
                forge__lora_map(c, (forge__target)t, which, hf, src, rows, cols, false);
                if (peft) {
                    memcpy(o->data, hf, 4ull * rows * cols);
                    o->rows = rows;
                    o->cols = cols;
                } else { /* lora_a = A^T [in, r], lora_b = B^T [r, out] */
                    for (uint32_t i = 0; i < rows; i++)
                        for (uint32_t j = 0; j < cols; j++) o->data[(size_t)j * rows + i] = hf[(size_t)i * cols + j];
                    o->rows = cols;
                    o->cols = rows;
                }
                free(hf);
                snprintf(o->name, sizeof o->name, "%slayers.%d.%s.%s.%s", prefix, l, forge__target_group(c, (forge__target)t), forge__target_names[t],
                         peft ? (which ? "lora_B.weight" : "lora_A.weight") : (which ? "lora_b" : "lora_a"));
            }
        }
    char path[4300];
    if (!st) {
        snprintf(path, sizeof path, "%s/%s", dir, peft ? "adapter_model.safetensors" : "adapters.safetensors");
        st = forge__safetensors_write(path, ts, n, peft ? "pt" : "mlx", err);
    }
    for (int i = 0; i < n; i++) free(ts[i].data);
    free(ts);
    if (st) return st;
    cJSON *root = cJSON_CreateObject(), *targets = cJSON_CreateArray();
    for (int t = 0; t < FORGE__T_COUNT; t++)
        if (ah->targets >> t & 1u) {
            char key[40];
            snprintf(key, sizeof key, "%s%s%s", peft ? "" : forge__target_group(c, (forge__target)t), peft ? "" : ".", forge__target_names[t]);
            cJSON_AddItemToArray(targets, cJSON_CreateString(key));
        }
    if (peft) {
        cJSON_AddStringToObject(root, "peft_type", "LORA");
        cJSON_AddStringToObject(root, "task_type", "CAUSAL_LM");
        cJSON_AddStringToObject(root, "base_model_name_or_path", m->name);
        cJSON_AddNumberToObject(root, "r", ah->rank);
        cJSON_AddNumberToObject(root, "lora_alpha", ah->alpha);
        cJSON_AddNumberToObject(root, "lora_dropout", ah->dropout);
        cJSON_AddItemToObject(root, "target_modules", targets);
        cJSON_AddStringToObject(root, "bias", "none");
        cJSON_AddBoolToObject(root, "fan_in_fan_out", false);
        cJSON_AddBoolToObject(root, "use_rslora", false);
        cJSON_AddBoolToObject(root, "use_dora", false);
        cJSON_AddBoolToObject(root, "init_lora_weights", true);
        cJSON_AddBoolToObject(root, "inference_mode", true);
        if (ah->first_layer > 0) {
            cJSON *lt = cJSON_CreateArray();
            for (int l = ah->first_layer; l < ah->n_layers; l++) cJSON_AddItemToArray(lt, cJSON_CreateNumber(l));
            cJSON_AddItemToObject(root, "layers_to_transform", lt);
        } else {
            cJSON_AddNullToObject(root, "layers_to_transform");
        }
        cJSON_AddNullToObject(root, "modules_to_save");
        cJSON_AddItemToObject(root, "rank_pattern", cJSON_CreateObject());
        cJSON_AddItemToObject(root, "alpha_pattern", cJSON_CreateObject());
    } else {
        cJSON *lp = cJSON_CreateObject();
        cJSON_AddNumberToObject(lp, "rank", ah->rank);
        cJSON_AddNumberToObject(lp, "scale", scale);
        cJSON_AddNumberToObject(lp, "dropout", ah->dropout);
        cJSON_AddItemToObject(lp, "keys", targets);
        cJSON_AddStringToObject(root, "fine_tune_type", "lora");
        cJSON_AddItemToObject(root, "lora_parameters", lp);
        cJSON_AddStringToObject(root, "model", m->name);
        cJSON_AddNumberToObject(root, "num_layers", ah->n_layers - ah->first_layer);
    }
    char *json = cJSON_Print(root);
    cJSON_Delete(root);
    if (!json) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    const void *parts[2] = {json, "\n"};
    size_t sizes[2] = {strlen(json), 1};
    st = forge__write_atomic(path, parts, sizes, 2, err);
    cJSON_free(json);
    return st;
}

/* ---- The model's adapter (forge_model_params.adapter_path) ----
 * Read at load, its matrices join the weights' uploads; every forward pass adds the low-rank
 * path beside the projections (forward.c). */
static forge_status forge__model_adapter(forge__loader *L, const char *dir) {
    forge_model *m = L->m;
    const forge__config *c = &m->cfg;
    forge__adapter_host ah;
    forge_status st = forge__adapter_read(m, dir, &m->arena, &ah, &m->err);
    if (st) return forge__wrap(&m->err, st, "adapter %s", dir);
    forge__lora *lo = &m->adapter;
    size_t n = (size_t)c->n_layers * FORGE__T_COUNT;
    lo->pairs = (forge__lora_pair *)forge__arena_alloc(&m->arena, sizeof *lo->pairs * n, 16);
    if (!lo->pairs) return forge__fail(&m->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    memset(lo->pairs, 0, sizeof *lo->pairs * n);
    lo->n_layers = c->n_layers;
    for (size_t i = 0; i < n && !st; i++) {
        const forge__host_pair *hp = &ah.pairs[i];
        forge__lora_pair *lp = &lo->pairs[i];
        if (!hp->rank) continue;
        lp->rank = hp->rank;
        lp->scale = hp->scale;
        forge__target_dims(c, (forge__target)(i % FORGE__T_COUNT), &lp->in, &lp->out);
        lo->max_rank = FORGE__MAX(lo->max_rank, lp->rank);
        if (!(st = forge__upload_add(L, (const uint8_t *)hp->a, 4ull * lp->rank * lp->in, FORGE__F32, false, 0, &lp->a)))
            st = forge__upload_add(L, (const uint8_t *)hp->b, 4ull * lp->out * lp->rank, FORGE__F32, false, 0, &lp->b);
    }
    forge__log(&m->log, FORGE_LOG_INFO, "adapter %s: rank %u, scale %g", dir, ah.rank, ah.rank ? ah.alpha / ah.rank : 0.0);
    m->adapter_id = forge__adapter_identity(c, &ah);
    return st;
}

/* The weight holding target t of a layer, and which of its rows are the target's: rows
 * row0 .. row0 + rows (the q|k|v rows of a fused weight, the q|k|v, z, b and a rows of a fused
 * linear-attention in-projection), or every second row from `phase` (step 2: the interleaved
 * gate_up weight). Qwen 3.5's q_proj has two runs of rows (forge__lora_runs). */
static const forge__weight *forge__target_weight(const forge__config *c, const forge__layer *ly, forge__target t, uint32_t *row0, uint32_t *rows,
                                                 uint32_t *step, uint32_t *phase) {
    uint32_t QD = (uint32_t)(c->n_heads * c->head_dim), KVD = (uint32_t)(c->n_kv_heads * c->head_dim);
    uint32_t CD = forge__lin_conv_dim(c), VD = forge__lin_v_dim(c), NV = (uint32_t)c->lin_v_heads;
    uint32_t in, out;
    forge__target_dims(c, t, &in, &out);
    *row0 = 0;
    *rows = out;
    *step = 1;
    *phase = 0;
    switch (t) {
    case FORGE__T_Q: case FORGE__T_K: case FORGE__T_V:
        if (!ly->fused_qkv) return t == FORGE__T_Q ? &ly->wq : t == FORGE__T_K ? &ly->wk : &ly->wv;
        *row0 = t == FORGE__T_Q ? 0 : t == FORGE__T_K ? QD : QD + KVD;
        return &ly->wqkv;
    case FORGE__T_O: case FORGE__T_LIN_OUT: return &ly->wo;
    case FORGE__T_GATE: case FORGE__T_UP:
        if (!ly->fused_gate_up) return t == FORGE__T_GATE ? &ly->gate : &ly->up;
        *step = 2;
        *phase = t == FORGE__T_UP;
        return &ly->gate_up;
    case FORGE__T_LIN_QKV: case FORGE__T_LIN_Z: case FORGE__T_LIN_B: case FORGE__T_LIN_A: {
        const forge__weight *apart[4] = {&ly->lin_qkv, &ly->lin_z, &ly->lin_b, &ly->lin_a};
        const uint32_t at[4] = {0, CD, CD + VD, CD + VD + NV};
        if (!ly->fused_lin) return apart[t - FORGE__T_LIN_QKV];
        *row0 = at[t - FORGE__T_LIN_QKV];
        return &ly->lin_in;
    }
    default: return &ly->down;
    }
}

static void forge__record_merge_fn(void *ctx, forge__rec *r) {
    forge_model *m = (forge_model *)ctx;
    const forge__config *c = &m->cfg;
    for (int l = 0; l < c->n_layers; l++)
        for (int t = 0; t < FORGE__T_COUNT; t++) {
            const forge__lora_pair *lp = forge__lora_at(&m->adapter, l, (forge__target)t);
            if (!lp) continue;
            uint32_t row0, rows, step, phase, gx, gy, b0[2], run_rows[2], col[2];
            const forge__weight *w = forge__target_weight(c, &m->layers[l], (forge__target)t, &row0, &rows, &step, &phase);
            int n_runs = forge__lora_runs(c, (forge__target)t, rows, b0, run_rows, col);
            for (int k = 0; k < n_runs; k++)
                for (int i = 0; i < w->n_chunks; i++) {
                    const forge__wchunk *ch = &w->chunks[i];
                    uint32_t n = ch->rows * w->cols;
                    forge__pc_merge pc = {w->cols, n, ch->row0, row0 + col[k], run_rows[k], step, phase, lp->rank, lp->a_el, lp->b_el + b0[k] * lp->rank,
                                          w->fmt == FORGE__W_F32 ? 0u : w->fmt == FORGE__W_F16 ? 1u : 2u, lp->scale};
                    forge__range b[3] = {ch->w, lp->a, lp->b};
                    forge__grid(((w->fmt == FORGE__W_F32 ? n : (n + 1) / 2) + 255) / 256, &gx, &gy);
                    forge__dispatch(r, FORGE__OP_LORA_MERGE, b, &pc, gx, gy, 1);
                    forge__barrier(r); /* targets of a fused weight may share a word at a row boundary */
                }
        }
}

/* forge_model_params.adapter_merge: scale * B A added into the float weights, once, on the
 * device; the forward pass then runs without the adapter. Its matrices stay in the weight
 * blocks they were uploaded with (the adapter's size, small beside the weights). */
static forge_status forge__model_merge_adapter(forge_model *m) {
    const forge__config *c = &m->cfg;
    forge__device *d = &m->dev;
    for (int l = 0; l < c->n_layers; l++)
        for (int t = 0; t < FORGE__T_COUNT; t++) {
            if (!forge__lora_at(&m->adapter, l, (forge__target)t)) continue;
            uint32_t row0, rows, step, phase;
            const forge__weight *w = forge__target_weight(c, &m->layers[l], (forge__target)t, &row0, &rows, &step, &phase);
            if (w->fmt != FORGE__W_F32 && w->fmt != FORGE__W_F16 && w->fmt != FORGE__W_BF16)
                return forge__fail(&m->err, FORGE_ERR_UNSUPPORTED,
                                   "adapter_merge: layer %d's %s ('%s') is quantized; merging needs f32, f16 or bf16 weights "
                                   "(without adapter_merge the adapter runs beside the quantized weights)", l, forge__target_names[t], w->name);
        }
    VkCommandPool pool = VK_NULL_HANDLE;
    VkFence fence = VK_NULL_HANDLE;
    VkCommandPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, .queueFamilyIndex = d->caps.queue_family};
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if (d->vk.vkCreateCommandPool(d->dev, &pci, NULL, &pool) != VK_SUCCESS || d->vk.vkCreateFence(d->dev, &fci, NULL, &fence) != VK_SUCCESS) {
        if (pool) d->vk.vkDestroyCommandPool(d->dev, pool, NULL);
        return forge__fail(&m->err, FORGE_ERR_DEVICE, "creating a command pool for the adapter merge failed");
    }
    forge__recording rc = {0};
    forge_status st = forge__record(m, pool, false, forge__record_merge_fn, m, &rc, NULL, &m->err);
    if (!st) st = forge__submit_wait(d, rc.cb, fence, &m->err);
    forge__recording_free(d, pool, &rc);
    d->vk.vkDestroyFence(d->dev, fence, NULL);
    d->vk.vkDestroyCommandPool(d->dev, pool, NULL);
    if (!st) m->adapter.pairs = NULL; /* folded in: the forward pass no longer adds it */
    return st;
}
