/* src/api.c: Public API: models, sessions, tokens.
 * Owns: forge_model_load / free / get_info, sessions (plan, create, truncate, memory),
 * forge_eval, the parallel slots, and the tokenizer's public calls. Loading ties the files
 * above together: files -> config -> device -> weights -> adapter -> tokenizer.
 * May call: every file before it.
 */

FORGE_API forge_model_params forge_model_default_params(void) {
    forge_model_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.device_index = -1;
    p.load_tokenizer = 1;
    return p;
}

FORGE_API forge_session_params forge_session_default_params(void) {
    forge_session_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    return p;
}

/* Copies the caller's params over the defaults, honouring a smaller (older) struct_size. */
#define FORGE__COPY_PARAMS(dst, src, defaults_fn)                                   \
    do {                                                                            \
        dst = defaults_fn();                                                        \
        if (src) {                                                                  \
            size_t n_ = (src)->struct_size ? (src)->struct_size : sizeof(dst);     \
            memcpy(&dst, src, FORGE__MIN(n_, sizeof(dst)));                         \
            dst.struct_size = sizeof(dst);                                          \
        }                                                                           \
    } while (0)

static forge_status forge__model_add_file(forge_model *m, const char *path, forge__file **out) {
    forge__file *files = (forge__file *)realloc(m->files, sizeof *files * (size_t)(m->n_files + 1));
    if (!files) return forge__fail(&m->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    m->files = files;
    forge_status st = forge__file_map(&files[m->n_files], path, &m->err);
    if (st) return st;
    *out = &files[m->n_files++];
    return FORGE_OK;
}

static int forge__cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A growing list of owned strings: the shard file names to map. */
typedef struct forge__names {
    char **v;
    int n, cap;
} forge__names;

static bool forge__names_has(const forge__names *l, const char *s) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->v[i], s)) return true;
    return false;
}

/* false when out of memory */
static bool forge__names_add(forge__names *l, const char *s) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        char **v = (char **)realloc(l->v, sizeof(char *) * (size_t)cap);
        if (!v) return false;
        l->v = v;
        l->cap = cap;
    }
    if (!(l->v[l->n] = strdup(s))) return false;
    l->n++;
    return true;
}

static void forge__names_free(forge__names *l) {
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
}

/* The shard names of a safetensors directory: those model.safetensors.index.json maps to
 * (first appearance order), else every *.safetensors in name order. */
