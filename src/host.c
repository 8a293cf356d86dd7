/* src/host.c: Host products on CPU devices.
 * Owns: the host twins of one-token matvec_sg products (forge__host_op), the worker pool that
 * runs them, and a recording's host segments (forge__host_seq: the command buffers between
 * them).
 * May call: base.c, device.c, ops.c.
 *
 * Why: on a CPU device (lavapipe) the decode step's matrix-vector products are the code LLVM
 * makes of kernels/matvec_sg.comp, which streamed 0.4-0.7 GB/s of weights on this project's
 * 2-core machine against 28 GB/s for llama.cpp's CPU backend (bench/RESULTS.md, issue 40). The
 * device's memory is host memory there, so a product can run in C on the same buffers between
 * two submissions. A recording made with host products (forge__record_host) is a chain of
 * command buffers: each but the last ends where a product would be dispatched, with a barrier
 * that makes its writes visible to the host; replaying it (forge__host_seq_run) submits one,
 * waits, runs the product on the pool, and goes on. The twin reads the weights as stored
 * (kernels/weights.glsl's formats F32, F16, BF16, Q4_0, Q8_0), takes the activations in f32
 * as the kernel does (the parity tests hold CPU devices at 1e-4), and ends with the kernel's
 * epilogue (kernels/linear_out.glsl: bias, soft-cap, accumulate; PRENORM and GATED as
 * matvec_sg). Anything else (other formats, several tokens, the experts' mapping, the POST_ADD
 * and paired modules) stays on the kernel.
 */

/* Product weights of at least this many bytes run on the host: under it a product is cheaper
 * as a dispatch inside the command buffer than as a segment boundary (a submit and a wait).
 * forge_model.host_min_bytes; tests lower it to 0 to run every product on the host. */
#define FORGE__HOST_MIN_BYTES (256u << 10)
#define FORGE__HOST_MAX_THREADS 16

/* ---- The worker pool: the calling thread and n - 1 workers split each product's outputs ---- */

typedef void (*forge__host_job)(void *ctx, uint32_t part, uint32_t n_parts);

typedef struct forge__host_pool forge__host_pool;
typedef struct forge__host_worker_arg {
    forge__host_pool *pool;
    uint32_t part;
} forge__host_worker_arg;

struct forge__host_pool {
    pthread_mutex_t lock, run_lock; /* run_lock: one product at a time (sessions may share the model) */
    pthread_cond_t go, done;
    pthread_t threads[FORGE__HOST_MAX_THREADS];
    uint32_t n_threads;             /* workers + the caller */
    uint64_t generation;            /* bumped per job */
    uint32_t n_done;
    bool quit;
    forge__host_job job;
    void *ctx;
    forge__host_worker_arg args[FORGE__HOST_MAX_THREADS];
};

static void *forge__host_worker(void *arg) {
    forge__host_pool *p = ((forge__host_worker_arg *)arg)->pool;
    uint32_t part = ((forge__host_worker_arg *)arg)->part;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (p->generation == seen && !p->quit) pthread_cond_wait(&p->go, &p->lock);
        if (p->quit) break;
        seen = p->generation;
        forge__host_job job = p->job;
        void *ctx = p->ctx;
        pthread_mutex_unlock(&p->lock);
        job(ctx, part, p->n_threads);
        pthread_mutex_lock(&p->lock);
        if (++p->n_done == p->n_threads - 1) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* A pool of `n_threads` (the caller included; 0: the online CPUs, at most
 * FORGE__HOST_MAX_THREADS); where threads cannot be started the caller runs their parts. The
 * pool must stay where it is while it lives (workers hold its address). */
static void forge__host_pool_init(forge__host_pool *p, uint32_t n_threads) {
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->lock, NULL);
    pthread_mutex_init(&p->run_lock, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    if (!n_threads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (uint32_t)n : 1u;
    }
    n_threads = FORGE__MIN(n_threads, (uint32_t)FORGE__HOST_MAX_THREADS);
    p->n_threads = 1;
    for (uint32_t i = 1; i < n_threads; i++) {
        p->args[i] = (forge__host_worker_arg){p, i};
        if (pthread_create(&p->threads[i], NULL, forge__host_worker, &p->args[i])) break;
        p->n_threads++;
    }
}

static void forge__host_pool_destroy(forge__host_pool *p) {
    if (!p->n_threads) return;
    pthread_mutex_lock(&p->lock);
    p->quit = true;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->lock);
    for (uint32_t i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->lock);
    pthread_mutex_destroy(&p->run_lock);
    memset(p, 0, sizeof *p);
}

