/* HuggingFace parity: small random-weight checkpoints made by transformers
 * (tools/fixtures/make_parity_fixtures.py), with HF's logits at every position of two token
 * sequences. forge must match: max|Δ|/max|ref| <= 1e-4 for f32 weights (2e-2 against HF's own
 * bf16 forward, 1e-4 against the f64 forward of the same bf16 weights), argmax equal at every
 * position; and prefill-then-decode must give the same logits as the full prefill. */
#include <cjson/cJSON.h>

#include <algorithm>
#include <cstring>

#include "internal.h"
#include "parity.h"
#include "util.h"

using ft::Fixture;
using ft::Sequence;
using ft::read_fixture;

namespace {

/* Compares forge's rows with a reference: the error bound, and argmax at every position whose
 * top-1/top-2 margin exceeds `margin_tol` * 2 * max|ref| (0: every position). */
void expect_close(const std::string &what, const float *got, const float *ref, int n_tokens, int V, double tol, double margin_tol,
                  bool bound = true) {
    size_t n = (size_t)n_tokens * V;
    double err = ft::rel_err(got, ref, n);
    if (bound) {
        EXPECT_LE(err, tol) << what;
    }
    printf("  %-48s max|d|/max|ref| = %.2e (tolerance %.0e%s)\n", what.c_str(), err, tol, bound ? "" : ": argmax only");
    double max_ref = 0;
    for (size_t i = 0; i < n; i++) max_ref = std::fmax(max_ref, std::fabs(ref[i]));
    for (int p = 0; p < n_tokens; p++) {
        const float *r = ref + (size_t)p * V;
        int a = ft::argmax(r, V);
        float second = -INFINITY;
        for (int j = 0; j < V; j++)
            if (j != a) second = std::fmax(second, r[j]);
        if (margin_tol > 0 && r[a] - second <= 2 * margin_tol * max_ref) continue;
        EXPECT_EQ(ft::argmax(got + (size_t)p * V, V), a) << what << " position " << p;
    }
}

/* q's logits from session s: a prefill of k tokens, then one token a step (the recorded decode
 * step, replayed). */
void prefill_then_decode(forge_session *s, const Sequence &q, int V, int k, std::vector<float> &got) {
    int n = (int)q.tokens.size();
    got.assign((size_t)n * V, 0.0f);
    ASSERT_EQ(forge_eval(s, q.tokens.data(), k, FORGE_EVAL_ALL_LOGITS, got.data(), got.size()), FORGE_OK) << forge_session_errmsg(s);
    for (int p = k; p < n; p++)
        ASSERT_EQ(forge_eval(s, &q.tokens[p], 1, 0, got.data() + (size_t)p * V, V), FORGE_OK) << forge_session_errmsg(s);
}

/* A profiling session's kernel table (forge_session_profile) parsed; nullptr on failure. */
cJSON *profile_of(forge_session *s) {
    std::vector<char> prof(1 << 16);
    size_t len = 0;
    if (forge_session_profile(s, prof.data(), prof.size(), &len) != FORGE_OK) return nullptr;
    return cJSON_Parse(prof.data());
}

std::string fixture_path(const std::string &name) {
    return ft::src(name.find('/') == std::string::npos ? "tests/fixtures/parity/" + name : "tests/fixtures/" + name);
}

std::string case_name(const ::testing::TestParamInfo<std::string> &i) {
    std::string n = i.param;
    for (char &c : n)
        if (c == '/') c = '_';
    return n;
}

} // namespace

/* A case is a fixture directory (reference.json, logits, and the checkpoint itself), or
 * "gguf/NAME": the GGUF conversion in tests/fixtures/gguf checked against parity/NAME's logits,
 * or against gguf/NAME/'s where a quantized file has its own (the float64 forward of its exactly
 * dequantized weights). */
class Parity : public ::testing::TestWithParam<std::string> {
  protected:
    std::string model_path() const {
        const std::string &p = GetParam();
        if (p.rfind("gguf/", 0) == 0) return ft::src("tests/fixtures/" + p + ".gguf");
        return fixture_path(p);
    }
    std::string ref_dir() const {
        const std::string &p = GetParam();
        if (p.rfind("gguf/", 0) == 0)
            return ft::exists(ft::src("tests/fixtures/" + p + "/reference.json")) ? ft::src("tests/fixtures/" + p) : fixture_path(p.substr(5));
        return fixture_path(p);
    }
};

