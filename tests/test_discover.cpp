/* forge_discover: a temporary tree built from the committed fixtures and stories260K, plus
 * broken models, searched with every option. Parameter counts and sizes are computed here from
 * the files themselves (a safetensors / GGUF header reader of the test's own), not by forge. */
#include "internal.h"
#include "util.h"

#include <cjson/cJSON.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <map>

namespace {

/* ---- the test's own header readers: elements of every tensor ---- */

uint64_t st_elements(const std::string &path) {
    std::vector<uint8_t> b = ft::read_file(path);
    if (b.size() < 8) return 0;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b[i];
    cJSON *root = cJSON_ParseWithLength((const char *)b.data() + 8, hlen);
    uint64_t total = 0;
    for (cJSON *it = root ? root->child : nullptr; it; it = it->next) {
        std::string name = it->string;
        /* the other towers' weights and Qwen 3.5's multi-token prediction, which forge skips */
        if (name == "__metadata__" || name.find("vision") != std::string::npos || name.find("visual") != std::string::npos ||
            name.find("multi_modal_projector") != std::string::npos || name.rfind("mtp.", 0) == 0)
            continue;
        uint64_t n = 1;
        cJSON *d;
        cJSON_ArrayForEach(d, cJSON_GetObjectItem(it, "shape")) n *= (uint64_t)d->valuedouble;
        total += n;
    }
    cJSON_Delete(root);
    return total;
}

uint64_t gguf_elements(const std::string &path) {
    std::vector<uint8_t> b = ft::read_file(path);
    size_t p = 0;
    auto u32 = [&] { uint32_t v; memcpy(&v, &b[p], 4); p += 4; return v; };
    auto u64 = [&] { uint64_t v; memcpy(&v, &b[p], 8); p += 8; return v; };
    const size_t scalar[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    auto skip = [&](uint32_t type) {
        if (type == 8) { uint64_t n = u64(); p += n; }
        else p += scalar[type];
    };
    p = 8;
    uint64_t n_tensors = u64(), n_kv = u64();
    for (uint64_t i = 0; i < n_kv; i++) {
        uint64_t klen = u64();
        p += klen;
        uint32_t type = u32();
        if (type == 9) {
            uint32_t et = u32();
            uint64_t n = u64();
            for (uint64_t k = 0; k < n; k++) skip(et);
        } else {
            skip(type);
        }
    }
    uint64_t total = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        uint64_t nlen = u64();
        p += nlen;
        uint32_t nd = u32();
        uint64_t n = 1;
        std::string name((const char *)&b[p - 4 - nlen], nlen);
        for (uint32_t d = 0; d < nd; d++) n *= u64();
        p += 4 + 8; /* type, offset */
        if (name != "rope_freqs.weight") total += n; /* RoPE factors: constants, not parameters */
    }
    return total;
}

uint64_t file_size(const std::string &p) {
    struct stat sb;
    return stat(p.c_str(), &sb) == 0 ? (uint64_t)sb.st_size : 0;
}

void copy(const std::string &from, const std::string &to) {
    std::vector<uint8_t> b = ft::read_file(from);
    ASSERT_FALSE(b.empty()) << from;
    ft::write_file(to, b.data(), b.size());
}

void mkdirs(const std::string &d) { ASSERT_EQ(system(("mkdir -p '" + d + "'").c_str()), 0) << d; }

void write_text(const std::string &p, const std::string &s) { ft::write_file(p, s.data(), s.size()); }

/* `to`: the safetensors file `from` with its header edited by `edit`, the data kept (offsets are
 * relative to it). */
void rewrite_safetensors(const std::string &from, const std::string &to, const std::function<void(cJSON *)> &edit) {
    std::vector<uint8_t> st = ft::read_file(from);
    ASSERT_GT(st.size(), 8u) << from;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | st[i];
    cJSON *h = cJSON_ParseWithLength((const char *)st.data() + 8, hlen);
    ASSERT_NE(h, nullptr) << from;
    edit(h);
    char *text = cJSON_PrintUnformatted(h);
    std::string header = text;
    free(text);
    cJSON_Delete(h);
    while (header.size() % 8) header += ' ';
    std::vector<uint8_t> out(8);
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)(header.size() >> (8 * i));
    out.insert(out.end(), header.begin(), header.end());
    out.insert(out.end(), st.begin() + 8 + (long)hlen, st.end());
    ft::write_file(to, out.data(), out.size());
}

