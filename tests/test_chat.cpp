/* Chat templates: forge's native renderings against what transformers' apply_chat_template
 * renders from the real tokenizer_config.json files (tests/fixtures/chat, made by
 * tools/fixtures/make_chat_fixtures.py), with the real tokenizers loaded vocab-only; and a
 * multi-turn chat on a model whose cache then holds the earlier turns. */
#include "internal.h"
#include "tok_util.h"

namespace {

forge_model *vocab(const std::string &dir) {
    forge_model_params p = forge_model_default_params();
    p.vocab_only = 1;
    forge_model *m = nullptr;
    if (forge_model_load(dir.c_str(), &p, &m) != FORGE_OK) {
        ADD_FAILURE() << forge_model_errmsg(m);
        forge_model_free(m);
        return nullptr;
    }
    return m;
}

/* One of the shared tokenizers with some of its special tokens renamed (in tokenizer.json and
 * tokenizer_config.json): the vocabulary of a family whose own tokenizer is not here, as far as
 * chat needs it. */
forge_model *renamed_vocab(const std::string &data, const std::string &base, const std::string &name,
                           const std::vector<std::pair<std::string, std::string>> &renames) {
    std::string dir = ft::tmpdir(name);
    for (const char *f : {"tokenizer.json", "tokenizer_config.json"}) {
        std::vector<uint8_t> b = ft::read_file(data + "/" + base + "/" + f);
        std::string t(b.begin(), b.end());
        for (const auto &[from, to] : renames)
            for (size_t at = t.find(from); at != std::string::npos; at = t.find(from, at + to.size())) t.replace(at, from.size(), to);
        ft::write_file(dir + "/" + f, t.data(), t.size());
    }
    return vocab(dir);
}

/* Gemma 4's: Gemma 3's tokenizer (the same 262144 entries) with ids 105 / 106 under Gemma 4's
 * names <|turn> / <turn|>, and id 50 as its <|tool_response>. */
forge_model *gemma4_vocab(const std::string &data) {
    return renamed_vocab(data, "gemma3", "gemma4_vocab",
                         {{"<start_of_turn>", "<|turn>"}, {"<end_of_turn>", "<turn|>"}, {"<unused44>", "<|tool_response>"}});
}

/* Mistral's: Gemma 2's tokenizer with its <s> / </s> (ids 204 / 213, HTML tags there) as BOS and
 * EOS, and ids 106 / 107 named [INST] / [/INST], the control tokens of v0.3's and Nemo's. */
forge_model *mistral_vocab(const std::string &data) {
    return renamed_vocab(data, "gemma2", "mistral_vocab",
                         {{"<start_of_turn>", "[INST]"},
                          {"<end_of_turn>", "[/INST]"},
                          {"\"bos_token\": \"<bos>\"", "\"bos_token\": \"<s>\""},
                          {"\"eos_token\": \"<eos>\"", "\"eos_token\": \"</s>\""}});
}

/* The tokenizer a family's cases are read with: its own, or one with its special tokens' names. */
forge_model *family_vocab(const std::string &fam, const std::string &data) {
    if (fam.rfind("gemma4", 0) == 0) return gemma4_vocab(data);
    if (fam.rfind("mistral", 0) == 0) return mistral_vocab(data);
    if (fam.rfind("qwen3.5", 0) == 0) return vocab(data + "/qwen3");
    return vocab(data + "/" + (fam == "llama3.2" ? std::string("llama3") : fam));
}

std::string chat_fixture(const std::string &name) {
    std::vector<uint8_t> b = ft::read_file(ft::src("tests/fixtures/chat/" + name));
    return std::string(b.begin(), b.end());
}

/* What tells forge the 12B / 26B-A4B / 31B template from the E2B / E4B one: the line that writes
 * an empty thought block after the reply's opening (the chat fixtures name both files by sha256). */
const char *const kGemma4LargeTemplateLine = "{{- '<|turn>model\\n' -}}\n        {%- if not enable_thinking -%}\n"
                                             "            {{- '<|channel>thought\\n<channel|>' -}}\n        {%- endif -%}";

/* Renders msgs with the committed template `name` in place of the model's own (which it leaves
 * without one); the text to *out. */
forge_status render_with(forge_model *m, const std::string &name, const forge_chat_message *msgs, int n, std::string *out) {
    std::string t = chat_fixture(name);
    std::vector<char> buf(4096);
    size_t len = 0;
    ft_model_set_chat_template(m, t.c_str());
    forge_status st = forge_chat_render(m, msgs, n, 0, buf.data(), buf.size(), &len);
    ft_model_set_chat_template(m, nullptr);
    out->assign(buf.data(), st == FORGE_OK ? len : 0);
    return st;
}

/* Qwen 3.6's template is the Qwen 3.5 4B-and-larger one with this condition on a reply's think
 * block (and another rendering of tool-call arguments); without preserve_thinking it renders the same. */
std::string qwen36_template() {
    std::string t = chat_fixture("qwen3.5-27b.jinja");
    const std::string from = "{%- if loop.index0 > ns.last_query_index %}";
    size_t at = t.find(from);
    if (at != std::string::npos)
        t.replace(at, from.size(),
                  "{%- if (preserve_thinking is defined and preserve_thinking is true) or (loop.index0 > ns.last_query_index) %}");
    return t;
}

} // namespace

/* Llama 3.2 Instruct's chat template, as published (tests/fixtures/chat/README.md). */
const std::string &llama32_template() {
    static const std::string t = chat_fixture("llama3.2-instruct.jinja");
    return t;
}

/* Every case of the fixture file on the tokenizer of its family (family_vocab) with the template
 * it was rendered from: forge's rendering byte for byte, or the template's own exception message.
 * The Qwen 3.5 4B-and-larger cases are rendered once more from Qwen 3.6's template. */
