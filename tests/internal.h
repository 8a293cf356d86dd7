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

enum { FT_F32 = 0, FT_F16 = 1, FT_BF16 = 2 };
#define FT_BIAS 1u
#define FT_ACCUMULATE 2u
#define FT_SOFTCAP 4u

/* C[m, c_col0 + n] (+)= A[a_row0 + m, :] . W[n, :] for m < M, W [N, K] stored in `fmt` and
 * split into chunks of chunk_rows rows (0: one chunk). C is [M, ldc], in/out.
 * use_matmul: 0 picks the kernel as forge does (matvec for M <= 8), 1 forces the tiled matmul. */
forge_status ft_linear(ft_ctx *c, int fmt, const float *A, uint32_t a_rows, uint32_t a_row0, uint32_t M, uint32_t K,
                       const void *W, uint32_t N, uint32_t chunk_rows, const float *bias, uint32_t flags, float softcap,
                       float *C, uint32_t ldc, uint32_t c_col0, int use_matmul);
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
forge_status ft_attention(ft_ctx *c, const float *q, uint32_t n, uint32_t H, uint32_t Hkv, uint32_t D, const float *kc,
                          const float *vc, uint32_t slots, uint32_t pos0, uint32_t window, float scale, float softcap,
                          float *out);
forge_status ft_act_mul(ft_ctx *c, float *g, const float *u, uint32_t count, uint32_t act);

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
forge_status ft_config_mem(const uint8_t *data, size_t size);
/* tokenizer.json on a buffer; when it loads, also encodes and decodes a few texts with it. */
forge_status ft_tokenizer_json_mem(const uint8_t *data, size_t size);

#ifdef __cplusplus
}
#endif
#endif