static forge_status forge__safetensors_shards(const char *dir, forge__names *names, forge__err *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (forge__file_exists(path)) {
        char *idx = NULL;
        size_t len;
        forge_status st = forge__read_text(path, &idx, &len, err);
        if (st) return st;
        cJSON *root = cJSON_ParseWithLength(idx, len);
        free(idx);
        cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
        if (!cJSON_IsObject(wm)) st = forge__fail(err, FORGE_ERR_FORMAT, "%s: no 'weight_map' object", path);
        for (cJSON *it = wm ? wm->child : NULL; it && !st; it = it->next) {
            if (!cJSON_IsString(it) || strchr(it->valuestring, '/') || strstr(it->valuestring, ".."))
                st = forge__fail(err, FORGE_ERR_FORMAT, "%s: weight_map entry '%s' is not a file name in the directory", path,
                                 it->string ? it->string : "?");
            else if (!forge__names_has(names, it->valuestring) && !forge__names_add(names, it->valuestring))
                st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        }
        cJSON_Delete(root);
        return st;
    }
    DIR *dp = opendir(dir);
    if (!dp) return forge__fail(err, FORGE_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    forge_status st = FORGE_OK;
    struct dirent *de;
    while (!st && (de = readdir(dp)))
        if (forge__ends_with(de->d_name, ".safetensors") && de->d_name[0] != '.' && !forge__names_add(names, de->d_name))
            st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    closedir(dp);
    if (!st && names->n == 0) st = forge__fail(err, FORGE_ERR_IO, "%s: no *.safetensors files", dir);
    if (!st) qsort(names->v, (size_t)names->n, sizeof *names->v, forge__cmp_str);
    return st;
}

/* Loads every *.safetensors of `dir` (or the shards model.safetensors.index.json names), or
 * the one file `single`. */
static forge_status forge__load_safetensors_dir(forge_model *m, const char *dir, const char *single) {
    forge__names names = {0};
    forge_status st = FORGE_OK;
    if (single) {
        if (!forge__names_add(&names, single)) st = forge__fail(&m->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    } else {
        st = forge__safetensors_shards(dir, &names, &m->err);
    }
    char path[4096];
    for (int i = 0; i < names.n && !st; i++) {
        forge__file *f;
        if (single) snprintf(path, sizeof path, "%s", names.v[i]);
        else snprintf(path, sizeof path, "%s/%s", dir, names.v[i]);
        if ((st = forge__model_add_file(m, path, &f))) break;
        m->tensors.model_names = true;
        st = forge__safetensors_parse(f, &m->tensors, &m->arena, &m->err);
    }
    forge__names_free(&names);
    return st;
}

/* The checkpoint's chat template, kept to recognise its family (chat.c): from
 * tokenizer_config.json's "chat_template" (a string, or a list of {name, template} of which
 * "default" is taken) or chat_template.jinja in `dir`. Absent is fine. */
static void forge__chat_template_from_dir(forge_model *m, const char *dir) {
    char path[4200], *text = NULL;
    size_t len;
    forge__err e;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (forge__file_exists(path) && !forge__read_text(path, &text, &len, &e)) {
        cJSON *root = cJSON_ParseWithLength(text, len);
        cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "chat_template"), *it;
        if (cJSON_IsArray(t))
            cJSON_ArrayForEach(it, t) {
                const char *name = forge__json_str(it, "name");
                if (name && !strcmp(name, "default")) t = cJSON_GetObjectItemCaseSensitive(it, "template");
            }
        if (cJSON_IsString(t)) m->chat_template = forge__arena_strdup(&m->arena, t->valuestring);
        cJSON_Delete(root);
        free(text);
    }
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (!m->chat_template && forge__file_exists(path) && !forge__read_text(path, &text, &len, &e)) {
        m->chat_template = forge__arena_strdup(&m->arena, text);
        free(text);
    }
}

static void forge__chat_template_from_gguf(forge_model *m, const forge__gguf *g) {
    const char *t;
    uint64_t n;
    if (forge__gguf_get_str(g, "tokenizer.chat_template", &t, &n)) m->chat_template = forge__arena_strndup(&m->arena, t, (size_t)n);
}

/* vocab_only: the tokenizer of a GGUF (its tokenizer.ggml.* metadata; no tensors needed), or
 * of a tokenizer.json given as the file itself, its directory, or a .safetensors beside it. */
static forge_status forge__model_load_vocab(forge_model *m, const char *path, const struct stat *sb, bool is_gguf) {
    forge_status st;
    m->vocab_only = true;
    if (is_gguf) {
        forge__gguf gguf;
        forge__file *f = NULL;
        snprintf(m->source_format, sizeof m->source_format, "gguf");
        if ((st = forge__model_add_file(m, path, &f))) return st;
        forge__tensor_table tt = {0};
        if ((st = forge__gguf_parse(f, &gguf, &tt, &m->arena, &m->err))) return st;
        if ((st = forge__tokenizer_from_gguf(&m->tok, &gguf, &m->arena, path, &m->err))) return st;
        if (!m->tok.n_vocab) return forge__fail(&m->err, FORGE_ERR_FORMAT, "%s: no tokenizer.ggml.tokens: this GGUF has no vocabulary", path);
        forge__chat_template_from_gguf(m, &gguf);
    } else {
        char json[4200];
        snprintf(m->source_format, sizeof m->source_format, "tokenizer.json");
        if (S_ISDIR(sb->st_mode)) {
            snprintf(json, sizeof json, "%s/tokenizer.json", path);
        } else if (forge__ends_with(path, ".safetensors")) {
            const char *slash = strrchr(path, '/');
            snprintf(json, sizeof json, "%.*s/tokenizer.json", slash ? (int)(slash - path) : 1, slash ? path : ".");
        } else {
            snprintf(json, sizeof json, "%s", path);
        }
        if (!forge__file_exists(json)) return forge__fail(&m->err, FORGE_ERR_IO, "%s: no tokenizer.json", path);
        if ((st = forge__tokenizer_load_file(&m->tok, json, &m->arena, &m->err))) return st;
        char *slash = strrchr(json, '/');
        if (slash) *slash = 0; else snprintf(json, sizeof json, ".");
        forge__chat_template_from_dir(m, json);
    }
    m->cfg.n_vocab = m->tok.n_vocab;
    return FORGE_OK;
}

static forge_status forge__model_load_impl(forge_model *m, const char *path, const forge_model_params *p) {
    forge_status st;
    struct stat sb;
    forge__tokenizer_reset(&m->tok);
    if (!path || stat(path, &sb) != 0) return forge__fail(&m->err, FORGE_ERR_IO, "%s: no such file or directory", path ? path : "(null)");
    char dir[4096];
    const char *base = strrchr(path, '/');
    snprintf(m->name, sizeof m->name, "%s", base && base[1] ? base + 1 : path);
    forge__gguf gguf;
    bool is_gguf = S_ISREG(sb.st_mode) && forge__ends_with(path, ".gguf");
    if (S_ISREG(sb.st_mode) && !is_gguf && sb.st_size >= 4) { /* sniff: GGUF without the extension */
        FILE *fp = fopen(path, "rb");
        char mg[4] = {0};
        if (fp) { if (fread(mg, 1, 4, fp) != 4) mg[0] = 0; fclose(fp); }
        is_gguf = memcmp(mg, "GGUF", 4) == 0;
    }
    if (p->vocab_only) return forge__model_load_vocab(m, path, &sb, is_gguf);
    if (is_gguf) {
        snprintf(m->source_format, sizeof m->source_format, "gguf");
        forge__file *f;
        if ((st = forge__model_add_file(m, path, &f))) return st;
        if ((st = forge__gguf_parse(f, &gguf, &m->tensors, &m->arena, &m->err))) return st;
        if ((st = forge__config_from_gguf(&gguf, &m->tensors, path, &m->cfg, &m->err))) return st;
        const char *gn;
        uint64_t gl;
        if (forge__gguf_get_str(&gguf, "general.name", &gn, &gl) && gl > 0)
            snprintf(m->name, sizeof m->name, "%.*s", (int)FORGE__MIN(gl, 127), gn);
    } else {
        snprintf(m->source_format, sizeof m->source_format, "safetensors");
        const char *single = NULL;
        if (S_ISDIR(sb.st_mode)) {
            snprintf(dir, sizeof dir, "%s", path);
        } else if (forge__ends_with(path, ".safetensors")) {
            snprintf(dir, sizeof dir, "%s", path);
            char *slash = strrchr(dir, '/');
            if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
            single = path;
        } else {
            return forge__fail(&m->err, FORGE_ERR_FORMAT, "%s: not a model directory, .safetensors or .gguf file", path);
        }
        char cfg_path[4200];
        snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
        char *text;
        size_t len;
        if ((st = forge__read_text(cfg_path, &text, &len, &m->err))) return st;
        st = forge__config_from_hf_json(text, len, cfg_path, &m->cfg, &m->err);
        free(text);
        if (st) return st;
        if ((st = forge__load_safetensors_dir(m, dir, single))) return st;
        char tok_path[4200];
        snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", dir);
        if (p->load_tokenizer && forge__file_exists(tok_path) &&
            (st = forge__tokenizer_load_file(&m->tok, tok_path, &m->arena, &m->err)))
            return st;
        forge__chat_template_from_dir(m, dir);
        forge__st_load(&m->embed, dir, &m->arena);
    }
    if ((st = forge__device_open(&m->dev, p->device_index, p->device_name, p->max_storage_buffer_range, p->max_allocation_size, &m->err)))
        return st;
    if (p->max_device_memory && (!m->dev.caps.device_local_bytes || p->max_device_memory < m->dev.caps.device_local_bytes))
        m->dev.caps.device_local_bytes = p->max_device_memory; /* the budget every plan is checked against */
    m->sample_on_host = m->dev.caps.type == FORGE_DEVICE_CPU;
    m->act_q8 = !m->exact && m->dev.caps.int_dot && m->dev.caps.subgroup_arith && m->dev.caps.type != FORGE_DEVICE_CPU;
    m->q8_chain = true;
    m->pairs_min_rows = m->dev.caps.type != FORGE_DEVICE_CPU ? 4096 : 0;
    m->attn_cm = true;
    m->back_cm = true;
    m->attn_subgroups = forge__runs_attn_decode(&m->dev.caps);
    m->host_products = m->dev.caps.type == FORGE_DEVICE_CPU && m->dev.caps.uma;
    m->host_min_bytes = FORGE__HOST_MIN_BYTES;
    m->host_q8 = m->host_products && !m->exact;
    pthread_mutex_init(&m->pipe_lock, NULL);
    forge__log(&m->log, FORGE_LOG_INFO, "device: %s (%s)", m->dev.info.name, m->dev.info.driver);
    forge__loader L;
    memset(&L, 0, sizeof L);
    L.m = m;
    L.gguf = is_gguf;
    if ((st = forge__plan_model(&L))) return st;
    if (p->adapter_path && (st = forge__model_adapter(&L, p->adapter_path))) return st;
    int unused = 0;
    for (int i = 0; i < m->tensors.count; i++)
        if (!m->tensors.items[i].used) {
            if (unused++ < 8) forge__log(&m->log, FORGE_LOG_WARN, "tensor '%s' is not used", m->tensors.items[i].name);
        }
    if (unused) forge__log(&m->log, FORGE_LOG_WARN, "%d tensors in the checkpoint are not used", unused);
    forge__main_format(m);
    if ((st = forge__upload_all(&L, p))) return st;
    if (p->adapter_path && p->adapter_merge && (st = forge__model_merge_adapter(m))) return st;
    if (p->adapter_path && p->adapter_merge) m->adapter_id = ~m->adapter_id; /* merged: rounded into the weights */
    m->fingerprint = forge__model_fingerprint(m);
    if (is_gguf && p->load_tokenizer) {
        if ((st = forge__tokenizer_from_gguf(&m->tok, &gguf, &m->arena, path, &m->err))) return st;
        forge__chat_template_from_gguf(m, &gguf);
    }
    for (int i = 0; i < m->n_files; i++) forge__file_release_pages(&m->files[i], m->files[i].data, m->files[i].size);
    return FORGE_OK;
}

FORGE_API forge_status forge_model_load(const char *path, const forge_model_params *params, forge_model **out_model) {
    if (!out_model) return FORGE_ERR_INVALID_ARGUMENT;
    *out_model = NULL;
    forge_model *m = (forge_model *)calloc(1, sizeof *m);
    if (!m) return FORGE_ERR_OUT_OF_MEMORY;
    *out_model = m;
    pthread_mutex_init(&m->err_lock, NULL);
    pthread_mutex_init(&m->slot_lock, NULL);
    pthread_mutex_init(&m->vocab_lock, NULL);
    pthread_cond_init(&m->slot_free, NULL);
    forge_model_params p;
    FORGE__COPY_PARAMS(p, params, forge_model_default_params);
    m->log = (forge__logger){p.log, p.log_user_data};
    if (p.parallel_slots < 0) {
        m->failed = true;
        return forge__fail(&m->err, FORGE_ERR_INVALID_ARGUMENT, "parallel_slots is %d; it must be >= 0 (0: no cap)", p.parallel_slots);
    }
    m->slots_max = p.parallel_slots;
    m->slots_fail = p.parallel_fail != 0;
    m->exact = p.exact != 0;
    forge_status st = forge__model_load_impl(m, path, &p);
    if (st) {
        m->failed = true;
        forge__log(&m->log, FORGE_LOG_ERROR, "%s", m->err.msg);
    }
    return st;
}

FORGE_API void forge_model_free(forge_model *m) {
    if (!m) return;
    forge__device *d = &m->dev;
    if (d->dev) {
        d->vk.vkDeviceWaitIdle(d->dev);
        for (int i = 0; i < FORGE__OP_COUNT; i++) forge__pipeline_destroy(d, &m->pipes[i]);
        for (int b = 0; b < m->n_blocks; b++) forge__buffer_destroy(d, &m->blocks[b], &m->mem, &m->mem_total);
        pthread_mutex_destroy(&m->pipe_lock);
    }
    forge__host_pool_destroy(&m->host_pool);
    forge__device_close(d);
    forge__tokenizer_free(&m->tok);
    for (int i = 0; i < m->n_files; i++) forge__file_unmap(&m->files[i]);
    free(m->files);
    forge__arena_free(&m->arena);
    free(m->vocab);
    pthread_mutex_destroy(&m->vocab_lock);
    pthread_mutex_destroy(&m->err_lock);
    pthread_mutex_destroy(&m->slot_lock);
    pthread_cond_destroy(&m->slot_free);
    free(m);
}

FORGE_API const char *forge_model_errmsg(const forge_model *m) { return m ? m->err.msg : "no model (out of host memory)"; }

/* A parallel slot for one inference call on the model (go-mlx's WithParallelSlots): held
 * for the whole call, callbacks included, so a callback that starts another call on the
 * same model with every slot taken would wait for itself (or fail, with parallel_fail). */
static forge_status forge__slot_acquire(forge_model *m, forge__err *err) {
    if (!m->slots_max) return FORGE_OK;
    pthread_mutex_lock(&m->slot_lock);
    while (m->slots_busy >= m->slots_max && !m->slots_fail) pthread_cond_wait(&m->slot_free, &m->slot_lock);
    bool got = m->slots_busy < m->slots_max;
    if (got) m->slots_busy++;
    pthread_mutex_unlock(&m->slot_lock);
    if (!got)
        return forge__fail(err, FORGE_ERR_LIMIT, "all %d parallel slots of the model are in use (forge_model_params.parallel_fail is set)", m->slots_max);
    return FORGE_OK;
}
static void forge__slot_release(forge_model *m) {
    if (!m->slots_max) return;
    pthread_mutex_lock(&m->slot_lock);
    m->slots_busy--;
    pthread_cond_signal(&m->slot_free);
    pthread_mutex_unlock(&m->slot_lock);
}

/* A caller's struct for a model-level call says its size, else the reason goes on the model. */
static forge_status forge__model_check_sized(const forge_model *m, const void *p, const char *type) {
    forge__err err;
    forge_status st = forge__check_sized(p, type, &err);
    return st ? forge__model_fail(m, st, "%s", err.msg) : FORGE_OK;
}

FORGE_API forge_status forge_model_get_info(const forge_model *m, forge_model_info *out) {
    if (!out || !forge__model_ready(m)) return FORGE_ERR_INVALID_ARGUMENT;
    forge_status st = forge__model_check_sized(m, out, "forge_model_info");
    if (st) return st;
    if (!forge__model_has_weights(m, "forge_model_get_info")) return FORGE_ERR_UNSUPPORTED;
    forge_model_info full, *info = &full;
    memset(info, 0, sizeof *info);
    const forge__config *c = &m->cfg;
    snprintf(info->architecture, sizeof info->architecture, "%s", forge__arch_names[c->arch]);
    snprintf(info->source_format, sizeof info->source_format, "%s", m->source_format);
    snprintf(info->weight_dtype, sizeof info->weight_dtype, "%s", m->main_format);
    snprintf(info->name, sizeof info->name, "%s", m->name);
    info->n_layers = c->n_layers;
    info->hidden = c->hidden;
    info->n_heads = c->n_heads;
    info->n_kv_heads = c->n_kv_heads;
    info->head_dim = c->head_dim;
    info->ffn = c->ffn;
    info->n_vocab = c->n_vocab;
    info->n_ctx_train = c->n_ctx_train;
    for (int l = 0; l < c->n_layers; l++) info->n_sliding_layers += c->layer_sliding[l];
    info->sliding_window = info->n_sliding_layers ? c->sliding_window : 0;
    info->tied_embeddings = c->tied;
    info->n_params = m->n_params;
    info->weight_bytes = m->weight_bytes;
    snprintf(info->device_name, sizeof info->device_name, "%s", m->dev.info.name);
    snprintf(info->device_driver, sizeof info->device_driver, "%s", m->dev.info.driver);
    FORGE__PUT(out, full);
    return FORGE_OK;
}

FORGE_API forge_status forge_model_memory(const forge_model *m, forge_memory_stats *out) {
    if (!out || !forge__model_ready(m)) return FORGE_ERR_INVALID_ARGUMENT;
    forge_status st = forge__model_check_sized(m, out, "forge_memory_stats");
    if (st) return st;
    forge_memory_stats full = {sizeof full, m->arena.bytes, m->mem.planned, m->mem.in_use, forge__mem_peak(&m->mem_total),
                               m->mem.n_buffers, m->mem.n_allocations, 0, 0, 0};
    FORGE__PUT(out, full);
    return FORGE_OK;
}

FORGE_API int forge_model_n_vocab(const forge_model *m) { return forge__model_ready(m) ? m->cfg.n_vocab : 0; }
FORGE_API int forge_model_n_ctx_train(const forge_model *m) { return forge__model_ready(m) ? m->cfg.n_ctx_train : 0; }

FORGE_API forge_status forge_session_plan(forge_model *m, const forge_session_params *params, forge_memory_stats *plan) {
    if (!forge__model_ready(m) || !plan) return FORGE_ERR_INVALID_ARGUMENT;
    if (forge__model_check_sized(m, plan, "forge_memory_stats")) return FORGE_ERR_INVALID_ARGUMENT;
    if (!forge__model_has_weights(m, "forge_session_plan")) return FORGE_ERR_UNSUPPORTED;
    forge_session_params p;
    FORGE__COPY_PARAMS(p, params, forge_session_default_params);
    forge__session_plan sp;
    forge__err err;
    forge_status st = forge__session_sizes(m, &p, &sp, &err);
    if (st) return forge__model_fail(m, st, "%s", err.msg);
    forge__arena a = {0};
    forge__pack pack = {0};
    st = forge__session_pack(m, &sp, &pack, &a, &err);
    if (!st) {
        forge_memory_stats full = {.struct_size = sizeof full};
        full.device_planned_bytes = forge__pack_total(&pack) + forge__session_host_visible_bytes(m, &sp);
        full.host_arena_bytes = a.bytes;
        full.device_buffers = (uint64_t)pack.n_blocks + 2;
        forge__session_kv_bytes(m, &sp, &full.kv_cache_bytes, &full.kv_sliding_bytes, &full.state_bytes);
        FORGE__PUT(plan, full);
    } else {
        forge__model_fail(m, st, "%s", err.msg);
    }
    forge__arena_free(&a);
    return st;
}

FORGE_API forge_status forge_session_create(forge_model *m, const forge_session_params *params, forge_session **out) {
    if (!out) return FORGE_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (!forge__model_ready(m)) return FORGE_ERR_INVALID_ARGUMENT;
    if (!forge__model_has_weights(m, "forge_session_create")) return FORGE_ERR_UNSUPPORTED;
    forge_session_params p;
    FORGE__COPY_PARAMS(p, params, forge_session_default_params);
    forge__session_plan sp;
    forge__err err;
    forge_status st = forge__session_sizes(m, &p, &sp, &err);
    if (st) return forge__model_fail(m, st, "%s", err.msg);
    if (p.overflow < FORGE_OVERFLOW_FAIL || p.overflow > FORGE_OVERFLOW_RECOMPUTE || p.n_keep < 0 ||
        (p.overflow != FORGE_OVERFLOW_FAIL && p.n_keep > sp.n_ctx - 2))
        return forge__model_fail(m, FORGE_ERR_INVALID_ARGUMENT, "session params: overflow %d (0, 1 or 2) and n_keep %d (0 to n_ctx - 2 = %d)",
                                 p.overflow, p.n_keep, sp.n_ctx - 2);
    forge_session *s = (forge_session *)calloc(1, sizeof *s);
    if (!s) return forge__model_fail(m, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    s->m = m;
    s->profile = p.profile && m->dev.caps.timestamps;
    s->overflow = (forge_overflow)p.overflow;
    s->n_keep = p.n_keep;
    st = forge__session_init(s, &sp);
    if (st) {
        forge__model_fail(m, st, "creating a session: %s", s->err.msg);
        forge__session_destroy(s);
        return st;
    }
    forge__log(&m->log, FORGE_LOG_INFO, "session: n_ctx %d, n_batch %d, %llu device bytes", s->n_ctx, s->n_batch,
               (unsigned long long)s->mem.in_use);
    *out = s;
    return FORGE_OK;
}

FORGE_API void forge_session_free(forge_session *s) { forge__session_destroy(s); }
FORGE_API const char *forge_session_errmsg(const forge_session *s) { return s ? s->err.msg : "no session"; }
FORGE_API int forge_session_n_past(const forge_session *s) { return s ? s->n_past : 0; }
FORGE_API forge_kv_type forge_session_kv_type(const forge_session *s) { return s ? s->kv : FORGE_KV_F32; }

/* Can the cache go back to n_keep tokens? Sliding-window layers keep `slots` positions in a
 * ring: continuing at n_keep needs the keys of positions [n_keep - window + 1, n_keep), which
 * later positions (up to kv_high - 1, beyond n_past after an earlier truncation) may have
 * overwritten. */
static bool forge__truncate_valid(const forge_session *s, int n_keep) {
    const forge__config *c = &s->m->cfg;
    if (n_keep == 0 || n_keep >= s->n_past) return true;
    if (forge__has_linear(c)) return false; /* a recurrent state cannot go back to an earlier position */
    if (s->kv_from > FORGE__MAX(0, n_keep - c->sliding_window + 1)) return false; /* not restored (state.c), or turned by a shift (forge__slide) */
    for (int l = 0; l < c->n_layers; l++) {
        if ((int)s->slots[l] >= s->n_ctx) continue; /* not rotating */
        int need_from = FORGE__MAX(0, n_keep - c->sliding_window + 1);
        if (need_from + (int)s->slots[l] < s->kv_high) return false;
    }
    return true;
}

FORGE_API forge_status forge_session_profile(const forge_session *s, char *out, size_t capacity, size_t *len) {
    if (!s || !len) return FORGE_ERR_INVALID_ARGUMENT;
    return forge__profile_json(&s->prof, out, capacity, len);
}

FORGE_API forge_status forge_session_memory(const forge_session *cs, forge_memory_stats *out) {
    if (!cs || !out) return FORGE_ERR_INVALID_ARGUMENT;
    forge_session *s = (forge_session *)cs; /* the error slot is the one part a const call may write */
    forge_status st = forge__check_sized(out, "forge_memory_stats", &s->err);
    if (st) return st;
    forge_memory_stats full = {sizeof full, s->arena.bytes, s->mem.planned, s->mem.in_use, s->mem.peak, s->mem.n_buffers,
                               s->mem.n_allocations, s->kv_bytes, s->kv_sliding_bytes, s->state_bytes};
    FORGE__PUT(out, full);
    return FORGE_OK;
}

/* Every id within the vocabulary, else an error naming the first that is not. */
/* A caller's cancel flag (forge_generate_params.cancel), set from another thread. */
static bool forge__cancelled(const int *flag) { return flag && __atomic_load_n(flag, __ATOMIC_RELAXED) != 0; }

static forge_status forge__check_token_ids(forge_session *s, const int32_t *tokens, int n) {
    const int V = s->m->cfg.n_vocab;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "token %d (at index %d) is outside the vocabulary of %d", tokens[i], i, V);
    return FORGE_OK;
}

static forge_status forge__eval(forge_session *s, const int32_t *tokens, int n_tokens, uint32_t flags, float *logits,
                                size_t logits_capacity) {
    if (!tokens || n_tokens <= 0) return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "eval needs at least one token");
    const int V = s->m->cfg.n_vocab;
    bool all = flags & FORGE_EVAL_ALL_LOGITS;
    size_t need = (all ? (size_t)n_tokens : 1) * (size_t)V;
    if (logits && logits_capacity < need)
        return forge__fail(&s->err, FORGE_ERR_BUFFER_TOO_SMALL, "logits buffer holds %zu floats; %zu needed", logits_capacity, need);
    forge_status bad = forge__check_token_ids(s, tokens, n_tokens);
    if (bad) return bad;
    if ((bad = forge__make_room(s, n_tokens))) return bad;
    int done = 0;
    while (done < n_tokens) {
        int step = FORGE__MIN(n_tokens - done, all ? FORGE__MIN(s->n_batch, s->n_out_max) : s->n_batch);
        bool last = done + step == n_tokens;
        uint32_t out_row0 = all ? 0 : (uint32_t)step - 1, n_out = all ? (uint32_t)step : (last ? 1u : 0u);
        float *dst = logits ? (all ? logits + (size_t)done * V : logits) : NULL;
        forge_status st = forge__step(s, tokens + done, (uint32_t)step, out_row0, logits ? n_out : 0, FORGE__OUT_LOGITS, NULL, dst);
        if (st) return st;
        done += step;
    }
    return FORGE_OK;
}

