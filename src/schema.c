/* src/schema.c: JSON Schema.
 * Owns: JSON Schema -> GBNF (the subset forge enforces; any other validation keyword is an
 * error naming it), the GBNF of any JSON object and of a list of choices, regex patterns ->
 * GBNF, forge_json_schema_to_gbnf.
 * May call: base.c, tokenizer.c (UTF-8).
 *
 * The output is GBNF text (grammar.c compiles it), one rule per schema node: objects with their
 * properties in the schema's order (required ones always there, optional ones each optional,
 * then additional properties when the schema allows them, under keys no declared property has),
 * arrays by prefixItems / items / minItems / maxItems, strings by length, pattern or format,
 * integers and numbers within their bounds (decimal digit ranges), enum and const as literals
 * (a trie of them: big enums stay small automata), anyOf / oneOf as alternatives, allOf merged,
 * $ref by JSON pointer into the document (recursion allowed: each target is one rule).
 * Whitespace between tokens is bounded (a space, or a newline and up to 20 spaces or tabs), so
 * a model cannot pad forever; numbers have at most 16 digits before and after the point.
 */

#define FORGE__SC_MAX_DEPTH 64       /* nested schemas (through properties, items, merges) */
#define FORGE__SC_MAX_EXPAND 100000  /* items / string lengths a bound may expand to */
#define FORGE__SC_MAX_LITERAL 4096   /* bytes of one enum / const value */
#define FORGE__SC_MAX_ENUM 200000    /* enum values */
#define FORGE__SC_MAX_MADE 1000000   /* JSON nodes of the schemas merges make ($ref beside keywords, allOf): a
                                      * recursive $ref among keywords copies the document again at each level */

/* The rules every schema grammar may use. */
static const char forge__sc_prelude[] =
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n"
    "json-char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" ([0-9a-cA-CeEfF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))\n"
    "json-string ::= \"\\\"\" json-char* \"\\\"\"\n"
    "json-int ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
    "json-number ::= json-int (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?\n"
    "json-value ::= json-object | json-array | json-string | json-number | \"true\" | \"false\" | \"null\"\n"
    "json-object ::= \"{\" ws (json-string ws \":\" ws json-value (ws \",\" ws json-string ws \":\" ws json-value)* ws)? \"}\"\n"
    "json-array ::= \"[\" ws (json-value (ws \",\" ws json-value)* ws)? \"]\"\n"
    "json-key-char ::= [^\"\\\\\\x00-\\x1F]\n"
    "fmt-date ::= [0-9]{4} \"-\" fmt-md | fmt-leap \"-02-29\"\n"
    "fmt-md ::= (\"01\" | \"03\" | \"05\" | \"07\" | \"08\" | \"10\" | \"12\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01]) | "
    "(\"04\" | \"06\" | \"09\" | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"30\") | \"02-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8])\n"
    "fmt-leap ::= [0-9]{2} (\"0\" [48] | [2468] [048] | [13579] [26]) | (\"0\" [048] | [2468] [048] | [13579] [26]) \"00\"\n"
    "fmt-time ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,9})? (\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])\n"
    "fmt-email-atom ::= [a-zA-Z0-9_%+-]+\n"
    "fmt-email-label ::= [a-zA-Z0-9]+ (\"-\" [a-zA-Z0-9]+)*\n";

/* Gemma 4's notation of a JSON value (its tool calls' arguments, as its template's
 * format_argument writes them): strings as they are between <|"|> marks (a control token,
 * grammar.c's token element), no white space, object keys bare. The rules keep the JSON
 * prelude's names, so a schema's rules read the same in both. A string never holds "<|", so that
 * no text in it reads as a mark; a key runs to its ':' as the reply's parser reads one. Numbers
 * and the formats' rules are the JSON prelude's own lines. */
static const char forge__sc_g4_prelude[] =
    "ws ::= \"\"\n"
    "json-char ::= [^<\\x00]\n"
    "g4-text ::= ([^<\\x00] | \"<\"+ [^<|\\x00])* \"<\"*\n"
    "json-string ::= <|\"|> g4-text <|\"|>\n"
    "json-value ::= json-object | json-array | json-string | json-number | \"true\" | \"false\" | \"null\"\n"
    "g4-key ::= [^:,{}\\[\\]<\\x00-\\x20] [^:,{}\\[\\]<\\x00-\\x1F]*\n"
    "json-object ::= \"{\" (g4-key \":\" json-value (\",\" g4-key \":\" json-value)*)? \"}\"\n"
    "json-array ::= \"[\" (json-value (\",\" json-value)*)? \"]\"\n"
    "json-key-char ::= [^:,{}\\[\\]<\\x00-\\x1F]\n";

/* The shared rules of a notation (JSON, or Gemma 4's when g4) into b. */
static void forge__sc_prelude_put(bool g4, forge__buf *b) {
    if (!g4) {
        forge__buf_put(b, forge__sc_prelude, strlen(forge__sc_prelude));
        return;
    }
    forge__buf_put(b, forge__sc_g4_prelude, strlen(forge__sc_g4_prelude));
    for (const char *l = forge__sc_prelude; *l;) { /* the numbers' and formats' lines as JSON's */
        const char *e = strchr(l, '\n');
        e = e ? e + 1 : l + strlen(l);
        if (!strncmp(l, "json-int ", 9) || !strncmp(l, "json-number ", 12) || !strncmp(l, "fmt-", 4)) forge__buf_put(b, l, (size_t)(e - l));
        l = e;
    }
}

/* Code-point ranges (character classes here and in grammar.c). */
typedef struct forge__cprange {
    uint32_t lo, hi;
} forge__cprange;

/* Sorts and merges ranges in place (n of them); returns the new count. */
static size_t forge__cp_normalize(forge__cprange *r, size_t n) {
    for (size_t i = 1; i < n; i++) /* insertion sort: classes are short */
        for (size_t j = i; j > 0 && r[j - 1].lo > r[j].lo; j--) {
            forge__cprange t = r[j];
            r[j] = r[j - 1];
            r[j - 1] = t;
        }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k && r[i].lo <= r[k - 1].hi + 1) {
            if (r[i].hi > r[k - 1].hi) r[k - 1].hi = r[i].hi;
        } else {
            r[k++] = r[i];
        }
    }
    return k;
}

typedef struct forge__sc {
    cJSON *doc;            /* the whole schema ($ref targets are pointers into it) */
    forge__buf out;        /* GBNF rules */
    forge__buf names;      /* rule names made so far, NUL-separated (for uniqueness) */
    uint32_t *name_tab;    /* open addressing: offset into names + 1, 0 empty */
    uint32_t name_mask, n_names;
    cJSON *refs;           /* object: JSON pointer -> rule name given to its target */
    cJSON *owned;          /* array: merged schemas made here (freed with the context) */
    uint64_t made;         /* their JSON nodes, counted as they are made (FORGE__SC_MAX_MADE) */
    int depth;
    unsigned counter;
    forge__err *err;
    forge_status st;
    const char *prefix;    /* put before every rule name made here (several schemas in one grammar) */
    bool g4;               /* Gemma 4's notation (forge__sc_g4_prelude), not JSON */
} forge__sc;

/* A string's mark in c's notation, as GBNF. */
static const char *forge__sc_quote(const forge__sc *c) { return c->g4 ? "<|\"|>" : "\"\\\"\""; }

static bool forge__sc_fail(forge__sc *c, forge_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool forge__sc_fail(forge__sc *c, forge_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    forge__fail_first(&c->st, c->err, st, "JSON Schema: ", fmt, ap);
    va_end(ap);
    return false;
}

static void forge__sc_puts(forge__buf *b, const char *s) { forge__buf_put(b, s, strlen(s)); }
static void forge__sc_printf(forge__buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void forge__sc_printf(forge__buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) forge__buf_put(b, tmp, (size_t)FORGE__MIN((size_t)n, sizeof tmp - 1));
}

/* s[0..n) as a GBNF literal, quotes included. */
static void forge__sc_lit(forge__buf *b, const char *s, size_t n) {
    forge__buf_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        if (c == '"' || c == '\\') { e[0] = '\\'; e[1] = (char)c; forge__buf_put(b, e, 2); }
        else if (c == '\n') forge__buf_put(b, "\\n", 2);
        else if (c == '\r') forge__buf_put(b, "\\r", 2);
        else if (c == '\t') forge__buf_put(b, "\\t", 2);
        else if (c < 0x20 || c == 0x7f) { snprintf(e, sizeof e, "\\x%02X", c); forge__buf_put(b, e, 4); }
        else forge__buf_put(b, s + i, 1);
    }
    forge__buf_put(b, "\"", 1);
}

/* Property name `k` as an object key in c's notation, as GBNF: JSON's quoted and escaped key;
 * Gemma 4's bare key where its reply parser reads it back so (it runs to a ':'), else marked. */
static void forge__sc_key(const forge__sc *c, forge__buf *b, const char *k) {
    if (c->g4) {
        bool bare = *k && (unsigned char)*k > 0x20;
        for (const unsigned char *q = (const unsigned char *)k; *q && bare; q++) bare = *q >= 0x20 && !strchr(":,{}[]<", *q);
        if (!bare) forge__buf_put(b, "<|\"|> ", 6);
        forge__sc_lit(b, k, strlen(k));
        if (!bare) forge__buf_put(b, " <|\"|>", 6);
        return;
    }
    forge__buf key;
    forge__buf_init(&key, NULL, 0);
    forge__buf_put(&key, "\"", 1);
    for (const unsigned char *q = (const unsigned char *)k; *q; q++) { /* the key as JSON writes it */
        char e[8];
        if (*q == '"' || *q == '\\') { e[0] = '\\'; e[1] = (char)*q; forge__buf_put(&key, e, 2); }
        else if (*q < 0x20) { snprintf(e, sizeof e, "\\u%04x", *q); forge__buf_put(&key, e, 6); }
        else forge__buf_put(&key, q, 1);
    }
    forge__buf_put(&key, "\"", 1);
    forge__sc_lit(b, key.p, key.n);
    if (key.oom) b->oom = true;
    forge__buf_free(&key);
}

