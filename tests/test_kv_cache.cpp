/* The KV cache's type (forge_session_params.kv_type): f16 halves the cache and stays within
 * its rounding of the f32 cache and of HF's logits, through prefill, both decode attention
 * kernels, rotating sliding-window rings and GGUF's adjacent RoPE pairs; state files keep the
 * session's type and load into a session of either; the context shift rotates f16 keys. The
 * kernels themselves: Kernel.RopeStoreIntoAnF16Cache*, Kernel.Attention* (test_kernels.cpp),
 * Overflow.ReRotationOfF16Keys* (test_overflow.cpp), Batch.StoriesOnAnF16Cache*. */
#include <cstdio>

#include "internal.h"
#include "parity.h"
#include "util.h"

namespace {

const char *kStories = "models/stories260K/stories260K.gguf";

forge_session *kv_session(forge_model *m, int kv_type, int n_ctx, int n_batch = 0, int overflow = FORGE_OVERFLOW_FAIL) {
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = n_ctx;
    sp.n_batch = n_batch;
    sp.kv_type = kv_type;
    sp.overflow = overflow;
    return ft::session(m, sp);
}

std::vector<int32_t> tokens(int n, int V, int seed) {
    std::vector<int32_t> t(n);
    for (int i = 0; i < n; i++) t[i] = (int32_t)((i * 37 + seed * 11 + 1) % V);
    return t;
}

/* Layer l's keys as forge_session_keys gives them (f32, whatever the cache holds). */
std::vector<float> keys(forge_session *s, int l) {
    forge_keys_info info = ft::sized<forge_keys_info>();
    EXPECT_EQ(forge_session_keys(s, l, nullptr, 0, &info), FORGE_OK);
    std::vector<float> k(info.n_floats);
    EXPECT_EQ(forge_session_keys(s, l, k.data(), k.size(), &info), FORGE_OK) << forge_session_errmsg(s);
    return k;
}

} // namespace

/* DEFAULT resolves to f32 for exact models and on CPU devices, f16 on GPUs; f16 plans half the
 * cache bytes of f32 and the same everything else; a bad kv_type names itself. */
TEST(KvCache, TypeResolvesAndF16HalvesTheCache) {
    for (int exact : {1, 0}) {
        forge_model *m = ft::load(ft::src(kStories), 0, 0, exact);
        ASSERT_NE(m, nullptr);
        forge_session *s = kv_session(m, FORGE_KV_DEFAULT, 256);
        ASSERT_NE(s, nullptr);
        EXPECT_EQ(forge_session_kv_type(s), exact || ft_model_on_cpu(m) ? FORGE_KV_F32 : FORGE_KV_F16) << "exact " << exact;
        forge_session_free(s);
        forge_memory_stats p32 = ft::sized<forge_memory_stats>(), p16 = ft::sized<forge_memory_stats>();
        forge_session_params sp = forge_session_default_params();
        sp.n_ctx = 256;
        sp.kv_type = FORGE_KV_F32;
        ASSERT_EQ(forge_session_plan(m, &sp, &p32), FORGE_OK);
        sp.kv_type = FORGE_KV_F16;
        ASSERT_EQ(forge_session_plan(m, &sp, &p16), FORGE_OK);
        EXPECT_EQ(p16.kv_cache_bytes * 2, p32.kv_cache_bytes);
        EXPECT_GT(p16.kv_cache_bytes, 0u);
        EXPECT_EQ(p32.device_planned_bytes - p16.device_planned_bytes, p16.kv_cache_bytes) << "only the cache shrinks";
        s = kv_session(m, FORGE_KV_F16, 256);
        ASSERT_NE(s, nullptr);
        EXPECT_EQ(forge_session_kv_type(s), FORGE_KV_F16);
        forge_memory_stats ms = ft::sized<forge_memory_stats>();
        ASSERT_EQ(forge_session_memory(s, &ms), FORGE_OK);
        EXPECT_EQ(ms.kv_cache_bytes, p16.kv_cache_bytes);
        forge_session_free(s);
        sp.kv_type = 3;
        forge_session *bad = nullptr;
        EXPECT_EQ(forge_session_create(m, &sp, &bad), FORGE_ERR_INVALID_ARGUMENT);
        EXPECT_EQ(bad, nullptr);
        EXPECT_NE(std::string(forge_model_errmsg(m)).find("kv_type 3"), std::string::npos) << forge_model_errmsg(m);
        forge_model_free(m);
    }
}

