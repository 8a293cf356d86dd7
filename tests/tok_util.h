/* tok_util.h: shared helpers of the tokenizer tests: test data unpacked into the build tree,
 * the HF tokenizers oracle (../shared/tools/hf-tokenizers, installed from npm on first use),
 * a seeded generator of hard strings. */
#ifndef FORGE_TESTS_TOK_UTIL_H
#define FORGE_TESTS_TOK_UTIL_H
#include "util.h"

#include <cjson/cJSON.h>
#include <sys/stat.h>

#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>

namespace ft {

inline bool dir_exists(const std::string &p) {
    struct stat sb;
    return stat(p.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode);
}

inline int sh(const std::string &cmd) { return system(cmd.c_str()); }

/* A name for this process's scratch files (ctest may run test processes side by side). */
inline std::string scratch(const std::string &what) {
    static std::atomic<int> n{0};
    return "tmp_" + what + "." + std::to_string((long)getpid()) + "." + std::to_string(n++);
}

/* Unpacks `tar` into `dest` unless `probe` (a path inside dest) exists; into a private
 * directory first, then renamed into place, so concurrent test processes do not collide. */
inline bool unpack_once(const std::string &tar, const std::string &dest, const std::string &probe) {
    if (exists(probe) || dir_exists(probe)) return true;
    if (!exists(tar)) { ADD_FAILURE() << "missing " << tar; return false; }
    std::string tmp = scratch("unpack");
    if (sh("mkdir -p '" + dest + "' '" + tmp + "' && tar xJf '" + tar + "' -C '" + tmp + "'") != 0) {
        ADD_FAILURE() << "cannot unpack " << tar;
        return false;
    }
    sh("for e in '" + tmp + "'/*; do mv -n \"$e\" '" + dest + "'/ 2>/dev/null; done; rm -rf '" + tmp + "'");
    if (!exists(probe) && !dir_exists(probe)) { ADD_FAILURE() << "unpacking " << tar << " gave no " << probe; return false; }
    return true;
}

/* The shared tokenizer data, unpacked once into ./tok_data (the build tree). Returns "" and
 * records a failure when the archives are missing. */
inline std::string tok_data() {
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    const std::string d = "tok_data";
    const char *fam[] = {"llama3", "qwen3", "gemma3", "gemma2"};
    for (const char *f : fam)
        if (!unpack_once(shared(std::string("tokenizers/") + f + ".tar.xz"), d, d + "/" + f + "/tokenizer_config.json")) return "";
    if (!unpack_once(shared("tokenizer-tests/tokenizer-tests.tar.xz"), d, d + "/ggml-vocab-starcoder.gguf.out")) return "";
    return d;
}

/* The oracle's directory (./hf-tokenizers with node_modules), or "" with a failure: CI has
 * node and the npm registry, so their absence fails the test instead of skipping it. */
inline std::string oracle_dir() {
    static std::mutex mu;
    static std::string ready;
    std::lock_guard<std::mutex> lock(mu);
    if (!ready.empty()) return ready;
    const std::string d = "hf-tokenizers";
    if (!dir_exists(d + "/node_modules/tokenizers")) {
        if (sh("node --version > /dev/null 2>&1") != 0) {
            ADD_FAILURE() << "node is not installed: the HF tokenizers oracle needs it (tools/install-deps.sh installs it)";
            return "";
        }
        std::string src = shared("tools/hf-tokenizers"), tmp = scratch("npm");
        if (sh("mkdir -p " + tmp + " && cp '" + src + "/encode.js' '" + src + "/package.json' " + tmp + "/") != 0) {
            ADD_FAILURE() << "cannot copy " << src;
            return "";
        }
        if (sh("cd " + tmp + " && npm install --no-save --no-package-lock --no-audit --no-fund > npm.log 2>&1") != 0 ||
            !dir_exists(tmp + "/node_modules/tokenizers")) {
            ADD_FAILURE() << "npm install of the HF tokenizers oracle (npm package tokenizers, from ../shared/tools/hf-tokenizers) "
                             "failed: see " << tmp << "/npm.log";
            return "";
        }
        /* into place; another process may have won the race, then its copy is used */
        if (rename(tmp.c_str(), d.c_str()) != 0) sh("rm -rf " + tmp);
    }
    ready = d;
    return ready;
}

struct OracleResult {
    std::vector<std::vector<int32_t>> ids;
    std::vector<std::string> decoded;
};

/* Runs encode.js on all texts in one call: ids (and the HF decode of them). */
inline bool oracle(const std::string &tok_dir, const std::vector<std::string> &texts, bool special, OracleResult *out) {
    std::string od = oracle_dir();
    if (od.empty()) return false;
    cJSON *arr = cJSON_CreateArray();
    for (const auto &t : texts) cJSON_AddItemToArray(arr, cJSON_CreateString(t.c_str()));
    char *js = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    std::string base = scratch("oracle"), in = base + "_in.json", outp = base + "_out.json", errp = base + "_err.txt";
    write_file(in, js, strlen(js));
    cJSON_free(js);
    std::string cmd = "node " + od + "/encode.js '" + tok_dir + "' --stdin-json --decode" + (special ? " --special" : "") + " < " + in +
                      " > " + outp + " 2> " + errp;
    if (sh(cmd) != 0) {
        std::vector<uint8_t> e = read_file(errp);
        ADD_FAILURE() << "oracle failed: " << cmd << "\n" << std::string(e.begin(), e.end());
        return false;
    }
    std::vector<uint8_t> o = read_file(outp);
    sh("rm -f " + in + " " + outp + " " + errp);
    cJSON *res = cJSON_ParseWithLength((const char *)o.data(), o.size());
    if (!cJSON_IsArray(res) || cJSON_GetArraySize(res) != (int)texts.size()) {
        ADD_FAILURE() << "oracle output is not an array of " << texts.size();
        cJSON_Delete(res);
        return false;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, res) {
        std::vector<int32_t> v;
        const cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(it, "ids")) v.push_back((int32_t)x->valuedouble);
        out->ids.push_back(v);
        const cJSON *d = cJSON_GetObjectItem(it, "decoded");
        out->decoded.push_back(cJSON_IsString(d) ? d->valuestring : "");
    }
    cJSON_Delete(res);
    return true;
}

