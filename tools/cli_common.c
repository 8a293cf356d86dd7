/* cli_common.c: what the CLI's verbs share (see cli.h): loading a model with the common
 * options, taking those options out of argv, checking flag values, Ctrl-C, JSON strings. */
#define _XOPEN_SOURCE 700 /* POSIX 2008 and SA_RESTART */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void log_stderr(void *user, forge_log_level level, const char *msg) {
    (void)user;
    static const char *names[] = {"error", "warn", "info", "debug"};
    fprintf(stderr, "forge %s: %s\n", names[(unsigned)level < 4 ? level : 3], msg);
}

int forge_cli_bar(char *out, size_t size, const char *label, double fraction) {
    enum { WIDTH = 30 };
    if (!(fraction >= 0)) fraction = 0; /* NaN too */
    if (fraction > 1) fraction = 1;
    int filled = (int)(fraction * WIDTH + 1e-9);
    char bar[WIDTH + 1];
    for (int i = 0; i < WIDTH; i++) bar[i] = i < filled ? '#' : '.';
    bar[WIDTH] = 0;
    int n = snprintf(out, size, "%s [%s] %3d%%", label, bar, (int)(fraction * 100 + 1e-9));
    return n < 0 ? 0 : n >= (int)size ? (int)size - 1 : n;
}

/* forge_model_params.progress on a terminal: the bar, redrawn in place when the percentage
 * moves, and erased once the weights are all on the device (the command's output follows). */
static void progress_stderr(void *user, float fraction) {
    int *shown = (int *)user; /* the percentage on the screen, -1 before the first draw */
    int percent = (int)(fraction * 100.0f + 1e-6f);
    if (percent == *shown) return;
    char line[128];
    int len = forge_cli_bar(line, sizeof line, "loading", fraction);
    if (fraction >= 1.0f) fprintf(stderr, "\r%*s\r", len, "");
    else fprintf(stderr, "\r%s", line);
    fflush(stderr);
    *shown = percent;
}

int forge_cli_take_common(const char *cmd, int *argc, char **argv, forge_cli_opts *o, int with_adapter) {
    static const char *const values[] = {"--device", "--ctx", "--kv", "--adapter", NULL};
    int w = 0;
    for (int i = 0; i < *argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < *argc;
        if ((with_adapter || strcmp(a, "--adapter")) && forge_cli_needs_value(cmd, a, has, values)) return 2;
        if (!strcmp(a, "--device") && has) o->device = argv[++i];
        else if (!strcmp(a, "--ctx") && has) {
            long long v;
            if (forge_cli_parse_int(cmd, "--ctx", argv[++i], 0, INT_MAX, &v)) return 2;
            o->n_ctx = (int)v;
        } else if (!strcmp(a, "--kv") && has) {
            const char *v = argv[++i];
            if (!strcmp(v, "f16")) o->kv_type = FORGE_KV_F16;
            else if (!strcmp(v, "f32")) o->kv_type = FORGE_KV_F32;
            else if (!strcmp(v, "q8_0")) o->kv_type = FORGE_KV_Q8_0;
            else {
                fprintf(stderr, "forge %s: --kv takes f16, f32 or q8_0, not '%s'\n", cmd, v);
                return 2;
            }
        } else if (!strcmp(a, "-v")) o->verbose = 1;
        else if (!strcmp(a, "--exact")) o->exact = 1;
        else if (with_adapter && !strcmp(a, "--adapter") && has) o->adapter = argv[++i];
        else if (with_adapter && !strcmp(a, "--merge-adapter")) o->merge_adapter = 1;
        else argv[w++] = argv[i];
    }
    *argc = w;
    if (o->merge_adapter && !o->adapter) {
        fprintf(stderr, "forge %s: --merge-adapter needs --adapter DIR\n", cmd);
        return 2;
    }
    return 0;
}

/* Loads with `mp`; prints the error and returns NULL on failure. */
static forge_model *load_with(const char *path, forge_model_params *mp, int verbose) {
    if (verbose) mp->log = log_stderr;
    forge_model *m = NULL;
    forge_status st = forge_model_load(path, mp, &m);
    if (st != FORGE_OK) {
        fprintf(stderr, "forge: %s (%s)\n", forge_model_errmsg(m), forge_status_name(st));
        forge_model_free(m);
        return NULL;
    }
    return m;
}

forge_model *forge_cli_load(const char *path, const forge_cli_opts *o) {
    forge_model_params mp = forge_model_default_params();
    if (o->device) {
        char *end;
        long idx = strtol(o->device, &end, 10);
        if (*o->device && *end == 0) mp.device_index = (int)idx;
        else mp.device_name = o->device;
    }
    mp.adapter_path = o->adapter;
    mp.adapter_merge = o->merge_adapter;
    mp.exact = o->exact;
    int shown = -1;
    if (isatty(2)) { /* nothing when stderr is a file or a pipe: no carriage returns in logs */
        mp.progress = progress_stderr;
        mp.progress_user_data = &shown;
    }
    return load_with(path, &mp, o->verbose);
}