/* A fresh rule name from a hint (a property name, "item"...): [a-z0-9-], unique. */
static void forge__sc_name(forge__sc *c, const char *hint, char out[64]) {
    char base[40];
    size_t k = 0;
    for (const char *p = hint ? hint : "r"; *p && k < sizeof base - 1; p++) {
        char ch = (char)tolower((unsigned char)*p);
        if (isalnum((unsigned char)ch)) base[k++] = ch;
        else if (k && base[k - 1] != '-') base[k++] = '-';
    }
    while (k && base[k - 1] == '-') k--;
    if (!k) base[k++] = 'r';
    base[k] = 0;
    static const char *const reserved[] = {"root", "ws", "json-char", "json-string", "json-int", "json-number", "json-value", "json-object",
                                           "json-array", "json-key-char", "fmt-date", "fmt-md", "fmt-leap", "fmt-time", "fmt-email-atom",
                                           "fmt-email-label", "g4-text", "g4-key"};
    const char *pre = c->prefix ? c->prefix : "";
    for (unsigned i = 0;; i++) {
        if (i == 0) snprintf(out, 64, "%.16s%s", pre, base);
        else snprintf(out, 64, "%.16s%s-%u", pre, base, ++c->counter);
        bool taken = false;
        for (size_t r = 0; r < FORGE__ARRAY_LEN(reserved) && !taken; r++) taken = !strcmp(out, reserved[r]);
        uint64_t h = forge__fnv(FORGE__FNV_BASIS, out, strlen(out));
        uint32_t k = c->name_tab ? (uint32_t)h & c->name_mask : 0;
        for (; c->name_tab && c->name_tab[k] && !taken; k = (k + 1) & c->name_mask) taken = !strcmp(c->names.p + c->name_tab[k] - 1, out);
        if (taken) continue;
        if (!c->name_tab || (c->n_names + 1) * 2 > c->name_mask + 1) { /* grow the table */
            uint32_t cap = c->name_tab ? (c->name_mask + 1) * 2 : 256;
            uint32_t *t = (uint32_t *)calloc(cap, 4);
            if (!t) { forge__sc_fail(c, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); return; }
            for (uint32_t q = 0; c->name_tab && q <= c->name_mask; q++)
                if (c->name_tab[q]) {
                    const char *nm = c->names.p + c->name_tab[q] - 1;
                    uint32_t j = (uint32_t)forge__fnv(FORGE__FNV_BASIS, nm, strlen(nm)) & (cap - 1);
                    while (t[j]) j = (j + 1) & (cap - 1);
                    t[j] = c->name_tab[q];
                }
            free(c->name_tab);
            c->name_tab = t;
            c->name_mask = cap - 1;
            k = (uint32_t)h & c->name_mask;
            while (c->name_tab[k]) k = (k + 1) & c->name_mask;
        }
        c->name_tab[k] = (uint32_t)c->names.n + 1;
        c->n_names++;
        forge__buf_put(&c->names, out, strlen(out) + 1);
        return;
    }
}

/* ---- literals: a set of strings as a trie of rules ---- */

typedef struct forge__sc_str {
    const char *s;
    size_t n;
} forge__sc_str;

static int forge__sc_str_cmp(const void *a, const void *b) {
    const forge__sc_str *x = (const forge__sc_str *)a, *y = (const forge__sc_str *)b;
    int r = memcmp(x->s, y->s, FORGE__MIN(x->n, y->n));
    return r ? r : (x->n > y->n) - (x->n < y->n);
}

static size_t forge__sc_cp_len(const char *s, size_t n) {
    size_t l = (size_t)forge__utf8_len1((unsigned char)s[0]);
    return l > n ? n : l;
}

/* Appends to b an expression matching exactly the strings v[lo..hi) (sorted, distinct), all
 * sharing their first d bytes (not written): literals for the common runs, a rule where they branch. */
static void forge__sc_trie(forge__sc *c, forge__buf *b, const forge__sc_str *v, size_t lo, size_t hi, size_t d, const char *hint) {
    if (c->st) return;
    /* the run all strings share past d (at code-point boundaries) */
    size_t l = v[lo].n;
    if (hi - lo > 1) {
        l = 0;
        size_t m = FORGE__MIN(v[lo].n, v[hi - 1].n);
        while (l < m && v[lo].s[l] == v[hi - 1].s[l]) l++;
    }
    size_t run = d;
    while (run < l) {
        size_t k = forge__sc_cp_len(v[lo].s + run, v[lo].n - run);
        if (run + k > l) break;
        run += k;
    }
    if (run > d) {
        forge__sc_lit(b, v[lo].s + d, run - d);
        forge__buf_put(b, " ", 1);
    }
    if (hi - lo == 1 && run == v[lo].n) return;
    /* branch: its own rule, an alternative per next code point (and "" when a string ends here) */
    char name[64];
    forge__sc_name(c, hint, name);
    forge__sc_puts(b, name);
    forge__buf_put(b, " ", 1);
    forge__buf alt;
    forge__buf_init(&alt, NULL, 0);
    forge__sc_printf(&alt, "%s ::=", name);
    bool first = true;
    size_t i = lo;
    if (v[i].n == run) { forge__sc_puts(&alt, " \"\""); first = false; i++; }
    while (i < hi && !c->st) {
        size_t k = forge__sc_cp_len(v[i].s + run, v[i].n - run);
        size_t j = i + 1;
        while (j < hi && v[j].n >= run + k && !memcmp(v[j].s + run, v[i].s + run, k)) j++;
        forge__sc_puts(&alt, first ? " " : " | ");
        first = false;
        forge__sc_lit(&alt, v[i].s + run, k);
        forge__buf_put(&alt, " ", 1);
        forge__sc_trie(c, &alt, v, i, j, run + k, hint);
        i = j;
    }
    forge__buf_put(&alt, "\n", 1);
    forge__buf_put(&c->out, alt.p, alt.n);
    if (alt.oom) c->out.oom = true;
    forge__buf_free(&alt);
}

/* Writes rule `name` ::= one of the n strings (duplicates allowed). */
static void forge__sc_literals(forge__sc *c, const char *name, forge__sc_str *v, size_t n) {
    qsort(v, n, sizeof *v, forge__sc_str_cmp);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!k || forge__sc_str_cmp(&v[k - 1], &v[i])) v[k++] = v[i];
    forge__buf body;
    forge__buf_init(&body, NULL, 0);
    forge__sc_trie(c, &body, v, 0, k, 0, name);
    forge__sc_printf(&c->out, "%s ::= ", name);
    if (body.n) forge__buf_put(&c->out, body.p, body.n);
    else forge__sc_puts(&c->out, "\"\""); /* the empty string alone (Gemma 4's enum [""]: a rule needs a body) */
    forge__buf_put(&c->out, "\n", 1);
    if (body.oom) c->out.oom = true;
    forge__buf_free(&body);
}

/* ---- regex patterns (ECMA 262, the subset docs/features.md lists) -> GBNF over JSON string text ---- */

typedef struct forge__rx {
    const char *p, *end, *src;
    forge__sc *c;
    int nest;
} forge__rx;

static bool forge__rx_fail(forge__rx *r, const char *what) {
    return forge__sc_fail(r->c, FORGE_ERR_UNSUPPORTED, "pattern \"%.200s\": %s (at offset %d)", r->src, what, (int)(r->p - r->src));
}

/* A code-point set as ranges (sorted later); room for the common classes. */
typedef struct forge__rxset {
    forge__cprange r[64];
    int n;
    bool neg;
} forge__rxset;

static bool forge__rxset_add(forge__rx *x, forge__rxset *s, uint32_t lo, uint32_t hi) {
    if (s->n >= (int)FORGE__ARRAY_LEN(s->r)) return forge__rx_fail(x, "a character class with too many ranges");
    s->r[s->n++] = (forge__cprange){lo, hi};
    return true;
}

/* \d \w \s and their negations into s (negated ones only outside brackets: `neg_ok`). */
static bool forge__rx_class_escape(forge__rx *x, char e, forge__rxset *s, bool *handled) {
    *handled = true;
    switch (e) {
    case 'd': return forge__rxset_add(x, s, '0', '9');
    case 'w': return forge__rxset_add(x, s, '0', '9') && forge__rxset_add(x, s, 'A', 'Z') && forge__rxset_add(x, s, '_', '_') && forge__rxset_add(x, s, 'a', 'z');
    case 's':
        return forge__rxset_add(x, s, '\t', '\r') && forge__rxset_add(x, s, ' ', ' ') && forge__rxset_add(x, s, 0xA0, 0xA0) &&
               forge__rxset_add(x, s, 0x1680, 0x1680) && forge__rxset_add(x, s, 0x2000, 0x200A) && forge__rxset_add(x, s, 0x2028, 0x2029) &&
               forge__rxset_add(x, s, 0x202F, 0x202F) && forge__rxset_add(x, s, 0x205F, 0x205F) && forge__rxset_add(x, s, 0x3000, 0x3000) &&
               forge__rxset_add(x, s, 0xFEFF, 0xFEFF);
    }
    *handled = false;
    return true;
}

/* One escaped code point (after the backslash) into *cp. */
static bool forge__rx_escape_cp(forge__rx *x, uint32_t *cp) {
    char e = *x->p++;
    switch (e) {
    case 'n': *cp = '\n'; return true;
    case 'r': *cp = '\r'; return true;
    case 't': *cp = '\t'; return true;
    case 'f': *cp = '\f'; return true;
    case 'v': *cp = '\v'; return true;
    case '0': *cp = 0; return true;
    case 'x':
    case 'u': {
        int digits = e == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            int h = x->p < x->end ? forge__hexval(*x->p) : -1;
            if (h < 0) return forge__rx_fail(x, "a \\x or \\u escape without its hex digits");
            v = v * 16 + (uint32_t)h;
            x->p++;
        }
        *cp = v;
        return true;
    }
    }
    if (isalnum((unsigned char)e)) {
        x->p--;
        return forge__rx_fail(x, "an escape forge does not support (\\b, \\B, back-references, \\p{...}, ...)");
    }
    *cp = (unsigned char)e; /* an escaped punctuation character stands for itself */
    return true;
}

/* The set as GBNF matching its members as they appear inside a JSON string: plain characters
 * as a class, '"', '\\' and control characters as their escapes. */
static void forge__rx_emit_set(forge__buf *b, forge__rxset *s) {
    size_t n = forge__cp_normalize(s->r, (size_t)s->n);
    /* the members: complement when negated */
    forge__cprange m[130];
    size_t k = 0;
    if (s->neg) {
        uint32_t next = 0;
        for (size_t i = 0; i < n && k < 128; i++) {
            if (s->r[i].lo > next) m[k++] = (forge__cprange){next, s->r[i].lo - 1};
            next = s->r[i].hi + 1;
        }
        if (next <= 0x10FFFF) m[k++] = (forge__cprange){next, 0x10FFFF};
    } else {
        memcpy(m, s->r, sizeof *m * n);
        k = n;
    }
    bool has[0x20 + 2] = {false}; /* controls, then '"', '\\' */
    forge__buf cls;
    forge__buf_init(&cls, NULL, 0);
    int pieces = 0;
    for (size_t i = 0; i < k; i++) {
        uint32_t lo = m[i].lo, hi = m[i].hi;
        for (uint32_t cp = lo; cp <= hi && cp < 0x20; cp++) has[cp] = true;
        if ('"' >= lo && '"' <= hi) has[0x20] = true;
        if ('\\' >= lo && '\\' <= hi) has[0x21] = true;
        /* the plain part: without controls, '"' and '\\' */
        uint32_t segs[3][2] = {{FORGE__MAX(lo, 0x20u), FORGE__MIN(hi, 0x21u)}, {FORGE__MAX(lo, 0x23u), FORGE__MIN(hi, 0x5Bu)}, {FORGE__MAX(lo, 0x5Du), hi}};
        for (int q = 0; q < 3; q++) {
            if (segs[q][0] > segs[q][1]) continue;
            char t[32];
            int len = segs[q][0] == segs[q][1] ? snprintf(t, sizeof t, "\\U%08X", segs[q][0]) : snprintf(t, sizeof t, "\\U%08X-\\U%08X", segs[q][0], segs[q][1]);
            forge__buf_put(&cls, t, (size_t)len);
            pieces++;
        }
    }
    forge__buf_put(b, "(", 1);
    bool first = true;
    if (pieces) {
        forge__buf_put(b, "[", 1);
        forge__buf_put(b, cls.p, cls.n);
        forge__buf_put(b, "]", 1);
        first = false;
    }
    static const char *const short_esc[0x20] = {[8] = "\\\\b", [9] = "\\\\t", [10] = "\\\\n", [12] = "\\\\f", [13] = "\\\\r"};
    for (int cp = 0; cp < 0x22; cp++) {
        if (!has[cp]) continue;
        forge__sc_puts(b, first ? "" : " | ");
        first = false;
        if (cp == 0x20) forge__sc_puts(b, "\"\\\\\\\"\"");
        else if (cp == 0x21) forge__sc_puts(b, "\"\\\\\\\\\"");
        else if (short_esc[cp]) forge__sc_printf(b, "\"%s\" | \"\\\\u%04x\" | \"\\\\u%04X\"", short_esc[cp], cp, cp);
        else forge__sc_printf(b, "\"\\\\u%04x\" | \"\\\\u%04X\"", cp, cp);
    }
    if (first) forge__sc_puts(b, "[^\\x00-\\U0010FFFF]"); /* an empty set: nothing */
    forge__buf_put(b, ")", 1);
    forge__buf_free(&cls);
}

