/* internal.h: what tests/internal.c exposes of forge's internals to the C++ tests.
 * internal.c includes forge.c, so these wrappers run forge's own code paths: single kernels
 * through the real op table and recorder, and the file parsers. */
#ifndef FORGE_TESTS_INTERNAL_H
#define FORGE_TESTS_INTERNAL_H
#include <stddef.h>
#include <stdint.h>
#include "forge.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- kernels ---- */
typedef struct ft_ctx ft_ctx;
/* Opens the default device; NULL (with the reason in err) when there is none. */
ft_ctx *ft_open(char *err, size_t err_size);
void ft_close(ft_ctx *c);
const char *ft_errmsg(ft_ctx *c);

enum { FT_F32 = 0, FT_F16 = 1, FT_BF16 = 2, FT_Q4_0 = 3, FT_Q8_0 = 4, FT_Q4_K = 5, FT_Q6_K = 6, FT_MLX = 7 };

/* A weight matrix [N, K] as stored: `data` holds rows of row_bytes; MLX adds scales and biases
 * (rows of aux_row_bytes, f16, or bf16 when qflags & 1) and bits / group. */
typedef struct ft_weight {
    int fmt;
    const void *data;
    size_t row_bytes;
    const void *scales, *biases;
    size_t aux_row_bytes;
    uint32_t bits, group, qflags;
} ft_weight;
#define FT_BIAS 1u
#define FT_ACCUMULATE 2u
#define FT_SOFTCAP 4u
#define FT_PRENORM 8u   /* matvec_sg only (ft_matvec_sg) */
#define FT_GATED 16u
#define FT_GELU 32u

/* C[m, c_col0 + n] (+)= A[a_row0 + m, :] . W[n, :] for m < M, W [N, K] stored in `fmt` and
 * split into chunks of chunk_rows rows (0: one chunk). C is [M, ldc], in/out.
 * use_matmul: 0 picks the kernel as forge does (matvec for M <= 8), 1 forces the tiled matmul. */
forge_status ft_linear(ft_ctx *c, int fmt, const float *A, uint32_t a_rows, uint32_t a_row0, uint32_t M, uint32_t K,
                       const void *W, uint32_t N, uint32_t chunk_rows, const float *bias, uint32_t flags, float softcap,
                       float *C, uint32_t ldc, uint32_t c_col0, int use_matmul);
/* ft_linear for any stored format. */
forge_status ft_linear_w(ft_ctx *c, const ft_weight *w, const float *A, uint32_t a_rows, uint32_t a_row0, uint32_t M, uint32_t K,
                         uint32_t N, uint32_t chunk_rows, const float *bias, uint32_t flags, float softcap, float *C, uint32_t ldc,
                         uint32_t c_col0, int use_matmul);
forge_status ft_embed_w(ft_ctx *c, const ft_weight *w, const uint32_t *tokens, uint32_t n, uint32_t rows, uint32_t hidden,
                        uint32_t chunk_rows, float scale, uint32_t round_mode, float *out);
/* out[t, :] = table[tokens[t], :] * scale (rounded per round_mode: 0 none, 1 bf16, 2 f16). */
forge_status ft_embed(ft_ctx *c, int fmt, const uint32_t *tokens, uint32_t n, const void *table, uint32_t rows,
                      uint32_t hidden, uint32_t chunk_rows, float scale, uint32_t round_mode, float *out);
/* out[out_row0 + r] (+)= rmsnorm(x[x_row0 + r]) * w for r < rows. out is in/out. */
forge_status ft_rmsnorm(ft_ctx *c, const float *x, uint32_t x_rows, uint32_t x_row0, uint32_t rows, uint32_t dim,
                        const float *w, float eps, uint32_t add, float *out, uint32_t out_rows, uint32_t out_row0);
/* In place on x [n, heads, D]: positions pos0 + t. */
forge_status ft_rope(ft_ctx *c, float *x, uint32_t n, uint32_t heads, uint32_t D, const float *inv_freq, uint32_t pos0,
                     int adjacent);
/* Rotates k [n, heads, D] into kc [slots, heads, D] at slot (pos0 + t) % slots; copies v to vc. */
forge_status ft_rope_store(ft_ctx *c, const float *k, const float *v, uint32_t n, uint32_t heads, uint32_t D,
                           const float *inv_freq, uint32_t pos0, int adjacent, uint32_t slots, float *kc, float *vc);
/* The same into an f16 cache (rope_kv16: D % 4 == 0). */
forge_status ft_rope_store16(ft_ctx *c, const float *k, const float *v, uint32_t n, uint32_t heads, uint32_t D,
                             const float *inv_freq, uint32_t pos0, int adjacent, uint32_t slots, uint16_t *kc, uint16_t *vc);
