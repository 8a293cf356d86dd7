/* Batch generation: several prompts decoded in lockstep on one session, each with its own
 * params, stop rules, callback and metrics. Every item's output (tokens, streamed text, stop
 * reason) must equal its own forge_generate run on an empty session: greedy and seeded, with
 * prompts of different lengths, different max_tokens, a stop string, a callback that stops,
 * more items than places, on stories260K and on the parity fixtures (Gemma 3's sliding-window
 * layers running past their window). */
#include <cjson/cJSON.h>

#include "parity.h"
#include "util.h"

namespace {

struct Out {
    std::vector<int32_t> tokens;
    std::string text;
    int stop_after = -1; /* the callback stops after this many tokens */
    int calls = 0;
    static int cb(void *u, int32_t tok, const char *text, size_t len) {
        Out *o = (Out *)u;
        o->calls++;
        if (tok >= 0) o->tokens.push_back(tok);
        o->text.append(text, len);
        return o->stop_after >= 0 && (int)o->tokens.size() >= o->stop_after;
    }
};

/* One item: its prompt (text, or tokens when text is empty) and params (callback filled in). */
struct Item {
    std::string text;
    std::vector<int32_t> tokens;
    forge_generate_params p = forge_generate_default_params();
    int stop_after = -1;
};

struct Gen {
    Out out;
    forge_metrics mt = ft::sized<forge_metrics>();
    forge_status st = FORGE_OK;
};

/* Each item alone: forge_generate on an empty session (its KV cache of kv_type). */
std::vector<Gen> run_single(forge_model *m, std::vector<Item> items, int n_ctx, int kv_type = FORGE_KV_DEFAULT) {
    std::vector<Gen> runs(items.size());
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = n_ctx;
    sp.kv_type = kv_type;
    forge_session *s = ft::session(m, sp);
    if (!s) return runs;
    for (size_t i = 0; i < items.size(); i++) {
        Item &it = items[i];
        runs[i].out.stop_after = it.stop_after;
        it.p.on_token = Out::cb;
        it.p.user_data = &runs[i].out;
        EXPECT_EQ(forge_session_truncate(s, 0), FORGE_OK);
        runs[i].st = it.text.empty() ? forge_generate_tokens(s, it.tokens.data(), (int)it.tokens.size(), &it.p, &runs[i].mt)
                                     : forge_generate(s, it.text.data(), it.text.size(), &it.p, &runs[i].mt);
    }
    forge_session_free(s);
    return runs;
}

/* All items in one forge_batch_generate on a session of n_seq places. */
std::vector<Gen> run_batch(forge_model *m, std::vector<Item> items, int n_ctx, int n_seq, int kv_type = FORGE_KV_DEFAULT) {
    std::vector<Gen> runs(items.size());
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = n_ctx;
    sp.n_seq_max = n_seq;
    sp.kv_type = kv_type;
    forge_session *s = nullptr;
    EXPECT_EQ(forge_session_create(m, &sp, &s), FORGE_OK) << forge_model_errmsg(m);
    if (!s) return runs;
    std::vector<forge_batch_item> bi(items.size(), ft::sized<forge_batch_item>());
    for (size_t i = 0; i < items.size(); i++) {
        Item &it = items[i];
        runs[i].out.stop_after = it.stop_after;
        it.p.on_token = Out::cb;
        it.p.user_data = &runs[i].out;
        bi[i] = {sizeof(forge_batch_item), it.text.empty() ? nullptr : it.text.data(), it.text.size(), it.tokens.data(), (int)it.tokens.size(), &it.p};
    }
    std::vector<forge_batch_result> res(items.size(), ft::sized<forge_batch_result>());
    EXPECT_EQ(forge_batch_generate(s, bi.data(), (int)bi.size(), res.data()), FORGE_OK) << forge_session_errmsg(s);
    for (size_t i = 0; i < items.size(); i++) {
        runs[i].st = res[i].status;
        runs[i].mt = res[i].metrics;
    }
    EXPECT_EQ(forge_session_n_past(s), 0);
    forge_session_free(s);
    return runs;
}

void expect_same(const std::vector<Gen> &one, const std::vector<Gen> &batch, const std::string &what) {
    ASSERT_EQ(one.size(), batch.size());
    for (size_t i = 0; i < one.size(); i++) {
        EXPECT_EQ(batch[i].st, one[i].st) << what << " item " << i;
        EXPECT_EQ(batch[i].out.tokens, one[i].out.tokens) << what << " item " << i;
        EXPECT_EQ(batch[i].out.text, one[i].out.text) << what << " item " << i;
        EXPECT_EQ(batch[i].out.calls, one[i].out.calls) << what << " item " << i;
        EXPECT_EQ(batch[i].mt.stop_reason, one[i].mt.stop_reason) << what << " item " << i;
        EXPECT_EQ(batch[i].mt.generated_tokens, one[i].mt.generated_tokens) << what << " item " << i;
        EXPECT_EQ(batch[i].mt.prompt_tokens, one[i].mt.prompt_tokens) << what << " item " << i;
    }
}

struct Stories {
    forge_model *m = nullptr;
    Stories() { m = ft::load(ft::src("models/stories260K/stories260K.gguf")); }
    ~Stories() { forge_model_free(m); }
};

/* Six text prompts of different lengths and limits: one ends on a stop string, one by its
 * callback, one at its end token or limit. */
std::vector<Item> story_items() {
    const char *prompts[] = {"Once upon a time, there was a little girl named Lily.", "The cat",
                             "One day, Tom went to the park with his mom. He saw a big red ball and",
                             "Lily and Ben were friends.", "Once", "The sun was hot and the children wanted to play in the water."};
    int max_tokens[] = {40, 25, 60, 12, 50, 30};
    std::vector<Item> items(6);
    for (int i = 0; i < 6; i++) {
        items[i].text = prompts[i];
        items[i].p.max_tokens = max_tokens[i];
    }
    static const char *stop[] = {"."};
    items[1].p.stop_strings = stop;
    items[1].p.n_stop_strings = 1;
    items[3].stop_after = 5;
    return items;
}

} // namespace

