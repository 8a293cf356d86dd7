/* json_check.h: what the constraint tests hold outputs to, written apart from forge's own code:
 * a strict JSON parser (RFC 8259: no trailing commas, no leading zeros, escapes checked, lone
 * surrogates refused) and a JSON Schema validator for the keywords forge enforces (type,
 * properties, required, additionalProperties, items, prefixItems, enum, const, anyOf, oneOf
 * (exactly one), allOf, $ref, min/maxItems, min/maxLength (code points), minimum / maximum and
 * their exclusive forms, pattern (std::wregex, ECMAScript, searched unanchored) and format
 * date / time / date-time / uuid / email, calendar dates checked). */
#ifndef FORGE_TESTS_JSON_CHECK_H
#define FORGE_TESTS_JSON_CHECK_H

#include <cjson/cJSON.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <regex>
#include <string>
#include <utility>
#include <vector>

namespace jc {

struct Value {
    enum Kind { Null, Bool, Num, Str, Arr, Obj } k = Null;
    bool b = false;
    double num = 0;
    bool integral = false;        /* written without fraction or exponent */
    std::u32string str;           /* Str: the code points; Obj keys likewise */
    std::vector<Value> arr;
    std::vector<std::pair<std::u32string, Value>> obj;
};

struct Parser {
    const std::string &t;
    size_t i = 0;
    std::string err;
    explicit Parser(const std::string &s) : t(s) {}
    void ws() { while (i < t.size() && (t[i] == ' ' || t[i] == '\t' || t[i] == '\n' || t[i] == '\r')) i++; }
    bool fail(const std::string &m) {
        if (err.empty()) err = m + " at byte " + std::to_string(i);
        return false;
    }
    bool utf8(uint32_t &cp) {
        unsigned char c = (unsigned char)t[i];
        int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!n || i + n > t.size()) return fail("bad UTF-8");
        cp = n == 1 ? c : n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
        for (int k = 1; k < n; k++) {
            unsigned char d = (unsigned char)t[i + k];
            if ((d & 0xc0) != 0x80) return fail("bad UTF-8");
            cp = cp << 6 | (d & 0x3f);
        }
        static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < least[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return fail("bad UTF-8");
        i += n;
        return true;
    }
    bool hex4(uint32_t &v) {
        if (i + 4 > t.size()) return fail("short \\u escape");
        v = 0;
        for (int k = 0; k < 4; k++) {
            char c = t[i + k];
            int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (h < 0) return fail("bad \\u escape");
            v = v * 16 + (uint32_t)h;
        }
        i += 4;
        return true;
    }
    bool string(std::u32string &out) {
        if (i >= t.size() || t[i] != '"') return fail("expected a string");
        i++;
        for (;;) {
            if (i >= t.size()) return fail("unterminated string");
            unsigned char c = (unsigned char)t[i];
            if (c == '"') { i++; return true; }
            if (c < 0x20) return fail("a control character in a string");
            if (c == '\\') {
                i++;
                if (i >= t.size()) return fail("unterminated escape");
                char e = t[i++];
                switch (e) {
                case '"': out += U'"'; break;
                case '\\': out += U'\\'; break;
                case '/': out += U'/'; break;
                case 'b': out += U'\b'; break;
                case 'f': out += U'\f'; break;
                case 'n': out += U'\n'; break;
                case 'r': out += U'\r'; break;
                case 't': out += U'\t'; break;
                case 'u': {
                    uint32_t v;
                    if (!hex4(v)) return false;
                    if (v >= 0xD800 && v <= 0xDBFF) {
                        uint32_t lo;
                        if (i + 2 > t.size() || t[i] != '\\' || t[i + 1] != 'u') return fail("a lone high surrogate");
                        i += 2;
                        if (!hex4(lo)) return false;
                        if (lo < 0xDC00 || lo > 0xDFFF) return fail("a bad surrogate pair");
                        v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
                    } else if (v >= 0xDC00 && v <= 0xDFFF) {
                        return fail("a lone low surrogate");
                    }
                    out += (char32_t)v;
                    break;
                }
                default: return fail("a bad escape");
                }
                continue;
            }
            uint32_t cp;
            if (!utf8(cp)) return false;
            out += (char32_t)cp;
        }
    }
    bool number(Value &v) {
        size_t s = i;
        if (i < t.size() && t[i] == '-') i++;
        if (i >= t.size() || !isdigit((unsigned char)t[i])) return fail("a bad number");
        if (t[i] == '0') i++;
        else while (i < t.size() && isdigit((unsigned char)t[i])) i++;
        v.integral = true;
        if (i < t.size() && t[i] == '.') {
            i++;
            v.integral = false;
            if (i >= t.size() || !isdigit((unsigned char)t[i])) return fail("a bad fraction");
            while (i < t.size() && isdigit((unsigned char)t[i])) i++;
        }
        if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
            i++;
            v.integral = false;
            if (i < t.size() && (t[i] == '+' || t[i] == '-')) i++;
            if (i >= t.size() || !isdigit((unsigned char)t[i])) return fail("a bad exponent");
            while (i < t.size() && isdigit((unsigned char)t[i])) i++;
        }
        v.k = Value::Num;
        v.num = strtod(t.substr(s, i - s).c_str(), nullptr);
        return true;
    }
    bool value(Value &v, int depth) {
        if (depth > 5000) return fail("nested too deep");
        ws();
        if (i >= t.size()) return fail("expected a value");
        char c = t[i];
        if (c == '{') {
            v.k = Value::Obj;
            i++;
            ws();
            if (i < t.size() && t[i] == '}') { i++; return true; }
            for (;;) {
                ws();
                std::u32string key;
                if (!string(key)) return false;
                ws();
                if (i >= t.size() || t[i] != ':') return fail("expected ':'");
                i++;
                Value x;
                if (!value(x, depth + 1)) return false;
                v.obj.emplace_back(key, std::move(x));
                ws();
                if (i < t.size() && t[i] == ',') { i++; continue; }
                if (i < t.size() && t[i] == '}') { i++; return true; }
                return fail("expected ',' or '}'");
            }
        }
        if (c == '[') {
            v.k = Value::Arr;
            i++;
            ws();
            if (i < t.size() && t[i] == ']') { i++; return true; }
            for (;;) {
                Value x;
                if (!value(x, depth + 1)) return false;
                v.arr.push_back(std::move(x));
                ws();
                if (i < t.size() && t[i] == ',') { i++; continue; }
                if (i < t.size() && t[i] == ']') { i++; return true; }
                return fail("expected ',' or ']'");
            }
        }
        if (c == '"') { v.k = Value::Str; return string(v.str); }
        if (!t.compare(i, 4, "true")) { v.k = Value::Bool; v.b = true; i += 4; return true; }
        if (!t.compare(i, 5, "false")) { v.k = Value::Bool; i += 5; return true; }
        if (!t.compare(i, 4, "null")) { v.k = Value::Null; i += 4; return true; }
        return number(v);
    }
};

