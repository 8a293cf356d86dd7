/* Tokenizer: conformance vectors (llama.cpp's, and HF's outputs for the four real
 * tokenizer.json files), differential tests against HF tokenizers on generated strings, and
 * the API contract (buffers, streaming, invalid UTF-8, vocab-only models). */
#include "tok_util.h"
#include "writers.h"

#include <thread>

namespace {

const char *kFamilies[] = {"llama3", "qwen3", "gemma3", "gemma2"};

/* Loaded tokenizers are cached for the whole run (gemma3's file is 33 MB), freed at exit. */
struct ModelCache : std::map<std::string, forge_model *> {
    ~ModelCache() {
        for (auto &kv : *this) forge_model_free(kv.second);
    }
};

forge_model *family(const std::string &name) {
    static ModelCache cache;
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(name);
    if (it != cache.end()) return it->second;
    std::string d = ft::tok_data();
    forge_model *m = d.empty() ? nullptr : ft::load_vocab(d + "/" + name);
    cache[name] = m;
    return m;
}

/* The texts of a family's added tokens (special and not), for generated strings. */
std::vector<std::string> added_texts(forge_model *m) {
    std::vector<std::string> v;
    static const char *known[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
                                  "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
                                  "<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>", "<unused5>", "<unk>",
                                  "<mask>", "<0x41>", "<|fim_prefix|>", "<image_soft_token>", "<h1>", "</code>", "<table>"};
    for (const char *k : known)
        if (forge_token_id(m, k) >= 0) v.push_back(k);
    v.push_back("<|not_a_token|>");
    return v;
}

void conformance(forge_model *m, const std::string &inp, const std::string &out, uint32_t flags, const std::string &what) {
    std::vector<std::string> cases = ft::read_inp(inp);
    std::vector<std::vector<int32_t>> want = ft::read_out(out);
    ASSERT_GE(want.size(), cases.size()) << out;
    ASSERT_GT(cases.size(), 40u) << inp;
    size_t ok = 0;
    for (size_t i = 0; i < cases.size(); i++) {
        std::vector<int32_t> got = ft::encode(m, cases[i], flags);
        if (got == want[i]) ok++;
        else ADD_FAILURE() << what << " case " << i << " " << ft::show_str(cases[i]) << "\n  want " << ft::show_ids(want[i])
                           << "\n  got  " << ft::show_ids(got);
    }
    EXPECT_EQ(ok, cases.size()) << what;
    printf("[ conformance ] %s: %zu/%zu\n", what.c_str(), ok, cases.size());
}

} // namespace

TEST(TokConformance, RealTokenizersStandardVectors) {
    std::string d = ft::tok_data();
    ASSERT_FALSE(d.empty());
    for (const char *f : kFamilies) {
        forge_model *m = family(f);
        ASSERT_NE(m, nullptr) << f;
        conformance(m, d + "/llamacpp-standard.inp", d + "/llamacpp-standard." + f + ".out", 0, f);
    }
}

TEST(TokConformance, LlamaCppVocabGgufs) {
    std::string d = ft::tok_data();
    ASSERT_FALSE(d.empty());
    const char *vocabs[] = {"gpt-2", "llama-spm", "phi-3", "deepseek-coder", "deepseek-llm", "falcon", "mpt", "refact", "starcoder"};
    for (const char *v : vocabs) {
        std::string g = d + "/ggml-vocab-" + v + ".gguf";
        forge_model *m = ft::load_vocab(g);
        ASSERT_NE(m, nullptr) << v;
        /* the .out files were made with special-token text read as plain text */
        conformance(m, g + ".inp", g + ".out", FORGE_TOKENIZE_NO_PARSE_SPECIAL, v);
        forge_model_free(m);
    }
    /* gpt-neox has no vectors of its own; MPT ships GPT-NeoX-20B's tokenizer, whose vectors these are */
    forge_model *m = ft::load_vocab(d + "/ggml-vocab-gpt-neox.gguf");
    ASSERT_NE(m, nullptr);
    conformance(m, d + "/ggml-vocab-mpt.gguf.inp", d + "/ggml-vocab-mpt.gguf.out", FORGE_TOKENIZE_NO_PARSE_SPECIAL, "gpt-neox");
    forge_model_free(m);
}

