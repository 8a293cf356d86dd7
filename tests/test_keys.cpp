/* Attention-K inspection: forge_session_keys. After seq0 of a parity fixture, every layer's
 * post-RoPE keys equal the reference in keys_seq0.f32 (made by
 * `tools/fixtures/make_key_fixtures.py --hf`: HF's own past_key_values, transformers 5.17 in
 * float64, the model stepped one token at a time so that sliding-window layers give every
 * position; see tests/fixtures/parity/README.md) to 1e-4 of max|ref|
 * per layer, for safetensors and GGUF checkpoints (GGUF `llama` keys rotate adjacent pairs in
 * the cache and come back in HF's order). Sliding-window layers report exactly the positions
 * their ring still holds; a truncation and more decode steps move what is reported with the
 * cache. The size query, a too-small buffer and a bad layer fail as documented. `forge keys
 * --json` prints the same keys. */
#include <cjson/cJSON.h>

#include "parity.h"
#include "util.h"

namespace {

struct KeysRef {
    int n_layers = 0, n_kv = 0, n_tokens = 0, head_dim = 0;
    std::vector<float> k; /* [n_layers, n_kv, n_tokens, head_dim] */
    const float *at(int l, int h, int p) const { return k.data() + (((size_t)l * n_kv + h) * n_tokens + p) * head_dim; }
};

std::string parity_dir(const std::string &name) { return ft::src("tests/fixtures/parity/" + name); }

std::string errmsg(forge_session *s) { return forge_session_errmsg(s); }

/* A layer's keys from the session: the size query, then the read. */
std::vector<float> keys_of(forge_session *s, int layer, forge_keys_info *info) {
    EXPECT_EQ(forge_session_keys(s, layer, nullptr, 0, info), FORGE_OK) << errmsg(s);
    std::vector<float> k(info->n_floats);
    EXPECT_EQ(forge_session_keys(s, layer, k.data(), k.size(), info), FORGE_OK) << errmsg(s);
    return k;
}

/* Layer l of the session against the reference rows of positions info.first ..: the shape
 * and the parity metric over the layer. Returns the error. */
double expect_layer(forge_session *s, const KeysRef &ref, int l, int want_first, int want_rows, const std::string &what) {
    forge_keys_info info = ft::sized<forge_keys_info>();
    std::vector<float> got = keys_of(s, l, &info);
    EXPECT_EQ(info.n_kv_heads, ref.n_kv) << what;
    EXPECT_EQ(info.head_dim, ref.head_dim) << what;
    EXPECT_EQ(info.first, want_first) << what << " layer " << l;
    EXPECT_EQ(info.n_rows, want_rows) << what << " layer " << l;
    EXPECT_EQ(info.n_floats, (size_t)ref.n_kv * want_rows * ref.head_dim) << what;
    if (info.first != want_first || info.n_rows != want_rows || got.size() != info.n_floats) return INFINITY;
    std::vector<float> want;
    for (int h = 0; h < ref.n_kv; h++)
        for (int r = 0; r < want_rows; r++) want.insert(want.end(), ref.at(l, h, want_first + r), ref.at(l, h, want_first + r) + ref.head_dim);
    double err = ft::rel_err(got.data(), want.data(), want.size());
    EXPECT_LE(err, 1e-4) << what << " layer " << l;
    return err;
}

KeysRef read_keys(const std::string &dir, const ft::Fixture &fx, forge_session *s) {
    KeysRef r;
    forge_keys_info info = ft::sized<forge_keys_info>();
    EXPECT_EQ(forge_session_keys(s, 0, nullptr, 0, &info), FORGE_OK) << errmsg(s);
    r.n_layers = info.n_layers;
    r.n_kv = info.n_kv_heads;
    r.head_dim = info.head_dim;
    r.n_tokens = (int)fx.seqs[0].tokens.size();
    r.k = ft::read_f32(dir + "/keys_seq0.f32");
    EXPECT_EQ(r.k.size(), (size_t)r.n_layers * r.n_kv * r.n_tokens * r.head_dim) << dir << "/keys_seq0.f32";
    return r;
}

/* The window of each layer (0: full attention), as forge_session_keys reports it. */
std::vector<int> windows_of(forge_session *s, int n_layers) {
    std::vector<int> w;
    forge_keys_info info = ft::sized<forge_keys_info>();
    for (int l = 0; l < n_layers; l++) {
        EXPECT_EQ(forge_session_keys(s, l, nullptr, 0, &info), FORGE_OK);
        w.push_back(info.window);
    }
    return w;
}

/* Prefills seq0 of `name` (from `model`, default: the parity directory) in a session of
 * n_ctx 64 and n_batch, and checks every layer: full-attention layers hold positions 0..n-1,
 * a sliding layer's ring of window + n_batch - 1 slots the latest of them. */
void check_fixture(const std::string &name, const std::string &model, int n_batch) {
    std::string dir = parity_dir(name);
    ft::Fixture fx = ft::read_fixture(dir);
    forge_model *m = ft::load(model.empty() ? dir : model);
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 64, n_batch);
    ASSERT_NE(s, nullptr);
    const std::vector<int32_t> &t = fx.seqs[0].tokens;
    const int n = (int)t.size();
    ASSERT_EQ(forge_eval(s, t.data(), n, 0, nullptr, 0), FORGE_OK) << errmsg(s);
    KeysRef ref = read_keys(dir, fx, s);
    ASSERT_FALSE(ref.k.empty());
    std::vector<int> win = windows_of(s, ref.n_layers);
    double worst = 0;
    for (int l = 0; l < ref.n_layers; l++) {
        int slots = win[l] ? std::min(64, win[l] + (n_batch ? n_batch : 512) - 1) : 64, first = std::max(0, n - slots);
        worst = std::fmax(worst, expect_layer(s, ref, l, first, n - first, name + (model.empty() ? "" : " (gguf)")));
    }
    printf("  %-40s n_batch %3d: %d layers (windows", name.c_str(), n_batch, ref.n_layers);
    for (int w : win) printf(" %d", w);
    printf("), worst max|d|/max|ref| %.2e\n", worst);
    forge_session_free(s);
    forge_model_free(m);
}

} // namespace

