/* src/chat.c: Chat.
 * Owns: the families' chat templates, forge_chat, tools in the prompt and tool calls in the reply.
 * May call: base.c, config.c, model.c, session.c, api.c, schema.c, grammar.c, generate.c.
 *
 * The native templates, in C: each follows its Jinja original line for line (trim is
 * Python's str.strip, roles must alternate where the template says so, Qwen's <think>
 * handling, the template's own exception messages). The test suite renders the same
 * conversations with transformers (or jinja2 set up as transformers sets it up) and compares.
 */

typedef enum forge__chat_family {
    FORGE__CHAT_NONE = 0,
    FORGE__CHAT_LLAMA3,
    FORGE__CHAT_CHATML,
    FORGE__CHAT_GEMMA,   /* Gemma 2 and 3: <start_of_turn> */
    FORGE__CHAT_GEMMA4,  /* Gemma 4: <|turn> ... <turn|>, a system turn, the thinking switch */
    FORGE__CHAT_MISTRAL, /* Mistral: [INST] ... [/INST], one of forge__mistral_templates */
} forge__chat_family;

/* The tool-call formats forge renders and parses: Llama 3.1+'s JSON {"name", "parameters"}
 * reply, Qwen 3's <tool_call> JSON blocks, Qwen 3.5's <tool_call><function=...> blocks,
 * Mistral v0.3's [TOOL_CALLS] [...] array and Nemo's, the same without the space, Gemma 4's
 * <|tool_call>call:NAME{...}<tool_call|> in its own notation. */
typedef enum forge__tools {
    FORGE__TOOLS_NONE = 0,
    FORGE__TOOLS_LLAMA3,
    FORGE__TOOLS_QWEN3,
    FORGE__TOOLS_QWEN35,
    FORGE__TOOLS_MISTRAL,
    FORGE__TOOLS_NEMO,
    FORGE__TOOLS_GEMMA4,
} forge__tools;

/* Where a Mistral template puts a first system message. */
typedef enum forge__mistral_system {
    FORGE__MISTRAL_SYSTEM_NONE,  /* nowhere: it is an ordinary message, which the alternation check refuses */
    FORGE__MISTRAL_SYSTEM_FIRST, /* before the first user message's content */
    FORGE__MISTRAL_SYSTEM_LAST,  /* before the last message's content when that message is the user's; else dropped */
} forge__mistral_system;

/* What tells Mistral's [INST] templates apart. All of them write BOS, make user and assistant
 * alternate and end each reply with EOS; none writes anything for add_generation_prompt. */
typedef struct forge__mistral_template {
    const char *marker;            /* a line of the template's text that only it has */
    const char *inst, *inst_end;   /* around a user message */
    const char *reply, *after_eos; /* before an assistant message; after its EOS */
    bool reply_trim;               /* the reply |trim'ed */
    forge__mistral_system system;  /* where a first system message goes */
    forge__tools tools;            /* its tool format (v0.3, Nemo): roles checked first, tool calls and results
                                    * skipped there; each call and result carries a 9-character id */
    const char *alternate_error, *role_error;
} forge__mistral_template;

#define FORGE__MISTRAL_ALTERNATE_V1 "Conversation roles must alternate user/assistant/user/assistant/..."
#define FORGE__MISTRAL_ROLE_V1 "Only user and assistant roles are supported!"
#define FORGE__MISTRAL_ALTERNATE "After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."
#define FORGE__MISTRAL_ROLE "Only user and assistant roles are supported, with the exception of an initial optional system message!"

/* The published templates, tests/fixtures/chat/mistral-*.jinja; the first whose marker the
 * checkpoint's template contains is its own (v0.1's text contains v0.2's user line too). */
static const forge__mistral_template forge__mistral_templates[] = {
    /* Mistral-7B-Instruct-v0.1's first (2023) */
    {"{{ message['content'] + eos_token + ' ' }}", "[INST] ", " [/INST]", "", " ", false, FORGE__MISTRAL_SYSTEM_NONE, FORGE__TOOLS_NONE,
     FORGE__MISTRAL_ALTERNATE_V1, FORGE__MISTRAL_ROLE_V1},
    /* Mistral-7B-Instruct-v0.2's first (2023), which GGUF files of it carry */
    {"{{ '[INST] ' + message['content'] + ' [/INST]' }}", "[INST] ", " [/INST]", "", "", false, FORGE__MISTRAL_SYSTEM_NONE, FORGE__TOOLS_NONE,
     FORGE__MISTRAL_ALTERNATE_V1, FORGE__MISTRAL_ROLE_V1},
    /* the 2024 one of v0.1 and v0.2 (and Mixtral-8x7B-Instruct): a system message */
    {"{{- ' [INST] ' + message['content'] + ' [/INST]' }}", " [INST] ", " [/INST]", " ", "", false, FORGE__MISTRAL_SYSTEM_FIRST, FORGE__TOOLS_NONE,
     FORGE__MISTRAL_ALTERNATE, FORGE__MISTRAL_ROLE},
    /* Mistral-7B-Instruct-v0.3's: [INST] is a control token, tools */
    {"{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}", "[INST] ", "[/INST]", " ", "", true, FORGE__MISTRAL_SYSTEM_LAST, FORGE__TOOLS_MISTRAL,
     FORGE__MISTRAL_ALTERNATE, FORGE__MISTRAL_ROLE},
    /* Mistral-Nemo-Instruct-2407's (Tekken): no spaces */
    {"{{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}", "[INST]", "[/INST]", "", "", false, FORGE__MISTRAL_SYSTEM_LAST, FORGE__TOOLS_NEMO,
     FORGE__MISTRAL_ALTERNATE, FORGE__MISTRAL_ROLE},
};

typedef struct forge__chat_style {
    forge__chat_family family;
    bool gemma4_empty_thought;    /* Gemma 4's 12B / 26B-A4B / 31B template: an empty thought block opens the reply when thinking is off */
    bool qwen3;                   /* Qwen 3's template: <think> handling, the enable_thinking switch */
    bool qwen35;                  /* Qwen 3.5's and 3.6's template: every message trimmed, the think blocks after the last query */
    bool think_default;           /* enable_thinking when no FORGE_CHAT_THINKING_ flag is given: the template's default */
    bool gemma_no_system;         /* Gemma 2's template: a system message is an error */
    const char *default_system;   /* ChatML templates that add one when the first message is not system */
    const char *bos;              /* the BOS text the template writes (Llama 3, Gemma, Mistral) */
    const char *eos;              /* the EOS text it writes after a reply (Mistral) */
    const forge__mistral_template *mistral;
    bool llama3_gen_always;       /* Llama 3.0's first template: the assistant header even without add_generation_prompt */
    bool llama3_dated;            /* Llama 3.1+: a system block with the knowledge cutoff and today's date, always */
    char date[16];                /* its "Today Date" ("%d %b %Y"): the template's date_string, or today (strftime_now) */
} forge__chat_style;

/* A growing string (chat rendering is not on the hot path). */
typedef struct forge__sb {
    char *buf;
    size_t len, cap;
    bool oom;
} forge__sb;

static void forge__sb_put(forge__sb *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *nb = (char *)realloc(b->buf, cap);
        if (!nb) { b->oom = true; return; }
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = 0;
}
static void forge__sb_puts(forge__sb *b, const char *s) { forge__sb_put(b, s, strlen(s)); }

/* Python's str.isspace for the code point at s (its UTF-8 length in *n). */
static bool forge__py_space(const unsigned char *s, size_t avail, size_t *n) {
    *n = 1;
    unsigned c = s[0];
    if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return true;
    if (c < 0x80) return false;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0 && avail >= 2) { cp = (c & 0x1f) << 6 | (s[1] & 0x3f); *n = 2; }
    else if ((c & 0xf0) == 0xe0 && avail >= 3) { cp = (c & 0x0f) << 12 | (s[1] & 0x3f) << 6 | (s[2] & 0x3f); *n = 3; }
    else return false;
    return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* Jinja's trim (str.strip()): [*s, *s + *n) without leading and trailing whitespace. */
static void forge__py_strip(const char **s, size_t *n) {
    const unsigned char *p = (const unsigned char *)*s;
    size_t len = *n, k;
    while (len && forge__py_space(p, len, &k)) { p += k; len -= k; }
    while (len) { /* find the last code point */
        size_t start = len - 1;
        while (start && (p[start] & 0xc0) == 0x80) start--;
        if (!forge__py_space(p + start, len - start, &k)) break;
        len = start;
    }
    *s = (const char *)p;
    *n = len;
}

/* Appends s[0..n) as Jinja's `| trim` leaves it. */
static void forge__sb_put_trimmed(forge__sb *b, const char *s, size_t n) {
    forge__py_strip(&s, &n);
    forge__sb_put(b, s, n);
}

/* str.strip / lstrip / rstrip of one character ('\n') */
static void forge__strip_char(const char **s, size_t *n, char c, bool left, bool right) {
    while (left && *n && **s == c) { (*s)++; (*n)--; }
    while (right && *n && (*s)[*n - 1] == c) (*n)--;
}

static const char *forge__memmem(const char *h, size_t hn, const char *needle) {
    size_t nn = strlen(needle);
    for (size_t i = 0; i + nn <= hn; i++)
        if (!memcmp(h + i, needle, nn)) return h + i;
    return NULL;
}
static const char *forge__memmem_last(const char *h, size_t hn, const char *needle) {
    size_t nn = strlen(needle);
    for (size_t i = hn; i-- > 0;)
        if (i + nn <= hn && !memcmp(h + i, needle, nn)) return h + i;
    return NULL;
}

static bool forge__role_is(const forge_chat_message *m, const char *role) { return m->role && !strcmp(m->role, role); }

/* Python's json.dumps(s, ensure_ascii=False), which transformers' tojson filter is. */
static void forge__sb_json_string(forge__sb *b, const char *s) {
    forge__sb_puts(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        const char *esc = NULL;
        char u[8];
        switch (*p) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (*p < 0x20) { snprintf(u, sizeof u, "\\u%04x", *p); esc = u; }
        }
        if (esc) forge__sb_puts(b, esc);
        else forge__sb_put(b, (const char *)p, 1);
    }
    forge__sb_puts(b, "\"");
}

/* Python's repr of a float (the shortest digits that read back the same; fixed notation when
 * the exponent is in [-4, 16), else d.ddde+XX), as json.dumps writes floats. */
static void forge__sb_py_float(forge__sb *b, double v) {
    char buf[48], digits[24], out[64];
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, v);
        if (strtod(buf, NULL) == v) break;
    }
    snprintf(buf, sizeof buf, "%.*e", prec - 1, v);
    const char *q = buf;
    bool neg = *q == '-';
    if (neg) q++;
    size_t nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    digits[nd] = 0;
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = 0;
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp >= 0) {
            for (int i = 0; i <= exp; i++) out[o++] = (size_t)i < nd ? digits[i] : '0';
            out[o++] = '.';
            if ((size_t)exp + 1 < nd) for (size_t i = (size_t)exp + 1; i < nd; i++) out[o++] = digits[i];
            else out[o++] = '0';
        } else {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -exp - 1; i++) out[o++] = '0';
            for (size_t i = 0; i < nd; i++) out[o++] = digits[i];
        }
        out[o] = 0;
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (size_t i = 1; i < nd; i++) out[o++] = digits[i];
        }
        snprintf(out + o, sizeof out - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    forge__sb_puts(b, out);
}

static void forge__sb_indent(forge__sb *b, int indent, int level) {
    forge__sb_puts(b, "\n");
    for (int i = 0; i < indent * level; i++) forge__sb_put(b, " ", 1);
}

static void forge__json_ws(const char **p, const char *end) {
    while (*p < end && (**p == ' ' || **p == '\t' || **p == '\n' || **p == '\r')) (*p)++;
}

/* The JSON value at *p (text up to end) as Python's json.dumps writes what json.loads reads
 * from it (transformers' tojson): ensure_ascii=False, indent < 0 none (", " and ": "), else
 * newlines and `indent` spaces a level ("," and ": "); integers as written (less a "-" on 0),
 * floats as Python's repr. false on invalid JSON. */
static bool forge__sb_pyjson(forge__sb *b, const char **p, const char *end, int indent, int level) {
    forge__json_ws(p, end);
    if (*p >= end || level > 200) return false;
    char c = **p;
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        (*p)++;
        forge__json_ws(p, end);
        if (*p < end && **p == close) {
            (*p)++;
            forge__sb_put(b, c == '{' ? "{}" : "[]", 2);
            return true;
        }
        forge__sb_put(b, &c, 1);
        for (int k = 0;; k++) {
            if (k) forge__sb_puts(b, indent < 0 ? ", " : ",");
            if (indent >= 0) forge__sb_indent(b, indent, level + 1);
            if (c == '{') {
                forge__json_ws(p, end);
                if (*p >= end || **p != '"' || !forge__sb_pyjson(b, p, end, indent, level + 1)) return false;
                forge__json_ws(p, end);
                if (*p >= end || **p != ':') return false;
                (*p)++;
                forge__sb_puts(b, ": ");
            }
            if (!forge__sb_pyjson(b, p, end, indent, level + 1)) return false;
            forge__json_ws(p, end);
            if (*p < end && **p == ',') { (*p)++; continue; }
            if (*p < end && **p == close) { (*p)++; break; }
            return false;
        }
        if (indent >= 0) forge__sb_indent(b, indent, level);
        forge__sb_put(b, &close, 1);
        return true;
    }
    if (c == '"') { /* decoded, then written as json.dumps writes a str */
        (*p)++;
        forge__sb_puts(b, "\"");
        while (*p < end && **p != '"') {
            unsigned char u = (unsigned char)**p;
            if (u < 0x20) return false;
            if (u != '\\') {
                forge__sb_put(b, *p, 1);
                (*p)++;
                continue;
            }
            if (++*p >= end) return false;
            char e = *(*p)++;
            uint32_t cp;
            switch (e) {
            case '"': forge__sb_puts(b, "\\\""); continue;
            case '\\': forge__sb_puts(b, "\\\\"); continue;
            case '/': forge__sb_puts(b, "/"); continue;
            case 'b': forge__sb_puts(b, "\\b"); continue;
            case 'f': forge__sb_puts(b, "\\f"); continue;
            case 'n': forge__sb_puts(b, "\\n"); continue;
            case 'r': forge__sb_puts(b, "\\r"); continue;
            case 't': forge__sb_puts(b, "\\t"); continue;
            case 'u': {
                cp = 0;
                for (int i = 0; i < 4; i++) {
                    int h = *p < end ? forge__hexval(**p) : -1;
                    if (h < 0) return false;
                    cp = cp * 16 + (uint32_t)h;
                    (*p)++;
                }
                if (cp >= 0xD800 && cp <= 0xDBFF) { /* a surrogate pair */
                    uint32_t lo = 0;
                    if (end - *p < 6 || (*p)[0] != '\\' || (*p)[1] != 'u') return false;
                    for (int i = 2; i < 6; i++) {
                        int h = forge__hexval((*p)[i]);
                        if (h < 0) return false;
                        lo = lo * 16 + (uint32_t)h;
                    }
                    if (lo < 0xDC00 || lo > 0xDFFF) return false;
                    *p += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    return false;
                }
                if (cp < 0x20) {
                    const char *named = cp == 8 ? "\\b" : cp == 9 ? "\\t" : cp == 10 ? "\\n" : cp == 12 ? "\\f" : cp == 13 ? "\\r" : NULL;
                    char u6[8];
                    if (!named) snprintf(u6, sizeof u6, "\\u%04x", cp);
                    forge__sb_puts(b, named ? named : u6);
                } else if (cp == '"' || cp == '\\') {
                    forge__sb_puts(b, cp == '"' ? "\\\"" : "\\\\");
                } else {
                    char enc[4];
                    forge__buf eb;
                    forge__buf_init(&eb, enc, sizeof enc);
                    forge__utf8_put(&eb, cp);
                    forge__sb_put(b, enc, eb.n);
                }
                continue;
            }
            default: return false;
            }
        }
        if (*p >= end) return false;
        (*p)++;
        forge__sb_puts(b, "\"");
        return true;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        const char *s0 = *p;
        bool is_float = false;
        if (**p == '-') (*p)++;
        if (*p >= end || !isdigit((unsigned char)**p)) return false;
        if (**p == '0') (*p)++;
        else while (*p < end && isdigit((unsigned char)**p)) (*p)++;
        if (*p < end && **p == '.') {
            is_float = true;
            (*p)++;
            if (*p >= end || !isdigit((unsigned char)**p)) return false;
            while (*p < end && isdigit((unsigned char)**p)) (*p)++;
        }
        if (*p < end && (**p == 'e' || **p == 'E')) {
            is_float = true;
            (*p)++;
            if (*p < end && (**p == '+' || **p == '-')) (*p)++;
            if (*p >= end || !isdigit((unsigned char)**p)) return false;
            while (*p < end && isdigit((unsigned char)**p)) (*p)++;
        }
        size_t n = (size_t)(*p - s0);
        if (!is_float) {
            if (n == 2 && s0[0] == '-' && s0[1] == '0') forge__sb_puts(b, "0"); /* int("-0") is 0 */
            else forge__sb_put(b, s0, n);
            return true;
        }
        char tmp[512];
        if (n >= sizeof tmp) return false;
        memcpy(tmp, s0, n);
        tmp[n] = 0;
        double v = strtod(tmp, NULL);
        if (!isfinite(v)) forge__sb_puts(b, v < 0 ? "-Infinity" : "Infinity");
        else forge__sb_py_float(b, v);
        return true;
    }
    static const char *const words[3] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t l = strlen(words[i]);
        if ((size_t)(end - *p) >= l && !memcmp(*p, words[i], l)) {
            forge__sb_put(b, words[i], l);
            *p += l;
            return true;
        }
    }
    return false;
}

