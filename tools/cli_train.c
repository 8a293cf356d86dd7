/* cli_train.c: `forge train`, LoRA fine-tuning from JSON-lines data (forge_trainer_*).
 *
 * Data lines follow mlx-lm's formats: {"text"}, {"messages"}, {"prompt", "completion"}, and
 * pre-tokenized {"input_ids", "labels"} (HuggingFace labels: -100 is not counted). Every file
 * is read and tokenized before training starts, so a bad line fails at once, naming FILE:LINE.
 * Examples are taken in file order (or shuffled per epoch), cycling; a batch is the next
 * --batch examples right-padded to the longest of them. Each optimizer step is --accum
 * micro-batches. Exit status: 0 done, 1 runtime or data error, 2 usage, 130 interrupted
 * (after saving). */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define IGNORE_LABEL (-100)

/* The full usage; the library's defaults come from forge_train_default_params(). */
static void train_usage(FILE *f) {
    forge_train_params d = forge_train_default_params();
    static const char *schedules[] = {"constant", "linear", "cosine"};
    fprintf(f,
            "usage: forge train MODEL --data FILE.jsonl --out DIR [options]\n"
            "LoRA fine-tuning: trains low-rank adapters on MODEL's projections and saves them to DIR.\n"
            "MODEL (or -m MODEL) may be left out when the FORGE_MODEL environment variable names it.\n"
            "data:\n"
            "  --data FILE.jsonl        training examples, one JSON object a line: {\"text\"},\n"
            "                           {\"messages\": [{\"role\", \"content\"}, ...]}, {\"prompt\", \"completion\"},\n"
            "                           or {\"input_ids\": [...], \"labels\": [...]} (label -100: not trained on)\n"
            "  --valid FILE.jsonl       validation examples: loss every --eval-every steps and at the end\n"
            "  --mask-prompt            train on the completion / the assistant turns only\n"
            "  --shuffle                shuffle the examples every epoch (seeded by --seed)\n"
            "  --batch B                sequences per micro-batch (default 4)\n"
            "  --seq T                  most tokens per sequence; longer examples are truncated\n"
            "                           (default 512, or the model's context if shorter)\n"
            "adapter:\n"
            "  --adapter DIR            start from this adapter (PEFT or mlx-lm); its rank, alpha and\n"
            "                           targets are used\n");
    fprintf(f,
            "  --rank R                 LoRA rank (default %d)\n"
            "  --alpha A                scale = alpha / rank (default %g)\n"
            "  --dropout P              dropout on the adapters' input, in [0, 1) (default %g)\n"
            "  --targets LIST|all       from q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj\n"
            "                           and Qwen 3.5's in_proj_qkv,in_proj_z,in_proj_b,in_proj_a,out_proj\n"
            "                           (default %s)\n"
            "  --layers N               adapt the last N layers only (default 0: all)\n",
            d.rank, d.alpha, d.dropout, d.targets ? d.targets : "q_proj,v_proj");
    fprintf(f,
            "optimizer (AdamW, as torch.optim.AdamW):\n"
            "  --lr LR                  learning rate (default %g)\n"
            "  --weight-decay WD        decoupled weight decay (default %g)\n"
            "  --betas B1,B2            (default %g,%g)\n"
            "  --eps E                  (default %g)\n"
            "  --schedule S             constant, linear or cosine over --steps (default %s)\n"
            "  --warmup N               linear warmup over N steps (default %d)\n"
            "  --clip C                 clip the global gradient norm to C; 0: off (default %g)\n"
            "  --steps N                optimizer steps (default 100)\n"
            "  --accum K                micro-batches per optimizer step (default 1)\n"
            "  --grad-checkpoint        recompute each layer in the backward pass: less device memory\n"
            "  --no-grad-checkpoint     keep every activation (default: checkpoint when batch * seq >= 4096)\n"
            "  --seed S                 adapter initialisation, dropout and --shuffle (default %llu)\n",
            d.lr, d.weight_decay, d.beta1, d.beta2, d.eps, (unsigned)d.schedule < 3 ? schedules[d.schedule] : "constant",
            d.warmup_steps, d.max_grad_norm, (unsigned long long)d.seed);
    fprintf(f,
            "output:\n"
            "  --out DIR                where the adapter is saved (created if missing)\n"
            "  --format peft|mlx        files for transformers + peft, or for mlx-lm (default peft)\n"
            "  --save-every N           also save every N steps (default 0: at the end only)\n"
            "  --eval-every N           validate every N steps (default 0: at the end only)\n"
            "  --json                   stdout: one JSON object per step, per validation and at the end\n"
            "                           (docs/json.md); otherwise progress goes to stderr, a bar\n"
            "                           redrawn in place when stderr is a terminal\n"
            "  --device INDEX|NAME      choose the Vulkan device\n"
            "  -v                       log to stderr\n"
            "Ctrl-C finishes the current step, saves to --out and exits with status 130.\n");
}

/* A usage error: prints "forge train: MESSAGE". Returns 2. */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static int usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("forge train: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 2;
}

/* ---- growable token vectors ---- */

typedef struct ivec {
    int32_t *p;
    size_t n, cap;
} ivec;

static int ivec_reserve(ivec *v, size_t n) {
    if (n <= v->cap) return 0;
    size_t cap = v->cap ? v->cap : 64;
    while (cap < n) cap *= 2;
    int32_t *p = realloc(v->p, sizeof *p * cap);
    if (!p) return -1;
    v->p = p;
    v->cap = cap;
    return 0;
}

static int ivec_push(ivec *v, int32_t x) {
    if (ivec_reserve(v, v->n + 1)) return -1;
    v->p[v->n++] = x;
    return 0;
}

/* ---- data ---- */

typedef struct example {
    int32_t *tokens; /* n ids */
    int32_t *labels; /* n HF labels (IGNORE_LABEL: not counted) */
    int n;
    int64_t targets; /* counted targets: labels[1..n) that are not IGNORE_LABEL */
} example;