/* All positions in one prefill, each sequence from an empty cache. */
TEST_P(Parity, AllPositionLogits) {
    Fixture fx = read_fixture(ref_dir());
    ASSERT_FALSE(fx.seqs.empty());
    forge_model *m = ft::load(model_path());
    ASSERT_NE(m, nullptr);
    ASSERT_EQ(forge_model_n_vocab(m), fx.n_vocab);
    forge_session *s = nullptr;
    ASSERT_EQ(forge_session_create(m, nullptr, &s), FORGE_OK) << forge_model_errmsg(m);
    for (size_t i = 0; i < fx.seqs.size(); i++) {
        const Sequence &q = fx.seqs[i];
        int n = (int)q.tokens.size();
        std::vector<float> got((size_t)n * fx.n_vocab);
        ASSERT_EQ(forge_session_truncate(s, 0), FORGE_OK);
        ASSERT_EQ(forge_eval(s, q.tokens.data(), n, FORGE_EVAL_ALL_LOGITS, got.data(), got.size()), FORGE_OK) << forge_session_errmsg(s);
        std::string what = case_name(::testing::TestParamInfo<std::string>(GetParam(), 0)) + " seq" + std::to_string(i);
        if (fx.bf16) {
            /* where HF's own bf16 forward is further than 2e-2 from the f64 one (Qwen 3.5's recurrent state
             * accumulates bf16 rounding: 0.10 and 0.23), only its clear argmax is a reference */
            expect_close(what + " vs HF bf16", got.data(), q.logits.data(), n, fx.n_vocab, 2e-2, 2e-2, q.bf16_vs_f64 <= 2e-2);
            ASSERT_FALSE(q.logits_f64.empty());
            expect_close(what + " vs f64", got.data(), q.logits_f64.data(), n, fx.n_vocab, 1e-4, 0);
        } else {
            expect_close(what, got.data(), q.logits.data(), n, fx.n_vocab, 1e-4, 0);
        }
    }
    forge_session_free(s);
    forge_model_free(m);
}

/* The longest sequence: a prefill of 8 tokens, then one token per step (the recorded decode
 * step, replayed), compared with HF's rows at every later position; for the Gemma fixtures
 * (window 8) the decode runs well past the sliding window. Both decode attention kernels:
 * attention_decode.comp on subgroups (where the device has them) and attention_split.comp.
 * Gemma 2 / 3 decode on subgroups adds the post-attention norm inside the gate|up product
 * (matvec_sg_post_*, forge__post_fused): the profile must show it ran once a layer and step,
 * with one rmsnorm dispatch a layer fewer. */
