/* libFuzzer target: `forge train`'s training data (tools/cli_train.c's load_dataset, reached by
 * including that file as the tests include forge.c): JSONL lines of {"text"}, {"prompt",
 * "completion"}, {"messages"} and {"input_ids", "labels"}, with the tokenizer and chat template
 * of Llama 3 (fuzz_common.h) or the bundled stories260K (no chat format). Byte 0 picks the model,
 * --seq (1, 8, 64 or 4096) and whether prompts are masked; the rest is the file. Invariants:
 * no crash or leak; a loaded dataset's examples hold 1..seq tokens within the vocabulary (labels
 * -100 or within it) and at least one counted target each. Line errors go to stderr, which is
 * pointed at /dev/null around the parse. */
#include "internal.h"
#include "fuzz_common.h"

#define cmd_train fuzz_unused_cmd_train /* the verb itself is not fuzzed */
#include "../../tools/cli_train.c"

#include <fcntl.h>
#include <unistd.h>

/* cli_common.c's flag parsing names a flag given without its value through forge_cli.c, which
 * this target does not link (it parses no flags): a stand-in that reports nothing missing. */
int forge_cli_needs_value(const char *verb, const char *arg, int has_value, const char *const *flags) {
    (void)verb;
    (void)arg;
    (void)has_value;
    (void)flags;
    return 0;
}

static forge_model *models[2];
static int devnull = -1;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    char path[4400];
    snprintf(path, sizeof path, "%s/llama3", fuzz_tok_data((*argv)[0]));
    models[0] = fuzz_load_vocab(path);
    models[1] = fuzz_load_vocab(FORGE_SOURCE_DIR "/models/stories260K/stories260K.gguf");
    devnull = open("/dev/null", O_WRONLY);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const int seqs[] = {1, 8, 64, 4096};
    data_ctx c = data_ctx_for(models[data[0] & 1], (data[0] >> 1) & 1, seqs[(data[0] >> 2) & 3]);
    FILE *f = fmemopen((void *)(data + 1), size - 1 ? size - 1 : 1, "r");
    if (!f) return 0;
    if (size == 1) fgetc(f); /* an empty file: fmemopen needs a non-zero size */
    fflush(stderr);
    int saved = dup(2);
    dup2(devnull, 2);
    dataset d;
    int rc = load_dataset(&c, f, "fuzz.jsonl", &d);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fclose(f);
    if (rc == 0) {
        if (d.n <= 0) abort();
        for (int i = 0; i < d.n; i++) {
            const example *e = &d.ex[i];
            if (e->n < 1 || e->n > c.seq || e->targets < 1) abort();
            for (int k = 0; k < e->n; k++) {
                if (e->tokens[k] < 0 || e->tokens[k] >= c.n_vocab) abort();
                if (e->labels[k] != -100 && (e->labels[k] < 0 || e->labels[k] >= c.n_vocab)) abort();
            }
        }
        dataset_free(&d);
    }
    return 0;
}
