/* Classify: many prompts of mixed lengths in padded batches, one forward pass per batch.
 * Every prompt's logits must equal HF's at its last position (the parity fixtures hold HF's
 * logits at every position of two sequences, so a prefix of length L is checked against row
 * L - 1), whatever the batching; sampling is seeded per prompt; the text continues the
 * prompt; bad input is an error naming the prompt. */
#include <cjson/cJSON.h>

#include "parity.h"
#include "util.h"
#include "writers.h"

namespace {

struct Ref {
    int n_vocab = 0;
    std::vector<std::vector<int32_t>> seqs;
    std::vector<std::vector<float>> logits; /* [len, vocab] per sequence */
};

/* A parity fixture's sequences and the logits to compare with (bf16 checkpoints: the f64
 * forward of the same weights). */
Ref read_parity(const std::string &dir) {
    ft::Fixture fx = ft::read_fixture(dir);
    Ref r;
    r.n_vocab = fx.n_vocab;
    for (const ft::Sequence &q : fx.seqs) {
        r.seqs.push_back(q.tokens);
        r.logits.push_back(fx.bf16 ? q.logits_f64 : q.logits);
    }
    return r;
}

/* Prefixes of the reference sequences, of mixed lengths (the longest first, so padding
 * matters for every other prompt): (sequence, length). */
std::vector<std::pair<int, int>> mixed_prefixes(const Ref &r) {
    int a = (int)r.seqs[0].size(), b = (int)r.seqs.back().size(), last = (int)r.seqs.size() - 1;
    return {{last, b}, {0, a}, {last, std::min(5, b)}, {0, 1}, {last, std::max(1, b / 2 + 1)}, {0, std::max(1, a - 3)},
            {last, std::min(8, b)}, {0, std::min(9, a)}, {last, std::min(3, b)}};
}

/* Runs classify on the prefixes with the session's batching; checks each prompt's logits
 * against the reference row and the token against its argmax; returns the logits. */
std::vector<float> classify_prefixes(forge_session *s, const Ref &r, const std::vector<std::pair<int, int>> &pre, const std::string &what) {
    const int V = r.n_vocab, n = (int)pre.size();
    std::vector<forge_classify_prompt> prompts(n, ft::sized<forge_classify_prompt>());
    for (int i = 0; i < n; i++) prompts[i] = {sizeof(forge_classify_prompt), nullptr, 0, r.seqs[pre[i].first].data(), pre[i].second};
    std::vector<float> lg((size_t)n * V);
    forge_classify_params cp = forge_classify_default_params();
    cp.logits = lg.data();
    cp.logits_capacity = lg.size();
    std::vector<forge_classify_result> res(n, ft::sized<forge_classify_result>());
    EXPECT_EQ(forge_classify(s, prompts.data(), n, &cp, res.data()), FORGE_OK) << forge_session_errmsg(s);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        const float *ref = r.logits[pre[i].first].data() + (size_t)(pre[i].second - 1) * V;
        double e = ft::rel_err(lg.data() + (size_t)i * V, ref, V);
        worst = std::max(worst, e);
        EXPECT_LE(e, 1e-4) << what << ": prompt " << i << " (sequence " << pre[i].first << ", " << pre[i].second << " tokens)";
        EXPECT_EQ(res[i].token, ft::argmax(lg.data() + (size_t)i * V, V)) << what << " prompt " << i;
        EXPECT_EQ(res[i].token, ft::argmax(ref, V)) << what << " prompt " << i;
        EXPECT_EQ(res[i].n_tokens, pre[i].second);
    }
    printf("  %-44s %d prompts, max|d|/max|ref| = %.2e\n", what.c_str(), n, worst);
    return lg;
}

class ClassifyParity : public ::testing::TestWithParam<std::string> {};

/* One batch (the default n_batch), then the same prompts split into many batches (n_batch =
 * the longest prompt, at most two prompts a batch), then four sequence places (a model with
 * linear-attention layers batches at most that many prompts, each in its own recurrent state,
 * padding kept out of it): all equal HF, and each other. */
