/* cli_batch.c: `forge run MODEL --batch-file FILE`: every line of FILE a prompt, generated
 * together (forge_batch_generate) with the run's sampling options, each sequence's output
 * printed in the file's order once all have finished: labelled text, or with --json one JSON
 * object. Ctrl-C stops every sequence at its next token (FORGE_STOP_CANCELLED; those not started
 * yet with no tokens); the outputs are printed as after any stop, and the exit status is 130. */
#define _DEFAULT_SOURCE 1
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct batch_out {
    char *text;
    size_t len, cap;
    int32_t *ids;              /* the generated tokens */
    size_t n_ids, cap_ids;
} batch_out;

static int batch_collect(void *user, int32_t token, const char *text, size_t len) {
    batch_out *o = (batch_out *)user;
    if (token >= 0 && o->n_ids == o->cap_ids) {
        size_t cap = o->cap_ids ? o->cap_ids * 2 : 64;
        int32_t *ids = realloc(o->ids, sizeof *ids * cap);
        if (!ids) return 1; /* out of memory: stop this sequence */
        o->ids = ids;
        o->cap_ids = cap;
    }
    if (token >= 0) o->ids[o->n_ids++] = token;
    if (o->len + len + 1 > o->cap) {
        size_t cap = (o->len + len + 1) * 2;
        char *t = realloc(o->text, cap);
        if (!t) return 1; /* out of memory: stop this sequence */
        o->text = t;
        o->cap = cap;
    }
    memcpy(o->text + o->len, text, len);
    o->len += len;
    o->text[o->len] = 0;
    return 0;
}

/* The non-empty lines of `path` (without their line ends) into *lines; their count, or -1 with
 * errno saying why (a directory: EISDIR). */
static int read_lines(const char *path, char ***lines) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    int n = 0, cap = 16;
    char **l = malloc(sizeof *l * (size_t)cap);
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    while (l && (len = getline(&line, &lcap, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!len) continue;
        if (n == cap) {
            cap *= 2;
            char **bigger = realloc(l, sizeof *l * (size_t)cap);
            if (!bigger) break;
            l = bigger;
        }
        l[n++] = strdup(line);
    }
    int err = !l ? ENOMEM : ferror(f) ? errno : 0;
    free(line);
    fclose(f);
    if (err && l) {
        for (int i = 0; i < n; i++) free(l[i]);
        free(l);
        l = NULL;
    }
    *lines = l;
    errno = err;
    return l ? n : -1;
}

int forge_cli_run_batch(const char *path, const forge_cli_opts *o, const char *file, const forge_generate_params *gp, int places,
                        int json, int show_metrics) {
    char **lines = NULL;
    int n = read_lines(file, &lines);
    if (n < 0) { fprintf(stderr, "forge run: --batch-file: cannot read '%s': %s\n", file, strerror(errno)); return 2; }
    if (n == 0) { fprintf(stderr, "forge run: --batch-file: '%s' holds no prompt\n", file); free(lines); return 2; }
    forge_model *m = forge_cli_load(path, o);
    int rc = 1, n_places = places > 0 ? places : (n < 16 ? n : 16);
    forge_session *s = NULL;
    forge_batch_item *items = calloc((size_t)n, sizeof *items);
    forge_batch_result *res = calloc((size_t)n, sizeof *res);
    if (res) res[0].struct_size = sizeof *res; /* the array's element size (forge.h) */
    forge_generate_params *ps = calloc((size_t)n, sizeof *ps);
    batch_out *outs = calloc((size_t)n, sizeof *outs);
    if (m && items && res && ps && outs) {
        forge_session_params sp = forge_session_default_params();
        sp.n_ctx = o->n_ctx;
        sp.kv_type = o->kv_type;
        sp.n_seq_max = n_places;
        if (forge_session_create(m, &sp, &s) != FORGE_OK) fprintf(stderr, "forge: %s\n", forge_model_errmsg(m));
    }
    if (s) {
        for (int i = 0; i < n; i++) {
            ps[i] = *gp;
            ps[i].on_token = batch_collect;
            ps[i].user_data = &outs[i];
            ps[i].cancel = forge_cli_cancel_flag(); /* Ctrl-C stops every sequence at its next token */
            items[i] = (forge_batch_item){sizeof(forge_batch_item), lines[i], strlen(lines[i]), NULL, 0, &ps[i]};
        }
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        forge_cli_catch_sigint(NULL, 0);
        forge_status st = forge_batch_generate(s, items, n, res);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
        long long total = 0;
        int failed = 0;
        for (int i = 0; i < n; i++) {
            total += res[i].metrics.generated_tokens;
            failed += res[i].status != FORGE_OK;
        }
        if (st != FORGE_OK) {
            fprintf(stderr, "forge: %s (%s)\n", forge_session_errmsg(s), forge_status_name(st));
        } else if (json) {
            printf("{\"items\": [");
            for (int i = 0; i < n; i++) {
                const forge_metrics *mt = &res[i].metrics;
                printf("%s\n  {\"prompt\": ", i ? "," : "");
                forge_cli_json_cstr(lines[i]);
                printf(", \"text\": ");
                forge_cli_json_string(outs[i].text ? outs[i].text : "", outs[i].len);
                printf(", \"ids\": ");
                forge_cli_json_ids(outs[i].ids, outs[i].n_ids);
                printf(", \"status\": \"%s\", \"stop_reason\": \"%s\", \"prompt_tokens\": %d, \"generated_tokens\": %d, "
                       "\"ttft_ms\": %.3f, \"decode_tok_s\": %.2f}",
                       forge_status_name(res[i].status), forge_cli_stop_name(mt->stop_reason), mt->prompt_tokens, mt->generated_tokens,
                       mt->ttft_ms, mt->decode_tok_s);
            }
            printf("\n], \"places\": %d, \"generated_tokens\": %lld, \"ms\": %.3f, \"tok_s\": %.2f}\n", n_places, total, ms,
                   ms > 0 ? (double)total / (ms * 1e-3) : 0.0);
        } else {
            for (int i = 0; i < n; i++) {
                printf("=== [%d] %s, %d tokens ===\n", i, res[i].status ? forge_status_name(res[i].status) : forge_cli_stop_name(res[i].metrics.stop_reason),
                       res[i].metrics.generated_tokens);
                if (res[i].status) {
                    printf("%s\n", lines[i]);
                    continue;
                }
                printf("%s%s\n", lines[i], outs[i].text ? outs[i].text : "");
            }
            if (show_metrics || o->verbose)
                fprintf(stderr, "[%d prompts, %lld tokens generated in %.1f ms: %.1f tok/s]\n", n, total, ms,
                        ms > 0 ? (double)total / (ms * 1e-3) : 0.0);
        }
        if (failed) fprintf(stderr, "forge: %d of %d prompts failed; the last: %s\n", failed, n, forge_session_errmsg(s));
        rc = st != FORGE_OK || failed ? 1 : forge_cli_interrupted() ? 130 : 0;
        forge_session_free(s);
    }
    for (int i = 0; i < n; i++) {
        free(lines[i]);
        if (outs) free(outs[i].text);
        if (outs) free(outs[i].ids);
    }
    free(lines);
    free(items);
    free(res);
    free(ps);
    free(outs);
    forge_model_free(m);
    return rc;
}
