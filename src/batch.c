/* src/batch.c: Batch generation.
 * Owns: forge_generate_batch.
 * May call: base.c, tokenizer.c, device.c, ops.c, model.c, session.c, exec.c, api.c, generate.c.
 *
 * Several sequences on one session, each in its own place of the KV cache (n_seq places of
 * slots[l] slots in every layer). A prompt is prefilled into its place alone; then every decode
 * step runs the current token of each live sequence as one row of the same products, and the
 * attention of each row reads its own place. The row table (position, place per row), written
 * into the io buffer after the step params, is what rope and the attention kernels read in
 * place of pos0. Each output row ends in the device's reduction as generate's decode step does
 * (candidates and normalizer, at the row's own temperature), and the host draws with
 * generate's rules; a step where some sequence has a repeat penalty reads back the logits
 * rows instead and applies it on the host. Stop rules and callbacks are generate's, per
 * sequence. A finished sequence leaves its place to the next item.
 */

/* One place: the item it runs and that item's generate state. */
typedef struct forge__bseq {
    int item;                      /* -1: the place is free */
    forge_generate_params p;
    int32_t *hist;                 /* [n_ctx] the tokens in the place's cache */
    int n_past;
    int32_t next;                  /* the drawn token the next step evaluates */
    uint64_t rng[4];
    forge__stopper stop;
    forge_detok_stream ds;
    forge_metrics mt;
    double t0, t_first;
    forge__matcher *g;             /* the item's constraint, NULL without one */
    int32_t forced[FORGE__MAX_FORCED_STEP]; /* forced tokens still to evaluate, one a step */
    int n_forced, at_forced;
} forge__bseq;

/* The host scratch of a call. */
typedef struct forge__bwork {
    forge__cand *cands;            /* [n_vocab] */
    double *probs;                 /* [n_vocab] */
    float *row;                    /* [n_vocab] a row after the repeat penalty, or fetched for a draw */
    uint32_t *red;                 /* [n_seq, 1 + FORGE__CANDIDATES] uvec2: the device's reduction per row */
    int32_t *tokens;               /* [n_seq] the rows of a decode step */
    int *place;                    /* [n_seq] the place of each row */
    forge__cand *top;              /* [FORGE__CANDIDATES] a constrained draw's candidates */
    uint32_t *mask;                /* [n_vocab / 32 + 1] a constrained draw's whole mask */
    char piece[512];
} forge__bwork;

typedef struct forge__batch_rowctx {
    forge_session *s;
    uint32_t row;
} forge__batch_rowctx;
static forge_status forge__batch_fetch_cb(void *ctx, float *row) {
    forge__batch_rowctx *c = (forge__batch_rowctx *)ctx;
    return forge__batch_fetch_row(c->s, c->row, row);
}

/* Draws a sequence's next token from out row `out_row` of the step: the constraint's draw with
 * one, else forge__draw_row's (the device's reduction red, or the logits row under the
 * sequence's repeat penalty). */
static forge_status forge__batch_draw(forge_session *s, forge__bseq *q, const float *row, const uint32_t *red, uint32_t out_row,
                                      forge__bwork *w, int32_t *out) {
    const forge_generate_params *p = &q->p;
    int V = s->m->cfg.n_vocab;
    if (q->g) { /* generate's constrained draw, on the device's reduction or the host's of the row */
        forge__batch_rowctx ctx = {s, out_row};
        forge__draw_src src = {w->top, FORGE__MIN(FORGE__CANDIDATES, V), 0, 0, NULL, forge__batch_fetch_cb, &ctx};
        if (red) {
            float M, S;
            memcpy(&M, &red[0], 4);
            memcpy(&S, &red[1], 4);
            src.M = M;
            src.S = S;
            for (int i = 0; i < src.n; i++) {
                memcpy(&w->top[i].logit, &red[2 + 2 * i], 4);
                w->top[i].id = (int32_t)red[3 + 2 * i];
            }
        } else {
            row = forge__penalize_row(row, V, q->hist, q->n_past, p, w->row);
            forge__reduce_row_on_host(row, V, src.n, p->temperature > 0.0f ? 1.0 / p->temperature : 0.0, w->top, &src.M, &src.S);
            src.row = row;
        }
        return forge__draw_constrained(q->g, p, q->rng, &src, V, w->cands, w->probs, w->row, w->mask, out, &s->err);
    }
    return forge__draw_row(s, p, q->rng, row, red, out_row, q->hist, q->n_past, w->cands, w->probs, w->row, out);
}

