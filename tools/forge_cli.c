/* forge: the command-line tool. usage_text below is the reference for the commands and their
 * options (`forge help`, `forge help COMMAND`); docs/cli.md (which shows that text) and
 * docs/json.md say the same at more length. `--json` output is stable: one schema per
 * command. The verbs live here except train (tools/cli_train.c), run --batch-file
 * (tools/cli_batch.c), bench, bench-tokenize (tools/cli_bench.c) and embed, rerank
 * (tools/cli_embed.c). */
#define _DEFAULT_SOURCE 1
#include "cli.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The whole usage text. A command's entry starts on a line indented by two spaces with the
 * command's name; its continuation lines are indented further (forge help VERB prints them). */
static const char usage_text[] =
            "usage: forge <command> [options]\n"
            "  run [MODEL] [-p PROMPT | --tokens \"1 2 3\"] [-n N] [--temp T] [--top-k K] [--top-p P]\n"
            "      [--min-p M] [--repeat-penalty R] [--seed S] [--stop STR] [--lookup N] [--metrics] [--adapter DIR]\n"
            "      [--ctx-overflow fail|shift|recompute] [--keep N] [--load-state FILE] [--save-state FILE] [--json]\n"
            "      [--json-schema FILE | --grammar FILE | --json-object] [--trigger STR] [--draft MODEL]\n"
            "                                   generate text, streamed to stdout (default model: FORGE_MODEL,\n"
            "                                   else the bundled stories260K; greedy unless --temp > 0;\n"
            "                                   -n default 256; the default --seed is fixed, 0: a sampled\n"
            "                                   run gives the same text until --seed changes);\n"
            "                                   --tokens: the prompt as token ids, taken as they are (no BOS\n"
            "                                   added); a model without a tokenizer prints ids, not text;\n"
            "                                   --json: the text, the generated ids and the metrics as one\n"
            "                                   JSON object at the end;\n"
            "                                   stops at a full context unless --ctx-overflow slides it;\n"
            "                                   --load-state continues a saved session (the prompt\n"
            "                                   follows its tokens), --save-state saves the session\n"
            "                                   (prompt and generated text) after generating; Ctrl-C stops\n"
            "                                   at the next token, then prints and saves as any stop does\n"
            "                                   (during the prompt: no state is saved); --json-schema,\n"
            "                                   --grammar (GBNF), --json-object: the text matches it (from\n"
            "                                   after --trigger's text when given); --draft: a smaller model\n"
            "                                   of the same vocabulary drafts --lookup N tokens a step\n"
            "                                   (default 4), verified in one pass: the same text, sooner\n"
            "  run [MODEL] --batch-file FILE [-n N] [--parallel K] [--json] [sampling options]\n"
            "                                   every line of FILE a text prompt (no -p or --tokens with it),\n"
            "                                   generated together (K at once, default min(lines, 16)); each\n"
            "                                   output labelled, or with --json one JSON object each; Ctrl-C\n"
            "                                   stops every sequence at its next token, then prints them\n"
            "  chat MODEL [--system S] [-n N] [--temp T] [--adapter DIR] [--ctx-overflow MODE] [--keep N] ...\n"
            "      [--tools FILE.json [--tool-calls free|strict|required]]\n"
            "                                   interactive chat in the model's own template (a model with\n"
            "                                   none is refused); sampling and constraint options as run's\n"
            "                                   (the default --seed is fixed, 0), -n default 1024; --think /\n"
            "                                   --no-think: the family's thinking switch (Gemma 4 / Qwen 3);\n"
            "                                   Ctrl-C stops a reply; /help, /metrics, /reset, /quit (a\n"
            "                                   message starting with / is sent as //...); a full context\n"
            "                                   slides (shift by default), so a chat runs indefinitely;\n"
            "                                   --tools: the functions in FILE (transformers' tools list)\n"
            "                                   are offered to the model (Llama 3.1+, Qwen 3, Qwen 3.5,\n"
            "                                   Mistral v0.3 / Nemo, Gemma 4); a call in a reply prints as [tool call\n"
            "                                   NAME ARGUMENTS], and the\n"
            "                                   next lines are the calls' results, in order (prompt NAME>),\n"
            "                                   then the model answers; --tool-calls strict: a call matches\n"
            "                                   a tool's name and parameters' schema, required: every reply\n"
            "                                   is calls, strict\n"
            "  devices [--json]                 list Vulkan devices, preferred first\n"
            "  info MODEL [--json]              architecture, shapes, device and memory plan\n"
            "  discover DIR [--json] [--depth N] [--follow-symlinks] [--quick]\n"
            "                                   the models under DIR (safetensors directories, .gguf files)\n"
            "                                   and whether forge can load each, read from their headers\n"
            "  logits MODEL --tokens \"1 2 3\" [--all] [--adapter DIR]\n"
            "                                   logits of the last (or every) position as JSON (one pass:\n"
            "                                   Ctrl-C ends it at once)\n"
            "  keys MODEL --tokens \"1 2 3\" [--layer L] [--json] [--adapter DIR]\n"
            "                                   after the tokens, every layer's (or layer L's) attention keys\n"
            "                                   (post-RoPE, per KV head): the shape and the positions its cache\n"
            "                                   holds; --json: one JSON object with the values\n"
            "  classify MODEL (--stdin-json | PROMPT...) [--logits] [--temp T] [--top-k K] [--top-p P]\n"
            "      [--min-p M] [--seed S] [--no-special] [--json] [--choices \"a,b,c\"]\n"
            "                                   the next token of each prompt, in batched forward passes:\n"
            "                                   a JSON array of {\"id\", \"text\"[, \"logits\"]}; --stdin-json reads\n"
            "                                   a JSON array of strings or token-id arrays; greedy unless\n"
            "                                   --temp > 0 (the default --seed is fixed, 0); a prompt longer\n"
            "                                   than the model's context (or --ctx) is refused; Ctrl-C stops\n"
            "                                   between batches, printing no results; --choices: each\n"
            "                                   answer is one of the strings (its \"choice\" in the output)\n"
            "  embed MODEL (--stdin-json | TEXT...) [--json] [--pooling last|mean|cls]\n"
            "      [--normalize|--no-normalize] [--dim N] [--prompt-name NAME | --prompt TEXT] [--no-truncate]\n"
            "      [--profile]\n"
            "                                   one vector per text, as sentence-transformers' encode() makes\n"
            "                                   it (the checkpoint's pooling, Dense, Normalize and prompts;\n"
            "                                   without them the last token's hidden state): a line of\n"
            "                                   space-separated values per text, or with --json one JSON\n"
            "                                   object; --stdin-json reads a JSON array of strings; --dim N\n"
            "                                   keeps the first N values; --prompt-name: a prompt of the\n"
            "                                   checkpoint's (default: its default_prompt_name), --prompt:\n"
            "                                   this text, before each text; a text longer than the model's\n"
            "                                   limit keeps its first tokens (--no-truncate: refused);\n"
            "                                   Ctrl-C stops between batches, printing nothing\n"
            "  rerank MODEL --query Q (--stdin-json | DOC...) [--instruction TEXT] [--raw] [--json]\n"
            "      [--no-truncate]\n"
            "                                   each document's relevance to the query (a sequence-\n"
            "                                   classification head's sigmoid, or a Qwen3-Reranker's P(yes)):\n"
            "                                   a line SCORE<TAB>INDEX<TAB>the document's first 60 characters\n"
            "                                   per document, in the given order, or with --json one JSON\n"
            "                                   object; --raw: the logits; --instruction: the reranker's\n"
            "                                   <Instruct>; --stdin-json reads a JSON array of strings; a pair\n"
            "                                   longer than the context loses its end (--no-truncate:\n"
            "                                   refused); Ctrl-C stops between batches, printing nothing\n"
            "  bench MODEL [-p 512] [-n 128] [-r 3] [--batch B] [--profile]\n"
            "                                   prefill and decode speed as one JSON object (--batch: also\n"
            "                                   the aggregate decode speed of B sequences generated together;\n"
            "                                   --profile: also the device time of every kernel and shape;\n"
            "                                   --json-schema FILE, --grammar FILE or --json-object: also\n"
            "                                   decoding under that constraint, and its cost a token)\n"
            "  bench MODEL --train [--batch 4] [--seq 512] [--rank 8] [--targets q_proj,v_proj]\n"
            "      [--grad-checkpoint|--no-grad-checkpoint] [-r 5] [--profile]\n"
            "                                   LoRA training step time and tok/s as one JSON object;\n"
            "                                   Ctrl-C stops either at the next token or step, printing nothing\n"
            "  train MODEL --data FILE.jsonl --out DIR [--valid FILE.jsonl] [--rank R] [--steps N] ...\n"
            "                                   LoRA fine-tuning; `forge train --help` lists the options\n"
            "  tokenize PATH [--special] [--no-parse-special] [--json] (TEXT | --stdin-json)\n"
            "                                   token ids as a JSON array (--stdin-json: a JSON array of\n"
            "                                   strings in, a JSON array of id arrays out); --special adds\n"
            "                                   BOS etc. as the tokenizer declares; --no-parse-special reads\n"
            "                                   special-token text as plain text\n"
            "  tokenize PATH [--skip-special] [--json] --decode (IDS | --stdin-json)\n"
            "                                   text of the ids (\"1 2 3\" or \"[1,2,3]\"), --json: as a JSON string;\n"
            "                                   --stdin-json: a JSON array of id arrays in, a JSON array of\n"
            "                                   strings out\n"
            "  bench-tokenize PATH TEXTFILE [-r 3]\n"
            "                                   tokenizer load time and encode speed as one JSON object\n"
            "options: --device INDEX|NAME   choose the Vulkan device\n"
            "         --ctx N               context length of the session\n"
            "         --ctx-overflow MODE   run, chat: on a full context fail (run's default), shift (chat's\n"
            "                               default: llama.cpp's context shift, approximate) or recompute\n"
            "                               (re-prefill the kept tokens: exact); both keep --keep N tokens\n"
            "                               (default 0: the BOS token) and drop the oldest half of the rest\n"
            "         --adapter DIR         run, chat, logits, classify, bench: apply a LoRA adapter (PEFT or mlx-lm)\n"
            "         --merge-adapter       with --adapter: merge it into the weights at load (f32/f16/bf16)\n"
            "         --exact               every product in f32 (no tensor cores, no int8 activations: slower, no rounding)\n"
            "         --kv f16|f32|q8_0     the KV cache's type (default: f16 on GPUs, f32 on CPUs and with --exact)\n"
            "         --json                run, devices, info, discover, keys, classify, embed, rerank,\n"
            "                               tokenize, train: the results as JSON on stdout, one schema per\n"
            "                               command (docs/json.md); logits and bench always print JSON\n"
            "                               (and take --json as well)\n"
            "         -v                    log to stderr\n"
            "MODEL: a directory (config.json + *.safetensors), a .safetensors file or a .gguf file;\n"
            "       -m MODEL or --model MODEL may stand for it; when the command line names none, the\n"
            "       FORGE_MODEL environment variable does (classify, embed, rerank: then every argument\n"
            "       is a PROMPT, TEXT or DOC)\n"
            "PATH: a MODEL, a tokenizer.json, a directory holding one, or a vocab-only .gguf\n"
            "progress: a bar on stderr while a model loads and while forge train steps, only when stderr\n"
            "       is a terminal\n"
            "exit status: 0 done, 1 a runtime error (forge: ... on stderr), 2 a usage error, 130 stopped by\n"
            "       Ctrl-C (a second Ctrl-C kills at once)\n";

static void usage(FILE *f) { fputs(usage_text, f); }

/* forge help VERB, forge VERB --help: the entries of that command and the options (cli.h). 0
 * when the command exists. */
int forge_cli_verb_help(const char *verb, FILE *f) {
    size_t vl = strlen(verb);
    bool in = false, found = false;
    for (const char *l = usage_text; *l;) {
        size_t n = strcspn(l, "\n") + (strchr(l, '\n') ? 1 : 0);
        if (l[0] != ' ') in = false; /* usage:, options: and the notes after them */
        else if (l[1] == ' ' && l[2] != ' ') in = !strncmp(l + 2, verb, vl) && (l[2 + vl] == ' ' || l[2 + vl] == '\n');
        if (in) {
            fputs(l[2] != ' ' ? (found ? "       forge " : "usage: forge ") : "", f);
            fwrite(l[2] != ' ' ? l + 2 : l, 1, l[2] != ' ' ? n - 2 : n, f);
            found = true;
        }
        l += n;
    }
    if (found) fputs(strstr(usage_text, "options:"), f);
    return found ? 0 : 2;
}

int forge_cli_unexpected(const char *verb, const char *arg) {
    fprintf(stderr, "forge %s: unexpected argument '%s'\n", verb, arg);
    forge_cli_verb_help(verb, stderr);
    return 2;
}

int forge_cli_needs_value(const char *verb, const char *arg, int has_value, const char *const *flags) {
    for (; !has_value && *flags; flags++)
        if (!strcmp(arg, *flags)) {
            fprintf(stderr, "forge %s: %s needs a value\n", verb, arg);
            forge_cli_verb_help(verb, stderr);
            return 2;
        }
    return 0;
}