/* recursion: a group of the pattern holds alternatives again */
static bool forge__rx_alt(forge__rx *x, forge__buf *b, bool *nullable);

/* One atom (with its quantifier) into b. */
/* One atom and its quantifier into b; *nullable: whether it can match the empty string. */
static bool forge__rx_piece(forge__rx *x, forge__buf *b, bool *nullable) {
    forge__buf atom;
    forge__buf_init(&atom, NULL, 0);
    char c = *x->p;
    bool ok = true, empty = false; /* (the atom's) */
    if (c == '(') {
        x->p++;
        if (x->p < x->end && *x->p == '?') {
            if (x->p + 1 < x->end && x->p[1] == ':') x->p += 2;
            else if (x->p + 1 < x->end && x->p[1] == '<' && x->p + 2 < x->end && x->p[2] != '=' && x->p[2] != '!') { /* a named group */
                const char *gt = memchr(x->p, '>', (size_t)(x->end - x->p));
                if (!gt) return forge__rx_fail(x, "an unterminated group name");
                x->p = gt + 1;
            } else return forge__rx_fail(x, "lookaround assertions are not supported");
        }
        if (++x->nest > 100) return forge__rx_fail(x, "groups nested deeper than 100");
        forge__buf_put(&atom, "(", 1);
        ok = forge__rx_alt(x, &atom, &empty);
        x->nest--;
        if (ok && (x->p >= x->end || *x->p != ')')) ok = forge__rx_fail(x, "a group without its ')'");
        if (ok) x->p++;
        forge__buf_put(&atom, ")", 1);
    } else if (c == '[') {
        x->p++;
        forge__rxset s = {.n = 0};
        if (x->p < x->end && *x->p == '^') { s.neg = true; x->p++; }
        bool firstc = true;
        while (ok && x->p < x->end && (*x->p != ']' || firstc)) {
            firstc = false;
            uint32_t lo;
            if (*x->p == '\\') {
                x->p++;
                if (x->p >= x->end) { ok = forge__rx_fail(x, "a class ends in '\\'"); break; }
                bool handled;
                if (strchr("DWS", *x->p)) { ok = forge__rx_fail(x, "\\D, \\W or \\S inside a class"); break; }
                if (!forge__rx_class_escape(x, *x->p, &s, &handled)) { ok = false; break; }
                if (handled) { x->p++; continue; }
                if (*x->p == 'b') { x->p++; lo = '\b'; }
                else if (!forge__rx_escape_cp(x, &lo)) { ok = false; break; }
            } else {
                int l = forge__utf8_dec((const unsigned char *)x->p, (size_t)(x->end - x->p), &lo);
                if (!l) { ok = forge__rx_fail(x, "invalid UTF-8"); break; }
                x->p += l;
            }
            uint32_t hi = lo;
            if (x->p + 1 < x->end && *x->p == '-' && x->p[1] != ']') {
                x->p++;
                if (*x->p == '\\') {
                    x->p++;
                    if (x->p >= x->end || !forge__rx_escape_cp(x, &hi)) { ok = x->p < x->end ? false : forge__rx_fail(x, "a class ends in '\\'"); break; }
                } else {
                    int l = forge__utf8_dec((const unsigned char *)x->p, (size_t)(x->end - x->p), &hi);
                    if (!l) { ok = forge__rx_fail(x, "invalid UTF-8"); break; }
                    x->p += l;
                }
                if (hi < lo) { ok = forge__rx_fail(x, "a class range out of order"); break; }
            }
            ok = forge__rxset_add(x, &s, lo, hi);
        }
        if (ok && x->p >= x->end) ok = forge__rx_fail(x, "a class without its ']'");
        if (ok) {
            x->p++;
            forge__rx_emit_set(&atom, &s);
        }
    } else if (c == '.') {
        x->p++;
        forge__rxset s = {.n = 0, .neg = true};
        forge__rxset_add(x, &s, '\n', '\n');
        forge__rxset_add(x, &s, '\r', '\r');
        forge__rxset_add(x, &s, 0x2028, 0x2029);
        forge__rx_emit_set(&atom, &s);
    } else if (c == '\\') {
        x->p++;
        if (x->p >= x->end) return forge__rx_fail(x, "the pattern ends in '\\'");
        forge__rxset s = {.n = 0};
        bool handled;
        char e = *x->p;
        if (e == 'D' || e == 'W' || e == 'S') {
            s.neg = true;
            e = (char)tolower((unsigned char)e);
        }
        if (!forge__rx_class_escape(x, e, &s, &handled)) return false;
        if (handled) x->p++;
        else {
            uint32_t cp;
            if (!forge__rx_escape_cp(x, &cp)) return false;
            forge__rxset_add(x, &s, cp, cp);
        }
        forge__rx_emit_set(&atom, &s);
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        return forge__rx_fail(x, "a quantifier with nothing before it");
    } else if (c == '^' || c == '$') {
        return forge__rx_fail(x, "'^' or '$' inside the pattern (only at its start and end)");
    } else {
        uint32_t cp;
        int l = forge__utf8_dec((const unsigned char *)x->p, (size_t)(x->end - x->p), &cp);
        if (!l) return forge__rx_fail(x, "invalid UTF-8");
        x->p += l;
        forge__rxset s = {.n = 0};
        forge__rxset_add(x, &s, cp, cp);
        forge__rx_emit_set(&atom, &s);
    }
    if (!ok || x->c->st) {
        forge__buf_free(&atom);
        return false;
    }
    forge__buf_put(b, atom.p, atom.n);
    forge__buf_free(&atom);
    *nullable = empty;
    /* quantifiers (a lazy '?' after one matches the same strings); an unbounded one over an atom
     * that can match nothing would be a grammar rule that reaches itself without text */
    if (x->p < x->end && (*x->p == '*' || *x->p == '+' || *x->p == '?')) {
        if (empty && *x->p != '?') return forge__rx_fail(x, "a repetition of a group that can match the empty string");
        *nullable = empty || *x->p != '+';
        forge__buf_put(b, x->p, 1);
        x->p++;
    } else if (x->p < x->end && *x->p == '{') {
        const char *q = x->p + 1;
        unsigned long lo = 0, hi = 0;
        bool comma = false, has_hi = false;
        if (q >= x->end || !isdigit((unsigned char)*q)) return forge__rx_fail(x, "'{' that is not a {m,n} quantifier");
        while (q < x->end && isdigit((unsigned char)*q) && lo <= FORGE__SC_MAX_EXPAND) lo = lo * 10 + (unsigned long)(*q++ - '0');
        if (q < x->end && *q == ',') {
            comma = true;
            q++;
            while (q < x->end && isdigit((unsigned char)*q) && hi <= FORGE__SC_MAX_EXPAND) { hi = hi * 10 + (unsigned long)(*q++ - '0'); has_hi = true; }
        }
        if (q >= x->end || *q != '}') return forge__rx_fail(x, "a {m,n} quantifier without its '}'");
        if (lo > FORGE__SC_MAX_EXPAND || hi > FORGE__SC_MAX_EXPAND) return forge__sc_fail(x->c, FORGE_ERR_LIMIT, "pattern \"%.200s\": a repetition count over %d", x->src, FORGE__SC_MAX_EXPAND);
        if (has_hi && hi < lo) return forge__rx_fail(x, "a {m,n} quantifier with n < m");
        if (empty && comma && !has_hi) return forge__rx_fail(x, "a repetition of a group that can match the empty string");
        *nullable = empty || lo == 0;
        if (!comma) forge__sc_printf(b, "{%lu}", lo);
        else if (has_hi) forge__sc_printf(b, "{%lu,%lu}", lo, hi);
        else forge__sc_printf(b, "{%lu,}", lo);
        x->p = q + 1;
    } else {
        return true;
    }
    if (x->p < x->end && *x->p == '?') x->p++; /* lazy */
    if (x->p < x->end && (*x->p == '*' || *x->p == '+' || *x->p == '{')) return forge__rx_fail(x, "a quantifier after a quantifier");
    return true;
}

/* Alternatives into b; *nullable: whether one of them can match the empty string. */
static bool forge__rx_alt(forge__rx *x, forge__buf *b, bool *nullable) {
    *nullable = false;
    for (;;) {
        forge__buf_put(b, " (", 2);
        bool all = true; /* every piece of this alternative can match nothing */
        while (x->p < x->end && *x->p != '|' && *x->p != ')') {
            if (*x->p == '$' && x->p + 1 == x->end) break;
            forge__buf_put(b, " ", 1);
            bool e = false;
            if (!forge__rx_piece(x, b, &e)) return false;
            all = all && e;
        }
        *nullable = *nullable || all;
        forge__buf_put(b, " )", 2);
        if (x->p < x->end && *x->p == '|') {
            x->p++;
            forge__buf_put(b, " |", 2);
            continue;
        }
        return true;
    }
}

/* Writes rule `name` ::= a JSON string whose value matches `pattern` (unanchored unless it
 * starts with ^ / ends with $, as JSON Schema's patterns are). */
static void forge__sc_pattern(forge__sc *c, const char *name, const char *pattern) {
    forge__rx x = {pattern, pattern + strlen(pattern), pattern, c, 0};
    bool start = x.p < x.end && *x.p == '^';
    if (start) x.p++;
    size_t len = (size_t)(x.end - x.p);
    bool end = len && x.end[-1] == '$' && (len < 2 || x.end[-2] != '\\');
    forge__buf body;
    forge__buf_init(&body, NULL, 0);
    bool empty;
    bool ok = forge__rx_alt(&x, &body, &empty);
    if (ok && x.p < x.end && !(end && x.p + 1 == x.end)) ok = forge__rx_fail(&x, "an unmatched ')'");
    if (ok) {
        forge__sc_printf(&c->out, "%s ::= \"\\\"\" %s(", name, start ? "" : "json-char* ");
        forge__buf_put(&c->out, body.p, body.n);
        forge__sc_printf(&c->out, " )%s \"\\\"\"\n", end ? "" : " json-char*");
    }
    forge__buf_free(&body);
}

/* ---- numbers within bounds ---- */

/* The digits of v (>= 0) into s; its length. */
static int forge__sc_digits(int64_t v, char s[24]) { return snprintf(s, 24, "%lld", (long long)v); }

/* An expression for the decimal numerals (no leading zeros) of the integers [a, b], a <= b,
 * both of n digits. */
