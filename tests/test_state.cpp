/* State files: forge_session_save / forge_session_load. A session saved after prefill and some
 * decoding and loaded into a new session (other n_batch, so other ring sizes for sliding-window
 * layers) goes on with logits bit-equal to the uninterrupted run, on stories260K and on the
 * Gemma 2 fixture past its window; the prompt cache comes back with it. Files of another
 * model, too long for the session, truncated, with flipped header bytes, missing tensors or
 * wrong shapes fail with errors naming the cause and leave the session as it was; a failed
 * save leaves no partial file and the old file whole. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <sys/stat.h>

#include "internal.h"
#include "util.h"

namespace {

std::string stories_path() { return ft::src("models/stories260K/stories260K.gguf"); }
std::string gemma2_path() { return ft::src("tests/fixtures/parity/gemma2_f32"); }

std::string errmsg(forge_session *s) { return forge_session_errmsg(s); }

/* Evaluates tokens one position at a time from the session's n_past (a decode step each),
 * returning the logits of every step. */
std::vector<float> decode(forge_session *s, const std::vector<int32_t> &toks, int V) {
    std::vector<float> out(toks.size() * (size_t)V);
    for (size_t i = 0; i < toks.size(); i++) {
        forge_status st = forge_eval(s, &toks[i], 1, 0, out.data() + i * V, (size_t)V);
        EXPECT_EQ(st, FORGE_OK) << errmsg(s);
        if (st) break;
    }
    return out;
}

std::vector<int32_t> seq(int n, int V, int mul = 37, int add = 11) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; i++) v.push_back((i * mul + add) % V);
    return v;
}

std::vector<int32_t> tokens_of(forge_session *s) {
    size_t n = 0;
    forge_session_tokens(s, nullptr, 0, &n);
    std::vector<int32_t> t(n);
    EXPECT_EQ(forge_session_tokens(s, t.data(), t.size(), &n), FORGE_OK);
    return t;
}

bool bit_equal(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

/* A state file's header JSON, edited, written back with the data unchanged. */
std::vector<uint8_t> edit_header(const std::vector<uint8_t> &file, void (*edit)(cJSON *)) {
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | file[i];
    cJSON *h = cJSON_ParseWithLength((const char *)file.data() + 8, hl);
    edit(h);
    char *js = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    std::string j = js;
    cJSON_free(js);
    while (j.size() % 8) j += ' ';
    std::vector<uint8_t> out(8);
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)((uint64_t)j.size() >> (8 * i));
    out.insert(out.end(), j.begin(), j.end());
    out.insert(out.end(), file.begin() + 8 + hl, file.end());
    return out;
}

uint64_t header_len(const std::vector<uint8_t> &file) {
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | file[i];
    return hl;
}

/* Files in dir whose names contain `part`. */
int count_files(const std::string &dir, const std::string &part) {
    int n = 0;
    DIR *d = opendir(dir.c_str());
    if (!d) return -1;
    while (struct dirent *e = readdir(d))
        if (std::string(e->d_name).find(part) != std::string::npos) n++;
    closedir(d);
    return n;
}

/* A model with a state saved from it: prompt, some decoding, saved to dir/state. */
struct Saved {
    forge_model *m = nullptr;
    forge_session *s = nullptr;
    std::string dir, file;
    int V = 0;
    Saved(const std::string &path, const std::string &name, int n_ctx, int n_batch, int n_prompt, int n_decode) {
        m = ft::load(path);
        if (!m) return;
        V = forge_model_n_vocab(m);
        s = ft::session(m, n_ctx, n_batch);
        if (!s) return;
        dir = ft::tmpdir(name);
        file = dir + "/state.safetensors";
        std::vector<int32_t> p = seq(n_prompt, V);
        EXPECT_EQ(forge_eval(s, p.data(), n_prompt, 0, nullptr, 0), FORGE_OK) << errmsg(s);
        decode(s, seq(n_decode, V, 13, 5), V);
        EXPECT_EQ(forge_session_save(s, file.c_str()), FORGE_OK) << errmsg(s);
    }
    ~Saved() {
        forge_session_free(s);
        forge_model_free(m);
    }
};

} // namespace

/* stories260K: prompt + decode, save, load into a fresh session and into a used one with
 * another n_batch: the next steps' logits equal the uninterrupted session's bit for bit, and
 * the token history (the prompt cache) comes back. */
TEST(State, StoriesContinuesBitExact) {
    Saved a(stories_path(), "state_stories", 256, 0, 40, 8);
    ASSERT_TRUE(a.m && a.s);
    std::vector<int32_t> hist = tokens_of(a.s);
    ASSERT_EQ((int)hist.size(), 48);
    forge_session *fresh = ft::session(a.m, 256, 16), *used = ft::session(a.m, 128, 0);
    ASSERT_TRUE(fresh && used);
    std::vector<int32_t> other = seq(70, a.V, 5, 3);
    ASSERT_EQ(forge_eval(used, other.data(), 70, 0, nullptr, 0), FORGE_OK);
    ASSERT_EQ(forge_session_load(fresh, a.file.c_str()), FORGE_OK) << errmsg(fresh);
    ASSERT_EQ(forge_session_load(used, a.file.c_str()), FORGE_OK) << errmsg(used);
    EXPECT_EQ(forge_session_n_past(fresh), 48);
    EXPECT_EQ(tokens_of(fresh), hist);
    EXPECT_EQ(tokens_of(used), hist);
    std::vector<int32_t> next = seq(12, a.V, 29, 7);
    std::vector<float> la = decode(a.s, next, a.V), lb = decode(fresh, next, a.V), lc = decode(used, next, a.V);
    EXPECT_TRUE(bit_equal(la, lb));
    EXPECT_TRUE(bit_equal(la, lc));
    /* a prefill chunk after the load, too */
    std::vector<float> pa(a.V), pb(a.V);
    std::vector<int32_t> chunk = seq(12, a.V, 3, 1); /* one step in both sessions (n_batch 16 and 512) */
    ASSERT_EQ(forge_eval(a.s, chunk.data(), 12, 0, pa.data(), pa.size()), FORGE_OK);
    ASSERT_EQ(forge_eval(fresh, chunk.data(), 12, 0, pb.data(), pb.size()), FORGE_OK);
    EXPECT_TRUE(bit_equal(pa, pb));
    /* the prompt cache: generating from the saved tokens plus more reuses them */
    std::vector<int32_t> prompt = hist;
    prompt.push_back(42);
    forge_generate_params gp = forge_generate_default_params();
    gp.max_tokens = 4;
    forge_metrics mt = ft::sized<forge_metrics>();
    ASSERT_EQ(forge_session_load(fresh, a.file.c_str()), FORGE_OK);
    ASSERT_EQ(forge_generate_tokens(fresh, prompt.data(), (int)prompt.size(), &gp, &mt), FORGE_OK);
    EXPECT_EQ(mt.cached_tokens, 48);
    forge_session_free(fresh);
    forge_session_free(used);
}

