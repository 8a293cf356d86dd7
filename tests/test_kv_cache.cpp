/* The KV cache's type (forge_session_params.kv_type): f16 halves the cache and stays within
 * its rounding of the f32 cache and of HF's logits, through prefill, both decode attention
 * kernels, rotating sliding-window rings and GGUF's adjacent RoPE pairs; state files keep the
 * session's type and load into a session of either; the context shift rotates f16 keys. The
 * kernels themselves: Kernel.RopeStoreIntoAnF16Cache*, Kernel.Attention* (test_kernels.cpp),
 * Overflow.ReRotationOfF16Keys* (test_overflow.cpp), Batch.StoriesOnAnF16Cache*. */
#include <algorithm>
#include <cstdio>
#include <functional>

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

/* Fixture `name`'s last sequence on a kv_type cache, its logits handed to check(path, got, hf,
 * prefill): all positions of one prefill (path "prefill", prefill empty), then 8 tokens
 * prefilled and the rest decoded a token a step, on attention_decode ("prefill+decode") and on
 * attention_split ("prefill+decode (split)") where the device runs each (prefill: the first's). */
using PathCheck = std::function<void(const char *path, const std::vector<float> &got, const std::vector<float> &hf,
                                     const std::vector<float> &prefill)>;
void each_attention_path(const char *name, int kv_type, const PathCheck &check) {
    std::string n(name), ref_dir = ft::src("tests/fixtures/parity/" + n.substr(n.find('/') + 1));
    ft::Fixture fx = ft::read_fixture(ref_dir);
    ASSERT_FALSE(fx.seqs.empty());
    forge_model *m = ft::load(n.rfind("gguf/", 0) == 0 ? ft::src("tests/fixtures/" + n + ".gguf") : ref_dir);
    ASSERT_NE(m, nullptr);
    const ft::Sequence &q = fx.seqs.back();
    int V = fx.n_vocab, len = (int)q.tokens.size();
    std::vector<float> prefill((size_t)len * V), got(prefill.size());
    forge_session *s = kv_session(m, kv_type, 128);
    ASSERT_NE(s, nullptr);
    ASSERT_EQ(forge_eval(s, q.tokens.data(), len, FORGE_EVAL_ALL_LOGITS, prefill.data(), prefill.size()), FORGE_OK) << forge_session_errmsg(s);
    forge_session_free(s);
    check("prefill", prefill, q.logits, {});
    for (int subgroups : {1, 0}) {
        if (!ft_model_set_attn_subgroups(m, subgroups)) continue;
        s = kv_session(m, kv_type, 128, 8);
        ASSERT_NE(s, nullptr);
        std::fill(got.begin(), got.end(), 0.0f);
        ASSERT_EQ(forge_eval(s, q.tokens.data(), 8, FORGE_EVAL_ALL_LOGITS, got.data(), got.size()), FORGE_OK);
        for (int p = 8; p < len; p++) ASSERT_EQ(forge_eval(s, &q.tokens[p], 1, 0, got.data() + (size_t)p * V, V), FORGE_OK);
        forge_session_free(s);
        check(subgroups ? "prefill+decode" : "prefill+decode (split)", got, q.logits, prefill);
    }
    forge_model_free(m);
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
        sp.kv_type = 4;
        forge_session *bad = nullptr;
        EXPECT_EQ(forge_session_create(m, &sp, &bad), FORGE_ERR_INVALID_ARGUMENT);
        EXPECT_EQ(bad, nullptr);
        EXPECT_NE(std::string(forge_model_errmsg(m)).find("kv_type 4"), std::string::npos) << forge_model_errmsg(m);
        sp.kv_type = FORGE_KV_Q8_0; /* stories260K's heads are 8 values: no block of 32 */
        EXPECT_EQ(forge_session_create(m, &sp, &bad), FORGE_ERR_UNSUPPORTED);
        EXPECT_EQ(bad, nullptr);
        EXPECT_NE(std::string(forge_model_errmsg(m)).find("q8_0 KV cache needs head_dim a multiple of 32; layer 0's is 8"), std::string::npos)
            << forge_model_errmsg(m);
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
        each_attention_path(name, FORGE_KV_F16, [&](const char *path, const std::vector<float> &got, const std::vector<float> &hf,
                                                     const std::vector<float> &) {
            double err = ft::rel_err(got.data(), hf.data(), got.size());
            printf("  %-36s f16 cache, %-22s: max|d|/max|ref| = %.2e\n", name, path, err);
            EXPECT_LT(err, 5e-3) << path;
        });
    }
}

