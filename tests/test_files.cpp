/* Bad input: every malformed file, config or call gets a status and a message naming what is
 * wrong, never a crash. Valid inputs built by tests/writers.h, then broken one field at a time. */
#include "internal.h"
#include "writers.h"

#include <unistd.h>

using ft::Tensor;


/* ---- safetensors ---- */

static forge_status parse_st(const std::vector<uint8_t> &bytes, std::string &msg, int *n = nullptr) {
    std::string d = ft::tmpdir("st");
    ft::write_file(d + "/x.safetensors", bytes.data(), bytes.size());
    char err[1024] = {0};
    int count = 0;
    forge_status st = ft_safetensors_file((d + "/x.safetensors").c_str(), err, sizeof err, &count);
    msg = err;
    if (n) *n = count;
    return st;
}

TEST(Safetensors, ValidFileParses) {
    std::map<std::string, Tensor> ts = {{"a", ft::f32_tensor({3, 4}, 1, 1)}, {"b", ft::f32_tensor({5}, 1, 2)}};
    std::string msg;
    int n = 0;
    EXPECT_EQ(parse_st(ft::safetensors_bytes(ts), msg, &n), FORGE_OK) << msg;
    EXPECT_EQ(n, 2);
}

TEST(Safetensors, MalformedHeadersAreNamed) {
    std::map<std::string, Tensor> ts = {{"w", ft::f32_tensor({2, 2}, 1, 1)}};
    std::string msg;
    struct Case { std::string header; const char *expect; };
    std::vector<Case> cases = {
        {"not json", "not a JSON object"},
        {"[1,2]", "not a JSON object"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2]}}", "lacks"},
        {"{\"w\":{\"dtype\":\"Q9\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", "unknown dtype 'Q9'"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,4000]}}", "run past the end of the data"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,16]}}", "need 24"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,16]}}", "overflowing shape"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[-2,2],\"data_offsets\":[0,16]}}", "invalid or overflowing shape"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[16,0]}}", "invalid data_offsets"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", "5 dimensions"},
        {"{\"w\":5}", "not an object"},
    };
    for (auto &c : cases) {
        forge_status st = parse_st(ft::safetensors_bytes(ts, c.header), msg);
        EXPECT_NE(st, FORGE_OK) << c.header;
        EXPECT_NE(msg.find(c.expect), std::string::npos) << c.header << " -> " << msg;
        EXPECT_NE(msg.find("x.safetensors"), std::string::npos) << "the message names the file: " << msg;
    }
}

TEST(Safetensors, TruncatedAndShortFiles) {
    std::map<std::string, Tensor> ts = {{"w", ft::f32_tensor({8, 8}, 1, 1)}};
    std::vector<uint8_t> b = ft::safetensors_bytes(ts);
    std::string msg;
    for (size_t cut : {0, 3, 7, 8, 20, (int)b.size() - 1}) {
        std::vector<uint8_t> t(b.begin(), b.begin() + cut);
        EXPECT_EQ(parse_st(t, msg), FORGE_ERR_FORMAT) << "cut at " << cut;
        EXPECT_FALSE(msg.empty());
    }
    std::vector<uint8_t> huge = b;
    uint64_t len = 1ull << 40;
    memcpy(huge.data(), &len, 8);
    EXPECT_EQ(parse_st(huge, msg), FORGE_ERR_FORMAT);
    EXPECT_NE(msg.find("runs past the end of the file"), std::string::npos) << msg;
}

/* ---- GGUF ---- */

