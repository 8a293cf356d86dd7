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
    return ft::session(m, sp);
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
    if (!prefix.empty()) {
        EXPECT_EQ(forge_eval(f, prefix.data(), (int)prefix.size(), 0, lg.data(), lg.size()), FORGE_OK);
    }
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

/* RECOMPUTE: at every slide, and at the end, the logits equal a fresh session's on the kept
 * tokens evaluated the same way (bitwise: the same kernels on the same inputs). */
TEST(Overflow, RecomputeEqualsAFreshSessionOnTheKeptTokens) {
    forge_model *m = ft::load(ft::src(kStories));
    ASSERT_NE(m, nullptr);
    forge_session *s = overflow_session(m, 32, 8, FORGE_OVERFLOW_RECOMPUTE, 3);
    ASSERT_NE(s, nullptr);
    int slides = 0;
    double err = slide_vs_fresh(m, s, 32, 8, tokens(90, forge_model_n_vocab(m)), &slides);
    EXPECT_EQ(err, 0.0);
    EXPECT_GE(slides, 4);
    std::vector<int32_t> h = history(s), t = tokens(90, forge_model_n_vocab(m));
    EXPECT_EQ(std::vector<int32_t>(h.begin(), h.begin() + 3), std::vector<int32_t>(t.begin(), t.begin() + 3)); /* n_keep */
    EXPECT_EQ(h.back(), t.back());
    forge_session_free(s);
    forge_model_free(m);
}

/* Generation runs past n_ctx; the last token equals what a fresh session generates from the
 * kept tokens; a prompt that continues the slid sequence reuses the cache. */
TEST(Overflow, GenerateRunsPastTheContext) {
    forge_model *m = ft::load(ft::src(kStories));
    ASSERT_NE(m, nullptr);
    for (forge_overflow mode : {FORGE_OVERFLOW_RECOMPUTE, FORGE_OVERFLOW_SHIFT}) {
        SCOPED_TRACE(mode);
        forge_session *s = overflow_session(m, 48, 16, mode, 0);
        ASSERT_NE(s, nullptr);
        std::vector<int32_t> prompt = {1, 403, 407, 261, 378}; /* BOS (kept by n_keep 0), "Once upon a time" */
        std::vector<int32_t> out;
        forge_generate_params p = forge_generate_default_params();
        p.max_tokens = 120;
        p.ignore_eos = 1;
        p.user_data = &out;
        p.on_token = [](void *u, int32_t tok, const char *, size_t) {
            if (tok >= 0) ((std::vector<int32_t> *)u)->push_back(tok);
            return 0;
        };
        forge_metrics mt = ft::sized<forge_metrics>();
        ASSERT_EQ(forge_generate_tokens(s, prompt.data(), (int)prompt.size(), &p, &mt), FORGE_OK) << forge_session_errmsg(s);
        EXPECT_EQ(mt.generated_tokens, 120);
        EXPECT_EQ(mt.stop_reason, FORGE_STOP_MAX_TOKENS);
        EXPECT_GE(mt.context_slides, 3);
        std::vector<int32_t> h = history(s);
        EXPECT_EQ(h[0], 1); /* BOS stays */
        if (mode == FORGE_OVERFLOW_RECOMPUTE) { /* the cache is what a fresh prefill of its tokens gives */
            forge_session *f = ft::session(m, 48, 16);
            std::vector<int32_t> one;
            forge_generate_params q = p;
            q.max_tokens = 1;
            q.user_data = &one;
            ASSERT_EQ(forge_generate_tokens(f, h.data(), (int)h.size(), &q, nullptr), FORGE_OK);
            ASSERT_EQ(one.size(), 1u);
            EXPECT_EQ(one[0], out.back());
            forge_session_free(f);
        }
        /* the whole conversation so far plus a new turn: only the new tokens are evaluated */
        std::vector<int32_t> next = prompt;
        next.insert(next.end(), out.begin(), out.end());
        next.push_back(13);
        next.push_back(378);
        p.max_tokens = 4;
        out.clear();
        ASSERT_EQ(forge_generate_tokens(s, next.data(), (int)next.size(), &p, &mt), FORGE_OK) << forge_session_errmsg(s);
        EXPECT_EQ(mt.prompt_tokens, (int)next.size());
        EXPECT_EQ(mt.cached_tokens, (int)h.size()); /* all the cache holds: the dropped tokens are skipped */
        forge_session_free(s);
    }
    forge_model_free(m);
}

