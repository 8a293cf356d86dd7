// forge chat through the binary (issue 42): a model without a chat template is refused at
// start-up (it answered every message with the error, for ever); /help lists the commands and
// /reset says what it did (the one went to the model as a message, the other printed nothing);
// --think on a family without a thinking switch is said to be ignored, once; Ctrl-C stops a
// reply, and at the prompt ends the chat with 130. The model with a template is
// tests/test_chat.cpp's random-weight Llama with the real Llama 3 tokenizer.
#include "cli_process.h"
#include "json_check.h"
#include "tok_util.h"

std::string chat_model(const std::string &family, const std::string &data); /* tests/test_chat.cpp */

namespace {

using ft::Forge;

size_t count(const std::string &s, const std::string &what) {
    size_t n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) n++;
    return n;
}

/* The Llama 3 chat model, made once. */
const std::string &llama_chat_model() {
    static const std::string dir = [] {
        std::string data = ft::tok_data();
        return data.empty() ? std::string() : chat_model("llama3", data);
    }();
    return dir;
}

} // namespace

TEST(CliChat, NoTemplateIsRefusedAtStartUp) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    std::string d = ft::tmpdir("cli_chat_none");
    {
        /* stdin stays open and empty: the refusal does not wait for a message */
        Forge f(d, {"chat", ft::src("models/stories260K/stories260K.gguf")});
        EXPECT_EQ(f.wait_exit(60), 1) << f.stderr_text();
        EXPECT_EQ(f.stdout_text(), ""); /* no prompt, no reply */
        std::string err = f.stderr_text();
        EXPECT_EQ(err, "forge: the model's tokenizer has no known chat format (Llama 3, ChatML, Gemma, Gemma 4) (FORGE_ERR_UNSUPPORTED)\n");
    }
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}

TEST(CliChat, HelpAndResetAreCommands) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    const std::string &model = llama_chat_model();
    ASSERT_FALSE(model.empty());
    std::string d = ft::tmpdir("cli_chat_commands");
    for (bool with_system : {false, true}) {
        std::vector<std::string> args = {"chat", model, "-n", "3"};
        if (with_system) args.insert(args.end(), {"--system", "Be brief."});
        Forge f(d, args);
        for (const char *line : {"/help", "/reset", "Hi", "/reset", "/metrics", "/quit"}) f.write_line(line);
        EXPECT_EQ(f.wait_exit(60), 0) << f.stderr_text();
        std::string out = f.stdout_text(), err = f.stderr_text();
        /* /help: the commands, not a reply of the model's (the first /reset finds no message) */
        EXPECT_EQ(out.rfind("commands: /help (this list), /metrics", 0), 0u) << out;
        for (const char *cmd : {"/metrics", "/reset", "/quit", "Ctrl-C"}) EXPECT_NE(out.find(cmd), std::string::npos) << cmd;
        std::string kept = with_system ? ", the system prompt kept" : "";
        EXPECT_NE(out.find("[reset: 0 messages forgotten" + kept + "; the next message starts a new conversation]\n"), std::string::npos) << out;
        EXPECT_NE(out.find("[reset: 2 messages forgotten" + kept + "; the next message starts a new conversation]\n"), std::string::npos) << out;
        EXPECT_EQ(count(err, "[prompt "), 1u) << err; /* /metrics: the one reply's */
        EXPECT_EQ(err.find("forge:"), std::string::npos) << err;
        EXPECT_EQ(err.find("think"), std::string::npos) << err;
    }
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}

/* The prompt tokens forge_chat evaluates for one user message (the template's rendering,
 * tokenized as forge_chat does): what /metrics then reports. */
static int prompt_tokens(const std::string &model, const char *message) {
    forge_model_params mp = forge_model_default_params();
    mp.vocab_only = 1;
    forge_model *m = nullptr;
    EXPECT_EQ(forge_model_load(model.c_str(), &mp, &m), FORGE_OK);
    forge_chat_message msg = {sizeof msg, "user", message};
    char text[4096];
    size_t len = 0, n = 0;
    EXPECT_EQ(forge_chat_render(m, &msg, 1, 0, text, sizeof text, &len), FORGE_OK);
    forge_status st = forge_tokenize(m, text, len, 0, nullptr, 0, &n);
    EXPECT_TRUE(st == FORGE_OK || st == FORGE_ERR_BUFFER_TOO_SMALL);
    forge_model_free(m);
    return (int)n;
}

/* Issue 42: a line starting with / that is no command is refused, naming it (it went to the model
 * as a message); a command given arguments says it takes none; "//x" sends "/x" */