/* Generation after a load gives the uninterrupted run's tokens (greedy and seeded). */
TEST(State, GenerateAfterLoadMatchesUninterrupted) {
    forge_model *m = ft::load(stories_path());
    ASSERT_NE(m, nullptr);
    std::string d = ft::tmpdir("state_generate");
    forge_session *a = ft::session(m, 256), *b = ft::session(m, 256);
    ASSERT_TRUE(a && b);
    const char *story = "Once upon a time, there was a little girl named Lily.";
    forge_generate_params gp = forge_generate_default_params();
    gp.max_tokens = 10;
    ASSERT_EQ(forge_generate(a, story, strlen(story), &gp, nullptr), FORGE_OK);
    ASSERT_EQ(forge_session_save(a, (d + "/s").c_str()), FORGE_OK) << errmsg(a);
    ASSERT_EQ(forge_session_load(b, (d + "/s").c_str()), FORGE_OK) << errmsg(b);
    std::vector<int32_t> cont = tokens_of(a);
    for (int32_t t : {10, 20, 30}) cont.push_back(t);
    for (float temp : {0.0f, 0.9f}) {
        struct C {
            std::vector<int32_t> t;
            static int cb(void *u, int32_t tok, const char *, size_t) {
                if (tok >= 0) ((C *)u)->t.push_back(tok);
                return 0;
            }
        } ca, cb;
        gp.temperature = temp;
        gp.seed = 7;
        gp.max_tokens = 16;
        gp.on_token = C::cb;
        forge_metrics ma = ft::sized<forge_metrics>(), mb = ft::sized<forge_metrics>();
        gp.user_data = &ca;
        ASSERT_EQ(forge_generate_tokens(a, cont.data(), (int)cont.size(), &gp, &ma), FORGE_OK);
        gp.user_data = &cb;
        ASSERT_EQ(forge_generate_tokens(b, cont.data(), (int)cont.size(), &gp, &mb), FORGE_OK);
        EXPECT_EQ(ca.t, cb.t) << "temperature " << temp;
        EXPECT_EQ(ma.cached_tokens, mb.cached_tokens);
        ASSERT_EQ(forge_session_load(b, (d + "/s").c_str()), FORGE_OK);
        ASSERT_EQ(forge_session_load(a, (d + "/s").c_str()), FORGE_OK);
    }
    forge_session_free(a);
    forge_session_free(b);
    forge_model_free(m);
}

/* Gemma 2 (sliding window 8 on every other layer), 35 tokens: the rings have wrapped. Loaded
 * into sessions whose rings are larger (n_batch 8: 15 slots), smaller (n_batch 2: 9) and
 * not rotating (n_ctx 40 <= 8 + 64 - 1), the next steps give the uninterrupted logits. */
TEST(State, SlidingWindowRingsContinueBitExact) {
    Saved a(gemma2_path(), "state_gemma2", 64, 4, 30, 5);
    ASSERT_TRUE(a.m && a.s);
    forge_session *big = ft::session(a.m, 64, 8), *small = ft::session(a.m, 64, 2), *flat = ft::session(a.m, 40, 64);
    ASSERT_TRUE(big && small && flat);
    for (forge_session *s : {big, small, flat}) ASSERT_EQ(forge_session_load(s, a.file.c_str()), FORGE_OK) << errmsg(s);
    std::vector<int32_t> next = seq(5, a.V, 19, 3);
    std::vector<float> la = decode(a.s, next, a.V);
    EXPECT_TRUE(bit_equal(la, decode(big, next, a.V)));
    EXPECT_TRUE(bit_equal(la, decode(small, next, a.V)));
    EXPECT_TRUE(bit_equal(la, decode(flat, next, a.V)));
    for (forge_session *s : {big, small, flat}) forge_session_free(s);
}

/* Qwen 3.5 (linear, linear, linear, full attention): the file holds each linear-attention
 * layer's recurrent states (the convolution's [3, conv_dim] and the delta rule's [4, 16, 16],
 * F32) and the full layer's keys and values. Loaded into a fresh session with another n_batch
 * and into a used one, the next steps and a prefill chunk give the uninterrupted logits bit for
 * bit; a prompt extending the saved tokens reuses them all, one that leaves them is evaluated
 * from the start (a recurrent state cannot be cut back) and gives a fresh session's tokens; a
 * file without a linear layer's state is refused naming the tensor. */
