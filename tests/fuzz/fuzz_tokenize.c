/* libFuzzer target: encode arbitrary bytes (invalid UTF-8 included) with real tokenizers, then
 * decode and stream-decode the ids. Byte 0 picks the tokenizer and the flags. The tokenizers
 * are the shared test data, unpacked beside the binary (BUILD/tok_data) if the tests have not
 * done it already. Invariants: no crash, and decoded text is valid UTF-8. */
#include "internal.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef FORGE_SOURCE_DIR
#define FORGE_SOURCE_DIR "."
#endif

static forge_model *models[8];
static int n_models;

static int utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        int len = c < 0x80 ? 1 : c >= 0xC2 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!len || i + (size_t)len > n) return 0;
        for (int k = 1; k < len; k++) if ((u[i + k] & 0xC0) != 0x80) return 0;
        i += (size_t)len;
    }
    return 1;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    char self[4096], dir[4200], cmd[9000];
    snprintf(self, sizeof self, "%s", (*argv)[0]);
    snprintf(dir, sizeof dir, "%s/tok_data", dirname(self));
    const char *fam[] = {"llama3", "qwen3", "gemma2"};
    struct stat sb;
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "%s/%s", dir, fam[i]);
        if (stat(cmd, &sb) != 0) {
            snprintf(cmd, sizeof cmd, "mkdir -p '%s' && tar xJf '%s/../shared/tokenizers/%s.tar.xz' -C '%s'", dir, FORGE_SOURCE_DIR, fam[i], dir);
            if (system(cmd) != 0) { fprintf(stderr, "fuzz_tokenize: cannot unpack %s\n", fam[i]); exit(1); }
        }
    }
    snprintf(cmd, sizeof cmd, "%s/ggml-vocab-llama-spm.gguf", dir);
    if (stat(cmd, &sb) != 0) {
        snprintf(cmd, sizeof cmd, "tar xJf '%s/../shared/tokenizer-tests/tokenizer-tests.tar.xz' -C '%s'", FORGE_SOURCE_DIR, dir);
        if (system(cmd) != 0) { fprintf(stderr, "fuzz_tokenize: cannot unpack the vocab GGUFs\n"); exit(1); }
    }
    const char *paths[] = {"llama3", "qwen3", "gemma2", "ggml-vocab-llama-spm.gguf", "ggml-vocab-deepseek-llm.gguf", "ggml-vocab-falcon.gguf"};
    for (int i = 0; i < 6; i++) {
        forge_model_params p = forge_model_default_params();
        p.vocab_only = 1;
        snprintf(cmd, sizeof cmd, "%s/%s", dir, paths[i]);
        forge_model *m = NULL;
        if (forge_model_load(cmd, &p, &m) != FORGE_OK) { fprintf(stderr, "fuzz_tokenize: %s\n", forge_model_errmsg(m)); exit(1); }
        models[n_models++] = m;
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
    if (st != FORGE_OK || !utf8_valid(out, tl)) abort();
    forge_detok_stream ds;
    forge_detok_stream_init(&ds, data[0] & 0x40 ? FORGE_DETOKENIZE_SKIP_SPECIAL : 0);
    char buf[512];
    size_t bl;
    for (size_t i = 0; i < n; i++) {
        if (forge_detok_stream_next(m, &ds, ids[i], buf, sizeof buf, &bl) != FORGE_OK) continue; /* a long piece: skipped */
        if (!utf8_valid(buf, bl)) abort();
    }
    if (forge_detok_stream_flush(m, &ds, buf, sizeof buf, &bl) == FORGE_OK && !utf8_valid(buf, bl)) abort();
    free(out);
    free(ids);
    return 0;
}
