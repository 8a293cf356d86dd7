/* Quantized weights: every format's fused dequantizing kernels (matvec, matmul, embedding
 * gather) against a plain C++ reference dequantizer written from the formats' definitions
 * (ggml's block layouts; MLX's affine bit stream), on random blocks. */
#include "internal.h"
#include "util.h"

namespace {

ft_ctx *device() { return ft_device(); }

float h2f(uint16_t h) { return ft_f16_to_f32(h); }

struct Quant {
    std::vector<uint8_t> data, scales, biases;
    size_t row_bytes = 0, aux_row_bytes = 0;
    uint32_t bits = 0, group = 0, qflags = 0;
    std::vector<double> deq; /* [N, K] reference values */
    ft_weight weight(int fmt) const {
        return ft_weight{fmt, data.data(), row_bytes, scales.empty() ? nullptr : scales.data(),
                         biases.empty() ? nullptr : biases.data(), aux_row_bytes, bits, group, qflags};
    }
};

void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
uint16_t get16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

/* Random blocks of a ggml format, and their exact dequantization. */
Quant make_ggml(int fmt, uint32_t N, uint32_t K, uint32_t seed) {
    std::mt19937 g(seed);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> small(-0.05f, 0.05f), pos(0.001f, 0.02f);
    Quant q;
    uint32_t bsz = fmt == FT_Q4_0 ? 18 : fmt == FT_Q8_0 ? 34 : fmt == FT_Q4_K ? 144 : 210;
    uint32_t qk = fmt == FT_Q4_0 || fmt == FT_Q8_0 ? 32 : 256;
    q.row_bytes = (size_t)K / qk * bsz;
    q.data.resize(q.row_bytes * N);
    for (auto &b : q.data) b = (uint8_t)byte(g);
    q.deq.resize((size_t)N * K);
    for (uint32_t r = 0; r < N; r++)
        for (uint32_t b = 0; b < K / qk; b++) {
            uint8_t *x = &q.data[r * q.row_bytes + b * bsz];
            double *y = &q.deq[(size_t)r * K + b * qk];
            if (fmt == FT_Q4_0) {
                put16(x, ft_f32_to_f16(small(g)));
                double d = h2f(get16(x));
                for (int j = 0; j < 16; j++) {
                    y[j] = d * ((x[2 + j] & 15) - 8);
                    y[j + 16] = d * ((x[2 + j] >> 4) - 8);
                }
            } else if (fmt == FT_Q8_0) {
                put16(x, ft_f32_to_f16(small(g) * 0.1f));
                double d = h2f(get16(x));
                for (int j = 0; j < 32; j++) y[j] = d * (int8_t)x[2 + j];
            } else if (fmt == FT_Q4_K) {
                put16(x, ft_f32_to_f16(pos(g)));
                put16(x + 2, ft_f32_to_f16(pos(g)));
                float d = h2f(get16(x)), dmin = h2f(get16(x + 2));
                const uint8_t *sc = x + 4, *qs = x + 16;
                for (int j = 0; j < 8; j++) {
                    int s, m;
                    if (j < 4) { s = sc[j] & 63; m = sc[j + 4] & 63; }
                    else { s = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4); m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4); }
                    float d1 = d * s, m1 = dmin * m; /* ggml computes these in f32 */
                    for (int l = 0; l < 32; l++) {
                        int qv = j % 2 ? qs[32 * (j / 2) + l] >> 4 : qs[32 * (j / 2) + l] & 15;
                        y[32 * j + l] = (double)d1 * qv - m1;
                    }
                }
            } else {
                put16(x + 208, ft_f32_to_f16(pos(g) * 0.1f));
                float d = h2f(get16(x + 208));
                const uint8_t *ql = x, *qh = x + 128;
                const int8_t *sc = (const int8_t *)(x + 192);
                for (int n = 0; n < 2; n++)
                    for (int l = 0; l < 32; l++) {
                        int is = l / 16;
                        const uint8_t *L = ql + 64 * n, *Hh = qh + 32 * n;
                        const int8_t *S = sc + 8 * n;
                        int q1 = ((L[l] & 0xF) | (((Hh[l] >> 0) & 3) << 4)) - 32;
                        int q2 = ((L[l + 32] & 0xF) | (((Hh[l] >> 2) & 3) << 4)) - 32;
                        int q3 = ((L[l] >> 4) | (((Hh[l] >> 4) & 3) << 4)) - 32;
                        int q4 = ((L[l + 32] >> 4) | (((Hh[l] >> 6) & 3) << 4)) - 32;
                        y[128 * n + l] = (double)(d * S[is]) * q1;
                        y[128 * n + l + 32] = (double)(d * S[is + 2]) * q2;
                        y[128 * n + l + 64] = (double)(d * S[is + 4]) * q3;
                        y[128 * n + l + 96] = (double)(d * S[is + 6]) * q4;
                    }
            }
        }
    return q;
}

/* MLX affine: codes as a little-endian bit stream per row, scale and bias per group. */
Quant make_mlx(uint32_t N, uint32_t K, uint32_t bits, uint32_t group, bool bf16, uint32_t seed) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> sd(-0.02f, 0.02f), bd(-0.1f, 0.1f);
    Quant q;
    q.bits = bits;
    q.group = group;
    q.qflags = bf16;
    q.row_bytes = (size_t)K * bits / 8;
    q.aux_row_bytes = (size_t)K / group * 2;
    q.data.assign(q.row_bytes * N, 0);
    q.scales.resize(q.aux_row_bytes * N);
    q.biases.resize(q.aux_row_bytes * N);
    q.deq.resize((size_t)N * K);
    auto enc = [&](float v) { return bf16 ? ft_f32_to_bf16(v) : ft_f32_to_f16(v); };
    auto dec = [&](uint16_t h) { return bf16 ? ft_bf16_to_f32(h) : ft_f16_to_f32(h); };
    for (uint32_t r = 0; r < N; r++) {
        for (uint32_t gi = 0; gi < K / group; gi++) {
            put16(&q.scales[r * q.aux_row_bytes + 2 * gi], enc(sd(g)));
            put16(&q.biases[r * q.aux_row_bytes + 2 * gi], enc(bd(g)));
        }
        for (uint32_t k = 0; k < K; k++) {
            uint32_t code = g() & ((1u << bits) - 1);
            uint64_t bit = (uint64_t)k * bits;
            for (uint32_t b = 0; b < bits; b++, bit++)
                if (code >> b & 1) q.data[r * q.row_bytes + bit / 8] |= (uint8_t)(1u << (bit % 8));
            float s = dec(get16(&q.scales[r * q.aux_row_bytes + 2 * (k / group)]));
            float bi = dec(get16(&q.biases[r * q.aux_row_bytes + 2 * (k / group)]));
            q.deq[(size_t)r * K + k] = (double)(s * (float)code) + bi;
        }
    }
    return q;
}

