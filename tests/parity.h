/* parity.h: the HF parity fixtures (tests/fixtures/parity, made by
 * tools/fixtures/make_parity_fixtures.py): token sequences and HF's logits at every position. */
#ifndef FORGE_TESTS_PARITY_H
#define FORGE_TESTS_PARITY_H
#include <cjson/cJSON.h>

#include "util.h"

namespace ft {

struct Sequence {
    std::vector<int32_t> tokens;
    std::vector<float> logits;       /* HF, in the checkpoint's dtype */
    std::vector<float> logits_f64;   /* bf16 checkpoints: the f64 forward of the same weights */
    double bf16_vs_f64 = 0;          /* bf16 checkpoints: how far HF's own bf16 forward is from the f64 one */
    std::vector<int32_t> generated;  /* HF's greedy generate from the tokens (fixtures that record one) */
};

struct Fixture {
    std::string dir;
    int n_vocab = 0;
    bool bf16 = false;
    std::vector<Sequence> seqs;
};

inline Fixture read_fixture(const std::string &dir) {
    Fixture fx;
    fx.dir = dir;
    std::vector<uint8_t> js = ft::read_file(dir + "/reference.json");
    cJSON *root = cJSON_ParseWithLength((const char *)js.data(), js.size());
    if (!root) {
        ADD_FAILURE() << "cannot read " << dir << "/reference.json";
        return fx;
    }
    fx.n_vocab = cJSON_GetObjectItem(root, "n_vocab")->valueint;
    /* a bf16 reference is HF's own bf16 forward; the f64 forward of the same weights sits beside it */
    const char *rd = cJSON_GetStringValue(cJSON_GetObjectItem(root, "reference_dtype"));
    fx.bf16 = rd && std::string(rd) == "bfloat16";
    cJSON *seqs = cJSON_GetObjectItem(root, "sequences"), *s;
    cJSON_ArrayForEach(s, seqs) {
        Sequence q;
        cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(s, "tokens")) q.tokens.push_back(t->valueint);
        q.logits = ft::read_f32(dir + "/" + cJSON_GetStringValue(cJSON_GetObjectItem(s, "logits")));
        if (cJSON *f = cJSON_GetObjectItem(s, "logits_f64")) q.logits_f64 = ft::read_f32(dir + "/" + cJSON_GetStringValue(f));
        if (cJSON *r = cJSON_GetObjectItem(s, "bf16_vs_f64_rel")) q.bf16_vs_f64 = r->valuedouble;
        EXPECT_EQ(q.logits.size(), q.tokens.size() * (size_t)fx.n_vocab) << dir;
        fx.seqs.push_back(q);
    }
    /* "generate": per sequence, HF's greedy new tokens */
    size_t i = 0;
    cJSON_ArrayForEach(s, cJSON_GetObjectItem(root, "generate")) {
        cJSON *t;
        if (i < fx.seqs.size()) cJSON_ArrayForEach(t, cJSON_GetObjectItem(s, "new_tokens")) fx.seqs[i].generated.push_back(t->valueint);
        i++;
    }
    cJSON_Delete(root);
    return fx;
}

} // namespace ft
#endif
