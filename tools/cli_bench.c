/* cli_bench.c: `forge bench MODEL [-p 512] [-n 128] [-r 3] [--batch B]`.
 *
 * Measures, from token ids alone (no tokenizer), with forge_generate_tokens on one session:
 *   prefill: P prompt tokens (pseudo-random ids) from an empty cache, through the first
 *            sampled token;
 *   decode:  the N - 1 following greedy tokens (sampled on the device, one replayed step each).
 * After a warm-up run, each is repeated R times and the median reported. Prints one JSON
 * object on stdout:
 *   {"device", "driver", "model", "format", "arch", "dtype", "parameters", "weight_bytes",
 *    "n_prompt", "n_gen", "reps", "kv_type" (the session's KV cache, "f16", "f32" or "q8_0"; --kv
 *    chooses), "prefill_tok_s", "decode_tok_s", "ttft_ms",
 *    "classify_prompts_s", "peak_device_bytes", "load_s"}, and with --profile "profile": device
 *    ms per kernel over all runs (warm-up and classify included; timestamps after every
 *    dispatch slow the run a little), "prefill_profile": the same for one prefill of the P
 *    tokens alone, on a session of its own, and "decode_profile": the N decode steps that
 *    follow it there (that session's profile after them less its prefill's).
 * ttft_ms: the call's start to its first generated token.
 * classify_prompts_s: forge_classify of 64 prompts of 32 pseudo-random tokens each (greedy,
 * no logits copied out) on the same session, prompts per second of wall time, median of R
 * after a warm-up.
 * With --batch B (no --train): also batch generation, forge_batch_generate of B prompts of P
 * pseudo-random tokens (each its own), N greedy tokens each, on a session of B places; adds
 * "batch": B, "batch_decode_tok_s": the aggregate decode speed, B (N - 1) tokens over the
 * lockstep phase (from the last sequence's first token to the end: the shortest decode_ms of
 * the items), median of R after a warm-up, and "batch1_decode_tok_s": the same with B = 1;
 * with --profile also "batch_profile": the kernel times of the B-sequence runs.
 *
 * `forge bench MODEL --train [--batch 4] [--seq 512] [--rank 8] [--targets q_proj,v_proj]
 * [--grad-checkpoint|--no-grad-checkpoint] [-r 5]`: LoRA training speed. A trainer with those
 * params (lr 1e-4) takes 1 warm-up step and then R steps on one batch of fixed pseudo-random
 * tokens (batch x seq, every token counted); prints the same first fields and "train_batch",
 * "train_seq", "rank", "targets", "grad_checkpoint" (as the trainer resolves -1), "reps",
 * "train_step_ms" (median wall time of forge_train_step), "train_tok_s" (batch * seq / that
 * time), "train_loss" (of the last step), "peak_device_bytes", "load_s", and with --profile
 * "profile" (forge_trainer_profile).
 *
 * Both take --adapter DIR [--merge-adapter] (the model's adapter), --device and -v.
 * Ctrl-C (after the model has loaded) stops at the next token, classify batch or training step
 * and exits with 130, printing no result: the medians need every repetition.
 *
 * With a constraint (--json-schema FILE, --grammar FILE or --json-object; no --train): also
 * constrained decoding, the same prompt and greedy generation under the constraint (up to N
 * tokens; it may end earlier, when the constraint is matched), median of R after a warm-up;
 * adds "constraint" ("json_schema", "gbnf", "json_object"), "constrained_decode_tok_s",
 * "constrained_ratio" (that over "decode_tok_s"), "constrained_tokens" (generated tokens of
 * the median run), "constrained_forced_tokens", "constrained_masks" (steps whose candidates
 * could not decide), "constraint_ms_per_token" (host time in the constraint a generated token).
 *
 * `forge bench-grammar PATH [SCHEMAS...] [--walks K] [--steps N] [--seed S]`: the constraint
 * engine alone on a tokenizer (PATH as for tokenize: vocab only, no device), over JSON Schema
 * files (a directory's *.json, or files; default bench/schemas). Per schema, compile time
 * (forge_grammar_create, the vocabulary's trie already built) and K random walks of up to N
 * tokens: each step computes the whole mask (timed), draws a token uniformly from it (an end
 * token ends the walk) and takes it (forge_grammar_allows + accept, timed: what a step costs
 * when the sampler's first candidate is allowed). Prints one JSON object: "path", "vocab",
 * "trie_ms", "schemas", "compiled", "failed" (names with the error), "compile_ms" {p50, p99,
 * max}, "mask_us" {p50, p90, p99, mean, max, n}, "token_us" {p50, p99, mean}. */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* The fields every bench object starts with. */
