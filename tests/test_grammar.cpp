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

/* A constraint on text the caller keeps alive (a string literal, or a std::string that outlives it). */
forge_constraint constraint(forge_constraint_kind kind, const std::string &text) {
    forge_constraint c = ft::sized<forge_constraint>();
    c.kind = kind;
    c.text = text.c_str();
    c.text_len = text.size();
    return c;
}
forge_constraint constraint(forge_constraint_kind kind, const char *text) {
    forge_constraint c = ft::sized<forge_constraint>();
    c.kind = kind;
    c.text = text;
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

/* The GBNF grammars of tests/fixtures/grammar (written for these tests in llama.cpp's format, one
 * for each kind of grammar its grammars/ folder holds) parse and take the text they describe. */
TEST(Grammar, FormatFilesParseAndMatch) {
    struct Case { const char *file; std::vector<std::string> yes, no; };
    std::vector<Case> cases = {
        {"arithmetic.gbnf", {"x=2\n", "(a +b)*3 = 7\n1=1\n"}, {"", "x=\n", "=3\n"}},
        {"json.gbnf", {"{}", " {\"a\": [1, 2.5e3, \"x\\n\", true, null, {\"b\": -0}]} ", "\"\\u00e9t\\u00E9\"", "[ ]"}, {"{", "[1,]", "01", "\"\\x\"", "{\"a\" 1}"}},
        {"json_arr.gbnf", {"[\n]", "[\n  {\"id\": 1, \"name\": \"x y\"},\n  {\"ok\": true}\n]"}, {"[]", "[\n  {\"ID\": 1}\n]"}},
        {"list.gbnf", {"- one\n", "- one\n* two, three\n"}, {"- \n", "-one\n", "- a\u2028b\n"}},
        {"chess.gbnf", {"1. e4 e5\n2. Nf3 Nc6\n3. Bb5 a6", "1. e4\n", "1. O-O-O Qxd8#"}, {"1. e9 e5", "0. e4 e5", "1. e4  e5"}},
        {"japanese.gbnf", {"こんにちは、世界。", "カタカナ\tひらがな"}, {"hello", "こんにちは world"}},
        {"c.gbnf", {"int main() {\n    int x = 1;\n    return x + 2;\n}\n", "void f(int a, char b) {\n    if (a < b) { g(a); } else { b = 3; }\n    // done\n}\n"}, {"int main() {\n}", "main() {\n}\n"}},
        {"english.gbnf", {"Hello there. It's fine!", "One two three?\n\nYes. A 'q' here."}, {"hello", "Hi.\n\n\n\nNo."}},
    };
    for (const Case &c : cases) {
        std::vector<uint8_t> b = ft::read_file(ft::src(std::string("tests/fixtures/grammar/") + c.file));
        std::string g(b.begin(), b.end());
        ASSERT_FALSE(g.empty()) << c.file;
        for (const std::string &t : c.yes) {
            std::string err;
            EXPECT_EQ(match(g, t, &err), 1) << c.file << " should take " << t << " " << err;
        }
        for (const std::string &t : c.no) EXPECT_NE(match(g, t), 1) << c.file << " should not take " << t;
    }
}

TEST(Grammar, OperatorsAndClasses) {
    EXPECT_EQ(match("root ::= \"ab\"{2,3}", "abab"), 1);
    EXPECT_EQ(match("root ::= \"ab\"{2,3}", "ababab"), 1);
    EXPECT_EQ(match("root ::= \"ab\"{2,3}", "abababab"), -1);
    EXPECT_EQ(match("root ::= \"ab\"{2,3}", "ab"), 0);
    EXPECT_EQ(match("root ::= [a-c]{2,}", "abcabc"), 1);
    EXPECT_EQ(match("root ::= \"x\"{0}", ""), 1);
    EXPECT_EQ(match("root ::= [^a-z]+", "ABC\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"), 1); /* é € 😀 */
    EXPECT_EQ(match("root ::= [^a-z]+", "AbC"), -1);
    EXPECT_EQ(match("root ::= .+", "\xc3\xa9\xed\x9f\xbf"), 1);                      /* U+D7FF */
    EXPECT_EQ(match("root ::= .+", "\xed\xa0\x80"), -1);                             /* a surrogate is no character */
    EXPECT_EQ(match("root ::= .+", "\xc0\xaf"), -1);                                 /* nor an overlong form */
    EXPECT_EQ(match("root ::= [\\u00e0-\\u00ff]", "\xc3\xa9"), 1);
    EXPECT_EQ(match("root ::= [\\x41-\\x43\\n]+", "AB\nC"), 1);
    EXPECT_EQ(match("root ::= \"\\U0001F600\" | \"\\\"\\\\\"", "\"\\"), 1);
    EXPECT_EQ(match("root ::= \"\\U0001F600\" | \"\\\"\\\\\"", "\xf0\x9f\x98\x80"), 1);
    EXPECT_EQ(match("root ::= a b\na ::= \"x\"?\nb ::= \"y\"*", ""), 1); /* nullable rules */
    EXPECT_EQ(match("root ::= (\"a\" | \"b\" (\"c\" | \"d\")+)*", "abcdcabd"), 1);
    EXPECT_EQ(match("root ::= (\"a\" | \"b\" (\"c\" | \"d\")+)*", "abcdcab"), 0);
    EXPECT_EQ(match("root ::= x\nx ::= \"(\" x \")\" | \"\"", "((()))"), 1); /* recursion in the middle */
    EXPECT_EQ(match("root ::= x\nx ::= \"(\" x \")\" | \"\"", "(()"), 0);
    /* outside parentheses a rule ends at the end of its line (a '|' starting the next one is an error, as in llama.cpp) */
    EXPECT_EQ(match("# a comment\nroot ::= \"a\" # another\n  | \"b\"", "b"), -(int)FORGE_ERR_INVALID_ARGUMENT - 1);
    EXPECT_EQ(match("# a comment\nroot ::= (\"a\" # another\n  | \"b\")", "b"), 1);
}

TEST(Grammar, ErrorsNameLineColumnAndRule) {
    struct Bad { const char *g, *want; forge_status st; };
    std::vector<Bad> bad = {
        {"root ::= foo", "rule 'foo' (used on line 1) is never defined", FORGE_ERR_INVALID_ARGUMENT},
        {"start ::= \"a\"", "no rule 'root'", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= \"abc", "unterminated literal", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= \"a\\qb\"", "line 1 column 12: unknown escape '\\q'", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= [a-", "unterminated character class", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= [z-a]", "class range", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= (\"a\"", "expected ')'", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= \"a\" )", "unexpected ')' in rule 'root'", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= * \"a\"", "'*' with nothing before it", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= \"a\"**", "'*' with nothing before it", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= \"a\"{3,1}", "the most is below the least", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= \"a\"{2", "expected '}'", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= \"a\"\nroot ::= \"b\"", "line 2 column 1: rule 'root' is defined twice", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= root \"a\" | \"b\"", "left recursion in rule 'root'", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= a\na ::= b \"x\"\nb ::= c\nc ::= \"\" | a", "left recursion in rule", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= (\"a\"?)*", "left recursion in rule 'root_", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= <|eot_id|>", "token <|eot_id|>: a token named by its text needs a model's vocabulary", FORGE_ERR_UNSUPPORTED},
        {"root ::= !<[5]>", "a negated token (!<...>) is not supported", FORGE_ERR_UNSUPPORTED},
        {"root ::= <[5x]>", "a token id is written <[DIGITS]>", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= <[99999999999]>", "token id 99999999999 is outside the vocabulary", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= \"a\" <|x\n", "is not closed with '>' on its line", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= \"a\"{100000000}", "repetition count over", FORGE_ERR_LIMIT},
        {"root :: \"a\"", "expected '::='", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= \"\\xZZ\"", "\\x needs 2 hex digits", FORGE_ERR_INVALID_ARGUMENT},
        {"root ::= \"\xff\"", "invalid UTF-8", FORGE_ERR_INVALID_ARGUMENT},
    };
    for (const Bad &b : bad) {
        std::string err;
        int r = match(b.g, "", &err);
        EXPECT_EQ(r, -(int)b.st - 1) << b.g << ": " << err;
        EXPECT_NE(err.find(b.want), std::string::npos) << b.g << ": " << err;
    }
}

/* Deep nesting, huge repetitions, exponential ambiguity and deep recursion end in errors or
 * bounded work, never a crash or a hang. */
TEST(Grammar, HostileGrammarsMeetLimits) {
    auto t0 = std::chrono::steady_clock::now();
    std::string deep = "root ::= " + std::string(5000, '(') + "\"a\"" + std::string(5000, ')');
    std::string err;
    EXPECT_EQ(match(deep, "a", &err), -(int)FORGE_ERR_LIMIT - 1) << err;
    EXPECT_NE(err.find("nested deeper"), std::string::npos) << err;
    /* nested repetitions of groups expand by reference, not by copy: a billion a's is a small grammar */
    EXPECT_EQ(match("root ::= ((\"a\"{1000}){1000}){1000}", "aaa", &err), 0) << err;
    EXPECT_EQ(match("root ::= \"aaaaaaaaaa\"{1000000}", "a", &err), -(int)FORGE_ERR_LIMIT - 1) << err;
    /* many rules, each used once: fine */
    std::string chain = "root ::= r0\n";
    for (int i = 0; i < 20000; i++) chain += "r" + std::to_string(i) + " ::= \"x\" r" + std::to_string(i + 1) + " | \"y\"\n";
    chain += "r20000 ::= \"z\"\n";
    EXPECT_EQ(match(chain, "xxxy"), 1);
    /* deep recursion in the text: the stack bound cuts it, the automaton stays bounded */
    std::string nest(6000, '(');
    EXPECT_EQ(match("root ::= x\nx ::= \"(\" x \")\" | \"\"", nest), -1);
    /* an exponentially ambiguous grammar: the states are sets, so the work stays linear */
    std::string amb = "root ::= a*\na ::= \"x\" | \"x\" \"x\" | \"x\" \"x\" \"x\"";
    EXPECT_EQ(match(amb, std::string(3000, 'x')), 1);
    /* left recursion hidden behind nullable rules */
    EXPECT_LT(match("root ::= a \"x\"\na ::= b root\nb ::= \"z\"?", "x", &err), -1);
    EXPECT_NE(err.find("left recursion"), std::string::npos) << err;
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 60.0);
}

TEST(Grammar, TokensFollowBytesAcrossCharacters) {
    forge_model *m = llama3();
    ASSERT_NE(m, nullptr);
    /* Llama 3's byte-level tokens split é (C3 A9) and 😀 into byte tokens; the automaton follows them */
    std::string gbnf = "root ::= \"h\\u00e9llo \" [0-9]+ \" \\U0001F600\"";
    forge_constraint c = constraint(FORGE_CONSTRAINT_GBNF, gbnf);
    forge_grammar *g = nullptr;
    ASSERT_EQ(forge_grammar_create(m, &c, &g), FORGE_OK) << forge_model_errmsg(m);
    std::string text = "h\xc3\xa9llo 123 \xf0\x9f\x98\x80";
    std::vector<int32_t> toks(64);
    size_t n = 0;
    ASSERT_EQ(forge_tokenize(m, text.c_str(), text.size(), FORGE_TOKENIZE_NO_PARSE_SPECIAL, toks.data(), toks.size(), &n), FORGE_OK);
    for (size_t i = 0; i < n; i++) ASSERT_EQ(forge_grammar_accept(g, toks[i]), FORGE_OK) << i << " " << forge_grammar_errmsg(g);
    EXPECT_EQ(forge_grammar_status(g) & FORGE_GRAMMAR_DONE, FORGE_GRAMMAR_DONE);
    forge_special_tokens sp = ft::sized<forge_special_tokens>();
    ASSERT_EQ(forge_model_special_tokens(m, &sp), FORGE_OK);
    EXPECT_EQ(forge_grammar_allows(g, sp.eos_ids[0]), 1); /* matched: the end token */
    forge_grammar_free(g);
    /* byte by byte through one-byte tokens: the first byte of é alone is allowed, then not 'x' */
    ASSERT_EQ(forge_grammar_create(m, &c, &g), FORGE_OK);
    int32_t h = forge_token_id(m, "h"), c3 = forge_token_id(m, "\xc3\x83"), x = forge_token_id(m, "x"); /* Ã is byte C3 in byte-level text */
    ASSERT_GE(c3, 0);
    EXPECT_EQ(forge_grammar_accept(g, h), FORGE_OK);
    EXPECT_EQ(forge_grammar_allows(g, c3), 1);
    EXPECT_EQ(forge_grammar_accept(g, c3), FORGE_OK);
    EXPECT_EQ(forge_grammar_allows(g, x), 0);
    EXPECT_EQ(forge_grammar_allows(g, sp.eos_ids[0]), 0); /* not matched: no end token */
    int32_t special = forge_token_id(m, "<|start_header_id|>");
    EXPECT_EQ(forge_grammar_allows(g, special), 0);
    forge_grammar_free(g);
}

namespace {

std::vector<std::string> corpus_files() {
    std::vector<std::string> out;
    std::string dir = ft::src("bench/schemas");
    DIR *d = opendir(dir.c_str());
    if (!d) return out;
    while (struct dirent *e = readdir(d)) {
        std::string n = e->d_name;
        if (n.size() > 5 && n.substr(n.size() - 5) == ".json") out.push_back(dir + "/" + n);
    }
    closedir(d);
    std::sort(out.begin(), out.end());
    return out;
}

std::string slurp(const std::string &path) {
    std::vector<uint8_t> b = ft::read_file(path);
    return std::string(b.begin(), b.end());
}

/* A random walk through grammar g: `steps` tokens drawn uniformly from the mask (an end token
 * ends it), then the shortest way to a match in one-byte tokens. Returns the tokens; *ended:
 * whether it reached a match. */
std::vector<int32_t> random_walk(forge_model *m, forge_grammar *g, std::mt19937 &rng, int steps, bool *ended, std::string *why) {
    int V = forge_model_n_vocab(m);
    std::vector<uint32_t> mask((V + 31) / 32);
    std::vector<int32_t> out, allowed;
    forge_special_tokens sp = ft::sized<forge_special_tokens>();
    forge_model_special_tokens(m, &sp);
    *ended = false;
    for (int i = 0; i < steps; i++) {
        if (forge_grammar_status(g) & FORGE_GRAMMAR_DONE) { *ended = true; return out; }
        if (forge_grammar_mask(g, mask.data(), mask.size()) != FORGE_OK) { *why = forge_grammar_errmsg(g); return out; }
        allowed.clear();
        for (int t = 0; t < V; t++)
            if ((mask[t / 32] >> (t % 32)) & 1) allowed.push_back(t);
        if (allowed.empty()) { *why = "an empty mask"; return out; }
        int32_t t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
        bool end = false;
        for (int k = 0; k < sp.n_eos; k++) end |= sp.eos_ids[k] == t;
        if (end) { *ended = true; return out; }
        if (forge_grammar_allows(g, t) != 1) { *why = "a masked token not allowed: " + std::to_string(t); return out; }
        if (forge_grammar_accept(g, t) != FORGE_OK) { *why = forge_grammar_errmsg(g); return out; }
        out.push_back(t);
    }
    std::vector<int32_t> fin(20000);
    int n = ft_grammar_finish(g, fin.data(), (int)fin.size());
    if (n < 0) { *why = "no way to a match"; return out; }
    for (int i = 0; i < n; i++) {
        if (forge_grammar_accept(g, fin[i]) != FORGE_OK) { *why = "finish: " + std::string(forge_grammar_errmsg(g)); return out; }
        out.push_back(fin[i]);
    }
    *ended = (forge_grammar_status(g) & FORGE_GRAMMAR_COMPLETE) != 0;
    return out;
}

} // namespace

/* Every schema of the bench corpus compiles, and random walks through its grammar (tokens drawn
 * uniformly from the mask, then the shortest way to a match) give JSON that validates. */
TEST(Schema, CorpusRandomWalksValidate) {
    forge_model *m = llama3();
    ASSERT_NE(m, nullptr);
    std::vector<std::string> files = corpus_files();
    ASSERT_GE(files.size(), 50u);
    std::mt19937 rng(1234);
    int outputs = 0;
    for (const std::string &f : files) {
        std::string schema = slurp(f);
        forge_constraint c = constraint(FORGE_CONSTRAINT_JSON_SCHEMA, schema);
        for (int walk = 0; walk < 3; walk++) {
            forge_grammar *g = nullptr;
            ASSERT_EQ(forge_grammar_create(m, &c, &g), FORGE_OK) << f << ": " << forge_model_errmsg(m);
            bool ended = false;
            std::string why;
            std::vector<int32_t> toks = random_walk(m, g, rng, 8 + 12 * walk, &ended, &why);
            ASSERT_TRUE(why.empty()) << f << ": " << why;
            ASSERT_TRUE(ended) << f;
            std::string text = token_text(m, toks);
            std::string v = jc::validate(text, schema);
            EXPECT_EQ(v, "") << f << "\n" << text;
            outputs++;
            forge_grammar_free(g);
        }
    }
    EXPECT_EQ(outputs, (int)files.size() * 3);
}

/* The mask and forge_grammar_allows agree on every token, in the states of a walk through
 * a valid instance (inside strings, bounded and not, too: where the mask takes plain-text
 * subtrees of the trie whole). */
TEST(Schema, MaskAgreesWithEachToken) {
    forge_model *m = llama3();
    ASSERT_NE(m, nullptr);
    std::vector<std::pair<std::string, std::string>> cases = {
        {"02-order.json", "{\"order_id\": \"ORD-123456\", \"customer_id\": 7, \"status\": \"paid\", \"items\": [{\"sku\": \"ABC-1234\", \"quantity\": 2, "
                          "\"unit_price\": 9.5}], \"placed_at\": \"2024-02-29T10:00:00Z\"}"},
        {"13-github-issue.json", "{\"title\": \"Crash when the window is resized twice: a long title, caf\u00e9!\", \"body\": \"Steps:\\n1. open\", "
                                 "\"labels\": [\"bug\"], \"milestone\": null}"},
    };
    int V = forge_model_n_vocab(m);
    std::vector<uint32_t> mask((V + 31) / 32);
    for (auto &c : cases) {
        std::string schema = slurp(ft::src("bench/schemas/" + c.first));
        forge_constraint con = constraint(FORGE_CONSTRAINT_JSON_SCHEMA, schema);
        forge_grammar *g = nullptr;
        ASSERT_EQ(forge_grammar_create(m, &con, &g), FORGE_OK) << forge_model_errmsg(m);
        std::vector<int32_t> toks(256);
        size_t n = 0;
        ASSERT_EQ(forge_tokenize(m, c.second.c_str(), c.second.size(), FORGE_TOKENIZE_NO_PARSE_SPECIAL, toks.data(), toks.size(), &n), FORGE_OK);
        for (size_t i = 0; i < n; i++) {
            ASSERT_EQ(forge_grammar_mask(g, mask.data(), mask.size()), FORGE_OK);
            if (i % 3 == 0) {
                for (int t = 0; t < V; t++)
                    ASSERT_EQ((int)((mask[t / 32] >> (t % 32)) & 1), forge_grammar_allows(g, t)) << c.first << " step " << i << " token " << t;
            }
            ASSERT_TRUE((mask[toks[i] / 32] >> (toks[i] % 32)) & 1) << c.first << " " << i;
            ASSERT_EQ(forge_grammar_accept(g, toks[i]), FORGE_OK) << i;
        }
        EXPECT_TRUE(forge_grammar_status(g) & FORGE_GRAMMAR_DONE) << c.first;
        forge_grammar_free(g);
    }
}

TEST(Schema, UnsupportedAndInvalidAreNamed) {
    struct Bad { const char *schema, *want; forge_status st; };
    std::vector<Bad> bad = {
        {R"({"type":"object","not":{"required":["a"]}})", "keyword \"not\"", FORGE_ERR_UNSUPPORTED},
        {R"({"type":"object","patternProperties":{"^x":{}}})", "keyword \"patternProperties\"", FORGE_ERR_UNSUPPORTED},
        {R"({"if":{"type":"string"},"then":{"maxLength":3}})", "keyword \"if\"", FORGE_ERR_UNSUPPORTED},
        {R"({"type":"number","multipleOf":5})", "keyword \"multipleOf\"", FORGE_ERR_UNSUPPORTED},
        {R"({"type":"array","uniqueItems":true})", "keyword \"uniqueItems\"", FORGE_ERR_UNSUPPORTED},
        {R"({"type":"array","contains":{"type":"integer"}})", "keyword \"contains\"", FORGE_ERR_UNSUPPORTED},
        {R"({"type":"object","maxProperties":3})", "keyword \"maxProperties\"", FORGE_ERR_UNSUPPORTED},
        {R"({"type":"string","format":"ipv4"})", "format \"ipv4\"", FORGE_ERR_UNSUPPORTED},
        {R"({"type":"string","pattern":"^(?=a)b$"})", "lookaround", FORGE_ERR_UNSUPPORTED},
        {R"({"type":"string","pattern":"(a)\\1"})", "escape forge does not support", FORGE_ERR_UNSUPPORTED},
        {R"({"type":"string","pattern":"^a+$","maxLength":4})", "pattern with minLength / maxLength", FORGE_ERR_UNSUPPORTED},
        /* (fuzz finds: repeating what can match nothing would be a rule that reaches itself) */
        {R"({"type":"string","pattern":"^[A-Z]{2}(|xy)+?$"})", "a repetition of a group that can match the empty string", FORGE_ERR_UNSUPPORTED},
        {R"({"type":"string","pattern":"(a*|b){2,}"})", "a repetition of a group that can match the empty string", FORGE_ERR_UNSUPPORTED},
        {R"({"type":"number","minimum":0.5})", "whole-number bounds", FORGE_ERR_UNSUPPORTED},
        {R"({"$ref":"https://example.com/s.json"})", "only references into the schema itself", FORGE_ERR_UNSUPPORTED},
        {R"({"$ref":"#/$defs/missing"})", "points at nothing", FORGE_ERR_INVALID_ARGUMENT},
        {R"({"type":"obj"})", "\"type\" must be a type name", FORGE_ERR_INVALID_ARGUMENT},
        {R"({"allOf":[{"type":"string"},{"type":"integer"}]})", "types have nothing in common", FORGE_ERR_INVALID_ARGUMENT},
        {R"({"type":"integer","minimum":10,"maximum":3})", "admit no integer", FORGE_ERR_INVALID_ARGUMENT},
        {R"({"type":"array","minItems":3,"maxItems":2})", "maxItems 2 is below minItems 3", FORGE_ERR_INVALID_ARGUMENT},
        {R"({"type":"string","enum":[1,2]})", "admits no value", FORGE_ERR_INVALID_ARGUMENT},
        {R"({"type":"object",)", "not JSON", FORGE_ERR_INVALID_ARGUMENT},
        {R"({"$ref":"#"})", "a $ref cycle", FORGE_ERR_INVALID_ARGUMENT},
        {R"({"type":"array","minItems":1000000})", "expands counts up to", FORGE_ERR_LIMIT},
    };
    for (const Bad &b : bad) {
        forge_status st = FORGE_OK;
        std::string err, g = schema_gbnf(b.schema, &st, &err);
        if (st == FORGE_OK) { /* an error found when the grammar compiles */
            forge_model *m = llama3();
            forge_constraint c = constraint(FORGE_CONSTRAINT_JSON_SCHEMA, b.schema);
            forge_grammar *gr = nullptr;
            st = forge_grammar_create(m, &c, &gr);
            err = forge_model_errmsg(m);
            forge_grammar_free(gr);
        }
        EXPECT_EQ(st, b.st) << b.schema << ": " << err;
        EXPECT_NE(err.find(b.want), std::string::npos) << b.schema << ": " << err;
    }
    /* annotations are not constraints: accepted */
    forge_status st;
    schema_gbnf(R"({"title":"t","description":"d","$schema":"https://json-schema.org/draft/2020-12/schema","examples":[1],"default":2,"type":"integer","deprecated":false})", &st);
    EXPECT_EQ(st, FORGE_OK);
}

/* Integer and number bounds compile to digit ranges that take exactly the numbers inside. */
TEST(Schema, BoundsTakeExactlyTheNumbersInside) {
    struct R { const char *schema; double lo, hi; bool lo_ex, hi_ex, integer; };
    std::vector<R> rs = {
        {R"({"type":"integer","minimum":-15,"maximum":120})", -15, 120, false, false, true},
        {R"({"type":"integer","minimum":7,"maximum":7})", 7, 7, false, false, true},
        {R"({"type":"integer","exclusiveMinimum":-3,"exclusiveMaximum":1000})", -3, 1000, true, true, true},
        {R"({"type":"integer","minimum":95})", 95, 1e18, false, false, true},
        {R"({"type":"integer","maximum":-42})", -1e18, -42, false, false, true},
        {R"({"type":"integer","minimum":1.5,"maximum":9.9})", 2, 9, false, false, true},
        {R"({"type":"integer","minimum":0,"exclusiveMinimum":true,"maximum":10,"exclusiveMaximum":true})", 0, 10, true, true, true},
        {R"({"type":"number","minimum":-2,"maximum":3})", -2, 3, false, false, false},
        {R"({"type":"number","exclusiveMinimum":0,"maximum":1})", 0, 1, true, false, false},
        {R"({"type":"number","minimum":-10,"exclusiveMaximum":-1})", -10, -1, false, true, false},
        {R"({"type":"number","exclusiveMinimum":-1,"exclusiveMaximum":0})", -1, 0, true, true, false},
    };
    std::vector<std::string> samples;
    for (int i = -1100; i <= 1100; i++) samples.push_back(std::to_string(i));
    for (const char *x : {"-0", "0.0", "0.5", "-0.5", "1.0", "1.00", "1.01", "3.0", "3.5", "-2.0", "-2.01", "-1.99", "-10.0", "-10.5", "-0.999", "0.001",
                          "-1.0", "-1", "2.5", "9.9", "95", "96", "123456789", "-123456789", "100000000000", "007", "1.", ".5", "1e3"})
        samples.push_back(x);
    for (const R &r : rs) {
        forge_status st;
        std::string err, g = schema_gbnf(r.schema, &st, &err);
        ASSERT_EQ(st, FORGE_OK) << r.schema << ": " << err;
        for (const std::string &x : samples) {
            jc::Value v;
            bool json = jc::parse(x, v).empty();
            bool in = json && (r.integer ? v.integral : true) && (r.lo_ex ? v.num > r.lo : v.num >= r.lo) && (r.hi_ex ? v.num < r.hi : v.num <= r.hi);
            int got = match(g, x);
            if (x == "-0") continue; /* 0 written with a sign: valid, and never generated */
            if (in) EXPECT_EQ(got, 1) << r.schema << " should take " << x;
            else EXPECT_NE(got, 1) << r.schema << " should not take " << x;
        }
    }
}

/* Patterns: the grammar takes a JSON string exactly when its value matches the regex (searched
 * unanchored, as JSON Schema's patterns are), escapes included. */
TEST(Schema, PatternsMatchAsRegexesDo) {
    std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
        {"^[A-Z]{3}-[0-9]{4}$", {"ABC-1234", "AB-1234", "ABCD-1234", "abc-1234", "ABC-123"}},
        {"^\\d+(\\.\\d+)?$", {"12", "12.5", "12.", ".5", "x1"}},
        {"abc", {"abc", "xxabcxx", "ab", "ABC", ""}},
        {"^(foo|bar)+$", {"foo", "foobarfoo", "fo", "foobaz", ""}},
        {"^[^\"]*$", {"plain", "with \"quote\"", ""}},
        {"^a\\.b\\\\c$", {"a.b\\c", "axb\\c", "a.bc"}},
        {"^\\s*\\w+\\s*$", {"  word_1 ", "two words", "\tx\n"}},
        {"^[\\u00e0-\\u00ff]+$", {"\xc3\xa9\xc3\xa0", "e", ""}},
        {"^.{2,4}$", {"ab", "abcd", "abcde", "a", "a\nb"}},
        {"^x?y*z+$", {"z", "xyyz", "xz", "x", "yyy"}},
        {"^[a-c][^a-c]$", {"ax", "aa", "d1", "b\""}},
        {"^(?:ab|cd){2}$", {"abcd", "abab", "ab", "abcdab"}},
    };
    for (auto &c : cases) {
        cJSON *pattern = cJSON_CreateString(c.first.c_str());
        char *pattern_json = cJSON_PrintUnformatted(pattern);
        std::string schema = "{\"type\":\"string\",\"pattern\":" + std::string(pattern_json) + "}";
        free(pattern_json);
        cJSON_Delete(pattern);
        forge_status st;
        std::string err, g = schema_gbnf(schema, &st, &err);
        ASSERT_EQ(st, FORGE_OK) << schema << ": " << err;
        std::wstring wp;
        for (char32_t ch : jc::u32_of(c.first.c_str())) wp += (wchar_t)ch;
        for (const std::string &x : c.second) {
            std::wstring wx;
            for (char32_t ch : jc::u32_of(x.c_str())) wx += (wchar_t)ch;
            bool want = std::regex_search(wx, std::wregex(wp));
            cJSON *js = cJSON_CreateString(x.c_str());
            char *enc = cJSON_PrintUnformatted(js);
            EXPECT_EQ(match(g, enc) == 1, want) << c.first << " on " << enc;
            free(enc);
            cJSON_Delete(js);
        }
    }
}

TEST(Schema, HostileSchemasMeetLimits) {
    auto t0 = std::chrono::steady_clock::now();
    forge_status st;
    std::string err;
    /* nesting past the depth bound */
    std::string deep;
    for (int i = 0; i < 200; i++) deep += R"({"type":"object","properties":{"a":)";
    deep += R"({"type":"integer"})";
    for (int i = 0; i < 200; i++) deep += "},\"required\":[\"a\"]}";
    schema_gbnf(deep, &st, &err);
    EXPECT_EQ(st, FORGE_ERR_LIMIT) << err;
    /* a big enum: a trie of literals, compiled and matched quickly */
    std::string big = R"({"enum":[)";
    for (int i = 0; i < 100000; i++) big += (i ? ",\"item-" : "\"item-") + std::to_string(i * 7919 % 1000003) + "\"";
    big += "]}";
    std::string g = schema_gbnf(big, &st, &err);
    ASSERT_EQ(st, FORGE_OK) << err;
    EXPECT_EQ(match(g, "\"item-" + std::to_string(5 * 7919 % 1000003) + "\""), 1);
    EXPECT_EQ(match(g, "\"item-x\""), -1);
    /* mutual recursion through $ref with structure between: fine */
    schema_gbnf(R"({"$defs":{"a":{"type":"array","items":{"$ref":"#/$defs/b"}},"b":{"anyOf":[{"$ref":"#/$defs/a"},{"type":"null"}]}},"$ref":"#/$defs/a"})", &st, &err);
    EXPECT_EQ(st, FORGE_OK) << err;
    /* a $ref beside other keywords that recurses (a fuzz find, its "#" followed by NULs: the
     * merges copied the document again at each level, past 2 GB under ASan) */
    schema_gbnf(R"({"type":"array","items":{"$ref":"#","items":{"$ref":"#"},"maxItems":4}})", &st, &err);
    EXPECT_EQ(st, FORGE_ERR_LIMIT) << err;
    EXPECT_NE(err.find("merges make more than"), std::string::npos) << err;
    /* a property whose name is a rule name the additional keys' trie once made too (a fuzz find) */
    g = schema_gbnf(R"({"type":"object","properties":{"key-n3":{"type":"integer"},"r":{"type":"number"}},"required":["idid"]})", &st, &err);
    ASSERT_EQ(st, FORGE_OK) << err;
    EXPECT_EQ(match(g, R"({"key-n3": 1, "idid": null, "rr": 2})"), 1) << g;
    EXPECT_EQ(match(g, R"({"r": 1, "idid": 2, "r": 3})"), -1) << g;
    /* recursion through allOf only: a merge that never ends is cut */
    schema_gbnf(R"({"$defs":{"x":{"allOf":[{"$ref":"#/$defs/x"}]}},"$ref":"#/$defs/x"})", &st, &err);
    EXPECT_NE(st, FORGE_OK);
    /* a pattern of bounded repetitions around a letter: every byte makes states of many stacks,
     * so the mask stops at the automaton's step bound, not after minutes at the state bound (a
     * fuzz input of this kind ran one mask for over 16 minutes under ASan before the bound) */
    forge_constraint c = {sizeof c, FORGE_CONSTRAINT_JSON_SCHEMA, R"({"type": "string", "pattern": "^.{0,200}x.{0,200}y$"})"};
    forge_grammar *gr = nullptr;
    ASSERT_EQ(forge_grammar_create(llama3(), &c, &gr), FORGE_OK) << forge_model_errmsg(llama3());
    std::vector<uint32_t> mask((forge_model_n_vocab(llama3()) + 31) / 32);
    forge_status ms = FORGE_OK;
    for (int step = 0; step < 4 && ms == FORGE_OK; step++) { /* the first allowed token each time (a quote, then any) */
        if ((ms = forge_grammar_mask(gr, mask.data(), mask.size())) != FORGE_OK) break;
        int32_t tok = -1;
        for (size_t w = 0; w < mask.size() && tok < 0; w++)
            if (mask[w]) tok = (int32_t)(w * 32 + (size_t)__builtin_ctz(mask[w]));
        ASSERT_GE(tok, 0);
        ASSERT_EQ(forge_grammar_accept(gr, tok), FORGE_OK);
    }
    EXPECT_EQ(ms, FORGE_ERR_LIMIT);
    EXPECT_NE(std::string(forge_grammar_errmsg(gr)).find("automaton steps for one token"), std::string::npos) << forge_grammar_errmsg(gr);
    forge_grammar_free(gr);
    /* garbage */
    for (std::string junk : {"", "null", "[1,2]", "\"x\"", "{\"type\":[]}", "{\"properties\":5}", "{\"items\":[{\"type\":1}]}"}) {
        schema_gbnf(junk, &st, &err);
        EXPECT_NE(st, FORGE_OK) << junk;
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 60.0);
}

/* A trigger: free text until it, the grammar after it (whitespace first allowed), free again once matched. */
TEST(Grammar, TriggerLeavesTextFreeUntilIt) {
    forge_model *m = llama3();
    ASSERT_NE(m, nullptr);
    forge_constraint c = ft::sized<forge_constraint>();
    c.kind = FORGE_CONSTRAINT_JSON_OBJECT;
    c.trigger = "</think>";
    forge_grammar *g = nullptr;
    ASSERT_EQ(forge_grammar_create(m, &c, &g), FORGE_OK) << forge_model_errmsg(m);
    auto feed = [&](const std::string &text) {
        std::vector<int32_t> toks(256);
        size_t n = 0;
        EXPECT_EQ(forge_tokenize(m, text.c_str(), text.size(), FORGE_TOKENIZE_NO_PARSE_SPECIAL, toks.data(), toks.size(), &n), FORGE_OK);
        for (size_t i = 0; i < n; i++) EXPECT_EQ(forge_grammar_accept(g, toks[i]), FORGE_OK) << text << " token " << i << ": " << forge_grammar_errmsg(g);
    };
    int32_t brace = forge_token_id(m, "}"), hello = forge_token_id(m, "hello");
    EXPECT_EQ(forge_grammar_allows(g, brace), 1); /* free: anything */
    feed("Let me think } about it.\n");
    EXPECT_EQ(forge_grammar_status(g) & FORGE_GRAMMAR_IN_SPAN, 0u);
    feed("</think>\n\n");
    EXPECT_EQ(forge_grammar_status(g) & FORGE_GRAMMAR_IN_SPAN, FORGE_GRAMMAR_IN_SPAN);
    EXPECT_EQ(forge_grammar_allows(g, hello), 0);
    EXPECT_EQ(forge_grammar_allows(g, brace), 0);
    feed("{\"a\": [1, \"x\"]}");
    EXPECT_EQ(forge_grammar_status(g) & FORGE_GRAMMAR_IN_SPAN, 0u); /* matched: free again */
    EXPECT_EQ(forge_grammar_allows(g, hello), 1);
    feed(" done. </think>{}");
    EXPECT_EQ(forge_grammar_status(g) & FORGE_GRAMMAR_IN_SPAN, 0u);
    forge_grammar_free(g);
}

/* A trigger armed by a text (what forge_chat sets for a thinking reply's tool calls: "<tool_call>"
 * counts only after "</think>"): the opener written inside the thinking opens nothing, the one
 * after it opens the constraint; without the arm the first one does. Qwen 3's vocabulary, where
 * "</think>" is one special token. */
TEST(Grammar, TriggerCountsOnlyAfterItsArm) {
    std::string data = ft::tok_data();
    ASSERT_FALSE(data.empty());
    forge_model_params mp = forge_model_default_params();
    mp.vocab_only = 1;
    forge_model *m = nullptr;
    ASSERT_EQ(forge_model_load((data + "/qwen3").c_str(), &mp, &m), FORGE_OK) << forge_model_errmsg(m);
    std::string text = "<think>\nI could write <tool_call> now.\n</think>\n\nSure.<tool_call>\n{}";
    std::vector<int32_t> toks(256);
    size_t n = 0;
    ASSERT_EQ(forge_tokenize(m, text.c_str(), text.size(), 0, toks.data(), toks.size(), &n), FORGE_OK);
    int32_t opener = forge_token_id(m, "<tool_call>");
    ASSERT_GE(opener, 0);
    std::vector<int> at;
    for (size_t i = 0; i < n; i++)
        if (toks[i] == opener) at.push_back((int)i);
    ASSERT_EQ(at.size(), 2u);
    EXPECT_EQ(ft_trigger_opens(m, "root ::= \"{}\"", "<tool_call>", nullptr, toks.data(), (int)n), at[0]);
    EXPECT_EQ(ft_trigger_opens(m, "root ::= \"{}\"", "<tool_call>", "</think>", toks.data(), (int)n), at[1]);
    /* an arm that never comes: nothing opens, everything stays free */
    EXPECT_EQ(ft_trigger_opens(m, "root ::= \"{}\"", "<tool_call>", "</answer>", toks.data(), (int)n), -1);
    forge_model_free(m);
}

namespace {

/* A random-weight Llama checkpoint (hidden 32, one layer, f16) beside a real tokenizer
 * (../shared/tokenizers' `family`, V its embedding rows): its logits are close to uniform, the
 * hard case for constraints (garbage unless constrained). */
std::string random_model(const std::string &family, int V, const std::vector<std::pair<std::string, std::string>> &renames = {},
                         const std::string &name = "") {
    std::string data = ft::tok_data(), d = ft::tmpdir("grammar_" + (name.empty() ? family : name));
    for (const char *f : {"tokenizer.json", "tokenizer_config.json"}) { /* (renames: text replaced throughout both files) */
        std::vector<uint8_t> b = ft::read_file(data + "/" + family + "/" + f);
        if (b.empty()) return std::string();
        std::string t(b.begin(), b.end());
        for (const auto &[from, to] : renames)
            for (size_t at = t.find(from); at != std::string::npos; at = t.find(from, at + to.size())) t.replace(at, from.size(), to);
        ft::write_file(d + "/" + f, t.data(), t.size());
    }
    const int H = 32, D = 16;
    std::string cfg = "{\"model_type\":\"llama\",\"hidden_size\":32,\"num_hidden_layers\":1,\"num_attention_heads\":2,"
                      "\"num_key_value_heads\":1,\"intermediate_size\":64,\"vocab_size\":" + std::to_string(V) + ",\"max_position_embeddings\":2048,"
                      "\"rms_norm_eps\":1e-5,\"rope_theta\":500000.0,\"tie_word_embeddings\":true,\"torch_dtype\":\"float16\"}";
    ft::write_file(d + "/config.json", cfg.data(), cfg.size());
    struct T { std::string name; std::vector<int64_t> shape; };
    std::string p = "model.layers.0.";
    std::vector<T> ts = {{"model.embed_tokens.weight", {V, H}}, {"model.norm.weight", {H}}, {p + "input_layernorm.weight", {H}},
                         {p + "post_attention_layernorm.weight", {H}}, {p + "self_attn.q_proj.weight", {2 * D, H}},
                         {p + "self_attn.k_proj.weight", {D, H}}, {p + "self_attn.v_proj.weight", {D, H}},
                         {p + "self_attn.o_proj.weight", {H, 2 * D}}, {p + "mlp.gate_proj.weight", {64, H}},
                         {p + "mlp.up_proj.weight", {64, H}}, {p + "mlp.down_proj.weight", {H, 64}}};
    std::string hdr = "{";
    std::vector<uint8_t> body;
    uint32_t seed = 11;
    for (auto &t : ts) {
        size_t n = 1;
        for (auto x : t.shape) n *= (size_t)x;
        std::vector<float> v = ft::randn(n, 0.5f, seed++);
        std::vector<uint8_t> b(n * 2);
        for (size_t i = 0; i < n; i++) {
            uint16_t h = ft_f32_to_f16(v[i]);
            memcpy(&b[2 * i], &h, 2);
        }
        hdr += (hdr.size() > 1 ? "," : "") + std::string("\"") + t.name + "\":{\"dtype\":\"F16\",\"shape\":[";
        for (size_t i = 0; i < t.shape.size(); i++) hdr += (i ? "," : "") + std::to_string(t.shape[i]);
        hdr += "],\"data_offsets\":[" + std::to_string(body.size()) + "," + std::to_string(body.size() + b.size()) + "]}";
        body.insert(body.end(), b.begin(), b.end());
    }
    hdr += "}";
    std::vector<uint8_t> file;
    for (int i = 0; i < 8; i++) file.push_back((uint8_t)((uint64_t)hdr.size() >> (8 * i)));
    file.insert(file.end(), hdr.begin(), hdr.end());
    file.insert(file.end(), body.begin(), body.end());
    ft::write_file(d + "/model.safetensors", file.data(), file.size());
    return d;
}

/* The Llama 3 one, made once per process. */
std::string random_llama3() {
    static std::string dir = random_model("llama3", 128256);
    return dir;
}

struct GenRun {
    std::vector<int32_t> tokens;
    std::string text;
    forge_metrics mt = ft::sized<forge_metrics>();
    forge_status st = FORGE_OK;
};

int collect(void *u, int32_t tok, const char *text, size_t n) {
    GenRun *r = (GenRun *)u;
    if (tok >= 0) r->tokens.push_back(tok);
    r->text.append(text, n);
    return 0;
}

GenRun generate(forge_session *s, const std::string &prompt, const forge_constraint *c, float temp, uint64_t seed, int max_tokens) {
    GenRun r;
    forge_generate_params p = forge_generate_default_params();
    p.temperature = temp;
    p.seed = seed;
    p.max_tokens = max_tokens;
    p.constraint = c;
    p.on_token = collect;
    p.user_data = &r;
    r.st = forge_generate(s, prompt.c_str(), prompt.size(), &p, &r.mt);
    return r;
}

/* The tokens replayed through a fresh grammar: all allowed (the output never left it). */
bool replays(forge_model *m, const forge_constraint *c, const std::vector<int32_t> &toks, std::string *why) {
    forge_grammar *g = nullptr;
    if (forge_grammar_create(m, c, &g) != FORGE_OK) { *why = forge_model_errmsg(m); return false; }
    bool ok = true;
    for (size_t i = 0; i < toks.size() && ok; i++)
        if (forge_grammar_accept(g, toks[i]) != FORGE_OK) { *why = "token " + std::to_string(i) + ": " + forge_grammar_errmsg(g); ok = false; }
    forge_grammar_free(g);
    return ok;
}

} // namespace

/* Checks a run of constraint c (a JSON Schema when schema is not empty): every output that ends
 * matched parses and validates; every other one stopped at max_tokens with a prefix of a match. */
static void check_run(forge_model *m, const forge_constraint *c, const std::string &schema, const GenRun &r, const std::string &what, int *complete) {
    std::string why;
    EXPECT_TRUE(replays(m, c, r.tokens, &why)) << what << ": " << why << "\n" << r.text;
    EXPECT_EQ(r.mt.generated_tokens, (int)r.tokens.size()) << what;
    if (r.mt.constraint_complete) {
        (*complete)++;
        EXPECT_TRUE(r.mt.stop_reason == FORGE_STOP_CONSTRAINT || r.mt.stop_reason == FORGE_STOP_EOS) << what << " " << r.mt.stop_reason;
        if (!schema.empty()) { EXPECT_EQ(jc::validate(r.text, schema), "") << what << "\n" << r.text; }
    } else {
        EXPECT_EQ(r.mt.stop_reason, FORGE_STOP_MAX_TOKENS) << what << "\n" << r.text;
    }
}

/* Constrained generation on random weights (the real Llama 3 tokenizer), greedy and sampled. */
TEST(Constrained, RandomWeightOutputsValidate) {
    std::string dir = random_llama3();
    ASSERT_FALSE(dir.empty());
    forge_model *m = ft::load(dir);
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 512);
    ASSERT_NE(s, nullptr);
    int complete = 0, total = 0;
    for (const char *f : {"09-sentiment.json", "28-rgb-color.json", "55-time-slot.json"}) {
        std::string schema = slurp(ft::src(std::string("bench/schemas/") + f));
        forge_constraint c = constraint(FORGE_CONSTRAINT_JSON_SCHEMA, schema);
        /* a greedy run given exactly the tokens its match takes ends matched, as the constraint's
         * stop (the last token both completes the object and reaches max_tokens) */
        GenRun whole = generate(s, "Answer in JSON:", &c, 0.0f, 7, 200);
        ASSERT_EQ(whole.st, FORGE_OK) << f << ": " << forge_session_errmsg(s);
        if (whole.mt.constraint_complete && whole.mt.stop_reason == FORGE_STOP_CONSTRAINT) {
            GenRun exact = generate(s, "Answer in JSON:", &c, 0.0f, 7, whole.mt.generated_tokens);
            EXPECT_EQ(exact.tokens, whole.tokens) << f;
            EXPECT_EQ(exact.mt.stop_reason, FORGE_STOP_CONSTRAINT) << f;
            EXPECT_EQ(exact.mt.constraint_complete, 1) << f;
        }
        for (float temp : {0.0f, 1.2f}) {
            GenRun r = generate(s, "Answer in JSON:", &c, temp, 7, 48);
            ASSERT_EQ(r.st, FORGE_OK) << f << ": " << forge_session_errmsg(s);
            check_run(m, &c, schema, r, std::string(f) + " T " + std::to_string(temp), &complete);
            total++;
        }
    }
    EXPECT_GE(complete, 2) << complete << " of " << total << " runs matched whole";
    forge_session_free(s);
    forge_model_free(m);
}

/* The same on the bundled story model (a SentencePiece vocabulary of 512 with byte fallback):
 * many schemas, temperatures and seeds, JSON objects and a GBNF grammar. */
TEST(Constrained, StoryModelOutputsValidate) {
    forge_model *m = ft::load(ft::src("models/stories260K/stories260K.gguf"));
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 512);
    int complete = 0, total = 0;
    std::vector<std::string> files = corpus_files();
    for (size_t i = 0; i < files.size(); i += 3) {
        std::string schema = slurp(files[i]);
        forge_constraint c = constraint(FORGE_CONSTRAINT_JSON_SCHEMA, schema);
        for (float temp : {0.0f, 0.8f, 1.5f}) {
            GenRun r = generate(s, "Once upon a time", &c, temp, 1 + i, 150);
            ASSERT_EQ(r.st, FORGE_OK) << files[i] << ": " << forge_session_errmsg(s);
            check_run(m, &c, schema, r, files[i] + " T " + std::to_string(temp), &complete);
            total++;
        }
    }
    EXPECT_GE(complete, total / 3) << complete << " of " << total << " runs matched whole";
    forge_constraint obj = ft::sized<forge_constraint>();
    obj.kind = FORGE_CONSTRAINT_JSON_OBJECT;
    std::string chess = slurp(ft::src("tests/fixtures/grammar/chess.gbnf"));
    forge_constraint gb = constraint(FORGE_CONSTRAINT_GBNF, chess);
    for (float temp : {0.0f, 1.0f, 2.0f}) {
        int dummy = 0;
        GenRun r = generate(s, "The object", &obj, temp, 3, 150);
        ASSERT_EQ(r.st, FORGE_OK) << forge_session_errmsg(s);
        check_run(m, &obj, "{\"type\":\"object\"}", r, "object", &dummy);
        GenRun q = generate(s, "1.", &gb, temp, 4, 150);
        ASSERT_EQ(q.st, FORGE_OK) << forge_session_errmsg(s);
        check_run(m, &gb, "", q, "chess", &dummy);
        if (q.mt.constraint_complete) { EXPECT_EQ(match(chess, q.text), 1) << q.text; }
    }
    forge_session_free(s);
    forge_model_free(m);
}

/* Greedy with a constraint (forced text sampled too) is, token by token, the highest-logit token
 * the grammar allows: checked against the logits of forge_eval and the whole mask. Params 2 and
 * 3: the same with the sampler's reduction on the device (topk.comp's greedy argmax over the row
 * logit_mask.comp masked), which a GPU runs and lavapipe otherwise leaves to the host. The
 * device's masked row decides every draw: none falls back to the host's whole row. */
class ConstrainedGreedy : public ::testing::TestWithParam<int> {};

TEST_P(ConstrainedGreedy, IsTheBestAllowedToken) {
    bool story = GetParam() % 2 == 0;
    forge_model *m = story ? ft::load(ft::src("models/stories260K/stories260K.gguf")) : ft::load(random_llama3());
    ASSERT_NE(m, nullptr);
    if (GetParam() >= 2) ft_model_set_sample_on_host(m, 0);
    forge_session *s = ft::session(m, 512), *ref = ft::session(m, 512);
    std::string schema = slurp(ft::src("bench/schemas/01-user-profile.json"));
    forge_constraint c = constraint(FORGE_CONSTRAINT_JSON_SCHEMA, schema);
    c.sample_forced = 1;
    GenRun r = generate(s, "Profile:", &c, 0.0f, 0, story ? 80 : 16);
    ASSERT_EQ(r.st, FORGE_OK) << forge_session_errmsg(s);
    EXPECT_EQ(r.mt.forced_tokens, 0);
    EXPECT_EQ(r.mt.constraint_masks, 0) << "the mask the device applied decides every greedy draw";
    int V = forge_model_n_vocab(m);
    std::vector<int32_t> prompt(64);
    size_t n = 0;
    ASSERT_EQ(forge_tokenize(m, "Profile:", 8, FORGE_TOKENIZE_ADD_SPECIAL, prompt.data(), prompt.size(), &n), FORGE_OK);
    prompt.resize(n);
    forge_grammar *g = nullptr;
    ASSERT_EQ(forge_grammar_create(m, &c, &g), FORGE_OK);
    std::vector<float> logits(V);
    std::vector<uint32_t> mask((V + 31) / 32);
    ASSERT_EQ(forge_eval(ref, prompt.data(), (int)prompt.size(), 0, logits.data(), V), FORGE_OK);
    for (size_t i = 0; i < r.tokens.size(); i++) {
        ASSERT_EQ(forge_grammar_mask(g, mask.data(), mask.size()), FORGE_OK);
        int best = -1;
        for (int t = 0; t < V; t++)
            if (((mask[t / 32] >> (t % 32)) & 1) && (best < 0 || logits[t] > logits[best])) best = t;
        ASSERT_EQ(r.tokens[i], best) << "step " << i;
        ASSERT_EQ(forge_grammar_accept(g, best), FORGE_OK);
        ASSERT_EQ(forge_eval(ref, &best, 1, 0, logits.data(), V), FORGE_OK);
    }
    forge_grammar_free(g);
    forge_session_free(s);
    forge_session_free(ref);
    forge_model_free(m);
}

INSTANTIATE_TEST_SUITE_P(Models, ConstrainedGreedy, ::testing::Values(0, 1, 2, 3), [](const ::testing::TestParamInfo<int> &i) {
    return std::string(i.param % 2 == 0 ? "Stories260K" : "RandomLlama3") + (i.param >= 2 ? "DeviceReduction" : "");
});

/* The constrained draw decides from the 256 candidates exactly as from the whole row: the same
 * token for the same random numbers, under every filter; and its draws follow the allowed
 * tokens' renormalized distribution. */
TEST(Constrained, CandidatesDecideAsTheWholeRow) {
    const int V = 3000;
    std::mt19937 gen(7);
    int decided = 0, total = 0;
    for (int trial = 0; trial < 300; trial++) {
        std::vector<float> l = ft::randn(V, trial % 3 == 0 ? 0.5f : 3.0f, 100 + trial);
        std::vector<uint8_t> allowed(V);
        double density = trial % 4 == 0 ? 0.002 : trial % 4 == 1 ? 0.05 : trial % 4 == 2 ? 0.5 : 0.95;
        for (int i = 0; i < V; i++) allowed[i] = std::bernoulli_distribution(density)(gen);
        allowed[trial % V] = 1;
        float temp = trial % 5 == 0 ? 0.0f : 0.3f + 0.1f * (trial % 17);
        int top_k = trial % 7 == 1 ? 20 : trial % 7 == 2 ? 400 : 0;
        float top_p = trial % 6 == 3 ? 0.9f : 1.0f, min_p = trial % 8 == 5 ? 0.05f : 0.0f;
        uint64_t a[4], b[4];
        ft_rng_seed(a, trial);
        ft_rng_seed(b, trial);
        int used = 0, used_full = 0;
        int32_t t1 = ft_draw_constrained(l.data(), allowed.data(), V, 256, temp, top_k, top_p, min_p, a, &used);
        int32_t t2 = ft_draw_constrained(l.data(), allowed.data(), V, V, temp, top_k, top_p, min_p, b, &used_full);
        ASSERT_GE(t1, 0);
        ASSERT_TRUE(allowed[t1]) << trial;
        EXPECT_EQ(t1, t2) << "trial " << trial << " T " << temp << " k " << top_k << " p " << top_p << " min_p " << min_p;
        EXPECT_EQ(used_full, 0);
        decided += !used;
        total++;
    }
    EXPECT_GT(decided, total / 3) << "the candidates should decide most draws";
    /* the distribution: a plain draw at T = 1 over a sparse allowed set */
    std::vector<float> l = ft::randn(V, 1.0f, 5);
    std::vector<uint8_t> allowed(V);
    for (int i = 0; i < V; i += 97) allowed[i] = 1;
    double S = 0;
    for (int i = 0; i < V; i++) if (allowed[i]) S += std::exp(l[i]);
    std::map<int, int> count;
    uint64_t rng[4];
    ft_rng_seed(rng, 99);
    int N = 20000;
    for (int k = 0; k < N; k++) {
        int used;
        count[ft_draw_constrained(l.data(), allowed.data(), V, 256, 1.0f, 0, 1.0f, 0.0f, rng, &used)]++;
    }
    for (int i = 0; i < V; i++)
        if (allowed[i]) { EXPECT_NEAR(count[i] / (double)N, std::exp(l[i]) / S, 0.015) << i; }
}

/* Forced text is written without draws (and counted), sample_forced turns that off; a grammar
 * that cannot end within max_tokens stops there with a prefix of a match. */
TEST(Constrained, ForcedTextAndStopReasons) {
    std::string dir = random_llama3();
    ASSERT_FALSE(dir.empty());
    forge_model *m = ft::load(dir);
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 1024);
    std::string schema = R"({"type":"object","properties":{"customer_account_identifier":{"type":"integer","minimum":0,"maximum":9},)"
                         R"("preferred_notification_channel":{"enum":["email","sms"]}},"required":["customer_account_identifier","preferred_notification_channel"],"additionalProperties":false})";
    forge_constraint c = constraint(FORGE_CONSTRAINT_JSON_SCHEMA, schema);
    GenRun r = generate(s, "JSON:", &c, 0.0f, 0, 100);
    ASSERT_EQ(r.st, FORGE_OK) << forge_session_errmsg(s);
    EXPECT_GT(r.mt.forced_tokens, 3) << r.text;
    EXPECT_EQ(r.mt.stop_reason, FORGE_STOP_CONSTRAINT) << r.text;
    EXPECT_EQ(r.mt.constraint_complete, 1);
    EXPECT_EQ(jc::validate(r.text, schema), "") << r.text;
    c.sample_forced = 1;
    GenRun q = generate(s, "JSON:", &c, 0.0f, 0, 100);
    EXPECT_EQ(q.mt.forced_tokens, 0);
    EXPECT_EQ(jc::validate(q.text, schema), "") << q.text;
    /* cannot end within max_tokens */
    forge_constraint longg = constraint(FORGE_CONSTRAINT_GBNF, "root ::= \"ab\"{400} \"!\"");
    GenRun t = generate(s, "x", &longg, 0.8f, 1, 12);
    ASSERT_EQ(t.st, FORGE_OK) << forge_session_errmsg(s);
    EXPECT_EQ(t.mt.stop_reason, FORGE_STOP_MAX_TOKENS);
    EXPECT_EQ(t.mt.constraint_complete, 0);
    EXPECT_EQ((int)t.tokens.size(), 12);
    std::string why;
    EXPECT_TRUE(replays(m, &longg, t.tokens, &why)) << why;
    /* a grammar of the empty string is matched before any token */
    forge_constraint empty = constraint(FORGE_CONSTRAINT_GBNF, "root ::= \"\"");
    GenRun e = generate(s, "x", &empty, 0.0f, 1, 12);
    EXPECT_EQ(e.mt.stop_reason, FORGE_STOP_CONSTRAINT);
    EXPECT_EQ(e.mt.generated_tokens, 0);
    EXPECT_EQ(e.mt.constraint_complete, 1);
    /* an invalid grammar fails the call before any work, naming the problem */
    forge_constraint bad = constraint(FORGE_CONSTRAINT_GBNF, "root ::= nope");
    GenRun b = generate(s, "x", &bad, 0.0f, 1, 12);
    EXPECT_EQ(b.st, FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_session_errmsg(s)).find("'nope'"), std::string::npos) << forge_session_errmsg(s);
    forge_session_free(s);
    forge_model_free(m);
}

/* Batch items with constraints give what forge_generate gives for each alone. */
TEST(Constrained, BatchItemsMatchGenerate) {
    forge_model *m = ft::load(ft::src("models/stories260K/stories260K.gguf"));
    ASSERT_NE(m, nullptr);
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = 512;
    sp.n_seq_max = 3;
    forge_session *bs = ft::session(m, sp), *s = ft::session(m, 512);
    std::string s1 = slurp(ft::src("bench/schemas/09-sentiment.json")), s2 = slurp(ft::src("bench/schemas/28-rgb-color.json"));
    forge_constraint c1 = constraint(FORGE_CONSTRAINT_JSON_SCHEMA, s1), c2 = constraint(FORGE_CONSTRAINT_JSON_SCHEMA, s2);
    const char *choices[] = {"yes", "no", "maybe later"};
    forge_constraint c3 = ft::sized<forge_constraint>();
    c3.kind = FORGE_CONSTRAINT_CHOICES;
    c3.choices = choices;
    c3.n_choices = 3;
    const forge_constraint *cs[4] = {&c1, &c2, nullptr, &c3};
    float temps[4] = {0.0f, 0.9f, 0.0f, 0.7f};
    std::vector<GenRun> runs(4);
    std::vector<forge_generate_params> ps(4);
    std::vector<forge_batch_item> items(4);
    std::string prompt = "Reply:";
    for (int i = 0; i < 4; i++) {
        ps[i] = forge_generate_default_params();
        ps[i].temperature = temps[i];
        ps[i].seed = 10 + i;
        ps[i].max_tokens = 60;
        ps[i].constraint = cs[i];
        ps[i].on_token = collect;
        ps[i].user_data = &runs[i];
        items[i] = ft::sized<forge_batch_item>();
        items[i].text = prompt.c_str();
        items[i].text_len = prompt.size();
        items[i].params = &ps[i];
    }
    std::vector<forge_batch_result> res(4, ft::sized<forge_batch_result>());
    ASSERT_EQ(forge_batch_generate(bs, items.data(), 4, res.data()), FORGE_OK) << forge_session_errmsg(bs);
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ(res[i].status, FORGE_OK) << i;
        GenRun alone = generate(s, prompt, cs[i], temps[i], 10 + i, 60);
        EXPECT_EQ(runs[i].tokens, alone.tokens) << "item " << i << "\n" << runs[i].text << "\n" << alone.text;
        EXPECT_EQ(res[i].metrics.stop_reason, alone.mt.stop_reason) << i;
        EXPECT_EQ(res[i].metrics.forced_tokens, alone.mt.forced_tokens) << i;
        EXPECT_EQ(res[i].metrics.constraint_complete, alone.mt.constraint_complete) << i;
    }
    EXPECT_TRUE(runs[3].text == "yes" || runs[3].text == "no" || runs[3].text == "maybe later") << runs[3].text;
    forge_session_free(bs);
    forge_session_free(s);
    forge_model_free(m);
}

/* Classify with choices: the choice each prompt's model writes, as generate writes it. */
TEST(Constrained, ClassifyChoices) {
    forge_model *m = ft::load(ft::src("models/stories260K/stories260K.gguf"));
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 512), *g = ft::session(m, 512);
    const char *choices[] = {"positive", "negative", "neutral", "positively not", "n/a"};
    forge_constraint c = ft::sized<forge_constraint>();
    c.kind = FORGE_CONSTRAINT_CHOICES;
    c.choices = choices;
    c.n_choices = 5;
    std::vector<std::string> texts = {"Great movie!", "Awful.", "It was a film.", "Meh", "I loved every minute of it", "No comment"};
    std::vector<forge_classify_prompt> ps;
    for (auto &t : texts) {
        forge_classify_prompt q = ft::sized<forge_classify_prompt>();
        q.text = t.c_str();
        q.text_len = t.size();
        ps.push_back(q);
    }
    forge_classify_params cp = forge_classify_default_params();
    cp.constraint = &c;
    std::vector<forge_classify_result> res(texts.size(), ft::sized<forge_classify_result>());
    ASSERT_EQ(forge_classify(s, ps.data(), (int)ps.size(), &cp, res.data()), FORGE_OK) << forge_session_errmsg(s);
    for (size_t i = 0; i < texts.size(); i++) {
        ASSERT_GE(res[i].choice, 0) << i;
        ASSERT_LT(res[i].choice, 5) << i;
        GenRun r = generate(g, texts[i], &c, 0.0f, 0, 20);
        EXPECT_EQ(r.text, choices[res[i].choice]) << texts[i];
    }
    EXPECT_EQ(forge_session_n_past(s), 0);
    /* without choices the result says -1 */
    cp.constraint = nullptr;
    ASSERT_EQ(forge_classify(s, ps.data(), 1, &cp, res.data()), FORGE_OK);
    EXPECT_EQ(res[0].choice, -1);
    forge_session_free(s);
    forge_session_free(g);
    forge_model_free(m);
}

namespace {

/* The two tools of the required-calls tests: get_weather's parameters (a string of at most 12
 * characters and an enum) and get_time's (an integer in [-12, 14]). */
const std::string weather_schema = "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 12}, "
                                   "\"unit\": {\"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": [\"city\", \"unit\"], "
                                   "\"additionalProperties\": false}";
const std::string clock_schema = "{\"type\": \"object\", \"properties\": {\"zone\": {\"type\": \"integer\", \"minimum\": -12, \"maximum\": 14}}, "
                                 "\"required\": [\"zone\"], \"additionalProperties\": false}";
const forge_tool weather_tools[2] = {{sizeof(forge_tool), "get_weather", "Weather in a city.", weather_schema.c_str()},
                                     {sizeof(forge_tool), "get_time", nullptr, clock_schema.c_str()}};

/* forge_chat_tools with FORGE_CHAT_TOOL_REQUIRED on session s (its model's template set), greedy
 * and at T 1.2, seeds 1 to 3: a reply that ends matched is 1 to max_calls calls of the two tools
 * whose arguments validate against their schemas, each with its own id of 9 letters and digits,
 * and no content; one that does not stopped for max_tokens. Returns how many of the 6 ended
 * matched. */
int required_tool_calls(forge_session *s, int max_tokens, int max_calls) {
    forge_chat_message user = {sizeof(forge_chat_message), "user", "Weather in Paris?", nullptr, 0};
    int complete = 0;
    for (float temp : {0.0f, 1.2f}) {
        for (uint64_t seed : {1u, 2u, 3u}) {
            forge_generate_params p = forge_generate_default_params();
            p.temperature = temp;
            p.seed = seed;
            p.max_tokens = max_tokens;
            forge_chat_reply r = ft::sized<forge_chat_reply>();
            forge_metrics mt = ft::sized<forge_metrics>();
            EXPECT_EQ(forge_chat_tools(s, &user, 1, weather_tools, 2, FORGE_CHAT_TOOL_REQUIRED, &p, &r, &mt), FORGE_OK) << forge_session_errmsg(s);
            std::string what = "T " + std::to_string(temp) + " seed " + std::to_string(seed) + ": " + std::string(r.text, r.text_len);
            if (!mt.constraint_complete) {
                EXPECT_EQ(mt.stop_reason, FORGE_STOP_MAX_TOKENS) << what;
                continue;
            }
            complete++;
            EXPECT_GE(r.n_tool_calls, 1) << what;
            EXPECT_LE(r.n_tool_calls, max_calls) << what;
            for (int i = 0; i < r.n_tool_calls; i++) {
                std::string name = r.tool_names[i];
                EXPECT_TRUE(name == "get_weather" || name == "get_time") << what;
                EXPECT_EQ(jc::validate(r.tool_arguments[i], name == "get_weather" ? weather_schema : clock_schema), "") << what << "\n" << r.tool_arguments[i];
                std::string id = r.tool_ids[i];
                EXPECT_EQ(id.size(), 9u) << what;
                for (char ch : id) EXPECT_TRUE(isalnum((unsigned char)ch)) << what << " id " << id;
                for (int k = 0; k < i; k++) EXPECT_NE(id, r.tool_ids[k]) << what;
            }
            EXPECT_EQ(r.content_len, 0u) << what;
        }
    }
    return complete;
}

} // namespace

/* forge_chat_tools on random weights with Qwen 3.5's template (the Qwen 3 tokenizer, whose ChatML
 * tokens 3.5 shares): FORGE_CHAT_TOOL_REQUIRED makes the reply <tool_call><function=...> blocks of
 * the given tools whose values, read by the schemas (a raw string, an enum, JSON integers),
 * validate against them. */
TEST(ToolCalls, Qwen35RequiredCallsValidateOnRandomWeights) {
    std::string dir = random_model("qwen3", 151936);
    ASSERT_FALSE(dir.empty());
    forge_model *m = ft::load(dir);
    ASSERT_NE(m, nullptr);
    std::string tmpl = slurp(ft::src("tests/fixtures/chat/qwen3.5-0.8b.jinja"));
    ft_model_set_chat_template(m, tmpl.c_str());
    forge_session *s = ft::session(m, 2048);
    ASSERT_NE(s, nullptr);
    int complete = required_tool_calls(s, 64, 1000);
    EXPECT_GE(complete, 4) << complete << " of 6 runs made whole calls";
    forge_session_free(s);
    forge_model_free(m);
}

/* forge_chat_tools on random weights with Mistral v0.3's and Nemo's templates (read by their text:
 * the Llama 3 tokenizer serves): FORGE_CHAT_TOOL_REQUIRED writes [TOOL_CALLS] after the prompt and
 * makes the reply the call array after it, which parses back into calls with ids; the history
 * with those calls and results answering their ids renders; without the flags the reply is free. */
TEST(ToolCalls, MistralRequiredCallsValidateOnRandomWeights) {
    std::string dir = random_llama3();
    ASSERT_FALSE(dir.empty());
    forge_model *m = ft::load(dir);
    ASSERT_NE(m, nullptr);
    for (const char *file : {"mistral-7b-instruct-v0.3.jinja", "mistral-nemo-instruct-2407.jinja"}) {
        std::string tmpl = slurp(ft::src(std::string("tests/fixtures/chat/") + file));
        ft_model_set_chat_template(m, tmpl.c_str());
        forge_session *s = ft::session(m, 1024);
        ASSERT_NE(s, nullptr);
        if (file[8] == '7') { /* v0.3: six runs. Random weights write white space in the JSON and
                               * call after call (the array goes on): few end within 192 tokens */
            int complete = required_tool_calls(s, 192, 1000);
            EXPECT_GE(complete, 2) << file << ": " << complete << " of 6 runs made whole calls";
        }
        forge_chat_message user = {sizeof(forge_chat_message), "user", "Weather in Paris?", nullptr, 0};
        forge_generate_params p = forge_generate_default_params();
        p.max_tokens = 192;
        forge_chat_reply r = ft::sized<forge_chat_reply>();
        forge_metrics mt = ft::sized<forge_metrics>();
        for (uint64_t seed = 1; seed <= 6; seed++) { /* the first sampled run that ends matched */
            p.temperature = 1.2f;
            p.seed = seed;
            ASSERT_EQ(forge_chat_tools(s, &user, 1, weather_tools, 2, FORGE_CHAT_TOOL_REQUIRED, &p, &r, &mt), FORGE_OK) << forge_session_errmsg(s);
            std::string text(r.text, r.text_len);
            EXPECT_EQ(text.rfind("[TOOL_CALLS]", 0), 0u) << text;
            if (mt.constraint_complete) break;
        }
        ASSERT_TRUE(mt.constraint_complete) << file << ": no run of 6 ended matched";
        ASSERT_GT(r.n_tool_calls, 0) << std::string(r.text, r.text_len);
        std::vector<std::string> names, args, ids;
        for (int i = 0; i < r.n_tool_calls; i++) names.push_back(r.tool_names[i]), args.push_back(r.tool_arguments[i]), ids.push_back(r.tool_ids[i]);
        std::vector<forge_tool_call> calls;
        std::vector<forge_chat_message> conv = {user};
        for (size_t i = 0; i < names.size(); i++) calls.push_back({sizeof(forge_tool_call), names[i].c_str(), args[i].c_str(), ids[i].c_str()});
        conv.push_back({sizeof(forge_chat_message), "assistant", "", calls.data(), (int)calls.size()});
        for (size_t i = 0; i < names.size(); i++) conv.push_back({sizeof(forge_chat_message), "tool", "{\"ok\": true}", nullptr, 0, ids[i].c_str()});
        std::vector<char> out(1 << 16);
        size_t len = 0;
        ASSERT_EQ(forge_chat_render_tools(m, conv.data(), (int)conv.size(), weather_tools, 2, 0, out.data(), out.size(), &len), FORGE_OK)
            << forge_model_errmsg(m);
        std::string rendered(out.data(), len);
        for (const std::string &id : ids) EXPECT_NE(rendered.find("\"call_id\": \"" + id + "\"}[/TOOL_RESULTS]"), std::string::npos) << rendered;
        conv.back().tool_call_id = nullptr; /* a result without its id: the template's error */
        EXPECT_EQ(forge_chat_render_tools(m, conv.data(), (int)conv.size(), weather_tools, 2, 0, out.data(), out.size(), &len),
                  FORGE_ERR_INVALID_ARGUMENT);
        p.temperature = 0.0f;
        p.max_tokens = 8;
        ASSERT_EQ(forge_chat_tools(s, &user, 1, weather_tools, 2, 0, &p, &r, nullptr), FORGE_OK) << forge_session_errmsg(s);
        EXPECT_EQ(std::string(r.text, r.text_len).find("[TOOL_CALLS]"), std::string::npos);
        forge_session_free(s);
    }
    forge_model_free(m);
}

/* Tokens in a grammar, llama.cpp's <[ID]> and <TEXT>: a special token is matched as that token
 * alone (no text spells it: not its own characters, nor the byte tokens of its escape), by id or by
 * its text alike; an ordinary token by its text; a name that is no token, an id past the vocabulary
 * and a token by text without a model are refused by name. */
TEST(Grammar, TokenElements) {
    std::string dir = random_llama3();
    ASSERT_FALSE(dir.empty());
    forge_model *m = ft::load(dir);
    ASSERT_NE(m, nullptr);
    const int32_t sp = forge_token_id(m, "<|reserved_special_token_5|>");
    ASSERT_GE(sp, 0);
    const int V = forge_model_n_vocab(m);
    const size_t words = ((size_t)V + 31) / 32;
    std::vector<uint32_t> mask(words);
    auto one = [&](const char *text) {
        int32_t ids[8];
        size_t n = 0;
        EXPECT_EQ(forge_tokenize(m, text, strlen(text), 0, ids, 8, &n), FORGE_OK);
        EXPECT_EQ(n, 1u) << text;
        return ids[0];
    };
    const int32_t x = one("x"), y = one("y"), lt = one("<");
    for (std::string g : {std::string("root ::= \"x\" <|reserved_special_token_5|> \"y\""), "root ::= \"x\" <[" + std::to_string(sp) + "]> \"y\""}) {
        forge_constraint c = ft::sized<forge_constraint>();
        c.kind = FORGE_CONSTRAINT_GBNF;
        c.text = g.c_str();
        c.sample_forced = 1;
        forge_grammar *gr = nullptr;
        ASSERT_EQ(forge_grammar_create(m, &c, &gr), FORGE_OK) << forge_model_errmsg(m);
        EXPECT_FALSE(forge_grammar_allows(gr, sp)) << g;
        ASSERT_EQ(forge_grammar_accept(gr, x), FORGE_OK);
        ASSERT_EQ(forge_grammar_mask(gr, mask.data(), words), FORGE_OK);
        size_t allowed = 0;
        for (uint32_t w : mask) allowed += (size_t)__builtin_popcount(w);
        EXPECT_EQ(allowed, 1u) << g;
        EXPECT_TRUE((mask[sp / 32] >> (sp % 32)) & 1) << g;
        EXPECT_TRUE(forge_grammar_allows(gr, sp)) << g;
        EXPECT_FALSE(forge_grammar_allows(gr, lt)) << g;
        EXPECT_FALSE(forge_grammar_allows(gr, y)) << g;
        ASSERT_EQ(forge_grammar_accept(gr, sp), FORGE_OK);
        EXPECT_FALSE(forge_grammar_allows(gr, sp)) << g;
        EXPECT_TRUE(forge_grammar_allows(gr, y)) << g;
        ASSERT_EQ(forge_grammar_accept(gr, y), FORGE_OK);
        EXPECT_EQ(forge_grammar_status(gr) & (FORGE_GRAMMAR_COMPLETE | FORGE_GRAMMAR_DONE), FORGE_GRAMMAR_COMPLETE | FORGE_GRAMMAR_DONE) << g;
        forge_grammar_free(gr);
    }
    { /* an ordinary token named by id matches its text, whichever tokens spell it */
        const int32_t hello = one("hello");
        std::string g = "root ::= <[" + std::to_string(hello) + "]>";
        forge_constraint c = ft::sized<forge_constraint>();
        c.kind = FORGE_CONSTRAINT_GBNF;
        c.text = g.c_str();
        forge_grammar *gr = nullptr;
        ASSERT_EQ(forge_grammar_create(m, &c, &gr), FORGE_OK) << forge_model_errmsg(m);
        EXPECT_TRUE(forge_grammar_allows(gr, hello));
        EXPECT_TRUE(forge_grammar_allows(gr, one("he")));
        EXPECT_FALSE(forge_grammar_allows(gr, sp));
        forge_grammar_free(gr);
    }
    const std::string past = "root ::= <[" + std::to_string(V) + "]>";
    const std::pair<std::string, std::string> bad[] = {
        {"root ::= <|not_a_token|>", "token <|not_a_token|> is not one token of the model's vocabulary"},
        {past, "is outside the vocabulary (0 to " + std::to_string(V - 1) + ")"},
    };
    for (const auto &[g, msg] : bad) {
        forge_constraint c = ft::sized<forge_constraint>();
        c.kind = FORGE_CONSTRAINT_GBNF;
        c.text = g.c_str();
        forge_grammar *gr = nullptr;
        EXPECT_EQ(forge_grammar_create(m, &c, &gr), FORGE_ERR_INVALID_ARGUMENT) << g;
        EXPECT_NE(std::string(forge_model_errmsg(m)).find(msg), std::string::npos) << forge_model_errmsg(m);
    }
    forge_model_free(m);
}

namespace {

/* Gemma 4's control tokens on Gemma 3's tokenizer (the same 262144 entries): its turns (ids 105 /
 * 106), <|tool_response> (id 50, an end token), and unused ids 51-55 made the special tokens of
 * its calls and declarations (<|"|>, <|tool_call>, <tool_call|>, <|tool>, <tool|>). */
std::vector<std::pair<std::string, std::string>> gemma4_renames() {
    std::vector<std::pair<std::string, std::string>> r = {{"<start_of_turn>", "<|turn>"}, {"<end_of_turn>", "<turn|>"}, {"<unused44>", "<|tool_response>"}};
    const char *const names[] = {"<|\\\"|>", "<|tool_call>", "<tool_call|>", "<|tool>", "<tool|>"};
    for (int i = 0; i < 5; i++) {
        std::string unused = "<unused" + std::to_string(45 + i) + ">";
        r.push_back({"\"content\": \"" + unused + "\",\n      \"single_word\": false,\n      \"lstrip\": false,\n      \"rstrip\": false,\n"
                     "      \"normalized\": false,\n      \"special\": false",
                     "\"content\": \"" + unused + "\",\n      \"single_word\": false,\n      \"lstrip\": false,\n      \"rstrip\": false,\n"
                     "      \"normalized\": false,\n      \"special\": true"});
        r.push_back({unused, names[i]});
    }
    return r;
}

} // namespace

/* forge_chat_tools on random weights with Gemma 4's format (its control tokens on Gemma 3's
 * tokenizer; forge tells Gemma 4 by its turn tokens): FORGE_CHAT_TOOL_REQUIRED makes the reply
 * <|tool_call>call:NAME{...}<tool_call|> blocks in Gemma 4's notation, the string marks and the
 * block's ends its special tokens, whose arguments validate against the tools' schemas; with
 * FORGE_CHAT_TOOL_ARGUMENTS the reply is free until a <|tool_call>. */
TEST(ToolCalls, Gemma4RequiredCallsValidateOnRandomWeights) {
    std::string dir = random_model("gemma3", 262144, gemma4_renames(), "gemma4");
    ASSERT_FALSE(dir.empty());
    forge_model *m = ft::load(dir);
    ASSERT_NE(m, nullptr);
    const int32_t quote = forge_token_id(m, "<|\"|>"), open = forge_token_id(m, "<|tool_call>"), close = forge_token_id(m, "<tool_call|>");
    ASSERT_EQ(quote, 51);
    ASSERT_EQ(open, 52);
    ASSERT_EQ(close, 53);
    EXPECT_TRUE(forge_token_is_special(m, quote));
    forge_session *s = ft::session(m, 1024);
    ASSERT_NE(s, nullptr);
    /* the prompt renders the tools in Gemma 4's declarations */
    forge_chat_message user = {sizeof(forge_chat_message), "user", "Weather in Paris?", nullptr, 0};
    std::vector<char> out(1 << 14);
    size_t len = 0;
    ASSERT_EQ(forge_chat_render_tools(m, &user, 1, weather_tools, 2, 0, out.data(), out.size(), &len), FORGE_OK) << forge_model_errmsg(m);
    EXPECT_NE(std::string(out.data(), len).find("<|tool>declaration:get_weather{"), std::string::npos) << std::string(out.data(), len);
    int complete = required_tool_calls(s, 64, 1000);
    EXPECT_GE(complete, 4) << complete << " of 6 runs made whole calls";
    /* a required reply's tokens (get_weather alone: its city and unit are strings): the calls'
     * marks are the special tokens, never their characters */
    forge_generate_params p = forge_generate_default_params();
    p.max_tokens = 64;
    GenRun run;
    p.on_token = collect;
    p.user_data = &run;
    forge_chat_reply r = ft::sized<forge_chat_reply>();
    ASSERT_EQ(forge_chat_tools(s, &user, 1, weather_tools, 1, FORGE_CHAT_TOOL_REQUIRED, &p, &r, &run.mt), FORGE_OK) << forge_session_errmsg(s);
    ASSERT_FALSE(run.tokens.empty());
    EXPECT_EQ(run.tokens[0], open);
    EXPECT_EQ(std::string(r.text, r.text_len).rfind("<|tool_call>call:get_weather{", 0), 0u) << std::string(r.text, r.text_len);
    int quotes = 0;
    for (int32_t t : run.tokens) quotes += t == quote;
    EXPECT_GE(quotes, 4) << run.text;
    if (run.mt.constraint_complete) {
        ASSERT_GE(r.n_tool_calls, 1) << run.text;
        EXPECT_EQ(jc::validate(r.tool_arguments[0], weather_schema), "") << run.text;
    }
    for (size_t at = run.text.find("<|"); at != std::string::npos; at = run.text.find("<|", at + 1)) /* each "<|" is a special token's */
        EXPECT_TRUE(!run.text.compare(at, 5, "<|\"|>") || !run.text.compare(at, 12, "<|tool_call>")) << run.text;
    /* free until the opener: random weights seldom write it, and the reply stays content then */
    p.on_token = nullptr;
    p.max_tokens = 8;
    ASSERT_EQ(forge_chat_tools(s, &user, 1, weather_tools, 2, FORGE_CHAT_TOOL_ARGUMENTS, &p, &r, nullptr), FORGE_OK) << forge_session_errmsg(s);
    forge_session_free(s);
    forge_model_free(m);
}

/* Gemma 4's call grammar against its own template's notation: a call forge renders into the
 * history (format_argument's: marks, bare keys, nested objects and arrays, numbers, booleans,
 * null), read back as tokens, is taken token by token by the grammar of the same tool; its
 * characters typed as text where a mark belongs are not; what the notation cannot be held to is
 * refused by name. */
TEST(ToolCalls, Gemma4GrammarTakesItsRenderedCalls) {
    std::string dir = random_model("gemma3", 262144, gemma4_renames(), "gemma4");
    ASSERT_FALSE(dir.empty());
    forge_model *m = ft::load(dir);
    ASSERT_NE(m, nullptr);
    const char *schema = "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"code\": {\"type\": \"string\", \"maxLength\": 4}, "
                         "\"day\": {\"type\": \"string\", \"format\": \"date\"}, \"opts\": {\"type\": \"object\", \"properties\": "
                         "{\"days\": {\"type\": \"array\", \"items\": {\"type\": \"integer\", \"minimum\": 1}}, \"hourly\": {\"type\": \"boolean\"}}, "
                         "\"additionalProperties\": false}, \"ratio\": {\"type\": \"number\"}, \"tags\": {\"type\": \"array\", "
                         "\"items\": {\"type\": \"string\"}}, \"unit\": {\"enum\": [\"celsius\", 7, null]}}, \"required\": [\"city\", \"unit\"], "
                         "\"additionalProperties\": {\"type\": \"string\"}}";
    forge_tool tool = {sizeof(forge_tool), "get_weather", "Weather.", schema};
    const char *args[] = {"{\"city\": \"Paris <b> x<\", \"code\": \"75 0\", \"unit\": \"celsius\"}",
                          "{\"city\": \"\", \"day\": \"2026-02-28\", \"opts\": {\"days\": [1, 22], \"hourly\": true}, \"ratio\": -0.5, "
                          "\"tags\": [\"a\", \"b c\"], \"unit\": 7, \"zz\": \"more\"}",
                          "{\"city\": \"Nice\", \"opts\": {}, \"tags\": [], \"unit\": null}"};
    char err[256];
    const char *trigger = nullptr;
    char *g = ft_tool_grammar(6, &tool, 1, 1, &trigger, err, sizeof err);
    ASSERT_NE(g, nullptr) << err;
    EXPECT_EQ(trigger, nullptr);
    const std::string gbnf = g;
    free(g);
    forge_constraint c = ft::sized<forge_constraint>();
    c.kind = FORGE_CONSTRAINT_GBNF;
    c.text = gbnf.c_str();
    c.sample_forced = 1;
    auto walk = [&](const std::string &text) { /* tokens taken before the first refused, and whether all were, complete */
        std::vector<int32_t> ids(4096);
        size_t n = 0;
        EXPECT_EQ(forge_tokenize(m, text.data(), text.size(), 0, ids.data(), ids.size(), &n), FORGE_OK);
        forge_grammar *gr = nullptr;
        EXPECT_EQ(forge_grammar_create(m, &c, &gr), FORGE_OK) << forge_model_errmsg(m) << "\n" << gbnf;
        if (!gr) return false;
        bool ok = true;
        for (size_t i = 0; i < n && ok; i++) {
            ok = forge_grammar_allows(gr, ids[i]) != 0;
            if (ok) { EXPECT_EQ(forge_grammar_accept(gr, ids[i]), FORGE_OK); }
        }
        ok = ok && (forge_grammar_status(gr) & FORGE_GRAMMAR_COMPLETE);
        forge_grammar_free(gr);
        return ok;
    };
    for (const char *a : args) {
        forge_tool_call call = {sizeof(forge_tool_call), "get_weather", a, nullptr};
        forge_chat_message conv[2] = {{sizeof(forge_chat_message), "user", "Weather?", nullptr, 0},
                                      {sizeof(forge_chat_message), "assistant", "", &call, 1}};
        std::vector<char> out(1 << 14);
        size_t len = 0;
        ASSERT_EQ(forge_chat_render_tools(m, conv, 2, &tool, 1, 0, out.data(), out.size(), &len), FORGE_OK) << forge_model_errmsg(m);
        std::string text(out.data(), len);
        size_t open = text.find("<|tool_call>call:"), close = text.find("<tool_call|>", open);
        ASSERT_NE(close, std::string::npos) << text;
        std::string block = text.substr(open, close + 12 - open);
        EXPECT_TRUE(walk(block)) << block << "\n" << gbnf;
        EXPECT_TRUE(walk(block + block)) << block;
        std::string typed = block; /* the first mark typed as its characters */
        size_t q = typed.find("<|\"|>");
        ASSERT_NE(q, std::string::npos);
        typed.replace(q, 5, "<|\" |>");
        EXPECT_FALSE(walk(typed)) << typed;
    }
    for (std::string bad : {std::string("<|tool_call>call:get_weather{city:<|\"|>P<|\"|>}<tool_call|>"), /* unit is required */
                            std::string("<|tool_call>call:get_weather{city:<|\"|>P<|\"|>,unit:<|\"|>kelvin<|\"|>}<tool_call|>"),
                            std::string("<|tool_call>call:get_weather{city:<|\"|>a<|b<|\"|>,unit:7}<tool_call|>"),
                            std::string("<|tool_call>call:get_weather{ city:<|\"|>P<|\"|>,unit:7}<tool_call|>"),
                            std::string("<|tool_call>call:get_weather{city:<|\"|>P<|\"|>,code:<|\"|>12345<|\"|>,unit:7}<tool_call|>"),
                            std::string("<|tool_call>call:get_weather{city:<|\"|>P<|\"|>,code:<|\"|>a<b<|\"|>,unit:7}<tool_call|>")})
        EXPECT_FALSE(walk(bad)) << bad;
    EXPECT_TRUE(walk("<|tool_call>call:get_weather{city:<|\"|>a<b<|\"|>,unit:7}<tool_call|>"));
    /* the trigger's form: what follows <|tool_call>, to its close */
    g = ft_tool_grammar(6, &tool, 1, 0, &trigger, err, sizeof err);
    ASSERT_NE(g, nullptr) << err;
    EXPECT_STREQ(trigger, "<|tool_call>");
    free(g);
    const std::pair<const char *, const char *> refused[] = {
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"pattern\": \"^x$\"}}}", "pattern on a string in Gemma 4's notation"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"enum\": [[1], 2]}}}", "an object or array in \"enum\" in Gemma 4's notation"},
    };
    for (const auto &[sc, why] : refused) {
        forge_tool t = {sizeof(forge_tool), "f", nullptr, sc};
        EXPECT_EQ(ft_tool_grammar(6, &t, 1, 1, &trigger, err, sizeof err), nullptr) << sc;
        EXPECT_NE(std::string(err).find(why), std::string::npos) << err;
    }
    forge_tool empty = {sizeof(forge_tool), "f", nullptr, "{\"type\": \"object\", \"properties\": {\"s\": {\"enum\": [\"\", 1]}}}"}; /* (a fuzz find) */
    g = ft_tool_grammar(6, &empty, 1, 1, &trigger, err, sizeof err);
    ASSERT_NE(g, nullptr) << err;
    c.text = g;
    EXPECT_TRUE(walk("<|tool_call>call:f{s:<|\"|><|\"|>}<tool_call|>")) << g;
    EXPECT_TRUE(walk("<|tool_call>call:f{s:1}<tool_call|>")) << g;
    EXPECT_FALSE(walk("<|tool_call>call:f{s:<|\"|>x<|\"|>}<tool_call|>")) << g;
    free(g);
    forge_tool brace = {sizeof(forge_tool), "f{x}", nullptr, nullptr};
    EXPECT_EQ(ft_tool_grammar(6, &brace, 1, 1, &trigger, err, sizeof err), nullptr);
    EXPECT_NE(std::string(err).find("'{', '<' or a newline in its name"), std::string::npos) << err;
    forge_model_free(m);
}

/* forge_chat_tools on random weights with Llama 3.2's template: FORGE_CHAT_TOOL_REQUIRED makes the
 * reply one call of a given tool whose arguments validate against its schema, and the reply parses
 * back into that call; without the flags the reply is free text (parsed as content). */
TEST(ToolCalls, RequiredCallsValidateOnRandomWeights) {
    std::string dir = random_llama3();
    ASSERT_FALSE(dir.empty());
    forge_model *m = ft::load(dir);
    ASSERT_NE(m, nullptr);
    std::string tmpl = slurp(ft::src("tests/fixtures/chat/llama3.2-instruct.jinja"));
    ft_model_set_chat_template(m, tmpl.c_str());
    forge_session *s = ft::session(m, 1024);
    ASSERT_NE(s, nullptr);
    int complete = required_tool_calls(s, 96, 1);
    EXPECT_GE(complete, 4) << complete << " of 6 runs made a whole call";
    forge_chat_message user = {sizeof(forge_chat_message), "user", "Weather in Paris?", nullptr, 0};
    forge_generate_params p = forge_generate_default_params();
    p.max_tokens = 8;
    forge_chat_reply r = ft::sized<forge_chat_reply>();
    ASSERT_EQ(forge_chat_tools(s, &user, 1, weather_tools, 2, 0, &p, &r, nullptr), FORGE_OK) << forge_session_errmsg(s);
    EXPECT_EQ(r.n_tool_calls, 0);
    forge_constraint c = constraint(FORGE_CONSTRAINT_JSON_OBJECT, "");
    p.constraint = &c;
    EXPECT_EQ(forge_chat_tools(s, &user, 1, weather_tools, 2, FORGE_CHAT_TOOL_ARGUMENTS, &p, &r, nullptr), FORGE_ERR_INVALID_ARGUMENT);
    p.constraint = nullptr; /* forge_chat has no tools: the flags are refused, not ignored */
    EXPECT_EQ(forge_chat(s, &user, 1, FORGE_CHAT_TOOL_REQUIRED, &p, nullptr), FORGE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(forge_session_errmsg(s)).find("forge_chat_tools"), std::string::npos) << forge_session_errmsg(s);
    forge_session_free(s);
    forge_model_free(m);
}