/* A tensor entry {"dtype": "F32", "shape": [...], "data_offsets": [0, 4 * elements]}. */
cJSON *f32_entry(const std::vector<int> &shape) {
    cJSON *e = cJSON_CreateObject(), *sh = cJSON_AddArrayToObject(e, "shape"), *off = cJSON_AddArrayToObject(e, "data_offsets");
    cJSON_AddStringToObject(e, "dtype", "F32");
    int n = 1;
    for (int d : shape) { cJSON_AddItemToArray(sh, cJSON_CreateNumber(d)); n *= d; }
    cJSON_AddItemToArray(off, cJSON_CreateNumber(0));
    cJSON_AddItemToArray(off, cJSON_CreateNumber(4 * n));
    return e;
}

struct Found {
    std::string path, format, arch, dtype, reason;
    int bits, n_files, loadable;
    uint64_t n_params, bytes, device_bytes;
    forge_status status;
};

struct Search {
    std::vector<Found> models;
    std::vector<std::string> log;
    int stop_after = 0;
};

int collect(void *user, const forge_discovered_model *d) {
    Search *r = (Search *)user;
    r->models.push_back({d->path, d->format_name, d->architecture, d->weight_dtype, d->reason, d->quant_bits, d->n_files, d->loadable,
                         d->n_params, d->bytes, d->device_bytes, d->status});
    EXPECT_EQ(d->format == FORGE_FORMAT_GGUF, std::string(d->format_name) == "gguf");
    return r->stop_after && (int)r->models.size() >= r->stop_after;
}

void log_line(void *user, forge_log_level, const char *msg) { ((Search *)user)->log.push_back(msg); }

/* The tree, under build/tmp_discover:
 *   hf/llama3_f32_untied/          config + one file      hf/llama3_f32_untied/sub/  its own model
 *   hf/llama3_f32_untied/original/ a .safetensors without config: not a model
 *   hf/qwen3_f32_sharded/          3 shards + index       hf/gemma3_mm_f32/  multimodal
 *   hf/llama_mlx_mixed/            MLX mixed bits
 *   hf/qwen3_5_text_f32/ hf/qwen3_5_moe_f32/ hf/qwen3_5_mm_bf16/ (multimodal) hf/mistral_window_f32/
 *   hf/qwen3_5_moe_mm/             qwen3_5_moe_f32 in the published multimodal layout (model_type
 *                                  qwen3_5_moe, text_config, model.language_model.*), with a vision
 *                                  and a multi-token-prediction tensor (skipped)
 *   gguf/stories260K.gguf, gguf/qwen2_f32_tied.gguf, gguf/model_q4_0.gguf,
 *   gguf/qwen3_5_text_q4_0.gguf, gguf/qwen3_5_moe_q8_0.gguf, gguf/mistral_v03_bf16.gguf (llama.cpp's arch llama)
 *   broken/bad_json/ broken/mamba/ broken/truncated/ broken/missing_tensor/ broken/bad_magic.gguf
 *   broken/qwen3_5_no_a_log/       a linear-attention layer's A_log missing
 *   adapter/ (PEFT: adapter_config.json + adapter_model.safetensors: not a model)
 *   empty/   .hidden/x.gguf (skipped)   nested/a/b/c/deep.gguf   nested/loop -> ..  */
class Discover : public ::testing::Test {
protected:
    std::string root;
    std::map<std::string, uint64_t> params, bytes; /* expected, by path */