TEST(Chat, TemplatesMatchTransformers) {
    std::string data = ft::tok_data();
    ASSERT_FALSE(data.empty());
    std::vector<uint8_t> js = ft::read_file(ft::src("tests/fixtures/chat/chat_templates.json"));
    cJSON *root = cJSON_ParseWithLength((const char *)js.data(), js.size());
    ASSERT_TRUE(cJSON_IsArray(root));
    std::map<std::string, forge_model *> models;
    std::map<std::string, std::string> templates; /* the committed templates the cases name; the models point into them */
    const std::string qwen36 = qwen36_template();
    auto render = [](forge_model *m, const char *date, const std::vector<forge_chat_message> &msgs, uint32_t flags, std::string *out) {
        std::vector<char> buf(1 << 16);
        size_t len = 0;
        forge_status st;
        if (date) { /* llama3.2: rendered on the date the fixture records */
            char *text = nullptr;
            st = ft_chat_render_on(m, date, msgs.data(), (int)msgs.size(), NULL, 0, flags, &text, &len);
            if (text) out->assign(text, len);
            free(text);
        } else {
            st = forge_chat_render(m, msgs.data(), (int)msgs.size(), flags, buf.data(), buf.size(), &len);
            if (st == FORGE_OK) out->assign(buf.data(), len);
        }
        return st;
    };
    int checked = 0, checked36 = 0;
    cJSON *c;
    cJSON_ArrayForEach(c, root) {
        std::string fam = cJSON_GetStringValue(cJSON_GetObjectItem(c, "family"));
        const char *date = cJSON_GetStringValue(cJSON_GetObjectItem(c, "date"));
        const char *tname = cJSON_GetStringValue(cJSON_GetObjectItem(c, "template"));
        if (!models.count(fam)) {
            models[fam] = family_vocab(fam, data);
            if (tname && models[fam]) ft_model_set_chat_template(models[fam], (templates[tname] = chat_fixture(tname)).c_str());
            if (fam == "gemma4-large" && models[fam]) ft_model_set_chat_template(models[fam], kGemma4LargeTemplateLine);
            if (fam == "qwen3.5-think") {
                models["qwen3.6"] = vocab(data + "/qwen3");
                if (models["qwen3.6"]) ft_model_set_chat_template(models["qwen3.6"], qwen36.c_str());
            }
        }
        forge_model *m = models[fam];
        ASSERT_NE(m, nullptr);
        std::vector<forge_chat_message> msgs;
        cJSON *mj;
        cJSON_ArrayForEach(mj, cJSON_GetObjectItem(c, "messages"))
            msgs.push_back({sizeof(forge_chat_message), cJSON_GetStringValue(cJSON_GetObjectItem(mj, "role")), cJSON_GetStringValue(cJSON_GetObjectItem(mj, "content"))});
        uint32_t flags = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")) ? 0 : FORGE_CHAT_NO_GENERATION_PROMPT;
        cJSON *think = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "kwargs"), "enable_thinking");
        if (cJSON_IsFalse(think)) flags |= FORGE_CHAT_THINKING_OFF;
        if (cJSON_IsTrue(think)) flags |= FORGE_CHAT_THINKING_ON;
        std::string out;
        forge_status st = render(m, date, msgs, flags, &out);
        std::string what = fam + " case " + std::to_string(checked) + " " + cJSON_GetStringValue(cJSON_GetObjectItem(c, "name"));
        if (cJSON *r = cJSON_GetObjectItem(c, "rendered"); cJSON_IsString(r)) {
            ASSERT_EQ(st, FORGE_OK) << what << ": " << forge_model_errmsg(m);
            EXPECT_EQ(out, r->valuestring) << what;
        } else {
            EXPECT_EQ(st, FORGE_ERR_INVALID_ARGUMENT) << what;
            EXPECT_NE(std::string(forge_model_errmsg(m)).find(cJSON_GetStringValue(cJSON_GetObjectItem(c, "error"))), std::string::npos)
                << what << ": " << forge_model_errmsg(m);
        }
        if (fam == "qwen3.5-think") {
            std::string out36;
            EXPECT_EQ(render(models["qwen3.6"], nullptr, msgs, flags, &out36), st) << what << " (Qwen 3.6)";
            EXPECT_EQ(out36, out) << what << " (Qwen 3.6)";
            checked36++;
        }
        checked++;
    }
    EXPECT_EQ(checked, 277);
    EXPECT_EQ(checked36, 34);
    for (auto &kv : models) forge_model_free(kv.second);
    cJSON_Delete(root);
}

TEST(Chat, BufferTooSmallAndNoFormat) {
    std::string data = ft::tok_data();
    ASSERT_FALSE(data.empty());
    forge_model *m = vocab(data + "/gemma3");
    ASSERT_NE(m, nullptr);
    /* <end_of_turn> ends a Gemma reply */
    for (const char *fam : {"gemma3", "gemma2"}) {
        forge_model *g = vocab(data + "/" + fam);
        ASSERT_NE(g, nullptr);
        forge_special_tokens sp = ft::sized<forge_special_tokens>();
        ASSERT_EQ(forge_model_special_tokens(g, &sp), FORGE_OK);
        int32_t eot = forge_token_id(g, "<end_of_turn>");
        bool ends = false;
        for (int i = 0; i < sp.n_eos; i++) ends |= sp.eos_ids[i] == eot;
        EXPECT_TRUE(ends) << fam;
        forge_model_free(g);
    }
    forge_chat_message msg = {sizeof(forge_chat_message), "user", "Hello"};
    size_t len = 0;
    char small[8];
    EXPECT_EQ(forge_chat_render(m, &msg, 1, 0, small, sizeof small, &len), FORGE_ERR_BUFFER_TOO_SMALL);
    EXPECT_EQ(len, strlen("<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n"));
    forge_chat_message bad[2] = {{sizeof(forge_chat_message), "user", "a"}, {sizeof(forge_chat_message), "user", "b"}};
    std::vector<char> out(256);
    EXPECT_EQ(forge_chat_render(m, bad, 2, 0, out.data(), out.size(), &len), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_model_errmsg(m)).find("must alternate"), std::string::npos);
    forge_model_free(m);
    forge_model *s = vocab(ft::src("models/stories260K/stories260K.gguf"));
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(forge_chat_render(s, &msg, 1, 0, out.data(), out.size(), &len), FORGE_ERR_UNSUPPORTED);
    forge_model_free(s);
}

/* Gemma 4: <turn|> ends a reply; what its template would drop without a word is refused by
 * name (a tool result with no tool call to follow: forge's messages carry no tool calls), and
 * the two thinking flags together are a contradiction. */
