/* src/grammar.c: Grammars.
 * Owns: GBNF parsing (llama.cpp's format) into rules over byte sets, the byte automaton (the
 * grammar's pushdown automaton, determinized lazily), the model's tokens as bytes and their
 * trie, the matcher (which tokens a constraint allows: one token, a whole mask, forced text,
 * triggers), compiling a forge_constraint, forge_grammar_*.
 * May call: base.c, tokenizer.c, model.c, api.c, schema.c.
 *
 * A grammar is a set of rules, each a list of alternatives, each a sequence of elements: a set
 * of bytes, or a reference to a rule. Text is bytes: a character class or literal becomes the
 * UTF-8 byte sequences of its code points (an alternative per run of byte ranges), so the
 * automaton steps over bytes and a token that ends inside a character is followed exactly.
 * Repetitions expand into helper rules as llama.cpp's do (x* : R ::= x R | ; x{m,n} : m copies
 * and a chain of optional ones).
 *
 * The automaton's configuration is a set of stacks; a stack is a list of element positions
 * (the top awaits a byte, the rest are where to return), interned as nodes (position, parent)
 * so that stacks share their tails and compare by id. A rule reference that ends its
 * alternative does not push its return (a tail call), so right recursion (every x*) runs in
 * constant depth. A state is a sorted set of stack ids plus whether the grammar may end
 * there; states are interned too and their transitions on each byte filled in as they are
 * first taken: a lazily built DFA, whose states then repeat (the inside of a JSON string is
 * one state however long the string). Left recursion is refused when the grammar is compiled;
 * stack depth, the stacks of a state and the states are bounded (hostile grammars get
 * FORGE_ERR_LIMIT, never a hang).
 *
 * Tokens are matched through a trie of their bytes (built once per model, on first use,
 * without special tokens): a full mask walks it depth first from a state, a subtree cut off
 * where its first byte is refused, and is kept per state. A special token the grammar names
 * (<[ID]> or <TEXT>, llama.cpp's syntax) is an escape in the automaton's bytes: 0xFF, which no
 * UTF-8 text holds and no ordinary token may step over, then the id in three bytes; the special
 * tokens are tried one by one only where the state takes 0xFF. The sampler asks first about its
 * candidates, one token at a time (a few transitions each), and only when none of them is
 * allowed for the whole mask (generate.c).
 */

#define FORGE__G_MAX_TEXT (16u << 20)        /* grammar text bytes */
#define FORGE__G_MAX_ELEMS (8u << 20)        /* elements after repetitions are expanded */
#define FORGE__G_MAX_NEST 200                /* nested parentheses */
#define FORGE__G_MAX_DEPTH 4096              /* a stack's depth (nested rules at once) */
#define FORGE__G_MAX_STACKS 200000           /* stacks in one state */
#define FORGE__G_SOFT_STATES 40000           /* states kept between tokens (more: the cache starts again) */
#define FORGE__G_HARD_STATES 150000          /* states made during one token's work */
#define FORGE__G_HARD_STEPS 4000000ull       /* closure steps for one token: states alone do not bound the time,
                                              * as a state of many stacks costs as much to make (the schema
                                              * corpus's walks take at most 160,269) */
#define FORGE__G_SOFT_NODES (3u << 20)       /* stack nodes kept between tokens */
#define FORGE__G_MASK_BYTES (48u << 20)      /* masks kept per matcher */
#define FORGE__G_MAX_FORCED 256              /* forced bytes looked at a time */
#define FORGE__G_TOKEN_BYTE 0xFFu            /* opens a special token's escape (forge__gb_token) */

/* Elements: kind in the top two bits, argument below. Rules are stored as their alternatives,
 * each a run of elements closed by END. */
#define FORGE__GE_END 0u
#define FORGE__GE_ALT 1u  /* (while building: between alternatives) */
#define FORGE__GE_SET 2u  /* a byte set: the argument indexes the grammar's sets */
#define FORGE__GE_RULE 3u /* a rule reference */
#define FORGE__GE(k, a) ((uint32_t)(k) << 30 | (uint32_t)(a))
#define FORGE__GE_KIND(e) ((e) >> 30)
#define FORGE__GE_ARG(e) ((e)&0x3fffffffu)

static bool forge__bset_has(const uint64_t s[4], unsigned b) { return (s[b >> 6] >> (b & 63)) & 1; }
static void forge__bset_add(uint64_t s[4], unsigned lo, unsigned hi) {
    for (unsigned b = lo; b <= hi; b++) s[b >> 6] |= 1ull << (b & 63);
}

/* A 64-bit mixer (hash tables, byte signatures). */
static uint64_t forge__mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* ---- Building a grammar (the GBNF parser's output, and schema.c's through GBNF text) ---- */

typedef struct forge__grule_b {
    char *name;
    forge__buf body;  /* uint32_t elements, FORGE__GE_ALT between alternatives */
    bool defined;
    size_t used_at;     /* where it was first referenced, + 1 (for "never defined") */
} forge__grule_b;

typedef struct forge__gbuild {
    forge__buf rules;   /* forge__grule_b */
    forge__buf sets;    /* uint64_t[4] each */
    uint32_t *name_tab; /* open addressing: rule id + 1, 0 empty */
    uint32_t name_mask;
    uint32_t *set_tab;  /* set id + 1, 0 empty */
    uint32_t set_mask;
    uint64_t n_elems;   /* elements in all bodies (the budget) */
    uint32_t any_rule;  /* '.', made once; UINT32_MAX until then */
    const forge__tokenizer *tk; /* the model's, for tokens named by their text (<...>); NULL: none */
    const char *text, *end;
    forge__err *err;
    forge_status st;
} forge__gbuild;

#define FORGE__GB_RULE(b, i) (&FORGE__VEC_AT(&(b)->rules, forge__grule_b, i))
#define FORGE__GB_NRULES(b) ((uint32_t)FORGE__VEC_LEN(&(b)->rules, forge__grule_b))

/* Line and column of p in the grammar text, for messages. */
static void forge__gb_where(const forge__gbuild *b, const char *p, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (const char *q = b->text; q < p && q < b->end; q++) {
        if (*q == '\n') { (*line)++; *col = 1; }
        else (*col)++;
    }
}

static bool forge__gb_fail(forge__gbuild *b, forge_status st, const char *p, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static bool forge__gb_fail(forge__gbuild *b, forge_status st, const char *p, const char *fmt, ...) {
    char where[64] = "grammar: ";
    if (p && !b->st) {
        int line, col;
        forge__gb_where(b, p, &line, &col);
        snprintf(where, sizeof where, "grammar, line %d column %d: ", line, col);
    }
    va_list ap;
    va_start(ap, fmt);
    forge__fail_first(&b->st, b->err, st, where, fmt, ap);
    va_end(ap);
    return false;
}

static bool forge__gb_oom(forge__gbuild *b) { return forge__gb_fail(b, FORGE_ERR_OUT_OF_MEMORY, NULL, "out of host memory"); }

static uint64_t forge__gb_hash(const void *p, size_t n) { return forge__fnv(FORGE__FNV_BASIS, p, n); }

/* Doubles an open-addressing table of ids (+1, 0 empty) whose keys `key(i)` hash as h(i). */
static bool forge__gb_tab_grow(uint32_t **tab, uint32_t *mask, uint32_t count, uint64_t (*h)(forge__gbuild *, uint32_t), forge__gbuild *b) {
    if (*tab && (uint64_t)count * 2 < (uint64_t)*mask + 1) return true;
    uint32_t cap = *tab ? (*mask + 1) * 2 : 64;
    uint32_t *t = (uint32_t *)calloc(cap, sizeof *t);
    if (!t) return false;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t k = (uint32_t)h(b, i) & (cap - 1);
        while (t[k]) k = (k + 1) & (cap - 1);
        t[k] = i + 1;
    }
    free(*tab);
    *tab = t;
    *mask = cap - 1;
    return true;
}
static uint64_t forge__gb_name_hash(forge__gbuild *b, uint32_t i) {
    const char *n = FORGE__GB_RULE(b, i)->name;
    return forge__gb_hash(n, strlen(n));
}
static uint64_t forge__gb_set_hash(forge__gbuild *b, uint32_t i) { return forge__gb_hash(&FORGE__VEC_AT(&b->sets, uint64_t, 4 * (size_t)i), 32); }

/* The id of rule `name` (n bytes), made (undefined) when new; UINT32_MAX on failure. */
static uint32_t forge__gb_rule(forge__gbuild *b, const char *name, size_t n) {
    uint32_t count = FORGE__GB_NRULES(b);
    if (b->name_tab) {
        uint64_t h = forge__gb_hash(name, n);
        for (uint32_t k = (uint32_t)h & b->name_mask; b->name_tab[k]; k = (k + 1) & b->name_mask) {
            const char *o = FORGE__GB_RULE(b, b->name_tab[k] - 1)->name;
            if (strlen(o) == n && !memcmp(o, name, n)) return b->name_tab[k] - 1;
        }
    }
    if (count >= FORGE__G_MAX_ELEMS) return forge__gb_fail(b, FORGE_ERR_LIMIT, NULL, "more than %u rules", FORGE__G_MAX_ELEMS), UINT32_MAX;
    forge__grule_b r;
    memset(&r, 0, sizeof r);
    r.name = (char *)malloc(n + 1);
    if (!r.name) return forge__gb_oom(b), UINT32_MAX;
    memcpy(r.name, name, n);
    r.name[n] = 0;
    forge__buf_put(&b->rules, &r, sizeof r);
    if (b->rules.oom || !forge__gb_tab_grow(&b->name_tab, &b->name_mask, count + 1, forge__gb_name_hash, b)) {
        if (b->rules.oom) free(r.name);
        return forge__gb_oom(b), UINT32_MAX;
    }
    uint32_t k = (uint32_t)forge__gb_hash(name, n) & b->name_mask;
    while (b->name_tab[k]) {
        if (b->name_tab[k] == count + 1) return count; /* (the table was rebuilt with it) */
        k = (k + 1) & b->name_mask;
    }
    b->name_tab[k] = count + 1;
    return count;
}

/* A new rule named after `parent` ("parent_3"), defined. */
static uint32_t forge__gb_anon(forge__gbuild *b, uint32_t parent) {
    char name[160];
    const char *pn = parent < FORGE__GB_NRULES(b) ? FORGE__GB_RULE(b, parent)->name : "rule";
    for (uint32_t i = FORGE__GB_NRULES(b);; i++) {
        int n = snprintf(name, sizeof name, "%.100s_%u", pn, i);
        uint32_t before = FORGE__GB_NRULES(b);
        uint32_t id = forge__gb_rule(b, name, (size_t)n);
        if (id == UINT32_MAX) return id;
        if (id == before) { /* new */
            FORGE__GB_RULE(b, id)->defined = true;
            return id;
        }
    }
}

/* The id of a byte set (interned). */
static uint32_t forge__gb_set(forge__gbuild *b, const uint64_t s[4]) {
    uint32_t count = (uint32_t)(b->sets.n / 32);
    uint64_t h = forge__gb_hash(s, 32);
    if (b->set_tab)
        for (uint32_t k = (uint32_t)h & b->set_mask; b->set_tab[k]; k = (k + 1) & b->set_mask)
            if (!memcmp(&FORGE__VEC_AT(&b->sets, uint64_t, 4 * (size_t)(b->set_tab[k] - 1)), s, 32)) return b->set_tab[k] - 1;
    forge__buf_put(&b->sets, s, 32);
    if (b->sets.oom || !forge__gb_tab_grow(&b->set_tab, &b->set_mask, count + 1, forge__gb_set_hash, b)) return forge__gb_oom(b), UINT32_MAX;
    uint32_t k = (uint32_t)h & b->set_mask;
    while (b->set_tab[k]) {
        if (b->set_tab[k] == count + 1) return count;
        k = (k + 1) & b->set_mask;
    }
    b->set_tab[k] = count + 1;
    return count;
}

static bool forge__gb_emit(forge__gbuild *b, uint32_t rule, uint32_t e) {
    if (b->st) return false;
    if (++b->n_elems > FORGE__G_MAX_ELEMS)
        return forge__gb_fail(b, FORGE_ERR_LIMIT, NULL, "more than %u elements (repetitions expanded): the grammar is too large", FORGE__G_MAX_ELEMS);
    forge__buf *body = &FORGE__GB_RULE(b, rule)->body;
    forge__buf_put(body, &e, sizeof e);
    return body->oom ? forge__gb_oom(b) : true;
}
static bool forge__gb_emit_byte(forge__gbuild *b, uint32_t rule, unsigned lo, unsigned hi) {
    uint64_t s[4] = {0, 0, 0, 0};
    forge__bset_add(s, lo, hi);
    uint32_t id = forge__gb_set(b, s);
    return id != UINT32_MAX && forge__gb_emit(b, rule, FORGE__GE(FORGE__GE_SET, id));
}

static void forge__gb_free(forge__gbuild *b) {
    for (uint32_t i = 0; i < FORGE__GB_NRULES(b); i++) {
        free(FORGE__GB_RULE(b, i)->name);
        forge__buf_free(&FORGE__GB_RULE(b, i)->body);
    }
    forge__buf_free(&b->rules);
    forge__buf_free(&b->sets);
    free(b->name_tab);
    free(b->set_tab);
}

/* ---- Code points as UTF-8 byte sequences ---- */

static int forge__utf8_enc(uint32_t cp, uint8_t out[4]) {
    if (cp < 0x80) { out[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { out[0] = (uint8_t)(0xC0 | cp >> 6); out[1] = (uint8_t)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18);
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Appends to `alts` (uint8_t quadruples: n, then n (lo, hi) byte pairs, padded to 9 bytes) the
 * byte-range sequences whose UTF-8 strings are exactly the code points [lo, hi] (surrogates
 * already removed): split where the encoded length changes, then where the trailing bytes
 * stop covering whole ranges, until each piece is a product of byte ranges. */
static void forge__utf8_ranges(uint32_t lo, uint32_t hi, forge__buf *alts) {
    static const uint32_t bounds[3] = {0x7F, 0x7FF, 0xFFFF};
    if (lo > hi) return;
    for (int i = 0; i < 3; i++)
        if (lo <= bounds[i] && hi > bounds[i]) {
            forge__utf8_ranges(lo, bounds[i], alts);
            forge__utf8_ranges(bounds[i] + 1, hi, alts);
            return;
        }
    uint8_t a[4], z[4];
    int n = forge__utf8_enc(lo, a);
    forge__utf8_enc(hi, z);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                forge__utf8_ranges(lo, lo | m, alts);
                forge__utf8_ranges((lo | m) + 1, hi, alts);
                return;
            }
            if ((hi & m) != m) {
                forge__utf8_ranges(lo, (hi & ~m) - 1, alts);
                forge__utf8_ranges(hi & ~m, hi, alts);
                return;
            }
        }
    }
    uint8_t rec[9] = {(uint8_t)n};
    for (int i = 0; i < n; i++) { rec[1 + 2 * i] = a[i]; rec[2 + 2 * i] = z[i]; }
    forge__buf_put(alts, rec, sizeof rec);
}

/* Emits into `rule` one element matching any one code point of the ranges (sorted, merged,
 * surrogates allowed: they are removed here), negated when `neg`: a byte set when every code
 * point is ASCII, else a reference to a new rule of the byte sequences. */
static bool forge__gb_emit_class(forge__gbuild *b, uint32_t rule, const forge__cprange *in, size_t n, bool neg) {
    forge__cprange *r = (forge__cprange *)malloc(sizeof *r * (n + 3));
    if (!r) return forge__gb_oom(b);
    size_t k = 0;
    if (neg) { /* the complement within [0, 0x10FFFF] */
        uint32_t next = 0;
        for (size_t i = 0; i < n; i++) {
            if (in[i].lo > next) r[k++] = (forge__cprange){next, in[i].lo - 1};
            next = in[i].hi + 1;
        }
        if (next <= 0x10FFFF) r[k++] = (forge__cprange){next, 0x10FFFF};
    } else {
        if (n) memcpy(r, in, sizeof *r * n); /* (an empty class: in may be NULL) */
        k = n;
    }
    /* without the surrogates: no UTF-8 string encodes them */
    size_t m = 0;
    forge__cprange *o = (forge__cprange *)malloc(sizeof *o * (2 * k + 1));
    if (!o) { free(r); return forge__gb_oom(b); }
    for (size_t i = 0; i < k; i++) {
        uint32_t lo = r[i].lo, hi = FORGE__MIN(r[i].hi, 0x10FFFFu);
        if (lo > hi) continue;
        if (lo < 0xD800 && hi >= 0xD800) { o[m++] = (forge__cprange){lo, 0xD7FF}; lo = 0xE000; }
        else if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
        if (lo <= hi) o[m++] = (forge__cprange){lo, hi};
    }
    free(r);
    uint64_t ascii[4] = {0, 0, 0, 0};
    bool only_ascii = true, any_ascii = false;
    for (size_t i = 0; i < m; i++) {
        if (o[i].lo <= 0x7F) { forge__bset_add(ascii, o[i].lo, FORGE__MIN(o[i].hi, 0x7Fu)); any_ascii = true; }
        if (o[i].hi > 0x7F) only_ascii = false;
    }
    bool ok;
    if (only_ascii && any_ascii) {
        uint32_t id = forge__gb_set(b, ascii);
        ok = id != UINT32_MAX && forge__gb_emit(b, rule, FORGE__GE(FORGE__GE_SET, id));
    } else if (m == 0) { /* matches nothing: a rule with no alternative that can start */
        uint32_t r0 = forge__gb_anon(b, rule);
        uint64_t none[4] = {0, 0, 0, 0};
        uint32_t id = r0 == UINT32_MAX ? UINT32_MAX : forge__gb_set(b, none);
        ok = id != UINT32_MAX && forge__gb_emit(b, r0, FORGE__GE(FORGE__GE_SET, id)) && forge__gb_emit(b, rule, FORGE__GE(FORGE__GE_RULE, r0));
    } else {
        uint32_t r0 = forge__gb_anon(b, rule);
        ok = r0 != UINT32_MAX;
        bool first = true;
        if (ok && any_ascii) {
            uint32_t id = forge__gb_set(b, ascii);
            ok = id != UINT32_MAX && forge__gb_emit(b, r0, FORGE__GE(FORGE__GE_SET, id));
            first = false;
        }
        forge__buf seqs;
        forge__buf_init(&seqs, NULL, 0);
        for (size_t i = 0; ok && i < m; i++)
            if (o[i].hi > 0x7F) forge__utf8_ranges(FORGE__MAX(o[i].lo, 0x80u), o[i].hi, &seqs);
        if (seqs.oom) ok = forge__gb_oom(b);
        for (size_t q = 0; ok && q + 9 <= seqs.n; q += 9) {
            const uint8_t *rec = (const uint8_t *)seqs.p + q;
            if (!first) ok = forge__gb_emit(b, r0, FORGE__GE(FORGE__GE_ALT, 0));
            first = false;
            for (int i = 0; ok && i < rec[0]; i++) ok = forge__gb_emit_byte(b, r0, rec[1 + 2 * i], rec[2 + 2 * i]);
        }
        forge__buf_free(&seqs);
        ok = ok && forge__gb_emit(b, rule, FORGE__GE(FORGE__GE_RULE, r0));
    }
    free(o);
    return ok;
}

/* ---- The GBNF parser ----
 * root ::= alternatives; rules end at a newline outside parentheses; # comments; "literal",
 * [class], [^class], ., (group), rule names, and the postfix * + ? {m} {m,} {m,n}. Escapes in
 * literals and classes: \n \r \t \\ \" \[ \] \- \^ \/ \xHH \uHHHH \UHHHHHHHH. */

static bool forge__gb_word_char(char c) { return isalnum((unsigned char)c) || c == '-' || c == '_'; }

static const char *forge__gb_space(forge__gbuild *b, const char *p, bool newline_ok) {
    while (p < b->end) {
        if (*p == ' ' || *p == '\t') p++;
        else if (*p == '#') { while (p < b->end && *p != '\n' && *p != '\r') p++; }
        else if (newline_ok && (*p == '\n' || *p == '\r')) p++;
        else break;
    }
    return p;
}

/* One code point of a literal or class at p (escapes decoded) into *cp; NULL on error. */
static const char *forge__gb_char(forge__gbuild *b, const char *p, uint32_t *cp) {
    if (p >= b->end) return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, p, "unexpected end of the grammar"), NULL;
    if (*p == '\\') {
        if (p + 1 >= b->end) return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, p, "unexpected end after '\\'"), NULL;
        char c = p[1];
        int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
        if (digits) {
            uint32_t v = 0;
            for (int i = 0; i < digits; i++) {
                int h = p + 2 + i < b->end ? forge__hexval(p[2 + i]) : -1;
                if (h < 0) return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, p, "\\%c needs %d hex digits", c, digits), NULL;
                v = v * 16 + (uint32_t)h;
            }
            if (v > 0x10FFFF) return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, p, "code point U+%X is past U+10FFFF", v), NULL;
            *cp = v;
            return p + 2 + digits;
        }
        switch (c) {
        case 'n': *cp = '\n'; break;
        case 'r': *cp = '\r'; break;
        case 't': *cp = '\t'; break;
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': *cp = (uint32_t)c; break;
        default: return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, p, "unknown escape '\\%c'", c), NULL;
        }
        return p + 2;
    }
    int n = forge__utf8_dec((const unsigned char *)p, (size_t)(b->end - p), cp);
    if (!n) return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, p, "invalid UTF-8"), NULL;
    return p + n;
}

