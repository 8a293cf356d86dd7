/* libFuzzer target: encode arbitrary bytes (invalid UTF-8 included) with real tokenizers, then
 * decode and stream-decode the ids. Byte 0 picks the tokenizer and the flags. The tokenizers
 * are the shared test data, unpacked beside the binary (fuzz_common.h). Invariants: no crash,
 * and decoded text is valid UTF-8. */
#include "internal.h"
#include "fuzz_common.h"

static forge_model *models[8];
static int n_models;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    const char *dir = fuzz_tok_data((*argv)[0]);
    const char *paths[] = {"llama3", "qwen3", "gemma2", "ggml-vocab-llama-spm.gguf", "ggml-vocab-deepseek-llm.gguf", "ggml-vocab-falcon.gguf"};
    char path[4400];
    for (int i = 0; i < 6; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, paths[i]);
        models[n_models++] = fuzz_load_vocab(path);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    forge_model *m = models[data[0] % n_models];
    uint32_t flags = (data[0] >> 4) & 3;
    const char *text = (const char *)data + 1;
    size_t len = size - 1, n = 0;
    int32_t small[4];
    forge_status st = forge_tokenize(m, text, len, flags, small, 4, &n);
    if (st != FORGE_OK && st != FORGE_ERR_BUFFER_TOO_SMALL) abort();
    int32_t *ids = malloc(sizeof *ids * (n + 1));
    size_t n2 = 0;
    if (forge_tokenize(m, text, len, flags, ids, n + 1, &n2) != FORGE_OK || n2 != n) abort();
    size_t cap = 64 + 32 * n, tl = 0;
    char *out = malloc(cap);
    st = forge_detokenize(m, ids, n, 0, out, cap, &tl);
    if (st == FORGE_ERR_BUFFER_TOO_SMALL) { out = realloc(out, cap = tl + 1); st = forge_detokenize(m, ids, n, 0, out, cap, &tl); }
    if (st != FORGE_OK || !fuzz_utf8_valid(out, tl)) abort();
    forge_detok_stream ds;
    forge_detok_stream_init(&ds, data[0] & 0x40 ? FORGE_DETOKENIZE_SKIP_SPECIAL : 0);
    char buf[512];
    size_t bl;
    for (size_t i = 0; i < n; i++) {
        if (forge_detok_stream_next(m, &ds, ids[i], buf, sizeof buf, &bl) != FORGE_OK) continue; /* a long piece: skipped */
        if (!fuzz_utf8_valid(buf, bl)) abort();
    }
    if (forge_detok_stream_flush(m, &ds, buf, sizeof buf, &bl) == FORGE_OK && !fuzz_utf8_valid(buf, bl)) abort();
    free(out);
    free(ids);
    return 0;
}