typedef struct dataset {
    const char *path;
    example *ex;
    int n, cap;
    int64_t n_tokens;  /* after truncation */
    int64_t n_targets; /* after truncation */
    int n_truncated, longest, n_dropped;
} dataset;

typedef struct data_ctx {
    forge_model *m;
    int n_vocab;
    int has_tokenizer;
    int has_chat;      /* the model has a chat format (forge_chat_render works) */
    int32_t eos;       /* -1: none */
    int mask_prompt;
    int seq;           /* --seq: examples are truncated to it */
} data_ctx;

/* What the data lines need from the model: its vocabulary, whether it has a tokenizer and a
 * chat format, its end token. */
static data_ctx data_ctx_for(forge_model *m, int mask_prompt, int seq) {
    data_ctx c = {0};
    c.m = m;
    c.n_vocab = forge_model_n_vocab(m);
    c.mask_prompt = mask_prompt;
    c.seq = seq;
    c.eos = -1;
    c.has_tokenizer = forge_cli_has_tokenizer(m);
    forge_special_tokens sp = {.struct_size = sizeof sp};
    if (c.has_tokenizer && forge_model_special_tokens(m, &sp) == FORGE_OK) c.eos = sp.eos;
    forge_chat_message hello = {.struct_size = sizeof hello, .role = "user", .content = "hello"};
    size_t need = 0;
    forge_status st = c.has_tokenizer ? forge_chat_render(m, &hello, 1, 0, NULL, 0, &need) : FORGE_ERR_UNSUPPORTED;
    c.has_chat = c.has_tokenizer && st != FORGE_ERR_UNSUPPORTED; /* a template rejects a conversation later, by line */
    return c;
}

/* Reports a problem with FILE:LINE; returns -1. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int line_error(const char *file, long line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "forge train: %s:%ld: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return -1;
}

/* Appends the ids of text[0..len) to v. 0, or -1 (message printed). */
static int tokenize_into(const data_ctx *c, const char *file, long ln, const char *text, size_t len, uint32_t flags, ivec *v) {
    size_t n = 0;
    if (ivec_reserve(v, v->n + len + 16)) return line_error(file, ln, "out of host memory");
    forge_status st = forge_tokenize(c->m, text, len, flags, v->p + v->n, v->cap - v->n, &n);
    if (st == FORGE_ERR_BUFFER_TOO_SMALL) {
        if (ivec_reserve(v, v->n + n)) return line_error(file, ln, "out of host memory");
        st = forge_tokenize(c->m, text, len, flags, v->p + v->n, v->cap - v->n, &n);
    }
    if (st != FORGE_OK) return line_error(file, ln, "tokenizing: %s (%s)", forge_model_errmsg(c->m), forge_status_name(st));
    v->n += n;
    return 0;
}

/* Renders messages[0..n) with the model's chat template into *out (malloc'd). 0, or -1. */
static int render_chat(const data_ctx *c, const char *file, long ln, const forge_chat_message *msgs, int n, uint32_t flags,
                       char **out, size_t *len) {
    size_t need = 0;
    *out = NULL;
    forge_status st = forge_chat_render(c->m, msgs, n, flags, NULL, 0, &need);
    if (st == FORGE_ERR_BUFFER_TOO_SMALL) {
        char *buf = malloc(need + 1);
        if (!buf) return line_error(file, ln, "out of host memory");
        st = forge_chat_render(c->m, msgs, n, flags, buf, need + 1, &need);
        if (st == FORGE_OK) {
            *out = buf;
            *len = need;
            return 0;
        }
        free(buf);
    }
    if (st == FORGE_OK) { /* cannot happen with capacity 0, but stay safe */
        *out = calloc(1, 1);
        *len = 0;
        return *out ? 0 : line_error(file, ln, "out of host memory");
    }
    return line_error(file, ln, "the chat template: %s (%s)", forge_model_errmsg(c->m), forge_status_name(st));
}

/* The number of tokens of the rendered messages[0..n) (tokenized with flags 0). -1 on error. */
static long chat_token_count(const data_ctx *c, const char *file, long ln, const forge_chat_message *msgs, int n, uint32_t flags) {
    char *text;
    size_t len;
    if (render_chat(c, file, ln, msgs, n, flags, &text, &len)) return -1;
    ivec v = {0};
    int r = tokenize_into(c, file, ln, text, len, 0, &v);
    free(text);
    free(v.p);
    return r ? -1 : (long)v.n;
}

/* Tokens and labels of a conversation (rendered without the generation prompt, tokenized with
 * flags 0: the template writes BOS). With mask_prompt only assistant turns keep their labels:
 * for assistant message i, the tokens from len(tokens(render(messages[0..i), with the generation
 * prompt))) to len(tokens(render(messages[0..i], without it))), or to the end when
 * completion_style (a prompt/completion line, as mlx-lm's CompletionsDataset). */
static int chat_example(const data_ctx *c, const char *file, long ln, const forge_chat_message *msgs, int n, ivec *tok, ivec *lab,
                        int completion_style) {
    if (!c->has_chat)
        return line_error(file, ln,
                          "the model has no chat format (Llama 3, ChatML, Gemma), so this line cannot be rendered; use "
                          "{\"text\"} or {\"input_ids\"} lines");
    char *text;
    size_t len;
    if (render_chat(c, file, ln, msgs, n, FORGE_CHAT_NO_GENERATION_PROMPT, &text, &len)) return -1;
    int r = tokenize_into(c, file, ln, text, len, 0, tok);
    free(text);
    if (r) return -1;
    if (ivec_reserve(lab, tok->n)) return line_error(file, ln, "out of host memory");
    lab->n = tok->n;
    if (!c->mask_prompt) {
        memcpy(lab->p, tok->p, sizeof(int32_t) * tok->n);
        return 0;
    }
    for (size_t i = 0; i < lab->n; i++) lab->p[i] = IGNORE_LABEL;
    for (int i = 0; i < n; i++) {
        if (strcmp(msgs[i].role, "assistant")) continue;
        long start = chat_token_count(c, file, ln, msgs, i, 0);
        if (start < 0) return -1;
        long end = (long)tok->n;
        if (!completion_style) {
            end = chat_token_count(c, file, ln, msgs, i + 1, FORGE_CHAT_NO_GENERATION_PROMPT);
            if (end < 0) return -1;
            if (end > (long)tok->n) end = (long)tok->n;
        }
        for (long k = start; k < end; k++) lab->p[k] = tok->p[k];
    }
    return 0;
}