/* baichuan's GGUF has no vectors here: it must load and give text back unchanged. */
TEST(TokConformance, BaichuanRoundTrips) {
    std::string d = ft::tok_data();
    ASSERT_FALSE(d.empty());
    forge_model *m = ft::load_vocab(d + "/ggml-vocab-baichuan.gguf");
    ASSERT_NE(m, nullptr);
    for (const std::string &s : ft::read_inp(d + "/llamacpp-standard.inp")) {
        std::vector<int32_t> ids = ft::encode(m, s, FORGE_TOKENIZE_NO_PARSE_SPECIAL);
        /* SentencePiece decoding drops the one space the encoder prefixed */
        EXPECT_EQ(ft::decode(m, ids), s) << ft::show_str(s);
    }
    forge_model_free(m);
}

/* ---- Differential: forge vs HF tokenizers on generated strings ---- */

/* forge on model `m` against HF tokenizers on family `fam`'s tokenizer.json. */
static void differential_on(forge_model *m, const char *fam, const char *label, uint32_t seed, size_t count) {
    std::string dir = ft::tok_data() + "/" + fam;
    std::vector<std::string> texts = ft::gen_strings(seed, count, added_texts(m));
    for (int special = 0; special < 2; special++) {
        ft::OracleResult hf;
        ASSERT_TRUE(ft::oracle(dir, texts, special, &hf));
        size_t ok_ids = 0, ok_dec = 0, ok_stream = 0, shown = 0;
        for (size_t i = 0; i < texts.size(); i++) {
            std::vector<int32_t> ids = ft::encode(m, texts[i], special ? FORGE_TOKENIZE_ADD_SPECIAL : 0);
            std::string dec = ft::decode(m, ids);
            bool a = ids == hf.ids[i], b = dec == hf.decoded[i], c = ft::decode_stream(m, ids) == dec;
            ok_ids += a;
            ok_dec += b;
            ok_stream += c;
            if ((!a || !b || !c) && shown++ < 5)
                ADD_FAILURE() << label << (special ? " +special" : "") << " #" << i << " " << ft::show_str(texts[i]) << "\n  hf    "
                              << ft::show_ids(hf.ids[i]) << "\n  forge " << ft::show_ids(ids) << "\n  hf decoded    "
                              << ft::show_str(hf.decoded[i]) << "\n  forge decoded " << ft::show_str(dec) << (c ? "" : "\n  stream differs");
        }
        printf("[ differential ] %s%s: ids %zu/%zu, decode %zu/%zu, stream %zu/%zu\n", label, special ? " +special" : "", ok_ids,
               texts.size(), ok_dec, texts.size(), ok_stream, texts.size());
        EXPECT_EQ(ok_ids, texts.size());
        EXPECT_EQ(ok_dec, texts.size());
        EXPECT_EQ(ok_stream, texts.size());
    }
}

static void differential(const char *fam, uint32_t seed, size_t count) {
    forge_model *m = family(fam);
    ASSERT_NE(m, nullptr);
    differential_on(m, fam, fam, seed, count);
}

TEST(TokDifferential, Llama3) { differential("llama3", 101, 2048); }
TEST(TokDifferential, Qwen3) { differential("qwen3", 202, 2048); }
TEST(TokDifferential, Gemma3) { differential("gemma3", 303, 2048); }
TEST(TokDifferential, Gemma2) { differential("gemma2", 404, 2048); }

/* A GGUF vocabulary of a BPE tokenizer.json, as llama.cpp's converter writes one: token types
 * as it sets them (added special tokens control (3), other added tokens user-defined (4),
 * <0xXX> byte (6), the rest normal (1)), the merges, BOS / EOS by their text; written under the
 * build tree, its path returned. */