/* Takes the token a sequence drew through generate's stop rules and callback: true when the
 * sequence goes on with it, false when it has ended (q->mt.stop_reason says why). */
static bool forge__batch_take(forge_session *s, forge__bseq *q, int32_t tok, bool forced, forge__bwork *w) {
    forge_model *m = s->m;
    const forge__tokenizer *tk = m->tok.n_vocab ? &m->tok : NULL;
    if (q->mt.generated_tokens == 0 && !q->t_first) {
        q->t_first = forge__now_s();
        q->mt.ttft_ms = (q->t_first - q->t0) * 1e3;
    }
    if (tok < 0) { q->mt.stop_reason = FORGE_STOP_CONSTRAINT; return false; } /* no token continues the constraint */
    forge_stop_reason why;
    if (!forced && forge__is_stop_token(tk, &q->p, tok, &why)) { q->mt.stop_reason = why; return false; }
    if (q->g && !forced) forge__matcher_accept(q->g, tok);
    if (forced) q->mt.forced_tokens++;
    q->mt.generated_tokens++;
    size_t plen = 0;
    if (!tk || forge_detok_stream_next(m, &q->ds, tok, w->piece, sizeof w->piece, &plen) != FORGE_OK) plen = 0;
    bool found = false;
    size_t release = forge__stopper_push(&q->stop, w->piece, plen, &found);
    if (q->p.on_token && q->p.on_token(q->p.user_data, tok, forge__stopper_text(&q->stop), release)) {
        forge__stopper_consume(&q->stop, release);
        q->mt.stop_reason = FORGE_STOP_CALLBACK;
        return false;
    }
    forge__stopper_consume(&q->stop, release);
    if (found) { q->mt.stop_reason = FORGE_STOP_STRING; q->stop.len = 0; return false; }
    if (q->g && q->at_forced == q->n_forced && q->g->done) { q->mt.stop_reason = FORGE_STOP_CONSTRAINT; return false; } /* before max_tokens: the match is whole */
    if (q->mt.generated_tokens >= q->p.max_tokens) { q->mt.stop_reason = FORGE_STOP_MAX_TOKENS; return false; }
    if (q->n_past >= s->n_ctx) { q->mt.stop_reason = FORGE_STOP_CONTEXT; return false; }
    if (forge__cancelled(q->p.cancel)) { q->mt.stop_reason = FORGE_STOP_CANCELLED; return false; }
    if (q->g && q->at_forced == q->n_forced) { /* (forced tokens still queued come first) */
        if (q->g->dead) { q->mt.stop_reason = FORGE_STOP_CONSTRAINT; return false; }
        /* the text the constraint forces next: one token a step, no draws */
        int cap = FORGE__MIN(FORGE__MIN(FORGE__MAX_FORCED_STEP, q->p.max_tokens - q->mt.generated_tokens), s->n_ctx - q->n_past - 1);
        q->n_forced = forge__matcher_forced(q->g, q->forced, cap);
        q->at_forced = 0;
    }
    q->next = tok;
    return true;
}

/* Ends a sequence: the held-back text as generate delivers it, the metrics, the place freed. */
static void forge__batch_finish(forge_session *s, forge__bseq *q, forge_batch_result *res, forge__bwork *w) {
    forge_model *m = s->m;
    if (q->mt.stop_reason != FORGE_STOP_STRING && q->mt.stop_reason != FORGE_STOP_CALLBACK) {
        size_t plen = 0, release = q->stop.len;
        bool found = false;
        if (m->tok.n_vocab && forge_detok_stream_flush(m, &q->ds, w->piece, sizeof w->piece, &plen) == FORGE_OK && plen)
            release = forge__stopper_push(&q->stop, w->piece, plen, &found);
        if (found) q->mt.stop_reason = FORGE_STOP_STRING;
        else release = q->stop.len;
        if (release && q->p.on_token) q->p.on_token(q->p.user_data, -1, forge__stopper_text(&q->stop), release);
    }
    double t_end = forge__now_s();
    q->mt.decode_ms = q->mt.generated_tokens > 0 ? (t_end - q->t_first) * 1e3 : 0;
    q->mt.decode_tok_s = q->mt.generated_tokens > 1 && q->mt.decode_ms > 0 ? (q->mt.generated_tokens - 1) / (q->mt.decode_ms * 1e-3) : 0;
    q->mt.peak_device_bytes = forge__mem_peak(&m->mem_total);
    q->mt.prompt_cache_hits = s->prompt_cache_hits;
    if (q->g) {
        q->mt.constraint_complete = q->g->complete && !q->g->dead && q->mt.stop_reason != FORGE_STOP_STRING;
        q->mt.constraint_masks = q->g->full_masks;
        q->mt.constraint_ms = q->g->ms;
    }
    res->status = FORGE_OK;
    res->metrics = q->mt;
    s->metrics = q->mt;
    free(q->stop.buf);
    q->stop.buf = NULL;
    forge__matcher_free(q->g);
    q->g = NULL;
    q->item = -1;
}