TEST(CliChat, UnknownCommandsAreRefusedAndDoubleSlashSends) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    const std::string &model = llama_chat_model();
    ASSERT_FALSE(model.empty());
    const int sent = prompt_tokens(model, "/etc/hosts"), doubled = prompt_tokens(model, "//etc/hosts");
    ASSERT_NE(sent, doubled); /* so the count tells which was sent */
    std::string d = ft::tmpdir("cli_chat_slash");
    {
        Forge f(d, {"chat", model, "-n", "2"});
        for (const char *line : {"/xyz", "/etc/hosts is missing", "/reset now", "/metrics", "//etc/hosts", "/metrics", "/quit  "}) f.write_line(line);
        EXPECT_EQ(f.wait_exit(60), 0) << f.stderr_text();
        std::string out = f.stdout_text(), err = f.stderr_text();
        EXPECT_NE(err.find("[unknown command /xyz (see /help)]\n"), std::string::npos) << err;
        EXPECT_NE(err.find("[unknown command /etc/hosts (see /help)]\n"), std::string::npos) << err;
        EXPECT_NE(err.find("[/reset takes no arguments (see /help)]\n"), std::string::npos) << err;
        EXPECT_EQ(out.find("[reset:"), std::string::npos) << out;
        /* the first /metrics: no reply yet (nothing was sent); the second: "/etc/hosts" alone */
        EXPECT_NE(err.find("[prompt 0 tokens"), std::string::npos) << err;
        EXPECT_NE(err.find("[prompt " + std::to_string(sent) + " tokens"), std::string::npos) << err << " (sent " << sent << ")";
        EXPECT_EQ(count(err, "[prompt "), 2u) << err;
        EXPECT_EQ(err.find("forge:"), std::string::npos) << err;
    }
    /* /help says how */
    Forge h(d, {"chat", model});
    h.write_line("/help");
    h.close_input();
    EXPECT_EQ(h.wait_exit(60), 0);
    EXPECT_NE(h.stdout_text().find("double the /: //etc/hosts sends /etc/hosts"), std::string::npos) << h.stdout_text();
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}

TEST(CliChat, ThinkWithoutASwitchIsSaidOnce) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    const std::string &model = llama_chat_model();
    ASSERT_FALSE(model.empty());
    std::string d = ft::tmpdir("cli_chat_think");
    for (const char *flag : {"--think", "--no-think"}) {
        Forge f(d, {"chat", model, "-n", "2", flag});
        for (const char *line : {"Hi", "Hello again"}) f.write_line(line);
        f.close_input();
        EXPECT_EQ(f.wait_exit(60), 0) << f.stderr_text();
        std::string err = f.stderr_text();
        EXPECT_EQ(count(err, std::string("forge chat: ") + flag + " is ignored: this model's chat format has no thinking switch"), 1u) << err;
    }
    /* both: a usage error */
    Forge both(d, {"chat", model, "--think", "--no-think"});
    EXPECT_EQ(both.wait_exit(60), 2);
    EXPECT_EQ(both.stderr_text().rfind("forge chat: --think and --no-think contradict each other\nusage: forge chat ", 0), 0u)
        << both.stderr_text();
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}

TEST(CliChat, CtrlCStopsAReplyThenEndsAtThePrompt) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    const std::string &model = llama_chat_model();
    ASSERT_FALSE(model.empty());
    std::string d = ft::tmpdir("cli_chat_ctrlc");
    {
        /* sampled: the random model's text keeps coming (a greedy one may repeat a token that prints nothing) */
        Forge f(d, {"chat", model, "-n", "100000", "--temp", "1"});
        f.write_line("Tell me a long story.");
        ASSERT_TRUE(f.wait_for([&] { return f.stdout_text().size() > 100; })) << f.stderr_text();
        f.interrupt();
        ASSERT_TRUE(f.wait_for([&] { return f.stderr_text().find("[stopped]") != std::string::npos; })) << f.stderr_text();
        /* the chat goes on: a command is answered, so Ctrl-C is caught again */
        f.write_line("/help");
        ASSERT_TRUE(f.wait_for([&] { return f.stdout_text().find("commands: /help") != std::string::npos; })) << f.stderr_text();
        f.write_line("/metrics");
        ASSERT_TRUE(f.wait_for([&] { return f.stderr_text().find("stop: cancelled") != std::string::npos; })) << f.stderr_text();
        /* at the prompt: the end, 130 */
        f.interrupt();
        EXPECT_EQ(f.wait_exit(60), 130) << f.stderr_text();
        EXPECT_EQ(f.stderr_text().find("forge:"), std::string::npos) << f.stderr_text();
    }
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}

namespace {

/* llama_chat_model's copy in directory `name` with the committed template `file`
 * (tests/fixtures/chat) in its tokenizer_config.json. */
std::string templated_model(const std::string &name, const std::string &file) {
    const std::string &base = llama_chat_model();
    if (base.empty()) return std::string();
    std::string d = ft::tmpdir(name);
    if (ft::sh("cp '" + base + "'/* '" + d + "'/") != 0) return std::string();
    std::vector<uint8_t> cfg = ft::read_file(d + "/tokenizer_config.json"), tmpl = ft::read_file(ft::src("tests/fixtures/chat/" + file));
    cJSON *root = cJSON_ParseWithLength((const char *)cfg.data(), cfg.size());
    if (!root) return std::string();
    cJSON_DeleteItemFromObjectCaseSensitive(root, "chat_template");
    cJSON_AddItemToObject(root, "chat_template", cJSON_CreateString(std::string(tmpl.begin(), tmpl.end()).c_str()));
    char *text = cJSON_PrintUnformatted(root);
    ft::write_file(d + "/tokenizer_config.json", text, strlen(text));
    free(text);
    cJSON_Delete(root);
    return d;
}

/* The Llama 3 chat model with Llama 3.2's template (tools rendered in the first user message), made once. */
const std::string &llama32_tools_model() {
    static const std::string dir = templated_model("cli_chat_llama32", "llama3.2-instruct.jinja");
    return dir;
}

const char weather_schema[] = "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 12}}, "
                              "\"required\": [\"city\"], \"additionalProperties\": false}";

} // namespace

