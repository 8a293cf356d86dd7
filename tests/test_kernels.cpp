/* Every forward kernel against a plain C reference, through forge's own op table and recorder
 * (tests/internal.c). Shapes are chosen to hit the edge cases: K not a multiple of 8, several
 * weight chunks, M just above and below the matvec limit, GQA, windows, rotating slots. */
#include "internal.h"
#include "util.h"

#include <memory>

namespace {

struct Ctx {
    ft_ctx *c = nullptr;
    std::string err;
    Ctx() {
        char e[512] = {0};
        c = ft_open(e, sizeof e);
        err = e;
    }
    ~Ctx() { ft_close(c); }
};

Ctx &ctx() {
    static Ctx c;
    return c;
}

#define NEED_DEVICE()                                                              \
    ASSERT_NE(ctx().c, nullptr) << "no Vulkan device: " << ctx().err;

/* Weights stored in a format, and the exact f32 values the kernel should see (Q8_0: blocks of
 * 32 along the rows, n a multiple of 32). */
struct Weights {
    std::vector<uint8_t> bytes;
    std::vector<float> values;
};

Weights make_weights(int fmt, size_t n, uint32_t seed) {
    Weights w;
    std::vector<float> v = ft::randn(n, 0.5f, seed);
    w.values.resize(n);
    if (fmt == FT_F32) {
        w.bytes.resize(n * 4);
        memcpy(w.bytes.data(), v.data(), n * 4);
        w.values = v;
    } else if (fmt == FT_Q8_0) { /* f16 scale d = max |v| / 127, then 32 codes round(v / d) */
        w.bytes.resize(n / 32 * 34);
        for (size_t b = 0; b < n / 32; b++) {
            float amax = 0;
            for (int i = 0; i < 32; i++) amax = std::max(amax, std::fabs(v[32 * b + i]));
            uint16_t h = ft_f32_to_f16(amax / 127.0f);
            float d = ft_f16_to_f32(h);
            memcpy(&w.bytes[34 * b], &h, 2);
            for (int i = 0; i < 32; i++) {
                int q = d > 0 ? std::max(-127, std::min(127, (int)std::lround(v[32 * b + i] / d))) : 0;
                w.bytes[34 * b + 2 + i] = (uint8_t)(int8_t)q;
                w.values[32 * b + i] = d * (float)q;
            }
        }
    } else {
        w.bytes.resize(n * 2);
        for (size_t i = 0; i < n; i++) {
            uint16_t h = fmt == FT_F16 ? ft_f32_to_f16(v[i]) : ft_f32_to_bf16(v[i]);
            memcpy(&w.bytes[2 * i], &h, 2);
            w.values[i] = fmt == FT_F16 ? ft_f16_to_f32(h) : ft_bf16_to_f32(h);
        }
    }
    return w;
}

} // namespace

struct LinearCase {
    int fmt;
    uint32_t M, K, N, chunk;
    int force_matmul;
    uint32_t flags;
};

class KernelLinear : public ::testing::TestWithParam<LinearCase> {};