inline forge_model *load_vocab(const std::string &path) {
    forge_model_params p = forge_model_default_params();
    p.vocab_only = 1;
    forge_model *m = nullptr;
    if (forge_model_load(path.c_str(), &p, &m) != FORGE_OK) {
        ADD_FAILURE() << "loading " << path << ": " << forge_model_errmsg(m);
        forge_model_free(m);
        return nullptr;
    }
    return m;
}

inline std::vector<int32_t> encode(forge_model *m, const std::string &s, uint32_t flags = 0) {
    std::vector<int32_t> ids(s.size() + 8);
    size_t n = 0;
    forge_status st = forge_tokenize(m, s.data(), s.size(), flags, ids.data(), ids.size(), &n);
    if (st == FORGE_ERR_BUFFER_TOO_SMALL) {
        ids.resize(n);
        st = forge_tokenize(m, s.data(), s.size(), flags, ids.data(), ids.size(), &n);
    }
    EXPECT_EQ(st, FORGE_OK) << forge_model_errmsg(m);
    ids.resize(st == FORGE_OK ? n : 0);
    return ids;
}

inline std::string decode(forge_model *m, const std::vector<int32_t> &ids, uint32_t flags = 0) {
    std::string s(64, '\0');
    size_t n = 0;
    forge_status st = forge_detokenize(m, ids.data(), ids.size(), flags, &s[0], s.size(), &n);
    if (st == FORGE_ERR_BUFFER_TOO_SMALL) {
        s.resize(n + 1);
        st = forge_detokenize(m, ids.data(), ids.size(), flags, &s[0], s.size(), &n);
    }
    EXPECT_EQ(st, FORGE_OK) << forge_model_errmsg(m);
    s.resize(st == FORGE_OK ? n : 0);
    return s;
}

/* Token by token through the streaming detokenizer, then flush. */
inline std::string decode_stream(forge_model *m, const std::vector<int32_t> &ids) {
    forge_detok_stream ds;
    forge_detok_stream_init(&ds, 0);
    std::string out;
    char buf[16];
    std::vector<char> big;
    for (size_t i = 0; i <= ids.size(); i++) {
        size_t n = 0;
        forge_status st = i < ids.size() ? forge_detok_stream_next(m, &ds, ids[i], buf, sizeof buf, &n)
                                         : forge_detok_stream_flush(m, &ds, buf, sizeof buf, &n);
        const char *p = buf;
        if (st == FORGE_ERR_BUFFER_TOO_SMALL) { /* retry with room: the stream did not move */
            big.resize(n + 1);
            st = i < ids.size() ? forge_detok_stream_next(m, &ds, ids[i], big.data(), big.size(), &n)
                                : forge_detok_stream_flush(m, &ds, big.data(), big.size(), &n);
            p = big.data();
        }
        EXPECT_EQ(st, FORGE_OK) << forge_model_errmsg(m);
        if (st != FORGE_OK) break;
        EXPECT_EQ(strlen(p), n);
        out.append(p, n);
    }
    return out;
}

