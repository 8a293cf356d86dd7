/* src/exec.c: Execution.
 * Owns: the recording cache, profiling, the step (prefill and the replayed decode step),
 * sliding a full context (forge_overflow), session init and destroy.
 * May call: base.c, config.c, device.c, ops.c, model.c, session.c, forward.c.
 */

/* ---- The recording cache: one recorded command buffer per shape ---- */

static void forge__recording_free(forge__device *d, VkCommandPool cmd_pool, forge__recording *rc) {
    forge__host_seq_free(d, cmd_pool, &rc->host);
    if (rc->cb) d->vk.vkFreeCommandBuffers(d->dev, cmd_pool, 1, &rc->cb);
    if (rc->pool) d->vk.vkDestroyDescriptorPool(d->dev, rc->pool, NULL);
    if (rc->qpool) d->vk.vkDestroyQueryPool(d->dev, rc->qpool, NULL);
    free(rc->ops);
    free(rc->shapes);
    memset(rc, 0, sizeof *rc);
}

/* Records what `fn` records into `slot`: once in counting mode to size the descriptor pool
 * exactly, then for real (with a timestamp after every dispatch when profiling). Sessions
 * and trainers record this way; the caller fills the slot's key. With `host` (a session's
 * forward pass where the model runs products on the host) the products with host twins
 * become the slot's host segments (src/host.c): submit it with forge__recording_submit. */
typedef void (*forge__record_fn)(void *ctx, forge__rec *r);
/* A recorder over the model's pipelines, in counting mode (creates pipelines, records nothing). */
static forge__rec forge__rec_counting(forge_model *m, forge__err *err) {
    return (forge__rec){.dev = &m->dev, .pipes = m->pipes, .pipe_lock = &m->pipe_lock, .counting = true, .err = err,
                        .dmax = (uint32_t)forge__align_up((uint64_t)m->cfg.head_dim_max, 8), .mv_paths = forge__matvec_paths(m)};
}

static forge_status forge__record(forge_model *m, VkCommandPool cmd_pool, bool profile, forge__record_fn fn, void *ctx, forge__recording *slot,
                                  const forge__host_bufs *host, forge__err *err) {
    forge__device *d = &m->dev;
    forge__rec r = forge__rec_counting(m, err);
    forge__host_rec hr = {.seq = &slot->host, .pool = cmd_pool, .min_bytes = m->host_min_bytes, .q8 = m->host_q8};
    if (host) {
        hr.bufs = *host;
        r.host_take = forge__host_take;
        r.host_ctx = &hr;
    }
    fn(ctx, &r);
    if (r.st) return r.st;
    VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, r.n_descriptors ? r.n_descriptors : 1};
    VkDescriptorPoolCreateInfo dpi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, .maxSets = r.n_dispatches ? r.n_dispatches : 1,
                                      .poolSizeCount = 1, .pPoolSizes = &ps};
    if (d->vk.vkCreateDescriptorPool(d->dev, &dpi, NULL, &slot->pool) != VK_SUCCESS)
        return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "vkCreateDescriptorPool(%u sets) failed", r.n_dispatches);
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = cmd_pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    if (d->vk.vkAllocateCommandBuffers(d->dev, &cai, &slot->cb) != VK_SUCCESS) {
        forge__recording_free(d, cmd_pool, slot);
        return forge__fail(err, FORGE_ERR_DEVICE, "vkAllocateCommandBuffers failed");
    }
    if (profile) {
        VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, .queryType = VK_QUERY_TYPE_TIMESTAMP,
                                    .queryCount = r.n_dispatches + 1};
        slot->ops = (uint16_t *)calloc(r.n_dispatches + 1, sizeof *slot->ops);
        slot->shapes = (forge__mat_work *)calloc(r.n_dispatches + 1, sizeof *slot->shapes);
        if (!slot->ops || !slot->shapes || d->vk.vkCreateQueryPool(d->dev, &qi, NULL, &slot->qpool) != VK_SUCCESS) {
            forge__recording_free(d, cmd_pool, slot);
            return forge__fail(err, FORGE_ERR_DEVICE, "creating the profiling query pool failed");
        }
        slot->n_dispatches = r.n_dispatches;
    }
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    d->vk.vkBeginCommandBuffer(slot->cb, &bi);
    r.counting = false;
    r.cb = slot->cb;
    r.pool = slot->pool;
    r.n_dispatches = 0;
    if (slot->qpool) {
        r.qpool = slot->qpool;
        r.ops = slot->ops;
        r.shapes = slot->shapes;
        d->vk.vkCmdResetQueryPool(slot->cb, slot->qpool, 0, slot->n_dispatches + 1);
        d->vk.vkCmdWriteTimestamp(slot->cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, slot->qpool, 0);
    }
    fn(ctx, &r);
    d->vk.vkEndCommandBuffer(r.cb); /* the last of the host segments' command buffers (else slot->cb) */
    if (r.st) forge__recording_free(d, cmd_pool, slot);
    return r.st;
}

/* Submits a recording and waits for it: its one command buffer, or its host segments'. */
static forge_status forge__recording_submit(forge_model *m, const forge__recording *rc, VkFence fence, forge__err *err) {
    if (!rc->host.n_ops) return forge__submit_wait(&m->dev, rc->cb, fence, err);
    return forge__host_seq_run(&m->dev, &rc->host, fence, &m->host_pool, err);
}

/* A slot for a new recording among `n` (a free one, else the least recently used, freed). */
static forge__recording *forge__recording_slot(forge__device *d, VkCommandPool cmd_pool, forge__recording *recs, int n) {
    forge__recording *lru = &recs[0];
    for (int i = 0; i < n; i++) {
        if (!recs[i].cb) return &recs[i];
        if (recs[i].last_use < lru->last_use) lru = &recs[i];
    }
    forge__recording_free(d, cmd_pool, lru);
    return lru;
}

typedef struct forge__forward_args {
    forge_session *s;
    uint32_t n, out_row0, n_out;
    forge__out_mode mode;
} forge__forward_args;

static void forge__record_forward_fn(void *ctx, forge__rec *r) {
    forge__forward_args *a = (forge__forward_args *)ctx;
    forge__record_forward(a->s, r, a->n, a->out_row0, a->n_out, a->mode);
}

