// The CLI's conventions: forge help VERB and forge VERB --help print that command's usage
// (and the common options) on stdout with exit status 0; an unknown command is a usage error (2).
// Run from the build tree, where the forge binary is.
#include <cjson/cJSON.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "util.h"

namespace {

struct Out {
    int status;
    std::string text;
};

Out forge_cli(const std::string &args) {
    std::string d = ft::tmpdir("cli_help"), out = d + "/out.txt";
    int rc = system(("./forge " + args + " > " + out + " 2>&1").c_str());
    std::vector<uint8_t> t = ft::read_file(out);
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
    return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, std::string(t.begin(), t.end())};
}

/* Runs ./forge with stdout and stderr kept apart; `env` ("NAME=value ...") goes before it. */
struct Split {
    int status;
    std::string out, err;
};

Split forge_split(const std::string &args, const std::string &env = "") {
    std::string d = ft::tmpdir("cli_split"), out = d + "/out.txt", err = d + "/err.txt";
    int rc = system((env + " ./forge " + args + " > " + out + " 2> " + err + " < /dev/null").c_str());
    std::vector<uint8_t> o = ft::read_file(out), e = ft::read_file(err);
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
    return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, std::string(o.begin(), o.end()), std::string(e.begin(), e.end())};
}

/* Parses stdout as one JSON value (cJSON_Delete it); fails the test when it is not. */
cJSON *json_of(const Split &s) {
    EXPECT_EQ(s.status, 0) << s.err;
    cJSON *j = cJSON_Parse(s.out.c_str());
    EXPECT_NE(j, nullptr) << "not JSON: " << s.out;
    return j;
}

double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    EXPECT_TRUE(cJSON_IsNumber(v)) << key;
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

std::string str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    EXPECT_TRUE(cJSON_IsString(v)) << key;
    return cJSON_IsString(v) ? v->valuestring : "";
}

bool flag(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    EXPECT_TRUE(cJSON_IsBool(v)) << key;
    return cJSON_IsTrue(v);
}

std::string bundled() { return ft::src("models/stories260K/stories260K.gguf"); }

/* Runs ./forge ARGS with stderr on a pseudo-terminal (stdout to /dev/null): what the terminal showed. */
std::string forge_on_tty(const std::vector<std::string> &args) {
    int master = -1;
    pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0);
        dup2(null, 1);
        std::vector<char *> argv{(char *)"./forge"};
        for (const std::string &a : args) argv.push_back((char *)a.c_str());
        argv.push_back(nullptr);
        execv("./forge", argv.data());
        _exit(127);
    }
    EXPECT_GT(pid, 0) << "forkpty failed";
    if (pid <= 0) return "";
    std::string seen;
    char buf[4096];
    for (;;) {
        ssize_t n = read(master, buf, sizeof buf);
        if (n > 0) seen.append(buf, (size_t)n);
        else if (n < 0 && errno == EINTR) continue;
        else break; /* EIO: the child closed the terminal */
    }
    int st = 0;
    waitpid(pid, &st, 0);
    close(master);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << seen;
    return seen;
}

}  // namespace

TEST(Cli, HelpForEachCommand) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    for (const char *verb : {"run", "chat", "devices", "info", "discover", "logits", "keys", "classify", "embed", "rerank", "bench", "tokenize",
                             "bench-tokenize"}) {
        SCOPED_TRACE(verb);
        for (const std::string &args : {std::string("help ") + verb, std::string(verb) + " --help", std::string(verb) + " -h"}) {
            Out o = forge_cli(args);
            EXPECT_EQ(o.status, 0) << args << ": " << o.text;
            EXPECT_EQ(o.text.rfind(std::string("usage: forge ") + verb + " ", 0), 0u) << args << ": " << o.text;
            EXPECT_NE(o.text.find("options: --device"), std::string::npos) << o.text;
            EXPECT_NE(o.text.find("exit status: 0 done, 1 a runtime error"), std::string::npos) << o.text;
        }
    }
    /* only the command asked for: run's help has its two forms and no other command */
    Out run = forge_cli("run --help");
    EXPECT_NE(run.text.find("       forge run [MODEL] --batch-file FILE"), std::string::npos) << run.text;
    EXPECT_EQ(run.text.find("forge chat"), std::string::npos) << run.text;
    EXPECT_EQ(run.text.find("bench-tokenize"), std::string::npos) << run.text;
    /* bench's entry is not bench-tokenize's */
    EXPECT_EQ(forge_cli("help bench").text.find("bench-tokenize"), std::string::npos);
    /* train keeps its own option list */
    Out train = forge_cli("help train");
    EXPECT_EQ(train.status, 0);
    EXPECT_EQ(train.text.rfind("usage: forge train MODEL --data", 0), 0u) << train.text;
    EXPECT_EQ(forge_cli("train --help").text, train.text);
    /* a value that looks like the flag is the value */
    EXPECT_NE(forge_cli("run -p -h -n 2").text.rfind("usage:", 0), 0u);
    Out bad = forge_cli("help nosuch");
    EXPECT_EQ(bad.status, 2);
    EXPECT_NE(bad.text.find("unknown command 'nosuch'"), std::string::npos) << bad.text;
    EXPECT_EQ(forge_cli("nosuch --help").status, 2);
    EXPECT_EQ(forge_cli("help").status, 0);
}

/* -m MODEL / --model MODEL, as llama.cpp's tools spell it, is the same as the positional MODEL */
TEST(Cli, ModelFlagIsThePositionalModel) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    std::string model = ft::src("models/stories260K/stories260K.gguf");
    Out plain = forge_cli("run " + model + " -p 'Once upon' -n 6");
    ASSERT_EQ(plain.status, 0) << plain.text;
    EXPECT_EQ(forge_cli("run -m " + model + " -p 'Once upon' -n 6").text, plain.text);
    EXPECT_EQ(forge_cli("run -p 'Once upon' --model " + model + " -n 6").text, plain.text);
    Out info = forge_cli("info " + model);
    ASSERT_EQ(info.status, 0) << info.text;
    EXPECT_EQ(forge_cli("info -m " + model).text, info.text);
    /* a prompt that reads "-m" stays the prompt */
    Out p = forge_cli("run " + model + " -p -m -n 2");
    EXPECT_EQ(p.status, 0) << p.text;
    EXPECT_EQ(p.text.rfind("-m", 0), 0u) << p.text;
    EXPECT_EQ(forge_cli("info -m").status, 2);
}

