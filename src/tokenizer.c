/* src/tokenizer.c: Tokenizer.
 * Owns: forge__tokenizer: tokenizer.json and GGUF vocabularies, encoding and decoding. Its
 * public calls (forge_tokenize, ...) sit in api.c, with the model that holds it.
 * May call: base.c, files.c, config.c.
 *
 * What tokenizer.json declares, run the way HuggingFace tokenizers runs it, so ids match:
 *   added tokens (matched on the raw text, then on the normalized text) -> normalizer ->
 *   pre-tokenizer -> model (BPE by merge rank, or SentencePiece-style by score) ->
 *   post-processor (template ids, only when asked) ; and back: ids -> pieces -> decoder.
 * A GGUF vocabulary (tokenizer.ggml.*) is turned into the same pipeline, with the steps that
 * llama.cpp's converters stand for (tokenizer.ggml.pre names a split regex list).
 * Components are flattened at load into arrays of steps (Sequence = the steps in order). A
 * component forge does not implement is a load error that names it, never wrong ids.
 * Tables live in the model arena; each encode call works in its own scratch buffers, so a
 * loaded tokenizer is read-only and shared by threads.
 * Text comes in as bytes: invalid UTF-8 is replaced before anything else, one U+FFFD per
 * maximal invalid subpart (what Rust's String::from_utf8_lossy does, so HF sees the same).
 */

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#define FORGE__TK_MAX_STEPS 16      /* flattened normalizer / pre-tokenizer / decoder steps */
#define FORGE__TK_MAX_REGEX 32      /* compiled patterns per tokenizer */
#define FORGE__TK_MAX_TEMPLATE 8    /* ids a template adds before or after the text */

/* ---- UTF-8 ---- */

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when s[0..n) does not start with one
 * (overlongs, surrogates and values past U+10FFFF are invalid, as in Rust). *cp gets it. */
static int forge__utf8_dec(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    if (c < 0xC2 || c > 0xF4) return 0;
    int len = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (n < (size_t)len) return 0;
    unsigned c1 = s[1];
    if (c == 0xE0 && (c1 < 0xA0 || c1 > 0xBF)) return 0;
    if (c == 0xED && (c1 < 0x80 || c1 > 0x9F)) return 0;
    if (c == 0xF0 && (c1 < 0x90 || c1 > 0xBF)) return 0;
    if (c == 0xF4 && (c1 < 0x80 || c1 > 0x8F)) return 0;
    uint32_t v = c & (0xFF >> (len + 1));
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
}

/* How many bytes of s[0..n) an invalid sequence covers: the maximal prefix of a valid
 * sequence (at least 1), which from_utf8_lossy replaces by one U+FFFD. */
static size_t forge__utf8_bad_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0xC2 || c > 0xF4) return 1;
    int len = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    size_t i = 1;
    for (; i < (size_t)len && i < n; i++) {
        unsigned lo = 0x80, hi = 0xBF;
        if (i == 1) {
            if (c == 0xE0) lo = 0xA0;
            else if (c == 0xED) hi = 0x9F;
            else if (c == 0xF0) lo = 0x90;
            else if (c == 0xF4) hi = 0x8F;
        }
        if (s[i] < lo || s[i] > hi) break;
    }
    return i;
}

/* True when s[0..n) ends in the beginning of a valid sequence that more bytes could finish. */
static bool forge__utf8_incomplete_tail(const unsigned char *s, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned c = s[n - back];
        if ((c & 0xC0) == 0x80) continue;
        if (c < 0xC2 || c > 0xF4) return false;
        int len = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        return (size_t)len > back && forge__utf8_bad_len(s + n - back, back) == back;
    }
    return false;
}

static void forge__utf8_put(forge__buf *b, uint32_t cp) {
    char t[4];
    int n = 0;
    if (cp < 0x80) t[n++] = (char)cp;
    else if (cp < 0x800) { t[n++] = (char)(0xC0 | (cp >> 6)); t[n++] = (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) { t[n++] = (char)(0xE0 | (cp >> 12)); t[n++] = (char)(0x80 | ((cp >> 6) & 0x3F)); t[n++] = (char)(0x80 | (cp & 0x3F)); }
    else { t[n++] = (char)(0xF0 | (cp >> 18)); t[n++] = (char)(0x80 | ((cp >> 12) & 0x3F)); t[n++] = (char)(0x80 | ((cp >> 6) & 0x3F)); t[n++] = (char)(0x80 | (cp & 0x3F)); }
    forge__buf_put(b, t, (size_t)n);
}

/* Appends s[0..n) with every invalid sequence replaced by U+FFFD (from_utf8_lossy). */
static void forge__utf8_lossy(forge__buf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    while (i < n) {
        uint32_t cp;
        int l = forge__utf8_dec(u + i, n - i, &cp);
        if (l) { i += (size_t)l; continue; }
        forge__buf_put(b, s + run, i - run);
        forge__utf8_put(b, 0xFFFD);
        i += forge__utf8_bad_len(u + i, n - i);
        run = i;
    }
    forge__buf_put(b, s + run, n - run);
}

static bool forge__utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) { i++; continue; }
        uint32_t cp;
        int l = forge__utf8_dec(u + i, n - i, &cp);
        if (!l) return false;
        i += (size_t)l;
    }
    return true;
}

static int forge__utf8_len1(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

/* Rust's char::is_whitespace (the Unicode White_Space property). */
static bool forge__is_ws(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
/* A word character for added tokens' single_word: HF tests `\w` with Rust's regex crate,
 * which is Alphabetic, marks, Nd, Pc and the joiners. Alphabetic's Other_Alphabetic part
 * outside the marks (circled and squared letters) is listed; utf8proc has no property for it. */
static bool forge__is_word(uint32_t c) {
    if (c == '_' || c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F189)) return true;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || (k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME) ||
           k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC;
}
static bool forge__is_numeric(uint32_t c) {
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}
/* HF's Punctuation pre-tokenizer: ASCII punctuation or a Unicode P* category. */
static bool forge__is_punct(uint32_t c) {
    if (c < 128) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

/* ---- Hash tables ---- */

static uint64_t forge__hash(const void *p, size_t n) {
    const unsigned char *s = (const unsigned char *)p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ (w * 0xC2B2AE3D27D4EB4Full)) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ (w * 0xC2B2AE3D27D4EB4Full)) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 32;
    return h * 0xD6E8FEB86659FD93ull ^ (h >> 28);
}

/* text -> id, open addressing. A slot holds the key's pointer and length with the id, so a
 * lookup touches the slot and, when the length and 8 hash bits agree, the text: the big
 * vocabularies are looked up a million times while loading. */
typedef struct forge__strslot {
    const char *s;
    uint32_t len;
    uint32_t id_tag;   /* id + 1 in the low 24 bits, 8 hash bits above; 0 = empty */
} forge__strslot;

typedef struct forge__strtab {
    forge__strslot *slot;
    uint32_t mask;
} forge__strtab;

#define FORGE__TK_MAX_IDS (1 << 24) /* ids fit the slots' 24 bits */

static bool forge__strtab_init(forge__strtab *t, size_t n, forge__arena *a) {
    size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    t->slot = (forge__strslot *)forge__arena_alloc(a, cap * sizeof(forge__strslot), 64);
    t->mask = (uint32_t)(cap - 1);
    return t->slot != NULL;
}

/* The id stored for s[0..n) (whose forge__hash is h), or -1. */
static int32_t forge__strtab_get_h(const forge__strtab *t, const char *s, size_t n, uint64_t h) {
    if (!t->slot) return -1;
    uint32_t tag = (uint32_t)(h >> 56) << 24, i = (uint32_t)h & t->mask;
    for (;;) {
        const forge__strslot *e = &t->slot[i];
        if (!e->id_tag) return -1;
        if ((e->id_tag & 0xFF000000u) == tag && e->len == n && memcmp(e->s, s, n) == 0) return (int32_t)(e->id_tag & 0xFFFFFFu) - 1;
        i = (i + 1) & t->mask;
    }
}

static int32_t forge__strtab_get(const forge__strtab *t, const char *s, size_t n) {
    return forge__strtab_get_h(t, s, n, forge__hash(s, n));
}

/* Brings the slot of hash h (and, when it holds a key of length n, that key's text) into
 * the cache ahead of a lookup: loading registers a million merges, and their lookups are
 * cache misses that batches of prefetches overlap. */
static void forge__strtab_prefetch(const forge__strtab *t, uint64_t h, size_t n, int stage) {
    const forge__strslot *e = &t->slot[(uint32_t)h & t->mask];
    if (stage == 0) __builtin_prefetch(e);
    else if (e->id_tag && e->len == n) __builtin_prefetch(e->s);
}

/* Inserts s -> id (s must outlive the table); an existing equal key keeps its id unless
 * `replace` (HF: a later vocab entry with the same text wins). True when the key is new. */
static bool forge__strtab_put(forge__strtab *t, const char *s, size_t n, int32_t id, bool replace) {
    uint64_t h = forge__hash(s, n);
    uint32_t tag = (uint32_t)(h >> 56) << 24, i = (uint32_t)h & t->mask;
    for (;;) {
        forge__strslot *e = &t->slot[i];
        if (!e->id_tag) {
            *e = (forge__strslot){s, (uint32_t)n, tag | (uint32_t)(id + 1)};
            return true;
        }
        if ((e->id_tag & 0xFF000000u) == tag && e->len == n && memcmp(e->s, s, n) == 0) {
            if (replace) *e = (forge__strslot){s, (uint32_t)n, tag | (uint32_t)(id + 1)};
            return false;
        }
        i = (i + 1) & t->mask;
    }
}

/* (left id, right id) -> (rank, merged id): the BPE merges. */
typedef struct forge__merge {
    uint64_t key;      /* left << 32 | right; UINT64_MAX = empty */
    uint32_t rank;
    int32_t id;
} forge__merge;

typedef struct forge__mergetab {
    forge__merge *slot;
    uint32_t mask;
    uint32_t count;
} forge__mergetab;

static inline uint32_t forge__mix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDull;
    k ^= k >> 33;
    return (uint32_t)k;
}

static const forge__merge *forge__merge_get(const forge__mergetab *t, int32_t a, int32_t b) {
    if (!t->slot) return NULL;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = forge__mix64(key) & t->mask;
    for (;;) {
        const forge__merge *m = &t->slot[i];
        if (m->key == key) return m;
        if (m->key == UINT64_MAX) return NULL;
        i = (i + 1) & t->mask;
    }
}

static void forge__merge_put(forge__mergetab *t, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = forge__mix64(key) & t->mask;
    for (;;) {
        forge__merge *m = &t->slot[i];
        if (m->key == UINT64_MAX) { t->count++; break; }
        if (m->key == key) break; /* a repeated pair: the later line wins, as in HF's map */
        i = (i + 1) & t->mask;
    }
    t->slot[i] = (forge__merge){key, rank, id};
}

static bool forge__mergetab_init(forge__mergetab *t, size_t n, forge__arena *a) {
    size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    t->slot = (forge__merge *)forge__arena_alloc(a, cap * sizeof(forge__merge), 64);
    if (!t->slot) return false;
    memset(t->slot, 0xFF, cap * sizeof(forge__merge));
    t->mask = (uint32_t)(cap - 1);
    t->count = 0;
    return true;
}

/* ---- The tokenizer ---- */

typedef enum forge__tk_model { FORGE__TKM_NONE = 0, FORGE__TKM_BPE, FORGE__TKM_SPM } forge__tk_model;

/* A string or regex pattern (Split, Replace). */
typedef struct forge__pat {
    const char *str;           /* literal, when re is NULL */
    size_t len;
    pcre2_code *re;
} forge__pat;

typedef enum forge__norm_kind {
    FORGE__N_NFC, FORGE__N_NFD, FORGE__N_NFKC, FORGE__N_NFKD, FORGE__N_LOWER, FORGE__N_REPLACE, FORGE__N_PREPEND,
    FORGE__N_STRIP, FORGE__N_STRIP_ACCENTS
} forge__norm_kind;

typedef struct forge__norm_step {
    forge__norm_kind kind;
    forge__pat pat;            /* Replace */
    const char *s;             /* Replace content, Prepend text */
    size_t len;
    bool left, right;          /* Strip */
} forge__norm_step;

/* How a split keeps what its pattern matched (HF SplitDelimiterBehavior). */
typedef enum forge__split_beh {
    FORGE__SB_REMOVED, FORGE__SB_ISOLATED, FORGE__SB_MERGED_PREV, FORGE__SB_MERGED_NEXT, FORGE__SB_CONTIGUOUS
} forge__split_beh;

typedef enum forge__pre_kind {
    FORGE__P_SPLIT, FORGE__P_BYTELEVEL, FORGE__P_METASPACE, FORGE__P_DIGITS, FORGE__P_PUNCT, FORGE__P_WHITESPACE,
    FORGE__P_WSSPLIT
} forge__pre_kind;

typedef struct forge__pre_step {
    forge__pre_kind kind;
    forge__pat pat;            /* Split; Whitespace and ByteLevel use their regex here */
    forge__split_beh beh;
    bool invert;
    bool add_prefix_space;     /* ByteLevel */
    bool use_regex;            /* ByteLevel */
    bool individual;           /* Digits */
    uint32_t repl;             /* Metaspace replacement character */
    int prepend;               /* Metaspace: 0 never, 1 first, 2 always */
    bool split;                /* Metaspace */
} forge__pre_step;

typedef enum forge__dec_kind {
    FORGE__D_BYTELEVEL, FORGE__D_METASPACE, FORGE__D_REPLACE, FORGE__D_BYTEFALLBACK, FORGE__D_FUSE, FORGE__D_STRIP
} forge__dec_kind;

typedef struct forge__dec_step {
    forge__dec_kind kind;
    forge__pat pat;            /* Replace */
    const char *s;             /* Replace content */
    size_t len;
    uint32_t ch;               /* Metaspace replacement, Strip content */
    int prepend;               /* Metaspace */
    int start, stop;           /* Strip */
} forge__dec_step;

/* An added token: matched in the text before the model runs (HF AddedVocabulary). */
typedef struct forge__added {
    const char *s;
    uint32_t len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} forge__added;

/* Byte trie over added-token texts, for leftmost-longest matching. Children live in one
 * hash table keyed (node << 8 | byte). */
typedef struct forge__trie {
    uint64_t *keys;            /* node << 8 | byte, + 1; 0 empty */
    uint32_t *child;
    uint32_t mask;
    int32_t *term;             /* per node: index into added[] of the token ending there, or -1 */
    uint32_t n_nodes;
    bool first[256];           /* bytes that start some token */
} forge__trie;

typedef struct forge__tokenizer {
    int n_vocab;                 /* ids are 0..n_vocab-1 (model vocabulary and added tokens) */
    const char **pieces;         /* [n_vocab] NUL-terminated text of each id (HF id_to_token: an
                                  * added token's text first); NULL for holes */
    uint32_t *piece_len;         /* [n_vocab] */
    float *scores;               /* [n_vocab] SentencePiece scores (GGUF llama), else NULL */
    uint8_t *is_special;         /* [n_vocab] 1 for special added tokens (skip_special, PARSE_SPECIAL) */
    forge__tk_model model;
    forge__strtab vocab;         /* the model's vocabulary: piece -> id */
    forge__strtab addtab;        /* added tokens' text -> id (looked up before the vocabulary, as HF) */
    forge__mergetab merges;
    bool byte_fallback, ignore_merges, fuse_unk;
    int32_t model_unk;           /* the model's unk_token id, -1 when it has none */
    const char *cont_prefix, *eow_suffix;
    size_t cont_prefix_len, eow_suffix_len;
    int32_t byte_id[256];        /* <0xXX> tokens for byte fallback, -1 when absent */
    forge__added *added;
    int n_added;
    forge__trie trie_raw, trie_norm;   /* added tokens with normalized = false / true */
    forge__norm_step norm[FORGE__TK_MAX_STEPS];
    int n_norm;
    forge__pre_step pre[FORGE__TK_MAX_STEPS];
    int n_pre;
    forge__dec_step dec[FORGE__TK_MAX_STEPS];
    int n_dec;
    bool has_decoder;            /* without one, HF joins pieces with " " */
    int32_t tmpl_pre[FORGE__TK_MAX_TEMPLATE], tmpl_post[FORGE__TK_MAX_TEMPLATE];
    int n_tmpl_pre, n_tmpl_post; /* ids the post-processor adds around the text */
    /* ... and around a pair of texts (cross-encoders): before A, between A and B, after B;
     * without a pair template the two are joined bare (transformers' default) */
    int32_t tmpl_pair[3][FORGE__TK_MAX_TEMPLATE];
    int n_tmpl_pair[3];
    pcre2_code *regex[FORGE__TK_MAX_REGEX];
    int n_regex;
    int32_t bos, eos, eot, pad, unk, sot;
    int32_t eos_ids[8];
    int n_eos;
} forge__tokenizer;

static void forge__tokenizer_free(forge__tokenizer *tk) {
    for (int i = 0; i < tk->n_regex; i++) pcre2_code_free(tk->regex[i]);
    tk->n_regex = 0;
}

