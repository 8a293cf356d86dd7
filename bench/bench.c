/* bench.c: `forge bench MODEL [-p 512] [-n 128] [-r 3]`.
 *
 * Measures, from token ids alone (no tokenizer), with forge_generate_tokens on one session:
 *   prefill: P prompt tokens (pseudo-random ids) from an empty cache, through the first
 *            sampled token;
 *   decode:  the N - 1 following greedy tokens (sampled on the device, one replayed step each).
 * After a warm-up run, each is repeated R times and the median reported. Prints one JSON
 * object on stdout:
 *   {"device", "driver", "model", "format", "arch", "dtype", "parameters", "weight_bytes",
 *    "n_prompt", "n_gen", "reps", "prefill_tok_s", "decode_tok_s", "ttft_ms",
 *    "peak_device_bytes", "load_s"}, and with --profile "profile": device ms per kernel over all
 *    runs (warm-up included; timestamps after every dispatch slow the run a little).
 * ttft_ms: the call's start to its first generated token. */
#define _POSIX_C_SOURCE 200809L
#include "forge.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

forge_model *forge_cli_load(const char *path, const char *device, int verbose); /* tools/forge_cli.c */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20) printf("\\u%04x", *s);
        else putchar(*s);
    }
    putchar('"');
}

int forge_bench_main(int argc, char **argv) {
    const char *path = NULL, *device = NULL;
    int P = 512, N = 128, R = 3, verbose = 0, profile = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-p") && i + 1 < argc) P = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) N = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) R = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "-v")) verbose = 1;
        else if (!strcmp(argv[i], "--profile")) profile = 1;
        else if (!path) path = argv[i];
        else { fprintf(stderr, "forge bench: unexpected argument '%s'\n", argv[i]); return 2; }
    }
    if (!path || P < 1 || N < 1 || R < 1) {
        fprintf(stderr, "usage: forge bench MODEL [-p 512] [-n 128] [-r 3] [--device D] [--profile]\n");
        return 2;
    }
    double t0 = now_s();
    forge_model *m = forge_cli_load(path, device, verbose);
    if (!m) return 1;
    double load_s = now_s() - t0;
    forge_model_info info;
    forge_model_get_info(m, &info);
    int V = info.n_vocab;
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = P + N + 1;
    sp.n_batch = P;
    sp.profile = profile;
    forge_session *s = NULL;
    if (forge_session_create(m, &sp, &s) != FORGE_OK) {
        fprintf(stderr, "forge bench: %s\n", forge_model_errmsg(m));
        forge_model_free(m);
        return 1;
    }
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)P);
    double *pre = malloc(sizeof(double) * (size_t)R), *dec = malloc(sizeof(double) * (size_t)R), *first = malloc(sizeof(double) * (size_t)R);
    uint32_t rng = 12345;
    for (int i = 0; i < P; i++) {
        rng = rng * 1664525u + 1013904223u;
        prompt[i] = (int32_t)((rng >> 8) % (uint32_t)V);
    }
    int rc = 0;
    forge_generate_params gp = forge_generate_default_params();
    gp.max_tokens = N;
    gp.ignore_eos = 1; /* greedy, sampled on the device, exactly N tokens */
    for (int r = 0; r <= R && !rc; r++) { /* r = 0 is a warm-up */
        forge_session_truncate(s, 0);      /* no prompt-cache reuse between repetitions */
        forge_metrics mt;
        if (forge_generate_tokens(s, prompt, P, &gp, &mt) != FORGE_OK || mt.generated_tokens != N) { rc = 1; break; }
        if (r > 0) {
            pre[r - 1] = mt.prefill_tok_s;
            dec[r - 1] = mt.decode_tok_s;
            first[r - 1] = mt.ttft_ms;
        }
    }
    if (rc) {
        fprintf(stderr, "forge bench: %s\n", forge_session_errmsg(s));
    } else {
        forge_model_get_info(m, &info);
        printf("{\"device\": ");
        json_str(info.device_name);
        printf(", \"driver\": ");
        json_str(info.device_driver);
        printf(", \"model\": ");
        json_str(path);
        printf(", \"format\": ");
        json_str(info.source_format);
        printf(", \"arch\": ");
        json_str(info.architecture);
        printf(", \"dtype\": ");
        json_str(info.weight_dtype);
        printf(", \"parameters\": %llu, \"weight_bytes\": %llu, \"n_prompt\": %d, \"n_gen\": %d, \"reps\": %d",
               (unsigned long long)info.n_params, (unsigned long long)info.weight_bytes, P, N, R);
        printf(", \"prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f, \"ttft_ms\": %.3f", median(pre, R), median(dec, R), median(first, R));
        printf(", \"peak_device_bytes\": %llu, \"load_s\": %.3f", (unsigned long long)info.memory.device_peak_bytes, load_s);
        if (profile) {
            char prof[8192];
            size_t len;
            if (forge_session_profile(s, prof, sizeof prof, &len) == FORGE_OK) printf(", \"profile\": %s", prof);
        }
        printf("}\n");
    }
    free(prompt);
    free(pre);
    free(dec);
    free(first);
    forge_session_free(s);
    forge_model_free(m);
    return rc;
}

