/* internal.c: forge's internals for the tests (see internal.h). Built with FORGE_TESTING. */
#include "../forge.c"
#include "internal.h"

struct ft_ctx {
    forge__device dev;
    forge__pipeline pipes[FORGE__OP_COUNT];
    pthread_mutex_t lock;
    forge__mem_counter mem;
    forge__err err;
    VkCommandPool pool;
    VkFence fence;
    int force_kind;  /* -1: as forge picks; 0: shared-memory matvec; 1: subgroup matvec; 2: tensor-core matmul; 3: 128-tile matmul; 4: 32 x 128-tile matmul */
    uint32_t dmax;   /* the head_dim the attention pipelines were made for (forge__rec.dmax) */
};

/* The attention kernels specialized for head_dim D, as a model's would be (small head dims
 * compile and run much faster on lavapipe than the 256 that covers every model). */
static void ft_use_head_dim(ft_ctx *c, uint32_t D) {
    uint32_t want = (uint32_t)forge__align_up(D, 8);
    if (c->dmax == want) return;
    c->dev.vk.vkDeviceWaitIdle(c->dev.dev);
    for (int op = 0; op < FORGE__OP_COUNT; op++) /* the kernels specialized for a head_dim */
        if (forge__ops[op].per_head_dim) forge__pipeline_destroy(&c->dev, &c->pipes[op]);
    c->dmax = want;
}

ft_ctx *ft_open(char *err, size_t err_size) {
    ft_ctx *c = (ft_ctx *)calloc(1, sizeof *c);
    if (forge__device_open(&c->dev, -1, NULL, 0, 0, &c->err)) {
        if (err) snprintf(err, err_size, "%s", c->err.msg);
        forge__device_close(&c->dev);
        free(c);
        return NULL;
    }
    pthread_mutex_init(&c->lock, NULL);
    c->force_kind = -1;
    VkCommandPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, .queueFamilyIndex = c->dev.caps.queue_family};
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    c->dev.vk.vkCreateCommandPool(c->dev.dev, &pci, NULL, &c->pool);
    c->dev.vk.vkCreateFence(c->dev.dev, &fci, NULL, &c->fence);
    return c;
}

void ft_close(ft_ctx *c) {
    if (!c) return;
    c->dev.vk.vkDeviceWaitIdle(c->dev.dev);
    for (int i = 0; i < FORGE__OP_COUNT; i++) forge__pipeline_destroy(&c->dev, &c->pipes[i]);
    c->dev.vk.vkDestroyFence(c->dev.dev, c->fence, NULL);
    c->dev.vk.vkDestroyCommandPool(c->dev.dev, c->pool, NULL);
    pthread_mutex_destroy(&c->lock);
    forge__device_close(&c->dev);
    free(c);
}

const char *ft_errmsg(ft_ctx *c) { return c->err.msg; }

/* Host-visible buffers for the test data: simple and enough for correctness. */
#define FT_MAX_BUFS 64
typedef struct ft_job {
    ft_ctx *c;
    forge__buffer bufs[FT_MAX_BUFS];
    int n;
    forge__rec rec;
    VkDescriptorPool dpool;
} ft_job;

/* A buffer holding `bytes` of `data` (zeros when NULL), padded to 16 bytes as forge's ranges are. */
static forge__range ft_buf(ft_job *j, const void *data, uint64_t bytes) {
    if (j->n == FT_MAX_BUFS) abort(); /* a test harness limit, not forge's */
    forge__buffer *b = &j->bufs[j->n++];
    uint64_t size = forge__align_up(bytes ? bytes : 16, 16);
    forge__buffer_create(&j->c->dev, size, j->c->dev.caps.mem_upload, true, &j->c->mem, NULL, b, &j->c->err);
    memset(b->mapped, 0, (size_t)size);
    if (data) memcpy(b->mapped, data, (size_t)bytes);
    return (forge__range){b->buf, 0, size};
}

static void ft_begin(ft_job *j, ft_ctx *c) {
    memset(j, 0, sizeof *j);
    j->c = c;
    VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1024};
    VkDescriptorPoolCreateInfo dpi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, .maxSets = 256, .poolSizeCount = 1, .pPoolSizes = &ps};
    c->dev.vk.vkCreateDescriptorPool(c->dev.dev, &dpi, NULL, &j->dpool);
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = c->pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    c->dev.vk.vkAllocateCommandBuffers(c->dev.dev, &cai, &j->rec.cb);
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    c->dev.vk.vkBeginCommandBuffer(j->rec.cb, &bi);
    j->rec.dev = &c->dev;
    j->rec.pipes = c->pipes;
    j->rec.pipe_lock = &c->lock;
    j->rec.pool = j->dpool;
    j->rec.err = &c->err;
    j->rec.dmax = c->dmax;
    j->rec.mv_paths = 7u; /* every matvec_sg path, as a GPU compiles it (a model on lavapipe leaves some out: forge__matvec_paths) */
}

/* Submits, waits, copies buffer `idx` back to `out`, frees everything. */
static forge_status ft_end(ft_job *j, int idx, void *out, uint64_t bytes, int idx2, void *out2, uint64_t bytes2) {
    ft_ctx *c = j->c;
    forge_status st = j->rec.st;
    c->dev.vk.vkEndCommandBuffer(j->rec.cb);
    if (!st) st = forge__submit_wait(&c->dev, j->rec.cb, c->fence, &c->err);
    if (!st && out) memcpy(out, j->bufs[idx].mapped, (size_t)bytes);
    if (!st && out2) memcpy(out2, j->bufs[idx2].mapped, (size_t)bytes2);
    c->dev.vk.vkFreeCommandBuffers(c->dev.dev, c->pool, 1, &j->rec.cb);
    c->dev.vk.vkDestroyDescriptorPool(c->dev.dev, j->dpool, NULL);
    for (int i = 0; i < j->n; i++) forge__buffer_destroy(&c->dev, &j->bufs[i], &c->mem, NULL);
    return st;
}

static ft_weight ft_plain(int fmt, const void *W, uint32_t K) {
    ft_weight w = {fmt, W, (size_t)(fmt == FT_F32 ? 4 : 2) * K, NULL, NULL, 0, 0, 0, 0};
    return w;
}

/* Binds rows [r0, r0 + rows) of a stored weight (and its MLX scales/biases). */
static void ft_weight_chunk(ft_job *j, const ft_weight *w, uint32_t r0, uint32_t rows, forge__range dummy, forge__range *wb,
                            forge__range *sb, forge__range *bb) {
    *wb = ft_buf(j, (const uint8_t *)w->data + r0 * w->row_bytes, rows * w->row_bytes);
    *sb = w->scales ? ft_buf(j, (const uint8_t *)w->scales + r0 * w->aux_row_bytes, rows * w->aux_row_bytes) : dummy;
    *bb = w->biases ? ft_buf(j, (const uint8_t *)w->biases + r0 * w->aux_row_bytes, rows * w->aux_row_bytes) : dummy;
}

forge_status ft_linear_w(ft_ctx *c, const ft_weight *w, const float *A, uint32_t a_rows, uint32_t a_row0, uint32_t M, uint32_t K,
                         uint32_t N, uint32_t chunk_rows, const float *bias, uint32_t flags, float softcap, float *C, uint32_t ldc,
                         uint32_t c_col0, int use_matmul) {
    bool cm_path = c->force_kind == 2 && (use_matmul || M > FORGE__MATVEC_MAX_M);
    if (cm_path && K % 8) return FORGE_ERR_INVALID_ARGUMENT; /* (forge__linear takes the SIMT kernels there) */
    ft_job j;
    ft_begin(&j, c);
    forge__range a = ft_buf(&j, A, 4ull * a_rows * K);
    forge__range cc = ft_buf(&j, C, 4ull * M * ldc);
    forge__range dummy = ft_buf(&j, NULL, 16);
    forge__range b = bias ? ft_buf(&j, bias, 4ull * (c_col0 + N)) : dummy;
    if (!chunk_rows) chunk_rows = N;
    forge__range a16 = {0};
    if (cm_path) { /* the tensor cores read A in f16, converted as forge__linear does */
        a16 = ft_buf(&j, NULL, 2ull * M * K + 16);
        forge__record_act_f16(&j.rec, a, a_row0, M, K, a16);
    }
    for (uint32_t r0 = 0; r0 < N; r0 += chunk_rows) {
        uint32_t rows = FORGE__MIN(chunk_rows, N - r0);
        forge__range wb, sb, bb;
        ft_weight_chunk(&j, w, r0, rows, dummy, &wb, &sb, &bb);
        forge__range binds[8] = {a, wb, cc, b, sb, bb, dummy, dummy};
        bool vec = !use_matmul && M <= FORGE__MATVEC_MAX_M, sg = vec && c->dev.caps.subgroup_arith && j.c->force_kind != 0;
        if (vec && j.c->force_kind == 1) sg = true;
        bool cm = !vec && j.c->force_kind == 2;
        /* chunk rows start at row r0 of the output, as the loader's chunks do */
        uint32_t split = forge__matvec_use_split(c->dev.caps.type == FORGE_DEVICE_CPU, w->fmt, M, rows, K) ? forge__matvec_split_rows(rows) : 0;
        uint32_t per = forge__matvec_rows_per_wg(sg, split);
        forge__pc_linear pc = {M, K, rows, a_row0, ldc, c_col0 + r0, flags, c_col0 + r0, softcap, w->bits, w->group, w->qflags, 0, split, 0, 0, 0, 0, 0, 0};
        uint32_t gx, gy;
        if (vec) {
            forge__grid((rows + per - 1) / per, &gx, &gy);
            forge__dispatch(&j.rec, (forge__op)((sg ? FORGE__OP_MATVEC_SG : FORGE__OP_MATVEC) + w->fmt), binds, &pc, gx, gy, 1);
        } else {
            bool big = j.c->force_kind == 3, skinny = j.c->force_kind == 4;
            uint32_t tile = big || cm ? 128 : 64; /* matmul_big.comp and matmul_cm.comp 128 x 128; matmul.comp 64 x 64 */
            uint32_t tn = skinny ? 128 : tile, tm = skinny ? 32 : tile; /* matmul_s: 32 (m) x 128 (n) */
            forge__op op = (forge__op)((cm ? FORGE__OP_MATMUL_CM : big ? FORGE__OP_MATMUL_BIG : skinny ? FORGE__OP_MATMUL_S : FORGE__OP_MATMUL) + w->fmt);
            if (cm) {
                binds[0] = a16;
                pc.a_row0 = 0;
            }
            forge__dispatch(&j.rec, op, binds, &pc, (rows + tn - 1) / tn, (M + tm - 1) / tm, 1);
        }
    }
    return ft_end(&j, 1, C, 4ull * M * ldc, 0, NULL, 0);
}

/* A route (moe_route.comp's (expert, weight bits) per pair) on the device; weights NULL: all 1. */
static forge__range ft_route_buf(ft_job *j, const uint32_t *experts, const float *weights, uint32_t pairs) {
    uint32_t *route = (uint32_t *)malloc(8ull * pairs);
    if (!route) return ft_buf(j, NULL, 8ull * pairs); /* (zeros: the check that reads the result fails) */
    for (uint32_t p = 0; p < pairs; p++) {
        float w = weights ? weights[p] : 1.0f;
        route[2 * p] = experts[p];
        memcpy(&route[2 * p + 1], &w, 4);
    }
    forge__range rb = ft_buf(j, route, 8ull * pairs);
    free(route);
    return rb;
}

forge_status ft_experts(ft_ctx *c, const ft_weight *w, const float *A, uint32_t n_tokens, uint32_t K, uint32_t E, uint32_t R,
                        uint32_t top_k, const uint32_t *experts, uint32_t chunk_experts, int grouped, float *C) {
    if ((!grouped && !c->dev.caps.subgroup_arith) || (grouped == 4 && !c->dev.caps.coopmat_nv)) return FORGE_ERR_UNSUPPORTED;
    if (grouped == 4 && K % 8) return FORGE_ERR_INVALID_ARGUMENT;
    uint32_t pairs = n_tokens * top_k;
    if (!chunk_experts) chunk_experts = E;
    ft_job j;
    ft_begin(&j, c);
    forge__range a = ft_buf(&j, A, 4ull * n_tokens * K);
    forge__range rb = ft_route_buf(&j, experts, NULL, pairs);
    forge__range cc = ft_buf(&j, NULL, 4ull * pairs * R);
    forge__range dummy = ft_buf(&j, NULL, 16);
    uint32_t order_off = forge__moe_order_off(E, pairs);
    uint32_t bm = grouped == 2 ? FORGE__MOE_BM : grouped >= 3 ? FORGE__MOE_BM_S : forge__moe_tile_rows(E, pairs);
    uint32_t tiles = (pairs + bm - 1) / bm + E, bn = bm == FORGE__MOE_BM_S ? 128 : 64;
    forge__op moe_op = grouped == 4 ? FORGE__OP_MATMUL_CM_MOE : bm == FORGE__MOE_BM_S ? FORGE__OP_MATMUL_MOE_S : FORGE__OP_MATMUL_MOE;
    if (grouped == 4) { /* the tensor cores' input in f16, as forge__record_experts makes it */
        forge__range a16 = ft_buf(&j, NULL, 2ull * n_tokens * K + 16);
        forge__record_act_f16(&j.rec, a, 0, n_tokens, K, a16);
        a = a16;
    }
    forge__range moe = dummy;
    if (grouped) {
        moe = ft_buf(&j, NULL, 4ull * (order_off + pairs));
        forge__pc_moe_group pg = {pairs, E, bm, order_off};
        forge__range bg[2] = {rb, moe};
        forge__dispatch(&j.rec, FORGE__OP_MOE_GROUP, bg, &pg, 1, 1, 1);
        forge__barrier(&j.rec);
    }
    for (uint32_t e0 = 0; e0 < E; e0 += chunk_experts) { /* row-chunks of whole experts, as the loader makes them */
        uint32_t n_exp = FORGE__MIN(chunk_experts, E - e0);
        forge__range wb, sb, bb;
        ft_weight_chunk(&j, w, e0 * R, n_exp * R, dummy, &wb, &sb, &bb);
        forge__pc_linear pc = {grouped ? pairs : 1, K, R, 0, R, 0, grouped ? 0 : FORGE__LINEAR_EXPERTS, 0, 0, w->bits, w->group, w->qflags,
                               0, 0, 0, e0, n_exp, top_k, top_k, order_off};
        if (grouped) {
            forge__range binds[7] = {a, wb, cc, dummy, sb, bb, moe};
            forge__dispatch(&j.rec, (forge__op)(moe_op + w->fmt), binds, &pc, (R + bn - 1) / bn, tiles, 1);
        } else {
            forge__range binds[8] = {a, wb, cc, dummy, sb, bb, dummy, rb};
            uint32_t per = forge__matvec_rows_per_wg(true, 0), gx, gy;
            forge__grid((R + per - 1) / per, &gx, &gy);
            forge__dispatch(&j.rec, (forge__op)(FORGE__OP_MATVEC_SG + w->fmt), binds, &pc, gx, gy, pairs);
        }
    }
    return ft_end(&j, 2, C, 4ull * pairs * R, 0, NULL, 0);
}