/* a bad value is a usage error (exit 2) naming its flag alone (forge run -n -1 printed every
 * range; -n abc and --seed x were read as 0 and generated nothing) */
TEST(Cli, BadValueNamesItsParameter) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    const char *bad[][2] = {{"run -n -1", "-n: '-1'"},
                            {"run -n abc", "-n: 'abc'"},
                            {"run --temp -2", "--temp: '-2'"},
                            {"run --top-p 0", "--top-p: '0'"},
                            {"run --min-p 1.5", "--min-p: '1.5'"},
                            {"run --top-k 1.5", "--top-k: '1.5'"},
                            {"run --repeat-penalty 0", "--repeat-penalty: '0'"},
                            {"run --repeat-window -4", "--repeat-window: '-4'"},
                            {"run --seed x", "--seed: 'x'"},
                            {"run --keep -3", "--keep: '-3'"},
                            {"chat --temp nan", "--temp: 'nan'"},
                            {"run --kv f8", "--kv takes f16, f32 or q8_0, not 'f8'"}};
    for (auto &b : bad) {
        Out o = forge_cli(b[0]);
        EXPECT_EQ(o.status, 2) << b[0] << ": " << o.text;
        EXPECT_NE(o.text.find(b[1]), std::string::npos) << b[0] << ": " << o.text;
        EXPECT_EQ(o.text.find("top_p"), std::string::npos) << o.text;
    }
    EXPECT_EQ(forge_cli("run -n 3 --temp 0.7 --top-k 20 --top-p 0.9 --min-p 0.05 --repeat-penalty 1.1 --repeat-window 8 --seed 5").status, 0);
    EXPECT_EQ(forge_cli("run -n 3 --kv f16").status, 0);
}

