/* src/generate.c: Generation.
 * Owns: the sampler (the random generator, the host draw), stop strings, the prompt cache
 * match, forge_generate.
 * May call: base.c, tokenizer.c, device.c, ops.c, model.c, session.c, exec.c, api.c.
 *
 * A generate call: find the longest exact prefix of the prompt the cache already holds
 * (rotating sliding-window layers permitting), prefill the rest, then one replayed decode
 * step per token. Each step ends in the device's reduction (penalty, top-k candidates and
 * the softmax normalizer); the host draws from the candidates. Stop rules: the family's end
 * tokens, the caller's tokens and strings (matched on text across tokens, never emitted),
 * max tokens, the callback, a full context (unless the session slides it: exec.c; then
 * a prompt continuing the slid sequence is matched without the dropped tokens).
 */

FORGE_API forge_generate_params forge_generate_default_params(void) {
    forge_generate_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.max_tokens = 256;
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_window = 64;
    p.add_special = 1;
    return p;
}

/* ---- the random generator: xoshiro256**, seeded through splitmix64 ---- */

static uint64_t forge__splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static void forge__rng_seed(uint64_t s[4], uint64_t seed) {
    for (int i = 0; i < 4; i++) s[i] = forge__splitmix64(&seed);
}
static uint64_t forge__rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static uint64_t forge__rng_next(uint64_t s[4]) {
    uint64_t r = forge__rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = forge__rotl(s[3], 45);
    return r;
}
static double forge__rng_uniform(uint64_t s[4]) { return (double)(forge__rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

/* ---- the host side of sampling ----
 * Input: candidates (logit after the penalty, id), best first, and the row's normalizer
 * (M, S: S = sum over the vocabulary of exp((l - M) / T)). Probabilities of candidates are
 * exact. Returns the id, or -1 when the draw needs tokens beyond the candidates. */

typedef struct forge__cand {
    float logit;
    int32_t id;
} forge__cand;

FORGE__INTERNAL int32_t forge__sample_candidates(const forge__cand *c, int n, int complete, double M, double S,
                                                 const forge_generate_params *p, uint64_t rng[4], double *probs) {
    if (n <= 0) return -1;
    if (p->temperature <= 0.0f) return c[0].id;
    double inv_t = 1.0 / p->temperature;
    for (int i = 0; i < n; i++) probs[i] = exp(((double)c[i].logit - M) * inv_t) / S;
    int k = n;
    bool cut = complete != 0;                /* is the kept set decided within the candidates? */
    if (p->top_k > 0) {
        if (p->top_k > n && !complete) return -1;
        k = FORGE__MIN(p->top_k, n);
        cut = true;
    }
    double mass = 0;                         /* of the top-k set (1 when top-k is off and complete) */
    for (int i = 0; i < k; i++) mass += probs[i];
    if (p->top_p < 1.0f) {
        /* HF: drop the tokens whose cumulative probability from the bottom is <= 1 - top_p,
         * probabilities renormalized over the top-k set; i.e. keep from the top until the
         * cumulative reaches top_p. */
        double total = cut ? mass : 1.0, cum = 0;
        int keep = 0;
        while (keep < k) {
            cum += probs[keep] / total;
            keep++;
            if (cum >= (double)p->top_p) break;
        }
        if (cum < (double)p->top_p && !cut) return -1; /* the nucleus reaches past the candidates */
        if (cum >= (double)p->top_p) cut = true;
        k = keep;
    }
    if (p->min_p > 0.0f) {
        double floor_p = (double)p->min_p * probs[0];
        int keep = 1;
        while (keep < k && probs[keep] >= floor_p) keep++;
        if (keep == k && !cut && probs[k - 1] >= floor_p) return -1; /* tail tokens may qualify */
        if (keep < k || probs[k - 1] < floor_p) cut = true;
        k = keep;
    }
    double total = 0;
    for (int i = 0; i < k; i++) total += probs[i];
    double u = forge__rng_uniform(rng);
    if (!cut) { /* a plain draw from the whole distribution: the tail holds 1 - total */
        if (u >= total) return -1;
        total = 1.0;
    } else {
        u *= total;
    }
    double acc = 0;
    for (int i = 0; i < k; i++) {
        acc += probs[i];
        if (u < acc) return c[i].id;
    }
    return c[k - 1].id;
}

static int forge__cmp_cand(const void *a, const void *b) {
    const forge__cand *x = (const forge__cand *)a, *y = (const forge__cand *)b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Sorts c[0 .. n), given in ascending id order, into forge__cmp_cand's order (logit descending,
 * id ascending; NaN as -inf, -0 as +0) by a stable radix sort, four passes of 8 bits over keys
 * that ascend as the logits descend (written over the logits during the sort, then turned
 * back): the sampler's whole-row draws, where a comparison sort of 128,256 candidates took 8
 * to 15 times as long on a 2-core CPU (Sampler.RowSortIsTheComparisonOrder prints both). NaN
 * logits come out as -inf. Falls back to qsort without scratch. */
static void forge__sort_cands(forge__cand *c, int n) {
    forge__cand *tmp = n > 1 ? (forge__cand *)malloc(sizeof *tmp * (size_t)n) : NULL;
    for (int i = 0; i < n; i++) {
        float l = isnan(c[i].logit) ? -INFINITY : c[i].logit == 0.0f ? 0.0f : c[i].logit;
        uint32_t b;
        memcpy(&b, &l, 4);
        b = ~((b & 0x80000000u) ? ~b : b | 0x80000000u);
        if (tmp) memcpy(&c[i].logit, &b, 4);
        else c[i].logit = l;
    }
    if (!tmp) {
        if (n > 1) qsort(c, (size_t)n, sizeof *c, forge__cmp_cand);
        return;
    }
    forge__cand *src = c, *dst = tmp;
    for (int shift = 0; shift < 32; shift += 8) {
        size_t count[257] = {0};
        uint32_t k;
        for (int i = 0; i < n; i++) {
            memcpy(&k, &src[i].logit, 4);
            count[((k >> shift) & 255u) + 1]++;
        }
        memcpy(&k, &src[0].logit, 4);
        if (count[((k >> shift) & 255u) + 1] == (size_t)n) continue; /* one bucket: nothing moves */
        for (int b = 0; b < 256; b++) count[b + 1] += count[b];
        for (int i = 0; i < n; i++) {
            memcpy(&k, &src[i].logit, 4);
            dst[count[(k >> shift) & 255u]++] = src[i];
        }
        forge__cand *t = src;
        src = dst;
        dst = t;
    }
    for (int i = 0; i < n; i++) { /* the keys back to logits */
        uint32_t k;
        memcpy(&k, &src[i].logit, 4);
        k = ~k;
        k = (k & 0x80000000u) ? k & 0x7FFFFFFFu : ~k;
        memcpy(&c[i].logit, &k, 4);
        c[i].id = src[i].id;
    }
    free(tmp);
}

/* Copies logits row 0 (after the penalty) to the host: the sampler's fallback. */
static forge_status forge__fetch_logits_row(forge_session *s, float *out) {
    forge__device *d = &s->m->dev;
    if (!s->copy_logits_cb) {
        VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = s->cmd_pool,
                                           .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
        if (d->vk.vkAllocateCommandBuffers(d->dev, &cai, &s->copy_logits_cb) != VK_SUCCESS)
            return forge__fail(&s->err, FORGE_ERR_DEVICE, "vkAllocateCommandBuffers failed");
        VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
        d->vk.vkBeginCommandBuffer(s->copy_logits_cb, &bi);
        forge__rec r = {.dev = d, .cb = s->copy_logits_cb, .err = &s->err};
        forge__copy(&r, s->logits, (forge__range){s->readback.buf, FORGE__RB_LOGITS_OFFSET, 0}, 4ull * s->m->cfg.n_vocab);
        forge__host_barrier(&r);
        d->vk.vkEndCommandBuffer(s->copy_logits_cb);
    }
    forge_status st = forge__submit_wait(d, s->copy_logits_cb, s->fence, &s->err);
    if (st) return st;
    forge__readback_invalidate(&s->m->dev, &s->readback, FORGE__RB_LOGITS_OFFSET, 4ull * s->m->cfg.n_vocab);
    memcpy(out, (uint8_t *)s->readback.mapped + FORGE__RB_LOGITS_OFFSET, 4ull * s->m->cfg.n_vocab);
    return FORGE_OK;
}

/* The device reduction's work on the host (forge_model.sample_on_host): of row[V], the best n
 * candidates in topk_merge.comp's order (value descending, id ascending; NaN as -inf) into
 * out[n], through a heap whose root is the worst kept, and the normalizer M = max,
 * S = sum exp((l - M) * inv_t) over the row. */
FORGE__INTERNAL void forge__reduce_row_on_host(const float *row, int V, int n, double inv_t, forge__cand *out, double *M,
                                               double *S) {
    int kept = 0;
    for (int i = 0; i < V; i++) {
        forge__cand c = {isnan(row[i]) ? -INFINITY : row[i], i};
        int at;
        if (kept < n) { /* sift up from the new leaf */
            at = kept++;
            while (at > 0 && forge__cmp_cand(&out[(at - 1) / 2], &c) < 0) {
                out[at] = out[(at - 1) / 2];
                at = (at - 1) / 2;
            }
        } else if (forge__cmp_cand(&c, &out[0]) < 0) { /* better than the worst kept: sift down */
            at = 0;
            for (;;) {
                int child = 2 * at + 1;
                if (child >= n) break;
                if (child + 1 < n && forge__cmp_cand(&out[child + 1], &out[child]) > 0) child++;
                if (forge__cmp_cand(&out[child], &c) <= 0) break;
                out[at] = out[child];
                at = child;
            }
        } else {
            continue;
        }
        out[at] = c;
    }
    qsort(out, (size_t)kept, sizeof *out, forge__cmp_cand);
    *M = kept ? out[0].logit : 0;
    double sum = 0;
    if (isfinite(*M))
        for (int i = 0; i < V; i++)
            if (!isnan(row[i])) sum += exp(((double)row[i] - *M) * inv_t);
    *S = sum;
}

/* Reads the last step's reduction (the device's, or the host's over the read-back row) into
 * cands[0 .. n) (n returned) and its normalizer *M, *S; *host_row: the read-back row on models
 * that sample on the host, else NULL. */
static int forge__read_reduction(forge_session *s, const forge_generate_params *p, forge__cand *cands, double *M, double *S,
                                 const float **host_row) {
    int V = s->m->cfg.n_vocab, n = FORGE__MIN(FORGE__CANDIDATES, V);
    *host_row = NULL;
    if (s->m->sample_on_host) {
        forge__readback_invalidate(&s->m->dev, &s->readback, FORGE__RB_LOGITS_OFFSET, 4ull * V);
        *host_row = (const float *)((const uint8_t *)s->readback.mapped + FORGE__RB_LOGITS_OFFSET);
        forge__reduce_row_on_host(*host_row, V, n, p->temperature > 0.0f ? 1.0 / p->temperature : 0.0, cands, M, S);
    } else {
        forge__readback_invalidate(&s->m->dev, &s->readback, 0, 8ull * (1 + FORGE__CANDIDATES));
        const uint32_t *rb = (const uint32_t *)s->readback.mapped;
        float Mf, Sf;
        memcpy(&Mf, &rb[0], 4);
        memcpy(&Sf, &rb[1], 4);
        *M = Mf;
        *S = Sf;
        for (int i = 0; i < n; i++) {
            memcpy(&cands[i].logit, &rb[2 + 2 * i], 4);
            cands[i].id = (int32_t)rb[3 + 2 * i];
        }
    }
    return n;
}

/* Draws the next token from the last step's reduction. `scratch` holds n_vocab candidates and
 * probabilities for the rare full-row fallback. */
static forge_status forge__sample(forge_session *s, const forge_generate_params *p, forge__cand *scratch, double *probs,
                                  int32_t *out) {
    int V = s->m->cfg.n_vocab;
    double M, S;
    const float *host_row;
    int n = forge__read_reduction(s, p, scratch, &M, &S, &host_row);
    int32_t tok = forge__sample_candidates(scratch, n, n == V, M, S, p, s->rng, probs);
    if (tok < 0) { /* the draw reaches past the candidates: take the whole row */
        const float *row = host_row;
        if (!row) {
            float *fetched = (float *)probs; /* probs has room for n_vocab doubles */
            forge_status st = forge__fetch_logits_row(s, fetched);
            if (st) return st;
            row = fetched;
        }
        for (int i = 0; i < V; i++) scratch[i] = (forge__cand){isnan(row[i]) ? -INFINITY : row[i], i}; /* NaN as -inf, as topk.comp */
        forge__sort_cands(scratch, V);
        tok = forge__sample_candidates(scratch, V, 1, M, S, p, s->rng, probs);
    }
    if (tok < 0 || tok >= V) return forge__fail(&s->err, FORGE_ERR_DEVICE, "the sampler produced no token (non-finite logits?)");
    *out = tok;
    return FORGE_OK;
}

/* Keeps the best of (logit, id) in a min-heap of k (the worst at the root). */
static void forge__cand_heap_push(forge__cand *h, int *n, int k, forge__cand c) {
    if (*n == k) {
        if (forge__cmp_cand(&c, &h[0]) >= 0) return; /* not better than the worst kept */
        int i = 0;                                   /* replace the root, sift down */
        for (;;) {
            int l = 2 * i + 1, r = l + 1, w = i;
            forge__cand *best = &c;
            if (l < k && forge__cmp_cand(&h[l], best) > 0) { w = l; best = &h[l]; }
            if (r < k && forge__cmp_cand(&h[r], best) > 0) w = r;
            if (w == i) break;
            h[i] = h[w];
            i = w;
        }
        h[i] = c;
        return;
    }
    int i = (*n)++;
    while (i > 0 && forge__cmp_cand(&c, &h[(i - 1) / 2]) > 0) { /* c is worse than its parent: up */
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

/* The logits row after the repeat penalty over the last repeat_window of hist[0 .. n_hist) (each
 * distinct id once, as penalty.comp gets them): row itself without a penalty, else a copy in
 * scratch [V]. */
static const float *forge__penalize_row(const float *row, int V, const int32_t *hist, int n_hist, const forge_generate_params *p,
                                        float *scratch) {
    if (p->repeat_penalty == 1.0f) return row;
    memcpy(scratch, row, 4ull * V);
    int window = FORGE__MIN(p->repeat_window, FORGE__MAX_PENALTY_WINDOW);
    for (int i = n_hist - 1; i >= FORGE__MAX(0, n_hist - window); i--) {
        int32_t t = hist[i];
        bool seen = false;
        for (int j = n_hist - 1; j > i && !seen; j--) seen = hist[j] == t;
        if (seen || t < 0 || t >= V) continue;
        float l = scratch[t];
        scratch[t] = l > 0.0f ? l / p->repeat_penalty : l * p->repeat_penalty;
    }
    return scratch;
}

/* Draws a token with forge__sample's rules from out row `out_row` of a row-table step
 * (forge__batch_step): from the device's reduction (red: its normalizer and candidates), the
 * row's logits fetched only when the draw needs them; or, in a logits step (red NULL), from the
 * logits row after the repeat penalty over hist[0 .. n_hist), candidates and normalizer made on
 * the host. cands, probs and scratch hold n_vocab entries. */
static forge_status forge__draw_row(forge_session *s, const forge_generate_params *p, uint64_t rng[4], const float *row, const uint32_t *red,
                                    uint32_t out_row, const int32_t *hist, int n_hist, forge__cand *cands, double *probs, float *scratch,
                                    int32_t *out) {
    int V = s->m->cfg.n_vocab;
    if (red) {
        float M, S;
        memcpy(&M, &red[0], 4);
        memcpy(&S, &red[1], 4);
        int n = FORGE__MIN(FORGE__CANDIDATES, V);
        for (int i = 0; i < n; i++) {
            memcpy(&cands[i].logit, &red[2 + 2 * i], 4);
            cands[i].id = (int32_t)red[3 + 2 * i];
        }
        int32_t tok = forge__sample_candidates(cands, n, n == V, M, S, p, rng, probs);
        if (tok < 0) { /* the draw reaches past the candidates: the whole row */
            forge_status st = forge__batch_fetch_row(s, out_row, scratch);
            if (st) return st;
            for (int i = 0; i < V; i++) cands[i] = (forge__cand){scratch[i], i};
            forge__sort_cands(cands, V);
            tok = forge__sample_candidates(cands, V, 1, M, S, p, rng, probs);
        }
        if (tok < 0 || tok >= V) return forge__fail(&s->err, FORGE_ERR_DEVICE, "the sampler produced no token (non-finite logits?)");
        *out = tok;
        return FORGE_OK;
    }
    row = forge__penalize_row(row, V, hist, n_hist, p, scratch);
    int32_t tok = -1;
    if (p->temperature <= 0.0f) { /* the argmax, ties to the lower id */
        tok = 0;
        for (int i = 1; i < V; i++)
            if (row[i] > row[tok]) tok = i;
    } else {
        float mx = row[0];
        for (int i = 1; i < V; i++) mx = row[i] > mx ? row[i] : mx;
        double inv_t = 1.0 / p->temperature, S = 0;
        for (int i = 0; i < V; i++) S += exp(((double)row[i] - mx) * inv_t);
        int k = FORGE__MIN(FORGE__CANDIDATES, V), n = 0;
        for (int i = 0; i < V; i++) forge__cand_heap_push(cands, &n, k, (forge__cand){row[i], i});
        qsort(cands, (size_t)n, sizeof *cands, forge__cmp_cand);
        tok = forge__sample_candidates(cands, n, n == V, mx, S, p, rng, probs);
        if (tok < 0) { /* the draw reaches past the candidates: the whole row */
            for (int i = 0; i < V; i++) cands[i] = (forge__cand){row[i], i};
            forge__sort_cands(cands, V);
            tok = forge__sample_candidates(cands, V, 1, mx, S, p, rng, probs);
        }
    }
    if (tok < 0 || tok >= V) return forge__fail(&s->err, FORGE_ERR_DEVICE, "the sampler produced no token (non-finite logits?)");
    *out = tok;
    return FORGE_OK;
}

/* ---- constrained draws ----
 * The allowed candidates are a prefix of the allowed tokens in logit order (every allowed token
 * outside them has a logit at most the last candidate's). Greedy takes the first allowed one.
 * A draw at a temperature needs the allowed tokens' normalizer, which lies between the allowed
 * candidates' sum and that plus the whole tail's mass (S minus every candidate's term): the
 * draw is made at both ends with the same random number, and when both give the same token
 * so does every normalizer between (the token's rank only grows with the normalizer: the
 * filters keep more and the cumulative sums shrink). Else the whole mask and the whole logits
 * row decide it, from the same random number. */

typedef struct forge__draw_src {
    const forge__cand *cands;   /* the reduction's candidates, best first */
    int n;                      /* how many (n == V: every token) */
    double M, S;                /* its normalizer: S = sum exp((l - M) / T) over the vocabulary */
    const float *row;           /* the whole row after the penalty when it is at hand, else NULL: */
    forge_status (*fetch)(void *ctx, float *row); /* copies it to row (n_vocab floats) */
    void *ctx;
} forge__draw_src;

/* Draws the next token among those g allows; *out = -1 when no token is allowed (the constraint
 * is at a dead end). scratch / probs hold n_vocab entries, row n_vocab floats, mask the
 * matcher's words. */
static forge_status forge__draw_constrained(forge__matcher *g, const forge_generate_params *p, uint64_t rng[4], const forge__draw_src *src,
                                            int V, forge__cand *scratch, double *probs, float *row, uint32_t *mask, int32_t *out,
                                            forge__err *err) {
    double t0 = forge__now_s();
    *out = -1;
    int k = 0;
    for (int i = 0; i < src->n && !g->dfa.st; i++) {
        if (!forge__matcher_allows(g, src->cands[i].id)) continue;
        if (p->temperature <= 0.0f) { *out = src->cands[i].id; break; }
        scratch[k++] = src->cands[i];
    }
    if (g->dfa.st) return forge__fail(err, g->dfa.st, "%s", g->err.msg);
    if (*out < 0 && k > 0 && isfinite(scratch[0].logit)) {
        double inv_t = 1.0 / p->temperature, Ma = scratch[0].logit, lo = 0, all = 0;
        for (int i = 0; i < k; i++) lo += exp(((double)scratch[i].logit - Ma) * inv_t);
        for (int i = 0; i < src->n; i++)
            if (!isnan(src->cands[i].logit)) all += exp(((double)src->cands[i].logit - Ma) * inv_t);
        double scale = exp((src->M - Ma) * inv_t), tail = 0;
        if (src->n < V) {
            double s_all = src->S * scale;
            tail = fmax(0.0, s_all - all) + 1e-5 * s_all; /* the device's f32 sum: a margin */
        }
        if (isfinite(tail) && isfinite(lo)) {
            uint64_t r1[4], r2[4];
            memcpy(r1, rng, sizeof r1);
            memcpy(r2, rng, sizeof r2);
            int32_t a = forge__sample_candidates(scratch, k, src->n >= V, Ma, lo, p, r1, probs);
            int32_t b = src->n >= V ? a : forge__sample_candidates(scratch, k, 0, Ma, lo + tail, p, r2, probs);
            if (a >= 0 && a == b) {
                memcpy(rng, r1, sizeof r1);
                *out = a;
            }
        }
    }
    forge_status st = FORGE_OK;
    if (*out < 0) { /* the whole mask and row */
        g->ms += (forge__now_s() - t0) * 1e3;
        t0 = forge__now_s();
        if ((st = forge__matcher_mask(g, mask))) return forge__fail(err, st, "%s", g->err.msg);
        const float *r = src->row;
        if (!r) {
            if ((st = src->fetch(src->ctx, row))) return st;
            r = row;
        }
        int n = 0;
        for (int i = 0; i < V; i++)
            if ((mask[i >> 5] >> (i & 31)) & 1) scratch[n++] = (forge__cand){isnan(r[i]) ? -INFINITY : r[i], i};
        if (n > 0) {
            forge__sort_cands(scratch, n);
            if (p->temperature <= 0.0f || !isfinite(scratch[0].logit)) {
                *out = scratch[0].id;
            } else {
                double inv_t = 1.0 / p->temperature, Ma = scratch[0].logit, S = 0;
                for (int i = 0; i < n; i++) S += exp(((double)scratch[i].logit - Ma) * inv_t);
                *out = forge__sample_candidates(scratch, n, 1, Ma, S, p, rng, probs);
                if (*out < 0) *out = scratch[0].id;
            }
        }
    }
    g->ms += (forge__now_s() - t0) * 1e3;
    return st;
}

static forge_status forge__fetch_row_cb(void *ctx, float *row) { return forge__fetch_logits_row((forge_session *)ctx, row); }

/* The host scratch of a constrained call: the candidates as read, and the fallback's row and mask. */
typedef struct forge__cwork {
    forge__cand *cands; /* [FORGE__CANDIDATES] */
    float *row;         /* [n_vocab] */
    uint32_t *mask;     /* the matcher's words */
} forge__cwork;

/* forge__sample with constraint g: *out -1 when no token is allowed. `masked`: the step applied
 * the constraint's mask (forge__mask_step), so a greedy reduction's one candidate is the best
 * allowed token (the others are stale: greedy writes the best alone). */
static forge_status forge__sample_constrained(forge_session *s, const forge_generate_params *p, forge__matcher *g, forge__cwork *w,
                                              bool masked, forge__cand *scratch, double *probs, int32_t *out) {
    forge__draw_src src = {w->cands, 0, 0, 0, NULL, forge__fetch_row_cb, s};
    src.n = forge__read_reduction(s, p, w->cands, &src.M, &src.S, &src.row);
    if (masked && p->temperature <= 0.0f && !s->m->sample_on_host) src.n = FORGE__MIN(src.n, 1);
    return forge__draw_constrained(g, p, s->rng, &src, s->m->cfg.n_vocab, scratch, probs, w->row, w->mask, out, &s->err);
}

/* Before a step whose last logits a constrained draw reads: while the constraint holds (not
 * outside a triggered span, where the draw checks the candidates itself), its mask at its
 * present state goes to the io buffer and the step applies it on the device
 * (FORGE__OUT_SAMPLE_MASKED), so the reduction's best candidates are allowed tokens: a greedy
 * draw needs the argmax alone (inv_temp 0, no sort), a sampled one gets the allowed tokens'
 * own normalizer. The mask is the matcher's (cached per automaton state); it does not count as
 * a draw the candidates could not decide (forge_metrics.constraint_masks). *masked says which. */
static forge_status forge__mask_step(forge_session *s, forge__matcher *g, const forge_generate_params *p, uint32_t *scratch,
                                     forge__step_params *sp, forge__out_mode *mode, bool *masked) {
    *masked = g && g->constrained && !g->done && !g->dead;
    *mode = *masked ? FORGE__OUT_SAMPLE_MASKED : FORGE__OUT_SAMPLE;
    /* (a greedy draw the mask does not decide needs the device's whole candidate list) */
    sp->inv_temp = p->temperature > 0 ? 1.0f / p->temperature : g && !*masked ? 1.0f : 0.0f;
    if (!*masked) return FORGE_OK;
    int counted = g->full_masks;
    forge_status st = forge__matcher_mask(g, scratch); /* built in host memory: the io buffer may be write-combined */
    g->full_masks = counted;
    if (st) return forge__fail(&s->err, st, "%s", g->err.msg);
    memcpy((uint8_t *)s->io.mapped + s->mask_r.offset, scratch, (size_t)FORGE__MIN(s->mask_r.size, 4ull * g->words));
    return FORGE_OK;
}

/* Writes to the io buffer the distinct ids among the last `window` tokens of the session's
 * history followed by `next` (the n_next tokens the coming step evaluates, which the penalty
 * window already covers). Gathered here, then copied: the io buffer may be device memory the
 * host writes through PCIe and reads back a word per round trip (forge__caps.mem_step). */
static uint32_t forge__penalty_ids(forge_session *s, const int32_t *next, int n_next, int window) {
    uint32_t ids[FORGE__MAX_PENALTY_WINDOW];
    uint32_t n = 0;
    int total = s->n_past + n_next, from = FORGE__MAX(0, total - window);
    for (int i = total - 1; i >= from && n < FORGE__MAX_PENALTY_WINDOW; i--) {
        uint32_t t = (uint32_t)(i >= s->n_past ? next[i - s->n_past] : s->history[i]);
        bool seen = false;
        for (uint32_t j = 0; j < n && !seen; j++) seen = ids[j] == t;
        if (!seen) ids[n++] = t;
    }
    memcpy((uint8_t *)s->io.mapped + s->penalty_r.offset, ids, 4ull * n);
    return n;
}

/* ---- stop strings ---- */

typedef struct forge__stopper {
    const forge_generate_params *p;
    char *buf;          /* text not yet given to the callback */
    size_t len, cap;
} forge__stopper;

/* The held text as the callback receives it: never NULL, "" before any text arrived (a model
 * without a tokenizer never has any). */
static const char *forge__stopper_text(const forge__stopper *st) { return st->buf ? st->buf : ""; }

/* Appends text; returns the number of leading bytes that may be released now, and whether a
 * stop string was found (then only the text before it is released). */
static size_t forge__stopper_push(forge__stopper *st, const char *text, size_t n, bool *stopped) {
    if (st->len + n > st->cap) {
        size_t cap = (st->len + n) * 2 + 64;
        char *b = (char *)realloc(st->buf, cap);
        if (!b) return 0;
        st->buf = b;
        st->cap = cap;
    }
    if (n) memcpy(st->buf + st->len, text, n); /* (an empty piece may come with no buffer yet) */
    st->len += n;
    *stopped = false;
    size_t release = st->len;
    for (int i = 0; i < st->p->n_stop_strings; i++) {
        const char *ss = st->p->stop_strings[i];
        size_t sl = ss ? strlen(ss) : 0;
        if (!sl) continue;
        for (size_t at = 0; at + sl <= st->len; at++)
            if (!memcmp(st->buf + at, ss, sl)) {
                if (!*stopped || at < release) release = at;
                *stopped = true;
                break;
            }
    }
    if (*stopped) return release;
    /* hold back the longest suffix that is a prefix of a stop string */
    size_t hold = 0;
    for (int i = 0; i < st->p->n_stop_strings; i++) {
        const char *ss = st->p->stop_strings[i];
        size_t sl = ss ? strlen(ss) : 0;
        for (size_t k = FORGE__MIN(sl - (sl > 0), st->len); k > hold; k--)
            if (!memcmp(st->buf + st->len - k, ss, k)) { hold = k; break; }
    }
    return st->len - hold;
}

static void forge__stopper_consume(forge__stopper *st, size_t n) {
    if (st->len > n) memmove(st->buf, st->buf + n, st->len - n);
    st->len -= n;
}

/* ---- the generate loop ---- */

/* `tk` is the model's tokenizer, NULL when it has none (then no end tokens). */
static bool forge__is_stop_token(const forge__tokenizer *tk, const forge_generate_params *p, int32_t tok, forge_stop_reason *why) {
    for (int i = 0; i < p->n_stop_tokens; i++)
        if (p->stop_tokens[i] == tok) { *why = FORGE_STOP_TOKEN; return true; }
    if (!p->ignore_eos && tk)
        for (int i = 0; i < tk->n_eos; i++)
            if (tk->eos_ids[i] == tok) { *why = FORGE_STOP_EOS; return true; }
    return false;
}

/* Keeps what the cache holds of an exact prefix of `prompt`; returns how many tokens are kept.
 * Sliding-window layers whose rotating cache has overwritten keys the continuation needs make
 * the prefix unusable: then nothing is kept and *wrapped is set. */
static int forge__reuse_prefix(forge_session *s, const int32_t *prompt, int n, int *wrapped) {
    int common = 0;
    while (common < s->n_past && common < n && s->history[common] == prompt[common]) common++;
    if (common == n) common = n - 1; /* the last prompt token is evaluated again for its logits */
    *wrapped = 0;
    /* Qwen 3.5's linear-attention layers hold the state after all n_past tokens and cannot go
     * back: the cache serves a prompt that extends the whole cached sequence, else the prompt
     * restarts from the checkpoint (exec.c) when that lies within the common tokens, else from
     * position 0 */
    if (forge__has_linear(&s->m->cfg) && common < s->n_past) common = forge__ckpt_restart(s, prompt, common);
    if (common > 0 && common < s->n_past && !forge__truncate_valid(s, common)) {
        *wrapped = 1;
        common = 0;
    }
    s->n_past = common;
    return common;
}

/* After slides the cache holds the sequence without the span the slides dropped. A prompt that
 * continues the whole sequence (the kept tokens, the dropped ones, then more) is run without
 * that span: returns it in *owned (malloc'd, NULL when the prompt is used as it is) and its
 * length in *n. A prompt that does not continue it forgets the record. */
static forge_status forge__skip_dropped(forge_session *s, const int32_t *prompt, int *n, int32_t **owned) {
    int k = s->drop_at, D = s->n_dropped;
    *owned = NULL;
    if (!D) return FORGE_OK;
    if (*n <= k + D || memcmp(prompt, s->history, 4ull * (size_t)k) || memcmp(prompt + k, s->dropped, 4ull * (size_t)D)) {
        s->n_dropped = 0;
        return FORGE_OK;
    }
    if (!(*owned = (int32_t *)malloc(4ull * (size_t)(*n - D)))) return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    memcpy(*owned, prompt, 4ull * (size_t)k);
    memcpy(*owned + k, prompt + k + D, 4ull * (size_t)(*n - k - D));
    *n -= D;
    return FORGE_OK;
}

/* The first sampling parameter out of its range, named with its value and the range, into msg;
 * false when all are in range. (Classify passes the ones it has no use for at their defaults.) */
static bool forge__sampling_fault(char *msg, size_t n, int max_tokens, int repeat_window, float temperature, float top_p,
                                  float min_p, float repeat_penalty, int top_k, int lookup) {
    if (max_tokens < 0) snprintf(msg, n, "max_tokens %d (must be >= 0)", max_tokens);
    else if (repeat_window < 0) snprintf(msg, n, "repeat_window %d (must be >= 0)", repeat_window);
    else if (!(temperature >= 0)) snprintf(msg, n, "temperature %g (must be >= 0)", (double)temperature);
    else if (!(top_p > 0 && top_p <= 1)) snprintf(msg, n, "top_p %g (must be in (0, 1])", (double)top_p);
    else if (!(min_p >= 0 && min_p <= 1)) snprintf(msg, n, "min_p %g (must be in [0, 1])", (double)min_p);
    else if (!(repeat_penalty > 0)) snprintf(msg, n, "repeat_penalty %g (must be > 0)", (double)repeat_penalty);
    else if (top_k < 0) snprintf(msg, n, "top_k %d (must be >= 0)", top_k);
    else if (lookup < 0 || lookup > FORGE__LOOKUP_MAX) snprintf(msg, n, "lookup %d (must be 0 to %d draft tokens)", lookup, FORGE__LOOKUP_MAX);
    else return false;
    return true;
}

/* The text, callback and stop rules of one generated token (the stream's state in ds, stop,
 * piece): false when generation ends here (mt->stop_reason set). */
static bool forge__emit(forge_model *m, const forge_generate_params *p, forge__stopper *stop, forge_detok_stream *ds, char *piece,
                        size_t piece_size, int32_t tok, forge_metrics *mt) {
    const forge__tokenizer *tk = m->tok.n_vocab ? &m->tok : NULL;
    mt->generated_tokens++;
    size_t plen = 0;
    if (!tk || forge_detok_stream_next(m, ds, tok, piece, piece_size, &plen) != FORGE_OK) plen = 0;
    bool found = false;
    size_t release = forge__stopper_push(stop, piece, plen, &found);
    if (p->on_token && p->on_token(p->user_data, tok, forge__stopper_text(stop), release)) { /* non-zero: stop */
        forge__stopper_consume(stop, release);
        mt->stop_reason = FORGE_STOP_CALLBACK;
        return false;
    }
    forge__stopper_consume(stop, release);
    if (found) { mt->stop_reason = FORGE_STOP_STRING; stop->len = 0; return false; }
    if (mt->generated_tokens >= p->max_tokens) { mt->stop_reason = FORGE_STOP_MAX_TOKENS; return false; }
    return true;
}

/* ---- prompt lookup (forge_generate_params.lookup) ----
 * A draft is what followed the latest earlier occurrence of the sequence's last n tokens (n
 * from FORGE__LOOKUP_NGRAM down to 1). The drawn token and the drafts go through one pass of
 * row-table rows at consecutive positions, each row reduced as a decode step's (or its logits
 * read back under a repeat penalty), and the host draws row by row with the call's sampler:
 * the draw from row i is the token at position i + 1 whatever the drafts were, so a draft
 * stays only while it equals the draw, and the first draw that differs (or the one after the
 * last draft) is the next token. The rows of rejected drafts are then cut off the cache (a
 * step's rows are at most n_batch, which a rotating layer's ring allows for). */
#define FORGE__LOOKUP_NGRAM 3

/* Up to cap tokens into out (returned how many) from seq[0 .. len). */
static int forge__lookup_draft(const int32_t *seq, int len, int cap, int32_t *out) {
    for (int n = FORGE__MIN(FORGE__LOOKUP_NGRAM, len - 1); n >= 1 && cap > 0; n--) {
        const int32_t *tail = seq + len - n;
        for (int j = len - n - 1; j >= 0; j--) { /* seq[j .. j + n) == tail, with a token after it */
            if (memcmp(seq + j, tail, 4ull * (size_t)n)) continue;
            int k = FORGE__MIN(cap, len - (j + n));
            memcpy(out, seq + j + n, 4ull * (size_t)k);
            return k;
        }
    }
    return 0;
}

/* What a lookup step needs of its generate call. */
typedef struct forge__lookup_ctx {
    const forge_generate_params *p;
    forge_metrics *mt;
    forge__stopper *stop;
    forge_detok_stream *ds;
    char *piece;
    size_t piece_size;
    forge__cand *cands;            /* [n_vocab] */
    double *probs;                 /* [n_vocab] */
    float *row;                    /* [n_vocab] */
    uint32_t *red;                 /* [FORGE__LOOKUP_MAX + 1, 1 + FORGE__CANDIDATES] uvec2 */
    int span;                      /* the next draft's most tokens (1 .. most): follows how many were kept */
    int most;                      /* the longest draft (lookup, or a draft model's default) */
    int pause;                     /* steps left without a draft (after drafts that kept nothing) */
    int backoff;                   /* the last pause: 0 after a kept draft, else 1, 3, 7, .. FORGE__DRAFT_BACKOFF_MAX */
} forge__lookup_ctx;

/* The longest pause of drafting: a draft that keeps nothing cost a verification pass (and the
 * draft model's steps) for one token, so where drafts keep failing (text the model does not
 * copy, a draft model that disagrees) drafting pauses 1, 3, 7 .. steps, and the first kept
 * draft ends the pauses. On the H200 the 8B Q4_0 shape with a 1B draft that agreed on nothing
 * decoded 155 tok/s without them and 294 with them, against 355 plain (7a29d33). */
#define FORGE__DRAFT_BACKOFF_MAX 15

/* A draft model's default draft length (forge_generate_params.draft with lookup 0). */
#define FORGE__DRAFT_DEFAULT 4

/* Speculation with a draft model: brings the draft session ds to seq[0 .. len) (its cache
 * reused as far as it agrees with seq) and writes up to cap tokens that the draft model
 * continues seq with, greedily, into out (*n_out of them: fewer where its context ends).
 * cands and probs: [n_vocab] scratch. */
static forge_status forge__draft_tokens(forge_session *ds, const int32_t *seq, int len, int cap, int32_t *out, int *n_out,
                                        forge__cand *cands, double *probs) {
    *n_out = 0;
    cap = FORGE__MIN(cap, ds->n_ctx - len + 1); /* out[0 .. cap - 1) are evaluated at len .. len + cap - 2 */
    if (cap <= 0) return FORGE_OK;
    int wrapped;
    int done = forge__reuse_prefix(ds, seq, len, &wrapped); /* at least seq's last token is evaluated again */
    forge_generate_params greedy = forge_generate_default_params();
    forge__step_params sp = {0, 0, 0, 1.0f, 0.0f, 0, {0, 0}};
    forge_status st = FORGE_OK;
    while (!st && done < len) {
        int step = FORGE__MIN(len - done, ds->n_batch);
        bool last = done + step == len;
        st = forge__step(ds, seq + done, (uint32_t)step, (uint32_t)step - 1, last ? 1u : 0u, last ? FORGE__OUT_SAMPLE : FORGE__OUT_LOGITS, &sp,
                         NULL);
        done += step;
    }
    for (int i = 0; !st && i < cap; i++) {
        if (i > 0 && (st = forge__step(ds, out + i - 1, 1, 0, 1, FORGE__OUT_SAMPLE, &sp, NULL))) break;
        if ((st = forge__sample(ds, &greedy, cands, probs, out + i))) break;
        *n_out = i + 1;
    }
    return st;
}

/* Evaluates the drawn token tok and draft[0 .. k) at positions n_past .. n_past + k and draws
 * from each row in turn: accepted drafts are emitted (as generated tokens), *next gets the
 * first draw that is not a draft's (not yet evaluated), or -1 when generation stopped
 * (mt->stop_reason). The cache keeps tok and the accepted drafts but an emitted one that
 * ended generation, as a plain decode step would have left it. */
static forge_status forge__lookup_step(forge_session *s, const forge__lookup_ctx *x, int32_t tok, const int32_t *draft, int k,
                                       int32_t *next) {
    const forge_generate_params *p = x->p;
    const forge__tokenizer *tk = s->m->tok.n_vocab ? &s->m->tok : NULL;
    int V = s->m->cfg.n_vocab, n0 = s->n_past;
    int32_t rows[1 + FORGE__LOOKUP_MAX];
    rows[0] = tok;
    memcpy(rows + 1, draft, 4ull * (size_t)k);
    for (int i = 0; i <= k; i++) {
        forge__batch_row(s, (uint32_t)i, (uint32_t)(n0 + i), 0);
        forge__batch_temp(s, (uint32_t)i, p->temperature);
    }
    bool host = p->repeat_penalty != 1.0f; /* the penalty differs row by row: applied on the host */
    const float *logits = NULL;
    forge_status st = forge__batch_step(s, rows, (uint32_t)k + 1, 0, (uint32_t)k + 1,
                                        host ? FORGE__OUT_BATCH_PREFILL_LOGITS : FORGE__OUT_BATCH_PREFILL, &logits, x->red);
    if (st) return st;
    memcpy(s->history + n0, rows, 4ull * (size_t)(k + 1));
    s->n_past = n0 + k + 1;
    s->kv_high = FORGE__MAX(s->kv_high, s->n_past);
    x->mt->draft_tokens += k;
    int keep = n0 + 1;
    *next = -1;
    for (int i = 0; i <= k; i++) {
        int32_t t;
        const uint32_t *red = host ? NULL : x->red + (size_t)i * 2 * (1 + FORGE__CANDIDATES);
        if ((st = forge__draw_row(s, p, s->rng, host ? logits + (size_t)i * V : NULL, red, (uint32_t)i, s->history, n0 + 1 + i, x->cands,
                                  x->probs, x->row, &t)))
            break;
        if (i == k || t != draft[i]) { *next = t; break; }
        forge_stop_reason why;
        if (forge__is_stop_token(tk, p, t, &why)) { x->mt->stop_reason = why; break; }
        x->mt->draft_accepted++;
        if (!forge__emit(s->m, p, x->stop, x->ds, x->piece, x->piece_size, t, x->mt)) break;
        keep++;
    }
    s->n_past = keep;
    return st;
}

/* The caller's constraint compiled for this call into *g (NULL without one). */
static forge_status forge__constraint_for(forge_session *s, const forge_generate_params *p, forge__matcher **g) {
    *g = NULL;
    if (!p->constraint) return FORGE_OK;
    forge_status st = forge__check_sized(p->constraint, "forge_constraint", &s->err);
    if (st) return st;
    forge_constraint c;
    forge__constraint_in(p->constraint, &c);
    if (c.kind == FORGE_CONSTRAINT_NONE) return FORGE_OK;
    return forge__matcher_new(s->m, &c, p->ignore_eos, p->stop_tokens, p->n_stop_tokens, s->constraint_arm, g, &s->err);
}

#define FORGE__MAX_FORCED_STEP 64 /* forced tokens evaluated in one step with the drawn one */

/* Generates from prompt; a model with linear-attention layers checkpoints the prompt cache
 * (exec.c) after the first `snap` prompt tokens (-1: all but the last). */
static forge_status forge__generate_tokens(forge_session *s, const int32_t *prompt, int n_prompt, int snap,
                                          const forge_generate_params *params, forge_metrics *metrics) {
    forge_generate_params p;
    FORGE__COPY_PARAMS(p, params, forge_generate_default_params);
    forge_model *m = s->m;
    const int V = m->cfg.n_vocab;
    forge_metrics mt;
    memset(&mt, 0, sizeof mt);
    mt.struct_size = sizeof mt;
    double t0 = forge__now_s();
    if (!prompt || n_prompt <= 0) return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "generate needs a prompt of at least one token");
    if (n_prompt > s->n_ctx && s->overflow == FORGE_OVERFLOW_FAIL)
        return forge__fail(&s->err, FORGE_ERR_LIMIT, "the prompt has %d tokens; the session's context holds %d", n_prompt, s->n_ctx);
    char fault[96];
    if (forge__sampling_fault(fault, sizeof fault, p.max_tokens, p.repeat_window, p.temperature, p.top_p, p.min_p, p.repeat_penalty, p.top_k, p.lookup))
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "generate params: %s", fault);
    forge_status bad = forge__check_token_ids(s, prompt, n_prompt);
    if (bad) return bad;
    if (p.draft == s) return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "generate params: the draft session is this session");
    if (p.draft && p.draft->m->cfg.n_vocab != V)
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "generate params: the draft model's vocabulary has %d tokens; this model's has %d",
                           p.draft->m->cfg.n_vocab, V);
    if (p.draft && (forge__has_linear(&m->cfg) || forge__has_linear(&p.draft->m->cfg)))
        return forge__fail(&s->err, FORGE_ERR_UNSUPPORTED, "generate params: a draft model needs models without linear-attention layers "
                           "(their recurrent state cannot be cut back to drop rejected drafts); %s has them",
                           forge__has_linear(&m->cfg) ? "this model" : "the draft model");
    forge__matcher *g = NULL; /* the constraint, compiled before any work */
    if ((bad = forge__constraint_for(s, &p, &g))) return bad;
    forge__rng_seed(s->rng, p.seed);
    mt.prompt_tokens = n_prompt;
    int32_t *continued = NULL; /* the prompt without what slides dropped */
    if ((bad = forge__skip_dropped(s, prompt, &n_prompt, &continued))) {
        forge__matcher_free(g);
        return bad;
    }
    if (continued) prompt = continued;
    int slides0 = s->slides;
    mt.cached_tokens = forge__reuse_prefix(s, prompt, n_prompt, &mt.cache_wrapped);
    if (mt.cached_tokens > 0) s->prompt_cache_hits++;
    forge__cand *cands = (forge__cand *)malloc(sizeof *cands * (size_t)V);
    double *probs = (double *)malloc(sizeof *probs * (size_t)V);
    forge__cwork cw = {NULL, NULL, NULL};
    if (g) {
        cw.cands = (forge__cand *)malloc(sizeof *cw.cands * FORGE__CANDIDATES);
        cw.row = (float *)malloc(4ull * (size_t)V);
        cw.mask = (uint32_t *)malloc(4ull * g->words);
    }
    forge__stopper stop = {&p, NULL, 0, 0};
    const forge__tokenizer *tk = m->tok.n_vocab ? &m->tok : NULL; /* without one: no end tokens, no text */
    forge_status st = (cands && probs && (!g || (cw.cands && cw.row && cw.mask))) ? FORGE_OK : forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    forge__step_params sp = {0, 0, 0, p.repeat_penalty, p.temperature > 0 ? 1.0f / p.temperature : 0.0f, 0, {0, 0}};
    forge__out_mode sample_mode = FORGE__OUT_SAMPLE;
    bool masked = false; /* the last step applied the constraint's mask (forge__mask_step) */
    int window = FORGE__MIN(p.repeat_window, FORGE__MAX_PENALTY_WINDOW);
    /* prefill: all but the last chunk without outputs, the last one sampled; a step ends where
     * the checkpoint goes */
    int done = mt.cached_tokens;
    if (!forge__has_linear(&m->cfg)) snap = -1;
    else if (snap < 0 || snap >= n_prompt) snap = n_prompt - 1;
    while (!st && done < n_prompt) {
        if (forge__cancelled(p.cancel)) { mt.stop_reason = FORGE_STOP_CANCELLED; break; }
        if (done == snap && (st = forge__ckpt_take(s))) break;
        if (s->n_past == s->n_ctx && (st = forge__make_room(s, 1))) break; /* slides (prompts over n_ctx) */
        int step = FORGE__MIN(FORGE__MIN(n_prompt - done, s->n_batch), s->n_ctx - s->n_past);
        if (done < snap) step = FORGE__MIN(step, snap - done);
        bool last = done + step == n_prompt;
        if (last) /* the penalty window includes the prompt */
            sp.n_penalty = p.repeat_penalty != 1.0f ? forge__penalty_ids(s, prompt + done, step, window) : 0;
        if (last && (st = forge__mask_step(s, g, &p, cw.mask, &sp, &sample_mode, &masked))) break;
        st = forge__step(s, prompt + done, (uint32_t)step, (uint32_t)step - 1, last ? 1u : 0u,
                         last ? sample_mode : FORGE__OUT_LOGITS, &sp, NULL);
        done += step;
    }
    double t_prefill = forge__now_s();
    mt.prefill_ms = (t_prefill - t0) * 1e3;
    int evaluated = n_prompt - mt.cached_tokens;
    mt.prefill_tok_s = mt.prefill_ms > 0 ? evaluated / (mt.prefill_ms * 1e-3) : 0;
    forge_detok_stream ds;
    forge_detok_stream_init(&ds, 0);
    char piece[512];
    /* The text continues the prompt: the stream starts after its last token (when that is
     * ordinary text), so a decoder that strips the space at the start of a text (SentencePiece's
     * Strip) keeps the one between the prompt and the first generated word. */
    size_t primed = 0;
    if (tk && !forge_token_is_special(m, prompt[n_prompt - 1])) forge_detok_stream_next(m, &ds, prompt[n_prompt - 1], piece, sizeof piece, &primed);
    double t_first = t_prefill;
    if (p.max_tokens == 0 && !mt.stop_reason) mt.stop_reason = FORGE_STOP_MAX_TOKENS; /* the prompt only */
    int32_t steps[1 + FORGE__MAX_FORCED_STEP]; /* the tokens the next step evaluates: the drawn one, then forced ones */
    int n_steps = 0;
    bool forced_start = g != NULL; /* text the constraint forces from the start comes before any draw */
    int32_t carried = -1; /* the next token, drawn by a lookup step */
    int most = p.draft && !p.lookup ? FORGE__DRAFT_DEFAULT : p.lookup;
    forge__lookup_ctx lk = {&p, &mt, &stop, &ds, piece, sizeof piece, cands, probs, NULL, NULL, most, most, 0, 0};
    if (!st && most > 0 && !g && !forge__has_linear(&m->cfg)) {
        lk.row = (float *)malloc(4ull * (size_t)V);
        lk.red = (uint32_t *)malloc(8ull * (FORGE__LOOKUP_MAX + 1) * (1 + FORGE__CANDIDATES));
        if (!lk.row || !lk.red) st = forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    while (!st && !mt.stop_reason) {
        int32_t tok = -1;
        if (n_steps == 0 && !forced_start) { /* a draw from the last step's logits */
            if (g && (g->done || g->dead)) { mt.stop_reason = FORGE_STOP_CONSTRAINT; break; }
            if (carried >= 0) { /* a lookup step's draw */
                tok = carried;
                carried = -1;
            } else if ((st = g ? forge__sample_constrained(s, &p, g, &cw, masked, cands, probs, &tok) : forge__sample(s, &p, cands, probs, &tok))) {
                break;
            }
            if (mt.generated_tokens == 0) {
                t_first = forge__now_s();
                mt.ttft_ms = (t_first - t0) * 1e3;
            }
            if (tok < 0) { mt.stop_reason = FORGE_STOP_CONSTRAINT; break; } /* no token continues the constraint */
            forge_stop_reason why;
            if (forge__is_stop_token(tk, &p, tok, &why)) { mt.stop_reason = why; break; }
            if (g) forge__matcher_accept(g, tok);
            steps[n_steps++] = tok;
            if (!forge__emit(m, &p, &stop, &ds, piece, sizeof piece, tok, &mt)) break;
        }
        /* the text the constraint forces next, evaluated in the same step */
        if (g && !g->done && !g->dead) {
            int room = s->overflow == FORGE_OVERFLOW_FAIL ? s->n_ctx - s->n_past - n_steps : s->n_ctx - forge__slide_keep(s) - n_steps;
            int cap = FORGE__MIN(FORGE__MIN(FORGE__MAX_FORCED_STEP, s->n_batch - n_steps), FORGE__MIN(room, p.max_tokens - mt.generated_tokens));
            int k = forge__matcher_forced(g, steps + n_steps, cap);
            bool go = true;
            for (int i = 0; i < k && go; i++) {
                mt.forced_tokens++;
                go = forge__emit(m, &p, &stop, &ds, piece, sizeof piece, steps[n_steps + i], &mt);
                if (!go) n_steps += i + 1;
            }
            if (!go) break;
            n_steps += k;
            if (k && forced_start) { /* the prompt's logits are not drawn from: the forced tokens' are */
                t_first = forge__now_s();
                mt.ttft_ms = (t_first - t0) * 1e3;
            }
        }
        forced_start = false;
        if (g && (g->done || g->dead)) { mt.stop_reason = FORGE_STOP_CONSTRAINT; break; } /* matched: nothing to evaluate */
        if (n_steps == 0) continue;
        if (lk.red && n_steps == 1) { /* prompt lookup: drafts verified with the drawn token */
            /* as many rows as the sampler's buffers reduce, at most n_batch (the plan's): a rotating
             * layer's ring (window + n_batch - 1 slots) then still holds every position the kept
             * rows' successor attends to, so rejected rows can go */
            int cap = FORGE__MIN(FORGE__MIN(lk.span, s->n_reduced - 1), FORGE__MIN(s->n_ctx - s->n_past - 1, p.max_tokens - mt.generated_tokens));
            int32_t draft[FORGE__LOOKUP_MAX];
            int k = 0;
            if (lk.pause > 0) {
                lk.pause--;
            } else if (cap > 0) {
                s->history[s->n_past] = steps[0]; /* the sequence with the drawn token (n_past < n_ctx: cap > 0) */
                if (!p.draft) k = forge__lookup_draft(s->history, s->n_past + 1, cap, draft);
                else if ((st = forge__draft_tokens(p.draft, s->history, s->n_past + 1, cap, draft, &k, cands, probs))) {
                    forge__fail(&s->err, st, "the draft session: %s", p.draft->err.msg);
                    break;
                }
            }
            if (k > 0) {
                if (forge__cancelled(p.cancel)) { mt.stop_reason = FORGE_STOP_CANCELLED; break; }
                int kept0 = mt.draft_accepted;
                st = forge__lookup_step(s, &lk, steps[0], draft, k, &carried);
                /* the next draft's length: 2 more after a whole draft kept, else one past what was */
                lk.span = mt.draft_accepted - kept0 == k ? FORGE__MIN(lk.most, lk.span + 2) : mt.draft_accepted - kept0 + 1;
                lk.backoff = mt.draft_accepted > kept0 ? 0 : FORGE__MIN(2 * lk.backoff + 1, FORGE__DRAFT_BACKOFF_MAX);
                lk.pause = lk.backoff;
                n_steps = 0;
                continue;
            }
        }
        if (s->n_past + n_steps > s->n_ctx) {
            if (s->overflow == FORGE_OVERFLOW_FAIL) { mt.stop_reason = FORGE_STOP_CONTEXT; break; }
            if ((st = forge__make_room(s, n_steps))) break;
        }
        if (forge__cancelled(p.cancel)) { mt.stop_reason = FORGE_STOP_CANCELLED; break; }
        sp.n_penalty = p.repeat_penalty != 1.0f ? forge__penalty_ids(s, steps, n_steps, window) : 0;
        if ((st = forge__mask_step(s, g, &p, cw.mask, &sp, &sample_mode, &masked))) break;
        st = forge__step(s, steps, (uint32_t)n_steps, (uint32_t)n_steps - 1, 1, sample_mode, &sp, NULL);
        n_steps = 0;
    }
    if (!st && mt.stop_reason != FORGE_STOP_STRING && mt.stop_reason != FORGE_STOP_CALLBACK) {
        /* an unfinished character at the end, then held-back text that never became a stop string */
        size_t plen = 0, release = stop.len;
        bool found = false;
        if (tk && forge_detok_stream_flush(m, &ds, piece, sizeof piece, &plen) == FORGE_OK && plen)
            release = forge__stopper_push(&stop, piece, plen, &found);
        if (found) mt.stop_reason = FORGE_STOP_STRING;
        else release = stop.len;
        if (release && p.on_token) p.on_token(p.user_data, -1, forge__stopper_text(&stop), release);
    }
    double t_end = forge__now_s();
    mt.decode_ms = mt.generated_tokens > 0 ? (t_end - t_first) * 1e3 : 0;
    mt.decode_tok_s = mt.generated_tokens > 1 && mt.decode_ms > 0 ? (mt.generated_tokens - 1) / (mt.decode_ms * 1e-3) : 0;
    mt.peak_device_bytes = forge__mem_peak(&m->mem_total);
    mt.prompt_cache_hits = s->prompt_cache_hits;
    mt.context_slides = s->slides - slides0;
    if (g) {
        /* the last token max_tokens allowed also matched the constraint whole, with nothing that may follow */
        if (g->done && mt.stop_reason == FORGE_STOP_MAX_TOKENS) mt.stop_reason = FORGE_STOP_CONSTRAINT;
        mt.constraint_complete = g->complete && !g->dead && mt.stop_reason != FORGE_STOP_STRING;
        mt.constraint_masks = g->full_masks;
        mt.constraint_ms = g->ms;
    }
    s->metrics = mt;
    if (metrics) FORGE__PUT(metrics, mt);
    forge__matcher_free(g);
    free(lk.row);
    free(lk.red);
    free(cw.cands);
    free(cw.row);
    free(cw.mask);
    free(continued);
    free(stop.buf);
    free(cands);
    free(probs);
    return st;
}

/* The ids of text into a malloc'd array (*ids, *n); the model's message on failure. */
static forge_status forge__tokenize_alloc(forge_model *m, const char *text, size_t len, int add_special, int32_t **ids, size_t *n) {
    uint32_t flags = add_special ? FORGE_TOKENIZE_ADD_SPECIAL : 0;
    size_t cap = len + 16;
    *n = 0;
    *ids = (int32_t *)malloc(sizeof **ids * cap);
    if (!*ids) return FORGE_ERR_OUT_OF_MEMORY;
    forge_status st = forge_tokenize(m, text ? text : "", len, flags, *ids, cap, n);
    if (st == FORGE_ERR_BUFFER_TOO_SMALL) {
        int32_t *bigger = (int32_t *)realloc(*ids, sizeof **ids * *n);
        if (!bigger) return FORGE_ERR_OUT_OF_MEMORY;
        *ids = bigger;
        cap = *n;
        st = forge_tokenize(m, text ? text : "", len, flags, *ids, cap, n);
    }
    return st;
}

FORGE_API forge_status forge_generate_tokens(forge_session *s, const int32_t *prompt, int n_prompt,
                                             const forge_generate_params *params, forge_metrics *metrics) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    forge_status st = forge__check_sized(metrics, "forge_metrics", &s->err);
    if (st) return st;
    st = forge__slot_acquire(s->m, &s->err);
    if (st) return st;
    st = forge__generate_tokens(s, prompt, n_prompt, -1, params, metrics);
    forge__slot_release(s->m);
    return st;
}