/* A usage error other than an unexpected argument: "forge VERB: MESSAGE", then VERB's usage. 2. */
static int verb_usage_error(const char *verb, const char *message) {
    fprintf(stderr, "forge %s: %s\n", verb, message);
    forge_cli_verb_help(verb, stderr);
    return 2;
}

int forge_cli_usage_error(const char *verb, const char *message) { return verb_usage_error(verb, message); }

static const char no_model[] = "no MODEL given (and FORGE_MODEL is not set)";

static const char *type_name(forge_device_type t) {
    switch (t) {
    case FORGE_DEVICE_DISCRETE_GPU: return "discrete";
    case FORGE_DEVICE_INTEGRATED_GPU: return "integrated";
    case FORGE_DEVICE_VIRTUAL_GPU: return "virtual";
    case FORGE_DEVICE_CPU: return "cpu";
    default: return "other";
    }
}

static void device_json(const forge_device_info *d) {
    printf("{\"index\": %d, \"name\": ", d->index);
    forge_cli_json_cstr(d->name);
    printf(", \"type\": \"%s\", \"driver\": ", type_name(d->type));
    forge_cli_json_cstr(d->driver);
    printf(", \"vendor_id\": %u, \"vulkan\": \"%u.%u.%u\", \"device_local_bytes\": %llu, \"max_storage_buffer_range\": %llu, "
           "\"max_allocation_size\": %llu, \"max_buffer_size\": %llu, \"subgroup_size\": %u, \"fp16\": %s, \"int8\": %s, "
           "\"integer_dot_product\": %s, \"cooperative_matrix\": %s, \"usable\": %s}",
           d->vendor_id, (d->api_version >> 22) & 0x7f, (d->api_version >> 12) & 0x3ff, d->api_version & 0xfff,
           (unsigned long long)d->device_local_bytes, (unsigned long long)d->max_storage_buffer_range,
           (unsigned long long)d->max_allocation_size, (unsigned long long)d->max_buffer_size, d->subgroup_size,
           d->fp16 ? "true" : "false", d->int8 ? "true" : "false", d->integer_dot_product ? "true" : "false",
           d->cooperative_matrix ? "true" : "false", d->usable ? "true" : "false");
}

static int cmd_devices(int argc, char **argv) {
    int json = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else return forge_cli_unexpected("devices", argv[i]);
    }
    forge_device_info devs[16] = {{.struct_size = sizeof devs[0]}};
    int n = 0;
    char err[512];
    if (forge_list_devices(devs, 16, &n, err, sizeof err) != FORGE_OK) {
        fprintf(stderr, "forge: %s\n", err);
        return 1;
    }
    if (n > 16) n = 16;
    if (json) {
        putchar('[');
        for (int i = 0; i < n; i++) {
            fputs(i ? ",\n " : "", stdout);
            device_json(&devs[i]);
        }
        puts("]");
        return 0;
    }
    for (int i = 0; i < n; i++) {
        forge_device_info *d = &devs[i];
        printf("%d: %s [%s]%s\n", d->index, d->name, type_name(d->type), d->usable ? "" : " (not usable)");
        printf("   driver %s, Vulkan %u.%u.%u, %.1f GiB device-local\n", d->driver, (d->api_version >> 22) & 0x7f,
               (d->api_version >> 12) & 0x3ff, d->api_version & 0xfff, (double)d->device_local_bytes / (1 << 30));
        printf("   maxStorageBufferRange %llu, maxMemoryAllocationSize %llu, maxBufferSize %llu, subgroup %u\n",
               (unsigned long long)d->max_storage_buffer_range, (unsigned long long)d->max_allocation_size,
               (unsigned long long)d->max_buffer_size, d->subgroup_size);
        printf("   fp16 %s, int8 %s, integer dot product %s, cooperative matrix %s\n", d->fp16 ? "yes" : "no",
               d->int8 ? "yes" : "no", d->integer_dot_product ? "yes" : "no", d->cooperative_matrix ? "yes" : "no");
    }
    return 0;
}

static void print_bytes(const char *label, unsigned long long b) {
    printf("  %-28s %llu bytes (%.2f MiB)\n", label, b, (double)b / (1 << 20));
}

/* forge info --json: one object (docs/json.md). n_linear: the linear-attention layers, -1 when
 * unknown (no session could be planned). */
static void info_json(const forge_model_info *in, int n_linear, const forge_memory_stats *mem, const forge_memory_stats *plan, int ctx,
                      int slots) {
    printf("{\"name\": ");
    forge_cli_json_cstr(in->name);
    printf(", \"format\": \"%s\", \"architecture\": ", in->source_format);
    forge_cli_json_cstr(in->architecture);
    printf(", \"n_layers\": %d, ", in->n_layers);
    if (n_linear >= 0) printf("\"n_linear_layers\": %d, ", n_linear);
    else printf("\"n_linear_layers\": null, ");
    printf("\"hidden\": %d, \"n_heads\": %d, \"n_kv_heads\": %d, \"head_dim\": %d, \"ffn\": %d, \"n_vocab\": %d, "
           "\"n_ctx_train\": %d, \"sliding_window\": %d, \"n_sliding_layers\": %d, \"tied_embeddings\": %s, \"weight_dtype\": ",
           in->hidden, in->n_heads, in->n_kv_heads, in->head_dim, in->ffn, in->n_vocab, in->n_ctx_train, in->sliding_window,
           in->n_sliding_layers, in->tied_embeddings ? "true" : "false");
    forge_cli_json_cstr(in->weight_dtype);
    printf(", \"n_params\": %llu, \"weight_bytes\": %llu, \"device\": ", (unsigned long long)in->n_params,
           (unsigned long long)in->weight_bytes);
    forge_cli_json_cstr(in->device_name);
    printf(", \"driver\": ");
    forge_cli_json_cstr(in->device_driver);
    printf(",\n \"memory\": {\"host_arena_bytes\": %llu, \"device_planned_bytes\": %llu, \"device_in_use_bytes\": %llu, "
           "\"device_buffers\": %llu}",
           (unsigned long long)mem->host_arena_bytes, (unsigned long long)mem->device_planned_bytes,
           (unsigned long long)mem->device_in_use_bytes, (unsigned long long)mem->device_buffers);
    if (plan)
        printf(",\n \"session\": {\"n_ctx\": %d, \"device_planned_bytes\": %llu, \"kv_cache_bytes\": %llu, \"kv_sliding_bytes\": %llu, "
               "\"sliding_positions\": %d, \"state_bytes\": %llu}",
               ctx, (unsigned long long)plan->device_planned_bytes, (unsigned long long)plan->kv_cache_bytes,
               (unsigned long long)plan->kv_sliding_bytes, slots, (unsigned long long)plan->state_bytes);
    else printf(",\n \"session\": null");
    printf("}\n");
}

/* How many of the model's layers are linear-attention layers (Qwen 3.5's Gated DeltaNet), for a
 * model whose session plan has a recurrent state (state_bytes > 0; without one, none are).
 * forge_model_info does not count them, but forge_session_keys refuses exactly those layers
 * (FORGE_ERR_INVALID_ARGUMENT; a layer in range, an empty session), so a session of 16 positions
 * is asked layer by layer. -1 when that session cannot be made. */
static int count_linear_layers(forge_model *m, const forge_cli_opts *o, int n_layers) {
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = sp.n_batch = 16;
    sp.n_outputs_max = 1;
    sp.kv_type = o->kv_type;
    forge_session *s = NULL;
    if (forge_session_create(m, &sp, &s) != FORGE_OK) return -1;
    int n = 0;
    for (int l = 0; l < n_layers; l++) {
        forge_keys_info k = {.struct_size = sizeof k};
        n += forge_session_keys(s, l, NULL, 0, &k) == FORGE_ERR_INVALID_ARGUMENT;
    }
    forge_session_free(s);
    return n;
}

/* "4 (3 linear-attention, 1 full-attention)", "26 (21 sliding-window, 5 full-attention)", "16". */
static void layer_kinds(const forge_model_info *in, int n_linear, char *out, size_t size) {
    int full = in->n_layers - in->n_sliding_layers - (n_linear > 0 ? n_linear : 0);
    if (n_linear <= 0 && !in->n_sliding_layers) { snprintf(out, size, "%d", in->n_layers); return; }
    int len = snprintf(out, size, "%d (", in->n_layers);
    if (n_linear > 0) len += snprintf(out + len, size - (size_t)len, "%d linear-attention, ", n_linear);
    if (in->n_sliding_layers) len += snprintf(out + len, size - (size_t)len, "%d sliding-window, ", in->n_sliding_layers);
    if (full) len += snprintf(out + len, size - (size_t)len, "%d full-attention, ", full);
    snprintf(out + len - 2, size - (size_t)len + 2, ")");
}

static int cmd_info(int argc, char **argv) {
    forge_cli_opts o = {0};
    if (forge_cli_take_common("info", &argc, argv, &o, 0)) return 2;
    int json = 0;
    const char *path = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!path && argv[i][0] != '-') path = argv[i];
        else return forge_cli_unexpected("info", argv[i]);
    }
    if (!path && !(path = forge_cli_env_model())) {
        return verb_usage_error("info", no_model);
    }
    forge_model *m = forge_cli_load(path, &o);
    if (!m) return 1;
    forge_model_info in = {.struct_size = sizeof in};
    forge_model_get_info(m, &in);
    forge_memory_stats mem = {.struct_size = sizeof mem};
    forge_model_memory(m, &mem);
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = o.n_ctx;
    sp.kv_type = o.kv_type;
    forge_memory_stats plan = {.struct_size = sizeof plan};
    int planned = forge_session_plan(m, &sp, &plan) == FORGE_OK;
    char plan_error[512];
    snprintf(plan_error, sizeof plan_error, "%s", planned ? "" : forge_model_errmsg(m));
    int n_linear = !planned ? -1 : plan.state_bytes ? count_linear_layers(m, &o, in.n_layers) : 0;
    int ctx = o.n_ctx ? o.n_ctx : (in.n_ctx_train < 4096 ? in.n_ctx_train : 4096);
    int nb = sp.n_batch ? sp.n_batch : 512;
    if (nb > ctx) nb = ctx;
    /* a sliding layer's cache rotates through window + n_batch - 1 positions, not n_ctx */
    int slots = !in.n_sliding_layers ? 0 : in.sliding_window + nb - 1 < ctx ? in.sliding_window + nb - 1 : ctx;
    if (json) {
        info_json(&in, n_linear, &mem, planned ? &plan : NULL, ctx, slots);
        if (!planned) fprintf(stderr, "forge info: session plan: %s\n", plan_error);
        forge_model_free(m);
        return 0;
    }
    char layers[128];
    layer_kinds(&in, n_linear, layers, sizeof layers);
    printf("model            %s\n", in.name);
    printf("format           %s\n", in.source_format);
    printf("architecture     %s\n", in.architecture);
    printf("layers           %s\n", layers);
    printf("hidden           %d\n", in.hidden);
    printf("heads            %d\n", in.n_heads);
    printf("kv heads         %d\n", in.n_kv_heads);
    printf("head dim         %d\n", in.head_dim);
    printf("ffn              %d\n", in.ffn);
    printf("vocab            %d\n", in.n_vocab);
    printf("context          %d\n", in.n_ctx_train);
    if (in.n_sliding_layers) printf("sliding window   %d (%d of %d layers)\n", in.sliding_window, in.n_sliding_layers, in.n_layers);
    printf("tied embeddings  %s\n", in.tied_embeddings ? "yes" : "no");
    printf("dtype            %s\n", in.weight_dtype);
    printf("parameters       %llu\n", (unsigned long long)in.n_params);
    printf("device           %s (%s)\n", in.device_name, in.device_driver);
    printf("memory plan\n");
    print_bytes("host arena (model)", mem.host_arena_bytes);
    print_bytes("device weights planned", mem.device_planned_bytes);
    print_bytes("device weights in use", mem.device_in_use_bytes);
    printf("  %-28s %llu buffers\n", "device weight blocks", (unsigned long long)mem.device_buffers);
    if (planned) {
        char label[64];
        snprintf(label, sizeof label, "session (n_ctx %d)", ctx);
        print_bytes(label, plan.device_planned_bytes);
        print_bytes("  of which KV cache", plan.kv_cache_bytes);
        if (in.n_sliding_layers) {
            char l2[96];
            snprintf(l2, sizeof l2, "  of which %d sliding layers", in.n_sliding_layers);
            print_bytes(l2, plan.kv_sliding_bytes);
            printf("  %-28s %d positions each (window %d + n_batch %d - 1), not n_ctx\n", "  rotating KV cache", slots,
                   in.sliding_window, nb);
        }
        if (plan.state_bytes) {
            print_bytes("  of which recurrent state", plan.state_bytes);
            if (n_linear > 0)
                printf("  %-28s %d linear-attention layers (a sequence's and the prompt cache's checkpoint), not n_ctx\n",
                       "  recurrent state", n_linear);
        }
        print_bytes("total device (model+session)", mem.device_planned_bytes + plan.device_planned_bytes);
    } else {
        printf("  session plan: %s\n", plan_error);
    }
    forge_model_free(m);
    return 0;
}

