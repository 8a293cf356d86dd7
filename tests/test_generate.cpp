/* Generation: the device reduction against a host sort, the sampling filters, greedy and
 * seeded generation on the real stories260K model, stop rules, cancellation, the prompt cache
 * (including sliding-window layers whose rotating cache has wrapped). */
#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <map>
#include <set>
#include <tuple>

#include "internal.h"
#include "util.h"

namespace {

ft_ctx *device() { return ft_device(); }

struct Collect {
    std::vector<int32_t> tokens;
    std::string text;
    int stop_after = -1;
    static int cb(void *u, int32_t tok, const char *text, size_t len) {
        Collect *c = (Collect *)u;
        if (tok >= 0) c->tokens.push_back(tok);
        c->text.append(text, len);
        return c->stop_after >= 0 && (int)c->tokens.size() >= c->stop_after; /* non-zero: stop */
    }
};

struct Stories {
    forge_model *m = nullptr;
    Stories() { m = ft::load(ft::src("models/stories260K/stories260K.gguf")); }
    ~Stories() { forge_model_free(m); }
    forge_session *session(int n_ctx = 256, int n_batch = 0) { return ft::session(m, n_ctx, n_batch); }
};

const char *kStory = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";

} // namespace

TEST(Sampler, DeviceTopKMatchesHostSort) {
    ASSERT_NE(device(), nullptr);
    for (uint32_t V : {37u, 1000u, 5000u, 70000u, 3001u, 128256u, 128255u}) {
        std::vector<float> l = ft::randn(V, 3.0f, V);
        for (uint32_t i = 0; i < V; i += 7) l[i] = l[(i * 13) % V]; /* ties */
        if (V == 3001) /* a thousand ties at the top: the 256 best are the first of them by index */
            for (uint32_t i = 0; i < V; i++) l[i] = i % 3 == 1 ? 12.0f : std::min(l[i], 11.0f);
        if (V > 100) { l[50] = NAN; l[51] = 9.5f; l[52] = 9.5f; }
        if (V == 128255) /* the best 300 in one late chunk of 1024: past what the merge caches of each list */
            for (uint32_t i = 124 * 1024 + 100; i < 124 * 1024 + 400; i++) l[i] = 40.0f + 0.01f * (float)(i % 97);
        std::vector<uint32_t> ids = {3, 5, 51, 8, 0};
        float penalty = 1.7f, inv_temp = 1.0f / 0.7f;
        std::vector<float> pl = l;
        for (uint32_t id : ids) /* ids outside the vocabulary (51 when V = 37) are ignored */
            if (id < V) pl[id] = pl[id] > 0 ? pl[id] / penalty : pl[id] * penalty;
        std::vector<std::pair<float, int32_t>> ref;
        for (uint32_t i = 0; i < V; i++) ref.push_back({std::isnan(pl[i]) ? -INFINITY : pl[i], (int32_t)i});
        std::stable_sort(ref.begin(), ref.end(), [](auto &a, auto &b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
        double M = ref[0].first, S = 0;
        for (auto &r : ref)
            if (std::isfinite(r.first)) S += std::exp((r.first - M) * inv_temp);
        std::vector<float> cl(256);
        std::vector<int32_t> ci(256);
        uint32_t n = 0;
        float gM, gS;
        ASSERT_EQ(ft_topk(device(), l.data(), V, ids.data(), (uint32_t)ids.size(), penalty, inv_temp, cl.data(), ci.data(), &n, &gM, &gS), FORGE_OK);
        ASSERT_EQ(n, std::min(V, 256u));
        for (uint32_t i = 0; i < n; i++) {
            ASSERT_EQ(ci[i], ref[i].second) << "V " << V << " rank " << i;
            /* the device's division by the penalty may differ from the host's in the last bit */
            ASSERT_NEAR(cl[i], ref[i].first, 1e-6 * std::fabs(ref[i].first)) << "V " << V << " rank " << i;
        }
        EXPECT_EQ(gM, (float)M);
        EXPECT_NEAR(gS, S, S * 1e-5) << "V " << V;
        /* greedy (inv_temp 0): the best candidate alone, ties to the lower id (V 3001: a thousand
         * ties over three chunks; 128255: the best in a late chunk) */
        std::fill(ci.begin(), ci.end(), -1);
        ASSERT_EQ(ft_topk(device(), l.data(), V, ids.data(), (uint32_t)ids.size(), penalty, 0.0f, cl.data(), ci.data(), &n, &gM, &gS), FORGE_OK);
        EXPECT_EQ(ci[0], ref[0].second) << "greedy, V " << V;
        EXPECT_NEAR(cl[0], ref[0].first, 1e-6 * std::fabs(ref[0].first)) << "greedy, V " << V;
        EXPECT_EQ(gM, (float)M) << "greedy, V " << V;
        /* the host's reduction (CPU devices) of the penalized row: the same candidates, exactly */
        for (int take : {(int)n, 1, (int)std::min(V, 7u)}) {
            std::vector<float> hl(take);
            std::vector<int32_t> hi(take);
            double hM, hS;
            ft_reduce_row_host(pl.data(), (int)V, take, inv_temp, hl.data(), hi.data(), &hM, &hS);
            for (int i = 0; i < take; i++) {
                ASSERT_EQ(hi[i], ref[i].second) << "V " << V << " of " << take << " rank " << i;
                ASSERT_EQ(hl[i], ref[i].first) << "V " << V << " rank " << i;
            }
            EXPECT_EQ(hM, M);
            EXPECT_NEAR(hS, S, S * 1e-12) << "V " << V;
        }
    }
}

/* The whole-row draws' radix sort puts a row in the order a comparison sort by (logit
 * descending, id ascending) does, NaN as -inf and -0 beside +0: rows of a vocabulary's width
 * with ties, signed zeros, infinities and NaN. Its time beside std::sort's is printed. */
TEST(Sampler, RowSortIsTheComparisonOrder) {
    for (int trial = 0; trial < 6; trial++) {
        int V = trial < 3 ? 128256 : 1 + trial * 37;
        std::vector<float> l = ft::randn((size_t)V, trial == 1 ? 0.01f : 3.0f, 900 + trial);
        std::mt19937 gen(trial);
        for (int i = 0; i < V; i += 1 + (int)(gen() % 97)) {
            int what = (int)(gen() % 7);
            l[i] = what == 0 ? 0.0f : what == 1 ? -0.0f : what == 2 ? -INFINITY : what == 3 ? INFINITY : what == 4 ? NAN
                 : what == 5 ? l[(i * 7) % V] : std::round(l[i] * 4) / 4; /* ties */
        }
        std::vector<int32_t> ref(V);
        for (int i = 0; i < V; i++) ref[i] = i;
        auto val = [&](int32_t i) { return std::isnan(l[i]) ? -INFINITY : l[i]; };
        auto t0 = std::chrono::steady_clock::now();
        std::sort(ref.begin(), ref.end(), [&](int32_t a, int32_t b) { return val(a) != val(b) ? val(a) > val(b) : a < b; });
        auto t1 = std::chrono::steady_clock::now();
        std::vector<float> sl(V);
        std::vector<int32_t> sid(V);
        ft_sort_cands(l.data(), V, sl.data(), sid.data());
        auto t2 = std::chrono::steady_clock::now();
        for (int i = 0; i < V; i++) {
            ASSERT_EQ(sid[i], ref[i]) << "trial " << trial << " rank " << i;
            ASSERT_EQ(sl[i], val(ref[i])) << "trial " << trial << " rank " << i;
        }
        if (trial == 0)
            printf("  a %d-logit row: std::sort %.2f ms, forge__sort_cands %.2f ms\n", V,
                   std::chrono::duration<double, std::milli>(t1 - t0).count(), std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
}

TEST(Sampler, FiltersNeverLeaveTheirSets) {
    int V = 300;
    std::vector<float> l = ft::randn(V, 2.0f, 77);
    std::vector<int32_t> id(V);
    for (int i = 0; i < V; i++) id[i] = i;
    std::vector<int> order(V);
    for (int i = 0; i < V; i++) order[i] = i;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
    std::vector<float> sl(V);
    std::vector<int32_t> sid(V);
    for (int i = 0; i < V; i++) { sl[i] = l[order[i]]; sid[i] = order[i]; }
    auto probs = [&](float T) {
        std::vector<double> p(V);
        double s = 0;
        for (int i = 0; i < V; i++) s += (p[i] = std::exp((sl[i] - sl[0]) / T));
        for (auto &x : p) x /= s;
        return std::make_pair(p, s);
    };
    uint64_t rng[4];
    ft_rng_seed(rng, 1234);
    { /* temperature 0 is greedy */
        auto ps = probs(1.0f);
        for (int i = 0; i < 50; i++) EXPECT_EQ(ft_sample(sl.data(), sid.data(), V, 1, sl[0], ps.second, 0.0f, 0, 1, 0, rng), sid[0]);
    }
    { /* top-k */
        auto ps = probs(1.5f);
        std::set<int32_t> top(sid.begin(), sid.begin() + 5), seen;
        for (int i = 0; i < 3000; i++) {
            int32_t t = ft_sample(sl.data(), sid.data(), V, 1, sl[0], ps.second, 1.5f, 5, 1, 0, rng);
            ASSERT_TRUE(top.count(t)) << t;
            seen.insert(t);
        }
        EXPECT_EQ(seen.size(), 5u);
    }
    { /* top-p: the smallest prefix whose probability reaches p */
        auto ps = probs(1.0f);
        double cum = 0;
        int k = 0;
        while (cum < 0.6) cum += ps.first[k++];
        std::set<int32_t> nucleus(sid.begin(), sid.begin() + k);
        for (int i = 0; i < 3000; i++) ASSERT_TRUE(nucleus.count(ft_sample(sl.data(), sid.data(), V, 1, sl[0], ps.second, 1.0f, 0, 0.6f, 0, rng)));
    }
    { /* min-p */
        auto ps = probs(2.0f);
        std::set<int32_t> ok;
        for (int i = 0; i < V; i++)
            if (ps.first[i] >= 0.2 * ps.first[0]) ok.insert(sid[i]);
        for (int i = 0; i < 3000; i++) ASSERT_TRUE(ok.count(ft_sample(sl.data(), sid.data(), V, 1, sl[0], ps.second, 2.0f, 0, 1, 0.2f, rng)));
    }
    { /* a plain draw follows the distribution */
        auto ps = probs(1.0f);
        std::map<int32_t, int> count;
        int N = 20000;
        for (int i = 0; i < N; i++) count[ft_sample(sl.data(), sid.data(), V, 1, sl[0], ps.second, 1.0f, 0, 1, 0, rng)]++;
        for (int r = 0; r < 3; r++) EXPECT_NEAR(count[sid[r]] / (double)N, ps.first[r], 0.02) << "rank " << r;
    }
    { /* candidates that cannot decide the draw ask for the whole row */
        auto ps = probs(50.0f); /* nearly flat */
        EXPECT_EQ(ft_sample(sl.data(), sid.data(), 20, 0, sl[0], ps.second, 50.0f, 0, 0.9f, 0, rng), -1);
        EXPECT_EQ(ft_sample(sl.data(), sid.data(), 20, 0, sl[0], ps.second, 50.0f, 40, 1, 0, rng), -1);
        EXPECT_NE(ft_sample(sl.data(), sid.data(), 20, 0, sl[0], ps.second, 50.0f, 10, 1, 0, rng), -1);
    }
}

TEST(Generate, GreedyMatchesArgmaxOfEval) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    forge_session *a = st.session(), *b = st.session();
    int32_t bos = 1;
    forge_generate_params p = forge_generate_default_params();
    p.max_tokens = 60;
    Collect c;
    p.on_token = Collect::cb;
    p.user_data = &c;
    forge_metrics mt = ft::sized<forge_metrics>();
    ASSERT_EQ(forge_generate_tokens(a, &bos, 1, &p, &mt), FORGE_OK) << forge_session_errmsg(a);
    EXPECT_EQ(mt.generated_tokens, 60);
    EXPECT_EQ(mt.stop_reason, FORGE_STOP_MAX_TOKENS);
    EXPECT_EQ(mt.prompt_tokens, 1);
    EXPECT_GT(mt.decode_tok_s, 0);
    EXPECT_GT(mt.peak_device_bytes, 0u);
    std::vector<float> logits(512);
    int32_t tok = bos;
    for (int i = 0; i < 60; i++) {
        ASSERT_EQ(forge_eval(b, &tok, 1, 0, logits.data(), logits.size()), FORGE_OK);
        tok = ft::argmax(logits.data(), 512);
        ASSERT_EQ(c.tokens[i], tok) << "token " << i;
    }
    EXPECT_EQ(c.text.substr(0, strlen(kStory)), kStory);
    forge_session_free(a);
    forge_session_free(b);
}

/* forge_session_prewarm creates and dispatches exactly the kernels generation then runs: after it
 * a generation from a one-token prompt (and, prewarmed for 20, one from a 20-token prompt)
 * creates no pipeline; the callback counts every kernel, names each once, and ends with
 * (total, total, NULL); a second call finds nothing to do; the story is the same. */
TEST(Generate, PrewarmCompilesWhatGenerationRuns) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    forge_session *s = st.session();
    ASSERT_NE(s, nullptr);
    struct Calls {
        std::vector<std::tuple<int, int, std::string>> seen;
        int ends = 0;
        static void cb(void *u, int done, int total, const char *kernel) {
            Calls *c = (Calls *)u;
            if (kernel) c->seen.emplace_back(done, total, kernel);
            else {
                EXPECT_EQ(done, total);
                c->ends++;
            }
        }
    } calls;
    int warm = -1; /* the session has recorded its decode steps: their pipelines exist, not yet dispatched */
    int before = ft_model_pipelines(st.m, &warm);
    EXPECT_EQ(warm, 0);
    ASSERT_EQ(forge_session_prewarm(s, 1, Calls::cb, &calls), FORGE_OK) << forge_session_errmsg(s);
    int n = (int)calls.seen.size();
    EXPECT_GE(n, before);
    EXPECT_GT(n, 2);
    EXPECT_EQ(calls.ends, 1);
    std::set<std::string> names;
    for (int i = 0; i < n; i++) {
        EXPECT_EQ(std::get<0>(calls.seen[i]), i);
        EXPECT_EQ(std::get<1>(calls.seen[i]), n);
        names.insert(std::get<2>(calls.seen[i]));
    }
    EXPECT_EQ((int)names.size(), n);
    EXPECT_EQ(ft_model_pipelines(st.m, &warm), n);
    EXPECT_EQ(warm, n);

    int32_t bos = 1;
    forge_generate_params p = forge_generate_default_params();
    p.max_tokens = 30;
    Collect c;
    p.on_token = Collect::cb;
    p.user_data = &c;
    ASSERT_EQ(forge_generate_tokens(s, &bos, 1, &p, nullptr), FORGE_OK) << forge_session_errmsg(s);
    EXPECT_EQ(c.text.substr(0, 40), std::string(kStory).substr(0, 40));
    EXPECT_EQ(ft_model_pipelines(st.m, nullptr), n) << "generation from one token created a kernel the prewarm did not";

    Calls again; /* everything is warm: nothing to do, but the end is still reported */
    ASSERT_EQ(forge_session_prewarm(s, 1, Calls::cb, &again), FORGE_OK);
    EXPECT_TRUE(again.seen.empty());
    EXPECT_EQ(again.ends, 1);

    forge_session *t = st.session();
    ASSERT_NE(t, nullptr);
    Calls longer; /* a 20-token prompt's step: the prefill's kernels, only those not yet warm */
    ASSERT_EQ(forge_session_prewarm(t, 20, Calls::cb, &longer), FORGE_OK) << forge_session_errmsg(t);
    int total = ft_model_pipelines(st.m, &warm);
    EXPECT_EQ(total, n + (int)longer.seen.size());
    EXPECT_EQ(warm, total);
    for (auto &k : longer.seen) EXPECT_EQ(names.count(std::get<2>(k)), 0u) << std::get<2>(k) << " was prewarmed twice";
    std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 429, 271, 266, 2, 400, 33, 7, 100, 101, 102, 300, 12, 9, 77, 5};
    Collect c2;
    p.user_data = &c2;
    ASSERT_EQ(forge_generate_tokens(t, prompt.data(), (int)prompt.size(), &p, nullptr), FORGE_OK) << forge_session_errmsg(t);
    EXPECT_EQ(ft_model_pipelines(st.m, nullptr), total) << "a 20-token prompt created a kernel its prewarm did not";

    EXPECT_EQ(forge_session_prewarm(nullptr, 0, nullptr, nullptr), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(forge_session_prewarm(t, -1, nullptr, nullptr), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_session_errmsg(t)).find("n_prompt -1"), std::string::npos) << forge_session_errmsg(t);
    forge_session_free(t);
    forge_session_free(s);
}

TEST(Generate, SameSeedSameOutput) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    forge_session *s = st.session();
    int32_t bos = 1;
    auto run = [&](uint64_t seed) {
        forge_generate_params p = forge_generate_default_params();
        p.max_tokens = 40;
        p.temperature = 2.0f;
        p.top_k = 40;
        p.top_p = 0.98f;
        p.seed = seed;
        Collect c;
        p.on_token = Collect::cb;
        p.user_data = &c;
        EXPECT_EQ(forge_generate_tokens(s, &bos, 1, &p, nullptr), FORGE_OK);
        return c.tokens;
    };
    std::vector<int32_t> a = run(42), b = run(42), c = run(43);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
    forge_session_free(s);
}

