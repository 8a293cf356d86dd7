/* src/chat.c: Chat.
 * Owns: the families' chat templates and forge_chat.
 * May call: base.c, config.c, model.c, session.c, api.c, generate.c.
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
    bool tool_results;             /* roles checked first, tool results skipped; each needs a tool_call_id */
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
    {"{{ message['content'] + eos_token + ' ' }}", "[INST] ", " [/INST]", "", " ", false, FORGE__MISTRAL_SYSTEM_NONE, false,
     FORGE__MISTRAL_ALTERNATE_V1, FORGE__MISTRAL_ROLE_V1},
    /* Mistral-7B-Instruct-v0.2's first (2023), which GGUF files of it carry */
    {"{{ '[INST] ' + message['content'] + ' [/INST]' }}", "[INST] ", " [/INST]", "", "", false, FORGE__MISTRAL_SYSTEM_NONE, false,
     FORGE__MISTRAL_ALTERNATE_V1, FORGE__MISTRAL_ROLE_V1},
    /* the 2024 one of v0.1 and v0.2 (and Mixtral-8x7B-Instruct): a system message */
    {"{{- ' [INST] ' + message['content'] + ' [/INST]' }}", " [INST] ", " [/INST]", " ", "", false, FORGE__MISTRAL_SYSTEM_FIRST, false,
     FORGE__MISTRAL_ALTERNATE, FORGE__MISTRAL_ROLE},
    /* Mistral-7B-Instruct-v0.3's: [INST] is a control token, tools */
    {"{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}", "[INST] ", "[/INST]", " ", "", true, FORGE__MISTRAL_SYSTEM_LAST, true,
     FORGE__MISTRAL_ALTERNATE, FORGE__MISTRAL_ROLE},
    /* Mistral-Nemo-Instruct-2407's (Tekken): no spaces */
    {"{{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}", "[INST]", "[/INST]", "", "", false, FORGE__MISTRAL_SYSTEM_LAST, true,
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
 * every message's content is trimmed; a first system message opens the prompt; every reply after
 * the last query carries a think block (its reasoning, or empty); the reply opens with <think>\n
 * when thinking is on, else with an empty block. `think`: enable_thinking, its default the
 * template's (off for Qwen3.5-0.8B / -2B, on for 4B and larger). */
static forge_status forge__render_qwen35(const forge_chat_message *msgs, int n, bool gen, bool think, forge__sb *b, forge__err *err) {
    if (n == 0) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "No messages provided.");
    if (forge__role_is(&msgs[0], "system")) { /* no tools: the system turn, trimmed */
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

/* Mistral's [INST] templates (forge__mistral_templates), line for line: a first system message
 * taken out where the template takes one, BOS, then each message in turn, user and assistant
 * alternating. v0.3's and Nemo's check the roles before writing anything and skip tool results
 * there; a tool result is then refused for its tool_call_id, which forge's messages do not carry. */
static forge_status forge__render_mistral(const forge__chat_style *st, const forge_chat_message *msgs, int n, forge__sb *b,
                                          forge__err *err) {
    const forge__mistral_template *t = st->mistral;
    if (n == 0 && t->system != FORGE__MISTRAL_SYSTEM_NONE) /* messages[0]["role"] fails on no messages */
        return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "the conversation has no messages");
    int first = t->system != FORGE__MISTRAL_SYSTEM_NONE && forge__role_is(&msgs[0], "system") ? 1 : 0;
    if (t->tool_results)
        for (int i = first, k = 0; i < n; i++)
            if (!forge__mistral_tool_result(&msgs[i]) && forge__role_is(&msgs[i], "user") != (k++ % 2 == 0))
                return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "%s", t->alternate_error);
    forge__sb_puts(b, st->bos);
    for (int i = first; i < n; i++) {
        const forge_chat_message *m = &msgs[i];
        bool user = forge__role_is(m, "user");
        if (!t->tool_results && user != ((i - first) % 2 == 0))
            return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "%s", t->alternate_error);
        if (user) {
            forge__sb_puts(b, t->inst);
            if (first && i == (t->system == FORGE__MISTRAL_SYSTEM_FIRST ? first : n - 1)) {
                forge__sb_puts(b, msgs[0].content);
                forge__sb_puts(b, "\n\n");
            }
            forge__sb_puts(b, m->content);
            forge__sb_puts(b, t->inst_end);
        } else if (forge__role_is(m, "assistant")) {
            forge__sb_puts(b, t->reply);
            if (t->reply_trim)
                forge__sb_put_trimmed(b, m->content, strlen(m->content));
            else
                forge__sb_puts(b, m->content);
            forge__sb_puts(b, st->eos);
            forge__sb_puts(b, t->after_eos);
        } else if (t->tool_results && forge__mistral_tool_result(m)) {
            return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "Tool call IDs should be alphanumeric strings with length 9!");
        } else {
            return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "%s", t->role_error);
        }
    }
    return FORGE_OK;
}