/* SHIFT: the first layer's keys and values after a shift equal a recompute's (they depend only
 * on the token and its position); later layers' do not (they attended to the dropped tokens):
 * the approximation forge.h admits. */
TEST(Overflow, ShiftMatchesRecomputeInTheFirstLayer) {
    forge_model *m = ft::load(ft::src(kStories)); /* GGUF llama: adjacent pairs */
    ASSERT_NE(m, nullptr);
    forge_model_info info = ft::sized<forge_model_info>();
    ASSERT_EQ(forge_model_get_info(m, &info), FORGE_OK);
    ASSERT_GE(info.n_layers, 2);
    forge_session *s = overflow_session(m, 32, 8, FORGE_OVERFLOW_SHIFT, 4);
    ASSERT_NE(s, nullptr);
    std::vector<int32_t> t = tokens(33, forge_model_n_vocab(m));
    ASSERT_EQ(forge_eval(s, t.data(), 32, 0, nullptr, 0), FORGE_OK);
    ASSERT_EQ(forge_eval(s, t.data() + 32, 1, 0, nullptr, 0), FORGE_OK);
    std::vector<int32_t> h = history(s);
    ASSERT_EQ(h.size(), 4u + 14 + 1); /* dropped (32 - 4) / 2 */
    EXPECT_EQ(h[4], t[4 + 14]);
    forge_session *f = ft::session(m, 32, 8);
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(forge_eval(f, h.data(), (int)h.size(), 0, nullptr, 0), FORGE_OK);
    size_t row = (size_t)info.n_kv_heads * info.head_dim, n = h.size();
    double diff[2][2] = {{0, 0}, {0, 0}}, last_values = 0;
    for (int l = 0; l < 2; l++)
        for (int v = 0; v < 2; v++) {
            std::vector<float> a(n * row), b(n * row);
            ASSERT_EQ(ft_session_kv(s, l, v, 0, (int)n, a.data()), FORGE_OK);
            ASSERT_EQ(ft_session_kv(f, l, v, 0, (int)n, b.data()), FORGE_OK);
            /* values: the kept prompt rows apart from the last, decoded one (one token's product
             * there, the fresh session's prefill here: the same sums in another order) */
            size_t rows = v && l == 0 ? n - 1 : n;
            diff[l][v] = ft::rel_err(a.data(), b.data(), rows * row);
            if (v && l == 0) last_values = ft::rel_err(a.data() + rows * row, b.data() + rows * row, row);
        }
    EXPECT_LT(diff[0][0], 1e-5) << "layer 0 keys";
    EXPECT_EQ(diff[0][1], 0.0) << "layer 0 values (untouched by the shift)";
    EXPECT_LT(last_values, 1e-6) << "layer 0 values of the decoded token";
    EXPECT_GT(diff[1][0], 1e-4) << "layer 1 keys: attended to the dropped tokens";
    forge_session_free(f);
    forge_session_free(s);
    forge_model_free(m);
}

/* A parity fixture cut to its first layer (config.json says one layer; the other layers'
 * tensors go unread), in a temp dir. */
std::string one_layer(const std::string &fixture) {
    std::string dir = ft::tmpdir("overflow_" + fixture), from = ft::src("tests/fixtures/parity/" + fixture);
    std::vector<uint8_t> cfg = ft::read_file(from + "/config.json");
    std::string c(cfg.begin(), cfg.end());
    size_t at = c.find("\"num_hidden_layers\": ");
    if (at == std::string::npos) return "";
    size_t end = c.find_first_of(",\n}", at);
    c.replace(at, end - at, "\"num_hidden_layers\": 1");
    ft::write_file(dir + "/config.json", c.data(), c.size());
    std::vector<uint8_t> w = ft::read_file(from + "/model.safetensors");
    ft::write_file(dir + "/model.safetensors", w.data(), w.size());
    return dir;
}