/* A JSON string member, or NULL when absent or not a string. */
static const char *member_string(const cJSON *obj, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

/* Reads a JSON array of integers into v; names `what` and the index in errors. */
static int json_int_array(const data_ctx *c, const char *file, long ln, const cJSON *arr, const char *what, int labels, ivec *v) {
    if (!cJSON_IsArray(arr)) return line_error(file, ln, "\"%s\" is not an array of integers", what);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        double d = it && cJSON_IsNumber(it) ? it->valuedouble : NAN;
        if (!(d == floor(d))) return line_error(file, ln, "%s[%d] is not an integer", what, i);
        if (!(labels && d == IGNORE_LABEL) && (d < 0 || d >= c->n_vocab))
            return line_error(file, ln, "%s[%d] = %.0f is outside the vocabulary (0..%d%s)", what, i, d, c->n_vocab - 1,
                              labels ? ", or -100" : "");
        int32_t x = (int32_t)d;
        if (ivec_push(v, x)) return line_error(file, ln, "out of host memory");
        i++;
    }
    return 0;
}

/* Parses one non-blank line into tok / lab. 0, or -1 after printing FILE:LINE: why. */
static int parse_line(const data_ctx *c, const char *file, long ln, const char *line, size_t len, ivec *tok, ivec *lab) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(line, len + 1, &end, 1); /* + 1: the NUL, so trailing text is an error */
    if (!j) {
        long col = end && end >= line && end <= line + len ? (long)(end - line) + 1 : 0;
        return col ? line_error(file, ln, "not valid JSON (at column %ld)", col) : line_error(file, ln, "not valid JSON");
    }
    int rc = -1;
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "input_ids");
    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(j, "messages");
    int has_prompt = cJSON_GetObjectItemCaseSensitive(j, "prompt") != NULL;
    int has_completion = cJSON_GetObjectItemCaseSensitive(j, "completion") != NULL;
    int has_text = cJSON_GetObjectItemCaseSensitive(j, "text") != NULL;
    if (!cJSON_IsObject(j)) {
        line_error(file, ln, "expected a JSON object, one example a line");
    } else if (ids) {
        const cJSON *labels = cJSON_GetObjectItemCaseSensitive(j, "labels");
        if (json_int_array(c, file, ln, ids, "input_ids", 0, tok)) goto done;
        if (labels && !cJSON_IsNull(labels)) {
            if (json_int_array(c, file, ln, labels, "labels", 1, lab)) goto done;
            if (lab->n != tok->n) {
                line_error(file, ln, "\"labels\" has %zu entries and \"input_ids\" %zu: they must be aligned", lab->n, tok->n);
                goto done;
            }
        } else {
            if (ivec_reserve(lab, tok->n)) { line_error(file, ln, "out of host memory"); goto done; }
            if (tok->n) memcpy(lab->p, tok->p, sizeof(int32_t) * tok->n);
            lab->n = tok->n;
        }
        rc = 0;
    } else if (!c->has_tokenizer && (messages || has_prompt || has_completion || has_text)) {
        line_error(file, ln, "the model has no tokenizer: only pre-tokenized {\"input_ids\": [...]} lines can be used");
    } else if (messages) {
        if (!cJSON_IsArray(messages)) { line_error(file, ln, "\"messages\" is not an array"); goto done; }
        int n = cJSON_GetArraySize(messages);
        if (n == 0) { line_error(file, ln, "empty example: \"messages\" is empty"); goto done; }
        forge_chat_message *msgs = malloc(sizeof *msgs * (size_t)n);
        if (!msgs) { line_error(file, ln, "out of host memory"); goto done; }
        int k = 0, n_assistant = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, messages) {
            const char *role = cJSON_IsObject(it) ? member_string(it, "role") : NULL;
            const char *content = cJSON_IsObject(it) ? member_string(it, "content") : NULL;
            if (!cJSON_IsObject(it)) { line_error(file, ln, "messages[%d] is not an object", k); break; }
            if (!role) { line_error(file, ln, "messages[%d] has no string \"role\"", k); break; }
            if (!content) { line_error(file, ln, "messages[%d] has no string \"content\"", k); break; }
            n_assistant += !strcmp(role, "assistant");
            msgs[k++] = (forge_chat_message){.struct_size = sizeof(forge_chat_message), .role = role, .content = content};
        }
        if (k == n) {
            if (c->mask_prompt && !n_assistant)
                line_error(file, ln, "--mask-prompt: no \"assistant\" message, so nothing would be trained on");
            else rc = chat_example(c, file, ln, msgs, n, tok, lab, 0);
        }
        free(msgs);
    } else if (has_prompt || has_completion) {
        const char *prompt = member_string(j, "prompt");
        const char *completion = member_string(j, "completion");
        if (!has_prompt || !has_completion) {
            line_error(file, ln, "has \"%s\" but no \"%s\"", has_prompt ? "prompt" : "completion", has_prompt ? "completion" : "prompt");
        } else if (!prompt || !completion) {
            line_error(file, ln, "\"%s\" is not a string", prompt ? "completion" : "prompt");
        } else if (c->has_chat) {
            forge_chat_message msgs[2] = {{.struct_size = sizeof(forge_chat_message), .role = "user", .content = prompt}, {.struct_size = sizeof(forge_chat_message), .role = "assistant", .content = completion}};
            rc = chat_example(c, file, ln, msgs, 2, tok, lab, 1);
        } else {
            /* No chat format: prompt (with BOS as the tokenizer declares), completion, EOS. */
            if (tokenize_into(c, file, ln, prompt, strlen(prompt), FORGE_TOKENIZE_ADD_SPECIAL, tok)) goto done;
            size_t n_prompt = tok->n;
            if (tokenize_into(c, file, ln, completion, strlen(completion), 0, tok)) goto done;
            if (c->eos >= 0 && (tok->n == 0 || tok->p[tok->n - 1] != c->eos) && ivec_push(tok, c->eos)) {
                line_error(file, ln, "out of host memory");
                goto done;
            }
            if (ivec_reserve(lab, tok->n)) { line_error(file, ln, "out of host memory"); goto done; }
            for (size_t i = 0; i < tok->n; i++) lab->p[i] = c->mask_prompt && i < n_prompt ? IGNORE_LABEL : tok->p[i];
            lab->n = tok->n;
            rc = 0;
        }
    } else if (has_text) {
        const char *text = member_string(j, "text");
        if (!text) {
            line_error(file, ln, "\"text\" is not a string");
        } else if (c->mask_prompt) {
            line_error(file, ln, "--mask-prompt needs {\"prompt\", \"completion\"} or {\"messages\"} lines; a {\"text\"} line has no prompt");
        } else if (!*text) {
            line_error(file, ln, "empty example: \"text\" is \"\"");
        } else if (!tokenize_into(c, file, ln, text, strlen(text), FORGE_TOKENIZE_ADD_SPECIAL, tok)) {
            if (c->eos >= 0 && (tok->n == 0 || tok->p[tok->n - 1] != c->eos) && ivec_push(tok, c->eos)) {
                line_error(file, ln, "out of host memory");
                goto done;
            }
            if (ivec_reserve(lab, tok->n)) { line_error(file, ln, "out of host memory"); goto done; }
            memcpy(lab->p, tok->p, sizeof(int32_t) * tok->n);
            lab->n = tok->n;
            rc = 0;
        }
    } else {
        line_error(file, ln,
                   "unknown example: expected \"text\", \"messages\", \"prompt\" and \"completion\", or \"input_ids\" "
                   "(and \"labels\")");
    }