TEST(Keys, LlamaMatchesReference) { check_fixture("llama3_f32_untied", "", 0); }
TEST(Keys, Qwen3MatchesReference) { check_fixture("qwen3_f32_sharded", "", 0); }

/* Gemma 2 (window 8 on layers 0 and 2) and Gemma 3 (5 sliding : 1 full): with n_batch 2 the
 * rings have 9 slots and after 12 tokens hold positions 3..11; with the default n_batch they
 * have not wrapped and hold all 12. */
TEST(Keys, Gemma2SlidingRingsReportWhatTheyHold) {
    check_fixture("gemma2_f32", "", 0);
    check_fixture("gemma2_f32", "", 2);
}
TEST(Keys, Gemma3SlidingRingsReportWhatTheyHold) {
    check_fixture("gemma3_text_f32", "", 0);
    check_fixture("gemma3_text_f32", "", 2);
    check_fixture("gemma3_text_f32", "", 4);
}

/* GGUF: llama.cpp's `llama` converter permutes q/k so that RoPE rotates adjacent pairs; the
 * keys come back in HF's rotate-half order, equal to the safetensors checkpoint's. */
TEST(Keys, GgufMatchesReference) {
    check_fixture("llama3_f32_untied", ft::src("tests/fixtures/gguf/llama3_f32_untied.gguf"), 0);
    check_fixture("qwen3_f32_sharded", ft::src("tests/fixtures/gguf/qwen3_f32_sharded.gguf"), 0);
    check_fixture("gemma2_f32", ft::src("tests/fixtures/gguf/gemma2_f32.gguf"), 2);
}

/* Qwen 3.5 (layers linear, linear, linear, full): the full-attention layer's keys, whose head
 * dims forge keeps permuted for the partial RoPE, come back in HF's order and equal the
 * reference (the file holds the full-attention layers only); a linear-attention layer keeps no
 * keys and says so. After a truncation (which re-evaluates the kept tokens: the recurrent state
 * cannot be cut back) and the rest prefilled again, the keys are the reference's again. */