forge_status ft_experts_back(ft_ctx *c, const ft_weight *w, const float *dY, uint32_t n_tokens, uint32_t K, uint32_t E, uint32_t R,
                             uint32_t top_k, const uint32_t *experts, const float *weights, int per_token, uint32_t chunk_experts, float *dX) {
    uint32_t pairs = n_tokens * top_k, y_rows = per_token ? n_tokens : pairs;
    if (!chunk_experts) chunk_experts = E;
    ft_job j;
    ft_begin(&j, c);
    forge__range yb = ft_buf(&j, dY, 4ull * y_rows * R);
    forge__range rb = ft_route_buf(&j, experts, weights, pairs);
    forge__range xb = ft_buf(&j, NULL, 4ull * pairs * K);
    forge__range dummy = ft_buf(&j, NULL, 16);
    uint32_t order_off = forge__moe_order_off(E, pairs), bm = forge__moe_tile_rows(E, pairs);
    forge__range moe = ft_buf(&j, NULL, 4ull * (order_off + pairs));
    forge__pc_moe_group pg = {pairs, E, bm, order_off};
    forge__range bg[2] = {rb, moe};
    forge__dispatch(&j.rec, FORGE__OP_MOE_GROUP, bg, &pg, 1, 1, 1);
    forge__barrier(&j.rec);
    for (uint32_t e0 = 0; e0 < E; e0 += chunk_experts) { /* row-chunks of whole experts, each writing its own pairs' rows */
        uint32_t n_exp = FORGE__MIN(chunk_experts, E - e0);
        forge__range wb, sb, bb;
        ft_weight_chunk(&j, w, e0 * R, n_exp * R, dummy, &wb, &sb, &bb);
        forge__pc_back pc = {pairs, K, R, 0, R, K, 0, per_token ? 2u : 0u, w->bits, w->group, w->qflags, e0, n_exp, order_off, per_token ? top_k : 1};
        forge__range binds[7] = {yb, wb, xb, sb, bb, moe, rb};
        forge__dispatch(&j.rec, (forge__op)(FORGE__OP_MATMUL_BACK_MOE + w->fmt), binds, &pc, (K + 63) / 64, (uint32_t)forge__moe_max_tiles(E, pairs), 1);
    }
    return ft_end(&j, 2, dX, 4ull * pairs * K, 0, NULL, 0);
}

forge_status ft_matmul_big(ft_ctx *c, const ft_weight *w, const float *A, uint32_t M, uint32_t K, uint32_t N, float *C) {
    c->force_kind = 3;
    forge_status st = ft_linear_w(c, w, A, M, 0, M, K, N, 0, NULL, 0, 0, C, N, 0, 1);
    c->force_kind = -1;
    return st;
}

forge_status ft_matmul_s(ft_ctx *c, const ft_weight *w, const float *A, uint32_t M, uint32_t K, uint32_t N, float *C) {
    c->force_kind = 4;
    forge_status st = ft_linear_w(c, w, A, M, 0, M, K, N, 0, NULL, 0, 0, C, N, 0, 1);
    c->force_kind = -1;
    return st;
}

forge_status ft_matmul_cm(ft_ctx *c, const ft_weight *w, const float *A, uint32_t M, uint32_t K, uint32_t N, float *C) {
    if (!c->dev.caps.coopmat_nv) return FORGE_ERR_UNSUPPORTED;
    c->force_kind = 2;
    forge_status st = ft_linear_w(c, w, A, M, 0, M, K, N, 0, NULL, 0, 0, C, N, 0, 1);
    c->force_kind = -1;
    return st;
}

forge_status ft_matmul_split(ft_ctx *c, int kind, const ft_weight *w, const float *A, uint32_t M, uint32_t K, uint32_t N, uint32_t splits,
                             const float *bias, uint32_t flags, float softcap, float *C) {
    bool cm = kind != FT_SPLIT_SIMT, skinny = kind == FT_SPLIT_CM_SKINNY;
    if (cm && !c->dev.caps.coopmat_nv) return FORGE_ERR_UNSUPPORTED;
    if ((cm && K % 8) || (skinny && (w->fmt != FT_F16 || M > 32 || N % 16 || K % 64))) return FORGE_ERR_INVALID_ARGUMENT;
    ft_job j;
    ft_begin(&j, c);
    forge__range a = ft_buf(&j, A, 4ull * M * K);
    forge__range cc = ft_buf(&j, C, 4ull * M * N); /* (buffer 1: read back) */
    if (cm) { /* the tensor cores' input in f16, as forge__linear makes it */
        forge__range a16 = ft_buf(&j, NULL, 2ull * M * K + 16);
        forge__record_act_f16(&j.rec, a, 0, M, K, a16);
        a = a16;
    }
    forge__range dummy = ft_buf(&j, NULL, 16);
    forge__range part = ft_buf(&j, NULL, 4ull * (splits ? splits : 1) * M * N);
    forge__range b = bias ? ft_buf(&j, bias, 4ull * N) : dummy;
    forge__range wb, sb, bb;
    ft_weight_chunk(&j, w, 0, N, dummy, &wb, &sb, &bb);
    forge__op op = skinny ? FORGE__OP_MATMUL_CM_S : (forge__op)((cm ? FORGE__OP_MATMUL_CM : FORGE__OP_MATMUL) + w->fmt);
    uint32_t tn = skinny ? 64 : cm ? 128 : 64, tm = skinny ? 32 : cm ? 128 : 64, step = cm ? 64 : 32;
    forge__pc_linear pc = {M, K, N, 0, N, 0, flags, 0, softcap, w->bits, w->group, w->qflags, 0, 0, 0, 0, 0, 0, 0, 0};
    if (splits <= 1) {
        forge__range bd[7] = {a, wb, cc, b, sb, bb, dummy};
        forge__dispatch(&j.rec, op, bd, &pc, (N + tn - 1) / tn, (M + tm - 1) / tm, 1);
        return ft_end(&j, 1, C, 4ull * M * N, 0, NULL, 0);
    }
    uint32_t k_chunk = (uint32_t)forge__align_up((K + splits - 1) / splits, step);
    splits = (K + k_chunk - 1) / k_chunk;
    pc.flags = FORGE__LINEAR_SPLIT_K;
    pc.k_split = k_chunk;
    forge__range bp[7] = {a, wb, part, dummy, sb, bb, dummy};
    forge__dispatch(&j.rec, op, bp, &pc, (N + tn - 1) / tn, (M + tm - 1) / tm, splits);
    forge__barrier(&j.rec);
    pc.flags = flags;
    forge__record_linear_reduce(&j.rec, part, cc, b, &pc, splits);
    return ft_end(&j, 1, C, 4ull * M * N, 0, NULL, 0);
}

int ft_has_subgroup_matvec(ft_ctx *c) { return c->dev.caps.subgroup_arith; }

forge_status ft_matvec_sg(ft_ctx *c, const ft_weight *w, const float *A, uint32_t M, uint32_t K, uint32_t outs, uint32_t flags,
                          const float *bias, const float *g, float eps, float softcap, int split, float *C) {
    ft_job j;
    ft_begin(&j, c);
    bool gated = flags & FORGE__LINEAR_GATED;
    uint32_t rows = gated ? 2 * outs : outs;
    forge__range a = ft_buf(&j, A, 4ull * M * K);
    forge__range cc = ft_buf(&j, C, 4ull * M * outs);
    forge__range dummy = ft_buf(&j, NULL, 16);
    forge__range b = bias ? ft_buf(&j, bias, 4ull * outs) : dummy;
    forge__range gb = g ? ft_buf(&j, g, 4ull * K) : dummy;
    forge__range wb, sb, bb;
    ft_weight_chunk(&j, w, 0, rows, dummy, &wb, &sb, &bb);
    forge__range binds[8] = {a, wb, cc, b, sb, bb, gb, dummy};
    /* split: the K-split mapping forge uses for one token on GPUs, here on any device */
    uint32_t rows_per_wg = split && M == 1 ? forge__matvec_split_rows(outs) : 0;
    forge__pc_linear pc = {M, K, outs, 0, outs, 0, flags, 0, softcap, w->bits, w->group, w->qflags, eps, rows_per_wg, 0, 0, 0, 0, 0, 0};
    uint32_t gx, gy;
    forge__grid((outs + forge__matvec_rows_per_wg(true, rows_per_wg) - 1) / forge__matvec_rows_per_wg(true, rows_per_wg), &gx, &gy);
    forge__dispatch(&j.rec, (forge__op)(FORGE__OP_MATVEC_SG + w->fmt), binds, &pc, gx, gy, 1);
    return ft_end(&j, 1, C, 4ull * M * outs, 0, NULL, 0);
}

forge_status ft_matvec_kind(ft_ctx *c, const ft_weight *w, const float *A, uint32_t M, uint32_t K, uint32_t N, float *C, int sg) {
    c->force_kind = sg ? 1 : 0;
    forge_status st = ft_linear_w(c, w, A, M, 0, M, K, N, 0, NULL, 0, 0, C, N, 0, 0);
    c->force_kind = -1;
    return st;
}

forge_status ft_linear(ft_ctx *c, int fmt, const float *A, uint32_t a_rows, uint32_t a_row0, uint32_t M, uint32_t K,
                       const void *W, uint32_t N, uint32_t chunk_rows, const float *bias, uint32_t flags, float softcap,
                       float *C, uint32_t ldc, uint32_t c_col0, int use_matmul) {
    ft_weight w = ft_plain(fmt, W, K);
    return ft_linear_w(c, &w, A, a_rows, a_row0, M, K, N, chunk_rows, bias, flags, softcap, C, ldc, c_col0, use_matmul);
}

forge_status ft_embed_w(ft_ctx *c, const ft_weight *w, const uint32_t *tokens, uint32_t n, uint32_t rows, uint32_t hidden,
                        uint32_t chunk_rows, float scale, uint32_t round_mode, float *out) {
    ft_job j;
    ft_begin(&j, c);
    forge__range t = ft_buf(&j, tokens, 4ull * n);
    forge__range o = ft_buf(&j, NULL, 4ull * n * hidden);
    forge__range dummy = ft_buf(&j, NULL, 16);
    if (!chunk_rows) chunk_rows = rows;
    for (uint32_t r0 = 0; r0 < rows; r0 += chunk_rows) {
        uint32_t cr = FORGE__MIN(chunk_rows, rows - r0);
        forge__range wb, sb, bb;
        ft_weight_chunk(&j, w, r0, cr, dummy, &wb, &sb, &bb);
        forge__range binds[5] = {t, wb, o, sb, bb};
        forge__pc_embed pc = {n, hidden, r0, cr, scale, round_mode, w->bits, w->group, w->qflags};
        forge__dispatch(&j.rec, (forge__op)(FORGE__OP_EMBED + w->fmt), binds, &pc, n, 1, 1);
    }
    return ft_end(&j, 1, out, 4ull * n * hidden, 0, NULL, 0);
}

forge_status ft_embed(ft_ctx *c, int fmt, const uint32_t *tokens, uint32_t n, const void *table, uint32_t rows,
                      uint32_t hidden, uint32_t chunk_rows, float scale, uint32_t round_mode, float *out) {
    ft_weight w = ft_plain(fmt, table, hidden);
    return ft_embed_w(c, &w, tokens, n, rows, hidden, chunk_rows, scale, round_mode, out);
}

forge_status ft_rmsnorm(ft_ctx *c, const float *x, uint32_t x_rows, uint32_t x_row0, uint32_t rows, uint32_t dim,
                        const float *w, float eps, uint32_t add, float *out, uint32_t out_rows, uint32_t out_row0) {
    ft_job j;
    ft_begin(&j, c);
    forge__range xb = ft_buf(&j, x, 4ull * x_rows * dim);
    forge__range wb = ft_buf(&j, w, 4ull * dim);
    forge__range ob = ft_buf(&j, out, 4ull * out_rows * dim);
    forge__range binds[4] = {xb, wb, ob, ob};
    forge__pc_rmsnorm pc = {dim, x_row0, out_row0, add, eps, 0, 0, 0, 1.0f};
    forge__dispatch(&j.rec, FORGE__OP_RMSNORM, binds, &pc, rows, 1, 1);
    return ft_end(&j, 2, out, 4ull * out_rows * dim, 0, NULL, 0);
}

/* The fused rope kernel on q only (kc == NULL: x rotated in place), or on k and v only (x = k,
 * v separate: they are laid out as k | v rows, as in the fused qkv rows). */
static forge_status ft_rope_impl(ft_ctx *c, float *x, const float *v, uint32_t n, uint32_t heads, uint32_t D,
                                 const float *inv_freq, uint32_t pos0, int adjacent, uint32_t slots, void *kc, void *vc, forge_kv_type kv) {
    ft_job j;
    ft_begin(&j, c);
    forge__step_params sp = {pos0, n, 0, 1.0f, 1.0f, 0, {0, 0}};
    forge__range pb = ft_buf(&j, &sp, sizeof sp);
    forge__range fb = ft_buf(&j, inv_freq, 4ull * D / 2);
    bool store = kc != NULL;
    uint32_t HD = heads * D, stride = store ? 2 * HD : HD;
    float *rows = (float *)malloc(4ull * n * stride);
    for (uint32_t t = 0; t < n; t++) {
        memcpy(rows + (size_t)t * stride, x + (size_t)t * HD, 4ull * HD);
        if (store) memcpy(rows + (size_t)t * stride + HD, v + (size_t)t * HD, 4ull * HD);
    }
    forge__range xb = ft_buf(&j, rows, 4ull * n * stride);
    uint64_t cache_bytes = forge__kv_bytes(kv, (uint64_t)slots * heads, D);
    forge__range kb = store ? ft_buf(&j, kc, cache_bytes) : ft_buf(&j, NULL, 16);
    forge__range vb = store ? ft_buf(&j, vc, cache_bytes) : ft_buf(&j, NULL, 16);
    forge__range binds[5] = {pb, fb, xb, kb, vb};
    forge__pc_rope pc = {n, store ? 0 : heads, store ? heads : 0, D, (uint32_t)adjacent, store ? slots : 1, stride, 0, HD, 0, 0};
    uint32_t gx, gy;
    uint32_t per_head = kv == FORGE_KV_Q8_0 ? (D / 32 + 1) / 2 : kv == FORGE_KV_F16 ? D / 4 : D / 2; /* (forward.c's key invocations) */
    forge__grid(((uint64_t)n * heads * per_head + 63) / 64, &gx, &gy);
    forge__dispatch(&j.rec, kv == FORGE_KV_Q8_0 ? FORGE__OP_ROPE_KV8 : kv == FORGE_KV_F16 ? FORGE__OP_ROPE_KV16 : FORGE__OP_ROPE, binds, &pc, gx, gy, 1);
    forge_status st;
    if (store) st = ft_end(&j, 3, kc, cache_bytes, 4, vc, cache_bytes);
    else st = ft_end(&j, 2, x, 4ull * n * HD, 0, NULL, 0);
    free(rows);
    return st;
}

forge_status ft_rope(ft_ctx *c, float *x, uint32_t n, uint32_t heads, uint32_t D, const float *inv_freq, uint32_t pos0, int adjacent) {
    return ft_rope_impl(c, x, NULL, n, heads, D, inv_freq, pos0, adjacent, 1, NULL, NULL, FORGE_KV_F32);
}

forge_status ft_rope_store(ft_ctx *c, const float *k, const float *v, uint32_t n, uint32_t heads, uint32_t D,
                           const float *inv_freq, uint32_t pos0, int adjacent, uint32_t slots, float *kc, float *vc) {
    return ft_rope_impl(c, (float *)k, v, n, heads, D, inv_freq, pos0, adjacent, slots, kc, vc, FORGE_KV_F32);
}