FORGE_API forge_status forge_eval(forge_session *s, const int32_t *tokens, int n_tokens, uint32_t flags, float *logits,
                                  size_t logits_capacity) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    forge_status st = forge__slot_acquire(s->m, &s->err);
    if (st) return st;
    st = forge__eval(s, tokens, n_tokens, flags, logits, logits_capacity);
    forge__slot_release(s->m);
    return st;
}

FORGE_API forge_status forge_session_prewarm(forge_session *s, int n_prompt, forge_prewarm_fn progress, void *user_data) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    if (n_prompt < 0) return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "prewarm: n_prompt %d is negative", n_prompt);
    forge_status st = forge__slot_acquire(s->m, &s->err);
    if (st) return st;
    st = forge__prewarm(s, n_prompt, progress, user_data);
    forge__slot_release(s->m);
    return st;
}

FORGE_API forge_status forge_session_truncate(forge_session *s, int n_keep) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    if (n_keep < 0 || n_keep > s->n_past)
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "truncate to %d tokens: the session holds %d", n_keep, s->n_past);
    if (forge__has_linear(&s->m->cfg) && n_keep > 0 && n_keep < s->n_past) {
        /* Qwen 3.5: a linear-attention layer's recurrent state cannot be cut back; the kept tokens
         * are evaluated again, from the prompt cache's checkpoint where it lies within them, else
         * from position 0 (exact, at the cost of their prefill) */
        forge_status st = forge__slot_acquire(s->m, &s->err);
        if (st) return st;
        int from = forge__ckpt_restart(s, s->history, n_keep);
        int32_t *kept = (int32_t *)malloc(4ull * (size_t)(n_keep - from) + 4);
        if (kept) {
            memcpy(kept, s->history + from, 4ull * (size_t)(n_keep - from));
            s->n_past = from;
            s->n_dropped = 0;
            st = from < n_keep ? forge__eval(s, kept, n_keep - from, 0, NULL, 0) : FORGE_OK;
        } else {
            st = forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        }
        forge__slot_release(s->m);
        free(kept);
        return st;
    }
    if (!forge__truncate_valid(s, n_keep))
        return forge__fail(&s->err, FORGE_ERR_LIMIT,
                           "cannot keep %d of %d tokens: the sliding-window layers' rotating cache has overwritten the keys "
                           "that continuing there needs (truncate to 0 instead)", n_keep, s->n_past);
    s->n_past = n_keep;
    if (n_keep <= s->drop_at) s->n_dropped = 0;
    return FORGE_OK;
}

