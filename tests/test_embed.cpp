/* Embeddings and reranking against sentence-transformers 6.0.1 and transformers 5.17
 * (tests/fixtures/embed, made by tools/fixtures/make_embed_fixtures.py): checkpoints laid out as
 * sentence-transformers publishes them (Qwen3-Embedding's bare Qwen3Model with last-token
 * pooling; EmbeddingGemma's bidirectional Gemma 3 with mean pooling, two Dense projections,
 * max_seq_length; a Qwen3-Reranker; a one-label cross-encoder), each with its library's vectors
 * or scores. Every vector within 1e-4 of the reference; batching, padding and order never
 * change one; the sentence-transformers options (prompts, Matryoshka truncation, normalization)
 * and bad input each checked. */
#include <cjson/cJSON.h>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "internal.h"
#include "util.h"

namespace {

cJSON *read_json(const std::string &path) {
    std::vector<uint8_t> b = ft::read_file(path);
    return cJSON_ParseWithLength((const char *)b.data(), b.size());
}

std::string fx(const std::string &name) { return ft::src("tests/fixtures/embed/" + name); }

std::vector<float> floats(const cJSON *a) {
    std::vector<float> v;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) v.push_back((float)x->valuedouble);
    return v;
}

std::vector<std::string> strings(const cJSON *a) {
    std::vector<std::string> v;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) v.push_back(x->valuestring);
    return v;
}

struct EmbedCase {
    std::string prompt_name, prompt;
    bool has_prompt = false;
    int truncate_dim = 0;
    std::vector<std::vector<int32_t>> ids;
    std::vector<std::vector<float>> vectors;
};

struct EmbedRef {
    std::vector<std::string> texts;
    std::vector<EmbedCase> cases;
};

EmbedRef read_embed_ref(const std::string &dir) {
    cJSON *r = read_json(dir + "/reference.json");
    EmbedRef ref;
    ref.texts = strings(cJSON_GetObjectItem(r, "texts"));
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(r, "cases")) {
        EmbedCase ec;
        const cJSON *pn = cJSON_GetObjectItem(c, "prompt_name"), *pr = cJSON_GetObjectItem(c, "prompt"), *td = cJSON_GetObjectItem(c, "truncate_dim");
        if (cJSON_IsString(pn)) ec.prompt_name = pn->valuestring;
        if (cJSON_IsString(pr)) {
            ec.prompt = pr->valuestring;
            ec.has_prompt = true;
        }
        if (cJSON_IsNumber(td)) ec.truncate_dim = td->valueint;
        const cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(c, "ids")) {
            std::vector<int32_t> ids;
            const cJSON *y;
            cJSON_ArrayForEach(y, x) ids.push_back(y->valueint);
            ec.ids.push_back(ids);
        }
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(c, "vectors")) ec.vectors.push_back(floats(x));
        ref.cases.push_back(ec);
    }
    cJSON_Delete(r);
    return ref;
}

std::vector<forge_classify_prompt> text_prompts(const std::vector<std::string> &texts) {
    std::vector<forge_classify_prompt> p;
    for (const std::string &t : texts) p.push_back({sizeof(forge_classify_prompt), t.c_str(), t.size(), nullptr, 0});
    return p;
}

/* Embeds texts with params; returns the vectors [n, dim]. */
std::vector<float> embed(forge_session *s, const std::vector<forge_classify_prompt> &in, const forge_embed_params &ep, int *dim) {
    EXPECT_EQ(forge_embed(s, in.data(), (int)in.size(), &ep, nullptr, 0, dim), in.empty() ? FORGE_OK : FORGE_ERR_BUFFER_TOO_SMALL);
    std::vector<float> v((size_t)in.size() * (size_t)*dim);
    EXPECT_EQ(forge_embed(s, in.data(), (int)in.size(), &ep, v.data(), v.size(), dim), FORGE_OK) << forge_session_errmsg(s);
    return v;
}

double max_abs(const float *a, const std::vector<float> &b) {
    double w = 0;
    for (size_t i = 0; i < b.size(); i++) w = std::max(w, (double)std::fabs(a[i] - b[i]));
    return w;
}