forge_status ft_rope_store16(ft_ctx *c, const float *k, const float *v, uint32_t n, uint32_t heads, uint32_t D,
                             const float *inv_freq, uint32_t pos0, int adjacent, uint32_t slots, uint16_t *kc, uint16_t *vc) {
    return ft_rope_impl(c, (float *)k, v, n, heads, D, inv_freq, pos0, adjacent, slots, kc, vc, FORGE_KV_F16);
}

forge_status ft_rope_store8(ft_ctx *c, const float *k, const float *v, uint32_t n, uint32_t heads, uint32_t D,
                            const float *inv_freq, uint32_t pos0, int adjacent, uint32_t slots, uint8_t *kc, uint8_t *vc) {
    return ft_rope_impl(c, (float *)k, v, n, heads, D, inv_freq, pos0, adjacent, slots, kc, vc, FORGE_KV_Q8_0);
}

size_t ft_kv8_head_bytes(uint32_t D) { return (size_t)forge__kv_bytes(FORGE_KV_Q8_0, 1, D); }

void ft_kv_convert(const void *src, int from, void *dst, int to, size_t heads, uint32_t D) {
    forge__kv_convert((const uint8_t *)src, (forge_kv_type)from, (uint8_t *)dst, (forge_kv_type)to, heads, D);
}

static forge_status ft_attention_impl(ft_ctx *c, const float *q, uint32_t n, uint32_t H, uint32_t Hkv, uint32_t D, const void *kc,
                                      const void *vc, bool f16, uint32_t slots, uint32_t pos0, uint32_t window, float scale,
                                      float softcap, float *out, int split) {
    if (split >= 2 && split <= 3 && !forge__runs_attn_decode(&c->dev.caps)) return FORGE_ERR_UNSUPPORTED;
    if (split >= 4 && (!f16 || !c->dev.caps.coopmat_nv || forge__attn_cm_head_op(D) == FORGE__OP_COUNT)) return FORGE_ERR_UNSUPPORTED;
    ft_use_head_dim(c, D);
    ft_job j;
    ft_begin(&j, c);
    forge__step_params sp = {pos0, n, 0, 1.0f, 1.0f, 0, {0, 0}};
    forge__range pb = ft_buf(&j, &sp, sizeof sp);
    forge__range qb = ft_buf(&j, q, 4ull * n * H * D);
    forge__range kb = ft_buf(&j, kc, (f16 ? 2ull : 4ull) * slots * Hkv * D);
    forge__range vb = ft_buf(&j, vc, (f16 ? 2ull : 4ull) * slots * Hkv * D);
    forge__range ob = ft_buf(&j, NULL, 4ull * n * H * D);
    forge__pc_attention pc = {n, H, Hkv, D, slots, window, scale, softcap, FORGE__ATTN_SPLITS, H * D, 0, 0, 0, 0};
    if (split >= 4) { /* the tensor cores' prefill kernel */
        if (split == 5) { /* batch prefill's row table (flags 2): rows at pos0 + t of sequence 1, whose cache follows sequence 0's slots (NaN) */
            uint32_t *words = (uint32_t *)calloc(16 + 2 * (size_t)n, 4);
            uint16_t *kv2 = (uint16_t *)malloc(2 * 2ull * slots * Hkv * D);
            if (!words || !kv2) abort();
            for (uint32_t t = 0; t < n; t++) {
                words[16 + 2 * t] = pos0 + t;
                words[17 + 2 * t] = 1;
            }
            pb = ft_buf(&j, words, 4ull * (16 + 2 * n));
            size_t half = (size_t)slots * Hkv * D;
            for (size_t i = 0; i < half; i++) kv2[i] = 0x7e00;
            memcpy(kv2 + half, kc, 2 * half);
            kb = ft_buf(&j, kv2, 4ull * half);
            memcpy(kv2 + half, vc, 2 * half);
            vb = ft_buf(&j, kv2, 4ull * half);
            free(words);
            free(kv2);
            pc.flags = 2;
        }
        forge__range binds[6] = {pb, qb, kb, vb, ob, ft_buf(&j, NULL, 16)};
        forge__dispatch(&j.rec, forge__attn_cm_head_op(D), binds, &pc, (n + FORGE__ATTN_CM_QUERIES - 1) / FORGE__ATTN_CM_QUERIES, H, 1);
    } else if (split) {
        forge__range part = ft_buf(&j, NULL, 4ull * n * H * FORGE__ATTN_SPLITS * (D + 2));
        forge__range d16 = ft_buf(&j, NULL, 16);
        forge__range done = ft_buf(&j, NULL, 4ull * n * H), first = ft_buf(&j, NULL, 4ull * n * H * D); /* (zeroed) */
        forge__range binds[13] = {pb, qb, kb, vb, part, d16, kb, vb, d16, d16, first, d16, done};
        forge__op op = split >= 2 ? (f16 ? FORGE__OP_ATTN_DECODE_KV16 : FORGE__OP_ATTN_DECODE) : (f16 ? FORGE__OP_ATTN_SPLIT_KV16 : FORGE__OP_ATTN_SPLIT);
        if (split == 3) { /* merged in the kernel, twice: the second dispatch needs the counters the first left at zero */
            pc.flags = FORGE__ATTN_MERGE;
            forge__dispatch(&j.rec, op, binds, &pc, FORGE__ATTN_SPLITS, H, n);
            forge__barrier(&j.rec);
            binds[10] = ob;
            pc.min_run = 40; /* the second in runs of 40 keys or more (forge__attn_min_run), not rounds of the workgroup */
            forge__dispatch(&j.rec, op, binds, &pc, FORGE__ATTN_SPLITS, H, n);
        } else {
            forge__dispatch(&j.rec, op, binds, &pc, FORGE__ATTN_SPLITS, H, n);
            forge__barrier(&j.rec);
            forge__pc_combine pcm = {H, D, FORGE__ATTN_SPLITS, 0};
            forge__range bc[3] = {part, ob, ft_buf(&j, NULL, 16)};
            forge__dispatch(&j.rec, FORGE__OP_ATTN_COMBINE, bc, &pcm, H, n, 1);
        }
    } else {
        forge__range lse = ft_buf(&j, NULL, 16);
        forge__range binds[6] = {pb, qb, kb, vb, ob, lse};
        uint32_t bq = forge__attn_block_queries(j.rec.dmax);
        forge__dispatch(&j.rec, f16 ? FORGE__OP_ATTENTION_KV16 : FORGE__OP_ATTENTION, binds, &pc, (n + bq - 1) / bq, H, 1);
    }
    return ft_end(&j, 4, out, 4ull * n * H * D, 0, NULL, 0);
}

forge_status ft_attention(ft_ctx *c, const float *q, uint32_t n, uint32_t H, uint32_t Hkv, uint32_t D, const float *kc,
                          const float *vc, uint32_t slots, uint32_t pos0, uint32_t window, float scale, float softcap,
                          float *out, int split) {
    return ft_attention_impl(c, q, n, H, Hkv, D, kc, vc, false, slots, pos0, window, scale, softcap, out, split);
}

forge_status ft_attention16(ft_ctx *c, const float *q, uint32_t n, uint32_t H, uint32_t Hkv, uint32_t D, const uint16_t *kc,
                            const uint16_t *vc, uint32_t slots, uint32_t pos0, uint32_t window, float scale, float softcap,
                            float *out, int split) {
    return ft_attention_impl(c, q, n, H, Hkv, D, kc, vc, true, slots, pos0, window, scale, softcap, out, split);
}

forge_status ft_act_mul(ft_ctx *c, float *g, const float *u, uint32_t count, uint32_t act) {
    ft_job j;
    ft_begin(&j, c);
    forge__range hb = ft_buf(&j, NULL, 4ull * count);
    forge__range gu = ft_buf(&j, NULL, 8ull * count); /* one row in the halves layout: gates, then ups */
    memcpy(j.bufs[1].mapped, g, 4ull * count);
    memcpy((float *)j.bufs[1].mapped + count, u, 4ull * count);
    forge__range binds[3] = {hb, gu, ft_buf(&j, NULL, 16)}; /* (binding 2: the apart layout's ups) */
    forge__pc_act pc = {count, act, FORGE__GU_HALVES, count, 0, 0};
    uint32_t gx, gy;
    forge__grid((count + 255) / 256, &gx, &gy);
    forge__dispatch(&j.rec, FORGE__OP_ACT_MUL, binds, &pc, gx, gy, 1);
    return ft_end(&j, 0, g, 4ull * count, 0, NULL, 0);
}

forge_status ft_delta_rule(ft_ctx *c, uint32_t lanes, uint32_t chunk, uint32_t n, uint32_t group_rows, uint32_t pos0, uint32_t KH, uint32_t VH, uint32_t DK,
                           uint32_t DV, int v_tiled, const float *qkv, const float *mix, const float *neg_a, const float *dt_bias, const float *w,
                           float eps, float *state, float *out) {
    if (chunk && DK > FORGE__DELTA_CHUNK_MAX_K_DIM) return FORGE_ERR_UNSUPPORTED; /* (the recurrent form's) */
    ft_job j;
    ft_begin(&j, c);
    const uint32_t CD = 2 * KH * DK + VH * DV, MIX = VH * DV + 2 * VH, groups = n / group_rows;
    uint32_t params[16] = {pos0, n};
    forge__range pb = ft_buf(&j, params, sizeof params), qb = ft_buf(&j, qkv, 4ull * n * CD), mb = ft_buf(&j, mix, 4ull * n * MIX);
    forge__range ab = ft_buf(&j, neg_a, 4ull * VH), db = ft_buf(&j, dt_bias, 4ull * VH), wb = ft_buf(&j, w, 4ull * DV);
    forge__range sb = ft_buf(&j, state, 4ull * groups * VH * DK * DV), ob = ft_buf(&j, NULL, 4ull * n * VH * DV);
    forge__pc_delta pc = {n, KH, VH, DK, DV, group_rows, 0, MIX, 0, VH * DV, VH * DV + VH, eps, v_tiled ? 1u : 0u, lanes, chunk};
    forge__range b[8] = {pb, qb, mb, ab, db, wb, sb, ob};
    if (chunk) {
        forge__range work = ft_buf(&j, NULL, 4ull * n * VH * (2 * FORGE__DELTA_CHUNK + 4));
        forge__range bp[5] = {qb, mb, ab, db, work}, bk[5] = {pb, qb, work, sb, ob};
        forge__dispatch(&j.rec, FORGE__OP_DELTA_RULE_PREP, bp, &pc, (group_rows + chunk - 1) / chunk * VH, groups, 1);
        forge__barrier(&j.rec);
        forge__dispatch(&j.rec, FORGE__OP_DELTA_RULE_CHUNK, bk, &pc, VH * ((DV + FORGE__DELTA_CHUNK_COLS - 1) / FORGE__DELTA_CHUNK_COLS), groups, 1);
        forge__barrier(&j.rec);
        forge__range bn[3] = {mb, wb, ob};
        forge__dispatch(&j.rec, FORGE__OP_GATED_NORM, bn, &pc, VH, n, 1);
    } else if (lanes) {
        forge__dispatch(&j.rec, FORGE__OP_DELTA_RULE_SG, b, &pc, (VH * DV + 64 / lanes - 1) / (64 / lanes), groups, 1);
        forge__barrier(&j.rec);
        forge__range bn[3] = {mb, wb, ob};
        forge__dispatch(&j.rec, FORGE__OP_GATED_NORM, bn, &pc, VH, n, 1);
    } else {
        forge__dispatch(&j.rec, FORGE__OP_DELTA_RULE, b, &pc, VH, groups, 1);
    }
    forge__host_barrier(&j.rec);
    return ft_end(&j, 6, state, 4ull * groups * VH * DK * DV, 7, out, 4ull * n * VH * DV);
}

forge_status ft_conv1d(ft_ctx *c, const float *x, const float *w, float *state, float *y, uint32_t n, uint32_t channels, uint32_t taps,
                       uint32_t in_stride, uint32_t group_rows, uint32_t pos0) {
    ft_job j;
    ft_begin(&j, c);
    uint32_t params[16] = {pos0, n}, groups = n / group_rows;
    forge__range pb = ft_buf(&j, params, sizeof params), xb = ft_buf(&j, x, 4ull * n * in_stride), wb = ft_buf(&j, w, 4ull * channels * taps);
    forge__range sb = ft_buf(&j, state, 4ull * groups * (taps - 1) * channels), yb = ft_buf(&j, NULL, 4ull * n * channels);
    forge__range b[5] = {pb, xb, wb, sb, yb};
    forge__pc_conv pc = {n, channels, taps, in_stride, group_rows, 0};
    forge__dispatch(&j.rec, FORGE__OP_CONV1D, b, &pc, (channels + 31) / 32, groups, 1);
    forge__host_barrier(&j.rec);
    return ft_end(&j, 3, state, 4ull * groups * (taps - 1) * channels, 4, y, 4ull * n * channels);
}

int ft_has_subgroup_shuffle(ft_ctx *c, uint32_t *width) {
    *width = c->dev.caps.subgroup_size;
    return c->dev.caps.subgroup_shuffle;
}

uint16_t ft_f32_to_f16(float f) { return forge__f32_to_f16(f); }
float ft_f16_to_f32(uint16_t h) { return forge__f16_to_f32(h); }
uint16_t ft_f32_to_bf16(float f) { return forge__f32_to_bf16(f); }
float ft_bf16_to_f32(uint16_t h) { return forge__bf16_to_f32(h); }

forge_status ft_config_parse(const char *json, char *err, size_t err_size, int *n_layers, int *hidden, int *head_dim,
                             int *tied, int *sliding_layers, double *attn_scale) {
    forge__config cfg;
    forge__err e = {{0}};
    forge_status st = forge__config_from_hf_json(json, strlen(json), "config.json", &cfg, &e);
    if (err) snprintf(err, err_size, "%s", e.msg);
    if (st) return st;
    *n_layers = cfg.n_layers;
    *hidden = cfg.hidden;
    *head_dim = cfg.head_dim;
    *tied = cfg.tied;
    int sl = 0;
    for (int i = 0; i < cfg.n_layers; i++) sl += cfg.layer_sliding[i];
    *sliding_layers = sl;
    *attn_scale = cfg.attn_scale;
    return FORGE_OK;
}

forge_status ft_safetensors_file(const char *path, char *err, size_t err_size, int *n_tensors) {
    forge__err e = {{0}};
    forge__file f;
    forge__arena a = {0};
    forge__tensor_table t = {0};
    forge_status st = forge__file_map(&f, path, &e);
    if (!st) {
        st = forge__safetensors_parse(&f, &t, &a, &e);
        forge__file_unmap(&f);
    }
    if (n_tensors) *n_tensors = t.count;
    if (err) snprintf(err, err_size, "%s", e.msg);
    forge__arena_free(&a);
    return st;
}

forge_status ft_gguf_file(const char *path, char *err, size_t err_size, int *n_tensors, int *n_kv) {
    forge__err e = {{0}};
    forge__file f;
    forge__arena a = {0};
    forge__tensor_table t = {0};
    forge__gguf g;
    memset(&g, 0, sizeof g);
    forge_status st = forge__file_map(&f, path, &e);
    if (!st) {
        st = forge__gguf_parse(&f, &g, &t, &a, &e);
        forge__file_unmap(&f);
    }
    if (n_tensors) *n_tensors = t.count;
    if (n_kv) *n_kv = g.n_kv;
    if (err) snprintf(err, err_size, "%s", e.msg);
    forge__arena_free(&a);
    return st;
}

