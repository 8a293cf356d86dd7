/* fuzz_common.h: what several fuzz targets share. The shared tokenizer data (../shared:
 * tokenizers/FAMILY.tar.xz, tokenizer-tests/tokenizer-tests.tar.xz) is unpacked once beside the
 * binary, into BUILD/tok_data, as the tests unpack it into the build tree; tokenizers are
 * loaded from there as vocab-only models (no device). */
#ifndef FORGE_FUZZ_COMMON_H
#define FORGE_FUZZ_COMMON_H

#include "forge.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef FORGE_SOURCE_DIR
#define FORGE_SOURCE_DIR "."
#endif

/* BUILD/tok_data, unpacked if it is not there yet; exits on failure (a fuzzer without its data
 * would test nothing). */
static const char *fuzz_tok_data(const char *argv0) {
    static char dir[4200];
    char self[4096], path[4400], cmd[9000];
    struct stat sb;
    snprintf(self, sizeof self, "%s", argv0);
    snprintf(dir, sizeof dir, "%s/tok_data", dirname(self));
    const char *fam[] = {"llama3", "qwen3", "gemma2", "gemma3"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, fam[i]);
        if (stat(path, &sb) != 0) {
            snprintf(cmd, sizeof cmd, "mkdir -p '%s' && tar xJf '%s/../shared/tokenizers/%s.tar.xz' -C '%s'", dir, FORGE_SOURCE_DIR, fam[i], dir);
            if (system(cmd) != 0) { fprintf(stderr, "fuzz: cannot unpack %s\n", fam[i]); exit(1); }
        }
    }
    snprintf(path, sizeof path, "%s/ggml-vocab-llama-spm.gguf", dir);
    if (stat(path, &sb) != 0) {
        snprintf(cmd, sizeof cmd, "tar xJf '%s/../shared/tokenizer-tests/tokenizer-tests.tar.xz' -C '%s'", FORGE_SOURCE_DIR, dir);
        if (system(cmd) != 0) { fprintf(stderr, "fuzz: cannot unpack the vocab GGUFs\n"); exit(1); }
    }
    return dir;
}

/* The tokenizer at PATH (a directory of tokenizer.json, or a GGUF) as a vocab-only model; exits on failure. */
static forge_model *fuzz_load_vocab(const char *path) {
    forge_model_params p = forge_model_default_params();
    p.vocab_only = 1;
    forge_model *m = NULL;
    if (forge_model_load(path, &p, &m) != FORGE_OK) { fprintf(stderr, "fuzz: %s: %s\n", path, forge_model_errmsg(m)); exit(1); }
    return m;
}

/* Qwen 3's tokenizer as a vocab-only model (the constraint targets compile on its vocabulary). */
static forge_model *fuzz_qwen3_vocab(const char *argv0) {
    char path[4400];
    snprintf(path, sizeof path, "%s/qwen3", fuzz_tok_data(argv0));
    return fuzz_load_vocab(path);
}

/* Whether st is how the grammar and schema code documents refusing an input: invalid, a limit,
 * an unsupported keyword or construct, out of memory. */
static int fuzz_constraint_refusal(int st) {
    return st == FORGE_ERR_INVALID_ARGUMENT || st == FORGE_ERR_LIMIT || st == FORGE_ERR_UNSUPPORTED || st == FORGE_ERR_OUT_OF_MEMORY;
}

/* Whether the n bytes at s are valid UTF-8. */
static int fuzz_utf8_valid(const char *s, size_t n) {
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

#endif