/* Returns the recorded command buffer for a shape, recording it on first use. */
static forge_status forge__get_recording(forge_session *s, uint32_t n, uint32_t out_row0, uint32_t n_out, forge__out_mode mode,
                                        forge__recording **out) {
    const forge__config *c = &s->m->cfg;
    bool pooled = mode == FORGE__OUT_POOL_ROWS || mode == FORGE__OUT_POOL_MEAN;
    if (((c->bidirectional || c->n_labels) && mode != FORGE__OUT_CLASSIFY && !pooled) || (c->no_head && !pooled))
        return forge__fail(&s->err, FORGE_ERR_UNSUPPORTED, "%s: only %s",
                           c->bidirectional ? "the model's attention is bidirectional (an embedding model)"
                           : c->no_head     ? "the checkpoint has no LM head (an embedding model saved without one)"
                                            : "the model's head is a sequence classifier's (score), not a language model's",
                           c->no_head ? "forge_embed runs it" : "forge_embed and forge_rerank run it");
    for (int i = 0; i < FORGE__RECORDINGS; i++) {
        forge__recording *rc = &s->rec[i];
        if (rc->cb && rc->n_tokens == n && rc->out_row0 == out_row0 && rc->n_out == n_out && rc->mode == (uint32_t)mode) {
            rc->last_use = ++s->use_clock;
            *out = rc;
            return FORGE_OK;
        }
    }
    forge__recording *slot = forge__recording_slot(&s->m->dev, s->cmd_pool, s->rec, FORGE__RECORDINGS);
    forge__forward_args args = {s, n, out_row0, n_out, mode};
    forge_model *m = s->m;
    forge__host_bufs hb = {{m->blocks, s->blocks}, {m->n_blocks, s->n_blocks}};
    if (m->host_products) {
        pthread_mutex_lock(&m->pipe_lock);
        if (!m->host_pool.n_threads) forge__host_pool_init(&m->host_pool, 0);
        pthread_mutex_unlock(&m->pipe_lock);
    }
    forge_status st = forge__record(m, s->cmd_pool, s->profile, forge__record_forward_fn, &args, slot, m->host_products ? &hb : NULL, &s->err);
    if (st) return st;
    slot->n_tokens = n;
    slot->out_row0 = out_row0;
    slot->n_out = n_out;
    slot->mode = (uint32_t)mode;
    slot->last_use = ++s->use_clock;
    *out = slot;
    return FORGE_OK;
}

/* ---- Prewarm: a session's kernels compiled before its first call ----
 * A driver compiles a kernel when its pipeline is created (most GPU drivers) or at its first
 * dispatch (lavapipe: LLVM on one thread, seconds for a large kernel while Mesa's shader cache is
 * cold), so without this the first prompt waits for every compile and nobody can say why.
 * Counting passes of what a call would record (nothing recorded) create the pipelines; each one
 * not yet dispatched then runs once with zero workgroups, a submission each, so the compiles
 * happen here, one at a time, and the caller's callback can say which. */

/* The passes whose kernels a session's first calls need: a prompt step of nb tokens (at most
 * n_batch) and a generation step; for a model that only embeds (or only classifies and reranks, a
 * score head), a batch of nb tokens of that. */
static int forge__prewarm_passes(forge_session *s, uint32_t nb, forge__forward_args *out) {
    const forge__config *c = &s->m->cfg;
    if (c->bidirectional || c->no_head) {
        out[0] = (forge__forward_args){s, nb, nb, 1, FORGE__OUT_POOL_ROWS};
        out[1] = (forge__forward_args){s, nb, nb, 1, FORGE__OUT_POOL_MEAN};
        return 2;
    }
    if (c->n_labels) {
        out[0] = (forge__forward_args){s, nb, nb, 1, FORGE__OUT_CLASSIFY};
        return 1;
    }
    out[0] = (forge__forward_args){s, 1, 0, 1, FORGE__OUT_SAMPLE};
    out[1] = (forge__forward_args){s, nb, nb - 1, 1, FORGE__OUT_SAMPLE};
    return nb > 1 ? 2 : 1;
}

static forge_status forge__prewarm(forge_session *s, int n_prompt, forge_prewarm_fn progress, void *user_data) {
    forge_model *m = s->m;
    forge__device *d = &m->dev;
    forge__forward_args passes[2];
    uint32_t nb = n_prompt > 0 && n_prompt < s->n_batch ? (uint32_t)n_prompt : (uint32_t)s->n_batch;
    int n_passes = forge__prewarm_passes(s, nb, passes);
    for (int i = 0; i < n_passes; i++) {
        forge__rec r = forge__rec_counting(m, &s->err);
        forge__record_forward_fn(&passes[i], &r);
        if (r.st) return r.st;
    }
    int todo[FORGE__OP_COUNT], n = 0;
    pthread_mutex_lock(&m->pipe_lock);
    for (int op = 0; op < FORGE__OP_COUNT; op++)
        if (m->pipes[op].pipe && !m->pipes[op].warm) todo[n++] = op;
    pthread_mutex_unlock(&m->pipe_lock);
    forge_status st = FORGE_OK;
    VkDescriptorPool pool = VK_NULL_HANDLE;
    VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, (uint32_t)(n ? n : 1) * FORGE__MAX_BINDINGS};
    VkDescriptorPoolCreateInfo dpi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, .maxSets = (uint32_t)(n ? n : 1),
                                      .poolSizeCount = 1, .pPoolSizes = &ps};
    if (n && d->vk.vkCreateDescriptorPool(d->dev, &dpi, NULL, &pool) != VK_SUCCESS)
        return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "vkCreateDescriptorPool(%d sets) failed", n);
    static const uint8_t zeros[256]; /* push constants: nothing runs, but every range is set */
    for (int i = 0; i < n && !st; i++) {
        const forge__op_desc *op = &forge__ops[todo[i]];
        forge__pipeline *p = &m->pipes[todo[i]];
        if (progress) progress(user_data, i, n, op->name);
        if (op->push_bytes > sizeof zeros) {
            st = forge__fail(&s->err, FORGE_ERR_DEVICE, "kernel %s: %u bytes of push constants", op->name, op->push_bytes);
            break;
        }
        double t0 = forge__now_s();
        VkDescriptorSet set;
        VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, .descriptorPool = pool,
                                          .descriptorSetCount = 1, .pSetLayouts = &p->dsl};
        if (d->vk.vkAllocateDescriptorSets(d->dev, &ai, &set) != VK_SUCCESS) {
            st = forge__fail(&s->err, FORGE_ERR_DEVICE, "vkAllocateDescriptorSets failed");
            break;
        }
        VkDescriptorBufferInfo bi[FORGE__MAX_BINDINGS];
        VkWriteDescriptorSet w[FORGE__MAX_BINDINGS];
        for (uint32_t b = 0; b < op->n_bindings; b++) { /* any valid range: no invocation reads it */
            bi[b] = (VkDescriptorBufferInfo){s->io.buf, 0, 16};
            w[b] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = set, .dstBinding = b,
                                          .descriptorCount = 1, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .pBufferInfo = &bi[b]};
        }
        d->vk.vkUpdateDescriptorSets(d->dev, op->n_bindings, w, 0, NULL);
        VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = s->cmd_pool,
                                           .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
        VkCommandBuffer cb;
        if (d->vk.vkAllocateCommandBuffers(d->dev, &cai, &cb) != VK_SUCCESS) {
            st = forge__fail(&s->err, FORGE_ERR_DEVICE, "vkAllocateCommandBuffers failed");
            break;
        }
        VkCommandBufferBeginInfo cbi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
        d->vk.vkBeginCommandBuffer(cb, &cbi);
        d->vk.vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p->pipe);
        d->vk.vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p->layout, 0, 1, &set, 0, NULL);
        d->vk.vkCmdPushConstants(cb, p->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, op->push_bytes, zeros);
        d->vk.vkCmdDispatch(cb, 0, 0, 0);
        d->vk.vkEndCommandBuffer(cb);
        st = forge__submit_wait(d, cb, s->fence, &s->err);
        d->vk.vkFreeCommandBuffers(d->dev, s->cmd_pool, 1, &cb);
        if (!st) {
            pthread_mutex_lock(&m->pipe_lock);
            p->warm = true;
            pthread_mutex_unlock(&m->pipe_lock);
            forge__log(&m->log, FORGE_LOG_DEBUG, "prewarm: kernel %s ready in %.3f s", op->name, forge__now_s() - t0);
        }
    }
    if (pool) d->vk.vkDestroyDescriptorPool(d->dev, pool, NULL);
    if (!st && progress) progress(user_data, n, n, NULL);
    return st;
}