TEST(Chat, Gemma4EndOfTurnAndRefusals) {
    std::string data = ft::tok_data();
    ASSERT_FALSE(data.empty());
    forge_model *m = gemma4_vocab(data);
    ASSERT_NE(m, nullptr);
    forge_special_tokens sp = ft::sized<forge_special_tokens>();
    ASSERT_EQ(forge_model_special_tokens(m, &sp), FORGE_OK);
    bool ends = false, hands_over = false; /* <|tool_response>: the model's call waits for its results */
    for (int i = 0; i < sp.n_eos; i++) ends |= sp.eos_ids[i] == forge_token_id(m, "<turn|>"), hands_over |= sp.eos_ids[i] == 50;
    EXPECT_TRUE(ends);
    EXPECT_TRUE(hands_over);
    EXPECT_EQ(forge_token_id(m, "<turn|>"), 106);
    EXPECT_EQ(forge_token_id(m, "<|tool_response>"), 50);
    std::vector<char> out(512);
    size_t len = 0;
    /* a tool result that follows no call is left out, as the template leaves it */
    forge_chat_message tool[3] = {{sizeof(forge_chat_message), "user", "Weather?"}, {sizeof(forge_chat_message), "assistant", "Let me check."}, {sizeof(forge_chat_message), "tool", "sunny"}};
    ASSERT_EQ(forge_chat_render(m, tool, 3, 0, out.data(), out.size(), &len), FORGE_OK) << forge_model_errmsg(m);
    EXPECT_EQ(std::string(out.data(), len), "<bos><|turn>user\nWeather?<turn|>\n<|turn>model\nLet me check.<turn|>\n<|turn>model\n");
    forge_chat_message hi = {sizeof(forge_chat_message), "user", "Hi"};
    EXPECT_EQ(forge_chat_render(m, &hi, 1, FORGE_CHAT_THINKING_ON | FORGE_CHAT_THINKING_OFF, out.data(), out.size(), &len),
              FORGE_ERR_INVALID_ARGUMENT);
    ASSERT_EQ(forge_chat_render(m, &hi, 1, FORGE_CHAT_THINKING_OFF, out.data(), out.size(), &len), FORGE_OK); /* its default */
    EXPECT_EQ(std::string(out.data(), len), "<bos><|turn>user\nHi<turn|>\n<|turn>model\n");
    forge_model_free(m);
    /* and Qwen 3 takes THINKING_ON as its default */
    forge_model *q = vocab(data + "/qwen3");
    ASSERT_NE(q, nullptr);
    ASSERT_EQ(forge_chat_render(q, &hi, 1, FORGE_CHAT_THINKING_ON, out.data(), out.size(), &len), FORGE_OK);
    EXPECT_EQ(std::string(out.data(), len), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    forge_model_free(q);
}

/* Mistral: </s> ends a reply; the [INST] templates are known by their text alone (without one
 * the tokenizer names no format); what the templates cannot render from no messages is refused
 * (messages[0] fails there), while v0.1's and v0.2's first templates write just BOS. */
TEST(Chat, MistralByTemplate) {
    std::string data = ft::tok_data();
    ASSERT_FALSE(data.empty());
    forge_model *m = mistral_vocab(data);
    ASSERT_NE(m, nullptr);
    forge_special_tokens sp = ft::sized<forge_special_tokens>();
    ASSERT_EQ(forge_model_special_tokens(m, &sp), FORGE_OK);
    EXPECT_EQ(sp.bos, forge_token_id(m, "<s>"));
    bool ends = false;
    for (int i = 0; i < sp.n_eos; i++) ends |= sp.eos_ids[i] == forge_token_id(m, "</s>");
    EXPECT_TRUE(ends);
    EXPECT_EQ(forge_token_id(m, "[INST]"), 106);
    forge_chat_message hi = {sizeof(forge_chat_message), "user", "Hi"};
    std::vector<char> out(512);
    size_t len = 0;
    ft_model_set_chat_template(m, nullptr);
    EXPECT_EQ(forge_chat_render(m, &hi, 1, 0, out.data(), out.size(), &len), FORGE_ERR_UNSUPPORTED);
    std::string text;
    for (const char *name : {"mistral-7b-instruct-v0.2-system.jinja", "mistral-7b-instruct-v0.3.jinja", "mistral-nemo-instruct-2407.jinja"})
        EXPECT_EQ(render_with(m, name, nullptr, 0, &text), FORGE_ERR_INVALID_ARGUMENT) << name;
    for (const char *name : {"mistral-7b-instruct-v0.1.jinja", "mistral-7b-instruct-v0.2.jinja"}) {
        ASSERT_EQ(render_with(m, name, nullptr, 0, &text), FORGE_OK) << name;
        EXPECT_EQ(text, "<s>") << name;
    }
    forge_model_free(m);
}

/* Qwen 3.5's two templates told apart by their thinking default (the fixtures render both), its
 * refusal of an empty conversation (which transformers cannot render: no fixture), and
 * Qwen 3's tool-result test exactly as Python's startswith/endswith: a user message of just the
 * two tags (31 bytes) is a tool result, so the reply before it is after the last query (jinja2's
 * rendering of Qwen 3's template). */
TEST(Chat, QwenThinkingDefaultsAndToolResults) {
    std::string data = ft::tok_data();
    ASSERT_FALSE(data.empty());
    forge_model *q = vocab(data + "/qwen3");
    ASSERT_NE(q, nullptr);
    std::vector<char> out(4096);
    size_t len = 0;
    forge_chat_message turns[3] = {{sizeof(forge_chat_message), "user", "Hi"},
                                   {sizeof(forge_chat_message), "assistant", "<think>\nr\n\n</think>\n\n\nA"},
                                   {sizeof(forge_chat_message), "user", "<tool_response></tool_response>"}};
    ASSERT_EQ(forge_chat_render(q, turns, 3, 0, out.data(), out.size(), &len), FORGE_OK); /* Qwen 3's own template */
    EXPECT_EQ(std::string(out.data(), len), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\nA<|im_end|>\n"
                                            "<|im_start|>user\n<tool_response></tool_response><|im_end|>\n<|im_start|>assistant\n");
    forge_chat_message hi = {sizeof(forge_chat_message), "user", "Hi"};
    std::string text;
    EXPECT_EQ(render_with(q, "qwen3.5-0.8b.jinja", nullptr, 0, &text), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_model_errmsg(q)).find("No messages provided."), std::string::npos) << forge_model_errmsg(q);
    for (auto [name, opening] :
         {std::pair<const char *, const char *>{"qwen3.5-0.8b.jinja", "<think>\n\n</think>\n\n"}, {"qwen3.5-27b.jinja", "<think>\n"}}) {
        ASSERT_EQ(render_with(q, name, &hi, 1, &text), FORGE_OK) << name;
        EXPECT_EQ(text, std::string("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n") + opening) << name;
    }
    forge_model_free(q);
}

/* Llama 3.1+ templates write "Today Date": today (local time, "%d %b %Y" in English) when the
 * template calls strftime_now, as Llama 3.2's does; the date_string it sets otherwise, as 3.1's
 * and 3.3's do. */
