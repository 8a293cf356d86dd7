/* cli_embed.c: `forge embed` (forge_embed: one vector per text) and `forge rerank`
 * (forge_rerank: one score per document against a query). The texts or documents are the
 * positional arguments after MODEL, or with --stdin-json a JSON array of strings on stdin. The
 * session is classify's (forge_cli_batch_session): a batch holds the longest input and grows
 * toward all the inputs' tokens, the KV cache is scratch for one batch, and neither goes past the
 * model's context (or --ctx). Output:
 * plain lines, or with --json one JSON object (docs/json.md). Ctrl-C stops between batches;
 * the library then returns no results, so nothing is printed, and the exit status is 130. */
#define _DEFAULT_SOURCE 1
#include "cli.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char no_model[] = "no MODEL given (and FORGE_MODEL is not set)";

/* The inputs: the arguments, or the strings of --stdin-json's array (owned by `arr`). */
typedef struct cli_inputs {
    const char **items;
    int n;
    cJSON *arr;
    char *in;
} cli_inputs;

static void inputs_free(cli_inputs *t) {
    free((void *)t->items);
    cJSON_Delete(t->arr);
    free(t->in);
    memset(t, 0, sizeof *t);
}

/* --stdin-json: a non-empty JSON array of strings into t; 0, or 2 after saying what is wrong. */
static int read_json_strings(const char *verb, cli_inputs *t) {
    size_t len = 0;
    t->in = forge_cli_read_stdin(&len);
    t->arr = t->in ? cJSON_ParseWithLength(t->in, len) : NULL;
    if (!cJSON_IsArray(t->arr)) {
        fprintf(stderr, "forge %s: --stdin-json: stdin is not a JSON array of strings\n", verb);
        return 2;
    }
    t->n = cJSON_GetArraySize(t->arr);
    if (t->n == 0) {
        fprintf(stderr, "forge %s: --stdin-json: the array is empty: no %s given\n", verb, !strcmp(verb, "embed") ? "TEXT" : "DOC");
        return 2;
    }
    t->items = malloc(sizeof *t->items * (size_t)t->n);
    if (!t->items) {
        fprintf(stderr, "forge %s: out of host memory\n", verb);
        return 1;
    }
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, t->arr) {
        if (!cJSON_IsString(it)) {
            fprintf(stderr, "forge %s: --stdin-json: element %d is not a string (stdin must be a JSON array of strings)\n", verb, i);
            return 2;
        }
        t->items[i++] = it->valuestring;
    }
    return 0;
}

/* The most tokens a batch may hold: the model's context (n_ctx_train), or --ctx when smaller;
 * 4096 when the model declares none (classify's limit). */
static int token_limit(const forge_model *m, const forge_cli_opts *o) {
    int limit = forge_model_n_ctx_train(m);
    if (limit <= 0 || (o->n_ctx && o->n_ctx < limit)) limit = o->n_ctx ? o->n_ctx : 4096;
    return limit;
}

static int count_tokens(const forge_model *m, const char *text, size_t len, uint32_t flags) {
    size_t n = 0;
    forge_tokenize(m, text, len, flags, NULL, 0, &n);
    return n > INT32_MAX ? INT32_MAX : (int)n;
}

/* One library call on a session for inputs of up to `longest` tokens, `total` in all
 * (forge_cli_batch_session). When `longest` is only an estimate (a prompt or template forge
 * adds, whose length the CLI does not know) and the call finds an input longer than the session
 * holds (FORGE_ERR_LIMIT), it runs again once on a session of the whole limit. *s is the session
 * the last call ran on (NULL when none could be made: the message is out). */
static forge_status run_sized(forge_model *m, const forge_cli_opts *o, int longest, long long total, int exact, int profile, forge_session **s,
                              forge_status (*call)(forge_session *, void *), void *user) {
    int limit = token_limit(m, o);
    for (;;) {
        *s = forge_cli_batch_session(m, o, longest, total, profile);
        if (!*s) return FORGE_ERR_DEVICE;
        forge_status st = call(*s, user);
        if (st != FORGE_ERR_LIMIT || exact || longest >= limit) return st;
        forge_session_free(*s);
        longest = limit;
        exact = 1;
    }
}

/* A float as JSON: %.9g (round-trips a float), null when it is not finite (JSON has no NaN). */
static void json_float(float v) {
    if (isfinite(v)) printf("%.9g", v);
    else fputs("null", stdout);
}

