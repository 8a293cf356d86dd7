/* Every backward kernel of training against central finite differences of a plain f64 host
 * forward: for an op y = f(x) and random weights c, the kernel's input gradient for dy = c
 * must equal d(sum c * f(x)) / dx, element by element (max|d|/max|ref| <= 2e-5: the kernels
 * run in f32). Also the low-rank gemm (strides, accumulation, dropout masks that the backward
 * pass recomputes) and AdamW against torch's arithmetic in f64. */
#include "internal.h"
#include "util.h"

#include <functional>

namespace {

ft_ctx *dev() { return ft_device(); }
#define NEED_DEVICE() ASSERT_NE(dev(), nullptr) << "no Vulkan device"

/* Central differences of a scalar function of x, in f64, at every element. */
std::vector<double> numeric_grad(std::vector<double> x, const std::function<double(const std::vector<double> &)> &f, double h = 1e-5) {
    std::vector<double> g(x.size());
    for (size_t i = 0; i < x.size(); i++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double fp = f(x);
        x[i] = x0 - h;
        double fm = f(x);
        x[i] = x0;
        g[i] = (fp - fm) / (2 * h);
    }
    return g;
}

double rel(const std::vector<float> &got, const std::vector<double> &ref) {
    double md = 0, mr = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        md = std::fmax(md, std::fabs(got[i] - ref[i]));
        mr = std::fmax(mr, std::fabs(ref[i]));
    }
    return mr > 0 ? md / mr : md;
}

std::vector<double> to_d(const std::vector<float> &v) { return std::vector<double>(v.begin(), v.end()); }

double dot(const std::vector<float> &c, const std::vector<double> &y) {
    double s = 0;
    for (size_t i = 0; i < y.size(); i++) s += (double)c[i] * y[i];
    return s;
}

/* ---- RMSNorm ---- */

std::vector<double> rmsnorm_ref(const std::vector<double> &x, const std::vector<float> &w, uint32_t rows, uint32_t dim, uint32_t heads,
                                uint32_t stride, uint32_t col0, double eps) {
    std::vector<double> y(x.size(), 0.0);
    uint32_t units = heads ? rows * heads : rows;
    for (uint32_t g = 0; g < units; g++) {
        size_t b = heads ? (size_t)(g / heads) * stride + col0 + (g % heads) * dim : (size_t)g * dim;
        double ss = 0;
        for (uint32_t i = 0; i < dim; i++) ss += x[b + i] * x[b + i];
        double r = 1.0 / std::sqrt(ss / dim + eps);
        for (uint32_t i = 0; i < dim; i++) y[b + i] = x[b + i] * r * w[i];
    }
    return y;
}

TEST(TrainKernels, RmsNormBackMatchesFiniteDifferences) {
    NEED_DEVICE();
    const float eps = 1e-5f;
    struct Case { uint32_t rows, dim, heads, stride, col0; int accumulate; } cases[] = {
        {5, 40, 0, 0, 0, 0}, {3, 300, 0, 0, 0, 1}, /* block norms, dim above the workgroup */
        {4, 16, 3, 80, 16, 0},                     /* per-head norms inside wider rows (q/k norms) */
    };
    for (const Case &k : cases) {
        size_t n = k.heads ? (size_t)k.rows * k.stride : (size_t)k.rows * k.dim;
        std::vector<float> x = ft::randn(n, 1.0f, 1), w = ft::randn(k.dim, 0.5f, 2), c = ft::randn(n, 1.0f, 3);
        for (auto &v : w) v += 1.0f;
        std::vector<float> out = ft::randn(n, 1.0f, 4), base = out;
        ASSERT_EQ(ft_rmsnorm_back(dev(), x.data(), w.data(), c.data(), out.data(), n, k.rows, k.dim, k.heads, k.stride, k.col0, eps, k.accumulate),
                  FORGE_OK);
        std::vector<double> g = numeric_grad(to_d(x), [&](const std::vector<double> &xx) {
            return dot(c, rmsnorm_ref(xx, w, k.rows, k.dim, k.heads, k.stride, k.col0, eps));
        });
        std::vector<double> want(n);
        for (size_t i = 0; i < n; i++) {
            bool inside = !k.heads || (i % k.stride >= k.col0 && i % k.stride < k.col0 + k.heads * k.dim);
            want[i] = inside ? g[i] + (k.accumulate ? base[i] : 0.0) : base[i]; /* outside the heads: untouched */
        }
        double e = rel(out, want);
        EXPECT_LE(e, 2e-5) << "rows " << k.rows << " dim " << k.dim << " heads " << k.heads;
    }
}

/* ---- RoPE ---- */

std::vector<double> rope_ref(const std::vector<double> &x, uint32_t n, uint32_t H, uint32_t Hkv, uint32_t D, uint32_t stride, uint32_t k_off,
                             const std::vector<float> &inv, uint32_t seq, bool adjacent) {
    std::vector<double> y = x;
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t part = 0; part < 2; part++)
            for (uint32_t h = 0; h < (part ? Hkv : H); h++)
                for (uint32_t i = 0; i < D / 2; i++) {
                    size_t b = (size_t)t * stride + (part ? k_off : 0) + h * D;
                    size_t i0 = adjacent ? 2 * i : i, i1 = adjacent ? 2 * i + 1 : i + D / 2;
                    double th = (double)(t % seq) * inv[i], cs = std::cos(th), sn = std::sin(th);
                    y[b + i0] = x[b + i0] * cs - x[b + i1] * sn;
                    y[b + i1] = x[b + i1] * cs + x[b + i0] * sn;
                }
    return y;
}

