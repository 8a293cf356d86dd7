/* forge.h: the whole public C API of forge, an embeddable LLM runtime on Vulkan.
 *
 * Threads. A forge_model (weights, tokenizer, config, pipelines) is immutable after
 * forge_model_load returns and may be shared by any number of threads. A forge_session
 * (KV cache, scratch buffers, sampler state) belongs to one thread at a time; create one
 * session per concurrent stream. Several sessions may share one model; their calls run at
 * once (the device queue is shared under a lock) and give exactly the results they give alone.
 * forge_model_params.parallel_slots caps how many run at once.
 *
 * Errors. Every fallible call returns a forge_status (FORGE_OK = 0). The message that
 * explains a failure (naming the file, tensor, field or limit at fault) stays on the object
 * the call was made on: forge_model_errmsg() or forge_session_errmsg(). forge never aborts,
 * exits or prints; logging goes through the optional callback in forge_model_params.
 *
 * Memory. Strings and arrays forge returns point into the object they came from and stay
 * valid until that object is freed, unless a function says otherwise. Outputs that the
 * caller asked for go into caller buffers; a buffer that is too small gives
 * FORGE_ERR_BUFFER_TOO_SMALL and the size needed.
 *
 * Structs grow at their end. Every struct forge reads or writes starts with
 * `uint32_t struct_size`, its size as the caller's forge.h declared it, so a binary built
 * against an older forge.h keeps working with a newer library (and the other way round):
 *   - parameter structs come from forge_*_default_params(), which set it;
 *   - structs forge fills (forge_metrics, forge_model_info, forge_memory_stats, ...) and the
 *     elements of arrays forge reads or fills (forge_chat_message, forge_classify_prompt,
 *     forge_classify_result, forge_batch_item, forge_batch_result, forge_device_info): the
 *     caller sets struct_size = sizeof(T) before the call (`forge_metrics m = {sizeof m};`).
 *     In an array the first element's struct_size is every element's size (the stride).
 *   forge writes at most struct_size bytes into a struct it fills and zeroes the bytes it has no
 *   field for; it reads at most struct_size bytes of a struct it reads, taking the fields past
 *   them as zero. struct_size 0 gives FORGE_ERR_INVALID_ARGUMENT naming the struct, before the
 *   call does anything. A struct that ends in another forge struct (forge_batch_result's
 *   metrics) grows only through that one. Bindings check their mirrors at load with
 *   forge_struct_size() and forge_version_number().
 *
 * Linking. Build forge.c (or the drop-in dist/forge.c) into a static or shared library: the
 * forge_* functions are exported with default visibility, everything else is static. To make
 * forge private to one translation unit instead, `#define FORGE_STATIC` and `#include "forge.c"`
 * in it: every forge_* function is then static too (nothing is exported; unused functions may
 * warn under -Wunused-function). Defining FORGE_API yourself overrides both.
 *
 * Callbacks. A callback that can stop its call returns 0 to go on and non-zero to stop, as
 * sqlite3_exec's and libcurl's do (forge_token_fn). Callbacks that only report (log, load
 * progress) return nothing.
 *
 * Basic use:
 *
 *     forge_model *model;
 *     forge_model_params mp = forge_model_default_params();
 *     if (forge_model_load("stories260K.gguf", &mp, &model) != FORGE_OK) {
 *         fprintf(stderr, "%s\n", forge_model_errmsg(model));
 *         forge_model_free(model);
 *         return 1;
 *     }
 *     forge_session *s;
 *     forge_session_params sp = forge_session_default_params();
 *     sp.n_ctx = 512;
 *     forge_session_create(model, &sp, &s);
 *     int32_t bos = 1;
 *     float *logits = malloc(sizeof(float) * forge_model_n_vocab(model));
 *     forge_eval(s, &bos, 1, 0, logits, forge_model_n_vocab(model));
 *     forge_session_free(s);
 *     forge_model_free(model);
 */
#ifndef FORGE_H
#define FORGE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef FORGE_API
#  if defined(FORGE_STATIC)
#    define FORGE_API static
#  elif defined(_WIN32) && defined(FORGE_BUILD_SHARED)
#    define FORGE_API __declspec(dllexport)
#  elif defined(__GNUC__)
#    define FORGE_API __attribute__((visibility("default")))
#  else
#    define FORGE_API
#  endif
#endif

/* The version, in one place: forge_version() spells it, and the Makefile and CMakeLists.txt read
 * these three lines for the shared library's name (libforge.so.MAJOR.MINOR.PATCH, soname
 * libforge.so.MAJOR), forge.pc and the CMake package version. */
#define FORGE_VERSION_MAJOR 0
#define FORGE_VERSION_MINOR 1
#define FORGE_VERSION_PATCH 0
/* The version as one number, MAJOR * 1000000 + MINOR * 1000 + PATCH (0.1.0 is 1000), for
 * comparisons at compile time; forge_version_number() gives the library's at run time. */
#define FORGE_VERSION_NUMBER (FORGE_VERSION_MAJOR * 1000000 + FORGE_VERSION_MINOR * 1000 + FORGE_VERSION_PATCH)

/* ---------------------------------------------------------------------------------------
 * Status codes
 * ------------------------------------------------------------------------------------- */

typedef enum forge_status {
    FORGE_OK = 0,
    FORGE_ERR_INVALID_ARGUMENT = 1, /* NULL pointer, out-of-range value, misuse of the API */
    FORGE_ERR_IO = 2,               /* a file is missing, unreadable or cannot be mapped */
    FORGE_ERR_FORMAT = 3,           /* a file is malformed: header, offsets, JSON, sizes */
    FORGE_ERR_UNSUPPORTED = 4,      /* well-formed but not supported: architecture, dtype, component */
    FORGE_ERR_MODEL = 5,            /* tensors and config disagree: missing tensor, wrong shape */
    FORGE_ERR_DEVICE = 6,           /* no usable Vulkan device, or a Vulkan call failed */
    FORGE_ERR_OUT_OF_MEMORY = 7,    /* host or device memory could not be allocated */
    FORGE_ERR_LIMIT = 8,            /* a planned limit was exceeded (context length, batch) */
    FORGE_ERR_BUFFER_TOO_SMALL = 9, /* a caller buffer is too small; the size needed is returned */
    FORGE_ERR_CANCELLED = 10        /* the caller's cancel flag was set (forge_classify_params.cancel) */
} forge_status;

/* Constant English name of a status code ("FORGE_ERR_FORMAT"). Never NULL. */
FORGE_API const char *forge_status_name(forge_status status);

/* Library version string, "MAJOR.MINOR.PATCH". Constant, never NULL. */
FORGE_API const char *forge_version(void);

/* The library's FORGE_VERSION_NUMBER (which may differ from the header's a caller was built with). */
FORGE_API int forge_version_number(void);

/* sizeof the named public struct in the library ("forge_metrics", "forge_model_params", ...),
 * or 0 for a name forge.h does not define: what an FFI binding compares its mirrors with. */
FORGE_API size_t forge_struct_size(const char *name);

/* Log levels for forge_log_fn. */
typedef enum forge_log_level {
    FORGE_LOG_ERROR = 0,
    FORGE_LOG_WARN = 1,
    FORGE_LOG_INFO = 2,
    FORGE_LOG_DEBUG = 3
} forge_log_level;

/* Log callback: msg is one line without a trailing newline, valid only during the call. */
typedef void (*forge_log_fn)(void *user_data, forge_log_level level, const char *msg);

/* Load progress callback: fraction in [0, 1] of the weight bytes uploaded so far; called with 0
 * when the upload starts, then after each piece, ending with 1. */
typedef void (*forge_progress_fn)(void *user_data, float fraction);

/* ---------------------------------------------------------------------------------------
 * Devices
 * ------------------------------------------------------------------------------------- */

typedef enum forge_device_type {
    FORGE_DEVICE_OTHER = 0,
    FORGE_DEVICE_INTEGRATED_GPU = 1,
    FORGE_DEVICE_DISCRETE_GPU = 2,
    FORGE_DEVICE_VIRTUAL_GPU = 3,
    FORGE_DEVICE_CPU = 4
} forge_device_type;

typedef struct forge_device_info {
    uint32_t struct_size;          /* set by the caller in out[0]: sizeof(forge_device_info) */
    int index;                     /* index to pass as forge_model_params.device_index */
    char name[256];                /* e.g. "NVIDIA H100 80GB HBM3", "llvmpipe (LLVM 15.0.6, 256 bits)" */
    char driver[256];              /* driver name and version, e.g. "NVIDIA 580.159.4" */
    forge_device_type type;
    uint32_t vendor_id;
    uint32_t api_version;          /* Vulkan version the driver supports (VK_MAKE_API_VERSION) */
    uint64_t device_local_bytes;   /* size of the largest device-local heap */
    uint64_t max_storage_buffer_range;
    uint64_t max_allocation_size;
    uint64_t max_buffer_size;
    uint32_t subgroup_size;
    int fp16;                      /* shaderFloat16 + 16-bit storage */
    int int8;                      /* shaderInt8 + 8-bit storage */
    int integer_dot_product;       /* VK_KHR_shader_integer_dot_product */
    int cooperative_matrix;        /* VK_KHR_ or VK_NV_cooperative_matrix with fp16 16x16x16 */
    int usable;                    /* 1 if forge can run on it (Vulkan 1.2, required features) */
} forge_device_info;

/* Lists the Vulkan devices. Writes up to `capacity` entries to `out` (may be NULL when capacity
 * is 0; else out[0].struct_size gives the entries' size) and the total number found to *count. Devices are in the order the default choice
 * prefers them: discrete, integrated, virtual, CPU. Fails with FORGE_ERR_DEVICE when no Vulkan
 * loader or driver is present; errmsg (if not NULL) receives the reason. */
FORGE_API forge_status forge_list_devices(forge_device_info *out, int capacity, int *count,
                                          char *errmsg, size_t errmsg_size);

/* ---------------------------------------------------------------------------------------
 * Model
 * ------------------------------------------------------------------------------------- */

typedef struct forge_model forge_model;

