/* src/embed.c: Embeddings and reranking.
 * Owns: forge_embed, forge_embed_info_get, forge_rerank.
 * May call: base.c, config.c, tokenizer.c, device.c, model.c, session.c, exec.c, api.c,
 * generate.c, classify.c.
 *
 * Both run classify's batches (classify.c: sorted by length, right-padded, one pass a batch,
 * the session's cache as scratch). An embedding pass ends in FORGE__OUT_POOL_ROWS / _MEAN
 * (forward.c): each text's final-norm row, or the mean of its rows, read back as [B, hidden];
 * the sentence-transformers steps after pooling (config.c's forge__st): Dense projections on the
 * device after pooling where the session can (forge__session_embed_dense), else here on the host
 * in double; Normalize here. A rerank pass is FORGE__OUT_CLASSIFY: the head at one row of each
 * pair (a cross-encoder's score head, or the LM head whose "yes" / "no" logits give P(yes)).
 */

FORGE_API forge_embed_params forge_embed_default_params(void) {
    forge_embed_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.pooling = FORGE_POOLING_DEFAULT;
    p.normalize = -1;
    p.truncate = 1;
    p.add_special = 1;
    return p;
}

FORGE_API forge_rerank_params forge_rerank_default_params(void) {
    forge_rerank_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.truncate = 1;
    return p;
}

/* The vector's length after the sentence-transformers steps (before truncation). */
static int forge__embed_dim(const forge_model *m) { return forge__st_dim(&m->embed, m->cfg.hidden); }

/* The longest text embedded whole: max_seq_length, within the model's context. */
static int forge__embed_limit(const forge_model *m) {
    int lim = m->cfg.n_ctx_train;
    if (m->embed.max_seq > 0) lim = FORGE__MIN(lim, m->embed.max_seq);
    return lim;
}

FORGE_API forge_status forge_embed_info_get(const forge_model *m, forge_embed_info *out) {
    if (!out || !forge__model_ready(m)) return FORGE_ERR_INVALID_ARGUMENT;
    forge_status st = forge__model_check_sized(m, out, "forge_embed_info");
    if (st) return st;
    if (!forge__model_has_weights(m, "forge_embed_info_get")) return FORGE_ERR_UNSUPPORTED;
    if (m->embed.st) return forge__model_fail(m, m->embed.st, "%s", m->embed.msg);
    const forge__st *e = &m->embed;
    forge_embed_info full;
    memset(&full, 0, sizeof full);
    full.struct_size = sizeof full;
    full.dim = forge__embed_dim(m);
    full.pooling = e->pooling ? e->pooling : FORGE_POOLING_LAST;
    for (int i = 0; i < e->n_steps; i++) full.normalize |= e->steps[i] < 0;
    full.max_tokens = forge__embed_limit(m);
    full.n_dense = e->n_dense;
    full.bidirectional = m->cfg.bidirectional;
    full.sentence_transformers = e->present;
    full.prompt_names = e->prompt_names_csv ? e->prompt_names_csv : "";
    full.default_prompt_name = e->default_prompt;
    FORGE__PUT(out, full);
    return FORGE_OK;
}

/* x [n] scaled to unit L2 norm (torch's F.normalize: divided by max(|x|, 1e-12)). */
static void forge__l2_normalize(double *x, int n) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double norm = FORGE__MAX(sqrt(ss), 1e-12);
    for (int i = 0; i < n; i++) x[i] /= norm;
}

/* A row read back through the checkpoint's steps after pooling (its Normalize steps only when
 * `normalize`; its Dense steps only when not `dense_done` on the device): row [width] in, y
 * [dim] out; tmp holds the widest step. */
static void forge__embed_steps(const forge__st *e, const float *row, int width, bool dense_done, bool normalize, double *y, double *tmp) {
    int n = width;
    for (int i = 0; i < n; i++) y[i] = row[i];
    for (int k = 0; k < e->n_steps; k++) {
        if (e->steps[k] < 0) {
            if (normalize) forge__l2_normalize(y, n);
            continue;
        }
        if (dense_done) continue;
        const forge__st_dense *d = &e->dense[e->steps[k]];
        for (int o = 0; o < d->out; o++) {
            const float *w = d->w + (size_t)o * (size_t)d->in;
            double s = d->b ? d->b[o] : 0.0;
            for (int i = 0; i < d->in; i++) s += (double)w[i] * y[i];
            tmp[o] = d->tanh ? tanh(s) : s;
        }
        n = d->out;
        memcpy(y, tmp, sizeof *y * (size_t)n);
    }
}