TEST(State, Qwen35RecurrentStatesContinueBitExact) {
    Saved a(ft::src("tests/fixtures/parity/qwen3_5_text_f32"), "state_qwen35", 128, 0, 70, 5);
    ASSERT_TRUE(a.m && a.s);
    std::vector<uint8_t> file = ft::read_file(a.file);
    cJSON *h = cJSON_ParseWithLength((const char *)file.data() + 8, header_len(file));
    ASSERT_NE(h, nullptr);
    auto shape = [&](const char *name) {
        std::vector<int> v;
        cJSON *t = cJSON_GetObjectItem(h, name), *d;
        if (!t) return v;
        EXPECT_STREQ(cJSON_GetObjectItem(t, "dtype")->valuestring, "F32") << name;
        cJSON_ArrayForEach(d, cJSON_GetObjectItem(t, "shape")) v.push_back(d->valueint);
        return v;
    };
    for (int l = 0; l < 3; l++) {
        EXPECT_EQ(shape(("layers." + std::to_string(l) + ".conv").c_str()), std::vector<int>({3, 128})); /* 2 x 2 x 16 + 4 x 16 channels */
        EXPECT_EQ(shape(("layers." + std::to_string(l) + ".delta").c_str()), std::vector<int>({4, 16, 16}));
        EXPECT_EQ(cJSON_GetObjectItem(h, ("layers." + std::to_string(l) + ".k").c_str()), nullptr);
    }
    EXPECT_EQ(shape("layers.3.k"), std::vector<int>({75, 2, 32}));
    EXPECT_STREQ(cJSON_GetObjectItem(cJSON_GetObjectItem(h, "__metadata__"), "layer_rows")->valuestring, "0,0,0,75");
    cJSON_Delete(h);
    std::vector<int32_t> hist = tokens_of(a.s);
    forge_session *fresh = ft::session(a.m, 128, 16), *used = ft::session(a.m, 96, 0);
    ASSERT_TRUE(fresh && used);
    std::vector<int32_t> other = seq(30, a.V, 5, 3);
    ASSERT_EQ(forge_eval(used, other.data(), 30, 0, nullptr, 0), FORGE_OK);
    ASSERT_EQ(forge_session_load(fresh, a.file.c_str()), FORGE_OK) << errmsg(fresh);
    ASSERT_EQ(forge_session_load(used, a.file.c_str()), FORGE_OK) << errmsg(used);
    EXPECT_EQ(tokens_of(fresh), hist);
    std::vector<int32_t> next = seq(6, a.V, 29, 7);
    std::vector<float> la = decode(a.s, next, a.V);
    EXPECT_TRUE(bit_equal(la, decode(fresh, next, a.V)));
    EXPECT_TRUE(bit_equal(la, decode(used, next, a.V)));
    std::vector<float> pa(a.V), pb(a.V);
    std::vector<int32_t> chunk = seq(10, a.V, 3, 1);
    ASSERT_EQ(forge_eval(a.s, chunk.data(), 10, 0, pa.data(), pa.size()), FORGE_OK);
    ASSERT_EQ(forge_eval(fresh, chunk.data(), 10, 0, pb.data(), pb.size()), FORGE_OK);
    EXPECT_TRUE(bit_equal(pa, pb));
    /* the prompt cache after a load: an extension reuses all 75 tokens; a prompt that leaves them
     * at 50 is evaluated from the start, as in a new session */
    forge_generate_params gp = forge_generate_default_params();
    gp.max_tokens = 4;
    struct C {
        std::vector<int32_t> t;
        static int cb(void *u, int32_t tok, const char *, size_t) {
            if (tok >= 0) ((C *)u)->t.push_back(tok);
            return 0;
        }
    } c0, c1, c2;
    gp.on_token = C::cb;
    gp.user_data = &c0;
    forge_metrics mt = ft::sized<forge_metrics>();
    std::vector<int32_t> prompt = hist;
    prompt.push_back(42);
    ASSERT_EQ(forge_session_load(fresh, a.file.c_str()), FORGE_OK);
    ASSERT_EQ(forge_generate_tokens(fresh, prompt.data(), (int)prompt.size(), &gp, &mt), FORGE_OK);
    EXPECT_EQ(mt.cached_tokens, 75);
    std::vector<int32_t> leave(hist.begin(), hist.begin() + 50);
    leave.push_back(43);
    ASSERT_EQ(forge_session_load(fresh, a.file.c_str()), FORGE_OK);
    gp.user_data = &c1;
    ASSERT_EQ(forge_generate_tokens(fresh, leave.data(), (int)leave.size(), &gp, &mt), FORGE_OK);
    EXPECT_EQ(mt.cached_tokens, 0);
    forge_session *newer = ft::session(a.m, 128, 16);
    ASSERT_NE(newer, nullptr);
    gp.user_data = &c2;
    ASSERT_EQ(forge_generate_tokens(newer, leave.data(), (int)leave.size(), &gp, &mt), FORGE_OK);
    EXPECT_EQ(c1.t, c2.t);
    EXPECT_EQ((int)c1.t.size(), 4);
    /* a linear layer's state missing */
    std::vector<uint8_t> cut = edit_header(file, [](cJSON *hh) { cJSON_DeleteItemFromObject(hh, "layers.1.delta"); });
    std::string bad = a.dir + "/no_delta.safetensors";
    FILE *fp = fopen(bad.c_str(), "wb");
    ASSERT_NE(fp, nullptr);
    fwrite(cut.data(), 1, cut.size(), fp);
    fclose(fp);
    EXPECT_EQ(forge_session_load(newer, bad.c_str()), FORGE_ERR_FORMAT);
    EXPECT_NE(errmsg(newer).find("layers.1.delta"), std::string::npos) << errmsg(newer);
    forge_session_free(newer);
    forge_session_free(fresh);
    forge_session_free(used);
}

/* After a load, a prompt that shares only part of the saved tokens reuses the prefix only
 * where the restored rows cover it (the rows before are not in the file); either way the
 * tokens are those of a fresh session. */