/* Starts item `it` in place b: checks it, prefills its prompt, draws its first token. A failure
 * of the item goes to res (FORGE_OK returned); a device failure is returned. */
static forge_status forge__batch_start(forge_session *s, forge__bseq *q, int b, const forge_batch_item *it, int idx,
                                       forge_batch_result *res, forge__bwork *w) {
    forge_model *m = s->m;
    int32_t *owned = NULL;
    const int32_t *prompt = it->tokens;
    int n = it->n_tokens;
    forge_status st = FORGE_OK;
    int32_t *hist = q->hist;
    memset(q, 0, sizeof *q);
    q->hist = hist;
    q->item = -1;
    FORGE__COPY_PARAMS(q->p, it->params, forge_generate_default_params);
    const forge_generate_params *p = &q->p;
    char fault[96];
    if (forge__sampling_fault(fault, sizeof fault, p->max_tokens, p->repeat_window, p->temperature, p->top_p, p->min_p, p->repeat_penalty, p->top_k, p->lookup)) {
        res->status = forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "batch item %d: generate params: %s", idx, fault);
        return FORGE_OK;
    }
    if (it->text || it->text_len) {
        size_t nt = 0;
        st = forge__tokenize_alloc(m, it->text, it->text_len, p->add_special, &owned, &nt);
        if (st == FORGE_ERR_OUT_OF_MEMORY) {
            free(owned);
            return forge__fail(&s->err, st, "out of host memory");
        }
        if (st) {
            res->status = forge__fail(&s->err, st, "batch item %d: tokenizing the prompt: %s", idx, forge_model_errmsg(m));
            free(owned);
            return FORGE_OK;
        }
        prompt = owned;
        n = (int)FORGE__MIN(nt, (size_t)INT32_MAX);
    }
    forge_status cst = res->status ? FORGE_OK : forge__constraint_for(s, p, &q->g);
    if (cst == FORGE_ERR_OUT_OF_MEMORY) {
        free(owned);
        return cst;
    }
    if (cst) {
        res->status = forge__wrap(&s->err, cst, "batch item %d", idx);
    } else if (!prompt || n <= 0) {
        res->status = forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "batch item %d: the prompt is empty", idx);
    } else if (n > s->n_ctx) {
        res->status = forge__fail(&s->err, FORGE_ERR_LIMIT, "batch item %d: the prompt has %d tokens; the session's context holds %d",
                                  idx, n, s->n_ctx);
    } else if (forge__check_token_ids(s, prompt, n)) {
        res->status = forge__wrap(&s->err, FORGE_ERR_INVALID_ARGUMENT, "batch item %d", idx);
    }
    if (res->status) {
        forge__matcher_free(q->g);
        q->g = NULL;
        free(owned);
        return FORGE_OK;
    }
    q->item = idx;
    q->t0 = forge__now_s();
    q->mt.prompt_tokens = n;
    q->stop = (forge__stopper){&q->p, NULL, 0, 0};
    forge__rng_seed(q->rng, p->seed);
    forge_detok_stream_init(&q->ds, 0);
    memcpy(q->hist, prompt, 4ull * n);
    const float *logits = NULL;
    bool host_penalty = p->repeat_penalty != 1.0f;
    forge__out_mode mode = host_penalty ? FORGE__OUT_BATCH_PREFILL_LOGITS : FORGE__OUT_BATCH_PREFILL;
    int chunk = FORGE__MIN(s->n_batch, FORGE__BATCH_MAX_SEQ);
    for (int done = 0; done < n && !st;) {
        if (forge__cancelled(p->cancel)) { q->mt.stop_reason = FORGE_STOP_CANCELLED; break; }
        int step = FORGE__MIN(n - done, chunk);
        bool last = done + step == n;
        for (int i = 0; i < step; i++) forge__batch_row(s, (uint32_t)i, (uint32_t)(done + i), (uint32_t)b);
        forge__batch_temp(s, 0, q->g && p->temperature <= 0.0f ? 1.0f : p->temperature);
        st = forge__batch_step(s, prompt + done, (uint32_t)step, (uint32_t)step - 1, last ? 1u : 0u, last ? mode : FORGE__OUT_BATCH_PREFILL_LOGITS,
                               &logits, w->red);
        done += step;
        q->n_past = done;
    }
    double t_prefill = forge__now_s();
    q->mt.prefill_ms = (t_prefill - q->t0) * 1e3;
    q->mt.prefill_tok_s = q->mt.prefill_ms > 0 ? q->n_past / (q->mt.prefill_ms * 1e-3) : 0;
    if (!st && m->tok.n_vocab && !forge_token_is_special(m, prompt[n - 1])) { /* the text continues the prompt's */
        size_t primed = 0;
        forge_detok_stream_next(m, &q->ds, prompt[n - 1], w->piece, sizeof w->piece, &primed);
    }
    free(owned);
    if (st) return st;
    int32_t tok;
    if (q->g && !q->mt.stop_reason) { /* text the constraint forces from the start: taken before any draw */
        int cap = FORGE__MIN(FORGE__MIN(FORGE__MAX_FORCED_STEP, p->max_tokens), s->n_ctx - q->n_past - 1);
        q->n_forced = forge__matcher_forced(q->g, q->forced, cap);
        q->at_forced = 0;
    }
    if (q->mt.stop_reason == FORGE_STOP_CANCELLED) {
        forge__batch_finish(s, q, res, w);
    } else if (q->at_forced < q->n_forced) {
        tok = q->forced[q->at_forced++];
        if (!forge__batch_take(s, q, tok, true, w)) forge__batch_finish(s, q, res, w);
    } else if (q->g && (q->g->done || q->g->dead)) {
        q->mt.stop_reason = FORGE_STOP_CONSTRAINT;
        forge__batch_finish(s, q, res, w);
    } else if ((st = forge__batch_draw(s, q, logits, host_penalty ? NULL : w->red, 0, w, &tok))) {
        return st;
    } else if (!forge__batch_take(s, q, tok, false, w)) {
        forge__batch_finish(s, q, res, w);
    }
    return FORGE_OK;
}

