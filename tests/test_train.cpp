/* Training: parity with PyTorch + PEFT (tests/fixtures/lora, made by
 * tools/fixtures/make_lora_fixtures.py), adapter files, bad input. Each fixture starts from a
 * PEFT adapter with non-zero A and B on every projection of a tiny random-weight model (seven;
 * Qwen 3.5: its linear-attention layers' five in place of attention's four)
 * and records PEFT's losses, gradient norms and learning rates of 3 AdamW steps on padded
 * batches with masked prompts, the gradients of step 0, the adapter after the steps, and the
 * adapted model's logits. forge must give the losses within 1e-4 (relative), the gradients
 * within 1e-4 of their largest element, the adapter's update within 1e-2 of PEFT's relative to
 * its largest element, and the logits within 1e-4. */
#include <cjson/cJSON.h>

#include <functional>
#include <map>
#include <set>

#include "internal.h"
#include "util.h"

namespace {

struct MicroBatch {
    std::vector<int32_t> tokens, labels, lengths;
    int n_seqs = 0, seq_len = 0;
};

struct Step {
    std::vector<MicroBatch> micro;
    double loss = 0, grad_norm = 0, lr = 0;
};

struct LoraCase {
    std::string name, dir, base;
    int n_vocab = 0, n_layers = 0;
    forge_train_params params = forge_train_default_params();
    std::vector<Step> steps;
    std::vector<int32_t> logits_tokens;
    /* the gradients' tolerance: 1e-4, or twice how far the reference's float32 gradients are from the
     * same step in float64 where the fixture measured it (float64_check: the reference's own noise) */
    double grad_tol = 1e-4;
    /* each step's loss and grad norm (1e-4), and the final adapter's update (1e-2): at least twice
     * the float32 reference's own distance from the same steps in float64 where the fixture
     * measured it (Adam's first update is about lr sign(g) element by element, so elements whose
     * gradient is within the reference's noise of zero move by lr either way) */
    std::vector<double> loss_tol, norm_tol;
    double update_tol = 1e-2;
};

std::vector<int32_t> ints(cJSON *a) {
    std::vector<int32_t> v;
    cJSON *x;
    cJSON_ArrayForEach(x, a) v.push_back(x->valueint);
    return v;
}

LoraCase read_case(const std::string &name) {
    LoraCase c;
    c.name = name;
    c.dir = ft::src("tests/fixtures/lora/" + name);
    std::vector<uint8_t> js = ft::read_file(c.dir + "/reference.json");
    cJSON *root = cJSON_ParseWithLength((const char *)js.data(), js.size());
    if (!root) {
        ADD_FAILURE() << "cannot read " << c.dir << "/reference.json";
        return c;
    }
    c.base = ft::src(std::string("tests/fixtures/") + cJSON_GetStringValue(cJSON_GetObjectItem(root, "base")));
    c.n_vocab = cJSON_GetObjectItem(root, "n_vocab")->valueint;
    c.n_layers = cJSON_GetObjectItem(root, "n_layers")->valueint;
    cJSON *o = cJSON_GetObjectItem(root, "optimizer");
    forge_train_params &p = c.params;
    p.lr = cJSON_GetObjectItem(o, "lr")->valuedouble;
    p.beta1 = cJSON_GetObjectItem(o, "beta1")->valuedouble;
    p.beta2 = cJSON_GetObjectItem(o, "beta2")->valuedouble;
    p.eps = cJSON_GetObjectItem(o, "eps")->valuedouble;
    p.weight_decay = cJSON_GetObjectItem(o, "weight_decay")->valuedouble;
    std::string sched = cJSON_GetStringValue(cJSON_GetObjectItem(o, "schedule"));
    p.schedule = sched == "cosine" ? FORGE_LR_COSINE : sched == "linear" ? FORGE_LR_LINEAR : FORGE_LR_CONSTANT;
    p.warmup_steps = cJSON_GetObjectItem(o, "warmup_steps")->valueint;
    p.total_steps = cJSON_GetObjectItem(o, "total_steps")->valueint;
    p.max_grad_norm = cJSON_GetObjectItem(o, "max_grad_norm")->valuedouble;
    p.accum_steps = cJSON_GetObjectItem(o, "accum_steps")->valueint;
    p.max_batch = 1; /* then the largest micro-batch, below */
    p.max_seq = 2;
    p.grad_checkpoint = 0;
    cJSON *s;
    cJSON_ArrayForEach(s, cJSON_GetObjectItem(root, "steps")) {
        Step st;
        st.loss = cJSON_GetObjectItem(s, "loss")->valuedouble;
        st.grad_norm = cJSON_GetObjectItem(s, "grad_norm")->valuedouble;
        st.lr = cJSON_GetObjectItem(s, "lr")->valuedouble;
        cJSON *mb;
        cJSON_ArrayForEach(mb, cJSON_GetObjectItem(s, "micro_batches")) {
            MicroBatch m;
            cJSON *row;
            cJSON_ArrayForEach(row, cJSON_GetObjectItem(mb, "tokens")) {
                std::vector<int32_t> r = ints(row);
                m.seq_len = (int)r.size();
                m.tokens.insert(m.tokens.end(), r.begin(), r.end());
                m.n_seqs++;
            }
            cJSON_ArrayForEach(row, cJSON_GetObjectItem(mb, "labels")) {
                std::vector<int32_t> r = ints(row);
                m.labels.insert(m.labels.end(), r.begin(), r.end());
            }
            m.lengths = ints(cJSON_GetObjectItem(mb, "lengths"));
            p.max_batch = std::max(p.max_batch, m.n_seqs);
            p.max_seq = std::max(p.max_seq, m.seq_len);
            st.micro.push_back(m);
        }
        c.steps.push_back(st);
    }
    c.logits_tokens = ints(cJSON_GetObjectItem(root, "logits_tokens"));
    cJSON *f64 = cJSON_GetObjectItem(root, "float64_check");
    c.loss_tol.assign(c.steps.size(), 1e-4);
    c.norm_tol.assign(c.steps.size(), 1e-4);
    if (f64) {
        c.grad_tol = std::max(c.grad_tol, 2 * cJSON_GetObjectItem(f64, "grads_step0_rel")->valuedouble);
        cJSON *fs = cJSON_GetObjectItem(f64, "steps");
        for (size_t s = 0; s < c.steps.size() && s < (size_t)cJSON_GetArraySize(fs); s++) {
            c.loss_tol[s] = std::max(1e-4, 2 * cJSON_GetObjectItem(cJSON_GetArrayItem(fs, (int)s), "loss_rel")->valuedouble);
            c.norm_tol[s] = std::max(1e-4, 2 * cJSON_GetObjectItem(cJSON_GetArrayItem(fs, (int)s), "grad_norm_rel")->valuedouble);
        }
        c.update_tol = std::max(c.update_tol, 2 * cJSON_GetObjectItem(f64, "final_update_rel")->valuedouble);
    }
    cJSON_Delete(root);
    return c;
}

forge_train_batch batch_of(const MicroBatch &m) {
    forge_train_batch b = ft::sized<forge_train_batch>();
    b.n_seqs = m.n_seqs;
    b.seq_len = m.seq_len;
    b.tokens = m.tokens.data();
    b.lengths = m.lengths.data();
    b.labels = m.labels.data();
    return b;
}

/* name -> f32 values of a safetensors file */
std::map<std::string, std::vector<float>> read_tensors(const std::string &path) {
    std::map<std::string, std::vector<float>> out;
    auto fn = [](void *user, const char *name, const float *data, int n_dims, const int64_t *shape) {
        size_t n = 1;
        for (int i = 0; i < n_dims; i++) n *= (size_t)shape[i];
        (*(std::map<std::string, std::vector<float>> *)user)[name].assign(data, data + n);
    };
    EXPECT_EQ(ft_safetensors_read(path.c_str(), fn, &out), FORGE_OK) << path;
    return out;
}

/* forge's targets (src/model.c's forge__target order) and the modules holding them */
const int kNumTargets = 12;
const char *const kTargets[kNumTargets] = {"q_proj",      "k_proj",    "v_proj",    "o_proj",    "gate_proj", "up_proj",
                                           "down_proj",   "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"};
const char *group_of(int t) { return t <= 3 ? "self_attn" : t <= 6 ? "mlp" : "linear_attn"; }

/* PEFT's save key; shared_expert: a mixture-of-experts layer's MLP targets are its shared expert's */
std::string peft_key(int layer, int t, const char *ab, bool shared_expert = false) {
    std::string group = group_of(t);
    if (shared_expert && group == "mlp") group = "mlp.shared_expert";
    return "base_model.model.model.layers." + std::to_string(layer) + "." + group + "." + kTargets[t] + ".lora_" + ab + ".weight";
}

forge_model *load_with_adapter(const std::string &path, const std::string &adapter) {
    forge_model_params mp = forge_model_default_params();
    mp.exact = 1;
    mp.adapter_path = adapter.empty() ? nullptr : adapter.c_str();
    forge_model *m = nullptr;
    if (forge_model_load(path.c_str(), &mp, &m) != FORGE_OK) {
        ADD_FAILURE() << "loading " << path << " with adapter " << adapter << ": " << forge_model_errmsg(m);
        forge_model_free(m);
        return nullptr;
    }
    return m;
}

/* Every position's logits of toks; f32_cache: on an f32 KV cache whatever the device's default
 * (an f16 cache rounds keys and values: where two paths differ in their last f32 bits, a value on
 * a rounding boundary of f16 moves the logits by 1e-4). */
std::vector<float> all_logits(forge_model *m, const std::vector<int32_t> &toks, bool f32_cache = false) {
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = std::max(64, (int)toks.size());
    if (f32_cache) sp.kv_type = FORGE_KV_F32;
    forge_session *s = ft::session(m, sp);
    std::vector<float> lg(toks.size() * (size_t)forge_model_n_vocab(m));
    if (!s) return lg;
    EXPECT_EQ(forge_eval(s, toks.data(), (int)toks.size(), FORGE_EVAL_ALL_LOGITS, lg.data(), lg.size()), FORGE_OK) << forge_session_errmsg(s);
    forge_session_free(s);
    return lg;
}

const std::vector<std::string> kCases = {"llama3", "llama3_sched", "qwen2", "qwen3", "gemma2", "gemma3", "llama_mlx4", "llama_q4_0", "qwen3_5",
                                          "qwen3_5_moe", "qwen3_moe"};

class LoraParity : public ::testing::TestWithParam<std::string> {};

/* Three AdamW steps against PEFT's: the losses of the forward passes, the gradient norms and
 * learning rates, and the update of every adapter tensor. */
TEST_P(LoraParity, ThreeAdamWSteps) {
    LoraCase c = read_case(GetParam());
    ASSERT_EQ(c.steps.size(), 3u);
    forge_model *m = ft::load(c.base);
    ASSERT_NE(m, nullptr);
    std::string init = c.dir + "/adapter_init";
    c.params.adapter_path = init.c_str();
    forge_trainer *tr = nullptr;
    ASSERT_EQ(forge_trainer_create(m, &c.params, &tr), FORGE_OK) << forge_model_errmsg(m);
    for (size_t s = 0; s < c.steps.size(); s++) {
        double sum = 0;
        forge_train_stats st = ft::sized<forge_train_stats>();
        for (const MicroBatch &mb : c.steps[s].micro) {
            forge_train_batch b = batch_of(mb);
            ASSERT_EQ(forge_train_step(tr, &b, &st), FORGE_OK) << forge_trainer_errmsg(tr);
            sum += st.loss;
        }
        double loss = sum / (double)c.steps[s].micro.size();
        EXPECT_EQ(st.applied, 1);
        EXPECT_EQ(st.step, (int)s + 1);
        double lrel = std::fabs(loss - c.steps[s].loss) / std::fabs(c.steps[s].loss);
        double nrel = std::fabs(st.grad_norm - c.steps[s].grad_norm) / c.steps[s].grad_norm;
        printf("  %-14s step %zu: loss %.7f (PEFT %.7f, rel %.1e), grad norm %.6f (PEFT %.6f, rel %.1e), lr %g\n", c.name.c_str(), s, loss,
               c.steps[s].loss, lrel, st.grad_norm, c.steps[s].grad_norm, nrel, st.lr);
        EXPECT_LE(lrel, c.loss_tol[s]) << "step " << s;
        EXPECT_LE(nrel, c.norm_tol[s]) << "step " << s;
        EXPECT_NEAR(st.lr, c.steps[s].lr, 1e-9 * std::fmax(1.0, c.steps[s].lr)) << "step " << s;
    }
    std::string out = ft::tmpdir("lora_" + c.name);
    ASSERT_EQ(forge_trainer_save(tr, out.c_str(), FORGE_ADAPTER_PEFT), FORGE_OK) << forge_trainer_errmsg(tr);
    auto a0 = read_tensors(init + "/adapter_model.safetensors");
    auto ref = read_tensors(c.dir + "/adapter_final/adapter_model.safetensors");
    auto got = read_tensors(out + "/adapter_model.safetensors");
    ASSERT_EQ(got.size(), ref.size());
    double worst = 0;
    std::string worst_key;
    for (auto &kv : ref) {
        ASSERT_TRUE(got.count(kv.first)) << kv.first;
        const std::vector<float> &r = kv.second, &g = got[kv.first], &i0 = a0[kv.first];
        ASSERT_EQ(g.size(), r.size()) << kv.first;
        double md = 0, mr = 0;
        for (size_t k = 0; k < r.size(); k++) {
            double dr = (double)r[k] - i0[k], dg = (double)g[k] - i0[k];
            md = std::fmax(md, std::fabs(dg - dr));
            mr = std::fmax(mr, std::fabs(dr));
        }
        double e = mr > 0 ? md / mr : md;
        if (e > worst) worst = e, worst_key = kv.first;
    }
    printf("  %-14s adapter update vs PEFT's: max|d|/max|ref| = %.2e (%s)\n", c.name.c_str(), worst, worst_key.c_str());
    EXPECT_LE(worst, c.update_tol) << worst_key;
    forge_trainer_free(tr);
    forge_model_free(m);
}

/* The worst gradient of step 0 (its micro-batches, before clipping) against PEFT's over every
 * tensor, max|d| / max|ref|, on model m with or without checkpointing. */
double step0_grad_gap(LoraCase &c, forge_model *m, int ckpt, std::string *worst_key) {
    std::string init = c.dir + "/adapter_init";
    c.params.adapter_path = init.c_str();
    auto ref = read_tensors(c.dir + "/grads_step0.safetensors");
    bool se = false; /* Qwen 3.5-MoE: mlp.shared_expert.gate_proj */
    for (auto &kv : ref) se |= kv.first.find(".mlp.shared_expert.") != std::string::npos;
    auto key = [&](int l, int t, const char *ab) { return peft_key(l, t, ab, se); };
    c.params.grad_checkpoint = ckpt;
    forge_trainer *tr = nullptr;
    EXPECT_EQ(forge_trainer_create(m, &c.params, &tr), FORGE_OK) << forge_model_errmsg(m);
    if (!tr) return INFINITY;
    EXPECT_EQ(ft_train_checkpointing(tr), ckpt);
    /* every micro-batch of step 0, accumulated without an optimizer step */
    for (const MicroBatch &mb : c.steps[0].micro) {
        forge_train_batch b = batch_of(mb);
        double loss;
        EXPECT_EQ(ft_train_backward(tr, &b, &loss), FORGE_OK) << forge_trainer_errmsg(tr);
    }
    std::vector<float> g(1 << 16);
    std::map<std::string, std::vector<float>> got;
    for (int l = 0; l < c.n_layers; l++)
        for (int t = 0; t < kNumTargets; t++) {
            size_t n = ft_train_grad_read(tr, l, t, g.data(), g.size());
            EXPECT_EQ(n > 0, ref.count(key(l, t, "A")) > 0) << "layer " << l << " " << kTargets[t];
            if (!n || !ref.count(key(l, t, "A"))) continue; /* a projection the layer does not have */
            const std::vector<float> &ra = ref[key(l, t, "A")];
            got[key(l, t, "A")].assign(g.begin(), g.begin() + (long)ra.size());
            got[key(l, t, "B")].assign(g.begin() + (long)ra.size(), g.begin() + (long)n);
        }
    forge_trainer_free(tr);
    double worst = 0;
    for (auto &kv : ref) {
        EXPECT_TRUE(got.count(kv.first)) << kv.first;
        if (!got.count(kv.first)) return INFINITY;
        double e = ft::rel_err(got[kv.first].data(), kv.second.data(), kv.second.size());
        if (e > worst) worst = e, *worst_key = kv.first;
    }
    return worst;
}

/* The gradient of step 0 against PEFT's, every tensor. */
TEST_P(LoraParity, GradientsOfStepZero) {
    LoraCase c = read_case(GetParam());
    forge_model *m = ft::load(c.base);
    ASSERT_NE(m, nullptr);
    for (int ckpt = 0; ckpt < 2; ckpt++) { /* gradient checkpointing gives the same gradients */
        std::string worst_key;
        double worst = step0_grad_gap(c, m, ckpt, &worst_key);
        printf("  %-14s step-0 gradients (checkpointing %s): max|d|/max|ref| = %.2e (%s)\n", c.name.c_str(), ckpt ? "on" : "off", worst,
               worst_key.c_str());
        EXPECT_LE(worst, c.grad_tol) << worst_key;
    }
    forge_model_free(m);
}

/* ... with the products on the tensor cores (a model loaded without `exact`: f16 operands), where
 * the device has them: the forward's products alone, then with the backward's products through
 * the frozen weights there too (matmul_cm_back), each within f16's rounding of PEFT's f32
 * gradients, and the backward's share of that rounding no larger than the forward's. */
TEST_P(LoraParity, GradientsOfStepZeroOnTensorCores) {
    LoraCase c = read_case(GetParam());
    forge_model *m = ft::load(c.base, 0, 0, 0);
    ASSERT_NE(m, nullptr);
    if (!ft_model_set_attn_cm(m, 1)) {
        forge_model_free(m);
        GTEST_SKIP() << "no tensor cores on this device (or the model is exact)";
    }
    std::string key_fwd, key_both;
    ft_model_set_back_cm(m, 0);
    double fwd = step0_grad_gap(c, m, 0, &key_fwd);
    ft_model_set_back_cm(m, 1);
    double both = step0_grad_gap(c, m, 0, &key_both);
    printf("  %-14s step-0 gradients on tensor cores: forward %.2e (%s), forward and backward %.2e (%s)\n", c.name.c_str(), fwd,
           key_fwd.c_str(), both, key_both.c_str());
    EXPECT_LE(both, 2 * fwd + 2e-3) << key_both;
    EXPECT_LE(both, 1e-1) << key_both;
    forge_model_free(m);
}

TEST_P(LoraParity, AdaptedLogits) {
    LoraCase c = read_case(GetParam());
    std::vector<float> want_init = ft::read_f32(c.dir + "/logits_init.f32"), want_final = ft::read_f32(c.dir + "/logits_final.f32");
    struct { const char *adapter; const std::vector<float> *want; } runs[] = {
        {"adapter_init", &want_init}, {"adapter_init_mlx", &want_init}, {"adapter_final", &want_final}};
    for (auto &r : runs) {
        forge_model *m = load_with_adapter(c.base, c.dir + "/" + r.adapter);
        ASSERT_NE(m, nullptr);
        std::vector<float> lg = all_logits(m, c.logits_tokens);
        ASSERT_EQ(lg.size(), r.want->size());
        double e = ft::rel_err(lg.data(), r.want->data(), lg.size());
        printf("  %-14s logits with %-17s max|d|/max|ref| = %.2e\n", c.name.c_str(), r.adapter, e);
        EXPECT_LE(e, 1e-4) << r.adapter;
        forge_model_free(m);
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LoraParity, ::testing::ValuesIn(kCases), [](const ::testing::TestParamInfo<std::string> &i) { return i.param; });
} // namespace

namespace {

/* The "text" lines of a JSON-lines file, tokenized as mlx-lm does: BOS as the tokenizer
 * declares, the text, EOS. */
std::vector<std::vector<int32_t>> read_texts(forge_model *m, const std::string &path) {
    std::vector<std::vector<int32_t>> out;
    std::ifstream f(path);
    std::string line;
    forge_special_tokens sp = ft::sized<forge_special_tokens>();
    EXPECT_EQ(forge_model_special_tokens(m, &sp), FORGE_OK);
    while (std::getline(f, line)) {
        cJSON *o = cJSON_Parse(line.c_str());
        const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(o, "text"));
        if (text) {
            std::vector<int32_t> ids(4096);
            size_t n = 0;
            EXPECT_EQ(forge_tokenize(m, text, strlen(text), FORGE_TOKENIZE_ADD_SPECIAL, ids.data(), ids.size(), &n), FORGE_OK);
            ids.resize(n);
            ids.push_back(sp.eos);
            out.push_back(ids);
        }
        cJSON_Delete(o);
    }
    return out;
}

/* Rows first..first+B of `data` (cycling) as a right-padded batch. */
struct Batch {
    std::vector<int32_t> tokens, lengths;
    forge_train_batch b = ft::sized<forge_train_batch>();
};
Batch make_batch(const std::vector<std::vector<int32_t>> &data, size_t first, int B) {
    Batch out;
    size_t T = 0;
    for (int i = 0; i < B; i++) T = std::max(T, data[(first + i) % data.size()].size());
    out.tokens.assign((size_t)B * T, 0);
    for (int i = 0; i < B; i++) {
        const std::vector<int32_t> &r = data[(first + i) % data.size()];
        std::copy(r.begin(), r.end(), out.tokens.begin() + (long)(i * T));
        out.lengths.push_back((int32_t)r.size());
    }
    out.b.n_seqs = B;
    out.b.seq_len = (int)T;
    out.b.tokens = out.tokens.data();
    out.b.lengths = out.lengths.data();
    return out;
}

double val_loss(forge_trainer *tr, const std::vector<std::vector<int32_t>> &valid, int B) {
    double sum = 0;
    int64_t count = 0;
    for (size_t i = 0; i < valid.size(); i += (size_t)B) {
        Batch vb = make_batch(valid, i, (int)std::min<size_t>((size_t)B, valid.size() - i));
        double l;
        int64_t n;
        EXPECT_EQ(forge_train_eval(tr, &vb.b, &l, &n), FORGE_OK) << forge_trainer_errmsg(tr);
        sum += l * (double)n;
        count += n;
    }
    return sum / (double)count;
}

std::string greedy(forge_model *m, const char *prompt, int n) {
    forge_session *s = ft::session(m, 256);
    std::string text;
    forge_generate_params gp = forge_generate_default_params();
    gp.max_tokens = n;
    gp.user_data = &text;
    gp.on_token = [](void *u, int32_t, const char *t, size_t len) {
        ((std::string *)u)->append(t, len);
        return 0;
    };
    EXPECT_EQ(forge_generate(s, prompt, strlen(prompt), &gp, nullptr), FORGE_OK) << forge_session_errmsg(s);
    forge_session_free(s);
    return text;
}

/* A real fine-tune on the bundled stories260K: 30 steps of LoRA on stories whose girl is
 * always named Zora. Validation loss falls to under half the base model's, and greedy
 * generation after "a little girl named" says Zora where the base model says Lily. */
TEST(TrainZora, FineTuneStories260K) {
    const std::string model = ft::src("models/stories260K/stories260K.gguf");
    forge_model *m = ft::load(model);
    ASSERT_NE(m, nullptr);
    std::vector<std::vector<int32_t>> train = read_texts(m, ft::src("tests/fixtures/train/zora_train.jsonl"));
    std::vector<std::vector<int32_t>> valid = read_texts(m, ft::src("tests/fixtures/train/zora_valid.jsonl"));
    ASSERT_EQ(train.size(), 300u);
    ASSERT_EQ(valid.size(), 40u);
    const char *prompt = "Once upon a time, there was a little girl named";
    std::string before = greedy(m, prompt, 4);
    EXPECT_EQ(before.find(" Lily"), 0u) << before; /* the text continues the prompt: a space, then the name */
    forge_train_params p = forge_train_default_params();
    p.rank = 8;
    p.alpha = 16;
    p.targets = "all";
    p.lr = 5e-3;
    p.max_batch = 8;
    p.max_seq = 128;
    p.seed = 1;
    forge_trainer *tr = nullptr;
    ASSERT_EQ(forge_trainer_create(m, &p, &tr), FORGE_OK) << forge_model_errmsg(m);
    double v0 = val_loss(tr, valid, 8);
    forge_train_stats st = ft::sized<forge_train_stats>();
    for (int step = 0; step < 30; step++) {
        Batch b = make_batch(train, (size_t)step * 8, 8);
        ASSERT_EQ(forge_train_step(tr, &b.b, &st), FORGE_OK) << forge_trainer_errmsg(tr);
        ASSERT_TRUE(std::isfinite(st.loss));
    }
    double v1 = val_loss(tr, valid, 8);
    printf("  validation loss %.4f -> %.4f after %d steps (last train loss %.4f)\n", v0, v1, st.step, st.loss);
    EXPECT_LT(v1, 0.5 * v0);
    std::string dir = ft::tmpdir("zora_adapter");
    ASSERT_EQ(forge_trainer_save(tr, dir.c_str(), FORGE_ADAPTER_PEFT), FORGE_OK) << forge_trainer_errmsg(tr);
    forge_trainer_free(tr);
    forge_model_free(m);
    forge_model *tuned = load_with_adapter(model, dir);
    ASSERT_NE(tuned, nullptr);
    std::string after = greedy(tuned, prompt, 12);
    printf("  %s%s\n", prompt, after.c_str());
    EXPECT_EQ(after.find(" Zora"), 0u) << after;
    forge_model_free(tuned);
}

/* docs/cli.md's three-line fine-tune through the CLI binary beside the tests (the build tree's
 * ./forge), shortened to a few steps: it trains, saves PEFT files, and runs with them. */
TEST(TrainCli, ReadmeFineTune) {
    if (!ft::exists("./forge")) GTEST_SKIP() << "no ./forge binary in the working directory (the build tree)";
    std::string out = ft::tmpdir("cli_adapter");
    std::string model = ft::src("models/stories260K/stories260K.gguf");
    std::string cmd = "./forge train " + model + " --data " + ft::src("tests/fixtures/train/zora_train.jsonl") + " --out " + out +
                      " --steps 3 --batch 4 --seq 96 --json > " + out + "/log.jsonl 2>&1";
    ASSERT_EQ(system(cmd.c_str()), 0) << cmd;
    EXPECT_TRUE(ft::exists(out + "/adapter_model.safetensors"));
    EXPECT_TRUE(ft::exists(out + "/adapter_config.json"));
    std::vector<uint8_t> log = ft::read_file(out + "/log.jsonl");
    std::string text(log.begin(), log.end());
    EXPECT_NE(text.find("\"step\": 3"), std::string::npos) << text;
    cmd = "./forge run " + model + " --adapter " + out + " -n 8 > " + out + "/run.txt 2>&1";
    EXPECT_EQ(system(cmd.c_str()), 0) << cmd;
}

} // namespace