/* Runs job(ctx, part, n) for every part on the pool and returns when all are done. */
static void forge__host_pool_run(forge__host_pool *p, forge__host_job job, void *ctx) {
    pthread_mutex_lock(&p->run_lock);
    if (p->n_threads > 1) {
        pthread_mutex_lock(&p->lock);
        p->job = job;
        p->ctx = ctx;
        p->n_done = 0;
        p->generation++;
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->lock);
    }
    job(ctx, 0, p->n_threads);
    if (p->n_threads > 1) {
        pthread_mutex_lock(&p->lock);
        while (p->n_done < p->n_threads - 1) pthread_cond_wait(&p->done, &p->lock);
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_unlock(&p->run_lock);
}

/* ---- One product: C[c_col0 + n] (+)= epilogue(sum_k A'[k] W[n, k]) ---- */

typedef struct forge__host_op {
    forge__wfmt fmt;
    forge__pc_linear pc;      /* as the kernel would have had it (M = 1) */
    const float *a;           /* A's row a_row0 [K] */
    const uint8_t *w;         /* the chunk [rows, K] in its format */
    float *c;                 /* C's row 0 [ldc] */
    const float *bias;        /* [bias_off + N], or NULL */
    const float *g;           /* PRENORM's norm weight [K], or NULL */
    uint64_t xn;              /* where A' [K] (normed or not) goes in the recording's scratch, in floats */
} forge__host_op;

/* bytes of one weight row of K elements in a format */
static uint64_t forge__host_row_bytes(forge__wfmt f, uint32_t K) {
    switch (f) {
    case FORGE__W_F32: return 4ull * K;
    case FORGE__W_F16: case FORGE__W_BF16: return 2ull * K;
    case FORGE__W_Q4_0: return (uint64_t)K / 32 * 18;
    case FORGE__W_Q8_0: return (uint64_t)K / 32 * 34;
    default: return 0;
    }
}