static std::string gguf_vocab_from(const std::string &tokenizer_json, const char *arch, const char *model, const char *pre, bool add_bos,
                                   const char *bos_text, const char *eos_text, const std::string &name) {
    std::vector<uint8_t> js = ft::read_file(tokenizer_json);
    cJSON *root = cJSON_ParseWithLength((const char *)js.data(), js.size());
    if (!root) return "";
    cJSON *mo = cJSON_GetObjectItem(root, "model"), *e;
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    auto put = [&](int id, const std::string &s, int32_t type) {
        if ((size_t)id >= tokens.size()) { tokens.resize(id + 1); types.resize(id + 1, 1); }
        tokens[id] = s;
        types[id] = type;
    };
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(mo, "vocab")) {
        std::string s = e->string;
        bool byte = s.size() == 6 && s.rfind("<0x", 0) == 0 && s[5] == '>';
        put((int)e->valuedouble, s, byte ? 6 : 1);
    }
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "added_tokens")) {
        std::string s = cJSON_GetStringValue(cJSON_GetObjectItem(e, "content"));
        bool byte = s.size() == 6 && s.rfind("<0x", 0) == 0 && s[5] == '>';
        put((int)cJSON_GetNumberValue(cJSON_GetObjectItem(e, "id")), s, byte ? 6 : cJSON_IsTrue(cJSON_GetObjectItem(e, "special")) ? 3 : 4);
    }
    std::vector<std::string> merges;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(mo, "merges")) {
        if (cJSON_IsString(e)) merges.push_back(e->valuestring);
        else merges.push_back(std::string(cJSON_GetStringValue(cJSON_GetArrayItem(e, 0))) + " " + cJSON_GetStringValue(cJSON_GetArrayItem(e, 1)));
    }
    cJSON_Delete(root);
    EXPECT_GT(merges.size(), 100000u);
    int32_t bos = -1, eos = -1;
    for (size_t i = 0; i < tokens.size(); i++) {
        if (tokens[i] == bos_text) bos = (int32_t)i;
        if (tokens[i] == eos_text) eos = (int32_t)i;
    }
    ft::Gguf g;
    g.str("general.architecture", arch);
    g.str("tokenizer.ggml.model", model);
    if (pre) g.str("tokenizer.ggml.pre", pre);
    g.strs("tokenizer.ggml.tokens", tokens);
    g.i32s("tokenizer.ggml.token_type", types);
    g.strs("tokenizer.ggml.merges", merges);
    if (bos >= 0) g.u32("tokenizer.ggml.bos_token_id", (uint32_t)bos);
    if (eos >= 0) g.u32("tokenizer.ggml.eos_token_id", (uint32_t)eos);
    g.boolean("tokenizer.ggml.add_bos_token", add_bos);
    g.boolean("tokenizer.ggml.add_space_prefix", false);
    std::vector<uint8_t> bytes = g.bytes();
    std::string path = ft::tmpdir(name) + "/vocab.gguf";
    ft::write_file(path, bytes.data(), bytes.size());
    return path;
}

/* A GGUF vocabulary of tokenizer.ggml.model "gemma4" (BPE by merge rank over characters, spaces as
 * '▁', byte fallback: what llama.cpp's converter writes for Gemma 4 from its tokenizer.json) made
 * here from Gemma 3's tokenizer.json, the same kind of file: it must tokenize as HF does. */
TEST(TokDifferential, Gemma4GgufVocabulary) {
    std::string d = ft::tok_data();
    ASSERT_FALSE(d.empty());
    std::string path = gguf_vocab_from(d + "/gemma3/tokenizer.json", "gemma4", "gemma4", nullptr, true, "<bos>", "<eos>", "gemma4_vocab_gguf");
    forge_model *m = ft::load_vocab(path);
    ASSERT_NE(m, nullptr);
    conformance(m, d + "/llamacpp-standard.inp", d + "/llamacpp-standard.gemma3.out", 0, "gemma4 gguf");
    differential_on(m, "gemma3", "gemma4 gguf", 505, 1024);
    forge_model_free(m);
}

/* Qwen 3.5's pre-tokenizer (tokenizer.ggml.pre "qwen35"; no Qwen 3.5 tokenizer here): Qwen 3's
 * tokenizer.json with its split regex replaced by Qwen 3.5's, which keeps combining marks with the
 * letters before them ([\p{L}\p{M}]+ where Qwen 2 / 3 have \p{L}+), read by HF tokenizers, forge
 * from the JSON, and forge from a GGUF vocabulary of it naming pre "qwen35": all equal. Qwen 3's
 * merges never join a letter to a mark (its regex kept them apart), so one merge is added that
 * does (" x" + U+0301): only a split keeping them together can take it. No NFC normalizer (a GGUF
 * vocabulary has none: llama.cpp does not normalize), so marks reach the split as written. */