TEST(TrainKernels, RopeBackMatchesFiniteDifferences) {
    NEED_DEVICE();
    const uint32_t n = 10, H = 3, Hkv = 1, D = 8, seq = 5, k_off = H * D, stride = (H + 2 * Hkv) * D;
    std::vector<float> inv(D / 2);
    for (uint32_t i = 0; i < D / 2; i++) inv[i] = (float)(1.0 / std::pow(100.0, 2.0 * i / D));
    for (int adjacent = 0; adjacent < 3; adjacent++) {
        if (adjacent == 2) /* Qwen 3.5's partial RoPE: the pairs past R/2 (forge's dim order) turn by no angle */
            for (uint32_t i = 1; i < D / 2; i++) inv[i] = 0.0f;
        std::vector<float> x = ft::randn((size_t)n * stride, 1.0f, 5), c = ft::randn(x.size(), 1.0f, 6);
        for (uint32_t t = 0; t < n; t++) /* the v columns are not rotated: their gradient passes as it is */
            for (uint32_t j = k_off + Hkv * D; j < stride; j++) c[(size_t)t * stride + j] = 0.0f;
        std::vector<float> g = c;
        ASSERT_EQ(ft_rope_back(dev(), g.data(), n, H, Hkv, D, stride, k_off, inv.data(), seq, adjacent == 1), FORGE_OK);
        std::vector<double> want = numeric_grad(to_d(x), [&](const std::vector<double> &xx) {
            return dot(c, rope_ref(xx, n, H, Hkv, D, stride, k_off, inv, seq, adjacent == 1));
        });
        EXPECT_LE(rel(g, want), 2e-5) << (adjacent == 1 ? "adjacent pairs" : adjacent ? "partial rotate-half" : "rotate-half");
    }
}

/* ---- attention ---- */

struct AttnShape {
    uint32_t B, T, H, Hkv, D, window;
    float scale, softcap;
};

/* O [B T, H, D] from qkv rows [B T, (H + 2 Hkv) D] (q | k | v), causal within each sequence. */
std::vector<double> attention_ref(const std::vector<double> &qkv, const AttnShape &s) {
    uint32_t QD = s.H * s.D, KVD = s.Hkv * s.D, S = QD + 2 * KVD, grp = s.H / s.Hkv;
    std::vector<double> o((size_t)s.B * s.T * QD, 0.0);
    std::vector<double> p(s.T);
    for (uint32_t b = 0; b < s.B; b++)
        for (uint32_t h = 0; h < s.H; h++)
            for (uint32_t i = 0; i < s.T; i++) {
                const double *q = &qkv[((size_t)b * s.T + i) * S + h * s.D];
                double mx = -1e300;
                for (uint32_t j = 0; j <= i; j++) {
                    if (s.window && i - j >= s.window) { p[j] = -1e300; continue; }
                    const double *k = &qkv[((size_t)b * s.T + j) * S + QD + (h / grp) * s.D];
                    double z = 0;
                    for (uint32_t d = 0; d < s.D; d++) z += q[d] * k[d];
                    z *= s.scale;
                    if (s.softcap > 0) z = s.softcap * std::tanh(z / s.softcap);
                    p[j] = z;
                    mx = std::fmax(mx, z);
                }
                double sum = 0;
                for (uint32_t j = 0; j <= i; j++) sum += p[j] > -1e299 ? std::exp(p[j] - mx) : 0.0;
                for (uint32_t j = 0; j <= i; j++) {
                    if (p[j] < -1e299) continue;
                    double a = std::exp(p[j] - mx) / sum;
                    const double *v = &qkv[((size_t)b * s.T + j) * S + QD + KVD + (h / grp) * s.D];
                    for (uint32_t d = 0; d < s.D; d++) o[((size_t)b * s.T + i) * QD + h * s.D + d] += a * v[d];
                }
            }
    return o;
}

TEST(TrainKernels, AttentionBackMatchesFiniteDifferences) {
    NEED_DEVICE();
    AttnShape shapes[] = {
        {2, 11, 4, 2, 8, 0, 0.35f, 0.0f},   /* GQA, a sequence length that is not a multiple of the tiles */
        {1, 20, 2, 1, 16, 6, 0.25f, 0.0f},  /* a sliding window shorter than the sequence */
        {2, 9, 2, 2, 8, 4, 0.5f, 3.0f},     /* soft-capping that bites (Gemma 2), with a window */
    };
    for (const AttnShape &s : shapes) {
        uint32_t n = s.B * s.T, S = (s.H + 2 * s.Hkv) * s.D, QD = s.H * s.D;
        std::vector<float> qkv = ft::randn((size_t)n * S, 1.0f, 7), c = ft::randn((size_t)n * QD, 1.0f, 8);
        std::vector<float> o((size_t)n * QD), g((size_t)n * S);
        ASSERT_EQ(ft_attention_train(dev(), qkv.data(), s.B, s.T, s.H, s.Hkv, s.D, s.window, s.scale, s.softcap, c.data(), o.data(), g.data()),
                  FORGE_OK);
        EXPECT_LE(rel(o, attention_ref(to_d(qkv), s)), 2e-6) << "forward, T " << s.T;
        std::vector<double> want = numeric_grad(to_d(qkv), [&](const std::vector<double> &x) { return dot(c, attention_ref(x, s)); });
        double e = rel(g, want);
        printf("  attention B %u T %u H %u/%u D %u window %u softcap %g: dq|dk|dv max|d|/max|ref| = %.2e\n", s.B, s.T, s.H, s.Hkv, s.D,
               s.window, s.softcap, e);
        EXPECT_LE(e, 2e-5) << "T " << s.T << " window " << s.window << " softcap " << s.softcap;
    }
}