void check_linear(const Quant &q, int fmt, uint32_t N, uint32_t K, const char *what) {
    for (uint32_t M : {1u, 3u, 40u}) {
        for (uint32_t chunk : {0u, 7u}) {
            std::vector<float> A = ft::randn((size_t)M * K, 1.0f, M + K), C((size_t)M * N, 0.0f), ref(C.size());
            for (uint32_t m = 0; m < M; m++)
                for (uint32_t n = 0; n < N; n++) {
                    double acc = 0;
                    for (uint32_t k = 0; k < K; k++) acc += (double)A[(size_t)m * K + k] * q.deq[(size_t)n * K + k];
                    ref[(size_t)m * N + n] = (float)acc;
                }
            ft_weight w = q.weight(fmt);
            ASSERT_EQ(ft_linear_w(device(), &w, A.data(), M, 0, M, K, N, chunk, nullptr, 0, 0, C.data(), N, 0, 0), FORGE_OK)
                << ft_errmsg(device());
            EXPECT_LT(ft::rel_err(C.data(), ref.data(), C.size()), 2e-6) << what << " M " << M << " chunk " << chunk;
            if (M > 8 && chunk == 0) { /* the 128-tile matmul */
                std::fill(C.begin(), C.end(), NAN);
                ASSERT_EQ(ft_matmul_big(device(), &w, A.data(), M, K, N, C.data()), FORGE_OK);
                EXPECT_LT(ft::rel_err(C.data(), ref.data(), C.size()), 2e-6) << what << " 128-tile matmul M " << M;
            }
            if (M > 8 && chunk == 0) { /* the tensor-core matmul, where the device has one: f16 operands */
                std::fill(C.begin(), C.end(), NAN);
                forge_status cst = ft_matmul_cm(device(), &w, A.data(), M, K, N, C.data());
                if (cst == FORGE_ERR_UNSUPPORTED) {
                    static bool said = false;
                    if (!said) printf("  (no cooperative-matrix matmul on this device: its check is skipped)\n");
                    said = true;
                } else {
                    ASSERT_EQ(cst, FORGE_OK);
                    EXPECT_LT(ft::rel_err(C.data(), ref.data(), C.size()), 3e-3) << what << " tensor cores M " << M;
                    /* split along k into partial sums, reduced with bias and residual (batch decode's path) */
                    std::vector<float> bias = ft::randn(N, 1.0f, 5), C0 = ft::randn(C.size(), 1.0f, 6), ref2(C.size());
                    for (size_t i = 0; i < C.size(); i++) ref2[i] = ref[i] + bias[i % N] + C0[i];
                    C = C0;
                    ASSERT_EQ(ft_matmul_split(device(), FT_SPLIT_CM, &w, A.data(), M, K, N, 3, bias.data(), FT_BIAS | FT_ACCUMULATE, 0.0f, C.data()), FORGE_OK);
                    EXPECT_LT(ft::rel_err(C.data(), ref2.data(), C.size()), 3e-3) << what << " tensor cores split along k, M " << M;
                }
            }
            if (M <= 8 && chunk == 0) /* both matvec kernels: shared-memory reduction and subgroup */
                for (int sg = 0; sg <= ft_has_subgroup_matvec(device()); sg++) {
                    std::fill(C.begin(), C.end(), NAN);
                    ASSERT_EQ(ft_matvec_kind(device(), &w, A.data(), M, K, N, C.data(), sg), FORGE_OK);
                    EXPECT_LT(ft::rel_err(C.data(), ref.data(), C.size()), 2e-6) << what << " M " << M << " subgroup " << sg;
                }
        }
    }
    /* the training backward product through the same stored weight: dX = dY . W */
    for (uint32_t chunk : {0u, 7u}) {
        const uint32_t M = 40;
        std::vector<float> dY = ft::randn((size_t)M * N, 1.0f, 77), dX((size_t)M * K, NAN), ref(dX.size());
        for (uint32_t m = 0; m < M; m++)
            for (uint32_t k = 0; k < K; k++) {
                double acc = 0;
                for (uint32_t n = 0; n < N; n++) acc += (double)dY[(size_t)m * N + n] * q.deq[(size_t)n * K + k];
                ref[(size_t)m * K + k] = (float)acc;
            }
        ft_weight w = q.weight(fmt);
        for (int big = 0; big < 2; big++) {
            std::fill(dX.begin(), dX.end(), NAN);
            ASSERT_EQ(ft_matmul_back(device(), &w, dY.data(), M, N, K, chunk, big, dX.data()), FORGE_OK) << ft_errmsg(device());
            EXPECT_LT(ft::rel_err(dX.data(), ref.data(), dX.size()), 2e-6) << what << " backward, chunk " << chunk << " big " << big;
        }
        /* ... on the tensor cores where the device has them: f16 operands, dY's rows scaled by
         * powers of two (a row of gradients around 1e-7, far under f16's normal range, as well as
         * one around 1) */
        std::vector<float> dYs = dY;
        for (uint32_t n = 0; n < N; n++) dYs[n] *= 1e-7f;
        for (size_t i = 0; i < K; i++) ref[i] *= 1e-7f;
        std::fill(dX.begin(), dX.end(), NAN);
        forge_status cst = ft_matmul_back(device(), &w, dYs.data(), M, N, K, chunk, 2, dX.data());
        if (cst != FORGE_ERR_UNSUPPORTED) {
            ASSERT_EQ(cst, FORGE_OK) << ft_errmsg(device());
            EXPECT_LT(ft::rel_err(dX.data(), ref.data(), dX.size()), 3e-3) << what << " backward on tensor cores, chunk " << chunk;
            EXPECT_LT(ft::rel_err(dX.data(), ref.data(), K), 3e-3) << what << " backward on tensor cores, the row of 1e-7, chunk " << chunk;
        }
    }
    /* mixture of experts: the weight's first 3 R rows as 3 experts of R rows; 5 tokens choose 2
     * each (one token twice the same); decode's per-pair matvec and prefill's grouped matmul, the
     * experts in one chunk and one a chunk; the grouped product in either tile size, and on the
     * tensor cores where the device has them (f16 operands); then the backward product */
    {
        const uint32_t E = 3, R = N / E, T = 5, top_k = 2;
        const std::vector<uint32_t> ex = {2, 0, 1, 2, 0, 0, 2, 1, 1, 0};
        std::vector<float> A = ft::randn((size_t)T * K, 1.0f, 31), C((size_t)T * top_k * R), ref(C.size());
        for (uint32_t p = 0; p < T * top_k; p++)
            for (uint32_t r = 0; r < R; r++) {
                double acc = 0;
                for (uint32_t k = 0; k < K; k++) acc += (double)A[(size_t)(p / top_k) * K + k] * q.deq[(size_t)(ex[p] * R + r) * K + k];
                ref[(size_t)p * R + r] = (float)acc;
            }
        ft_weight w = q.weight(fmt);
        for (int grouped : {0, 1, 2, 3, 4})
            for (uint32_t chunk : {0u, 1u}) {
                std::fill(C.begin(), C.end(), NAN);
                forge_status st = ft_experts(device(), &w, A.data(), T, K, E, R, top_k, ex.data(), chunk, grouped, C.data());
                if (st == FORGE_ERR_UNSUPPORTED) continue; /* (no subgroup arithmetic: decode takes another path) */
                ASSERT_EQ(st, FORGE_OK) << ft_errmsg(device());
                EXPECT_LT(ft::rel_err(C.data(), ref.data(), C.size()), grouped == 4 ? 3e-3 : 2e-6) << what << " experts, grouped " << grouped << " chunk " << chunk;
            }
        /* training's backward twin (matmul_back_moe): dX_p = dY . W_e(p), dY the pair's own row, or
         * the token's row times the pair's weight (down's input gradient) */
        std::vector<float> wts = ft::randn(T * top_k, 1.0f, 32);
        for (int per_token = 0; per_token < 2; per_token++) {
            uint32_t y_rows = per_token ? T : T * top_k;
            std::vector<float> dY = ft::randn((size_t)y_rows * R, 1.0f, 33), dX((size_t)T * top_k * K), dref(dX.size());
            for (uint32_t p = 0; p < T * top_k; p++)
                for (uint32_t k = 0; k < K; k++) {
                    double acc = 0;
                    uint32_t yr = per_token ? p / top_k : p;
                    for (uint32_t r = 0; r < R; r++) acc += (double)dY[(size_t)yr * R + r] * q.deq[(size_t)(ex[p] * R + r) * K + k];
                    dref[(size_t)p * K + k] = (float)(per_token ? acc * wts[p] : acc);
                }
            for (uint32_t chunk : {0u, 1u}) {
                std::fill(dX.begin(), dX.end(), NAN);
                ASSERT_EQ(ft_experts_back(device(), &w, dY.data(), T, K, E, R, top_k, ex.data(), wts.data(), per_token, chunk, dX.data()), FORGE_OK)
                    << ft_errmsg(device());
                EXPECT_LT(ft::rel_err(dX.data(), dref.data(), dX.size()), 2e-6) << what << " experts backward, per token " << per_token << " chunk " << chunk;
            }
        }
    }
    std::vector<uint32_t> toks = {0, N - 1, N / 2, 1};
    std::vector<float> out(toks.size() * K);
    ft_weight w = q.weight(fmt);
    ASSERT_EQ(ft_embed_w(device(), &w, toks.data(), (uint32_t)toks.size(), N, K, 5, 1.0f, 0, out.data()), FORGE_OK);
    for (size_t t = 0; t < toks.size(); t++)
        for (uint32_t k = 0; k < K; k++)
            ASSERT_NEAR(out[t * K + k], q.deq[(size_t)toks[t] * K + k], 1e-6 * (1 + std::fabs(q.deq[(size_t)toks[t] * K + k])))
                << what << " token " << toks[t] << " k " << k;
}

} // namespace