/* CPU devices reduce the sampler's row on the host (forge__reduce_row_on_host), other devices
 * with topk.comp + topk_merge.comp: the same model draws the same tokens either way, greedy and
 * sampled (penalty, temperature, top-k, top-p, min-p; a wide top-k takes the full-row fallback). */
TEST(Generate, HostAndDeviceSamplerReductionsDrawTheSameTokens) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    int32_t bos = 1;
    auto run = [&](bool on_host, float temperature, int top_k, float top_p, float min_p) {
        ft_model_set_sample_on_host(st.m, on_host);
        forge_session *s = st.session(); /* recorded after the switch */
        forge_generate_params p = forge_generate_default_params();
        p.max_tokens = 48;
        p.temperature = temperature;
        p.top_k = top_k;
        p.top_p = top_p;
        p.min_p = min_p;
        p.repeat_penalty = 1.15f;
        p.seed = 99;
        Collect c;
        p.on_token = Collect::cb;
        p.user_data = &c;
        EXPECT_EQ(forge_generate_tokens(s, &bos, 1, &p, nullptr), FORGE_OK);
        forge_session_free(s);
        return c.tokens;
    };
    struct { float t; int k; float p, mp; } cases[] = {{0.0f, 0, 1.0f, 0.0f}, {1.3f, 40, 0.95f, 0.0f}, {1.0f, 0, 1.0f, 0.05f},
                                                     {2.0f, 400, 1.0f, 0.0f}};
    for (auto &c : cases) {
        std::vector<int32_t> host = run(true, c.t, c.k, c.p, c.mp), dev = run(false, c.t, c.k, c.p, c.mp);
        EXPECT_EQ(host.size(), 48u);
        EXPECT_EQ(host, dev) << "temperature " << c.t << " top_k " << c.k << " top_p " << c.p << " min_p " << c.mp;
    }
}