static forge_status forge__batch_generate(forge_session *s, const forge_batch_item *items, int n_items, forge_batch_result *results) {
    forge_model *m = s->m;
    const int V = m->cfg.n_vocab, NS = s->n_seq;
    if (!forge__head_dims_by4(&m->cfg))
        return forge__fail(&s->err, FORGE_ERR_UNSUPPORTED, "batch generate needs head_dim a multiple of 4; this model's is %d", m->cfg.head_dim);
    memset(results, 0, sizeof *results * (size_t)n_items);
    forge__bwork w = {0};
    forge__bseq *q = (forge__bseq *)calloc((size_t)NS, sizeof *q);
    int32_t *hist = (int32_t *)malloc(4ull * (size_t)NS * (size_t)s->n_ctx);
    w.cands = (forge__cand *)malloc(sizeof *w.cands * (size_t)V);
    w.probs = (double *)malloc(sizeof *w.probs * (size_t)V);
    w.row = (float *)malloc(4ull * (size_t)V);
    w.red = (uint32_t *)malloc(8ull * (size_t)NS * (1 + FORGE__CANDIDATES));
    w.tokens = (int32_t *)malloc(4ull * (size_t)NS);
    w.place = (int *)malloc(sizeof *w.place * (size_t)NS);
    w.top = (forge__cand *)malloc(sizeof *w.top * FORGE__CANDIDATES);
    w.mask = (uint32_t *)malloc(4ull * ((size_t)V / 32 + 1));
    forge_status st = q && hist && w.cands && w.probs && w.row && w.red && w.tokens && w.place && w.top && w.mask ? FORGE_OK
                                                                                       : forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int b = 0; !st && b < NS; b++) {
        q[b].item = -1;
        q[b].hist = hist + (size_t)b * s->n_ctx;
    }
    s->n_past = 0; /* the cache is scratch: place 0 is the session's own sequence */
    int next = 0;
    while (!st) {
        for (int b = 0; b < NS && !st; b++)
            while (q[b].item < 0 && next < n_items && !st) {
                st = forge__batch_start(s, &q[b], b, &items[next], next, &results[next], &w);
                next++;
            }
        uint32_t M = 0;
        bool host_penalty = false; /* a sequence with a repeat penalty: the step reads back the logits */
        for (int b = 0; b < NS; b++)
            if (q[b].item >= 0) {
                w.tokens[M] = q[b].next;
                w.place[M] = b;
                forge__batch_row(s, M, (uint32_t)q[b].n_past, (uint32_t)b);
                forge__batch_temp(s, M, q[b].g && q[b].p.temperature <= 0.0f ? 1.0f : q[b].p.temperature); /* (a constrained greedy draw reads every candidate) */
                host_penalty |= q[b].p.repeat_penalty != 1.0f;
                M++;
            }
        if (st || M == 0) break; /* (M == 0: every item has run) */
        const float *logits = NULL;
        forge__out_mode mode = host_penalty ? FORGE__OUT_BATCH_DECODE_LOGITS : FORGE__OUT_BATCH_DECODE;
        if ((st = forge__batch_step(s, w.tokens, M, 0, M, mode, &logits, w.red))) break;
        for (uint32_t r = 0; r < M && !st; r++) {
            forge__bseq *sq = &q[w.place[r]];
            sq->hist[sq->n_past++] = sq->next;
            int32_t tok;
            if (sq->at_forced < sq->n_forced) { /* forced: taken without a draw */
                tok = sq->forced[sq->at_forced++];
                if (!forge__batch_take(s, sq, tok, true, &w)) forge__batch_finish(s, sq, &results[sq->item], &w);
                continue;
            }
            const uint32_t *red = host_penalty ? NULL : w.red + (size_t)r * 2 * (1 + FORGE__CANDIDATES);
            if ((st = forge__batch_draw(s, sq, host_penalty ? logits + (size_t)r * V : NULL, red, r, &w, &tok))) break;
            if (!forge__batch_take(s, sq, tok, false, &w)) forge__batch_finish(s, sq, &results[sq->item], &w);
        }
    }
    for (int b = 0; q && b < NS; b++) /* a device failure: the unfinished items share it */
        if (q[b].item >= 0) {
            results[q[b].item].status = st;
            free(q[b].stop.buf);
            forge__matcher_free(q[b].g);
        }
    for (int i = next; st && i < n_items; i++) results[i].status = st;
    s->n_past = 0;
    free(q);
    free(hist);
    free(w.cands);
    free(w.probs);
    free(w.row);
    free(w.red);
    free(w.tokens);
    free(w.place);
    free(w.top);
    free(w.mask);
    return st;
}