/* The prewarm's line: drawn by a timer thread once the prewarm has taken PREWARM_SHOW_S, then
 * by the callback at each kernel; the lock keeps the two from drawing at once. */
#define PREWARM_SHOW_S 0.5
typedef struct prewarm_ui {
    pthread_mutex_t lock;
    pthread_cond_t finished_cv;
    int done, total, finished, shown, len;
    char kernel[48], device[96];
} prewarm_ui;

static void prewarm_draw(prewarm_ui *u) { /* under the lock */
    char label[192], line[320];
    snprintf(label, sizeof label, "compiling kernels for %s (first run only)", u->device);
    int n = forge_cli_bar(line, sizeof line, label, u->total ? (double)u->done / u->total : 0.0);
    n += snprintf(line + n, sizeof line - (size_t)n, " %d/%d %s", u->done, u->total, u->kernel);
    if (n >= (int)sizeof line) n = (int)sizeof line - 1;
    fprintf(stderr, "\r%s%*s", line, u->len > n ? u->len - n : 0, ""); /* blanks over a longer last line */
    fflush(stderr);
    u->len = n;
    u->shown = 1;
}

static void prewarm_progress(void *user, int done, int total, const char *kernel) {
    prewarm_ui *u = (prewarm_ui *)user;
    pthread_mutex_lock(&u->lock);
    u->done = done;
    u->total = total;
    snprintf(u->kernel, sizeof u->kernel, "%s", kernel ? kernel : "");
    if (u->shown) prewarm_draw(u);
    pthread_mutex_unlock(&u->lock);
}

static void *prewarm_timer(void *user) {
    prewarm_ui *u = (prewarm_ui *)user;
    struct timespec at;
    clock_gettime(CLOCK_REALTIME, &at);
    at.tv_nsec += (long)(PREWARM_SHOW_S * 1e9);
    at.tv_sec += at.tv_nsec / 1000000000L;
    at.tv_nsec %= 1000000000L;
    pthread_mutex_lock(&u->lock);
    while (!u->finished && pthread_cond_timedwait(&u->finished_cv, &u->lock, &at) == 0) {
    }
    if (!u->finished) prewarm_draw(u);
    pthread_mutex_unlock(&u->lock);
    return NULL;
}

int forge_cli_prewarm(forge_model *m, forge_session *s, int n_prompt) {
    if (!isatty(2)) {
        if (forge_session_prewarm(s, n_prompt, NULL, NULL) == FORGE_OK) return 0;
        fprintf(stderr, "forge: %s\n", forge_session_errmsg(s));
        return 1;
    }
    prewarm_ui u = {.len = 0};
    forge_model_info info = {.struct_size = sizeof info};
    snprintf(u.device, sizeof u.device, "%s", forge_model_get_info(m, &info) == FORGE_OK ? info.device_name : "the device");
    char *paren = strstr(u.device, " ("); /* "llvmpipe (LLVM 15.0.6, 256 bits)": the name is enough */
    if (paren) *paren = 0;
    pthread_mutex_init(&u.lock, NULL);
    pthread_cond_init(&u.finished_cv, NULL);
    pthread_t timer;
    int timing = pthread_create(&timer, NULL, prewarm_timer, &u) == 0;
    forge_status st = forge_session_prewarm(s, n_prompt, prewarm_progress, &u);
    pthread_mutex_lock(&u.lock);
    u.finished = 1;
    pthread_cond_signal(&u.finished_cv);
    pthread_mutex_unlock(&u.lock);
    if (timing) pthread_join(timer, NULL);
    if (u.shown) fprintf(stderr, "\r%*s\r", u.len, ""); /* erased: the command's output follows */
    pthread_cond_destroy(&u.finished_cv);
    pthread_mutex_destroy(&u.lock);
    if (st == FORGE_OK) return 0;
    fprintf(stderr, "forge: %s\n", forge_session_errmsg(s));
    return 1;
}

forge_model *forge_cli_load_vocab(const char *path, int verbose) {
    forge_model_params mp = forge_model_default_params();
    mp.vocab_only = 1;
    return load_with(path, &mp, verbose);
}

/* forge_token_piece is NULL for every id when the model has no vocabulary (generation then gives
 * ids and no text). */
int forge_cli_has_tokenizer(const forge_model *m) { return forge_token_piece(m, 0) != NULL; }

int forge_cli_parse_int(const char *cmd, const char *flag, const char *s, long long lo, long long hi, long long *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) {
        /* the range, both ends: -n 3000000000 is an integer >= 0, but not one that fits */
        fprintf(stderr, "forge %s: %s: '%s' must be an integer in %lld..%lld\n", cmd, flag, s, lo, hi);
        return 2;
    }
    *out = v;
    return 0;
}