TEST(TokDifferential, Qwen35PreTokenizer) {
    std::string d = ft::tok_data();
    ASSERT_FALSE(d.empty());
    const std::string q2 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    const std::string q35 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    std::vector<uint8_t> js = ft::read_file(d + "/qwen3/tokenizer.json"), cfg = ft::read_file(d + "/qwen3/tokenizer_config.json");
    cJSON *root = cJSON_ParseWithLength((const char *)js.data(), js.size());
    ASSERT_NE(root, nullptr);
    cJSON *pattern = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "pre_tokenizer"), "pretokenizers"), 0), "pattern");
    ASSERT_STREQ(cJSON_GetStringValue(cJSON_GetObjectItem(pattern, "Regex")), q2.c_str()) << "Qwen 3's split regex is not where this test expects it";
    cJSON_ReplaceItemInObject(pattern, "Regex", cJSON_CreateString(q35.c_str()));
    cJSON_ReplaceItemInObject(root, "normalizer", cJSON_CreateNull());
    /* the merge goes in place of the last one (its token, "\xe2\xbd\x97" in bytes, id 151642, given up) */
    cJSON *model = cJSON_GetObjectItem(root, "model"), *vocab = cJSON_GetObjectItem(model, "vocab"), *merges = cJSON_GetObjectItem(model, "merges");
    ASSERT_EQ(cJSON_GetNumberValue(cJSON_GetObjectItem(vocab, "\xc3\xa2\xc2\xbd\xc4\xb9")), 151642.0);
    cJSON_DeleteItemFromObject(vocab, "\xc3\xa2\xc2\xbd\xc4\xb9");
    cJSON_AddNumberToObject(vocab, "\xc4\xa0x\xc3\x8c\xc4\xa3", 151642); /* "Ġx" "Ìģ": byte-level " x" U+0301 */
    const char *pair[2] = {"\xc4\xa0x", "\xc3\x8c\xc4\xa3"};
    cJSON_ReplaceItemInArray(merges, cJSON_GetArraySize(merges) - 1, cJSON_CreateStringArray(pair, 2));
    char *printed = cJSON_PrintUnformatted(root);
    std::string text = printed;
    cJSON_free(printed);
    cJSON_Delete(root);
    const std::string dir = d + "/qwen35_regex"; /* beside the families (the build tree's tok_data) */
    mkdir(dir.c_str(), 0755);
    ft::write_file(dir + "/tokenizer.json", text.data(), text.size());
    ft::write_file(dir + "/tokenizer_config.json", cfg.data(), cfg.size());
    std::string path = gguf_vocab_from(dir + "/tokenizer.json", "qwen35", "gpt2", "qwen35", false, "<|endoftext|>", "<|im_end|>", "qwen35_vocab_gguf");
    const std::vector<std::string> marks = {"a x\xcc\x81yz", "cafe\xcc\x81 au lait", "n\xcc\x83o\xcc\x88 x\xcc\xa3\xcc\x81yz",
                                            "\xe0\xa4\x95\xe0\xa4\xbf\xe0\xa4\xa4\xe0\xa4\xbe\xe0\xa4\xac", "a \xcc\x81" "b", "12\xcc\x81 3", "'\xcc\x81s"};
    ft::OracleResult hf35;
    ASSERT_TRUE(ft::oracle(dir, marks, false, &hf35));
    EXPECT_EQ(hf35.ids[0], (std::vector<int32_t>{64, 151642, 18348})) << "HF did not take the merge across the mark";
    for (const std::string &src : {dir, path}) {
        forge_model *m = ft::load_vocab(src);
        ASSERT_NE(m, nullptr) << src;
        for (size_t i = 0; i < marks.size(); i++) EXPECT_EQ(ft::encode(m, marks[i], 0), hf35.ids[i]) << src << ": " << ft::show_str(marks[i]);
        differential_on(m, "qwen35_regex", src == path ? "qwen35 gguf" : "qwen35 json", 606, 512);
        forge_model_free(m);
    }
}

/* ---- API contract ---- */

TEST(TokApi, SampleIdsAndSpecialTokens) {
    struct { const char *fam; std::vector<int32_t> ids; } want[] = {
        {"llama3", {9906, 1917}}, {"qwen3", {9707, 1879}}, {"gemma3", {9259, 1902}}, {"gemma2", {4521, 2134}}};
    for (auto &w : want) {
        forge_model *m = family(w.fam);
        ASSERT_NE(m, nullptr);
        EXPECT_EQ(ft::encode(m, "Hello world"), w.ids) << w.fam;
    }
    forge_special_tokens st = ft::sized<forge_special_tokens>();
    ASSERT_EQ(forge_model_special_tokens(family("llama3"), &st), FORGE_OK);
    EXPECT_EQ(st.bos, 128000);
    EXPECT_EQ(st.eot, 128009);
    EXPECT_EQ(st.sot, 128006);
    ASSERT_EQ(forge_model_special_tokens(family("qwen3"), &st), FORGE_OK);
    EXPECT_EQ(st.eot, 151645);
    EXPECT_EQ(st.sot, 151644);
    EXPECT_EQ(st.eos, 151645);
    ASSERT_EQ(forge_model_special_tokens(family("gemma3"), &st), FORGE_OK);
    EXPECT_EQ(st.bos, 2);
    EXPECT_EQ(st.pad, 0);
    EXPECT_EQ(st.eot, forge_token_id(family("gemma3"), "<end_of_turn>"));
    EXPECT_EQ(st.sot, forge_token_id(family("gemma3"), "<start_of_turn>"));
    bool eot_in_eos = false, eos_in_eos = false;
    for (int i = 0; i < st.n_eos; i++) {
        eot_in_eos |= st.eos_ids[i] == st.eot;
        eos_in_eos |= st.eos_ids[i] == 1; /* <eos> ends generation too */
    }
    EXPECT_TRUE(eot_in_eos);
    EXPECT_TRUE(eos_in_eos);
    /* the post-processor's BOS, only when asked for */
    forge_model *g = family("gemma3");
    EXPECT_EQ(ft::encode(g, "Hello world", FORGE_TOKENIZE_ADD_SPECIAL), (std::vector<int32_t>{2, 9259, 1902}));
    EXPECT_EQ(ft::encode(family("llama3"), "Hi", FORGE_TOKENIZE_ADD_SPECIAL), ft::encode(family("llama3"), "Hi"));
}

