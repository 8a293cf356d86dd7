/* Parallel sessions on one shared model: threads that generate, classify and cancel at once get
 * exactly what the same calls give run alone (bit-equal logits, equal tokens); the parallel-slot
 * cap holds; a cancel flag stops prefill and decode and leaves the session usable. The suite runs
 * under ASan + UBSan + LSan in `make sanitize`. */
#include <atomic>
#include <chrono>
#include <thread>

#include "util.h"

namespace {

const char *const kPrompts[] = {
    "Once upon a time", "Lily saw a big red ball", "The cat and the dog", "One day, Tom went to the park",
    "She wanted to play", "The sun was",
};
const int kNumPrompts = (int)(sizeof kPrompts / sizeof kPrompts[0]);

std::string model_path() { return ft::src("models/stories260K/stories260K.gguf"); }

/* What one call gave: generated tokens (or classify's tokens), classify's logits. */
struct Outcome {
    std::vector<int32_t> tokens;
    std::vector<float> logits;
    int status = 0;
    int stop = 0;
    int n_past = 0;
    bool operator==(const Outcome &o) const {
        return tokens == o.tokens && status == o.status && stop == o.stop && n_past == o.n_past &&
               logits.size() == o.logits.size() && (logits.empty() || memcmp(logits.data(), o.logits.data(), 4 * logits.size()) == 0);
    }
};

struct Collect {
    std::vector<int32_t> *tokens;
    int stop_after; /* 0: never */
};

int collect_token(void *ud, int32_t token, const char *, size_t) {
    Collect *c = (Collect *)ud;
    if (token >= 0) c->tokens->push_back(token);
    return c->stop_after > 0 && (int)c->tokens->size() >= c->stop_after;
}

/* Job `j` of the thread seeded `t`: the same (t, j) always makes the same call. Kinds: greedy
 * generate, seeded sampling, classify (three prompts, with logits), generate stopped by the
 * callback after k tokens, and generate from a long repeated prompt. */
Outcome run_job(forge_model *m, forge_session *s, int t, int j) {
    Outcome o;
    const int V = forge_model_n_vocab(m);
    int kind = (t + j) % 5;
    const char *prompt = kPrompts[(t * 7 + j) % kNumPrompts];
    if (kind == 2) {
        forge_classify_prompt ps[3];
        for (int i = 0; i < 3; i++) {
            const char *txt = kPrompts[(t + j + i) % kNumPrompts];
            ps[i] = {sizeof(forge_classify_prompt), txt, strlen(txt), nullptr, 0};
        }
        forge_classify_result rs[3] = {ft::sized<forge_classify_result>()};
        o.logits.resize((size_t)3 * V);
        forge_classify_params cp = forge_classify_default_params();
        cp.temperature = (j % 2) ? 0.9f : 0.0f;
        cp.seed = (uint64_t)(t * 1000 + j);
        cp.logits = o.logits.data();
        cp.logits_capacity = o.logits.size();
        o.status = forge_classify(s, ps, 3, &cp, rs);
        for (int i = 0; i < 3 && !o.status; i++) o.tokens.push_back(rs[i].token);
    } else {
        Collect c = {&o.tokens, kind == 3 ? 1 + (t + j) % 6 : 0};
        forge_generate_params gp = forge_generate_default_params();
        gp.max_tokens = 20;
        if (kind == 1) {
            gp.temperature = 0.8f;
            gp.top_k = 40;
            gp.seed = (uint64_t)(t * 100 + j);
        }
        std::string long_prompt;
        if (kind == 4) {
            for (int r = 0; r < 6; r++) long_prompt += std::string(prompt) + ". ";
            prompt = long_prompt.c_str();
        }
        gp.on_token = collect_token;
        gp.user_data = &c;
        forge_metrics mt = ft::sized<forge_metrics>();
        o.status = forge_generate(s, prompt, strlen(prompt), &gp, &mt);
        o.stop = mt.stop_reason;
    }
    o.n_past = forge_session_n_past(s);
    return o;
}

/* One thread's work: its own session, n_jobs calls in order (later calls reuse the cache). */
std::vector<Outcome> run_thread(forge_model *m, int t, int n_jobs) {
    std::vector<Outcome> out;
    forge_session *s = ft::session(m, 512, 64);
    if (!s) return out;
    for (int j = 0; j < n_jobs; j++) out.push_back(run_job(m, s, t, j));
    forge_session_free(s);
    return out;
}

}  // namespace