TEST(Chat, Llama31DateLine) {
    std::string data = ft::tok_data();
    ASSERT_FALSE(data.empty());
    forge_model *m = vocab(data + "/llama3");
    ASSERT_NE(m, nullptr);
    auto today = [] {
        static const char *mon[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
        time_t now = time(nullptr);
        struct tm tm;
        localtime_r(&now, &tm);
        char b[32];
        snprintf(b, sizeof b, "%02d %s %04d", tm.tm_mday, mon[tm.tm_mon], tm.tm_year + 1900);
        return std::string(b);
    };
    auto date_line = [&](const std::string &tmpl) {
        ft_model_set_chat_template(m, tmpl.c_str());
        forge_chat_message msg = {sizeof(forge_chat_message), "user", "Hi"};
        std::vector<char> out(4096);
        size_t len = 0;
        EXPECT_EQ(forge_chat_render(m, &msg, 1, 0, out.data(), out.size(), &len), FORGE_OK) << forge_model_errmsg(m);
        std::string r(out.data(), len);
        size_t at = r.find("Today Date: ");
        return at == std::string::npos ? std::string("(none)") : r.substr(at + 12, r.find('\n', at) - at - 12);
    };
    std::string before = today(), got = date_line(llama32_template()), after = today();
    EXPECT_TRUE(got == before || got == after) << got << " vs " << before;
    /* 3.1 / 3.3 style: a fixed date_string, no strftime_now */
    std::string fixed = llama32_template();
    size_t a = fixed.find("{%- if not date_string is defined %}"), b = fixed.find("{%- if not tools is defined %}");
    ASSERT_TRUE(a != std::string::npos && b != std::string::npos);
    fixed.replace(a, b - a, "{%- if not date_string is defined %}\n    {%- set date_string = \"14 Mar 2025\" %}\n{%- endif %}\n");
    EXPECT_EQ(date_line(fixed), "14 Mar 2025");
    ft_model_set_chat_template(m, nullptr);
    forge_model_free(m);
}

/* A random-weight f16 checkpoint of the given family beside a real tokenizer: hidden 32, one
 * layer, vocab of the tokenizer. (tests/test_cli_chat.cpp chats with it through the CLI.) */
std::string chat_model(const std::string &family, const std::string &data) {
    std::string dir = ft::tmpdir("chat_" + family);
    if (ft::sh("cp " + data + "/" + family + "/tokenizer.json " + data + "/" + family + "/tokenizer_config.json " + dir + "/") != 0) return "";
    bool gemma = family == "gemma3";
    const int V = gemma ? 262144 : 128256, H = 32, D = 16;
    std::string cfg = gemma ? "{\"model_type\":\"gemma3_text\",\"hidden_size\":32,\"num_hidden_layers\":1,\"num_attention_heads\":2,"
                              "\"num_key_value_heads\":1,\"head_dim\":16,\"intermediate_size\":64,\"vocab_size\":262144,"
                              "\"max_position_embeddings\":512,\"sliding_window\":512,\"layer_types\":[\"sliding_attention\"],"
                              "\"query_pre_attn_scalar\":16,\"rms_norm_eps\":1e-6,\"torch_dtype\":\"float16\"}"
                            : "{\"model_type\":\"llama\",\"hidden_size\":32,\"num_hidden_layers\":1,\"num_attention_heads\":2,"
                              "\"num_key_value_heads\":1,\"intermediate_size\":64,\"vocab_size\":128256,\"max_position_embeddings\":512,"
                              "\"rms_norm_eps\":1e-5,\"rope_theta\":500000.0,\"tie_word_embeddings\":true,\"torch_dtype\":\"float16\"}";
    ft::write_file(dir + "/config.json", cfg.data(), cfg.size());
    struct T { std::string name; std::vector<int64_t> shape; };
    std::string p = "model.layers.0.";
    std::vector<T> ts = {{"model.embed_tokens.weight", {V, H}}, {"model.norm.weight", {H}}, {p + "input_layernorm.weight", {H}},
                         {p + "post_attention_layernorm.weight", {H}}, {p + "self_attn.q_proj.weight", {2 * D, H}},
                         {p + "self_attn.k_proj.weight", {D, H}}, {p + "self_attn.v_proj.weight", {D, H}},
                         {p + "self_attn.o_proj.weight", {H, 2 * D}}, {p + "mlp.gate_proj.weight", {64, H}},
                         {p + "mlp.up_proj.weight", {64, H}}, {p + "mlp.down_proj.weight", {H, 64}}};
    if (gemma)
        for (std::string n : {"pre_feedforward_layernorm", "post_feedforward_layernorm"}) ts.push_back({p + n + ".weight", {H}});
    if (gemma)
        for (std::string n : {"self_attn.q_norm", "self_attn.k_norm"}) ts.push_back({p + n + ".weight", {D}});
    std::string hdr = "{";
    std::vector<uint8_t> body;
    uint32_t seed = 1;
    for (auto &t : ts) {
        size_t n = 1;
        for (auto d : t.shape) n *= (size_t)d;
        std::vector<float> v = ft::randn(n, 0.2f, seed++);
        std::vector<uint8_t> d(n * 2);
        for (size_t i = 0; i < n; i++) {
            uint16_t h = ft_f32_to_f16(v[i]);
            memcpy(&d[2 * i], &h, 2);
        }
        hdr += (hdr.size() > 1 ? "," : "") + std::string("\"") + t.name + "\":{\"dtype\":\"F16\",\"shape\":[";
        for (size_t i = 0; i < t.shape.size(); i++) hdr += (i ? "," : "") + std::to_string(t.shape[i]);
        hdr += "],\"data_offsets\":[" + std::to_string(body.size()) + "," + std::to_string(body.size() + d.size()) + "]}";
        body.insert(body.end(), d.begin(), d.end());
    }
    hdr += "}";
    std::vector<uint8_t> file;
    for (int i = 0; i < 8; i++) file.push_back((uint8_t)((uint64_t)hdr.size() >> (8 * i)));
    file.insert(file.end(), hdr.begin(), hdr.end());
    file.insert(file.end(), body.begin(), body.end());
    ft::write_file(dir + "/model.safetensors", file.data(), file.size());
    return dir;
}

/* A conversation on random-weight models with the real Llama 3 and Gemma 3 tokenizers: the
 * second turn re-prefills only what is new; the family's end-of-turn token ends replies. */
class ChatModel : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatModel, MultiTurnReusesTheCache) {
    std::string data = ft::tok_data();
    ASSERT_FALSE(data.empty());
    std::string dir = chat_model(GetParam(), data);
    ASSERT_FALSE(dir.empty());
    forge_model *m = ft::load(dir);
    ASSERT_NE(m, nullptr);
    forge_session *s = nullptr;
    ASSERT_EQ(forge_session_create(m, nullptr, &s), FORGE_OK);
    forge_generate_params p = forge_generate_default_params();
    p.max_tokens = 6;
    std::string reply;
    p.on_token = [](void *u, int32_t, const char *t, size_t n) { ((std::string *)u)->append(t, n); return 0; };
    p.user_data = &reply;
    forge_chat_message turn1[1] = {{sizeof(forge_chat_message), "user", "Hello there!"}};
    forge_metrics m1 = ft::sized<forge_metrics>(), m2 = ft::sized<forge_metrics>();
    ASSERT_EQ(forge_chat(s, turn1, 1, 0, &p, &m1), FORGE_OK) << forge_session_errmsg(s);
    EXPECT_EQ(m1.cached_tokens, 0);
    EXPECT_GT(m1.prompt_tokens, 5);
    forge_chat_message turn2[3] = {{sizeof(forge_chat_message), "user", "Hello there!"}, {sizeof(forge_chat_message), "assistant", reply.c_str()}, {sizeof(forge_chat_message), "user", "Tell me more."}};
    std::string reply2;
    p.user_data = &reply2;
    ASSERT_EQ(forge_chat(s, turn2, 3, 0, &p, &m2), FORGE_OK) << forge_session_errmsg(s);
    EXPECT_GE(m2.cached_tokens, m1.prompt_tokens); /* the whole first prompt (and what of the reply tokenizes the same) */
    EXPECT_GT(m2.prompt_tokens, m2.cached_tokens);
    EXPECT_EQ(m2.prompt_cache_hits, 1u);
    forge_special_tokens sp = ft::sized<forge_special_tokens>();
    ASSERT_EQ(forge_model_special_tokens(m, &sp), FORGE_OK);
    int32_t eot = forge_token_id(m, GetParam() == "gemma3" ? "<end_of_turn>" : "<|eot_id|>");
    EXPECT_EQ(sp.eot, eot);
    bool ends = false;
    for (int i = 0; i < sp.n_eos; i++) ends |= sp.eos_ids[i] == eot;
    EXPECT_TRUE(ends);
    forge_session_free(s);
    forge_model_free(m);
}

INSTANTIATE_TEST_SUITE_P(Families, ChatModel, ::testing::Values("llama3", "gemma3"));

/* The examples (examples/generate.c, the README's, and examples/chat.cpp), built beside the
 * tests, chat on a model that has a template: two turns in chat.cpp, the second prefilling only
 * what is new. (On the bundled story model they stream and say it has no template:
 * tests/test_generate.cpp.) */
TEST(Examples, ChatOnAModelWithATemplate) {
    if (!ft::exists("./example_generate") || !ft::exists("./example_chat"))
        GTEST_SKIP() << "no ./example_generate and ./example_chat in the working directory (the build tree)";
    std::string data = ft::tok_data();
    ASSERT_FALSE(data.empty());
    std::string dir = chat_model("llama3", data);
    ASSERT_FALSE(dir.empty());
    for (std::string ex : {"example_generate", "example_chat"}) {
        std::string out = dir + "/" + ex + ".txt";
        std::string cmd = "./" + ex + " " + dir + " Hello > " + out;
        ASSERT_EQ(system(cmd.c_str()), 0) << cmd;
        std::vector<uint8_t> o = ft::read_file(out);
        std::string text(o.begin(), o.end());
        EXPECT_EQ(text.find("no chat template"), std::string::npos) << text;
        size_t first = text.find("assistant: ");
        ASSERT_NE(first, std::string::npos) << text;
        if (ex == "example_generate") continue;
        ASSERT_NE(text.find("user: Tell me another.\nassistant: "), std::string::npos) << text;
        /* "[P prompt tokens, C of them from the cache]" per turn: none cached in the first, the
         * whole first prompt at least in the second */
        int p1 = 0, c1 = -1, p2 = 0, c2 = 0;
        size_t a = text.find("\n["), b = text.find("\n[", a + 1);
        ASSERT_TRUE(a != std::string::npos && b != std::string::npos) << text;
        ASSERT_EQ(sscanf(text.c_str() + a, "\n[%d prompt tokens, %d", &p1, &c1), 2) << text;
        ASSERT_EQ(sscanf(text.c_str() + b, "\n[%d prompt tokens, %d", &p2, &c2), 2) << text;
        EXPECT_EQ(c1, 0);
        EXPECT_GE(c2, p1);
        EXPECT_GT(p2, c2);
    }
}