TEST(Generate, StopStringAcrossTokensIsNotEmitted) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    forge_session *s = st.session();
    int32_t bos = 1;
    const char *stops[] = {"little girl"};
    forge_generate_params p = forge_generate_default_params();
    p.stop_strings = stops;
    p.n_stop_strings = 1;
    Collect c;
    p.on_token = Collect::cb;
    p.user_data = &c;
    forge_metrics mt = ft::sized<forge_metrics>();
    ASSERT_EQ(forge_generate_tokens(s, &bos, 1, &p, &mt), FORGE_OK);
    EXPECT_EQ(mt.stop_reason, FORGE_STOP_STRING);
    EXPECT_EQ(c.text, "Once upon a time, there was a ");
    forge_session_free(s);
}

TEST(Generate, CallbackStopsAndSessionStaysUsable) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    forge_session *s = st.session();
    int32_t bos = 1;
    forge_generate_params p = forge_generate_default_params();
    Collect c;
    c.stop_after = 5;
    p.on_token = Collect::cb;
    p.user_data = &c;
    forge_metrics mt = ft::sized<forge_metrics>();
    ASSERT_EQ(forge_generate_tokens(s, &bos, 1, &p, &mt), FORGE_OK);
    EXPECT_EQ(mt.stop_reason, FORGE_STOP_CALLBACK);
    EXPECT_EQ(mt.generated_tokens, 5);
    EXPECT_EQ(forge_session_n_past(s), 5); /* BOS and the first four tokens were evaluated */
    Collect d;
    p.on_token = Collect::cb;
    p.user_data = &d;
    p.max_tokens = 10;
    ASSERT_EQ(forge_generate_tokens(s, &bos, 1, &p, &mt), FORGE_OK);
    EXPECT_EQ(std::vector<int32_t>(d.tokens.begin(), d.tokens.begin() + 5), c.tokens);
    forge_session_free(s);
}

