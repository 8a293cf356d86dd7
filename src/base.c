/* src/base.c: Basics and memory.
 * Owns: the build preamble (feature macros, the headers every section uses, the embedded
 * SPIR-V), status names and per-object error messages, logging, checked arithmetic, half and
 * bfloat conversions, the host arena and device-memory accounting, growable scratch buffers,
 * the FNV-1a hash.
 * May call: nothing of forge's (libc, cJSON and Vulkan headers only).
 */

/* ---- Status names, per-object error messages, the log callback, checked arithmetic ---- */

#define FORGE__ERRMSG_SIZE 1024
#define FORGE__MAX_LAYERS 512
#define FORGE__ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define FORGE__MIN(a, b) ((a) < (b) ? (a) : (b))
#define FORGE__MAX(a, b) ((a) > (b) ? (a) : (b))

FORGE_API const char *forge_status_name(forge_status status) {
    switch (status) {
    case FORGE_OK: return "FORGE_OK";
    case FORGE_ERR_INVALID_ARGUMENT: return "FORGE_ERR_INVALID_ARGUMENT";
    case FORGE_ERR_IO: return "FORGE_ERR_IO";
    case FORGE_ERR_FORMAT: return "FORGE_ERR_FORMAT";
    case FORGE_ERR_UNSUPPORTED: return "FORGE_ERR_UNSUPPORTED";
    case FORGE_ERR_MODEL: return "FORGE_ERR_MODEL";
    case FORGE_ERR_DEVICE: return "FORGE_ERR_DEVICE";
    case FORGE_ERR_OUT_OF_MEMORY: return "FORGE_ERR_OUT_OF_MEMORY";
    case FORGE_ERR_LIMIT: return "FORGE_ERR_LIMIT";
    case FORGE_ERR_BUFFER_TOO_SMALL: return "FORGE_ERR_BUFFER_TOO_SMALL";
    case FORGE_ERR_CANCELLED: return "FORGE_ERR_CANCELLED";
    }
    return "FORGE_ERR_UNKNOWN";
}

#define FORGE__STR(x) #x
#define FORGE__XSTR(x) FORGE__STR(x)
FORGE_API const char *forge_version(void) {
    return FORGE__XSTR(FORGE_VERSION_MAJOR) "." FORGE__XSTR(FORGE_VERSION_MINOR) "." FORGE__XSTR(FORGE_VERSION_PATCH);
}
FORGE_API int forge_version_number(void) { return FORGE_VERSION_NUMBER; }

/* Every public struct, by name, for forge_struct_size: bindings check their mirrors with it. */
#define FORGE__PUBLIC_STRUCTS(X)                                                                                                 \
    X(forge_device_info) X(forge_model_params) X(forge_memory_stats) X(forge_model_info) X(forge_discover_params)               \
    X(forge_discovered_model) X(forge_session_params) X(forge_keys_info) X(forge_detok_stream) X(forge_special_tokens)          \
    X(forge_generate_params) X(forge_metrics) X(forge_batch_item) X(forge_batch_result) X(forge_chat_message)                   \
    X(forge_classify_prompt) X(forge_classify_params) X(forge_classify_result) X(forge_train_params) X(forge_train_batch)      \
    X(forge_train_stats) X(forge_constraint) X(forge_tool_call) X(forge_tool) X(forge_chat_reply) X(forge_embed_params)          \
    X(forge_embed_info) X(forge_rerank_params)
FORGE_API size_t forge_struct_size(const char *name) {
#define FORGE__STRUCT_SIZE(T) if (name && !strcmp(name, #T)) return sizeof(T);
    FORGE__PUBLIC_STRUCTS(FORGE__STRUCT_SIZE)
#undef FORGE__STRUCT_SIZE
    return 0;
}

/* An error slot: the message of the last failure on the object that owns it. */
typedef struct forge__err {
    char msg[FORGE__ERRMSG_SIZE];
} forge__err;

/* Formats a message into `err` and returns `status`, so callers write
 * `return forge__fail(err, FORGE_ERR_FORMAT, "%s: ...", path);`. */