/* recursion: a parenthesized group in a sequence holds alternates again */
static const char *forge__gb_alternates(forge__gbuild *b, const char *p, uint32_t rule, int nest);

/* A decimal count of a {m,n} repetition. */
static const char *forge__gb_int(forge__gbuild *b, const char *p, uint64_t *v) {
    if (p >= b->end || !isdigit((unsigned char)*p)) return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, p, "expected a number"), NULL;
    *v = 0;
    while (p < b->end && isdigit((unsigned char)*p)) {
        *v = *v * 10 + (uint64_t)(*p++ - '0');
        if (*v > FORGE__G_MAX_ELEMS) return forge__gb_fail(b, FORGE_ERR_LIMIT, p, "repetition count over %u", FORGE__G_MAX_ELEMS), NULL;
    }
    return p;
}

/* Replaces the last symbol of `rule`'s body (elements [from, end)) by its repetition {lo, hi}
 * (hi UINT64_MAX: unbounded). */
static bool forge__gb_repeat(forge__gbuild *b, const char *at, uint32_t rule, size_t from, uint64_t lo, uint64_t hi) {
    forge__buf *body = &FORGE__GB_RULE(b, rule)->body;
    size_t n = body->n / 4 - from;
    if (n == 0) return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, at, "a repetition with nothing before it");
    uint64_t copies = lo + (hi == UINT64_MAX ? 1 : hi - lo);
    if (copies * n + b->n_elems > FORGE__G_MAX_ELEMS)
        return forge__gb_fail(b, FORGE_ERR_LIMIT, at, "a repetition of %llu that expands past %u elements", (unsigned long long)copies, FORGE__G_MAX_ELEMS);
    uint32_t *sym = (uint32_t *)malloc(4 * n);
    if (!sym) return forge__gb_oom(b);
    memcpy(sym, body->p + 4 * from, 4 * n);
    body->n = 4 * from;
    b->n_elems -= n;
    bool ok = true;
    for (uint64_t i = 0; ok && i < lo; i++)
        for (size_t j = 0; ok && j < n; j++) ok = forge__gb_emit(b, rule, sym[j]);
    if (ok && hi == UINT64_MAX) { /* R ::= sym R | */
        uint32_t r = forge__gb_anon(b, rule);
        ok = r != UINT32_MAX;
        for (size_t j = 0; ok && j < n; j++) ok = forge__gb_emit(b, r, sym[j]);
        ok = ok && forge__gb_emit(b, r, FORGE__GE(FORGE__GE_RULE, r)) && forge__gb_emit(b, r, FORGE__GE(FORGE__GE_ALT, 0)) &&
             forge__gb_emit(b, rule, FORGE__GE(FORGE__GE_RULE, r));
    } else if (ok && hi > lo) { /* R1 ::= sym R2 | ; ... ; Rk ::= sym | */
        uint32_t next = UINT32_MAX;
        for (uint64_t i = hi - lo; ok && i > 0; i--) {
            uint32_t r = forge__gb_anon(b, rule);
            ok = r != UINT32_MAX;
            for (size_t j = 0; ok && j < n; j++) ok = forge__gb_emit(b, r, sym[j]);
            if (ok && next != UINT32_MAX) ok = forge__gb_emit(b, r, FORGE__GE(FORGE__GE_RULE, next));
            ok = ok && forge__gb_emit(b, r, FORGE__GE(FORGE__GE_ALT, 0));
            next = r;
        }
        ok = ok && forge__gb_emit(b, rule, FORGE__GE(FORGE__GE_RULE, next));
    }
    free(sym);
    return ok;
}

/* A token element, llama.cpp's syntax: <[ID]> by id, or <TEXT> by its text (the whole
 * bracketed text is one token of the model's vocabulary, such as <|"|> or <tool_call|>). A
 * special token steps the automaton over its escape: byte 0xFF, then its id in three bytes;
 * 0xFF is in no UTF-8 text, and the matcher refuses it inside an ordinary token, so only that
 * token takes the path. An ordinary token is its text (any tokens that spell it match). */