    void SetUp() override {
        root = ft::tmpdir("discover");
        std::string P = ft::src("tests/fixtures/parity/"), G = ft::src("tests/fixtures/gguf/");
        for (const char *name : {"llama3_f32_untied", "qwen3_f32_sharded", "gemma3_mm_f32", "qwen3_5_text_f32", "qwen3_5_moe_f32",
                                 "qwen3_5_mm_bf16", "mistral_window_f32"}) {
            std::string d = root + "/hf/" + name;
            mkdirs(d);
            copy(P + name + "/config.json", d + "/config.json");
            std::vector<std::string> shards;
            if (std::string(name) == "qwen3_f32_sharded") {
                copy(P + name + "/model.safetensors.index.json", d + "/model.safetensors.index.json");
                for (const char *s : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"})
                    shards.push_back(s);
            } else {
                shards.push_back("model.safetensors");
            }
            for (const std::string &s : shards) {
                copy(P + name + "/" + s, d + "/" + s);
                params[d] += st_elements(d + "/" + s);
                bytes[d] += file_size(d + "/" + s);
            }
        }
        std::string l = root + "/hf/llama3_f32_untied";
        mkdirs(l + "/sub");
        mkdirs(l + "/original");
        copy(P + "llama3_f32_untied/config.json", l + "/sub/config.json");
        copy(P + "llama3_f32_untied/model.safetensors", l + "/sub/model.safetensors");
        copy(P + "llama3_f32_untied/model.safetensors", l + "/original/consolidated.safetensors");
        params[l + "/sub"] = params[l];
        bytes[l + "/sub"] = bytes[l];
        /* Qwen 3.5 MoE as published: the text model under model.language_model., its config under text_config */
        std::string mm = root + "/hf/qwen3_5_moe_mm", moe = P + "qwen3_5_moe_f32/";
        mkdirs(mm);
        std::vector<uint8_t> cfg = ft::read_file(moe + "config.json");
        cJSON *text_config = cJSON_ParseWithLength((const char *)cfg.data(), cfg.size()), *wrapper = cJSON_CreateObject();
        ASSERT_NE(text_config, nullptr);
        cJSON_AddStringToObject(wrapper, "model_type", "qwen3_5_moe");
        cJSON_AddItemToObject(wrapper, "text_config", text_config);
        char *wrapped = cJSON_Print(wrapper);
        write_text(mm + "/config.json", wrapped);
        free(wrapped);
        cJSON_Delete(wrapper);
        rewrite_safetensors(moe + "model.safetensors", mm + "/model.safetensors", [](cJSON *h) {
            for (cJSON *it = h->child; it; it = it->next)
                if (std::string(it->string).rfind("model.", 0) == 0) {
                    std::string name = "model.language_model." + std::string(it->string).substr(6);
                    free(it->string);
                    it->string = strdup(name.c_str());
                }
            cJSON_AddItemToObject(h, "model.visual.patch_embed.proj.weight", f32_entry({2, 3, 2, 1, 1})); /* 5-D, as a video patch embedding */
            cJSON_AddItemToObject(h, "mtp.fc.weight", f32_entry({4, 4}));
        });
        params[mm] = st_elements(mm + "/model.safetensors");
        bytes[mm] = file_size(mm + "/model.safetensors");
        ASSERT_EQ(params[mm], params[root + "/hf/qwen3_5_moe_f32"]);

        std::string mlx = root + "/hf/llama_mlx_mixed";
        mkdirs(mlx);
        copy(ft::src("tests/fixtures/mlx/llama_mlx_mixed/config.json"), mlx + "/config.json");
        copy(ft::src("tests/fixtures/mlx/llama_mlx_mixed/model.safetensors"), mlx + "/model.safetensors");
        bytes[mlx] = file_size(mlx + "/model.safetensors");

        mkdirs(root + "/gguf");
        copy(ft::src("models/stories260K/stories260K.gguf"), root + "/gguf/stories260K.gguf");
        copy(G + "qwen2_f32_tied.gguf", root + "/gguf/qwen2_f32_tied.gguf");
        copy(ft::src("tests/fixtures/lora/llama_q4_0/model.gguf"), root + "/gguf/model_q4_0.gguf");
        for (const char *g : {"qwen3_5_text_q4_0.gguf", "qwen3_5_moe_q8_0.gguf", "mistral_v03_bf16.gguf"}) copy(G + g, root + "/gguf/" + g);
        for (const char *g : {"stories260K.gguf", "qwen2_f32_tied.gguf", "model_q4_0.gguf", "qwen3_5_text_q4_0.gguf", "qwen3_5_moe_q8_0.gguf",
                              "mistral_v03_bf16.gguf"}) {
            std::string p = root + "/gguf/" + g;
            params[p] = gguf_elements(p);
            bytes[p] = file_size(p);
        }

        std::string B = root + "/broken/";
        std::string llama_cfg = P + "llama3_f32_untied/config.json", llama_st = P + "llama3_f32_untied/model.safetensors";
        mkdirs(B + "bad_json");
        write_text(B + "bad_json/config.json", "{\"model_type\": \"llama\",");
        copy(llama_st, B + "bad_json/model.safetensors");
        mkdirs(B + "mamba");
        write_text(B + "mamba/config.json", "{\"model_type\": \"mamba\", \"hidden_size\": 64}");
        copy(llama_st, B + "mamba/model.safetensors");
        mkdirs(B + "truncated");
        copy(llama_cfg, B + "truncated/config.json");
        std::vector<uint8_t> st = ft::read_file(llama_st);
        ft::write_file(B + "truncated/model.safetensors", st.data(), 200); /* the header says more than 200 bytes */
        /* the same file without one tensor */
        mkdirs(B + "missing_tensor");
        copy(llama_cfg, B + "missing_tensor/config.json");
        rewrite_safetensors(llama_st, B + "missing_tensor/model.safetensors", [](cJSON *h) {
            ASSERT_NE(cJSON_GetObjectItem(h, "model.layers.1.mlp.up_proj.weight"), nullptr);
            cJSON_DeleteItemFromObject(h, "model.layers.1.mlp.up_proj.weight");
        });
        mkdirs(B + "qwen3_5_no_a_log");
        copy(P + "qwen3_5_text_f32/config.json", B + "qwen3_5_no_a_log/config.json");
        rewrite_safetensors(P + "qwen3_5_text_f32/model.safetensors", B + "qwen3_5_no_a_log/model.safetensors", [](cJSON *h) {
            ASSERT_NE(cJSON_GetObjectItem(h, "model.layers.1.linear_attn.A_log"), nullptr);
            cJSON_DeleteItemFromObject(h, "model.layers.1.linear_attn.A_log");
        });
        std::vector<uint8_t> g = ft::read_file(G + "qwen2_f32_tied.gguf");
        ft::write_file(B + "truncated.gguf", g.data(), 1000); /* inside the tensor infos */
        g[3] = 'X';
        ft::write_file(B + "bad_magic.gguf", g.data(), g.size());

        mkdirs(root + "/adapter");
        copy(ft::src("tests/fixtures/lora/llama3/adapter_init/adapter_config.json"), root + "/adapter/adapter_config.json");
        copy(ft::src("tests/fixtures/lora/llama3/adapter_init/adapter_model.safetensors"), root + "/adapter/adapter_model.safetensors");
        mkdirs(root + "/empty");
        mkdirs(root + "/.hidden");
        copy(G + "qwen2_f32_tied.gguf", root + "/.hidden/x.gguf");
        mkdirs(root + "/nested/a/b/c");
        copy(G + "qwen2_f32_tied.gguf", root + "/nested/a/b/c/deep.gguf");
        params[root + "/nested/a/b/c/deep.gguf"] = params[root + "/gguf/qwen2_f32_tied.gguf"];
        bytes[root + "/nested/a/b/c/deep.gguf"] = bytes[root + "/gguf/qwen2_f32_tied.gguf"];
        ASSERT_EQ(symlink("..", (root + "/nested/loop").c_str()), 0);
    }

    void TearDown() override {
        if (!root.empty()) { EXPECT_EQ(system(("rm -rf '" + root + "'").c_str()), 0); }
    }

    Search run(int depth = 8, int follow = 0, int quick = 0, int stop_after = 0) {
        Search r;
        r.stop_after = stop_after;
        forge_discover_params p = forge_discover_default_params();
        p.max_depth = depth;
        p.follow_symlinks = follow;
        p.quick = quick;
        p.log = log_line;
        p.log_user_data = &r;
        char err[512] = "";
        EXPECT_EQ(forge_discover(root.c_str(), &p, collect, &r, err, sizeof err), FORGE_OK) << err;
        return r;
    }

    const Found *find(const Search &r, const std::string &rel) {
        for (const Found &f : r.models)
            if (f.path == root + "/" + rel) return &f;
        ADD_FAILURE() << rel << " not found";
        return nullptr;
    }
};

const char *const kAll[] = {
    "broken/bad_json", "broken/bad_magic.gguf", "broken/mamba", "broken/missing_tensor", "broken/qwen3_5_no_a_log", "broken/truncated",
    "broken/truncated.gguf",
    "gguf/mistral_v03_bf16.gguf", "gguf/model_q4_0.gguf", "gguf/qwen2_f32_tied.gguf", "gguf/qwen3_5_moe_q8_0.gguf",
    "gguf/qwen3_5_text_q4_0.gguf", "gguf/stories260K.gguf",
    "hf/gemma3_mm_f32", "hf/llama3_f32_untied", "hf/llama3_f32_untied/sub", "hf/llama_mlx_mixed", "hf/mistral_window_f32",
    "hf/qwen3_5_mm_bf16", "hf/qwen3_5_moe_f32", "hf/qwen3_5_moe_mm", "hf/qwen3_5_text_f32", "hf/qwen3_f32_sharded",
    "nested/a/b/c/deep.gguf",
};

std::vector<std::string> rel_paths(const Search &r, const std::string &root) {
    std::vector<std::string> v;
    for (const Found &f : r.models) v.push_back(f.path.substr(root.size() + 1));
    return v;
}

}  // namespace

