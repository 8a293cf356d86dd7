/* forge.c: the forge runtime, one C11 translation unit. The public API is forge.h.
 *
 * Contents, in the order data flows:
 *   0. Basics        status names, error messages, logging, small helpers
 *   1. Memory        the host arena; device memory accounting
 *   2. Files         mmap, safetensors, GGUF, config.json -> forge__config
 *   3. Tokenizer     tokenizer.json and GGUF vocabularies
 *   4. Device        Vulkan instance, device choice, capabilities, buffers
 *   5. Op table      one row per kernel; pipelines; dispatch recording
 *   6. Models        weights: naming conventions, validation, the upload plan
 *   7. Execution     sessions, the forward pass, prefill and the replayed decode step
 *   8. Public API    loading, sessions, eval: what ties the sections above together
 *   9. Discovery     models in a directory tree, checked from their headers without loading
 *  10. Generation    the sampler (device reduction + host draw), stop rules, prompt cache
 *  11. Classify      many prompts in padded batches, one forward pass each, no decode loop
 *  12. Chat          the families' native chat templates
 *  13. Training      LoRA adapters (PEFT and mlx-lm files), the trainer: backward pass, AdamW
 *  14. State         a session's tokens and KV cache to a file and back (save / restore);
 *                   a layer's keys to the caller (inspection)
 *
 * Conventions: every internal name is static and starts with forge__; tensors are row-major
 * and their shapes are written outermost first ([rows, cols]); activations are f32.
 */
#if !defined(_WIN32) && !defined(_GNU_SOURCE)
#  define _GNU_SOURCE 1   /* mmap, pthread, strndup, clock_gettime */
#endif

#include "forge.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <vulkan/vulkan.h>

#include "forge_kernels.h" /* generated at build time: the SPIR-V of kernels/ as arrays */

#ifdef FORGE_TESTING
#  define FORGE__INTERNAL        /* tests reach internals by including this file */
#else
#  define FORGE__INTERNAL static
#endif

/* =======================================================================================
 * 0. Basics
 * Status names, per-object error messages, the log callback, checked arithmetic.
 * ===================================================================================== */

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

/* =======================================================================================
 * 1. Memory
 * The host arena: every table a model or session keeps lives in one arena, allocated while
 * loading (or creating the session) and released at once on free. Nothing is allocated on the
 * hot path. The device side is accounted here too: every VkDeviceMemory forge allocates is
 * counted against its owner, so in-use and peak bytes are exact.
 * ===================================================================================== */

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

/* =======================================================================================
 * 2. Files
 * Checkpoints are mapped read-only, never copied (discovery reads only their headers, into the
 * same parsers: forge__file_read_head). Every offset, size and shape read from a
 * file is checked against the file's size before it is used: a hostile file gets an error
 * naming the file and field, never a crash. The result of this section is a tensor table
 * (name -> dtype, shape, bytes in the mapping) and a forge__config, whatever the format.
 * ===================================================================================== */

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

static void forge__file_unmap(forge__file *f) {
    if (f->heap) free((void *)f->data);
    else if (f->data) munmap((void *)f->data, (size_t)f->size);
    free(f->path);
    memset(f, 0, sizeof *f);
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
} forge__tensor_table;

static uint64_t forge__hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

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
    if (forge__tensor_find(t, src->name))
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: tensor '%s' appears twice", src->file, src->name);
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
 * -> "lm_head". Returns NULL for tensors of other towers (vision, audio, projector), which
 * forge skips. */
static const char *forge__hf_canonical_name(const char *name, char *buf, size_t size) {
    static const char *skip[] = {"vision_tower.", "vision_model.", "multi_modal_projector.",
                                 "model.vision_tower.", "model.multi_modal_projector.",
                                 "audio_tower.", "model.audio_tower.", "embed_vision.",
                                 "model.embed_vision.", "embed_audio.", "model.embed_audio."};
    for (size_t i = 0; i < FORGE__ARRAY_LEN(skip); i++)
        if (strncmp(name, skip[i], strlen(skip[i])) == 0) return NULL;
    if (strncmp(name, "language_model.", 15) == 0) {
        name += 15;
    } else if (strncmp(name, "model.language_model.", 21) == 0) {
        snprintf(buf, size, "model.%s", name + 21);
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
        if (strcmp(key, "__metadata__") == 0) {
            if (!cJSON_IsObject(it)) {
                st = forge__fail(err, FORGE_ERR_FORMAT, "%s: __metadata__ is not an object", path);
                break;
            }
            md = it;
            continue;
        }
        if (!cJSON_IsObject(it)) {
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: entry '%s' is not an object", path, key);
            break;
        }
        cJSON *jd = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        cJSON *js = cJSON_GetObjectItemCaseSensitive(it, "shape");
        cJSON *jo = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        if (!cJSON_IsString(jd) || !cJSON_IsArray(js) || !cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2) {
            st = forge__fail(err, FORGE_ERR_FORMAT,
                             "%s: tensor '%s' lacks a string dtype, a shape array or two data_offsets", path, key);
            break;
        }
        forge__tensor t;
        memset(&t, 0, sizeof t);
        t.file = fpath;
        t.dtype = forge__safetensors_dtype(jd->valuestring);
        if (t.dtype == FORGE__DTYPE_INVALID) {
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: tensor '%s' has unknown dtype '%s'", path, key,
                             jd->valuestring);
            break;
        }
        int nd = cJSON_GetArraySize(js);
        if (nd > FORGE__MAX_DIMS) {
            st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: tensor '%s' has %d dimensions (at most %d)", path,
                             key, nd, FORGE__MAX_DIMS);
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
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: tensor '%s' has an invalid or overflowing shape", path, key);
            break;
        }
        double b = cJSON_GetArrayItem(jo, 0)->valuedouble, e = cJSON_GetArrayItem(jo, 1)->valuedouble;
        if (!cJSON_IsNumber(cJSON_GetArrayItem(jo, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(jo, 1)) || b < 0 ||
            e < b || e > 1.8e19 || b != floor(b) || e != floor(e)) {
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: tensor '%s' has invalid data_offsets", path, key);
            break;
        }
        uint64_t begin = (uint64_t)b, end = (uint64_t)e, expect = 0;
        if (end > data_size) {
            st = forge__fail(err, FORGE_ERR_FORMAT,
                             "%s: tensor '%s' data_offsets [%llu, %llu] run past the end of the data (%llu bytes)",
                             path, key, (unsigned long long)begin, (unsigned long long)end,
                             (unsigned long long)data_size);
            break;
        }
        if (!forge__mul_ok(nel, forge__dtype_info(t.dtype).block_bytes, &expect) || expect != end - begin) {
            st = forge__fail(err, FORGE_ERR_FORMAT,
                             "%s: tensor '%s' holds %llu bytes but its shape and dtype %s need %llu", path, key,
                             (unsigned long long)(end - begin), jd->valuestring, (unsigned long long)expect);
            break;
        }
        t.data = f->avail == f->size ? data + begin : NULL;
        t.nbytes = end - begin;
        char nbuf[512];
        const char *canon = forge__hf_canonical_name(key, nbuf, sizeof nbuf);
        if (!canon) continue; /* another tower's weights */
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
        forge__fail(r->err, FORGE_ERR_FORMAT, "%s: truncated while reading %s", r->path, what);
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
        forge__fail(r->err, FORGE_ERR_FORMAT, "%s: %s of %llu bytes runs past the end of the file", r->path, what,
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
    if ((unsigned)type >= FORGE__GGUF_TYPE_COUNT) {
        forge__fail(r->err, FORGE_ERR_FORMAT, "%s: key '%s' has unknown value type %u", r->path, key, (unsigned)type);
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
            forge__fail(r->err, FORGE_ERR_FORMAT, "%s: key '%s' has an array of unsupported type %u", r->path, key, et);
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
            forge__fail(r->err, FORGE_ERR_FORMAT, "%s: key '%s' array length overflows", r->path, key);
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
    if (!forge__strset_insert(keys, kv->key))
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: metadata key '%s' appears twice", r->path, kv->key);
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
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: tensor '%.*s' has %u dimensions", f->path, (int)FORGE__MIN(ti->len, 200),
                             ti->name, ti->nd);
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
        forge__dtype_traits tr = ti->type < FORGE__GGUF_TYPE_END ? forge__dtype_info((forge__dtype)ti->type)
                                                                 : (forge__dtype_traits){NULL, 0, 0};
        if (!tr.name) {
            st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: tensor '%s' has unknown GGUF type %u", f->path, t.name, ti->type);
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
                             f->path, t.name, tr.name, (unsigned long long)ti->ne[0], tr.block);
            break;
        }
        uint64_t end;
        if (ti->off % g->alignment) {
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: tensor '%s' offset %llu is not a multiple of the alignment %u",
                             f->path, t.name, (unsigned long long)ti->off, g->alignment);
            break;
        }
        if (!forge__add_ok(ti->off, t.nbytes, &end) || end > data_size) {
            st = forge__fail(err, FORGE_ERR_FORMAT,
                             "%s: tensor '%s' (offset %llu, %llu bytes) runs past the end of the data (%llu bytes)",
                             f->path, t.name, (unsigned long long)ti->off, (unsigned long long)t.nbytes,
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

/* ---- Model configuration ----
 * One decoder covers every supported family; the config says which parts it uses. */

typedef enum forge__arch {
    FORGE__ARCH_LLAMA = 0,
    FORGE__ARCH_QWEN2,
    FORGE__ARCH_QWEN3,
    FORGE__ARCH_GEMMA2,
    FORGE__ARCH_GEMMA3,
    FORGE__ARCH_QWEN3MOE,
    FORGE__ARCH_GEMMA4,
    FORGE__ARCH_COUNT
} forge__arch;

/* As GGUF's general.architecture names them (and forge_model_info reports them). */
static const char *const forge__arch_names[FORGE__ARCH_COUNT] = {"llama", "qwen2", "qwen3", "gemma2", "gemma3", "qwen3moe", "gemma4"};

typedef enum forge__rope_scaling {
    FORGE__ROPE_NONE = 0,
    FORGE__ROPE_LINEAR,   /* positions divided by factor */
    FORGE__ROPE_LLAMA3,   /* Llama 3.1 frequency-dependent scaling */
    FORGE__ROPE_PROPORTIONAL, /* Gemma 4: the first partial * head_dim / 2 pairs rotate at 1 / theta^(2i / head_dim), the rest not at all */
} forge__rope_scaling;

typedef struct forge__rope {
    double theta;                 /* base */
    forge__rope_scaling scaling;
    double factor, low_freq_factor, high_freq_factor;
    int original_max_pos;
    double partial;               /* PROPORTIONAL: partial_rotary_factor */
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
} forge__config;

/* Layer l's attention shape. A KV-shared layer (kv_source != l) projects only queries. */
static uint32_t forge__hd(const forge__config *c, int l) { return c->layer_head_dim[l]; }
static uint32_t forge__nkv(const forge__config *c, int l) { return c->layer_kv_heads[l]; }
static bool forge__kv_shared(const forge__config *c, int l) { return c->kv_source[l] != l; }
static uint32_t forge__q_dim(const forge__config *c, int l) { return (uint32_t)c->n_heads * forge__hd(c, l); }
static uint32_t forge__kv_dim(const forge__config *c, int l) { return forge__nkv(c, l) * forge__hd(c, l); }
/* The fused q|k|v row of layer l (q only on a KV-shared layer). */
static uint32_t forge__qkv_dim(const forge__config *c, int l) {
    return forge__q_dim(c, l) + (forge__kv_shared(c, l) ? 0 : 2 * forge__kv_dim(c, l));
}
/* Whether every layer caches its own keys and values in rows of one shape (every family but
 * Gemma 4): what the context shift, state files and key inspection read and write. */
static bool forge__uniform_kv(const forge__config *c) {
    for (int l = 0; l < c->n_layers; l++)
        if (forge__kv_shared(c, l) || forge__hd(c, l) != (uint32_t)c->head_dim || forge__nkv(c, l) != (uint32_t)c->n_kv_heads) return false;
    return true;
}
/* ... and the same MLP, no experts, no Gemma 4 extras (what training and adapters assume). */
static bool forge__uniform_layers(const forge__config *c) {
    if (c->n_experts || c->ple_dim || c->v_norm || !forge__uniform_kv(c)) return false;
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_ffn[l] != c->ffn || c->layer_k_eq_v[l]) return false;
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
    if (!strcmp(mt, "gemma3") || !strcmp(mt, "gemma4")) { /* multimodal wrapper: the text model's config is nested */
        o = cJSON_GetObjectItemCaseSensitive(root, "text_config");
        if (!cJSON_IsObject(o)) {
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: model_type '%s' needs a 'text_config' object", path, mt);
            goto done;
        }
        c->arch = !strcmp(mt, "gemma3") ? FORGE__ARCH_GEMMA3 : FORGE__ARCH_GEMMA4;
        c->multimodal = true;
    } else if (!strcmp(mt, "llama")) c->arch = FORGE__ARCH_LLAMA;
    else if (!strcmp(mt, "qwen2")) c->arch = FORGE__ARCH_QWEN2;
    else if (!strcmp(mt, "qwen3")) c->arch = FORGE__ARCH_QWEN3;
    else if (!strcmp(mt, "qwen3_moe")) c->arch = FORGE__ARCH_QWEN3MOE;
    else if (!strcmp(mt, "gemma2")) c->arch = FORGE__ARCH_GEMMA2;
    else if (!strcmp(mt, "gemma3_text")) c->arch = FORGE__ARCH_GEMMA3;
    else if (!strcmp(mt, "gemma4_text")) c->arch = FORGE__ARCH_GEMMA4;
    else {
        st = forge__fail(err, FORGE_ERR_UNSUPPORTED,
                         "%s: model_type '%s' is not supported (llama, qwen2, qwen3, qwen3_moe, gemma2, gemma3, gemma3_text, gemma4, "
                         "gemma4_text)", path, mt);
        goto done;
    }
    bool gemma = c->arch == FORGE__ARCH_GEMMA2 || c->arch == FORGE__ARCH_GEMMA3 || c->arch == FORGE__ARCH_GEMMA4;
    c->hidden = forge__json_int(o, "hidden_size", 0);
    c->n_layers = forge__json_int(o, "num_hidden_layers", 0);
    c->n_heads = forge__json_int(o, "num_attention_heads", 0);
    c->n_kv_heads = forge__json_int(o, "num_key_value_heads", c->n_heads);
    c->ffn = forge__json_int(o, "intermediate_size", 0);
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
    c->qkv_bias = c->arch == FORGE__ARCH_QWEN2 || forge__json_bool(o, "attention_bias", false);
    c->o_bias = c->arch == FORGE__ARCH_LLAMA && forge__json_bool(o, "attention_bias", false);
    c->qk_norm = c->arch == FORGE__ARCH_QWEN3 || c->arch == FORGE__ARCH_QWEN3MOE || c->arch == FORGE__ARCH_GEMMA3 ||
                 c->arch == FORGE__ARCH_GEMMA4;
    c->norm_plus_one = gemma && c->arch != FORGE__ARCH_GEMMA4; /* Gemma 4's RMSNorm multiplies by w itself */
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
                           "gemma2, gemma3, gemma4)", path, arch);
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
    FORGE__GGUF_INT(ffn, "feed_forward_length", a != FORGE__ARCH_GEMMA4) /* gemma4: maybe one a layer (below) */
    FORGE__GGUF_INT(n_ctx_train, "context_length", false)
    c->n_kv_heads = c->n_heads;
    if (a != FORGE__ARCH_GEMMA4) { FORGE__GGUF_INT(n_kv_heads, "attention.head_count_kv", false) }
    c->head_dim = c->hidden / c->n_heads;
    FORGE__GGUF_INT(head_dim, "attention.key_length", false)
    FORGE__GGUF_INT(n_vocab, "vocab_size", false)
    if (c->arch == FORGE__ARCH_QWEN3MOE) {
        /* llama.cpp's qwen3moe graph: softmax over all experts, the top expert_used_count
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

/* =======================================================================================
 * 3. Tokenizer
 * What tokenizer.json declares, run the way HuggingFace tokenizers runs it, so ids match:
 *   added tokens (matched on the raw text, then on the normalized text) -> normalizer ->
 *   pre-tokenizer -> model (BPE by merge rank, or SentencePiece-style by score) ->
 *   post-processor (template ids, only when asked) ; and back: ids -> pieces -> decoder.
 * A GGUF vocabulary (tokenizer.ggml.*) is turned into the same pipeline, with the steps that
 * llama.cpp's converters stand for (tokenizer.ggml.pre names a split regex list).
 * Components are flattened at load into arrays of steps (Sequence = the steps in order). A
 * component forge does not implement is a load error that names it, never wrong ids.
 * Tables live in the model arena; each encode call works in its own scratch buffers, so a
 * loaded tokenizer is read-only and shared by threads.
 * Text comes in as bytes: invalid UTF-8 is replaced before anything else, one U+FFFD per
 * maximal invalid subpart (what Rust's String::from_utf8_lossy does, so HF sees the same).
 * ===================================================================================== */

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#define FORGE__TK_MAX_STEPS 16      /* flattened normalizer / pre-tokenizer / decoder steps */
#define FORGE__TK_MAX_REGEX 32      /* compiled patterns per tokenizer */
#define FORGE__TK_MAX_TEMPLATE 8    /* ids a template adds before or after the text */

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

/* ---- UTF-8 ---- */

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when s[0..n) does not start with one
 * (overlongs, surrogates and values past U+10FFFF are invalid, as in Rust). *cp gets it. */
static int forge__utf8_dec(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    if (c < 0xC2 || c > 0xF4) return 0;
    int len = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (n < (size_t)len) return 0;
    unsigned c1 = s[1];
    if (c == 0xE0 && (c1 < 0xA0 || c1 > 0xBF)) return 0;
    if (c == 0xED && (c1 < 0x80 || c1 > 0x9F)) return 0;
    if (c == 0xF0 && (c1 < 0x90 || c1 > 0xBF)) return 0;
    if (c == 0xF4 && (c1 < 0x80 || c1 > 0x8F)) return 0;
    uint32_t v = c & (0xFF >> (len + 1));
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
}

/* How many bytes of s[0..n) an invalid sequence covers: the maximal prefix of a valid
 * sequence (at least 1), which from_utf8_lossy replaces by one U+FFFD. */
static size_t forge__utf8_bad_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0xC2 || c > 0xF4) return 1;
    int len = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    size_t i = 1;
    for (; i < (size_t)len && i < n; i++) {
        unsigned lo = 0x80, hi = 0xBF;
        if (i == 1) {
            if (c == 0xE0) lo = 0xA0;
            else if (c == 0xED) hi = 0x9F;
            else if (c == 0xF0) lo = 0x90;
            else if (c == 0xF4) hi = 0x8F;
        }
        if (s[i] < lo || s[i] > hi) break;
    }
    return i;
}

/* True when s[0..n) ends in the beginning of a valid sequence that more bytes could finish. */
static bool forge__utf8_incomplete_tail(const unsigned char *s, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned c = s[n - back];
        if ((c & 0xC0) == 0x80) continue;
        if (c < 0xC2 || c > 0xF4) return false;
        int len = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        return (size_t)len > back && forge__utf8_bad_len(s + n - back, back) == back;
    }
    return false;
}

static void forge__utf8_put(forge__buf *b, uint32_t cp) {
    char t[4];
    int n = 0;
    if (cp < 0x80) t[n++] = (char)cp;
    else if (cp < 0x800) { t[n++] = (char)(0xC0 | (cp >> 6)); t[n++] = (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) { t[n++] = (char)(0xE0 | (cp >> 12)); t[n++] = (char)(0x80 | ((cp >> 6) & 0x3F)); t[n++] = (char)(0x80 | (cp & 0x3F)); }
    else { t[n++] = (char)(0xF0 | (cp >> 18)); t[n++] = (char)(0x80 | ((cp >> 12) & 0x3F)); t[n++] = (char)(0x80 | ((cp >> 6) & 0x3F)); t[n++] = (char)(0x80 | (cp & 0x3F)); }
    forge__buf_put(b, t, (size_t)n);
}

/* Appends s[0..n) with every invalid sequence replaced by U+FFFD (from_utf8_lossy). */
static void forge__utf8_lossy(forge__buf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    while (i < n) {
        uint32_t cp;
        int l = forge__utf8_dec(u + i, n - i, &cp);
        if (l) { i += (size_t)l; continue; }
        forge__buf_put(b, s + run, i - run);
        forge__utf8_put(b, 0xFFFD);
        i += forge__utf8_bad_len(u + i, n - i);
        run = i;
    }
    forge__buf_put(b, s + run, n - run);
}

static bool forge__utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) { i++; continue; }
        uint32_t cp;
        int l = forge__utf8_dec(u + i, n - i, &cp);
        if (!l) return false;
        i += (size_t)l;
    }
    return true;
}

static int forge__utf8_len1(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

/* Rust's char::is_whitespace (the Unicode White_Space property). */
static bool forge__is_ws(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
/* A word character for added tokens' single_word: HF tests `\w` with Rust's regex crate,
 * which is Alphabetic, marks, Nd, Pc and the joiners. Alphabetic's Other_Alphabetic part
 * outside the marks (circled and squared letters) is listed; utf8proc has no property for it. */
static bool forge__is_word(uint32_t c) {
    if (c == '_' || c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F189)) return true;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || (k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME) ||
           k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC;
}
static bool forge__is_numeric(uint32_t c) {
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}
/* HF's Punctuation pre-tokenizer: ASCII punctuation or a Unicode P* category. */
static bool forge__is_punct(uint32_t c) {
    if (c < 128) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

/* ---- Hash tables ---- */

static uint64_t forge__hash(const void *p, size_t n) {
    const unsigned char *s = (const unsigned char *)p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ (w * 0xC2B2AE3D27D4EB4Full)) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ (w * 0xC2B2AE3D27D4EB4Full)) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 32;
    return h * 0xD6E8FEB86659FD93ull ^ (h >> 28);
}

/* text -> id, open addressing. A slot holds the key's pointer and length with the id, so a
 * lookup touches the slot and, when the length and 8 hash bits agree, the text: the big
 * vocabularies are looked up a million times while loading. */
typedef struct forge__strslot {
    const char *s;
    uint32_t len;
    uint32_t id_tag;   /* id + 1 in the low 24 bits, 8 hash bits above; 0 = empty */
} forge__strslot;

typedef struct forge__strtab {
    forge__strslot *slot;
    uint32_t mask;
} forge__strtab;

#define FORGE__TK_MAX_IDS (1 << 24) /* ids fit the slots' 24 bits */

static bool forge__strtab_init(forge__strtab *t, size_t n, forge__arena *a) {
    size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    t->slot = (forge__strslot *)forge__arena_alloc(a, cap * sizeof(forge__strslot), 64);
    t->mask = (uint32_t)(cap - 1);
    return t->slot != NULL;
}

/* The id stored for s[0..n) (whose forge__hash is h), or -1. */
static int32_t forge__strtab_get_h(const forge__strtab *t, const char *s, size_t n, uint64_t h) {
    if (!t->slot) return -1;
    uint32_t tag = (uint32_t)(h >> 56) << 24, i = (uint32_t)h & t->mask;
    for (;;) {
        const forge__strslot *e = &t->slot[i];
        if (!e->id_tag) return -1;
        if ((e->id_tag & 0xFF000000u) == tag && e->len == n && memcmp(e->s, s, n) == 0) return (int32_t)(e->id_tag & 0xFFFFFFu) - 1;
        i = (i + 1) & t->mask;
    }
}

static int32_t forge__strtab_get(const forge__strtab *t, const char *s, size_t n) {
    return forge__strtab_get_h(t, s, n, forge__hash(s, n));
}

/* Brings the slot of hash h (and, when it holds a key of length n, that key's text) into
 * the cache ahead of a lookup: loading registers a million merges, and their lookups are
 * cache misses that batches of prefetches overlap. */
static void forge__strtab_prefetch(const forge__strtab *t, uint64_t h, size_t n, int stage) {
    const forge__strslot *e = &t->slot[(uint32_t)h & t->mask];
    if (stage == 0) __builtin_prefetch(e);
    else if (e->id_tag && e->len == n) __builtin_prefetch(e->s);
}

/* Inserts s -> id (s must outlive the table); an existing equal key keeps its id unless
 * `replace` (HF: a later vocab entry with the same text wins). True when the key is new. */
static bool forge__strtab_put(forge__strtab *t, const char *s, size_t n, int32_t id, bool replace) {
    uint64_t h = forge__hash(s, n);
    uint32_t tag = (uint32_t)(h >> 56) << 24, i = (uint32_t)h & t->mask;
    for (;;) {
        forge__strslot *e = &t->slot[i];
        if (!e->id_tag) {
            *e = (forge__strslot){s, (uint32_t)n, tag | (uint32_t)(id + 1)};
            return true;
        }
        if ((e->id_tag & 0xFF000000u) == tag && e->len == n && memcmp(e->s, s, n) == 0) {
            if (replace) *e = (forge__strslot){s, (uint32_t)n, tag | (uint32_t)(id + 1)};
            return false;
        }
        i = (i + 1) & t->mask;
    }
}

/* (left id, right id) -> (rank, merged id): the BPE merges. */
typedef struct forge__merge {
    uint64_t key;      /* left << 32 | right; UINT64_MAX = empty */
    uint32_t rank;
    int32_t id;
} forge__merge;

typedef struct forge__mergetab {
    forge__merge *slot;
    uint32_t mask;
    uint32_t count;
} forge__mergetab;

static inline uint32_t forge__mix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDull;
    k ^= k >> 33;
    return (uint32_t)k;
}

static const forge__merge *forge__merge_get(const forge__mergetab *t, int32_t a, int32_t b) {
    if (!t->slot) return NULL;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = forge__mix64(key) & t->mask;
    for (;;) {
        const forge__merge *m = &t->slot[i];
        if (m->key == key) return m;
        if (m->key == UINT64_MAX) return NULL;
        i = (i + 1) & t->mask;
    }
}

static void forge__merge_put(forge__mergetab *t, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = forge__mix64(key) & t->mask;
    for (;;) {
        forge__merge *m = &t->slot[i];
        if (m->key == UINT64_MAX) { t->count++; break; }
        if (m->key == key) break; /* a repeated pair: the later line wins, as in HF's map */
        i = (i + 1) & t->mask;
    }
    t->slot[i] = (forge__merge){key, rank, id};
}

static bool forge__mergetab_init(forge__mergetab *t, size_t n, forge__arena *a) {
    size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    t->slot = (forge__merge *)forge__arena_alloc(a, cap * sizeof(forge__merge), 64);
    if (!t->slot) return false;
    memset(t->slot, 0xFF, cap * sizeof(forge__merge));
    t->mask = (uint32_t)(cap - 1);
    t->count = 0;
    return true;
}

/* ---- The tokenizer ---- */

typedef enum forge__tk_model { FORGE__TKM_NONE = 0, FORGE__TKM_BPE, FORGE__TKM_SPM } forge__tk_model;

/* A string or regex pattern (Split, Replace). */
typedef struct forge__pat {
    const char *str;           /* literal, when re is NULL */
    size_t len;
    pcre2_code *re;
} forge__pat;

typedef enum forge__norm_kind {
    FORGE__N_NFC, FORGE__N_NFD, FORGE__N_NFKC, FORGE__N_NFKD, FORGE__N_LOWER, FORGE__N_REPLACE, FORGE__N_PREPEND,
    FORGE__N_STRIP, FORGE__N_STRIP_ACCENTS
} forge__norm_kind;

typedef struct forge__norm_step {
    forge__norm_kind kind;
    forge__pat pat;            /* Replace */
    const char *s;             /* Replace content, Prepend text */
    size_t len;
    bool left, right;          /* Strip */
} forge__norm_step;

/* How a split keeps what its pattern matched (HF SplitDelimiterBehavior). */
typedef enum forge__split_beh {
    FORGE__SB_REMOVED, FORGE__SB_ISOLATED, FORGE__SB_MERGED_PREV, FORGE__SB_MERGED_NEXT, FORGE__SB_CONTIGUOUS
} forge__split_beh;

typedef enum forge__pre_kind {
    FORGE__P_SPLIT, FORGE__P_BYTELEVEL, FORGE__P_METASPACE, FORGE__P_DIGITS, FORGE__P_PUNCT, FORGE__P_WHITESPACE,
    FORGE__P_WSSPLIT
} forge__pre_kind;

typedef struct forge__pre_step {
    forge__pre_kind kind;
    forge__pat pat;            /* Split; Whitespace and ByteLevel use their regex here */
    forge__split_beh beh;
    bool invert;
    bool add_prefix_space;     /* ByteLevel */
    bool use_regex;            /* ByteLevel */
    bool individual;           /* Digits */
    uint32_t repl;             /* Metaspace replacement character */
    int prepend;               /* Metaspace: 0 never, 1 first, 2 always */
    bool split;                /* Metaspace */
} forge__pre_step;

typedef enum forge__dec_kind {
    FORGE__D_BYTELEVEL, FORGE__D_METASPACE, FORGE__D_REPLACE, FORGE__D_BYTEFALLBACK, FORGE__D_FUSE, FORGE__D_STRIP
} forge__dec_kind;

typedef struct forge__dec_step {
    forge__dec_kind kind;
    forge__pat pat;            /* Replace */
    const char *s;             /* Replace content */
    size_t len;
    uint32_t ch;               /* Metaspace replacement, Strip content */
    int prepend;               /* Metaspace */
    int start, stop;           /* Strip */
} forge__dec_step;

/* An added token: matched in the text before the model runs (HF AddedVocabulary). */
typedef struct forge__added {
    const char *s;
    uint32_t len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} forge__added;

/* Byte trie over added-token texts, for leftmost-longest matching. Children live in one
 * hash table keyed (node << 8 | byte). */
typedef struct forge__trie {
    uint64_t *keys;            /* node << 8 | byte, + 1; 0 empty */
    uint32_t *child;
    uint32_t mask;
    int32_t *term;             /* per node: index into added[] of the token ending there, or -1 */
    uint32_t n_nodes;
    bool first[256];           /* bytes that start some token */
} forge__trie;

typedef struct forge__tokenizer {
    int n_vocab;                 /* ids are 0..n_vocab-1 (model vocabulary and added tokens) */
    const char **pieces;         /* [n_vocab] NUL-terminated text of each id (HF id_to_token: an
                                  * added token's text first); NULL for holes */
    uint32_t *piece_len;         /* [n_vocab] */
    float *scores;               /* [n_vocab] SentencePiece scores (GGUF llama), else NULL */
    uint8_t *is_special;         /* [n_vocab] 1 for special added tokens (skip_special, PARSE_SPECIAL) */
    forge__tk_model model;
    forge__strtab vocab;         /* the model's vocabulary: piece -> id */
    forge__strtab addtab;        /* added tokens' text -> id (looked up before the vocabulary, as HF) */
    forge__mergetab merges;
    bool byte_fallback, ignore_merges, fuse_unk;
    int32_t model_unk;           /* the model's unk_token id, -1 when it has none */
    const char *cont_prefix, *eow_suffix;
    size_t cont_prefix_len, eow_suffix_len;
    int32_t byte_id[256];        /* <0xXX> tokens for byte fallback, -1 when absent */
    forge__added *added;
    int n_added;
    forge__trie trie_raw, trie_norm;   /* added tokens with normalized = false / true */
    forge__norm_step norm[FORGE__TK_MAX_STEPS];
    int n_norm;
    forge__pre_step pre[FORGE__TK_MAX_STEPS];
    int n_pre;
    forge__dec_step dec[FORGE__TK_MAX_STEPS];
    int n_dec;
    bool has_decoder;            /* without one, HF joins pieces with " " */
    int32_t tmpl_pre[FORGE__TK_MAX_TEMPLATE], tmpl_post[FORGE__TK_MAX_TEMPLATE];
    int n_tmpl_pre, n_tmpl_post; /* ids the post-processor adds around the text */
    pcre2_code *regex[FORGE__TK_MAX_REGEX];
    int n_regex;
    int32_t bos, eos, eot, pad, unk, sot;
    int32_t eos_ids[8];
    int n_eos;
} forge__tokenizer;

static void forge__tokenizer_free(forge__tokenizer *tk) {
    for (int i = 0; i < tk->n_regex; i++) pcre2_code_free(tk->regex[i]);
    tk->n_regex = 0;
}

static void forge__tokenizer_reset(forge__tokenizer *tk) {
    memset(tk, 0, sizeof *tk);
    tk->bos = tk->eos = tk->eot = tk->pad = tk->unk = tk->sot = tk->model_unk = -1;
    for (int i = 0; i < 256; i++) tk->byte_id[i] = -1;
}

/* ---- Regexes: HF's patterns are Oniguruma's; PCRE2 (UTF, UCP, JIT) runs them. The class
 * escapes whose meaning differs are rewritten to explicit Unicode sets: Oniguruma's \s is
 * White_Space (PCRE2's lacks U+0085), \w is UTS #18's word class (Alphabetic, marks, Nd,
 * Pc, joiners; Other_Alphabetic letters listed), and \h is a hex digit. ---- */

#define FORGE__RE_WS "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
#define FORGE__RE_WORD "\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{200c}\\x{200d}\\x{24b6}-\\x{24e9}\\x{1f130}-\\x{1f189}"

static bool forge__regex_translate(const char *src, size_t n, forge__buf *out) {
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = src[i];
        if (c == '\\' && i + 1 < n) {
            char e = src[i + 1];
            const char *set = e == 's' || e == 'S' ? FORGE__RE_WS : e == 'w' || e == 'W' ? FORGE__RE_WORD
                            : e == 'h' || e == 'H' ? "0-9a-fA-F" : NULL;
            bool neg = e == 'S' || e == 'W' || e == 'H';
            if (set && in_class && !neg) {
                forge__buf_put(out, set, strlen(set));
            } else if (set && !in_class) {
                forge__buf_put(out, neg ? "[^" : "[", neg ? 2 : 1);
                forge__buf_put(out, set, strlen(set));
                forge__buf_put(out, "]", 1);
            } else {
                forge__buf_put(out, src + i, 2); /* includes a negated class escape inside [] */
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            forge__buf_put(out, src + i, 1);
            if (i + 1 < n && src[i + 1] == '^') forge__buf_put(out, src + ++i, 1);
            if (i + 1 < n && src[i + 1] == ']') forge__buf_put(out, src + ++i, 1); /* literal ] first */
            continue;
        }
        if (in_class && c == ']') in_class = false;
        forge__buf_put(out, src + i, 1);
    }
    return !out->oom;
}

static forge_status forge__tk_regex(forge__tokenizer *tk, const char *pat, size_t n, pcre2_code **out, const char *path,
                                    const char *what, forge__err *err) {
    if (tk->n_regex >= FORGE__TK_MAX_REGEX)
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: %s: more than %d regexes", path, what, FORGE__TK_MAX_REGEX);
    forge__buf b;
    forge__buf_init(&b, NULL, 0);
    if (!forge__regex_translate(pat, n, &b)) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(b.p ? b.p : ""), b.n, PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
    forge__buf_free(&b);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: %s: regex '%.*s' does not compile: %s", path, what,
                           (int)FORGE__MIN(n, 200), pat, (const char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT (unsupported CPU) the interpreter runs it */
    tk->regex[tk->n_regex++] = re;
    *out = re;
    return FORGE_OK;
}

/* ---- A focused JSON reader for tokenizer.json: the vocabulary and merges are hundreds of
 * thousands of entries (gemma3's file is 33 MB), read straight from the mapping; the small
 * components go through cJSON. ---- */

typedef struct forge__js {
    const char *p, *end;
    bool bad;
} forge__js;

static void forge__js_ws(forge__js *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t')) j->p++;
}
static bool forge__js_eat(forge__js *j, char c) {
    forge__js_ws(j);
    if (j->p < j->end && *j->p == c) { j->p++; return true; }
    return false;
}

static int forge__hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Decodes the JSON string at j->p (after whitespace) into out (appended, not terminated).
 * Text that is not valid UTF-8 fails it (JSON is UTF-8; HF refuses such a file too). */
static bool forge__js_str(forge__js *j, forge__buf *out) {
    forge__js_ws(j);
    if (j->p >= j->end || *j->p != '"') return !(j->bad = true);
    j->p++;
    const char *run = j->p;
    size_t start = out->n;
    bool high = false;
    while (j->p < j->end) {
        char c = *j->p;
        if (c == '"') {
            forge__buf_put(out, run, (size_t)(j->p - run));
            j->p++;
            if (out->oom) return false;
            if (high && !forge__utf8_valid(out->p + start, out->n - start)) return !(j->bad = true);
            return true;
        }
        if ((unsigned char)c >= 0x80) high = true;
        if ((unsigned char)c < 0x20) break;
        if (c != '\\') { j->p++; continue; }
        forge__buf_put(out, run, (size_t)(j->p - run));
        if (j->end - j->p < 2) break;
        char e = j->p[1];
        j->p += 2;
        char lit = e == '"' ? '"' : e == '\\' ? '\\' : e == '/' ? '/' : e == 'b' ? '\b' : e == 'f' ? '\f'
                 : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : 0;
        if (lit) {
            forge__buf_put(out, &lit, 1);
        } else if (e == 'u') {
            uint32_t cp = 0;
            if (j->end - j->p < 4) break;
            for (int k = 0; k < 4; k++) {
                int h = forge__hexval(j->p[k]);
                if (h < 0) return !(j->bad = true);
                cp = cp * 16 + (uint32_t)h;
            }
            j->p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF && j->end - j->p >= 6 && j->p[0] == '\\' && j->p[1] == 'u') {
                uint32_t lo = 0;
                bool ok = true;
                for (int k = 0; k < 4; k++) {
                    int h = forge__hexval(j->p[2 + k]);
                    if (h < 0) ok = false;
                    lo = lo * 16 + (uint32_t)(h < 0 ? 0 : h);
                }
                if (ok && lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    j->p += 6;
                }
            }
            if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD; /* a lone surrogate: serde_json refuses it, we replace */
            forge__utf8_put(out, cp);
        } else {
            break;
        }
        run = j->p;
    }
    j->bad = true;
    return false;
}

/* Skips one value of any type; bounded nesting, no recursion. With `count`, adds the number
 * of elements of the (array) value to it. */
static bool forge__js_skip_n(forge__js *j, size_t *count) {
    int depth = 0;
    bool any = false;
    forge__js_ws(j);
    do {
        forge__js_ws(j);
        if (j->p >= j->end) return !(j->bad = true);
        char c = *j->p;
        if (c == '"') { /* to the next quote not escaped by an odd run of backslashes */
            const char *from = ++j->p;
            for (;;) {
                const char *q = (const char *)memchr(from, '"', (size_t)(j->end - from));
                if (!q) return !(j->bad = true);
                const char *b = q;
                while (b > j->p && b[-1] == '\\') b--;
                from = q + 1;
                if (((q - b) & 1) == 0) break;
            }
            j->p = from;
        } else if (c == '{' || c == '[') {
            if (++depth > 512) return !(j->bad = true);
            j->p++;
            continue;
        } else if (c == '}' || c == ']') {
            if (depth == 0) return !(j->bad = true);
            depth--;
            j->p++;
        } else if (c == ',' || c == ':') {
            if (count && depth == 1 && c == ',') (*count)++;
            j->p++;
            continue;
        } else {
            const char *s = j->p;
            while (j->p < j->end) {
                char d = *j->p;
                if (d == ',' || d == ':' || d == ']' || d == '}' || d == ' ' || d == '\t' || d == '\r' || d == '\n') break;
                j->p++;
            }
            if (j->p == s) return !(j->bad = true);
        }
        if (depth == 1) any = true;
    } while (depth > 0);
    if (count && any) (*count)++;
    return true;
}
static bool forge__js_skip(forge__js *j) { return forge__js_skip_n(j, NULL); }

static bool forge__js_int(forge__js *j, int64_t *v) {
    forge__js_ws(j);
    const char *s = j->p;
    bool neg = false;
    if (s < j->end && *s == '-') { neg = true; s++; }
    int64_t x = 0;
    const char *d = s;
    while (s < j->end && *s >= '0' && *s <= '9' && x < ((int64_t)1 << 40)) x = x * 10 + (*s++ - '0');
    if (s == d || (s < j->end && (*s == '.' || *s == 'e' || *s == 'E' || (*s >= '0' && *s <= '9')))) return !(j->bad = true);
    j->p = s;
    *v = neg ? -x : x;
    return true;
}

/* ---- Added-token trie ---- */

static bool forge__trie_build(forge__trie *t, const forge__added *added, int n_added, bool normalized, forge__arena *a) {
    size_t bytes = 1;
    for (int i = 0; i < n_added; i++)
        if (added[i].normalized == normalized) bytes += added[i].len;
    memset(t, 0, sizeof *t);
    if (bytes == 1) return true;
    size_t cap = 16;
    while (cap < bytes * 2) cap *= 2;
    t->keys = (uint64_t *)forge__arena_alloc(a, cap * sizeof(uint64_t), 64);
    t->child = (uint32_t *)forge__arena_alloc(a, cap * sizeof(uint32_t), 64);
    t->term = (int32_t *)forge__arena_alloc(a, bytes * sizeof(int32_t), 64);
    if (!t->keys || !t->child || !t->term) return false;
    t->mask = (uint32_t)(cap - 1);
    t->n_nodes = 1;
    t->term[0] = -1;
    for (int i = 0; i < n_added; i++) {
        if (added[i].normalized != normalized || added[i].len == 0) continue;
        uint32_t node = 0;
        for (uint32_t k = 0; k < added[i].len; k++) {
            unsigned char c = (unsigned char)added[i].s[k];
            uint64_t key = (((uint64_t)node << 8) | c) + 1;
            uint32_t h = forge__mix64(key) & t->mask;
            while (t->keys[h] && t->keys[h] != key) h = (h + 1) & t->mask;
            if (!t->keys[h]) {
                t->keys[h] = key;
                t->child[h] = t->n_nodes;
                t->term[t->n_nodes++] = -1;
            }
            node = t->child[h];
        }
        if (t->term[node] < 0) t->term[node] = i; /* the same text twice: the first one wins */
        t->first[(unsigned char)added[i].s[0]] = true;
    }
    return true;
}

static inline int64_t forge__trie_step(const forge__trie *t, uint32_t node, unsigned char c) {
    uint64_t key = (((uint64_t)node << 8) | c) + 1;
    uint32_t h = forge__mix64(key) & t->mask;
    while (t->keys[h]) {
        if (t->keys[h] == key) return t->child[h];
        h = (h + 1) & t->mask;
    }
    return -1;
}

/* The longest added token that starts at s[0]: its index, its length in *len; -1 if none. */
static int forge__trie_longest(const forge__trie *t, const char *s, size_t n, size_t *len) {
    if (!t->keys || !t->first[(unsigned char)s[0]]) return -1;
    int best = -1;
    uint32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t nx = forge__trie_step(t, node, (unsigned char)s[i]);
        if (nx < 0) break;
        node = (uint32_t)nx;
        if (t->term[node] >= 0) { best = t->term[node]; *len = i + 1; }
    }
    return best;
}

/* ---- Byte-level alphabet (GPT-2): every byte is shown as a printable character; the
 * printable ones stand for themselves, the other 68 become U+0100.. in byte order. ---- */

static uint32_t forge__bl_cp(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    if (b <= 32) return 256 + b;
    if (b <= 160) return 289 + (b - 127);
    return 323; /* 173 */
}
/* The byte a byte-level character stands for, or -1. */
static int forge__bl_byte(uint32_t cp) {
    if (cp < 256) return forge__bl_cp(cp) == cp ? (int)cp : -1;
    if (cp <= 288) return (int)(cp - 256);
    if (cp <= 322) return (int)(cp - 289 + 127);
    return cp == 323 ? 173 : -1;
}

/* ---- Encoding ---- */

typedef struct forge__span {
    uint32_t off, len;
    bool first;          /* starts at offset 0 of the original text (Metaspace prepend_scheme "first") */
} forge__span;

typedef struct forge__seg {
    uint32_t off, len;
    int32_t id;          /* an added token, or -1 for text */
} forge__seg;

typedef struct forge__mark {
    uint32_t s, e;
    bool m;              /* a match of the split pattern */
} forge__mark;

typedef struct forge__sym {
    int32_t id, prev, next;
    uint32_t off, len;   /* bytes of the word this symbol covers */
} forge__sym;

typedef struct forge__heapent {
    uint64_t key;        /* BPE: rank << 32 | pos; SPM: see forge__spm_key */
    int32_t a, b;        /* BPE: merged id; SPM: left, right symbol */
    uint32_t size;       /* SPM: byte length of the pair when it was queued */
} forge__heapent;

typedef struct forge__tkwork {
    const forge__tokenizer *tk;
    forge__buf ids;                /* int32_t output */
    forge__buf input;              /* lossy copy of invalid input */
    forge__buf norm, ntmp;         /* normalized segment, normalizer scratch */
    forge__buf text[2];            /* pre-tokenizer outputs (ping-pong) */
    forge__buf spans[2], marks, segs_raw, segs_norm, iv;
    forge__buf sym, heap, tmp;
    pcre2_match_data *md;
    bool parse_special;
} forge__tkwork;

static void forge__tkwork_init(forge__tkwork *w, const forge__tokenizer *tk) {
    memset(w, 0, sizeof *w);
    w->tk = tk;
}
/* Every scratch buffer of w (for freeing it and for the out-of-memory check); returns the count. */
static size_t forge__tkwork_bufs(forge__tkwork *w, forge__buf *bs[16]) {
    forge__buf *all[] = {&w->ids, &w->input, &w->norm, &w->ntmp, &w->text[0], &w->text[1], &w->spans[0], &w->spans[1], &w->marks,
                         &w->segs_raw, &w->segs_norm, &w->iv, &w->sym, &w->heap, &w->tmp};
    memcpy(bs, all, sizeof all);
    return FORGE__ARRAY_LEN(all);
}
static void forge__tkwork_free(forge__tkwork *w) {
    forge__buf *bs[16];
    for (size_t i = 0, n = forge__tkwork_bufs(w, bs); i < n; i++) forge__buf_free(bs[i]);
    if (w->md) pcre2_match_data_free(w->md);
    w->md = NULL;
}
static bool forge__tkwork_oom(forge__tkwork *w) {
    forge__buf *bs[16];
    for (size_t i = 0, n = forge__tkwork_bufs(w, bs); i < n; i++)
        if (bs[i]->oom) return true;
    return false;
}

/* Leftmost-longest added-token matches in s[0..n), as HF's AddedVocabulary finds them:
 * the scan resumes after every match, even one it then ignores (a special token when
 * special text is not parsed, a single_word token inside a word). */
static void forge__tk_split_added(forge__tkwork *w, const forge__trie *t, const char *s, size_t n, forge__buf *out) {
    const forge__tokenizer *tk = w->tk;
    out->n = 0;
    size_t start_offset = 0, pos = 0;
    while (t->keys && pos < n) {
        size_t mlen = 0;
        if (!t->first[(unsigned char)s[pos]]) { pos++; continue; }
        int k = forge__trie_longest(t, s + pos, n - pos, &mlen);
        if (k < 0) { pos++; continue; }
        const forge__added *ad = &tk->added[k];
        size_t start = pos, stop = pos + mlen;
        pos = stop;
        if (ad->special && !w->parse_special) continue;
        if (ad->single_word) {
            bool word_before = false, word_after = false;
            if (start > 0) {
                size_t b = start - 1;
                while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
                uint32_t cp;
                if (forge__utf8_dec((const unsigned char *)s + b, start - b, &cp)) word_before = forge__is_word(cp);
            }
            if (stop < n) {
                uint32_t cp;
                if (forge__utf8_dec((const unsigned char *)s + stop, n - stop, &cp)) word_after = forge__is_word(cp);
            }
            if (word_before || word_after) continue;
        }
        if (ad->lstrip) {
            size_t b = start;
            while (b > 0) {
                size_t c = b - 1;
                while (c > 0 && ((unsigned char)s[c] & 0xC0) == 0x80) c--;
                uint32_t cp;
                if (!forge__utf8_dec((const unsigned char *)s + c, b - c, &cp) || !forge__is_ws(cp)) break;
                b = c;
            }
            start = FORGE__MAX(b, start_offset);
        }
        if (ad->rstrip) {
            uint32_t cp;
            int l;
            while (stop < n && (l = forge__utf8_dec((const unsigned char *)s + stop, n - stop, &cp)) && forge__is_ws(cp)) stop += (size_t)l;
        }
        if (start_offset < start) FORGE__VEC_PUSH(out, forge__seg, ((forge__seg){(uint32_t)start_offset, (uint32_t)(start - start_offset), -1}));
        FORGE__VEC_PUSH(out, forge__seg, ((forge__seg){(uint32_t)start, (uint32_t)(stop - start), ad->id}));
        start_offset = stop;
    }
    if (start_offset < n) FORGE__VEC_PUSH(out, forge__seg, ((forge__seg){(uint32_t)start_offset, (uint32_t)(n - start_offset), -1}));
}

/* Appends the unicode normalization of s (form: UTF8PROC_* options) to out. ASCII runs are
 * their own normal form in all four forms, so only the rest goes through utf8proc: a run
 * that has non-ASCII characters starts at the ASCII character before it (a base that a
 * combining mark may compose with) and ends before the next ASCII character. */
static void forge__tk_unicode_norm(forge__buf *out, const char *s, size_t n, int options) {
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && (unsigned char)s[j] < 0x80) j++;
        if (j == n) { forge__buf_put(out, s + i, n - i); break; }
        size_t k = j > i ? j - 1 : j; /* keep the base character with the run */
        forge__buf_put(out, s + i, k - i);
        size_t e = j;
        while (e < n && (unsigned char)s[e] >= 0x80) e++;
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s + k, (utf8proc_ssize_t)(e - k), &dst, (utf8proc_option_t)options);
        if (r >= 0) forge__buf_put(out, dst, (size_t)r);
        else forge__buf_put(out, s + k, e - k); /* cannot happen on valid UTF-8 */
        free(dst);
        i = e;
    }
}

/* All matches of a pattern in s[0..n), as (start, end) pairs appended to iv (uint32 x2).
 * After an empty match the search moves on by one character. */
static void forge__pat_find(pcre2_match_data **md, const forge__pat *p, const char *s, size_t n, forge__buf *iv) {
    iv->n = 0;
    if (p->re) {
        if (!*md && !(*md = pcre2_match_data_create(1, NULL))) { iv->oom = true; return; }
        size_t start = 0;
        while (start <= n) {
            int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, *md, NULL);
            if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* the interpreter keeps its backtracking on the heap */
                rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, *md, NULL);
            if (rc < 0) break;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(*md);
            uint32_t pr[2] = {(uint32_t)ov[0], (uint32_t)ov[1]};
            forge__buf_put(iv, pr, sizeof pr);
            if (ov[1] > ov[0]) start = ov[1];
            else if (ov[1] < n) start = ov[1] + (size_t)forge__utf8_len1((unsigned char)s[ov[1]]);
            else break;
        }
    } else if (p->len) {
        size_t i = 0;
        while (i + p->len <= n) {
            const char *f = (const char *)memmem(s + i, n - i, p->str, p->len);
            if (!f) break;
            uint32_t pr[2] = {(uint32_t)(f - s), (uint32_t)(f - s + p->len)};
            forge__buf_put(iv, pr, sizeof pr);
            i = (size_t)(f - s) + p->len;
        }
    }
}

/* Appends s[0..n) to out with every match of p replaced by rep (Replace normalizer and
 * decoder); md and iv are the caller's scratch. */
static void forge__pat_replace(pcre2_match_data **md, forge__buf *iv, const forge__pat *p, const char *s, size_t n, const char *rep,
                               size_t rep_len, forge__buf *out) {
    forge__pat_find(md, p, s, n, iv);
    size_t prev = 0, m = iv->n / 8;
    for (size_t k = 0; k < m; k++) {
        const uint32_t *pr = (const uint32_t *)iv->p + 2 * k;
        forge__buf_put(out, s + prev, pr[0] - prev);
        forge__buf_put(out, rep, rep_len);
        prev = pr[1];
    }
    forge__buf_put(out, s + prev, n - prev);
}

static void forge__tk_lower(forge__buf *out, const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int l = forge__utf8_dec((const unsigned char *)s + i, n - i, &cp);
        if (!l) { l = 1; cp = 0xFFFD; }
        if (cp < 0x80) { char c = (char)(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp); forge__buf_put(out, &c, 1); }
        else if (cp == 0x130) forge__buf_put(out, "i\xcc\x87", 3); /* Rust: İ -> "i̇", the one two-character lowercase */
        else forge__utf8_put(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
        i += (size_t)l;
    }
}

/* Runs the normalizer steps on s[0..n); the result is w->norm. */
static void forge__tk_normalize(forge__tkwork *w, const char *s, size_t n) {
    const forge__tokenizer *tk = w->tk;
    forge__buf *cur = &w->norm, *nxt = &w->ntmp;
    cur->n = 0;
    forge__buf_put(cur, s, n);
    for (int i = 0; i < tk->n_norm; i++) {
        const forge__norm_step *st = &tk->norm[i];
        const char *c = cur->p ? cur->p : "";
        size_t cn = cur->n;
        nxt->n = 0;
        switch (st->kind) {
        case FORGE__N_NFC: forge__tk_unicode_norm(nxt, c, cn, UTF8PROC_STABLE | UTF8PROC_COMPOSE); break;
        case FORGE__N_NFD: forge__tk_unicode_norm(nxt, c, cn, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE); break;
        case FORGE__N_NFKC: forge__tk_unicode_norm(nxt, c, cn, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT); break;
        case FORGE__N_NFKD: forge__tk_unicode_norm(nxt, c, cn, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT); break;
        case FORGE__N_LOWER: forge__tk_lower(nxt, c, cn); break;
        case FORGE__N_PREPEND:
            if (cn) forge__buf_put(nxt, st->s, st->len);
            forge__buf_put(nxt, c, cn);
            break;
        case FORGE__N_STRIP: {
            size_t a = 0, b = cn;
            uint32_t cp;
            int l;
            while (st->left && a < b && (l = forge__utf8_dec((const unsigned char *)c + a, b - a, &cp)) && forge__is_ws(cp)) a += (size_t)l;
            while (st->right && b > a) {
                size_t p = b - 1;
                while (p > a && ((unsigned char)c[p] & 0xC0) == 0x80) p--;
                if (!forge__utf8_dec((const unsigned char *)c + p, b - p, &cp) || !forge__is_ws(cp)) break;
                b = p;
            }
            forge__buf_put(nxt, c + a, b - a);
            break;
        }
        case FORGE__N_STRIP_ACCENTS: {
            size_t k = 0;
            uint32_t cp;
            while (k < cn) {
                int l = forge__utf8_dec((const unsigned char *)c + k, cn - k, &cp);
                if (!l) l = 1;
                utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
                if (cat < UTF8PROC_CATEGORY_MN || cat > UTF8PROC_CATEGORY_ME) forge__buf_put(nxt, c + k, (size_t)l); /* HF drops every mark */
                k += (size_t)l;
            }
            break;
        }
        case FORGE__N_REPLACE: forge__pat_replace(&w->md, &w->iv, &st->pat, c, cn, st->s, st->len, nxt); break;
        }
        forge__buf *t = cur;
        cur = nxt;
        nxt = t;
    }
    if (cur != &w->norm) { /* keep the result in w->norm */
        forge__buf t = w->norm;
        w->norm = *cur;
        *cur = t;
    }
}

/* Match intervals of one pre-tokenizer step over s[0..n) into w->marks. */
static void forge__tk_marks(forge__tkwork *w, const forge__pre_step *st, const char *s, size_t n) {
    forge__buf *mk = &w->marks;
    mk->n = 0;
    if (st->kind == FORGE__P_SPLIT || st->kind == FORGE__P_WHITESPACE) {
        forge__pat_find(&w->md, &st->pat, s, n, &w->iv);
        size_t prev = 0, m = w->iv.n / 8;
        bool inv = st->kind == FORGE__P_WHITESPACE ? true : st->invert;
        for (size_t k = 0; k < m; k++) {
            uint32_t *pr = (uint32_t *)w->iv.p + 2 * k;
            if (prev != pr[0]) FORGE__VEC_PUSH(mk, forge__mark, ((forge__mark){(uint32_t)prev, pr[0], inv}));
            FORGE__VEC_PUSH(mk, forge__mark, ((forge__mark){pr[0], pr[1], !inv}));
            prev = pr[1];
        }
        if (prev != n) FORGE__VEC_PUSH(mk, forge__mark, ((forge__mark){(uint32_t)prev, (uint32_t)n, inv}));
        return;
    }
    /* a character predicate: every matching character is its own match */
    size_t last = 0, i = 0;
    while (i < n) {
        uint32_t cp;
        int l = forge__utf8_dec((const unsigned char *)s + i, n - i, &cp);
        if (!l) { l = 1; cp = 0xFFFD; }
        bool m = st->kind == FORGE__P_DIGITS ? forge__is_numeric(cp) : st->kind == FORGE__P_PUNCT ? forge__is_punct(cp)
               : st->kind == FORGE__P_WSSPLIT ? forge__is_ws(cp) : cp == st->repl;
        if (m) {
            if (last < i) FORGE__VEC_PUSH(mk, forge__mark, ((forge__mark){(uint32_t)last, (uint32_t)i, false}));
            FORGE__VEC_PUSH(mk, forge__mark, ((forge__mark){(uint32_t)i, (uint32_t)(i + (size_t)l), true}));
            last = i + (size_t)l;
        }
        i += (size_t)l;
    }
    if (last < n) FORGE__VEC_PUSH(mk, forge__mark, ((forge__mark){(uint32_t)last, (uint32_t)n, false}));
}

/* Applies a split behavior to w->marks and appends the non-empty pieces of span `sp` to out. */
static void forge__tk_apply_split(forge__tkwork *w, forge__split_beh beh, forge__span sp, forge__buf *out) {
    size_t m = FORGE__VEC_LEN(&w->marks, forge__mark);
    forge__mark *mk = (forge__mark *)w->marks.p;
    /* fold into pieces in place: pieces never outnumber marks */
    size_t np = 0;
    bool prev_match = false;
    if (beh == FORGE__SB_MERGED_NEXT) {
        for (size_t k = m; k-- > 0;) { /* right to left, as HF folds the reversed list */
            forge__mark x = mk[k];
            if (x.m && !prev_match && np > 0) mk[m - np].s = x.s; /* merge into the piece after */
            else { mk[m - 1 - np] = (forge__mark){x.s, x.e, false}; np++; }
            prev_match = x.m;
        }
        mk += m - np;
    } else {
        for (size_t k = 0; k < m; k++) {
            forge__mark x = mk[k];
            bool merge = beh == FORGE__SB_MERGED_PREV ? (x.m && !prev_match && np > 0)
                       : beh == FORGE__SB_CONTIGUOUS ? (x.m == prev_match && np > 0) : false;
            if (beh == FORGE__SB_REMOVED) {
                if (!x.m) mk[np++] = x;
            } else if (merge) {
                mk[np - 1].e = x.e;
            } else {
                mk[np++] = (forge__mark){x.s, x.e, false};
            }
            prev_match = x.m;
        }
    }
    for (size_t k = 0; k < np; k++)
        if (mk[k].e > mk[k].s)
            FORGE__VEC_PUSH(out, forge__span, ((forge__span){sp.off + mk[k].s, mk[k].e - mk[k].s, sp.first && mk[k].s == 0}));
}

static void forge__bl_put(forge__buf *out, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) forge__utf8_put(out, forge__bl_cp((unsigned char)s[i]));
}

/* Runs the pre-tokenizer steps over w->spans[0] (text at *base); the final spans are in
 * w->spans[*which], their text at *base. */
static void forge__tk_pretokenize(forge__tkwork *w, const char **base, int *which) {
    const forge__tokenizer *tk = w->tk;
    int cur = 0, tb = 0;
    for (int i = 0; i < tk->n_pre; i++) {
        const forge__pre_step *st = &tk->pre[i];
        forge__buf *in = &w->spans[cur], *out = &w->spans[1 - cur];
        out->n = 0;
        size_t ns = FORGE__VEC_LEN(in, forge__span);
        const char *b = *base;
        if (st->kind == FORGE__P_BYTELEVEL || st->kind == FORGE__P_METASPACE) {
            /* transforming steps write their pieces into a fresh text buffer */
            forge__buf *tx = &w->text[tb];
            tx->n = 0;
            for (size_t k = 0; k < ns; k++) {
                forge__span sp = FORGE__VEC_AT(in, forge__span, k);
                const char *s = b + sp.off;
                forge__buf *t = &w->tmp;
                t->n = 0;
                if (st->kind == FORGE__P_BYTELEVEL) {
                    if (st->add_prefix_space && (sp.len == 0 || s[0] != ' ')) forge__buf_put(t, " ", 1);
                    forge__buf_put(t, s, sp.len);
                    forge__span whole = {0, (uint32_t)t->n, sp.first};
                    size_t o0 = FORGE__VEC_LEN(out, forge__span);
                    if (st->use_regex) {
                        forge__pre_step iso = {.kind = FORGE__P_SPLIT, .pat = st->pat, .beh = FORGE__SB_ISOLATED};
                        forge__tk_marks(w, &iso, t->p ? t->p : "", t->n);
                        forge__tk_apply_split(w, FORGE__SB_ISOLATED, whole, out);
                    } else if (whole.len) {
                        FORGE__VEC_PUSH(out, forge__span, whole);
                    }
                    size_t o1 = FORGE__VEC_LEN(out, forge__span);
                    for (size_t q = o0; q < o1; q++) { /* map each piece into tx */
                        forge__span *ps = &FORGE__VEC_AT(out, forge__span, q);
                        uint32_t start = (uint32_t)tx->n;
                        forge__bl_put(tx, t->p + ps->off, ps->len);
                        ps->off = start;
                        ps->len = (uint32_t)tx->n - start;
                    }
                } else {
                    char rep[4];
                    forge__buf rb;
                    forge__buf_init(&rb, rep, sizeof rep);
                    forge__utf8_put(&rb, st->repl);
                    bool starts = sp.len >= rb.n && !memcmp(s, rep, rb.n);
                    bool starts_space = sp.len > 0 && s[0] == ' ';
                    uint32_t start = (uint32_t)tx->n;
                    if ((st->prepend == 2 || (st->prepend == 1 && sp.first)) && !starts && !starts_space) forge__buf_put(tx, rep, rb.n);
                    for (uint32_t q = 0; q < sp.len; q++) {
                        if (s[q] == ' ') forge__buf_put(tx, rep, rb.n);
                        else forge__buf_put(tx, s + q, 1);
                    }
                    forge__span piece = {start, (uint32_t)tx->n - start, sp.first};
                    if (st->split) {
                        forge__tk_marks(w, st, tx->p + piece.off, piece.len);
                        forge__tk_apply_split(w, FORGE__SB_MERGED_NEXT, piece, out);
                    } else if (piece.len) {
                        FORGE__VEC_PUSH(out, forge__span, piece);
                    }
                }
            }
            *base = tx->p ? tx->p : "";
            tb = 1 - tb;
        } else {
            forge__split_beh beh = st->kind == FORGE__P_SPLIT || st->kind == FORGE__P_PUNCT ? st->beh
                                 : st->kind == FORGE__P_DIGITS ? (st->individual ? FORGE__SB_ISOLATED : FORGE__SB_CONTIGUOUS)
                                 : FORGE__SB_REMOVED;
            for (size_t k = 0; k < ns; k++) {
                forge__span sp = FORGE__VEC_AT(in, forge__span, k);
                forge__tk_marks(w, st, b + sp.off, sp.len);
                forge__tk_apply_split(w, beh, sp, out);
            }
        }
        cur = 1 - cur;
    }
    *which = cur;
}

/* ---- Models ---- */

static void forge__heap_push(forge__buf *h, forge__heapent e, bool (*less)(const forge__heapent *, const forge__heapent *)) {
    forge__buf_put(h, &e, sizeof e);
    if (h->oom) return;
    forge__heapent *v = (forge__heapent *)h->p;
    size_t i = h->n / sizeof e - 1;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!less(&v[i], &v[p])) break;
        forge__heapent t = v[i]; v[i] = v[p]; v[p] = t;
        i = p;
    }
}
static forge__heapent forge__heap_pop(forge__buf *h, bool (*less)(const forge__heapent *, const forge__heapent *)) {
    forge__heapent *v = (forge__heapent *)h->p;
    size_t n = h->n / sizeof *v;
    forge__heapent top = v[0];
    v[0] = v[--n];
    h->n -= sizeof *v;
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && less(&v[l], &v[m])) m = l;
        if (r < n && less(&v[r], &v[m])) m = r;
        if (m == i) break;
        forge__heapent t = v[i]; v[i] = v[m]; v[m] = t;
        i = m;
    }
    return top;
}
static bool forge__bpe_less(const forge__heapent *x, const forge__heapent *y) { return x->key < y->key; }

static void forge__bpe_queue(forge__tkwork *w, forge__sym *sy, int32_t pos) {
    const forge__merge *m = forge__merge_get(&w->tk->merges, sy[pos].id, sy[sy[pos].next].id);
    if (m) forge__heap_push(&w->heap, (forge__heapent){((uint64_t)m->rank << 32) | (uint32_t)pos, m->id, 0, 0}, forge__bpe_less);
}

/* One pre-tokenized word through BPE (HF models/bpe: characters -> vocabulary ids, with byte
 * fallback or unk; then the lowest-ranked adjacent pair merges first, leftmost on ties). */
static void forge__bpe_word(forge__tkwork *w, const char *s, size_t n) {
    const forge__tokenizer *tk = w->tk;
    if (!n) return;
    if (tk->ignore_merges) {
        int32_t id = forge__strtab_get(&tk->vocab, s, n);
        if (id >= 0) { FORGE__VEC_PUSH(&w->ids, int32_t, id); return; }
    }
    forge__buf *sb = &w->sym;
    sb->n = 0;
    int32_t unk_len = -1, unk_off = 0; /* a pending unk (fused while fuse_unk) */
    char tmpbuf[64];
    for (size_t i = 0; i < n;) {
        size_t l = (size_t)forge__utf8_len1((unsigned char)s[i]);
        if (l > n - i) l = n - i;
        int32_t id;
        if (!tk->cont_prefix_len && !tk->eow_suffix_len) {
            id = forge__strtab_get(&tk->vocab, s + i, l);
        } else {
            forge__buf t;
            forge__buf_init(&t, tmpbuf, sizeof tmpbuf);
            if (i > 0) forge__buf_put(&t, tk->cont_prefix, tk->cont_prefix_len);
            forge__buf_put(&t, s + i, l);
            if (i + l == n) forge__buf_put(&t, tk->eow_suffix, tk->eow_suffix_len);
            id = t.oom ? -1 : forge__strtab_get(&tk->vocab, t.p, t.n);
            forge__buf_free(&t);
        }
        if (id >= 0) {
            if (unk_len >= 0) { FORGE__VEC_PUSH(sb, forge__sym, ((forge__sym){tk->model_unk, 0, 0, (uint32_t)unk_off, (uint32_t)unk_len})); unk_len = -1; }
            FORGE__VEC_PUSH(sb, forge__sym, ((forge__sym){id, 0, 0, (uint32_t)i, (uint32_t)l}));
        } else {
            bool bytes_ok = tk->byte_fallback;
            for (size_t k = 0; bytes_ok && k < l; k++) bytes_ok = tk->byte_id[(unsigned char)s[i + k]] >= 0;
            if (bytes_ok) {
                for (size_t k = 0; k < l; k++)
                    FORGE__VEC_PUSH(sb, forge__sym, ((forge__sym){tk->byte_id[(unsigned char)s[i + k]], 0, 0, (uint32_t)(i + k), 1}));
            } else if (tk->model_unk >= 0) {
                if (unk_len >= 0 && tk->fuse_unk) unk_len += (int32_t)l;
                else {
                    if (unk_len >= 0) FORGE__VEC_PUSH(sb, forge__sym, ((forge__sym){tk->model_unk, 0, 0, (uint32_t)unk_off, (uint32_t)unk_len}));
                    unk_len = (int32_t)l;
                    unk_off = (int32_t)i;
                }
            } /* else: HF drops a character it cannot represent */
        }
        i += l;
    }
    if (unk_len >= 0) FORGE__VEC_PUSH(sb, forge__sym, ((forge__sym){tk->model_unk, 0, 0, (uint32_t)unk_off, (uint32_t)unk_len}));
    if (sb->oom) return;
    int32_t ns = (int32_t)FORGE__VEC_LEN(sb, forge__sym);
    forge__sym *sy = (forge__sym *)sb->p;
    for (int32_t i = 0; i < ns; i++) { sy[i].prev = i - 1; sy[i].next = i + 1 < ns ? i + 1 : -1; }
    w->heap.n = 0;
    if (tk->merges.count) {
        for (int32_t i = 0; i + 1 < ns; i++) forge__bpe_queue(w, sy, i);
        while (w->heap.n && !w->heap.oom) {
            forge__heapent top = forge__heap_pop(&w->heap, forge__bpe_less);
            int32_t pos = (int32_t)(uint32_t)top.key;
            if (sy[pos].len == 0 || sy[pos].next < 0) continue;
            int32_t nx = sy[pos].next;
            const forge__merge *m = forge__merge_get(&tk->merges, sy[pos].id, sy[nx].id);
            if (!m || m->id != top.a) continue; /* a stale entry */
            sy[pos].id = m->id;
            sy[pos].len += sy[nx].len;
            sy[nx].len = 0;
            sy[pos].next = sy[nx].next;
            if (sy[nx].next >= 0) sy[sy[nx].next].prev = pos;
            if (sy[pos].prev >= 0) forge__bpe_queue(w, sy, sy[pos].prev);
            if (sy[pos].next >= 0) forge__bpe_queue(w, sy, pos);
        }
    }
    for (int32_t i = 0; i >= 0 && i < ns; i = sy[i].next) FORGE__VEC_PUSH(&w->ids, int32_t, sy[i].id);
}

/* SentencePiece-style merging by score (GGUF "llama" vocabularies, as llama.cpp does): the
 * adjacent pair whose concatenation is the best-scoring vocabulary entry merges first,
 * leftmost on ties; leftover characters become <0xXX> byte tokens, else unk. */
static bool forge__spm_less(const forge__heapent *x, const forge__heapent *y) {
    /* key holds the score as an order-preserving integer; higher score first */
    if (x->key != y->key) return x->key > y->key;
    return x->a < y->a;
}
static uint64_t forge__spm_key(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? (uint64_t)(~u) : (uint64_t)(u | 0x80000000u);
}
static void forge__spm_queue(forge__tkwork *w, const char *s, forge__sym *sy, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    uint32_t size = sy[left].len + sy[right].len;
    int32_t id = forge__strtab_get(&w->tk->vocab, s + sy[left].off, size);
    if (id < 0) return;
    float sc = w->tk->scores ? w->tk->scores[id] : 0.0f;
    forge__heap_push(&w->heap, (forge__heapent){forge__spm_key(sc), left, right, size}, forge__spm_less);
}
static void forge__spm_word(forge__tkwork *w, const char *s, size_t n) {
    const forge__tokenizer *tk = w->tk;
    forge__buf *sb = &w->sym;
    sb->n = 0;
    for (size_t i = 0; i < n;) {
        size_t l = FORGE__MIN((size_t)forge__utf8_len1((unsigned char)s[i]), n - i);
        FORGE__VEC_PUSH(sb, forge__sym, ((forge__sym){-1, 0, 0, (uint32_t)i, (uint32_t)l}));
        i += l;
    }
    if (sb->oom) return;
    int32_t ns = (int32_t)FORGE__VEC_LEN(sb, forge__sym);
    forge__sym *sy = (forge__sym *)sb->p;
    for (int32_t i = 0; i < ns; i++) { sy[i].prev = i - 1; sy[i].next = i + 1 < ns ? i + 1 : -1; }
    w->heap.n = 0;
    for (int32_t i = 1; i < ns; i++) forge__spm_queue(w, s, sy, i - 1, i);
    while (w->heap.n && !w->heap.oom) {
        forge__heapent b = forge__heap_pop(&w->heap, forge__spm_less);
        forge__sym *l = &sy[b.a], *r = &sy[b.b];
        if (l->len == 0 || r->len == 0 || l->len + r->len != b.size) continue;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) sy[r->next].prev = b.a;
        forge__spm_queue(w, s, sy, l->prev, b.a);
        forge__spm_queue(w, s, sy, b.a, l->next);
    }
    for (int32_t i = 0; i >= 0 && i < ns; i = sy[i].next) {
        int32_t id = forge__strtab_get(&tk->vocab, s + sy[i].off, sy[i].len);
        if (id >= 0) { FORGE__VEC_PUSH(&w->ids, int32_t, id); continue; }
        for (uint32_t k = 0; k < sy[i].len; k++) {
            unsigned char c = (unsigned char)s[sy[i].off + k];
            int32_t bid = tk->byte_id[c];
            if (bid < 0) bid = forge__strtab_get(&tk->vocab, (const char *)&c, 1);
            if (bid < 0) bid = tk->unk;
            if (bid >= 0) FORGE__VEC_PUSH(&w->ids, int32_t, bid);
        }
    }
}

/* Text that no added token claimed: pre-tokenizer, then the model, word by word. */
static void forge__tk_encode_text(forge__tkwork *w, const char *s, size_t n, bool first) {
    const forge__tokenizer *tk = w->tk;
    if (!n) return;
    w->spans[0].n = 0;
    FORGE__VEC_PUSH(&w->spans[0], forge__span, ((forge__span){0, (uint32_t)n, first}));
    const char *base = s;
    int which = 0;
    forge__tk_pretokenize(w, &base, &which);
    size_t ns = FORGE__VEC_LEN(&w->spans[which], forge__span);
    for (size_t k = 0; k < ns; k++) {
        forge__span sp = FORGE__VEC_AT(&w->spans[which], forge__span, k);
        if (tk->model == FORGE__TKM_SPM) forge__spm_word(w, base + sp.off, sp.len);
        else forge__bpe_word(w, base + sp.off, sp.len);
    }
}

/* The whole encode: ids appended to w->ids. */
static void forge__tk_encode(forge__tkwork *w, const char *text, size_t len, bool add_special, bool parse_special) {
    const forge__tokenizer *tk = w->tk;
    w->parse_special = parse_special;
    if (!forge__utf8_valid(text, len)) {
        w->input.n = 0;
        forge__utf8_lossy(&w->input, text, len);
        text = w->input.p ? w->input.p : "";
        len = w->input.n;
    }
    if (add_special)
        for (int i = 0; i < tk->n_tmpl_pre; i++) FORGE__VEC_PUSH(&w->ids, int32_t, tk->tmpl_pre[i]);
    forge__tk_split_added(w, &tk->trie_raw, text, len, &w->segs_raw);
    size_t nseg = FORGE__VEC_LEN(&w->segs_raw, forge__seg);
    for (size_t i = 0; i < nseg && !w->segs_raw.oom; i++) {
        forge__seg sg = FORGE__VEC_AT(&w->segs_raw, forge__seg, i);
        if (sg.id >= 0) { FORGE__VEC_PUSH(&w->ids, int32_t, sg.id); continue; }
        const char *s = text + sg.off;
        size_t n = sg.len;
        if (tk->n_norm) {
            forge__tk_normalize(w, s, n);
            s = w->norm.p ? w->norm.p : "";
            n = w->norm.n;
        }
        if (!tk->trie_norm.keys) {
            forge__tk_encode_text(w, s, n, sg.off == 0);
            continue;
        }
        forge__tk_split_added(w, &tk->trie_norm, s, n, &w->segs_norm);
        size_t nn = FORGE__VEC_LEN(&w->segs_norm, forge__seg);
        for (size_t k = 0; k < nn; k++) {
            forge__seg g2 = FORGE__VEC_AT(&w->segs_norm, forge__seg, k);
            if (g2.id >= 0) FORGE__VEC_PUSH(&w->ids, int32_t, g2.id);
            else forge__tk_encode_text(w, s + g2.off, g2.len, sg.off == 0 && g2.off == 0);
        }
    }
    if (add_special)
        for (int i = 0; i < tk->n_tmpl_post; i++) FORGE__VEC_PUSH(&w->ids, int32_t, tk->tmpl_post[i]);
}

/* ---- Decoding: ids -> pieces -> decoder steps (each maps a list of strings to a list of
 * strings, as HF's decode_chain) -> their concatenation. ---- */

typedef struct forge__strs {
    forge__buf text, idx;      /* idx: (off, len) uint32 pairs into text */
} forge__strs;

static void forge__strs_add(forge__strs *l, const char *s, size_t n) {
    uint32_t pr[2] = {(uint32_t)l->text.n, (uint32_t)n};
    forge__buf_put(&l->text, s, n);
    forge__buf_put(&l->idx, pr, sizeof pr);
}
static size_t forge__strs_n(const forge__strs *l) { return l->idx.n / 8; }
static const char *forge__strs_get(const forge__strs *l, size_t i, size_t *n) {
    const uint32_t *pr = (const uint32_t *)l->idx.p + 2 * i;
    *n = pr[1];
    return l->text.p ? l->text.p + pr[0] : "";
}
/* Starts a new token that the caller fills by appending to l->text, then closes. */
static void forge__strs_open(forge__strs *l, uint32_t *start) { *start = (uint32_t)l->text.n; }
static void forge__strs_close(forge__strs *l, uint32_t start) {
    uint32_t pr[2] = {start, (uint32_t)l->text.n - start};
    forge__buf_put(&l->idx, pr, sizeof pr);
}

/* Decodes ids into out (appended). *incomplete tells whether the text ends inside a UTF-8
 * sequence that later ids could finish (then it ends in U+FFFD here). Stack storage keeps
 * small decodes (the streaming case) free of allocation. */
static forge_status forge__tk_decode(const forge__tokenizer *tk, const int32_t *ids, size_t n, bool skip_special, forge__buf *out,
                                     bool *incomplete, forge__err *err) {
    char st0[2][1024], sx0[2][512];
    forge__strs L[2];
    for (int k = 0; k < 2; k++) {
        forge__buf_init(&L[k].text, st0[k], sizeof st0[k]);
        forge__buf_init(&L[k].idx, sx0[k], sizeof sx0[k]);
    }
    forge__buf tmp, iv; /* iv: match intervals of a Replace step */
    char tmp0[256], iv0[256];
    forge__buf_init(&tmp, tmp0, sizeof tmp0);
    forge__buf_init(&iv, iv0, sizeof iv0);
    pcre2_match_data *md = NULL; /* made when a Replace step's pattern is a regex */
    forge_status rc = FORGE_OK;
    size_t out_start = out->n;
    if (incomplete) *incomplete = false;
    int cur = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tk->n_vocab || !tk->pieces[id]) {
            rc = forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "token %d (at index %zu) is outside the vocabulary of %d", id, i, tk->n_vocab);
            goto done;
        }
        if (skip_special && tk->is_special[id]) continue;
        forge__strs_add(&L[0], tk->pieces[id], tk->piece_len[id]);
    }
    if (!tk->has_decoder) {
        size_t m = forge__strs_n(&L[0]);
        for (size_t k = 0; k < m; k++) {
            size_t ln;
            const char *s = forge__strs_get(&L[0], k, &ln);
            if (k) forge__buf_put(out, " ", 1);
            forge__buf_put(out, s, ln);
        }
        goto done;
    }
    for (int d = 0; d < tk->n_dec; d++) {
        const forge__dec_step *st = &tk->dec[d];
        forge__strs *in = &L[cur], *o = &L[1 - cur];
        o->text.n = o->idx.n = 0;
        size_t m = forge__strs_n(in);
        uint32_t start;
        switch (st->kind) {
        case FORGE__D_BYTELEVEL: {
            tmp.n = 0;
            for (size_t k = 0; k < m; k++) {
                size_t ln;
                const char *s = forge__strs_get(in, k, &ln);
                size_t mark = tmp.n, q = 0;
                bool all = true;
                while (q < ln) {
                    uint32_t cp;
                    int l = forge__utf8_dec((const unsigned char *)s + q, ln - q, &cp);
                    int b = l ? forge__bl_byte(cp) : -1;
                    if (b < 0) { all = false; break; }
                    char c = (char)b;
                    forge__buf_put(&tmp, &c, 1);
                    q += (size_t)l;
                }
                if (!all) { tmp.n = mark; forge__buf_put(&tmp, s, ln); } /* not byte-level text: its own bytes */
            }
            if (incomplete) *incomplete = forge__utf8_incomplete_tail((const unsigned char *)(tmp.p ? tmp.p : ""), tmp.n);
            forge__strs_open(o, &start);
            forge__utf8_lossy(&o->text, tmp.p ? tmp.p : "", tmp.n);
            forge__strs_close(o, start);
            break;
        }
        case FORGE__D_METASPACE: {
            char rep[4];
            forge__buf rb;
            forge__buf_init(&rb, rep, sizeof rep);
            forge__utf8_put(&rb, st->ch);
            for (size_t k = 0; k < m; k++) {
                size_t ln, q = 0;
                const char *s = forge__strs_get(in, k, &ln);
                forge__strs_open(o, &start);
                if (k == 0 && st->prepend != 0 && ln >= rb.n && !memcmp(s, rep, rb.n)) q = rb.n;
                while (q < ln) {
                    if (ln - q >= rb.n && !memcmp(s + q, rep, rb.n)) { forge__buf_put(&o->text, " ", 1); q += rb.n; }
                    else forge__buf_put(&o->text, s + q++, 1);
                }
                forge__strs_close(o, start);
            }
            break;
        }
        case FORGE__D_REPLACE:
            for (size_t k = 0; k < m; k++) {
                size_t ln;
                const char *s = forge__strs_get(in, k, &ln);
                forge__strs_open(o, &start);
                forge__pat_replace(&md, &iv, &st->pat, s, ln, st->s, st->len, &o->text);
                forge__strs_close(o, start);
            }
            break;
        case FORGE__D_BYTEFALLBACK: {
            tmp.n = 0; /* pending bytes of <0xXX> tokens */
            for (size_t k = 0; k <= m; k++) {
                size_t ln = 0;
                const char *s = k < m ? forge__strs_get(in, k, &ln) : "";
                int hi = -1, lo = -1;
                if (k < m && ln == 6 && !memcmp(s, "<0x", 3) && s[5] == '>') { hi = forge__hexval(s[3]); lo = forge__hexval(s[4]); }
                if (hi >= 0 && lo >= 0) {
                    char c = (char)(hi * 16 + lo);
                    forge__buf_put(&tmp, &c, 1);
                    continue;
                }
                if (tmp.n) {
                    if (forge__utf8_valid(tmp.p, tmp.n)) {
                        forge__strs_add(o, tmp.p, tmp.n);
                    } else {
                        if (k == m && incomplete) *incomplete = forge__utf8_incomplete_tail((const unsigned char *)tmp.p, tmp.n);
                        for (size_t q = 0; q < tmp.n; q++) forge__strs_add(o, "\xef\xbf\xbd", 3); /* one U+FFFD per byte, as HF */
                    }
                    tmp.n = 0;
                }
                if (k < m) forge__strs_add(o, s, ln);
            }
            break;
        }
        case FORGE__D_FUSE:
            forge__strs_open(o, &start);
            for (size_t k = 0; k < m; k++) {
                size_t ln;
                const char *s = forge__strs_get(in, k, &ln);
                forge__buf_put(&o->text, s, ln);
            }
            forge__strs_close(o, start);
            break;
        case FORGE__D_STRIP: {
            char c[4];
            forge__buf cb;
            forge__buf_init(&cb, c, sizeof c);
            forge__utf8_put(&cb, st->ch);
            for (size_t k = 0; k < m; k++) {
                size_t ln, a = 0, b;
                const char *s = forge__strs_get(in, k, &ln);
                b = ln;
                for (int q = 0; q < st->start && ln - a >= cb.n && !memcmp(s + a, c, cb.n); q++) a += cb.n;
                for (int q = 0; q < st->stop && b - a >= cb.n && !memcmp(s + b - cb.n, c, cb.n); q++) b -= cb.n;
                forge__strs_add(o, s + a, b - a);
            }
            break;
        }
        }
        cur = 1 - cur;
    }
    {
        size_t m = forge__strs_n(&L[cur]);
        for (size_t k = 0; k < m; k++) {
            size_t ln;
            const char *s = forge__strs_get(&L[cur], k, &ln);
            forge__buf_put(out, s, ln);
        }
    }
done:
    /* pieces of a GGUF vocabulary may be any bytes: the text given out is always UTF-8 */
    if (!rc && !out->oom && !forge__utf8_valid(out->p ? out->p + out_start : "", out->n - out_start)) {
        tmp.n = 0;
        forge__utf8_lossy(&tmp, out->p + out_start, out->n - out_start);
        out->n = out_start;
        forge__buf_put(out, tmp.p, tmp.n);
    }
    if (!rc && (L[0].text.oom || L[1].text.oom || L[0].idx.oom || L[1].idx.oom || tmp.oom || iv.oom || out->oom))
        rc = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory while decoding");
    for (int k = 0; k < 2; k++) { forge__buf_free(&L[k].text); forge__buf_free(&L[k].idx); }
    forge__buf_free(&tmp);
    forge__buf_free(&iv);
    if (md) pcre2_match_data_free(md);
    return rc;
}

/* ---- Loading tokenizer.json ---- */

typedef struct forge__tkload {
    forge__tokenizer *tk;
    forge__arena *a;
    const char *path;
    forge__err *err;
} forge__tkload;

static const char *forge__json_type(const cJSON *o) {
    const char *t = forge__json_str(o, "type");
    return t ? t : "";
}

static bool forge__cstr_valid(const char *s) { return !s || forge__utf8_valid(s, strlen(s)); }

/* Pattern: {"String": s} or {"Regex": r}. */
static forge_status forge__tk_pattern(forge__tkload *L, const cJSON *o, forge__pat *pat, const char *what) {
    const char *s = forge__json_str(o, "String"), *r = forge__json_str(o, "Regex");
    memset(pat, 0, sizeof *pat);
    if (!forge__cstr_valid(s) || !forge__cstr_valid(r)) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: %s: pattern is not valid UTF-8", L->path, what);
    if (s) {
        if (!(pat->str = forge__arena_strdup(L->a, s))) return forge__fail(L->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        pat->len = strlen(s);
        return FORGE_OK;
    }
    if (r) return forge__tk_regex(L->tk, r, strlen(r), &pat->re, L->path, what, L->err);
    return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: %s: pattern is neither {\"String\"} nor {\"Regex\"}", L->path, what);
}

static forge_status forge__tk_str(forge__tkload *L, const cJSON *o, const char *key, const char *def, const char **out, size_t *len) {
    const char *s = forge__json_str(o, key);
    if (!s) s = def;
    if (!s) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: field '%s' is missing", L->path, key);
    if (!forge__cstr_valid(s)) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: field '%s' is not valid UTF-8", L->path, key);
    if (!(*out = forge__arena_strdup(L->a, s))) return forge__fail(L->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    if (len) *len = strlen(s);
    return FORGE_OK;
}

/* The first character of a one-character string field (Metaspace replacement, Strip content). */
static forge_status forge__tk_char(forge__tkload *L, const cJSON *o, const char *key, const char *def, uint32_t *cp) {
    const char *s = forge__json_str(o, key);
    if (!s) s = def;
    if (!s || !*s || !forge__utf8_dec((const unsigned char *)s, strlen(s), cp))
        return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: field '%s' is not a character", L->path, key);
    return FORGE_OK;
}

/* A Sequence component (normalizer, pre-tokenizer, decoder, post-processor): each entry of
 * o[key] in turn, through the loader of its kind; Sequences nest at most 8 deep. */
typedef forge_status (*forge__tk_component_loader)(forge__tkload *L, const cJSON *o, int depth);
static forge_status forge__tk_sequence(forge__tkload *L, const cJSON *o, const char *key, const char *what, int depth,
                                       forge__tk_component_loader load_each) {
    const cJSON *it, *arr = cJSON_GetObjectItemCaseSensitive(o, key);
    if (depth > 8 || !cJSON_IsArray(arr)) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: %s Sequence without a %s array", L->path, what, key);
    cJSON_ArrayForEach(it, arr) {
        forge_status st = load_each(L, it, depth + 1);
        if (st) return st;
    }
    return FORGE_OK;
}

static forge_status forge__tk_normalizer(forge__tkload *L, const cJSON *o, int depth) {
    forge__tokenizer *tk = L->tk;
    if (!o || cJSON_IsNull(o)) return FORGE_OK;
    const char *t = forge__json_type(o);
    if (!strcmp(t, "Sequence")) return forge__tk_sequence(L, o, "normalizers", "normalizer", depth, forge__tk_normalizer);
    if (tk->n_norm >= FORGE__TK_MAX_STEPS) return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: more than %d normalizers", L->path, FORGE__TK_MAX_STEPS);
    forge__norm_step *s = &tk->norm[tk->n_norm];
    memset(s, 0, sizeof *s);
    forge_status st = FORGE_OK;
    if (!strcmp(t, "NFC")) s->kind = FORGE__N_NFC;
    else if (!strcmp(t, "NFD")) s->kind = FORGE__N_NFD;
    else if (!strcmp(t, "NFKC")) s->kind = FORGE__N_NFKC;
    else if (!strcmp(t, "NFKD")) s->kind = FORGE__N_NFKD;
    else if (!strcmp(t, "Lowercase")) s->kind = FORGE__N_LOWER;
    else if (!strcmp(t, "StripAccents")) s->kind = FORGE__N_STRIP_ACCENTS;
    else if (!strcmp(t, "Strip")) {
        s->kind = FORGE__N_STRIP;
        s->left = forge__json_bool(o, "strip_left", true);
        s->right = forge__json_bool(o, "strip_right", true);
    } else if (!strcmp(t, "Prepend")) {
        s->kind = FORGE__N_PREPEND;
        st = forge__tk_str(L, o, "prepend", NULL, &s->s, &s->len);
    } else if (!strcmp(t, "Replace")) {
        s->kind = FORGE__N_REPLACE;
        if (!(st = forge__tk_pattern(L, cJSON_GetObjectItemCaseSensitive(o, "pattern"), &s->pat, "normalizer Replace")))
            st = forge__tk_str(L, o, "content", NULL, &s->s, &s->len);
    } else {
        return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: normalizer '%s' is not supported", L->path, t);
    }
    if (!st) tk->n_norm++;
    return st;
}

static forge_status forge__tk_behavior(forge__tkload *L, const cJSON *o, forge__split_beh def, forge__split_beh *b) {
    const char *s = forge__json_str(o, "behavior");
    if (!s) { *b = def; return FORGE_OK; }
    if (!strcmp(s, "Removed")) *b = FORGE__SB_REMOVED;
    else if (!strcmp(s, "Isolated")) *b = FORGE__SB_ISOLATED;
    else if (!strcmp(s, "MergedWithPrevious")) *b = FORGE__SB_MERGED_PREV;
    else if (!strcmp(s, "MergedWithNext")) *b = FORGE__SB_MERGED_NEXT;
    else if (!strcmp(s, "Contiguous")) *b = FORGE__SB_CONTIGUOUS;
    else return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: split behavior '%s' is not supported", L->path, s);
    return FORGE_OK;
}

/* GPT-2's split regex: ByteLevel's use_regex. */
static const char forge__gpt2_regex[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Metaspace's prepend_scheme, with the older add_prefix_space field. */
static int forge__tk_prepend_scheme(const cJSON *o) {
    const char *ps = forge__json_str(o, "prepend_scheme");
    if (ps) return !strcmp(ps, "never") ? 0 : !strcmp(ps, "first") ? 1 : 2;
    return forge__json_bool(o, "add_prefix_space", true) ? 2 : 0;
}

static forge_status forge__tk_pretokenizer(forge__tkload *L, const cJSON *o, int depth) {
    forge__tokenizer *tk = L->tk;
    if (!o || cJSON_IsNull(o)) return FORGE_OK;
    const char *t = forge__json_type(o);
    if (!strcmp(t, "Sequence")) return forge__tk_sequence(L, o, "pretokenizers", "pre_tokenizer", depth, forge__tk_pretokenizer);
    if (tk->n_pre >= FORGE__TK_MAX_STEPS) return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: more than %d pre-tokenizers", L->path, FORGE__TK_MAX_STEPS);
    forge__pre_step *s = &tk->pre[tk->n_pre];
    memset(s, 0, sizeof *s);
    forge_status st = FORGE_OK;
    if (!strcmp(t, "Split")) {
        s->kind = FORGE__P_SPLIT;
        s->invert = forge__json_bool(o, "invert", false);
        if (!(st = forge__tk_pattern(L, cJSON_GetObjectItemCaseSensitive(o, "pattern"), &s->pat, "pre_tokenizer Split")))
            st = forge__tk_behavior(L, o, FORGE__SB_ISOLATED, &s->beh);
    } else if (!strcmp(t, "ByteLevel")) {
        s->kind = FORGE__P_BYTELEVEL;
        s->add_prefix_space = forge__json_bool(o, "add_prefix_space", true);
        s->use_regex = forge__json_bool(o, "use_regex", true);
        if (s->use_regex) st = forge__tk_regex(tk, forge__gpt2_regex, strlen(forge__gpt2_regex), &s->pat.re, L->path, "ByteLevel", L->err);
    } else if (!strcmp(t, "Metaspace")) {
        s->kind = FORGE__P_METASPACE;
        st = forge__tk_char(L, o, "replacement", "\xe2\x96\x81", &s->repl);
        s->prepend = forge__tk_prepend_scheme(o);
        s->split = forge__json_bool(o, "split", true);
    } else if (!strcmp(t, "Digits")) {
        s->kind = FORGE__P_DIGITS;
        s->individual = forge__json_bool(o, "individual_digits", false);
    } else if (!strcmp(t, "Punctuation")) {
        s->kind = FORGE__P_PUNCT;
        st = forge__tk_behavior(L, o, FORGE__SB_ISOLATED, &s->beh);
    } else if (!strcmp(t, "Whitespace")) {
        static const char re[] = "\\w+|[^\\w\\s]+";
        s->kind = FORGE__P_WHITESPACE;
        st = forge__tk_regex(tk, re, strlen(re), &s->pat.re, L->path, "Whitespace", L->err);
    } else if (!strcmp(t, "WhitespaceSplit")) {
        s->kind = FORGE__P_WSSPLIT;
    } else {
        return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: pre_tokenizer '%s' is not supported", L->path, t);
    }
    if (!st) tk->n_pre++;
    return st;
}

static forge_status forge__tk_decoder(forge__tkload *L, const cJSON *o, int depth) {
    forge__tokenizer *tk = L->tk;
    if (!o || cJSON_IsNull(o)) return FORGE_OK;
    tk->has_decoder = true;
    const char *t = forge__json_type(o);
    if (!strcmp(t, "Sequence")) return forge__tk_sequence(L, o, "decoders", "decoder", depth, forge__tk_decoder);
    if (tk->n_dec >= FORGE__TK_MAX_STEPS) return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: more than %d decoders", L->path, FORGE__TK_MAX_STEPS);
    forge__dec_step *s = &tk->dec[tk->n_dec];
    memset(s, 0, sizeof *s);
    forge_status st = FORGE_OK;
    if (!strcmp(t, "ByteLevel")) s->kind = FORGE__D_BYTELEVEL;
    else if (!strcmp(t, "ByteFallback")) s->kind = FORGE__D_BYTEFALLBACK;
    else if (!strcmp(t, "Fuse")) s->kind = FORGE__D_FUSE;
    else if (!strcmp(t, "Metaspace")) {
        s->kind = FORGE__D_METASPACE;
        st = forge__tk_char(L, o, "replacement", "\xe2\x96\x81", &s->ch);
        s->prepend = forge__tk_prepend_scheme(o);
    } else if (!strcmp(t, "Replace")) {
        s->kind = FORGE__D_REPLACE;
        if (!(st = forge__tk_pattern(L, cJSON_GetObjectItemCaseSensitive(o, "pattern"), &s->pat, "decoder Replace")))
            st = forge__tk_str(L, o, "content", NULL, &s->s, &s->len);
    } else if (!strcmp(t, "Strip")) {
        s->kind = FORGE__D_STRIP;
        st = forge__tk_char(L, o, "content", " ", &s->ch);
        s->start = forge__json_int(o, "start", 0);
        s->stop = forge__json_int(o, "stop", 0);
        if (s->start < 0 || s->stop < 0) st = forge__fail(L->err, FORGE_ERR_FORMAT, "%s: decoder Strip start/stop must be counts", L->path);
    } else {
        return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: decoder '%s' is not supported", L->path, t);
    }
    if (!st) tk->n_dec++;
    return st;
}

static int32_t forge__tk_lookup(const forge__tokenizer *tk, const char *s, size_t n) {
    int32_t id = forge__strtab_get(&tk->addtab, s, n);
    return id >= 0 ? id : forge__strtab_get(&tk->vocab, s, n);
}

/* Appends the id in JSON number `idv` to a post-processor template. */
static forge_status forge__tk_tmpl_add(forge__tkload *L, int32_t *dst, int *n, const cJSON *idv) {
    if (*n >= FORGE__TK_MAX_TEMPLATE) return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: post-processor adds more than %d tokens", L->path, FORGE__TK_MAX_TEMPLATE);
    int32_t id = forge__json_id(idv);
    if (id < 0 || id >= L->tk->n_vocab)
        return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: post-processor token id %.15g is not an id of the vocabulary (0..%d)", L->path,
                           idv->valuedouble, L->tk->n_vocab - 1);
    dst[(*n)++] = id;
    return FORGE_OK;
}

/* Post-processors: only what they add to a single sequence changes ids. */
static forge_status forge__tk_post(forge__tkload *L, const cJSON *o, int depth) {
    forge__tokenizer *tk = L->tk;
    if (!o || cJSON_IsNull(o)) return FORGE_OK;
    const char *t = forge__json_type(o);
    forge_status st = FORGE_OK;
    if (!strcmp(t, "Sequence")) return forge__tk_sequence(L, o, "processors", "post_processor", depth, forge__tk_post);
    if (!strcmp(t, "ByteLevel")) return FORGE_OK; /* offsets only */
    if (!strcmp(t, "TemplateProcessing")) {
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(o, "single"), *sp = cJSON_GetObjectItemCaseSensitive(o, "special_tokens"), *it;
        if (!cJSON_IsArray(single)) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: TemplateProcessing without a 'single' template", L->path);
        int seen_a = 0;
        cJSON_ArrayForEach(it, single) {
            const cJSON *spt = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken"), *seq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
            if (seq) {
                if (seen_a++) return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: TemplateProcessing uses the sequence twice", L->path);
                continue;
            }
            const char *name = forge__json_str(spt, "id");
            if (!name) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: TemplateProcessing item is neither SpecialToken nor Sequence", L->path);
            const cJSON *ent = cJSON_GetObjectItemCaseSensitive(sp, name), *ids = cJSON_GetObjectItemCaseSensitive(ent, "ids"), *idv;
            if (!cJSON_IsArray(ids)) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: TemplateProcessing special token '%s' has no ids", L->path, name);
            cJSON_ArrayForEach(idv, ids) {
                if (!cJSON_IsNumber(idv)) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: TemplateProcessing id is not a number", L->path);
                if ((st = seen_a ? forge__tk_tmpl_add(L, tk->tmpl_post, &tk->n_tmpl_post, idv)
                                 : forge__tk_tmpl_add(L, tk->tmpl_pre, &tk->n_tmpl_pre, idv)))
                    return st;
            }
        }
        return FORGE_OK;
    }
    if (!strcmp(t, "BertProcessing") || !strcmp(t, "RobertaProcessing")) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(o, "cls"), *sep = cJSON_GetObjectItemCaseSensitive(o, "sep");
        const cJSON *ci = cJSON_GetArrayItem(cls, 1), *si = cJSON_GetArrayItem(sep, 1);
        if (!cJSON_IsNumber(ci) || !cJSON_IsNumber(si)) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: %s without cls/sep", L->path, t);
        if ((st = forge__tk_tmpl_add(L, tk->tmpl_pre, &tk->n_tmpl_pre, ci))) return st;
        return forge__tk_tmpl_add(L, tk->tmpl_post, &tk->n_tmpl_post, si);
    }
    return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: post_processor '%s' is not supported", L->path, t);
}

/* One vocabulary entry read from the file, before the id table exists. */
typedef struct forge__tkent {
    const char *s;
    uint32_t len;
    int32_t id;
} forge__tkent;

/* "vocab": {"piece": id, ...} straight from the mapping; pieces are copied into the arena. */
static forge_status forge__tk_read_vocab(forge__tkload *L, forge__js *j, forge__buf *ents, int64_t *max_id) {
    forge__buf tmp;
    forge__buf_init(&tmp, NULL, 0);
    forge_status st = FORGE_OK;
    if (!forge__js_eat(j, '{')) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: model.vocab is not an object", L->path);
    if (!forge__js_eat(j, '}')) {
        do {
            tmp.n = 0;
            int64_t id;
            if (!forge__js_str(j, &tmp) || !forge__js_eat(j, ':') || !forge__js_int(j, &id)) {
                st = forge__fail(L->err, tmp.oom ? FORGE_ERR_OUT_OF_MEMORY : FORGE_ERR_FORMAT, "%s: model.vocab: malformed entry", L->path);
                break;
            }
            if (id < 0 || id >= FORGE__TK_MAX_IDS - 1) {
                st = forge__fail(L->err, FORGE_ERR_FORMAT, "%s: model.vocab: id %lld is out of range", L->path, (long long)id);
                break;
            }
            char *s = forge__arena_strndup(L->a, tmp.p ? tmp.p : "", tmp.n);
            if (!s) { st = forge__fail(L->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); break; }
            FORGE__VEC_PUSH(ents, forge__tkent, ((forge__tkent){s, (uint32_t)tmp.n, (int32_t)id}));
            if (id > *max_id) *max_id = id;
        } while (forge__js_eat(j, ','));
        if (!st && !forge__js_eat(j, '}')) st = forge__fail(L->err, FORGE_ERR_FORMAT, "%s: model.vocab: expected '}'", L->path);
    }
    forge__buf_free(&tmp);
    if (!st && ents->oom) st = forge__fail(L->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    return st;
}

/* Merges are registered in batches: each is three vocabulary lookups (left, right, merged
 * piece), done with prefetches over the whole batch. The merged piece must be in the
 * vocabulary (HF refuses the file otherwise); with a continuing_subword_prefix, the right
 * part's prefix is dropped from it. */
#define FORGE__MERGE_BATCH 64

typedef struct forge__mbatch {
    forge__buf pool;                          /* texts: left, right, merged, per merge */
    uint32_t off[FORGE__MERGE_BATCH * 3], len[FORGE__MERGE_BATCH * 3];
    uint64_t h[FORGE__MERGE_BATCH * 3];
    int32_t id[FORGE__MERGE_BATCH * 3];
    uint32_t n, rank0;
} forge__mbatch;

static forge_status forge__mbatch_flush(forge__tkload *L, forge__mbatch *mb) {
    forge__tokenizer *tk = L->tk;
    uint32_t nk = mb->n * 3;
    if (mb->pool.oom) return forge__fail(L->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    if ((size_t)tk->merges.count + mb->n > ((size_t)tk->merges.mask + 1) / 2) /* the table was sized by a count */
        return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: more merges than the merges array holds", L->path);
    const char *p = mb->pool.p ? mb->pool.p : "";
    for (uint32_t k = 0; k < nk; k++) {
        mb->h[k] = forge__hash(p + mb->off[k], mb->len[k]);
        forge__strtab_prefetch(&tk->vocab, mb->h[k], mb->len[k], 0);
    }
    for (uint32_t k = 0; k < nk; k++) forge__strtab_prefetch(&tk->vocab, mb->h[k], mb->len[k], 1);
    for (uint32_t k = 0; k < nk; k++) mb->id[k] = forge__strtab_get_h(&tk->vocab, p + mb->off[k], mb->len[k], mb->h[k]);
    for (uint32_t m = 0; m < mb->n; m++) {
        const int32_t *id = &mb->id[3 * m];
        if (id[0] < 0 || id[1] < 0 || id[2] < 0)
            return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: merge %u ('%.*s' '%.*s'): %s is not in the vocabulary", L->path,
                               mb->rank0 + m + 1, (int)FORGE__MIN(mb->len[3 * m], 64), p + mb->off[3 * m],
                               (int)FORGE__MIN(mb->len[3 * m + 1], 64), p + mb->off[3 * m + 1],
                               id[0] < 0 ? "the left part" : id[1] < 0 ? "the right part" : "the merged piece");
        __builtin_prefetch(&tk->merges.slot[forge__mix64(((uint64_t)(uint32_t)id[0] << 32) | (uint32_t)id[1]) & tk->merges.mask]);
    }
    for (uint32_t m = 0; m < mb->n; m++) forge__merge_put(&tk->merges, mb->id[3 * m], mb->id[3 * m + 1], mb->rank0 + m, mb->id[3 * m + 2]);
    mb->rank0 += mb->n;
    mb->n = 0;
    mb->pool.n = 0;
    return FORGE_OK;
}

static forge_status forge__mbatch_add(forge__tkload *L, forge__mbatch *mb, const char *a, size_t an, const char *b, size_t bn) {
    const forge__tokenizer *tk = L->tk;
    size_t skip = tk->cont_prefix_len && bn >= tk->cont_prefix_len && !memcmp(b, tk->cont_prefix, tk->cont_prefix_len) ? tk->cont_prefix_len : 0;
    uint32_t k = mb->n * 3;
    const char *parts[4] = {a, b, a, b + skip};
    size_t lens[4] = {an, bn, an, bn - skip};
    for (int q = 0; q < 3; q++) {
        mb->off[k + (uint32_t)q] = (uint32_t)mb->pool.n;
        forge__buf_put(&mb->pool, parts[q], lens[q]);
        if (q == 2) forge__buf_put(&mb->pool, parts[3], lens[3]);
        mb->len[k + (uint32_t)q] = (uint32_t)(mb->pool.n - mb->off[k + (uint32_t)q]);
    }
    return ++mb->n == FORGE__MERGE_BATCH ? forge__mbatch_flush(L, mb) : FORGE_OK;
}

/* "merges": ["a b", ...] (legacy) or [["a", "b"], ...]. */
static forge_status forge__tk_read_merges(forge__tkload *L, forge__js *j, size_t count) {
    forge__buf s1, s2;
    forge__buf_init(&s1, NULL, 0);
    forge__buf_init(&s2, NULL, 0);
    forge__mbatch mb;
    memset(&mb, 0, sizeof mb);
    forge_status st = FORGE_OK;
    if (!forge__js_eat(j, '[')) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: model.merges is not an array", L->path);
    /* `count` came from the scan that found the array, so the table is sized once */
    if (!forge__mergetab_init(&L->tk->merges, count, L->a)) return forge__fail(L->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    uint32_t rank = 0;
    if (!forge__js_eat(j, ']')) {
        do {
            s1.n = s2.n = 0;
            forge__js_ws(j);
            if (j->p < j->end && *j->p == '[') {
                j->p++;
                if (!forge__js_str(j, &s1) || !forge__js_eat(j, ',') || !forge__js_str(j, &s2) || !forge__js_eat(j, ']')) {
                    st = forge__fail(L->err, FORGE_ERR_FORMAT, "%s: merge %u is not a pair of strings", L->path, rank + 1);
                    break;
                }
                st = forge__mbatch_add(L, &mb, s1.p ? s1.p : "", s1.n, s2.p ? s2.p : "", s2.n);
            } else {
                if (!forge__js_str(j, &s1)) {
                    st = forge__fail(L->err, FORGE_ERR_FORMAT, "%s: merge %u is not a string or pair", L->path, rank + 1);
                    break;
                }
                /* split at the first space after the first character (as llama.cpp does) */
                const char *sp = s1.n > 1 ? memchr(s1.p + 1, ' ', s1.n - 1) : NULL;
                if (!sp) { st = forge__fail(L->err, FORGE_ERR_FORMAT, "%s: merge %u '%.*s' has no space", L->path, rank + 1, (int)FORGE__MIN(s1.n, 64), s1.p ? s1.p : ""); break; }
                st = forge__mbatch_add(L, &mb, s1.p, (size_t)(sp - s1.p), sp + 1, s1.n - (size_t)(sp - s1.p) - 1);
            }
            if (st) break;
            rank++;
        } while (forge__js_eat(j, ','));
        if (!st && !forge__js_eat(j, ']')) st = forge__fail(L->err, FORGE_ERR_FORMAT, "%s: model.merges: expected ']'", L->path);
    }
    if (!st) st = forge__mbatch_flush(L, &mb);
    forge__buf_free(&s1);
    forge__buf_free(&s2);
    forge__buf_free(&mb.pool);
    return st;
}

/* Allocates the id tables for n_vocab ids. */
static forge_status forge__tk_alloc(forge__tkload *L, int n_vocab) {
    forge__tokenizer *tk = L->tk;
    tk->n_vocab = n_vocab;
    size_t n = (size_t)(n_vocab ? n_vocab : 1);
    tk->pieces = (const char **)forge__arena_alloc(L->a, n * sizeof(char *), 16);
    tk->piece_len = (uint32_t *)forge__arena_alloc(L->a, n * sizeof(uint32_t), 16);
    tk->is_special = (uint8_t *)forge__arena_alloc(L->a, n, 16);
    if (!tk->pieces || !tk->piece_len || !tk->is_special) return forge__fail(L->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    return FORGE_OK;
}

/* Builds the byte-fallback table, the lookup tables and the tries once pieces are known. */
static forge_status forge__tk_finish_tables(forge__tkload *L) {
    forge__tokenizer *tk = L->tk;
    if (!forge__strtab_init(&tk->addtab, (size_t)tk->n_added, L->a)) return forge__fail(L->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int i = 0; i < tk->n_added; i++) forge__strtab_put(&tk->addtab, tk->added[i].s, tk->added[i].len, tk->added[i].id, false);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tk->byte_id[b] = forge__strtab_get(&tk->vocab, name, 6);
    }
    if (!forge__trie_build(&tk->trie_raw, tk->added, tk->n_added, false, L->a) ||
        !forge__trie_build(&tk->trie_norm, tk->added, tk->n_added, true, L->a))
        return forge__fail(L->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    return FORGE_OK;
}

/* The id of a token named in a config: a string or an AddedToken object {"content": ...}. */
static int32_t forge__tk_named(const forge__tokenizer *tk, const cJSON *v) {
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v)) return -1;
    return forge__tk_lookup(tk, v->valuestring, strlen(v->valuestring));
}

static void forge__tk_add_eos(forge__tokenizer *tk, int32_t id) {
    if (id < 0 || id >= tk->n_vocab || tk->n_eos >= (int)FORGE__ARRAY_LEN(tk->eos_ids)) return;
    for (int i = 0; i < tk->n_eos; i++)
        if (tk->eos_ids[i] == id) return;
    tk->eos_ids[tk->n_eos++] = id;
}

/* End-of-turn and start-of-turn markers of the chat formats forge knows, by their text. */
static const char *const forge__eot_names[] = {"<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<turn|>", "<|end|>", "<|eot|>", "<EOT>",
                                               "<|END_OF_TURN_TOKEN|>", "<|end_of_turn|>"};
static const char *const forge__sot_names[] = {"<|start_header_id|>", "<|im_start|>", "<start_of_turn>", "<|turn>", "<|START_OF_TURN_TOKEN|>"};

static int32_t forge__tk_first_of(const forge__tokenizer *tk, const char *const *names, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int32_t id = forge__tk_lookup(tk, names[i], strlen(names[i]));
        if (id >= 0) return id;
    }
    return -1;
}

/* Fills bos/eos/eot/... from tokenizer_config.json (may be NULL) and what the files say. */
static void forge__tk_special_ids(forge__tokenizer *tk, const cJSON *cfg) {
    int32_t v;
    if (cfg) {
        if ((v = forge__tk_named(tk, cJSON_GetObjectItemCaseSensitive(cfg, "bos_token"))) >= 0) tk->bos = v;
        if ((v = forge__tk_named(tk, cJSON_GetObjectItemCaseSensitive(cfg, "eos_token"))) >= 0) tk->eos = v;
        if ((v = forge__tk_named(tk, cJSON_GetObjectItemCaseSensitive(cfg, "pad_token"))) >= 0) tk->pad = v;
        if ((v = forge__tk_named(tk, cJSON_GetObjectItemCaseSensitive(cfg, "unk_token"))) >= 0) tk->unk = v;
    }
    if (tk->bos < 0 && tk->n_tmpl_pre > 0) tk->bos = tk->tmpl_pre[0];
    if (tk->unk < 0) tk->unk = tk->model_unk;
    static const char *const eos_names[] = {"</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|im_end|>"};
    int32_t text_end = -1; /* the first of these that is a special token ("</s>" may be plain text) */
    for (size_t i = 0; i < FORGE__ARRAY_LEN(eos_names) && text_end < 0; i++) {
        int32_t id = forge__tk_lookup(tk, eos_names[i], strlen(eos_names[i]));
        if (id >= 0 && tk->is_special[id]) text_end = id;
    }
    if (tk->eos < 0) tk->eos = text_end;
    if (tk->eot < 0) tk->eot = forge__tk_first_of(tk, forge__eot_names, FORGE__ARRAY_LEN(forge__eot_names));
    if (tk->sot < 0) tk->sot = forge__tk_first_of(tk, forge__sot_names, FORGE__ARRAY_LEN(forge__sot_names));
    forge__tk_add_eos(tk, tk->eos);
    forge__tk_add_eos(tk, tk->eot);
    /* the end-of-text token ends generation too when the files name another eos (chat models
     * name the end of turn; their generation_config lists both) */
    forge__tk_add_eos(tk, text_end);
    static const char *const more[] = {"<|eom_id|>"};
    forge__tk_add_eos(tk, forge__tk_first_of(tk, more, 1));
}

/* Parses a tokenizer.json held in memory (json[0..len)); cfg_json (tokenizer_config.json,
 * may be NULL) names bos/eos/pad. Tables go to `a`. */
FORGE__INTERNAL forge_status forge__tokenizer_from_json(forge__tokenizer *tk, const char *json, size_t len, const char *cfg_json,
                                                        size_t cfg_len, forge__arena *a, const char *path, forge__err *err) {
    forge__tokenizer_reset(tk);
    forge__tkload L = {tk, a, path, err};
    forge__js j = {json, json + len, false};
    /* Spans of the parts read with cJSON, and of the big arrays read directly. */
    const char *span[6][2] = {{0}};
    enum { S_ADDED, S_NORM, S_PRE, S_POST, S_DEC, S_MODEL };
    static const char *const keys[] = {"added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder", "model"};
    forge__buf key;
    forge__buf_init(&key, NULL, 0);
    forge_status st = FORGE_OK;
    cJSON *model = NULL, *part = NULL, *cfg = NULL;
    forge__buf ents;
    forge__buf_init(&ents, NULL, 0);
    /* One pass over the file finds the parts; the model object is scanned on the way (its
     * vocab and merges skipped, the merges counted, the small fields parsed). */
    const char *vocab_span = NULL, *merges_span = NULL;
    size_t n_merges = 0;
    model = cJSON_CreateObject();
    if (!model) { st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
    if (!forge__js_eat(&j, '{')) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: not a JSON object", path); goto done; }
    if (!forge__js_eat(&j, '}')) {
        do {
            key.n = 0;
            if (!forge__js_str(&j, &key) || !forge__js_eat(&j, ':')) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: malformed JSON (top-level key)", path); goto done; }
            int which = -1;
            for (int k = 0; k < 6; k++)
                if (key.n == strlen(keys[k]) && !memcmp(key.p, keys[k], key.n)) which = k;
            forge__js_ws(&j);
            const char *s0 = j.p;
            if (which == S_MODEL) {
                forge__js *m = &j;
                if (!forge__js_eat(m, '{')) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: 'model' is not an object", path); goto done; }
                if (!forge__js_eat(m, '}')) {
                    do {
                        key.n = 0;
                        if (!forge__js_str(m, &key) || !forge__js_eat(m, ':')) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: malformed model object", path); goto done; }
                        forge__js_ws(m);
                        const char *v0 = m->p;
                        bool is_merges = key.n == 6 && !memcmp(key.p, "merges", 6);
                        if (!forge__js_skip_n(m, is_merges ? &n_merges : NULL)) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: malformed model object", path); goto done; }
                        if (key.n == 5 && !memcmp(key.p, "vocab", 5)) vocab_span = v0;
                        else if (is_merges) merges_span = v0;
                        else {
                            cJSON *v = cJSON_ParseWithLength(v0, (size_t)(m->p - v0));
                            char *k = strndup(key.p, key.n);
                            if (!v || !k) { cJSON_Delete(v); free(k); st = forge__fail(err, FORGE_ERR_FORMAT, "%s: malformed model field", path); goto done; }
                            cJSON_AddItemToObject(model, k, v);
                            free(k);
                        }
                    } while (forge__js_eat(m, ','));
                    if (!forge__js_eat(m, '}')) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: malformed model object (expected '}')", path); goto done; }
                }
            } else if (!forge__js_skip(&j)) {
                st = forge__fail(err, FORGE_ERR_FORMAT, "%s: malformed JSON (value of a top-level key)", path);
                goto done;
            }
            if (which >= 0) { span[which][0] = s0; span[which][1] = j.p; }
        } while (forge__js_eat(&j, ','));
        if (!forge__js_eat(&j, '}')) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: malformed JSON (expected '}')", path); goto done; }
    }
    if (!span[S_MODEL][0]) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: no 'model'", path); goto done; }
    const char *mtype = forge__json_str(model, "type");
    if (!mtype && vocab_span && merges_span) mtype = "BPE"; /* old files omit the type */
    if (!mtype || strcmp(mtype, "BPE") != 0)
        { st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: model type '%s' is not supported (forge implements BPE)", path, mtype ? mtype : "(none)"); goto done; }
    tk->model = FORGE__TKM_BPE;
    tk->byte_fallback = forge__json_bool(model, "byte_fallback", false);
    tk->ignore_merges = forge__json_bool(model, "ignore_merges", false);
    tk->fuse_unk = forge__json_bool(model, "fuse_unk", false);
    {
        const char *cp = forge__json_str(model, "continuing_subword_prefix"), *ew = forge__json_str(model, "end_of_word_suffix");
        if (cp && *cp) { tk->cont_prefix = forge__arena_strdup(a, cp); tk->cont_prefix_len = strlen(cp); }
        if (ew && *ew) { tk->eow_suffix = forge__arena_strdup(a, ew); tk->eow_suffix_len = strlen(ew); }
    }
    if (!vocab_span) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: model has no vocab", path); goto done; }
    int64_t max_id = -1;
    {
        forge__js v = {vocab_span, span[S_MODEL][1], false};
        if ((st = forge__tk_read_vocab(&L, &v, &ents, &max_id))) goto done;
    }
    /* The model vocabulary first; added tokens may then grow the id range. */
    if ((st = forge__tk_alloc(&L, (int)(max_id + 1)))) goto done;
    size_t n_ents = FORGE__VEC_LEN(&ents, forge__tkent), vocab_size = 0;
    if (!forge__strtab_init(&tk->vocab, n_ents, a)) { st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
    for (size_t i = 0; i < n_ents; i++) {
        forge__tkent *e = &FORGE__VEC_AT(&ents, forge__tkent, i);
        tk->pieces[e->id] = e->s;
        tk->piece_len[e->id] = e->len;
        vocab_size += forge__strtab_put(&tk->vocab, e->s, e->len, e->id, true); /* a repeated piece: HF keeps the last */
    }
    if (span[S_ADDED][0]) {
        part = cJSON_ParseWithLength(span[S_ADDED][0], (size_t)(span[S_ADDED][1] - span[S_ADDED][0]));
        if (!cJSON_IsArray(part)) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: added_tokens is not an array", path); goto done; }
        int n = cJSON_GetArraySize(part);
        tk->added = (forge__added *)forge__arena_alloc(a, sizeof(forge__added) * (size_t)(n ? n : 1), 16);
        if (!tk->added) { st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
        /* HF ignores the "id" written in the file: it re-adds the tokens in order, each taking
         * its vocabulary id when its text is there, else the next id after the vocabulary and
         * the added tokens so far (AddedVocabulary::add_tokens). */
        int64_t max_added = -1;
        forge__strtab seen; /* contents already added: HF skips a repeated one */
        if (!forge__strtab_init(&seen, (size_t)n, a)) { st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
        const cJSON *it;
        cJSON_ArrayForEach(it, part) {
            const char *c = forge__json_str(it, "content");
            if (!c || !forge__cstr_valid(c)) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: added token without content in UTF-8", path); goto done; }
            size_t cl = strlen(c);
            char *cs = cl ? forge__arena_strndup(a, c, cl) : NULL;
            if (cl && !cs) { st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
            if (!cl || !forge__strtab_put(&seen, cs, cl, tk->n_added, false)) continue;
            forge__added *ad = &tk->added[tk->n_added++];
            ad->s = cs;
            ad->len = (uint32_t)cl;
            int32_t in_vocab = forge__strtab_get(&tk->vocab, c, cl);
            if (in_vocab >= 0) ad->id = in_vocab;
            else if (max_added < 0) ad->id = (int32_t)vocab_size;
            else ad->id = (int32_t)(max_added >= (int64_t)vocab_size || vocab_size == 0 ? max_added + 1 : (int64_t)vocab_size);
            if (ad->id > max_added) max_added = ad->id;
            if (ad->id >= FORGE__TK_MAX_IDS - 1) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: too many added tokens", path); goto done; }
            ad->special = forge__json_bool(it, "special", false);
            ad->lstrip = forge__json_bool(it, "lstrip", false);
            ad->rstrip = forge__json_bool(it, "rstrip", false);
            ad->single_word = forge__json_bool(it, "single_word", false);
            ad->normalized = forge__json_bool(it, "normalized", !ad->special);
        }
        if (max_added >= tk->n_vocab) { /* grow the id tables */
            const char **pieces = tk->pieces;
            uint32_t *lens = tk->piece_len;
            int old = tk->n_vocab;
            if ((st = forge__tk_alloc(&L, (int)max_added + 1))) goto done;
            memcpy(tk->pieces, pieces, sizeof(char *) * (size_t)old);
            memcpy(tk->piece_len, lens, sizeof(uint32_t) * (size_t)old);
        }
    }
    /* Merges need the vocabulary table. */
    if (merges_span) {
        forge__js mj = {merges_span, span[S_MODEL][1], false};
        if ((st = forge__tk_read_merges(&L, &mj, n_merges))) goto done;
    } else if (!forge__mergetab_init(&tk->merges, 0, a)) { st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
    {
        const char *unk = forge__json_str(model, "unk_token");
        if (unk) {
            tk->model_unk = forge__strtab_get(&tk->vocab, unk, strlen(unk));
            if (tk->model_unk < 0) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: unk_token '%s' is not in the vocabulary", path, unk); goto done; }
        }
    }
    /* The components. */
    for (int k = S_NORM; k <= S_DEC; k++) {
        if (!span[k][0]) continue;
        cJSON_Delete(part);
        part = cJSON_ParseWithLength(span[k][0], (size_t)(span[k][1] - span[k][0]));
        if (!part) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: '%s' is not valid JSON", path, keys[k]); goto done; }
        st = k == S_NORM ? forge__tk_normalizer(&L, part, 0) : k == S_PRE ? forge__tk_pretokenizer(&L, part, 0)
           : k == S_POST ? forge__tk_post(&L, part, 0) : forge__tk_decoder(&L, part, 0);
        if (st) goto done;
    }
    /* A normalized added token is known by its normalized text: matched in normalized text,
     * and its id decodes to it (HF normalizes the content when it adds the token). */
    for (int k = 0; k < tk->n_added; k++) {
        forge__added *ad = &tk->added[k];
        if (ad->normalized && tk->n_norm) {
            forge__tkwork w;
            forge__tkwork_init(&w, tk);
            forge__tk_normalize(&w, ad->s, ad->len);
            char *s = forge__tkwork_oom(&w) ? NULL : forge__arena_strndup(a, w.norm.p ? w.norm.p : "", w.norm.n);
            ad->len = (uint32_t)w.norm.n;
            forge__tkwork_free(&w);
            if (!s) { st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
            ad->s = s;
        }
        tk->pieces[ad->id] = ad->s;
        tk->piece_len[ad->id] = ad->len;
        if (ad->special) tk->is_special[ad->id] = 1;
    }
    if ((st = forge__tk_finish_tables(&L))) goto done;
    if (cfg_json) cfg = cJSON_ParseWithLength(cfg_json, cfg_len);
    forge__tk_special_ids(tk, cfg);
done:
    cJSON_Delete(cfg);
    cJSON_Delete(part);
    cJSON_Delete(model);
    forge__buf_free(&key);
    forge__buf_free(&ents);
    if (st) forge__tokenizer_free(tk);
    return st;
}

/* ---- GGUF vocabularies ---- */

/* llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) -> the split regexes its converters
 * stand for, applied one after the other, each isolating its matches. */
typedef struct forge__gguf_pre {
    const char *names;          /* space-separated names */
    bool ignore_merges;
    const char *regex[6];
} forge__gguf_pre;

#define FORGE__RE_LLAMA3 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define FORGE__RE_QWEN2 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define FORGE__RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"

static const forge__gguf_pre forge__gguf_pres[] = {
    {"llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 dbrx smaug-bpe", true, {FORGE__RE_LLAMA3}},
    {"qwen2 deepseek-r1-qwen kormo megrez stablelm2 hunyuan grok-2", false, {FORGE__RE_QWEN2}},
    {"gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum jina-v1-en jina-v2-code roberta-bpe mpt olmo jais exaone4 trillion",
     false, {FORGE__RE_GPT2}},
    {"starcoder refact command-r smollm codeshell exaone minerva-7b", false, {"\\p{N}", FORGE__RE_GPT2}},
    {"falcon", false, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", FORGE__RE_GPT2, "[0-9][0-9][0-9]"}},
    {"deepseek-coder", false, {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\\x{4e00}-\\x{9fa5}\\x{0800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+", "\\p{N}"}},
    {"deepseek-llm", false,
     {"[\\r\\n]",
      "\\s?[A-Za-z\\x{b5}\\x{c0}-\\x{d6}\\x{d8}-\\x{f6}\\x{f8}-\\x{1ba}\\x{1bc}-\\x{1bf}\\x{1c4}-\\x{293}\\x{295}-\\x{2af}\\x{370}-\\x{373}"
      "\\x{376}\\x{377}\\x{37b}-\\x{37d}\\x{37f}\\x{386}\\x{388}-\\x{38a}\\x{38c}\\x{38e}-\\x{3a1}\\x{3a3}-\\x{3f5}\\x{3f7}-\\x{481}"
      "\\x{48a}-\\x{52f}\\x{531}-\\x{556}\\x{10a0}-\\x{10c5}\\x{13a0}-\\x{13f5}\\x{13f8}-\\x{13fd}\\x{1c90}-\\x{1cba}\\x{1cbd}-\\x{1cbf}"
      "\\x{1d00}-\\x{1d2b}\\x{1d6b}-\\x{1d77}\\x{1d79}-\\x{1d9a}\\x{1e00}-\\x{1f15}\\x{1f18}-\\x{1f1d}\\x{1f20}-\\x{1f45}\\x{1f48}-\\x{1f4d}"
      "\\x{1f50}-\\x{1f57}\\x{1f59}\\x{1f5b}\\x{1f5d}\\x{1f5f}-\\x{1f7d}\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}\\x{1fbe}\\x{1fc2}-\\x{1fc4}"
      "\\x{1fc6}-\\x{1fcc}\\x{1fd0}-\\x{1fd3}\\x{1fd6}-\\x{1fdb}\\x{1fe0}-\\x{1fec}\\x{1ff2}-\\x{1ff4}\\x{1ff6}-\\x{1ffc}\\x{2102}\\x{2107}"
      "\\x{210a}-\\x{2113}\\x{2115}\\x{2119}-\\x{211d}\\x{2124}\\x{2126}\\x{2128}\\x{212a}-\\x{212d}\\x{212f}-\\x{2134}\\x{2139}"
      "\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}\\x{214e}\\x{2183}\\x{2184}\\x{2c00}-\\x{2c7b}\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}"
      "\\x{2cf2}\\x{2cf3}\\x{a640}-\\x{a66d}\\x{a680}-\\x{a69b}\\x{a722}-\\x{a76f}\\x{a771}-\\x{a787}\\x{a78b}-\\x{a78e}\\x{ab70}-\\x{abbf}"
      "\\x{fb00}-\\x{fb06}\\x{fb13}-\\x{fb17}\\x{ff21}-\\x{ff3a}\\x{ff41}-\\x{ff5a}\\x{10400}-\\x{1044f}\\x{104b0}-\\x{104d3}"
      "\\x{104d8}-\\x{104fb}\\x{10c80}-\\x{10cb2}\\x{10cc0}-\\x{10cf2}\\x{118a0}-\\x{118df}\\x{1e900}-\\x{1e943}]+",
      "\\s?[!-/:-~\\x{ff01}-\\x{ff0f}\\x{ff1a}-\\x{ff5e}\\x{2018}-\\x{201f}\\x{3000}-\\x{3002}]+", "\\s+$",
      "[\\x{4e00}-\\x{9fa5}\\x{0800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+", "\\p{N}+"}},
    {"default", false, {"[\\p{P}\\$\\+<=>\\^~\\|]+", FORGE__RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
};

static bool forge__name_in(const char *names, const char *s, size_t n) {
    for (const char *p = names; *p;) {
        const char *e = strchr(p, ' ');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !memcmp(p, s, n)) return true;
        p += l + (e ? 1 : 0);
    }
    return false;
}

/* Reads tokenizer.ggml.* into the same pipeline tokenizer.json gives. A file without
 * tokenizer.ggml.tokens leaves the tokenizer empty (forge_tokenize then says so). */
static forge_status forge__tokenizer_from_gguf(forge__tokenizer *tk, const forge__gguf *g, forge__arena *a, const char *path,
                                               forge__err *err) {
    forge__tokenizer_reset(tk);
    forge__tkload L = {tk, a, path, err};
    const forge__gguf_kv *kv = forge__gguf_find(g, "tokenizer.ggml.tokens");
    if (!kv) return FORGE_OK;
    if (kv->type != FORGE__GGUF_ARRAY || kv->elem_type != FORGE__GGUF_STRING || kv->count >= FORGE__TK_MAX_IDS)
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: tokenizer.ggml.tokens is not an array of strings", path);
    const char *ms;
    uint64_t ml;
    char model[32] = "llama";
    if (forge__gguf_get_str(g, "tokenizer.ggml.model", &ms, &ml)) snprintf(model, sizeof model, "%.*s", (int)FORGE__MIN(ml, 31), ms);
    /* gemma4: BPE by merge rank over UTF-8 characters (no byte-level mapping), spaces as '▁',
     * byte fallback: HF's Gemma tokenizer.json, and llama.cpp's LLAMA_VOCAB_PRE_TYPE_GEMMA4 */
    bool spm = !strcmp(model, "llama"), g4 = !strcmp(model, "gemma4"), bpe = !strcmp(model, "gpt2") || g4;
    if (!spm && !bpe)
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model '%s' is not supported (llama, gpt2, gemma4)", path, model);
    forge_status st = forge__tk_alloc(&L, (int)kv->count);
    if (st) return st;
    const uint8_t *cur = kv->value;
    for (int i = 0; i < tk->n_vocab; i++) {
        const char *s;
        uint64_t len;
        forge__gguf_next_str(&cur, &s, &len);
        if (len > UINT32_MAX || !(tk->pieces[i] = forge__arena_strndup(a, s, (size_t)len)))
            return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        tk->piece_len[i] = (uint32_t)len;
    }
    const forge__gguf_kv *types = forge__gguf_find(g, "tokenizer.ggml.token_type"), *scores = forge__gguf_find(g, "tokenizer.ggml.scores");
    if (types && (types->type != FORGE__GGUF_ARRAY || (types->elem_type != FORGE__GGUF_INT32 && types->elem_type != FORGE__GGUF_UINT32) || types->count != kv->count))
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: tokenizer.ggml.token_type is not an int32 array of %llu entries", path, (unsigned long long)kv->count);
    if (scores && (scores->type != FORGE__GGUF_ARRAY || scores->elem_type != FORGE__GGUF_FLOAT32 || scores->count != kv->count))
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: tokenizer.ggml.scores is not a float32 array of %llu entries", path, (unsigned long long)kv->count);
    if (!forge__strtab_init(&tk->vocab, (size_t)tk->n_vocab, a)) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int i = 0; i < tk->n_vocab; i++) forge__strtab_put(&tk->vocab, tk->pieces[i], tk->piece_len[i], i, true); /* llama.cpp: the last wins */
    /* llama.cpp: phi-3's special tokens strip the whitespace after them (its HF file says rstrip) */
    const char *gn;
    uint64_t gl;
    bool phi3 = false;
    if (forge__gguf_get_str(g, "general.name", &gn, &gl)) {
        char name[128];
        size_t n = FORGE__MIN(gl, sizeof name - 1);
        for (size_t i = 0; i < n; i++) name[i] = (char)tolower((unsigned char)gn[i]);
        name[n] = 0;
        phi3 = strstr(name, "phi-3") || strstr(name, "phi3");
    }
    /* Token types: 2 unknown, 3 control, 4 user-defined are matched in the text as added tokens. */
    int n_added = 0;
    if (types) {
        tk->added = (forge__added *)forge__arena_alloc(a, sizeof(forge__added) * (size_t)(tk->n_vocab ? tk->n_vocab : 1), 16);
        if (!tk->added) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        for (int i = 0; i < tk->n_vocab; i++) {
            int32_t t;
            memcpy(&t, types->value + 4 * (size_t)i, 4);
            /* text matching runs on valid UTF-8: a token that is not cannot be matched */
            if ((t != 2 && t != 3 && t != 4) || tk->piece_len[i] == 0 || !forge__utf8_valid(tk->pieces[i], tk->piece_len[i])) continue;
            forge__added *ad = &tk->added[n_added++];
            ad->s = tk->pieces[i];
            ad->len = tk->piece_len[i];
            ad->id = i;
            ad->special = t != 4;
            ad->rstrip = phi3 && (ad->special || !strcmp(ad->s, "</s>")) && strcmp(ad->s, "<unk>") && strcmp(ad->s, "<s>") &&
                         strcmp(ad->s, "<|endoftext|>");
            if (ad->special) tk->is_special[i] = 1;
        }
        tk->n_added = n_added;
    }
    int64_t v;
    bool add_bos = spm, add_eos = false;
    if (spm) {
        tk->model = FORGE__TKM_SPM;
        if (scores) {
            tk->scores = (float *)forge__arena_alloc(a, sizeof(float) * (size_t)tk->n_vocab, 16);
            if (!tk->scores) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
            memcpy(tk->scores, scores->value, sizeof(float) * (size_t)tk->n_vocab);
        }
        bool prefix = !forge__gguf_get_int(g, "tokenizer.ggml.add_space_prefix", &v) || v != 0;
        /* llama.cpp: " " before each text fragment at the start or after a token, then spaces -> '▁' */
        if (prefix) tk->norm[tk->n_norm++] = (forge__norm_step){.kind = FORGE__N_PREPEND, .s = "\xe2\x96\x81", .len = 3};
        tk->norm[tk->n_norm++] = (forge__norm_step){.kind = FORGE__N_REPLACE, .pat = {" ", 1, NULL}, .s = "\xe2\x96\x81", .len = 3};
        tk->dec[tk->n_dec++] = (forge__dec_step){.kind = FORGE__D_REPLACE, .pat = {"\xe2\x96\x81", 3, NULL}, .s = " ", .len = 1};
        tk->dec[tk->n_dec++] = (forge__dec_step){.kind = FORGE__D_BYTEFALLBACK};
        tk->dec[tk->n_dec++] = (forge__dec_step){.kind = FORGE__D_FUSE};
        if (prefix) tk->dec[tk->n_dec++] = (forge__dec_step){.kind = FORGE__D_STRIP, .ch = ' ', .start = 1, .stop = 0};
        tk->has_decoder = true;
        tk->byte_fallback = true;
        if (!forge__mergetab_init(&tk->merges, 0, a)) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    } else {
        tk->model = FORGE__TKM_BPE;
        const forge__gguf_kv *mk = forge__gguf_find(g, "tokenizer.ggml.merges");
        if (!mk || mk->type != FORGE__GGUF_ARRAY || mk->elem_type != FORGE__GGUF_STRING)
            return forge__fail(err, FORGE_ERR_FORMAT, "%s: tokenizer.ggml.merges is missing or not an array of strings", path);
        if (!forge__mergetab_init(&tk->merges, (size_t)mk->count, a)) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        forge__mbatch mb;
        memset(&mb, 0, sizeof mb);
        const uint8_t *mc = mk->value;
        for (uint64_t i = 0; i < mk->count && !st; i++) {
            const char *s;
            uint64_t len;
            forge__gguf_next_str(&mc, &s, &len);
            const char *sp = len > 1 ? memchr(s + 1, ' ', (size_t)len - 1) : NULL;
            if (!sp) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: merge %llu has no space", path, (unsigned long long)i + 1); break; }
            st = forge__mbatch_add(&L, &mb, s, (size_t)(sp - s), sp + 1, (size_t)len - (size_t)(sp - s) - 1);
        }
        if (!st) st = forge__mbatch_flush(&L, &mb);
        forge__buf_free(&mb.pool);
        if (st) return st;
        if (g4) {
            /* llama.cpp splits the text into runs of newlines and runs of anything else, after
             * the spaces became '▁' (HF's file merges the whole text: no token mixes the two) */
            tk->norm[tk->n_norm++] = (forge__norm_step){.kind = FORGE__N_REPLACE, .pat = {" ", 1, NULL}, .s = "\xe2\x96\x81", .len = 3};
            forge__pre_step *sp = &tk->pre[tk->n_pre];
            *sp = (forge__pre_step){.kind = FORGE__P_SPLIT, .beh = FORGE__SB_ISOLATED};
            static const char newline_runs[] = "[^\\n]+|[\\n]+";
            if ((st = forge__tk_regex(tk, newline_runs, strlen(newline_runs), &sp->pat.re, path, "tokenizer.ggml.model", err))) return st;
            tk->n_pre++;
            tk->dec[tk->n_dec++] = (forge__dec_step){.kind = FORGE__D_REPLACE, .pat = {"\xe2\x96\x81", 3, NULL}, .s = " ", .len = 1};
            tk->dec[tk->n_dec++] = (forge__dec_step){.kind = FORGE__D_BYTEFALLBACK};
            tk->dec[tk->n_dec++] = (forge__dec_step){.kind = FORGE__D_FUSE};
            tk->has_decoder = true;
            tk->byte_fallback = true;
            add_bos = true;
        } else {
            const char *ps;
            uint64_t pl;
            const forge__gguf_pre *pre = NULL;
            if (forge__gguf_get_str(g, "tokenizer.ggml.pre", &ps, &pl)) {
                for (size_t i = 0; i < FORGE__ARRAY_LEN(forge__gguf_pres) && !pre; i++)
                    if (forge__name_in(forge__gguf_pres[i].names, ps, (size_t)pl)) pre = &forge__gguf_pres[i];
                if (!pre) return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: tokenizer.ggml.pre '%.*s' is not supported", path, (int)FORGE__MIN(pl, 64), ps);
            } else {
                pre = &forge__gguf_pres[2]; /* no pre-tokenizer named: GPT-2's ByteLevel split, as HF's default */
            }
            tk->ignore_merges = pre->ignore_merges;
            add_bos = pre->ignore_merges; /* llama.cpp: the Llama 3 family adds BOS by default */
            for (int r = 0; r < 6 && pre->regex[r]; r++) {
                forge__pre_step *s = &tk->pre[tk->n_pre];
                *s = (forge__pre_step){.kind = FORGE__P_SPLIT, .beh = FORGE__SB_ISOLATED};
                if ((st = forge__tk_regex(tk, pre->regex[r], strlen(pre->regex[r]), &s->pat.re, path, "tokenizer.ggml.pre", err))) return st;
                tk->n_pre++;
            }
            tk->pre[tk->n_pre++] = (forge__pre_step){.kind = FORGE__P_BYTELEVEL};
            tk->dec[tk->n_dec++] = (forge__dec_step){.kind = FORGE__D_BYTELEVEL};
            tk->has_decoder = true;
        }
    }
    if ((st = forge__tk_finish_tables(&L))) return st;
#define FORGE__GGUF_ID(key, field) if (forge__gguf_get_int(g, key, &v) && v >= 0 && v < tk->n_vocab) tk->field = (int32_t)v;
    FORGE__GGUF_ID("tokenizer.ggml.bos_token_id", bos)
    FORGE__GGUF_ID("tokenizer.ggml.eos_token_id", eos)
    FORGE__GGUF_ID("tokenizer.ggml.eot_token_id", eot)
    FORGE__GGUF_ID("tokenizer.ggml.padding_token_id", pad)
    FORGE__GGUF_ID("tokenizer.ggml.unknown_token_id", unk)
#undef FORGE__GGUF_ID
    if (spm && tk->unk < 0 && tk->n_vocab > 0) tk->unk = 0; /* llama.cpp's default for SentencePiece */
    tk->model_unk = tk->unk;
    if (forge__gguf_get_int(g, "tokenizer.ggml.add_bos_token", &v)) add_bos = v != 0;
    if (forge__gguf_get_int(g, "tokenizer.ggml.add_eos_token", &v)) add_eos = v != 0;
    if (add_bos && tk->bos >= 0) tk->tmpl_pre[tk->n_tmpl_pre++] = tk->bos;
    if (add_eos && tk->eos >= 0) tk->tmpl_post[tk->n_tmpl_post++] = tk->eos;
    forge__tk_special_ids(tk, NULL);
    return FORGE_OK;
}

/* ---- Loading from a directory: tokenizer.json, with tokenizer_config.json (bos/eos/pad
 * names) and generation_config.json (every eos id) when they are there. ---- */

static bool forge__file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static void forge__tk_eos_from_config(forge__tokenizer *tk, const char *path) {
    char *text = NULL;
    size_t len;
    forge__err e;
    if (!forge__file_exists(path) || forge__read_text(path, &text, &len, &e)) return;
    cJSON *o = cJSON_ParseWithLength(text, len), *ids = cJSON_GetObjectItemCaseSensitive(o, "eos_token_id"), *it;
    if (cJSON_IsNumber(ids)) forge__tk_add_eos(tk, forge__json_id(ids)); /* an id out of range is ignored */
    else if (cJSON_IsArray(ids)) cJSON_ArrayForEach(it, ids) forge__tk_add_eos(tk, forge__json_id(it));
    cJSON_Delete(o);
    free(text);
}

/* Loads `json_path` (a tokenizer.json) and the configs beside it. */
static forge_status forge__tokenizer_load_file(forge__tokenizer *tk, const char *json_path, forge__arena *a, forge__err *err) {
    char dir[4096], cfg_path[4200];
    snprintf(dir, sizeof dir, "%s", json_path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
    forge__file f;
    forge_status st = forge__file_map(&f, json_path, err);
    if (st) return st;
    char *cfg = NULL;
    size_t cfg_len = 0;
    snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", dir);
    if (forge__file_exists(cfg_path) && (st = forge__read_text(cfg_path, &cfg, &cfg_len, err))) {
        forge__file_unmap(&f);
        return st;
    }
    st = forge__tokenizer_from_json(tk, (const char *)f.data, (size_t)f.size, cfg, cfg_len, a, json_path, err);
    free(cfg);
    forge__file_unmap(&f);
    if (st) return st;
    snprintf(cfg_path, sizeof cfg_path, "%s/generation_config.json", dir);
    forge__tk_eos_from_config(tk, cfg_path);
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    forge__tk_eos_from_config(tk, cfg_path);
    return FORGE_OK;
}

/* ---- Public API (the model gives the tokenizer; defined with the model in section 8) ---- */

static const forge__tokenizer *forge__model_tokenizer(const forge_model *m);
static forge_status forge__model_fail(const forge_model *cm, forge_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

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
    if (!out) return FORGE_ERR_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    out->bos = out->eos = out->eot = out->pad = out->unk = out->sot = -1;
    const forge__tokenizer *tk = forge__model_tokenizer(m);
    if (!tk) return FORGE_ERR_INVALID_ARGUMENT;
    out->bos = tk->bos;
    out->eos = tk->eos;
    out->eot = tk->eot;
    out->pad = tk->pad;
    out->unk = tk->unk;
    out->sot = tk->sot;
    out->n_eos = tk->n_eos;
    memcpy(out->eos_ids, tk->eos_ids, sizeof(int32_t) * (size_t)tk->n_eos);
    return FORGE_OK;
}

/* =======================================================================================
 * 4. Device
 * Vulkan is loaded at run time (libvulkan.so.1), so a machine without a loader gets an error
 * instead of a program that cannot start. One forge__device per model: instance, physical
 * device, logical device, one compute queue, and the capabilities read once. Buffers never
 * exceed the device's limits and are always bound with explicit ranges.
 * ===================================================================================== */

#include <dlfcn.h>

#define FORGE__VK_INSTANCE_FNS(X)                                                                  \
    X(vkDestroyInstance) X(vkEnumeratePhysicalDevices) X(vkGetPhysicalDeviceProperties)             \
    X(vkGetPhysicalDeviceProperties2) X(vkGetPhysicalDeviceFeatures2)                                \
    X(vkGetPhysicalDeviceMemoryProperties) X(vkGetPhysicalDeviceQueueFamilyProperties)              \
    X(vkEnumerateDeviceExtensionProperties) X(vkCreateDevice) X(vkGetDeviceProcAddr)                \
    X(vkGetPhysicalDeviceCooperativeMatrixPropertiesNV)

#define FORGE__VK_DEVICE_FNS(X)                                                                     \
    X(vkDestroyDevice) X(vkGetDeviceQueue) X(vkCreateBuffer) X(vkDestroyBuffer)                      \
    X(vkGetBufferMemoryRequirements) X(vkAllocateMemory) X(vkFreeMemory) X(vkBindBufferMemory)       \
    X(vkMapMemory) X(vkUnmapMemory) X(vkInvalidateMappedMemoryRanges) X(vkFlushMappedMemoryRanges)  \
    X(vkCreateShaderModule) X(vkDestroyShaderModule) X(vkCreateDescriptorSetLayout)                 \
    X(vkDestroyDescriptorSetLayout) X(vkCreatePipelineLayout) X(vkDestroyPipelineLayout)            \
    X(vkCreateComputePipelines) X(vkDestroyPipeline) X(vkCreateDescriptorPool)                      \
    X(vkDestroyDescriptorPool) X(vkResetDescriptorPool) X(vkAllocateDescriptorSets)                 \
    X(vkUpdateDescriptorSets) X(vkCreateCommandPool) X(vkDestroyCommandPool)                        \
    X(vkAllocateCommandBuffers) X(vkFreeCommandBuffers) X(vkBeginCommandBuffer)                     \
    X(vkEndCommandBuffer) X(vkCmdBindPipeline) X(vkCmdBindDescriptorSets) X(vkCmdPushConstants)     \
    X(vkCmdDispatch) X(vkCmdPipelineBarrier) X(vkCmdCopyBuffer) X(vkCmdFillBuffer)                  \
    X(vkQueueSubmit) X(vkCreateFence) X(vkDestroyFence) X(vkWaitForFences) X(vkResetFences)         \
    X(vkDeviceWaitIdle) X(vkCreateQueryPool) X(vkDestroyQueryPool) X(vkCmdResetQueryPool)           \
    X(vkCmdWriteTimestamp) X(vkGetQueryPoolResults)

typedef struct forge__vkfn {
    void *lib;
    PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr;
    PFN_vkCreateInstance vkCreateInstance;
    PFN_vkEnumerateInstanceVersion vkEnumerateInstanceVersion;
#define FORGE__VK_DECL(name) PFN_##name name;
    FORGE__VK_INSTANCE_FNS(FORGE__VK_DECL)
    FORGE__VK_DEVICE_FNS(FORGE__VK_DECL)
#undef FORGE__VK_DECL
} forge__vkfn;

/* What forge knows about a device, read once. */
typedef struct forge__caps {
    VkPhysicalDeviceProperties props;
    forge_device_type type;
    uint64_t max_storage_range;   /* the binding limit forge honours (maybe lowered by params) */
    uint64_t max_alloc;           /* the largest allocation forge makes (maybe lowered) */
    uint64_t max_buffer_size;
    uint64_t storage_align;       /* minStorageBufferOffsetAlignment */
    uint32_t subgroup_size;
    uint32_t max_shared_bytes;
    uint32_t max_wg_invocations;
    bool fp16, int8, coopmat;
    bool int_dot;                 /* VK_KHR_shader_integer_dot_product offered and its feature on: matvec_q8a */
    bool has_nv_coopmat_ext;      /* VK_NV_cooperative_matrix is offered */
    bool coopmat_nv;              /* ... and enabled with fp16 16x16x16 -> fp32 on 32-wide subgroups: matmul_cm */
    bool subgroup_arith;          /* subgroupAdd in compute shaders: the barrier-free matvec */
    bool uma;                     /* device-local memory is host-visible (CPU and integrated devices) */
    uint64_t device_local_bytes;
    uint32_t queue_family;
    bool timestamps;              /* the compute queue supports timestamps (profiling) */
    uint32_t mem_device;          /* memory type index for weights and activations */
    uint32_t mem_upload;          /* host-visible, coherent: staging and per-step inputs */
    uint32_t mem_readback;        /* host-visible, cached if possible: logits */
    uint32_t mem_step;            /* host-visible and coherent, device-local if possible: the per-step inputs that kernels
                                   * read (position, tokens, penalty window), which in system memory every attention_decode
                                   * workgroup fetched over PCIe before anything else */
    bool readback_coherent;
} forge__caps;

typedef struct forge__device {
    forge__vkfn vk;
    VkInstance instance;
    VkPhysicalDevice phys;
    VkDevice dev;
    VkQueue queue;
    pthread_mutex_t queue_lock;   /* the model is shared between threads; its queue is not */
    forge__caps caps;
    forge_device_info info;
} forge__device;

/* A device buffer with its own memory. `mapped` is set for host-visible memory. */
typedef struct forge__buffer {
    VkBuffer buf;
    VkDeviceMemory mem;
    uint64_t size;
    void *mapped;
} forge__buffer;

/* A binding: buffer + explicit offset and range, never VK_WHOLE_SIZE. */
typedef struct forge__range {
    VkBuffer buf;
    uint64_t offset, size;
} forge__range;

static forge_status forge__vk_load(forge__vkfn *vk, forge__err *err) {
    memset(vk, 0, sizeof *vk);
    const char *names[] = {"libvulkan.so.1", "libvulkan.so", "libvulkan.1.dylib", "libMoltenVK.dylib"};
    for (size_t i = 0; i < FORGE__ARRAY_LEN(names) && !vk->lib; i++) vk->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!vk->lib) return forge__fail(err, FORGE_ERR_DEVICE, "no Vulkan loader found (libvulkan.so.1): install libvulkan1 and a driver (mesa-vulkan-drivers for the CPU)");
    vk->vkGetInstanceProcAddr = (PFN_vkGetInstanceProcAddr)dlsym(vk->lib, "vkGetInstanceProcAddr");
    if (!vk->vkGetInstanceProcAddr) {
        dlclose(vk->lib);
        vk->lib = NULL;
        return forge__fail(err, FORGE_ERR_DEVICE, "the Vulkan loader lacks vkGetInstanceProcAddr");
    }
    vk->vkCreateInstance = (PFN_vkCreateInstance)vk->vkGetInstanceProcAddr(NULL, "vkCreateInstance");
    vk->vkEnumerateInstanceVersion =
        (PFN_vkEnumerateInstanceVersion)vk->vkGetInstanceProcAddr(NULL, "vkEnumerateInstanceVersion");
    return FORGE_OK;
}

static forge_status forge__vk_instance(forge__vkfn *vk, VkInstance *out, forge__err *err) {
    uint32_t version = VK_API_VERSION_1_0;
    if (vk->vkEnumerateInstanceVersion) vk->vkEnumerateInstanceVersion(&version);
    if (version < VK_API_VERSION_1_2)
        return forge__fail(err, FORGE_ERR_DEVICE, "the Vulkan loader supports %u.%u; forge needs 1.2",
                           VK_API_VERSION_MAJOR(version), VK_API_VERSION_MINOR(version));
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "forge",
                             .pEngineName = "forge", .apiVersion = VK_API_VERSION_1_2};
    VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    VkResult r = vk->vkCreateInstance(&ci, NULL, out);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "vkCreateInstance failed (VkResult %d)", (int)r);
#define FORGE__VK_LOAD(name) vk->name = (PFN_##name)vk->vkGetInstanceProcAddr(*out, #name);
    FORGE__VK_INSTANCE_FNS(FORGE__VK_LOAD)
#undef FORGE__VK_LOAD
    return FORGE_OK;
}

static bool forge__has_ext(const VkExtensionProperties *exts, uint32_t n, const char *name) {
    for (uint32_t i = 0; i < n; i++)
        if (!strcmp(exts[i].extensionName, name)) return true;
    return false;
}

static int forge__type_rank(forge_device_type t) {
    switch (t) {
    case FORGE_DEVICE_DISCRETE_GPU: return 0;
    case FORGE_DEVICE_INTEGRATED_GPU: return 1;
    case FORGE_DEVICE_VIRTUAL_GPU: return 2;
    case FORGE_DEVICE_CPU: return 3;
    default: return 4;
    }
}

/* Whether the device can run attention_decode.comp: subgroup arithmetic at a width of 4 to 64
 * (its workgroup of 64 holds 64 / width subgroups) and its 13 storage buffers (Vulkan promises 4). */
static bool forge__runs_attn_decode(const forge__caps *c) {
    return c->subgroup_arith && c->subgroup_size <= 64 && c->props.limits.maxPerStageDescriptorStorageBuffers >= 13;
}

/* Reads everything forge needs to know about one physical device. */
static void forge__query_device(const forge__vkfn *vk, VkPhysicalDevice pd, forge__caps *c, forge_device_info *info) {
    memset(c, 0, sizeof *c);
    memset(info, 0, sizeof *info);
    VkPhysicalDeviceMaintenance3Properties m3 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
    VkPhysicalDeviceMaintenance4Properties m4 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_4_PROPERTIES, .pNext = &m3};
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES, .pNext = &m4};
    VkPhysicalDeviceDriverProperties drv = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES, .pNext = &sg};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &drv};
    vk->vkGetPhysicalDeviceProperties(pd, &c->props);
    uint32_t n_ext = 0;
    vk->vkEnumerateDeviceExtensionProperties(pd, NULL, &n_ext, NULL);
    VkExtensionProperties *exts = (VkExtensionProperties *)calloc(n_ext ? n_ext : 1, sizeof *exts);
    if (exts) vk->vkEnumerateDeviceExtensionProperties(pd, NULL, &n_ext, exts);
    else n_ext = 0;
    bool has_m4 = c->props.apiVersion >= VK_API_VERSION_1_3 || forge__has_ext(exts, n_ext, "VK_KHR_maintenance4");
    if (!has_m4) sg.pNext = &m3;
    if (c->props.apiVersion >= VK_API_VERSION_1_1) vk->vkGetPhysicalDeviceProperties2(pd, &p2);
    bool has_idp = forge__has_ext(exts, n_ext, "VK_KHR_shader_integer_dot_product");
    VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR idp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR};
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, .pNext = has_idp ? &idp : NULL};
    VkPhysicalDeviceVulkan11Features f11 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES, .pNext = &f12};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f11};
    if (c->props.apiVersion >= VK_API_VERSION_1_2) vk->vkGetPhysicalDeviceFeatures2(pd, &f2);

    switch (c->props.deviceType) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: c->type = FORGE_DEVICE_DISCRETE_GPU; break;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: c->type = FORGE_DEVICE_INTEGRATED_GPU; break;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: c->type = FORGE_DEVICE_VIRTUAL_GPU; break;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: c->type = FORGE_DEVICE_CPU; break;
    default: c->type = FORGE_DEVICE_OTHER; break;
    }
    c->max_storage_range = c->props.limits.maxStorageBufferRange;
    c->max_alloc = m3.maxMemoryAllocationSize ? m3.maxMemoryAllocationSize : ((uint64_t)1 << 30);
    c->max_buffer_size = has_m4 && m4.maxBufferSize ? m4.maxBufferSize : c->max_alloc;
    c->storage_align = c->props.limits.minStorageBufferOffsetAlignment ? c->props.limits.minStorageBufferOffsetAlignment : 16;
    if (c->storage_align < 16) c->storage_align = 16;
    c->subgroup_size = sg.subgroupSize ? sg.subgroupSize : 1;
    c->max_shared_bytes = c->props.limits.maxComputeSharedMemorySize;
    c->max_wg_invocations = c->props.limits.maxComputeWorkGroupInvocations;
    c->subgroup_arith = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) && (sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) &&
                        c->subgroup_size >= 4 && c->subgroup_size <= 128;
    c->fp16 = f12.shaderFloat16 && f11.storageBuffer16BitAccess;
    c->int8 = f12.shaderInt8 && f12.storageBuffer8BitAccess;
    c->int_dot = has_idp && idp.shaderIntegerDotProduct;
    c->coopmat = forge__has_ext(exts, n_ext, "VK_KHR_cooperative_matrix") || forge__has_ext(exts, n_ext, "VK_NV_cooperative_matrix");
    c->has_nv_coopmat_ext = forge__has_ext(exts, n_ext, "VK_NV_cooperative_matrix") && f12.shaderFloat16;
    free(exts);

    VkPhysicalDeviceMemoryProperties mp;
    vk->vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    for (uint32_t h = 0; h < mp.memoryHeapCount; h++)
        if ((mp.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && mp.memoryHeaps[h].size > c->device_local_bytes)
            c->device_local_bytes = mp.memoryHeaps[h].size;
    /* Memory types: the first that has all `want` bits, preferring ones without `avoid`. */
    uint32_t best_dev = UINT32_MAX, best_up = UINT32_MAX, best_rb = UINT32_MAX, best_step = UINT32_MAX;
    for (uint32_t i = 0; i < mp.memoryTypeCount; i++) {
        VkMemoryPropertyFlags f = mp.memoryTypes[i].propertyFlags;
        if ((f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) && best_dev == UINT32_MAX) best_dev = i;
        if ((f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) && (f & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)) {
            if (best_up == UINT32_MAX) best_up = i;
            if ((f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) && best_step == UINT32_MAX) best_step = i;
        }
        if (f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) {
            bool cached = f & VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
            if (best_rb == UINT32_MAX || (cached && !(mp.memoryTypes[best_rb].propertyFlags & VK_MEMORY_PROPERTY_HOST_CACHED_BIT)))
                best_rb = i;
        }
    }
    c->mem_device = best_dev != UINT32_MAX ? best_dev : 0;
    c->mem_upload = best_up != UINT32_MAX ? best_up : c->mem_device;
    c->mem_readback = best_rb != UINT32_MAX ? best_rb : c->mem_upload;
    c->mem_step = best_step != UINT32_MAX ? best_step : c->mem_upload;
    c->readback_coherent = mp.memoryTypes[c->mem_readback].propertyFlags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    c->uma = (mp.memoryTypes[c->mem_device].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) != 0;

    uint32_t nq = 0;
    vk->vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, NULL);
    VkQueueFamilyProperties qf[32];
    if (nq > 32) nq = 32;
    vk->vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, qf);
    c->queue_family = UINT32_MAX;
    for (uint32_t i = 0; i < nq; i++)
        if ((qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && c->queue_family == UINT32_MAX) {
            c->queue_family = i;
            c->timestamps = qf[i].timestampValidBits > 0 && c->props.limits.timestampPeriod > 0;
        }

    snprintf(info->name, sizeof info->name, "%s", c->props.deviceName);
    if (drv.driverName[0])
        snprintf(info->driver, sizeof info->driver, "%s %s", drv.driverName, drv.driverInfo);
    else
        snprintf(info->driver, sizeof info->driver, "driver %u", c->props.driverVersion);
    info->type = c->type;
    info->vendor_id = c->props.vendorID;
    info->api_version = c->props.apiVersion;
    info->device_local_bytes = c->device_local_bytes;
    info->max_storage_buffer_range = c->max_storage_range;
    info->max_allocation_size = c->max_alloc;
    info->max_buffer_size = c->max_buffer_size;
    info->subgroup_size = c->subgroup_size;
    info->fp16 = c->fp16;
    info->int8 = c->int8;
    info->integer_dot_product = c->int_dot;
    info->cooperative_matrix = c->coopmat;
    info->usable = c->props.apiVersion >= VK_API_VERSION_1_2 && c->queue_family != UINT32_MAX &&
                   c->max_wg_invocations >= 256 && c->max_shared_bytes >= 16384;
}

/* Enumerates devices in preference order (discrete, integrated, virtual, CPU, other). */
static forge_status forge__enumerate(const forge__vkfn *vk, VkInstance inst, VkPhysicalDevice *pds, forge__caps *caps,
                                     forge_device_info *infos, int cap, int *count, forge__err *err) {
    uint32_t n = 0;
    VkResult r = vk->vkEnumeratePhysicalDevices(inst, &n, NULL);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "vkEnumeratePhysicalDevices failed (VkResult %d)", (int)r);
    if (n > (uint32_t)cap) n = (uint32_t)cap;
    r = vk->vkEnumeratePhysicalDevices(inst, &n, pds);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) return forge__fail(err, FORGE_ERR_DEVICE, "vkEnumeratePhysicalDevices failed (VkResult %d)", (int)r);
    for (uint32_t i = 0; i < n; i++) forge__query_device(vk, pds[i], &caps[i], &infos[i]);
    /* stable insertion sort by type rank */
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t j = i; j > 0 && forge__type_rank(infos[j].type) < forge__type_rank(infos[j - 1].type); j--) {
            VkPhysicalDevice tp = pds[j]; pds[j] = pds[j - 1]; pds[j - 1] = tp;
            forge__caps tc = caps[j]; caps[j] = caps[j - 1]; caps[j - 1] = tc;
            forge_device_info ti = infos[j]; infos[j] = infos[j - 1]; infos[j - 1] = ti;
        }
    for (uint32_t i = 0; i < n; i++) infos[i].index = (int)i;
    *count = (int)n;
    return FORGE_OK;
}

#define FORGE__MAX_DEVICES 16

FORGE_API forge_status forge_list_devices(forge_device_info *out, int capacity, int *count, char *errmsg,
                                          size_t errmsg_size) {
    forge__err err = {{0}};
    forge__vkfn vk;
    VkInstance inst = VK_NULL_HANDLE;
    if (count) *count = 0;
    forge_status st = forge__vk_load(&vk, &err);
    if (!st) st = forge__vk_instance(&vk, &inst, &err);
    if (!st) {
        VkPhysicalDevice pds[FORGE__MAX_DEVICES];
        forge__caps caps[FORGE__MAX_DEVICES];
        forge_device_info infos[FORGE__MAX_DEVICES];
        int n = 0;
        st = forge__enumerate(&vk, inst, pds, caps, infos, FORGE__MAX_DEVICES, &n, &err);
        if (!st) {
            if (n == 0) st = forge__fail(&err, FORGE_ERR_DEVICE, "no Vulkan device found (install a driver; mesa-vulkan-drivers gives a CPU device)");
            for (int i = 0; i < n && i < capacity && out; i++) out[i] = infos[i];
            if (count) *count = n;
        }
        vk.vkDestroyInstance(inst, NULL);
    }
    if (vk.lib) dlclose(vk.lib);
    if (st && errmsg && errmsg_size) snprintf(errmsg, errmsg_size, "%s", err.msg);
    return st;
}

/* Creates the device chosen by index or name (else the preferred one). Limits from the
 * params lower the device's own, for tests of tensor splitting. */
static forge_status forge__device_open(forge__device *d, int index, const char *name, uint64_t max_range,
                                       uint64_t max_alloc, forge__err *err) {
    memset(d, 0, sizeof *d);
    forge_status st = forge__vk_load(&d->vk, err);
    if (st) return st;
    if ((st = forge__vk_instance(&d->vk, &d->instance, err))) return st;
    VkPhysicalDevice pds[FORGE__MAX_DEVICES];
    forge__caps caps[FORGE__MAX_DEVICES];
    forge_device_info infos[FORGE__MAX_DEVICES];
    int n = 0;
    if ((st = forge__enumerate(&d->vk, d->instance, pds, caps, infos, FORGE__MAX_DEVICES, &n, err))) return st;
    if (n == 0) return forge__fail(err, FORGE_ERR_DEVICE, "no Vulkan device found (install a driver; mesa-vulkan-drivers gives a CPU device)");
    int pick = -1;
    if (name && name[0]) {
        for (int i = 0; i < n && pick < 0; i++)
            if (strstr(infos[i].name, name)) pick = i;
        if (pick < 0) return forge__fail(err, FORGE_ERR_DEVICE, "no Vulkan device has a name containing '%s'", name);
    } else if (index >= 0) {
        if (index >= n) return forge__fail(err, FORGE_ERR_DEVICE, "device index %d out of range (%d devices)", index, n);
        pick = index;
    } else {
        for (int i = 0; i < n && pick < 0; i++)
            if (infos[i].usable) pick = i;
        if (pick < 0) return forge__fail(err, FORGE_ERR_DEVICE, "no usable Vulkan device (forge needs Vulkan 1.2 with compute)");
    }
    if (!infos[pick].usable)
        return forge__fail(err, FORGE_ERR_DEVICE, "device '%s' is not usable (forge needs Vulkan 1.2 with compute)", infos[pick].name);
    d->phys = pds[pick];
    d->caps = caps[pick];
    d->info = infos[pick];
    forge__caps *c = &d->caps;
    if (c->max_alloc > c->max_buffer_size) c->max_alloc = c->max_buffer_size;
    if (c->max_alloc > ((uint64_t)1 << 30)) c->max_alloc = (uint64_t)1 << 30; /* 1 GiB blocks, as ggml-vulkan */
    if (max_range && max_range < c->max_storage_range) c->max_storage_range = max_range;
    if (max_alloc && max_alloc < c->max_alloc) c->max_alloc = max_alloc;
    c->max_storage_range = c->max_storage_range / c->storage_align * c->storage_align;
    c->max_alloc = c->max_alloc / c->storage_align * c->storage_align;
    if (c->max_storage_range < 4096 || c->max_alloc < 4096)
        return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "buffer limits below 4096 bytes (range %llu, allocation %llu)",
                           (unsigned long long)c->max_storage_range, (unsigned long long)c->max_alloc);

    float prio = 1.0f;
    VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueFamilyIndex = c->queue_family,
                                   .queueCount = 1, .pQueuePriorities = &prio};
    /* Tensor cores through VK_NV_cooperative_matrix when the kernels were built with it and the
     * device multiplies fp16 16x16x16 into fp32 on 32-wide subgroups (matmul_cm.comp's layout). */
    const char *exts[2];
    uint32_t n_exts = 0;
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cmf = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV,
                                                       .cooperativeMatrix = VK_TRUE};
    /* integer dot products (the extension: the instance asks for Vulkan 1.2, where it is not core) */
    VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR idp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR,
                                                              .shaderIntegerDotProduct = VK_TRUE};
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12};
#if FORGE_SPV_HAVE_NV_COOPERATIVE_MATRIX
    if (c->has_nv_coopmat_ext && c->subgroup_size == 32 && d->vk.vkGetPhysicalDeviceCooperativeMatrixPropertiesNV) {
        VkCooperativeMatrixPropertiesNV props[64];
        uint32_t np = 0;
        d->vk.vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(d->phys, &np, NULL);
        if (np > 64) np = 64;
        for (uint32_t i = 0; i < np; i++) props[i] = (VkCooperativeMatrixPropertiesNV){.sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV};
        d->vk.vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(d->phys, &np, props);
        for (uint32_t i = 0; i < np; i++) {
            const VkCooperativeMatrixPropertiesNV *p = &props[i];
            if (p->MSize == 16 && p->NSize == 16 && p->KSize == 16 && p->AType == VK_COMPONENT_TYPE_FLOAT16_NV &&
                p->BType == VK_COMPONENT_TYPE_FLOAT16_NV && p->CType == VK_COMPONENT_TYPE_FLOAT32_NV &&
                p->DType == VK_COMPONENT_TYPE_FLOAT32_NV && p->scope == VK_SCOPE_SUBGROUP_NV)
                c->coopmat_nv = true;
        }
    }
#endif
    if (c->coopmat_nv) {
        exts[n_exts++] = "VK_NV_cooperative_matrix";
        f12.shaderFloat16 = VK_TRUE;
        f12.pNext = &cmf;
    }
    if (c->int_dot) {
        exts[n_exts++] = "VK_KHR_shader_integer_dot_product";
        idp.pNext = f12.pNext;
        f12.pNext = &idp;
    }
    VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .pNext = &f2, .queueCreateInfoCount = 1, .pQueueCreateInfos = &qci,
                              .enabledExtensionCount = n_exts, .ppEnabledExtensionNames = exts};
    VkResult r = d->vk.vkCreateDevice(d->phys, &dci, NULL, &d->dev);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "vkCreateDevice on '%s' failed (VkResult %d)", d->info.name, (int)r);
#define FORGE__VK_LOAD(fn) d->vk.fn = (PFN_##fn)d->vk.vkGetDeviceProcAddr(d->dev, #fn);
    FORGE__VK_DEVICE_FNS(FORGE__VK_LOAD)
#undef FORGE__VK_LOAD
    d->vk.vkGetDeviceQueue(d->dev, c->queue_family, 0, &d->queue);
    pthread_mutex_init(&d->queue_lock, NULL);
    return FORGE_OK;
}

static void forge__device_close(forge__device *d) {
    if (d->dev) {
        d->vk.vkDeviceWaitIdle(d->dev);
        d->vk.vkDestroyDevice(d->dev, NULL);
        pthread_mutex_destroy(&d->queue_lock);
    }
    if (d->instance) d->vk.vkDestroyInstance(d->instance, NULL);
    if (d->vk.lib) dlclose(d->vk.lib);
    memset(d, 0, sizeof *d);
}

/* Allocates one buffer with its own memory of type `mem_type`; maps it when host-visible. */
static forge_status forge__buffer_create(forge__device *d, uint64_t size, uint32_t mem_type, bool map,
                                         forge__mem_counter *owner, forge__mem_counter *total, forge__buffer *out,
                                         forge__err *err) {
    memset(out, 0, sizeof *out);
    if (size == 0) size = 16;
    if (size > d->caps.max_buffer_size)
        return forge__fail(err, FORGE_ERR_LIMIT, "buffer of %llu bytes exceeds the device's maxBufferSize %llu",
                           (unsigned long long)size, (unsigned long long)d->caps.max_buffer_size);
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = size,
                             .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                      VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                             .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VkResult r = d->vk.vkCreateBuffer(d->dev, &bi, NULL, &out->buf);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "vkCreateBuffer(%llu bytes) failed (VkResult %d)", (unsigned long long)size, (int)r);
    VkMemoryRequirements req;
    d->vk.vkGetBufferMemoryRequirements(d->dev, out->buf, &req);
    if (!(req.memoryTypeBits & (1u << mem_type))) {
        d->vk.vkDestroyBuffer(d->dev, out->buf, NULL);
        out->buf = VK_NULL_HANDLE;
        return forge__fail(err, FORGE_ERR_DEVICE, "no compatible memory type for a storage buffer");
    }
    VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size, .memoryTypeIndex = mem_type};
    r = d->vk.vkAllocateMemory(d->dev, &ai, NULL, &out->mem);
    if (r != VK_SUCCESS) {
        d->vk.vkDestroyBuffer(d->dev, out->buf, NULL);
        out->buf = VK_NULL_HANDLE;
        return forge__fail(err, r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY ? FORGE_ERR_OUT_OF_MEMORY : FORGE_ERR_DEVICE,
                           "allocating %llu bytes of device memory failed (VkResult %d)", (unsigned long long)req.size, (int)r);
    }
    d->vk.vkBindBufferMemory(d->dev, out->buf, out->mem, 0);
    if (map) {
        r = d->vk.vkMapMemory(d->dev, out->mem, 0, VK_WHOLE_SIZE, 0, &out->mapped);
        if (r != VK_SUCCESS) {
            d->vk.vkFreeMemory(d->dev, out->mem, NULL);
            d->vk.vkDestroyBuffer(d->dev, out->buf, NULL);
            memset(out, 0, sizeof *out);
            return forge__fail(err, FORGE_ERR_DEVICE, "vkMapMemory failed (VkResult %d)", (int)r);
        }
    }
    out->size = size;
    forge__mem_add(owner, total, req.size);
    owner->n_buffers++;
    return FORGE_OK;
}

static void forge__buffer_destroy(forge__device *d, forge__buffer *b, forge__mem_counter *owner, forge__mem_counter *total) {
    if (!b->buf) return;
    VkMemoryRequirements req;
    d->vk.vkGetBufferMemoryRequirements(d->dev, b->buf, &req);
    if (b->mapped) d->vk.vkUnmapMemory(d->dev, b->mem);
    d->vk.vkDestroyBuffer(d->dev, b->buf, NULL);
    d->vk.vkFreeMemory(d->dev, b->mem, NULL);
    forge__mem_sub(owner, total, req.size);
    owner->n_buffers--;
    memset(b, 0, sizeof *b);
}

/* Submits one command buffer and waits for it. The queue is shared by the model's sessions. */
static forge_status forge__submit_wait(forge__device *d, VkCommandBuffer cb, VkFence fence, forge__err *err) {
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cb};
    pthread_mutex_lock(&d->queue_lock);
    VkResult r = d->vk.vkQueueSubmit(d->queue, 1, &si, fence);
    pthread_mutex_unlock(&d->queue_lock);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "vkQueueSubmit failed (VkResult %d)", (int)r);
    r = d->vk.vkWaitForFences(d->dev, 1, &fence, VK_TRUE, UINT64_MAX);
    d->vk.vkResetFences(d->dev, 1, &fence);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "vkWaitForFences failed (VkResult %d): device lost?", (int)r);
    return FORGE_OK;
}

/* Fills device ranges with zeros, submitted and waited for (buffers that must start at zero). */
static forge_status forge__zero_ranges(forge__device *d, VkCommandPool pool, VkFence fence, const forge__range *ranges, int n, forge__err *err) {
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    VkCommandBuffer cb;
    if (d->vk.vkAllocateCommandBuffers(d->dev, &cai, &cb) != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "vkAllocateCommandBuffers failed");
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    d->vk.vkBeginCommandBuffer(cb, &bi);
    for (int i = 0; i < n; i++) d->vk.vkCmdFillBuffer(cb, ranges[i].buf, ranges[i].offset, forge__align_up(ranges[i].size, 4), 0);
    d->vk.vkEndCommandBuffer(cb);
    forge_status st = forge__submit_wait(d, cb, fence, err);
    d->vk.vkFreeCommandBuffers(d->dev, pool, 1, &cb);
    return st;
}

/* ---- Packing: many ranges into few allocations ----
 * A list of (size, alignment) requests is packed, in order, into blocks of at most
 * caps.max_alloc bytes; each request must fit the binding range. The plan (block sizes) is
 * known before anything is allocated: that is the memory plan forge reports. */

typedef struct forge__pack_item {
    uint64_t size;
    int block;         /* result: which block */
    uint64_t offset;   /* result: offset in the block */
} forge__pack_item;

typedef struct forge__pack {
    forge__pack_item *items;
    int n_items, cap_items;
    uint64_t *block_sizes;
    int n_blocks;
} forge__pack;

static int forge__pack_add(forge__pack *p, forge__arena *a, uint64_t size) {
    if (p->n_items == p->cap_items) {
        int cap = p->cap_items ? p->cap_items * 2 : 256;
        forge__pack_item *items = (forge__pack_item *)forge__arena_alloc(a, sizeof *items * (size_t)cap, 16);
        if (!items) return -1;
        if (p->n_items) memcpy(items, p->items, sizeof *items * (size_t)p->n_items);
        p->items = items;
        p->cap_items = cap;
    }
    p->items[p->n_items].size = size;
    return p->n_items++;
}

static forge_status forge__pack_plan(forge__pack *p, forge__arena *a, const forge__caps *c, forge__err *err) {
    p->block_sizes = (uint64_t *)forge__arena_alloc(a, sizeof(uint64_t) * (size_t)(p->n_items + 1), 16);
    if (!p->block_sizes) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    p->n_blocks = 0;
    uint64_t used = c->max_alloc; /* forces a first block */
    for (int i = 0; i < p->n_items; i++) {
        uint64_t sz = forge__align_up(p->items[i].size ? p->items[i].size : 16, 16);
        if (sz > c->max_storage_range || sz > c->max_alloc)
            return forge__fail(err, FORGE_ERR_LIMIT, "a buffer of %llu bytes exceeds the binding range %llu / allocation limit %llu",
                               (unsigned long long)sz, (unsigned long long)c->max_storage_range, (unsigned long long)c->max_alloc);
        uint64_t off = forge__align_up(used, c->storage_align);
        if (off + sz > c->max_alloc) {
            p->n_blocks++;
            off = 0;
        }
        p->items[i].block = p->n_blocks - 1;
        p->items[i].offset = off;
        used = off + sz;
        p->block_sizes[p->n_blocks - 1] = used;
    }
    return FORGE_OK;
}

static uint64_t forge__pack_total(const forge__pack *p) {
    uint64_t t = 0;
    for (int i = 0; i < p->n_blocks; i++) t += p->block_sizes[i];
    return t;
}

/* =======================================================================================
 * 5. Op table
 * One row per kernel: its SPIR-V (embedded), binding count, push-constant size and pinned
 * specialization constants. Pipelines are created on first use, under the model's lock, and
 * shared by all sessions. Recording goes through forge__dispatch, which can also run in a
 * counting mode: a command buffer's descriptor pool is sized exactly before it is recorded.
 * ===================================================================================== */

/* Push constants, mirroring the `PC` blocks of the kernels. */
typedef struct forge__pc_linear {   /* matvec.comp, matvec_sg.comp, matmul.comp */
    uint32_t M, K, N, a_row0, ldc, c_col0, flags, bias_off;
    float softcap;
    uint32_t qbits, qgroup, qflags; /* MLX affine */
    float eps;                      /* matvec_sg PRENORM */
    uint32_t rows_per_wg;           /* matvec_sg, one token: outputs per workgroup */
    uint32_t k_split;               /* matmul with FORGE__LINEAR_SPLIT_K: k per split; ..._REDUCE: splits */
    /* mixture of experts (matvec_sg EXPERTS, matmul_moe): the chunk's experts e0 ..
     * e0 + n_exp - 1, choices per token, the divisor from a pair to its A row, and (matmul_moe)
     * where the sorted pairs start in the group table */
    uint32_t e0, n_exp, top_k, a_div, order_off;
} forge__pc_linear;
typedef struct forge__pc_act_q8 {   /* act_q8.comp */
    uint32_t K, a_row0, flags;      /* flags: FORGE__LINEAR_PRENORM */
} forge__pc_act_q8;
typedef struct forge__pc_act_f16 {  /* act_f16.comp: rows a_row0 .. a_row0 + M of [*, K] */
    uint32_t K, a_row0, M;
} forge__pc_act_f16;
typedef struct forge__pc_embed {    /* embed.comp */
    uint32_t n_tokens, hidden, row_begin, row_count;
    float scale;
    uint32_t round_mode;
    uint32_t qbits, qgroup, qflags; /* MLX affine */
} forge__pc_embed;
typedef struct forge__pc_rmsnorm {  /* rmsnorm.comp */
    uint32_t dim, x_row0, out_row0, flags;   /* flags: 1 add to out, 2 then times scale */
    float eps;
    uint32_t heads, row_stride, col0;   /* per-head norms over the fused qkv rows */
    float scale;
} forge__pc_rmsnorm;
#define FORGE__NORM_ADD 1u
#define FORGE__NORM_RESID 4u /* (with ADD) add binding 3's row, not out's */
#define FORGE__NORM_SCALE 2u
typedef struct forge__pc_rope {     /* rope.comp */
    uint32_t n_tokens, n_heads, n_kv_heads, head_dim, adjacent, cache_slots, stride, k_off, v_off;
    uint32_t seq_len;               /* training batches: tokens per sequence (0: one sequence) */
    uint32_t table;                 /* batch generation: positions and sequences from the row table */
} forge__pc_rope;
typedef struct forge__pc_attention { /* attention_tiled.comp, attention_split.comp (which reads n_splits) */
    uint32_t n_tokens, n_heads, n_kv_heads, head_dim, cache_slots, window;
    float scale, softcap;
    uint32_t n_splits;
    uint32_t q_stride;              /* floats between two tokens' query rows (the fused qkv rows) */
    uint32_t kv_batch_stride;       /* training: floats between two sequences' K (and V) rows */
    uint32_t flags;                 /* 1: write each query's log-sum-exp (training); 2: the row table (batch generation);
                                     * attention_decode: FORGE__ATTN_ROPE_* */
    float eps;                      /* attention_decode, FORGE__ATTN_QK_NORM: the head norms' */
    uint32_t min_run;               /* attention_decode: keys a workgroup takes at least (below one round: one round) */
} forge__pc_attention;
/* attention_decode.comp rotates one token's query itself (q from the raw q | k | v row), in
 * adjacent pairs, and takes the new key and value from that row too (writing them to the cache) */
#define FORGE__ATTN_ROPE_Q 4u
#define FORGE__ATTN_ROPE_ADJACENT 8u
#define FORGE__ATTN_ROPE_KEY 16u
/* ... and RMS-norms the query and key heads first (q_norm, k_norm), and the value head (no weight) */
#define FORGE__ATTN_QK_NORM 32u
#define FORGE__ATTN_V_NORM 64u
/* attention_decode merges its runs itself (the last workgroup of a head to finish), instead of
 * attention_combine after it; and writes row 0 as the o projection's int8 input too */
#define FORGE__ATTN_MERGE 128u
#define FORGE__ATTN_MERGE_Q8 256u
typedef struct forge__pc_combine {   /* attention_combine.comp */
    uint32_t n_heads, head_dim, n_splits;
    uint32_t flags;                 /* 1: row 0 also as int8 blocks (the o projection's act_q8) */
} forge__pc_combine;

#define FORGE__ATTN_SPLITS 64       /* workgroups per head of the decode attention (at most; forge__attn_splits) */
#define FORGE__ATTN_SPLITS_BATCH 16 /* ... per head and sequence of a batched decode step */
_Static_assert(FORGE__ATTN_SPLITS <= 64 && FORGE__ATTN_SPLITS_BATCH <= FORGE__ATTN_SPLITS, "attention_merge.glsl merges at most 64 splits");
#ifndef FORGE__ATTN_SPLITS_CPU
#define FORGE__ATTN_SPLITS_CPU 2    /* ... on CPU devices */
#endif
typedef struct forge__pc_act {      /* act_mul.comp, act_mul_back.comp */
    uint32_t count, act, layout, ffn;   /* layout: 1 gate|up pairs, 2 halves (gates, then ups), 3 apart */
    uint32_t up_stride, up_col0;        /* layout 3: the ups' rows in binding 2 */
} forge__pc_act;
#define FORGE__GU_PAIRS 1u
#define FORGE__GU_HALVES 2u
#define FORGE__GU_APART 3u
typedef struct forge__pc_moe_route { /* moe_route.comp */
    uint32_t n_experts, top_k, flags;   /* flags: 1 renormalize the chosen weights, 2 times expert_scale */
    uint32_t n_tokens;
} forge__pc_moe_route;
typedef struct forge__pc_moe_group { /* moe_group.comp */
    uint32_t n_pairs, n_experts, bm, order_off;
} forge__pc_moe_group;
typedef struct forge__pc_moe_combine { /* moe_combine.comp */
    uint32_t n_tokens, dim, top_k, flags; /* flags: 1 add to out */
} forge__pc_moe_combine;

/* The backward kernels (training) */
typedef struct forge__pc_back {     /* matmul_back.comp: C (+)= dY . W */
    uint32_t M, K, N, y_col0, ldy, ldc, c_col0, flags;
    uint32_t qbits, qgroup, qflags;
} forge__pc_back;
typedef struct forge__pc_gemm {     /* gemm.comp: C(m, n) (+)= alpha sum_k A(m, k) B(k, n), strided */
    uint32_t M, N, K;
    uint32_t a_off, a_sm, a_sk;
    uint32_t b_off, b_sk, b_sn;
    uint32_t c_off, c_sm, c_sn;
    float alpha;
    uint32_t accumulate;
    uint32_t drop_on, drop_ld, drop_stream, drop_threshold;
    float drop_scale;
    uint32_t splits, k_chunk, reduce;   /* split-K: partial sums per split, then a reduction */
} forge__pc_gemm;
typedef struct forge__pc_norm_back { /* rmsnorm_back.comp */
    uint32_t dim, flags;
    float eps;
    uint32_t heads, row_stride, col0;
} forge__pc_norm_back;
typedef struct forge__pc_rope_back { /* rope_back.comp */
    uint32_t n_tokens, n_heads, n_kv_heads, head_dim, adjacent, stride, k_off, seq_len;
} forge__pc_rope_back;
typedef struct forge__pc_attn_back { /* attention_back.comp */
    uint32_t n_tokens, n_heads, n_kv_heads, head_dim, window;
    float scale, softcap;
    uint32_t q_stride, k_off, v_off, kv_batch_stride, n_rows, mode;
} forge__pc_attn_back;
typedef struct forge__pc_loss {     /* loss.comp */
    uint32_t n, row0, rows, mode, flags;
    float softcap;
} forge__pc_loss;
typedef struct forge__pc_adamw {    /* adamw.comp */
    uint32_t count, mode, part0, n_parts;
} forge__pc_adamw;
#define FORGE__ADAMW_PER_WG 4096    /* adamw.comp PER_WG: elements summed per workgroup (mode 0) */
typedef struct forge__pc_merge {    /* lora_merge.comp */
    uint32_t K, n_elems, chunk_row0, t_row0, t_rows, row_step, row_phase, rank, a_el, b_el, fmt;
    float scale;
} forge__pc_merge;

#define FORGE__LINEAR_BIAS 1u
#define FORGE__LINEAR_ACCUMULATE 2u
#define FORGE__LINEAR_SOFTCAP 4u
#define FORGE__LINEAR_PRENORM 8u    /* matvec_sg: RMS-normalize A first (the block's norm fused in) */
#define FORGE__LINEAR_GATED 16u     /* matvec_sg: interleaved gate/up rows, output act(gate) * up */
#define FORGE__LINEAR_GELU 32u      /* with GATED: GELU-tanh instead of SiLU */
#define FORGE__LINEAR_SPLIT_K 64u   /* matmul: one split of k into partial sums (batch decode) */
#define FORGE__LINEAR_Q8_OUT 128u    /* forge__linear_q8a: also quantize the output row for the next product (the _out modules) */
#define FORGE__LINEAR_QUANTIZED 256u /* forge__linear (host only): x is already in p->act_q8 (the attention's merge wrote it) */
#define FORGE__LINEAR_EXPERTS 512u   /* matvec_sg: one expert's product per (token, choice) pair (workgroup z) */
#define FORGE__LINEAR_Q8_OUT_NORM 1024u /* matvec_q8a with Q8_OUT: the output times the next norm's weight, with its squares */
#define FORGE__LINEAR_QUANTIZED_RES 2048u /* forge__linear_q8a (host only): x (normed) is in p->act_q8_res (a product's Q8_OUT wrote it) */
#define FORGE__LINEAR_A_G8 4096u     /* forge__linear_q8a (host only): the int8 activations come in groups of 8 (a product's
                                      * Q8_OUT wrote them): the matvec_q8a_g8 modules */

/* Weight storage formats the matrix kernels read, dequantizing in the kernel; one kernel
 * variant each (kernels/weights.glsl). */
typedef enum forge__wfmt {
    FORGE__W_F32 = 0, FORGE__W_F16, FORGE__W_BF16,
    FORGE__W_Q4_0, FORGE__W_Q8_0, FORGE__W_Q4_K, FORGE__W_Q6_K, /* llama.cpp blocks */
    FORGE__W_MLX,                                                 /* MLX affine, bits and group per weight */
    FORGE__W_COUNT
} forge__wfmt;
/* The tensor type each format stores as it is in the file (MLX affine: codes with separate
 * scales and biases, no one type) */
static const forge__dtype forge__wfmt_dtype[FORGE__W_COUNT] = {
    [FORGE__W_F32] = FORGE__F32,   [FORGE__W_F16] = FORGE__F16,   [FORGE__W_BF16] = FORGE__BF16, [FORGE__W_Q4_0] = FORGE__Q4_0,
    [FORGE__W_Q8_0] = FORGE__Q8_0, [FORGE__W_Q4_K] = FORGE__Q4_K, [FORGE__W_Q6_K] = FORGE__Q6_K, [FORGE__W_MLX] = FORGE__DTYPE_INVALID};

typedef enum forge__op {
    FORGE__OP_EMBED,                                   /* + forge__wfmt */
    FORGE__OP_MATVEC = FORGE__OP_EMBED + FORGE__W_COUNT,
    FORGE__OP_MATVEC_SG = FORGE__OP_MATVEC + FORGE__W_COUNT,
    FORGE__OP_MATMUL = FORGE__OP_MATVEC_SG + FORGE__W_COUNT,
    FORGE__OP_MATMUL_BIG = FORGE__OP_MATMUL + FORGE__W_COUNT,  /* 128 x 128 tiles, for products that fill the device */
    FORGE__OP_MATMUL_CM = FORGE__OP_MATMUL_BIG + FORGE__W_COUNT, /* tensor cores (VK_NV_cooperative_matrix) */
    FORGE__OP_MATMUL_S = FORGE__OP_MATMUL_CM + FORGE__W_COUNT,   /* 32 x 128 tiles, for batch decode's few rows */
    FORGE__OP_MATMUL_MOE = FORGE__OP_MATMUL_S + FORGE__W_COUNT,  /* experts' products grouped by expert (moe_group.comp's tiles) */
    FORGE__OP_MATMUL_CM_S = FORGE__OP_MATMUL_MOE + FORGE__W_COUNT, /* tensor cores, <= 32 rows of f16 weights: batch decode */
    /* matvec_sg with a post-attention norm added to its input first (F32, F16, BF16: + forge__wfmt) */
    FORGE__OP_MATVEC_SG_POST,
    FORGE__OP_MATVEC_SG_POST_LAST = FORGE__OP_MATVEC_SG_POST + FORGE__W_BF16,
    /* ... with two rows a subgroup (F32, F16, BF16: + forge__wfmt), forge__matvec_pairs */
    FORGE__OP_MATVEC_SG_PAIR,
    FORGE__OP_MATVEC_SG_PAIR_LAST = FORGE__OP_MATVEC_SG_PAIR + FORGE__W_BF16,
    /* decode products of Q4_0 (+ 0) or Q8_0 (+ 4) weights on int8 activations (integer dot
     * products); in a layer's chain (forge__q8_chain) + 2: on a product's activations in groups of
     * 8 (FORGE__LINEAR_A_G8), + 1: quantizing the output for the next product (FORGE__LINEAR_Q8_OUT);
     * + 8: gated, two outputs a subgroup (forge__matvec_pairs) */
    FORGE__OP_MATVEC_Q8A,
    FORGE__OP_MATVEC_Q8A_LAST = FORGE__OP_MATVEC_Q8A + 15,
    FORGE__OP_RMSNORM,
    FORGE__OP_ROPE,
    FORGE__OP_ATTENTION,          /* prefill: tiles of 8 queries x 16 keys */
    FORGE__OP_ATTN_SPLIT,         /* decode: keys split over workgroups (devices without subgroup arithmetic) */
    FORGE__OP_ATTN_DECODE,        /* ... the same on subgroups */
    FORGE__OP_ATTN_COMBINE,
    FORGE__OP_ACT_MUL,
    FORGE__OP_PENALTY,
    FORGE__OP_TOPK,
    FORGE__OP_TOPK_MERGE,
    FORGE__OP_ACT_Q8,             /* one token's activations as int8 blocks, matvec_q8a's input */
    FORGE__OP_ACT_F16,            /* rows of activations in f16, matmul_cm's input */
    FORGE__OP_ATTN_CM,            /* prefill attention on tensor cores, heads of 64 (+ 1: 128, + 2: 256) over an f16 cache */
    FORGE__OP_ATTN_CM_128,
    FORGE__OP_ATTN_CM_256,
    FORGE__OP_LINEAR_REDUCE,      /* a product split along k: the partial sums added up, then the epilogue */
    FORGE__OP_ROPE_KV16,          /* rope and the attention kernels on an f16 KV cache (forge_session_params.kv_type) */
    FORGE__OP_ATTENTION_KV16,
    FORGE__OP_ATTN_SPLIT_KV16,
    FORGE__OP_ATTN_DECODE_KV16,
    FORGE__OP_ROPE_SHIFT_KV16,    /* the context shift's re-rotation of an f16 K cache (rope_back.comp) */
    FORGE__OP_MOE_ROUTE,          /* mixture of experts: each token's experts and weights, */
    FORGE__OP_MOE_GROUP,          /* the prefill's pairs grouped by expert, */
    FORGE__OP_MOE_COMBINE,        /* and the experts' outputs weighted and summed */
    /* training: the backward twins and the optimizer */
    FORGE__OP_MATMUL_BACK,                             /* + forge__wfmt */
    FORGE__OP_MATMUL_BACK_BIG = FORGE__OP_MATMUL_BACK + FORGE__W_COUNT, /* 128 x 128 tiles */
    FORGE__OP_GEMM = FORGE__OP_MATMUL_BACK_BIG + FORGE__W_COUNT,
    FORGE__OP_RMSNORM_BACK,
    FORGE__OP_ROPE_BACK,
    FORGE__OP_ATTN_BACK,
    FORGE__OP_ACT_MUL_BACK,
    FORGE__OP_LOSS,
    FORGE__OP_ADAMW,
    FORGE__OP_LORA_MERGE,                              /* an adapter folded into float weights at load */
    FORGE__OP_COUNT
} forge__op;

typedef struct forge__op_desc {
    const char *name;
    const uint32_t *spv;
    size_t spv_bytes;
    uint32_t n_bindings;
    uint32_t push_bytes;
    uint32_t n_spec;
    uint32_t spec[3];      /* constant_id 0, 1, 2: pinned, never left to GLSL defaults */
    bool per_subgroup;     /* matvec_sg, matvec_q8a: spec[0] = FORGE__SG_PER_WG subgroups at the device's width */
    bool per_head_dim;     /* attention kernels: spec[0] = DMAX, the model's head_dim rounded up to 8 */
    bool sg_width;         /* spec[1] = the device's subgroup width */
} forge__op_desc;

/* matvec_sg: FORGE__SG_PER_WG subgroups per workgroup, one output each at a time */
#define FORGE__SG_PER_WG 8

#define FORGE__BIG_TILES_MIN 256    /* matmul_big once it has this many 128 x 128 tiles */

#define FORGE__SPV(name) forge_spv_##name, sizeof forge_spv_##name
#define FORGE__MATVEC_WG 128
#define FORGE__MATVEC_ROWS 1

/* matvec_sg with one token on a GPU (kernels/matvec_sg.comp says how each mapping works):
 * the K split for long rows (K >= 8192, or K >= 4096 with more outputs than K) of block
 * formats; one output per subgroup otherwise, and always for plain formats (F32, F16, BF16)
 * and on CPU devices (lavapipe: 60 tok/s on stories260K against 42 split). Measured per
 * product on the H100 (bench/RESULTS.md, one output per subgroup -> split, us, before Q4_0's
 * paired reads): Q4_0 4096 x 14336 51.4 -> 45.3, 6144 x 4096 39.0 -> 27.4, 128256 x 4096 373
 * -> 321, but 4096 x 4096 18.0 -> 20.2, F16 8192 x 2048 33.5 -> 42.8 and the F16 128256 x 2048
 * head 223 -> 292. With K = 2048 Q4_0's paired reads (16 weights a lane) leave half of a split
 * workgroup idle: its 128256 x 2048 head took 243 us split. Once one output per subgroup kept
 * four steps of k in flight (MV_STEPS) the F16 2048 x 8192 product took 21.2 us against 27.7
 * split (and the Llama-3.2-1B F16 decode 527 tok/s against 493). */
static bool forge__matvec_use_split(bool cpu, forge__wfmt fmt, uint32_t M, uint32_t outs, uint32_t K) {
    /* (the plain formats' matvec_sg modules are built without the split: kernels.list MV_NO_SPLIT) */
    if (M != 1 || cpu || fmt == FORGE__W_F32 || fmt == FORGE__W_F16 || fmt == FORGE__W_BF16) return false;
    return K >= 8192 || (K >= 4096 && outs > K);
}
/* Outputs per workgroup in the split: up to 8, fewer where that leaves under 1024 workgroups
 * (so a 2048-output product still fills a large GPU). */
static uint32_t forge__matvec_split_rows(uint32_t outs) {
    uint32_t r = 8;
    while (r > 1 && outs / r < 1024) r >>= 1;
    return r;
}
static uint32_t forge__matvec_rows_per_wg(bool sg, uint32_t split_rows) {
    return !sg ? FORGE__MATVEC_ROWS : split_rows ? split_rows : FORGE__SG_PER_WG;
}

/* matmul_cm exists where glslang knew GL_NV_cooperative_matrix (tools/build_kernels.sh) */
#if FORGE_SPV_HAVE_NV_COOPERATIVE_MATRIX
#define FORGE__CM_OP(FMT, name) \
    [FORGE__OP_MATMUL_CM + FMT] = {"matmul_cm_" #name, FORGE__SPV(matmul_cm_##name), 6, sizeof(forge__pc_linear), 0, {0}},
#define FORGE__CM_S_OP \
    [FORGE__OP_MATMUL_CM_S] = {"matmul_cm_s_f16", FORGE__SPV(matmul_cm_s_f16), 6, sizeof(forge__pc_linear), 0, {0}}, \
    [FORGE__OP_ACT_F16] = {"act_f16", FORGE__SPV(act_f16), 2, sizeof(forge__pc_act_f16), 0, {0}}, \
    [FORGE__OP_ATTN_CM] = {"attention_cm_d64", FORGE__SPV(attention_cm_d64), 6, sizeof(forge__pc_attention), 0, {0}}, \
    [FORGE__OP_ATTN_CM_128] = {"attention_cm_d128", FORGE__SPV(attention_cm_d128), 6, sizeof(forge__pc_attention), 0, {0}}, \
    [FORGE__OP_ATTN_CM_256] = {"attention_cm_d256", FORGE__SPV(attention_cm_d256), 6, sizeof(forge__pc_attention), 0, {0}},
#else
#define FORGE__CM_S_OP
#define FORGE__CM_OP(FMT, name)
#endif
/* the kernels of one weight format: embedding gather, matvec (two), matmul (two) */
#define FORGE__WEIGHT_OPS(FMT, name)                                                                                  \
    [FORGE__OP_EMBED + FMT] = {"embed_" #name, FORGE__SPV(embed_##name), 5, sizeof(forge__pc_embed), 0, {0}},          \
    [FORGE__OP_MATVEC + FMT] = {"matvec_" #name, FORGE__SPV(matvec_##name), 6, sizeof(forge__pc_linear), 2,             \
                                {FORGE__MATVEC_WG, FORGE__MATVEC_ROWS}},                                              \
    [FORGE__OP_MATVEC_SG + FMT] = {"matvec_sg_" #name, FORGE__SPV(matvec_sg_##name), 8, sizeof(forge__pc_linear), 2,       \
                                   {0, FORGE__SG_PER_WG}, true},                                                        \
    [FORGE__OP_MATMUL_MOE + FMT] = {"matmul_moe_" #name, FORGE__SPV(matmul_moe_##name), 7, sizeof(forge__pc_linear), 0, {0}},  \
    [FORGE__OP_MATMUL + FMT] = {"matmul_" #name, FORGE__SPV(matmul_##name), 6, sizeof(forge__pc_linear), 0, {0}},              \
    [FORGE__OP_MATMUL_BIG + FMT] = {"matmul_big_" #name, FORGE__SPV(matmul_big_##name), 6, sizeof(forge__pc_linear), 0, {0}},  \
    [FORGE__OP_MATMUL_S + FMT] = {"matmul_s_" #name, FORGE__SPV(matmul_s_##name), 6, sizeof(forge__pc_linear), 0, {0}},  \
    [FORGE__OP_MATMUL_BACK + FMT] = {"matmul_back_" #name, FORGE__SPV(matmul_back_##name), 5, sizeof(forge__pc_back), 0, {0}},  \
    [FORGE__OP_MATMUL_BACK_BIG + FMT] = {"matmul_back_big_" #name, FORGE__SPV(matmul_back_big_##name), 5, sizeof(forge__pc_back), 0, {0}}, \
    FORGE__CM_OP(FMT, name)
static const forge__op_desc forge__ops[FORGE__OP_COUNT] = {
    FORGE__WEIGHT_OPS(FORGE__W_F32, f32)
    FORGE__WEIGHT_OPS(FORGE__W_F16, f16)
    FORGE__WEIGHT_OPS(FORGE__W_BF16, bf16)
    FORGE__WEIGHT_OPS(FORGE__W_Q4_0, q4_0)
    FORGE__WEIGHT_OPS(FORGE__W_Q8_0, q8_0)
    FORGE__WEIGHT_OPS(FORGE__W_Q4_K, q4_k)
    FORGE__WEIGHT_OPS(FORGE__W_Q6_K, q6_k)
    FORGE__WEIGHT_OPS(FORGE__W_MLX, mlx)
    FORGE__CM_S_OP
#define FORGE__Q8A_OP(i, name) \
    [FORGE__OP_MATVEC_Q8A + (i)] = {"matvec_q8a_" #name, FORGE__SPV(matvec_q8a_##name), 6, sizeof(forge__pc_linear), 3, {0, FORGE__SG_PER_WG, 0}, true}, \
    [FORGE__OP_MATVEC_Q8A + 8 + (i)] = {"matvec_q8a_pair_" #name, FORGE__SPV(matvec_q8a_##name), 6, sizeof(forge__pc_linear), 3,   \
                                        {0, 2 * FORGE__SG_PER_WG, 1}, true},
    FORGE__Q8A_OP(0, q4_0) FORGE__Q8A_OP(1, out_q4_0) FORGE__Q8A_OP(2, g8_q4_0) FORGE__Q8A_OP(3, g8_out_q4_0)
    FORGE__Q8A_OP(4, q8_0) FORGE__Q8A_OP(5, out_q8_0) FORGE__Q8A_OP(6, g8_q8_0) FORGE__Q8A_OP(7, g8_out_q8_0)
    [FORGE__OP_ACT_Q8] = {"act_q8", FORGE__SPV(act_q8), 3, sizeof(forge__pc_act_q8), 0, {0}},
    [FORGE__OP_LINEAR_REDUCE] = {"linear_reduce", FORGE__SPV(linear_reduce), 4, sizeof(forge__pc_linear), 0, {0}},
    [FORGE__OP_MATVEC_SG_POST] = {"matvec_sg_post_f32", FORGE__SPV(matvec_sg_post_f32), 11, sizeof(forge__pc_linear), 2, {0, FORGE__SG_PER_WG}, true},
    [FORGE__OP_MATVEC_SG_POST + 1] = {"matvec_sg_post_f16", FORGE__SPV(matvec_sg_post_f16), 11, sizeof(forge__pc_linear), 2, {0, FORGE__SG_PER_WG},
                                      true},
    [FORGE__OP_MATVEC_SG_POST + 2] = {"matvec_sg_post_bf16", FORGE__SPV(matvec_sg_post_bf16), 11, sizeof(forge__pc_linear), 2, {0, FORGE__SG_PER_WG},
                                      true},
    [FORGE__OP_MATVEC_SG_PAIR] = {"matvec_sg_pair_f32", FORGE__SPV(matvec_sg_pair_f32), 8, sizeof(forge__pc_linear), 2, {0, FORGE__SG_PER_WG}, true},
    [FORGE__OP_MATVEC_SG_PAIR + 1] = {"matvec_sg_pair_f16", FORGE__SPV(matvec_sg_pair_f16), 8, sizeof(forge__pc_linear), 2, {0, FORGE__SG_PER_WG},
                                      true},
    [FORGE__OP_MATVEC_SG_PAIR + 2] = {"matvec_sg_pair_bf16", FORGE__SPV(matvec_sg_pair_bf16), 8, sizeof(forge__pc_linear), 2, {0, FORGE__SG_PER_WG},
                                      true},
    [FORGE__OP_RMSNORM] = {"rmsnorm", FORGE__SPV(rmsnorm), 4, sizeof(forge__pc_rmsnorm), 0, {0}},
    [FORGE__OP_ROPE] = {"rope", FORGE__SPV(rope), 5, sizeof(forge__pc_rope), 0, {0}},
    [FORGE__OP_ATTENTION] = {"attention_tiled", FORGE__SPV(attention_tiled), 6, sizeof(forge__pc_attention), 1, {256}, false, true},
    [FORGE__OP_ATTN_SPLIT] = {"attention_split", FORGE__SPV(attention_split), 5, sizeof(forge__pc_attention), 1, {256}, false, true},
    [FORGE__OP_ATTN_DECODE] = {"attention_decode", FORGE__SPV(attention_decode), 13, sizeof(forge__pc_attention), 2, {256, 32}, false, true, true},
    [FORGE__OP_ROPE_KV16] = {"rope_kv16", FORGE__SPV(rope_kv16), 5, sizeof(forge__pc_rope), 0, {0}},
    [FORGE__OP_ATTENTION_KV16] = {"attention_tiled_kv16", FORGE__SPV(attention_tiled_kv16), 6, sizeof(forge__pc_attention), 1, {256}, false, true},
    [FORGE__OP_ATTN_SPLIT_KV16] = {"attention_split_kv16", FORGE__SPV(attention_split_kv16), 5, sizeof(forge__pc_attention), 1, {256}, false,
                                   true},
    [FORGE__OP_ATTN_DECODE_KV16] = {"attention_decode_kv16", FORGE__SPV(attention_decode_kv16), 13, sizeof(forge__pc_attention), 2, {256, 32},
                                    false, true, true},
    [FORGE__OP_ROPE_SHIFT_KV16] = {"rope_shift_kv16", FORGE__SPV(rope_shift_kv16), 3, sizeof(forge__pc_rope_back), 0, {0}},
    [FORGE__OP_ATTN_COMBINE] = {"attention_combine", FORGE__SPV(attention_combine), 3, sizeof(forge__pc_combine), 0, {0}},
    [FORGE__OP_ACT_MUL] = {"act_mul", FORGE__SPV(act_mul), 3, sizeof(forge__pc_act), 0, {0}},
    [FORGE__OP_MOE_ROUTE] = {"moe_route", FORGE__SPV(moe_route), 3, sizeof(forge__pc_moe_route), 0, {0}},
    [FORGE__OP_MOE_GROUP] = {"moe_group", FORGE__SPV(moe_group), 2, sizeof(forge__pc_moe_group), 0, {0}},
    [FORGE__OP_MOE_COMBINE] = {"moe_combine", FORGE__SPV(moe_combine), 3, sizeof(forge__pc_moe_combine), 0, {0}},
    [FORGE__OP_PENALTY] = {"penalty", FORGE__SPV(penalty), 3, 4, 0, {0}},
    [FORGE__OP_TOPK] = {"topk", FORGE__SPV(topk), 4, 12, 0, {0}},
    [FORGE__OP_TOPK_MERGE] = {"topk_merge", FORGE__SPV(topk_merge), 4, 12, 0, {0}},
    [FORGE__OP_GEMM] = {"gemm", FORGE__SPV(gemm), 5, sizeof(forge__pc_gemm), 0, {0}},
    [FORGE__OP_RMSNORM_BACK] = {"rmsnorm_back", FORGE__SPV(rmsnorm_back), 4, sizeof(forge__pc_norm_back), 0, {0}},
    [FORGE__OP_ROPE_BACK] = {"rope_back", FORGE__SPV(rope_back), 3, sizeof(forge__pc_rope_back), 0, {0}},
    [FORGE__OP_ATTN_BACK] = {"attention_back", FORGE__SPV(attention_back), 7, sizeof(forge__pc_attn_back), 1, {256}, false, true},
    [FORGE__OP_ACT_MUL_BACK] = {"act_mul_back", FORGE__SPV(act_mul_back), 3, sizeof(forge__pc_act), 0, {0}},
    [FORGE__OP_LOSS] = {"loss", FORGE__SPV(loss), 4, sizeof(forge__pc_loss), 0, {0}},
    [FORGE__OP_ADAMW] = {"adamw", FORGE__SPV(adamw), 6, sizeof(forge__pc_adamw), 0, {0}},
    [FORGE__OP_LORA_MERGE] = {"lora_merge", FORGE__SPV(lora_merge), 3, sizeof(forge__pc_merge), 0, {0}},
};
#define FORGE__MAX_BINDINGS 13 /* attention_decode's */
#define FORGE__MATVEC_MAX_M 8     /* matvec.comp MAX_M: more rows of A go to matmul */

/* Bits per weight of a format, times 16 (Q4_0: 18 bytes a block of 32 = 4.5 bits, 72); MLX
 * affine: `bits` plus an f16 scale and bias per group. For the profile's GB/s. */
static uint32_t forge__bits16(forge__wfmt f, uint32_t mlx_bits, uint32_t mlx_group) {
    if (f == FORGE__W_MLX) /* the codes, and an f16 scale and bias per group */
        return mlx_group ? 16 * mlx_bits + 512 / mlx_group : 16 * mlx_bits;
    forge__dtype_traits t = forge__dtype_info(forge__wfmt_dtype[f]);
    return 128 * t.block_bytes / t.block;
}

/* One matrix product dispatch, for the profile: C [M, N] from A [M, K] and weights [N, K] of
 * bits16 / 16 bits each. */
typedef struct forge__mat_work {
    uint32_t N, K, M, bits16;
    uint32_t mats;           /* weight matrices of N x K read (an expert product: one per chosen expert) */
} forge__mat_work;

typedef struct forge__pipeline {
    VkDescriptorSetLayout dsl;
    VkPipelineLayout layout;
    VkPipeline pipe;
} forge__pipeline;

/* Queries per workgroup of attention_tiled.comp, as its DMAX specialization picks them. */
static uint32_t forge__attn_block_queries(uint32_t dmax) { return dmax > 256 ? 4 : 8; }

/* dmax: the head_dim the attention kernels are specialized for (0: 256). */
static forge_status forge__pipeline_create(forge__device *d, const forge__op_desc *op, uint32_t dmax, forge__pipeline *p, forge__err *err) {
    VkDescriptorSetLayoutBinding b[FORGE__MAX_BINDINGS];
    for (uint32_t i = 0; i < op->n_bindings; i++)
        b[i] = (VkDescriptorSetLayoutBinding){.binding = i, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                              .descriptorCount = 1, .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    VkDescriptorSetLayoutCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                           .bindingCount = op->n_bindings, .pBindings = b};
    VkResult r = d->vk.vkCreateDescriptorSetLayout(d->dev, &dci, NULL, &p->dsl);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "kernel %s: vkCreateDescriptorSetLayout failed (%d)", op->name, (int)r);
    VkPushConstantRange pcr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .offset = 0, .size = op->push_bytes};
    VkPipelineLayoutCreateInfo lci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, .setLayoutCount = 1,
                                      .pSetLayouts = &p->dsl, .pushConstantRangeCount = 1, .pPushConstantRanges = &pcr};
    r = d->vk.vkCreatePipelineLayout(d->dev, &lci, NULL, &p->layout);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "kernel %s: vkCreatePipelineLayout failed (%d)", op->name, (int)r);
    VkShaderModuleCreateInfo sci = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = op->spv_bytes, .pCode = op->spv};
    VkShaderModule mod;
    r = d->vk.vkCreateShaderModule(d->dev, &sci, NULL, &mod);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "kernel %s: vkCreateShaderModule failed (%d)", op->name, (int)r);
    VkSpecializationMapEntry me[3] = {{0, 0, 4}, {1, 4, 4}, {2, 8, 4}};
    uint32_t spec[3] = {op->spec[0], op->spec[1], op->spec[2]};
    if (op->per_subgroup) spec[0] = FORGE__SG_PER_WG * d->caps.subgroup_size;
    if (op->per_head_dim && dmax) spec[0] = dmax;
    if (op->sg_width) spec[1] = d->caps.subgroup_size;
    VkSpecializationInfo si = {.mapEntryCount = op->n_spec, .pMapEntries = me, .dataSize = 4u * op->n_spec, .pData = spec};
    VkComputePipelineCreateInfo pci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = mod, .pName = "main", .pSpecializationInfo = op->n_spec ? &si : NULL},
        .layout = p->layout};
    r = d->vk.vkCreateComputePipelines(d->dev, VK_NULL_HANDLE, 1, &pci, NULL, &p->pipe);
    d->vk.vkDestroyShaderModule(d->dev, mod, NULL);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "kernel %s: vkCreateComputePipelines failed (%d)", op->name, (int)r);
    return FORGE_OK;
}

static void forge__pipeline_destroy(forge__device *d, forge__pipeline *p) {
    if (p->pipe) d->vk.vkDestroyPipeline(d->dev, p->pipe, NULL);
    if (p->layout) d->vk.vkDestroyPipelineLayout(d->dev, p->layout, NULL);
    if (p->dsl) d->vk.vkDestroyDescriptorSetLayout(d->dev, p->dsl, NULL);
    memset(p, 0, sizeof *p);
}

/* A command buffer being recorded (or counted). */
typedef struct forge__rec {
    forge__device *dev;
    forge__pipeline *pipes;        /* the model's table, FORGE__OP_COUNT entries */
    uint32_t dmax;                 /* the attention kernels' head_dim specialization (the model's, rounded up to 8); 0: 256 */
    pthread_mutex_t *pipe_lock;
    VkCommandBuffer cb;
    VkDescriptorPool pool;
    bool counting;
    uint32_t n_descriptors, n_dispatches;   /* one descriptor set per dispatch */
    VkQueryPool qpool;             /* profiling: a timestamp after each dispatch */
    uint16_t *ops;                 /* profiling: the op of each dispatch, in order */
    forge__mat_work *shapes;       /* profiling: each dispatch's matrix product (N 0: none) */
    bool fenced;                   /* a barrier and nothing after it yet: another one would be redundant */
    forge_status st;
    forge__err *err;
} forge__rec;

static forge__pipeline *forge__get_pipeline(forge__rec *r, forge__op op) {
    forge__pipeline *p = &r->pipes[op];
    if (p->pipe) return p;
    pthread_mutex_lock(r->pipe_lock);
    if (!p->pipe) {
        forge__pipeline np = {0};
        forge_status st = forge__pipeline_create(r->dev, &forge__ops[op], r->dmax, &np, r->err);
        if (st) {
            forge__pipeline_destroy(r->dev, &np);
            r->st = st;
        } else {
            *p = np;
        }
    }
    pthread_mutex_unlock(r->pipe_lock);
    return p->pipe ? p : NULL;
}

/* Splits a 1-D workgroup count over x and y (at most 65535 per dimension). */
static void forge__grid(uint64_t groups, uint32_t *gx, uint32_t *gy) {
    if (groups == 0) groups = 1;
    *gx = (uint32_t)FORGE__MIN(groups, 65535u);
    *gy = (uint32_t)((groups + *gx - 1) / *gx);
}

static void forge__dispatch(forge__rec *r, forge__op op, const forge__range *binds, const void *push, uint32_t gx,
                            uint32_t gy, uint32_t gz) {
    if (r->st) return;
    const forge__op_desc *desc = &forge__ops[op];
    forge__pipeline *p = forge__get_pipeline(r, op);
    if (!p) return;
    r->n_dispatches++;
    if (r->counting) {
        r->n_descriptors += desc->n_bindings;
        return;
    }
    VkDescriptorSet set;
    VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, .descriptorPool = r->pool,
                                      .descriptorSetCount = 1, .pSetLayouts = &p->dsl};
    VkResult vr = r->dev->vk.vkAllocateDescriptorSets(r->dev->dev, &ai, &set);
    if (vr != VK_SUCCESS) {
        r->st = forge__fail(r->err, FORGE_ERR_DEVICE, "vkAllocateDescriptorSets failed (%d)", (int)vr);
        return;
    }
    VkDescriptorBufferInfo bi[FORGE__MAX_BINDINGS];
    VkWriteDescriptorSet w[FORGE__MAX_BINDINGS];
    for (uint32_t i = 0; i < desc->n_bindings; i++) {
        bi[i] = (VkDescriptorBufferInfo){binds[i].buf, binds[i].offset, binds[i].size};
        w[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = set, .dstBinding = i,
                                      .descriptorCount = 1, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                      .pBufferInfo = &bi[i]};
    }
    r->dev->vk.vkUpdateDescriptorSets(r->dev->dev, desc->n_bindings, w, 0, NULL);
    r->dev->vk.vkCmdBindPipeline(r->cb, VK_PIPELINE_BIND_POINT_COMPUTE, p->pipe);
    r->dev->vk.vkCmdBindDescriptorSets(r->cb, VK_PIPELINE_BIND_POINT_COMPUTE, p->layout, 0, 1, &set, 0, NULL);
    r->dev->vk.vkCmdPushConstants(r->cb, p->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, desc->push_bytes, push);
    r->dev->vk.vkCmdDispatch(r->cb, gx, gy, gz);
    r->fenced = false;
    if (r->qpool) {
        r->ops[r->n_dispatches - 1] = (uint16_t)op;
        forge__mat_work *w = &r->shapes[r->n_dispatches - 1];
        if (op >= FORGE__OP_MATVEC && op < FORGE__OP_RMSNORM) {
            const forge__pc_linear *pl = (const forge__pc_linear *)push;
            forge__wfmt f = op >= FORGE__OP_MATVEC_Q8A ? ((op - FORGE__OP_MATVEC_Q8A) & 4 ? FORGE__W_Q8_0 : FORGE__W_Q4_0)
                          : op >= FORGE__OP_MATVEC_SG_PAIR ? (forge__wfmt)(op - FORGE__OP_MATVEC_SG_PAIR)
                          : op >= FORGE__OP_MATVEC_SG_POST ? (forge__wfmt)(op - FORGE__OP_MATVEC_SG_POST)
                                                            : (forge__wfmt)((op - FORGE__OP_MATVEC) % FORGE__W_COUNT);
            /* a gated product's N counts outputs, each from two rows (gate and up) of the weight */
            uint32_t rows = pl->flags & FORGE__LINEAR_GATED ? 2 * pl->N : pl->N;
            /* expert products (the shape is one expert's): decode reads the expert of each pair
             * (workgroup z); prefill's grouped product every expert of the chunk that has pairs
             * (at most the pairs) */
            uint32_t M = pl->M, mats = 1;
            if (pl->flags & FORGE__LINEAR_EXPERTS) M = mats = gz;
            else if (op >= FORGE__OP_MATMUL_MOE && op < FORGE__OP_MATMUL_MOE + FORGE__W_COUNT) mats = FORGE__MIN(pl->n_exp, pl->M);
            *w = (forge__mat_work){rows, pl->K, M, forge__bits16(f, pl->qbits, pl->qgroup), mats};
        } else if (op >= FORGE__OP_MATMUL_BACK && op < FORGE__OP_GEMM) { /* both tile sizes */
            const forge__pc_back *pb = (const forge__pc_back *)push;
            *w = (forge__mat_work){pb->N, pb->K, pb->M,
                                   forge__bits16((forge__wfmt)((op - FORGE__OP_MATMUL_BACK) % FORGE__W_COUNT), pb->qbits, pb->qgroup), 1};
        }
        r->dev->vk.vkCmdWriteTimestamp(r->cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, r->qpool, r->n_dispatches);
    }
}

/* Makes every earlier shader write visible to later shader reads and writes. */
static void forge__barrier(forge__rec *r) {
    if (r->st || r->counting || r->fenced) return;
    r->fenced = true;
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT};
    r->dev->vk.vkCmdPipelineBarrier(r->cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                                    VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0,
                                    NULL, 0, NULL);
}

/* Makes transfer writes visible to the host once the submission's fence signals. */
static void forge__host_barrier(forge__rec *r) {
    if (r->st || r->counting) return;
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
    r->dev->vk.vkCmdPipelineBarrier(r->cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
}

static void forge__copy(forge__rec *r, forge__range src, forge__range dst, uint64_t bytes) {
    if (r->st || r->counting || !bytes) return;
    r->fenced = false;
    VkBufferCopy c = {src.offset, dst.offset, bytes};
    r->dev->vk.vkCmdCopyBuffer(r->cb, src.buf, dst.buf, 1, &c);
}

/* =======================================================================================
 * 6. Models
 * From the tensor table and the config to weights on the device. Each weight is looked up by
 * its role under the format's naming convention (HF or llama.cpp), its shape and dtype are
 * checked against the config, and it is split by rows into chunks that fit one binding.
 * All chunks are packed into at most max_alloc-sized blocks (the model's memory plan), then
 * copied through a staging buffer (or written in place on devices whose memory the host sees).
 * ===================================================================================== */

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
} forge__layer;

/* ---- LoRA adapters ----
 * An adapted projection computes y = x W^T + scale * (x A^T) B^T beside its frozen weight W.
 * The targets are named as HF names the projections; one pair of f32 matrices per (layer,
 * target). The model holds one set for inference (forge_model_params.adapter_path); a trainer
 * holds its own, with gradients and optimizer state at the same offsets (section 13). */

typedef enum forge__target {
    FORGE__T_Q, FORGE__T_K, FORGE__T_V, FORGE__T_O, FORGE__T_GATE, FORGE__T_UP, FORGE__T_DOWN, FORGE__T_COUNT
} forge__target;

static const char *const forge__target_names[FORGE__T_COUNT] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                                "gate_proj", "up_proj", "down_proj"};
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

struct forge__loader;
static forge_status forge__model_adapter(struct forge__loader *L, const char *dir); /* section 13 */
static forge_status forge__model_merge_adapter(forge_model *m);                    /* section 13 */
struct forge__adapter_host;
static uint64_t forge__model_fingerprint(const forge_model *m);                    /* section 14 */
static uint64_t forge__adapter_identity(const forge__config *c, const struct forge__adapter_host *ah); /* section 14 */

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
     * block, as llama.cpp's quantized products round them). Not on CPU devices, whose f32
     * path is the one the parity tests hold at 1e-4. Set at load; tests may switch it. */
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
    /* The decode attention on subgroups (attention_decode.comp) where the device has subgroup
     * arithmetic at a width of 4 to 64; else attention_split.comp. Set at load; tests may switch it. */
    bool attn_subgroups;
    const char *chat_template;    /* the checkpoint's Jinja chat template, NULL if none (recognition only) */
    bool exact;                   /* forge_model_params.exact: no fp16 rounding of activations (no tensor-core matmul) */
    forge__lora adapter;          /* forge_model_params.adapter_path, applied in every forward pass (none: no pairs) */
    char main_format[16];         /* storage format of most matrix elements ("f16", "q4_k", "mlx4"), for info */
    uint64_t fingerprint;         /* the config, tensor headers and a few weight bytes, hashed (section 14: state files) */
    uint64_t adapter_id;          /* the adapter's identity, hashed; 0: none (section 14) */
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
    snprintf(base, sizeof base, c->arch == FORGE__ARCH_QWEN3MOE ? "model.layers.%d.mlp." : "model.layers.%d.", l);
    snprintf(why_gu, sizeof why_gu, "%d experts x expert intermediate %u, hidden %u", E, I, H);
    snprintf(why_d, sizeof why_d, "%d experts x hidden %u, expert intermediate %u", E, H, I);
    forge__xpart *parts = (forge__xpart *)calloc(3 * (size_t)E, sizeof *parts);
    if (!parts) return forge__fail(&m->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    forge__xpart *gate = parts, *up = parts + E, *down = parts + 2 * E;
    forge__weight dg, du, dd;
    forge__wsrc sg, su, sd;
    const char *mlx_dir = c->arch == FORGE__ARCH_QWEN3MOE ? "switch_mlp" : "experts.switch_glu";
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
    for (int i = 0; i < half; i++) {
        float inv = i < rotating ? (float)(1.0 / pow(r->theta, (double)(2 * i) / (double)head_dim)) : 0.0f;
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

static forge_status forge__plan_model(forge__loader *L) {
    forge_model *m = L->m;
    const forge__config *c = &m->cfg;
    forge_status st = FORGE_OK;
    char why[160];
    snprintf(why, sizeof why, "vocab %d, hidden %d", c->n_vocab, c->hidden);
    if ((st = forge__plan_weight_role(L, &m->tok_embd, FORGE__R_EMBED, 0, (uint32_t)c->n_vocab, (uint32_t)c->hidden, why))) return st;
    if (!c->tied && (st = forge__plan_weight_role(L, &m->output, FORGE__R_OUTPUT, 0, (uint32_t)c->n_vocab, (uint32_t)c->hidden, why))) return st;
    float norm_add = c->norm_plus_one ? 1.0f : 0.0f;
    snprintf(why, sizeof why, "hidden %d", c->hidden);
    if ((st = forge__plan_vec_role(L, &m->output_norm, FORGE__R_OUT_NORM, 0, (uint32_t)c->hidden, true, norm_add, why))) return st;
    if (c->ple_dim && (st = forge__plan_ple(L))) return st;
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
        if (shared) { /* queries only: the keys and values are layer kv_source's */
            if ((st = forge__plan_weight_role(L, &ly->wq, FORGE__R_WQ, i, q_dim, H, why_q))) break;
        } else if ((st = forge__plan_qkv(L, ly, i, q_dim, kv_dim, H, why_q, why_kv))) {
            break;
        }
        if ((st = forge__plan_weight_role(L, &ly->wo, FORGE__R_WO, i, H, q_dim, why_o))) break;
        if (c->qkv_bias && (st = forge__plan_qkv_bias(L, ly, i, q_dim, kv_dim))) break;
        if (c->o_bias && (st = forge__plan_vec_role(L, &ly->bo, FORGE__R_BO, i, H, true, 0, why))) break;
        if (c->qk_norm) {
            if ((st = forge__plan_vec_role(L, &ly->q_norm, FORGE__R_Q_NORM, i, D, true, norm_add, why_hd))) break;
            if (!shared && (st = forge__plan_vec_role(L, &ly->k_norm, FORGE__R_K_NORM, i, D, true, norm_add, why_hd))) break;
        }
        if (c->sandwich_norms) {
            if ((st = forge__plan_vec_role(L, &ly->post_attn_norm, FORGE__R_POST_ATTN_NORM, i, H, true, norm_add, why))) break;
            if ((st = forge__plan_vec_role(L, &ly->post_ffn_norm, FORGE__R_POST_FFN_NORM, i, H, true, norm_add, why))) break;
        }
        if ((st = forge__plan_vec_role(L, &ly->ffn_norm, FORGE__R_FFN_NORM, i, H, true, norm_add, why))) break;
        /* the dense MLP: every layer but Qwen3-MoE's sparse ones (Gemma 4 runs it beside the experts) */
        ly->dense_mlp = !c->layer_moe[i] || c->router == FORGE__ROUTER_GEMMA4;
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

/* =======================================================================================
 * 7. Execution
 * A session owns the KV cache and the activations, all planned when it is created from
 * n_ctx, n_batch and n_outputs_max. One forward pass is recorded per shape (tokens in the
 * step, which rows produce logits); positions and token ids live in a small host-visible
 * buffer, so a recorded pass is replayed for every step of that shape: the decode step is
 * recorded once and then costs a submit and a readback of the logits.
 * ===================================================================================== */

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
    /* batch generation (section 10b): one sequence's prompt tokens (PREFILL) or one token of each
     * of n sequences (DECODE); each out row reduced as OUT_SAMPLE's row (candidates and normalizer
     * per row, at the row's temperature), or its logits read back (_LOGITS: the host's penalty) */
    FORGE__OUT_BATCH_PREFILL = 3, FORGE__OUT_BATCH_DECODE = 4, FORGE__OUT_BATCH_PREFILL_LOGITS = 5, FORGE__OUT_BATCH_DECODE_LOGITS = 6
} forge__out_mode;

#define FORGE__CANDIDATES 256          /* topk_merge.comp MAXC: candidates read back per token */
#define FORGE__TOPK_CHUNK 1024         /* topk.comp CHUNK */
#define FORGE__MAX_PENALTY_WINDOW 1024 /* penalty ids the io buffer holds */
#define FORGE__BATCH_MAX_SEQ 512       /* rows of batch generation's table, which fills the penalty ids' place */

/* Device time per kernel (and per matrix shape), summed over a session's or trainer's steps. */
typedef struct forge__profile {
    double ms[FORGE__OP_COUNT];
    uint64_t calls[FORGE__OP_COUNT];
    struct forge__prof_shape {
        uint16_t op;
        uint32_t N, K, bits16;            /* a matrix kernel's shape and weight format (forge__mat_work) */
        double ms;
        uint64_t calls, rows;             /* rows: the products' M summed over the calls */
        uint64_t mats;                    /* weight matrices read, summed over the calls (forge__mat_work) */
    } shape[64];
    int n_shapes;
} forge__profile;

struct forge_session {
    forge__err err;
    forge_model *m;
    forge__arena arena;
    int n_ctx, n_batch, n_out_max;
    int n_seq;                        /* batch generation: sequences, each with slots[l] of every layer's cache */
    int n_past;
    int32_t *history;                 /* [n_ctx] the tokens in the cache */
    forge__mem_counter mem;
    forge__pack pack;
    forge__buffer *blocks;
    int n_blocks;
    forge__buffer io;                 /* host-visible: step params | penalty ids | tokens [n_batch] u32 */
    forge__buffer readback;           /* host-visible: sampler output [1 + C] | logits [n_out_max, vocab] */
    forge__range params_r, penalty_r, tokens_r, dummy;
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
    forge__range lora_u;                /* the adapter's x A^T [n_batch, FORGE__T_COUNT * max_rank] (16 bytes without one) */
    forge__range logits;                /* [n_out_max, vocab] */
    forge__range router, route, moe, moe_y, moe_out, mlp_sum; /* mixture of experts (forge__session_pack) */
    forge__range ple, ple_tmp, ple_g;   /* Gemma 4's per-layer inputs [n_batch, layers * ple_dim], their scratch, one layer's gate */
    forge__range *kc, *vc;            /* per layer [slots, n_kv_heads, head_dim], f32 or (kv_f16) f16 */
    bool kv_f16;                      /* forge_session_params.kv_type resolved (forge__session_sizes) */
    uint64_t kv_bytes, kv_sliding_bytes;
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
    uint64_t prompt_cache_hits;
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
    bool kv_f16;                      /* the KV cache in f16 (forge_kv_type) */
    uint32_t slots[FORGE__MAX_LAYERS];
} forge__session_plan;

/* Bytes of one position of layer l's K (or V) cache. */
static uint64_t forge__kv_row_bytes(const forge__config *c, int l, bool f16) { return (f16 ? 2ull : 4ull) * forge__kv_dim(c, l); }

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
    if (sp->n_seq > sp->n_out_max) /* a batched decode step reads one logits row per sequence */
        return forge__fail(err, FORGE_ERR_LIMIT, "session params: n_seq_max %d needs as many logit rows per step; n_batch and "
                           "n_outputs_max allow %d", sp->n_seq, sp->n_out_max);
    if (p->kv_type < FORGE_KV_DEFAULT || p->kv_type > FORGE_KV_F16)
        return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "session params: kv_type %d is not a forge_kv_type (0 default, 1 f32, 2 f16)", p->kv_type);
    if (p->kv_type == FORGE_KV_F16 && !forge__head_dims_by4(c))
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "session params: an f16 KV cache needs head_dim a multiple of 4; this model's is %d",
                           c->head_dim);
    sp->kv_f16 = p->kv_type == FORGE_KV_F16 ||
                 (p->kv_type == FORGE_KV_DEFAULT && forge__head_dims_by4(c) && !m->exact && caps->type != FORGE_DEVICE_CPU);
    for (int l = 0; l < c->n_layers; l++) {
        uint64_t kv_row = forge__kv_row_bytes(c, l, sp->kv_f16);
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
static uint32_t forge__topk_chunks(const forge_model *m) {
    return (uint32_t)((m->cfg.n_vocab + FORGE__TOPK_CHUNK - 1) / FORGE__TOPK_CHUNK);
}

/* The session's activation buffers, in pack order (then the per-layer K and V caches). */
typedef enum forge__session_buf {
    FORGE__SB_X, FORGE__SB_XN, FORGE__SB_QKV, FORGE__SB_ATT, FORGE__SB_H, FORGE__SB_GU, FORGE__SB_LOGITS, FORGE__SB_DUMMY,
    FORGE__SB_CAND, FORGE__SB_CAND_STATS, FORGE__SB_SAMPLE_OUT, FORGE__SB_ATTN_PART, FORGE__SB_ATTN_DONE, FORGE__SB_LORA_U, FORGE__SB_ACT_Q8,
    FORGE__SB_ACT_Q8_RES, FORGE__SB_A16,
    FORGE__SB_ROUTER, FORGE__SB_ROUTE, FORGE__SB_MOE, FORGE__SB_MOE_Y, FORGE__SB_MOE_OUT, FORGE__SB_MLP_SUM,
    FORGE__SB_PLE, FORGE__SB_PLE_TMP, FORGE__SB_PLE_G, FORGE__SB_COUNT
} forge__session_buf;

#define FORGE__MOE_BM 64 /* matmul.comp's tile rows: moe_group.comp's tiles hold at most this many pairs */
/* moe_group.comp's table for n pairs: a count, a tile per 64 pairs and per expert at most, the sorted pairs. */
static uint64_t forge__moe_max_tiles(uint32_t n_experts, uint64_t pairs) { return (pairs + FORGE__MOE_BM - 1) / FORGE__MOE_BM + n_experts; }
static uint32_t forge__moe_order_off(uint32_t n_experts, uint64_t pairs) { return (uint32_t)(4 + 4 * forge__moe_max_tiles(n_experts, pairs)); }

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
        [FORGE__SB_CAND] = 8ull * (uint64_t)sp->n_seq * forge__topk_chunks(m) * FORGE__CANDIDATES,
        [FORGE__SB_CAND_STATS] = 8ull * (uint64_t)sp->n_seq * forge__topk_chunks(m),
        [FORGE__SB_SAMPLE_OUT] = 8ull * (uint64_t)sp->n_seq * (1 + FORGE__CANDIDATES),
        [FORGE__SB_ATTN_PART] = 4ull * c->n_heads * (c->head_dim_max + 2) * /* a batched step's splits or one sequence's */
                                FORGE__MAX((uint64_t)sp->n_seq * forge__attn_splits(m, true), (uint64_t)forge__attn_splits(m, false)),
        [FORGE__SB_ATTN_DONE] = 4ull * c->n_heads * nb,
        [FORGE__SB_LORA_U] = m->adapter.pairs ? nb * FORGE__T_COUNT * m->adapter.max_rank * 4 : 16,
        [FORGE__SB_ACT_Q8] = m->act_q8 ? forge__act_q8_g8_bytes(forge__max_product_k(c)) : 16,
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
    };
    for (size_t i = 0; i < FORGE__SB_COUNT; i++)
        if (forge__pack_add(pack, a, sizes[i]) < 0) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int l = 0; l < c->n_layers; l++) /* a KV-shared layer's cache is its source's (16 bytes held in its place) */
        for (int kv = 0; kv < 2; kv++)
            if (forge__pack_add(pack, a, forge__kv_shared(c, l) ? 16 : (uint64_t)sp->n_seq * sp->slots[l] * forge__kv_row_bytes(c, l, sp->kv_f16)) < 0)
                return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    return forge__pack_plan(pack, a, &m->dev.caps, err);
}

static void forge__session_kv_bytes(const forge_model *m, const forge__session_plan *sp, uint64_t *all, uint64_t *sliding) {
    const forge__config *c = &m->cfg;
    *all = *sliding = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (forge__kv_shared(c, l)) continue;
        uint64_t b = 2ull * sp->n_seq * sp->slots[l] * forge__kv_row_bytes(c, l, sp->kv_f16);
        *all += b;
        if (c->layer_sliding[l] && c->sliding_window > 0) *sliding += b;
    }
}

/* The io buffer: step params at 0, penalty ids at 64, tokens after them; and the readback
 * buffer: the sampler's output, then the logits rows. */
#define FORGE__IO_PENALTY_OFFSET 64
#define FORGE__IO_TOKENS_OFFSET (FORGE__IO_PENALTY_OFFSET + 4 * FORGE__MAX_PENALTY_WINDOW)
#define FORGE__RB_LOGITS_OFFSET 4096   /* >= 8 * (1 + FORGE__CANDIDATES), a multiple of any alignment */
static uint64_t forge__session_io_bytes(const forge__session_plan *sp) {
    return FORGE__IO_TOKENS_OFFSET + 4ull * sp->n_batch + 4ull * sp->n_seq; /* then batch generation's 1 / temperature per row */
}
static uint64_t forge__session_readback_bytes(const forge_model *m, const forge__session_plan *sp) {
    uint64_t batch_cands = 8ull * (uint64_t)sp->n_seq * (1 + FORGE__CANDIDATES); /* batch generation: candidates per row */
    return FORGE__RB_LOGITS_OFFSET + FORGE__MAX(4ull * sp->n_out_max * m->cfg.n_vocab, batch_cands);
}
static uint64_t forge__session_host_visible_bytes(const forge_model *m, const forge__session_plan *sp) {
    return forge__session_io_bytes(sp) + forge__session_readback_bytes(m, sp);
}

/* ---- Recording the forward pass ----
 * One layer's forward pass is written once and serves inference (a session's scratch and KV
 * cache) and training (activations kept per layer for the backward pass, section 13): what
 * differs is in forge__pass (the shape of the rows) and forge__acts (where each tensor goes). */

/* What a recorded pass works with: the model, the recorder and the rows it runs. */
typedef struct forge__pass {
    forge_model *m;
    forge__rec *r;
    forge__range dummy;        /* bound where a kernel's optional input is unused */
    forge__range params;       /* the step params (forge__step_params): positions, dropout seed */
    const forge__lora *lora;   /* adapters beside the projections, or NULL */
    uint32_t n;                /* rows (tokens) in the pass */
    uint32_t seq;              /* tokens per sequence of a training batch (n = batch * seq); 0: one sequence */
    uint32_t batch;            /* sequences: 1 for inference */
    bool fuse;                 /* block norms fused into the subgroup matvec (decode without adapters) */
    bool train;                /* a training batch: keep what the backward pass reads */
    bool dropout;              /* apply the adapters' dropout (training steps, not evaluation) */
    forge__range gemm_part;    /* the trainer: scratch for split-K partial sums (unset: no split) */
    uint32_t table;            /* batch generation: rows of several sequences, positions and cache regions from
                                * the row table (FORGE__TABLE_PREFILL: one sequence's prompt, FORGE__TABLE_DECODE:
                                * one row per sequence); 0: one sequence at pos0 */
    forge__range split_part;   /* batch decode: scratch for the matmul's split-k partial sums (unset: no split), */
    forge__range split_alt;    /* or this one where the first overlaps the product's input or output */
    forge__range act_q8;       /* one token's int8 activations (act_q8.comp), where the model uses them; unset: never */
    forge__range a16;          /* the tensor cores' input rows in f16 (act_f16.comp); unset: products on the SIMT kernels */
    bool kv_f16;               /* the KV cache holds f16 (a session's kv_type; training's caches are f32) */
    forge__range act_q8_res;   /* one token's int8 activations of the residual stream, for a decode layer's chain (forge__q8_chain); unset: no chain */
    forge__range post_p;       /* forge__linear, one token: x + rmsnorm(post_p) * post_w is the input, and goes to post_out
                                * (matvec_sg's POST_ADD, forge__post_fused); unset: x */
    forge__range post_w, post_out;
} forge__pass;

/* Whether two ranges share no byte. */
static bool forge__apart(forge__range a, forge__range b) {
    return a.buf != b.buf || a.offset >= b.offset + b.size || b.offset >= a.offset + a.size;
}

#define FORGE__TABLE_PREFILL 1u
#define FORGE__TABLE_DECODE 2u

/* Where one layer's forward pass reads and writes, each [n, width] f32. */
typedef struct forge__acts {
    forge__range x;            /* [n, H] the residual stream, updated in place */
    forge__range xn;           /* [n, H] a block norm's output (the projections' input) */
    forge__range qkv;          /* [n, QKVD] q | k | v rows; q normed and rotated in place */
    forge__range att;          /* [n, QD] the attention's output */
    forge__range gu;           /* [n, 2F] gate and up (pairs from the fused weight, else halves) */
    forge__range h;            /* [n, F] act(gate) * up */
    forge__range kc, vc;       /* K and V [slots, NKV, D]: the KV cache, or training's [n, NKV, D] */
    uint32_t slots;
    forge__range attn_part;    /* decode: the split attention's partials [NH, splits, D + 2] */
    forge__range attn_done;    /* decode: attention_decode's counters [n, NH], zero between dispatches */
    forge__range u;            /* [n, FORGE__T_COUNT * max_rank] the adapters' x A^T, per target */
    forge__range o, d;         /* [n, H] sandwich norms' inputs: attention and MLP outputs (inference: xn) */
    /* training: kept for the backward pass (unset when not) */
    forge__range x_in;         /* [n, H] the layer's input */
    forge__range x_mid;        /* [n, H] the residual after the attention block */
    forge__range qkv_raw;      /* [n, QKVD] q | k | v before the q/k norms (qk_norm models) */
    forge__range lse;          /* [2, n, NH] the attention's log-sum-exp per query and head (then delta) */
    /* mixture of experts (forge__record_moe) */
    forge__range router;       /* [n, E] the router's logits */
    forge__range route;        /* [n * top_k] (expert, weight bits) per (token, choice) pair */
    forge__range moe;          /* moe_group.comp's tiles and sorted pairs (prefill) */
    forge__range moe_y;        /* [n * top_k, H] each pair's expert output (prefill) */
    forge__range moe_out;      /* [n, H] Gemma 4: the experts' weighted sum */
    forge__range mlp_sum;      /* [n, H] Gemma 4: the dense MLP's and the experts' normed outputs added */
    /* Gemma 4's per-layer inputs */
    forge__range ple;          /* [n, layers * P] every layer's input (forge__record_ple) */
    forge__range ple_tmp;      /* [n, layers * P] scratch */
    forge__range ple_g;        /* [n, P] the layer's gate */
} forge__acts;

/* Whether a product of M rows runs on the subgroup matvec, the one kernel that can fuse the
 * RMSNorm of its input (forge__linear's `norm`). */
static bool forge__fuses_norm(const forge_model *m, uint32_t M) { return M <= FORGE__MATVEC_MAX_M && m->dev.caps.subgroup_arith; }

/* Whether a product of M rows of x with w runs on int8 activations (forge__linear_q8a). */
static bool forge__uses_q8a(const forge__pass *p, const forge__weight *w, uint32_t M) {
    return M == 1 && p->act_q8.buf && (w->fmt == FORGE__W_Q4_0 || w->fmt == FORGE__W_Q8_0) && w->cols % 32 == 0 &&
           forge__act_q8_bytes(w->cols) <= p->act_q8.size;
}

/* Whether a one-token product of w into y [ldc] (y's columns col_off..) can quantize its
 * output row for the next product (matvec_q8a's Q8_OUT): it writes all ldc columns, ldc a
 * multiple of 32 that both scratches hold, and every chunk's outputs start at a multiple of 8
 * (each workgroup's 8 outputs are one group). */
#if FORGE__SG_PER_WG != 8
#error "matvec_q8a's Q8_OUT quantizes a workgroup's outputs as one group of 8"
#endif
static bool forge__q8_out_fits(const forge__pass *p, const forge__weight *w, uint32_t ldc, uint32_t col_off, bool gated) {
    uint64_t bytes = forge__act_q8_g8_bytes(ldc);
    if (!p->act_q8_res.buf || col_off != 0 || ldc % 32 != 0 || bytes > p->act_q8_res.size || bytes > p->act_q8.size ||
        (gated ? w->rows / 2 : w->rows) != ldc)
        return false;
    for (int i = 0; i < w->n_chunks; i++)
        if ((gated ? w->chunks[i].row0 / 2 : w->chunks[i].row0) % FORGE__SG_PER_WG != 0) return false;
    return true;
}

/* matvec_sg_pair (two outputs a subgroup: two rows, or gated four, the activations loaded once
 * for them, twice the loads in flight) for one token's products of plain-format weights with
 * forge_model.pairs_min_rows rows or more: on the H100 the F16 128256 x 2048 head went from 1.55
 * to 2.95 TB/s (decode, 1B F16 617.7 -> 633.8 tok/s, Qwen3-0.6B 630.4 -> 656.4, Gemma3-1B 402.6
 * -> 431.1), and with Qwen3-0.6B's 4096-output q|k|v paired too 662-666 -> 679-681; but the 1B
 * F16's products of 2048 outputs paired (128 workgroups for 132 SMs) fell to 594-600; the 1B
 * F16's gate|up (16384 rows) 39.2 -> 29.3 us a call, Qwen3-0.6B's (6144) 12.4 -> 10.8
 * (bench/RESULTS.md). The gated rows' loads take whole steps of 8 weights: K % 8 == 0.
 * matvec_q8a (Q4_0 / Q8_0 on int8 activations) takes gated products' outputs in pairs by the
 * same rule (forge__pair_outputs): the 1B Q4_0's gate|up 15.5 -> 13.8 us a call, decode +3%
 * (noisy); the 8B's 28672 x 4096 unchanged (34.3 / 34.8 us), its decode within noise. */
static bool forge__pair_outputs(const forge_model *m, uint32_t M, uint32_t outs, bool gated) {
    return m->pairs_min_rows && M == 1 && (gated ? 2 : 1) * outs >= m->pairs_min_rows && outs % 2 == 0;
}
static bool forge__matvec_pairs(const forge_model *m, const forge__weight *w, uint32_t M, uint32_t outs, bool gated) {
    return w->fmt <= FORGE__W_BF16 && forge__pair_outputs(m, M, outs, gated) && (!gated || w->cols % 8 == 0);
}

/* One token's product on int8 activations (forge_model.act_q8): act_q8.comp quantizes row
 * a_row0 of x (times `norm`'s weight if given) into p->act_q8, then matvec_q8a multiplies
 * each row-chunk of W with it (and divides by the row's RMS). Arguments as forge__linear's;
 * in a decode layer's chain (forge__q8_chain) x comes quantized already (flags QUANTIZED:
 * in p->act_q8, QUANTIZED_RES: in p->act_q8_res, normed by `norm`; A_G8 where a product
 * wrote them, in groups of 8), and with Q8_OUT the product quantizes y for the next one, in
 * groups of 8 (into p->act_q8, or into p->act_q8_res times out_norm's weight: Q8_OUT_NORM). */
static void forge__linear_q8a(const forge__pass *p, const forge__weight *w, forge__range x, uint32_t a_row0, forge__range y, uint32_t ldc,
                              uint32_t col_off, const forge__vec *bias, const forge__vec *norm, uint32_t flags, float softcap,
                              const forge__vec *out_norm) {
    forge_model *m = p->m;
    uint32_t K = w->cols, gx, gy;
    forge__range in = flags & FORGE__LINEAR_QUANTIZED_RES ? p->act_q8_res : p->act_q8;
    if (!(flags & (FORGE__LINEAR_QUANTIZED | FORGE__LINEAR_QUANTIZED_RES))) {
        forge__barrier(p->r); /* an earlier product may still read the scratch (free after the caller's barrier) */
        forge__pc_act_q8 pq = {K, a_row0, norm ? FORGE__LINEAR_PRENORM : 0};
        forge__range bq[3] = {x, norm ? norm->r : p->dummy, p->act_q8};
        forge__dispatch(p->r, FORGE__OP_ACT_Q8, bq, &pq, (K / 32 + 63) / 64, 1, 1);
        forge__barrier(p->r);
    }
    bool g8 = flags & (FORGE__LINEAR_QUANTIZED_RES | FORGE__LINEAR_A_G8);
    flags &= ~(FORGE__LINEAR_QUANTIZED | FORGE__LINEAR_QUANTIZED_RES | FORGE__LINEAR_A_G8);
    if (out_norm) flags |= FORGE__LINEAR_Q8_OUT | FORGE__LINEAR_Q8_OUT_NORM;
    bool gated = flags & FORGE__LINEAR_GATED;
    forge__range q8_out = !(flags & FORGE__LINEAR_Q8_OUT) ? p->dummy : out_norm ? p->act_q8_res : p->act_q8;
    forge__op op = (forge__op)(FORGE__OP_MATVEC_Q8A + (w->fmt == FORGE__W_Q8_0 ? 4 : 0) + (g8 ? 2 : 0) + (flags & FORGE__LINEAR_Q8_OUT ? 1 : 0));
    for (int i = 0; i < w->n_chunks; i++) {
        const forge__wchunk *c = &w->chunks[i];
        uint32_t outs = gated ? c->rows / 2 : c->rows, out0 = gated ? c->row0 / 2 : c->row0;
        forge__range b[6] = {in, c->w, y, bias && bias->present ? bias->r : p->dummy, q8_out, out_norm ? out_norm->r : p->dummy};
        forge__pc_linear pc = {1, K, outs, 0, ldc, col_off + out0,
                               flags | (bias && bias->present ? FORGE__LINEAR_BIAS : 0) | (norm ? FORGE__LINEAR_PRENORM : 0),
                               col_off + out0, softcap, 0, 0, 0, (float)m->cfg.norm_eps, 0, 0, 0, 0, 0, 0, 0};
        bool paired = gated && forge__pair_outputs(m, 1, outs, true); /* (+ 8: two outputs a subgroup, 16 a workgroup) */
        uint32_t per_wg = paired ? 2 * FORGE__SG_PER_WG : FORGE__SG_PER_WG;
        forge__grid((outs + per_wg - 1) / per_wg, &gx, &gy);
        forge__dispatch(p->r, paired ? (forge__op)(op + 8) : op, b, &pc, gx, gy, 1);
    }
}

/* Rows a_row0 .. a_row0 + M of x [*, K] rounded to f16 into a16 [M, K] (act_f16.comp), for
 * matmul_cm, then a barrier. K % 8 == 0. */
static void forge__record_act_f16(forge__rec *r, forge__range x, uint32_t a_row0, uint32_t M, uint32_t K, forge__range a16) {
    forge__pc_act_f16 pc = {K, a_row0, M};
    forge__range b[2] = {x, a16};
    uint32_t gx, gy;
    forge__grid(((uint64_t)M * (K / 8) + 255) / 256, &gx, &gy);
    forge__dispatch(r, FORGE__OP_ACT_F16, b, &pc, gx, gy, 1);
    forge__barrier(r);
}

/* C (+)= the sum of `splits` partial sums part [splits, M, N] (pc's M, N and epilogue: bias,
 * soft-cap, accumulate), linear_reduce.comp. */
static void forge__record_linear_reduce(forge__rec *r, forge__range part, forge__range c, forge__range bias, const forge__pc_linear *pc,
                                        uint32_t splits) {
    forge__pc_linear pr = *pc;
    pr.k_split = splits;
    forge__range b[4] = {part, part, c, bias};
    uint64_t threads = pc->N % 4 == 0 ? (uint64_t)pc->M * pc->N / 4 : (uint64_t)pc->M * pc->N;
    uint32_t gx, gy;
    forge__grid((threads + 255) / 256, &gx, &gy);
    forge__dispatch(r, FORGE__OP_LINEAR_REDUCE, b, &pr, gx, gy, 1);
}

/* y[M, ldc] (+)= x[a_row0 .., K] . W^T into columns col_off.. of y (the bias is indexed by
 * that column too), one dispatch per row-chunk of W. With `norm` (only where
 * forge__fuses_norm) x is RMS-normalized and scaled by norm first; GATED (the fused gate_up
 * weight) writes act(gate) * up, one output per row pair. One token of Q4_0 / Q8_0 weights
 * goes to forge__linear_q8a where the pass has int8 activations. */
static void forge__linear(const forge__pass *p, const forge__weight *w, forge__range x, uint32_t a_row0, uint32_t M, forge__range y,
                          uint32_t ldc, uint32_t col_off, const forge__vec *bias, const forge__vec *norm, uint32_t flags, float softcap) {
    forge_model *m = p->m;
    if (forge__uses_q8a(p, w, M)) {
        forge__linear_q8a(p, w, x, a_row0, y, ldc, col_off, bias, norm, flags, softcap, NULL);
        return;
    }
    flags &= ~(FORGE__LINEAR_QUANTIZED | FORGE__LINEAR_QUANTIZED_RES);
    bool vec = M <= FORGE__MATVEC_MAX_M, sg = forge__fuses_norm(m, M);
    /* Every product of more than FORGE__MATVEC_MAX_M rows runs on the tensor cores where the
     * device has them and the model is not exact: prefill, classify, training's forward and batch
     * decode's rows (on the H100 even 32 rows beat the SIMT kernels: 32 x 2048 x 16384 in 0.10 ms
     * against 0.17 for matmul_s; bench/RESULTS.md). */
    /* ... on x rounded to f16 first, into the pass's scratch (set where forge__uses_a16; after
     * a barrier: an earlier product may still read it); where that cannot hold x, on the SIMT
     * kernels */
    forge__range a16 = p->a16;
    bool cm = !vec && a16.buf && w->cols % 8 == 0 && 2ull * M * w->cols <= a16.size && forge__apart(a16, x) && forge__apart(a16, y);
    if (cm) {
        forge__barrier(p->r);
        forge__record_act_f16(p->r, x, a_row0, M, w->cols, a16);
    }
    bool gated = flags & FORGE__LINEAR_GATED;
    if (norm) flags |= FORGE__LINEAR_PRENORM;
    for (int i = 0; i < w->n_chunks; i++) {
        const forge__wchunk *c = &w->chunks[i];
        bool mlx = w->fmt == FORGE__W_MLX;
        uint32_t outs = gated ? c->rows / 2 : c->rows, out0 = gated ? c->row0 / 2 : c->row0;
        bool post = p->post_p.buf; /* (forge__post_fused: one token on matvec_sg, F32 / F16 / BF16, with a norm) */
        forge__range b[11] = {x, c->w, y, bias && bias->present ? bias->r : p->dummy, mlx ? c->scales : p->dummy,
                              mlx ? c->biases : p->dummy, norm ? norm->r : p->dummy, p->dummy,
                              post ? p->post_p : p->dummy, post ? p->post_w : p->dummy, post ? p->post_out : p->dummy};
        uint32_t split = forge__matvec_use_split(m->dev.caps.type == FORGE_DEVICE_CPU, w->fmt, M, outs, w->cols) ? forge__matvec_split_rows(outs) : 0;
        uint32_t rows_per_wg = forge__matvec_rows_per_wg(sg, split);
        forge__pc_linear pc = {M, w->cols, outs, a_row0, ldc, col_off + out0, flags | (bias && bias->present ? FORGE__LINEAR_BIAS : 0),
                               col_off + out0, softcap, w->bits, w->group, w->qflags, (float)m->cfg.norm_eps, split, 0, 0, 0, 0, 0, 0};
        uint32_t gx, gy;
        if (vec) { /* matvec_sg_post with the post-norm's input, matvec_sg_pair two rows a subgroup, else a row */
            bool pairs = sg && !post && forge__matvec_pairs(m, w, M, outs, gated);
            forge__op op = post ? FORGE__OP_MATVEC_SG_POST : pairs ? FORGE__OP_MATVEC_SG_PAIR : sg ? FORGE__OP_MATVEC_SG : FORGE__OP_MATVEC;
            uint32_t per_wg = pairs || post ? 2 * rows_per_wg : rows_per_wg; /* (matvec_sg_post: two gated outputs a subgroup) */
            forge__grid((outs + per_wg - 1) / per_wg, &gx, &gy);
            forge__dispatch(p->r, (forge__op)(op + w->fmt), b, &pc, gx, gy, 1);
            continue;
        }
        /* 128 x 128 tiles once there are enough of them to fill a large GPU (on the H100:
         * 512 x 16384 x 2048 in 1.23 ms against 1.69 ms with 64 x 64 tiles, while
         * 512 x 2048 x 8192, 64 big tiles, ran slower than with 256 small ones) */
        bool skinny = p->table == FORGE__TABLE_DECODE && M <= 32 && !cm; /* batch decode: 32 x 128 tiles */
        /* up to 32 rows of f16 weights: matmul_cm's 32 x 64 tiles that read W without staging it */
        bool cm_s = cm && M <= 32 && w->fmt == FORGE__W_F16 && c->rows % 16 == 0 && w->cols % 64 == 0;
        uint32_t tn = cm_s ? 64 : skinny || cm ? 128 : 64, tm = skinny || cm_s ? 32 : cm ? 128 : 64;
        forge__op plain = (forge__op)((skinny ? FORGE__OP_MATMUL_S : FORGE__OP_MATMUL) + w->fmt);
        forge__op cm_op = cm_s ? FORGE__OP_MATMUL_CM_S : (forge__op)(FORGE__OP_MATMUL_CM + w->fmt);
        forge__op split_op = cm ? cm_op : plain;
        uint64_t tiles = (uint64_t)((c->rows + tn - 1) / tn) * ((M + tm - 1) / tm);
        uint32_t splits = 1;
        forge__range part = forge__apart(p->split_part, y) && forge__apart(p->split_part, x) ? p->split_part
                          : forge__apart(p->split_alt, y) && forge__apart(p->split_alt, x) ? p->split_alt : (forge__range){0};
        if (part.buf && !gated && tiles < 256 && w->cols >= 128) { /* a few rows: split k to fill the device */
            splits = (uint32_t)FORGE__MIN(FORGE__MIN((uint64_t)8, (256 + tiles - 1) / tiles), w->cols / 64);
            while (splits > 1 && 4ull * splits * M * outs > part.size) splits--;
        }
        if (splits > 1) {
            uint32_t k_chunk = (uint32_t)forge__align_up((w->cols + splits - 1) / splits, cm ? 64 : 32); /* matmul_cm: whole k steps */
            splits = (w->cols + k_chunk - 1) / k_chunk;
            forge__pc_linear pp = pc;
            pp.flags = FORGE__LINEAR_SPLIT_K;
            pp.k_split = k_chunk;
            if (cm) pp.a_row0 = 0;
            forge__range bp[7] = {cm ? a16 : x, c->w, part, p->dummy, b[4], b[5], p->dummy};
            forge__dispatch(p->r, split_op, bp, &pp, (c->rows + tn - 1) / tn, (M + tm - 1) / tm, splits);
            forge__barrier(p->r);
            forge__record_linear_reduce(p->r, part, y, b[3], &pc, splits);
            forge__barrier(p->r);
            continue;
        }
        uint64_t big_tiles = (uint64_t)((c->rows + 127) / 128) * ((M + 127) / 128);
        bool big = !cm && big_tiles >= FORGE__BIG_TILES_MIN && !(p->table == FORGE__TABLE_DECODE && M <= 64); /* (a few rows: more, smaller tiles) */
        uint32_t tile = big ? 128 : 64;
        if (skinny) {
            forge__dispatch(p->r, plain, b, &pc, (c->rows + tn - 1) / tn, (M + tm - 1) / tm, 1);
            continue;
        }
        if (cm) {
            b[0] = a16;
            pc.a_row0 = 0;
            forge__dispatch(p->r, cm_op, b, &pc, (c->rows + tn - 1) / tn, (M + tm - 1) / tm, 1);
            continue;
        }
        forge__op op = (forge__op)((big ? FORGE__OP_MATMUL_BIG : FORGE__OP_MATMUL) + w->fmt);
        forge__dispatch(p->r, op, b, &pc, (c->rows + tile - 1) / tile, (M + tile - 1) / tile, 1);
    }
}

/* out[out_row0 + r] = (rmsnorm(x[x_row0 + r]) * w (+ out)) (* scale) for r < rows: flags
 * FORGE__NORM_ADD, FORGE__NORM_SCALE. eps: the model's, or eps / a^2 where x stands for a * x
 * (rmsnorm(a x) = x / sqrt(mean(x^2) + eps / a^2): a constant factor folded in exactly). */
static void forge__rmsnorm_ex(const forge__pass *p, forge__range x, uint32_t x_row0, const forge__vec *w, forge__range out, uint32_t out_row0,
                              uint32_t rows, uint32_t dim, uint32_t flags, float scale, double eps) {
    forge__range b[4] = {x, w->r, out, out};
    forge__pc_rmsnorm pc = {dim, x_row0, out_row0, flags, (float)eps, 0, 0, 0, scale};
    uint32_t gx, gy;
    forge__grid(rows, &gx, &gy);
    forge__dispatch(p->r, FORGE__OP_RMSNORM, b, &pc, gx, gy, 1);
}

/* out[out_row0 + r] (+)= rmsnorm(x[x_row0 + r]) * w for r < rows (flags 1: add). */
static void forge__rmsnorm(const forge__pass *p, forge__range x, uint32_t x_row0, const forge__vec *w, forge__range out, uint32_t out_row0,
                           uint32_t rows, uint32_t dim, uint32_t flags) {
    forge__rmsnorm_ex(p, x, x_row0, w, out, out_row0, rows, dim, flags, 1.0f, p->m->cfg.norm_eps);
}

/* out[0] = resid[0] + rmsnorm(x[0]) * w, one row of dim (a residual stream that a product with
 * matvec_sg's POST_ADD wrote to resid, forge__post_fused). */
static void forge__rmsnorm_resid(const forge__pass *p, forge__range x, const forge__vec *w, forge__range resid, forge__range out, uint32_t dim) {
    forge__range b[4] = {x, w->r, out, resid};
    forge__pc_rmsnorm pc = {dim, 0, 0, FORGE__NORM_ADD | FORGE__NORM_RESID, (float)p->m->cfg.norm_eps, 0, 0, 0, 1.0f};
    forge__dispatch(p->r, FORGE__OP_RMSNORM, b, &pc, 1, 1, 1);
}

/* Per-head RMSNorm in place over `heads` heads of `dim` starting at column col0 of each fused
 * qkv row of `stride` columns. */
static void forge__head_norm(const forge__pass *p, forge__range qkv, const forge__vec *w, uint32_t heads, uint32_t col0, uint32_t dim,
                             uint32_t stride) {
    uint32_t gx, gy;
    forge__range b[4] = {qkv, w->r, qkv, qkv};
    forge__pc_rmsnorm pc = {dim, 0, 0, 0, (float)p->m->cfg.norm_eps, heads, stride, col0, 1.0f};
    forge__grid((uint64_t)p->n * heads, &gx, &gy);
    forge__dispatch(p->r, FORGE__OP_RMSNORM, b, &pc, gx, gy, 1);
}

/* ---- The adapters' low-rank path (gemm.comp) ---- */

/* A strided view of an f32 matrix for gemm.comp: element (i, j) at off + i * si + j * sj. */
typedef struct forge__mview {
    forge__range r;
    uint32_t off, si, sj;
} forge__mview;

static forge__mview forge__rows(forge__range r, uint32_t off, uint32_t ld) { return (forge__mview){r, off, ld, 1}; }
static forge__mview forge__cols(forge__range r, uint32_t off, uint32_t ld) { return (forge__mview){r, off, 1, ld}; } /* transposed */

#define FORGE__GEMM_MAX_SPLITS 16

/* C [M, N] (+)= alpha A [M, K] B [K, N]; drop_on / stream: dropout of x (gemm.comp). A product
 * with a long k and too few 32 x 32 tiles to fill the device is split along k into partial sums
 * (p->gemm_part, when the pass has one), then reduced in a fixed order; the partial buffer is
 * shared, so a split product ends with a barrier. */
static void forge__gemm(const forge__pass *p, forge__mview a, forge__mview b, forge__mview c, uint32_t M, uint32_t N, uint32_t K,
                        float alpha, bool accumulate, uint32_t drop_on, uint32_t drop_ld, uint32_t stream) {
    float rate = p->lora ? p->lora->dropout : 0.0f;
    bool drop = drop_on && p->dropout && rate > 0.0f;
    uint64_t tiles = (uint64_t)((M + 31) / 32) * ((N + 31) / 32);
    uint32_t splits = 1, k_chunk = K;
    if (p->gemm_part.buf && K >= 512 && tiles < 512) {
        splits = (uint32_t)FORGE__MIN(FORGE__MIN((uint64_t)FORGE__GEMM_MAX_SPLITS, K / 256), (512 + tiles - 1) / tiles);
        while (splits > 1 && (uint64_t)splits * M * N * 4 > p->gemm_part.size) splits--;
        k_chunk = (uint32_t)forge__align_up((K + splits - 1) / splits, 32);
        splits = (K + k_chunk - 1) / k_chunk;
    }
    forge__pc_gemm pc = {M, N, K, a.off, a.si, a.sj, b.off, b.si, b.sj, c.off, c.si, c.sj, alpha, accumulate,
                         drop ? drop_on : 0u, drop_ld, stream, drop ? (uint32_t)fmin(4294967295.0, (double)rate * 4294967296.0) : 0u,
                         drop ? 1.0f / (1.0f - rate) : 1.0f, splits, k_chunk, 0};
    forge__range bind[5] = {a.r, b.r, c.r, p->params, splits > 1 ? p->gemm_part : p->dummy};
    forge__dispatch(p->r, FORGE__OP_GEMM, bind, &pc, (N + 31) / 32, (M + 31) / 32, splits);
    if (splits > 1) {
        uint32_t gx, gy;
        forge__barrier(p->r);
        pc.reduce = 1;
        forge__grid(((uint64_t)M * N + 63) / 64, &gx, &gy);
        forge__dispatch(p->r, FORGE__OP_GEMM, bind, &pc, gx, gy, 1);
        forge__barrier(p->r);
    }
}

/* The scratch columns of target t in acts.u ([n, FORGE__T_COUNT * max_rank]). */
static uint32_t forge__u_col(const forge__pass *p, forge__target t) { return (uint32_t)t * p->lora->max_rank; }
static uint32_t forge__u_ld(const forge__pass *p) { return FORGE__T_COUNT * p->lora->max_rank; }
static uint32_t forge__stream(int layer, forge__target t) { return (uint32_t)layer * FORGE__T_COUNT + (uint32_t)t; }

/* u_t = dropout(x) A^T for the adapted target t of layer l (x [n, in] rows). */
static void forge__lora_down(const forge__pass *p, const forge__acts *a, int l, forge__target t, forge__range x) {
    const forge__lora_pair *lp = forge__lora_at(p->lora, l, t);
    if (!lp) return;
    forge__gemm(p, forge__rows(x, 0, lp->in), forge__cols(lp->a, lp->a_el, lp->in), forge__rows(a->u, forge__u_col(p, t), forge__u_ld(p)),
                p->n, lp->rank, lp->in, 1.0f, false, 1, lp->in, forge__stream(l, t));
}

/* y[:, col0 + j * step] += scale * u_t B^T: the adapter's output added to the projection's. */
static void forge__lora_up(const forge__pass *p, const forge__acts *a, int l, forge__target t, forge__range y, uint32_t ldy, uint32_t col0,
                           uint32_t step) {
    const forge__lora_pair *lp = forge__lora_at(p->lora, l, t);
    if (!lp) return;
    forge__gemm(p, forge__rows(a->u, forge__u_col(p, t), forge__u_ld(p)), forge__cols(lp->b, lp->b_el, lp->rank),
                (forge__mview){y, col0, ldy, step}, p->n, lp->out, lp->rank, lp->scale, true, 0, 0, 0);
}

/* Whether layer l has an adapter on any of the targets in mask. */
static bool forge__lora_any(const forge__pass *p, int l, uint32_t mask) {
    for (int t = 0; t < FORGE__T_COUNT; t++)
        if ((mask >> t & 1u) && forge__lora_at(p->lora, l, (forge__target)t)) return true;
    return false;
}

#define FORGE__T_QKV (1u << FORGE__T_Q | 1u << FORGE__T_K | 1u << FORGE__T_V)
#define FORGE__T_GU (1u << FORGE__T_GATE | 1u << FORGE__T_UP)

/* h = act(gate) * up over `count` elements of rows of `ffn`, the gates and ups in gu as `layout`
 * (FORGE__GU_PAIRS, FORGE__GU_HALVES) places them (act_mul.comp). */
static void forge__record_act_mul(const forge__pass *p, forge__range h, forge__range gu, uint32_t count, uint32_t ffn, uint32_t layout) {
    uint32_t gx, gy;
    forge__pc_act pc = {count, (uint32_t)p->m->cfg.act, layout, ffn, 0, 0};
    forge__range b[3] = {h, gu, p->dummy};
    forge__grid(((uint64_t)count + 255) / 256, &gx, &gy);
    forge__dispatch(p->r, FORGE__OP_ACT_MUL, b, &pc, gx, gy, 1);
}

/* ---- Mixture of experts ----
 * A mixture-of-experts layer's router picks each token's top_k experts: moe_route.comp writes
 * (expert, weight) per (token, choice) pair p = t * top_k + j into acts.route. The experts'
 * gated MLPs then run on the chosen pairs only. A few tokens on a subgroup device (decode):
 * matvec_sg reads just the chosen experts' rows, a workgroup layer per pair for gate|up and
 * each for down too (a token's choices in parallel, not in turn: the H200 read the 30B-A3B
 * shape's down experts at 0.31 TB/s summing in the kernel). Otherwise (prefill): moe_group.comp
 * sorts the pairs by expert into tiles of at most FORGE__MOE_BM pairs, and matmul.comp's MOE
 * build multiplies each tile with its expert's rows. Either way moe_combine.comp then sums each
 * token's outputs by weight. Expert weights are row-chunked by whole experts
 * (forge__plan_expert_weight); every dispatch runs per chunk and skips the others' experts. */

/* The router: acts.route from the normed input xin [n, H]. */
static void forge__record_route(const forge__pass *p, int l, const forge__acts *a, forge__range xin) {
    const forge__config *c = &p->m->cfg;
    const forge__layer *ly = &p->m->layers[l];
    uint32_t E = (uint32_t)c->n_experts;
    forge__linear(p, &ly->router, xin, 0, p->n, a->router, E, 0, NULL, NULL, 0, 0);
    forge__barrier(p->r);
    bool scaled = c->router == FORGE__ROUTER_GEMMA4;
    forge__pc_moe_route pc = {E, (uint32_t)c->n_experts_used, (c->moe_norm_topk ? 1u : 0u) | (scaled ? 2u : 0u), p->n};
    forge__range b[3] = {a->router, a->route, scaled ? ly->expert_scale.r : p->dummy};
    uint32_t gx, gy;
    forge__grid(p->n, &gx, &gy);
    forge__dispatch(p->r, FORGE__OP_MOE_ROUTE, b, &pc, gx, gy, 1);
    forge__barrier(p->r);
}

/* out [n, H] (+)= sum over each token's choices of weight * expert(xin row) (acts.route set). */
static void forge__record_experts(const forge__pass *p, int l, const forge__acts *a, forge__range xin, forge__range out, bool accumulate) {
    forge_model *m = p->m;
    const forge__config *c = &m->cfg;
    const forge__layer *ly = &m->layers[l];
    const forge__weight *gu = &ly->exp_gate_up, *dn = &ly->exp_down;
    uint32_t n = p->n, K = (uint32_t)c->n_experts_used, I = (uint32_t)c->moe_ffn, H = (uint32_t)c->hidden, pairs = n * K;
    uint32_t act_flag = c->act == FORGE__ACT_GELU_TANH ? FORGE__LINEAR_GELU : 0, gx, gy;
    forge__rec *r = p->r;
    if (n <= FORGE__MATVEC_MAX_M && m->dev.caps.subgroup_arith) {
        uint32_t rows = forge__matvec_rows_per_wg(true, 0);
        for (int i = 0; i < gu->n_chunks; i++) { /* h [pairs, I] = act(gate) * up of each pair's expert */
            const forge__wchunk *ch = &gu->chunks[i];
            bool mlx = gu->fmt == FORGE__W_MLX;
            forge__range b[8] = {xin, ch->w, a->h, p->dummy, mlx ? ch->scales : p->dummy, mlx ? ch->biases : p->dummy, p->dummy, a->route};
            forge__pc_linear pc = {1, H, I, 0, I, 0, FORGE__LINEAR_GATED | FORGE__LINEAR_EXPERTS | act_flag, 0, 0, gu->bits, gu->group,
                                   gu->qflags, 0, 0, 0, ch->row0 / (2 * I), ch->rows / (2 * I), K, K, 0};
            forge__grid((I + rows - 1) / rows, &gx, &gy);
            forge__dispatch(r, (forge__op)(FORGE__OP_MATVEC_SG + gu->fmt), b, &pc, gx, gy, pairs);
        }
        forge__barrier(r);
        for (int i = 0; i < dn->n_chunks; i++) { /* moe_y [pairs, H] = down(h) of each pair's expert */
            const forge__wchunk *ch = &dn->chunks[i];
            bool mlx = dn->fmt == FORGE__W_MLX;
            forge__range b[8] = {a->h, ch->w, a->moe_y, p->dummy, mlx ? ch->scales : p->dummy, mlx ? ch->biases : p->dummy, p->dummy, a->route};
            forge__pc_linear pc = {1, I, H, 0, H, 0, FORGE__LINEAR_EXPERTS, 0, 0, dn->bits, dn->group, dn->qflags, 0, 0, 0,
                                   ch->row0 / H, ch->rows / H, K, 1, 0};
            forge__grid((H + rows - 1) / rows, &gx, &gy);
            forge__dispatch(r, (forge__op)(FORGE__OP_MATVEC_SG + dn->fmt), b, &pc, gx, gy, pairs);
        }
    } else {
        /* the pairs grouped by expert */
        uint32_t E = (uint32_t)c->n_experts, order_off = forge__moe_order_off(E, pairs), tiles = (uint32_t)forge__moe_max_tiles(E, pairs);
        forge__pc_moe_group pg = {pairs, (uint32_t)c->n_experts, FORGE__MOE_BM, order_off};
        forge__range bg[2] = {a->route, a->moe};
        forge__dispatch(r, FORGE__OP_MOE_GROUP, bg, &pg, 1, 1, 1);
        forge__barrier(r);
        for (int i = 0; i < gu->n_chunks; i++) { /* gu [pairs, 2I]: each pair's gate and up, interleaved */
            const forge__wchunk *ch = &gu->chunks[i];
            bool mlx = gu->fmt == FORGE__W_MLX;
            forge__range b[7] = {xin, ch->w, a->gu, p->dummy, mlx ? ch->scales : p->dummy, mlx ? ch->biases : p->dummy, a->moe};
            forge__pc_linear pc = {pairs, H, 2 * I, 0, 2 * I, 0, 0, 0, 0, gu->bits, gu->group, gu->qflags, 0, 0, 0,
                                   ch->row0 / (2 * I), ch->rows / (2 * I), K, K, order_off};
            forge__dispatch(r, (forge__op)(FORGE__OP_MATMUL_MOE + gu->fmt), b, &pc, (2 * I + 63) / 64, tiles, 1);
        }
        forge__barrier(r);
        forge__record_act_mul(p, a->h, a->gu, pairs * I, I, FORGE__GU_PAIRS);
        forge__barrier(r);
        for (int i = 0; i < dn->n_chunks; i++) { /* moe_y [pairs, H] */
            const forge__wchunk *ch = &dn->chunks[i];
            bool mlx = dn->fmt == FORGE__W_MLX;
            forge__range b[7] = {a->h, ch->w, a->moe_y, p->dummy, mlx ? ch->scales : p->dummy, mlx ? ch->biases : p->dummy, a->moe};
            forge__pc_linear pc = {pairs, I, H, 0, H, 0, 0, 0, 0, dn->bits, dn->group, dn->qflags, 0, 0, 0, ch->row0 / H, ch->rows / H, K, 1,
                                   order_off};
            forge__dispatch(r, (forge__op)(FORGE__OP_MATMUL_MOE + dn->fmt), b, &pc, (H + 63) / 64, tiles, 1);
        }
    }
    forge__barrier(r);
    forge__pc_moe_combine pcm = {n, H, K, accumulate ? 1u : 0u};
    forge__range bc[3] = {a->route, a->moe_y, out};
    forge__grid(n, &gx, &gy);
    forge__dispatch(r, FORGE__OP_MOE_COMBINE, bc, &pcm, (H + 255) / 256, gx, gy);
}

/* Whether layer l of a one-token decode runs as a chain of int8 products that quantize their
 * outputs for the next (matvec_q8a's Q8_OUT) instead of an act_q8 dispatch before each: q|k|v
 * read the residual stream as the last layer's down product quantized it (times this layer's
 * attention norm), o gets its input from the attention's merge and quantizes the residual for
 * gate|up (times the MLP norm), gate|up quantizes the MLP's middle for down, and down the
 * residual for the next layer's q|k|v (not the head's: the 128256-row product read the G8
 * scales 6-25% slower than act_q8's, more than the dispatch before it costs; measured while the
 * G8 path was a flag of the plain module, not since).
 * Two act_q8 dispatches and barriers fewer a layer (about 4 us each on the H100: 49 of them
 * were 184 us of a 1.2 ms token of the 1B Q4_0 shape, bench/RESULTS.md). The chained
 * activations are rounded in groups of 8 (a product's workgroup's outputs), not act_q8's blocks
 * of 32: finer, so the logits differ from the unchained path's by that rounding (H100, decode:
 * the 1B Q4_0 shape 920 -> 1029 tok/s, 1B Q8_0 801 -> 889, 8B Q4_0 303 -> 319). The plain Llama /
 * Qwen 3 layer only: norms fused (no adapter), dense MLP with fused gate|up, no sandwich norms or
 * per-layer inputs, every product on int8 activations. */
static bool forge__q8_chain(const forge__pass *p, int l) {
    const forge_model *m = p->m;
    const forge__config *c = &m->cfg;
    if (l < 0 || l >= c->n_layers) return false;
    const forge__layer *ly = &m->layers[l];
    if (!m->q8_chain || p->n != 1 || p->table || p->train || !p->fuse || !p->act_q8_res.buf || !ly->dense_mlp || !ly->fused_gate_up || c->sandwich_norms ||
        c->ple_dim || forge__kv_shared(c, l))
        return false;
    uint32_t H = (uint32_t)c->hidden, F = (uint32_t)c->layer_ffn[l];
    bool qkv = ly->fused_qkv ? forge__uses_q8a(p, &ly->wqkv, 1)
                             : forge__uses_q8a(p, &ly->wq, 1) && forge__uses_q8a(p, &ly->wk, 1) && forge__uses_q8a(p, &ly->wv, 1);
    return qkv && forge__uses_q8a(p, &ly->wo, 1) && forge__uses_q8a(p, &ly->gate_up, 1) && forge__uses_q8a(p, &ly->down, 1) &&
           forge__q8_out_fits(p, &ly->wo, H, 0, false) && forge__q8_out_fits(p, &ly->gate_up, F, 0, true) && forge__q8_out_fits(p, &ly->down, H, 0, false);
}

/* The prefill attention on tensor cores (attention_cm.comp: queries a workgroup below) for heads
 * of D elements where the pass can take it: f16 cache, tensor cores and not `exact` (q and P
 * are rounded to f16), a head of 64, 128 or 256; else FORGE__OP_COUNT (attention_tiled). */
#define FORGE__ATTN_CM_QUERIES 64
static forge__op forge__attn_cm_head_op(uint32_t D) {
    return D == 64 ? FORGE__OP_ATTN_CM : D == 128 ? FORGE__OP_ATTN_CM_128 : D == 256 ? FORGE__OP_ATTN_CM_256 : FORGE__OP_COUNT;
}
static forge__op forge__attn_cm_op(const forge__pass *p, uint32_t D) {
    return p->kv_f16 && p->m->attn_cm && forge__uses_a16(p->m) ? forge__attn_cm_head_op(D) : FORGE__OP_COUNT;
}

/* Gemma 2 / 3 decode: the post-attention norm added to the residual stream inside the gate|up
 * product (matvec_sg's POST_ADD: it reads the residual and the attention block's output and
 * writes their sum to a->gu, free in a fused gate|up product), and the post-MLP norm then adds
 * that to its own output into a->x (rmsnorm's FORGE__NORM_RESID): one dependent rmsnorm dispatch
 * fewer a layer (on the H100 each took 10.8 us; the Gemma3-1B shape's token had 52). One token
 * on matvec_sg, F32 / F16 / BF16 weights (int8 activations norm their input in act_q8), no
 * adapter on o or gate|up, nothing else between the norms (Gemma 4's experts, per-layer inputs
 * and layer scalars). */
static bool forge__post_fused(const forge__pass *p, int l, const forge__acts *a) {
    const forge__config *c = &p->m->cfg;
    const forge__layer *ly = &p->m->layers[l];
    for (int i = 0; i < ly->gate_up.n_chunks; i++) /* matvec_sg_post takes two gated outputs (four rows) a subgroup */
        if (ly->gate_up.chunks[i].rows % 4 != 0) return false;
    return c->sandwich_norms && p->n == 1 && !p->table && !p->train && p->fuse && ly->dense_mlp && ly->fused_gate_up && !c->ple_dim &&
           !c->layer_moe[l] && ly->out_scale == 1.0f && ly->gate_up.fmt <= FORGE__W_BF16 && !forge__uses_q8a(p, &ly->gate_up, 1) &&
           c->hidden % 8 == 0 && !forge__lora_any(p, l, FORGE__T_GU | (1u << FORGE__T_O)) && !a->x_mid.buf &&
           a->gu.size >= 4ull * c->hidden && forge__apart(a->gu, a->x) && forge__apart(a->gu, a->o) && forge__apart(a->gu, a->h);
}

/* One layer: attention block, then the MLP, each added to the residual stream a->x. */
static void forge__record_layer(const forge__pass *p, int l, const forge__acts *a) {
    forge_model *m = p->m;
    forge__rec *r = p->r;
    const forge__config *c = &m->cfg;
    const forge__layer *ly = &m->layers[l];
    bool shared = forge__kv_shared(c, l); /* Gemma 4's tail: queries only, attending to an earlier layer's cache */
    bool post_fused = forge__post_fused(p, l, a);
    uint32_t n = p->n, H = (uint32_t)c->hidden, D = forge__hd(c, l), NH = (uint32_t)c->n_heads, NKV = forge__nkv(c, l);
    uint32_t QD = NH * D, KVD = NKV * D, QKVD = forge__qkv_dim(c, l), F = (uint32_t)c->layer_ffn[l];
    uint32_t gx, gy;
    if (a->x_in.buf) forge__copy(r, a->x, a->x_in, 4ull * n * H);
    forge__range qkv_in = a->x;
    const forge__vec *qkv_norm = &ly->attn_norm;
    if (!p->fuse) {
        forge__rmsnorm(p, a->x, 0, &ly->attn_norm, a->xn, 0, n, H, 0);
        forge__barrier(r);
        qkv_in = a->xn;
        qkv_norm = NULL;
    }
    const forge__vec *bqkv = c->qkv_bias ? &ly->bqkv : NULL;
    /* a chain of int8 products (forge__q8_chain): x comes quantized by the layer before */
    bool chain = forge__q8_chain(p, l), chained_in = chain && forge__q8_chain(p, l - 1);
    uint32_t qkv_flags = chained_in ? FORGE__LINEAR_QUANTIZED_RES : 0;
    if (ly->fused_qkv) {
        forge__linear(p, &ly->wqkv, qkv_in, 0, n, a->qkv, QKVD, 0, bqkv, qkv_norm, qkv_flags, 0);
    } else {
        forge__linear(p, &ly->wq, qkv_in, 0, n, a->qkv, QKVD, 0, bqkv, qkv_norm, qkv_flags, 0);
        if (!shared) {
            forge__linear(p, &ly->wk, qkv_in, 0, n, a->qkv, QKVD, QD, bqkv, qkv_norm, qkv_flags, 0);
            forge__linear(p, &ly->wv, qkv_in, 0, n, a->qkv, QKVD, QD + KVD, bqkv, qkv_norm, qkv_flags, 0);
        }
    }
    if (forge__lora_any(p, l, FORGE__T_QKV)) {
        for (int t = FORGE__T_Q; t <= FORGE__T_V; t++) forge__lora_down(p, a, l, (forge__target)t, a->xn);
        forge__barrier(r);
        forge__lora_up(p, a, l, FORGE__T_Q, a->qkv, QKVD, 0, 1);
        forge__lora_up(p, a, l, FORGE__T_K, a->qkv, QKVD, QD, 1);
        forge__lora_up(p, a, l, FORGE__T_V, a->qkv, QKVD, QD + KVD, 1);
    }
    forge__barrier(r);
    /* One token's decode on subgroups: RoPE (and the q / k / v head norms) in attention_decode
     * (on the H100 a dependent dispatch costs about 4 us: 3.7% of the 1B F16 token). */
    bool decode = (n == 1 && !p->train && !p->table) || p->table == FORGE__TABLE_DECODE;
    bool rope_fused = decode && !p->table && m->attn_subgroups && D % 4 == 0;
    if (c->qk_norm && !rope_fused) {
        if (a->qkv_raw.buf) { /* the norms' inputs, for their backward pass */
            forge__copy(r, a->qkv, a->qkv_raw, 4ull * n * QKVD);
            forge__barrier(r);
        }
        forge__head_norm(p, a->qkv, &ly->q_norm, NH, 0, D, QKVD);
        if (!shared) forge__head_norm(p, a->qkv, &ly->k_norm, NKV, QD, D, QKVD);
        /* Gemma 4's values: RMSNorm without weight (k = v layers: of the keys' raw projection) */
        if (c->v_norm && !shared) forge__head_norm(p, a->qkv, &m->ones, NKV, QD + KVD, D, QKVD);
        forge__barrier(r);
    }
    /* RoPE on q in place, and k (rotated) and v into the cache: one dispatch (a KV-shared
     * layer: the queries only) */
    const forge__vec *rope = ly->sliding ? &m->rope_sliding : &m->rope_full;
    uint32_t rope_kv = shared ? 0 : NKV;
    if (!rope_fused) {
        forge__pc_rope pr = {n, NH, rope_kv, D, c->rope_adjacent_pairs, a->slots, QKVD, QD, QD + KVD, p->seq, p->table ? 1u : 0u};
        forge__range br[5] = {p->params, rope->r, a->qkv, a->kc, a->vc};
        uint32_t key_pairs = p->kv_f16 ? D / 4 : D / 2; /* an f16 cache's invocations take two pairs (rope.comp) */
        forge__grid(((uint64_t)n * (NH * (D / 2) + rope_kv * key_pairs) + 63) / 64, &gx, &gy);
        forge__dispatch(r, p->kv_f16 ? FORGE__OP_ROPE_KV16 : FORGE__OP_ROPE, br, &pr, gx, gy, 1);
        forge__barrier(r);
    }
    uint32_t seq = p->seq ? p->seq : n;
    uint32_t splits = forge__attn_splits(m, p->table != 0);
    uint32_t rope_flags = !rope_fused ? 0
                        : FORGE__ATTN_ROPE_Q | (c->rope_adjacent_pairs ? FORGE__ATTN_ROPE_ADJACENT : 0) | (shared ? 0 : FORGE__ATTN_ROPE_KEY) |
                              (c->qk_norm ? FORGE__ATTN_QK_NORM : 0) | (c->qk_norm && c->v_norm && !shared ? FORGE__ATTN_V_NORM : 0);
    forge__pc_attention pa = {seq, NH, NKV, D, p->seq ? p->seq : a->slots, ly->sliding ? (uint32_t)c->sliding_window : 0,
                              (float)c->attn_scale, (float)c->attn_softcap, splits, QKVD, p->seq * KVD,
                              (a->lse.buf ? 1u : 0u) | (p->table ? 2u : 0u) | rope_flags, (float)c->norm_eps,
                              forge__attn_min_run(m)};
    /* the o projection's input quantized by the attention's merge (one act_q8 dispatch fewer) */
    bool o_quantized = decode && D % 32 == 0 && forge__uses_q8a(p, &ly->wo, n);
    if (decode && D % 4 == 0) { /* decode: the keys split over `splits` workgroups per head (and row) */
        forge__range ba[13] = {p->params, a->qkv, a->kc, a->vc, a->attn_part, rope->r, a->kc, a->vc,
                               c->qk_norm ? ly->q_norm.r : p->dummy, c->qk_norm && !shared ? ly->k_norm.r : p->dummy,
                               a->att, o_quantized ? p->act_q8 : p->dummy, a->attn_done};
        if (m->attn_subgroups) {
            /* the runs merged by the last workgroup of each head: no combine dispatch (on the H100
             * 1B F16 decode 565 -> 577 tok/s, 1B Q4_0 877 -> 917, 8B Q4_0 301 -> 302) */
            pa.flags |= FORGE__ATTN_MERGE | (o_quantized ? FORGE__ATTN_MERGE_Q8 : 0);
            forge__dispatch(r, p->kv_f16 ? FORGE__OP_ATTN_DECODE_KV16 : FORGE__OP_ATTN_DECODE, ba, &pa, splits, NH, n);
        } else {
            forge__dispatch(r, p->kv_f16 ? FORGE__OP_ATTN_SPLIT_KV16 : FORGE__OP_ATTN_SPLIT, ba, &pa, splits, NH, n);
            forge__barrier(r);
            forge__pc_combine pcm = {NH, D, splits, o_quantized ? 1u : 0u};
            forge__range bc[3] = {a->attn_part, a->att, o_quantized ? p->act_q8 : p->dummy};
            forge__dispatch(r, FORGE__OP_ATTN_COMBINE, bc, &pcm, NH, n, 1);
        }
    } else { /* prefill and training: tiles of queries x keys, one grid layer per sequence */
        forge__range ba[6] = {p->params, a->qkv, a->kc, a->vc, a->att, a->lse.buf ? a->lse : p->dummy};
        forge__op cm = forge__attn_cm_op(p, D);
        uint32_t bq = cm != FORGE__OP_COUNT ? FORGE__ATTN_CM_QUERIES : forge__attn_block_queries(r->dmax);
        forge__dispatch(r, cm != FORGE__OP_COUNT ? cm : p->kv_f16 ? FORGE__OP_ATTENTION_KV16 : FORGE__OP_ATTENTION, ba, &pa, (seq + bq - 1) / bq, NH,
                        p->batch);
    }
    forge__barrier(r);
    if (c->sandwich_norms) {
        forge__linear(p, &ly->wo, a->att, 0, n, a->o, H, 0, &ly->bo, NULL, o_quantized ? FORGE__LINEAR_QUANTIZED : 0, 0);
        if (forge__lora_any(p, l, 1u << FORGE__T_O)) {
            forge__lora_down(p, a, l, FORGE__T_O, a->att);
            forge__barrier(r);
            forge__lora_up(p, a, l, FORGE__T_O, a->o, H, 0, 1);
        }
        forge__barrier(r);
        if (!post_fused) forge__rmsnorm(p, a->o, 0, &ly->post_attn_norm, a->x, 0, n, H, 1);
    } else if (chain) { /* ... and the residual quantized for gate|up */
        forge__linear_q8a(p, &ly->wo, a->att, 0, a->x, H, 0, &ly->bo, NULL,
                          FORGE__LINEAR_ACCUMULATE | (o_quantized ? FORGE__LINEAR_QUANTIZED : 0), 0, &ly->ffn_norm);
    } else {
        forge__linear(p, &ly->wo, a->att, 0, n, a->x, H, 0, &ly->bo, NULL,
                      FORGE__LINEAR_ACCUMULATE | (o_quantized ? FORGE__LINEAR_QUANTIZED : 0), 0);
        if (forge__lora_any(p, l, 1u << FORGE__T_O)) {
            forge__lora_down(p, a, l, FORGE__T_O, a->att);
            forge__barrier(r);
            forge__lora_up(p, a, l, FORGE__T_O, a->x, H, 0, 1);
        }
    }
    forge__barrier(r);
    if (a->x_mid.buf) forge__copy(r, a->x, a->x_mid, 4ull * n * H);
    /* Gemma 4 multiplies the residual stream by layer_scalar at the layer's end: in the last
     * norm that adds to it (the per-layer input's, or the MLP's) */
    bool ple = c->ple_dim > 0, gemma4_moe = c->layer_moe[l] && c->router == FORGE__ROUTER_GEMMA4;
    uint32_t end_flags = ly->out_scale != 1.0f ? FORGE__NORM_ADD | FORGE__NORM_SCALE : FORGE__NORM_ADD;
    /* the MLP: h = act(gate . x') * (up . x'), x' the normed residual */
    uint32_t act_flag = c->act == FORGE__ACT_GELU_TANH ? FORGE__LINEAR_GELU : 0;
    bool lora_gu = forge__lora_any(p, l, FORGE__T_GU);
    if (!ly->dense_mlp) {
        /* Qwen3-MoE's sparse layers: the experts alone, added to the residual */
    } else if (chain) { /* the residual as o quantized it; the middle quantized for down */
        forge__linear_q8a(p, &ly->gate_up, a->x, 0, a->h, F, 0, NULL, &ly->ffn_norm,
                          FORGE__LINEAR_GATED | act_flag | FORGE__LINEAR_QUANTIZED_RES | FORGE__LINEAR_Q8_OUT, 0, NULL);
    } else if (post_fused) { /* x + post_attn_norm(o) the product's input, and written to gu */
        forge__pass pp = *p;
        pp.post_p = a->o;
        pp.post_w = ly->post_attn_norm.r;
        pp.post_out = a->gu;
        forge__linear(&pp, &ly->gate_up, a->x, 0, n, a->h, F, 0, NULL, &ly->ffn_norm, FORGE__LINEAR_GATED | act_flag, 0);
    } else if (p->fuse && ly->fused_gate_up && !lora_gu) {
        forge__linear(p, &ly->gate_up, a->x, 0, n, a->h, F, 0, NULL, &ly->ffn_norm, FORGE__LINEAR_GATED | act_flag, 0);
    } else {
        forge__range mlp_in = a->x;
        const forge__vec *mlp_norm = &ly->ffn_norm;
        if (!p->fuse) {
            forge__rmsnorm(p, a->x, 0, &ly->ffn_norm, a->xn, 0, n, H, 0);
            forge__barrier(r);
            mlp_in = a->xn;
            mlp_norm = NULL;
        }
        /* both products into gu: the fused weight's rows interleaved (gate i at 2i, up i at
         * 2i + 1), or two weights side by side (gates, then ups) */
        uint32_t layout = ly->fused_gate_up ? FORGE__GU_PAIRS : FORGE__GU_HALVES;
        if (ly->fused_gate_up) {
            forge__linear(p, &ly->gate_up, mlp_in, 0, n, a->gu, 2 * F, 0, NULL, mlp_norm, 0, 0);
        } else {
            forge__linear(p, &ly->gate, mlp_in, 0, n, a->gu, 2 * F, 0, NULL, mlp_norm, 0, 0);
            forge__linear(p, &ly->up, mlp_in, 0, n, a->gu, 2 * F, F, NULL, mlp_norm, 0, 0);
        }
        if (lora_gu) {
            forge__lora_down(p, a, l, FORGE__T_GATE, a->xn);
            forge__lora_down(p, a, l, FORGE__T_UP, a->xn);
            forge__barrier(r);
            bool pairs = layout == FORGE__GU_PAIRS;
            forge__lora_up(p, a, l, FORGE__T_GATE, a->gu, 2 * F, 0, pairs ? 2 : 1);
            forge__lora_up(p, a, l, FORGE__T_UP, a->gu, 2 * F, pairs ? 1 : F, pairs ? 2 : 1);
        }
        forge__barrier(r);
        forge__record_act_mul(p, a->h, a->gu, n * F, F, layout);
    }
    forge__barrier(r);
    bool lora_down = forge__lora_any(p, l, 1u << FORGE__T_DOWN);
    if (!ly->dense_mlp) {
        forge__rmsnorm(p, a->x, 0, &ly->ffn_norm, a->xn, 0, n, H, 0);
        forge__barrier(r);
        forge__record_route(p, l, a, a->xn);
        forge__record_experts(p, l, a, a->xn, a->x, true);
    } else if (c->sandwich_norms) {
        forge__linear(p, &ly->down, a->h, 0, n, a->d, H, 0, NULL, NULL, 0, 0);
        if (lora_down) {
            forge__lora_down(p, a, l, FORGE__T_DOWN, a->h);
            forge__barrier(r);
            forge__lora_up(p, a, l, FORGE__T_DOWN, a->d, H, 0, 1);
        }
        forge__barrier(r);
        if (gemma4_moe) {
            /* Gemma 4: post_ffn_norm(post_ffn_norm_1(mlp) + post_ffn_norm_2(experts)); the
             * router reads the residual itself, the experts its pre_ffn_norm_2 */
            forge__rmsnorm(p, a->d, 0, &ly->post_ffn_norm_1, a->mlp_sum, 0, n, H, 0);
            forge__barrier(r); /* (d is xn) */
            forge__rmsnorm(p, a->x, 0, &ly->router_norm, a->xn, 0, n, H, 0);
            forge__barrier(r);
            forge__record_route(p, l, a, a->xn);
            forge__rmsnorm(p, a->x, 0, &ly->pre_ffn_norm_2, a->xn, 0, n, H, 0);
            forge__barrier(r);
            forge__record_experts(p, l, a, a->xn, a->moe_out, false);
            forge__barrier(r);
            forge__rmsnorm(p, a->moe_out, 0, &ly->post_ffn_norm_2, a->mlp_sum, 0, n, H, FORGE__NORM_ADD);
            forge__barrier(r);
            forge__rmsnorm_ex(p, a->mlp_sum, 0, &ly->post_ffn_norm, a->x, 0, n, H, ple ? FORGE__NORM_ADD : end_flags, ly->out_scale,
                              c->norm_eps);
        } else if (post_fused) { /* x = gu (the residual after the attention block) + post_ffn_norm(d) */
            forge__rmsnorm_resid(p, a->d, &ly->post_ffn_norm, a->gu, a->x, H);
        } else {
            forge__rmsnorm_ex(p, a->d, 0, &ly->post_ffn_norm, a->x, 0, n, H, ple ? FORGE__NORM_ADD : end_flags, ly->out_scale, c->norm_eps);
        }
    } else if (chain) { /* the middle as gate|up quantized it; the residual for the next layer */
        forge__linear_q8a(p, &ly->down, a->h, 0, a->x, H, 0, NULL, NULL, FORGE__LINEAR_ACCUMULATE | FORGE__LINEAR_QUANTIZED | FORGE__LINEAR_A_G8, 0,
                          forge__q8_chain(p, l + 1) ? &m->layers[l + 1].attn_norm : NULL);
    } else {
        forge__linear(p, &ly->down, a->h, 0, n, a->x, H, 0, NULL, NULL, FORGE__LINEAR_ACCUMULATE, 0);
        if (lora_down) {
            forge__lora_down(p, a, l, FORGE__T_DOWN, a->h);
            forge__barrier(r);
            forge__lora_up(p, a, l, FORGE__T_DOWN, a->x, H, 0, 1);
        }
    }
    forge__barrier(r);
    if (ple) { /* Gemma 4: x += norm(proj(act(gate(x)) * the layer's per-layer input)), times layer_scalar */
        uint32_t P = (uint32_t)c->ple_dim;
        forge__linear(p, &ly->ple_gate, a->x, 0, n, a->ple_g, P, 0, NULL, NULL, 0, 0);
        forge__barrier(r);
        forge__pc_act pact = {n * P, (uint32_t)c->act, FORGE__GU_APART, P, (uint32_t)c->n_layers * P, (uint32_t)l * P};
        forge__range bact[3] = {a->ple_tmp, a->ple_g, a->ple};
        forge__grid(((uint64_t)n * P + 255) / 256, &gx, &gy);
        forge__dispatch(r, FORGE__OP_ACT_MUL, bact, &pact, gx, gy, 1);
        forge__barrier(r);
        forge__linear(p, &ly->ple_proj, a->ple_tmp, 0, n, a->d, H, 0, NULL, NULL, 0, 0);
        forge__barrier(r);
        forge__rmsnorm_ex(p, a->d, 0, &ly->ple_norm, a->x, 0, n, H, end_flags, ly->out_scale, c->norm_eps);
        forge__barrier(r);
    }
}

/* The pass of a session: its scratch buffers and KV cache, the model's adapter if it has one. */
static forge__pass forge__session_pass(forge_session *s, forge__rec *r, uint32_t n) {
    forge_model *m = s->m;
    const forge__lora *lo = m->adapter.pairs ? &m->adapter : NULL;
    forge__pass p = {m, r, s->dummy, s->params_r, lo, n, 0, 1, forge__fuses_norm(m, n) && !lo, false, false, {0}, 0, {0}, {0}, {0}, {0}, s->kv_f16, {0}, {0}, {0}, {0}};
    if (m->act_q8) {
        p.act_q8 = s->act_q8;
        p.act_q8_res = s->act_q8_res;
    }
    if (forge__uses_a16(m)) p.a16 = s->a16;
    return p;
}

static forge__acts forge__session_acts(forge_session *s, int l) {
    return (forge__acts){.x = s->x, .xn = s->xn, .qkv = s->qkv, .att = s->att, .gu = s->gu, .h = s->h, .kc = s->kc[l], .vc = s->vc[l],
                         .slots = s->slots[l], .attn_part = s->attn_part, .attn_done = s->attn_done, .u = s->lora_u, .o = s->xn, .d = s->xn,
                         .router = s->router, .route = s->route, .moe = s->moe, .moe_y = s->moe_y, .moe_out = s->moe_out,
                         .mlp_sum = s->mlp_sum, .ple = s->ple, .ple_tmp = s->ple_tmp, .ple_g = s->ple_g};
}

/* Rows `tokens` (u32) of the table emb into x [n, dim], times scale (rounded as the model's
 * dtype rounds its products, Gemma). */
static void forge__record_embed_rows(const forge__pass *p, const forge__weight *emb, forge__range tokens, forge__range x, uint32_t dim,
                                     double scale) {
    const forge__config *c = &p->m->cfg;
    forge__pc_embed pe = {p->n, dim, 0, 0, (float)scale,
                          scale != 1.0 ? (c->dtype == FORGE__BF16 ? 1u : c->dtype == FORGE__F16 ? 2u : 0u) : 0u,
                          emb->bits, emb->group, emb->qflags};
    for (int i = 0; i < emb->n_chunks; i++) {
        const forge__wchunk *ch = &emb->chunks[i];
        bool mlx = emb->fmt == FORGE__W_MLX;
        forge__range b[5] = {tokens, ch->w, x, mlx ? ch->scales : p->dummy, mlx ? ch->biases : p->dummy};
        pe.row_begin = ch->row0;
        pe.row_count = ch->rows;
        forge__dispatch(p->r, (forge__op)(FORGE__OP_EMBED + emb->fmt), b, &pe, p->n, 1, 1);
    }
}

/* The token embeddings of the pass's tokens into x [n, H], scaled (Gemma). */
static void forge__record_embed(const forge__pass *p, forge__range tokens, forge__range x) {
    const forge__config *c = &p->m->cfg;
    forge__record_embed_rows(p, &p->m->tok_embd, tokens, x, (uint32_t)c->hidden, c->embed_scale);
}

/* Gemma 4's per-layer inputs of the pass's tokens (before the layers), every layer's [P]
 * slice side by side in acts.ple [n, layers * P]: (rmsnorm_P(x W_proj^T * H^-0.5) * w +
 * E_ple[token] * sqrt(P)) * 2^-0.5, x the scaled token embeddings. */
static void forge__record_ple(const forge__pass *p, const forge__acts *a, forge__range tokens) {
    forge_model *m = p->m;
    const forge__config *c = &m->cfg;
    uint32_t LP = (uint32_t)(c->n_layers * c->ple_dim);
    forge__record_embed_rows(p, &m->ple_embd, tokens, a->ple, LP, forge__round_to_dtype(sqrt((double)c->ple_dim), c->dtype));
    forge__linear(p, &m->ple_model_proj, a->x, 0, p->n, a->ple_tmp, LP, 0, NULL, NULL, 0, 0);
    forge__barrier(p->r);
    /* the projection's H^-0.5 folded into eps (forge__rmsnorm_ex) */
    forge__rmsnorm_ex(p, a->ple_tmp, 0, &m->ple_proj_norm, a->ple, 0, p->n * (uint32_t)c->n_layers, (uint32_t)c->ple_dim,
                      FORGE__NORM_ADD | FORGE__NORM_SCALE, (float)sqrt(0.5), c->norm_eps * c->hidden);
    forge__barrier(p->r);
}

static void forge__record_forward(forge_session *s, forge__rec *r, uint32_t n, uint32_t out_row0, uint32_t n_out,
                                  forge__out_mode mode) {
    forge_model *m = s->m;
    const forge__config *c = &m->cfg;
    uint32_t H = (uint32_t)c->hidden;
    forge__pass p = forge__session_pass(s, r, n);
    if (mode == FORGE__OUT_CLASSIFY) { /* n_out prompts of out_row0 tokens at positions 0.. (the cache is scratch) */
        p.seq = out_row0;
        p.batch = n_out;
    }
    bool batch = mode >= FORGE__OUT_BATCH_PREFILL, batch_reduce = mode == FORGE__OUT_BATCH_PREFILL || mode == FORGE__OUT_BATCH_DECODE;
    if (batch) { /* the row table follows the step params; the rows' temperatures follow the tokens */
        p.table = mode == FORGE__OUT_BATCH_PREFILL || mode == FORGE__OUT_BATCH_PREFILL_LOGITS ? FORGE__TABLE_PREFILL : FORGE__TABLE_DECODE;
        p.params = (forge__range){s->io.buf, 0, s->io.size};
        if (p.table == FORGE__TABLE_DECODE) { /* free around the products that split */
            p.split_part = s->gu;
            p.split_alt = s->h;
        }
    }
    if (!p.split_part.buf && m->dev.caps.coopmat_nv && !m->exact) {
        /* prefill on tensor cores: products with few 128 x 128 tiles split along k too (on the
         * H100, 512 x 8192 -> 2048 filled 64 tiles for 132 SMs: 1.31 ms, 13 TFLOP/s). Not on
         * the f32 path, whose results stay those of the unsplit kernels. */
        p.split_part = s->gu;
        p.split_alt = s->h;
    }
    forge__record_embed(&p, s->tokens_r, s->x);
    forge__barrier(r);
    if (c->ple_dim) {
        forge__acts a0 = forge__session_acts(s, 0);
        forge__record_ple(&p, &a0, s->tokens_r);
    }
    for (int l = 0; l < c->n_layers; l++) {
        forge__acts a = forge__session_acts(s, l);
        forge__record_layer(&p, l, &a);
    }
    if (n_out == 0) return;
    const forge__weight *head = c->tied ? &m->tok_embd : &m->output;
    uint32_t head_flags = c->final_softcap > 0 ? FORGE__LINEAR_SOFTCAP : 0;
    if (mode == FORGE__OUT_CLASSIFY) {
        /* each prompt's last row (indices in the io buffer) gathered into xn, the embedding
         * kernel reading the residual stream as a table; then the final norm and the head */
        forge__pc_embed pe = {n_out, H, 0, n, 1.0f, 0, 0, 0, 0};
        forge__range b[5] = {s->penalty_r, s->x, s->xn, p.dummy, p.dummy};
        forge__dispatch(r, (forge__op)(FORGE__OP_EMBED + FORGE__W_F32), b, &pe, n_out, 1, 1);
        forge__barrier(r);
        forge__rmsnorm(&p, s->xn, 0, &m->output_norm, s->xn, 0, n_out, H, 0);
        forge__barrier(r);
        forge__linear(&p, head, s->xn, 0, n_out, s->logits, (uint32_t)c->n_vocab, 0, NULL, NULL, head_flags, (float)c->final_softcap);
    } else if (forge__fuses_norm(m, n_out)) { /* the final norm fused into the head */
        forge__linear(&p, head, s->x, out_row0, n_out, s->logits, (uint32_t)c->n_vocab, 0, NULL, &m->output_norm, head_flags,
                      (float)c->final_softcap);
    } else {
        forge__rmsnorm(&p, s->x, out_row0, &m->output_norm, s->xn, 0, n_out, H, 0);
        forge__barrier(r);
        forge__linear(&p, head, s->xn, 0, n_out, s->logits, (uint32_t)c->n_vocab, 0, NULL, NULL, head_flags, (float)c->final_softcap);
    }
    forge__barrier(r);
    if (batch_reduce) { /* each row: the two-stage top-k at its own temperature (no penalty) */
        uint32_t V = (uint32_t)c->n_vocab, temp_word = (uint32_t)(s->tokens_r.offset + s->tokens_r.size) / 4;
        uint32_t pk[3] = {V, FORGE__CANDIDATES, temp_word};
        forge__range bk[4] = {p.params, s->logits, s->cand, s->cand_stats};
        forge__dispatch(r, FORGE__OP_TOPK, bk, pk, s->n_chunks, n_out, 1);
        forge__barrier(r);
        uint32_t pm[3] = {s->n_chunks, FORGE__CANDIDATES, temp_word};
        forge__range bm[4] = {p.params, s->cand, s->cand_stats, s->sample_out};
        forge__dispatch(r, FORGE__OP_TOPK_MERGE, bm, pm, 1, n_out, 1);
        forge__barrier(r);
        forge__copy(r, s->sample_out, (forge__range){s->readback.buf, FORGE__RB_LOGITS_OFFSET, s->readback.size - FORGE__RB_LOGITS_OFFSET},
                    8ull * n_out * (1 + FORGE__CANDIDATES));
    } else if (mode == FORGE__OUT_SAMPLE) { /* row 0 only: penalty, then the two-stage top-k */
        uint32_t V = (uint32_t)c->n_vocab;
        forge__range bp[3] = {s->params_r, s->penalty_r, s->logits};
        forge__dispatch(r, FORGE__OP_PENALTY, bp, &V, FORGE__MAX_PENALTY_WINDOW / 64, 1, 1);
        forge__barrier(r);
        if (m->sample_on_host) { /* the penalized row itself; forge__sample reduces it */
            forge__copy(r, s->logits, (forge__range){s->readback.buf, FORGE__RB_LOGITS_OFFSET, s->readback.size - FORGE__RB_LOGITS_OFFSET},
                        4ull * V);
        } else {
            uint32_t pk[3] = {V, FORGE__CANDIDATES, 0};
            forge__range bk[4] = {s->params_r, s->logits, s->cand, s->cand_stats};
            forge__dispatch(r, FORGE__OP_TOPK, bk, pk, s->n_chunks, 1, 1);
            forge__barrier(r);
            uint32_t pm[3] = {s->n_chunks, FORGE__CANDIDATES, 0};
            forge__range bm[4] = {s->params_r, s->cand, s->cand_stats, s->sample_out};
            forge__dispatch(r, FORGE__OP_TOPK_MERGE, bm, pm, 1, 1, 1);
            forge__barrier(r);
            forge__copy(r, s->sample_out, (forge__range){s->readback.buf, 0, s->readback.size}, s->sample_out.size);
        }
    } else {
        forge__copy(r, s->logits, (forge__range){s->readback.buf, FORGE__RB_LOGITS_OFFSET, s->readback.size - FORGE__RB_LOGITS_OFFSET},
                    4ull * n_out * (uint64_t)c->n_vocab);
    }
    forge__host_barrier(r);
}

static void forge__recording_free(forge__device *d, VkCommandPool cmd_pool, forge__recording *rc) {
    if (rc->cb) d->vk.vkFreeCommandBuffers(d->dev, cmd_pool, 1, &rc->cb);
    if (rc->pool) d->vk.vkDestroyDescriptorPool(d->dev, rc->pool, NULL);
    if (rc->qpool) d->vk.vkDestroyQueryPool(d->dev, rc->qpool, NULL);
    free(rc->ops);
    free(rc->shapes);
    memset(rc, 0, sizeof *rc);
}

/* Records what `fn` records into `slot`: once in counting mode to size the descriptor pool
 * exactly, then for real (with a timestamp after every dispatch when profiling). Sessions
 * and trainers record this way; the caller fills the slot's key. */
typedef void (*forge__record_fn)(void *ctx, forge__rec *r);
static forge_status forge__record(forge_model *m, VkCommandPool cmd_pool, bool profile, forge__record_fn fn, void *ctx, forge__recording *slot,
                                  forge__err *err) {
    forge__device *d = &m->dev;
    forge__rec r = {.dev = d, .pipes = m->pipes, .pipe_lock = &m->pipe_lock, .counting = true, .err = err,
                    .dmax = (uint32_t)forge__align_up((uint64_t)m->cfg.head_dim_max, 8)};
    fn(ctx, &r);
    if (r.st) return r.st;
    VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, r.n_descriptors ? r.n_descriptors : 1};
    VkDescriptorPoolCreateInfo dpi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, .maxSets = r.n_dispatches ? r.n_dispatches : 1,
                                      .poolSizeCount = 1, .pPoolSizes = &ps};
    if (d->vk.vkCreateDescriptorPool(d->dev, &dpi, NULL, &slot->pool) != VK_SUCCESS)
        return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "vkCreateDescriptorPool(%u sets) failed", r.n_dispatches);
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = cmd_pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    if (d->vk.vkAllocateCommandBuffers(d->dev, &cai, &slot->cb) != VK_SUCCESS) {
        forge__recording_free(d, cmd_pool, slot);
        return forge__fail(err, FORGE_ERR_DEVICE, "vkAllocateCommandBuffers failed");
    }
    if (profile) {
        VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, .queryType = VK_QUERY_TYPE_TIMESTAMP,
                                    .queryCount = r.n_dispatches + 1};
        slot->ops = (uint16_t *)calloc(r.n_dispatches + 1, sizeof *slot->ops);
        slot->shapes = (forge__mat_work *)calloc(r.n_dispatches + 1, sizeof *slot->shapes);
        if (!slot->ops || !slot->shapes || d->vk.vkCreateQueryPool(d->dev, &qi, NULL, &slot->qpool) != VK_SUCCESS) {
            forge__recording_free(d, cmd_pool, slot);
            return forge__fail(err, FORGE_ERR_DEVICE, "creating the profiling query pool failed");
        }
        slot->n_dispatches = r.n_dispatches;
    }
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    d->vk.vkBeginCommandBuffer(slot->cb, &bi);
    r.counting = false;
    r.cb = slot->cb;
    r.pool = slot->pool;
    r.n_dispatches = 0;
    if (slot->qpool) {
        r.qpool = slot->qpool;
        r.ops = slot->ops;
        r.shapes = slot->shapes;
        d->vk.vkCmdResetQueryPool(slot->cb, slot->qpool, 0, slot->n_dispatches + 1);
        d->vk.vkCmdWriteTimestamp(slot->cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, slot->qpool, 0);
    }
    fn(ctx, &r);
    d->vk.vkEndCommandBuffer(slot->cb);
    if (r.st) forge__recording_free(d, cmd_pool, slot);
    return r.st;
}

/* A slot for a new recording among `n` (a free one, else the least recently used, freed). */
static forge__recording *forge__recording_slot(forge__device *d, VkCommandPool cmd_pool, forge__recording *recs, int n) {
    forge__recording *lru = &recs[0];
    for (int i = 0; i < n; i++) {
        if (!recs[i].cb) return &recs[i];
        if (recs[i].last_use < lru->last_use) lru = &recs[i];
    }
    forge__recording_free(d, cmd_pool, lru);
    return lru;
}

typedef struct forge__forward_args {
    forge_session *s;
    uint32_t n, out_row0, n_out;
    forge__out_mode mode;
} forge__forward_args;

static void forge__record_forward_fn(void *ctx, forge__rec *r) {
    forge__forward_args *a = (forge__forward_args *)ctx;
    forge__record_forward(a->s, r, a->n, a->out_row0, a->n_out, a->mode);
}

/* Returns the recorded command buffer for a shape, recording it on first use. */
static forge_status forge__get_recording(forge_session *s, uint32_t n, uint32_t out_row0, uint32_t n_out, forge__out_mode mode,
                                        forge__recording **out) {
    for (int i = 0; i < FORGE__RECORDINGS; i++) {
        forge__recording *rc = &s->rec[i];
        if (rc->cb && rc->n_tokens == n && rc->out_row0 == out_row0 && rc->n_out == n_out && rc->mode == (uint32_t)mode) {
            rc->last_use = ++s->use_clock;
            *out = rc;
            return FORGE_OK;
        }
    }
    forge__recording *slot = forge__recording_slot(&s->m->dev, s->cmd_pool, s->rec, FORGE__RECORDINGS);
    forge__forward_args args = {s, n, out_row0, n_out, mode};
    forge_status st = forge__record(s->m, s->cmd_pool, s->profile, forge__record_forward_fn, &args, slot, &s->err);
    if (st) return st;
    slot->n_tokens = n;
    slot->out_row0 = out_row0;
    slot->n_out = n_out;
    slot->mode = (uint32_t)mode;
    slot->last_use = ++s->use_clock;
    *out = slot;
    return FORGE_OK;
}

/* Adds a profiled recording's timestamps to the per-op totals. */
static void forge__profile_collect(forge__device *d, forge__profile *pf, const forge__recording *rc) {
    uint64_t ts[4096];
    uint32_t n = FORGE__MIN(rc->n_dispatches + 1, 4096u);
    if (d->vk.vkGetQueryPoolResults(d->dev, rc->qpool, 0, n, sizeof ts, ts, 8, VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) != VK_SUCCESS)
        return;
    double period_ms = d->caps.props.limits.timestampPeriod * 1e-6;
    for (uint32_t i = 0; i + 1 < n; i++) {
        double ms = (double)(ts[i + 1] - ts[i]) * period_ms;
        pf->ms[rc->ops[i]] += ms;
        pf->calls[rc->ops[i]]++;
        const forge__mat_work *w = &rc->shapes[i];
        if (!w->N) continue;
        int k = 0; /* per matrix shape too: where the time of the products goes */
        while (k < pf->n_shapes && (pf->shape[k].op != rc->ops[i] || pf->shape[k].N != w->N || pf->shape[k].K != w->K)) k++;
        if (k == pf->n_shapes) {
            if (k == (int)FORGE__ARRAY_LEN(pf->shape)) continue;
            pf->shape[k] = (struct forge__prof_shape){rc->ops[i], w->N, w->K, w->bits16, 0, 0, 0, 0};
            pf->n_shapes++;
        }
        pf->shape[k].ms += ms;
        pf->shape[k].calls++;
        pf->shape[k].rows += w->M;
        pf->shape[k].mats += w->mats;
    }
}

/* The profile as JSON {"kernel": {"calls": N, "ms": T}, ..., "kernel NxK": {"calls", "ms", "rows",
 * "gb_s", "tflop_s"}, ...} into out: per matrix shape also the rows multiplied (M summed over
 * the calls), the weights' read rate (N K bits / 8 bytes a matrix read: once a call, an expert
 * product's once per chosen expert) and the products' rate (2 N K rows flops). */
static forge_status forge__profile_json(const forge__profile *pf, char *out, size_t capacity, size_t *len) {
    size_t o = 0;
    int first = 1;
#define FORGE__PJ(...) do { int k_ = snprintf(out && o < capacity ? out + o : NULL, out && o < capacity ? capacity - o : 0, __VA_ARGS__); \
                            if (k_ > 0) o += (size_t)k_; } while (0)
    FORGE__PJ("{");
    for (int i = 0; i < FORGE__OP_COUNT; i++) {
        if (!pf->calls[i]) continue;
        FORGE__PJ("%s\"%s\": {\"calls\": %llu, \"ms\": %.3f}", first ? "" : ", ", forge__ops[i].name, (unsigned long long)pf->calls[i], pf->ms[i]);
        first = 0;
    }
    for (int i = 0; i < pf->n_shapes; i++) {
        const struct forge__prof_shape *sh = &pf->shape[i];
        double sec = sh->ms > 0 ? sh->ms * 1e-3 : 1e-30, nk = (double)sh->N * (double)sh->K;
        FORGE__PJ("%s\"%s %ux%u\": {\"calls\": %llu, \"ms\": %.3f, \"rows\": %llu, \"gb_s\": %.1f, \"tflop_s\": %.2f}", first ? "" : ", ",
                  forge__ops[sh->op].name, sh->N, sh->K, (unsigned long long)sh->calls, sh->ms, (unsigned long long)sh->rows,
                  nk * sh->bits16 / 128.0 * (double)sh->mats / sec * 1e-9, 2.0 * nk * (double)sh->rows / sec * 1e-12);
        first = 0;
    }
    FORGE__PJ("}");
#undef FORGE__PJ
    *len = o;
    return out && capacity > o ? FORGE_OK : FORGE_ERR_BUFFER_TOO_SMALL;
}

/* Makes bytes [offset, offset + bytes) of a readback buffer visible to the host, on memory
 * that is not coherent: only those (rounded out to nonCoherentAtomSize), not the whole buffer
 * of n_out_max logit rows, since a decode step reads back a few KiB. */
static void forge__readback_invalidate(forge__device *d, const forge__buffer *rb, uint64_t offset, uint64_t bytes) {
    if (d->caps.readback_coherent) return;
    uint64_t atom = FORGE__MAX(d->caps.props.limits.nonCoherentAtomSize, 1), lo = offset / atom * atom;
    uint64_t hi = (offset + bytes + atom - 1) / atom * atom;
    VkMappedMemoryRange mr = {.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, .memory = rb->mem, .offset = lo,
                              .size = hi >= rb->size ? VK_WHOLE_SIZE : hi - lo};
    d->vk.vkInvalidateMappedMemoryRanges(d->dev, 1, &mr);
}

/* Runs one step of n tokens at position n_past. FORGE__OUT_LOGITS copies n_out logit rows to
 * `logits`; FORGE__OUT_SAMPLE (n_out = 1) leaves the sampler's candidates in the readback
 * buffer, with `sp` giving the penalty and temperature (its ids already in the io buffer). */
static forge_status forge__step(forge_session *s, const int32_t *tokens, uint32_t n, uint32_t out_row0, uint32_t n_out,
                                forge__out_mode mode, const forge__step_params *sp, float *logits) {
    forge__device *d = &s->m->dev;
    forge__recording *rc;
    forge_status st = forge__get_recording(s, n, out_row0, n_out, mode, &rc);
    if (st) return st;
    forge__step_params p = {0, 0, 0, 1.0f, 1.0f, 0, {0, 0}};
    if (sp) p = *sp;
    p.pos0 = (uint32_t)s->n_past;
    p.n_tokens = n;
    if (!s->n_past) s->kv_from = s->kv_high = 0; /* a new sequence: nothing of the old one is left */
    memcpy(s->io.mapped, &p, sizeof p);
    memcpy((uint8_t *)s->io.mapped + s->tokens_r.offset, tokens, 4ull * n);
    if ((st = forge__submit_wait(d, rc->cb, s->fence, &s->err))) return st;
    if (rc->qpool) forge__profile_collect(d, &s->prof, rc);
    uint64_t bytes = 4ull * n_out * (uint64_t)s->m->cfg.n_vocab;
    if (mode == FORGE__OUT_LOGITS && bytes && logits) {
        forge__readback_invalidate(d, &s->readback, FORGE__RB_LOGITS_OFFSET, bytes);
        memcpy(logits, (uint8_t *)s->readback.mapped + FORGE__RB_LOGITS_OFFSET, (size_t)bytes);
    }
    memcpy(s->history + s->n_past, tokens, 4ull * n);
    s->n_past += (int)n;
    s->kv_high = FORGE__MAX(s->kv_high, s->n_past);
    return FORGE_OK;
}

/* ---- Sliding a full context (forge_overflow) ----
 * The kept tokens are history[0, keep) and history[keep + d, n_past); they end at n_past - d.
 * SHIFT moves the cache rows of the second run down d rows (transfer copies in chunks of d
 * rows, so a copy's source and destination never overlap) and rotates the keys back by d
 * positions: rope_back.comp is the rotation by -(pos * inv_freq[i]) with the model's pair
 * layout and frequencies, so with seq_len 1 and pos0 = d it turns a key rotated for position
 * p into one rotated for p - d (the rotations compose; linear and llama3 scaling only change
 * inv_freq). A sliding layer's ring holds position p in slot p % slots; until it wraps
 * (n_past <= slots) slots are positions and it moves like a full layer. A wrapped ring holds
 * positions [n_past - slots, n_past): the new position q sits in slot q % slots and its key
 * was in slot (q + d) % slots, so the whole ring rotates left by d % slots (through a scratch
 * buffer: the activations of the MLP or the logits, whichever is larger, idle between steps)
 * and every row is rotated back. Kept positions still in the ring move with it, so their
 * slots then hold other keys (kv_from): the shift is taken only when the next query's
 * window no longer reaches the kept tokens (and the ring fits the scratch), else the slide
 * recomputes. */

/* The tokens a slide keeps at the start: n_keep, or the BOS token the sequence starts with. */
static int forge__slide_keep(const forge_session *s) {
    if (s->n_keep > 0) return FORGE__MIN(s->n_keep, s->n_past);
    return s->n_past > 0 && s->m->tok.n_vocab && s->history[0] == s->m->tok.bos ? 1 : 0;
}

/* Rotates the keys of cache rows [row0, row0 + n) back by params.pos0 positions: rope_back
 * over the rows as n "tokens" of n_kv_heads key heads, every one at position pos0 (seq_len 1);
 * its -DKV_F16 build on an f16 cache. */
static void forge__rope_shift(forge__rec *r, forge__range params, forge__range inv_freq, forge__range kc, uint32_t row0, uint32_t n,
                              uint32_t NKV, uint32_t D, bool adjacent, bool f16) {
    forge__pc_rope_back pc = {n, 0, NKV, D, adjacent, NKV * D, row0 * NKV * D, 1};
    forge__range b[3] = {params, inv_freq, kc};
    uint32_t gx, gy;
    forge__grid(((uint64_t)n * NKV * (f16 ? D / 4 : D / 2) + 63) / 64, &gx, &gy); /* f16: two pairs an invocation */
    forge__dispatch(r, f16 ? FORGE__OP_ROPE_SHIFT_KV16 : FORGE__OP_ROPE_BACK, b, &pc, gx, gy, 1);
}

typedef struct forge__shift_args {
    forge_session *s;
    uint32_t keep, d;
} forge__shift_args;

/* Rows [from, from + n) of a cache range to [to, to + n): copies no longer than the distance
 * (so none overlaps itself), in the order that reads every row before it is overwritten. */
static void forge__move_rows(forge__rec *r, forge__range buf, uint32_t from, uint32_t to, uint32_t n, uint64_t row) {
    uint32_t gap = from > to ? from - to : to - from;
    for (uint32_t done = 0; gap && done < n;) {
        uint32_t k = FORGE__MIN(gap, n - done), at = from > to ? done : n - done - k;
        forge__range src = buf, dst = buf;
        src.offset += (uint64_t)(from + at) * row;
        dst.offset += (uint64_t)(to + at) * row;
        forge__copy(r, src, dst, k * row);
        forge__barrier(r);
        done += k;
    }
}

/* The scratch a ring rotation goes through (see above). */
static forge__range forge__shift_scratch(const forge_session *s) { return s->gu.size >= s->logits.size ? s->gu : s->logits; }

/* Can SHIFT slide this cache (keep, drop d)? Only wrapped rings can say no (see above). */
static bool forge__shift_possible(const forge_session *s, int keep, int d) {
    const forge__config *c = &s->m->cfg;
    if (!forge__uniform_kv(c)) return false; /* Gemma 4's layers differ in shape: the context is recomputed instead */
    uint64_t row = forge__kv_row_bytes(c, 0, s->kv_f16);
    for (int l = 0; l < c->n_layers; l++) {
        int S = (int)s->slots[l];
        if (s->n_past <= S) continue;
        int need_from = FORGE__MAX(0, s->n_past - d - c->sliding_window + 1); /* the next query's window */
        if (keep > need_from || (uint64_t)S * row > forge__shift_scratch(s).size) return false;
    }
    return true;
}

static void forge__record_shift_fn(void *ctx, forge__rec *r) {
    const forge__shift_args *a = (const forge__shift_args *)ctx;
    forge_session *s = a->s;
    const forge__config *c = &s->m->cfg;
    uint32_t D = (uint32_t)c->head_dim, NKV = (uint32_t)c->n_kv_heads, n_past = (uint32_t)s->n_past;
    uint64_t row = forge__kv_row_bytes(c, 0, s->kv_f16);
    forge__range scratch = forge__shift_scratch(s);
    for (int l = 0; l < c->n_layers; l++) {
        uint32_t S = s->slots[l], row0 = a->keep, rows = n_past - a->keep - a->d; /* the rows to rotate back */
        for (int v = 0; v < 2; v++) {
            forge__range buf = (v ? s->vc : s->kc)[l];
            if (n_past <= S) { /* slots are positions */
                forge__move_rows(r, buf, a->keep + a->d, a->keep, rows, row);
                continue;
            }
            uint32_t k = a->d % S; /* rotate the ring left by k: scratch = ring[k, S) ring[0, k), then back */
            forge__range lo = buf, hi = buf, sc_hi = scratch;
            hi.offset += (uint64_t)k * row;
            sc_hi.offset += (uint64_t)(S - k) * row;
            forge__copy(r, hi, scratch, (S - k) * row);
            forge__copy(r, lo, sc_hi, k * row);
            forge__barrier(r);
            forge__copy(r, scratch, buf, S * row);
            forge__barrier(r);
            row0 = 0;
            rows = S;
        }
        const forge__vec *rope = s->m->layers[l].sliding ? &s->m->rope_sliding : &s->m->rope_full;
        forge__rope_shift(r, s->params_r, rope->r, s->kc[l], row0, rows, NKV, D, c->rope_adjacent_pairs, s->kv_f16);
    }
    forge__barrier(r);
}

/* Slides a full context once (forge_session_params.overflow): keeps forge__slide_keep tokens,
 * drops d = (n_past - keep) / 2 (at least 1) after them. FORGE_ERR_LIMIT when nothing follows
 * the kept ones. */
static forge_status forge__slide(forge_session *s) {
    int keep = forge__slide_keep(s), d = FORGE__MAX(s->n_past - keep, 0) / 2;
    if (d < 1 && s->n_past > keep) d = 1; /* one token after the kept ones: drop it */
    if (d < 1)
        return forge__fail(&s->err, FORGE_ERR_LIMIT, "the context (n_ctx %d) cannot slide: it keeps all %d of its %d tokens",
                           s->n_ctx, keep, s->n_past);
    if (s->n_dropped && s->drop_at != keep) s->n_dropped = 0; /* the record no longer describes one span */
    if (s->n_dropped + d > s->dropped_cap) {
        int cap = FORGE__MAX(s->n_dropped + d, 2 * s->dropped_cap);
        int32_t *grown = (int32_t *)realloc(s->dropped, 4ull * (size_t)cap);
        if (!grown) return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        s->dropped = grown;
        s->dropped_cap = cap;
    }
    memcpy(s->dropped + s->n_dropped, s->history + keep, 4ull * (size_t)d);
    s->n_dropped += d;
    s->drop_at = keep;
    int rest = s->n_past - keep - d;
    bool shift = s->overflow == FORGE_OVERFLOW_SHIFT && forge__shift_possible(s, keep, d);
    forge_status st = FORGE_OK;
    if (shift) {
        bool turned = false; /* a wrapped ring turns: its kept slots then hold dropped keys */
        for (int l = 0; l < s->m->cfg.n_layers; l++) turned |= (int)s->slots[l] < s->n_past;
        if (turned || s->kv_from > keep) s->kv_from = FORGE__MAX(keep, s->kv_from - d); /* positions renumbered */
        forge__step_params p = {(uint32_t)d, 0, 0, 1.0f, 1.0f, 0, {0, 0}}; /* rope_back reads pos0 = d */
        memcpy(s->io.mapped, &p, sizeof p);
        forge__recording rc = {0};
        forge__shift_args args = {s, (uint32_t)keep, (uint32_t)d};
        st = forge__record(s->m, s->cmd_pool, false, forge__record_shift_fn, &args, &rc, &s->err);
        if (!st) st = forge__submit_wait(&s->m->dev, rc.cb, s->fence, &s->err);
        forge__recording_free(&s->m->dev, s->cmd_pool, &rc);
        memmove(s->history + keep, s->history + keep + d, 4ull * (size_t)rest);
        s->n_past -= d;
        s->kv_high = s->n_past; /* a slide comes on a full context: kv_high was n_past */
    } else { /* re-prefill the kept tokens */
        int n = keep + rest;
        int32_t *kept = (int32_t *)malloc(4ull * (size_t)n);
        if (!kept) return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        memcpy(kept, s->history, 4ull * (size_t)keep);
        memcpy(kept + keep, s->history + keep + d, 4ull * (size_t)rest);
        s->n_past = 0;
        for (int done = 0; !st && done < n;) {
            int step = FORGE__MIN(n - done, s->n_batch);
            st = forge__step(s, kept + done, (uint32_t)step, (uint32_t)step - 1, 0, FORGE__OUT_LOGITS, NULL, NULL);
            done += step;
        }
        free(kept);
    }
    if (st) { /* the cache is in no known state */
        s->n_past = 0;
        s->n_dropped = 0;
        return st;
    }
    s->slides++;
    return FORGE_OK;
}

/* Makes room for n more tokens: slides while they do not fit (fails with FORGE_OVERFLOW_FAIL,
 * or when n > n_ctx - keep, naming n_ctx). */
static forge_status forge__make_room(forge_session *s, int n) {
    if (n <= s->n_ctx - s->n_past) return FORGE_OK;
    int keep = forge__slide_keep(s);
    if (s->overflow == FORGE_OVERFLOW_FAIL || n > s->n_ctx - keep)
        return forge__fail(&s->err, FORGE_ERR_LIMIT, "%d tokens do not fit: the session holds %d of n_ctx %d%s", n, s->n_past, s->n_ctx,
                           s->overflow == FORGE_OVERFLOW_FAIL ? "" : " and a slide keeps the first tokens (n_keep)");
    while (n > s->n_ctx - s->n_past) {
        forge_status st = forge__slide(s);
        if (st) return st;
    }
    return FORGE_OK;
}

static void forge__session_destroy(forge_session *s) {
    if (!s) return;
    forge_model *m = s->m;
    forge__device *d = &m->dev;
    if (d->dev) d->vk.vkDeviceWaitIdle(d->dev);
    for (int i = 0; i < FORGE__RECORDINGS; i++) forge__recording_free(d, s->cmd_pool, &s->rec[i]);
    if (s->copy_logits_cb) d->vk.vkFreeCommandBuffers(d->dev, s->cmd_pool, 1, &s->copy_logits_cb);
    if (s->cmd_pool) d->vk.vkDestroyCommandPool(d->dev, s->cmd_pool, NULL);
    if (s->fence) d->vk.vkDestroyFence(d->dev, s->fence, NULL);
    for (int b = 0; b < s->n_blocks; b++) forge__buffer_destroy(d, &s->blocks[b], &s->mem, &m->mem_total);
    forge__buffer_destroy(d, &s->io, &s->mem, &m->mem_total);
    forge__buffer_destroy(d, &s->readback, &s->mem, &m->mem_total);
    forge__arena_free(&s->arena);
    forge__buf_free(&s->class_text);
    free(s->dropped);
    free(s);
}

static forge_status forge__session_init(forge_session *s, const forge__session_plan *sp) {
    forge_model *m = s->m;
    forge__device *d = &m->dev;
    const forge__config *c = &m->cfg;
    forge_status st;
    s->n_ctx = sp->n_ctx;
    s->n_batch = sp->n_batch;
    s->n_out_max = sp->n_out_max;
    s->n_seq = sp->n_seq;
    s->kv_f16 = sp->kv_f16;
    s->history = (int32_t *)forge__arena_alloc(&s->arena, 4ull * (size_t)sp->n_ctx, 16);
    s->kc = (forge__range *)forge__arena_alloc(&s->arena, sizeof(forge__range) * (size_t)c->n_layers, 16);
    s->vc = (forge__range *)forge__arena_alloc(&s->arena, sizeof(forge__range) * (size_t)c->n_layers, 16);
    s->slots = (uint32_t *)forge__arena_alloc(&s->arena, sizeof(uint32_t) * (size_t)c->n_layers, 16);
    if (!s->history || !s->kc || !s->vc || !s->slots) return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    memcpy(s->slots, sp->slots, sizeof(uint32_t) * (size_t)c->n_layers);
    forge__session_kv_bytes(m, sp, &s->kv_bytes, &s->kv_sliding_bytes);
    if ((st = forge__session_pack(m, sp, &s->pack, &s->arena, &s->err))) return st;
    s->mem.planned = forge__pack_total(&s->pack) + forge__session_host_visible_bytes(m, sp);
    if ((st = forge__memory_check(m, s->mem.planned, "the session", "lower n_ctx, n_batch, n_outputs_max or n_seq_max", &s->err))) return st;
    s->n_blocks = s->pack.n_blocks;
    s->blocks = (forge__buffer *)forge__arena_alloc(&s->arena, sizeof *s->blocks * (size_t)s->n_blocks, 16);
    if (!s->blocks) return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int b = 0; b < s->n_blocks; b++)
        if ((st = forge__buffer_create(d, s->pack.block_sizes[b], d->caps.mem_device, false, &s->mem, &m->mem_total, &s->blocks[b], &s->err)))
            return forge__wrap(&s->err, st, "allocating session block %d of %d", b + 1, s->n_blocks);
    forge__range *dst[FORGE__SB_COUNT] = {
        [FORGE__SB_X] = &s->x, [FORGE__SB_XN] = &s->xn, [FORGE__SB_QKV] = &s->qkv, [FORGE__SB_ATT] = &s->att,
        [FORGE__SB_H] = &s->h, [FORGE__SB_GU] = &s->gu, [FORGE__SB_LOGITS] = &s->logits, [FORGE__SB_DUMMY] = &s->dummy,
        [FORGE__SB_CAND] = &s->cand, [FORGE__SB_CAND_STATS] = &s->cand_stats, [FORGE__SB_SAMPLE_OUT] = &s->sample_out,
        [FORGE__SB_ATTN_PART] = &s->attn_part, [FORGE__SB_ATTN_DONE] = &s->attn_done, [FORGE__SB_LORA_U] = &s->lora_u, [FORGE__SB_ACT_Q8] = &s->act_q8,
        [FORGE__SB_ACT_Q8_RES] = &s->act_q8_res, [FORGE__SB_A16] = &s->a16,
        [FORGE__SB_ROUTER] = &s->router, [FORGE__SB_ROUTE] = &s->route, [FORGE__SB_MOE] = &s->moe, [FORGE__SB_MOE_Y] = &s->moe_y,
        [FORGE__SB_MOE_OUT] = &s->moe_out, [FORGE__SB_MLP_SUM] = &s->mlp_sum, [FORGE__SB_PLE] = &s->ple, [FORGE__SB_PLE_TMP] = &s->ple_tmp,
        [FORGE__SB_PLE_G] = &s->ple_g,
    };
    int it = 0;
    for (size_t i = 0; i < FORGE__SB_COUNT; i++, it++) {
        const forge__pack_item *pi = &s->pack.items[it];
        *dst[i] = (forge__range){s->blocks[pi->block].buf, pi->offset, pi->size};
    }
    for (int l = 0; l < c->n_layers; l++)
        for (int kv = 0; kv < 2; kv++, it++) {
            const forge__pack_item *pi = &s->pack.items[it];
            (kv ? s->vc : s->kc)[l] = (forge__range){s->blocks[pi->block].buf, pi->offset, pi->size};
        }
    for (int l = 0; l < c->n_layers; l++) /* a KV-shared layer attends to its source's cache (an earlier layer: assigned) */
        if (forge__kv_shared(c, l)) {
            s->kc[l] = s->kc[c->kv_source[l]];
            s->vc[l] = s->vc[c->kv_source[l]];
        }
    /* (device memory the host sees is a small heap on some GPUs: system memory if it is full) */
    if (forge__buffer_create(d, forge__session_io_bytes(sp), d->caps.mem_step, true, &s->mem, &m->mem_total, &s->io, &s->err) &&
        (st = forge__buffer_create(d, forge__session_io_bytes(sp), d->caps.mem_upload, true, &s->mem, &m->mem_total, &s->io, &s->err)))
        return st;
    s->params_r = (forge__range){s->io.buf, 0, sizeof(forge__step_params)};
    s->penalty_r = (forge__range){s->io.buf, FORGE__IO_PENALTY_OFFSET, 4ull * FORGE__MAX_PENALTY_WINDOW};
    s->tokens_r = (forge__range){s->io.buf, FORGE__IO_TOKENS_OFFSET, 4ull * sp->n_batch};
    s->n_chunks = forge__topk_chunks(m);
    if ((st = forge__buffer_create(d, forge__session_readback_bytes(m, sp), d->caps.mem_readback, true, &s->mem, &m->mem_total,
                                   &s->readback, &s->err)))
        return st;
    VkCommandPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                   .queueFamilyIndex = d->caps.queue_family};
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if (d->vk.vkCreateCommandPool(d->dev, &pci, NULL, &s->cmd_pool) != VK_SUCCESS ||
        d->vk.vkCreateFence(d->dev, &fci, NULL, &s->fence) != VK_SUCCESS)
        return forge__fail(&s->err, FORGE_ERR_DEVICE, "creating the session's command pool or fence failed");
    if ((st = forge__zero_ranges(d, s->cmd_pool, s->fence, &s->attn_done, 1, &s->err))) return st; /* attention_decode's counters */
    /* Record the decode steps now, so the first token pays no recording cost. */
    forge__recording *rc;
    if ((st = forge__get_recording(s, 1, 0, 1, FORGE__OUT_SAMPLE, &rc))) return st;
    return forge__get_recording(s, 1, 0, 1, FORGE__OUT_LOGITS, &rc);
}

/* =======================================================================================
 * 8. Public API
 * Loading ties the sections together: files -> config -> device -> weights -> tokenizer.
 * ===================================================================================== */

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
        st = forge__safetensors_parse(f, &m->tensors, &m->arena, &m->err);
    }
    forge__names_free(&names);
    return st;
}

/* The checkpoint's chat template, kept to recognise its family (section 12): from
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
    m->attn_subgroups = forge__runs_attn_decode(&m->dev.caps);
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
    forge__device_close(d);
    forge__tokenizer_free(&m->tok);
    for (int i = 0; i < m->n_files; i++) forge__file_unmap(&m->files[i]);
    free(m->files);
    forge__arena_free(&m->arena);
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

FORGE_API forge_status forge_model_get_info(const forge_model *m, forge_model_info *info) {
    if (!info || !forge__model_ready(m)) return FORGE_ERR_INVALID_ARGUMENT;
    if (!forge__model_has_weights(m, "forge_model_get_info")) return FORGE_ERR_UNSUPPORTED;
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
    info->memory = (forge_memory_stats){m->arena.bytes, m->mem.planned, m->mem.in_use, forge__mem_peak(&m->mem_total), m->mem.n_buffers, m->mem.n_allocations, 0, 0};
    return FORGE_OK;
}

FORGE_API int forge_model_n_vocab(const forge_model *m) { return forge__model_ready(m) ? m->cfg.n_vocab : 0; }
FORGE_API int forge_model_n_ctx_train(const forge_model *m) { return forge__model_ready(m) ? m->cfg.n_ctx_train : 0; }

FORGE_API forge_status forge_session_plan(forge_model *m, const forge_session_params *params, forge_memory_stats *plan) {
    if (!forge__model_ready(m) || !plan) return FORGE_ERR_INVALID_ARGUMENT;
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
        memset(plan, 0, sizeof *plan);
        plan->device_planned_bytes = forge__pack_total(&pack) + forge__session_host_visible_bytes(m, &sp);
        plan->host_arena_bytes = a.bytes;
        plan->device_buffers = (uint64_t)pack.n_blocks + 2;
        forge__session_kv_bytes(m, &sp, &plan->kv_cache_bytes, &plan->kv_sliding_bytes);
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
FORGE_API forge_kv_type forge_session_kv_type(const forge_session *s) { return s && s->kv_f16 ? FORGE_KV_F16 : FORGE_KV_F32; }

/* Can the cache go back to n_keep tokens? Sliding-window layers keep `slots` positions in a
 * ring: continuing at n_keep needs the keys of positions [n_keep - window + 1, n_keep), which
 * later positions (up to kv_high - 1, beyond n_past after an earlier truncation) may have
 * overwritten. */
static bool forge__truncate_valid(const forge_session *s, int n_keep) {
    const forge__config *c = &s->m->cfg;
    if (n_keep == 0 || n_keep >= s->n_past) return true;
    if (s->kv_from > FORGE__MAX(0, n_keep - c->sliding_window + 1)) return false; /* not restored (section 14), or turned by a shift (forge__slide) */
    for (int l = 0; l < c->n_layers; l++) {
        if ((int)s->slots[l] >= s->n_ctx) continue; /* not rotating */
        int need_from = FORGE__MAX(0, n_keep - c->sliding_window + 1);
        if (need_from + (int)s->slots[l] < s->kv_high) return false;
    }
    return true;
}

FORGE_API forge_status forge_session_truncate(forge_session *s, int n_keep) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    if (n_keep < 0 || n_keep > s->n_past)
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "truncate to %d tokens: the session holds %d", n_keep, s->n_past);
    if (!forge__truncate_valid(s, n_keep))
        return forge__fail(&s->err, FORGE_ERR_LIMIT,
                           "cannot keep %d of %d tokens: the sliding-window layers' rotating cache has overwritten the keys "
                           "that continuing there needs (truncate to 0 instead)", n_keep, s->n_past);
    s->n_past = n_keep;
    if (n_keep <= s->drop_at) s->n_dropped = 0;
    return FORGE_OK;
}

FORGE_API forge_status forge_session_profile(const forge_session *s, char *out, size_t capacity, size_t *len) {
    if (!s || !len) return FORGE_ERR_INVALID_ARGUMENT;
    return forge__profile_json(&s->prof, out, capacity, len);
}

FORGE_API forge_status forge_session_memory(const forge_session *s, forge_memory_stats *st) {
    if (!s || !st) return FORGE_ERR_INVALID_ARGUMENT;
    *st = (forge_memory_stats){s->arena.bytes, s->mem.planned, s->mem.in_use, s->mem.peak, s->mem.n_buffers, s->mem.n_allocations,
                               s->kv_bytes, s->kv_sliding_bytes};
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

/* =======================================================================================
 * 9. Discovery
 * A directory tree searched for models without mapping a weight. The walk collects the
 * candidates (a directory with config.json and safetensors, each .gguf); each is then read
 * the way forge_model_load reads it, but with the headers read by pread (forge__file_read_head)
 * into the same parsers, and (unless quick) the loader's own plan (forge__plan_model) made on
 * a model that has no device, under nominal limits. Reports go out in path order.
 * ===================================================================================== */

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

/* =======================================================================================
 * 10. Generation
 * A generate call: find the longest exact prefix of the prompt the cache already holds
 * (rotating sliding-window layers permitting), prefill the rest, then one replayed decode
 * step per token. Each step ends in the device's reduction (penalty, top-k candidates and
 * the softmax normalizer); the host draws from the candidates. Stop rules: the family's end
 * tokens, the caller's tokens and strings (matched on text across tokens, never emitted),
 * max tokens, the callback, a full context (unless the session slides it: section 7; then
 * a prompt continuing the slid sequence is matched without the dropped tokens).
 * ===================================================================================== */

FORGE_API forge_generate_params forge_generate_default_params(void) {
    forge_generate_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.max_tokens = 256;
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_window = 64;
    p.add_special = 1;
    return p;
}

/* ---- the random generator: xoshiro256**, seeded through splitmix64 ---- */

static uint64_t forge__splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static void forge__rng_seed(uint64_t s[4], uint64_t seed) {
    for (int i = 0; i < 4; i++) s[i] = forge__splitmix64(&seed);
}
static uint64_t forge__rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static uint64_t forge__rng_next(uint64_t s[4]) {
    uint64_t r = forge__rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = forge__rotl(s[3], 45);
    return r;
}
static double forge__rng_uniform(uint64_t s[4]) { return (double)(forge__rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

/* ---- the host side of sampling ----
 * Input: candidates (logit after the penalty, id), best first, and the row's normalizer
 * (M, S: S = sum over the vocabulary of exp((l - M) / T)). Probabilities of candidates are
 * exact. Returns the id, or -1 when the draw needs tokens beyond the candidates. */

typedef struct forge__cand {
    float logit;
    int32_t id;
} forge__cand;

FORGE__INTERNAL int32_t forge__sample_candidates(const forge__cand *c, int n, int complete, double M, double S,
                                                 const forge_generate_params *p, uint64_t rng[4], double *probs) {
    if (n <= 0) return -1;
    if (p->temperature <= 0.0f) return c[0].id;
    double inv_t = 1.0 / p->temperature;
    for (int i = 0; i < n; i++) probs[i] = exp(((double)c[i].logit - M) * inv_t) / S;
    int k = n;
    bool cut = complete != 0;                /* is the kept set decided within the candidates? */
    if (p->top_k > 0) {
        if (p->top_k > n && !complete) return -1;
        k = FORGE__MIN(p->top_k, n);
        cut = true;
    }
    double mass = 0;                         /* of the top-k set (1 when top-k is off and complete) */
    for (int i = 0; i < k; i++) mass += probs[i];
    if (p->top_p < 1.0f) {
        /* HF: drop the tokens whose cumulative probability from the bottom is <= 1 - top_p,
         * probabilities renormalized over the top-k set; i.e. keep from the top until the
         * cumulative reaches top_p. */
        double total = cut ? mass : 1.0, cum = 0;
        int keep = 0;
        while (keep < k) {
            cum += probs[keep] / total;
            keep++;
            if (cum >= (double)p->top_p) break;
        }
        if (cum < (double)p->top_p && !cut) return -1; /* the nucleus reaches past the candidates */
        if (cum >= (double)p->top_p) cut = true;
        k = keep;
    }
    if (p->min_p > 0.0f) {
        double floor_p = (double)p->min_p * probs[0];
        int keep = 1;
        while (keep < k && probs[keep] >= floor_p) keep++;
        if (keep == k && !cut && probs[k - 1] >= floor_p) return -1; /* tail tokens may qualify */
        if (keep < k || probs[k - 1] < floor_p) cut = true;
        k = keep;
    }
    double total = 0;
    for (int i = 0; i < k; i++) total += probs[i];
    double u = forge__rng_uniform(rng);
    if (!cut) { /* a plain draw from the whole distribution: the tail holds 1 - total */
        if (u >= total) return -1;
        total = 1.0;
    } else {
        u *= total;
    }
    double acc = 0;
    for (int i = 0; i < k; i++) {
        acc += probs[i];
        if (u < acc) return c[i].id;
    }
    return c[k - 1].id;
}

static int forge__cmp_cand(const void *a, const void *b) {
    const forge__cand *x = (const forge__cand *)a, *y = (const forge__cand *)b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Copies logits row 0 (after the penalty) to the host: the sampler's fallback. */
static forge_status forge__fetch_logits_row(forge_session *s, float *out) {
    forge__device *d = &s->m->dev;
    if (!s->copy_logits_cb) {
        VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = s->cmd_pool,
                                           .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
        if (d->vk.vkAllocateCommandBuffers(d->dev, &cai, &s->copy_logits_cb) != VK_SUCCESS)
            return forge__fail(&s->err, FORGE_ERR_DEVICE, "vkAllocateCommandBuffers failed");
        VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
        d->vk.vkBeginCommandBuffer(s->copy_logits_cb, &bi);
        forge__rec r = {.dev = d, .cb = s->copy_logits_cb, .err = &s->err};
        forge__copy(&r, s->logits, (forge__range){s->readback.buf, FORGE__RB_LOGITS_OFFSET, 0}, 4ull * s->m->cfg.n_vocab);
        forge__host_barrier(&r);
        d->vk.vkEndCommandBuffer(s->copy_logits_cb);
    }
    forge_status st = forge__submit_wait(d, s->copy_logits_cb, s->fence, &s->err);
    if (st) return st;
    forge__readback_invalidate(&s->m->dev, &s->readback, FORGE__RB_LOGITS_OFFSET, 4ull * s->m->cfg.n_vocab);
    memcpy(out, (uint8_t *)s->readback.mapped + FORGE__RB_LOGITS_OFFSET, 4ull * s->m->cfg.n_vocab);
    return FORGE_OK;
}

/* The device reduction's work on the host (forge_model.sample_on_host): of row[V], the best n
 * candidates in topk_merge.comp's order (value descending, id ascending; NaN as -inf) into
 * out[n], through a heap whose root is the worst kept, and the normalizer M = max,
 * S = sum exp((l - M) * inv_t) over the row. */
FORGE__INTERNAL void forge__reduce_row_on_host(const float *row, int V, int n, double inv_t, forge__cand *out, double *M,
                                               double *S) {
    int kept = 0;
    for (int i = 0; i < V; i++) {
        forge__cand c = {isnan(row[i]) ? -INFINITY : row[i], i};
        int at;
        if (kept < n) { /* sift up from the new leaf */
            at = kept++;
            while (at > 0 && forge__cmp_cand(&out[(at - 1) / 2], &c) < 0) {
                out[at] = out[(at - 1) / 2];
                at = (at - 1) / 2;
            }
        } else if (forge__cmp_cand(&c, &out[0]) < 0) { /* better than the worst kept: sift down */
            at = 0;
            for (;;) {
                int child = 2 * at + 1;
                if (child >= n) break;
                if (child + 1 < n && forge__cmp_cand(&out[child + 1], &out[child]) > 0) child++;
                if (forge__cmp_cand(&out[child], &c) <= 0) break;
                out[at] = out[child];
                at = child;
            }
        } else {
            continue;
        }
        out[at] = c;
    }
    qsort(out, (size_t)kept, sizeof *out, forge__cmp_cand);
    *M = kept ? out[0].logit : 0;
    double sum = 0;
    if (isfinite(*M))
        for (int i = 0; i < V; i++)
            if (!isnan(row[i])) sum += exp(((double)row[i] - *M) * inv_t);
    *S = sum;
}

/* Draws the next token from the last step's reduction (the device's, or the host's over the
 * read-back row). `scratch` holds n_vocab candidates and probabilities for the rare full-row
 * fallback. */
static forge_status forge__sample(forge_session *s, const forge_generate_params *p, forge__cand *scratch, double *probs,
                                  int32_t *out) {
    int V = s->m->cfg.n_vocab, n = FORGE__MIN(FORGE__CANDIDATES, V);
    double M, S;
    const float *host_row = NULL;
    if (s->m->sample_on_host) {
        forge__readback_invalidate(&s->m->dev, &s->readback, FORGE__RB_LOGITS_OFFSET, 4ull * V);
        host_row = (const float *)((const uint8_t *)s->readback.mapped + FORGE__RB_LOGITS_OFFSET);
        forge__reduce_row_on_host(host_row, V, n, p->temperature > 0.0f ? 1.0 / p->temperature : 0.0, scratch, &M, &S);
    } else {
        forge__readback_invalidate(&s->m->dev, &s->readback, 0, 8ull * (1 + FORGE__CANDIDATES));
        const uint32_t *rb = (const uint32_t *)s->readback.mapped;
        float Mf, Sf;
        memcpy(&Mf, &rb[0], 4);
        memcpy(&Sf, &rb[1], 4);
        M = Mf;
        S = Sf;
        for (int i = 0; i < n; i++) {
            memcpy(&scratch[i].logit, &rb[2 + 2 * i], 4);
            scratch[i].id = (int32_t)rb[3 + 2 * i];
        }
    }
    int32_t tok = forge__sample_candidates(scratch, n, n == V, M, S, p, s->rng, probs);
    if (tok < 0) { /* the draw reaches past the candidates: take the whole row */
        const float *row = host_row;
        if (!row) {
            float *fetched = (float *)probs; /* probs has room for n_vocab doubles */
            forge_status st = forge__fetch_logits_row(s, fetched);
            if (st) return st;
            row = fetched;
        }
        for (int i = 0; i < V; i++) scratch[i] = (forge__cand){isnan(row[i]) ? -INFINITY : row[i], i}; /* NaN as -inf, as topk.comp */
        qsort(scratch, (size_t)V, sizeof *scratch, forge__cmp_cand);
        tok = forge__sample_candidates(scratch, V, 1, M, S, p, s->rng, probs);
    }
    if (tok < 0 || tok >= V) return forge__fail(&s->err, FORGE_ERR_DEVICE, "the sampler produced no token (non-finite logits?)");
    *out = tok;
    return FORGE_OK;
}

/* Writes to the io buffer the distinct ids among the last `window` tokens of the session's
 * history followed by `next` (the n_next tokens the coming step evaluates, which the penalty
 * window already covers). Gathered here, then copied: the io buffer may be device memory the
 * host writes through PCIe and reads back a word per round trip (forge__caps.mem_step). */
static uint32_t forge__penalty_ids(forge_session *s, const int32_t *next, int n_next, int window) {
    uint32_t ids[FORGE__MAX_PENALTY_WINDOW];
    uint32_t n = 0;
    int total = s->n_past + n_next, from = FORGE__MAX(0, total - window);
    for (int i = total - 1; i >= from && n < FORGE__MAX_PENALTY_WINDOW; i--) {
        uint32_t t = (uint32_t)(i >= s->n_past ? next[i - s->n_past] : s->history[i]);
        bool seen = false;
        for (uint32_t j = 0; j < n && !seen; j++) seen = ids[j] == t;
        if (!seen) ids[n++] = t;
    }
    memcpy((uint8_t *)s->io.mapped + s->penalty_r.offset, ids, 4ull * n);
    return n;
}

/* ---- stop strings ---- */

typedef struct forge__stopper {
    const forge_generate_params *p;
    char *buf;          /* text not yet given to the callback */
    size_t len, cap;
} forge__stopper;

/* Appends text; returns the number of leading bytes that may be released now, and whether a
 * stop string was found (then only the text before it is released). */
static size_t forge__stopper_push(forge__stopper *st, const char *text, size_t n, bool *stopped) {
    if (st->len + n > st->cap) {
        size_t cap = (st->len + n) * 2 + 64;
        char *b = (char *)realloc(st->buf, cap);
        if (!b) return 0;
        st->buf = b;
        st->cap = cap;
    }
    if (n) memcpy(st->buf + st->len, text, n); /* (an empty piece may come with no buffer yet) */
    st->len += n;
    *stopped = false;
    size_t release = st->len;
    for (int i = 0; i < st->p->n_stop_strings; i++) {
        const char *ss = st->p->stop_strings[i];
        size_t sl = ss ? strlen(ss) : 0;
        if (!sl) continue;
        for (size_t at = 0; at + sl <= st->len; at++)
            if (!memcmp(st->buf + at, ss, sl)) {
                if (!*stopped || at < release) release = at;
                *stopped = true;
                break;
            }
    }
    if (*stopped) return release;
    /* hold back the longest suffix that is a prefix of a stop string */
    size_t hold = 0;
    for (int i = 0; i < st->p->n_stop_strings; i++) {
        const char *ss = st->p->stop_strings[i];
        size_t sl = ss ? strlen(ss) : 0;
        for (size_t k = FORGE__MIN(sl - (sl > 0), st->len); k > hold; k--)
            if (!memcmp(st->buf + st->len - k, ss, k)) { hold = k; break; }
    }
    return st->len - hold;
}

static void forge__stopper_consume(forge__stopper *st, size_t n) {
    if (st->len > n) memmove(st->buf, st->buf + n, st->len - n);
    st->len -= n;
}

/* ---- the generate loop ---- */

/* `tk` is the model's tokenizer, NULL when it has none (then no end tokens). */
static bool forge__is_stop_token(const forge__tokenizer *tk, const forge_generate_params *p, int32_t tok, forge_stop_reason *why) {
    for (int i = 0; i < p->n_stop_tokens; i++)
        if (p->stop_tokens[i] == tok) { *why = FORGE_STOP_TOKEN; return true; }
    if (!p->ignore_eos && tk)
        for (int i = 0; i < tk->n_eos; i++)
            if (tk->eos_ids[i] == tok) { *why = FORGE_STOP_EOS; return true; }
    return false;
}

/* Keeps what the cache holds of an exact prefix of `prompt`; returns how many tokens are kept.
 * Sliding-window layers whose rotating cache has overwritten keys the continuation needs make
 * the prefix unusable: then nothing is kept and *wrapped is set. */
static int forge__reuse_prefix(forge_session *s, const int32_t *prompt, int n, int *wrapped) {
    int common = 0;
    while (common < s->n_past && common < n && s->history[common] == prompt[common]) common++;
    if (common == n) common = n - 1; /* the last prompt token is evaluated again for its logits */
    *wrapped = 0;
    if (common > 0 && common < s->n_past && !forge__truncate_valid(s, common)) {
        *wrapped = 1;
        common = 0;
    }
    s->n_past = common;
    return common;
}

/* After slides the cache holds the sequence without the span the slides dropped. A prompt that
 * continues the whole sequence (the kept tokens, the dropped ones, then more) is run without
 * that span: returns it in *owned (malloc'd, NULL when the prompt is used as it is) and its
 * length in *n. A prompt that does not continue it forgets the record. */
static forge_status forge__skip_dropped(forge_session *s, const int32_t *prompt, int *n, int32_t **owned) {
    int k = s->drop_at, D = s->n_dropped;
    *owned = NULL;
    if (!D) return FORGE_OK;
    if (*n <= k + D || memcmp(prompt, s->history, 4ull * (size_t)k) || memcmp(prompt + k, s->dropped, 4ull * (size_t)D)) {
        s->n_dropped = 0;
        return FORGE_OK;
    }
    if (!(*owned = (int32_t *)malloc(4ull * (size_t)(*n - D)))) return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    memcpy(*owned, prompt, 4ull * (size_t)k);
    memcpy(*owned + k, prompt + k + D, 4ull * (size_t)(*n - k - D));
    *n -= D;
    return FORGE_OK;
}

/* The first sampling parameter out of its range, named with its value and the range, into msg;
 * false when all are in range. (Classify passes the ones it has no use for at their defaults.) */
static bool forge__sampling_fault(char *msg, size_t n, int max_tokens, int repeat_window, float temperature, float top_p,
                                  float min_p, float repeat_penalty, int top_k) {
    if (max_tokens < 0) snprintf(msg, n, "max_tokens %d (must be >= 0)", max_tokens);
    else if (repeat_window < 0) snprintf(msg, n, "repeat_window %d (must be >= 0)", repeat_window);
    else if (!(temperature >= 0)) snprintf(msg, n, "temperature %g (must be >= 0)", (double)temperature);
    else if (!(top_p > 0 && top_p <= 1)) snprintf(msg, n, "top_p %g (must be in (0, 1])", (double)top_p);
    else if (!(min_p >= 0 && min_p <= 1)) snprintf(msg, n, "min_p %g (must be in [0, 1])", (double)min_p);
    else if (!(repeat_penalty > 0)) snprintf(msg, n, "repeat_penalty %g (must be > 0)", (double)repeat_penalty);
    else if (top_k < 0) snprintf(msg, n, "top_k %d (must be >= 0)", top_k);
    else return false;
    return true;
}

static forge_status forge__generate_tokens(forge_session *s, const int32_t *prompt, int n_prompt,
                                          const forge_generate_params *params, forge_metrics *metrics) {
    forge_generate_params p;
    FORGE__COPY_PARAMS(p, params, forge_generate_default_params);
    forge_model *m = s->m;
    const int V = m->cfg.n_vocab;
    forge_metrics mt;
    memset(&mt, 0, sizeof mt);
    double t0 = forge__now_s();
    if (!prompt || n_prompt <= 0) return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "generate needs a prompt of at least one token");
    if (n_prompt > s->n_ctx && s->overflow == FORGE_OVERFLOW_FAIL)
        return forge__fail(&s->err, FORGE_ERR_LIMIT, "the prompt has %d tokens; the session's context holds %d", n_prompt, s->n_ctx);
    char fault[96];
    if (forge__sampling_fault(fault, sizeof fault, p.max_tokens, p.repeat_window, p.temperature, p.top_p, p.min_p, p.repeat_penalty, p.top_k))
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "generate params: %s", fault);
    forge_status bad = forge__check_token_ids(s, prompt, n_prompt);
    if (bad) return bad;
    forge__rng_seed(s->rng, p.seed);
    mt.prompt_tokens = n_prompt;
    int32_t *continued = NULL; /* the prompt without what slides dropped */
    if ((bad = forge__skip_dropped(s, prompt, &n_prompt, &continued))) return bad;
    if (continued) prompt = continued;
    int slides0 = s->slides;
    mt.cached_tokens = forge__reuse_prefix(s, prompt, n_prompt, &mt.cache_wrapped);
    if (mt.cached_tokens > 0) s->prompt_cache_hits++;
    forge__cand *cands = (forge__cand *)malloc(sizeof *cands * (size_t)V);
    double *probs = (double *)malloc(sizeof *probs * (size_t)V);
    forge__stopper stop = {&p, NULL, 0, 0};
    const forge__tokenizer *tk = m->tok.n_vocab ? &m->tok : NULL; /* without one: no end tokens, no text */
    forge_status st = (cands && probs) ? FORGE_OK : forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    forge__step_params sp = {0, 0, 0, p.repeat_penalty, p.temperature > 0 ? 1.0f / p.temperature : 0.0f, 0, {0, 0}};
    int window = FORGE__MIN(p.repeat_window, FORGE__MAX_PENALTY_WINDOW);
    /* prefill: all but the last chunk without outputs, the last one sampled */
    int done = mt.cached_tokens;
    while (!st && done < n_prompt) {
        if (forge__cancelled(p.cancel)) { mt.stop_reason = FORGE_STOP_CANCELLED; break; }
        if (s->n_past == s->n_ctx && (st = forge__make_room(s, 1))) break; /* slides (prompts over n_ctx) */
        int step = FORGE__MIN(FORGE__MIN(n_prompt - done, s->n_batch), s->n_ctx - s->n_past);
        bool last = done + step == n_prompt;
        if (last) /* the penalty window includes the prompt */
            sp.n_penalty = p.repeat_penalty != 1.0f ? forge__penalty_ids(s, prompt + done, step, window) : 0;
        st = forge__step(s, prompt + done, (uint32_t)step, (uint32_t)step - 1, last ? 1u : 0u,
                         last ? FORGE__OUT_SAMPLE : FORGE__OUT_LOGITS, &sp, NULL);
        done += step;
    }
    double t_prefill = forge__now_s();
    mt.prefill_ms = (t_prefill - t0) * 1e3;
    int evaluated = n_prompt - mt.cached_tokens;
    mt.prefill_tok_s = mt.prefill_ms > 0 ? evaluated / (mt.prefill_ms * 1e-3) : 0;
    forge_detok_stream ds;
    forge_detok_stream_init(&ds, 0);
    char piece[512];
    /* The text continues the prompt: the stream starts after its last token (when that is
     * ordinary text), so a decoder that strips the space at the start of a text (SentencePiece's
     * Strip) keeps the one between the prompt and the first generated word. */
    size_t primed = 0;
    if (tk && !forge_token_is_special(m, prompt[n_prompt - 1])) forge_detok_stream_next(m, &ds, prompt[n_prompt - 1], piece, sizeof piece, &primed);
    double t_first = t_prefill;
    if (p.max_tokens == 0 && !mt.stop_reason) mt.stop_reason = FORGE_STOP_MAX_TOKENS; /* the prompt only */
    while (!st && !mt.stop_reason) {
        int32_t tok;
        if ((st = forge__sample(s, &p, cands, probs, &tok))) break;
        if (mt.generated_tokens == 0) {
            t_first = forge__now_s();
            mt.ttft_ms = (t_first - t0) * 1e3;
        }
        forge_stop_reason why;
        if (forge__is_stop_token(tk, &p, tok, &why)) { mt.stop_reason = why; break; }
        mt.generated_tokens++;
        size_t plen = 0;
        if (!tk || forge_detok_stream_next(m, &ds, tok, piece, sizeof piece, &plen) != FORGE_OK) plen = 0;
        bool found = false;
        size_t release = forge__stopper_push(&stop, piece, plen, &found);
        if (p.on_token && p.on_token(p.user_data, tok, stop.buf, release)) { /* non-zero: stop */
            forge__stopper_consume(&stop, release);
            mt.stop_reason = FORGE_STOP_CALLBACK;
            break;
        }
        forge__stopper_consume(&stop, release);
        if (found) { mt.stop_reason = FORGE_STOP_STRING; stop.len = 0; break; }
        if (mt.generated_tokens >= p.max_tokens) { mt.stop_reason = FORGE_STOP_MAX_TOKENS; break; }
        if (s->n_past >= s->n_ctx) {
            if (s->overflow == FORGE_OVERFLOW_FAIL) { mt.stop_reason = FORGE_STOP_CONTEXT; break; }
            if ((st = forge__make_room(s, 1))) break;
        }
        if (forge__cancelled(p.cancel)) { mt.stop_reason = FORGE_STOP_CANCELLED; break; }
        sp.n_penalty = p.repeat_penalty != 1.0f ? forge__penalty_ids(s, &tok, 1, window) : 0;
        st = forge__step(s, &tok, 1, 0, 1, FORGE__OUT_SAMPLE, &sp, NULL);
    }
    if (!st && mt.stop_reason != FORGE_STOP_STRING && mt.stop_reason != FORGE_STOP_CALLBACK) {
        /* an unfinished character at the end, then held-back text that never became a stop string */
        size_t plen = 0, release = stop.len;
        bool found = false;
        if (tk && forge_detok_stream_flush(m, &ds, piece, sizeof piece, &plen) == FORGE_OK && plen)
            release = forge__stopper_push(&stop, piece, plen, &found);
        if (found) mt.stop_reason = FORGE_STOP_STRING;
        else release = stop.len;
        if (release && p.on_token) p.on_token(p.user_data, -1, stop.buf, release);
    }
    double t_end = forge__now_s();
    mt.decode_ms = mt.generated_tokens > 0 ? (t_end - t_first) * 1e3 : 0;
    mt.decode_tok_s = mt.generated_tokens > 1 && mt.decode_ms > 0 ? (mt.generated_tokens - 1) / (mt.decode_ms * 1e-3) : 0;
    mt.peak_device_bytes = forge__mem_peak(&m->mem_total);
    mt.prompt_cache_hits = s->prompt_cache_hits;
    mt.context_slides = s->slides - slides0;
    s->metrics = mt;
    if (metrics) *metrics = mt;
    free(continued);
    free(stop.buf);
    free(cands);
    free(probs);
    return st;
}

/* The ids of text into a malloc'd array (*ids, *n); the model's message on failure. */
static forge_status forge__tokenize_alloc(forge_model *m, const char *text, size_t len, int add_special, int32_t **ids, size_t *n) {
    uint32_t flags = add_special ? FORGE_TOKENIZE_ADD_SPECIAL : 0;
    size_t cap = len + 16;
    *n = 0;
    *ids = (int32_t *)malloc(sizeof **ids * cap);
    if (!*ids) return FORGE_ERR_OUT_OF_MEMORY;
    forge_status st = forge_tokenize(m, text ? text : "", len, flags, *ids, cap, n);
    if (st == FORGE_ERR_BUFFER_TOO_SMALL) {
        int32_t *bigger = (int32_t *)realloc(*ids, sizeof **ids * *n);
        if (!bigger) return FORGE_ERR_OUT_OF_MEMORY;
        *ids = bigger;
        cap = *n;
        st = forge_tokenize(m, text ? text : "", len, flags, *ids, cap, n);
    }
    return st;
}

FORGE_API forge_status forge_generate_tokens(forge_session *s, const int32_t *prompt, int n_prompt,
                                             const forge_generate_params *params, forge_metrics *metrics) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    forge_status st = forge__slot_acquire(s->m, &s->err);
    if (st) return st;
    st = forge__generate_tokens(s, prompt, n_prompt, params, metrics);
    forge__slot_release(s->m);
    return st;
}

FORGE_API forge_status forge_generate(forge_session *s, const char *prompt, size_t prompt_len,
                                      const forge_generate_params *params, forge_metrics *metrics) {
    if (!s || (!prompt && prompt_len)) return FORGE_ERR_INVALID_ARGUMENT;
    forge_generate_params p;
    FORGE__COPY_PARAMS(p, params, forge_generate_default_params);
    int32_t *ids = NULL;
    size_t n = 0;
    forge_status st = forge__tokenize_alloc(s->m, prompt, prompt_len, p.add_special, &ids, &n);
    if (st == FORGE_ERR_OUT_OF_MEMORY) {
        forge__fail(&s->err, st, "out of host memory");
    } else if (st) {
        forge__fail(&s->err, st, "tokenizing the prompt: %s", forge_model_errmsg(s->m));
    } else if (n == 0) {
        st = forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "the prompt is empty and the tokenizer adds no BOS: nothing to generate from");
    } else {
        st = forge_generate_tokens(s, ids, (int)n, &p, metrics);
    }
    free(ids);
    return st;
}

FORGE_API forge_status forge_warm(forge_session *s, const int32_t *tokens, int n_tokens) {
    if (!s || !tokens || n_tokens <= 0) return FORGE_ERR_INVALID_ARGUMENT;
    int32_t *continued = NULL; /* the tokens without what slides dropped */
    forge_status st = forge__skip_dropped(s, tokens, &n_tokens, &continued);
    if (st) return st;
    if (continued) tokens = continued;
    int wrapped = 0;
    int kept = forge__reuse_prefix(s, tokens, n_tokens, &wrapped);
    if (kept < n_tokens) st = forge_eval(s, tokens + kept, n_tokens - kept, 0, NULL, 0);
    free(continued);
    return st;
}

FORGE_API forge_status forge_session_metrics(const forge_session *s, forge_metrics *metrics) {
    if (!s || !metrics) return FORGE_ERR_INVALID_ARGUMENT;
    *metrics = s->metrics;
    return FORGE_OK;
}

/* =======================================================================================
 * 10b. Batch generation
 * Several sequences on one session, each in its own place of the KV cache (n_seq places of
 * slots[l] slots in every layer). A prompt is prefilled into its place alone; then every decode
 * step runs the current token of each live sequence as one row of the same products, and the
 * attention of each row reads its own place. The row table (position, place per row), written
 * into the io buffer after the step params, is what rope and the attention kernels read in
 * place of pos0. Each output row ends in the device's reduction as generate's decode step does
 * (candidates and normalizer, at the row's own temperature), and the host draws with
 * generate's rules; a step where some sequence has a repeat penalty reads back the logits
 * rows instead and applies it on the host. Stop rules and callbacks are generate's, per
 * sequence. A finished sequence leaves its place to the next item.
 * ===================================================================================== */

/* One place: the item it runs and that item's generate state. */
typedef struct forge__bseq {
    int item;                      /* -1: the place is free */
    forge_generate_params p;
    int32_t *hist;                 /* [n_ctx] the tokens in the place's cache */
    int n_past;
    int32_t next;                  /* the drawn token the next step evaluates */
    uint64_t rng[4];
    forge__stopper stop;
    forge_detok_stream ds;
    forge_metrics mt;
    double t0, t_first;
} forge__bseq;

/* The host scratch of a call. */
typedef struct forge__bwork {
    forge__cand *cands;            /* [n_vocab] */
    double *probs;                 /* [n_vocab] */
    float *row;                    /* [n_vocab] a row after the repeat penalty, or fetched for a draw */
    uint32_t *red;                 /* [n_seq, 1 + FORGE__CANDIDATES] uvec2: the device's reduction per row */
    int32_t *tokens;               /* [n_seq] the rows of a decode step */
    int *place;                    /* [n_seq] the place of each row */
    char piece[512];
} forge__bwork;

/* Row `row` of the table: position `pos` of the sequence in place `place`. */
static void forge__batch_row(forge_session *s, uint32_t row, uint32_t pos, uint32_t place) {
    uint32_t *t = (uint32_t *)((uint8_t *)s->io.mapped + FORGE__IO_PENALTY_OFFSET);
    t[2 * row] = pos;
    t[2 * row + 1] = place;
}

/* Whether a batch mode reads back logits rows (else the reduction of each row). */
static bool forge__batch_logits_mode(forge__out_mode mode) {
    return mode == FORGE__OUT_BATCH_PREFILL_LOGITS || mode == FORGE__OUT_BATCH_DECODE_LOGITS;
}

/* 1 / temperature of out row `row` (greedy: 0, the best candidate alone), which the device's
 * reduction reads. */
static void forge__batch_temp(forge_session *s, uint32_t row, float temperature) {
    float inv = temperature > 0.0f ? 1.0f / temperature : 0.0f;
    memcpy((uint8_t *)s->io.mapped + s->tokens_r.offset + s->tokens_r.size + 4ull * row, &inv, 4);
}

/* Runs n rows (their table and temperatures written). Logits modes point *logits at the n_out
 * logits rows read back; the others copy each row's reduction to w->red. */
static forge_status forge__batch_step(forge_session *s, const int32_t *tokens, uint32_t n, uint32_t out_row0, uint32_t n_out,
                                      forge__out_mode mode, const float **logits, uint32_t *red) {
    forge__device *d = &s->m->dev;
    forge__recording *rc;
    forge_status st = forge__get_recording(s, n, out_row0, n_out, mode, &rc);
    if (st) return st;
    forge__step_params p = {0, n, 0, 1.0f, 1.0f, 0, {0, 0}};
    memcpy(s->io.mapped, &p, sizeof p);
    memcpy((uint8_t *)s->io.mapped + s->tokens_r.offset, tokens, 4ull * n);
    if ((st = forge__submit_wait(d, rc->cb, s->fence, &s->err))) return st;
    if (rc->qpool) forge__profile_collect(d, &s->prof, rc);
    const uint8_t *rb = (const uint8_t *)s->readback.mapped + FORGE__RB_LOGITS_OFFSET;
    uint64_t bytes = forge__batch_logits_mode(mode) ? 4ull * n_out * (uint64_t)s->m->cfg.n_vocab : 8ull * n_out * (1 + FORGE__CANDIDATES);
    forge__readback_invalidate(d, &s->readback, FORGE__RB_LOGITS_OFFSET, bytes);
    if (forge__batch_logits_mode(mode)) *logits = (const float *)rb;
    else memcpy(red, rb, (size_t)bytes); /* the readback then serves a row's logits (forge__batch_fetch_row) */
    return FORGE_OK;
}

/* Copies logits row `row` of the last step to the host: a draw past the candidates. */
static forge_status forge__batch_fetch_row(forge_session *s, uint32_t row, float *out) {
    forge__device *d = &s->m->dev;
    uint64_t bytes = 4ull * s->m->cfg.n_vocab;
    VkCommandBuffer cb = VK_NULL_HANDLE;
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = s->cmd_pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    if (d->vk.vkAllocateCommandBuffers(d->dev, &cai, &cb) != VK_SUCCESS)
        return forge__fail(&s->err, FORGE_ERR_DEVICE, "vkAllocateCommandBuffers failed");
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    d->vk.vkBeginCommandBuffer(cb, &bi);
    forge__rec r = {.dev = d, .cb = cb, .err = &s->err};
    forge__copy(&r, (forge__range){s->logits.buf, s->logits.offset + bytes * row, bytes}, (forge__range){s->readback.buf, FORGE__RB_LOGITS_OFFSET, 0},
                bytes);
    forge__host_barrier(&r);
    d->vk.vkEndCommandBuffer(cb);
    forge_status st = forge__submit_wait(d, cb, s->fence, &s->err);
    d->vk.vkFreeCommandBuffers(d->dev, s->cmd_pool, 1, &cb);
    if (st) return st;
    forge__readback_invalidate(d, &s->readback, FORGE__RB_LOGITS_OFFSET, bytes);
    memcpy(out, (const uint8_t *)s->readback.mapped + FORGE__RB_LOGITS_OFFSET, (size_t)bytes);
    return FORGE_OK;
}

/* Keeps the best of (logit, id) in a min-heap of k (the worst at the root). */
static void forge__cand_heap_push(forge__cand *h, int *n, int k, forge__cand c) {
    if (*n == k) {
        if (forge__cmp_cand(&c, &h[0]) >= 0) return; /* not better than the worst kept */
        int i = 0;                                   /* replace the root, sift down */
        for (;;) {
            int l = 2 * i + 1, r = l + 1, w = i;
            forge__cand *best = &c;
            if (l < k && forge__cmp_cand(&h[l], best) > 0) { w = l; best = &h[l]; }
            if (r < k && forge__cmp_cand(&h[r], best) > 0) w = r;
            if (w == i) break;
            h[i] = h[w];
            i = w;
        }
        h[i] = c;
        return;
    }
    int i = (*n)++;
    while (i > 0 && forge__cmp_cand(&c, &h[(i - 1) / 2]) > 0) { /* c is worse than its parent: up */
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

/* Draws a sequence's next token as forge__sample does: from the device's reduction of out row
 * `out_row` (red: its normalizer and candidates), the row's logits fetched only when the draw
 * needs them; or, in a logits step (red NULL), from the logits row after the repeat penalty over
 * the sequence's last repeat_window tokens, candidates and normalizer made on the host. */
static forge_status forge__batch_draw(forge_session *s, forge__bseq *q, const float *row, const uint32_t *red, uint32_t out_row,
                                      forge__bwork *w, int32_t *out) {
    const forge_generate_params *p = &q->p;
    int V = s->m->cfg.n_vocab;
    if (red) {
        float M, S;
        memcpy(&M, &red[0], 4);
        memcpy(&S, &red[1], 4);
        int n = FORGE__MIN(FORGE__CANDIDATES, V);
        for (int i = 0; i < n; i++) {
            memcpy(&w->cands[i].logit, &red[2 + 2 * i], 4);
            w->cands[i].id = (int32_t)red[3 + 2 * i];
        }
        int32_t tok = forge__sample_candidates(w->cands, n, n == V, M, S, p, q->rng, w->probs);
        if (tok < 0) { /* the draw reaches past the candidates: the whole row */
            forge_status st = forge__batch_fetch_row(s, out_row, w->row);
            if (st) return st;
            for (int i = 0; i < V; i++) w->cands[i] = (forge__cand){w->row[i], i};
            qsort(w->cands, (size_t)V, sizeof *w->cands, forge__cmp_cand);
            tok = forge__sample_candidates(w->cands, V, 1, M, S, p, q->rng, w->probs);
        }
        if (tok < 0 || tok >= V) return forge__fail(&s->err, FORGE_ERR_DEVICE, "the sampler produced no token (non-finite logits?)");
        *out = tok;
        return FORGE_OK;
    }
    if (p->repeat_penalty != 1.0f) {
        memcpy(w->row, row, 4ull * V);
        int window = FORGE__MIN(p->repeat_window, FORGE__MAX_PENALTY_WINDOW);
        for (int i = q->n_past - 1; i >= FORGE__MAX(0, q->n_past - window); i--) {
            int32_t t = q->hist[i];
            bool seen = false; /* each distinct id once, as penalty.comp gets them */
            for (int j = q->n_past - 1; j > i && !seen; j--) seen = q->hist[j] == t;
            if (seen || t < 0 || t >= V) continue;
            float l = w->row[t];
            w->row[t] = l > 0.0f ? l / p->repeat_penalty : l * p->repeat_penalty;
        }
        row = w->row;
    }
    int32_t tok = -1;
    if (p->temperature <= 0.0f) { /* the argmax, ties to the lower id */
        tok = 0;
        for (int i = 1; i < V; i++)
            if (row[i] > row[tok]) tok = i;
    } else {
        float mx = row[0];
        for (int i = 1; i < V; i++) mx = row[i] > mx ? row[i] : mx;
        double inv_t = 1.0 / p->temperature, S = 0;
        for (int i = 0; i < V; i++) S += exp(((double)row[i] - mx) * inv_t);
        int k = FORGE__MIN(FORGE__CANDIDATES, V), n = 0;
        for (int i = 0; i < V; i++) forge__cand_heap_push(w->cands, &n, k, (forge__cand){row[i], i});
        qsort(w->cands, (size_t)n, sizeof *w->cands, forge__cmp_cand);
        tok = forge__sample_candidates(w->cands, n, n == V, mx, S, p, q->rng, w->probs);
        if (tok < 0) { /* the draw reaches past the candidates: the whole row */
            for (int i = 0; i < V; i++) w->cands[i] = (forge__cand){row[i], i};
            qsort(w->cands, (size_t)V, sizeof *w->cands, forge__cmp_cand);
            tok = forge__sample_candidates(w->cands, V, 1, mx, S, p, q->rng, w->probs);
        }
    }
    if (tok < 0 || tok >= V) return forge__fail(&s->err, FORGE_ERR_DEVICE, "the sampler produced no token (non-finite logits?)");
    *out = tok;
    return FORGE_OK;
}

/* Takes the token a sequence drew through generate's stop rules and callback: true when the
 * sequence goes on with it, false when it has ended (q->mt.stop_reason says why). */
static bool forge__batch_take(forge_session *s, forge__bseq *q, int32_t tok, forge__bwork *w) {
    forge_model *m = s->m;
    const forge__tokenizer *tk = m->tok.n_vocab ? &m->tok : NULL;
    if (q->mt.generated_tokens == 0 && !q->t_first) {
        q->t_first = forge__now_s();
        q->mt.ttft_ms = (q->t_first - q->t0) * 1e3;
    }
    forge_stop_reason why;
    if (forge__is_stop_token(tk, &q->p, tok, &why)) { q->mt.stop_reason = why; return false; }
    q->mt.generated_tokens++;
    size_t plen = 0;
    if (!tk || forge_detok_stream_next(m, &q->ds, tok, w->piece, sizeof w->piece, &plen) != FORGE_OK) plen = 0;
    bool found = false;
    size_t release = forge__stopper_push(&q->stop, w->piece, plen, &found);
    if (q->p.on_token && q->p.on_token(q->p.user_data, tok, q->stop.buf, release)) {
        forge__stopper_consume(&q->stop, release);
        q->mt.stop_reason = FORGE_STOP_CALLBACK;
        return false;
    }
    forge__stopper_consume(&q->stop, release);
    if (found) { q->mt.stop_reason = FORGE_STOP_STRING; q->stop.len = 0; return false; }
    if (q->mt.generated_tokens >= q->p.max_tokens) { q->mt.stop_reason = FORGE_STOP_MAX_TOKENS; return false; }
    if (q->n_past >= s->n_ctx) { q->mt.stop_reason = FORGE_STOP_CONTEXT; return false; }
    if (forge__cancelled(q->p.cancel)) { q->mt.stop_reason = FORGE_STOP_CANCELLED; return false; }
    q->next = tok;
    return true;
}

/* Ends a sequence: the held-back text as generate delivers it, the metrics, the place freed. */
static void forge__batch_finish(forge_session *s, forge__bseq *q, forge_batch_result *res, forge__bwork *w) {
    forge_model *m = s->m;
    if (q->mt.stop_reason != FORGE_STOP_STRING && q->mt.stop_reason != FORGE_STOP_CALLBACK) {
        size_t plen = 0, release = q->stop.len;
        bool found = false;
        if (m->tok.n_vocab && forge_detok_stream_flush(m, &q->ds, w->piece, sizeof w->piece, &plen) == FORGE_OK && plen)
            release = forge__stopper_push(&q->stop, w->piece, plen, &found);
        if (found) q->mt.stop_reason = FORGE_STOP_STRING;
        else release = q->stop.len;
        if (release && q->p.on_token) q->p.on_token(q->p.user_data, -1, q->stop.buf, release);
    }
    double t_end = forge__now_s();
    q->mt.decode_ms = q->mt.generated_tokens > 0 ? (t_end - q->t_first) * 1e3 : 0;
    q->mt.decode_tok_s = q->mt.generated_tokens > 1 && q->mt.decode_ms > 0 ? (q->mt.generated_tokens - 1) / (q->mt.decode_ms * 1e-3) : 0;
    q->mt.peak_device_bytes = forge__mem_peak(&m->mem_total);
    q->mt.prompt_cache_hits = s->prompt_cache_hits;
    res->status = FORGE_OK;
    res->metrics = q->mt;
    s->metrics = q->mt;
    free(q->stop.buf);
    q->stop.buf = NULL;
    q->item = -1;
}

/* Starts item `it` in place b: checks it, prefills its prompt, draws its first token. A failure
 * of the item goes to res (FORGE_OK returned); a device failure is returned. */
static forge_status forge__batch_start(forge_session *s, forge__bseq *q, int b, const forge_batch_item *it, int idx,
                                       forge_batch_result *res, forge__bwork *w) {
    forge_model *m = s->m;
    int32_t *owned = NULL;
    const int32_t *prompt = it->tokens;
    int n = it->n_tokens;
    forge_status st = FORGE_OK;
    int32_t *hist = q->hist;
    memset(q, 0, sizeof *q);
    q->hist = hist;
    q->item = -1;
    FORGE__COPY_PARAMS(q->p, it->params, forge_generate_default_params);
    const forge_generate_params *p = &q->p;
    char fault[96];
    if (forge__sampling_fault(fault, sizeof fault, p->max_tokens, p->repeat_window, p->temperature, p->top_p, p->min_p, p->repeat_penalty, p->top_k)) {
        res->status = forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "batch item %d: generate params: %s", idx, fault);
        return FORGE_OK;
    }
    if (it->text || it->text_len) {
        size_t nt = 0;
        st = forge__tokenize_alloc(m, it->text, it->text_len, p->add_special, &owned, &nt);
        if (st == FORGE_ERR_OUT_OF_MEMORY) {
            free(owned);
            return forge__fail(&s->err, st, "out of host memory");
        }
        if (st) {
            res->status = forge__fail(&s->err, st, "batch item %d: tokenizing the prompt: %s", idx, forge_model_errmsg(m));
            free(owned);
            return FORGE_OK;
        }
        prompt = owned;
        n = (int)FORGE__MIN(nt, (size_t)INT32_MAX);
    }
    if (!prompt || n <= 0) {
        res->status = forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "batch item %d: the prompt is empty", idx);
    } else if (n > s->n_ctx) {
        res->status = forge__fail(&s->err, FORGE_ERR_LIMIT, "batch item %d: the prompt has %d tokens; the session's context holds %d",
                                  idx, n, s->n_ctx);
    } else if (forge__check_token_ids(s, prompt, n)) {
        res->status = forge__wrap(&s->err, FORGE_ERR_INVALID_ARGUMENT, "batch item %d", idx);
    }
    if (res->status) {
        free(owned);
        return FORGE_OK;
    }
    q->item = idx;
    q->t0 = forge__now_s();
    q->mt.prompt_tokens = n;
    q->stop = (forge__stopper){&q->p, NULL, 0, 0};
    forge__rng_seed(q->rng, p->seed);
    forge_detok_stream_init(&q->ds, 0);
    memcpy(q->hist, prompt, 4ull * n);
    const float *logits = NULL;
    bool host_penalty = p->repeat_penalty != 1.0f;
    forge__out_mode mode = host_penalty ? FORGE__OUT_BATCH_PREFILL_LOGITS : FORGE__OUT_BATCH_PREFILL;
    int chunk = FORGE__MIN(s->n_batch, FORGE__BATCH_MAX_SEQ);
    for (int done = 0; done < n && !st;) {
        if (forge__cancelled(p->cancel)) { q->mt.stop_reason = FORGE_STOP_CANCELLED; break; }
        int step = FORGE__MIN(n - done, chunk);
        bool last = done + step == n;
        for (int i = 0; i < step; i++) forge__batch_row(s, (uint32_t)i, (uint32_t)(done + i), (uint32_t)b);
        forge__batch_temp(s, 0, p->temperature);
        st = forge__batch_step(s, prompt + done, (uint32_t)step, (uint32_t)step - 1, last ? 1u : 0u, last ? mode : FORGE__OUT_BATCH_PREFILL_LOGITS,
                               &logits, w->red);
        done += step;
        q->n_past = done;
    }
    double t_prefill = forge__now_s();
    q->mt.prefill_ms = (t_prefill - q->t0) * 1e3;
    q->mt.prefill_tok_s = q->mt.prefill_ms > 0 ? q->n_past / (q->mt.prefill_ms * 1e-3) : 0;
    if (!st && m->tok.n_vocab && !forge_token_is_special(m, prompt[n - 1])) { /* the text continues the prompt's */
        size_t primed = 0;
        forge_detok_stream_next(m, &q->ds, prompt[n - 1], w->piece, sizeof w->piece, &primed);
    }
    free(owned);
    if (st) return st;
    int32_t tok;
    if (q->mt.stop_reason == FORGE_STOP_CANCELLED) {
        forge__batch_finish(s, q, res, w);
    } else if ((st = forge__batch_draw(s, q, logits, host_penalty ? NULL : w->red, 0, w, &tok))) {
        return st;
    } else if (!forge__batch_take(s, q, tok, w)) {
        forge__batch_finish(s, q, res, w);
    }
    return FORGE_OK;
}

static forge_status forge__batch_generate(forge_session *s, const forge_batch_item *items, int n_items, forge_batch_result *results) {
    forge_model *m = s->m;
    const int V = m->cfg.n_vocab, NS = s->n_seq;
    if (n_items < 0 || (n_items > 0 && (!items || !results)))
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "batch generate: items and results are needed for n_items > 0");
    if (!forge__head_dims_by4(&m->cfg))
        return forge__fail(&s->err, FORGE_ERR_UNSUPPORTED, "batch generate needs head_dim a multiple of 4; this model's is %d", m->cfg.head_dim);
    memset(results, 0, sizeof *results * (size_t)n_items);
    forge__bwork w = {0};
    forge__bseq *q = (forge__bseq *)calloc((size_t)NS, sizeof *q);
    int32_t *hist = (int32_t *)malloc(4ull * (size_t)NS * (size_t)s->n_ctx);
    w.cands = (forge__cand *)malloc(sizeof *w.cands * (size_t)V);
    w.probs = (double *)malloc(sizeof *w.probs * (size_t)V);
    w.row = (float *)malloc(4ull * (size_t)V);
    w.red = (uint32_t *)malloc(8ull * (size_t)NS * (1 + FORGE__CANDIDATES));
    w.tokens = (int32_t *)malloc(4ull * (size_t)NS);
    w.place = (int *)malloc(sizeof *w.place * (size_t)NS);
    forge_status st = q && hist && w.cands && w.probs && w.row && w.red && w.tokens && w.place ? FORGE_OK
                                                                                       : forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int b = 0; !st && b < NS; b++) {
        q[b].item = -1;
        q[b].hist = hist + (size_t)b * s->n_ctx;
    }
    s->n_past = 0; /* the cache is scratch: place 0 is the session's own sequence */
    int next = 0;
    while (!st) {
        for (int b = 0; b < NS && !st; b++)
            while (q[b].item < 0 && next < n_items && !st) {
                st = forge__batch_start(s, &q[b], b, &items[next], next, &results[next], &w);
                next++;
            }
        uint32_t M = 0;
        bool host_penalty = false; /* a sequence with a repeat penalty: the step reads back the logits */
        for (int b = 0; b < NS; b++)
            if (q[b].item >= 0) {
                w.tokens[M] = q[b].next;
                w.place[M] = b;
                forge__batch_row(s, M, (uint32_t)q[b].n_past, (uint32_t)b);
                forge__batch_temp(s, M, q[b].p.temperature);
                host_penalty |= q[b].p.repeat_penalty != 1.0f;
                M++;
            }
        if (st || M == 0) break; /* (M == 0: every item has run) */
        const float *logits = NULL;
        forge__out_mode mode = host_penalty ? FORGE__OUT_BATCH_DECODE_LOGITS : FORGE__OUT_BATCH_DECODE;
        if ((st = forge__batch_step(s, w.tokens, M, 0, M, mode, &logits, w.red))) break;
        for (uint32_t r = 0; r < M && !st; r++) {
            forge__bseq *sq = &q[w.place[r]];
            sq->hist[sq->n_past++] = sq->next;
            int32_t tok;
            const uint32_t *red = host_penalty ? NULL : w.red + (size_t)r * 2 * (1 + FORGE__CANDIDATES);
            if ((st = forge__batch_draw(s, sq, host_penalty ? logits + (size_t)r * V : NULL, red, r, &w, &tok))) break;
            if (!forge__batch_take(s, sq, tok, &w)) forge__batch_finish(s, sq, &results[sq->item], &w);
        }
    }
    for (int b = 0; q && b < NS; b++) /* a device failure: the unfinished items share it */
        if (q[b].item >= 0) {
            results[q[b].item].status = st;
            free(q[b].stop.buf);
        }
    for (int i = next; st && i < n_items; i++) results[i].status = st;
    s->n_past = 0;
    free(q);
    free(hist);
    free(w.cands);
    free(w.probs);
    free(w.row);
    free(w.red);
    free(w.tokens);
    free(w.place);
    return st;
}

FORGE_API forge_status forge_batch_generate(forge_session *s, const forge_batch_item *items, int n_items, forge_batch_result *results) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    forge_status st = forge__slot_acquire(s->m, &s->err);
    if (st) return st;
    st = forge__batch_generate(s, items, n_items, results);
    forge__slot_release(s->m);
    return st;
}

/* =======================================================================================
 * 11. Classify
 * Many prompts, one forward pass per batch, no decode loop. A batch is B prompts right-padded
 * to T tokens and run as B sequences at positions 0 .. T-1 (the pass's batch mode, as the
 * trainer runs it: keys of sequence b in cache rows b*T .., the session's cache used as
 * scratch); then each prompt's last real row is gathered, normed and put through the head
 * (FORGE__OUT_CLASSIFY in section 7). Padding rows come after every real row of their
 * sequence, so causal attention never lets a real token see one.
 * ===================================================================================== */

FORGE_API forge_classify_params forge_classify_default_params(void) {
    forge_classify_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.add_special = 1;
    return p;
}

/* Draws from one full logits row: the argmax at temperature 0 (ties to the lower id), else
 * the generate sampler over the sorted row with its exact normalizer. NaN counts as -inf, as
 * in the device reduction; -1 when no logit is finite-or-+inf. */
static int32_t forge__classify_draw(const float *row, int V, const forge_classify_params *cp, uint64_t rng[4], forge__cand *cands,
                                    double *probs) {
    int best = -1;
    for (int i = 0; i < V; i++)
        if (!isnan(row[i]) && row[i] > -INFINITY && (best < 0 || row[i] > row[best])) best = i;
    if (best < 0 || cp->temperature <= 0.0f) return best;
    forge_generate_params gp = forge_generate_default_params();
    gp.temperature = cp->temperature;
    gp.top_k = cp->top_k;
    gp.top_p = cp->top_p;
    gp.min_p = cp->min_p;
    double M = row[best], S = 0;
    if (!isfinite(M)) return best; /* +inf: all the probability on the first such logit */
    for (int i = 0; i < V; i++) {
        float l = isnan(row[i]) ? -INFINITY : row[i];
        cands[i] = (forge__cand){l, i};
        S += exp(((double)l - M) / cp->temperature);
    }
    qsort(cands, (size_t)V, sizeof *cands, forge__cmp_cand);
    return forge__sample_candidates(cands, V, 1, M, S, &gp, rng, probs);
}

/* The text of `tok` continuing a prompt that ends in `prev` (primed as generation primes its
 * stream), appended NUL-terminated to out. */
static forge_status forge__classify_text(forge_model *m, int32_t prev, int32_t tok, forge__buf *out) {
    char piece[1024];
    size_t len = 0, more = 0;
    forge_detok_stream ds;
    forge_detok_stream_init(&ds, 0);
    forge_status st = FORGE_OK;
    if (!forge_token_is_special(m, prev)) st = forge_detok_stream_next(m, &ds, prev, piece, sizeof piece, &len);
    if (!st) st = forge_detok_stream_next(m, &ds, tok, piece, sizeof piece, &len);
    if (!st) st = forge_detok_stream_flush(m, &ds, piece + len, sizeof piece - len, &more);
    if (st) return st;
    forge__buf_put(out, piece, len + more + 1);
    return out->oom ? FORGE_ERR_OUT_OF_MEMORY : FORGE_OK;
}

static forge_status forge__classify(forge_session *s, const forge_classify_prompt *prompts, int n_prompts,
                                    const forge_classify_params *params, forge_classify_result *results) {
    if (n_prompts < 0 || (n_prompts > 0 && (!prompts || !results)))
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "classify needs prompts and results for n_prompts (%d) >= 0", n_prompts);
    forge_classify_params p;
    FORGE__COPY_PARAMS(p, params, forge_classify_default_params);
    char fault[96];
    if (forge__sampling_fault(fault, sizeof fault, 0, 0, p.temperature, p.top_p, p.min_p, 1.0f, p.top_k))
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "classify params: %s", fault);
    forge_model *m = s->m;
    const int V = m->cfg.n_vocab;
    if (p.logits && p.logits_capacity < (size_t)n_prompts * (size_t)V)
        return forge__fail(&s->err, FORGE_ERR_BUFFER_TOO_SMALL, "logits buffer holds %zu floats; %d prompts x %d need %zu", p.logits_capacity,
                           n_prompts, V, (size_t)n_prompts * (size_t)V);
    const forge__tokenizer *tk = m->tok.n_vocab ? &m->tok : NULL; /* without one: no text */
    double t0 = forge__now_s();
    s->n_past = 0; /* the cache is scratch from here on */
    s->n_dropped = 0;
    s->class_text.n = 0;
    /* every prompt's ids (text tokenized here, token prompts borrowed) */
    int32_t **ids = (int32_t **)calloc((size_t)n_prompts + 1, sizeof *ids);
    int *lens = (int *)calloc((size_t)n_prompts + 1, sizeof *lens);
    int *order = (int *)malloc(sizeof *order * ((size_t)n_prompts + 1));
    size_t *text_at = (size_t *)malloc(sizeof *text_at * ((size_t)n_prompts + 1));
    forge__cand *cands = (forge__cand *)malloc(sizeof *cands * (size_t)V);
    double *probs = (double *)malloc(sizeof *probs * (size_t)V);
    float *rows = (float *)malloc(sizeof *rows * (size_t)V * (size_t)FORGE__MIN(s->n_out_max, FORGE__MAX_PENALTY_WINDOW));
    forge_status st = FORGE_OK;
    if (!ids || !lens || !order || !text_at || !cands || !probs || !rows) st = forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    int64_t total = 0;
    for (int i = 0; i < n_prompts && !st; i++) {
        const forge_classify_prompt *q = &prompts[i];
        if (q->text && !tk) {
            st = forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "prompt %d is text, and the model has no tokenizer: give token ids", i);
        } else if (q->text) {
            size_t n = 0;
            st = forge__tokenize_alloc(m, q->text, q->text_len, p.add_special, &ids[i], &n);
            if (st == FORGE_ERR_OUT_OF_MEMORY) forge__fail(&s->err, st, "out of host memory");
            else if (st) forge__fail(&s->err, st, "prompt %d: tokenizing: %s", i, forge_model_errmsg(m));
            lens[i] = (int)FORGE__MIN(n, (size_t)INT_MAX);
        } else {
            if (q->n_tokens > 0 && !q->tokens) { st = forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "prompt %d: n_tokens %d but no tokens", i, q->n_tokens); break; }
            lens[i] = q->n_tokens;
        }
        if (st) break;
        const int32_t *t = q->text ? ids[i] : q->tokens;
        if (lens[i] <= 0) st = forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "prompt %d is empty (and the tokenizer adds no BOS)", i);
        else if (lens[i] > s->n_batch)
            st = forge__fail(&s->err, FORGE_ERR_LIMIT, "prompt %d has %d tokens; a classify batch holds %d (the session's n_batch)", i, lens[i], s->n_batch);
        for (int j = 0; j < lens[i] && !st; j++)
            if (t[j] < 0 || t[j] >= V)
                st = forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "prompt %d: token %d (at index %d) is outside the vocabulary of %d", i, t[j], j, V);
        order[i] = i;
        total += lens[i];
    }
    /* batches of prompts of similar length: sorted by length (stable), then cut where
     * B x T (T the longest, rounded up to 8) would pass n_batch or B the output rows */
    for (int i = 1; i < n_prompts && !st; i++) /* insertion sort: stable, and n is small */
        for (int j = i; j > 0 && lens[order[j - 1]] > lens[order[j]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    const int max_b = FORGE__MIN(s->n_out_max, FORGE__MAX_PENALTY_WINDOW);
    uint32_t *io_tokens = (uint32_t *)((uint8_t *)s->io.mapped + s->tokens_r.offset);
    uint32_t *io_rows = (uint32_t *)((uint8_t *)s->io.mapped + s->penalty_r.offset);
    for (int b0 = 0; b0 < n_prompts && !st;) {
        if (forge__cancelled(p.cancel)) {
            st = forge__fail(&s->err, FORGE_ERR_CANCELLED, "classify was cancelled after %d of %d prompts", b0, n_prompts);
            break;
        }
        int B = 0, T = 0;
        while (b0 + B < n_prompts && B < max_b) {
            int t = (int)FORGE__MIN(forge__align_up((uint64_t)lens[order[b0 + B]], 8), (uint64_t)s->n_batch);
            if ((int64_t)(B + 1) * t > s->n_batch) break;
            T = t; /* sorted: the newest prompt is the longest */
            B++;
        }
        memset(io_tokens, 0, 4ull * (size_t)B * (size_t)T);
        for (int k = 0; k < B; k++) {
            int i = order[b0 + k];
            memcpy(io_tokens + (size_t)k * (size_t)T, prompts[i].text ? ids[i] : prompts[i].tokens, 4ull * (size_t)lens[i]);
            io_rows[k] = (uint32_t)(k * T + lens[i] - 1);
        }
        forge__recording *rc;
        if ((st = forge__get_recording(s, (uint32_t)(B * T), (uint32_t)T, (uint32_t)B, FORGE__OUT_CLASSIFY, &rc))) break;
        forge__step_params sp = {0, (uint32_t)(B * T), 0, 1.0f, 1.0f, 0, {0, 0}};
        memcpy(s->io.mapped, &sp, sizeof sp);
        if ((st = forge__submit_wait(&m->dev, rc->cb, s->fence, &s->err))) break;
        if (rc->qpool) forge__profile_collect(&m->dev, &s->prof, rc);
        uint64_t bytes = 4ull * (uint64_t)B * (uint64_t)V;
        forge__readback_invalidate(&m->dev, &s->readback, FORGE__RB_LOGITS_OFFSET, bytes);
        memcpy(rows, (uint8_t *)s->readback.mapped + FORGE__RB_LOGITS_OFFSET, (size_t)bytes);
        for (int k = 0; k < B && !st; k++) {
            int i = order[b0 + k];
            const float *row = rows + (size_t)k * (size_t)V;
            if (p.logits) memcpy(p.logits + (size_t)i * (size_t)V, row, 4ull * (size_t)V);
            uint64_t rng[4];
            forge__rng_seed(rng, p.seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(i + 1)));
            int32_t tok = forge__classify_draw(row, V, &p, rng, cands, probs);
            if (tok < 0 || tok >= V) { st = forge__fail(&s->err, FORGE_ERR_DEVICE, "prompt %d: no token drawn (non-finite logits?)", i); break; }
            results[i] = (forge_classify_result){tok, lens[i], NULL, 0};
            text_at[i] = SIZE_MAX;
            if (tk) {
                const int32_t *t = prompts[i].text ? ids[i] : prompts[i].tokens;
                text_at[i] = s->class_text.n;
                if ((st = forge__classify_text(m, t[lens[i] - 1], tok, &s->class_text)))
                    forge__fail(&s->err, st, "prompt %d: the text of token %d: %s", i, tok, forge_model_errmsg(m));
                else results[i].text_len = s->class_text.n - 1 - text_at[i];
            }
        }
        b0 += B;
    }
    /* the texts' addresses once the buffer stops growing */
    for (int i = 0; i < n_prompts && !st; i++)
        if (text_at[i] != SIZE_MAX) results[i].text = s->class_text.p + text_at[i];
    forge_metrics mt;
    memset(&mt, 0, sizeof mt);
    mt.prompt_tokens = (int)FORGE__MIN(total, (int64_t)INT_MAX);
    mt.prefill_ms = (forge__now_s() - t0) * 1e3;
    mt.prefill_tok_s = mt.prefill_ms > 0 ? (double)total / (mt.prefill_ms * 1e-3) : 0;
    mt.peak_device_bytes = forge__mem_peak(&m->mem_total);
    mt.prompt_cache_hits = s->prompt_cache_hits;
    s->metrics = mt;
    for (int i = 0; ids && i < n_prompts; i++) free(ids[i]);
    free(ids);
    free(lens);
    free(order);
    free(text_at);
    free(cands);
    free(probs);
    free(rows);
    return st;
}

FORGE_API forge_status forge_classify(forge_session *s, const forge_classify_prompt *prompts, int n_prompts,
                                      const forge_classify_params *params, forge_classify_result *results) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    forge_status st = forge__slot_acquire(s->m, &s->err);
    if (st) return st;
    st = forge__classify(s, prompts, n_prompts, params, results);
    forge__slot_release(s->m);
    return st;
}

/* =======================================================================================
 * 12. Chat
 * The native templates, in C: each follows its Jinja original line for line (trim is
 * Python's str.strip, roles must alternate where the template says so, Qwen 3's <think>
 * handling). The test suite renders the same conversations with transformers and compares.
 * ===================================================================================== */

typedef enum forge__chat_family {
    FORGE__CHAT_NONE = 0,
    FORGE__CHAT_LLAMA3,
    FORGE__CHAT_CHATML,
    FORGE__CHAT_GEMMA,  /* Gemma 2 and 3: <start_of_turn> */
    FORGE__CHAT_GEMMA4, /* Gemma 4: <|turn> ... <turn|>, a system turn, the thinking switch */
} forge__chat_family;

typedef struct forge__chat_style {
    forge__chat_family family;
    bool gemma4_empty_thought;    /* Gemma 4's 12B / 26B-A4B / 31B template: an empty thought block opens the reply when thinking is off */
    bool qwen3;                   /* Qwen 3's template: <think> handling, the enable_thinking switch */
    bool gemma_no_system;         /* Gemma 2's template: a system message is an error */
    const char *default_system;   /* ChatML templates that add one when the first message is not system */
    const char *bos;              /* the BOS text the template writes (Llama 3, Gemma) */
    bool llama3_gen_always;       /* Llama 3.0's first template: the assistant header even without add_generation_prompt */
    bool llama3_dated;            /* Llama 3.1+: a system block with the knowledge cutoff and today's date, always */
    char date[16];                /* its "Today Date" ("%d %b %Y"): the template's date_string, or today (strftime_now) */
} forge__chat_style;

/* A growing string (chat rendering is not on the hot path). */
typedef struct forge__sb {
    char *buf;
    size_t len, cap;
    bool oom;
} forge__sb;

static void forge__sb_put(forge__sb *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *nb = (char *)realloc(b->buf, cap);
        if (!nb) { b->oom = true; return; }
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = 0;
}
static void forge__sb_puts(forge__sb *b, const char *s) { forge__sb_put(b, s, strlen(s)); }

/* Python's str.isspace for the code point at s (its UTF-8 length in *n). */
static bool forge__py_space(const unsigned char *s, size_t avail, size_t *n) {
    *n = 1;
    unsigned c = s[0];
    if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return true;
    if (c < 0x80) return false;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0 && avail >= 2) { cp = (c & 0x1f) << 6 | (s[1] & 0x3f); *n = 2; }
    else if ((c & 0xf0) == 0xe0 && avail >= 3) { cp = (c & 0x0f) << 12 | (s[1] & 0x3f) << 6 | (s[2] & 0x3f); *n = 3; }
    else return false;
    return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* Jinja's trim (str.strip()): [*s, *s + *n) without leading and trailing whitespace. */
static void forge__py_strip(const char **s, size_t *n) {
    const unsigned char *p = (const unsigned char *)*s;
    size_t len = *n, k;
    while (len && forge__py_space(p, len, &k)) { p += k; len -= k; }
    while (len) { /* find the last code point */
        size_t start = len - 1;
        while (start && (p[start] & 0xc0) == 0x80) start--;
        if (!forge__py_space(p + start, len - start, &k)) break;
        len = start;
    }
    *s = (const char *)p;
    *n = len;
}

/* Appends s[0..n) as Jinja's `| trim` leaves it. */
static void forge__sb_put_trimmed(forge__sb *b, const char *s, size_t n) {
    forge__py_strip(&s, &n);
    forge__sb_put(b, s, n);
}

/* str.strip / lstrip / rstrip of one character ('\n') */
static void forge__strip_char(const char **s, size_t *n, char c, bool left, bool right) {
    while (left && *n && **s == c) { (*s)++; (*n)--; }
    while (right && *n && (*s)[*n - 1] == c) (*n)--;
}

static const char *forge__memmem(const char *h, size_t hn, const char *needle) {
    size_t nn = strlen(needle);
    for (size_t i = 0; i + nn <= hn; i++)
        if (!memcmp(h + i, needle, nn)) return h + i;
    return NULL;
}
static const char *forge__memmem_last(const char *h, size_t hn, const char *needle) {
    size_t nn = strlen(needle);
    for (size_t i = hn; i-- > 0;)
        if (i + nn <= hn && !memcmp(h + i, needle, nn)) return h + i;
    return NULL;
}

static bool forge__role_is(const forge_chat_message *m, const char *role) { return m->role && !strcmp(m->role, role); }

/* Python's json.dumps(s, ensure_ascii=False), which transformers' tojson filter is. */
static void forge__sb_json_string(forge__sb *b, const char *s) {
    forge__sb_puts(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        const char *esc = NULL;
        char u[8];
        switch (*p) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (*p < 0x20) { snprintf(u, sizeof u, "\\u%04x", *p); esc = u; }
        }
        if (esc) forge__sb_puts(b, esc);
        else forge__sb_put(b, (const char *)p, 1);
    }
    forge__sb_puts(b, "\"");
}

/* One Llama 3 turn: the role's header, the trimmed content, <|eot_id|>. */
static void forge__llama3_turn(forge__sb *b, const char *role, const char *content) {
    forge__sb_puts(b, "<|start_header_id|>");
    forge__sb_puts(b, role);
    forge__sb_puts(b, "<|end_header_id|>\n\n");
    forge__sb_put_trimmed(b, content, strlen(content));
    forge__sb_puts(b, "<|eot_id|>");
}

FORGE__INTERNAL forge_status forge__chat_render(const forge__chat_style *st, const forge_chat_message *msgs, int n, uint32_t flags,
                                                forge__sb *b, forge__err *err) {
    bool gen = !(flags & FORGE_CHAT_NO_GENERATION_PROMPT);
    if ((flags & FORGE_CHAT_THINKING_ON) && (flags & FORGE_CHAT_THINKING_OFF))
        return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "FORGE_CHAT_THINKING_ON and FORGE_CHAT_THINKING_OFF together");
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "message %d has no role or no content", i);
    if (st->family == FORGE__CHAT_LLAMA3 && st->llama3_dated) {
        /* Llama 3.1 / 3.2 / 3.3 without tools: BOS, a system block that always exists (cutoff,
         * date, then the first message's content when that is a system message), the turns;
         * tool results go out as an ipython turn holding the content as a JSON string. */
        if (n == 0) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "the conversation has no messages");
        int first = forge__role_is(&msgs[0], "system") ? 1 : 0;
        forge__sb_puts(b, st->bos);
        forge__sb_puts(b, "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: ");
        forge__sb_puts(b, st->date);
        forge__sb_puts(b, "\n\n");
        if (first) {
            forge__sb_put_trimmed(b, msgs[0].content, strlen(msgs[0].content));
        }
        forge__sb_puts(b, "<|eot_id|>");
        for (int i = first; i < n; i++) {
            if (forge__role_is(&msgs[i], "tool") || forge__role_is(&msgs[i], "ipython")) {
                forge__sb_puts(b, "<|start_header_id|>ipython<|end_header_id|>\n\n");
                forge__sb_json_string(b, msgs[i].content);
                forge__sb_puts(b, "<|eot_id|>");
            } else {
                forge__llama3_turn(b, msgs[i].role, msgs[i].content);
            }
        }
        if (gen) forge__sb_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    } else if (st->family == FORGE__CHAT_LLAMA3) {
        for (int i = 0; i < n; i++) {
            if (i == 0) forge__sb_puts(b, st->bos);
            forge__llama3_turn(b, msgs[i].role, msgs[i].content);
        }
        if (gen || st->llama3_gen_always) forge__sb_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    } else if (st->family == FORGE__CHAT_GEMMA) {
        int first = 0;
        const char *prefix = NULL;
        if (n > 0 && forge__role_is(&msgs[0], "system")) {
            if (st->gemma_no_system) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "System role not supported");
            prefix = msgs[0].content;
            first = 1;
        }
        forge__sb_puts(b, st->bos);
        for (int i = first; i < n; i++) {
            bool user = forge__role_is(&msgs[i], "user");
            if (user != ((i - first) % 2 == 0))
                return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "Conversation roles must alternate user/assistant/user/assistant/...");
            forge__sb_puts(b, "<start_of_turn>");
            forge__sb_puts(b, forge__role_is(&msgs[i], "assistant") ? "model" : msgs[i].role);
            forge__sb_puts(b, "\n");
            if (i == first && prefix) {
                forge__sb_puts(b, prefix);
                forge__sb_puts(b, "\n\n");
            }
            forge__sb_put_trimmed(b, msgs[i].content, strlen(msgs[i].content));
            forge__sb_puts(b, "<end_of_turn>\n");
        }
        if (gen) forge__sb_puts(b, "<start_of_turn>model\n");
    } else if (st->family == FORGE__CHAT_GEMMA4) {
        /* Gemma 4's chat_template.jinja (2026-07-09) for messages of text: a system turn first
         * when thinking is on or the first message is a system or developer message; then one
         * turn per message (assistant as model; consecutive assistant messages share one turn,
         * their thought channels stripped); the reply opens with <|turn>model. */
        bool think = (flags & FORGE_CHAT_THINKING_ON) != 0;
        int first = n > 0 && (forge__role_is(&msgs[0], "system") || forge__role_is(&msgs[0], "developer")) ? 1 : 0;
        for (int i = first; i < n; i++)
            if (forge__role_is(&msgs[i], "tool"))
                return forge__fail(err, FORGE_ERR_UNSUPPORTED,
                                   "message %d: Gemma 4's template places a tool result after the assistant's tool call, which forge's messages do not carry", i);
        forge__sb_puts(b, st->bos);
        if (think || first) {
            forge__sb_puts(b, "<|turn>system\n");
            if (think) forge__sb_puts(b, "<|think|>\n");
            if (first) {
                forge__sb_put_trimmed(b, msgs[0].content, strlen(msgs[0].content));
            }
            forge__sb_puts(b, "<turn|>\n");
        }
        for (int i = first; i < n; i++) {
            bool model = forge__role_is(&msgs[i], "assistant");
            if (!(model && i > first && forge__role_is(&msgs[i - 1], "assistant"))) {
                forge__sb_puts(b, "<|turn>");
                forge__sb_puts(b, model ? "model" : msgs[i].role);
                forge__sb_puts(b, "\n");
            }
            if (model) { /* strip_thinking: every <|channel>...<channel|> span out, then trim */
                forge__sb kept = {0};
                const char *p = msgs[i].content;
                for (;;) {
                    const char *close = strstr(p, "<channel|>");
                    size_t len = close ? (size_t)(close - p) : strlen(p);
                    const char *open = forge__memmem(p, len, "<|channel>");
                    forge__sb_put(&kept, p, open ? (size_t)(open - p) : len);
                    if (!close) break;
                    p = close + strlen("<channel|>");
                }
                forge__sb_put_trimmed(b, kept.buf ? kept.buf : "", kept.len);
                b->oom |= kept.oom;
                free(kept.buf);
            } else {
                forge__sb_put_trimmed(b, msgs[i].content, strlen(msgs[i].content));
            }
            if (!(model && i + 1 < n && forge__role_is(&msgs[i + 1], "assistant"))) forge__sb_puts(b, "<turn|>\n");
        }
        if (gen) {
            forge__sb_puts(b, "<|turn>model\n");
            if (st->gemma4_empty_thought && !think) forge__sb_puts(b, "<|channel>thought\n<channel|>");
        }
    } else if (st->family == FORGE__CHAT_CHATML) {
        if (n > 0 && forge__role_is(&msgs[0], "system")) {
            forge__sb_puts(b, "<|im_start|>system\n");
            forge__sb_puts(b, msgs[0].content);
            forge__sb_puts(b, "<|im_end|>\n");
        } else if (st->default_system) {
            forge__sb_puts(b, "<|im_start|>system\n");
            forge__sb_puts(b, st->default_system);
            forge__sb_puts(b, "<|im_end|>\n");
        }
        /* Qwen 3: the last user query that is not a tool response */
        int last_query = n - 1;
        if (st->qwen3)
            for (int i = n - 1; i >= 0; i--) {
                const char *c = msgs[i].content;
                size_t cn = strlen(c);
                bool tool_resp = cn >= 32 && !strncmp(c, "<tool_response>", 15) && !strcmp(c + cn - 16, "</tool_response>");
                if (forge__role_is(&msgs[i], "user") && !tool_resp) { last_query = i; break; }
            }
        for (int i = 0; i < n; i++) {
            const forge_chat_message *m = &msgs[i];
            if (forge__role_is(m, "user") || (forge__role_is(m, "system") && i > 0)) {
                forge__sb_puts(b, "<|im_start|>");
                forge__sb_puts(b, m->role);
                forge__sb_puts(b, "\n");
                forge__sb_puts(b, m->content);
                forge__sb_puts(b, "<|im_end|>\n");
            } else if (forge__role_is(m, "assistant")) {
                const char *content = m->content, *reason = "";
                size_t cn = strlen(content), rn = 0;
                if (st->qwen3) {
                    const char *end = forge__memmem(m->content, cn, "</think>");
                    if (end) { /* content after the last </think>; reasoning before the first, after its last <think> */
                        const char *last = forge__memmem_last(m->content, strlen(m->content), "</think>");
                        content = last + 8;
                        cn = strlen(content);
                        forge__strip_char(&content, &cn, '\n', true, false);
                        reason = m->content;
                        rn = (size_t)(end - m->content);
                        forge__strip_char(&reason, &rn, '\n', false, true);
                        const char *open = forge__memmem_last(reason, rn, "<think>");
                        if (open) { rn -= (size_t)(open + 7 - reason); reason = open + 7; }
                        forge__strip_char(&reason, &rn, '\n', true, false);
                    }
                }
                forge__sb_puts(b, "<|im_start|>assistant\n");
                if (st->qwen3 && i > last_query && (i == n - 1 || rn > 0)) {
                    forge__strip_char(&reason, &rn, '\n', true, true);
                    forge__sb_puts(b, "<think>\n");
                    forge__sb_put(b, reason, rn);
                    forge__sb_puts(b, "\n</think>\n\n");
                    forge__strip_char(&content, &cn, '\n', true, false);
                }
                forge__sb_put(b, content, cn);
                forge__sb_puts(b, "<|im_end|>\n");
            } else if (forge__role_is(m, "tool")) {
                if (i == 0 || !forge__role_is(&msgs[i - 1], "tool")) forge__sb_puts(b, "<|im_start|>user");
                forge__sb_puts(b, "\n<tool_response>\n");
                forge__sb_puts(b, m->content);
                forge__sb_puts(b, "\n</tool_response>");
                if (i == n - 1 || !forge__role_is(&msgs[i + 1], "tool")) forge__sb_puts(b, "<|im_end|>\n");
            }
        }
        if (gen) {
            forge__sb_puts(b, "<|im_start|>assistant\n");
            if (st->qwen3 && (flags & FORGE_CHAT_THINKING_OFF)) forge__sb_puts(b, "<think>\n\n</think>\n\n");
        }
    } else {
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "the model has no known chat format (Llama 3, ChatML, Gemma, Gemma 4)");
    }
    if (b->oom) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    return FORGE_OK;
}

/* The "Today Date" of a Llama 3.1+ template: today, as transformers' strftime_now("%d %b %Y")
 * gives it (local time; English month names whatever the C locale), when the template asks
 * for it; else the date_string it sets ("26 Jul 2024" in 3.1 and 3.3). */
static void forge__template_date(const char *tmpl, char out[16]) {
    static const char *months[12] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    snprintf(out, 16, "26 Jul 2024");
    if (strstr(tmpl, "strftime_now")) {
        time_t now = time(NULL);
        struct tm tm;
        if (localtime_r(&now, &tm)) snprintf(out, 16, "%02d %s %04d", tm.tm_mday, months[tm.tm_mon % 12], (tm.tm_year + 1900) % 10000);
        return;
    }
    const char *set = strstr(tmpl, "set date_string = \"");
    if (set) {
        set += strlen("set date_string = \"");
        const char *end = strchr(set, '"');
        if (end && end - set < 16) snprintf(out, 16, "%.*s", (int)(end - set), set);
    }
}

/* The chat format of a model: from its tokenizer's special tokens, refined by the
 * checkpoint's own template text where it has one. */
static forge_status forge__chat_style_of(const forge_model *m, forge__chat_style *st) {
    memset(st, 0, sizeof *st);
    const char *tmpl = m->chat_template ? m->chat_template : "";
    forge_special_tokens sp;
    forge_model_special_tokens(m, &sp);
    const char *bos = sp.bos >= 0 ? forge_token_piece(m, sp.bos) : NULL;
    if (forge_token_id(m, "<|turn>") >= 0) {
        st->family = FORGE__CHAT_GEMMA4;
        st->bos = bos ? bos : "<bos>";
        /* the larger models' template, which alone writes this block after the reply's opening */
        st->gemma4_empty_thought = strstr(tmpl, "'<|channel>thought\\n<channel|>'") != NULL;
    } else if (forge_token_id(m, "<start_of_turn>") >= 0) {
        st->family = FORGE__CHAT_GEMMA;
        st->gemma_no_system = strstr(tmpl, "System role not supported") != NULL ||
                              (!m->chat_template && m->cfg.arch == FORGE__ARCH_GEMMA2);
        st->bos = bos ? bos : "<bos>";
    } else if (forge_token_id(m, "<|im_start|>") >= 0) {
        st->family = FORGE__CHAT_CHATML;
        st->qwen3 = strstr(tmpl, "enable_thinking") != NULL || (!m->chat_template && m->cfg.arch == FORGE__ARCH_QWEN3);
        if (strstr(tmpl, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."))
            st->default_system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
        else if (strstr(tmpl, "<|im_start|>system\\nYou are a helpful assistant.<|im_end|>") ||
                 strstr(tmpl, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>"))
            st->default_system = "You are a helpful assistant.";
    } else if (forge_token_id(m, "<|start_header_id|>") >= 0) {
        st->family = FORGE__CHAT_LLAMA3;
        st->bos = bos ? bos : "<|begin_of_text|>";
        st->llama3_gen_always = !strstr(tmpl, "add_generation_prompt");
        st->llama3_dated = strstr(tmpl, "Cutting Knowledge Date") != NULL;
        if (st->llama3_dated) forge__template_date(tmpl, st->date);
    } else {
        return forge__model_fail(m, FORGE_ERR_UNSUPPORTED, "the model's tokenizer has no known chat format (Llama 3, ChatML, Gemma, Gemma 4)");
    }
    return FORGE_OK;
}

FORGE_API forge_status forge_chat_render(const forge_model *m, const forge_chat_message *messages, int n_messages, uint32_t flags,
                                         char *out, size_t capacity, size_t *len) {
    if (!forge__model_ready(m) || !len || n_messages < 0 || (n_messages && !messages)) return FORGE_ERR_INVALID_ARGUMENT;
    forge__chat_style st;
    forge_status s = forge__chat_style_of(m, &st);
    if (s) return s;
    forge__sb b = {0};
    forge__err err;
    s = forge__chat_render(&st, messages, n_messages, flags, &b, &err);
    if (s) {
        free(b.buf);
        return forge__model_fail(m, s, "%s", err.msg);
    }
    *len = b.len;
    if (!out || capacity < b.len + 1) s = FORGE_ERR_BUFFER_TOO_SMALL;
    else memcpy(out, b.buf ? b.buf : "", b.len + 1);
    free(b.buf);
    return s;
}

FORGE_API forge_status forge_chat(forge_session *s, const forge_chat_message *messages, int n_messages, uint32_t flags,
                                  const forge_generate_params *params, forge_metrics *metrics) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    forge_model *m = s->m;
    forge__chat_style st;
    forge_status rc = forge__chat_style_of(m, &st);
    if (rc) return forge__fail(&s->err, rc, "%s", forge_model_errmsg(m));
    forge__sb b = {0};
    if ((rc = forge__chat_render(&st, messages, n_messages, flags, &b, &s->err))) {
        free(b.buf);
        return rc;
    }
    forge_generate_params p;
    FORGE__COPY_PARAMS(p, params, forge_generate_default_params);
    p.add_special = 0; /* the template wrote BOS */
    rc = forge_generate(s, b.buf ? b.buf : "", b.len, &p, metrics);
    free(b.buf);
    return rc;
}

/* =======================================================================================
 * 13. Training
 * LoRA fine-tuning. First the adapter files (PEFT and mlx-lm, read and written, atomically),
 * then the trainer: its device plan (adapters, gradients and AdamW moments in a flat vector;
 * the activations the backward pass reads; scratch), the recorded step (the forward pass of
 * section 7 keeping its activations, the loss over chunks of rows, the hand-written backward
 * pass layer by layer, gradient checkpointing), the optimizer, and the public calls.
 * ===================================================================================== */

/* ---- Targets ---- */

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
            return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT,
                               "LoRA target '%.*s' is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (or all)", (int)n, p);
        *mask |= 1u << t;
        p += n + (e ? 1 : 0);
    }
    return FORGE_OK;
}

/* The in and out features of projection t. */
static void forge__target_dims(const forge__config *c, forge__target t, uint32_t *in, uint32_t *out) {
    uint32_t H = (uint32_t)c->hidden, QD = (uint32_t)(c->n_heads * c->head_dim), KVD = (uint32_t)(c->n_kv_heads * c->head_dim);
    uint32_t F = (uint32_t)c->ffn;
    static const uint8_t in_kind[FORGE__T_COUNT] = {0, 0, 0, 1, 0, 0, 2}, out_kind[FORGE__T_COUNT] = {1, 3, 3, 0, 2, 2, 0};
    const uint32_t size[4] = {H, QD, F, KVD};
    *in = size[in_kind[t]];
    *out = size[out_kind[t]];
}

/* ---- Adapters on the host ----
 * A and B in forge's layout: A [rank, in], B [out, rank], f32. Models whose RoPE rotates
 * adjacent pairs (GGUF llama: its converter permuted q_proj and k_proj rows) hold B's rows of
 * q and k in that order; adapter files hold HF's, so reading and writing permute them. */

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

/* Rows of q or k [heads * head_dim, cols]: HF row (h, half, i) is row (h, i, half) of a model
 * that rotates adjacent pairs (tools/hf_to_gguf.py's llama_permute). */
static void forge__permute_rows(float *dst, const float *src, uint32_t heads, uint32_t head_dim, uint32_t cols, bool to_adjacent) {
    uint32_t half = head_dim / 2;
    for (uint32_t h = 0; h < heads; h++)
        for (uint32_t k = 0; k < 2; k++)
            for (uint32_t i = 0; i < half; i++) {
                size_t hf = (size_t)h * head_dim + k * half + i, adj = (size_t)h * head_dim + 2 * i + k;
                memcpy(dst + (to_adjacent ? adj : hf) * cols, src + (to_adjacent ? hf : adj) * cols, sizeof(float) * cols);
            }
}

/* Whether B's rows of target t are permuted in forge's layout. */
static bool forge__permuted(const forge__config *c, forge__target t, uint32_t *heads) {
    if (!c->rope_adjacent_pairs || (t != FORGE__T_Q && t != FORGE__T_K)) return false;
    *heads = (uint32_t)(t == FORGE__T_Q ? c->n_heads : c->n_kv_heads);
    return true;
}

/* "...layers.N.self_attn.q_proj.<leaf>": layer, target and the leaf after the projection's
 * name; NULL when the name is not of that shape. *other_tower is set for the vision or audio
 * tower of a multimodal checkpoint, whose adapters forge skips with the tower. */
static const char *forge__adapter_key(const char *name, int *layer, forge__target *t, bool *other_tower) {
    *other_tower = strstr(name, "vision") || strstr(name, "audio") || strstr(name, "multi_modal");
    const char *p = strstr(name, "layers.");
    while (p && p != name && p[-1] != '.') p = strstr(p + 1, "layers.");
    if (!p) return NULL;
    p += 7;
    if (!isdigit((unsigned char)*p)) return NULL;
    long l = 0;
    while (isdigit((unsigned char)*p) && l < 100000) l = l * 10 + (*p++ - '0');
    if (*p++ != '.') return NULL;
    bool attn = !strncmp(p, "self_attn.", 10), mlp = !strncmp(p, "mlp.", 4);
    if (!attn && !mlp) return NULL;
    p += attn ? 10 : 4;
    for (int k = 0; k < FORGE__T_COUNT; k++) {
        size_t n = strlen(forge__target_names[k]);
        if (!strncmp(p, forge__target_names[k], n) && p[n] == '.' && (k <= FORGE__T_O) == attn) {
            *layer = (int)l;
            *t = (forge__target)k;
            return p + n + 1;
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
    if (!forge__uniform_layers(c))
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: adapters are not supported for architecture %s (layers of different shapes, "
                           "shared caches or experts)", dir, forge__arch_names[c->arch]);
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
        const char *leaf = forge__adapter_key(t->name, &layer, &tg, &other);
        int which = !leaf ? -1 : peft ? (!strcmp(leaf, "lora_A.weight") ? 0 : !strcmp(leaf, "lora_B.weight") ? 1 : -1)
                                      : (!strcmp(leaf, "lora_a") ? 0 : !strcmp(leaf, "lora_b") ? 1 : -1);
        if (other) continue; /* the vision or audio tower: forge runs the text model only */
        if (which < 0) {
            st = forge__fail(err, FORGE_ERR_MODEL,
                             "%s: tensor '%s' is not a LoRA matrix (%s) of a projection forge knows (q_proj, k_proj, v_proj, o_proj, gate_proj, "
                             "up_proj, down_proj)", st_path, t->name, peft ? "lora_A.weight / lora_B.weight" : "lora_a / lora_b");
            break;
        }
        if (layer >= c->n_layers) {
            st = forge__fail(err, FORGE_ERR_MODEL, "%s: tensor '%s' is for layer %d but the model has %d layers (a different base?)", st_path,
                             t->name, layer, c->n_layers);
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
        uint32_t heads;
        if (which && forge__permuted(c, tg, &heads)) {
            memcpy(tmp, v, sizeof(float) * n);
            forge__permute_rows(v, tmp, heads, (uint32_t)c->head_dim, (uint32_t)r, true);
        }
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
                if ((ah->targets >> t & 1u) && !ah->pairs[l * FORGE__T_COUNT + t].rank)
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
            uint32_t in, out, r = hp->rank, heads;
            forge__target_dims(c, (forge__target)t, &in, &out);
            const char *group = t <= FORGE__T_O ? "self_attn" : "mlp";
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
                if (which && forge__permuted(c, (forge__target)t, &heads)) forge__permute_rows(hf, src, heads, (uint32_t)c->head_dim, r, false);
                else memcpy(hf, src, 4ull * rows * cols);
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
                snprintf(o->name, sizeof o->name, "%slayers.%d.%s.%s.%s", prefix, l, group, forge__target_names[t],
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
            char key[32];
            snprintf(key, sizeof key, "%s%s", peft ? "" : (t <= FORGE__T_O ? "self_attn." : "mlp."), forge__target_names[t]);
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
 * path beside the projections (section 7). */
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
 * row0 .. row0 + rows (the q|k|v rows of a fused weight), or every second row from `phase`
 * (step 2: the interleaved gate_up weight). */
static const forge__weight *forge__target_weight(const forge__config *c, const forge__layer *ly, forge__target t, uint32_t *row0, uint32_t *rows,
                                                 uint32_t *step, uint32_t *phase) {
    uint32_t QD = (uint32_t)(c->n_heads * c->head_dim), KVD = (uint32_t)(c->n_kv_heads * c->head_dim);
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
    case FORGE__T_O: return &ly->wo;
    case FORGE__T_GATE: case FORGE__T_UP:
        if (!ly->fused_gate_up) return t == FORGE__T_GATE ? &ly->gate : &ly->up;
        *step = 2;
        *phase = t == FORGE__T_UP;
        return &ly->gate_up;
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
            uint32_t row0, rows, step, phase, gx, gy;
            const forge__weight *w = forge__target_weight(c, &m->layers[l], (forge__target)t, &row0, &rows, &step, &phase);
            for (int i = 0; i < w->n_chunks; i++) {
                const forge__wchunk *ch = &w->chunks[i];
                uint32_t n = ch->rows * w->cols;
                forge__pc_merge pc = {w->cols, n, ch->row0, row0, rows, step, phase, lp->rank, lp->a_el, lp->b_el,
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
    forge_status st = forge__record(m, pool, false, forge__record_merge_fn, m, &rc, &m->err);
    if (!st) st = forge__submit_wait(d, rc.cb, fence, &m->err);
    forge__recording_free(d, pool, &rc);
    d->vk.vkDestroyFence(d->dev, fence, NULL);
    d->vk.vkDestroyCommandPool(d->dev, pool, NULL);
    if (!st) m->adapter.pairs = NULL; /* folded in: the forward pass no longer adds it */
    return st;
}

/* ---- The trainer ---- */

#define FORGE__TRAIN_RECORDINGS 4
#define FORGE__TRAIN_PAD 32            /* a batch's length is padded up to a multiple of this (fewer recordings) */
#define FORGE__LOSS_CHUNK_BYTES ((uint64_t)256 << 20) /* logits rows per loss chunk: at most this many bytes (512 rows of a 128k vocabulary: the head's products stay large) */

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
} forge__train_layout;

/* The trainer's device buffers, in pack order. Per layer then: x_in, and without gradient
 * checkpointing the rest of forge__train_layer_buf. */
typedef enum forge__train_buf {
    FORGE__TB_X, FORGE__TB_XN, FORGE__TB_XF, FORGE__TB_DX, FORGE__TB_DXN, FORGE__TB_DQKV, FORGE__TB_DATT, FORGE__TB_DH,
    FORGE__TB_DGU, FORGE__TB_DU, FORGE__TB_LOGITS, FORGE__TB_LOSS, FORGE__TB_NORM, FORGE__TB_GEMM_PART, FORGE__TB_DUMMY, FORGE__TB_A16, FORGE__TB_COUNT
} forge__train_buf;
typedef enum forge__train_layer_buf {
    FORGE__TL_X_IN, FORGE__TL_X_MID, FORGE__TL_QKV, FORGE__TL_QKV_RAW, FORGE__TL_ATT, FORGE__TL_LSE, FORGE__TL_GU, FORGE__TL_H,
    FORGE__TL_K, FORGE__TL_V, FORGE__TL_O, FORGE__TL_D, FORGE__TL_U, FORGE__TL_COUNT
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

/* Validates the params, reads the adapter to start from, and lays out the parameters. */
static forge_status forge__train_layout_make(forge_model *m, const forge_train_params *pp, forge__arena *arena, forge__train_layout *L,
                                             forge__err *err) {
    const forge__config *c = &m->cfg;
    memset(L, 0, sizeof *L);
    L->p = *pp;
    forge_train_params *p = &L->p;
    forge_status st;
    if (!forge__uniform_layers(c))
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "training is not supported for architecture %s (layers of different shapes, "
                           "shared caches or experts)", forge__arch_names[c->arch]);
    if (c->head_dim > FORGE__MAX_TRAIN_HEAD_DIM)
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
    uint64_t F = (uint64_t)c->ffn, QKVD = (uint64_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    uint64_t widest = FORGE__MAX(FORGE__MAX(2 * F, QKVD), (uint64_t)FORGE__T_COUNT * p->rank) * 4;
    if (rows * widest > range)
        return forge__fail(err, FORGE_ERR_LIMIT,
                           "train params: max_batch x max_seq = %llu rows of up to %llu bytes exceed the device's binding limit of %llu bytes: "
                           "lower max_batch or max_seq", (unsigned long long)rows, (unsigned long long)widest, (unsigned long long)range);
    uint64_t V = (uint64_t)c->n_vocab;
    if (4 * V > range) return forge__fail(err, FORGE_ERR_LIMIT, "a logits row of %llu bytes exceeds the binding limit", (unsigned long long)(4 * V));
    L->loss_rows = (uint32_t)FORGE__MIN(rows, FORGE__MAX(1, FORGE__MIN(FORGE__LOSS_CHUNK_BYTES, range) / (4 * V)));
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
    uint64_t seg_limit = range / 4;
    for (size_t i = 0; i < n; i++) {
        int l = (int)(i / FORGE__T_COUNT), t = (int)(i % FORGE__T_COUNT);
        forge__lora_pair *lp = &L->lora.pairs[i];
        uint32_t rank = L->from_adapter ? L->ah.pairs[i].rank : (l >= L->first_layer && (L->targets >> t & 1u)) ? (uint32_t)p->rank : 0;
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
    for (int s = 0; s < L->n_segs; s++) L->n_parts += (uint32_t)((L->seg_count[s] + FORGE__ADAMW_PER_WG - 1) / FORGE__ADAMW_PER_WG);
    return FORGE_OK;
}

/* Bytes of each per-layer buffer (0: not kept by this model) for `rows` rows. */
static void forge__train_layer_sizes(const forge_model *m, const forge__train_layout *L, uint64_t rows, uint64_t *sz) {
    const forge__config *c = &m->cfg;
    uint64_t H = (uint64_t)c->hidden, QD = (uint64_t)c->n_heads * c->head_dim, KVD = (uint64_t)c->n_kv_heads * c->head_dim;
    uint64_t QKVD = QD + 2 * KVD, F = (uint64_t)c->ffn;
    uint64_t w[FORGE__TL_COUNT] = {
        [FORGE__TL_X_IN] = H, [FORGE__TL_X_MID] = H, [FORGE__TL_QKV] = QKVD, [FORGE__TL_QKV_RAW] = c->qk_norm ? QKVD : 0,
        [FORGE__TL_ATT] = QD, [FORGE__TL_LSE] = 2 * (uint64_t)c->n_heads, [FORGE__TL_GU] = 2 * F, [FORGE__TL_H] = F,
        [FORGE__TL_K] = KVD, [FORGE__TL_V] = KVD, [FORGE__TL_O] = c->sandwich_norms ? H : 0, [FORGE__TL_D] = c->sandwich_norms ? H : 0,
        [FORGE__TL_U] = (uint64_t)FORGE__T_COUNT * L->lora.max_rank,
    };
    for (int i = 0; i < FORGE__TL_COUNT; i++) sz[i] = 4 * rows * w[i];
}

/* Adds every device buffer of the trainer to `pack`: the segments (parameters, gradients, two
 * moments each), the working buffers (forge__train_buf), the shared layer set (every layer's
 * activations under checkpointing, or of the layers without adapters), then per adapted layer
 * its input, and without checkpointing the rest. */
static forge_status forge__train_pack(const forge_model *m, const forge__train_layout *L, forge__pack *pack, forge__arena *a, forge__err *err) {
    const forge__config *c = &m->cfg;
    uint64_t N = L->max_rows, H = (uint64_t)c->hidden, QD = (uint64_t)c->n_heads * c->head_dim, F = (uint64_t)c->ffn;
    uint64_t QKVD = QD + 2 * (uint64_t)c->n_kv_heads * c->head_dim, U = (uint64_t)FORGE__T_COUNT * L->lora.max_rank;
    bool ok = true;
    for (int s = 0; s < L->n_segs; s++)
        for (int k = 0; k < 4; k++) ok &= forge__pack_add(pack, a, 4 * L->seg_count[s]) >= 0;
    uint64_t sizes[FORGE__TB_COUNT] = {
        [FORGE__TB_X] = 4 * N * H, [FORGE__TB_XN] = 4 * N * H, [FORGE__TB_XF] = 4 * N * H,
        [FORGE__TB_DX] = 4 * N * H, [FORGE__TB_DXN] = 4 * N * H, [FORGE__TB_DQKV] = 4 * N * QKVD, [FORGE__TB_DATT] = 4 * N * QD,
        [FORGE__TB_DH] = 4 * N * F, [FORGE__TB_DGU] = 8 * N * F, [FORGE__TB_DU] = 4 * N * U,
        [FORGE__TB_LOGITS] = L->p.loss == FORGE_LOSS_MSE_HIDDEN ? 16 : 4ull * L->loss_rows * c->n_vocab,
        [FORGE__TB_LOSS] = 4 * N, [FORGE__TB_NORM] = 4ull * (1 + L->n_parts), [FORGE__TB_DUMMY] = 256,
        /* split-K partial sums of the widest low-rank product: tokens, or a projection's features, by rank */
        [FORGE__TB_GEMM_PART] = 4ull * FORGE__GEMM_MAX_SPLITS * L->lora.max_rank * FORGE__MAX(N, FORGE__MAX(F, FORGE__MAX(H, QD))),
        [FORGE__TB_A16] = forge__a16_bytes(m, N),
    };
    for (int i = 0; i < FORGE__TB_COUNT; i++) ok &= forge__pack_add(pack, a, sizes[i]) >= 0;
    uint64_t ls[FORGE__TL_COUNT];
    forge__train_layer_sizes(m, L, N, ls);
    for (int i = 0; i < FORGE__TL_COUNT; i++) ok &= forge__pack_add(pack, a, ls[i] ? ls[i] : 16) >= 0;
    for (int l = L->first_layer; l < c->n_layers; l++)
        for (int i = 0; i < (L->ckpt ? 1 : FORGE__TL_COUNT); i++) ok &= forge__pack_add(pack, a, ls[i] ? ls[i] : 16) >= 0;
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
        memset(plan, 0, sizeof *plan);
        plan->device_planned_bytes = forge__pack_total(&pack) + forge__train_io_offset(m, &L, 6) + forge__train_readback_bytes(&L);
        plan->host_arena_bytes = a.bytes;
        plan->device_buffers = (uint64_t)pack.n_blocks + 2;
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

/* dx[M, ldc] (+)= dy . W (matmul_back.comp): dy holds W's outputs at columns y_col0 + row of
 * each row of ldy floats (y_col0 may also skip whole rows: it is a flat offset), dx W's inputs
 * at c_off + k. Chunks add up, a barrier between them. */
static void forge__linear_back(const forge__pass *p, const forge__weight *w, forge__range dy, uint32_t ldy, uint32_t y_col0, uint32_t M,
                               forge__range dx, uint32_t ldc, uint32_t c_off, bool accumulate) {
    for (int i = 0; i < w->n_chunks; i++) {
        const forge__wchunk *c = &w->chunks[i];
        bool mlx = w->fmt == FORGE__W_MLX;
        forge__range b[5] = {dy, c->w, dx, mlx ? c->scales : p->dummy, mlx ? c->biases : p->dummy};
        forge__pc_back pc = {M, w->cols, c->rows, y_col0 + c->row0, ldy, ldc, c_off, accumulate || i > 0 ? 1u : 0u, w->bits, w->group, w->qflags};
        if (i) forge__barrier(p->r);
        /* 128 x 128 tiles where there are enough of them, as in the forward products */
        bool big = (uint64_t)((w->cols + 127) / 128) * ((M + 127) / 128) >= FORGE__BIG_TILES_MIN;
        uint32_t tile = big ? 128 : 64;
        forge__dispatch(p->r, (forge__op)((big ? FORGE__OP_MATMUL_BACK_BIG : FORGE__OP_MATMUL_BACK) + w->fmt), b, &pc, (w->cols + tile - 1) / tile,
                        (M + tile - 1) / tile, 1);
    }
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
    uint32_t uc = forge__u_col(p, t), ul = forge__u_ld(p);
    forge__gemm(p, (forge__mview){dy, col0, step, ldy}, forge__rows(u, uc, ul), forge__rows(lp->gb, lp->b_el, lp->rank), lp->out, lp->rank, p->n,
                lp->scale, true, 0, 0, 0);
    forge__gemm(p, (forge__mview){dy, col0, ldy, step}, forge__rows(lp->b, lp->b_el, lp->rank), forge__rows(du, uc, ul), p->n, lp->rank, lp->out,
                lp->scale, false, 0, 0, 0);
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

/* One layer's backward pass: tr->r[DX] holds the gradient of the layer's output (the residual
 * stream after it) and leaves holding the gradient of its input. `a` holds the layer's forward
 * activations (kept, or just recomputed). */
static void forge__record_layer_back(forge_trainer *tr, const forge__pass *p, int l, const forge__acts *a) {
    forge_model *m = p->m;
    forge__rec *r = p->r;
    const forge__config *c = &m->cfg;
    const forge__layer *ly = &m->layers[l];
    uint32_t n = p->n, H = (uint32_t)c->hidden, D = (uint32_t)c->head_dim, NH = (uint32_t)c->n_heads, NKV = (uint32_t)c->n_kv_heads;
    uint32_t QD = NH * D, KVD = NKV * D, QKVD = QD + 2 * KVD, F = (uint32_t)c->ffn, gx, gy;
    forge__range dx = tr->r[FORGE__TB_DX], dxn = tr->r[FORGE__TB_DXN], xn = tr->r[FORGE__TB_XN];
    forge__range dqkv = tr->r[FORGE__TB_DQKV], datt = tr->r[FORGE__TB_DATT], dh = tr->r[FORGE__TB_DH], dgu = tr->r[FORGE__TB_DGU];

    /* ---- the MLP: x_out = x_mid + [post-norm](down(act(gate xn2) * up xn2)), xn2 = norm(x_mid) */
    forge__range dd = dx; /* the gradient of down's output */
    if (c->sandwich_norms) {
        forge__rmsnorm_back(p, a->d, &ly->post_ffn_norm, dx, dxn, n, H, 0, 0, 0, false);
        forge__barrier(r);
        dd = dxn;
    }
    forge__linear_back(p, &ly->down, dd, H, 0, n, dh, F, 0, false);
    forge__rmsnorm(p, a->x_mid, 0, &ly->ffn_norm, xn, 0, n, H, 0); /* the gate and up products' input, again */
    forge__barrier(r);
    {
        forge__target ts[1] = {FORGE__T_DOWN};
        uint32_t ldy[1] = {H}, col0[1] = {0}, step[1] = {1};
        if (forge__lora_at(p->lora, l, FORGE__T_DOWN)) forge__lora_back_group(tr, p, l, ts, 1, a->h, a->u, dh, &dd, ldy, col0, step);
    }
    bool pairs = ly->fused_gate_up;
    forge__pc_act pact = {n * F, (uint32_t)c->act, pairs ? FORGE__GU_PAIRS : FORGE__GU_HALVES, F, 0, 0};
    forge__range bact[3] = {dh, a->gu, dgu};
    forge__grid(((uint64_t)n * F + 255) / 256, &gx, &gy);
    forge__dispatch(r, FORGE__OP_ACT_MUL_BACK, bact, &pact, gx, gy, 1);
    forge__barrier(r);
    if (pairs) {
        forge__linear_back(p, &ly->gate_up, dgu, 2 * F, 0, n, dxn, H, 0, false);
    } else {
        forge__linear_back(p, &ly->gate, dgu, 2 * F, 0, n, dxn, H, 0, false);
        forge__barrier(r);
        forge__linear_back(p, &ly->up, dgu, 2 * F, F, n, dxn, H, 0, true);
    }
    forge__barrier(r);
    if (forge__lora_any(p, l, FORGE__T_GU)) {
        forge__target ts[2] = {FORGE__T_GATE, FORGE__T_UP};
        forge__range dys[2] = {dgu, dgu};
        uint32_t ldy[2] = {2 * F, 2 * F}, col0[2] = {0, pairs ? 1 : F}, step[2] = {pairs ? 2u : 1u, pairs ? 2u : 1u};
        forge__lora_back_group(tr, p, l, ts, 2, xn, a->u, dxn, dys, ldy, col0, step);
    }
    forge__rmsnorm_back(p, a->x_mid, &ly->ffn_norm, dxn, dx, n, H, 0, 0, 0, true);
    forge__barrier(r);

    /* ---- attention: x_mid = x_in + [post-norm](o(attn(rope(norm_qk(qkv(xn1)))))), xn1 = norm(x_in) */
    forge__range dout = dx; /* the gradient of o_proj's output */
    if (c->sandwich_norms) {
        forge__rmsnorm_back(p, a->o, &ly->post_attn_norm, dx, dxn, n, H, 0, 0, 0, false);
        forge__barrier(r);
        dout = dxn;
    }
    forge__linear_back(p, &ly->wo, dout, H, 0, n, datt, QD, 0, false);
    forge__barrier(r);
    {
        forge__target ts[1] = {FORGE__T_O};
        uint32_t ldy[1] = {H}, col0[1] = {0}, step[1] = {1};
        if (forge__lora_at(p->lora, l, FORGE__T_O)) forge__lora_back_group(tr, p, l, ts, 1, a->att, a->u, datt, &dout, ldy, col0, step);
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
    if (forge__lora_any(p, l, FORGE__T_QKV)) {
        forge__target ts[3] = {FORGE__T_Q, FORGE__T_K, FORGE__T_V};
        forge__range dys[3] = {dqkv, dqkv, dqkv};
        uint32_t ldy[3] = {QKVD, QKVD, QKVD}, col0[3] = {0, QD, QD + KVD}, step[3] = {1, 1, 1};
        forge__lora_back_group(tr, p, l, ts, 3, xn, a->u, dxn, dys, ldy, col0, step);
    }
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
        tr->acts[l] = (forge__acts){
            .x = tr->r[FORGE__TB_X], .xn = tr->r[FORGE__TB_XN], .qkv = own[FORGE__TL_QKV], .att = own[FORGE__TL_ATT],
            .gu = own[FORGE__TL_GU], .h = own[FORGE__TL_H], .kc = own[FORGE__TL_K], .vc = own[FORGE__TL_V], .slots = L->max_rows,
            .attn_part = tr->r[FORGE__TB_DUMMY], .u = own[FORGE__TL_U], .o = own[FORGE__TL_O], .d = own[FORGE__TL_D],
            /* what only the backward pass reads: not for the layers below the adapters */
            .x_in = adapted ? own[FORGE__TL_X_IN] : (forge__range){0}, .x_mid = adapted ? own[FORGE__TL_X_MID] : (forge__range){0},
            .qkv_raw = adapted && c->qk_norm ? own[FORGE__TL_QKV_RAW] : (forge__range){0},
            .lse = adapted ? own[FORGE__TL_LSE] : (forge__range){0},
        };
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
    return forge__record(m, tr->cmd_pool, tr->profile, forge__record_opt_fn, tr, &tr->opt_rec, &tr->err);
}

FORGE_API forge_status forge_trainer_create(forge_model *m, const forge_train_params *params, forge_trainer **out) {
    if (!out) return FORGE_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (!forge__model_ready(m)) return FORGE_ERR_INVALID_ARGUMENT;
    if (!forge__model_has_weights(m, "forge_trainer_create")) return FORGE_ERR_UNSUPPORTED;
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
        if ((st = forge__record(tr->m, tr->cmd_pool, tr->profile, forge__record_train_fn, &args, rc, &tr->err))) return st;
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
    if (stats) *stats = ts;
    return FORGE_OK;
}

FORGE_API forge_status forge_train_step(forge_trainer *tr, const forge_train_batch *b, forge_train_stats *stats) {
    if (!tr) return FORGE_ERR_INVALID_ARGUMENT;
    forge_status st = forge__slot_acquire(tr->m, &tr->err);
    if (st) return st;
    st = forge__train_step(tr, b, stats);
    forge__slot_release(tr->m);
    return st;
}

FORGE_API forge_status forge_train_eval(forge_trainer *tr, const forge_train_batch *b, double *loss, int64_t *tokens) {
    if (!tr || !loss) return FORGE_ERR_INVALID_ARGUMENT;
    forge_status st = forge__slot_acquire(tr->m, &tr->err);
    if (st) return st;
    uint32_t T;
    int64_t count;
    st = forge__train_fill(tr, b, &T, &count);
    if (!st) st = forge__train_run(tr, (uint32_t)b->n_seqs, T, false, count, loss);
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

FORGE_API forge_status forge_trainer_memory(const forge_trainer *tr, forge_memory_stats *st) {
    if (!tr || !st) return FORGE_ERR_INVALID_ARGUMENT;
    *st = (forge_memory_stats){tr->arena.bytes, tr->mem.planned, tr->mem.in_use, tr->mem.peak, tr->mem.n_buffers, tr->mem.n_allocations, 0, 0};
    return FORGE_OK;
}

FORGE_API forge_status forge_trainer_profile(const forge_trainer *tr, char *out, size_t capacity, size_t *len) {
    if (!tr || !len) return FORGE_ERR_INVALID_ARGUMENT;
    return forge__profile_json(&tr->prof, out, capacity, len);
}

/* =======================================================================================
 * 14. State
 * A session's state to a file and back (go-mlx's state bundles): the tokens it holds and the
 * rows of every layer's KV cache that continuing needs, so that a new session of the same
 * model goes on where the old one stopped, with the same logits. The file is safetensors:
 * "__metadata__" names the format, the model (a fingerprint of its config, its tensors'
 * headers and a few bytes of each, and the adapter's identity) and the layout; the tensors
 * are "tokens" I32 [n_past] and per layer l "layers.l.k" and "layers.l.v" F32 [rows, kv heads,
 * head_dim]: the keys (after RoPE) and values of the last `rows` positions in position order,
 * all n_past of them for full-attention layers, what the ring holds for sliding-window ones.
 * Reading goes through section 2's parser, and every field is checked against the model and
 * the session before anything is copied; writing goes to a temporary file beside the target,
 * renamed over it once complete and flushed. The same readback hands one layer's keys to the
 * caller (go-mlx's AttentionInspector), per KV head in HF's rotate-half convention.
 * ===================================================================================== */

#define FORGE__STATE_FORMAT "forge-state"
#define FORGE__STATE_VERSION 1
#define FORGE__FNV_BASIS 1469598103934665603ull
#define FORGE__STATE_STAGE_BYTES ((uint64_t)16 << 20) /* the staging buffer: at most this much, a layer at a time */

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

/* ---- The header ---- */

/* The KV rows state files hold of a layer: all n_past positions, or for a sliding-window layer
 * at least what continuing reads (positions n_past - window + 1 ..). */
static int forge__state_rows_needed(const forge__config *c, int layer, int n_past) {
    if (!c->layer_sliding[layer] || c->sliding_window <= 0) return n_past;
    return FORGE__MIN(n_past, c->sliding_window - 1);
}

/* The file's first bytes for a state of n_past tokens whose layer l holds rows[l] rows of K
 * and V in the session's type (f32, or F16 for kv_f16): the header length (u64,
 * little-endian), the JSON header padded with spaces to a multiple of 8.
 * malloc'd into *out (*size bytes). */
FORGE__INTERNAL forge_status forge__state_header(const forge_model *m, int n_ctx, int n_past, const int *rows, bool kv_f16, uint8_t **out,
                                                 size_t *size, forge__err *err) {
    const forge__config *c = &m->cfg;
    const uint64_t kv_row = forge__kv_row_bytes(c, 0, kv_f16);
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
    const uint8_t *k, *v;       /* [rows, kv heads, head_dim] f32, or f16 (forge__state.kv_f16) */
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
    /* the keys and values are all f32 or all f16, as the first layer's keys say */
    forge__tensor *k0 = st ? NULL : forge__tensor_find(&table, "layers.0.k");
    if (k0 && k0->dtype == FORGE__F16) out->kv_f16 = true;
    const forge__dtype kv_dtype = out->kv_f16 ? FORGE__F16 : FORGE__F32;
    const uint64_t kv_row = forge__kv_row_bytes(c, 0, out->kv_f16);
    for (int l = 0; !st && l < c->n_layers; l++) {
        int window = c->layer_sliding[l] ? c->sliding_window : 0;
        if (!forge__list_int(windows, l, &v) || v != window) {
            st = forge__fail(err, FORGE_ERR_FORMAT, "%s: __metadata__ layer_windows does not give layer %d's window %d", path, l, window);
            break;
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
                                 i ? ", as many rows as the keys" : "", l || i ? " (the type of layers.0.k)" : "");
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
    uint32_t rows_cap;          /* rows the stage holds */
    VkCommandBuffer cb;
} forge__state_io;

static forge_status forge__state_io_open(forge__state_io *io, forge_session *s, int most_rows, bool to_device) {
    forge__device *d = &s->m->dev;
    memset(io, 0, sizeof *io);
    io->s = s;
    io->kv_row = forge__kv_row_bytes(&s->m->cfg, 0, s->kv_f16);
    io->rows_cap = (uint32_t)FORGE__MAX(1, FORGE__MIN((uint64_t)most_rows, FORGE__STATE_STAGE_BYTES / io->kv_row));
    forge_status st = forge__buffer_create(d, io->rows_cap * io->kv_row, to_device ? d->caps.mem_upload : d->caps.mem_readback, true, &s->mem,
                                           &s->m->mem_total, &io->stage, &s->err);
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

/* Moves the K or V rows of positions [first, first + count) of one layer between its cache
 * (position p in slot p % slots) and the host: to `fp` (or with fp NULL, to `dst`) when
 * reading, from `src` when loading. */
static forge_status forge__state_rows(forge__state_io *io, forge__range cache, uint32_t slots, int first, int count, FILE *fp,
                                      uint8_t *dst, const uint8_t *src, const char *path) {
    while (count > 0) {
        uint32_t slot = (uint32_t)first % slots;
        uint32_t k = (uint32_t)FORGE__MIN((uint32_t)count, FORGE__MIN(slots - slot, io->rows_cap));
        uint64_t bytes = k * io->kv_row;
        forge_status st;
        if (src) {
            memcpy(io->stage.mapped, src, (size_t)bytes);
            src += bytes;
            st = forge__state_copy(io, cache, slot * io->kv_row, bytes, true);
        } else {
            st = forge__state_copy(io, cache, slot * io->kv_row, bytes, false);
            if (!st && !fp) {
                memcpy(dst, io->stage.mapped, (size_t)bytes);
                dst += bytes;
            } else if (!st && !forge__write_all(fp, io->stage.mapped, (size_t)bytes)) {
                st = forge__fail(&io->s->err, FORGE_ERR_IO, "%s: writing failed: %s", path, strerror(errno));
            }
        }
        if (st) return st;
        first += (int)k;
        count -= (int)k;
    }
    return FORGE_OK;
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

/* State files hold one row shape for every layer's keys and values (see forge.h). */
static forge_status forge__state_supported(forge_session *s) {
    if (forge__uniform_kv(&s->m->cfg)) return FORGE_OK;
    return forge__fail(&s->err, FORGE_ERR_UNSUPPORTED, "state files and key inspection are not supported for architecture %s: its layers "
                       "cache keys of different shapes or share caches", forge__arch_names[s->m->cfg.arch]);
}

static forge_status forge__session_save(forge_session *s, const char *path) {
    const forge__config *c = &s->m->cfg;
    const int n = s->n_past;
    if (forge__state_supported(s)) return FORGE_ERR_UNSUPPORTED;
    char tmp[4200];
    if (strlen(path) > 4096) return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "save: the path is longer than 4096 bytes");
    int *rows = (int *)malloc(sizeof(int) * (size_t)c->n_layers), most = 1;
    if (!rows) return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int l = 0; l < c->n_layers; l++) most = FORGE__MAX(most, rows[l] = n - forge__kv_first(s, l));
    uint8_t *header = NULL;
    size_t header_size = 0;
    forge__state_io io = {0};
    forge_status st = forge__state_header(s->m, s->n_ctx, n, rows, s->kv_f16, &header, &header_size, &s->err);
    if (!st) st = forge__state_io_open(&io, s, most, false);
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
        for (int kv = 0; kv < 2 && !st; kv++)
            st = forge__state_rows(&io, (kv ? s->vc : s->kc)[l], s->slots[l], n - rows[l], rows[l], fp, NULL, NULL, path);
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

/* n keys or values from f16 (src_f16) to f32 or the other way, on the host; src may be
 * unaligned (a state file's mapping). */
static void forge__kv_convert(const uint8_t *src, bool src_f16, uint8_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (src_f16) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            float f = forge__f16_to_f32(h);
            memcpy(dst + 4 * i, &f, 4);
        } else {
            float f;
            memcpy(&f, src + 4 * i, 4);
            uint16_t h = forge__f32_to_f16(f);
            memcpy(dst + 2 * i, &h, 2);
        }
    }
}

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
    const uint64_t file_row = forge__kv_row_bytes(c, 0, state->kv_f16);
    uint8_t *converted = NULL; /* a layer's rows in the session's type, where the file's differs */
    if (!st && state->kv_f16 != s->kv_f16 && !(converted = (uint8_t *)malloc((size_t)most * per_row * 4)))
        st = forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int l = 0; l < c->n_layers && !st; l++) {
        const forge__state_layer *sl = &state->layers[l];
        int keep = FORGE__MIN(sl->rows, (int)s->slots[l]); /* a smaller ring than the saving session's keeps the latest */
        uint64_t skip = (uint64_t)(sl->rows - keep) * file_row;
        for (int kv = 0; kv < 2 && !st; kv++) {
            const uint8_t *rows = (kv ? sl->v : sl->k) + skip;
            if (converted) {
                forge__kv_convert(rows, state->kv_f16, converted, (size_t)keep * per_row);
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
 * `llama` checkpoint's keys rotate adjacent pairs (its q/k rows are permuted, section 2); they
 * go back to HF's rotate-half order here: element k*half + i of a head is adjacent 2i + k. */
static forge_status forge__session_keys(forge_session *s, int l, int first, int rows, float *out) {
    const forge__config *c = &s->m->cfg;
    const int H = c->n_kv_heads, D = c->head_dim, half = D / 2;
    const size_t n = (size_t)rows * (size_t)H * (size_t)D;
    float *tmp = (float *)malloc(4 * n + (s->kv_f16 ? 2 * n : 0)); /* an f16 cache's rows land after the floats */
    if (!tmp) return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    uint8_t *raw = s->kv_f16 ? (uint8_t *)(tmp + n) : (uint8_t *)tmp;
    forge__state_io io;
    forge_status st = forge__state_io_open(&io, s, rows, false);
    if (!st) st = forge__state_rows(&io, s->kc[l], s->slots[l], first, rows, NULL, raw, NULL, NULL);
    forge__state_io_close(&io);
    if (!st && s->kv_f16) forge__kv_convert(raw, true, (uint8_t *)tmp, n);
    for (int h = 0; h < H && !st; h++)
        for (int r = 0; r < rows; r++) {
            const float *src = tmp + ((size_t)r * H + h) * D;
            float *dst = out + ((size_t)h * rows + r) * D;
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

FORGE_API forge_status forge_session_keys(forge_session *s, int layer, float *out, size_t capacity, forge_keys_info *info) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    const forge__config *c = &s->m->cfg;
    if (!info) return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "forge_session_keys: no info");
    if (layer < 0 || layer >= c->n_layers)
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "forge_session_keys: layer %d is outside the model's layers 0..%d", layer,
                           c->n_layers - 1);
    if (forge__state_supported(s)) return FORGE_ERR_UNSUPPORTED;
    const int first = forge__kv_first(s, layer), rows = s->n_past - first;
    memset(info, 0, sizeof *info);
    info->n_layers = c->n_layers;
    info->n_kv_heads = c->n_kv_heads;
    info->head_dim = c->head_dim;
    info->first = first;
    info->n_rows = rows;
    info->window = c->layer_sliding[layer] ? c->sliding_window : 0;
    info->n_floats = (size_t)c->n_kv_heads * (size_t)rows * (size_t)c->head_dim;
    if (!out) return FORGE_OK;
    if (capacity < info->n_floats)
        return forge__fail(&s->err, FORGE_ERR_BUFFER_TOO_SMALL, "forge_session_keys: layer %d's keys need %zu floats; the buffer holds %zu", layer,
                           info->n_floats, capacity);
    if (!rows) return FORGE_OK;
    forge_status st = forge__slot_acquire(s->m, &s->err);
    if (st) return st;
    st = forge__session_keys(s, layer, first, rows, out);
    forge__slot_release(s->m);
    return st;
}