TEST(Quant, GgmlBlockFormatsMatchReferenceDequantizer) {
    ASSERT_NE(device(), nullptr);
    struct F { int fmt; const char *name; uint32_t K; };
    for (F f : {F{FT_Q4_0, "q4_0", 96}, F{FT_Q8_0, "q8_0", 160}, F{FT_Q4_K, "q4_k", 512}, F{FT_Q6_K, "q6_k", 512}}) {
        uint32_t N = 37;
        Quant q = make_ggml(f.fmt, N, f.K, 100 + f.fmt);
        check_linear(q, f.fmt, N, f.K, f.name);
    }
}

TEST(Quant, MlxAffineAllBitsAndGroups) {
    ASSERT_NE(device(), nullptr);
    for (uint32_t bits : {2u, 3u, 4u, 5u, 6u, 8u})
        for (uint32_t group : {32u, 64u, 128u}) {
            uint32_t N = 21, K = 256;
            Quant q = make_mlx(N, K, bits, group, (bits + group) % 2 == 0, bits * 1000 + group);
            std::string what = "mlx bits " + std::to_string(bits) + " group " + std::to_string(group);
            check_linear(q, FT_MLX, N, K, what.c_str());
        }
}

/* ../shared/quant-fixtures: GGUF files quantized by llama.cpp's own llama-quantize, with the
 * exact logits (f64 forward of the exactly dequantized weights) and llama.cpp's CPU logits.
 * Tolerances and the positions where argmax must match come from its expect.json. */
#include <cjson/cJSON.h>

namespace {

/* One file of the fixtures: its expect.json entry, tokens.json and the model, freed together. */
struct QuantFile {
    std::string dir = ft::shared("quant-fixtures/");
    cJSON *expect = nullptr, *tokens = nullptr, *file = nullptr;
    forge_model *m = nullptr;
    QuantFile() = default;
    QuantFile(const QuantFile &) = delete;
    QuantFile &operator=(const QuantFile &) = delete;
    ~QuantFile() {
        forge_model_free(m);
        cJSON_Delete(expect);
        cJSON_Delete(tokens);
    }
    std::vector<int32_t> sequence(int seq) const {
        std::vector<int32_t> toks;
        cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(tokens, seq ? "seq1" : "seq0")) toks.push_back(t->valueint);
        return toks;
    }
};

