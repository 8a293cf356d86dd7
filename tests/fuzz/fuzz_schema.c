/* libFuzzer target: the JSON Schema -> GBNF converter. Input: a JSON Schema (any bytes).
 * Invariants: no crash; a schema is converted or refused with a documented status (invalid,
 * unsupported keyword, limit, out of memory); what it converts to is a grammar that compiles
 * (or meets a limit), and compiles on Qwen 3's vocabulary too, where a walk of up to 4 tokens,
 * each the first the mask allows, is accepted. */
#include "internal.h"
#include "fuzz_common.h"

static forge_model *model;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    model = fuzz_qwen3_vocab((*argv)[0]);
    return 0;
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
    if (cs == FORGE_OK) {
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
    forge_grammar_free(g);
    return 0;
}