namespace {

/* A fixture case's forge input: the tools and each message's calls (their JSON text as the case
 * records it), pointing into the case. */
struct ToolCase {
    std::vector<forge_tool> tools;
    std::vector<std::vector<forge_tool_call>> calls;
    std::vector<forge_chat_message> msgs;
};

ToolCase tool_case(cJSON *c) {
    ToolCase tc;
    cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(c, "forge_tools"))
        tc.tools.push_back({sizeof(forge_tool), cJSON_GetStringValue(cJSON_GetObjectItem(t, "name")),
                            cJSON_GetStringValue(cJSON_GetObjectItem(t, "description")), cJSON_GetStringValue(cJSON_GetObjectItem(t, "parameters"))});
    cJSON *mc;
    cJSON_ArrayForEach(mc, cJSON_GetObjectItem(c, "forge_calls")) {
        tc.calls.emplace_back();
        cJSON *k;
        cJSON_ArrayForEach(k, mc)
            tc.calls.back().push_back({sizeof(forge_tool_call), cJSON_GetStringValue(cJSON_GetObjectItem(k, "name")),
                                       cJSON_GetStringValue(cJSON_GetObjectItem(k, "arguments")), cJSON_GetStringValue(cJSON_GetObjectItem(k, "id"))});
    }
    cJSON *mj;
    size_t i = 0;
    cJSON_ArrayForEach(mj, cJSON_GetObjectItem(c, "messages")) {
        forge_chat_message msg = {sizeof(forge_chat_message), cJSON_GetStringValue(cJSON_GetObjectItem(mj, "role")),
                                  cJSON_GetStringValue(cJSON_GetObjectItem(mj, "content")), nullptr, 0,
                                  cJSON_GetStringValue(cJSON_GetObjectItem(mj, "tool_call_id"))};
        if (!tc.calls[i].empty()) {
            msg.tool_calls = tc.calls[i].data();
            msg.n_tool_calls = (int)tc.calls[i].size();
        }
        tc.msgs.push_back(msg);
        i++;
    }
    return tc;
}

} // namespace

/* tests/fixtures/chat/chat_tools.json (make_chat_fixtures.py --tools: jinja2 set up as
 * transformers sets it up) on Llama 3.2's, Qwen 3's, both Qwen 3.5 templates, Mistral v0.3's,
 * Nemo's and both of Gemma 4's (its declarations' own notation of the schemas, sorted keys, results
 * named by their call's id): tools in the prompt, tool calls (floats, -0.0, 1e-07, a 17-digit integer, None / True /
 * False, nested objects, escapes and CJK) and tool results, byte for byte; Mistral's id checks
 * as the template's own exception. */
TEST(ChatTools, RenderingMatchesTheTemplates) {
    std::string data = ft::tok_data();
    ASSERT_FALSE(data.empty());
    std::vector<uint8_t> js = ft::read_file(ft::src("tests/fixtures/chat/chat_tools.json"));
    cJSON *root = cJSON_ParseWithLength((const char *)js.data(), js.size());
    ASSERT_TRUE(cJSON_IsArray(root));
    std::map<std::string, forge_model *> models;
    std::map<std::string, std::string> templates = {{"llama3.2", llama32_template()},
                                                    {"qwen3.5", chat_fixture("qwen3.5-0.8b.jinja")},
                                                    {"qwen3.5-think", chat_fixture("qwen3.5-27b.jinja")},
                                                    {"mistral-v0.3", chat_fixture("mistral-7b-instruct-v0.3.jinja")},
                                                    {"mistral-nemo", chat_fixture("mistral-nemo-instruct-2407.jinja")}};
    int checked = 0;
    cJSON *c;
    cJSON_ArrayForEach(c, root) {
        std::string fam = cJSON_GetStringValue(cJSON_GetObjectItem(c, "family"));
        if (!models.count(fam)) {
            models[fam] = family_vocab(fam, data);
            if (templates.count(fam) && models[fam]) ft_model_set_chat_template(models[fam], templates[fam].c_str());
            if (fam == "gemma4-large" && models[fam]) ft_model_set_chat_template(models[fam], kGemma4LargeTemplateLine);
        }
        forge_model *m = models[fam];
        ASSERT_NE(m, nullptr);
        ToolCase tc = tool_case(c);
        uint32_t flags = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")) ? 0 : FORGE_CHAT_NO_GENERATION_PROMPT;
        if (cJSON_IsFalse(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "kwargs"), "enable_thinking"))) flags |= FORGE_CHAT_THINKING_OFF;
        if (cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "kwargs"), "enable_thinking"))) flags |= FORGE_CHAT_THINKING_ON;
        std::string what = fam + " " + cJSON_GetStringValue(cJSON_GetObjectItem(c, "name"));
        char *text = nullptr;
        size_t len = 0;
        forge_status st = ft_chat_render_on(m, cJSON_GetStringValue(cJSON_GetObjectItem(c, "date")), tc.msgs.data(), (int)tc.msgs.size(),
                                            tc.tools.data(), (int)tc.tools.size(), flags, &text, &len);
        if (const char *error = cJSON_GetStringValue(cJSON_GetObjectItem(c, "error"))) {
            free(text);
            std::vector<char> buf(1 << 15);
            EXPECT_EQ(st, FORGE_ERR_INVALID_ARGUMENT) << what;
            EXPECT_EQ(forge_chat_render_tools(m, tc.msgs.data(), (int)tc.msgs.size(), tc.tools.data(), (int)tc.tools.size(), flags, buf.data(),
                                              buf.size(), &len), FORGE_ERR_INVALID_ARGUMENT) << what;
            EXPECT_STREQ(forge_model_errmsg(m), error) << what;
            checked++;
            continue;
        }
        ASSERT_EQ(st, FORGE_OK) << what;
        EXPECT_EQ(std::string(text, len), cJSON_GetStringValue(cJSON_GetObjectItem(c, "rendered"))) << what;
        free(text);
        if (fam != "llama3.2") { /* the public call agrees (the Llama cases pin the date) */
            std::vector<char> buf(1 << 15);
            ASSERT_EQ(forge_chat_render_tools(m, tc.msgs.data(), (int)tc.msgs.size(), tc.tools.data(), (int)tc.tools.size(), flags, buf.data(),
                                              buf.size(), &len), FORGE_OK) << what;
            EXPECT_EQ(std::string(buf.data(), len), cJSON_GetStringValue(cJSON_GetObjectItem(c, "rendered"))) << what;
        }
        checked++;
    }
    EXPECT_EQ(checked, 103);
    /* Llama 3.1+: one call a message, the template's message */
    forge_tool_call two[2] = {{sizeof(forge_tool_call), "a", "{}"}, {sizeof(forge_tool_call), "b", nullptr}};
    forge_chat_message conv[2] = {{sizeof(forge_chat_message), "user", "x", nullptr, 0}, {sizeof(forge_chat_message), "assistant", "", two, 2}};
    size_t len = 0;
    EXPECT_EQ(forge_chat_render_tools(models["llama3.2"], conv, 2, nullptr, 0, 0, nullptr, 0, &len), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_model_errmsg(models["llama3.2"])).find("This model only supports single tool-calls at once!"), std::string::npos);
    for (auto &kv : models) forge_model_free(kv.second);
    cJSON_Delete(root);
}