static void forge__sc_same_len(forge__buf *b, const char *x, const char *y, int n) {
    if (n == 0) return;
    if (n == 1) {
        if (x[0] == y[0]) forge__sc_printf(b, "\"%c\"", x[0]);
        else forge__sc_printf(b, "[%c-%c]", x[0], y[0]);
        return;
    }
    if (x[0] == y[0]) {
        forge__sc_printf(b, "\"%c\" ", x[0]);
        forge__sc_same_len(b, x + 1, y + 1, n - 1);
        return;
    }
    bool x_low = true, y_high = true;
    for (int i = 1; i < n; i++) { x_low &= x[i] == '0'; y_high &= y[i] == '9'; }
    if (x_low && y_high) {
        forge__sc_printf(b, "[%c-%c] [0-9]{%d}", x[0], y[0], n - 1);
        return;
    }
    char nines[24], zeros[24];
    memset(nines, '9', (size_t)n);
    memset(zeros, '0', (size_t)n);
    forge__buf_put(b, "(", 1);
    /* x[0] then x[1..] .. 9..9 */
    forge__sc_printf(b, "\"%c\" (", x[0]);
    forge__sc_same_len(b, x + 1, nines, n - 1);
    forge__buf_put(b, ")", 1);
    if (y[0] - x[0] > 1) {
        if (y[0] - x[0] == 2) forge__sc_printf(b, " | \"%c\" [0-9]{%d}", x[0] + 1, n - 1);
        else forge__sc_printf(b, " | [%c-%c] [0-9]{%d}", x[0] + 1, y[0] - 1, n - 1);
    }
    forge__sc_printf(b, " | \"%c\" (", y[0]);
    forge__sc_same_len(b, zeros, y + 1, n - 1);
    forge__buf_put(b, "))", 2);
}

#define FORGE__SC_MAX_DIGITS 16
static const int64_t forge__sc_unbounded = INT64_MAX;

/* Appends alternatives (each prefixed " | " unless first) for the integers [a, b] (a >= 0;
 * b forge__sc_unbounded: up to 16 digits). Returns false when the range is empty. */
static bool forge__sc_uint_range(forge__buf *b, int64_t a, int64_t hi, bool *first) {
    int64_t limit = 9999999999999999LL; /* 16 digits */
    if (hi == forge__sc_unbounded || hi > limit) hi = limit;
    if (a > hi) return false;
    char xa[24], xb[24];
    for (int d = 1; d <= FORGE__SC_MAX_DIGITS; d++) {
        int64_t lo_d = d == 1 ? 0 : 1, hi_d = 9;
        for (int i = 1; i < d; i++) { lo_d *= 10; hi_d = hi_d * 10 + 9; }
        int64_t x = FORGE__MAX(a, lo_d), y = FORGE__MIN(hi, hi_d);
        if (x > y) continue;
        int nx = forge__sc_digits(x, xa);
        forge__sc_digits(y, xb);
        forge__sc_puts(b, *first ? "(" : " | (");
        *first = false;
        forge__sc_same_len(b, xa, xb, nx);
        forge__buf_put(b, ")", 1);
    }
    return true;
}

typedef struct forge__sc_bound {
    bool has;
    int64_t v;
    bool excl;
} forge__sc_bound;

/* The fractions: any, only zeros, at least one non-zero digit (none for integers). */
#define FORGE__SC_FRAC_ANY " (\".\" [0-9]{1,16})?"
#define FORGE__SC_FRAC_ZERO " (\".\" \"0\"{1,16})?"
#define FORGE__SC_FRAC_NONZERO " \".\" \"0\"{0,15} [1-9] [0-9]{0,15}"

/* Alternatives for the non-negative y = I.F with lo <= y (or <) and y <= hi (or <), integral
 * bounds >= 0; `integer`: F empty. */
static void forge__sc_unsigned(forge__buf *b, forge__sc_bound lo, forge__sc_bound hi, bool integer, bool *first) {
    int64_t a = lo.has ? lo.v : 0;
    bool a_excl = lo.has && lo.excl;
    if (integer) {
        int64_t A = a_excl ? a + 1 : a;
        int64_t B = !hi.has ? forge__sc_unbounded : hi.excl ? hi.v - 1 : hi.v;
        if (B != forge__sc_unbounded && B < A) return;
        forge__sc_uint_range(b, A, B, first);
        return;
    }
    int64_t A = a_excl ? a + 1 : a; /* integral parts with any fraction start here */
    if (!hi.has) {
        forge__buf tmp;
        forge__buf_init(&tmp, NULL, 0);
        bool f = true;
        if (forge__sc_uint_range(&tmp, A, forge__sc_unbounded, &f)) {
            forge__sc_printf(b, "%s(", *first ? "" : " | ");
            forge__buf_put(b, tmp.p, tmp.n);
            forge__sc_puts(b, ")" FORGE__SC_FRAC_ANY);
            *first = false;
        }
        forge__buf_free(&tmp);
        if (a_excl) {
            forge__sc_printf(b, "%s\"%lld\"" FORGE__SC_FRAC_NONZERO, *first ? "" : " | ", (long long)a);
            *first = false;
        }
        return;
    }
    int64_t B = hi.v;
    if (B - 1 >= A) { /* I in [A, B-1]: any fraction */
        forge__buf tmp;
        forge__buf_init(&tmp, NULL, 0);
        bool f = true;
        forge__sc_uint_range(&tmp, A, B - 1, &f);
        forge__sc_printf(b, "%s(", *first ? "" : " | ");
        forge__buf_put(b, tmp.p, tmp.n);
        forge__sc_puts(b, ")" FORGE__SC_FRAC_ANY);
        *first = false;
        forge__buf_free(&tmp);
    }
    if (!hi.excl && B >= a && !(a_excl && B == a)) { /* I == B: zeros only */
        forge__sc_printf(b, "%s\"%lld\"" FORGE__SC_FRAC_ZERO, *first ? "" : " | ", (long long)B);
        *first = false;
    }
    if (a_excl && a < B) { /* I == a with a non-zero fraction */
        forge__sc_printf(b, "%s\"%lld\"" FORGE__SC_FRAC_NONZERO, *first ? "" : " | ", (long long)a);
        *first = false;
    }
}

/* Writes rule `name` ::= the integers (or numbers) within lo / hi (integral bounds). */
static void forge__sc_bounded(forge__sc *c, const char *name, forge__sc_bound lo, forge__sc_bound hi, bool integer) {
    forge__buf b;
    forge__buf_init(&b, NULL, 0);
    bool first = true;
    /* x >= 0 part */
    bool nonneg = !hi.has || hi.v > 0 || (hi.v == 0 && !hi.excl);
    if (nonneg) {
        forge__sc_bound l = lo.has && lo.v >= 0 ? lo : (forge__sc_bound){false, 0, false};
        forge__sc_unsigned(&b, l, hi, integer, &first);
    }
    /* x < 0: x = -y, y > 0; lo bounds y from above, hi from below */
    bool neg = !lo.has || lo.v < 0;
    if (neg) {
        forge__sc_bound yl = hi.has && hi.v < 0 ? (forge__sc_bound){true, -hi.v, hi.excl} : (forge__sc_bound){true, 0, true};
        if (hi.has && hi.v == 0 && hi.excl) yl = (forge__sc_bound){true, 0, true};
        forge__sc_bound yh = lo.has ? (forge__sc_bound){true, -lo.v, lo.excl} : (forge__sc_bound){false, 0, false};
        forge__buf t;
        forge__buf_init(&t, NULL, 0);
        bool f = true;
        forge__sc_unsigned(&t, yl, yh, integer, &f);
        if (!f) {
            forge__sc_printf(&b, "%s\"-\" (", first ? "" : " | ");
            forge__buf_put(&b, t.p, t.n);
            forge__buf_put(&b, ")", 1);
            first = false;
        }
        forge__buf_free(&t);
    }
    if (first) {
        forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "the bounds admit no %s (minimum above maximum?)", integer ? "integer" : "number");
    } else {
        forge__sc_printf(&c->out, "%s ::= ", name);
        forge__buf_put(&c->out, b.p, b.n);
        forge__buf_put(&c->out, "\n", 1);
    }
    forge__buf_free(&b);
}

/* ---- schemas ---- */

static const char *const forge__sc_annotations[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                                    "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "example", "markdownDescription"};

static bool forge__sc_is_annotation(const char *k) {
    for (size_t i = 0; i < FORGE__ARRAY_LEN(forge__sc_annotations); i++)
        if (!strcmp(k, forge__sc_annotations[i])) return true;
    return false;
}

/* The target of a $ref ("#", "#/$defs/x", any JSON pointer into the document). */
static cJSON *forge__sc_resolve(forge__sc *c, const char *ref) {
    if (ref[0] != '#') return forge__sc_fail(c, FORGE_ERR_UNSUPPORTED, "$ref \"%.200s\": only references into the schema itself (\"#...\")", ref), NULL;
    cJSON *at = c->doc;
    const char *p = ref + 1;
    if (*p && *p != '/') return forge__sc_fail(c, FORGE_ERR_UNSUPPORTED, "$ref \"%.200s\": anchors are not supported (a JSON pointer: \"#/$defs/name\")", ref), NULL;
    while (*p == '/') {
        p++;
        char key[512];
        size_t k = 0;
        while (*p && *p != '/' && k < sizeof key - 1) {
            if (*p == '~' && p[1] == '0') { key[k++] = '~'; p += 2; }
            else if (*p == '~' && p[1] == '1') { key[k++] = '/'; p += 2; }
            else if (*p == '%' && isxdigit((unsigned char)p[1]) && isxdigit((unsigned char)p[2])) {
                key[k++] = (char)(forge__hexval(p[1]) * 16 + forge__hexval(p[2]));
                p += 3;
            } else key[k++] = *p++;
        }
        key[k] = 0;
        if (cJSON_IsArray(at)) {
            char *endp;
            long i = strtol(key, &endp, 10);
            at = *endp || !k ? NULL : cJSON_GetArrayItem(at, (int)i);
        } else {
            at = cJSON_GetObjectItemCaseSensitive(at, key);
        }
        if (!at) return forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "$ref \"%.200s\" points at nothing", ref), NULL;
    }
    return at;
}

/* recursion: a schema's properties, items and branches are schemas again */
static void forge__sc_visit(forge__sc *c, const cJSON *s, const char *name);

/* The rule for a subschema: a new rule (named from hint) holding it; written into out. */
static void forge__sc_sub(forge__sc *c, const cJSON *s, const char *hint, char out[64]) {
    /* a plain $ref is its target's rule (made once: recursion ends there) */
    const cJSON *ref = cJSON_IsObject(s) ? cJSON_GetObjectItemCaseSensitive(s, "$ref") : NULL;
    bool only_ref = ref && cJSON_IsString(ref);
    if (only_ref)
        for (const cJSON *k = s->child; k; k = k->next)
            if (strcmp(k->string, "$ref") && !forge__sc_is_annotation(k->string)) only_ref = false;
    if (only_ref) {
        const cJSON *done = cJSON_GetObjectItemCaseSensitive(c->refs, ref->valuestring);
        if (done) {
            snprintf(out, 64, "%s", done->valuestring);
            return;
        }
        const cJSON *target = forge__sc_resolve(c, ref->valuestring);
        if (!target) { snprintf(out, 64, "ws"); return; }
        const char *slash = strrchr(ref->valuestring, '/');
        forge__sc_name(c, slash ? slash + 1 : "ref", out);
        cJSON_AddItemToObject(c->refs, ref->valuestring, cJSON_CreateString(out));
        forge__sc_visit(c, target, out);
        return;
    }
    forge__sc_name(c, hint, out);
    forge__sc_visit(c, s, out);
}

/* The set of JSON types a schema's "type" admits: bits of null, boolean, object, array, number,
 * string, integer. */
enum { FORGE__SCT_NULL = 1, FORGE__SCT_BOOL = 2, FORGE__SCT_OBJECT = 4, FORGE__SCT_ARRAY = 8, FORGE__SCT_NUMBER = 16, FORGE__SCT_STRING = 32,
       FORGE__SCT_INTEGER = 64, FORGE__SCT_ALL = 127 };

