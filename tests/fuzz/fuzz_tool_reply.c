/* libFuzzer target: the tool-call reply parser (forge_chat_tools reads a generated reply with
 * it). Input: byte 0 picks the format (Llama 3.1+'s JSON reply, Qwen 3's <tool_call> JSON
 * blocks, Qwen 3.5's <function=...> blocks, their values typed by typed_tools' schemas,
 * Mistral v0.3's and Nemo's [TOOL_CALLS] arrays, Gemma 4's <|tool_call> blocks in its own
 * notation); the rest is the reply (any bytes).
 * Invariants: no crash; every call has a non-empty name, arguments that are a JSON object
 * (checked against a GBNF of RFC 8259's objects) and an id of 9 letters and digits; the content
 * is no longer than the reply. */
#include "internal.h"
#include "fuzz_common.h"

#include <ctype.h>

/* Any JSON object (RFC 8259), escapes in keys included. */
static const char object_gbnf[] =
    "root ::= obj\n"
    "obj ::= \"{\" ws (str ws \":\" ws val (ws \",\" ws str ws \":\" ws val)*)? ws \"}\"\n"
    "arr ::= \"[\" ws (val (ws \",\" ws val)*)? ws \"]\"\n"
    "val ::= obj | arr | str | num | \"true\" | \"false\" | \"null\"\n"
    "str ::= \"\\\"\" ([^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}))* \"\\\"\"\n"
    "num ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?\n"
    "ws ::= [ \\t\\n\\r]*\n";

/* Tools whose parameters' schemas type Qwen 3.5's values: f's a (string), b (integer), c (enum),
 * d (a $ref to an object), e (anything); g has no schema. */
static const forge_tool typed_tools[2] = {
    {sizeof(forge_tool), "f", NULL,
     "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\"}, \"b\": {\"type\": \"integer\"}, "
     "\"c\": {\"enum\": [\"x\", \"y\"]}, \"d\": {\"$ref\": \"#/$defs/o\"}, \"e\": {}}, \"$defs\": {\"o\": {\"type\": \"object\"}}}"},
    {sizeof(forge_tool), "g", NULL, NULL}};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char err[256];
    const char *probe = "{\"a\\n\": [1, -2.5e3, \"\\u00e9\", null, {}]}";
    if (ft_gbnf_match(object_gbnf, probe, strlen(probe), err, sizeof err) != 1) {
        fprintf(stderr, "fuzz: the JSON object grammar: %s\n", err);
        exit(1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int format = 1 + data[0] % 6, n = -1;
    size_t content = 0;
    char *r = ft_tool_reply(format, (const char *)data + 1, size - 1, typed_tools, 2, &n, &content);
    if (!r || n < 0) abort();
    if (content > size - 1) abort();
    char *p = n ? r + content : NULL;
    if (p && *p != '\x01') abort();
    int seen = 0;
    char err[256];
    while (p) {
        char *name = p + 1, *sep = strchr(name, '\x02');
        if (!sep || sep == name) abort();
        char *args = sep + 1, *next = strchr(args, '\x01');
        size_t alen = next ? (size_t)(next - args) : strlen(args);
        if (ft_gbnf_match(object_gbnf, args, alen, err, sizeof err) != 1) {
            fprintf(stderr, "arguments that are not a JSON object: %.*s\n", (int)alen, args);
            abort();
        }
        seen++;
        p = next;
    }
    if (seen != n) abort();
    free(r);
    char *ids = ft_tool_reply_ids(format, (const char *)data + 1, size - 1);
    if (!ids || strlen(ids) != (n ? 10 * (size_t)n - 1 : 0)) abort();
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 9; k++)
            if (!isalnum((unsigned char)ids[10 * i + k])) abort();
    free(ids);
    return 0;
}
