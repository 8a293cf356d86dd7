/* libFuzzer target: the JSON Schema -> GBNF converter. Input: a JSON Schema (any bytes).
 * Invariants: no crash; a schema is converted or refused with a documented status (invalid,
 * unsupported keyword, limit, out of memory); what it converts to is a grammar that compiles
 * (or meets a limit), and compiles on Qwen 3's vocabulary too, where a walk of up to 4 tokens,
 * each the first the mask allows, is accepted. The same schema as a tool's parameters in Gemma
 * 4's notation (its call grammar, with its three control tokens renamed to three of Qwen 3's
 * special tokens): converted or refused alike, and what it converts to compiles on Qwen 3's
 * vocabulary and walks as above, special tokens and all. */
#include "internal.h"
#include "fuzz_common.h"

static forge_model *model;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    model = fuzz_qwen3_vocab((*argv)[0]);
    return 0;
}

/* Up to 4 tokens, each the first the mask allows, accepted (the accept may not fail). */
static void walk(forge_grammar *g) {
    size_t words = ((size_t)forge_model_n_vocab(model) + 31) / 32;
    uint32_t *mask = malloc(4 * words);
    for (int step = 0; step < 4 && !(forge_grammar_status(g) & (FORGE_GRAMMAR_DONE | FORGE_GRAMMAR_DEAD)); step++) {
        if (forge_grammar_mask(g, mask, words) != FORGE_OK) break;
        int32_t tok = -1;
        for (size_t w = 0; w < words && tok < 0; w++)
            if (mask[w]) tok = (int32_t)(w * 32 + (size_t)__builtin_ctz(mask[w]));
        if (tok < 0) break;
        if (forge_grammar_accept(g, tok) != FORGE_OK) abort();
    }
    free(mask);
}

/* s with every `from` replaced by `to` (malloc'd). */
static char *replace_all(const char *s, const char *from, const char *to) {
    size_t fl = strlen(from), tl = strlen(to), n = 0;
    for (const char *p = strstr(s, from); p; p = strstr(p + fl, from)) n++;
    char *out = malloc(strlen(s) + n * (tl > fl ? tl - fl : 0) + 1), *o = out;
    for (const char *p = s;;) {
        const char *q = strstr(p, from);
        if (!q) { strcpy(o, p); break; }
        memcpy(o, p, (size_t)(q - p));
        o += q - p;
        memcpy(o, to, tl);
        o += tl;
        p = q + fl;
    }
    return out;
}

/* The schema as a Gemma 4 tool's parameters. */
static void gemma4_notation(const uint8_t *data, size_t size) {
    char *schema = malloc(size + 1);
    memcpy(schema, data, size);
    schema[size] = 0;
    forge_tool tool = {sizeof tool, "f", NULL, schema};
    const char *trigger = NULL;
    char err[512];
    char *g4 = ft_tool_grammar(6 /* Gemma 4 */, &tool, 1, 1, &trigger, err, sizeof err);
    free(schema);
    if (!g4) return; /* (refused: the message names the tool and the keyword) */
    char *a = replace_all(g4, "<|\"|>", "<|box_start|>"), *b = replace_all(a, "<|tool_call>", "<|quad_start|>"), *gbnf = replace_all(b, "<tool_call|>", "<|quad_end|>");
    free(g4);
    free(a);
    free(b);
    forge_constraint c = {.struct_size = sizeof c, .kind = FORGE_CONSTRAINT_GBNF, .text = gbnf};
    forge_grammar *g = NULL;
    forge_status cs = forge_grammar_create(model, &c, &g);
    if (cs != FORGE_OK && cs != FORGE_ERR_LIMIT && cs != FORGE_ERR_OUT_OF_MEMORY) {
        fprintf(stderr, "the converter wrote a Gemma 4 grammar that does not compile: %s\n%s\n", forge_model_errmsg(model), gbnf);
        abort();
    }
    if (cs == FORGE_OK) walk(g);
    forge_grammar_free(g);
    free(gbnf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    int st = 0;
    char *gbnf = ft_schema_gbnf((const char *)data, size, &st, err, sizeof err);
    if (!gbnf) {
        if (!fuzz_constraint_refusal(st)) abort();
        return 0;
    }
    int r = ft_gbnf_match(gbnf, "", 0, err, sizeof err);
    if (r < -1 && -r - 1 != FORGE_ERR_LIMIT && -r - 1 != FORGE_ERR_OUT_OF_MEMORY) { /* -(status) - 1 */
        fprintf(stderr, "the converter wrote a grammar that does not compile: %s\n%s\n", err, gbnf);
        abort();
    }
    free(gbnf);
    forge_constraint c = {.struct_size = sizeof c, .kind = FORGE_CONSTRAINT_JSON_SCHEMA, .text = (const char *)data, .text_len = size};
    if (!size) return 0; /* text_len 0 reads up to a NUL */
    forge_grammar *g = NULL;
    forge_status cs = forge_grammar_create(model, &c, &g);
    if (cs != FORGE_OK && !fuzz_constraint_refusal(cs)) abort();
    if (cs == FORGE_OK) walk(g);
    forge_grammar_free(g);
    if (!memchr(data, 0, size)) gemma4_notation(data, size); /* (a tool's parameters are a C string) */
    return 0;
}
