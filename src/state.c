/* src/state.c: State.
 * Owns: state files (forge_session_save_state / load_state) and attention-K inspection
 * (forge_session_keys).
 * May call: base.c, files.c, config.c, device.c, ops.c, model.c, session.c, exec.c, api.c.
 *
 * A session's state to a file and back (go-mlx's state bundles): the tokens it holds and the
 * rows of every layer's KV cache that continuing needs, so that a new session of the same
 * model goes on where the old one stopped, with the same logits. The file is safetensors:
 * "__metadata__" names the format, the model (a fingerprint of its config, its tensors'
 * headers and a few bytes of each, and the adapter's identity) and the layout; the tensors
 * are "tokens" I32 [n_past] and per layer l "layers.l.k" and "layers.l.v" F32 [rows, kv heads,
 * head_dim] (F16 from an f16 cache; a q8_0 cache's as F32, each value q d exactly): the keys (after RoPE) and values of the last `rows` positions in position order,
 * all n_past of them for full-attention layers, what the ring holds for sliding-window ones;
 * a linear-attention layer (Qwen 3.5) holds its recurrent state instead, whatever n_past:
 * "layers.l.conv" F32 [lin_conv - 1, conv_dim] (the convolution's last inputs, oldest first,
 * channels in in_proj_qkv's order) and "layers.l.delta" F32 [value heads, key dim, value dim].
 * Reading goes through files.c's parser, and every field is checked against the model and
 * the session before anything is copied; writing goes to a temporary file beside the target,
 * renamed over it once complete and flushed. The same readback hands one layer's keys to the
 * caller (go-mlx's AttentionInspector), per KV head in HF's rotate-half convention.
 */

#define FORGE__STATE_FORMAT "forge-state"
#define FORGE__STATE_VERSION 1
#define FORGE__STATE_STAGE_BYTES ((uint64_t)16 << 20) /* the staging buffer: at most this much, a layer at a time */

/* ---- The header ---- */

/* Bytes of one position of an attention layer's K or V rows (every attention layer's: see
 * forge__state_supported). */
static uint64_t forge__state_kv_row(const forge__config *c, forge_kv_type kv) { return forge__kv_bytes(kv, (uint64_t)c->n_kv_heads, (uint64_t)c->head_dim); }

/* A state file's type of keys and values for a session's cache: its own, but f32 for a q8_0
 * cache (its values q d are exact in f32, and load back into q8_0 as the same codes and scales;
 * the file stays a safetensors file any reader takes). */
static forge_kv_type forge__state_file_kv(forge_kv_type kv) { return kv == FORGE_KV_F16 ? FORGE_KV_F16 : FORGE_KV_F32; }

/* A linear-attention layer's two recurrent states: the convolution's (tensor 0) and the delta
 * rule's (1), each of sequence 0 at the start of the layer's kc / vc range. */
static uint64_t forge__state_recurrent_bytes(const forge__config *c, int which) {
    return which ? forge__delta_state_bytes(c) : forge__conv_state_bytes(c);
}
static const char *const forge__state_recurrent_names[2] = {"conv", "delta"};
static void forge__state_recurrent_shape(const forge__config *c, int which, int64_t shape[3], int *n_dims) {
    if (which) {
        shape[0] = c->lin_v_heads, shape[1] = c->lin_k_dim, shape[2] = c->lin_v_dim, *n_dims = 3;
    } else {
        shape[0] = c->lin_conv - 1, shape[1] = forge__lin_conv_dim(c), shape[2] = 0, *n_dims = 2;
    }
}

/* The KV rows state files hold of a layer: all n_past positions, or for a sliding-window layer
 * at least what continuing reads (positions n_past - window + 1 ..). */
static int forge__state_rows_needed(const forge__config *c, int layer, int n_past) {
    if (!c->layer_sliding[layer] || c->sliding_window <= 0) return n_past;
    return FORGE__MIN(n_past, c->sliding_window - 1);
}

/* The file's first bytes for a state of n_past tokens whose layer l holds rows[l] rows of K
 * and V in f32, or F16 for kv_f16: the header length (u64,
 * little-endian), the JSON header padded with spaces to a multiple of 8.
 * malloc'd into *out (*size bytes). */