TEST(TokApi, ParseSpecialSwitch) {
    forge_model *m = family("llama3");
    ASSERT_NE(m, nullptr);
    std::string s = "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>";
    std::vector<int32_t> parsed = ft::encode(m, s), plain = ft::encode(m, s, FORGE_TOKENIZE_NO_PARSE_SPECIAL);
    EXPECT_EQ(parsed.front(), 128006);
    EXPECT_EQ(parsed.back(), 128009);
    for (int32_t id : plain) EXPECT_LT(id, 128000);
    EXPECT_EQ(ft::decode(m, parsed), s);
    EXPECT_EQ(ft::decode(m, plain), s);
    EXPECT_EQ(ft::decode(m, parsed, FORGE_DETOKENIZE_SKIP_SPECIAL), "user\n\nhi");
    EXPECT_TRUE(forge_token_is_special(m, 128009));
    EXPECT_FALSE(forge_token_is_special(m, 9906));
    /* Qwen's <think> is an added token that is not special: matched either way */
    forge_model *q = family("qwen3");
    EXPECT_EQ(ft::encode(q, "<think>", FORGE_TOKENIZE_NO_PARSE_SPECIAL), (std::vector<int32_t>{forge_token_id(q, "<think>")}));
}

TEST(TokApi, BuffersAndPieces) {
    forge_model *m = family("qwen3");
    ASSERT_NE(m, nullptr);
    const char *text = "The quick brown fox jumps over the lazy dog.";
    int32_t ids[4];
    size_t n = 0;
    EXPECT_EQ(forge_tokenize(m, text, strlen(text), 0, ids, 4, &n), FORGE_ERR_BUFFER_TOO_SMALL);
    EXPECT_EQ(n, 10u);
    EXPECT_EQ(forge_tokenize(m, text, 0, 0, nullptr, 0, &n), FORGE_OK);
    EXPECT_EQ(n, 0u);
    std::vector<int32_t> all = ft::encode(m, text);
    char small[8];
    size_t len = 0;
    EXPECT_EQ(forge_detokenize(m, all.data(), all.size(), 0, small, sizeof small, &len), FORGE_ERR_BUFFER_TOO_SMALL);
    EXPECT_EQ(len, strlen(text));
    int32_t bad = 1 << 30;
    EXPECT_EQ(forge_detokenize(m, &bad, 1, 0, small, sizeof small, &len), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_model_errmsg(m)).find("outside the vocabulary"), std::string::npos);
    EXPECT_STREQ(forge_token_piece(m, 9707), "Hello");
    EXPECT_EQ(forge_token_id(m, "Hello"), 9707);
    EXPECT_EQ(forge_token_id(m, "<|im_end|>"), 151645);
    EXPECT_EQ(forge_token_piece(m, -1), nullptr);
    EXPECT_EQ(forge_token_id(m, "no such piece at all"), -1);
    EXPECT_EQ(forge_model_n_vocab(m), 151669);
}