/* The whole of json[0..n) as json.dumps writes it (a single value; false when it is not one). */
static bool forge__sb_pyjson_all(forge__sb *b, const char *json, size_t n, int indent) {
    const char *p = json, *end = json + n;
    if (!forge__sb_pyjson(b, &p, end, indent, 0)) return false;
    forge__json_ws(&p, end);
    return p == end;
}

/* A tool as transformers passes it to a template, json.dumps'd: {"type": "function", "function":
 * {"name", "description", "parameters"}} (description and parameters when given). */
static forge_status forge__sb_tool(forge__sb *b, const forge_tool *t, int indent, int i, forge__err *err) {
    if (!t->name || !*t->name) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "tool %d has no name", i);
    forge__sb doc = {0};
    forge__sb_puts(&doc, "{\"type\": \"function\", \"function\": {\"name\": ");
    forge__sb_json_string(&doc, t->name);
    if (t->description) {
        forge__sb_puts(&doc, ", \"description\": ");
        forge__sb_json_string(&doc, t->description);
    }
    if (t->parameters) {
        const char *q = t->parameters;
        while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r') q++;
        if (*q != '{') {
            free(doc.buf);
            return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "tool %d (%s): parameters is not a JSON object", i, t->name);
        }
        forge__sb_puts(&doc, ", \"parameters\": ");
        forge__sb_puts(&doc, t->parameters);
    }
    forge__sb_puts(&doc, "}}");
    bool ok = !doc.oom && forge__sb_pyjson_all(b, doc.buf, doc.len, indent);
    free(doc.buf);
    if (doc.oom) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    return ok ? FORGE_OK : forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "tool %d (%s): parameters is not valid JSON", i, t->name);
}

/* A JSON object's text (a tool's parameters, a call's arguments) as json.dumps writes the dict
 * (the template's tojson); false when it is not one. */
static bool forge__sb_pyjson_object(forge__sb *b, const char *json, int indent) {
    const char *q = json;
    forge__json_ws(&q, json + strlen(json));
    return *q == '{' && forge__sb_pyjson_all(b, json, strlen(json), indent);
}

/* A tool call's arguments as json.dumps writes the dict (the template's tojson). */
static forge_status forge__sb_call_args(forge__sb *b, const forge_tool_call *c, int msg, forge__err *err) {
    const char *a = c->arguments ? c->arguments : "{}";
    if (!forge__sb_pyjson_object(b, a, -1))
        return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "message %d: the arguments of tool call '%s' are not a JSON object", msg, c->name);
    return FORGE_OK;
}

/* A JSON string's value (the quoted text at s, n bytes, already checked by forge__sb_pyjson) as
 * its raw UTF-8: json.dumps' escapes undone. */
static void forge__sb_json_unquote(forge__sb *b, const char *s, size_t n) {
    forge__sb q = {0};
    const char *p = s;
    forge__sb_pyjson(&q, &p, s + n, -1, 0); /* ensure_ascii=False: only ", \ and control bytes stay escaped */
    for (size_t i = 1; q.buf && i + 1 < q.len; i++) {
        char c = q.buf[i];
        if (c != '\\') { forge__sb_put(b, &c, 1); continue; }
        c = q.buf[++i];
        if (c == 'u') { /* a control byte: \u00XX */
            char hex[3] = {q.buf[i + 3], q.buf[i + 4], 0};
            char byte = (char)strtol(hex, NULL, 16);
            forge__sb_put(b, &byte, 1);
            i += 4;
            continue;
        }
        char out = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c == 'b' ? '\b' : c == 'f' ? '\f' : c;
        forge__sb_put(b, &out, 1);
    }
    b->oom |= q.oom;
    free(q.buf);
}

/* A tool call's arguments as Qwen 3.5's template writes them: for each key of the object in
 * order, <parameter=KEY>\n, the value (an object or array: tojson; a string as it is; any other
 * value: Python's str of it, so True / False / None and a float's repr), \n</parameter>\n. */
static forge_status forge__sb_qwen35_args(forge__sb *b, const forge_tool_call *c, int msg, forge__err *err) {
    const char *a = c->arguments ? c->arguments : "{}", *end = a + strlen(a), *p = a;
    forge__sb scratch = {0};
    bool ok = false;
    forge__json_ws(&p, end);
    if (p < end && *p == '{') {
        p++;
        forge__json_ws(&p, end);
        ok = p < end && *p == '}' ? (p++, true) : false;
        while (!ok && p < end && *p == '"') {
            const char *k0 = p;
            scratch.len = 0;
            if (!forge__sb_pyjson(&scratch, &p, end, -1, 1)) break;
            forge__sb_puts(b, "<parameter=");
            forge__sb_json_unquote(b, k0, (size_t)(p - k0));
            forge__sb_puts(b, ">\n");
            forge__json_ws(&p, end);
            if (p >= end || *p != ':') break;
            p++;
            forge__json_ws(&p, end);
            const char *v0 = p;
            scratch.len = 0;
            if (p >= end || !forge__sb_pyjson(&scratch, &p, end, -1, 1)) break;
            if (*v0 == '{' || *v0 == '[') forge__sb_put(b, scratch.buf, scratch.len);
            else if (*v0 == '"') forge__sb_json_unquote(b, v0, (size_t)(p - v0));
            else if (*v0 == 't' || *v0 == 'f' || *v0 == 'n') forge__sb_puts(b, *v0 == 't' ? "True" : *v0 == 'f' ? "False" : "None");
            else forge__sb_put(b, scratch.buf, scratch.len); /* a number: json.dumps and str agree */
            forge__sb_puts(b, "\n</parameter>\n");
            forge__json_ws(&p, end);
            if (p < end && *p == ',') { p++; forge__json_ws(&p, end); continue; }
            if (p < end && *p == '}') { p++; ok = true; }
            break;
        }
        forge__json_ws(&p, end);
        ok = ok && p == end;
    }
    b->oom |= scratch.oom;
    free(scratch.buf);
    if (!ok) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "message %d: the arguments of tool call '%s' are not a JSON object", msg, c->name);
    return FORGE_OK;
}

static forge__tools forge__tool_format(const forge__chat_style *st) {
    if (st->family == FORGE__CHAT_LLAMA3 && st->llama3_dated) return FORGE__TOOLS_LLAMA3;
    if (st->family == FORGE__CHAT_CHATML && st->qwen3) return FORGE__TOOLS_QWEN3;
    if (st->family == FORGE__CHAT_CHATML && st->qwen35) return FORGE__TOOLS_QWEN35;
    if (st->family == FORGE__CHAT_MISTRAL) return st->mistral->tools;
    if (st->family == FORGE__CHAT_GEMMA4) return FORGE__TOOLS_GEMMA4;
    return FORGE__TOOLS_NONE;
}

/* The template's family, for messages naming what forge does not render. */
static const char *forge__chat_family_name(const forge__chat_style *st) {
    switch (st->family) {
    case FORGE__CHAT_LLAMA3: return st->llama3_dated ? "Llama 3.1+" : "Llama 3.0";
    case FORGE__CHAT_CHATML: return st->qwen35 ? "Qwen 3.5" : st->qwen3 ? "Qwen 3" : "ChatML (not Qwen 3's template)";
    case FORGE__CHAT_GEMMA: return "Gemma 2 / 3";
    case FORGE__CHAT_GEMMA4: return "Gemma 4";
    case FORGE__CHAT_MISTRAL: return st->mistral->tools == FORGE__TOOLS_MISTRAL ? "Mistral v0.3" : st->mistral->tools ? "Mistral Nemo" : "Mistral v0.1 / v0.2";
    default: return "this model";
    }
}

/* One Llama 3 turn: the role's header, the trimmed content, <|eot_id|>. */
static void forge__llama3_turn(forge__sb *b, const char *role, const char *content) {
    forge__sb_puts(b, "<|start_header_id|>");
    forge__sb_puts(b, role);
    forge__sb_puts(b, "<|end_header_id|>\n\n");
    forge__sb_put_trimmed(b, content, strlen(content));
    forge__sb_puts(b, "<|eot_id|>");
}

/* Whether a user message is a tool result as Qwen's templates wrap one (startswith('<tool_response>')
 * and endswith('</tool_response>')): such a message is no query. */
static bool forge__qwen_tool_response(const char *c, size_t n) {
    static const char open[] = "<tool_response>", close[] = "</tool_response>";
    return n >= sizeof open - 1 && !memcmp(c, open, sizeof open - 1) && n >= sizeof close - 1 &&
           !memcmp(c + n - (sizeof close - 1), close, sizeof close - 1);
}

/* Qwen's ns.last_query_index: the last user message that is not a tool result, -1 when there is
 * none. Qwen 3.5 looks at each message trimmed (render_content(message.content, false)|trim). */
static int forge__qwen_last_query(const forge_chat_message *msgs, int n, bool trim) {
    for (int i = n - 1; i >= 0; i--) {
        const char *c = msgs[i].content;
        size_t cn = strlen(c);
        if (trim) forge__py_strip(&c, &cn);
        if (forge__role_is(&msgs[i], "user") && !forge__qwen_tool_response(c, cn)) return i;
    }
    return -1;
}

/* An assistant message as Qwen's templates split it when '</think>' is in it: the reasoning,
 * content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n'), and the reply,
 * content.split('</think>')[-1].lstrip('\n'). Without '</think>' the reasoning is empty and the
 * reply the whole content. */
static void forge__qwen_split_think(const char **content, size_t *cn, const char **reason, size_t *rn) {
    *reason = "";
    *rn = 0;
    const char *end = forge__memmem(*content, *cn, "</think>");
    if (!end) return;
    const char *r = *content;
    size_t n = (size_t)(end - r);
    forge__strip_char(&r, &n, '\n', false, true);
    const char *open = forge__memmem_last(r, n, "<think>");
    if (open) {
        n -= (size_t)(open + strlen("<think>") - r);
        r = open + strlen("<think>");
    }
    forge__strip_char(&r, &n, '\n', true, false);
    *reason = r;
    *rn = n;
    const char *last = forge__memmem_last(*content, *cn, "</think>") + strlen("</think>");
    *cn -= (size_t)(last - *content);
    *content = last;
    forge__strip_char(content, cn, '\n', true, false);
}

/* One tool result as Qwen's templates write it: results in a row share one user turn, which the
 * first of them opens (open) and the last closes (close). */
static void forge__qwen_tool_result(forge__sb *b, const char *c, size_t cn, bool open, bool close) {
    if (open) forge__sb_puts(b, "<|im_start|>user");
    forge__sb_puts(b, "\n<tool_response>\n");
    forge__sb_put(b, c, cn);
    forge__sb_puts(b, "\n</tool_response>");
    if (close) forge__sb_puts(b, "<|im_end|>\n");
}

/* Qwen 3.5's chat template (tests/fixtures/chat/qwen3.5-*.jinja; Qwen 3.6's renders the same
 * without preserve_thinking, which forge does not pass) for messages of text, line for line:
 * every message's content is trimmed; a first system message opens the prompt (after the
 * # Tools block when there are tools); every reply after the last query carries a think block
 * (its reasoning, or empty), then its tool calls as <tool_call><function=NAME><parameter=P>
 * blocks; the reply opens with <think>\n when thinking is on, else with an empty block.
 * `think`: enable_thinking, its default the template's (off for Qwen3.5-0.8B / -2B, on for 4B
 * and larger). */
static forge_status forge__render_qwen35(const forge_chat_message *msgs, int n, const forge_tool *tools, int n_tools, bool gen, bool think,
                                         forge__sb *b, forge__err *err) {
    if (n == 0) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "No messages provided.");
    if (n_tools > 0) {
        forge__sb_puts(b, "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>");
        for (int t = 0; t < n_tools; t++) {
            forge__sb_puts(b, "\n");
            forge_status ts = forge__sb_tool(b, &tools[t], -1, t, err);
            if (ts) return ts;
        }
        forge__sb_puts(b, "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n"
                          "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
                          "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
                          "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified "
                          "format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required "
                          "parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language "
                          "BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal "
                          "with your current knowledge and do not tell the user about function calls\n</IMPORTANT>");
        if (forge__role_is(&msgs[0], "system")) {
            const char *c = msgs[0].content;
            size_t cn = strlen(c);
            forge__py_strip(&c, &cn);
            if (cn) {
                forge__sb_puts(b, "\n\n");
                forge__sb_put(b, c, cn);
            }
        }
        forge__sb_puts(b, "<|im_end|>\n");
    } else if (forge__role_is(&msgs[0], "system")) { /* no tools: the system turn, trimmed */
        forge__sb_puts(b, "<|im_start|>system\n");
        forge__sb_put_trimmed(b, msgs[0].content, strlen(msgs[0].content));
        forge__sb_puts(b, "<|im_end|>\n");
    }
    int last_query = forge__qwen_last_query(msgs, n, true);
    if (last_query < 0) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "No user query found in messages.");
    for (int i = 0; i < n; i++) {
        const forge_chat_message *m = &msgs[i];
        const char *c = m->content;
        size_t cn = strlen(c);
        forge__py_strip(&c, &cn); /* render_content(message.content, true)|trim */
        if (forge__role_is(m, "system")) {
            if (i > 0) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "System message must be at the beginning.");
        } else if (forge__role_is(m, "user")) {
            forge__sb_puts(b, "<|im_start|>user\n");
            forge__sb_put(b, c, cn);
            forge__sb_puts(b, "<|im_end|>\n");
        } else if (forge__role_is(m, "assistant")) { /* forge's messages carry no reasoning_content */
            const char *reason;
            size_t rn;
            forge__qwen_split_think(&c, &cn, &reason, &rn);
            forge__py_strip(&reason, &rn);
            forge__sb_puts(b, "<|im_start|>assistant\n");
            if (i > last_query) {
                forge__sb_puts(b, "<think>\n");
                forge__sb_put(b, reason, rn);
                forge__sb_puts(b, "\n</think>\n\n");
            }
            forge__sb_put(b, c, cn);
            const char *ct = c;
            size_t ctn = cn;
            forge__py_strip(&ct, &ctn); /* content|trim */
            for (int k = 0; k < m->n_tool_calls; k++) {
                forge__sb_puts(b, k > 0 ? "\n<tool_call>\n<function=" : ctn ? "\n\n<tool_call>\n<function=" : "<tool_call>\n<function=");
                forge__sb_puts(b, m->tool_calls[k].name);
                forge__sb_puts(b, ">\n");
                forge_status as = forge__sb_qwen35_args(b, &m->tool_calls[k], i, err);
                if (as) return as;
                forge__sb_puts(b, "</function>\n</tool_call>");
            }
            forge__sb_puts(b, "<|im_end|>\n");
        } else if (forge__role_is(m, "tool")) { /* loop.previtem is undefined for the first message: no opening */
            forge__qwen_tool_result(b, c, cn, i > 0 && !forge__role_is(&msgs[i - 1], "tool"),
                                    i == n - 1 || !forge__role_is(&msgs[i + 1], "tool"));
        } else {
            return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "Unexpected message role.");
        }
    }
    if (gen) forge__sb_puts(b, think ? "<|im_start|>assistant\n<think>\n" : "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    return FORGE_OK;
}

