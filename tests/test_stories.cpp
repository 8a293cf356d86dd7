/* The real pretrained model: greedy decoding from BOS reproduces llama2.c's published story. */
#include <cjson/cJSON.h>

#include "util.h"

static std::string piece_text(const char *p) {
    /* SentencePiece vocabulary: '▁' is a space, <0xXX> a raw byte. */
    std::string s(p);
    if (s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>') return std::string(1, (char)strtol(s.substr(3, 2).c_str(), nullptr, 16));
    std::string out;
    for (size_t i = 0; i < s.size();) {
        if (s.compare(i, 3, "\xe2\x96\x81") == 0) { out += ' '; i += 3; }
        else out += s[i++];
    }
    return out;
}

TEST(Stories, GreedyFromBosMatchesPublishedText) {
    forge_model *m = ft::load(ft::src("models/stories260K/stories260K.gguf"));
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 256);
    ASSERT_NE(s, nullptr);
    forge_special_tokens sp_ids = ft::sized<forge_special_tokens>();
    ASSERT_EQ(forge_model_special_tokens(m, &sp_ids), FORGE_OK);
    ASSERT_EQ(sp_ids.bos, 1);
    int V = forge_model_n_vocab(m);
    std::vector<float> logits(V);
    int32_t tok = sp_ids.bos;
    std::string text;
    for (int i = 0; i < 120; i++) {
        ASSERT_EQ(forge_eval(s, &tok, 1, 0, logits.data(), logits.size()), FORGE_OK) << forge_session_errmsg(s);
        tok = ft::argmax(logits.data(), V);
        if (tok == sp_ids.eos) break;
        text += piece_text(forge_token_piece(m, tok));
    }
    const std::string expected =
        " Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
        "One day, she saw a big, red ball. She wanted to play with it, but it was too high.";
    ASSERT_GE(text.size(), expected.size()) << text;
    EXPECT_EQ(text.substr(0, expected.size()), expected);
    forge_session_free(s);
    forge_model_free(m);
}

/* A prompt evaluated in one prefill and the same prompt fed token by token give the same logits. */
TEST(Stories, PrefillEqualsTokenByToken) {
    forge_model *m = ft::load(ft::src("models/stories260K/stories260K.gguf"));
    ASSERT_NE(m, nullptr);
    forge_session *a = nullptr, *b = nullptr;
    ASSERT_EQ(forge_session_create(m, nullptr, &a), FORGE_OK);
    ASSERT_EQ(forge_session_create(m, nullptr, &b), FORGE_OK);
    std::vector<int32_t> toks = {1, 403, 407, 261, 378, 429, 271, 266, 2, 400, 33, 7, 100, 101, 102, 300, 12, 9, 77, 5};
    int V = forge_model_n_vocab(m), n = (int)toks.size();
    std::vector<float> all((size_t)n * V), one(V);
    ASSERT_EQ(forge_eval(a, toks.data(), n, FORGE_EVAL_ALL_LOGITS, all.data(), all.size()), FORGE_OK) << forge_session_errmsg(a);
    for (int i = 0; i < n; i++) {
        ASSERT_EQ(forge_eval(b, &toks[i], 1, 0, one.data(), one.size()), FORGE_OK);
        EXPECT_LT(ft::rel_err(one.data(), all.data() + (size_t)i * V, V), 1e-5) << "position " << i;
    }
    forge_session_free(a);
    forge_session_free(b);
    forge_model_free(m);
}

/* forge_session_profile's per-shape entries: a prefill of 10 tokens multiplies 10 rows a call
 * (the matmul kernels), a decode step one (the matvecs); the rates are the entry's own numbers:
 * gb_s = N K 4 bytes (f32 weights) a call, tflop_s = 2 N K rows, over its time. */
TEST(Stories, ProfileShapesCountRowsAndRates) {
    forge_model *m = ft::load(ft::src("models/stories260K/stories260K.gguf"));
    ASSERT_NE(m, nullptr);
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = 64;
    sp.profile = 1;
    forge_session *s = nullptr;
    ASSERT_EQ(forge_session_create(m, &sp, &s), FORGE_OK);
    std::vector<int32_t> prompt = {1, 400, 29, 77, 300, 12, 9, 41, 250, 18};
    ASSERT_EQ(forge_eval(s, prompt.data(), 10, 0, nullptr, 0), FORGE_OK);
    for (int i = 0; i < 3; i++) ASSERT_EQ(forge_eval(s, &prompt[i], 1, 0, nullptr, 0), FORGE_OK);
    std::vector<char> prof(1 << 16);
    size_t len = 0;
    ASSERT_EQ(forge_session_profile(s, prof.data(), prof.size(), &len), FORGE_OK);
    cJSON *pj = cJSON_Parse(prof.data());
    ASSERT_NE(pj, nullptr) << prof.data();
    int shapes = 0;
    for (cJSON *e = pj->child; e; e = e->next) {
        std::string name = e->string;
        size_t sp_at = name.find(' ');
        if (sp_at == std::string::npos) continue;
        shapes++;
        unsigned N = 0, K = 0;
        ASSERT_EQ(sscanf(name.c_str() + sp_at + 1, "%ux%u", &N, &K), 2) << name;
        double calls = cJSON_GetObjectItem(e, "calls")->valuedouble, ms = cJSON_GetObjectItem(e, "ms")->valuedouble;
        double rows = cJSON_GetObjectItem(e, "rows")->valuedouble;
        bool prefill = name.rfind("matmul", 0) == 0;
        EXPECT_EQ(rows, calls * (prefill ? 10 : 1)) << name;
        if (ms <= 0) continue;
        double gb_s = (double)N * K * 4 * calls / (ms * 1e-3) * 1e-9, tflop_s = 2.0 * N * K * rows / (ms * 1e-3) * 1e-12;
        /* ms is printed to 3 decimals: on a fast GPU (a few us a call) that rounding dominates */
        double rel = 1e-3 + 0.0005 / ms;
        EXPECT_NEAR(cJSON_GetObjectItem(e, "gb_s")->valuedouble, gb_s, 0.05 + rel * gb_s) << name;
        EXPECT_NEAR(cJSON_GetObjectItem(e, "tflop_s")->valuedouble, tflop_s, 0.005 + rel * tflop_s) << name;
    }
    EXPECT_GE(shapes, 8) << prof.data(); /* q|k|v, o, gate|up, down and the head, prefill and decode */
    cJSON_Delete(pj);
    forge_session_free(s);
    forge_model_free(m);
}