/* ---- Generated strings: seeded, the same on every platform (raw mt19937 outputs only). ---- */

struct Gen {
    std::mt19937 rng;
    explicit Gen(uint32_t seed) : rng(seed) {}
    uint32_t u(uint32_t n) { return (uint32_t)(rng() % n); }
    template <class T, size_t N> const T &pick(const T (&a)[N]) { return a[u((uint32_t)N)]; }
};

inline void put_cp(std::string &s, uint32_t c) {
    if (c < 0x80) s += (char)c;
    else if (c < 0x800) { s += (char)(0xC0 | (c >> 6)); s += (char)(0x80 | (c & 0x3F)); }
    else if (c < 0x10000) { s += (char)(0xE0 | (c >> 12)); s += (char)(0x80 | ((c >> 6) & 0x3F)); s += (char)(0x80 | (c & 0x3F)); }
    else { s += (char)(0xF0 | (c >> 18)); s += (char)(0x80 | ((c >> 12) & 0x3F)); s += (char)(0x80 | ((c >> 6) & 0x3F)); s += (char)(0x80 | (c & 0x3F)); }
}

/* One random piece of text of a given kind. `specials` are the family's added-token texts. */
inline std::string gen_piece(Gen &g, const std::vector<std::string> &specials) {
    static const char *words[] = {"the", "The", "THE", "Hello", "world", "don't", "I'm", "we'll", "they've", "She's", "it'd",
                                  "you're", "ABC", "camelCase", "snake_case", "x", "a", "I", "naïve", "café", "über", "Straße",
                                  "İstanbul", "ıi", "ΣΑΣ", "σοφός", "Ωmega", "ﬁne", "²³", "½", "Ｆｕｌｌ", "ｶﾀｶﾅ", "𝐀𝐁𝐂",
                                  "Привет", "мир", "Ελλάδα", "שלום", "مرحبا", "नमस्ते", "สวัสดี", "ខ្មែរ", "你好", "世界",
                                  "こんにちは", "カタカナ", "한국어", "안녕하세요", "ǅungla", "ﬀ", "Ⅻ", "℃", "№", "™"};
    static const char *punct[] = {".", ",", "!", "?", "...", "!!!", "?!", ";", ":", "-", "--", "—", "(", ")", "[", "]", "{", "}",
                                  "\"", "'", "`", "''", "@", "#", "$", "%", "^", "&", "*", "+", "=", "<", ">", "/", "\\", "|",
                                  "~", "_", "、", "。", "！", "？", "«", "»", "¿", "¡", "…", "·", "'s", "'S", "'ll", "'VE"};
    static const uint32_t ws[] = {' ', ' ', ' ', '\t', '\n', '\r', 0x0B, 0x0C, 0xA0, 0x85, 0x1680, 0x2000, 0x2009, 0x200A,
                                  0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0x200B, 0xFEFF, 0x180E, 0x1C, 0x1F};
    static const char *emoji[] = {"😀", "👍", "👍🏽", "👍🏿", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇫🇷", "🇯🇵", "🧑🏾‍🤝‍🧑🏻", "✅",
                                  "🦙", "🤗", "☕", "1️⃣", "#️⃣", "🫠", "😶‍🌫️", "🐈‍⬛"};
    static const uint32_t marks[] = {0x301, 0x300, 0x308, 0x323, 0x327, 0x30A, 0x302, 0x303, 0x20DD, 0x36F, 0x489, 0x93C, 0x3099, 0x309A};
    static const char *code[] = {"def f(x):\n    return x**2\n", "int main() { return 0; }", "{\"a\": [1, 2.5e-3, null]}",
                                 "https://example.com/a?b=c&d=1", "user@example.org", "<div class=\"x\">&amp;</div>",
                                 "if (a != b && c >= 10) {\n\tfoo();\n}", "SELECT * FROM t WHERE id=42;", "#include <stdio.h>",
                                 "x = [i for i in range(10)]", "    \n    ", "\r\n\r\n", "C:\\path\\to\\file.txt", "$ ls -la | grep .c"};
    std::string s;
    switch (g.u(12)) {
    case 0: case 1: s = g.pick(words); break;
    case 2: s = g.pick(punct); break;
    case 3: { int n = 1 + (int)g.u(4); for (int i = 0; i < n; i++) put_cp(s, g.pick(ws)); break; }
    case 4: { int n = 1 + (int)g.u(12); for (int i = 0; i < n; i++) s += (char)('0' + g.u(10)); break; }
    case 5: s = g.pick(emoji); break;
    case 6: { s = g.pick(words); int n = 1 + (int)g.u(3); for (int i = 0; i < n; i++) put_cp(s, g.pick(marks)); break; }
    case 7: if (!specials.empty()) { s = specials[g.u((uint32_t)specials.size())]; if (g.u(4) == 0) s = s.substr(0, s.size() / 2); } break;
    case 8: s = g.pick(code); break;
    case 9: { /* random code points from a few blocks */
        static const uint32_t lo[] = {0x20, 0xA0, 0x370, 0x400, 0x590, 0x600, 0x900, 0xE00, 0x1100, 0x3040, 0x4E00, 0xAC00, 0x1F300, 0x10000, 0xFF00};
        static const uint32_t span[] = {95, 96, 144, 256, 112, 256, 128, 128, 256, 192, 2000, 2000, 512, 256, 240};
        int n = 1 + (int)g.u(6), b = (int)g.u(15);
        for (int i = 0; i < n; i++) put_cp(s, lo[b] + g.u(span[b]));
        break;
    }
    case 10: { int n = 2 + (int)g.u(6); for (int i = 0; i < n; i++) s += " "; s += g.pick(words); break; }
    default: { s = g.pick(words); if (g.u(2)) s[0] = (char)toupper((unsigned char)s[0]); break; }
    }
    return s;
}