static bool forge__mistral_tool_result(const forge_chat_message *m) {
    return forge__role_is(m, "tool") || forge__role_is(m, "tool_results");
}

/* A string's length as Python's len counts it: its code points. */
static size_t forge__py_len(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* Mistral v0.3's / Nemo's tool list, [AVAILABLE_TOOLS] [...][/AVAILABLE_TOOLS]: each tool as
 * {"type": "function", "function": {...}} with its name and description between quotes as they
 * are (the template does not escape them) and its parameters as tojson. */
static forge_status forge__mistral_tools(forge__sb *b, const char *sp, const forge_tool *tools, int n_tools, forge__err *err) {
    forge__sb_puts(b, "[AVAILABLE_TOOLS]");
    forge__sb_puts(b, sp);
    forge__sb_puts(b, "[");
    for (int t = 0; t < n_tools; t++) {
        if (!tools[t].name || !*tools[t].name) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "tool %d has no name", t);
        forge__sb_puts(b, "{\"type\": \"function\", \"function\": {\"name\": \"");
        forge__sb_puts(b, tools[t].name);
        forge__sb_puts(b, "\"");
        if (tools[t].description) {
            forge__sb_puts(b, ", \"description\": \"");
            forge__sb_puts(b, tools[t].description);
            forge__sb_puts(b, "\"");
        }
        if (tools[t].parameters) {
            forge__sb_puts(b, ", \"parameters\": ");
            if (!forge__sb_pyjson_object(b, tools[t].parameters, -1))
                return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "tool %d (%s): parameters is not a JSON object", t, tools[t].name);
        }
        forge__sb_puts(b, t + 1 < n_tools ? "}}, " : "}}]");
    }
    forge__sb_puts(b, "[/AVAILABLE_TOOLS]");
    return FORGE_OK;
}

/* Python's == of two user messages as transformers passes them (role, content, and the keys
 * forge gives): the template writes the tools before every user message equal to the last one. */
static bool forge__mistral_same_message(const forge_chat_message *a, const forge_chat_message *b) {
    if (strcmp(a->content, b->content) || a->n_tool_calls || b->n_tool_calls) return a == b;
    return (!a->tool_call_id && !b->tool_call_id) || (a->tool_call_id && b->tool_call_id && !strcmp(a->tool_call_id, b->tool_call_id));
}

static const char forge__mistral_id_error[] = "Tool call IDs should be alphanumeric strings with length 9!";

/* Mistral's [INST] templates (forge__mistral_templates), line for line: a first system message
 * taken out where the template takes one, BOS, then each message in turn, user and assistant
 * alternating. v0.3's and Nemo's check the roles before writing anything, skipping tool calls
 * and results there; they write the tools before the last user message, an assistant's calls as
 * [TOOL_CALLS] [{"name", "arguments", "id"}] then EOS, a result as [TOOL_RESULTS] {"content":
 * CONTENT, "call_id": ID} with the content as it is, and refuse an id that is not 9 characters. */
static forge_status forge__render_mistral(const forge__chat_style *st, const forge_chat_message *msgs, int n, const forge_tool *tools,
                                          int n_tools, forge__sb *b, forge__err *err) {
    const forge__mistral_template *t = st->mistral;
    const char *sp = t->tools == FORGE__TOOLS_MISTRAL ? " " : "";
    if (n == 0 && t->system != FORGE__MISTRAL_SYSTEM_NONE) /* messages[0]["role"] fails on no messages */
        return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "the conversation has no messages");
    int first = t->system != FORGE__MISTRAL_SYSTEM_NONE && forge__role_is(&msgs[0], "system") ? 1 : 0;
    int last_user = -1;
    if (t->tools)
        for (int i = first, k = 0; i < n; i++) {
            if (forge__role_is(&msgs[i], "user")) last_user = i;
            if (!forge__mistral_tool_result(&msgs[i]) && msgs[i].n_tool_calls == 0 && forge__role_is(&msgs[i], "user") != (k++ % 2 == 0))
                return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "%s", t->alternate_error);
        }
    forge__sb_puts(b, st->bos);
    for (int i = first; i < n; i++) {
        const forge_chat_message *m = &msgs[i];
        bool user = forge__role_is(m, "user");
        if (!t->tools && user != ((i - first) % 2 == 0))
            return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "%s", t->alternate_error);
        if (user) {
            if (n_tools > 0 && forge__mistral_same_message(m, &msgs[last_user])) {
                forge_status ts = forge__mistral_tools(b, sp, tools, n_tools, err);
                if (ts) return ts;
            }
            forge__sb_puts(b, t->inst);
            if (first && i == (t->system == FORGE__MISTRAL_SYSTEM_FIRST ? first : n - 1)) {
                forge__sb_puts(b, msgs[0].content);
                forge__sb_puts(b, "\n\n");
            }
            forge__sb_puts(b, m->content);
            forge__sb_puts(b, t->inst_end);
        } else if (t->tools && m->n_tool_calls > 0) {
            forge__sb_puts(b, "[TOOL_CALLS]");
            forge__sb_puts(b, sp);
            forge__sb_puts(b, "[");
            for (int k = 0; k < m->n_tool_calls; k++) { /* tool_call.function|tojson, its } replaced by the id's */
                const forge_tool_call *c = &m->tool_calls[k];
                forge__sb_puts(b, "{\"name\": ");
                forge__sb_json_string(b, c->name);
                forge__sb_puts(b, ", \"arguments\": ");
                forge_status as = forge__sb_call_args(b, c, i, err);
                if (as) return as;
                if (!c->id || forge__py_len(c->id) != 9) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "%s", forge__mistral_id_error);
                forge__sb_puts(b, ", \"id\": \"");
                forge__sb_puts(b, c->id);
                forge__sb_puts(b, "\"}");
                forge__sb_puts(b, k + 1 < m->n_tool_calls ? ", " : "]");
            }
            forge__sb_puts(b, st->eos);
        } else if (forge__role_is(m, "assistant")) {
            forge__sb_puts(b, t->reply);
            if (t->reply_trim)
                forge__sb_put_trimmed(b, m->content, strlen(m->content));
            else
                forge__sb_puts(b, m->content);
            forge__sb_puts(b, st->eos);
            forge__sb_puts(b, t->after_eos);
        } else if (t->tools && forge__mistral_tool_result(m)) {
            forge__sb_puts(b, "[TOOL_RESULTS]");
            forge__sb_puts(b, sp);
            forge__sb_puts(b, "{\"content\": ");
            forge__sb_puts(b, m->content);
            forge__sb_puts(b, ", ");
            if (!m->tool_call_id || forge__py_len(m->tool_call_id) != 9)
                return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "%s", forge__mistral_id_error);
            forge__sb_puts(b, "\"call_id\": \"");
            forge__sb_puts(b, m->tool_call_id);
            forge__sb_puts(b, "\"}[/TOOL_RESULTS]");
        } else {
            return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "%s", t->role_error);
        }
    }
    return FORGE_OK;
}

/* ---- Gemma 4's tools: declarations, calls and responses in its own notation ----
 * Gemma 4's template writes JSON values its own way (format_argument): strings between <|"|>
 * marks, as they are; objects with their keys sorted (Jinja's dictsort: case-insensitive) and
 * bare or <|"|>-marked; numbers as Python's str; no spaces. A JSON text is read into a tree of
 * forge__jv first, the numbers already written as Python writes them. */
typedef struct forge__jv {
    char kind;                 /* 'o' object, 'a' array, 's' string, 'n' number, 't' / 'f' true / false, 'z' null */
    char *text;                /* 's': the string; 'n': Python's str of the number */
    char *key;                 /* a member's key */
    struct forge__jv *kids;    /* 'o' / 'a': [n_kids] */
    int n_kids;
} forge__jv;

static void forge__jv_free(forge__jv *v) {
    for (int i = 0; i < v->n_kids; i++) forge__jv_free(&v->kids[i]);
    free(v->kids);
    free(v->text);
    free(v->key);
    memset(v, 0, sizeof *v);
}

/* A JSON string token at [s, e) (checked) as its text, malloc'd. */
static char *forge__jv_string(const char *s, const char *e) {
    forge__sb t = {0};
    forge__sb_json_unquote(&t, s, (size_t)(e - s));
    forge__sb_put(&t, "", 1);
    if (t.oom) {
        free(t.buf);
        return NULL;
    }
    return t.buf;
}

/* recursion: a JSON value holds values */
static bool forge__jv_parse(const char **p, const char *end, forge__jv *v, int depth);

/* The JSON value at *p into v (on failure v holds what it read, for forge__jv_free). */
static bool forge__jv_parse(const char **p, const char *end, forge__jv *v, int depth) {
    memset(v, 0, sizeof *v);
    forge__json_ws(p, end);
    if (*p >= end || depth > 64) return false;
    if (**p == '{' || **p == '[') {
        bool obj = **p == '{';
        v->kind = obj ? 'o' : 'a';
        (*p)++;
        forge__json_ws(p, end);
        if (*p < end && **p == (obj ? '}' : ']')) {
            (*p)++;
            return true;
        }
        for (;;) {
            if (v->n_kids % 8 == 0) {
                forge__jv *k = (forge__jv *)realloc(v->kids, sizeof *k * (size_t)(v->n_kids + 8));
                if (!k) return false;
                v->kids = k;
            }
            forge__jv *kid = &v->kids[v->n_kids];
            memset(kid, 0, sizeof *kid);
            v->n_kids++;
            char *key = NULL;
            if (obj) {
                forge__json_ws(p, end);
                const char *k0 = *p;
                forge__sb skip = {0};
                bool ok = *p < end && **p == '"' && forge__sb_pyjson(&skip, p, end, -1, depth + 1);
                free(skip.buf);
                if (!ok || !(key = forge__jv_string(k0, *p))) return false;
                forge__json_ws(p, end);
                if (*p >= end || **p != ':') {
                    free(key);
                    return false;
                }
                (*p)++;
            }
            bool ok = forge__jv_parse(p, end, kid, depth + 1);
            kid->key = key;
            if (!ok) return false;
            forge__json_ws(p, end);
            if (*p < end && **p == ',') { (*p)++; continue; }
            if (*p < end && **p == (obj ? '}' : ']')) { (*p)++; return true; }
            return false;
        }
    }
    const char *t0 = *p;
    forge__sb tok = {0};
    bool ok = forge__sb_pyjson(&tok, p, end, -1, depth);
    forge__sb_put(&tok, "", 1);
    if (ok && !tok.oom) {
        v->kind = *t0 == '"' ? 's' : *t0 == 't' ? 't' : *t0 == 'f' ? 'f' : *t0 == 'n' ? 'z' : 'n';
        if (v->kind == 's') v->text = forge__jv_string(t0, *p);
        else if (v->kind == 'n') v->text = strdup(tok.buf);
        ok = (v->kind != 's' && v->kind != 'n') || v->text;
    }
    free(tok.buf);
    return ok && !tok.oom;
}

/* A JSON object's text into *v; false (v empty) when it is not one. */
static bool forge__jv_object(const char *json, forge__jv *v) {
    const char *p = json, *end = json + strlen(json);
    bool ok = forge__jv_parse(&p, end, v, 0);
    forge__json_ws(&p, end);
    if (ok && p == end && v->kind == 'o') return true;
    forge__jv_free(v);
    return false;
}

/* value[key] as Jinja reads it: a member of an object, else undefined (NULL). */
static const forge__jv *forge__jv_get(const forge__jv *v, const char *key) {
    for (int i = 0; v && v->kind == 'o' && i < v->n_kids; i++)
        if (!strcmp(v->kids[i].key, key)) return &v->kids[i];
    return NULL;
}

/* Jinja's truth of a value (undefined: false). */
static bool forge__jv_truthy(const forge__jv *v) {
    if (!v) return false;
    switch (v->kind) {
    case 'o': case 'a': return v->n_kids > 0;
    case 's': return v->text[0] != 0;
    case 'n': return strtod(v->text, NULL) != 0;
    case 't': return true;
    default: return false;
    }
}

/* An object's members in dictsort's order: by key lower-cased (code point by code point; ties
 * keep their order). */
static int forge__jv_key_cmp(const void *a, const void *b) {
    const forge__jv *x = *(const forge__jv *const *)a, *y = *(const forge__jv *const *)b;
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)x->key, *q = (const utf8proc_uint8_t *)y->key;
    for (;;) {
        utf8proc_int32_t c = 0, d = 0;
        utf8proc_ssize_t np = *p ? utf8proc_iterate(p, -1, &c) : 0, nq = *q ? utf8proc_iterate(q, -1, &d) : 0;
        if (np < 0) np = 1, c = *p; /* (keys are valid UTF-8: forge__jv_string read them) */
        if (nq < 0) nq = 1, d = *q;
        c = utf8proc_tolower(c);
        d = utf8proc_tolower(d);
        if (c != d) return c < d ? -1 : 1;
        if (!np) return x < y ? -1 : x > y;
        p += np;
        q += nq;
    }
}

/* v's members (an object's), sorted as dictsort sorts them: malloc'd pointers, NULL when empty
 * or out of memory (*oom). */
static const forge__jv **forge__jv_sorted(const forge__jv *v, bool *oom) {
    if (v->n_kids == 0) return NULL;
    const forge__jv **k = (const forge__jv **)malloc(sizeof *k * (size_t)v->n_kids);
    if (!k) {
        *oom = true;
        return NULL;
    }
    for (int i = 0; i < v->n_kids; i++) k[i] = &v->kids[i];
    qsort(k, (size_t)v->n_kids, sizeof *k, forge__jv_key_cmp);
    return k;
}

#define FORGE__G4_Q "<|\"|>" /* Gemma 4's string mark */

/* format_argument(v, escape_keys): the template's notation of a JSON value. */
static void forge__g4_arg(forge__sb *b, const forge__jv *v, bool escape_keys) {
    switch (v->kind) {
    case 'z': forge__sb_puts(b, "null"); break;
    case 't': forge__sb_puts(b, "true"); break;
    case 'f': forge__sb_puts(b, "false"); break;
    case 'n': forge__sb_puts(b, v->text); break;
    case 's':
        forge__sb_puts(b, FORGE__G4_Q);
        forge__sb_puts(b, v->text);
        forge__sb_puts(b, FORGE__G4_Q);
        break;
    case 'a':
        forge__sb_puts(b, "[");
        for (int i = 0; i < v->n_kids; i++) {
            if (i) forge__sb_puts(b, ",");
            forge__g4_arg(b, &v->kids[i], escape_keys);
        }
        forge__sb_puts(b, "]");
        break;
    default: {
        const forge__jv **k = forge__jv_sorted(v, &b->oom);
        forge__sb_puts(b, "{");
        for (int i = 0; k && i < v->n_kids; i++) {
            if (i) forge__sb_puts(b, ",");
            if (escape_keys) forge__sb_puts(b, FORGE__G4_Q);
            forge__sb_puts(b, k[i]->key);
            if (escape_keys) forge__sb_puts(b, FORGE__G4_Q);
            forge__sb_puts(b, ":");
            forge__g4_arg(b, k[i], escape_keys);
        }
        forge__sb_puts(b, "}");
        free(k);
    }
    }
}

/* Whether Python's repr writes a string as it is (no control characters to escape). */
static bool forge__py_printable(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7F) return false;
    return true;
}

/* Python's str() of a value as {{ v }} prints it (undefined: ""), upper-cased when `upper` (the
 * template's |upper); false for what forge does not write so (an object, a list of other than
 * plain strings). */
