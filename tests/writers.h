/* writers.h: tiny safetensors / GGUF / config writers, so tests can build valid models and
 * break them one field at a time. */
#ifndef FORGE_TESTS_WRITERS_H
#define FORGE_TESTS_WRITERS_H
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "util.h"

namespace ft {

struct Tensor {
    std::string dtype;           /* safetensors dtype name */
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
};

inline Tensor f32_tensor(std::vector<int64_t> shape, float scale, uint32_t seed) {
    size_t n = 1;
    for (auto d : shape) n *= (size_t)d;
    std::vector<float> v = randn(n, scale, seed);
    Tensor t{"F32", shape, std::vector<uint8_t>(n * 4)};
    memcpy(t.data.data(), v.data(), n * 4);
    return t;
}

/* Writes a safetensors file; `header_override` replaces the JSON header when not empty. */
inline std::vector<uint8_t> safetensors_bytes(const std::map<std::string, Tensor> &ts, const std::string &header_override = "") {
    std::string h = "{\"__metadata__\":{\"format\":\"pt\"}";
    std::vector<uint8_t> data;
    for (const auto &kv : ts) {
        h += ",\"" + kv.first + "\":{\"dtype\":\"" + kv.second.dtype + "\",\"shape\":[";
        for (size_t i = 0; i < kv.second.shape.size(); i++) h += (i ? "," : "") + std::to_string(kv.second.shape[i]);
        h += "],\"data_offsets\":[" + std::to_string(data.size()) + "," + std::to_string(data.size() + kv.second.data.size()) + "]}";
        data.insert(data.end(), kv.second.data.begin(), kv.second.data.end());
    }
    h += "}";
    if (!header_override.empty()) h = header_override;
    std::vector<uint8_t> out;
    out.reserve(8 + h.size() + data.size());
    for (int i = 0; i < 8; i++) out.push_back((uint8_t)((uint64_t)h.size() >> (8 * i))); /* little-endian length */
    out.insert(out.end(), h.begin(), h.end());
    out.insert(out.end(), data.begin(), data.end());
    return out;
}

/* A small Llama-family model: hidden 16, 2 heads of 8, 1 kv head, ffn 32, vocab 40, 1 layer. */
struct TinyModel {
    std::map<std::string, Tensor> tensors;
    std::string config;
    TinyModel() {
        const int H = 16, D = 8, NH = 2, NKV = 1, F = 32, V = 40;
        uint32_t seed = 100;
        tensors["model.embed_tokens.weight"] = f32_tensor({V, H}, 0.5f, seed++);
        tensors["model.norm.weight"] = f32_tensor({H}, 0.1f, seed++);
        tensors["lm_head.weight"] = f32_tensor({V, H}, 0.3f, seed++);
        std::string p = "model.layers.0.";
        tensors[p + "input_layernorm.weight"] = f32_tensor({H}, 0.1f, seed++);
        tensors[p + "post_attention_layernorm.weight"] = f32_tensor({H}, 0.1f, seed++);
        tensors[p + "self_attn.q_proj.weight"] = f32_tensor({NH * D, H}, 0.3f, seed++);
        tensors[p + "self_attn.k_proj.weight"] = f32_tensor({NKV * D, H}, 0.3f, seed++);
        tensors[p + "self_attn.v_proj.weight"] = f32_tensor({NKV * D, H}, 0.3f, seed++);
        tensors[p + "self_attn.o_proj.weight"] = f32_tensor({H, NH * D}, 0.3f, seed++);
        tensors[p + "mlp.gate_proj.weight"] = f32_tensor({F, H}, 0.3f, seed++);
        tensors[p + "mlp.up_proj.weight"] = f32_tensor({F, H}, 0.3f, seed++);
        tensors[p + "mlp.down_proj.weight"] = f32_tensor({H, F}, 0.3f, seed++);
        config = "{\"model_type\":\"llama\",\"hidden_size\":16,\"num_hidden_layers\":1,\"num_attention_heads\":2,"
                 "\"num_key_value_heads\":1,\"intermediate_size\":32,\"vocab_size\":40,\"max_position_embeddings\":64,"
                 "\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"tie_word_embeddings\":false,\"torch_dtype\":\"float32\"}";
    }
    /* Writes config.json + model.safetensors into a fresh directory; returns it. */
    std::string write(const std::string &name) const {
        std::string d = tmpdir(name);
        write_file(d + "/config.json", config.data(), config.size());
        std::vector<uint8_t> st = safetensors_bytes(tensors);
        write_file(d + "/model.safetensors", st.data(), st.size());
        return d;
    }
};

/* GGUF writer (v3). */
struct Gguf {
    std::vector<uint8_t> kv;
    uint64_t n_kv = 0;
    struct T { std::string name; std::vector<uint64_t> ne; uint32_t type; std::vector<uint8_t> data; };
    std::vector<T> tensors;
    uint32_t alignment = 32;

    static void put(std::vector<uint8_t> &b, const void *p, size_t n) { b.insert(b.end(), (const uint8_t *)p, (const uint8_t *)p + n); }
    static void put_str(std::vector<uint8_t> &b, const std::string &s) {
        uint64_t n = s.size();
        put(b, &n, 8);
        put(b, s.data(), s.size());
    }
    void key(const std::string &k, uint32_t type) { put_str(kv, k); put(kv, &type, 4); n_kv++; }
    void u32(const std::string &k, uint32_t v) { key(k, 4); put(kv, &v, 4); }
    void f32(const std::string &k, float v) { key(k, 6); put(kv, &v, 4); }
    void str(const std::string &k, const std::string &v) { key(k, 8); put_str(kv, v); }
    void boolean(const std::string &k, bool v) { key(k, 7); uint8_t b = v; put(kv, &b, 1); }
    void i32s(const std::string &k, const std::vector<int32_t> &v) {
        key(k, 9);
        uint32_t et = 5;
        uint64_t n = v.size();
        put(kv, &et, 4);
        put(kv, &n, 8);
        put(kv, v.data(), 4 * v.size());
    }
    void strs(const std::string &k, const std::vector<std::string> &v) {
        key(k, 9);
        uint32_t et = 8;
        uint64_t n = v.size();
        put(kv, &et, 4);
        put(kv, &n, 8);
        for (auto &s : v) put_str(kv, s);
    }
    void tensor(const std::string &name, std::vector<uint64_t> ne, uint32_t type, std::vector<uint8_t> data) {
        tensors.push_back({name, ne, type, data});
    }
    std::vector<uint8_t> bytes() const {
        std::vector<uint8_t> b;
        put(b, "GGUF", 4);
        uint32_t ver = 3;
        uint64_t nt = tensors.size();
        put(b, &ver, 4);
        put(b, &nt, 8);
        put(b, &n_kv, 8);
        put(b, kv.data(), kv.size());
        uint64_t off = 0;
        std::vector<uint64_t> offs;
        for (auto &t : tensors) {
            put_str(b, t.name);
            uint32_t nd = (uint32_t)t.ne.size();
            put(b, &nd, 4);
            put(b, t.ne.data(), 8 * t.ne.size());
            put(b, &t.type, 4);
            put(b, &off, 8);
            offs.push_back(off);
            off += (t.data.size() + alignment - 1) / alignment * alignment;
        }
        while (b.size() % alignment) b.push_back(0);
        for (auto &t : tensors) {
            put(b, t.data.data(), t.data.size());
            while (b.size() % alignment) b.push_back(0);
        }
        return b;
    }
};

} // namespace ft
#endif