forge_status ft_safetensors_mem(const uint8_t *data, size_t size) {
    forge__err e;
    forge__arena a = {0};
    forge__tensor_table t = {0};
    forge__file f = {(char *)"fuzz", data, size, size, false};
    forge_status st = forge__safetensors_parse(&f, &t, &a, &e);
    forge__arena_free(&a);
    return st;
}

uint64_t ft_discover_gguf_head_bytes(uint64_t n) {
    uint64_t old = forge__gguf_head_bytes;
    forge__gguf_head_bytes = n;
    return old;
}

forge_status ft_gguf_mem(const uint8_t *data, size_t size) {
    forge__err e;
    forge__arena a = {0};
    forge__tensor_table t = {0};
    forge__gguf g;
    forge__file f = {(char *)"fuzz", data, size, size, false};
    forge_status st = forge__gguf_parse(&f, &g, &t, &a, &e);
    if (!st) { /* exercise the config reader and the vocabulary walk too */
        forge__config cfg;
        forge__tokenizer tk;
        forge__config_from_gguf(&g, &t, "fuzz", &cfg, &e);
        forge__tokenizer_from_gguf(&tk, &g, &a, "fuzz", &e);
        forge__tokenizer_free(&tk);
    }
    forge__arena_free(&a);
    return st;
}

forge_status ft_config_mem(const uint8_t *data, size_t size) {
    forge__err e;
    forge__config cfg;
    return forge__config_from_hf_json((const char *)data, size, "fuzz", &cfg, &e);
}

forge_status ft_tokenizer_json_mem(const uint8_t *data, size_t size) {
    forge__err e;
    forge__arena a = {0};
    forge__tokenizer tk;
    forge_status st = forge__tokenizer_from_json(&tk, (const char *)data, size, NULL, 0, &a, "fuzz", &e);
    if (!st) { /* a file that loads must also tokenize and decode whatever it declares */
        static const char *texts[] = {"Hello world, it's 2024!", "  \t\n\r\n <s></s> \xc3\xa9t\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd", "\xff\xfe", ""};
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
            forge__tkwork w;
            forge__tkwork_init(&w, &tk);
            forge__tk_encode(&w, texts[i], strlen(texts[i]), i & 1, true);
            forge__buf out;
            forge__buf_init(&out, NULL, 0);
            if (!forge__tkwork_oom(&w)) forge__tk_decode(&tk, (const int32_t *)w.ids.p, FORGE__VEC_LEN(&w.ids, int32_t), false, &out, NULL, &e);
            forge__buf_free(&out);
            forge__tkwork_free(&w);
        }
        forge__tokenizer_free(&tk);
    }
    forge__arena_free(&a);
    return st;
}

forge_status ft_topk(ft_ctx *c, const float *logits, uint32_t V, const uint32_t *ids, uint32_t n_ids, float penalty, float inv_temp,
                     float *cand_logit, int32_t *cand_id, uint32_t *n_cand, float *M, float *S) {
    ft_job j;
    ft_begin(&j, c);
    forge__step_params sp = {0, 1, n_ids, penalty, inv_temp, 0, {0, 0}};
    uint32_t n_chunks = (V + FORGE__TOPK_CHUNK - 1) / FORGE__TOPK_CHUNK;
    forge__range pb = ft_buf(&j, &sp, sizeof sp);
    uint32_t window[FORGE__MAX_PENALTY_WINDOW] = {0}; /* the io buffer's penalty region: n_ids used */
    memcpy(window, ids, 4ull * FORGE__MIN(n_ids, FORGE__MAX_PENALTY_WINDOW));
    forge__range ib = ft_buf(&j, window, sizeof window);
    forge__range lb = ft_buf(&j, logits, 4ull * V);
    forge__range cb = ft_buf(&j, NULL, 8ull * n_chunks * FORGE__CANDIDATES);
    forge__range sb = ft_buf(&j, NULL, 8ull * n_chunks);
    forge__range ob = ft_buf(&j, NULL, 8ull * (1 + FORGE__CANDIDATES));
    forge__range bp[3] = {pb, ib, lb};
    forge__dispatch(&j.rec, FORGE__OP_PENALTY, bp, &V, FORGE__MAX_PENALTY_WINDOW / 64, 1, 1);
    forge__barrier(&j.rec);
    uint32_t pk[3] = {V, FORGE__CANDIDATES, 0};
    forge__range bk[4] = {pb, lb, cb, sb};
    forge__dispatch(&j.rec, FORGE__OP_TOPK, bk, pk, n_chunks, 1, 1);
    forge__barrier(&j.rec);
    uint32_t pm[3] = {n_chunks, FORGE__CANDIDATES, 0};
    forge__range bm[4] = {pb, cb, sb, ob};
    forge__dispatch(&j.rec, FORGE__OP_TOPK_MERGE, bm, pm, 1, 1, 1);
    uint32_t out[2 * (1 + FORGE__CANDIDATES)];
    forge_status st = ft_end(&j, 5, out, sizeof out, 0, NULL, 0);
    if (st) return st;
    memcpy(M, &out[0], 4);
    memcpy(S, &out[1], 4);
    *n_cand = FORGE__MIN(FORGE__CANDIDATES, V);
    for (uint32_t i = 0; i < *n_cand; i++) {
        memcpy(&cand_logit[i], &out[2 + 2 * i], 4);
        cand_id[i] = (int32_t)out[3 + 2 * i];
    }
    return FORGE_OK;
}

void ft_reduce_row_host(const float *row, int V, int n, double inv_temp, float *cand_logit, int32_t *cand_id, double *M, double *S) {
    forge__cand *c = (forge__cand *)malloc(sizeof *c * (size_t)n);
    forge__reduce_row_on_host(row, V, n, inv_temp, c, M, S);
    for (int i = 0; i < n; i++) {
        cand_logit[i] = c[i].logit;
        cand_id[i] = c[i].id;
    }
    free(c);
}

void ft_sort_cands(const float *logit, int n, float *sorted_logit, int32_t *sorted_id) {
    forge__cand *c = (forge__cand *)malloc(sizeof *c * (size_t)n);
    for (int i = 0; i < n; i++) c[i] = (forge__cand){logit[i], i};
    forge__sort_cands(c, n);
    for (int i = 0; i < n; i++) {
        sorted_logit[i] = c[i].logit;
        sorted_id[i] = c[i].id;
    }
    free(c);
}

int32_t ft_sample(const float *logit, const int32_t *id, int n, int complete, double M, double S, float temperature, int top_k,
                  float top_p, float min_p, uint64_t state[4]) {
    forge__cand *c = (forge__cand *)malloc(sizeof *c * (size_t)n);
    double *probs = (double *)malloc(sizeof *probs * (size_t)n);
    for (int i = 0; i < n; i++) c[i] = (forge__cand){logit[i], id[i]};
    forge_generate_params p = forge_generate_default_params();
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    int32_t t = forge__sample_candidates(c, n, complete, M, S, &p, state, probs);
    free(c);
    free(probs);
    return t;
}

void ft_rng_seed(uint64_t state[4], uint64_t seed) { forge__rng_seed(state, seed); }

/* ---- constraints ---- */
int ft_gbnf_match(const char *gbnf, const char *text, size_t n, char *err, size_t err_size) {
    forge__err e = {{0}};
    forge__gram *g = NULL;
    forge_status st = forge__gram_parse(gbnf, strlen(gbnf), NULL, &g, &e);
    if (err && err_size) snprintf(err, err_size, "%s", e.msg);
    if (st) return -(int)st - 1;
    forge__gdfa d;
    if (!forge__dfa_init(&d, g, &e)) {
        forge__gram_free(g);
        return -(int)FORGE_ERR_OUT_OF_MEMORY - 1;
    }
    int32_t s = forge__dfa_start(&d);
    for (size_t i = 0; i < n && s != FORGE__G_DEAD; i++) s = forge__dfa_step(&d, s, (uint8_t)text[i]);
    int r = d.st ? -(int)d.st - 1 : s == FORGE__G_DEAD ? -1 : d.states[s].accept ? 1 : 0;
    if (d.st && err && err_size) snprintf(err, err_size, "%s", e.msg);
    forge__dfa_free(&d);
    forge__gram_free(g);
    return r;
}

int ft_grammar_finish(forge_grammar *gr, int32_t *out, int cap) {
    forge__matcher *g = gr->g;
    if (!g->constrained) return 0;
    forge__gdfa *d = &g->dfa;
    /* one-byte tokens */
    int32_t byte_tok[256];
    for (int b = 0; b < 256; b++) byte_tok[b] = -1;
    const forge__vocab *v = g->voc;
    for (uint32_t i = 1; i < v->n_nodes; i++)
        if (v->nodes[i].depth == 1 && v->nodes[i].tok_n) byte_tok[v->nodes[i].byte] = v->sorted[v->nodes[i].tok_lo];
    /* breadth first over states */
    int cap_q = 1 << 16;
    int32_t *q = (int32_t *)malloc(sizeof *q * (size_t)cap_q), *from = (int32_t *)malloc(sizeof *from * (size_t)cap_q);
    uint8_t *by = (uint8_t *)malloc((size_t)cap_q);
    int head = 0, tail = 0, found = -1;
    q[tail] = g->cur;
    from[tail] = -1;
    by[tail++] = 0;
    /* visited: a small open table of states */
    int vcap = 1 << 18;
    int32_t *seen = (int32_t *)malloc(sizeof *seen * (size_t)vcap);
    for (int i = 0; i < vcap; i++) seen[i] = -1;
    seen[(uint32_t)g->cur * 2654435761u % (uint32_t)vcap] = g->cur;
    while (head < tail && found < 0 && !d->st) {
        int at = head++;
        int32_t s = q[at];
        if (d->states[s].accept) { found = at; break; }
        for (int b = 0; b < 256 && tail < cap_q; b++) {
            if (byte_tok[b] < 0) continue;
            int32_t t = forge__dfa_step(d, s, (uint8_t)b);
            if (t == FORGE__G_DEAD) continue;
            uint32_t k = (uint32_t)t * 2654435761u % (uint32_t)vcap;
            while (seen[k] >= 0 && seen[k] != t) k = (k + 1) % (uint32_t)vcap;
            if (seen[k] == t) continue;
            seen[k] = t;
            q[tail] = t;
            from[tail] = at;
            by[tail++] = (uint8_t)b;
        }
    }
    int n = -1;
    if (found >= 0) {
        n = 0;
        for (int at = found; from[at] >= 0; at = from[at]) n++;
        if (n > cap) n = -1;
        else {
            int i = n;
            for (int at = found; from[at] >= 0; at = from[at]) out[--i] = byte_tok[by[at]];
        }
    }
    free(q);
    free(from);
    free(by);
    free(seen);
    return n;
}

typedef struct ft__rowctx {
    const float *row;
    int V;
} ft__rowctx;
static forge_status ft__fetch(void *ctx, float *row) {
    ft__rowctx *c = (ft__rowctx *)ctx;
    memcpy(row, c->row, 4ull * (size_t)c->V);
    ((ft__rowctx *)ctx)->V = -c->V; /* fetched: marked by the sign */
    return FORGE_OK;
}

int32_t ft_draw_constrained(const float *logits, const uint8_t *allowed, int V, int n_cand, float temperature, int top_k, float top_p,
                            float min_p, uint64_t rng[4], int *used_row) {
    /* a matcher whose choices are exactly the allowed tokens is not needed: build a grammar over a
     * fake vocabulary would be heavy, so the draw runs on a matcher of the empty grammar with its
     * mask and allows replaced through a one-off vocabulary */
    forge_generate_params p = forge_generate_default_params();
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    forge__cand *c = (forge__cand *)malloc(sizeof *c * (size_t)V);
    double M, S;
    forge__reduce_row_on_host(logits, V, n_cand, temperature > 0 ? 1.0 / temperature : 0.0, c, &M, &S);
    /* a vocabulary where token i is the byte 'a' when allowed, 'b' when not; grammar: 'a' repeated */
    size_t sz = sizeof(forge__vocab) + 4ull * (V + 1) + (size_t)V + 8 + 4ull * V + 8 + sizeof(forge__tnode) * 4 + (size_t)V + 16;
    forge__vocab *v = (forge__vocab *)calloc(1, sz);
    char *q = (char *)(v + 1);
    v->nodes = (forge__tnode *)q;
    q += sizeof(forge__tnode) * 4;
    v->off = (uint32_t *)q;
    q += 4ull * (V + 1);
    v->sorted = (int32_t *)q;
    q += 4ull * V + 8;
    v->kind = (uint8_t *)q;
    q += (size_t)V + 8;
    v->bytes = (uint8_t *)q;
    v->n_vocab = V;
    int na = 0;
    for (int i = 0; i < V; i++) if (allowed[i]) v->sorted[na++] = i;
    int nb = na;
    for (int i = 0; i < V; i++) if (!allowed[i]) v->sorted[nb++] = i;
    for (int i = 0; i < V; i++) {
        v->off[i] = (uint32_t)i;
        v->bytes[i] = allowed[i] ? 'a' : 'b';
        v->kind[i] = FORGE__TK_TEXT;
    }
    v->off[V] = (uint32_t)V;
    v->n_nodes = 3;
    v->nodes[0] = (forge__tnode){3, 0, 0, 0, 255, 0, 0};
    v->nodes[1] = (forge__tnode){2, 0, (uint16_t)FORGE__MIN(na, 65535), 'a', 255, 1, 0};
    v->nodes[2] = (forge__tnode){3, (uint32_t)na, (uint16_t)FORGE__MIN(V - na, 65535), 'b', 255, 1, 0};
    v->nodes[3] = (forge__tnode){3, (uint32_t)V, 0, 0, 255, 0, 0};
    forge__matcher *g = (forge__matcher *)calloc(1, sizeof *g);
    forge__err e = {{0}};
    const char *gbnf = "root ::= \"a\"*";
    forge__gram_parse(gbnf, strlen(gbnf), NULL, &g->gram, &e);
    forge__dfa_init(&g->dfa, g->gram, &g->err);
    g->voc = v;
    g->start = -1;
    g->words = (uint32_t)((V + 31) / 32);
    g->max_masks = 4;
    g->is_end = (uint8_t *)calloc((size_t)V + 1, 1);
    g->constrained = g->ever = true;
    g->cur = forge__matcher_start(g);
    forge__cand *scratch = (forge__cand *)malloc(sizeof *scratch * (size_t)V);
    double *probs = (double *)malloc(sizeof *probs * (size_t)V);
    float *row = (float *)malloc(4ull * (size_t)V);
    uint32_t *mask = (uint32_t *)malloc(4ull * g->words);
    ft__rowctx ctx = {logits, V};
    forge__draw_src src = {c, FORGE__MIN(n_cand, V), M, S, NULL, ft__fetch, &ctx};
    int32_t out = -1;
    forge__draw_constrained(g, &p, rng, &src, V, scratch, probs, row, mask, &out, &e);
    *used_row = ctx.V < 0;
    g->voc = NULL;
    forge__matcher_free(g);
    free(v);
    free(c);
    free(scratch);
    free(probs);
    free(row);
    free(mask);
    return out;
}

