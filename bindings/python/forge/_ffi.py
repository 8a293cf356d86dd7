"""ctypes mirror of forge.h: the library lookup, the structs, the prototypes.

Every struct here is laid out field for field as in forge.h (same order, same C types), and every
one is checked against the library's own sizeof (forge_struct_size) when the library loads, so
a header change that this file missed fails loudly instead of corrupting memory. Structs start
with struct_size (forge.h, "Structs grow at their end"): make them with sized() and
sized_array(), which set it. Only the calls the Python API uses are declared.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_double,
    c_float,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint32,
    c_uint64,
    c_uint8,
    c_void_p,
)
from pathlib import Path

forge_status = c_int  # enum forge_status

# Status codes (enum forge_status).
OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_IO = 2
ERR_FORMAT = 3
ERR_UNSUPPORTED = 4
ERR_MODEL = 5
ERR_DEVICE = 6
ERR_OUT_OF_MEMORY = 7
ERR_LIMIT = 8
ERR_BUFFER_TOO_SMALL = 9
ERR_CANCELLED = 10

TOKENIZE_ADD_SPECIAL = 1
TOKENIZE_NO_PARSE_SPECIAL = 2
DETOKENIZE_SKIP_SPECIAL = 1
CHAT_NO_GENERATION_PROMPT = 1
CHAT_THINKING_OFF = 2
CHAT_THINKING_ON = 4
CHAT_TOOL_ARGUMENTS = 8
CHAT_TOOL_REQUIRED = 16
EVAL_ALL_LOGITS = 1

# enum forge_constraint_kind
CONSTRAINT_NONE = 0
CONSTRAINT_GBNF = 1
CONSTRAINT_JSON_SCHEMA = 2
CONSTRAINT_JSON_OBJECT = 3
CONSTRAINT_CHOICES = 4

# enum forge_pooling
POOLING_DEFAULT = 0
POOLING_LAST = 1
POOLING_MEAN = 2
POOLING_CLS = 3

log_fn = CFUNCTYPE(None, c_void_p, c_int, c_char_p)
progress_fn = CFUNCTYPE(None, c_void_p, c_float)
# The token callback takes text as a pointer, not c_char_p: text is not NUL-terminated
# (text_len counts it) and ctypes would stop a c_char_p at the first NUL.
token_fn = CFUNCTYPE(c_int, c_void_p, c_int32, POINTER(c_char), c_size_t)
# forge_prewarm_fn: (user_data, done, total, kernel name or NULL at the end)
prewarm_fn = CFUNCTYPE(None, c_void_p, c_int, c_int, c_char_p)


class DeviceInfo(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("index", c_int),
        ("name", c_char * 256),
        ("driver", c_char * 256),
        ("type", c_int),
        ("vendor_id", c_uint32),
        ("api_version", c_uint32),
        ("device_local_bytes", c_uint64),
        ("max_storage_buffer_range", c_uint64),
        ("max_allocation_size", c_uint64),
        ("max_buffer_size", c_uint64),
        ("subgroup_size", c_uint32),
        ("fp16", c_int),
        ("int8", c_int),
        ("integer_dot_product", c_int),
        ("cooperative_matrix", c_int),
        ("usable", c_int),
    ]


class ModelParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("device_index", c_int),
        ("device_name", c_char_p),
        ("max_storage_buffer_range", c_uint64),
        ("max_allocation_size", c_uint64),
        ("load_tokenizer", c_int),
        ("log", log_fn),
        ("log_user_data", c_void_p),
        ("progress", progress_fn),
        ("progress_user_data", c_void_p),
        ("vocab_only", c_int),
        ("exact", c_int),
        ("adapter_path", c_char_p),
        ("adapter_merge", c_int),
        ("parallel_slots", c_int),
        ("parallel_fail", c_int),
        ("max_device_memory", c_uint64),
    ]


class MemoryStats(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("host_arena_bytes", c_uint64),
        ("device_planned_bytes", c_uint64),
        ("device_in_use_bytes", c_uint64),
        ("device_peak_bytes", c_uint64),
        ("device_buffers", c_uint64),
        ("device_allocations", c_uint64),
        ("kv_cache_bytes", c_uint64),
        ("kv_sliding_bytes", c_uint64),
        ("state_bytes", c_uint64),
    ]


class ModelInfo(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("architecture", c_char * 32),
        ("source_format", c_char * 16),
        ("weight_dtype", c_char * 16),
        ("name", c_char * 128),
        ("n_layers", c_int),
        ("hidden", c_int),
        ("n_heads", c_int),
        ("n_kv_heads", c_int),
        ("head_dim", c_int),
        ("ffn", c_int),
        ("n_vocab", c_int),
        ("n_ctx_train", c_int),
        ("sliding_window", c_int),
        ("n_sliding_layers", c_int),
        ("tied_embeddings", c_int),
        ("n_params", c_uint64),
        ("weight_bytes", c_uint64),
        ("device_name", c_char * 256),
        ("device_driver", c_char * 256),
    ]


class SessionParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("n_ctx", c_int),
        ("n_batch", c_int),
        ("n_outputs_max", c_int),
        ("profile", c_int),
        ("overflow", c_int),
        ("n_keep", c_int),
        ("n_seq_max", c_int),
        ("kv_type", c_int),
    ]


class SpecialTokens(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("bos", c_int32),
        ("eos", c_int32),
        ("eot", c_int32),
        ("pad", c_int32),
        ("unk", c_int32),
        ("n_eos", c_int32),
        ("eos_ids", c_int32 * 8),
        ("sot", c_int32),
    ]


class Constraint(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("kind", c_int),
        ("text", c_char_p),
        ("text_len", c_size_t),
        ("choices", POINTER(c_char_p)),
        ("n_choices", c_int),
        ("trigger", c_char_p),
        ("sample_forced", c_int),
    ]


class GenerateParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("max_tokens", c_int),
        ("temperature", c_float),
        ("top_k", c_int),
        ("top_p", c_float),
        ("min_p", c_float),
        ("repeat_penalty", c_float),
        ("repeat_window", c_int),
        ("seed", c_uint64),
        ("stop_tokens", POINTER(c_int32)),
        ("n_stop_tokens", c_int),
        ("stop_strings", POINTER(c_char_p)),
        ("n_stop_strings", c_int),
        ("ignore_eos", c_int),
        ("add_special", c_int),
        ("on_token", token_fn),
        ("user_data", c_void_p),
        ("cancel", POINTER(c_int)),
        ("constraint", POINTER(Constraint)),
        ("lookup", c_int),
        ("draft", c_void_p),
    ]


class Metrics(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("prompt_tokens", c_int),
        ("cached_tokens", c_int),
        ("generated_tokens", c_int),
        ("cache_wrapped", c_int),
        ("ttft_ms", c_double),
        ("prefill_ms", c_double),
        ("decode_ms", c_double),
        ("prefill_tok_s", c_double),
        ("decode_tok_s", c_double),
        ("peak_device_bytes", c_uint64),
        ("prompt_cache_hits", c_uint64),
        ("stop_reason", c_int),
        ("context_slides", c_int),
        ("constraint_complete", c_int),
        ("forced_tokens", c_int),
        ("constraint_masks", c_int),
        ("constraint_ms", c_double),
        ("draft_tokens", c_int),
        ("draft_accepted", c_int),
    ]


class BatchItem(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("text", c_char_p),
        ("text_len", c_size_t),
        ("tokens", POINTER(c_int32)),
        ("n_tokens", c_int),
        ("params", POINTER(GenerateParams)),
    ]


class BatchResult(Structure):
    _fields_ = [("struct_size", c_uint32), ("status", forge_status), ("metrics", Metrics)]


class ToolCall(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("name", c_char_p),
        ("arguments", c_char_p),
        ("id", c_char_p),
    ]


class ChatMessage(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("role", c_char_p),
        ("content", c_char_p),
        ("tool_calls", POINTER(ToolCall)),
        ("n_tool_calls", c_int),
        ("tool_call_id", c_char_p),
    ]


class Tool(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("name", c_char_p),
        ("description", c_char_p),
        ("parameters", c_char_p),
    ]


class ChatReply(Structure):
    # text and content as pointers with their lengths, as forge_classify_result.text: ctypes would
    # stop a c_char_p at a NUL the reply might hold
    _fields_ = [
        ("struct_size", c_uint32),
        ("text", POINTER(c_char)),
        ("text_len", c_size_t),
        ("content", POINTER(c_char)),
        ("content_len", c_size_t),
        ("n_tool_calls", c_int),
        ("tool_names", POINTER(c_char_p)),
        ("tool_arguments", POINTER(c_char_p)),
        ("tool_ids", POINTER(c_char_p)),
    ]


class ClassifyPrompt(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("text", c_char_p),
        ("text_len", c_size_t),
        ("tokens", POINTER(c_int32)),
        ("n_tokens", c_int),
    ]


class ClassifyParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("temperature", c_float),
        ("top_k", c_int),
        ("top_p", c_float),
        ("min_p", c_float),
        ("seed", c_uint64),
        ("add_special", c_int),
        ("logits", POINTER(c_float)),
        ("logits_capacity", c_size_t),
        ("cancel", POINTER(c_int)),
        ("constraint", POINTER(Constraint)),
    ]


class ClassifyResult(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("token", c_int32),
        ("n_tokens", c_int),
        ("text", POINTER(c_char)),
        ("text_len", c_size_t),
        ("choice", c_int),
    ]


class EmbedParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("pooling", c_int),
        ("normalize", c_int),
        ("dim", c_int),
        ("prompt_name", c_char_p),
        ("prompt", c_char_p),
        ("truncate", c_int),
        ("add_special", c_int),
        ("cancel", POINTER(c_int)),
    ]


class EmbedInfo(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("dim", c_int),
        ("pooling", c_int),
        ("normalize", c_int),
        ("max_tokens", c_int),
        ("n_dense", c_int),
        ("bidirectional", c_int),
        ("sentence_transformers", c_int),
        ("prompt_names", c_char_p),
        ("default_prompt_name", c_char_p),
    ]


class RerankParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("instruction", c_char_p),
        ("raw", c_int),
        ("truncate", c_int),
        ("cancel", POINTER(c_int)),
    ]


class TrainParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("rank", c_int),
        ("alpha", c_float),
        ("dropout", c_float),
        ("targets", c_char_p),
        ("n_layers", c_int),
        ("seed", c_uint64),
        ("adapter_path", c_char_p),
        ("lr", c_double),
        ("beta1", c_double),
        ("beta2", c_double),
        ("eps", c_double),
        ("weight_decay", c_double),
        ("schedule", c_int),
        ("warmup_steps", c_int),
        ("total_steps", c_int),
        ("max_grad_norm", c_double),
        ("accum_steps", c_int),
        ("loss", c_int),
        ("max_batch", c_int),
        ("max_seq", c_int),
        ("grad_checkpoint", c_int),
        ("profile", c_int),
    ]


class TrainBatch(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("n_seqs", c_int),
        ("seq_len", c_int),
        ("tokens", POINTER(c_int32)),
        ("lengths", POINTER(c_int32)),
        ("labels", POINTER(c_int32)),
        ("mask", POINTER(c_uint8)),
        ("targets", POINTER(c_float)),
    ]


class TrainStats(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("loss", c_double),
        ("tokens", c_int64),
        ("grad_norm", c_double),
        ("lr", c_double),
        ("applied", c_int),
        ("step", c_int),
        ("ms", c_double),
        ("peak_device_bytes", c_uint64),
    ]


_P = POINTER
_PROTOTYPES = {
    "forge_status_name": (c_char_p, [forge_status]),
    "forge_version": (c_char_p, []),
    "forge_version_number": (c_int, []),
    "forge_struct_size": (c_size_t, [c_char_p]),
    "forge_list_devices": (forge_status, [_P(DeviceInfo), c_int, _P(c_int), c_char_p, c_size_t]),
    "forge_model_default_params": (ModelParams, []),
    "forge_model_load": (forge_status, [c_char_p, _P(ModelParams), _P(c_void_p)]),
    "forge_model_free": (None, [c_void_p]),
    "forge_model_errmsg": (c_char_p, [c_void_p]),
    "forge_model_get_info": (forge_status, [c_void_p, _P(ModelInfo)]),
    "forge_model_memory": (forge_status, [c_void_p, _P(MemoryStats)]),
    "forge_model_n_vocab": (c_int, [c_void_p]),
    "forge_model_special_tokens": (forge_status, [c_void_p, _P(SpecialTokens)]),
    "forge_session_default_params": (SessionParams, []),
    "forge_session_create": (forge_status, [c_void_p, _P(SessionParams), _P(c_void_p)]),
    "forge_session_free": (None, [c_void_p]),
    "forge_session_errmsg": (c_char_p, [c_void_p]),
    "forge_session_n_past": (c_int, [c_void_p]),
    "forge_session_kv_type": (c_int, [c_void_p]),
    "forge_session_prewarm": (forge_status, [c_void_p, c_int, prewarm_fn, c_void_p]),
    "forge_session_truncate": (forge_status, [c_void_p, c_int]),
    "forge_session_memory": (forge_status, [c_void_p, _P(MemoryStats)]),
    "forge_session_save": (forge_status, [c_void_p, c_char_p]),
    "forge_session_load": (forge_status, [c_void_p, c_char_p]),
    "forge_tokenize": (forge_status, [c_void_p, c_char_p, c_size_t, c_uint32, _P(c_int32), c_size_t, _P(c_size_t)]),
    "forge_detokenize": (forge_status, [c_void_p, _P(c_int32), c_size_t, c_uint32, _P(c_char), c_size_t, _P(c_size_t)]),
    "forge_token_piece": (c_char_p, [c_void_p, c_int32]),
    "forge_token_id": (c_int32, [c_void_p, c_char_p]),
    "forge_token_is_special": (c_int, [c_void_p, c_int32]),
    "forge_generate_default_params": (GenerateParams, []),
    "forge_generate_tokens": (forge_status, [c_void_p, _P(c_int32), c_int, _P(GenerateParams), _P(Metrics)]),
    "forge_generate": (forge_status, [c_void_p, c_char_p, c_size_t, _P(GenerateParams), _P(Metrics)]),
    "forge_session_metrics": (forge_status, [c_void_p, _P(Metrics)]),
    "forge_batch_generate": (forge_status, [c_void_p, _P(BatchItem), c_int, _P(BatchResult)]),
    "forge_chat_render": (forge_status, [c_void_p, _P(ChatMessage), c_int, c_uint32, _P(c_char), c_size_t, _P(c_size_t)]),
    "forge_chat": (forge_status, [c_void_p, _P(ChatMessage), c_int, c_uint32, _P(GenerateParams), _P(Metrics)]),
    "forge_chat_render_tools": (forge_status, [c_void_p, _P(ChatMessage), c_int, _P(Tool), c_int, c_uint32, _P(c_char),
                                               c_size_t, _P(c_size_t)]),
    "forge_chat_tools": (forge_status, [c_void_p, _P(ChatMessage), c_int, _P(Tool), c_int, c_uint32, _P(GenerateParams),
                                        _P(ChatReply), _P(Metrics)]),
    "forge_classify_default_params": (ClassifyParams, []),
    "forge_classify": (forge_status, [c_void_p, _P(ClassifyPrompt), c_int, _P(ClassifyParams), _P(ClassifyResult)]),
    "forge_embed_default_params": (EmbedParams, []),
    "forge_embed_info_get": (forge_status, [c_void_p, _P(EmbedInfo)]),
    "forge_embed": (forge_status, [c_void_p, _P(ClassifyPrompt), c_int, _P(EmbedParams), _P(c_float), c_size_t, _P(c_int)]),
    "forge_rerank_default_params": (RerankParams, []),
    "forge_rerank": (forge_status, [c_void_p, c_char_p, _P(c_char_p), c_int, _P(RerankParams), _P(c_float)]),
    "forge_train_default_params": (TrainParams, []),
    "forge_trainer_plan": (forge_status, [c_void_p, _P(TrainParams), _P(MemoryStats)]),
    "forge_trainer_create": (forge_status, [c_void_p, _P(TrainParams), _P(c_void_p)]),
    "forge_trainer_free": (None, [c_void_p]),
    "forge_trainer_errmsg": (c_char_p, [c_void_p]),
    "forge_train_step": (forge_status, [c_void_p, _P(TrainBatch), _P(TrainStats)]),
    "forge_train_eval": (forge_status, [c_void_p, _P(TrainBatch), _P(c_double), _P(c_int64)]),
    "forge_trainer_save": (forge_status, [c_void_p, c_char_p, c_int]),
    "forge_trainer_memory": (forge_status, [c_void_p, _P(MemoryStats)]),
    "forge_trainer_profile": (forge_status, [c_void_p, _P(c_char), c_size_t, _P(c_size_t)]),
}

# Every mirror, by its name in forge.h: checked at load against the library's sizeof.
_MIRRORS = {
    "forge_device_info": DeviceInfo,
    "forge_model_params": ModelParams,
    "forge_memory_stats": MemoryStats,
    "forge_model_info": ModelInfo,
    "forge_session_params": SessionParams,
    "forge_special_tokens": SpecialTokens,
    "forge_constraint": Constraint,
    "forge_generate_params": GenerateParams,
    "forge_metrics": Metrics,
    "forge_batch_item": BatchItem,
    "forge_batch_result": BatchResult,
    "forge_tool_call": ToolCall,
    "forge_chat_message": ChatMessage,
    "forge_tool": Tool,
    "forge_chat_reply": ChatReply,
    "forge_classify_prompt": ClassifyPrompt,
    "forge_classify_params": ClassifyParams,
    "forge_classify_result": ClassifyResult,
    "forge_embed_params": EmbedParams,
    "forge_embed_info": EmbedInfo,
    "forge_rerank_params": RerankParams,
    "forge_train_params": TrainParams,
    "forge_train_batch": TrainBatch,
    "forge_train_stats": TrainStats,
}


def sized(struct: type, **fields):
    """A struct forge reads or fills, its struct_size set (the rest zero, or `fields`)."""
    value = struct(**fields)
    value.struct_size = ctypes.sizeof(struct)
    return value


def sized_array(struct: type, n: int) -> ctypes.Array:
    """An array of n (at least 1) such structs, each one's struct_size set."""
    arr = (struct * max(n, 1))()
    for item in arr:
        item.struct_size = ctypes.sizeof(struct)
    return arr