TEST_P(ClassifyParity, LastPositionLogitsOfMixedLengths) {
    std::string dir = ft::src("tests/fixtures/parity/" + GetParam());
    Ref r = read_parity(dir);
    ASSERT_FALSE(r.seqs.empty());
    forge_model *m = ft::load(dir);
    ASSERT_NE(m, nullptr);
    std::vector<std::pair<int, int>> pre = mixed_prefixes(r);
    const int n_ctx = std::max(64, (int)r.seqs.back().size());
    forge_session *s = ft::session(m, n_ctx);
    ASSERT_NE(s, nullptr);
    std::vector<float> one = classify_prefixes(s, r, pre, GetParam() + " one batch");
    forge_session_free(s);
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = n_ctx;
    sp.n_batch = (int)r.seqs.back().size();
    sp.n_outputs_max = 2;
    ASSERT_EQ(forge_session_create(m, &sp, &s), FORGE_OK) << forge_model_errmsg(m);
    std::vector<float> many = classify_prefixes(s, r, pre, GetParam() + " batches of <= 2");
    EXPECT_LE(ft::rel_err(one.data(), many.data(), one.size()), 1e-5);
    forge_session_free(s);
    sp = forge_session_default_params();
    sp.n_ctx = n_ctx;
    sp.n_seq_max = 4;
    ASSERT_EQ(forge_session_create(m, &sp, &s), FORGE_OK) << forge_model_errmsg(m);
    std::vector<float> places = classify_prefixes(s, r, pre, GetParam() + " 4 places");
    EXPECT_LE(ft::rel_err(one.data(), places.data(), one.size()), 1e-5);
    forge_session_free(s);
    forge_model_free(m);
}

INSTANTIATE_TEST_SUITE_P(HF, ClassifyParity,
                         ::testing::Values("llama3_f32_untied", "llama3_bf16_tied", "qwen2_f32_tied", "qwen3_f32_sharded", "gemma2_f32",
                                           "gemma3_text_f32", "gemma3_text_pattern_f32", "mistral_window_f32", "qwen3_5_text_f32",
                                           "qwen3_5_moe_f32"),
                         [](const ::testing::TestParamInfo<std::string> &i) { return i.param; });

/* With a LoRA adapter (PEFT's, trained three steps): the logits PEFT's model gives. */
TEST(Classify, AdaptedModelMatchesPeft) {
    for (const char *name : {"llama3", "gemma2"}) {
        std::string dir = ft::src(std::string("tests/fixtures/lora/") + name);
        std::vector<uint8_t> js = ft::read_file(dir + "/reference.json");
        cJSON *root = cJSON_ParseWithLength((const char *)js.data(), js.size());
        ASSERT_NE(root, nullptr);
        Ref r;
        r.n_vocab = cJSON_GetObjectItem(root, "n_vocab")->valueint;
        std::vector<int32_t> toks;
        cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "logits_tokens")) toks.push_back(t->valueint);
        std::string base = ft::src(std::string("tests/fixtures/") + cJSON_GetStringValue(cJSON_GetObjectItem(root, "base")));
        cJSON_Delete(root);
        r.seqs = {toks};
        r.logits = {ft::read_f32(dir + "/logits_final.f32")};
        ASSERT_EQ(r.logits[0].size(), toks.size() * (size_t)r.n_vocab);
        forge_model_params mp = forge_model_default_params();
        mp.exact = 1;
        std::string adapter = dir + "/adapter_final";
        mp.adapter_path = adapter.c_str();
        forge_model *m = nullptr;
        ASSERT_EQ(forge_model_load(base.c_str(), &mp, &m), FORGE_OK) << forge_model_errmsg(m);
        forge_session *s = ft::session(m, 64);
        ASSERT_NE(s, nullptr);
        int n = (int)toks.size();
        classify_prefixes(s, r, {{0, n}, {0, 1}, {0, n / 2}, {0, n - 1}, {0, 3}}, std::string(name) + " + PEFT adapter");
        forge_session_free(s);
        forge_model_free(m);
    }
}

struct Stories {
    forge_model *m = nullptr;
    Stories() { m = ft::load(ft::src("models/stories260K/stories260K.gguf")); }
    ~Stories() { forge_model_free(m); }
};

struct Collect {
    std::vector<int32_t> tokens;
    std::string text;
    static int cb(void *u, int32_t tok, const char *text, size_t len) {
        Collect *c = (Collect *)u;
        if (tok >= 0) c->tokens.push_back(tok);
        c->text.append(text, len);
        return 0;
    }
};

/* Text prompts: the token is generation's first greedy token and the text is what generation
 * prints for it, the space between the prompt and the word included. */