FORGE__INTERNAL forge_status forge__state_header(const forge_model *m, int n_ctx, int n_past, const int *rows, bool kv_f16, uint8_t **out,
                                                 size_t *size, forge__err *err) {
    const forge__config *c = &m->cfg;
    const uint64_t kv_row = forge__state_kv_row(c, kv_f16 ? FORGE_KV_F16 : FORGE_KV_F32);
    char num[64], *windows = (char *)malloc(12ull * (size_t)c->n_layers + 1), *rowlist = (char *)malloc(12ull * (size_t)c->n_layers + 1);
    cJSON *h = cJSON_CreateObject(), *md = cJSON_CreateObject();
    *out = NULL;
    if (!windows || !rowlist || !h || !md) {
        free(windows);
        free(rowlist);
        cJSON_Delete(h);
        cJSON_Delete(md);
        return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    size_t wo = 0, ro = 0;
    for (int l = 0; l < c->n_layers; l++) {
        wo += (size_t)sprintf(windows + wo, "%s%d", l ? "," : "", c->layer_sliding[l] ? c->sliding_window : 0);
        ro += (size_t)sprintf(rowlist + ro, "%s%d", l ? "," : "", rows[l]);
    }
    cJSON_AddItemToObject(h, "__metadata__", md);
    cJSON_AddStringToObject(md, "format", FORGE__STATE_FORMAT);
    snprintf(num, sizeof num, "%d", FORGE__STATE_VERSION);
    cJSON_AddStringToObject(md, "version", num);
    snprintf(num, sizeof num, "%016llx", (unsigned long long)m->fingerprint);
    cJSON_AddStringToObject(md, "model", num);
    snprintf(num, sizeof num, "%016llx", (unsigned long long)m->adapter_id);
    cJSON_AddStringToObject(md, "adapter", m->adapter_id ? num : "none");
    cJSON_AddStringToObject(md, "model_name", m->name);
    snprintf(num, sizeof num, "%d", n_past);
    cJSON_AddStringToObject(md, "n_past", num);
    snprintf(num, sizeof num, "%d", n_ctx);
    cJSON_AddStringToObject(md, "n_ctx", num);
    cJSON_AddStringToObject(md, "layer_windows", windows);
    cJSON_AddStringToObject(md, "layer_rows", rowlist);
    free(windows);
    free(rowlist);
    uint64_t off = 0;
    for (int i = -1; i < 2 * c->n_layers; i++) {
        char name[48];
        cJSON *t = cJSON_CreateObject();
        uint64_t bytes;
        if (i < 0) {
            snprintf(name, sizeof name, "tokens");
            cJSON_AddStringToObject(t, "dtype", "I32");
            double shape[1] = {n_past};
            cJSON_AddItemToObject(t, "shape", cJSON_CreateDoubleArray(shape, 1));
            bytes = 4ull * (uint64_t)n_past;
        } else if (c->layer_linear[i / 2]) {
            int64_t dims[3];
            int nd;
            forge__state_recurrent_shape(c, i % 2, dims, &nd);
            snprintf(name, sizeof name, "layers.%d.%s", i / 2, forge__state_recurrent_names[i % 2]);
            cJSON_AddStringToObject(t, "dtype", "F32");
            double shape[3] = {(double)dims[0], (double)dims[1], (double)dims[2]};
            cJSON_AddItemToObject(t, "shape", cJSON_CreateDoubleArray(shape, nd));
            bytes = forge__state_recurrent_bytes(c, i % 2);
        } else {
            int l = i / 2;
            snprintf(name, sizeof name, "layers.%d.%c", l, i % 2 ? 'v' : 'k');
            cJSON_AddStringToObject(t, "dtype", kv_f16 ? "F16" : "F32");
            double shape[3] = {rows[l], c->n_kv_heads, c->head_dim};
            cJSON_AddItemToObject(t, "shape", cJSON_CreateDoubleArray(shape, 3));
            bytes = (uint64_t)rows[l] * kv_row;
        }
        double offs[2] = {(double)off, (double)(off + bytes)};
        cJSON_AddItemToObject(t, "data_offsets", cJSON_CreateDoubleArray(offs, 2));
        cJSON_AddItemToObject(h, name, t);
        off += bytes;
    }
    char *json = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    if (!json) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    size_t jl = strlen(json), padded = (jl + 7) / 8 * 8;
    uint8_t *b = (uint8_t *)malloc(8 + padded);
    if (b) {
        for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)padded >> (8 * i));
        memcpy(b + 8, json, jl);
        memset(b + 8 + jl, ' ', padded - jl);
    }
    cJSON_free(json);
    if (!b) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    *out = b;
    *size = 8 + padded;
    return FORGE_OK;
}

/* ---- Reading ---- */

/* A state file read and checked: pointers into its mapping (not aligned). */
typedef struct forge__state_layer {
    int rows;                   /* positions n_past - rows .. n_past - 1 */
    const uint8_t *k, *v;       /* [rows, kv heads, head_dim] f32, or f16 (forge__state.kv_f16); a linear-attention
                                 * layer's: the convolution's state and the delta rule's (forge__state_recurrent_shape) */
} forge__state_layer;

typedef struct forge__state {
    int n_past;
    bool kv_f16;                /* the file's K and V are f16 (every layer's: the reader checks) */
    const uint8_t *tokens;      /* [n_past] i32 */
    forge__state_layer *layers; /* [n_layers], in the arena */
} forge__state;