/* f16 keys and values against HF's logits: all positions of a prefill, then prefill-then-decode
 * on both decode attention kernels, on a Llama (rotate-half), its GGUF (adjacent pairs), Qwen 3
 * (q/k norms) and Gemma 3 (sliding layers whose rings rotate, n_batch 8). The bound: the f16
 * rounding of K and V moves these random-weight models' logits by 1e-4..1e-3 of their spread
 * (printed); 5e-3 is the bound. The f32 cache stays at parity's 1e-4 (Parity.*). */
TEST(KvCache, F16StaysCloseToHF) {
    for (const char *name : {"parity/llama3_f32_untied", "gguf/llama3_f32_untied", "parity/qwen3_f32_sharded", "parity/gemma3_text_pattern_f32"}) {
        SCOPED_TRACE(name);
        std::string n(name), ref_dir = ft::src("tests/fixtures/parity/" + n.substr(n.find('/') + 1));
        ft::Fixture fx = ft::read_fixture(ref_dir);
        ASSERT_FALSE(fx.seqs.empty());
        forge_model *m = ft::load(n.rfind("gguf/", 0) == 0 ? ft::src("tests/fixtures/" + n + ".gguf") : ref_dir);
        ASSERT_NE(m, nullptr);
        const ft::Sequence &q = fx.seqs.back();
        int V = fx.n_vocab, len = (int)q.tokens.size();
        std::vector<float> got((size_t)len * V);
        forge_session *s = kv_session(m, FORGE_KV_F16, 64);
        ASSERT_NE(s, nullptr);
        ASSERT_EQ(forge_eval(s, q.tokens.data(), len, FORGE_EVAL_ALL_LOGITS, got.data(), got.size()), FORGE_OK) << forge_session_errmsg(s);
        double err = ft::rel_err(got.data(), q.logits.data(), got.size());
        printf("  %-36s f16 cache, prefill:        max|d|/max|ref| = %.2e\n", name, err);
        EXPECT_LT(err, 5e-3);
        forge_session_free(s);
        for (int subgroups : {1, 0}) {
            if (!ft_model_set_attn_subgroups(m, subgroups)) continue;
            s = kv_session(m, FORGE_KV_F16, 64, 8);
            ASSERT_NE(s, nullptr);
            std::fill(got.begin(), got.end(), 0.0f);
            ASSERT_EQ(forge_eval(s, q.tokens.data(), 8, FORGE_EVAL_ALL_LOGITS, got.data(), got.size()), FORGE_OK);
            for (int p = 8; p < len; p++) ASSERT_EQ(forge_eval(s, &q.tokens[p], 1, 0, got.data() + (size_t)p * V, V), FORGE_OK);
            err = ft::rel_err(got.data(), q.logits.data(), got.size());
            printf("  %-36s f16 cache, prefill+decode%s: max|d|/max|ref| = %.2e\n", name, subgroups ? "" : " (split)", err);
            EXPECT_LT(err, 5e-3) << (subgroups ? "attention_decode" : "attention_split");
            forge_session_free(s);
        }
        forge_model_free(m);
    }
}

/* A state file keeps the session's type. f16 -> f16: the same keys and the same next logits,
 * bit for bit; f16 -> f32: the same keys (widening is exact); f32 -> f16: the keys rounded to
 * nearest f16. The f16 file is the smaller by half the cache. */