TEST(Generate, PromptCacheReusesExactPrefixWithIdenticalLogits) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    forge_session *a = st.session(), *b = st.session();
    std::vector<int32_t> prefix = {1, 403, 407, 261, 378, 429, 271, 266, 400, 33, 7, 100};
    std::vector<int32_t> full = prefix;
    for (int32_t t : {101, 102, 300, 12, 9, 77}) full.push_back(t);
    ASSERT_EQ(forge_warm(a, prefix.data(), (int)prefix.size()), FORGE_OK);
    forge_generate_params p = forge_generate_default_params();
    p.max_tokens = 8;
    forge_metrics mt = ft::sized<forge_metrics>();
    ASSERT_EQ(forge_generate_tokens(a, full.data(), (int)full.size(), &p, &mt), FORGE_OK);
    EXPECT_EQ(mt.cached_tokens, (int)prefix.size());
    EXPECT_EQ(mt.prompt_cache_hits, 1u);
    /* cached + rest vs one fresh prefill: identical logits */
    ASSERT_EQ(forge_session_truncate(a, (int)prefix.size()), FORGE_OK);
    int rest = (int)(full.size() - prefix.size());
    std::vector<float> la((size_t)rest * 512), lb(full.size() * 512);
    ASSERT_EQ(forge_eval(a, full.data() + prefix.size(), rest, FORGE_EVAL_ALL_LOGITS, la.data(), la.size()), FORGE_OK);
    ASSERT_EQ(forge_eval(b, full.data(), (int)full.size(), FORGE_EVAL_ALL_LOGITS, lb.data(), lb.size()), FORGE_OK);
    EXPECT_LT(ft::rel_err(la.data(), lb.data() + prefix.size() * 512, la.size()), 1e-6);
    forge_session_free(a);
    forge_session_free(b);
}

/* Qwen 3.5's prompt cache: a recurrent state cannot go back, so a prompt that leaves the cached
 * tokens restarts from the session's checkpoint when it lies within the common tokens, else from
 * position 0; either way the greedy tokens are a fresh session's. A chat-like second turn (the
 * first turn's reply opening, checkpointed before, rendered anew, then the reply and a new
 * message) restarts at the checkpoint; a regenerate of the same prompt restarts one token before
 * its end; a prompt leaving the tokens before the checkpoint starts over; a truncation restarts
 * there too (then checked against a fresh session's logits). */