static const char *forge__meta_str(const cJSON *md, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(md, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A decimal integer in [lo, hi] and nothing else. */
static bool forge__parse_int(const char *s, long long lo, long long hi, long long *out) {
    if (!s || !*s || isspace((unsigned char)*s)) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

/* Reads the `index`-th entry of a comma-separated list of integers; false when malformed. */
static bool forge__list_int(const char *list, int index, long long *out) {
    for (int i = 0; list && i < index; i++) {
        list = strchr(list, ',');
        if (list) list++;
    }
    if (!list) return false;
    char item[24];
    size_t n = strcspn(list, ",");
    if (n == 0 || n >= sizeof item) return false;
    memcpy(item, list, n);
    item[n] = 0;
    return forge__parse_int(item, 0, INT_MAX, out);
}

/* Checks a mapped state file against model m and a session of n_ctx positions, and describes
 * it in *out (layers in `arena`). Nothing is copied. The message names the file and the cause. */
FORGE__INTERNAL forge_status forge__state_read(const forge_model *m, int n_ctx, const forge__file *f, forge__arena *arena, forge__state *out,
                                               forge__err *err) {
    const forge__config *c = &m->cfg;
    const char *path = f->path;
    forge__tensor_table table = {0};
    cJSON *md = NULL;
    memset(out, 0, sizeof *out);
    forge_status st = forge__safetensors_parse_meta(f, &table, arena, &md, err);
    if (st) return st;
    const char *format = forge__meta_str(md, "format"), *version = forge__meta_str(md, "version");
    const char *model = forge__meta_str(md, "model"), *adapter = forge__meta_str(md, "adapter");
    const char *name = forge__meta_str(md, "model_name"), *windows = forge__meta_str(md, "layer_windows");
    const char *rowlist = forge__meta_str(md, "layer_rows");
    long long n_past = 0, v;
    char mine[32], shape[96];
    snprintf(mine, sizeof mine, "%016llx", (unsigned long long)m->fingerprint);
    if (!format || strcmp(format, FORGE__STATE_FORMAT))
        st = forge__fail(err, FORGE_ERR_FORMAT, "%s: not a forge state file (its __metadata__ has no format \"%s\")", path, FORGE__STATE_FORMAT);
    else if (!forge__parse_int(version, 1, INT_MAX, &v) || v != FORGE__STATE_VERSION)
        st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: state format version '%s'; this forge reads version %d", path, version ? version : "(none)",
                         FORGE__STATE_VERSION);
    else if (!model || strcmp(model, mine))
        st = forge__fail(err, FORGE_ERR_MODEL, "%s: the state file was saved from a different model (%s%s%sfingerprint %s; this model, %s, has %s)", path,
                         name ? "'" : "", name ? name : "", name ? "', " : "", model ? model : "(none)", m->name, mine);
    if (!st) {
        char have[32] = "none";
        if (m->adapter_id) snprintf(have, sizeof have, "%016llx", (unsigned long long)m->adapter_id);
        if (!adapter || strcmp(adapter, have))
            st = forge__fail(err, FORGE_ERR_MODEL, "%s: the state was saved with adapter %s; this model has adapter %s", path,
                             adapter ? adapter : "(not named)", have);
    }
    if (!st && !forge__parse_int(forge__meta_str(md, "n_past"), 0, INT_MAX, &n_past))
        st = forge__fail(err, FORGE_ERR_FORMAT, "%s: __metadata__ n_past is missing or not a count of tokens", path);
    if (!st && n_past > n_ctx)
        st = forge__fail(err, FORGE_ERR_LIMIT, "%s: the state holds %lld tokens; this session's n_ctx is %d", path, n_past, n_ctx);
    forge__tensor *tok = st ? NULL : forge__tensor_find(&table, "tokens");
    if (!st && !tok) st = forge__fail(err, FORGE_ERR_FORMAT, "%s: no tensor 'tokens'", path);
    if (!st && (tok->dtype != FORGE__I32 || tok->n_dims != 1 || tok->shape[0] != n_past)) {
        forge__shape_str(tok, shape, sizeof shape);
        st = forge__fail(err, FORGE_ERR_FORMAT, "%s: tensor 'tokens' is %s %s; n_past %lld needs i32 [%lld]", path, forge__dtype_name(tok->dtype), shape,
                         n_past, n_past);
    }
    for (long long i = 0; !st && i < n_past; i++) {
        int32_t t;
        memcpy(&t, tok->data + 4 * i, 4);
        if (t < 0 || t >= c->n_vocab)
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: token %d at position %lld is outside the vocabulary of %d", path, t, i, c->n_vocab);
    }
    if (!st) {
        tok->used = true;
        out->n_past = (int)n_past;
        out->tokens = tok->data;
        out->layers = (forge__state_layer *)forge__arena_alloc(arena, sizeof *out->layers * (size_t)c->n_layers, 16);
        if (!out->layers) st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    /* the keys and values are all f32 or all f16, as the first attention layer's keys say */
    int first_attn = 0;
    while (first_attn < c->n_layers && c->layer_linear[first_attn]) first_attn++;
    char k0_name[48];
    snprintf(k0_name, sizeof k0_name, "layers.%d.k", first_attn);
    forge__tensor *k0 = st ? NULL : forge__tensor_find(&table, k0_name);
    if (k0 && k0->dtype == FORGE__F16) out->kv_f16 = true;
    const forge__dtype kv_dtype = out->kv_f16 ? FORGE__F16 : FORGE__F32;
    const uint64_t kv_row = forge__state_kv_row(c, out->kv_f16 ? FORGE_KV_F16 : FORGE_KV_F32);
    for (int l = 0; !st && l < c->n_layers; l++) {
        int window = c->layer_sliding[l] ? c->sliding_window : 0;
        if (!forge__list_int(windows, l, &v) || v != window) {
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: __metadata__ layer_windows does not give layer %d's window %d", path, l, window);
            break;
        }
        if (c->layer_linear[l]) { /* the recurrent states, of fixed shapes */
            const uint8_t *data[2] = {NULL, NULL};
            for (int i = 0; i < 2 && !st; i++) {
                char tn[48];
                int64_t want[3];
                int nd;
                forge__state_recurrent_shape(c, i, want, &nd);
                snprintf(tn, sizeof tn, "layers.%d.%s", l, forge__state_recurrent_names[i]);
                forge__tensor *t = forge__tensor_find(&table, tn);
                if (!t) {
                    st = forge__fail(err, FORGE_ERR_FORMAT, "%s: no tensor '%s' (layer %d is a linear-attention layer: its recurrent state)", path, tn, l);
                    break;
                }
                t->used = true;
                bool same = t->dtype == FORGE__F32 && t->n_dims == nd;
                for (int d = 0; same && d < nd; d++) same = t->shape[d] == want[d];
                if (!same) {
                    char need[96];
                    forge__shape_str(t, shape, sizeof shape);
                    if (nd == 2) snprintf(need, sizeof need, "[%lld, %lld]", (long long)want[0], (long long)want[1]);
                    else snprintf(need, sizeof need, "[%lld, %lld, %lld]", (long long)want[0], (long long)want[1], (long long)want[2]);
                    st = forge__fail(err, FORGE_ERR_FORMAT, "%s: tensor '%s' is %s %s; this model's linear-attention layer needs F32 %s", path, tn,
                                     forge__dtype_name(t->dtype), shape, need);
                }
                data[i] = t->data;
            }
            if (!st && (!forge__list_int(rowlist, l, &v) || v != 0))
                st = forge__fail(err, FORGE_ERR_FORMAT, "%s: __metadata__ layer_rows does not give linear-attention layer %d's 0 rows", path, l);
            if (!st) out->layers[l] = (forge__state_layer){0, data[0], data[1]};
            continue;
        }
        forge__tensor *kv[2];
        for (int i = 0; i < 2 && !st; i++) {
            char tn[48];
            snprintf(tn, sizeof tn, "layers.%d.%c", l, i ? 'v' : 'k');
            forge__tensor *t = kv[i] = forge__tensor_find(&table, tn);
            if (!t) {
                st = forge__fail(err, FORGE_ERR_FORMAT, "%s: no tensor '%s'", path, tn);
            } else if (t->dtype != kv_dtype || t->n_dims != 3 || t->shape[0] > n_past || t->shape[1] != c->n_kv_heads ||
                       t->shape[2] != c->head_dim || (i && t->shape[0] != kv[0]->shape[0])) {
                forge__shape_str(t, shape, sizeof shape);
                st = forge__fail(err, FORGE_ERR_FORMAT, "%s: tensor '%s' is %s %s; this model needs %s [rows <= n_past %lld, %d, %d]%s%s", path, tn,
                                 forge__dtype_name(t->dtype), shape, forge__dtype_name(kv_dtype), n_past, c->n_kv_heads, c->head_dim,
                                 i ? ", as many rows as the keys" : "", l > first_attn || i ? " (the type of the first layer's keys)" : "");
            }
            if (t) t->used = true;
        }
        if (st) break;
        int rows = (int)kv[0]->shape[0], need = forge__state_rows_needed(c, l, (int)n_past);
        if (rows < need)
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: layer %d holds the keys of %d positions; continuing after %lld tokens needs %d", path, l, rows,
                             n_past, need);
        else if (!forge__list_int(rowlist, l, &v) || v != rows)
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: __metadata__ layer_rows does not give layer %d's %d rows", path, l, rows);
        else if (kv[0]->nbytes != (uint64_t)rows * kv_row) /* the parser has matched bytes to the shape */
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: layer %d's keys hold %llu bytes", path, l, (unsigned long long)kv[0]->nbytes);
        else
            out->layers[l] = (forge__state_layer){rows, kv[0]->data, kv[1]->data};
    }
    if (!st && !forge__list_int(windows, c->n_layers, &v) && !forge__list_int(rowlist, c->n_layers, &v)) {
        for (int i = 0; i < table.count && !st; i++)
            if (!table.items[i].used) st = forge__fail(err, FORGE_ERR_FORMAT, "%s: unexpected tensor '%s' in a state file", path, table.items[i].name);
    } else if (!st) {
        st = forge__fail(err, FORGE_ERR_FORMAT, "%s: __metadata__ describes more layers than this model's %d", path, c->n_layers);
    }
    cJSON_Delete(md);
    return st;
}

/* ---- Moving KV rows between the device and the host ---- */

#ifdef FORGE_TESTING
FORGE__INTERNAL uint64_t forge__test_disk_left = UINT64_MAX; /* tests: a disk that is full after this many more bytes */
#endif

/* fwrite of a whole buffer; false (errno set) when it did not all go out. */
static bool forge__write_all(FILE *fp, const void *data, size_t n) {
#ifdef FORGE_TESTING
    if (n > forge__test_disk_left) {
        forge__test_disk_left = 0;
        errno = ENOSPC;
        return false;
    }
    forge__test_disk_left -= n;
#endif
    return !n || fwrite(data, 1, n, fp) == n;
}

/* A staging buffer and a command buffer for one save or load. */
typedef struct forge__state_io {
    forge_session *s;
    forge__buffer stage;        /* host-visible: readback memory to save, upload memory to load */
    uint64_t kv_row;            /* bytes of one position of K or V in the session's cache */
    VkCommandBuffer cb;
} forge__state_io;

/* A stage for moving at most most_rows positions of K or V at a time, or a linear-attention
 * layer's recurrent state (the largest piece one move needs, at most FORGE__STATE_STAGE_BYTES). */
static forge_status forge__state_io_open(forge__state_io *io, forge_session *s, int most_rows, bool to_device) {
    forge__device *d = &s->m->dev;
    const forge__config *c = &s->m->cfg;
    memset(io, 0, sizeof *io);
    io->s = s;
    io->kv_row = forge__state_kv_row(c, s->kv);
    uint64_t most = (uint64_t)FORGE__MAX(1, most_rows) * io->kv_row;
    if (forge__has_linear(c)) most = FORGE__MAX(most, FORGE__MAX(forge__conv_state_bytes(c), forge__delta_state_bytes(c)));
    forge_status st = forge__buffer_create(d, FORGE__MIN(most, FORGE__STATE_STAGE_BYTES), to_device ? d->caps.mem_upload : d->caps.mem_readback,
                                           true, &s->mem, &s->m->mem_total, &io->stage, &s->err);
    if (st) return st;
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = s->cmd_pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    if (d->vk.vkAllocateCommandBuffers(d->dev, &cai, &io->cb) != VK_SUCCESS) {
        io->cb = VK_NULL_HANDLE;
        return forge__fail(&s->err, FORGE_ERR_DEVICE, "vkAllocateCommandBuffers failed");
    }
    return FORGE_OK;
}

static void forge__state_io_close(forge__state_io *io) {
    if (!io->s) return;
    forge__device *d = &io->s->m->dev;
    if (io->cb) d->vk.vkFreeCommandBuffers(d->dev, io->s->cmd_pool, 1, &io->cb);
    forge__buffer_destroy(d, &io->stage, &io->s->mem, &io->s->m->mem_total);
}

/* Copies `bytes` between the stage's start and offset `off` of the device range `r`, waiting
 * for it; the barriers order it after the steps that wrote the cache and before those that
 * read it. */
static forge_status forge__state_copy(forge__state_io *io, forge__range r, uint64_t off, uint64_t bytes, bool to_device) {
    forge_session *s = io->s;
    forge__device *d = &s->m->dev;
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    d->vk.vkBeginCommandBuffer(io->cb, &bi); /* resets it: the session's pool allows that */
    forge__rec rec = {.dev = d, .cb = io->cb, .err = &s->err};
    forge__range stage = {io->stage.buf, 0, io->stage.size}, cache = {r.buf, r.offset + off, bytes};
    forge__barrier(&rec);
    forge__copy(&rec, to_device ? stage : cache, to_device ? cache : stage, bytes);
    if (to_device) forge__barrier(&rec);
    else forge__host_barrier(&rec);
    d->vk.vkEndCommandBuffer(io->cb);
    forge_status st = forge__submit_wait(d, io->cb, s->fence, &s->err);
    if (!st && !to_device) forge__readback_invalidate(d, &io->stage, 0, bytes);
    return st;
}

/* Moves `bytes` at offset `off` of the device range `r` between the device and the host, a
 * stage at a time: to `fp` (or with fp NULL, to *dst, advanced) when reading, from *src
 * (advanced) when loading. */
static forge_status forge__state_bytes(forge__state_io *io, forge__range r, uint64_t off, uint64_t bytes, FILE *fp, uint8_t **dst,
                                       const uint8_t **src, const char *path) {
    while (bytes > 0) {
        uint64_t n = FORGE__MIN(bytes, io->stage.size);
        forge_status st;
        if (src) {
            memcpy(io->stage.mapped, *src, (size_t)n);
            *src += n;
            st = forge__state_copy(io, r, off, n, true);
        } else {
            st = forge__state_copy(io, r, off, n, false);
            if (!st && !fp) {
                memcpy(*dst, io->stage.mapped, (size_t)n);
                *dst += n;
            } else if (!st && !forge__write_all(fp, io->stage.mapped, (size_t)n)) {
                st = forge__fail(&io->s->err, FORGE_ERR_IO, "%s: writing failed: %s", path, strerror(errno));
            }
        }
        if (st) return st;
        off += n;
        bytes -= n;
    }
    return FORGE_OK;
}

/* Moves the K or V rows of positions [first, first + count) of one layer between its cache
 * (position p in slot p % slots) and the host: to `fp` (or with fp NULL, to `dst`) when
 * reading, from `src` when loading. */
static forge_status forge__state_rows(forge__state_io *io, forge__range cache, uint32_t slots, int first, int count, FILE *fp,
                                      uint8_t *dst, const uint8_t *src, const char *path) {
    while (count > 0) { /* a run of slots up to the ring's end */
        uint32_t slot = (uint32_t)first % slots;
        uint32_t k = (uint32_t)FORGE__MIN((uint32_t)count, slots - slot);
        forge_status st = forge__state_bytes(io, cache, slot * io->kv_row, k * io->kv_row, fp, &dst, src ? &src : NULL, path);
        if (st) return st;
        first += (int)k;
        count -= (int)k;
    }
    return FORGE_OK;
}

/* ---- Converting between cache types ---- */

/* One head of D keys or values in a cache of type kv (F32, F16 or Q8_0) to f32 and back, on the
 * host; the bytes may be unaligned (a state file's mapping). A q8_0 head in bytes (the words of
 * kernels/common.glsl's layout on a little-endian host): D int8 codes, then its D/32 blocks' f16
 * scales, then padding to a word; it is quantized as the kernels do (kv8_scale, kv8_code, with
 * IEEE division: a value q d quantizes back to q). */
static void forge__kv_head_read(const uint8_t *src, forge_kv_type kv, uint32_t D, float *out) {
    for (uint32_t e = 0; e < D; e++) {
        if (kv == FORGE_KV_Q8_0) {
            uint16_t h;
            memcpy(&h, src + D + 2 * (e / 32), 2);
            out[e] = (float)(int8_t)src[e] * forge__f16_to_f32(h);
        } else if (kv == FORGE_KV_F16) {
            uint16_t h;
            memcpy(&h, src + 2 * e, 2);
            out[e] = forge__f16_to_f32(h);
        } else {
            memcpy(out + e, src + 4 * e, 4);
        }
    }
}
static void forge__kv_head_write(const float *v, forge_kv_type kv, uint32_t D, uint8_t *dst) {
    if (kv == FORGE_KV_Q8_0) {
        memset(dst + D, 0, (size_t)forge__kv_bytes(kv, 1, D) - D);
        for (uint32_t b = 0; b < D / 32; b++) {
            float amax = 0;
            for (uint32_t e = 32 * b; e < 32 * b + 32; e++) amax = fmaxf(amax, fabsf(v[e]));
            uint16_t h = forge__f32_to_f16(fminf(amax / 127.0f, 65504.0f));
            float d = forge__f16_to_f32(h);
            memcpy(dst + D + 2 * b, &h, 2);
            for (uint32_t e = 32 * b; e < 32 * b + 32; e++) {
                float q = d > 0 ? fminf(fmaxf(nearbyintf(v[e] / d), -127.0f), 127.0f) : 0.0f;
                dst[e] = (uint8_t)(int8_t)q;
            }
        }
        return;
    }
    for (uint32_t e = 0; e < D; e++) {
        if (kv == FORGE_KV_F16) {
            uint16_t h = forge__f32_to_f16(v[e]);
            memcpy(dst + 2 * e, &h, 2);
        } else {
            memcpy(dst + 4 * e, v + e, 4);
        }
    }
}

/* `heads` heads of D keys or values from one cache type to another, on the host (D <=
 * FORGE__MAX_HEAD_DIM; src may be unaligned). */
static void forge__kv_convert(const uint8_t *src, forge_kv_type from, uint8_t *dst, forge_kv_type to, size_t heads, uint32_t D) {
    float v[FORGE__MAX_HEAD_DIM];
    const size_t sb = (size_t)forge__kv_bytes(from, 1, D), db = (size_t)forge__kv_bytes(to, 1, D);
    for (size_t h = 0; h < heads; h++, src += sb, dst += db) {
        forge__kv_head_read(src, from, D, v);
        forge__kv_head_write(v, to, D, dst);
    }
}

/* ---- Saving ---- */

/* Flushes the directory holding `path`, so that a rename in it survives a crash (best effort). */
static void forge__sync_dir(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir) dir[1] = 0;
    else if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        if (fsync(fd)) { /* some file systems cannot: the data itself is synced */ }
        close(fd);
    }
}

