/* src/classify.c: Classify.
 * Owns: forge_classify.
 * May call: base.c, tokenizer.c, device.c, model.c, session.c, exec.c, api.c, generate.c.
 *
 * Many prompts, one forward pass per batch, no decode loop. A batch is B prompts right-padded
 * to T tokens and run as B sequences at positions 0 .. T-1 (the pass's batch mode, as the
 * trainer runs it: keys of sequence b in cache rows b*T .., the session's cache used as
 * scratch); then each prompt's last real row is gathered, normed and put through the head
 * (FORGE__OUT_CLASSIFY in forward.c). Padding rows come after every real row of their
 * sequence, so causal attention never lets a real token see one.
 */

FORGE_API forge_classify_params forge_classify_default_params(void) {
    forge_classify_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.add_special = 1;
    return p;
}

/* Draws from one full logits row: the argmax at temperature 0 (ties to the lower id), else
 * the generate sampler over the sorted row with its exact normalizer. NaN counts as -inf, as
 * in the device reduction; -1 when no logit is finite-or-+inf. */
static int32_t forge__classify_draw(const float *row, int V, const forge_classify_params *cp, uint64_t rng[4], forge__cand *cands,
                                    double *probs) {
    int best = -1;
    for (int i = 0; i < V; i++)
        if (!isnan(row[i]) && row[i] > -INFINITY && (best < 0 || row[i] > row[best])) best = i;
    if (best < 0 || cp->temperature <= 0.0f) return best;
    forge_generate_params gp = forge_generate_default_params();
    gp.temperature = cp->temperature;
    gp.top_k = cp->top_k;
    gp.top_p = cp->top_p;
    gp.min_p = cp->min_p;
    double M = row[best], S = 0;
    if (!isfinite(M)) return best; /* +inf: all the probability on the first such logit */
    for (int i = 0; i < V; i++) {
        float l = isnan(row[i]) ? -INFINITY : row[i];
        cands[i] = (forge__cand){l, i};
        S += exp(((double)l - M) / cp->temperature);
    }
    forge__sort_cands(cands, V);
    return forge__sample_candidates(cands, V, 1, M, S, &gp, rng, probs);
}

/* A token callback that appends the text to a forge__buf. */
static int forge__classify_collect(void *u, int32_t tok, const char *text, size_t n) {
    (void)tok;
    forge__buf_put((forge__buf *)u, text, n);
    return 0;
}

/* The choice a classify draw has made: the first choice that is the text so far (`ended`: the
 * end token was drawn) or the only one it begins; -1 while several remain. */
static int forge__classify_choice(const forge_constraint *c, const char *text, size_t n, bool ended) {
    int only = -1, count = 0;
    for (int i = 0; i < c->n_choices; i++) {
        size_t l = strlen(c->choices[i]);
        if (ended ? (l == n && !memcmp(c->choices[i], text, n)) : (l >= n && !memcmp(c->choices[i], text, n))) {
            if (ended) return i;
            bool dup = false; /* the same string twice counts once (its first index) */
            for (int j = 0; j < i && !dup; j++) dup = !strcmp(c->choices[j], c->choices[i]);
            if (!dup) count++;
            if (only < 0) only = i;
        }
    }
    return count == 1 ? only : -1;
}

/* Finishes a choice the first token left open: generates the rest of it as forge_generate would
 * (the prompt and the token, the choices that token begins, cut to what follows it). */