typedef struct forge_model_params {
    uint32_t struct_size;          /* sizeof(forge_model_params), set by the default */
    int device_index;              /* -1: choose (discrete, then integrated, then CPU) */
    const char *device_name;       /* if not NULL: first device whose name contains it */
    /* Limits lower than the device's, for testing how forge splits tensors and buffers;
     * 0 = the device's own. Values are rounded down to the device's alignment. */
    uint64_t max_storage_buffer_range;
    uint64_t max_allocation_size;
    int load_tokenizer;            /* 1 (default): load tokenizer.json / the GGUF vocab */
    forge_log_fn log;              /* optional */
    void *log_user_data;
    forge_progress_fn progress;    /* optional */
    void *progress_user_data;
    /* 1: load only the tokenizer: no weights, no Vulkan device. The path may then also be a
     * tokenizer.json, a directory holding one (config.json not needed) or a GGUF with
     * tokenizer metadata and no tensors. Only the tokenizer calls (and errmsg, free,
     * n_vocab) work on such a model; the others fail with FORGE_ERR_UNSUPPORTED. */
    int vocab_only;
    int exact;                     /* 1: keep every product in f32 (no tensor-core matmul, whose
                                    * inputs round to f16 as llama.cpp's do, and no int8
                                    * activations): slower prefill and quantized decode on such
                                    * GPUs, results bit-for-bit those of the f32 kernels.
                                    * 0 (default): products of more than 8 rows (prefill, classify,
                                    * batch decode, training's forward and its input gradients
                                    * through the frozen weights) run on the tensor cores where the
                                    * device has them (VK_NV_cooperative_matrix), so a batched
                                    * sequence or a prompt's logits can differ from a one-row run
                                    * by f16 rounding (training's gradients, rows of output
                                    * gradients each scaled by a power of two before rounding, by
                                    * ~2e-3 to 5e-2 of the largest on the test fixtures); and on GPUs with integer dot products a decode
                                    * step's products of Q4_0 / Q8_0 weights take activations
                                    * rounded to 8 bits a block of 32, as llama.cpp's quantized
                                    * products do (logits within llama.cpp's own distance from the
                                    * exact ones); on CPU devices (lavapipe), where those
                                    * products run on the host, so do a prompt's.
                                    * Sessions of an exact model keep an f32 KV cache unless
                                    * asked otherwise (forge_session_params.kv_type). */
    /* A LoRA adapter to apply (go-mlx's WithAdapterPath): a directory holding a PEFT adapter
     * (adapter_config.json + adapter_model.safetensors) or an mlx-lm one (adapter_config.json +
     * adapters.safetensors), told apart by their files. The low-rank path runs beside the base
     * weights, which stay as stored (quantized or not). NULL: none. */
    const char *adapter_path;
    int adapter_merge;             /* 1: add scale * B A into the base weights at load instead (f32,
                                    * f16 and bf16 weights only; quantized ones are an error): no
                                    * extra work per token, the result rounded to the weight's dtype */
    /* The most inference calls (forge_eval, forge_generate*, forge_chat, forge_classify,
     * forge_train_step/eval) running at once on this model, each on its own session or trainer
     * (go-mlx's WithParallelSlots). 0 (default): no cap. A call holds its slot until it returns,
     * token callbacks included: a callback must not start another call on the same model when
     * the cap could be reached (it would wait for itself). */
    int parallel_slots;
    int parallel_fail;             /* 0 (default): a call beyond the cap waits for a free slot;
                                    * 1: it fails at once with FORGE_ERR_LIMIT */
    /* The device memory this model, its sessions and trainers may use together, in bytes; 0: the
     * device's largest device-local heap. Every plan is checked against it before anything is
     * allocated: weights at load, the KV cache and activations at forge_session_create, a
     * trainer's memory at forge_trainer_create. One that does not fit fails with
     * FORGE_ERR_OUT_OF_MEMORY and a message giving what it needs, the budget and what is in use
     * (never a Vulkan allocation error mid-run). Lower it to leave room for other work or to test. */
    uint64_t max_device_memory;
} forge_model_params;

FORGE_API forge_model_params forge_model_default_params(void);

/* Loads a model from `path`: a directory holding config.json and *.safetensors (one file or
 * shards, with or without model.safetensors.index.json; tokenizer.json beside them), a single
 * .safetensors file whose directory holds config.json, or a .gguf file. Weights are mapped,
 * validated and uploaded to the chosen device.
 * On success *out_model is a ready model. On failure *out_model is still set (unless the
 * host is out of memory, then NULL) to a failed model that holds the error message: call
 * forge_model_errmsg() for it and forge_model_free() to release it; nothing else. */
FORGE_API forge_status forge_model_load(const char *path, const forge_model_params *params,
                                        forge_model **out_model);

/* Frees a model and everything it holds (device memory included). Sessions and trainers
 * created from it must be freed first. NULL is a no-op. */
FORGE_API void forge_model_free(forge_model *model);

/* The message of the last failure on this model (from any thread), or "" if none. Valid until
 * the next failing call on the model or its free. */
FORGE_API const char *forge_model_errmsg(const forge_model *model);

typedef struct forge_memory_stats {
    uint32_t struct_size;          /* set by the caller: sizeof(forge_memory_stats) */
    uint64_t host_arena_bytes;     /* host memory forge holds for this object (arena, tables) */
    uint64_t device_planned_bytes; /* device memory the plan needs */
    uint64_t device_in_use_bytes;  /* device memory allocated now */
    uint64_t device_peak_bytes;    /* the most device memory allocated at once */
    uint64_t device_buffers;       /* number of VkBuffers */
    uint64_t device_allocations;   /* number of VkDeviceMemory allocations */
    uint64_t kv_cache_bytes;       /* sessions: device bytes of the KV cache (all layers) */
    uint64_t kv_sliding_bytes;     /* sessions: of which sliding-window layers (bounded by the window) */
    uint64_t state_bytes;          /* sessions: device bytes of the recurrent state of linear-attention layers (Qwen 3.5),
                                    * fixed whatever the context, beside the KV cache: one per sequence place, and one
                                    * more, the prompt cache's checkpoint (see forge_session_truncate) */
} forge_memory_stats;

typedef struct forge_model_info {
    uint32_t struct_size;          /* set by the caller: sizeof(forge_model_info) */
    char architecture[32];         /* "llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "gemma4" */
    char source_format[16];        /* "safetensors" or "gguf" */
    char weight_dtype[16];         /* dominant storage type of the matrices: "f32", "bf16", "q4_k", ... */
    char name[128];                /* general.name / directory name */
    int n_layers;
    int hidden;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int ffn;                       /* feed-forward (intermediate) size */
    int n_vocab;
    int n_ctx_train;               /* max_position_embeddings / context_length */
    int sliding_window;            /* 0 when no layer uses a window */
    int n_sliding_layers;
    int tied_embeddings;
    uint64_t n_params;             /* parameters in the weight tensors */
    uint64_t weight_bytes;         /* bytes of weights on the device */
    char device_name[256];
    char device_driver[256];
} forge_model_info;

/* Fills *info. Fails only on a NULL or failed model, a vocab_only one, or struct_size 0. */
FORGE_API forge_status forge_model_get_info(const forge_model *model, forge_model_info *info);

/* The model's memory: its host arena and the device memory of its weights (planned, in use),
 * and the peak of the model and everything made from it (sessions, trainers). */
FORGE_API forge_status forge_model_memory(const forge_model *model, forge_memory_stats *stats);
FORGE_API int forge_model_n_vocab(const forge_model *model);
FORGE_API int forge_model_n_ctx_train(const forge_model *model);

/* ---------------------------------------------------------------------------------------
 * Discovery
 * ------------------------------------------------------------------------------------- */

typedef enum forge_model_format {
    FORGE_FORMAT_SAFETENSORS = 0,  /* a directory: config.json + *.safetensors (one file or shards) */
    FORGE_FORMAT_GGUF = 1          /* one .gguf file */
} forge_model_format;

typedef struct forge_discover_params {
    uint32_t struct_size;          /* sizeof(forge_discover_params), set by the default */
    int max_depth;                 /* directory levels below `dir` to search; 0: `dir` only (default 8) */
    int follow_symlinks;           /* 1: descend into symbolic links to directories (each directory is
                                    * searched once, so loops end); 0 (default): don't. Links to files
                                    * are always followed (the HuggingFace cache is made of them). */
    int quick;                     /* 1: headers and config only: no tensor checks and no memory plan,
                                    * so loadable means "config and architecture supported" and
                                    * weight_dtype / quant_bits come from the tensor table */
    forge_log_fn log;              /* optional: directories that cannot be read, links not followed */
    void *log_user_data;
} forge_discover_params;

typedef struct forge_discovered_model {
    uint32_t struct_size;          /* set by forge: sizeof(forge_discovered_model) (read fields within it) */
    const char *path;              /* the model directory or .gguf file: `dir` joined with the path below it */
    forge_model_format format;
    const char *format_name;       /* "safetensors" or "gguf" */
    const char *architecture;      /* config.json model_type / general.architecture as written, supported
                                    * or not ("mamba"); "" when the file cannot tell */
    const char *weight_dtype;      /* dominant storage type of the matrices, as forge_model_info.weight_dtype
                                    * ("f32", "bf16", "q4_k+", "mlx4"); "" when unknown */
    int quant_bits;                /* that type's nominal bits (f32 32, bf16 16, q8_0 8, q6_k 6, q4_k 4,
                                    * MLX its bits; block scales not counted); 0 when unknown */
    uint64_t n_params;             /* parameters: those forge loads (forge_model_info.n_params) when the plan
                                    * was made; else the elements of the text model's tensors in the headers
                                    * (MLX codes unpacked at the config's bits; scales, biases, RoPE factors
                                    * not counted); 0 when no header could be read */
    int n_files;                   /* weight files: the .gguf, or the .safetensors shards */
    uint64_t bytes;                /* their total size on disk */
    uint64_t device_bytes;         /* device memory forge_model_load plans for the weights, on a device
                                    * with 1 GiB allocations and 16-byte alignment (others differ by
                                    * padding); 0 with quick or when not loadable */
    int loadable;                  /* 1: forge_model_load should succeed, given a device with the memory
                                    * and (not checked here) a readable tokenizer */
    forge_status status;           /* FORGE_OK when loadable, else what forge_model_load would return */
    const char *reason;            /* why not loadable (the message forge_model_load would give); "" when loadable */
} forge_discovered_model;

/* Called once per model found, in path order (byte-wise); `model` and its strings are valid
 * during the call only. Return 0 to go on, non-zero to stop the search. */
typedef int (*forge_discover_fn)(void *user_data, const forge_discovered_model *model);

FORGE_API forge_discover_params forge_discover_default_params(void);

/* Searches the directory tree under `dir` for models (go-mlx's Discover) and reports each to
 * `fn`: a directory holding config.json and *.safetensors (or model.safetensors.index.json) is
 * one model, each *.gguf file is one. Nothing is mapped or uploaded and no device is needed:
 * headers are read with pread, the config parsed and (unless quick) the tensors checked and
 * the weights' memory plan made exactly as forge_model_load does, so a model that cannot load
 * is reported with the reason. The tokenizer is not checked. Hidden entries (".name") are
 * skipped; directories that cannot be read are skipped and logged.
 * Returns FORGE_OK when the search ran (whatever the models' own status, and also when `fn`
 * stopped it), FORGE_ERR_INVALID_ARGUMENT for a NULL dir / fn or a negative max_depth,
 * FORGE_ERR_IO when `dir` is not a readable directory; errmsg (if not NULL) receives the reason. */
FORGE_API forge_status forge_discover(const char *dir, const forge_discover_params *params, forge_discover_fn fn,
                                      void *user_data, char *errmsg, size_t errmsg_size);

/* ---------------------------------------------------------------------------------------
 * Session
 * ------------------------------------------------------------------------------------- */

typedef struct forge_session forge_session;

/* What a session does when the next token would not fit its n_ctx (forge_session_params.overflow).
 * Sliding keeps the first n_keep tokens, drops the oldest half of the rest (n_discard =
 * (n_past - n_keep) / 2, at least 1) and goes on, so generation and chat can run indefinitely.
 * It happens in forge_eval, forge_warm, forge_generate* and forge_chat (prefill and decode)
 * whenever the next step would not fit, as often as needed (a prompt may then be longer than
 * n_ctx: its start slides out as it is evaluated); classify never slides. forge_eval of more
 * than n_ctx - n_keep tokens at once still fails (FORGE_ERR_LIMIT, naming n_ctx), before
 * anything slides. The session keeps the dropped ids (4 bytes each, on the host): a later
 * prompt that continues the whole sequence (the kept tokens, the dropped ones, then what the
 * cache holds) reuses the cache as if they were still there, so a long chat prefills only its
 * new turn; a prompt that does not forgets them. forge_metrics.context_slides counts slides.
 *   FAIL:      today's behaviour: forge_eval fails with FORGE_ERR_LIMIT, a prompt longer than
 *              n_ctx fails, generation stops with FORGE_STOP_CONTEXT.
 *   SHIFT:     llama.cpp's context shift: the kept keys and values move down n_discard rows on
 *              the device and the keys are rotated back by n_discard positions, no model pass.
 *              Cheap but approximate: keys and values of layers after the first were computed
 *              attending to the dropped tokens, so the logits differ from RECOMPUTE's (a
 *              one-layer model's, and every model's first-layer keys, are equal to rounding).
 *              Sliding-window layers' rotating caches turn with the positions. When a ring has
 *              wrapped (n_past > window + n_batch - 1) and the next position's window would
 *              still reach a kept token, that slide recomputes instead (as does one whose ring
 *              does not fit the session's largest activation buffer); after a ring turned, the
 *              prompt cache cannot go back to a point whose window reaches the kept tokens
 *              (forge_session_truncate says so; generate re-prefills). A model with
 *              linear-attention layers (Qwen 3.5) always recomputes: a recurrent state holds
 *              every token it has seen and cannot drop some.
 *   RECOMPUTE: the kept tokens are evaluated again from scratch: exact (the logits equal a fresh
 *              session's on the kept tokens), at the cost of a prefill of about n_ctx / 2 tokens. */
