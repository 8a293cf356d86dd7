// forge embed and forge rerank through the binary: the vectors and scores are
// sentence-transformers' and transformers' (tests/fixtures/embed/*/reference.json, made by
// tools/fixtures/make_embed_fixtures.py), given as arguments or with --stdin-json, plain or
// --json, with each option that changes them; bad input is a usage error (2) that names what
// is wrong, before the model loads where it can; a model of the other kind is a runtime error (1).
// Result from the build tree, where the forge binary is.
#include <cjson/cJSON.h>

#include <algorithm>
#include <sstream>

#include "cli_process.h"

namespace {

struct Result {
    int status;
    std::string out, err;
};

/* ./forge ARGS (no shell: any text is one argument); with `input`, stdin is that text, else empty. */
Result forge_run(const std::vector<std::string> &args, const std::string *input = nullptr) {
    std::string d = ft::tmpdir("cli_embed"), in;
    if (input) {
        in = d + "/stdin.txt";
        ft::write_file(in, input->data(), input->size());
    }
    Result r{-1, "", ""};
    {
        ft::Forge f(d, args, in);
        f.close_input();
        r.status = f.wait_exit(300);
        r.out = f.stdout_text();
        r.err = f.stderr_text();
    }
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
    return r;
}

std::string fixture(const std::string &name) { return ft::src("tests/fixtures/embed/" + name); }

/* reference.json of a fixture (cJSON_Delete it). */
cJSON *reference(const std::string &name) {
    std::vector<uint8_t> b = ft::read_file(fixture(name) + "/reference.json");
    cJSON *j = cJSON_ParseWithLength((const char *)b.data(), b.size());
    EXPECT_NE(j, nullptr) << name;
    return j;
}

std::vector<std::string> strings(const cJSON *arr) {
    std::vector<std::string> out;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) out.push_back(it->valuestring);
    return out;
}

std::vector<double> numbers(const cJSON *arr) {
    std::vector<double> out;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        EXPECT_TRUE(cJSON_IsNumber(it));
        out.push_back(it->valuedouble);
    }
    return out;
}

/* A JSON array of the strings, as --stdin-json reads it. */
std::string json_array(const std::vector<std::string> &v) {
    cJSON *a = cJSON_CreateArray();
    for (const std::string &s : v) cJSON_AddItemToArray(a, cJSON_CreateString(s.c_str()));
    char *t = cJSON_PrintUnformatted(a);
    std::string out = t;
    cJSON_free(t);
    cJSON_Delete(a);
    return out;
}

/* The token count of each reference input (its "ids"): what the metrics' prompt_tokens sums. */
int total_ids(const cJSON *ids) {
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, ids) n += cJSON_GetArraySize(it);
    return n;
}

void expect_near_all(const std::vector<double> &got, const std::vector<double> &want, double tol, const std::string &what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double worst = 0;
    for (size_t i = 0; i < got.size(); i++) worst = std::max(worst, std::fabs(got[i] - want[i]));
    EXPECT_LE(worst, tol) << what;
}

/* The "metrics" object's fields: present and sane; its prompt_tokens. */
int check_metrics(const cJSON *j, const char *rate) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "metrics");
    EXPECT_TRUE(cJSON_IsObject(m));
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(m, "prompt_tokens"), *ms = cJSON_GetObjectItemCaseSensitive(m, "prefill_ms"),
                *r = cJSON_GetObjectItemCaseSensitive(m, rate);
    EXPECT_TRUE(cJSON_IsNumber(pt) && cJSON_IsNumber(ms) && cJSON_IsNumber(r)) << rate;
    if (!cJSON_IsNumber(pt) || !cJSON_IsNumber(ms) || !cJSON_IsNumber(r)) return -1;
    EXPECT_GT(ms->valuedouble, 0);
    EXPECT_GT(r->valuedouble, 0);
    EXPECT_EQ(cJSON_GetArraySize(m), 3) << "metrics: prompt_tokens, prefill_ms, " << rate;
    return (int)pt->valuedouble;
}

/* The lines of s (without their '\n'). */
std::vector<std::string> lines(const std::string &s) {
    std::vector<std::string> out;
    std::istringstream in(s);
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
}

} // namespace

/* Every case of the Qwen3-Embedding fixture (no prompt, --prompt-name query / document, --prompt,
 * --dim 16), all seven texts through --stdin-json --json: sentence-transformers' vectors within
 * 1e-4; the plain output (texts as arguments) is the same values, a line per text. */