static unsigned forge__sc_type_bit(const char *t) {
    static const char *const names[] = {"null", "boolean", "object", "array", "number", "string", "integer"};
    for (unsigned i = 0; i < 7; i++)
        if (!strcmp(t, names[i])) return 1u << i;
    return 0;
}

static bool forge__sc_types(forge__sc *c, const cJSON *s, unsigned *types) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (!t) { *types = FORGE__SCT_ALL; return true; }
    *types = 0;
    if (cJSON_IsString(t)) *types = forge__sc_type_bit(t->valuestring);
    else if (cJSON_IsArray(t))
        for (const cJSON *e = t->child; e; e = e->next) {
            unsigned bit = cJSON_IsString(e) ? forge__sc_type_bit(e->valuestring) : 0;
            if (!bit) return forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "\"type\" holds something that is not a type name");
            *types |= bit;
        }
    if (!*types) return forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "\"type\" must be a type name or a list of them");
    if (*types & FORGE__SCT_NUMBER) *types |= FORGE__SCT_INTEGER; /* (integers are numbers) */
    return true;
}

/* A non-negative integer keyword (minItems ...): -1 when absent; false on a bad value. */
static bool forge__sc_count(forge__sc *c, const cJSON *s, const char *key, long *out) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, key);
    *out = -1;
    if (!x) return true;
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble != floor(x->valuedouble))
        return forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "\"%s\" must be a non-negative integer", key);
    if (x->valuedouble > FORGE__SC_MAX_EXPAND) {
        if (!strncmp(key, "max", 3)) return true; /* a maximum past any output is no bound */
        return forge__sc_fail(c, FORGE_ERR_LIMIT, "\"%s\" %g: forge expands counts up to %d", key, x->valuedouble, FORGE__SC_MAX_EXPAND);
    }
    *out = (long)x->valuedouble;
    return true;
}

/* enum / const (filtered by the schema's types): rule name ::= the values' JSON texts. */
static void forge__sc_enum(forge__sc *c, const cJSON *s, const char *name, unsigned types) {
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum"), *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (en && !cJSON_IsArray(en)) { forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "\"enum\" must be an array"); return; }
    int n = en ? cJSON_GetArraySize(en) : 0;
    if (n > FORGE__SC_MAX_ENUM) { forge__sc_fail(c, FORGE_ERR_LIMIT, "an enum of %d values (the most is %d)", n, FORGE__SC_MAX_ENUM); return; }
    char **texts = (char **)calloc((size_t)n + 1, sizeof *texts);
    forge__sc_str *v = (forge__sc_str *)malloc(sizeof *v * ((size_t)n + 1));
    size_t k = 0, n_str = 0;
    if (!texts || !v) { forge__sc_fail(c, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
    for (const cJSON *e = cn ? cn : en->child; e && !c->st; e = cn ? NULL : e->next) {
        unsigned t = cJSON_IsNull(e) ? FORGE__SCT_NULL : cJSON_IsBool(e) ? FORGE__SCT_BOOL : cJSON_IsObject(e) ? FORGE__SCT_OBJECT
                   : cJSON_IsArray(e) ? FORGE__SCT_ARRAY : cJSON_IsString(e) ? FORGE__SCT_STRING
                   : (cJSON_IsNumber(e) && e->valuedouble == floor(e->valuedouble)) ? FORGE__SCT_INTEGER : FORGE__SCT_NUMBER;
        if (t == FORGE__SCT_INTEGER && (types & FORGE__SCT_NUMBER)) t = FORGE__SCT_NUMBER;
        if (!(types & t) && !(t == FORGE__SCT_INTEGER && (types & FORGE__SCT_NUMBER))) continue;
        if (c->g4 && (t == FORGE__SCT_OBJECT || t == FORGE__SCT_ARRAY)) {
            forge__sc_fail(c, FORGE_ERR_UNSUPPORTED, "an object or array in \"%s\" in Gemma 4's notation (forge enforces strings, numbers, booleans and null there)", cn ? "const" : "enum");
            break;
        }
        /* (Gemma 4: a string's text, marked below; other values are written as JSON writes them) */
        char *j = c->g4 && t == FORGE__SCT_STRING ? strdup(e->valuestring) : cJSON_PrintUnformatted(e);
        if (!j) { forge__sc_fail(c, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); break; }
        if (strlen(j) > FORGE__SC_MAX_LITERAL) {
            free(j);
            forge__sc_fail(c, FORGE_ERR_LIMIT, "an enum or const value of more than %d bytes", FORGE__SC_MAX_LITERAL);
            break;
        }
        texts[k] = j;
        v[k] = (forge__sc_str){j, strlen(j)};
        k++;
        if (c->g4 && t == FORGE__SCT_STRING) { /* strings first in v (each list is sorted later: a swap keeps it so) */
            forge__sc_str x = v[n_str];
            char *xt = texts[n_str];
            v[n_str] = v[k - 1];
            texts[n_str] = texts[k - 1];
            v[k - 1] = x;
            texts[k - 1] = xt;
            n_str++;
        }
    }
    if (!c->st && k == 0) forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "\"%s\" admits no value of the schema's type", cn ? "const" : "enum");
    if (!c->st && !c->g4) forge__sc_literals(c, name, v, k);
    else if (!c->st) { /* Gemma 4: <|"|> one of the strings <|"|> | one of the other values */
        char sname[64] = "", oname[64] = "";
        if (n_str) {
            forge__sc_name(c, "str", sname);
            forge__sc_literals(c, sname, v, n_str);
        }
        if (k > n_str) {
            forge__sc_name(c, "lit", oname);
            forge__sc_literals(c, oname, v + n_str, k - n_str);
        }
        forge__sc_printf(&c->out, "%s ::= ", name);
        if (n_str) forge__sc_printf(&c->out, "%s %s %s%s", forge__sc_quote(c), sname, forge__sc_quote(c), oname[0] ? " | " : "");
        forge__sc_printf(&c->out, "%s\n", oname);
    }
done:
    for (size_t i = 0; texts && i < k; i++) free(texts[i]);
    free(texts);
    free(v);
}

/* Keywords a schema may have, by what they constrain. */
static const char *const forge__sc_known[] = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "additionalItems", "enum", "const", "anyOf", "oneOf",
    "allOf", "$ref", "minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "pattern", "format", "uniqueItems", "minProperties"};

/* The first keyword of s forge does not enforce, or NULL. */
static const char *forge__sc_unknown(const cJSON *s) {
    for (const cJSON *k = s->child; k; k = k->next) {
        bool ok = forge__sc_is_annotation(k->string);
        for (size_t i = 0; i < FORGE__ARRAY_LEN(forge__sc_known) && !ok; i++) ok = !strcmp(k->string, forge__sc_known[i]);
        if (!strcmp(k->string, "uniqueItems") && cJSON_IsTrue(k)) ok = false;
        if (!strcmp(k->string, "minProperties") && !(cJSON_IsNumber(k) && k->valuedouble <= 0)) ok = false;
        if (!ok) return k->string;
    }
    return NULL;
}

/* JSON nodes in x and below. */
static uint64_t forge__sc_nodes(const cJSON *x) {
    uint64_t n = 1;
    for (const cJSON *k = x->child; k; k = k->next) n += forge__sc_nodes(k);
    return n;
}

/* Counts schema x's nodes against the merges' budget: false (and the error) past it. */
static bool forge__sc_charge(forge__sc *c, const cJSON *x) {
    if (x) c->made += forge__sc_nodes(x);
    if (c->made <= FORGE__SC_MAX_MADE) return true;
    return forge__sc_fail(c, FORGE_ERR_LIMIT, "allOf / $ref merges make more than %d schema nodes (a $ref beside other keywords that recurses?)",
                          FORGE__SC_MAX_MADE);
}

static cJSON *forge__sc_own(forge__sc *c, cJSON *x) {
    if (x) cJSON_AddItemToArray(c->owned, x);
    else forge__sc_fail(c, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    return x && forge__sc_charge(c, x) ? x : NULL;
}

/* recursion: merging two schemas merges their subschemas */
static cJSON *forge__sc_merge(forge__sc *c, const cJSON *a, const cJSON *b, int depth);

/* A schema with its $ref (if any) resolved, as an object (true: {}; false: NULL with an error). */
static const cJSON *forge__sc_deref(forge__sc *c, const cJSON *s, int depth) {
    for (int hops = 0; cJSON_IsObject(s) && hops < 64; hops++) {
        const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
        if (!cJSON_IsString(ref)) return s;
        const cJSON *t = forge__sc_resolve(c, ref->valuestring);
        if (!t) return NULL;
        if (cJSON_GetArraySize(s) > 1) { /* $ref beside other keywords: both apply */
            cJSON *rest = forge__sc_own(c, cJSON_Duplicate(s, 1));
            if (!rest) return NULL;
            cJSON_DeleteItemFromObjectCaseSensitive(rest, "$ref");
            return forge__sc_merge(c, rest, t, depth + 1);
        }
        s = t;
    }
    if (cJSON_IsObject(s) && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(s, "$ref")))
        return forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "a $ref cycle with no schema between (it matches nothing)"), NULL;
    if (cJSON_IsTrue(s)) return forge__sc_own(c, cJSON_CreateObject());
    if (cJSON_IsFalse(s)) return forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "a schema of false (nothing matches) where a value is needed"), NULL;
    if (!cJSON_IsObject(s)) return forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "a schema that is not an object (or true / false)"), NULL;
    return s;
}