static void print_model_fields(const forge_model_info *info, const char *path) {
    printf("{\"device\": ");
    forge_cli_json_cstr(info->device_name);
    printf(", \"driver\": ");
    forge_cli_json_cstr(info->device_driver);
    printf(", \"model\": ");
    forge_cli_json_cstr(path);
    printf(", \"format\": ");
    forge_cli_json_cstr(info->source_format);
    printf(", \"arch\": ");
    forge_cli_json_cstr(info->architecture);
    printf(", \"dtype\": ");
    forge_cli_json_cstr(info->weight_dtype);
    printf(", \"parameters\": %llu, \"weight_bytes\": %llu", (unsigned long long)info->n_params,
           (unsigned long long)info->weight_bytes);
}

typedef forge_status (*profile_get)(const void *, char *, size_t, size_t *);

static forge_status session_profile(const void *s, char *out, size_t cap, size_t *len) {
    return forge_session_profile((const forge_session *)s, out, cap, len);
}

/* The JSON of a profile call that fills a caller buffer, malloc'd, or NULL. */
static char *profile_text(const void *obj, profile_get get) {
    size_t len = 0;
    char *buf = NULL;
    if (get(obj, NULL, 0, &len) == FORGE_ERR_BUFFER_TOO_SMALL && (buf = malloc(len + 1)) && get(obj, buf, len + 1, &len) != FORGE_OK) {
        free(buf);
        buf = NULL;
    }
    return buf;
}

/* Prints `, "KEY": {...}` from a profile call. */
static void print_profile(const char *key, const void *obj, profile_get get) {
    char *buf = profile_text(obj, get);
    if (buf) printf(", \"%s\": %s", key, buf);
    free(buf);
}

/* Prints `, "KEY": {...}`: the kernel times of profile `after` less those of `before` (the
 * same session's, earlier): calls and ms subtracted, the rates ("gb_s", "tflop_s") those of
 * the difference (a rate times ms is additive), kernels without calls in between left out. */
static void print_profile_difference(const char *key, const char *before, const char *after) {
    cJSON *b = cJSON_Parse(before), *a = cJSON_Parse(after), *out = cJSON_CreateObject(), *e;
    cJSON_ArrayForEach(e, a) {
        cJSON *was = cJSON_GetObjectItemCaseSensitive(b, e->string);
        double ms = cJSON_GetNumberValue(cJSON_GetObjectItem(e, "ms")), ms0 = was ? cJSON_GetNumberValue(cJSON_GetObjectItem(was, "ms")) : 0;
        double calls = cJSON_GetNumberValue(cJSON_GetObjectItem(e, "calls")) - (was ? cJSON_GetNumberValue(cJSON_GetObjectItem(was, "calls")) : 0);
        if (calls <= 0) continue;
        cJSON *d = cJSON_AddObjectToObject(out, e->string), *f;
        cJSON_ArrayForEach(f, e) {
            double v = f->valuedouble, v0 = was ? cJSON_GetNumberValue(cJSON_GetObjectItem(was, f->string)) : 0;
            if (v0 != v0) v0 = 0; /* (NaN: not in before) */
            size_t n = strlen(f->string);
            int rate = n > 2 && !strcmp(f->string + n - 2, "_s");
            double dv = rate ? (ms - ms0 > 0 ? (v * ms - v0 * ms0) / (ms - ms0) : 0) : v - v0;
            cJSON_AddNumberToObject(d, f->string, dv);
        }
    }
    char *text = a && b ? cJSON_PrintUnformatted(out) : NULL;
    if (text) printf(", \"%s\": %s", key, text);
    free(text);
    cJSON_Delete(a);
    cJSON_Delete(b);
    cJSON_Delete(out);
}

static forge_status trainer_profile(const void *t, char *out, size_t cap, size_t *len) {
    return forge_trainer_profile((const forge_trainer *)t, out, cap, len);
}

/* The device memory peak of the model and everything made from it so far. */
static uint64_t model_peak_bytes(const forge_model *m) {
    forge_memory_stats mem = {.struct_size = sizeof mem};
    forge_model_memory(m, &mem);
    return mem.device_peak_bytes;
}

typedef struct train_bench {
    int batch, seq, rank, grad_checkpoint;
    const char *targets;
} train_bench;