TEST(Generate, Qwen35PromptCacheRestartsFromItsCheckpoint) {
    forge_model *m = ft::load(ft::src("tests/fixtures/parity/qwen3_5_text_f32"));
    ASSERT_NE(m, nullptr);
    const int V = forge_model_n_vocab(m);
    forge_session *s = ft::session(m, 128, 16);
    ASSERT_NE(s, nullptr);
    auto toks = [&](int n, int mul, int add) {
        std::vector<int32_t> v;
        for (int i = 0; i < n; i++) v.push_back((i * mul + add) % V);
        return v;
    };
    forge_generate_params gp = forge_generate_default_params();
    gp.max_tokens = 6;
    gp.ignore_eos = 1;
    gp.on_token = Collect::cb;
    /* what a new session generates from p */
    auto fresh = [&](const std::vector<int32_t> &p) {
        forge_session *f = ft::session(m, 128, 16);
        Collect c;
        forge_generate_params g = gp;
        g.user_data = &c;
        EXPECT_EQ(forge_generate_tokens(f, p.data(), (int)p.size(), &g, nullptr), FORGE_OK);
        forge_session_free(f);
        return c.tokens;
    };
    auto run = [&](const std::vector<int32_t> &p, int snap, int want_cached, int want_ckpt, const char *what) {
        Collect c;
        forge_generate_params g = gp;
        g.user_data = &c;
        forge_metrics mt = ft::sized<forge_metrics>();
        int ckpt = -2;
        ASSERT_EQ(ft_generate_checkpointed(s, p.data(), (int)p.size(), snap, &g, &mt, &ckpt), FORGE_OK) << forge_session_errmsg(s);
        EXPECT_EQ(mt.cached_tokens, want_cached) << what;
        EXPECT_EQ(ckpt, want_ckpt) << what;
        EXPECT_EQ(c.tokens, fresh(p)) << what;
        c.tokens.clear();
    };
    std::vector<int32_t> head = toks(30, 7, 3), open1 = {5, 6, 7}, open2 = {5, 6}, msg = toks(9, 11, 1);
    std::vector<int32_t> turn1 = head;
    turn1.insert(turn1.end(), open1.begin(), open1.end());
    run(turn1, 30, 0, 30, "first turn");
    std::vector<int32_t> turn2 = head, reply = toks(6, 13, 2);
    turn2.insert(turn2.end(), open2.begin(), open2.end()); /* the reply's opening rendered anew */
    turn2.insert(turn2.end(), reply.begin(), reply.end());
    turn2.insert(turn2.end(), msg.begin(), msg.end());
    turn2.insert(turn2.end(), open1.begin(), open1.end());
    run(turn2, (int)turn2.size() - 3, 30, (int)turn2.size() - 3, "second turn");
    run(turn2, -1, (int)turn2.size() - 3, (int)turn2.size() - 1, "the same prompt, its reply regenerated");
    run(turn2, -1, (int)turn2.size() - 1, (int)turn2.size() - 1, "and again");
    std::vector<int32_t> other(turn2.begin(), turn2.begin() + 20);
    other.push_back(99);
    run(other, -1, 0, 20, "leaving the tokens before the checkpoint");
    /* a truncation within the checkpointed tokens' reach restarts from the checkpoint */
    ASSERT_EQ(forge_session_truncate(s, 20 + 1 + 3), FORGE_OK) << forge_session_errmsg(s);
    std::vector<int32_t> kept(other.begin(), other.end());
    std::vector<int32_t> hist(24);
    size_t n_hist = 0;
    ASSERT_EQ(forge_session_tokens(s, hist.data(), hist.size(), &n_hist), FORGE_OK);
    ASSERT_EQ(n_hist, 24u);
    std::vector<float> a(V), b(V);
    int32_t next = 17;
    ASSERT_EQ(forge_eval(s, &next, 1, 0, a.data(), a.size()), FORGE_OK);
    forge_session *f = ft::session(m, 128, 16);
    ASSERT_EQ(forge_eval(f, hist.data(), 24, 0, nullptr, 0), FORGE_OK);
    ASSERT_EQ(forge_eval(f, &next, 1, 0, b.data(), b.size()), FORGE_OK);
    EXPECT_LE(ft::rel_err(a.data(), b.data(), V), 1e-5);
    forge_session_free(f);
    forge_session_free(s);
    forge_model_free(m);
}

TEST(Generate, ContextLimits) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    forge_session *s = st.session(32);
    std::vector<int32_t> prompt(40, 5);
    forge_generate_params p = forge_generate_default_params();
    EXPECT_EQ(forge_generate_tokens(s, prompt.data(), 40, &p, nullptr), FORGE_ERR_LIMIT);
    std::string msg = forge_session_errmsg(s);
    EXPECT_NE(msg.find("40 tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("holds 32"), std::string::npos) << msg;
    p.max_tokens = 1000;
    p.ignore_eos = 1;
    forge_metrics mt = ft::sized<forge_metrics>();
    ASSERT_EQ(forge_generate_tokens(s, prompt.data(), 20, &p, &mt), FORGE_OK);
    EXPECT_EQ(mt.stop_reason, FORGE_STOP_CONTEXT);
    EXPECT_EQ(forge_session_n_past(s), 32);
    forge_session_free(s);
}

/* A parameter out of range is named with its value, alone (not every range at once). */
TEST(Generate, ParamOutOfRangeIsNamed) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    forge_session *s = st.session(32);
    std::vector<int32_t> prompt(4, 5);
    struct Case {
        void (*set)(forge_generate_params *);
        const char *says;
    } cases[] = {
        {[](forge_generate_params *p) { p->max_tokens = -1; }, "generate params: max_tokens -1 (must be >= 0)"},
        {[](forge_generate_params *p) { p->repeat_window = -2; }, "generate params: repeat_window -2 (must be >= 0)"},
        {[](forge_generate_params *p) { p->temperature = -0.5f; }, "generate params: temperature -0.5 (must be >= 0)"},
        {[](forge_generate_params *p) { p->top_p = 3; }, "generate params: top_p 3 (must be in (0, 1])"},
        {[](forge_generate_params *p) { p->min_p = 1.5f; }, "generate params: min_p 1.5 (must be in [0, 1])"},
        {[](forge_generate_params *p) { p->repeat_penalty = 0; }, "generate params: repeat_penalty 0 (must be > 0)"},
        {[](forge_generate_params *p) { p->top_k = -1; }, "generate params: top_k -1 (must be >= 0)"},
    };
    for (const Case &c : cases) {
        forge_generate_params p = forge_generate_default_params();
        c.set(&p);
        EXPECT_EQ(forge_generate_tokens(s, prompt.data(), 4, &p, nullptr), FORGE_ERR_INVALID_ARGUMENT) << c.says;
        EXPECT_EQ(std::string(forge_session_errmsg(s)), c.says);
    }
    forge_session_free(s);
}