/* One-layer models: after shifts the logits equal a fresh session's on the kept tokens. Llama 3
 * (llama3 RoPE scaling, HF rotate-half pairs, a full layer whose rows move); Gemma 3 and Gemma 2
 * (their first layer slides: window 8 in a ring of 8 + 8 - 1 slots, which has wrapped when the
 * context is full, so the ring rotates). */
TEST(Overflow, ShiftOnAOneLayerModelEqualsRecompute) {
    for (const char *fixture : {"llama3_f32_untied", "gemma3_text_pattern_f32", "gemma2_f32"}) {
        SCOPED_TRACE(fixture);
        std::string dir = one_layer(fixture);
        ASSERT_FALSE(dir.empty());
        forge_model *m = ft::load(dir);
        ASSERT_NE(m, nullptr);
        /* n_ctx 32 keeping 3: drops 14, the ring turns by 14. n_ctx 16 keeping 3: drops 6 and
         * the window (8) of the next position (10) starts at 3: the ring turns, taking the kept
         * positions along (the prompt cache cannot go back to them). Keeping 4: the window
         * would reach a kept token, so the slides recompute. */
        for (auto [n_ctx, keep] : {std::pair{32, 3}, {16, 3}, {16, 4}}) {
            SCOPED_TRACE(std::to_string(n_ctx) + " keep " + std::to_string(keep));
            forge_session *s = overflow_session(m, n_ctx, 8, FORGE_OVERFLOW_SHIFT, keep);
            ASSERT_NE(s, nullptr);
            int slides = 0;
            double err = slide_vs_fresh(m, s, n_ctx, 8, tokens(80, forge_model_n_vocab(m), 1), &slides);
            EXPECT_LT(err, 1e-5);
            EXPECT_GE(slides, 3);
            if (n_ctx == 16 && std::string(fixture) != "llama3_f32_untied") {
                std::vector<int32_t> t = tokens(17, forge_model_n_vocab(m), 4);
                ASSERT_EQ(forge_session_truncate(s, 0), FORGE_OK);
                ASSERT_EQ(forge_eval(s, t.data(), 16, 0, nullptr, 0), FORGE_OK);
                ASSERT_EQ(forge_eval(s, t.data() + 16, 1, 0, nullptr, 0), FORGE_OK);
                EXPECT_EQ(forge_session_n_past(s), 11); /* 16 - 6 + 1 */
                /* keep 3 turned the ring: positions 0..2 are gone; keep 4 recomputed: all there */
                EXPECT_EQ(forge_session_truncate(s, 5), keep == 3 ? FORGE_ERR_LIMIT : FORGE_OK);
            }
            forge_session_free(s);
        }
        forge_model_free(m);
    }
}

/* The re-rotation: keys rotated for position p, then rotated back by d, equal keys rotated for
 * p - d, for both pair layouts and every frequency rule (plain, linear, llama3), the RoPE
 * forge runs (it has no partial rotary dimension). */
TEST(Overflow, ReRotationComposesWithRope) {
    ft_ctx *c = ft_device();
    if (!c) GTEST_SKIP() << "no device";
    const uint32_t D = 64, heads = 2, n = 24, d = 700;
    struct Rule {
        const char *name;
        double theta;
        int scaling;
        double factor;
    } rules[] = {{"plain", 10000, 0, 1}, {"linear", 1e6, 1, 8}, {"llama3", 500000, 2, 8}};
    for (const Rule &r : rules)
        for (int adjacent = 0; adjacent < 2; adjacent++) {
            SCOPED_TRACE(std::string(r.name) + (adjacent ? " adjacent" : " rotate-half"));
            std::vector<float> inv(D / 2);
            ft_rope_inv_freq(r.theta, r.scaling, r.factor, 1.0, 4.0, 8192, D, inv.data());
            std::vector<float> x = ft::randn((size_t)n * heads * D, 1.0f, 7), shifted = x, direct = x;
            ASSERT_EQ(ft_rope(c, shifted.data(), n, heads, D, inv.data(), d + 5, adjacent), FORGE_OK);
            ASSERT_EQ(ft_rope_shift(c, shifted.data(), n, heads, D, inv.data(), d, adjacent), FORGE_OK);
            ASSERT_EQ(ft_rope(c, direct.data(), n, heads, D, inv.data(), 5, adjacent), FORGE_OK);
            EXPECT_LT(ft::rel_err(shifted.data(), direct.data(), x.size()), 2e-4);
        }
}