/* Parses the whole text (whitespace around allowed); "" or the reason. */
inline std::string parse(const std::string &text, Value &out) {
    Parser p(text);
    if (!p.value(out, 0)) return p.err;
    p.ws();
    if (p.i != text.size()) return "trailing text at byte " + std::to_string(p.i);
    return "";
}

inline std::string utf8_of(const std::u32string &s) {
    std::string o;
    for (char32_t c : s) {
        uint32_t v = (uint32_t)c;
        if (v < 0x80) o += (char)v;
        else if (v < 0x800) { o += (char)(0xC0 | v >> 6); o += (char)(0x80 | (v & 0x3f)); }
        else if (v < 0x10000) { o += (char)(0xE0 | v >> 12); o += (char)(0x80 | ((v >> 6) & 0x3f)); o += (char)(0x80 | (v & 0x3f)); }
        else { o += (char)(0xF0 | v >> 18); o += (char)(0x80 | ((v >> 12) & 0x3f)); o += (char)(0x80 | ((v >> 6) & 0x3f)); o += (char)(0x80 | (v & 0x3f)); }
    }
    return o;
}

/* The code points of UTF-8 text (invalid bytes as themselves). */
inline std::u32string u32_of(const char *s) {
    std::u32string out;
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned c = *p;
        int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
        uint32_t v = n == 1 ? c : n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
        int k = 1;
        for (; k < n && (p[k] & 0xc0) == 0x80; k++) v = v << 6 | (p[k] & 0x3f);
        if (k < n) { v = c; k = 1; }
        out += (char32_t)v;
        p += k;
    }
    return out;
}

/* A parsed value against a cJSON value (enum / const). */
inline bool equal(const Value &v, const cJSON *j) {
    switch (v.k) {
    case Value::Null: return cJSON_IsNull(j);
    case Value::Bool: return cJSON_IsBool(j) && (cJSON_IsTrue(j) == v.b);
    case Value::Num: return cJSON_IsNumber(j) && j->valuedouble == v.num;
    case Value::Str: return cJSON_IsString(j) && u32_of(j->valuestring) == v.str;
    case Value::Arr: {
        if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) != (int)v.arr.size()) return false;
        int i = 0;
        for (const cJSON *e = j->child; e; e = e->next, i++)
            if (!equal(v.arr[i], e)) return false;
        return true;
    }
    case Value::Obj: {
        if (!cJSON_IsObject(j) || cJSON_GetArraySize(j) != (int)v.obj.size()) return false;
        for (auto &kv : v.obj) {
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, utf8_of(kv.first).c_str());
            if (!e || !equal(kv.second, e)) return false;
        }
        return true;
    }
    }
    return false;
}