done:
    cJSON_Delete(j);
    if (rc == 0 && tok->n == 0) rc = line_error(file, ln, "empty example: no tokens");
    return rc;
}

static void dataset_free(dataset *d) {
    for (int i = 0; i < d->n; i++) {
        free(d->ex[i].tokens);
        free(d->ex[i].labels);
    }
    free(d->ex);
    memset(d, 0, sizeof *d);
}

static int64_t count_targets(const int32_t *labels, int n) {
    int64_t t = 0;
    for (int i = 1; i < n; i++) t += labels[i] != IGNORE_LABEL;
    return t;
}

/* Reads and tokenizes every line of f into d. 0, or -1 after printing why. */
static int load_dataset(const data_ctx *c, FILE *f, const char *path, dataset *d) {
    memset(d, 0, sizeof *d);
    d->path = path;
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    long ln = 0;
    int rc = 0;
    ivec tok = {0}, lab = {0};
    errno = 0;
    while ((got = getline(&line, &line_cap, f)) >= 0) {
        ln++;
        size_t len = (size_t)got;
        char *s = line;
        if (ln == 1 && len >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3)) { s += 3; len -= 3; } /* a UTF-8 BOM */
        if (memchr(s, 0, len)) { rc = line_error(path, ln, "contains a NUL byte"); break; }
        while (len && (s[len - 1] == '\n' || s[len - 1] == '\r')) s[--len] = 0;
        if (s[strspn(s, " \t\r\n")] == 0) continue; /* blank */
        tok.n = lab.n = 0;
        if (parse_line(c, path, ln, s, len, &tok, &lab)) { rc = -1; break; }
        if (tok.n > (size_t)INT_MAX) { rc = line_error(path, ln, "%zu tokens are too many", tok.n); break; }
        int n = (int)tok.n;
        int64_t all_targets = count_targets(lab.p, n);
        if (all_targets == 0) {
            rc = line_error(path, ln, "nothing to train on: no label other than -100 after the first token (%d token%s)", n,
                            n == 1 ? "" : "s");
            break;
        }
        if (n > c->seq) {
            d->n_truncated++;
            if (n > d->longest) d->longest = n;
            n = c->seq;
        }
        int64_t targets = count_targets(lab.p, n);
        if (targets == 0) { /* every counted label lay beyond --seq */
            d->n_dropped++;
            continue;
        }
        if (d->n == d->cap) {
            int cap = d->cap ? d->cap * 2 : 256;
            example *ex = realloc(d->ex, sizeof *ex * (size_t)cap);
            if (!ex) { rc = line_error(path, ln, "out of host memory"); break; }
            d->ex = ex;
            d->cap = cap;
        }
        example *e = &d->ex[d->n];
        e->tokens = malloc(sizeof(int32_t) * (size_t)n);
        e->labels = malloc(sizeof(int32_t) * (size_t)n);
        if (!e->tokens || !e->labels) {
            free(e->tokens);
            free(e->labels);
            rc = line_error(path, ln, "out of host memory");
            break;
        }
        memcpy(e->tokens, tok.p, sizeof(int32_t) * (size_t)n);
        memcpy(e->labels, lab.p, sizeof(int32_t) * (size_t)n);
        e->n = n;
        e->targets = targets;
        d->n++;
        d->n_tokens += n;
        d->n_targets += targets;
    }
    if (!rc && ferror(f)) {
        fprintf(stderr, "forge train: %s: read error after line %ld: %s\n", path, ln, strerror(errno));
        rc = -1;
    }
    free(line);
    free(tok.p);
    free(lab.p);
    if (!rc && d->n_truncated)
        fprintf(stderr, "forge train: warning: %d example%s of %s longer than --seq %d tokens (the longest has %d) truncated to %d\n",
                d->n_truncated, d->n_truncated == 1 ? "" : "s", path, c->seq, d->longest, c->seq);
    if (!rc && d->n_dropped)
        fprintf(stderr, "forge train: warning: %d example%s of %s left out: nothing to train on within the first %d tokens\n",
                d->n_dropped, d->n_dropped == 1 ? "" : "s", path, c->seq);
    if (!rc && d->n == 0) {
        fprintf(stderr, "forge train: %s: no examples\n", path);
        rc = -1;
    }
    if (rc) dataset_free(d);
    return rc;
}