/* On an f16 cache (rope_shift_kv16, two pairs an invocation) the re-rotation is the f32 one
 * on the same f16 keys, rounded back to f16 (within one f16 rounding: the two builds may
 * contract the products differently), and still lands on the keys rotated directly. */
TEST(Overflow, ReRotationOfF16KeysIsTheF32OneRounded) {
    ft_ctx *c = ft_device();
    if (!c) GTEST_SKIP() << "no device";
    const uint32_t D = 64, heads = 2, n = 24, d = 700;
    std::vector<float> inv(D / 2);
    ft_rope_inv_freq(500000, 2, 8, 1.0, 4.0, 8192, D, inv.data());
    for (int adjacent = 0; adjacent < 2; adjacent++) {
        SCOPED_TRACE(adjacent ? "adjacent" : "rotate-half");
        std::vector<float> x = ft::randn((size_t)n * heads * D, 1.0f, 7), direct = x;
        ASSERT_EQ(ft_rope(c, x.data(), n, heads, D, inv.data(), d + 5, adjacent), FORGE_OK);
        ASSERT_EQ(ft_rope(c, direct.data(), n, heads, D, inv.data(), 5, adjacent), FORGE_OK);
        std::vector<uint16_t> k16(x.size());
        std::vector<float> k32(x.size()), got(x.size()), want(x.size());
        for (size_t i = 0; i < x.size(); i++) k32[i] = ft_f16_to_f32(k16[i] = ft_f32_to_f16(x[i]));
        ASSERT_EQ(ft_rope_shift16(c, k16.data(), n, heads, D, inv.data(), d, adjacent), FORGE_OK);
        ASSERT_EQ(ft_rope_shift(c, k32.data(), n, heads, D, inv.data(), d, adjacent), FORGE_OK);
        for (size_t i = 0; i < x.size(); i++) {
            got[i] = ft_f16_to_f32(k16[i]);
            want[i] = ft_f16_to_f32(ft_f32_to_f16(k32[i]));
            EXPECT_LE(std::fabs(got[i] - want[i]), std::ldexp(std::fabs(want[i]), -10) + 1e-7f) << "element " << i;
        }
        EXPECT_LT(ft::rel_err(got.data(), direct.data(), x.size()), 2e-3);
    }
}

/* The same on a q8_0 cache (rope_shift_kv8, a workgroup a key head: dequantize, rotate back,
 * quantize again): every value within one quantization step of the f32 re-rotation of the same
 * quantized keys quantized again (host side), and the result close to keys rotated directly
 * for the new positions. D 96: three blocks, so a rotate-half pair spans two of them. */