TEST(Keys, Qwen35FullLayersMatchLinearLayersRefuse) {
    std::string dir = parity_dir("qwen3_5_text_f32");
    ft::Fixture fx = ft::read_fixture(dir);
    std::vector<uint8_t> cfg = ft::read_file(dir + "/config.json");
    cJSON *root = cJSON_ParseWithLength((const char *)cfg.data(), cfg.size());
    ASSERT_NE(root, nullptr);
    std::vector<bool> linear;
    cJSON *lt;
    cJSON_ArrayForEach(lt, cJSON_GetObjectItem(root, "layer_types")) linear.push_back(strcmp(lt->valuestring, "linear_attention") == 0);
    cJSON_Delete(root);
    ASSERT_EQ(linear, std::vector<bool>({true, true, true, false}));
    forge_model *m = ft::load(dir);
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 64);
    ASSERT_NE(s, nullptr);
    const std::vector<int32_t> &t = fx.seqs[0].tokens;
    const int n = (int)t.size();
    KeysRef ref;
    ref.n_layers = 1, ref.n_kv = 2, ref.head_dim = 32, ref.n_tokens = n;
    ref.k = ft::read_f32(dir + "/keys_seq0.f32");
    ASSERT_EQ(ref.k.size(), (size_t)ref.n_kv * n * ref.head_dim);
    auto check = [&](const char *what) {
        for (int l = 0; l < (int)linear.size(); l++) {
            forge_keys_info info = ft::sized<forge_keys_info>();
            if (linear[l]) {
                EXPECT_EQ(forge_session_keys(s, l, nullptr, 0, &info), FORGE_ERR_INVALID_ARGUMENT) << what;
                EXPECT_NE(errmsg(s).find("layer " + std::to_string(l) + " is a linear-attention layer"), std::string::npos) << errmsg(s);
                continue;
            }
            std::vector<float> got = keys_of(s, l, &info);
            ASSERT_EQ(info.n_rows, n) << what;
            ASSERT_EQ(got.size(), ref.k.size()) << what;
            double err = ft::rel_err(got.data(), ref.k.data(), ref.k.size());
            EXPECT_LE(err, 1e-4) << what;
            printf("  qwen3_5_text_f32 layer %d (%s): max|d|/max|ref| %.2e\n", l, what, err);
        }
    };
    ASSERT_EQ(forge_eval(s, t.data(), n, 0, nullptr, 0), FORGE_OK) << errmsg(s);
    check("prefill");
    ASSERT_EQ(forge_session_truncate(s, 5), FORGE_OK) << errmsg(s);
    ASSERT_EQ(forge_session_n_past(s), 5);
    ASSERT_EQ(forge_eval(s, t.data() + 5, n - 5, 0, nullptr, 0), FORGE_OK) << errmsg(s);
    check("truncated to 5, the rest prefilled");
    forge_session_free(s);
    forge_model_free(m);
}

/* The size query, a too-small buffer, bad layers, no info, an empty session. */
TEST(Keys, SizeQueryAndErrors) {
    forge_model *m = ft::load(parity_dir("gemma2_f32"));
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 64, 2);
    ASSERT_NE(s, nullptr);
    forge_keys_info info = ft::sized<forge_keys_info>();
    ASSERT_EQ(forge_session_keys(s, 1, nullptr, 0, &info), FORGE_OK);
    EXPECT_EQ(info.n_layers, 4);
    EXPECT_EQ(info.n_rows, 0);
    EXPECT_EQ(info.n_floats, 0u);
    float one = 7;
    EXPECT_EQ(forge_session_keys(s, 1, &one, 1, &info), FORGE_OK); /* nothing to copy */
    EXPECT_EQ(one, 7);
    std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    ASSERT_EQ(forge_eval(s, t.data(), 10, 0, nullptr, 0), FORGE_OK);
    ASSERT_EQ(forge_session_keys(s, 0, nullptr, 0, &info), FORGE_OK);
    EXPECT_EQ(info.window, 8);
    EXPECT_EQ(info.first, 1); /* 9 slots */
    EXPECT_EQ(info.n_rows, 9);
    EXPECT_EQ(info.n_kv_heads, 2);
    EXPECT_EQ(info.head_dim, 16);
    EXPECT_EQ(info.n_floats, 2u * 9 * 16);
    std::vector<float> buf(info.n_floats + 1, -1.0f);
    info = ft::sized<forge_keys_info>();
    EXPECT_EQ(forge_session_keys(s, 0, buf.data(), 2 * 9 * 16 - 1, &info), FORGE_ERR_BUFFER_TOO_SMALL);
    EXPECT_EQ(info.n_floats, 2u * 9 * 16); /* the size needed, still */
    EXPECT_NE(errmsg(s).find("288"), std::string::npos) << errmsg(s);
    EXPECT_EQ(buf[0], -1.0f); /* untouched */
    ASSERT_EQ(forge_session_keys(s, 0, buf.data(), buf.size(), &info), FORGE_OK);
    EXPECT_EQ(buf[info.n_floats], -1.0f); /* nothing past the keys */
    EXPECT_NE(buf[0], -1.0f);
    ASSERT_EQ(forge_session_keys(s, 1, nullptr, 0, &info), FORGE_OK);
    EXPECT_EQ(info.window, 0);
    EXPECT_EQ(info.first, 0);
    EXPECT_EQ(info.n_rows, 10);
    for (int bad : {-1, 4, 1000}) {
        EXPECT_EQ(forge_session_keys(s, bad, buf.data(), buf.size(), &info), FORGE_ERR_INVALID_ARGUMENT);
        EXPECT_NE(errmsg(s).find("layer " + std::to_string(bad)), std::string::npos) << errmsg(s);
        EXPECT_NE(errmsg(s).find("0..3"), std::string::npos) << errmsg(s);
    }
    EXPECT_EQ(forge_session_keys(s, 0, buf.data(), buf.size(), nullptr), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(forge_session_keys(nullptr, 0, buf.data(), buf.size(), &info), FORGE_ERR_INVALID_ARGUMENT);
    forge_session_free(s);
    forge_model_free(m);
}