static void forge__tokenizer_reset(forge__tokenizer *tk) {
    memset(tk, 0, sizeof *tk);
    tk->bos = tk->eos = tk->eot = tk->pad = tk->unk = tk->sot = tk->model_unk = -1;
    for (int i = 0; i < 256; i++) tk->byte_id[i] = -1;
}

/* ---- Regexes: HF's patterns are Oniguruma's; PCRE2 (UTF, UCP, JIT) runs them. The class
 * escapes whose meaning differs are rewritten to explicit Unicode sets: Oniguruma's \s is
 * White_Space (PCRE2's lacks U+0085), \w is UTS #18's word class (Alphabetic, marks, Nd,
 * Pc, joiners; Other_Alphabetic letters listed), and \h is a hex digit. ---- */

#define FORGE__RE_WS "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
#define FORGE__RE_WORD "\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{200c}\\x{200d}\\x{24b6}-\\x{24e9}\\x{1f130}-\\x{1f189}"

static bool forge__regex_translate(const char *src, size_t n, forge__buf *out) {
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = src[i];
        if (c == '\\' && i + 1 < n) {
            char e = src[i + 1];
            const char *set = e == 's' || e == 'S' ? FORGE__RE_WS : e == 'w' || e == 'W' ? FORGE__RE_WORD
                            : e == 'h' || e == 'H' ? "0-9a-fA-F" : NULL;
            bool neg = e == 'S' || e == 'W' || e == 'H';
            if (set && in_class && !neg) {
                forge__buf_put(out, set, strlen(set));
            } else if (set && !in_class) {
                forge__buf_put(out, neg ? "[^" : "[", neg ? 2 : 1);
                forge__buf_put(out, set, strlen(set));
                forge__buf_put(out, "]", 1);
            } else {
                forge__buf_put(out, src + i, 2); /* includes a negated class escape inside [] */
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            forge__buf_put(out, src + i, 1);
            if (i + 1 < n && src[i + 1] == '^') forge__buf_put(out, src + ++i, 1);
            if (i + 1 < n && src[i + 1] == ']') forge__buf_put(out, src + ++i, 1); /* literal ] first */
            continue;
        }
        if (in_class && c == ']') in_class = false;
        forge__buf_put(out, src + i, 1);
    }
    return !out->oom;
}

static forge_status forge__tk_regex(forge__tokenizer *tk, const char *pat, size_t n, pcre2_code **out, const char *path,
                                    const char *what, forge__err *err) {
    if (tk->n_regex >= FORGE__TK_MAX_REGEX)
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: %s: more than %d regexes", path, what, FORGE__TK_MAX_REGEX);
    forge__buf b;
    forge__buf_init(&b, NULL, 0);
    if (!forge__regex_translate(pat, n, &b)) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(b.p ? b.p : ""), b.n, PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
    forge__buf_free(&b);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: %s: regex '%.*s' does not compile: %s", path, what,
                           (int)FORGE__MIN(n, 200), pat, (const char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT (unsupported CPU) the interpreter runs it */
    tk->regex[tk->n_regex++] = re;
    *out = re;
    return FORGE_OK;
}

/* ---- A focused JSON reader for tokenizer.json: the vocabulary and merges are hundreds of
 * thousands of entries (gemma3's file is 33 MB), read straight from the mapping; the small
 * components go through cJSON. ---- */

typedef struct forge__js {
    const char *p, *end;
    bool bad;
} forge__js;

static void forge__js_ws(forge__js *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t')) j->p++;
}
static bool forge__js_eat(forge__js *j, char c) {
    forge__js_ws(j);
    if (j->p < j->end && *j->p == c) { j->p++; return true; }
    return false;
}

static int forge__hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Decodes the JSON string at j->p (after whitespace) into out (appended, not terminated).
 * Text that is not valid UTF-8 fails it (JSON is UTF-8; HF refuses such a file too). */
static bool forge__js_str(forge__js *j, forge__buf *out) {
    forge__js_ws(j);
    if (j->p >= j->end || *j->p != '"') return !(j->bad = true);
    j->p++;
    const char *run = j->p;
    size_t start = out->n;
    bool high = false;
    while (j->p < j->end) {
        char c = *j->p;
        if (c == '"') {
            forge__buf_put(out, run, (size_t)(j->p - run));
            j->p++;
            if (out->oom) return false;
            if (high && !forge__utf8_valid(out->p + start, out->n - start)) return !(j->bad = true);
            return true;
        }
        if ((unsigned char)c >= 0x80) high = true;
        if ((unsigned char)c < 0x20) break;
        if (c != '\\') { j->p++; continue; }
        forge__buf_put(out, run, (size_t)(j->p - run));
        if (j->end - j->p < 2) break;
        char e = j->p[1];
        j->p += 2;
        char lit = e == '"' ? '"' : e == '\\' ? '\\' : e == '/' ? '/' : e == 'b' ? '\b' : e == 'f' ? '\f'
                 : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : 0;
        if (lit) {
            forge__buf_put(out, &lit, 1);
        } else if (e == 'u') {
            uint32_t cp = 0;
            if (j->end - j->p < 4) break;
            for (int k = 0; k < 4; k++) {
                int h = forge__hexval(j->p[k]);
                if (h < 0) return !(j->bad = true);
                cp = cp * 16 + (uint32_t)h;
            }
            j->p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF && j->end - j->p >= 6 && j->p[0] == '\\' && j->p[1] == 'u') {
                uint32_t lo = 0;
                bool ok = true;
                for (int k = 0; k < 4; k++) {
                    int h = forge__hexval(j->p[2 + k]);
                    if (h < 0) ok = false;
                    lo = lo * 16 + (uint32_t)(h < 0 ? 0 : h);
                }
                if (ok && lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    j->p += 6;
                }
            }
            if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD; /* a lone surrogate: serde_json refuses it, we replace */
            forge__utf8_put(out, cp);
        } else {
            break;
        }
        run = j->p;
    }
    j->bad = true;
    return false;
}

/* Skips one value of any type; bounded nesting, no recursion. With `count`, adds the number
 * of elements of the (array) value to it. */
static bool forge__js_skip_n(forge__js *j, size_t *count) {
    int depth = 0;
    bool any = false;
    forge__js_ws(j);
    do {
        forge__js_ws(j);
        if (j->p >= j->end) return !(j->bad = true);
        char c = *j->p;
        if (c == '"') { /* to the next quote not escaped by an odd run of backslashes */
            const char *from = ++j->p;
            for (;;) {
                const char *q = (const char *)memchr(from, '"', (size_t)(j->end - from));
                if (!q) return !(j->bad = true);
                const char *b = q;
                while (b > j->p && b[-1] == '\\') b--;
                from = q + 1;
                if (((q - b) & 1) == 0) break;
            }
            j->p = from;
        } else if (c == '{' || c == '[') {
            if (++depth > 512) return !(j->bad = true);
            j->p++;
            continue;
        } else if (c == '}' || c == ']') {
            if (depth == 0) return !(j->bad = true);
            depth--;
            j->p++;
        } else if (c == ',' || c == ':') {
            if (count && depth == 1 && c == ',') (*count)++;
            j->p++;
            continue;
        } else {
            const char *s = j->p;
            while (j->p < j->end) {
                char d = *j->p;
                if (d == ',' || d == ':' || d == ']' || d == '}' || d == ' ' || d == '\t' || d == '\r' || d == '\n') break;
                j->p++;
            }
            if (j->p == s) return !(j->bad = true);
        }
        if (depth == 1) any = true;
    } while (depth > 0);
    if (count && any) (*count)++;
    return true;
}
static bool forge__js_skip(forge__js *j) { return forge__js_skip_n(j, NULL); }

static bool forge__js_int(forge__js *j, int64_t *v) {
    forge__js_ws(j);
    const char *s = j->p;
    bool neg = false;
    if (s < j->end && *s == '-') { neg = true; s++; }
    int64_t x = 0;
    const char *d = s;
    while (s < j->end && *s >= '0' && *s <= '9' && x < ((int64_t)1 << 40)) x = x * 10 + (*s++ - '0');
    if (s == d || (s < j->end && (*s == '.' || *s == 'e' || *s == 'E' || (*s >= '0' && *s <= '9')))) return !(j->bad = true);
    j->p = s;
    *v = neg ? -x : x;
    return true;
}

/* ---- Added-token trie ---- */

static bool forge__trie_build(forge__trie *t, const forge__added *added, int n_added, bool normalized, forge__arena *a) {
    size_t bytes = 1;
    for (int i = 0; i < n_added; i++)
        if (added[i].normalized == normalized) bytes += added[i].len;
    memset(t, 0, sizeof *t);
    if (bytes == 1) return true;
    size_t cap = 16;
    while (cap < bytes * 2) cap *= 2;
    t->keys = (uint64_t *)forge__arena_alloc(a, cap * sizeof(uint64_t), 64);
    t->child = (uint32_t *)forge__arena_alloc(a, cap * sizeof(uint32_t), 64);
    t->term = (int32_t *)forge__arena_alloc(a, bytes * sizeof(int32_t), 64);
    if (!t->keys || !t->child || !t->term) return false;
    t->mask = (uint32_t)(cap - 1);
    t->n_nodes = 1;
    t->term[0] = -1;
    for (int i = 0; i < n_added; i++) {
        if (added[i].normalized != normalized || added[i].len == 0) continue;
        uint32_t node = 0;
        for (uint32_t k = 0; k < added[i].len; k++) {
            unsigned char c = (unsigned char)added[i].s[k];
            uint64_t key = (((uint64_t)node << 8) | c) + 1;
            uint32_t h = forge__mix64(key) & t->mask;
            while (t->keys[h] && t->keys[h] != key) h = (h + 1) & t->mask;
            if (!t->keys[h]) {
                t->keys[h] = key;
                t->child[h] = t->n_nodes;
                t->term[t->n_nodes++] = -1;
            }
            node = t->child[h];
        }
        if (t->term[node] < 0) t->term[node] = i; /* the same text twice: the first one wins */
        t->first[(unsigned char)added[i].s[0]] = true;
    }
    return true;
}

static inline int64_t forge__trie_step(const forge__trie *t, uint32_t node, unsigned char c) {
    uint64_t key = (((uint64_t)node << 8) | c) + 1;
    uint32_t h = forge__mix64(key) & t->mask;
    while (t->keys[h]) {
        if (t->keys[h] == key) return t->child[h];
        h = (h + 1) & t->mask;
    }
    return -1;
}

/* The longest added token that starts at s[0]: its index, its length in *len; -1 if none. */
static int forge__trie_longest(const forge__trie *t, const char *s, size_t n, size_t *len) {
    if (!t->keys || !t->first[(unsigned char)s[0]]) return -1;
    int best = -1;
    uint32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t nx = forge__trie_step(t, node, (unsigned char)s[i]);
        if (nx < 0) break;
        node = (uint32_t)nx;
        if (t->term[node] >= 0) { best = t->term[node]; *len = i + 1; }
    }
    return best;
}

/* ---- Byte-level alphabet (GPT-2): every byte is shown as a printable character; the
 * printable ones stand for themselves, the other 68 become U+0100.. in byte order. ---- */

static uint32_t forge__bl_cp(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    if (b <= 32) return 256 + b;
    if (b <= 160) return 289 + (b - 127);
    return 323; /* 173 */
}
/* The byte a byte-level character stands for, or -1. */
static int forge__bl_byte(uint32_t cp) {
    if (cp < 256) return forge__bl_cp(cp) == cp ? (int)cp : -1;
    if (cp <= 288) return (int)(cp - 256);
    if (cp <= 322) return (int)(cp - 289 + 127);
    return cp == 323 ? 173 : -1;
}

/* ---- Encoding ---- */

typedef struct forge__span {
    uint32_t off, len;
    bool first;          /* starts at offset 0 of the original text (Metaspace prepend_scheme "first") */
} forge__span;

typedef struct forge__seg {
    uint32_t off, len;
    int32_t id;          /* an added token, or -1 for text */
} forge__seg;

typedef struct forge__mark {
    uint32_t s, e;
    bool m;              /* a match of the split pattern */
} forge__mark;

typedef struct forge__sym {
    int32_t id, prev, next;
    uint32_t off, len;   /* bytes of the word this symbol covers */
} forge__sym;

typedef struct forge__heapent {
    uint64_t key;        /* BPE: rank << 32 | pos; SPM: see forge__spm_key */
    int32_t a, b;        /* BPE: merged id; SPM: left, right symbol */
    uint32_t size;       /* SPM: byte length of the pair when it was queued */
} forge__heapent;

typedef struct forge__tkwork {
    const forge__tokenizer *tk;
    forge__buf ids;                /* int32_t output */
    forge__buf input;              /* lossy copy of invalid input */
    forge__buf norm, ntmp;         /* normalized segment, normalizer scratch */
    forge__buf text[2];            /* pre-tokenizer outputs (ping-pong) */
    forge__buf spans[2], marks, segs_raw, segs_norm, iv;
    forge__buf sym, heap, tmp;
    pcre2_match_data *md;
    bool parse_special;
} forge__tkwork;

static void forge__tkwork_init(forge__tkwork *w, const forge__tokenizer *tk) {
    memset(w, 0, sizeof *w);
    w->tk = tk;
}
/* Every scratch buffer of w (for freeing it and for the out-of-memory check); returns the count. */
static size_t forge__tkwork_bufs(forge__tkwork *w, forge__buf *bs[16]) {
    forge__buf *all[] = {&w->ids, &w->input, &w->norm, &w->ntmp, &w->text[0], &w->text[1], &w->spans[0], &w->spans[1], &w->marks,
                         &w->segs_raw, &w->segs_norm, &w->iv, &w->sym, &w->heap, &w->tmp};
    memcpy(bs, all, sizeof all);
    return FORGE__ARRAY_LEN(all);
}
static void forge__tkwork_free(forge__tkwork *w) {
    forge__buf *bs[16];
    for (size_t i = 0, n = forge__tkwork_bufs(w, bs); i < n; i++) forge__buf_free(bs[i]);
    if (w->md) pcre2_match_data_free(w->md);
    w->md = NULL;
}
static bool forge__tkwork_oom(forge__tkwork *w) {
    forge__buf *bs[16];
    for (size_t i = 0, n = forge__tkwork_bufs(w, bs); i < n; i++)
        if (bs[i]->oom) return true;
    return false;
}

/* Leftmost-longest added-token matches in s[0..n), as HF's AddedVocabulary finds them:
 * the scan resumes after every match, even one it then ignores (a special token when
 * special text is not parsed, a single_word token inside a word). */
static void forge__tk_split_added(forge__tkwork *w, const forge__trie *t, const char *s, size_t n, forge__buf *out) {
    const forge__tokenizer *tk = w->tk;
    out->n = 0;
    size_t start_offset = 0, pos = 0;
    while (t->keys && pos < n) {
        size_t mlen = 0;
        if (!t->first[(unsigned char)s[pos]]) { pos++; continue; }
        int k = forge__trie_longest(t, s + pos, n - pos, &mlen);
        if (k < 0) { pos++; continue; }
        const forge__added *ad = &tk->added[k];
        size_t start = pos, stop = pos + mlen;
        pos = stop;
        if (ad->special && !w->parse_special) continue;
        if (ad->single_word) {
            bool word_before = false, word_after = false;
            if (start > 0) {
                size_t b = start - 1;
                while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
                uint32_t cp;
                if (forge__utf8_dec((const unsigned char *)s + b, start - b, &cp)) word_before = forge__is_word(cp);
            }
            if (stop < n) {
                uint32_t cp;
                if (forge__utf8_dec((const unsigned char *)s + stop, n - stop, &cp)) word_after = forge__is_word(cp);
            }
            if (word_before || word_after) continue;
        }
        if (ad->lstrip) {
            size_t b = start;
            while (b > 0) {
                size_t c = b - 1;
                while (c > 0 && ((unsigned char)s[c] & 0xC0) == 0x80) c--;
                uint32_t cp;
                if (!forge__utf8_dec((const unsigned char *)s + c, b - c, &cp) || !forge__is_ws(cp)) break;
                b = c;
            }
            start = FORGE__MAX(b, start_offset);
        }
        if (ad->rstrip) {
            uint32_t cp;
            int l;
            while (stop < n && (l = forge__utf8_dec((const unsigned char *)s + stop, n - stop, &cp)) && forge__is_ws(cp)) stop += (size_t)l;
        }
        if (start_offset < start) FORGE__VEC_PUSH(out, forge__seg, ((forge__seg){(uint32_t)start_offset, (uint32_t)(start - start_offset), -1}));
        FORGE__VEC_PUSH(out, forge__seg, ((forge__seg){(uint32_t)start, (uint32_t)(stop - start), ad->id}));
        start_offset = stop;
    }
    if (start_offset < n) FORGE__VEC_PUSH(out, forge__seg, ((forge__seg){(uint32_t)start_offset, (uint32_t)(n - start_offset), -1}));
}