/* --json: each verb's output parses, and its values are the library's (docs/json.md) */
TEST(Cli, JsonOutputs) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    const std::string model = bundled();
    forge_model *m = nullptr;
    ASSERT_EQ(forge_model_load(model.c_str(), nullptr, &m), FORGE_OK);
    forge_model_info in = ft::sized<forge_model_info>();
    forge_model_get_info(m, &in);

    /* devices: an array, each entry's index its position; the model's device is among them */
    cJSON *devs = json_of(forge_split("devices --json"));
    ASSERT_TRUE(cJSON_IsArray(devs));
    ASSERT_GE(cJSON_GetArraySize(devs), 1);
    bool found = false;
    for (int i = 0; i < cJSON_GetArraySize(devs); i++) {
        const cJSON *d = cJSON_GetArrayItem(devs, i);
        EXPECT_EQ(num(d, "index"), i);
        EXPECT_GT(num(d, "max_buffer_size"), 0);
        found |= str(d, "name") == in.device_name && str(d, "driver") == in.device_driver && flag(d, "usable");
    }
    EXPECT_TRUE(found) << "no usable device named " << in.device_name;
    cJSON_Delete(devs);

    /* info */
    cJSON *info = json_of(forge_split("info --json " + model));
    ASSERT_TRUE(cJSON_IsObject(info));
    EXPECT_EQ(str(info, "architecture"), in.architecture);
    EXPECT_EQ(str(info, "format"), "gguf");
    EXPECT_EQ(str(info, "weight_dtype"), in.weight_dtype);
    EXPECT_EQ(num(info, "n_layers"), in.n_layers);
    EXPECT_EQ(num(info, "hidden"), in.hidden);
    EXPECT_EQ(num(info, "n_kv_heads"), in.n_kv_heads);
    EXPECT_EQ(num(info, "n_vocab"), in.n_vocab);
    EXPECT_EQ(num(info, "n_params"), (double)in.n_params);
    EXPECT_EQ(num(info, "weight_bytes"), (double)in.weight_bytes);
    EXPECT_EQ(num(cJSON_GetObjectItem(info, "memory"), "device_planned_bytes"), (double)ft::model_memory(m).device_planned_bytes);
    const cJSON *sess = cJSON_GetObjectItem(info, "session");
    EXPECT_EQ(num(sess, "n_ctx"), 2048); /* n_ctx_train, under the 4096 default cap */
    EXPECT_GT(num(sess, "kv_cache_bytes"), 0);
    cJSON_Delete(info);

    /* run: the text is what the streaming run printed after the prompt */
    Split plain = forge_split("run " + model + " -p 'Once upon' -n 12");
    ASSERT_EQ(plain.status, 0) << plain.err;
    cJSON *run = json_of(forge_split("run " + model + " -p 'Once upon' -n 12 --json"));
    EXPECT_EQ(str(run, "prompt"), "Once upon");
    EXPECT_EQ("Once upon" + str(run, "text") + "\n", plain.out);
    EXPECT_EQ(str(run, "status"), "FORGE_OK");
    EXPECT_EQ(str(run, "stop_reason"), "max_tokens");
    EXPECT_EQ(num(run, "generated_tokens"), 12);
    EXPECT_EQ(num(run, "prompt_tokens"), 3); /* BOS, "Once", " upon" */
    EXPECT_GT(num(run, "decode_tok_s"), 0);
    cJSON_Delete(run);

    /* bench --profile: the whole run's kernel times, one prefill's, and the -n decode steps
     * after it: one attention a layer a step (the prompt's last token again, then n - 1), and
     * none of the prefill's matrix products */
    cJSON *bench = json_of(forge_split("bench " + model + " -p 16 -n 6 -r 1 --profile"));
    EXPECT_EQ(num(bench, "n_prompt"), 16);
    EXPECT_GT(num(bench, "prefill_tok_s"), 0);
    EXPECT_GT(num(bench, "decode_tok_s"), 0);
    const cJSON *prefill = cJSON_GetObjectItem(bench, "prefill_profile"), *decode = cJSON_GetObjectItem(bench, "decode_profile");
    ASSERT_TRUE(cJSON_IsObject(prefill) && cJSON_IsObject(decode));
    EXPECT_EQ(num(cJSON_GetObjectItem(prefill, "embed_f32"), "calls"), 1);
    EXPECT_EQ(num(cJSON_GetObjectItem(decode, "embed_f32"), "calls"), 6);
    EXPECT_EQ(num(cJSON_GetObjectItem(decode, "attention_decode"), "calls"), 6 * 5); /* (5 layers) */
    EXPECT_EQ(cJSON_GetObjectItem(decode, "matmul_f32"), nullptr);
    EXPECT_GT(num(cJSON_GetObjectItem(decode, "attention_decode"), "ms"), 0);
    cJSON_Delete(bench);

    /* tokenize: the library's ids; --decode --json: the text as a JSON string */
    int32_t ids[64];
    size_t n_ids = 0;
    const char *text = "Once upon a \"time\"\n";
    ASSERT_EQ(forge_tokenize(m, text, strlen(text), 0, ids, 64, &n_ids), FORGE_OK);
    cJSON *tok = json_of(forge_split("tokenize --json " + model + " 'Once upon a \"time\"\n'"));
    ASSERT_TRUE(cJSON_IsArray(tok));
    ASSERT_EQ((size_t)cJSON_GetArraySize(tok), n_ids);
    std::string id_list;
    for (size_t i = 0; i < n_ids; i++) {
        EXPECT_EQ(cJSON_GetArrayItem(tok, (int)i)->valueint, ids[i]) << i;
        id_list += (i ? " " : "") + std::to_string(ids[i]);
    }
    cJSON_Delete(tok);
    cJSON *dec = json_of(forge_split("tokenize " + model + " --decode --json '" + id_list + "'"));
    ASSERT_TRUE(cJSON_IsString(dec));
    EXPECT_STREQ(dec->valuestring, text);
    cJSON_Delete(dec);

    /* classify: --json is the same array; the id is the greedy next token of a plain run */
    Split cls = forge_split("classify " + model + " 'Once upon' --json");
    EXPECT_EQ(cls.out, forge_split("classify " + model + " 'Once upon'").out);
    cJSON *c = json_of(cls);
    ASSERT_EQ(cJSON_GetArraySize(c), 1);
    cJSON *run1 = json_of(forge_split("run " + model + " -p 'Once upon' -n 1 --json"));
    EXPECT_EQ(str(cJSON_GetArrayItem(c, 0), "text"), str(run1, "text")); /* greedy: the token run generates first */
    EXPECT_EQ(str(run1, "text"), " a");
    cJSON_Delete(run1);
    char piece[64];
    size_t piece_len = 0;
    int32_t id = (int32_t)num(cJSON_GetArrayItem(c, 0), "id");
    ASSERT_EQ(forge_detokenize(m, &id, 1, 0, piece, sizeof piece, &piece_len), FORGE_OK);
    EXPECT_EQ(std::string(piece, piece_len).find('a'), piece_len - 1) << std::string(piece, piece_len);
    cJSON_Delete(c);

    /* train: JSON lines, a step object each, then the done object */
    std::string d = ft::tmpdir("cli_json_train");
    Split tr = forge_split("train " + model + " --data " + ft::src("tests/fixtures/train/zora_train.jsonl") + " --out " + d +
                           "/out --steps 3 --batch 2 --seq 32 --json");
    ASSERT_EQ(tr.status, 0) << tr.err;
    std::vector<cJSON *> lines;
    for (size_t at = 0, nl; (nl = tr.out.find('\n', at)) != std::string::npos; at = nl + 1) {
        lines.push_back(cJSON_Parse(tr.out.substr(at, nl - at).c_str()));
        EXPECT_NE(lines.back(), nullptr) << tr.out.substr(at, nl - at);
    }
    ASSERT_EQ(lines.size(), 4u) << tr.out;
    for (int k = 0; k < 3; k++) {
        EXPECT_EQ(num(lines[k], "step"), k + 1);
        EXPECT_GT(num(lines[k], "loss"), 0);
        EXPECT_EQ(num(lines[k], "tokens"), 2 * 31); /* two sequences truncated to 32: 31 targets each */
    }
    EXPECT_TRUE(flag(lines[3], "done"));
    EXPECT_EQ(num(lines[3], "steps"), 3);
    EXPECT_EQ(str(lines[3], "out"), d + "/out");
    EXPECT_TRUE(ft::exists(d + "/out/adapter_model.safetensors"));
    for (cJSON *l : lines) cJSON_Delete(l);

    /* discover: the bundled model, loadable, with info's parameter count */
    cJSON *disc = json_of(forge_split("discover --json " + ft::src("models/stories260K")));
    ASSERT_TRUE(cJSON_IsArray(disc));
    ASSERT_EQ(cJSON_GetArraySize(disc), 1) << cJSON_Print(disc);
    const cJSON *dm = cJSON_GetArrayItem(disc, 0);
    EXPECT_EQ(str(dm, "path"), model);
    EXPECT_TRUE(flag(dm, "loadable"));
    EXPECT_EQ(num(dm, "n_params"), (double)in.n_params);
    EXPECT_EQ(str(dm, "status"), "FORGE_OK");
    cJSON_Delete(disc);
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
    forge_model_free(m);
}