/* Every case of a fixture: forge's vectors against sentence-transformers', and the token ids
 * forge runs against the ones it tokenized. */
void check_fixture(const std::string &name, int n_batch) {
    std::string dir = fx(name);
    EmbedRef ref = read_embed_ref(dir);
    forge_model *m = ft::load(dir);
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 256, n_batch);
    ASSERT_NE(s, nullptr);
    for (size_t c = 0; c < ref.cases.size(); c++) {
        const EmbedCase &ec = ref.cases[c];
        forge_embed_params ep = forge_embed_default_params();
        if (!ec.prompt_name.empty()) ep.prompt_name = ec.prompt_name.c_str();
        if (ec.has_prompt) ep.prompt = ec.prompt.c_str();
        ep.dim = ec.truncate_dim;
        int dim = 0;
        std::vector<float> v = embed(s, text_prompts(ref.texts), ep, &dim);
        ASSERT_EQ(dim, (int)ec.vectors[0].size()) << name << " case " << c;
        double worst = 0;
        for (size_t i = 0; i < ref.texts.size(); i++) {
            double e = max_abs(v.data() + i * dim, ec.vectors[i]);
            worst = std::max(worst, e);
            EXPECT_LE(e, 1e-4) << name << " case " << c << " text " << i;
        }
        /* the same ids as token prompts (no prompt added, truncated as given) */
        std::vector<forge_classify_prompt> tp;
        for (const std::vector<int32_t> &ids : ec.ids) tp.push_back({sizeof(forge_classify_prompt), nullptr, 0, ids.data(), (int)ids.size()});
        std::vector<float> vt = embed(s, tp, ep, &dim);
        for (size_t i = 0; i < ref.texts.size(); i++) EXPECT_LE(max_abs(vt.data() + i * dim, ec.vectors[i]), 1e-4) << name << " ids, case " << c << " text " << i;
        printf("%s case %zu: worst |forge - sentence-transformers| %.3g over %zu vectors of %d\n", name.c_str(), c, worst, ref.texts.size(), dim);
    }
    forge_session_free(s);
    forge_model_free(m);
}

TEST(Embed, Qwen3EmbeddingLastTokenMatchesSentenceTransformers) { check_fixture("qwen3_embed_f32", 512); }

TEST(Embed, EmbeddingGemmaBidirectionalMeanDenseMatchesSentenceTransformers) { check_fixture("gemma3_embed_f32", 512); }

/* Batches of one text each, and texts in reverse order: the same vectors. */
TEST(Embed, BatchingAndOrderNeverChangeAVector) {
    for (const char *name : {"qwen3_embed_f32", "gemma3_embed_f32"}) {
        std::string dir = fx(name);
        EmbedRef ref = read_embed_ref(dir);
        forge_model *m = ft::load(dir);
        ASSERT_NE(m, nullptr);
        forge_session *wide = ft::session(m, 256, 512), *narrow = ft::session(m, 80, 80); /* one text a batch, mostly */
        ASSERT_NE(wide, nullptr);
        ASSERT_NE(narrow, nullptr);
        forge_embed_params ep = forge_embed_default_params();
        int dim = 0;
        std::vector<float> a = embed(wide, text_prompts(ref.texts), ep, &dim);
        std::vector<std::string> rev(ref.texts.rbegin(), ref.texts.rend());
        std::vector<float> b = embed(narrow, text_prompts(rev), ep, &dim);
        size_t n = ref.texts.size();
        for (size_t i = 0; i < n; i++)
            for (int d = 0; d < dim; d++)
                EXPECT_NEAR(a[i * dim + d], b[(n - 1 - i) * dim + d], 2e-6) << name << " text " << i << " value " << d;
        forge_session_free(wide);
        forge_session_free(narrow);
        forge_model_free(m);
    }
}

/* forge_session_prewarm on a model that only embeds (EmbeddingGemma's layout, bidirectional, no
 * generation) prewarms a pooled batch, pool_mean included, and the vectors stay the reference's. */