/* Tokens of `text` with `prefix` before it (as sentence-transformers concatenates a prompt),
 * into *ids (malloc'd), *n. */
static forge_status forge__embed_tokenize(forge_session *s, const char *prefix, const char *text, size_t len, int add_special, int32_t **ids,
                                          size_t *n) {
    size_t pl = prefix ? strlen(prefix) : 0;
    char *joined = (char *)malloc(pl + len + 1);
    if (!joined) return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    if (pl) memcpy(joined, prefix, pl);
    if (len) memcpy(joined + pl, text, len);
    joined[pl + len] = 0;
    forge_status st = forge__tokenize_alloc(s->m, joined, pl + len, add_special, ids, n);
    free(joined);
    if (st == FORGE_ERR_OUT_OF_MEMORY) return forge__fail(&s->err, st, "out of host memory");
    if (st) return forge__fail(&s->err, st, "tokenizing: %s", forge_model_errmsg(s->m));
    return FORGE_OK;
}

/* The sequences a call runs: each one's ids (owned when forge made them) and length. */
typedef struct forge__seqs {
    int n;
    int32_t **owned;
    const int32_t **toks;
    int *lens, *order;
    int64_t total;
} forge__seqs;

static forge_status forge__seqs_init(forge__seqs *q, int n, forge__err *err) {
    memset(q, 0, sizeof *q);
    q->n = n;
    q->owned = (int32_t **)calloc((size_t)n + 1, sizeof *q->owned);
    q->toks = (const int32_t **)calloc((size_t)n + 1, sizeof *q->toks);
    q->lens = (int *)calloc((size_t)n + 1, sizeof *q->lens);
    q->order = (int *)calloc((size_t)n + 1, sizeof *q->order);
    if (!q->owned || !q->toks || !q->lens || !q->order) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    return FORGE_OK;
}

static void forge__seqs_free(forge__seqs *q) {
    for (int i = 0; q->owned && i < q->n; i++) free(q->owned[i]);
    free(q->owned);
    free((void *)q->toks);
    free(q->lens);
    free(q->order);
}

/* Sequence i cut to `limit` tokens keeping its last `keep_tail` (the tokenizer's closing
 * special tokens: transformers truncates the text, not them); the ids are copied into owned. */
static forge_status forge__seqs_cut(forge__seqs *q, int i, int limit, int keep_tail, forge__err *err) {
    if (q->lens[i] <= limit) return FORGE_OK;
    keep_tail = FORGE__MIN(keep_tail, limit);
    if (!q->owned[i]) {
        q->owned[i] = (int32_t *)malloc(4ull * (size_t)q->lens[i]);
        if (!q->owned[i]) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        memcpy(q->owned[i], q->toks[i], 4ull * (size_t)q->lens[i]);
        q->toks[i] = q->owned[i];
    }
    memmove(q->owned[i] + (limit - keep_tail), q->owned[i] + (q->lens[i] - keep_tail), 4ull * (size_t)keep_tail);
    q->lens[i] = limit;
    return FORGE_OK;
}