inline std::vector<std::string> gen_strings(uint32_t seed, size_t count, const std::vector<std::string> &specials) {
    Gen g(seed);
    std::vector<std::string> out;
    out.reserve(count);
    for (size_t i = 0; i < count; i++) {
        std::string s;
        int n = 1 + (int)g.u(14);
        for (int k = 0; k < n; k++) {
            s += gen_piece(g, specials);
            switch (g.u(5)) {
            case 0: s += " "; break;
            case 1: break;
            case 2: s += g.u(2) ? "\n" : "\r\n"; break;
            default: if (g.u(3) == 0) s += "  "; break;
            }
        }
        out.push_back(s);
    }
    return out;
}

/* llama.cpp's .inp format: cases separated by "\n__ggml_vocab_test__\n" (after the last too). */
inline std::vector<std::string> read_inp(const std::string &path) {
    std::vector<uint8_t> b = read_file(path);
    std::string s(b.begin(), b.end()), sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> out;
    size_t pos = 0;
    for (size_t f; (f = s.find(sep, pos)) != std::string::npos; pos = f + sep.size()) out.push_back(s.substr(pos, f - pos));
    return out;
}

inline std::vector<std::vector<int32_t>> read_out(const std::string &path) {
    std::vector<uint8_t> b = read_file(path);
    std::string s(b.begin(), b.end());
    std::vector<std::vector<int32_t>> out;
    size_t pos = 0;
    for (size_t f; (f = s.find('\n', pos)) != std::string::npos; pos = f + 1) {
        std::vector<int32_t> v;
        const char *p = s.c_str() + pos, *e = s.c_str() + f;
        while (p < e) {
            char *end;
            long x = strtol(p, &end, 10);
            if (end == p) break;
            v.push_back((int32_t)x);
            p = end;
        }
        out.push_back(v);
    }
    return out;
}

inline std::string show_ids(const std::vector<int32_t> &v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); i++) s += (i ? "," : "") + std::to_string(v[i]);
    return s + "]";
}

inline std::string show_str(const std::string &s) {
    std::string o = "\"";
    for (unsigned char c : s) {
        char b[8];
        if (c == '"' || c == '\\') { o += '\\'; o += (char)c; }
        else if (c < 0x20 || c == 0x7f) { snprintf(b, sizeof b, "\\x%02x", c); o += b; }
        else o += (char)c;
    }
    return o + "\"";
}

} // namespace ft
#endif