/* Reads the fixtures' JSON and loads file `name` ("f32", "q8_0", ...) into q. */
void open_quant_file(const std::string &name, QuantFile &q) {
    std::vector<uint8_t> ej = ft::read_file(q.dir + "expect.json"), tj = ft::read_file(q.dir + "tokens.json");
    ASSERT_FALSE(ej.empty()) << "missing " << q.dir << "expect.json (../shared beside the checkout)";
    q.expect = cJSON_ParseWithLength((const char *)ej.data(), ej.size());
    q.tokens = cJSON_ParseWithLength((const char *)tj.data(), tj.size());
    ASSERT_NE(q.expect, nullptr);
    ASSERT_NE(q.tokens, nullptr);
    q.file = cJSON_GetObjectItem(cJSON_GetObjectItem(q.expect, "files"), name.c_str());
    ASSERT_NE(q.file, nullptr);
    q.m = ft::load(q.dir + cJSON_GetStringValue(cJSON_GetObjectItem(q.file, "gguf")));
    ASSERT_NE(q.m, nullptr);
}

const int QUANT_VOCAB = 512;

/* got [n, 512]: the logits of sequence `seq` against the exact, llama.cpp and llama.cpp-f32kv
 * references, at each one's tolerance and argmax positions. `rounded` (int8 activations): the
 * exact reference is held to llama.cpp's tolerance instead, must differ from it (the rounding
 * ran), and its argmax positions (which assume exact products) are not checked. */
void check_against_refs(const QuantFile &q, const std::string &what, int seq, const std::vector<float> &got, bool rounded) {
    cJSON *refs = cJSON_GetObjectItem(q.file, "refs");
    double llama_tol = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(refs, "llamacpp"), seq), "tol_rel")->valuedouble;
    for (const char *kind : {"exact", "llamacpp", "llamacpp-f32kv"}) {
        cJSON *ref = cJSON_GetArrayItem(cJSON_GetObjectItem(refs, kind), seq);
        ASSERT_NE(ref, nullptr);
        std::vector<float> r = ft::read_f32(q.dir + cJSON_GetStringValue(cJSON_GetObjectItem(ref, "file")));
        ASSERT_EQ(r.size(), got.size());
        bool exact = strcmp(kind, "exact") == 0;
        double tol = rounded && exact ? llama_tol : cJSON_GetObjectItem(ref, "tol_rel")->valuedouble;
        double err = ft::rel_err(got.data(), r.data(), got.size());
        printf("  %-24s seq%d vs %-15s max|d|/max|ref| = %.2e (tolerance %.1e)\n", what.c_str(), seq, kind, err, tol);
        EXPECT_LE(err, tol) << what << " seq" << seq << " vs " << kind;
        if (rounded && exact) {
            EXPECT_GT(err, 1e-4) << "no rounding: the int8 path did not run";
            continue;
        }
        cJSON *am = cJSON_GetObjectItem(ref, "argmax"), *pos;
        cJSON_ArrayForEach(pos, cJSON_GetObjectItem(ref, "argmax_positions")) {
            int p = pos->valueint;
            EXPECT_EQ(ft::argmax(got.data() + (size_t)p * QUANT_VOCAB, QUANT_VOCAB), cJSON_GetArrayItem(am, p)->valueint)
                << what << " seq" << seq << " vs " << kind << " position " << p;
        }
    }
}

} // namespace

class QuantFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantFixture, MatchesExactAndLlamaCpp) {
    QuantFile q;
    ASSERT_NO_FATAL_FAILURE(open_quant_file(GetParam(), q));
    forge_model_info info = ft::sized<forge_model_info>();
    forge_model_get_info(q.m, &info);
    /* packed on the device: weight bytes are the file's tensor bytes, not the dequantized size */
    EXPECT_LE(info.weight_bytes, (uint64_t)cJSON_GetObjectItem(q.file, "bytes")->valuedouble);
    forge_memory_stats mem = ft::model_memory(q.m);
    EXPECT_GE(mem.device_in_use_bytes, info.weight_bytes);
    EXPECT_LE(mem.device_in_use_bytes, info.weight_bytes + info.weight_bytes / 4 + 65536);
    forge_session *s = nullptr;
    ASSERT_EQ(forge_session_create(q.m, nullptr, &s), FORGE_OK);
    for (int seq = 0; seq < 2; seq++) {
        std::vector<int32_t> toks = q.sequence(seq);
        int n = (int)toks.size();
        std::vector<float> got((size_t)n * QUANT_VOCAB);
        ASSERT_EQ(forge_session_truncate(s, 0), FORGE_OK);
        ASSERT_EQ(forge_eval(s, toks.data(), n, FORGE_EVAL_ALL_LOGITS, got.data(), got.size()), FORGE_OK) << forge_session_errmsg(s);
        check_against_refs(q, GetParam(), seq, got, false);
    }
    forge_session_free(s);
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, QuantFixture, ::testing::Values("f32", "q8_0", "q4_0", "q4_k_m", "q6_k"));

class Int8Activations : public ::testing::TestWithParam<std::string> {};

/* The decode products of Q8_0 and Q4_0 weights on int8 activations (act_q8.comp +
 * matvec_q8a.comp, GPUs' default), switched on here so lavapipe runs them too: every token
 * evaluated alone (the one-token path), logits against llama.cpp's own (which rounds its
 * activations to 8 bits the same way) and the exact reference, at the fixture's llama.cpp
 * tolerance and argmax positions. The error against the exact logits must not be zero: the
 * rounded path really ran; and the kernels that ran are counted from the session's profile.
 * Three times: with an act_q8 dispatch before each product, then as the default chain whose
 * products quantize their outputs for the next (matvec_q8a's Q8_OUT, in groups of 8), then the
 * chain with the gated gate|up taking two outputs a subgroup (matvec_q8a_pair_*, 16 outputs a
 * workgroup: two groups of 8), then steps of 5 tokens (5, 5, 2: matvec_q8a_rows, each output's
 * weights read once for the step's rows), the last three held to the same references and to the
 * first run's logits at llama.cpp's tolerance. Row pairs are off in the first two runs. */