/* The cache moves, the report follows: Gemma 2 with rings of 9 slots. seq0's 12 tokens,
 * truncated to 10 (the ring still holds 3..11: positions 3..9 reported), decoded back to 12
 * one step at a time (3..11 again, equal to the reference), then 3 more steps (6..14; 6..11
 * still equal to the reference). Full-attention layers report 0..n-1 throughout. Llama after
 * a truncation to 5 and a re-prefill of the rest gives the reference again. */
TEST(Keys, FollowTruncateAndDecode) {
    std::string dir = parity_dir("gemma2_f32");
    ft::Fixture fx = ft::read_fixture(dir);
    forge_model *m = ft::load(dir);
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 64, 2);
    ASSERT_NE(s, nullptr);
    const std::vector<int32_t> &t = fx.seqs[0].tokens;
    ASSERT_EQ(forge_eval(s, t.data(), 12, 0, nullptr, 0), FORGE_OK);
    KeysRef ref = read_keys(dir, fx, s);
    ASSERT_FALSE(ref.k.empty());
    std::vector<int> win = windows_of(s, ref.n_layers);
    auto check = [&](int n, int sliding_first, int ref_rows, const char *what) {
        for (int l = 0; l < ref.n_layers; l++) {
            int first = win[l] ? sliding_first : 0;
            forge_keys_info info = ft::sized<forge_keys_info>();
            std::vector<float> got = keys_of(s, l, &info);
            EXPECT_EQ(info.first, first) << what << " layer " << l;
            EXPECT_EQ(info.n_rows, n - first) << what << " layer " << l;
            if (info.first != first || info.n_rows != n - first) continue;
            /* the rows with a reference: positions first .. ref_rows - 1 of every head */
            std::vector<float> g, w;
            for (int h = 0; h < ref.n_kv; h++)
                for (int p = first; p < ref_rows; p++) {
                    const float *gr = got.data() + ((size_t)h * info.n_rows + (p - first)) * ref.head_dim;
                    g.insert(g.end(), gr, gr + ref.head_dim);
                    w.insert(w.end(), ref.at(l, h, p), ref.at(l, h, p) + ref.head_dim);
                }
            EXPECT_LE(ft::rel_err(g.data(), w.data(), w.size()), 1e-4) << what << " layer " << l;
        }
    };
    check(12, 3, 12, "prefill");
    ASSERT_EQ(forge_session_truncate(s, 10), FORGE_OK) << errmsg(s);
    check(10, 3, 10, "truncated to 10");
    for (int p = 10; p < 12; p++) ASSERT_EQ(forge_eval(s, &t[p], 1, 0, nullptr, 0), FORGE_OK);
    check(12, 3, 12, "decoded back to 12");
    for (int32_t x : {5, 6, 7}) ASSERT_EQ(forge_eval(s, &x, 1, 0, nullptr, 0), FORGE_OK);
    check(15, 6, 12, "3 more steps");
    forge_session_free(s);
    forge_model_free(m);

    dir = parity_dir("llama3_f32_untied");
    fx = ft::read_fixture(dir);
    m = ft::load(dir);
    ASSERT_NE(m, nullptr);
    s = ft::session(m, 64);
    ASSERT_NE(s, nullptr);
    const std::vector<int32_t> &u = fx.seqs[0].tokens;
    std::vector<int32_t> other = {3, 1, 4, 1, 5, 9, 2};
    ASSERT_EQ(forge_eval(s, u.data(), 5, 0, nullptr, 0), FORGE_OK);
    ASSERT_EQ(forge_eval(s, other.data(), 7, 0, nullptr, 0), FORGE_OK); /* other tokens at 5..11 */
    ASSERT_EQ(forge_session_truncate(s, 5), FORGE_OK);
    ASSERT_EQ(forge_eval(s, u.data() + 5, 7, 0, nullptr, 0), FORGE_OK);
    ref = read_keys(dir, fx, s);
    for (int l = 0; l < ref.n_layers; l++) expect_layer(s, ref, l, 0, 12, "llama after truncate + prefill");
    forge_session_free(s);
    forge_model_free(m);
}