#include "writers.h"

namespace {

/* A PEFT adapter for parity/llama3_f32_untied (hidden 64, q 64, k/v 32, ffn 128, 2 layers)
 * written from tensors and a config, so each test can break one thing. */
struct AdapterFiles {
    std::map<std::string, ft::Tensor> tensors;
    std::string config = R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "down_proj"], "bias": "none"})";
    AdapterFiles() {
        tensors["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"] = ft::f32_tensor({2, 64}, 0.1f, 1);
        tensors["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"] = ft::f32_tensor({64, 2}, 0.1f, 2);
        tensors["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"] = ft::f32_tensor({2, 128}, 0.1f, 3);
        tensors["base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"] = ft::f32_tensor({64, 2}, 0.1f, 4);
    }
    std::string write(const std::string &name) const {
        std::string d = ft::tmpdir(name);
        std::vector<uint8_t> st = ft::safetensors_bytes(tensors);
        ft::write_file(d + "/adapter_model.safetensors", st.data(), st.size());
        ft::write_file(d + "/adapter_config.json", config.data(), config.size());
        return d;
    }
};

const std::string kBase = "tests/fixtures/parity/llama3_f32_untied";

/* Loads the base with an adapter that must fail: the status and words of the message. */
void expect_bad_adapter(const std::string &dir, forge_status want, const std::vector<std::string> &words) {
    forge_model_params mp = forge_model_default_params();
    mp.adapter_path = dir.c_str();
    forge_model *m = nullptr;
    forge_status st = forge_model_load(ft::src(kBase).c_str(), &mp, &m);
    std::string msg = forge_model_errmsg(m);
    EXPECT_EQ(st, want) << msg;
    for (const std::string &w : words) EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg;
    forge_model_free(m);
}

