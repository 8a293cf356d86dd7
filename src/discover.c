/* src/discover.c: Discovery.
 * Owns: forge_discover and its reports.
 * May call: base.c, files.c, config.c, device.c, model.c, api.c.
 *
 * A directory tree searched for models without mapping a weight. The walk collects the
 * candidates (a directory with config.json and safetensors, each .gguf); each is then read
 * the way forge_model_load reads it, but with the headers read by pread (forge__file_read_head)
 * into the same parsers, and (unless quick) the loader's own plan (forge__plan_model) made on
 * a model that has no device, under nominal limits. Reports go out in path order.
 */

FORGE_API forge_discover_params forge_discover_default_params(void) {
    forge_discover_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.max_depth = 8;
    return p;
}

typedef struct forge__candidate {
    char *path;
    bool gguf;
} forge__candidate;

typedef struct forge__discovery {
    forge_discover_params p;
    forge__logger log;
    forge__candidate *found;
    int n_found, cap_found;
    struct { dev_t dev; ino_t ino; } *seen; /* directories searched: each once, so link loops end
                                             * (a list searched linearly: fine for thousands) */
    int n_seen, cap_seen;
    forge__err err;
} forge__discovery;

static forge_status forge__discover_add(forge__discovery *d, const char *path, bool gguf) {
    if (d->n_found == d->cap_found) {
        int cap = d->cap_found ? d->cap_found * 2 : 16;
        forge__candidate *f = (forge__candidate *)realloc(d->found, sizeof *f * (size_t)cap);
        if (!f) return forge__fail(&d->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        d->found = f;
        d->cap_found = cap;
    }
    if (!(d->found[d->n_found].path = strdup(path))) return forge__fail(&d->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    d->found[d->n_found++].gguf = gguf;
    return FORGE_OK;
}

/* false when the directory was searched already; else remembers it */
static bool forge__discover_first_visit(forge__discovery *d, const struct stat *sb, forge_status *st) {
    for (int i = 0; i < d->n_seen; i++)
        if (d->seen[i].dev == sb->st_dev && d->seen[i].ino == sb->st_ino) return false;
    if (d->n_seen == d->cap_seen) {
        int cap = d->cap_seen ? d->cap_seen * 2 : 64;
        void *s = realloc(d->seen, sizeof *d->seen * (size_t)cap);
        if (!s) {
            *st = forge__fail(&d->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
            return false;
        }
        d->seen = s;
        d->cap_seen = cap;
    }
    d->seen[d->n_seen].dev = sb->st_dev;
    d->seen[d->n_seen++].ino = sb->st_ino;
    return true;
}

static void forge__path_join(char *buf, size_t size, const char *dir, const char *name) {
    size_t n = strlen(dir);
    snprintf(buf, size, "%s%s%s", dir, n && dir[n - 1] == '/' ? "" : "/", name);
}

/* Collects the candidates in `dir` (already marked seen) and below, to max_depth. */
static forge_status forge__discover_walk(forge__discovery *d, const char *dir, int depth) {
    DIR *dp = opendir(dir);
    if (!dp) {
        forge__log(&d->log, FORGE_LOG_WARN, "%s: skipped, cannot open directory: %s", dir, strerror(errno));
        return FORGE_OK;
    }
    forge__names subdirs = {0};
    bool config = false, weights = false;
    forge_status st = FORGE_OK;
    const size_t path_size = 4096;
    char *path = (char *)malloc(path_size); /* on the heap: the recursion is as deep as the tree */
    if (!path) st = forge__fail(&d->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    struct dirent *de;
    while (!st && (de = readdir(dp))) {
        const char *name = de->d_name;
        if (name[0] == '.') continue; /* ., .., hidden entries (.git, .cache) */
        if (strlen(dir) + strlen(name) + 2 > path_size) {
            forge__log(&d->log, FORGE_LOG_WARN, "%s/%s: skipped, path too long", dir, name);
            continue;
        }
        forge__path_join(path, path_size, dir, name);
        struct stat ls, sb;
        if (lstat(path, &ls) != 0) continue;
        if (stat(path, &sb) != 0) {
            forge__log(&d->log, FORGE_LOG_WARN, "%s: skipped: %s", path, strerror(errno));
            continue;
        }
        if (S_ISDIR(sb.st_mode)) {
            if (S_ISLNK(ls.st_mode) && !d->p.follow_symlinks)
                forge__log(&d->log, FORGE_LOG_INFO, "%s: link to a directory not followed (follow_symlinks)", path);
            else if (depth < d->p.max_depth && !forge__names_add(&subdirs, name))
                st = forge__fail(&d->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        } else if (S_ISREG(sb.st_mode)) {
            if (!strcmp(name, "config.json")) config = true;
            else if (forge__ends_with(name, ".safetensors") || !strcmp(name, "model.safetensors.index.json")) weights = true;
            else if (forge__ends_with(name, ".gguf")) st = forge__discover_add(d, path, true);
        }
    }
    closedir(dp);
    if (!st && config && weights) st = forge__discover_add(d, dir, false);
    for (int i = 0; i < subdirs.n && !st; i++) {
        forge__path_join(path, path_size, dir, subdirs.v[i]);
        struct stat sb;
        if (stat(path, &sb) != 0) continue;
        if (forge__discover_first_visit(d, &sb, &st)) st = forge__discover_walk(d, path, depth + 1);
        else if (!st) forge__log(&d->log, FORGE_LOG_INFO, "%s: skipped, directory already searched (a link loop?)", path);
    }
    forge__names_free(&subdirs);
    free(path);
    return st;
}

/* Bits per element of a storage type named as forge__main_format names them ("q4_k+" 4,
 * "bf16" 16, "mlx4" 4): the first number in the name. */
static int forge__format_bits(const char *name) {
    const char *p = name;
    while (*p && !isdigit((unsigned char)*p)) p++;
    return *p ? atoi(p) : 0;
}

/* One candidate, checked as forge_model_load would check it. `m` is a model with no device
 * that holds the tensors and config; `d->err` gets the first failure. */
typedef struct forge__probe {
    forge_discovered_model out;
    char arch[64];
    char dtype[16];
    forge__err reason;
} forge__probe;

static void forge__probe_fail(forge__probe *r, forge_status st, const forge__err *err) {
    if (r->out.status) return; /* the first failure is the one the loader reports */
    r->out.status = st;
    r->reason = *err;
}

/* Parameters in a tensor as the table tells them (quick mode; the plan counts otherwise): MLX
 * codes (u32) unpacked at the config's bits, their scales and biases and RoPE factors none. */
static uint64_t forge__table_params(const forge__tensor *t, int mlx_bits) {
    if (mlx_bits > 0 && (forge__ends_with(t->name, ".scales") || forge__ends_with(t->name, ".biases"))) return 0;
    if (!strcmp(t->name, "rope_freqs.weight")) return 0;
    uint64_t n = forge__tensor_elements(t);
    return mlx_bits > 0 && t->dtype == FORGE__U32 ? n * 32 / (uint64_t)mlx_bits : n;
}

/* The dominant matrix type in the tensor table (quick mode; the plan's forge__main_format
 * otherwise): most parameters among 2-D tensors; MLX codes are "mlx" with the config's bits. */
static void forge__table_format(const forge__tensor_table *tt, int mlx_bits, char *out, size_t size) {
    uint64_t elems[FORGE__DTYPE_INVALID + 1] = {0};
    for (int i = 0; i < tt->count; i++)
        if (tt->items[i].n_dims == 2) elems[tt->items[i].dtype] += forge__table_params(&tt->items[i], mlx_bits);
    int best = -1, kinds = 0;
    for (int k = 0; k <= FORGE__DTYPE_INVALID; k++) {
        if (elems[k] && (best < 0 || elems[k] > elems[best])) best = k;
        kinds += elems[k] > 0;
    }
    if (best < 0) snprintf(out, size, "%s", "");
    else if (best == FORGE__U32 && mlx_bits > 0) snprintf(out, size, "mlx%d%s", mlx_bits, kinds > 1 ? "+" : "");
    else snprintf(out, size, "%s%s", forge__dtype_name((forge__dtype)best), kinds > 1 ? "+" : "");
}

/* The first read of a GGUF's header (metadata, the vocabulary included, and tensor infos),
 * grown 4x until the header fits; tests make it small. */
FORGE__INTERNAL uint64_t forge__gguf_head_bytes = (uint64_t)1 << 20;

static void forge__probe_gguf(forge_model *m, const char *path, forge__probe *r, forge__file *f, forge__gguf *g) {
    forge_status st;
    for (uint64_t n = forge__gguf_head_bytes;;) {
        if ((st = forge__file_read_head(f, path, n, &m->err))) {
            forge__probe_fail(r, st, &m->err);
            return;
        }
        st = forge__gguf_parse(f, g, &m->tensors, &m->arena, &m->err);
        if (!st || !g->short_head) break;
        n = n > f->size / 4 ? f->size : n * 4; /* short_head: n < f->size, so this grows */
        forge__file_unmap(f);
        forge__arena_free(&m->arena);
        memset(&m->tensors, 0, sizeof m->tensors);
    }
    r->out.n_files = 1;
    r->out.bytes = f->size;
    if (st) {
        forge__probe_fail(r, st, &m->err);
        return;
    }
    const char *as;
    uint64_t alen;
    if (forge__gguf_get_str(g, "general.architecture", &as, &alen))
        snprintf(r->arch, sizeof r->arch, "%.*s", (int)FORGE__MIN(alen, sizeof r->arch - 1), as);
    if ((st = forge__config_from_gguf(g, &m->tensors, path, &m->cfg, &m->err))) forge__probe_fail(r, st, &m->err);
}

static void forge__probe_safetensors(forge_model *m, const char *dir, forge__probe *r, int *mlx_bits) {
    forge_status st;
    char path[4200], *text = NULL;
    size_t len;
    forge__path_join(path, sizeof path, dir, "config.json");
    if ((st = forge__read_text(path, &text, &len, &m->err))) {
        forge__probe_fail(r, st, &m->err);
    } else {
        cJSON *root = cJSON_ParseWithLength(text, len);
        const char *mt = forge__json_str(root, "model_type");
        if (mt) snprintf(r->arch, sizeof r->arch, "%s", mt);
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization");
        *mlx_bits = forge__json_int(q, "bits", 0);
        cJSON_Delete(root);
        if ((st = forge__config_from_hf_json(text, len, path, &m->cfg, &m->err))) forge__probe_fail(r, st, &m->err);
        free(text);
    }
    /* the shards, header by header, even when the config failed (sizes and parameters are still told) */
    forge__names names = {0};
    if ((st = forge__safetensors_shards(dir, &names, &m->err))) forge__probe_fail(r, st, &m->err);
    r->out.n_files = names.n;
    bool parse = true;
    for (int i = 0; i < names.n; i++) {
        forge__path_join(path, sizeof path, dir, names.v[i]);
        forge__file f;
        if ((st = forge__file_read_head(&f, path, 8, &m->err))) {
            forge__probe_fail(r, st, &m->err);
            parse = false;
            continue;
        }
        r->out.bytes += f.size;
        uint64_t hlen = 0;
        for (int b = (int)f.avail - 1; b >= 0; b--) hlen = (hlen << 8) | f.data[b];
        forge__file_unmap(&f);
        if (!parse) continue;
        /* the parser judges the length; a sane one is read whole */
        uint64_t want = 8 + FORGE__MIN(hlen, (uint64_t)100 << 20);
        m->tensors.model_names = true;
        if ((st = forge__file_read_head(&f, path, want, &m->err)) ||
            (st = forge__safetensors_parse(&f, &m->tensors, &m->arena, &m->err))) {
            forge__probe_fail(r, st, &m->err);
            parse = false;
        }
        forge__file_unmap(&f);
    }
    forge__names_free(&names);
}

/* Fills r->out for the candidate. */
static void forge__probe_candidate(const forge__discovery *d, const forge__candidate *c, forge__probe *r) {
    memset(r, 0, sizeof *r);
    r->out.struct_size = sizeof r->out;
    r->out.path = c->path;
    r->out.format = c->gguf ? FORGE_FORMAT_GGUF : FORGE_FORMAT_SAFETENSORS;
    r->out.format_name = c->gguf ? "gguf" : "safetensors";
    forge_model *m = (forge_model *)calloc(1, sizeof *m);
    if (!m) {
        r->out.status = FORGE_ERR_OUT_OF_MEMORY;
        snprintf(r->reason.msg, sizeof r->reason.msg, "out of host memory");
    } else {
        forge__file f = {0};
        forge__gguf g;
        int mlx_bits = 0;
        if (c->gguf) forge__probe_gguf(m, c->path, r, &f, &g);
        else forge__probe_safetensors(m, c->path, r, &mlx_bits);
        for (int i = 0; i < m->tensors.count; i++) r->out.n_params += forge__table_params(&m->tensors.items[i], mlx_bits);
        forge__table_format(&m->tensors, mlx_bits, r->dtype, sizeof r->dtype);
        if (!r->out.status && !d->p.quick) {
            /* the loader's plan, under nominal limits: 1 GiB blocks and bindings, 16-byte alignment */
            m->dev.caps.max_storage_range = m->dev.caps.max_alloc = (uint64_t)1 << 30;
            m->dev.caps.storage_align = 16;
            forge__loader L;
            memset(&L, 0, sizeof L);
            L.m = m;
            L.gguf = c->gguf;
            if (!c->gguf) forge__st_load(&m->embed, c->path, &m->arena); /* its Dense weights are planned too */
            forge_status st = forge__plan_model(&L);
            if (!st) st = forge__pack_plan(&L.pack, &m->arena, &m->dev.caps, &m->err);
            if (st) {
                forge__probe_fail(r, st, &m->err);
            } else {
                forge__main_format(m);
                snprintf(r->dtype, sizeof r->dtype, "%s", m->main_format);
                r->out.n_params = m->n_params;
                r->out.device_bytes = forge__pack_total(&L.pack);
            }
        }
        forge__file_unmap(&f);
        forge__arena_free(&m->arena);
        free(m);
    }
    r->out.loadable = r->out.status == FORGE_OK;
    r->out.architecture = r->arch;
    r->out.weight_dtype = r->dtype;
    r->out.quant_bits = forge__format_bits(r->dtype);
    r->out.reason = r->reason.msg;
}

static int forge__cmp_candidate(const void *a, const void *b) {
    return strcmp(((const forge__candidate *)a)->path, ((const forge__candidate *)b)->path);
}

FORGE_API forge_status forge_discover(const char *dir, const forge_discover_params *params, forge_discover_fn fn, void *user_data,
                                      char *errmsg, size_t errmsg_size) {
    forge__discovery *d = (forge__discovery *)calloc(1, sizeof *d);
    if (!d) return FORGE_ERR_OUT_OF_MEMORY;
    FORGE__COPY_PARAMS(d->p, params, forge_discover_default_params);
    d->log = (forge__logger){d->p.log, d->p.log_user_data};
    forge_status st = FORGE_OK;
    struct stat sb;
    if (!dir || !fn) st = forge__fail(&d->err, FORGE_ERR_INVALID_ARGUMENT, "forge_discover: dir and fn must not be NULL");
    else if (d->p.max_depth < 0) st = forge__fail(&d->err, FORGE_ERR_INVALID_ARGUMENT, "forge_discover: max_depth is %d; it must be >= 0", d->p.max_depth);
    else if (stat(dir, &sb) != 0) st = forge__fail(&d->err, FORGE_ERR_IO, "%s: %s", dir, strerror(errno));
    else if (!S_ISDIR(sb.st_mode)) st = forge__fail(&d->err, FORGE_ERR_IO, "%s: not a directory", dir);
    else if (access(dir, R_OK | X_OK) != 0) st = forge__fail(&d->err, FORGE_ERR_IO, "%s: cannot read the directory: %s", dir, strerror(errno));
    if (!st && forge__discover_first_visit(d, &sb, &st)) st = forge__discover_walk(d, dir, 0);
    if (!st) {
        if (d->n_found) qsort(d->found, (size_t)d->n_found, sizeof *d->found, forge__cmp_candidate);
        forge__probe r;
        for (int i = 0; i < d->n_found; i++) {
            forge__probe_candidate(d, &d->found[i], &r);
            if (fn(user_data, &r.out)) break;
        }
    }
    if (st && errmsg && errmsg_size) snprintf(errmsg, errmsg_size, "%s", d->err.msg);
    for (int i = 0; i < d->n_found; i++) free(d->found[i].path);
    free(d->found);
    free(d->seen);
    free(d);
    return st;
}