/* ---- batches ---- */

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n), without modulo bias. */
static uint64_t rand_below(uint64_t *state, uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do r = splitmix64(state);
    while (r >= limit);
    return r % n;
}

/* The order examples are taken in: file order, or a new permutation every epoch. */
typedef struct sampler {
    int *order;
    int n, pos, shuffle;
    uint64_t rng;
} sampler;

static void sampler_shuffle(sampler *s) {
    for (int i = s->n - 1; i > 0; i--) {
        int j = (int)rand_below(&s->rng, (uint64_t)i + 1);
        int t = s->order[i];
        s->order[i] = s->order[j];
        s->order[j] = t;
    }
}

static int sampler_init(sampler *s, int n, int shuffle, uint64_t seed) {
    s->order = malloc(sizeof(int) * (size_t)n);
    if (!s->order) return -1;
    s->n = n;
    s->pos = 0;
    s->shuffle = shuffle;
    s->rng = seed ^ 0x5DEECE66Dull; /* a stream apart from the trainer's use of the seed */
    for (int i = 0; i < n; i++) s->order[i] = i;
    if (shuffle) sampler_shuffle(s);
    return 0;
}

static int sampler_next(sampler *s) {
    if (s->pos == s->n) {
        s->pos = 0;
        if (s->shuffle) sampler_shuffle(s);
    }
    return s->order[s->pos++];
}

typedef struct batch_buf {
    int32_t *tokens, *labels, *lengths; /* [batch * seq], [batch * seq], [batch] */
} batch_buf;

/* Lays out examples idx[0..n) right-padded (id 0, label -100) to the longest of them. Returns
 * the real tokens in the batch. */
static int64_t fill_batch(const dataset *d, const int *idx, int n, batch_buf *b, forge_train_batch *out) {
    int T = 1;
    for (int i = 0; i < n; i++)
        if (d->ex[idx[i]].n > T) T = d->ex[idx[i]].n;
    int64_t real = 0;
    for (int i = 0; i < n; i++) {
        const example *e = &d->ex[idx[i]];
        int32_t *tr = b->tokens + (size_t)i * (size_t)T, *lr = b->labels + (size_t)i * (size_t)T;
        memcpy(tr, e->tokens, sizeof(int32_t) * (size_t)e->n);
        memcpy(lr, e->labels, sizeof(int32_t) * (size_t)e->n);
        for (int t = e->n; t < T; t++) {
            tr[t] = 0;
            lr[t] = IGNORE_LABEL;
        }
        b->lengths[i] = e->n;
        real += e->n;
    }
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->n_seqs = n;
    out->seq_len = T;
    out->tokens = b->tokens;
    out->lengths = b->lengths;
    out->labels = b->labels;
    return real;
}

/* Ctrl-C (cli_common.c's handler): the step finishes, the adapter is saved, the status is 130;
 * a second Ctrl-C kills (the default action). */
static const char sigint_note[] = "\nforge train: interrupted: finishing this step, then saving (Ctrl-C again quits without saving)\n";

/* ---- the command ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A number as JSON with printf format fmt (null when not finite). */
static void json_num(const char *fmt, double v) {
    if (isfinite(v)) printf(fmt, v);
    else fputs("null", stdout);
}

static void format_eta(double s, char *out, size_t cap) {
    if (!isfinite(s) || s < 0) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(out, cap, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) snprintf(out, cap, "%ldm%02lds", t / 60, t % 60);
    else snprintf(out, cap, "%lds", t);
}

typedef struct train_args {
    const char *model, *data, *valid, *out, *adapter, *targets, *format_name;
    forge_train_params tp;
    int batch, seq, steps, save_every, eval_every, json, shuffle, mask_prompt;
    int rank_set, alpha_set, targets_set, seq_set;
    forge_adapter_format format;
    forge_cli_opts common;
} train_args;

/* Parses argv into a; 0, 1 for --help, 2 after printing the usage error, or 3 after printing
 * that an argument is not one train takes (the caller prints the usage). */