TEST_F(Discover, FindsEveryModelInPathOrder) {
    Search r = run();
    std::vector<std::string> want(std::begin(kAll), std::end(kAll));
    EXPECT_EQ(rel_paths(r, root), want);
    std::vector<std::string> sorted = rel_paths(r, root);
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(rel_paths(r, root), sorted);
    /* the link loop is not followed by default, and says so */
    bool logged = false;
    for (const std::string &l : r.log) logged |= l.find("nested/loop") != std::string::npos;
    EXPECT_TRUE(logged);
}

TEST_F(Discover, LoadableModelsHaveEveryField) {
    Search r = run();
    struct Want { const char *rel, *format, *arch, *dtype; int bits, n_files; };
    const Want wants[] = {
        {"hf/llama3_f32_untied", "safetensors", "llama", "f32", 32, 1},
        {"hf/llama3_f32_untied/sub", "safetensors", "llama", "f32", 32, 1},
        {"hf/qwen3_f32_sharded", "safetensors", "qwen3", "f32", 32, 3},
        {"hf/gemma3_mm_f32", "safetensors", "gemma3", "f32", 32, 1},
        {"hf/llama_mlx_mixed", "safetensors", "llama", "mlx4+", 4, 1},
        {"gguf/stories260K.gguf", "gguf", "llama", "f32", 32, 1},
        {"gguf/qwen2_f32_tied.gguf", "gguf", "qwen2", "f32", 32, 1},
        {"gguf/model_q4_0.gguf", "gguf", "llama", "q4_0", 4, 1},
        {"nested/a/b/c/deep.gguf", "gguf", "qwen2", "f32", 32, 1},
        /* Qwen 3.5 (each model_type, and llama.cpp's arch names) and Mistral: the architecture as the
         * config or the GGUF names it (llama.cpp writes Mistral as llama) */
        {"hf/qwen3_5_text_f32", "safetensors", "qwen3_5_text", "f32", 32, 1},
        {"hf/qwen3_5_moe_f32", "safetensors", "qwen3_5_moe_text", "f32", 32, 1},
        {"hf/qwen3_5_mm_bf16", "safetensors", "qwen3_5", "bf16", 16, 1},
        {"hf/qwen3_5_moe_mm", "safetensors", "qwen3_5_moe", "f32", 32, 1},
        {"hf/mistral_window_f32", "safetensors", "mistral", "f32", 32, 1},
        {"gguf/qwen3_5_text_q4_0.gguf", "gguf", "qwen35", "q4_0", 4, 1},
        {"gguf/qwen3_5_moe_q8_0.gguf", "gguf", "qwen35moe", "q8_0+", 8, 1},
        {"gguf/mistral_v03_bf16.gguf", "gguf", "llama", "f32", 32, 1},
    };
    for (const Want &w : wants) {
        SCOPED_TRACE(w.rel);
        const Found *f = find(r, w.rel);
        if (!f) continue;
        std::string path = root + "/" + w.rel;
        EXPECT_EQ(f->format, w.format);
        EXPECT_EQ(f->arch, w.arch);
        EXPECT_EQ(f->dtype, w.dtype);
        EXPECT_EQ(f->bits, w.bits);
        EXPECT_EQ(f->n_files, w.n_files);
        EXPECT_EQ(f->bytes, bytes[path]);
        EXPECT_TRUE(f->loadable);
        EXPECT_EQ(f->status, FORGE_OK);
        EXPECT_EQ(f->reason, "");
        if (params.count(path)) { EXPECT_EQ(f->n_params, params[path]); /* MLX codes are packed: see below */ }
        /* the weights (not the headers, the vocabulary or a vision tower), padding and RoPE tables */
        EXPECT_GT(f->device_bytes, f->bytes / 2);
        EXPECT_LT(f->device_bytes, f->bytes + 65536);
    }
    /* MLX: 32 / bits parameters per stored u32; the loader's count is unpacked */
    const Found *mlx = find(r, "hf/llama_mlx_mixed");
    if (mlx) { EXPECT_GT(mlx->n_params, st_elements(root + "/hf/llama_mlx_mixed/model.safetensors")); }
}