static const char *forge__gb_token(forge__gbuild *b, const char *p, uint32_t rule) {
    const char *open = p;
    if (*p == '!') return forge__gb_fail(b, FORGE_ERR_UNSUPPORTED, p, "a negated token (!<...>) is not supported"), NULL;
    const char *close = p + 1;
    while (close < b->end && *close != '>' && *close != '\n') close++;
    if (close >= b->end || *close != '>' || close == p + 1)
        return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, p, "a token (<[ID]> or <TEXT>) is not closed with '>' on its line"), NULL;
    const forge__tokenizer *tk = b->tk;
    int64_t id = -1;
    if (p[1] == '[') {
        id = 0;
        const char *q = p + 2;
        for (; q < close && isdigit((unsigned char)*q); q++) id = id < (1 << 24) ? id * 10 + (*q - '0') : id;
        if (q == p + 2 || q + 1 != close || *q != ']')
            return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, p, "a token id is written <[DIGITS]>"), NULL;
        if (id >= (1 << 24) || (tk && id >= tk->n_vocab))
            return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, p, "token id %.*s is outside the vocabulary (0 to %d)", (int)FORGE__MIN(close - p - 3, 12), p + 2,
                                  tk ? tk->n_vocab - 1 : (1 << 24) - 1), NULL;
    } else {
        if (!tk)
            return forge__gb_fail(b, FORGE_ERR_UNSUPPORTED, p, "token %.*s: a token named by its text needs a model's vocabulary", (int)FORGE__MIN(close + 1 - p, 80), p), NULL;
        id = forge__tk_lookup(tk, p, (size_t)(close + 1 - p));
        if (id < 0)
            return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, p, "token %.*s is not one token of the model's vocabulary", (int)FORGE__MIN(close + 1 - p, 80), p), NULL;
    }
    if (tk && (!tk->pieces[id] || !tk->is_special[id])) { /* ordinary text (or a hole: nothing matches it) */
        forge__buf tb;
        forge__buf_init(&tb, NULL, 0);
        bool ok = tk->pieces[id] && forge__tk_token_bytes(tk, (int32_t)id, &tb) && tb.n > 0;
        if (!ok && !tb.oom) {
            forge__buf_free(&tb);
            return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, open, "token %lld has no text to match", (long long)id), NULL;
        }
        for (size_t i = 0; ok && i < tb.n; i++) ok = forge__gb_emit_byte(b, rule, (uint8_t)tb.p[i], (uint8_t)tb.p[i]);
        ok = ok && !tb.oom;
        forge__buf_free(&tb);
        if (!ok) return b->st ? NULL : (forge__gb_oom(b), NULL);
        return close + 1;
    }
    const unsigned esc[4] = {FORGE__G_TOKEN_BYTE, (unsigned)(id >> 16) & 255, (unsigned)(id >> 8) & 255, (unsigned)id & 255};
    for (int i = 0; i < 4; i++)
        if (!forge__gb_emit_byte(b, rule, esc[i], esc[i])) return NULL;
    return close + 1;
}

static const char *forge__gb_sequence(forge__gbuild *b, const char *p, uint32_t rule, int nest) {
    size_t last = SIZE_MAX; /* where the last symbol's elements start */
    forge__buf *body = &FORGE__GB_RULE(b, rule)->body;
    while (p && p < b->end && !b->st) {
        char c = *p;
        size_t here = body->n / 4;
        if (c == '"') {
            p++;
            while (p && p < b->end && *p != '"') {
                uint32_t cp;
                if (*p == '\n' || *p == '\r') return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, p, "a literal is not closed on its line"), NULL;
                if (!(p = forge__gb_char(b, p, &cp))) return NULL;
                uint8_t u[4];
                int k = forge__utf8_enc(cp, u);
                for (int i = 0; i < k; i++)
                    if (!forge__gb_emit_byte(b, rule, u[i], u[i])) return NULL;
            }
            if (!p || p >= b->end) return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, p, "unterminated literal"), NULL;
            p++;
            last = here;
        } else if (c == '[') {
            const char *open = p++;
            bool neg = p < b->end && *p == '^';
            if (neg) p++;
            forge__buf rs;
            forge__buf_init(&rs, NULL, 0);
            while (p && p < b->end && *p != ']') {
                forge__cprange r;
                if (!(p = forge__gb_char(b, p, &r.lo))) break;
                r.hi = r.lo;
                if (p + 1 < b->end && *p == '-' && p[1] != ']') {
                    if (!(p = forge__gb_char(b, p + 1, &r.hi))) break;
                    if (r.hi < r.lo) { forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, p, "a class range from U+%X down to U+%X", r.lo, r.hi); p = NULL; break; }
                }
                forge__buf_put(&rs, &r, sizeof r);
            }
            if (p && p >= b->end) forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, open, "unterminated character class");
            if (rs.oom) forge__gb_oom(b);
            if (b->st) { forge__buf_free(&rs); return NULL; }
            size_t n = forge__cp_normalize((forge__cprange *)rs.p, rs.n / sizeof(forge__cprange));
            bool ok = forge__gb_emit_class(b, rule, (forge__cprange *)rs.p, n, neg);
            forge__buf_free(&rs);
            if (!ok) return NULL;
            p++;
            last = here;
        } else if (c == '.') {
            if (b->any_rule == UINT32_MAX) {
                forge__cprange all = {0, 0x10FFFF};
                uint32_t holder = forge__gb_anon(b, rule);
                if (holder == UINT32_MAX || !forge__gb_emit_class(b, holder, &all, 1, false)) return NULL;
                b->any_rule = holder;
            }
            if (!forge__gb_emit(b, rule, FORGE__GE(FORGE__GE_RULE, b->any_rule))) return NULL;
            p++;
            last = here;
        } else if (c == '(') {
            if (nest >= FORGE__G_MAX_NEST) return forge__gb_fail(b, FORGE_ERR_LIMIT, p, "parentheses nested deeper than %d", FORGE__G_MAX_NEST), NULL;
            uint32_t sub = forge__gb_anon(b, rule);
            if (sub == UINT32_MAX) return NULL;
            p = forge__gb_alternates(b, forge__gb_space(b, p + 1, true), sub, nest + 1);
            if (!p) return NULL;
            if (p >= b->end || *p != ')') return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, p, "expected ')'"), NULL;
            p++;
            body = &FORGE__GB_RULE(b, rule)->body; /* (the rule table may have moved) */
            if (!forge__gb_emit(b, rule, FORGE__GE(FORGE__GE_RULE, sub))) return NULL;
            last = here;
        } else if (forge__gb_word_char(c)) {
            const char *s = p;
            while (p < b->end && forge__gb_word_char(*p)) p++;
            uint32_t ref = forge__gb_rule(b, s, (size_t)(p - s));
            if (ref == UINT32_MAX) return NULL;
            if (!FORGE__GB_RULE(b, ref)->used_at) FORGE__GB_RULE(b, ref)->used_at = (size_t)(s - b->text) + 1;
            if (!forge__gb_emit(b, rule, FORGE__GE(FORGE__GE_RULE, ref))) return NULL;
            last = here;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last == SIZE_MAX) return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, p, "'%c' with nothing before it", c), NULL;
            const char *at = p;
            uint64_t lo = 0, hi = UINT64_MAX;
            if (c == '+') lo = 1;
            else if (c == '?') hi = 1;
            p++;
            if (c == '{') {
                p = forge__gb_space(b, p, nest > 0);
                if (!(p = forge__gb_int(b, p, &lo))) return NULL;
                p = forge__gb_space(b, p, nest > 0);
                hi = lo;
                if (p < b->end && *p == ',') {
                    p = forge__gb_space(b, p + 1, nest > 0);
                    hi = UINT64_MAX;
                    if (p < b->end && isdigit((unsigned char)*p)) {
                        if (!(p = forge__gb_int(b, p, &hi))) return NULL;
                        p = forge__gb_space(b, p, nest > 0);
                    }
                }
                if (p >= b->end || *p != '}') return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, p, "expected '}'"), NULL;
                if (hi < lo) return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, at, "a repetition {%llu,%llu}: the most is below the least", (unsigned long long)lo, (unsigned long long)hi), NULL;
                p++;
            }
            if (!forge__gb_repeat(b, at, rule, last, lo, hi)) return NULL;
            body = &FORGE__GB_RULE(b, rule)->body;
            last = SIZE_MAX; /* x** is an error, as in llama.cpp */
        } else if (c == '<' || (c == '!' && p + 1 < b->end && p[1] == '<')) {
            if (!(p = forge__gb_token(b, p, rule))) return NULL;
            last = here;
        } else {
            break;
        }
        body = &FORGE__GB_RULE(b, rule)->body;
        p = forge__gb_space(b, p, nest > 0);
    }
    return p;
}

static const char *forge__gb_alternates(forge__gbuild *b, const char *p, uint32_t rule, int nest) {
    p = forge__gb_sequence(b, p, rule, nest);
    while (p && p < b->end && *p == '|') {
        if (!forge__gb_emit(b, rule, FORGE__GE(FORGE__GE_ALT, 0))) return NULL;
        p = forge__gb_sequence(b, forge__gb_space(b, p + 1, true), rule, nest);
    }
    return p;
}

static bool forge__gb_parse(forge__gbuild *b) {
    const char *p = forge__gb_space(b, b->text, true);
    while (p && p < b->end && !b->st) {
        const char *s = p;
        while (p < b->end && forge__gb_word_char(*p)) p++;
        if (p == s) return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, s, "expected a rule name");
        const char *q = forge__gb_space(b, p, false);
        if (q + 2 >= b->end || q[0] != ':' || q[1] != ':' || q[2] != '=')
            return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, q, "expected '::=' after '%.*s'", (int)FORGE__MIN(p - s, 64), s);
        uint32_t r = forge__gb_rule(b, s, (size_t)(p - s));
        if (r == UINT32_MAX) return false;
        forge__grule_b *rb = FORGE__GB_RULE(b, r);
        if (rb->defined) return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, s, "rule '%s' is defined twice", rb->name);
        rb->defined = true;
        p = forge__gb_alternates(b, forge__gb_space(b, q + 3, true), r, 0);
        if (!p) return false;
        if (p < b->end && *p != '\n' && *p != '\r') /* a rule ends at a newline (outside parentheses) */
            return forge__gb_fail(b, FORGE_ERR_INVALID_ARGUMENT, p, "unexpected '%c' in rule '%s' (a rule ends at the end of its line)", *p,
                                  FORGE__GB_RULE(b, r)->name);
        p = forge__gb_space(b, p, true);
    }
    return !b->st;
}

/* ---- The compiled grammar ---- */

typedef struct forge__gram {
    uint32_t *elems;   /* [n_elems] each alternative's elements, then END */
    uint32_t *alt;     /* [n_alts] where each alternative starts */
    uint32_t *rule_alt; /* [n_rules + 1] rule r's alternatives: alt[rule_alt[r] .. rule_alt[r + 1]) */
    uint64_t *sets;    /* [n_sets * 4] */
    char *names;       /* the rules' names, NUL-separated */
    uint32_t *name_at; /* [n_rules] */
    uint32_t n_elems, n_alts, n_rules, n_sets, root;
    uint8_t rep[256];   /* each byte's class representative: bytes no set tells apart step alike */
    uint8_t safe_reps[96]; /* the representatives of the plain-text bytes (forge__tk_safe) */
    int n_safe_reps;
} forge__gram;

/* Plain text: printable ASCII but '"' and '\\'. The trie marks subtrees made of it, and a state
 * from which every run of it up to a length stays alive takes such a subtree whole. */
static bool forge__tk_safe(unsigned c) { return c >= 0x20 && c <= 0x7E && c != '"' && c != '\\'; }

static void forge__gram_free(forge__gram *g) {
    if (!g) return;
    free(g->elems);
    free(g->alt);
    free(g->rule_alt);
    free(g->sets);
    free(g->names);
    free(g->name_at);
    free(g);
}

/* Nullable rules, then every rule reachable at the start of an alternative of r (after nullable
 * elements only): a cycle there is left recursion, which the stack automaton cannot run. */