/* Both schemas at once (allOf): a new schema (owned by c) or NULL with the error. */
static cJSON *forge__sc_merge(forge__sc *c, const cJSON *a0, const cJSON *b0, int depth) {
    if (depth > FORGE__SC_MAX_DEPTH) return forge__sc_fail(c, FORGE_ERR_LIMIT, "allOf / $ref merges nested deeper than %d (recursive?)", FORGE__SC_MAX_DEPTH), NULL;
    const cJSON *a = forge__sc_deref(c, a0, depth), *b = a ? forge__sc_deref(c, b0, depth) : NULL;
    if (!a || !b) return NULL;
    /* allOf and anyOf inside either side first */
    const cJSON *sides[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        const cJSON *all = cJSON_GetObjectItemCaseSensitive(sides[i], "allOf");
        if (all) {
            cJSON *rest = forge__sc_own(c, cJSON_Duplicate(sides[i], 1));
            if (!rest) return NULL;
            cJSON_DeleteItemFromObjectCaseSensitive(rest, "allOf");
            const cJSON *acc = rest;
            for (const cJSON *e = all->child; e && acc; e = e->next) acc = forge__sc_merge(c, acc, e, depth + 1);
            return acc ? forge__sc_merge(c, acc, sides[1 - i], depth + 1) : NULL;
        }
    }
    for (int i = 0; i < 2; i++) {
        const char *alts = cJSON_GetObjectItemCaseSensitive(sides[i], "anyOf") ? "anyOf" : cJSON_GetObjectItemCaseSensitive(sides[i], "oneOf") ? "oneOf" : NULL;
        if (!alts) continue;
        cJSON *rest = forge__sc_own(c, cJSON_Duplicate(sides[i], 1));
        cJSON *out = forge__sc_own(c, cJSON_CreateObject());
        cJSON *list = cJSON_CreateArray();
        if (!rest || !out || !list) { cJSON_Delete(list); return NULL; }
        cJSON_DeleteItemFromObjectCaseSensitive(rest, alts);
        cJSON_AddItemToObject(out, "anyOf", list);
        const cJSON *other = forge__sc_merge(c, rest, sides[1 - i], depth + 1);
        for (const cJSON *e = cJSON_GetObjectItemCaseSensitive(sides[i], alts)->child; e && other && !c->st; e = e->next) {
            cJSON *m = forge__sc_merge(c, other, e, depth + 1);
            if (m) cJSON_AddItemToArray(list, cJSON_Duplicate(m, 1));
        }
        return c->st ? NULL : out;
    }
    cJSON *m = forge__sc_own(c, cJSON_Duplicate(a, 1));
    if (!m) return NULL;
    for (const cJSON *k = b->child; k && !c->st; k = k->next) {
        const char *key = k->string;
        if (forge__sc_is_annotation(key)) continue;
        cJSON *mine = cJSON_GetObjectItemCaseSensitive(m, key);
        if (!mine) {
            cJSON_AddItemToObject(m, key, cJSON_Duplicate(k, 1));
            continue;
        }
        if (!strcmp(key, "type")) {
            unsigned ta, tb;
            if (!forge__sc_types(c, a, &ta) || !forge__sc_types(c, b, &tb)) return NULL;
            unsigned t = ta & tb;
            if (!t) return forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "allOf: the branches' types have nothing in common"), NULL;
            cJSON *arr = cJSON_CreateArray();
            static const char *const names[] = {"null", "boolean", "object", "array", "number", "string", "integer"};
            for (unsigned i = 0; i < 7; i++)
                if ((t >> i) & 1 && !(i == 6 && (t & FORGE__SCT_NUMBER))) cJSON_AddItemToArray(arr, cJSON_CreateString(names[i]));
            cJSON_ReplaceItemInObjectCaseSensitive(m, "type", arr);
        } else if (!strcmp(key, "properties")) {
            for (const cJSON *p = k->child; p; p = p->next) {
                cJSON *q = cJSON_GetObjectItemCaseSensitive(mine, p->string);
                if (!q) {
                    cJSON_AddItemToObject(mine, p->string, cJSON_Duplicate(p, 1));
                } else {
                    cJSON *both = cJSON_CreateObject(), *list = cJSON_CreateArray();
                    cJSON_AddItemToArray(list, cJSON_Duplicate(q, 1));
                    cJSON_AddItemToArray(list, cJSON_Duplicate(p, 1));
                    cJSON_AddItemToObject(both, "allOf", list);
                    cJSON_ReplaceItemInObjectCaseSensitive(mine, p->string, both);
                }
            }
        } else if (!strcmp(key, "required")) {
            for (const cJSON *r = k->child; r; r = r->next) {
                bool have = false;
                for (const cJSON *q = mine->child; q && !have; q = q->next) have = cJSON_IsString(q) && cJSON_IsString(r) && !strcmp(q->valuestring, r->valuestring);
                if (!have) cJSON_AddItemToArray(mine, cJSON_Duplicate(r, 1));
            }
        } else if (!strcmp(key, "additionalProperties") || !strcmp(key, "items")) {
            if (cJSON_IsFalse(mine) || cJSON_IsFalse(k)) cJSON_ReplaceItemInObjectCaseSensitive(m, key, cJSON_CreateFalse());
            else if (cJSON_IsTrue(mine)) cJSON_ReplaceItemInObjectCaseSensitive(m, key, cJSON_Duplicate(k, 1));
            else if (!cJSON_IsTrue(k)) {
                cJSON *both = cJSON_CreateObject(), *list = cJSON_CreateArray();
                cJSON_AddItemToArray(list, cJSON_Duplicate(mine, 1));
                cJSON_AddItemToArray(list, cJSON_Duplicate(k, 1));
                cJSON_AddItemToObject(both, "allOf", list);
                cJSON_ReplaceItemInObjectCaseSensitive(m, key, both);
            }
        } else if (!strcmp(key, "minItems") || !strcmp(key, "minLength") || !strcmp(key, "minimum") || !strcmp(key, "minProperties")) {
            if (cJSON_IsNumber(k) && cJSON_IsNumber(mine) && k->valuedouble > mine->valuedouble) cJSON_ReplaceItemInObjectCaseSensitive(m, key, cJSON_Duplicate(k, 1));
        } else if (!strcmp(key, "maxItems") || !strcmp(key, "maxLength") || !strcmp(key, "maximum")) {
            if (cJSON_IsNumber(k) && cJSON_IsNumber(mine) && k->valuedouble < mine->valuedouble) cJSON_ReplaceItemInObjectCaseSensitive(m, key, cJSON_Duplicate(k, 1));
        } else if (!strcmp(key, "enum")) {
            cJSON *keep = cJSON_CreateArray();
            for (const cJSON *e = mine->child; e; e = e->next)
                for (const cJSON *f = k->child; f; f = f->next)
                    if (cJSON_Compare(e, f, 1)) { cJSON_AddItemToArray(keep, cJSON_Duplicate(e, 1)); break; }
            cJSON_ReplaceItemInObjectCaseSensitive(m, "enum", keep);
        } else if (cJSON_Compare(mine, k, 1)) {
            continue; /* the same on both sides */
        } else {
            return forge__sc_fail(c, FORGE_ERR_UNSUPPORTED, "allOf: two different \"%s\" (forge merges allOf of objects, bounds, enums and types)", key), NULL;
        }
    }
    /* additionalProperties false on one side limits the other's properties */
    for (int i = 0; i < 2 && !c->st; i++) {
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(sides[i], "additionalProperties");
        if (!cJSON_IsFalse(ap)) continue;
        const cJSON *own = cJSON_GetObjectItemCaseSensitive(sides[i], "properties");
        cJSON *props = cJSON_GetObjectItemCaseSensitive(m, "properties");
        for (cJSON *p = props ? props->child : NULL; p;) {
            cJSON *next = p->next;
            if (!cJSON_GetObjectItemCaseSensitive(own, p->string)) {
                const cJSON *req = cJSON_GetObjectItemCaseSensitive(m, "required");
                for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
                    if (cJSON_IsString(r) && !strcmp(r->valuestring, p->string))
                        return forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "allOf: property \"%.100s\" is required by one branch and not allowed by another", p->string), NULL;
                cJSON_DeleteItemFromObjectCaseSensitive(props, p->string);
            }
            p = next;
        }
    }
    return c->st || !forge__sc_charge(c, m) ? NULL : m; /* (what was added to m after it was owned) */
}