TEST_P(Parity, PrefillThenDecode) {
    Fixture fx = read_fixture(ref_dir());
    ASSERT_FALSE(fx.seqs.empty());
    const Sequence &q = fx.seqs.back();
    const std::vector<float> &ref = fx.bf16 ? q.logits_f64 : q.logits;
    forge_model *m = ft::load(model_path());
    ASSERT_NE(m, nullptr);
    for (int subgroups : {1, 0}) {
        if (!ft_model_set_attn_subgroups(m, subgroups)) continue;
        forge_session_params sp = forge_session_default_params();
        sp.n_ctx = std::max(64, (int)q.tokens.size()); /* (Qwen 3.5's fixtures run past a 64-token chunk) */
        sp.n_batch = 8; /* sliding layers keep window + 7 slots, the cache rotates */
        sp.profile = 1;
        forge_session *s = ft::session(m, sp);
        ASSERT_NE(s, nullptr);
        int V = fx.n_vocab, n = (int)q.tokens.size(), k = 8;
        std::vector<float> got;
        ASSERT_NO_FATAL_FAILURE(prefill_then_decode(s, q, V, k, got));
        expect_close(GetParam() + (subgroups ? " prefill+decode" : " prefill+decode (attention_split)"), got.data(), ref.data(), n, V,
                     1e-4, 0);
        forge_model_info info = ft::sized<forge_model_info>();
        ASSERT_EQ(forge_model_get_info(m, &info), FORGE_OK);
        std::string arch = info.architecture;
        if (subgroups && (arch == "gemma2" || arch == "gemma3")) {
            cJSON *pj = profile_of(s);
            ASSERT_NE(pj, nullptr);
            cJSON *post = cJSON_GetObjectItem(pj, fx.bf16 ? "matvec_sg_post_bf16" : "matvec_sg_post_f32");
            ASSERT_NE(post, nullptr);
            EXPECT_EQ(cJSON_GetObjectItem(post, "calls")->valuedouble, (double)(n - k) * info.n_layers);
            /* rmsnorm: a decode step's post-MLP norm a layer (the others fused into the products),
             * beside what the prefill alone calls: on a GPU its two post-norms a layer and Gemma 3's
             * q and k head norms (the others fused into the products of up to 8 rows); a CPU device
             * runs those on matmul, its norms apart */
            forge_session *pre = ft::session(m, sp);
            ASSERT_NE(pre, nullptr);
            std::vector<float> pre_logits((size_t)k * V);
            ASSERT_EQ(forge_eval(pre, q.tokens.data(), k, FORGE_EVAL_ALL_LOGITS, pre_logits.data(), pre_logits.size()), FORGE_OK);
            cJSON *pp = profile_of(pre);
            ASSERT_NE(pp, nullptr);
            double prefill_calls = cJSON_GetObjectItem(cJSON_GetObjectItem(pp, "rmsnorm"), "calls")->valuedouble;
            EXPECT_EQ(cJSON_GetObjectItem(cJSON_GetObjectItem(pj, "rmsnorm"), "calls")->valuedouble - prefill_calls, (double)(n - k) * info.n_layers);
            int prefill_norms = arch == "gemma3" ? 4 : 2;
            if (!ft_model_on_cpu(m)) EXPECT_EQ(prefill_calls, (double)prefill_norms * info.n_layers);
            else EXPECT_GT(prefill_calls, (double)prefill_norms * info.n_layers);
            cJSON_Delete(pp);
            forge_session_free(pre);
            cJSON_Delete(pj);
        }
        forge_session_free(s);
    }
    forge_model_free(m);
}

/* One-token products two rows a subgroup (matvec_sg_pair: on GPUs the LM heads of 32768
 * outputs and more), switched on here for every even product of plain-format weights: the
 * prefill-then-decode logits against HF's as above, and the profile shows the kernel ran. */
TEST(ParityPairs, OneTokenProductsTwoOutputsASubgroup) {
    for (const char *name : {"llama3_f32_untied", "llama3_bf16_tied", "qwen3_f32_sharded", "gemma3_text_f32"}) {
        SCOPED_TRACE(name);
        Fixture fx = read_fixture(fixture_path(name));
        ASSERT_FALSE(fx.seqs.empty());
        const Sequence &q = fx.seqs.back();
        const std::vector<float> &ref = fx.bf16 ? q.logits_f64 : q.logits;
        forge_model *m = ft::load(fixture_path(name));
        ASSERT_NE(m, nullptr);
        ft_model_set_matvec_pairs(m, 2);
        forge_session_params sp = forge_session_default_params();
        sp.n_ctx = 64;
        sp.profile = 1;
        forge_session *s = ft::session(m, sp);
        ASSERT_NE(s, nullptr);
        int V = fx.n_vocab, n = (int)q.tokens.size();
        std::vector<float> got;
        ASSERT_NO_FATAL_FAILURE(prefill_then_decode(s, q, V, 8, got));
        expect_close(std::string(name) + " prefill+decode, row pairs", got.data(), ref.data(), n, V, 1e-4, 0);
        cJSON *pj = profile_of(s);
        ASSERT_NE(pj, nullptr);
        EXPECT_NE(cJSON_GetObjectItem(pj, fx.bf16 ? "matvec_sg_pair_bf16" : "matvec_sg_pair_f32"), nullptr);
        /* the gated gate|up product (2 ffn rows) too: two outputs, four rows a subgroup; Gemma's
         * in matvec_sg_post, which always takes them so */
        forge_model_info info = ft::sized<forge_model_info>();
        ASSERT_EQ(forge_model_get_info(m, &info), FORGE_OK);
        bool sandwich = !strncmp(info.architecture, "gemma", 5);
        std::string gate_up = std::string(sandwich ? "matvec_sg_post_" : "matvec_sg_pair_") + (fx.bf16 ? "bf16 " : "f32 ") +
                              std::to_string(2 * info.ffn) + "x" + std::to_string(info.hidden);
        EXPECT_NE(cJSON_GetObjectItem(pj, gate_up.c_str()), nullptr) << gate_up;
        cJSON_Delete(pj);
        forge_session_free(s);
        forge_model_free(m);
    }
}

