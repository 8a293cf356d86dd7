/* cli.h: what the CLI's source files share: tools/forge_cli.c (the verbs and main),
 * tools/cli_common.c (model loading, option and value parsing), tools/cli_train.c
 * (`forge train`), tools/cli_batch.c (`forge run --batch-file`), tools/cli_bench.c (`forge bench`, `forge bench-tokenize`)
 * and tools/cli_embed.c (`forge embed`, `forge rerank`). */
#ifndef FORGE_CLI_H
#define FORGE_CLI_H

#include "forge.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Options every model command takes; forge_cli_take_common consumes them from argv. */
typedef struct forge_cli_opts {
    const char *device;       /* --device INDEX|NAME */
    int verbose;              /* -v: the library's log to stderr */
    int n_ctx;                /* --ctx N (0: the command's default) */
    const char *adapter;      /* --adapter DIR: forge_model_params.adapter_path */
    int merge_adapter;        /* --merge-adapter: forge_model_params.adapter_merge */
    int exact;                /* --exact: forge_model_params.exact (every product in f32, no tensor cores) */
    int kv_type;              /* --kv f16|f32: forge_session_params.kv_type (0: the default) */
} forge_cli_opts;

/* Takes --device, --ctx, --exact, --kv and -v (and, when with_adapter, --adapter and --merge-adapter) out of
 * argv, leaving the other arguments in order. Returns 0, or 2 after printing what is wrong
 * ("forge CMD: --ctx: ..."). */
int forge_cli_take_common(const char *cmd, int *argc, char **argv, forge_cli_opts *o, int with_adapter);

/* Loads MODEL with the options (device by index or name, the adapter, progress on a
 * terminal, the log with -v); prints the library's message and returns NULL on failure. */
forge_model *forge_cli_load(const char *path, const forge_cli_opts *o);

/* forge_session_prewarm(s, n_prompt, ...) with, on a terminal, "compiling kernels for DEVICE (first run only)" and a
 * bar once it has taken half a second (a warm driver cache finishes before that and shows
 * nothing); erased when done. Returns 0, or 1 after printing the session's message. */
int forge_cli_prewarm(forge_model *m, forge_session *s, int n_prompt);

/* Loads only the tokenizer of PATH (vocab_only). */
forge_model *forge_cli_load_vocab(const char *path, int verbose);

/* Whether the model has a tokenizer (a vocabulary): without one there is no text, only ids
 * (the parity checkpoints have none). */
int forge_cli_has_tokenizer(const forge_model *m);

/* Value parsers for flags: each parses the whole of `s`, checks the range and returns 0, or
 * prints what is wrong with it, naming the range ("forge CMD: FLAG: 'S' must be an integer in
 * LO..HI", "... is not a number in [LO, HI]"), and returns 2 (a usage error). */
int forge_cli_parse_int(const char *cmd, const char *flag, const char *s, long long lo, long long hi, long long *out);
int forge_cli_parse_u64(const char *cmd, const char *flag, const char *s, uint64_t *out);
/* lo_open / hi_open: the bound itself is excluded. */
int forge_cli_parse_double(const char *cmd, const char *flag, const char *s, double lo, int lo_open, double hi, int hi_open,
                           double *out);

/* Checks a LoRA target list ("q_proj,v_proj", ..., or "all"): 0, or 2 after printing which
 * name is wrong. */
int forge_cli_check_targets(const char *cmd, const char *flag, const char *s);

/* The model a command uses when its command line names none: $FORGE_MODEL when set and not
 * empty, else NULL. An explicit MODEL (positional, -m or --model) always wins. */
const char *forge_cli_env_model(void);

/* Writes "LABEL [#########.....]  45%" (fraction clamped to [0, 1]) into out; returns its
 * length. The load progress and forge train draw it on stderr, only when stderr is a terminal. */
int forge_cli_bar(char *out, size_t size, const char *label, double fraction);

/* The JSON name of a stop reason ("eos", "max_tokens", ...), as run --json and --batch-file print it. */
const char *forge_cli_stop_name(forge_stop_reason r);

/* Ctrl-C, one mechanism for every verb that stops early (run, run --batch-file, chat, classify,
 * bench, train). forge_cli_catch_sigint clears the flag and installs a handler for the next
 * SIGINT: it sets the flag (forge_cli_cancel_flag() points at it: what the cancel fields of
 * forge_generate_params and forge_classify_params take), writes `note` (a string that outlives
 * the handler, or NULL) on stderr and restores the default action, so a second Ctrl-C kills the
 * program. The handler is async-signal-safe: a sig_atomic_t store, signal() and write().
 * Interrupted system calls restart (SA_RESTART: a write to a full pipe is not lost), unless
 * interrupt_reads: then a read blocked on the terminal (chat's prompt) returns EINTR.
 * forge_cli_release_sigint restores the default action and clears the flag. */