/* ---- The tokenizer's public calls (tokenizer.c does the work; the model holds the tokenizer) ---- */

FORGE_API forge_status forge_tokenize(const forge_model *m, const char *text, size_t len, uint32_t flags, int32_t *ids,
                                      size_t capacity, size_t *n_ids) {
    if (n_ids) *n_ids = 0;
    const forge__tokenizer *tk = forge__model_tokenizer(m);
    if (!tk) return FORGE_ERR_INVALID_ARGUMENT;
    if (!n_ids || (!text && len) || (!ids && capacity))
        return forge__model_fail(m, FORGE_ERR_INVALID_ARGUMENT, "forge_tokenize: text, ids or n_ids is NULL");
    if (len > UINT32_MAX / 4) return forge__model_fail(m, FORGE_ERR_LIMIT, "forge_tokenize: %zu bytes of text (the most is %u)", len, UINT32_MAX / 4);
    forge__tkwork w;
    forge__tkwork_init(&w, tk);
    forge__tk_encode(&w, text ? text : "", len, flags & FORGE_TOKENIZE_ADD_SPECIAL, !(flags & FORGE_TOKENIZE_NO_PARSE_SPECIAL));
    forge_status st = FORGE_OK;
    size_t n = FORGE__VEC_LEN(&w.ids, int32_t);
    if (forge__tkwork_oom(&w)) st = forge__model_fail(m, FORGE_ERR_OUT_OF_MEMORY, "forge_tokenize: out of host memory");
    else if (n > capacity) st = forge__model_fail(m, FORGE_ERR_BUFFER_TOO_SMALL, "forge_tokenize: %zu ids do not fit in %zu", n, capacity);
    else if (n) memcpy(ids, w.ids.p, n * sizeof(int32_t));
    if (st != FORGE_OK && st != FORGE_ERR_BUFFER_TOO_SMALL) n = 0;
    *n_ids = n;
    forge__tkwork_free(&w);
    return st;
}