/* FORGE_MODEL names the model when the command line does not; an explicit one wins */
TEST(Cli, ForgeModelEnvironment) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    const std::string model = bundled(), env = "FORGE_MODEL=" + model, missing = "FORGE_MODEL=/nonexistent/model.gguf";
    Split info = forge_split("info " + model);
    ASSERT_EQ(info.status, 0) << info.err;
    EXPECT_EQ(forge_split("info", env).out, info.out);
    /* the variable is used: a missing file fails, naming it (run would otherwise take the bundled model) */
    for (const char *args : {"info", "run -n 2", "tokenize hello", "chat"}) {
        Split s = forge_split(args, missing);
        EXPECT_EQ(s.status, 1) << args << ": " << s.err;
        EXPECT_NE(s.err.find("/nonexistent/model.gguf"), std::string::npos) << args << ": " << s.err;
    }
    /* an explicit model wins: positional or -m */
    EXPECT_EQ(forge_split("info " + model, missing).out, info.out);
    EXPECT_EQ(forge_split("info -m " + model, missing).out, info.out);
    Split run = forge_split("run " + model + " -p 'Once upon' -n 6");
    EXPECT_EQ(forge_split("run -p 'Once upon' -n 6", env).out, run.out);
    EXPECT_EQ(forge_split("run -p 'Once upon' -n 6 " + model, missing).out, run.out);
    /* tokenize: TEXT alone; classify: every argument a prompt, -m another model */
    EXPECT_EQ(forge_split("tokenize 'Once upon'", env).out, forge_split("tokenize " + model + " 'Once upon'").out);
    Split cls = forge_split("classify " + model + " 'Once upon' 'a little'");
    ASSERT_EQ(cls.status, 0) << cls.err;
    EXPECT_EQ(forge_split("classify 'Once upon' 'a little'", env).out, cls.out);
    EXPECT_EQ(forge_split("classify 'Once upon' -m " + model + " 'a little'", missing).out, cls.out);
    /* unset (or empty): no model is a usage error, as before */
    Split none = forge_split("info", "FORGE_MODEL=");
    EXPECT_EQ(none.status, 2);
    EXPECT_NE(none.err.find("FORGE_MODEL"), std::string::npos) << none.err;
}

/* The load progress bar: drawn on a terminal and erased, nothing at all when stderr is a file */
TEST(Cli, ProgressBarOnlyOnATerminal) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    const std::string model = bundled();
    Split quiet = forge_split("info " + model);
    ASSERT_EQ(quiet.status, 0);
    EXPECT_EQ(quiet.err, "");
    std::string tty = forge_on_tty({"info", model});
    EXPECT_NE(tty.find("\rloading ["), std::string::npos) << tty;
    EXPECT_NE(tty.find("%"), std::string::npos) << tty;
    /* the last thing on the terminal is the erased line: the output that follows starts clean */
    size_t last = tty.rfind("\r");
    ASSERT_NE(last, std::string::npos);
    size_t erase = tty.rfind("\r", last - 1);
    ASSERT_NE(erase, std::string::npos);
    EXPECT_EQ(tty.substr(erase + 1, last - erase - 1).find_first_not_of(' '), std::string::npos) << tty;

    /* forge train: the step bar on a terminal, the plain step lines in a file */
    std::string d = ft::tmpdir("cli_progress_train"), data = ft::src("tests/fixtures/train/zora_train.jsonl");
    std::string train = forge_on_tty({"train", model, "--data", data, "--out", d + "/a", "--steps", "2", "--batch", "2", "--seq", "32"});
    EXPECT_NE(train.find("\rstep 2/2 [##############################] 100%  loss "), std::string::npos) << train;
    Split file = forge_split("train " + model + " --data " + data + " --out " + d + "/b --steps 2 --batch 2 --seq 32");
    ASSERT_EQ(file.status, 0) << file.err;
    EXPECT_EQ(file.err.find('\r'), std::string::npos) << file.err;
    EXPECT_EQ(file.err.find("step 2/2 ["), std::string::npos) << file.err;
    EXPECT_NE(file.err.find("step 2/2: loss "), std::string::npos) << file.err;
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}

/* forge run's prewarm on a terminal: with Mesa's shader cache empty, lavapipe compiles for seconds
 * and the terminal shows "compiling kernels for llvmpipe (first run only)" with its bar, erased
 * before the story; stderr to a file shows nothing of it, cold as well. (A GPU driver compiles in
 * under half a second: there only the story is checked.) */
TEST(Cli, FirstRunSaysItCompilesOnlyOnATerminal) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    const std::string model = bundled();
    forge_model *m = ft::load(model);
    ASSERT_NE(m, nullptr);
    forge_model_info info = ft::sized<forge_model_info>();
    ASSERT_EQ(forge_model_get_info(m, &info), FORGE_OK);
    bool cpu = std::string(info.device_name).find("llvmpipe") != std::string::npos;
    forge_model_free(m);
    std::string d = ft::tmpdir("cli_first_run");
    const char *old = getenv("MESA_SHADER_CACHE_DIR"); /* forkpty's child inherits the environment */
    std::string saved = old ? old : "";
    setenv("MESA_SHADER_CACHE_DIR", (d + "/tty").c_str(), 1);
    std::string tty = forge_on_tty({"run", model, "-n", "8"});
    if (old) setenv("MESA_SHADER_CACHE_DIR", saved.c_str(), 1);
    else unsetenv("MESA_SHADER_CACHE_DIR");
    Split file = forge_split("run " + model + " -n 8", "MESA_SHADER_CACHE_DIR='" + d + "/file'");
    ASSERT_EQ(file.status, 0) << file.err;
    EXPECT_EQ(file.err.find("compiling"), std::string::npos) << file.err;
    EXPECT_EQ(file.out.rfind("Once upon a time", 0), 0u) << file.out;
    if (cpu) {
        EXPECT_NE(tty.find("\rcompiling kernels for llvmpipe (first run only) ["), std::string::npos) << tty;
        size_t bar = tty.rfind("compiling kernels for"), erased = tty.find("\r", bar); /* then blanks and \r */
        ASSERT_NE(erased, std::string::npos) << tty;
        size_t end = tty.find("\r", erased + 1);
        ASSERT_NE(end, std::string::npos) << tty;
        EXPECT_EQ(tty.substr(erased + 1, end - erased - 1).find_first_not_of(' '), std::string::npos) << tty;
    }
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}

/* Issue 42: every verb names an argument it does not take, then prints its own usage (forge help
 * VERB's text), not the whole command list; exit status 2. */