/* Sliding-window layers keep window + n_batch - 1 positions in a ring: a prefix whose keys
 * the ring has overwritten cannot be reused, and the metrics say so. */
TEST(Generate, RotatingCacheWrapIsDetectedAndResultsStayExact) {
    forge_model *m = ft::load(ft::src("tests/fixtures/parity/gemma2_f32"));
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 64, 8), *fresh = ft::session(m, 64, 8);
    ASSERT_TRUE(s && fresh);
    forge_memory_stats ms = ft::sized<forge_memory_stats>();
    forge_session_memory(s, &ms);
    EXPECT_EQ(ms.kv_sliding_bytes, 2ull * 2 * 15 * 2 * 16 * 4); /* 2 sliding layers, K+V, 8 + 8 - 1 slots, 2 kv heads x 16 */
    std::vector<int32_t> prompt;
    for (int i = 0; i < 30; i++) prompt.push_back((i * 37 + 11) % 256);
    forge_generate_params p = forge_generate_default_params();
    p.max_tokens = 2;
    p.ignore_eos = 1;
    forge_metrics mt = ft::sized<forge_metrics>();
    ASSERT_EQ(forge_generate_tokens(s, prompt.data(), 30, &p, &mt), FORGE_OK);
    ASSERT_EQ(forge_session_n_past(s), 31);
    std::vector<int32_t> q(prompt.begin(), prompt.begin() + 29);
    q.push_back(5);
    Collect a, b;
    p.max_tokens = 6;
    p.on_token = Collect::cb;
    p.user_data = &a;
    ASSERT_EQ(forge_generate_tokens(s, q.data(), (int)q.size(), &p, &mt), FORGE_OK);
    EXPECT_EQ(mt.cached_tokens, 29); /* the ring still holds what position 29 needs */
    EXPECT_EQ(mt.cache_wrapped, 0);
    p.user_data = &b;
    ASSERT_EQ(forge_generate_tokens(fresh, q.data(), (int)q.size(), &p, nullptr), FORGE_OK);
    EXPECT_EQ(a.tokens, b.tokens);
    std::vector<int32_t> r(prompt.begin(), prompt.begin() + 20);
    r.push_back(7);
    Collect c, d;
    p.user_data = &c;
    int before = forge_session_n_past(s);
    ASSERT_EQ(forge_generate_tokens(s, r.data(), (int)r.size(), &p, &mt), FORGE_OK);
    EXPECT_EQ(before, 35);
    EXPECT_EQ(mt.cache_wrapped, 1);
    EXPECT_EQ(mt.cached_tokens, 0);
    ASSERT_EQ(forge_session_truncate(fresh, 0), FORGE_OK);
    p.user_data = &d;
    ASSERT_EQ(forge_generate_tokens(fresh, r.data(), (int)r.size(), &p, nullptr), FORGE_OK);
    EXPECT_EQ(c.tokens, d.tokens);
    EXPECT_EQ(forge_session_truncate(s, 10), FORGE_ERR_LIMIT);
    forge_session_free(s);
    forge_session_free(fresh);
    forge_model_free(m);
}

/* Prompt lookup: the drafts are verified in one pass and each position's token is drawn from
 * that pass's row with the call's sampler and seed, so the output is the plain decode's: greedy,
 * sampled (top-k, top-p), under a repeat penalty (the rows' logits read back and penalized on
 * the host), with a stop string and at max_tokens; the session holds the same tokens after. */
TEST(Generate, LookupDrawsWhatPlainDecodingDraws) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    std::string twice = std::string(kStory) + " " + kStory + " Once upon a time, there was a little girl named";
    std::vector<int32_t> prompt(twice.size() + 8);
    size_t n_ids = 0;
    ASSERT_EQ(forge_tokenize(st.m, twice.data(), twice.size(), FORGE_TOKENIZE_ADD_SPECIAL, prompt.data(), prompt.size(), &n_ids), FORGE_OK);
    prompt.resize(n_ids);
    ASSERT_GT(prompt.size(), 40u);
    struct Case { float t; int k; float top_p, penalty; int max; const char *stop; } cases[] = {
        {0.0f, 0, 1.0f, 1.0f, 96, nullptr}, {0.9f, 40, 1.0f, 1.0f, 64, nullptr}, {1.1f, 0, 0.9f, 1.0f, 64, nullptr},
        {0.8f, 0, 1.0f, 1.2f, 64, nullptr}, {0.0f, 0, 1.0f, 1.3f, 64, nullptr}, {0.0f, 0, 1.0f, 1.0f, 5, nullptr},
        {0.0f, 0, 1.0f, 1.0f, 96, "park"}};
    int drafted = 0, kept = 0;
    for (const Case &c : cases) {
        auto run = [&](int lookup, forge_metrics *mt, std::vector<int32_t> *held) {
            forge_session *s = st.session(512);
            forge_generate_params p = forge_generate_default_params();
            p.max_tokens = c.max;
            p.temperature = c.t;
            p.top_k = c.k;
            p.top_p = c.top_p;
            p.repeat_penalty = c.penalty;
            p.seed = 11;
            p.lookup = lookup;
            const char *stops[1] = {c.stop};
            p.stop_strings = stops;
            p.n_stop_strings = c.stop ? 1 : 0;
            Collect col;
            p.on_token = Collect::cb;
            p.user_data = &col;
            EXPECT_EQ(forge_generate_tokens(s, prompt.data(), (int)prompt.size(), &p, mt), FORGE_OK) << forge_session_errmsg(s);
            size_t n = 0;
            held->resize(1024);
            EXPECT_EQ(forge_session_tokens(s, held->data(), held->size(), &n), FORGE_OK);
            held->resize(n);
            forge_session_free(s);
            return col;
        };
        forge_metrics a = ft::sized<forge_metrics>(), b = ft::sized<forge_metrics>();
        std::vector<int32_t> held_a, held_b;
        Collect plain = run(0, &a, &held_a), looked = run(8, &b, &held_b);
        std::string what = "temperature " + std::to_string(c.t) + " penalty " + std::to_string(c.penalty) + " max " + std::to_string(c.max);
        EXPECT_EQ(plain.tokens, looked.tokens) << what;
        EXPECT_EQ(plain.text, looked.text) << what;
        EXPECT_EQ(a.generated_tokens, b.generated_tokens) << what;
        EXPECT_EQ(a.stop_reason, b.stop_reason) << what;
        EXPECT_EQ(held_a, held_b) << what;
        EXPECT_EQ(a.draft_tokens, 0);
        EXPECT_LE(b.draft_accepted, b.draft_tokens);
        if (c.stop) { EXPECT_EQ(b.stop_reason, FORGE_STOP_STRING); }
        drafted += b.draft_tokens;
        kept += b.draft_accepted;
    }
    EXPECT_GT(drafted, 0);
    EXPECT_GT(kept, 0); /* the story repeats: some drafts are the model's own continuation */
}