/* Invalid UTF-8: each maximal invalid sequence reads as one U+FFFD (from_utf8_lossy). */
TEST(TokApi, InvalidUtf8IsReplaced) {
    const std::string bad[] = {std::string("a\xff" "b"), std::string("\xc3"), std::string("x\xe4\xbd"), std::string("\xed\xa0\x80"),
                               std::string("\xf0\x9f\x98"), std::string("\x80\x80 z"), std::string("\xc0\xaf"), std::string("ok\xf5\x80")};
    const std::string fixed[] = {"a\xEF\xBF\xBD" "b", "\xEF\xBF\xBD", "x\xEF\xBF\xBD", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD",
                                 "\xEF\xBF\xBD", "\xEF\xBF\xBD\xEF\xBF\xBD z", "\xEF\xBF\xBD\xEF\xBF\xBD", "ok\xEF\xBF\xBD\xEF\xBF\xBD"};
    for (const char *f : kFamilies) {
        forge_model *m = family(f);
        ASSERT_NE(m, nullptr);
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            std::vector<int32_t> a = ft::encode(m, bad[i]), b = ft::encode(m, fixed[i]);
            EXPECT_EQ(a, b) << f << " " << ft::show_str(bad[i]);
            std::string d = ft::decode(m, a);
            EXPECT_EQ(d, fixed[i]) << f << " " << ft::show_str(bad[i]);
        }
        /* every byte value, alone and in runs, never crashes and decodes to valid UTF-8 */
        std::string all;
        for (int c = 0; c < 256; c++) all += (char)c;
        std::string d = ft::decode(m, ft::encode(m, all + all));
        EXPECT_GT(d.size(), 256u);
    }
    /* a byte-level model can emit ids whose bytes are not UTF-8: decoded as U+FFFD too */
    forge_model *m = family("llama3");
    int32_t half = forge_token_id(m, "\xc3\xa4"); /* byte 0xE4 in the byte-level alphabet */
    ASSERT_GE(half, 0);
    EXPECT_EQ(ft::decode(m, {half}), "\xEF\xBF\xBD");
}

TEST(TokApi, StreamingHoldsIncompleteCharacters) {
    forge_model *m = family("gemma2");
    ASSERT_NE(m, nullptr);
    /* a rare CJK character that gemma2 spells with byte-fallback tokens */
    std::string s = "a \xf0\xa0\x80\x80 b";
    std::vector<int32_t> ids = ft::encode(m, s);
    ASSERT_GE(ids.size(), 5u);
    forge_detok_stream ds;
    forge_detok_stream_init(&ds, 0);
    std::string out;
    int held = 0;
    for (int32_t id : ids) {
        char buf[64];
        size_t n;
        ASSERT_EQ(forge_detok_stream_next(m, &ds, id, buf, sizeof buf, &n), FORGE_OK);
        if (n == 0) held++;
        std::string piece(buf, n);
        size_t bad = piece.find("\xEF\xBF\xBD");
        EXPECT_EQ(bad, std::string::npos) << "emitted a partial character";
        out += piece;
    }
    EXPECT_GE(held, 3);
    char buf[64];
    size_t n;
    ASSERT_EQ(forge_detok_stream_flush(m, &ds, buf, sizeof buf, &n), FORGE_OK);
    out.append(buf, n);
    EXPECT_EQ(out, s);
    /* too small: nothing moves, the same call succeeds with room */
    forge_detok_stream_init(&ds, 0);
    int32_t hello = forge_token_id(m, "Hello");
    ASSERT_EQ(forge_detok_stream_next(m, &ds, hello, buf, 2, &n), FORGE_ERR_BUFFER_TOO_SMALL);
    EXPECT_EQ(n, 5u);
    ASSERT_EQ(forge_detok_stream_next(m, &ds, hello, buf, sizeof buf, &n), FORGE_OK);
    EXPECT_EQ(std::string(buf, n), "Hello");
}

/* A byte token that makes the run before it invalid UTF-8: ByteFallback decodes the whole
 * run as U+FFFD per byte, so the text no longer extends what the stream emitted ("A"); the
 * stream must not cut the new text inside a character. */
TEST(TokApi, StreamingStaysValidWhenALaterByteBreaksTheRun) {
    forge_model *m = family("gemma2");
    ASSERT_NE(m, nullptr);
    int32_t a = forge_token_id(m, "<0x41>"), cont = forge_token_id(m, "<0xBF>");
    ASSERT_GE(a, 0);
    ASSERT_GE(cont, 0);
    EXPECT_EQ(ft::decode(m, {a, cont}), "\xEF\xBF\xBD\xEF\xBF\xBD");
    forge_detok_stream ds;
    forge_detok_stream_init(&ds, 0);
    char buf[64];
    size_t n;
    std::string out;
    for (int32_t id : {a, cont}) {
        ASSERT_EQ(forge_detok_stream_next(m, &ds, id, buf, sizeof buf, &n), FORGE_OK);
        out.append(buf, n);
    }
    ASSERT_EQ(forge_detok_stream_flush(m, &ds, buf, sizeof buf, &n), FORGE_OK);
    out.append(buf, n);
    EXPECT_EQ(out, "A\xEF\xBF\xBD");
}