TEST(Embed, PrewarmOfAnEmbeddingModelIsItsPooledBatch) {
    std::string dir = fx("gemma3_embed_f32");
    EmbedRef ref = read_embed_ref(dir);
    forge_model *m = ft::load(dir);
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 256, 512);
    ASSERT_NE(s, nullptr);
    std::vector<std::string> names;
    auto cb = [](void *u, int, int, const char *kernel) {
        if (kernel) ((std::vector<std::string> *)u)->push_back(kernel);
    };
    ASSERT_EQ(forge_session_prewarm(s, 0, cb, &names), FORGE_OK) << forge_session_errmsg(s);
    EXPECT_NE(std::find(names.begin(), names.end(), "pool_mean"), names.end());
    EXPECT_EQ(std::find(names.begin(), names.end(), "penalty"), names.end()) << "a generation kernel for a model that cannot generate";
    const EmbedCase &ec = ref.cases[0];
    forge_embed_params ep = forge_embed_default_params();
    if (!ec.prompt_name.empty()) ep.prompt_name = ec.prompt_name.c_str();
    if (ec.has_prompt) ep.prompt = ec.prompt.c_str();
    ep.dim = ec.truncate_dim;
    int dim = 0;
    std::vector<float> v = embed(s, text_prompts(ref.texts), ep, &dim);
    ASSERT_EQ(dim, (int)ec.vectors[0].size());
    for (size_t i = 0; i < ref.texts.size(); i++) EXPECT_LE(max_abs(v.data() + i * dim, ec.vectors[i]), 1e-4) << "text " << i;
    forge_session_free(s);
    forge_model_free(m);
}

/* The default (not exact) paths: an f16 KV cache, and on GPUs with cooperative matrices the
 * tensor-core products and prefill attention (attention_cm's bidirectional mode for
 * EmbeddingGemma), f16 rounding included: every vector within 0.9999 cosine of the reference. */
TEST(Embed, FastPathsStayCloseToTheReference) {
    for (const char *name : {"qwen3_embed_f32", "gemma3_embed_f32"}) {
        std::string dir = fx(name);
        EmbedRef ref = read_embed_ref(dir);
        forge_model *m = ft::load(dir, 0, 0, 0);
        ASSERT_NE(m, nullptr);
        forge_session *s = ft::session(m, 256, 512);
        ASSERT_NE(s, nullptr);
        int dim = 0;
        std::vector<float> v = embed(s, text_prompts(ref.texts), forge_embed_default_params(), &dim);
        for (size_t i = 0; i < ref.texts.size(); i++) {
            double dot = 0, a2 = 0, b2 = 0;
            for (int d = 0; d < dim; d++) {
                double a = v[i * dim + d], b = ref.cases[0].vectors[i][d];
                dot += a * b, a2 += a * a, b2 += b * b;
            }
            EXPECT_GE(dot / std::sqrt(a2 * b2), 0.9999) << name << " text " << i;
        }
        forge_session_free(s);
        forge_model_free(m);
    }
}

/* A sentence-transformers checkpoint whose untied LM head was not saved (Qwen3-Embedding-8B's
 * kind): qwen3_embed_f32 with tie_word_embeddings false loads, embeds the same vectors, and
 * refuses to generate by name. */