static forge_status forge__classify_finish_choice(forge_session *s, const forge_classify_params *cp, const forge_constraint *c, const int32_t *prompt,
                                                  int n, int32_t tok, const char *text, size_t tn, uint64_t seed, int *choice) {
    *choice = -1;
    int32_t *ids = (int32_t *)malloc(4ull * ((size_t)n + 1));
    const char **rest = (const char **)malloc(sizeof *rest * (size_t)c->n_choices);
    int *from = (int *)malloc(sizeof *from * (size_t)c->n_choices);
    if (!ids || !rest || !from) {
        free(ids);
        free((void *)rest);
        free(from);
        return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    memcpy(ids, prompt, 4ull * (size_t)n);
    ids[n] = tok;
    int k = 0;
    size_t longest = 0;
    for (int i = 0; i < c->n_choices; i++)
        if (strlen(c->choices[i]) >= tn && !memcmp(c->choices[i], text, tn)) {
            from[k] = i;
            rest[k++] = c->choices[i] + tn;
            longest = FORGE__MAX(longest, strlen(c->choices[i]) - tn);
        }
    forge_constraint rc = *c;
    rc.kind = FORGE_CONSTRAINT_CHOICES;
    rc.choices = rest;
    rc.n_choices = k;
    rc.trigger = NULL;
    forge__buf out;
    forge__buf_init(&out, NULL, 0);
    forge_generate_params gp = forge_generate_default_params();
    gp.temperature = cp->temperature;
    gp.top_k = cp->top_k;
    gp.top_p = cp->top_p;
    gp.min_p = cp->min_p;
    gp.seed = seed;
    gp.max_tokens = (int)FORGE__MIN(longest + 2, (size_t)INT_MAX / 2);
    gp.constraint = &rc;
    gp.on_token = forge__classify_collect;
    gp.user_data = &out;
    forge_metrics mt;
    memset(&mt, 0, sizeof mt);
    mt.struct_size = sizeof mt; /* forge__generate_tokens writes only what struct_size says */
    forge_status st = forge__generate_tokens(s, ids, n + 1, -1, &gp, &mt);
    if (!st && !out.oom) {
        bool ended = mt.stop_reason == FORGE_STOP_EOS || mt.stop_reason == FORGE_STOP_CONSTRAINT;
        for (int i = 0; i < k && *choice < 0; i++)
            if (ended && strlen(rest[i]) == out.n && !memcmp(rest[i], out.p ? out.p : "", out.n)) *choice = from[i];
    }
    forge__buf_free(&out);
    free(ids);
    free((void *)rest);
    free(from);
    return st;
}

/* The text of `tok` continuing a prompt that ends in `prev` (primed as generation primes its
 * stream), appended NUL-terminated to out. */
static forge_status forge__classify_text(forge_model *m, int32_t prev, int32_t tok, forge__buf *out) {
    char piece[1024];
    size_t len = 0, more = 0;
    forge_detok_stream ds;
    forge_detok_stream_init(&ds, 0);
    forge_status st = FORGE_OK;
    if (!forge_token_is_special(m, prev)) st = forge_detok_stream_next(m, &ds, prev, piece, sizeof piece, &len);
    if (!st) st = forge_detok_stream_next(m, &ds, tok, piece, sizeof piece, &len);
    if (!st) st = forge_detok_stream_flush(m, &ds, piece + len, sizeof piece - len, &more);
    if (st) return st;
    forge__buf_put(out, piece, len + more + 1);
    return out->oom ? FORGE_ERR_OUT_OF_MEMORY : FORGE_OK;
}

/* ---- Batches of sequences (classify, embed, rerank) ----
 * Sequences sorted by length (stable) are cut into batches of B right-padded to T (the
 * longest, rounded up to 8, capped at n_batch) where B x T would pass n_batch or B max_b; a
 * batch runs as one pass of the session in classify's layout. */

/* Whether sequence i (`what` i: "prompt 3", "text 3") can run: not empty, within the model's
 * context, the session's n_ctx and n_batch, its ids inside the vocabulary. */
static forge_status forge__batch_check(forge_session *s, const char *what, int i, const int32_t *t, int len) {
    forge_model *m = s->m;
    if (len <= 0) return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "%s %d is empty (and the tokenizer adds no BOS)", what, i);
    if (len > m->cfg.n_ctx_train)
        return forge__fail(&s->err, FORGE_ERR_LIMIT, "%s %d has %d tokens, more than the model's context of %d (n_ctx_train)", what, i, len,
                           m->cfg.n_ctx_train);
    if (len > s->n_ctx)
        return forge__fail(&s->err, FORGE_ERR_LIMIT, "%s %d has %d tokens, more than the session's context of %d (n_ctx)", what, i, len, s->n_ctx);
    if (len > s->n_batch)
        return forge__fail(&s->err, FORGE_ERR_LIMIT, "%s %d has %d tokens; a batch holds %d (the session's n_batch)", what, i, len, s->n_batch);
    for (int j = 0; j < len; j++)
        if (t[j] < 0 || t[j] >= m->cfg.n_vocab)
            return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "%s %d: token %d (at index %d) is outside the vocabulary of %d", what, i, t[j], j,
                               m->cfg.n_vocab);
    return FORGE_OK;
}

