/* generate.c: load a model, stream a story, print the metrics. The README shows this file;
 * `make` builds it (build/example_generate) and the tests run it on the bundled model. */
#include <stdio.h>
#include <string.h>

#include "forge.h"

/* Called once per generated token with the text it completes: print it. Return 0 to go on,
 * non-zero to stop (forge's callbacks all follow this convention). */
static int print_token(void *user_data, int32_t token, const char *text, size_t len) {
    (void)user_data;
    (void)token;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "models/stories260K/stories260K.gguf";
    const char *prompt = argc > 2 ? argv[2] : "Once upon a time";
    forge_model *model;
    if (forge_model_load(path, NULL, &model) != FORGE_OK) { /* the reason stays on the failed model */
        fprintf(stderr, "%s\n", forge_model_errmsg(model));
        forge_model_free(model);
        return 1;
    }
    forge_session *session;
    if (forge_session_create(model, NULL, &session) != FORGE_OK) {
        fprintf(stderr, "%s\n", forge_model_errmsg(model));
        forge_model_free(model);
        return 1;
    }
    forge_generate_params gp = forge_generate_default_params(); /* greedy, 256 tokens at most */
    gp.max_tokens = 64;
    gp.on_token = print_token;
    forge_metrics mt;
    fputs(prompt, stdout);
    forge_status st = forge_generate(session, prompt, strlen(prompt), &gp, &mt);
    if (st == FORGE_OK)
        printf("\n%d tokens, %.1f tokens/s, first after %.1f ms\n", mt.generated_tokens, mt.decode_tok_s, mt.ttft_ms);
    else
        fprintf(stderr, "\n%s: %s\n", forge_status_name(st), forge_session_errmsg(session));
    forge_session_free(session);
    forge_model_free(model);
    return st == FORGE_OK ? 0 : 1;
}
