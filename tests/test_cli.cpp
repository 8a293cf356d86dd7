// The CLI's conventions: forge help VERB and forge VERB --help print that command's usage
// (and the common options) on stdout with exit status 0; an unknown command is a usage error (2).
// Run from the build tree, where the forge binary is.
#include <gtest/gtest.h>
#include <sys/wait.h>

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

}  // namespace

TEST(Cli, HelpForEachCommand) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    for (const char *verb : {"run", "chat", "devices", "info", "discover", "logits", "keys", "classify", "bench", "tokenize", "bench-tokenize"}) {
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

/* a bad value names its parameter, alone (forge run -n -1 printed every range) */
TEST(Cli, BadValueNamesItsParameter) {
    ASSERT_TRUE(ft::exists("./forge")) << "run the tests from the build tree, where the forge binary is";
    Out o = forge_cli("run -n -1");
    EXPECT_NE(o.text.find("max_tokens -1 (must be >= 0)"), std::string::npos) << o.text;
    EXPECT_EQ(o.text.find("top_p"), std::string::npos) << o.text;
}
