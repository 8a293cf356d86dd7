/* src/host.c: Host products on CPU devices.
 * Owns: the host twins of matvec_sg's one-token products and of matmul's several-row ones
 * (forge__host_op), their activations rounded to int8, the worker pool that runs them, and a
 * recording's host segments (forge__host_seq: the command buffers between them).
 * May call: base.c, device.c, ops.c.
 *
 * Why: on a CPU device (lavapipe) the decode step's matrix-vector products are the code LLVM
 * makes of kernels/matvec_sg.comp, which streamed 0.4-0.7 GB/s of weights on this project's
 * 2-core machine against 28 GB/s for llama.cpp's CPU backend (bench/RESULTS.md, issue 40). The
 * device's memory is host memory there, so a product can run in C on the same buffers between
 * two submissions. A recording made with host products (forge__record given the mapped
 * buffers) is a chain of command buffers: each but the last ends where a product would be
 * dispatched, with a barrier that makes its writes visible to the host; replaying it
 * (forge__host_seq_run) submits one, waits, runs the products that follow it on the pool (those
 * with nothing recorded between them share a submission), and goes on. The twin reads the weights as stored
 * (kernels/weights.glsl's formats F32, F16, BF16, Q4_0, Q8_0) and ends with the kernel's
 * epilogue (kernels/linear_out.glsl: bias, soft-cap, accumulate; PRENORM and GATED as
 * matvec_sg). Its activations are f32 as the kernels' are (the parity tests hold CPU devices at
 * 1e-4), except that a model not loaded `exact` rounds them to int8 a block of 32 for Q4_0 and
 * Q8_0 weights (forge_model.host_q8), as GPUs' matvec_q8a and llama.cpp's CPU products do:
 * then a block's products are integer sums (AVX2's 32 byte lanes): on the Llama-3.2-1B shape
 * in Q4_0, prefill 2.0 x and decode 2.9 x the f32 form's (bench/RESULTS.md).
 * A row's result does not depend on how many rows the product has (each row is summed in the
 * same order), so a prompt's products, a one-token step's and a verification's agree. Anything
 * else (other formats, the experts' mapping, the POST_ADD and paired modules, matmul's split
 * along k) stays on the kernel.
 */

/* Product weights of at least this many bytes run on the host: under it a product is cheaper
 * as a dispatch inside the command buffer than as a segment boundary (a submit and a wait).
 * forge_model.host_min_bytes; tests lower it to 0 to run every product on the host. */
#define FORGE__HOST_MIN_BYTES (256u << 10)
#define FORGE__HOST_MAX_THREADS 16

/* ---- One product: C[m, c_col0 + n] (+)= epilogue(sum_k A'[m, k] W[n, k]) for M rows ---- */

typedef struct forge__host_op {
    forge__wfmt fmt;
    forge__pc_linear pc;      /* as the kernel would have had it */
    bool q8;                  /* A rounded to int8 blocks of 32 (Q4_0 / Q8_0 weights, forge_model.host_q8) */
    const float *a;           /* A's rows a_row0 .. a_row0 + M - 1 [M, K] */
    const uint8_t *w;         /* the chunk [rows, K] in its format */
    float *c;                 /* C's row 0 [*, ldc] */
    const float *bias;        /* [bias_off + N], or NULL */
    const float *g;           /* PRENORM's norm weight [K] (M = 1), or NULL */
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
            __m256 d = _mm256_set1_ps(_cvtsh_ss((uint16_t)(w[0] | (w[1] << 8))));
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
            __m256 d = _mm256_set1_ps(_cvtsh_ss((uint16_t)(w[0] | (w[1] << 8))));
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

/* ---- int8 activations: a row's blocks of 32 as codes and a scale, as act_q8.comp rounds them ---- */

/* Rows of x [rows, K] (K a multiple of 32) into codes q [rows, K] and scales d [rows, K / 32]:
 * q = round(v * 127 / amax), d = amax / 127, amax the block's largest |v|. */
static void forge__host_quantize(const float *x, uint64_t rows, uint32_t K, int8_t *q, float *d) {
    for (uint64_t blk = 0; blk < rows * (K / 32); blk++) {
        const float *v = x + 32 * blk;
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(v[j]));
        float id = amax > 0 ? 127.0f / amax : 0.0f;
        d[blk] = amax / 127.0f;
        for (int j = 0; j < 32; j++) q[32 * blk + j] = (int8_t)roundf(v[j] * id);
    }
}