/* Copies out[0..n) and a NUL into text when it fits; else reports the size. */
static forge_status forge__tk_copy_out(const forge_model *m, const forge__buf *out, char *text, size_t capacity, size_t *n_bytes,
                                       const char *what) {
    *n_bytes = out->n;
    if (out->n + 1 > capacity)
        return forge__model_fail(m, FORGE_ERR_BUFFER_TOO_SMALL, "%s: %zu bytes (and a NUL) do not fit in %zu", what, out->n, capacity);
    if (out->n) memcpy(text, out->p, out->n);
    text[out->n] = 0;
    return FORGE_OK;
}

FORGE_API forge_status forge_detokenize(const forge_model *m, const int32_t *ids, size_t n_ids, uint32_t flags, char *text,
                                        size_t capacity, size_t *n_bytes) {
    if (n_bytes) *n_bytes = 0;
    const forge__tokenizer *tk = forge__model_tokenizer(m);
    if (!tk) return FORGE_ERR_INVALID_ARGUMENT;
    if (!n_bytes || (!ids && n_ids) || (!text && capacity))
        return forge__model_fail(m, FORGE_ERR_INVALID_ARGUMENT, "forge_detokenize: ids, text or n_bytes is NULL");
    forge__buf out;
    forge__buf_init(&out, NULL, 0);
    forge__err err;
    forge_status st = forge__tk_decode(tk, ids, n_ids, flags & FORGE_DETOKENIZE_SKIP_SPECIAL, &out, NULL, &err);
    if (st) forge__model_fail(m, st, "forge_detokenize: %s", err.msg);
    else st = forge__tk_copy_out(m, &out, text, capacity, n_bytes, "forge_detokenize");
    forge__buf_free(&out);
    return st;
}