/* order[0 .. n) = the sequences by length, stable (insertion sort: n is small or nearly sorted). */
static void forge__batch_sort(const int *lens, int *order, int n) {
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && lens[order[j - 1]] > lens[order[j]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
}

/* The most sequences a batch holds: the output rows, and for Qwen 3.5's linear-attention layers
 * the session's recurrent-state places (each prompt keeps its state in one). */
static int forge__batch_max(const forge_session *s) {
    int max_b = FORGE__MIN(s->n_out_max, FORGE__MAX_PENALTY_WINDOW);
    if (forge__has_linear(&s->m->cfg)) max_b = FORGE__MIN(max_b, s->n_seq);
    return max_b;
}

/* The batch starting at order[b0]: returns its B, its padded length in *T. */
static int forge__batch_cut(const forge_session *s, const int *lens, const int *order, int n, int b0, int *T) {
    int B = 0, max_b = forge__batch_max(s);
    *T = 0;
    while (b0 + B < n && B < max_b) {
        int t = (int)FORGE__MIN(forge__align_up((uint64_t)lens[order[b0 + B]], 8), (uint64_t)s->n_batch);
        if ((int64_t)(B + 1) * t > s->n_batch) break;
        *T = t; /* sorted: the newest sequence is the longest */
        B++;
    }
    return B;
}

/* Runs sequences order[b0 .. b0 + B) right-padded to T as one pass of `mode`: their tokens and
 * the row table (rows[k]: the row of sequence k that the pass reads, e.g. its last) in the io
 * buffer, the recording submitted and waited for. The output is then in the readback buffer. */
static forge_status forge__batch_pass(forge_session *s, const int32_t *const *toks, const int *lens, const int *order, int b0, int B, int T,
                                      forge__out_mode mode, const uint32_t *rows) {
    forge_model *m = s->m;
    uint32_t *io_tokens = (uint32_t *)((uint8_t *)s->io.mapped + s->tokens_r.offset);
    uint32_t *io_rows = (uint32_t *)((uint8_t *)s->io.mapped + s->penalty_r.offset);
    memset(io_tokens, 0, 4ull * (size_t)B * (size_t)T);
    for (int k = 0; k < B; k++) {
        int i = order[b0 + k];
        memcpy(io_tokens + (size_t)k * (size_t)T, toks[i], 4ull * (size_t)lens[i]);
        io_rows[k] = rows[k];
    }
    forge__recording *rc;
    forge_status st = forge__get_recording(s, (uint32_t)(B * T), (uint32_t)T, (uint32_t)B, mode, &rc);
    if (st) return st;
    forge__step_params sp = {0, (uint32_t)(B * T), 0, 1.0f, 1.0f, 0, {0, 0}};
    memcpy(s->io.mapped, &sp, sizeof sp);
    if ((st = forge__recording_submit(m, rc, s->fence, &s->err))) return st;
    if (rc->qpool) forge__profile_collect(&m->dev, &s->prof, rc);
    return FORGE_OK;
}

/* The readback's rows after a pass: B rows of `cols` floats into rows. */
static void forge__batch_read(forge_session *s, int B, int cols, float *rows) {
    uint64_t bytes = 4ull * (uint64_t)B * (uint64_t)cols;
    forge__readback_invalidate(&s->m->dev, &s->readback, FORGE__RB_LOGITS_OFFSET, bytes);
    memcpy(rows, (uint8_t *)s->readback.mapped + FORGE__RB_LOGITS_OFFSET, (size_t)bytes);
}

/* A batched call's metrics: its tokens and time (prefill_ms, prefill_tok_s). */
static void forge__batch_metrics(forge_session *s, int64_t total, double t0) {
    forge_metrics mt;
    memset(&mt, 0, sizeof mt);
    mt.struct_size = sizeof mt;
    mt.prompt_tokens = (int)FORGE__MIN(total, (int64_t)INT_MAX);
    mt.prefill_ms = (forge__now_s() - t0) * 1e3;
    mt.prefill_tok_s = mt.prefill_ms > 0 ? (double)total / (mt.prefill_ms * 1e-3) : 0;
    mt.peak_device_bytes = forge__mem_peak(&s->m->mem_total);
    mt.prompt_cache_hits = s->prompt_cache_hits;
    s->metrics = mt;
}

static forge_status forge__classify(forge_session *s, const forge_classify_prompt *prompts, int n_prompts,
                                    const forge_classify_params *params, forge_classify_result *results) {
    forge_classify_params p;
    FORGE__COPY_PARAMS(p, params, forge_classify_default_params);
    char fault[96];
    if (forge__sampling_fault(fault, sizeof fault, 0, 0, p.temperature, p.top_p, p.min_p, 1.0f, p.top_k, 0))
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "classify params: %s", fault);
    forge_model *m = s->m;
    const int V = m->cfg.n_vocab;
    if (m->cfg.bidirectional || m->cfg.n_labels || m->cfg.no_head)
        return forge__fail(&s->err, FORGE_ERR_UNSUPPORTED, "classify draws the next token, and this model has %s: use forge_embed or forge_rerank",
                           m->cfg.bidirectional ? "bidirectional attention (an embedding model)"
                           : m->cfg.no_head     ? "no LM head (an embedding model)"
                                                : "a sequence classifier's head");
    if (p.logits && p.logits_capacity < (size_t)n_prompts * (size_t)V)
        return forge__fail(&s->err, FORGE_ERR_BUFFER_TOO_SMALL, "logits buffer holds %zu floats; %d prompts x %d need %zu", p.logits_capacity,
                           n_prompts, V, (size_t)n_prompts * (size_t)V);
    const forge__tokenizer *tk = m->tok.n_vocab ? &m->tok : NULL; /* without one: no text */
    /* a constraint: the first token is drawn among those its start allows (one mask for all) */
    forge_constraint con;
    memset(&con, 0, sizeof con);
    forge__matcher *g = NULL;
    uint32_t *allow = NULL;
    if (p.constraint) {
        forge_status cs = forge__check_sized(p.constraint, "forge_constraint", &s->err);
        if (cs) return cs;
        forge__constraint_in(p.constraint, &con);
        if (con.trigger) return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "classify: a constraint with a trigger (classify draws one token)");
        if (con.kind != FORGE_CONSTRAINT_NONE) {
            if ((cs = forge__matcher_new(m, &con, 0, NULL, 0, NULL, &g, &s->err))) return cs;
            allow = (uint32_t *)malloc(4ull * g->words);
            cs = allow ? forge__matcher_mask(g, allow) : forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
            if (cs && allow) forge__fail(&s->err, cs, "%s", g->err.msg);
            if (cs) {
                forge__matcher_free(g);
                free(allow);
                return cs;
            }
        }
    }
    double t0 = forge__now_s();
    s->n_past = 0; /* the cache is scratch from here on */
    s->n_dropped = 0;
    s->class_text.n = 0;
    /* every prompt's ids (text tokenized here, token prompts borrowed) */
    int32_t **ids = (int32_t **)calloc((size_t)n_prompts + 1, sizeof *ids);
    int *lens = (int *)calloc((size_t)n_prompts + 1, sizeof *lens);
    int *order = (int *)malloc(sizeof *order * ((size_t)n_prompts + 1));
    const int32_t **toks = (const int32_t **)calloc((size_t)n_prompts + 1, sizeof *toks);
    size_t *text_at = (size_t *)malloc(sizeof *text_at * ((size_t)n_prompts + 1));
    forge__cand *cands = (forge__cand *)malloc(sizeof *cands * (size_t)V);
    double *probs = (double *)malloc(sizeof *probs * (size_t)V);
    float *rows = (float *)malloc(sizeof *rows * (size_t)V * (size_t)FORGE__MIN(s->n_out_max, FORGE__MAX_PENALTY_WINDOW));
    float *masked = allow ? (float *)malloc(4ull * (size_t)V) : NULL;
    uint8_t *open = allow && con.kind == FORGE_CONSTRAINT_CHOICES ? (uint8_t *)calloc((size_t)n_prompts + 1, 1) : NULL;
    forge_status st = FORGE_OK;
    if (!ids || !lens || !order || !toks || !text_at || !cands || !probs || !rows || (allow && !masked) ||
        (allow && con.kind == FORGE_CONSTRAINT_CHOICES && !open))
        st = forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    int64_t total = 0;
    for (int i = 0; i < n_prompts && !st; i++) {
        const forge_classify_prompt *q = &prompts[i];
        if (q->text && !tk) {
            st = forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "prompt %d is text, and the model has no tokenizer: give token ids", i);
        } else if (q->text) {
            size_t n = 0;
            st = forge__tokenize_alloc(m, q->text, q->text_len, p.add_special, &ids[i], &n);
            if (st == FORGE_ERR_OUT_OF_MEMORY) forge__fail(&s->err, st, "out of host memory");
            else if (st) forge__fail(&s->err, st, "prompt %d: tokenizing: %s", i, forge_model_errmsg(m));
            lens[i] = (int)FORGE__MIN(n, (size_t)INT_MAX);
        } else {
            if (q->n_tokens > 0 && !q->tokens) { st = forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "prompt %d: n_tokens %d but no tokens", i, q->n_tokens); break; }
            lens[i] = q->n_tokens;
        }
        if (st) break;
        toks[i] = q->text ? ids[i] : q->tokens;
        st = forge__batch_check(s, "prompt", i, toks[i], lens[i]);
        total += lens[i];
    }
    if (!st) forge__batch_sort(lens, order, n_prompts);
    for (int b0 = 0; b0 < n_prompts && !st;) {
        if (forge__cancelled(p.cancel)) {
            st = forge__fail(&s->err, FORGE_ERR_CANCELLED, "classify was cancelled after %d of %d prompts", b0, n_prompts);
            break;
        }
        int T, B = forge__batch_cut(s, lens, order, n_prompts, b0, &T);
        uint32_t rows_k[FORGE__MAX_PENALTY_WINDOW];
        for (int k = 0; k < B; k++) rows_k[k] = (uint32_t)(k * T + lens[order[b0 + k]] - 1); /* each prompt's last row */
        if ((st = forge__batch_pass(s, toks, lens, order, b0, B, T, FORGE__OUT_CLASSIFY, rows_k))) break;
        forge__batch_read(s, B, V, rows);
        for (int k = 0; k < B && !st; k++) {
            int i = order[b0 + k];
            const float *row = rows + (size_t)k * (size_t)V;
            if (p.logits) memcpy(p.logits + (size_t)i * (size_t)V, row, 4ull * (size_t)V);
            uint64_t rng[4];
            forge__rng_seed(rng, p.seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(i + 1)));
            if (allow) { /* the tokens the constraint does not allow at -inf */
                for (int t = 0; t < V; t++) masked[t] = (allow[t >> 5] >> (t & 31)) & 1 ? row[t] : -INFINITY;
                row = masked;
            }
            int32_t tok = forge__classify_draw(row, V, &p, rng, cands, probs);
            if (tok < 0 && allow) { st = forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "prompt %d: the constraint allows no token with a finite logit", i); break; }
            if (tok < 0 || tok >= V) { st = forge__fail(&s->err, FORGE_ERR_DEVICE, "prompt %d: no token drawn (non-finite logits?)", i); break; }
            results[i] = (forge_classify_result){sizeof results[i], tok, lens[i], NULL, 0, -1};
            if (open) { /* which choice the token makes, or open for more tokens */
                uint32_t tn = 0;
                const uint8_t *tb = g->is_end[tok] ? (const uint8_t *)"" : forge__vocab_tok(g->voc, tok, &tn);
                results[i].choice = forge__classify_choice(&con, (const char *)tb, tn, g->is_end[tok] != 0);
                open[i] = results[i].choice < 0 && !g->is_end[tok];
            }
            text_at[i] = SIZE_MAX;
            if (tk) {
                const int32_t *t = toks[i];
                text_at[i] = s->class_text.n;
                if ((st = forge__classify_text(m, t[lens[i] - 1], tok, &s->class_text)))
                    forge__fail(&s->err, st, "prompt %d: the text of token %d: %s", i, tok, forge_model_errmsg(m));
                else results[i].text_len = s->class_text.n - 1 - text_at[i];
            }
        }
        b0 += B;
    }
    /* choices the first token left open: the rest of each as generate writes it */
    for (int i = 0; open && i < n_prompts && !st; i++) {
        if (!open[i]) continue;
        uint32_t tn = 0;
        const uint8_t *tb = forge__vocab_tok(g->voc, results[i].token, &tn);
        const int32_t *t = toks[i];
        st = forge__classify_finish_choice(s, &p, &con, t, lens[i], results[i].token, (const char *)tb, tn,
                                           p.seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(i + 1)) ^ 0x5bd1e995ull, &results[i].choice);
        s->n_past = 0;
    }
    /* the texts' addresses once the buffer stops growing */
    for (int i = 0; i < n_prompts && !st; i++)
        if (text_at[i] != SIZE_MAX) results[i].text = s->class_text.p + text_at[i];
    forge__batch_metrics(s, total, t0);
    for (int i = 0; ids && i < n_prompts; i++) free(ids[i]);
    free(ids);
    free(lens);
    free(order);
    free((void *)toks);
    free(text_at);
    free(cands);
    free(probs);
    free(rows);
    free(masked);
    free(open);
    free(allow);
    forge__matcher_free(g);
    return st;
}