static forge_status forge__fail(forge__err *err, forge_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static forge_status forge__fail(forge__err *err, forge_status status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* The first failure of a builder that goes on after one (a grammar's parser and automaton, a
 * schema's conversion): `prefix` and the formatted message into `err`, and st into *sticky,
 * unless *sticky already holds one (the first message is the one that says why). Returns
 * false, for `return forge__x_fail(...)` in functions that return success. */
static bool forge__fail_first(forge_status *sticky, forge__err *err, forge_status st, const char *prefix, const char *fmt, va_list ap)
    __attribute__((format(printf, 5, 0)));
static bool forge__fail_first(forge_status *sticky, forge__err *err, forge_status st, const char *prefix, const char *fmt, va_list ap) {
    if (*sticky) return false;
    char msg[FORGE__ERRMSG_SIZE];
    vsnprintf(msg, sizeof msg, fmt, ap);
    forge__fail(err, st, "%s%s", prefix, msg);
    *sticky = st;
    return false;
}

/* Prefixes the message already in `err` with more context ("loading x: <old message>"). */
static forge_status forge__wrap(forge__err *err, forge_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static forge_status forge__wrap(forge__err *err, forge_status status, const char *fmt, ...) {
    char prefix[512], old[FORGE__ERRMSG_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
    return status;
}

/* ---- Structs that grow at their end (forge.h: "Structs grow at their end") ----
 * A caller's struct declares its size in its first field; forge reads and writes at most that
 * many bytes of it, so a binary built against an older (smaller) struct is never written past. */

static uint32_t forge__struct_size(const void *p) {
    uint32_t n;
    memcpy(&n, p, sizeof n);
    return n;
}
/* A struct (or an array's first element) the caller passes must say its size: checked before a
 * call does anything. NULL passes: a NULL output is one the caller did not ask for. */
static forge_status forge__check_sized(const void *p, const char *type, forge__err *err) {
    if (p && forge__struct_size(p) < sizeof(uint32_t))
        return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "%s.struct_size is %u: set it to sizeof(%s) before the call", type,
                           forge__struct_size(p), type);
    return FORGE_OK;
}
/* Writes forge's `full` (size bytes, struct_size first) as a caller's struct of n bytes at out:
 * the first n bytes of it, the bytes past forge's fields zeroed, struct_size set to n. */
static void forge__put_sized(void *out, uint32_t n, const void *full, size_t size) {
    memcpy(out, &n, sizeof n);
    if (n > size) memset((char *)out + size, 0, n - size);
    size_t k = FORGE__MIN((size_t)n, size);
    if (k > sizeof n) memcpy((char *)out + sizeof n, (const char *)full + sizeof n, k - sizeof n);
}
/* Fills the caller's struct at out (its own struct_size) from forge's `full`. */
#define FORGE__PUT(out, full) forge__put_sized((out), forge__struct_size(out), &(full), sizeof(full))
/* Element i of a caller's array whose elements are `stride` bytes. */
#define FORGE__ELEM(base, i, stride) ((void *)((char *)(base) + (size_t)(i) * (stride)))
/* Reads the caller's struct at in (n bytes) into forge's `full` (size bytes): fields past n are 0. */
static void forge__get_sized(void *full, size_t size, const void *in, uint32_t n) {
    memset(full, 0, size);
    memcpy(full, in, FORGE__MIN((size_t)n, size));
    uint32_t own = (uint32_t)size;
    memcpy(full, &own, sizeof own);
}
/* A caller's array of n structs (stride: its first element's struct_size) as forge's own structs
 * of `size` bytes: a calloc'd copy (free it), or NULL when out of host memory. */
static void *forge__array_in(const void *arr, int n, size_t size) {
    void *full = calloc(n > 0 ? (size_t)n : 1, size);
    if (!full || n <= 0) return full;
    uint32_t stride = forge__struct_size(arr);
    for (int i = 0; i < n; i++) forge__get_sized((char *)full + (size_t)i * size, size, FORGE__ELEM(arr, i, stride), stride);
    return full;
}
/* Writes forge's array of n structs (`size` bytes each) into the caller's, whose first element's
 * struct_size is every element's: each gets that struct_size. */
static void forge__array_out(void *arr, const void *full, int n, size_t size) {
    if (n <= 0) return;
    uint32_t stride = forge__struct_size(arr);
    for (int i = 0; i < n; i++) forge__put_sized(FORGE__ELEM(arr, i, stride), stride, (const char *)full + (size_t)i * size, size);
}


typedef struct forge__logger {
    forge_log_fn fn;
    void *user;
} forge__logger;

static void forge__log(const forge__logger *lg, forge_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void forge__log(const forge__logger *lg, forge_log_level level, const char *fmt, ...) {
    if (!lg || !lg->fn) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    lg->fn(lg->user, level, line);
}

/* a*b and a+b on sizes that come from files: false on overflow. */
static bool forge__mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
    if (a != 0 && b > UINT64_MAX / a) return false;
    *out = a * b;
    return true;
}
static bool forge__add_ok(uint64_t a, uint64_t b, uint64_t *out) {
    if (b > UINT64_MAX - a) return false;
    *out = a + b;
    return true;
}

static uint64_t forge__align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static double forge__now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool forge__ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* IEEE half / bfloat16 <-> float on the host (upload conversions, references in tests). */
static float forge__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: renormalize */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) { mant <<= 1; exp--; }
            bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static float forge__bf16_to_f32(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static uint16_t forge__f32_to_bf16(float f) { /* round to nearest even, as torch does */
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7fff + ((bits >> 16) & 1);
    return (uint16_t)(bits >> 16);
}
static uint16_t forge__f32_to_f16(float f) { /* round to nearest even */
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00);
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* overflow -> inf */
    if (ax < 0x38800000u) { /* subnormal or zero */
        float af;
        memcpy(&af, &ax, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(af * 16777216.0f)); /* 2^24 */
    }
    uint32_t r = ax + 0xfff + ((ax >> 13) & 1) - 0x38000000u;
    return (uint16_t)(sign | (r >> 13));
}

/* ---- Memory ----
 * The host arena: every table a model or session keeps lives in one arena, allocated while
 * loading (or creating the session) and released at once on free. Nothing is allocated on the
 * hot path. The device side is accounted here too: every VkDeviceMemory forge allocates is
 * counted against its owner, so in-use and peak bytes are exact. */

typedef struct forge__arena_block {
    struct forge__arena_block *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
} forge__arena_block;

typedef struct forge__arena {
    forge__arena_block *head;
    size_t bytes;          /* total bytes reserved from the system */
} forge__arena;

#define FORGE__ARENA_BLOCK ((size_t)1 << 20)   /* blocks are this size unless one allocation needs more */

static void *forge__arena_alloc(forge__arena *a, size_t size, size_t align) {
    if (align < 16) align = 16;
    forge__arena_block *b = a->head;
    if (b) {
        size_t off = (size_t)forge__align_up(b->used, align);
        if (off <= b->size && size <= b->size - off) {
            b->used = off + size;
            memset(b->data + off, 0, size);
            return b->data + off;
        }
    }
    size_t bs = FORGE__ARENA_BLOCK;
    if (size + align > bs) bs = size + align;
    b = (forge__arena_block *)malloc(sizeof *b + bs);
    if (!b) return NULL;
    b->next = a->head;
    b->size = bs;
    b->used = size;
    a->head = b;
    a->bytes += sizeof *b + bs;
    memset(b->data, 0, size);
    return b->data;
}

static char *forge__arena_strndup(forge__arena *a, const char *s, size_t n) {
    char *p = (char *)forge__arena_alloc(a, n + 1, 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}
static char *forge__arena_strdup(forge__arena *a, const char *s) {
    return forge__arena_strndup(a, s, strlen(s));
}

static void forge__arena_free(forge__arena *a) {
    forge__arena_block *b = a->head;
    while (b) {
        forge__arena_block *n = b->next;
        free(b);
        b = n;
    }
    a->head = NULL;
    a->bytes = 0;
}

/* Device memory accounting for one owner (a model or a session), and the device-wide total
 * the model keeps for all its sessions (peak device memory in benchmarks). */
typedef struct forge__mem_counter {
    uint64_t planned, in_use, peak, n_buffers, n_allocations;
} forge__mem_counter;

/* `c` belongs to one object (one thread at a time); `total` is the model's, which sessions
 * and trainers on other threads update too: atomically, the peak by compare-and-swap. */
static void forge__mem_add(forge__mem_counter *c, forge__mem_counter *total, uint64_t bytes) {
    c->in_use += bytes;
    c->n_allocations++;
    if (c->in_use > c->peak) c->peak = c->in_use;
    if (total) {
        uint64_t now = __atomic_add_fetch(&total->in_use, bytes, __ATOMIC_RELAXED);
        uint64_t peak = __atomic_load_n(&total->peak, __ATOMIC_RELAXED);
        while (now > peak && !__atomic_compare_exchange_n(&total->peak, &peak, now, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        }
    }
}
static void forge__mem_sub(forge__mem_counter *c, forge__mem_counter *total, uint64_t bytes) {
    c->in_use -= bytes;
    c->n_allocations--;
    if (total) __atomic_sub_fetch(&total->in_use, bytes, __ATOMIC_RELAXED);
}
/* The model's totals, read while other threads may be updating them. */
static uint64_t forge__mem_peak(const forge__mem_counter *total) { return __atomic_load_n(&total->peak, __ATOMIC_RELAXED); }
static uint64_t forge__mem_in_use(const forge__mem_counter *total) { return __atomic_load_n(&total->in_use, __ATOMIC_RELAXED); }

/* ---- Growable scratch (per call, never on the model) ---- */

typedef struct forge__buf {
    char *p;
    size_t n, cap;
    bool heap;         /* p was malloc'd (else it is caller storage, e.g. on the stack) */
    bool oom;
} forge__buf;

static void forge__buf_init(forge__buf *b, char *storage, size_t cap) {
    b->p = storage;
    b->n = 0;
    b->cap = storage ? cap : 0;
    b->heap = false;
    b->oom = false;
}
static bool forge__buf_reserve(forge__buf *b, size_t extra) {
    if (b->oom) return false;
    if (b->n + extra <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) cap *= 2;
    char *p = (char *)(b->heap ? realloc(b->p, cap) : malloc(cap));
    if (!p) { b->oom = true; return false; }
    if (!b->heap && b->n) memcpy(p, b->p, b->n);
    b->p = p;
    b->cap = cap;
    b->heap = true;
    return true;
}
static void forge__buf_put(forge__buf *b, const void *s, size_t n) {
    if (!n || !forge__buf_reserve(b, n)) return;
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void forge__buf_free(forge__buf *b) {
    if (b->heap) free(b->p);
    forge__buf_init(b, NULL, 0);
}
/* A typed growable array on top of forge__buf: element count = n / sizeof(T). */
#define FORGE__VEC_PUSH(b, T, v) do { T v_ = (v); forge__buf_put((b), &v_, sizeof(T)); } while (0)
#define FORGE__VEC_AT(b, T, i) (((T *)(b)->p)[i])
#define FORGE__VEC_LEN(b, T) ((b)->n / sizeof(T))

/* ---- Hashing: FNV-1a (64 bits), for identities written to files (state files, caches) ---- */

#define FORGE__FNV_BASIS 1469598103934665603ull
/* FNV-1a (64 bits) of n bytes, continuing from h. */
static uint64_t forge__fnv(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = (const uint8_t *)data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}
static uint64_t forge__fnv_u64(uint64_t h, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    return forge__fnv(h, b, 8);
}
static uint64_t forge__fnv_f64(uint64_t h, double v) {
    uint64_t bits;
    memcpy(&bits, &v, 8);
    return forge__fnv_u64(h, bits);
}