TEST(CliEmbed, VectorsAreSentenceTransformers) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    const std::string model = fixture("qwen3_embed_f32");
    cJSON *ref = reference("qwen3_embed_f32");
    ASSERT_NE(ref, nullptr);
    const std::vector<std::string> texts = strings(cJSON_GetObjectItem(ref, "texts"));
    ASSERT_EQ(texts.size(), 7u);
    const std::string input = json_array(texts);
    int n_cases = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(ref, "cases")) {
        std::vector<std::string> opts;
        const cJSON *v;
        if ((v = cJSON_GetObjectItem(c, "prompt_name"))) opts.insert(opts.end(), {"--prompt-name", v->valuestring});
        if ((v = cJSON_GetObjectItem(c, "prompt"))) opts.insert(opts.end(), {"--prompt", v->valuestring});
        if ((v = cJSON_GetObjectItem(c, "truncate_dim"))) opts.insert(opts.end(), {"--dim", std::to_string(v->valueint)});
        std::string what;
        for (const std::string &o : opts) what += o + " ";
        SCOPED_TRACE("case " + std::to_string(n_cases) + ": " + what);
        const cJSON *want = cJSON_GetObjectItem(c, "vectors");
        const int dim = cJSON_GetArraySize(cJSON_GetArrayItem(want, 0));

        std::vector<std::string> args = {"embed", model, "--stdin-json", "--json"};
        args.insert(args.end(), opts.begin(), opts.end());
        Result r = forge_run(args, &input);
        ASSERT_EQ(r.status, 0) << r.err;
        EXPECT_EQ(r.err, "");
        cJSON *j = cJSON_Parse(r.out.c_str());
        ASSERT_NE(j, nullptr) << "not JSON: " << r.out;
        EXPECT_EQ(std::string(cJSON_GetStringValue(cJSON_GetObjectItem(j, "model"))), model);
        EXPECT_EQ(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "dim")), dim);
        const cJSON *got = cJSON_GetObjectItem(j, "embeddings");
        ASSERT_EQ(cJSON_GetArraySize(got), (int)texts.size()) << r.out;
        for (int i = 0; i < (int)texts.size(); i++)
            expect_near_all(numbers(cJSON_GetArrayItem(got, i)), numbers(cJSON_GetArrayItem(want, i)), 1e-4, "text " + std::to_string(i));
        /* the tokens embedded: each text's, prompt and special tokens included, as the reference tokenized them */
        EXPECT_EQ(check_metrics(j, "texts_per_s"), total_ids(cJSON_GetObjectItem(c, "ids")));

        /* the same texts as arguments, plain: a line per text, the JSON's values (%.9g both) */
        std::vector<std::string> plain = {"embed", model};
        plain.insert(plain.end(), opts.begin(), opts.end());
        plain.insert(plain.end(), texts.begin(), texts.end());
        Result p = forge_run(plain);
        ASSERT_EQ(p.status, 0) << p.err;
        std::vector<std::string> ls = lines(p.out);
        ASSERT_EQ(ls.size(), texts.size()) << p.out;
        for (int i = 0; i < (int)texts.size(); i++) {
            std::vector<double> vals;
            std::istringstream in(ls[i]);
            for (double x; in >> x;) vals.push_back(x);
            EXPECT_EQ(vals, numbers(cJSON_GetArrayItem(got, i))) << "line " << i << ": " << ls[i];
            EXPECT_EQ(ls[i].find("  "), std::string::npos);
        }
        cJSON_Delete(j);
        n_cases++;
    }
    EXPECT_EQ(n_cases, 5);
    cJSON_Delete(ref);
}

/* The options the reference has no case for change the vectors as they say: --no-normalize
 * gives the unnormalized vector (the checkpoint ends in Normalize), --normalize after --dim a unit
 * vector, --pooling mean another vector; FORGE_MODEL stands for MODEL, every argument a TEXT. */