FORGE_API void forge_detok_stream_init(forge_detok_stream *s, uint32_t flags) {
    if (!s) return;
    memset(s, 0, sizeof *s);
    s->struct_size = sizeof *s;
    s->flags = flags;
}

/* True when the decoder has a ByteFallback step and `id` is one of its <0xXX> tokens. */
static bool forge__tk_byte_run(const forge__tokenizer *tk, int32_t id) {
    bool bf = false;
    for (int i = 0; i < tk->n_dec; i++) bf |= tk->dec[i].kind == FORGE__D_BYTEFALLBACK;
    const char *p = tk->pieces[id];
    return bf && tk->piece_len[id] == 6 && !memcmp(p, "<0x", 3) && p[5] == '>' && forge__hexval(p[3]) >= 0 && forge__hexval(p[4]) >= 0;
}

/* The window holds the last emitted token (context: decoders treat a sequence's first token
 * specially, so text is always cut as decode(context + new) minus decode(context)) and the
 * tokens not emitted yet, held while they end inside a UTF-8 character. */
static forge_status forge__detok_emit(const forge_model *m, const forge__tokenizer *tk, forge_detok_stream *s, bool force, char *text,
                                      size_t capacity, size_t *n_bytes) {
    char o0[512];
    forge__buf out;
    forge__buf_init(&out, o0, sizeof o0);
    forge__err err;
    bool incomplete = false;
    forge_status st = forge__tk_decode(tk, s->ids, (size_t)s->n_ids, s->flags & FORGE_DETOKENIZE_SKIP_SPECIAL, &out, &incomplete, &err);
    if (st) { forge__buf_free(&out); return forge__model_fail(m, st, "forge_detok_stream: %s", err.msg); }
    if (incomplete && !force && s->n_ids < FORGE_DETOK_STREAM_WINDOW) { /* wait for the rest of the character */
        forge__buf_free(&out);
        if (capacity) text[0] = 0;
        return FORGE_OK;
    }
    size_t skip = FORGE__MIN((size_t)s->read_bytes, out.n);
    /* A byte token can make the run's earlier bytes, already emitted as valid text, invalid
     * UTF-8 (ByteFallback then decodes every byte of the run as U+FFFD): the new text no longer
     * extends the old, and cutting it at the old length could split a character. Cut at the
     * next character boundary instead, so that what is emitted stays valid UTF-8. */
    while (skip < out.n && ((uint8_t)out.p[skip] & 0xC0) == 0x80) skip++;
    forge__buf tail = {out.p + skip, out.n - skip, out.n - skip, false, false};
    st = forge__tk_copy_out(m, &tail, text, capacity, n_bytes, "forge_detok_stream");
    int32_t last = s->ids[s->n_ids - 1];
    bool skipped = (s->flags & FORGE_DETOKENIZE_SKIP_SPECIAL) && tk->is_special[last];
    if (!st && (skipped || forge__tk_byte_run(tk, last)) && s->n_ids <= FORGE_DETOK_STREAM_WINDOW - 5) {
        /* ByteFallback decodes a run of <0xXX> tokens as a whole: keep the run in the window.
         * A skipped special token gives no context: keep the one before it. */
        s->n_read = s->n_ids;
        s->read_bytes = (uint32_t)out.n;
    } else if (!st && forge__tk_byte_run(tk, s->ids[s->n_ids - 1])) {
        /* a long run: restart after it (the text emitted so far ends on a character) */
        s->n_ids = s->n_read = 0;
        s->read_bytes = 0;
    } else if (!st) { /* keep the last token as context */
        s->ids[0] = s->ids[s->n_ids - 1];
        s->n_ids = 1;
        s->n_read = 1;
        out.n = 0;
        st = forge__tk_decode(tk, s->ids, 1, s->flags & FORGE_DETOKENIZE_SKIP_SPECIAL, &out, NULL, &err);
        s->read_bytes = (uint32_t)out.n;
        if (st) forge__model_fail(m, st, "forge_detok_stream: %s", err.msg);
    }
    forge__buf_free(&out);
    return st;
}