typedef enum forge_overflow {
    FORGE_OVERFLOW_FAIL = 0,
    FORGE_OVERFLOW_SHIFT = 1,
    FORGE_OVERFLOW_RECOMPUTE = 2,
} forge_overflow;

/* How a session's KV cache stores keys and values (forge_session_params.kv_type).
 *   DEFAULT: f16 on GPUs, f32 on CPU devices (lavapipe) and for models loaded with exact = 1.
 *   F32:     every key and value as computed: the logits equal the f32 kernels' bit for bit.
 *   F16:     rounded to f16 (to nearest, as llama.cpp's default cache): half the cache's
 *            memory and half the bytes decode attention reads; logits move by the rounding
 *            (on the parity fixtures 4.6e-4 to 6.1e-4 of the largest logit, against 1e-4). Needs head_dim a multiple of 4, else
 *            FORGE_ERR_UNSUPPORTED.
 *   Q8_0:    llama.cpp's q8_0 blocks: each 32 values of a head as int8 codes and one f16 scale
 *            (max |v| / 127): 0.53x f16's memory and decode attention's bytes (0.56x at heads
 *            of 32), for long contexts and many sequences; logits move by the quantization (on
 *            the parity fixtures with heads of 32, 2.1e-3 to 4.7e-2 of the largest logit). Needs
 *            every attention layer's head_dim a multiple of 32, else FORGE_ERR_UNSUPPORTED.
 *            Prompt attention on tensor cores stages its tiles to f16 (on an H100 the 1B Q4_0
 *            shape's 4096-token prompt: 38.4k tok/s against f16's 39.7k). For memory, not decode
 *            speed: on an H200 the 8B Q4_0 shape at 16384 positions decodes at 129 tok/s
 *            against f16's 190 (bench/RESULTS.md).
 * State files keep an f32 or f16 session's type, and hold a q8_0 session's keys and values as
 * F32 (each q x d exactly, so that they load back into q8_0 as the same codes); any file loads
 * into any session (converted on the host). */
typedef enum forge_kv_type {
    FORGE_KV_DEFAULT = 0,
    FORGE_KV_F32 = 1,
    FORGE_KV_F16 = 2,
    FORGE_KV_Q8_0 = 3,
} forge_kv_type;

typedef struct forge_session_params {
    uint32_t struct_size;          /* sizeof(forge_session_params) */
    int n_ctx;                     /* context length (tokens the KV cache holds); 0: min(model, 4096) */
    int n_batch;                   /* most tokens per prefill step; 0: 512 */
    int n_outputs_max;             /* most logit rows computed per step; 0: fits in 64 MiB, ≤ n_batch */
    int profile;                   /* 1: time every kernel on the device (forge_session_profile) */
    int overflow;                  /* forge_overflow: what a full context does; default FORGE_OVERFLOW_FAIL */
    int n_keep;                    /* tokens a slide never drops (the start of the sequence), at most
                                    * n_ctx - 2; 0: the first token when it is the tokenizer's BOS, else
                                    * none (a chat template's system prompt is not kept unless counted) */
    int n_seq_max;                 /* sequences forge_batch_generate decodes at once, each with its own
                                    * n_ctx of KV cache (the cache is n_seq_max times larger); 0: 1; at
                                    * most 512, n_batch and n_outputs_max */
    int kv_type;                   /* forge_kv_type; 0: FORGE_KV_DEFAULT */
} forge_session_params;

FORGE_API forge_session_params forge_session_default_params(void);

/* Computes the memory plan a session with these parameters would need, without allocating. */
FORGE_API forge_status forge_session_plan(forge_model *model, const forge_session_params *params,
                                          forge_memory_stats *plan);

/* Creates a session on a loaded model: allocates its KV cache and scratch buffers, all
 * planned up front. On failure *out_session is NULL and the message is on the model. */
FORGE_API forge_status forge_session_create(forge_model *model, const forge_session_params *params,
                                            forge_session **out_session);
FORGE_API void forge_session_free(forge_session *session);
FORGE_API const char *forge_session_errmsg(const forge_session *session);

/* Tokens the session's KV cache holds (the next token is evaluated at this position). */
FORGE_API int forge_session_n_past(const forge_session *session);

/* The type the session's KV cache holds (FORGE_KV_F32, F16 or Q8_0: DEFAULT resolved). */
FORGE_API forge_kv_type forge_session_kv_type(const forge_session *session);

/* Prewarm: compiles, before the first call, the kernels a session's first calls run: a prompt
 * step of n_prompt tokens (0 or more than n_batch: n_batch; 1: a one-token prompt, which runs
 * the generation step's kernels) and a generation step; for a model that only embeds, classifies
 * or reranks, a batch of n_prompt tokens of that. Another prompt length may run other kernels,
 * compiled when first used. Drivers compile a kernel when it is first created (most GPU drivers) or
 * first dispatched (lavapipe: LLVM, one kernel at a time, up to seconds each while Mesa's shader
 * cache, ~/.cache/mesa_shader_cache or MESA_SHADER_CACHE_DIR, is cold); without this, the first
 * prompt waits for them. Each kernel is created and dispatched once with no work; `progress`
 * (optional) is called before each with (done, total, its name) and once at the end with
 * (total, total, NULL). Kernels already prewarmed on the model (by any of its sessions) are not
 * counted: a second call reports total 0. FORGE_ERR_INVALID_ARGUMENT for n_prompt < 0. Apps can run it at install time, where the driver keeps
 * a disk cache (Mesa's, NVIDIA's), so a user's first run starts warm. Takes a parallel slot;
 * returns FORGE_ERR_DEVICE (message on the session) if the driver fails. */
typedef void (*forge_prewarm_fn)(void *user_data, int done, int total, const char *kernel);
FORGE_API forge_status forge_session_prewarm(forge_session *session, int n_prompt, forge_prewarm_fn progress, void *user_data);

/* Forgets all but the first n_keep tokens of the cached sequence (0 = reset). A model with
 * linear-attention layers (Qwen 3.5), whose recurrent state cannot go back to an earlier position,
 * evaluates the n_keep tokens again (a prefill; takes a parallel slot), from the session's
 * checkpoint when it lies within them, else from the start. The checkpoint is the recurrent
 * state after the first tokens of the last generation's prompt: up to where forge_chat's reply
 * opens (so a chat's next turn, whose template renders the last reply anew, prefills from there),
 * for other prompts all but the last token. Its prompt cache likewise serves a prompt that extends
 * the whole cached sequence, restarts one that shares the checkpoint's tokens there, and
 * evaluates any other from the start. */
FORGE_API forge_status forge_session_truncate(forge_session *session, int n_keep);

FORGE_API forge_status forge_session_memory(const forge_session *session, forge_memory_stats *stats);

/* The tokens the session's cache holds (forge_session_n_past of them, the prompt cache's
 * sequence) into tokens[0..capacity); *n_tokens gets their number. FORGE_ERR_BUFFER_TOO_SMALL
 * (with *n_tokens set) when capacity is smaller. */
FORGE_API forge_status forge_session_tokens(const forge_session *session, int32_t *tokens, size_t capacity, size_t *n_tokens);

/* State files (go-mlx's state bundles). forge_session_save writes the session's state to
 * `path`: the tokens its cache holds and, for every layer, the keys and values that continuing
 * reads (every position of full-attention layers; what the rotating cache of a sliding-window
 * layer holds), as a safetensors file whose __metadata__ names the format ("forge-state"), its
 * version, the model (a fingerprint of its config, tensor headers and weight bytes, and of the
 * adapter if one is loaded), n_past and the cache layout. Keys and values are in the session's
 * KV type (F32, or F16 for an f16 cache). A linear-attention layer (Qwen 3.5) holds its
 * recurrent state instead, in F32 whatever n_past: the convolution's last inputs
 * [conv_kernel - 1, conv_dim] and the delta rule's [value heads, key dim, value dim]. Size: 4
 * n_past bytes plus 8 kv_heads head_dim bytes (4 for f16) per attention layer and position held,
 * plus the recurrent states. The file is written to
 * `path`.tmp-XXXXXX (mode 0600) in the same directory, synced and renamed over `path`: a failed
 * or interrupted save leaves `path` as it was and no partial file. The cache is read back a
 * layer at a time through a staging buffer of at most 16 MiB.
 *
 * forge_session_load replaces the state of `session` (fresh or used, with its own n_ctx, n_batch
 * and KV type: an f32 file's keys and values round to nearest f16 into an f16 session, an f16
 * file's widen exactly into an f32 one) with the file's: forge_session_n_past and the prompt
 * cache are the saved ones, and evaluating or generating from there gives the logits the
 * saving session would give (bit for bit on the same device and KV type; with another n_batch a long prompt is cut into other prefill steps,
 * which round differently). Errors, with the message naming the file and the cause:
 * FORGE_ERR_IO (missing, unreadable), FORGE_ERR_FORMAT (not a state file, truncated, a
 * malformed header, a missing tensor or one of the wrong dtype or shape, a token outside the
 * vocabulary), FORGE_ERR_UNSUPPORTED (a newer format version), FORGE_ERR_MODEL (saved from
 * another model or with another adapter: both fingerprints are named), FORGE_ERR_LIMIT (more
 * tokens than this session's n_ctx: both numbers). The file is checked whole before the
 * session is touched, so after those errors the session is unchanged; a device error while the
 * cache is being written leaves it empty (n_past 0). Both calls take a parallel slot
 * (forge_model_params.parallel_slots). */
FORGE_API forge_status forge_session_save(forge_session *session, const char *path);
FORGE_API forge_status forge_session_load(forge_session *session, const char *path);

/* Attention-K inspection (go-mlx's AttentionInspector): the keys one layer's KV cache holds,
 * after RoPE, for the positions it still holds of the session's sequence. */
typedef struct forge_keys_info {
    uint32_t struct_size;  /* set by the caller: sizeof(forge_keys_info) */
    int n_layers;     /* the model's layers */
    int n_kv_heads;   /* KV heads (fewer than query heads under GQA) */
    int head_dim;
    int window;       /* the layer's sliding window, 0 for full attention */
    int first;        /* the position of row 0 */
    int n_rows;       /* positions first .. first + n_rows - 1 (= n_past - 1): all n_past of a
                       * full-attention layer, what the rotating cache of a sliding-window layer
                       * still holds (at least min(n_past, window - 1) of the latest; more while
                       * the ring has not wrapped) */
    size_t n_floats;  /* n_kv_heads * n_rows * head_dim: what `out` needs */
} forge_keys_info;

