/* Constraints: GBNF parsing and its errors, the byte automaton against the text it must take,
 * JSON Schema compiled and every output of random walks validated (tests/json_check.h, written
 * apart from forge), hostile grammars and schemas, the constrained draw against the whole row,
 * and constrained generation on random-weight models. */
#include <algorithm>
#include <chrono>
#include <dirent.h>
#include <map>
#include <random>
#include <set>

#include "internal.h"
#include "json_check.h"
#include "tok_util.h"

namespace {

forge_model *vocab_model(const std::string &dir) {
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

/* The Llama 3 tokenizer (128256 tokens), loaded once. */
forge_model *llama3() {
    static forge_model *m = [] { return vocab_model(ft::tok_data() + "/llama3"); }();
    return m;
}

int match(const std::string &gbnf, const std::string &text, std::string *err = nullptr) {
    char e[1024] = "";
    int r = ft_gbnf_match(gbnf.c_str(), text.data(), text.size(), e, sizeof e);
    if (err) *err = e;
    return r;
}

std::string schema_gbnf(const std::string &schema, forge_status *st = nullptr, std::string *err = nullptr) {
    std::vector<char> out(1 << 22);
    size_t len = 0;
    char e[1024] = "";
    forge_status s = forge_json_schema_to_gbnf(schema.c_str(), schema.size(), out.data(), out.size(), &len, e, sizeof e);
    if (st) *st = s;
    if (err) *err = e;
    return s ? "" : std::string(out.data(), len);
}

forge_constraint constraint(forge_constraint_kind kind, const std::string &text) {
    forge_constraint c = ft::sized<forge_constraint>();
    c.kind = kind;
    c.text = text.c_str();
    c.text_len = text.size();
    return c;
}

std::string token_text(forge_model *m, const std::vector<int32_t> &toks) {
    std::string out;
    forge_detok_stream ds;
    forge_detok_stream_init(&ds, 0);
    char buf[1024];
    size_t n;
    for (int32_t t : toks)
        if (forge_detok_stream_next(m, &ds, t, buf, sizeof buf, &n) == FORGE_OK) out.append(buf, n);
    if (forge_detok_stream_flush(m, &ds, buf, sizeof buf, &n) == FORGE_OK) out.append(buf, n);
    return out;
}

} // namespace

TEST(Grammar, SmokeJsonSchema) {
    forge_model *m = llama3();
    ASSERT_NE(m, nullptr);
    std::string schema = R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},"age":{"type":"integer","minimum":0,"maximum":150}},"required":["name","age"],"additionalProperties":false})";
    forge_constraint c = constraint(FORGE_CONSTRAINT_JSON_SCHEMA, schema);
    forge_grammar *g = nullptr;
    ASSERT_EQ(forge_grammar_create(m, &c, &g), FORGE_OK) << forge_model_errmsg(m);
    std::vector<int32_t> toks(64);
    size_t n = 0;
    std::string text = R"({"name": "Ann", "age": 42})";
    ASSERT_EQ(forge_tokenize(m, text.c_str(), text.size(), FORGE_TOKENIZE_NO_PARSE_SPECIAL, toks.data(), toks.size(), &n), FORGE_OK);
    int V = forge_model_n_vocab(m);
    std::vector<uint32_t> mask((V + 31) / 32);
    for (size_t i = 0; i < n; i++) {
        ASSERT_EQ(forge_grammar_allows(g, toks[i]), 1) << i;
        ASSERT_EQ(forge_grammar_mask(g, mask.data(), mask.size()), FORGE_OK) << forge_grammar_errmsg(g);
        ASSERT_TRUE((mask[toks[i] / 32] >> (toks[i] % 32)) & 1) << i;
        ASSERT_EQ(forge_grammar_accept(g, toks[i]), FORGE_OK);
    }
    EXPECT_EQ(forge_grammar_status(g) & (FORGE_GRAMMAR_COMPLETE | FORGE_GRAMMAR_DONE), FORGE_GRAMMAR_COMPLETE | FORGE_GRAMMAR_DONE);
    forge_grammar_free(g);
}