static void json_metrics(const forge_metrics *mt, int n, const char *rate) {
    double per_s = mt->prefill_ms > 0 ? (double)n / (mt->prefill_ms * 1e-3) : 0.0;
    printf("\"metrics\": {\"prompt_tokens\": %d, \"prefill_ms\": %.3f, \"%s\": %.2f}", mt->prompt_tokens, mt->prefill_ms, rate, per_s);
}

static void session_metrics(forge_session *s, forge_metrics *mt) {
    memset(mt, 0, sizeof *mt);
    mt->struct_size = sizeof *mt;
    forge_session_metrics(s, mt);
}

/* ---- forge embed ---- */

typedef struct embed_call {
    const forge_classify_prompt *texts;
    int n;
    forge_embed_params ep;
    float *vectors;
    int dim;
    int oom;
} embed_call;

/* forge_embed with no room first, to learn the vector's length, then into a buffer of that size. */
static forge_status embed_run(forge_session *s, void *user) {
    embed_call *c = (embed_call *)user;
    int dim = 0;
    forge_status st = forge_embed(s, c->texts, c->n, &c->ep, NULL, 0, &dim);
    if (st != FORGE_OK && st != FORGE_ERR_BUFFER_TOO_SMALL) return st;
    free(c->vectors);
    c->vectors = malloc(sizeof(float) * (size_t)c->n * (size_t)(dim > 0 ? dim : 1));
    if (!c->vectors) {
        c->oom = 1;
        return FORGE_ERR_OUT_OF_MEMORY;
    }
    c->dim = dim;
    st = forge_embed(s, c->texts, c->n, &c->ep, c->vectors, (size_t)c->n * (size_t)dim, &dim);
    c->dim = dim;
    return st;
}

/* Whether `name` is one of the comma-separated `list`. */
static int in_list(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && !strncmp(p, name, n)) return 1;
        p += len + (p[len] == ',');
    }
    return 0;
}