TEST_P(Int8Activations, DecodeMatchesLlamaCpp) {
    std::string name = GetParam();
    QuantFile q;
    ASSERT_NO_FATAL_FAILURE(open_quant_file(name, q));
    if (!ft_model_set_act_q8(q.m, 1)) GTEST_SKIP() << "the device has no integer dot products";
    std::vector<float> first;
    for (int run = 0; run < 4; run++) {
        bool chain = run > 0, pairs = run == 2, rows = run == 3;
        SCOPED_TRACE(rows ? "steps of 5 tokens" : pairs ? "the chain, gated outputs in pairs" : chain ? "the chain" : "act_q8 dispatches");
        ft_model_set_q8_chain(q.m, chain);
        ft_model_set_matvec_pairs(q.m, pairs ? 2 : 0);
        forge_session_params sp = forge_session_default_params();
        sp.profile = 1;
        forge_session *s = nullptr;
        ASSERT_EQ(forge_session_create(q.m, &sp, &s), FORGE_OK);
        int steps = 0;
        std::vector<float> all;
        for (int seq = 0; seq < 2; seq++) {
            std::vector<int32_t> toks = q.sequence(seq);
            int n = (int)toks.size();
            steps += n;
            std::vector<float> got((size_t)n * QUANT_VOCAB);
            ASSERT_EQ(forge_session_truncate(s, 0), FORGE_OK);
            for (int i = 0, step = 1; i < n; i += step) {
                step = rows ? std::min(5, n - i) : 1;
                ASSERT_EQ(forge_eval(s, &toks[i], step, rows ? FORGE_EVAL_ALL_LOGITS : 0, got.data() + (size_t)i * QUANT_VOCAB,
                                     (size_t)step * QUANT_VOCAB),
                          FORGE_OK)
                    << forge_session_errmsg(s);
            }
            check_against_refs(q, name + " int8 activations", seq, got, true);
            all.insert(all.end(), got.begin(), got.end());
        }
        if (chain) {
            ASSERT_EQ(all.size(), first.size());
            double err = ft::rel_err(all.data(), first.data(), all.size());
            printf("  %s against act_q8 dispatches: max|d|/max|ref| = %.2e\n", rows ? "steps of 5" : pairs ? "the chain (gated pairs)" : "the chain", err);
            cJSON *ref = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(q.file, "refs"), "llamacpp"), 0);
            EXPECT_LE(err, cJSON_GetObjectItem(ref, "tol_rel")->valuedouble);
        } else {
            first = all;
        }
        /* per token and layer without the chain: act_q8 before q|k|v, gate|up and down (the o
         * projection's input comes quantized from the attention's merge), and one before the
         * head; with it, the first layer's q|k|v and the head's */
        std::vector<char> prof(1 << 16);
        size_t len = 0;
        ASSERT_EQ(forge_session_profile(s, prof.data(), prof.size(), &len), FORGE_OK);
        cJSON *pj = cJSON_Parse(prof.data());
        ASSERT_NE(pj, nullptr);
        const int layers = 2;
        double act_calls = cJSON_GetObjectItem(cJSON_GetObjectItem(pj, "act_q8"), "calls")->valuedouble;
        if (rows) { /* act_q8 before every product (a grid layer a row), q|k|v, o, gate|up, down and the head's */
            EXPECT_EQ(act_calls, 7.0 * (layers * 4 + 1)) << prof.data(); /* 7 steps: 5, 5, 2 and 5, 5, 5, 5 */
            EXPECT_NE(cJSON_GetObjectItem(pj, ("matvec_q8a_rows_" + name).c_str()), nullptr) << prof.data();
            cJSON_Delete(pj);
            forge_session_free(s);
            continue;
        }
        EXPECT_EQ(act_calls, (double)steps * (chain ? 2 : layers * 3 + 1)) << prof.data();
        EXPECT_NE(cJSON_GetObjectItem(pj, name == "q4_0" ? "matvec_q8a_q4_0" : "matvec_q8a_q8_0"), nullptr) << prof.data();
        /* the gate|up product's kernel: on the attention's quantized output (g8), quantizing its own */
        EXPECT_EQ(cJSON_GetObjectItem(pj, ("matvec_q8a_pair_g8_out_" + name).c_str()) != nullptr, pairs) << prof.data();
        cJSON_Delete(pj);
        forge_session_free(s);
    }
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, Int8Activations, ::testing::Values("q8_0", "q4_0"));

class HostProducts : public ::testing::TestWithParam<std::string> {};

namespace {
/* Both sequences' logits [n, 512] evaluated in steps of `step` tokens (each step's logits
 * kept) on a new session of q.m; the products the session ran on the host in *host_ops. */
std::vector<float> eval_in_steps(const QuantFile &q, int step, int *host_ops) {
    std::vector<float> all;
    forge_session *s = nullptr;
    EXPECT_EQ(forge_session_create(q.m, nullptr, &s), FORGE_OK);
    if (!s) return all;
    for (int seq = 0; seq < 2; seq++) {
        std::vector<int32_t> toks = q.sequence(seq);
        int n = (int)toks.size();
        std::vector<float> got((size_t)n * QUANT_VOCAB);
        EXPECT_EQ(forge_session_truncate(s, 0), FORGE_OK);
        for (int i = 0; i < n; i += step) {
            int k = std::min(step, n - i);
            EXPECT_EQ(forge_eval(s, &toks[i], k, FORGE_EVAL_ALL_LOGITS, got.data() + (size_t)i * QUANT_VOCAB, (size_t)k * QUANT_VOCAB), FORGE_OK)
                << forge_session_errmsg(s);
        }
        all.insert(all.end(), got.begin(), got.end());
    }
    *host_ops = ft_session_host_ops(s);
    forge_session_free(s);
    return all;
}

/* all = both sequences' logits, checked against the fixture's references one sequence at a time */
void check_both_against_refs(const QuantFile &q, const std::string &what, const std::vector<float> &all, bool rounded) {
    size_t n0 = q.sequence(0).size() * QUANT_VOCAB;
    check_against_refs(q, what, 0, std::vector<float>(all.begin(), all.begin() + n0), rounded);
    check_against_refs(q, what, 1, std::vector<float>(all.begin() + n0, all.end()), rounded);
}
} // namespace