int forge_cli_parse_u64(const char *cmd, const char *flag, const char *s, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || errno || s[strspn(s, " \t")] == '-') {
        fprintf(stderr, "forge %s: %s: '%s' is not an unsigned 64-bit integer\n", cmd, flag, s);
        return 2;
    }
    *out = (uint64_t)v;
    return 0;
}

int forge_cli_parse_double(const char *cmd, const char *flag, const char *s, double lo, int lo_open, double hi, int hi_open,
                           double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    int ok = *s && !*end && errno != ERANGE && isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
    if (!ok) {
        if (isinf(hi)) fprintf(stderr, "forge %s: %s: '%s' is not a number %s %g\n", cmd, flag, s, lo_open ? ">" : ">=", lo);
        else fprintf(stderr, "forge %s: %s: '%s' is not a number in %c%g, %g%c\n", cmd, flag, s, lo_open ? '(' : '[', lo, hi,
                     hi_open ? ')' : ']');
        return 2;
    }
    *out = v;
    return 0;
}

int forge_cli_check_targets(const char *cmd, const char *flag, const char *s) {
    static const char *names[] = {"q_proj",      "k_proj",    "v_proj",    "o_proj",    "gate_proj", "up_proj",
                                  "down_proj",   "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"};
    const size_t n_names = sizeof names / sizeof names[0];
    if (!strcmp(s, "all")) return 0;
    unsigned seen = 0;
    const char *p = s;
    for (;;) {
        size_t len = strcspn(p, ",");
        size_t k = 0;
        while (k < n_names && !(strlen(names[k]) == len && !strncmp(p, names[k], len))) k++;
        if (k == n_names) {
            fprintf(stderr,
                    "forge %s: %s: '%.*s' in '%s' is not a target (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                    "down_proj; Qwen 3.5's linear attention: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj; "
                    "comma-separated, or all)\n",
                    cmd, flag, (int)len, p, s);
            return 2;
        }
        if (seen & (1u << k)) {
            fprintf(stderr, "forge %s: %s: '%s' names %s twice\n", cmd, flag, s, names[k]);
            return 2;
        }
        seen |= 1u << k;
        if (!p[len]) break;
        p += len + 1;
    }
    return 0;
}

void forge_cli_json_string(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c < 0x20 || c == 0x7f) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

void forge_cli_json_cstr(const char *s) { forge_cli_json_string(s, strlen(s)); }

void forge_cli_json_ids(const int32_t *ids, size_t n) {
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    putchar(']');
}

/* ---- Ctrl-C (cli.h) ---- */

/* The cancel flag. The library reads it through a const int * with an atomic load; sig_atomic_t
 * is int here, so the pointer is to an int. */
static volatile sig_atomic_t g_sigint = 0;
#if defined(__GNUC__)
_Static_assert(__builtin_types_compatible_p(sig_atomic_t, int), "the cancel flag is an int (forge_generate_params.cancel)");
#endif
static const char *g_sigint_note = NULL; /* set before the handler is installed */
static size_t g_sigint_note_len = 0;

static void on_sigint(int sig) {
    int saved = errno; /* the interrupted code may be about to read errno */
    g_sigint = 1;
    signal(sig, SIG_DFL); /* a second Ctrl-C: the default action */
    if (g_sigint_note_len) {
        ssize_t r = write(2, g_sigint_note, g_sigint_note_len);
        (void)r;
    }
    errno = saved;
}

void forge_cli_catch_sigint(const char *note, int interrupt_reads) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL); /* no handler while the note changes */
    g_sigint_note = note;
    g_sigint_note_len = note ? strlen(note) : 0;
    g_sigint = 0;
    sa.sa_handler = on_sigint;
    sa.sa_flags = interrupt_reads ? 0 : SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
}

void forge_cli_release_sigint(void) {
    signal(SIGINT, SIG_DFL);
    g_sigint = 0;
}

const int *forge_cli_cancel_flag(void) { return (const int *)&g_sigint; }

int forge_cli_interrupted(void) { return g_sigint != 0; }

const char *forge_cli_stop_name(forge_stop_reason r) {
    static const char *why[] = {"none", "eos", "stop_token", "stop_string", "max_tokens", "callback", "context", "cancelled", "constraint"};
    return (unsigned)r < sizeof why / sizeof *why ? why[r] : "none";
}

const char *forge_cli_env_model(void) {
    const char *m = getenv("FORGE_MODEL");
    return m && *m ? m : NULL;
}

char *forge_cli_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += r;
        if (n + 1 == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) { free(buf); buf = NULL; }
            buf = b;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) { free(buf); return NULL; }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