/* Families without a tool format forge renders are named; bad tools and arguments are refused. */
TEST(ChatTools, RefusalsNameTheFamilyAndTheFault) {
    std::string data = ft::tok_data();
    ASSERT_FALSE(data.empty());
    forge_tool weather = {sizeof(forge_tool), "get_weather", nullptr, "{\"type\": \"object\"}"};
    forge_chat_message user = {sizeof(forge_chat_message), "user", "Hi", nullptr, 0};
    size_t len = 0;
    struct { const char *fam, *tmpl, *named; } cases[] = {{"gemma3", nullptr, "Gemma 2 / 3"},
                                                          {"llama3", nullptr, "Llama 3.0"},
                                                          {"mistral-v0.1", "mistral-7b-instruct-v0.1.jinja", "Mistral v0.1 / v0.2"}};
    for (auto &cs : cases) {
        forge_model *m = family_vocab(cs.fam, data);
        ASSERT_NE(m, nullptr);
        std::string t = cs.tmpl ? chat_fixture(cs.tmpl) : "";
        if (cs.tmpl) ft_model_set_chat_template(m, t.c_str());
        EXPECT_EQ(forge_chat_render_tools(m, &user, 1, &weather, 1, 0, nullptr, 0, &len), FORGE_ERR_UNSUPPORTED) << cs.fam;
        EXPECT_NE(std::string(forge_model_errmsg(m)).find(cs.named), std::string::npos) << forge_model_errmsg(m);
        EXPECT_EQ(forge_chat_render_tools(m, &user, 1, nullptr, 0, 0, nullptr, 0, &len), FORGE_ERR_BUFFER_TOO_SMALL) << cs.fam;
        forge_model_free(m);
    }
    forge_model *q = vocab(data + "/qwen3");
    ASSERT_NE(q, nullptr);
    forge_tool bad[] = {{sizeof(forge_tool), "", nullptr, nullptr},
                        {sizeof(forge_tool), "f", nullptr, "[1]"},
                        {sizeof(forge_tool), "f", nullptr, "{\"a\": }"}};
    for (auto &b : bad) EXPECT_EQ(forge_chat_render_tools(q, &user, 1, &b, 1, 0, nullptr, 0, &len), FORGE_ERR_INVALID_ARGUMENT) << b.parameters;
    forge_tool_call call = {sizeof(forge_tool_call), "f", "[1, 2]"};
    forge_chat_message conv[2] = {user, {sizeof(forge_chat_message), "assistant", "", &call, 1}};
    EXPECT_EQ(forge_chat_render_tools(q, conv, 2, nullptr, 0, 0, nullptr, 0, &len), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_model_errmsg(q)).find("not a JSON object"), std::string::npos) << forge_model_errmsg(q);
    forge_model_free(q);
}

namespace {
/* ft_tool_reply split: the content, then (name, arguments) pairs. */
std::vector<std::string> reply_parts(int format, const std::string &text, const forge_tool *tools = nullptr, int n_tools = 0) {
    int n = -1;
    size_t content = 0;
    char *r = ft_tool_reply(format, text.data(), text.size(), tools, n_tools, &n, &content);
    std::vector<std::string> out;
    std::string s = r ? std::string(r, content + strlen(r + content)) : "";
    free(r);
    out.push_back(s.substr(0, content));
    size_t at = content;
    while (at < s.size()) {
        size_t next = s.find_first_of("\x01\x02", at + 1);
        out.push_back(s.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1));
        at = next == std::string::npos ? s.size() : next;
    }
    EXPECT_EQ((int)out.size(), 1 + 2 * n) << text;
    return out;
}
} // namespace

/* Replies of each format read back: calls, the content around them, blocks that do not parse
 * left as content, Qwen 3.5's values typed as its template writes them. */