/* Copies the keys of `layer` (0 .. n_layers - 1) into out[n_kv_heads][n_rows][head_dim]
 * (capacity floats): per KV head one contiguous [n_rows, head_dim] block, rows in position
 * order from info->first. With out NULL only *info is filled (the size query). The keys are
 * those attention reads: after k_norm and RoPE, in HF's rotate-half order (a GGUF `llama`
 * checkpoint's adjacent pairs are put back), so for a safetensors checkpoint they equal
 * transformers' past_key_values keys (a partial RoPE's dims too). Errors: FORGE_ERR_INVALID_ARGUMENT
 * (no info, a layer out of range, a linear-attention layer, which keeps no keys: the message names
 * it), FORGE_ERR_BUFFER_TOO_SMALL (*info still filled). An
 * empty session gives n_rows 0. Reads the cache back through a staging buffer (as
 * forge_session_save does); takes a parallel slot when it reads. */
FORGE_API forge_status forge_session_keys(forge_session *session, int layer, float *out, size_t capacity, forge_keys_info *info);

/* With forge_session_params.profile: device time per kernel since the session was created, as
 * JSON {"kernel": {"calls": N, "ms": T}, ...}, and per matrix product shape {"kernel NxK" (the
 * weight's rows and columns: a fused gate|up product counts both halves; a mixture of experts'
 * product, one expert's), {"calls", "ms", "rows" (the rows of activations multiplied, summed
 * over the calls), "gb_s" (the weights' bytes read per second: an expert product reads one
 * expert per chosen (token, expert) pair in decode, every expert with tokens in prefill),
 * "tflop_s" (2 N K rows per second, in 1e12)}, ...}; a product that ran on the host (CPU
 * devices: its time and its submission's) as "host kernel" and "host kernel NxK", into `out` (capacity
 * bytes, NUL-terminated); *len gets the length. FORGE_ERR_BUFFER_TOO_SMALL when it does not
 * fit. Empty ("{}") when the device has no timestamps or profiling is off. */
FORGE_API forge_status forge_session_profile(const forge_session *session, char *out, size_t capacity, size_t *len);

/* eval flags */
#define FORGE_EVAL_ALL_LOGITS 1u   /* return logits for every evaluated position, not only the last */

/* Appends `n_tokens` token ids to the session's sequence and runs the model over them.
 * Writes the logits of the last position (n_vocab floats), or with FORGE_EVAL_ALL_LOGITS of
 * every position (n_tokens * n_vocab floats, row-major), to `logits` (may be NULL to only
 * fill the cache). `logits_capacity` is in floats. Fails with FORGE_ERR_LIMIT when
 * n_past + n_tokens exceeds the session's n_ctx (with a sliding overflow policy: slides first,
 * and fails only when n_tokens > n_ctx - n_keep), FORGE_ERR_INVALID_ARGUMENT on a token id
 * outside the vocabulary, FORGE_ERR_BUFFER_TOO_SMALL when logits_capacity is too small. */
FORGE_API forge_status forge_eval(forge_session *session, const int32_t *tokens, int n_tokens,
                                  uint32_t flags, float *logits, size_t logits_capacity);

/* ---------------------------------------------------------------------------------------
 * Tokenizer (model-level; the model's tokenizer is immutable, these are thread-safe)
 *
 * forge runs what the model's tokenizer.json declares (normalizer, pre-tokenizer, BPE model,
 * post-processor, decoder, added tokens), or the vocabulary in a GGUF (tokenizer.ggml.*),
 * and gives HuggingFace tokenizers' ids. A tokenizer.json component forge does not implement
 * fails the load with FORGE_ERR_UNSUPPORTED naming it.
 *
 * Text is UTF-8. Invalid UTF-8 is not an error: every maximal invalid byte sequence is read
 * as one U+FFFD (what Rust's String::from_utf8_lossy, and so HF on the same bytes made into
 * a string, does). Detokenized text is always valid UTF-8 (bytes that do not form
 * characters come out as U+FFFD).
 *
 * Every call below fails with FORGE_ERR_INVALID_ARGUMENT on a NULL or failed model, or one
 * without a tokenizer (message on the model).
 * ------------------------------------------------------------------------------------- */

/* forge_tokenize flags. With none, the result is HF encode(text, add_special_tokens=False):
 * special-token text in the input ("<|eot_id|>") becomes its id, nothing is added. */
#define FORGE_TOKENIZE_ADD_SPECIAL 1u      /* add what the post-processor declares (BOS, ...) */
#define FORGE_TOKENIZE_NO_PARSE_SPECIAL 2u /* special-token text is ordinary text (HF
                                            * encode_special_tokens; non-special added tokens
                                            * are still matched) */

/* Tokenizes text[0..len) (need not be NUL-terminated; may be NULL when len is 0). Writes
 * the ids to ids[0..capacity) and their number to *n_ids. When capacity is too small, writes
 * nothing, sets *n_ids to the number needed and returns FORGE_ERR_BUFFER_TOO_SMALL.
 * Scratch memory is allocated per call and freed before it returns. FORGE_ERR_LIMIT for
 * text over 1 GiB. */
FORGE_API forge_status forge_tokenize(const forge_model *model, const char *text, size_t len, uint32_t flags,
                                      int32_t *ids, size_t capacity, size_t *n_ids);

/* forge_detokenize flags. With none: HF decode(ids, skip_special_tokens=False). */
#define FORGE_DETOKENIZE_SKIP_SPECIAL 1u   /* leave out special tokens (bos, eos, ...) */

/* Decodes ids to UTF-8 text as the tokenizer's decoder says. Writes the text and a NUL to
 * text[0..capacity) and its length (without the NUL) to *n_bytes. When capacity < length + 1,
 * sets *n_bytes to the length and returns FORGE_ERR_BUFFER_TOO_SMALL. An id outside the
 * vocabulary gives FORGE_ERR_INVALID_ARGUMENT. */
FORGE_API forge_status forge_detokenize(const forge_model *model, const int32_t *ids, size_t n_ids, uint32_t flags,
                                        char *text, size_t capacity, size_t *n_bytes);

/* Streaming detokenizer, for token-by-token output. The caller owns the state (no
 * allocation); one state per stream. Each call emits only complete UTF-8: a token that ends
 * inside a character is held until the character is complete (or until 16 tokens are held,
 * then U+FFFD). The concatenated output of next() calls and a final flush() equals
 * forge_detokenize of all the ids, except where a byte token turns bytes already emitted as
 * valid text into an invalid sequence (which ByteFallback decodes as U+FFFD per byte): the
 * stream's output stays valid UTF-8 but is not then that text. */
#define FORGE_DETOK_STREAM_WINDOW 16
typedef struct forge_detok_stream {
    uint32_t struct_size;          /* set by forge_detok_stream_init */
    uint32_t flags;                /* FORGE_DETOKENIZE_* */
    int32_t n_ids, n_read;         /* internal */
    uint32_t read_bytes;           /* internal */
    int32_t ids[FORGE_DETOK_STREAM_WINDOW]; /* internal */
} forge_detok_stream;

/* Starts (or restarts) a stream; flags as forge_detokenize's. */
FORGE_API void forge_detok_stream_init(forge_detok_stream *stream, uint32_t flags);

/* Feeds one token; writes the text it completes (possibly "") and a NUL to text[0..capacity),
 * its length to *n_bytes. FORGE_ERR_BUFFER_TOO_SMALL (with the length needed in *n_bytes)
 * leaves the stream as it was, so the call can be repeated with a bigger buffer. */
FORGE_API forge_status forge_detok_stream_next(const forge_model *model, forge_detok_stream *stream, int32_t token,
                                               char *text, size_t capacity, size_t *n_bytes);

/* Ends a stream: writes what is still held (incomplete characters as U+FFFD) like next(),
 * then restarts the stream. */
FORGE_API forge_status forge_detok_stream_flush(const forge_model *model, forge_detok_stream *stream, char *text,
                                                size_t capacity, size_t *n_bytes);

/* The vocabulary entry of `token` as stored ("Ġthe", "▁the", "<0x0A>", "<|eot_id|>"), or NULL
 * when out of range or the model has no vocabulary. Valid for the model's lifetime. */
FORGE_API const char *forge_token_piece(const forge_model *model, int32_t token);

/* The id of a vocabulary entry or added token (exact text), or -1. */
FORGE_API int32_t forge_token_id(const forge_model *model, const char *piece);

/* 1 when `token` is a special token (tokenizer.json "special": true; GGUF control or
 * unknown tokens), else 0. */
FORGE_API int forge_token_is_special(const forge_model *model, int32_t token);

typedef struct forge_special_tokens {
    uint32_t struct_size; /* set by the caller: sizeof(forge_special_tokens) */
    int32_t bos;          /* -1 when the model has none */
    int32_t eos;
    int32_t eot;          /* end of turn: <|eot_id|>, <|im_end|>, <end_of_turn>; -1 if none */
    int32_t pad;
    int32_t unk;
    int32_t n_eos;        /* number of ids in eos_ids */
    int32_t eos_ids[8];   /* every id that ends generation (eos, eot, generation_config's others) */
    int32_t sot;          /* start of turn: <|start_header_id|>, <|im_start|>, <start_of_turn>; -1 if none */
} forge_special_tokens;

/* The special ids of the model's tokenizer: from tokenizer_config.json / generation_config.json
 * / the post-processor (tokenizer.json) or tokenizer.ggml.*_token_id (GGUF); eot and sot by
 * the chat formats' marker texts when the files do not name them. */
FORGE_API forge_status forge_model_special_tokens(const forge_model *model, forge_special_tokens *out);

/* ---------------------------------------------------------------------------------------
 * Generation
 *
 * Sampling, in this order (HuggingFace's): repeat penalty over the last repeat_window tokens
 * of the session (positive logits divided by the penalty, negative ones multiplied), then
 * temperature, top-k, top-p (nucleus), min-p (relative to the most likely token), then a
 * draw from the seeded generator. temperature 0 is greedy (argmax; ties go to the lower id).
 * The reduction runs on the device: per token the host reads back the best 256 candidates
 * and the softmax normalizer (a greedy step: the best token alone), not the vocabulary; only when a filter's cut falls beyond those
 * candidates (top_k > 256, or top-p / min-p / a plain temperature draw reaching into the
 * tail) does it read the whole row for that token.
 * ------------------------------------------------------------------------------------- */

/* Why a generate or chat call stopped. */
typedef enum forge_stop_reason {
    FORGE_STOP_NONE = 0,
    FORGE_STOP_EOS = 1,          /* the model produced one of its end tokens (forge_special_tokens.eos_ids) */
    FORGE_STOP_TOKEN = 2,        /* one of the caller's stop_tokens */
    FORGE_STOP_STRING = 3,       /* one of the caller's stop_strings appeared in the text */
    FORGE_STOP_MAX_TOKENS = 4,
    FORGE_STOP_CALLBACK = 5,     /* the callback returned non-zero */
    FORGE_STOP_CONTEXT = 6,      /* the session's context is full (FORGE_OVERFLOW_FAIL) */
    FORGE_STOP_CANCELLED = 7,    /* the caller's cancel flag was set (forge_generate_params.cancel) */
    FORGE_STOP_CONSTRAINT = 8    /* the constraint allows nothing more: matched whole with nothing that may
                                  * follow (forge_metrics.constraint_complete 1), or no token of the
                                  * vocabulary continues it (0) */
} forge_stop_reason;

/* Called once per generated token, in order. `text` is the text this token makes printable:
 * complete UTF-8 only (bytes of a character split across tokens wait for the next call), with
 * text that could begin a stop string held back until it is known not to (so it may be
 * empty). The text continues the prompt's (a word's leading space after the prompt is kept).
 * When generation ends for another reason, one last call with token -1 delivers what was held
 * back (its return value is not read). `text` is never NULL and is valid during the call only.
 * Return 0 to continue, non-zero to stop (as every forge callback): the stop takes effect
 * before the next token, leaves the session usable, and the stop reason is
 * FORGE_STOP_CALLBACK. */