TEST(TrainAdapters, GoodAdapterChangesTheLogitsAndMergesIntoFloatWeights) {
    AdapterFiles a;
    std::string dir = a.write("adapter_good");
    forge_model *base = ft::load(ft::src(kBase)), *ad = load_with_adapter(ft::src(kBase), dir);
    ASSERT_TRUE(base && ad);
    std::vector<int32_t> toks = {3, 17, 200, 5, 9};
    std::vector<float> l0 = all_logits(base, toks, true), l1 = all_logits(ad, toks, true);
    EXPECT_GT(ft::rel_err(l1.data(), l0.data(), l0.size()), 1e-3) << "the adapter changes nothing";
    forge_model_params mp = forge_model_default_params();
    mp.adapter_path = dir.c_str();
    mp.adapter_merge = 1;
    forge_model *merged = nullptr;
    ASSERT_EQ(forge_model_load(ft::src(kBase).c_str(), &mp, &merged), FORGE_OK) << forge_model_errmsg(merged);
    std::vector<float> l2 = all_logits(merged, toks, true);
    EXPECT_LE(ft::rel_err(l2.data(), l1.data(), l1.size()), 2e-6) << "merged into the f32 weights";
    forge_model_free(merged);
    /* a quantized base cannot take the merge: the message names the weight */
    mp.adapter_path = (ft::src("tests/fixtures/lora/llama_q4_0/adapter_init")).c_str();
    std::string q4 = ft::src("tests/fixtures/lora/llama_q4_0/adapter_init");
    mp.adapter_path = q4.c_str();
    ASSERT_NE(forge_model_load(ft::src("tests/fixtures/lora/llama_q4_0/model.gguf").c_str(), &mp, &merged), FORGE_OK);
    EXPECT_NE(std::string(forge_model_errmsg(merged)).find("is quantized"), std::string::npos) << forge_model_errmsg(merged);
    forge_model_free(merged);
    forge_model_free(base);
    forge_model_free(ad);
}

