/* libFuzzer target: chat rendering (forge_chat_render) of arbitrary conversations with the
 * real chat templates of Llama 3, Qwen 3, Gemma 2 and Gemma 3 (their tokenizer_config.json,
 * fuzz_common.h). Input: byte 0 picks the model and the flags; the rest is split at 0xFF bytes
 * into messages whose first byte picks the role (system, user, assistant, tool, or the bytes
 * up to the first 0xFE as a role of their own) and whose remaining bytes (any, invalid UTF-8
 * and NULs cut short included) are the content. Invariants: no crash; only the documented
 * statuses; the size query and the render agree; the text is NUL-terminated at *len. */
#include "internal.h"
#include "fuzz_common.h"

static forge_model *models[4];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    const char *dir = fuzz_tok_data((*argv)[0]);
    const char *fam[] = {"llama3", "qwen3", "gemma2", "gemma3"};
    char path[4400];
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, fam[i]);
        models[i] = fuzz_load_vocab(path);
    }
    return 0;
}

#define MAX_MESSAGES 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    forge_model *m = models[data[0] % 4];
    uint32_t flags = (data[0] >> 2) & 3u;
    /* a NUL-terminated copy, cut into messages in place */
    char *buf = malloc(size + 1);
    memcpy(buf, data, size);
    buf[size] = 0;
    forge_chat_message msgs[MAX_MESSAGES];
    memset(msgs, 0, sizeof msgs); /* no tool calls */
    int n = 0;
    static const char *roles[] = {"system", "user", "assistant", "tool"};
    for (size_t i = 1; i < size && n < MAX_MESSAGES;) {
        size_t j = i;
        while (j < size && (uint8_t)buf[j] != 0xFF) j++;
        buf[j] = 0; /* (j == size: the terminator already there) */
        uint8_t r = (uint8_t)buf[i];
        msgs[n].struct_size = sizeof msgs[n];
        if (r < 0xC0) {
            msgs[n].role = roles[r % 4];
            msgs[n].content = buf + i + 1 <= buf + j ? buf + i + 1 : buf + j;
        } else { /* a role of its own: the bytes up to 0xFE */
            char *sep = memchr(buf + i + 1, 0xFE, j - i - (j > i ? 1 : 0));
            msgs[n].role = buf + i + 1;
            if (sep) { *sep = 0; msgs[n].content = sep + 1; } else msgs[n].content = buf + j;
        }
        n++;
        i = j + 1;
    }
    size_t need = 0;
    char small[8];
    forge_status st = forge_chat_render(m, msgs, n, flags, small, sizeof small, &need);
    if (st != FORGE_OK && st != FORGE_ERR_BUFFER_TOO_SMALL && st != FORGE_ERR_INVALID_ARGUMENT && st != FORGE_ERR_UNSUPPORTED) abort();
    if (st == FORGE_OK && (need >= sizeof small || small[need] != 0)) abort();
    if (st == FORGE_ERR_BUFFER_TOO_SMALL) {
        char *out = malloc(need + 1);
        size_t len = 0;
        if (forge_chat_render(m, msgs, n, flags, out, need + 1, &len) != FORGE_OK || len != need || out[len] != 0) abort();
        free(out);
    }
    free(buf);
    return 0;
}