/* ---- forge discover ---- */

/* 1234 -> "1234", 1.5e9 -> "1.50G" */
static void human_count(uint64_t n, const char *const units[4], double base, char *out, size_t size) {
    double v = (double)n;
    int u = 0;
    while (v >= base && u < 3) { v /= base; u++; }
    if (u == 0) snprintf(out, size, "%llu%s", (unsigned long long)n, units[0]);
    else snprintf(out, size, "%.*f%s", v < 10 ? 2 : v < 100 ? 1 : 0, v, units[u]);
}

typedef struct discover_row {
    char *path, *cells[6], *status;
} discover_row;

typedef struct discover_out {
    int json, n;
    discover_row *rows;
    int failed;                /* out of memory while collecting */
} discover_out;

static void discover_json(const forge_discovered_model *d, int first) {
    printf("%s\n  {\"path\": ", first ? "" : ",");
    forge_cli_json_cstr(d->path);
    printf(", \"format\": \"%s\", \"architecture\": ", d->format_name);
    forge_cli_json_cstr(d->architecture);
    printf(", \"weight_dtype\": ");
    forge_cli_json_cstr(d->weight_dtype);
    printf(", \"quant_bits\": %d, \"n_params\": %llu, \"n_files\": %d, \"bytes\": %llu, \"device_bytes\": %llu,",
           d->quant_bits, (unsigned long long)d->n_params, d->n_files, (unsigned long long)d->bytes, (unsigned long long)d->device_bytes);
    printf(" \"loadable\": %s, \"status\": \"%s\", \"reason\": ", d->loadable ? "true" : "false", forge_status_name(d->status));
    forge_cli_json_cstr(d->reason);
    printf("}");
}

static int discover_found(void *user, const forge_discovered_model *d) {
    discover_out *o = (discover_out *)user;
    if (o->json) {
        discover_json(d, o->n++ == 0);
        fflush(stdout);
        return 0;
    }
    discover_row *rows = (discover_row *)realloc(o->rows, sizeof *rows * (size_t)(o->n + 1));
    if (!rows) { o->failed = 1; return 1; }
    o->rows = rows;
    static const char *const count_units[4] = {"", "K", "M", "G"}, *const byte_units[4] = {" B", " KiB", " MiB", " GiB"};
    char params[32], size[32], files[64], bits[16], status[1100];
    human_count(d->n_params, count_units, 1000.0, params, sizeof params);
    human_count(d->bytes, byte_units, 1024.0, size, sizeof size);
    snprintf(files, sizeof files, "%d (%s)", d->n_files, size);
    snprintf(bits, sizeof bits, "%d", d->quant_bits);
    snprintf(status, sizeof status, "%s%s", d->loadable ? "yes" : "no: ", d->reason);
    discover_row *r = &rows[o->n++];
    r->path = strdup(d->path);
    const char *cells[6] = {d->format_name, *d->architecture ? d->architecture : "?", *d->weight_dtype ? d->weight_dtype : "?",
                            d->quant_bits ? bits : "?", params, files};
    for (int i = 0; i < 6; i++) r->cells[i] = strdup(cells[i]);
    r->status = strdup(status);
    return 0;
}

static void discover_log(void *user, forge_log_level level, const char *msg) {
    (void)user;
    (void)level;
    fprintf(stderr, "forge discover: %s\n", msg);
}

static int cmd_discover(int argc, char **argv) {
    forge_discover_params p = forge_discover_default_params();
    discover_out o = {0};
    const char *dir = NULL;
    static const char *const values[] = {"--depth", NULL};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (forge_cli_needs_value("discover", a, i + 1 < argc, values)) return 2;
        if (!strcmp(a, "--json")) o.json = 1;
        else if (!strcmp(a, "--quick")) p.quick = 1;
        else if (!strcmp(a, "--follow-symlinks")) p.follow_symlinks = 1;
        else if (!strcmp(a, "-v")) p.log = discover_log;
        else if (!strcmp(a, "--depth") && i + 1 < argc) {
            long long v;
            if (forge_cli_parse_int("discover", "--depth", argv[++i], 0, 1000, &v)) return 2;
            p.max_depth = (int)v;
        } else if (a[0] != '-' && !dir) dir = a;
        else return forge_cli_unexpected("discover", a);
    }
    if (!dir) return verb_usage_error("discover", "no DIR given");
    if (o.json) printf("[");
    char err[512];
    forge_status st = forge_discover(dir, &p, discover_found, &o, err, sizeof err);
    if (o.json) printf("%s]\n", o.n ? "\n" : "");
    if (st) {
        fprintf(stderr, "forge discover: %s\n", err);
        return 1;
    }
    if (!o.json) {
        static const char *const head[8] = {"PATH", "FORMAT", "ARCH", "DTYPE", "BITS", "PARAMS", "FILES", "LOADABLE"};
        int w[7];
        for (int c = 0; c < 7; c++) w[c] = (int)strlen(head[c]);
        for (int i = 0; i < o.n; i++)
            for (int c = 0; c < 7; c++) {
                const char *cell = c ? o.rows[i].cells[c - 1] : o.rows[i].path;
                int n = cell ? (int)strlen(cell) : 0;
                if (n > w[c]) w[c] = n;
            }
        for (int c = 0; c < 7 && o.n; c++) printf("%-*s  ", w[c], head[c]);
        if (o.n) printf("%s\n", head[7]);
        for (int i = 0; i < o.n; i++) {
            for (int c = 0; c < 7; c++) {
                const char *cell = c ? o.rows[i].cells[c - 1] : o.rows[i].path;
                printf("%-*s  ", w[c], cell ? cell : "");
            }
            printf("%s\n", o.rows[i].status ? o.rows[i].status : "");
        }
        if (!o.n) printf("no models under %s\n", dir);
    }
    for (int i = 0; i < o.n && !o.json; i++) {
        free(o.rows[i].path);
        for (int c = 0; c < 6; c++) free(o.rows[i].cells[c]);
        free(o.rows[i].status);
    }
    free(o.rows);
    if (o.failed) { fprintf(stderr, "forge discover: out of memory\n"); return 1; }
    return 0;
}

/* The ids of --tokens ("1 2 3" or "1,2,3"; run, logits, keys), malloc'd, *n of them; NULL after
 * a message naming the verb when the list is empty or holds anything but integers in 0..INT32_MAX
 * (the vocabulary is checked later: by run_refuses for run, by the library for logits and keys). */
static int32_t *parse_tokens(const char *cmd, const char *toks, int *n) {
    int cap = 16;
    int32_t *ids = malloc(sizeof *ids * (size_t)cap);
    *n = 0;
    for (const char *p = toks; ids && *p;) {
        while (*p == ' ' || *p == ',' || *p == '\t') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "forge %s: --tokens: '%s' is not a list of token ids (integers >= 0, separated by spaces or commas)\n", cmd,
                    toks);
            free(ids);
            return NULL;
        }
        if (*n == cap) {
            int32_t *bigger = realloc(ids, sizeof *ids * (size_t)(cap *= 2));
            if (!bigger) free(ids);
            ids = bigger;
        }
        if (ids) ids[(*n)++] = (int32_t)v;
        p = end;
    }
    if (!ids) fprintf(stderr, "forge %s: out of host memory\n", cmd);
    else if (*n == 0) {
        fprintf(stderr, "forge %s: --tokens is empty\n", cmd);
        free(ids);
        ids = NULL;
    }
    return ids;
}

/* A session on m long enough for n tokens (--ctx when given); NULL after a message. */
static forge_session *tokens_session(forge_model *m, const forge_cli_opts *o, int n) {
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = o->n_ctx ? o->n_ctx : (n > 4096 ? n : 0);
    sp.kv_type = o->kv_type;
    forge_session *s = NULL;
    if (forge_session_create(m, &sp, &s) != FORGE_OK) fprintf(stderr, "forge: %s\n", forge_model_errmsg(m));
    return s;
}

static int cmd_logits(int argc, char **argv) {
    forge_cli_opts o = {0};
    if (forge_cli_take_common("logits", &argc, argv, &o, 1)) return 2;
    const char *path = NULL, *toks = NULL;
    int all = 0;
    static const char *const values[] = {"--tokens", NULL};
    for (int i = 0; i < argc; i++) {
        if (forge_cli_needs_value("logits", argv[i], i + 1 < argc, values)) return 2;
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) toks = argv[++i];
        else if (!strcmp(argv[i], "--all")) all = 1;
        else if (!strcmp(argv[i], "--json")) continue; /* the output is JSON already; accepted as every verb's is */
        else if (!path && argv[i][0] != '-') path = argv[i];
        else return forge_cli_unexpected("logits", argv[i]);
    }
    if (!path) path = forge_cli_env_model();
    if (!path) return verb_usage_error("logits", no_model);
    if (!toks) return verb_usage_error("logits", "--tokens \"1 2 3\" is required");
    int n;
    int32_t *ids = parse_tokens("logits", toks, &n);
    if (!ids) return 2;
    forge_model *m = forge_cli_load(path, &o);
    if (!m) { free(ids); return 1; }
    forge_session *s = tokens_session(m, &o, n);
    int rc = 1;
    if (s) {
        int V = forge_model_n_vocab(m);
        size_t rows = all ? (size_t)n : 1;
        float *lg = malloc(sizeof(float) * rows * (size_t)V);
        forge_status st = forge_eval(s, ids, n, all ? FORGE_EVAL_ALL_LOGITS : 0, lg, rows * (size_t)V);
        if (st != FORGE_OK) {
            fprintf(stderr, "forge: %s (%s)\n", forge_session_errmsg(s), forge_status_name(st));
        } else {
            printf("{\"n_vocab\": %d, \"n_tokens\": %d, \"logits\": [", V, n);
            for (size_t r = 0; r < rows; r++) {
                printf(r ? ", [" : "[");
                for (int j = 0; j < V; j++) printf(j ? ", %.9g" : "%.9g", lg[r * (size_t)V + (size_t)j]);
                printf("]");
            }
            printf("]}\n");
            rc = 0;
        }
        free(lg);
        forge_session_free(s);
    }
    forge_model_free(m);
    free(ids);
    return rc;
}

/* Prints one layer's keys: a line of shape and positions, or with json its JSON object. */
static int print_keys(forge_session *s, int layer, int json) {
    forge_keys_info in = {.struct_size = sizeof in};
    forge_status st = forge_session_keys(s, layer, NULL, 0, &in);
    float *k = st ? NULL : malloc(sizeof(float) * (in.n_floats ? in.n_floats : 1));
    if (!st) st = forge_session_keys(s, layer, k, in.n_floats, &in);
    if (st) {
        fprintf(stderr, "forge: %s (%s)\n", forge_session_errmsg(s), forge_status_name(st));
        free(k);
        return 1;
    }
    if (!json) {
        printf("layer %d: keys [%d, %d, %d] (kv heads, positions, head_dim), positions %d..%d, %s", layer, in.n_kv_heads, in.n_rows,
               in.head_dim, in.first, in.first + in.n_rows - 1, in.window ? "sliding window " : "full attention\n");
        if (in.window) printf("%d\n", in.window);
    } else {
        printf("{\"layer\": %d, \"window\": %d, \"first\": %d, \"n_rows\": %d, \"keys\": [", layer, in.window, in.first, in.n_rows);
        for (int h = 0; h < in.n_kv_heads; h++) {
            printf(h ? ", [" : "[");
            for (int r = 0; r < in.n_rows; r++) {
                const float *row = k + ((size_t)h * (size_t)in.n_rows + (size_t)r) * (size_t)in.head_dim;
                printf(r ? ", [" : "[");
                for (int d = 0; d < in.head_dim; d++) printf(d ? ", %.9g" : "%.9g", row[d]);
                printf("]");
            }
            printf("]");
        }
        printf("]}");
    }
    free(k);
    return 0;
}