static forge_status forge__gram_check(const forge__gram *g, forge__err *err) {
    uint8_t *nullable = (uint8_t *)calloc(g->n_rules + 1, 1);
    uint8_t *color = (uint8_t *)calloc(g->n_rules + 1, 1); /* 0 new, 1 on the path, 2 done */
    uint32_t *stack = (uint32_t *)malloc(sizeof *stack * 2 * ((size_t)g->n_rules + 1));
    forge_status st = FORGE_OK;
    if (!nullable || !color || !stack) { st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t r = 0; r < g->n_rules; r++) {
            if (nullable[r]) continue;
            for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1] && !nullable[r]; a++) {
                uint32_t e = g->alt[a];
                while (FORGE__GE_KIND(g->elems[e]) == FORGE__GE_RULE && nullable[FORGE__GE_ARG(g->elems[e])]) e++;
                if (FORGE__GE_KIND(g->elems[e]) == FORGE__GE_END) nullable[r] = changed = true;
            }
        }
    }
    /* depth-first over "r starts with s", iteratively: stack of (rule, next alternative-element cursor) */
    for (uint32_t r0 = 0; r0 < g->n_rules && !st; r0++) {
        if (color[r0]) continue;
        size_t sp = 0;
        stack[sp++] = r0;
        stack[sp++] = 0; /* cursor: index over (alternative, position) pairs flattened below */
        color[r0] = 1;
        while (sp && !st) {
            uint32_t r = stack[sp - 2], cur = stack[sp - 1];
            /* the cursor walks alternatives; within one, the leading elements while nullable */
            uint32_t a = g->rule_alt[r] + (cur >> 16), k = cur & 0xffff;
            if (a >= g->rule_alt[r + 1]) {
                color[r] = 2;
                sp -= 2;
                continue;
            }
            uint32_t e = g->alt[a] + k;
            uint32_t el = g->elems[e];
            bool more = FORGE__GE_KIND(el) == FORGE__GE_RULE && nullable[FORGE__GE_ARG(el)] && k < 0xfffe;
            stack[sp - 1] = more ? cur + 1 : ((cur >> 16) + 1) << 16;
            if (FORGE__GE_KIND(el) != FORGE__GE_RULE) continue;
            uint32_t s = FORGE__GE_ARG(el);
            if (color[s] == 1) {
                char path[400] = "";
                size_t pl = 0;
                for (size_t i = 0; i < sp && pl < sizeof path - 80; i += 2)
                    if (color[stack[i]] == 1) pl += (size_t)snprintf(path + pl, sizeof path - pl, "%s -> ", g->names + g->name_at[stack[i]]);
                snprintf(path + pl, sizeof path - pl, "%s", g->names + g->name_at[s]);
                st = forge__fail(err, FORGE_ERR_INVALID_ARGUMENT,
                                 "grammar: left recursion in rule '%s' (%s): a rule that can reach itself before matching any text "
                                 "(a repetition of something that can match nothing does too)",
                                 g->names + g->name_at[s], path);
            } else if (color[s] == 0) {
                color[s] = 1;
                stack[sp++] = s;
                stack[sp++] = 0;
            }
        }
    }
done:
    free(nullable);
    free(color);
    free(stack);
    return st;
}

/* Parses GBNF text into a compiled grammar whose start is rule `root`; tokens named by their
 * text are looked up in tk (NULL: refused). */
static forge_status forge__gram_parse(const char *text, size_t len, const forge__tokenizer *tk, forge__gram **out, forge__err *err) {
    *out = NULL;
    if (len > FORGE__G_MAX_TEXT) return forge__fail(err, FORGE_ERR_LIMIT, "grammar: %zu bytes (the most is %u)", len, FORGE__G_MAX_TEXT);
    forge__gbuild b;
    memset(&b, 0, sizeof b);
    b.any_rule = UINT32_MAX;
    b.text = text;
    b.end = text + len;
    b.tk = tk;
    b.err = err;
    forge__gb_parse(&b);
    uint32_t nr = FORGE__GB_NRULES(&b);
    if (!b.st) {
        for (uint32_t r = 0; r < nr; r++)
            if (!FORGE__GB_RULE(&b, r)->defined) {
                int line = 0, col;
                if (FORGE__GB_RULE(&b, r)->used_at) forge__gb_where(&b, b.text + FORGE__GB_RULE(&b, r)->used_at - 1, &line, &col);
                forge__gb_fail(&b, FORGE_ERR_INVALID_ARGUMENT, NULL, "rule '%s' (used on line %d) is never defined", FORGE__GB_RULE(&b, r)->name, line);
                break;
            }
    }
    uint32_t root = UINT32_MAX;
    if (!b.st) {
        for (uint32_t r = 0; r < nr && root == UINT32_MAX; r++)
            if (!strcmp(FORGE__GB_RULE(&b, r)->name, "root")) root = r;
        if (root == UINT32_MAX) forge__gb_fail(&b, FORGE_ERR_INVALID_ARGUMENT, NULL, "no rule 'root' (where a grammar starts)");
    }
    forge__gram *g = NULL;
    if (!b.st) {
        g = (forge__gram *)calloc(1, sizeof *g);
        uint64_t n_alts = 0, n_elems = 0, name_bytes = 0;
        for (uint32_t r = 0; r < nr; r++) {
            forge__grule_b *rb = FORGE__GB_RULE(&b, r);
            size_t ne = rb->body.n / 4;
            n_alts++;
            for (size_t i = 0; i < ne; i++) n_alts += FORGE__GE_KIND(((uint32_t *)rb->body.p)[i]) == FORGE__GE_ALT;
            n_elems += ne + 1;
            name_bytes += strlen(rb->name) + 1;
        }
        if (g) {
            g->elems = (uint32_t *)malloc(4 * (size_t)n_elems);
            g->alt = (uint32_t *)malloc(4 * (size_t)n_alts);
            g->rule_alt = (uint32_t *)malloc(4 * ((size_t)nr + 1));
            g->sets = (uint64_t *)malloc(b.sets.n ? b.sets.n : 1);
            g->names = (char *)malloc((size_t)name_bytes);
            g->name_at = (uint32_t *)malloc(4 * ((size_t)nr + 1));
        }
        if (!g || !g->elems || !g->alt || !g->rule_alt || !g->sets || !g->names || !g->name_at) {
            forge__gb_oom(&b);
        } else {
            uint32_t e = 0, a = 0, at = 0;
            for (uint32_t r = 0; r < nr; r++) {
                forge__grule_b *rb = FORGE__GB_RULE(&b, r);
                const uint32_t *body = (const uint32_t *)rb->body.p;
                size_t ne = rb->body.n / 4;
                g->rule_alt[r] = a;
                g->alt[a++] = e;
                for (size_t i = 0; i < ne; i++) {
                    if (FORGE__GE_KIND(body[i]) == FORGE__GE_ALT) {
                        g->elems[e++] = FORGE__GE(FORGE__GE_END, 0);
                        g->alt[a++] = e;
                    } else {
                        g->elems[e++] = body[i];
                    }
                }
                g->elems[e++] = FORGE__GE(FORGE__GE_END, 0);
                size_t l = strlen(rb->name) + 1;
                memcpy(g->names + at, rb->name, l);
                g->name_at[r] = at;
                at += (uint32_t)l;
            }
            g->rule_alt[nr] = a;
            g->n_elems = e;
            g->n_alts = a;
            g->n_rules = nr;
            g->n_sets = (uint32_t)(b.sets.n / 32);
            if (b.sets.n) memcpy(g->sets, b.sets.p, b.sets.n);
            g->root = root;
            /* byte classes: refine one class by every set's membership (a signature per byte) */
            uint64_t sig[256] = {0};
            for (uint32_t k = 0; k < g->n_sets; k++)
                for (int c = 0; c < 256; c++)
                    if (forge__bset_has(g->sets + 4 * (size_t)k, (unsigned)c)) sig[c] = forge__mix(sig[c] ^ (0x9e3779b97f4a7c15ull * (k + 1)));
                    else sig[c] = forge__mix(sig[c] + k + 1);
            for (int c = 0; c < 256; c++) {
                g->rep[c] = (uint8_t)c;
                for (int r = 0; r < c; r++)
                    if (sig[r] == sig[c]) { g->rep[c] = g->rep[r]; break; }
                if (forge__tk_safe((unsigned)c) && g->rep[c] == c) g->safe_reps[g->n_safe_reps++] = (uint8_t)c;
            }
        }
    }
    forge_status st = b.st;
    forge__gb_free(&b);
    if (!st) st = forge__gram_check(g, err);
    if (st) {
        forge__gram_free(g);
        return st;
    }
    *out = g;
    return FORGE_OK;
}

/* ---- The model's tokens as bytes, and their trie ---- */

typedef struct forge__tnode {
    uint32_t end;    /* the index past this node's subtree (preorder) */
    uint32_t tok_lo; /* the tokens of its subtree: sorted[tok_lo .. nodes[end].tok_lo), its own first */
    uint16_t tok_n;  /* its own tokens */
    uint8_t byte;
    uint8_t safe;    /* the subtree below it is plain text (forge__tk_safe) this many bytes deep; 255: it is not */
    uint16_t depth;  /* bytes from the root */
    uint16_t pad;
} forge__tnode;

/* One allocation, freed with free(): the header, then its arrays. */
typedef struct forge__vocab {
    int n_vocab;              /* the model's (the logits' width) */
    uint32_t n_nodes;
    uint32_t *off;            /* [n_vocab + 1] token i's bytes: bytes[off[i] .. off[i + 1]) */
    uint8_t *bytes;
    uint8_t *kind;            /* [n_vocab] FORGE__TK_TEXT etc. */
    int32_t *sorted;          /* the trie's tokens in preorder */
    int32_t *specials;        /* [n_specials] the FORGE__TK_SPECIAL tokens (a grammar's token escapes) */
    int n_specials;
    forge__tnode *nodes;      /* [n_nodes], 0 the root */
} forge__vocab;

#define FORGE__TK_TEXT 0    /* ordinary text: in the trie */
#define FORGE__TK_SPECIAL 1 /* a special token (its piece as its bytes, for triggers) */
#define FORGE__TK_NONE 2    /* no text (a hole, an id past the tokenizer, an empty piece) */

typedef struct forge__vsort {
    const uint8_t *s;
    uint32_t n;
    int32_t id;
} forge__vsort;

