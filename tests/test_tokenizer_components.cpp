/* Tokenizer components one by one: small synthetic tokenizer.json files that use each
 * normalizer, pre-tokenizer, decoder, post-processor and added-token option forge implements,
 * checked against HF tokenizers on generated strings (ids, decode, streaming). The real
 * files only exercise some of them. */
#include "tok_util.h"

#include <set>

namespace {

cJSON *parse(const char *s) {
    cJSON *o = cJSON_Parse(s);
    EXPECT_NE(o, nullptr) << s;
    return o;
}

void utf8_chars(const std::string &s, std::vector<std::string> *out) {
    for (size_t i = 0; i < s.size();) {
        unsigned char c = (unsigned char)s[i];
        size_t l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        out->push_back(s.substr(i, l));
        i += l;
    }
}

std::string bytelevel(const std::string &s) {
    std::string o;
    for (unsigned char b : s) {
        uint32_t cp = ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) ? b : b <= 32 ? 256 + b : b <= 160 ? 289 + (b - 127) : 323;
        ft::put_cp(o, cp);
    }
    return o;
}

struct Spec {
    const char *name;
    bool byte_level;         /* vocab in the byte-level alphabet */
    bool byte_fallback;
    bool drop_cjk;           /* leave CJK out of the vocab (unk / byte fallback paths) */
    const char *prefix;      /* continuing_subword_prefix or nullptr */
    const char *normalizer, *pre_tokenizer, *post_processor, *decoder, *added;
    bool ignore_merges, fuse_unk;
};

/* Writes DIR/tokenizer.json for a spec: a character vocabulary built from the texts, byte
 * tokens, a few merge chains, the spec's components. */