static int cmd_keys(int argc, char **argv) {
    forge_cli_opts o = {0};
    if (forge_cli_take_common("keys", &argc, argv, &o, 1)) return 2;
    const char *path = NULL, *toks = NULL;
    int json = 0, layer = -1;
    static const char *const values[] = {"--tokens", "--layer", NULL};
    for (int i = 0; i < argc; i++) {
        if (forge_cli_needs_value("keys", argv[i], i + 1 < argc, values)) return 2;
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) toks = argv[++i];
        else if (!strcmp(argv[i], "--layer") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i] || v < 0 || v > 1000000) { fprintf(stderr, "forge: --layer: '%s' is not a layer number\n", argv[i]); return 2; }
            layer = (int)v;
        } else if (!strcmp(argv[i], "--json")) json = 1;
        else if (!path && argv[i][0] != '-') path = argv[i];
        else return forge_cli_unexpected("keys", argv[i]);
    }
    if (!path) path = forge_cli_env_model();
    if (!path) return verb_usage_error("keys", no_model);
    if (!toks) return verb_usage_error("keys", "--tokens \"1 2 3\" is required");
    int n;
    int32_t *ids = parse_tokens("keys", toks, &n);
    if (!ids) return 2;
    forge_model *m = forge_cli_load(path, &o);
    if (!m) { free(ids); return 1; }
    forge_session *s = tokens_session(m, &o, n);
    int rc = 1;
    forge_keys_info in = {.struct_size = sizeof in};
    forge_status st;
    if (s && (st = forge_eval(s, ids, n, 0, NULL, 0)) != FORGE_OK) {
        fprintf(stderr, "forge: %s (%s)\n", forge_session_errmsg(s), forge_status_name(st));
    } else if (s && layer >= 0 && (st = forge_session_keys(s, layer, NULL, 0, &in)) != FORGE_OK) {
        fprintf(stderr, "forge: %s (%s)\n", forge_session_errmsg(s), forge_status_name(st));
    } else if (s && !forge_session_keys(s, 0, NULL, 0, &in)) {
        int from = layer < 0 ? 0 : layer, to = layer < 0 ? in.n_layers : layer + 1;
        if (json)
            printf("{\"n_tokens\": %d, \"n_layers\": %d, \"n_kv_heads\": %d, \"head_dim\": %d, \"layout\": \"keys[kv_head][row][d], row r at "
                   "position first + r\", \"layers\": [", n, in.n_layers, in.n_kv_heads, in.head_dim);
        rc = 0;
        for (int l = from; l < to && !rc; l++) {
            if (json && l > from) printf(", ");
            rc = print_keys(s, l, json);
        }
        if (json && !rc) printf("]}\n");
    }
    forge_session_free(s);
    forge_model_free(m);
    free(ids);
    return rc;
}

/* Prints the ids of one text as a JSON array; 0 on success. */
static int print_ids(forge_model *m, const char *text, size_t len, uint32_t flags) {
    size_t cap = len + 16, n = 0;
    int32_t *ids = malloc(sizeof *ids * cap);
    forge_status st = forge_tokenize(m, text, len, flags, ids, cap, &n);
    if (st == FORGE_ERR_BUFFER_TOO_SMALL) {
        ids = realloc(ids, sizeof *ids * (cap = n));
        st = forge_tokenize(m, text, len, flags, ids, cap, &n);
    }
    if (st != FORGE_OK) {
        fprintf(stderr, "forge: %s (%s)\n", forge_model_errmsg(m), forge_status_name(st));
        free(ids);
        return 1;
    }
    forge_cli_json_ids(ids, n);
    free(ids);
    return 0;
}

/* The text of ids (NUL-terminated, malloc'd; *len its length); NULL after the library's message. */
static char *ids_text(forge_model *m, const int32_t *ids, size_t n, uint32_t flags, size_t *len) {
    size_t cap = 64 + 16 * n;
    char *text = malloc(cap);
    forge_status st = text ? forge_detokenize(m, ids, n, flags, text, cap, len) : FORGE_ERR_OUT_OF_MEMORY;
    if (st == FORGE_ERR_BUFFER_TOO_SMALL) {
        char *bigger = realloc(text, cap = *len + 1);
        st = bigger ? forge_detokenize(m, ids, n, flags, text = bigger, cap, len) : FORGE_ERR_OUT_OF_MEMORY;
    }
    if (st != FORGE_OK) {
        fprintf(stderr, "forge: %s (%s)\n", st == FORGE_ERR_OUT_OF_MEMORY ? "out of host memory" : forge_model_errmsg(m),
                forge_status_name(st));
        free(text);
        return NULL;
    }
    return text;
}

/* Prints the text of ids as a JSON string (json) or as it is; 0 on success. */
static int print_text(forge_model *m, const int32_t *ids, size_t n, uint32_t flags, int json) {
    size_t len = 0;
    char *text = ids_text(m, ids, n, flags, &len);
    if (!text) return 1;
    if (json) forge_cli_json_string(text, len);
    else fwrite(text, 1, len, stdout);
    free(text);
    return 0;
}

static int32_t *json_ids(const cJSON *arr, size_t *n) {
    size_t cnt = (size_t)cJSON_GetArraySize(arr), k = 0;
    int32_t *ids = malloc(sizeof *ids * (cnt ? cnt : 1));
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        /* an integer that fits int32_t (the library then checks it against the vocabulary) */
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= INT32_MIN && it->valuedouble <= INT32_MAX) ||
            it->valuedouble != (double)(int32_t)it->valuedouble) {
            free(ids);
            return NULL;
        }
        ids[k++] = (int32_t)it->valuedouble;
    }
    *n = k;
    return ids;
}

static int cmd_tokenize(int argc, char **argv) {
    const char *path = NULL, *arg = NULL;
    int stdin_json = 0, decode = 0, verbose = 0, have_arg = 0, json = 0;
    uint32_t tflags = 0, dflags = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--special")) tflags |= FORGE_TOKENIZE_ADD_SPECIAL;
        else if (!strcmp(argv[i], "--no-parse-special")) tflags |= FORGE_TOKENIZE_NO_PARSE_SPECIAL;
        else if (!strcmp(argv[i], "--skip-special")) dflags |= FORGE_DETOKENIZE_SKIP_SPECIAL;
        else if (!strcmp(argv[i], "--stdin-json")) stdin_json = 1;
        else if (!strcmp(argv[i], "--decode")) decode = 1;
        else if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "-v")) verbose = 1;
        /* "--x" is an option; a TEXT may start with one dash ("-5 degrees") */
        else if (!strncmp(argv[i], "--", 2) && argv[i][2]) return forge_cli_unexpected("tokenize", argv[i]);
        else if (!path) path = argv[i];
        else if (!have_arg) { arg = argv[i]; have_arg = 1; }
        else return forge_cli_unexpected("tokenize", argv[i]);
    }
    /* FORGE_MODEL stands for PATH when the arguments leave no room for it: TEXT alone, or nothing with --stdin-json */
    const char *env = forge_cli_env_model();
    if (env && !have_arg && (stdin_json ? !path : path != NULL)) {
        arg = path;
        have_arg = !stdin_json;
        path = env;
    }
    if (!path) return verb_usage_error("tokenize", "no PATH given (and FORGE_MODEL is not set)");
    if (stdin_json && have_arg) return verb_usage_error("tokenize", "--stdin-json reads stdin: no TEXT or IDS argument goes with it");
    if (!stdin_json && !have_arg) return verb_usage_error("tokenize", decode ? "no IDS given (or --stdin-json)" : "no TEXT given (or --stdin-json)");
    forge_model *m = forge_cli_load_vocab(path, verbose);
    if (!m) return 1;
    int rc = 0;
    if (!stdin_json && !decode) {
        rc = print_ids(m, arg, strlen(arg), tflags);
        putchar('\n');
    } else if (!stdin_json) {
        cJSON *arr = NULL;
        int32_t *ids = NULL;
        size_t n = 0;
        if (arg[strspn(arg, " \t")] == '[') {
            arr = cJSON_Parse(arg);
            ids = arr && cJSON_IsArray(arr) ? json_ids(arr, &n) : NULL;
        } else {
            ids = malloc(sizeof *ids * (strlen(arg) / 2 + 1));
            for (char *p = (char *)arg, *end; ids;) {
                while (*p == ' ' || *p == ',' || *p == '\t') p++;
                if (!*p) break;
                long v = strtol(p, &end, 10);
                if (end == p) { free(ids); ids = NULL; break; }
                ids[n++] = (int32_t)v;
                p = end;
            }
        }
        cJSON_Delete(arr);
        if (!ids) { fprintf(stderr, "forge: --decode: '%s' is not a list of ids\n", arg); rc = 2; }
        else { rc = print_text(m, ids, n, dflags, json); putchar('\n'); }
        free(ids);
    } else {
        size_t len;
        char *in = forge_cli_read_stdin(&len);
        cJSON *arr = in ? cJSON_ParseWithLength(in, len) : NULL;
        if (!cJSON_IsArray(arr)) {
            fprintf(stderr, "forge: --stdin-json: stdin is not a JSON array\n");
            rc = 2;
        } else {
            putchar('[');
            const cJSON *it;
            int first = 1;
            cJSON_ArrayForEach(it, arr) {
                if (!first) fputs(", ", stdout);
                first = 0;
                if (!decode && cJSON_IsString(it)) {
                    rc = print_ids(m, it->valuestring, strlen(it->valuestring), tflags);
                } else if (decode && cJSON_IsArray(it)) {
                    size_t n;
                    int32_t *ids = json_ids(it, &n);
                    rc = ids ? print_text(m, ids, n, dflags, 1) : 2;
                    free(ids);
                } else {
                    rc = 2;
                }
                if (rc) { fprintf(stderr, "forge: --stdin-json: bad element\n"); break; }
            }
            puts("]");
        }
        cJSON_Delete(arr);
        free(in);
    }
    forge_model_free(m);
    return rc;
}

/* ---- forge classify: one forward pass per batch of prompts, the next token of each ---- */

/* Ids of a JSON array of integers, or NULL when an element is not an integer in int32 range. */
static int32_t *json_int_ids(const cJSON *arr, int *n) {
    int cnt = cJSON_GetArraySize(arr), k = 0;
    int32_t *ids = malloc(sizeof *ids * (size_t)(cnt ? cnt : 1));
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        double v = cJSON_IsNumber(it) ? it->valuedouble : 0.5;
        if (v < INT32_MIN || v > INT32_MAX || v != (double)(int32_t)v) { free(ids); return NULL; }
        ids[k++] = (int32_t)v;
    }
    *n = k;
    return ids;
}

