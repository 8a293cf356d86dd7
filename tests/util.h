/* util.h: helpers shared by the C++ tests. */
#ifndef FORGE_TESTS_UTIL_H
#define FORGE_TESTS_UTIL_H
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "forge.h"

#ifndef FORGE_SOURCE_DIR
#define FORGE_SOURCE_DIR "."
#endif

namespace ft {

/* The source tree: where the build was configured, or $FORGE_SOURCE_DIR (a copy run elsewhere). */
inline std::string src_dir() {
    const char *e = getenv("FORGE_SOURCE_DIR");
    return e && *e ? e : FORGE_SOURCE_DIR;
}
inline std::string src(const std::string &rel) { return src_dir() + "/" + rel; }
/* ../shared beside the checkout (CI puts it there). */
inline std::string shared(const std::string &rel) { return src_dir() + "/../shared/" + rel; }

/* A forge struct with its struct_size set (forge.h: "Structs grow at their end"), the rest zero. */
template <class T> T sized() {
    T t{};
    t.struct_size = sizeof(T);
    return t;
}

/* forge_model_memory of a loaded model (zero on failure, which the caller's checks then show). */
inline forge_memory_stats model_memory(const forge_model *m) {
    forge_memory_stats ms = sized<forge_memory_stats>();
    forge_model_memory(m, &ms);
    return ms;
}

inline bool exists(const std::string &p) {
    FILE *f = fopen(p.c_str(), "rb");
    if (f) fclose(f);
    return f != nullptr;
}

inline std::vector<uint8_t> read_file(const std::string &p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

inline std::vector<float> read_f32(const std::string &p) {
    std::vector<uint8_t> b = read_file(p);
    std::vector<float> v(b.size() / 4);
    if (!v.empty()) memcpy(v.data(), b.data(), v.size() * 4);
    return v;
}

inline void write_file(const std::string &p, const void *data, size_t n) {
    FILE *f = fopen(p.c_str(), "wb");
    ASSERT_NE(f, nullptr) << p;
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

/* A fresh directory under the build tree's tmp/. */
inline std::string tmpdir(const std::string &name) {
    std::string d = "tmp_" + name;
    std::string cmd = "rm -rf '" + d + "' && mkdir -p '" + d + "'";
    if (system(cmd.c_str()) != 0) ADD_FAILURE() << "cannot create " << d;
    return d;
}

/* max|a - b| / max|b| over the arrays: the parity metric. */
inline double rel_err(const float *a, const float *b, size_t n) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        md = std::fmax(md, std::fabs((double)a[i] - (double)b[i]));
        mb = std::fmax(mb, std::fabs((double)b[i]));
    }
    return mb > 0 ? md / mb : md;
}

inline int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

inline std::vector<float> randn(size_t n, float scale, uint32_t seed) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto &x : v) x = d(g);
    return v;
}

/* Loads a model with default params (plus limits); the test fails with forge's message.
 * exact: no fp16 tensor-core prefill, so that parity holds to f32 tolerances on every device. */
inline forge_model *load(const std::string &path, uint64_t max_range = 0, uint64_t max_alloc = 0, int exact = 1) {
    forge_model_params p = forge_model_default_params();
    p.max_storage_buffer_range = max_range;
    p.max_allocation_size = max_alloc;
    p.exact = exact;
    forge_model *m = nullptr;
    forge_status st = forge_model_load(path.c_str(), &p, &m);
    if (st != FORGE_OK) {
        ADD_FAILURE() << "loading " << path << ": " << forge_model_errmsg(m);
        forge_model_free(m);
        return nullptr;
    }
    return m;
}

/* A session on m with these params; the test fails with forge's message when it cannot be made. */
inline forge_session *session(forge_model *m, const forge_session_params &sp) {
    forge_session *s = nullptr;
    if (forge_session_create(m, &sp, &s) != FORGE_OK) {
        ADD_FAILURE() << "session (n_ctx " << sp.n_ctx << ", kv_type " << sp.kv_type << "): " << forge_model_errmsg(m);
        return nullptr;
    }
    return s;
}

/* A session on m with n_ctx positions (and n_batch, 0: the default). */
inline forge_session *session(forge_model *m, int n_ctx, int n_batch = 0) {
    forge_session_params sp = forge_session_default_params();
    sp.n_ctx = n_ctx;
    sp.n_batch = n_batch;
    return session(m, sp);
}

} // namespace ft
#endif