/* ---- the gated MLP's activation ---- */

double act_ref(double g, uint32_t act) {
    if (act == 0) return g / (1 + std::exp(-g));
    const double k = 0.7978845608028654;
    return 0.5 * g * (1 + std::tanh(k * (g + 0.044715 * g * g * g)));
}

TEST(TrainKernels, ActMulBackMatchesFiniteDifferences) {
    NEED_DEVICE();
    const uint32_t rows = 3, F = 37;
    for (uint32_t act = 0; act < 2; act++)
        for (int pairs = 0; pairs < 2; pairs++) {
            std::vector<float> gu = ft::randn((size_t)rows * 2 * F, 1.5f, 9 + act), c = ft::randn((size_t)rows * F, 1.0f, 10);
            std::vector<float> dgu(gu.size());
            ASSERT_EQ(ft_act_mul_back(dev(), c.data(), gu.data(), dgu.data(), rows, F, act, pairs), FORGE_OK);
            auto f = [&](const std::vector<double> &x) {
                double s = 0;
                for (uint32_t r = 0; r < rows; r++)
                    for (uint32_t i = 0; i < F; i++) {
                        size_t gi = pairs ? (size_t)r * 2 * F + 2 * i : (size_t)r * 2 * F + i, ui = pairs ? gi + 1 : gi + F;
                        s += c[(size_t)r * F + i] * act_ref(x[gi], act) * x[ui];
                    }
                return s;
            };
            EXPECT_LE(rel(dgu, numeric_grad(to_d(gu), f)), 2e-5) << "act " << act << " pairs " << pairs;
        }
}

/* Qwen 3.5's attention output gate: h = u * sigmoid(g), the gates in wider rows (the q|k|v|gate
 * rows), the ups' gradient written over dh as the trainer runs it. */
TEST(TrainKernels, SigmoidOutputGateBackMatchesFiniteDifferences) {
    NEED_DEVICE();
    const uint32_t rows = 5, F = 40, stride = 130, col0 = 77;
    std::vector<float> u = ft::randn((size_t)rows * F, 1.0f, 30), gates = ft::randn((size_t)rows * stride, 2.0f, 31);
    std::vector<float> c = ft::randn((size_t)rows * F, 1.0f, 32), dgates = ft::randn(gates.size(), 1.0f, 33), base = dgates, du = c;
    ASSERT_EQ(ft_gate_back(dev(), du.data(), u.data(), gates.data(), dgates.data(), rows, F, stride, col0), FORGE_OK);
    auto f = [&](const std::vector<double> &uu, const std::vector<double> &gg) {
        double s = 0;
        for (uint32_t r = 0; r < rows; r++)
            for (uint32_t i = 0; i < F; i++) s += c[(size_t)r * F + i] * uu[(size_t)r * F + i] / (1 + std::exp(-gg[(size_t)r * stride + col0 + i]));
        return s;
    };
    std::vector<double> gd = to_d(gates), ud = to_d(u);
    EXPECT_LE(rel(du, numeric_grad(ud, [&](const std::vector<double> &x) { return f(x, gd); })), 2e-5) << "the ups";
    std::vector<double> want = numeric_grad(gd, [&](const std::vector<double> &x) { return f(ud, x); });
    for (size_t i = 0; i < want.size(); i++)
        if (i % stride < col0 || i % stride >= col0 + F) want[i] = base[i]; /* the other columns: untouched */
    EXPECT_LE(rel(dgates, want), 2e-5) << "the gates";
}

/* ---- Qwen 3.5's linear attention ---- */

/* y [n, C] = silu(causal depthwise convolution of x's first C columns), groups of G rows from zero */
std::vector<double> conv_ref(const std::vector<double> &x, const std::vector<float> &w, uint32_t n, uint32_t C, uint32_t K, uint32_t stride,
                             uint32_t G) {
    std::vector<double> y((size_t)n * C);
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t ch = 0; ch < C; ch++) {
            double p = 0;
            for (uint32_t j = 0; j < K; j++) {
                int64_t s = (int64_t)t - (K - 1) + j;
                if (s >= (int64_t)(t - t % G)) p += w[(size_t)ch * K + j] * x[(size_t)s * stride + ch];
            }
            y[(size_t)t * C + ch] = p / (1 + std::exp(-p));
        }
    return y;
}

TEST(TrainKernels, Conv1dBackMatchesFiniteDifferences) {
    NEED_DEVICE();
    struct Case { uint32_t n, C, K, stride, G; } cases[] = {{12, 70, 4, 90, 6}, {9, 5, 1, 5, 9}, {7, 3, 3, 8, 7}};
    for (const Case &k : cases) {
        std::vector<float> x = ft::randn((size_t)k.n * k.stride, 1.0f, 34), w = ft::randn((size_t)k.C * k.K, 0.7f, 35);
        std::vector<float> c = ft::randn((size_t)k.n * k.C, 1.0f, 36), dx = ft::randn(x.size(), 1.0f, 37), base = dx;
        ASSERT_EQ(ft_conv1d_back(dev(), x.data(), w.data(), c.data(), dx.data(), k.n, k.C, k.K, k.stride, k.G), FORGE_OK);
        std::vector<double> want = numeric_grad(to_d(x), [&](const std::vector<double> &xx) { return dot(c, conv_ref(xx, w, k.n, k.C, k.K, k.stride, k.G)); });
        for (size_t i = 0; i < want.size(); i++)
            if (i % k.stride >= k.C) want[i] = base[i]; /* z, b, a's columns of the in-projection's rows: untouched */
        EXPECT_LE(rel(dx, want), 2e-5) << "n " << k.n << " channels " << k.C << " taps " << k.K;
    }
}

