/* Device memory budgets (forge_model_params.max_device_memory): a plan that does not fit beside
 * what is in use is refused before anything is allocated, with FORGE_ERR_OUT_OF_MEMORY and the
 * numbers, at model load (weights), session create (KV cache, activations) and trainer create;
 * what fits is unaffected. On stories260K (1.1 MiB of weights). */
#include "util.h"

namespace {

const std::string &stories() {
    static const std::string p = ft::src("models/stories260K/stories260K.gguf");
    return p;
}

forge_status load_with_budget(uint64_t budget, forge_model **m) {
    forge_model_params p = forge_model_default_params();
    p.max_device_memory = budget;
    return forge_model_load(stories().c_str(), &p, m);
}

uint64_t session_plan_bytes(forge_model *m, int n_ctx) {
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = n_ctx;
    forge_memory_stats plan = ft::sized<forge_memory_stats>();
    EXPECT_EQ(forge_session_plan(m, &sp, &plan), FORGE_OK) << forge_model_errmsg(m);
    return plan.device_planned_bytes;
}

TEST(DeviceMemory, WeightsOverTheBudgetAreRefusedAtLoad) {
    forge_model *m = nullptr;
    EXPECT_EQ(load_with_budget(256 * 1024, &m), FORGE_ERR_OUT_OF_MEMORY);
    std::string msg = forge_model_errmsg(m);
    EXPECT_NE(msg.find("the model's weights: 1."), std::string::npos) << msg;
    EXPECT_NE(msg.find("MiB of device memory needed; the budget is 0.25 MiB"), std::string::npos) << msg;
    forge_model_free(m);
}

TEST(DeviceMemory, SessionOverWhatIsLeftIsRefusedAtCreate) {
    /* the sizes without a budget first */
    forge_model *m = nullptr;
    ASSERT_EQ(load_with_budget(0, &m), FORGE_OK) << forge_model_errmsg(m);
    forge_memory_stats mem = ft::sized<forge_memory_stats>();
    ASSERT_EQ(forge_model_memory(m, &mem), FORGE_OK);
    uint64_t weights = mem.device_in_use_bytes, small = session_plan_bytes(m, 64), large = session_plan_bytes(m, 4096);
    ASSERT_GT(large, small + small / 2);
    forge_model_free(m);
    /* room for the weights and one small session only */
    uint64_t budget = weights + small + small / 2;
    ASSERT_EQ(load_with_budget(budget, &m), FORGE_OK) << forge_model_errmsg(m);
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = 4096;
    forge_session *s = nullptr;
    EXPECT_EQ(forge_session_create(m, &sp, &s), FORGE_ERR_OUT_OF_MEMORY);
    std::string msg = forge_model_errmsg(m);
    EXPECT_NE(msg.find("the session: "), std::string::npos) << msg;
    EXPECT_NE(msg.find("lower n_ctx"), std::string::npos) << msg;
    EXPECT_EQ(s, nullptr);
    sp.n_ctx = 64;
    ASSERT_EQ(forge_session_create(m, &sp, &s), FORGE_OK) << forge_model_errmsg(m);
    /* and it runs */
    int32_t tok = 1;
    std::vector<float> logits(forge_model_n_vocab(m));
    EXPECT_EQ(forge_eval(s, &tok, 1, 0, logits.data(), logits.size()), FORGE_OK) << forge_session_errmsg(s);
    /* a second one no longer fits beside the first */
    forge_session *s2 = nullptr;
    EXPECT_EQ(forge_session_create(m, &sp, &s2), FORGE_ERR_OUT_OF_MEMORY);
    forge_session_free(s);
    EXPECT_EQ(forge_session_create(m, &sp, &s2), FORGE_OK) << forge_model_errmsg(m);
    forge_session_free(s2);
    forge_model_free(m);
}

}  // namespace