static forge_status forge__embed(forge_session *s, const forge_classify_prompt *texts, int n_texts, const forge_embed_params *params, float *vectors,
                                 size_t capacity, int *dim_out) {
    forge_embed_params p;
    FORGE__COPY_PARAMS(p, params, forge_embed_default_params);
    forge_model *m = s->m;
    const forge__st *e = &m->embed;
    if (e->st) return forge__fail(&s->err, e->st, "%s", e->msg);
    if (m->cfg.n_labels)
        return forge__fail(&s->err, FORGE_ERR_UNSUPPORTED, "the model is a sequence classifier (a score head): forge_rerank runs it, not forge_embed");
    int full_dim = forge__embed_dim(m), H = m->cfg.hidden;
    if (p.dim < 0 || p.dim > full_dim)
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "embed params: dim %d is outside 0..%d (the vector's length)", p.dim, full_dim);
    if (p.pooling < FORGE_POOLING_DEFAULT || p.pooling > FORGE_POOLING_CLS)
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "embed params: pooling %d is not a forge_pooling", p.pooling);
    if (p.normalize < -1 || p.normalize > 1)
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "embed params: normalize %d is not -1, 0 or 1", p.normalize);
    int dim = p.dim ? p.dim : full_dim;
    if (dim_out) *dim_out = dim;
    if ((uint64_t)capacity < (uint64_t)n_texts * (uint64_t)dim)
        return forge__fail(&s->err, FORGE_ERR_BUFFER_TOO_SMALL, "vectors hold %zu floats; %d texts x %d need %llu", capacity, n_texts, dim,
                           (unsigned long long)((uint64_t)n_texts * (uint64_t)dim));
    const char *prefix = p.prompt;
    if (!prefix) {
        const char *name = p.prompt_name ? p.prompt_name : e->default_prompt;
        for (int k = 0; name && !prefix && k < e->n_prompts; k++)
            if (!strcmp(e->prompt_names[k], name)) prefix = e->prompts[k];
        if (name && !prefix)
            return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "prompt_name '%s' is not one of the model's prompts (%s)", name,
                               e->n_prompts ? e->prompt_names_csv : "it has none");
    }
    int pooling = p.pooling ? p.pooling : e->pooling ? e->pooling : FORGE_POOLING_LAST;
    int limit = forge__embed_limit(m);
    const forge__tokenizer *tk = m->tok.n_vocab ? &m->tok : NULL;
    double t0 = forge__now_s();
    s->n_past = 0; /* the cache is scratch from here on */
    s->n_dropped = 0;
    forge__seqs q;
    int max_b = forge__batch_max(s);
    int width = s->embed_dense ? full_dim : H; /* what a pass reads back per text */
    float *rows = (float *)malloc(4ull * (size_t)max_b * (size_t)width);
    int widest = H; /* the widest step after pooling */
    for (int k = 0; k < e->n_dense; k++) widest = FORGE__MAX(widest, e->dense[k].out);
    double *y = (double *)malloc(sizeof *y * (size_t)widest * 2), *tmp = y ? y + widest : NULL;
    forge_status st = forge__seqs_init(&q, n_texts, &s->err);
    if (!st && (!rows || !y)) st = forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int i = 0; i < n_texts && !st; i++) {
        const forge_classify_prompt *t = &texts[i];
        int tail = 0;
        if (t->text && !tk) {
            st = forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "text %d is text, and the model has no tokenizer: give token ids", i);
        } else if (t->text) {
            size_t n = 0;
            if ((st = forge__embed_tokenize(s, prefix, t->text, t->text_len, p.add_special, &q.owned[i], &n))) {
                forge__wrap(&s->err, st, "text %d", i);
                break;
            }
            q.toks[i] = q.owned[i];
            q.lens[i] = (int)FORGE__MIN(n, (size_t)INT_MAX);
            tail = p.add_special ? m->tok.n_tmpl_post : 0;
        } else if (t->n_tokens > 0 && !t->tokens) {
            st = forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "text %d: n_tokens %d but no tokens", i, t->n_tokens);
        } else {
            q.toks[i] = t->tokens;
            q.lens[i] = t->n_tokens;
        }
        if (st) break;
        if (q.lens[i] > limit && !p.truncate)
            st = forge__fail(&s->err, FORGE_ERR_LIMIT, "text %d has %d tokens, more than the %d the model embeds (%s; truncate is off)", i, q.lens[i],
                             limit, m->embed.max_seq > 0 && limit == m->embed.max_seq ? "max_seq_length" : "its context");
        if (!st) st = forge__seqs_cut(&q, i, limit, tail, &s->err);
        if (!st) st = forge__batch_check(s, "text", i, q.toks[i], q.lens[i]);
        q.total += q.lens[i];
    }
    if (!st) forge__batch_sort(q.lens, q.order, n_texts);
    bool mean = pooling == FORGE_POOLING_MEAN;
    for (int b0 = 0; b0 < n_texts && !st;) {
        if (forge__cancelled(p.cancel)) {
            st = forge__fail(&s->err, FORGE_ERR_CANCELLED, "embed was cancelled after %d of %d texts", b0, n_texts);
            break;
        }
        int T, B = forge__batch_cut(s, q.lens, q.order, n_texts, b0, &T);
        uint32_t rows_k[FORGE__MAX_PENALTY_WINDOW];
        for (int k = 0; k < B; k++) /* the row each text is read at: its last (last-token, and the mean's end), or its first */
            rows_k[k] = (uint32_t)(k * T) + (pooling == FORGE_POOLING_CLS ? 0u : (uint32_t)(q.lens[q.order[b0 + k]] - 1));
        if ((st = forge__batch_pass(s, q.toks, q.lens, q.order, b0, B, T, mean ? FORGE__OUT_POOL_MEAN : FORGE__OUT_POOL_ROWS, rows_k))) break;
        forge__batch_read(s, B, width, rows);
        for (int k = 0; k < B; k++) {
            int i = q.order[b0 + k];
            forge__embed_steps(e, rows + (size_t)k * (size_t)width, width, s->embed_dense, p.normalize != 0, y, tmp);
            if (p.normalize == 1) forge__l2_normalize(y, dim); /* the vector returned: after truncation */
            float *out = vectors + (size_t)i * (size_t)dim;
            for (int d = 0; d < dim; d++) out[d] = (float)y[d];
            if (!isfinite(out[0])) {
                st = forge__fail(&s->err, FORGE_ERR_DEVICE, "text %d: the vector is not finite", i);
                break;
            }
        }
        b0 += B;
    }
    forge__batch_metrics(s, q.total, t0);
    forge__seqs_free(&q);
    free(rows);
    free(y);
    return st;
}