int cmd_embed(int argc, char **argv) {
    forge_cli_opts o = {0};
    if (forge_cli_take_common("embed", &argc, argv, &o, 0)) return 2;
    forge_embed_params ep = forge_embed_default_params();
    static const char *const values[] = {"--pooling", "--dim", "--prompt-name", "--prompt", NULL};
    const char *path = NULL;
    int stdin_json = 0, json = 0, normalize = 0, no_normalize = 0, given_prompt = 0, profile = 0;
    cli_inputs t = {0};
    const char **args = malloc(sizeof *args * (size_t)(argc + 1));
    if (!args) { fprintf(stderr, "forge embed: out of host memory\n"); return 1; }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        long long v;
        if (forge_cli_needs_value("embed", a, has, values)) { free(args); return 2; }
        if (!strcmp(a, "--stdin-json")) stdin_json = 1;
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--normalize")) normalize = 1;
        else if (!strcmp(a, "--no-normalize")) no_normalize = 1;
        else if (!strcmp(a, "--no-truncate")) ep.truncate = 0;
        else if (!strcmp(a, "--profile")) profile = 1;
        else if (!strcmp(a, "--pooling") && has) {
            const char *p = argv[++i];
            if (!strcmp(p, "last")) ep.pooling = FORGE_POOLING_LAST;
            else if (!strcmp(p, "mean")) ep.pooling = FORGE_POOLING_MEAN;
            else if (!strcmp(p, "cls")) ep.pooling = FORGE_POOLING_CLS;
            else {
                fprintf(stderr, "forge embed: --pooling takes last, mean or cls, not '%s'\n", p);
                free(args);
                return 2;
            }
        } else if (!strcmp(a, "--dim") && has) {
            if (forge_cli_parse_int("embed", a, argv[++i], 1, INT32_MAX, &v)) { free(args); return 2; }
            ep.dim = (int)v;
        } else if (!strcmp(a, "--prompt-name") && has) {
            ep.prompt_name = argv[++i];
            given_prompt |= 1;
        } else if (!strcmp(a, "--prompt") && has) {
            ep.prompt = argv[++i];
            given_prompt |= 2;
        }
        /* "--x" is an option; a TEXT may start with one dash ("-5 degrees"), as tokenize's */
        else if (!strncmp(a, "--", 2) && a[2]) { free(args); return forge_cli_unexpected("embed", a); }
        else if (!path) path = a;
        else args[t.n++] = a;
    }
    if (normalize && no_normalize) { free(args); return forge_cli_usage_error("embed", "--normalize and --no-normalize contradict each other"); }
    if (given_prompt == 3) { free(args); return forge_cli_usage_error("embed", "--prompt-name and --prompt both give the prompt: give one of them"); }
    ep.normalize = normalize ? 1 : no_normalize ? 0 : -1;
    if (!path) path = forge_cli_env_model(); /* --stdin-json alone (with TEXTs main put FORGE_MODEL first) */
    if (!path) { free(args); return forge_cli_usage_error("embed", no_model); }
    if (stdin_json && t.n) { free(args); return forge_cli_usage_error("embed", "--stdin-json reads stdin: no TEXT argument goes with it"); }
    if (!stdin_json && !t.n) { free(args); return forge_cli_usage_error("embed", "no TEXT given (or --stdin-json)"); }
    int rc = 0;
    if (stdin_json) {
        free(args);
        args = NULL;
        rc = read_json_strings("embed", &t);
    } else {
        t.items = args;
    }
    forge_classify_prompt *texts = rc ? NULL : calloc((size_t)t.n, sizeof *texts);
    if (!rc && !texts) { fprintf(stderr, "forge embed: out of host memory\n"); rc = 1; }
    for (int i = 0; !rc && i < t.n; i++) {
        texts[i].struct_size = sizeof *texts;
        texts[i].text = t.items[i];
        texts[i].text_len = strlen(t.items[i]);
    }
    forge_model *m = rc ? NULL : forge_cli_load(path, &o);
    if (!rc && !m) rc = 1;
    forge_embed_info info = {.struct_size = sizeof info};
    forge_status st = FORGE_OK;
    if (m && (st = forge_embed_info_get(m, &info)) != FORGE_OK) {
        fprintf(stderr, "forge: %s (%s)\n", forge_model_errmsg(m), forge_status_name(st));
        rc = 1;
    }
    /* what the model cannot take is a usage error, said before anything runs */
    if (m && !rc && ep.dim > info.dim && info.dim > 0) {
        fprintf(stderr, "forge embed: --dim: %d is more than the model's vector of %d values\n", ep.dim, info.dim);
        rc = 2;
    }
    if (m && !rc && ep.prompt_name && !in_list(info.prompt_names, ep.prompt_name)) {
        if (info.prompt_names && *info.prompt_names)
            fprintf(stderr, "forge embed: --prompt-name: '%s' is not one of the model's prompts (%s)\n", ep.prompt_name, info.prompt_names);
        else
            fprintf(stderr, "forge embed: --prompt-name: '%s': the model has no prompts (config_sentence_transformers.json names none)\n",
                    ep.prompt_name);
        rc = 2;
    }
    forge_session *s = NULL;
    embed_call call = {texts, t.n, ep, NULL, 0, 0};
    if (m && !rc) {
        /* the longest text with its prompt: exact for --prompt (prepended to the text, as
         * sentence-transformers does) or none; a prompt of the checkpoint's is not known here */
        uint32_t flags = ep.add_special ? FORGE_TOKENIZE_ADD_SPECIAL : 0;
        const char *name = ep.prompt_name ? ep.prompt_name : info.default_prompt_name;
        int exact = ep.prompt != NULL || !name || !*name, longest = 0;
        long long total = 0;
        size_t plen = ep.prompt ? strlen(ep.prompt) : 0;
        for (int i = 0; i < t.n; i++) {
            int len;
            if (plen) {
                char *joined = malloc(plen + texts[i].text_len + 1);
                if (!joined) { len = INT32_MAX; exact = 0; }
                else {
                    memcpy(joined, ep.prompt, plen);
                    memcpy(joined + plen, texts[i].text, texts[i].text_len + 1);
                    len = count_tokens(m, joined, plen + texts[i].text_len, flags);
                    free(joined);
                }
            } else {
                len = count_tokens(m, texts[i].text, texts[i].text_len, flags);
            }
            if (len > longest) longest = len;
            total += ep.truncate && info.max_tokens > 0 && len > info.max_tokens ? info.max_tokens : len;
        }
        if (!exact) longest = longest > INT32_MAX - 256 ? INT32_MAX : longest + 256;
        if (ep.truncate && info.max_tokens > 0 && longest > info.max_tokens) longest = info.max_tokens;
        call.ep.cancel = forge_cli_cancel_flag(); /* Ctrl-C: stop between batches (no results) */
        forge_cli_catch_sigint(NULL, 0);
        st = run_sized(m, &o, longest, total, exact, profile, &s, embed_run, &call);
        if (!s) {
            rc = 1;
        } else if (st != FORGE_OK) {
            if (call.oom) fprintf(stderr, "forge: out of host memory for %d vectors\n", t.n);
            else fprintf(stderr, "forge: %s (%s)\n", forge_session_errmsg(s), forge_status_name(st));
            rc = st == FORGE_ERR_CANCELLED ? 130 : 1;
        } else {
            forge_metrics mt;
            session_metrics(s, &mt);
            const int D = call.dim;
            if (json) {
                printf("{\"model\": ");
                forge_cli_json_cstr(path);
                printf(", \"dim\": %d, \"embeddings\": [", D);
                for (int i = 0; i < t.n; i++) {
                    printf("%s\n  [", i ? "," : "");
                    for (int j = 0; j < D; j++) {
                        if (j) fputs(", ", stdout);
                        json_float(call.vectors[(size_t)i * (size_t)D + (size_t)j]);
                    }
                    putchar(']');
                }
                printf("\n], ");
                json_metrics(&mt, t.n, "texts_per_s");
                printf("}\n");
            } else {
                for (int i = 0; i < t.n; i++) {
                    for (int j = 0; j < D; j++) printf(j ? " %.9g" : "%.9g", call.vectors[(size_t)i * (size_t)D + (size_t)j]);
                    putchar('\n');
                }
            }
            if (o.verbose)
                fprintf(stderr, "[%d texts, %d tokens in %.1f ms, %.1f texts/s]\n", t.n, mt.prompt_tokens, mt.prefill_ms,
                        mt.prefill_ms > 0 ? (double)t.n / (mt.prefill_ms * 1e-3) : 0.0);
            size_t plen = 0;
            if (profile && forge_session_profile(s, NULL, 0, &plen) == FORGE_ERR_BUFFER_TOO_SMALL) { /* device time per kernel */
                char *prof = malloc(plen + 1);
                if (prof && forge_session_profile(s, prof, plen + 1, &plen) == FORGE_OK) fprintf(stderr, "%s\n", prof);
                free(prof);
            }
            rc = forge_cli_interrupted() ? 130 : 0; /* Ctrl-C during the last batch: all printed, then 130 */
        }
        forge_cli_release_sigint();
    }
    forge_session_free(s);
    forge_model_free(m);
    free(call.vectors);
    free(texts);
    if (!stdin_json) t.items = NULL; /* args */
    inputs_free(&t);
    free(args);
    return rc;
}