TEST(Cli, UnexpectedArgumentNamesItAndTheVerbsUsage) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    for (const char *verb : {"run", "chat", "devices", "info", "discover", "logits", "keys", "classify", "embed", "rerank", "bench", "train",
                             "tokenize", "bench-tokenize"}) {
        SCOPED_TRACE(verb);
        Split s = forge_split(std::string(verb) + " --bogus");
        EXPECT_EQ(s.status, 2) << s.err;
        EXPECT_EQ(s.out, "");
        EXPECT_EQ(s.err.rfind(std::string("forge ") + verb + ": unexpected argument '--bogus'\n", 0), 0u) << s.err;
        EXPECT_NE(s.err.find(std::string("\nusage: forge ") + verb + " "), std::string::npos) << s.err;
        EXPECT_EQ(s.err.find("usage: forge <command>"), std::string::npos) << s.err; /* not the global usage */
        /* the same usage as forge help VERB prints */
        Split help = forge_split(std::string("help ") + verb);
        EXPECT_EQ(s.err.substr(s.err.find('\n') + 1), help.out);
    }
    /* after a MODEL too, and for the options that used to print the global usage */
    const std::string model = bundled();
    for (const char *args : {"logits MODEL --tokens '1 2' --bogus", "keys MODEL --tokens '1 2' --bogus", "tokenize MODEL --bogus hello"}) {
        std::string a = args;
        a.replace(a.find("MODEL"), 5, model);
        Split s = forge_split(a);
        EXPECT_EQ(s.status, 2) << a;
        EXPECT_NE(s.err.find(": unexpected argument '--bogus'"), std::string::npos) << a << ": " << s.err;
        EXPECT_EQ(s.err.find("usage: forge <command>"), std::string::npos) << s.err;
    }
    /* logits and bench print JSON anyway: --json is taken, as classify takes it */
    Split lg = forge_split("logits " + model + " --tokens '1 2' --json");
    EXPECT_EQ(lg.status, 0) << lg.err;
    EXPECT_EQ(lg.out, forge_split("logits " + model + " --tokens '1 2'").out);
    /* what is missing is named, with the verb's usage */
    Split none = forge_split("logits " + model);
    EXPECT_EQ(none.status, 2);
    EXPECT_EQ(none.err.rfind("forge logits: --tokens \"1 2 3\" is required\nusage: forge logits ", 0), 0u) << none.err;
    Split tok = forge_split("tokenize " + model);
    EXPECT_EQ(tok.status, 2);
    EXPECT_EQ(tok.err.rfind("forge tokenize: no TEXT given (or --stdin-json)\nusage: forge tokenize ", 0), 0u) << tok.err;
    /* a TEXT may start with one dash */
    EXPECT_EQ(forge_split("tokenize " + model + " '-5 degrees'").status, 0);
}

/* Issue 42: messages that named no range or no reason */
TEST(Cli, ValueAndFileErrorsSayWhy) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    /* 3000000000 is an integer >= 0: the message names the range it is out of */
    Split n = forge_split("run -n 3000000000");
    EXPECT_EQ(n.status, 2);
    EXPECT_EQ(n.err, "forge run: -n: '3000000000' must be an integer in 0..2147483647\n");
    EXPECT_NE(forge_split("bench -r 0").err.find("-r: '0' must be an integer in 1..1000000"), std::string::npos);
    /* a file that cannot be read: the reason */
    Split nope = forge_split("run --batch-file nope.txt");
    EXPECT_EQ(nope.status, 2);
    EXPECT_EQ(nope.err, "forge run: --batch-file: cannot read 'nope.txt': No such file or directory\n");
    std::string d = ft::tmpdir("cli_why");
    Split dir = forge_split("run --batch-file " + d);
    EXPECT_EQ(dir.status, 2);
    EXPECT_NE(dir.err.find("cannot read '" + d + "': Is a directory"), std::string::npos) << dir.err;
    EXPECT_NE(forge_split("bench-tokenize " + bundled() + " nope.txt").err.find("cannot read 'nope.txt': No such file or directory"),
              std::string::npos);
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}

/* Issue 42: a prompt the context cannot hold is refused before anything is printed (a 100 kB
 * prompt was echoed in full, then refused) */
TEST(Cli, RefusedPromptIsNotEchoed) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    std::string prompt;
    while (prompt.size() < 100000) prompt += "Once upon a time ";
    Split s = forge_split("run " + bundled() + " -p '" + prompt + "' -n 3");
    EXPECT_EQ(s.status, 1) << s.err;
    EXPECT_EQ(s.out, "");
    EXPECT_NE(s.err.find("(FORGE_ERR_LIMIT)"), std::string::npos) << s.err;
    /* a prompt that fits is echoed as before, ahead of its continuation */
    Split ok = forge_split("run " + bundled() + " -p 'Once upon' -n 3");
    EXPECT_EQ(ok.status, 0) << ok.err;
    EXPECT_EQ(ok.out.rfind("Once upon ", 0), 0u) << ok.out;
    EXPECT_EQ(forge_split("run " + bundled() + " -p 'Once upon' -n 0").out, "Once upon\n");
}

/* Issue 42: classify sized its session to the longest prompt, past the model's context (a 30k-token
 * prompt ran 900 s on a 2048-token model); now that prompt is refused at once, naming it */
TEST(Cli, ClassifyRefusesAPromptLongerThanTheContext) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    const std::string model = bundled();
    Split info = forge_split("info --json " + model);
    cJSON *in = json_of(info);
    const int n_ctx_train = (int)num(in, "n_ctx_train");
    cJSON_Delete(in);
    ASSERT_EQ(n_ctx_train, 2048);
    std::string prompt;
    while (prompt.size() < 12000) prompt += "Once upon a time "; /* about 2800 tokens */
    Split s = forge_split("classify " + model + " 'Once upon' '" + prompt + "'");
    EXPECT_EQ(s.status, 1) << s.err;
    EXPECT_EQ(s.out, "");
    EXPECT_NE(s.err.find("prompt 1 has "), std::string::npos) << s.err;
    EXPECT_NE(s.err.find(" tokens, more than the model's context of 2048 (n_ctx_train) (FORGE_ERR_LIMIT)"), std::string::npos) << s.err;
    /* --ctx: its context is the limit */
    Split c = forge_split("classify " + model + " --ctx 4 'Once upon a time there' 'Once'");
    EXPECT_EQ(c.status, 1);
    EXPECT_NE(c.err.find("prompt 0 has 6 tokens, more than the session's context of 4 (n_ctx) (FORGE_ERR_LIMIT)"), std::string::npos) << c.err;
    EXPECT_EQ(forge_split("classify " + model + " --ctx 8 'Once upon a time there' 'Once'").status, 0);
}