/* ---- Profiling: a timestamp after every dispatch ---- */

/* Adds a profiled recording's timestamps to the per-op totals. */
static void forge__profile_collect(forge__device *d, forge__profile *pf, const forge__recording *rc) {
    uint64_t ts[4096];
    uint32_t n = FORGE__MIN(rc->n_dispatches + 1, 4096u);
    if (d->vk.vkGetQueryPoolResults(d->dev, rc->qpool, 0, n, sizeof ts, ts, 8, VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) != VK_SUCCESS)
        return;
    double period_ms = d->caps.props.limits.timestampPeriod * 1e-6;
    for (uint32_t i = 0; i + 1 < n; i++) {
        double ms = (double)(ts[i + 1] - ts[i]) * period_ms;
        pf->ms[rc->ops[i]] += ms;
        pf->calls[rc->ops[i]]++;
        const forge__mat_work *w = &rc->shapes[i];
        if (!w->N) continue;
        int k = 0; /* per matrix shape too: where the time of the products goes */
        uint32_t m_key = w->bits16 ? 0 : w->M; /* (gemm: keyed by M too) */
        while (k < pf->n_shapes && (pf->shape[k].op != rc->ops[i] || pf->shape[k].N != w->N || pf->shape[k].K != w->K || pf->shape[k].M != m_key)) k++;
        if (k == pf->n_shapes) {
            if (k == (int)FORGE__ARRAY_LEN(pf->shape)) continue;
            pf->shape[k] = (struct forge__prof_shape){rc->ops[i], w->N, w->K, w->bits16, m_key, 0, 0, 0, 0};
            pf->n_shapes++;
        }
        pf->shape[k].ms += ms;
        pf->shape[k].calls++;
        pf->shape[k].rows += w->M;
        pf->shape[k].mats += w->mats;
    }
}

/* The profile as JSON {"kernel": {"calls": N, "ms": T}, ..., "kernel NxK": {"calls", "ms", "rows",
 * "gb_s", "tflop_s"}, ...} into out: per matrix shape also the rows multiplied (M summed over
 * the calls), the weights' read rate (N K bits / 8 bytes a matrix read: once a call, an expert
 * product's once per chosen expert) and the products' rate (2 N K rows flops). */
static forge_status forge__profile_json(const forge__profile *pf, char *out, size_t capacity, size_t *len) {
    size_t o = 0;
    int first = 1;
#define FORGE__PJ(...) do { int k_ = snprintf(out && o < capacity ? out + o : NULL, out && o < capacity ? capacity - o : 0, __VA_ARGS__); \
                            if (k_ > 0) o += (size_t)k_; } while (0)
    /* an entry's name, two %s: "host " for a product run on the host, and its kernel's */
#define FORGE__PROF_NAME(i) (i) >= FORGE__OP_COUNT ? "host " : "", forge__ops[(i) % FORGE__OP_COUNT].name
    FORGE__PJ("{");
    for (int i = 0; i < 2 * FORGE__OP_COUNT; i++) {
        if (!pf->calls[i]) continue;
        FORGE__PJ("%s\"%s%s\": {\"calls\": %llu, \"ms\": %.3f}", first ? "" : ", ", FORGE__PROF_NAME(i), (unsigned long long)pf->calls[i], pf->ms[i]);
        first = 0;
    }
    for (int i = 0; i < pf->n_shapes; i++) {
        const struct forge__prof_shape *sh = &pf->shape[i];
        double sec = sh->ms > 0 ? sh->ms * 1e-3 : 1e-30, nk = (double)sh->N * (double)sh->K;
        if (sh->M) { /* gemm.comp: M x N x K, no weight read */
            FORGE__PJ("%s\"%s%s %ux%ux%u\": {\"calls\": %llu, \"ms\": %.3f, \"tflop_s\": %.2f}", first ? "" : ", ", FORGE__PROF_NAME(sh->op), sh->M, sh->N,
                      sh->K, (unsigned long long)sh->calls, sh->ms, 2.0 * nk * (double)sh->rows / sec * 1e-12);
            first = 0;
            continue;
        }
        FORGE__PJ("%s\"%s%s %ux%u\": {\"calls\": %llu, \"ms\": %.3f, \"rows\": %llu, \"gb_s\": %.1f, \"tflop_s\": %.2f}", first ? "" : ", ",
                  FORGE__PROF_NAME(sh->op), sh->N, sh->K, (unsigned long long)sh->calls, sh->ms, (unsigned long long)sh->rows,
                  nk * sh->bits16 / 128.0 * (double)sh->mats / sec * 1e-9, 2.0 * nk * (double)sh->rows / sec * 1e-12);
        first = 0;
    }
    FORGE__PJ("}");