/* ---- chat ---- */
void ft_model_set_chat_template(forge_model *m, const char *tmpl) { m->chat_template = tmpl; }

forge_status ft_chat_render_on(const forge_model *m, const char *date, const forge_chat_message *msgs, int n, const forge_tool *tools,
                               int n_tools, uint32_t flags, char **out, size_t *len) {
    forge__chat_style st;
    forge__err err = {{0}};
    forge_status s = forge__chat_style_of(m, &st);
    if (s) return s;
    if (date) snprintf(st.date, sizeof st.date, "%s", date);
    forge__sb b = {0};
    s = forge__chat_render_caller(&st, msgs, n, tools, n_tools, flags, &b, &err);
    *out = b.buf;
    *len = b.len;
    return s;
}

/* ft_tool_reply's and ft_tool_reply_ids' text: the content then "\x01NAME\x02ARGUMENTS" a call,
 * or (ids) the calls' ids comma-separated. */
static char *tool_reply_text(int format, const char *text, size_t n, const forge_tool *tools, int n_tools, bool ids, int *n_calls,
                             size_t *content_len) {
    forge__tool_reply r;
    if (forge__parse_tool_reply((forge__tools)format, text, n, tools, n_tools, &r)) return NULL;
    forge__buf o;
    forge__buf_init(&o, NULL, 0);
    if (!ids) forge__buf_put(&o, r.s.p + r.content_off, r.content_len);
    for (int i = 0; i < r.n; i++) {
        const char *name = r.s.p + r.call[i][0], *args = r.s.p + r.call[i][1], *id = r.s.p + r.call[i][2];
        if (ids) {
            if (i) forge__buf_put(&o, ",", 1);
            forge__buf_put(&o, id, strlen(id));
            continue;
        }
        forge__buf_put(&o, "\x01", 1);
        forge__buf_put(&o, name, strlen(name));
        forge__buf_put(&o, "\x02", 1);
        forge__buf_put(&o, args, strlen(args));
    }
    forge__buf_put(&o, "", 1);
    if (n_calls) *n_calls = r.n;
    if (content_len) *content_len = r.content_len;
    forge__tool_reply_free(&r);
    if (o.oom) {
        forge__buf_free(&o);
        return NULL;
    }
    return o.p;
}

char *ft_tool_reply(int format, const char *text, size_t n, const forge_tool *tools, int n_tools, int *n_calls, size_t *content_len) {
    return tool_reply_text(format, text, n, tools, n_tools, false, n_calls, content_len);
}

char *ft_tool_reply_ids(int format, const char *text, size_t n) { return tool_reply_text(format, text, n, NULL, 0, true, NULL, NULL); }

int ft_trigger_opens(const forge_model *m, const char *gbnf, const char *trigger, const char *arm, const int32_t *toks, int n) {
    forge_constraint c = {.struct_size = sizeof c, .kind = FORGE_CONSTRAINT_GBNF, .text = gbnf, .trigger = trigger};
    forge__matcher *g = NULL;
    forge__err e = {{0}};
    if (forge__matcher_new(m, &c, 1, NULL, 0, arm, &g, &e)) return -2;
    int opened = -1;
    for (int i = 0; i < n && opened == -1; i++) {
        if (!forge__matcher_allows(g, toks[i])) opened = -2;
        else {
            forge__matcher_accept(g, toks[i]);
            if (g->ever) opened = i;
        }
    }
    forge__matcher_free(g);
    return opened;
}

char *ft_tool_grammar(int format, const forge_tool *tools, int n_tools, int required, const char **trigger, char *err, size_t err_size) {
    forge__buf o;
    forge__err e = {{0}};
    forge_status s = forge__tool_grammar((forge__tools)format, tools, n_tools, required != 0, &o, trigger, &e);
    if (s) {
        snprintf(err, err_size, "%s", e.msg);
        return NULL;
    }
    forge__buf_put(&o, "", 1);
    return o.p;
}

char *ft_schema_gbnf(const char *schema, size_t n, int *status, char *err, size_t err_size) {
    forge__buf o;
    forge__err e = {{0}};
    *status = (int)forge__schema_to_gbnf(schema, n, &o, &e);
    if (*status) {
        snprintf(err, err_size, "%s", e.msg);
        return NULL;
    }
    forge__buf_put(&o, "", 1);
    return o.p;
}

/* ---- training ---- */

/* Every f32/f16/bf16 tensor of a safetensors file as f32, by name (as the file spells it). */
forge_status ft_safetensors_read(const char *path, ft_tensor_fn fn, void *user) {
    forge__err e = {{0}};
    forge__file f;
    forge__arena a = {0};
    forge__tensor_table t = {0};
    forge_status st = forge__file_map(&f, path, &e);
    if (st) return st;
    /* the canonical-name rewrite of model files does not touch adapter keys (base_model.model.*, model.layers.*) */
    st = forge__safetensors_parse(&f, &t, &a, &e);
    for (int i = 0; i < t.count && !st; i++) {
        const forge__tensor *x = &t.items[i];
        uint64_t n = forge__tensor_elements(x);
        float *v = (float *)malloc(sizeof(float) * (n ? n : 1));
        for (uint64_t k = 0; k < n; k++) {
            if (x->dtype == FORGE__F32) memcpy(&v[k], x->data + 4 * k, 4);
            else {
                uint16_t h;
                memcpy(&h, x->data + 2 * k, 2);
                v[k] = x->dtype == FORGE__F16 ? forge__f16_to_f32(h) : forge__bf16_to_f32(h);
            }
        }
        int64_t shape[4] = {0, 0, 0, 0};
        for (int d = 0; d < x->n_dims; d++) shape[d] = x->shape[d];
        fn(user, x->name, v, x->n_dims, shape);
        free(v);
    }
    forge__file_unmap(&f);
    forge__arena_free(&a);
    return st;
}

/* Runs forward and backward on a batch and adds its gradient to the accumulated one, with no
 * optimizer step (the step's micro-batch count is not advanced). */
forge_status ft_train_backward(forge_trainer *tr, const forge_train_batch *b, double *loss) {
    uint32_t T;
    int64_t count;
    forge_status st = forge__train_fill(tr, b, &T, &count);
    return st ? st : forge__train_run(tr, (uint32_t)b->n_seqs, T, true, count, loss);
}

size_t ft_train_grad_read(forge_trainer *tr, int layer, int target, float *out, size_t cap) {
    const forge__lora_pair *lp = forge__lora_at(&tr->L.lora, layer, (forge__target)target);
    if (!lp) return 0;
    size_t n = (size_t)lp->rank * (lp->in + lp->out);
    if (n > cap) return 0;
    float *seg = (float *)malloc(4 * tr->L.seg_count[lp->seg]);
    if (forge__train_transfer(tr, tr->segs[lp->seg].g, seg, 4 * tr->L.seg_count[lp->seg], false)) {
        n = 0;
    } else { /* B's rows in HF's order, as adapter files hold them */
        forge__lora_map(&tr->m->cfg, (forge__target)target, false, out, seg + lp->a_el, lp->rank, lp->in, false);
        forge__lora_map(&tr->m->cfg, (forge__target)target, true, out + (size_t)lp->rank * lp->in, seg + lp->b_el, lp->out, lp->rank, false);
    }
    free(seg);
    return n;
}

forge_status ft_train_param_add(forge_trainer *tr, int layer, int target, float alpha, const float *dir) {
    const forge__lora_pair *lp = forge__lora_at(&tr->L.lora, layer, (forge__target)target);
    if (!lp) return FORGE_ERR_INVALID_ARGUMENT;
    uint64_t count = tr->L.seg_count[lp->seg];
    size_t na = (size_t)lp->rank * lp->in;
    float *seg = (float *)malloc(4 * count), *d = (float *)malloc(4 * (na + (size_t)lp->out * lp->rank));
    forge_status st = forge__train_transfer(tr, tr->segs[lp->seg].p, seg, 4 * count, false);
    if (!st) { /* dir in forge's order */
        forge__lora_map(&tr->m->cfg, (forge__target)target, false, d, dir, lp->rank, lp->in, true);
        forge__lora_map(&tr->m->cfg, (forge__target)target, true, d + na, dir + na, lp->out, lp->rank, true);
        for (size_t i = 0; i < na; i++) seg[lp->a_el + i] += alpha * d[i];
        for (size_t i = 0; i < (size_t)lp->out * lp->rank; i++) seg[lp->b_el + i] += alpha * d[na + i];
        st = forge__train_transfer(tr, tr->segs[lp->seg].p, seg, 4 * count, true);
    }
    free(seg);
    free(d);
    return st;
}

void ft_train_grad_clear(forge_trainer *tr) {
    forge__range g[64];
    for (int s = 0; s < tr->L.n_segs; s++) g[s] = tr->segs[s].g;
    forge__train_zero(tr, g, tr->L.n_segs);
    tr->micro = 0;
}

int ft_train_checkpointing(const forge_trainer *tr) { return tr->L.ckpt; }

/* ---- the backward kernels, one dispatch (or one pass) each ---- */

/* As ft_end, but copies n buffers back before freeing. */
static forge_status ft_end_keep(ft_job *j, int n, const int *idx, void *const *out, const uint64_t *bytes) {
    ft_ctx *c = j->c;
    forge_status st = j->rec.st;
    c->dev.vk.vkEndCommandBuffer(j->rec.cb);
    if (!st) st = forge__submit_wait(&c->dev, j->rec.cb, c->fence, &c->err);
    for (int i = 0; i < n && !st; i++) memcpy(out[i], j->bufs[idx[i]].mapped, (size_t)bytes[i]);
    c->dev.vk.vkFreeCommandBuffers(c->dev.dev, c->pool, 1, &j->rec.cb);
    c->dev.vk.vkDestroyDescriptorPool(c->dev.dev, j->dpool, NULL);
    for (int i = 0; i < j->n; i++) forge__buffer_destroy(&c->dev, &j->bufs[i], &c->mem, NULL);
    return st;
}

forge_status ft_attention_rope_decode(ft_ctx *c, const float *qkv, uint32_t H, uint32_t Hkv, uint32_t D, const float *inv_freq,
                                      int adjacent, int key_from_row, const float *qk_norm, int v_norm, float eps, void *kc, void *vc,
                                      int f16, uint32_t slots, uint32_t pos, uint32_t window, float scale, float softcap, float *out) {
    if (!forge__runs_attn_decode(&c->dev.caps)) return FORGE_ERR_UNSUPPORTED;
    ft_use_head_dim(c, D);
    ft_job j;
    ft_begin(&j, c);
    uint32_t row = (H + 2 * Hkv) * D;
    uint64_t cache_bytes = (f16 ? 2ull : 4ull) * slots * Hkv * D;
    forge__step_params sp = {pos, 1, 0, 1.0f, 1.0f, 0, {0, 0}};
    forge__range pb = ft_buf(&j, &sp, sizeof sp);
    forge__range qb = ft_buf(&j, qkv, 4ull * row);
    forge__range kb = ft_buf(&j, kc, cache_bytes), vb = ft_buf(&j, vc, cache_bytes);
    forge__range part = ft_buf(&j, NULL, 4ull * H * FORGE__ATTN_SPLITS * (D + 2));
    forge__range fb = ft_buf(&j, inv_freq, 4ull * D / 2);
    forge__range ob = ft_buf(&j, NULL, 4ull * H * D);
    uint32_t flags = FORGE__ATTN_ROPE_Q | (adjacent ? FORGE__ATTN_ROPE_ADJACENT : 0) | (key_from_row ? FORGE__ATTN_ROPE_KEY : 0) |
                     (qk_norm ? FORGE__ATTN_QK_NORM : 0) | (qk_norm && v_norm ? FORGE__ATTN_V_NORM : 0);
    forge__pc_attention pc = {1, H, Hkv, D, slots, window, scale, softcap, FORGE__ATTN_SPLITS, row, 0, flags, eps, 0};
    forge__range nq = qk_norm ? ft_buf(&j, qk_norm, 4ull * D) : ft_buf(&j, NULL, 16);
    forge__range nk = qk_norm ? ft_buf(&j, qk_norm + D, 4ull * D) : ft_buf(&j, NULL, 16);
    forge__range done = ft_buf(&j, NULL, 4ull * H); /* the runs merged as decode merges them (the counters zeroed) */
    forge__range binds[13] = {pb, qb, kb, vb, part, fb, kb, vb, nq, nk, ob, ft_buf(&j, NULL, 16), done};
    pc.flags |= FORGE__ATTN_MERGE;
    forge__dispatch(&j.rec, f16 ? FORGE__OP_ATTN_DECODE_KV16 : FORGE__OP_ATTN_DECODE, binds, &pc, FORGE__ATTN_SPLITS, H, 1);
    int idx[3] = {2, 3, 6}; /* (the norm buffers come after the output) */
    void *outs[3] = {kc, vc, out};
    uint64_t bytes[3] = {cache_bytes, cache_bytes, 4ull * H * D};
    return ft_end_keep(&j, 3, idx, outs, bytes);
}

forge_status ft_matmul_back(ft_ctx *c, const ft_weight *w, const float *dy, uint32_t M, uint32_t N, uint32_t K, uint32_t chunk_rows, int big,
                            float *dx) {
    if (big >= 2 && !c->dev.caps.coopmat_nv) return FORGE_ERR_UNSUPPORTED;
    ft_job j;
    ft_begin(&j, c);
    forge__range yb = ft_buf(&j, dy, 4ull * M * N);
    forge__range xb = ft_buf(&j, NULL, 4ull * M * K);
    forge__range dummy = ft_buf(&j, NULL, 16);
    if (!chunk_rows) chunk_rows = N;
    if (big >= 2) { /* the tensor cores, through the trainer's own recording */
        forge__wchunk chunks[64];
        forge__weight fw = {"w", (forge__wfmt)w->fmt, N, K, w->bits, w->group, w->qflags, 0, chunks};
        for (uint32_t r0 = 0; r0 < N && fw.n_chunks < 64; r0 += chunk_rows, fw.n_chunks++) {
            forge__wchunk *wc = &chunks[fw.n_chunks];
            wc->row0 = r0, wc->rows = FORGE__MIN(chunk_rows, N - r0);
            ft_weight_chunk(&j, w, r0, wc->rows, dummy, &wc->w, &wc->scales, &wc->biases);
        }
        uint32_t rows = big == 3 ? FORGE__MIN(M, 128u) : M;
        forge__range a16 = ft_buf(&j, NULL, forge__back_cm_bytes(rows, chunk_rows, K, 1) + 4ull * 16 * rows * K); /* (and 16 splits' partial sums) */
        forge__linear_back_rec(&j.rec, true, &fw, yb, N, 0, M, xb, K, 0, false, a16, dummy);
        return ft_end(&j, 1, dx, 4ull * M * K, 0, NULL, 0);
    }
    for (uint32_t r0 = 0; r0 < N; r0 += chunk_rows) {
        uint32_t rows = FORGE__MIN(chunk_rows, N - r0);
        forge__range wb, sb, bb;
        ft_weight_chunk(&j, w, r0, rows, dummy, &wb, &sb, &bb);
        forge__range b[5] = {yb, wb, xb, sb, bb};
        forge__pc_back pc = {M, K, rows, r0, N, K, 0, r0 ? 1u : 0u, w->bits, w->group, w->qflags, 0, 0, 0, 1};
        if (r0) forge__barrier(&j.rec);
        uint32_t tile = big ? 128 : 64;
        forge__dispatch(&j.rec, (forge__op)((big ? FORGE__OP_MATMUL_BACK_BIG : FORGE__OP_MATMUL_BACK) + w->fmt), b, &pc, (K + tile - 1) / tile,
                        (M + tile - 1) / tile, 1);
    }
    return ft_end(&j, 1, dx, 4ull * M * K, 0, NULL, 0);
}