TEST(TokApi, VocabOnlyModel) {
    std::string d = ft::tok_data();
    forge_model *m = ft::load_vocab(d + "/qwen3/tokenizer.json"); /* the file itself */
    ASSERT_NE(m, nullptr);
    forge_model_info info = ft::sized<forge_model_info>();
    EXPECT_EQ(forge_model_get_info(m, &info), FORGE_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(forge_model_errmsg(m)).find("vocab_only"), std::string::npos);
    forge_session *s = nullptr;
    EXPECT_EQ(forge_session_create(m, nullptr, &s), FORGE_ERR_UNSUPPORTED);
    EXPECT_EQ(s, nullptr);
    forge_memory_stats plan = ft::sized<forge_memory_stats>();
    EXPECT_EQ(forge_session_plan(m, nullptr, &plan), FORGE_ERR_UNSUPPORTED);
    EXPECT_EQ(ft::encode(m, "Hello world"), (std::vector<int32_t>{9707, 1879}));
    forge_model_free(m);
    /* a model directory without weights and no tokenizer.json: a clear error */
    std::string empty = ft::tmpdir("tok_empty");
    forge_model_params p = forge_model_default_params();
    p.vocab_only = 1;
    EXPECT_EQ(forge_model_load(empty.c_str(), &p, &m), FORGE_ERR_IO);
    EXPECT_NE(std::string(forge_model_errmsg(m)).find("tokenizer.json"), std::string::npos);
    forge_model_free(m);
    /* the GGUF model's own vocabulary: stories260K (llama, SentencePiece) */
    m = ft::load_vocab(ft::src("models/stories260K/stories260K.gguf"));
    ASSERT_NE(m, nullptr);
    std::vector<int32_t> ids = ft::encode(m, "Once upon a time", FORGE_TOKENIZE_ADD_SPECIAL);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], 1);
    EXPECT_EQ(ft::decode(m, ids, FORGE_DETOKENIZE_SKIP_SPECIAL), "Once upon a time");
    forge_model_free(m);
}

TEST(TokApi, UnsupportedComponentIsNamed) {
    std::string dir = ft::tmpdir("tok_unsupported");
    const char *json = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                       " \"normalizer\": {\"type\": \"Precompiled\", \"precompiled_charsmap\": \"\"}}";
    ft::write_file(dir + "/tokenizer.json", json, strlen(json));
    forge_model_params p = forge_model_default_params();
    p.vocab_only = 1;
    forge_model *m = nullptr;
    EXPECT_EQ(forge_model_load(dir.c_str(), &p, &m), FORGE_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(forge_model_errmsg(m)).find("normalizer 'Precompiled'"), std::string::npos) << forge_model_errmsg(m);
    forge_model_free(m);
    const char *wp = "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}";
    ft::write_file(dir + "/tokenizer.json", wp, strlen(wp));
    EXPECT_EQ(forge_model_load(dir.c_str(), &p, &m), FORGE_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(forge_model_errmsg(m)).find("WordPiece"), std::string::npos) << forge_model_errmsg(m);
    forge_model_free(m);
}

/* A model's tokenizer is shared by threads: concurrent calls give the single-thread results. */
TEST(TokApi, ConcurrentUseOfOneModel) {
    forge_model *m = family("gemma3");
    ASSERT_NE(m, nullptr);
    std::vector<std::string> texts = ft::gen_strings(99, 200, added_texts(m));
    std::vector<std::vector<int32_t>> want;
    std::vector<std::string> want_text;
    for (const auto &t : texts) {
        want.push_back(ft::encode(m, t, FORGE_TOKENIZE_ADD_SPECIAL));
        want_text.push_back(ft::decode(m, want.back()));
    }
    std::atomic<int> bad{0};
    auto work = [&](int seed) {
        for (size_t k = 0; k < texts.size(); k++) {
            size_t i = (k * 7 + (size_t)seed * 13) % texts.size();
            std::vector<int32_t> ids(texts[i].size() + 8);
            size_t n = 0;
            if (forge_tokenize(m, texts[i].data(), texts[i].size(), FORGE_TOKENIZE_ADD_SPECIAL, ids.data(), ids.size(), &n) != FORGE_OK) { bad++; continue; }
            ids.resize(n);
            if (ids != want[i]) bad++;
            std::string s(want_text[i].size() + 1, '\0');
            size_t len = 0;
            if (forge_detokenize(m, ids.data(), ids.size(), 0, &s[0], s.size(), &len) != FORGE_OK || s.substr(0, len) != want_text[i]) bad++;
        }
    };
    std::vector<std::thread> th;
    for (int t = 0; t < 4; t++) th.emplace_back(work, t);
    for (auto &t : th) t.join();
    EXPECT_EQ(bad.load(), 0);
}

