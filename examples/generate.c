/* generate.c: load a model, stream a story, print the metrics, then chat when the model has a
 * chat template. The README shows this file; `make` builds it (build/example_generate), the
 * tests run it on the bundled model, and CI builds it again against an installed forge. */
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
    forge_metrics mt = {.struct_size = sizeof mt}; /* structs forge fills say their size (forge.h) */
    fputs(prompt, stdout);
    forge_status st = forge_generate(session, prompt, strlen(prompt), &gp, &mt);
    if (st == FORGE_OK)
        printf("\n%d tokens, %.1f tokens/s, first after %.1f ms\n", mt.generated_tokens, mt.decode_tok_s, mt.ttft_ms);
    else
        fprintf(stderr, "\n%s: %s\n", forge_status_name(st), forge_session_errmsg(session));

    /* Chat: the whole conversation on every call, rendered in the model's own template; the
     * session's prompt cache prefills only the new turn. The bundled story model has no template. */
    forge_chat_message chat[] = {{.struct_size = sizeof(forge_chat_message), .role = "system", .content = "You are a storyteller."},
                                 {.struct_size = sizeof(forge_chat_message), .role = "user", .content = "Tell me a story about a cat."}};
    size_t need;
    char probe[1];
    if (st == FORGE_OK && forge_chat_render(model, chat, 2, 0, probe, sizeof probe, &need) == FORGE_ERR_UNSUPPORTED) {
        printf("(no chat template: %s)\n", forge_model_errmsg(model));
    } else if (st == FORGE_OK) {
        printf("assistant: ");
        st = forge_chat(session, chat, 2, 0, &gp, &mt);
        printf("\n[%d prompt tokens, %d of them from the cache]\n", mt.prompt_tokens, mt.cached_tokens);
        if (st != FORGE_OK) fprintf(stderr, "%s: %s\n", forge_status_name(st), forge_session_errmsg(session));
    }
    forge_session_free(session);
    forge_model_free(model);
    return st == FORGE_OK ? 0 : 1;
}
