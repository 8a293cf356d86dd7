/* src/files.c: Files.
 * Owns: mapped files (forge__file), tensor dtypes, the tensor table, the safetensors and
 * GGUF parsers.
 * May call: base.c.
 *
 * Checkpoints are mapped read-only, never copied (discovery reads only their headers, into the
 * same parsers: forge__file_read_head). Every offset, size and shape read from a
 * file is checked against the file's size before it is used: a hostile file gets an error
 * naming the file and field, never a crash. The result of this section is a tensor table
 * (name -> dtype, shape, bytes in the mapping), whatever the format (config.c reads
 * the configuration). A string read from a file (a key, a tensor name, a dtype) goes into a
 * message through forge__esc, escaped: a corrupted header's bytes are shown, not written raw.
 */

/* ---- a file's strings in messages ---- */

/* Bytes of the well-formed UTF-8 character at s[0 .. n), code point U+00A0 or above (so no C1
 * control); 0 when there is none. */
static size_t forge__utf8_printable(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (!len || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] > 0x9f) || (c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] > 0x8f))
        return 0; /* overlong, a surrogate, past U+10FFFF */
    if (c == 0xc2 && s[1] < 0xa0) return 0; /* U+0080 .. U+009F: C1 controls */
    return len;
}

/* s[0 .. len) as a message shows it, into out (size >= 8): printable ASCII and well-formed UTF-8
 * as they are, a backslash as \\, every other byte (control characters, bytes of no valid UTF-8
 * character) as \xNN, so that a corrupted key reads 'to\x94eniz\x9ar.ggml.tokens'; cut with
 * "..." when it does not fit. Returns out. Every place a file's string goes into a message uses
 * it. */
static const char *forge__esc(char *out, size_t size, const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        char piece[8];
        size_t n = 1, pn = 1;
        if (u[i] >= 0x20 && u[i] < 0x7f && u[i] != '\\') piece[0] = (char)u[i];
        else if (u[i] == '\\') memcpy(piece, "\\\\", pn = 2);
        else if ((n = forge__utf8_printable(u + i, len - i)) > 0) memcpy(piece, s + i, pn = n);
        else {
            snprintf(piece, sizeof piece, "\\x%02x", u[i]);
            n = 1;
            pn = 4;
        }
        size_t room = size - 1 - o;
        if (pn > room || (i + n < len && pn + 3 > room)) {
            if (room >= 3) memcpy(out + o, "...", 3), o += 3;
            break;
        }
        memcpy(out + o, piece, pn);
        o += pn;
        i += n;
    }
    out[o] = 0;
    return out;
}

/* A NUL-terminated file string escaped into a local buffer: FORGE__ESC(buf, s). */
#define FORGE__ESC(buf, s) forge__esc((buf), sizeof(buf), (s), strlen(s))

typedef struct forge__file {
    char *path;
    const uint8_t *data;
    uint64_t size;             /* the file's size */
    uint64_t avail;            /* bytes of it at data: size when mapped, less when only a header was read */
    bool heap;                 /* data is a malloc'd copy of the first avail bytes (forge__file_read_head) */
} forge__file;