/* The gated delta rule with its L2 norms, gates and gated norm (delta_rule.comp's header), in
 * f64: out [B T, VD] from qkv [B T, CD] and mix [B T, VD + 2 NV] (z, b, a). */
std::vector<double> delta_ref(const ft_delta_shape &d, const std::vector<double> &qkv, const std::vector<double> &mix, const std::vector<float> &neg_a,
                              const std::vector<float> &dt, const std::vector<float> &w) {
    uint32_t DK = d.k_dim, DV = d.v_dim, KD = d.k_heads * DK, VD = d.v_heads * DV, CD = 2 * KD + VD, MIX = VD + 2 * d.v_heads;
    std::vector<double> out((size_t)d.B * d.T * VD), S((size_t)DK * DV), q(DK), k(DK), o(DV);
    for (uint32_t g = 0; g < d.B; g++)
        for (uint32_t h = 0; h < d.v_heads; h++) {
            std::fill(S.begin(), S.end(), 0.0);
            uint32_t kh = d.v_tiled ? h % d.k_heads : h / (d.v_heads / d.k_heads);
            for (uint32_t t = g * d.T; t < (g + 1) * d.T; t++) {
                const double *row = &qkv[(size_t)t * CD], *m = &mix[(size_t)t * MIX];
                double sq = 0, sk = 0;
                for (uint32_t i = 0; i < DK; i++) {
                    q[i] = row[kh * DK + i];
                    k[i] = row[KD + kh * DK + i];
                    sq += q[i] * q[i];
                    sk += k[i] * k[i];
                }
                for (uint32_t i = 0; i < DK; i++) {
                    q[i] /= std::sqrt(sq + 1e-6) * std::sqrt((double)DK);
                    k[i] /= std::sqrt(sk + 1e-6);
                }
                double beta = 1 / (1 + std::exp(-m[VD + h])), ax = m[VD + d.v_heads + h] + dt[h];
                double decay = std::exp(neg_a[h] * (ax > 20 ? ax : std::log1p(std::exp(ax)))), ss = 0;
                for (uint32_t j = 0; j < DV; j++) {
                    double kv = 0;
                    for (uint32_t i = 0; i < DK; i++) kv += S[(size_t)i * DV + j] * k[i];
                    double delta = (row[2 * KD + h * DV + j] - decay * kv) * beta;
                    o[j] = 0;
                    for (uint32_t i = 0; i < DK; i++) {
                        double &s = S[(size_t)i * DV + j];
                        s = decay * s + k[i] * delta;
                        o[j] += s * q[i];
                    }
                    ss += o[j] * o[j];
                }
                double r = 1 / std::sqrt(ss / DV + d.eps);
                for (uint32_t j = 0; j < DV; j++) {
                    double z = m[h * DV + j];
                    out[(size_t)t * VD + h * DV + j] = o[j] * r * w[j] * z / (1 + std::exp(-z));
                }
            }
        }
    return out;
}