TEST(TrainAdapters, MalformedOrMismatchedAdaptersNameTheKey) {
    {
        AdapterFiles a; /* a shape that does not fit the model */
        a.tensors["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"] = ft::f32_tensor({2, 63}, 0.1f, 5);
        expect_bad_adapter(a.write("adapter_shape"), FORGE_ERR_MODEL, {"layers.1.self_attn.q_proj.lora_A.weight", "[2, 63]", "different base"});
    }
    {
        AdapterFiles a; /* a module forge does not know */
        a.tensors["base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight"] = ft::f32_tensor({2, 64}, 0.1f, 6);
        expect_bad_adapter(a.write("adapter_module"), FORGE_ERR_MODEL, {"qkv_proj.lora_A.weight", "not a LoRA matrix"});
    }
    {
        AdapterFiles a; /* A and B of different ranks */
        a.tensors["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"] = ft::f32_tensor({64, 3}, 0.1f, 7);
        expect_bad_adapter(a.write("adapter_rank"), FORGE_ERR_MODEL, {"q_proj.lora_", "rank"});
    }
    {
        AdapterFiles a; /* a layer the model does not have */
        a.tensors["base_model.model.model.layers.5.mlp.down_proj.lora_A.weight"] = ft::f32_tensor({2, 128}, 0.1f, 8);
        expect_bad_adapter(a.write("adapter_layer"), FORGE_ERR_MODEL, {"layers.5", "2 layers"});
    }
    {
        AdapterFiles a; /* half a pair */
        a.tensors.erase("base_model.model.model.layers.0.mlp.down_proj.lora_B.weight");
        expect_bad_adapter(a.write("adapter_half"), FORGE_ERR_MODEL, {"down_proj", "no lora_B"});
    }
    {
        AdapterFiles a;
        a.config = R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "use_dora": true})";
        expect_bad_adapter(a.write("adapter_dora"), FORGE_ERR_UNSUPPORTED, {"use_dora"});
    }
    {
        AdapterFiles a;
        a.config = "{\"r\": 2, ";
        expect_bad_adapter(a.write("adapter_json"), FORGE_ERR_FORMAT, {"adapter_config.json"});
    }
    {
        AdapterFiles a; /* a truncated tensor file */
        std::string d = a.write("adapter_truncated");
        std::vector<uint8_t> st = ft::safetensors_bytes(a.tensors);
        ft::write_file(d + "/adapter_model.safetensors", st.data(), st.size() - 100);
        expect_bad_adapter(d, FORGE_ERR_FORMAT, {"adapter_model.safetensors"});
    }
    expect_bad_adapter(ft::tmpdir("adapter_empty"), FORGE_ERR_IO, {"no adapter here"});
}

TEST(TrainAdapters, SavesPeftAndMlxFilesAtomically) {
    forge_model *m = ft::load(ft::src(kBase));
    ASSERT_NE(m, nullptr);
    forge_train_params p = forge_train_default_params();
    p.targets = "q_proj,k_proj,gate_proj";
    p.n_layers = 1;
    p.rank = 3;
    p.max_batch = 1;
    p.max_seq = 8;
    forge_trainer *tr = nullptr;
    ASSERT_EQ(forge_trainer_create(m, &p, &tr), FORGE_OK) << forge_model_errmsg(m);
    std::vector<int32_t> toks = {1, 2, 3, 4, 5, 6, 7, 8};
    forge_train_batch b = {sizeof(forge_train_batch), 1, 8, toks.data(), nullptr, nullptr, nullptr, nullptr};
    ASSERT_EQ(forge_train_step(tr, &b, nullptr), FORGE_OK) << forge_trainer_errmsg(tr);
    for (forge_adapter_format fmt : {FORGE_ADAPTER_PEFT, FORGE_ADAPTER_MLX}) {
        std::string d = ft::tmpdir(fmt == FORGE_ADAPTER_PEFT ? "save_peft" : "save_mlx");
        ASSERT_EQ(forge_trainer_save(tr, d.c_str(), fmt), FORGE_OK) << forge_trainer_errmsg(tr);
        std::string file = d + (fmt == FORGE_ADAPTER_PEFT ? "/adapter_model.safetensors" : "/adapters.safetensors");
        auto t = read_tensors(file);
        EXPECT_EQ(t.size(), 6u); /* 3 targets of the last layer, A and B */
        if (fmt == FORGE_ADAPTER_PEFT) EXPECT_EQ(t.count("base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight"), 1u);
        else EXPECT_EQ(t.count("model.layers.1.mlp.gate_proj.lora_b"), 1u);
        /* the saved adapter applies in inference as the trainer's, and starts a new trainer */
        forge_model *ad = load_with_adapter(ft::src(kBase), d);
        ASSERT_NE(ad, nullptr);
        forge_train_params p2 = forge_train_default_params();
        p2.adapter_path = d.c_str();
        p2.max_batch = 1;
        p2.max_seq = 8;
        forge_trainer *t2 = nullptr;
        ASSERT_EQ(forge_trainer_create(m, &p2, &t2), FORGE_OK) << forge_model_errmsg(m);
        double l1, l2;
        ASSERT_EQ(forge_train_eval(tr, &b, &l1, nullptr), FORGE_OK);
        ASSERT_EQ(forge_train_eval(t2, &b, &l2, nullptr), FORGE_OK);
        EXPECT_NEAR(l1, l2, 1e-5 * l1) << "the reloaded adapter gives the same loss";
        forge_trainer_free(t2);
        forge_model_free(ad);
        /* an interrupted write (the temporary file cannot be made) leaves the previous files whole */
        std::vector<uint8_t> before = ft::read_file(file);
        std::string blocker = file + ".tmp." + std::to_string((long)getpid());
        ASSERT_EQ(system(("mkdir -p '" + blocker + "'").c_str()), 0);
        ASSERT_EQ(forge_train_step(tr, &b, nullptr), FORGE_OK);
        EXPECT_EQ(forge_trainer_save(tr, d.c_str(), fmt), FORGE_ERR_IO);
        EXPECT_NE(std::string(forge_trainer_errmsg(tr)).find(file), std::string::npos) << forge_trainer_errmsg(tr);
        EXPECT_EQ(ft::read_file(file), before);
        ASSERT_EQ(system(("rmdir '" + blocker + "'").c_str()), 0);
    }
    forge_trainer_free(tr);
    forge_model_free(m);
}