forge_status ft_gemm(ft_ctx *c, const float *a, size_t a_n, const float *b, size_t b_n, float *cm, size_t c_n, const uint32_t strides[9],
                     uint32_t M, uint32_t N, uint32_t K, float alpha, int accumulate, uint32_t drop_on, uint32_t drop_ld, float drop_p,
                     uint32_t seed, uint32_t stream) {
    ft_job j;
    ft_begin(&j, c);
    forge__step_params sp = {0, 0, 0, 1.0f, 1.0f, seed, {0, 0}};
    forge__range ab = ft_buf(&j, a, 4 * a_n), bb = ft_buf(&j, b, 4 * b_n), cb = ft_buf(&j, cm, 4 * c_n), pb = ft_buf(&j, &sp, sizeof sp);
    forge__range part = ft_buf(&j, NULL, 4ull * FORGE__GEMM_MAX_SPLITS * M * N); /* split-K when k is long */
    forge__lora lo = {0};
    lo.dropout = drop_p;
    forge__pass p = {NULL, &j.rec, pb, pb, &lo, 0, 0, 1, false, false, true, part, 0, {0}, {0}, {0}, {0}, false, {0}, {0}, {0}, {0}};
    forge__gemm(&p, (forge__mview){ab, strides[0], strides[1], strides[2]}, (forge__mview){bb, strides[3], strides[4], strides[5]},
                (forge__mview){cb, strides[6], strides[7], strides[8]}, M, N, K, alpha, accumulate != 0, drop_on, drop_ld, stream);
    return ft_end(&j, 2, cm, 4 * c_n, 0, NULL, 0);
}

int ft_gemm_shape(const uint32_t strides[9], uint32_t M, uint32_t N, uint32_t K, uint32_t drop_on, uint32_t drop_ld) {
    forge__range none = {0};
    forge__mview a = {none, strides[0], strides[1], strides[2]}, b = {none, strides[3], strides[4], strides[5]}, cv = {none, strides[6], strides[7], strides[8]};
    return (int)forge__rank_pick(&a, &b, &cv, &M, &N, K, &drop_on, drop_ld);
}

forge_status ft_rmsnorm_back(ft_ctx *c, const float *x, const float *w, const float *dy, float *out, size_t n_floats, uint32_t rows, uint32_t dim,
                             uint32_t heads, uint32_t row_stride, uint32_t col0, float eps, int accumulate) {
    ft_job j;
    ft_begin(&j, c);
    forge__range xb = ft_buf(&j, x, 4 * n_floats), wb = ft_buf(&j, w, 4ull * dim), yb = ft_buf(&j, dy, 4 * n_floats), ob = ft_buf(&j, out, 4 * n_floats);
    forge__range b[4] = {xb, wb, yb, ob};
    forge__pc_norm_back pc = {dim, accumulate ? 1u : 0u, eps, heads, row_stride, col0};
    uint32_t gx, gy;
    forge__grid(heads ? (uint64_t)rows * heads : rows, &gx, &gy);
    forge__dispatch(&j.rec, FORGE__OP_RMSNORM_BACK, b, &pc, gx, gy, 1);
    return ft_end(&j, 3, out, 4 * n_floats, 0, NULL, 0);
}

forge_status ft_rope_back(ft_ctx *c, float *x, uint32_t n, uint32_t heads, uint32_t kv_heads, uint32_t D, uint32_t stride, uint32_t k_off,
                          const float *inv_freq, uint32_t seq_len, int adjacent) {
    ft_job j;
    ft_begin(&j, c);
    forge__step_params sp = {0, n, 0, 1.0f, 1.0f, 0, {0, 0}};
    forge__range pb = ft_buf(&j, &sp, sizeof sp), fb = ft_buf(&j, inv_freq, 4ull * D / 2), xb = ft_buf(&j, x, 4ull * n * stride);
    forge__range b[3] = {pb, fb, xb};
    forge__pc_rope_back pc = {n, heads, kv_heads, D, (uint32_t)adjacent, stride, k_off, seq_len};
    uint32_t gx, gy;
    forge__grid(((uint64_t)n * (heads + kv_heads) * (D / 2) + 63) / 64, &gx, &gy);
    forge__dispatch(&j.rec, FORGE__OP_ROPE_BACK, b, &pc, gx, gy, 1);
    return ft_end(&j, 2, x, 4ull * n * stride, 0, NULL, 0);
}

/* Training attention over B sequences of T tokens: the forward pass (attention_tiled with the
 * log-sum-exp) on qkv rows [B * T, (H + 2 Hkv) D] whose k and v columns are also laid out as
 * K and V [B * T, Hkv, D] (positions are not rotated here), then with the output gradient dO
 * [B * T, H, D] the backward pass: O, and dq | dk | dv in rows like qkv. */
forge_status ft_attention_train(ft_ctx *c, const float *qkv, uint32_t B, uint32_t T, uint32_t H, uint32_t Hkv, uint32_t D, uint32_t window,
                                float scale, float softcap, const float *dout, float *out, float *dqkv) {
    ft_use_head_dim(c, D);
    ft_job j;
    ft_begin(&j, c);
    uint32_t n = B * T, QD = H * D, KVD = Hkv * D, S = QD + 2 * KVD;
    float *k = (float *)malloc(4ull * n * KVD), *v = (float *)malloc(4ull * n * KVD);
    for (uint32_t r = 0; r < n; r++) {
        memcpy(k + (size_t)r * KVD, qkv + (size_t)r * S + QD, 4ull * KVD);
        memcpy(v + (size_t)r * KVD, qkv + (size_t)r * S + QD + KVD, 4ull * KVD);
    }
    forge__step_params sp = {0, n, 0, 1.0f, 1.0f, 0, {0, 0}};
    forge__range pb = ft_buf(&j, &sp, sizeof sp);                 /* 0 */
    forge__range qb = ft_buf(&j, qkv, 4ull * n * S);               /* 1 */
    forge__range kb = ft_buf(&j, k, 4ull * n * KVD);               /* 2 */
    forge__range vb = ft_buf(&j, v, 4ull * n * KVD);               /* 3 */
    forge__range ob = ft_buf(&j, NULL, 4ull * n * QD);             /* 4 */
    forge__range lb = ft_buf(&j, NULL, 8ull * n * H);              /* 5 */
    forge__range db = ft_buf(&j, dout, 4ull * n * QD);             /* 6 */
    forge__range gb = ft_buf(&j, NULL, 4ull * n * S);              /* 7 */
    free(k);
    free(v);
    forge__pc_attention pa = {T, H, Hkv, D, T, window, scale, softcap, FORGE__ATTN_SPLITS, S, T * KVD, 1, 0, 0};
    forge__range ba[6] = {pb, qb, kb, vb, ob, lb};
    forge__dispatch(&j.rec, FORGE__OP_ATTENTION, ba, &pa, (T + 7) / 8, H, B);
    forge__barrier(&j.rec);
    forge__pc_attn_back pbk = {T, H, Hkv, D, window, scale, softcap, S, QD, QD + KVD, T * KVD, n, 0};
    forge__range bb[7] = {qb, kb, vb, ob, db, lb, gb};
    uint32_t gx, gy;
    forge__grid(((uint64_t)n * H + 63) / 64, &gx, &gy);
    forge__dispatch(&j.rec, FORGE__OP_ATTN_BACK, bb, &pbk, gx, gy, 1);
    forge__barrier(&j.rec);
    pbk.mode = 1;
    forge__dispatch(&j.rec, FORGE__OP_ATTN_BACK, bb, &pbk, (T + 7) / 8, H, B);
    pbk.mode = 2;
    forge__dispatch(&j.rec, FORGE__OP_ATTN_BACK, bb, &pbk, (T + 7) / 8, Hkv, B);
    int idx[2] = {4, 7};
    void *outs[2] = {out, dqkv};
    uint64_t bytes[2] = {4ull * n * QD, 4ull * n * S};
    return ft_end_keep(&j, 2, idx, outs, bytes);
}

forge_status ft_act_mul_back(ft_ctx *c, const float *dh, const float *gu, float *dgu, uint32_t rows, uint32_t ffn, uint32_t act, int pairs) {
    ft_job j;
    ft_begin(&j, c);
    uint32_t count = rows * ffn;
    forge__range hb = ft_buf(&j, dh, 4ull * count), gb = ft_buf(&j, gu, 8ull * count), ob = ft_buf(&j, NULL, 8ull * count), z = ft_buf(&j, NULL, 16);
    forge__range b[5] = {hb, gb, ob, z, z};
    forge__pc_act pc = {count, act, pairs ? FORGE__GU_PAIRS : FORGE__GU_HALVES, ffn, 0, 0};
    uint32_t gx, gy;
    forge__grid((count + 255) / 256, &gx, &gy);
    forge__dispatch(&j.rec, FORGE__OP_ACT_MUL_BACK, b, &pc, gx, gy, 1);
    return ft_end(&j, 2, dgu, 8ull * count, 0, NULL, 0);
}

forge_status ft_gate_back(ft_ctx *c, float *dh, const float *u, const float *gates, float *dgates, uint32_t rows, uint32_t ffn, uint32_t stride,
                          uint32_t col0) {
    ft_job j;
    ft_begin(&j, c);
    uint32_t count = rows * ffn;
    forge__range hb = ft_buf(&j, dh, 4ull * count), ub = ft_buf(&j, u, 4ull * count), gb = ft_buf(&j, gates, 4ull * rows * stride);
    forge__range db = ft_buf(&j, dgates, 4ull * rows * stride);
    forge__range b[5] = {hb, ub, hb, gb, db}; /* du over dh, as the trainer does */
    forge__pc_act pc = {count, FORGE__ACT_SIGMOID, FORGE__GU_APART_GATE, ffn, stride, col0};
    uint32_t gx, gy;
    forge__grid((count + 255) / 256, &gx, &gy);
    forge__dispatch(&j.rec, FORGE__OP_ACT_MUL_BACK, b, &pc, gx, gy, 1);
    return ft_end(&j, 0, dh, 4ull * count, 3, dgates, 4ull * rows * stride);
}

forge_status ft_conv1d_back(ft_ctx *c, const float *x, const float *w, const float *dy, float *dx, uint32_t n, uint32_t channels, uint32_t taps,
                            uint32_t in_stride, uint32_t group_rows) {
    ft_job j;
    ft_begin(&j, c);
    forge__range xb = ft_buf(&j, x, 4ull * n * in_stride), wb = ft_buf(&j, w, 4ull * channels * taps), yb = ft_buf(&j, dy, 4ull * n * channels);
    forge__range ob = ft_buf(&j, dx, 4ull * n * in_stride);
    forge__range b[4] = {xb, wb, yb, ob};
    forge__pc_conv pc = {n, channels, taps, in_stride, group_rows, 0};
    uint32_t gx, gy;
    forge__grid(((uint64_t)n * channels + 63) / 64, &gx, &gy);
    forge__dispatch(&j.rec, FORGE__OP_CONV1D_BACK, b, &pc, gx, gy, 1);
    return ft_end(&j, 3, dx, 4ull * n * in_stride, 0, NULL, 0);
}

/* The delta rule's push constants for rows of mix [n, VD + 2 NV]: z, then b, then a. */
static forge__pc_delta ft_delta_pc(const ft_delta_shape *d) {
    uint32_t VD = d->v_heads * d->v_dim;
    forge__pc_delta pc = {d->B * d->T, d->k_heads, d->v_heads, d->k_dim, d->v_dim, d->T, 0, VD + 2 * d->v_heads, 0, VD, VD + d->v_heads, d->eps,
                          d->v_tiled, 0, d->chunk};
    return pc;
}

forge_status ft_delta_rule_forward(ft_ctx *c, const ft_delta_shape *d, const float *qkv, const float *mix, const float *neg_a, const float *dt_bias,
                           const float *w, float *out) {
    ft_job j;
    ft_begin(&j, c);
    forge__pc_delta pc = ft_delta_pc(d);
    uint32_t n = d->B * d->T, CD = 2 * d->k_heads * d->k_dim + d->v_heads * d->v_dim, VD = d->v_heads * d->v_dim;
    forge__step_params sp = {0, n, 0, 1.0f, 1.0f, 0, {0, 0}};
    const void *data[8] = {&sp, qkv, mix, neg_a, dt_bias, w, NULL, NULL};
    uint64_t bytes[8] = {sizeof sp, 4ull * n * CD, 4ull * n * pc.mix_stride, 4ull * d->v_heads, 4ull * d->v_heads, 4ull * d->v_dim,
                         4ull * d->B * d->v_heads * d->k_dim * d->v_dim, 4ull * n * VD};
    forge__range b[8];
    for (int i = 0; i < 8; i++) b[i] = ft_buf(&j, data[i], bytes[i]);
    forge__dispatch(&j.rec, FORGE__OP_DELTA_RULE, b, &pc, d->v_heads, d->B, 1);
    return ft_end(&j, 7, out, 4ull * n * VD, 0, NULL, 0);
}

forge_status ft_delta_rule_back(ft_ctx *c, const ft_delta_shape *d, const float *qkv, const float *mix, const float *neg_a, const float *dt_bias,
                                const float *w, const float *dout, float *dqkv, float *dmix) {
    ft_job j;
    ft_begin(&j, c);
    forge__pc_delta pc = ft_delta_pc(d);
    uint32_t n = d->B * d->T, CD = 2 * d->k_heads * d->k_dim + d->v_heads * d->v_dim, VD = d->v_heads * d->v_dim;
    uint64_t n_ck = (d->T + d->chunk - 1) / d->chunk, DKDV = (uint64_t)d->k_dim * d->v_dim;
    uint64_t work = (uint64_t)d->B * d->v_heads * ((n_ck + d->chunk + 2) * DKDV + (uint64_t)d->chunk * d->v_dim);
    /* bindings: qkv, mix, neg_a, dt_bias, w, dout | dqkv, dmix, dqk, work */
    const void *data[10] = {qkv, mix, neg_a, dt_bias, w, dout, NULL, NULL, NULL, NULL};
    uint64_t bytes[10] = {4ull * n * CD, 4ull * n * pc.mix_stride, 4ull * d->v_heads, 4ull * d->v_heads, 4ull * d->v_dim, 4ull * n * VD,
                          4ull * n * CD, 4ull * n * pc.mix_stride, 8ull * n * d->v_heads * d->k_dim, 4 * work};
    forge__range b[10];
    for (int i = 0; i < 10; i++) b[i] = ft_buf(&j, data[i], bytes[i]);
    forge__dispatch(&j.rec, FORGE__OP_DELTA_RULE_BACK, b, &pc, d->v_heads, d->B, 1);
    forge__barrier(&j.rec);
    forge__range bl[3] = {b[0], b[8], b[6]};
    uint32_t gx, gy;
    forge__grid((uint64_t)n * d->k_heads * 2, &gx, &gy);
    forge__dispatch(&j.rec, FORGE__OP_L2NORM_BACK, bl, &pc, gx, gy, 1);
    return ft_end(&j, 6, dqkv, 4ull * n * CD, 7, dmix, 4ull * n * pc.mix_stride);
}