TEST(Batch, StoriesGreedyEqualsEachPromptAlone) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    std::vector<Item> items = story_items();
    std::vector<Gen> one = run_single(st.m, items, 256);
    EXPECT_EQ(one[1].mt.stop_reason, FORGE_STOP_STRING);
    EXPECT_EQ(one[3].mt.stop_reason, FORGE_STOP_CALLBACK);
    EXPECT_EQ(one[3].out.tokens.size(), 5u);
    for (int n_seq : {4, 6, 1}) /* fewer places than items, as many, one */
        expect_same(one, run_batch(st.m, items, 256, n_seq), "n_seq_max " + std::to_string(n_seq));
}

/* On an f16 KV cache (the _kv16 kernels with the row table) as on an f32 one. */
TEST(Batch, StoriesOnAnF16CacheEqualsEachPromptAlone) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    std::vector<Item> items = story_items();
    expect_same(run_single(st.m, items, 256, FORGE_KV_F16), run_batch(st.m, items, 256, 4, FORGE_KV_F16), "f16 cache, n_seq_max 4");
}

/* More rows than the one-row products take (FORGE__MATVEC_MAX_M): the step runs on the matmul. */
TEST(Batch, StoriesManyRowsEqualEachPromptAlone) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    std::vector<Item> items;
    for (int k = 0; k < 3; k++)
        for (Item it : story_items()) {
            it.p.max_tokens += 7 * k;
            items.push_back(it);
        }
    expect_same(run_single(st.m, items, 256), run_batch(st.m, items, 256, 16), "16 rows");
}

TEST(Batch, SeededSamplingEqualsEachPromptAlone) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    std::vector<Item> items = story_items();
    for (size_t i = 0; i < items.size(); i++) {
        forge_generate_params &p = items[i].p;
        p.temperature = 0.6f + 0.1f * (float)i;
        p.seed = 1000 + i;
        p.top_k = i % 2 ? 0 : 40;
        p.top_p = i % 3 ? 1.0f : 0.9f;
        p.min_p = i == 4 ? 0.05f : 0.0f;
        p.repeat_penalty = i == 2 ? 1.3f : 1.0f;
    }
    std::vector<Gen> one = run_single(st.m, items, 256);
    expect_same(one, run_batch(st.m, items, 256, 3), "seeded");
    Item same = items[0]; /* the same params twice in one batch: the same output */
    std::vector<Gen> twice = run_batch(st.m, {same, same}, 256, 2);
    EXPECT_EQ(twice[0].out.tokens, one[0].out.tokens);
    EXPECT_EQ(twice[1].out.tokens, one[0].out.tokens);
}