/* The first of the positions layer l's cache holds of the session's n_past: the ring's, after
 * a load what it restored (positions first .. n_past - 1; first == n_past when none). */
static int forge__kv_first(const forge_session *s, int l) {
    const forge__config *c = &s->m->cfg;
    int first = FORGE__MAX(0, s->kv_high - (int)s->slots[l]);
    if (c->layer_sliding[l] && c->sliding_window > 0) first = FORGE__MAX(first, s->kv_from);
    return FORGE__MIN(s->n_past, first);
}

/* State files hold one row shape for every attention layer's keys and values (see forge.h);
 * linear-attention layers hold their recurrent state. */
static forge_status forge__state_supported(forge_session *s) {
    const forge__config *c = &s->m->cfg;
    bool uniform = true;
    for (int l = 0; l < c->n_layers; l++)
        if (!c->layer_linear[l] && (forge__kv_shared(c, l) || forge__hd(c, l) != (uint32_t)c->head_dim || forge__nkv(c, l) != (uint32_t)c->n_kv_heads))
            uniform = false;
    if (uniform) return FORGE_OK;
    return forge__fail(&s->err, FORGE_ERR_UNSUPPORTED, "state files and key inspection are not supported for architecture %s: its layers "
                       "cache keys of different shapes or share caches", forge__arch_names[c->arch]);
}