TEST(State, PartialPrefixAfterLoadStaysExact) {
    Saved a(gemma2_path(), "state_gemma2_prefix", 64, 4, 30, 5); /* saved ring: 11 rows, positions 24..34 */
    ASSERT_TRUE(a.m && a.s);
    std::vector<int32_t> hist = tokens_of(a.s);
    forge_generate_params gp = forge_generate_default_params();
    gp.max_tokens = 6;
    gp.ignore_eos = 1;
    for (int keep : {33, 30}) { /* continuing at 33 reads from 26 (restored); at 30 from 23 (not) */
        forge_session *s = ft::session(a.m, 64, 8), *fresh = ft::session(a.m, 64, 8);
        ASSERT_TRUE(s && fresh);
        ASSERT_EQ(forge_session_load(s, a.file.c_str()), FORGE_OK);
        std::vector<int32_t> q(hist.begin(), hist.begin() + keep);
        q.push_back(200);
        struct C {
            std::vector<int32_t> t;
            static int cb(void *u, int32_t tok, const char *, size_t) {
                if (tok >= 0) ((C *)u)->t.push_back(tok);
                return 0;
            }
        } ca, cb;
        forge_metrics mt = ft::sized<forge_metrics>();
        gp.on_token = C::cb;
        gp.user_data = &ca;
        ASSERT_EQ(forge_generate_tokens(s, q.data(), (int)q.size(), &gp, &mt), FORGE_OK);
        gp.user_data = &cb;
        ASSERT_EQ(forge_generate_tokens(fresh, q.data(), (int)q.size(), &gp, nullptr), FORGE_OK);
        EXPECT_EQ(ca.t, cb.t) << "keep " << keep;
        EXPECT_EQ(mt.cached_tokens, keep == 33 ? 33 : 0) << "keep " << keep;
        EXPECT_EQ(mt.cache_wrapped, keep == 33 ? 0 : 1) << "keep " << keep;
        forge_session_free(s);
        forge_session_free(fresh);
    }
}

/* A truncation leaves later positions in the rings: a second truncation further back is
 * refused where they overwrote what it needs (it used to be allowed and gave other logits),
 * and a save after a truncation holds only the rows the rings still hold. */
TEST(State, TruncationsTrackWhatTheRingsHold) {
    forge_model *m = ft::load(gemma2_path());
    ASSERT_NE(m, nullptr);
    std::string d = ft::tmpdir("state_truncate");
    forge_session *s = ft::session(m, 64, 8), *t = ft::session(m, 64, 8); /* rings of 15 */
    std::vector<int32_t> p = seq(35, 256);
    ASSERT_EQ(forge_eval(s, p.data(), 35, 0, nullptr, 0), FORGE_OK);
    ASSERT_EQ(forge_session_truncate(s, 29), FORGE_OK); /* reads from 22; 35 - 15 = 20 */
    EXPECT_EQ(forge_session_truncate(s, 25), FORGE_ERR_LIMIT); /* reads from 18: overwritten by 33, 34 */
    ASSERT_EQ(forge_session_save(s, (d + "/s").c_str()), FORGE_OK) << errmsg(s);
    std::vector<uint8_t> f = ft::read_file(d + "/s");
    std::string h((const char *)f.data() + 8, header_len(f));
    EXPECT_NE(h.find("\"layer_rows\":\"9,29,9,29\""), std::string::npos) << h;
    ASSERT_EQ(forge_session_load(t, (d + "/s").c_str()), FORGE_OK) << errmsg(t);
    std::vector<int32_t> next = seq(4, 256, 7, 2);
    std::vector<float> ls = decode(s, next, 256), lt = decode(t, next, 256);
    EXPECT_TRUE(bit_equal(ls, lt));
    forge_session *fresh = ft::session(m, 64, 8);
    std::vector<int32_t> all(p.begin(), p.begin() + 29);
    all.insert(all.end(), next.begin(), next.end());
    std::vector<float> lf(all.size() * 256);
    ASSERT_EQ(forge_eval(fresh, all.data(), (int)all.size(), FORGE_EVAL_ALL_LOGITS, lf.data(), lf.size()), FORGE_OK);
    EXPECT_LT(ft::rel_err(ls.data(), lf.data() + 29 * 256, ls.size()), 1e-5);
    forge_session_free(fresh);
    forge_session_free(s);
    forge_session_free(t);
    forge_model_free(m);
}

/* A state saved with a LoRA adapter names it: loading it into the base model, a model with
 * another adapter or the same adapter merged into the weights is FORGE_ERR_MODEL naming the
 * adapter; into the same model with the same adapter it goes on bit for bit. */
TEST(State, AdapterIsPartOfTheIdentity) {
    std::string lora = ft::src("tests/fixtures/lora/gemma2/");
    auto load = [&](const char *adapter, int merge) {
        forge_model_params mp = forge_model_default_params();
        mp.exact = 1;
        std::string a = adapter ? lora + adapter : "";
        mp.adapter_path = adapter ? a.c_str() : nullptr;
        mp.adapter_merge = merge;
        forge_model *m = nullptr;
        EXPECT_EQ(forge_model_load(gemma2_path().c_str(), &mp, &m), FORGE_OK) << forge_model_errmsg(m);
        return m;
    };
    forge_model *init = load("adapter_init", 0), *init2 = load("adapter_init", 0), *fin = load("adapter_final", 0);
    forge_model *merged = load("adapter_init", 1), *base = load(nullptr, 0);
    ASSERT_TRUE(init && init2 && fin && merged && base);
    char f1[32], f2[32];
    ft_model_fingerprint(init, f1, sizeof f1);
    ft_model_fingerprint(base, f2, sizeof f2);
    EXPECT_STREQ(f1, f2); /* the base weights' fingerprint; the adapter is named on its own */
    std::string d = ft::tmpdir("state_adapter");
    forge_session *a = ft::session(init, 64, 4);
    std::vector<int32_t> p = seq(20, 256);
    ASSERT_EQ(forge_eval(a, p.data(), 20, 0, nullptr, 0), FORGE_OK);
    ASSERT_EQ(forge_session_save(a, (d + "/s").c_str()), FORGE_OK) << errmsg(a);
    for (forge_model *other : {fin, merged, base}) {
        forge_session *s = ft::session(other, 64, 4);
        EXPECT_EQ(forge_session_load(s, (d + "/s").c_str()), FORGE_ERR_MODEL);
        EXPECT_NE(errmsg(s).find("saved with adapter"), std::string::npos) << errmsg(s);
        forge_session_free(s);
    }
    forge_session *b = ft::session(init2, 64, 4);
    ASSERT_EQ(forge_session_load(b, (d + "/s").c_str()), FORGE_OK) << errmsg(b);
    std::vector<int32_t> next = seq(4, 256, 11, 9);
    EXPECT_TRUE(bit_equal(decode(a, next, 256), decode(b, next, 256)));
    forge_session_free(a);
    forge_session_free(b);
    for (forge_model *m : {init, init2, fin, merged, base}) forge_model_free(m);
}