static bool forge__g4_str(forge__sb *b, const forge__jv *v, bool upper) {
    forge__sb t = {0};
    bool ok = true;
    if (!v) {
    } else if (v->kind == 's' || v->kind == 'n') {
        forge__sb_puts(&t, v->text);
    } else if (v->kind == 't' || v->kind == 'f' || v->kind == 'z') {
        forge__sb_puts(&t, v->kind == 't' ? "True" : v->kind == 'f' ? "False" : "None");
    } else if (v->kind == 'a') { /* repr of a list of strings: ['a', 'b'] */
        forge__sb_puts(&t, "[");
        for (int i = 0; i < v->n_kids && ok; i++) {
            const char *s = v->kids[i].text;
            ok = v->kids[i].kind == 's' && !strpbrk(s, "'\\\"") && forge__py_printable(s);
            if (i) forge__sb_puts(&t, ", ");
            forge__sb_puts(&t, "'");
            if (ok) forge__sb_puts(&t, s);
            forge__sb_puts(&t, "'");
        }
        forge__sb_puts(&t, "]");
    } else {
        ok = false;
    }
    if (ok && upper && t.buf) { /* str.upper, code point by code point */
        forge__sb u = {0};
        const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)t.buf, *end = p + t.len;
        while (p < end) {
            utf8proc_int32_t c;
            utf8proc_ssize_t n = utf8proc_iterate(p, end - p, &c);
            if (n <= 0) { n = 1; c = *p; }
            utf8proc_uint8_t enc[4];
            utf8proc_ssize_t m = utf8proc_encode_char(utf8proc_toupper(c), enc);
            forge__sb_put(&u, (const char *)enc, (size_t)m);
            p += n;
        }
        free(t.buf);
        t = u;
    }
    if (ok) forge__sb_put(b, t.buf ? t.buf : "", t.len);
    b->oom |= t.oom;
    free(t.buf);
    return ok;
}

/* A value's str() upper-cased (the template's `| upper`), malloc'd; NULL when forge__g4_str
 * does not write it, or out of memory. */
static char *forge__g4_upper(const forge__jv *v) {
    forge__sb t = {0};
    bool ok = forge__g4_str(&t, v, true);
    forge__sb_put(&t, "", 1);
    if (ok && !t.oom) return t.buf;
    free(t.buf);
    return NULL;
}

/* A `required` list as the template writes it: [<|"|>a<|"|>,...] of its items' str(). */
static bool forge__g4_required(forge__sb *b, const forge__jv *req) {
    if (req->kind != 'a') return false;
    forge__sb_puts(b, "required:[");
    for (int i = 0; i < req->n_kids; i++) {
        if (i) forge__sb_puts(b, ",");
        forge__sb_puts(b, FORGE__G4_Q);
        if (!forge__g4_str(b, &req->kids[i], false)) return false;
        forge__sb_puts(b, FORGE__G4_Q);
    }
    forge__sb_puts(b, "]");
    return true;
}

/* recursion: a schema's properties hold schemas */
static bool forge__g4_params(forge__sb *b, const forge__jv *props, bool filter_keys, const char **why);

/* format_parameters(properties, required, filter_keys), line for line; false with *why naming
 * what forge does not write as the template would. */
static bool forge__g4_params(forge__sb *b, const forge__jv *props, bool filter_keys, const char **why) {
    static const char *const standard[] = {"description", "type", "properties", "required", "nullable"};
    const forge__jv **k = forge__jv_sorted(props, &b->oom);
    bool first = true, ok = true;
    for (int i = 0; k && ok && i < props->n_kids; i++) {
        const forge__jv *v = k[i];
        bool skip = false;
        for (int s = 0; filter_keys && s < 5; s++) skip |= !strcmp(v->key, standard[s]);
        if (skip) continue;
        if (!first) forge__sb_puts(b, ",");
        first = false;
        forge__sb_puts(b, v->key);
        forge__sb_puts(b, ":{");
        bool comma = false;
#define FORGE__G4_COMMA() do { if (comma) forge__sb_puts(b, ","); comma = true; } while (0)
        const forge__jv *desc = forge__jv_get(v, "description");
        if (forge__jv_truthy(desc)) {
            forge__sb_puts(b, "description:" FORGE__G4_Q);
            if (!(ok = forge__g4_str(b, desc, false))) *why = "a description that is not a string or a number";
            forge__sb_puts(b, FORGE__G4_Q);
            comma = true;
        }
        char *upper = ok ? forge__g4_upper(forge__jv_get(v, "type")) : NULL;
        const char *type = upper ? upper : "";
        if (ok && !upper) ok = false, *why = "a \"type\" that is neither a string nor a list of strings";
        const forge__jv *items = forge__jv_get(v, "items");
        if (!ok) {
        } else if (!strcmp(type, "STRING")) {
            const forge__jv *en = forge__jv_get(v, "enum");
            if (forge__jv_truthy(en)) {
                FORGE__G4_COMMA();
                forge__sb_puts(b, "enum:");
                forge__g4_arg(b, en, true);
            }
        } else if (!strcmp(type, "ARRAY") && items && items->kind == 'o' && items->n_kids > 0) {
            FORGE__G4_COMMA();
            forge__sb_puts(b, "items:{");
            const forge__jv **ik = forge__jv_sorted(items, &b->oom);
            bool ifirst = true;
            for (int j = 0; ik && ok && j < items->n_kids; j++) {
                const forge__jv *iv = ik[j];
                if (iv->kind == 'z') continue;
                if (!ifirst) forge__sb_puts(b, ",");
                ifirst = false;
                if (!strcmp(iv->key, "properties")) {
                    forge__sb_puts(b, "properties:{");
                    if (iv->kind == 'o') ok = forge__g4_params(b, iv, false, why);
                    forge__sb_puts(b, "}");
                } else if (!strcmp(iv->key, "required")) {
                    if (!(ok = forge__g4_required(b, iv))) *why = "a \"required\" that is not a list";
                } else if (!strcmp(iv->key, "type")) {
                    forge__sb_puts(b, "type:");
                    if (iv->kind == 's' || iv->kind == 'a') {
                        forge__sb_puts(b, iv->kind == 'a' ? "[" : "");
                        for (int e = 0; ok && e < (iv->kind == 'a' ? iv->n_kids : 1); e++) {
                            const forge__jv *one = iv->kind == 'a' ? &iv->kids[e] : iv;
                            if (e) forge__sb_puts(b, ",");
                            forge__sb_puts(b, FORGE__G4_Q);
                            ok = one->kind == 's' && forge__g4_str(b, one, true);
                            forge__sb_puts(b, FORGE__G4_Q);
                        }
                        forge__sb_puts(b, iv->kind == 'a' ? "]" : "");
                    } else {
                        ok = false;
                    }
                    if (!ok) *why = "an item \"type\" that is neither a string nor a list of strings";
                } else {
                    forge__sb_puts(b, iv->key);
                    forge__sb_puts(b, ":");
                    forge__g4_arg(b, iv, true);
                }
            }
            free(ik);
            forge__sb_puts(b, "}");
        }
        if (ok && forge__jv_truthy(forge__jv_get(v, "nullable"))) {
            FORGE__G4_COMMA();
            forge__sb_puts(b, "nullable:true");
        }
        if (ok && !strcmp(type, "OBJECT")) {
            const forge__jv *pp = forge__jv_get(v, "properties"), *req = forge__jv_get(v, "required");
            FORGE__G4_COMMA();
            forge__sb_puts(b, "properties:{");
            ok = pp && pp->kind == 'o' ? forge__g4_params(b, pp, false, why) : forge__g4_params(b, v, true, why);
            forge__sb_puts(b, "}");
            if (ok && forge__jv_truthy(req)) {
                FORGE__G4_COMMA();
                if (!(ok = forge__g4_required(b, req))) *why = "a \"required\" that is not a list";
            }
        }
        FORGE__G4_COMMA();
#undef FORGE__G4_COMMA
        forge__sb_puts(b, "type:" FORGE__G4_Q);
        forge__sb_puts(b, type);
        forge__sb_puts(b, FORGE__G4_Q "}");
        free(upper);
    }
    free(k);
    return ok;
}

/* <|tool>declaration:NAME{description:<|"|>...<|"|>,parameters:{...}}<tool|>: a tool as
 * format_function_declaration writes it. */
static forge_status forge__g4_declaration(forge__sb *b, const forge_tool *t, int i, forge__err *err) {
    if (!t->name || !*t->name) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "tool %d has no name", i);
    forge__jv params = {0};
    if (t->parameters && !forge__jv_object(t->parameters, &params))
        return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "tool %d (%s): parameters is not a JSON object", i, t->name);
    const char *why = NULL;
    bool ok = true;
    forge__sb_puts(b, "<|tool>declaration:");
    forge__sb_puts(b, t->name);
    forge__sb_puts(b, "{description:" FORGE__G4_Q);
    forge__sb_puts(b, t->description ? t->description : "");
    forge__sb_puts(b, FORGE__G4_Q);
    if (forge__jv_truthy(&params)) {
        const forge__jv *props = forge__jv_get(&params, "properties"), *req = forge__jv_get(&params, "required"), *type = forge__jv_get(&params, "type");
        forge__sb_puts(b, ",parameters:{");
        if (forge__jv_truthy(props)) {
            forge__sb_puts(b, "properties:{");
            if (props->kind != 'o') ok = false, why = "\"properties\" is not an object";
            else ok = forge__g4_params(b, props, false, &why);
            forge__sb_puts(b, "},");
        }
        if (ok && forge__jv_truthy(req)) {
            if (!(ok = forge__g4_required(b, req))) why = "\"required\" is not a list";
            forge__sb_puts(b, ",");
        }
        if (ok && forge__jv_truthy(type)) {
            forge__sb_puts(b, "type:" FORGE__G4_Q);
            if (!(ok = forge__g4_str(b, type, true))) why = "a \"type\" that is neither a string nor a list of strings";
            forge__sb_puts(b, FORGE__G4_Q "}");
        }
    }
    forge__sb_puts(b, "}<tool|>");
    forge__jv_free(&params);
    if (!ok) return forge__fail(err, FORGE_ERR_UNSUPPORTED, "tool %d (%s): parameters: forge does not write %s as Gemma 4's template does", i, t->name, why);
    return FORGE_OK;
}

/* <|tool_call>call:NAME{k:v,...}<tool_call|>: a call's arguments in key order, bare keys. */
static forge_status forge__g4_call(forge__sb *b, const forge_tool_call *c, int msg, forge__err *err) {
    forge__jv args = {0};
    if (c->arguments && !forge__jv_object(c->arguments, &args))
        return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "message %d: the arguments of tool call '%s' are not a JSON object", msg, c->name);
    forge__sb_puts(b, "<|tool_call>call:");
    forge__sb_puts(b, c->name);
    forge__sb_puts(b, "{");
    const forge__jv **k = forge__jv_sorted(&args, &b->oom);
    for (int i = 0; k && i < args.n_kids; i++) {
        if (i) forge__sb_puts(b, ",");
        forge__sb_puts(b, k[i]->key);
        forge__sb_puts(b, ":");
        forge__g4_arg(b, k[i], false);
    }
    free(k);
    forge__sb_puts(b, "}<tool_call|>");
    forge__jv_free(&args);
    return FORGE_OK;
}

/* strip_thinking: every <|channel>...<channel|> span out of an assistant's content (n bytes at
 * p), trimmed. */
static void forge__g4_strip_thinking(forge__sb *b, const char *p, size_t n) {
    forge__sb kept = {0};
    for (const char *end = p + n;;) {
        const char *close = forge__memmem(p, (size_t)(end - p), "<channel|>");
        size_t len = close ? (size_t)(close - p) : (size_t)(end - p);
        const char *open = forge__memmem(p, len, "<|channel>");
        forge__sb_put(&kept, p, open ? (size_t)(open - p) : len);
        if (!close) break;
        p = close + strlen("<channel|>");
    }
    forge__sb_put_trimmed(b, kept.buf ? kept.buf : "", kept.len);
    b->oom |= kept.oom;
    free(kept.buf);
}

/* Gemma 4's chat_template.jinja (2026-07-09), line for line: a system turn first when thinking is
 * on, tools are given or the first message is a system or developer message (<|think|>, that
 * message, the tools' declarations); then one turn per message but "tool" ones (assistant as
 * model; an assistant message right after another continues its turn), an assistant's calls,
 * then the results of the "tool" messages after it (named by the call whose id they answer);
 * a call without results leaves <|tool_response> for the model; a turn of calls and results
 * with no content, last, stays open for the reply; the reply opens with <|turn>model. */
static forge_status forge__render_gemma4(const forge__chat_style *st, const forge_chat_message *msgs, int n, const forge_tool *tools,
                                         int n_tools, bool gen, bool think, forge__sb *b, forge__err *err) {
    enum { G4_NONE, G4_THINK, G4_TOOL, G4_CALL, G4_RESPONSE } prev = G4_NONE;
    int first = n > 0 && (forge__role_is(&msgs[0], "system") || forge__role_is(&msgs[0], "developer")) ? 1 : 0;
    forge__sb_puts(b, st->bos);
    if (think || n_tools > 0 || first) {
        forge__sb_puts(b, "<|turn>system\n");
        if (think) {
            forge__sb_puts(b, "<|think|>\n");
            prev = G4_THINK;
        }
        if (first) forge__sb_put_trimmed(b, msgs[0].content, strlen(msgs[0].content));
        for (int t = 0; t < n_tools; t++) {
            forge_status ts = forge__g4_declaration(b, &tools[t], t, err);
            if (ts) return ts;
            prev = G4_TOOL;
        }
        forge__sb_puts(b, "<turn|>\n");
    }
    const char *prev_role = NULL; /* the last message's role that was not "tool" */
    for (int i = first; i < n; i++) {
        const forge_chat_message *m = &msgs[i];
        if (forge__role_is(m, "tool")) continue;
        prev = G4_NONE;
        bool model = forge__role_is(m, "assistant");
        if (!(model && prev_role && !strcmp(prev_role, "assistant"))) {
            forge__sb_puts(b, "<|turn>");
            forge__sb_puts(b, model ? "model" : m->role);
            forge__sb_puts(b, "\n");
        }
        for (int k = 0; k < m->n_tool_calls; k++) {
            forge_status cs = forge__g4_call(b, &m->tool_calls[k], i, err);
            if (cs) return cs;
            prev = G4_CALL;
        }
        bool responded = false;
        for (int r = i + 1; m->n_tool_calls > 0 && r < n && forge__role_is(&msgs[r], "tool"); r++) {
            const char *name = "unknown", *id = msgs[r].tool_call_id; /* the last call whose id is the result's */
            for (int k = 0; k < m->n_tool_calls; k++) {
                const char *cid = m->tool_calls[k].id;
                if ((!cid && !id) || (cid && id && !strcmp(cid, id))) name = m->tool_calls[k].name;
            }
            forge__sb_puts(b, "<|tool_response>response:");
            forge__sb_puts(b, name);
            forge__sb_puts(b, "{value:" FORGE__G4_Q);
            forge__sb_puts(b, msgs[r].content);
            forge__sb_puts(b, FORGE__G4_Q "}<tool_response|>");
            responded = true;
            prev = G4_RESPONSE;
        }
        size_t at = b->len;
        if (model) forge__g4_strip_thinking(b, m->content, strlen(m->content));
        else forge__sb_put_trimmed(b, m->content, strlen(m->content));
        bool has_content = b->len > at;
        const char *next = NULL; /* the next message's role that is not "tool" */
        for (int j = i + 1; j < n && !next; j++)
            if (!forge__role_is(&msgs[j], "tool")) next = msgs[j].role;
        bool continues = model && next && !strcmp(next, "assistant") && (m->n_tool_calls == 0 || responded);
        if (prev == G4_CALL && !responded) forge__sb_puts(b, "<|tool_response>");
        else if (continues) {
        } else if (!(responded && !has_content && !next)) forge__sb_puts(b, "<turn|>\n");
        prev_role = m->role;
    }
    if (gen) {
        if (prev != G4_RESPONSE && prev != G4_CALL) {
            forge__sb_puts(b, "<|turn>model\n");
            if (st->gemma4_empty_thought && !think) forge__sb_puts(b, "<|channel>thought\n<channel|>");
        } else if (prev == G4_RESPONSE && think) {
            forge__sb_puts(b, "<|channel>thought\n");
        }
    }
    return FORGE_OK;
}