/* Products on the host (src/host.c, a CPU device's default for weights of 256 KiB and more),
 * switched on here for every product of the fixture's F32 / Q8_0 / Q4_0 weights, with f32
 * activations and (Q8_0, Q4_0) on int8 ones, the default unless the model is exact:
 * - one token at a time (matvec_sg's twins): f32 as strictly as the kernels (QuantFixture) and
 *   within 1e-5 of the kernels' own one-token logits; int8 at llama.cpp's tolerance, against the
 *   exact reference too, which they must differ from (the rounding ran);
 * - the whole sequence in one step, and in steps of 5 (matmul's twins, several rows): against
 *   the same references, and against the one-token host run of the same activations within
 *   1e-5 (f32) or 1e-3 (int8: the products give a row the same sums whatever the rows, but
 *   prefill's attention rounds apart from decode's, and a code can flip);
 * each recording runs every layer's four products (q|k|v, o, gate|up, down) and the head's. */
TEST_P(HostProducts, MatchTheKernels) {
    QuantFile q;
    ASSERT_NO_FATAL_FAILURE(open_quant_file(GetParam(), q));
    if (!ft_model_set_host_products(q.m, 1, 0)) GTEST_SKIP() << "host products run on CPU devices only";
    bool quantized = GetParam() != "f32";
    double llama_tol = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(q.file, "refs"), "llamacpp"), 0),
                                           "tol_rel")->valuedouble;
    int ops = 0;
    ft_model_set_host_products(q.m, 0, 0);
    std::vector<float> kernels = eval_in_steps(q, 1, &ops);
    EXPECT_EQ(ops, 0);
    for (int q8 = 0; q8 <= (quantized ? 1 : 0); q8++) {
        SCOPED_TRACE(q8 ? "int8 activations" : "f32 activations");
        ft_model_set_host_products(q.m, 1, 0);
        ASSERT_TRUE(ft_model_set_host_q8(q.m, q8));
        std::string what = GetParam() + (q8 ? " host int8" : " host f32");
        std::vector<float> one = eval_in_steps(q, 1, &ops);
        EXPECT_TRUE(ops > 0 && ops % (2 * 4 + 1) == 0) << ops;
        check_both_against_refs(q, what, one, q8);
        double err = ft::rel_err(one.data(), kernels.data(), kernels.size());
        printf("  %s, one token a step, vs the kernels: max|d|/max|ref| = %.2e\n", what.c_str(), err);
        EXPECT_LE(err, q8 ? llama_tol : 1e-5);
        for (int step : {64, 5}) {
            SCOPED_TRACE(step);
            std::vector<float> rows = eval_in_steps(q, step, &ops);
            EXPECT_TRUE(ops > 0 && ops % (2 * 4 + 1) == 0) << ops;
            check_both_against_refs(q, what + (step == 5 ? " steps of 5" : " whole prompt"), rows, q8);
            err = ft::rel_err(rows.data(), one.data(), one.size());
            printf("  %s, steps of %d, vs one token a step: max|d|/max|ref| = %.2e\n", what.c_str(), step, err);
            EXPECT_LE(err, q8 ? 1e-3 : 1e-5);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, HostProducts, ::testing::Values("f32", "q8_0", "q4_0"));

/* The host products' dot products: the portable form and the one this CPU runs (AVX2 + FMA +
 * F16C where it has them) on random rows of every format, against a double sum of the same
 * dequantized weights; K leaves a tail past the vector loops for the plain formats. Q4_0 and
 * Q8_0 also on int8 activations, 4 rows at once and one at a time. */
TEST(HostProducts, DotFormsAgree) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int fmt = 0; fmt <= 4; fmt++) {
        SCOPED_TRACE(fmt);
        uint32_t K = fmt >= 3 ? 1024 : 1003;
        std::vector<float> x(K), wf(K);
        for (float &v : x) v = u(rng);
        std::vector<uint8_t> w;
        auto half = [](float f) { return ft_f32_to_f16(f); };
        if (fmt == 0) {
            for (float &v : wf) v = u(rng);
            w.resize(4 * K);
            memcpy(w.data(), wf.data(), 4 * K);
        } else if (fmt == 1 || fmt == 2) {
            for (uint32_t k = 0; k < K; k++) {
                float v = u(rng);
                uint16_t h;
                if (fmt == 1) {
                    h = half(v);
                    wf[k] = ft_f16_to_f32(h);
                } else {
                    uint32_t b;
                    memcpy(&b, &v, 4);
                    h = (uint16_t)(b >> 16);
                    b = (uint32_t)h << 16;
                    memcpy(&wf[k], &b, 4);
                }
                w.push_back((uint8_t)h);
                w.push_back((uint8_t)(h >> 8));
            }
        } else {
            for (uint32_t b = 0; b < K / 32; b++) {
                uint16_t d = half(0.01f + 0.1f * (u(rng) + 1.0f));
                float df = ft_f16_to_f32(d);
                w.push_back((uint8_t)d);
                w.push_back((uint8_t)(d >> 8));
                if (fmt == 3) {
                    for (int j = 0; j < 16; j++) {
                        uint8_t byte = (uint8_t)(rng() & 255);
                        w.push_back(byte);
                        wf[32 * b + j] = df * (float)((byte & 15) - 8);
                        wf[32 * b + 16 + j] = df * (float)((byte >> 4) - 8);
                    }
                } else {
                    for (int j = 0; j < 32; j++) {
                        int8_t q = (int8_t)(rng() & 255);
                        w.push_back((uint8_t)q);
                        wf[32 * b + j] = df * (float)q;
                    }
                }
            }
        }
        double want = 0, scale = 0;
        for (uint32_t k = 0; k < K; k++) {
            want += (double)wf[k] * x[k];
            scale += fabs((double)wf[k] * x[k]);
        }
        float plain = 0, fast = 0;
        int vector = ft_host_dot(fmt, w.data(), x.data(), K, &plain, &fast);
        printf("  format %d: plain %.6f, %s %.6f, double %.6f\n", fmt, plain, vector ? "vector" : "(no vector form)", fast, want);
        EXPECT_NEAR(plain, want, 1e-5 * scale);
        EXPECT_NEAR(fast, want, 1e-5 * scale);
        if (fmt < 3) continue;
        /* int8 activations: 4 rows (x, -x / 3, x^2, x rolled by 5), each rounded to int8 blocks;
         * against a double sum of the weights times the rounded rows (recomputed here as
         * act_q8.comp rounds), and each row's result the same alone as among 4 */
        const uint32_t R = 4;
        std::vector<float> xs(R * K);
        for (uint32_t k = 0; k < K; k++) {
            xs[k] = x[k];
            xs[K + k] = -x[k] / 3;
            xs[2 * K + k] = x[k] * x[k];
            xs[3 * K + k] = x[(k + 5) % K];
        }
        float p4[R], f4[R];
        ft_host_dot_q8(fmt, w.data(), xs.data(), K, R, p4, f4);
        for (uint32_t r = 0; r < R; r++) {
            const float *xr = xs.data() + r * K;
            double want8 = 0, scale8 = 0;
            for (uint32_t b = 0; b < K / 32; b++) {
                float amax = 0;
                for (int j = 0; j < 32; j++) amax = std::max(amax, std::fabs(xr[32 * b + j]));
                float id = amax > 0 ? 127.0f / amax : 0.0f, d = amax / 127.0f;
                for (int j = 0; j < 32; j++) {
                    double v = (double)wf[32 * b + j] * d * std::round(xr[32 * b + j] * id);
                    want8 += v;
                    scale8 += std::fabs(v);
                }
            }
            float p1, f1;
            ft_host_dot_q8(fmt, w.data(), xr, K, 1, &p1, &f1);
            printf("  format %d int8 row %u: plain %.6f, fast %.6f, double %.6f\n", fmt, r, p4[r], f4[r], want8);
            EXPECT_NEAR(p4[r], want8, 1e-5 * scale8);
            EXPECT_NEAR(f4[r], want8, 1e-5 * scale8);
            EXPECT_EQ(p1, p4[r]) << "row " << r;
            EXPECT_EQ(f1, f4[r]) << "row " << r;
        }
    }
}