char *forge_cli_read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n - 1, stdin)) > 0;) {
        n += r;
        if (n + 1 == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) free(buf);
            buf = b;
        }
    }
    if (buf) buf[n] = 0;
    *len = buf ? n : 0;
    return buf;
}

int forge_cli_take_constraint(const char *cmd, int *argc, char **argv, forge_cli_constraint *out, int with_choices) {
    memset(out, 0, sizeof *out);
    out->c.struct_size = sizeof out->c;
    int w = 0;
    for (int i = 0; i < *argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < *argc;
        forge_constraint_kind kind = FORGE_CONSTRAINT_NONE;
        if (!strcmp(a, "--grammar") && has) kind = FORGE_CONSTRAINT_GBNF;
        else if (!strcmp(a, "--json-schema") && has) kind = FORGE_CONSTRAINT_JSON_SCHEMA;
        else if (!strcmp(a, "--json-object")) kind = FORGE_CONSTRAINT_JSON_OBJECT;
        else if (!strcmp(a, "--choices") && has && with_choices) kind = FORGE_CONSTRAINT_CHOICES;
        else if (!strcmp(a, "--trigger") && has) {
            out->c.trigger = argv[++i];
            continue;
        } else {
            argv[w++] = argv[i];
            continue;
        }
        if (out->c.kind != FORGE_CONSTRAINT_NONE) {
            fprintf(stderr, "forge %s: %s and %s: one constraint at a time\n", cmd, out->option, a);
            forge_cli_constraint_free(out);
            return 2;
        }
        out->c.kind = kind;
        out->option = a;
        if (kind == FORGE_CONSTRAINT_GBNF || kind == FORGE_CONSTRAINT_JSON_SCHEMA) {
            size_t len = 0;
            if (!(out->text = forge_cli_read_file(argv[++i], &len))) {
                fprintf(stderr, "forge %s: %s: cannot read %s\n", cmd, a, argv[i]);
                return 2;
            }
            out->c.text = out->text;
            out->c.text_len = len;
        } else if (kind == FORGE_CONSTRAINT_CHOICES) {
            const char *list = argv[++i];
            int n = 1;
            for (const char *p = list; *p; p++) n += *p == ',';
            out->choices_buf = strdup(list);
            out->choices = malloc(sizeof *out->choices * (size_t)n);
            if (!out->choices_buf || !out->choices) {
                fprintf(stderr, "forge %s: out of host memory\n", cmd);
                forge_cli_constraint_free(out);
                return 2;
            }
            int k = 0;
            for (char *p = out->choices_buf, *q;; p = q + 1) {
                q = strchr(p, ',');
                if (q) *q = 0;
                out->choices[k++] = p;
                if (!q) break;
            }
            out->c.choices = out->choices;
            out->c.n_choices = k;
        }
    }
    *argc = w;
    if (out->c.trigger && out->c.kind == FORGE_CONSTRAINT_NONE) {
        fprintf(stderr, "forge %s: --trigger goes with --grammar, --json-schema or --json-object\n", cmd);
        return 2;
    }
    return 0;
}

void forge_cli_constraint_free(forge_cli_constraint *c) {
    free(c->text);
    free(c->choices_buf);
    free((void *)c->choices);
    c->text = c->choices_buf = NULL;
    c->choices = NULL;
}

const forge_constraint *forge_cli_constraint_get(const forge_cli_constraint *c) { return c->c.kind != FORGE_CONSTRAINT_NONE ? &c->c : NULL; }

forge_session *forge_cli_batch_session(forge_model *m, const forge_cli_opts *o, int longest, long long total, int profile) {
    int limit = forge_model_n_ctx_train(m);
    if (limit <= 0 || (o->n_ctx && o->n_ctx < limit)) limit = o->n_ctx ? o->n_ctx : 4096;
    if (longest > limit) longest = limit;
    forge_session_params sp = forge_session_default_params();
    int least = longest > 512 ? (longest + 7) / 8 * 8 : 512;
    if (least > limit && longest > 512) least = limit;
    long long want = total < FORGE_CLI_BATCH_TOKENS ? (total + 7) / 8 * 8 : FORGE_CLI_BATCH_TOKENS;
    if (want > limit) want = limit;
    sp.n_batch = want > least ? (int)want : least;
    sp.kv_type = o->kv_type;
    sp.profile = profile;
    forge_session *s = NULL;
    for (;;) {
        sp.n_ctx = o->n_ctx ? o->n_ctx : sp.n_batch;
        forge_status st = forge_session_create(m, &sp, &s);
        if (st == FORGE_OK) return s;
        if (sp.n_batch == least) {
            fprintf(stderr, "forge: %s (%s)\n", forge_model_errmsg(m), forge_status_name(st));
            return NULL;
        }
        sp.n_batch = least;
    }
}