/* Appends the unicode normalization of s (form: UTF8PROC_* options) to out. ASCII runs are
 * their own normal form in all four forms, so only the rest goes through utf8proc: a run
 * that has non-ASCII characters starts at the ASCII character before it (a base that a
 * combining mark may compose with) and ends before the next ASCII character. */
static void forge__tk_unicode_norm(forge__buf *out, const char *s, size_t n, int options) {
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && (unsigned char)s[j] < 0x80) j++;
        if (j == n) { forge__buf_put(out, s + i, n - i); break; }
        size_t k = j > i ? j - 1 : j; /* keep the base character with the run */
        forge__buf_put(out, s + i, k - i);
        size_t e = j;
        while (e < n && (unsigned char)s[e] >= 0x80) e++;
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s + k, (utf8proc_ssize_t)(e - k), &dst, (utf8proc_option_t)options);
        if (r >= 0) forge__buf_put(out, dst, (size_t)r);
        else forge__buf_put(out, s + k, e - k); /* cannot happen on valid UTF-8 */
        free(dst);
        i = e;
    }
}

/* All matches of a pattern in s[0..n), as (start, end) pairs appended to iv (uint32 x2).
 * After an empty match the search moves on by one character. */
static void forge__pat_find(pcre2_match_data **md, const forge__pat *p, const char *s, size_t n, forge__buf *iv) {
    iv->n = 0;
    if (p->re) {
        if (!*md && !(*md = pcre2_match_data_create(1, NULL))) { iv->oom = true; return; }
        size_t start = 0;
        while (start <= n) {
            int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, *md, NULL);
            if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* the interpreter keeps its backtracking on the heap */
                rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, *md, NULL);
            if (rc < 0) break;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(*md);
            uint32_t pr[2] = {(uint32_t)ov[0], (uint32_t)ov[1]};
            forge__buf_put(iv, pr, sizeof pr);
            if (ov[1] > ov[0]) start = ov[1];
            else if (ov[1] < n) start = ov[1] + (size_t)forge__utf8_len1((unsigned char)s[ov[1]]);
            else break;
        }
    } else if (p->len) {
        size_t i = 0;
        while (i + p->len <= n) {
            const char *f = (const char *)memmem(s + i, n - i, p->str, p->len);
            if (!f) break;
            uint32_t pr[2] = {(uint32_t)(f - s), (uint32_t)(f - s + p->len)};
            forge__buf_put(iv, pr, sizeof pr);
            i = (size_t)(f - s) + p->len;
        }
    }
}

/* Appends s[0..n) to out with every match of p replaced by rep (Replace normalizer and
 * decoder); md and iv are the caller's scratch. */
static void forge__pat_replace(pcre2_match_data **md, forge__buf *iv, const forge__pat *p, const char *s, size_t n, const char *rep,
                               size_t rep_len, forge__buf *out) {
    forge__pat_find(md, p, s, n, iv);
    size_t prev = 0, m = iv->n / 8;
    for (size_t k = 0; k < m; k++) {
        const uint32_t *pr = (const uint32_t *)iv->p + 2 * k;
        forge__buf_put(out, s + prev, pr[0] - prev);
        forge__buf_put(out, rep, rep_len);
        prev = pr[1];
    }
    forge__buf_put(out, s + prev, n - prev);
}

static void forge__tk_lower(forge__buf *out, const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int l = forge__utf8_dec((const unsigned char *)s + i, n - i, &cp);
        if (!l) { l = 1; cp = 0xFFFD; }
        if (cp < 0x80) { char c = (char)(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp); forge__buf_put(out, &c, 1); }
        else if (cp == 0x130) forge__buf_put(out, "i\xcc\x87", 3); /* Rust: İ -> "i̇", the one two-character lowercase */
        else forge__utf8_put(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
        i += (size_t)l;
    }
}

/* Runs the normalizer steps on s[0..n); the result is w->norm. */
static void forge__tk_normalize(forge__tkwork *w, const char *s, size_t n) {
    const forge__tokenizer *tk = w->tk;
    forge__buf *cur = &w->norm, *nxt = &w->ntmp;
    cur->n = 0;
    forge__buf_put(cur, s, n);
    for (int i = 0; i < tk->n_norm; i++) {
        const forge__norm_step *st = &tk->norm[i];
        const char *c = cur->p ? cur->p : "";
        size_t cn = cur->n;
        nxt->n = 0;
        switch (st->kind) {
        case FORGE__N_NFC: forge__tk_unicode_norm(nxt, c, cn, UTF8PROC_STABLE | UTF8PROC_COMPOSE); break;
        case FORGE__N_NFD: forge__tk_unicode_norm(nxt, c, cn, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE); break;
        case FORGE__N_NFKC: forge__tk_unicode_norm(nxt, c, cn, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT); break;
        case FORGE__N_NFKD: forge__tk_unicode_norm(nxt, c, cn, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT); break;
        case FORGE__N_LOWER: forge__tk_lower(nxt, c, cn); break;
        case FORGE__N_PREPEND:
            if (cn) forge__buf_put(nxt, st->s, st->len);
            forge__buf_put(nxt, c, cn);
            break;
        case FORGE__N_STRIP: {
            size_t a = 0, b = cn;
            uint32_t cp;
            int l;
            while (st->left && a < b && (l = forge__utf8_dec((const unsigned char *)c + a, b - a, &cp)) && forge__is_ws(cp)) a += (size_t)l;
            while (st->right && b > a) {
                size_t p = b - 1;
                while (p > a && ((unsigned char)c[p] & 0xC0) == 0x80) p--;
                if (!forge__utf8_dec((const unsigned char *)c + p, b - p, &cp) || !forge__is_ws(cp)) break;
                b = p;
            }
            forge__buf_put(nxt, c + a, b - a);
            break;
        }
        case FORGE__N_STRIP_ACCENTS: {
            size_t k = 0;
            uint32_t cp;
            while (k < cn) {
                int l = forge__utf8_dec((const unsigned char *)c + k, cn - k, &cp);
                if (!l) l = 1;
                utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
                if (cat < UTF8PROC_CATEGORY_MN || cat > UTF8PROC_CATEGORY_ME) forge__buf_put(nxt, c + k, (size_t)l); /* HF drops every mark */
                k += (size_t)l;
            }
            break;
        }
        case FORGE__N_REPLACE: forge__pat_replace(&w->md, &w->iv, &st->pat, c, cn, st->s, st->len, nxt); break;
        }
        forge__buf *t = cur;
        cur = nxt;
        nxt = t;
    }
    if (cur != &w->norm) { /* keep the result in w->norm */
        forge__buf t = w->norm;
        w->norm = *cur;
        *cur = t;
    }
}

/* Match intervals of one pre-tokenizer step over s[0..n) into w->marks. */
static void forge__tk_marks(forge__tkwork *w, const forge__pre_step *st, const char *s, size_t n) {
    forge__buf *mk = &w->marks;
    mk->n = 0;
    if (st->kind == FORGE__P_SPLIT || st->kind == FORGE__P_WHITESPACE) {
        forge__pat_find(&w->md, &st->pat, s, n, &w->iv);
        size_t prev = 0, m = w->iv.n / 8;
        bool inv = st->kind == FORGE__P_WHITESPACE ? true : st->invert;
        for (size_t k = 0; k < m; k++) {
            uint32_t *pr = (uint32_t *)w->iv.p + 2 * k;
            if (prev != pr[0]) FORGE__VEC_PUSH(mk, forge__mark, ((forge__mark){(uint32_t)prev, pr[0], inv}));
            FORGE__VEC_PUSH(mk, forge__mark, ((forge__mark){pr[0], pr[1], !inv}));
            prev = pr[1];
        }
        if (prev != n) FORGE__VEC_PUSH(mk, forge__mark, ((forge__mark){(uint32_t)prev, (uint32_t)n, inv}));
        return;
    }
    /* a character predicate: every matching character is its own match */
    size_t last = 0, i = 0;
    while (i < n) {
        uint32_t cp;
        int l = forge__utf8_dec((const unsigned char *)s + i, n - i, &cp);
        if (!l) { l = 1; cp = 0xFFFD; }
        bool m = st->kind == FORGE__P_DIGITS ? forge__is_numeric(cp) : st->kind == FORGE__P_PUNCT ? forge__is_punct(cp)
               : st->kind == FORGE__P_WSSPLIT ? forge__is_ws(cp) : cp == st->repl;
        if (m) {
            if (last < i) FORGE__VEC_PUSH(mk, forge__mark, ((forge__mark){(uint32_t)last, (uint32_t)i, false}));
            FORGE__VEC_PUSH(mk, forge__mark, ((forge__mark){(uint32_t)i, (uint32_t)(i + (size_t)l), true}));
            last = i + (size_t)l;
        }
        i += (size_t)l;
    }
    if (last < n) FORGE__VEC_PUSH(mk, forge__mark, ((forge__mark){(uint32_t)last, (uint32_t)n, false}));
}

/* Applies a split behavior to w->marks and appends the non-empty pieces of span `sp` to out. */
static void forge__tk_apply_split(forge__tkwork *w, forge__split_beh beh, forge__span sp, forge__buf *out) {
    size_t m = FORGE__VEC_LEN(&w->marks, forge__mark);
    forge__mark *mk = (forge__mark *)w->marks.p;
    /* fold into pieces in place: pieces never outnumber marks */
    size_t np = 0;
    bool prev_match = false;
    if (beh == FORGE__SB_MERGED_NEXT) {
        for (size_t k = m; k-- > 0;) { /* right to left, as HF folds the reversed list */
            forge__mark x = mk[k];
            if (x.m && !prev_match && np > 0) mk[m - np].s = x.s; /* merge into the piece after */
            else { mk[m - 1 - np] = (forge__mark){x.s, x.e, false}; np++; }
            prev_match = x.m;
        }
        mk += m - np;
    } else {
        for (size_t k = 0; k < m; k++) {
            forge__mark x = mk[k];
            bool merge = beh == FORGE__SB_MERGED_PREV ? (x.m && !prev_match && np > 0)
                       : beh == FORGE__SB_CONTIGUOUS ? (x.m == prev_match && np > 0) : false;
            if (beh == FORGE__SB_REMOVED) {
                if (!x.m) mk[np++] = x;
            } else if (merge) {
                mk[np - 1].e = x.e;
            } else {
                mk[np++] = (forge__mark){x.s, x.e, false};
            }
            prev_match = x.m;
        }
    }
    for (size_t k = 0; k < np; k++)
        if (mk[k].e > mk[k].s)
            FORGE__VEC_PUSH(out, forge__span, ((forge__span){sp.off + mk[k].s, mk[k].e - mk[k].s, sp.first && mk[k].s == 0}));
}

static void forge__bl_put(forge__buf *out, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) forge__utf8_put(out, forge__bl_cp((unsigned char)s[i]));
}

/* Runs the pre-tokenizer steps over w->spans[0] (text at *base); the final spans are in
 * w->spans[*which], their text at *base. */
static void forge__tk_pretokenize(forge__tkwork *w, const char **base, int *which) {
    const forge__tokenizer *tk = w->tk;
    int cur = 0, tb = 0;
    for (int i = 0; i < tk->n_pre; i++) {
        const forge__pre_step *st = &tk->pre[i];
        forge__buf *in = &w->spans[cur], *out = &w->spans[1 - cur];
        out->n = 0;
        size_t ns = FORGE__VEC_LEN(in, forge__span);
        const char *b = *base;
        if (st->kind == FORGE__P_BYTELEVEL || st->kind == FORGE__P_METASPACE) {
            /* transforming steps write their pieces into a fresh text buffer */
            forge__buf *tx = &w->text[tb];
            tx->n = 0;
            for (size_t k = 0; k < ns; k++) {
                forge__span sp = FORGE__VEC_AT(in, forge__span, k);
                const char *s = b + sp.off;
                forge__buf *t = &w->tmp;
                t->n = 0;
                if (st->kind == FORGE__P_BYTELEVEL) {
                    if (st->add_prefix_space && (sp.len == 0 || s[0] != ' ')) forge__buf_put(t, " ", 1);
                    forge__buf_put(t, s, sp.len);
                    forge__span whole = {0, (uint32_t)t->n, sp.first};
                    size_t o0 = FORGE__VEC_LEN(out, forge__span);
                    if (st->use_regex) {
                        forge__pre_step iso = {.kind = FORGE__P_SPLIT, .pat = st->pat, .beh = FORGE__SB_ISOLATED};
                        forge__tk_marks(w, &iso, t->p ? t->p : "", t->n);
                        forge__tk_apply_split(w, FORGE__SB_ISOLATED, whole, out);
                    } else if (whole.len) {
                        FORGE__VEC_PUSH(out, forge__span, whole);
                    }
                    size_t o1 = FORGE__VEC_LEN(out, forge__span);
                    for (size_t q = o0; q < o1; q++) { /* map each piece into tx */
                        forge__span *ps = &FORGE__VEC_AT(out, forge__span, q);
                        uint32_t start = (uint32_t)tx->n;
                        forge__bl_put(tx, t->p + ps->off, ps->len);
                        ps->off = start;
                        ps->len = (uint32_t)tx->n - start;
                    }
                } else {
                    char rep[4];
                    forge__buf rb;
                    forge__buf_init(&rb, rep, sizeof rep);
                    forge__utf8_put(&rb, st->repl);
                    bool starts = sp.len >= rb.n && !memcmp(s, rep, rb.n);
                    bool starts_space = sp.len > 0 && s[0] == ' ';
                    uint32_t start = (uint32_t)tx->n;
                    if ((st->prepend == 2 || (st->prepend == 1 && sp.first)) && !starts && !starts_space) forge__buf_put(tx, rep, rb.n);
                    for (uint32_t q = 0; q < sp.len; q++) {
                        if (s[q] == ' ') forge__buf_put(tx, rep, rb.n);
                        else forge__buf_put(tx, s + q, 1);
                    }
                    forge__span piece = {start, (uint32_t)tx->n - start, sp.first};
                    if (st->split) {
                        forge__tk_marks(w, st, tx->p + piece.off, piece.len);
                        forge__tk_apply_split(w, FORGE__SB_MERGED_NEXT, piece, out);
                    } else if (piece.len) {
                        FORGE__VEC_PUSH(out, forge__span, piece);
                    }
                }
            }
            *base = tx->p ? tx->p : "";
            tb = 1 - tb;
        } else {
            forge__split_beh beh = st->kind == FORGE__P_SPLIT || st->kind == FORGE__P_PUNCT ? st->beh
                                 : st->kind == FORGE__P_DIGITS ? (st->individual ? FORGE__SB_ISOLATED : FORGE__SB_CONTIGUOUS)
                                 : FORGE__SB_REMOVED;
            for (size_t k = 0; k < ns; k++) {
                forge__span sp = FORGE__VEC_AT(in, forge__span, k);
                forge__tk_marks(w, st, b + sp.off, sp.len);
                forge__tk_apply_split(w, beh, sp, out);
            }
        }
        cur = 1 - cur;
    }
    *which = cur;
}

/* ---- Models ---- */

static void forge__heap_push(forge__buf *h, forge__heapent e, bool (*less)(const forge__heapent *, const forge__heapent *)) {
    forge__buf_put(h, &e, sizeof e);
    if (h->oom) return;
    forge__heapent *v = (forge__heapent *)h->p;
    size_t i = h->n / sizeof e - 1;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!less(&v[i], &v[p])) break;
        forge__heapent t = v[i]; v[i] = v[p]; v[p] = t;
        i = p;
    }
}
static forge__heapent forge__heap_pop(forge__buf *h, bool (*less)(const forge__heapent *, const forge__heapent *)) {
    forge__heapent *v = (forge__heapent *)h->p;
    size_t n = h->n / sizeof *v;
    forge__heapent top = v[0];
    v[0] = v[--n];
    h->n -= sizeof *v;
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && less(&v[l], &v[m])) m = l;
        if (r < n && less(&v[r], &v[m])) m = r;
        if (m == i) break;
        forge__heapent t = v[i]; v[i] = v[m]; v[m] = t;
        i = m;
    }
    return top;
}
static bool forge__bpe_less(const forge__heapent *x, const forge__heapent *y) { return x->key < y->key; }

static void forge__bpe_queue(forge__tkwork *w, forge__sym *sy, int32_t pos) {
    const forge__merge *m = forge__merge_get(&w->tk->merges, sy[pos].id, sy[sy[pos].next].id);
    if (m) forge__heap_push(&w->heap, (forge__heapent){((uint64_t)m->rank << 32) | (uint32_t)pos, m->id, 0, 0}, forge__bpe_less);
}

/* One pre-tokenized word through BPE (HF models/bpe: characters -> vocabulary ids, with byte
 * fallback or unk; then the lowest-ranked adjacent pair merges first, leftmost on ties). */
