// test_layout.cpp: the source layout forge.c's comment promises. forge.c includes every src/
// section once, each section opens with what it owns and what it may call, and no section
// declares a function ahead of its definition: C's declare-before-use then makes every call go
// to a file before it (or earlier in the same file), so the dependency order holds by
// construction. The only declarations allowed ahead are those that give a function its
// format attribute, on the line just before the definition, and those of a recursion a
// recursive-descent parser cannot avoid (a GBNF group holding alternates, a regex group, a
// schema's subschemas), each named by a "/* recursion: ... */" line just above it.
#include <dirent.h>

#include <algorithm>
#include <regex>
#include <set>

#include "util.h"

namespace {

std::string text(const std::string &path) {
    std::vector<uint8_t> b = ft::read_file(path);
    return std::string(b.begin(), b.end());
}

std::vector<std::string> lines(const std::string &s) {
    std::vector<std::string> out;
    size_t p = 0;
    while (p <= s.size()) {
        size_t e = s.find('\n', p);
        if (e == std::string::npos) e = s.size();
        out.push_back(s.substr(p, e - p));
        p = e + 1;
    }
    return out;
}

std::vector<std::string> src_sections() {
    std::vector<std::string> names;
    DIR *d = opendir(ft::src("src").c_str());
    if (!d) return names;
    while (struct dirent *e = readdir(d)) {
        std::string n = e->d_name;
        if (n.size() > 2 && n.compare(n.size() - 2, 2, ".c") == 0) names.push_back("src/" + n);
    }
    closedir(d);
    std::sort(names.begin(), names.end());
    return names;
}

} // namespace

TEST(Layout, ForgeCIncludesEverySectionOnce) {
    std::vector<std::string> included;
    std::regex inc("^#include \"(src/[a-z_0-9]+\\.c)\"");
    for (const std::string &l : lines(text(ft::src("forge.c")))) {
        std::smatch m;
        if (std::regex_search(l, m, inc)) included.push_back(m[1]);
    }
    std::vector<std::string> sorted = included;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_TRUE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) << "forge.c includes a section twice";
    EXPECT_EQ(sorted, src_sections()) << "forge.c's list and the files in src/ differ";
}

TEST(Layout, EverySectionSaysWhatItOwnsAndMayCall) {
    for (const std::string &f : src_sections()) {
        std::vector<std::string> ls = lines(text(ft::src(f)));
        ASSERT_FALSE(ls.empty()) << f;
        EXPECT_EQ(ls[0].rfind("/* " + f + ": ", 0), 0u) << f << " does not open with \"/* " << f << ": \"";
        std::string head;
        for (size_t i = 0; i < ls.size() && i < 40; i++) {
            head += ls[i] + "\n";
            if (ls[i].find("*/") != std::string::npos) break;
        }
        EXPECT_NE(head.find(" * Owns: "), std::string::npos) << f << "'s opening comment has no \"Owns:\"";
        EXPECT_NE(head.find(" * May call: "), std::string::npos) << f << "'s opening comment has no \"May call:\"";
    }
}

TEST(Layout, NoFunctionIsDeclaredAheadOfItsDefinition) {
    // a file-scope declaration of a function: starts at column 0 with a type, ends in ");"
    std::regex decl("^(static |FORGE_API |FORGE__INTERNAL |inline )*[A-Za-z_][A-Za-z_0-9 ]*[ *]([A-Za-z_][A-Za-z_0-9]*)\\(");
    for (const std::string &f : src_sections()) {
        std::vector<std::string> ls = lines(text(ft::src(f)));
        for (size_t i = 0; i < ls.size(); i++) {
            std::smatch m;
            if (ls[i].empty() || ls[i][0] == ' ' || ls[i][0] == '#' || ls[i][0] == '/' || !std::regex_search(ls[i], m, decl)) continue;
            // find where the declarator ends: at "{" (a definition) or ";" (a declaration)
            size_t j = i;
            std::string all = ls[i];
            while (all.find('{') == std::string::npos && all.find(';') == std::string::npos && j + 1 < ls.size()) all += "\n" + ls[++j];
            size_t brace = all.find('{'), semi = all.find(';');
            if (semi == std::string::npos || (brace != std::string::npos && brace < semi)) continue;
            if (all.find('=') != std::string::npos && all.find('=') < semi) continue; // a variable with an initializer
            std::string name = m[2];
            bool attribute_only = all.find("__attribute__") != std::string::npos && j + 1 < ls.size() &&
                                  ls[j + 1].find(name + "(") != std::string::npos;
            bool named_recursion = i > 0 && ls[i - 1].rfind("/* recursion: ", 0) == 0;
            EXPECT_TRUE(attribute_only || named_recursion) << f << ":" << i + 1 << ": " << name
                                        << " is declared ahead of its definition (move the definition, or what it calls, so no "
                                           "declaration is needed, or name the recursion on the line above: /* recursion: why */)";
        }
    }
}