static forge_status forge__session_save(forge_session *s, const char *path) {
    const forge__config *c = &s->m->cfg;
    const int n = s->n_past;
    if (forge__state_supported(s)) return FORGE_ERR_UNSUPPORTED;
    char tmp[4200];
    if (strlen(path) > 4096) return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "save: the path is longer than 4096 bytes");
    int *rows = (int *)malloc(sizeof(int) * (size_t)c->n_layers), most = 1;
    if (!rows) return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int l = 0; l < c->n_layers; l++) most = FORGE__MAX(most, rows[l] = c->layer_linear[l] ? 0 : n - forge__kv_first(s, l));
    uint8_t *header = NULL;
    size_t header_size = 0;
    forge__state_io io = {0};
    forge_status st = forge__state_header(s->m, s->n_ctx, n, rows, forge__state_file_kv(s->kv) == FORGE_KV_F16, &header, &header_size, &s->err);
    if (!st) st = forge__state_io_open(&io, s, most, false);
    /* a q8_0 cache: a layer's rows read whole, then written as f32 (forge__state_file_kv) */
    const size_t heads_most = (size_t)most * (size_t)c->n_kv_heads;
    uint8_t *q8_rows = NULL, *f32_rows = NULL;
    if (!st && s->kv == FORGE_KV_Q8_0 &&
        (!(q8_rows = (uint8_t *)malloc((size_t)most * io.kv_row)) || !(f32_rows = (uint8_t *)malloc(heads_most * 4 * (size_t)c->head_dim))))
        st = forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    FILE *fp = NULL;
    if (!st) {
        snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", path);
        int fd = mkstemp(tmp); /* mode 0600: the file holds the conversation */
        if (fd < 0 || !(fp = fdopen(fd, "wb"))) {
            st = forge__fail(&s->err, FORGE_ERR_IO, "%s: cannot create a temporary file beside it: %s", path, strerror(errno));
            if (fd >= 0) {
                close(fd);
                remove(tmp);
            }
        }
    }
    if (!st && (!forge__write_all(fp, header, header_size) || !forge__write_all(fp, s->history, 4ull * (size_t)n)))
        st = forge__fail(&s->err, FORGE_ERR_IO, "%s: writing failed: %s", path, strerror(errno));
    for (int l = 0; l < c->n_layers && !st; l++)
        for (int kv = 0; kv < 2 && !st; kv++) {
            forge__range cache = (kv ? s->vc : s->kc)[l];
            if (c->layer_linear[l]) {
                st = forge__state_bytes(&io, cache, 0, forge__state_recurrent_bytes(c, kv), fp, NULL, NULL, path);
            } else if (q8_rows) {
                const size_t heads = (size_t)rows[l] * (size_t)c->n_kv_heads;
                st = forge__state_rows(&io, cache, s->slots[l], n - rows[l], rows[l], NULL, q8_rows, NULL, path);
                if (!st) forge__kv_convert(q8_rows, FORGE_KV_Q8_0, f32_rows, FORGE_KV_F32, heads, (uint32_t)c->head_dim);
                if (!st && !forge__write_all(fp, f32_rows, heads * 4 * (size_t)c->head_dim))
                    st = forge__fail(&s->err, FORGE_ERR_IO, "%s: writing failed: %s", path, strerror(errno));
            } else {
                st = forge__state_rows(&io, cache, s->slots[l], n - rows[l], rows[l], fp, NULL, NULL, path);
            }
        }
    free(q8_rows);
    free(f32_rows);
    if (fp) {
        if (!st && (fflush(fp) != 0 || fsync(fileno(fp)) != 0))
            st = forge__fail(&s->err, FORGE_ERR_IO, "%s: writing failed: %s", path, strerror(errno));
        if (fclose(fp) != 0 && !st) st = forge__fail(&s->err, FORGE_ERR_IO, "%s: writing failed: %s", path, strerror(errno));
        if (!st && rename(tmp, path) != 0) st = forge__fail(&s->err, FORGE_ERR_IO, "%s: cannot rename the finished file over it: %s", path, strerror(errno));
        if (st) remove(tmp);
        else forge__sync_dir(path);
    }
    forge__state_io_close(&io);
    free(header);
    free(rows);
    return st;
}