/* One-token products on the host (src/host.c, CPU devices' default for weights of 256 KiB and
 * more), switched on here for every product: F32, BF16 and Q8_0 / Q4_0 weights, biases (Qwen 2),
 * soft-capped logits and GELU (Gemma 2), gated SiLU, fused norms: the prefill-then-decode logits
 * against HF's at the same 1e-4, and the products really ran on the host. */
TEST(ParityHost, OneTokenProductsOnTheHost) {
    for (const char *name : {"llama3_f32_untied", "llama3_bf16_tied", "qwen2_f32_tied", "gemma2_f32", "mistral_v03_bf16",
                             "gguf/qwen3_5_text_q8_0", "gguf/qwen3_5_text_q4_0"}) {
        SCOPED_TRACE(name);
        Fixture fx = read_fixture(fixture_path(name));
        ASSERT_FALSE(fx.seqs.empty());
        const Sequence &q = fx.seqs.back();
        const std::vector<float> &ref = fx.bf16 ? q.logits_f64 : q.logits;
        bool gguf = !strncmp(name, "gguf/", 5);
        forge_model *m = ft::load(fixture_path(name) + (gguf ? ".gguf" : ""));
        ASSERT_NE(m, nullptr);
        if (!ft_model_set_host_products(m, 1, 0)) {
            forge_model_free(m);
            GTEST_SKIP() << "host products run on CPU devices only";
        }
        forge_session_params sp = forge_session_default_params();
        sp.n_ctx = 256;
        forge_session *s = ft::session(m, sp);
        ASSERT_NE(s, nullptr);
        int V = fx.n_vocab, n = (int)q.tokens.size();
        std::vector<float> got;
        ASSERT_NO_FATAL_FAILURE(prefill_then_decode(s, q, V, 8, got));
        expect_close(std::string(name) + " prefill+decode, host products", got.data(), ref.data(), n, V, 1e-4, 0);
        forge_model_info info = ft::sized<forge_model_info>();
        ASSERT_EQ(forge_model_get_info(m, &info), FORGE_OK);
        /* the decode step's recording: at least a product a layer and the head's */
        EXPECT_GE(ft_session_host_ops(s), info.n_layers + 1);
        forge_session_free(s);
        forge_model_free(m);
    }
}

/* HF's own greedy generate (with its cache: for Qwen 3.5 the chunked prefill, then the recurrent
 * decode step) from each sequence, where the fixture records one: forge_generate_tokens gives the
 * same tokens. */
class ParityGenerate : public Parity {};
TEST_P(ParityGenerate, GreedyGenerateEqualsHF) {
    Fixture fx = read_fixture(ref_dir());
    bool any = false;
    for (const Sequence &q : fx.seqs) any |= !q.generated.empty();
    ASSERT_TRUE(any) << GetParam() << " records no HF generate";
    forge_model *m = ft::load(model_path());
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 256);
    ASSERT_NE(s, nullptr);
    for (const Sequence &q : fx.seqs) {
        if (q.generated.empty()) continue;
        std::vector<int32_t> got;
        forge_generate_params gp = forge_generate_default_params();
        gp.max_tokens = (int)q.generated.size();
        gp.ignore_eos = 1;
        gp.user_data = &got;
        gp.on_token = [](void *u, int32_t tok, const char *, size_t) {
            if (tok >= 0) static_cast<std::vector<int32_t> *>(u)->push_back(tok);
            return 0;
        };
        ASSERT_EQ(forge_generate_tokens(s, q.tokens.data(), (int)q.tokens.size(), &gp, nullptr), FORGE_OK) << forge_session_errmsg(s);
        EXPECT_EQ(got, q.generated) << GetParam() << ": from " << q.tokens.size() << " tokens";
    }
    forge_session_free(s);
    forge_model_free(m);
}

INSTANTIATE_TEST_SUITE_P(HF, Parity,
                         ::testing::Values("llama3_f32_untied", "llama3_bf16_tied", "qwen2_f32_tied", "qwen3_f32_sharded",
                                           "gemma2_f32", "gemma3_text_f32", "gemma3_text_pattern_f32", "gemma3_mm_f32",
                                           "qwen3_moe_f32", "gemma4_text_f32", "gemma4_moe_f32", "gemma4_wide_f32", "mistral_window_f32",
                                           "mistral_v03_bf16", "qwen3_5_text_f32", "qwen3_5_mm_bf16", "qwen3_5_moe_f32"),
                         case_name);