TEST(TrainParams, BadParamsAndBatchesAreNamed) {
    forge_model *m = ft::load(ft::src(kBase));
    ASSERT_NE(m, nullptr);
    struct { const char *what; void (*set)(forge_train_params *); forge_status want; } bad[] = {
        {"rank", [](forge_train_params *p) { p->rank = 0; }, FORGE_ERR_INVALID_ARGUMENT},
        {"qq_proj", [](forge_train_params *p) { p->targets = "q_proj,qq_proj"; }, FORGE_ERR_INVALID_ARGUMENT},
        {"n_layers", [](forge_train_params *p) { p->n_layers = 3; }, FORGE_ERR_INVALID_ARGUMENT},
        {"total_steps", [](forge_train_params *p) { p->schedule = FORGE_LR_COSINE; }, FORGE_ERR_INVALID_ARGUMENT},
        {"dropout", [](forge_train_params *p) { p->dropout = 1.0f; }, FORGE_ERR_INVALID_ARGUMENT},
        {"max_seq", [](forge_train_params *p) { p->max_seq = 1 << 20; }, FORGE_ERR_LIMIT},
    };
    for (auto &b : bad) {
        forge_train_params p = forge_train_default_params();
        b.set(&p);
        forge_trainer *tr = nullptr;
        EXPECT_EQ(forge_trainer_create(m, &p, &tr), b.want) << b.what;
        EXPECT_EQ(tr, nullptr);
        EXPECT_NE(std::string(forge_model_errmsg(m)).find(b.what), std::string::npos) << forge_model_errmsg(m);
    }
    forge_train_params p = forge_train_default_params();
    p.max_batch = 2;
    p.max_seq = 8;
    forge_trainer *tr = nullptr;
    ASSERT_EQ(forge_trainer_create(m, &p, &tr), FORGE_OK) << forge_model_errmsg(m);
    std::vector<int32_t> toks = {1, 2, 3, 4, 5, 6, 7, 8}, labels(8, -100), lens = {8};
    forge_train_batch b = {sizeof(forge_train_batch), 1, 8, toks.data(), lens.data(), nullptr, nullptr, nullptr};
    toks[3] = 256;
    EXPECT_EQ(forge_train_step(tr, &b, nullptr), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_trainer_errmsg(tr)).find(" 256 "), std::string::npos) << forge_trainer_errmsg(tr);
    toks[3] = 4;
    b.labels = labels.data();
    EXPECT_EQ(forge_train_step(tr, &b, nullptr), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_trainer_errmsg(tr)).find("no counted target"), std::string::npos) << forge_trainer_errmsg(tr);
    labels[5] = -7;
    EXPECT_EQ(forge_train_step(tr, &b, nullptr), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_trainer_errmsg(tr)).find("label -7"), std::string::npos) << forge_trainer_errmsg(tr);
    b.labels = nullptr;
    b.n_seqs = 3;
    EXPECT_EQ(forge_train_step(tr, &b, nullptr), FORGE_ERR_LIMIT);
    b.n_seqs = 1;
    lens[0] = 9;
    EXPECT_EQ(forge_train_step(tr, &b, nullptr), FORGE_ERR_INVALID_ARGUMENT);
    lens[0] = 8;
    forge_train_stats st = ft::sized<forge_train_stats>();
    ASSERT_EQ(forge_train_step(tr, &b, &st), FORGE_OK) << forge_trainer_errmsg(tr);
    EXPECT_EQ(st.tokens, 7);
    EXPECT_EQ(st.applied, 1);
    forge_memory_stats ms = ft::sized<forge_memory_stats>(), plan = ft::sized<forge_memory_stats>();
    ASSERT_EQ(forge_trainer_memory(tr, &ms), FORGE_OK);
    ASSERT_EQ(forge_trainer_plan(m, &p, &plan), FORGE_OK);
    EXPECT_EQ(plan.device_planned_bytes, ms.device_planned_bytes);
    EXPECT_GE(ms.device_in_use_bytes, plan.device_planned_bytes);
    forge_trainer_free(tr);
    /* a device too small for the plan is refused with the numbers, before anything is allocated */
    ft_model_set_device_memory(m, plan.device_planned_bytes / 2);
    EXPECT_EQ(forge_trainer_create(m, &p, &tr), FORGE_ERR_OUT_OF_MEMORY);
    EXPECT_NE(std::string(forge_model_errmsg(m)).find("MiB of device memory"), std::string::npos) << forge_model_errmsg(m);
    forge_model_free(m);
}

} // namespace

namespace {

/* Dropout on the adapters' input: seeded, so two trainers agree step for step; the same masks
 * when checkpointing recomputes a layer (equal gradients); none in evaluation. */
TEST(TrainParams, DropoutIsSeededAndRecomputedExactly) {
    forge_model *m = ft::load(ft::src(kBase));
    ASSERT_NE(m, nullptr);
    std::vector<int32_t> toks(2 * 12);
    for (size_t i = 0; i < toks.size(); i++) toks[i] = (int32_t)((i * 37 + 11) % 256);
    forge_train_batch b = {sizeof(forge_train_batch), 2, 12, toks.data(), nullptr, nullptr, nullptr, nullptr};
    std::vector<float> grads[2];
    double first_loss[2] = {0, 0};
    for (int ckpt = 0; ckpt < 2; ckpt++) {
        forge_train_params p = forge_train_default_params();
        p.targets = "all";
        p.dropout = 0.3f;
        p.seed = 42;
        p.max_batch = 2;
        p.max_seq = 12;
        p.grad_checkpoint = ckpt;
        forge_trainer *tr = nullptr;
        ASSERT_EQ(forge_trainer_create(m, &p, &tr), FORGE_OK) << forge_model_errmsg(m);
        forge_train_stats st = ft::sized<forge_train_stats>();
        ASSERT_EQ(forge_train_step(tr, &b, &st), FORGE_OK); /* B becomes non-zero: the masks matter from here */
        first_loss[ckpt] = st.loss;
        double loss;
        ASSERT_EQ(ft_train_backward(tr, &b, &loss), FORGE_OK);
        grads[ckpt].resize(4096);
        size_t n = ft_train_grad_read(tr, 1, 4 /* gate_proj */, grads[ckpt].data(), grads[ckpt].size());
        ASSERT_GT(n, 0u);
        grads[ckpt].resize(n);
        forge_trainer_free(tr);
    }
    EXPECT_EQ(first_loss[0], first_loss[1]);
    EXPECT_LE(ft::rel_err(grads[1].data(), grads[0].data(), grads[0].size()), 1e-6) << "checkpointing recomputes the same masks";
    /* against no dropout: the step's loss is the same (B starts at zero), evaluation too, the next gradients differ */
    forge_train_params p = forge_train_default_params();
    p.targets = "all";
    p.seed = 42;
    p.max_batch = 2;
    p.max_seq = 12;
    forge_trainer *tr = nullptr;
    ASSERT_EQ(forge_trainer_create(m, &p, &tr), FORGE_OK);
    forge_train_stats st = ft::sized<forge_train_stats>();
    ASSERT_EQ(forge_train_step(tr, &b, &st), FORGE_OK);
    EXPECT_NEAR(st.loss, first_loss[0], 1e-6 * st.loss);
    double loss;
    ASSERT_EQ(ft_train_backward(tr, &b, &loss), FORGE_OK);
    std::vector<float> g(4096);
    g.resize(ft_train_grad_read(tr, 1, 4, g.data(), g.size()));
    EXPECT_GT(ft::rel_err(g.data(), grads[0].data(), g.size()), 1e-3) << "dropout changes nothing";
    forge_trainer_free(tr);
    forge_model_free(m);
}

/* The squared-error losses: on the logits against targets, the loss is the mean over counted
 * positions and the vocabulary of (logit - target)^2 (the adapters start as B = 0, so the
 * logits are the base model's); on the hidden states, training against zero targets lowers it. */
TEST(TrainParams, SquaredErrorLosses) {
    forge_model *m = ft::load(ft::src(kBase));
    ASSERT_NE(m, nullptr);
    const int T = 10, V = 256, H = 64;
    std::vector<int32_t> toks(T), lens = {T};
    for (int i = 0; i < T; i++) toks[i] = (i * 53 + 7) % V;
    std::vector<float> logits = all_logits(m, toks), targets = ft::randn((size_t)T * V, 1.0f, 9);
    std::vector<uint8_t> mask(T, 1);
    mask[0] = mask[4] = 0;
    forge_train_params p = forge_train_default_params();
    p.loss = FORGE_LOSS_MSE_LOGITS;
    p.max_batch = 1;
    p.max_seq = T;
    forge_trainer *tr = nullptr;
    ASSERT_EQ(forge_trainer_create(m, &p, &tr), FORGE_OK) << forge_model_errmsg(m);
    forge_train_batch b = {sizeof(forge_train_batch), 1, T, toks.data(), lens.data(), nullptr, mask.data(), targets.data()};
    double loss, want = 0;
    int64_t n;
    ASSERT_EQ(forge_train_eval(tr, &b, &loss, &n), FORGE_OK) << forge_trainer_errmsg(tr);
    for (int t = 0; t < T; t++)
        if (mask[t])
            for (int j = 0; j < V; j++) want += std::pow((double)logits[(size_t)t * V + j] - targets[(size_t)t * V + j], 2);
    want /= 8.0 * V;
    EXPECT_EQ(n, 8);
    EXPECT_NEAR(loss, want, 1e-5 * want);
    forge_trainer_free(tr);
    p.loss = FORGE_LOSS_MSE_HIDDEN;
    p.lr = 1e-2;
    p.targets = "all";
    ASSERT_EQ(forge_trainer_create(m, &p, &tr), FORGE_OK) << forge_model_errmsg(m);
    std::vector<float> zeros((size_t)T * H, 0.0f);
    b.targets = zeros.data();
    forge_train_stats st = ft::sized<forge_train_stats>();
    double l0 = 0, l1 = 0;
    for (int s = 0; s < 8; s++) {
        ASSERT_EQ(forge_train_step(tr, &b, &st), FORGE_OK) << forge_trainer_errmsg(tr);
        if (s == 0) l0 = st.loss;
        l1 = st.loss;
    }
    EXPECT_GT(l0, 0.0);
    EXPECT_LT(l1, 0.9 * l0) << "training toward zero hidden states lowers their squared norm";
    forge_trainer_free(tr);
    forge_model_free(m);
}

} // namespace