static inline float forge__host_half(const uint8_t *p) { return forge__f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

/* The dot products, a portable form and (x86-64) one in AVX2 + FMA + F16C, chosen at run time. */
static float forge__host_dot_plain(forge__wfmt f, const uint8_t *w, const float *x, uint32_t K) {
    float s[8] = {0};
    switch (f) {
    case FORGE__W_F32: {
        const float *r = (const float *)w;
        uint32_t k = 0;
        for (; k + 8 <= K; k += 8)
            for (int j = 0; j < 8; j++) s[j] += r[k + j] * x[k + j];
        for (; k < K; k++) s[0] += r[k] * x[k];
        break;
    }
    case FORGE__W_F16: case FORGE__W_BF16:
        for (uint32_t k = 0; k < K; k++) {
            uint16_t h = (uint16_t)(w[2 * k] | (w[2 * k + 1] << 8));
            s[k & 7] += (f == FORGE__W_F16 ? forge__f16_to_f32(h) : forge__bf16_to_f32(h)) * x[k];
        }
        break;
    case FORGE__W_Q4_0:
        for (uint32_t b = 0; b < K / 32; b++, w += 18) {
            float d = forge__host_half(w), t = 0;
            for (int j = 0; j < 16; j++) t += (float)((w[2 + j] & 15) - 8) * x[32 * b + j] + (float)((w[2 + j] >> 4) - 8) * x[32 * b + 16 + j];
            s[b & 7] += d * t;
        }
        break;
    case FORGE__W_Q8_0:
        for (uint32_t b = 0; b < K / 32; b++, w += 34) {
            float d = forge__host_half(w), t = 0;
            for (int j = 0; j < 32; j++) t += (float)(int8_t)w[2 + j] * x[32 * b + j];
            s[b & 7] += d * t;
        }
        break;
    default: break;
    }
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FORGE__HOST_AVX2 1
__attribute__((target("avx2,fma,f16c"))) static float forge__host_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* 8 bytes (unsigned) to 8 floats */
__attribute__((target("avx2,fma,f16c"))) static inline __m256 forge__host_u8x8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }
__attribute__((target("avx2,fma,f16c"))) static inline __m256 forge__host_i8x8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

__attribute__((target("avx2,fma,f16c"))) static float forge__host_dot_avx2(forge__wfmt f, const uint8_t *w, const float *x, uint32_t K) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    uint32_t k = 0;
    switch (f) {
    case FORGE__W_F32: {
        const float *r = (const float *)w;
        for (; k + 32 <= K; k += 32) {
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(r + k), _mm256_loadu_ps(x + k), s0);
            s1 = _mm256_fmadd_ps(_mm256_loadu_ps(r + k + 8), _mm256_loadu_ps(x + k + 8), s1);
            s2 = _mm256_fmadd_ps(_mm256_loadu_ps(r + k + 16), _mm256_loadu_ps(x + k + 16), s2);
            s3 = _mm256_fmadd_ps(_mm256_loadu_ps(r + k + 24), _mm256_loadu_ps(x + k + 24), s3);
        }
        for (; k + 8 <= K; k += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(r + k), _mm256_loadu_ps(x + k), s0);
        break;
    }
    case FORGE__W_F16:
        for (; k + 16 <= K; k += 16) {
            __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * k)));
            __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * k + 16)));
            s0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + k), s0);
            s1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + k + 8), s1);
        }
        break;
    case FORGE__W_BF16:
        for (; k + 8 <= K; k += 8) {
            __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + 2 * k))), 16);
            s0 = _mm256_fmadd_ps(_mm256_castsi256_ps(u), _mm256_loadu_ps(x + k), s0);
        }
        break;
    case FORGE__W_Q4_0: {
        const __m256 eight = _mm256_set1_ps(8.0f);
        const __m128i lo4 = _mm_set1_epi8(15);
        for (uint32_t b = 0; b < K / 32; b++, w += 18) {
            __m256 d = _mm256_set1_ps(forge__host_half(w));
            __m128i q = _mm_loadu_si128((const __m128i *)(w + 2)), lo = _mm_and_si128(q, lo4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), lo4);
            const float *xb = x + 32 * b;
            __m256 t = _mm256_mul_ps(_mm256_sub_ps(forge__host_u8x8(lo), eight), _mm256_loadu_ps(xb));
            t = _mm256_fmadd_ps(_mm256_sub_ps(forge__host_u8x8(_mm_srli_si128(lo, 8)), eight), _mm256_loadu_ps(xb + 8), t);
            t = _mm256_fmadd_ps(_mm256_sub_ps(forge__host_u8x8(hi), eight), _mm256_loadu_ps(xb + 16), t);
            t = _mm256_fmadd_ps(_mm256_sub_ps(forge__host_u8x8(_mm_srli_si128(hi, 8)), eight), _mm256_loadu_ps(xb + 24), t);
            if (b & 1) s1 = _mm256_fmadd_ps(d, t, s1);
            else s0 = _mm256_fmadd_ps(d, t, s0);
        }
        k = K;
        break;
    }
    case FORGE__W_Q8_0:
        for (uint32_t b = 0; b < K / 32; b++, w += 34) {
            __m256 d = _mm256_set1_ps(forge__host_half(w));
            __m128i q0 = _mm_loadu_si128((const __m128i *)(w + 2)), q1 = _mm_loadu_si128((const __m128i *)(w + 18));
            const float *xb = x + 32 * b;
            __m256 t = _mm256_mul_ps(forge__host_i8x8(q0), _mm256_loadu_ps(xb));
            t = _mm256_fmadd_ps(forge__host_i8x8(_mm_srli_si128(q0, 8)), _mm256_loadu_ps(xb + 8), t);
            t = _mm256_fmadd_ps(forge__host_i8x8(q1), _mm256_loadu_ps(xb + 16), t);
            t = _mm256_fmadd_ps(forge__host_i8x8(_mm_srli_si128(q1, 8)), _mm256_loadu_ps(xb + 24), t);
            if (b & 1) s1 = _mm256_fmadd_ps(d, t, s1);
            else s0 = _mm256_fmadd_ps(d, t, s0);
        }
        k = K;
        break;
    default: break;
    }
    float s = forge__host_hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    if (k < K) s += forge__host_dot_plain(f, w + forge__host_row_bytes(f, k), x + k, K - k); /* plain formats' tail */
    return s;
}
#endif