/* A rotating sliding-window cache (Gemma 2 with a window of 8) takes rejected drafts back only
 * while the ring still holds what the kept position needs: lookup and plain decoding give the
 * same tokens through many wraps of the ring; out-of-range lookup is named. */
TEST(Generate, LookupOnARotatingCacheAndItsRange) {
    forge_model *m = ft::load(ft::src("tests/fixtures/parity/gemma2_f32"));
    ASSERT_NE(m, nullptr);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 24; i++) prompt.push_back((i % 6) * 37 + 11);
    forge_metrics mt = ft::sized<forge_metrics>();
    auto run = [&](int lookup) {
        forge_session *s = ft::session(m, 64, 8);
        forge_generate_params p = forge_generate_default_params();
        p.max_tokens = 36;
        p.ignore_eos = 1;
        p.lookup = lookup;
        Collect c;
        p.on_token = Collect::cb;
        p.user_data = &c;
        EXPECT_EQ(forge_generate_tokens(s, prompt.data(), (int)prompt.size(), &p, &mt), FORGE_OK) << forge_session_errmsg(s);
        forge_session_free(s);
        return c.tokens;
    };
    std::vector<int32_t> plain = run(0), looked = run(15);
    EXPECT_EQ(plain.size(), 36u);
    EXPECT_EQ(plain, looked);
    EXPECT_GT(mt.draft_tokens, 0);
    forge_session *s = ft::session(m, 64, 8);
    for (int bad : {-1, 16}) {
        forge_generate_params p = forge_generate_default_params();
        p.lookup = bad;
        EXPECT_EQ(forge_generate_tokens(s, prompt.data(), 4, &p, nullptr), FORGE_ERR_INVALID_ARGUMENT);
        EXPECT_EQ(std::string(forge_session_errmsg(s)), "generate params: lookup " + std::to_string(bad) + " (must be 0 to 15 draft tokens)");
    }
    forge_session_free(s);
    forge_model_free(m);
}

/* A draft model's tokens are verified as prompt lookup's: the output is plain decoding's, with
 * the model itself as its draft (nearly every draft kept), a draft of another architecture and a
 * rotating target cache, a draft session whose context ends before the target's, and a second
 * call on a different prompt (the draft's cache taken back to what agrees); bad drafts named. */
TEST(Generate, DraftModelDrawsWhatPlainDecodingDraws) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    std::string text = std::string(kStory) + " Once upon a time, there was a little girl named";
    std::vector<int32_t> prompt(text.size() + 8);
    size_t n_ids = 0;
    ASSERT_EQ(forge_tokenize(st.m, text.data(), text.size(), FORGE_TOKENIZE_ADD_SPECIAL, prompt.data(), prompt.size(), &n_ids), FORGE_OK);
    prompt.resize(n_ids);
    auto run = [](forge_model *m, forge_session *draft, const std::vector<int32_t> &ids, float t, int lookup, int max, forge_metrics *mt) {
        forge_session *s = ft::session(m, 256);
        forge_generate_params p = forge_generate_default_params();
        p.max_tokens = max;
        p.temperature = t;
        p.top_k = t > 0 ? 40 : 0;
        p.seed = 5;
        p.ignore_eos = 1;
        p.lookup = lookup;
        p.draft = draft;
        Collect c;
        p.on_token = Collect::cb;
        p.user_data = &c;
        EXPECT_EQ(forge_generate_tokens(s, ids.data(), (int)ids.size(), &p, mt), FORGE_OK) << forge_session_errmsg(s);
        forge_session_free(s);
        return c.tokens;
    };
    forge_session *self = ft::session(st.m, 256), *short_ctx = ft::session(st.m, 64);
    for (float t : {0.0f, 0.9f}) {
        forge_metrics a = ft::sized<forge_metrics>(), b = ft::sized<forge_metrics>(), c = ft::sized<forge_metrics>();
        std::vector<int32_t> plain = run(st.m, nullptr, prompt, t, 0, 80, &a);
        EXPECT_EQ(run(st.m, self, prompt, t, 0, 80, &b), plain) << "temperature " << t;
        EXPECT_EQ(run(st.m, short_ctx, prompt, t, 6, 80, &c), plain) << "temperature " << t;
        EXPECT_GT(b.draft_tokens, 0);
        EXPECT_LE(b.draft_accepted, b.draft_tokens);
        if (t == 0.0f) { EXPECT_GT(b.draft_accepted * 10, b.draft_tokens * 9); } /* the model drafts for itself */
        EXPECT_GT(c.draft_tokens, 0);
        EXPECT_LT(c.draft_tokens, b.draft_tokens); /* the 64-position draft stops drafting */
    }
    /* a second call on another prompt: the draft's cache agrees with it only at the start */
    std::vector<int32_t> other(prompt.begin(), prompt.begin() + 10);
    forge_metrics mt = ft::sized<forge_metrics>();
    EXPECT_EQ(run(st.m, self, other, 0.0f, 3, 40, &mt), run(st.m, nullptr, other, 0.0f, 0, 40, nullptr));
    EXPECT_GT(mt.draft_accepted, 0);

    forge_model *gemma = ft::load(ft::src("tests/fixtures/parity/gemma2_f32"));   /* window 8: a rotating cache */
    forge_model *qwen = ft::load(ft::src("tests/fixtures/parity/qwen3_f32_sharded")); /* the same vocabulary size */
    forge_model *linear = ft::load(ft::src("tests/fixtures/parity/qwen3_5_text_f32"));
    ASSERT_TRUE(gemma && qwen && linear);
    std::vector<int32_t> ids;
    for (int i = 0; i < 20; i++) ids.push_back((i % 5) * 41 + 7);
    forge_session *qd = ft::session(qwen, 256);
    forge_metrics q = ft::sized<forge_metrics>();
    EXPECT_EQ(run(gemma, qd, ids, 0.0f, 5, 40, &q), run(gemma, nullptr, ids, 0.0f, 0, 40, nullptr));
    EXPECT_GT(q.draft_tokens, 0);
    EXPECT_EQ(run(gemma, qd, ids, 1.0f, 5, 40, nullptr), run(gemma, nullptr, ids, 1.0f, 0, 40, nullptr));

    forge_session *s = ft::session(gemma, 64), *ld = ft::session(linear, 64);
    struct Bad { forge_session *draft; forge_status st; std::string msg; } bad[] = {
        {s, FORGE_ERR_INVALID_ARGUMENT, "generate params: the draft session is this session"},
        {self, FORGE_ERR_INVALID_ARGUMENT, "generate params: the draft model's vocabulary has 512 tokens; this model's has 256"},
        {ld, FORGE_ERR_UNSUPPORTED, "generate params: a draft model needs models without linear-attention layers (their recurrent "
                                    "state cannot be cut back to drop rejected drafts); the draft model has them"}};
    for (const Bad &b : bad) {
        forge_generate_params p = forge_generate_default_params();
        p.draft = b.draft;
        EXPECT_EQ(forge_generate_tokens(s, ids.data(), 4, &p, nullptr), b.st);
        EXPECT_EQ(std::string(forge_session_errmsg(s)), b.msg);
    }
    for (forge_session *x : {s, ld, qd, self, short_ctx}) forge_session_free(x);
    for (forge_model *x : {gemma, qwen, linear}) forge_model_free(x);
}