TEST(Embed, CheckpointWithoutItsLmHeadEmbeds) {
    std::string src = fx("qwen3_embed_f32"), dir = ft::tmpdir("embed_no_head");
    EmbedRef ref = read_embed_ref(src);
    for (const char *f : {"model.safetensors", "tokenizer.json", "tokenizer_config.json", "modules.json", "config_sentence_transformers.json",
                          "sentence_bert_config.json"}) {
        std::vector<uint8_t> b = ft::read_file(src + "/" + f);
        ft::write_file(dir + "/" + f, b.data(), b.size());
    }
    mkdir((dir + "/1_Pooling").c_str(), 0777);
    std::vector<uint8_t> pool = ft::read_file(src + "/1_Pooling/config.json");
    ft::write_file(dir + "/1_Pooling/config.json", pool.data(), pool.size());
    cJSON *cfg = read_json(src + "/config.json");
    cJSON_ReplaceItemInObject(cfg, "tie_word_embeddings", cJSON_CreateFalse());
    char *text = cJSON_Print(cfg);
    ft::write_file(dir + "/config.json", text, strlen(text));
    free(text);
    cJSON_Delete(cfg);
    forge_model *m = ft::load(dir);
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 256, 512);
    ASSERT_NE(s, nullptr);
    int dim = 0;
    std::vector<float> v = embed(s, text_prompts(ref.texts), forge_embed_default_params(), &dim);
    for (size_t i = 0; i < ref.texts.size(); i++) EXPECT_LE(max_abs(v.data() + i * dim, ref.cases[0].vectors[i]), 1e-4) << "text " << i;
    int32_t tok = 1;
    EXPECT_EQ(forge_eval(s, &tok, 1, 0, nullptr, 0), FORGE_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(forge_session_errmsg(s)).find("no LM head"), std::string::npos) << forge_session_errmsg(s);
    forge_session_free(s);
    forge_model_free(m);
}

/* EmbeddingGemma's Dense projections on the device (as forge runs them) and on the host (the
 * path of a Tanh Dense): the same vectors. */
TEST(Embed, DenseStepsOnTheDeviceEqualTheHosts) {
    std::string dir = fx("gemma3_embed_f32");
    EmbedRef ref = read_embed_ref(dir);
    forge_model *m = ft::load(dir);
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 256, 512);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(ft_session_embed_dense(s, -1), 1) << "the fixture's two Dense steps should run on the device";
    forge_embed_params ep = forge_embed_default_params();
    int dim = 0;
    std::vector<float> dev = embed(s, text_prompts(ref.texts), ep, &dim);
    forge_session *hs = ft::session(m, 256, 512);
    ASSERT_NE(hs, nullptr);
    ft_session_embed_dense(hs, 0); /* before its first pass records the path */
    std::vector<float> host = embed(hs, text_prompts(ref.texts), ep, &dim);
    forge_session_free(hs);
    for (size_t i = 0; i < dev.size(); i++) EXPECT_NEAR(dev[i], host[i], 1e-6) << "value " << i;
    for (size_t i = 0; i < ref.texts.size(); i++) EXPECT_LE(max_abs(host.data() + i * dim, ref.cases[0].vectors[i]), 1e-4) << "host, text " << i;
    forge_session_free(s);
    forge_model_free(m);
}