/* ---- Loading ---- */


/* Replaces the session's state with a checked one (its keys and values converted to the
 * session's type where the file's differs). The session holds no tokens while its cache is
 * being overwritten, so a device failure midway leaves it empty, not inconsistent. */
static forge_status forge__state_apply(forge_session *s, const forge__state *state) {
    const forge__config *c = &s->m->cfg;
    const int n = state->n_past;
    int most = 1, kv_from = 0;
    for (int l = 0; l < c->n_layers; l++) most = FORGE__MAX(most, FORGE__MIN(state->layers[l].rows, (int)s->slots[l]));
    s->n_past = 0;
    s->kv_from = 0;
    forge__state_io io;
    forge_status st = forge__state_io_open(&io, s, most, true);
    const size_t per_row = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    const forge_kv_type file_kv = state->kv_f16 ? FORGE_KV_F16 : FORGE_KV_F32;
    const uint64_t file_row = forge__state_kv_row(c, file_kv);
    uint8_t *converted = NULL; /* a layer's rows in the session's type, where the file's differs */
    if (!st && file_kv != s->kv && !(converted = (uint8_t *)malloc((size_t)most * per_row * 4))) /* (the largest row type: f32) */
        st = forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int l = 0; l < c->n_layers && !st; l++) {
        const forge__state_layer *sl = &state->layers[l];
        if (c->layer_linear[l]) { /* sequence 0's recurrent states */
            for (int i = 0; i < 2 && !st; i++) {
                const uint8_t *src = i ? sl->v : sl->k;
                st = forge__state_bytes(&io, (i ? s->vc : s->kc)[l], 0, forge__state_recurrent_bytes(c, i), NULL, NULL, &src, NULL);
            }
            continue;
        }
        int keep = FORGE__MIN(sl->rows, (int)s->slots[l]); /* a smaller ring than the saving session's keeps the latest */
        uint64_t skip = (uint64_t)(sl->rows - keep) * file_row;
        for (int kv = 0; kv < 2 && !st; kv++) {
            const uint8_t *rows = (kv ? sl->v : sl->k) + skip;
            if (converted) {
                forge__kv_convert(rows, file_kv, converted, s->kv, (size_t)keep * (size_t)c->n_kv_heads, (uint32_t)c->head_dim);
                rows = converted;
            }
            st = forge__state_rows(&io, (kv ? s->vc : s->kc)[l], s->slots[l], n - keep, keep, NULL, NULL, rows, NULL);
        }
        if (c->layer_sliding[l] && c->sliding_window > 0) kv_from = FORGE__MAX(kv_from, n - keep);
    }
    free(converted);
    forge__state_io_close(&io);
    if (st) return st;
    if (n) memcpy(s->history, state->tokens, 4ull * (size_t)n);
    s->n_past = s->kv_high = n;
    s->kv_from = kv_from;
    return FORGE_OK;
}