/* The CLI: `forge keys --json` after seq0 gives the reference keys of every layer; --layer
 * picks one; a bad layer fails naming it; the text form names shapes and positions. */
TEST(Keys, Cli) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    std::string dir = parity_dir("gemma2_f32"), d = ft::tmpdir("keys_cli");
    ft::Fixture fx = ft::read_fixture(dir);
    std::string toks;
    for (int32_t t : fx.seqs[0].tokens) toks += std::to_string(t) + " ";
    KeysRef ref;
    ref.n_layers = 4, ref.n_kv = 2, ref.head_dim = 16, ref.n_tokens = (int)fx.seqs[0].tokens.size();
    ref.k = ft::read_f32(dir + "/keys_seq0.f32");
    ASSERT_EQ(ref.k.size(), 4u * 2 * 12 * 16);
    /* --exact: the reference is f32, and on a GPU the default prefill rounds to f16 */
    std::string cmd = "./forge keys " + dir + " --exact --ctx 64 --tokens \"" + toks + "\" --json > " + d + "/all.json";
    ASSERT_EQ(system(cmd.c_str()), 0) << cmd;
    std::vector<uint8_t> out = ft::read_file(d + "/all.json");
    cJSON *root = cJSON_ParseWithLength((const char *)out.data(), out.size());
    ASSERT_NE(root, nullptr) << std::string(out.begin(), out.end()).substr(0, 400);
    EXPECT_EQ(cJSON_GetObjectItem(root, "n_layers")->valueint, 4);
    EXPECT_EQ(cJSON_GetObjectItem(root, "n_tokens")->valueint, 12);
    cJSON *layers = cJSON_GetObjectItem(root, "layers");
    ASSERT_EQ(cJSON_GetArraySize(layers), 4);
    for (int l = 0; l < 4; l++) {
        cJSON *o = cJSON_GetArrayItem(layers, l);
        EXPECT_EQ(cJSON_GetObjectItem(o, "layer")->valueint, l);
        EXPECT_EQ(cJSON_GetObjectItem(o, "window")->valueint, l % 2 ? 0 : 8);
        EXPECT_EQ(cJSON_GetObjectItem(o, "first")->valueint, 0);
        ASSERT_EQ(cJSON_GetObjectItem(o, "n_rows")->valueint, 12);
        std::vector<float> got, want;
        cJSON *heads = cJSON_GetObjectItem(o, "keys"), *h, *r, *x;
        int hi = 0;
        cJSON_ArrayForEach(h, heads) {
            int p = 0;
            cJSON_ArrayForEach(r, h) {
                cJSON_ArrayForEach(x, r) got.push_back((float)x->valuedouble);
                want.insert(want.end(), ref.at(l, hi, p), ref.at(l, hi, p) + 16);
                p++;
            }
            hi++;
        }
        ASSERT_EQ(got.size(), want.size()) << "layer " << l;
        EXPECT_LE(ft::rel_err(got.data(), want.data(), want.size()), 1e-4) << "layer " << l;
    }
    cJSON_Delete(root);
    cmd = "./forge keys " + dir + " --tokens \"1 2 3\" --layer 2 > " + d + "/one.txt";
    ASSERT_EQ(system(cmd.c_str()), 0) << cmd;
    std::vector<uint8_t> one = ft::read_file(d + "/one.txt");
    EXPECT_EQ(std::string(one.begin(), one.end()), "layer 2: keys [2, 3, 16] (kv heads, positions, head_dim), positions 0..2, sliding window 8\n");
    cmd = "./forge keys " + dir + " --tokens \"1 2 3\" --layer 4 --json > " + d + "/bad.txt 2> " + d + "/err.txt";
    EXPECT_EQ(WEXITSTATUS(system(cmd.c_str())), 1);
    std::vector<uint8_t> err = ft::read_file(d + "/err.txt"), bad = ft::read_file(d + "/bad.txt");
    EXPECT_NE(std::string(err.begin(), err.end()).find("layer 4 is outside"), std::string::npos) << std::string(err.begin(), err.end());
    EXPECT_TRUE(bad.empty()); /* no half-written JSON */
}