static int cmd_classify_body(int argc, char **argv, const forge_cli_constraint *con) {
    forge_cli_opts o = {0};
    if (forge_cli_take_common("classify", &argc, argv, &o, 1)) return 2;
    forge_classify_params cp = forge_classify_default_params();
    cp.constraint = forge_cli_constraint_get(con);
    const char *path = NULL;
    int stdin_json = 0, want_logits = 0, n_args = 0;
    static const char *const values[] = {"--temp", "--top-p", "--min-p", "--top-k", "--seed", NULL};
    char **args = malloc(sizeof *args * (size_t)(argc + 1));
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        double d;
        long long k;
        uint64_t u;
        if (forge_cli_needs_value("classify", a, has, values)) { free(args); return 2; }
        if (!strcmp(a, "--stdin-json")) stdin_json = 1;
        else if (!strcmp(a, "--logits")) want_logits = 1;
        else if (!strcmp(a, "--json")) continue; /* the output is JSON already; accepted as every verb's is */
        else if (!strcmp(a, "--no-special")) cp.add_special = 0;
        else if (!strcmp(a, "--temp") && has) {
            if (forge_cli_parse_double("classify", a, argv[++i], 0, 0, 1e9, 0, &d)) { free(args); return 2; }
            cp.temperature = (float)d;
        } else if (!strcmp(a, "--top-p") && has) {
            if (forge_cli_parse_double("classify", a, argv[++i], 0, 1, 1, 0, &d)) { free(args); return 2; }
            cp.top_p = (float)d;
        } else if (!strcmp(a, "--min-p") && has) {
            if (forge_cli_parse_double("classify", a, argv[++i], 0, 0, 1, 0, &d)) { free(args); return 2; }
            cp.min_p = (float)d;
        } else if (!strcmp(a, "--top-k") && has) {
            if (forge_cli_parse_int("classify", a, argv[++i], 0, INT32_MAX, &k)) { free(args); return 2; }
            cp.top_k = (int)k;
        } else if (!strcmp(a, "--seed") && has) {
            if (forge_cli_parse_u64("classify", a, argv[++i], &u)) { free(args); return 2; }
            cp.seed = u;
        } else if (!path && a[0] != '-') path = a;
        else if (path && a[0] != '-') args[n_args++] = argv[i];
        else { free(args); return forge_cli_unexpected("classify", a); }
    }
    if (!path) path = forge_cli_env_model(); /* --stdin-json alone (with PROMPTs main put FORGE_MODEL first) */
    if (!path || stdin_json == (n_args > 0)) {
        free(args);
        return verb_usage_error("classify", "give MODEL and either --stdin-json or one or more PROMPTs");
    }
    /* the prompts: strings (text) or arrays of ids */
    int n = stdin_json ? 0 : n_args, rc = 1;
    cJSON *arr = NULL;
    char *in = NULL;
    if (stdin_json) {
        size_t len;
        in = forge_cli_read_stdin(&len);
        arr = in ? cJSON_ParseWithLength(in, len) : NULL;
        if (!cJSON_IsArray(arr)) {
            fprintf(stderr, "forge classify: --stdin-json: stdin is not a JSON array\n");
            cJSON_Delete(arr);
            free(in);
            free(args);
            return 2;
        }
        n = cJSON_GetArraySize(arr);
    }
    forge_classify_prompt *prompts = calloc((size_t)n + 1, sizeof *prompts);
    for (int i = 0; i < n; i++) {
        prompts[i].struct_size = sizeof *prompts;
        if (!stdin_json) {
            prompts[i].text = args[i];
            prompts[i].text_len = strlen(args[i]);
            continue;
        }
        const cJSON *it = cJSON_GetArrayItem(arr, i);
        if (cJSON_IsString(it)) {
            prompts[i].text = it->valuestring;
            prompts[i].text_len = strlen(it->valuestring);
        } else if (!cJSON_IsArray(it) || !(prompts[i].tokens = json_int_ids(it, &prompts[i].n_tokens))) {
            fprintf(stderr, "forge classify: --stdin-json: element %d is neither a string nor an array of token ids\n", i);
            n = i;
            rc = 2;
            break;
        }
    }
    forge_model *m = rc == 2 ? NULL : forge_cli_load(path, &o);
    if (m) {
        /* the session holds the longest prompt (forge_cli_batch_session); past the model's context
         * (or --ctx) forge_classify refuses a prompt (FORGE_ERR_LIMIT, naming it) before any batch
         * runs, instead of a session sized to it running for ever */
        int longest = 0;
        long long total = 0;
        for (int i = 0; i < n; i++) {
            int len = prompts[i].n_tokens;
            if (prompts[i].text) {
                size_t cnt = 0;
                forge_tokenize(m, prompts[i].text, prompts[i].text_len, cp.add_special ? FORGE_TOKENIZE_ADD_SPECIAL : 0, NULL, 0, &cnt);
                len = (int)(cnt > INT32_MAX ? INT32_MAX : cnt);
            }
            if (len > longest) longest = len;
            total += len;
        }
        int V = forge_model_n_vocab(m);
        forge_classify_result *res = calloc((size_t)n + 1, sizeof *res);
        if (res) res[0].struct_size = sizeof *res; /* the array's element size (forge.h) */
        float *lg = want_logits ? malloc(sizeof(float) * (size_t)(n ? n : 1) * (size_t)V) : NULL;
        cp.logits = lg;
        cp.logits_capacity = lg ? (size_t)n * (size_t)V : 0;
        cp.cancel = forge_cli_cancel_flag(); /* Ctrl-C: stop between batches (no results) */
        forge_session *s = forge_cli_batch_session(m, &o, longest, total, 0);
        if (s) {
            forge_cli_catch_sigint(NULL, 0);
            forge_status st = forge_classify(s, prompts, n, &cp, res);
            if (st != FORGE_OK) {
                fprintf(stderr, "forge: %s (%s)\n", forge_session_errmsg(s), forge_status_name(st));
                if (st == FORGE_ERR_CANCELLED) rc = 130;
            } else {
                putchar('[');
                for (int i = 0; i < n; i++) {
                    printf("%s{\"id\": %d", i ? ",\n " : "", res[i].token);
                    if (res[i].text) {
                        printf(", \"text\": ");
                        forge_cli_json_string(res[i].text, res[i].text_len);
                    }
                    if (cp.constraint && cp.constraint->kind == FORGE_CONSTRAINT_CHOICES) {
                        printf(", \"choice\": ");
                        if (res[i].choice >= 0) forge_cli_json_cstr(cp.constraint->choices[res[i].choice]);
                        else printf("null");
                    }
                    if (lg) {
                        printf(", \"logits\": [");
                        for (int j = 0; j < V; j++) printf(j ? ", %.9g" : "%.9g", lg[(size_t)i * (size_t)V + (size_t)j]);
                        putchar(']');
                    }
                    putchar('}');
                }
                puts("]");
                rc = forge_cli_interrupted() ? 130 : 0; /* Ctrl-C during the last batch: all printed, then 130 */
                if (o.verbose) {
                    forge_metrics mt = {.struct_size = sizeof mt};
                    forge_session_metrics(s, &mt);
                    fprintf(stderr, "[%d prompts, %d tokens in %.1f ms, %.1f tok/s]\n", n, mt.prompt_tokens, mt.prefill_ms, mt.prefill_tok_s);
                }
            }
            forge_session_free(s);
        }
        free(res);
        free(lg);
        forge_model_free(m);
    }
    if (stdin_json)
        for (int i = 0; i < n; i++) free((void *)prompts[i].tokens);
    free(prompts);
    cJSON_Delete(arr);
    free(in);
    free(args);
    return rc;
}

static int cmd_classify(int argc, char **argv) {
    forge_cli_constraint con;
    if (forge_cli_take_constraint("classify", &argc, argv, &con, 1)) return 2;
    int rc = cmd_classify_body(argc, argv, &con);
    forge_cli_constraint_free(&con);
    return rc;
}

/* The bundled demo model: next to the executable in the source tree (build/../models) or
 * the install tree (bin/../share/forge), or where the build recorded the source tree. */
static const char *bundled_model(void) {
    static char path[4096];
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        const char *rel[] = {"/../models/stories260K/stories260K.gguf", "/../share/forge/stories260K.gguf",
                             "/models/stories260K/stories260K.gguf"};
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            snprintf(path, sizeof path, "%s%s", exe, rel[i]);
            if (access(path, R_OK) == 0) return path;
        }
    }
#ifdef FORGE_SOURCE_DIR
    snprintf(path, sizeof path, "%s/models/stories260K/stories260K.gguf", FORGE_SOURCE_DIR);
    if (access(path, R_OK) == 0) return path;
#endif
    return NULL;
}

/* What forge run generated: the last token, and with --json the text and the ids (printed at
 * the end). A model without a tokenizer gives ids and no text: stdout gets the ids. */
typedef struct run_output {
    int32_t last;
    int json;
    int as_ids;                /* no tokenizer: the prompt and the tokens are printed as ids */
    const char *echo;          /* the prompt, until it is printed before the first output */
    int started;               /* as_ids: an id is on stdout's line, so the next goes after a space */
    char *text;
    size_t len, cap;
    int32_t *ids;              /* --json: the generated tokens (generated_tokens of them) */
    size_t n_ids, cap_ids;
    int failed;                /* out of memory keeping the text or the ids */
} run_output;

/* Streams text (or with as_ids the ids) to stdout, or with --json collects the text and the ids;
 * `user` is a run_output. */
static int stream_stdout(void *user, int32_t token, const char *text, size_t len) {
    run_output *r = (run_output *)user;
    if (token >= 0) r->last = token;
    if (!r->json) {
        if (r->echo) {
            fputs(r->echo, stdout);
            r->started = *r->echo != 0;
            r->echo = NULL;
        }
        if (!r->as_ids) fwrite(text, 1, len, stdout);
        else if (token >= 0) printf(r->started++ ? " %d" : "%d", token);
        fflush(stdout);
        return 0; /* go on */
    }
    if (token >= 0 && r->n_ids == r->cap_ids) {
        size_t cap = r->cap_ids ? r->cap_ids * 2 : 256;
        int32_t *ids = realloc(r->ids, sizeof *ids * cap);
        if (!ids) { r->failed = 1; return 1; } /* stop: the ids could not be kept */
        r->ids = ids;
        r->cap_ids = cap;
    }
    if (token >= 0) r->ids[r->n_ids++] = token;
    if (r->len + len + 1 > r->cap) {
        size_t cap = (r->len + len + 1) * 2;
        char *t = realloc(r->text, cap);
        if (!t) { r->failed = 1; return 1; } /* stop: the text could not be kept */
        r->text = t;
        r->cap = cap;
    }
    memcpy(r->text + r->len, text, len);
    r->len += len;
    return 0;
}

/* forge run --json: one object (docs/json.md). `prompt` is the prompt's text, NULL when the
 * model has no tokenizer (then it and the text are null); `prompt_ids` the ids of --tokens, or
 * NULL (no "prompt_ids"). */
static void run_json(const char *prompt, const int32_t *prompt_ids, int n_prompt_ids, const run_output *r, forge_status st,
                     const forge_metrics *m, int constrained, int lookup) {
    printf("{\"prompt\": ");
    if (prompt) forge_cli_json_cstr(prompt);
    else fputs("null", stdout);
    if (prompt_ids) {
        printf(", \"prompt_ids\": ");
        forge_cli_json_ids(prompt_ids, (size_t)n_prompt_ids);
    }
    printf(", \"text\": ");
    if (r->as_ids) fputs("null", stdout);
    else forge_cli_json_string(r->text ? r->text : "", r->len);
    printf(", \"ids\": ");
    forge_cli_json_ids(r->ids, r->n_ids);
    printf(", \"status\": \"%s\", \"stop_reason\": \"%s\", \"prompt_tokens\": %d, \"cached_tokens\": %d, \"generated_tokens\": %d, "
           "\"ttft_ms\": %.3f, \"prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f, \"peak_device_bytes\": %llu, \"context_slides\": %d",
           forge_status_name(st), forge_cli_stop_name(m->stop_reason), m->prompt_tokens, m->cached_tokens, m->generated_tokens,
           m->ttft_ms, m->prefill_tok_s, m->decode_tok_s, (unsigned long long)m->peak_device_bytes, m->context_slides);
    if (constrained)
        printf(", \"constraint_complete\": %s, \"forced_tokens\": %d, \"constraint_masks\": %d, \"constraint_ms\": %.3f",
               m->constraint_complete ? "true" : "false", m->forced_tokens, m->constraint_masks, m->constraint_ms);
    if (lookup) printf(", \"draft_tokens\": %d, \"draft_accepted\": %d", m->draft_tokens, m->draft_accepted);
    printf("}\n");
}

static void print_metrics(const forge_metrics *m) {
    static const char *why[] = {"none", "eos", "stop token", "stop string", "max tokens", "callback", "context full", "cancelled", "constraint"};
    fprintf(stderr,
            "[prompt %d tokens (%d cached), generated %d, ttft %.1f ms, prefill %.1f tok/s, decode %.1f tok/s, peak device %.1f MiB, stop: %s",
            m->prompt_tokens, m->cached_tokens, m->generated_tokens, m->ttft_ms, m->prefill_tok_s, m->decode_tok_s,
            (double)m->peak_device_bytes / (1 << 20), why[m->stop_reason]);
    if (m->context_slides) fprintf(stderr, ", context slides %d", m->context_slides);
    if (m->draft_tokens) fprintf(stderr, ", lookup %d of %d drafts kept", m->draft_accepted, m->draft_tokens);
    if (m->constraint_ms > 0)
        fprintf(stderr, ", constraint %s (%d forced, %d masks, %.1f ms)", m->constraint_complete ? "matched" : "not matched", m->forced_tokens,
                m->constraint_masks, m->constraint_ms);
    fprintf(stderr, "]\n");
}

/* Parses --ctx-overflow fail|shift|recompute and --keep N (run and chat) into the session
 * params; returns 0, or 2 on a bad value. */
static int take_overflow(const char *cmd, int *argc, char **argv, forge_session_params *sp) {
    static const char *const modes[] = {"fail", "shift", "recompute"}, *const values[] = {"--ctx-overflow", "--keep", NULL};
    int w = 0;
    for (int i = 0; i < *argc; i++) {
        const char *a = argv[i];
        if (forge_cli_needs_value(cmd, a, i + 1 < *argc, values)) return 2;
        if (!strcmp(a, "--ctx-overflow") && i + 1 < *argc) {
            const char *v = argv[++i];
            int k = 0;
            while (k < 3 && strcmp(v, modes[k])) k++;
            if (k == 3) { fprintf(stderr, "forge %s: --ctx-overflow takes fail, shift or recompute, not '%s'\n", cmd, v); return 2; }
            sp->overflow = k; /* FORGE_OVERFLOW_FAIL, _SHIFT, _RECOMPUTE */
        } else if (!strcmp(a, "--keep") && i + 1 < *argc) {
            long long k;
            if (forge_cli_parse_int(cmd, "--keep", argv[++i], 0, INT_MAX, &k)) return 2;
            sp->n_keep = (int)k;
        } else argv[w++] = argv[i];
    }
    *argc = w;
    return 0;
}

/* Parses the sampling options shared by run and chat; returns 0, or 2 on a bad value (the
 * message names the flag and the range: `-n abc` or `-n -1` is a usage error, not 0 tokens). */