static forge_status forge__file_map(forge__file *f, const char *path, forge__err *err) {
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return forge__fail(err, FORGE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return forge__fail(err, FORGE_ERR_IO, "%s: not a regular file", path);
    }
    f->size = (uint64_t)st.st_size;
    if (f->size > 0) {
        void *p = mmap(NULL, (size_t)f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return forge__fail(err, FORGE_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
        }
        f->data = (const uint8_t *)p;
    }
    close(fd);
    f->avail = f->size;
    f->path = strdup(path);
    if (!f->path) {
        if (f->data) munmap((void *)f->data, (size_t)f->size);
        return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    return FORGE_OK;
}

/* Reads the first `n` bytes of a file (all of it when shorter) without mapping the rest:
 * discovery parses headers this way. The parsers check offsets against f->size as usual and
 * give tensors no data pointer (NULL) when their bytes are not at hand. */
static forge_status forge__file_read_head(forge__file *f, const char *path, uint64_t n, forge__err *err) {
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return forge__fail(err, FORGE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return forge__fail(err, FORGE_ERR_IO, "%s: not a regular file", path);
    }
    f->size = (uint64_t)st.st_size;
    f->avail = FORGE__MIN(n, f->size);
    f->heap = true;
    uint8_t *buf = (uint8_t *)malloc((size_t)f->avail + 1);
    f->path = strdup(path);
    if (!buf || !f->path) {
        free(buf);
        free(f->path);
        close(fd);
        return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    f->data = buf;
    uint64_t got = 0;
    while (got < f->avail) {
        ssize_t r = pread(fd, buf + got, (size_t)(f->avail - got), (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            forge_status s = forge__fail(err, FORGE_ERR_IO, "%s: read failed: %s", path, r ? strerror(errno) : "unexpected end of file");
            close(fd);
            free(buf);
            free(f->path);
            memset(f, 0, sizeof *f);
            return s;
        }
        got += (uint64_t)r;
    }
    close(fd);
    return FORGE_OK;
}

/* Drops the process's copies of a mapped file's pages once the weights are on the device (the
 * upload does it as it goes, tensor by tensor, and the load once more at its end): the
 * mapping stays valid, and a later read (the tokenizer, a fingerprint) faults its page in again
 * from the file, which a read-only private mapping never wrote. Without it the process holds the
 * weights twice, the file's pages and the device copy, and on a CPU device both are host memory. */
static void forge__file_release_pages(const forge__file *f, const uint8_t *p, uint64_t bytes) {
    /* only a mapping's own pages: on heap memory MADV_DONTNEED would zero them */
    if (f->heap || !f->data || !p || p < f->data || p >= f->data + f->size || !bytes) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)p / page * page;
    uintptr_t hi = (uintptr_t)FORGE__MIN((uint64_t)(uintptr_t)(p + bytes), (uint64_t)(uintptr_t)(f->data + f->size));
    (void)madvise((void *)lo, (size_t)(hi - lo), MADV_DONTNEED); /* the mapping starts on a page */
}

static void forge__file_unmap(forge__file *f) {
    if (f->heap) free((void *)f->data);
    else if (f->data) munmap((void *)f->data, (size_t)f->size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* Whether path is a regular file. */
static bool forge__file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Reads a whole small file (config.json) into a NUL-terminated malloc'd buffer. */
static forge_status forge__read_text(const char *path, char **out, size_t *len, forge__err *err) {
    forge__file f;
    forge_status st = forge__file_map(&f, path, err);
    if (st) return st;
    char *buf = (char *)malloc((size_t)f.size + 1);
    if (!buf) {
        forge__file_unmap(&f);
        return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory reading %s", path);
    }
    if (f.size) memcpy(buf, f.data, (size_t)f.size);
    buf[f.size] = 0;
    *len = (size_t)f.size;
    *out = buf;
    forge__file_unmap(&f);
    return FORGE_OK;
}

/* ---- Tensor data types, with GGUF's numbering where GGUF has the type ---- */

typedef enum forge__dtype {
    FORGE__F32 = 0,
    FORGE__F16 = 1,
    FORGE__Q4_0 = 2,
    FORGE__Q4_1 = 3,
    FORGE__Q5_0 = 6,
    FORGE__Q5_1 = 7,
    FORGE__Q8_0 = 8,
    FORGE__Q8_1 = 9,
    FORGE__Q2_K = 10,
    FORGE__Q3_K = 11,
    FORGE__Q4_K = 12,
    FORGE__Q5_K = 13,
    FORGE__Q6_K = 14,
    FORGE__Q8_K = 15,
    FORGE__IQ2_XXS = 16,
    FORGE__IQ2_XS = 17,
    FORGE__IQ3_XXS = 18,
    FORGE__IQ1_S = 19,
    FORGE__IQ4_NL = 20,
    FORGE__IQ3_S = 21,
    FORGE__IQ2_S = 22,
    FORGE__IQ4_XS = 23,
    FORGE__I8 = 24,
    FORGE__I16 = 25,
    FORGE__I32 = 26,
    FORGE__I64 = 27,
    FORGE__F64 = 28,
    FORGE__IQ1_M = 29,
    FORGE__BF16 = 30,
    FORGE__TQ1_0 = 34,
    FORGE__TQ2_0 = 35,
    FORGE__MXFP4 = 39,
    FORGE__GGUF_TYPE_END = 40,
    /* types only safetensors has */
    FORGE__U8 = 100,
    FORGE__U16,
    FORGE__U32,
    FORGE__U64,
    FORGE__BOOL,
    FORGE__F8_E4M3,
    FORGE__F8_E5M2,
    FORGE__DTYPE_INVALID = 255
} forge__dtype;

typedef struct forge__dtype_traits {
    const char *name;      /* lower-case, as printed by forge info */
    uint32_t block;        /* elements per block */
    uint32_t block_bytes;  /* bytes per block */
} forge__dtype_traits;

static forge__dtype_traits forge__dtype_info(forge__dtype t) {
    switch (t) {
    case FORGE__F32: return (forge__dtype_traits){"f32", 1, 4};
    case FORGE__F16: return (forge__dtype_traits){"f16", 1, 2};
    case FORGE__BF16: return (forge__dtype_traits){"bf16", 1, 2};
    case FORGE__F64: return (forge__dtype_traits){"f64", 1, 8};
    case FORGE__I8: return (forge__dtype_traits){"i8", 1, 1};
    case FORGE__I16: return (forge__dtype_traits){"i16", 1, 2};
    case FORGE__I32: return (forge__dtype_traits){"i32", 1, 4};
    case FORGE__I64: return (forge__dtype_traits){"i64", 1, 8};
    case FORGE__U8: return (forge__dtype_traits){"u8", 1, 1};
    case FORGE__U16: return (forge__dtype_traits){"u16", 1, 2};
    case FORGE__U32: return (forge__dtype_traits){"u32", 1, 4};
    case FORGE__U64: return (forge__dtype_traits){"u64", 1, 8};
    case FORGE__BOOL: return (forge__dtype_traits){"bool", 1, 1};
    case FORGE__F8_E4M3: return (forge__dtype_traits){"f8_e4m3", 1, 1};
    case FORGE__F8_E5M2: return (forge__dtype_traits){"f8_e5m2", 1, 1};
    case FORGE__Q4_0: return (forge__dtype_traits){"q4_0", 32, 18};
    case FORGE__Q4_1: return (forge__dtype_traits){"q4_1", 32, 20};
    case FORGE__Q5_0: return (forge__dtype_traits){"q5_0", 32, 22};
    case FORGE__Q5_1: return (forge__dtype_traits){"q5_1", 32, 24};
    case FORGE__Q8_0: return (forge__dtype_traits){"q8_0", 32, 34};
    case FORGE__Q8_1: return (forge__dtype_traits){"q8_1", 32, 36};
    case FORGE__Q2_K: return (forge__dtype_traits){"q2_k", 256, 84};
    case FORGE__Q3_K: return (forge__dtype_traits){"q3_k", 256, 110};
    case FORGE__Q4_K: return (forge__dtype_traits){"q4_k", 256, 144};
    case FORGE__Q5_K: return (forge__dtype_traits){"q5_k", 256, 176};
    case FORGE__Q6_K: return (forge__dtype_traits){"q6_k", 256, 210};
    case FORGE__Q8_K: return (forge__dtype_traits){"q8_k", 256, 292};
    case FORGE__IQ2_XXS: return (forge__dtype_traits){"iq2_xxs", 256, 66};
    case FORGE__IQ2_XS: return (forge__dtype_traits){"iq2_xs", 256, 74};
    case FORGE__IQ3_XXS: return (forge__dtype_traits){"iq3_xxs", 256, 98};
    case FORGE__IQ1_S: return (forge__dtype_traits){"iq1_s", 256, 50};
    case FORGE__IQ4_NL: return (forge__dtype_traits){"iq4_nl", 32, 18};
    case FORGE__IQ3_S: return (forge__dtype_traits){"iq3_s", 256, 110};
    case FORGE__IQ2_S: return (forge__dtype_traits){"iq2_s", 256, 82};
    case FORGE__IQ4_XS: return (forge__dtype_traits){"iq4_xs", 256, 136};
    case FORGE__IQ1_M: return (forge__dtype_traits){"iq1_m", 256, 56};
    case FORGE__TQ1_0: return (forge__dtype_traits){"tq1_0", 256, 54};
    case FORGE__TQ2_0: return (forge__dtype_traits){"tq2_0", 256, 66};
    case FORGE__MXFP4: return (forge__dtype_traits){"mxfp4", 32, 17};
    default: return (forge__dtype_traits){NULL, 0, 0};
    }
}

static const char *forge__dtype_name(forge__dtype t) {
    const char *n = forge__dtype_info(t).name;
    return n ? n : "unknown";
}

/* Bytes of one row of `cols` elements; false when cols is not a whole number of blocks. */
static bool forge__row_bytes(forge__dtype t, uint64_t cols, uint64_t *out) {
    forge__dtype_traits tr = forge__dtype_info(t);
    if (!tr.block || cols % tr.block) return false;
    return forge__mul_ok(cols / tr.block, tr.block_bytes, out);
}

/* ---- The tensor table: what a checkpoint holds, whatever its format ---- */

#define FORGE__MAX_DIMS 4

typedef struct forge__tensor {
    const char *name;          /* canonical name (GGUF or HF naming, prefix stripped) */
    forge__dtype dtype;
    int n_dims;
    int64_t shape[FORGE__MAX_DIMS]; /* outermost first: an HF Linear weight is [out, in] */
    const uint8_t *data;       /* in the mapping */
    uint64_t nbytes;
    const char *file;          /* path, for messages */
    bool used;                 /* consumed by the model builder */
} forge__tensor;

typedef struct forge__tensor_table {
    forge__tensor *items;
    int count, capacity;
    int *hash;                 /* open addressing: index+1, 0 = empty; size hash_cap */
    int hash_cap;
    bool model_names;          /* a checkpoint's tensors: a bare XModel's names take "model." (forge__hf_canonical_name) */
} forge__tensor_table;

static uint64_t forge__hash_str(const char *s) { return forge__fnv(FORGE__FNV_BASIS, s, strlen(s)); }

static forge__tensor *forge__tensor_find(const forge__tensor_table *t, const char *name) {
    if (!t->hash_cap) return NULL;
    uint64_t h = forge__hash_str(name);
    for (int probe = 0; probe < t->hash_cap; probe++) {
        int slot = (int)((h + (uint64_t)probe) % (uint64_t)t->hash_cap);
        int idx = t->hash[slot];
        if (!idx) return NULL;
        if (strcmp(t->items[idx - 1].name, name) == 0) return &t->items[idx - 1];
    }
    return NULL;
}

/* Adds a tensor; names are unique across all shards of a checkpoint. */
static forge_status forge__tensor_add(forge__tensor_table *t, forge__arena *a, const forge__tensor *src,
                                      forge__err *err) {
    char en[256];
    if (forge__tensor_find(t, src->name))
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: tensor '%s' appears twice", src->file, FORGE__ESC(en, src->name));
    if (t->count == t->capacity) {
        int cap = t->capacity ? t->capacity * 2 : 256;
        forge__tensor *items = (forge__tensor *)forge__arena_alloc(a, sizeof *items * (size_t)cap, 16);
        int *hash = (int *)forge__arena_alloc(a, sizeof *hash * (size_t)cap * 2, 16);
        if (!items || !hash) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        if (t->count) memcpy(items, t->items, sizeof *items * (size_t)t->count);
        t->items = items;
        t->capacity = cap;
        t->hash = hash;
        t->hash_cap = cap * 2;
        for (int i = 0; i < t->count; i++) {
            uint64_t h = forge__hash_str(items[i].name);
            int slot = (int)(h % (uint64_t)t->hash_cap);
            while (hash[slot]) slot = (slot + 1) % t->hash_cap;
            hash[slot] = i + 1;
        }
    }
    t->items[t->count] = *src;
    uint64_t h = forge__hash_str(src->name);
    int slot = (int)(h % (uint64_t)t->hash_cap);
    while (t->hash[slot]) slot = (slot + 1) % t->hash_cap;
    t->hash[slot] = ++t->count;
    return FORGE_OK;
}

/* `off` bytes into the tensor's data; NULL when its bytes are not in memory (a header read
 * by discovery, which plans the model without reading weights). */
static const uint8_t *forge__tensor_at(const forge__tensor *t, uint64_t off) { return t->data ? t->data + off : NULL; }

static uint64_t forge__tensor_elements(const forge__tensor *t) {
    uint64_t n = 1;
    for (int i = 0; i < t->n_dims; i++) n *= (uint64_t)t->shape[i];
    return n;
}

static void forge__shape_str(const forge__tensor *t, char *buf, size_t size) {
    int o = snprintf(buf, size, "[");
    for (int i = 0; i < t->n_dims && o < (int)size; i++)
        o += snprintf(buf + o, size - (size_t)o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < (int)size) snprintf(buf + o, size - (size_t)o, "]");
}

/* ---- safetensors ----
 * Layout: u64 little-endian header length N, N bytes of JSON, then the data. The JSON maps
 * tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the
 * data), plus an optional "__metadata__" object of strings. */

static forge__dtype forge__safetensors_dtype(const char *s) {
    static const struct { const char *name; forge__dtype t; } map[] = {
        {"F32", FORGE__F32}, {"F16", FORGE__F16}, {"BF16", FORGE__BF16}, {"F64", FORGE__F64},
        {"I8", FORGE__I8}, {"I16", FORGE__I16}, {"I32", FORGE__I32}, {"I64", FORGE__I64},
        {"U8", FORGE__U8}, {"U16", FORGE__U16}, {"U32", FORGE__U32}, {"U64", FORGE__U64},
        {"BOOL", FORGE__BOOL}, {"F8_E4M3", FORGE__F8_E4M3}, {"F8_E5M2", FORGE__F8_E5M2},
    };
    for (size_t i = 0; i < FORGE__ARRAY_LEN(map); i++)
        if (strcmp(map[i].name, s) == 0) return map[i].t;
    return FORGE__DTYPE_INVALID;
}

/* Strips the prefixes multimodal and wrapped checkpoints put before the text model's names:
 * "language_model.model.x" and "model.language_model.x" -> "model.x"; "language_model.lm_head"
 * -> "lm_head"; in a checkpoint's table (model_names), a bare model's "layers.x", "embed_tokens.x",
 * "norm.weight" -> "model.x" (state files name their own tensors "layers.N.k"). Returns NULL for tensors of other towers (vision, audio, projector), which
 * forge skips. */
static const char *forge__hf_canonical_name(const char *name, bool model_names, char *buf, size_t size) {
    static const char *skip[] = {"vision_tower.", "vision_model.", "multi_modal_projector.",
                                 "model.vision_tower.", "model.multi_modal_projector.",
                                 "audio_tower.", "model.audio_tower.", "embed_vision.",
                                 "model.embed_vision.", "embed_audio.", "model.embed_audio.",
                                 "model.visual.", "visual.", "mtp."}; /* Qwen 3.5: the vision tower, multi-token prediction */
    for (size_t i = 0; i < FORGE__ARRAY_LEN(skip); i++)
        if (strncmp(name, skip[i], strlen(skip[i])) == 0) return NULL;
    if (strncmp(name, "language_model.", 15) == 0) {
        name += 15;
    } else if (strncmp(name, "model.language_model.", 21) == 0) {
        snprintf(buf, size, "model.%s", name + 21);
        return buf;
    } else if (model_names && (strncmp(name, "layers.", 7) == 0 || strncmp(name, "embed_tokens.", 13) == 0 || !strcmp(name, "norm.weight"))) {
        /* a bare XModel as sentence-transformers saves its Transformer module (Qwen3-Embedding,
         * EmbeddingGemma): the text model without the "model." of an XForCausalLM */
        snprintf(buf, size, "model.%s", name);
        return buf;
    }
    snprintf(buf, size, "%s", name);
    return buf;
}

/* Adds the tensors of a mapped safetensors file to `table`. With `meta` not NULL, *meta gets the
 * header's "__metadata__" object (or NULL when there is none), which the caller frees with
 * cJSON_Delete. */
static forge_status forge__safetensors_parse_meta(const forge__file *f, forge__tensor_table *table, forge__arena *arena,
                                                  cJSON **meta, forge__err *err) {
    const char *path = f->path;
    if (meta) *meta = NULL;
    if (f->size < 8)
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: file of %llu bytes is too short for a safetensors header",
                           path, (unsigned long long)f->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->data[i];
    if (hlen > f->size - 8)
        return forge__fail(err, FORGE_ERR_FORMAT,
                           "%s: header length %llu runs past the end of the file (%llu bytes)", path,
                           (unsigned long long)hlen, (unsigned long long)f->size);
    if (hlen > ((uint64_t)100 << 20))
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: header length %llu exceeds 100 MiB", path,
                           (unsigned long long)hlen);
    if (8 + hlen > f->avail)
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: only %llu bytes of the %llu-byte header were read", path,
                           (unsigned long long)f->avail, (unsigned long long)(8 + hlen));
    const uint8_t *data = f->data + 8 + hlen;
    uint64_t data_size = f->size - 8 - hlen;
    cJSON *root = cJSON_ParseWithLength((const char *)f->data + 8, (size_t)hlen);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: header is not a JSON object", path);
    }
    forge_status st = FORGE_OK;
    const char *fpath = forge__arena_strdup(arena, path);
    cJSON *md = NULL;
    for (cJSON *it = root->child; it; it = it->next) {
        const char *key = it->string;
        if (!key) continue;
        char ek[256], ed[64]; /* the key and the dtype, escaped for messages */
        FORGE__ESC(ek, key);
        if (strcmp(key, "__metadata__") == 0) {
            if (!cJSON_IsObject(it)) {
                st = forge__fail(err, FORGE_ERR_FORMAT, "%s: __metadata__ is not an object", path);
                break;
            }
            md = it;
            continue;
        }
        if (!cJSON_IsObject(it)) {
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: entry '%s' is not an object", path, ek);
            break;
        }
        cJSON *jd = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        cJSON *js = cJSON_GetObjectItemCaseSensitive(it, "shape");
        cJSON *jo = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        if (!cJSON_IsString(jd) || !cJSON_IsArray(js) || !cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2) {
            st = forge__fail(err, FORGE_ERR_FORMAT,
                             "%s: tensor '%s' lacks a string dtype, a shape array or two data_offsets", path, ek);
            break;
        }
        forge__tensor t;
        memset(&t, 0, sizeof t);
        t.file = fpath;
        t.dtype = forge__safetensors_dtype(jd->valuestring);
        if (t.dtype == FORGE__DTYPE_INVALID) {
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: tensor '%s' has unknown dtype '%s'", path, ek, FORGE__ESC(ed, jd->valuestring));
            break;
        }
        int nd = cJSON_GetArraySize(js);
        char nbuf[512];
        const char *canon = forge__hf_canonical_name(key, table->model_names, nbuf, sizeof nbuf);
        if (!canon) continue; /* another tower's weights (vision, audio: a video patch embedding has 5 dimensions) */
        if (nd > FORGE__MAX_DIMS) {
            st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: tensor '%s' has %d dimensions (at most %d)", path,
                             ek, nd, FORGE__MAX_DIMS);
            break;
        }
        t.n_dims = nd;
        uint64_t nel = 1;
        bool shape_ok = true;
        for (int d = 0; d < nd; d++) {
            cJSON *x = cJSON_GetArrayItem(js, d);
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9.0e15 ||
                x->valuedouble != floor(x->valuedouble)) {
                shape_ok = false;
                break;
            }
            t.shape[d] = (int64_t)x->valuedouble;
            if (!forge__mul_ok(nel, (uint64_t)t.shape[d], &nel)) { shape_ok = false; break; }
        }
        if (!shape_ok) {
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: tensor '%s' has an invalid or overflowing shape", path, ek);
            break;
        }
        double b = cJSON_GetArrayItem(jo, 0)->valuedouble, e = cJSON_GetArrayItem(jo, 1)->valuedouble;
        if (!cJSON_IsNumber(cJSON_GetArrayItem(jo, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(jo, 1)) || b < 0 ||
            e < b || e > 1.8e19 || b != floor(b) || e != floor(e)) {
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: tensor '%s' has invalid data_offsets", path, ek);
            break;
        }
        uint64_t begin = (uint64_t)b, end = (uint64_t)e, expect = 0;
        if (end > data_size) {
            st = forge__fail(err, FORGE_ERR_FORMAT,
                             "%s: tensor '%s' data_offsets [%llu, %llu] run past the end of the data (%llu bytes)",
                             path, ek, (unsigned long long)begin, (unsigned long long)end,
                             (unsigned long long)data_size);
            break;
        }
        if (!forge__mul_ok(nel, forge__dtype_info(t.dtype).block_bytes, &expect) || expect != end - begin) {
            st = forge__fail(err, FORGE_ERR_FORMAT,
                             "%s: tensor '%s' holds %llu bytes but its shape and dtype %s need %llu", path, ek,
                             (unsigned long long)(end - begin), FORGE__ESC(ed, jd->valuestring), (unsigned long long)expect);
            break;
        }
        t.data = f->avail == f->size ? data + begin : NULL;
        t.nbytes = end - begin;
        t.name = forge__arena_strdup(arena, canon);
        if (!t.name) { st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); break; }
        if ((st = forge__tensor_add(table, arena, &t, err))) break;
    }
    if (!st && meta && md) *meta = cJSON_DetachItemViaPointer(root, md);
    cJSON_Delete(root);
    return st;
}