/* forge_generate; with snap_len > 0 (forge_chat: where its generation prompt begins) the prompt
 * cache's checkpoint goes after the tokens of the text's first snap_len bytes, when they begin
 * the prompt's tokens. */
static forge_status forge__generate_text(forge_session *s, const char *prompt, size_t prompt_len, size_t snap_len,
                                         const forge_generate_params *params, forge_metrics *metrics) {
    if (!s || (!prompt && prompt_len)) return FORGE_ERR_INVALID_ARGUMENT;
    forge_status st = forge__check_sized(metrics, "forge_metrics", &s->err);
    if (st) return st;
    forge_generate_params p;
    FORGE__COPY_PARAMS(p, params, forge_generate_default_params);
    int32_t *ids = NULL, *head = NULL;
    size_t n = 0, n_head = 0;
    int snap = -1;
    st = forge__tokenize_alloc(s->m, prompt, prompt_len, p.add_special, &ids, &n);
    if (!st && snap_len > 0 && snap_len < prompt_len && forge__has_linear(&s->m->cfg) &&
        !forge__tokenize_alloc(s->m, prompt, snap_len, p.add_special, &head, &n_head) && n_head < n && !memcmp(head, ids, 4 * n_head))
        snap = (int)n_head;
    free(head);
    if (st == FORGE_ERR_OUT_OF_MEMORY) {
        forge__fail(&s->err, st, "out of host memory");
    } else if (st) {
        forge__fail(&s->err, st, "tokenizing the prompt: %s", forge_model_errmsg(s->m));
    } else if (n == 0) {
        st = forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "the prompt is empty and the tokenizer adds no BOS: nothing to generate from");
    } else if (!(st = forge__slot_acquire(s->m, &s->err))) {
        st = forge__generate_tokens(s, ids, (int)n, snap, &p, metrics);
        forge__slot_release(s->m);
    }
    free(ids);
    return st;
}

