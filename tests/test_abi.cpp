// test_abi.cpp: structs grow at their end (forge.h). A caller built against an older forge.h
// passes smaller structs: forge writes no byte past their struct_size and lands each array
// element at the caller's stride; a newer caller's larger structs get the fields forge does not
// know zeroed; struct_size 0 is refused before the call does anything. Here the "older" and
// "newer" structs are today's, cut short or padded, inside buffers whose tail is a canary.
#include <algorithm>
#include <cstddef>

#include "util.h"

namespace {

const std::string kStories = ft::src("models/stories260K/stories260K.gguf");
constexpr uint8_t kCanary = 0xA5;

/* n structs of `stride` bytes each, every byte the canary, each struct_size = stride. */
struct Sized {
    std::vector<uint8_t> bytes;
    size_t stride;
    Sized(size_t stride_, int n = 1) : bytes(stride_ * n + 64, kCanary), stride(stride_) {
        for (int i = 0; i < n; i++) {
            uint32_t s = (uint32_t)stride;
            memcpy(at(i), &s, sizeof s);
        }
    }
    uint8_t *at(int i) { return bytes.data() + (size_t)i * stride; }
    template <class T> T *as(int i = 0) { return reinterpret_cast<T *>(at(i)); }
    /* element i copied out whole (zeros past the caller's size): an element of an odd stride
     * is not aligned for T, so it is read through memcpy, as forge writes it */
    template <class T> T get(int i) {
        T v;
        memset(&v, 0, sizeof v);
        memcpy(&v, at(i), std::min(stride, sizeof v));
        return v;
    }
    /* bytes [from, to) of element i all still the canary */
    bool untouched(int i, size_t from, size_t to) {
        for (size_t k = from; k < to; k++)
            if (at(i)[k] != kCanary) return false;
        return true;
    }
};

} // namespace

TEST(Abi, VersionAndStructSizes) {
    EXPECT_EQ(forge_version_number(), FORGE_VERSION_NUMBER);
    EXPECT_EQ(forge_struct_size("forge_metrics"), sizeof(forge_metrics));
    EXPECT_EQ(forge_struct_size("forge_model_info"), sizeof(forge_model_info));
    EXPECT_EQ(forge_struct_size("forge_chat_message"), sizeof(forge_chat_message));
    EXPECT_EQ(forge_struct_size("forge_train_params"), sizeof(forge_train_params));
    EXPECT_EQ(forge_struct_size("forge_detok_stream"), sizeof(forge_detok_stream));
    EXPECT_EQ(forge_struct_size("forge_discovered_model"), sizeof(forge_discovered_model));
    EXPECT_EQ(forge_struct_size("forge_constraint"), sizeof(forge_constraint));
    EXPECT_EQ(forge_struct_size("forge_tool_call"), sizeof(forge_tool_call));
    EXPECT_EQ(forge_struct_size("forge_tool"), sizeof(forge_tool));
    EXPECT_EQ(forge_struct_size("forge_chat_reply"), sizeof(forge_chat_reply));
    EXPECT_EQ(forge_struct_size("forge_nothing"), 0u);
    EXPECT_EQ(forge_struct_size(nullptr), 0u);
}

TEST(Abi, AnOlderMetricsStructIsNotWrittenPast) {
    forge_model *m = ft::load(kStories);
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 128);
    ASSERT_NE(s, nullptr);
    forge_generate_params gp = forge_generate_default_params();
    gp.max_tokens = 8;
    /* an older forge_metrics: everything before context_slides */
    const size_t older = offsetof(forge_metrics, context_slides);
    Sized buf(older);
    ASSERT_EQ(forge_generate(s, "Once", 4, &gp, buf.as<forge_metrics>()), FORGE_OK) << forge_session_errmsg(s);
    EXPECT_EQ(buf.as<forge_metrics>()->struct_size, older);
    EXPECT_EQ(buf.as<forge_metrics>()->generated_tokens, 8);
    EXPECT_EQ(buf.as<forge_metrics>()->stop_reason, FORGE_STOP_MAX_TOKENS);
    EXPECT_TRUE(buf.untouched(0, older, buf.bytes.size())) << "forge wrote past an older forge_metrics";
    /* forge_session_metrics too */
    Sized again(older);
    ASSERT_EQ(forge_session_metrics(s, again.as<forge_metrics>()), FORGE_OK);
    EXPECT_EQ(again.as<forge_metrics>()->generated_tokens, 8);
    EXPECT_TRUE(again.untouched(0, older, again.bytes.size()));
    /* a newer, larger one: the bytes forge has no field for are zeroed, up to its struct_size */
    Sized newer(sizeof(forge_metrics) + 24);
    ASSERT_EQ(forge_session_metrics(s, newer.as<forge_metrics>()), FORGE_OK);
    EXPECT_EQ(newer.as<forge_metrics>()->struct_size, sizeof(forge_metrics) + 24);
    EXPECT_EQ(newer.as<forge_metrics>()->generated_tokens, 8);
    for (size_t k = sizeof(forge_metrics); k < sizeof(forge_metrics) + 24; k++) EXPECT_EQ(newer.at(0)[k], 0) << k;
    EXPECT_TRUE(newer.untouched(0, sizeof(forge_metrics) + 24, newer.bytes.size()));
    forge_session_free(s);
    forge_model_free(m);
}

