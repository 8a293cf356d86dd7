// Ctrl-C (issue 42): the first SIGINT stops a verb at its next token (or batch, or step), and it
// then prints and saves everything as after any stop, and exits with 130. Each test starts
// ./forge (from the build tree) on a generation that would run for minutes, sends SIGINT once it
// is under way, and checks the exit status, the files and the output.
#include <cjson/cJSON.h>

#include "cli_process.h"

namespace {

using ft::Forge;

std::string bundled() { return ft::src("models/stories260K/stories260K.gguf"); }

/* With -v the library logs the session it makes ("session: n_ctx ..."); the verbs catch Ctrl-C
 * once their session exists. A moment later generation is under way. */
bool session_made(Forge &f) {
    bool ok = f.wait_for([&] { return f.stderr_text().find("session: n_ctx") != std::string::npos; });
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    return ok;
}

cJSON *parse(const std::string &s) {
    cJSON *j = cJSON_Parse(s.c_str());
    EXPECT_NE(j, nullptr) << "not JSON: " << s;
    return j;
}

std::string str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    EXPECT_TRUE(cJSON_IsString(v)) << key;
    return cJSON_IsString(v) ? v->valuestring : "";
}

double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    EXPECT_TRUE(cJSON_IsNumber(v)) << key;
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

} // namespace

/* forge run --json --save-state --metrics: Ctrl-C used to kill it (an empty file, no state, no
 * metrics line); now the JSON is whole (stop reason "cancelled"), the state is saved and loads,
 * the metrics line is printed, and the status is 130. */
TEST(CliInterrupt, RunJsonSavesStateAndMetrics) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    std::string d = ft::tmpdir("cli_int_run"), state = d + "/state.bin";
    {
        Forge f(d, {"run", bundled(), "-p", "Once upon a time", "-n", "100000", "--ctx", "256", "--ctx-overflow", "shift", "--json",
                    "--metrics", "-v", "--save-state", state});
        ASSERT_TRUE(session_made(f)) << f.stderr_text();
        f.interrupt();
        ASSERT_EQ(f.wait_exit(), 130) << f.stderr_text();
        std::string out = f.stdout_text(), err = f.stderr_text();
        cJSON *j = parse(out);
        ASSERT_NE(j, nullptr);
        EXPECT_EQ(str(j, "status"), "FORGE_OK");
        EXPECT_EQ(str(j, "stop_reason"), "cancelled");
        EXPECT_GT(num(j, "generated_tokens"), 0);
        EXPECT_LT(num(j, "generated_tokens"), 100000);
        EXPECT_FALSE(str(j, "text").empty());
        cJSON_Delete(j);
        EXPECT_NE(err.find("[prompt 5 tokens"), std::string::npos) << err;
        EXPECT_NE(err.find("stop: cancelled"), std::string::npos) << err;
    }
    ASSERT_TRUE(ft::exists(state));
    /* the state loads and generation goes on from it (sliding as the saving run did: how many
     * tokens that run made before Ctrl-C, up to a full context, depends on the machine's speed) */
    Forge g(d, {"run", bundled(), "--load-state", state, "--ctx", "256", "--ctx-overflow", "shift", "-n", "3", "--json"});
    ASSERT_EQ(g.wait_exit(), 0) << g.stderr_text();
    cJSON *j = parse(g.stdout_text());
    ASSERT_NE(j, nullptr);
    EXPECT_EQ(str(j, "stop_reason"), "max_tokens");
    EXPECT_GT(num(j, "cached_tokens"), 0); /* the saved tokens, restored */
    cJSON_Delete(j);
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}

/* Ctrl-C while the prompt is evaluated: the session holds part of the prompt, a state that a later
 * --load-state would continue mid-prompt, so none is saved: the file is left as it was, stderr says
 * so, and the JSON is whole (cancelled, nothing generated). The prompt of 24000 tokens slides
 * through --ctx 64 (recompute: about 20 s of prefill on lavapipe). */
TEST(CliInterrupt, RunStoppedInThePromptSavesNoState) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    std::string d = ft::tmpdir("cli_int_prompt"), state = d + "/state.bin", prompt;
    while (prompt.size() < 100000) prompt += "Once upon a time ";
    ft::write_file(state, "an earlier state", 16);
    {
        Forge f(d, {"run", bundled(), "-p", prompt, "-n", "4", "--ctx", "64", "--ctx-overflow", "recompute", "--json", "-v",
                    "--save-state", state});
        ASSERT_TRUE(session_made(f)) << f.stderr_text();
        f.interrupt();
        ASSERT_EQ(f.wait_exit(), 130) << f.stderr_text();
        std::string err = f.stderr_text();
        EXPECT_NE(err.find("forge run: stopped while the prompt was evaluated: no state saved (" + state + " is as it was)\n"),
                  std::string::npos) << err;
        cJSON *j = parse(f.stdout_text());
        ASSERT_NE(j, nullptr);
        EXPECT_EQ(str(j, "stop_reason"), "cancelled");
        EXPECT_EQ(num(j, "generated_tokens"), 0);
        EXPECT_GT(num(j, "prompt_tokens"), 20000);
        cJSON_Delete(j);
    }
    EXPECT_EQ(ft::file_text(state), "an earlier state");
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}