/* Issue 42: the help says what a new user asked */
TEST(Cli, HelpTextsSayTheDefaults) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    for (const char *verb : {"run", "chat", "classify"})
        EXPECT_NE(forge_cli(std::string("help ") + verb).text.find("--seed is fixed, 0"), std::string::npos) << verb;
    std::string bench = forge_cli("bench --help").text;
    EXPECT_NE(bench.find("[--profile]"), std::string::npos) << bench;
    /* --json's schemas moved from the README to docs/json.md */
    for (const char *args : {"help", "train --help"}) {
        std::string h = forge_cli(args).text;
        EXPECT_NE(h.find("(docs/json.md)"), std::string::npos) << args;
        EXPECT_EQ(h.find("README"), std::string::npos) << args;
    }
}

namespace {

/* A parity fixture's first sequence and HF's greedy continuation of it (reference.json "generate",
 * transformers' generate on the same checkpoint). */
struct Greedy {
    std::vector<int> prompt, next;
};

Greedy hf_greedy(const std::string &fixture) {
    std::vector<uint8_t> b = ft::read_file(ft::src("tests/fixtures/parity/" + fixture + "/reference.json"));
    cJSON *r = cJSON_ParseWithLength((const char *)b.data(), b.size());
    const cJSON *seq = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "sequences"), 0), *gen = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "generate"), 0);
    Greedy g;
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(seq, "tokens")) g.prompt.push_back(t->valueint);
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(gen, "new_tokens")) g.next.push_back(t->valueint);
    EXPECT_EQ((double)g.prompt.size(), num(gen, "prompt_tokens")) << fixture;
    EXPECT_FALSE(g.next.empty()) << fixture;
    cJSON_Delete(r);
    return g;
}

std::string joined(const std::vector<int> &v, size_t from = 0, const char *sep = " ") {
    std::string s;
    for (size_t i = from; i < v.size(); i++) s += (i > from ? sep : "") + std::to_string(v[i]);
    return s;
}

/* o[key] as ints; a missing key or a non-array fails the test. */
std::vector<int> ints(const cJSON *o, const char *key) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key), *t;
    EXPECT_TRUE(cJSON_IsArray(a)) << key;
    std::vector<int> v;
    cJSON_ArrayForEach(t, a) v.push_back(cJSON_IsNumber(t) ? t->valueint : -1);
    return v;
}

bool is_null(const cJSON *o, const char *key) { return cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, key)); }

} // namespace

/* Issue 36: forge run --tokens on checkpoints without a tokenizer (the parity fixtures): the ids
 * generated are HF's greedy ones, printed as ids (a line of them; --json: "ids", with "prompt" and
 * "text" null), and a saved state continues them (--load-state alone, or with more --tokens) */
TEST(Cli, RunTokensWithoutATokenizerGivesHfGreedyIds) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    std::string d = ft::tmpdir("cli_run_tokens");
    for (const char *fixture : {"qwen3_5_text_f32", "qwen3_5_moe_f32", "mistral_window_f32", "mistral_v03_bf16"}) {
        SCOPED_TRACE(fixture);
        const std::string model = ft::src(std::string("tests/fixtures/parity/") + fixture);
        Greedy g = hf_greedy(fixture);
        const int n = (int)g.next.size();
        Split js = forge_split("run " + model + " --tokens '" + joined(g.prompt) + "' -n " + std::to_string(n) + " --json");
        cJSON *j = json_of(js);
        EXPECT_EQ(ints(j, "ids"), g.next);
        EXPECT_EQ(ints(j, "prompt_ids"), g.prompt);
        EXPECT_TRUE(is_null(j, "prompt"));
        EXPECT_TRUE(is_null(j, "text"));
        EXPECT_EQ(num(j, "prompt_tokens"), (double)g.prompt.size());
        EXPECT_EQ(num(j, "generated_tokens"), n);
        EXPECT_EQ(str(j, "stop_reason"), "max_tokens");
        cJSON_Delete(j);
        /* as text: the prompt's ids, then the generated ones, on one line; stderr says why */
        Split tx = forge_split("run " + model + " --tokens '" + joined(g.prompt, 0, ",") + "' -n " + std::to_string(n));
        EXPECT_EQ(tx.status, 0) << tx.err;
        EXPECT_EQ(tx.out, joined(g.prompt) + " " + joined(g.next) + "\n");
        EXPECT_NE(tx.err.find(" has no tokenizer: the prompt and the generated tokens are printed as ids"), std::string::npos) << tx.err;
        /* a state saved after 3 tokens goes on with the rest, alone or after the 4th given as --tokens */
        std::string state = d + "/" + fixture + ".state";
        Split first = forge_split("run " + model + " --tokens '" + joined(g.prompt) + "' -n 3 --save-state " + state);
        ASSERT_EQ(first.status, 0) << first.err;
        cJSON *rest = json_of(forge_split("run " + model + " --load-state " + state + " -n " + std::to_string(n - 3) + " --json"));
        EXPECT_EQ(ints(rest, "ids"), std::vector<int>(g.next.begin() + 3, g.next.end()));
        EXPECT_EQ(num(rest, "prompt_tokens"), (double)g.prompt.size() + 3);
        cJSON_Delete(rest);
        cJSON *more = json_of(forge_split("run " + model + " --load-state " + state + " --tokens " + std::to_string(g.next[3]) + " -n " +
                                          std::to_string(n - 4) + " --json"));
        EXPECT_EQ(ints(more, "ids"), std::vector<int>(g.next.begin() + 4, g.next.end()));
        EXPECT_EQ(ints(more, "prompt_ids"), std::vector<int>{g.next[3]});
        EXPECT_EQ(num(more, "cached_tokens"), (double)g.prompt.size() + 3); /* the saved tokens, restored */
        cJSON_Delete(more);
    }
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}

/* --tokens on a model with a tokenizer: the ids of a text prompt give that prompt's run, and
 * "ids" are the tokens of "text" */