typedef float (*forge__host_dot_fn)(forge__wfmt f, const uint8_t *w, const float *x, uint32_t K);

static forge__host_dot_fn forge__host_dot_choose(void) {
#ifdef FORGE__HOST_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return forge__host_dot_avx2;
#endif
    return forge__host_dot_plain;
}

static float forge__host_act(float x, bool gelu) {
    if (!gelu) return x / (1.0f + expf(-x));
    const float k = 0.7978845608028654f;
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

typedef struct forge__host_job_ctx {
    const forge__host_op *op;
    const float *xn;
    forge__host_dot_fn dot;
} forge__host_job_ctx;

/* Outputs part * N / n_parts .. of the product (blocks of 8, so parts never share a cache line of C) */
static void forge__host_op_part(void *ctx, uint32_t part, uint32_t n_parts) {
    const forge__host_job_ctx *j = (const forge__host_job_ctx *)ctx;
    const forge__host_op *o = j->op;
    const forge__pc_linear *pc = &o->pc;
    uint32_t N = pc->N, K = pc->K, blocks = (N + 7) / 8;
    uint32_t n0 = (uint32_t)((uint64_t)blocks * part / n_parts) * 8, n1 = FORGE__MIN((uint32_t)((uint64_t)blocks * (part + 1) / n_parts) * 8, N);
    bool gated = pc->flags & FORGE__LINEAR_GATED, gelu = pc->flags & FORGE__LINEAR_GELU;
    uint64_t rb = forge__host_row_bytes(o->fmt, K);
    for (uint32_t n = n0; n < n1; n++) {
        float v;
        if (gated) {
            float g = j->dot(o->fmt, o->w + rb * 2 * n, j->xn, K), u = j->dot(o->fmt, o->w + rb * (2 * n + 1), j->xn, K);
            v = forge__host_act(g, gelu) * u;
        } else {
            v = j->dot(o->fmt, o->w + rb * n, j->xn, K);
        }
        if (pc->flags & FORGE__LINEAR_BIAS) v += o->bias[pc->bias_off + n];
        if (pc->flags & FORGE__LINEAR_SOFTCAP) v = tanhf(v / pc->softcap) * pc->softcap;
        float *c = &o->c[pc->c_col0 + n];
        if (pc->flags & FORGE__LINEAR_ACCUMULATE) v += *c;
        *c = v;
    }
}

/* Runs one product on the pool. PRENORM's sum of squares is taken in double (the kernel's in
 * f32 subgroup sums: the two agree to rounding). */
static void forge__host_op_run(const forge__host_op *o, float *xn, forge__host_pool *pool) {
    static forge__host_dot_fn dot;
    if (!dot) dot = forge__host_dot_choose(); /* idempotent: a race writes the same pointer */
    const forge__pc_linear *pc = &o->pc;
    if (pc->flags & FORGE__LINEAR_PRENORM) {
        double ss = 0;
        for (uint32_t k = 0; k < pc->K; k++) ss += (double)o->a[k] * o->a[k];
        float inv = 1.0f / sqrtf((float)(ss / pc->K) + pc->eps);
        for (uint32_t k = 0; k < pc->K; k++) xn[k] = o->a[k] * inv * o->g[k];
    } else {
        memcpy(xn, o->a, 4ull * pc->K);
    }
    forge__host_job_ctx j = {o, xn, dot};
    forge__host_pool_run(pool, forge__host_op_part, &j);
}

/* ---- A recording's host segments ---- */

/* The buffers a twin may read and write: the model's blocks (weights, norms, biases) and the
 * session's (activations), mapped (the device's memory is the host's). */
typedef struct forge__host_bufs {
    const forge__buffer *sets[2];
    int counts[2];
} forge__host_bufs;

/* cbs[0] is the recording's cb; cbs[i + 1] runs after ops[i]. */
typedef struct forge__host_seq {
    VkCommandBuffer *cbs;
    forge__host_op *ops;
    uint32_t n_ops, cap;
    float *scratch;               /* the ops' A' rows (forge__host_op.xn), malloc'd */
    uint64_t scratch_floats;
} forge__host_seq;

static void forge__host_seq_free(forge__device *d, VkCommandPool pool, forge__host_seq *q) {
    for (uint32_t i = 1; i <= q->n_ops; i++)
        if (q->cbs && q->cbs[i]) d->vk.vkFreeCommandBuffers(d->dev, pool, 1, &q->cbs[i]);
    free(q->cbs);
    free(q->ops);
    free(q->scratch);
    memset(q, 0, sizeof *q);
}

/* The host address of `bytes` at range r's offset + at, or NULL when r is not in a mapped block
 * or too short. */
static void *forge__host_addr(const forge__host_bufs *hb, forge__range r, uint64_t at, uint64_t bytes) {
    if (at + bytes > r.size) return NULL;
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < hb->counts[s]; i++) {
            const forge__buffer *b = &hb->sets[s][i];
            if (b->buf == r.buf) return b->mapped && r.offset + at + bytes <= b->size ? (uint8_t *)b->mapped + r.offset + at : NULL;
        }
    return NULL;
}