FORGE_API forge_status forge_generate(forge_session *s, const char *prompt, size_t prompt_len,
                                      const forge_generate_params *params, forge_metrics *metrics) {
    return forge__generate_text(s, prompt, prompt_len, 0, params, metrics);
}

FORGE_API forge_status forge_warm(forge_session *s, const int32_t *tokens, int n_tokens) {
    if (!s || !tokens || n_tokens <= 0) return FORGE_ERR_INVALID_ARGUMENT;
    int32_t *continued = NULL; /* the tokens without what slides dropped */
    forge_status st = forge__skip_dropped(s, tokens, &n_tokens, &continued);
    if (st) return st;
    if (continued) tokens = continued;
    int wrapped = 0, kept = 0;
    if (!(st = forge__slot_acquire(s->m, &s->err))) { /* the prefix may restart from a checkpoint, on the device */
        kept = forge__reuse_prefix(s, tokens, n_tokens, &wrapped);
        forge__slot_release(s->m);
    }
    if (!st && kept < n_tokens) st = forge_eval(s, tokens + kept, n_tokens - kept, 0, NULL, 0);
    free(continued);
    return st;
}

FORGE_API forge_status forge_session_metrics(const forge_session *cs, forge_metrics *metrics) {
    if (!cs || !metrics) return FORGE_ERR_INVALID_ARGUMENT;
    forge_session *s = (forge_session *)cs; /* the error slot is the one part a const call may write */
    forge_status st = forge__check_sized(metrics, "forge_metrics", &s->err);
    if (st) return st;
    FORGE__PUT(metrics, s->metrics);
    return FORGE_OK;
}