FORGE_API forge_status forge_detok_stream_next(const forge_model *m, forge_detok_stream *s, int32_t token, char *text,
                                               size_t capacity, size_t *n_bytes) {
    if (n_bytes) *n_bytes = 0;
    const forge__tokenizer *tk = forge__model_tokenizer(m);
    if (!tk) return FORGE_ERR_INVALID_ARGUMENT;
    if (!s || !n_bytes || !text || s->struct_size != sizeof *s || s->n_ids < 0 || s->n_ids >= FORGE_DETOK_STREAM_WINDOW)
        return forge__model_fail(m, FORGE_ERR_INVALID_ARGUMENT, "forge_detok_stream_next: NULL argument or a stream not set up by forge_detok_stream_init");
    if (token < 0 || token >= tk->n_vocab || !tk->pieces[token])
        return forge__model_fail(m, FORGE_ERR_INVALID_ARGUMENT, "forge_detok_stream_next: token %d is outside the vocabulary of %d", token, tk->n_vocab);
    s->ids[s->n_ids++] = token;
    forge_status st = forge__detok_emit(m, tk, s, false, text, capacity, n_bytes);
    if (st == FORGE_ERR_BUFFER_TOO_SMALL) s->n_ids--; /* as if the call had not happened */
    return st;
}