static int parse_args(int argc, char **argv, train_args *a) {
    forge_train_params *tp = &a->tp;
    if (forge_cli_take_common("train", &argc, argv, &a->common, 0)) return 2;
    if (a->common.n_ctx) return usage_error("--ctx does not apply to train (the sequence length is --seq)");
    for (int i = 0; i < argc; i++) {
        const char *f = argv[i];
        long long v;
        double d;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) return 1;
        if (!strcmp(f, "--json")) { a->json = 1; continue; }
        if (!strcmp(f, "--shuffle")) { a->shuffle = 1; continue; }
        if (!strcmp(f, "--mask-prompt")) { a->mask_prompt = 1; continue; }
        if (!strcmp(f, "--grad-checkpoint")) { tp->grad_checkpoint = 1; continue; }
        if (!strcmp(f, "--no-grad-checkpoint")) { tp->grad_checkpoint = 0; continue; }
        if (f[0] != '-' || !f[1]) {
            if (a->model) return usage_error("unexpected argument '%s' (MODEL is '%s')", f, a->model);
            a->model = f;
            continue;
        }
        static const char *with_value[] = {"--data", "--out", "--valid", "--adapter", "--rank", "--alpha", "--dropout", "--targets",
                                           "--layers", "--lr", "--weight-decay", "--betas", "--eps", "--schedule", "--warmup",
                                           "--batch", "--seq", "--steps", "--accum", "--clip", "--seed", "--save-every",
                                           "--eval-every", "--format"};
        size_t k = 0;
        while (k < sizeof with_value / sizeof with_value[0] && strcmp(f, with_value[k])) k++;
        if (k == sizeof with_value / sizeof with_value[0]) {
            usage_error("unexpected argument '%s'", f);
            return 3; /* the caller prints the whole usage */
        }
        if (i + 1 >= argc) return usage_error("%s needs a value", f);
        const char *s = argv[++i];
        if (!strcmp(f, "--data")) a->data = s;
        else if (!strcmp(f, "--out")) a->out = s;
        else if (!strcmp(f, "--valid")) a->valid = s;
        else if (!strcmp(f, "--adapter")) a->adapter = s;
        else if (!strcmp(f, "--rank")) {
            if (forge_cli_parse_int("train", f, s, 1, 65536, &v)) return 2;
            tp->rank = (int)v;
            a->rank_set = 1;
        } else if (!strcmp(f, "--alpha")) {
            if (forge_cli_parse_double("train", f, s, 0, 1, INFINITY, 0, &d)) return 2;
            tp->alpha = (float)d;
            a->alpha_set = 1;
        } else if (!strcmp(f, "--dropout")) {
            if (forge_cli_parse_double("train", f, s, 0, 0, 1, 1, &d)) return 2;
            tp->dropout = (float)d;
        } else if (!strcmp(f, "--targets")) {
            if (forge_cli_check_targets("train", f, s)) return 2;
            a->targets = s;
            a->targets_set = 1;
        } else if (!strcmp(f, "--layers")) {
            if (forge_cli_parse_int("train", f, s, 0, INT_MAX, &v)) return 2;
            tp->n_layers = (int)v;
        } else if (!strcmp(f, "--lr")) {
            if (forge_cli_parse_double("train", f, s, 0, 1, INFINITY, 0, &d)) return 2;
            tp->lr = d;
        } else if (!strcmp(f, "--weight-decay")) {
            if (forge_cli_parse_double("train", f, s, 0, 0, INFINITY, 0, &d)) return 2;
            tp->weight_decay = d;
        } else if (!strcmp(f, "--betas")) {
            const char *comma = strchr(s, ',');
            char b1[64];
            if (!comma || (size_t)(comma - s) >= sizeof b1)
                return usage_error("--betas: '%s' is not two numbers B1,B2 (each in [0, 1))", s);
            memcpy(b1, s, (size_t)(comma - s));
            b1[comma - s] = 0;
            double d2;
            if (forge_cli_parse_double("train", "--betas (B1)", b1, 0, 0, 1, 1, &d) ||
                forge_cli_parse_double("train", "--betas (B2)", comma + 1, 0, 0, 1, 1, &d2))
                return 2;
            tp->beta1 = d;
            tp->beta2 = d2;
        } else if (!strcmp(f, "--eps")) {
            if (forge_cli_parse_double("train", f, s, 0, 1, INFINITY, 0, &d)) return 2;
            tp->eps = d;
        } else if (!strcmp(f, "--schedule")) {
            if (!strcmp(s, "constant")) tp->schedule = FORGE_LR_CONSTANT;
            else if (!strcmp(s, "linear")) tp->schedule = FORGE_LR_LINEAR;
            else if (!strcmp(s, "cosine")) tp->schedule = FORGE_LR_COSINE;
            else return usage_error("--schedule: '%s' is not constant, linear or cosine", s);
        } else if (!strcmp(f, "--warmup")) {
            if (forge_cli_parse_int("train", f, s, 0, INT_MAX, &v)) return 2;
            tp->warmup_steps = (int)v;
        } else if (!strcmp(f, "--batch")) {
            if (forge_cli_parse_int("train", f, s, 1, 65536, &v)) return 2;
            a->batch = (int)v;
        } else if (!strcmp(f, "--seq")) {
            if (forge_cli_parse_int("train", f, s, 2, 1 << 24, &v)) return 2;
            a->seq = (int)v;
            a->seq_set = 1;
        } else if (!strcmp(f, "--steps")) {
            if (forge_cli_parse_int("train", f, s, 1, INT_MAX, &v)) return 2;
            a->steps = (int)v;
        } else if (!strcmp(f, "--accum")) {
            if (forge_cli_parse_int("train", f, s, 1, 65536, &v)) return 2;
            tp->accum_steps = (int)v;
        } else if (!strcmp(f, "--clip")) {
            if (forge_cli_parse_double("train", f, s, 0, 0, INFINITY, 0, &d)) return 2;
            tp->max_grad_norm = d;
        } else if (!strcmp(f, "--seed")) {
            if (forge_cli_parse_u64("train", f, s, &tp->seed)) return 2;
        } else if (!strcmp(f, "--save-every")) {
            if (forge_cli_parse_int("train", f, s, 0, INT_MAX, &v)) return 2;
            a->save_every = (int)v;
        } else if (!strcmp(f, "--eval-every")) {
            if (forge_cli_parse_int("train", f, s, 0, INT_MAX, &v)) return 2;
            a->eval_every = (int)v;
        } else if (!strcmp(f, "--format")) {
            if (!strcmp(s, "peft")) a->format = FORGE_ADAPTER_PEFT;
            else if (!strcmp(s, "mlx")) a->format = FORGE_ADAPTER_MLX;
            else return usage_error("--format: '%s' is not peft or mlx", s);
            a->format_name = s;
        }
    }
    if (!a->model) a->model = forge_cli_env_model();
    if (!a->model) return usage_error("no MODEL given (and FORGE_MODEL is not set)");
    if (!a->data) return usage_error("--data FILE.jsonl is required");
    if (!a->out) return usage_error("--out DIR is required");
    if (!*a->out) return usage_error("--out: the directory name is empty");
    struct stat sb;
    if (stat(a->out, &sb) == 0 && !S_ISDIR(sb.st_mode)) return usage_error("--out: '%s' exists and is not a directory", a->out);
    if (a->eval_every && !a->valid) return usage_error("--eval-every needs --valid FILE.jsonl");
    if (a->adapter && (a->rank_set || a->alpha_set || a->targets_set))
        fprintf(stderr, "forge train: warning: --adapter %s: its own rank, alpha and targets are used, not --rank/--alpha/--targets\n",
                a->adapter);
    return 0;
}