static int take_sampling(const char *cmd, int *argc, char **argv, forge_generate_params *gp, const char **stops, int *n_stops,
                         int max_stops) {
    static const char *const values[] = {"-n", "--top-k", "--repeat-window", "--temp", "--top-p", "--min-p", "--repeat-penalty", "--seed",
                                         "--stop", "--lookup", NULL};
    int w = 0;
    for (int i = 0; i < *argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < *argc;
        long long k;
        double d;
        if (forge_cli_needs_value(cmd, a, has, values)) return 2;
        if (!strcmp(a, "-n") && has) {
            if (forge_cli_parse_int(cmd, a, argv[++i], 0, INT_MAX, &k)) return 2;
            gp->max_tokens = (int)k;
        } else if (!strcmp(a, "--top-k") && has) {
            if (forge_cli_parse_int(cmd, a, argv[++i], 0, INT_MAX, &k)) return 2;
            gp->top_k = (int)k;
        } else if (!strcmp(a, "--repeat-window") && has) {
            if (forge_cli_parse_int(cmd, a, argv[++i], 0, INT_MAX, &k)) return 2;
            gp->repeat_window = (int)k;
        } else if (!strcmp(a, "--temp") && has) {
            if (forge_cli_parse_double(cmd, a, argv[++i], 0, 0, 1e9, 0, &d)) return 2;
            gp->temperature = (float)d;
        } else if (!strcmp(a, "--top-p") && has) {
            if (forge_cli_parse_double(cmd, a, argv[++i], 0, 1, 1, 0, &d)) return 2;
            gp->top_p = (float)d;
        } else if (!strcmp(a, "--min-p") && has) {
            if (forge_cli_parse_double(cmd, a, argv[++i], 0, 0, 1, 0, &d)) return 2;
            gp->min_p = (float)d;
        } else if (!strcmp(a, "--repeat-penalty") && has) {
            if (forge_cli_parse_double(cmd, a, argv[++i], 0, 1, 1e9, 0, &d)) return 2;
            gp->repeat_penalty = (float)d;
        } else if (!strcmp(a, "--seed") && has) {
            uint64_t u;
            if (forge_cli_parse_u64(cmd, a, argv[++i], &u)) return 2;
            gp->seed = u;
        } else if (!strcmp(a, "--lookup") && has) {
            if (forge_cli_parse_int(cmd, a, argv[++i], 0, 15, &k)) return 2;
            gp->lookup = (int)k;
        } else if (!strcmp(a, "--stop") && has) {
            if (*n_stops == max_stops) { fprintf(stderr, "forge %s: at most %d --stop strings\n", cmd, max_stops); return 2; }
            stops[(*n_stops)++] = argv[++i];
        } else argv[w++] = argv[i];
    }
    *argc = w;
    gp->stop_strings = stops;
    gp->n_stop_strings = *n_stops;
    return 0;
}

/* The ids of `text` without special tokens added (a continuation), malloc'd, *n_ids of them;
 * NULL after a message. */
static int32_t *tokenize_plain(forge_model *m, const char *text, int *n_ids) {
    size_t len = strlen(text), cap = len + 1, n = 0;
    int32_t *ids = malloc(sizeof *ids * cap);
    forge_status st = ids ? forge_tokenize(m, text, len, 0, ids, cap, &n) : FORGE_ERR_OUT_OF_MEMORY;
    if (st == FORGE_ERR_BUFFER_TOO_SMALL) {
        int32_t *bigger = realloc(ids, sizeof *ids * (n + 1));
        st = bigger ? forge_tokenize(m, text, len, 0, ids = bigger, n + 1, &n) : FORGE_ERR_OUT_OF_MEMORY;
    }
    if (st != FORGE_OK) {
        fprintf(stderr, "forge: tokenizing the prompt: %s\n", st == FORGE_ERR_OUT_OF_MEMORY ? "out of host memory" : forge_model_errmsg(m));
        free(ids);
        return NULL;
    }
    *n_ids = (int)n;
    return ids;
}

/* The context of a session made with o (forge_session_params.n_ctx 0: the model's, at most 4096). */
static int session_ctx(const forge_model *m, const forge_cli_opts *o) {
    if (o->n_ctx) return o->n_ctx;
    int train = forge_model_n_ctx_train(m);
    return train <= 0 ? 4096 : train < 4096 ? train : 4096;
}

/* --load-state: the saved tokens followed by the prompt's ids (a text prompt's without BOS: they
 * continue the saved ones). */
static forge_status generate_continuing(forge_session *s, const int32_t *added, size_t n_new, forge_generate_params *gp, forge_metrics *mt) {
    size_t n_saved = 0;
    forge_session_tokens(s, NULL, 0, &n_saved);
    if (n_saved + n_new == 0) return forge_generate(s, "", 0, gp, mt); /* an empty state and no prompt: start as a plain run does */
    int32_t *all = malloc(sizeof *all * (n_saved + n_new));
    forge_status st = all ? forge_session_tokens(s, all, n_saved, &n_saved) : FORGE_ERR_OUT_OF_MEMORY;
    if (st == FORGE_OK) {
        if (n_new) memcpy(all + n_saved, added, sizeof *all * n_new);
        st = forge_generate_tokens(s, all, (int)(n_saved + n_new), gp, mt);
    }
    free(all);
    return st;
}

/* "1 2 3": the ids as a line of text (malloc'd), what forge run prints for a model without a tokenizer. */
static char *ids_line(const int32_t *ids, size_t n) {
    char *line = malloc(12 * n + 1), *p = line;
    for (size_t i = 0; line && i < n; i++) p += sprintf(p, i ? " %d" : "%d", ids[i]);
    if (line) *p = 0;
    else fprintf(stderr, "forge: out of host memory\n");
    return line;
}

/* What forge run cannot do with this model, said before a session is made: --tokens ids outside
 * its vocabulary; without a tokenizer (no text), a text prompt (or none: the default is text)
 * and --stop strings. 0, or 2 after the message. */
static int run_refuses(const forge_model *m, const char *path, const int32_t *ids, int n_ids, int text_prompt, int n_stops) {
    int n_vocab = forge_model_n_vocab(m), has_tokenizer = forge_cli_has_tokenizer(m);
    for (int i = 0; i < n_ids; i++)
        if (ids[i] >= n_vocab) {
            fprintf(stderr, "forge run: --tokens: %d is not a token id of %s (its vocabulary is 0..%d)\n", ids[i], path, n_vocab - 1);
            return 2;
        }
    if (!has_tokenizer && text_prompt) {
        fprintf(stderr, "forge run: %s has no tokenizer, so there is no text prompt: give the prompt as token ids (--tokens \"1 2 3\")\n", path);
        return 2;
    }
    if (!has_tokenizer && n_stops) {
        fprintf(stderr, "forge run: %s has no tokenizer, so no text to find a --stop string in\n", path);
        return 2;
    }
    return 0;
}

/* forge run, the constraint options already taken (con). */
static int cmd_run_body(int argc, char **argv, const forge_cli_constraint *con) {
    forge_cli_opts o = {0};
    if (forge_cli_take_common("run", &argc, argv, &o, 1)) return 2;
    forge_generate_params gp = forge_generate_default_params();
    gp.constraint = forge_cli_constraint_get(con);
    const char *stops[16];
    int n_stops = 0, show_metrics = 0;
    if (take_sampling("run", &argc, argv, &gp, stops, &n_stops, 16)) return 2;
    forge_session_params sp = forge_session_default_params(); /* a full context stops the run unless asked */
    if (take_overflow("run", &argc, argv, &sp)) return 2;
    const char *path = NULL, *prompt = NULL, *tokens = NULL, *load_state = NULL, *save_state = NULL, *batch_file = NULL;
    const char *draft_path = NULL;
    int json = 0;
    long long places = 0;
    static const char *const values[] = {"-p", "--tokens", "--load-state", "--save-state", "--batch-file", "--parallel", "--draft", NULL};
    for (int i = 0; i < argc; i++) {
        if (forge_cli_needs_value("run", argv[i], i + 1 < argc, values)) return 2;
        if (!strcmp(argv[i], "-p") && i + 1 < argc) prompt = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = argv[++i];
        else if (!strcmp(argv[i], "--metrics")) show_metrics = 1;
        else if (!strcmp(argv[i], "--load-state") && i + 1 < argc) load_state = argv[++i];
        else if (!strcmp(argv[i], "--save-state") && i + 1 < argc) save_state = argv[++i];
        else if (!strcmp(argv[i], "--batch-file") && i + 1 < argc) batch_file = argv[++i];
        else if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--draft") && i + 1 < argc) draft_path = argv[++i];
        else if (!strcmp(argv[i], "--parallel") && i + 1 < argc) {
            if (forge_cli_parse_int("run", "--parallel", argv[++i], 1, 512, &places)) return 2;
        }
        else if (!path && argv[i][0] != '-') path = argv[i];
        else return forge_cli_unexpected("run", argv[i]);
    }
    if (prompt && tokens) return verb_usage_error("run", "-p and --tokens both give the prompt: give one of them");
    if (batch_file && (prompt || tokens)) return verb_usage_error("run", "--batch-file's lines are the prompts: no -p or --tokens with it");
    if (!path) path = forge_cli_env_model();
    if (!path && !(path = bundled_model())) {
        fprintf(stderr, "forge run: no MODEL given, FORGE_MODEL is not set and the bundled stories260K model was not found\n");
        return 2;
    }
    if (batch_file && (load_state || save_state || sp.overflow != FORGE_OVERFLOW_FAIL)) {
        fprintf(stderr, "forge run: --load-state, --save-state and --ctx-overflow go without --batch-file\n");
        return 2;
    }
    if (batch_file && draft_path) return verb_usage_error("run", "--draft goes without --batch-file (batch generation drafts nothing)");
    if (batch_file) return forge_cli_run_batch(path, &o, batch_file, &gp, (int)places, json, show_metrics);
    if (places) { fprintf(stderr, "forge run: --parallel goes with --batch-file\n"); return 2; }
    int n_ids = 0;
    int32_t *ids = tokens ? parse_tokens("run", tokens, &n_ids) : NULL; /* the prompt's ids: --tokens', or -p's to continue a state */
    if (tokens && !ids) return 2;
    forge_model *m = forge_cli_load(path, &o);
    if (!m) { free(ids); return 1; }
    int has_tokenizer = forge_cli_has_tokenizer(m);
    if (run_refuses(m, path, ids, n_ids, !tokens && (prompt || !load_state), n_stops)) {
        free(ids);
        forge_model_free(m);
        return 2;
    }
    if (!has_tokenizer && !json)
        fprintf(stderr, "forge run: %s has no tokenizer: the prompt and the generated tokens are printed as ids\n", path);
    sp.n_ctx = o.n_ctx;
    sp.kv_type = o.kv_type;
    forge_session *s = NULL, *ds = NULL;
    forge_model *dm = NULL; /* --draft: the draft model, its session as long as the model's */
    size_t len;
    char *ids_prompt = NULL; /* --tokens: their text (without a tokenizer, the ids' line): echoed, and --json's "prompt" */
    int rc = 1;
    if (draft_path && !(dm = forge_cli_load(draft_path, &o))) {
        /* the message is out */
    } else if (dm && forge_session_create(dm, &sp, &ds) != FORGE_OK) {
        fprintf(stderr, "forge: the draft model %s: %s\n", draft_path, forge_model_errmsg(dm));
    } else if (ds && forge_cli_prewarm(dm, ds, 0)) {
        /* the message is out */
    } else if (forge_session_create(m, &sp, &s) != FORGE_OK) {
        fprintf(stderr, "forge: %s\n", forge_model_errmsg(m));
    } else if (forge_cli_prewarm(m, s, tokens ? n_ids : !prompt || !*prompt ? 1 : 0)) { /* the bare story's prompt is BOS alone */
        /* the message is out */
    } else if (load_state && forge_session_load(s, load_state) != FORGE_OK) {
        fprintf(stderr, "forge: %s\n", forge_session_errmsg(s));
    } else if (load_state && prompt && *prompt && !(ids = tokenize_plain(m, prompt, &n_ids))) {
        /* the message is out */
    } else if (tokens && !(ids_prompt = has_tokenizer ? ids_text(m, ids, (size_t)n_ids, 0, &len) : ids_line(ids, (size_t)n_ids))) {
        /* the message is out */
    } else {
        if (!prompt) prompt = tokens ? ids_prompt : "";
        /* The prompt is echoed before generating when it fits the context; otherwise (the
         * library refuses it, FORGE_ERR_LIMIT) only before the first text, should it run:
         * a refused prompt is not printed (a 100 kB one was, in full, before its error). */
        run_output out = {.last = -1, .json = json, .as_ids = !has_tokenizer, .echo = json ? NULL : prompt};
        size_t held = 0, n_new = (size_t)n_ids; /* the tokens the session will hold before generating */
        forge_status counted = FORGE_OK;
        if (load_state) forge_session_tokens(s, NULL, 0, &held);
        else if (!ids) counted = forge_tokenize(m, prompt, strlen(prompt), FORGE_TOKENIZE_ADD_SPECIAL, NULL, 0, &n_new);
        if (out.echo && (counted == FORGE_OK || counted == FORGE_ERR_BUFFER_TOO_SMALL) && held + n_new <= (size_t)session_ctx(m, &o)) {
            fputs(prompt, stdout);
            fflush(stdout);
            out.started = *prompt != 0;
            out.echo = NULL;
        }
        gp.on_token = stream_stdout;
        gp.user_data = &out;
        gp.cancel = forge_cli_cancel_flag(); /* Ctrl-C: stop at the next token, then as any stop */
        gp.draft = ds;
        forge_metrics mt = {.struct_size = sizeof mt};
        forge_cli_catch_sigint(NULL, 0);
        forge_status st = load_state ? generate_continuing(s, ids, (size_t)n_ids, &gp, &mt)
                          : ids      ? forge_generate_tokens(s, ids, n_ids, &gp, &mt)
                                     : forge_generate(s, prompt, strlen(prompt), &gp, &mt);
        if (out.failed) st = FORGE_ERR_OUT_OF_MEMORY;
        if (st == FORGE_OK && out.echo) fputs(out.echo, stdout); /* no text came: the prompt alone */
        if (json) run_json(has_tokenizer ? prompt : NULL, tokens ? ids : NULL, n_ids, &out, st, &mt, gp.constraint != NULL, gp.lookup > 0 || ds);
        else if (st == FORGE_OK || !out.echo) printf("\n");
        fflush(stdout);
        free(out.text);
        free(out.ids);
        int32_t last = out.last;
        if (out.failed) fprintf(stderr, "forge: out of host memory keeping the generated text\n");
        else if (st != FORGE_OK) fprintf(stderr, "forge: %s (%s)\n", forge_session_errmsg(s), forge_status_name(st));
        else rc = 0;
        if (show_metrics || o.verbose) print_metrics(&mt);
        /* Ctrl-C while the prompt was evaluated (nothing generated yet): the session holds part of
         * it, a state a later --load-state would continue mid-prompt; none is saved. */
        if (!rc && save_state && mt.stop_reason == FORGE_STOP_CANCELLED && mt.generated_tokens == 0) {
            fprintf(stderr, "forge run: stopped while the prompt was evaluated: no state saved (%s is as it was)\n", save_state);
        } else if (!rc && save_state) {
            /* The cache holds the generated tokens but the last (nothing has evaluated it yet):
             * evaluate it, so that the saved sequence is the text printed. */
            if (last >= 0 && forge_session_n_past(s) < mt.prompt_tokens + mt.generated_tokens &&
                forge_eval(s, &last, 1, 0, NULL, 0) != FORGE_OK)
                fprintf(stderr, "forge: the last token is not in the saved state: %s\n", forge_session_errmsg(s));
            if (forge_session_save(s, save_state) != FORGE_OK) {
                fprintf(stderr, "forge: %s\n", forge_session_errmsg(s));
                rc = 1;
            }
        }
        if (!rc && forge_cli_interrupted()) rc = 130; /* printed and saved as any stop; then the status says so */
    }
    free(ids_prompt);
    free(ids);
    forge_session_free(s);
    forge_session_free(ds);
    forge_model_free(dm);
    forge_model_free(m);
    return rc;
}