forge_status ft_loss(ft_ctx *c, float *pred, uint32_t rows, uint32_t n, int mode, const int32_t *labels, const float *targets, const float *weights,
                     float softcap, int grad, float *loss) {
    ft_job j;
    ft_begin(&j, c);
    forge__range pb = ft_buf(&j, pred, 4ull * rows * n);
    forge__range tb = mode == 0 ? ft_buf(&j, labels, 4ull * rows) : ft_buf(&j, targets, 4ull * rows * n);
    forge__range wb = ft_buf(&j, weights, 4ull * rows), lb = ft_buf(&j, NULL, 4ull * rows);
    forge__range b[4] = {pb, tb, wb, lb};
    forge__pc_loss pc = {n, 0, rows, (uint32_t)mode, grad ? 1u : 0u, softcap};
    forge__dispatch(&j.rec, FORGE__OP_LOSS, b, &pc, rows, 1, 1);
    return ft_end(&j, 0, pred, 4ull * rows * n, 3, loss, 4ull * rows);
}

forge_status ft_adamw(ft_ctx *c, float *p, float *g, float *m, float *v, uint32_t count, const float opt[8], float *norm2) {
    ft_job j;
    ft_begin(&j, c);
    uint32_t parts = (count + FORGE__ADAMW_PER_WG - 1) / FORGE__ADAMW_PER_WG;
    forge__range pb = ft_buf(&j, p, 4ull * count), gb = ft_buf(&j, g, 4ull * count), mb = ft_buf(&j, m, 4ull * count), vb = ft_buf(&j, v, 4ull * count);
    forge__range ob = ft_buf(&j, opt, 32), nb = ft_buf(&j, NULL, 4ull * (1 + parts));
    forge__range b[6] = {pb, gb, mb, vb, ob, nb};
    forge__pc_adamw p0 = {count, 0, 0, 0}, p1 = {0, 1, 0, parts}, p2 = {count, 2, 0, 0};
    forge__dispatch(&j.rec, FORGE__OP_ADAMW, b, &p0, parts, 1, 1);
    forge__barrier(&j.rec);
    forge__dispatch(&j.rec, FORGE__OP_ADAMW, b, &p1, 1, 1, 1);
    forge__barrier(&j.rec);
    forge__dispatch(&j.rec, FORGE__OP_ADAMW, b, &p2, (count + 255) / 256, 1, 1);
    int idx[5] = {0, 1, 2, 3, 5};
    float n2[2];
    float *tmp = (float *)malloc(4ull * (1 + parts));
    void *outs[5] = {p, g, m, v, tmp};
    uint64_t bytes[5] = {4ull * count, 4ull * count, 4ull * count, 4ull * count, 4ull * (1 + parts)};
    forge_status st = ft_end_keep(&j, 5, idx, outs, bytes);
    n2[0] = tmp[0];
    *norm2 = n2[0];
    free(tmp);
    return st;
}

/* Pretends the model's device has `bytes` of memory (plans are checked against it). */
void ft_model_set_device_memory(forge_model *m, uint64_t bytes) { m->dev.caps.device_local_bytes = bytes; }
void ft_model_set_sample_on_host(forge_model *m, int on) { m->sample_on_host = on != 0; }
int ft_model_on_cpu(const forge_model *m) { return m->dev.caps.type == FORGE_DEVICE_CPU; }
int ft_model_pipelines(forge_model *m, int *warm) {
    int n = 0, w = 0;
    pthread_mutex_lock(&m->pipe_lock);
    for (int op = 0; op < FORGE__OP_COUNT; op++) {
        n += m->pipes[op].pipe != VK_NULL_HANDLE;
        w += m->pipes[op].warm;
    }
    pthread_mutex_unlock(&m->pipe_lock);
    if (warm) *warm = w;
    return n;
}
int ft_model_set_attn_subgroups(forge_model *m, int on) {
    if (on && !forge__runs_attn_decode(&m->dev.caps)) return 0;
    m->attn_subgroups = on != 0;
    return 1;
}
int ft_model_set_act_q8(forge_model *m, int on) {
    if (on && !m->dev.caps.int_dot) return 0;
    m->act_q8 = on != 0;
    return 1;
}

void ft_model_set_q8_chain(forge_model *m, int on) { m->q8_chain = on != 0; }
int ft_model_set_host_products(forge_model *m, int on, uint64_t min_bytes) {
    if (on && !(m->dev.caps.type == FORGE_DEVICE_CPU && m->dev.caps.uma)) return 0;
    m->host_products = on != 0;
    m->host_min_bytes = min_bytes;
    return 1;
}
int ft_session_host_ops(const forge_session *s) {
    int n = 0;
    for (int i = 0; i < FORGE__RECORDINGS; i++) n += (int)s->rec[i].host.n_ops;
    return n;
}
int ft_host_dot(int fmt, const uint8_t *w, const float *x, uint32_t K, float *plain, float *fast) {
    *plain = forge__host_dot_plain((forge__wfmt)fmt, w, x, K);
    forge__host_dots d = forge__host_dots_choose();
    *fast = d.f32((forge__wfmt)fmt, w, x, K);
    return d.f32 != forge__host_dot_plain;
}
int ft_model_set_host_q8(forge_model *m, int on) {
    if (on && !m->host_products) return 0;
    m->host_q8 = on != 0;
    return 1;
}
int ft_host_dot_q8(int fmt, const uint8_t *w, const float *x, uint32_t K, uint32_t R, float *plain, float *fast) {
    int8_t *q = (int8_t *)malloc((size_t)R * K);
    float *d = (float *)malloc(sizeof(float) * R * (K / 32));
    if (!q || !d) abort();
    forge__host_quantize(x, R, K, q, d);
    forge__host_dot_q8_plain((forge__wfmt)fmt, w, q, d, K, R, plain);
    forge__host_dots f = forge__host_dots_choose();
    f.q8((forge__wfmt)fmt, w, q, d, K, R, fast);
    free(q);
    free(d);
    return f.q8 != forge__host_dot_q8_plain;
}
void ft_model_set_matvec_pairs(forge_model *m, uint32_t min_rows) { m->pairs_min_rows = min_rows; }

void ft_model_set_back_cm(forge_model *m, int on) { m->back_cm = on != 0; }

int ft_model_set_attn_cm(forge_model *m, int on) {
    m->attn_cm = on != 0;
    return forge__uses_a16(m);
}

/* An adapter directory from fuzz bytes: [config length u16][format u8: bit 0 mlx-lm, bit 1 a
 * model whose q/k rows rotate adjacent pairs][config JSON][safetensors], read for a small Llama
 * (hidden 64, 4 heads / 2 kv of 16, ffn 128, 2 layers); what reads is written back in both
 * formats. */
static char ft_adapter_dir[256];
static void ft_adapter_dir_remove(void) {
    char cmd[320];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", ft_adapter_dir);
    if (system(cmd)) { /* nothing more to do */ }
}