TEST_P(KernelLinear, MatchesReference) {
    NEED_DEVICE();
    LinearCase p = GetParam();
    uint32_t a_rows = p.M + 3, a_row0 = 2, ldc = p.N + 5, c_col0 = 3;
    std::vector<float> A = ft::randn((size_t)a_rows * p.K, 1.0f, 1);
    Weights W = make_weights(p.fmt, (size_t)p.N * p.K, 2);
    std::vector<float> bias = ft::randn(c_col0 + p.N, 1.0f, 3);
    std::vector<float> C = ft::randn((size_t)p.M * ldc, 1.0f, 4), ref = C;
    float cap = 3.0f;
    for (uint32_t m = 0; m < p.M; m++)
        for (uint32_t n = 0; n < p.N; n++) {
            double acc = 0;
            for (uint32_t k = 0; k < p.K; k++) acc += (double)A[(size_t)(a_row0 + m) * p.K + k] * W.values[(size_t)n * p.K + k];
            if (p.flags & FT_BIAS) acc += bias[c_col0 + n];
            if (p.flags & FT_SOFTCAP) acc = std::tanh(acc / cap) * cap;
            float &r = ref[(size_t)m * ldc + c_col0 + n];
            r = (p.flags & FT_ACCUMULATE) ? r + (float)acc : (float)acc;
        }
    ASSERT_EQ(ft_linear(ctx().c, p.fmt, A.data(), a_rows, a_row0, p.M, p.K, W.bytes.data(), p.N, p.chunk, bias.data(), p.flags, cap,
                        C.data(), ldc, c_col0, p.force_matmul),
              FORGE_OK)
        << ft_errmsg(ctx().c);
    EXPECT_LT(ft::rel_err(C.data(), ref.data(), C.size()), 2e-6);
    /* The plain product of the same rows (no bias, accumulation or soft-cap), for the kernels
     * below that forge picks by shape: A0 [M, K], R0 = A0 . W^T [M, N] in f64. */
    ft_weight w = {p.fmt, W.bytes.data(), (size_t)(p.fmt == FT_F32 ? 4 : 2) * p.K, nullptr, nullptr, 0, 0, 0, 0};
    std::vector<float> A0(A.begin() + (size_t)a_row0 * p.K, A.begin() + (size_t)(a_row0 + p.M) * p.K), C0((size_t)p.M * p.N), R0(C0.size());
    for (uint32_t m = 0; m < p.M; m++)
        for (uint32_t n = 0; n < p.N; n++) {
            double acc = 0;
            for (uint32_t k = 0; k < p.K; k++) acc += (double)A0[(size_t)m * p.K + k] * W.values[(size_t)n * p.K + k];
            R0[(size_t)m * p.N + n] = (float)acc;
        }
    if (p.M > 8 && p.chunk == 0) { /* the 128-tile matmul */
        ASSERT_EQ(ft_matmul_big(ctx().c, &w, A0.data(), p.M, p.K, p.N, C0.data()), FORGE_OK);
        EXPECT_LT(ft::rel_err(C0.data(), R0.data(), C0.size()), 2e-6) << "128-tile matmul";
    }
    if (p.M <= 32 && p.chunk == 0) { /* the 32 x 128-tile matmul of batch decode */
        ASSERT_EQ(ft_matmul_s(ctx().c, &w, A0.data(), p.M, p.K, p.N, C0.data()), FORGE_OK);
        EXPECT_LT(ft::rel_err(C0.data(), R0.data(), C0.size()), 2e-6) << "32 x 128-tile matmul";
    }
    if (p.M <= 8 && !(p.flags & (FT_ACCUMULATE | FT_BIAS | FT_SOFTCAP)) && p.chunk == 0 && !p.force_matmul) { /* each matvec kernel */
        for (int sg = 0; sg <= ft_has_subgroup_matvec(ctx().c); sg++) {
            ASSERT_EQ(ft_matvec_kind(ctx().c, &w, A0.data(), p.M, p.K, p.N, C0.data(), sg), FORGE_OK);
            EXPECT_LT(ft::rel_err(C0.data(), R0.data(), C0.size()), 2e-6) << "subgroup " << sg;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, KernelLinear,
    ::testing::Values(LinearCase{FT_F32, 1, 64, 40, 0, 0, 0}, LinearCase{FT_F16, 1, 256, 33, 0, 0, FT_BIAS},
                      LinearCase{FT_BF16, 1, 128, 70, 16, 0, FT_ACCUMULATE},
                      LinearCase{FT_F32, 3, 172, 64, 0, 0, FT_ACCUMULATE | FT_BIAS}, /* K % 8 == 4 */
                      LinearCase{FT_F16, 8, 100, 50, 0, 0, FT_SOFTCAP},                /* K % 8 == 4, f16 scalar path */
                      LinearCase{FT_BF16, 7, 64, 20, 7, 0, 0},
                      LinearCase{FT_F32, 9, 64, 130, 0, 0, 0},                         /* first M for the tiled kernel */
                      LinearCase{FT_F16, 70, 96, 65, 0, 0, FT_BIAS},                   /* partial tiles both ways */
                      LinearCase{FT_BF16, 130, 200, 90, 32, 0, FT_ACCUMULATE},         /* chunks + K not % 32 */
                      LinearCase{FT_F32, 64, 172, 64, 0, 1, FT_SOFTCAP},
                      LinearCase{FT_F16, 2, 64, 64, 0, 1, FT_BIAS | FT_ACCUMULATE}));  /* tiled with small M */

/* The subgroup matvec's fused paths (bias, accumulation, soft-cap, the RMSNorm of its input,
 * the gated MLP middle) in both of its mappings: K split over the workgroup with up to 8
 * outputs (one token of a block format on GPUs, here Q8_0; forced, since lavapipe is not given
 * it; the plain formats' modules have no split, forge never asks them for one) and an output
 * per subgroup (plain formats and several tokens; its rounds of 8 and 4 steps of k and the
 * single steps after them, K % 8 != 0 included). Against f64. */
TEST(Kernel, SubgroupMatvecFusedPathsBothMappings) {
    NEED_DEVICE();
    if (!ft_has_subgroup_matvec(ctx().c)) GTEST_SKIP() << "no subgroup arithmetic";
    struct Case {
        int fmt;
        uint32_t K, outs, flags;
    };
    const Case cases[] = {
        {FT_F32, 256, 20, FT_BIAS | FT_SOFTCAP | FT_ACCUMULATE}, {FT_F16, 100, 13, FT_PRENORM},
        {FT_BF16, 192, 9, FT_GATED | FT_PRENORM},                {FT_F16, 64, 33, FT_GATED | FT_GELU},
        {FT_F32, 40, 3000, FT_BIAS},                             /* 2 outputs per workgroup when split */
        {FT_F16, 72, 8200, FT_GATED | FT_PRENORM},               /* 8, and a partial last workgroup */
        {FT_F32, 2056, 5, FT_PRENORM | FT_ACCUMULATE},           /* several k steps per lane */
        {FT_Q8_0, 256, 20, FT_BIAS | FT_SOFTCAP | FT_ACCUMULATE}, {FT_Q8_0, 96, 9, FT_GATED | FT_PRENORM},
        {FT_Q8_0, 64, 3000, FT_BIAS},                            /* 2 outputs per workgroup when split */
        {FT_Q8_0, 96, 8200, FT_GATED | FT_PRENORM},              /* 8, and a partial last workgroup */
        {FT_Q8_0, 2048, 5, FT_PRENORM | FT_ACCUMULATE},          /* several k steps per lane */
    };
    const float eps = 1e-5f, cap = 2.5f;
    for (const Case &cs : cases)
        for (int split = 0; split <= 1; split++)
            for (uint32_t M : {1u, 3u}) {
                if (split && (M != 1 || cs.fmt != FT_Q8_0)) continue;
                bool gated = cs.flags & FT_GATED, prenorm = cs.flags & FT_PRENORM;
                uint32_t rows = gated ? 2 * cs.outs : cs.outs;
                std::vector<float> A = ft::randn((size_t)M * cs.K, 1.0f, 20), g = ft::randn(cs.K, 1.0f, 21);
                std::vector<float> bias = ft::randn(cs.outs, 1.0f, 22), C = ft::randn((size_t)M * cs.outs, 1.0f, 23), ref = C;
                Weights W = make_weights(cs.fmt, (size_t)rows * cs.K, 24);
                for (uint32_t m = 0; m < M; m++) {
                    std::vector<double> x(cs.K);
                    double ss = 0;
                    for (uint32_t k = 0; k < cs.K; k++) ss += (double)A[(size_t)m * cs.K + k] * A[(size_t)m * cs.K + k];
                    double inv = prenorm ? 1.0 / std::sqrt(ss / cs.K + eps) : 1.0;
                    for (uint32_t k = 0; k < cs.K; k++) x[k] = A[(size_t)m * cs.K + k] * inv * (prenorm ? g[k] : 1.0f);
                    for (uint32_t n = 0; n < cs.outs; n++) {
                        auto row_dot = [&](uint32_t r) {
                            double acc = 0;
                            for (uint32_t k = 0; k < cs.K; k++) acc += x[k] * W.values[(size_t)r * cs.K + k];
                            return acc;
                        };
                        double v;
                        if (gated) {
                            double gt = row_dot(2 * n), up = row_dot(2 * n + 1);
                            double act = (cs.flags & FT_GELU) ? 0.5 * gt * (1 + std::tanh(0.7978845608028654 * (gt + 0.044715 * gt * gt * gt)))
                                                               : gt / (1 + std::exp(-gt));
                            v = act * up;
                        } else {
                            v = row_dot(n);
                        }
                        if (cs.flags & FT_BIAS) v += bias[n];
                        if (cs.flags & FT_SOFTCAP) v = std::tanh(v / cap) * cap;
                        float &r = ref[(size_t)m * cs.outs + n];
                        r = (cs.flags & FT_ACCUMULATE) ? r + (float)v : (float)v;
                    }
                }
                size_t row_bytes = cs.fmt == FT_Q8_0 ? (size_t)cs.K / 32 * 34 : (size_t)(cs.fmt == FT_F32 ? 4 : 2) * cs.K;
                ft_weight w = {cs.fmt, W.bytes.data(), row_bytes, nullptr, nullptr, 0, 0, 0, 0};
                ASSERT_EQ(ft_matvec_sg(ctx().c, &w, A.data(), M, cs.K, cs.outs, cs.flags, bias.data(), g.data(), eps, cap, split, C.data()),
                          FORGE_OK)
                    << ft_errmsg(ctx().c);
                EXPECT_LT(ft::rel_err(C.data(), ref.data(), C.size()), 3e-6)
                    << "fmt " << cs.fmt << " K " << cs.K << " outs " << cs.outs << " flags " << cs.flags << " split " << split << " M " << M;
            }
}

TEST(Kernel, EmbedChunkedAndScaled) {
    NEED_DEVICE();
    for (int fmt : {FT_F32, FT_F16, FT_BF16}) {
        uint32_t rows = 50, hidden = 36, n = 7;
        Weights T = make_weights(fmt, (size_t)rows * hidden, 10 + fmt);
        std::vector<uint32_t> toks = {0, 49, 17, 17, 30, 1, 48};
        for (uint32_t round : {0u, 1u, 2u}) {
            std::vector<float> out((size_t)n * hidden, -1.0f);
            float scale = round ? 6.0f : 1.0f;
            ASSERT_EQ(ft_embed(ctx().c, fmt, toks.data(), n, T.bytes.data(), rows, hidden, 13, scale, round, out.data()), FORGE_OK);
            for (uint32_t t = 0; t < n; t++)
                for (uint32_t k = 0; k < hidden; k++) {
                    float v = T.values[(size_t)toks[t] * hidden + k] * scale;
                    if (round == 1) v = ft_bf16_to_f32(ft_f32_to_bf16(v));
                    if (round == 2) v = ft_f16_to_f32(ft_f32_to_f16(v));
                    ASSERT_EQ(out[(size_t)t * hidden + k], v) << "fmt " << fmt << " round " << round << " token " << t << " k " << k;
                }
        }
    }
}

TEST(Kernel, RmsNormRowsOffsetsAndAdd) {
    NEED_DEVICE();
    for (uint32_t dim : {8u, 64u, 300u}) {
        uint32_t x_rows = 6, rows = 3, x_row0 = 2, out_rows = 5, out_row0 = 1;
        std::vector<float> x = ft::randn((size_t)x_rows * dim, 2.0f, dim), w = ft::randn(dim, 1.0f, dim + 1);
        for (uint32_t add : {0u, 1u}) {
            std::vector<float> out = ft::randn((size_t)out_rows * dim, 1.0f, 7), ref = out;
            for (uint32_t r = 0; r < rows; r++) {
                double ss = 0;
                for (uint32_t i = 0; i < dim; i++) ss += (double)x[(x_row0 + r) * dim + i] * x[(x_row0 + r) * dim + i];
                double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
                for (uint32_t i = 0; i < dim; i++) {
                    float v = (float)(x[(x_row0 + r) * dim + i] * inv * w[i]);
                    float &o = ref[(out_row0 + r) * dim + i];
                    o = add ? o + v : v;
                }
            }
            ASSERT_EQ(ft_rmsnorm(ctx().c, x.data(), x_rows, x_row0, rows, dim, w.data(), 1e-5f, add, out.data(), out_rows, out_row0), FORGE_OK);
            EXPECT_LT(ft::rel_err(out.data(), ref.data(), out.size()), 1e-6) << "dim " << dim << " add " << add;
        }
    }
}

static void rope_ref(std::vector<float> &x, uint32_t n, uint32_t heads, uint32_t D, const std::vector<float> &inv, uint32_t pos0,
                     bool adjacent) {
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < heads; h++)
            for (uint32_t i = 0; i < D / 2; i++) {
                uint32_t i0 = adjacent ? 2 * i : i, i1 = adjacent ? 2 * i + 1 : i + D / 2;
                float theta = (float)(pos0 + t) * inv[i]; /* float32 product, as HF */
                double c = std::cos((double)theta), s = std::sin((double)theta);
                float *p = &x[((size_t)t * heads + h) * D];
                double x0 = p[i0], x1 = p[i1];
                p[i0] = (float)(x0 * c - x1 * s);
                p[i1] = (float)(x1 * c + x0 * s);
            }
}

TEST(Kernel, RopeBothConventionsFarPositions) {
    NEED_DEVICE();
    uint32_t n = 5, heads = 3, D = 16;
    std::vector<float> inv(D / 2);
    for (uint32_t i = 0; i < D / 2; i++) inv[i] = (float)(1.0 / std::pow(10000.0, 2.0 * i / D));
    for (int adjacent : {0, 1})
        for (uint32_t pos0 : {0u, 37u, 30000u}) {
            std::vector<float> x = ft::randn((size_t)n * heads * D, 1.0f, 5), ref = x;
            rope_ref(ref, n, heads, D, inv, pos0, adjacent);
            ASSERT_EQ(ft_rope(ctx().c, x.data(), n, heads, D, inv.data(), pos0, adjacent), FORGE_OK);
            EXPECT_LT(ft::rel_err(x.data(), ref.data(), x.size()), 2e-6) << "adjacent " << adjacent << " pos0 " << pos0;
        }
}

TEST(Kernel, RopeStoreWritesRotatingSlots) {
    NEED_DEVICE();
    /* a step never writes more tokens than the ring has slots (forge sizes it window + n_batch - 1) */
    uint32_t n = 4, heads = 2, D = 8, slots = 6, pos0 = 9;
    std::vector<float> inv(D / 2);
    for (uint32_t i = 0; i < D / 2; i++) inv[i] = (float)(1.0 / std::pow(500000.0, 2.0 * i / D));
    std::vector<float> k = ft::randn((size_t)n * heads * D, 1.0f, 8), v = ft::randn((size_t)n * heads * D, 1.0f, 9);
    std::vector<float> kc((size_t)slots * heads * D, 0.0f), vc = kc, rk = k;
    rope_ref(rk, n, heads, D, inv, pos0, false);
    ASSERT_EQ(ft_rope_store(ctx().c, k.data(), v.data(), n, heads, D, inv.data(), pos0, 0, slots, kc.data(), vc.data()), FORGE_OK);
    /* each position lands in slot pos % slots (wrapping past the end of the ring) */
    for (uint32_t t = 0; t < n; t++) {
        uint32_t slot = (pos0 + t) % slots;
        for (uint32_t e = 0; e < heads * D; e++) {
            EXPECT_NEAR(kc[slot * heads * D + e], rk[t * heads * D + e], 2e-6);
            EXPECT_EQ(vc[slot * heads * D + e], v[t * heads * D + e]);
        }
    }
}

/* The f16 cache's store (rope_kv16, two pairs an invocation) writes exactly the f32 store's
 * values rounded to nearest f16, in both pair layouts, wrapping the ring; other slots untouched. */
TEST(Kernel, RopeStoreIntoAnF16CacheRoundsTheF32Store) {
    NEED_DEVICE();
    uint32_t n = 4, heads = 2, D = 16, slots = 6, pos0 = 9;
    std::vector<float> inv(D / 2);
    for (uint32_t i = 0; i < D / 2; i++) inv[i] = (float)(1.0 / std::pow(500000.0, 2.0 * i / D));
    std::vector<float> k = ft::randn((size_t)n * heads * D, 3.0f, 8), v = ft::randn((size_t)n * heads * D, 3.0f, 9);
    for (int adjacent : {0, 1}) {
        SCOPED_TRACE(adjacent ? "adjacent pairs" : "rotate-half");
        std::vector<float> kc((size_t)slots * heads * D, 0.0f), vc = kc;
        const uint16_t unwritten = 0x7e00; /* a NaN pattern the store must overwrite or leave */
        std::vector<uint16_t> kc16(kc.size(), unwritten), vc16 = kc16;
        ASSERT_EQ(ft_rope_store(ctx().c, k.data(), v.data(), n, heads, D, inv.data(), pos0, adjacent, slots, kc.data(), vc.data()), FORGE_OK);
        ASSERT_EQ(ft_rope_store16(ctx().c, k.data(), v.data(), n, heads, D, inv.data(), pos0, adjacent, slots, kc16.data(), vc16.data()),
                  FORGE_OK);
        for (uint32_t slot = 0; slot < slots; slot++) {
            bool written = false;
            for (uint32_t t = 0; t < n; t++) written |= (pos0 + t) % slots == slot;
            for (uint32_t e = 0; e < heads * D; e++) {
                size_t i = (size_t)slot * heads * D + e;
                EXPECT_EQ(kc16[i], written ? ft_f32_to_f16(kc[i]) : unwritten) << "slot " << slot << " element " << e;
                EXPECT_EQ(vc16[i], written ? ft_f32_to_f16(vc[i]) : unwritten) << "slot " << slot << " element " << e;
            }
        }
    }
}

/* rope_kv8 stores the f32 store quantized as state.c's host quantizer does (ft_kv_convert):
 * the same f16 scales (and zeroed padding), codes within one step of the host's (the kernel's
 * division may round a tie the other way), slots it does not write left as they were; D 32 (one
 * block, half a scale word unused) and 96 (three blocks, an invocation taking two then one). */
TEST(Kernel, RopeStoreIntoAQ8CacheQuantizesTheF32Store) {
    NEED_DEVICE();
    const uint32_t n = 4, heads = 2, slots = 6, pos0 = 9;
    for (uint32_t D : {32u, 96u, 256u, 512u}) {
        std::vector<float> inv(D / 2);
        for (uint32_t i = 0; i < D / 2; i++) inv[i] = (float)(1.0 / std::pow(500000.0, 2.0 * i / D));
        std::vector<float> k = ft::randn((size_t)n * heads * D, 3.0f, 8), v = ft::randn((size_t)n * heads * D, 3.0f, 9);
        const size_t hb = ft_kv8_head_bytes(D);
        ASSERT_EQ(hb, D + 4 * ((D / 32 + 1) / 2));
        for (int adjacent : {0, 1}) {
            SCOPED_TRACE(std::string(adjacent ? "adjacent pairs" : "rotate-half") + ", D " + std::to_string(D));
            std::vector<float> kc((size_t)slots * heads * D, 0.0f), vc = kc;
            std::vector<uint8_t> kc8((size_t)slots * heads * hb, 0xa5), vc8 = kc8, want_k(kc8.size()), want_v(kc8.size());
            ASSERT_EQ(ft_rope_store(ctx().c, k.data(), v.data(), n, heads, D, inv.data(), pos0, adjacent, slots, kc.data(), vc.data()), FORGE_OK);
            ASSERT_EQ(ft_rope_store8(ctx().c, k.data(), v.data(), n, heads, D, inv.data(), pos0, adjacent, slots, kc8.data(), vc8.data()),
                      FORGE_OK);
            ft_kv_convert(kc.data(), FORGE_KV_F32, want_k.data(), FORGE_KV_Q8_0, (size_t)slots * heads, D);
            ft_kv_convert(vc.data(), FORGE_KV_F32, want_v.data(), FORGE_KV_Q8_0, (size_t)slots * heads, D);
            int off_by_one = 0;
            for (uint32_t slot = 0; slot < slots; slot++) {
                bool written = false;
                for (uint32_t t = 0; t < n; t++) written |= (pos0 + t) % slots == slot;
                for (size_t i = (size_t)slot * heads * hb; i < (size_t)(slot + 1) * heads * hb; i++)
                    for (int which = 0; which < 2; which++) {
                        uint8_t got = (which ? vc8 : kc8)[i], want = (which ? want_v : want_k)[i];
                        if (!written) {
                            EXPECT_EQ(got, 0xa5) << "slot " << slot << " byte " << i;
                        } else if (i % hb < D) { /* a code */
                            int d = (int)(int8_t)got - (int)(int8_t)want;
                            EXPECT_LE(std::abs(d), 1) << "slot " << slot << " byte " << i;
                            off_by_one += d != 0;
                        } else { /* a scale (or the padding) */
                            EXPECT_EQ(got, want) << "slot " << slot << " byte " << i << (which ? " (values)" : " (keys)");
                        }
                    }
            }
            printf("  D %u %s: %d codes of %u one step from the host's\n", D, adjacent ? "adjacent" : "rotate-half", off_by_one, 2 * n * heads * D);
        }
    }
}

TEST(Kernel, AttentionCausalGqaWindowSoftcapSlots) {
    NEED_DEVICE();
    struct Case { uint32_t n, H, Hkv, D, pos0, slots, window; float softcap; };
    /* in order of D: the kernels are specialized per head_dim, so each change rebuilds them */
    for (Case cs : {Case{7, 4, 1, 8, 0, 16, 0, 0}, Case{1, 4, 2, 16, 0, 32, 0, 0}, Case{12, 4, 2, 16, 20, 19, 8, 0},
                    Case{1, 4, 2, 16, 200, 16, 8, 30.0f}, Case{9, 3, 3, 24, 0, 9, 4, 0}, Case{3, 2, 1, 32, 140, 140, 0, 0},
                    Case{5, 8, 4, 64, 90, 128, 0, 0}, Case{1, 4, 2, 64, 3000, 4000, 0, 0}, Case{37, 4, 2, 64, 5, 64, 0, 0},
                    Case{100, 4, 2, 64, 5, 128, 0, 0}, /* (tensor cores: a partial second block of 64 queries) */
                    Case{1, 2, 1, 128, 1100, 1200, 1024, 0}, Case{130, 4, 1, 128, 0, 160, 0, 0}, Case{20, 2, 1, 256, 30, 60, 7, 30.0f},
                    Case{9, 2, 2, 256, 3, 200, 0, 50.0f}, Case{70, 2, 1, 256, 90, 64, 33, 30.0f}, /* Gemma 4's full layers: wider tiles */
                    Case{11, 4, 1, 512, 0, 16, 0, 0}, Case{6, 2, 2, 512, 40, 48, 9, 30.0f}, Case{1, 2, 1, 512, 700, 800, 0, 0}}) {
        std::vector<float> q = ft::randn((size_t)cs.n * cs.H * cs.D, 1.0f, 11);
        std::vector<float> kc = ft::randn((size_t)cs.slots * cs.Hkv * cs.D, 1.0f, 12), vc = ft::randn(kc.size(), 1.0f, 13);
        float scale = 1.0f / std::sqrt((float)cs.D);
        std::vector<float> out(q.size()), ref(q.size());
        for (uint32_t t = 0; t < cs.n; t++)
            for (uint32_t h = 0; h < cs.H; h++) {
                uint32_t p = cs.pos0 + t, lo = cs.window && p + 1 > cs.window ? p + 1 - cs.window : 0, kvh = h / (cs.H / cs.Hkv);
                std::vector<double> s;
                double mx = -1e300;
                for (uint32_t j = lo; j <= p; j++) {
                    const float *kr = &kc[((size_t)(j % cs.slots) * cs.Hkv + kvh) * cs.D];
                    double d = 0;
                    for (uint32_t e = 0; e < cs.D; e++) d += (double)q[((size_t)t * cs.H + h) * cs.D + e] * kr[e];
                    d *= scale;
                    if (cs.softcap > 0) d = std::tanh(d / cs.softcap) * cs.softcap;
                    s.push_back(d);
                    mx = std::fmax(mx, d);
                }
                double sum = 0;
                for (double &x : s) sum += (x = std::exp(x - mx));
                for (uint32_t e = 0; e < cs.D; e++) {
                    double acc = 0;
                    for (uint32_t j = lo; j <= p; j++) acc += s[j - lo] * vc[((size_t)(j % cs.slots) * cs.Hkv + kvh) * cs.D + e];
                    ref[((size_t)t * cs.H + h) * cs.D + e] = (float)(acc / sum);
                }
            }
        for (int split : {0, 1, 2, 3}) {
            if (split && cs.D % 4) continue;
            std::fill(out.begin(), out.end(), NAN);
            forge_status st = ft_attention(ctx().c, q.data(), cs.n, cs.H, cs.Hkv, cs.D, kc.data(), vc.data(), cs.slots, cs.pos0, cs.window,
                                           scale, cs.softcap, out.data(), split);
            if (split >= 2 && st == FORGE_ERR_UNSUPPORTED) continue;
            ASSERT_EQ(st, FORGE_OK);
            EXPECT_LT(ft::rel_err(out.data(), ref.data(), out.size()), 2e-5)
                << "n " << cs.n << " D " << cs.D << " window " << cs.window << " split " << split;
        }
        /* the same on an f16 cache (the _kv16 kernels, D % 4 == 0) equals the f32 kernels on
         * the cache's values rounded to f16 */
        if (cs.D % 4) continue;
        std::vector<uint16_t> kc16(kc.size()), vc16(vc.size());
        std::vector<float> kcr(kc.size()), vcr(vc.size()), want(q.size());
        for (size_t i = 0; i < kc.size(); i++) {
            kcr[i] = ft_f16_to_f32(kc16[i] = ft_f32_to_f16(kc[i]));
            vcr[i] = ft_f16_to_f32(vc16[i] = ft_f32_to_f16(vc[i]));
        }
        for (int split : {0, 1, 2, 3}) {
            forge_status st = ft_attention(ctx().c, q.data(), cs.n, cs.H, cs.Hkv, cs.D, kcr.data(), vcr.data(), cs.slots, cs.pos0, cs.window,
                                           scale, cs.softcap, want.data(), split);
            if (split >= 2 && st == FORGE_ERR_UNSUPPORTED) continue;
            ASSERT_EQ(st, FORGE_OK);
            std::fill(out.begin(), out.end(), NAN);
            ASSERT_EQ(ft_attention16(ctx().c, q.data(), cs.n, cs.H, cs.Hkv, cs.D, kc16.data(), vc16.data(), cs.slots, cs.pos0, cs.window, scale,
                                     cs.softcap, out.data(), split),
                      FORGE_OK);
            EXPECT_LT(ft::rel_err(out.data(), want.data(), out.size()), 1e-6)
                << "f16 cache: n " << cs.n << " D " << cs.D << " window " << cs.window << " split " << split;
        }
        /* the tensor cores' prefill kernel (q and P rounded to f16) against the same, alone and
         * on batch prefill's row table */
        for (int split : {4, 5}) {
            std::fill(out.begin(), out.end(), NAN);
            forge_status st = ft_attention16(ctx().c, q.data(), cs.n, cs.H, cs.Hkv, cs.D, kc16.data(), vc16.data(), cs.slots, cs.pos0,
                                             cs.window, scale, cs.softcap, out.data(), split);
            if (st == FORGE_ERR_UNSUPPORTED) continue;
            ASSERT_EQ(st, FORGE_OK);
            EXPECT_LT(ft::rel_err(out.data(), want.data(), out.size()), 3e-3)
                << "tensor cores: n " << cs.n << " D " << cs.D << " window " << cs.window << " split " << split;
        }
    }
}

/* One decode step with RoPE fused into attention_decode equals rope (query rotated, key and
 * value stored) then attention_decode: the cache bit for bit (slot p written as rope.comp writes
 * it, no other slot touched), the output to summation order; slot p holds NaN before the fused
 * kernel, which must not read it. Without key_from_row (a KV-shared layer) the key comes from the
 * cache. Both pair layouts, f32 and f16 caches, GQA, a ring, a window, soft-capping, a head whose
 * halves split a vec4 (D = 20). With the head norms folded in too (Qwen 3's q / k norms, Gemma
 * 4's weightless value norm) against rmsnorm.comp first: the norm's sum runs in another order, so
 * the cache then matches to rounding (an f16 ulp). */
TEST(Kernel, AttentionDecodeRotatesTheStepItself) {
    NEED_DEVICE();
    struct Case { uint32_t H, Hkv, D, pos, slots, window; float softcap; };
    for (Case cs : {Case{4, 2, 16, 0, 32, 0, 0}, Case{4, 1, 20, 45, 64, 0, 0}, Case{4, 1, 64, 700, 800, 0, 0},
                    Case{8, 2, 128, 530, 600, 0, 0}, Case{2, 2, 256, 100, 64, 50, 30.0f}, Case{4, 2, 512, 40, 48, 9, 30.0f}}) {
        uint32_t HD = cs.H * cs.D, KVD = cs.Hkv * cs.D, slot = cs.pos % cs.slots;
        std::vector<float> qkv = ft::randn(HD + 2 * KVD, 1.0f, 31), inv(cs.D / 2), norms = ft::randn(2 * cs.D, 0.5f, 34), ones(cs.D, 1.0f);
        for (uint32_t i = 0; i < cs.D / 2; i++) inv[i] = (float)(1.0 / std::pow(10000.0, 2.0 * i / cs.D));
        std::vector<float> kc0 = ft::randn((size_t)cs.slots * KVD, 1.0f, 32), vc0 = ft::randn(kc0.size(), 1.0f, 33);
        float scale = 1.0f / std::sqrt((float)cs.D), eps = 1e-6f;
        for (int normed : {0, 1})
            for (int adjacent : {0, 1})
                for (int f16 : {0, 1})
                    for (int key_from_row : {1, 0}) {
                        SCOPED_TRACE(::testing::Message() << "D " << cs.D << " pos " << cs.pos << (adjacent ? " adjacent" : " rotate-half")
                                                          << (f16 ? " f16" : " f32") << (key_from_row ? " key from the row" : " key cached")
                                                          << (normed ? " q/k/v normed" : ""));
                        /* the unfused reference: rmsnorm.comp on the heads, rope.comp, then attention_decode */
                        std::vector<float> row = qkv;
                        if (normed) {
                            float *q0 = row.data(), *k0 = q0 + HD, *v0 = k0 + KVD;
                            ASSERT_EQ(ft_rmsnorm(ctx().c, q0, cs.H, 0, cs.H, cs.D, norms.data(), eps, 0, q0, cs.H, 0), FORGE_OK);
                            ASSERT_EQ(ft_rmsnorm(ctx().c, k0, cs.Hkv, 0, cs.Hkv, cs.D, norms.data() + cs.D, eps, 0, k0, cs.Hkv, 0), FORGE_OK);
                            ASSERT_EQ(ft_rmsnorm(ctx().c, v0, cs.Hkv, 0, cs.Hkv, cs.D, ones.data(), eps, 0, v0, cs.Hkv, 0), FORGE_OK);
                        }
                        std::vector<float> q(row.begin(), row.begin() + HD), want(HD), out(HD, NAN);
                        ASSERT_EQ(ft_rope(ctx().c, q.data(), 1, cs.H, cs.D, inv.data(), cs.pos, adjacent), FORGE_OK);
                        std::vector<float> kc = kc0, vc = vc0;
                        std::vector<uint16_t> kc16(kc0.size()), vc16(kc0.size());
                        for (size_t i = 0; i < kc0.size(); i++) kc16[i] = ft_f32_to_f16(kc0[i]), vc16[i] = ft_f32_to_f16(vc0[i]);
                        const float *k = row.data() + HD, *v = k + KVD;
                        forge_status st = f16 ? ft_rope_store16(ctx().c, k, v, 1, cs.Hkv, cs.D, inv.data(), cs.pos, adjacent, cs.slots,
                                                                kc16.data(), vc16.data())
                                              : ft_rope_store(ctx().c, k, v, 1, cs.Hkv, cs.D, inv.data(), cs.pos, adjacent, cs.slots, kc.data(),
                                                              vc.data());
                        ASSERT_EQ(st, FORGE_OK);
                        st = f16 ? ft_attention16(ctx().c, q.data(), 1, cs.H, cs.Hkv, cs.D, kc16.data(), vc16.data(), cs.slots, cs.pos,
                                                  cs.window, scale, cs.softcap, want.data(), 2)
                                 : ft_attention(ctx().c, q.data(), 1, cs.H, cs.Hkv, cs.D, kc.data(), vc.data(), cs.slots, cs.pos, cs.window,
                                                scale, cs.softcap, want.data(), 2);
                        if (st == FORGE_ERR_UNSUPPORTED) GTEST_SKIP() << "the device cannot run attention_decode";
                        ASSERT_EQ(st, FORGE_OK);
                        /* fused, from the raw row and the caches as they were before rope, slot p
                         * poisoned where the row gives the key */
                        std::vector<float> fk = kc, fv = vc;
                        std::vector<uint16_t> fk16 = kc16, fv16 = vc16;
                        if (key_from_row)
                            for (uint32_t e = 0; e < KVD; e++) {
                                size_t i = (size_t)slot * KVD + e;
                                fk[i] = fv[i] = NAN;
                                fk16[i] = fv16[i] = 0x7e00;
                            }
                        st = ft_attention_rope_decode(ctx().c, qkv.data(), cs.H, cs.Hkv, cs.D, inv.data(), adjacent, key_from_row,
                                                      normed ? norms.data() : NULL, normed, eps, f16 ? (void *)fk16.data() : (void *)fk.data(),
                                                      f16 ? (void *)fv16.data() : (void *)fv.data(), f16, cs.slots, cs.pos, cs.window, scale,
                                                      cs.softcap, out.data());
                        ASSERT_EQ(st, FORGE_OK);
                        EXPECT_LT(ft::rel_err(out.data(), want.data(), out.size()), normed ? 2e-5 : 2e-6);
                        if (!normed) {
                            EXPECT_TRUE(f16 ? fk16 == kc16 && fv16 == vc16 : !memcmp(fk.data(), kc.data(), 4 * fk.size()) && !memcmp(fv.data(), vc.data(), 4 * fv.size()));
                            continue;
                        }
                        for (size_t i = 0; i < kc.size(); i++) {
                            float gk = f16 ? ft_f16_to_f32(fk16[i]) : fk[i], wk = f16 ? ft_f16_to_f32(kc16[i]) : kc[i];
                            float gv = f16 ? ft_f16_to_f32(fv16[i]) : fv[i], wv = f16 ? ft_f16_to_f32(vc16[i]) : vc[i];
                            float tol = f16 ? 1e-3f : 1e-5f;
                            ASSERT_NEAR(gk, wk, tol * (1 + std::fabs(wk))) << "key element " << i;
                            ASSERT_NEAR(gv, wv, tol * (1 + std::fabs(wv))) << "value element " << i;
                        }
                    }
    }
}

TEST(Kernel, ActMulSiluAndGeluTanh) {
    NEED_DEVICE();
    uint32_t count = 1000;
    std::vector<float> g0 = ft::randn(count, 4.0f, 21), u = ft::randn(count, 1.0f, 22);
    g0[0] = 100.0f;  /* large arguments must not overflow */
    g0[1] = -100.0f;
    for (uint32_t act : {0u, 1u}) {
        std::vector<float> g = g0, ref(count);
        for (uint32_t i = 0; i < count; i++) {
            double x = g0[i], y;
            if (act == 0) y = x / (1.0 + std::exp(-x));
            else y = 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
            ref[i] = (float)(y * u[i]);
        }
        ASSERT_EQ(ft_act_mul(ctx().c, g.data(), u.data(), count, act), FORGE_OK);
        for (uint32_t i = 0; i < count; i++) ASSERT_FALSE(std::isnan(g[i]));
        EXPECT_LT(ft::rel_err(g.data(), ref.data(), count), 2e-6) << "act " << act;
    }
}

/* The gated delta rule and its gated norm (Qwen 3.5's linear attention) against a double
 * reference: delta_rule.comp, and delta_rule_sg.comp + gated_norm.comp at every lane count its
 * key head dims take (k_dim 16 .. 256: 1, 2, 4 and 8 invocations a column, as the subgroup
 * allows), two sequences in their own places, from a zero state (position 0) and on from a
 * given one, with grouped and tiled value heads (llama.cpp's order). */
/* conv1d.comp against the convolution in double: groups of 1 (decode), 2 (fewer rows than the
 * state holds), 37 and 100 rows (runs of 3 and 7 rows, one run short), taps 4 and 2, channels
 * past a workgroup's 32, from zeros and from a state; the state left is the last inputs. */
TEST(Kernel, Conv1dMatchesTheConvolution) {
    NEED_DEVICE();
    const uint32_t C = 70, stride = 75;
    for (uint32_t K : {4u, 2u, 8u}) /* (8: FORGE__MAX_LINEAR_CONV) */
        for (uint32_t group : {1u, 2u, 37u, 100u})
            for (uint32_t pos0 : {0u, 9u}) {
                const uint32_t groups = group == 100 ? 1 : 3, n = group * groups;
                std::vector<float> x = ft::randn((size_t)n * stride, 1.0f, 50 + group), w = ft::randn((size_t)C * K, 0.5f, 51);
                std::vector<float> s0 = ft::randn((size_t)groups * (K - 1) * C, 1.0f, 52), st = s0, y((size_t)n * C);
                ASSERT_EQ(ft_conv1d(ctx().c, x.data(), w.data(), st.data(), y.data(), n, C, K, stride, group, pos0), FORGE_OK);
                std::vector<float> ref((size_t)n * C), sref(s0.size());
                for (uint32_t g = 0; g < groups; g++)
                    for (uint32_t c = 0; c < C; c++) {
                        /* the group's inputs after its K - 1 earlier ones */
                        std::vector<double> in(K - 1 + group);
                        for (uint32_t j = 0; j + 1 < K; j++) in[j] = pos0 ? s0[((size_t)g * (K - 1) + j) * C + c] : 0.0;
                        for (uint32_t t = 0; t < group; t++) in[K - 1 + t] = x[((size_t)g * group + t) * stride + c];
                        for (uint32_t t = 0; t < group; t++) {
                            double a = 0;
                            for (uint32_t j = 0; j < K; j++) a += (double)w[c * K + j] * in[t + j];
                            ref[((size_t)g * group + t) * C + c] = (float)(a / (1.0 + std::exp(-a)));
                        }
                        for (uint32_t j = 0; j + 1 < K; j++) sref[((size_t)g * (K - 1) + j) * C + c] = (float)in[group + j];
                    }
                std::string what = "K " + std::to_string(K) + " group " + std::to_string(group) + " pos0 " + std::to_string(pos0);
                EXPECT_LT(ft::rel_err(y.data(), ref.data(), ref.size()), 1e-6) << what;
                EXPECT_EQ(st, sref) << what;
            }
}

/* The gated delta rule and gated norm in double, row by row, as delta_rule.comp's header writes
 * them: n rows in groups of `group` (group g in state place g); S [groups, VH, DK, DV] in and out. */
static std::vector<float> delta_rule_ref(uint32_t n, uint32_t group, uint32_t KH, uint32_t VH, uint32_t DK, uint32_t DV, int v_tiled,
                                         const std::vector<float> &qkv, const std::vector<float> &mix, const std::vector<float> &neg_a,
                                         const std::vector<float> &dt, const std::vector<float> &w, std::vector<double> &S) {
    const uint32_t CD = 2 * KH * DK + VH * DV, MIX = VH * DV + 2 * VH;
    std::vector<float> ref((size_t)n * VH * DV);
    for (uint32_t t = 0; t < n; t++) {
        uint32_t g = t / group;
        const float *row = &qkv[(size_t)t * CD], *mr = &mix[(size_t)t * MIX];
        for (uint32_t h = 0; h < VH; h++) {
            uint32_t kh = v_tiled ? h % KH : h / (VH / KH);
            const float *q = row + kh * DK, *k = row + KH * DK + kh * DK, *v = row + 2 * KH * DK + h * DV;
            double nq = 0, nk = 0;
            for (uint32_t i = 0; i < DK; i++) nq += (double)q[i] * q[i], nk += (double)k[i] * k[i];
            nq = 1.0 / std::sqrt(nq + 1e-6) / std::sqrt((double)DK);
            nk = 1.0 / std::sqrt(nk + 1e-6);
            double beta = 1.0 / (1.0 + std::exp(-(double)mr[VH * DV + h])), ax = (double)mr[VH * DV + VH + h] + dt[h];
            double decay = std::exp(neg_a[h] * (ax > 20 ? ax : std::log1p(std::exp(ax))));
            double *Sh = &S[((size_t)g * VH + h) * DK * DV];
            std::vector<double> o(DV);
            double ss = 0;
            for (uint32_t jj = 0; jj < DV; jj++) {
                double kv = 0;
                for (uint32_t i = 0; i < DK; i++) kv += Sh[i * DV + jj] * k[i] * nk;
                double delta = (v[jj] - decay * kv) * beta, acc = 0;
                for (uint32_t i = 0; i < DK; i++) {
                    Sh[i * DV + jj] = decay * Sh[i * DV + jj] + k[i] * nk * delta;
                    acc += Sh[i * DV + jj] * q[i] * nq;
                }
                o[jj] = acc;
                ss += acc * acc;
            }
            double inv = 1.0 / std::sqrt(ss / DV + 1e-6);
            for (uint32_t jj = 0; jj < DV; jj++) {
                double z = mr[h * DV + jj];
                ref[(size_t)t * VH * DV + h * DV + jj] = (float)(o[jj] * inv * w[jj] * z / (1.0 + std::exp(-z)));
            }
        }
    }
    return ref;
}

/* The three forms of the rule against the recurrence in double: delta_rule.comp,
 * delta_rule_sg.comp (where the device shuffles) and the chunked form in chunks of 64, 4 and 3
 * rows (groups of 5: one short chunk, a whole and a short one, two whole ones' worth). */
TEST(Kernel, DeltaRuleBothFormsMatchTheRecurrence) {
    NEED_DEVICE();
    uint32_t width = 0;
    bool sg = ft_has_subgroup_shuffle(ctx().c, &width);
    const uint32_t KH = 2, VH = 4, n = 10, group = 5, groups = n / group;
    for (uint32_t DK : {16u, 64u, 128u, 256u}) {
        for (uint32_t DV : {16u, 96u}) {
            const uint32_t CD = 2 * KH * DK + VH * DV, MIX = VH * DV + 2 * VH;
            uint32_t lanes = 1;
            while (lanes * 32 < DK) lanes *= 2;
            std::vector<float> qkv = ft::randn((size_t)n * CD, 1.0f, 31 + DK), mix = ft::randn((size_t)n * MIX, 1.5f, 32 + DV);
            std::vector<float> neg_a = ft::randn(VH, 1.0f, 33), dt = ft::randn(VH, 0.5f, 34), w = ft::randn(DV, 0.2f, 35);
            for (float &x : neg_a) x = -std::exp(x);
            for (float &x : w) x += 1.0f;
            std::vector<float> s0 = ft::randn((size_t)groups * VH * DK * DV, 0.3f, 36);
            for (int v_tiled : {0, 1})
                for (uint32_t pos0 : {0u, 7u}) {
                    std::vector<double> S(s0.begin(), s0.end());
                    if (pos0 == 0) std::fill(S.begin(), S.end(), 0.0);
                    std::vector<float> ref = delta_rule_ref(n, group, KH, VH, DK, DV, v_tiled, qkv, mix, neg_a, dt, w, S);
                    std::vector<float> sref(S.begin(), S.end());
                    struct Form {
                        uint32_t lanes, chunk;
                    };
                    for (Form f : {Form{0, 0}, Form{lanes, 0}, Form{0, 64}, Form{0, 4}, Form{0, 3}}) {
                        if (f.lanes && (!sg || f.lanes > width)) continue;
                        std::vector<float> st = s0, out((size_t)n * VH * DV);
                        forge_status want = f.chunk && DK > 128 ? FORGE_ERR_UNSUPPORTED : FORGE_OK; /* (heads wider take the recurrent form) */
                        ASSERT_EQ(ft_delta_rule(ctx().c, f.lanes, f.chunk, n, group, pos0, KH, VH, DK, DV, v_tiled, qkv.data(), mix.data(), neg_a.data(),
                                                dt.data(), w.data(), 1e-6f, st.data(), out.data()),
                                  want);
                        if (want != FORGE_OK) continue;
                        std::string what = (f.chunk ? "chunked, chunks of " + std::to_string(f.chunk)
                                            : f.lanes ? "delta_rule_sg lanes " + std::to_string(f.lanes)
                                                      : std::string("delta_rule")) +
                                           " DK " + std::to_string(DK) + " DV " + std::to_string(DV) + (v_tiled ? " tiled" : "") + " pos0 " +
                                           std::to_string(pos0);
                        EXPECT_LT(ft::rel_err(out.data(), ref.data(), ref.size()), 1e-5) << what;
                        EXPECT_LT(ft::rel_err(st.data(), sref.data(), sref.size()), 1e-5) << what << " (state)";
                    }
                }
        }
    }
    if (!sg) GTEST_SKIP() << "this device has no subgroup shuffles: delta_rule_sg.comp was not run";
}

/* The chunked form over prompts of several 64-row chunks (Qwen 3.5's head dims, two sequences
 * of 150 rows: chunks of 64, 64 and 22), from a zero state and on from a given one, against the
 * recurrence in double; the decays strong enough that e^G underflows within a chunk. */
TEST(Kernel, DeltaRuleChunkedFormOverLongPrompts) {
    NEED_DEVICE();
    const uint32_t KH = 2, VH = 4, group = 150, n = 2 * group, groups = 2;
    for (uint32_t DK : {128u, 64u}) {
        const uint32_t DV = DK == 128 ? 128u : 40u, CD = 2 * KH * DK + VH * DV, MIX = VH * DV + 2 * VH;
        std::vector<float> qkv = ft::randn((size_t)n * CD, 1.0f, 41 + DK), mix = ft::randn((size_t)n * MIX, 1.5f, 42);
        std::vector<float> neg_a = ft::randn(VH, 1.0f, 43), dt = ft::randn(VH, 0.5f, 44), w = ft::randn(DV, 0.2f, 45);
        for (size_t h = 0; h < VH; h++) neg_a[h] = -std::exp(neg_a[h]) * (h == 1 ? 40.0f : 1.0f); /* head 1: decays near 0 */
        for (float &x : w) x += 1.0f;
        std::vector<float> s0 = ft::randn((size_t)groups * VH * DK * DV, 0.3f, 46);
        for (uint32_t pos0 : {0u, 300u}) {
            std::vector<double> S(s0.begin(), s0.end());
            if (pos0 == 0) std::fill(S.begin(), S.end(), 0.0);
            std::vector<float> ref = delta_rule_ref(n, group, KH, VH, DK, DV, 0, qkv, mix, neg_a, dt, w, S);
            std::vector<float> sref(S.begin(), S.end()), st = s0, out((size_t)n * VH * DV);
            ASSERT_EQ(ft_delta_rule(ctx().c, 0, 64, n, group, pos0, KH, VH, DK, DV, 0, qkv.data(), mix.data(), neg_a.data(), dt.data(), w.data(),
                                    1e-6f, st.data(), out.data()),
                      FORGE_OK);
            std::string what = "DK " + std::to_string(DK) + " pos0 " + std::to_string(pos0);
            EXPECT_LT(ft::rel_err(out.data(), ref.data(), ref.size()), 1e-5) << what;
            EXPECT_LT(ft::rel_err(st.data(), sref.data(), sref.size()), 1e-5) << what << " (state)";
        }
    }
}