TEST(TrainKernels, DeltaRuleBackMatchesFiniteDifferences) {
    NEED_DEVICE();
    ft_delta_shape shapes[] = {
        {2, 11, 2, 4, 8, 6, 4, 1e-6f, 0},      /* two value heads a key head, a last chunk of 3 rows */
        {1, 9, 2, 6, 16, 8, 9, 1e-6f, 1},      /* one chunk; the value heads tiled (GGUF: head h reads key head h % 2) */
        {1, 6, 1, 1, 130, 136, 2, 1e-6f, 0},   /* heads wider than the workgroup: two columns and two rows an invocation */
    };
    for (const ft_delta_shape &d : shapes) {
        uint32_t n = d.B * d.T, VD = d.v_heads * d.v_dim, CD = 2 * d.k_heads * d.k_dim + VD, MIX = VD + 2 * d.v_heads;
        std::vector<float> qkv = ft::randn((size_t)n * CD, 1.0f, 40), mix = ft::randn((size_t)n * MIX, 1.0f, 41);
        std::vector<float> neg_a = ft::randn(d.v_heads, 0.5f, 42), dt = ft::randn(d.v_heads, 0.5f, 43), w = ft::randn(d.v_dim, 0.2f, 44);
        for (auto &v : neg_a) v = -std::exp(v);
        for (auto &v : w) v += 1.0f;
        mix[(size_t)2 * MIX + VD + d.v_heads] = 24.0f; /* a row whose softplus is linear (torch's threshold 20) */
        std::vector<float> out((size_t)n * VD), c = ft::randn((size_t)n * VD, 1.0f, 45);
        ASSERT_EQ(ft_delta_rule_forward(dev(), &d, qkv.data(), mix.data(), neg_a.data(), dt.data(), w.data(), out.data()), FORGE_OK);
        std::vector<double> qd = to_d(qkv), md = to_d(mix);
        EXPECT_LE(rel(out, delta_ref(d, qd, md, neg_a, dt, w)), 2e-6) << "the forward kernel against the reference";
        std::vector<float> dqkv((size_t)n * CD), dmix((size_t)n * MIX);
        ASSERT_EQ(ft_delta_rule_back(dev(), &d, qkv.data(), mix.data(), neg_a.data(), dt.data(), w.data(), c.data(), dqkv.data(), dmix.data()), FORGE_OK);
        std::vector<double> gq = numeric_grad(qd, [&](const std::vector<double> &x) { return dot(c, delta_ref(d, x, md, neg_a, dt, w)); });
        std::vector<double> gm = numeric_grad(md, [&](const std::vector<double> &x) { return dot(c, delta_ref(d, qd, x, neg_a, dt, w)); });
        /* q, k (through the L2 norms) and v; z, b and a */
        std::vector<float> got[2][3];
        std::vector<double> want[2][3];
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t i = 0; i < CD; i++) {
                int part = i < d.k_heads * d.k_dim ? 0 : i < 2 * d.k_heads * d.k_dim ? 1 : 2;
                got[0][part].push_back(dqkv[(size_t)t * CD + i]);
                want[0][part].push_back(gq[(size_t)t * CD + i]);
            }
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t i = 0; i < MIX; i++) {
                int part = i < VD ? 0 : i < VD + d.v_heads ? 1 : 2;
                got[1][part].push_back(dmix[(size_t)t * MIX + i]);
                want[1][part].push_back(gm[(size_t)t * MIX + i]);
            }
        const char *names[2][3] = {{"dq", "dk", "dv"}, {"dz", "db", "da"}};
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 3; b++) {
                double e = rel(got[a][b], want[a][b]);
                printf("  delta rule B %u T %u heads %u/%u%s dims %u/%u chunk %u: %s max|d|/max|ref| = %.2e\n", d.B, d.T, d.k_heads, d.v_heads,
                       d.v_tiled ? " tiled" : "", d.k_dim, d.v_dim, d.chunk, names[a][b], e);
                EXPECT_LE(e, 2e-5) << names[a][b] << ", T " << d.T << " dims " << d.k_dim << "/" << d.v_dim;
            }
    }
}

/* ---- the losses ---- */

TEST(TrainKernels, CrossEntropyAndSquaredErrorMatchFiniteDifferences) {
    NEED_DEVICE();
    const uint32_t rows = 4, V = 300;
    for (float cap : {0.0f, 4.0f}) {
        std::vector<float> raw = ft::randn((size_t)rows * V, 2.0f, 11), w = {0.25f, 0.0f, 0.5f, 0.25f};
        std::vector<int32_t> y = {7, -1, 299, 0};
        std::vector<float> z(raw.size());
        for (size_t i = 0; i < raw.size(); i++) z[i] = cap > 0 ? cap * std::tanh(raw[i] / cap) : raw[i];
        std::vector<float> g = z, loss(rows);
        ASSERT_EQ(ft_loss(dev(), g.data(), rows, V, 0, y.data(), nullptr, w.data(), cap, 1, loss.data()), FORGE_OK);
        auto ce = [&](const std::vector<double> &a, uint32_t r) {
            double mx = -1e300, s = 0;
            std::vector<double> zz(V);
            for (uint32_t j = 0; j < V; j++) zz[j] = cap > 0 ? cap * std::tanh(a[(size_t)r * V + j] / cap) : a[(size_t)r * V + j];
            for (double v : zz) mx = std::fmax(mx, v);
            for (double v : zz) s += std::exp(v - mx);
            return mx + std::log(s) - zz[y[r]];
        };
        auto f = [&](const std::vector<double> &a) {
            double s = 0;
            for (uint32_t r = 0; r < rows; r++)
                if (y[r] >= 0) s += w[r] * ce(a, r);
            return s;
        };
        EXPECT_LE(rel(g, numeric_grad(to_d(raw), f)), 2e-5) << "cross-entropy, softcap " << cap;
        for (uint32_t r = 0; r < rows; r++) {
            double want = y[r] >= 0 ? ce(to_d(raw), r) : 0.0;
            EXPECT_NEAR(loss[r], want, 1e-5 * (1 + std::fabs(want))) << "row " << r;
        }
    }
    /* squared error against targets: loss = sum (p - t)^2 per row, gradient w 2 (p - t) */
    std::vector<float> p = ft::randn((size_t)rows * 33, 1.0f, 12), t = ft::randn(p.size(), 1.0f, 13), w = {0.1f, 0.2f, 0.0f, 0.3f};
    std::vector<float> g = p, loss(rows);
    ASSERT_EQ(ft_loss(dev(), g.data(), rows, 33, 1, nullptr, t.data(), w.data(), 0.0f, 1, loss.data()), FORGE_OK);
    auto f = [&](const std::vector<double> &x) {
        double s = 0;
        for (uint32_t r = 0; r < rows; r++)
            for (uint32_t j = 0; j < 33; j++) s += w[r] * (x[r * 33 + j] - t[r * 33 + j]) * (x[r * 33 + j] - t[r * 33 + j]);
        return s;
    };
    EXPECT_LE(rel(g, numeric_grad(to_d(p), f)), 2e-5) << "squared error";
}

/* ---- the frozen weight's backward product: dX = dY . W (every format: test_quant.cpp) ---- */