FORGE__INTERNAL forge_status forge__chat_render(const forge__chat_style *st, const forge_chat_message *msgs, int n, uint32_t flags,
                                                forge__sb *b, forge__err *err) {
    bool gen = !(flags & FORGE_CHAT_NO_GENERATION_PROMPT);
    if ((flags & FORGE_CHAT_THINKING_ON) && (flags & FORGE_CHAT_THINKING_OFF))
        return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "FORGE_CHAT_THINKING_ON and FORGE_CHAT_THINKING_OFF together");
    bool think = (flags & FORGE_CHAT_THINKING_ON) ? true : (flags & FORGE_CHAT_THINKING_OFF) ? false : st->think_default;
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "message %d has no role or no content", i);
    if (st->family == FORGE__CHAT_MISTRAL) {
        forge_status rc = forge__render_mistral(st, msgs, n, b, err);
        if (rc) return rc;
    } else if (st->family == FORGE__CHAT_CHATML && st->qwen35) {
        forge_status rc = forge__render_qwen35(msgs, n, gen, think, b, err);
        if (rc) return rc;
    } else if (st->family == FORGE__CHAT_LLAMA3 && st->llama3_dated) {
        /* Llama 3.1 / 3.2 / 3.3 without tools: BOS, a system block that always exists (cutoff,
         * date, then the first message's content when that is a system message), the turns;
         * tool results go out as an ipython turn holding the content as a JSON string. */
        if (n == 0) return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "the conversation has no messages");
        int first = forge__role_is(&msgs[0], "system") ? 1 : 0;
        forge__sb_puts(b, st->bos);
        forge__sb_puts(b, "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: ");
        forge__sb_puts(b, st->date);
        forge__sb_puts(b, "\n\n");
        if (first) {
            forge__sb_put_trimmed(b, msgs[0].content, strlen(msgs[0].content));
        }
        forge__sb_puts(b, "<|eot_id|>");
        for (int i = first; i < n; i++) {
            if (forge__role_is(&msgs[i], "tool") || forge__role_is(&msgs[i], "ipython")) {
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
        /* Gemma 4's chat_template.jinja (2026-07-09) for messages of text: a system turn first
         * when thinking is on or the first message is a system or developer message; then one
         * turn per message (assistant as model; consecutive assistant messages share one turn,
         * their thought channels stripped); the reply opens with <|turn>model. */
        int first = n > 0 && (forge__role_is(&msgs[0], "system") || forge__role_is(&msgs[0], "developer")) ? 1 : 0;
        for (int i = first; i < n; i++)
            if (forge__role_is(&msgs[i], "tool"))
                return forge__fail(err, FORGE_ERR_UNSUPPORTED,
                                   "message %d: Gemma 4's template places a tool result after the assistant's tool call, which forge's messages do not carry", i);
        forge__sb_puts(b, st->bos);
        if (think || first) {
            forge__sb_puts(b, "<|turn>system\n");
            if (think) forge__sb_puts(b, "<|think|>\n");
            if (first) {
                forge__sb_put_trimmed(b, msgs[0].content, strlen(msgs[0].content));
            }
            forge__sb_puts(b, "<turn|>\n");
        }
        for (int i = first; i < n; i++) {
            bool model = forge__role_is(&msgs[i], "assistant");
            if (!(model && i > first && forge__role_is(&msgs[i - 1], "assistant"))) {
                forge__sb_puts(b, "<|turn>");
                forge__sb_puts(b, model ? "model" : msgs[i].role);
                forge__sb_puts(b, "\n");
            }
            if (model) { /* strip_thinking: every <|channel>...<channel|> span out, then trim */
                forge__sb kept = {0};
                const char *p = msgs[i].content;
                for (;;) {
                    const char *close = strstr(p, "<channel|>");
                    size_t len = close ? (size_t)(close - p) : strlen(p);
                    const char *open = forge__memmem(p, len, "<|channel>");
                    forge__sb_put(&kept, p, open ? (size_t)(open - p) : len);
                    if (!close) break;
                    p = close + strlen("<channel|>");
                }
                forge__sb_put_trimmed(b, kept.buf ? kept.buf : "", kept.len);
                b->oom |= kept.oom;
                free(kept.buf);
            } else {
                forge__sb_put_trimmed(b, msgs[i].content, strlen(msgs[i].content));
            }
            if (!(model && i + 1 < n && forge__role_is(&msgs[i + 1], "assistant"))) forge__sb_puts(b, "<turn|>\n");
        }
        if (gen) {
            forge__sb_puts(b, "<|turn>model\n");
            if (st->gemma4_empty_thought && !think) forge__sb_puts(b, "<|channel>thought\n<channel|>");
        }
    } else if (st->family == FORGE__CHAT_CHATML) {
        if (n > 0 && forge__role_is(&msgs[0], "system")) {
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
                forge__sb_puts(b, "<|im_start|>assistant\n");
                if (st->qwen3 && i > last_query && (i == n - 1 || rn > 0)) {
                    forge__strip_char(&reason, &rn, '\n', true, true);
                    forge__sb_puts(b, "<think>\n");
                    forge__sb_put(b, reason, rn);
                    forge__sb_puts(b, "\n</think>\n\n");
                    forge__strip_char(&content, &cn, '\n', true, false);
                }
                forge__sb_put(b, content, cn);
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

/* Renders the caller's messages (an array of their struct_size) with the model's style into b. */
static forge_status forge__chat_render_caller(const forge__chat_style *st, const forge_chat_message *messages, int n_messages,
                                              uint32_t flags, forge__sb *b, forge__err *err) {
    if (n_messages < 0 || (n_messages && !messages))
        return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "a chat needs messages for n_messages (%d) >= 0", n_messages);
    forge_status rc = n_messages ? forge__check_sized(messages, "forge_chat_message", err) : FORGE_OK;
    if (rc) return rc;
    forge_chat_message *own = (forge_chat_message *)forge__array_in(messages, n_messages, sizeof *own);
    if (!own) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    rc = forge__chat_render(st, own, n_messages, flags, b, err);
    free(own);
    return rc;
}

FORGE_API forge_status forge_chat_render(const forge_model *m, const forge_chat_message *messages, int n_messages, uint32_t flags,
                                         char *out, size_t capacity, size_t *len) {
    if (!forge__model_ready(m) || !len) return FORGE_ERR_INVALID_ARGUMENT;
    forge__chat_style st;
    forge_status s = forge__chat_style_of(m, &st);
    if (s) return s;
    forge__sb b = {0};
    forge__err err;
    s = forge__chat_render_caller(&st, messages, n_messages, flags, &b, &err);
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

FORGE_API forge_status forge_chat(forge_session *s, const forge_chat_message *messages, int n_messages, uint32_t flags,
                                  const forge_generate_params *params, forge_metrics *metrics) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    forge_model *m = s->m;
    forge_status rc = forge__check_sized(metrics, "forge_metrics", &s->err);
    if (rc) return rc;
    forge__chat_style st;
    if ((rc = forge__chat_style_of(m, &st))) return forge__fail(&s->err, rc, "%s", forge_model_errmsg(m));
    forge__sb b = {0};
    if ((rc = forge__chat_render_caller(&st, messages, n_messages, flags, &b, &s->err))) {
        free(b.buf);
        return rc;
    }
    /* where the reply's opening begins: the conversation rendered without it, when that is a
     * prefix (a model with linear-attention layers checkpoints its prompt cache there) */
    size_t head = 0;
    if (!(flags & FORGE_CHAT_NO_GENERATION_PROMPT) && forge__has_linear(&m->cfg)) {
        forge__sb h = {0};
        forge__err ignored = {0};
        if (!forge__chat_render_caller(&st, messages, n_messages, flags | FORGE_CHAT_NO_GENERATION_PROMPT, &h, &ignored) && h.len < b.len &&
            !memcmp(h.buf, b.buf, h.len))
            head = h.len;
        free(h.buf);
    }
    forge_generate_params p;
    FORGE__COPY_PARAMS(p, params, forge_generate_default_params);
    p.add_special = 0; /* the template wrote BOS */
    forge_constraint lazy; /* a constraint on a thinking reply starts after the thinking */
    if (p.constraint && !forge__check_sized(p.constraint, "forge_constraint", &s->err)) {
        forge__constraint_in(p.constraint, &lazy);
        const char *after = forge__chat_thinking_end(&st, flags);
        if (!lazy.trigger && after && lazy.kind != FORGE_CONSTRAINT_NONE) {
            lazy.trigger = after;
            p.constraint = &lazy;
        }
    }
    rc = forge__generate_text(s, b.buf ? b.buf : "", b.len, head, &p, metrics);
    free(b.buf);
    return rc;
}