/* An object: rule `name`. */
static void forge__sc_object(forge__sc *c, const cJSON *s, const char *name) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) { forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "\"properties\" must be an object"); return; }
    if (req && !cJSON_IsArray(req)) { forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "\"required\" must be an array"); return; }
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        if (!cJSON_IsString(r)) { forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "\"required\" must hold strings"); return; }
        if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring) && cJSON_IsFalse(ap)) {
            forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "required property \"%.100s\" is not in \"properties\" and additionalProperties is false", r->valuestring);
            return;
        }
    }
    int n = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next) n++;
    /* required names missing from properties are declared as any value */
    int n_extra_req = 0;
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
        if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring)) n_extra_req++;
    int total = n + n_extra_req;
    char (*kv)[64] = (char (*)[64])calloc((size_t)total + 1, 64);
    bool *required = (bool *)calloc((size_t)total + 1, 1);
    const char **keys = (const char **)calloc((size_t)total + 1, sizeof *keys);
    if (!kv || !required || !keys) { forge__sc_fail(c, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
    int i = 0;
    for (const cJSON *p = props ? props->child : NULL; p && !c->st; p = p->next, i++) {
        keys[i] = p->string;
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next) required[i] |= !strcmp(r->valuestring, p->string);
        if (cJSON_IsFalse(p)) { /* never present */
            if (required[i]) { forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "property \"%.100s\" is required and its schema is false", p->string); goto done; }
            kv[i][0] = 0;
            continue;
        }
        char value[64];
        forge__sc_sub(c, p, p->string, value);
        char hint[48];
        snprintf(hint, sizeof hint, "%.40s-kv", p->string);
        forge__sc_name(c, hint, kv[i]);
        forge__buf line;
        forge__buf_init(&line, NULL, 0);
        forge__sc_printf(&line, "%s ::= ", kv[i]);
        forge__sc_key(c, &line, p->string);
        forge__sc_printf(&line, " ws \":\" ws %s\n", value);
        forge__buf_put(&c->out, line.p, line.n);
        if (line.oom) c->out.oom = true;
        forge__buf_free(&line);
    }
    for (const cJSON *r = req ? req->child : NULL; r && !c->st; r = r->next)
        if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring)) {
            keys[i] = r->valuestring;
            required[i] = true;
            const cJSON *sub = ap && !cJSON_IsTrue(ap) ? ap : NULL;
            char value[64] = "json-value";
            if (sub) forge__sc_sub(c, sub, r->valuestring, value);
            char hint[48];
            snprintf(hint, sizeof hint, "%.40s-kv", r->valuestring);
            forge__sc_name(c, hint, kv[i]);
            forge__sc_printf(&c->out, "%s ::= ", kv[i]);
            forge__sc_key(c, &c->out, r->valuestring);
            forge__sc_printf(&c->out, " ws \":\" ws %s\n", value);
            i++;
        }
    if (c->st) goto done;
    /* additional properties: under keys no declared property has (plain characters only) */
    char extra[64] = "";
    if (!cJSON_IsFalse(ap)) {
        char value[64] = "json-value";
        if (ap && !cJSON_IsTrue(ap)) forge__sc_sub(c, ap, "additional", value);
        char keyrule[64];
        forge__sc_name(c, "key", keyrule);
        if (total == 0) {
            if (c->g4) forge__sc_printf(&c->out, "%s ::= g4-key\n", keyrule); /* (bare, as the template writes keys) */
            else forge__sc_printf(&c->out, "%s ::= \"\\\"\" json-key-char* \"\\\"\"\n", keyrule);
        } else { /* a string of key characters that is none of the names: by the names' trie */
            forge__sc_str *v = (forge__sc_str *)malloc(sizeof *v * (size_t)total);
            if (!v) { forge__sc_fail(c, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
            int k = 0;
            for (int q = 0; q < total; q++) {
                bool plain = true;
                for (const unsigned char *t = (const unsigned char *)keys[q]; *t && plain; t++) plain = *t >= 0x20 && !strchr(c->g4 ? ":,{}[]<" : "\"\\", *t);
                if (plain) v[k++] = (forge__sc_str){keys[q], strlen(keys[q])};
            }
            qsort(v, (size_t)k, sizeof *v, forge__sc_str_cmp);
            /* rule per trie node: N ::= ("" unless a name ends here) | [other chars] json-key-char* | c N_c ... */
            forge__buf stack; /* (lo, hi, depth, rule number) */
            forge__buf_init(&stack, NULL, 0);
            unsigned id = 0;
            size_t init[4] = {0, (size_t)k, 0, id++};
            forge__buf_put(&stack, init, sizeof init);
            while (stack.n && !c->st) {
                size_t fr[4];
                stack.n -= sizeof fr;
                memcpy(fr, stack.p + stack.n, sizeof fr);
                size_t lo = fr[0], hi = fr[1], d = fr[2];
                forge__sc_printf(&c->out, "%s_n%zu ::=", keyrule, fr[3]); /* ('_': in no name forge__sc_name makes) */
                bool ends = false;
                size_t q = lo;
                if (q < hi && v[q].n == d) { ends = true; q++; }
                forge__buf cls;
                forge__buf_init(&cls, NULL, 0);
                bool first = true;
                if (!ends && !(c->g4 && d == 0)) { forge__sc_puts(&c->out, " \"\""); first = false; } /* (a bare key is never empty) */
                while (q < hi) {
                    size_t l = forge__sc_cp_len(v[q].s + d, v[q].n - d);
                    size_t j = q + 1;
                    while (j < hi && v[j].n >= d + l && !memcmp(v[j].s + d, v[q].s + d, l)) j++;
                    uint32_t cp = 0;
                    forge__utf8_dec((const unsigned char *)v[q].s + d, l, &cp);
                    forge__sc_printf(&cls, "\\U%08X", cp);
                    forge__sc_printf(&c->out, "%s", first ? " " : " | ");
                    first = false;
                    forge__sc_lit(&c->out, v[q].s + d, l);
                    forge__sc_printf(&c->out, " %s_n%u", keyrule, id);
                    size_t child[4] = {q, j, d + l, id++};
                    forge__buf_put(&stack, child, sizeof child);
                    q = j;
                }
                /* json-key-char's class, less the names' next characters (a bare key opens with no space) */
                forge__sc_printf(&c->out, "%s[^%s", first ? " " : " | ", c->g4 ? (d == 0 ? ":,{}\\[\\]<\\x00-\\x20" : ":,{}\\[\\]<\\x00-\\x1F") : "\"\\\\\\x00-\\x1F");
                forge__buf_put(&c->out, cls.p, cls.n);
                forge__sc_puts(&c->out, "] json-key-char*\n");
                forge__buf_free(&cls);
            }
            forge__buf_free(&stack);
            free(v);
            if (c->g4) forge__sc_printf(&c->out, "%s ::= %s_n0\n", keyrule, keyrule);
            else forge__sc_printf(&c->out, "%s ::= \"\\\"\" %s_n0 \"\\\"\"\n", keyrule, keyrule);
        }
        forge__sc_name(c, "extra-kv", extra);
        forge__sc_printf(&c->out, "%s ::= %s ws \":\" ws %s\n", extra, keyrule, value);
    }
    if (c->st) goto done;
    /* F_i: at least one pair from property i on; T_i: the rest, each after a comma */
    char F[64] = "", T[64] = ""; /* of i + 1 */
    char nf[64], nt[64];
    if (extra[0]) {
        forge__sc_name(c, "rest", T);
        forge__sc_printf(&c->out, "%s ::= (ws \",\" ws %s)*\n", T, extra);
        forge__sc_name(c, "first", F);
        forge__sc_printf(&c->out, "%s ::= %s %s\n", F, extra, T);
    }
    for (int q = total - 1; q >= 0 && !c->st; q--) {
        if (!kv[q][0]) continue;
        forge__sc_name(c, "rest", nt);
        forge__sc_name(c, "first", nf);
        if (required[q]) {
            forge__sc_printf(&c->out, "%s ::= %s %s\n", nf, kv[q], T);
            forge__sc_printf(&c->out, "%s ::= ws \",\" ws %s %s\n", nt, kv[q], T);
        } else {
            forge__sc_printf(&c->out, "%s ::= %s %s%s%s\n", nf, kv[q], T, F[0] ? " | " : "", F);
            forge__sc_printf(&c->out, "%s ::= (ws \",\" ws %s)? %s\n", nt, kv[q], T);
        }
        memcpy(F, nf, 64);
        memcpy(T, nt, 64);
    }
    bool any_required = false;
    for (int q = 0; q < total; q++) any_required |= required[q] && kv[q][0];
    if (!F[0]) forge__sc_printf(&c->out, "%s ::= \"{\" ws \"}\"\n", name);
    else if (any_required) forge__sc_printf(&c->out, "%s ::= \"{\" ws %s ws \"}\"\n", name, F);
    else forge__sc_printf(&c->out, "%s ::= \"{\" ws (%s ws)? \"}\"\n", name, F);
done:
    free(kv);
    free(required);
    free(keys);
}

/* An array: rule `name`. */
static void forge__sc_array(forge__sc *c, const cJSON *s, const char *name) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items"), *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalItems");
    if (cJSON_IsArray(items)) { /* draft 4-7 tuples */
        if (prefix) { forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "\"items\" as an array beside \"prefixItems\""); return; }
        prefix = items;
        items = addl;
    } else if (addl) {
        forge__sc_fail(c, FORGE_ERR_UNSUPPORTED, "\"additionalItems\" without an array \"items\"");
        return;
    }
    if (prefix && !cJSON_IsArray(prefix)) { forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "\"prefixItems\" must be an array"); return; }
    long mn, mx;
    if (!forge__sc_count(c, s, "minItems", &mn) || !forge__sc_count(c, s, "maxItems", &mx)) return;
    if (mn < 0) mn = 0;
    long k = prefix ? cJSON_GetArraySize(prefix) : 0;
    bool tail = !cJSON_IsFalse(items);
    if (mx >= 0 && mx < mn) { forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "maxItems %ld is below minItems %ld", mx, mn); return; }
    if (!tail && mn > k) { forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "minItems %ld, and only %ld items are allowed", mn, k); return; }
    if (mx >= 0 && k > mx) k = mx;
    char rest[64] = "json-value";
    if (tail && items && !cJSON_IsTrue(items)) forge__sc_sub(c, items, "item", rest);
    long K = FORGE__MAX(k, mn); /* explicit slots */
    if (mx == 0) { forge__sc_printf(&c->out, "%s ::= \"[\" ws \"]\"\n", name); return; }
    /* S_{K+1}: the tail, at least one item */
    char next[64] = "";
    if (tail && (mx < 0 || mx > K)) {
        forge__sc_name(c, "items", next);
        if (mx < 0) forge__sc_printf(&c->out, "%s ::= %s (ws \",\" ws %s)*\n", next, rest, rest);
        else if (mx - K - 1 > 0) forge__sc_printf(&c->out, "%s ::= %s (ws \",\" ws %s){0,%ld}\n", next, rest, rest, mx - K - 1);
        else forge__sc_printf(&c->out, "%s ::= %s\n", next, rest);
    }
    for (long j = K; j >= 1 && !c->st; j--) {
        char v[64] = "", sj[64];
        if (j <= k) forge__sc_sub(c, cJSON_GetArrayItem(prefix, (int)(j - 1)), "item", v);
        else snprintf(v, sizeof v, "%s", rest);
        forge__sc_name(c, "items", sj);
        if (!next[0]) forge__sc_printf(&c->out, "%s ::= %s\n", sj, v);
        else if (j + 1 <= mn) forge__sc_printf(&c->out, "%s ::= %s ws \",\" ws %s\n", sj, v, next);
        else forge__sc_printf(&c->out, "%s ::= %s (ws \",\" ws %s)?\n", sj, v, next);
        memcpy(next, sj, 64);
    }
    if (!next[0]) forge__sc_printf(&c->out, "%s ::= \"[\" ws \"]\"\n", name);
    else if (mn >= 1) forge__sc_printf(&c->out, "%s ::= \"[\" ws %s ws \"]\"\n", name, next);
    else forge__sc_printf(&c->out, "%s ::= \"[\" ws (%s ws)? \"]\"\n", name, next);
}

/* A string: rule `name`. */
static void forge__sc_string(forge__sc *c, const cJSON *s, const char *name) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern"), *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    long mn, mx;
    if (!forge__sc_count(c, s, "minLength", &mn) || !forge__sc_count(c, s, "maxLength", &mx)) return;
    if ((pat || fmt) && (mn > 0 || mx >= 0)) {
        forge__sc_fail(c, FORGE_ERR_UNSUPPORTED, "%s with minLength / maxLength (forge enforces one or the other)", pat ? "pattern" : "format");
        return;
    }
    if (pat && fmt) { forge__sc_fail(c, FORGE_ERR_UNSUPPORTED, "pattern with format (forge enforces one or the other)"); return; }
    if (pat) {
        if (!cJSON_IsString(pat)) { forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "\"pattern\" must be a string"); return; }
        if (c->g4) { /* (its regex compiles to JSON string text, escapes and all) */
            forge__sc_fail(c, FORGE_ERR_UNSUPPORTED, "pattern on a string in Gemma 4's notation (forge enforces type, enum, const, format, minLength and maxLength there)");
            return;
        }
        forge__sc_pattern(c, name, pat->valuestring);
        return;
    }
    if (fmt) {
        const char *f = cJSON_IsString(fmt) ? fmt->valuestring : "", *body = NULL;
        if (!strcmp(f, "date")) body = "fmt-date";
        else if (!strcmp(f, "time")) body = "fmt-time";
        else if (!strcmp(f, "date-time")) body = "fmt-date \"T\" fmt-time";
        else if (!strcmp(f, "uuid")) body = "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}";
        else if (!strcmp(f, "email")) body = "fmt-email-atom (\".\" fmt-email-atom)* \"@\" fmt-email-label (\".\" fmt-email-label)+";
        if (body) forge__sc_printf(&c->out, "%s ::= %s %s %s\n", name, forge__sc_quote(c), body, forge__sc_quote(c));
        else forge__sc_fail(c, FORGE_ERR_UNSUPPORTED, "format \"%.100s\" (forge enforces date, time, date-time, uuid and email)", f);
        return;
    }
    if (mn <= 0 && mx < 0) forge__sc_printf(&c->out, "%s ::= json-string\n", name);
    else if (mx < 0) forge__sc_printf(&c->out, "%s ::= %s json-char{%ld,} %s\n", name, forge__sc_quote(c), mn, forge__sc_quote(c));
    else if (mx < mn) forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "maxLength %ld is below minLength %ld", mx, mn);
    else forge__sc_printf(&c->out, "%s ::= %s json-char{%ld,%ld} %s\n", name, forge__sc_quote(c), mn < 0 ? 0 : mn, mx, forge__sc_quote(c));
}

/* Integer or number bounds: rule `name`. */
static void forge__sc_number(forge__sc *c, const cJSON *s, const char *name, bool integer) {
    forge__sc_bound lo = {false, 0, false}, hi = {false, 0, false};
    const char *keys[4] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (int i = 0; i < 4; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, keys[i]);
        if (!x) continue;
        bool excl = i == 1 || i == 3, upper = i >= 2;
        double v;
        if (cJSON_IsBool(x) && excl) continue; /* draft 4: a flag on minimum / maximum, read below */
        if (!cJSON_IsNumber(x)) { forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "\"%s\" must be a number", keys[i]); return; }
        v = x->valuedouble;
        if (!excl) { /* draft 4's boolean form */
            const cJSON *flag = cJSON_GetObjectItemCaseSensitive(s, upper ? "exclusiveMaximum" : "exclusiveMinimum");
            excl = cJSON_IsTrue(flag);
        }
        if (fabs(v) > 9.0e15) { forge__sc_fail(c, FORGE_ERR_UNSUPPORTED, "\"%s\" %g: forge enforces bounds within +-9e15", keys[i], v); return; }
        if (v != floor(v)) {
            if (!integer) { forge__sc_fail(c, FORGE_ERR_UNSUPPORTED, "\"%s\" %g on a number: forge enforces whole-number bounds on numbers", keys[i], v); return; }
            v = upper ? floor(v) : ceil(v); /* the nearest integers inside */
            excl = false;
        }
        forge__sc_bound b = {true, (int64_t)v, excl};
        if (integer && b.excl) { b.v += upper ? -1 : 1; b.excl = false; }
        forge__sc_bound *slot = upper ? &hi : &lo;
        /* the stricter of two bounds on one side */
        if (!slot->has || (upper ? (b.v < slot->v || (b.v == slot->v && b.excl)) : (b.v > slot->v || (b.v == slot->v && b.excl)))) *slot = b;
    }
    if (!lo.has && !hi.has) {
        forge__sc_printf(&c->out, "%s ::= %s\n", name, integer ? "json-int" : "json-number");
        return;
    }
    forge__sc_bounded(c, name, lo, hi, integer);
}