TEST(CliEmbed, NormalizePoolingAndForgeModel) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    const std::string model = fixture("qwen3_embed_f32");
    auto vec = [&](std::vector<std::string> args) {
        args.insert(args.begin(), {"embed", model, "--json"});
        args.push_back("The quick brown fox jumps over the lazy dog.");
        Result r = forge_run(args);
        EXPECT_EQ(r.status, 0) << r.err;
        cJSON *j = cJSON_Parse(r.out.c_str());
        std::vector<double> v = j ? numbers(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "embeddings"), 0)) : std::vector<double>();
        cJSON_Delete(j);
        return v;
    };
    auto norm = [](const std::vector<double> &v) {
        double s = 0;
        for (double x : v) s += x * x;
        return std::sqrt(s);
    };
    std::vector<double> def = vec({}), raw = vec({"--no-normalize"}), cut = vec({"--dim", "16", "--normalize"}), mean = vec({"--pooling", "mean"});
    ASSERT_EQ(def.size(), 64u);
    EXPECT_NEAR(norm(def), 1.0, 1e-5);
    ASSERT_EQ(raw.size(), 64u);
    EXPECT_GT(std::fabs(norm(raw) - 1.0), 1e-3); /* not normalized, and the same direction */
    for (size_t i = 0; i < raw.size(); i++) EXPECT_NEAR(raw[i] / norm(raw), def[i], 1e-5) << i;
    ASSERT_EQ(cut.size(), 16u);
    EXPECT_NEAR(norm(cut), 1.0, 1e-5);
    for (size_t i = 0; i < cut.size(); i++) EXPECT_NEAR(cut[i] * norm(std::vector<double>(def.begin(), def.begin() + 16)), def[i], 1e-5) << i;
    ASSERT_EQ(mean.size(), 64u);
    EXPECT_NEAR(norm(mean), 1.0, 1e-5);
    EXPECT_GT(std::fabs(mean[0] - def[0]) + std::fabs(mean[1] - def[1]), 1e-4);
    /* --pooling last is the checkpoint's own (last token) */
    EXPECT_EQ(vec({"--pooling", "last"}), def);

    Result plain = forge_run({"embed", model, "hello", "42"});
    ASSERT_EQ(plain.status, 0) << plain.err;
    std::string d = ft::tmpdir("cli_embed_env");
    EXPECT_EQ(system(("FORGE_MODEL='" + model + "' ./forge embed hello 42 > " + d + "/out.txt 2>&1").c_str()), 0);
    std::vector<uint8_t> o = ft::read_file(d + "/out.txt");
    EXPECT_EQ(std::string(o.begin(), o.end()), plain.out);
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}

/* Qwen3-Reranker (a causal LM's P(yes)) with its default instruction and with --instruction,
 * and a Qwen3ForSequenceClassification cross-encoder (sigmoid of its score head, --raw the logit):
 * the references' scores within 1e-4, --json and the plain lines alike. */
