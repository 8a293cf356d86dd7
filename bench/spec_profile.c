/* bench/spec_profile.c: where speculative decoding's time goes (issue 39, bench/RESULTS.md).
 * Generates TOKENS tokens greedily after a 256-token prompt (a 32-token pattern repeated, ids
 * below 410 so that any vocabulary takes it) twice plainly and twice with prompt lookup
 * (LOOKUP tokens a step) or, given a DRAFT model, with that model drafting, each on a profiled
 * session of its own (the first run of each compiles and records); prints one JSON object:
 * each run's wall time and metrics, then each session's kernel profile (forge_session_profile)
 * and the draft session's. Not part of forge's build: a measurement.
 *   cc -O2 -I. bench/spec_profile.c build/libforge.a -o /tmp/spec_profile -lcjson -lpcre2-8 -lutf8proc -lpthread -ldl -lm
 *   /tmp/spec_profile TARGET DRAFT|- LOOKUP TOKENS */
#include "forge.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static char buf[1 << 22];
static void prof(const char *name, forge_session *s) {
    size_t len; if (forge_session_profile(s, buf, sizeof buf, &len)) { printf("\"%s\": null,\n", name); return; }
    printf("\"%s\": %s,\n", name, buf);
}
int main(int argc, char **argv) {
    if (argc < 5) return 2;
    forge_model_params mp = forge_model_default_params();
    forge_model *m, *dm = NULL;
    if (forge_model_load(argv[1], &mp, &m)) { fprintf(stderr, "%s\n", forge_model_errmsg(m)); return 1; }
    if (strcmp(argv[2], "-") && forge_model_load(argv[2], &mp, &dm)) { fprintf(stderr, "%s\n", forge_model_errmsg(dm)); return 1; }
    int lookup = atoi(argv[3]), T = atoi(argv[4]);
    int32_t prompt[256];
    for (int i = 0; i < 256; i++) prompt[i] = 10 + ((i % 32) * 7919) % 400;
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = 1024;
    sp.profile = 1;
    printf("{\n");
    for (int spec = 0; spec < 2; spec++) {
        forge_session *s, *ds = NULL;
        if (forge_session_create(m, &sp, &s)) { fprintf(stderr, "%s\n", forge_model_errmsg(m)); return 1; }
        if (spec && dm && forge_session_create(dm, &sp, &ds)) { fprintf(stderr, "%s\n", forge_model_errmsg(dm)); return 1; }
        forge_generate_params gp = forge_generate_default_params();
        gp.max_tokens = T;
        if (spec) { gp.lookup = lookup; gp.draft = ds; }
        forge_metrics mt = {.struct_size = sizeof mt};
        for (int rep = 0; rep < 2; rep++) { /* the first run records and compiles */
            double t0 = now();
            if (forge_generate_tokens(s, prompt, 256, &gp, &mt)) { fprintf(stderr, "gen: %s\n", forge_session_errmsg(s)); return 1; }
            double t1 = now();
            printf("\"run_%s_%d\": {\"wall_ms\": %.2f, \"prefill_ms\": %.2f, \"decode_ms\": %.2f, \"tok_s\": %.1f, \"gen\": %d, \"draft\": %d, \"acc\": %d},\n",
                   spec ? "spec" : "plain", rep, (t1 - t0) * 1e3, mt.prefill_ms, mt.decode_ms, mt.decode_tok_s, mt.generated_tokens, mt.draft_tokens, mt.draft_accepted);
            forge_session_truncate(s, 0); if (ds) forge_session_truncate(ds, 0);
        }
        prof(spec ? "target_spec" : "target_plain", s);
        if (ds) prof("draft", ds);
        forge_session_free(s);
        if (ds) forge_session_free(ds);
    }
    printf("\"end\": 0}\n");
    forge_model_free(m);
    if (dm) forge_model_free(dm);
    return 0;
}