/* Renders msgs (and tools: forge's own arrays) with the style into b; the message on failure in err. */
FORGE__INTERNAL forge_status forge__chat_render(const forge__chat_style *st, const forge_chat_message *msgs, int n, const forge_tool *tools,
                                                int n_tools, uint32_t flags, forge__sb *b, forge__err *err) {
    bool gen = !(flags & FORGE_CHAT_NO_GENERATION_PROMPT);
    bool tool_template = forge__tool_format(st) != FORGE__TOOLS_NONE;
    if (n_tools > 0 && !tool_template)
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "tools: forge renders no tools for %s (it does for Llama 3.1+, Qwen 3, Qwen 3.5, Mistral v0.3 / Nemo and Gemma 4)",
                           forge__chat_family_name(st));
    for (int i = 0; i < n; i++)
        if (msgs[i].n_tool_calls > 0 && !tool_template)
            return forge__fail(err, FORGE_ERR_UNSUPPORTED, "message %d has tool calls, and forge renders none for %s", i, forge__chat_family_name(st));
        else if (msgs[i].n_tool_calls < 0 || (msgs[i].n_tool_calls > 0 && !msgs[i].tool_calls))
            return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "message %d: n_tool_calls %d without tool_calls", i, msgs[i].n_tool_calls);
        else
            for (int k = 0; k < msgs[i].n_tool_calls; k++)
                if (!msgs[i].tool_calls[k].name) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "message %d: tool call %d has no name", i, k);
    if ((flags & FORGE_CHAT_THINKING_ON) && (flags & FORGE_CHAT_THINKING_OFF))
        return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "FORGE_CHAT_THINKING_ON and FORGE_CHAT_THINKING_OFF together");
    bool think = (flags & FORGE_CHAT_THINKING_ON) ? true : (flags & FORGE_CHAT_THINKING_OFF) ? false : st->think_default;
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "message %d has no role or no content", i);
    if (st->family == FORGE__CHAT_MISTRAL) {
        forge_status rc = forge__render_mistral(st, msgs, n, tools, n_tools, b, err);
        if (rc) return rc;
    } else if (st->family == FORGE__CHAT_CHATML && st->qwen35) {
        forge_status rc = forge__render_qwen35(msgs, n, tools, n_tools, gen, think, b, err);
        if (rc) return rc;
    } else if (st->family == FORGE__CHAT_LLAMA3 && st->llama3_dated) {
        /* Llama 3.1 / 3.2 / 3.3 without tools: BOS, a system block that always exists (cutoff,
         * date, then the first message's content when that is a system message), the turns;
         * tool results go out as an ipython turn holding the content as a JSON string. */
        if (n == 0) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "the conversation has no messages");
        int first = forge__role_is(&msgs[0], "system") ? 1 : 0;
        forge__sb_puts(b, st->bos);
        forge__sb_puts(b, "<|start_header_id|>system<|end_header_id|>\n\n");
        if (n_tools > 0) forge__sb_puts(b, "Environment: ipython\n");
        forge__sb_puts(b, "Cutting Knowledge Date: December 2023\nToday Date: ");
        forge__sb_puts(b, st->date);
        forge__sb_puts(b, "\n\n");
        if (first) {
            forge__sb_put_trimmed(b, msgs[0].content, strlen(msgs[0].content));
        }
        forge__sb_puts(b, "<|eot_id|>");
        if (n_tools > 0) { /* tools_in_user_message: the tools, then the first message's content, as a user turn */
            if (first >= n)
                return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "Cannot put tools in the first user message when there's no first user message!");
            forge__sb_puts(b, "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function "
                              "call with its proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, "
                              "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n");
            for (int t = 0; t < n_tools; t++) {
                forge_status ts = forge__sb_tool(b, &tools[t], 4, t, err);
                if (ts) return ts;
                forge__sb_puts(b, "\n\n");
            }
            forge__sb_put_trimmed(b, msgs[first].content, strlen(msgs[first].content));
            forge__sb_puts(b, "<|eot_id|>");
            first++;
        }
        for (int i = first; i < n; i++) {
            if (msgs[i].n_tool_calls > 0) { /* {"name": ..., "parameters": ...}: one call a message */
                if (msgs[i].n_tool_calls != 1) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "This model only supports single tool-calls at once!");
                forge__sb_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"");
                forge__sb_puts(b, msgs[i].tool_calls[0].name);
                forge__sb_puts(b, "\", \"parameters\": ");
                forge_status as = forge__sb_call_args(b, &msgs[i].tool_calls[0], i, err);
                if (as) return as;
                forge__sb_puts(b, "}<|eot_id|>");
            } else if (forge__role_is(&msgs[i], "tool") || forge__role_is(&msgs[i], "ipython")) {
                forge__sb_puts(b, "<|start_header_id|>ipython<|end_header_id|>\n\n");
                forge__sb_json_string(b, msgs[i].content);
                forge__sb_puts(b, "<|eot_id|>");
            } else {
                forge__llama3_turn(b, msgs[i].role, msgs[i].content);
            }
        }
        if (gen) forge__sb_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    } else if (st->family == FORGE__CHAT_LLAMA3) {
        for (int i = 0; i < n; i++) {
            if (i == 0) forge__sb_puts(b, st->bos);
            forge__llama3_turn(b, msgs[i].role, msgs[i].content);
        }
        if (gen || st->llama3_gen_always) forge__sb_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    } else if (st->family == FORGE__CHAT_GEMMA) {
        int first = 0;
        const char *prefix = NULL;
        if (n > 0 && forge__role_is(&msgs[0], "system")) {
            if (st->gemma_no_system) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "System role not supported");
            prefix = msgs[0].content;
            first = 1;
        }
        forge__sb_puts(b, st->bos);
        for (int i = first; i < n; i++) {
            bool user = forge__role_is(&msgs[i], "user");
            if (user != ((i - first) % 2 == 0))
                return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "Conversation roles must alternate user/assistant/user/assistant/...");
            forge__sb_puts(b, "<start_of_turn>");
            forge__sb_puts(b, forge__role_is(&msgs[i], "assistant") ? "model" : msgs[i].role);
            forge__sb_puts(b, "\n");
            if (i == first && prefix) {
                forge__sb_puts(b, prefix);
                forge__sb_puts(b, "\n\n");
            }
            forge__sb_put_trimmed(b, msgs[i].content, strlen(msgs[i].content));
            forge__sb_puts(b, "<end_of_turn>\n");
        }
        if (gen) forge__sb_puts(b, "<start_of_turn>model\n");
    } else if (st->family == FORGE__CHAT_GEMMA4) {
        forge_status rc = forge__render_gemma4(st, msgs, n, tools, n_tools, gen, think, b, err);
        if (rc) return rc;
    } else if (st->family == FORGE__CHAT_CHATML) {
        if (n_tools > 0) { /* Qwen 3's # Tools system block (the system message's content first) */
            forge__sb_puts(b, "<|im_start|>system\n");
            if (n > 0 && forge__role_is(&msgs[0], "system")) {
                forge__sb_puts(b, msgs[0].content);
                forge__sb_puts(b, "\n\n");
            }
            forge__sb_puts(b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
                              "signatures within <tools></tools> XML tags:\n<tools>");
            for (int t = 0; t < n_tools; t++) {
                forge__sb_puts(b, "\n");
                forge_status ts = forge__sb_tool(b, &tools[t], -1, t, err);
                if (ts) return ts;
            }
            forge__sb_puts(b, "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
                              "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                              "<args-json-object>}\n</tool_call><|im_end|>\n");
        } else if (n > 0 && forge__role_is(&msgs[0], "system")) {
            forge__sb_puts(b, "<|im_start|>system\n");
            forge__sb_puts(b, msgs[0].content);
            forge__sb_puts(b, "<|im_end|>\n");
        } else if (st->default_system) {
            forge__sb_puts(b, "<|im_start|>system\n");
            forge__sb_puts(b, st->default_system);
            forge__sb_puts(b, "<|im_end|>\n");
        }
        /* Qwen 3: the last user query that is not a tool response (n - 1 when there is none) */
        int last_query = forge__qwen_last_query(msgs, n, false);
        if (last_query < 0) last_query = n - 1;
        for (int i = 0; i < n; i++) {
            const forge_chat_message *m = &msgs[i];
            if (forge__role_is(m, "user") || (forge__role_is(m, "system") && i > 0)) {
                forge__sb_puts(b, "<|im_start|>");
                forge__sb_puts(b, m->role);
                forge__sb_puts(b, "\n");
                forge__sb_puts(b, m->content);
                forge__sb_puts(b, "<|im_end|>\n");
            } else if (forge__role_is(m, "assistant")) {
                const char *content = m->content, *reason = "";
                size_t cn = strlen(content), rn = 0;
                if (st->qwen3) forge__qwen_split_think(&content, &cn, &reason, &rn);
                size_t cn_set = cn; /* the template's `content` (a think block's lstrip is in its output only) */
                forge__sb_puts(b, "<|im_start|>assistant\n");
                if (st->qwen3 && i > last_query && (i == n - 1 || rn > 0)) {
                    forge__strip_char(&reason, &rn, '\n', true, true);
                    forge__sb_puts(b, "<think>\n");
                    forge__sb_put(b, reason, rn);
                    forge__sb_puts(b, "\n</think>\n\n");
                    forge__strip_char(&content, &cn, '\n', true, false);
                }
                forge__sb_put(b, content, cn);
                for (int k = 0; k < m->n_tool_calls; k++) { /* <tool_call> blocks, a newline between */
                    if (k > 0 || cn_set > 0) forge__sb_puts(b, "\n");
                    forge__sb_puts(b, "<tool_call>\n{\"name\": \"");
                    forge__sb_puts(b, m->tool_calls[k].name);
                    forge__sb_puts(b, "\", \"arguments\": ");
                    forge_status as = forge__sb_call_args(b, &m->tool_calls[k], i, err);
                    if (as) return as;
                    forge__sb_puts(b, "}\n</tool_call>");
                }
                forge__sb_puts(b, "<|im_end|>\n");
            } else if (forge__role_is(m, "tool")) {
                forge__qwen_tool_result(b, m->content, strlen(m->content), i == 0 || !forge__role_is(&msgs[i - 1], "tool"),
                                        i == n - 1 || !forge__role_is(&msgs[i + 1], "tool"));
            }
        }
        if (gen) {
            forge__sb_puts(b, "<|im_start|>assistant\n");
            if (st->qwen3 && !think) forge__sb_puts(b, "<think>\n\n</think>\n\n");
        }
    } else {
        return forge__fail(err, FORGE_ERR_UNSUPPORTED, "the model has no known chat format (Llama 3, ChatML, Gemma, Gemma 4)");
    }
    if (b->oom) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    return FORGE_OK;
}

/* The "Today Date" of a Llama 3.1+ template: today, as transformers' strftime_now("%d %b %Y")
 * gives it (local time; English month names whatever the C locale), when the template asks
 * for it; else the date_string it sets ("26 Jul 2024" in 3.1 and 3.3). */
static void forge__template_date(const char *tmpl, char out[16]) {
    static const char *months[12] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    snprintf(out, 16, "26 Jul 2024");
    if (strstr(tmpl, "strftime_now")) {
        time_t now = time(NULL);
        struct tm tm;
        if (localtime_r(&now, &tm)) snprintf(out, 16, "%02d %s %04d", tm.tm_mday, months[tm.tm_mon % 12], (tm.tm_year + 1900) % 10000);
        return;
    }
    const char *set = strstr(tmpl, "set date_string = \"");
    if (set) {
        set += strlen("set date_string = \"");
        const char *end = strchr(set, '"');
        if (end && end - set < 16) snprintf(out, 16, "%.*s", (int)(end - set), set);
    }
}

/* The Mistral template whose marker the template text holds, or NULL. */
static const forge__mistral_template *forge__mistral_template_of(const char *tmpl) {
    for (size_t i = 0; i < sizeof forge__mistral_templates / sizeof forge__mistral_templates[0]; i++)
        if (strstr(tmpl, forge__mistral_templates[i].marker)) return &forge__mistral_templates[i];
    return NULL;
}

/* The chat format of a model: from its tokenizer's special tokens, refined by the
 * checkpoint's own template text where it has one; Mistral's [INST] templates by their text
 * alone (v0.1's and v0.2's tokenizers have no [INST] token, and none tells v0.3 from Nemo). */