TEST(Embed, InfoNormalizeAndErrors) {
    std::string dir = fx("gemma3_embed_f32");
    EmbedRef ref = read_embed_ref(dir);
    forge_model *m = ft::load(dir);
    ASSERT_NE(m, nullptr);
    forge_embed_info info = ft::sized<forge_embed_info>();
    ASSERT_EQ(forge_embed_info_get(m, &info), FORGE_OK) << forge_model_errmsg(m);
    EXPECT_EQ(info.dim, 64);
    EXPECT_EQ(info.pooling, FORGE_POOLING_MEAN);
    EXPECT_EQ(info.normalize, 1);
    EXPECT_EQ(info.max_tokens, 32);
    EXPECT_EQ(info.n_dense, 2);
    EXPECT_EQ(info.bidirectional, 1);
    EXPECT_EQ(info.sentence_transformers, 1);
    EXPECT_STREQ(info.prompt_names, "query,document");
    forge_session *s = ft::session(m, 256, 512);
    ASSERT_NE(s, nullptr);
    std::vector<forge_classify_prompt> in = text_prompts(ref.texts);
    forge_embed_params ep = forge_embed_default_params();
    int dim = 0;
    /* normalize 1 with a Matryoshka dim: unit vectors, the reference's truncated ones rescaled */
    ep.dim = 16;
    ep.normalize = 1;
    std::vector<float> v = embed(s, in, ep, &dim);
    const EmbedCase &trunc = ref.cases.back();
    ASSERT_EQ(trunc.truncate_dim, 16);
    for (size_t i = 0; i < in.size(); i++) {
        double n2 = 0, r2 = 0;
        for (int d = 0; d < 16; d++) n2 += (double)v[i * 16 + d] * v[i * 16 + d], r2 += (double)trunc.vectors[i][d] * trunc.vectors[i][d];
        EXPECT_NEAR(n2, 1.0, 1e-5);
        for (int d = 0; d < 16; d++) EXPECT_NEAR(v[i * 16 + d], trunc.vectors[i][d] / std::sqrt(r2), 1e-4);
    }
    /* normalize 0: the Normalize module skipped, so the vectors are the unit ones times their norm */
    ep = forge_embed_default_params();
    ep.normalize = 0;
    std::vector<float> raw = embed(s, in, ep, &dim);
    for (size_t i = 0; i < in.size(); i++) {
        double n2 = 0;
        for (int d = 0; d < dim; d++) n2 += (double)raw[i * dim + d] * raw[i * dim + d];
        EXPECT_GT(std::fabs(n2 - 1.0), 1e-3) << "text " << i << " came back normalized";
        for (int d = 0; d < dim; d++) EXPECT_NEAR(raw[i * dim + d] / std::sqrt(n2), ref.cases[0].vectors[i][d], 1e-4);
    }
    /* errors name what is wrong */
    std::vector<float> out(4096);
    ep = forge_embed_default_params();
    ep.prompt_name = "nope";
    EXPECT_EQ(forge_embed(s, in.data(), (int)in.size(), &ep, out.data(), out.size(), &dim), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_session_errmsg(s)).find("'nope' is not one of the model's prompts (query,document)"), std::string::npos)
        << forge_session_errmsg(s);
    ep = forge_embed_default_params();
    ep.dim = 65;
    EXPECT_EQ(forge_embed(s, in.data(), (int)in.size(), &ep, out.data(), out.size(), &dim), FORGE_ERR_INVALID_ARGUMENT);
    ep = forge_embed_default_params();
    ep.truncate = 0; /* texts past max_seq_length (32) are refused by index */
    EXPECT_EQ(forge_embed(s, in.data(), (int)in.size(), &ep, out.data(), out.size(), &dim), FORGE_ERR_LIMIT);
    EXPECT_NE(std::string(forge_session_errmsg(s)).find("max_seq_length"), std::string::npos) << forge_session_errmsg(s);
    ep = forge_embed_default_params();
    EXPECT_EQ(forge_embed(s, in.data(), (int)in.size(), &ep, out.data(), 10, &dim), FORGE_ERR_BUFFER_TOO_SMALL);
    /* an embedding model generates nothing */
    int32_t tok = 2;
    EXPECT_EQ(forge_eval(s, &tok, 1, 0, nullptr, 0), FORGE_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(forge_session_errmsg(s)).find("bidirectional"), std::string::npos) << forge_session_errmsg(s);
    forge_session_free(s);
    forge_model_free(m);
}

