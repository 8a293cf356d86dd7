/* forge.c: the forge runtime, one C11 translation unit. The public API is forge.h.
 *
 * The runtime lives in src/, one file per section, in the order data flows; each file opens
 * with what it owns and what it may call, and calls only files before it. This file is their
 * ordered list, so every internal stays static in one translation unit. `make dist` writes the
 * same sections into one file, dist/forge.c, with the SPIR-V embedded (no glslang needed).
 *
 * Conventions: every internal name is static and starts with forge__; tensors are row-major
 * and their shapes are written outermost first ([rows, cols]); activations are f32.
 */
#if !defined(_WIN32) && !defined(_GNU_SOURCE)
#  define _GNU_SOURCE 1   /* mmap, pthread, strndup, clock_gettime */
#endif

#include "forge.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <vulkan/vulkan.h>

#include "forge_kernels.h" /* generated at build time: the SPIR-V of kernels/ as arrays */

#ifdef FORGE_TESTING
#  define FORGE__INTERNAL        /* tests reach internals by including forge.c */
#else
#  define FORGE__INTERNAL static
#endif

#include "src/base.c"       /* status names and errors, logging, checked arithmetic, the host arena, scratch buffers, hashing */
#include "src/files.c"      /* mmap, tensor dtypes, the tensor table, safetensors, GGUF */
#include "src/config.c"     /* config.json and GGUF metadata -> forge__config */
#include "src/tokenizer.c"  /* tokenizer.json and GGUF vocabularies: encode, decode */
#include "src/device.c"     /* Vulkan instance, device choice, capabilities, buffers */
#include "src/ops.c"        /* the op table (one row per kernel), pipelines, dispatch recording */
#include "src/host.c"       /* CPU devices: products run in C between submissions (f32 or int8 activations), the worker pool */
#include "src/model.c"      /* struct forge_model: weights by role, validation, the upload plan */
#include "src/session.c"    /* struct forge_session: the KV cache and activations, planned */
#include "src/forward.c"    /* recording a layer and the whole forward pass */
#include "src/exec.c"       /* the recording cache, prefill and the replayed decode step, overflow */
#include "src/adapter.c"    /* LoRA adapter files (PEFT, mlx-lm); the model's adapter at load */
#include "src/api.c"        /* loading, sessions, eval, the tokenizer's public calls */
#include "src/discover.c"   /* models in a directory tree, checked from their headers */
#include "src/schema.c"     /* JSON Schema -> GBNF: the enforced subset, patterns, bounded numbers */
#include "src/grammar.c"    /* GBNF, the byte automaton, the token trie, the matcher: constraints */
#include "src/generate.c"   /* the sampler, stop rules, the prompt cache, forge_generate */
#include "src/batch.c"      /* many sequences on one session: forge_generate_batch */
#include "src/classify.c"   /* many prompts in padded batches: forge_classify */
#include "src/embed.c"      /* forge_embed (pooling, sentence-transformers steps), forge_rerank */
#include "src/chat.c"       /* the families' native chat templates: forge_chat, tools and tool calls */
#include "src/train.c"      /* the LoRA trainer: backward pass, checkpointing, AdamW */
#include "src/state.c"      /* state files (save / restore), attention-K inspection */