static forge_status forge__session_load(forge_session *s, const char *path) {
    forge__file f;
    if (forge__state_supported(s)) return FORGE_ERR_UNSUPPORTED;
    forge_status st = forge__file_map(&f, path, &s->err);
    if (st) return st;
    forge__arena a = {0};
    forge__state state;
    st = forge__state_read(s->m, s->n_ctx, &f, &a, &state, &s->err);
    if (!st) st = forge__state_apply(s, &state);
    forge__arena_free(&a);
    forge__file_unmap(&f);
    return st;
}

FORGE_API forge_status forge_session_save(forge_session *s, const char *path) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    if (!path || !*path) return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "forge_session_save: no path");
    forge_status st = forge__slot_acquire(s->m, &s->err);
    if (st) return st;
    st = forge__session_save(s, path);
    forge__slot_release(s->m);
    return st;
}

FORGE_API forge_status forge_session_load(forge_session *s, const char *path) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    if (!path || !*path) return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "forge_session_load: no path");
    forge_status st = forge__slot_acquire(s->m, &s->err);
    if (st) return st;
    st = forge__session_load(s, path);
    forge__slot_release(s->m);
    return st;
}

FORGE_API forge_status forge_session_tokens(const forge_session *s, int32_t *tokens, size_t capacity, size_t *n_tokens) {
    if (!s || !n_tokens || (!tokens && capacity)) return FORGE_ERR_INVALID_ARGUMENT;
    *n_tokens = (size_t)s->n_past;
    if (capacity < (size_t)s->n_past) return FORGE_ERR_BUFFER_TOO_SMALL;
    if (s->n_past) memcpy(tokens, s->history, 4ull * (size_t)s->n_past);
    return FORGE_OK;
}