/* q8_0 plans llama.cpp's blocks: a head of 32 values in 36 bytes (32 codes, an f16 scale, two
 * bytes of padding) against f32's 128, only the cache smaller; a session reports its type and
 * its plan. A model with a layer of heads not a multiple of 32 (Gemma 4's sliding layers of 16
 * beside full ones of 512) is refused naming the layer. */
TEST(KvCache, Q8PlansBlocksOf32AndRefusesOtherHeads) {
    forge_model *m = ft::load(ft::src("tests/fixtures/parity/qwen3_f32_sharded"));
    ASSERT_NE(m, nullptr);
    forge_memory_stats p32 = ft::sized<forge_memory_stats>(), p8 = ft::sized<forge_memory_stats>();
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = 96;
    sp.kv_type = FORGE_KV_F32;
    ASSERT_EQ(forge_session_plan(m, &sp, &p32), FORGE_OK);
    sp.kv_type = FORGE_KV_Q8_0;
    ASSERT_EQ(forge_session_plan(m, &sp, &p8), FORGE_OK) << forge_model_errmsg(m);
    EXPECT_GT(p8.kv_cache_bytes, 0u);
    EXPECT_EQ(p8.kv_cache_bytes * 128, p32.kv_cache_bytes * 36);
    EXPECT_EQ(p32.device_planned_bytes - p8.device_planned_bytes, p32.kv_cache_bytes - p8.kv_cache_bytes) << "only the cache shrinks";
    forge_session *s = kv_session(m, FORGE_KV_Q8_0, 96);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(forge_session_kv_type(s), FORGE_KV_Q8_0);
    forge_memory_stats ms = ft::sized<forge_memory_stats>();
    ASSERT_EQ(forge_session_memory(s, &ms), FORGE_OK);
    EXPECT_EQ(ms.kv_cache_bytes, p8.kv_cache_bytes);
    forge_session_free(s);
    forge_model_free(m);
    m = ft::load(ft::src("tests/fixtures/parity/gemma4_text_f32"));
    ASSERT_NE(m, nullptr);
    forge_session *bad = nullptr;
    EXPECT_EQ(forge_session_create(m, &sp, &bad), FORGE_ERR_UNSUPPORTED);
    EXPECT_EQ(bad, nullptr);
    EXPECT_NE(std::string(forge_model_errmsg(m)).find("q8_0 KV cache needs head_dim a multiple of 32; layer 0's is 16"), std::string::npos)
        << forge_model_errmsg(m);
    forge_model_free(m);
}

/* q8_0 keys and values against HF's logits, as F16StaysCloseToHF: prefill, then prefill-then-
 * decode on both decode kernels, on the fixtures with heads of 32: Qwen 3 and its GGUF, Mistral
 * with a sliding window (rings that rotate, n_batch 8), Qwen 3.5 (partial RoPE, attention between
 * linear-attention layers), and Gemma 4 (heads of 256 and 512). The quantization (a step of
 * max |v| / 127 a block) moves the logits by 2.1e-3..4.7e-2 of their largest (printed; the f16 cache:
 * 5e-4); the bound is 8e-2, where a misplaced block or scale moves them by their whole spread.
 * Gemma 4's random-weight attention (scale 1 over normed q and k of norm sqrt(D)) amplifies any
 * rounding of the keys (the f16 cache: 9e-3, 20 times the others), so there only the paths are
 * compared: each decode kernel's logits (its own q8_0 writer or rope.comp's) against the
 * prefill's, within 1e-2 on every fixture (measured: 5e-7..5e-6, Gemma 4 2.7e-3). */