/* A model's prefill with its attention on the tensor cores (attention_cm.comp, the default where
 * the device has them) against the same prefill on attention_tiled, over an f16 cache and over a
 * q8_0 one (staged into f16 tiles): the fixture's 64-element heads, both sequences' logits (12
 * and 20 tokens: a subgroup's 16 rows stored whole, and partial ones), which must differ (q and P
 * are rounded to f16, and q8_0's q d too) by less than 1% of the largest; the profile names the
 * kernels that ran. */
TEST(TensorCores, PrefillAttentionMatchesTheTiledKernel) {
    QuantFile q;
    ASSERT_NO_FATAL_FAILURE(open_quant_file("q8_0", q));
    forge_model_free(q.m); /* loaded again as users load it: not `exact`, so the tensor cores may run */
    q.m = ft::load(q.dir + cJSON_GetStringValue(cJSON_GetObjectItem(q.file, "gguf")), 0, 0, 0);
    ASSERT_NE(q.m, nullptr);
    if (!ft_model_set_attn_cm(q.m, 1)) GTEST_SKIP() << "the device has no tensor cores";
    for (forge_kv_type kv : {FORGE_KV_F16, FORGE_KV_Q8_0}) {
        const std::string suffix = kv == FORGE_KV_Q8_0 ? "_kv8" : "_kv16";
        SCOPED_TRACE(suffix);
        std::vector<float> logits[2];
        for (int cm = 0; cm < 2; cm++) {
            ft_model_set_attn_cm(q.m, cm);
            forge_session_params sp = forge_session_default_params();
            sp.profile = 1;
            sp.kv_type = kv;
            forge_session *s = nullptr;
            ASSERT_EQ(forge_session_create(q.m, &sp, &s), FORGE_OK) << forge_model_errmsg(q.m);
            for (int seq = 0; seq < 2; seq++) {
                std::vector<int32_t> toks = q.sequence(seq);
                std::vector<float> got(toks.size() * QUANT_VOCAB);
                ASSERT_EQ(forge_session_truncate(s, 0), FORGE_OK);
                ASSERT_EQ(forge_eval(s, toks.data(), (int)toks.size(), FORGE_EVAL_ALL_LOGITS, got.data(), got.size()), FORGE_OK)
                    << forge_session_errmsg(s);
                logits[cm].insert(logits[cm].end(), got.begin(), got.end());
            }
            std::vector<char> prof(1 << 16);
            size_t len = 0;
            ASSERT_EQ(forge_session_profile(s, prof.data(), prof.size(), &len), FORGE_OK);
            cJSON *pj = cJSON_Parse(prof.data());
            ASSERT_NE(pj, nullptr);
            const std::string cm_name = kv == FORGE_KV_Q8_0 ? "attention_cm_d64_kv8" : "attention_cm_d64";
            EXPECT_EQ(cJSON_GetObjectItem(pj, cm_name.c_str()) != nullptr, cm == 1) << prof.data();
            EXPECT_EQ(cJSON_GetObjectItem(pj, ("attention_tiled" + suffix).c_str()) != nullptr, cm == 0) << prof.data();
            cJSON_Delete(pj);
            forge_session_free(s);
        }
        double err = ft::rel_err(logits[1].data(), logits[0].data(), logits[0].size());
        printf("  tensor-core attention vs attention_tiled, %s cache: max|d|/max|ref| = %.2e\n", suffix.c_str() + 1, err);
        EXPECT_LT(err, 1e-2);
        EXPECT_GT(err, 0.0) << "the same logits: the tensor-core kernel did not run";
    }
}