static void forge__sc_visit(forge__sc *c, const cJSON *s0, const char *name) {
    if (c->st) return;
    if (++c->depth > FORGE__SC_MAX_DEPTH) {
        forge__sc_fail(c, FORGE_ERR_LIMIT, "schemas nested deeper than %d", FORGE__SC_MAX_DEPTH);
        c->depth--;
        return;
    }
    const cJSON *s = forge__sc_deref(c, s0, c->depth);
    if (!s) goto out;
    const char *bad = forge__sc_unknown(s);
    if (bad) {
        forge__sc_fail(c, FORGE_ERR_UNSUPPORTED, "keyword \"%.100s\" is not enforced by forge (docs/features.md lists the ones it enforces)", bad);
        goto out;
    }
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    if (all) {
        if (!cJSON_IsArray(all) || !all->child) { forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "\"allOf\" must be a non-empty array"); goto out; }
        cJSON *rest = forge__sc_own(c, cJSON_Duplicate(s, 1));
        if (!rest) goto out;
        cJSON_DeleteItemFromObjectCaseSensitive(rest, "allOf");
        const cJSON *acc = rest;
        for (const cJSON *e = all->child; e && acc; e = e->next) acc = forge__sc_merge(c, acc, e, c->depth);
        if (acc) forge__sc_visit(c, acc, name);
        goto out;
    }
    const char *alts = cJSON_GetObjectItemCaseSensitive(s, "anyOf") ? "anyOf" : cJSON_GetObjectItemCaseSensitive(s, "oneOf") ? "oneOf" : NULL;
    if (alts) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(s, alts);
        if (!cJSON_IsArray(list) || !list->child) { forge__sc_fail(c, FORGE_ERR_INVALID_ARGUMENT, "\"%s\" must be a non-empty array", alts); goto out; }
        bool other = false; /* keywords beside the alternatives apply to each */
        for (const cJSON *k = s->child; k; k = k->next) other |= strcmp(k->string, alts) && !forge__sc_is_annotation(k->string);
        cJSON *rest = NULL;
        if (other) {
            if (!(rest = forge__sc_own(c, cJSON_Duplicate(s, 1)))) goto out;
            cJSON_DeleteItemFromObjectCaseSensitive(rest, alts);
        }
        forge__buf line;
        forge__buf_init(&line, NULL, 0);
        forge__sc_printf(&line, "%s ::=", name);
        int i = 0;
        for (const cJSON *e = list->child; e && !c->st; e = e->next, i++) {
            char sub[64];
            if (cJSON_IsFalse(e)) continue;
            const cJSON *alt = rest ? forge__sc_merge(c, rest, e, c->depth) : e;
            if (!alt) break;
            forge__sc_sub(c, alt, "alt", sub);
            forge__sc_printf(&line, "%s %s", i ? " |" : "", sub);
        }
        forge__buf_put(&line, "\n", 1);
        if (!c->st) forge__buf_put(&c->out, line.p, line.n);
        forge__buf_free(&line);
        goto out;
    }
    unsigned types;
    if (!forge__sc_types(c, s, &types)) goto out;
    if (!cJSON_GetObjectItemCaseSensitive(s, "type")) { /* no type: the ones its keywords describe, else any */
        static const char *const obj_k[] = {"properties", "required", "additionalProperties"};
        static const char *const arr_k[] = {"items", "prefixItems", "minItems", "maxItems"};
        static const char *const str_k[] = {"minLength", "maxLength", "pattern", "format"};
        static const char *const num_k[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
        unsigned t = 0;
        for (int i = 0; i < 3; i++) t |= cJSON_GetObjectItemCaseSensitive(s, obj_k[i]) ? FORGE__SCT_OBJECT : 0;
        for (int i = 0; i < 4; i++) t |= cJSON_GetObjectItemCaseSensitive(s, arr_k[i]) ? FORGE__SCT_ARRAY : 0;
        for (int i = 0; i < 4; i++) t |= cJSON_GetObjectItemCaseSensitive(s, str_k[i]) ? FORGE__SCT_STRING : 0;
        for (int i = 0; i < 4; i++) t |= cJSON_GetObjectItemCaseSensitive(s, num_k[i]) ? FORGE__SCT_NUMBER | FORGE__SCT_INTEGER : 0;
        if (t) types = t;
    }
    if (cJSON_GetObjectItemCaseSensitive(s, "enum") || cJSON_GetObjectItemCaseSensitive(s, "const")) {
        forge__sc_enum(c, s, name, types);
        goto out;
    }
    if (types == FORGE__SCT_ALL && !s->child) {
        forge__sc_printf(&c->out, "%s ::= json-value\n", name);
        goto out;
    }
    forge__buf line;
    forge__buf_init(&line, NULL, 0);
    forge__sc_printf(&line, "%s ::=", name);
    bool first = true;
    for (unsigned bit = 1; bit <= FORGE__SCT_INTEGER && !c->st; bit <<= 1) {
        if (!(types & bit)) continue;
        if (bit == FORGE__SCT_INTEGER && (types & FORGE__SCT_NUMBER)) continue; /* within number */
        char sub[64];
        const char *hint = bit == FORGE__SCT_OBJECT ? "obj" : bit == FORGE__SCT_ARRAY ? "arr" : bit == FORGE__SCT_STRING ? "str" : "num";
        if (bit == FORGE__SCT_NULL) snprintf(sub, sizeof sub, "\"null\"");
        else if (bit == FORGE__SCT_BOOL) snprintf(sub, sizeof sub, "(\"true\" | \"false\")");
        else {
            forge__sc_name(c, hint, sub);
            if (bit == FORGE__SCT_OBJECT) forge__sc_object(c, s, sub);
            else if (bit == FORGE__SCT_ARRAY) forge__sc_array(c, s, sub);
            else if (bit == FORGE__SCT_STRING) forge__sc_string(c, s, sub);
            else forge__sc_number(c, s, sub, bit == FORGE__SCT_INTEGER);
        }
        forge__sc_printf(&line, "%s %s", first ? "" : " |", sub);
        first = false;
    }
    forge__buf_put(&line, "\n", 1);
    if (!c->st) forge__buf_put(&c->out, line.p, line.n);
    forge__buf_free(&line);
out:
    c->depth--;
}

/* JSON Schema text -> GBNF rules appended to *out: rule `root` matches the schema, every other
 * rule made here starts with `prefix`; with `prelude` the shared rules (ws, json-*, fmt-*) first
 * (a grammar of several schemas writes them once); values in JSON (FORGE__SC_JSON) or in Gemma 4's
 * notation (FORGE__SC_GEMMA4). */
#define FORGE__SC_JSON 0
#define FORGE__SC_GEMMA4 1
static forge_status forge__schema_rules(const char *schema, size_t len, const char *root, const char *prefix, bool prelude, int notation,
                                        forge__buf *out, forge__err *err) {
    if (!forge__utf8_valid(schema, len)) /* its strings become grammar literals, which must be UTF-8 */
        return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "JSON Schema: not valid UTF-8");
    const char *endp = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(schema, len, &endp, 0);
    if (!doc) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "JSON Schema: not JSON (at byte %zu)", endp && endp >= schema ? (size_t)(endp - schema) : (size_t)0);
    forge__sc c;
    memset(&c, 0, sizeof c);
    c.doc = doc;
    c.err = err;
    c.prefix = prefix;
    c.refs = cJSON_CreateObject();
    c.owned = cJSON_CreateArray();
    forge__buf_init(&c.out, NULL, 0);
    forge__buf_init(&c.names, NULL, 0);
    if (!c.refs || !c.owned) forge__sc_fail(&c, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    c.g4 = notation == FORGE__SC_GEMMA4;
    if (prelude) forge__sc_prelude_put(c.g4, &c.out);
    if (cJSON_IsTrue(doc) || (cJSON_IsObject(doc) && !doc->child)) forge__sc_printf(&c.out, "%s ::= json-value\n", root);
    else forge__sc_visit(&c, doc, root);
    if (!c.st && (c.out.oom || c.names.oom)) forge__sc_fail(&c, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    cJSON_Delete(doc);
    cJSON_Delete(c.refs);
    cJSON_Delete(c.owned);
    forge__buf_free(&c.names);
    free(c.name_tab);
    if (!c.st) forge__buf_put(out, c.out.p, c.out.n);
    forge__buf_free(&c.out);
    if (!c.st && out->oom) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    return c.st;
}

/* JSON Schema text -> GBNF text (rule root) in *out (the caller frees with forge__buf_free). */
static forge_status forge__schema_to_gbnf(const char *schema, size_t len, forge__buf *out, forge__err *err) {
    forge__buf_init(out, NULL, 0);
    forge_status st = forge__schema_rules(schema, len, "root", NULL, true, FORGE__SC_JSON, out, err);
    if (st) forge__buf_free(out);
    return st;
}

/* GBNF: rule root ::= any JSON object. */
static forge_status forge__gbnf_json_object(forge__buf *out) {
    forge__buf_init(out, NULL, 0);
    forge__sc_puts(out, forge__sc_prelude);
    forge__sc_puts(out, "root ::= json-object\n");
    return out->oom ? FORGE_ERR_OUT_OF_MEMORY : FORGE_OK;
}

/* GBNF: rule root ::= exactly one of the n strings. */
static forge_status forge__gbnf_choices(const char *const *choices, int n, forge__buf *out, forge__err *err) {
    forge__buf_init(out, NULL, 0);
    if (n <= 0 || !choices) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "choices: none given");
    forge__sc c;
    memset(&c, 0, sizeof c);
    c.err = err;
    forge__sc_str *v = (forge__sc_str *)malloc(sizeof *v * (size_t)n);
    if (!v) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int i = 0; i < n; i++) {
        if (!choices[i]) { free(v); return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "choices: choice %d is NULL", i); }
        size_t l = strlen(choices[i]);
        if (!forge__utf8_valid(choices[i], l)) { free(v); return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "choices: choice %d is not UTF-8", i); }
        v[i] = (forge__sc_str){choices[i], l};
    }
    forge__sc_literals(&c, "root", v, (size_t)n);
    free(v);
    forge__buf_free(&c.names);
    free(c.name_tab);
    if (c.st || c.out.oom) {
        forge__buf_free(&c.out);
        return c.st ? c.st : forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    *out = c.out;
    return FORGE_OK;
}

FORGE_API forge_status forge_json_schema_to_gbnf(const char *schema, size_t schema_len, char *out, size_t capacity, size_t *len,
                                                 char *errmsg, size_t errmsg_size) {
    if (errmsg && errmsg_size) errmsg[0] = 0;
    if (!schema || !len) return FORGE_ERR_INVALID_ARGUMENT;
    forge__err err;
    err.msg[0] = 0;
    forge__buf g;
    forge_status st = forge__schema_to_gbnf(schema, schema_len ? schema_len : strlen(schema), &g, &err);
    if (st) {
        if (errmsg && errmsg_size) snprintf(errmsg, errmsg_size, "%s", err.msg);
        return st;
    }
    *len = g.n;
    if (!out || capacity < g.n + 1) st = FORGE_ERR_BUFFER_TOO_SMALL;
    else {
        if (g.n) memcpy(out, g.p, g.n);
        out[g.n] = 0;
    }
    forge__buf_free(&g);
    return st;
}