FORGE__INTERNAL forge_status forge__safetensors_parse(const forge__file *f, forge__tensor_table *table,
                                                      forge__arena *arena, forge__err *err) {
    return forge__safetensors_parse_meta(f, table, arena, NULL, err);
}

/* ---- GGUF (v2, v3) ----
 * Layout: "GGUF", u32 version, u64 n_tensors, u64 n_kv, then n_kv (key, type, value) entries,
 * then n_tensors infos (name, n_dims, ne[n_dims], type, offset), then padding to the
 * alignment (general.alignment, default 32) and the tensor data. Strings are u64 length +
 * bytes. ne[0] is the innermost (contiguous) dimension. */

typedef enum forge__gguf_type {
    FORGE__GGUF_UINT8 = 0, FORGE__GGUF_INT8 = 1, FORGE__GGUF_UINT16 = 2, FORGE__GGUF_INT16 = 3,
    FORGE__GGUF_UINT32 = 4, FORGE__GGUF_INT32 = 5, FORGE__GGUF_FLOAT32 = 6, FORGE__GGUF_BOOL = 7,
    FORGE__GGUF_STRING = 8, FORGE__GGUF_ARRAY = 9, FORGE__GGUF_UINT64 = 10, FORGE__GGUF_INT64 = 11,
    FORGE__GGUF_FLOAT64 = 12, FORGE__GGUF_TYPE_COUNT = 13
} forge__gguf_type;