#undef FORGE__PROF_NAME
#undef FORGE__PJ
    *len = o;
    return out && capacity > o ? FORGE_OK : FORGE_ERR_BUFFER_TOO_SMALL;
}

/* ---- The step: one replay of a recorded pass ---- */

/* Makes bytes [offset, offset + bytes) of a readback buffer visible to the host, on memory
 * that is not coherent: only those (rounded out to nonCoherentAtomSize), not the whole buffer
 * of n_out_max logit rows, since a decode step reads back a few KiB. */
static void forge__readback_invalidate(forge__device *d, const forge__buffer *rb, uint64_t offset, uint64_t bytes) {
    if (d->caps.readback_coherent) return;
    uint64_t atom = FORGE__MAX(d->caps.props.limits.nonCoherentAtomSize, 1), lo = offset / atom * atom;
    uint64_t hi = (offset + bytes + atom - 1) / atom * atom;
    VkMappedMemoryRange mr = {.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, .memory = rb->mem, .offset = lo,
                              .size = hi >= rb->size ? VK_WHOLE_SIZE : hi - lo};
    d->vk.vkInvalidateMappedMemoryRanges(d->dev, 1, &mr);
}

/* Runs one step of n tokens at position n_past. FORGE__OUT_LOGITS copies n_out logit rows to
 * `logits`; FORGE__OUT_SAMPLE (n_out = 1) leaves the sampler's candidates in the readback
 * buffer, with `sp` giving the penalty and temperature (its ids already in the io buffer);
 * FORGE__OUT_SAMPLE_MASKED the same over the tokens the io buffer's mask allows. */
static forge_status forge__step(forge_session *s, const int32_t *tokens, uint32_t n, uint32_t out_row0, uint32_t n_out,
                                forge__out_mode mode, const forge__step_params *sp, float *logits) {
    forge__device *d = &s->m->dev;
    forge__recording *rc;
    forge_status st = forge__get_recording(s, n, out_row0, n_out, mode, &rc);
    if (st) return st;
    forge__step_params p = {0, 0, 0, 1.0f, 1.0f, 0, {0, 0}};
    if (sp) p = *sp;
    p.pos0 = (uint32_t)s->n_past;
    p.n_tokens = n;
    if (!s->n_past) s->kv_from = s->kv_high = 0; /* a new sequence: nothing of the old one is left */
    memcpy(s->io.mapped, &p, sizeof p);
    memcpy((uint8_t *)s->io.mapped + s->tokens_r.offset, tokens, 4ull * n);
    if ((st = forge__recording_submit(s->m, rc, s->fence, &s->err))) return st;
    if (rc->qpool) forge__profile_collect(d, &s->prof, rc);
    uint64_t bytes = 4ull * n_out * (uint64_t)s->m->cfg.n_vocab;
    if (mode == FORGE__OUT_LOGITS && bytes && logits) {
        forge__readback_invalidate(d, &s->readback, FORGE__RB_LOGITS_OFFSET, bytes);
        memcpy(logits, (uint8_t *)s->readback.mapped + FORGE__RB_LOGITS_OFFSET, (size_t)bytes);
    }
    memcpy(s->history + s->n_past, tokens, 4ull * n);
    s->n_past += (int)n;
    s->kv_high = FORGE__MAX(s->kv_high, s->n_past);
    return FORGE_OK;
}

/* ---- Steps over the row table ----
 * Rows that name their own (position, place) in the io buffer's row table instead of following
 * pos0: batch generation's steps (batch.c), and generate's lookup step, which verifies drafted
 * tokens of one sequence in one pass with every row reduced as a decode step's row. */

/* Row `row` of the table: position `pos` of the sequence in place `place`. */
static void forge__batch_row(forge_session *s, uint32_t row, uint32_t pos, uint32_t place) {
    uint32_t *t = (uint32_t *)((uint8_t *)s->io.mapped + FORGE__IO_PENALTY_OFFSET);
    t[2 * row] = pos;
    t[2 * row + 1] = place;
}

/* Whether a batch mode reads back logits rows (else the reduction of each row). */
static bool forge__batch_logits_mode(forge__out_mode mode) {
    return mode == FORGE__OUT_BATCH_PREFILL_LOGITS || mode == FORGE__OUT_BATCH_DECODE_LOGITS;
}

/* 1 / temperature of out row `row` (greedy: 0, the best candidate alone), which the device's
 * reduction reads. */
static void forge__batch_temp(forge_session *s, uint32_t row, float temperature) {
    float inv = temperature > 0.0f ? 1.0f / temperature : 0.0f;
    memcpy((uint8_t *)s->io.mapped + s->tokens_r.offset + s->tokens_r.size + 4ull * row, &inv, 4);
}

/* Runs n rows (their table and temperatures written). Logits modes point *logits at the n_out
 * logits rows read back; the others copy each row's reduction to w->red. */
static forge_status forge__batch_step(forge_session *s, const int32_t *tokens, uint32_t n, uint32_t out_row0, uint32_t n_out,
                                      forge__out_mode mode, const float **logits, uint32_t *red) {
    forge__device *d = &s->m->dev;
    forge__recording *rc;
    forge_status st = forge__get_recording(s, n, out_row0, n_out, mode, &rc);
    if (st) return st;
    forge__step_params p = {0, n, 0, 1.0f, 1.0f, 0, {0, 0}};
    memcpy(s->io.mapped, &p, sizeof p);
    memcpy((uint8_t *)s->io.mapped + s->tokens_r.offset, tokens, 4ull * n);
    if ((st = forge__recording_submit(s->m, rc, s->fence, &s->err))) return st;
    if (rc->qpool) forge__profile_collect(d, &s->prof, rc);
    const uint8_t *rb = (const uint8_t *)s->readback.mapped + FORGE__RB_LOGITS_OFFSET;
    uint64_t bytes = forge__batch_logits_mode(mode) ? 4ull * n_out * (uint64_t)s->m->cfg.n_vocab : 8ull * n_out * (1 + FORGE__CANDIDATES);
    forge__readback_invalidate(d, &s->readback, FORGE__RB_LOGITS_OFFSET, bytes);
    if (forge__batch_logits_mode(mode)) *logits = (const float *)rb;
    else memcpy(red, rb, (size_t)bytes); /* the readback then serves a row's logits (forge__batch_fetch_row) */
    return FORGE_OK;
}