TEST(Classify, TextPromptsContinueAsGenerationDoes) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    const char *texts[] = {"Once upon a time, there was a little girl named", "Once upon a time", "Lily wanted to", "The sun",
                           "Tom and his mom went to the"};
    const int n = 5;
    std::vector<forge_classify_prompt> prompts(n, ft::sized<forge_classify_prompt>());
    for (int i = 0; i < n; i++) prompts[i] = {sizeof(forge_classify_prompt), texts[i], strlen(texts[i]), nullptr, 0};
    forge_session *s = ft::session(st.m, 128);
    ASSERT_NE(s, nullptr);
    std::vector<forge_classify_result> res(n, ft::sized<forge_classify_result>());
    ASSERT_EQ(forge_classify(s, prompts.data(), n, nullptr, res.data()), FORGE_OK) << forge_session_errmsg(s);
    std::vector<std::string> got_text;
    for (int i = 0; i < n; i++) {
        ASSERT_NE(res[i].text, nullptr);
        EXPECT_EQ(strlen(res[i].text), res[i].text_len);
        got_text.push_back(std::string(res[i].text, res[i].text_len));
    }
    EXPECT_EQ(got_text[0], " Lily");
    forge_session *g = ft::session(st.m, 128);
    ASSERT_NE(g, nullptr);
    for (int i = 0; i < n; i++) {
        Collect c;
        forge_generate_params gp = forge_generate_default_params();
        gp.max_tokens = 1;
        gp.on_token = Collect::cb;
        gp.user_data = &c;
        ASSERT_EQ(forge_generate(g, texts[i], strlen(texts[i]), &gp, nullptr), FORGE_OK) << forge_session_errmsg(g);
        ASSERT_EQ(c.tokens.size(), 1u) << texts[i];
        EXPECT_EQ(res[i].token, c.tokens[0]) << texts[i];
        EXPECT_EQ(got_text[i], c.text) << texts[i];
        size_t cnt = 0;
        forge_tokenize(st.m, texts[i], strlen(texts[i]), FORGE_TOKENIZE_ADD_SPECIAL, nullptr, 0, &cnt);
        EXPECT_EQ(res[i].n_tokens, (int)cnt) << texts[i];
    }
    /* the session still generates as a fresh one does: classify leaves nothing in its cache */
    Collect a, b;
    forge_generate_params gp = forge_generate_default_params();
    gp.max_tokens = 12;
    gp.on_token = Collect::cb;
    gp.user_data = &a;
    ASSERT_EQ(forge_generate(s, texts[1], strlen(texts[1]), &gp, nullptr), FORGE_OK);
    gp.user_data = &b;
    forge_session *fresh = ft::session(st.m, 128);
    ASSERT_EQ(forge_generate(fresh, texts[1], strlen(texts[1]), &gp, nullptr), FORGE_OK);
    EXPECT_EQ(a.text, b.text);
    forge_session_free(fresh);
    forge_session_free(g);
    forge_session_free(s);
}

/* Temperature > 0: prompt i draws from a generator seeded by (seed, i), so the draws do not
 * depend on the batching; another seed draws differently; top_k 1 is the argmax. */
TEST(Classify, SamplingIsSeededPerPrompt) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    const int n = 48;
    std::vector<int32_t> toks = {1, 403, 407, 261, 428, 349, 389, 261, 409, 2, 9, 337};
    std::vector<forge_classify_prompt> prompts(n, ft::sized<forge_classify_prompt>());
    for (int i = 0; i < n; i++) prompts[i] = {sizeof(forge_classify_prompt), nullptr, 0, toks.data(), 1 + i % (int)toks.size()};
    auto run = [&](int n_batch, int n_out, float temp, int top_k, uint64_t seed) {
        forge_session_params sp = forge_session_default_params();
        sp.n_ctx = 64;
        sp.n_batch = n_batch;
        sp.n_outputs_max = n_out;
        forge_session *s = nullptr;
        EXPECT_EQ(forge_session_create(st.m, &sp, &s), FORGE_OK);
        forge_classify_params cp = forge_classify_default_params();
        cp.temperature = temp;
        cp.top_k = top_k;
        cp.seed = seed;
        std::vector<forge_classify_result> res(n, ft::sized<forge_classify_result>());
        EXPECT_EQ(forge_classify(s, prompts.data(), n, &cp, res.data()), FORGE_OK) << forge_session_errmsg(s);
        std::vector<int32_t> out;
        for (auto &r : res) out.push_back(r.token);
        forge_session_free(s);
        return out;
    };
    std::vector<int32_t> a = run(0, 0, 1.0f, 0, 7), b = run(16, 3, 1.0f, 0, 7), c = run(0, 0, 1.0f, 0, 8);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
    EXPECT_EQ(run(0, 0, 1.0f, 1, 7), run(0, 0, 0.0f, 0, 0));
}