FORGE_API forge_status forge_detok_stream_flush(const forge_model *m, forge_detok_stream *s, char *text, size_t capacity, size_t *n_bytes) {
    if (n_bytes) *n_bytes = 0;
    const forge__tokenizer *tk = forge__model_tokenizer(m);
    if (!tk) return FORGE_ERR_INVALID_ARGUMENT;
    if (!s || !n_bytes || !text || s->struct_size != sizeof *s || s->n_ids < 0 || s->n_ids > FORGE_DETOK_STREAM_WINDOW)
        return forge__model_fail(m, FORGE_ERR_INVALID_ARGUMENT, "forge_detok_stream_flush: NULL argument or a stream not set up by forge_detok_stream_init");
    forge_status st = FORGE_OK;
    if (s->n_ids > s->n_read) st = forge__detok_emit(m, tk, s, true, text, capacity, n_bytes);
    else if (capacity) text[0] = 0;
    else st = forge__model_fail(m, FORGE_ERR_BUFFER_TOO_SMALL, "forge_detok_stream_flush: no room for the NUL");
    if (!st) forge_detok_stream_init(s, s->flags);
    return st;
}

FORGE_API const char *forge_token_piece(const forge_model *m, int32_t token) {
    const forge__tokenizer *tk = forge__model_tokenizer(m);
    if (!tk || token < 0 || token >= tk->n_vocab) return NULL;
    return tk->pieces[token];
}

FORGE_API int32_t forge_token_id(const forge_model *m, const char *piece) {
    const forge__tokenizer *tk = forge__model_tokenizer(m);
    if (!tk || !piece) return -1;
    return forge__tk_lookup(tk, piece, strlen(piece));
}

FORGE_API int forge_token_is_special(const forge_model *m, int32_t token) {
    const forge__tokenizer *tk = forge__model_tokenizer(m);
    return tk && token >= 0 && token < tk->n_vocab && tk->is_special[token];
}

FORGE_API forge_status forge_model_special_tokens(const forge_model *m, forge_special_tokens *out) {
    if (!out || forge__struct_size(out) < sizeof(uint32_t)) {
        if (out && forge__model_ready(m)) forge__model_check_sized(m, out, "forge_special_tokens");
        return FORGE_ERR_INVALID_ARGUMENT;
    }
    forge_special_tokens full = {.struct_size = sizeof full};
    full.bos = full.eos = full.eot = full.pad = full.unk = full.sot = -1;
    const forge__tokenizer *tk = forge__model_tokenizer(m);
    if (tk) {
        full.bos = tk->bos;
        full.eos = tk->eos;
        full.eot = tk->eot;
        full.pad = tk->pad;
        full.unk = tk->unk;
        full.sot = tk->sot;
        full.n_eos = tk->n_eos;
        memcpy(full.eos_ids, tk->eos_ids, sizeof(int32_t) * (size_t)tk->n_eos);
    }
    FORGE__PUT(out, full);
    return tk ? FORGE_OK : FORGE_ERR_INVALID_ARGUMENT;
}