static ft::Gguf tiny_gguf() {
    ft::Gguf g;
    g.str("general.architecture", "llama");
    g.u32("llama.embedding_length", 8);
    g.strs("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
    std::vector<uint8_t> d(4 * 8 * 4);
    g.tensor("token_embd.weight", {8, 4}, 0, d);
    return g;
}

static forge_status parse_gguf(const std::vector<uint8_t> &bytes, std::string &msg, int *nt = nullptr) {
    std::string d = ft::tmpdir("gguf");
    ft::write_file(d + "/x.gguf", bytes.data(), bytes.size());
    char err[1024] = {0};
    int n = 0, nkv = 0;
    forge_status st = ft_gguf_file((d + "/x.gguf").c_str(), err, sizeof err, &n, &nkv);
    msg = err;
    if (nt) *nt = n;
    return st;
}

TEST(Gguf, ValidFileParses) {
    std::string msg;
    int n = 0;
    EXPECT_EQ(parse_gguf(tiny_gguf().bytes(), msg, &n), FORGE_OK) << msg;
    EXPECT_EQ(n, 1);
}

TEST(Gguf, EveryTruncationIsAnError) {
    std::vector<uint8_t> b = tiny_gguf().bytes();
    std::string msg;
    for (size_t cut = 0; cut < b.size(); cut++) {
        std::vector<uint8_t> t(b.begin(), b.begin() + cut);
        forge_status st = parse_gguf(t, msg);
        ASSERT_EQ(st, FORGE_ERR_FORMAT) << "cut at " << cut << ": " << msg;
        ASSERT_NE(msg.find("x.gguf"), std::string::npos) << msg;
    }
}

TEST(Gguf, MalformedFieldsAreNamed) {
    std::string msg;
    std::vector<uint8_t> b = tiny_gguf().bytes();
    { auto t = b; t[0] = 'X'; EXPECT_EQ(parse_gguf(t, msg), FORGE_ERR_FORMAT); EXPECT_NE(msg.find("bad magic"), std::string::npos) << msg; }
    { auto t = b; t[4] = 1; EXPECT_EQ(parse_gguf(t, msg), FORGE_ERR_UNSUPPORTED); EXPECT_NE(msg.find("version 1"), std::string::npos) << msg; }
    { auto t = b; uint64_t n = 1ull << 60; memcpy(&t[16], &n, 8); EXPECT_EQ(parse_gguf(t, msg), FORGE_ERR_FORMAT); EXPECT_NE(msg.find("cannot fit"), std::string::npos) << msg; }
    { /* the first key's length runs past the end */
        auto t = b; uint64_t n = 1ull << 40; memcpy(&t[24], &n, 8);
        EXPECT_EQ(parse_gguf(t, msg), FORGE_ERR_FORMAT);
        EXPECT_NE(msg.find("runs past the end"), std::string::npos) << msg;
    }
    { ft::Gguf g = tiny_gguf(); g.tensors[0].type = 77; EXPECT_EQ(parse_gguf(g.bytes(), msg), FORGE_ERR_UNSUPPORTED); EXPECT_NE(msg.find("unknown GGUF type 77"), std::string::npos) << msg; }
    { ft::Gguf g = tiny_gguf(); g.tensors[0].ne = {8, 400}; EXPECT_EQ(parse_gguf(g.bytes(), msg), FORGE_ERR_FORMAT); EXPECT_NE(msg.find("runs past the end of the data"), std::string::npos) << msg; }
    { ft::Gguf g = tiny_gguf(); g.tensors[0].ne = {1ull << 40, 1ull << 40}; EXPECT_EQ(parse_gguf(g.bytes(), msg), FORGE_ERR_FORMAT); }
    { ft::Gguf g = tiny_gguf(); g.tensors[0].ne = {33, 1}; g.tensors[0].type = 2; /* q4_0 rows must be whole blocks */
      EXPECT_EQ(parse_gguf(g.bytes(), msg), FORGE_ERR_FORMAT); EXPECT_NE(msg.find("blocks of 32"), std::string::npos) << msg; }
    { ft::Gguf g = tiny_gguf(); g.u32("general.alignment", 3); EXPECT_EQ(parse_gguf(g.bytes(), msg), FORGE_ERR_FORMAT); EXPECT_NE(msg.find("power of two"), std::string::npos) << msg; }
    { ft::Gguf g = tiny_gguf(); g.u32("llama.embedding_length", 9); EXPECT_EQ(parse_gguf(g.bytes(), msg), FORGE_ERR_FORMAT); EXPECT_NE(msg.find("'llama.embedding_length' appears twice"), std::string::npos) << msg; }
    { ft::Gguf g = tiny_gguf(); g.key("bad.type", 99); EXPECT_EQ(parse_gguf(g.bytes(), msg), FORGE_ERR_FORMAT); EXPECT_NE(msg.find("unknown value type 99"), std::string::npos) << msg; }
}

/* Issue 42: a file's strings go into messages escaped: a corrupted key's bytes read as \xNN (they
 * were written raw: "to\x94eniz\x9ar.ggml.tokens" on the terminal), a backslash doubled,
 * well-formed UTF-8 kept, a long name cut with "..." */
TEST(Gguf, FileStringsInMessagesAreEscaped) {
    std::string msg;
    { ft::Gguf g = tiny_gguf(); g.key("to\x94" "eniz\x9a" "r.ggml.tokens", 99);
      EXPECT_EQ(parse_gguf(g.bytes(), msg), FORGE_ERR_FORMAT);
      EXPECT_NE(msg.find("key 'to\\x94eniz\\x9ar.ggml.tokens' has unknown value type 99"), std::string::npos) << msg; }
    { ft::Gguf g = tiny_gguf(); g.key(std::string("a\tb\x01" "c\\d\x7f\0e", 10), 99);
      EXPECT_EQ(parse_gguf(g.bytes(), msg), FORGE_ERR_FORMAT);
      EXPECT_NE(msg.find("key 'a\\x09b\\x01c\\\\d\\x7f' has"), std::string::npos) << msg; } /* the key ends at its NUL */
    { ft::Gguf g = tiny_gguf(); g.key("caf\xc3\xa9 \xe2\x82\xac \xc2\x85 \xed\xa0\x80 \xc3", 99); /* é, €, a C1 control, a surrogate, a cut character */
      EXPECT_EQ(parse_gguf(g.bytes(), msg), FORGE_ERR_FORMAT);
      EXPECT_NE(msg.find("key 'caf\xc3\xa9 \xe2\x82\xac \\xc2\\x85 \\xed\\xa0\\x80 \\xc3' has"), std::string::npos) << msg; }
    { ft::Gguf g = tiny_gguf(); g.tensors[0].name = "bad\x1b[31mname"; g.tensors[0].type = 77;
      EXPECT_EQ(parse_gguf(g.bytes(), msg), FORGE_ERR_UNSUPPORTED);
      EXPECT_NE(msg.find("tensor 'bad\\x1b[31mname' has unknown GGUF type 77"), std::string::npos) << msg; }
    { ft::Gguf g = tiny_gguf(); g.key(std::string(1000, '\xff'), 99);
      EXPECT_EQ(parse_gguf(g.bytes(), msg), FORGE_ERR_FORMAT);
      size_t at = msg.find("key '\\xff\\xff"), end = msg.find("...' has unknown value type 99");
      EXPECT_TRUE(at != std::string::npos && end != std::string::npos && end - at < 300) << msg; }
    for (unsigned char c : msg) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << msg; /* nothing raw reaches the message */
    /* safetensors: a key and a dtype */
    std::map<std::string, Tensor> ts = {{"w", ft::f32_tensor({1}, 1, 1)}};
    EXPECT_EQ(parse_st(ft::safetensors_bytes(ts, "{\"w\\u0001\":{\"dtype\":\"F\\u001b32\",\"shape\":[1],\"data_offsets\":[0,4]}}"), msg),
              FORGE_ERR_FORMAT);
    EXPECT_NE(msg.find("tensor 'w\\x01' has unknown dtype 'F\\x1b32'"), std::string::npos) << msg;
}

/* ---- config.json ---- */

TEST(Config, ErrorsNameTheField) {
    struct Case { std::string json; forge_status st; const char *expect; };
    std::string base = "\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":100";
    std::vector<Case> cases = {
        {"{" + base + "}", FORGE_ERR_FORMAT, "'model_type' is missing"},
        {"{\"model_type\":\"gpt_bigcode\"," + base + "}", FORGE_ERR_UNSUPPORTED, "model_type 'gpt_bigcode' is not supported"},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":100}", FORGE_ERR_FORMAT, "'hidden_size' is missing"},
        {"{\"model_type\":\"llama\"," + base + ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}", FORGE_ERR_UNSUPPORTED, "rope type 'yarn'"},
        {"{\"model_type\":\"llama\"," + base + ",\"head_dim\":15}", FORGE_ERR_FORMAT, "head_dim 15 must be even"},
        {"{\"model_type\":\"llama\"," + base + ",\"num_key_value_heads\":3}", FORGE_ERR_FORMAT, "multiple of the kv heads"},
        {"{\"model_type\":\"llama\"," + base + ",\"torch_dtype\":\"float8\"}", FORGE_ERR_UNSUPPORTED, "dtype 'float8'"},
        {"{\"model_type\":\"llama\"," + base + ",\"head_dim\":1024}", FORGE_ERR_UNSUPPORTED, "head_dim 1024"},
        {"{\"model_type\":\"gemma3_text\"," + base + ",\"layer_types\":[\"full_attention\"]}", FORGE_ERR_FORMAT, "layer_types has 1 entries for 2 layers"},
        {"{\"model_type\":\"llama\"," + base + ",\"hidden_act\":\"relu\"}", FORGE_ERR_UNSUPPORTED, "hidden_act 'relu'"},
        {"{\"model_type\":\"llama\"," + base + ",\"quantization_config\":{\"quant_method\":\"gptq\"}}", FORGE_ERR_UNSUPPORTED, "'gptq'"},
        {"[]", FORGE_ERR_FORMAT, "not a JSON object"},
        /* mixture of experts and Gemma 4 */
        {"{\"model_type\":\"qwen3_moe\"," + base + "}", FORGE_ERR_FORMAT, "qwen3_moe needs num_experts > 0"},
        {"{\"model_type\":\"qwen3_moe\"," + base + ",\"num_experts\":8,\"num_experts_per_tok\":9,\"moe_intermediate_size\":32}", FORGE_ERR_FORMAT,
         "9 experts used of 8"},
        {"{\"model_type\":\"qwen3_moe\"," + base + ",\"num_experts\":64,\"num_experts_per_tok\":40,\"moe_intermediate_size\":32}",
         FORGE_ERR_UNSUPPORTED, "40 experts used of 64 (forge supports 1 to 32)"},
        {"{\"model_type\":\"qwen3_moe\"," + base + ",\"num_experts\":8,\"num_experts_per_tok\":2,\"moe_intermediate_size\":32,\"mlp_only_layers\":[5]}",
         FORGE_ERR_FORMAT, "mlp_only_layers holds a number out of range"},
        {"{\"model_type\":\"gemma4_text\"," + base + ",\"head_dim\":16,\"global_head_dim\":1024,\"sliding_window\":8}", FORGE_ERR_UNSUPPORTED,
         "layer 1's head_dim 1024"}, /* (the last layer is full) */
        {"{\"model_type\":\"gemma4_text\"," + base + ",\"head_dim\":16,\"global_head_dim\":32,\"num_kv_shared_layers\":2}", FORGE_ERR_FORMAT,
         "num_kv_shared_layers 2 must be in [0, 2)"},
        {"{\"model_type\":\"gemma4_text\"," + base + ",\"head_dim\":16,\"global_head_dim\":32,\"per_layer_config\":{\"0\":{\"rope_theta\":5}}}",
         FORGE_ERR_UNSUPPORTED, "overrides 'rope_theta'"},
        {"{\"model_type\":\"gemma4\"," + base + "}", FORGE_ERR_FORMAT, "model_type 'gemma4' needs a 'text_config' object"},
    };
    for (auto &c : cases) {
        char err[1024] = {0};
        int nl, h, hd, tied, sl;
        double scale;
        forge_status st = ft_config_parse(c.json.c_str(), err, sizeof err, &nl, &h, &hd, &tied, &sl, &scale);
        EXPECT_EQ(st, c.st) << c.json << " -> " << err;
        EXPECT_NE(std::string(err).find(c.expect), std::string::npos) << c.json << " -> " << err;
    }
}