static forge_status forge__chat_style_of(const forge_model *m, forge__chat_style *st) {
    memset(st, 0, sizeof *st);
    const char *tmpl = m->chat_template ? m->chat_template : "";
    forge_special_tokens sp = {.struct_size = sizeof sp};
    forge_model_special_tokens(m, &sp);
    const char *bos = sp.bos >= 0 ? forge_token_piece(m, sp.bos) : NULL;
    const char *eos = sp.eos >= 0 ? forge_token_piece(m, sp.eos) : NULL;
    if ((st->mistral = forge__mistral_template_of(tmpl))) {
        st->family = FORGE__CHAT_MISTRAL;
        st->bos = bos ? bos : "<s>";
        st->eos = eos ? eos : "</s>";
    } else if (forge_token_id(m, "<|turn>") >= 0) {
        st->family = FORGE__CHAT_GEMMA4;
        st->bos = bos ? bos : "<bos>";
        /* the larger models' template, which alone writes this block after the reply's opening */
        st->gemma4_empty_thought = strstr(tmpl, "'<|channel>thought\\n<channel|>'") != NULL;
    } else if (forge_token_id(m, "<start_of_turn>") >= 0) {
        st->family = FORGE__CHAT_GEMMA;
        st->gemma_no_system = strstr(tmpl, "System role not supported") != NULL ||
                              (!m->chat_template && m->cfg.arch == FORGE__ARCH_GEMMA2);
        st->bos = bos ? bos : "<bos>";
    } else if (forge_token_id(m, "<|im_start|>") >= 0) {
        st->family = FORGE__CHAT_CHATML;
        /* Qwen 3.5 and 3.6: the line that trims every message; its 0.8B / 2B template thinks only
         * when asked to, the larger models' unless asked not to */
        st->qwen35 = strstr(tmpl, "render_content(message.content, true)|trim") != NULL;
        st->qwen3 = !st->qwen35 && (strstr(tmpl, "enable_thinking") != NULL || (!m->chat_template && m->cfg.arch == FORGE__ARCH_QWEN3));
        st->think_default = st->qwen3 || (st->qwen35 && !strstr(tmpl, "enable_thinking is defined and enable_thinking is true"));
        if (strstr(tmpl, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."))
            st->default_system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
        else if (strstr(tmpl, "<|im_start|>system\\nYou are a helpful assistant.<|im_end|>") ||
                 strstr(tmpl, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>"))
            st->default_system = "You are a helpful assistant.";
    } else if (forge_token_id(m, "<|start_header_id|>") >= 0) {
        st->family = FORGE__CHAT_LLAMA3;
        st->bos = bos ? bos : "<|begin_of_text|>";
        st->llama3_gen_always = !strstr(tmpl, "add_generation_prompt");
        st->llama3_dated = strstr(tmpl, "Cutting Knowledge Date") != NULL;
        if (st->llama3_dated) forge__template_date(tmpl, st->date);
    } else {
        /* (Mistral's formats are known by their template text alone, above) */
        return forge__model_fail(m, FORGE_ERR_UNSUPPORTED, "the model's tokenizer has no known chat format (Llama 3, ChatML, Gemma, Gemma 4)");
    }
    return FORGE_OK;
}

/* The text that ends a reply's thinking when the rendered prompt leaves the model thinking
 * (Qwen 3 / 3.5 with thinking on: "</think>"; Gemma 4 with thinking on: the thought channel's
 * "<channel|>"), else NULL: where a constraint on the reply starts. */
static const char *forge__chat_thinking_end(const forge__chat_style *st, uint32_t flags) {
    bool think = (flags & FORGE_CHAT_THINKING_ON) ? true : (flags & FORGE_CHAT_THINKING_OFF) ? false : st->think_default;
    if (!think) return NULL;
    if (st->family == FORGE__CHAT_CHATML && (st->qwen3 || st->qwen35)) return "</think>";
    if (st->family == FORGE__CHAT_GEMMA4) return "<channel|>";
    return NULL;
}

/* Renders the caller's messages and tools (arrays of their struct_size: messages', their tool
 * calls', the tools') with the model's style into b. */
static forge_status forge__chat_render_caller(const forge__chat_style *st, const forge_chat_message *messages, int n_messages,
                                              const forge_tool *tools, int n_tools, uint32_t flags, forge__sb *b, forge__err *err) {
    if (n_messages < 0 || (n_messages && !messages))
        return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "a chat needs messages for n_messages (%d) >= 0", n_messages);
    if (n_tools < 0 || (n_tools && !tools)) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "tools is NULL for n_tools %d", n_tools);
    forge_status rc = n_messages ? forge__check_sized(messages, "forge_chat_message", err) : FORGE_OK;
    if (!rc && n_tools) rc = forge__check_sized(tools, "forge_tool", err);
    if (rc) return rc;
    forge_chat_message *own = (forge_chat_message *)forge__array_in(messages, n_messages, sizeof *own);
    forge_tool *own_tools = (forge_tool *)forge__array_in(tools, n_tools, sizeof *own_tools);
    void **calls = (void **)calloc((size_t)n_messages + 1, sizeof *calls); /* each message's calls, as forge's structs */
    if (!own || !own_tools || !calls) rc = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int i = 0; !rc && i < n_messages; i++) {
        if (own[i].n_tool_calls <= 0 || !own[i].tool_calls) continue;
        if ((rc = forge__check_sized(own[i].tool_calls, "forge_tool_call", err))) break;
        if (!(calls[i] = forge__array_in(own[i].tool_calls, own[i].n_tool_calls, sizeof(forge_tool_call))))
            rc = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        own[i].tool_calls = (const forge_tool_call *)calls[i];
    }
    if (!rc) rc = forge__chat_render(st, own, n_messages, own_tools, n_tools, flags, b, err);
    for (int i = 0; calls && i < n_messages; i++) free(calls[i]);
    free(calls);
    free(own_tools);
    free(own);
    return rc;
}

FORGE_API forge_status forge_chat_render_tools(const forge_model *m, const forge_chat_message *messages, int n_messages,
                                               const forge_tool *tools, int n_tools, uint32_t flags, char *out, size_t capacity,
                                               size_t *len) {
    if (!forge__model_ready(m) || !len) return FORGE_ERR_INVALID_ARGUMENT;
    forge__chat_style st;
    forge_status s = forge__chat_style_of(m, &st);
    if (s) return s;
    forge__sb b = {0};
    forge__err err;
    s = forge__chat_render_caller(&st, messages, n_messages, tools, n_tools, flags, &b, &err);
    if (s) {
        free(b.buf);
        return forge__model_fail(m, s, "%s", err.msg);
    }
    *len = b.len;
    if (!out || capacity < b.len + 1) s = FORGE_ERR_BUFFER_TOO_SMALL;
    else memcpy(out, b.buf ? b.buf : "", b.len + 1);
    free(b.buf);
    return s;
}

FORGE_API forge_status forge_chat_render(const forge_model *m, const forge_chat_message *messages, int n_messages, uint32_t flags,
                                         char *out, size_t capacity, size_t *len) {
    return forge_chat_render_tools(m, messages, n_messages, NULL, 0, flags, out, capacity, len);
}

/* forge_chat and forge_chat_tools: renders (with the tools; then `opener`, when not NULL: the
 * start of the reply written for the model), then generates with `tool_constraint` (a tool
 * grammar, or NULL: the caller's constraint, if any) lazily after a thinking reply's thinking
 * when it has no trigger of its own. */
static forge_status forge__chat_generate(forge_session *s, const forge__chat_style *st, const forge_chat_message *messages, int n_messages,
                                         const forge_tool *tools, int n_tools, uint32_t flags, const char *opener,
                                         const forge_generate_params *p_in, const forge_constraint *tool_constraint, forge_metrics *metrics) {
    forge_model *m = s->m;
    forge_status rc;
    forge__sb b = {0};
    if ((rc = forge__chat_render_caller(st, messages, n_messages, tools, n_tools, flags, &b, &s->err))) {
        free(b.buf);
        return rc;
    }
    if (opener) forge__sb_puts(&b, opener);
    if (b.oom) {
        free(b.buf);
        return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    /* where the reply's opening begins: the conversation rendered without it, when that is a
     * prefix (a model with linear-attention layers checkpoints its prompt cache there) */
    size_t head = 0;
    if (!(flags & FORGE_CHAT_NO_GENERATION_PROMPT) && forge__has_linear(&m->cfg)) {
        forge__sb h = {0};
        forge__err ignored = {0};
        if (!forge__chat_render_caller(st, messages, n_messages, tools, n_tools, flags | FORGE_CHAT_NO_GENERATION_PROMPT, &h, &ignored) &&
            h.len < b.len && !memcmp(h.buf, b.buf, h.len))
            head = h.len;
        free(h.buf);
    }
    forge_generate_params p = *p_in;
    p.add_special = 0; /* the template wrote BOS */
    if (tool_constraint) p.constraint = tool_constraint;
    forge_constraint lazy; /* a constraint on a thinking reply starts after the thinking */
    const char *after = NULL;
    if (p.constraint && !forge__check_sized(p.constraint, "forge_constraint", &s->err)) {
        forge__constraint_in(p.constraint, &lazy);
        after = forge__chat_thinking_end(st, flags);
        if (!lazy.trigger && after && lazy.kind != FORGE_CONSTRAINT_NONE) {
            lazy.trigger = after;
            p.constraint = &lazy;
            after = NULL;
        }
    }
    /* a trigger of its own (a tool-call opener) counts only after the thinking: written inside
     * it, it opens nothing */
    s->constraint_arm = after;
    rc = forge__generate_text(s, b.buf ? b.buf : "", b.len, head, &p, metrics);
    s->constraint_arm = NULL;
    free(b.buf);
    return rc;
}

FORGE_API forge_status forge_chat(forge_session *s, const forge_chat_message *messages, int n_messages, uint32_t flags,
                                  const forge_generate_params *params, forge_metrics *metrics) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    forge_status rc = forge__check_sized(metrics, "forge_metrics", &s->err);
    if (rc) return rc;
    forge__chat_style st;
    if ((rc = forge__chat_style_of(s->m, &st))) return forge__fail(&s->err, rc, "%s", forge_model_errmsg(s->m));
    if (flags & (FORGE_CHAT_TOOL_ARGUMENTS | FORGE_CHAT_TOOL_REQUIRED)) /* (silently unconstrained before) */
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "FORGE_CHAT_TOOL_ARGUMENTS / _REQUIRED go with forge_chat_tools: forge_chat has no tools");
    forge_generate_params p;
    FORGE__COPY_PARAMS(p, params, forge_generate_default_params);
    return forge__chat_generate(s, &st, messages, n_messages, NULL, 0, flags, NULL, &p, NULL, metrics);
}

/* ---- tool calls: the grammar that constrains them, the parser that reads them back ---- */

/* text as a GBNF string literal's inside (", \ and control bytes escaped). */
static void forge__gbnf_lit(forge__buf *b, const char *text, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)text[i];
        char esc[8];
        if (c == '"' || c == '\\') snprintf(esc, sizeof esc, "\\%c", c);
        else if (c < 0x20 || c == 0x7F) snprintf(esc, sizeof esc, "\\x%02X", c);
        else { esc[0] = (char)c; esc[1] = 0; }
        forge__buf_put(b, esc, strlen(esc));
    }
}

/* ---- Qwen 3.5's calls: <function=NAME>\n(<parameter=P>\nVALUE\n</parameter>\n)*</function>.
 * Its template writes a string value raw and any other value as JSON, so how a value is
 * constrained and read back follows its parameter's schema. */
typedef enum forge__xml_value {
    FORGE__XML_ANY,     /* no type: raw text, read as JSON where it reads as JSON other than a string */
    FORGE__XML_STRING,  /* type string: raw text without "</" (the parser ends a value at "</parameter>"), read as a string */
    FORGE__XML_BOUNDED, /* ... with minLength / maxLength: one line of that many characters, no '<' */
    FORGE__XML_CHOICE,  /* enum / const of strings: one of them, raw, read as a string */
    FORGE__XML_JSON,    /* another type: JSON as the schema says, read as JSON */
} forge__xml_value;

/* The kind of parameter schema `prop` in parameters schema `root` (a "$ref" into its $defs or
 * definitions followed to its target, *resolved); FORGE__XML_ANY with *why set when a raw
 * value cannot be constrained as the schema says (*why names the keyword). */
static forge__xml_value forge__xml_value_of(const cJSON *root, const cJSON *prop, const cJSON **resolved, const char **why) {
    const cJSON *s = prop;
    *why = NULL;
    for (int hops = 0; hops < 8 && cJSON_IsObject(s); hops++) {
        const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
        if (!cJSON_IsString(ref)) break;
        const char *r = ref->valuestring, *name = NULL;
        const cJSON *defs = NULL;
        if (!strncmp(r, "#/$defs/", 8)) defs = cJSON_GetObjectItemCaseSensitive(root, "$defs"), name = r + 8;
        else if (!strncmp(r, "#/definitions/", 14)) defs = cJSON_GetObjectItemCaseSensitive(root, "definitions"), name = r + 14;
        const cJSON *target = defs && !strchr(name, '/') ? cJSON_GetObjectItemCaseSensitive(defs, name) : NULL;
        if (!target) break; /* the JSON Schema compiler says what is wrong with it */
        s = target;
    }
    *resolved = s;
    if (!cJSON_IsObject(s)) return cJSON_IsTrue(s) ? FORGE__XML_ANY : FORGE__XML_JSON;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type"), *t;
    bool string = false, other = false, validates = false;
    if (cJSON_IsString(type)) string = !strcmp(type->valuestring, "string"), other = !string;
    else if (cJSON_IsArray(type))
        cJSON_ArrayForEach(t, type) {
            if (cJSON_IsString(t) && !strcmp(t->valuestring, "string")) string = true;
            else other = true;
        }
    const cJSON *values = cJSON_GetObjectItemCaseSensitive(s, "enum"), *one = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (values || one) {
        bool strings = false, others = false; /* among the values */
        if (one) *(cJSON_IsString(one) ? &strings : &others) = true;
        if (cJSON_IsArray(values))
            cJSON_ArrayForEach(t, values) *(cJSON_IsString(t) ? &strings : &others) = true;
        if (!others && !other) return FORGE__XML_CHOICE;
        if (strings || string) { /* strings and other values: a raw "1" would read as 1 */
            *why = one ? "const" : "enum";
            return FORGE__XML_ANY;
        }
        return FORGE__XML_JSON;
    }
    if (string && other) { *why = "type"; return FORGE__XML_ANY; }
    bool bounded = false;
    for (const cJSON *k = s->child; k; k = k->next) {
        if (!strcmp(k->string, "type") || forge__sc_is_annotation(k->string)) continue;
        if (!strcmp(k->string, "minLength") || !strcmp(k->string, "maxLength")) bounded = true;
        else if (string || !type) {
            if (!string && strcmp(k->string, "pattern") && strcmp(k->string, "format")) { validates = true; continue; }
            *why = k->string;
            return FORGE__XML_ANY;
        }
    }
    if (!type) return validates ? FORGE__XML_JSON : bounded ? FORGE__XML_BOUNDED : FORGE__XML_ANY;
    if (string) return bounded ? FORGE__XML_BOUNDED : FORGE__XML_STRING;
    return FORGE__XML_JSON;
}

/* Tool `t`'s rules for Qwen 3.5 (tK-params: its parameters in its schema's order, the required
 * ones always, no others unless it names none) into out; the JSON rules' prelude is written. */
static forge_status forge__tool_xml_rules(const forge_tool *tool, int t, forge__buf *out, forge__err *err) {
    char rule[48];
    snprintf(rule, sizeof rule, "t%d-params ::=", t);
    if (!tool->parameters) {
        forge__sc_printf(out, "%s xml-any-param*\n", rule);
        return FORGE_OK;
    }
    cJSON *root = cJSON_ParseWithLength(tool->parameters, strlen(tool->parameters));
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(root, "properties"), *req = cJSON_GetObjectItemCaseSensitive(root, "required");
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(root, "additionalProperties");
    if (!cJSON_IsObject(root) || (props && !cJSON_IsObject(props))) {
        cJSON_Delete(root);
        return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "tool %d (%s): parameters: not a JSON Schema of an object with properties", t, tool->name);
    }
    forge__buf params;
    forge__buf_init(&params, NULL, 0);
    forge__buf_put(&params, rule, strlen(rule));
    forge_status st = FORGE_OK;
    int j = 0;
    for (const cJSON *p = props ? props->child : NULL; p && !st; p = p->next, j++) {
        const cJSON *resolved;
        const char *why;
        forge__xml_value kind = forge__xml_value_of(root, p, &resolved, &why);
        if (why) {
            st = forge__fail(err, FORGE_ERR_UNSUPPORTED,
                             "tool %d (%s): parameter %s: \"%s\": Qwen 3.5 writes strings raw, and forge constrains a raw string by its "
                             "type string, enum, const, minLength and maxLength only",
                             t, tool->name, p->string, why);
            break;
        }
        bool required = false;
        const cJSON *r;
        cJSON_ArrayForEach(r, req) required |= cJSON_IsString(r) && !strcmp(r->valuestring, p->string);
        forge__sc_printf(out, "t%d-p%d ::= \"<parameter=", t, j);
        forge__gbnf_lit(out, p->string, strlen(p->string));
        forge__sc_puts(out, ">\\n\" ");
        if (kind == FORGE__XML_ANY || kind == FORGE__XML_STRING) forge__sc_puts(out, "xml-text");
        else if (kind == FORGE__XML_BOUNDED) {
            const cJSON *lo = cJSON_GetObjectItemCaseSensitive(resolved, "minLength"), *hi = cJSON_GetObjectItemCaseSensitive(resolved, "maxLength");
            long l = cJSON_IsNumber(lo) && lo->valuedouble > 0 ? (long)lo->valuedouble : 0;
            if (cJSON_IsNumber(hi) && hi->valuedouble < (double)l) {
                st = forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "tool %d (%s): parameter %s: maxLength is below minLength", t, tool->name, p->string);
                break;
            }
            if (cJSON_IsNumber(hi)) forge__sc_printf(out, "[^<\\n]{%ld,%ld}", l, (long)hi->valuedouble);
            else forge__sc_printf(out, "[^<\\n]{%ld,}", l);
        } else if (kind == FORGE__XML_CHOICE) {
            const cJSON *one = cJSON_GetObjectItemCaseSensitive(resolved, "const"), *values = cJSON_GetObjectItemCaseSensitive(resolved, "enum"), *v;
            int n = 0;
            forge__sc_puts(out, "(");
            if (one) {
                forge__sc_puts(out, "\"");
                forge__gbnf_lit(out, one->valuestring, strlen(one->valuestring));
                forge__sc_puts(out, "\"");
                n++;
            } else
                cJSON_ArrayForEach(v, values) {
                    forge__sc_puts(out, n++ ? " | \"" : "\"");
                    forge__gbnf_lit(out, v->valuestring, strlen(v->valuestring));
                    forge__sc_puts(out, "\"");
                }
            if (!n) {
                st = forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "tool %d (%s): parameter %s: an empty enum allows nothing", t, tool->name, p->string);
                break;
            }
            forge__sc_puts(out, ")");
        } else {
            /* the JSON Schema compiler on the parameter's schema, with the document's $defs beside it */
            cJSON *alone = cJSON_Duplicate(resolved, true);
            const char *const keep[] = {"$defs", "definitions"};
            for (int k = 0; k < 2 && cJSON_IsObject(alone); k++) {
                const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, keep[k]);
                if (d && !cJSON_GetObjectItemCaseSensitive(alone, keep[k])) cJSON_AddItemToObject(alone, keep[k], cJSON_Duplicate(d, true));
            }
            char *text = alone ? cJSON_PrintUnformatted(alone) : NULL;
            cJSON_Delete(alone);
            char vrule[48], prefix[32];
            snprintf(vrule, sizeof vrule, "t%d-p%d-v", t, j);
            snprintf(prefix, sizeof prefix, "t%d-p%d-", t, j);
            forge__sc_printf(out, "%s \"\\n</parameter>\\n\"\n", vrule);
            if (!text) st = forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
            else if ((st = forge__schema_rules(text, strlen(text), vrule, prefix, false, FORGE__SC_JSON, out, err))) {
                forge__err inner = *err;
                forge__fail(err, st, "tool %d (%s): parameter %s: %s", t, tool->name, p->string, inner.msg);
            }
            free(text);
            forge__sc_printf(&params, " t%d-p%d%s", t, j, required ? "" : "?");
            continue;
        }
        forge__sc_puts(out, " \"\\n</parameter>\\n\"\n");
        forge__sc_printf(&params, " t%d-p%d%s", t, j, required ? "" : "?");
    }
    if (!st && !j && !cJSON_IsFalse(extra)) forge__sc_puts(&params, " xml-any-param*");
    else if (!st && !j) forge__sc_puts(&params, " \"\"");
    forge__buf_put(&params, "\n", 1);
    if (!st) forge__buf_put(out, params.p, params.n);
    forge__buf_free(&params);
    cJSON_Delete(root);
    return st;
}