static int forge__vsort_cmp(const void *a, const void *b) {
    const forge__vsort *x = (const forge__vsort *)a, *y = (const forge__vsort *)b;
    int c = memcmp(x->s, y->s, FORGE__MIN(x->n, y->n));
    if (c) return c;
    if (x->n != y->n) return x->n < y->n ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static forge__vocab *forge__vocab_build(const forge_model *m, forge__err *err) {
    const forge__tokenizer *tk = &m->tok;
    int V = m->cfg.n_vocab > 0 ? m->cfg.n_vocab : tk->n_vocab;
    forge__buf bytes, tb;
    forge__buf_init(&bytes, NULL, 0);
    forge__buf_init(&tb, NULL, 0);
    uint32_t *off = (uint32_t *)malloc(4 * ((size_t)V + 1));
    uint8_t *kind = (uint8_t *)malloc((size_t)V + 1);
    forge__vsort *vs = (forge__vsort *)malloc(sizeof *vs * ((size_t)V + 1));
    forge__vocab *out = NULL;
    if (!off || !kind || !vs) goto oom;
    int n_special = 0;
    for (int i = 0; i < V; i++) {
        off[i] = (uint32_t)bytes.n;
        kind[i] = FORGE__TK_NONE;
        if (i >= tk->n_vocab || !tk->pieces[i]) continue;
        if (tk->is_special[i]) {
            forge__buf_put(&bytes, tk->pieces[i], tk->piece_len[i]);
            kind[i] = tk->piece_len[i] ? FORGE__TK_SPECIAL : FORGE__TK_NONE;
            n_special += kind[i] == FORGE__TK_SPECIAL;
            continue;
        }
        if (!forge__tk_token_bytes(tk, i, &tb)) goto oom;
        if (tb.n == 0 || tb.n > 60000) continue;
        forge__buf_put(&bytes, tb.p, tb.n);
        kind[i] = FORGE__TK_TEXT;
    }
    off[V] = (uint32_t)bytes.n;
    if (bytes.oom || bytes.n > UINT32_MAX / 2) goto oom;
    int k = 0;
    for (int i = 0; i < V; i++)
        if (kind[i] == FORGE__TK_TEXT) vs[k++] = (forge__vsort){(const uint8_t *)bytes.p + off[i], off[i + 1] - off[i], i};
    qsort(vs, (size_t)k, sizeof *vs, forge__vsort_cmp);
    /* nodes: count them first (each token adds its bytes past the common prefix with the previous) */
    uint64_t n_nodes = 1;
    for (int i = 0; i < k; i++) {
        uint32_t l = 0;
        if (i) while (l < vs[i].n && l < vs[i - 1].n && vs[i].s[l] == vs[i - 1].s[l]) l++;
        n_nodes += vs[i].n - l;
    }
    n_nodes++; /* a sentinel past the last: its tok_lo is the token count */
    size_t sz = sizeof *out + 4 * ((size_t)V + 1) + bytes.n + (size_t)V + 8 + 4 * (size_t)k + 8 + 4 * (size_t)n_special + 8 +
                sizeof(forge__tnode) * n_nodes + 16;
    out = (forge__vocab *)calloc(1, sz);
    if (!out) goto oom;
    char *p = (char *)(out + 1);
    out->nodes = (forge__tnode *)p;
    p += sizeof(forge__tnode) * n_nodes;
    out->off = (uint32_t *)p;
    p += 4 * ((size_t)V + 1);
    out->sorted = (int32_t *)p;
    p += 4 * (size_t)k + 8;
    out->specials = (int32_t *)p;
    p += 4 * (size_t)n_special + 8;
    out->kind = (uint8_t *)p;
    p += (size_t)V + 8;
    out->bytes = (uint8_t *)p;
    out->n_vocab = V;
    memcpy(out->off, off, 4 * ((size_t)V + 1));
    memcpy(out->kind, kind, (size_t)V);
    for (int i = 0; i < V; i++)
        if (kind[i] == FORGE__TK_SPECIAL) out->specials[out->n_specials++] = i;
    if (bytes.n) memcpy(out->bytes, bytes.p, bytes.n);
    /* preorder construction along the sorted strings; path[d] is the open node at depth d */
    uint32_t *path = (uint32_t *)malloc(4 * 60002);
    if (!path) goto oom;
    uint32_t nn = 1, depth = 0;
    out->nodes[0] = (forge__tnode){0, 0, 0, 0, 0, 0, 0};
    path[0] = 0;
    for (int i = 0; i < k; i++) {
        out->sorted[i] = vs[i].id;
        uint32_t l = 0;
        if (i) while (l < vs[i].n && l < vs[i - 1].n && vs[i].s[l] == vs[i - 1].s[l]) l++;
        while (depth > l) out->nodes[path[depth--]].end = nn; /* close the nodes past the common prefix */
        for (uint32_t d = l; d < vs[i].n; d++) { /* (a new node's subtree starts with this token) */
            out->nodes[nn] = (forge__tnode){0, (uint32_t)i, 0, vs[i].s[d], 255, (uint16_t)(d + 1), 0};
            path[++depth] = nn++;
        }
        forge__tnode *t = &out->nodes[path[depth]];
        if (t->tok_n < UINT16_MAX) t->tok_n++;
    }
    while (depth > 0) out->nodes[path[depth--]].end = nn;
    out->nodes[0].end = nn;
    out->n_nodes = nn;
    out->nodes[nn] = (forge__tnode){nn, (uint32_t)k, 0, 0, 255, 0, 0};
    /* plain-text subtrees, from the leaves up: a node's depth of plain text below it */
    for (uint32_t i = nn; i-- > 0;) {
        forge__tnode *t = &out->nodes[i];
        int deepest = 0;
        for (uint32_t j = i + 1; j < t->end && deepest >= 0; j = out->nodes[j].end) {
            const forge__tnode *c = &out->nodes[j];
            if (!forge__tk_safe(c->byte) || c->safe == 255) deepest = -1;
            else deepest = FORGE__MAX(deepest, 1 + c->safe);
        }
        t->safe = deepest < 0 || deepest > 254 ? 255 : (uint8_t)deepest;
    }
    free(path);
    free(off);
    free(kind);
    free(vs);
    forge__buf_free(&bytes);
    forge__buf_free(&tb);
    return out;
oom:
    free(off);
    free(kind);
    free(vs);
    free(out);
    forge__buf_free(&bytes);
    forge__buf_free(&tb);
    forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory (the vocabulary's trie)");
    return NULL;
}

/* The model's vocabulary trie, built on first use (the model is shared: under its lock). */
static const forge__vocab *forge__model_vocab(const forge_model *cm, forge__err *err) {
    forge_model *m = (forge_model *)cm;
    pthread_mutex_lock(&m->vocab_lock);
    if (!m->vocab) m->vocab = forge__vocab_build(m, err);
    const forge__vocab *v = m->vocab;
    pthread_mutex_unlock(&m->vocab_lock);
    return v;
}

static const uint8_t *forge__vocab_tok(const forge__vocab *v, int32_t id, uint32_t *n) {
    *n = v->off[id + 1] - v->off[id];
    return v->bytes + v->off[id];
}

/* ---- The automaton: stacks, states, transitions ---- */

typedef struct forge__gnode {
    uint32_t pos, parent, depth; /* node 0: the empty stack */
} forge__gnode;

typedef struct forge__gstate {
    uint32_t off, n;  /* its stacks: ids[off .. off + n) (sorted) */
    uint64_t hash;
    int32_t mask;     /* the slot of its cached mask, -1 none */
    int16_t forced;   /* -2 not known yet; -1 none (several bytes, or the grammar may end); else the one byte */
    uint8_t accept;   /* the grammar may end here */
    uint8_t ok_runs;  /* every run of plain text this long or shorter stays alive (known so far) */
    uint8_t bad_runs; /* ... some run this long dies (known so far; 255: none known) */
    uint8_t pad[3];
} forge__gstate;

typedef struct forge__gdfa {
    const forge__gram *g;
    forge__gnode *nodes;
    uint32_t n_nodes, cap_nodes;
    uint64_t *node_keys; /* (pos << 32 | parent) + 1, 0 empty */
    uint32_t *node_vals;
    uint32_t node_mask;
    forge__gstate *states;
    uint32_t n_states, cap_states;
    uint32_t *state_tab; /* state id + 1, 0 empty */
    uint32_t state_mask;
    int32_t *trans;      /* [cap_states * 256] -1: not computed */
    uint32_t *ids;       /* the states' stacks */
    size_t n_ids, cap_ids;
    uint32_t *mark;      /* [cap_nodes] closure stamps */
    uint32_t stamp;
    forge__buf work, out; /* closure scratch (uint32_t) */
    bool depth_hit;      /* a stack would have passed FORGE__G_MAX_DEPTH: that path was dropped */
    uint64_t steps;      /* closure steps since the matcher last took a token (FORGE__G_HARD_STEPS) */
    forge_status st;     /* a limit or out of memory: the automaton stops */
    forge__err *err;
} forge__gdfa;

#define FORGE__G_DEAD 0 /* the state with no stacks that cannot end */

static bool forge__dfa_fail(forge__gdfa *d, forge_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool forge__dfa_fail(forge__gdfa *d, forge_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    forge__fail_first(&d->st, d->err, st, "", fmt, ap);
    va_end(ap);
    return false;
}


/* The node (pos, parent), interned; UINT32_MAX when it would pass the depth bound or on failure. */
static uint32_t forge__dfa_node(forge__gdfa *d, uint32_t pos, uint32_t parent) {
    uint64_t key = ((uint64_t)pos << 32 | parent) + 1;
    uint32_t k = (uint32_t)forge__mix(key) & d->node_mask;
    for (; d->node_keys[k]; k = (k + 1) & d->node_mask)
        if (d->node_keys[k] == key) return d->node_vals[k];
    uint32_t depth = d->nodes[parent].depth + 1;
    if (depth > FORGE__G_MAX_DEPTH) { d->depth_hit = true; return UINT32_MAX; }
    if (d->n_nodes == d->cap_nodes) {
        uint32_t cap = d->cap_nodes * 2;
        forge__gnode *nn = (forge__gnode *)realloc(d->nodes, sizeof *nn * cap);
        uint32_t *mk = nn ? (uint32_t *)realloc(d->mark, 4ull * cap) : NULL;
        if (nn) d->nodes = nn;
        if (mk) { d->mark = mk; memset(mk + d->cap_nodes, 0, 4ull * (cap - d->cap_nodes)); }
        if (!nn || !mk) return forge__dfa_fail(d, FORGE_ERR_OUT_OF_MEMORY, "out of host memory (grammar stacks)"), UINT32_MAX;
        d->cap_nodes = cap;
    }
    uint32_t id = d->n_nodes++;
    d->nodes[id] = (forge__gnode){pos, parent, depth};
    d->node_keys[k] = key;
    d->node_vals[k] = id;
    if ((uint64_t)d->n_nodes * 2 > (uint64_t)d->node_mask + 1) { /* grow the table */
        uint32_t cap = (d->node_mask + 1) * 2;
        uint64_t *keys = (uint64_t *)calloc(cap, 8);
        uint32_t *vals = (uint32_t *)malloc(4ull * cap);
        if (!keys || !vals) {
            free(keys);
            free(vals);
            return forge__dfa_fail(d, FORGE_ERR_OUT_OF_MEMORY, "out of host memory (grammar stacks)"), UINT32_MAX;
        }
        for (uint32_t i = 0; i <= d->node_mask; i++)
            if (d->node_keys[i]) {
                uint32_t j = (uint32_t)forge__mix(d->node_keys[i]) & (cap - 1);
                while (keys[j]) j = (j + 1) & (cap - 1);
                keys[j] = d->node_keys[i];
                vals[j] = d->node_vals[i];
            }
        free(d->node_keys);
        free(d->node_vals);
        d->node_keys = keys;
        d->node_vals = vals;
        d->node_mask = cap - 1;
    }
    return id;
}

/* Adds to d->out the stacks stack `n0` becomes before its next byte: rule references expanded
 * into their alternatives (a reference that ends its alternative not pushing a return: tail
 * calls), finished alternatives popped. *accept when a stack empties. Nodes already visited in
 * this closure (d->stamp) are skipped, which also ends cycles of empty matches. */
static void forge__dfa_close(forge__gdfa *d, uint32_t n0, bool *accept) {
    const forge__gram *g = d->g;
    d->work.n = 0;
    FORGE__VEC_PUSH(&d->work, uint32_t, n0);
    while (d->work.n && !d->st) {
        if (++d->steps > FORGE__G_HARD_STEPS) {
            forge__dfa_fail(d, FORGE_ERR_LIMIT, "grammar: more than %llu automaton steps for one token", FORGE__G_HARD_STEPS);
            break;
        }
        d->work.n -= 4;
        uint32_t n = FORGE__VEC_AT(&d->work, uint32_t, d->work.n / 4);
        if (d->mark[n] == d->stamp) continue;
        d->mark[n] = d->stamp;
        if (n == 0) { *accept = true; continue; }
        uint32_t pos = d->nodes[n].pos, e = g->elems[pos];
        switch (FORGE__GE_KIND(e)) {
        case FORGE__GE_SET: FORGE__VEC_PUSH(&d->out, uint32_t, n); break;
        case FORGE__GE_END: FORGE__VEC_PUSH(&d->work, uint32_t, d->nodes[n].parent); break;
        default: { /* a rule reference: its alternatives, returning after it */
            uint32_t r = FORGE__GE_ARG(e), parent = d->nodes[n].parent;
            uint32_t base = FORGE__GE_KIND(g->elems[pos + 1]) == FORGE__GE_END ? parent : forge__dfa_node(d, pos + 1, parent);
            if (base == UINT32_MAX) break;
            for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
                uint32_t c = forge__dfa_node(d, g->alt[a], base);
                if (c != UINT32_MAX) FORGE__VEC_PUSH(&d->work, uint32_t, c);
            }
        }
        }
    }
    if (d->work.oom || d->out.oom) forge__dfa_fail(d, FORGE_ERR_OUT_OF_MEMORY, "out of host memory (grammar)");
}

static int forge__u32_cmp(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The state of the stacks in d->out (any order, distinct) and `accept`, interned. */
static int32_t forge__dfa_state(forge__gdfa *d, bool accept) {
    if (d->st) return FORGE__G_DEAD;
    uint32_t *ids = (uint32_t *)d->out.p;
    size_t n = d->out.n / 4;
    if (!n && !accept) return FORGE__G_DEAD;
    if (n > FORGE__G_MAX_STACKS)
        return forge__dfa_fail(d, FORGE_ERR_LIMIT, "grammar: a state of more than %u stacks (an ambiguous grammar?)", FORGE__G_MAX_STACKS), FORGE__G_DEAD;
    if (n > 1) qsort(ids, n, 4, forge__u32_cmp);
    uint64_t h = forge__fnv(FORGE__FNV_BASIS ^ (uint64_t)accept, ids, 4 * n);
    for (uint32_t k = (uint32_t)h & d->state_mask; d->state_tab[k]; k = (k + 1) & d->state_mask) {
        const forge__gstate *s = &d->states[d->state_tab[k] - 1];
        if (s->hash == h && s->n == n && s->accept == accept && !memcmp(d->ids + s->off, ids, 4 * n)) return (int32_t)(d->state_tab[k] - 1);
    }
    if (d->n_states >= FORGE__G_HARD_STATES)
        return forge__dfa_fail(d, FORGE_ERR_LIMIT, "grammar: more than %u automaton states for one token", FORGE__G_HARD_STATES), FORGE__G_DEAD;
    if (d->n_states == d->cap_states) {
        uint32_t cap = d->cap_states * 2;
        forge__gstate *ns = (forge__gstate *)realloc(d->states, sizeof *ns * cap);
        if (ns) d->states = ns;
        int32_t *nt = ns ? (int32_t *)realloc(d->trans, 4ull * 256 * cap) : NULL;
        if (!ns || !nt) return forge__dfa_fail(d, FORGE_ERR_OUT_OF_MEMORY, "out of host memory (grammar states)"), FORGE__G_DEAD;
        d->trans = nt;
        d->cap_states = cap;
    }
    if (d->n_ids + n > d->cap_ids) {
        size_t cap = FORGE__MAX(d->cap_ids * 2, d->n_ids + n);
        uint32_t *ni = (uint32_t *)realloc(d->ids, 4 * cap);
        if (!ni) return forge__dfa_fail(d, FORGE_ERR_OUT_OF_MEMORY, "out of host memory (grammar states)"), FORGE__G_DEAD;
        d->ids = ni;
        d->cap_ids = cap;
    }
    uint32_t id = d->n_states++;
    if (n) memcpy(d->ids + d->n_ids, ids, 4 * n); /* (a state of no items: ids may be NULL) */
    d->states[id] = (forge__gstate){(uint32_t)d->n_ids, (uint32_t)n, h, -1, -2, (uint8_t)accept, 0, 255, {0, 0, 0}};
    d->n_ids += n;
    memset(d->trans + 256ull * id, 0xff, 4 * 256);
    if ((uint64_t)d->n_states * 2 > (uint64_t)d->state_mask + 1) {
        uint32_t cap = (d->state_mask + 1) * 2;
        uint32_t *t = (uint32_t *)calloc(cap, 4);
        if (!t) return forge__dfa_fail(d, FORGE_ERR_OUT_OF_MEMORY, "out of host memory (grammar states)"), FORGE__G_DEAD;
        for (uint32_t i = 0; i < d->n_states; i++) {
            uint32_t k = (uint32_t)d->states[i].hash & (cap - 1);
            while (t[k]) k = (k + 1) & (cap - 1);
            t[k] = i + 1;
        }
        free(d->state_tab);
        d->state_tab = t;
        d->state_mask = cap - 1;
    } else {
        uint32_t k = (uint32_t)h & d->state_mask;
        while (d->state_tab[k]) k = (k + 1) & d->state_mask;
        d->state_tab[k] = id + 1;
    }
    return (int32_t)id;
}

/* (Re)starts the automaton's tables: no stacks, no states but DEAD. */
static bool forge__dfa_reset(forge__gdfa *d) {
    d->n_nodes = 1;
    d->nodes[0] = (forge__gnode){0, 0, 0};
    memset(d->node_keys, 0, 8ull * (d->node_mask + 1));
    memset(d->mark, 0, 4ull * d->cap_nodes);
    d->stamp = 0;
    d->n_states = 0;
    d->n_ids = 0;
    memset(d->state_tab, 0, 4ull * (d->state_mask + 1));
    d->out.n = 0;
    d->st = FORGE_OK;
    /* state 0: DEAD (forge__dfa_state never interns it: an empty set that cannot end is DEAD) */
    d->states[0] = (forge__gstate){0, 0, 0, -1, -1, 0, 0, 1, {0, 0, 0}};
    for (int b = 0; b < 256; b++) d->trans[b] = FORGE__G_DEAD;
    d->n_states = 1;
    return true;
}

static void forge__dfa_free(forge__gdfa *d) {
    free(d->nodes);
    free(d->node_keys);
    free(d->node_vals);
    free(d->states);
    free(d->state_tab);
    free(d->trans);
    free(d->ids);
    free(d->mark);
    forge__buf_free(&d->work);
    forge__buf_free(&d->out);
    memset(d, 0, sizeof *d);
}

static bool forge__dfa_init(forge__gdfa *d, const forge__gram *g, forge__err *err) {
    memset(d, 0, sizeof *d);
    d->g = g;
    d->err = err;
    d->cap_nodes = 4096;
    d->node_mask = 8191;
    d->cap_states = 256;
    d->state_mask = 511;
    d->nodes = (forge__gnode *)malloc(sizeof *d->nodes * d->cap_nodes);
    d->mark = (uint32_t *)calloc(d->cap_nodes, 4);
    d->node_keys = (uint64_t *)calloc(d->node_mask + 1, 8);
    d->node_vals = (uint32_t *)malloc(4ull * (d->node_mask + 1));
    d->states = (forge__gstate *)malloc(sizeof *d->states * d->cap_states);
    d->state_tab = (uint32_t *)calloc(d->state_mask + 1, 4);
    d->trans = (int32_t *)malloc(4ull * 256 * d->cap_states);
    d->cap_ids = 4096;
    d->ids = (uint32_t *)malloc(4 * d->cap_ids);
    if (!d->nodes || !d->mark || !d->node_keys || !d->node_vals || !d->states || !d->state_tab || !d->trans || !d->ids || !forge__dfa_reset(d)) {
        forge__dfa_free(d);
        forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory (grammar)");
        return false;
    }
    return true;
}

static void forge__dfa_new_closure(forge__gdfa *d) {
    if (++d->stamp == 0) { /* wrapped: clear the stamps */
        memset(d->mark, 0, 4ull * d->cap_nodes);
        d->stamp = 1;
    }
    d->out.n = 0;
}

/* The start state: the root's alternatives on an empty stack. */
static int32_t forge__dfa_start(forge__gdfa *d) {
    forge__dfa_new_closure(d);
    bool accept = false;
    const forge__gram *g = d->g;
    for (uint32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++) {
        uint32_t c = forge__dfa_node(d, g->alt[a], 0);
        if (c != UINT32_MAX) forge__dfa_close(d, c, &accept);
    }
    return forge__dfa_state(d, accept);
}

/* The transition of state s on byte c, computed the first time (once per byte class). */
static int32_t forge__dfa_compute(forge__gdfa *d, int32_t s, uint8_t c) {
    if (d->st) return FORGE__G_DEAD;
    uint8_t r = d->g->rep[c];
    if (r != c) {
        int32_t t = d->trans[256ull * s + r];
        if (t < 0) t = forge__dfa_compute(d, s, r);
        if (!d->st) d->trans[256ull * s + c] = t;
        return t;
    }
    forge__dfa_new_closure(d);
    bool accept = false;
    const forge__gram *g = d->g;
    uint32_t off = d->states[s].off, n = d->states[s].n;
    for (uint32_t i = 0; i < n && !d->st; i++) {
        uint32_t id = d->ids[off + i];
        uint32_t pos = d->nodes[id].pos;
        if (!forge__bset_has(g->sets + 4 * (size_t)FORGE__GE_ARG(g->elems[pos]), c)) continue;
        uint32_t next = FORGE__GE_KIND(g->elems[pos + 1]) == FORGE__GE_END ? d->nodes[id].parent : forge__dfa_node(d, pos + 1, d->nodes[id].parent);
        if (next != UINT32_MAX) forge__dfa_close(d, next, &accept);
    }
    int32_t t = forge__dfa_state(d, accept);
    if (!d->st) d->trans[256ull * s + c] = t;
    return t;
}

static inline int32_t forge__dfa_step(forge__gdfa *d, int32_t s, uint8_t c) {
    int32_t t = d->trans[256ull * s + c];
    return t >= 0 ? t : forge__dfa_compute(d, s, c);
}

/* The one byte state s allows (it cannot end there), else -1: the union of its stacks' sets. */
static int forge__dfa_forced(forge__gdfa *d, int32_t s) {
    forge__gstate *st = &d->states[s];
    if (st->forced != -2) return st->forced;
    int f = -1;
    if (!st->accept && st->n) {
        uint64_t u[4] = {0, 0, 0, 0};
        for (uint32_t i = 0; i < st->n; i++) {
            const uint64_t *set = d->g->sets + 4 * (size_t)FORGE__GE_ARG(d->g->elems[d->nodes[d->ids[st->off + i]].pos]);
            for (int w = 0; w < 4; w++) u[w] |= set[w];
        }
        int count = 0;
        for (int w = 0; w < 4; w++) count += __builtin_popcountll(u[w]);
        if (count == 1)
            for (int w = 0; w < 4; w++)
                if (u[w]) f = w * 64 + __builtin_ctzll(u[w]);
    }
    d->states[s].forced = (int16_t)f;
    return f;
}

/* Whether state s has any byte to go on with (the union of its sets is not empty). */
static bool forge__dfa_can_continue(forge__gdfa *d, int32_t s) {
    const forge__gstate *st = &d->states[s];
    for (uint32_t i = 0; i < st->n; i++) {
        const uint64_t *set = d->g->sets + 4 * (size_t)FORGE__GE_ARG(d->g->elems[d->nodes[d->ids[st->off + i]].pos]);
        if (set[0] | set[1] | set[2] | set[3]) return true;
    }
    return false;
}

/* Whether every run of plain text (forge__tk_safe bytes) of at most `need` bytes from state s
 * stays alive: what lets a mask take a plain-text subtree of the trie whole. */
static bool forge__dfa_runs(forge__gdfa *d, int32_t s, int need) {
    if (need <= d->states[s].ok_runs) return true;
    if (need >= d->states[s].bad_runs) return false;
    const forge__gram *g = d->g;
    bool ok = true;
    for (int k = 0; k < g->n_safe_reps && ok && !d->st; k++) {
        int32_t t = forge__dfa_step(d, s, g->safe_reps[k]);
        ok = t != FORGE__G_DEAD && forge__dfa_runs(d, t, need - 1);
    }
    if (d->st) return false;
    if (ok) d->states[s].ok_runs = (uint8_t)need;
    else d->states[s].bad_runs = (uint8_t)need;
    return ok;
}

/* Starts the tables again keeping state s (returned under its new id): the cache between
 * tokens stays bounded whatever the grammar. The stacks are re-made from their positions. */
static int32_t forge__dfa_compact(forge__gdfa *d, int32_t s) {
    const forge__gstate *st = &d->states[s];
    bool accept = st->accept;
    forge__buf keep; /* per stack: its depth, then its positions bottom first */
    forge__buf_init(&keep, NULL, 0);
    for (uint32_t i = 0; i < st->n; i++) {
        uint32_t n = d->ids[st->off + i], depth = d->nodes[n].depth;
        size_t at = keep.n;
        FORGE__VEC_PUSH(&keep, uint32_t, depth);
        if (!forge__buf_reserve(&keep, 4ull * depth)) break;
        keep.n += 4ull * depth;
        for (uint32_t k = depth; n; n = d->nodes[n].parent) memcpy(keep.p + at + 4 * (k--), &d->nodes[n].pos, 4);
    }
    if (keep.oom || !forge__dfa_reset(d)) {
        forge__buf_free(&keep);
        forge__dfa_fail(d, FORGE_ERR_OUT_OF_MEMORY, "out of host memory (grammar)");
        return FORGE__G_DEAD;
    }
    forge__dfa_new_closure(d);
    for (size_t q = 0; q < keep.n;) {
        uint32_t depth;
        memcpy(&depth, keep.p + q, 4);
        uint32_t n = 0;
        for (uint32_t k = 1; k <= depth; k++) {
            uint32_t pos;
            memcpy(&pos, keep.p + q + 4 * k, 4);
            n = forge__dfa_node(d, pos, n);
            if (n == UINT32_MAX) break;
        }
        if (n != UINT32_MAX) FORGE__VEC_PUSH(&d->out, uint32_t, n);
        q += 4ull * (depth + 1);
    }
    forge__buf_free(&keep);
    return forge__dfa_state(d, accept);
}

/* ---- The matcher: a constraint running over a model's tokens ---- */

typedef struct forge__matcher {
    forge__gram *gram;
    forge__gdfa dfa;
    const forge__vocab *voc;
    const forge_model *m;
    int32_t cur;               /* the automaton's state (constrained) */
    int32_t start;             /* the start state, -1 until needed again (after a compaction) */
    bool constrained;          /* false: free text until the trigger */
    bool done;                 /* no trigger: the constraint is matched whole and nothing may follow */
    bool dead;                 /* nothing can follow and it cannot end: no token continues it */
    bool ever;                 /* the constraint has applied (from the start, or a trigger came) */
    bool complete;             /* the text so far ends where the constraint may end (or outside a span) */
    bool no_forced;            /* sample every token */
    char *trigger;             /* NULL: constrained from the start */
    size_t trig_len;
    char *tail;                /* free text's last trig_len - 1 bytes */
    size_t tail_len;
    char *arm;                 /* NULL, or: the trigger counts only after this text (a thinking reply's end) */
    size_t arm_len;
    char *arm_tail;            /* until then, the text's last arm_len - 1 bytes */
    size_t arm_tail_len;
    bool armed;                /* the arm text has come (always, without one) */
    uint8_t *is_end;           /* [n_vocab] 1: an end token (allowed where the constraint may end) */
    uint32_t *masks;           /* cached masks, words_per_mask each */
    uint32_t n_masks, cap_masks, max_masks, words;
    forge__err err;
    double ms;                 /* time spent in the matcher */
    int full_masks;            /* whole masks computed */
} forge__matcher;

static void forge__matcher_free(forge__matcher *g) {
    if (!g) return;
    forge__dfa_free(&g->dfa);
    forge__gram_free(g->gram);
    free(g->trigger);
    free(g->tail);
    free(g->arm);
    free(g->arm_tail);
    free(g->is_end);
    free(g->masks);
    free(g);
}

static int32_t forge__matcher_start(forge__matcher *g) {
    if (g->start < 0) g->start = forge__dfa_start(&g->dfa);
    return g->start;
}

/* Keeps the automaton's tables bounded between tokens. */
static void forge__matcher_tidy(forge__matcher *g) {
    forge__gdfa *d = &g->dfa;
    d->steps = 0;
    if (d->st || (d->n_states < FORGE__G_SOFT_STATES && d->n_nodes < FORGE__G_SOFT_NODES)) return;
    g->cur = g->constrained ? forge__dfa_compact(d, g->cur) : forge__dfa_compact(d, forge__matcher_start(g));
    if (!g->constrained) g->cur = FORGE__G_DEAD;
    g->start = -1;
    g->n_masks = 0;
}

/* Walks bytes s[0..n) from state `from`. In a triggered span (`span_end`) the walk stops at the
 * first point where the grammar may end and the next byte is refused: *used gets the bytes the
 * grammar took. Returns the state reached (DEAD when refused outside such a point). */
static int32_t forge__matcher_walk(forge__matcher *g, int32_t from, const uint8_t *s, size_t n, bool span_end, size_t *used) {
    forge__gdfa *d = &g->dfa;
    int32_t t = from;
    size_t i = 0;
    for (; i < n; i++) {
        int32_t next = s[i] == FORGE__G_TOKEN_BYTE ? FORGE__G_DEAD : forge__dfa_step(d, t, s[i]); /* (text never opens a token's escape) */
        if (next == FORGE__G_DEAD) {
            if (span_end && d->states[t].accept) break;
            t = FORGE__G_DEAD;
            break;
        }
        t = next;
    }
    if (used) *used = i;
    return t;
}

/* Steps the id bytes of a special token's escape (forge__gb_token) from state `opened`, where
 * its opening byte has been taken: the state reached, or DEAD. */
static int32_t forge__matcher_escape_id(forge__matcher *g, int32_t opened, int32_t tok) {
    const uint8_t id[3] = {(uint8_t)(tok >> 16), (uint8_t)(tok >> 8), (uint8_t)tok};
    int32_t t = opened;
    for (int i = 0; i < 3 && t != FORGE__G_DEAD; i++) t = forge__dfa_step(&g->dfa, t, id[i]);
    return t;
}

/* Steps a special token's whole escape from state `from`: the state reached, or DEAD. */
static int32_t forge__matcher_special(forge__matcher *g, int32_t from, int32_t tok) {
    int32_t opened = forge__dfa_step(&g->dfa, from, FORGE__G_TOKEN_BYTE);
    return opened == FORGE__G_DEAD ? FORGE__G_DEAD : forge__matcher_escape_id(g, opened, tok);
}

/* Where text pat[0..L) first ends within tail[0..tail_len) + s[0..n) (bytes of s up to its end), or 0. */
static size_t forge__text_end_at(const char *pat, size_t L, const char *tail, size_t tail_len, const uint8_t *s, size_t n) {
    for (size_t e = 1; e <= n; e++) { /* pat ending after s[e - 1] */
        if (e + tail_len < L) continue;
        size_t from_s = FORGE__MIN(e, L), from_tail = L - from_s;
        if (memcmp(s + e - from_s, pat + from_tail, from_s)) continue;
        if (from_tail && memcmp(tail + tail_len - from_tail, pat, from_tail)) continue;
        return e;
    }
    return 0;
}

/* In free text: where the trigger ends within tail + s[0..n) (bytes of s up to its end), or 0;
 * before the arm text it counts only after that (within s, with no tail before it). */
static size_t forge__matcher_trigger_at(const forge__matcher *g, const uint8_t *s, size_t n) {
    if (!g->trigger) return 0;
    if (g->armed) return forge__text_end_at(g->trigger, g->trig_len, g->tail, g->tail_len, s, n);
    size_t a = forge__text_end_at(g->arm, g->arm_len, g->arm_tail, g->arm_tail_len, s, n);
    size_t e = a ? forge__text_end_at(g->trigger, g->trig_len, NULL, 0, s + a, n - a) : 0;
    return e ? a + e : 0;
}

/* Keeps the last keep bytes of buf[0..*len) + s[0..n) in buf. */
static void forge__keep_tail(char *buf, size_t *len, size_t keep, const uint8_t *s, size_t n) {
    if (n >= keep) {
        memcpy(buf, s + n - keep, keep);
        *len = keep;
        return;
    }
    size_t old = FORGE__MIN(*len, keep - n);
    memmove(buf, buf + *len - old, old);
    memcpy(buf + old, s, n);
    *len = old + n;
}

static void forge__matcher_tail_push(forge__matcher *g, const uint8_t *s, size_t n) {
    if (!g->armed) { /* the trigger waits for the arm text */
        if (g->arm_len >= 2) forge__keep_tail(g->arm_tail, &g->arm_tail_len, g->arm_len - 1, s, n);
        return;
    }
    if (!g->trigger || g->trig_len < 2) return;
    forge__keep_tail(g->tail, &g->tail_len, g->trig_len - 1, s, n);
}

/* Whether token `tok` may come next. */
static bool forge__matcher_allows(forge__matcher *g, int32_t tok) {
    const forge__vocab *v = g->voc;
    if (tok < 0 || tok >= v->n_vocab) return false;
    if (g->is_end[tok]) return !g->constrained || g->dfa.states[g->cur].accept;
    uint32_t n;
    const uint8_t *s = forge__vocab_tok(v, tok, &n);
    if (!g->constrained) {
        if (v->kind[tok] == FORGE__TK_NONE) return true;
        size_t at = forge__matcher_trigger_at(g, s, n);
        if (!at || at == n) return true;
        if (v->kind[tok] != FORGE__TK_TEXT) return false; /* text after a trigger inside a special token */
        size_t used;
        int32_t t = forge__matcher_walk(g, forge__matcher_start(g), s + at, n - at, true, &used);
        return t != FORGE__G_DEAD || (used > 0 && used < n - at);
    }
    if (v->kind[tok] == FORGE__TK_SPECIAL) return forge__matcher_special(g, g->cur, tok) != FORGE__G_DEAD;
    if (v->kind[tok] != FORGE__TK_TEXT) return false;
    size_t used;
    return forge__matcher_walk(g, g->cur, s, n, g->trigger != NULL, &used) != FORGE__G_DEAD;
}

/* After the constraint's automaton reached state t with the whole text taken: done / back to
 * free text / still inside. */
static void forge__matcher_settle(forge__matcher *g) {
    const forge__gstate *st = &g->dfa.states[g->cur];
    g->complete = st->accept;
    bool more = forge__dfa_can_continue(&g->dfa, g->cur);
    if (!more) {
        if (!st->accept) g->dead = true;
        else if (g->trigger) { g->constrained = false; g->tail_len = 0; }
        else g->done = true;
    }
}

/* Takes token `tok` (which forge__matcher_allows allowed). */
static void forge__matcher_accept(forge__matcher *g, int32_t tok) {
    double t0 = forge__now_s();
    const forge__vocab *v = g->voc;
    if (tok < 0 || tok >= v->n_vocab || g->is_end[tok]) goto out;
    uint32_t n;
    const uint8_t *s = forge__vocab_tok(v, tok, &n);
    if (g->constrained && v->kind[tok] == FORGE__TK_SPECIAL) { /* a token the grammar names: its escape */
        int32_t t = forge__matcher_special(g, g->cur, tok);
        if (t == FORGE__G_DEAD) g->dead = true; /* (not allowed: the caller's mistake) */
        else {
            g->cur = t;
            forge__matcher_settle(g);
        }
        n = 0;
    }
    while (n > 0) {
        if (!g->constrained) {
            if (!g->armed) { /* the arm text first: the trigger counts after it */
                size_t a = forge__text_end_at(g->arm, g->arm_len, g->arm_tail, g->arm_tail_len, s, n);
                if (!a) { forge__matcher_tail_push(g, s, n); break; }
                g->armed = true;
                g->tail_len = 0;
                s += a;
                n -= (uint32_t)a;
                continue;
            }
            size_t at = forge__matcher_trigger_at(g, s, n);
            if (!at) { forge__matcher_tail_push(g, s, n); break; }
            g->constrained = g->ever = true;
            g->complete = false;
            g->cur = forge__matcher_start(g);
            s += at;
            n -= (uint32_t)at;
            g->tail_len = 0;
            forge__matcher_settle(g);
            continue;
        }
        size_t used;
        int32_t t = forge__matcher_walk(g, g->cur, s, n, g->trigger != NULL, &used);
        if (t == FORGE__G_DEAD) { g->dead = true; break; } /* (not allowed: the caller's mistake) */
        g->cur = t;
        s += used;
        n -= (uint32_t)used;
        forge__matcher_settle(g);
        if (n && g->constrained) { /* a span that ended inside the token: the rest is free text */
            g->constrained = false;
            g->tail_len = 0;
        }
    }
    forge__matcher_tidy(g);
out:
    g->ms += (forge__now_s() - t0) * 1e3;
}

static inline void forge__mask_set(uint32_t *mask, int32_t id) { mask[id >> 5] |= 1u << (id & 31); }

/* The allowed tokens as bits (token i: bit i % 32 of word i / 32) into mask; FORGE_ERR_LIMIT
 * or OUT_OF_MEMORY when the automaton gives up (the message on the matcher). */
static forge_status forge__matcher_mask(forge__matcher *g, uint32_t *mask) {
    double t0 = forge__now_s();
    const forge__vocab *v = g->voc;
    forge__gdfa *d = &g->dfa;
    size_t words = g->words;
    g->full_masks++;
    if (!g->constrained) { /* free text: all but tokens that would start the constraint with text it refuses */
        for (int i = 0; i < v->n_vocab; i++) {
            bool ok = true;
            if (v->kind[i] != FORGE__TK_NONE && !g->is_end[i]) {
                uint32_t n;
                const uint8_t *s = forge__vocab_tok(v, i, &n);
                size_t at = forge__matcher_trigger_at(g, s, n);
                if (at && at < n) ok = forge__matcher_allows(g, i);
            }
            if (ok) forge__mask_set(mask, i);
            else mask[i >> 5] &= ~(1u << (i & 31));
        }
        g->ms += (forge__now_s() - t0) * 1e3;
        return d->st;
    }
    forge__gstate *cs = &d->states[g->cur];
    if (cs->mask >= 0) {
        memcpy(mask, g->masks + words * (size_t)cs->mask, 4 * words);
        g->ms += (forge__now_s() - t0) * 1e3;
        return FORGE_OK;
    }
    memset(mask, 0, 4 * words);
    bool span = g->trigger != NULL;
    int32_t stack[65536 / 64 + 1024]; /* states by depth; a token is at most 60000 bytes: deeper nodes are cut */
    const int maxd = (int)FORGE__ARRAY_LEN(stack) - 1;
    stack[0] = g->cur;
    const forge__tnode *nodes = v->nodes;
    uint32_t i = 1, end = v->n_nodes;
    while (i < end) {
        const forge__tnode *t = &nodes[i];
        if (t->depth > maxd || t->byte == FORGE__G_TOKEN_BYTE) { i = t->end; continue; } /* (text never opens a token's escape) */
        int32_t ps = stack[t->depth - 1];
        int32_t ns = d->trans[256ull * ps + t->byte];
        if (ns < 0) {
            ns = forge__dfa_compute(d, ps, t->byte);
            if (d->st) break;
        }
        if (ns == FORGE__G_DEAD) { i = t->end; continue; }
        stack[t->depth] = ns;
        for (uint32_t k = 0; k < t->tok_n; k++) forge__mask_set(mask, v->sorted[t->tok_lo + k]);
        if (t->end > i + 1 && t->safe != 255 && forge__dfa_runs(d, ns, t->safe)) { /* a plain-text subtree the state takes whole */
            for (uint32_t k = t->tok_lo + t->tok_n; k < nodes[t->end].tok_lo; k++) forge__mask_set(mask, v->sorted[k]);
            i = t->end;
            continue;
        }
        if (span && d->states[ns].accept && !forge__dfa_can_continue(d, ns)) {
            /* the span may end here: every longer token's rest is free text */
            for (uint32_t j = i + 1; j < t->end; j++)
                for (uint32_t k = 0; k < nodes[j].tok_n; k++) forge__mask_set(mask, v->sorted[nodes[j].tok_lo + k]);
            i = t->end;
            continue;
        }
        i++;
    }
    if (d->st) {
        g->ms += (forge__now_s() - t0) * 1e3;
        return d->st;
    }
    int32_t opened = forge__dfa_step(d, g->cur, FORGE__G_TOKEN_BYTE);
    if (opened != FORGE__G_DEAD) /* the grammar names special tokens here: the vocabulary's, each */
        for (int i = 0; i < v->n_specials && !d->st; i++) {
            int32_t id = v->specials[i];
            if (!g->is_end[id] && forge__matcher_escape_id(g, opened, id) != FORGE__G_DEAD) forge__mask_set(mask, id);
        }
    if (d->st) {
        g->ms += (forge__now_s() - t0) * 1e3;
        return d->st;
    }
    if (span) { /* tokens the span may end inside of: a prefix reaches an end point, the rest refused */
        /* (the walk above kept only tokens whose every byte the grammar takes; add the others) */
        for (int id = 0; id < v->n_vocab; id++)
            if (v->kind[id] == FORGE__TK_TEXT && !((mask[id >> 5] >> (id & 31)) & 1) && forge__matcher_allows(g, id)) forge__mask_set(mask, id);
    }
    if (d->states[g->cur].accept)
        for (int id = 0; id < v->n_vocab; id++)
            if (g->is_end[id]) forge__mask_set(mask, id);
    if (g->n_masks < g->max_masks && g->n_masks == g->cap_masks) { /* room for more masks */
        uint32_t cap = FORGE__MIN(FORGE__MAX(8u, g->cap_masks * 2), g->max_masks);
        uint32_t *nm = (uint32_t *)realloc(g->masks, 4 * words * (size_t)cap);
        if (nm) {
            g->masks = nm;
            g->cap_masks = cap;
        }
    }
    if (g->n_masks < g->cap_masks) {
        d->states[g->cur].mask = (int32_t)g->n_masks;
        memcpy(g->masks + words * (size_t)g->n_masks++, mask, 4 * words);
    }
    g->ms += (forge__now_s() - t0) * 1e3;
    return FORGE_OK;
}

/* Tokens for the text the constraint forces next (its automaton allows one byte at a time, and
 * may not end, until it branches): the tokenizer's own tokens of that text, all but the last
 * (which could merge with what follows); each taken by the matcher. Writes at most cap ids;
 * returns how many. */
static int forge__matcher_forced(forge__matcher *g, int32_t *out, int cap) {
    if (!g->constrained || g->no_forced || g->done || g->dead || cap <= 0) return 0;
    double t0 = forge__now_s();
    forge__gdfa *d = &g->dfa;
    uint8_t text[FORGE__G_MAX_FORCED];
    size_t n = 0;
    for (int32_t s = g->cur; n < sizeof text;) {
        int b = forge__dfa_forced(d, s);
        if (b < 0 || b == (int)FORGE__G_TOKEN_BYTE) break; /* (a special token is sampled: the mask allows it alone) */
        text[n++] = (uint8_t)b;
        s = forge__dfa_step(d, s, (uint8_t)b);
        if (s == FORGE__G_DEAD) break;
    }
    int k = 0;
    if (n >= 2 && g->m->tok.n_vocab) {
        forge__tkwork w;
        forge__tkwork_init(&w, &g->m->tok);
        forge__tk_encode(&w, (const char *)text, n, false, false);
        size_t nt = FORGE__VEC_LEN(&w.ids, int32_t);
        const int32_t *ids = (const int32_t *)w.ids.p;
        /* the tokens must spell exactly the forced text */
        size_t at = 0;
        bool ok = !forge__tkwork_oom(&w) && nt >= 2;
        for (size_t i = 0; ok && i < nt; i++) {
            uint32_t tn;
            if (ids[i] < 0 || ids[i] >= g->voc->n_vocab || g->voc->kind[ids[i]] != FORGE__TK_TEXT) { ok = false; break; }
            const uint8_t *tb = forge__vocab_tok(g->voc, ids[i], &tn);
            ok = at + tn <= n && !memcmp(text + at, tb, tn);
            at += tn;
        }
        ok = ok && at == n;
        if (!ok) { /* (a tokenizer that adds a space in front, SentencePiece's): the longest token at each point */
            nt = 0;
            w.ids.n = 0;
            for (size_t pos = 0; pos < n;) {
                const forge__tnode *nodes = g->voc->nodes;
                int32_t best = -1;
                size_t best_len = 0;
                for (uint32_t i = 1, d = 0; i < g->voc->n_nodes && pos + d < n;) { /* down the trie along text[pos..] */
                    const forge__tnode *t = &nodes[i];
                    if (t->depth != d + 1 || t->byte != text[pos + d]) { /* a sibling, or past this subtree */
                        if (t->depth <= d) break;
                        i = t->end;
                        continue;
                    }
                    d++;
                    if (t->tok_n) { best = g->voc->sorted[t->tok_lo]; best_len = d; }
                    i++;
                }
                if (best < 0) break;
                FORGE__VEC_PUSH(&w.ids, int32_t, best);
                pos += best_len;
                nt++;
                if (pos == n) ok = true;
            }
            ids = (const int32_t *)w.ids.p;
            ok = ok && !w.ids.oom && nt >= 2;
        }
        for (size_t i = 0; ok && i + 1 < nt && k < cap; i++) {
            out[k++] = ids[i];
            forge__matcher_accept(g, ids[i]);
        }
        forge__tkwork_free(&w);
    }
    g->ms += (forge__now_s() - t0) * 1e3;
    return k;
}

/* ---- Compiling a constraint ---- */

/* The caller's constraint (its struct_size honoured) as forge's. */
static void forge__constraint_in(const forge_constraint *in, forge_constraint *c) {
    forge__get_sized(c, sizeof *c, in, forge__struct_size(in));
}

/* The GBNF of a constraint, then its compiled grammar: from rule root, or with a trigger from a
 * rule that lets whitespace come first. */
static forge_status forge__constraint_compile(const forge_constraint *c, const forge__tokenizer *tk, forge__gram **out, forge__err *err) {
    forge__buf text;
    forge__buf_init(&text, NULL, 0);
    forge_status st = FORGE_OK;
    size_t len = c->text ? (c->text_len ? c->text_len : strlen(c->text)) : 0;
    switch (c->kind) {
    case FORGE_CONSTRAINT_GBNF:
        if (!c->text) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "constraint: a GBNF constraint needs its text");
        forge__buf_put(&text, c->text, len);
        break;
    case FORGE_CONSTRAINT_JSON_SCHEMA:
        if (!c->text) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "constraint: a JSON Schema constraint needs its text");
        st = forge__schema_to_gbnf(c->text, len, &text, err);
        break;
    case FORGE_CONSTRAINT_JSON_OBJECT: st = forge__gbnf_json_object(&text); break;
    case FORGE_CONSTRAINT_CHOICES: st = forge__gbnf_choices(c->choices, c->n_choices, &text, err); break;
    default: return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "constraint: kind %d is not a forge_constraint_kind", (int)c->kind);
    }
    if (st) {
        forge__buf_free(&text);
        return st == FORGE_ERR_OUT_OF_MEMORY ? forge__fail(err, st, "out of host memory") : st;
    }
    if (c->trigger && *c->trigger) { /* after a trigger: whitespace, then the grammar */
        static const char wrap[] = "\nforge-after-trigger ::= [ \\t\\r\\n]{0,16} root\n";
        forge__buf_put(&text, wrap, sizeof wrap - 1);
    }
    if (text.oom) st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    else st = forge__gram_parse(text.p ? text.p : "", text.n, tk, out, err);
    if (!st && c->trigger && *c->trigger) { /* start at the wrapper */
        forge__gram *g = *out;
        for (uint32_t r = 0; r < g->n_rules; r++)
            if (!strcmp(g->names + g->name_at[r], "forge-after-trigger")) g->root = r;
    }
    forge__buf_free(&text);
    return st;
}