/* `forge bench MODEL --train`: see the top of the file. */
static int bench_train(forge_model *m, const char *path, const train_bench *tb, int R, int profile, double load_s) {
    forge_model_info info = {.struct_size = sizeof info};
    forge_model_get_info(m, &info);
    forge_train_params tp = forge_train_default_params();
    tp.lr = 1e-4;
    tp.max_batch = tb->batch;
    tp.max_seq = tb->seq;
    if (tb->rank) tp.rank = tb->rank;
    if (tb->targets) tp.targets = tb->targets;
    tp.grad_checkpoint = tb->grad_checkpoint;
    tp.total_steps = R + 1;
    tp.profile = profile;
    forge_trainer *t = NULL;
    forge_status st = forge_trainer_create(m, &tp, &t);
    if (st != FORGE_OK) {
        fprintf(stderr, "forge bench: %s (%s)\n", forge_model_errmsg(m), forge_status_name(st));
        return 1;
    }
    size_t n = (size_t)tb->batch * (size_t)tb->seq;
    int32_t *tokens = malloc(sizeof(int32_t) * n);
    double *ms = malloc(sizeof(double) * (size_t)R);
    int rc = 0;
    if (!tokens || !ms) {
        fprintf(stderr, "forge bench: out of host memory\n");
        rc = 1;
    }
    uint32_t rng = 12345;
    for (size_t i = 0; !rc && i < n; i++) {
        rng = rng * 1664525u + 1013904223u;
        tokens[i] = (int32_t)((rng >> 8) % (uint32_t)info.n_vocab);
    }
    forge_train_batch b = {.struct_size = sizeof b};
    b.n_seqs = tb->batch;
    b.seq_len = tb->seq;
    b.tokens = tokens;
    forge_train_stats stats = {.struct_size = sizeof stats};
    for (int r = 0; r <= R && !rc; r++) { /* r = 0 is a warm-up */
        if (forge_cli_interrupted()) { rc = 130; break; } /* a step is not cancellable: Ctrl-C stops between them */
        double t0 = now_s();
        st = forge_train_step(t, &b, &stats);
        double dt = now_s() - t0;
        if (st != FORGE_OK) {
            fprintf(stderr, "forge bench: %s (%s)\n", forge_trainer_errmsg(t), forge_status_name(st));
            rc = 1;
        } else if (r > 0) {
            ms[r - 1] = dt * 1e3;
        }
    }
    if (!rc && forge_cli_interrupted()) rc = 130;
    if (!rc) {
        double step_ms = median(ms, R);
        /* forge_train_params.grad_checkpoint -1 resolves as forge.h documents it */
        int gc = tb->grad_checkpoint >= 0 ? tb->grad_checkpoint : (int64_t)tb->batch * tb->seq >= 4096;
        print_model_fields(&info, path);
        printf(", \"train_batch\": %d, \"train_seq\": %d, \"rank\": %d, \"targets\": ", tb->batch, tb->seq, tp.rank);
        forge_cli_json_cstr(tp.targets ? tp.targets : "");
        printf(", \"grad_checkpoint\": %s, \"reps\": %d, \"train_step_ms\": %.3f, \"train_tok_s\": %.2f", gc ? "true" : "false", R,
               step_ms, (double)n / (step_ms * 1e-3));
        printf(", \"train_loss\": %.6g, \"peak_device_bytes\": %llu, \"load_s\": %.3f", stats.loss,
               (unsigned long long)stats.peak_device_bytes, load_s);
        if (profile) print_profile("profile", t, trainer_profile);
        printf("}\n");
    }
    free(tokens);
    free(ms);
    forge_trainer_free(t);
    return rc;
}

/* Aggregate decode tok/s of forge_batch_generate with B sequences of P prompt tokens and N
 * generated ones (see the top of the file); 0 on failure (message on stderr). With `profile`
 * the batch session's kernel times go to *profile_json (malloc'd). */
static double bench_batch(forge_model *m, int B, int P, int N, int R, int kv_type, int profile, char **profile_json) {
    int V = forge_model_n_vocab(m);
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = P + N + 1;
    sp.n_batch = P > B ? P : B;
    sp.n_seq_max = B;
    sp.kv_type = kv_type;
    sp.profile = profile;
    forge_session *s = NULL;
    if (forge_session_create(m, &sp, &s) != FORGE_OK) {
        fprintf(stderr, "forge bench: --batch %d: %s\n", B, forge_model_errmsg(m));
        return 0;
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)B * (size_t)P);
    forge_batch_item *items = calloc((size_t)B, sizeof *items);
    forge_batch_result *res = calloc((size_t)B, sizeof *res);
    if (res) res[0].struct_size = sizeof *res; /* the array's element size (forge.h) */
    double *agg = malloc(sizeof(double) * (size_t)R), out = 0;
    uint32_t rng = 777;
    for (size_t i = 0; ids && i < (size_t)B * (size_t)P; i++) {
        rng = rng * 1664525u + 1013904223u;
        ids[i] = (int32_t)((rng >> 8) % (uint32_t)V);
    }
    forge_generate_params gp = forge_generate_default_params();
    gp.max_tokens = N;
    gp.ignore_eos = 1;
    gp.cancel = forge_cli_cancel_flag();
    for (int b = 0; items && ids && b < B; b++) items[b] = (forge_batch_item){sizeof(forge_batch_item), NULL, 0, ids + (size_t)b * P, P, &gp};
    int ok = ids && items && res && agg;
    for (int r = 0; r <= R && ok; r++) { /* r = 0 is a warm-up */
        forge_status st = forge_batch_generate(s, items, B, res);
        double lockstep_ms = 1e300;
        for (int b = 0; b < B && ok; b++) {
            if (st != FORGE_OK || res[b].status != FORGE_OK || res[b].metrics.generated_tokens != N) ok = 0;
            else if (res[b].metrics.decode_ms < lockstep_ms) lockstep_ms = res[b].metrics.decode_ms;
        }
        if (!ok && !forge_cli_interrupted()) fprintf(stderr, "forge bench: --batch %d: %s\n", B, forge_session_errmsg(s));
        else if (r > 0) agg[r - 1] = lockstep_ms > 0 ? (double)B * (N - 1) / (lockstep_ms * 1e-3) : 0;
    }
    if (ok) out = median(agg, R);
    if (ok && profile && profile_json) *profile_json = profile_text(s, session_profile);
    free(ids);
    free(items);
    free(res);
    free(agg);
    forge_session_free(s);
    return out;
}