/* Whether dispatch (op, binds, push) has a host twin, and if so its op with host addresses. */
static bool forge__host_op_of(const forge__host_bufs *hb, uint64_t min_bytes, forge__op op, const forge__range *binds, const void *push,
                              forge__host_op *out) {
    if (op < FORGE__OP_MATVEC_SG || op >= FORGE__OP_MATVEC_SG + FORGE__W_COUNT) return false;
    forge__wfmt f = (forge__wfmt)(op - FORGE__OP_MATVEC_SG);
    const forge__pc_linear *pc = (const forge__pc_linear *)push;
    const uint32_t allowed = FORGE__LINEAR_BIAS | FORGE__LINEAR_ACCUMULATE | FORGE__LINEAR_SOFTCAP | FORGE__LINEAR_PRENORM |
                             FORGE__LINEAR_GATED | FORGE__LINEAR_GELU;
    if (pc->M != 1 || (pc->flags & ~allowed) || !pc->K || !pc->N || !forge__host_row_bytes(f, pc->K)) return false;
    if ((f == FORGE__W_Q4_0 || f == FORGE__W_Q8_0) && pc->K % 32) return false;
    uint64_t rows = pc->flags & FORGE__LINEAR_GATED ? 2ull * pc->N : pc->N, wbytes = rows * forge__host_row_bytes(f, pc->K);
    if (wbytes < min_bytes) return false;
    memset(out, 0, sizeof *out);
    out->fmt = f;
    out->pc = *pc;
    out->a = (const float *)forge__host_addr(hb, binds[0], 4ull * pc->a_row0 * pc->K, 4ull * pc->K);
    out->w = (const uint8_t *)forge__host_addr(hb, binds[1], 0, wbytes);
    out->c = (float *)forge__host_addr(hb, binds[2], 0, 4ull * (pc->c_col0 + pc->N));
    if (pc->flags & FORGE__LINEAR_BIAS) out->bias = (const float *)forge__host_addr(hb, binds[3], 0, 4ull * (pc->bias_off + pc->N));
    if (pc->flags & FORGE__LINEAR_PRENORM) out->g = (const float *)forge__host_addr(hb, binds[6], 0, 4ull * pc->K);
    return out->a && out->w && out->c && (out->bias || !(pc->flags & FORGE__LINEAR_BIAS)) && (out->g || !(pc->flags & FORGE__LINEAR_PRENORM));
}