TEST(Cli, RunTokensIsTheTextPromptsRun) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    const std::string model = bundled();
    cJSON *tok = json_of(forge_split("tokenize --special " + model + " 'Once upon'"));
    std::vector<int> prompt;
    for (const cJSON *t = tok ? tok->child : nullptr; t; t = t->next) prompt.push_back(t->valueint);
    cJSON_Delete(tok);
    ASSERT_EQ(prompt.size(), 3u); /* BOS, "Once", " upon" */
    cJSON *text = json_of(forge_split("run " + model + " -p 'Once upon' -n 12 --json"));
    cJSON *ids = json_of(forge_split("run " + model + " --tokens '" + joined(prompt) + "' -n 12 --json"));
    std::vector<int> gen = ints(text, "ids");
    EXPECT_EQ(gen.size(), 12u);
    EXPECT_EQ(num(text, "generated_tokens"), 12);
    EXPECT_EQ(ints(ids, "ids"), gen);
    EXPECT_EQ(str(ids, "text"), str(text, "text"));
    EXPECT_EQ(ints(ids, "prompt_ids"), prompt);
    EXPECT_EQ(cJSON_GetObjectItem(text, "prompt_ids"), nullptr); /* a text prompt: its text only */
    /* "prompt" is the ids' text, special tokens included (as forge tokenize --decode gives it) */
    std::string decoded_prompt = forge_split("tokenize " + model + " --decode '" + joined(prompt) + "'").out;
    ASSERT_FALSE(decoded_prompt.empty());
    decoded_prompt.pop_back(); /* its newline */
    EXPECT_EQ(str(ids, "prompt"), decoded_prompt);
    /* the ids are the text's tokens: prompt + ids decode to the prompt's text and the text */
    std::vector<int> all = prompt;
    all.insert(all.end(), gen.begin(), gen.end());
    EXPECT_EQ(forge_split("tokenize " + model + " --decode '" + joined(all) + "'").out, decoded_prompt + str(text, "text") + "\n");
    /* streamed: the prompt's text, then the continuation */
    Split plain = forge_split("run " + model + " --tokens '" + joined(prompt, 0, ",") + "' -n 12");
    EXPECT_EQ(plain.status, 0) << plain.err;
    EXPECT_EQ(plain.out, decoded_prompt + str(text, "text") + "\n");
    EXPECT_EQ(plain.err, "");
    cJSON_Delete(text);
    cJSON_Delete(ids);
}

/* --draft: a second model drafts, and the text is the plain run's; --lookup N, and its refusals */
TEST(Cli, RunDraftModelGivesThePlainText) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    const std::string model = bundled(), other = ft::src("tests/fixtures/parity/qwen3_f32_sharded");
    cJSON *plain = json_of(forge_split("run " + model + " -p 'Once upon a time' -n 48 --json"));
    cJSON *drafted = json_of(forge_split("run " + model + " -p 'Once upon a time' -n 48 --json --draft " + model + " --lookup 6"));
    ASSERT_TRUE(plain && drafted);
    EXPECT_EQ(str(drafted, "text"), str(plain, "text"));
    EXPECT_EQ(ints(drafted, "ids"), ints(plain, "ids"));
    EXPECT_GT(num(drafted, "draft_accepted"), 0);
    EXPECT_GE(num(drafted, "draft_tokens"), num(drafted, "draft_accepted"));
    EXPECT_EQ(cJSON_GetObjectItem(plain, "draft_tokens"), nullptr);
    cJSON_Delete(plain);
    cJSON_Delete(drafted);
    Split bad = forge_split("run " + model + " -p Once -n 4 --draft " + other);
    EXPECT_EQ(bad.status, 1);
    EXPECT_NE(bad.err.find("forge: generate params: the draft model's vocabulary has 256 tokens; this model's has 512"), std::string::npos)
        << bad.err;
    std::string d = ft::tmpdir("cli_draft"), lines = d + "/prompts.txt";
    ft::write_file(lines, "Once\n", 5);
    Split batch = forge_split("run " + model + " --batch-file " + lines + " --draft " + model);
    EXPECT_EQ(batch.status, 2);
    EXPECT_EQ(batch.err.rfind("forge run: --draft goes without --batch-file (batch generation drafts nothing)\n", 0), 0u) << batch.err;
    Split missing = forge_split("run " + model + " --draft /nonexistent/model -n 4");
    EXPECT_EQ(missing.status, 1);
    EXPECT_NE(missing.err.find("/nonexistent/model"), std::string::npos) << missing.err;
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}

TEST(Cli, RunTokensErrorsSayWhat) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    const std::string model = bundled(), none = ft::src("tests/fixtures/parity/qwen3_5_text_f32");
    std::string d = ft::tmpdir("cli_tokens_errors"), lines = d + "/prompts.txt";
    ft::write_file(lines, "Once\n", 5);
    const std::string bad[][2] = {
        {"run " + model + " --tokens '1 2' -p hi", "forge run: -p and --tokens both give the prompt: give one of them\nusage: forge run "},
        {"run " + model + " --batch-file " + lines + " --tokens 1", "forge run: --batch-file's lines are the prompts: no -p or --tokens with it\n"},
        {"run " + model + " --tokens ''", "forge run: --tokens is empty\n"},
        {"run " + model + " --tokens '1 x'", "forge run: --tokens: '1 x' is not a list of token ids (integers >= 0, separated by spaces or commas)\n"},
        {"run " + model + " --tokens '1 -2'", "forge run: --tokens: '1 -2' is not a list of token ids"},
        {"run " + model + " --tokens 1,3000000000", "forge run: --tokens: '1,3000000000' is not a list of token ids"},
        {"run " + model + " --tokens '1 512'", "forge run: --tokens: 512 is not a token id of " + model + " (its vocabulary is 0..511)\n"},
        {"logits " + model + " --tokens '1 x'", "forge logits: --tokens: '1 x' is not a list of token ids"},
        /* a model without a tokenizer has no text: a text prompt (or none) and --stop are refused */
        {"run " + none + " -p hi", "forge run: " + none + " has no tokenizer, so there is no text prompt: give the prompt as token ids (--tokens \"1 2 3\")\n"},
        {"run " + none, "forge run: " + none + " has no tokenizer, so there is no text prompt"},
        {"run " + none + " --tokens 5 --stop x", "forge run: " + none + " has no tokenizer, so no text to find a --stop string in\n"},
    };
    for (const auto &b : bad) {
        Split s = forge_split(b[0]);
        EXPECT_EQ(s.status, 2) << b[0] << ": " << s.err;
        EXPECT_EQ(s.out, "") << b[0];
        EXPECT_EQ(s.err.rfind(b[1], 0), 0u) << b[0] << ": " << s.err;
    }
    EXPECT_EQ(system(("rm -rf '" + d + "'").c_str()), 0);
}