FORGE_API forge_status forge_classify(forge_session *s, const forge_classify_prompt *prompts, int n_prompts,
                                      const forge_classify_params *params, forge_classify_result *results) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    if (n_prompts < 0 || (n_prompts > 0 && (!prompts || !results)))
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "classify needs prompts and results for n_prompts (%d) >= 0", n_prompts);
    forge_status st;
    if (n_prompts > 0 && ((st = forge__check_sized(prompts, "forge_classify_prompt", &s->err)) ||
                          (st = forge__check_sized(results, "forge_classify_result", &s->err))))
        return st;
    /* the caller's arrays as forge's structs (their sizes may be an older forge.h's) */
    forge_classify_prompt *own_prompts = (forge_classify_prompt *)forge__array_in(prompts, n_prompts, sizeof *own_prompts);
    forge_classify_result *own_results = (forge_classify_result *)calloc(n_prompts > 0 ? (size_t)n_prompts : 1, sizeof *own_results);
    if (!own_prompts || !own_results) {
        free(own_prompts);
        free(own_results);
        return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    st = forge__slot_acquire(s->m, &s->err);
    if (!st) {
        st = forge__classify(s, own_prompts, n_prompts, params, own_results);
        forge__slot_release(s->m);
        if (!st) forge__array_out(results, own_results, n_prompts, sizeof *own_results);
    }
    free(own_prompts);
    free(own_results);
    return st;
}

