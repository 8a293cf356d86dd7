/* The real pretrained model: greedy decoding from BOS reproduces llama2.c's published story. */
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
    forge_special_tokens sp_ids;
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