/* Issue 42: a flag given last, without its value, is named as such (it was an "unexpected
 * argument"), for the verbs' own flags and the shared ones; a flag the verb does not take stays
 * unexpected */
TEST(Cli, FlagWithoutItsValueSaysSo) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    const std::string model = bundled();
    const char *flags[][2] = {{"run", "-p"},           {"run", "--tokens"},    {"run", "--save-state"},  {"run", "--parallel"},
                              {"run", "-n"},           {"run", "--stop"},      {"run", "--ctx-overflow"}, {"run", "--keep"},
                              {"run", "--ctx"},        {"run", "--adapter"},   {"run", "--device"},      {"chat", "--system"},
                              {"chat", "--temp"},      {"info", "--kv"},       {"discover", "--depth"},  {"logits", "--tokens"},
                              {"keys", "--layer"},     {"classify", "--top-k"}, {"bench", "-r"},          {"bench", "--targets"},
                              {"bench-tokenize", "-r"}, {"train", "--device"}, {"train", "--steps"}, {"embed", "--dim"},
                              {"embed", "--prompt"},   {"rerank", "--query"},  {"rerank", "--instruction"}};
    for (auto &f : flags) {
        Split s = forge_split(std::string(f[0]) + " " + model + " " + f[1]);
        EXPECT_EQ(s.status, 2) << f[0] << " " << f[1] << ": " << s.err;
        EXPECT_EQ(s.err.rfind(std::string("forge ") + f[0] + ": " + f[1] + " needs a value\n", 0), 0u) << f[0] << " " << f[1] << ": " << s.err;
    }
    /* followed by the verb's usage, as an unexpected argument is */
    Split p = forge_split("run -p");
    EXPECT_EQ(p.err.substr(p.err.find('\n') + 1), forge_split("help run").out);
    for (const char *args : {"devices --ctx", "info --adapter", "tokenize --depth"}) {
        Split s = forge_split(args);
        EXPECT_EQ(s.status, 2) << args;
        EXPECT_NE(s.err.find(": unexpected argument '"), std::string::npos) << args << ": " << s.err;
    }
}

/* forge info on Qwen 3.5 (linear-attention layers, as reference.json's layer_types count them)
 * and Mistral with a window: the layer kinds and the recurrent state beside the KV cache, the
 * library's forge_session_plan numbers */
TEST(Cli, InfoTellsLayerKindsAndRecurrentState) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    struct Want { std::string model, fixture; };
    const std::string P = ft::src("tests/fixtures/parity/");
    const Want wants[] = {{P + "qwen3_5_text_f32", "qwen3_5_text_f32"}, {P + "qwen3_5_moe_f32", "qwen3_5_moe_f32"},
                          {ft::src("tests/fixtures/gguf/qwen3_5_text_f32.gguf"), "qwen3_5_text_f32"},
                          {P + "mistral_window_f32", "mistral_window_f32"}, {bundled(), ""}};
    for (const Want &w : wants) {
        SCOPED_TRACE(w.model);
        int n_linear = 0, n_layers = 0;
        if (!w.fixture.empty()) {
            std::vector<uint8_t> b = ft::read_file(P + w.fixture + "/reference.json");
            cJSON *r = cJSON_ParseWithLength((const char *)b.data(), b.size());
            const cJSON *t;
            cJSON_ArrayForEach(t, cJSON_GetObjectItem(r, "layer_types")) n_linear += std::string(t->valuestring) == "linear_attention";
            cJSON_Delete(r);
        }
        forge_model *m = nullptr;
        ASSERT_EQ(forge_model_load(w.model.c_str(), nullptr, &m), FORGE_OK) << forge_model_errmsg(m);
        forge_model_info in = ft::sized<forge_model_info>();
        forge_model_get_info(m, &in);
        n_layers = in.n_layers;
        forge_memory_stats plan = ft::sized<forge_memory_stats>();
        ASSERT_EQ(forge_session_plan(m, nullptr, &plan), FORGE_OK);
        forge_model_free(m);
        EXPECT_EQ(plan.state_bytes > 0, n_linear > 0);

        cJSON *j = json_of(forge_split("info --json " + w.model));
        EXPECT_EQ(num(j, "n_linear_layers"), n_linear);
        const cJSON *sess = cJSON_GetObjectItem(j, "session");
        EXPECT_EQ(num(sess, "state_bytes"), (double)plan.state_bytes);
        EXPECT_EQ(num(sess, "kv_cache_bytes"), (double)plan.kv_cache_bytes);
        cJSON_Delete(j);

        Split text = forge_split("info " + w.model);
        ASSERT_EQ(text.status, 0) << text.err;
        std::string layers = "\nlayers           " + std::to_string(n_layers);
        if (n_linear)
            layers += " (" + std::to_string(n_linear) + " linear-attention, " + std::to_string(n_layers - n_linear) + " full-attention)";
        else if (in.n_sliding_layers)
            layers += " (" + std::to_string(in.n_sliding_layers) + " sliding-window" +
                      (in.n_sliding_layers < n_layers ? ", " + std::to_string(n_layers - in.n_sliding_layers) + " full-attention)" : ")");
        EXPECT_NE(text.out.find(layers + "\n"), std::string::npos) << text.out;
        std::string state = "    of which recurrent state   " + std::to_string(plan.state_bytes) + " bytes";
        EXPECT_EQ(text.out.find(state) != std::string::npos, n_linear > 0) << text.out;
        if (n_linear) {
            EXPECT_NE(text.out.find("    recurrent state            " + std::to_string(n_linear) + " linear-attention layers"), std::string::npos)
                << text.out;
        }
    }
}