/* A weight row of Q4_0 / Q8_0 blocks against R rows of int8 activations (row r's codes at
 * xq + r K, its scales at xd + r K / 32): out[r] = sum over blocks of dw dx (integer sum of the
 * codes' products). Each row is summed in the same order whatever R is. */
typedef void (*forge__host_dot_q8_fn)(forge__wfmt f, const uint8_t *w, const int8_t *xq, const float *xd, uint32_t K, uint32_t R, float *out);

#define FORGE__HOST_ROWS 4 /* activation rows a weight row is read for at once */

static void forge__host_dot_q8_plain(forge__wfmt f, const uint8_t *w, const int8_t *xq, const float *xd, uint32_t K, uint32_t R, float *out) {
    uint32_t nb = K / 32, bs = f == FORGE__W_Q4_0 ? 18 : 34;
    for (uint32_t r = 0; r < R; r++) {
        const int8_t *x = xq + (uint64_t)r * K;
        const float *dx = xd + (uint64_t)r * nb;
        const uint8_t *wb = w;
        float s[8] = {0};
        for (uint32_t b = 0; b < nb; b++, wb += bs) {
            int32_t t = 0;
            if (f == FORGE__W_Q4_0)
                for (int j = 0; j < 16; j++) t += ((wb[2 + j] & 15) - 8) * x[32 * b + j] + ((wb[2 + j] >> 4) - 8) * x[32 * b + 16 + j];
            else
                for (int j = 0; j < 32; j++) t += (int8_t)wb[2 + j] * x[32 * b + j];
            s[b & 7] += (float)t * (forge__host_half(wb) * dx[b]);
        }
        out[r] = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    }
}

#ifdef FORGE__HOST_AVX2
/* A block's 32 codes as signed bytes in element order (Q4_0: the low nibbles are elements 0-15,
 * the high ones 16-31, each minus 8) */
__attribute__((target("avx2,fma,f16c"))) static inline __m256i forge__host_codes(forge__wfmt f, const uint8_t *wb) {
    if (f == FORGE__W_Q8_0) return _mm256_loadu_si256((const __m256i *)(wb + 2));
    __m128i q = _mm_loadu_si128((const __m128i *)(wb + 2));
    __m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(15));
    return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
}

/* One block of a weight row against R rows: |w| times x with w's signs (maddubs takes an
 * unsigned and a signed operand; |-128| reads as 128), pairs to int16, quads to int32 lanes,
 * then to float times dw dx into acc[r] */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void forge__host_q8_block(forge__wfmt f, const uint8_t *wb, const int8_t *xq,
                                                                                             const float *xd, uint32_t K, uint32_t b, uint32_t R,
                                                                                             __m256 *acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i wq = forge__host_codes(f, wb), aw = _mm256_sign_epi8(wq, wq);
    float dw = _cvtsh_ss((uint16_t)(wb[0] | (wb[1] << 8)));
    for (uint32_t r = 0; r < R; r++) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(xq + (uint64_t)r * K + 32 * b));
        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, wq)), ones);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * xd[(uint64_t)r * (K / 32) + b]), acc[r]);
    }
}

/* R rows (a constant where inlined), two accumulators a row: even blocks and odd ones. The
 * weights are prefetched FORGE__HOST_PREFETCH blocks ahead (into the next row past a row's
 * end): lavapipe's device memory is shared memory in 4 KiB pages, where the hardware's
 * prefetchers stop at every page. */