TEST(Abi, StructSizeZeroIsRefusedBeforeTheCallRuns) {
    forge_model *m = ft::load(kStories);
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 128);
    ASSERT_NE(s, nullptr);
    forge_metrics mt{}; /* struct_size 0: not set */
    forge_generate_params gp = forge_generate_default_params();
    gp.max_tokens = 4;
    EXPECT_EQ(forge_generate(s, "Once", 4, &gp, &mt), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_session_errmsg(s)).find("forge_metrics.struct_size is 0"), std::string::npos) << forge_session_errmsg(s);
    EXPECT_EQ(forge_session_n_past(s), 0); /* nothing ran */
    forge_model_info info{};
    EXPECT_EQ(forge_model_get_info(m, &info), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_model_errmsg(m)).find("forge_model_info.struct_size"), std::string::npos) << forge_model_errmsg(m);
    forge_memory_stats ms{};
    EXPECT_EQ(forge_session_memory(s, &ms), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(forge_model_memory(m, &ms), FORGE_ERR_INVALID_ARGUMENT);
    forge_special_tokens sp{};
    EXPECT_EQ(forge_model_special_tokens(m, &sp), FORGE_ERR_INVALID_ARGUMENT);
    forge_classify_prompt p = {0, "Once", 4, nullptr, 0};
    forge_classify_result r = ft::sized<forge_classify_result>();
    EXPECT_EQ(forge_classify(s, &p, 1, nullptr, &r), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_session_errmsg(s)).find("forge_classify_prompt.struct_size is 0"), std::string::npos);
    forge_session_free(s);
    forge_model_free(m);
}

TEST(Abi, OlderModelInfoMemoryAndSpecialTokens) {
    forge_model *m = ft::load(kStories);
    ASSERT_NE(m, nullptr);
    forge_model_info full = ft::sized<forge_model_info>();
    ASSERT_EQ(forge_model_get_info(m, &full), FORGE_OK);
    const size_t info_older = offsetof(forge_model_info, device_name); /* without the device's name and driver */
    Sized info(info_older);
    ASSERT_EQ(forge_model_get_info(m, info.as<forge_model_info>()), FORGE_OK);
    EXPECT_EQ(info.as<forge_model_info>()->n_layers, full.n_layers);
    EXPECT_EQ(info.as<forge_model_info>()->n_params, full.n_params);
    EXPECT_TRUE(info.untouched(0, info_older, info.bytes.size()));
    const size_t mem_older = offsetof(forge_memory_stats, kv_cache_bytes);
    Sized mem(mem_older);
    ASSERT_EQ(forge_model_memory(m, mem.as<forge_memory_stats>()), FORGE_OK);
    EXPECT_GT(mem.as<forge_memory_stats>()->device_in_use_bytes, 0u);
    EXPECT_TRUE(mem.untouched(0, mem_older, mem.bytes.size()));
    const size_t sp_older = offsetof(forge_special_tokens, sot);
    Sized sp(sp_older);
    ASSERT_EQ(forge_model_special_tokens(m, sp.as<forge_special_tokens>()), FORGE_OK);
    EXPECT_EQ(sp.as<forge_special_tokens>()->bos, 1);
    EXPECT_TRUE(sp.untouched(0, sp_older, sp.bytes.size()));
    forge_model_free(m);
}