static int cmd_run(int argc, char **argv) {
    forge_cli_constraint con;
    if (forge_cli_take_constraint("run", &argc, argv, &con, 1)) return 2;
    int rc = cmd_run_body(argc, argv, &con);
    forge_cli_constraint_free(&con);
    return rc;
}

/* ---- forge chat: a REPL. Ctrl-C while a reply streams stops the reply (the cancel flag:
 * FORGE_STOP_CANCELLED, the session stays usable); at the prompt it ends the program (130). ---- */

typedef struct chat_reply {
    char *text;
    size_t len, cap;
    int failed;                /* out of host memory keeping the reply */
} chat_reply;

static int chat_stream(void *user, int32_t token, const char *text, size_t len) {
    (void)token;
    chat_reply *r = (chat_reply *)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    if (r->len + len + 1 > r->cap) {
        size_t cap = (r->len + len + 1) * 2;
        char *t = realloc(r->text, cap);
        if (!t) { r->failed = 1; return 1; }
        r->text = t;
        r->cap = cap;
    }
    memcpy(r->text + r->len, text, len);
    r->len += len;
    r->text[r->len] = 0;
    return 0;
}

/* --tools FILE: the functions of a JSON array, transformers' tools list ({"type": "function",
 * "function": {"name", "description", "parameters"}}, or the bare function objects), as the
 * library's forge_tool[] (n 0: no --tools). */
typedef struct chat_tools {
    forge_tool *tools;
    int n;
    char **parameters; /* [n] each tool's parameters printed compactly (malloc'd), or NULL */
    cJSON *doc;        /* the file; names and descriptions point into it */
} chat_tools;

static void chat_tools_free(chat_tools *t) {
    for (int i = 0; t->parameters && i < t->n; i++) free(t->parameters[i]);
    free(t->parameters);
    free(t->tools);
    cJSON_Delete(t->doc);
    memset(t, 0, sizeof *t);
}

/* Reads --tools FILE into t: 0, or 2 after saying on stderr what is wrong with the file. */
static int chat_tools_read(const char *path, chat_tools *t) {
    memset(t, 0, sizeof *t);
    size_t len = 0;
    char *text = forge_cli_read_file(path, &len);
    if (!text) {
        fprintf(stderr, "forge chat: --tools: cannot read %s\n", path);
        return 2;
    }
    t->doc = cJSON_ParseWithLength(text, len);
    free(text);
    int n = cJSON_IsArray(t->doc) ? cJSON_GetArraySize(t->doc) : 0;
    if (!n) {
        fprintf(stderr, "forge chat: --tools: %s is not a JSON array of tools ([{\"type\": \"function\", \"function\": {\"name\", "
                        "\"description\", \"parameters\"}}, ...])\n", path);
        chat_tools_free(t);
        return 2;
    }
    t->tools = calloc((size_t)n, sizeof *t->tools);
    t->parameters = calloc((size_t)n, sizeof *t->parameters);
    if (!t->tools || !t->parameters) {
        fprintf(stderr, "forge chat: out of host memory\n");
        chat_tools_free(t);
        return 2;
    }
    const cJSON *item;
    cJSON_ArrayForEach(item, t->doc) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(item, "function"), *type = cJSON_GetObjectItemCaseSensitive(item, "type");
        if (!fn) fn = item;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name"), *desc = cJSON_GetObjectItemCaseSensitive(fn, "description"),
                    *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        const char *why = !cJSON_IsObject(fn)                                        ? "is not a JSON object"
                          : type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "function")) ? "has a \"type\" other than \"function\""
                          : !cJSON_IsString(name) || !*name->valuestring              ? "has no \"name\""
                          : desc && !cJSON_IsString(desc)                             ? "has a \"description\" that is not a string"
                          : params && !cJSON_IsObject(params)                         ? "has \"parameters\" that are not a JSON object (a JSON Schema)"
                                                                                      : NULL;
        if (why) {
            fprintf(stderr, "forge chat: --tools: %s: tool %d %s\n", path, t->n + 1, why);
            chat_tools_free(t);
            return 2;
        }
        if (params && !(t->parameters[t->n] = cJSON_PrintUnformatted(params))) {
            fprintf(stderr, "forge chat: out of host memory\n");
            chat_tools_free(t);
            return 2;
        }
        t->tools[t->n] = (forge_tool){.struct_size = sizeof(forge_tool), .name = name->valuestring,
                                      .description = desc ? desc->valuestring : NULL, .parameters = t->parameters[t->n]};
        t->n++;
    }
    return 0;
}

/* What the conversation owns of one message: its text and, for an assistant's tool calls, one
 * block holding the calls and their strings. */
typedef struct chat_owned {
    char *content;
    forge_tool_call *calls;
} chat_owned;

static void chat_owned_free(chat_owned *o) {
    free(o->content);
    free(o->calls);
    o->content = NULL;
    o->calls = NULL;
}

/* A copy of a parsed reply's tool calls (the reply's strings are the session's until its next
 * call): one malloc'd block, the calls first, then their names, arguments and ids. */
static forge_tool_call *chat_copy_calls(const forge_chat_reply *r) {
    size_t bytes = sizeof(forge_tool_call) * (size_t)r->n_tool_calls;
    for (int i = 0; i < r->n_tool_calls; i++) bytes += strlen(r->tool_names[i]) + strlen(r->tool_arguments[i]) + strlen(r->tool_ids[i]) + 3;
    forge_tool_call *calls = malloc(bytes);
    if (!calls) return NULL;
    char *p = (char *)(calls + r->n_tool_calls);
    for (int i = 0; i < r->n_tool_calls; i++) {
        size_t nl = strlen(r->tool_names[i]) + 1, al = strlen(r->tool_arguments[i]) + 1, il = strlen(r->tool_ids[i]) + 1;
        calls[i] = (forge_tool_call){.struct_size = sizeof(forge_tool_call), .name = memcpy(p, r->tool_names[i], nl),
                                     .arguments = memcpy(p + nl, r->tool_arguments[i], al), .id = memcpy(p + nl + al, r->tool_ids[i], il)};
        p += nl + al + il;
    }
    return calls;
}

/* The rendered probe conversation ([system,] user "Hi") with `flags` and the tools, malloc'd;
 * NULL after the library's message on stderr (no chat format, or tools the family's format
 * lacks: FORGE_ERR_UNSUPPORTED; a conversation the template refuses, a tool it cannot render:
 * FORGE_ERR_INVALID_ARGUMENT). */
static char *chat_probe(forge_model *m, const char *system_prompt, uint32_t flags, const chat_tools *tools) {
    forge_chat_message probe[2];
    int n = 0;
    if (system_prompt) probe[n++] = (forge_chat_message){.struct_size = sizeof(forge_chat_message), .role = "system", .content = system_prompt};
    probe[n++] = (forge_chat_message){.struct_size = sizeof(forge_chat_message), .role = "user", .content = "Hi"};
    size_t len = 0;
    forge_status st = forge_chat_render_tools(m, probe, n, tools->tools, tools->n, flags, NULL, 0, &len);
    char *out = st == FORGE_ERR_BUFFER_TOO_SMALL ? malloc(len + 1) : NULL;
    if (out) st = forge_chat_render_tools(m, probe, n, tools->tools, tools->n, flags, out, len + 1, &len);
    if (st != FORGE_OK) {
        if (st == FORGE_ERR_BUFFER_TOO_SMALL) st = FORGE_ERR_OUT_OF_MEMORY;
        fprintf(stderr, "forge: %s (%s)\n", st == FORGE_ERR_OUT_OF_MEMORY ? "out of host memory" : forge_model_errmsg(m),
                forge_status_name(st));
        free(out);
        return NULL;
    }
    return out;
}

static const char chat_help[] = "commands: /help (this list), /metrics (the last reply's numbers), /reset (forget the\n"
                                "conversation, keep --system), /quit or /exit (end; so does end of input); Ctrl-C stops a\n"
                                "reply, and at the prompt ends the chat; any other line is a message (to send one that\n"
                                "starts with /, double the /: //etc/hosts sends /etc/hosts)\n";

/* A line starting with one '/' (not "//", a message): runs the command; 1 to end the chat. */
static int chat_command(char *line, const forge_metrics *last, int *n, int first, chat_owned *owned, const char *system_prompt) {
    size_t len = strlen(line);
    while (len && (line[len - 1] == ' ' || line[len - 1] == '\t')) line[--len] = 0;
    size_t word = strcspn(line, " \t");
    static const char *const known[] = {"/quit", "/exit", "/help", "/metrics", "/reset"};
    size_t k = 0;
    while (k < sizeof known / sizeof *known && (strlen(known[k]) != word || strncmp(line, known[k], word))) k++;
    if (k == sizeof known / sizeof *known) {
        fprintf(stderr, "[unknown command %.*s (see /help)]\n", (int)word, line);
    } else if (line[word]) {
        fprintf(stderr, "[%s takes no arguments (see /help)]\n", known[k]);
    } else if (k < 2) {
        return 1;
    } else if (k == 2) {
        fputs(chat_help, stdout);
    } else if (k == 3) {
        print_metrics(last);
    } else {
        int dropped = *n - first;
        for (int i = first; i < *n; i++) chat_owned_free(&owned[i]);
        *n = first;
        printf("[reset: %d message%s forgotten%s; the next message starts a new conversation]\n", dropped, dropped == 1 ? "" : "s",
               system_prompt ? ", the system prompt kept" : "");
    }
    fflush(stdout);
    return 0;
}

/* The tool results the last reply's calls still wait for: the assistant message msgs[n - 1 -
 * (results given)] made them. 0 when the last message is not an unanswered call. */
static int chat_pending_results(const forge_chat_message *msgs, int n, int first) {
    int given = 0;
    while (n - 1 - given >= first && !strcmp(msgs[n - 1 - given].role, "tool")) given++;
    int at = n - 1 - given;
    if (at < first || strcmp(msgs[at].role, "assistant")) return 0;
    return msgs[at].n_tool_calls > given ? msgs[at].n_tool_calls - given : 0;
}