typedef int (*forge_token_fn)(void *user_data, int32_t token, const char *text, size_t text_len);

/* ---------------------------------------------------------------------------------------
 * Constraints: structured output
 *
 * A constraint limits what generate, chat, batch items and classify may produce to the text a
 * grammar matches: a GBNF grammar (llama.cpp's format, starting at rule `root`), a JSON Schema,
 * any JSON object, or one of a list of strings. forge compiles it once per call into a byte
 * automaton and, at each token, allows exactly the tokens whose bytes the automaton can take
 * next (special tokens only where the grammar names them, as llama.cpp's <[ID]> or <TEXT>; the
 * end tokens only where the grammar may end):
 *   - sampling: the allowed tokens' distribution, renormalized, then the usual filters and draw
 *     (llama.cpp's order: the grammar first). Greedy takes the highest-logit allowed token.
 *     generate and chat: the automaton state's mask (computed once per state) is written
 *     before each step and applied to the logits on the device ahead of the sampler's
 *     reduction, so greedy costs what unconstrained greedy does; batch items check the
 *     device's 256 candidates first. The whole mask and logits row are read on the host only
 *     when the candidates cannot decide the draw.
 *   - forced text: where the grammar allows one byte at a time (a property name, "}"), the
 *     text up to where it branches is written as the tokenizer's own tokens of it (all but the
 *     last, which could merge with what follows) without sampling, evaluated together in one
 *     step; sample_forced = 1 samples them instead.
 *   - the end: when the grammar is matched and nothing may follow, the call stops
 *     (FORGE_STOP_CONSTRAINT); where it may end or go on, the model's end token is allowed.
 *     max_tokens, a full context, stop strings, the callback and cancel still stop it, which
 *     leaves a prefix of a match (forge_metrics.constraint_complete 0; 1 where the text is a
 *     whole match the grammar could continue; a token that both completes a match nothing may
 *     follow and reaches max_tokens stops as FORGE_STOP_CONSTRAINT). The output never leaves
 *     the grammar.
 *   - a trigger makes the constraint lazy: text is free until the trigger string appears in
 *     it (Qwen 3's "</think>", a tool-call opener); the text after it (up to 16 whitespace
 *     bytes first) must match the grammar, and once matched the text is free again until the
 *     next trigger. A reasoning model's thinking stays free: forge_chat and forge_chat_tools
 *     start a constraint without a trigger after a thinking reply's thinking, and count a
 *     trigger of its own (a tool-call opener) only after it.
 * docs/features.md lists the JSON Schema keywords forge enforces; any other validation keyword
 * is FORGE_ERR_UNSUPPORTED naming it (never silently ignored). A grammar error names the line,
 * column and rule; left recursion is refused; hostile grammars meet limits (FORGE_ERR_LIMIT).
 * ------------------------------------------------------------------------------------- */

typedef enum forge_constraint_kind {
    FORGE_CONSTRAINT_NONE = 0,        /* no constraint */
    FORGE_CONSTRAINT_GBNF = 1,        /* text: a GBNF grammar (llama.cpp's format), from its rule "root" */
    FORGE_CONSTRAINT_JSON_SCHEMA = 2, /* text: a JSON Schema (the enforced subset: docs/features.md) */
    FORGE_CONSTRAINT_JSON_OBJECT = 3, /* any JSON object (text unused) */
    FORGE_CONSTRAINT_CHOICES = 4      /* exactly one of choices[0 .. n_choices) */
} forge_constraint_kind;

typedef struct forge_constraint {
    uint32_t struct_size;             /* sizeof(forge_constraint) */
    forge_constraint_kind kind;
    const char *text;                 /* the grammar or the schema, UTF-8 */
    size_t text_len;                  /* its length; 0: up to its NUL */
    const char *const *choices;       /* FORGE_CONSTRAINT_CHOICES: the strings (UTF-8) */
    int n_choices;
    const char *trigger;              /* NULL: the constraint holds from the first byte; else it starts after this text */
    int sample_forced;                /* 1: sample the text the grammar forces too (default 0: written without sampling) */
} forge_constraint;

/* A compiled constraint bound to a model's vocabulary, for callers who sample themselves (and
 * forge bench-grammar): which tokens may come next. Like a session, one thread at a time. */
typedef struct forge_grammar forge_grammar;

/* forge_grammar_status bits */
#define FORGE_GRAMMAR_COMPLETE 1u /* the text so far is a whole match (the end token is allowed) */
#define FORGE_GRAMMAR_DONE 2u     /* ... and nothing may follow */
#define FORGE_GRAMMAR_DEAD 4u     /* no byte can continue it and it is not matched (a token was forced in) */
#define FORGE_GRAMMAR_IN_SPAN 8u  /* inside the constrained text (always, without a trigger) */

/* Compiles `constraint` for `model` (a vocab_only model is enough): the model's end tokens end
 * it. On failure *out is NULL and the message (naming the rule, keyword or limit) is on the model. */
FORGE_API forge_status forge_grammar_create(const forge_model *model, const forge_constraint *constraint, forge_grammar **out);
FORGE_API void forge_grammar_free(forge_grammar *grammar);
FORGE_API const char *forge_grammar_errmsg(const forge_grammar *grammar);
/* 1 when `token` may come next, else 0. */
FORGE_API int forge_grammar_allows(forge_grammar *grammar, int32_t token);
/* Every token that may come next as bits (token t: bit t % 32 of mask[t / 32]); n_words at least
 * (n_vocab + 31) / 32. FORGE_ERR_LIMIT when the grammar's automaton passes its bounds. */
FORGE_API forge_status forge_grammar_mask(forge_grammar *grammar, uint32_t *mask, size_t n_words);
/* Takes `token` (FORGE_ERR_INVALID_ARGUMENT when it is not allowed). */
FORGE_API forge_status forge_grammar_accept(forge_grammar *grammar, int32_t token);
/* FORGE_GRAMMAR_* bits of where the text stands. */
FORGE_API uint32_t forge_grammar_status(const forge_grammar *grammar);
/* Host time spent in this grammar so far (compiling, checks, masks), in milliseconds. */
FORGE_API double forge_grammar_time_ms(const forge_grammar *grammar);

/* The GBNF forge compiles a JSON Schema into (rule root), into out (capacity bytes, NUL-terminated;
 * *len = its length; FORGE_ERR_BUFFER_TOO_SMALL with *len when it does not fit). Errors
 * (FORGE_ERR_UNSUPPORTED naming a keyword forge does not enforce, ...) write errmsg when not NULL. */
FORGE_API forge_status forge_json_schema_to_gbnf(const char *schema, size_t schema_len, char *out, size_t capacity, size_t *len,
                                                 char *errmsg, size_t errmsg_size);

typedef struct forge_generate_params {
    uint32_t struct_size;
    int max_tokens;                   /* default 256; 0: evaluate the prompt only, generate nothing */
    float temperature;                /* default 0: greedy */
    int top_k;                        /* 0: off */
    float top_p;                      /* 1: off */
    float min_p;                      /* 0: off */
    float repeat_penalty;             /* 1: off */
    int repeat_window;                /* tokens looked back for the penalty; default 64, at most 1024 */
    uint64_t seed;                    /* same seed, same device, same model: same output */
    const int32_t *stop_tokens;       /* extra ids that end generation (not emitted) */
    int n_stop_tokens;
    const char *const *stop_strings;  /* text that ends generation (matched across tokens, not emitted) */
    int n_stop_strings;
    int ignore_eos;                   /* 1: do not stop at the model's end tokens */
    int add_special;                  /* text prompts: add the tokens the tokenizer declares (BOS); default 1 */
    forge_token_fn on_token;          /* optional */
    void *user_data;
    /* Optional: a flag another thread may set (non-zero) to stop this call, read atomically
     * before every prefill chunk (n_batch tokens) and every decode step. The call then returns
     * FORGE_OK with FORGE_STOP_CANCELLED; the session keeps what was evaluated (n_past counts
     * it, and a later prompt with the same prefix reuses it) and stays usable. The caller owns
     * the flag and clears it before reusing it. */
    const int *cancel;
    const forge_constraint *constraint; /* optional: what the output must match (see Constraints); NULL: free text */
    /* Prompt lookup (speculative decoding without a second model): 0 off (default); N in 1..15
     * drafts up to N tokens a step from the sequence itself (what followed the latest earlier
     * occurrence of its last 3, 2 or 1 tokens) and verifies them with the drawn token in one
     * pass. Each position's token is drawn from that pass's logits with this call's sampling
     * rules and seed, and a draft is kept only while it equals the draw, so the output is
     * distributed as without lookup (greedy: the same tokens, up to the rounding differences
     * between a one-token and a several-token pass: on a GPU the one-token pass chains int8
     * products that a several-token pass does not, so near-ties can go the other way). After a
     * draft that keeps nothing, drafting pauses 1, 3, 7 .. 15 steps (a rejected draft costs a
     * wider pass for one token); the next kept draft ends the pauses. Pays where the output
     * repeats the input (editing, extraction, code); metrics.draft_tokens / draft_accepted say
     * how it went.
     * Ignored with a constraint (its forced text is already evaluated several tokens a step),
     * on models with linear-attention layers (their recurrent state cannot be cut back to
     * drop rejected drafts) and by forge_batch_generate. */
    int lookup;
    /* Speculative decoding with a draft model (NULL: off): a session of a smaller model with
     * the same vocabulary (a Llama-3.2-1B beside a Llama-3.1-8B). Each step the draft model
     * writes up to `lookup` tokens greedily (4 when lookup is 0) after the sequence, in place
     * of prompt lookup's, and they are verified as those are: the output is distributed as
     * without a draft (greedy: the same tokens, with lookup's rounding caveat; its pauses too). The call brings the draft session's cache to
     * the sequence (reusing the prefix it holds, so a chat's next turn drafts at once) and
     * leaves it holding a prefix of the result; drafting pauses where the draft's context is
     * full. Use the draft session for nothing else during the call. FORGE_ERR_INVALID_ARGUMENT
     * when it is this session or its vocabulary's size differs; FORGE_ERR_UNSUPPORTED on models
     * with linear-attention layers (either). Ignored with a constraint and by
     * forge_batch_generate, as lookup is. */
    forge_session *draft;
} forge_generate_params;

FORGE_API forge_generate_params forge_generate_default_params(void);

/* Per-call numbers; also kept on the session for forge_session_metrics. */
typedef struct forge_metrics {
    uint32_t struct_size;             /* set by the caller: sizeof(forge_metrics) */
    int prompt_tokens;                /* tokens of the prompt (after the chat template) */
    int cached_tokens;                /* of which reused from the session's cache (exact prefix) */
    int generated_tokens;
    int cache_wrapped;                /* 1: a cached prefix was not reusable because sliding-window layers had overwritten it */
    double ttft_ms;                   /* call start to the first generated token */
    double prefill_ms, decode_ms;
    double prefill_tok_s;             /* prompt tokens evaluated (not cached) per second */
    double decode_tok_s;              /* generated tokens after the first, per second of decoding */
    uint64_t peak_device_bytes;       /* device memory peak of the model and its sessions */
    uint64_t prompt_cache_hits;       /* calls on this session that reused a cached prefix (cumulative) */
    forge_stop_reason stop_reason;
    int context_slides;               /* times this call slid a full context (forge_overflow) */
    int constraint_complete;          /* with a constraint: 1 when the output matches it whole (or ended outside a triggered span) */
    int forced_tokens;                /* generated tokens the constraint forced (written, not sampled) */
    int constraint_masks;             /* draws the device's candidates could not decide: the whole row was read on the host */
    double constraint_ms;             /* host time spent on the constraint: compiling, checks, masks, forced text */
    int draft_tokens;                 /* prompt lookup (forge_generate_params.lookup): tokens drafted and verified */
    int draft_accepted;               /* of which kept (generated without a step of their own) */
} forge_metrics;