/* the streamed text ends with a newline after Ctrl-C, and the metrics line follows */
TEST(CliInterrupt, RunTextEndsItsLine) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    std::string d = ft::tmpdir("cli_int_text");
    {
        Forge f(d, {"run", bundled(), "-p", "Once upon a time", "-n", "100000", "--ctx", "256", "--ctx-overflow", "shift", "--metrics"});
        ASSERT_TRUE(f.wait_for([&] { return f.stdout_text().size() > 200; })) << f.stderr_text();
        f.interrupt();
        ASSERT_EQ(f.wait_exit(), 130) << f.stderr_text();
        std::string out = f.stdout_text(), err = f.stderr_text();
        EXPECT_EQ(out.rfind("Once upon a time", 0), 0u);
        ASSERT_FALSE(out.empty());
        EXPECT_EQ(out.back(), '\n');
        EXPECT_NE(err.find("stop: cancelled"), std::string::npos) << err;
    }
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}

/* run --batch-file --json: every sequence stops (the one generating and those not started yet),
 * and the JSON is printed whole */
TEST(CliInterrupt, BatchFilePrintsEveryItem) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    std::string d = ft::tmpdir("cli_int_batch"), file = d + "/prompts.txt";
    std::string lines = "Once upon a time\nThe little dog\nA big red ball\n";
    ft::write_file(file, lines.data(), lines.size());
    {
        Forge f(d, {"run", bundled(), "--batch-file", file, "--parallel", "1", "-n", "100000", "--json", "-v"});
        ASSERT_TRUE(session_made(f)) << f.stderr_text();
        f.interrupt();
        ASSERT_EQ(f.wait_exit(), 130) << f.stderr_text();
        cJSON *j = parse(f.stdout_text());
        ASSERT_NE(j, nullptr);
        const cJSON *items = cJSON_GetObjectItem(j, "items");
        ASSERT_EQ(cJSON_GetArraySize(items), 3);
        for (int i = 0; i < 3; i++) {
            const cJSON *it = cJSON_GetArrayItem(items, i);
            EXPECT_EQ(str(it, "stop_reason"), "cancelled") << i;
            EXPECT_EQ(str(it, "status"), "FORGE_OK") << i;
        }
        EXPECT_GT(num(cJSON_GetArrayItem(items, 0), "generated_tokens"), 0);
        EXPECT_EQ(num(cJSON_GetArrayItem(items, 2), "generated_tokens"), 0); /* never started */
        cJSON_Delete(j);
    }
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}

/* classify stops between batches; the library fills no results then, so none are printed */
TEST(CliInterrupt, ClassifyStopsBetweenBatches) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    std::string d = ft::tmpdir("cli_int_classify"), file = d + "/prompts.json";
    /* 400 prompts of ~500 tokens: one a batch, minutes in all */
    std::string prompt;
    while (prompt.size() < 2000) prompt += "Once upon a time ";
    std::string arr = "[";
    for (int i = 0; i < 400; i++) arr += (i ? ",\"" : "\"") + std::to_string(i) + " " + prompt + "\"";
    arr += "]";
    ft::write_file(file, arr.data(), arr.size());
    {
        Forge f(d, {"classify", bundled(), "--stdin-json", "-v"}, file);
        ASSERT_TRUE(session_made(f)) << f.stderr_text();
        f.interrupt();
        ASSERT_EQ(f.wait_exit(), 130) << f.stderr_text();
        EXPECT_EQ(f.stdout_text(), "");
        EXPECT_NE(f.stderr_text().find("(FORGE_ERR_CANCELLED)"), std::string::npos) << f.stderr_text();
    }
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}

/* bench stops at the next token and prints no result (its medians need every repetition) */
TEST(CliInterrupt, BenchPrintsNoResult) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    std::string d = ft::tmpdir("cli_int_bench");
    {
        Forge f(d, {"bench", bundled(), "-p", "16", "-n", "20000", "-r", "1", "-v"});
        ASSERT_TRUE(session_made(f)) << f.stderr_text();
        f.interrupt();
        ASSERT_EQ(f.wait_exit(), 130) << f.stderr_text();
        EXPECT_EQ(f.stdout_text(), "");
        EXPECT_NE(f.stderr_text().find("forge bench: interrupted"), std::string::npos) << f.stderr_text();
    }
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}

/* a second Ctrl-C is not caught: the default action ends the program (forge train, which
 * finishes its step after the first: a step of 16 x 256 tokens outlasts the gap) */
TEST(CliInterrupt, SecondCtrlCKills) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    std::string d = ft::tmpdir("cli_int_twice");
    {
        Forge f(d, {"train", bundled(), "--data", ft::src("tests/fixtures/train/zora_train.jsonl"), "--out", d + "/out", "--steps", "1000",
                    "--batch", "16", "--seq", "256"});
        ASSERT_TRUE(f.wait_for([&] { return f.stderr_text().find("forge train: ") != std::string::npos; })) << f.stderr_text();
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        f.interrupt();
        ASSERT_TRUE(f.wait_for([&] { return f.stderr_text().find("interrupted: finishing this step") != std::string::npos; }))
            << f.stderr_text();
        f.interrupt();
        EXPECT_EQ(f.wait_exit(), 1000 + SIGINT) << f.stderr_text(); /* killed by the signal, not saved */
        EXPECT_FALSE(ft::exists(d + "/out/adapter_model.safetensors"));
    }
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}