namespace {

/* ---- Qwen 3.5: linear-attention (Gated DeltaNet) layers beside gated full-attention ones ----
 * tests/fixtures/parity/qwen3_5_text_f32: hidden 64, layers 0-2 linear attention (2 key heads
 * and 4 value heads of 16, conv 4: in_proj_qkv [128, 64], in_proj_z [64, 64], in_proj_b and
 * in_proj_a [4, 64], out_proj [64, 64]), layer 3 full attention (4 heads of 32, 2 kv heads,
 * q_proj [256, 64]: each head's query and output gate; partial RoPE over 8 dims), MLP 128. */
const std::string kQwen35 = "tests/fixtures/parity/qwen3_5_text_f32";

struct Qwen35Shape {
    int layers = 4;
    /* moe: tests/fixtures/parity/qwen3_5_moe_f32, layers 0 and 2 linear, 1 and 3 full attention, the
     * MLP targets its shared expert of 48 (8 experts of 32, top 2, beside it) */
    bool moe = false;
    bool linear(int l) const { return moe ? l % 2 == 0 : l != 3; }
    /* in and out features of target t (HF's shapes) */
    void dims(int t, int *in, int *out) const {
        const int F = moe ? 48 : 128;
        const int ins[kNumTargets] = {64, 64, 64, 128, 64, 64, F, 64, 64, 64, 64, 64};
        const int outs[kNumTargets] = {256, 64, 64, 64, F, F, 64, 128, 64, 4, 4, 64};
        *in = ins[t];
        *out = outs[t];
    }
    bool has(int l, int t) const { return (t >= 4 && t <= 6) || (t >= 7) == linear(l); }
    /* the length of an adapter's gradient of rank `rank` in ft_train_grad_read's layout (0: none) */
    size_t grad_size(int l, int t, int rank) const {
        int in, out;
        dims(t, &in, &out);
        return has(l, t) ? (size_t)rank * (in + out) : 0u;
    }
};

/* Two right-padded sequences of 80 and 70 tokens, longer than HF's 64-token chunks of the delta
 * rule; the first 5 labels of the first masked. */
struct Qwen35Batch {
    std::vector<int32_t> tokens, labels, lengths = {80, 70};
    forge_train_batch b = ft::sized<forge_train_batch>();
    Qwen35Batch(uint32_t seed) {
        tokens.assign(160, 0);
        labels.assign(160, -100);
        for (int i = 0; i < 2; i++)
            for (int t = 0; t < lengths[i]; t++) {
                seed = seed * 1664525u + 1013904223u;
                tokens[i * 80 + t] = (int32_t)(seed >> 24);
                if (i || t >= 5) labels[i * 80 + t] = tokens[i * 80 + t];
            }
        b.n_seqs = 2;
        b.seq_len = 80;
        b.tokens = tokens.data();
        b.lengths = lengths.data();
        b.labels = labels.data();
    }
};

/* A PEFT adapter of rank 2 (lora_alpha 4) on every projection of the fixture, A = 0.1 N(0, 1),
 * B = 0.05 N(0, 1), written to a fresh directory; its tensors by name. */
std::string qwen35_adapter(const std::string &name, std::map<std::string, ft::Tensor> *tensors, Qwen35Shape q = Qwen35Shape()) {
    uint32_t seed = 50;
    for (int l = 0; l < q.layers; l++)
        for (int t = 0; t < kNumTargets; t++) {
            if (!q.has(l, t)) continue;
            int in, out;
            q.dims(t, &in, &out);
            (*tensors)[peft_key(l, t, "A", q.moe)] = ft::f32_tensor({2, in}, 0.1f, seed++);
            (*tensors)[peft_key(l, t, "B", q.moe)] = ft::f32_tensor({out, 2}, 0.05f, seed++);
        }
    std::string dir = ft::tmpdir(name);
    std::string cfg = R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "bias": "none", "target_modules": ["q_proj", "in_proj_qkv"]})";
    std::vector<uint8_t> st = ft::safetensors_bytes(*tensors);
    ft::write_file(dir + "/adapter_model.safetensors", st.data(), st.size());
    ft::write_file(dir + "/adapter_config.json", cfg.data(), cfg.size());
    return dir;
}

forge_train_params qwen35_params() {
    forge_train_params p = forge_train_default_params();
    p.targets = "all";
    p.rank = 4;
    p.alpha = 8;
    p.lr = 2e-2;
    p.max_batch = 2;
    p.max_seq = 80;
    p.seed = 3;
    p.grad_checkpoint = 0;
    return p;
}

/* The whole backward pass against the loss itself: after two AdamW steps (B is no longer zero),
 * the gradient of every adapter, as the directional derivative of forge_train_eval's loss along
 * it (central differences at +-eps, extrapolated: f64 sums of f32 rows); and checkpointing
 * gives the same gradients. expected_size(l, t) is each adapter's gradient length (0: not adapted). */
void expect_loss_derivatives(forge_model *m, forge_train_params p, const forge_train_batch *batch, int layers,
                             const std::function<size_t(int, int)> &expected_size, double move = 1e-3, double tol = 3e-3) {
    std::vector<std::vector<float>> grads[2];
    for (int ckpt = 0; ckpt < 2; ckpt++) {
        p.grad_checkpoint = ckpt;
        forge_trainer *tr = nullptr;
        ASSERT_EQ(forge_trainer_create(m, &p, &tr), FORGE_OK) << forge_model_errmsg(m);
        forge_train_stats st = ft::sized<forge_train_stats>();
        for (int s = 0; s < 2; s++) {
            ASSERT_EQ(forge_train_step(tr, batch, &st), FORGE_OK) << forge_trainer_errmsg(tr);
            ASSERT_TRUE(std::isfinite(st.loss) && st.grad_norm > 0) << st.loss << " " << st.grad_norm;
        }
        double loss;
        ASSERT_EQ(ft_train_backward(tr, batch, &loss), FORGE_OK) << forge_trainer_errmsg(tr);
        grads[ckpt].resize((size_t)layers * kNumTargets);
        for (int l = 0; l < layers; l++)
            for (int t = 0; t < kNumTargets; t++) {
                std::vector<float> &g = grads[ckpt][(size_t)l * kNumTargets + t];
                g.resize(8192);
                g.resize(ft_train_grad_read(tr, l, t, g.data(), g.size()));
                ASSERT_EQ(g.size(), expected_size(l, t)) << "layer " << l << " " << kTargets[t];
            }
        if (ckpt == 0) {
            double worst = 0;
            std::string where;
            for (int l = 0; l < layers; l++)
                for (int t = 0; t < kNumTargets; t++) {
                    const std::vector<float> &g = grads[0][(size_t)l * kNumTargets + t];
                    if (g.empty()) continue;
                    double norm = 0;
                    for (float v : g) norm += (double)v * v;
                    norm = std::sqrt(norm);
                    std::vector<float> dir(g.size());
                    for (size_t i = 0; i < g.size(); i++) dir[i] = (float)(g[i] / norm);
                    /* L(eps) along dir at eps = +-h, +-h/2; the derivative from both, Richardson-extrapolated */
                    auto at = [&](double eps) {
                        EXPECT_EQ(ft_train_param_add(tr, l, t, (float)eps, dir.data()), FORGE_OK);
                        double v;
                        EXPECT_EQ(forge_train_eval(tr, batch, &v, nullptr), FORGE_OK);
                        EXPECT_EQ(ft_train_param_add(tr, l, t, (float)-eps, dir.data()), FORGE_OK);
                        return v;
                    };
                    /* steps that move the loss by about 2 move (1e-3): f32 rounding (a few 1e-7 of it) stays below 1e-3 of the
                     * difference, and the q and k of Qwen 3.5's first linear layer, whose L2 norms of small vectors bend
                     * the loss sharply (their |g| is 10x the others'), keep their higher terms below it too (measured
                     * there: 2.6e-4 at eps 2e-4, 3.5e-3 at 5e-4, 9e-2 at 5e-3) */
                    const double h = std::fmin(20 * move, move / norm);
                    double d1 = (at(h) - at(-h)) / (2 * h), d2 = (at(h / 2) - at(-h / 2)) / h, fd = (4 * d2 - d1) / 3;
                    double e = std::fabs(fd - norm) / norm;
                    printf("  layer %d %-11s |g| %.5e, dL/d(eps) %.5e: rel %.1e\n", l, kTargets[t], norm, fd, e);
                    if (e > worst) worst = e, where = "layer " + std::to_string(l) + " " + kTargets[t];
                }
            EXPECT_LE(worst, tol) << where;
        }
        forge_trainer_free(tr);
    }
    for (size_t i = 0; i < grads[0].size(); i++) {
        if (grads[0][i].empty()) continue;
        EXPECT_LE(ft::rel_err(grads[1][i].data(), grads[0][i].data(), grads[0][i].size()), 1e-5)
            << "checkpointing: layer " << i / kNumTargets << " " << kTargets[i % kNumTargets];
    }
}

/* Qwen 3.5: this holds the linear-attention backward kernels, the gate, the partial RoPE and the
 * (1 + w) norms to the forward pass they invert, end to end. */