/* The same into a q8_0 cache (rope_kv8: D % 32 == 0), [slots, heads] heads of ft_kv8_head_bytes(D). */
forge_status ft_rope_store8(ft_ctx *c, const float *k, const float *v, uint32_t n, uint32_t heads, uint32_t D,
                            const float *inv_freq, uint32_t pos0, int adjacent, uint32_t slots, uint8_t *kc, uint8_t *vc);
/* Bytes of one q8_0 cache head of D values (D int8 codes, D/32 f16 scales, padding to a word). */
size_t ft_kv8_head_bytes(uint32_t D);
/* state.c's host conversion of `heads` heads of D values between cache types (forge_kv_type
 * F32, F16, Q8_0): the quantizer the kernels' q8_0 stores mirror. */
void ft_kv_convert(const void *src, int from, void *dst, int to, size_t heads, uint32_t D);
/* split: 0 the tiled prefill kernel, 1 the split-K decode kernels (attention_split + combine),
 * 2 the same on subgroups (attention_decode + combine; FORGE_ERR_UNSUPPORTED where the device
 * has no subgroup arithmetic), 3 attention_decode merging its runs itself (FORGE__ATTN_MERGE, as
 * decode runs it), dispatched twice into two outputs (the second relies on the counters the
 * first leaves at zero, and takes runs of at least 40 keys: the min_run of forge__attn_min_run). */
forge_status ft_attention(ft_ctx *c, const float *q, uint32_t n, uint32_t H, uint32_t Hkv, uint32_t D, const float *kc,
                          const float *vc, uint32_t slots, uint32_t pos0, uint32_t window, float scale, float softcap,
                          float *out, int split);
/* The same on an f16 cache (the _kv16 kernels); split 4: the prefill kernel on tensor cores
 * (attention_cm.comp; FORGE_ERR_UNSUPPORTED without them or for a head other than 64, 128, 256),
 * 5: the same reading batch prefill's row table (flags 2: the rows of sequence 1). */
forge_status ft_attention16(ft_ctx *c, const float *q, uint32_t n, uint32_t H, uint32_t Hkv, uint32_t D, const uint16_t *kc,
                            const uint16_t *vc, uint32_t slots, uint32_t pos0, uint32_t window, float scale, float softcap,
                            float *out, int split);
/* One decode step's attention with RoPE fused (attention_decode.comp, flags FORGE__ATTN_ROPE_*,
 * its runs merged in the kernel as decode does): qkv is the raw row [(H + 2 Hkv) D] of the token at position pos, q
 * rotated by the kernel; with key_from_row its key (rotated) and value are taken from the row and
 * written into the cache at slot pos % slots, else they are read from the cache. qk_norm (or
 * NULL): the q_norm then k_norm weights [2 D], heads RMS-normed with eps before the rotation;
 * v_norm: the value head too, without weight. The caches kc, vc [slots, Hkv, D] (f32, or f16
 * with f16) are in/out. FORGE_ERR_UNSUPPORTED where the device cannot run attention_decode. */
forge_status ft_attention_rope_decode(ft_ctx *c, const float *qkv, uint32_t H, uint32_t Hkv, uint32_t D, const float *inv_freq,
                                      int adjacent, int key_from_row, const float *qk_norm, int v_norm, float eps, void *kc, void *vc,
                                      int f16, uint32_t slots, uint32_t pos, uint32_t window, float scale, float softcap, float *out);
/* The 128 x 128-tile matmul (matmul_big.comp), whatever the size. */
/* Mixture-of-experts products: W [E * R, K] holds E experts of R rows; token t's choice j is
 * expert experts[t * top_k + j] (weight 1), and C [n_tokens * top_k, R] gets each (token,
 * choice) pair's product with the token's row of A [n_tokens, K]. grouped 0: decode's matvec_sg
 * EXPERTS (FORGE_ERR_UNSUPPORTED without subgroup arithmetic); 1: prefill's moe_group +
 * matmul_moe (its tile rows by forge__moe_tile_rows; 2: 64-row tiles, 3: 32-row tiles, whatever
 * the pairs); 4: moe_group + matmul_cm_moe, the tensor cores on A in f16 (FORGE_ERR_UNSUPPORTED
 * without them). chunk_experts: experts per weight chunk (0: one chunk). */
forge_status ft_experts(ft_ctx *c, const ft_weight *w, const float *A, uint32_t n_tokens, uint32_t K, uint32_t E, uint32_t R,
                        uint32_t top_k, const uint32_t *experts, uint32_t chunk_experts, int grouped, float *C);
/* The experts' backward product (matmul_back_moe, grouped by moe_group.comp as training runs it):
 * dX [pairs, K] = dY_row . W_expert(p) for pair p = t * top_k + j, W's rows e * R .. as in
 * ft_experts; dY rows per pair ([pairs, R]), or per token ([n_tokens, R], per_token) times the
 * pair's weight. chunk_experts: experts a row-chunk (0: all). */