TEST(CliRerank, ScoresAreTransformers) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    struct Case {
        std::string fixture;
        std::vector<std::string> opts;
        std::vector<double> want;
        int tokens;
    };
    std::vector<Case> cases;
    std::string query;
    std::vector<std::string> docs;
    {
        cJSON *ref = reference("qwen3_rerank_f32");
        ASSERT_NE(ref, nullptr);
        query = cJSON_GetStringValue(cJSON_GetObjectItem(ref, "query"));
        docs = strings(cJSON_GetObjectItem(ref, "documents"));
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(ref, "cases")) {
            const cJSON *instr = cJSON_GetObjectItem(c, "instruction");
            std::vector<std::string> opts;
            if (cJSON_IsString(instr)) opts = {"--instruction", instr->valuestring};
            cases.push_back({"qwen3_rerank_f32", opts, numbers(cJSON_GetObjectItem(c, "scores")), total_ids(cJSON_GetObjectItem(c, "ids"))});
        }
        ASSERT_EQ(cases.size(), 2u);
        EXPECT_TRUE(cases[0].opts.empty()); /* the first case: instruction null, the default */
        cJSON_Delete(ref);
    }
    {
        cJSON *ref = reference("qwen3_cross_f32");
        ASSERT_NE(ref, nullptr);
        EXPECT_EQ(std::string(cJSON_GetStringValue(cJSON_GetObjectItem(ref, "query"))), query);
        EXPECT_EQ(strings(cJSON_GetObjectItem(ref, "documents")), docs);
        int tokens = total_ids(cJSON_GetObjectItem(ref, "ids"));
        cases.push_back({"qwen3_cross_f32", {}, numbers(cJSON_GetObjectItem(ref, "scores")), tokens});
        cases.push_back({"qwen3_cross_f32", {"--raw"}, numbers(cJSON_GetObjectItem(ref, "logits")), tokens});
        cJSON_Delete(ref);
    }
    const std::string input = json_array(docs);
    for (const Case &k : cases) {
        std::string what = k.fixture;
        for (const std::string &o : k.opts) what += " " + o;
        SCOPED_TRACE(what);
        const std::string model = fixture(k.fixture);
        std::vector<std::string> args = {"rerank", model, "--query", query, "--json", "--stdin-json"};
        args.insert(args.end(), k.opts.begin(), k.opts.end());
        Result r = forge_run(args, &input);
        ASSERT_EQ(r.status, 0) << r.err;
        EXPECT_EQ(r.err, "");
        cJSON *j = cJSON_Parse(r.out.c_str());
        ASSERT_NE(j, nullptr) << "not JSON: " << r.out;
        EXPECT_EQ(std::string(cJSON_GetStringValue(cJSON_GetObjectItem(j, "model"))), model);
        EXPECT_EQ(std::string(cJSON_GetStringValue(cJSON_GetObjectItem(j, "query"))), query);
        std::vector<double> got = numbers(cJSON_GetObjectItem(j, "scores"));
        expect_near_all(got, k.want, 1e-4, "scores");
        EXPECT_EQ(check_metrics(j, "documents_per_s"), k.tokens);
        cJSON_Delete(j);

        /* plain, the documents as arguments: SCORE<TAB>INDEX<TAB>DOC in the given order */
        std::vector<std::string> plain = {"rerank", model, "--query", query};
        plain.insert(plain.end(), k.opts.begin(), k.opts.end());
        plain.insert(plain.end(), docs.begin(), docs.end());
        Result p = forge_run(plain);
        ASSERT_EQ(p.status, 0) << p.err;
        std::vector<std::string> ls = lines(p.out);
        ASSERT_EQ(ls.size(), docs.size()) << p.out;
        for (size_t i = 0; i < docs.size(); i++) {
            size_t t1 = ls[i].find('\t'), t2 = ls[i].find('\t', t1 + 1);
            ASSERT_NE(t2, std::string::npos) << ls[i];
            EXPECT_EQ(std::stod(ls[i].substr(0, t1)), got[i]) << ls[i];
            EXPECT_EQ(ls[i].substr(t1 + 1, t2 - t1 - 1), std::to_string(i));
            EXPECT_EQ(ls[i].substr(t2 + 1), docs[i]); /* each under 60 characters: whole */
        }
    }
    /* a document's first 60 characters (not bytes), its tabs and line breaks as spaces */
    std::string longdoc = "tab\there\nline ";
    while (longdoc.size() < 200) longdoc += "\xc3\xa9t\xc3\xa9 ";
    Result p = forge_run({"rerank", fixture("qwen3_cross_f32"), "--query", query, longdoc});
    ASSERT_EQ(p.status, 0) << p.err;
    std::string head = "tab here line ";
    for (size_t at = 14; head.size() < 200 && at < longdoc.size();) head += longdoc[at++];
    std::string field = p.out.substr(p.out.find('\t', p.out.find('\t') + 1) + 1);
    ASSERT_FALSE(field.empty());
    EXPECT_EQ(field.back(), '\n');
    field.pop_back();
    size_t chars = 0;
    for (unsigned char ch : field) chars += (ch & 0xC0) != 0x80;
    EXPECT_EQ(chars, 60u) << field;
    EXPECT_EQ(head.compare(0, field.size(), field), 0) << field;
}

/* Bad input is a usage error (2) that names it, with nothing on stdout: values, contradictions,
 * what is missing, and --stdin-json that is not an array of strings; a model of the other kind
 * is the library's error (1). */