TEST(Config, BothKeyStylesAndDerivedFields) {
    char err[1024];
    int nl, h, hd, tied, sl;
    double scale;
    std::string base = "\"hidden_size\":64,\"num_hidden_layers\":6,\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":100";
    ASSERT_EQ(ft_config_parse(("{\"model_type\":\"qwen3\"," + base + ",\"head_dim\":32,\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1000000.0},\"dtype\":\"bfloat16\"}").c_str(),
                              err, sizeof err, &nl, &h, &hd, &tied, &sl, &scale), FORGE_OK) << err;
    EXPECT_EQ(hd, 32);
    EXPECT_EQ(tied, 0);
    EXPECT_NEAR(scale, 1.0 / std::sqrt(32.0), 1e-12);
    /* Gemma 4 with transformers' defaults: full layers of global_head_dim 512, attention scale 1 */
    ASSERT_EQ(ft_config_parse(("{\"model_type\":\"gemma4_text\"," + base + ",\"head_dim\":16,\"sliding_window\":8}").c_str(), err, sizeof err, &nl, &h,
                              &hd, &tied, &sl, &scale),
              FORGE_OK) << err;
    EXPECT_EQ(hd, 16);
    EXPECT_EQ(scale, 1.0);
    EXPECT_EQ(tied, 1);
    /* Gemma 3 without layer_types: the pattern decides (every 6th layer is full). */
    ASSERT_EQ(ft_config_parse(("{\"model_type\":\"gemma3_text\"," + base + ",\"sliding_window\":512,\"query_pre_attn_scalar\":256}").c_str(),
                              err, sizeof err, &nl, &h, &hd, &tied, &sl, &scale), FORGE_OK) << err;
    EXPECT_EQ(sl, 5);
    EXPECT_EQ(tied, 1);
    EXPECT_NEAR(scale, 1.0 / 16.0, 1e-12);
    /* the multimodal wrapper nests the text config */
    ASSERT_EQ(ft_config_parse(("{\"model_type\":\"gemma3\",\"text_config\":{\"model_type\":\"gemma3_text\"," + base + ",\"sliding_window_pattern\":3}}").c_str(),
                              err, sizeof err, &nl, &h, &hd, &tied, &sl, &scale), FORGE_OK) << err;
    EXPECT_EQ(sl, 4);
}