forge_status ft_experts_back(ft_ctx *c, const ft_weight *w, const float *dY, uint32_t n_tokens, uint32_t K, uint32_t E, uint32_t R,
                             uint32_t top_k, const uint32_t *experts, const float *weights, int per_token, uint32_t chunk_experts, float *dX);
forge_status ft_matmul_big(ft_ctx *c, const ft_weight *w, const float *A, uint32_t M, uint32_t K, uint32_t N, float *C);
/* The 32 x 128-tile matmul of batch decode's few rows (matmul_s). */
forge_status ft_matmul_s(ft_ctx *c, const ft_weight *w, const float *A, uint32_t M, uint32_t K, uint32_t N, float *C);
/* The tensor-core matmul (f16 operands, f32 accumulation); FORGE_ERR_UNSUPPORTED without one. */
forge_status ft_matmul_cm(ft_ctx *c, const ft_weight *w, const float *A, uint32_t M, uint32_t K, uint32_t N, float *C);
/* Device time of one matmul dispatch (ms, mean of `reps` after two warm-ups, each followed by a
 * barrier) on device-local operands: A = 1.0f, W filled with f16 1.0 pairs (so C = K for F16),
 * kind 2 tensor-core, 3 128-tile, 4 32 x 128-tile, else 64-tile matmul of format fmt; or, with
 * spv, that SPIR-V module (the matmul interface: 6 bindings, the linear push constants) over
 * a grid of tm x tn tiles. c00 gets C[0, 0]. For tests/test_kernel_bench.cpp. */
forge_status ft_time_matmul(ft_ctx *c, int kind, int fmt, const uint32_t *spv, size_t spv_bytes, uint32_t tm, uint32_t tn,
                            uint32_t M, uint32_t K, uint32_t N, int reps, double *ms, float *c00);
/* A product as forge__linear runs it with `splits` > 1 split along k into partial sums, then
 * linear_reduce.comp (splits 1: whole). kind FT_SPLIT_SIMT: matmul.comp's 64 x 64 tiles (k steps
 * of 32); FT_SPLIT_CM: the tensor cores' 128 x 128 tiles (k steps of 64, A in f16 by
 * act_f16.comp); FT_SPLIT_CM_SKINNY: their 32 x 64 tiles of batch decode (f16 weights, M <= 32,
 * N % 16 == 0, K % 64 == 0). flags: FT_BIAS / FT_ACCUMULATE / FT_SOFTCAP (softcap). C [M, N]
 * in/out. FORGE_ERR_UNSUPPORTED for the tensor cores on a device without them. */
#define FT_SPLIT_SIMT 0
#define FT_SPLIT_CM 1
#define FT_SPLIT_CM_SKINNY 2
forge_status ft_matmul_split(ft_ctx *c, int kind, const ft_weight *w, const float *A, uint32_t M, uint32_t K, uint32_t N, uint32_t splits,
                             const float *bias, uint32_t flags, float softcap, float *C);
/* 1 when the device runs the subgroup matvec (matvec_sg) */
int ft_has_subgroup_matvec(ft_ctx *c);
/* The subgroup matvec with its fused paths: flags FT_* (bias, accumulate, soft-cap,
 * PRENORM with g [K] and eps, GATED with W's rows interleaved gate/up, 2 outs of them); split 1:
 * K split over the workgroup (forge's one-token mapping on GPUs; M must be 1), 0: the subgroups
 * take outputs in turn. C [M, outs]. */
forge_status ft_matvec_sg(ft_ctx *c, const ft_weight *w, const float *A, uint32_t M, uint32_t K, uint32_t outs, uint32_t flags,
                          const float *bias, const float *g, float eps, float softcap, int split, float *C);
/* ft_linear_w forcing the matvec kind: 0 shared-memory matvec, 1 subgroup matvec */
forge_status ft_matvec_kind(ft_ctx *c, const ft_weight *w, const float *A, uint32_t M, uint32_t K, uint32_t N, float *C, int sg);
forge_status ft_act_mul(ft_ctx *c, float *g, const float *u, uint32_t count, uint32_t act);
/* A linear-attention layer's gated delta rule and gated norm over n rows, in groups of
 * group_rows rows (group g in state place g), the groups starting at position pos0 (0: from a
 * zero state): delta_rule.comp (lanes 0, chunk 0), delta_rule_sg.comp with `lanes` invocations a
 * column then gated_norm.comp, or (chunk > 0) the chunked form in chunks of `chunk` rows
 * (delta_rule_prep.comp, delta_rule_chunk.comp, then gated_norm.comp). qkv [n, 2 KH DK + VH DV], mix [n, mix_stride] (z at 0, b at
 * VH DV, a at VH DV + VH), neg_a, dt_bias [VH], w [DV]; state [groups, VH, DK, DV] in and out;
 * out [n, VH DV]. */