TEST(Overflow, ReRotationOfQ8KeysIsTheF32OneQuantized) {
    ft_ctx *c = ft_device();
    if (!c) GTEST_SKIP() << "no device";
    const uint32_t D = 96, heads = 2, n = 24, d = 700;
    const size_t H = (size_t)n * heads, hb = ft_kv8_head_bytes(D);
    std::vector<float> inv(D / 2);
    ft_rope_inv_freq(500000, 2, 8, 1.0, 4.0, 8192, D, inv.data());
    for (int adjacent = 0; adjacent < 2; adjacent++) {
        SCOPED_TRACE(adjacent ? "adjacent" : "rotate-half");
        std::vector<float> x = ft::randn(H * D, 1.0f, 7), direct = x;
        ASSERT_EQ(ft_rope(c, x.data(), n, heads, D, inv.data(), d + 5, adjacent), FORGE_OK);
        ASSERT_EQ(ft_rope(c, direct.data(), n, heads, D, inv.data(), 5, adjacent), FORGE_OK);
        std::vector<uint8_t> k8(H * hb), want8(H * hb);
        std::vector<float> k32(x.size()), got(x.size()), want(x.size());
        ft_kv_convert(x.data(), FORGE_KV_F32, k8.data(), FORGE_KV_Q8_0, H, D);
        ft_kv_convert(k8.data(), FORGE_KV_Q8_0, k32.data(), FORGE_KV_F32, H, D);
        ASSERT_EQ(ft_rope_shift8(c, k8.data(), n, heads, D, inv.data(), d, adjacent), FORGE_OK);
        ASSERT_EQ(ft_rope_shift(c, k32.data(), n, heads, D, inv.data(), d, adjacent), FORGE_OK);
        ft_kv_convert(k8.data(), FORGE_KV_Q8_0, got.data(), FORGE_KV_F32, H, D);
        ft_kv_convert(k32.data(), FORGE_KV_F32, want8.data(), FORGE_KV_Q8_0, H, D);
        ft_kv_convert(want8.data(), FORGE_KV_Q8_0, want.data(), FORGE_KV_F32, H, D);
        for (size_t i = 0; i < x.size(); i++) {
            float step = 0; /* the block's scale: max |v| / 127 */
            for (size_t e = i / 32 * 32; e < i / 32 * 32 + 32; e++) step = std::fmax(step, std::fabs(want[e]) / 127.0f);
            EXPECT_LE(std::fabs(got[i] - want[i]), step * 1.01f + 1e-7f) << "element " << i;
        }
        double err = ft::rel_err(got.data(), direct.data(), x.size());
        printf("  %s: max|d|/max|ref| against keys rotated directly = %.2e\n", adjacent ? "adjacent" : "rotate-half", err);
        EXPECT_LT(err, 2e-2);
    }
}

/* Sliding-window models (Gemma 2 and 3, rotating caches of window 8 + n_batch 8 - 1 slots)
 * slide in both modes: RECOMPUTE exactly; SHIFT rotates the wrapped rings (their first layer's
 * rows of the positions the window still reaches equal a recompute's), and afterwards the ring
 * no longer holds the kept positions, so the prompt cache cannot go back to them. With
 * n_batch = n_ctx the ring does not rotate and SHIFT moves rows as on full layers. */
TEST(Overflow, SlidingWindowModelsSlideInBothModes) {
    for (const char *fixture : {"gemma3_text_pattern_f32", "gemma2_f32"}) {
        SCOPED_TRACE(fixture);
        forge_model *m = ft::load(ft::src(std::string("tests/fixtures/parity/") + fixture));
        ASSERT_NE(m, nullptr);
        int V = forge_model_n_vocab(m);
        forge_model_info info = ft::sized<forge_model_info>();
        ASSERT_EQ(forge_model_get_info(m, &info), FORGE_OK);
        size_t row = (size_t)info.n_kv_heads * info.head_dim;
        forge_session *s = overflow_session(m, 32, 8, FORGE_OVERFLOW_RECOMPUTE, 1);
        ASSERT_NE(s, nullptr);
        int slides = 0;
        EXPECT_EQ(slide_vs_fresh(m, s, 32, 8, tokens(70, V, 2), &slides), 0.0);
        EXPECT_GE(slides, 3);
        forge_session_free(s);
        for (int n_batch : {8, 32}) {
            SCOPED_TRACE(n_batch);
            int S = n_batch == 8 ? 15 : 32; /* slots of a sliding layer */
            s = overflow_session(m, 32, n_batch, FORGE_OVERFLOW_SHIFT, 3); /* drops 14 (not a multiple of 15) */
            ASSERT_NE(s, nullptr);
            std::vector<int32_t> t = tokens(70, V, 3);
            std::vector<float> lg(V);
            for (int i = 0; i < 33; i++) ASSERT_EQ(forge_eval(s, &t[i], 1, 0, lg.data(), lg.size()), FORGE_OK) << forge_session_errmsg(s);
            std::vector<int32_t> h = history(s);
            ASSERT_EQ(h.size(), 3u + 15 + 1); /* 32 -> 18 (dropped 14), then one more */
            forge_session *f = ft::session(m, 32, n_batch);
            ASSERT_EQ(forge_eval(f, h.data(), (int)h.size(), 0, nullptr, 0), FORGE_OK);
            std::vector<float> a(S * row), b(S * row);
            for (int v = 0; v < 2; v++) { /* layer 0 slides in both fixtures */
                ASSERT_EQ(ft_session_kv(s, 0, v, 0, S, a.data()), FORGE_OK);
                ASSERT_EQ(ft_session_kv(f, 0, v, 0, S, b.data()), FORGE_OK);
                double worst = 0;
                for (int q = std::max(3, (int)h.size() - S); q < (int)h.size(); q++) /* the valid positions */
                    worst = std::max(worst, ft::rel_err(&a[(q % S) * row], &b[(q % S) * row], row));
                EXPECT_LT(worst, 1e-5) << (v ? "values" : "keys");
            }
            forge_session_free(f);
            if (n_batch == 8) {
                EXPECT_EQ(forge_session_truncate(s, 2), FORGE_ERR_LIMIT); /* the kept positions' keys are gone */
            }
            for (int i = 33; i < 70; i++) ASSERT_EQ(forge_eval(s, &t[i], 1, 0, lg.data(), lg.size()), FORGE_OK) << forge_session_errmsg(s);
            for (float x : lg) EXPECT_TRUE(std::isfinite(x));
            EXPECT_EQ(forge_session_n_past(s), 28); /* slid at the 33rd, 47th and 61st token (to 18), then 9 more */
            forge_session_free(s);
        }
        forge_model_free(m);
    }
}