TEST_F(Discover, BrokenModelsSayWhy) {
    Search r = run();
    struct Want { const char *rel, *arch; forge_status st; const char *reason; };
    const Want wants[] = {
        {"broken/bad_json", "", FORGE_ERR_FORMAT, "config.json: not a JSON object"},
        {"broken/mamba", "mamba", FORGE_ERR_UNSUPPORTED, "model_type 'mamba' is not supported"},
        {"broken/truncated", "llama", FORGE_ERR_FORMAT, "runs past the end of the file"},
        {"broken/missing_tensor", "llama", FORGE_ERR_MODEL, "tensor 'model.layers.1.mlp.up_proj.weight' is missing"},
        {"broken/qwen3_5_no_a_log", "qwen3_5_text", FORGE_ERR_MODEL, "tensor 'model.layers.1.linear_attn.A_log' is missing"},
        {"broken/bad_magic.gguf", "", FORGE_ERR_FORMAT, "not a GGUF file (bad magic)"},
        {"broken/truncated.gguf", "", FORGE_ERR_FORMAT, "truncated.gguf: "},
    };
    for (const Want &w : wants) {
        SCOPED_TRACE(w.rel);
        const Found *f = find(r, w.rel);
        if (!f) continue;
        EXPECT_FALSE(f->loadable);
        EXPECT_EQ(f->status, w.st);
        EXPECT_NE(f->reason.find(w.reason), std::string::npos) << f->reason;
        EXPECT_EQ(f->arch, w.arch);
        EXPECT_EQ(f->device_bytes, 0u);
    }
    /* the sizes are still told when the config is what fails */
    const Found *m = find(r, "broken/mamba");
    if (m) {
        EXPECT_EQ(m->n_params, params[root + "/hf/llama3_f32_untied"]);
        EXPECT_EQ(m->bytes, bytes[root + "/hf/llama3_f32_untied"]);
        EXPECT_EQ(m->n_files, 1);
    }
    const Found *t = find(r, "broken/truncated");
    if (t) { EXPECT_EQ(t->bytes, 200u); }
    const Found *tg = find(r, "broken/truncated.gguf");
    if (tg) {
        EXPECT_EQ(tg->bytes, 1000u);
        EXPECT_EQ(tg->n_files, 1);
        EXPECT_NE(tg->reason.find("truncated while reading tensor"), std::string::npos) << tg->reason;
    }
}