#ifndef FORGE__HOST_PREFETCH
#define FORGE__HOST_PREFETCH 128
#endif
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void forge__host_dot_q8_avx2_r(forge__wfmt f, const uint8_t *w, const int8_t *xq,
                                                                                                  const float *xd, uint32_t K, uint32_t R, float *out) {
    __m256 even[FORGE__HOST_ROWS], odd[FORGE__HOST_ROWS];
    for (uint32_t r = 0; r < R; r++) even[r] = odd[r] = _mm256_setzero_ps();
    uint32_t nb = K / 32, bs = f == FORGE__W_Q4_0 ? 18 : 34, b = 0;
    for (; b + 2 <= nb; b += 2) {
        _mm_prefetch((const char *)(w + (uint64_t)(b + FORGE__HOST_PREFETCH) * bs), _MM_HINT_T0);
        forge__host_q8_block(f, w + (uint64_t)b * bs, xq, xd, K, b, R, even);
        forge__host_q8_block(f, w + (uint64_t)(b + 1) * bs, xq, xd, K, b + 1, R, odd);
    }
    if (b < nb) forge__host_q8_block(f, w + (uint64_t)b * bs, xq, xd, K, b, R, even);
    for (uint32_t r = 0; r < R; r++) out[r] = forge__host_hsum(_mm256_add_ps(even[r], odd[r]));
}

__attribute__((target("avx2,fma,f16c"))) static void forge__host_dot_q8_avx2(forge__wfmt f, const uint8_t *w, const int8_t *xq, const float *xd, uint32_t K,
                                                                              uint32_t R, float *out) {
    switch (R) {
    case 4: forge__host_dot_q8_avx2_r(f, w, xq, xd, K, 4, out); break;
    case 3: forge__host_dot_q8_avx2_r(f, w, xq, xd, K, 3, out); break;
    case 2: forge__host_dot_q8_avx2_r(f, w, xq, xd, K, 2, out); break;
    default: forge__host_dot_q8_avx2_r(f, w, xq, xd, K, 1, out); break;
    }
}
#endif

/* The dot product forms this CPU runs, chosen once (forge__host_pool_init) */
typedef struct forge__host_dots {
    forge__host_dot_fn f32;
    forge__host_dot_q8_fn q8;
} forge__host_dots;

static forge__host_dots forge__host_dots_choose(void) {
#ifdef FORGE__HOST_AVX2
    __builtin_cpu_init();
    /* (every CPU with AVX2 and FMA has F16C; clang's builtin does not know "f16c") */
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return (forge__host_dots){forge__host_dot_avx2, forge__host_dot_q8_avx2};
#endif
    return (forge__host_dots){forge__host_dot_plain, forge__host_dot_q8_plain};
}

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
    uint64_t generation;            /* bumped per job (under lock; spinning threads read it atomically) */
    uint64_t n_done;                /* workers done with the job (likewise) */
    bool quit;
    forge__host_job job;
    void *ctx;
    forge__host_worker_arg args[FORGE__HOST_MAX_THREADS];
    forge__host_dots dots;          /* the dot product forms this CPU runs */
};

/* How long a pool thread spins for the next step before it sleeps: a decode step's products come
 * tens of microseconds apart, and waking a sleeping thread costs about that much (more in a VM) */
#define FORGE__HOST_SPIN_S 100e-6

/* Spins until *v differs from `value` (changed) or equals it (!changed), at most FORGE__HOST_SPIN_S */
static void forge__host_spin(const uint64_t *v, uint64_t value, bool changed) {
    double t0 = 0;
    for (uint32_t i = 1; (__atomic_load_n(v, __ATOMIC_ACQUIRE) == value) == changed; i++) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        if (i % 64) continue;
        double t = forge__now_s();
        if (!t0) t0 = t;
        else if (t - t0 > FORGE__HOST_SPIN_S) return;
    }
}

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
        if (__atomic_add_fetch(&p->n_done, 1, __ATOMIC_RELEASE) == p->n_threads - 1) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->lock);
        forge__host_spin(&p->generation, seen, true);
        pthread_mutex_lock(&p->lock);
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
    p->dots = forge__host_dots_choose();
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
        __atomic_store_n(&p->n_done, 0, __ATOMIC_RELAXED);
        __atomic_add_fetch(&p->generation, 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->lock);
    }
    job(ctx, 0, p->n_threads);
    if (p->n_threads > 1) {
        forge__host_spin(&p->n_done, p->n_threads - 1, false);
        pthread_mutex_lock(&p->lock);
        while (p->n_done < p->n_threads - 1) pthread_cond_wait(&p->done, &p->lock);
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_unlock(&p->run_lock);
}