TEST(ChatTools, RepliesParse) {
    using V = std::vector<std::string>;
    /* Llama 3.1+ (1): the whole reply is calls, or it is content */
    EXPECT_EQ(reply_parts(1, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 3}} "),
              (V{"", "get_weather", "{\"city\":\"Paris\",\"days\":3}"}));
    EXPECT_EQ(reply_parts(1, "<|python_tag|>{\"name\": \"a\", \"arguments\": {}}; {\"name\": \"b\", \"parameters\": \"{\\\"x\\\": 1}\"}"),
              (V{"", "a", "{}", "b", "{\"x\":1}"}));
    EXPECT_EQ(reply_parts(1, "It is sunny. {\"name\": \"a\", \"parameters\": {}}"), (V{"It is sunny. {\"name\": \"a\", \"parameters\": {}}"}));
    EXPECT_EQ(reply_parts(1, "{\"name\": \"a\", \"parameters\": [1]}"), (V{"{\"name\": \"a\", \"parameters\": [1]}"}));
    EXPECT_EQ(reply_parts(1, "{\"name\": \"a\", \"parameters\": {}} trailing"), (V{"{\"name\": \"a\", \"parameters\": {}} trailing"}));
    /* Qwen 3 (2): <tool_call> JSON blocks after the thinking */
    EXPECT_EQ(reply_parts(2, "<think>\nuse <tool_call> here\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                             "{\"city\": \"東京\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"),
              (V{"Let me check.", "get_weather", "{\"city\":\"東京\"}", "now", "{}"}));
    EXPECT_EQ(reply_parts(2, "A <tool_call>{\"name\": 3}</tool_call> B"), (V{"A <tool_call>{\"name\": 3}</tool_call> B"}));
    EXPECT_EQ(reply_parts(2, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}"), (V{"", "f", "{\"a\":1}"})); /* cut at max_tokens */
    EXPECT_EQ(reply_parts(2, "<tool_call>{\"name\": \"f\", \"arguments\": {}} x</tool_call>"), (V{"<tool_call>{\"name\": \"f\", \"arguments\": {}} x</tool_call>"}));
    /* Qwen 3.5 (3): <function=...> blocks; values as JSON where they read as such */
    EXPECT_EQ(reply_parts(3, "<think>\n\n</think>\n\nChecking.\n\n<tool_call>\n<function=search>\n<parameter=query>\ncafé a\\b\n</parameter>\n"
                             "<parameter=limit>\n20.0\n</parameter>\n<parameter=safe>\nFalse\n</parameter>\n<parameter=tags>\n[\"x\", 1e-07, null, true]\n"
                             "</parameter>\n<parameter=note>\nline 1\nline 2\n</parameter>\n<parameter=n>\n\"42\"\n</parameter>\n</function>\n</tool_call>"),
              (V{"Checking.", "search", "{\"query\":\"café a\\\\b\",\"limit\":20,\"safe\":false,\"tags\":[\"x\",1e-07,null,true],\"note\":\"line 1\\nline 2\",\"n\":\"\\\"42\\\"\"}"}));
    EXPECT_EQ(reply_parts(3, "<tool_call>\n<function=now>\n</function>\n</tool_call>"), (V{"", "now", "{}"}));
    EXPECT_EQ(reply_parts(3, "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>"),
              (V{"<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>"}));
    EXPECT_EQ(reply_parts(3, "no calls"), (V{"no calls"}));
    /* Mistral v0.3 (4) and Nemo (5): the array after [TOOL_CALLS], every element a call */
    std::string two = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
                      "{\"name\": \"now\", \"arguments\": \"{}\", \"id\": \"Ab3dE6gH9\"}]";
    EXPECT_EQ(reply_parts(4, two), (V{"", "get_weather", "{\"city\":\"Paris\"}", "now", "{}"}));
    EXPECT_EQ(reply_parts(5, "Checking.[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}}] done"), (V{"Checking. done", "now", "{}"}));
    for (const char *content : {"[TOOL_CALLS] []", "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}, 3]", "[TOOL_CALLS] {\"name\": \"a\"}",
                                "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}", "no calls [TOOL_CALLS"})
        EXPECT_EQ(reply_parts(4, content), (V{content})) << content;
    /* Gemma 4 (6): <|tool_call>call:NAME{...}<tool_call|> in its notation, the thought channels out */
    EXPECT_EQ(reply_parts(6, "<|channel>thought\nuse <|tool_call>call:x{}<tool_call|><channel|>Checking.<|tool_call>call:book{alpha:[{x:2}],"
                             "beta:{c:null},delta:<|\"|>a \"b\"\n{c}<|\"|>,num:2.5,ok:true,<|\"|>odd key<|\"|>:-1e-07}<tool_call|>"
                             "<|tool_call>call:now{}<tool_call|>"),
              (V{"Checking.", "book", "{\"alpha\":[{\"x\":2}],\"beta\":{\"c\":null},\"delta\":\"a \\\"b\\\"\\n{c}\",\"num\":2.5,\"ok\":true,\"odd key\":-1e-07}",
                 "now", "{}"}));
    EXPECT_EQ(reply_parts(6, "<|tool_call>call:f{a:1"), (V{"<|tool_call>call:f{a:1"}));             /* cut inside: content */
    EXPECT_EQ(reply_parts(6, "<|tool_call>call:f{a:<|\"|>x<|\"|>}"), (V{"", "f", "{\"a\":\"x\"}"})); /* cut at its close */
    for (const char *content : {"<|tool_call>call:{a:1}<tool_call|>", "<|tool_call>call:f{a:yes}<tool_call|>", "<|tool_call>call:f{a:1,}<tool_call|>",
                                "<|tool_call>call:f{:1}<tool_call|>", "<|tool_call>call:f[1]<tool_call|>", "<|tool_call>f{}<tool_call|>"})
        EXPECT_EQ(reply_parts(6, content), (V{content})) << content;
    /* ids: the model's when it wrote 9 letters and digits, else made from the reply and the
     * call's place (the same reply, the same ids) */
    char *ids = ft_tool_reply_ids(4, two.data(), two.size());
    ASSERT_NE(ids, nullptr);
    std::string got = ids;
    free(ids);
    ASSERT_EQ(got.size(), 19u) << got;
    EXPECT_EQ(got.substr(10), "Ab3dE6gH9");
    for (char ch : got.substr(0, 9)) EXPECT_TRUE(isalnum((unsigned char)ch)) << got;
    std::string bad_id = "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}, \"id\": \"short\"}, {\"name\": \"a\", \"arguments\": {}}]";
    ids = ft_tool_reply_ids(4, bad_id.data(), bad_id.size());
    char *again = ft_tool_reply_ids(4, bad_id.data(), bad_id.size());
    ASSERT_TRUE(ids && again);
    got = ids;
    EXPECT_EQ(got, std::string(again));
    EXPECT_EQ(got.size(), 19u) << got;
    EXPECT_NE(got.substr(0, 9), "short") << got;
    EXPECT_NE(got.substr(0, 9), got.substr(10)) << got;
    free(ids);
    free(again);
}

/* The tool grammar takes the calls the template shows and nothing else: Qwen 3's blocks (every
 * tool, the schema's types), Llama's object after its trigger. */
TEST(ChatTools, GrammarTakesTheToolsCalls) {
    forge_tool tools[] = {{sizeof(forge_tool), "get_weather", nullptr,
                           "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}}, "
                           "\"required\": [\"city\", \"days\"], \"additionalProperties\": false}"},
                          {sizeof(forge_tool), "now \"quoted\"", nullptr, nullptr}};
    char err[256];
    const char *trigger = nullptr;
    char *g = ft_tool_grammar(2, tools, 2, 1, &trigger, err, sizeof err);
    ASSERT_NE(g, nullptr) << err;
    EXPECT_EQ(trigger, nullptr);
    std::string one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>";
    std::string two = one + "\n<tool_call>\n{\"name\": \"now \\\"quoted\\\"\", \"arguments\": {\"x\": [1]}}\n</tool_call>";
    EXPECT_EQ(ft_gbnf_match(g, one.data(), one.size(), err, sizeof err), 1) << g;
    EXPECT_EQ(ft_gbnf_match(g, two.data(), two.size(), err, sizeof err), 1) << g;
    for (std::string bad : {std::string("<tool_call>\n{\"name\": \"get_wether\""), std::string("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 3"),
                            std::string("Sure! <tool_call>")})
        EXPECT_EQ(ft_gbnf_match(g, bad.data(), bad.size(), err, sizeof err), -1) << bad;
    free(g);
    g = ft_tool_grammar(2, tools, 1, 0, &trigger, err, sizeof err);
    ASSERT_NE(g, nullptr) << err;
    EXPECT_STREQ(trigger, "<tool_call>");
    std::string after = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\", \"days\": -1}}\n</tool_call>";
    EXPECT_EQ(ft_gbnf_match(g, after.data(), after.size(), err, sizeof err), 1) << g;
    free(g);
    g = ft_tool_grammar(1, tools, 1, 0, &trigger, err, sizeof err);
    ASSERT_NE(g, nullptr) << err;
    EXPECT_STREQ(trigger, "{\"name\": ");
    after = "\"get_weather\", \"parameters\": {\"city\": \"P\", \"days\": 2}}";
    EXPECT_EQ(ft_gbnf_match(g, after.data(), after.size(), err, sizeof err), 1) << g;
    free(g);
    /* Mistral: the array its template writes after [TOOL_CALLS] (v0.3 with a space, Nemo without) */
    g = ft_tool_grammar(4, tools, 2, 1, &trigger, err, sizeof err);
    ASSERT_NE(g, nullptr) << err;
    EXPECT_EQ(trigger, nullptr);
    std::string arr = " [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}, {\"name\": \"now \\\"quoted\\\"\", "
                      "\"arguments\": {}}]";
    EXPECT_EQ(ft_gbnf_match(g, arr.data(), arr.size(), err, sizeof err), 1) << g;
    for (std::string bad : {arr.substr(1), std::string(" []"), std::string(" [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\"}}]")})
        EXPECT_EQ(ft_gbnf_match(g, bad.data(), bad.size(), err, sizeof err), -1) << bad;
    free(g);
    g = ft_tool_grammar(5, tools, 2, 0, &trigger, err, sizeof err);
    ASSERT_NE(g, nullptr) << err;
    EXPECT_STREQ(trigger, "[TOOL_CALLS]");
    EXPECT_EQ(ft_gbnf_match(g, arr.data() + 1, arr.size() - 1, err, sizeof err), 1) << g;
    free(g);
    forge_tool bad = {sizeof(forge_tool), "f", nullptr, "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"format\": \"ipv6\"}}}"};
    EXPECT_EQ(ft_tool_grammar(2, &bad, 1, 1, &trigger, err, sizeof err), nullptr);
    EXPECT_NE(std::string(err).find("tool 0 (f)"), std::string::npos) << err;
    EXPECT_NE(std::string(err).find("ipv6"), std::string::npos) << err;
}