TEST(KvCache, Q8StaysCloseToHF) {
    for (const char *name : {"parity/qwen3_f32_sharded", "gguf/qwen3_f32_sharded", "parity/mistral_window_f32", "parity/qwen3_5_text_f32",
                             "parity/gemma4_wide_f32"}) {
        SCOPED_TRACE(name);
        const bool to_hf = std::string(name).find("gemma4") == std::string::npos;
        each_attention_path(name, FORGE_KV_Q8_0, [&](const char *path, const std::vector<float> &got, const std::vector<float> &hf,
                                                      const std::vector<float> &prefill) {
            double err = ft::rel_err(got.data(), hf.data(), got.size());
            if (to_hf) {
                EXPECT_LT(err, 8e-2) << path;
            }
            if (prefill.empty()) {
                printf("  %-30s q8_0 cache, %-22s: %.2e (HF)\n", name, path, err);
                return;
            }
            double paths = ft::rel_err(got.data(), prefill.data(), got.size());
            printf("  %-30s q8_0 cache, %-22s: %.2e (HF), %.2e (the prefill's)\n", name, path, err, paths);
            EXPECT_LT(paths, 1e-2) << path;
        });
    }
}

/* A q8_0 session's state file holds F32 keys and values, each q x d exactly: the same size as
 * an f32 session's file; q8_0 -> q8_0 gives the same keys and the same next logits bit for bit;
 * q8_0 -> f32 the same keys; f32 -> q8_0 the f32 keys quantized on the host. */