forge_status ft_adapter_mem(const uint8_t *data, size_t size) {
    char *dir = ft_adapter_dir;
    if (!dir[0]) {
        snprintf(ft_adapter_dir, sizeof ft_adapter_dir, "%s/forge_fuzz_adapter.%ld", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (long)getpid());
        mkdir(dir, 0777);
        atexit(ft_adapter_dir_remove);
    }
    if (size < 3) return FORGE_ERR_FORMAT;
    size_t clen = (size_t)data[0] | (size_t)data[1] << 8;
    uint8_t flags = data[2];
    data += 3;
    size -= 3;
    if (clen > size) clen = size;
    char path[300];
    bool mlx = flags & 1;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/adapters.safetensors", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f) return FORGE_ERR_IO;
    fwrite(data, 1, clen, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/%s", dir, mlx ? "adapters.safetensors" : "adapter_model.safetensors");
    if (!(f = fopen(path, "wb"))) return FORGE_ERR_IO;
    fwrite(data + clen, 1, size - clen, f);
    fclose(f);
    forge_model *m = (forge_model *)calloc(1, sizeof *m);
    forge__config *c = &m->cfg;
    c->arch = FORGE__ARCH_LLAMA;
    c->n_layers = 2;
    c->hidden = 64;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->head_dim = 16;
    c->ffn = 128;
    c->n_vocab = 256;
    c->rope_adjacent_pairs = flags & 2;
    snprintf(m->name, sizeof m->name, "fuzz");
    forge__arena a = {0};
    forge__adapter_host ah;
    forge__err e;
    forge_status st = forge__adapter_read(m, dir, &a, &ah, &e);
    if (!st) {
        char out[300];
        snprintf(out, sizeof out, "%s/out", dir);
        forge__adapter_write(m, &ah, out, FORGE_ADAPTER_PEFT, &e);
        forge__adapter_write(m, &ah, out, FORGE_ADAPTER_MLX, &e);
    }
    forge__arena_free(&a);
    free(m);
    return st;
}

/* ---- state files ----
 * A small model for reading state files without a device: 3 layers (the middle one with a
 * sliding window of 4), 2 kv heads of 4, 64 tokens; sessions of n_ctx 32 and n_batch 2. */
static forge_model *ft_state_model(void) {
    static forge_model m;
    if (!m.cfg.n_layers) {
        forge__config *c = &m.cfg;
        c->arch = FORGE__ARCH_GEMMA2;
        c->n_layers = 3;
        c->hidden = 16;
        c->n_heads = 4;
        c->n_kv_heads = 2;
        c->head_dim = 4;
        c->ffn = 32;
        c->n_vocab = 64;
        c->n_ctx_train = 128;
        c->sliding_window = 4;
        c->layer_sliding[1] = 1;
        for (int l = 0; l < c->n_layers; l++) { /* the per-layer shapes forge__config_finish would fill */
            c->kv_source[l] = (int16_t)l;
            c->layer_head_dim[l] = (uint16_t)c->head_dim;
            c->layer_kv_heads[l] = (uint16_t)c->n_kv_heads;
            c->layer_ffn[l] = c->ffn;
        }
        c->head_dim_max = c->head_dim;
        snprintf(m.name, sizeof m.name, "state-fuzz");
        m.fingerprint = forge__model_fingerprint(&m);
    }
    return &m;
}

forge_status ft_state_mem(const uint8_t *data, size_t size, char *err, size_t err_size) {
    forge__file f = {(char *)"fuzz.state", data, size, size, false};
    forge__arena a = {0};
    forge__state state;
    forge__err e = {{0}};
    forge_status st = forge__state_read(ft_state_model(), 32, &f, &a, &state, &e);
    if (!st) { /* touch what a load would copy */
        volatile uint8_t sink = 0;
        const uint64_t row = forge__kv_row_bytes(&ft_state_model()->cfg, 0, state.kv_f16 ? FORGE_KV_F16 : FORGE_KV_F32);
        for (int l = 0; l < 3; l++)
            for (uint64_t i = 0; i < (uint64_t)state.layers[l].rows * row; i++) sink ^= state.layers[l].k[i] ^ state.layers[l].v[i];
        for (int i = 0; i < 4 * state.n_past; i++) sink ^= state.tokens[i];
        (void)sink;
    }
    if (err) snprintf(err, err_size, "%s", e.msg);
    forge__arena_free(&a);
    return st;
}

size_t ft_state_fake(int n_past, uint8_t **out) {
    forge_model *m = ft_state_model();
    int rows[3] = {n_past, FORGE__MIN(n_past, 4 + 2 - 1), n_past};
    uint8_t *header;
    size_t hs;
    forge__err e;
    *out = NULL;
    if (forge__state_header(m, 32, n_past, rows, false, &header, &hs, &e)) return 0;
    size_t size = hs + 4ull * n_past + 2ull * 32 * (rows[0] + rows[1] + rows[2]);
    uint8_t *b = (uint8_t *)malloc(size);
    memcpy(b, header, hs);
    free(header);
    for (int i = 0; i < n_past; i++) {
        int32_t t = (i * 7 + 1) % 64;
        memcpy(b + hs + 4 * i, &t, 4);
    }
    float *kv = (float *)(b + hs + 4ull * n_past);
    for (size_t i = 0; i < (size - hs - 4ull * n_past) / 4; i++) kv[i] = (float)i * 0.25f;
    *out = b;
    return size;
}

void ft_model_fingerprint(const forge_model *m, char *buf, size_t size) {
    snprintf(buf, size, "%016llx", (unsigned long long)m->fingerprint);
}

void ft_state_disk_left(uint64_t bytes) { forge__test_disk_left = bytes; }
/* ---- sessions (context overflow) ---- */

int ft_session_embed_dense(forge_session *s, int set) {
    if (set >= 0) s->embed_dense = set != 0;
    return s->embed_dense;
}

int ft_session_history(const forge_session *s, int32_t *out, int cap) {
    int n = FORGE__MIN(s->n_past, cap);
    memcpy(out, s->history, 4ull * (size_t)n);
    return s->n_past;
}

typedef struct ft_kv_args {
    forge__range src, dst;
    uint64_t bytes;
} ft_kv_args;

static void ft_kv_copy_fn(void *ctx, forge__rec *r) {
    const ft_kv_args *a = (const ft_kv_args *)ctx;
    forge__copy(r, a->src, a->dst, a->bytes);
    forge__host_barrier(r);
}

forge_status ft_generate_checkpointed(forge_session *s, const int32_t *prompt, int n, int snap, const forge_generate_params *p,
                                      forge_metrics *mt, int *ckpt_pos) {
    forge_status st = forge__slot_acquire(s->m, &s->err);
    if (st) return st;
    st = forge__generate_tokens(s, prompt, n, snap, p, mt);
    forge__slot_release(s->m);
    *ckpt_pos = s->ckpt_pos;
    return st;
}

forge_status ft_session_kv(forge_session *s, int layer, int v, int row0, int n, float *out) {
    forge__device *d = &s->m->dev;
    uint64_t row = forge__kv_row_bytes(&s->m->cfg, layer, s->kv);
    forge__buffer b;
    forge_status st = forge__buffer_create(d, row * (uint64_t)n, d->caps.mem_upload, true, &s->mem, NULL, &b, &s->err);
    if (st) return st;
    ft_kv_args a = {(v ? s->vc : s->kc)[layer], {b.buf, 0, b.size}, row * (uint64_t)n};
    a.src.offset += row * (uint64_t)row0;
    forge__recording rc = {0};
    st = forge__record(s->m, s->cmd_pool, false, ft_kv_copy_fn, &a, &rc, NULL, &s->err);
    if (!st) st = forge__submit_wait(d, rc.cb, s->fence, &s->err);
    forge__recording_free(d, s->cmd_pool, &rc);
    if (!st && s->kv != FORGE_KV_F32)
        forge__kv_convert((const uint8_t *)b.mapped, s->kv, (uint8_t *)out, FORGE_KV_F32, (size_t)n * forge__nkv(&s->m->cfg, layer), forge__hd(&s->m->cfg, layer));
    else if (!st) memcpy(out, b.mapped, (size_t)a.bytes);
    forge__buffer_destroy(d, &b, &s->mem, NULL);
    return st;
}

void ft_rope_inv_freq(double theta, int scaling, double factor, double low, double high, int orig_max, int D, float *out) {
    forge__rope r = {theta, (forge__rope_scaling)scaling, factor, low, high, orig_max, 1.0};
    forge__rope_inv_freq(&r, D, NULL, out);
}

static forge_status ft_rope_shift_impl(ft_ctx *c, void *k, forge_kv_type kv, uint32_t n, uint32_t kv_heads, uint32_t D, const float *inv_freq,
                                       uint32_t d, int adjacent) {
    ft_job j;
    ft_begin(&j, c);
    forge__step_params sp = {d, 0, 0, 1.0f, 1.0f, 0, {0, 0}};
    uint64_t bytes = forge__kv_bytes(kv, (uint64_t)n * kv_heads, D);
    forge__range pb = ft_buf(&j, &sp, sizeof sp), fb = ft_buf(&j, inv_freq, 4ull * D / 2), kb = ft_buf(&j, k, bytes);
    forge__rope_shift(&j.rec, pb, fb, kb, 0, n, kv_heads, D, adjacent != 0, kv);
    return ft_end(&j, 2, k, bytes, 0, NULL, 0);
}

forge_status ft_rope_shift(ft_ctx *c, float *k, uint32_t n, uint32_t kv_heads, uint32_t D, const float *inv_freq, uint32_t d, int adjacent) {
    return ft_rope_shift_impl(c, k, FORGE_KV_F32, n, kv_heads, D, inv_freq, d, adjacent);
}

forge_status ft_rope_shift16(ft_ctx *c, uint16_t *k, uint32_t n, uint32_t kv_heads, uint32_t D, const float *inv_freq, uint32_t d,
                             int adjacent) {
    return ft_rope_shift_impl(c, k, FORGE_KV_F16, n, kv_heads, D, inv_freq, d, adjacent);
}

forge_status ft_rope_shift8(ft_ctx *c, uint8_t *k, uint32_t n, uint32_t kv_heads, uint32_t D, const float *inv_freq, uint32_t d, int adjacent) {
    return ft_rope_shift_impl(c, k, FORGE_KV_Q8_0, n, kv_heads, D, inv_freq, d, adjacent);
}
static char ft_discover_dir[256];
static void ft_discover_dir_remove(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", ft_discover_dir);
    if (system(cmd)) {}
}

static int ft_discover_count(void *user, const forge_discovered_model *d) {
    (*(int *)user) += d->loadable;
    return 0;
}

forge_status ft_discover_mem(const uint8_t *data, size_t size) {
    if (!ft_discover_dir[0]) {
        snprintf(ft_discover_dir, sizeof ft_discover_dir, "%s/forge_fuzz_discover.%ld", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
                 (long)getpid());
        mkdir(ft_discover_dir, 0777);
        atexit(ft_discover_dir_remove);
        forge__gguf_head_bytes = 64;
    }
    char path[300];
    snprintf(path, sizeof path, "%s/m", ft_discover_dir);
    mkdir(path, 0777);
    const char *names[3] = {"x.gguf", "m/config.json", "m/model.safetensors"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", ft_discover_dir, names[i]);
        remove(path);
    }
    bool gguf = size >= 4 && !memcmp(data, "GGUF", 4);
    size_t clen = 0;
    if (!gguf) {
        if (size < 2) return FORGE_ERR_FORMAT;
        clen = FORGE__MIN((size_t)data[0] | (size_t)data[1] << 8, size - 2);
        data += 2;
        size -= 2;
    }
    const uint8_t *parts[2] = {data, data + clen};
    size_t sizes[2] = {gguf ? size : clen, size - clen};
    for (int i = 0; i < (gguf ? 1 : 2); i++) {
        snprintf(path, sizeof path, "%s/%s", ft_discover_dir, names[gguf ? 0 : i + 1]);
        FILE *f = fopen(path, "wb");
        if (!f) return FORGE_ERR_IO;
        fwrite(parts[i], 1, sizes[i], f);
        fclose(f);
    }
    int loadable = 0;
    char err[256];
    return forge_discover(ft_discover_dir, NULL, ft_discover_count, &loadable, err, sizeof err);
}


/* ---- sentence-transformers files (forge__st_load) ---- */
static char ft_sentence_dir[256];
static void ft_sentence_dir_remove(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", ft_sentence_dir);
    if (system(cmd)) { /* best effort */ }
}
/* The bytes as a sentence-transformers checkpoint's files: five 2-byte little-endian lengths,
 * then modules.json, 1_Pooling/config.json, 2_Dense/config.json, config_sentence_transformers.json,
 * sentence_bert_config.json, and the rest as 2_Dense/model.safetensors. What loads must hold
 * together: steps within bounds and naming loaded Dense modules, chained widths, a pooling. */
forge_status ft_sentence_mem(const uint8_t *data, size_t size) {
    if (!ft_sentence_dir[0]) {
        snprintf(ft_sentence_dir, sizeof ft_sentence_dir, "%s/forge_fuzz_sentence.%ld", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (long)getpid());
        mkdir(ft_sentence_dir, 0777);
        atexit(ft_sentence_dir_remove);
        char sub[300];
        snprintf(sub, sizeof sub, "%s/1_Pooling", ft_sentence_dir);
        mkdir(sub, 0777);
        snprintf(sub, sizeof sub, "%s/2_Dense", ft_sentence_dir);
        mkdir(sub, 0777);
    }
    static const char *const names[6] = {"modules.json", "1_Pooling/config.json", "2_Dense/config.json", "config_sentence_transformers.json",
                                         "sentence_bert_config.json", "2_Dense/model.safetensors"};
    if (size < 10) return FORGE_ERR_FORMAT;
    size_t lens[6], at = 10;
    for (int i = 0; i < 5; i++) {
        lens[i] = FORGE__MIN((size_t)data[2 * i] | (size_t)data[2 * i + 1] << 8, size - at);
        at += lens[i];
    }
    lens[5] = size - at;
    at = 10;
    for (int i = 0; i < 6; i++) {
        char path[400];
        snprintf(path, sizeof path, "%s/%s", ft_sentence_dir, names[i]);
        remove(path);
        if (!lens[i] && i != 0) { at += lens[i]; continue; } /* an empty part: that file is absent (modules.json always written) */
        FILE *f = fopen(path, "wb");
        if (!f) return FORGE_ERR_IO;
        fwrite(data + at, 1, lens[i], f);
        fclose(f);
        at += lens[i];
    }
    forge__arena a = {0};
    forge__st st;
    forge__st_load(&st, ft_sentence_dir, &a);
    if (!st.st) {
        if (st.pooling < FORGE_POOLING_LAST || st.pooling > FORGE_POOLING_CLS || st.n_steps < 0 || st.n_steps > FORGE__ST_MAX_STEPS) abort();
        for (int k = 0; k < st.n_steps; k++) {
            if (st.steps[k] < -1 || st.steps[k] >= st.n_dense) abort();
            if (st.steps[k] >= 0) {
                const forge__st_dense *d = &st.dense[st.steps[k]];
                if (!d->w || d->in <= 0 || d->out <= 0) abort();
                volatile float sum = 0; /* every weight readable */
                for (size_t i = 0; i < (size_t)d->in * (size_t)d->out; i++) sum += d->w[i];
                for (int i = 0; d->b && i < d->out; i++) sum += d->b[i];
            }
        }
        for (int k = 0; k < st.n_prompts; k++)
            if (!st.prompt_names[k] || !st.prompts[k]) abort();
    }
    forge__arena_free(&a);
    return st.st;
}

/* ---- push constants ---- */
typedef struct ft_module_rec {
    const char *name;
    const uint32_t *words;
    size_t bytes;
    uint32_t block_bytes;
} ft_module_rec;
#define FT_MODULE_REC(name) {#name, forge_spv_##name, sizeof forge_spv_##name, FORGE_SPV_PUSH_BYTES_##name},
static const ft_module_rec ft_modules[] = {FORGE_SPV_MODULES(FT_MODULE_REC)};

int ft_module_count(void) { return (int)(sizeof ft_modules / sizeof ft_modules[0]); }

int ft_module(int i, const char **name, const uint32_t **words, size_t *n_words, uint32_t *block_bytes) {
    if (i < 0 || i >= ft_module_count()) return 0;
    *name = ft_modules[i].name;
    *words = ft_modules[i].words;
    *n_words = ft_modules[i].bytes / 4;
    *block_bytes = ft_modules[i].block_bytes;
    return 1;
}

int ft_op_count(void) { return FORGE__OP_COUNT; }

void ft_op(int op, const char **name, int *module, uint32_t *push_bytes) {
    const forge__op_desc *d = &forge__ops[op];
    *name = d->name;
    *push_bytes = d->push_bytes;
    *module = -1;
    for (int i = 0; i < ft_module_count(); i++)
        if (d->spv && ft_modules[i].words == d->spv) *module = i;
}

/* ---- kernel timing (tests/test_kernel_bench.cpp, run by hand on a GPU) ----
 * Device-local operands filled on the device: A [M, K] = 1.0f, W [N, K] with the 32-bit
 * pattern 0x3C003C00 (f16 1.0; garbage-but-finite for the block formats), C [M, N]. */
static uint64_t ft_fmt_row_bytes(int fmt, uint32_t K) {
    switch (fmt) {
    case FT_F32: return 4ull * K;
    case FT_F16: case FT_BF16: return 2ull * K;
    case FT_Q4_0: return K / 32 * 18ull;
    case FT_Q8_0: return K / 32 * 34ull;
    default: return 0;
    }
}

forge_status ft_time_matmul(ft_ctx *c, int kind, int fmt, const uint32_t *spv, size_t spv_bytes, uint32_t tm, uint32_t tn,
                            uint32_t M, uint32_t K, uint32_t N, int reps, double *ms, float *c00) {
    forge__device *d = &c->dev;
    uint64_t wrow = ft_fmt_row_bytes(fmt, K);
    if (!wrow || !d->caps.timestamps) return FORGE_ERR_UNSUPPORTED;
    forge__buffer a = {0}, w = {0}, cc = {0}, dummy = {0}, rb = {0};
    forge_status st = forge__buffer_create(d, forge__align_up(4ull * M * K, 16), d->caps.mem_device, false, &c->mem, NULL, &a, &c->err);
    if (!st) st = forge__buffer_create(d, forge__align_up(wrow * N, 16), d->caps.mem_device, false, &c->mem, NULL, &w, &c->err);
    if (!st) st = forge__buffer_create(d, forge__align_up(4ull * M * N, 16), d->caps.mem_device, false, &c->mem, NULL, &cc, &c->err);
    if (!st) st = forge__buffer_create(d, 4096, d->caps.mem_device, false, &c->mem, NULL, &dummy, &c->err);
    if (!st) st = forge__buffer_create(d, 16, d->caps.mem_readback, true, &c->mem, NULL, &rb, &c->err);
    forge__pipeline custom = {0};
    forge__op op = FORGE__OP_COUNT;
    if (!st && spv) {
        forge__op_desc desc = {"custom", spv, spv_bytes, 6, sizeof(forge__pc_linear), 0, {0}, false, false, false, false};
        st = forge__pipeline_create(d, &desc, 0, 0, &custom, &c->err);
    } else if (!st) {
        op = (forge__op)((kind == 2 ? FORGE__OP_MATMUL_CM : kind == 3 ? FORGE__OP_MATMUL_BIG : kind == 4 ? FORGE__OP_MATMUL_S : FORGE__OP_MATMUL) + fmt);
    }
    VkQueryPool qp = VK_NULL_HANDLE;
    VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = 2};
    if (!st && d->vk.vkCreateQueryPool(d->dev, &qi, NULL, &qp) != VK_SUCCESS) st = FORGE_ERR_DEVICE;
    ft_job j;
    ft_begin(&j, c);
    if (!st) {
        VkCommandBuffer cb = j.rec.cb;
        /* A: ones, f32 for the SIMT kernels, f16 for the tensor cores' (kind 2 and the variants) */
        d->vk.vkCmdFillBuffer(cb, a.buf, 0, VK_WHOLE_SIZE, kind == 2 || spv ? 0x3C003C00u : 0x3F800000u);
        d->vk.vkCmdFillBuffer(cb, w.buf, 0, VK_WHOLE_SIZE, 0x3C003C00u);
        d->vk.vkCmdFillBuffer(cb, cc.buf, 0, VK_WHOLE_SIZE, 0);
        d->vk.vkCmdFillBuffer(cb, dummy.buf, 0, VK_WHOLE_SIZE, 0);
        d->vk.vkCmdResetQueryPool(cb, qp, 0, 2);
        forge__barrier(&j.rec);
        forge__range binds[7] = {{a.buf, 0, a.size}, {w.buf, 0, w.size}, {cc.buf, 0, cc.size}, {dummy.buf, 0, 4096},
                                 {dummy.buf, 0, 4096}, {dummy.buf, 0, 4096}, {dummy.buf, 0, 4096}};
        forge__pc_linear pc = {M, K, N, 0, N, 0, 0, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        for (int i = 0; i < reps + 2 && !j.rec.st; i++) {
            if (i == 2) d->vk.vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qp, 0);
            if (spv) { /* forge__dispatch's work for a pipeline outside the op table */
                VkDescriptorSet set;
                VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, .descriptorPool = j.dpool,
                                                  .descriptorSetCount = 1, .pSetLayouts = &custom.dsl};
                d->vk.vkAllocateDescriptorSets(d->dev, &ai, &set);
                VkDescriptorBufferInfo bi[6];
                VkWriteDescriptorSet wr[6];
                for (int b = 0; b < 6; b++) {
                    bi[b] = (VkDescriptorBufferInfo){binds[b].buf, 0, binds[b].size};
                    wr[b] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = set, .dstBinding = (uint32_t)b,
                                                   .descriptorCount = 1, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .pBufferInfo = &bi[b]};
                }
                d->vk.vkUpdateDescriptorSets(d->dev, 6, wr, 0, NULL);
                d->vk.vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, custom.pipe);
                d->vk.vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, custom.layout, 0, 1, &set, 0, NULL);
                d->vk.vkCmdPushConstants(cb, custom.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof pc, &pc);
                d->vk.vkCmdDispatch(cb, (N + tn - 1) / tn, (M + tm - 1) / tm, 1);
            } else {
                forge__dispatch(&j.rec, op, binds, &pc, (N + tn - 1) / tn, (M + tm - 1) / tm, 1);
            }
            forge__barrier(&j.rec);
        }
        d->vk.vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qp, 1);
        VkBufferCopy cp = {0, 0, 4};
        d->vk.vkCmdCopyBuffer(cb, cc.buf, rb.buf, 1, &cp);
    }
    forge_status est = ft_end(&j, 0, NULL, 0, 0, NULL, 0);
    if (!st) st = est;
    if (!st) {
        uint64_t ts[2];
        if (d->vk.vkGetQueryPoolResults(d->dev, qp, 0, 2, sizeof ts, ts, 8, VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) != VK_SUCCESS)
            st = FORGE_ERR_DEVICE;
        else
            *ms = (double)(ts[1] - ts[0]) * d->caps.props.limits.timestampPeriod * 1e-6 / reps;
        memcpy(c00, rb.mapped, 4);
    }
    if (qp) d->vk.vkDestroyQueryPool(d->dev, qp, NULL);
    forge__pipeline_destroy(d, &custom);
    forge__buffer *bufs[5] = {&a, &w, &cc, &dummy, &rb};
    for (int i = 0; i < 5; i++)
        if (bufs[i]->buf) forge__buffer_destroy(d, bufs[i], &c->mem, NULL);
    return st;
}