/* Constrained decoding (see the top of the file): the median run's numbers into out[0..5]:
 * decode tok/s, generated tokens, forced tokens, masks, constraint ms a token. 0 on success. */
static int bench_constrained(forge_session *s, const int32_t *prompt, int P, int N, int R, const forge_constraint *c, double out[5]) {
    forge_generate_params gp = forge_generate_default_params();
    gp.max_tokens = N;
    gp.constraint = c;
    gp.cancel = forge_cli_cancel_flag();
    double *v[5];
    for (int k = 0; k < 5; k++) v[k] = malloc(sizeof(double) * (size_t)R);
    int rc = 0;
    for (int r = 0; r <= R && !rc; r++) { /* r = 0 is a warm-up */
        forge_session_truncate(s, 0);
        forge_metrics mt = {.struct_size = sizeof mt};
        if (forge_generate_tokens(s, prompt, P, &gp, &mt) != FORGE_OK) { rc = 1; break; }
        if (r > 0) {
            v[0][r - 1] = mt.decode_tok_s;
            v[1][r - 1] = mt.generated_tokens;
            v[2][r - 1] = mt.forced_tokens;
            v[3][r - 1] = mt.constraint_masks;
            v[4][r - 1] = mt.generated_tokens ? mt.constraint_ms / mt.generated_tokens : 0;
        }
    }
    for (int k = 0; k < 5; k++) {
        if (!rc) out[k] = median(v[k], R);
        free(v[k]);
    }
    return rc;
}