TEST(TrainQwen35, GradientsAreTheLossDerivatives) {
    forge_model *m = ft::load(ft::src(kQwen35));
    ASSERT_NE(m, nullptr);
    Qwen35Shape q;
    Qwen35Batch batch(7);
    expect_loss_derivatives(m, qwen35_params(), &batch.b, q.layers, [&](int l, int t) { return q.grad_size(l, t, 4); });
    forge_model_free(m);
}

/* Mixture-of-experts layers, their experts frozen: the backward pass through the routed experts
 * (grouped by expert, as the forward pass ran them), the renormalized top-k softmax router and, on
 * Qwen 3.5-MoE, the shared expert and its sigmoid gate, whose projections take the MLP targets
 * (mlp.shared_expert.gate_proj, as PEFT names them). Qwen 3.5-MoE (tests/fixtures/parity/
 * qwen3_5_moe_f32: Qwen 3.5's layers, 8 experts of 32, top 2, shared expert 48) and Qwen 3 MoE
 * (qwen3_moe_f32: 8 experts, top 2, layer 2 a dense MLP of 96 by mlp_only_layers), whose sparse
 * layers have no gate_proj, up_proj and down_proj. The loss is not smooth where a token's router
 * is near a tie between its k-th and next expert (a step that moves the tie swaps them), so
 * these take short sequences (fewer tokens near a tie) and steps that move the loss by 1e-4,
 * where f32 rounding is up to 5e-3 of the difference (measured here): within 1e-2. Without the
 * router's gradient (its logits' input gradient left out) the worst was 0.19. */
TEST(TrainMoe, GradientsAreTheLossDerivatives) {
    Qwen35Batch draw(9);
    std::vector<int32_t> tokens(48), labels(48), lengths = {24, 19};
    for (int i = 0; i < 48; i++) {
        tokens[i] = draw.tokens[(i / 24) * 80 + i % 24];
        labels[i] = i % 24 < lengths[i / 24] ? draw.labels[(i / 24) * 80 + i % 24] : -100;
    }
    forge_train_batch b = ft::sized<forge_train_batch>();
    b.n_seqs = 2;
    b.seq_len = 24;
    b.tokens = tokens.data();
    b.lengths = lengths.data();
    b.labels = labels.data();
    forge_train_params p = qwen35_params();
    p.max_seq = 24;
    forge_model *m = ft::load(ft::src("tests/fixtures/parity/qwen3_5_moe_f32"));
    ASSERT_NE(m, nullptr);
    Qwen35Shape q;
    q.moe = true;
    expect_loss_derivatives(m, p, &b, 4, [&](int l, int t) { return q.grad_size(l, t, 4); }, 1e-4, 1e-2);
    forge_model_free(m);
    m = ft::load(ft::src("tests/fixtures/parity/qwen3_moe_f32"));
    ASSERT_NE(m, nullptr);
    expect_loss_derivatives(m, p, &b, 4, [&](int l, int t) {
        const int ins[7] = {64, 64, 64, 64, 64, 64, 96}, outs[7] = {64, 32, 32, 64, 96, 96, 64};
        return t < 4 || (t < 7 && l == 2) ? (size_t)4 * (ins[t] + outs[t]) : 0u;
    }, 1e-4, 1e-2);
    forge_model_free(m);
}

/* The largest difference between the gradients (rel_err of each adapter's) that trainers on two
 * files of one model give from the adapter in adir, on one batch; where names the adapter. */
double gradient_gap(const char *const bases[2], const std::string &adir, const Qwen35Shape &q, const forge_train_batch *batch, std::string *where) {
    std::vector<float> grads[2][4][kNumTargets];
    for (int f = 0; f < 2; f++) {
        forge_model *m = ft::load(ft::src(bases[f]));
        EXPECT_NE(m, nullptr);
        if (!m) return INFINITY;
        forge_train_params p = qwen35_params();
        p.adapter_path = adir.c_str();
        forge_trainer *tr = nullptr;
        EXPECT_EQ(forge_trainer_create(m, &p, &tr), FORGE_OK) << forge_model_errmsg(m);
        double loss;
        EXPECT_EQ(tr ? ft_train_backward(tr, batch, &loss) : FORGE_ERR_INVALID_ARGUMENT, FORGE_OK) << (tr ? forge_trainer_errmsg(tr) : "");
        for (int l = 0; l < q.layers && tr; l++)
            for (int t = 0; t < kNumTargets; t++) {
                std::vector<float> &g = grads[f][l][t];
                g.resize(8192);
                g.resize(ft_train_grad_read(tr, l, t, g.data(), g.size()));
                EXPECT_EQ(g.size(), q.grad_size(l, t, 2)) << bases[f] << " layer " << l << " " << kTargets[t];
            }
        forge_trainer_free(tr);
        forge_model_free(m);
    }
    double worst = 0;
    for (int l = 0; l < q.layers; l++)
        for (int t = 0; t < kNumTargets; t++) {
            if (grads[0][l][t].empty() || grads[0][l][t].size() != grads[1][l][t].size()) continue;
            double g = ft::rel_err(grads[1][l][t].data(), grads[0][l][t].data(), grads[0][l][t].size());
            if (g > worst) worst = g, *where = "layer " + std::to_string(l) + " " + kTargets[t];
        }
    return worst;
}

/* Qwen 3.5-MoE as llama.cpp writes it (tests/fixtures/gguf/qwen3_5_moe_f32.gguf: the experts as
 * fused 3-D ffn_gate_up_exps / ffn_down_exps tensors, the shared expert's gate a vector, the value
 * heads tiled) trains to the gradients of its safetensors checkpoint (per-expert tensors), from
 * one adapter file in HF's layout (measured 5.5e-6 here). */
TEST(TrainMoe, GgufFileTrainsAsTheSafetensors) {
    Qwen35Shape q;
    q.moe = true;
    std::map<std::string, ft::Tensor> tensors;
    std::string adir = qwen35_adapter("qwen35_moe_adapter_gguf", &tensors, q); /* (A and B in HF's layout for both files) */
    Qwen35Batch batch(13);
    const char *const bases[2] = {"tests/fixtures/parity/qwen3_5_moe_f32", "tests/fixtures/gguf/qwen3_5_moe_f32.gguf"};
    std::string where;
    double worst = gradient_gap(bases, adir, q, &batch.b, &where);
    printf("  GGUF vs safetensors: gradients %.2e (%s)\n", worst, where.c_str());
    EXPECT_LE(worst, 1e-4) << where;
}

/* Adapter files in HF's layout on Qwen 3.5: an adapter on every projection (PEFT's names,
 * linear_attn.* included) gives the logits of the checkpoint with W + scale B A written into its
 * weights on the host (q_proj's B rows: each head's query, then its gate, in HF's dim order;
 * forge permutes and splits them as it does the weights), beside the weights and merged into
 * them at load; a trainer's saved adapter, PEFT and mlx-lm, starts a trainer at the same loss. */