TEST(KvCache, Q8StateFilesHoldItsValuesExactly) {
    forge_model *m = ft::load(ft::src("tests/fixtures/parity/qwen3_f32_sharded"));
    ASSERT_NE(m, nullptr);
    int V = forge_model_n_vocab(m);
    forge_model_info info = ft::sized<forge_model_info>();
    ASSERT_EQ(forge_model_get_info(m, &info), FORGE_OK);
    const uint32_t D = (uint32_t)info.head_dim;
    std::vector<int32_t> prompt = tokens(40, V, 3);
    std::string dir = ft::tmpdir("kv_state_q8"), q8_file = dir + "/q8.state", f32_file = dir + "/f32.state";
    forge_session *a8 = kv_session(m, FORGE_KV_Q8_0, 128), *a32 = kv_session(m, FORGE_KV_F32, 128);
    ASSERT_TRUE(a8 && a32);
    ASSERT_EQ(forge_eval(a8, prompt.data(), 40, 0, nullptr, 0), FORGE_OK) << forge_session_errmsg(a8);
    ASSERT_EQ(forge_eval(a32, prompt.data(), 40, 0, nullptr, 0), FORGE_OK);
    ASSERT_EQ(forge_session_save(a8, q8_file.c_str()), FORGE_OK) << forge_session_errmsg(a8);
    ASSERT_EQ(forge_session_save(a32, f32_file.c_str()), FORGE_OK) << forge_session_errmsg(a32);
    EXPECT_EQ(ft::read_file(q8_file).size(), ft::read_file(f32_file).size());

    forge_session *b8 = kv_session(m, FORGE_KV_Q8_0, 128), *b32 = kv_session(m, FORGE_KV_F32, 128), *c8 = kv_session(m, FORGE_KV_Q8_0, 128);
    ASSERT_TRUE(b8 && b32 && c8);
    ASSERT_EQ(forge_session_load(b8, q8_file.c_str()), FORGE_OK) << forge_session_errmsg(b8);
    ASSERT_EQ(forge_session_load(b32, q8_file.c_str()), FORGE_OK) << forge_session_errmsg(b32);
    ASSERT_EQ(forge_session_load(c8, f32_file.c_str()), FORGE_OK) << forge_session_errmsg(c8);
    for (int l = 0; l < info.n_layers; l++) {
        std::vector<float> k8 = keys(a8, l), k32 = keys(a32, l);
        EXPECT_EQ(keys(b8, l), k8) << "layer " << l << ": q8_0 file into a q8_0 session";
        EXPECT_EQ(keys(b32, l), k8) << "layer " << l << ": q8_0 file into an f32 session";
        size_t heads = k32.size() / D; /* (keys() gives heads of D in the cache's order of values) */
        std::vector<uint8_t> q(heads * ft_kv8_head_bytes(D));
        std::vector<float> quantized(k32.size());
        ft_kv_convert(k32.data(), FORGE_KV_F32, q.data(), FORGE_KV_Q8_0, heads, D);
        ft_kv_convert(q.data(), FORGE_KV_Q8_0, quantized.data(), FORGE_KV_F32, heads, D);
        EXPECT_EQ(keys(c8, l), quantized) << "layer " << l << ": f32 file into a q8_0 session";
        /* layer 0's keys are the same f32 keys quantized (within half a step, 1/254 of the largest); later layers' inputs
         * moved with the earlier layers' quantized attention */
        EXPECT_LT(ft::rel_err(k8.data(), k32.data(), k8.size()), l ? 3e-2 : 1.0 / 254 + 1e-6) << "layer " << l;
    }
    int32_t next = prompt[0];
    std::vector<float> la(V), lb(V);
    ASSERT_EQ(forge_eval(a8, &next, 1, 0, la.data(), V), FORGE_OK);
    ASSERT_EQ(forge_eval(b8, &next, 1, 0, lb.data(), V), FORGE_OK);
    EXPECT_EQ(la, lb) << "a q8_0 session continues its loaded state bit for bit";
    for (forge_session *s : {a8, a32, b8, b32, c8}) forge_session_free(s);
    forge_model_free(m);
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

/* SHIFT on a q8_0 cache (rows moved as blocks, keys re-rotated by rope_shift_kv8) tracks SHIFT
 * on an f32 cache on Qwen 3 (heads of 32): the same slides, logits within the quantization. */
TEST(KvCache, ContextShiftOnAQ8Cache) {
    forge_model *m = ft::load(ft::src("tests/fixtures/parity/qwen3_f32_sharded"));
    ASSERT_NE(m, nullptr);
    int V = forge_model_n_vocab(m);
    std::vector<int32_t> t = tokens(70, V, 5);
    std::vector<float> l32(V), l8(V);
    forge_session *s32 = kv_session(m, FORGE_KV_F32, 32, 8, FORGE_OVERFLOW_SHIFT), *s8 = kv_session(m, FORGE_KV_Q8_0, 32, 8, FORGE_OVERFLOW_SHIFT);
    ASSERT_TRUE(s32 && s8);
    double worst = 0;
    for (int i = 0; i < 70; i++) {
        ASSERT_EQ(forge_eval(s32, &t[i], 1, 0, l32.data(), V), FORGE_OK) << forge_session_errmsg(s32);
        ASSERT_EQ(forge_eval(s8, &t[i], 1, 0, l8.data(), V), FORGE_OK) << forge_session_errmsg(s8);
        ASSERT_EQ(forge_session_n_past(s8), forge_session_n_past(s32)) << "token " << i;
        double err = ft::rel_err(l8.data(), l32.data(), V);
        worst = std::max(worst, err);
        EXPECT_LT(err, 3e-2) << "token " << i;
    }
    printf("  q8_0 against f32 through the slides: worst max|d|/max|ref| = %.2e\n", worst);
    EXPECT_LT(forge_session_n_past(s8), 70) << "the context slid";
    forge_session_free(s32);
    forge_session_free(s8);
    forge_model_free(m);
}