/* Copies logits row `row` of the last step to the host: a draw past the candidates. */
static forge_status forge__batch_fetch_row(forge_session *s, uint32_t row, float *out) {
    forge__device *d = &s->m->dev;
    uint64_t bytes = 4ull * s->m->cfg.n_vocab;
    VkCommandBuffer cb = VK_NULL_HANDLE;
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = s->cmd_pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    if (d->vk.vkAllocateCommandBuffers(d->dev, &cai, &cb) != VK_SUCCESS)
        return forge__fail(&s->err, FORGE_ERR_DEVICE, "vkAllocateCommandBuffers failed");
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    d->vk.vkBeginCommandBuffer(cb, &bi);
    forge__rec r = {.dev = d, .cb = cb, .err = &s->err};
    forge__copy(&r, (forge__range){s->logits.buf, s->logits.offset + bytes * row, bytes}, (forge__range){s->readback.buf, FORGE__RB_LOGITS_OFFSET, 0},
                bytes);
    forge__host_barrier(&r);
    d->vk.vkEndCommandBuffer(cb);
    forge_status st = forge__submit_wait(d, cb, s->fence, &s->err);
    d->vk.vkFreeCommandBuffers(d->dev, s->cmd_pool, 1, &cb);
    if (st) return st;
    forge__readback_invalidate(d, &s->readback, FORGE__RB_LOGITS_OFFSET, bytes);
    memcpy(out, (const uint8_t *)s->readback.mapped + FORGE__RB_LOGITS_OFFSET, (size_t)bytes);
    return FORGE_OK;
}

/* ---- The prompt cache's checkpoint (Qwen 3.5) ----
 * A linear-attention layer's recurrent state holds every token it has seen and cannot go back
 * to an earlier position: without help, a prompt that leaves the cached tokens anywhere would
 * be evaluated from position 0. So the session keeps one checkpoint, sequence 0's recurrent
 * states after the first ckpt_pos tokens. Generation takes it where the reply opens: forge_chat
 * marks where its generation prompt begins (a chat's next turn, whose template renders the
 * last reply anew, restarts there), any other prompt after all but its last token. A prompt or
 * a truncation that keeps at least those tokens restarts from it. The checkpoint stays valid
 * whatever the session does next: the states are a function of the tokens alone (the model and
 * its adapter do not change), which ckpt_tokens records; the attention layers' rows before
 * ckpt_pos are the cache's own, which the caller has checked still hold those tokens. */

typedef struct forge__ckpt_args {
    forge_session *s;
    bool restore; /* checkpoint -> states, else states -> checkpoint */
} forge__ckpt_args;

static void forge__record_ckpt_fn(void *ctx, forge__rec *r) {
    const forge__ckpt_args *a = (const forge__ckpt_args *)ctx;
    forge_session *s = a->s;
    const forge__config *c = &s->m->cfg;
    uint64_t off = 0;
    forge__barrier(r);
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < 2 && c->layer_linear[l]; i++) { /* sequence 0's: the start of the layer's range */
            uint64_t bytes = i ? forge__delta_state_bytes(c) : forge__conv_state_bytes(c);
            forge__range state = (i ? s->vc : s->kc)[l], ckpt = {s->lin_ckpt.buf, s->lin_ckpt.offset + off, bytes};
            state.size = bytes;
            forge__copy(r, a->restore ? ckpt : state, a->restore ? state : ckpt, bytes);
            off += bytes;
        }
    forge__barrier(r);
}

static forge_status forge__ckpt_copy(forge_session *s, bool restore) {
    forge__recording rc = {0};
    forge__ckpt_args args = {s, restore};
    forge_status st = forge__record(s->m, s->cmd_pool, false, forge__record_ckpt_fn, &args, &rc, NULL, &s->err);
    if (!st) st = forge__submit_wait(&s->m->dev, rc.cb, s->fence, &s->err);
    forge__recording_free(&s->m->dev, s->cmd_pool, &rc);
    return st;
}

/* Checkpoints the states after the session's n_past tokens (a model with linear layers). */
static forge_status forge__ckpt_take(forge_session *s) {
    if (!forge__has_linear(&s->m->cfg) || s->n_past <= 0) return FORGE_OK;
    if (s->ckpt_pos == s->n_past && !memcmp(s->ckpt_tokens, s->history, 4ull * (size_t)s->n_past)) return FORGE_OK;
    s->ckpt_pos = -1;
    forge_status st = forge__ckpt_copy(s, false);
    if (st) return st;
    memcpy(s->ckpt_tokens, s->history, 4ull * (size_t)s->n_past);
    s->ckpt_pos = s->n_past;
    return FORGE_OK;
}

/* Restarts sequence 0 from the checkpoint when its tokens begin tokens[0, common) (which the
 * cache holds): n_past becomes ckpt_pos, which is returned; 0 when it cannot (no checkpoint,
 * another prefix, a device error: the caller then evaluates from position 0). */
static int forge__ckpt_restart(forge_session *s, const int32_t *tokens, int common) {
    if (s->ckpt_pos <= 0 || s->ckpt_pos > common || memcmp(s->ckpt_tokens, tokens, 4ull * (size_t)s->ckpt_pos)) return 0;
    if (forge__ckpt_copy(s, true)) {
        s->ckpt_pos = -1;
        return 0;
    }
    s->n_past = s->ckpt_pos;
    return s->ckpt_pos;
}

/* ---- Sliding a full context (forge_overflow) ----
 * The kept tokens are history[0, keep) and history[keep + d, n_past); they end at n_past - d.
 * SHIFT moves the cache rows of the second run down d rows (transfer copies in chunks of d
 * rows, so a copy's source and destination never overlap) and rotates the keys back by d
 * positions: rope_back.comp is the rotation by -(pos * inv_freq[i]) with the model's pair
 * layout and frequencies, so with seq_len 1 and pos0 = d it turns a key rotated for position
 * p into one rotated for p - d (the rotations compose; linear and llama3 scaling only change
 * inv_freq). A sliding layer's ring holds position p in slot p % slots; until it wraps
 * (n_past <= slots) slots are positions and it moves like a full layer. A wrapped ring holds
 * positions [n_past - slots, n_past): the new position q sits in slot q % slots and its key
 * was in slot (q + d) % slots, so the whole ring rotates left by d % slots (through a scratch
 * buffer: the activations of the MLP or the logits, whichever is larger, idle between steps)
 * and every row is rotated back. Kept positions still in the ring move with it, so their
 * slots then hold other keys (kv_from): the shift is taken only when the next query's
 * window no longer reaches the kept tokens (and the ring fits the scratch), else the slide
 * recomputes. */