/* Qwen 3.5's raw-text values: no "</" (the parser ends a value at "</parameter>"); a parameter
 * of a tool without parameters' schema: any name, raw text. */
static const char forge__xml_prelude[] = "xml-text ::= ([^<] | \"<\"+ [^</])* \"<\"*\n"
                                         "xml-any-param ::= \"<parameter=\" [^<>\\n]+ \">\\n\" xml-text \"\\n</parameter>\\n\"\n";

/* The GBNF of a reply's tool calls (rule root) for Llama 3.1+, Qwen 3 and Mistral: each tool's
 * call {"name": "NAME", "parameters" (Llama) / "arguments" (Qwen, Mistral): ARGS} with ARGS its
 * parameters' JSON Schema (rules prefixed tK-; any JSON object without one); for Qwen 3.5 its
 * <function=NAME> block (forge__tool_xml_rules) in the same <tool_call> frame; for Gemma 4
 * call:NAME ARGS, ARGS in its notation (schema.c's FORGE__SC_GEMMA4), between its <|tool_call>
 * and <tool_call|> special tokens. required: the whole reply (Qwen 3 and Gemma 4: one or more
 * blocks; Llama: one call, as its template renders one a message; Mistral: the call array after
 * the [TOOL_CALLS] its prompt then ends with); else what follows the trigger (*trigger: Qwen 3's
 * "<tool_call>", Llama's '{"name": ', Mistral's "[TOOL_CALLS]", Gemma 4's "<|tool_call>"), up
 * to the block's end. */
static forge_status forge__tool_grammar(forge__tools tf, const forge_tool *tools, int n_tools, bool required, forge__buf *out,
                                        const char **trigger, forge__err *err) {
    forge__buf_init(out, NULL, 0);
    forge_status st = FORGE_OK;
    const bool xml = tf == FORGE__TOOLS_QWEN35, g4 = tf == FORGE__TOOLS_GEMMA4;
    if (xml) {
        forge__buf_put(out, forge__sc_prelude, strlen(forge__sc_prelude));
        forge__buf_put(out, forge__xml_prelude, strlen(forge__xml_prelude));
    }
    for (int t = 0; t < n_tools && !st; t++) {
        if (xml) {
            if (!tools[t].name || !*tools[t].name || strpbrk(tools[t].name, "<>\n"))
                st = forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "tool %d %s", t, tools[t].name && *tools[t].name ? "has '<', '>' or a newline in its name" : "has no name");
            else st = forge__tool_xml_rules(&tools[t], t, out, err);
            continue;
        }
        char root[32], prefix[16];
        snprintf(root, sizeof root, "t%d-args", t);
        snprintf(prefix, sizeof prefix, "t%d-", t);
        if (!tools[t].name || !*tools[t].name) {
            st = forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "tool %d has no name", t);
            break;
        }
        if (g4 && strpbrk(tools[t].name, "{<\n")) {
            st = forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "tool %d has '{', '<' or a newline in its name", t);
            break;
        }
        if (tools[t].parameters)
            st = forge__schema_rules(tools[t].parameters, strlen(tools[t].parameters), root, prefix, t == 0, g4 ? FORGE__SC_GEMMA4 : FORGE__SC_JSON, out, err);
        else {
            if (t == 0) forge__sc_prelude_put(g4, out);
            forge__buf_put(out, root, strlen(root));
            forge__buf_put(out, " ::= json-object\n", strlen(" ::= json-object\n"));
        }
        if (st) {
            forge__err inner = *err;
            forge__fail(err, st, "tool %d (%s): parameters: %s", t, tools[t].name, inner.msg);
        }
    }
    if (st) {
        forge__buf_free(out);
        return st;
    }
    const bool llama = tf == FORGE__TOOLS_LLAMA3;
    forge__buf calls;
    forge__buf_init(&calls, NULL, 0);
    for (int t = 0; t < n_tools && xml; t++) { /* <function=NAME>\n PARAMS </function> */
        forge__buf_put(&calls, t ? " | \"<function=" : "\"<function=", t ? 14 : 11);
        forge__gbnf_lit(&calls, tools[t].name, strlen(tools[t].name));
        char tail[40];
        snprintf(tail, sizeof tail, ">\\n\" t%d-params \"</function>\"", t);
        forge__buf_put(&calls, tail, strlen(tail));
    }
    for (int t = 0; t < n_tools && g4; t++) { /* call:NAME{...} */
        const char *head = t ? " | \"call:" : "\"call:";
        forge__buf_put(&calls, head, strlen(head));
        forge__gbnf_lit(&calls, tools[t].name, strlen(tools[t].name));
        char tail[24];
        snprintf(tail, sizeof tail, "\" t%d-args", t);
        forge__buf_put(&calls, tail, strlen(tail));
    }
    for (int t = 0; t < n_tools && !xml && !g4; t++) {
        /* {"name": "NAME", "arguments": ARGS}: the name as JSON writes it, inside a GBNF literal */
        forge__sb name = {0};
        forge__sb_json_string(&name, tools[t].name);
        char head[32];
        snprintf(head, sizeof head, "%s\"{\\\"name\\\": ", t ? " | " : "");
        forge__buf_put(&calls, head, strlen(head));
        if (!required && llama) calls.n -= strlen("{\\\"name\\\": "); /* the trigger wrote that */
        forge__gbnf_lit(&calls, name.buf ? name.buf : "", name.len);
        free(name.buf);
        const char *mid = llama ? ", \\\"parameters\\\": \" " : ", \\\"arguments\\\": \" ";
        forge__buf_put(&calls, mid, strlen(mid));
        snprintf(head, sizeof head, "t%d-args \"}\"", t);
        forge__buf_put(&calls, head, strlen(head));
    }
    const bool mistral = tf == FORGE__TOOLS_MISTRAL || tf == FORGE__TOOLS_NEMO;
    const char *root = NULL;
    if (llama) root = "root ::= tool-call\n";
    else if (mistral) root = tf == FORGE__TOOLS_MISTRAL ? "root ::= \" [\" tool-call (\", \" tool-call)* \"]\"\n" : "root ::= \"[\" tool-call (\", \" tool-call)* \"]\"\n";
    else if (g4) root = required ? "root ::= <|tool_call> tool-call <tool_call|> (<|tool_call> tool-call <tool_call|>)*\n" : "root ::= tool-call <tool_call|>\n";
    else if (required) root = "root ::= \"<tool_call>\\n\" tool-call \"\\n</tool_call>\" (\"\\n<tool_call>\\n\" tool-call \"\\n</tool_call>\")*\n";
    else root = "root ::= tool-call \"\\n</tool_call>\"\n";
    forge__buf_put(out, root, strlen(root));
    forge__buf_put(out, "tool-call ::= ", strlen("tool-call ::= "));
    forge__buf_put(out, calls.p, calls.n);
    forge__buf_put(out, "\n", 1);
    bool oom = calls.oom || out->oom;
    forge__buf_free(&calls);
    if (oom) {
        forge__buf_free(out);
        return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    *trigger = required ? NULL : llama ? "{\"name\": " : mistral ? "[TOOL_CALLS]" : g4 ? "<|tool_call>" : "<tool_call>";
    return FORGE_OK;
}

/* A reply's tool calls as forge__parse_tool_reply reads them: the strings in one buffer,
 * NUL-separated, at their offsets (names, arguments and ids: [n][3]). */
typedef struct forge__tool_reply {
    forge__buf s;
    size_t text_len, content_off, content_len; /* the text is at offset 0 */
    int n, cap;
    size_t (*call)[3]; /* [cap] name offset, arguments offset, id offset */
} forge__tool_reply;

static void forge__tool_reply_free(forge__tool_reply *r) {
    forge__buf_free(&r->s);
    free(r->call);
    memset(r, 0, sizeof *r);
}

/* An id the model wrote that a template takes back: 9 letters and digits (Mistral's). */
static bool forge__tool_id_ok(const char *id) {
    size_t n = 0;
    for (; id && id[n]; n++)
        if (!((id[n] >= '0' && id[n] <= '9') || (id[n] >= 'a' && id[n] <= 'z') || (id[n] >= 'A' && id[n] <= 'Z'))) return false;
    return n == 9;
}

/* Appends a call: its name, its arguments (a JSON object, written compactly) and its id (the
 * model's, when forge__tool_id_ok; else 9 letters and digits from the reply's text and the
 * call's place, so a reply and its ids are reproducible). */
static bool forge__tool_reply_add(forge__tool_reply *r, const char *name, size_t name_len, const cJSON *args, const char *id) {
    for (size_t i = 0; i < name_len; i++)
        if ((unsigned char)name[i] < 0x20) return false; /* no function is named so */
    if (!name_len) return false;
    char *text = cJSON_PrintUnformatted(args);
    if (!text) return false;
    if (!forge__utf8_valid(text, strlen(text)) || !forge__utf8_valid(name, name_len)) { /* broken text is no call */
        free(text);
        return false;
    }
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 4;
        size_t(*nc)[3] = (size_t(*)[3])realloc(r->call, sizeof *nc * (size_t)cap);
        if (!nc) { free(text); r->s.oom = true; return false; }
        r->call = nc;
        r->cap = cap;
    }
    r->call[r->n][0] = r->s.n;
    forge__buf_put(&r->s, name, name_len);
    forge__buf_put(&r->s, "", 1);
    r->call[r->n][1] = r->s.n;
    forge__buf_put(&r->s, text, strlen(text) + 1);
    free(text);
    char made[10];
    if (!forge__tool_id_ok(id)) {
        static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        uint64_t h = forge__fnv_u64(forge__fnv(FORGE__FNV_BASIS, r->s.p, r->text_len), (uint64_t)r->n);
        for (int i = 0; i < 9; i++, h /= 62) made[i] = alnum[h % 62];
        made[9] = 0;
        id = made;
    }
    r->call[r->n][2] = r->s.n;
    forge__buf_put(&r->s, id, 10);
    r->n++;
    return true;
}

/* One parsed JSON call ({"name": STR, "arguments" (or "parameters"): OBJECT, or a string
 * holding one, "id" when the model writes one}) into r; false when it is not one. */
static bool forge__tool_json_object(forge__tool_reply *r, const cJSON *doc) {
    if (!cJSON_IsObject(doc)) return false;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(doc, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(doc, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(doc, "parameters");
    cJSON *parsed = NULL;
    if (cJSON_IsString(args)) args = parsed = cJSON_Parse(args->valuestring);
    bool ok = cJSON_IsString(name) && cJSON_IsObject(args) &&
              forge__tool_reply_add(r, name->valuestring, strlen(name->valuestring), args,
                                    cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(doc, "id")));
    cJSON_Delete(parsed);
    return ok;
}

/* One JSON call object at [p, end) into r (forge__tool_json_object); false when it is not one. */
static bool forge__tool_json_call(forge__tool_reply *r, const char *p, const char *end, const char **after) {
    const char *e = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(p, (size_t)(end - p), &e, 0);
    bool ok = forge__tool_json_object(r, doc);
    cJSON_Delete(doc);
    if (after) *after = ok && e ? e : p;
    return ok;
}

/* A Qwen 3.5 parameter's value as JSON: the text between <parameter=P>\n and \n</parameter>;
 * JSON other than a string as it is, Python's True / False / None as JSON's, else the text as a
 * string (the template writes strings raw; without the schema "42" and 42 read the same). */
static cJSON *forge__qwen35_value(const char *v, size_t n) {
    if (n && v[0] == '\n') { v++; n--; }
    if (n && v[n - 1] == '\n') n--;
    if (n == 4 && !memcmp(v, "True", 4)) return cJSON_CreateTrue();
    if (n == 5 && !memcmp(v, "False", 5)) return cJSON_CreateFalse();
    if (n == 4 && !memcmp(v, "None", 4)) return cJSON_CreateNull();
    const char *e = NULL;
    cJSON *j = n ? cJSON_ParseWithLengthOpts(v, n, &e, 0) : NULL;
    if (j && !cJSON_IsString(j) && e == v + n) return j;
    cJSON_Delete(j);
    char *copy = (char *)malloc(n + 1);
    if (!copy) return NULL;
    memcpy(copy, v, n);
    copy[n] = 0;
    cJSON *str = cJSON_CreateString(copy);
    free(copy);
    return str;
}

/* A Qwen 3.5 parameter's value as its schema says (forge__xml_value_of): a string kind's text as
 * the string, JSON as JSON (a string too), else forge__qwen35_value's reading. `schema` is the
 * tool's parameters (NULL: none known). */
static cJSON *forge__qwen35_typed_value(const cJSON *schema, const char *param, const char *v, size_t n) {
    const cJSON *prop = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(schema, "properties"), param), *resolved;
    const char *why;
    forge__xml_value kind = prop ? forge__xml_value_of(schema, prop, &resolved, &why) : FORGE__XML_ANY;
    if (kind == FORGE__XML_ANY) return forge__qwen35_value(v, n);
    const char *s = v;
    size_t len = n;
    if (len && s[0] == '\n') { s++; len--; }
    if (len && s[len - 1] == '\n') len--;
    if (kind == FORGE__XML_JSON) {
        const char *e = NULL;
        cJSON *j = len ? cJSON_ParseWithLengthOpts(s, len, &e, 0) : NULL;
        if (j && e == s + len) return j;
        cJSON_Delete(j);
        return forge__qwen35_value(v, n);
    }
    char *copy = (char *)malloc(len + 1);
    if (!copy) return NULL;
    memcpy(copy, s, len);
    copy[len] = 0;
    cJSON *str = cJSON_CreateString(copy);
    free(copy);
    return str;
}

/* One Qwen 3.5 call, <function=NAME>\n(<parameter=P>\nVALUE\n</parameter>\n)*</function>, at
 * [p, end) (the inside of a <tool_call> block) into r, its values read by the named tool's
 * parameters' schema when tools[0 .. n_tools) has it; false when it is not one. */
static bool forge__tool_xml_call(forge__tool_reply *r, const char *p, const char *end, const forge_tool *tools, int n_tools) {
    const char *s = p;
    forge__json_ws(&s, end);
    if ((size_t)(end - s) < 10 || memcmp(s, "<function=", 10)) return false;
    s += 10;
    const char *gt = (const char *)memchr(s, '>', (size_t)(end - s));
    if (!gt) return false;
    const char *name = s;
    size_t name_len = (size_t)(gt - s);
    s = gt + 1;
    cJSON *schema = NULL;
    for (int t = 0; t < n_tools && !schema; t++)
        if (tools[t].name && tools[t].parameters && strlen(tools[t].name) == name_len && !memcmp(tools[t].name, name, name_len))
            schema = cJSON_Parse(tools[t].parameters);
    cJSON *args = cJSON_CreateObject();
    bool ok = args != NULL;
    for (;;) {
        forge__json_ws(&s, end);
        if ((size_t)(end - s) >= 11 && !memcmp(s, "</function>", 11)) {
            s += 11;
            break;
        }
        if (!ok || (size_t)(end - s) < 11 || memcmp(s, "<parameter=", 11)) { ok = false; break; }
        s += 11;
        const char *pgt = (const char *)memchr(s, '>', (size_t)(end - s));
        const char *close = pgt ? forge__memmem(pgt + 1, (size_t)(end - pgt - 1), "</parameter>") : NULL;
        if (!close || memchr(s, 0, (size_t)(pgt - s))) { ok = false; break; }
        char *key = (char *)malloc((size_t)(pgt - s) + 1);
        cJSON *v = NULL;
        if (key) {
            memcpy(key, s, (size_t)(pgt - s));
            key[pgt - s] = 0;
            v = forge__qwen35_typed_value(schema, key, pgt + 1, (size_t)(close - pgt - 1));
        }
        if (!key || !v) ok = false;
        else {
            cJSON_DeleteItemFromObjectCaseSensitive(args, key); /* a repeated parameter: the last one */
            cJSON_AddItemToObject(args, key, v);
            v = NULL;
        }
        cJSON_Delete(v);
        free(key);
        s = close + 12;
    }
    forge__json_ws(&s, end);
    ok = ok && s == end && forge__tool_reply_add(r, name, name_len, args, NULL);
    cJSON_Delete(args);
    cJSON_Delete(schema);
    return ok;
}

/* recursion: Gemma 4's values hold values */
static cJSON *forge__g4_value(const char **p, const char *end, int depth);