std::string make_tokenizer(const Spec &sp, const std::vector<std::string> &texts) {
    std::string dir = ft::tmpdir(std::string("tokc_") + sp.name);
    cJSON *vocab = cJSON_CreateObject(), *merges = cJSON_CreateArray();
    std::set<std::string> seen;
    int next = 0;
    auto add = [&](const std::string &p) {
        if (p.empty() || seen.count(p)) return;
        seen.insert(p);
        cJSON_AddNumberToObject(vocab, p.c_str(), next++);
    };
    add("<unk>");
    add("<s>");
    add("</s>");
    for (int b = 0; b < 256; b++) {
        char t[8];
        snprintf(t, sizeof t, "<0x%02X>", b);
        if (!sp.byte_level) add(t);
        else add(bytelevel(std::string(1, (char)b)));
    }
    add("\xe2\x96\x81");
    std::set<std::string> chars;
    for (const auto &t : texts) {
        std::vector<std::string> cs;
        utf8_chars(t, &cs);
        for (auto &c : cs) chars.insert(c);
    }
    for (const auto &c : chars) {
        unsigned char c0 = (unsigned char)c[0];
        if (sp.byte_level || c == "\x7f") continue;
        if (sp.drop_cjk && c0 >= 0xE3 && c0 <= 0xED) continue;
        add(c);
        if (sp.prefix) add(sp.prefix + c);
    }
    const char *words[] = {"the", "The", "hello", "Hello", "world", "ing", "er", "in", "12", "000", "▁the", "▁a", "▁Hello", "▁world",
                           " the", " a", " world", "don't", "'s", "  ", "\n\n", "你好", "😀", "...", "ab", "abc", "aaa"};
    std::set<std::string> merged;
    for (const char *w : words) {
        std::vector<std::string> cs;
        utf8_chars(sp.byte_level ? bytelevel(w) : std::string(w), &cs);
        for (int chain = 0; chain < (sp.prefix ? 2 : 1); chain++) {
            std::string pre = chain ? sp.prefix : "";
            std::string acc = pre + cs[0];
            add(acc);
            for (size_t i = 1; i < cs.size(); i++) {
                std::string right = (sp.prefix ? sp.prefix : "") + cs[i];
                add(right);
                std::string key = acc + " " + right;
                std::string res = acc + cs[i];
                if (!merged.count(key)) {
                    merged.insert(key);
                    add(res);
                    cJSON *pair = cJSON_CreateArray();
                    cJSON_AddItemToArray(pair, cJSON_CreateString(acc.c_str()));
                    cJSON_AddItemToArray(pair, cJSON_CreateString(right.c_str()));
                    cJSON_AddItemToArray(merges, pair);
                }
                acc = res;
            }
        }
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *added = sp.added ? parse(sp.added) : cJSON_CreateArray();
    /* added tokens not in the vocabulary get the ids after it */
    cJSON *it;
    cJSON_ArrayForEach(it, added) {
        const char *c = cJSON_GetObjectItem(it, "content")->valuestring;
        cJSON *v = cJSON_GetObjectItemCaseSensitive(vocab, c);
        cJSON_AddNumberToObject(it, "id", v ? v->valuedouble : next++);
    }
    cJSON_AddItemToObject(root, "added_tokens", added);
    auto comp = [&](const char *key, const char *js) {
        if (js) cJSON_AddItemToObject(root, key, parse(js));
        else cJSON_AddNullToObject(root, key);
    };
    comp("normalizer", sp.normalizer);
    comp("pre_tokenizer", sp.pre_tokenizer);
    comp("post_processor", sp.post_processor);
    comp("decoder", sp.decoder);
    cJSON *model = cJSON_CreateObject();
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    if (sp.byte_level) cJSON_AddNullToObject(model, "unk_token");
    else cJSON_AddStringToObject(model, "unk_token", "<unk>");
    if (sp.prefix) cJSON_AddStringToObject(model, "continuing_subword_prefix", sp.prefix);
    else cJSON_AddNullToObject(model, "continuing_subword_prefix");
    cJSON_AddNullToObject(model, "end_of_word_suffix");
    cJSON_AddBoolToObject(model, "fuse_unk", sp.fuse_unk);
    cJSON_AddBoolToObject(model, "byte_fallback", sp.byte_fallback);
    cJSON_AddBoolToObject(model, "ignore_merges", sp.ignore_merges);
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", merges);
    cJSON_AddItemToObject(root, "model", model);
    char *js = cJSON_PrintUnformatted(root);
    ft::write_file(dir + "/tokenizer.json", js, strlen(js));
    cJSON_free(js);
    cJSON_Delete(root);
    return dir;
}

const char *kAdded =
    "[{\"content\":\"<s>\",\"special\":true,\"lstrip\":false,\"rstrip\":false,\"single_word\":false,\"normalized\":false},"
    "{\"content\":\"</s>\",\"special\":true,\"lstrip\":false,\"rstrip\":false,\"single_word\":false,\"normalized\":false},"
    "{\"content\":\"<sep>\",\"special\":true,\"lstrip\":true,\"rstrip\":true,\"single_word\":false,\"normalized\":false},"
    "{\"content\":\"[m]\",\"special\":false,\"lstrip\":false,\"rstrip\":true,\"single_word\":false,\"normalized\":false},"
    "{\"content\":\"hello\",\"special\":false,\"lstrip\":false,\"rstrip\":false,\"single_word\":true,\"normalized\":true},"
    "{\"content\":\"World\",\"special\":false,\"lstrip\":true,\"rstrip\":false,\"single_word\":false,\"normalized\":false},"
    "{\"content\":\"<sep>x\",\"special\":false,\"lstrip\":false,\"rstrip\":false,\"single_word\":false,\"normalized\":false}]";

const char *kTemplate =
    "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},"
    "{\"SpecialToken\":{\"id\":\"</s>\",\"type_id\":0}}],\"pair\":[{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"Sequence\":{\"id\":\"B\",\"type_id\":1}}],"
    "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]},\"</s>\":{\"id\":\"</s>\",\"ids\":[2],\"tokens\":[\"</s>\"]}}}";

const Spec kSpecs[] = {
    {"llama2_legacy", false, true, false, nullptr,
     "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"▁\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"▁\"}]}",
     nullptr, kTemplate,
     "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"▁\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},"
     "{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]}",
     kAdded, false, false},
    {"metaspace_first", false, false, true, nullptr, nullptr,
     "{\"type\":\"Metaspace\",\"replacement\":\"▁\",\"prepend_scheme\":\"first\",\"split\":true}", kTemplate,
     "{\"type\":\"Metaspace\",\"replacement\":\"▁\",\"prepend_scheme\":\"first\",\"split\":true}", kAdded, false, true},
    {"metaspace_always_nosplit", false, true, false, nullptr, "{\"type\":\"NFKC\"}",
     "{\"type\":\"Metaspace\",\"replacement\":\"▁\",\"add_prefix_space\":true}", nullptr,
     "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},{\"type\":\"Metaspace\",\"replacement\":\"▁\",\"add_prefix_space\":true}]}",
     kAdded, false, false},
    {"nfd_lower_strip_ws", false, false, true, nullptr,
     "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFD\"},{\"type\":\"StripAccents\"},{\"type\":\"Lowercase\"},"
     "{\"type\":\"Strip\",\"strip_left\":true,\"strip_right\":true}]}",
     "{\"type\":\"WhitespaceSplit\"}", nullptr, nullptr, kAdded, false, false},
    {"nfkd_digits_punct_whitespace", false, true, false, nullptr,
     "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFKD\"},{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"\\\\s+\"},\"content\":\" \"}]}",
     "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":true},{\"type\":\"Punctuation\",\"behavior\":\"Contiguous\"},"
     "{\"type\":\"Whitespace\"}]}",
     kTemplate,
     "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\"e\",\"start\":2,\"stop\":0}]}",
     kAdded, false, false},
    {"split_behaviors", false, true, false, nullptr, "{\"type\":\"NFC\"}",
     "{\"type\":\"Sequence\",\"pretokenizers\":["
     "{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"MergedWithPrevious\",\"invert\":false},"
     "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\d+\"},\"behavior\":\"MergedWithNext\",\"invert\":false},"
     "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[aeiouAEIOU]\"},\"behavior\":\"Contiguous\",\"invert\":false},"
     "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{P}\"},\"behavior\":\"Removed\",\"invert\":false},"
     "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[^\\\\s\\\\w]+|x\"},\"behavior\":\"Isolated\",\"invert\":true},"
     "{\"type\":\"Digits\",\"individual_digits\":false}]}",
     nullptr, "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"[0-9]\"},\"content\":\"#\"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]}",
     kAdded, false, false},
    {"bytelevel_prefix", true, false, false, nullptr, "{\"type\":\"Lowercase\"}",
     "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true}",
     "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":false,\"use_regex\":true}",
     "{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true}", kAdded, true, false},
    {"bytelevel_noregex_split", true, false, false, nullptr, nullptr,
     "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t)|\\\\p{L}+|\\\\p{N}{1,2}|\\\\s+(?!\\\\S)|\\\\s+|[^\\\\s\\\\p{L}\\\\p{N}]+\"},"
     "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}]}",
     kTemplate, "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}", kAdded, false, false},
    {"wordpiece_prefix", false, true, false, "##", nullptr, "{\"type\":\"Whitespace\"}", nullptr, nullptr, kAdded, false, false},
};

} // namespace