/* Skipping special tokens while streaming keeps the text of the tokens around them. */
TEST(TokApi, StreamingSkipSpecial) {
    forge_model *m = family("gemma3");
    ASSERT_NE(m, nullptr);
    std::vector<int32_t> ids = ft::encode(m, "<bos>Hello<end_of_turn> world<eos> again", 0);
    forge_detok_stream ds;
    forge_detok_stream_init(&ds, FORGE_DETOKENIZE_SKIP_SPECIAL);
    std::string out;
    char buf[64];
    size_t n;
    for (int32_t id : ids) {
        ASSERT_EQ(forge_detok_stream_next(m, &ds, id, buf, sizeof buf, &n), FORGE_OK);
        out.append(buf, n);
    }
    ASSERT_EQ(forge_detok_stream_flush(m, &ds, buf, sizeof buf, &n), FORGE_OK);
    out.append(buf, n);
    EXPECT_EQ(out, ft::decode(m, ids, FORGE_DETOKENIZE_SKIP_SPECIAL));
    EXPECT_EQ(out, "Hello world again");
}

/* A post-processor's special-token ids must be ids of the vocabulary: huge (5e36, found by the
 * tokenizer_json fuzzer: the cast to int32_t was undefined), negative and fractional ones are
 * format errors naming the value, and an eos_token_id out of range in a config is ignored. */
TEST(TokLoad, PostProcessorIdsOutsideTheVocabulary) {
    std::vector<uint8_t> seed = ft::read_file(ft::src("tests/fuzz/corpus/tokenizer_json/crash-template-id-5e36"));
    ASSERT_FALSE(seed.empty());
    const std::string base(seed.begin(), seed.end()), huge = "5000000000000000000000000000000000000";
    ASSERT_NE(base.find("[" + huge + "]"), std::string::npos);
    forge_model_params p = forge_model_default_params();
    p.vocab_only = 1;
    struct Case { std::string ids, shown; } cases[] = {{huge, "5e+36"}, {"-1", "-1"}, {"2.5", "2.5"}, {"8", "8"}, {"2147483648", "2147483648"}};
    for (const Case &c : cases) {
        std::string dir = ft::tmpdir("tok_post_ids"), text = base;
        text.replace(text.find(huge), huge.size(), c.ids);
        ft::write_file(dir + "/tokenizer.json", text.data(), text.size());
        forge_model *m = nullptr;
        EXPECT_EQ(forge_model_load(dir.c_str(), &p, &m), FORGE_ERR_FORMAT) << c.ids;
        EXPECT_NE(std::string(forge_model_errmsg(m)).find("post-processor token id " + c.shown + " is not an id of the vocabulary (0..7)"),
                  std::string::npos)
            << forge_model_errmsg(m);
        forge_model_free(m);
    }
    /* the same file with id 5: loads, and an eos_token_id of 1e30 beside it is ignored */
    std::string dir = ft::tmpdir("tok_post_ids"), text = base;
    text.replace(text.find(huge), huge.size(), "5");
    ft::write_file(dir + "/tokenizer.json", text.data(), text.size());
    const char *cfg = "{\"eos_token_id\": [1e30, 3, -4]}";
    ft::write_file(dir + "/generation_config.json", cfg, strlen(cfg));
    forge_model *m = nullptr;
    ASSERT_EQ(forge_model_load(dir.c_str(), &p, &m), FORGE_OK) << forge_model_errmsg(m);
    forge_special_tokens sp = ft::sized<forge_special_tokens>();
    ASSERT_EQ(forge_model_special_tokens(m, &sp), FORGE_OK);
    bool has3 = false;
    for (int i = 0; i < sp.n_eos; i++) {
        EXPECT_TRUE(sp.eos_ids[i] >= 0 && sp.eos_ids[i] < 8) << sp.eos_ids[i];
        has3 |= sp.eos_ids[i] == 3;
    }
    EXPECT_TRUE(has3);
    forge_model_free(m);
}