/* ---- whole-model loads ---- */

static forge_status try_load(const std::string &path, std::string &msg) {
    forge_model *m = nullptr;
    forge_status st = forge_model_load(path.c_str(), nullptr, &m);
    msg = forge_model_errmsg(m);
    forge_model_free(m);
    return st;
}

TEST(ModelLoad, TinyModelLoadsAndRuns) {
    ft::TinyModel tm;
    forge_model *m = ft::load(tm.write("tiny_ok"));
    ASSERT_NE(m, nullptr);
    forge_model_info info = ft::sized<forge_model_info>();
    ASSERT_EQ(forge_model_get_info(m, &info), FORGE_OK);
    EXPECT_STREQ(info.architecture, "llama");
    EXPECT_EQ(info.n_vocab, 40);
    EXPECT_EQ(info.head_dim, 8);
    forge_model_free(m);
}

TEST(ModelLoad, MissingTensor) {
    ft::TinyModel tm;
    tm.tensors.erase("model.layers.0.mlp.up_proj.weight");
    std::string msg;
    EXPECT_EQ(try_load(tm.write("tiny_missing"), msg), FORGE_ERR_MODEL);
    EXPECT_NE(msg.find("'model.layers.0.mlp.up_proj.weight' is missing"), std::string::npos) << msg;
}