static void forge__bpe_word(forge__tkwork *w, const char *s, size_t n) {
    const forge__tokenizer *tk = w->tk;
    if (!n) return;
    if (tk->ignore_merges) {
        int32_t id = forge__strtab_get(&tk->vocab, s, n);
        if (id >= 0) { FORGE__VEC_PUSH(&w->ids, int32_t, id); return; }
    }
    forge__buf *sb = &w->sym;
    sb->n = 0;
    int32_t unk_len = -1, unk_off = 0; /* a pending unk (fused while fuse_unk) */
    char tmpbuf[64];
    for (size_t i = 0; i < n;) {
        size_t l = (size_t)forge__utf8_len1((unsigned char)s[i]);
        if (l > n - i) l = n - i;
        int32_t id;
        if (!tk->cont_prefix_len && !tk->eow_suffix_len) {
            id = forge__strtab_get(&tk->vocab, s + i, l);
        } else {
            forge__buf t;
            forge__buf_init(&t, tmpbuf, sizeof tmpbuf);
            if (i > 0) forge__buf_put(&t, tk->cont_prefix, tk->cont_prefix_len);
            forge__buf_put(&t, s + i, l);
            if (i + l == n) forge__buf_put(&t, tk->eow_suffix, tk->eow_suffix_len);
            id = t.oom ? -1 : forge__strtab_get(&tk->vocab, t.p, t.n);
            forge__buf_free(&t);
        }
        if (id >= 0) {
            if (unk_len >= 0) { FORGE__VEC_PUSH(sb, forge__sym, ((forge__sym){tk->model_unk, 0, 0, (uint32_t)unk_off, (uint32_t)unk_len})); unk_len = -1; }
            FORGE__VEC_PUSH(sb, forge__sym, ((forge__sym){id, 0, 0, (uint32_t)i, (uint32_t)l}));
        } else {
            bool bytes_ok = tk->byte_fallback;
            for (size_t k = 0; bytes_ok && k < l; k++) bytes_ok = tk->byte_id[(unsigned char)s[i + k]] >= 0;
            if (bytes_ok) {
                for (size_t k = 0; k < l; k++)
                    FORGE__VEC_PUSH(sb, forge__sym, ((forge__sym){tk->byte_id[(unsigned char)s[i + k]], 0, 0, (uint32_t)(i + k), 1}));
            } else if (tk->model_unk >= 0) {
                if (unk_len >= 0 && tk->fuse_unk) unk_len += (int32_t)l;
                else {
                    if (unk_len >= 0) FORGE__VEC_PUSH(sb, forge__sym, ((forge__sym){tk->model_unk, 0, 0, (uint32_t)unk_off, (uint32_t)unk_len}));
                    unk_len = (int32_t)l;
                    unk_off = (int32_t)i;
                }
            } /* else: HF drops a character it cannot represent */
        }
        i += l;
    }
    if (unk_len >= 0) FORGE__VEC_PUSH(sb, forge__sym, ((forge__sym){tk->model_unk, 0, 0, (uint32_t)unk_off, (uint32_t)unk_len}));
    if (sb->oom) return;
    int32_t ns = (int32_t)FORGE__VEC_LEN(sb, forge__sym);
    forge__sym *sy = (forge__sym *)sb->p;
    for (int32_t i = 0; i < ns; i++) { sy[i].prev = i - 1; sy[i].next = i + 1 < ns ? i + 1 : -1; }
    w->heap.n = 0;
    if (tk->merges.count) {
        for (int32_t i = 0; i + 1 < ns; i++) forge__bpe_queue(w, sy, i);
        while (w->heap.n && !w->heap.oom) {
            forge__heapent top = forge__heap_pop(&w->heap, forge__bpe_less);
            int32_t pos = (int32_t)(uint32_t)top.key;
            if (sy[pos].len == 0 || sy[pos].next < 0) continue;
            int32_t nx = sy[pos].next;
            const forge__merge *m = forge__merge_get(&tk->merges, sy[pos].id, sy[nx].id);
            if (!m || m->id != top.a) continue; /* a stale entry */
            sy[pos].id = m->id;
            sy[pos].len += sy[nx].len;
            sy[nx].len = 0;
            sy[pos].next = sy[nx].next;
            if (sy[nx].next >= 0) sy[sy[nx].next].prev = pos;
            if (sy[pos].prev >= 0) forge__bpe_queue(w, sy, sy[pos].prev);
            if (sy[pos].next >= 0) forge__bpe_queue(w, sy, pos);
        }
    }
    for (int32_t i = 0; i >= 0 && i < ns; i = sy[i].next) FORGE__VEC_PUSH(&w->ids, int32_t, sy[i].id);
}

/* SentencePiece-style merging by score (GGUF "llama" vocabularies, as llama.cpp does): the
 * adjacent pair whose concatenation is the best-scoring vocabulary entry merges first,
 * leftmost on ties; leftover characters become <0xXX> byte tokens, else unk. */
static bool forge__spm_less(const forge__heapent *x, const forge__heapent *y) {
    /* key holds the score as an order-preserving integer; higher score first */
    if (x->key != y->key) return x->key > y->key;
    return x->a < y->a;
}
static uint64_t forge__spm_key(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? (uint64_t)(~u) : (uint64_t)(u | 0x80000000u);
}
static void forge__spm_queue(forge__tkwork *w, const char *s, forge__sym *sy, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    uint32_t size = sy[left].len + sy[right].len;
    int32_t id = forge__strtab_get(&w->tk->vocab, s + sy[left].off, size);
    if (id < 0) return;
    float sc = w->tk->scores ? w->tk->scores[id] : 0.0f;
    forge__heap_push(&w->heap, (forge__heapent){forge__spm_key(sc), left, right, size}, forge__spm_less);
}
static void forge__spm_word(forge__tkwork *w, const char *s, size_t n) {
    const forge__tokenizer *tk = w->tk;
    forge__buf *sb = &w->sym;
    sb->n = 0;
    for (size_t i = 0; i < n;) {
        size_t l = FORGE__MIN((size_t)forge__utf8_len1((unsigned char)s[i]), n - i);
        FORGE__VEC_PUSH(sb, forge__sym, ((forge__sym){-1, 0, 0, (uint32_t)i, (uint32_t)l}));
        i += l;
    }
    if (sb->oom) return;
    int32_t ns = (int32_t)FORGE__VEC_LEN(sb, forge__sym);
    forge__sym *sy = (forge__sym *)sb->p;
    for (int32_t i = 0; i < ns; i++) { sy[i].prev = i - 1; sy[i].next = i + 1 < ns ? i + 1 : -1; }
    w->heap.n = 0;
    for (int32_t i = 1; i < ns; i++) forge__spm_queue(w, s, sy, i - 1, i);
    while (w->heap.n && !w->heap.oom) {
        forge__heapent b = forge__heap_pop(&w->heap, forge__spm_less);
        forge__sym *l = &sy[b.a], *r = &sy[b.b];
        if (l->len == 0 || r->len == 0 || l->len + r->len != b.size) continue;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) sy[r->next].prev = b.a;
        forge__spm_queue(w, s, sy, l->prev, b.a);
        forge__spm_queue(w, s, sy, b.a, l->next);
    }
    for (int32_t i = 0; i >= 0 && i < ns; i = sy[i].next) {
        int32_t id = forge__strtab_get(&tk->vocab, s + sy[i].off, sy[i].len);
        if (id >= 0) { FORGE__VEC_PUSH(&w->ids, int32_t, id); continue; }
        for (uint32_t k = 0; k < sy[i].len; k++) {
            unsigned char c = (unsigned char)s[sy[i].off + k];
            int32_t bid = tk->byte_id[c];
            if (bid < 0) bid = forge__strtab_get(&tk->vocab, (const char *)&c, 1);
            if (bid < 0) bid = tk->unk;
            if (bid >= 0) FORGE__VEC_PUSH(&w->ids, int32_t, bid);
        }
    }
}

/* Text that no added token claimed: pre-tokenizer, then the model, word by word. */
static void forge__tk_encode_text(forge__tkwork *w, const char *s, size_t n, bool first) {
    const forge__tokenizer *tk = w->tk;
    if (!n) return;
    w->spans[0].n = 0;
    FORGE__VEC_PUSH(&w->spans[0], forge__span, ((forge__span){0, (uint32_t)n, first}));
    const char *base = s;
    int which = 0;
    forge__tk_pretokenize(w, &base, &which);
    size_t ns = FORGE__VEC_LEN(&w->spans[which], forge__span);
    for (size_t k = 0; k < ns; k++) {
        forge__span sp = FORGE__VEC_AT(&w->spans[which], forge__span, k);
        if (tk->model == FORGE__TKM_SPM) forge__spm_word(w, base + sp.off, sp.len);
        else forge__bpe_word(w, base + sp.off, sp.len);
    }
}

/* The whole encode: ids appended to w->ids. */
static void forge__tk_encode(forge__tkwork *w, const char *text, size_t len, bool add_special, bool parse_special) {
    const forge__tokenizer *tk = w->tk;
    w->parse_special = parse_special;
    if (!forge__utf8_valid(text, len)) {
        w->input.n = 0;
        forge__utf8_lossy(&w->input, text, len);
        text = w->input.p ? w->input.p : "";
        len = w->input.n;
    }
    if (add_special)
        for (int i = 0; i < tk->n_tmpl_pre; i++) FORGE__VEC_PUSH(&w->ids, int32_t, tk->tmpl_pre[i]);
    forge__tk_split_added(w, &tk->trie_raw, text, len, &w->segs_raw);
    size_t nseg = FORGE__VEC_LEN(&w->segs_raw, forge__seg);
    for (size_t i = 0; i < nseg && !w->segs_raw.oom; i++) {
        forge__seg sg = FORGE__VEC_AT(&w->segs_raw, forge__seg, i);
        if (sg.id >= 0) { FORGE__VEC_PUSH(&w->ids, int32_t, sg.id); continue; }
        const char *s = text + sg.off;
        size_t n = sg.len;
        if (tk->n_norm) {
            forge__tk_normalize(w, s, n);
            s = w->norm.p ? w->norm.p : "";
            n = w->norm.n;
        }
        if (!tk->trie_norm.keys) {
            forge__tk_encode_text(w, s, n, sg.off == 0);
            continue;
        }
        forge__tk_split_added(w, &tk->trie_norm, s, n, &w->segs_norm);
        size_t nn = FORGE__VEC_LEN(&w->segs_norm, forge__seg);
        for (size_t k = 0; k < nn; k++) {
            forge__seg g2 = FORGE__VEC_AT(&w->segs_norm, forge__seg, k);
            if (g2.id >= 0) FORGE__VEC_PUSH(&w->ids, int32_t, g2.id);
            else forge__tk_encode_text(w, s + g2.off, g2.len, sg.off == 0 && g2.off == 0);
        }
    }
    if (add_special)
        for (int i = 0; i < tk->n_tmpl_post; i++) FORGE__VEC_PUSH(&w->ids, int32_t, tk->tmpl_post[i]);
}

/* ---- Decoding: ids -> pieces -> decoder steps (each maps a list of strings to a list of
 * strings, as HF's decode_chain) -> their concatenation. ---- */

typedef struct forge__strs {
    forge__buf text, idx;      /* idx: (off, len) uint32 pairs into text */
} forge__strs;

static void forge__strs_add(forge__strs *l, const char *s, size_t n) {
    uint32_t pr[2] = {(uint32_t)l->text.n, (uint32_t)n};
    forge__buf_put(&l->text, s, n);
    forge__buf_put(&l->idx, pr, sizeof pr);
}
static size_t forge__strs_n(const forge__strs *l) { return l->idx.n / 8; }
static const char *forge__strs_get(const forge__strs *l, size_t i, size_t *n) {
    const uint32_t *pr = (const uint32_t *)l->idx.p + 2 * i;
    *n = pr[1];
    return l->text.p ? l->text.p + pr[0] : "";
}
/* Starts a new token that the caller fills by appending to l->text, then closes. */
static void forge__strs_open(forge__strs *l, uint32_t *start) { *start = (uint32_t)l->text.n; }
static void forge__strs_close(forge__strs *l, uint32_t start) {
    uint32_t pr[2] = {start, (uint32_t)l->text.n - start};
    forge__buf_put(&l->idx, pr, sizeof pr);
}

/* Decodes ids into out (appended). *incomplete tells whether the text ends inside a UTF-8
 * sequence that later ids could finish (then it ends in U+FFFD here). Stack storage keeps
 * small decodes (the streaming case) free of allocation. */
static forge_status forge__tk_decode(const forge__tokenizer *tk, const int32_t *ids, size_t n, bool skip_special, forge__buf *out,
                                     bool *incomplete, forge__err *err) {
    char st0[2][1024], sx0[2][512];
    forge__strs L[2];
    for (int k = 0; k < 2; k++) {
        forge__buf_init(&L[k].text, st0[k], sizeof st0[k]);
        forge__buf_init(&L[k].idx, sx0[k], sizeof sx0[k]);
    }
    forge__buf tmp, iv; /* iv: match intervals of a Replace step */
    char tmp0[256], iv0[256];
    forge__buf_init(&tmp, tmp0, sizeof tmp0);
    forge__buf_init(&iv, iv0, sizeof iv0);
    pcre2_match_data *md = NULL; /* made when a Replace step's pattern is a regex */
    forge_status rc = FORGE_OK;
    size_t out_start = out->n;
    if (incomplete) *incomplete = false;
    int cur = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tk->n_vocab || !tk->pieces[id]) {
            rc = forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "token %d (at index %zu) is outside the vocabulary of %d", id, i, tk->n_vocab);
            goto done;
        }
        if (skip_special && tk->is_special[id]) continue;
        forge__strs_add(&L[0], tk->pieces[id], tk->piece_len[id]);
    }
    if (!tk->has_decoder) {
        size_t m = forge__strs_n(&L[0]);
        for (size_t k = 0; k < m; k++) {
            size_t ln;
            const char *s = forge__strs_get(&L[0], k, &ln);
            if (k) forge__buf_put(out, " ", 1);
            forge__buf_put(out, s, ln);
        }
        goto done;
    }
    for (int d = 0; d < tk->n_dec; d++) {
        const forge__dec_step *st = &tk->dec[d];
        forge__strs *in = &L[cur], *o = &L[1 - cur];
        o->text.n = o->idx.n = 0;
        size_t m = forge__strs_n(in);
        uint32_t start;
        switch (st->kind) {
        case FORGE__D_BYTELEVEL: {
            tmp.n = 0;
            for (size_t k = 0; k < m; k++) {
                size_t ln;
                const char *s = forge__strs_get(in, k, &ln);
                size_t mark = tmp.n, q = 0;
                bool all = true;
                while (q < ln) {
                    uint32_t cp;
                    int l = forge__utf8_dec((const unsigned char *)s + q, ln - q, &cp);
                    int b = l ? forge__bl_byte(cp) : -1;
                    if (b < 0) { all = false; break; }
                    char c = (char)b;
                    forge__buf_put(&tmp, &c, 1);
                    q += (size_t)l;
                }
                if (!all) { tmp.n = mark; forge__buf_put(&tmp, s, ln); } /* not byte-level text: its own bytes */
            }
            if (incomplete) *incomplete = forge__utf8_incomplete_tail((const unsigned char *)(tmp.p ? tmp.p : ""), tmp.n);
            forge__strs_open(o, &start);
            forge__utf8_lossy(&o->text, tmp.p ? tmp.p : "", tmp.n);
            forge__strs_close(o, start);
            break;
        }
        case FORGE__D_METASPACE: {
            char rep[4];
            forge__buf rb;
            forge__buf_init(&rb, rep, sizeof rep);
            forge__utf8_put(&rb, st->ch);
            for (size_t k = 0; k < m; k++) {
                size_t ln, q = 0;
                const char *s = forge__strs_get(in, k, &ln);
                forge__strs_open(o, &start);
                if (k == 0 && st->prepend != 0 && ln >= rb.n && !memcmp(s, rep, rb.n)) q = rb.n;
                while (q < ln) {
                    if (ln - q >= rb.n && !memcmp(s + q, rep, rb.n)) { forge__buf_put(&o->text, " ", 1); q += rb.n; }
                    else forge__buf_put(&o->text, s + q++, 1);
                }
                forge__strs_close(o, start);
            }
            break;
        }
        case FORGE__D_REPLACE:
            for (size_t k = 0; k < m; k++) {
                size_t ln;
                const char *s = forge__strs_get(in, k, &ln);
                forge__strs_open(o, &start);
                forge__pat_replace(&md, &iv, &st->pat, s, ln, st->s, st->len, &o->text);
                forge__strs_close(o, start);
            }
            break;
        case FORGE__D_BYTEFALLBACK: {
            tmp.n = 0; /* pending bytes of <0xXX> tokens */
            for (size_t k = 0; k <= m; k++) {
                size_t ln = 0;
                const char *s = k < m ? forge__strs_get(in, k, &ln) : "";
                int hi = -1, lo = -1;
                if (k < m && ln == 6 && !memcmp(s, "<0x", 3) && s[5] == '>') { hi = forge__hexval(s[3]); lo = forge__hexval(s[4]); }
                if (hi >= 0 && lo >= 0) {
                    char c = (char)(hi * 16 + lo);
                    forge__buf_put(&tmp, &c, 1);
                    continue;
                }
                if (tmp.n) {
                    if (forge__utf8_valid(tmp.p, tmp.n)) {
                        forge__strs_add(o, tmp.p, tmp.n);
                    } else {
                        if (k == m && incomplete) *incomplete = forge__utf8_incomplete_tail((const unsigned char *)tmp.p, tmp.n);
                        for (size_t q = 0; q < tmp.n; q++) forge__strs_add(o, "\xef\xbf\xbd", 3); /* one U+FFFD per byte, as HF */
                    }
                    tmp.n = 0;
                }
                if (k < m) forge__strs_add(o, s, ln);
            }
            break;
        }
        case FORGE__D_FUSE:
            forge__strs_open(o, &start);
            for (size_t k = 0; k < m; k++) {
                size_t ln;
                const char *s = forge__strs_get(in, k, &ln);
                forge__buf_put(&o->text, s, ln);
            }
            forge__strs_close(o, start);
            break;
        case FORGE__D_STRIP: {
            char c[4];
            forge__buf cb;
            forge__buf_init(&cb, c, sizeof c);
            forge__utf8_put(&cb, st->ch);
            for (size_t k = 0; k < m; k++) {
                size_t ln, a = 0, b;
                const char *s = forge__strs_get(in, k, &ln);
                b = ln;
                for (int q = 0; q < st->start && ln - a >= cb.n && !memcmp(s + a, c, cb.n); q++) a += cb.n;
                for (int q = 0; q < st->stop && b - a >= cb.n && !memcmp(s + b - cb.n, c, cb.n); q++) b -= cb.n;
                forge__strs_add(o, s + a, b - a);
            }
            break;
        }
        }
        cur = 1 - cur;
    }
    {
        size_t m = forge__strs_n(&L[cur]);
        for (size_t k = 0; k < m; k++) {
            size_t ln;
            const char *s = forge__strs_get(&L[cur], k, &ln);
            forge__buf_put(out, s, ln);
        }
    }