/* Qwen 3.5: a recurrent state cannot drop tokens, so SHIFT recomputes as RECOMPUTE does; in
 * both modes every slide's logits equal a fresh session's on the kept tokens, bit for bit. */
TEST(Overflow, LinearAttentionModelsRecomputeInBothModes) {
    forge_model *m = ft::load(ft::src("tests/fixtures/parity/qwen3_5_text_f32"));
    ASSERT_NE(m, nullptr);
    for (forge_overflow mode : {FORGE_OVERFLOW_RECOMPUTE, FORGE_OVERFLOW_SHIFT}) {
        SCOPED_TRACE(mode);
        forge_session *s = overflow_session(m, 32, 8, mode, 2);
        ASSERT_NE(s, nullptr);
        int slides = 0;
        EXPECT_EQ(slide_vs_fresh(m, s, 32, 8, tokens(60, forge_model_n_vocab(m), 5), &slides), 0.0);
        EXPECT_GE(slides, 2);
        forge_session_free(s);
    }
    forge_model_free(m);
}

/* The CLI: `forge run` stops at a full context by default and slides with --ctx-overflow. */
TEST(Overflow, CliRunSlidesWhenAsked) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    std::string d = ft::tmpdir("overflow_cli"), model = ft::src(kStories);
    auto run = [&](const std::string &args) {
        std::string cmd = "./forge run " + model + " -p 'Once upon a time' -n 150 --ctx 64 --metrics " + args + " > " + d +
                          "/out.txt 2> " + d + "/err.txt";
        int rc = system(cmd.c_str());
        std::vector<uint8_t> e = ft::read_file(d + "/err.txt");
        return std::make_pair(WEXITSTATUS(rc), std::string(e.begin(), e.end()));
    };
    auto r = run("");
    EXPECT_EQ(r.first, 0);
    EXPECT_NE(r.second.find("stop: context full"), std::string::npos) << r.second;
    for (const char *mode : {"shift", "recompute"}) {
        r = run(std::string("--ctx-overflow ") + mode + " --keep 3");
        EXPECT_EQ(r.first, 0) << mode;
        EXPECT_NE(r.second.find("generated 150"), std::string::npos) << r.second;
        EXPECT_NE(r.second.find("context slides "), std::string::npos) << r.second;
    }
    EXPECT_EQ(run("--ctx-overflow sideways").first, 2);
    EXPECT_EQ(run("--ctx-overflow shift --keep 63").first, 1); /* n_keep must leave room */
}