/* Text in, text out: the empty prompt (the tokenizer adds BOS) and a text prompt. */
TEST(Generate, TextInTextOutStories) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    forge_session *s = st.session();
    forge_generate_params p = forge_generate_default_params();
    p.max_tokens = 60;
    Collect a;
    p.on_token = Collect::cb;
    p.user_data = &a;
    forge_metrics mt = ft::sized<forge_metrics>();
    ASSERT_EQ(forge_generate(s, "", 0, &p, &mt), FORGE_OK) << forge_session_errmsg(s);
    EXPECT_EQ(mt.prompt_tokens, 1); /* BOS */
    EXPECT_EQ(a.text.substr(0, strlen(kStory)), kStory);
    Collect b;
    p.user_data = &b;
    const char *prompt = "Once upon a time";
    ASSERT_EQ(forge_generate(s, prompt, strlen(prompt), &p, &mt), FORGE_OK) << forge_session_errmsg(s);
    EXPECT_EQ(std::string(prompt) + b.text.substr(0, strlen(kStory) - strlen(prompt)), kStory);
    /* the cache holds BOS and the first reply, which began with these very words: all of the
     * prompt but its last token (evaluated again for its logits) is reused */
    EXPECT_EQ(mt.cached_tokens, mt.prompt_tokens - 1);
    EXPECT_EQ(mt.prompt_tokens, 5);
    forge_session_free(s);
}

/* The callback convention (forge.h): 0 goes on, non-zero stops. A callback that always
 * returns 0 gets max_tokens tokens. */
TEST(Generate, CallbackReturningZeroGoesOn) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    forge_session *s = st.session();
    int32_t bos = 1;
    forge_generate_params p = forge_generate_default_params();
    p.max_tokens = 40;
    p.ignore_eos = 1;
    int calls = 0;
    p.user_data = &calls;
    p.on_token = [](void *u, int32_t tok, const char *, size_t) {
        if (tok >= 0) ++*(int *)u;
        return 0;
    };
    forge_metrics mt = ft::sized<forge_metrics>();
    ASSERT_EQ(forge_generate_tokens(s, &bos, 1, &p, &mt), FORGE_OK);
    EXPECT_EQ(mt.stop_reason, FORGE_STOP_MAX_TOKENS);
    EXPECT_EQ(mt.generated_tokens, 40);
    EXPECT_EQ(calls, 40);
    forge_session_free(s);
}

/* The README's library example is examples/generate.c word for word, and the build's
 * example_generate (beside the tests) prints the bundled model's story with it. */
TEST(Readme, LibraryExampleIsTheProgramTheBuildRuns) {
    std::vector<uint8_t> readme = ft::read_file(ft::src("README.md")), ex = ft::read_file(ft::src("examples/generate.c"));
    std::string r(readme.begin(), readme.end()), e(ex.begin(), ex.end());
    ASSERT_FALSE(e.empty());
    EXPECT_NE(r.find("```c\n" + e + "```"), std::string::npos) << "README.md's library example differs from examples/generate.c";
    if (!ft::exists("./example_generate")) GTEST_SKIP() << "no ./example_generate in the working directory (the build tree)";
    std::string out = ft::tmpdir("example") + "/out.txt";
    std::string cmd = "./example_generate " + ft::src("models/stories260K/stories260K.gguf") + " > " + out;
    ASSERT_EQ(system(cmd.c_str()), 0) << cmd;
    std::vector<uint8_t> o = ft::read_file(out);
    std::string text(o.begin(), o.end());
    EXPECT_EQ(text.find("Once upon a time, there was a little girl named Lily."), 0u) << text;
    EXPECT_NE(text.find("64 tokens"), std::string::npos) << text;
}