/* forge chat, the constraint options already taken (con). */
static int cmd_chat_body(int argc, char **argv, const forge_cli_constraint *con) {
    forge_cli_opts o = {0};
    if (forge_cli_take_common("chat", &argc, argv, &o, 1)) return 2;
    forge_generate_params gp = forge_generate_default_params();
    gp.max_tokens = 1024;
    gp.constraint = forge_cli_constraint_get(con);
    const char *stops[16];
    int n_stops = 0;
    if (take_sampling("chat", &argc, argv, &gp, stops, &n_stops, 16)) return 2;
    forge_session_params sp = forge_session_default_params();
    sp.overflow = FORGE_OVERFLOW_SHIFT; /* a chat runs indefinitely: a full context slides */
    if (take_overflow("chat", &argc, argv, &sp)) return 2;
    const char *path = NULL, *system_prompt = NULL, *think_flag = NULL, *tools_path = NULL, *tool_calls = NULL;
    uint32_t flags = 0, tool_flags = 0;
    static const char *const values[] = {"--system", "--tools", "--tool-calls", NULL};
    for (int i = 0; i < argc; i++) {
        if (forge_cli_needs_value("chat", argv[i], i + 1 < argc, values)) return 2;
        if (!strcmp(argv[i], "--system") && i + 1 < argc) system_prompt = argv[++i];
        else if (!strcmp(argv[i], "--tools") && i + 1 < argc) tools_path = argv[++i];
        else if (!strcmp(argv[i], "--tool-calls") && i + 1 < argc) tool_calls = argv[++i];
        else if (!strcmp(argv[i], "--no-think") || !strcmp(argv[i], "--think")) {
            flags |= argv[i][2] == 'n' ? FORGE_CHAT_THINKING_OFF : FORGE_CHAT_THINKING_ON; /* Qwen 3's default is on, Gemma 4's off */
            think_flag = argv[i];
        }
        else if (!path && argv[i][0] != '-') path = argv[i];
        else return forge_cli_unexpected("chat", argv[i]);
    }
    if ((flags & FORGE_CHAT_THINKING_ON) && (flags & FORGE_CHAT_THINKING_OFF))
        return verb_usage_error("chat", "--think and --no-think contradict each other");
    if (tool_calls) {
        if (!strcmp(tool_calls, "strict")) tool_flags = FORGE_CHAT_TOOL_ARGUMENTS;
        else if (!strcmp(tool_calls, "required")) tool_flags = FORGE_CHAT_TOOL_ARGUMENTS | FORGE_CHAT_TOOL_REQUIRED;
        else if (strcmp(tool_calls, "free")) {
            fprintf(stderr, "forge chat: --tool-calls '%s': expected free, strict or required\n", tool_calls);
            return 2;
        }
        if (!tools_path) return verb_usage_error("chat", "--tool-calls goes with --tools FILE");
        if (tool_flags && gp.constraint)
            return verb_usage_error("chat", "--tool-calls strict or required constrains the calls itself: no --json-schema, --grammar or --json-object with it");
    }
    if (!path) path = forge_cli_env_model();
    if (!path) return verb_usage_error("chat", no_model);
    chat_tools tools = {0};
    if (tools_path && chat_tools_read(tools_path, &tools)) return 2;
    forge_model *m = forge_cli_load(path, &o);
    if (!m) {
        chat_tools_free(&tools);
        return 1;
    }
    /* Refused at start-up what every message would fail on: no chat format (the story model),
     * a system message the template rejects (Gemma 2), tools the family's format lacks. */
    char *probe = chat_probe(m, system_prompt, flags, &tools);
    if (!probe) {
        chat_tools_free(&tools);
        forge_model_free(m);
        return 1;
    }
    if (think_flag) { /* a family with a thinking switch renders its two settings differently */
        char *on = chat_probe(m, system_prompt, FORGE_CHAT_THINKING_ON, &tools),
             *off = on ? chat_probe(m, system_prompt, FORGE_CHAT_THINKING_OFF, &tools) : NULL;
        if (on && off && !strcmp(on, off))
            fprintf(stderr, "forge chat: %s is ignored: this model's chat format has no thinking switch (Qwen 3 and Gemma 4 have one)\n",
                    think_flag);
        free(on);
        free(off);
    }
    free(probe);
    sp.n_ctx = o.n_ctx;
    sp.kv_type = o.kv_type;
    forge_session *s = NULL;
    if (forge_session_create(m, &sp, &s) != FORGE_OK || forge_cli_prewarm(m, s, 0)) {
        if (!s) fprintf(stderr, "forge: %s\n", forge_model_errmsg(m));
        forge_session_free(s);
        chat_tools_free(&tools);
        forge_model_free(m);
        return 1;
    }
    int cap = 64, n = 0;
    forge_chat_message *msgs = malloc(sizeof *msgs * (size_t)cap);
    chat_owned *owned = calloc((size_t)cap, sizeof *owned); /* our copies of the contents and calls */
    if (!msgs || !owned) {
        fprintf(stderr, "forge: out of host memory\n");
        free(msgs);
        free(owned);
        chat_tools_free(&tools);
        forge_session_free(s);
        forge_model_free(m);
        return 1;
    }
    if (system_prompt) { msgs[n] = (forge_chat_message){.struct_size = sizeof(forge_chat_message), .role = "system", .content = system_prompt}; n++; }
    int first = n, turn = n; /* turn: where the messages since the last reply start */
    int interactive = isatty(0);
    forge_metrics last = {.struct_size = sizeof last};
    char line[8192];
    int rc = 0;
    gp.cancel = forge_cli_cancel_flag();
    forge_cli_catch_sigint(NULL, 1); /* at the prompt, Ctrl-C interrupts the read (EINTR) */
    for (;;) {
        int pending = chat_pending_results(msgs, n, first); /* the next line is a tool's result */
        if (interactive) {
            if (pending) printf("%s> ", msgs[turn - 1].tool_calls[msgs[turn - 1].n_tool_calls - pending].name);
            else printf("> ");
            fflush(stdout);
        }
        if (forge_cli_interrupted() || !fgets(line, sizeof line, stdin)) break;
        size_t ll = strlen(line);
        while (ll && (line[ll - 1] == '\n' || line[ll - 1] == '\r')) line[--ll] = 0;
        if (line[0] == '/' && line[1] != '/') {
            if (chat_command(line, &last, &n, first, owned, system_prompt)) break;
            if (n == first) turn = n;
            continue;
        }
        if (!ll) continue;
        if (n + 2 > cap) {
            forge_chat_message *mm = realloc(msgs, sizeof *msgs * (size_t)cap * 2);
            if (mm) msgs = mm;
            chat_owned *oo = mm ? realloc(owned, sizeof *owned * (size_t)cap * 2) : NULL;
            if (oo) {
                owned = oo;
                memset(owned + cap, 0, sizeof *owned * (size_t)cap);
            }
            if (!mm || !oo) { fprintf(stderr, "forge: out of host memory\n"); rc = 1; break; }
            cap *= 2;
        }
        owned[n].content = strdup(line + (line[0] == '/')); /* "//x" sends "/x" */
        msgs[n] = (forge_chat_message){.struct_size = sizeof(forge_chat_message), .role = pending ? "tool" : "user", .content = owned[n].content};
        if (pending) msgs[n].tool_call_id = msgs[turn - 1].tool_calls[msgs[turn - 1].n_tool_calls - pending].id; /* the call it answers */
        n++;
        if (pending > 1) continue; /* every call's result first */
        chat_reply reply = {0};
        gp.on_token = chat_stream;
        gp.user_data = &reply;
        forge_chat_reply parsed = {.struct_size = sizeof parsed};
        forge_status st = tools.n ? forge_chat_tools(s, msgs, n, tools.tools, tools.n, flags | tool_flags, &gp, &parsed, &last)
                                  : forge_chat(s, msgs, n, flags, &gp, &last);
        printf("\n");
        forge_tool_call *calls = NULL;
        if (st == FORGE_OK && !reply.failed && parsed.n_tool_calls && !(calls = chat_copy_calls(&parsed))) reply.failed = 1;
        if (st == FORGE_OK && reply.failed) st = FORGE_ERR_OUT_OF_MEMORY;
        if (st != FORGE_OK) {
            fprintf(stderr, "forge: %s (%s)\n", reply.failed ? "out of host memory keeping the reply" : forge_session_errmsg(s),
                    forge_status_name(st));
            while (n > turn) chat_owned_free(&owned[--n]); /* the message, or the tool results, again */
            free(reply.text);
            rc = 1;
            if (!interactive) break;
            if (forge_cli_interrupted()) forge_cli_catch_sigint(NULL, 1);
            continue;
        }
        for (int i = 0; i < parsed.n_tool_calls; i++) printf("[tool call %s %s]\n", calls[i].name, calls[i].arguments);
        fflush(stdout);
        if (forge_cli_interrupted()) {
            fprintf(stderr, "[stopped]\n");
            forge_cli_catch_sigint(NULL, 1); /* the next Ctrl-C: the next reply, or the prompt */
        }
        /* the history keeps a reply with calls as its template writes one: the content and the calls */
        owned[n].content = calls ? strdup(parsed.content) : reply.text ? reply.text : strdup("");
        if (calls) free(reply.text);
        owned[n].calls = calls;
        msgs[n] = (forge_chat_message){.struct_size = sizeof(forge_chat_message), .role = "assistant", .content = owned[n].content,
                                       .tool_calls = calls, .n_tool_calls = parsed.n_tool_calls};
        turn = ++n;
    }
    if (forge_cli_interrupted()) {
        if (interactive) printf("\n");
        rc = 130;
    }
    forge_cli_release_sigint();
    for (int i = first; i < n; i++) chat_owned_free(&owned[i]);
    free(owned);
    free(msgs);
    chat_tools_free(&tools);
    forge_session_free(s);
    forge_model_free(m);
    return rc;
}

static int cmd_chat(int argc, char **argv) {
    forge_cli_constraint con;
    if (forge_cli_take_constraint("chat", &argc, argv, &con, 1)) return 2;
    int rc = cmd_chat_body(argc, argv, &con);
    forge_cli_constraint_free(&con);
    return rc;
}

static int run_command(const char *cmd, int argc, char **argv);

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "help")) {
        if (argc < 3) { usage(stdout); return 0; }
        if (!strcmp(argv[2], "train")) { char *h[] = {(char *)"--help", NULL}; return cmd_train(1, h); }
        if (forge_cli_verb_help(argv[2], stdout)) { fprintf(stderr, "forge help: unknown command '%s'\n", argv[2]); return 2; }
        return 0;
    }
    /* forge VERB --help (forge train --help lists its own options); an option's value is not one */
    for (int i = 2; i < argc && strcmp(cmd, "train"); i++) {
        if (strcmp(argv[i], "--help") && strcmp(argv[i], "-h")) continue;
        if (i > 2 && argv[i - 1][0] == '-' && strcmp(argv[i - 1], "--metrics") && strcmp(argv[i - 1], "--json")) continue;
        if (forge_cli_verb_help(cmd, stdout)) break; /* not a command: the unknown-command error below */
        return 0;
    }
    /* -m MODEL / --model MODEL (llama.cpp's spelling) is the positional MODEL: the verbs take their
     * first positional argument as MODEL, so it moves to the front */
    int kept = 2;
    char *model_flag = NULL;
    for (int i = 2; i < argc; i++) {
        if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && (i == 2 || strcmp(argv[i - 1], "-p"))) {
            if (i + 1 >= argc) {
                fprintf(stderr, "forge %s: %s needs a MODEL\n", cmd, argv[i]);
                return 2;
            }
            if (model_flag) {
                fprintf(stderr, "forge %s: %s: a second MODEL ('%s' after '%s')\n", cmd, argv[i], argv[i + 1], model_flag);
                return 2;
            }
            model_flag = argv[++i];
            continue;
        }
        argv[kept++] = argv[i];
    }
    argc = kept;
    /* classify's PROMPTs (embed's TEXTs, rerank's DOCs) are positional too, so with FORGE_MODEL
     * set they are all prompts and only -m names another model */
    if (!model_flag && (!strcmp(cmd, "classify") || !strcmp(cmd, "embed") || !strcmp(cmd, "rerank")))
        model_flag = (char *)forge_cli_env_model();
    if (!model_flag) return run_command(cmd, argc - 2, argv + 2);
    char **args = malloc(sizeof *args * (size_t)argc);
    if (!args) { fprintf(stderr, "forge: out of host memory\n"); return 1; }
    args[0] = model_flag;
    memcpy(args + 1, argv + 2, sizeof *args * (size_t)(argc - 2));
    int rc = run_command(cmd, argc - 1, args);
    free(args);
    return rc;
}

/* Runs the verb cmd on its arguments (MODEL, if named by -m, first). */
static int run_command(const char *cmd, int argc, char **argv) {
    if (!strcmp(cmd, "run")) return cmd_run(argc, argv);
    if (!strcmp(cmd, "chat")) return cmd_chat(argc, argv);
    if (!strcmp(cmd, "devices")) return cmd_devices(argc, argv);
    if (!strcmp(cmd, "info")) return cmd_info(argc, argv);
    if (!strcmp(cmd, "discover")) return cmd_discover(argc, argv);
    if (!strcmp(cmd, "logits")) return cmd_logits(argc, argv);
    if (!strcmp(cmd, "keys")) return cmd_keys(argc, argv);
    if (!strcmp(cmd, "classify")) return cmd_classify(argc, argv);
    if (!strcmp(cmd, "embed")) return cmd_embed(argc, argv);
    if (!strcmp(cmd, "rerank")) return cmd_rerank(argc, argv);
    if (!strcmp(cmd, "bench")) return forge_bench_main(argc, argv);
    if (!strcmp(cmd, "train")) return cmd_train(argc, argv);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc, argv);
    if (!strcmp(cmd, "bench-tokenize")) return forge_bench_tokenize_main(argc, argv);
    if (!strcmp(cmd, "bench-grammar")) return forge_bench_grammar_main(argc, argv);
    if (!strcmp(cmd, "--version")) { printf("forge %s\n", forge_version()); return 0; }
    fprintf(stderr, "forge: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
