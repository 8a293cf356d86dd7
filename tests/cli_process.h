/* tests/cli_process.h: ./forge (the build tree's) run as a child process the test talks to:
 * stdin a pipe it writes lines to, stdout and stderr files it reads while the program runs,
 * signals (Ctrl-C) it sends; test_cli_interrupt.cpp and test_cli_chat.cpp use it. */
#ifndef FORGE_TESTS_CLI_PROCESS_H
#define FORGE_TESTS_CLI_PROCESS_H

#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "util.h"

namespace ft {

inline std::string file_text(const std::string &path) {
    std::vector<uint8_t> b = ft::read_file(path);
    return std::string(b.begin(), b.end());
}

/* ./forge ARGS with stdout and stderr to files in `dir` and stdin from a pipe (kept open: chat
 * reads it), or from the file `input` when one is named. */
struct Forge {
    pid_t pid = -1;  /* -1 once it has ended */
    int status = -1; /* then: its exit status, or 1000 + N when signal N killed it */
    int in = -1;     /* the write end of stdin */
    std::string out, err;

    Forge(const std::string &dir, const std::vector<std::string> &args, const std::string &input = "")
        : out(dir + "/stdout.txt"), err(dir + "/stderr.txt") {
        int p[2];
        if (pipe(p) != 0) return;
        signal(SIGPIPE, SIG_IGN); /* a write to a program that has ended fails, and the test says so */
        std::vector<char *> argv{(char *)"./forge"}; /* made before fork: the child only opens, dups and execs */
        for (const std::string &a : args) argv.push_back((char *)a.c_str());
        argv.push_back(nullptr);
        pid = fork();
        if (pid == 0) {
            if (input.empty()) dup2(p[0], 0);
            else dup2(open(input.c_str(), O_RDONLY), 0);
            close(p[0]);
            close(p[1]);
            int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            dup2(o, 1);
            dup2(e, 2);
            execv("./forge", argv.data());
            _exit(127);
        }
        EXPECT_GT(pid, 0) << "fork failed";
        close(p[0]);
        in = p[1];
    }
    ~Forge() {
        if (in >= 0) close(in);
        if (pid > 0 && waitpid(pid, nullptr, WNOHANG) == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
    }
    std::string stdout_text() const { return file_text(out); }
    std::string stderr_text() const { return file_text(err); }
    /* Closes stdin: the program reads its end. */
    void close_input() {
        if (in >= 0) close(in);
        in = -1;
    }
    void write_line(const std::string &line) const {
        std::string l = line + "\n";
        EXPECT_EQ(write(in, l.data(), l.size()), (ssize_t)l.size());
    }
    /* Whether it has ended (reaping it: `status`). */
    bool ended() {
        int st;
        if (pid > 0 && waitpid(pid, &st, WNOHANG) == pid) {
            pid = -1;
            status = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 1000 + WTERMSIG(st) : -1;
        }
        return pid <= 0;
    }
    /* Waits (up to `seconds`) until `ready` holds; false on a timeout or when the program ended first. */
    bool wait_for(const std::function<bool()> &ready, double seconds = 120) {
        auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        while (std::chrono::steady_clock::now() < end) {
            if (ready()) return true;
            if (ended()) return ready();
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return false;
    }
    /* The exit status once it ends (within `seconds`): 1000 + N when signal N killed it, -1 on a timeout. */
    int wait_exit(double seconds = 120) {
        auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        while (!ended() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        return pid > 0 ? -1 : status;
    }
    /* Sends SIGINT, as Ctrl-C on a terminal does (to this program only). */
    void interrupt() {
        if (ended()) {
            ADD_FAILURE() << "./forge ended before the Ctrl-C (status " << status << ")";
            return;
        }
        EXPECT_EQ(kill(pid, SIGINT), 0);
    }
};

} // namespace ft

#endif