/* The fixtures that record HF's greedy generate. */
INSTANTIATE_TEST_SUITE_P(HF, ParityGenerate,
                         ::testing::Values("mistral_window_f32", "mistral_v03_bf16", "qwen3_5_text_f32", "qwen3_5_moe_f32"), case_name);

/* MLX affine checkpoints (tools/fixtures/mlx_quant.py follows mlx.core.quantize); references are
 * HF forwards of the exactly dequantized weights. */
INSTANTIATE_TEST_SUITE_P(MLX, Parity,
                         ::testing::Values("mlx/llama_mlx4_g64_tied_f16", "mlx/qwen3_mlx8_g32_bf16", "mlx/llama_mlx_mixed",
                                           "mlx/qwen3_moe_mlx4_g32_f16", "mlx/gemma4_moe_mlx4_g32_bf16",
                                           "mlx/qwen3_5_mlx4_g64_bf16", "mlx/qwen3_5_moe_mlx4_g32_f16"),
                         case_name);

/* GGUF conversions following llama.cpp's converter conventions (tools/hf_to_gguf.py). */
INSTANTIATE_TEST_SUITE_P(GGUF, Parity,
                         ::testing::Values("gguf/llama3_f32_untied", "gguf/qwen2_f32_tied", "gguf/qwen3_f32_sharded", "gguf/gemma2_f32",
                                           "gguf/gemma3_text_f32", "gguf/qwen3_moe_f32", "gguf/gemma4_text_f32", "gguf/gemma4_moe_f32",
                                           "gguf/qwen3_5_text_f32", "gguf/qwen3_5_moe_f32", "gguf/mistral_v03_bf16",
                                           "gguf/qwen3_5_text_q8_0", "gguf/qwen3_5_text_q4_0", "gguf/qwen3_5_moe_q8_0"),
                         case_name);

/* The default (fast) settings: on devices with tensor cores the prefill rounds activations to
 * f16, as llama.cpp does; elsewhere it is the same f32 path. The f16 rounding bound used here: 1e-2 (measured on the H100: 5e-3). */
TEST(ParityFast, DefaultSettingsStayClose) {
    for (const char *name : {"llama3_f32_untied", "gemma2_f32", "qwen3_f32_sharded"}) {
        Fixture fx = read_fixture(fixture_path(name));
        forge_model *m = ft::load(fx.dir, 0, 0, 0);
        ASSERT_NE(m, nullptr);
        forge_session *s = nullptr;
        ASSERT_EQ(forge_session_create(m, nullptr, &s), FORGE_OK);
        const Sequence &q = fx.seqs.back();
        int n = (int)q.tokens.size();
        std::vector<float> got((size_t)n * fx.n_vocab);
        ASSERT_EQ(forge_eval(s, q.tokens.data(), n, FORGE_EVAL_ALL_LOGITS, got.data(), got.size()), FORGE_OK);
        expect_close(std::string(name) + " default settings", got.data(), q.logits.data(), n, fx.n_vocab, 1e-2, 1e-2);
        forge_session_free(s);
        forge_model_free(m);
    }
}

/* Shards without model.safetensors.index.json: every *.safetensors in the directory. */
TEST(ParityShards, WithoutIndex) {
    std::string src = fixture_path("qwen3_f32_sharded"), d = ft::tmpdir("shards_noindex");
    ASSERT_EQ(system(("cp " + src + "/*.safetensors " + src + "/config.json " + d + "/").c_str()), 0);
    Fixture fx = read_fixture(src);
    forge_model *m = ft::load(d);
    ASSERT_NE(m, nullptr);
    forge_session *s = nullptr;
    ASSERT_EQ(forge_session_create(m, nullptr, &s), FORGE_OK);
    const Sequence &q = fx.seqs[0];
    std::vector<float> got(q.logits.size());
    ASSERT_EQ(forge_eval(s, q.tokens.data(), (int)q.tokens.size(), FORGE_EVAL_ALL_LOGITS, got.data(), got.size()), FORGE_OK);
    expect_close("shards without index", got.data(), q.logits.data(), (int)q.tokens.size(), fx.n_vocab, 1e-4, 0);
    forge_session_free(s);
    forge_model_free(m);
}