inline bool full_match(const std::string &s, const char *re) { return std::regex_match(s, std::regex(re)); }

inline bool valid_date(const std::string &s) {
    if (!full_match(s, "[0-9]{4}-[0-9]{2}-[0-9]{2}")) return false;
    int y = atoi(s.substr(0, 4).c_str()), m = atoi(s.substr(5, 2).c_str()), d = atoi(s.substr(8, 2).c_str());
    static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m < 1 || m > 12 || d < 1) return false;
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return d <= days[m - 1] + (m == 2 && leap);
}
inline bool valid_time(const std::string &s) {
    return full_match(s, "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?(Z|z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])");
}

struct Validator {
    const cJSON *root;
    std::string why;
    bool no(const std::string &m) {
        if (why.empty()) why = m;
        return false;
    }
    const cJSON *resolve(const char *ref) {
        if (ref[0] != '#') return nullptr;
        const cJSON *at = root;
        std::string p = ref + 1;
        size_t i = 0;
        while (i < p.size() && p[i] == '/') {
            size_t e = p.find('/', i + 1);
            std::string k = p.substr(i + 1, e == std::string::npos ? std::string::npos : e - i - 1);
            std::string key;
            for (size_t q = 0; q < k.size(); q++) {
                if (k[q] == '~' && q + 1 < k.size()) { key += k[q + 1] == '1' ? '/' : '~'; q++; }
                else key += k[q];
            }
            at = cJSON_IsArray(at) ? cJSON_GetArrayItem(at, atoi(key.c_str())) : cJSON_GetObjectItemCaseSensitive(at, key.c_str());
            if (!at) return nullptr;
            i = e == std::string::npos ? p.size() : e;
        }
        return at;
    }
    bool type_ok(const Value &v, const char *t) {
        std::string s = t;
        if (s == "null") return v.k == Value::Null;
        if (s == "boolean") return v.k == Value::Bool;
        if (s == "object") return v.k == Value::Obj;
        if (s == "array") return v.k == Value::Arr;
        if (s == "string") return v.k == Value::Str;
        if (s == "number") return v.k == Value::Num;
        if (s == "integer") return v.k == Value::Num && std::floor(v.num) == v.num && std::isfinite(v.num);
        return false;
    }
    bool check(const Value &v, const cJSON *s, int depth = 0) {
        if (depth > 200) return no("schema recursion too deep");
        if (cJSON_IsTrue(s)) return true;
        if (cJSON_IsFalse(s)) return no("schema false");
        if (const cJSON *r = cJSON_GetObjectItemCaseSensitive(s, "$ref")) {
            const cJSON *t = resolve(r->valuestring);
            if (!t) return no(std::string("unresolved $ref ") + r->valuestring);
            if (!check(v, t, depth + 1)) return false;
        }
        if (const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type")) {
            bool ok = false;
            if (cJSON_IsString(t)) ok = type_ok(v, t->valuestring);
            else for (const cJSON *e = t->child; e && !ok; e = e->next) ok = type_ok(v, e->valuestring);
            if (!ok) return no("type");
        }
        if (const cJSON *e = cJSON_GetObjectItemCaseSensitive(s, "enum")) {
            bool ok = false;
            for (const cJSON *x = e->child; x && !ok; x = x->next) ok = equal(v, x);
            if (!ok) return no("enum");
        }
        if (const cJSON *c = cJSON_GetObjectItemCaseSensitive(s, "const"))
            if (!equal(v, c)) return no("const");
        if (const cJSON *a = cJSON_GetObjectItemCaseSensitive(s, "allOf"))
            for (const cJSON *x = a->child; x; x = x->next)
                if (!check(v, x, depth + 1)) return false;
        if (const cJSON *a = cJSON_GetObjectItemCaseSensitive(s, "anyOf")) {
            bool ok = false;
            for (const cJSON *x = a->child; x && !ok; x = x->next) {
                Validator sub{root, ""};
                ok = sub.check(v, x, depth + 1);
            }
            if (!ok) return no("anyOf");
        }
        if (const cJSON *a = cJSON_GetObjectItemCaseSensitive(s, "oneOf")) {
            int n = 0;
            for (const cJSON *x = a->child; x; x = x->next) {
                Validator sub{root, ""};
                n += sub.check(v, x, depth + 1);
            }
            if (n != 1) return no("oneOf matched " + std::to_string(n));
        }
        if (v.k == Value::Num) {
            double x = v.num, b;
            auto num = [&](const char *k, double &out) {
                const cJSON *j = cJSON_GetObjectItemCaseSensitive(s, k);
                if (!cJSON_IsNumber(j)) return false;
                out = j->valuedouble;
                return true;
            };
            bool exmin = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum"));
            bool exmax = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum"));
            if (num("minimum", b) && (exmin ? !(x > b) : x < b)) return no("minimum");
            if (num("maximum", b) && (exmax ? !(x < b) : x > b)) return no("maximum");
            if (num("exclusiveMinimum", b) && !(x > b)) return no("exclusiveMinimum");
            if (num("exclusiveMaximum", b) && !(x < b)) return no("exclusiveMaximum");
        }
        if (v.k == Value::Str) {
            const cJSON *j;
            if ((j = cJSON_GetObjectItemCaseSensitive(s, "minLength")) && (double)v.str.size() < j->valuedouble) return no("minLength");
            if ((j = cJSON_GetObjectItemCaseSensitive(s, "maxLength")) && (double)v.str.size() > j->valuedouble) return no("maxLength");
            if ((j = cJSON_GetObjectItemCaseSensitive(s, "pattern"))) {
                std::wstring ws, wp;
                for (char32_t c : v.str) ws += (wchar_t)c;
                std::u32string up = u32_of(j->valuestring);
                for (char32_t c : up) wp += (wchar_t)c;
                if (!std::regex_search(ws, std::wregex(wp))) return no("pattern " + std::string(j->valuestring));
            }
            if ((j = cJSON_GetObjectItemCaseSensitive(s, "format"))) {
                std::string f = j->valuestring, t = utf8_of(v.str);
                bool ok = true;
                if (f == "date") ok = valid_date(t);
                else if (f == "time") ok = valid_time(t);
                else if (f == "date-time") {
                    size_t T = t.find_first_of("Tt");
                    ok = T != std::string::npos && valid_date(t.substr(0, T)) && valid_time(t.substr(T + 1));
                } else if (f == "uuid") ok = full_match(t, "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}");
                else if (f == "email") ok = full_match(t, "[^@\\s]+@[^@\\s]+\\.[^@\\s]+");
                if (!ok) return no("format " + f + ": " + t);
            }
        }
        if (v.k == Value::Arr) {
            const cJSON *j;
            if ((j = cJSON_GetObjectItemCaseSensitive(s, "minItems")) && (double)v.arr.size() < j->valuedouble) return no("minItems");
            if ((j = cJSON_GetObjectItemCaseSensitive(s, "maxItems")) && (double)v.arr.size() > j->valuedouble) return no("maxItems");
            const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems"), *items = cJSON_GetObjectItemCaseSensitive(s, "items");
            if (cJSON_IsArray(items)) { prefix = items; items = cJSON_GetObjectItemCaseSensitive(s, "additionalItems"); }
            size_t np = prefix ? (size_t)cJSON_GetArraySize(prefix) : 0;
            for (size_t i = 0; i < v.arr.size(); i++) {
                const cJSON *sub = i < np ? cJSON_GetArrayItem(prefix, (int)i) : items;
                if (sub && !check(v.arr[i], sub, depth + 1)) return no("item " + std::to_string(i) + ": " + why);
            }
        }
        if (v.k == Value::Obj) {
            const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties"), *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
            for (const cJSON *r = cJSON_GetObjectItemCaseSensitive(s, "required") ? cJSON_GetObjectItemCaseSensitive(s, "required")->child : nullptr; r; r = r->next) {
                bool have = false;
                for (auto &kv : v.obj) have |= kv.first == u32_of(r->valuestring);
                if (!have) return no(std::string("required ") + r->valuestring);
            }
            for (auto &kv : v.obj) {
                std::string key = utf8_of(kv.first);
                const cJSON *sub = props ? cJSON_GetObjectItemCaseSensitive(props, key.c_str()) : nullptr;
                if (sub) {
                    if (!check(kv.second, sub, depth + 1)) return no("property " + key + ": " + why);
                } else if (ap) {
                    if (cJSON_IsFalse(ap)) return no("additional property " + key);
                    if (!check(kv.second, ap, depth + 1)) return no("additional property " + key + ": " + why);
                }
            }
        }
        return true;
    }
};

/* "" when `text` parses as JSON and validates against `schema` (JSON text), else the reason. */
inline std::string validate(const std::string &text, const std::string &schema) {
    Value v;
    std::string e = parse(text, v);
    if (!e.empty()) return "not JSON: " + e;
    cJSON *s = cJSON_Parse(schema.c_str());
    if (!s) return "the schema is not JSON";
    Validator val{s, ""};
    bool ok = val.check(v, s);
    cJSON_Delete(s);
    return ok ? "" : "invalid: " + val.why;
}

} // namespace jc

#endif