TEST(TrainKernels, MatmulBackMatchesFiniteDifferences) {
    NEED_DEVICE();
    for (int fmt : {FT_F32, FT_F16, FT_BF16}) {
        const uint32_t M = 70, N = 45, K = 37; /* K not a multiple of 8, several chunks */
        std::vector<float> Wf = ft::randn((size_t)N * K, 0.5f, 14);
        std::vector<uint8_t> bytes((size_t)N * K * (fmt == FT_F32 ? 4 : 2));
        std::vector<double> Wd(Wf.size());
        for (size_t i = 0; i < Wf.size(); i++) {
            if (fmt == FT_F32) {
                memcpy(&bytes[4 * i], &Wf[i], 4);
                Wd[i] = Wf[i];
            } else {
                uint16_t h = fmt == FT_F16 ? ft_f32_to_f16(Wf[i]) : ft_f32_to_bf16(Wf[i]);
                memcpy(&bytes[2 * i], &h, 2);
                Wd[i] = fmt == FT_F16 ? ft_f16_to_f32(h) : ft_bf16_to_f32(h);
            }
        }
        ft_weight w = {fmt, bytes.data(), (size_t)K * (fmt == FT_F32 ? 4 : 2), nullptr, nullptr, 0, 0, 0, 0};
        std::vector<float> x = ft::randn((size_t)M * K, 1.0f, 15), c = ft::randn((size_t)M * N, 1.0f, 16), dx((size_t)M * K);
        for (int big = 0; big < 2; big++) {
        ASSERT_EQ(ft_matmul_back(dev(), &w, c.data(), M, N, K, 16, big, dx.data()), FORGE_OK);
        auto f = [&](const std::vector<double> &xx) { /* sum c * (x W^T) */
            double s = 0;
            for (uint32_t m = 0; m < M; m++)
                for (uint32_t nn = 0; nn < N; nn++) {
                    double y = 0;
                    for (uint32_t k = 0; k < K; k++) y += xx[(size_t)m * K + k] * Wd[(size_t)nn * K + k];
                    s += c[(size_t)m * N + nn] * y;
                }
            return s;
        };
        EXPECT_LE(rel(dx, numeric_grad(to_d(x), f, 1e-3)), 2e-5) << "format " << fmt << " big " << big;
        }
    }
}

/* ... on the tensor cores (matmul_cm_back on act_f16_scaled's rows), where the device has them,
 * against the exact SIMT kernel: chunks of W that add up (and whose rows are no multiple of 8:
 * dY's f16 rows padded), partial tiles, rows in groups when the scratch holds only 128 of them,
 * and rows of gradients many orders under f16's normal range. */
TEST(TrainKernels, MatmulBackOnTensorCoresMatchesTheSimtKernel) {
    NEED_DEVICE();
    struct Shape { uint32_t M, N, chunk; };
    const uint32_t K = 160;
    /* 45 rows of W in chunks of 16; 1000 rows in one chunk, few tiles: split along N */
    for (Shape sh : {Shape{300, 45, 16}, Shape{150, 1000, 0}})
    for (int fmt : {FT_F16, FT_Q4_0}) {
        const uint32_t M = sh.M, N = sh.N;
        std::vector<uint8_t> bytes;
        size_t row_bytes;
        std::vector<float> Wf = ft::randn((size_t)N * K, 0.5f, 20);
        if (fmt == FT_F16) {
            row_bytes = 2 * K;
            bytes.resize(N * row_bytes);
            for (size_t i = 0; i < Wf.size(); i++) {
                uint16_t h = ft_f32_to_f16(Wf[i]);
                memcpy(&bytes[2 * i], &h, 2);
            }
        } else { /* Q4_0 blocks: an f16 scale, then 16 bytes of nibbles (codes - 8) */
            row_bytes = (size_t)K / 32 * 18;
            bytes.assign(N * row_bytes, 0);
            for (uint32_t n = 0; n < N; n++)
                for (uint32_t b = 0; b < K / 32; b++) {
                    uint8_t *blk = &bytes[n * row_bytes + b * 18];
                    uint16_t d = ft_f32_to_f16(0.05f + 0.01f * (float)((n + b) % 7));
                    memcpy(blk, &d, 2);
                    for (uint32_t j = 0; j < 16; j++) blk[2 + j] = (uint8_t)(((n * 7 + b * 3 + j) % 16) | (((n * 5 + j * 11 + b) % 16) << 4));
                }
        }
        ft_weight w = {fmt, bytes.data(), row_bytes, nullptr, nullptr, 0, 0, 0, 0};
        std::vector<float> dy = ft::randn((size_t)M * N, 1.0f, 21);
        for (uint32_t m = 0; m < M; m += 3) /* every third row far under f16's normal range */
            for (uint32_t n = 0; n < N; n++) dy[(size_t)m * N + n] *= 3e-9f;
        std::vector<float> ref((size_t)M * K), got(ref.size(), NAN);
        ASSERT_EQ(ft_matmul_back(dev(), &w, dy.data(), M, N, K, sh.chunk, 1, ref.data()), FORGE_OK);
        for (int mode : {2, 3}) {
            forge_status st = ft_matmul_back(dev(), &w, dy.data(), M, N, K, sh.chunk, mode, got.data());
            if (st == FORGE_ERR_UNSUPPORTED) GTEST_SKIP() << "no cooperative matrices on this device";
            ASSERT_EQ(st, FORGE_OK);
            double worst = 0;
            for (uint32_t m = 0; m < M; m++) /* each row against itself: the scaled rows too */
                worst = std::fmax(worst, rel(std::vector<float>(got.begin() + (long)m * K, got.begin() + (long)(m + 1) * K),
                                             std::vector<double>(ref.begin() + (long)m * K, ref.begin() + (long)(m + 1) * K)));
            EXPECT_LE(worst, 3e-3) << "format " << fmt << " mode " << mode << " M " << M << " N " << N;
        }
    }
}