void forge_cli_catch_sigint(const char *note, int interrupt_reads);
void forge_cli_release_sigint(void);
const int *forge_cli_cancel_flag(void);
int forge_cli_interrupted(void); /* the flag: non-zero after a caught Ctrl-C */

/* forge VERB with an argument it does not take: prints "forge VERB: unexpected argument 'ARG'"
 * and VERB's usage (forge help VERB's text) on stderr; returns 2 (tools/forge_cli.c). */
int forge_cli_unexpected(const char *verb, const char *arg);
/* A flag that takes a value, given last (`forge run -p`): when `arg` is one of `flags` (a
 * NULL-terminated list: the flags a parser takes with a value) and !has_value, prints "forge
 * VERB: ARG needs a value" and VERB's usage on stderr and returns 2; else 0. Each parser calls it
 * on every argument before matching, so such a flag is not called an unexpected argument. */
int forge_cli_needs_value(const char *verb, const char *arg, int has_value, const char *const *flags);
/* Prints VERB's usage (the usage text's entries of VERB and the common options) on f; 0, or 2
 * when there is no such verb (tools/forge_cli.c). */
int forge_cli_verb_help(const char *verb, FILE *f);
/* A usage error other than an unexpected argument: prints "forge VERB: MESSAGE" and VERB's usage
 * on stderr; returns 2 (tools/forge_cli.c). */
int forge_cli_usage_error(const char *verb, const char *message);

/* Writes s[0..n) to stdout as a JSON string (quoted, escaped). */
void forge_cli_json_string(const char *s, size_t n);
void forge_cli_json_cstr(const char *s);
/* Writes ids[0..n) to stdout as a JSON array of integers. */
void forge_cli_json_ids(const int32_t *ids, size_t n);

/* A constraint from the command line: --grammar FILE, --json-schema FILE, --json-object, with
 * with_choices also --choices "a,b,c", and --trigger TEXT (the constraint starts after it). */
typedef struct forge_cli_constraint {
    forge_constraint c;       /* kind FORGE_CONSTRAINT_NONE when no option was given */
    char *text;               /* the file's contents (malloc'd) */
    char *choices_buf;        /* --choices, cut at its commas (malloc'd) */
    const char **choices;     /* into choices_buf (malloc'd) */
    const char *option;       /* the option that gave it ("--json-schema"), for messages */
} forge_cli_constraint;

/* Takes the constraint options out of argv (leaving the others in order) and reads the file;
 * returns 0, or 2 after printing what is wrong (two constraints, an unreadable file). */
int forge_cli_take_constraint(const char *cmd, int *argc, char **argv, forge_cli_constraint *out, int with_choices);
void forge_cli_constraint_free(forge_cli_constraint *c);
/* The constraint for forge_generate_params.constraint and friends: NULL when none was given. */
const forge_constraint *forge_cli_constraint_get(const forge_cli_constraint *c);

/* A whole file, NUL-terminated, malloc'd (its length to *len when not NULL); NULL when it cannot be read. */
char *forge_cli_read_file(const char *path, size_t *len);
/* All of stdin, NUL-terminated, malloc'd (its length to *len); NULL when out of memory. */
char *forge_cli_read_stdin(size_t *len);

/* A session for batched passes (classify, embed, rerank) over inputs of up to `longest` tokens,
 * `total` in all: n_batch holds the longest (and at least 512), and grows toward the total up to
 * FORGE_CLI_BATCH_TOKENS so that many short inputs share a pass; neither n_batch nor the
 * longest goes past the model's context (or --ctx): the library then refuses the input by
 * name. n_ctx = n_batch (the cache is scratch for one batch) unless --ctx. A device that cannot
 * hold the grown batch (lavapipe's 128 MiB buffers) gets the smallest; `profile` times every
 * kernel (forge_session_profile). NULL on failure, the message printed. */
#define FORGE_CLI_BATCH_TOKENS 8192
forge_session *forge_cli_batch_session(forge_model *m, const forge_cli_opts *o, int longest, long long total, int profile);

/* The verbs that live outside tools/forge_cli.c. */
int cmd_train(int argc, char **argv);                  /* tools/cli_train.c */
int forge_bench_main(int argc, char **argv);           /* tools/cli_bench.c */
int forge_bench_tokenize_main(int argc, char **argv);  /* tools/cli_bench.c */
int forge_bench_grammar_main(int argc, char **argv);   /* tools/cli_bench.c */
int cmd_embed(int argc, char **argv);                  /* tools/cli_embed.c */
int cmd_rerank(int argc, char **argv);                 /* tools/cli_embed.c */
/* `forge run PATH --batch-file FILE`: the file's lines generated together on `places` sequences
 * (0: as many as lines, at most 16) with gp's sampling; tools/cli_batch.c. Returns the exit code. */
int forge_cli_run_batch(const char *path, const forge_cli_opts *o, const char *file, const forge_generate_params *gp, int places,
                        int json, int show_metrics);

#endif /* FORGE_CLI_H */