TEST(ModelLoad, ShapeDisagreesWithConfig) {
    ft::TinyModel tm;
    tm.tensors["model.layers.0.self_attn.k_proj.weight"] = ft::f32_tensor({16, 16}, 0.3f, 5);
    std::string msg;
    EXPECT_EQ(try_load(tm.write("tiny_shape"), msg), FORGE_ERR_MODEL);
    EXPECT_NE(msg.find("'model.layers.0.self_attn.k_proj.weight' has shape [16, 16]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("needs [8, 16]"), std::string::npos) << msg;
}

TEST(ModelLoad, UnsupportedDtype) {
    ft::TinyModel tm;
    tm.tensors["model.layers.0.mlp.gate_proj.weight"].dtype = "I32";
    std::string msg;
    EXPECT_EQ(try_load(tm.write("tiny_dtype"), msg), FORGE_ERR_UNSUPPORTED);
    EXPECT_NE(msg.find("'model.layers.0.mlp.gate_proj.weight' has type i32"), std::string::npos) << msg;
}

TEST(ModelLoad, UnknownArchitectureAndMissingFiles) {
    ft::TinyModel tm;
    std::string msg;
    tm.config = "{\"model_type\":\"mamba\",\"hidden_size\":16}";
    EXPECT_EQ(try_load(tm.write("tiny_arch"), msg), FORGE_ERR_UNSUPPORTED);
    EXPECT_NE(msg.find("model_type 'mamba'"), std::string::npos) << msg;
    std::string d = ft::tmpdir("tiny_noconfig");
    EXPECT_EQ(try_load(d, msg), FORGE_ERR_IO);
    EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
    EXPECT_EQ(try_load("does/not/exist", msg), FORGE_ERR_IO);
    EXPECT_NE(msg.find("does/not/exist"), std::string::npos) << msg;
    ft::Gguf g;
    g.str("general.architecture", "rwkv6");
    ft::write_file(d + "/bad.gguf", g.bytes().data(), g.bytes().size());
    EXPECT_EQ(try_load(d + "/bad.gguf", msg), FORGE_ERR_UNSUPPORTED);
    EXPECT_NE(msg.find("architecture 'rwkv6'"), std::string::npos) << msg;
}

/* A GGUF type forge does not read (here Q5_K) is an error naming the type and the tensor. */
TEST(ModelLoad, UnsupportedGgufTypeIsNamed) {
    ft::Gguf g;
    g.str("general.architecture", "llama");
    g.u32("llama.embedding_length", 256);
    g.u32("llama.block_count", 1);
    g.u32("llama.attention.head_count", 2);
    g.u32("llama.feed_forward_length", 256);
    g.u32("llama.vocab_size", 4);
    g.tensor("token_embd.weight", {256, 4}, 13, std::vector<uint8_t>(176 * 4));
    std::string d = ft::tmpdir("q5k");
    std::vector<uint8_t> b = g.bytes();
    ft::write_file(d + "/q5k.gguf", b.data(), b.size());
    std::string msg;
    EXPECT_EQ(try_load(d + "/q5k.gguf", msg), FORGE_ERR_UNSUPPORTED);
    EXPECT_NE(msg.find("'token_embd.weight' has type q5_k"), std::string::npos) << msg;
}

/* Gemma 4 GGUF metadata that forge cannot follow is an error naming the key. */
TEST(ModelLoad, Gemma4GgufKeysAreChecked) {
    auto base = [](ft::Gguf &g, bool pattern, const std::vector<int32_t> &kv, uint32_t rot, uint32_t shared) {
        g.str("general.architecture", "gemma4");
        g.u32("gemma4.embedding_length", 32);
        g.u32("gemma4.block_count", 2);
        g.u32("gemma4.attention.head_count", 2);
        g.u32("gemma4.attention.key_length", 16);
        g.u32("gemma4.attention.key_length_swa", 8);
        g.u32("gemma4.rope.dimension_count", rot);
        if (kv.size() == 1) g.u32("gemma4.attention.head_count_kv", (uint32_t)kv[0]);
        else g.i32s("gemma4.attention.head_count_kv", kv);
        g.u32("gemma4.feed_forward_length", 64);
        g.u32("gemma4.attention.sliding_window", 8);
        g.u32("gemma4.attention.shared_kv_layers", shared);
        if (pattern) {
            g.key("gemma4.attention.sliding_window_pattern", 9);
            uint32_t et = 7;
            uint64_t n = 2;
            uint8_t v[2] = {1, 0};
            ft::Gguf::put(g.kv, &et, 4);
            ft::Gguf::put(g.kv, &n, 8);
            ft::Gguf::put(g.kv, v, 2);
        }
        g.u32("gemma4.vocab_size", 4);
        g.tensor("token_embd.weight", {32, 4}, 0, std::vector<uint8_t>(32 * 4 * 4));
    };
    struct { const char *name; bool pattern; std::vector<int32_t> kv; uint32_t rot, shared; forge_status st; const char *msg; } cases[] = {
        {"no_pattern", false, {1}, 16, 0, FORGE_ERR_FORMAT, "gemma4.attention.sliding_window_pattern must be 2 bools"},
        {"kv_array_length", true, {1, 1, 1}, 16, 0, FORGE_ERR_FORMAT, "gemma4.attention.head_count_kv must be an integer or 2"},
        {"kv_zero", true, {1, 0}, 16, 0, FORGE_ERR_FORMAT, "gemma4.attention.head_count_kv = 0 (layer 1)"},
        {"partial_rotation", true, {1}, 8, 0, FORGE_ERR_UNSUPPORTED, "gemma4.rope.dimension_count = 8 differs from the head size 16"},
        {"all_shared", true, {1}, 16, 2, FORGE_ERR_FORMAT, "gemma4.attention.shared_kv_layers 2 must be in [0, 2)"},
        {"nothing_to_share", true, {1}, 16, 1, FORGE_ERR_FORMAT, "KV-shared layer 1 has no earlier full-attention layer"},
    };
    for (auto &c : cases) {
        ft::Gguf g;
        base(g, c.pattern, c.kv, c.rot, c.shared);
        std::string d = ft::tmpdir(std::string("g4gguf_") + c.name);
        std::vector<uint8_t> b = g.bytes();
        ft::write_file(d + "/m.gguf", b.data(), b.size());
        std::string msg;
        EXPECT_EQ(try_load(d + "/m.gguf", msg), c.st) << c.name << ": " << msg;
        EXPECT_NE(msg.find(c.msg), std::string::npos) << c.name << ": " << msg;
    }
}

TEST(ModelLoad, FailedModelRejectsUse) {
    forge_model *m = nullptr;
    EXPECT_NE(forge_model_load("does/not/exist", nullptr, &m), FORGE_OK);
    ASSERT_NE(m, nullptr);
    forge_session *s = nullptr;
    EXPECT_EQ(forge_session_create(m, nullptr, &s), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(s, nullptr);
    forge_model_info info = ft::sized<forge_model_info>();
    EXPECT_EQ(forge_model_get_info(m, &info), FORGE_ERR_INVALID_ARGUMENT);
    forge_model_free(m);
}

/* ---- calls that exceed the plan ---- */

TEST(Session, LimitsAndBadCalls) {
    forge_model *m = ft::load(ft::src("models/stories260K/stories260K.gguf"));
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 16);
    ASSERT_NE(s, nullptr);
    std::vector<int32_t> toks(17, 5);
    std::vector<float> logits(512 * 17);
    EXPECT_EQ(forge_eval(s, toks.data(), 17, 0, logits.data(), logits.size()), FORGE_ERR_LIMIT);
    std::string msg = forge_session_errmsg(s);
    EXPECT_NE(msg.find("17 tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("n_ctx 16"), std::string::npos) << msg;
    ASSERT_EQ(forge_eval(s, toks.data(), 10, 0, logits.data(), logits.size()), FORGE_OK);
    EXPECT_EQ(forge_eval(s, toks.data(), 7, 0, logits.data(), logits.size()), FORGE_ERR_LIMIT); /* 10 + 7 > 16 */
    EXPECT_EQ(forge_session_n_past(s), 10);
    int32_t bad = 512;
    EXPECT_EQ(forge_eval(s, &bad, 1, 0, logits.data(), logits.size()), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_session_errmsg(s)).find("outside the vocabulary of 512"), std::string::npos);
    EXPECT_EQ(forge_eval(s, toks.data(), 2, FORGE_EVAL_ALL_LOGITS, logits.data(), 1000), FORGE_ERR_BUFFER_TOO_SMALL);
    EXPECT_NE(std::string(forge_session_errmsg(s)).find("1024 needed"), std::string::npos) << forge_session_errmsg(s);
    EXPECT_EQ(forge_session_truncate(s, 11), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(forge_session_truncate(s, 0), FORGE_OK);
    EXPECT_EQ(forge_eval(s, toks.data(), 16, 0, logits.data(), logits.size()), FORGE_OK);
    forge_session_free(s);
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = -1;
    EXPECT_EQ(forge_session_create(m, &sp, &s), FORGE_ERR_INVALID_ARGUMENT);
    forge_model_free(m);
}

TEST(Session, MemoryPlanIsWhatGetsAllocated) {
    forge_model *m = ft::load(ft::src("models/stories260K/stories260K.gguf"));
    ASSERT_NE(m, nullptr);
    forge_memory_stats mem_before = ft::model_memory(m);
    EXPECT_EQ(mem_before.device_planned_bytes, mem_before.device_in_use_bytes);
    EXPECT_GT(mem_before.device_in_use_bytes, 0u);
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = 300;
    forge_memory_stats plan = ft::sized<forge_memory_stats>(), used = ft::sized<forge_memory_stats>();
    ASSERT_EQ(forge_session_plan(m, &sp, &plan), FORGE_OK);
    forge_session *s = nullptr;
    ASSERT_EQ(forge_session_create(m, &sp, &s), FORGE_OK);
    ASSERT_EQ(forge_session_memory(s, &used), FORGE_OK);
    EXPECT_EQ(plan.device_planned_bytes, used.device_planned_bytes);
    EXPECT_GE(used.device_in_use_bytes, plan.device_planned_bytes);
    EXPECT_LE(used.device_in_use_bytes, plan.device_planned_bytes + 64 * 1024); /* allocation granularity only */
    EXPECT_EQ(plan.kv_cache_bytes, 2ull * 5 * 300 * 4 * 8 * 4); /* K and V, 5 layers, 300 slots, 4 kv heads x 8, f32 */
    std::vector<int32_t> toks(40, 7);
    std::vector<float> logits(512);
    ASSERT_EQ(forge_eval(s, toks.data(), 40, 0, logits.data(), logits.size()), FORGE_OK);
    forge_session_memory(s, &used);
    EXPECT_EQ(used.device_in_use_bytes, used.device_peak_bytes); /* nothing allocated while running */
    forge_session_free(s);
    forge_memory_stats mem_after = ft::model_memory(m);
    EXPECT_EQ(mem_after.device_in_use_bytes, mem_before.device_in_use_bytes);
    EXPECT_GE(mem_after.device_peak_bytes, mem_before.device_in_use_bytes + plan.device_planned_bytes);
    forge_model_free(m);
}

/* Lowered device limits force tensors into several bindings and the weights into many
 * allocations; the logits must not change. */
TEST(Limits, TensorsLargerThanTheBindingRange) {
    std::string path = ft::src("models/stories260K/stories260K.gguf");
    forge_model *a = ft::load(path);
    forge_model *b = ft::load(path, 16384, 65536);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_GE(ft::model_memory(b).device_buffers, 18u); /* 1.1 MiB of weights in blocks of at most 64 KiB */
    forge_session *sa = ft::session(a, 64), *sb = ft::session(b, 64);
    ASSERT_TRUE(sa && sb);
    std::vector<int32_t> toks = {1, 403, 407, 261, 378, 429, 271, 266, 2, 400, 33, 7, 100, 101, 102, 300, 12, 9, 77, 5,
                                 6, 8, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28};
    int n = (int)toks.size();
    std::vector<float> la((size_t)n * 512), lb((size_t)n * 512);
    ASSERT_EQ(forge_eval(sa, toks.data(), n, FORGE_EVAL_ALL_LOGITS, la.data(), la.size()), FORGE_OK);
    ASSERT_EQ(forge_eval(sb, toks.data(), n, FORGE_EVAL_ALL_LOGITS, lb.data(), lb.size()), FORGE_OK) << forge_session_errmsg(sb);
    EXPECT_LT(ft::rel_err(lb.data(), la.data(), la.size()), 1e-5);
    forge_session_free(sa);
    forge_session_free(sb);
    /* prompt lookup's rows as far as one binding holds their candidates (8 of 16 here): what
     * plain decoding draws at the default limits */
    std::vector<int32_t> twice(toks);
    twice.insert(twice.end(), toks.begin(), toks.end());
    auto generate = [&](forge_model *m, int lookup, forge_metrics *mt) {
        forge_session *s = ft::session(m, 128);
        forge_generate_params p = forge_generate_default_params();
        p.max_tokens = 40;
        p.temperature = 0.0f;
        p.lookup = lookup;
        EXPECT_EQ(forge_generate_tokens(s, twice.data(), (int)twice.size(), &p, mt), FORGE_OK) << forge_session_errmsg(s);
        std::vector<int32_t> held(256);
        size_t n = 0;
        EXPECT_EQ(forge_session_tokens(s, held.data(), held.size(), &n), FORGE_OK);
        held.resize(n);
        forge_session_free(s);
        return held;
    };
    forge_metrics plain = ft::sized<forge_metrics>(), looked = ft::sized<forge_metrics>();
    EXPECT_EQ(generate(b, 15, &looked), generate(a, 0, &plain));
    EXPECT_GT(looked.draft_tokens, 0);
    EXPECT_EQ(plain.draft_tokens, 0);
    forge_model_free(a);
    forge_model_free(b);
}

/* The GGUF `llama` convention (q/k rows permuted, RoPE on adjacent pairs) and the HF one
 * (rotate-half) describe the same model: a GGUF written from the tiny HF model the way
 * llama.cpp's converter does gives the same logits. */
static std::vector<uint8_t> permute_rows(const Tensor &t, int n_head) {
    int64_t rows = t.shape[0], cols = t.shape[1], D = rows / n_head;
    std::vector<uint8_t> out(t.data.size());
    for (int64_t h = 0; h < n_head; h++)
        for (int64_t i = 0; i < D / 2; i++)
            for (int64_t j = 0; j < 2; j++) {
                int64_t dst = h * D + i * 2 + j, src = h * D + j * (D / 2) + i;
                memcpy(&out[(size_t)(dst * cols * 4)], &t.data[(size_t)(src * cols * 4)], (size_t)cols * 4);
            }
    return out;
}

TEST(ModelLoad, GgufLlamaEqualsSafetensors) {
    ft::TinyModel tm;
    std::string dir = tm.write("tiny_pair");
    ft::Gguf g;
    g.str("general.architecture", "llama");
    g.u32("llama.embedding_length", 16);
    g.u32("llama.block_count", 1);
    g.u32("llama.attention.head_count", 2);
    g.u32("llama.attention.head_count_kv", 1);
    g.u32("llama.feed_forward_length", 32);
    g.u32("llama.context_length", 64);
    g.f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    g.f32("llama.rope.freq_base", 10000.0f);
    auto T = [&](const std::string &hf, const std::string &gg, bool perm_q, bool perm_k) {
        const Tensor &t = tm.tensors.at(hf);
        std::vector<uint64_t> ne(t.shape.rbegin(), t.shape.rend());
        std::vector<uint8_t> d = perm_q ? permute_rows(t, 2) : perm_k ? permute_rows(t, 1) : t.data;
        g.tensor(gg, ne, 0, d);
    };
    T("model.embed_tokens.weight", "token_embd.weight", false, false);
    T("model.norm.weight", "output_norm.weight", false, false);
    T("lm_head.weight", "output.weight", false, false);
    T("model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight", false, false);
    T("model.layers.0.post_attention_layernorm.weight", "blk.0.ffn_norm.weight", false, false);
    T("model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight", true, false);
    T("model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight", false, true);
    T("model.layers.0.self_attn.v_proj.weight", "blk.0.attn_v.weight", false, false);
    T("model.layers.0.self_attn.o_proj.weight", "blk.0.attn_output.weight", false, false);
    T("model.layers.0.mlp.gate_proj.weight", "blk.0.ffn_gate.weight", false, false);
    T("model.layers.0.mlp.up_proj.weight", "blk.0.ffn_up.weight", false, false);
    T("model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight", false, false);
    std::vector<uint8_t> bytes = g.bytes();
    ft::write_file(dir + "/tiny.gguf", bytes.data(), bytes.size());
    forge_model *ms = ft::load(dir), *mg = ft::load(dir + "/tiny.gguf");
    ASSERT_NE(ms, nullptr);
    ASSERT_NE(mg, nullptr);
    forge_session *ss = nullptr, *sg = nullptr;
    ASSERT_EQ(forge_session_create(ms, nullptr, &ss), FORGE_OK);
    ASSERT_EQ(forge_session_create(mg, nullptr, &sg), FORGE_OK);
    std::vector<int32_t> toks = {1, 5, 9, 33, 2, 17, 39, 0, 12, 4, 4, 8};
    std::vector<float> a(toks.size() * 40), b(toks.size() * 40);
    ASSERT_EQ(forge_eval(ss, toks.data(), (int)toks.size(), FORGE_EVAL_ALL_LOGITS, a.data(), a.size()), FORGE_OK);
    ASSERT_EQ(forge_eval(sg, toks.data(), (int)toks.size(), FORGE_EVAL_ALL_LOGITS, b.data(), b.size()), FORGE_OK);
    EXPECT_LT(ft::rel_err(b.data(), a.data(), a.size()), 1e-5);
    forge_session_free(ss);
    forge_session_free(sg);
    forge_model_free(ms);
    forge_model_free(mg);
}

namespace {

/* forge reads a model's files only while forge_model_load runs (weights go to the device, the
 * vocabulary, templates and fingerprint to the model's own memory): a file truncated after the
 * load changes nothing. (Truncated during the load, a mapped page past the new end raises SIGBUS
 * in the process, which forge cannot turn into an error: docs/features.md, "Files".) */
TEST(FileChangedAfterLoad, TruncatedModelFileIsNotReadAgain) {
    std::string dir = ft::tmpdir("truncated_after_load"), path = dir + "/model.gguf";
    std::vector<uint8_t> bytes = ft::read_file(ft::src("models/stories260K/stories260K.gguf"));
    ASSERT_FALSE(bytes.empty());
    FILE *f = fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    fclose(f);
    auto story = [](forge_model *m) {
        forge_session *s = nullptr;
        EXPECT_EQ(forge_session_create(m, nullptr, &s), FORGE_OK);
        forge_generate_params gp = forge_generate_default_params();
        gp.max_tokens = 24;
        std::string out;
        gp.user_data = &out;
        gp.on_token = [](void *u, int32_t, const char *t, size_t n) { ((std::string *)u)->append(t, n); return 0; };
        EXPECT_EQ(forge_generate(s, "Once upon a time", 16, &gp, nullptr), FORGE_OK) << forge_session_errmsg(s);
        forge_session_free(s);
        return out;
    };
    forge_model *ref = ft::load(path);
    ASSERT_NE(ref, nullptr);
    std::string want = story(ref);
    forge_model_free(ref);
    forge_model *m = ft::load(path);
    ASSERT_NE(m, nullptr);
    ASSERT_EQ(truncate(path.c_str(), 64), 0);
    EXPECT_EQ(story(m), want);
    int32_t ids[16];
    size_t n = 0;
    EXPECT_EQ(forge_tokenize(m, "Once upon a time", 16, 0, ids, 16, &n), FORGE_OK);
    EXPECT_STREQ(forge_token_piece(m, ids[n - 1]), "\xE2\x96\x81time");
    forge_model_free(m);
}

}  // namespace

/* The load progress: 0 before the first byte goes up (a model that uploads in one copy, as
 * small ones do through a GPU's staging buffer, still shows that it started), never falling,
 * ending at 1. */
TEST(Load, ProgressStartsAtZeroAndEndsAtOne) {
    std::vector<float> seen;
    forge_model_params p = forge_model_default_params();
    p.progress = [](void *u, float f) { ((std::vector<float> *)u)->push_back(f); };
    p.progress_user_data = &seen;
    forge_model *m = nullptr;
    ASSERT_EQ(forge_model_load(ft::src("models/stories260K/stories260K.gguf").c_str(), &p, &m), FORGE_OK) << forge_model_errmsg(m);
    ASSERT_GE(seen.size(), 2u);
    EXPECT_EQ(seen.front(), 0.0f);
    EXPECT_EQ(seen.back(), 1.0f);
    for (size_t i = 1; i < seen.size(); i++) EXPECT_GE(seen[i], seen[i - 1]) << i;
    forge_model_free(m);
}