TEST_F(Discover, QuickSkipsTheTensorsAndThePlan) {
    Search r = run(8, 0, 1);
    std::vector<std::string> want(std::begin(kAll), std::end(kAll));
    EXPECT_EQ(rel_paths(r, root), want);
    for (const Found &f : r.models) EXPECT_EQ(f.device_bytes, 0u) << f.path;
    const Found *m = find(r, "broken/missing_tensor");
    if (m) { EXPECT_TRUE(m->loadable) << "quick does not look for tensors"; }
    const Found *s = find(r, "gguf/stories260K.gguf");
    if (s) {
        EXPECT_TRUE(s->loadable);
        EXPECT_EQ(s->n_params, params[root + "/gguf/stories260K.gguf"]);
        EXPECT_EQ(s->dtype, "f32");
    }
    const Found *x = find(r, "hf/llama_mlx_mixed");
    if (x) {
        EXPECT_EQ(x->dtype, "mlx4+"); /* the config's default bits; the plan reads each weight's */
        EXPECT_GT(x->n_params, st_elements(root + "/hf/llama_mlx_mixed/model.safetensors"));
    }
    /* Qwen 3.5 and Mistral from their headers: supported, and the same parameters (the vision
     * tower and multi-token prediction left out) */
    for (const char *rel : {"hf/qwen3_5_text_f32", "hf/qwen3_5_moe_f32", "hf/qwen3_5_mm_bf16", "hf/qwen3_5_moe_mm", "hf/mistral_window_f32",
                            "gguf/qwen3_5_text_q4_0.gguf", "gguf/qwen3_5_moe_q8_0.gguf", "gguf/mistral_v03_bf16.gguf"}) {
        const Found *f = find(r, rel);
        if (!f) continue;
        EXPECT_TRUE(f->loadable) << rel << ": " << f->reason;
        EXPECT_EQ(f->n_params, params[root + "/" + rel]) << rel;
    }
}

TEST_F(Discover, DepthLimitsTheSearch) {
    auto has = [&](const Search &r, const std::string &rel) {
        for (const Found &f : r.models)
            if (f.path == root + "/" + rel) return true;
        return false;
    };
    EXPECT_TRUE(has(run(4), "nested/a/b/c/deep.gguf"));
    EXPECT_FALSE(has(run(3), "nested/a/b/c/deep.gguf"));
    Search one = run(1), two = run(2);
    EXPECT_TRUE(has(one, "gguf/stories260K.gguf"));
    EXPECT_FALSE(has(one, "hf/llama3_f32_untied"));
    EXPECT_TRUE(has(two, "hf/llama3_f32_untied"));
    EXPECT_FALSE(has(two, "hf/llama3_f32_untied/sub"));
    EXPECT_TRUE(run(0).models.empty());
}