TEST(TokComponents, SyntheticTokenizersMatchHF) {
    int idx = 0;
    for (const Spec &sp : kSpecs) {
        std::vector<std::string> specials = {"<s>", "</s>", "<sep>", "[m]", "hello", "World", "<sep>x", " <sep> ", "hello_", "xhello"};
        std::vector<std::string> texts = ft::gen_strings(7000 + (uint32_t)idx++, 300, specials);
        texts.push_back("");
        texts.push_back(" ");
        texts.push_back("hello hello, hello");
        texts.push_back("  <sep>  World  [m]   x");
        std::string dir = make_tokenizer(sp, texts);
        forge_model *m = ft::load_vocab(dir);
        ASSERT_NE(m, nullptr) << sp.name;
        for (int special = 0; special < 2; special++) {
            ft::OracleResult hf;
            ASSERT_TRUE(ft::oracle(dir, texts, special, &hf)) << sp.name;
            size_t ok = 0, shown = 0;
            for (size_t i = 0; i < texts.size(); i++) {
                std::vector<int32_t> ids = ft::encode(m, texts[i], special ? FORGE_TOKENIZE_ADD_SPECIAL : 0);
                std::string dec = ft::decode(m, ids);
                bool a = ids == hf.ids[i], b = dec == hf.decoded[i], c = ft::decode_stream(m, ids) == dec;
                ok += a && b && c;
                if ((!a || !b || !c) && shown++ < 3)
                    ADD_FAILURE() << sp.name << (special ? " +special" : "") << " #" << i << " " << ft::show_str(texts[i])
                                  << "\n  hf    " << ft::show_ids(hf.ids[i]) << "\n  forge " << ft::show_ids(ids) << "\n  hf decoded    "
                                  << ft::show_str(hf.decoded[i]) << "\n  forge decoded " << ft::show_str(dec) << (c ? "" : "\n  stream differs");
            }
            printf("[ components ] %s%s: %zu/%zu\n", sp.name, special ? " +special" : "", ok, texts.size());
            EXPECT_EQ(ok, texts.size()) << sp.name;
        }
        forge_model_free(m);
    }
}