/* The tokens a slide keeps at the start: n_keep, or the BOS token the sequence starts with. */
static int forge__slide_keep(const forge_session *s) {
    if (s->n_keep > 0) return FORGE__MIN(s->n_keep, s->n_past);
    return s->n_past > 0 && s->m->tok.n_vocab && s->history[0] == s->m->tok.bos ? 1 : 0;
}

/* Rotates the keys of cache rows [row0, row0 + n) back by params.pos0 positions: rope_back
 * over the rows as n "tokens" of n_kv_heads key heads, every one at position pos0 (seq_len 1);
 * its -DKV_F16 build on an f16 cache, its -DKV_Q8 build (a workgroup a key head) on a q8_0 one. */
static void forge__rope_shift(forge__rec *r, forge__range params, forge__range inv_freq, forge__range kc, uint32_t row0, uint32_t n,
                              uint32_t NKV, uint32_t D, bool adjacent, forge_kv_type kv) {
    forge__pc_rope_back pc = {n, 0, NKV, D, adjacent, NKV * D, row0 * NKV * D, 1};
    forge__range b[3] = {params, inv_freq, kc};
    uint32_t gx, gy;
    if (kv == FORGE_KV_Q8_0) {
        forge__grid((uint64_t)n * NKV, &gx, &gy);
        forge__dispatch(r, FORGE__OP_ROPE_SHIFT_KV8, b, &pc, gx, gy, 1);
        return;
    }
    bool f16 = kv == FORGE_KV_F16;
    forge__grid(((uint64_t)n * NKV * (f16 ? D / 4 : D / 2) + 63) / 64, &gx, &gy); /* f16: two pairs an invocation */
    forge__dispatch(r, f16 ? FORGE__OP_ROPE_SHIFT_KV16 : FORGE__OP_ROPE_BACK, b, &pc, gx, gy, 1);
}

typedef struct forge__shift_args {
    forge_session *s;
    uint32_t keep, d;
} forge__shift_args;

/* Rows [from, from + n) of a cache range to [to, to + n): copies no longer than the distance
 * (so none overlaps itself), in the order that reads every row before it is overwritten. */
static void forge__move_rows(forge__rec *r, forge__range buf, uint32_t from, uint32_t to, uint32_t n, uint64_t row) {
    uint32_t gap = from > to ? from - to : to - from;
    for (uint32_t done = 0; gap && done < n;) {
        uint32_t k = FORGE__MIN(gap, n - done), at = from > to ? done : n - done - k;
        forge__range src = buf, dst = buf;
        src.offset += (uint64_t)(from + at) * row;
        dst.offset += (uint64_t)(to + at) * row;
        forge__copy(r, src, dst, k * row);
        forge__barrier(r);
        done += k;
    }
}

/* The scratch a ring rotation goes through (see above). */
static forge__range forge__shift_scratch(const forge_session *s) { return s->gu.size >= s->logits.size ? s->gu : s->logits; }

/* Can SHIFT slide this cache (keep, drop d)? Only wrapped rings can say no (see above). */
static bool forge__shift_possible(const forge_session *s, int keep, int d) {
    const forge__config *c = &s->m->cfg;
    if (!forge__uniform_kv(c)) return false; /* Gemma 4's layers differ in shape: the context is recomputed instead */
    uint64_t row = forge__kv_row_bytes(c, 0, s->kv);
    for (int l = 0; l < c->n_layers; l++) {
        int S = (int)s->slots[l];
        if (s->n_past <= S) continue;
        int need_from = FORGE__MAX(0, s->n_past - d - c->sliding_window + 1); /* the next query's window */
        if (keep > need_from || (uint64_t)S * row > forge__shift_scratch(s).size) return false;
    }
    return true;
}

static void forge__record_shift_fn(void *ctx, forge__rec *r) {
    const forge__shift_args *a = (const forge__shift_args *)ctx;
    forge_session *s = a->s;
    const forge__config *c = &s->m->cfg;
    uint32_t D = (uint32_t)c->head_dim, NKV = (uint32_t)c->n_kv_heads, n_past = (uint32_t)s->n_past;
    uint64_t row = forge__kv_row_bytes(c, 0, s->kv);
    forge__range scratch = forge__shift_scratch(s);
    for (int l = 0; l < c->n_layers; l++) {
        uint32_t S = s->slots[l], row0 = a->keep, rows = n_past - a->keep - a->d; /* the rows to rotate back */
        for (int v = 0; v < 2; v++) {
            forge__range buf = (v ? s->vc : s->kc)[l];
            if (n_past <= S) { /* slots are positions */
                forge__move_rows(r, buf, a->keep + a->d, a->keep, rows, row);
                continue;
            }
            uint32_t k = a->d % S; /* rotate the ring left by k: scratch = ring[k, S) ring[0, k), then back */
            forge__range lo = buf, hi = buf, sc_hi = scratch;
            hi.offset += (uint64_t)k * row;
            sc_hi.offset += (uint64_t)(S - k) * row;
            forge__copy(r, hi, scratch, (S - k) * row);
            forge__copy(r, lo, sc_hi, k * row);
            forge__barrier(r);
            forge__copy(r, scratch, buf, S * row);
            forge__barrier(r);
            row0 = 0;
            rows = S;
        }
        const forge__vec *rope = s->m->layers[l].sliding ? &s->m->rope_sliding : &s->m->rope_full;
        forge__rope_shift(r, s->params_r, rope->r, s->kc[l], row0, rows, NKV, D, c->rope_adjacent_pairs, s->kv);
    }
    forge__barrier(r);
}

/* Slides a full context once (forge_session_params.overflow): keeps forge__slide_keep tokens,
 * drops d = (n_past - keep) / 2 (at least 1) after them. FORGE_ERR_LIMIT when nothing follows
 * the kept ones. */
