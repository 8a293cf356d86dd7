/* libFuzzer target: the GBNF parser and the automaton behind every constraint. Input: a
 * grammar, then a 0x00 byte and text to match (the text may be empty or absent). Invariants:
 * no crash; ft_gbnf_match gives 1 / 0 / -1 or a documented failure (invalid, limit,
 * unsupported, out of memory); a grammar that compiles also compiles on Qwen 3's vocabulary
 * (forge_grammar_create), and a walk of up to 6 tokens, each the first the mask allows, is
 * accepted token by token. */
#include "internal.h"
#include "fuzz_common.h"

static forge_model *model;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    model = fuzz_qwen3_vocab((*argv)[0]);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t glen = nul ? (size_t)(nul - data) : size;
    char *gbnf = malloc(glen + 1);
    memcpy(gbnf, data, glen);
    gbnf[glen] = 0;
    const char *text = nul ? (const char *)nul + 1 : "";
    size_t tlen = nul ? size - glen - 1 : 0;
    char err[512];
    int r = ft_gbnf_match(gbnf, text, tlen, err, sizeof err);
    if (r < -1 && !fuzz_constraint_refusal(-r - 1)) abort(); /* -(status) - 1 */
    if (r >= -1) {
        forge_constraint c = {.struct_size = sizeof c, .kind = FORGE_CONSTRAINT_GBNF, .text = gbnf, .text_len = glen};
        forge_grammar *g = NULL;
        forge_status st = forge_grammar_create(model, &c, &g);
        if (st != FORGE_OK && !fuzz_constraint_refusal(st)) abort();
        if (st == FORGE_OK) {
            int V = forge_model_n_vocab(model);
            size_t words = ((size_t)V + 31) / 32;
            uint32_t *mask = malloc(4 * words);
            for (int step = 0; step < 6 && !(forge_grammar_status(g) & (FORGE_GRAMMAR_DONE | FORGE_GRAMMAR_DEAD)); step++) {
                st = forge_grammar_mask(g, mask, words);
                if (st != FORGE_OK) {
                    if (!fuzz_constraint_refusal(st)) abort();
                    break;
                }
                int32_t tok = -1;
                for (size_t w = 0; w < words && tok < 0; w++)
                    if (mask[w]) tok = (int32_t)(w * 32 + (size_t)__builtin_ctz(mask[w]));
                if (tok < 0) break;
                if (!forge_grammar_allows(g, tok)) abort(); /* the mask and the single check agree */
                if (forge_grammar_accept(g, tok) != FORGE_OK) abort();
            }
            free(mask);
        }
        forge_grammar_free(g);
    }
    free(gbnf);
    return 0;
}