done:
    /* pieces of a GGUF vocabulary may be any bytes: the text given out is always UTF-8 */
    if (!rc && !out->oom && !forge__utf8_valid(out->p ? out->p + out_start : "", out->n - out_start)) {
        tmp.n = 0;
        forge__utf8_lossy(&tmp, out->p + out_start, out->n - out_start);
        out->n = out_start;
        forge__buf_put(out, tmp.p, tmp.n);
    }
    if (!rc && (L[0].text.oom || L[1].text.oom || L[0].idx.oom || L[1].idx.oom || tmp.oom || iv.oom || out->oom))
        rc = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory while decoding");
    for (int k = 0; k < 2; k++) { forge__buf_free(&L[k].text); forge__buf_free(&L[k].idx); }
    forge__buf_free(&tmp);
    forge__buf_free(&iv);
    if (md) pcre2_match_data_free(md);
    return rc;
}

/* The bytes token `id` adds to a text that it continues (after other tokens), into out:
 * the decoder's steps on the one piece, as forge_detok_stream gives them after a primed token
 * (Metaspace's and Strip's first-token rules not applied), without the lossy UTF-8 pass: a
 * byte-level or <0xXX> piece gives its raw byte, so a character split across tokens is in
 * the bytes of each. What a grammar matches tokens by (grammar.c). false for a hole. */
static bool forge__tk_token_bytes(const forge__tokenizer *tk, int32_t id, forge__buf *out) {
    out->n = 0;
    if (id < 0 || id >= tk->n_vocab || !tk->pieces[id]) return false;
    const char *s = tk->pieces[id];
    size_t n = tk->piece_len[id];
    if (!tk->has_decoder) { /* HF joins pieces with " " */
        forge__buf_put(out, " ", 1);
        forge__buf_put(out, s, n);
        return !out->oom;
    }
    char a0[256], b0[256], iv0[64];
    forge__buf cur, next, iv;
    forge__buf_init(&cur, a0, sizeof a0);
    forge__buf_init(&next, b0, sizeof b0);
    forge__buf_init(&iv, iv0, sizeof iv0);
    pcre2_match_data *md = NULL;
    forge__buf_put(&cur, s, n);
    for (int d = 0; d < tk->n_dec; d++) {
        const forge__dec_step *st = &tk->dec[d];
        next.n = 0;
        switch (st->kind) {
        case FORGE__D_BYTELEVEL: {
            size_t q = 0;
            while (q < cur.n) {
                uint32_t cp;
                int l = forge__utf8_dec((const unsigned char *)cur.p + q, cur.n - q, &cp);
                int b = l ? forge__bl_byte(cp) : -1;
                if (b < 0) break;
                char c = (char)b;
                forge__buf_put(&next, &c, 1);
                q += (size_t)l;
            }
            if (q < cur.n) { next.n = 0; forge__buf_put(&next, cur.p, cur.n); } /* not byte-level text: its own bytes */
            break;
        }
        case FORGE__D_METASPACE: {
            char rep[4];
            forge__buf rb;
            forge__buf_init(&rb, rep, sizeof rep);
            forge__utf8_put(&rb, st->ch);
            for (size_t q = 0; q < cur.n;) {
                if (cur.n - q >= rb.n && !memcmp(cur.p + q, rep, rb.n)) { forge__buf_put(&next, " ", 1); q += rb.n; }
                else forge__buf_put(&next, cur.p + q++, 1);
            }
            break;
        }
        case FORGE__D_REPLACE: forge__pat_replace(&md, &iv, &st->pat, cur.p ? cur.p : "", cur.n, st->s, st->len, &next); break;
        case FORGE__D_BYTEFALLBACK: {
            int hi = -1, lo = -1;
            if (cur.n == 6 && !memcmp(cur.p, "<0x", 3) && cur.p[5] == '>') { hi = forge__hexval(cur.p[3]); lo = forge__hexval(cur.p[4]); }
            if (hi >= 0 && lo >= 0) {
                char c = (char)(hi * 16 + lo);
                forge__buf_put(&next, &c, 1);
            } else {
                forge__buf_put(&next, cur.p, cur.n);
            }
            break;
        }
        case FORGE__D_FUSE:
        case FORGE__D_STRIP: forge__buf_put(&next, cur.p, cur.n); break; /* one piece, not the text's first */
        }
        forge__buf t = cur;
        cur = next;
        next = t;
    }
    forge__buf_put(out, cur.p, cur.n);
    bool ok = !cur.oom && !next.oom && !iv.oom && !out->oom;
    forge__buf_free(&cur);
    forge__buf_free(&next);
    forge__buf_free(&iv);
    if (md) pcre2_match_data_free(md);
    return ok;
}

/* ---- Loading tokenizer.json ---- */

typedef struct forge__tkload {
    forge__tokenizer *tk;
    forge__arena *a;
    const char *path;
    forge__err *err;
} forge__tkload;

static const char *forge__json_type(const cJSON *o) {
    const char *t = forge__json_str(o, "type");
    return t ? t : "";
}

static bool forge__cstr_valid(const char *s) { return !s || forge__utf8_valid(s, strlen(s)); }