TEST(Batch, ItemErrorsAreTheItemsAlone) {
    Stories st;
    ASSERT_NE(st.m, nullptr);
    std::vector<Item> items(4);
    items[0].text = "Once upon a time";
    items[0].p.max_tokens = 10;
    items[1].tokens.assign(100, 1); /* over n_ctx 64 */
    items[2].tokens = {1, 100000};  /* outside the vocabulary */
    items[3].text = "The dog";
    items[3].p.max_tokens = 10;
    items[3].p.top_p = 0; /* out of range */
    std::vector<Gen> b = run_batch(st.m, items, 64, 2);
    EXPECT_EQ(b[0].st, FORGE_OK);
    EXPECT_EQ(b[0].mt.generated_tokens, 10);
    EXPECT_EQ(b[1].st, FORGE_ERR_LIMIT);
    EXPECT_EQ(b[2].st, FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(b[3].st, FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(b[1].out.tokens.empty() && b[2].out.tokens.empty() && b[3].out.tokens.empty());
    /* the places are planned: too many is an error when the session is made */
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = 64;
    sp.n_seq_max = 100; /* over n_batch = n_ctx */
    forge_session *s = nullptr;
    EXPECT_EQ(forge_session_create(st.m, &sp, &s), FORGE_ERR_LIMIT);
    EXPECT_NE(std::string(forge_model_errmsg(st.m)).find("n_seq_max"), std::string::npos) << forge_model_errmsg(st.m);
    /* the KV cache grows with the places */
    forge_memory_stats one_place = ft::sized<forge_memory_stats>(), four = ft::sized<forge_memory_stats>();
    sp.n_seq_max = 1;
    ASSERT_EQ(forge_session_plan(st.m, &sp, &one_place), FORGE_OK);
    sp.n_seq_max = 4;
    ASSERT_EQ(forge_session_plan(st.m, &sp, &four), FORGE_OK);
    EXPECT_EQ(four.kv_cache_bytes, 4 * one_place.kv_cache_bytes);
}

class BatchParity : public ::testing::TestWithParam<std::string> {};

/* Token prompts (prefixes of the fixture's sequences) on tiny checkpoints of five families,
 * generating past Gemma 3's and Mistral's windows of 8 (their sliding layers' caches rotate),
 * Qwen 3.5's recurrent states one per place (what a finished item leaves must not reach the
 * next one in its place): greedy and seeded, five items through three places. */
TEST_P(BatchParity, EqualsEachPromptAlone) {
    std::string dir = ft::src("tests/fixtures/parity/" + GetParam());
    ft::Fixture fx = ft::read_fixture(dir);
    ASSERT_FALSE(fx.seqs.empty());
    forge_model *m = ft::load(dir);
    ASSERT_NE(m, nullptr);
    std::vector<Item> items(5);
    for (int i = 0; i < 5; i++) {
        const std::vector<int32_t> &q = fx.seqs[i % fx.seqs.size()].tokens;
        int len = std::max(1, std::min((int)q.size(), 2 + 3 * i));
        items[i].tokens.assign(q.begin(), q.begin() + len);
        items[i].p.max_tokens = 12 + 4 * i;
        items[i].p.ignore_eos = 1;
    }
    items[2].stop_after = 9;
    expect_same(run_single(m, items, 64), run_batch(m, items, 64, 3), GetParam() + " greedy");
    for (int i = 0; i < 5; i++) {
        items[i].p.temperature = 0.9f;
        items[i].p.seed = 7 + i;
    }
    expect_same(run_single(m, items, 64), run_batch(m, items, 64, 3), GetParam() + " seeded");
    forge_model_free(m);
}

INSTANTIATE_TEST_SUITE_P(HF, BatchParity,
                         ::testing::Values("llama3_f32_untied", "qwen3_f32_sharded", "gemma3_text_pattern_f32", "mistral_window_f32",
                                           "qwen3_5_text_f32", "qwen3_5_moe_f32"),
                         [](const ::testing::TestParamInfo<std::string> &i) { return i.param; });

/* `forge run --batch-file`: each line's text (JSON) is what forge_generate gives it alone. */
TEST(Batch, Cli) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    std::string d = ft::tmpdir("batch_cli"), model = ft::src("models/stories260K/stories260K.gguf");
    const char *lines = "Once upon a time\nThe cat sat\n\nLily had a red ball. She\n";
    ft::write_file(d + "/prompts.txt", lines, strlen(lines));
    std::string cmd = "./forge run " + model + " --batch-file " + d + "/prompts.txt -n 15 --parallel 2 --json > " + d + "/out.json";
    ASSERT_EQ(system(cmd.c_str()), 0) << cmd;
    std::vector<uint8_t> out = ft::read_file(d + "/out.json");
    cJSON *o = cJSON_ParseWithLength((const char *)out.data(), out.size());
    cJSON *arr = cJSON_GetObjectItem(o, "items");
    ASSERT_TRUE(cJSON_IsArray(arr)) << std::string(out.begin(), out.end());
    ASSERT_EQ(cJSON_GetArraySize(arr), 3); /* the empty line is no prompt */
    Stories st;
    ASSERT_NE(st.m, nullptr);
    std::vector<Item> items(3);
    const char *prompts[] = {"Once upon a time", "The cat sat", "Lily had a red ball. She"};
    for (int i = 0; i < 3; i++) {
        items[i].text = prompts[i];
        items[i].p.max_tokens = 15;
    }
    std::vector<Gen> one = run_single(st.m, items, 0);
    for (int i = 0; i < 3; i++) {
        cJSON *it = cJSON_GetArrayItem(arr, i);
        EXPECT_EQ(std::string(cJSON_GetStringValue(cJSON_GetObjectItem(it, "prompt"))), prompts[i]);
        EXPECT_EQ(std::string(cJSON_GetStringValue(cJSON_GetObjectItem(it, "text"))), one[i].out.text) << i;
        EXPECT_EQ(cJSON_GetObjectItem(it, "generated_tokens")->valueint, one[i].mt.generated_tokens) << i;
        EXPECT_EQ(std::string(cJSON_GetStringValue(cJSON_GetObjectItem(it, "stop_reason"))), "max_tokens") << i;
        std::vector<int32_t> ids; /* "ids": the tokens forge_generate streamed alone */
        const cJSON *id;
        cJSON_ArrayForEach(id, cJSON_GetObjectItem(it, "ids")) ids.push_back(id->valueint);
        EXPECT_EQ(ids, one[i].out.tokens) << i;
    }
    cJSON_Delete(o);
}