/* An empty session saves and loads (a load then empties the target). */
TEST(State, EmptySessionRoundTrip) {
    forge_model *m = ft::load(stories_path());
    ASSERT_NE(m, nullptr);
    std::string d = ft::tmpdir("state_empty");
    forge_session *a = ft::session(m, 64), *b = ft::session(m, 64);
    ASSERT_EQ(forge_session_save(a, (d + "/e").c_str()), FORGE_OK) << errmsg(a);
    std::vector<int32_t> p = seq(10, 512);
    ASSERT_EQ(forge_eval(b, p.data(), 10, 0, nullptr, 0), FORGE_OK);
    ASSERT_EQ(forge_session_load(b, (d + "/e").c_str()), FORGE_OK) << errmsg(b);
    EXPECT_EQ(forge_session_n_past(b), 0);
    forge_session_free(a);
    forge_session_free(b);
    forge_model_free(m);
}

/* Another model, and a session too short for the state: errors naming both sides; the
 * session keeps what it held. */
TEST(State, WrongModelAndShortContext) {
    Saved a(stories_path(), "state_wrong", 256, 0, 40, 4);
    ASSERT_TRUE(a.m && a.s);
    forge_model *g = ft::load(gemma2_path());
    ASSERT_NE(g, nullptr);
    forge_session *gs = ft::session(g, 64);
    std::vector<int32_t> p = seq(5, 256);
    ASSERT_EQ(forge_eval(gs, p.data(), 5, 0, nullptr, 0), FORGE_OK);
    EXPECT_EQ(forge_session_load(gs, a.file.c_str()), FORGE_ERR_MODEL);
    std::string msg = errmsg(gs);
    char fa[32], fg[32];
    ft_model_fingerprint(a.m, fa, sizeof fa);
    ft_model_fingerprint(g, fg, sizeof fg);
    EXPECT_NE(msg.find("different model"), std::string::npos) << msg;
    EXPECT_NE(msg.find(fa), std::string::npos) << msg;
    EXPECT_NE(msg.find(fg), std::string::npos) << msg;
    EXPECT_NE(msg.find(a.file), std::string::npos) << msg;
    EXPECT_EQ(forge_session_n_past(gs), 5);
    forge_session *tiny = ft::session(a.m, 32);
    EXPECT_EQ(forge_session_load(tiny, a.file.c_str()), FORGE_ERR_LIMIT);
    msg = errmsg(tiny);
    EXPECT_NE(msg.find("holds 44 tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("n_ctx is 32"), std::string::npos) << msg;
    /* exactly enough is fine */
    forge_session *fits = ft::session(a.m, 44);
    EXPECT_EQ(forge_session_load(fits, a.file.c_str()), FORGE_OK) << errmsg(fits);
    EXPECT_EQ(forge_session_load(fits, (a.dir + "/missing").c_str()), FORGE_ERR_IO);
    EXPECT_EQ(forge_session_n_past(fits), 44);
    forge_session_free(fits);
    forge_session_free(tiny);
    forge_session_free(gs);
    forge_model_free(g);
}

/* Every prefix of a state file is an error (FORGE_ERR_FORMAT) that leaves the session as it
 * was: in the length field, the header, the tokens, each layer's keys and values. */
TEST(State, TruncatedFilesAreFormatErrors) {
    Saved a(stories_path(), "state_trunc", 128, 0, 20, 3);
    ASSERT_TRUE(a.m && a.s);
    std::vector<uint8_t> file = ft::read_file(a.file);
    uint64_t hl = header_len(file), data0 = 8 + hl;
    ASSERT_GT(file.size(), data0 + 4 * 23);
    std::vector<size_t> cuts = {0, 1, 7, 8, 9, 8 + hl / 2, 8 + hl - 1, data0, data0 + 1, data0 + 4 * 23 - 1, data0 + 4 * 23,
                                data0 + 4 * 23 + 100, (file.size() + data0) / 2, file.size() - 1};
    for (size_t step = data0 + 4 * 23; step < file.size(); step += 4099) cuts.push_back(step); /* through every layer */
    forge_session *s = ft::session(a.m, 128);
    std::vector<int32_t> p = seq(7, a.V);
    ASSERT_EQ(forge_eval(s, p.data(), 7, 0, nullptr, 0), FORGE_OK);
    std::string cut_path = a.dir + "/cut";
    for (size_t n : cuts) {
        ft::write_file(cut_path, file.data(), n);
        EXPECT_EQ(forge_session_load(s, cut_path.c_str()), FORGE_ERR_FORMAT) << "prefix of " << n << " bytes";
        std::string msg = errmsg(s);
        EXPECT_NE(msg.find(cut_path), std::string::npos) << msg;
        EXPECT_EQ(forge_session_n_past(s), 7) << "prefix of " << n << " bytes";
    }
    /* and the session still works as before */
    std::vector<float> l1(a.V), l2(a.V);
    forge_session *ref = ft::session(a.m, 128);
    std::vector<int32_t> p8 = seq(8, a.V);
    ASSERT_EQ(forge_eval(s, &p8[7], 1, 0, l1.data(), l1.size()), FORGE_OK);
    ASSERT_EQ(forge_eval(ref, p8.data(), 8, 0, l2.data(), l2.size()), FORGE_OK);
    EXPECT_LT(ft::rel_err(l1.data(), l2.data(), l1.size()), 1e-5);
    forge_session_free(ref);
    forge_session_free(s);
}

/* Each byte of the header flipped: the load fails with an error, or (a byte that only
 * changes informative text such as the model name or padding) loads the same state. */
TEST(State, FlippedHeaderBytesNeverLoadAnotherState) {
    Saved a(stories_path(), "state_flip", 128, 0, 12, 2);
    ASSERT_TRUE(a.m && a.s);
    std::vector<uint8_t> file = ft::read_file(a.file);
    uint64_t hl = header_len(file);
    std::vector<int32_t> hist = tokens_of(a.s);
    forge_session *s = ft::session(a.m, 128);
    std::string path = a.dir + "/flip";
    int ok = 0, failed = 0;
    for (size_t i = 0; i < 8 + hl; i++) {
        std::vector<uint8_t> f = file;
        f[i] ^= (uint8_t)(i < 8 ? 0x80 : 0x11);
        ft::write_file(path, f.data(), f.size());
        forge_status st = forge_session_load(s, path.c_str());
        if (st == FORGE_OK) {
            ok++;
            EXPECT_EQ(tokens_of(s), hist) << "byte " << i;
        } else {
            failed++;
            EXPECT_TRUE(st == FORGE_ERR_FORMAT || st == FORGE_ERR_MODEL || st == FORGE_ERR_UNSUPPORTED || st == FORGE_ERR_LIMIT)
                << "byte " << i << ": " << forge_status_name(st);
            EXPECT_FALSE(errmsg(s).empty());
        }
    }
    EXPECT_GT(failed, (int)hl / 2) << ok << " flips loaded";
    /* flips in the format name and the fingerprint say so */
    std::string h((const char *)file.data() + 8, hl);
    std::vector<uint8_t> f = file;
    f[8 + h.find("forge-state")] ^= 1;
    ft::write_file(path, f.data(), f.size());
    EXPECT_EQ(forge_session_load(s, path.c_str()), FORGE_ERR_FORMAT);
    EXPECT_NE(errmsg(s).find("not a forge state file"), std::string::npos) << errmsg(s);
    char fp[32];
    ft_model_fingerprint(a.m, fp, sizeof fp);
    f = file;
    f[8 + h.find(fp) + 3] ^= 1;
    ft::write_file(path, f.data(), f.size());
    EXPECT_EQ(forge_session_load(s, path.c_str()), FORGE_ERR_MODEL);
    EXPECT_NE(errmsg(s).find("different model"), std::string::npos) << errmsg(s);
    forge_session_free(s);
}

/* Well-formed safetensors that are not the right state: each error names the field. */
TEST(State, MalformedStatesNameTheCause) {
    Saved a(stories_path(), "state_bad", 128, 0, 12, 2); /* 14 tokens */
    ASSERT_TRUE(a.m && a.s);
    std::vector<uint8_t> file = ft::read_file(a.file);
    forge_session *s = ft::session(a.m, 128);
    std::string path = a.dir + "/bad";
    struct Case {
        const char *what;
        void (*edit)(cJSON *);
        forge_status st;
        const char *msg;
    } cases[] = {
        {"missing tensor", [](cJSON *h) { cJSON_DeleteItemFromObjectCaseSensitive(h, "layers.1.v"); }, FORGE_ERR_FORMAT, "no tensor 'layers.1.v'"},
        {"missing tokens", [](cJSON *h) { cJSON_DeleteItemFromObjectCaseSensitive(h, "tokens"); }, FORGE_ERR_FORMAT, "no tensor 'tokens'"},
        {"wrong shape (same bytes)",
         [](cJSON *h) {
             cJSON *sh = cJSON_GetObjectItem(cJSON_GetObjectItem(h, "layers.0.k"), "shape");
             int a1 = cJSON_GetArrayItem(sh, 1)->valueint, a2 = cJSON_GetArrayItem(sh, 2)->valueint;
             cJSON_SetNumberValue(cJSON_GetArrayItem(sh, 1), a2);
             cJSON_SetNumberValue(cJSON_GetArrayItem(sh, 2), a1);
         },
         FORGE_ERR_FORMAT, "tensor 'layers.0.k' is f32 ["},
        {"wrong dtype", [](cJSON *h) { cJSON_SetValuestring(cJSON_GetObjectItem(cJSON_GetObjectItem(h, "tokens"), "dtype"), "F32"); },
         FORGE_ERR_FORMAT, "tensor 'tokens' is f32"},
        {"n_past disagrees with tokens", [](cJSON *h) { cJSON_SetValuestring(cJSON_GetObjectItem(cJSON_GetObjectItem(h, "__metadata__"), "n_past"), "13"); },
         FORGE_ERR_FORMAT, "n_past 13 needs i32 [13]"},
        {"n_past not a number", [](cJSON *h) { cJSON_SetValuestring(cJSON_GetObjectItem(cJSON_GetObjectItem(h, "__metadata__"), "n_past"), "14x"); },
         FORGE_ERR_FORMAT, "n_past is missing"},
        {"no metadata", [](cJSON *h) { cJSON_DeleteItemFromObjectCaseSensitive(h, "__metadata__"); }, FORGE_ERR_FORMAT, "not a forge state file"},
        {"newer version", [](cJSON *h) { cJSON_SetValuestring(cJSON_GetObjectItem(cJSON_GetObjectItem(h, "__metadata__"), "version"), "2"); },
         FORGE_ERR_UNSUPPORTED, "version '2'"},
        {"another adapter",
         [](cJSON *h) { cJSON_SetValuestring(cJSON_GetObjectItem(cJSON_GetObjectItem(h, "__metadata__"), "adapter"), "0123456789abcdef"); },
         FORGE_ERR_MODEL, "saved with adapter 0123456789abcdef; this model has adapter none"},
        {"layer rows disagree", [](cJSON *h) { cJSON_SetValuestring(cJSON_GetObjectItem(cJSON_GetObjectItem(h, "__metadata__"), "layer_rows"), "14,14"); },
         FORGE_ERR_FORMAT, "layer_rows"},
        {"extra tensor",
         [](cJSON *h) {
             cJSON *t = cJSON_Duplicate(cJSON_GetObjectItem(h, "tokens"), 1);
             cJSON_AddItemToObject(h, "layers.9.k", t);
         },
         FORGE_ERR_FORMAT, "unexpected tensor 'layers.9.k'"},
        {"a full layer with fewer rows",
         [](cJSON *h) {
             for (const char *n : {"layers.2.k", "layers.2.v"}) {
                 cJSON *t = cJSON_GetObjectItem(h, n);
                 cJSON *sh = cJSON_GetObjectItem(t, "shape"), *off = cJSON_GetObjectItem(t, "data_offsets");
                 double row = 4.0 * cJSON_GetArrayItem(sh, 1)->valuedouble * cJSON_GetArrayItem(sh, 2)->valuedouble;
                 cJSON_SetNumberValue(cJSON_GetArrayItem(sh, 0), 10);
                 cJSON_SetNumberValue(cJSON_GetArrayItem(off, 1), cJSON_GetArrayItem(off, 0)->valuedouble + 10 * row);
             }
         },
         FORGE_ERR_FORMAT, "layer 2 holds the keys of 10 positions; continuing after 14 tokens needs 14"},
    };
    std::vector<int32_t> p = seq(3, a.V);
    ASSERT_EQ(forge_eval(s, p.data(), 3, 0, nullptr, 0), FORGE_OK);
    for (const Case &c : cases) {
        std::vector<uint8_t> f = edit_header(file, c.edit);
        ft::write_file(path, f.data(), f.size());
        EXPECT_EQ(forge_session_load(s, path.c_str()), c.st) << c.what << ": " << errmsg(s);
        EXPECT_NE(errmsg(s).find(c.msg), std::string::npos) << c.what << ": " << errmsg(s);
        EXPECT_EQ(forge_session_n_past(s), 3) << c.what;
    }
    /* a token outside the vocabulary */
    std::vector<uint8_t> f = file;
    int32_t big = 100000;
    memcpy(&f[8 + header_len(file) + 4 * 5], &big, 4);
    ft::write_file(path, f.data(), f.size());
    EXPECT_EQ(forge_session_load(s, path.c_str()), FORGE_ERR_FORMAT);
    EXPECT_NE(errmsg(s).find("token 100000 at position 5 is outside the vocabulary of 512"), std::string::npos) << errmsg(s);
    /* not a file at all */
    EXPECT_EQ(forge_session_load(s, a.dir.c_str()), FORGE_ERR_IO);
    EXPECT_EQ(forge_session_n_past(s), 3);
    forge_session_free(s);
}

/* A sliding-window layer must hold what continuing reads (window - 1 positions). */
TEST(State, SlidingLayerWithTooFewRows) {
    Saved a(gemma2_path(), "state_gemma2_rows", 64, 4, 30, 0);
    ASSERT_TRUE(a.m && a.s);
    std::vector<uint8_t> f = edit_header(ft::read_file(a.file), [](cJSON *h) {
        for (const char *n : {"layers.0.k", "layers.0.v"}) {
            cJSON *t = cJSON_GetObjectItem(h, n);
            cJSON *sh = cJSON_GetObjectItem(t, "shape"), *off = cJSON_GetObjectItem(t, "data_offsets");
            cJSON_SetNumberValue(cJSON_GetArrayItem(sh, 0), 6);
            cJSON_SetNumberValue(cJSON_GetArrayItem(off, 1), cJSON_GetArrayItem(off, 0)->valuedouble + 6 * 4 * 2 * 16);
        }
    });
    std::string path = a.dir + "/few";
    ft::write_file(path, f.data(), f.size());
    forge_session *s = ft::session(a.m, 64);
    EXPECT_EQ(forge_session_load(s, path.c_str()), FORGE_ERR_FORMAT);
    EXPECT_NE(errmsg(s).find("layer 0 holds the keys of 6 positions; continuing after 30 tokens needs 7"), std::string::npos) << errmsg(s);
    forge_session_free(s);
}

/* Saving is atomic: into a missing directory, over a directory, and with the file size limit
 * a disk that fills mid-write, the save fails, leaves no temporary file and the old file whole. */
TEST(State, FailedSaveLeavesNoPartialFile) {
    Saved a(stories_path(), "state_atomic", 256, 0, 60, 4);
    ASSERT_TRUE(a.m && a.s);
    EXPECT_EQ(forge_session_save(a.s, (a.dir + "/no/such/dir/x").c_str()), FORGE_ERR_IO);
    EXPECT_NE(errmsg(a.s).find("cannot create a temporary file"), std::string::npos) << errmsg(a.s);
    std::string sub = a.dir + "/sub";
    ASSERT_EQ(mkdir(sub.c_str(), 0777), 0);
    EXPECT_EQ(forge_session_save(a.s, sub.c_str()), FORGE_ERR_IO);
    EXPECT_NE(errmsg(a.s).find("cannot rename"), std::string::npos) << errmsg(a.s);
    std::vector<uint8_t> before = ft::read_file(a.file);
    std::vector<int32_t> more = seq(100, a.V);
    ASSERT_EQ(forge_eval(a.s, more.data(), 100, 0, nullptr, 0), FORGE_OK);
    ft_state_disk_left(before.size()); /* the new state is larger: the disk fills mid-write */
    forge_status st = forge_session_save(a.s, a.file.c_str());
    ft_state_disk_left(UINT64_MAX);
    EXPECT_EQ(st, FORGE_ERR_IO);
    EXPECT_NE(errmsg(a.s).find("writing failed"), std::string::npos) << errmsg(a.s);
    EXPECT_EQ(ft::read_file(a.file), before);
    EXPECT_EQ(count_files(a.dir, ".tmp-"), 0);
    /* and then it saves */
    ASSERT_EQ(forge_session_save(a.s, a.file.c_str()), FORGE_OK) << errmsg(a.s);
    EXPECT_GT(ft::read_file(a.file).size(), before.size());
    EXPECT_EQ(count_files(a.dir, ".tmp-"), 0);
    struct stat sb;
    ASSERT_EQ(stat(a.file.c_str(), &sb), 0);
    EXPECT_EQ(sb.st_mode & 0777, 0600u);
}

/* Save and load take a parallel slot like the other calls: with every slot held (by a
 * generate whose callback is running) and parallel_fail, they fail with FORGE_ERR_LIMIT. */
TEST(State, SaveAndLoadTakeAParallelSlot) {
    forge_model_params mp = forge_model_default_params();
    mp.parallel_slots = 1;
    mp.parallel_fail = 1;
    forge_model *m = nullptr;
    ASSERT_EQ(forge_model_load(stories_path().c_str(), &mp, &m), FORGE_OK) << forge_model_errmsg(m);
    std::string d = ft::tmpdir("state_slot");
    forge_session *a = ft::session(m, 64), *b = ft::session(m, 64);
    ASSERT_EQ(forge_session_save(b, (d + "/b").c_str()), FORGE_OK);
    struct Ctx {
        forge_session *b;
        std::string path;
        forge_status save = FORGE_OK, load = FORGE_OK;
        static int cb(void *u, int32_t tok, const char *, size_t) {
            Ctx *c = (Ctx *)u;
            if (tok < 0) return 0;
            c->save = forge_session_save(c->b, (c->path + "2").c_str());
            c->load = forge_session_load(c->b, c->path.c_str());
            return 1;
        }
    } ctx{b, d + "/b"};
    forge_generate_params gp = forge_generate_default_params();
    gp.on_token = Ctx::cb;
    gp.user_data = &ctx;
    int32_t bos = 1;
    ASSERT_EQ(forge_generate_tokens(a, &bos, 1, &gp, nullptr), FORGE_OK);
    EXPECT_EQ(ctx.save, FORGE_ERR_LIMIT);
    EXPECT_EQ(ctx.load, FORGE_ERR_LIMIT);
    EXPECT_NE(errmsg(b).find("parallel slots"), std::string::npos) << errmsg(b);
    EXPECT_EQ(forge_session_load(b, (d + "/b").c_str()), FORGE_OK) << errmsg(b);
    forge_session_free(a);
    forge_session_free(b);
    forge_model_free(m);
}

/* max_tokens 0 evaluates the prompt and generates nothing. */
TEST(State, MaxTokensZeroGeneratesNothing) {
    forge_model *m = ft::load(stories_path());
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 64);
    int calls = 0;
    forge_generate_params gp = forge_generate_default_params();
    gp.max_tokens = 0;
    gp.on_token = [](void *u, int32_t tok, const char *, size_t) {
        if (tok >= 0) ++*(int *)u;
        return 0;
    };
    gp.user_data = &calls;
    forge_metrics mt = ft::sized<forge_metrics>();
    std::vector<int32_t> p = seq(6, 512);
    p[0] = 1;
    ASSERT_EQ(forge_generate_tokens(s, p.data(), 6, &gp, &mt), FORGE_OK);
    EXPECT_EQ(calls, 0);
    EXPECT_EQ(mt.generated_tokens, 0);
    EXPECT_EQ(mt.stop_reason, FORGE_STOP_MAX_TOKENS);
    EXPECT_EQ(forge_session_n_past(s), 6);
    forge_session_free(s);
    forge_model_free(m);
}

/* forge_session_tokens: the size query and a too-small buffer. */
TEST(State, SessionTokens) {
    forge_model *m = ft::load(stories_path());
    ASSERT_NE(m, nullptr);
    forge_session *s = ft::session(m, 64);
    std::vector<int32_t> p = seq(9, 512);
    ASSERT_EQ(forge_eval(s, p.data(), 9, 0, nullptr, 0), FORGE_OK);
    size_t n = 0;
    int32_t small[4];
    EXPECT_EQ(forge_session_tokens(s, small, 4, &n), FORGE_ERR_BUFFER_TOO_SMALL);
    EXPECT_EQ(n, 9u);
    EXPECT_EQ(tokens_of(s), p);
    forge_session_free(s);
    forge_model_free(m);
}

/* The fuzz target's reader: the fake model's valid files read, the committed seed included;
 * cut ones do not. */
TEST(State, FuzzReaderAndSeed) {
    char err[1024];
    for (int n : {0, 1, 3, 6, 20, 32}) {
        uint8_t *b = nullptr;
        size_t size = ft_state_fake(n, &b);
        ASSERT_GT(size, 0u);
        EXPECT_EQ(ft_state_mem(b, size, err, sizeof err), FORGE_OK) << n << ": " << err;
        EXPECT_EQ(ft_state_mem(b, size - 1, err, sizeof err), FORGE_ERR_FORMAT) << n;
        free(b);
    }
    uint8_t *b = nullptr;
    size_t size = ft_state_fake(33, &b);
    EXPECT_EQ(ft_state_mem(b, size, err, sizeof err), FORGE_ERR_LIMIT) << err;
    free(b);
    std::vector<uint8_t> seed = ft::read_file(ft::src("tests/fuzz/corpus/state/state.safetensors"));
    ASSERT_FALSE(seed.empty());
    EXPECT_EQ(ft_state_mem(seed.data(), seed.size(), err, sizeof err), FORGE_OK) << err;
}

/* The CLI: run --save-state, then run --load-state goes on with the text an uninterrupted run
 * prints; a bad state file is an error naming it. */
TEST(State, CliSaveAndLoadContinueTheText) {
    if (!ft::exists("./forge")) GTEST_SKIP() << "no ./forge binary in the working directory (the build tree)";
    std::string d = ft::tmpdir("state_cli"), model = stories_path();
    auto run = [&](const std::string &args, const std::string &out) {
        std::string cmd = "./forge run " + model + " " + args + " > " + d + "/" + out + " 2> " + d + "/" + out + ".err";
        return WEXITSTATUS(system(cmd.c_str()));
    };
    ASSERT_EQ(run("-p 'Once upon a time' -n 8 --save-state " + d + "/s", "a"), 0);
    ASSERT_EQ(run("-n 8 --load-state " + d + "/s", "b"), 0);
    ASSERT_EQ(run("-p 'Once upon a time' -n 16", "whole"), 0);
    auto text = [&](const std::string &f) {
        std::vector<uint8_t> b = ft::read_file(d + "/" + f);
        std::string s(b.begin(), b.end());
        if (!s.empty() && s.back() == '\n') s.pop_back();
        return s;
    };
    EXPECT_EQ(text("a") + text("b"), text("whole"));
    EXPECT_GT(text("b").size(), 8u);
    /* a prompt after --load-state follows the saved tokens */
    ASSERT_EQ(run("-p ' The dog' -n 4 --load-state " + d + "/s --save-state " + d + "/s2", "c"), 0);
    EXPECT_EQ(text("c").rfind(" The dog", 0), 0u) << text("c");
    EXPECT_EQ(run("--load-state " + d + "/nope", "e"), 1);
    EXPECT_NE(text("e.err").find(d + "/nope"), std::string::npos) << text("e.err");
}