static forge_status forge__slide(forge_session *s) {
    int keep = forge__slide_keep(s), d = FORGE__MAX(s->n_past - keep, 0) / 2;
    if (d < 1 && s->n_past > keep) d = 1; /* one token after the kept ones: drop it */
    if (d < 1)
        return forge__fail(&s->err, FORGE_ERR_LIMIT, "the context (n_ctx %d) cannot slide: it keeps all %d of its %d tokens",
                           s->n_ctx, keep, s->n_past);
    if (s->n_dropped && s->drop_at != keep) s->n_dropped = 0; /* the record no longer describes one span */
    if (s->n_dropped + d > s->dropped_cap) {
        int cap = FORGE__MAX(s->n_dropped + d, 2 * s->dropped_cap);
        int32_t *grown = (int32_t *)realloc(s->dropped, 4ull * (size_t)cap);
        if (!grown) return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        s->dropped = grown;
        s->dropped_cap = cap;
    }
    memcpy(s->dropped + s->n_dropped, s->history + keep, 4ull * (size_t)d);
    s->n_dropped += d;
    s->drop_at = keep;
    int rest = s->n_past - keep - d;
    bool shift = s->overflow == FORGE_OVERFLOW_SHIFT && forge__shift_possible(s, keep, d);
    forge_status st = FORGE_OK;
    if (shift) {
        bool turned = false; /* a wrapped ring turns: its kept slots then hold dropped keys */
        for (int l = 0; l < s->m->cfg.n_layers; l++) turned |= (int)s->slots[l] < s->n_past;
        if (turned || s->kv_from > keep) s->kv_from = FORGE__MAX(keep, s->kv_from - d); /* positions renumbered */
        forge__step_params p = {(uint32_t)d, 0, 0, 1.0f, 1.0f, 0, {0, 0}}; /* rope_back reads pos0 = d */
        memcpy(s->io.mapped, &p, sizeof p);
        forge__recording rc = {0};
        forge__shift_args args = {s, (uint32_t)keep, (uint32_t)d};
        st = forge__record(s->m, s->cmd_pool, false, forge__record_shift_fn, &args, &rc, NULL, &s->err);
        if (!st) st = forge__submit_wait(&s->m->dev, rc.cb, s->fence, &s->err);
        forge__recording_free(&s->m->dev, s->cmd_pool, &rc);
        memmove(s->history + keep, s->history + keep + d, 4ull * (size_t)rest);
        s->n_past -= d;
        s->kv_high = s->n_past; /* a slide comes on a full context: kv_high was n_past */
    } else { /* re-prefill the kept tokens */
        int n = keep + rest;
        int32_t *kept = (int32_t *)malloc(4ull * (size_t)n);
        if (!kept) return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
        memcpy(kept, s->history, 4ull * (size_t)keep);
        memcpy(kept + keep, s->history + keep + d, 4ull * (size_t)rest);
        s->n_past = 0;
        for (int done = 0; !st && done < n;) {
            int step = FORGE__MIN(n - done, s->n_batch);
            st = forge__step(s, kept + done, (uint32_t)step, (uint32_t)step - 1, 0, FORGE__OUT_LOGITS, NULL, NULL);
            done += step;
        }
        free(kept);
    }
    if (st) { /* the cache is in no known state */
        s->n_past = 0;
        s->n_dropped = 0;
        return st;
    }
    s->slides++;
    return FORGE_OK;
}

/* Makes room for n more tokens: slides while they do not fit (fails with FORGE_OVERFLOW_FAIL,
 * or when n > n_ctx - keep, naming n_ctx). */
static forge_status forge__make_room(forge_session *s, int n) {
    if (n <= s->n_ctx - s->n_past) return FORGE_OK;
    int keep = forge__slide_keep(s);
    if (s->overflow == FORGE_OVERFLOW_FAIL || n > s->n_ctx - keep)
        return forge__fail(&s->err, FORGE_ERR_LIMIT, "%d tokens do not fit: the session holds %d of n_ctx %d%s", n, s->n_past, s->n_ctx,
                           s->overflow == FORGE_OVERFLOW_FAIL ? "" : " and a slide keeps the first tokens (n_keep)");
    while (n > s->n_ctx - s->n_past) {
        forge_status st = forge__slide(s);
        if (st) return st;
    }
    return FORGE_OK;
}

/* ---- Creating and destroying a session ---- */

static void forge__session_destroy(forge_session *s) {
    if (!s) return;
    forge_model *m = s->m;
    forge__device *d = &m->dev;
    if (d->dev) d->vk.vkDeviceWaitIdle(d->dev);
    for (int i = 0; i < FORGE__RECORDINGS; i++) forge__recording_free(d, s->cmd_pool, &s->rec[i]);
    if (s->copy_logits_cb) d->vk.vkFreeCommandBuffers(d->dev, s->cmd_pool, 1, &s->copy_logits_cb);
    if (s->cmd_pool) d->vk.vkDestroyCommandPool(d->dev, s->cmd_pool, NULL);
    if (s->fence) d->vk.vkDestroyFence(d->dev, s->fence, NULL);
    for (int b = 0; b < s->n_blocks; b++) forge__buffer_destroy(d, &s->blocks[b], &s->mem, &m->mem_total);
    forge__buffer_destroy(d, &s->io, &s->mem, &m->mem_total);
    forge__buffer_destroy(d, &s->readback, &s->mem, &m->mem_total);
    forge__arena_free(&s->arena);
    forge__buf_free(&s->class_text);
    forge__buf_free(&s->chat_reply);
    free(s->chat_reply_ptrs);
    free(s->dropped);
    free(s);
}