/* forge chat --tools: a reply's calls are printed as [tool call NAME ARGUMENTS] (required: every
 * reply is one, its arguments valid against the tool's schema), the next line is the call's
 * result (the prompt names the function), after which the model answers again; a tools file
 * that is no tools list, --tool-calls without --tools, and a family without a tool format are
 * refused before any message. Random weights: only the shape of the exchange is checked. */
TEST(CliChat, ToolCallsPrintAndTakeTheirResults) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    const std::string &model = llama32_tools_model();
    ASSERT_FALSE(model.empty());
    std::string d = ft::tmpdir("cli_chat_tools");
    std::string tools = "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather in a city.\", "
                        "\"parameters\": " + std::string(weather_schema) + "}}]";
    ft::write_file(d + "/tools.json", tools.data(), tools.size());
    {
        Forge f(d, {"chat", model, "--tools", d + "/tools.json", "--tool-calls", "required", "-n", "48"});
        for (const char *line : {"Weather in Paris?", "{\"celsius\": 21}", "/quit"}) f.write_line(line);
        EXPECT_EQ(f.wait_exit(120), 0) << f.stderr_text();
        std::string out = f.stdout_text();
        EXPECT_EQ(f.stderr_text().find("forge:"), std::string::npos) << f.stderr_text();
        /* two replies, each one call: the second came after the result line */
        ASSERT_EQ(count(out, "[tool call get_weather "), 2u) << out;
        size_t at = out.find("[tool call get_weather ") + 23, end = out.find("]\n", at);
        ASSERT_NE(end, std::string::npos) << out;
        EXPECT_EQ(jc::validate(out.substr(at, end - at), weather_schema), "") << out;
    }
    {   /* Mistral v0.3: each result line answers its call by the call's id (a result without one
         * is the template's error); sampled, as greedy random weights write call after call */
        std::string mistral = templated_model("cli_chat_mistral", "mistral-7b-instruct-v0.3.jinja");
        ASSERT_FALSE(mistral.empty());
        Forge f(d, {"chat", mistral, "--tools", d + "/tools.json", "--tool-calls", "required", "-n", "64", "--temp", "1.2", "--seed", "1"});
        for (const char *line : {"Weather in Paris?", "{\"celsius\": 21}", "{\"celsius\": 22}", "/quit"}) f.write_line(line);
        EXPECT_EQ(f.wait_exit(120), 0) << f.stderr_text();
        std::string out = f.stdout_text();
        EXPECT_EQ(f.stderr_text(), "") << f.stderr_text();
        EXPECT_GE(count(out, "[tool call get_weather "), 3u) << out; /* two calls, their results, more calls */
        EXPECT_EQ(system(("rm -rf '" + mistral + "'").c_str()), 0);
    }
    struct Refusal { std::vector<std::string> args; int status; std::string says; };
    std::string bad = d + "/bad.json";
    auto put = [](const std::string &path, const std::string &text) { ft::write_file(path, text.data(), text.size()); };
    put(bad, "{\"name\": \"x\"}");
    std::string nameless = d + "/nameless.json";
    put(nameless, "[{\"type\": \"function\", \"function\": {\"description\": \"x\"}}]");
    for (const Refusal &r : std::vector<Refusal>{
             {{"chat", model, "--tools", bad}, 2, "forge chat: --tools: " + bad + " is not a JSON array of tools"},
             {{"chat", model, "--tools", nameless}, 2, "forge chat: --tools: " + nameless + ": tool 1 has no \"name\"\n"},
             {{"chat", model, "--tools", d + "/missing.json"}, 2, "forge chat: --tools: cannot read " + d + "/missing.json\n"},
             {{"chat", model, "--tool-calls", "strict"}, 2, "--tool-calls goes with --tools FILE"},
             {{"chat", model, "--tools", d + "/tools.json", "--tool-calls", "always"}, 2, "--tool-calls 'always': expected free, strict or required"},
             {{"chat", llama_chat_model(), "--tools", d + "/tools.json"}, 1, "(FORGE_ERR_UNSUPPORTED)\n"}}) {
        Forge f(d, r.args); /* stdin stays open: the refusal does not wait for a message */
        EXPECT_EQ(f.wait_exit(60), r.status) << r.says << "\n" << f.stderr_text();
        EXPECT_NE(f.stderr_text().find(r.says), std::string::npos) << f.stderr_text();
        EXPECT_EQ(f.stdout_text(), "");
    }
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}