TEST(CliEmbed, BadInputSaysWhat) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    const std::string E = fixture("qwen3_embed_f32"), R = fixture("qwen3_rerank_f32"), X = fixture("qwen3_cross_f32");
    struct Bad {
        std::vector<std::string> args;
        const char *stdin_text; /* nullptr: none */
        const char *err;        /* stderr starts with it */
    };
    const Bad bad[] = {
        {{"embed", E, "--dim", "x", "hello"}, nullptr, "forge embed: --dim: 'x' must be an integer in 1..2147483647\n"},
        {{"embed", E, "--dim", "-3", "hello"}, nullptr, "forge embed: --dim: '-3' must be an integer in 1..2147483647\n"},
        {{"embed", E, "--dim", "65", "hello"}, nullptr, "forge embed: --dim: 65 is more than the model's vector of 64 values\n"},
        {{"embed", E, "--pooling", "max", "hello"}, nullptr, "forge embed: --pooling takes last, mean or cls, not 'max'\n"},
        {{"embed", E, "--normalize", "--no-normalize", "hello"}, nullptr, "forge embed: --normalize and --no-normalize contradict each other\nusage: forge embed "},
        {{"embed", E, "--prompt", "a: ", "--prompt-name", "query", "hello"}, nullptr,
         "forge embed: --prompt-name and --prompt both give the prompt: give one of them\nusage: forge embed "},
        {{"embed", E, "--prompt-name", "nope", "hello"}, nullptr, "forge embed: --prompt-name: 'nope' is not one of the model's prompts (query,document)\n"},
        {{"embed", E}, nullptr, "forge embed: no TEXT given (or --stdin-json)\nusage: forge embed "},
        {{"embed", E, "--stdin-json", "hello"}, "[\"a\"]", "forge embed: --stdin-json reads stdin: no TEXT argument goes with it\nusage: forge embed "},
        {{"embed", E, "--stdin-json"}, "{\"texts\": [\"a\"]}", "forge embed: --stdin-json: stdin is not a JSON array of strings\n"},
        {{"embed", E, "--stdin-json"}, "[\"a\", 3]", "forge embed: --stdin-json: element 1 is not a string (stdin must be a JSON array of strings)\n"},
        {{"embed", E, "--stdin-json"}, "[\"a\", [1, 2]]", "forge embed: --stdin-json: element 1 is not a string"},
        {{"embed", E, "--stdin-json"}, "[]", "forge embed: --stdin-json: the array is empty: no TEXT given\n"},
        {{"embed", E, "--stdin-json"}, "", "forge embed: --stdin-json: stdin is not a JSON array of strings\n"},
        {{"embed", E, "--dim"}, nullptr, "forge embed: --dim needs a value\nusage: forge embed "},
        {{"embed", E, "--bogus", "hello"}, nullptr, "forge embed: unexpected argument '--bogus'\nusage: forge embed "},
        {{"embed", E, "--adapter", "x", "hello"}, nullptr, "forge embed: unexpected argument '--adapter'\nusage: forge embed "},
        {{"rerank", R, "doc"}, nullptr, "forge rerank: --query Q is required\nusage: forge rerank "},
        {{"rerank", R, "--query", "q"}, nullptr, "forge rerank: no DOC given (or --stdin-json)\nusage: forge rerank "},
        {{"rerank", R, "--query", "q", "--stdin-json"}, "\"doc\"", "forge rerank: --stdin-json: stdin is not a JSON array of strings\n"},
        {{"rerank", R, "--query", "q", "--stdin-json"}, "[null]", "forge rerank: --stdin-json: element 0 is not a string"},
        {{"rerank", R, "--query", "q", "--stdin-json", "doc"}, "[\"a\"]", "forge rerank: --stdin-json reads stdin: no DOC argument goes with it\n"},
        {{"rerank", R, "--query"}, nullptr, "forge rerank: --query needs a value\nusage: forge rerank "},
        {{"rerank", R, "--query", "q", "--top-k", "3", "doc"}, nullptr, "forge rerank: unexpected argument '--top-k'\nusage: forge rerank "},
    };
    for (const Bad &b : bad) {
        std::string what;
        for (const std::string &a : b.args) what += a + " ";
        SCOPED_TRACE(what);
        std::string in = b.stdin_text ? b.stdin_text : "";
        Result r = forge_run(b.args, b.stdin_text ? &in : nullptr);
        EXPECT_EQ(r.status, 2) << r.err;
        EXPECT_EQ(r.out, "");
        EXPECT_EQ(r.err.rfind(b.err, 0), 0u) << r.err;
    }
    /* the other kind of model: the library says what it lacks (a runtime error, 1) */
    Result e = forge_run({"embed", X, "hello"});
    EXPECT_EQ(e.status, 1) << e.err;
    EXPECT_EQ(e.out, "");
    EXPECT_NE(e.err.find("(FORGE_ERR_UNSUPPORTED)"), std::string::npos) << e.err;
    Result k = forge_run({"rerank", E, "--query", "q", "doc"});
    EXPECT_EQ(k.status, 1) << k.err;
    EXPECT_EQ(k.out, "");
    EXPECT_NE(k.err.find("(FORGE_ERR_UNSUPPORTED)"), std::string::npos) << k.err;
    /* --no-truncate: a text past the limit is refused, naming it; with truncation it runs */
    std::string longtext;
    while (longtext.size() < 4000) longtext += "a b c d ";
    Result t = forge_run({"embed", E, "--no-truncate", "hello", longtext});
    EXPECT_EQ(t.status, 1) << t.err;
    EXPECT_EQ(t.out, "");
    EXPECT_NE(t.err.find("text 1 has "), std::string::npos) << t.err;
    EXPECT_NE(t.err.find("(FORGE_ERR_LIMIT)"), std::string::npos) << t.err;
    Result ok = forge_run({"embed", E, "--dim", "2", "hello", longtext});
    EXPECT_EQ(ok.status, 0) << ok.err;
    EXPECT_EQ(lines(ok.out).size(), 2u) << ok.out;
}