static forge_status forge__session_init(forge_session *s, const forge__session_plan *sp) {
    forge_model *m = s->m;
    forge__device *d = &m->dev;
    const forge__config *c = &m->cfg;
    forge_status st;
    s->n_ctx = sp->n_ctx;
    s->n_batch = sp->n_batch;
    s->n_out_max = sp->n_out_max;
    s->n_reduced = sp->n_reduced;
    s->n_seq = sp->n_seq;
    s->kv = sp->kv;
    s->history = (int32_t *)forge__arena_alloc(&s->arena, 4ull * (size_t)sp->n_ctx, 16);
    s->ckpt_pos = -1;
    if (forge__has_linear(c) && !(s->ckpt_tokens = (int32_t *)forge__arena_alloc(&s->arena, 4ull * (size_t)sp->n_ctx, 16)))
        return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    s->kc = (forge__range *)forge__arena_alloc(&s->arena, sizeof(forge__range) * (size_t)c->n_layers, 16);
    s->vc = (forge__range *)forge__arena_alloc(&s->arena, sizeof(forge__range) * (size_t)c->n_layers, 16);
    s->slots = (uint32_t *)forge__arena_alloc(&s->arena, sizeof(uint32_t) * (size_t)c->n_layers, 16);
    if (!s->history || !s->kc || !s->vc || !s->slots) return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    memcpy(s->slots, sp->slots, sizeof(uint32_t) * (size_t)c->n_layers);
    forge__session_kv_bytes(m, sp, &s->kv_bytes, &s->kv_sliding_bytes, &s->state_bytes);
    if ((st = forge__session_pack(m, sp, &s->pack, &s->arena, &s->err))) return st;
    s->mem.planned = forge__pack_total(&s->pack) + forge__session_host_visible_bytes(m, sp);
    if ((st = forge__memory_check(m, s->mem.planned, "the session", "lower n_ctx, n_batch, n_outputs_max or n_seq_max", &s->err))) return st;
    s->n_blocks = s->pack.n_blocks;
    s->blocks = (forge__buffer *)forge__arena_alloc(&s->arena, sizeof *s->blocks * (size_t)s->n_blocks, 16);
    if (!s->blocks) return forge__fail(&s->err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int b = 0; b < s->n_blocks; b++)
        if ((st = forge__buffer_create(d, s->pack.block_sizes[b], d->caps.mem_device, m->host_products, &s->mem, &m->mem_total, &s->blocks[b], &s->err)))
            return forge__wrap(&s->err, st, "allocating session block %d of %d", b + 1, s->n_blocks);
    forge__range *dst[FORGE__SB_COUNT] = {
        [FORGE__SB_X] = &s->x, [FORGE__SB_XN] = &s->xn, [FORGE__SB_QKV] = &s->qkv, [FORGE__SB_ATT] = &s->att,
        [FORGE__SB_H] = &s->h, [FORGE__SB_GU] = &s->gu, [FORGE__SB_LOGITS] = &s->logits, [FORGE__SB_DUMMY] = &s->dummy,
        [FORGE__SB_CAND] = &s->cand, [FORGE__SB_CAND_STATS] = &s->cand_stats, [FORGE__SB_SAMPLE_OUT] = &s->sample_out,
        [FORGE__SB_ATTN_PART] = &s->attn_part, [FORGE__SB_ATTN_DONE] = &s->attn_done, [FORGE__SB_LORA_U] = &s->lora_u, [FORGE__SB_ACT_Q8] = &s->act_q8,
        [FORGE__SB_ACT_Q8_RES] = &s->act_q8_res, [FORGE__SB_A16] = &s->a16,
        [FORGE__SB_ROUTER] = &s->router, [FORGE__SB_ROUTE] = &s->route, [FORGE__SB_MOE] = &s->moe, [FORGE__SB_MOE_Y] = &s->moe_y,
        [FORGE__SB_MOE_OUT] = &s->moe_out, [FORGE__SB_MLP_SUM] = &s->mlp_sum, [FORGE__SB_PLE] = &s->ple, [FORGE__SB_PLE_TMP] = &s->ple_tmp,
        [FORGE__SB_PLE_G] = &s->ple_g, [FORGE__SB_LIN_MIX] = &s->lin_mix, [FORGE__SB_LIN_QKV] = &s->lin_qkv, [FORGE__SB_LIN_OUT] = &s->lin_out,
        [FORGE__SB_SHARED_S] = &s->shared_s, [FORGE__SB_LIN_CKPT] = &s->lin_ckpt, [FORGE__SB_LIN_CHUNK] = &s->lin_chunk,
    };
    int it = 0;
    for (size_t i = 0; i < FORGE__SB_COUNT; i++, it++) {
        const forge__pack_item *pi = &s->pack.items[it];
        *dst[i] = (forge__range){s->blocks[pi->block].buf, pi->offset, pi->size};
    }
    for (int l = 0; l < c->n_layers; l++)
        for (int kv = 0; kv < 2; kv++, it++) {
            const forge__pack_item *pi = &s->pack.items[it];
            (kv ? s->vc : s->kc)[l] = (forge__range){s->blocks[pi->block].buf, pi->offset, pi->size};
        }
    for (int l = 0; l < c->n_layers; l++) /* a KV-shared layer attends to its source's cache (an earlier layer: assigned) */
        if (forge__kv_shared(c, l)) {
            s->kc[l] = s->kc[c->kv_source[l]];
            s->vc[l] = s->vc[c->kv_source[l]];
        }
    /* (device memory the host sees is a small heap on some GPUs: system memory if it is full) */
    if (forge__buffer_create(d, forge__session_io_bytes(m, sp), d->caps.mem_step, true, &s->mem, &m->mem_total, &s->io, &s->err) &&
        (st = forge__buffer_create(d, forge__session_io_bytes(m, sp), d->caps.mem_upload, true, &s->mem, &m->mem_total, &s->io, &s->err)))
        return st;
    s->params_r = (forge__range){s->io.buf, 0, sizeof(forge__step_params)};
    s->penalty_r = (forge__range){s->io.buf, FORGE__IO_PENALTY_OFFSET, 4ull * FORGE__MAX_PENALTY_WINDOW};
    s->tokens_r = (forge__range){s->io.buf, FORGE__IO_TOKENS_OFFSET, 4ull * sp->n_batch};
    s->mask_r = (forge__range){s->io.buf, forge__session_io_mask_offset(sp), 4ull * (((uint64_t)c->n_vocab + 31) / 32)};
    s->n_chunks = forge__topk_chunks(m);
    if ((st = forge__buffer_create(d, forge__session_readback_bytes(m, sp), d->caps.mem_readback, true, &s->mem, &m->mem_total,
                                   &s->readback, &s->err)))
        return st;
    VkCommandPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                   .queueFamilyIndex = d->caps.queue_family};
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if (d->vk.vkCreateCommandPool(d->dev, &pci, NULL, &s->cmd_pool) != VK_SUCCESS ||
        d->vk.vkCreateFence(d->dev, &fci, NULL, &s->fence) != VK_SUCCESS)
        return forge__fail(&s->err, FORGE_ERR_DEVICE, "creating the session's command pool or fence failed");
    if ((st = forge__zero_ranges(d, s->cmd_pool, s->fence, &s->attn_done, 1, &s->err))) return st; /* attention_decode's counters */
    /* Record the decode steps now, so the first token pays no recording cost (a model that
     * only embeds or reranks decodes nothing). */
    s->embed_dense = forge__session_embed_dense(s);
    forge__recording *rc;
    if (c->bidirectional || c->n_labels || c->no_head) return FORGE_OK;
    if ((st = forge__get_recording(s, 1, 0, 1, FORGE__OUT_SAMPLE, &rc))) return st;
    return forge__get_recording(s, 1, 0, 1, FORGE__OUT_LOGITS, &rc);
}