/* Generates from a token prompt. The session's cache keeps what it holds of an exact prefix of
 * `prompt` (only the rest is evaluated) and afterwards holds the prompt and the generated
 * tokens (except the last). `metrics` may be NULL. Fails with FORGE_ERR_LIMIT when the prompt
 * does not fit the context (the message states both numbers). */
FORGE_API forge_status forge_generate_tokens(forge_session *session, const int32_t *prompt, int n_prompt,
                                             const forge_generate_params *params, forge_metrics *metrics);

/* Generates from UTF-8 text, tokenized with the model's tokenizer (add_special adds BOS as the
 * tokenizer declares). Text reaches the caller through params->on_token. */
FORGE_API forge_status forge_generate(forge_session *session, const char *prompt, size_t prompt_len,
                                      const forge_generate_params *params, forge_metrics *metrics);

/* Evaluates tokens into the cache without generating, so that a later call sharing this
 * prefix prefills only the rest (the prompt cache's explicit warm-up). */
FORGE_API forge_status forge_warm(forge_session *session, const int32_t *tokens, int n_tokens);

/* The metrics of the session's last generate/chat call. */
FORGE_API forge_status forge_session_metrics(const forge_session *session, forge_metrics *metrics);

/* ---------------------------------------------------------------------------------------
 * Batch generation
 *
 * Several prompts generated together on one session made with n_seq_max > 1: each sequence
 * has its own region of the KV cache (n_ctx tokens) and position, and the decode steps run in
 * lockstep, the current token of every live sequence going through each weight matrix as one
 * product (attention stays per sequence). Each item has its own forge_generate_params (sampling,
 * seed, stop tokens and strings, max_tokens, callback and user_data, cancel flag), its own stop
 * reason and metrics; a finished sequence drops out of the step and its place takes the next
 * item, so any number of items run through n_seq_max places (a new item's prompt is prefilled
 * alone, at most n_batch and 512 tokens a step, while the others wait). An item's output
 * equals what forge_generate gives for it alone on a fresh session (same tokens, same callback
 * calls, same seeded draws), save for float rounding that differs between the batched and the
 * one-row products (on devices where it does, a near tie can go the other way).
 * Sampling follows forge_generate: each row's candidates and normalizer come from the device
 * (at the item's own temperature) and the host draws; in a step where some live item has a
 * repeat penalty, every row's logits are read back instead and the penalty (over the item's own
 * prompt and tokens) is applied on the host.
 * The session's cache is scratch: afterwards it holds no tokens (as after forge_classify).
 * ------------------------------------------------------------------------------------- */

typedef struct forge_batch_item {
    uint32_t struct_size;                /* sizeof(forge_batch_item); items[0]'s is every item's */
    const char *text;                    /* UTF-8 prompt (tokenized as forge_generate does), or NULL: */
    size_t text_len;
    const int32_t *tokens;               /* token ids when text is NULL */
    int n_tokens;
    const forge_generate_params *params; /* NULL: forge_generate_default_params(). on_token is called with
                                          * params->user_data for this item's tokens only (tell items apart
                                          * by user_data); its non-zero return stops this item alone */
} forge_batch_item;

typedef struct forge_batch_result {
    uint32_t struct_size;                /* sizeof(forge_batch_result), set by the caller in results[0] */
    forge_status status;                 /* this item's: FORGE_ERR_LIMIT for a prompt over n_ctx,
                                          * FORGE_ERR_INVALID_ARGUMENT for an empty prompt, a token outside
                                          * the vocabulary or params out of range (the others still run) */
    forge_metrics metrics;               /* as forge_generate's; ttft_ms from when the item got its place.
                                          * The last field: forge_batch_result grows only through it. */
} forge_batch_result;

/* Generates for items[0 .. n_items), results into results[0 .. n_items). Items start in order as
 * places free up. Returns FORGE_OK when every item ran or failed on its own (see
 * forge_batch_result.status; the session's errmsg holds the last item's message); another status
 * (a device failure) stops the whole call, with the message on the session.
 * FORGE_ERR_UNSUPPORTED on a model whose head_dim is not a multiple of 4. */
FORGE_API forge_status forge_batch_generate(forge_session *session, const forge_batch_item *items, int n_items,
                                            forge_batch_result *results);

/* ---------------------------------------------------------------------------------------
 * Chat
 *
 * A conversation is rendered with the model family's native template, written in C to give
 * exactly what the checkpoint's own Jinja chat_template renders (checked against
 * transformers): Llama 3 headers (3.1 / 3.2 / 3.3: the system block with the knowledge cutoff
 * and "Today Date", today's local date where the template calls strftime_now, else the date
 * the template sets; a "tool" message becomes the ipython turn; 3.1+: tools and tool calls,
 * below), ChatML for Qwen 2 / 3 / 3.5 / 3.6 (with Qwen 3's and 3.5's thinking switch;
 * Qwen 3.5 trims every message and refuses what its template refuses), Mistral's [INST] turns
 * (7B Instruct v0.1 / v0.2 / v0.3 and Nemo, each template's spaces and system message; v0.3's
 * and Nemo's tools, tool calls and tool results, below), Gemma turns
 * (Gemma 3 folds a system message into the first user turn; Gemma 2's template rejects one),
 * Gemma 4's <|turn> turns (a system turn; the thinking switch; the 12B / 26B /
 * 31B template's empty thought block when thinking is off; tools, calls and results, below).
 * The family is recognised from the tokenizer's special tokens and the checkpoint's
 * chat_template (tokenizer_config.json, chat_template.jinja, or tokenizer.chat_template in
 * GGUF); Mistral's from the template alone.
 * ------------------------------------------------------------------------------------- */

/* A function call an assistant message made (tools, below). */
typedef struct forge_tool_call {
    uint32_t struct_size;  /* sizeof(forge_tool_call); tool_calls[0]'s is every call's */
    const char *name;      /* the function's name */
    const char *arguments; /* its arguments: a JSON object as text (NULL: {}), written as the template writes the dict */
    const char *id;        /* the call's id (NULL: none); Mistral v0.3 / Nemo need one of 9 characters, as
                            * forge_chat_reply.tool_ids gives them */
} forge_tool_call;

typedef struct forge_chat_message {
    uint32_t struct_size;  /* sizeof(forge_chat_message); messages[0]'s is every message's */
    const char *role;      /* "system", "user", "assistant" (Qwen, Llama 3.1+, Mistral v0.3 / Nemo, Gemma 4: also
                            * "tool", a call's result; Gemma 4: also "developer") */
    const char *content;   /* UTF-8 */
    const forge_tool_call *tool_calls; /* an assistant message's tool calls (Llama 3.1+: one; Qwen 3, Qwen 3.5,
                                        * Mistral, Gemma 4), or NULL */
    int n_tool_calls;
    const char *tool_call_id; /* a "tool" message's: the id of the call it answers (Mistral v0.3 / Nemo: required,
                               * 9 characters), or NULL */
} forge_chat_message;

/* A function the model may call: rendered into the prompt as the family's template renders the
 * transformers tools list [{"type": "function", "function": {"name", "description",
 * "parameters"}}] (description and parameters left out when NULL). Gemma 4's template writes a
 * schema in its own notation; a "type" or "description" forge cannot write as it does (an object
 * there) is FORGE_ERR_UNSUPPORTED naming it. */
typedef struct forge_tool {
    uint32_t struct_size;     /* sizeof(forge_tool); tools[0]'s is every tool's */
    const char *name;
    const char *description;  /* NULL: none */
    const char *parameters;   /* the arguments' JSON Schema as JSON text (object); NULL: none */
} forge_tool;

/* chat flags */
#define FORGE_CHAT_NO_GENERATION_PROMPT 1u  /* do not append the assistant's opening (add_generation_prompt=False) */
#define FORGE_CHAT_THINKING_OFF 2u          /* enable_thinking=False (Qwen 3's and Qwen 3.5 4B+'s default is on) */
#define FORGE_CHAT_THINKING_ON 4u           /* enable_thinking=True (Gemma 4's and Qwen3.5-0.8B / 2B's default is off) */
#define FORGE_CHAT_TOOL_ARGUMENTS 8u        /* forge_chat_tools: a tool call the model opens matches a tool's name and
                                             * its parameters' JSON Schema (a constraint from the call's opener on) */
#define FORGE_CHAT_TOOL_REQUIRED 16u        /* forge_chat_tools: the reply is tool calls only (constrained from its start,
                                             * after the thinking of a thinking reply) */

/* Renders `messages` as the model's chat template does, into `out` (capacity bytes,
 * NUL-terminated), the length to *len; FORGE_ERR_BUFFER_TOO_SMALL with *len = bytes needed.
 * FORGE_ERR_UNSUPPORTED when the model has no known chat format, FORGE_ERR_INVALID_ARGUMENT
 * when the template rejects the conversation (the message says why, as the template does). */
FORGE_API forge_status forge_chat_render(const forge_model *model, const forge_chat_message *messages, int n_messages,
                                         uint32_t flags, char *out, size_t capacity, size_t *len);

/* Renders the conversation, tokenizes it (special-token text recognised, nothing added: the
 * template writes BOS itself) and generates the assistant's reply as forge_generate_tokens does;
 * the prompt cache makes a multi-turn chat prefill only the new turn. The family's end-of-turn
 * token ends the reply. The tool flags are FORGE_ERR_INVALID_ARGUMENT here (forge_chat_tools). */
FORGE_API forge_status forge_chat(forge_session *session, const forge_chat_message *messages, int n_messages, uint32_t flags,
                                  const forge_generate_params *params, forge_metrics *metrics);

/* forge_chat_render with tool definitions, as the template renders apply_chat_template(...,
 * tools=...): Llama 3.1 / 3.2 / 3.3 (the tools in the first user message, as its default
 * tools_in_user_message; one tool call a message), Qwen 3 (a # Tools system block, calls as
 * <tool_call> JSON), Qwen 3.5 / 3.6 (a # Tools system block, calls as <tool_call><function=NAME>
 * <parameter=P> blocks), Mistral v0.3 / Nemo ([AVAILABLE_TOOLS] before the last user message,
 * calls as [TOOL_CALLS] [{"name", "arguments", "id"}], results as [TOOL_RESULTS] with their
 * call_id; a call or a result without a 9-character id is the template's error), Gemma 4 (each
 * tool's <|tool>declaration:...<tool|> in the system turn in its own notation of the schema,
 * calls as <|tool_call>call:NAME{k:v}<tool_call|> with keys sorted, the "tool" messages after a
 * call as <|tool_response> blocks named by the call whose id they answer). Other families
 * (Llama 3.0, Gemma 2 / 3, ChatML without Qwen's template, Mistral v0.1 / v0.2) give
 * FORGE_ERR_UNSUPPORTED naming the family; a tool without a name, or parameters or arguments
 * that are not a JSON object, FORGE_ERR_INVALID_ARGUMENT. n_tools 0: forge_chat_render. */
FORGE_API forge_status forge_chat_render_tools(const forge_model *model, const forge_chat_message *messages, int n_messages,
                                               const forge_tool *tools, int n_tools, uint32_t flags, char *out, size_t capacity,
                                               size_t *len);

/* A reply forge_chat_tools parsed: its text and the tool calls in it. The strings and arrays
 * are the session's, valid until its next forge_chat_tools call or its free. */