static const uint32_t forge__gguf_type_size[FORGE__GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

typedef struct forge__gguf_kv {
    const char *key;             /* NUL-terminated copy in the arena */
    forge__gguf_type type;
    forge__gguf_type elem_type;  /* for arrays */
    uint64_t count;              /* array length (1 for scalars) */
    const uint8_t *value;        /* points into the mapping: the scalar, string (len+bytes) or array elements */
} forge__gguf_kv;

typedef struct forge__gguf {
    uint32_t version;
    uint32_t alignment;
    forge__gguf_kv *kv;
    int n_kv;
    uint64_t data_offset;
    bool short_head;             /* parsing failed at the end of a partly read file: read more and parse again */
} forge__gguf;

/* A set of strings (open addressing over borrowed pointers), for duplicate detection. */
typedef struct forge__strset {
    const char **slots;
    size_t cap;
} forge__strset;

static bool forge__strset_init(forge__strset *s, size_t n) {
    s->cap = 16;
    while (s->cap < 2 * n + 2) s->cap *= 2;
    s->slots = (const char **)calloc(s->cap, sizeof *s->slots);
    return s->slots != NULL;
}
static void forge__strset_free(forge__strset *s) {
    free(s->slots);
    s->slots = NULL;
}
/* false when `k` is already present */
static bool forge__strset_insert(forge__strset *s, const char *k) {
    size_t i = (size_t)(forge__hash_str(k) & (s->cap - 1));
    while (s->slots[i]) {
        if (!strcmp(s->slots[i], k)) return false;
        i = (i + 1) & (s->cap - 1);
    }
    s->slots[i] = k;
    return true;
}

typedef struct forge__reader {
    const uint8_t *p, *end;
    const char *path;
    forge__err *err;
    bool failed;
    bool at_end;               /* a read ran past `end` (for a header read in part: read more) */
} forge__reader;

static bool forge__rd(forge__reader *r, void *dst, uint64_t n, const char *what) {
    if (r->failed) return false;
    if ((uint64_t)(r->end - r->p) < n) {
        char ew[256]; /* `what` may be a key read from the file */
        forge__fail(r->err, FORGE_ERR_FORMAT, "%s: truncated while reading %s", r->path, FORGE__ESC(ew, what));
        r->failed = r->at_end = true;
        return false;
    }
    if (dst) memcpy(dst, r->p, (size_t)n);
    r->p += n;
    return true;
}

static bool forge__rd_str(forge__reader *r, const char **s, uint64_t *len, const char *what) {
    uint64_t n;
    if (!forge__rd(r, &n, 8, what)) return false;
    if ((uint64_t)(r->end - r->p) < n) {
        char ew[256];
        forge__fail(r->err, FORGE_ERR_FORMAT, "%s: %s of %llu bytes runs past the end of the file", r->path, FORGE__ESC(ew, what),
                    (unsigned long long)n);
        r->failed = r->at_end = true;
        return false;
    }
    *s = (const char *)r->p;
    *len = n;
    r->p += n;
    return true;
}

/* Skips a value of `type`; arrays are checked element by element for strings, by size
 * otherwise. Nested arrays are not part of the GGUF spec and are rejected. */
static bool forge__gguf_skip_value(forge__reader *r, forge__gguf_type type, const char *key, int depth) {
    char ek[256];
    if ((unsigned)type >= FORGE__GGUF_TYPE_COUNT) {
        forge__fail(r->err, FORGE_ERR_FORMAT, "%s: key '%s' has unknown value type %u", r->path, FORGE__ESC(ek, key), (unsigned)type);
        r->failed = true;
        return false;
    }
    if (type == FORGE__GGUF_STRING) {
        const char *s;
        uint64_t n;
        return forge__rd_str(r, &s, &n, key);
    }
    if (type == FORGE__GGUF_ARRAY) {
        uint32_t et;
        uint64_t count;
        if (!forge__rd(r, &et, 4, key) || !forge__rd(r, &count, 8, key)) return false;
        if (depth > 0 || et == FORGE__GGUF_ARRAY || et >= FORGE__GGUF_TYPE_COUNT) {
            forge__fail(r->err, FORGE_ERR_FORMAT, "%s: key '%s' has an array of unsupported type %u", r->path, FORGE__ESC(ek, key), et);
            r->failed = true;
            return false;
        }
        if (et == FORGE__GGUF_STRING) {
            for (uint64_t i = 0; i < count; i++)
                if (!forge__gguf_skip_value(r, FORGE__GGUF_STRING, key, depth + 1)) return false;
            return true;
        }
        uint64_t bytes;
        if (!forge__mul_ok(count, forge__gguf_type_size[et], &bytes)) {
            forge__fail(r->err, FORGE_ERR_FORMAT, "%s: key '%s' array length overflows", r->path, FORGE__ESC(ek, key));
            r->failed = true;
            return false;
        }
        return forge__rd(r, NULL, bytes, key);
    }
    return forge__rd(r, NULL, forge__gguf_type_size[type], key);
}

/* Reads one metadata entry: its key (unique in the file), type and value (validated, then
 * skipped; kv->value points at it in the mapping). general.alignment is applied here. */
static forge_status forge__gguf_read_kv(forge__reader *r, forge__gguf *g, forge__arena *arena, forge__strset *keys,
                                        forge__err *err) {
    const char *k;
    uint64_t klen;
    uint32_t type;
    if (!forge__rd_str(r, &k, &klen, "metadata key") || !forge__rd(r, &type, 4, "metadata type")) return FORGE_ERR_FORMAT;
    forge__gguf_kv *kv = &g->kv[g->n_kv++];
    kv->key = forge__arena_strndup(arena, k, (size_t)klen);
    if (!kv->key) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    kv->type = (forge__gguf_type)type;
    kv->count = 1;
    kv->value = r->p;
    if (type == FORGE__GGUF_ARRAY && (uint64_t)(r->end - r->p) >= 12) {
        uint32_t et;
        memcpy(&et, r->p, 4);
        memcpy(&kv->count, r->p + 4, 8);
        kv->elem_type = (forge__gguf_type)et;
        kv->value = r->p + 12;
    }
    if (!forge__gguf_skip_value(r, (forge__gguf_type)type, kv->key, 0)) return FORGE_ERR_FORMAT;
    char ek[256];
    if (!forge__strset_insert(keys, kv->key))
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: metadata key '%s' appears twice", r->path, FORGE__ESC(ek, kv->key));
    if (strcmp(kv->key, "general.alignment") == 0) {
        if (type != FORGE__GGUF_UINT32) return forge__fail(err, FORGE_ERR_FORMAT, "%s: general.alignment is not a uint32", r->path);
        memcpy(&g->alignment, kv->value, 4);
        if (g->alignment == 0 || (g->alignment & (g->alignment - 1)) || g->alignment > 65536)
            return forge__fail(err, FORGE_ERR_FORMAT, "%s: general.alignment %u is not a power of two <= 65536", r->path,
                               g->alignment);
    }
    return FORGE_OK;
}

static forge_status forge__gguf_read(forge__reader *r, const forge__file *f, forge__gguf *g, forge__tensor_table *table,
                                     forge__arena *arena, forge__err *err) {
    memset(g, 0, sizeof *g);
    char magic[4];
    if (!forge__rd(r, magic, 4, "magic")) return FORGE_ERR_FORMAT;
    if (memcmp(magic, "GGUF", 4) != 0) return forge__fail(err, FORGE_ERR_FORMAT, "%s: not a GGUF file (bad magic)", f->path);
    uint64_t n_tensors, n_kv;
    if (!forge__rd(r, &g->version, 4, "version")) return FORGE_ERR_FORMAT;
    if (g->version != 2 && g->version != 3)
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: GGUF version %u (forge reads 2 and 3)", f->path, g->version);
    if (!forge__rd(r, &n_tensors, 8, "tensor count") || !forge__rd(r, &n_kv, 8, "metadata count"))
        return FORGE_ERR_FORMAT;
    /* Each kv needs at least 12 bytes, each tensor info at least 24: bounds before allocating. */
    if (n_kv > f->size / 12 || n_tensors > f->size / 24)
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: %llu metadata entries / %llu tensors cannot fit in %llu bytes",
                           f->path, (unsigned long long)n_kv, (unsigned long long)n_tensors,
                           (unsigned long long)f->size);
    g->kv = (forge__gguf_kv *)forge__arena_alloc(arena, sizeof *g->kv * (size_t)(n_kv ? n_kv : 1), 16);
    if (!g->kv) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    g->alignment = 32;
    forge__strset keys = {0};
    if (!forge__strset_init(&keys, (size_t)n_kv)) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    forge_status kst = FORGE_OK;
    for (uint64_t i = 0; i < n_kv && !kst; i++) kst = forge__gguf_read_kv(r, g, arena, &keys, err);
    forge__strset_free(&keys);
    if (kst) return kst;
    /* Tensor infos: offsets are validated after the data offset is known. */
    typedef struct { const char *name; uint64_t len; uint32_t nd; uint64_t ne[FORGE__MAX_DIMS]; uint32_t type; uint64_t off; } info_t;
    info_t *infos = (info_t *)malloc(sizeof *infos * (size_t)(n_tensors ? n_tensors : 1));
    if (!infos) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    forge_status st = FORGE_OK;
    for (uint64_t i = 0; i < n_tensors && !st; i++) {
        info_t *ti = &infos[i];
        if (!forge__rd_str(r, &ti->name, &ti->len, "tensor name") || !forge__rd(r, &ti->nd, 4, "tensor n_dims")) {
            st = FORGE_ERR_FORMAT;
            break;
        }
        if (ti->nd == 0 || ti->nd > FORGE__MAX_DIMS) {
            char en[256];
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: tensor '%s' has %u dimensions", f->path, forge__esc(en, sizeof en, ti->name, (size_t)ti->len),
                             ti->nd);
            break;
        }
        if (!forge__rd(r, ti->ne, 8ull * ti->nd, "tensor shape") || !forge__rd(r, &ti->type, 4, "tensor type") ||
            !forge__rd(r, &ti->off, 8, "tensor offset"))
            st = FORGE_ERR_FORMAT;
    }
    if (!st) {
        uint64_t pos = (uint64_t)(r->p - f->data);
        g->data_offset = forge__align_up(pos, g->alignment);
        if (g->data_offset > f->size && n_tensors > 0)
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: tensor data would start at %llu, past the end of the file (%llu bytes)",
                             f->path, (unsigned long long)g->data_offset, (unsigned long long)f->size);
    }
    const char *fpath = st ? NULL : forge__arena_strdup(arena, f->path);
    uint64_t data_size = g->data_offset <= f->size ? f->size - g->data_offset : 0;
    for (uint64_t i = 0; i < n_tensors && !st; i++) {
        info_t *ti = &infos[i];
        forge__tensor t;
        memset(&t, 0, sizeof t);
        t.file = fpath;
        t.name = forge__arena_strndup(arena, ti->name, (size_t)ti->len);
        if (!t.name) { st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); break; }
        char en[256]; /* the name, escaped for messages */
        forge__esc(en, sizeof en, ti->name, (size_t)ti->len);
        forge__dtype_traits tr = ti->type < FORGE__GGUF_TYPE_END ? forge__dtype_info((forge__dtype)ti->type)
                                                                 : (forge__dtype_traits){NULL, 0, 0};
        if (!tr.name) {
            st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: tensor '%s' has unknown GGUF type %u", f->path, en, ti->type);
            break;
        }
        t.dtype = (forge__dtype)ti->type;
        t.n_dims = (int)ti->nd;
        uint64_t nel = 1;
        bool ok = true;
        for (uint32_t d = 0; d < ti->nd; d++) {
            if (ti->ne[d] > (uint64_t)INT64_MAX || !forge__mul_ok(nel, ti->ne[d], &nel)) ok = false;
            t.shape[ti->nd - 1 - d] = (int64_t)ti->ne[d]; /* outermost first */
        }
        uint64_t row_bytes, rows = ti->ne[0] ? nel / ti->ne[0] : 0;
        if (!ok || !forge__row_bytes(t.dtype, ti->ne[0], &row_bytes) || !forge__mul_ok(row_bytes, rows, &t.nbytes)) {
            st = forge__fail(err, FORGE_ERR_FORMAT,
                             "%s: tensor '%s' has an invalid shape for type %s (row of %llu elements, blocks of %u)",
                             f->path, en, tr.name, (unsigned long long)ti->ne[0], tr.block);
            break;
        }
        uint64_t end;
        if (ti->off % g->alignment) {
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: tensor '%s' offset %llu is not a multiple of the alignment %u",
                             f->path, en, (unsigned long long)ti->off, g->alignment);
            break;
        }
        if (!forge__add_ok(ti->off, t.nbytes, &end) || end > data_size) {
            st = forge__fail(err, FORGE_ERR_FORMAT,
                             "%s: tensor '%s' (offset %llu, %llu bytes) runs past the end of the data (%llu bytes)",
                             f->path, en, (unsigned long long)ti->off, (unsigned long long)t.nbytes,
                             (unsigned long long)data_size);
            break;
        }
        t.data = f->avail == f->size ? f->data + g->data_offset + ti->off : NULL;
        st = forge__tensor_add(table, arena, &t, err);
    }
    free(infos);
    return st;
}