/* ---- the low-rank path's gemm ---- */

uint32_t lowbias(uint32_t x) { /* common.glsl lowbias_hash */
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

TEST(TrainKernels, GemmStridesAccumulationAndDropout) {
    NEED_DEVICE();
    for (uint32_t K : {70u, 1500u}) { /* 1500: split along k, then reduced */
    const uint32_t M = 37, N = 9;
    /* A stored transposed with an offset, B with a row stride, C a column range with a column step */
    std::vector<float> a = ft::randn(3 + (size_t)K * M, 1.0f, 17), b = ft::randn(5 + (size_t)K * 12, 1.0f, 18);
    std::vector<float> cm = ft::randn((size_t)M * 2 * N + 4, 1.0f, 19), base = cm;
    uint32_t strides[9] = {3, 1, M, 5, 12, 1, 4, 2 * N, 2};
    const float alpha = 0.75f, p = 0.4f;
    const uint32_t seed = 1234, stream = 7, threshold = (uint32_t)(p * 4294967296.0);
    uint32_t key = lowbias(seed ^ lowbias(stream + 0x9e3779b9u));
    for (uint32_t drop_on = 0; drop_on <= 3; drop_on++) {
        cm = base;
        const uint32_t ld = drop_on == 2 ? N : K; /* the dropped operand's row length */
        ASSERT_EQ(ft_gemm(dev(), a.data(), a.size(), b.data(), b.size(), cm.data(), cm.size(), strides, M, N, K, alpha, 1, drop_on, drop_on == 3 ? N : ld,
                          p, seed, stream),
                  FORGE_OK);
        auto keep = [&](uint32_t idx) { return lowbias(idx ^ key) >= threshold ? 1.0 / (1.0 - p) : 0.0; };
        std::vector<double> want(cm.size());
        for (size_t i = 0; i < cm.size(); i++) want[i] = base[i];
        size_t kept = 0, seen = 0;
        for (uint32_t m = 0; m < M; m++)
            for (uint32_t n = 0; n < N; n++) {
                double s = 0;
                for (uint32_t k = 0; k < K; k++) {
                    double av = a[3 + (size_t)k * M + m], bv = b[5 + (size_t)k * 12 + n];
                    if (drop_on == 1) av *= keep(m * K + k);
                    if (drop_on == 2) bv *= keep(k * N + n);
                    s += av * bv;
                }
                if (drop_on == 3) {
                    double kk = keep(m * N + n);
                    s *= kk;
                    kept += kk > 0;
                    seen++;
                }
                want[4 + (size_t)m * 2 * N + 2 * n] += alpha * s;
            }
        EXPECT_LE(rel(cm, want), 2e-6) << "dropout on operand " << drop_on << ", K " << K;
        if (drop_on == 3) {
            EXPECT_NEAR((double)kept / seen, 1.0 - p, 0.1);
        }
    }
    }
}

/* The adapter's six products (forward.c's forge__lora_down / _up, train.c's forge__lora_back_b /
 * _a) at ranks 16 and 40 (gemm_rank's two builds), with the strides the trainer gives them (dy
 * and y with the gate|up row's column step of 2, u and du columns of a wider scratch), dropout
 * where the trainer has it, split along k and not: each on the shape it should take, against
 * an f64 reference with gemm.comp's dropout indices. */
TEST(TrainKernels, GemmRankShapesMatchTheReference) {
    NEED_DEVICE();
    const uint32_t T = 300, IN = 200, OUT = 160, LDY = 2 * OUT + 6, YC = 3, UL = 2 * 40 + 5, UC = 4;
    const float alpha = 0.75f, p = 0.4f;
    const uint32_t seed = 99, stream = 5, threshold = (uint32_t)(p * 4294967296.0);
    uint32_t key = lowbias(seed ^ lowbias(stream + 0x9e3779b9u));
    auto keep = [&](uint32_t idx) { return lowbias(idx ^ key) >= threshold ? 1.0 / (1.0 - p) : 0.0; };
    std::vector<float> x = ft::randn((size_t)T * IN, 1.0f, 31), dy = ft::randn((size_t)T * LDY, 1.0f, 32);
    std::vector<float> u = ft::randn((size_t)T * UL, 1.0f, 33), amat = ft::randn((size_t)40 * IN, 0.5f, 34), bmat = ft::randn((size_t)OUT * 40, 0.5f, 35);
    struct Case {
        const char *what;
        const std::vector<float> *a, *b;
        uint32_t strides[9], M, N, K, drop_on, drop_ld, c_n;
        int shape; /* ft_gemm_shape: 0 WIDE, 1 ROWS, 2 COLS, 3 gemm.comp */
    };
    for (uint32_t R : {16u, 40u}) {
        Case cases[] = {
            {"u = drop(x) A^T", &x, &amat, {0, IN, 1, 0, 1, IN, UC, UL, 1}, T, R, IN, 1, IN, T * UL, 1},
            {"u = x A^T, k unsplit", &x, &amat, {0, IN, 1, 0, 1, IN, UC, UL, 1}, T, R, 100, 0, 0, T * UL, 1},
            {"y += s u B^T (gate|up step)", &u, &bmat, {UC, UL, 1, 0, 1, R, YC, LDY, 2}, T, OUT, R, 0, 0, T * LDY, 0},
            {"dB += s dy^T u", &dy, &u, {YC, 2, LDY, UC, UL, 1, 0, R, 1}, OUT, R, T, 0, 0, OUT * R, 2},
            {"dB, k unsplit", &dy, &u, {YC, 2, LDY, UC, UL, 1, 0, R, 1}, OUT, R, 100, 0, 0, OUT * R, 2},
            {"du = s dy B", &dy, &bmat, {YC, LDY, 2, 0, R, 1, UC, UL, 1}, T, R, OUT, 0, 0, T * UL, 1},
            {"dA += du^T drop(x)", &u, &x, {UC, 1, UL, 0, IN, 1, 0, IN, 1}, R, IN, T, 2, IN, R * IN, 2},
            {"dx += drop'(du A)", &u, &amat, {UC, UL, 1, 0, IN, 1, 0, IN, 1}, T, IN, R, 3, IN, T * IN, 0},
            {"x stored transposed, dropout: gemm.comp", &x, &amat, {0, 1, T, 0, 1, IN, UC, UL, 1}, T, R, IN, 1, IN, T * UL, 3},
        };
        for (const Case &k : cases) {
            SCOPED_TRACE(std::string(k.what) + ", rank " + std::to_string(R));
            const uint32_t *s = k.strides;
            EXPECT_EQ(ft_gemm_shape(s, k.M, k.N, k.K, k.drop_on, k.drop_ld), k.shape);
            std::vector<float> cm = ft::randn(k.c_n, 1.0f, 36), base = cm;
            ASSERT_EQ(ft_gemm(dev(), k.a->data(), k.a->size(), k.b->data(), k.b->size(), cm.data(), cm.size(), s, k.M, k.N, k.K, alpha, 1, k.drop_on,
                              k.drop_ld, p, seed, stream),
                      FORGE_OK);
            std::vector<double> want(base.begin(), base.end());
            for (uint32_t m = 0; m < k.M; m++)
                for (uint32_t n = 0; n < k.N; n++) {
                    double sum = 0;
                    for (uint32_t kk = 0; kk < k.K; kk++) {
                        double av = (*k.a)[s[0] + (size_t)m * s[1] + (size_t)kk * s[2]], bv = (*k.b)[s[3] + (size_t)kk * s[4] + (size_t)n * s[5]];
                        if (k.drop_on == 1) av *= keep(m * k.drop_ld + kk);
                        if (k.drop_on == 2) bv *= keep(kk * k.drop_ld + n);
                        sum += av * bv;
                    }
                    if (k.drop_on == 3) sum *= keep(m * k.drop_ld + n);
                    want[s[6] + (size_t)m * s[7] + (size_t)n * s[8]] += alpha * sum;
                }
            EXPECT_LE(rel(cm, want), 2e-6);
        }
    }
}

/* ---- AdamW ---- */

TEST(TrainKernels, AdamWMatchesTorchArithmetic) {
    NEED_DEVICE();
    const uint32_t n = 9000; /* three partial sums of the norm */
    for (float max_norm : {0.0f, 1.0f}) {
        std::vector<float> p = ft::randn(n, 1.0f, 20), g = ft::randn(n, 0.05f, 21), m = ft::randn(n, 0.01f, 22), v = ft::randn(n, 0.001f, 23);
        for (auto &x : v) x = x * x;
        const int step = 3;
        const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
        float opt[8] = {(float)(1 - lr * wd), (float)(1 - b1), (float)b2, (float)(1 - b2), (float)(lr / (1 - std::pow(b1, step))),
                        (float)std::sqrt(1 - std::pow(b2, step)), (float)eps, max_norm};
        std::vector<float> P = p, G = g, Mo = m, Vo = v;
        float norm2 = 0;
        ASSERT_EQ(ft_adamw(dev(), P.data(), G.data(), Mo.data(), Vo.data(), n, opt, &norm2), FORGE_OK);
        double ss = 0;
        for (float x : g) ss += (double)x * x;
        EXPECT_NEAR(norm2, ss, 1e-5 * ss);
        double clip = max_norm > 0 ? std::fmin(1.0, max_norm / (std::sqrt(ss) + 1e-6)) : 1.0;
        std::vector<double> wp(n), wm(n), wv(n);
        for (uint32_t i = 0; i < n; i++) { /* torch.optim.AdamW (single tensor), after clip_grad_norm_ */
            double gi = g[i] * clip, pi = p[i] * (1 - lr * wd);
            double mi = m[i] + (1 - b1) * (gi - m[i]), vi = b2 * v[i] + (1 - b2) * gi * gi;
            double denom = std::sqrt(vi) / std::sqrt(1 - std::pow(b2, step)) + eps;
            wp[i] = pi - lr / (1 - std::pow(b1, step)) * mi / denom;
            wm[i] = mi;
            wv[i] = vi;
            ASSERT_EQ(G[i], 0.0f) << "the gradient is cleared for the next accumulation";
        }
        EXPECT_LE(rel(P, wp), 1e-6) << "max_norm " << max_norm;
        EXPECT_LE(rel(Mo, wm), 1e-6);
        EXPECT_LE(rel(Vo, wv), 1e-6);
    }
}

} // namespace