/* Gemma 4's layers cache keys of two shapes and share caches: state files and key inspection
 * (one row shape per file) and training refuse it by name; a full context with SHIFT slides by
 * recomputing instead of re-rotating, and its logits are then a fresh session's on the kept
 * tokens. */
TEST(ParityGemma4, WhatMixedLayerShapesRefuseOrRecompute) {
    Fixture fx = read_fixture(fixture_path("gemma4_text_f32"));
    forge_model *m = ft::load(fixture_path("gemma4_text_f32"));
    ASSERT_NE(m, nullptr);
    const std::vector<int32_t> &toks = fx.seqs.back().tokens;
    int V = fx.n_vocab;
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = 16;
    sp.n_batch = 8;
    sp.overflow = FORGE_OVERFLOW_SHIFT;
    sp.n_keep = 4;
    forge_session *s = ft::session(m, sp);
    ASSERT_NE(s, nullptr);
    std::vector<float> got(V);
    for (int i = 0; i < 24; i++) ASSERT_EQ(forge_eval(s, &toks[i], 1, 0, got.data(), V), FORGE_OK) << forge_session_errmsg(s);
    std::vector<int32_t> kept(forge_session_n_past(s));
    size_t nk = 0;
    ASSERT_EQ(forge_session_tokens(s, kept.data(), kept.size(), &nk), FORGE_OK);
    ASSERT_LT((int)nk, 24);
    EXPECT_TRUE(std::equal(kept.begin(), kept.begin() + 4, toks.begin()));
    forge_session *f = ft::session(m, 16, 8);
    ASSERT_NE(f, nullptr);
    std::vector<float> fresh(V);
    ASSERT_EQ(forge_eval(f, kept.data(), (int)nk, 0, fresh.data(), V), FORGE_OK) << forge_session_errmsg(f);
    EXPECT_LE(ft::rel_err(got.data(), fresh.data(), (size_t)V), 1e-5);
    forge_session_free(f);

    std::string dir = ft::tmpdir("gemma4_state");
    EXPECT_EQ(forge_session_save(s, (dir + "/s.safetensors").c_str()), FORGE_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(forge_session_errmsg(s)).find("architecture gemma4"), std::string::npos) << forge_session_errmsg(s);
    forge_keys_info info = ft::sized<forge_keys_info>();
    EXPECT_EQ(forge_session_keys(s, 0, nullptr, 0, &info), FORGE_ERR_UNSUPPORTED);
    forge_session_free(s);
    forge_train_params tp = forge_train_default_params();
    forge_memory_stats plan = ft::sized<forge_memory_stats>();
    EXPECT_EQ(forge_trainer_plan(m, &tp, &plan), FORGE_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(forge_model_errmsg(m)).find("training is not supported for architecture gemma4"), std::string::npos)
        << forge_model_errmsg(m);
    forge_model_free(m);
}

/* A qwen35 GGUF without one of the keys its linear layers need is refused, naming the key: each
 * key of the fixture renamed in turn (one letter changed in the file's bytes). */
TEST(ParityGGUFQwen35, MissingMetadataKeyIsNamed) {
    std::vector<uint8_t> bytes = ft::read_file(ft::src("tests/fixtures/gguf/qwen3_5_text_f32.gguf"));
    ASSERT_FALSE(bytes.empty());
    std::string dir = ft::tmpdir("gguf_qwen35_keys");
    for (const char *key : {"qwen35.ssm.conv_kernel", "qwen35.ssm.state_size", "qwen35.ssm.group_count", "qwen35.ssm.time_step_rank",
                            "qwen35.ssm.inner_size"}) {
        std::vector<uint8_t> b = bytes;
        auto at = std::search(b.begin(), b.end(), key, key + strlen(key));
        ASSERT_NE(at, b.end()) << key;
        at[strlen(key) - 1] ^= 0x20; /* the last letter's case: another key */
        std::string path = dir + "/renamed.gguf";
        ft::write_file(path, b.data(), b.size());
        forge_model *m = nullptr;
        EXPECT_EQ(forge_model_load(path.c_str(), nullptr, &m), FORGE_ERR_FORMAT) << key;
        std::string msg = forge_model_errmsg(m);
        EXPECT_NE(msg.find(std::string("metadata key '") + key + "' is missing"), std::string::npos) << msg;
        forge_model_free(m);
    }
}