static FILE *open_data(const char *flag, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) fprintf(stderr, "forge train: %s %s: %s\n", flag, path, strerror(errno));
    return f;
}

/* Validation: the whole set in batches of `batch`, token-weighted. 0; 1 on error (printed);
 * 130 when interrupted (no result). */
static int evaluate(forge_trainer *t, const dataset *v, int batch, batch_buf *bb, int *idx, double *loss, int64_t *tokens) {
    double sum = 0;
    int64_t count = 0;
    for (int i = 0; i < v->n; i += batch) {
        if (forge_cli_interrupted()) return 130;
        int n = v->n - i < batch ? v->n - i : batch;
        for (int k = 0; k < n; k++) idx[k] = i + k;
        forge_train_batch b = {.struct_size = sizeof b};
        fill_batch(v, idx, n, bb, &b);
        double l = 0;
        int64_t tk = 0;
        forge_status st = forge_train_eval(t, &b, &l, &tk);
        if (st != FORGE_OK) {
            fprintf(stderr, "forge train: validation on %s: %s (%s)\n", v->path, forge_trainer_errmsg(t), forge_status_name(st));
            return 1;
        }
        sum += l * (double)tk;
        count += tk;
    }
    *loss = count ? sum / (double)count : NAN;
    *tokens = count;
    return 0;
}

typedef struct progress {
    int tty, json, last_len;
} progress;

/* Ends the progress line that is rewritten in place (it stays on the screen), so that the
 * next output starts on a line of its own. */
static void progress_break(progress *p) {
    if (p->tty && p->last_len) {
        fputc('\n', stderr);
        p->last_len = 0;
    }
}

static int save(forge_trainer *t, const train_args *a, int step, progress *p) {
    forge_status st = forge_trainer_save(t, a->out, a->format);
    if (st != FORGE_OK) {
        progress_break(p);
        fprintf(stderr, "forge train: saving to %s: %s (%s)\n", a->out, forge_trainer_errmsg(t), forge_status_name(st));
        return 1;
    }
    if (!p->json) {
        progress_break(p);
        fprintf(stderr, "step %d: saved the adapter to %s (%s)\n", step, a->out, a->format_name);
    }
    return 0;
}

static int report_eval(forge_trainer *t, const dataset *v, const train_args *a, int step, batch_buf *bb, int *idx, progress *p) {
    double loss;
    int64_t tokens;
    int rc = evaluate(t, v, a->batch, bb, idx, &loss, &tokens);
    if (rc) return rc;
    if (p->json) {
        printf("{\"step\": %d, \"val_loss\": ", step);
        json_num("%.7g", loss);
        printf(", \"val_tokens\": %lld}\n", (long long)tokens);
        fflush(stdout);
    } else {
        progress_break(p);
        fprintf(stderr, "step %d: validation loss %.4f (%lld tokens)\n", step, loss, (long long)tokens);
    }
    return 0;
}