namespace {

/* Batch decode's tensor-core products of f16 weights (matmul_cm's 32 x 64 tiles, W's fragments
 * read straight from memory), whole and split along k, with bias and residual, against a double
 * reference on the same f16 weights: rows 9 and 32, a partial last tile (N = 80), 3 k steps. */
TEST(TensorCores, BatchRowsOfF16Weights) {
    const uint32_t K = 192, N = 80;
    std::vector<float> wf = ft::randn((size_t)N * K, 0.5f, 11);
    std::vector<uint16_t> wh(wf.size());
    for (size_t i = 0; i < wf.size(); i++) wh[i] = ft_f32_to_f16(wf[i]);
    ft_weight w = {FT_F16, wh.data(), 2ull * K, nullptr, nullptr, 0, 0, 0, 0};
    std::vector<float> bias = ft::randn(N, 1.0f, 12);
    for (uint32_t M : {9u, 32u}) {
        std::vector<float> A = ft::randn((size_t)M * K, 1.0f, M), C0 = ft::randn((size_t)M * N, 1.0f, 13), ref(C0.size());
        for (uint32_t m = 0; m < M; m++)
            for (uint32_t n = 0; n < N; n++) {
                double acc = C0[(size_t)m * N + n] + bias[n];
                for (uint32_t k = 0; k < K; k++) acc += (double)A[(size_t)m * K + k] * ft_f16_to_f32(wh[(size_t)n * K + k]);
                ref[(size_t)m * N + n] = (float)acc;
            }
        for (uint32_t splits : {1u, 3u}) {
            std::vector<float> C = C0;
            forge_status st = ft_matmul_split(device(), FT_SPLIT_CM_SKINNY, &w, A.data(), M, K, N, splits, bias.data(), FT_BIAS | FT_ACCUMULATE, 0.0f, C.data());
            if (st == FORGE_ERR_UNSUPPORTED) GTEST_SKIP() << "no cooperative-matrix matmul on this device";
            ASSERT_EQ(st, FORGE_OK) << ft_errmsg(device());
            EXPECT_LT(ft::rel_err(C.data(), ref.data(), C.size()), 3e-3) << "M " << M << " splits " << splits;
        }
    }
}

/* A product split along k into partial sums and added up by linear_reduce.comp (batch decode's
 * and the tensor cores' few-tile path): with bias, soft-cap and residual, N a multiple of 4
 * (vec4 sums) and not (one output a thread), weights in F16, BF16 and F32 (matmul_cm reads the
 * first two as stored, converts the third), against a double reference; SIMT tiles on every
 * device, the tensor cores' where there are some. */
TEST(SplitK, PartialSumsAddUpWithTheEpilogue) {
    ASSERT_NE(device(), nullptr);
    const uint32_t K = 320;
    const float cap = 3.0f;
    for (int fmt : {FT_F16, FT_BF16, FT_F32})
        for (uint32_t N : {80u, 37u}) {
            std::vector<float> wf = ft::randn((size_t)N * K, 0.1f, 21);
            std::vector<uint16_t> wh(wf.size());
            for (size_t i = 0; i < wf.size(); i++) {
                wh[i] = fmt == FT_BF16 ? ft_f32_to_bf16(wf[i]) : ft_f32_to_f16(wf[i]);
                if (fmt != FT_F32) wf[i] = fmt == FT_BF16 ? ft_bf16_to_f32(wh[i]) : ft_f16_to_f32(wh[i]);
            }
            ft_weight w = {fmt, fmt == FT_F32 ? (const void *)wf.data() : (const void *)wh.data(), (fmt == FT_F32 ? 4ull : 2ull) * K,
                           nullptr, nullptr, 0, 0, 0, 0};
            std::vector<float> bias = ft::randn(N, 1.0f, 22);
            for (uint32_t M : {3u, 40u}) {
                std::vector<float> A = ft::randn((size_t)M * K, 1.0f, 23 + M), C0 = ft::randn((size_t)M * N, 1.0f, 24), ref(C0.size());
                for (uint32_t m = 0; m < M; m++)
                    for (uint32_t n = 0; n < N; n++) {
                        double acc = bias[n];
                        for (uint32_t k = 0; k < K; k++) acc += (double)A[(size_t)m * K + k] * wf[(size_t)n * K + k];
                        ref[(size_t)m * N + n] = (float)(std::tanh(acc / cap) * cap + C0[(size_t)m * N + n]);
                    }
                for (int kind : {FT_SPLIT_SIMT, FT_SPLIT_CM})
                    for (uint32_t splits : {1u, 3u}) {
                        std::vector<float> C = C0;
                        forge_status st = ft_matmul_split(device(), kind, &w, A.data(), M, K, N, splits, bias.data(),
                                                          FT_BIAS | FT_ACCUMULATE | FT_SOFTCAP, cap, C.data());
                        if (st == FORGE_ERR_UNSUPPORTED) continue; /* no tensor cores here */
                        ASSERT_EQ(st, FORGE_OK) << ft_errmsg(device());
                        EXPECT_LT(ft::rel_err(C.data(), ref.data(), C.size()), kind == FT_SPLIT_SIMT ? 2e-6 : 3e-3)
                            << "fmt " << fmt << " N " << N << " M " << M << " kind " << kind << " splits " << splits;
                    }
            }
        }
}

}  // namespace

/* A mixture of experts' prefill with the experts' products on the tensor cores
 * (matmul_cm_moe: the default where the device has them) against the exact model's (matmul_moe
 * in f32, every other product too): the Qwen 3.5 MoE fixture's logits at all 40 positions of a
 * prompt differ by the f16 rounding of the products' inputs, under 2% of the largest; the
 * profile names the kernel. */
TEST(TensorCores, ExpertProductsMatchTheExactPrefill) {
    const std::string path = ft::src("tests/fixtures/parity/qwen3_5_moe_f32");
    forge_model *fast = ft::load(path, 0, 0, 0), *exact = ft::load(path);
    ASSERT_TRUE(fast && exact);
    if (!ft_model_set_attn_cm(fast, 1)) {
        forge_model_free(fast);
        forge_model_free(exact);
        GTEST_SKIP() << "the device has no tensor cores";
    }
    const int V = forge_model_n_vocab(exact), T = 40;
    std::vector<int32_t> toks;
    for (int i = 0; i < T; i++) toks.push_back((i * 37 + 11) % V);
    std::vector<float> logits[2];
    forge_model *ms[2] = {exact, fast};
    for (int i = 0; i < 2; i++) {
        forge_session_params sp = forge_session_default_params();
        sp.profile = 1;
        forge_session *s = nullptr;
        ASSERT_EQ(forge_session_create(ms[i], &sp, &s), FORGE_OK);
        logits[i].resize((size_t)T * V);
        ASSERT_EQ(forge_eval(s, toks.data(), T, FORGE_EVAL_ALL_LOGITS, logits[i].data(), logits[i].size()), FORGE_OK) << forge_session_errmsg(s);
        std::vector<char> prof(1 << 16);
        size_t len = 0;
        ASSERT_EQ(forge_session_profile(s, prof.data(), prof.size(), &len), FORGE_OK);
        cJSON *pj = cJSON_Parse(prof.data());
        ASSERT_NE(pj, nullptr);
        EXPECT_EQ(cJSON_GetObjectItem(pj, "matmul_cm_moe_f32") != nullptr, i == 1) << prof.data();
        cJSON_Delete(pj);
        forge_session_free(s);
    }
    double err = ft::rel_err(logits[1].data(), logits[0].data(), logits[0].size());
    printf("  experts on tensor cores vs the exact prefill: max|d|/max|ref| = %.2e\n", err);
    EXPECT_LT(err, 2e-2);
    EXPECT_GT(err, 0.0) << "the same logits: the tensor cores did not run";
    forge_model_free(fast);
    forge_model_free(exact);
}