typedef struct forge_chat_reply {
    uint32_t struct_size;                /* set by the caller: sizeof(forge_chat_reply) */
    const char *text;                    /* the whole reply, as generated (NUL-terminated) */
    size_t text_len;
    const char *content;                 /* the reply without its tool calls, trimmed */
    size_t content_len;
    int n_tool_calls;
    const char *const *tool_names;       /* [n_tool_calls] each call's function name */
    const char *const *tool_arguments;   /* [n_tool_calls] each call's arguments: a JSON object, compact (Qwen 3.5's
                                          * parameters: as the tool's schema types them (below); untyped, JSON where
                                          * the value reads as JSON other than a string, True / False / None as
                                          * true / false / null, else a string) */
    const char *const *tool_ids;         /* [n_tool_calls] each call's id: the "id" the model wrote (Mistral), else
                                          * 9 letters and digits forge makes from the reply and the call's place,
                                          * to give back in forge_tool_call.id and a result's tool_call_id */
} forge_chat_reply;

/* forge_chat with tools: renders with forge_chat_render_tools, generates (FORGE_CHAT_TOOL_ARGUMENTS,
 * FORGE_CHAT_TOOL_REQUIRED constrain the calls with a grammar of the tools' names and parameter
 * schemas; params->constraint must then be NULL), and parses the family's tool calls out of the
 * reply into *reply (Qwen 3: <tool_call>{"name", "arguments"}</tool_call> blocks; Qwen 3.5:
 * <tool_call><function=NAME> blocks; Llama 3: a reply that is a JSON {"name", "parameters"}, or
 * several separated by ';'; Mistral: a [TOOL_CALLS] JSON array of {"name", "arguments"}; with
 * FORGE_CHAT_TOOL_REQUIRED its prompt ends with [TOOL_CALLS], which the reply's text then starts
 * with, though it was not generated; Gemma 4: <|tool_call>call:NAME{...}<tool_call|> blocks after
 * its thinking, constrained in its notation: <|"|> marks, its special token, around strings, bare
 * keys, no white space; a string holds no "<|", a length-bounded one no "<"; pattern and an
 * object or array in enum / const are FORGE_ERR_UNSUPPORTED there).
 * Qwen 3.5 writes a string value raw and others as JSON: a value is read by its parameter's
 * schema (type string, a string enum or const: the text; another type: JSON), and constrained
 * so; a raw string is constrained by type, enum, const, minLength and maxLength only (pattern
 * or format on one, or a parameter that may be a string or another type, is
 * FORGE_ERR_UNSUPPORTED with those flags), a string has no "</", and the parameters come in the
 * schema's order, the required ones always, no others.
 * A block that does not parse stays in the content. The text also streams through
 * params->on_token as forge_chat's does. reply may be NULL. */
FORGE_API forge_status forge_chat_tools(forge_session *session, const forge_chat_message *messages, int n_messages,
                                        const forge_tool *tools, int n_tools, uint32_t flags, const forge_generate_params *params,
                                        forge_chat_reply *reply, forge_metrics *metrics);

/* ---------------------------------------------------------------------------------------
 * Classify
 *
 * One batched forward pass over many prompts, no decode loop: the prompts (text or token ids)
 * are right-padded to the longest of each batch and run together, each at positions 0.. (so
 * every prompt's result equals its own unpadded run); for each prompt the logits after its
 * last token and a token drawn from them (temperature 0: the argmax, ties to the lower id).
 * Prompts are batched by length: a batch holds at most n_batch tokens (its prompts x their
 * padded length, the longest rounded up to 8) and at most n_outputs_max (and 1024) prompts
 * (forge_session_params); more prompts run in several batches, so a session made with
 * n_ctx = n_batch is enough. Classify uses the session's KV cache as scratch: the session
 * holds no tokens afterwards. forge_session_metrics then reports the prompt tokens and the
 * call's time (prefill_ms, prefill_tok_s).
 * ------------------------------------------------------------------------------------- */

typedef struct forge_classify_prompt {
    uint32_t struct_size;         /* sizeof(forge_classify_prompt); prompts[0]'s is every prompt's */
    const char *text;             /* UTF-8 text (tokenized as forge_generate does), or NULL: */
    size_t text_len;
    const int32_t *tokens;        /* token ids when text is NULL */
    int n_tokens;
} forge_classify_prompt;

typedef struct forge_classify_params {
    uint32_t struct_size;
    float temperature;            /* default 0: the argmax */
    int top_k;                    /* 0: off */
    float top_p;                  /* 1: off */
    float min_p;                  /* 0: off */
    uint64_t seed;                /* temperature > 0: the draws' seed */
    int add_special;              /* text prompts: add BOS as the tokenizer declares; default 1 */
    float *logits;                /* optional: each prompt's last logits [n_prompts, n_vocab] */
    size_t logits_capacity;       /* floats */
    const int *cancel;            /* optional: set (from any thread) to stop between batches with
                                     FORGE_ERR_CANCELLED; the results are then not filled */
    const forge_constraint *constraint; /* optional: the token is drawn among those the constraint allows first;
                                     FORGE_CONSTRAINT_CHOICES also finds the choice (forge_classify_result.choice) */
} forge_classify_params;

FORGE_API forge_classify_params forge_classify_default_params(void);

typedef struct forge_classify_result {
    uint32_t struct_size;         /* sizeof(forge_classify_result), set by the caller in results[0] */
    int32_t token;                /* drawn from the logits after the prompt's last token */
    int n_tokens;                 /* the prompt's tokens (after tokenizing) */
    const char *text;             /* the token's text as it continues the prompt (NUL-terminated;
                                     an unfinished UTF-8 character as U+FFFD); NULL when the model
                                     has no tokenizer. Owned by the session, valid until its next
                                     classify call or its free. */
    size_t text_len;
    int choice;                   /* with a FORGE_CONSTRAINT_CHOICES constraint: the index of the choice the model
                                     writes (greedy or drawn, token by token as generate would), else -1 */
} forge_classify_result;

/* Classifies n_prompts prompts into results[0 .. n_prompts). Prompt i draws from a generator
 * seeded by (seed, i), so results do not depend on how the prompts are batched.
 * FORGE_ERR_LIMIT for a prompt longer than the model's context (n_ctx_train), the session's n_ctx
 * or its n_batch (the message names the prompt, its length and the limit; nothing runs then),
 * FORGE_ERR_INVALID_ARGUMENT for an empty prompt or a token outside the vocabulary (the message
 * names the prompt),
 * FORGE_ERR_BUFFER_TOO_SMALL when logits is set and logits_capacity < n_prompts * n_vocab. */
FORGE_API forge_status forge_classify(forge_session *session, const forge_classify_prompt *prompts, int n_prompts,
                                      const forge_classify_params *params, forge_classify_result *results);

/* ---------------------------------------------------------------------------------------
 * Embeddings and reranking
 *
 * forge_embed turns texts into vectors as sentence-transformers' encode() does, read from the
 * checkpoint's own sentence-transformers files when it has them: modules.json (Transformer,
 * Pooling, Dense, Normalize; other modules are FORGE_ERR_UNSUPPORTED), 1_Pooling/config.json
 * (last token, mean, CLS; include_prompt false is FORGE_ERR_UNSUPPORTED), the Dense
 * projections' weights (N_Dense/model.safetensors; pytorch_model.bin is not read),
 * config_sentence_transformers.json (prompts, default_prompt_name) and
 * sentence_bert_config.json (max_seq_length). A checkpoint without them is any decoder forge
 * loads, pooled as forge_embed_params.pooling says (last token by default), not normalized.
 * Models with bidirectional attention (EmbeddingGemma: gemma3_text with
 * use_bidirectional_attention) run only here: generate, chat, eval and classify refuse them.
 * Texts are batched as classify batches prompts (right-padded, sorted by length, at most
 * n_batch tokens and n_outputs_max texts a batch); padding never changes a vector. The final
 * norm, the pooling and the Dense projections run on the device (a Tanh Dense, or a Normalize
 * between projections, on the host in double precision); normalization on the host.
 *
 * forge_rerank scores documents against a query, one pass of classify's batching for all:
 * - a sequence-classification checkpoint (a `score` head, as Qwen3ForSequenceClassification
 *   saves it): the query and the document as the tokenizer's pair (its post-processor's pair
 *   template), the head at the last token that is not the pad token (transformers' rule), one
 *   label's logit through a sigmoid (sentence-transformers' CrossEncoder.predict);
 * - a causal LM with "yes" and "no" tokens (Qwen3-Reranker): its model card's prompt
 *   (system judge text, "<Instruct>: I\n<Query>: Q\n<Document>: D", the empty think block;
 *   the three parts tokenized apart, as the card does), the score P(yes) = softmax over the
 *   "no" and "yes" logits at the last position.
 * Anything else is FORGE_ERR_UNSUPPORTED.
 * ------------------------------------------------------------------------------------- */

typedef enum forge_pooling {
    FORGE_POOLING_DEFAULT = 0,    /* the checkpoint's Pooling module; without one, the last token */
    FORGE_POOLING_LAST = 1,       /* the last token's hidden state (after the final norm) */
    FORGE_POOLING_MEAN = 2,       /* the mean over every token of the text (prompt included) */
    FORGE_POOLING_CLS = 3         /* the first token's */
} forge_pooling;

typedef struct forge_embed_params {
    uint32_t struct_size;
    int pooling;                  /* forge_pooling; default FORGE_POOLING_DEFAULT */
    int normalize;                /* -1 (default): as the checkpoint declares (its Normalize module,
                                     applied before truncation, as sentence-transformers does);
                                     0: never; 1: L2-normalize the vector returned (after truncation) */
    int dim;                      /* Matryoshka: keep the first dim values; 0 (default): all */
    const char *prompt_name;      /* a prompt of config_sentence_transformers.json ("query",
                                     "document", ...) put before each text prompt; NULL: the
                                     config's default_prompt_name, or none. A name it lacks is
                                     FORGE_ERR_INVALID_ARGUMENT naming the ones it has. */
    const char *prompt;           /* the prefix text itself (wins over prompt_name); "" for none */
    int truncate;                 /* 1 (default): a text longer than the model's limit (its
                                     max_seq_length, else its context) keeps its first tokens and
                                     the tokenizer's closing special tokens, as sentence-transformers
                                     truncates; 0: FORGE_ERR_LIMIT naming the text */
    int add_special;              /* text prompts: the tokenizer's special tokens; default 1 */
    const int *cancel;            /* optional: set to stop between batches (FORGE_ERR_CANCELLED) */
} forge_embed_params;

FORGE_API forge_embed_params forge_embed_default_params(void);

typedef struct forge_embed_info {
    uint32_t struct_size;         /* sizeof(forge_embed_info), set by the caller */
    int dim;                      /* the vector's length before truncation (the last Dense's output, else hidden) */
    int pooling;                  /* the checkpoint's pooling (forge_pooling, never DEFAULT) */
    int normalize;                /* 1 when the checkpoint ends in Normalize */
    int max_tokens;               /* the longest text forge embeds whole (max_seq_length or the context) */
    int n_dense;                  /* Dense projections after pooling */
    int bidirectional;            /* 1: attention sees both sides (embedding only) */
    int sentence_transformers;    /* 1 when modules.json was read */
    const char *prompt_names;     /* the config's prompt names, comma-separated ("" for none);
                                     owned by the model */
    const char *default_prompt_name; /* or NULL */
} forge_embed_info;

/* What forge_embed does with this model. Its sentence-transformers files are read at load; a
 * fault in them (an unsupported module, a Dense file that does not parse) does not stop the
 * load but is returned here and by forge_embed, with a message naming the file. */