/* Pattern: {"String": s} or {"Regex": r}. */
static forge_status forge__tk_pattern(forge__tkload *L, const cJSON *o, forge__pat *pat, const char *what) {
    const char *s = forge__json_str(o, "String"), *r = forge__json_str(o, "Regex");
    memset(pat, 0, sizeof *pat);
    if (!forge__cstr_valid(s) || !forge__cstr_valid(r)) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: %s: pattern is not valid UTF-8", L->path, what);
    if (s) {
        if (!(pat->str = forge__arena_strdup(L->a, s))) return forge__fail(L->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        pat->len = strlen(s);
        return FORGE_OK;
    }
    if (r) return forge__tk_regex(L->tk, r, strlen(r), &pat->re, L->path, what, L->err);
    return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: %s: pattern is neither {\"String\"} nor {\"Regex\"}", L->path, what);
}

static forge_status forge__tk_str(forge__tkload *L, const cJSON *o, const char *key, const char *def, const char **out, size_t *len) {
    const char *s = forge__json_str(o, key);
    if (!s) s = def;
    if (!s) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: field '%s' is missing", L->path, key);
    if (!forge__cstr_valid(s)) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: field '%s' is not valid UTF-8", L->path, key);
    if (!(*out = forge__arena_strdup(L->a, s))) return forge__fail(L->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    if (len) *len = strlen(s);
    return FORGE_OK;
}

/* The first character of a one-character string field (Metaspace replacement, Strip content). */
static forge_status forge__tk_char(forge__tkload *L, const cJSON *o, const char *key, const char *def, uint32_t *cp) {
    const char *s = forge__json_str(o, key);
    if (!s) s = def;
    if (!s || !*s || !forge__utf8_dec((const unsigned char *)s, strlen(s), cp))
        return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: field '%s' is not a character", L->path, key);
    return FORGE_OK;
}

/* A Sequence component (normalizer, pre-tokenizer, decoder, post-processor): each entry of
 * o[key] in turn, through the loader of its kind; Sequences nest at most 8 deep. */
typedef forge_status (*forge__tk_component_loader)(forge__tkload *L, const cJSON *o, int depth);
static forge_status forge__tk_sequence(forge__tkload *L, const cJSON *o, const char *key, const char *what, int depth,
                                       forge__tk_component_loader load_each) {
    const cJSON *it, *arr = cJSON_GetObjectItemCaseSensitive(o, key);
    if (depth > 8 || !cJSON_IsArray(arr)) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: %s Sequence without a %s array", L->path, what, key);
    cJSON_ArrayForEach(it, arr) {
        forge_status st = load_each(L, it, depth + 1);
        if (st) return st;
    }
    return FORGE_OK;
}

static forge_status forge__tk_normalizer(forge__tkload *L, const cJSON *o, int depth) {
    forge__tokenizer *tk = L->tk;
    if (!o || cJSON_IsNull(o)) return FORGE_OK;
    const char *t = forge__json_type(o);
    if (!strcmp(t, "Sequence")) return forge__tk_sequence(L, o, "normalizers", "normalizer", depth, forge__tk_normalizer);
    if (tk->n_norm >= FORGE__TK_MAX_STEPS) return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: more than %d normalizers", L->path, FORGE__TK_MAX_STEPS);
    forge__norm_step *s = &tk->norm[tk->n_norm];
    memset(s, 0, sizeof *s);
    forge_status st = FORGE_OK;
    if (!strcmp(t, "NFC")) s->kind = FORGE__N_NFC;
    else if (!strcmp(t, "NFD")) s->kind = FORGE__N_NFD;
    else if (!strcmp(t, "NFKC")) s->kind = FORGE__N_NFKC;
    else if (!strcmp(t, "NFKD")) s->kind = FORGE__N_NFKD;
    else if (!strcmp(t, "Lowercase")) s->kind = FORGE__N_LOWER;
    else if (!strcmp(t, "StripAccents")) s->kind = FORGE__N_STRIP_ACCENTS;
    else if (!strcmp(t, "Strip")) {
        s->kind = FORGE__N_STRIP;
        s->left = forge__json_bool(o, "strip_left", true);
        s->right = forge__json_bool(o, "strip_right", true);
    } else if (!strcmp(t, "Prepend")) {
        s->kind = FORGE__N_PREPEND;
        st = forge__tk_str(L, o, "prepend", NULL, &s->s, &s->len);
    } else if (!strcmp(t, "Replace")) {
        s->kind = FORGE__N_REPLACE;
        if (!(st = forge__tk_pattern(L, cJSON_GetObjectItemCaseSensitive(o, "pattern"), &s->pat, "normalizer Replace")))
            st = forge__tk_str(L, o, "content", NULL, &s->s, &s->len);
    } else {
        return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: normalizer '%s' is not supported", L->path, t);
    }
    if (!st) tk->n_norm++;
    return st;
}

static forge_status forge__tk_behavior(forge__tkload *L, const cJSON *o, forge__split_beh def, forge__split_beh *b) {
    const char *s = forge__json_str(o, "behavior");
    if (!s) { *b = def; return FORGE_OK; }
    if (!strcmp(s, "Removed")) *b = FORGE__SB_REMOVED;
    else if (!strcmp(s, "Isolated")) *b = FORGE__SB_ISOLATED;
    else if (!strcmp(s, "MergedWithPrevious")) *b = FORGE__SB_MERGED_PREV;
    else if (!strcmp(s, "MergedWithNext")) *b = FORGE__SB_MERGED_NEXT;
    else if (!strcmp(s, "Contiguous")) *b = FORGE__SB_CONTIGUOUS;
    else return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: split behavior '%s' is not supported", L->path, s);
    return FORGE_OK;
}

/* GPT-2's split regex: ByteLevel's use_regex. */
static const char forge__gpt2_regex[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Metaspace's prepend_scheme, with the older add_prefix_space field. */
static int forge__tk_prepend_scheme(const cJSON *o) {
    const char *ps = forge__json_str(o, "prepend_scheme");
    if (ps) return !strcmp(ps, "never") ? 0 : !strcmp(ps, "first") ? 1 : 2;
    return forge__json_bool(o, "add_prefix_space", true) ? 2 : 0;
}

static forge_status forge__tk_pretokenizer(forge__tkload *L, const cJSON *o, int depth) {
    forge__tokenizer *tk = L->tk;
    if (!o || cJSON_IsNull(o)) return FORGE_OK;
    const char *t = forge__json_type(o);
    if (!strcmp(t, "Sequence")) return forge__tk_sequence(L, o, "pretokenizers", "pre_tokenizer", depth, forge__tk_pretokenizer);
    if (tk->n_pre >= FORGE__TK_MAX_STEPS) return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: more than %d pre-tokenizers", L->path, FORGE__TK_MAX_STEPS);
    forge__pre_step *s = &tk->pre[tk->n_pre];
    memset(s, 0, sizeof *s);
    forge_status st = FORGE_OK;
    if (!strcmp(t, "Split")) {
        s->kind = FORGE__P_SPLIT;
        s->invert = forge__json_bool(o, "invert", false);
        if (!(st = forge__tk_pattern(L, cJSON_GetObjectItemCaseSensitive(o, "pattern"), &s->pat, "pre_tokenizer Split")))
            st = forge__tk_behavior(L, o, FORGE__SB_ISOLATED, &s->beh);
    } else if (!strcmp(t, "ByteLevel")) {
        s->kind = FORGE__P_BYTELEVEL;
        s->add_prefix_space = forge__json_bool(o, "add_prefix_space", true);
        s->use_regex = forge__json_bool(o, "use_regex", true);
        if (s->use_regex) st = forge__tk_regex(tk, forge__gpt2_regex, strlen(forge__gpt2_regex), &s->pat.re, L->path, "ByteLevel", L->err);
    } else if (!strcmp(t, "Metaspace")) {
        s->kind = FORGE__P_METASPACE;
        st = forge__tk_char(L, o, "replacement", "\xe2\x96\x81", &s->repl);
        s->prepend = forge__tk_prepend_scheme(o);
        s->split = forge__json_bool(o, "split", true);
    } else if (!strcmp(t, "Digits")) {
        s->kind = FORGE__P_DIGITS;
        s->individual = forge__json_bool(o, "individual_digits", false);
    } else if (!strcmp(t, "Punctuation")) {
        s->kind = FORGE__P_PUNCT;
        st = forge__tk_behavior(L, o, FORGE__SB_ISOLATED, &s->beh);
    } else if (!strcmp(t, "Whitespace")) {
        static const char re[] = "\\w+|[^\\w\\s]+";
        s->kind = FORGE__P_WHITESPACE;
        st = forge__tk_regex(tk, re, strlen(re), &s->pat.re, L->path, "Whitespace", L->err);
    } else if (!strcmp(t, "WhitespaceSplit")) {
        s->kind = FORGE__P_WSSPLIT;
    } else {
        return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: pre_tokenizer '%s' is not supported", L->path, t);
    }
    if (!st) tk->n_pre++;
    return st;
}

static forge_status forge__tk_decoder(forge__tkload *L, const cJSON *o, int depth) {
    forge__tokenizer *tk = L->tk;
    if (!o || cJSON_IsNull(o)) return FORGE_OK;
    tk->has_decoder = true;
    const char *t = forge__json_type(o);
    if (!strcmp(t, "Sequence")) return forge__tk_sequence(L, o, "decoders", "decoder", depth, forge__tk_decoder);
    if (tk->n_dec >= FORGE__TK_MAX_STEPS) return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: more than %d decoders", L->path, FORGE__TK_MAX_STEPS);
    forge__dec_step *s = &tk->dec[tk->n_dec];
    memset(s, 0, sizeof *s);
    forge_status st = FORGE_OK;
    if (!strcmp(t, "ByteLevel")) s->kind = FORGE__D_BYTELEVEL;
    else if (!strcmp(t, "ByteFallback")) s->kind = FORGE__D_BYTEFALLBACK;
    else if (!strcmp(t, "Fuse")) s->kind = FORGE__D_FUSE;
    else if (!strcmp(t, "Metaspace")) {
        s->kind = FORGE__D_METASPACE;
        st = forge__tk_char(L, o, "replacement", "\xe2\x96\x81", &s->ch);
        s->prepend = forge__tk_prepend_scheme(o);
    } else if (!strcmp(t, "Replace")) {
        s->kind = FORGE__D_REPLACE;
        if (!(st = forge__tk_pattern(L, cJSON_GetObjectItemCaseSensitive(o, "pattern"), &s->pat, "decoder Replace")))
            st = forge__tk_str(L, o, "content", NULL, &s->s, &s->len);
    } else if (!strcmp(t, "Strip")) {
        s->kind = FORGE__D_STRIP;
        st = forge__tk_char(L, o, "content", " ", &s->ch);
        s->start = forge__json_int(o, "start", 0);
        s->stop = forge__json_int(o, "stop", 0);
        if (s->start < 0 || s->stop < 0) st = forge__fail(L->err, FORGE_ERR_FORMAT, "%s: decoder Strip start/stop must be counts", L->path);
    } else {
        return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: decoder '%s' is not supported", L->path, t);
    }
    if (!st) tk->n_dec++;
    return st;
}

static int32_t forge__tk_lookup(const forge__tokenizer *tk, const char *s, size_t n) {
    int32_t id = forge__strtab_get(&tk->addtab, s, n);
    return id >= 0 ? id : forge__strtab_get(&tk->vocab, s, n);
}

/* Appends the id in JSON number `idv` to a post-processor template. */
static forge_status forge__tk_tmpl_add(forge__tkload *L, int32_t *dst, int *n, const cJSON *idv) {
    if (*n >= FORGE__TK_MAX_TEMPLATE) return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: post-processor adds more than %d tokens", L->path, FORGE__TK_MAX_TEMPLATE);
    int32_t id = forge__json_id(idv);
    if (id < 0 || id >= L->tk->n_vocab)
        return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: post-processor token id %.15g is not an id of the vocabulary (0..%d)", L->path,
                           idv->valuedouble, L->tk->n_vocab - 1);
    dst[(*n)++] = id;
    return FORGE_OK;
}

/* Post-processors: only what they add to a single sequence changes ids. */
static forge_status forge__tk_post(forge__tkload *L, const cJSON *o, int depth) {
    forge__tokenizer *tk = L->tk;
    if (!o || cJSON_IsNull(o)) return FORGE_OK;
    const char *t = forge__json_type(o);
    forge_status st = FORGE_OK;
    if (!strcmp(t, "Sequence")) return forge__tk_sequence(L, o, "processors", "post_processor", depth, forge__tk_post);
    if (!strcmp(t, "ByteLevel")) return FORGE_OK; /* offsets only */
    if (!strcmp(t, "TemplateProcessing")) {
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(o, "single"), *sp = cJSON_GetObjectItemCaseSensitive(o, "special_tokens"), *it;
        if (!cJSON_IsArray(single)) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: TemplateProcessing without a 'single' template", L->path);
        int seen_a = 0;
        cJSON_ArrayForEach(it, single) {
            const cJSON *spt = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken"), *seq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
            if (seq) {
                if (seen_a++) return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: TemplateProcessing uses the sequence twice", L->path);
                continue;
            }
            const char *name = forge__json_str(spt, "id");
            if (!name) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: TemplateProcessing item is neither SpecialToken nor Sequence", L->path);
            const cJSON *ent = cJSON_GetObjectItemCaseSensitive(sp, name), *ids = cJSON_GetObjectItemCaseSensitive(ent, "ids"), *idv;
            if (!cJSON_IsArray(ids)) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: TemplateProcessing special token '%s' has no ids", L->path, name);
            cJSON_ArrayForEach(idv, ids) {
                if (!cJSON_IsNumber(idv)) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: TemplateProcessing id is not a number", L->path);
                if ((st = seen_a ? forge__tk_tmpl_add(L, tk->tmpl_post, &tk->n_tmpl_post, idv)
                                 : forge__tk_tmpl_add(L, tk->tmpl_pre, &tk->n_tmpl_pre, idv)))
                    return st;
            }
        }
        const cJSON *pair = cJSON_GetObjectItemCaseSensitive(o, "pair");
        int part = 0; /* 0 before A, 1 between A and B, 2 after B */
        cJSON_ArrayForEach(it, (cJSON_IsArray(pair) ? pair : NULL)) {
            const cJSON *spt = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken"), *seq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
            if (seq) {
                const char *which = forge__json_str(seq, "id");
                int next = which && !strcmp(which, "B") ? 2 : 1;
                if (next <= part) return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: TemplateProcessing's pair is not A then B", L->path);
                part = next;
                continue;
            }
            const cJSON *ent = cJSON_GetObjectItemCaseSensitive(sp, forge__json_str(spt, "id") ? forge__json_str(spt, "id") : ""),
                        *ids = cJSON_GetObjectItemCaseSensitive(ent, "ids"), *idv;
            if (!cJSON_IsArray(ids)) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: TemplateProcessing's pair names a token it has no ids for", L->path);
            cJSON_ArrayForEach(idv, ids) {
                if (!cJSON_IsNumber(idv)) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: TemplateProcessing id is not a number", L->path);
                if ((st = forge__tk_tmpl_add(L, tk->tmpl_pair[part], &tk->n_tmpl_pair[part], idv))) return st;
            }
        }
        return FORGE_OK;
    }
    if (!strcmp(t, "BertProcessing") || !strcmp(t, "RobertaProcessing")) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(o, "cls"), *sep = cJSON_GetObjectItemCaseSensitive(o, "sep");
        const cJSON *ci = cJSON_GetArrayItem(cls, 1), *si = cJSON_GetArrayItem(sep, 1);
        if (!cJSON_IsNumber(ci) || !cJSON_IsNumber(si)) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: %s without cls/sep", L->path, t);
        if ((st = forge__tk_tmpl_add(L, tk->tmpl_pre, &tk->n_tmpl_pre, ci)) || (st = forge__tk_tmpl_add(L, tk->tmpl_pair[0], &tk->n_tmpl_pair[0], ci)) ||
            (st = forge__tk_tmpl_add(L, tk->tmpl_pair[1], &tk->n_tmpl_pair[1], si)) || (st = forge__tk_tmpl_add(L, tk->tmpl_pair[2], &tk->n_tmpl_pair[2], si)))
            return st;
        if (!strcmp(t, "RobertaProcessing") && (st = forge__tk_tmpl_add(L, tk->tmpl_pair[1], &tk->n_tmpl_pair[1], si))) return st; /* </s></s> */
        return forge__tk_tmpl_add(L, tk->tmpl_post, &tk->n_tmpl_post, si);
    }
    return forge__fail(L->err, FORGE_ERR_UNSUPPORTED, "%s: post_processor '%s' is not supported", L->path, t);
}

/* One vocabulary entry read from the file, before the id table exists. */
typedef struct forge__tkent {
    const char *s;
    uint32_t len;
    int32_t id;
} forge__tkent;

/* "vocab": {"piece": id, ...} straight from the mapping; pieces are copied into the arena. */
static forge_status forge__tk_read_vocab(forge__tkload *L, forge__js *j, forge__buf *ents, int64_t *max_id) {
    forge__buf tmp;
    forge__buf_init(&tmp, NULL, 0);
    forge_status st = FORGE_OK;
    if (!forge__js_eat(j, '{')) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: model.vocab is not an object", L->path);
    if (!forge__js_eat(j, '}')) {
        do {
            tmp.n = 0;
            int64_t id;
            if (!forge__js_str(j, &tmp) || !forge__js_eat(j, ':') || !forge__js_int(j, &id)) {
                st = forge__fail(L->err, tmp.oom ? FORGE_ERR_OUT_OF_MEMORY : FORGE_ERR_FORMAT, "%s: model.vocab: malformed entry", L->path);
                break;
            }
            if (id < 0 || id >= FORGE__TK_MAX_IDS - 1) {
                st = forge__fail(L->err, FORGE_ERR_FORMAT, "%s: model.vocab: id %lld is out of range", L->path, (long long)id);
                break;
            }
            char *s = forge__arena_strndup(L->a, tmp.p ? tmp.p : "", tmp.n);
            if (!s) { st = forge__fail(L->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); break; }
            FORGE__VEC_PUSH(ents, forge__tkent, ((forge__tkent){s, (uint32_t)tmp.n, (int32_t)id}));
            if (id > *max_id) *max_id = id;
        } while (forge__js_eat(j, ','));
        if (!st && !forge__js_eat(j, '}')) st = forge__fail(L->err, FORGE_ERR_FORMAT, "%s: model.vocab: expected '}'", L->path);
    }
    forge__buf_free(&tmp);
    if (!st && ents->oom) st = forge__fail(L->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    return st;
}

/* Merges are registered in batches: each is three vocabulary lookups (left, right, merged
 * piece), done with prefetches over the whole batch. The merged piece must be in the
 * vocabulary (HF refuses the file otherwise); with a continuing_subword_prefix, the right
 * part's prefix is dropped from it. */
#define FORGE__MERGE_BATCH 64

typedef struct forge__mbatch {
    forge__buf pool;                          /* texts: left, right, merged, per merge */
    uint32_t off[FORGE__MERGE_BATCH * 3], len[FORGE__MERGE_BATCH * 3];
    uint64_t h[FORGE__MERGE_BATCH * 3];
    int32_t id[FORGE__MERGE_BATCH * 3];
    uint32_t n, rank0;
} forge__mbatch;

static forge_status forge__mbatch_flush(forge__tkload *L, forge__mbatch *mb) {
    forge__tokenizer *tk = L->tk;
    uint32_t nk = mb->n * 3;
    if (mb->pool.oom) return forge__fail(L->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    if ((size_t)tk->merges.count + mb->n > ((size_t)tk->merges.mask + 1) / 2) /* the table was sized by a count */
        return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: more merges than the merges array holds", L->path);
    const char *p = mb->pool.p ? mb->pool.p : "";
    for (uint32_t k = 0; k < nk; k++) {
        mb->h[k] = forge__hash(p + mb->off[k], mb->len[k]);
        forge__strtab_prefetch(&tk->vocab, mb->h[k], mb->len[k], 0);
    }
    for (uint32_t k = 0; k < nk; k++) forge__strtab_prefetch(&tk->vocab, mb->h[k], mb->len[k], 1);
    for (uint32_t k = 0; k < nk; k++) mb->id[k] = forge__strtab_get_h(&tk->vocab, p + mb->off[k], mb->len[k], mb->h[k]);
    for (uint32_t m = 0; m < mb->n; m++) {
        const int32_t *id = &mb->id[3 * m];
        if (id[0] < 0 || id[1] < 0 || id[2] < 0)
            return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: merge %u ('%.*s' '%.*s'): %s is not in the vocabulary", L->path,
                               mb->rank0 + m + 1, (int)FORGE__MIN(mb->len[3 * m], 64), p + mb->off[3 * m],
                               (int)FORGE__MIN(mb->len[3 * m + 1], 64), p + mb->off[3 * m + 1],
                               id[0] < 0 ? "the left part" : id[1] < 0 ? "the right part" : "the merged piece");
        __builtin_prefetch(&tk->merges.slot[forge__mix64(((uint64_t)(uint32_t)id[0] << 32) | (uint32_t)id[1]) & tk->merges.mask]);
    }
    for (uint32_t m = 0; m < mb->n; m++) forge__merge_put(&tk->merges, mb->id[3 * m], mb->id[3 * m + 1], mb->rank0 + m, mb->id[3 * m + 2]);
    mb->rank0 += mb->n;
    mb->n = 0;
    mb->pool.n = 0;
    return FORGE_OK;
}

static forge_status forge__mbatch_add(forge__tkload *L, forge__mbatch *mb, const char *a, size_t an, const char *b, size_t bn) {
    const forge__tokenizer *tk = L->tk;
    size_t skip = tk->cont_prefix_len && bn >= tk->cont_prefix_len && !memcmp(b, tk->cont_prefix, tk->cont_prefix_len) ? tk->cont_prefix_len : 0;
    uint32_t k = mb->n * 3;
    const char *parts[4] = {a, b, a, b + skip};
    size_t lens[4] = {an, bn, an, bn - skip};
    for (int q = 0; q < 3; q++) {
        mb->off[k + (uint32_t)q] = (uint32_t)mb->pool.n;
        forge__buf_put(&mb->pool, parts[q], lens[q]);
        if (q == 2) forge__buf_put(&mb->pool, parts[3], lens[3]);
        mb->len[k + (uint32_t)q] = (uint32_t)(mb->pool.n - mb->off[k + (uint32_t)q]);
    }
    return ++mb->n == FORGE__MERGE_BATCH ? forge__mbatch_flush(L, mb) : FORGE_OK;
}

/* "merges": ["a b", ...] (legacy) or [["a", "b"], ...]. */
static forge_status forge__tk_read_merges(forge__tkload *L, forge__js *j, size_t count) {
    forge__buf s1, s2;
    forge__buf_init(&s1, NULL, 0);
    forge__buf_init(&s2, NULL, 0);
    forge__mbatch mb;
    memset(&mb, 0, sizeof mb);
    forge_status st = FORGE_OK;
    if (!forge__js_eat(j, '[')) return forge__fail(L->err, FORGE_ERR_FORMAT, "%s: model.merges is not an array", L->path);
    /* `count` came from the scan that found the array, so the table is sized once */
    if (!forge__mergetab_init(&L->tk->merges, count, L->a)) return forge__fail(L->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    uint32_t rank = 0;
    if (!forge__js_eat(j, ']')) {
        do {
            s1.n = s2.n = 0;
            forge__js_ws(j);
            if (j->p < j->end && *j->p == '[') {
                j->p++;
                if (!forge__js_str(j, &s1) || !forge__js_eat(j, ',') || !forge__js_str(j, &s2) || !forge__js_eat(j, ']')) {
                    st = forge__fail(L->err, FORGE_ERR_FORMAT, "%s: merge %u is not a pair of strings", L->path, rank + 1);
                    break;
                }
                st = forge__mbatch_add(L, &mb, s1.p ? s1.p : "", s1.n, s2.p ? s2.p : "", s2.n);
            } else {
                if (!forge__js_str(j, &s1)) {
                    st = forge__fail(L->err, FORGE_ERR_FORMAT, "%s: merge %u is not a string or pair", L->path, rank + 1);
                    break;
                }
                /* split at the first space after the first character (as llama.cpp does) */
                const char *sp = s1.n > 1 ? memchr(s1.p + 1, ' ', s1.n - 1) : NULL;
                if (!sp) { st = forge__fail(L->err, FORGE_ERR_FORMAT, "%s: merge %u '%.*s' has no space", L->path, rank + 1, (int)FORGE__MIN(s1.n, 64), s1.p ? s1.p : ""); break; }
                st = forge__mbatch_add(L, &mb, s1.p, (size_t)(sp - s1.p), sp + 1, s1.n - (size_t)(sp - s1.p) - 1);
            }
            if (st) break;
            rank++;
        } while (forge__js_eat(j, ','));
        if (!st && !forge__js_eat(j, ']')) st = forge__fail(L->err, FORGE_ERR_FORMAT, "%s: model.merges: expected ']'", L->path);
    }
    if (!st) st = forge__mbatch_flush(L, &mb);
    forge__buf_free(&s1);
    forge__buf_free(&s2);
    forge__buf_free(&mb.pool);
    return st;
}

/* Allocates the id tables for n_vocab ids. */
static forge_status forge__tk_alloc(forge__tkload *L, int n_vocab) {
    forge__tokenizer *tk = L->tk;
    tk->n_vocab = n_vocab;
    size_t n = (size_t)(n_vocab ? n_vocab : 1);
    tk->pieces = (const char **)forge__arena_alloc(L->a, n * sizeof(char *), 16);
    tk->piece_len = (uint32_t *)forge__arena_alloc(L->a, n * sizeof(uint32_t), 16);
    tk->is_special = (uint8_t *)forge__arena_alloc(L->a, n, 16);
    if (!tk->pieces || !tk->piece_len || !tk->is_special) return forge__fail(L->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    return FORGE_OK;
}

/* Builds the byte-fallback table, the lookup tables and the tries once pieces are known. */
static forge_status forge__tk_finish_tables(forge__tkload *L) {
    forge__tokenizer *tk = L->tk;
    if (!forge__strtab_init(&tk->addtab, (size_t)tk->n_added, L->a)) return forge__fail(L->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int i = 0; i < tk->n_added; i++) forge__strtab_put(&tk->addtab, tk->added[i].s, tk->added[i].len, tk->added[i].id, false);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tk->byte_id[b] = forge__strtab_get(&tk->vocab, name, 6);
    }
    if (!forge__trie_build(&tk->trie_raw, tk->added, tk->n_added, false, L->a) ||
        !forge__trie_build(&tk->trie_norm, tk->added, tk->n_added, true, L->a))
        return forge__fail(L->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    return FORGE_OK;
}

/* The id of a token named in a config: a string or an AddedToken object {"content": ...}. */
static int32_t forge__tk_named(const forge__tokenizer *tk, const cJSON *v) {
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v)) return -1;
    return forge__tk_lookup(tk, v->valuestring, strlen(v->valuestring));
}

static void forge__tk_add_eos(forge__tokenizer *tk, int32_t id) {
    if (id < 0 || id >= tk->n_vocab || tk->n_eos >= (int)FORGE__ARRAY_LEN(tk->eos_ids)) return;
    for (int i = 0; i < tk->n_eos; i++)
        if (tk->eos_ids[i] == id) return;
    tk->eos_ids[tk->n_eos++] = id;
}

/* End-of-turn and start-of-turn markers of the chat formats forge knows, by their text. */
static const char *const forge__eot_names[] = {"<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<turn|>", "<|end|>", "<|eot|>", "<EOT>",
                                               "<|END_OF_TURN_TOKEN|>", "<|end_of_turn|>"};
static const char *const forge__sot_names[] = {"<|start_header_id|>", "<|im_start|>", "<start_of_turn>", "<|turn>", "<|START_OF_TURN_TOKEN|>"};

static int32_t forge__tk_first_of(const forge__tokenizer *tk, const char *const *names, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int32_t id = forge__tk_lookup(tk, names[i], strlen(names[i]));
        if (id >= 0) return id;
    }
    return -1;
}

/* Fills bos/eos/eot/... from tokenizer_config.json (may be NULL) and what the files say. */
static void forge__tk_special_ids(forge__tokenizer *tk, const cJSON *cfg) {
    int32_t v;
    if (cfg) {
        if ((v = forge__tk_named(tk, cJSON_GetObjectItemCaseSensitive(cfg, "bos_token"))) >= 0) tk->bos = v;
        if ((v = forge__tk_named(tk, cJSON_GetObjectItemCaseSensitive(cfg, "eos_token"))) >= 0) tk->eos = v;
        if ((v = forge__tk_named(tk, cJSON_GetObjectItemCaseSensitive(cfg, "pad_token"))) >= 0) tk->pad = v;
        if ((v = forge__tk_named(tk, cJSON_GetObjectItemCaseSensitive(cfg, "unk_token"))) >= 0) tk->unk = v;
    }
    if (tk->bos < 0 && tk->n_tmpl_pre > 0) tk->bos = tk->tmpl_pre[0];
    if (tk->unk < 0) tk->unk = tk->model_unk;
    static const char *const eos_names[] = {"</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|im_end|>"};
    int32_t text_end = -1; /* the first of these that is a special token ("</s>" may be plain text) */
    for (size_t i = 0; i < FORGE__ARRAY_LEN(eos_names) && text_end < 0; i++) {
        int32_t id = forge__tk_lookup(tk, eos_names[i], strlen(eos_names[i]));
        if (id >= 0 && tk->is_special[id]) text_end = id;
    }
    if (tk->eos < 0) tk->eos = text_end;
    if (tk->eot < 0) tk->eot = forge__tk_first_of(tk, forge__eot_names, FORGE__ARRAY_LEN(forge__eot_names));
    if (tk->sot < 0) tk->sot = forge__tk_first_of(tk, forge__sot_names, FORGE__ARRAY_LEN(forge__sot_names));
    forge__tk_add_eos(tk, tk->eos);
    forge__tk_add_eos(tk, tk->eot);
    /* the end-of-text token ends generation too when the files name another eos (chat models
     * name the end of turn; their generation_config lists both) */
    forge__tk_add_eos(tk, text_end);
    /* a turn that hands over to a tool: Llama 3.1's end of message, Gemma 4's call for results */
    static const char *const more[] = {"<|eom_id|>", "<|tool_response>"};
    for (size_t i = 0; i < FORGE__ARRAY_LEN(more); i++) forge__tk_add_eos(tk, forge__tk_first_of(tk, more + i, 1));
}

/* Parses a tokenizer.json held in memory (json[0..len)); cfg_json (tokenizer_config.json,
 * may be NULL) names bos/eos/pad. Tables go to `a`. */
FORGE__INTERNAL forge_status forge__tokenizer_from_json(forge__tokenizer *tk, const char *json, size_t len, const char *cfg_json,
                                                        size_t cfg_len, forge__arena *a, const char *path, forge__err *err) {
    forge__tokenizer_reset(tk);
    forge__tkload L = {tk, a, path, err};
    forge__js j = {json, json + len, false};
    /* Spans of the parts read with cJSON, and of the big arrays read directly. */
    const char *span[6][2] = {{0}};
    enum { S_ADDED, S_NORM, S_PRE, S_POST, S_DEC, S_MODEL };
    static const char *const keys[] = {"added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder", "model"};
    forge__buf key;
    forge__buf_init(&key, NULL, 0);
    forge_status st = FORGE_OK;
    cJSON *model = NULL, *part = NULL, *cfg = NULL;
    forge__buf ents;
    forge__buf_init(&ents, NULL, 0);
    /* One pass over the file finds the parts; the model object is scanned on the way (its
     * vocab and merges skipped, the merges counted, the small fields parsed). */
    const char *vocab_span = NULL, *merges_span = NULL;
    size_t n_merges = 0;
    model = cJSON_CreateObject();
    if (!model) { st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
    if (!forge__js_eat(&j, '{')) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: not a JSON object", path); goto done; }
    if (!forge__js_eat(&j, '}')) {
        do {
            key.n = 0;
            if (!forge__js_str(&j, &key) || !forge__js_eat(&j, ':')) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: malformed JSON (top-level key)", path); goto done; }
            int which = -1;
            for (int k = 0; k < 6; k++)
                if (key.n == strlen(keys[k]) && !memcmp(key.p, keys[k], key.n)) which = k;
            forge__js_ws(&j);
            const char *s0 = j.p;
            if (which == S_MODEL) {
                forge__js *m = &j;
                if (!forge__js_eat(m, '{')) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: 'model' is not an object", path); goto done; }
                if (!forge__js_eat(m, '}')) {
                    do {
                        key.n = 0;
                        if (!forge__js_str(m, &key) || !forge__js_eat(m, ':')) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: malformed model object", path); goto done; }
                        forge__js_ws(m);
                        const char *v0 = m->p;
                        bool is_merges = key.n == 6 && !memcmp(key.p, "merges", 6);
                        if (!forge__js_skip_n(m, is_merges ? &n_merges : NULL)) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: malformed model object", path); goto done; }
                        if (key.n == 5 && !memcmp(key.p, "vocab", 5)) vocab_span = v0;
                        else if (is_merges) merges_span = v0;
                        else {
                            cJSON *v = cJSON_ParseWithLength(v0, (size_t)(m->p - v0));
                            char *k = strndup(key.p, key.n);
                            if (!v || !k) { cJSON_Delete(v); free(k); st = forge__fail(err, FORGE_ERR_FORMAT, "%s: malformed model field", path); goto done; }
                            cJSON_AddItemToObject(model, k, v);
                            free(k);
                        }
                    } while (forge__js_eat(m, ','));
                    if (!forge__js_eat(m, '}')) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: malformed model object (expected '}')", path); goto done; }
                }
            } else if (!forge__js_skip(&j)) {
                st = forge__fail(err, FORGE_ERR_FORMAT, "%s: malformed JSON (value of a top-level key)", path);
                goto done;
            }
            if (which >= 0) { span[which][0] = s0; span[which][1] = j.p; }
        } while (forge__js_eat(&j, ','));
        if (!forge__js_eat(&j, '}')) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: malformed JSON (expected '}')", path); goto done; }
    }
    if (!span[S_MODEL][0]) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: no 'model'", path); goto done; }
    const char *mtype = forge__json_str(model, "type");
    if (!mtype && vocab_span && merges_span) mtype = "BPE"; /* old files omit the type */
    if (!mtype || strcmp(mtype, "BPE") != 0)
        { st = forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: model type '%s' is not supported (forge implements BPE)", path, mtype ? mtype : "(none)"); goto done; }
    tk->model = FORGE__TKM_BPE;
    tk->byte_fallback = forge__json_bool(model, "byte_fallback", false);
    tk->ignore_merges = forge__json_bool(model, "ignore_merges", false);
    tk->fuse_unk = forge__json_bool(model, "fuse_unk", false);
    {
        const char *cp = forge__json_str(model, "continuing_subword_prefix"), *ew = forge__json_str(model, "end_of_word_suffix");
        if (cp && *cp) { tk->cont_prefix = forge__arena_strdup(a, cp); tk->cont_prefix_len = strlen(cp); }
        if (ew && *ew) { tk->eow_suffix = forge__arena_strdup(a, ew); tk->eow_suffix_len = strlen(ew); }
    }
    if (!vocab_span) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: model has no vocab", path); goto done; }
    int64_t max_id = -1;
    {
        forge__js v = {vocab_span, span[S_MODEL][1], false};
        if ((st = forge__tk_read_vocab(&L, &v, &ents, &max_id))) goto done;
    }
    /* The model vocabulary first; added tokens may then grow the id range. */
    if ((st = forge__tk_alloc(&L, (int)(max_id + 1)))) goto done;
    size_t n_ents = FORGE__VEC_LEN(&ents, forge__tkent), vocab_size = 0;
    if (!forge__strtab_init(&tk->vocab, n_ents, a)) { st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
    for (size_t i = 0; i < n_ents; i++) {
        forge__tkent *e = &FORGE__VEC_AT(&ents, forge__tkent, i);
        tk->pieces[e->id] = e->s;
        tk->piece_len[e->id] = e->len;
        vocab_size += forge__strtab_put(&tk->vocab, e->s, e->len, e->id, true); /* a repeated piece: HF keeps the last */
    }
    if (span[S_ADDED][0]) {
        part = cJSON_ParseWithLength(span[S_ADDED][0], (size_t)(span[S_ADDED][1] - span[S_ADDED][0]));
        if (!cJSON_IsArray(part)) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: added_tokens is not an array", path); goto done; }
        int n = cJSON_GetArraySize(part);
        tk->added = (forge__added *)forge__arena_alloc(a, sizeof(forge__added) * (size_t)(n ? n : 1), 16);
        if (!tk->added) { st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
        /* HF ignores the "id" written in the file: it re-adds the tokens in order, each taking
         * its vocabulary id when its text is there, else the next id after the vocabulary and
         * the added tokens so far (AddedVocabulary::add_tokens). */
        int64_t max_added = -1;
        forge__strtab seen; /* contents already added: HF skips a repeated one */
        if (!forge__strtab_init(&seen, (size_t)n, a)) { st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
        const cJSON *it;
        cJSON_ArrayForEach(it, part) {
            const char *c = forge__json_str(it, "content");
            if (!c || !forge__cstr_valid(c)) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: added token without content in UTF-8", path); goto done; }
            size_t cl = strlen(c);
            char *cs = cl ? forge__arena_strndup(a, c, cl) : NULL;
            if (cl && !cs) { st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
            if (!cl || !forge__strtab_put(&seen, cs, cl, tk->n_added, false)) continue;
            forge__added *ad = &tk->added[tk->n_added++];
            ad->s = cs;
            ad->len = (uint32_t)cl;
            int32_t in_vocab = forge__strtab_get(&tk->vocab, c, cl);
            if (in_vocab >= 0) ad->id = in_vocab;
            else if (max_added < 0) ad->id = (int32_t)vocab_size;
            else ad->id = (int32_t)(max_added >= (int64_t)vocab_size || vocab_size == 0 ? max_added + 1 : (int64_t)vocab_size);
            if (ad->id > max_added) max_added = ad->id;
            if (ad->id >= FORGE__TK_MAX_IDS - 1) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: too many added tokens", path); goto done; }
            ad->special = forge__json_bool(it, "special", false);
            ad->lstrip = forge__json_bool(it, "lstrip", false);
            ad->rstrip = forge__json_bool(it, "rstrip", false);
            ad->single_word = forge__json_bool(it, "single_word", false);
            ad->normalized = forge__json_bool(it, "normalized", !ad->special);
        }
        if (max_added >= tk->n_vocab) { /* grow the id tables */
            const char **pieces = tk->pieces;
            uint32_t *lens = tk->piece_len;
            int old = tk->n_vocab;
            if ((st = forge__tk_alloc(&L, (int)max_added + 1))) goto done;
            memcpy(tk->pieces, pieces, sizeof(char *) * (size_t)old);
            memcpy(tk->piece_len, lens, sizeof(uint32_t) * (size_t)old);
        }
    }
    /* Merges need the vocabulary table. */
    if (merges_span) {
        forge__js mj = {merges_span, span[S_MODEL][1], false};
        if ((st = forge__tk_read_merges(&L, &mj, n_merges))) goto done;
    } else if (!forge__mergetab_init(&tk->merges, 0, a)) { st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
    {
        const char *unk = forge__json_str(model, "unk_token");
        if (unk) {
            tk->model_unk = forge__strtab_get(&tk->vocab, unk, strlen(unk));
            if (tk->model_unk < 0) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: unk_token '%s' is not in the vocabulary", path, unk); goto done; }
        }
    }
    /* The components. */
    for (int k = S_NORM; k <= S_DEC; k++) {
        if (!span[k][0]) continue;
        cJSON_Delete(part);
        part = cJSON_ParseWithLength(span[k][0], (size_t)(span[k][1] - span[k][0]));
        if (!part) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: '%s' is not valid JSON", path, keys[k]); goto done; }
        st = k == S_NORM ? forge__tk_normalizer(&L, part, 0) : k == S_PRE ? forge__tk_pretokenizer(&L, part, 0)
           : k == S_POST ? forge__tk_post(&L, part, 0) : forge__tk_decoder(&L, part, 0);
        if (st) goto done;
    }
    /* A normalized added token is known by its normalized text: matched in normalized text,
     * and its id decodes to it (HF normalizes the content when it adds the token). */
    for (int k = 0; k < tk->n_added; k++) {
        forge__added *ad = &tk->added[k];
        if (ad->normalized && tk->n_norm) {
            forge__tkwork w;
            forge__tkwork_init(&w, tk);
            forge__tk_normalize(&w, ad->s, ad->len);
            char *s = forge__tkwork_oom(&w) ? NULL : forge__arena_strndup(a, w.norm.p ? w.norm.p : "", w.norm.n);
            ad->len = (uint32_t)w.norm.n;
            forge__tkwork_free(&w);
            if (!s) { st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
            ad->s = s;
        }
        tk->pieces[ad->id] = ad->s;
        tk->piece_len[ad->id] = ad->len;
        if (ad->special) tk->is_special[ad->id] = 1;
    }
    if ((st = forge__tk_finish_tables(&L))) goto done;
    if (cfg_json) cfg = cJSON_ParseWithLength(cfg_json, cfg_len);
    forge__tk_special_ids(tk, cfg);
done:
    cJSON_Delete(cfg);
    cJSON_Delete(part);
    cJSON_Delete(model);
    forge__buf_free(&key);
    forge__buf_free(&ents);
    if (st) forge__tokenizer_free(tk);
    return st;
}

/* ---- GGUF vocabularies ---- */

/* llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) -> the split regexes its converters
 * stand for, applied one after the other, each isolating its matches. */
typedef struct forge__gguf_pre {
    const char *names;          /* space-separated names */
    bool ignore_merges;
    const char *regex[6];
} forge__gguf_pre;

#define FORGE__RE_LLAMA3 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define FORGE__RE_QWEN2 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Qwen 3.5: combining marks stay with the letters before them */
#define FORGE__RE_QWEN35 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define FORGE__RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"

/* [2], GPT-2's, is the default where a vocabulary names no pre-tokenizer: keep it third */
static const forge__gguf_pre forge__gguf_pres[] = {
    {"llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 dbrx smaug-bpe", true, {FORGE__RE_LLAMA3}},
    {"qwen2 deepseek-r1-qwen kormo megrez stablelm2 hunyuan grok-2", false, {FORGE__RE_QWEN2}},
    {"gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum jina-v1-en jina-v2-code roberta-bpe mpt olmo jais exaone4 trillion",
     false, {FORGE__RE_GPT2}},
    {"qwen35", false, {FORGE__RE_QWEN35}},
    {"starcoder refact command-r smollm codeshell exaone minerva-7b", false, {"\\p{N}", FORGE__RE_GPT2}},
    {"falcon", false, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", FORGE__RE_GPT2, "[0-9][0-9][0-9]"}},
    {"deepseek-coder", false, {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\\x{4e00}-\\x{9fa5}\\x{0800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+", "\\p{N}"}},
    {"deepseek-llm", false,
     {"[\\r\\n]",
      "\\s?[A-Za-z\\x{b5}\\x{c0}-\\x{d6}\\x{d8}-\\x{f6}\\x{f8}-\\x{1ba}\\x{1bc}-\\x{1bf}\\x{1c4}-\\x{293}\\x{295}-\\x{2af}\\x{370}-\\x{373}"
      "\\x{376}\\x{377}\\x{37b}-\\x{37d}\\x{37f}\\x{386}\\x{388}-\\x{38a}\\x{38c}\\x{38e}-\\x{3a1}\\x{3a3}-\\x{3f5}\\x{3f7}-\\x{481}"
      "\\x{48a}-\\x{52f}\\x{531}-\\x{556}\\x{10a0}-\\x{10c5}\\x{13a0}-\\x{13f5}\\x{13f8}-\\x{13fd}\\x{1c90}-\\x{1cba}\\x{1cbd}-\\x{1cbf}"
      "\\x{1d00}-\\x{1d2b}\\x{1d6b}-\\x{1d77}\\x{1d79}-\\x{1d9a}\\x{1e00}-\\x{1f15}\\x{1f18}-\\x{1f1d}\\x{1f20}-\\x{1f45}\\x{1f48}-\\x{1f4d}"
      "\\x{1f50}-\\x{1f57}\\x{1f59}\\x{1f5b}\\x{1f5d}\\x{1f5f}-\\x{1f7d}\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}\\x{1fbe}\\x{1fc2}-\\x{1fc4}"
      "\\x{1fc6}-\\x{1fcc}\\x{1fd0}-\\x{1fd3}\\x{1fd6}-\\x{1fdb}\\x{1fe0}-\\x{1fec}\\x{1ff2}-\\x{1ff4}\\x{1ff6}-\\x{1ffc}\\x{2102}\\x{2107}"
      "\\x{210a}-\\x{2113}\\x{2115}\\x{2119}-\\x{211d}\\x{2124}\\x{2126}\\x{2128}\\x{212a}-\\x{212d}\\x{212f}-\\x{2134}\\x{2139}"
      "\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}\\x{214e}\\x{2183}\\x{2184}\\x{2c00}-\\x{2c7b}\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}"
      "\\x{2cf2}\\x{2cf3}\\x{a640}-\\x{a66d}\\x{a680}-\\x{a69b}\\x{a722}-\\x{a76f}\\x{a771}-\\x{a787}\\x{a78b}-\\x{a78e}\\x{ab70}-\\x{abbf}"
      "\\x{fb00}-\\x{fb06}\\x{fb13}-\\x{fb17}\\x{ff21}-\\x{ff3a}\\x{ff41}-\\x{ff5a}\\x{10400}-\\x{1044f}\\x{104b0}-\\x{104d3}"
      "\\x{104d8}-\\x{104fb}\\x{10c80}-\\x{10cb2}\\x{10cc0}-\\x{10cf2}\\x{118a0}-\\x{118df}\\x{1e900}-\\x{1e943}]+",
      "\\s?[!-/:-~\\x{ff01}-\\x{ff0f}\\x{ff1a}-\\x{ff5e}\\x{2018}-\\x{201f}\\x{3000}-\\x{3002}]+", "\\s+$",
      "[\\x{4e00}-\\x{9fa5}\\x{0800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+", "\\p{N}+"}},
    {"default", false, {"[\\p{P}\\$\\+<=>\\^~\\|]+", FORGE__RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
};

static bool forge__name_in(const char *names, const char *s, size_t n) {
    for (const char *p = names; *p;) {
        const char *e = strchr(p, ' ');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !memcmp(p, s, n)) return true;
        p += l + (e ? 1 : 0);
    }
    return false;
}

/* Reads tokenizer.ggml.* into the same pipeline tokenizer.json gives. A file without
 * tokenizer.ggml.tokens leaves the tokenizer empty (forge_tokenize then says so). */
static forge_status forge__tokenizer_from_gguf(forge__tokenizer *tk, const forge__gguf *g, forge__arena *a, const char *path,
                                               forge__err *err) {
    forge__tokenizer_reset(tk);
    forge__tkload L = {tk, a, path, err};
    const forge__gguf_kv *kv = forge__gguf_find(g, "tokenizer.ggml.tokens");
    if (!kv) return FORGE_OK;
    if (kv->type != FORGE__GGUF_ARRAY || kv->elem_type != FORGE__GGUF_STRING || kv->count >= FORGE__TK_MAX_IDS)
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: tokenizer.ggml.tokens is not an array of strings", path);
    const char *ms;
    uint64_t ml;
    char model[32] = "llama";
    if (forge__gguf_get_str(g, "tokenizer.ggml.model", &ms, &ml)) snprintf(model, sizeof model, "%.*s", (int)FORGE__MIN(ml, 31), ms);
    /* gemma4: BPE by merge rank over UTF-8 characters (no byte-level mapping), spaces as '▁',
     * byte fallback: HF's Gemma tokenizer.json, and llama.cpp's LLAMA_VOCAB_PRE_TYPE_GEMMA4 */
    bool spm = !strcmp(model, "llama"), g4 = !strcmp(model, "gemma4"), bpe = !strcmp(model, "gpt2") || g4;
    if (!spm && !bpe)
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model '%s' is not supported (llama, gpt2, gemma4)", path, model);
    forge_status st = forge__tk_alloc(&L, (int)kv->count);
    if (st) return st;
    const uint8_t *cur = kv->value;
    for (int i = 0; i < tk->n_vocab; i++) {
        const char *s;
        uint64_t len;
        forge__gguf_next_str(&cur, &s, &len);
        if (len > UINT32_MAX || !(tk->pieces[i] = forge__arena_strndup(a, s, (size_t)len)))
            return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        tk->piece_len[i] = (uint32_t)len;
    }
    const forge__gguf_kv *types = forge__gguf_find(g, "tokenizer.ggml.token_type"), *scores = forge__gguf_find(g, "tokenizer.ggml.scores");
    if (types && (types->type != FORGE__GGUF_ARRAY || (types->elem_type != FORGE__GGUF_INT32 && types->elem_type != FORGE__GGUF_UINT32) || types->count != kv->count))
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: tokenizer.ggml.token_type is not an int32 array of %llu entries", path, (unsigned long long)kv->count);
    if (scores && (scores->type != FORGE__GGUF_ARRAY || scores->elem_type != FORGE__GGUF_FLOAT32 || scores->count != kv->count))
        return forge__fail(err, FORGE_ERR_FORMAT, "%s: tokenizer.ggml.scores is not a float32 array of %llu entries", path, (unsigned long long)kv->count);
    if (!forge__strtab_init(&tk->vocab, (size_t)tk->n_vocab, a)) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int i = 0; i < tk->n_vocab; i++) forge__strtab_put(&tk->vocab, tk->pieces[i], tk->piece_len[i], i, true); /* llama.cpp: the last wins */
    /* llama.cpp: phi-3's special tokens strip the whitespace after them (its HF file says rstrip) */
    const char *gn;
    uint64_t gl;
    bool phi3 = false;
    if (forge__gguf_get_str(g, "general.name", &gn, &gl)) {
        char name[128];
        size_t n = FORGE__MIN(gl, sizeof name - 1);
        for (size_t i = 0; i < n; i++) name[i] = (char)tolower((unsigned char)gn[i]);
        name[n] = 0;
        phi3 = strstr(name, "phi-3") || strstr(name, "phi3");
    }
    /* Token types: 2 unknown, 3 control, 4 user-defined are matched in the text as added tokens. */
    int n_added = 0;
    if (types) {
        tk->added = (forge__added *)forge__arena_alloc(a, sizeof(forge__added) * (size_t)(tk->n_vocab ? tk->n_vocab : 1), 16);
        if (!tk->added) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        for (int i = 0; i < tk->n_vocab; i++) {
            int32_t t;
            memcpy(&t, types->value + 4 * (size_t)i, 4);
            /* text matching runs on valid UTF-8: a token that is not cannot be matched */
            if ((t != 2 && t != 3 && t != 4) || tk->piece_len[i] == 0 || !forge__utf8_valid(tk->pieces[i], tk->piece_len[i])) continue;
            forge__added *ad = &tk->added[n_added++];
            ad->s = tk->pieces[i];
            ad->len = tk->piece_len[i];
            ad->id = i;
            ad->special = t != 4;
            ad->rstrip = phi3 && (ad->special || !strcmp(ad->s, "</s>")) && strcmp(ad->s, "<unk>") && strcmp(ad->s, "<s>") &&
                         strcmp(ad->s, "<|endoftext|>");
            if (ad->special) tk->is_special[i] = 1;
        }
        tk->n_added = n_added;
    }
    int64_t v;
    bool add_bos = spm, add_eos = false;
    if (spm) {
        tk->model = FORGE__TKM_SPM;
        if (scores) {
            tk->scores = (float *)forge__arena_alloc(a, sizeof(float) * (size_t)tk->n_vocab, 16);
            if (!tk->scores) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
            memcpy(tk->scores, scores->value, sizeof(float) * (size_t)tk->n_vocab);
        }
        bool prefix = !forge__gguf_get_int(g, "tokenizer.ggml.add_space_prefix", &v) || v != 0;
        /* llama.cpp: " " before each text fragment at the start or after a token, then spaces -> '▁' */
        if (prefix) tk->norm[tk->n_norm++] = (forge__norm_step){.kind = FORGE__N_PREPEND, .s = "\xe2\x96\x81", .len = 3};
        tk->norm[tk->n_norm++] = (forge__norm_step){.kind = FORGE__N_REPLACE, .pat = {" ", 1, NULL}, .s = "\xe2\x96\x81", .len = 3};
        tk->dec[tk->n_dec++] = (forge__dec_step){.kind = FORGE__D_REPLACE, .pat = {"\xe2\x96\x81", 3, NULL}, .s = " ", .len = 1};
        tk->dec[tk->n_dec++] = (forge__dec_step){.kind = FORGE__D_BYTEFALLBACK};
        tk->dec[tk->n_dec++] = (forge__dec_step){.kind = FORGE__D_FUSE};
        if (prefix) tk->dec[tk->n_dec++] = (forge__dec_step){.kind = FORGE__D_STRIP, .ch = ' ', .start = 1, .stop = 0};
        tk->has_decoder = true;
        tk->byte_fallback = true;
        if (!forge__mergetab_init(&tk->merges, 0, a)) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    } else {
        tk->model = FORGE__TKM_BPE;
        const forge__gguf_kv *mk = forge__gguf_find(g, "tokenizer.ggml.merges");
        if (!mk || mk->type != FORGE__GGUF_ARRAY || mk->elem_type != FORGE__GGUF_STRING)
            return forge__fail(err, FORGE_ERR_FORMAT, "%s: tokenizer.ggml.merges is missing or not an array of strings", path);
        if (!forge__mergetab_init(&tk->merges, (size_t)mk->count, a)) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        forge__mbatch mb;
        memset(&mb, 0, sizeof mb);
        const uint8_t *mc = mk->value;
        for (uint64_t i = 0; i < mk->count && !st; i++) {
            const char *s;
            uint64_t len;
            forge__gguf_next_str(&mc, &s, &len);
            const char *sp = len > 1 ? memchr(s + 1, ' ', (size_t)len - 1) : NULL;
            if (!sp) { st = forge__fail(err, FORGE_ERR_FORMAT, "%s: merge %llu has no space", path, (unsigned long long)i + 1); break; }
            st = forge__mbatch_add(&L, &mb, s, (size_t)(sp - s), sp + 1, (size_t)len - (size_t)(sp - s) - 1);
        }
        if (!st) st = forge__mbatch_flush(&L, &mb);
        forge__buf_free(&mb.pool);
        if (st) return st;
        if (g4) {
            /* llama.cpp splits the text into runs of newlines and runs of anything else, after
             * the spaces became '▁' (HF's file merges the whole text: no token mixes the two) */
            tk->norm[tk->n_norm++] = (forge__norm_step){.kind = FORGE__N_REPLACE, .pat = {" ", 1, NULL}, .s = "\xe2\x96\x81", .len = 3};
            forge__pre_step *sp = &tk->pre[tk->n_pre];
            *sp = (forge__pre_step){.kind = FORGE__P_SPLIT, .beh = FORGE__SB_ISOLATED};
            static const char newline_runs[] = "[^\\n]+|[\\n]+";
            if ((st = forge__tk_regex(tk, newline_runs, strlen(newline_runs), &sp->pat.re, path, "tokenizer.ggml.model", err))) return st;
            tk->n_pre++;
            tk->dec[tk->n_dec++] = (forge__dec_step){.kind = FORGE__D_REPLACE, .pat = {"\xe2\x96\x81", 3, NULL}, .s = " ", .len = 1};
            tk->dec[tk->n_dec++] = (forge__dec_step){.kind = FORGE__D_BYTEFALLBACK};
            tk->dec[tk->n_dec++] = (forge__dec_step){.kind = FORGE__D_FUSE};
            tk->has_decoder = true;
            tk->byte_fallback = true;
            add_bos = true;
        } else {
            const char *ps;
            uint64_t pl;
            const forge__gguf_pre *pre = NULL;
            if (forge__gguf_get_str(g, "tokenizer.ggml.pre", &ps, &pl)) {
                for (size_t i = 0; i < FORGE__ARRAY_LEN(forge__gguf_pres) && !pre; i++)
                    if (forge__name_in(forge__gguf_pres[i].names, ps, (size_t)pl)) pre = &forge__gguf_pres[i];
                if (!pre) return forge__fail(err, FORGE_ERR_UNSUPPORTED, "%s: tokenizer.ggml.pre '%.*s' is not supported", path, (int)FORGE__MIN(pl, 64), ps);
            } else {
                pre = &forge__gguf_pres[2]; /* no pre-tokenizer named: GPT-2's ByteLevel split, as HF's default */
            }
            tk->ignore_merges = pre->ignore_merges;
            add_bos = pre->ignore_merges; /* llama.cpp: the Llama 3 family adds BOS by default */
            for (int r = 0; r < 6 && pre->regex[r]; r++) {
                forge__pre_step *s = &tk->pre[tk->n_pre];
                *s = (forge__pre_step){.kind = FORGE__P_SPLIT, .beh = FORGE__SB_ISOLATED};
                if ((st = forge__tk_regex(tk, pre->regex[r], strlen(pre->regex[r]), &s->pat.re, path, "tokenizer.ggml.pre", err))) return st;
                tk->n_pre++;
            }
            tk->pre[tk->n_pre++] = (forge__pre_step){.kind = FORGE__P_BYTELEVEL};
            tk->dec[tk->n_dec++] = (forge__dec_step){.kind = FORGE__D_BYTELEVEL};
            tk->has_decoder = true;
        }
    }
    if ((st = forge__tk_finish_tables(&L))) return st;
#define FORGE__GGUF_ID(key, field) if (forge__gguf_get_int(g, key, &v) && v >= 0 && v < tk->n_vocab) tk->field = (int32_t)v;
    FORGE__GGUF_ID("tokenizer.ggml.bos_token_id", bos)
    FORGE__GGUF_ID("tokenizer.ggml.eos_token_id", eos)
    FORGE__GGUF_ID("tokenizer.ggml.eot_token_id", eot)
    FORGE__GGUF_ID("tokenizer.ggml.padding_token_id", pad)
    FORGE__GGUF_ID("tokenizer.ggml.unknown_token_id", unk)
#undef FORGE__GGUF_ID
    if (spm && tk->unk < 0 && tk->n_vocab > 0) tk->unk = 0; /* llama.cpp's default for SentencePiece */
    tk->model_unk = tk->unk;
    if (forge__gguf_get_int(g, "tokenizer.ggml.add_bos_token", &v)) add_bos = v != 0;
    if (forge__gguf_get_int(g, "tokenizer.ggml.add_eos_token", &v)) add_eos = v != 0;
    if (add_bos && tk->bos >= 0) tk->tmpl_pre[tk->n_tmpl_pre++] = tk->bos;
    if (add_eos && tk->eos >= 0) tk->tmpl_post[tk->n_tmpl_post++] = tk->eos;
    forge__tk_special_ids(tk, NULL);
    return FORGE_OK;
}

/* ---- Loading from a directory: tokenizer.json, with tokenizer_config.json (bos/eos/pad
 * names) and generation_config.json (every eos id) when they are there. ---- */

static void forge__tk_eos_from_config(forge__tokenizer *tk, const char *path) {
    char *text = NULL;
    size_t len;
    forge__err e;
    if (!forge__file_exists(path) || forge__read_text(path, &text, &len, &e)) return;
    cJSON *o = cJSON_ParseWithLength(text, len), *ids = cJSON_GetObjectItemCaseSensitive(o, "eos_token_id"), *it;
    if (cJSON_IsNumber(ids)) forge__tk_add_eos(tk, forge__json_id(ids)); /* an id out of range is ignored */
    else if (cJSON_IsArray(ids)) cJSON_ArrayForEach(it, ids) forge__tk_add_eos(tk, forge__json_id(it));
    cJSON_Delete(o);
    free(text);
}

/* Loads `json_path` (a tokenizer.json) and the configs beside it. */
static forge_status forge__tokenizer_load_file(forge__tokenizer *tk, const char *json_path, forge__arena *a, forge__err *err) {
    char dir[4096], cfg_path[4200];
    snprintf(dir, sizeof dir, "%s", json_path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
    forge__file f;
    forge_status st = forge__file_map(&f, json_path, err);
    if (st) return st;
    char *cfg = NULL;
    size_t cfg_len = 0;
    snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", dir);
    if (forge__file_exists(cfg_path) && (st = forge__read_text(cfg_path, &cfg, &cfg_len, err))) {
        forge__file_unmap(&f);
        return st;
    }
    st = forge__tokenizer_from_json(tk, (const char *)f.data, (size_t)f.size, cfg, cfg_len, a, json_path, err);
    free(cfg);
    forge__file_unmap(&f);
    if (st) return st;
    snprintf(cfg_path, sizeof cfg_path, "%s/generation_config.json", dir);
    forge__tk_eos_from_config(tk, cfg_path);
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    forge__tk_eos_from_config(tk, cfg_path);
    return FORGE_OK;
}

