/* test_overflow.cpp: a full context (forge_session_params.overflow). FAIL stays an error naming
 * n_ctx; RECOMPUTE gives the logits of a fresh session on the kept tokens; SHIFT (llama.cpp's
 * context shift) moves the cache and rotates the keys back, which is exact for the first
 * layer's keys and for a one-layer model, and approximate beyond; the re-rotation composes
 * with RoPE for every layout and frequency rule forge runs; sliding-window models slide in
 * both modes. */
#include <cstdlib>
#include <string>
#include <vector>

#include "internal.h"
#include "util.h"

namespace {

const char *kStories = "models/stories260K/stories260K.gguf";

forge_session *overflow_session(forge_model *m, int n_ctx, int n_batch, forge_overflow mode, int n_keep) {
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = n_ctx;
    sp.n_batch = n_batch;
    sp.overflow = mode;
    sp.n_keep = n_keep;
    forge_session *s = nullptr;
    if (forge_session_create(m, &sp, &s) != FORGE_OK) ADD_FAILURE() << forge_model_errmsg(m);
    return s;
}

std::vector<int32_t> history(forge_session *s) {
    std::vector<int32_t> h(forge_session_n_past(s));
    ft_session_history(s, h.data(), (int)h.size());
    return h;
}

std::vector<int32_t> tokens(int n, int vocab, int salt = 0) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; i++) t.push_back((i * 37 + 11 + salt * 101) % (vocab - 3) + 3);
    return t;
}

/* The logits of a fresh session that evaluates `prefix` in one call, then each of `singles` alone
 * (the call pattern of the session it is compared with, so the kernels are the same ones). */
std::vector<float> fresh_logits(forge_model *m, int n_ctx, int n_batch, const std::vector<int32_t> &prefix,
                                const std::vector<int32_t> &singles) {
    int V = forge_model_n_vocab(m);
    std::vector<float> lg(V);
    forge_session *f = ft::session(m, n_ctx, n_batch);
    if (!f) return lg;
    if (!prefix.empty()) EXPECT_EQ(forge_eval(f, prefix.data(), (int)prefix.size(), 0, lg.data(), lg.size()), FORGE_OK);
    for (int32_t t : singles) EXPECT_EQ(forge_eval(f, &t, 1, 0, lg.data(), lg.size()), FORGE_OK);
    forge_session_free(f);
    return lg;
}

/* Evaluates `seq` one token at a time on a session that slides; after every step whose call
 * slid, and at the end, compares the logits with a fresh session's on what the cache holds.
 * Returns the largest relative difference seen and counts the slides. */
double slide_vs_fresh(forge_model *m, forge_session *s, int n_ctx, int n_batch, const std::vector<int32_t> &seq, int *slides) {
    int V = forge_model_n_vocab(m);
    std::vector<float> lg(V);
    double worst = 0;
    *slides = 0;
    std::vector<int32_t> kept_prefix; /* what the last slide re-evaluated (or the first prompt) */
    std::vector<int32_t> singles;
    for (size_t i = 0; i < seq.size(); i++) {
        int before = forge_session_n_past(s);
        EXPECT_EQ(forge_eval(s, &seq[i], 1, 0, lg.data(), lg.size()), FORGE_OK) << forge_session_errmsg(s);
        bool slid = forge_session_n_past(s) != before + 1;
        std::vector<int32_t> h = history(s);
        if (slid) {
            (*slides)++;
            kept_prefix.assign(h.begin(), h.end() - 1);
            singles.clear();
        }
        singles.push_back(seq[i]);
        if (slid || i + 1 == seq.size()) {
            std::vector<float> want = fresh_logits(m, n_ctx, n_batch, kept_prefix, singles);
            worst = std::max(worst, ft::rel_err(lg.data(), want.data(), V));
        }
    }
    return worst;
}

} // namespace

TEST(Overflow, FailStaysAnErrorNamingNCtx) {
    forge_model *m = ft::load(ft::src(kStories));
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 32);
    ASSERT_NE(s, nullptr);
    std::vector<int32_t> t = tokens(40, forge_model_n_vocab(m));
    EXPECT_EQ(forge_eval(s, t.data(), 30, 0, nullptr, 0), FORGE_OK);
    EXPECT_EQ(forge_eval(s, t.data() + 30, 5, 0, nullptr, 0), FORGE_ERR_LIMIT);
    std::string msg = forge_session_errmsg(s);
    EXPECT_NE(msg.find("n_ctx 32"), std::string::npos) << msg;
    EXPECT_EQ(forge_session_n_past(s), 30);
    forge_session_free(s);
    /* a sliding session still fails on a chunk that cannot fit after sliding */
    s = overflow_session(m, 32, 0, FORGE_OVERFLOW_SHIFT, 4);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(forge_eval(s, t.data(), 20, 0, nullptr, 0), FORGE_OK);
    EXPECT_EQ(forge_eval(s, t.data(), 29, 0, nullptr, 0), FORGE_ERR_LIMIT);
    msg = forge_session_errmsg(s);
    EXPECT_NE(msg.find("n_ctx 32"), std::string::npos) << msg;
    EXPECT_EQ(forge_session_n_past(s), 20); /* nothing slid */
    EXPECT_EQ(forge_eval(s, t.data(), 28, 0, nullptr, 0), FORGE_OK);
    EXPECT_EQ(forge_session_n_past(s), 32); /* slid 20 -> 12 -> 8 -> 6 -> 5 -> 4, then 28 more */
    forge_session_free(s);
    /* bad params */
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = 32;
    sp.overflow = 3;
    EXPECT_EQ(forge_session_create(m, &sp, &s), FORGE_ERR_INVALID_ARGUMENT);
    sp.overflow = FORGE_OVERFLOW_RECOMPUTE;
    sp.n_keep = 31;
    EXPECT_EQ(forge_session_create(m, &sp, &s), FORGE_ERR_INVALID_ARGUMENT);
    forge_model_free(m);
}