FORGE_API forge_status forge_embed(forge_session *s, const forge_classify_prompt *texts, int n_texts, const forge_embed_params *params, float *vectors,
                                   size_t capacity, int *dim) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    if (n_texts < 0 || (n_texts > 0 && !texts) || (capacity > 0 && !vectors))
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "embed needs texts for n_texts (%d) >= 0, and vectors for capacity %zu", n_texts,
                           capacity);
    forge_status st;
    if ((st = forge__check_sized(params, "forge_embed_params", &s->err))) return st;
    if (n_texts > 0 && (st = forge__check_sized(texts, "forge_classify_prompt", &s->err))) return st;
    forge_classify_prompt *own = (forge_classify_prompt *)forge__array_in(texts, n_texts, sizeof *own);
    if (!own) return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    st = forge__slot_acquire(s->m, &s->err);
    if (!st) {
        st = forge__embed(s, own, n_texts, params, vectors, capacity, dim);
        forge__slot_release(s->m);
    }
    free(own);
    return st;
}

/* ---- Reranking ---- */

/* Qwen3-Reranker's prompt, as its model card builds it: the judge's system turn, the user turn
 * of instruction, query and document, the assistant's empty think block; the three parts
 * tokenized apart, the body cut to the card's max_length less the other two. */
static const char forge__rerank_prefix[] =
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. "
    "Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n";
static const char forge__rerank_suffix[] = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
static const char forge__rerank_instruction[] = "Given a web search query, retrieve relevant passages that answer the query";
#define FORGE__RERANK_MAX_LENGTH 8192

/* Appends n ids to dst at *at. */
static void forge__ids_put(int32_t *dst, int *at, const int32_t *src, int n) {
    if (n > 0) memcpy(dst + *at, src, 4ull * (size_t)n);
    *at += n;
}

/* A cross-encoder's pair: the tokenizer's pair template around the query's and the document's
 * ids, the longer of the two losing its last token until the pair fits `limit` (transformers'
 * longest_first, ties from the document). */
static forge_status forge__rerank_pair(forge_session *s, const int32_t *qa, int na, const int32_t *db, int nb, int limit, bool truncate, int i,
                                       int32_t **out, int *n_out) {
    const forge__tokenizer *tk = &s->m->tok;
    int specials = tk->n_tmpl_pair[0] + tk->n_tmpl_pair[1] + tk->n_tmpl_pair[2];
    if (na + nb + specials > limit) {
        if (!truncate)
            return forge__fail(&s->err, FORGE_ERR_LIMIT, "document %d: the pair has %d tokens, more than the model's %d (truncate is off)", i,
                               na + nb + specials, limit);
        while (na + nb + specials > limit && na + nb > 0) {
            if (na > nb) na--;
            else nb--;
        }
    }
    int32_t *ids = (int32_t *)malloc(4ull * (size_t)(na + nb + specials + 1));
    if (!ids) return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    int at = 0;
    forge__ids_put(ids, &at, tk->tmpl_pair[0], tk->n_tmpl_pair[0]);
    forge__ids_put(ids, &at, qa, na);
    forge__ids_put(ids, &at, tk->tmpl_pair[1], tk->n_tmpl_pair[1]);
    forge__ids_put(ids, &at, db, nb);
    forge__ids_put(ids, &at, tk->tmpl_pair[2], tk->n_tmpl_pair[2]);
    *out = ids;
    *n_out = at;
    return FORGE_OK;
}

