// test_kernel_bench.cpp: device time of the matmul kernels on the prefill / batch shapes, for
// tuning on a GPU (disabled in the suite: lavapipe would take minutes and time nothing useful).
//   ./forge_tests --gtest_also_run_disabled_tests --gtest_filter='*KernelBench*'
// FT_BENCH_KERNELS names a file of lines "path.spv FMT TM TN" (FMT: f16, q4_0, q8_0) whose
// SPIR-V modules (the matmul interface) are timed beside the built-in kernels: kernel variants
// compiled with glslangValidator, compared without rebuilding the library.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "internal.h"
#include "util.h"

namespace {

struct Shape { uint32_t M, K, N; };
const Shape kShapes[] = {
    {512, 2048, 16384}, {512, 8192, 2048}, {512, 2048, 3072}, {512, 4096, 28672}, {512, 14336, 4096},
    {32, 2048, 16384}, {32, 8192, 2048}, {32, 2048, 128256},
};

int fmt_of(const std::string &s) { return s == "f16" ? FT_F16 : s == "q4_0" ? FT_Q4_0 : s == "q8_0" ? FT_Q8_0 : s == "f32" ? FT_F32 : -1; }

void report(ft_ctx *c, const char *what, const char *fmt, const Shape &s, forge_status st, double ms, float c00) {
    if (st) {
        printf("%-28s %-5s %5u x %5u x %6u: status %d: %s\n", what, fmt, s.M, s.K, s.N, (int)st, ft_errmsg(c));
        return;
    }
    double tflops = 2.0 * s.M * s.K * s.N / (ms * 1e-3) / 1e12;
    printf("%-28s %-5s %5u x %5u x %6u: %8.3f ms %7.1f TFLOP/s  C[0] %g\n", what, fmt, s.M, s.K, s.N, ms, tflops, c00);
}

TEST(KernelBench, DISABLED_Matmul) {
    char err[512];
    ft_ctx *c = ft_open(err, sizeof err);
    ASSERT_NE(c, nullptr) << err;
    struct Custom { std::string path; int fmt; std::string fmt_name; uint32_t tm, tn; std::vector<uint32_t> spv; };
    std::vector<Custom> customs;
    if (const char *list = getenv("FT_BENCH_KERNELS")) {
        std::ifstream in(list);
        std::string line;
        while (std::getline(in, line)) {
            std::istringstream ls(line);
            Custom k;
            if (!(ls >> k.path >> k.fmt_name >> k.tm >> k.tn)) continue;
            k.fmt = fmt_of(k.fmt_name);
            std::ifstream f(k.path, std::ios::binary);
            std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
            ASSERT_TRUE(k.fmt >= 0 && !bytes.empty() && bytes.size() % 4 == 0) << line;
            k.spv.resize(bytes.size() / 4);
            memcpy(k.spv.data(), bytes.data(), bytes.size());
            customs.push_back(k);
        }
    }
    const int reps = 20;
    for (const Shape &s : kShapes) {
        for (int fmt : {FT_F16, FT_Q4_0}) {
            const char *fname = fmt == FT_F16 ? "f16" : "q4_0";
            double ms = 0;
            float c00 = 0;
            struct { int kind; const char *name; uint32_t tm, tn; } kinds[] = {
                {2, "matmul_cm 128x128", 128, 128}, {3, "matmul_big 128x128", 128, 128}, {1, "matmul 64x64", 64, 64}, {4, "matmul_s 32x128", 32, 128}};
            for (auto &k : kinds) {
                if (k.kind == 4 && s.M > 32) continue;
                forge_status st = ft_time_matmul(c, k.kind, fmt, nullptr, 0, k.tm, k.tn, s.M, s.K, s.N, reps, &ms, &c00);
                report(c, k.name, fname, s, st, ms, c00);
            }
            for (const Custom &k : customs) {
                if (k.fmt != fmt) continue;
                forge_status st = ft_time_matmul(c, 0, fmt, k.spv.data(), k.spv.size() * 4, k.tm, k.tn, s.M, s.K, s.N, reps, &ms, &c00);
                std::string name = k.path.substr(k.path.find_last_of('/') + 1);
                report(c, name.c_str(), fname, s, st, ms, c00);
            }
        }
        fflush(stdout);
    }
    ft_close(c);
}

}  // namespace