/* `forge bench-tokenize PATH TEXTFILE [-r 3]`: tokenizer speed, single-threaded.
 * load_s: forge_model_load with vocab_only (the tokenizer only), median of R loads.
 * mb_per_s: TEXTFILE's bytes / the median time of R forge_tokenize calls on the whole file as
 * one text (after one warm-up), without special tokens added.
 * Prints {"path", "text_bytes", "n_tokens", "reps", "load_s", "encode_s", "mb_per_s"}. */
forge_model *forge_cli_load_vocab(const char *path, int verbose); /* tools/forge_cli.c */

int forge_bench_tokenize_main(int argc, char **argv) {
    const char *path = NULL, *file = NULL;
    int R = 3;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-r") && i + 1 < argc) R = atoi(argv[++i]);
        else if (!path) path = argv[i];
        else if (!file) file = argv[i];
        else { fprintf(stderr, "forge bench-tokenize: unexpected argument '%s'\n", argv[i]); return 2; }
    }
    if (!path || !file || R < 1) {
        fprintf(stderr, "usage: forge bench-tokenize PATH TEXTFILE [-r 3]\n");
        return 2;
    }
    FILE *f = fopen(file, "rb");
    if (!f) { fprintf(stderr, "forge bench-tokenize: cannot open %s\n", file); return 1; }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    if (!text || fread(text, 1, (size_t)size, f) != (size_t)size) { fclose(f); free(text); return 1; }
    fclose(f);
    double *loads = malloc(sizeof(double) * (size_t)R), *encs = malloc(sizeof(double) * (size_t)R);
    forge_model *m = NULL;
    for (int r = 0; r < R; r++) {
        if (m) forge_model_free(m);
        double t0 = now_s();
        m = forge_cli_load_vocab(path, 0);
        loads[r] = now_s() - t0;
        if (!m) { free(text); free(loads); free(encs); return 1; }
    }
    size_t cap = (size_t)size + 16, n = 0;
    int32_t *ids = malloc(sizeof(int32_t) * cap);
    int rc = 0;
    for (int r = 0; r <= R; r++) { /* r = 0 is a warm-up */
        double t0 = now_s();
        if (forge_tokenize(m, text, (size_t)size, 0, ids, cap, &n) != FORGE_OK) {
            fprintf(stderr, "forge bench-tokenize: %s\n", forge_model_errmsg(m));
            rc = 1;
            break;
        }
        if (r > 0) encs[r - 1] = now_s() - t0;
    }
    if (!rc) {
        double enc = median(encs, R);
        printf("{\"path\": ");
        json_str(path);
        printf(", \"text_bytes\": %ld, \"n_tokens\": %zu, \"reps\": %d, \"load_s\": %.4f, \"encode_s\": %.4f, \"mb_per_s\": %.3f}\n",
               size, n, R, median(loads, R), enc, (double)size / 1e6 / enc);
    }
    forge_model_free(m);
    free(ids);
    free(text);
    free(loads);
    free(encs);
    return rc;
}