FORGE_API forge_status forge_embed_info_get(const forge_model *model, forge_embed_info *info);

/* Embeds n_texts texts (or token-id lists: prompts[i].tokens, which get no prompt prefix and
 * are truncated to the limit when truncate is 1) into vectors[i * dim .. (i + 1) * dim), dim the
 * vector's length (params->dim if set, else forge_embed_info.dim), written to *dim when dim is
 * not NULL. FORGE_ERR_BUFFER_TOO_SMALL when capacity < n_texts * dim floats (*dim is still
 * set: call with vectors NULL and capacity 0 to learn it), FORGE_ERR_LIMIT / _INVALID_ARGUMENT
 * as forge_classify for a text that cannot run, FORGE_ERR_INVALID_ARGUMENT for dim < 0 or past
 * the vector's length. forge_session_metrics reports the tokens and time as for classify. */
FORGE_API forge_status forge_embed(forge_session *session, const forge_classify_prompt *texts, int n_texts,
                                   const forge_embed_params *params, float *vectors, size_t capacity, int *dim);

typedef struct forge_rerank_params {
    uint32_t struct_size;
    const char *instruction;      /* Qwen3-Reranker's <Instruct>; NULL: its default, "Given a web search
                                     query, retrieve relevant passages that answer the query" */
    int raw;                      /* 0 (default): probabilities (sigmoid, P(yes)); 1: the logit
                                     (the head's; log P(yes) - log P(no)) */
    int truncate;                 /* 1 (default): a pair longer than the model's context loses
                                     tokens from its longer part's end (transformers'
                                     longest_first; the reranker prompt's document); 0: FORGE_ERR_LIMIT */
    const int *cancel;            /* optional: set to stop between batches (FORGE_ERR_CANCELLED) */
} forge_rerank_params;

FORGE_API forge_rerank_params forge_rerank_default_params(void);

/* Scores n_documents documents against query into scores[0 .. n_documents) (higher: more
 * relevant). FORGE_ERR_UNSUPPORTED for a model with neither formulation (the message says
 * what it lacks). */
FORGE_API forge_status forge_rerank(forge_session *session, const char *query, const char *const *documents, int n_documents,
                                    const forge_rerank_params *params, float *scores);

/* ---------------------------------------------------------------------------------------
 * Training: LoRA fine-tuning
 *
 * A forge_trainer adds low-rank adapters to chosen projections of a loaded model and trains
 * them; the base weights (any format forge loads, quantized included) stay frozen. For an
 * adapted projection y = x W^T + scale * (dropout(x) A^T) B^T, with A [rank, in] and
 * B [out, rank] in f32 and scale = alpha / rank, initialised as PEFT does (A Kaiming-uniform,
 * bound 1/sqrt(in); B zero) or read from an adapter. Forward, loss and the hand-written
 * backward pass run on the device; AdamW updates the adapters there too.
 *
 * A step takes a batch of token sequences (right-padded to one length, with per-sequence
 * lengths). Cross-entropy follows HuggingFace's causal-LM loss: labels are aligned with the
 * tokens and shifted by one inside (the token at t+1 is the target of position t), label
 * -100 is not counted, and the loss is the mean over counted targets. A trainer belongs to one
 * thread at a time and may be used beside sessions of the same model.
 * ------------------------------------------------------------------------------------- */

typedef struct forge_trainer forge_trainer;

typedef enum forge_lr_schedule {
    FORGE_LR_CONSTANT = 0,   /* lr (after warmup) */
    FORGE_LR_LINEAR = 1,     /* lr decaying linearly to 0 at total_steps (after warmup) */
    FORGE_LR_COSINE = 2      /* lr * 0.5 (1 + cos(pi * progress)) over total_steps (after warmup) */
} forge_lr_schedule;

typedef enum forge_loss_kind {
    FORGE_LOSS_CROSS_ENTROPY = 0, /* next-token cross-entropy; labels or mask choose what counts */
    FORGE_LOSS_MSE_HIDDEN = 1,    /* mean squared error of the final (normed) hidden states
                                   * against forge_train_batch.targets [n_seqs, seq_len, hidden] */
    FORGE_LOSS_MSE_LOGITS = 2     /* ... of the logits against targets [n_seqs, seq_len, n_vocab] */
} forge_loss_kind;

typedef enum forge_adapter_format {
    FORGE_ADAPTER_PEFT = 0,  /* adapter_config.json + adapter_model.safetensors (HuggingFace PEFT) */
    FORGE_ADAPTER_MLX = 1    /* adapter_config.json + adapters.safetensors (mlx-lm) */
} forge_adapter_format;

typedef struct forge_train_params {
    uint32_t struct_size;
    /* LoRA */
    int rank;                 /* default 8 */
    float alpha;              /* default 16: scale = alpha / rank */
    float dropout;            /* on the adapters' input, default 0 */
    const char *targets;      /* HF names, comma-separated, from q_proj k_proj v_proj o_proj
                               * gate_proj up_proj down_proj and (Qwen 3.5's linear-attention
                               * layers) in_proj_qkv in_proj_z in_proj_b in_proj_a out_proj, or
                               * "all": each layer's of them; default "q_proj,v_proj". On a
                               * mixture-of-experts layer gate/up/down_proj are its shared
                               * expert's (Qwen 3.5-MoE's mlp.shared_expert.*, as PEFT names
                               * them; Qwen 3 MoE's sparse layers have none); the routed
                               * experts and the router stay frozen, and the backward pass runs
                               * through them */
    int n_layers;             /* adapt the last n_layers layers (mlx-lm's num_layers); 0: all */
    uint64_t seed;            /* A's initialisation and the dropout masks; default 0 */
    const char *adapter_path; /* start from this adapter (PEFT or mlx-lm); its rank, alpha and
                               * targets replace the fields above; NULL: fresh adapters */
    /* AdamW, with torch.optim.AdamW's semantics (decoupled weight decay, bias correction; the
     * scalars in double as torch's Python floats, applied to f32 parameters) */
    double lr;                /* default 1e-3 */
    double beta1, beta2;      /* default 0.9, 0.999 */
    double eps;               /* default 1e-8 */
    double weight_decay;      /* default 0.01 */
    forge_lr_schedule schedule; /* default FORGE_LR_CONSTANT */
    int warmup_steps;         /* linear warmup from 0 over this many optimizer steps; default 0 */
    int total_steps;          /* the schedule's length (LINEAR, COSINE); required by those */
    double max_grad_norm;     /* clip the global gradient norm to this (torch's clip_grad_norm_); 0: off */
    int accum_steps;          /* micro-batches per optimizer step, their gradients averaged; default 1 */
    /* loss */
    forge_loss_kind loss;
    /* the device plan: the largest batch the trainer takes */
    int max_batch;            /* sequences per step; default 4 */
    int max_seq;              /* tokens per sequence; default 512 */
    int grad_checkpoint;      /* -1 (default): on when max_batch * max_seq >= 4096; 0 off; 1: keep
                               * each layer's input only and recompute the layer in the backward pass */
    int profile;              /* 1: time every kernel (forge_trainer_profile) */
} forge_train_params;

FORGE_API forge_train_params forge_train_default_params(void);

/* One batch: n_seqs sequences of up to seq_len tokens, row-major [n_seqs, seq_len]. */
typedef struct forge_train_batch {
    uint32_t struct_size;         /* set by the caller: sizeof(forge_train_batch) */
    int n_seqs;
    int seq_len;                  /* the row length of tokens, labels and mask */
    const int32_t *tokens;        /* [n_seqs, seq_len] token ids; padding past a row's length is ignored */
    const int32_t *lengths;       /* [n_seqs] real tokens per row; NULL: every row is seq_len long */
    const int32_t *labels;        /* [n_seqs, seq_len] HF labels (aligned with tokens, -100 = not
                                   * counted); NULL: the tokens themselves */
    const uint8_t *mask;          /* [n_seqs, seq_len] optional: 0 leaves label t out (masked
                                   * cross-entropy, MSE positions); NULL: all count */
    const float *targets;         /* MSE losses: [n_seqs, seq_len, hidden or n_vocab] */
} forge_train_batch;

typedef struct forge_train_stats {
    uint32_t struct_size;         /* set by the caller: sizeof(forge_train_stats) */
    double loss;                  /* the batch's mean loss (before the update) */
    int64_t tokens;               /* counted targets (cross-entropy) or positions (MSE) */
    double grad_norm;             /* global L2 norm of the step's gradient before clipping
                                   * (when this call applied an optimizer step, else 0) */
    double lr;                    /* learning rate applied (0 when no optimizer step was applied) */
    int applied;                  /* 1 when this call ended an accumulation and updated the adapters */
    int step;                     /* optimizer steps done so far */
    double ms;                    /* wall time of the call */
    uint64_t peak_device_bytes;   /* device memory peak of the model and everything made from it */
} forge_train_stats;

/* The device plan a trainer with these params would need, without allocating: adapters,
 * gradients, AdamW moments, kept activations and scratch for max_batch x max_seq. */
FORGE_API forge_status forge_trainer_plan(forge_model *model, const forge_train_params *params, forge_memory_stats *plan);

/* Creates a trainer on a loaded model. Fails with FORGE_ERR_OUT_OF_MEMORY, naming the numbers,
 * when the plan exceeds the device's memory; with FORGE_ERR_FORMAT / FORGE_ERR_MODEL on an
 * adapter that is malformed or does not fit the model (the message names the file and key);
 * with FORGE_ERR_UNSUPPORTED on Gemma 4 (its per-layer inputs, value norms and experts), on
 * models whose layers differ in shape, and on models that only embed or classify, naming why.
 * On failure *out is NULL and the message is on the model. */
FORGE_API forge_status forge_trainer_create(forge_model *model, const forge_train_params *params, forge_trainer **out);
FORGE_API void forge_trainer_free(forge_trainer *trainer);
FORGE_API const char *forge_trainer_errmsg(const forge_trainer *trainer);

/* Runs forward and backward on one batch and adds its gradient (divided by accum_steps) to
 * the accumulated one; every accum_steps-th call then clips, applies AdamW and clears the
 * gradient. stats may be NULL. FORGE_ERR_LIMIT when the batch exceeds max_batch or max_seq,
 * FORGE_ERR_INVALID_ARGUMENT on a token id outside the vocabulary, a label that is neither
 * -100 nor a token id, or a batch with no counted target. */
FORGE_API forge_status forge_train_step(forge_trainer *trainer, const forge_train_batch *batch, forge_train_stats *stats);

/* The loss on a batch without updating anything (validation): no dropout, the same counting
 * as forge_train_step (and the same errors, a batch with no counted target included).
 * *tokens may be NULL. */
FORGE_API forge_status forge_train_eval(forge_trainer *trainer, const forge_train_batch *batch, double *loss, int64_t *tokens);

/* Writes the adapters to directory `dir` (created if missing) in the given format, each file
 * atomically (a temporary file renamed over the old one): an interrupted save leaves the
 * previous files whole. PEFT files load in transformers + peft, mlx-lm files in mlx-lm, and
 * both in forge (forge_model_params.adapter_path, forge_train_params.adapter_path). */
FORGE_API forge_status forge_trainer_save(forge_trainer *trainer, const char *dir, forge_adapter_format format);

FORGE_API forge_status forge_trainer_memory(const forge_trainer *trainer, forge_memory_stats *stats);

/* With forge_train_params.profile: device time per kernel as JSON, like forge_session_profile. */
FORGE_API forge_status forge_trainer_profile(const forge_trainer *trainer, char *out, size_t capacity, size_t *len);

#ifdef __cplusplus
}
#endif
#endif /* FORGE_H */
