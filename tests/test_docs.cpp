/* The documentation's code is code the build compiles and the tests run (issue 42):
 *
 * - every fenced block (```) in README.md, docs/ and the bindings' READMEs follows a line
 *   `<!-- snippet: SOURCE -->` and is SOURCE's text: a whole file (`examples/generate.c`), the
 *   lines of a file between its `docs:begin NAME` and `docs:end NAME` comments with their common
 *   indentation removed (`bindings/go/example_test.go tour`), or what a forge command prints
 *   (`$ forge help`, run with the build tree's ./forge); the files are examples the build
 *   compiles and the tests run, Go examples `go test` runs, or this file, whose LoRA snippet
 *   runs below. Indented blocks are shell commands, not code.
 * - README.md's speed table is what `bench/results.py --readme` writes from bench/RESULTS.md.
 * - the docs' relative links (and their #anchors) resolve, the options docs/cli.md and
 *   docs/json.md name are options the CLI parses, and docs/layout.md lists forge.c's sections
 *   in forge.c's order.
 * - README.md stays a five-minute read: 12 kB at most. */
#include <dirent.h>

#include <algorithm>
#include <set>

#include "util.h"

namespace {

std::string text_of(const std::string &path) {
    std::vector<uint8_t> b = ft::read_file(path);
    return std::string(b.begin(), b.end());
}

std::vector<std::string> lines_of(const std::string &text) {
    std::vector<std::string> out;
    size_t at = 0;
    while (at < text.size()) {
        size_t nl = text.find('\n', at);
        if (nl == std::string::npos) nl = text.size();
        out.push_back(text.substr(at, nl - at));
        at = nl + 1;
    }
    return out;
}

bool starts_with(const std::string &s, const std::string &p) { return s.compare(0, p.size(), p) == 0; }

std::vector<std::string> files_in(const std::string &rel_dir, const std::string &suffix) {
    std::vector<std::string> out;
    DIR *d = opendir(ft::src(rel_dir).c_str());
    if (!d) return out;
    while (struct dirent *e = readdir(d)) {
        std::string n = e->d_name;
        if (n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
            out.push_back(rel_dir + "/" + n);
    }
    closedir(d);
    std::sort(out.begin(), out.end());
    return out;
}

/* The documents these tests hold to their sources, relative to the source tree. */
std::vector<std::string> documents() {
    std::vector<std::string> docs = {"README.md"};
    for (const std::string &f : files_in("docs", ".md")) docs.push_back(f);
    for (const char *b : {"bindings/python/README.md", "bindings/go/README.md"})
        if (ft::exists(ft::src(b))) docs.push_back(b);
    return docs;
}

/* The lines between `docs:begin NAME` and `docs:end NAME`, their common indentation removed;
 * `found` says whether both markers were there. */
std::string region(const std::string &text, const std::string &name, bool *found) {
    std::vector<std::string> ls = lines_of(text), body;
    *found = false;
    auto marks = [&](const std::string &l, const std::string &what) {
        size_t at = l.find(what);
        if (at == std::string::npos) return false;
        std::string rest = l.substr(at + what.size());
        rest.erase(rest.find_last_not_of(" \t*/-#>") + 1); /* a comment's closing characters */
        return rest == name;
    };
    size_t i = 0;
    while (i < ls.size() && !marks(ls[i], "docs:begin ")) i++;
    if (i == ls.size()) return "";
    for (i++; i < ls.size() && !marks(ls[i], "docs:end "); i++) body.push_back(ls[i]);
    if (i == ls.size()) return "";
    *found = true;
    size_t indent = std::string::npos;
    for (const std::string &l : body)
        if (!l.empty()) indent = std::min(indent, l.find_first_not_of(" \t") == std::string::npos ? l.size() : l.find_first_not_of(" \t"));
    std::string out;
    for (const std::string &l : body) out += (l.empty() ? l : l.substr(indent == std::string::npos ? 0 : indent)) + "\n";
    return out;
}

/* stdout of a shell command; *status its exit status. */
std::string run(const std::string &cmd, int *status) {
    std::string out;
    FILE *p = popen(cmd.c_str(), "r");
    if (!p) {
        *status = -1;
        return out;
    }
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    *status = pclose(p);
    return out;
}

struct Snippet {
    std::string doc, source, text; /* source: what the marker names ("" when there is none) */
    int line;                      /* of the opening fence, 1-based */
};

std::vector<Snippet> snippets(const std::string &doc) {
    std::vector<Snippet> out;
    std::vector<std::string> ls = lines_of(text_of(ft::src(doc)));
    for (size_t i = 0; i < ls.size(); i++) {
        if (!starts_with(ls[i], "```")) continue;
        Snippet s{doc, "", "", (int)i + 1};
        const std::string open = "<!-- snippet: ", close = " -->";
        if (i > 0 && starts_with(ls[i - 1], open) && ls[i - 1].size() > open.size() + close.size() &&
            ls[i - 1].compare(ls[i - 1].size() - close.size(), close.size(), close) == 0)
            s.source = ls[i - 1].substr(open.size(), ls[i - 1].size() - open.size() - close.size());
        for (i++; i < ls.size() && ls[i] != "```"; i++) s.text += ls[i] + "\n";
        out.push_back(s);
    }
    return out;
}

TEST(Docs, EveryCodeSnippetIsTheTextOfItsSource) {
    int checked = 0, commands = 0;
    bool have_cli = ft::exists("./forge");
    for (const std::string &doc : documents()) {
        for (const Snippet &s : snippets(doc)) {
            std::string where = doc + ":" + std::to_string(s.line);
            if (s.source.empty()) {
                ADD_FAILURE() << where << ": a fenced block with no <!-- snippet: SOURCE --> line before it "
                              << "(code in the docs is an example the tests build and run; shell commands go in indented blocks)";
                continue;
            }
            if (starts_with(s.source, "$ forge ")) { /* what the CLI prints */
                commands++;
                if (!have_cli) continue;
                int status = 0;
                std::string out = run("./forge " + s.source.substr(8) + " 2>/dev/null", &status);
                EXPECT_EQ(status, 0) << where << ": " << s.source;
                EXPECT_EQ(s.text, out) << where << ": the block differs from what `" << s.source.substr(2) << "` prints";
                checked++;
                continue;
            }
            std::string path = s.source, name;
            size_t space = path.find(' ');
            if (space != std::string::npos) name = path.substr(space + 1), path = path.substr(0, space);
            bool allowed = false;
            for (const char *dir : {"examples/", "bindings/go/", "bindings/python/", "tests/"}) allowed |= starts_with(path, dir);
            EXPECT_TRUE(allowed) << where << ": " << path << " is not an example, a binding's test or a test";
            ASSERT_TRUE(ft::exists(ft::src(path))) << where << ": " << path << " does not exist";
            std::string want = text_of(ft::src(path));
            if (!name.empty()) {
                bool found = false;
                want = region(want, name, &found);
                ASSERT_TRUE(found) << where << ": no `docs:begin " << name << "` ... `docs:end " << name << "` in " << path;
            }
            EXPECT_EQ(s.text, want) << where << ": the block differs from " << s.source;
            checked++;
        }
    }
    EXPECT_GE(checked, 4);
    if (commands && !have_cli) GTEST_SKIP() << "no ./forge in the working directory (the build tree): the forge commands' output was not compared";
}

/* Indented blocks are shell commands: no source code hides in them. */
TEST(Docs, IndentedBlocksHoldNoCode) {
    for (const std::string &doc : documents()) {
        std::vector<std::string> ls = lines_of(text_of(ft::src(doc)));
        bool fenced = false;
        for (size_t i = 0; i < ls.size(); i++) {
            if (starts_with(ls[i], "```")) fenced = !fenced;
            if (fenced || !starts_with(ls[i], "    ")) continue;
            std::string l = ls[i].substr(ls[i].find_first_not_of(' '));
            for (const char *code : {"import ", "from ", "package ", "func ", "#include", "with ", "for ", "def ", "int ", "return "})
                EXPECT_FALSE(starts_with(l, code)) << doc << ":" << i + 1 << ": code in an indented block: " << l;
        }
    }
}

TEST(Docs, ReadmeSpeedTableIsWhatResultsPyWrites) {
    int status = 0;
    run("python3 --version > /dev/null 2>&1", &status);
    if (status != 0) GTEST_SKIP() << "no python3";
    std::string readme = text_of(ft::src("README.md"));
    std::string out = run("cd '" + ft::src_dir() + "' && python3 bench/results.py --readme bench/RESULTS.md README.md", &status);
    ASSERT_EQ(status, 0);
    EXPECT_NE(readme.find("<!-- speed-table:begin"), std::string::npos);
    EXPECT_TRUE(out == readme) << "README.md's speed table is not what bench/results.py writes from bench/RESULTS.md: run\n"
                               << "  python3 bench/results.py --readme bench/RESULTS.md README.md > README.new && mv README.new README.md";
}

TEST(Docs, ReadmeIsAFiveMinuteRead) {
    EXPECT_LE(ft::read_file(ft::src("README.md")).size(), 12u * 1024) << "README.md: move detail into docs/";
}

/* GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens. */
std::string anchor(const std::string &heading) {
    std::string a;
    for (unsigned char c : heading) {
        if (isalnum(c) || c == '-' || c == '_') a += (char)tolower(c);
        else if (c == ' ') a += '-';
    }
    return a;
}

std::set<std::string> anchors(const std::string &path) {
    std::set<std::string> out;
    bool fenced = false;
    for (const std::string &l : lines_of(text_of(path))) {
        if (starts_with(l, "```")) fenced = !fenced;
        if (!fenced && starts_with(l, "#")) out.insert(anchor(l.substr(l.find_first_not_of('#'))).substr(1));
    }
    return out;
}

TEST(Docs, RelativeLinksResolve) {
    for (const std::string &doc : documents()) {
        std::string text = text_of(ft::src(doc)), dir = doc.find('/') == std::string::npos ? "" : doc.substr(0, doc.rfind('/') + 1);
        for (size_t at = text.find("]("); at != std::string::npos; at = text.find("](", at + 2)) {
            size_t end = text.find(')', at);
            if (end == std::string::npos) break;
            std::string target = text.substr(at + 2, end - at - 2);
            if (target.empty() || starts_with(target, "http://") || starts_with(target, "https://") || target.find(' ') != std::string::npos)
                continue;
            std::string file = target.substr(0, target.find('#')), frag = target.find('#') == std::string::npos ? "" : target.substr(target.find('#') + 1);
            std::string path = file.empty() ? ft::src(doc) : ft::src(dir + file);
            if (!file.empty() && file.back() == '/') {
                DIR *d = opendir(path.c_str());
                EXPECT_NE(d, nullptr) << doc << ": a link to " << target << ", which is not a directory";
                if (d) closedir(d);
                continue;
            }
            ASSERT_TRUE(ft::exists(path)) << doc << ": a link to " << target << ", which does not exist";
            if (!frag.empty()) {
                std::set<std::string> a = anchors(path);
                EXPECT_TRUE(a.count(frag)) << doc << ": a link to " << target << ": no heading of that anchor";
            }
        }
    }
}

/* The CLI's option names, from the string literals of the C files in tools/. */
std::set<std::string> cli_options() {
    std::set<std::string> out;
    for (const std::string &f : files_in("tools", ".c")) {
        std::string t = text_of(ft::src(f));
        for (size_t at = t.find("\"--"); at != std::string::npos; at = t.find("\"--", at + 3)) {
            size_t end = t.find('"', at + 1);
            if (end != std::string::npos) out.insert(t.substr(at + 1, end - at - 1));
        }
    }
    return out;
}

TEST(Docs, OptionsNamedInTheCliDocsExist) {
    std::set<std::string> known = cli_options();
    ASSERT_TRUE(known.count("--json"));
    for (const char *doc : {"docs/cli.md", "docs/json.md"}) {
        std::string text = text_of(ft::src(doc));
        for (size_t at = text.find("--"); at != std::string::npos; at = text.find("--", at + 2)) {
            if (at > 0 && (isalnum((unsigned char)text[at - 1]) || text[at - 1] == '-' || text[at - 1] == '|')) continue;
            size_t end = at + 2;
            while (end < text.size() && (isalnum((unsigned char)text[end]) || text[end] == '-')) end++;
            std::string opt = text.substr(at, end - at);
            if (opt.size() < 4 || !isalpha((unsigned char)opt[2])) continue;
            EXPECT_TRUE(known.count(opt)) << doc << ": " << opt << " is not an option of the CLI (tools/*.c)";
        }
    }
}

TEST(Docs, LayoutListsForgeCSectionsInOrder) {
    std::vector<std::string> sections;
    for (const std::string &l : lines_of(text_of(ft::src("forge.c"))))
        if (starts_with(l, "#include \"src/")) sections.push_back(l.substr(10, l.find('"', 10) - 10));
    ASSERT_FALSE(sections.empty());
    std::string layout = text_of(ft::src("docs/layout.md"));
    size_t at = 0;
    for (const std::string &s : sections) {
        size_t found = layout.find("`" + s + "`", at);
        EXPECT_NE(found, std::string::npos) << "docs/layout.md does not list " << s << " after the sections before it in forge.c";
        if (found != std::string::npos) at = found;
    }
}

/* docs/features.md's LoRA snippet, run: ten steps on the bundled model lower the loss and save
 * PEFT files. */
int train_zora(forge_model *model, const int32_t *tokens, const int32_t *lengths, int n_seqs, int seq_len, const char *out_dir,
               double *loss_before, double *loss_after) {
    // docs:begin train
    forge_train_params tp = forge_train_default_params(); /* torch's AdamW defaults; rank 8 on q_proj,v_proj */
    tp.targets = "all";
    tp.lr = 1e-2;
    tp.max_batch = 8;  /* the device plan: sequences x tokens */
    tp.max_seq = 128;
    forge_trainer *trainer;
    if (forge_trainer_create(model, &tp, &trainer) != FORGE_OK) { /* the message is on the model */
        fprintf(stderr, "%s\n", forge_model_errmsg(model));
        return 1;
    }
    forge_train_batch batch = {sizeof batch};
    batch.n_seqs = n_seqs;      /* rows of seq_len token ids */
    batch.seq_len = seq_len;
    batch.tokens = tokens;
    batch.lengths = lengths;    /* each row's real tokens; NULL: all seq_len */
    batch.labels = NULL;        /* NULL: the tokens themselves (-100 in labels: not counted) */
    double before, after;
    forge_train_eval(trainer, &batch, &before, NULL); /* the loss, updating nothing */
    forge_train_stats stats = {sizeof stats};
    for (int step = 1; step <= 10; step++) {
        if (forge_train_step(trainer, &batch, &stats) != FORGE_OK) {
            fprintf(stderr, "%s\n", forge_trainer_errmsg(trainer));
            forge_trainer_free(trainer);
            return 1;
        }
    }
    forge_train_eval(trainer, &batch, &after, NULL);
    printf("loss %.3f, after %d steps %.3f (gradient norm %.3f, lr %g)\n", before, stats.step, after, stats.grad_norm, stats.lr);
    forge_status st = forge_trainer_save(trainer, out_dir, FORGE_ADAPTER_PEFT); /* or FORGE_ADAPTER_MLX (mlx-lm) */
    forge_trainer_free(trainer);
    // docs:end train
    *loss_before = before;
    *loss_after = after;
    return st == FORGE_OK ? 0 : 1;
}

TEST(Docs, TheLoraSnippetTrains) {
    forge_model *model = nullptr;
    ASSERT_EQ(forge_model_load(ft::src("models/stories260K/stories260K.gguf").c_str(), nullptr, &model), FORGE_OK) << forge_model_errmsg(model);
    const int n_seqs = 4, seq_len = 64;
    std::vector<int32_t> tokens(n_seqs * seq_len, 0), lengths(n_seqs);
    std::vector<std::string> lines = lines_of(text_of(ft::src("tests/fixtures/train/zora_train.jsonl")));
    ASSERT_GE(lines.size(), (size_t)n_seqs);
    for (int i = 0; i < n_seqs; i++) {
        std::string t = lines[i].substr(lines[i].find(": \"") + 3);
        t = t.substr(0, t.rfind('"'));
        size_t n = 0;
        forge_tokenize(model, t.c_str(), t.size(), 1, nullptr, 0, &n);
        std::vector<int32_t> ids(n);
        ASSERT_EQ(forge_tokenize(model, t.c_str(), t.size(), 1, ids.data(), ids.size(), &n), FORGE_OK);
        lengths[i] = (int32_t)std::min(n, (size_t)seq_len);
        std::copy(ids.begin(), ids.begin() + lengths[i], tokens.begin() + i * seq_len);
    }
    std::string dir = ft::tmpdir("docs_lora");
    double before = 0, after = 0;
    ASSERT_EQ(train_zora(model, tokens.data(), lengths.data(), n_seqs, seq_len, dir.c_str(), &before, &after), 0);
    EXPECT_LT(after, 0.9 * before);
    EXPECT_TRUE(ft::exists(dir + "/adapter_model.safetensors"));
    EXPECT_TRUE(ft::exists(dir + "/adapter_config.json"));
    forge_model_free(model);
}

} // namespace
