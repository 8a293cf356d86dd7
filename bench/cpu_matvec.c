/* bench/cpu_matvec.c: what a native CPU product could read per second on this machine, for issue
 * 40's decision (bench/RESULTS.md): y[N] = W[N, 2048] x with W in Q4_0 (blocks of 32: an f16
 * scale and 16 bytes of 4-bit codes, value = scale * (code - 8)), rows split over T threads.
 *   scalar: x in f32, the codes unpacked in plain C (what the compiler vectorizes by itself)
 *   avx2:   x rounded to int8 per block of 32 (a scale each), the block's 32 products summed in
 *           int16 / int32 lanes (maddubs, madd), one float multiply-add a block
 * Not part of forge's build: a measurement. Synthetic weights (every row the same pattern), the
 * best of 20 runs, GB/s of weight bytes read.
 *   cc -O3 -march=native -pthread bench/cpu_matvec.c -o /tmp/cpu_matvec -lm
 *   /tmp/cpu_matvec N THREADS     (16384: Llama-3.2-1B's gate|up; 128256: its LM head) */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { K = 2048, BLOCKS = K / 32 };
typedef struct {
    uint16_t d;
    uint8_t qs[16]; /* codes j (low nibble) and j + 16 (high nibble) */
} __attribute__((packed)) q4_block;

static q4_block *W;
static float *x, *y, x8_scale[BLOCKS];
static int8_t x8[K];
static int N, THREADS, AVX2;

static float half_to_float(uint16_t h) {
    _Float16 f;
    memcpy(&f, &h, 2);
    return (float)f;
}

static void rows_scalar(int r0, int r1) {
    for (int r = r0; r < r1; r++) {
        const q4_block *b = W + (size_t)r * BLOCKS;
        float acc = 0;
        for (int i = 0; i < BLOCKS; i++) {
            const float *xb = x + i * 32;
            float s = 0;
            for (int j = 0; j < 16; j++) s += (float)((b[i].qs[j] & 15) - 8) * xb[j] + (float)((b[i].qs[j] >> 4) - 8) * xb[j + 16];
            acc += half_to_float(b[i].d) * s;
        }
        y[r] = acc;
    }
}

static void rows_avx2(int r0, int r1) {
    const __m256i low = _mm256_set1_epi8(15), eight = _mm256_set1_epi8(8), ones = _mm256_set1_epi16(1);
    for (int r = r0; r < r1; r++) {
        const q4_block *b = W + (size_t)r * BLOCKS;
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < BLOCKS; i++) {
            __m128i q = _mm_loadu_si128((const __m128i *)b[i].qs);
            __m256i w = _mm256_sub_epi8(_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), low), eight); /* codes - 8 */
            __m256i a = _mm256_loadu_si256((const __m256i *)(x8 + i * 32));
            /* maddubs multiplies unsigned by signed: |w| times a with w's sign */
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w)), ones);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(b[i].d) * x8_scale[i]), _mm256_cvtepi32_ps(p), acc);
        }
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        s = _mm_hadd_ps(s, s);
        y[r] = _mm_cvtss_f32(_mm_hadd_ps(s, s));
    }
}

static void *worker(void *arg) {
    long t = (long)arg;
    int r0 = (int)((long)N * t / THREADS), r1 = (int)((long)N * (t + 1) / THREADS);
    if (AVX2) rows_avx2(r0, r1);
    else rows_scalar(r0, r1);
    return NULL;
}

static double run_once(void) {
    struct timespec a, b;
    pthread_t th[64];
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void *)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 3 || (N = atoi(argv[1])) <= 0 || (THREADS = atoi(argv[2])) <= 0 || THREADS > 64) {
        fprintf(stderr, "usage: cpu_matvec N THREADS\n");
        return 2;
    }
    W = malloc(sizeof *W * (size_t)N * BLOCKS);
    x = malloc(4 * K);
    y = malloc(4 * (size_t)N);
    if (!W || !x || !y) return 1;
    for (size_t i = 0; i < (size_t)N * BLOCKS; i++) {
        W[i].d = 0x2c00; /* 1/16 */
        for (int j = 0; j < 16; j++) W[i].qs[j] = (uint8_t)(i * 7 + (size_t)j * 13);
    }
    for (int i = 0; i < K; i++) x[i] = (float)(i % 13 - 6) * 0.01f;
    for (int i = 0; i < BLOCKS; i++) { /* x to int8 per block, as the avx2 form reads it */
        float m = 0;
        for (int j = 0; j < 32; j++) m = x[i * 32 + j] > m ? x[i * 32 + j] : -x[i * 32 + j] > m ? -x[i * 32 + j] : m;
        x8_scale[i] = m / 127;
        for (int j = 0; j < 32; j++) x8[i * 32 + j] = (int8_t)(m > 0 ? __builtin_roundf(x[i * 32 + j] / x8_scale[i]) : 0);
    }
    double bytes = (double)N * BLOCKS * sizeof(q4_block);
    for (AVX2 = 0; AVX2 < 2; AVX2++) {
        double best = 1e30;
        for (int rep = 0; rep < 20; rep++) {
            double s = run_once();
            if (s < best) best = s;
        }
        printf("%s: N %d, K %d, %d threads: %.3f ms, %.2f GB/s (y[0] %.5f)\n", AVX2 ? "avx2  " : "scalar", N, K, THREADS, best * 1e3,
               bytes / best * 1e-9, y[0]);
    }
    return 0;
}