/* Parses a GGUF's metadata and tensor infos into *g and `table`. On a file read in part
 * (f->avail < f->size) that ends inside the header, g->short_head says to read more. */
FORGE__INTERNAL forge_status forge__gguf_parse(const forge__file *f, forge__gguf *g, forge__tensor_table *table,
                                               forge__arena *arena, forge__err *err) {
    forge__reader r = {f->data, f->data + f->avail, f->path, err, false, false};
    forge_status st = forge__gguf_read(&r, f, g, table, arena, err);
    g->short_head = st && r.at_end && f->avail < f->size;
    return st;
}

static const forge__gguf_kv *forge__gguf_find(const forge__gguf *g, const char *key) {
    for (int i = 0; i < g->n_kv; i++)
        if (strcmp(g->kv[i].key, key) == 0) return &g->kv[i];
    return NULL;
}

/* Reads an integer-typed scalar of any width; false when missing or not an integer. */
static bool forge__gguf_get_int(const forge__gguf *g, const char *key, int64_t *out) {
    const forge__gguf_kv *kv = forge__gguf_find(g, key);
    if (!kv) return false;
    const uint8_t *v = kv->value;
    switch (kv->type) {
    case FORGE__GGUF_UINT8: *out = *v; return true;
    case FORGE__GGUF_INT8: *out = (int8_t)*v; return true;
    case FORGE__GGUF_UINT16: { uint16_t x; memcpy(&x, v, 2); *out = x; return true; }
    case FORGE__GGUF_INT16: { int16_t x; memcpy(&x, v, 2); *out = x; return true; }
    case FORGE__GGUF_UINT32: { uint32_t x; memcpy(&x, v, 4); *out = x; return true; }
    case FORGE__GGUF_INT32: { int32_t x; memcpy(&x, v, 4); *out = x; return true; }
    case FORGE__GGUF_UINT64: { uint64_t x; memcpy(&x, v, 8); *out = (int64_t)x; return x <= INT64_MAX; }
    case FORGE__GGUF_INT64: { int64_t x; memcpy(&x, v, 8); *out = x; return true; }
    case FORGE__GGUF_BOOL: *out = *v != 0; return true;
    default: return false;
    }
}