/* Qwen3-Reranker's prompt for one document: prefix | body (cut to fit) | suffix. */
static forge_status forge__rerank_prompt(forge_session *s, const forge_rerank_params *p, const char *query, const char *doc, const int32_t *pre,
                                         int npre, const int32_t *suf, int nsuf, int limit, int i, int32_t **out, int *n_out) {
    const char *instr = p->instruction ? p->instruction : forge__rerank_instruction;
    size_t len = strlen(instr) + strlen(query) + strlen(doc) + 64;
    char *body = (char *)malloc(len);
    if (!body) return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    snprintf(body, len, "<Instruct>: %s\n<Query>: %s\n<Document>: %s", instr, query, doc);
    int32_t *b = NULL;
    size_t nb = 0;
    forge_status st = forge__embed_tokenize(s, NULL, body, strlen(body), 1, &b, &nb);
    free(body);
    if (st) return forge__wrap(&s->err, st, "document %d", i);
    int room = FORGE__MAX(limit - npre - nsuf, 0);
    if ((int)nb > room && !p->truncate) {
        free(b);
        return forge__fail(&s->err, FORGE_ERR_LIMIT, "document %d: the prompt has %d tokens, more than the %d the reranker takes (truncate is off)", i,
                           (int)nb + npre + nsuf, limit);
    }
    nb = FORGE__MIN(nb, (size_t)room);
    int32_t *ids = (int32_t *)malloc(4ull * ((size_t)npre + nb + (size_t)nsuf + 1));
    if (!ids) {
        free(b);
        return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    int at = 0;
    forge__ids_put(ids, &at, pre, npre);
    forge__ids_put(ids, &at, b, (int)nb);
    forge__ids_put(ids, &at, suf, nsuf);
    free(b);
    *out = ids;
    *n_out = at;
    return FORGE_OK;
}

static forge_status forge__rerank(forge_session *s, const char *query, const char *const *docs, int n_docs, const forge_rerank_params *params,
                                  float *scores) {
    forge_rerank_params p;
    FORGE__COPY_PARAMS(p, params, forge_rerank_default_params);
    forge_model *m = s->m;
    const forge__config *c = &m->cfg;
    if (!m->tok.n_vocab) return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "forge_rerank needs the model's tokenizer");
    bool cross = c->n_labels > 0;
    int32_t yes = -1, no = -1;
    if (cross && c->n_labels != 1)
        return forge__fail(&s->err, FORGE_ERR_UNSUPPORTED, "a cross-encoder of %d labels: forge_rerank gives one score, from a head of one label",
                           c->n_labels);
    if (!cross) {
        yes = forge_token_id(m, "yes");
        no = forge_token_id(m, "no");
        if (c->bidirectional || c->no_head || yes < 0 || no < 0)
            return forge__fail(&s->err, FORGE_ERR_UNSUPPORTED,
                               "the model has neither a sequence-classification head (score.weight) nor, as a causal LM, the tokens 'yes' "
                               "and 'no' that Qwen3-Reranker's formulation reads");
    }
    int limit = cross ? c->n_ctx_train : FORGE__MIN(c->n_ctx_train, FORGE__RERANK_MAX_LENGTH);
    double t0 = forge__now_s();
    s->n_past = 0; /* the cache is scratch from here on */
    s->n_dropped = 0;
    forge__seqs q;
    int32_t *qa = NULL, *pre = NULL, *suf = NULL;
    size_t nqa = 0, npre = 0, nsuf = 0;
    int rows_n = forge__head_rows(c), max_b = forge__batch_max(s);
    float *rows = (float *)malloc(4ull * (size_t)max_b * (size_t)rows_n);
    forge_status st = forge__seqs_init(&q, n_docs, &s->err);
    if (!st && !rows) st = forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    if (!st && cross) st = forge__embed_tokenize(s, NULL, query, strlen(query), 0, &qa, &nqa);
    if (!st && !cross && !(st = forge__embed_tokenize(s, NULL, forge__rerank_prefix, strlen(forge__rerank_prefix), 0, &pre, &npre)))
        st = forge__embed_tokenize(s, NULL, forge__rerank_suffix, strlen(forge__rerank_suffix), 0, &suf, &nsuf);
    for (int i = 0; i < n_docs && !st; i++) {
        if (!docs[i]) {
            st = forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "document %d is NULL", i);
            break;
        }
        if (cross) {
            int32_t *db = NULL;
            size_t ndb = 0;
            st = forge__embed_tokenize(s, NULL, docs[i], strlen(docs[i]), 0, &db, &ndb);
            if (!st) st = forge__rerank_pair(s, qa, (int)nqa, db, (int)ndb, limit, p.truncate != 0, i, &q.owned[i], &q.lens[i]);
            free(db);
        } else {
            st = forge__rerank_prompt(s, &p, query, docs[i], pre, (int)npre, suf, (int)nsuf, limit, i, &q.owned[i], &q.lens[i]);
        }
        q.toks[i] = q.owned[i];
        if (!st) st = forge__batch_check(s, "document", i, q.toks[i], q.lens[i]);
        q.total += q.lens[i];
    }
    if (!st) forge__batch_sort(q.lens, q.order, n_docs);
    for (int b0 = 0; b0 < n_docs && !st;) {
        if (forge__cancelled(p.cancel)) {
            st = forge__fail(&s->err, FORGE_ERR_CANCELLED, "rerank was cancelled after %d of %d documents", b0, n_docs);
            break;
        }
        int T, B = forge__batch_cut(s, q.lens, q.order, n_docs, b0, &T);
        uint32_t rows_k[FORGE__MAX_PENALTY_WINDOW];
        for (int k = 0; k < B; k++) {
            int i = q.order[b0 + k], last = q.lens[i] - 1;
            /* transformers' sequence classifiers read the last token that is not the pad token */
            while (cross && c->pad_id >= 0 && last > 0 && q.toks[i][last] == c->pad_id) last--;
            rows_k[k] = (uint32_t)(k * T + last);
        }
        if ((st = forge__batch_pass(s, q.toks, q.lens, q.order, b0, B, T, FORGE__OUT_CLASSIFY, rows_k))) break;
        forge__batch_read(s, B, rows_n, rows);
        for (int k = 0; k < B; k++) {
            const float *row = rows + (size_t)k * (size_t)rows_n;
            double logit = cross ? row[0] : (double)row[yes] - (double)row[no]; /* log P(yes) - log P(no) */
            if (!isfinite(logit)) {
                st = forge__fail(&s->err, FORGE_ERR_DEVICE, "document %d: the score is not finite", q.order[b0 + k]);
                break;
            }
            scores[q.order[b0 + k]] = (float)(p.raw ? logit : 1.0 / (1.0 + exp(-logit)));
        }
        b0 += B;
    }
    forge__batch_metrics(s, q.total, t0);
    forge__seqs_free(&q);
    free(rows);
    free(qa);
    free(pre);
    free(suf);
    return st;
}

FORGE_API forge_status forge_rerank(forge_session *s, const char *query, const char *const *documents, int n_documents,
                                    const forge_rerank_params *params, float *scores) {
    if (!s) return FORGE_ERR_INVALID_ARGUMENT;
    if (!query || n_documents < 0 || (n_documents > 0 && (!documents || !scores)))
        return forge__fail(&s->err, FORGE_ERR_INVALID_ARGUMENT, "rerank needs a query, and documents and scores for n_documents (%d) >= 0", n_documents);
    forge_status st = forge__check_sized(params, "forge_rerank_params", &s->err);
    if (st) return st;
    if ((st = forge__slot_acquire(s->m, &s->err))) return st;
    st = forge__rerank(s, query, documents, n_documents, params, scores);
    forge__slot_release(s->m);
    return st;
}