/* ---- Inspecting the keys ---- */

/* Reads layer l's cached keys, positions first .. first + rows - 1, into out[kv head][row][d]:
 * [rows, kv heads, head_dim] through the stage into `tmp`, then transposed per head. A GGUF
 * `llama` checkpoint's keys rotate adjacent pairs (its q/k rows are permuted: config.c); they
 * go back to HF's rotate-half order here: element k*half + i of a head is adjacent 2i + k.
 * Under a partial RoPE (Qwen 3.5) forge's head dims are HF's in the runs of
 * forge__rope_perm_runs; they go back to HF's order likewise. */
static forge_status forge__session_keys(forge_session *s, int l, int first, int rows, float *out) {
    const forge__config *c = &s->m->cfg;
    const int H = c->n_kv_heads, D = c->head_dim, half = D / 2;
    const size_t n = (size_t)rows * (size_t)H * (size_t)D;
    const size_t raw_bytes = s->kv == FORGE_KV_F32 ? 0 : (size_t)rows * (size_t)forge__state_kv_row(c, s->kv);
    float *tmp = (float *)malloc(4 * n + raw_bytes); /* an f16 or q8_0 cache's rows land after the floats */
    if (!tmp) return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    uint8_t *raw = raw_bytes ? (uint8_t *)(tmp + n) : (uint8_t *)tmp;
    forge__state_io io;
    forge_status st = forge__state_io_open(&io, s, rows, false);
    if (!st) st = forge__state_rows(&io, s->kc[l], s->slots[l], first, rows, NULL, raw, NULL, NULL);
    forge__state_io_close(&io);
    if (!st && raw_bytes) forge__kv_convert(raw, s->kv, (uint8_t *)tmp, FORGE_KV_F32, (size_t)rows * (size_t)H, (uint32_t)D);
    uint32_t run_first[4], run_len[4];
    const bool partial = c->rope_full.scaling == FORGE__ROPE_PARTIAL;
    if (partial) forge__rope_perm_runs((uint32_t)D, forge__rope_dims(c, (uint32_t)D), run_first, run_len);
    for (int h = 0; h < H && !st; h++)
        for (int r = 0; r < rows; r++) {
            const float *src = tmp + ((size_t)r * H + h) * D;
            float *dst = out + ((size_t)h * rows + r) * D;
            if (partial) {
                for (int k = 0; k < 4; k++) {
                    memcpy(dst + run_first[k], src, 4ull * run_len[k]);
                    src += run_len[k];
                }
                continue;
            }
            if (!c->rope_adjacent_pairs) {
                memcpy(dst, src, 4ull * (size_t)D);
                continue;
            }
            for (int i = 0; i < half; i++) {
                dst[i] = src[2 * i];
                dst[half + i] = src[2 * i + 1];
            }
        }
    free(tmp);
    return st;
}

FORGE_API forge_status forge_session_keys(forge_session *s, int layer, float *out, size_t capacity, forge_keys_info *info_out) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    const forge__config *c = &s->m->cfg;
    if (!info_out) return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "forge_session_keys: no info");
    forge_status st = forge__check_sized(info_out, "forge_keys_info", &s->err);
    if (st) return st;
    if (layer < 0 || layer >= c->n_layers)
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "forge_session_keys: layer %d is outside the model's layers 0..%d", layer,
                           c->n_layers - 1);
    if (forge__state_supported(s)) return FORGE_ERR_UNSUPPORTED;
    if (c->layer_linear[layer])
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT,
                           "forge_session_keys: layer %d is a linear-attention layer (Gated DeltaNet): it keeps a recurrent state, not keys; "
                           "ask a full-attention layer", layer);
    const int first = forge__kv_first(s, layer), rows = s->n_past - first;
    forge_keys_info full = {.struct_size = sizeof full}, *info = &full;
    info->n_layers = c->n_layers;
    info->n_kv_heads = c->n_kv_heads;
    info->head_dim = c->head_dim;
    info->first = first;
    info->n_rows = rows;
    info->window = c->layer_sliding[layer] ? c->sliding_window : 0;
    info->n_floats = (size_t)c->n_kv_heads * (size_t)rows * (size_t)c->head_dim;
    FORGE__PUT(info_out, full);
    if (!out) return FORGE_OK;
    if (capacity < info->n_floats)
        return forge__fail(&s->err, FORGE_ERR_BUFFER_TOO_SMALL, "forge_session_keys: layer %d's keys need %zu floats; the buffer holds %zu", layer,
                           info->n_floats, capacity);
    if (!rows) return FORGE_OK;
    if ((st = forge__slot_acquire(s->m, &s->err))) return st;
    st = forge__session_keys(s, layer, first, rows, out);
    forge__slot_release(s->m);
    return st;
}