TEST(TrainQwen35, AdaptersEqualTheMergedCheckpoint) {
    Qwen35Shape q;
    const int r = 2;
    const float scale = 2.0f; /* lora_alpha 4 / r */
    std::map<std::string, std::vector<float>> base;
    auto fn = [](void *user, const char *name, const float *data, int n_dims, const int64_t *shape) {
        size_t n = 1;
        for (int i = 0; i < n_dims; i++) n *= (size_t)shape[i];
        (*(std::map<std::string, std::vector<float>> *)user)[name].assign(data, data + n);
    };
    ASSERT_EQ(ft_safetensors_read(ft::src(kQwen35 + "/model.safetensors").c_str(), fn, &base), FORGE_OK);
    std::map<std::string, ft::Tensor> adapter;
    std::string adir = qwen35_adapter("qwen35_adapter", &adapter);
    for (int l = 0; l < q.layers; l++)
        for (int t = 0; t < kNumTargets; t++) {
            if (!q.has(l, t)) continue;
            int in, out;
            q.dims(t, &in, &out);
            const ft::Tensor &A = adapter[peft_key(l, t, "A")], &B = adapter[peft_key(l, t, "B")];
            std::string w = "model.layers." + std::to_string(l) + "." + group_of(t) + "." + kTargets[t] + ".weight";
            std::vector<float> &W = base[w];
            ASSERT_EQ(W.size(), (size_t)in * out) << w;
            const float *a = (const float *)A.data.data(), *b = (const float *)B.data.data();
            for (int o = 0; o < out; o++)
                for (int i = 0; i < in; i++) {
                    double s = 0;
                    for (int k = 0; k < r; k++) s += (double)b[o * r + k] * a[k * in + i];
                    W[(size_t)o * in + i] += (float)(scale * s);
                }
        }
    /* the merged checkpoint: every tensor as it was read (f32), the adapted weights changed */
    std::string mdir = ft::tmpdir("qwen35_merged");
    {
        std::map<std::string, ft::Tensor> ts;
        std::vector<uint8_t> cj = ft::read_file(ft::src(kQwen35 + "/config.json"));
        ft::write_file(mdir + "/config.json", cj.data(), cj.size());
        std::vector<uint8_t> st0 = ft::read_file(ft::src(kQwen35 + "/model.safetensors"));
        uint64_t hl = 0;
        for (int i = 0; i < 8; i++) hl |= (uint64_t)st0[i] << (8 * i);
        cJSON *h = cJSON_ParseWithLength((const char *)st0.data() + 8, hl);
        ASSERT_NE(h, nullptr);
        for (auto &kv : base) {
            cJSON *shape = cJSON_GetObjectItem(cJSON_GetObjectItem(h, kv.first.c_str()), "shape");
            ft::Tensor t{"F32", {}, std::vector<uint8_t>(kv.second.size() * 4)};
            cJSON *d;
            cJSON_ArrayForEach(d, shape) t.shape.push_back((int64_t)d->valuedouble);
            memcpy(t.data.data(), kv.second.data(), t.data.size());
            ts[kv.first] = t;
        }
        cJSON_Delete(h);
        std::vector<uint8_t> st = ft::safetensors_bytes(ts);
        ft::write_file(mdir + "/model.safetensors", st.data(), st.size());
    }
    Qwen35Batch batch(11);
    std::vector<int32_t> toks(batch.tokens.begin(), batch.tokens.begin() + 80);
    forge_model *mm = ft::load(mdir), *ma = load_with_adapter(ft::src(kQwen35), adir), *m0 = ft::load(ft::src(kQwen35));
    ASSERT_TRUE(mm && ma && m0);
    std::vector<float> want = all_logits(mm, toks), got = all_logits(ma, toks), none = all_logits(m0, toks);
    double e = ft::rel_err(got.data(), want.data(), want.size()), effect = ft::rel_err(none.data(), want.data(), want.size());
    printf("  adapter beside the weights vs the merged checkpoint: %.2e (the adapter moves the logits by %.2e)\n", e, effect);
    EXPECT_LE(e, 1e-5);
    EXPECT_GT(effect, 1e-2);
    forge_model_params mp = forge_model_default_params();
    mp.exact = 1;
    mp.adapter_path = adir.c_str();
    mp.adapter_merge = 1;
    forge_model *mg = nullptr;
    ASSERT_EQ(forge_model_load(ft::src(kQwen35).c_str(), &mp, &mg), FORGE_OK) << forge_model_errmsg(mg);
    std::vector<float> merged_logits = all_logits(mg, toks);
    EXPECT_LE(ft::rel_err(merged_logits.data(), want.data(), want.size()), 1e-5) << "adapter_merge";
    forge_model_free(mg);
    /* a trainer from that adapter, a step, then its saved files (PEFT, mlx-lm) start trainers at its loss */
    forge_train_params p = qwen35_params();
    p.adapter_path = adir.c_str();
    forge_trainer *tr = nullptr;
    ASSERT_EQ(forge_trainer_create(m0, &p, &tr), FORGE_OK) << forge_model_errmsg(m0);
    ASSERT_EQ(forge_train_step(tr, &batch.b, nullptr), FORGE_OK) << forge_trainer_errmsg(tr);
    double l1;
    ASSERT_EQ(forge_train_eval(tr, &batch.b, &l1, nullptr), FORGE_OK);
    for (forge_adapter_format fmt : {FORGE_ADAPTER_PEFT, FORGE_ADAPTER_MLX}) {
        std::string d = ft::tmpdir(fmt == FORGE_ADAPTER_PEFT ? "qwen35_saved_peft" : "qwen35_saved_mlx");
        ASSERT_EQ(forge_trainer_save(tr, d.c_str(), fmt), FORGE_OK) << forge_trainer_errmsg(tr);
        if (fmt == FORGE_ADAPTER_PEFT) {
            auto saved = read_tensors(d + "/adapter_model.safetensors");
            EXPECT_EQ(saved.size(), adapter.size());
            EXPECT_EQ(saved.count("base_model.model.model.layers.0.linear_attn.in_proj_b.lora_B.weight"), 1u);
            EXPECT_EQ(saved.count("base_model.model.model.layers.3.self_attn.q_proj.lora_B.weight"), 1u);
        } else {
            EXPECT_EQ(read_tensors(d + "/adapters.safetensors").count("model.layers.2.linear_attn.out_proj.lora_a"), 1u);
        }
        forge_train_params p2 = qwen35_params();
        p2.adapter_path = d.c_str();
        forge_trainer *t2 = nullptr;
        ASSERT_EQ(forge_trainer_create(m0, &p2, &t2), FORGE_OK) << forge_model_errmsg(m0);
        double l2;
        ASSERT_EQ(forge_train_eval(t2, &batch.b, &l2, nullptr), FORGE_OK);
        EXPECT_NEAR(l1, l2, 1e-5 * l1) << (fmt == FORGE_ADAPTER_PEFT ? "PEFT" : "mlx-lm");
        forge_trainer_free(t2);
    }
    forge_trainer_free(tr);
    forge_model_free(mm);
    forge_model_free(ma);
    forge_model_free(m0);
}

/* The same model from llama.cpp's GGUF (tests/fixtures/gguf/qwen3_5_text_f32.gguf, whose linear
 * attention orders its value heads tiled: in_proj_qkv's v rows, in_proj_z, b, a and out_proj's
 * inputs) with the same HF-layout adapter: the logits of the safetensors checkpoint's, and the
 * same step-0 gradients, read back in HF's layout. */
TEST(TrainQwen35, GgufFileTrainsAsTheSafetensors) {
    std::map<std::string, ft::Tensor> tensors;
    std::string adir = qwen35_adapter("qwen35_adapter_gguf", &tensors);
    forge_model *ms = load_with_adapter(ft::src(kQwen35), adir), *mg = load_with_adapter(ft::src("tests/fixtures/gguf/qwen3_5_text_f32.gguf"), adir);
    ASSERT_TRUE(ms && mg);
    Qwen35Batch batch(13);
    std::vector<int32_t> toks(batch.tokens.begin(), batch.tokens.begin() + 80);
    std::vector<float> ls = all_logits(ms, toks), lg = all_logits(mg, toks);
    double e = ft::rel_err(lg.data(), ls.data(), ls.size());
    printf("  GGUF + adapter vs safetensors + adapter: logits %.2e\n", e);
    EXPECT_LE(e, 1e-5);
    forge_model_free(ms);
    forge_model_free(mg);
    const char *const bases[2] = {kQwen35.c_str(), "tests/fixtures/gguf/qwen3_5_text_f32.gguf"};
    std::string where;
    double worst = gradient_gap(bases, adir, Qwen35Shape(), &batch.b, &where);
    printf("  GGUF vs safetensors: step-0 gradients %.2e (%s)\n", worst, where.c_str());
    EXPECT_LE(worst, 1e-4) << where;
}

/* forge train on Qwen 3.5 (token-id examples: the fixture has no tokenizer), the linear
 * attention's projections named: it trains and saves them under PEFT's names. */
TEST(TrainCli, Qwen35FineTune) {
    if (!ft::exists("./forge")) GTEST_SKIP() << "no ./forge binary in the working directory (the build tree)";
    std::string out = ft::tmpdir("cli_qwen35");
    std::string data;
    uint32_t seed = 5;
    for (int i = 0; i < 6; i++) {
        data += "{\"input_ids\": [";
        for (int t = 0; t < 70 + 3 * i; t++) {
            seed = seed * 1664525u + 1013904223u;
            data += (t ? ", " : "") + std::to_string(seed >> 24);
        }
        data += "]}\n";
    }
    ft::write_file(out + "/data.jsonl", data.data(), data.size());
    std::string cmd = "./forge train " + ft::src(kQwen35) + " --data " + out + "/data.jsonl --out " + out +
                      " --steps 3 --batch 2 --seq 96 --targets in_proj_qkv,in_proj_z,out_proj,q_proj --json > " + out + "/log.jsonl 2>&1";
    ASSERT_EQ(system(cmd.c_str()), 0) << cmd;
    std::vector<uint8_t> log = ft::read_file(out + "/log.jsonl");
    std::string text(log.begin(), log.end());
    EXPECT_NE(text.find("\"step\": 3"), std::string::npos) << text;
    auto t = read_tensors(out + "/adapter_model.safetensors");
    EXPECT_EQ(t.size(), 2u * (3 * 3 + 1)); /* three targets of each linear layer, q_proj of the attention layer */
    EXPECT_EQ(t.count("base_model.model.model.layers.1.linear_attn.in_proj_z.lora_A.weight"), 1u);
    EXPECT_EQ(t.count("base_model.model.model.layers.3.self_attn.q_proj.lora_B.weight"), 1u);
}

/* What training refuses on Qwen 3.5, by name: a projection no layer has, and the MoE variant. */
TEST(TrainQwen35, RefusalsNameTheCause) {
    forge_model *m = ft::load(ft::src(kQwen35));
    ASSERT_NE(m, nullptr);
    forge_train_params p = qwen35_params();
    p.targets = "in_proj_z,o_proj";
    p.n_layers = 1; /* the last layer only: full attention, no in_proj_z */
    forge_trainer *tr = nullptr;
    EXPECT_EQ(forge_trainer_create(m, &p, &tr), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_model_errmsg(m)).find("target in_proj_z"), std::string::npos) << forge_model_errmsg(m);
    forge_model_free(m);
    m = ft::load(ft::src("tests/fixtures/parity/qwen3_moe_f32")); /* Qwen 3 MoE: its last layer's MLP is experts alone */
    ASSERT_NE(m, nullptr);
    p = qwen35_params();
    p.targets = "q_proj,down_proj";
    p.n_layers = 1;
    EXPECT_EQ(forge_trainer_create(m, &p, &tr), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_model_errmsg(m)).find("target down_proj: no adapted layer"), std::string::npos) << forge_model_errmsg(m);
    forge_model_free(m);
    m = ft::load(ft::src("tests/fixtures/parity/gemma4_moe_f32"));
    ASSERT_NE(m, nullptr);
    p = qwen35_params();
    EXPECT_EQ(forge_trainer_create(m, &p, &tr), FORGE_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(forge_model_errmsg(m)).find("Gemma 4"), std::string::npos) << forge_model_errmsg(m);
    forge_model_free(m);
}

} // namespace