FORGE_API forge_status forge_batch_generate(forge_session *s, const forge_batch_item *items, int n_items, forge_batch_result *results) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    if (n_items < 0 || (n_items > 0 && (!items || !results)))
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "batch generate: items and results are needed for n_items > 0");
    forge_status st;
    if (n_items > 0 && ((st = forge__check_sized(items, "forge_batch_item", &s->err)) ||
                        (st = forge__check_sized(results, "forge_batch_result", &s->err))))
        return st;
    /* the caller's arrays as forge's structs (their sizes may be an older forge.h's) */
    forge_batch_item *own_items = (forge_batch_item *)forge__array_in(items, n_items, sizeof *own_items);
    forge_batch_result *own_results = (forge_batch_result *)calloc(n_items > 0 ? (size_t)n_items : 1, sizeof *own_results);
    if (!own_items || !own_results) {
        free(own_items);
        free(own_results);
        return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    st = forge__slot_acquire(s->m, &s->err);
    if (!st) {
        st = forge__batch_generate(s, own_items, n_items, own_results);
        forge__slot_release(s->m);
        /* each result's metrics say the size the caller's struct has room for */
        size_t stride = forge__struct_size(results), off = offsetof(forge_batch_result, metrics);
        for (int i = 0; i < n_items; i++)
            own_results[i].metrics.struct_size = stride > off ? (uint32_t)FORGE__MIN(sizeof own_results[i].metrics, stride - off) : 0;
        forge__array_out(results, own_results, n_items, sizeof *own_results);
    }
    free(own_items);
    free(own_results);
    return st;
}