/* One value of Gemma 4's notation at *p (format_argument's: <|"|>text<|"|>, a number, true /
 * false / null, {key:value,...} with bare or marked keys, [value,...]) as JSON; NULL when it is
 * not one. */
static cJSON *forge__g4_value(const char **p, const char *end, int depth) {
    static const char q[] = FORGE__G4_Q;
    const size_t ql = sizeof q - 1;
    forge__json_ws(p, end);
    if (*p >= end || depth > 64) return NULL;
    if ((size_t)(end - *p) >= ql && !memcmp(*p, q, ql)) { /* a string, as it is, to the next mark */
        const char *s = *p + ql, *close = forge__memmem(s, (size_t)(end - s), q);
        if (!close || !forge__utf8_valid(s, (size_t)(close - s))) return NULL;
        char *text = (char *)malloc((size_t)(close - s) + 1);
        if (!text) return NULL;
        memcpy(text, s, (size_t)(close - s));
        text[close - s] = 0;
        cJSON *v = memchr(s, 0, (size_t)(close - s)) ? NULL : cJSON_CreateString(text);
        free(text);
        *p = close + ql;
        return v;
    }
    if (**p == '{' || **p == '[') {
        bool obj = **p == '{';
        cJSON *v = obj ? cJSON_CreateObject() : cJSON_CreateArray();
        (*p)++;
        forge__json_ws(p, end);
        if (v && *p < end && **p == (obj ? '}' : ']')) {
            (*p)++;
            return v;
        }
        while (v) {
            char *key = NULL;
            if (obj) { /* a bare key runs to its ':'; a marked one is a string */
                forge__json_ws(p, end);
                const char *k0 = *p, *k1;
                size_t kl;
                if ((size_t)(end - *p) >= ql && !memcmp(*p, q, ql)) {
                    k0 += ql;
                    k1 = forge__memmem(k0, (size_t)(end - k0), q);
                    *p = k1 ? k1 + ql : end;
                } else {
                    while (*p < end && !strchr(":,{}[]<\n", **p)) (*p)++;
                    k1 = *p;
                }
                kl = k1 ? (size_t)(k1 - k0) : 0;
                forge__json_ws(p, end);
                if (!k1 || !kl || *p >= end || **p != ':' || memchr(k0, 0, kl) || !forge__utf8_valid(k0, kl) || !(key = (char *)malloc(kl + 1))) {
                    cJSON_Delete(v);
                    return NULL;
                }
                memcpy(key, k0, kl);
                key[kl] = 0;
                (*p)++;
            }
            cJSON *item = forge__g4_value(p, end, depth + 1);
            if (!item) {
                free(key);
                cJSON_Delete(v);
                return NULL;
            }
            if (obj) {
                cJSON_DeleteItemFromObjectCaseSensitive(v, key); /* a repeated key: the last one */
                cJSON_AddItemToObject(v, key, item);
            } else {
                cJSON_AddItemToArray(v, item);
            }
            free(key);
            forge__json_ws(p, end);
            if (*p < end && **p == ',') { (*p)++; continue; }
            if (*p < end && **p == (obj ? '}' : ']')) { (*p)++; return v; }
            cJSON_Delete(v);
            return NULL;
        }
        return NULL;
    }
    static const char *const words[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(end - *p) >= n && !memcmp(*p, words[i], n)) {
            *p += n;
            return i == 0 ? cJSON_CreateTrue() : i == 1 ? cJSON_CreateFalse() : cJSON_CreateNull();
        }
    }
    const char *n0 = *p; /* a number, as JSON writes one */
    while (*p < end && strchr("+-0123456789.eE", **p) && **p) (*p)++;
    const char *e = NULL;
    cJSON *num = *p > n0 ? cJSON_ParseWithLengthOpts(n0, (size_t)(*p - n0), &e, 0) : NULL;
    if (num && (!cJSON_IsNumber(num) || e != *p)) {
        cJSON_Delete(num);
        num = NULL;
    }
    return num;
}

/* One Gemma 4 call, call:NAME{k:v,...} at [p, end) (inside <|tool_call> ... <tool_call|>), into r. */
static bool forge__g4_reply_call(forge__tool_reply *r, const char *p, const char *end) {
    if ((size_t)(end - p) < 5 || memcmp(p, "call:", 5)) return false;
    const char *name = p + 5, *brace = (const char *)memchr(name, '{', (size_t)(end - name));
    if (!brace || brace == name) return false;
    const char *at = brace;
    cJSON *args = forge__g4_value(&at, end, 0);
    forge__json_ws(&at, end);
    bool ok = cJSON_IsObject(args) && at == end && forge__tool_reply_add(r, name, (size_t)(brace - name), args, NULL);
    cJSON_Delete(args);
    return ok;
}

/* How forge__tool_blocks reads the inside of one block: the call into r, or false (r as it was). */
typedef bool (*forge__block_fn)(forge__tool_reply *r, const char *in, const char *in_end, const forge_tool *tools, int n_tools);

static bool forge__qwen3_block(forge__tool_reply *r, const char *in, const char *in_end, const forge_tool *tools, int n_tools) {
    (void)tools;
    (void)n_tools;
    size_t mark = r->s.n;
    int n0 = r->n;
    if (!forge__tool_json_call(r, in, in_end, &in)) return false;
    forge__json_ws(&in, in_end); /* nothing but white space after the object */
    if (in == in_end) return true;
    r->n = n0;
    r->s.n = mark;
    return false;
}

static bool forge__g4_block(forge__tool_reply *r, const char *in, const char *in_end, const forge_tool *tools, int n_tools) {
    (void)tools;
    (void)n_tools;
    return forge__g4_reply_call(r, in, in_end);
}

/* The calls in [p, end) between open and close tags (the last block may lack its close), each
 * read by `call`; the text around them, and a block that does not read, into content. */
static void forge__tool_blocks(forge__tool_reply *r, const char *p, const char *end, const char *open_tag, const char *close_tag,
                               forge__block_fn call, const forge_tool *tools, int n_tools, forge__buf *content) {
    const size_t ol = strlen(open_tag), cl = strlen(close_tag);
    for (;;) {
        const char *open = forge__memmem(p, (size_t)(end - p), open_tag);
        if (!open) {
            forge__buf_put(content, p, (size_t)(end - p));
            return;
        }
        const char *in = open + ol, *close = forge__memmem(in, (size_t)(end - in), close_tag);
        const char *in_end = close ? close : end, *next = close ? close + cl : end;
        bool ok = call(r, in, in_end, tools, n_tools);
        forge__buf_put(content, p, (size_t)((ok ? open : next) - p));
        p = next;
        if (p >= end) return;
    }
}

/* Reads a reply's tool calls in format tf into r: the content is the reply without its
 * thinking (what precedes the last </think>, Qwen) and without the calls, trimmed; a block that
 * does not parse stays in the content. Llama 3.1+: the reply (after <|python_tag|>, if any) is
 * calls only, JSON objects separated by ';', or it is content. Mistral: the JSON array after the
 * first [TOOL_CALLS], every element a call, or it is content. Gemma 4: the thought channels out,
 * then <|tool_call>call:NAME{...}<tool_call|> blocks (the last may lack its close). */
static forge_status forge__parse_tool_reply(forge__tools tf, const char *text, size_t n, const forge_tool *tools, int n_tools,
                                            forge__tool_reply *r) {
    memset(r, 0, sizeof *r);
    forge__buf_init(&r->s, NULL, 0);
    forge__buf_put(&r->s, text, n);
    forge__buf_put(&r->s, "", 1);
    r->text_len = n;
    forge__buf content;
    forge__buf_init(&content, NULL, 0);
    const char *p = text, *end = text + n;
    if (tf == FORGE__TOOLS_LLAMA3) {
        const char *q = p;
        size_t qn = n;
        forge__py_strip(&q, &qn);
        static const char tag[] = "<|python_tag|>";
        if (qn >= sizeof tag - 1 && !memcmp(q, tag, sizeof tag - 1)) q += sizeof tag - 1, qn -= sizeof tag - 1;
        const char *e = q + qn, *at = q;
        bool all = qn > 0;
        while (all) {
            forge__json_ws(&at, e);
            if (!forge__tool_json_call(r, at, e, &at)) { all = false; break; }
            forge__json_ws(&at, e);
            if (at == e) break;
            if (*at != ';') all = false;
            else at++;
        }
        if (!all) {
            r->n = 0;
            r->s.n = n + 1;
            forge__buf_put(&content, text, n);
        }
    } else if (tf == FORGE__TOOLS_QWEN3 || tf == FORGE__TOOLS_QWEN35) {
        const char *think = forge__memmem_last(text, n, "</think>");
        if (think) p = think + 8;
        forge__tool_blocks(r, p, end, "<tool_call>", "</tool_call>", tf == FORGE__TOOLS_QWEN3 ? forge__qwen3_block : forge__tool_xml_call,
                           tools, n_tools, &content);
    } else if (tf == FORGE__TOOLS_GEMMA4) {
        forge__sb visible = {0};
        forge__g4_strip_thinking(&visible, text, n);
        const char *v = visible.buf ? visible.buf : "";
        forge__tool_blocks(r, v, v + visible.len, "<|tool_call>", "<tool_call|>", forge__g4_block, tools, n_tools, &content);
        content.oom |= visible.oom;
        free(visible.buf);
    } else if (tf == FORGE__TOOLS_MISTRAL || tf == FORGE__TOOLS_NEMO) {
        const char *open = forge__memmem(text, n, "[TOOL_CALLS]"), *at = open ? open + 12 : end, *e = NULL;
        forge__json_ws(&at, end);
        cJSON *calls = at < end ? cJSON_ParseWithLengthOpts(at, (size_t)(end - at), &e, 0) : NULL;
        bool ok = cJSON_IsArray(calls) && cJSON_GetArraySize(calls) > 0 && e;
        const cJSON *item;
        cJSON_ArrayForEach(item, calls) ok = ok && forge__tool_json_object(r, item);
        cJSON_Delete(calls);
        if (ok) {
            forge__buf_put(&content, text, (size_t)(open - text));
            forge__buf_put(&content, e, (size_t)(end - e));
        } else {
            r->n = 0;
            r->s.n = n + 1;
            forge__buf_put(&content, text, n);
        }
    } else {
        forge__buf_put(&content, text, n);
    }
    const char *c = content.p ? content.p : "";
    size_t cn = content.n;
    forge__py_strip(&c, &cn);
    r->content_off = r->s.n;
    r->content_len = cn;
    forge__buf_put(&r->s, c, cn);
    forge__buf_put(&r->s, "", 1);
    bool oom = content.oom || r->s.oom;
    forge__buf_free(&content);
    if (oom) {
        forge__tool_reply_free(r);
        return FORGE_ERR_OUT_OF_MEMORY;
    }
    return FORGE_OK;
}

typedef struct forge__reply_sink { /* forge_chat_tools' on_token: keeps the text, forwards it */
    forge__buf text;
    forge_token_fn user_fn;
    void *user;
} forge__reply_sink;

static int forge__reply_collect(void *user, int32_t token, const char *text, size_t len) {
    forge__reply_sink *k = (forge__reply_sink *)user;
    forge__buf_put(&k->text, text, len);
    return k->user_fn ? k->user_fn(k->user, token, text, len) : 0;
}

FORGE_API forge_status forge_chat_tools(forge_session *s, const forge_chat_message *messages, int n_messages, const forge_tool *tools,
                                        int n_tools, uint32_t flags, const forge_generate_params *params, forge_chat_reply *reply,
                                        forge_metrics *metrics) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    forge_status rc = forge__check_sized(metrics, "forge_metrics", &s->err);
    if (!rc && reply) rc = forge__check_sized(reply, "forge_chat_reply", &s->err);
    if (rc) return rc;
    forge__chat_style st;
    if ((rc = forge__chat_style_of(s->m, &st))) return forge__fail(&s->err, rc, "%s", forge_model_errmsg(s->m));
    forge_generate_params p;
    FORGE__COPY_PARAMS(p, params, forge_generate_default_params);
    const forge__tools tf = forge__tool_format(&st);
    const bool constrain = (flags & (FORGE_CHAT_TOOL_ARGUMENTS | FORGE_CHAT_TOOL_REQUIRED)) != 0;
    if (n_tools > 0 && tf == FORGE__TOOLS_NONE)
        return forge__fail(&s->err, FORGE_ERR_UNSUPPORTED, "tools: forge renders no tools for %s (it does for Llama 3.1+, Qwen 3, Qwen 3.5, Mistral v0.3 / Nemo and Gemma 4)",
                           forge__chat_family_name(&st));
    if (constrain && n_tools <= 0)
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "FORGE_CHAT_TOOL_ARGUMENTS / _REQUIRED need tools");
    if (constrain && p.constraint)
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "FORGE_CHAT_TOOL_ARGUMENTS / _REQUIRED make the constraint: params->constraint must be NULL");
    if (n_tools < 0 || (n_tools && !tools)) return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "tools is NULL for n_tools %d", n_tools);
    forge_tool *own = NULL; /* the tools at this build's stride: the grammar's, and the parser's types */
    if (n_tools > 0) {
        if ((rc = forge__check_sized(tools, "forge_tool", &s->err))) return rc;
        if (!(own = (forge_tool *)forge__array_in(tools, n_tools, sizeof *own))) return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    forge__buf gbnf;
    forge__buf_init(&gbnf, NULL, 0);
    forge_constraint tc = {.struct_size = sizeof tc, .kind = FORGE_CONSTRAINT_GBNF};
    if (constrain) {
        rc = forge__tool_grammar(tf, own, n_tools, (flags & FORGE_CHAT_TOOL_REQUIRED) != 0, &gbnf, &tc.trigger, &s->err);
        if (rc) {
            free(own);
            return rc;
        }
        tc.text = gbnf.p;
        tc.text_len = gbnf.n;
    }
    /* Mistral's calls open with a control token, which a constrained span cannot take: a reply
     * that must call starts after the [TOOL_CALLS] its prompt ends with, and its text with it */
    const char *opener = (flags & FORGE_CHAT_TOOL_REQUIRED) && (tf == FORGE__TOOLS_MISTRAL || tf == FORGE__TOOLS_NEMO) ? "[TOOL_CALLS]" : NULL;
    forge__reply_sink sink = {.user_fn = p.on_token, .user = p.user_data};
    forge__buf_init(&sink.text, NULL, 0);
    if (opener) forge__buf_put(&sink.text, opener, strlen(opener));
    p.on_token = forge__reply_collect;
    p.user_data = &sink;
    rc = forge__chat_generate(s, &st, messages, n_messages, tools, n_tools, flags & ~(FORGE_CHAT_TOOL_ARGUMENTS | FORGE_CHAT_TOOL_REQUIRED),
                              opener, &p, constrain ? &tc : NULL, metrics);
    forge__buf_free(&gbnf);
    forge__tool_reply r;
    if (!rc && sink.text.oom) rc = forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    if (!rc && forge__parse_tool_reply(tf, sink.text.p ? sink.text.p : "", sink.text.n, own, n_tools, &r))
        rc = forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    forge__buf_free(&sink.text);
    free(own);
    if (rc) return rc;
    /* the session keeps the strings until its next call: one block of pointers, one of text */
    const char **ptrs = (const char **)malloc(sizeof *ptrs * (3 * (size_t)r.n + 1));
    if (!ptrs) {
        forge__tool_reply_free(&r);
        return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    forge__buf_free(&s->chat_reply);
    free(s->chat_reply_ptrs);
    s->chat_reply = r.s;
    s->chat_reply_ptrs = ptrs;
    for (int i = 0; i < r.n; i++) {
        ptrs[i] = s->chat_reply.p + r.call[i][0];
        ptrs[r.n + i] = s->chat_reply.p + r.call[i][1];
        ptrs[2 * r.n + i] = s->chat_reply.p + r.call[i][2];
    }
    forge_chat_reply out = {.struct_size = sizeof out};
    out.text = s->chat_reply.p;
    out.text_len = r.text_len;
    out.content = s->chat_reply.p + r.content_off;
    out.content_len = r.content_len;
    out.n_tool_calls = r.n;
    out.tool_names = ptrs;
    out.tool_arguments = ptrs + r.n;
    out.tool_ids = ptrs + 2 * r.n;
    free(r.call);
    if (reply) FORGE__PUT(reply, out);
    return FORGE_OK;
}