TEST_F(Discover, SymlinkLoopsEnd) {
    Search r = run(8, 1);
    std::vector<std::string> want(std::begin(kAll), std::end(kAll));
    EXPECT_EQ(rel_paths(r, root), want) << "each directory once, loop or not";
    bool logged = false;
    for (const std::string &l : r.log) logged |= l.find("already searched") != std::string::npos;
    EXPECT_TRUE(logged);
}

TEST_F(Discover, ReadsLongGgufHeadersInPieces) {
    Search whole = run();
    uint64_t old = ft_discover_gguf_head_bytes(64); /* every GGUF header needs several reads */
    Search pieces = run();
    ft_discover_gguf_head_bytes(old);
    ASSERT_EQ(whole.models.size(), pieces.models.size());
    for (size_t i = 0; i < whole.models.size(); i++) {
        const Found &a = whole.models[i], &b = pieces.models[i];
        EXPECT_EQ(a.path, b.path);
        EXPECT_EQ(a.n_params, b.n_params) << a.path;
        EXPECT_EQ(a.device_bytes, b.device_bytes) << a.path;
        EXPECT_EQ(a.status, b.status) << a.path;
        EXPECT_EQ(a.reason, b.reason) << a.path;
    }
}

TEST_F(Discover, CallbackStopsTheSearch) {
    Search r = run(8, 0, 1, 2);
    EXPECT_EQ(r.models.size(), 2u);
}

TEST_F(Discover, PlanMatchesTheLoader) {
    /* stories260K loaded on the default device: the same parameters and (the device's limits
     * being at least the nominal ones on lavapipe and GPUs) the same planned bytes */
    Search r = run();
    const Found *s = find(r, "gguf/stories260K.gguf");
    ASSERT_NE(s, nullptr);
    forge_model *m = nullptr;
    forge_model_params mp = forge_model_default_params();
    mp.load_tokenizer = 0;
    if (forge_model_load(s->path.c_str(), &mp, &m) != FORGE_OK) {
        std::string msg = forge_model_errmsg(m);
        forge_model_free(m);
        GTEST_SKIP() << "no device: " << msg;
    }
    forge_model_info info = ft::sized<forge_model_info>();
    ASSERT_EQ(forge_model_get_info(m, &info), FORGE_OK);
    EXPECT_EQ(s->n_params, info.n_params);
    EXPECT_EQ(s->dtype, info.weight_dtype);
    EXPECT_EQ(s->device_bytes, ft::model_memory(m).device_planned_bytes);
    forge_model_free(m);
}