static float forge__host_act(float x, bool gelu) {
    if (!gelu) return x / (1.0f + expf(-x));
    const float k = 0.7978845608028654f;
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

/* The scratch an op needs: PRENORM's normed row (f32 [K]), then with q8 the codes [M, K] and
 * scales [M, K / 32] */
static uint64_t forge__host_scratch_bytes(const forge__host_op *o) {
    uint64_t K = o->pc.K, M = o->pc.M;
    return (o->pc.flags & FORGE__LINEAR_PRENORM ? 4 * K : 0) + (o->q8 ? M * K + M * K / 8 : 0);
}

typedef struct forge__host_job_ctx {
    const forge__host_op *op;
    const float *x;       /* A' [M, K]: A, or PRENORM's normed row */
    int8_t *xq;           /* with q8: A' rounded [M, K] (forge__host_quantize_part writes it) */
    float *xd;            /* ... and its blocks' scales [M, K / 32] */
    const forge__host_dots *dots;
} forge__host_job_ctx;

/* Rows part * M / n_parts .. of A' to int8 */
static void forge__host_quantize_part(void *ctx, uint32_t part, uint32_t n_parts) {
    const forge__host_job_ctx *j = (const forge__host_job_ctx *)ctx;
    uint32_t M = j->op->pc.M, K = j->op->pc.K, r0 = (uint32_t)((uint64_t)M * part / n_parts), r1 = (uint32_t)((uint64_t)M * (part + 1) / n_parts);
    forge__host_quantize(j->x + (uint64_t)r0 * K, r1 - r0, K, j->xq + (uint64_t)r0 * K, j->xd + (uint64_t)r0 * (K / 32));
}

/* R rows from r0 of weight row `row` */
static void forge__host_dots_rows(const forge__host_job_ctx *j, uint64_t row, uint32_t r0, uint32_t R, float *out) {
    const forge__host_op *o = j->op;
    uint32_t K = o->pc.K;
    const uint8_t *w = o->w + row * forge__host_row_bytes(o->fmt, K);
    if (o->q8) {
        j->dots->q8(o->fmt, w, j->xq + (uint64_t)r0 * K, j->xd + (uint64_t)r0 * (K / 32), K, R, out);
        return;
    }
    for (uint32_t r = 0; r < R; r++) out[r] = j->dots->f32(o->fmt, w, j->x + (uint64_t)(r0 + r) * K, K);
}

/* Outputs part * N / n_parts .. of the product, in blocks of 8 (so parts never share a cache line
 * of C): each block's weight rows are read for FORGE__HOST_ROWS rows of A' at a time */
static void forge__host_op_part(void *ctx, uint32_t part, uint32_t n_parts) {
    const forge__host_job_ctx *j = (const forge__host_job_ctx *)ctx;
    const forge__host_op *o = j->op;
    const forge__pc_linear *pc = &o->pc;
    uint32_t N = pc->N, M = pc->M, blocks = (N + 7) / 8;
    uint32_t n0 = (uint32_t)((uint64_t)blocks * part / n_parts) * 8, n1 = FORGE__MIN((uint32_t)((uint64_t)blocks * (part + 1) / n_parts) * 8, N);
    bool gated = pc->flags & FORGE__LINEAR_GATED, gelu = pc->flags & FORGE__LINEAR_GELU;
    for (uint32_t nb = n0; nb < n1; nb += 8)
        for (uint32_t r0 = 0; r0 < M; r0 += FORGE__HOST_ROWS) {
            uint32_t R = FORGE__MIN((uint32_t)FORGE__HOST_ROWS, M - r0);
            for (uint32_t n = nb; n < FORGE__MIN(nb + 8, n1); n++) {
                float v[FORGE__HOST_ROWS], u[FORGE__HOST_ROWS];
                forge__host_dots_rows(j, gated ? 2ull * n : n, r0, R, v);
                if (gated) forge__host_dots_rows(j, 2ull * n + 1, r0, R, u);
                for (uint32_t r = 0; r < R; r++) {
                    float y = gated ? forge__host_act(v[r], gelu) * u[r] : v[r];
                    if (pc->flags & FORGE__LINEAR_BIAS) y += o->bias[pc->bias_off + n];
                    if (pc->flags & FORGE__LINEAR_SOFTCAP) y = tanhf(y / pc->softcap) * pc->softcap;
                    float *c = &o->c[(uint64_t)(r0 + r) * pc->ldc + pc->c_col0 + n];
                    if (pc->flags & FORGE__LINEAR_ACCUMULATE) y += *c;
                    *c = y;
                }
            }
        }
}

/* Runs one product on the pool, its scratch (forge__host_scratch_bytes) at `scratch`. PRENORM's
 * sum of squares is taken in double (the kernel's in f32 subgroup sums: the two agree to
 * rounding). */
static void forge__host_op_run(const forge__host_op *o, uint8_t *scratch, forge__host_pool *pool) {
    const forge__pc_linear *pc = &o->pc;
    forge__host_job_ctx j = {o, o->a, NULL, NULL, &pool->dots};
    if (pc->flags & FORGE__LINEAR_PRENORM) {
        float *xn = (float *)scratch;
        double ss = 0;
        for (uint32_t k = 0; k < pc->K; k++) ss += (double)o->a[k] * o->a[k];
        float inv = 1.0f / sqrtf((float)(ss / pc->K) + pc->eps);
        for (uint32_t k = 0; k < pc->K; k++) xn[k] = o->a[k] * inv * o->g[k];
        j.x = xn;
        scratch += 4ull * pc->K;
    }
    if (o->q8) {
        j.xq = (int8_t *)scratch;
        j.xd = (float *)(scratch + (uint64_t)pc->M * pc->K);
        if (pc->M == 1) forge__host_quantize_part(&j, 0, 1);
        else forge__host_pool_run(pool, forge__host_quantize_part, &j);
    }
    forge__host_pool_run(pool, forge__host_op_part, &j);
}

/* ---- A recording's host segments ---- */

/* The buffers a twin may read and write: the model's blocks (weights, norms, biases) and the
 * session's (activations), mapped (the device's memory is the host's). */
typedef struct forge__host_bufs {
    const forge__buffer *sets[2];
    int counts[2];
} forge__host_bufs;

/* cbs[0] is the recording's cb; ops[j] runs after cbs[op_cb[j]] (products with nothing recorded
 * between them run one after another: a layer's o, gate|up and down, and the next layer's q|k|v,
 * one submission), before cbs[op_cb[j] + 1]. */
typedef struct forge__host_seq {
    VkCommandBuffer *cbs;
    forge__host_op *ops;
    uint32_t *op_cb;
    uint32_t n_ops, n_cbs, cap;   /* cap: of ops, op_cb and cbs */
    uint32_t dispatches_at_cut, copies_at_cut; /* the recorder's counts after the last op */
    uint8_t *scratch;             /* the largest op's forge__host_scratch_bytes (the ops run one after another), malloc'd */
    uint64_t scratch_bytes;
} forge__host_seq;

static void forge__host_seq_free(forge__device *d, VkCommandPool pool, forge__host_seq *q) {
    for (uint32_t i = 1; i < q->n_cbs; i++)
        if (q->cbs[i]) d->vk.vkFreeCommandBuffers(d->dev, pool, 1, &q->cbs[i]);
    free(q->cbs);
    free(q->ops);
    free(q->op_cb);
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

/* Whether dispatch (op, push) has a host twin: matvec_sg's one token (its fused norm and gated
 * pairs too) or matmul's rows (plain, _big, _s tiles; bias, accumulate, soft-cap), in a format
 * the twin reads, of at least min_bytes of weights; its format in *fmt and its weight bytes in
 * *wbytes. */
static bool forge__host_twin(forge__op op, const void *push, uint64_t min_bytes, forge__wfmt *fmt, uint64_t *wbytes) {
    const forge__pc_linear *pc = (const forge__pc_linear *)push;
    uint32_t allowed = FORGE__LINEAR_BIAS | FORGE__LINEAR_ACCUMULATE | FORGE__LINEAR_SOFTCAP;
    forge__op base;
    if (op >= FORGE__OP_MATVEC_SG && op < FORGE__OP_MATVEC_SG + FORGE__W_COUNT) {
        base = FORGE__OP_MATVEC_SG;
        allowed |= FORGE__LINEAR_PRENORM | FORGE__LINEAR_GATED | FORGE__LINEAR_GELU;
        if (pc->M != 1) return false;
    } else if (op >= FORGE__OP_MATMUL && op < FORGE__OP_MATMUL + FORGE__W_COUNT) {
        base = FORGE__OP_MATMUL;
    } else if (op >= FORGE__OP_MATMUL_BIG && op < FORGE__OP_MATMUL_BIG + FORGE__W_COUNT) {
        base = FORGE__OP_MATMUL_BIG;
    } else if (op >= FORGE__OP_MATMUL_S && op < FORGE__OP_MATMUL_S + FORGE__W_COUNT) {
        base = FORGE__OP_MATMUL_S;
    } else {
        return false;
    }
    forge__wfmt f = (forge__wfmt)(op - base);
    if (!pc->M || (pc->flags & ~allowed) || !pc->K || !pc->N || !forge__host_row_bytes(f, pc->K)) return false;
    if ((f == FORGE__W_Q4_0 || f == FORGE__W_Q8_0) && pc->K % 32) return false;
    uint64_t rows = pc->flags & FORGE__LINEAR_GATED ? 2ull * pc->N : pc->N;
    *fmt = f;
    *wbytes = rows * forge__host_row_bytes(f, pc->K);
    return *wbytes >= min_bytes;
}

/* The twin of dispatch (op, binds, push) with host addresses; false where it has none or a
 * binding is not mapped. q8: int8 activations for Q4_0 / Q8_0 weights. */
static bool forge__host_op_of(const forge__host_bufs *hb, uint64_t min_bytes, bool q8, forge__op op, const forge__range *binds, const void *push,
                              forge__host_op *out) {
    forge__wfmt f;
    uint64_t wbytes;
    if (!forge__host_twin(op, push, min_bytes, &f, &wbytes)) return false;
    const forge__pc_linear *pc = (const forge__pc_linear *)push;
    memset(out, 0, sizeof *out);
    out->fmt = f;
    out->pc = *pc;
    out->q8 = q8 && (f == FORGE__W_Q4_0 || f == FORGE__W_Q8_0);
    out->a = (const float *)forge__host_addr(hb, binds[0], 4ull * pc->a_row0 * pc->K, 4ull * pc->M * pc->K);
    out->w = (const uint8_t *)forge__host_addr(hb, binds[1], 0, wbytes);
    out->c = (float *)forge__host_addr(hb, binds[2], 0, 4ull * ((uint64_t)(pc->M - 1) * pc->ldc + pc->c_col0 + pc->N));
    if (pc->flags & FORGE__LINEAR_BIAS) out->bias = (const float *)forge__host_addr(hb, binds[3], 0, 4ull * (pc->bias_off + pc->N));
    if (pc->flags & FORGE__LINEAR_PRENORM) out->g = (const float *)forge__host_addr(hb, binds[6], 0, 4ull * pc->K);
    return out->a && out->w && out->c && (out->bias || !(pc->flags & FORGE__LINEAR_BIAS)) && (out->g || !(pc->flags & FORGE__LINEAR_PRENORM));
}

/* Ends the recording's current command buffer where `o` runs and begins the next one; or, where
 * nothing was recorded since the last product (dispatches and copies counted; barriers alone
 * need no submission), lets `o` follow it. A profiled recording cuts at every product, so that
 * each one's timestamps bracket it alone. */
static forge_status forge__host_seq_cut(forge__rec *r, forge__host_seq *q, VkCommandPool pool, const forge__host_op *o) {
    forge__device *d = r->dev;
    if (q->n_ops + 2 > q->cap) {
        uint32_t cap = q->cap ? 2 * q->cap : 64;
        VkCommandBuffer *cbs = (VkCommandBuffer *)realloc(q->cbs, sizeof *cbs * cap);
        if (cbs) q->cbs = cbs;
        forge__host_op *ops = (forge__host_op *)realloc(q->ops, sizeof *ops * cap);
        if (ops) q->ops = ops;
        uint32_t *op_cb = (uint32_t *)realloc(q->op_cb, sizeof *op_cb * cap);
        if (op_cb) q->op_cb = op_cb;
        if (!cbs || !ops || !op_cb) return forge__fail(r->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        if (!q->cap) {
            q->cbs[0] = r->cb;
            q->n_cbs = 1;
        }
        q->cap = cap;
    }
    uint64_t need = forge__host_scratch_bytes(o);
    if (need > q->scratch_bytes) {
        uint8_t *scratch = (uint8_t *)realloc(q->scratch, need);
        if (!scratch) return forge__fail(r->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory (%llu bytes of a product's scratch)", (unsigned long long)need);
        q->scratch = scratch;
        q->scratch_bytes = need;
    }
    bool follows = q->n_ops && !r->qpool && r->n_dispatches - 1 == q->dispatches_at_cut && r->n_copies == q->copies_at_cut;
    q->dispatches_at_cut = r->n_dispatches;
    q->copies_at_cut = r->n_copies;
    if (follows) {
        q->ops[q->n_ops] = *o;
        q->op_cb[q->n_ops] = q->op_cb[q->n_ops - 1]; /* (the command buffer begun after that product stays open) */
        q->n_ops++;
        return FORGE_OK;
    }
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
    q->op_cb[q->n_ops++] = q->n_cbs - 1;
    q->cbs[q->n_cbs++] = cb;
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    d->vk.vkBeginCommandBuffer(cb, &bi);
    r->cb = cb;
    r->fenced = true; /* everything before is complete, and host writes are visible to the next submission */
    return FORGE_OK;
}

/* Replays a recording with host segments: each command buffer, then the products after it. */
static forge_status forge__host_seq_run(forge__device *d, const forge__host_seq *q, VkFence fence, forge__host_pool *pool, forge__err *err) {
    for (uint32_t i = 0, j = 0; i < q->n_cbs; i++) {
        forge_status st = forge__submit_wait(d, q->cbs[i], fence, err);
        if (st) return st;
        for (; j < q->n_ops && q->op_cb[j] == i; j++) forge__host_op_run(&q->ops[j], q->scratch, pool);
    }
    return FORGE_OK;
}

/* What forge__record hands the recorder when a recording may run products on the host. */
typedef struct forge__host_rec {
    forge__host_bufs bufs;
    forge__host_seq *seq;
    VkCommandPool pool;
    uint64_t min_bytes;
    bool q8;                      /* forge_model.host_q8 */
} forge__host_rec;

/* forge__rec.host_take: a product with a host twin becomes a segment boundary (counted like a
 * dispatch, so a profiled recording's timestamp after it times the product and its submit). */
static bool forge__host_take(forge__rec *r, forge__op op, const forge__range *binds, const void *push) {
    forge__host_rec *h = (forge__host_rec *)r->host_ctx;
    forge__host_op o;
    if (!forge__host_op_of(&h->bufs, h->min_bytes, h->q8, op, binds, push, &o)) return false;
    r->n_dispatches++;
    if (r->counting) return true;
    if ((r->st = forge__host_seq_cut(r, h->seq, h->pool, &o))) return true;
    forge__note_dispatch(r, op, push, 1, true);
    return true;
}

/* Whether r would take a dispatch of (op, push) to the host: a recorder lets a product that will
 * not run as a kernel skip the kernel's own arrangements (matmul's split along k). */
static bool forge__host_takes(const forge__rec *r, forge__op op, const void *push) {
    forge__wfmt f;
    uint64_t wbytes;
    return r->host_take == forge__host_take && forge__host_twin(op, push, ((const forge__host_rec *)r->host_ctx)->min_bytes, &f, &wbytes);
}