/* Qwen3-Reranker's formulation and a one-label cross-encoder. */
TEST(Rerank, MatchesTransformersAndCrossEncoder) {
    {
        std::string dir = fx("qwen3_rerank_f32");
        cJSON *r = read_json(dir + "/reference.json");
        std::string query = cJSON_GetObjectItem(r, "query")->valuestring;
        std::vector<std::string> docs = strings(cJSON_GetObjectItem(r, "documents"));
        std::vector<const char *> dp;
        for (const std::string &d : docs) dp.push_back(d.c_str());
        forge_model *m = ft::load(dir);
        ASSERT_NE(m, nullptr);
        forge_session *s = ft::session(m, 512, 1024);
        ASSERT_NE(s, nullptr);
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(r, "cases")) {
            forge_rerank_params rp = forge_rerank_default_params();
            const cJSON *ins = cJSON_GetObjectItem(c, "instruction");
            if (cJSON_IsString(ins)) rp.instruction = ins->valuestring;
            std::vector<float> want = floats(cJSON_GetObjectItem(c, "scores")), got(docs.size());
            ASSERT_EQ(forge_rerank(s, query.c_str(), dp.data(), (int)dp.size(), &rp, got.data()), FORGE_OK) << forge_session_errmsg(s);
            for (size_t i = 0; i < docs.size(); i++) EXPECT_NEAR(got[i], want[i], 1e-4) << "reranker document " << i;
            rp.raw = 1;
            ASSERT_EQ(forge_rerank(s, query.c_str(), dp.data(), (int)dp.size(), &rp, got.data()), FORGE_OK) << forge_session_errmsg(s);
            for (size_t i = 0; i < docs.size(); i++) EXPECT_NEAR(1.0 / (1.0 + std::exp(-got[i])), want[i], 1e-4) << "raw, document " << i;
        }
        cJSON_Delete(r);
        forge_session_free(s);
        forge_model_free(m);
    }
    {
        std::string dir = fx("qwen3_cross_f32");
        cJSON *r = read_json(dir + "/reference.json");
        std::string query = cJSON_GetObjectItem(r, "query")->valuestring;
        std::vector<std::string> docs = strings(cJSON_GetObjectItem(r, "documents"));
        std::vector<const char *> dp;
        for (const std::string &d : docs) dp.push_back(d.c_str());
        std::vector<float> want = floats(cJSON_GetObjectItem(r, "scores")), want_raw = floats(cJSON_GetObjectItem(r, "logits")), got(docs.size());
        forge_model *m = ft::load(dir);
        ASSERT_NE(m, nullptr);
        forge_session *s = ft::session(m, 512, 1024);
        ASSERT_NE(s, nullptr);
        forge_rerank_params rp = forge_rerank_default_params();
        ASSERT_EQ(forge_rerank(s, query.c_str(), dp.data(), (int)dp.size(), &rp, got.data()), FORGE_OK) << forge_session_errmsg(s);
        for (size_t i = 0; i < docs.size(); i++) EXPECT_NEAR(got[i], want[i], 1e-4) << "cross-encoder document " << i;
        rp.raw = 1;
        ASSERT_EQ(forge_rerank(s, query.c_str(), dp.data(), (int)dp.size(), &rp, got.data()), FORGE_OK) << forge_session_errmsg(s);
        for (size_t i = 0; i < docs.size(); i++) EXPECT_NEAR(got[i], want_raw[i], 1e-4) << "cross-encoder logit, document " << i;
        /* its head is no LM head: generation and embedding refuse it by name */
        int32_t tok = 1;
        EXPECT_EQ(forge_eval(s, &tok, 1, 0, nullptr, 0), FORGE_ERR_UNSUPPORTED);
        EXPECT_NE(std::string(forge_session_errmsg(s)).find("sequence classifier"), std::string::npos) << forge_session_errmsg(s);
        forge_classify_prompt p = {sizeof(forge_classify_prompt), "hi", 2, nullptr, 0};
        float v[64];
        int dim = 0;
        EXPECT_EQ(forge_embed(s, &p, 1, nullptr, v, 64, &dim), FORGE_ERR_UNSUPPORTED);
        cJSON_Delete(r);
        forge_session_free(s);
        forge_model_free(m);
    }
}

/* A model with neither formulation is refused by name: the embedding fixtures (Qwen3's cut
 * vocabulary has no 'yes' or 'no'; EmbeddingGemma's attention is bidirectional). */
TEST(Rerank, RefusesAModelWithNeitherFormulation) {
    for (const char *name : {"qwen3_embed_f32", "gemma3_embed_f32"}) {
        forge_model *m = ft::load(fx(name));
        ASSERT_NE(m, nullptr);
        forge_session *s = ft::session(m, 256);
        ASSERT_NE(s, nullptr);
        const char *doc = "Once upon a time";
        float score = 0;
        EXPECT_EQ(forge_rerank(s, "a story", &doc, 1, nullptr, &score), FORGE_ERR_UNSUPPORTED) << name;
        EXPECT_NE(std::string(forge_session_errmsg(s)).find("Qwen3-Reranker"), std::string::npos) << forge_session_errmsg(s);
        forge_session_free(s);
        forge_model_free(m);
    }
}

}  // namespace