TEST(DiscoverArgs, BadArgumentsAreClearErrors) {
    char err[512];
    auto fn = [](void *, const forge_discovered_model *) { return 0; };
    EXPECT_EQ(forge_discover("/no/such/dir", nullptr, fn, nullptr, err, sizeof err), FORGE_ERR_IO);
    EXPECT_NE(std::string(err).find("/no/such/dir"), std::string::npos) << err;
    std::string file = ft::src("models/stories260K/stories260K.gguf");
    EXPECT_EQ(forge_discover(file.c_str(), nullptr, fn, nullptr, err, sizeof err), FORGE_ERR_IO);
    EXPECT_NE(std::string(err).find("not a directory"), std::string::npos) << err;
    EXPECT_EQ(forge_discover(nullptr, nullptr, fn, nullptr, err, sizeof err), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(forge_discover(".", nullptr, nullptr, nullptr, nullptr, 0), FORGE_ERR_INVALID_ARGUMENT);
    forge_discover_params p = forge_discover_default_params();
    p.max_depth = -1;
    EXPECT_EQ(forge_discover(".", &p, fn, nullptr, err, sizeof err), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(err).find("max_depth"), std::string::npos) << err;
    /* an older caller's smaller struct gets the defaults for the rest */
    forge_discover_params old = forge_discover_default_params();
    old.struct_size = offsetof(forge_discover_params, quick);
    old.max_depth = 0;
    int n = 0;
    EXPECT_EQ(forge_discover(ft::src("models/stories260K").c_str(), &old,
                             [](void *u, const forge_discovered_model *d) { (*(int *)u)++; return d->device_bytes ? 0 : 1; }, &n,
                             err, sizeof err),
              FORGE_OK) << err;
    EXPECT_EQ(n, 1);
}

TEST(DiscoverArgs, UnreadableDirectoriesAreSkipped) {
    if (geteuid() == 0) GTEST_SKIP() << "root reads every directory";
    std::string d = ft::tmpdir("discover_perm");
    mkdirs(d + "/locked");
    copy(ft::src("models/stories260K/stories260K.gguf"), d + "/locked/x.gguf");
    copy(ft::src("models/stories260K/stories260K.gguf"), d + "/y.gguf");
    chmod((d + "/locked").c_str(), 0);
    Search r;
    forge_discover_params p = forge_discover_default_params();
    p.log = log_line;
    p.log_user_data = &r;
    char err[512];
    EXPECT_EQ(forge_discover(d.c_str(), &p, collect, &r, err, sizeof err), FORGE_OK) << err;
    chmod((d + "/locked").c_str(), 0755);
    ASSERT_EQ(r.models.size(), 1u);
    EXPECT_EQ(r.models[0].path, d + "/y.gguf");
    ASSERT_FALSE(r.log.empty());
    EXPECT_NE(r.log[0].find("locked"), std::string::npos) << r.log[0];
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}

TEST_F(Discover, CliPrintsTheSameAsTheApi) {
    if (!ft::exists("./forge")) GTEST_SKIP() << "no ./forge binary in the working directory (the build tree)";
    Search r = run();
    std::string out = root + "/../discover_out.json";
    ASSERT_EQ(system(("./forge discover " + root + " --json > " + out).c_str()), 0);
    std::vector<uint8_t> text = ft::read_file(out);
    remove(out.c_str());
    cJSON *arr = cJSON_ParseWithLength((const char *)text.data(), text.size());
    ASSERT_TRUE(cJSON_IsArray(arr)) << std::string(text.begin(), text.end());
    ASSERT_EQ((size_t)cJSON_GetArraySize(arr), r.models.size());
    int i = 0;
    cJSON *o;
    auto str = [](cJSON *obj, const char *key) { /* a missing or non-string field fails, not crashes */
        const char *v = cJSON_GetStringValue(cJSON_GetObjectItem(obj, key));
        return v ? std::string(v) : std::string("(no string '") + key + "')";
    };
    cJSON_ArrayForEach(o, arr) {
        const Found &f = r.models[i++];
        SCOPED_TRACE(f.path);
        EXPECT_EQ(str(o, "path"), f.path);
        EXPECT_EQ(str(o, "format"), f.format);
        EXPECT_EQ(str(o, "architecture"), f.arch);
        EXPECT_EQ(str(o, "weight_dtype"), f.dtype);
        EXPECT_EQ(cJSON_GetObjectItem(o, "quant_bits")->valuedouble, f.bits);
        EXPECT_EQ(cJSON_GetObjectItem(o, "n_params")->valuedouble, (double)f.n_params);
        EXPECT_EQ(cJSON_GetObjectItem(o, "n_files")->valuedouble, f.n_files);
        EXPECT_EQ(cJSON_GetObjectItem(o, "bytes")->valuedouble, (double)f.bytes);
        EXPECT_EQ(cJSON_GetObjectItem(o, "device_bytes")->valuedouble, (double)f.device_bytes);
        EXPECT_EQ(cJSON_IsTrue(cJSON_GetObjectItem(o, "loadable")), f.loadable != 0);
        EXPECT_EQ(str(o, "status"), forge_status_name(f.status));
        EXPECT_EQ(str(o, "reason"), f.reason);
    }
    cJSON_Delete(arr);
    /* the table: a header and one line per model, the reason after "no: " */
    ASSERT_EQ(system(("./forge discover " + root + " --depth 1 > " + out).c_str()), 0);
    std::vector<uint8_t> table = ft::read_file(out);
    remove(out.c_str());
    std::string t(table.begin(), table.end());
    EXPECT_EQ(t.rfind("PATH ", 0), 0u) << t;
    EXPECT_NE(t.find("no: " + root + "/broken/bad_magic.gguf: not a GGUF file (bad magic)"), std::string::npos) << t;
    EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 1 + 8) << t; /* broken/{bad_magic,truncated}.gguf and the six in gguf/ */
    EXPECT_EQ(WEXITSTATUS(system("./forge discover /no/such/dir 2> /dev/null")), 1);
    EXPECT_EQ(WEXITSTATUS(system("./forge discover 2> /dev/null")), 2);
    EXPECT_EQ(WEXITSTATUS(system("./forge discover . --depth -1 2> /dev/null")), 2);
}