static int forge_bench_run(int argc, char **argv, const forge_constraint *constraint) {
    forge_cli_opts o = {0};
    if (forge_cli_take_common("bench", &argc, argv, &o, 1)) return 2;
    if (o.n_ctx) {
        fprintf(stderr, "forge bench: --ctx does not apply (the session holds -p + -n + 1 tokens)\n");
        return 2;
    }
    const char *path = NULL;
    int P = 512, N = 128, R = -1, profile = 0, train = 0, pn_set = 0, train_set = 0;
    train_bench tb = {4, 512, 0, -1, NULL};
    int batch_set = 0; /* --batch without --train: batch generation */
    static const char *const values[] = {"-p", "-n", "-r", "--batch", "--seq", "--rank", "--targets", NULL};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        long long v;
        int bad = 0;
        if (forge_cli_needs_value("bench", a, has, values)) return 2;
        if (!strcmp(a, "-p") && has) { bad = forge_cli_parse_int("bench", a, argv[++i], 1, INT_MAX, &v); P = (int)v; pn_set = 1; }
        else if (!strcmp(a, "-n") && has) { bad = forge_cli_parse_int("bench", a, argv[++i], 1, INT_MAX, &v); N = (int)v; pn_set = 1; }
        else if (!strcmp(a, "-r") && has) { bad = forge_cli_parse_int("bench", a, argv[++i], 1, 1000000, &v); R = (int)v; }
        else if (!strcmp(a, "--profile")) profile = 1;
        else if (!strcmp(a, "--train")) train = 1;
        else if (!strcmp(a, "--batch") && has) { bad = forge_cli_parse_int("bench", a, argv[++i], 1, 65536, &v); tb.batch = (int)v; batch_set = 1; }
        else if (!strcmp(a, "--seq") && has) { bad = forge_cli_parse_int("bench", a, argv[++i], 2, 1 << 24, &v); tb.seq = (int)v; train_set = 1; }
        else if (!strcmp(a, "--rank") && has) { bad = forge_cli_parse_int("bench", a, argv[++i], 1, 65536, &v); tb.rank = (int)v; train_set = 1; }
        else if (!strcmp(a, "--targets") && has) { bad = forge_cli_check_targets("bench", a, argv[++i]); tb.targets = argv[i]; train_set = 1; }
        else if (!strcmp(a, "--grad-checkpoint")) { tb.grad_checkpoint = 1; train_set = 1; }
        else if (!strcmp(a, "--no-grad-checkpoint")) { tb.grad_checkpoint = 0; train_set = 1; }
        else if (!strcmp(a, "--json")) continue; /* the output is JSON already; accepted as every verb's is */
        else if (!path && a[0] != '-') path = a;
        else return forge_cli_unexpected("bench", a);
        if (bad) return 2;
    }
    if (!path) path = forge_cli_env_model();
    if (!path) {
        fprintf(stderr, "forge bench: no MODEL given (and FORGE_MODEL is not set)\n");
        forge_cli_verb_help("bench", stderr);
        return 2;
    }
    if (train && pn_set) { fprintf(stderr, "forge bench: -p and -n do not apply to --train (use --batch and --seq)\n"); return 2; }
    if (train && constraint) { fprintf(stderr, "forge bench: a constraint goes without --train\n"); return 2; }
    if (!train && train_set) { fprintf(stderr, "forge bench: --seq, --rank, --targets and --grad-checkpoint need --train\n"); return 2; }
    if (!train && batch_set && tb.batch > 512) { fprintf(stderr, "forge bench: --batch: at most 512 sequences generate together\n"); return 2; }
    if (R < 0) R = train ? 5 : 3;
    double t0 = now_s();
    forge_model *m = forge_cli_load(path, &o);
    if (!m) return 1;
    double load_s = now_s() - t0;
    forge_cli_catch_sigint(NULL, 0); /* Ctrl-C: stop at the next token, batch or step; no result */
    if (train) {
        int rc = bench_train(m, path, &tb, R, profile, load_s);
        if (rc == 130) fprintf(stderr, "forge bench: interrupted: no result (the measurement did not finish)\n");
        forge_model_free(m);
        return rc;
    }
    forge_model_info info = {.struct_size = sizeof info};
    forge_model_get_info(m, &info);
    int V = info.n_vocab;
    forge_session_params sp = forge_session_default_params();
    enum { CLASSIFY_PROMPTS = 64, CLASSIFY_LEN = 32 };
    sp.n_batch = P > CLASSIFY_LEN ? P : CLASSIFY_LEN;
    sp.n_ctx = P + N + 1 > sp.n_batch ? P + N + 1 : sp.n_batch;
    sp.kv_type = o.kv_type;
    sp.profile = profile;
    forge_session *s = NULL;
    if (forge_session_create(m, &sp, &s) != FORGE_OK) {
        fprintf(stderr, "forge bench: %s\n", forge_model_errmsg(m));
        forge_model_free(m);
        return 1;
    }
    int32_t *prompt = malloc(sizeof(int32_t) * ((size_t)P + 1)); /* (+ 1: the profiled decode's) */
    double *pre = malloc(sizeof(double) * (size_t)R), *dec = malloc(sizeof(double) * (size_t)R), *first = malloc(sizeof(double) * (size_t)R);
    double *cls = malloc(sizeof(double) * (size_t)R);
    uint32_t rng = 12345;
    for (int i = 0; i < P; i++) {
        rng = rng * 1664525u + 1013904223u;
        prompt[i] = (int32_t)((rng >> 8) % (uint32_t)V);
    }
    int rc = 0;
    forge_generate_params gp = forge_generate_default_params();
    gp.max_tokens = N;
    gp.ignore_eos = 1; /* greedy, sampled on the device, exactly N tokens */
    gp.cancel = forge_cli_cancel_flag();
    for (int r = 0; r <= R && !rc; r++) { /* r = 0 is a warm-up */
        forge_session_truncate(s, 0);      /* no prompt-cache reuse between repetitions */
        forge_metrics mt = {.struct_size = sizeof mt};
        forge_status st = forge_generate_tokens(s, prompt, P, &gp, &mt);
        if (forge_cli_interrupted()) { rc = 130; break; }
        if (st != FORGE_OK || mt.generated_tokens != N) { rc = 1; break; }
        if (r > 0) {
            pre[r - 1] = mt.prefill_tok_s;
            dec[r - 1] = mt.decode_tok_s;
            first[r - 1] = mt.ttft_ms;
        }
    }
    int32_t *cls_ids = malloc(sizeof(int32_t) * CLASSIFY_PROMPTS * CLASSIFY_LEN);
    forge_classify_prompt cls_prompts[CLASSIFY_PROMPTS];
    forge_classify_result cls_res[CLASSIFY_PROMPTS] = {{.struct_size = sizeof cls_res[0]}};
    for (int i = 0; i < CLASSIFY_PROMPTS * CLASSIFY_LEN; i++) {
        rng = rng * 1664525u + 1013904223u;
        cls_ids[i] = (int32_t)((rng >> 8) % (uint32_t)V);
    }
    for (int i = 0; i < CLASSIFY_PROMPTS; i++) cls_prompts[i] = (forge_classify_prompt){sizeof(forge_classify_prompt), NULL, 0, cls_ids + i * CLASSIFY_LEN, CLASSIFY_LEN};
    forge_classify_params cp = forge_classify_default_params();
    cp.cancel = forge_cli_cancel_flag();
    for (int r = 0; r <= R && !rc; r++) { /* r = 0 is a warm-up */
        double t = now_s();
        forge_status st = forge_classify(s, cls_prompts, CLASSIFY_PROMPTS, &cp, cls_res);
        if (forge_cli_interrupted()) { rc = 130; break; }
        if (st != FORGE_OK) { rc = 1; break; }
        if (r > 0) cls[r - 1] = CLASSIFY_PROMPTS / (now_s() - t);
    }
    free(cls_ids);
    /* --profile: one prefill of the prompt alone on a session of its own (the pipelines exist
     * by now), whose kernel times are the prefill's without decode or classify */
    forge_session *prefill_s = NULL;
    if (!rc && profile && forge_session_create(m, &sp, &prefill_s) == FORGE_OK && forge_eval(prefill_s, prompt, P, 0, NULL, 0) != FORGE_OK) {
        fprintf(stderr, "forge bench: the profiled prefill: %s\n", forge_session_errmsg(prefill_s));
        rc = 2;
    }
    /* ... and then the N decode steps on it, whose kernel times are the difference: the prompt
     * and one more token (the cache an exact prefix, recurrent states included: one row
     * evaluated, then N - 1 decode steps) */
    char *prefill_json = NULL, *decode_json = NULL;
    if (!rc && prefill_s && (prefill_json = profile_text(prefill_s, session_profile))) {
        forge_metrics mt = {.struct_size = sizeof mt};
        prompt[P] = prompt[0];
        if (forge_generate_tokens(prefill_s, prompt, P + 1, &gp, &mt) != FORGE_OK) {
            fprintf(stderr, "forge bench: the profiled decode: %s\n", forge_session_errmsg(prefill_s));
            rc = 2;
        } else {
            decode_json = profile_text(prefill_s, session_profile);
        }
    }
    double batch_tok_s = 0, batch1_tok_s = 0;
    char *batch_profile = NULL;
    if (!rc && batch_set) {
        batch_tok_s = bench_batch(m, tb.batch, P, N, R, o.kv_type, profile, &batch_profile);
        batch1_tok_s = batch_tok_s > 0 ? bench_batch(m, 1, P, N, R, o.kv_type, 0, NULL) : 0;
        if (forge_cli_interrupted()) rc = 130;
        else if (batch_tok_s <= 0 || batch1_tok_s <= 0) rc = 2; /* the message is printed */
    }
    double con[5] = {0};
    if (!rc && constraint && bench_constrained(s, prompt, P, N, R, constraint, con)) rc = 1;
    if (!rc && forge_cli_interrupted()) rc = 130; /* after the last repetition: no result all the same */
    if (rc == 2) {
        rc = 1;
    } else if (rc == 130) {
        fprintf(stderr, "forge bench: interrupted: no result (the measurement did not finish)\n");
    } else if (rc) {
        fprintf(stderr, "forge bench: %s\n", forge_session_errmsg(s));
    } else {
        forge_model_get_info(m, &info);
        print_model_fields(&info, path);
        printf(", \"n_prompt\": %d, \"n_gen\": %d, \"reps\": %d, \"kv_type\": \"%s\"", P, N, R,
               forge_session_kv_type(s) == FORGE_KV_Q8_0 ? "q8_0" : forge_session_kv_type(s) == FORGE_KV_F16 ? "f16" : "f32");
        printf(", \"prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f, \"ttft_ms\": %.3f", median(pre, R), median(dec, R), median(first, R));
        printf(", \"classify_prompts_s\": %.2f", median(cls, R));
        if (batch_set) printf(", \"batch\": %d, \"batch_decode_tok_s\": %.2f, \"batch1_decode_tok_s\": %.2f", tb.batch, batch_tok_s, batch1_tok_s);
        if (constraint) {
            static const char *const kinds[] = {"none", "gbnf", "json_schema", "json_object", "choices"};
            double plain = median(dec, R);
            printf(", \"constraint\": \"%s\", \"constrained_decode_tok_s\": %.2f, \"constrained_ratio\": %.3f, \"constrained_tokens\": %.0f, "
                   "\"constrained_forced_tokens\": %.0f, \"constrained_masks\": %.0f, \"constraint_ms_per_token\": %.4f",
                   kinds[constraint->kind <= 4 ? constraint->kind : 0], con[0], plain > 0 ? con[0] / plain : 0, con[1], con[2], con[3], con[4]);
        }
        printf(", \"peak_device_bytes\": %llu, \"load_s\": %.3f", (unsigned long long)model_peak_bytes(m), load_s);
        if (profile) print_profile("profile", s, session_profile);
        if (prefill_json) printf(", \"prefill_profile\": %s", prefill_json);
        if (prefill_json && decode_json) print_profile_difference("decode_profile", prefill_json, decode_json);
        if (batch_profile) printf(", \"batch_profile\": %s", batch_profile);
        printf("}\n");
    }
    free(batch_profile);
    free(prefill_json);
    free(decode_json);
    forge_session_free(prefill_s);
    free(prompt);
    free(pre);
    free(dec);
    free(first);
    free(cls);
    forge_session_free(s);
    forge_model_free(m);
    return rc;
}