static bool forge__gguf_get_float(const forge__gguf *g, const char *key, double *out) {
    const forge__gguf_kv *kv = forge__gguf_find(g, key);
    if (!kv) return false;
    if (kv->type == FORGE__GGUF_FLOAT32) { float x; memcpy(&x, kv->value, 4); *out = x; return true; }
    if (kv->type == FORGE__GGUF_FLOAT64) { double x; memcpy(&x, kv->value, 8); *out = x; return true; }
    int64_t i;
    if (forge__gguf_get_int(g, key, &i)) { *out = (double)i; return true; }
    return false;
}

/* A string value as (pointer into the mapping, length); not NUL-terminated. */
static bool forge__gguf_get_str(const forge__gguf *g, const char *key, const char **s, uint64_t *len) {
    const forge__gguf_kv *kv = forge__gguf_find(g, key);
    if (!kv || kv->type != FORGE__GGUF_STRING) return false;
    memcpy(len, kv->value, 8);
    *s = (const char *)kv->value + 8;
    return true;
}

/* Iterates an array of strings: *cursor starts at kv->value; each call yields one string.
 * The parser validated every length, so this cannot run past the mapping. */
static void forge__gguf_next_str(const uint8_t **cursor, const char **s, uint64_t *len) {
    memcpy(len, *cursor, 8);
    *s = (const char *)*cursor + 8;
    *cursor += 8 + *len;
}