/* Qwen 3.5's calls, whose template writes strings raw and other values as JSON: the grammar takes
 * the blocks it writes (strings raw, enums as one of their strings, integers and objects as JSON,
 * the required parameters, in the schema's order, no "</" in a raw string) and nothing else; the
 * parser reads each value as its parameter's schema types it ("42" stays a string where the
 * schema says string); what a raw string cannot be held to is refused, naming the keyword. */
TEST(ChatTools, Qwen35CallsFollowTheSchemas) {
    const char *schema = "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"a city\"}, "
                         "\"zip\": {\"type\": \"string\", \"maxLength\": 5}, \"unit\": {\"$ref\": \"#/$defs/unit\"}, "
                         "\"days\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 9}, \"opts\": {\"type\": \"object\", "
                         "\"properties\": {\"hourly\": {\"type\": \"boolean\"}}, \"additionalProperties\": false}}, "
                         "\"required\": [\"city\", \"days\"], \"$defs\": {\"unit\": {\"enum\": [\"celsius\", \"fahrenheit\"]}}}";
    forge_tool tools[] = {{sizeof(forge_tool), "get_weather", nullptr, schema}, {sizeof(forge_tool), "now", nullptr, nullptr}};
    char err[512];
    const char *trigger = nullptr;
    char *g = ft_tool_grammar(3, tools, 2, 1, &trigger, err, sizeof err);
    ASSERT_NE(g, nullptr) << err;
    EXPECT_EQ(trigger, nullptr);
    auto call = [](const std::string &params) {
        return "<tool_call>\n<function=get_weather>\n" + params + "</function>\n</tool_call>";
    };
    auto param = [](const std::string &name, const std::string &value) { return "<parameter=" + name + ">\n" + value + "\n</parameter>\n"; };
    std::string full = call(param("city", "New York\nNY <b>") + param("zip", "10001") + param("unit", "celsius") + param("days", "3") +
                            param("opts", "{\"hourly\": true}"));
    std::string two = call(param("city", "Paris") + param("days", "9")) + "\n<tool_call>\n<function=now>\n" + param("anything", "x") +
                      "</function>\n</tool_call>";
    for (const std::string &good : {full, two})
        EXPECT_EQ(ft_gbnf_match(g, good.data(), good.size(), err, sizeof err), 1) << good << "\n" << g;
    for (const std::string &bad : {call(param("days", "3")),                                     /* city is required */
                                   call(param("days", "3") + param("city", "Paris")),            /* the schema's order */
                                   call(param("city", "Paris") + param("days", "\"3\"")),         /* an integer as JSON */
                                   call(param("city", "Paris") + param("days", "12")),            /* maximum 9 */
                                   call(param("city", "a</b") + param("days", "1")),              /* no "</" in a raw string */
                                   call(param("city", "Paris") + param("zip", "123456") + param("days", "1")),
                                   call(param("city", "Paris") + param("unit", "kelvin") + param("days", "1")),
                                   call(param("city", "Paris") + param("days", "1") + param("extra", "1")),
                                   std::string("<tool_call>\n<function=get_wether>\n")})
        EXPECT_EQ(ft_gbnf_match(g, bad.data(), bad.size(), err, sizeof err), -1) << bad;
    free(g);
    g = ft_tool_grammar(3, tools, 1, 0, &trigger, err, sizeof err);
    ASSERT_NE(g, nullptr) << err;
    EXPECT_STREQ(trigger, "<tool_call>");
    std::string after = "<function=get_weather>\n" + param("city", "Rome") + param("days", "2") + "</function>\n</tool_call>";
    EXPECT_EQ(ft_gbnf_match(g, after.data(), after.size(), err, sizeof err), 1) << g;
    free(g);
    /* read back by the schema: zip "01234" and city "42" stay strings, days and opts are JSON */
    EXPECT_EQ(reply_parts(3, call(param("city", "42") + param("zip", "01234") + param("unit", "celsius") + param("days", "3") +
                                  param("opts", "{\"hourly\": false}")),
                          tools, 2),
              (std::vector<std::string>{"", "get_weather", "{\"city\":\"42\",\"zip\":\"01234\",\"unit\":\"celsius\",\"days\":3,\"opts\":{\"hourly\":false}}"}));
    EXPECT_EQ(reply_parts(3, call(param("city", "42") + param("days", "3"))), /* without the tools: as the value reads */
              (std::vector<std::string>{"", "get_weather", "{\"city\":42,\"days\":3}"}));
    for (auto refused : std::vector<std::pair<const char *, const char *>>{
             {"{\"type\": \"object\", \"properties\": {\"d\": {\"type\": \"string\", \"format\": \"date\"}}}", "\"format\""},
             {"{\"type\": \"object\", \"properties\": {\"d\": {\"type\": \"string\", \"pattern\": \"^a\"}}}", "\"pattern\""},
             {"{\"type\": \"object\", \"properties\": {\"d\": {\"type\": [\"string\", \"integer\"]}}}", "\"type\""},
             {"{\"type\": \"object\", \"properties\": {\"d\": {\"enum\": [\"a\", 1]}}}", "\"enum\""}}) {
        forge_tool t = {sizeof(forge_tool), "f", nullptr, refused.first};
        EXPECT_EQ(ft_tool_grammar(3, &t, 1, 1, &trigger, err, sizeof err), nullptr) << refused.first;
        EXPECT_NE(std::string(err).find("tool 0 (f): parameter d: " + std::string(refused.second)), std::string::npos) << err;
    }
}

/* A caller built against the forge_chat_message before tool calls (struct_size up to content)
 * renders as before: forge reads its array by that stride, the calls as none. */
TEST(ChatTools, OlderChatMessageArraysRenderAsBefore) {
    std::string data = ft::tok_data();
    ASSERT_FALSE(data.empty());
    forge_model *q = vocab(data + "/qwen3");
    ASSERT_NE(q, nullptr);
    struct Old { uint32_t struct_size; const char *role, *content; };
    Old old[2] = {{sizeof(Old), "user", "Hi"}, {sizeof(Old), "assistant", "Hello"}};
    forge_chat_message now[2] = {{sizeof(forge_chat_message), "user", "Hi", nullptr, 0}, {sizeof(forge_chat_message), "assistant", "Hello", nullptr, 0}};
    std::vector<char> a(4096), b(4096);
    size_t la = 0, lb = 0;
    ASSERT_EQ(forge_chat_render(q, reinterpret_cast<const forge_chat_message *>(old), 2, 0, a.data(), a.size(), &la), FORGE_OK) << forge_model_errmsg(q);
    ASSERT_EQ(forge_chat_render(q, now, 2, 0, b.data(), b.size(), &lb), FORGE_OK);
    EXPECT_EQ(std::string(a.data(), la), std::string(b.data(), lb));
    forge_model_free(q);
}