TEST(Classify, BadInputIsAnErrorNamingThePrompt) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    forge_session *s = ft::session(st.m, 64, 16);
    ASSERT_NE(s, nullptr);
    std::vector<int32_t> ok = {1, 403, 407}, bad = {1, 99999}, longer(17, 403);
    std::vector<forge_classify_result> res(3, ft::sized<forge_classify_result>());
    auto classify = [&](std::vector<forge_classify_prompt> p, const forge_classify_params *cp = nullptr) {
        return forge_classify(s, p.data(), (int)p.size(), cp, res.data());
    };
    forge_classify_prompt good = {sizeof(forge_classify_prompt), nullptr, 0, ok.data(), 3};
    EXPECT_EQ(classify({good, {sizeof(forge_classify_prompt), nullptr, 0, bad.data(), 2}}), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_session_errmsg(s)).find("prompt 1: token 99999"), std::string::npos) << forge_session_errmsg(s);
    EXPECT_EQ(classify({good, good, {sizeof(forge_classify_prompt), nullptr, 0, ok.data(), 0}}), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_session_errmsg(s)).find("prompt 2 is empty"), std::string::npos) << forge_session_errmsg(s);
    EXPECT_EQ(classify({{sizeof(forge_classify_prompt), nullptr, 0, longer.data(), 17}}), FORGE_ERR_LIMIT);
    EXPECT_NE(std::string(forge_session_errmsg(s)).find("prompt 0 has 17 tokens"), std::string::npos) << forge_session_errmsg(s);
    forge_classify_params cp = forge_classify_default_params();
    std::vector<float> small(forge_model_n_vocab(st.m));
    cp.logits = small.data();
    cp.logits_capacity = small.size();
    EXPECT_EQ(classify({good, good}, &cp), FORGE_ERR_BUFFER_TOO_SMALL);
    cp = forge_classify_default_params();
    cp.top_p = 0;
    EXPECT_EQ(classify({good}, &cp), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(forge_session_errmsg(s)), "classify params: top_p 0 (must be in (0, 1])");
    EXPECT_EQ(forge_classify(s, nullptr, 2, nullptr, res.data()), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(forge_classify(s, &good, -1, nullptr, res.data()), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(forge_classify(nullptr, &good, 1, nullptr, res.data()), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(forge_classify(s, nullptr, 0, nullptr, nullptr), FORGE_OK);
    /* still usable */
    EXPECT_EQ(classify({good}), FORGE_OK);
    forge_session_free(s);
    /* a text prompt to a model without a tokenizer */
    forge_model *m = ft::load(ft::src("tests/fixtures/parity/llama3_f32_untied"));
    ASSERT_NE(m, nullptr);
    s = ft::session(m, 32);
    forge_classify_prompt text = {sizeof(forge_classify_prompt), "hello", 5, nullptr, 0};
    EXPECT_EQ(forge_classify(s, &text, 1, nullptr, res.data()), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_session_errmsg(s)).find("no tokenizer"), std::string::npos) << forge_session_errmsg(s);
    std::vector<int32_t> small_ids = {1, 3, 7};
    forge_classify_prompt ids = {sizeof(forge_classify_prompt), nullptr, 0, small_ids.data(), 3};
    ASSERT_EQ(forge_classify(s, &ids, 1, nullptr, res.data()), FORGE_OK);
    EXPECT_EQ(res[0].text, nullptr);
    forge_session_free(s);
    forge_model_free(m);
}

/* Issue 42: a prompt longer than the model's context (n_ctx_train) or the session's (n_ctx) is
 * refused before any batch runs, naming the prompt, its length and the limit (the CLI made a
 * session as long as its longest prompt, past the model's 2048, and ran a 30k-token prompt
 * for 900 s). */
TEST(Classify, PromptLongerThanTheContextIsRefused) {
    ft::TinyModel tm; /* its context: max_position_embeddings 64 */
    forge_model *m = ft::load(tm.write("classify_ctx"));
    ASSERT_NE(m, nullptr);
    const int train = forge_model_n_ctx_train(m);
    ASSERT_EQ(train, 64);
    forge_session *s = ft::session(m, 2 * train, 2 * train); /* n_ctx and n_batch past the model's context */
    ASSERT_NE(s, nullptr);
    std::vector<int32_t> ok = {1, 3, 7}, longer(train + 1, 5);
    std::vector<forge_classify_result> res(2, ft::sized<forge_classify_result>());
    std::vector<forge_classify_prompt> p = {{sizeof(forge_classify_prompt), nullptr, 0, ok.data(), 3},
                                            {sizeof(forge_classify_prompt), nullptr, 0, longer.data(), train + 1}};
    EXPECT_EQ(forge_classify(s, p.data(), 2, nullptr, res.data()), FORGE_ERR_LIMIT);
    EXPECT_EQ(std::string(forge_session_errmsg(s)), "prompt 1 has 65 tokens, more than the model's context of 64 (n_ctx_train)");
    p[1].n_tokens = train; /* the whole context: it runs */
    ASSERT_EQ(forge_classify(s, p.data(), 2, nullptr, res.data()), FORGE_OK) << forge_session_errmsg(s);
    EXPECT_EQ(res[1].n_tokens, train);
    forge_session_free(s);
    /* a session shorter than the model's context: its n_ctx is the limit */
    s = ft::session(m, 32, 32);
    ASSERT_NE(s, nullptr);
    p[1].n_tokens = 33;
    EXPECT_EQ(forge_classify(s, p.data(), 2, nullptr, res.data()), FORGE_ERR_LIMIT);
    EXPECT_EQ(std::string(forge_session_errmsg(s)), "prompt 1 has 33 tokens, more than the session's context of 32 (n_ctx)");
    forge_session_free(s);
    forge_model_free(m);
}

/* The CLI: a JSON array of strings and id arrays in, {"id", "text", "logits"} per prompt out,
 * equal to the API's; bad stdin is a usage error. */
TEST(Classify, Cli) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    std::string d = ft::tmpdir("classify_cli"), model = ft::src("models/stories260K/stories260K.gguf");
    ft::write_file(d + "/in.json", "[\"Once upon a time\", [1, 403, 407], \"Lily\"]", 43);
    /* --exact: the API side loads exact (ft::load), and on a GPU the default prefill rounds to f16 */
    std::string cmd = "./forge classify " + model + " --exact --stdin-json --logits < " + d + "/in.json > " + d + "/out.json";
    ASSERT_EQ(system(cmd.c_str()), 0) << cmd;
    std::vector<uint8_t> out = ft::read_file(d + "/out.json");
    cJSON *arr = cJSON_ParseWithLength((const char *)out.data(), out.size());
    ASSERT_TRUE(cJSON_IsArray(arr)) << std::string(out.begin(), out.end());
    ASSERT_EQ(cJSON_GetArraySize(arr), 3);
    Stories st;
    ASSERT_NE(st.m, nullptr);
    forge_session *s = ft::session(st.m, 64);
    std::vector<int32_t> ids = {1, 403, 407};
    std::vector<forge_classify_prompt> prompts = {{sizeof(forge_classify_prompt), "Once upon a time", 16, nullptr, 0}, {sizeof(forge_classify_prompt), nullptr, 0, ids.data(), 3}, {sizeof(forge_classify_prompt), "Lily", 4, nullptr, 0}};
    const int V = forge_model_n_vocab(st.m);
    std::vector<float> lg(3 * (size_t)V);
    forge_classify_params cp = forge_classify_default_params();
    cp.logits = lg.data();
    cp.logits_capacity = lg.size();
    std::vector<forge_classify_result> res(3, ft::sized<forge_classify_result>());
    ASSERT_EQ(forge_classify(s, prompts.data(), 3, &cp, res.data()), FORGE_OK);
    for (int i = 0; i < 3; i++) {
        cJSON *o = cJSON_GetArrayItem(arr, i);
        EXPECT_EQ(cJSON_GetObjectItem(o, "id")->valueint, res[i].token);
        EXPECT_EQ(std::string(cJSON_GetStringValue(cJSON_GetObjectItem(o, "text"))), std::string(res[i].text, res[i].text_len));
        cJSON *l = cJSON_GetObjectItem(o, "logits");
        ASSERT_EQ(cJSON_GetArraySize(l), V);
        for (int j = 0; j < V; j += 37) EXPECT_NEAR(cJSON_GetArrayItem(l, j)->valuedouble, lg[(size_t)i * V + j], 1e-6);
    }
    cJSON_Delete(arr);
    forge_session_free(s);
    ft::write_file(d + "/bad.json", "[\"a\", [1, 2.5]]", 15);
    cmd = "./forge classify " + model + " --stdin-json < " + d + "/bad.json > /dev/null 2> " + d + "/err.txt";
    EXPECT_EQ(WEXITSTATUS(system(cmd.c_str())), 2);
    std::vector<uint8_t> err = ft::read_file(d + "/err.txt");
    EXPECT_NE(std::string(err.begin(), err.end()).find("element 1"), std::string::npos);
}

} // namespace