TEST(KvCache, StateFilesLoadIntoEitherType) {
    forge_model *m = ft::load(ft::src(kStories));
    ASSERT_NE(m, nullptr);
    int V = forge_model_n_vocab(m);
    forge_model_info info = ft::sized<forge_model_info>();
    ASSERT_EQ(forge_model_get_info(m, &info), FORGE_OK);
    std::vector<int32_t> prompt = tokens(40, V, 3);
    std::string dir = ft::tmpdir("kv_state"), f16_file = dir + "/f16.state", f32_file = dir + "/f32.state";
    forge_session *a16 = kv_session(m, FORGE_KV_F16, 128), *a32 = kv_session(m, FORGE_KV_F32, 128);
    ASSERT_TRUE(a16 && a32);
    ASSERT_EQ(forge_eval(a16, prompt.data(), 40, 0, nullptr, 0), FORGE_OK);
    ASSERT_EQ(forge_eval(a32, prompt.data(), 40, 0, nullptr, 0), FORGE_OK);
    ASSERT_EQ(forge_session_save(a16, f16_file.c_str()), FORGE_OK) << forge_session_errmsg(a16);
    ASSERT_EQ(forge_session_save(a32, f32_file.c_str()), FORGE_OK) << forge_session_errmsg(a32);
    size_t cache_floats = 2ull * info.n_layers * 40 * info.n_kv_heads * info.head_dim;
    size_t s16 = ft::read_file(f16_file).size(), s32 = ft::read_file(f32_file).size();
    EXPECT_GE(s32 - s16, cache_floats * 2) << "f32 " << s32 << " bytes, f16 " << s16;
    EXPECT_LT(s32 - s16, cache_floats * 2 + 64) << "only the cache and its header's dtypes differ";

    forge_session *b16 = kv_session(m, FORGE_KV_F16, 128), *b32 = kv_session(m, FORGE_KV_F32, 128), *c16 = kv_session(m, FORGE_KV_F16, 128);
    ASSERT_TRUE(b16 && b32 && c16);
    ASSERT_EQ(forge_session_load(b16, f16_file.c_str()), FORGE_OK) << forge_session_errmsg(b16);
    ASSERT_EQ(forge_session_load(b32, f16_file.c_str()), FORGE_OK) << forge_session_errmsg(b32);
    ASSERT_EQ(forge_session_load(c16, f32_file.c_str()), FORGE_OK) << forge_session_errmsg(c16);
    for (int l = 0; l < info.n_layers; l++) {
        std::vector<float> k16 = keys(a16, l), k32 = keys(a32, l);
        EXPECT_EQ(keys(b16, l), k16) << "layer " << l << ": f16 file into an f16 session";
        EXPECT_EQ(keys(b32, l), k16) << "layer " << l << ": f16 file into an f32 session";
        std::vector<float> rounded(k32.size());
        for (size_t i = 0; i < k32.size(); i++) rounded[i] = ft_f16_to_f32(ft_f32_to_f16(k32[i]));
        EXPECT_EQ(keys(c16, l), rounded) << "layer " << l << ": f32 file into an f16 session";
    }
    int32_t next = prompt[0];
    std::vector<float> la(V), lb(V);
    ASSERT_EQ(forge_eval(a16, &next, 1, 0, la.data(), V), FORGE_OK);
    ASSERT_EQ(forge_eval(b16, &next, 1, 0, lb.data(), V), FORGE_OK);
    EXPECT_EQ(la, lb) << "an f16 session continues its loaded state bit for bit";
    for (forge_session *s : {a16, a32, b16, b32, c16}) forge_session_free(s);
    forge_model_free(m);
}

/* SHIFT on an f16 cache (rows moved at half the bytes, keys re-rotated by rope_shift_kv16)
 * tracks SHIFT on an f32 cache: the same slides, logits within the f16 rounding. */
TEST(KvCache, ContextShiftOnAnF16Cache) {
    forge_model *m = ft::load(ft::src(kStories));
    ASSERT_NE(m, nullptr);
    int V = forge_model_n_vocab(m);
    std::vector<int32_t> t = tokens(70, V, 5);
    std::vector<float> l32(V), l16(V);
    forge_session *s32 = kv_session(m, FORGE_KV_F32, 32, 8, FORGE_OVERFLOW_SHIFT), *s16 = kv_session(m, FORGE_KV_F16, 32, 8, FORGE_OVERFLOW_SHIFT);
    ASSERT_TRUE(s32 && s16);
    for (int i = 0; i < 70; i++) {
        ASSERT_EQ(forge_eval(s32, &t[i], 1, 0, l32.data(), V), FORGE_OK) << forge_session_errmsg(s32);
        ASSERT_EQ(forge_eval(s16, &t[i], 1, 0, l16.data(), V), FORGE_OK) << forge_session_errmsg(s16);
        ASSERT_EQ(forge_session_n_past(s16), forge_session_n_past(s32)) << "token " << i;
        EXPECT_LT(ft::rel_err(l16.data(), l32.data(), V), 1e-2) << "token " << i;
    }
    EXPECT_LT(forge_session_n_past(s16), 70) << "the context slid";
    forge_session_free(s32);
    forge_session_free(s16);
    forge_model_free(m);
}