forge_status ft_delta_rule(ft_ctx *c, uint32_t lanes, uint32_t chunk, uint32_t n, uint32_t group_rows, uint32_t pos0, uint32_t KH, uint32_t VH, uint32_t DK,
                           uint32_t DV, int v_tiled, const float *qkv, const float *mix, const float *neg_a, const float *dt_bias, const float *w,
                           float eps, float *state, float *out);
/* conv1d.comp: the causal depthwise convolution and SiLU of n rows (channels of each, the row
 * in_stride apart) in groups of group_rows (group g in state place g), the groups starting at
 * position pos0 (0: zeros before them); state [groups, taps - 1, channels] in and out, y [n, channels]. */
forge_status ft_conv1d(ft_ctx *c, const float *x, const float *w, float *state, float *y, uint32_t n, uint32_t channels, uint32_t taps,
                       uint32_t in_stride, uint32_t group_rows, uint32_t pos0);
/* Whether the device runs delta_rule_sg.comp (subgroup shuffles, subgroups of 8 or more), and its width. */
int ft_has_subgroup_shuffle(ft_ctx *c, uint32_t *width);

/* ---- host helpers of forge.c ---- */
uint16_t ft_f32_to_f16(float f);
float ft_f16_to_f32(uint16_t h);
uint16_t ft_f32_to_bf16(float f);
float ft_bf16_to_f32(uint16_t h);
/* RoPE inverse frequencies as forge computes them for a config.json snippet's rope. */
forge_status ft_config_parse(const char *json, char *err, size_t err_size, int *n_layers, int *hidden, int *head_dim,
                             int *tied, int *sliding_layers, double *attn_scale);

/* ---- parsers on a file ---- */
/* Parses a safetensors file; returns the status, the message and the tensor count. */
forge_status ft_safetensors_file(const char *path, char *err, size_t err_size, int *n_tensors);
forge_status ft_gguf_file(const char *path, char *err, size_t err_size, int *n_tensors, int *n_kv);
/* The same on a memory buffer (fuzz targets). */
forge_status ft_safetensors_mem(const uint8_t *data, size_t size);
forge_status ft_gguf_mem(const uint8_t *data, size_t size);
/* Discovery reads a GGUF's header in pieces of this many bytes at first (growing 4x; default
 * 1 MiB); returns the previous value. */
uint64_t ft_discover_gguf_head_bytes(uint64_t n);
/* forge_discover on fuzz bytes: bytes starting "GGUF" are written as a .gguf file, others as
 * [u16 n][config.json: n bytes][model.safetensors: the rest] in a model directory; the search
 * runs with the GGUF header read 64 bytes at first. */
forge_status ft_discover_mem(const uint8_t *data, size_t size);
forge_status ft_config_mem(const uint8_t *data, size_t size);
forge_status ft_sentence_mem(const uint8_t *data, size_t size);
/* tokenizer.json on a buffer; when it loads, also encodes and decodes a few texts with it. */
forge_status ft_tokenizer_json_mem(const uint8_t *data, size_t size);
/* An adapter (config + safetensors, PEFT or mlx-lm) from fuzz bytes; see tests/internal.c. */
forge_status ft_adapter_mem(const uint8_t *data, size_t size);
/* A state file (forge_session_load's checks, no device) on a buffer, for a small model with a
 * sliding-window layer (see tests/internal.c); err gets the message. */