class LibraryNotFoundError(OSError):
    """libforge.so could not be found or loaded; the message lists every place tried."""


def _candidates() -> list[str]:
    """Where to look for the library, in order: $FORGE_LIBRARY, a copy inside the package,
    the system's (the dynamic linker's search path, ldconfig's cache)."""
    found = []
    env = os.environ.get("FORGE_LIBRARY")
    if env:
        found.append(env)
    here = Path(__file__).resolve().parent
    for name in ("libforge.so", "libforge.so.0"):
        if (here / name).is_file():
            found.append(str(here / name))
    system = ctypes.util.find_library("forge")
    if system:
        found.append(system)
    found.append("libforge.so.0")
    return found


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def lib() -> ctypes.CDLL:
    """The loaded library, loaded and checked on first use."""
    global _lib
    with _lock:
        if _lib is None:
            _lib = _load()
        return _lib


def _load() -> ctypes.CDLL:
    tried = []
    env = os.environ.get("FORGE_LIBRARY")
    for path in _candidates():
        try:
            handle = ctypes.CDLL(path)
        except OSError as e:
            # $FORGE_LIBRARY names the one library wanted: do not fall back past it silently.
            if env and path == env:
                raise LibraryNotFoundError(f"FORGE_LIBRARY={env} could not be loaded: {e}") from e
            tried.append(f"{path}: {e}")
            continue
        _declare(handle, path)
        return handle
    raise LibraryNotFoundError(
        "libforge.so was not found; set FORGE_LIBRARY to its path (e.g. build/libforge.so), copy it "
        "into the forge package directory, or install it (make install). Tried:\n  " + "\n  ".join(tried)
    )


def _declare(handle: ctypes.CDLL, path: str) -> None:
    for name, (restype, argtypes) in _PROTOTYPES.items():
        try:
            fn = getattr(handle, name)
        except AttributeError as e:
            raise LibraryNotFoundError(f"{path} has no {name}: an older libforge than this package") from e
        fn.restype = restype
        fn.argtypes = argtypes
    for name, struct in _MIRRORS.items():
        size = handle.forge_struct_size(name.encode())
        if size != ctypes.sizeof(struct):
            raise LibraryNotFoundError(
                f"{path}: the library's {name} is {size} bytes, the Python mirror {struct.__name__} is "
                f"{ctypes.sizeof(struct)}: the package and the library disagree on forge.h "
                f"(library {handle.forge_version().decode()})"
            )


def text(value: bytes | None) -> str:
    """A C string from forge as str (forge's text is UTF-8)."""
    return value.decode("utf-8", "replace") if value else ""


def int32_array(values) -> ctypes.Array:
    ids = list(values)
    return (c_int32 * max(len(ids), 1))(*ids)