/* ---- forge rerank ---- */

typedef struct rerank_call {
    const char *query;
    const char *const *docs;
    int n;
    forge_rerank_params rp;
    float *scores;
} rerank_call;

static forge_status rerank_run(forge_session *s, void *user) {
    rerank_call *c = (rerank_call *)user;
    return forge_rerank(s, c->query, c->docs, c->n, &c->rp, c->scores);
}

/* The document's first 60 characters (UTF-8 code points) on one line: tabs, line breaks and
 * other control characters as spaces. */
static void print_head(const char *doc) {
    int chars = 0;
    for (const unsigned char *p = (const unsigned char *)doc; *p; p++) {
        if ((*p & 0xC0) != 0x80 && ++chars > 60) break; /* a character starts here */
        putchar(*p < 0x20 || *p == 0x7f ? ' ' : *p);
    }
}

int cmd_rerank(int argc, char **argv) {
    forge_cli_opts o = {0};
    if (forge_cli_take_common("rerank", &argc, argv, &o, 0)) return 2;
    forge_rerank_params rp = forge_rerank_default_params();
    static const char *const values[] = {"--query", "--instruction", NULL};
    const char *path = NULL, *query = NULL;
    int stdin_json = 0, json = 0;
    cli_inputs t = {0};
    const char **args = malloc(sizeof *args * (size_t)(argc + 1));
    if (!args) { fprintf(stderr, "forge rerank: out of host memory\n"); return 1; }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (forge_cli_needs_value("rerank", a, has, values)) { free(args); return 2; }
        if (!strcmp(a, "--stdin-json")) stdin_json = 1;
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--raw")) rp.raw = 1;
        else if (!strcmp(a, "--no-truncate")) rp.truncate = 0;
        else if (!strcmp(a, "--query") && has) query = argv[++i];
        else if (!strcmp(a, "--instruction") && has) rp.instruction = argv[++i];
        /* "--x" is an option; a DOC may start with one dash */
        else if (!strncmp(a, "--", 2) && a[2]) { free(args); return forge_cli_unexpected("rerank", a); }
        else if (!path) path = a;
        else args[t.n++] = a;
    }
    if (!path) path = forge_cli_env_model();
    if (!path) { free(args); return forge_cli_usage_error("rerank", no_model); }
    if (!query) { free(args); return forge_cli_usage_error("rerank", "--query Q is required"); }
    if (stdin_json && t.n) { free(args); return forge_cli_usage_error("rerank", "--stdin-json reads stdin: no DOC argument goes with it"); }
    if (!stdin_json && !t.n) { free(args); return forge_cli_usage_error("rerank", "no DOC given (or --stdin-json)"); }
    int rc = 0;
    if (stdin_json) {
        free(args);
        args = NULL;
        rc = read_json_strings("rerank", &t);
    } else {
        t.items = args;
    }
    float *scores = rc ? NULL : malloc(sizeof *scores * (size_t)t.n);
    if (!rc && !scores) { fprintf(stderr, "forge rerank: out of host memory\n"); rc = 1; }
    forge_model *m = rc ? NULL : forge_cli_load(path, &o);
    if (!rc && !m) rc = 1;
    forge_session *s = NULL;
    if (m) {
        /* the query, the longest document and the instruction, plus room for what the model's
         * pair template or the reranker's prompt adds (not known here: run_sized then retries) */
        int qlen = count_tokens(m, query, strlen(query), 0), longest = 0;
        int ilen = rp.instruction ? count_tokens(m, rp.instruction, strlen(rp.instruction), 0) : 0;
        long long total = 0;
        for (int i = 0; i < t.n; i++) {
            int len = count_tokens(m, t.items[i], strlen(t.items[i]), 0);
            if (len > longest) longest = len;
            total += (long long)qlen + len + ilen + 256;
        }
        long long est = (long long)qlen + longest + ilen + 256;
        rerank_call call = {query, t.items, t.n, rp, scores};
        call.rp.cancel = forge_cli_cancel_flag(); /* Ctrl-C: stop between batches (no results) */
        forge_cli_catch_sigint(NULL, 0);
        forge_status st = run_sized(m, &o, est > INT32_MAX ? INT32_MAX : (int)est, total, 0, 0, &s, rerank_run, &call);
        if (!s) {
            rc = 1;
        } else if (st != FORGE_OK) {
            fprintf(stderr, "forge: %s (%s)\n", forge_session_errmsg(s), forge_status_name(st));
            rc = st == FORGE_ERR_CANCELLED ? 130 : 1;
        } else {
            forge_metrics mt;
            session_metrics(s, &mt);
            if (json) {
                printf("{\"model\": ");
                forge_cli_json_cstr(path);
                printf(", \"query\": ");
                forge_cli_json_cstr(query);
                printf(", \"scores\": [");
                for (int i = 0; i < t.n; i++) {
                    if (i) fputs(", ", stdout);
                    json_float(scores[i]);
                }
                printf("], ");
                json_metrics(&mt, t.n, "documents_per_s");
                printf("}\n");
            } else {
                for (int i = 0; i < t.n; i++) {
                    printf("%.9g\t%d\t", scores[i], i);
                    print_head(t.items[i]);
                    putchar('\n');
                }
            }
            if (o.verbose)
                fprintf(stderr, "[%d documents, %d tokens in %.1f ms, %.1f documents/s]\n", t.n, mt.prompt_tokens, mt.prefill_ms,
                        mt.prefill_ms > 0 ? (double)t.n / (mt.prefill_ms * 1e-3) : 0.0);
            rc = forge_cli_interrupted() ? 130 : 0;
        }
        forge_cli_release_sigint();
    }
    forge_session_free(s);
    forge_model_free(m);
    free(scores);
    if (!stdin_json) t.items = NULL; /* args */
    inputs_free(&t);
    free(args);
    return rc;
}