/* 8 threads x 20 calls at once on one model, each equal to the same thread's calls run alone. */
TEST(Threads, ParallelSessionsEqualSerialRuns) {
    forge_model *m = ft::load(model_path());
    ASSERT_NE(m, nullptr);
    const int n_threads = 8, n_jobs = 20;
    std::vector<std::vector<Outcome>> alone(n_threads), together(n_threads);
    for (int t = 0; t < n_threads; t++) alone[t] = run_thread(m, t, n_jobs);
    std::vector<std::thread> threads;
    for (int t = 0; t < n_threads; t++) threads.emplace_back([&, t] { together[t] = run_thread(m, t, n_jobs); });
    for (auto &th : threads) th.join();
    int stopped_by_callback = 0, classified = 0;
    for (int t = 0; t < n_threads; t++) {
        ASSERT_EQ(alone[t].size(), (size_t)n_jobs);
        ASSERT_EQ(together[t].size(), (size_t)n_jobs);
        for (int j = 0; j < n_jobs; j++) {
            const Outcome &a = alone[t][j];
            EXPECT_EQ(a.status, FORGE_OK) << "thread " << t << " job " << j;
            EXPECT_FALSE(a.tokens.empty()) << "thread " << t << " job " << j;
            EXPECT_TRUE(a == together[t][j]) << "thread " << t << " job " << j << " differs when run beside the others";
            stopped_by_callback += a.stop == FORGE_STOP_CALLBACK;
            classified += !a.logits.empty();
        }
    }
    EXPECT_GT(stopped_by_callback, 10);
    EXPECT_GT(classified, 10);
    forge_model_free(m);
}

/* parallel_slots = 2: never more than two calls inside the model at once, and the waiting calls
 * still give their results. */
TEST(Threads, ParallelSlotsCapConcurrentCalls) {
    forge_model_params mp = forge_model_default_params();
    mp.parallel_slots = 2;
    forge_model *m = nullptr;
    ASSERT_EQ(forge_model_load(model_path().c_str(), &mp, &m), FORGE_OK) << (m ? forge_model_errmsg(m) : "");
    static std::atomic<int> inside{0}, most{0};
    inside = 0;
    most = 0;
    /* A call counts as inside from its first token to its last (12, EOS ignored): both
     * callbacks run while the call holds its slot. */
    struct Probe {
        int seen = 0;
        static int on_token(void *ud, int32_t token, const char *, size_t) {
            Probe *p = (Probe *)ud;
            if (token < 0) return 0;
            if (++p->seen == 1) {
                int now = ++inside, was = most.load();
                while (now > was && !most.compare_exchange_weak(was, now)) {
                }
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(3));
            if (p->seen == 12) --inside;
            return 0;
        }
    };
    std::vector<std::thread> threads;
    std::atomic<int> ok{0};
    for (int t = 0; t < 6; t++)
        threads.emplace_back([&, t] {
            forge_session *s = ft::session(m, 256);
            if (!s) return;
            Probe probe;
            forge_generate_params gp = forge_generate_default_params();
            gp.max_tokens = 12;
            gp.ignore_eos = 1;
            gp.on_token = Probe::on_token;
            gp.user_data = &probe;
            if (forge_generate(s, kPrompts[t % kNumPrompts], strlen(kPrompts[t % kNumPrompts]), &gp, nullptr) == FORGE_OK && probe.seen == 12) ok++;
            forge_session_free(s);
        });
    for (auto &th : threads) th.join();
    EXPECT_EQ(ok.load(), 6);
    EXPECT_EQ(most.load(), 2) << "two calls at once, never more";
    forge_model_free(m);

    mp.parallel_slots = -1;
    ASSERT_EQ(forge_model_load(model_path().c_str(), &mp, &m), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_model_errmsg(m)).find("parallel_slots"), std::string::npos) << forge_model_errmsg(m);
    forge_model_free(m);
}

/* parallel_fail: a call beyond the cap fails at once, naming the cap; the next one succeeds. */
TEST(Threads, ParallelFailRefusesTheCallBeyondTheCap) {
    forge_model_params mp = forge_model_default_params();
    mp.parallel_slots = 1;
    mp.parallel_fail = 1;
    forge_model *m = nullptr;
    ASSERT_EQ(forge_model_load(model_path().c_str(), &mp, &m), FORGE_OK);
    forge_session *a = ft::session(m, 256), *b = ft::session(m, 256);
    ASSERT_TRUE(a && b);
    static std::atomic<int> phase{0};
    phase = 0;
    struct Hold {
        static int on_token(void *, int32_t token, const char *, size_t) {
            if (token < 0) return 0;
            phase = 1;                     /* inside: the slot is held */
            while (phase.load() != 2) std::this_thread::yield();
            return 1;                      /* stop after the first token */
        }
    };
    std::thread holder([&] {
        forge_generate_params gp = forge_generate_default_params();
        gp.on_token = Hold::on_token;
        EXPECT_EQ(forge_generate(a, "Once", 4, &gp, nullptr), FORGE_OK) << forge_session_errmsg(a);
    });
    while (phase.load() != 1) std::this_thread::yield();
    int32_t tok = 1;
    EXPECT_EQ(forge_eval(b, &tok, 1, 0, nullptr, 0), FORGE_ERR_LIMIT);
    EXPECT_NE(std::string(forge_session_errmsg(b)).find("parallel slots"), std::string::npos) << forge_session_errmsg(b);
    EXPECT_EQ(forge_session_n_past(b), 0);
    phase = 2;
    holder.join();
    EXPECT_EQ(forge_eval(b, &tok, 1, 0, nullptr, 0), FORGE_OK) << forge_session_errmsg(b);
    forge_session_free(a);
    forge_session_free(b);
    forge_model_free(m);
}