/* Ends the recording's current command buffer where `o` runs and begins the next one. */
static forge_status forge__host_seq_cut(forge__rec *r, forge__host_seq *q, VkCommandPool pool, const forge__host_op *o) {
    forge__device *d = r->dev;
    if (q->n_ops + 2 > q->cap) {
        uint32_t cap = q->cap ? 2 * q->cap : 64;
        VkCommandBuffer *cbs = (VkCommandBuffer *)realloc(q->cbs, sizeof *cbs * cap);
        if (cbs) q->cbs = cbs;
        forge__host_op *ops = (forge__host_op *)realloc(q->ops, sizeof *ops * cap);
        if (ops) q->ops = ops;
        if (!cbs || !ops) return forge__fail(r->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        if (!q->cap) q->cbs[0] = r->cb;
        q->cap = cap;
    }
    float *scratch = (float *)realloc(q->scratch, 4 * (q->scratch_floats + o->pc.K));
    if (!scratch) return forge__fail(r->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    q->scratch = scratch;
    /* the kernels' writes so far, visible to the host and to the next command buffers */
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_HOST_READ_BIT | VK_ACCESS_HOST_WRITE_BIT | VK_ACCESS_SHADER_READ_BIT |
                                           VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT};
    d->vk.vkCmdPipelineBarrier(r->cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                               VK_PIPELINE_STAGE_HOST_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb,
                               0, NULL, 0, NULL);
    d->vk.vkEndCommandBuffer(r->cb);
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    VkCommandBuffer cb;
    if (d->vk.vkAllocateCommandBuffers(d->dev, &cai, &cb) != VK_SUCCESS) return forge__fail(r->err, FORGE_ERR_DEVICE, "vkAllocateCommandBuffers failed");
    q->ops[q->n_ops] = *o;
    q->ops[q->n_ops].xn = q->scratch_floats;
    q->scratch_floats += o->pc.K;
    q->cbs[++q->n_ops] = cb;
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    d->vk.vkBeginCommandBuffer(cb, &bi);
    r->cb = cb;
    r->fenced = true; /* everything before is complete, and host writes are visible to the next submission */
    return FORGE_OK;
}

/* Replays a recording with host segments: each command buffer, then the product after it. */
static forge_status forge__host_seq_run(forge__device *d, const forge__host_seq *q, VkFence fence, forge__host_pool *pool, forge__err *err) {
    for (uint32_t i = 0; i <= q->n_ops; i++) {
        forge_status st = forge__submit_wait(d, q->cbs[i], fence, err);
        if (st) return st;
        if (i < q->n_ops) forge__host_op_run(&q->ops[i], q->scratch + q->ops[i].xn, pool);
    }
    return FORGE_OK;
}

/* What forge__record hands the recorder when a recording may run products on the host. */
typedef struct forge__host_rec {
    forge__host_bufs bufs;
    forge__host_seq *seq;
    VkCommandPool pool;
    uint64_t min_bytes;
} forge__host_rec;

/* forge__rec.host_take: a product with a host twin becomes a segment boundary (counted like a
 * dispatch, so a profiled recording's timestamp after it times the product and its submit). */
static bool forge__host_take(forge__rec *r, forge__op op, const forge__range *binds, const void *push) {
    forge__host_rec *h = (forge__host_rec *)r->host_ctx;
    forge__host_op o;
    if (!forge__host_op_of(&h->bufs, h->min_bytes, op, binds, push, &o)) return false;
    r->n_dispatches++;
    if (r->counting) return true;
    if ((r->st = forge__host_seq_cut(r, h->seq, h->pool, &o))) return true;
    forge__note_dispatch(r, op, push, 1, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT);
    return true;
}