forge_status ft_state_mem(const uint8_t *data, size_t size, char *err, size_t err_size);
/* A valid state file of that model holding n_past tokens, malloc'd into *out; returns its size. */
size_t ft_state_fake(int n_past, uint8_t **out);
/* State saves see a disk that is full after `bytes` more bytes (UINT64_MAX: never). */
void ft_state_disk_left(uint64_t bytes);
/* The model's fingerprint as state files write it (16 hex digits) into buf. */
void ft_model_fingerprint(const forge_model *m, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif

/* ---- training ---- */
#ifdef __cplusplus
extern "C" {
#endif
/* The backward kernels. dX [M, K] = dY [M, N] . W (W [N, K] stored as w, in chunks of chunk_rows);
 * big 1: the 128 x 128-tile kernel (matmul_back_big.comp), 0: matmul_back.comp; 2: the tensor
 * cores as the trainer records them (forge__linear_back_rec: act_f16_scaled, matmul_cm_back;
 * FORGE_ERR_UNSUPPORTED where the device has none; K % 8 == 0, else the SIMT kernels; split
 * along N where the product has few tiles and N >= 256), 3: the same with a scratch for 128 rows
 * (more go in groups). */
forge_status ft_matmul_back(ft_ctx *c, const ft_weight *w, const float *dy, uint32_t M, uint32_t N, uint32_t K, uint32_t chunk_rows, int big,
                            float *dx);
/* The low-rank product as forge__gemm runs it (gemm.comp, or gemm_rank.comp where one dimension
 * is a rank of at most 64): strides {a_off, a_sm, a_sk, b_off, b_sk, b_sn, c_off, c_sm, c_sn}; C
 * in/out (c_n floats). */
forge_status ft_gemm(ft_ctx *c, const float *a, size_t a_n, const float *b, size_t b_n, float *cm, size_t c_n, const uint32_t strides[9],
                     uint32_t M, uint32_t N, uint32_t K, float alpha, int accumulate, uint32_t drop_on, uint32_t drop_ld, float drop_p,
                     uint32_t seed, uint32_t stream);
/* Which kernel ft_gemm's product takes (forge__rank_pick): 0 gemm_rank's WIDE shape (K is the
 * rank), 1 ROWS, 2 COLS (N is, or M transposed), 3 gemm.comp. */
int ft_gemm_shape(const uint32_t strides[9], uint32_t M, uint32_t N, uint32_t K, uint32_t drop_on, uint32_t drop_ld);
/* rmsnorm_back.comp over n_floats of x, dy and out (in/out): block rows (heads 0) or per-head rows. */
forge_status ft_rmsnorm_back(ft_ctx *c, const float *x, const float *w, const float *dy, float *out, size_t n_floats, uint32_t rows, uint32_t dim,
                             uint32_t heads, uint32_t row_stride, uint32_t col0, float eps, int accumulate);
/* rope_back.comp in place on x [n, stride]: q heads at column 0, kv heads at k_off; position t % seq_len. */
forge_status ft_rope_back(ft_ctx *c, float *x, uint32_t n, uint32_t heads, uint32_t kv_heads, uint32_t D, uint32_t stride, uint32_t k_off,
                          const float *inv_freq, uint32_t seq_len, int adjacent);
/* attention_tiled (training: batch, log-sum-exp) then attention_back: O [B T, H, D] and dqkv [B T, (H + 2 Hkv) D]. */
forge_status ft_attention_train(ft_ctx *c, const float *qkv, uint32_t B, uint32_t T, uint32_t H, uint32_t Hkv, uint32_t D, uint32_t window,
                                float scale, float softcap, const float *dout, float *out, float *dqkv);
/* act_mul_back.comp: gu and dgu [rows, 2 ffn] as pairs or halves. */
forge_status ft_act_mul_back(ft_ctx *c, const float *dh, const float *gu, float *dgu, uint32_t rows, uint32_t ffn, uint32_t act, int pairs);
/* act_mul_back.comp's sigmoid output gate (layout 4): h = u * sigmoid(g), u [rows, ffn], the gates in rows of stride at col0;
 * dh in, du out over it (in place, as the trainer runs it); dgates in/out [rows, stride] (the gates' columns written). */
forge_status ft_gate_back(ft_ctx *c, float *dh, const float *u, const float *gates, float *dgates, uint32_t rows, uint32_t ffn, uint32_t stride,
                          uint32_t col0);
/* conv1d_back.comp: x and dx [n, in_stride] (dx in/out: its first `channels` columns written), w [channels, taps], dy [n, channels];
 * groups of group_rows rows, each from a zero state. */
forge_status ft_conv1d_back(ft_ctx *c, const float *x, const float *w, const float *dy, float *dx, uint32_t n, uint32_t channels, uint32_t taps,
                            uint32_t in_stride, uint32_t group_rows);
/* The gated delta rule over B sequences of T rows (each from a zero state): qkv [B T, 2 k_heads k_dim + v_heads v_dim] (the
 * convolution's output), mix [B T, VD + 2 v_heads] (z, b, a), neg_a, dt_bias [v_heads], w [v_dim]. ft_delta_rule_forward: the forward
 * (delta_rule.comp), out [B T, VD]; ft_delta_rule_back: delta_rule_back.comp (checkpoints every `chunk` rows) then
 * l2norm_back.comp for the output gradient dout [B T, VD]: dqkv [B T, conv_dim] and dmix [B T, VD + 2 v_heads]. */
typedef struct ft_delta_shape {
    uint32_t B, T, k_heads, v_heads, k_dim, v_dim, chunk;
    float eps;
    uint32_t v_tiled;        /* value head h reads key head h % k_heads (GGUF), else h / (v_heads / k_heads) */
} ft_delta_shape;
forge_status ft_delta_rule_forward(ft_ctx *c, const ft_delta_shape *d, const float *qkv, const float *mix, const float *neg_a, const float *dt_bias,
                           const float *w, float *out);
forge_status ft_delta_rule_back(ft_ctx *c, const ft_delta_shape *d, const float *qkv, const float *mix, const float *neg_a, const float *dt_bias,
                                const float *w, const float *dout, float *dqkv, float *dmix);
/* loss.comp over rows of pred [rows, n] (in/out: the gradient with grad); mode 0 labels, 1 targets. */
forge_status ft_loss(ft_ctx *c, float *pred, uint32_t rows, uint32_t n, int mode, const int32_t *labels, const float *targets, const float *weights,
                     float softcap, int grad, float *loss);
/* adamw.comp's three modes over one segment; opt = {1 - lr wd, 1 - b1, b2, 1 - b2, lr / bc1, sqrt(bc2), eps, max_norm}. */
forge_status ft_adamw(ft_ctx *c, float *p, float *g, float *m, float *v, uint32_t count, const float opt[8], float *norm2);
typedef void (*ft_tensor_fn)(void *user, const char *name, const float *data, int n_dims, const int64_t *shape);
/* Calls fn with every tensor of a safetensors file, converted to f32. */
forge_status ft_safetensors_read(const char *path, ft_tensor_fn fn, void *user);
/* Forward and backward on a batch, its gradient added to the accumulated one, no optimizer
 * step. ft_train_grad_read copies the accumulated gradient of (layer, target) out in the files' layout (A [rank, in]
 * then B [out, rank]; returns the number of floats, 0 when the pair is not adapted);
 * ft_train_grad_clear zeroes it and restarts the accumulation. */
forge_status ft_train_backward(forge_trainer *tr, const forge_train_batch *b, double *loss);
size_t ft_train_grad_read(forge_trainer *tr, int layer, int target, float *out, size_t cap);
void ft_train_grad_clear(forge_trainer *tr);
/* Adds alpha * dir to the adapter (layer, target) of the trainer; dir in ft_train_grad_read's layout. */
forge_status ft_train_param_add(forge_trainer *tr, int layer, int target, float alpha, const float *dir);
int ft_train_checkpointing(const forge_trainer *tr);
/* Pretends the model's device has `bytes` of memory (plans are checked against it). */
void ft_model_set_device_memory(forge_model *m, uint64_t bytes);
/* Where sessions created afterwards reduce the sampler's row: the host (CPU devices' default) or the device. */
void ft_model_set_sample_on_host(forge_model *m, int on);
/* Decode products of Q4_0 / Q8_0 weights on int8 activations (forge_model.act_q8), for the
 * sessions created after the call; returns 0 (and changes nothing) where the device has no
 * integer dot products. */
int ft_model_set_act_q8(forge_model *m, int on);
/* One token's layers as a chain of int8 products quantizing their outputs for the next (1, the
 * default) or an act_q8 dispatch before each product (0), for the sessions created after the call. */
void ft_model_set_q8_chain(forge_model *m, int on);
/* Products on the host (src/host.c: one token's and several rows') for weights of min_bytes or
 * more (1), or every product on the device's kernels (0), for the sessions created after the
 * call; returns 0 (and changes nothing) where the device is not a CPU device. */
int ft_model_set_host_products(forge_model *m, int on, uint64_t min_bytes);
/* The host's products of Q4_0 / Q8_0 weights on int8 activations (1, the default unless exact)
 * or f32 ones (0), for the sessions created after the call; returns 0 where host products are off. */
int ft_model_set_host_q8(forge_model *m, int on);
/* The products the session's recordings run on the host. */
int ft_session_host_ops(const forge_session *s);
/* One row's dot product in weight format `fmt` (forge__wfmt: 0 F32, 1 F16, 2 BF16, 3 Q4_0,
 * 4 Q8_0) by the portable code and by the one chosen for this CPU; returns whether they differ
 * (1: the CPU has AVX2, FMA and F16C). */
int ft_host_dot(int fmt, const uint8_t *w, const float *x, uint32_t K, float *plain, float *fast);
/* A Q4_0 (3) or Q8_0 (4) weight row against R <= 4 rows x [R, K] rounded to int8 blocks, by the
 * portable code and the one chosen for this CPU, into plain[R] and fast[R]; returns whether
 * they differ (1: the CPU has AVX2, FMA and F16C). */
int ft_host_dot_q8(int fmt, const uint8_t *w, const float *x, uint32_t K, uint32_t R, float *plain, float *fast);
/* One-token products with at least min_rows weight rows (gated: two an output) two outputs a
 * subgroup (matvec_sg_pair, and gated matvec_q8a_pair; 0: never), for the sessions created after
 * the call. */
void ft_model_set_matvec_pairs(forge_model *m, uint32_t min_rows);
/* The prefill attention on tensor cores (1, the default where the device has them) or
 * attention_tiled (0), for the sessions created after the call; returns whether the device and
 * model can take the first at all (tensor cores, not exact). */
int ft_model_set_attn_cm(forge_model *m, int on);
/* Training's input gradients through frozen weights on tensor cores (1, the default where the
 * trainer has their scratch) or on the SIMT kernels (0), for the trainers created after the call. */
void ft_model_set_back_cm(forge_model *m, int on);
/* The decode attention on subgroups (attention_decode.comp, 1) or attention_split.comp (0), for
 * the sessions created after the call; returns 0 where the device cannot run the first. */
int ft_model_set_attn_subgroups(forge_model *m, int on);
/* 1 when the model runs on a CPU device (lavapipe). */
int ft_model_on_cpu(const forge_model *m);
/* The model's pipelines created so far (kernels compiled or being compiled); *warm gets how many
 * of them forge_session_prewarm has dispatched. */
int ft_model_pipelines(forge_model *m, int *warm);
#ifdef __cplusplus
}
#endif

/* ---- sampler ---- */
#ifdef __cplusplus
extern "C" {
#endif
/* The device reduction on one row of logits: repeat penalty over `ids`, then the top C
 * candidates (value after the penalty, id) best first and the normalizer (M, S) at inv_temp. */
forge_status ft_topk(ft_ctx *c, const float *logits, uint32_t V, const uint32_t *ids, uint32_t n_ids, float penalty, float inv_temp,
                     float *cand_logit, int32_t *cand_id, uint32_t *n_cand, float *M, float *S);
/* The same reduction on the host (forge__reduce_row_on_host, what CPU devices use): the best
 * n of row[V] into cand_*[n], and (M, S). */
void ft_reduce_row_host(const float *row, int V, int n, double inv_temp, float *cand_logit, int32_t *cand_id, double *M, double *S);
/* The host draw (forge__sample_candidates): -1 when the candidates do not decide it. */
int32_t ft_sample(const float *logit, const int32_t *id, int n, int complete, double M, double S, float temperature, int top_k,
                  float top_p, float min_p, uint64_t seed_state[4]);
void ft_rng_seed(uint64_t state[4], uint64_t seed);
/* The whole-row draws' sort (forge__sort_cands) of logit[n] with ids 0 .. n-1, into the order
 * the draw walks: sorted_logit / sorted_id [n]. */
void ft_sort_cands(const float *logit, int n, float *sorted_logit, int32_t *sorted_id);

/* ---- constraints ---- */
/* Compiles GBNF text and runs it over the bytes text[0..n): 1 when it takes them all and may
 * end there, 0 when it takes them all and may not end, -1 when it refuses a byte; < -1 (the
 * negated status) when the grammar does not compile (its message into err). */
int ft_gbnf_match(const char *gbnf, const char *text, size_t n, char *err, size_t err_size);
/* The shortest bytes that take grammar g from where it stands to where it may end, as
 * one-byte tokens of its vocabulary, into out[0..cap): their count, or -1 (none within cap,
 * or a byte with no one-byte token). The grammar is not moved. */
int ft_grammar_finish(forge_grammar *g, int32_t *out, int cap);
/* The constrained draw (generate.c) on a synthetic row: logits[V] (after the penalty), a
 * constraint allowing the tokens whose allowed[] is 1, the top n_cand candidates (n_cand < V:
 * the candidates decide or the whole row is read) at the sampling params; the rng state moves
 * as the draw does. *used_row: whether the whole row was needed. Returns the token (-1: none
 * allowed). */
int32_t ft_draw_constrained(const float *logits, const uint8_t *allowed, int V, int n_cand, float temperature, int top_k, float top_p,
                            float min_p, uint64_t rng[4], int *used_row);

/* ---- chat ---- */
/* Replaces the model's chat template (the caller keeps `tmpl` alive while the model uses it). */
void ft_model_set_chat_template(forge_model *m, const char *tmpl);
/* forge_chat_render with the Llama 3.1+ "Today Date" pinned to `date` (NULL: as forge picks it);
 * *out is malloc'd (free it), NULL when nothing was rendered. */
forge_status ft_chat_render_on(const forge_model *m, const char *date, const forge_chat_message *msgs, int n, const forge_tool *tools,
                               int n_tools, uint32_t flags, char **out, size_t *len);
/* A reply's tool calls as forge_chat_tools reads them (format: 1 Llama 3.1+, 2 Qwen 3, 3 Qwen
 * 3.5, whose values the tools' schemas type, 4 Mistral v0.3, 5 Mistral Nemo, 6 Gemma 4): "CONTENT" then
 * "\x01NAME\x02ARGUMENTS" a call, malloc'd (NULL: out of memory); the calls' count in *n_calls,
 * the content's length (it may hold any byte) in *content_len. */
char *ft_tool_reply(int format, const char *text, size_t n, const forge_tool *tools, int n_tools, int *n_calls, size_t *content_len);
/* The ids of those calls, comma-separated, malloc'd. */
char *ft_tool_reply_ids(int format, const char *text, size_t n);
/* A GBNF constraint with `trigger` and `arm` (the matcher's: the trigger counts only after arm;
 * NULL: anywhere) fed toks[0 .. n): the index of the token with which the constraint first
 * applied (-1: never), or -2 when a token was not allowed or the grammar did not compile. */
int ft_trigger_opens(const forge_model *m, const char *gbnf, const char *trigger, const char *arm, const int32_t *toks, int n);
/* The GBNF forge_chat_tools constrains tool calls with (format as above; required: the
 * FORGE_CHAT_TOOL_REQUIRED form), malloc'd, its trigger in *trigger; NULL with the message in err. */
char *ft_tool_grammar(int format, const forge_tool *tools, int n_tools, int required, const char **trigger, char *err, size_t err_size);
/* JSON Schema text -> GBNF text, malloc'd; NULL with the status in *status and the message in err. */
char *ft_schema_gbnf(const char *schema, size_t n, int *status, char *err, size_t err_size);
/* forge_generate_tokens with the prompt cache's checkpoint (a model with linear-attention
 * layers) after the first `snap` prompt tokens, as forge_chat places it (-1: all but the last);
 * *ckpt_pos gets where the session's checkpoint then is (-1: none). */
forge_status ft_generate_checkpointed(forge_session *s, const int32_t *prompt, int n, int snap, const forge_generate_params *p,
                                      forge_metrics *mt, int *ckpt_pos);
/* ---- sessions (context overflow) ---- */
/* The tokens the session's cache holds, in cache order (n_past of them) into out[0..cap). */
int ft_session_history(const forge_session *s, int32_t *out, int cap);
/* Whether forge_embed runs the model's Dense steps on the device in s; `set` >= 0 switches it
 * (0: the host's path, as for a Tanh Dense), for the tests to hold both paths to one answer:
 * before the session's first embedding pass (its recordings keep the path they were made with). */
int ft_session_embed_dense(forge_session *s, int set);
/* Rows [row0, row0 + n) of layer l's K (v = 0) or V (v = 1) cache, [n, n_kv_heads * head_dim]
 * (an f16 cache's values widened to f32). */
forge_status ft_session_kv(forge_session *s, int layer, int v, int row0, int n, float *out);
/* RoPE inverse frequencies [D/2] as forge computes them for a model: scaling 0 none, 1 linear
 * (factor), 2 llama3 (factor, low and high freq factors, original max positions). */
void ft_rope_inv_freq(double theta, int scaling, double factor, double low, double high, int orig_max, int D, float *out);
/* The re-rotation a context shift runs on cached keys: rows [n, kv_heads * D] rotated back by d
 * positions (rope_back with seq_len 1 and pos0 = d), in place. */
forge_status ft_rope_shift(ft_ctx *c, float *k, uint32_t n, uint32_t kv_heads, uint32_t D, const float *inv_freq, uint32_t d, int adjacent);
/* The same on f16 rows (rope_shift_kv16: D % 4 == 0). */
forge_status ft_rope_shift16(ft_ctx *c, uint16_t *k, uint32_t n, uint32_t kv_heads, uint32_t D, const float *inv_freq, uint32_t d,
                             int adjacent);
/* The same on q8_0 rows (rope_shift_kv8: D % 32 == 0; n * kv_heads heads of ft_kv8_head_bytes(D)). */
forge_status ft_rope_shift8(ft_ctx *c, uint8_t *k, uint32_t n, uint32_t kv_heads, uint32_t D, const float *inv_freq, uint32_t d, int adjacent);

/* ---- push constants (tests/test_push_constants.cpp) ---- */
/* Module i (0 .. ft_module_count() - 1) of the generated kernel header: its name, SPIR-V words,
 * and the size of its push-constant block as tools/build_kernels.sh recorded it
 * (FORGE_SPV_PUSH_BYTES_<name>). 0 past the end. */
int ft_module_count(void);
int ft_module(int i, const char **name, const uint32_t **words, size_t *n_words, uint32_t *block_bytes);
/* Op `op` of forge__ops (0 .. ft_op_count() - 1): its name, the module it runs (as ft_module's
 * index; -1 where this build has none, the row left empty) and the bytes the host pushes to it
 * (its row's push_bytes). */
int ft_op_count(void);
void ft_op(int op, const char **name, int *module, uint32_t *push_bytes);

#ifdef __cplusplus
}
#ifdef __cplusplus
/* The default device, opened once per test process (NULL when there is none). */
inline ft_ctx *ft_device() {
    static ft_ctx *c = [] {
        char e[512];
        return ft_open(e, sizeof e);
    }();
    return c;
}
#endif

#endif