int forge_bench_main(int argc, char **argv) {
    forge_cli_constraint con;
    if (forge_cli_take_constraint("bench", &argc, argv, &con, 0)) return 2;
    int rc = forge_bench_run(argc, argv, forge_cli_constraint_get(&con));
    forge_cli_constraint_free(&con);
    return rc;
}

/* `forge bench-tokenize PATH TEXTFILE [-r 3]`: tokenizer speed, single-threaded.
 * load_s: forge_model_load with vocab_only (the tokenizer only), median of R loads.
 * mb_per_s: TEXTFILE's bytes / the median time of R forge_tokenize calls on the whole file as
 * one text (after one warm-up), without special tokens added.
 * Prints {"path", "text_bytes", "n_tokens", "reps", "load_s", "encode_s", "mb_per_s"}. */
int forge_bench_tokenize_main(int argc, char **argv) {
    const char *path = NULL, *file = NULL;
    int R = 3;
    static const char *const values[] = {"-r", NULL};
    for (int i = 0; i < argc; i++) {
        if (forge_cli_needs_value("bench-tokenize", argv[i], i + 1 < argc, values)) return 2;
        if (!strcmp(argv[i], "-r") && i + 1 < argc) {
            long long r;
            if (forge_cli_parse_int("bench-tokenize", "-r", argv[++i], 1, 1000000, &r)) return 2;
            R = (int)r;
        }
        else if (argv[i][0] == '-' && argv[i][1]) return forge_cli_unexpected("bench-tokenize", argv[i]);
        else if (!path) path = argv[i];
        else if (!file) file = argv[i];
        else return forge_cli_unexpected("bench-tokenize", argv[i]);
    }
    if (path && !file && forge_cli_env_model()) { /* TEXTFILE alone: FORGE_MODEL is PATH */
        file = path;
        path = forge_cli_env_model();
    }
    if (!path || !file) {
        fprintf(stderr, "forge bench-tokenize: give PATH and TEXTFILE (PATH may come from FORGE_MODEL)\n");
        forge_cli_verb_help("bench-tokenize", stderr);
        return 2;
    }
    FILE *f = fopen(file, "rb");
    if (!f) { fprintf(stderr, "forge bench-tokenize: cannot read '%s': %s\n", file, strerror(errno)); return 1; }
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
        forge_cli_json_cstr(path);
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

/* ---- forge bench-grammar ---- */

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The p-quantile (0..1) of v[0..n) (sorted here). */
static double quantile(double *v, size_t n, double p) {
    if (!n) return 0;
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

#include <dirent.h>

int forge_bench_grammar_main(int argc, char **argv) {
    const char *path = NULL;
    long long walks = 4, steps = 64;
    uint64_t seed = 1;
    char **files = malloc(sizeof *files * (size_t)(argc + 1));
    int n_files = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--walks") && has) {
            if (forge_cli_parse_int("bench-grammar", a, argv[++i], 1, 100000, &walks)) { free(files); return 2; }
        } else if (!strcmp(a, "--steps") && has) {
            if (forge_cli_parse_int("bench-grammar", a, argv[++i], 1, 1000000, &steps)) { free(files); return 2; }
        } else if (!strcmp(a, "--seed") && has) {
            if (forge_cli_parse_u64("bench-grammar", a, argv[++i], &seed)) { free(files); return 2; }
        } else if (!path && a[0] != '-') path = a;
        else if (a[0] != '-') files[n_files++] = (char *)a;
        else { fprintf(stderr, "forge bench-grammar: unexpected argument '%s'\n", a); free(files); return 2; }
    }
    if (!path) path = forge_cli_env_model();
    if (!path) {
        fprintf(stderr, "usage: forge bench-grammar PATH [SCHEMAS...] [--walks 4] [--steps 64] [--seed 1]\n");
        free(files);
        return 2;
    }
    /* the schema files: directories expanded to their *.json, sorted */
    char **list = NULL;
    size_t n_list = 0, cap_list = 0;
    const char *dflt[1] = {FORGE_SOURCE_DIR "/bench/schemas"};
    char **in = n_files ? files : (char **)dflt;
    int n_in = n_files ? n_files : 1;
    for (int i = 0; i < n_in; i++) {
        DIR *d = opendir(in[i]);
        if (!d) {
            if (n_list == cap_list) list = realloc(list, sizeof *list * (cap_list = cap_list * 2 + 16));
            list[n_list++] = strdup(in[i]);
            continue;
        }
        for (struct dirent *e; (e = readdir(d));) {
            size_t l = strlen(e->d_name);
            if (l < 6 || strcmp(e->d_name + l - 5, ".json")) continue;
            if (n_list == cap_list) list = realloc(list, sizeof *list * (cap_list = cap_list * 2 + 16));
            char *full = malloc(strlen(in[i]) + l + 2);
            sprintf(full, "%s/%s", in[i], e->d_name);
            list[n_list++] = full;
        }
        closedir(d);
    }
    free(files);
    qsort(list, n_list, sizeof *list, cmp_name);
    forge_model *m = forge_cli_load_vocab(path, 0);
    if (!m) return 1;
    int V = forge_model_n_vocab(m);
    size_t words = ((size_t)V + 31) / 32;
    uint32_t *mask = malloc(4 * words);
    int32_t *allowed = malloc(sizeof *allowed * (size_t)V);
    forge_special_tokens sp = {.struct_size = sizeof sp};
    forge_model_special_tokens(m, &sp);
    /* the vocabulary's trie: built by the first grammar */
    double t0 = now_s();
    forge_constraint warm = {.struct_size = sizeof warm, .kind = FORGE_CONSTRAINT_JSON_OBJECT};
    forge_grammar *g = NULL;
    if (forge_grammar_create(m, &warm, &g) != FORGE_OK) {
        fprintf(stderr, "forge bench-grammar: %s\n", forge_model_errmsg(m));
        forge_model_free(m);
        return 1;
    }
    double trie_ms = (now_s() - t0) * 1e3;
    forge_grammar_free(g);
    size_t cap_masks = 1 << 16, n_masks = 0, n_toks = 0;
    double *mask_us = malloc(sizeof(double) * cap_masks), *tok_us = malloc(sizeof(double) * cap_masks);
    double *compile_ms = malloc(sizeof(double) * (n_list + 1));
    size_t compiled = 0;
    uint64_t rng = seed * 0x9e3779b97f4a7c15ull + 1;
    printf("{\"path\": ");
    forge_cli_json_cstr(path);
    printf(", \"vocab\": %d, \"trie_ms\": %.3f, \"schemas\": %zu, \"failed\": [", V, trie_ms, n_list);
    int n_failed = 0;
    for (size_t f = 0; f < n_list; f++) {
        size_t len = 0;
        char *text = forge_cli_read_file(list[f], &len);
        forge_constraint c = {.struct_size = sizeof c, .kind = FORGE_CONSTRAINT_JSON_SCHEMA, .text = text, .text_len = len};
        for (long long w = 0; text && w < walks; w++) {
            double c0 = now_s();
            forge_status st = forge_grammar_create(m, &c, &g);
            double cms = (now_s() - c0) * 1e3;
            if (st != FORGE_OK) {
                printf("%s{\"schema\": ", n_failed++ ? ", " : "");
                forge_cli_json_cstr(list[f]);
                printf(", \"error\": ");
                forge_cli_json_cstr(forge_model_errmsg(m));
                printf("}");
                break;
            }
            if (w == 0) compile_ms[compiled++] = cms;
            for (long long k = 0; k < steps; k++) {
                double m0 = now_s();
                if (forge_grammar_mask(g, mask, words) != FORGE_OK) break;
                double mus = (now_s() - m0) * 1e6;
                if (n_masks == cap_masks) {
                    cap_masks *= 2;
                    mask_us = realloc(mask_us, sizeof(double) * cap_masks);
                    tok_us = realloc(tok_us, sizeof(double) * cap_masks);
                }
                mask_us[n_masks++] = mus;
                int n_allowed = 0;
                for (int t = 0; t < V; t++)
                    if ((mask[t >> 5] >> (t & 31)) & 1) allowed[n_allowed++] = t;
                if (!n_allowed) break;
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                int32_t tok = allowed[(rng >> 33) % (uint64_t)n_allowed];
                int end = 0;
                for (int e = 0; e < sp.n_eos; e++) end |= sp.eos_ids[e] == tok;
                if (end) break;
                double a0 = now_s();
                int ok = forge_grammar_allows(g, tok) && forge_grammar_accept(g, tok) == FORGE_OK;
                tok_us[n_toks++] = (now_s() - a0) * 1e6;
                if (!ok || (forge_grammar_status(g) & FORGE_GRAMMAR_DONE)) break;
            }
            forge_grammar_free(g);
            g = NULL;
        }
        free(text);
    }
    double mean = 0, tmean = 0, mmax = 0;
    for (size_t i = 0; i < n_masks; i++) { mean += mask_us[i]; if (mask_us[i] > mmax) mmax = mask_us[i]; }
    for (size_t i = 0; i < n_toks; i++) tmean += tok_us[i];
    mean = n_masks ? mean / (double)n_masks : 0;
    tmean = n_toks ? tmean / (double)n_toks : 0;
    printf("], \"compiled\": %zu, \"compile_ms\": {\"p50\": %.3f, \"p99\": %.3f, \"max\": %.3f}", compiled, quantile(compile_ms, compiled, 0.5),
           quantile(compile_ms, compiled, 0.99), quantile(compile_ms, compiled, 1.0));
    printf(", \"mask_us\": {\"p50\": %.1f, \"p90\": %.1f, \"p99\": %.1f, \"mean\": %.1f, \"max\": %.1f, \"n\": %zu}", quantile(mask_us, n_masks, 0.5),
           quantile(mask_us, n_masks, 0.9), quantile(mask_us, n_masks, 0.99), mean, mmax, n_masks);
    printf(", \"token_us\": {\"p50\": %.2f, \"p99\": %.2f, \"mean\": %.2f}}\n", quantile(tok_us, n_toks, 0.5), quantile(tok_us, n_toks, 0.99), tmean);
    for (size_t i = 0; i < n_list; i++) free(list[i]);
    free(list);
    free(mask);
    free(allowed);
    free(mask_us);
    free(tok_us);
    free(compile_ms);
    forge_model_free(m);
    return 0;
}