TEST(Abi, ArraysAtTheCallersStride) {
    forge_model *m = ft::load(kStories);
    ASSERT_NE(m, nullptr);
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = 64;
    sp.n_batch = 64;
    forge_session *s = nullptr;
    ASSERT_EQ(forge_session_create(m, &sp, &s), FORGE_OK) << forge_model_errmsg(m);
    const char *texts[3] = {"Once upon", "Lily", "The cat"};
    /* reference: today's structs */
    std::vector<forge_classify_prompt> ref_p(3, ft::sized<forge_classify_prompt>());
    for (int i = 0; i < 3; i++) ref_p[i].text = texts[i], ref_p[i].text_len = strlen(texts[i]);
    std::vector<forge_classify_result> ref_r(3, ft::sized<forge_classify_result>());
    ASSERT_EQ(forge_classify(s, ref_p.data(), 3, nullptr, ref_r.data()), FORGE_OK) << forge_session_errmsg(s);
    /* a newer caller's prompts (16 bytes of fields forge does not know, which it must not read as
     * anything) and an older caller's results (without the text fields) */
    Sized prompts(sizeof(forge_classify_prompt) + 16, 3);
    for (int i = 0; i < 3; i++) {
        forge_classify_prompt *p = prompts.as<forge_classify_prompt>(i);
        p->text = texts[i];
        p->text_len = strlen(texts[i]);
        p->tokens = nullptr;
        p->n_tokens = 0;
    }
    const size_t res_older = offsetof(forge_classify_result, text);
    Sized results(res_older, 3);
    ASSERT_EQ(forge_classify(s, prompts.as<forge_classify_prompt>(), 3, nullptr, results.as<forge_classify_result>()), FORGE_OK)
        << forge_session_errmsg(s);
    for (int i = 0; i < 3; i++) {
        const forge_classify_result *r = results.as<forge_classify_result>(i);
        EXPECT_EQ(r->struct_size, res_older) << i;
        EXPECT_EQ(r->token, ref_r[i].token) << i;
        EXPECT_EQ(r->n_tokens, ref_r[i].n_tokens) << i;
    }
    EXPECT_TRUE(results.untouched(2, res_older, results.bytes.size() - 2 * res_older)) << "written past the last result";
    forge_session_free(s);
    forge_model_free(m);
}

TEST(Abi, ChatMessagesAndBatchItemsAtTheCallersStride) {
    forge_model *m = ft::load(kStories);
    ASSERT_NE(m, nullptr);
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = 64;
    sp.n_seq_max = 2;
    forge_session *s = nullptr;
    ASSERT_EQ(forge_session_create(m, &sp, &s), FORGE_OK) << forge_model_errmsg(m);
    forge_generate_params gp = forge_generate_default_params();
    gp.max_tokens = 6;
    std::vector<forge_batch_item> ref_items(2, ft::sized<forge_batch_item>());
    const char *texts[2] = {"Once upon", "Lily"};
    for (int i = 0; i < 2; i++) ref_items[i].text = texts[i], ref_items[i].text_len = strlen(texts[i]), ref_items[i].params = &gp;
    std::vector<forge_batch_result> ref_res(2, ft::sized<forge_batch_result>());
    ASSERT_EQ(forge_batch_generate(s, ref_items.data(), 2, ref_res.data()), FORGE_OK) << forge_session_errmsg(s);
    /* items of a newer caller, results of an older one whose metrics end before context_slides */
    Sized items(sizeof(forge_batch_item) + 8, 2);
    for (int i = 0; i < 2; i++) {
        forge_batch_item *it = items.as<forge_batch_item>(i);
        it->text = texts[i];
        it->text_len = strlen(texts[i]);
        it->tokens = nullptr;
        it->n_tokens = 0;
        it->params = &gp;
    }
    const size_t res_older = offsetof(forge_batch_result, metrics) + offsetof(forge_metrics, context_slides);
    Sized res(res_older, 2);
    ASSERT_EQ(forge_batch_generate(s, items.as<forge_batch_item>(), 2, res.as<forge_batch_result>()), FORGE_OK) << forge_session_errmsg(s);
    for (int i = 0; i < 2; i++) {
        const forge_batch_result r = res.get<forge_batch_result>(i);
        EXPECT_EQ(r.status, FORGE_OK);
        EXPECT_EQ(r.metrics.struct_size, offsetof(forge_metrics, context_slides)) << "the nested metrics say the room they have";
        EXPECT_EQ(r.metrics.generated_tokens, ref_res[i].metrics.generated_tokens);
    }
    EXPECT_TRUE(res.untouched(1, res_older, res.bytes.size() - res_older));
    forge_session_free(s);
    forge_model_free(m);
}