/* A cancel flag set mid-prefill stops between chunks and keeps what was evaluated; one set
 * mid-decode stops before the next step; either way the session then gives exactly what a
 * fresh session gives. */
TEST(Threads, CancelMidPrefillAndMidDecodeLeavesTheSessionUsable) {
    forge_model *m = ft::load(model_path());
    ASSERT_NE(m, nullptr);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 100; i++) prompt.push_back(1 + (i * 37) % 500);
    auto greedy = [&](forge_session *s, std::vector<int32_t> *out, forge_metrics *mt, const int *cancel, int cancel_at_token,
                      int *flag) {
        struct State {
            std::vector<int32_t> *out;
            int at;
            int *flag;
        } st = {out, cancel_at_token, flag};
        forge_generate_params gp = forge_generate_default_params();
        gp.max_tokens = 16;
        gp.cancel = cancel;
        gp.user_data = &st;
        gp.on_token = [](void *ud, int32_t token, const char *, size_t) {
            State *x = (State *)ud;
            if (token >= 0) x->out->push_back(token);
            if (x->flag && (int)x->out->size() == x->at) __atomic_store_n(x->flag, 1, __ATOMIC_RELAXED);
            return 0;
        };
        return forge_generate_tokens(s, prompt.data(), (int)prompt.size(), &gp, mt);
    };
    forge_session *ref = ft::session(m, 256, 32);
    std::vector<int32_t> expected;
    forge_metrics mt = ft::sized<forge_metrics>();
    ASSERT_EQ(greedy(ref, &expected, &mt, nullptr, 0, nullptr), FORGE_OK);
    ASSERT_EQ(expected.size(), 16u);

    /* mid-prefill: the flag is already set, so the first 32-token chunk does not run */
    forge_session *s = ft::session(m, 256, 32);
    int flag = 1;
    std::vector<int32_t> got;
    ASSERT_EQ(greedy(s, &got, &mt, &flag, 0, nullptr), FORGE_OK) << forge_session_errmsg(s);
    EXPECT_EQ(mt.stop_reason, FORGE_STOP_CANCELLED);
    EXPECT_TRUE(got.empty());
    EXPECT_EQ(forge_session_n_past(s), 0);
    /* mid-prefill from another thread, while the chunks run */
    flag = 0;
    std::thread canceller([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        __atomic_store_n(&flag, 1, __ATOMIC_RELAXED);
    });
    forge_status st = greedy(s, &got, &mt, &flag, 0, nullptr);
    canceller.join();
    ASSERT_EQ(st, FORGE_OK);
    if (got.empty()) { /* stopped in the prefill: whole chunks evaluated */
        EXPECT_EQ(mt.stop_reason, FORGE_STOP_CANCELLED);
        EXPECT_EQ(forge_session_n_past(s) % 32, 0);
        EXPECT_LT(forge_session_n_past(s), 100);
    } else { /* in the decode, or not at all: the last token drawn is not evaluated yet */
        EXPECT_EQ(forge_session_n_past(s), 100 + (int)got.size() - 1);
        EXPECT_TRUE(std::equal(got.begin(), got.end(), expected.begin()));
    }
    /* mid-decode: the callback sets the flag after the 5th token */
    flag = 0;
    got.clear();
    ASSERT_EQ(greedy(s, &got, &mt, &flag, 5, &flag), FORGE_OK);
    EXPECT_EQ(mt.stop_reason, FORGE_STOP_CANCELLED);
    ASSERT_EQ(got.size(), 5u);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), expected.begin()));
    /* usable: the same prompt again (the cache reused) gives the uncancelled tokens */
    got.clear();
    ASSERT_EQ(greedy(s, &got, &mt, nullptr, 0, nullptr), FORGE_OK) << forge_session_errmsg(s);
    EXPECT_EQ(got, expected);
    EXPECT_GT(mt.cached_tokens, 0);

    /* classify: a set flag is FORGE_ERR_CANCELLED, then the session classifies as before */
    forge_classify_prompt cp = {sizeof(forge_classify_prompt), "Once upon a time", 16, nullptr, 0};
    forge_classify_result r = ft::sized<forge_classify_result>();
    forge_classify_params params = forge_classify_default_params();
    params.cancel = &flag;
    flag = 1;
    EXPECT_EQ(forge_classify(s, &cp, 1, &params, &r), FORGE_ERR_CANCELLED);
    EXPECT_NE(std::string(forge_session_errmsg(s)).find("cancelled"), std::string::npos);
    flag = 0;
    ASSERT_EQ(forge_classify(s, &cp, 1, &params, &r), FORGE_OK);
    forge_classify_result r_ref = ft::sized<forge_classify_result>();
    ASSERT_EQ(forge_classify(ref, &cp, 1, nullptr, &r_ref), FORGE_OK);
    EXPECT_EQ(r.token, r_ref.token);
    forge_session_free(s);
    forge_session_free(ref);
    forge_model_free(m);
}