/* A matcher for constraint c (forge's own copy) over m's tokens into *out: end tokens (allowed
 * where the constraint may end) are the model's unless ignore_eos, and the caller's stop tokens.
 * On failure *out is NULL and the message in err. */
/* `arm`: NULL, or a text after which the constraint's trigger counts (forge_chat: a thinking
 * reply's end, so a tool-call opener in the thinking opens nothing); without a trigger unused. */
static forge_status forge__matcher_new(const forge_model *m, const forge_constraint *c, int ignore_eos, const int32_t *stop_tokens,
                                       int n_stop, const char *arm, forge__matcher **out, forge__err *err) {
    *out = NULL;
    if (!m->tok.n_vocab) return forge__fail(err, FORGE_ERR_UNSUPPORTED, "constraint: the model has no tokenizer");
    if (c->trigger && !forge__utf8_valid(c->trigger, strlen(c->trigger)))
        return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "constraint: the trigger is not UTF-8");
    const forge__vocab *v = forge__model_vocab(m, err);
    if (!v) return FORGE_ERR_OUT_OF_MEMORY;
    forge__matcher *g = (forge__matcher *)calloc(1, sizeof *g);
    if (!g) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    double t0 = forge__now_s();
    g->voc = v;
    g->m = m;
    g->start = -1;
    g->no_forced = c->sample_forced != 0;
    g->words = (uint32_t)(((size_t)v->n_vocab + 31) / 32);
    g->max_masks = (uint32_t)FORGE__MIN((size_t)FORGE__G_MASK_BYTES / (4 * (size_t)g->words), (size_t)1 << 20);
    g->is_end = (uint8_t *)calloc((size_t)v->n_vocab + 1, 1);
    forge_status st = g->is_end ? FORGE_OK : forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    if (!st && c->trigger && *c->trigger) {
        g->trig_len = strlen(c->trigger);
        g->trigger = strdup(c->trigger);
        g->tail = (char *)malloc(g->trig_len + 1);
        if (!g->trigger || !g->tail) st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    g->armed = !g->trigger || !arm || !*arm;
    if (!st && !g->armed) {
        g->arm_len = strlen(arm);
        g->arm = strdup(arm);
        g->arm_tail = (char *)malloc(g->arm_len + 1);
        if (!g->arm || !g->arm_tail) st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    if (!st) st = forge__constraint_compile(c, &m->tok, &g->gram, err);
    if (!st && !forge__dfa_init(&g->dfa, g->gram, &g->err)) st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    if (st) {
        forge__matcher_free(g);
        return st;
    }
    const forge__tokenizer *tk = &m->tok;
    if (!ignore_eos)
        for (int i = 0; i < tk->n_eos; i++)
            if (tk->eos_ids[i] >= 0 && tk->eos_ids[i] < v->n_vocab) g->is_end[tk->eos_ids[i]] = 1;
    for (int i = 0; i < n_stop; i++)
        if (stop_tokens && stop_tokens[i] >= 0 && stop_tokens[i] < v->n_vocab) g->is_end[stop_tokens[i]] = 1;
    if (!g->trigger) {
        g->constrained = g->ever = true;
        g->cur = forge__matcher_start(g);
        if (!g->dfa.st) forge__matcher_settle(g);
    } else {
        g->complete = true; /* free text is complete until a span opens */
        g->cur = FORGE__G_DEAD;
    }
    if (g->dfa.st) {
        st = forge__fail(err, g->dfa.st, "%s", g->err.msg);
        forge__matcher_free(g);
        return st;
    }
    g->ms = (forge__now_s() - t0) * 1e3;
    *out = g;
    return FORGE_OK;
}

/* ---- The public matcher (forge_grammar_*) ---- */

struct forge_grammar {
    forge__matcher *g;
};

FORGE_API forge_status forge_grammar_create(const forge_model *m, const forge_constraint *constraint, forge_grammar **out) {
    if (!out) return FORGE_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (!forge__model_ready(m) || !constraint) return FORGE_ERR_INVALID_ARGUMENT;
    forge__err err;
    forge_status st = forge__check_sized(constraint, "forge_constraint", &err);
    if (st) return forge__model_fail(m, st, "%s", err.msg);
    forge_constraint c;
    forge__constraint_in(constraint, &c);
    forge_grammar *gr = (forge_grammar *)calloc(1, sizeof *gr);
    if (!gr) return forge__model_fail(m, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    if ((st = forge__matcher_new(m, &c, 0, NULL, 0, NULL, &gr->g, &err))) {
        free(gr);
        return forge__model_fail(m, st, "%s", err.msg);
    }
    *out = gr;
    return FORGE_OK;
}

FORGE_API void forge_grammar_free(forge_grammar *gr) {
    if (!gr) return;
    forge__matcher_free(gr->g);
    free(gr);
}

FORGE_API const char *forge_grammar_errmsg(const forge_grammar *gr) { return gr ? gr->g->err.msg : "no grammar"; }

FORGE_API int forge_grammar_allows(forge_grammar *gr, int32_t token) {
    if (!gr || gr->g->dfa.st) return 0;
    double t0 = forge__now_s();
    int ok = forge__matcher_allows(gr->g, token) && !gr->g->dfa.st;
    gr->g->ms += (forge__now_s() - t0) * 1e3;
    return ok;
}

FORGE_API forge_status forge_grammar_mask(forge_grammar *gr, uint32_t *mask, size_t n_words) {
    if (!gr || !mask) return FORGE_ERR_INVALID_ARGUMENT;
    forge__matcher *g = gr->g;
    if (n_words < g->words) return forge__fail(&g->err, FORGE_ERR_BUFFER_TOO_SMALL, "the mask needs %u words; %zu given", g->words, n_words);
    if (g->dfa.st) return g->dfa.st;
    return forge__matcher_mask(g, mask);
}

FORGE_API forge_status forge_grammar_accept(forge_grammar *gr, int32_t token) {
    if (!gr) return FORGE_ERR_INVALID_ARGUMENT;
    forge__matcher *g = gr->g;
    if (g->dfa.st) return g->dfa.st;
    if (!forge__matcher_allows(g, token))
        return forge__fail(&g->err, FORGE_ERR_INVALID_ARGUMENT, "token %d is not allowed here", token);
    forge__matcher_accept(g, token);
    return g->dfa.st;
}

FORGE_API uint32_t forge_grammar_status(const forge_grammar *gr) {
    if (!gr) return 0;
    const forge__matcher *g = gr->g;
    return (g->complete ? FORGE_GRAMMAR_COMPLETE : 0u) | (g->done ? FORGE_GRAMMAR_DONE : 0u) | (g->dead ? FORGE_GRAMMAR_DEAD : 0u) |
           (g->constrained ? FORGE_GRAMMAR_IN_SPAN : 0u);
}

FORGE_API double forge_grammar_time_ms(const forge_grammar *gr) { return gr ? gr->g->ms : 0; }