int cmd_train(int argc, char **argv) {
    train_args a;
    memset(&a, 0, sizeof a);
    a.tp = forge_train_default_params();
    a.batch = 4;
    a.seq = 512;
    a.steps = 100;
    a.format = FORGE_ADAPTER_PEFT;
    a.format_name = "peft";
    int prc = parse_args(argc, argv, &a);
    if (prc == 1) { train_usage(stdout); return 0; }
    if (prc == 3) { train_usage(stderr); return 2; }
    if (prc) {
        fputs("usage: forge train MODEL --data FILE.jsonl --out DIR [options]  (forge train --help lists them)\n", stderr);
        return prc;
    }

    FILE *fdata = open_data("--data", a.data), *fvalid = NULL;
    if (!fdata) return 1;
    if (a.valid && !(fvalid = open_data("--valid", a.valid))) { fclose(fdata); return 1; }

    int rc = 1;
    forge_trainer *t = NULL;
    dataset train = {0}, valid = {0};
    batch_buf bb = {0};
    int *idx = NULL;
    sampler smp = {0};
    progress p = {isatty(2), a.json, 0};

    forge_model *m = forge_cli_load(a.model, &a.common);
    if (!m) goto out;
    forge_model_info info = {.struct_size = sizeof info};
    forge_model_get_info(m, &info);
    if (a.tp.n_layers > info.n_layers) {
        rc = usage_error("--layers %d: the model has %d layers", a.tp.n_layers, info.n_layers);
        goto out;
    }
    if (!a.seq_set && info.n_ctx_train >= 2 && info.n_ctx_train < a.seq) a.seq = info.n_ctx_train;

    data_ctx c = data_ctx_for(m, a.mask_prompt, a.seq);
    if (load_dataset(&c, fdata, a.data, &train)) goto out;
    if (fvalid && load_dataset(&c, fvalid, a.valid, &valid)) goto out;

    /* The trainer. */
    a.tp.max_batch = a.batch;
    a.tp.max_seq = a.seq;
    a.tp.total_steps = a.steps;
    a.tp.adapter_path = a.adapter;
    if (a.targets) a.tp.targets = a.targets;
    forge_status st = forge_trainer_create(m, &a.tp, &t);
    if (st != FORGE_OK) {
        fprintf(stderr, "forge train: %s (%s)\n", forge_model_errmsg(m), forge_status_name(st));
        goto out;
    }
    bb.tokens = malloc(sizeof(int32_t) * (size_t)a.batch * (size_t)a.seq);
    bb.labels = malloc(sizeof(int32_t) * (size_t)a.batch * (size_t)a.seq);
    bb.lengths = malloc(sizeof(int32_t) * (size_t)a.batch);
    idx = malloc(sizeof(int) * (size_t)a.batch);
    if (!bb.tokens || !bb.labels || !bb.lengths || !idx || sampler_init(&smp, train.n, a.shuffle, a.tp.seed)) {
        fprintf(stderr, "forge train: out of host memory\n");
        goto out;
    }
    if (!a.json) {
        fprintf(stderr, "forge train: %d examples (%lld tokens, %lld targets) from %s", train.n, (long long)train.n_tokens,
                (long long)train.n_targets, a.data);
        if (a.valid) fprintf(stderr, ", %d from %s", valid.n, a.valid);
        fprintf(stderr, "; %d steps", a.steps);
        if (a.tp.accum_steps > 1) fprintf(stderr, " of %d micro-batches", a.tp.accum_steps);
        fprintf(stderr, " of %d sequence%s of up to %d tokens\n", a.batch, a.batch == 1 ? "" : "s", a.seq);
    }

    forge_cli_catch_sigint(sigint_note, 0);

    int step = 0, last_saved = -1, last_eval = -1;
    double train_s = 0;
    for (step = 1; step <= a.steps; step++) {
        double t0 = now_s(), loss_sum = 0;
        int64_t targets = 0, fed = 0;
        forge_train_stats stats = {.struct_size = sizeof stats};
        for (int micro = 0; micro < a.tp.accum_steps; micro++) {
            for (int k = 0; k < a.batch; k++) idx[k] = sampler_next(&smp);
            forge_train_batch b = {.struct_size = sizeof b};
            fed += fill_batch(&train, idx, a.batch, &bb, &b);
            st = forge_train_step(t, &b, &stats);
            if (st != FORGE_OK) {
                progress_break(&p);
                fprintf(stderr, "forge train: step %d: %s (%s)\n", step, forge_trainer_errmsg(t), forge_status_name(st));
                goto out;
            }
            loss_sum += stats.loss; /* the micro-batches' mean losses weigh equally, as their gradients do */
            targets += stats.tokens;
        }
        if (!stats.applied) {
            progress_break(&p);
            fprintf(stderr, "forge train: step %d: the trainer applied no optimizer step after %d micro-batches (accum_steps %d)\n",
                    step, a.tp.accum_steps, a.tp.accum_steps);
            goto out;
        }
        double dt = now_s() - t0;
        train_s += dt;
        double loss = loss_sum / a.tp.accum_steps;
        double tok_s = dt > 0 ? (double)fed / dt : 0;
        if (a.json) {
            printf("{\"step\": %d, \"loss\": ", step);
            json_num("%.7g", loss);
            printf(", \"tokens\": %lld, \"lr\": ", (long long)targets);
            json_num("%.6g", stats.lr);
            printf(", \"grad_norm\": ");
            json_num("%.6g", stats.grad_norm);
            printf(", \"tok_s\": ");
            json_num("%.1f", tok_s);
            printf(", \"peak_device_bytes\": %llu}\n", (unsigned long long)stats.peak_device_bytes);
            fflush(stdout);
        } else {
            char eta[32];
            format_eta(train_s / step * (a.steps - step), eta, sizeof eta);
            double peak_mib = (double)stats.peak_device_bytes / (1 << 20);
            if (p.tty) {
                char label[64], line[256];
                snprintf(label, sizeof label, "step %d/%d", step, a.steps);
                int len = forge_cli_bar(line, sizeof line, label, (double)step / a.steps);
                int more = snprintf(line + len, sizeof line - (size_t)len, "  loss %.4f  %.0f tok/s  peak %.0f MiB  ETA %s", loss,
                                    tok_s, peak_mib, eta);
                if (more > 0) len += more;
                if (len >= (int)sizeof line) len = (int)sizeof line - 1;
                fprintf(stderr, "\r%s%*s", line, p.last_len > len ? p.last_len - len : 0, "");
                fflush(stderr);
                p.last_len = len;
            } else if (step % 10 == 0 || step == a.steps || forge_cli_interrupted()) {
                fprintf(stderr, "step %d/%d: loss %.4f, lr %.3g, grad norm %.3g, %.0f tok/s, peak %.1f MiB, ETA %s\n", step, a.steps,
                        loss, stats.lr, stats.grad_norm, tok_s, peak_mib, eta);
            }
        }
        if (a.eval_every && step % a.eval_every == 0 && !forge_cli_interrupted()) {
            int e = report_eval(t, &valid, &a, step, &bb, idx, &p);
            if (e == 1) goto out;
            if (e == 0) last_eval = step;
        }
        if (a.save_every && step % a.save_every == 0) {
            if (save(t, &a, step, &p)) goto out;
            last_saved = step;
        }
        if (forge_cli_interrupted()) break;
    }
    if (step > a.steps) step = a.steps;
    if (!forge_cli_interrupted() && a.valid && last_eval != step && report_eval(t, &valid, &a, step, &bb, idx, &p) == 1) goto out;
    /* Interrupted (Ctrl-C): the steps done so far are saved all the same. */
    if (last_saved != step && save(t, &a, step, &p)) goto out;
    progress_break(&p);
    if (a.json) {
        printf(forge_cli_interrupted() ? "{\"done\": false, \"interrupted\": true, \"steps\": %d, \"out\": " : "{\"done\": true, \"steps\": %d, \"out\": ",
               step);
        forge_cli_json_cstr(a.out);
        printf("}\n");
        fflush(stdout);
    } else if (forge_cli_interrupted()) {
        fprintf(stderr, "forge train: interrupted after step %d; the adapter is in %s\n", step, a.out);
    }
    rc = forge_cli_interrupted() ? 130 : 0;
out:
    progress_break(&p);
    free(smp.order);
    free(idx);
    free(bb.tokens);
    free(bb.labels);
    free(bb.lengths);
    forge_trainer_free(t);
    dataset_free(&train);
    dataset_free(&valid);
    forge_model_free(m);
    fclose(fdata);
    if (fvalid) fclose(fvalid);
    return rc;
}
