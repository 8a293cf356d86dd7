"""forge: Python bindings for the forge LLM runtime (libforge.so), in pure Python over ctypes.

    import forge

    with forge.Model("models/stories260K/stories260K.gguf") as model:
        with model.session(n_ctx=512) as session:
            for token in session.generate("Once upon a time", max_tokens=64):
                print(token, end="", flush=True)

The library is found through $FORGE_LIBRARY (a path to libforge.so), then a copy inside this
package, then the system's (libforge.so.0, as `make install` puts it). Every failing call
raises forge.Error (a subclass per status) carrying forge's own message. Like forge.h's
objects, a Model may be shared between threads and a Session belongs to one thread at a time.
"""

from __future__ import annotations

import atexit
import ctypes
import enum
import json
import os
import queue
import threading
import weakref
from array import array
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, TypeVar, Union

from . import _ffi
from ._ffi import LibraryNotFoundError

__version__ = "0.1.0"

PathLike = Union[str, "os.PathLike[str]"]
Prompt = Union[str, Sequence[int]]

__all__ = [
    "Model", "Session", "TokenStream", "Token", "Status", "StopReason", "Error",
    "InvalidArgumentError", "FileError", "FormatError", "UnsupportedError", "ModelError", "DeviceError",
    "OutOfMemoryError", "LimitError", "BufferTooSmallError", "CancelledError", "LibraryNotFoundError",
    "ModelInfo", "MemoryStats", "SpecialTokens", "Metrics", "Classification", "Completion", "ToolCall", "Device",
    "devices", "library_version", "Trainer", "TrainStats", "EmbedInfo",
]

# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


class Status(enum.IntEnum):
    """forge_status: what a call returned (FORGE_OK, FORGE_ERR_*)."""

    OK = _ffi.OK
    INVALID_ARGUMENT = _ffi.ERR_INVALID_ARGUMENT
    IO = _ffi.ERR_IO
    FORMAT = _ffi.ERR_FORMAT
    UNSUPPORTED = _ffi.ERR_UNSUPPORTED
    MODEL = _ffi.ERR_MODEL
    DEVICE = _ffi.ERR_DEVICE
    OUT_OF_MEMORY = _ffi.ERR_OUT_OF_MEMORY
    LIMIT = _ffi.ERR_LIMIT
    BUFFER_TOO_SMALL = _ffi.ERR_BUFFER_TOO_SMALL
    CANCELLED = _ffi.ERR_CANCELLED

    @property
    def c_name(self) -> str:
        """The name forge_status_name() gives: "FORGE_OK", "FORGE_ERR_IO", ..."""
        return "FORGE_OK" if self is Status.OK else "FORGE_ERR_" + self.name


class Error(Exception):
    """A forge call failed. `status` is the forge_status (a Status), `status_name` its C name
    ("FORGE_ERR_IO"), `message` the explanation forge left on the object (the model's or the
    session's errmsg: it names the file, tensor, field or limit at fault)."""

    def __init__(self, status: int, message: str):
        try:
            self.status: Union[Status, int] = Status(status)
            self.status_name = self.status.c_name
        except ValueError:
            self.status, self.status_name = status, f"forge status {status}"
        self.message = message
        super().__init__(f"{message} ({self.status_name})" if message else self.status_name)


class InvalidArgumentError(Error, ValueError):
    """FORGE_ERR_INVALID_ARGUMENT: an out-of-range value or a misuse of the API (also: a closed object)."""


class FileError(Error):
    """FORGE_ERR_IO: a file is missing, unreadable or cannot be mapped."""


class FormatError(Error):
    """FORGE_ERR_FORMAT: a file is malformed."""


class UnsupportedError(Error):
    """FORGE_ERR_UNSUPPORTED: well-formed but not supported (architecture, dtype, no chat format)."""


class ModelError(Error):
    """FORGE_ERR_MODEL: tensors and config disagree, or state saved from another model."""


class DeviceError(Error):
    """FORGE_ERR_DEVICE: no usable Vulkan device, or a Vulkan call failed."""


class OutOfMemoryError(Error, MemoryError):
    """FORGE_ERR_OUT_OF_MEMORY: host or device memory could not be allocated."""


class LimitError(Error):
    """FORGE_ERR_LIMIT: a planned limit was exceeded (context length, batch)."""


class BufferTooSmallError(Error):
    """FORGE_ERR_BUFFER_TOO_SMALL: the bindings size their buffers, so this means a bug here."""


class CancelledError(Error):
    """FORGE_ERR_CANCELLED: the call was cancelled."""


_ERRORS: dict[int, type[Error]] = {
    Status.INVALID_ARGUMENT: InvalidArgumentError,
    Status.IO: FileError,
    Status.FORMAT: FormatError,
    Status.UNSUPPORTED: UnsupportedError,
    Status.MODEL: ModelError,
    Status.DEVICE: DeviceError,
    Status.OUT_OF_MEMORY: OutOfMemoryError,
    Status.LIMIT: LimitError,
    Status.BUFFER_TOO_SMALL: BufferTooSmallError,
    Status.CANCELLED: CancelledError,
}


def _error(status: int, message: str) -> Error:
    return _ERRORS.get(status, Error)(status, message)


# Models still open at exit are closed by an atexit hook, while the worker threads of their
# streams can still run (interpreter shutdown freezes daemon threads after the atexit hooks).
_live_models: "weakref.WeakSet[Model]" = weakref.WeakSet()


@atexit.register
def _close_models_at_exit() -> None:
    for model in list(_live_models):
        model.close()


# ---------------------------------------------------------------------------------------------
# Plain data returned by the API
# ---------------------------------------------------------------------------------------------


class StopReason(enum.IntEnum):
    """forge_stop_reason: why a generate or chat call stopped. An IntEnum (it compares equal to
    the C value, 5 for CALLBACK) whose str() is the name `forge run --json` prints as its
    "stop_reason" (docs/json.md): "none", "eos", "stop_token", "stop_string", "max_tokens",
    "callback", "context", "cancelled", "constraint"; `.name` is the member's ("CALLBACK")."""

    NONE = 0
    EOS = 1          # the model produced one of its end tokens
    TOKEN = 2        # one of the caller's stop_tokens
    STRING = 3       # one of the caller's stop strings
    MAX_TOKENS = 4
    CALLBACK = 5     # the consumer stopped (broke out of the stream, closed it)
    CONTEXT = 6      # the session's context is full
    CANCELLED = 7
    CONSTRAINT = 8   # the output matched the constraint whole, or no token could continue it

    def __str__(self) -> str:
        return {"TOKEN": "stop_token", "STRING": "stop_string"}.get(self.name, self.name.lower())

    def __format__(self, spec: str) -> str:  # f"{reason}" as str(), not the number
        return format(str(self), spec)


@dataclass(frozen=True)
class MemoryStats:
    """forge_memory_stats: host and device memory of a model or session, in bytes."""

    host_arena_bytes: int
    device_planned_bytes: int
    device_in_use_bytes: int
    device_peak_bytes: int
    device_buffers: int
    device_allocations: int
    kv_cache_bytes: int
    kv_sliding_bytes: int
    state_bytes: int  # sessions: the recurrent state of linear-attention layers (Qwen 3.5)


@dataclass(frozen=True)
class ModelInfo:
    """forge_model_info: the model's architecture, shapes, weights and device."""

    architecture: str
    source_format: str
    weight_dtype: str
    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    n_vocab: int
    n_ctx_train: int
    sliding_window: int
    n_sliding_layers: int
    tied_embeddings: bool
    n_params: int
    weight_bytes: int
    device_name: str
    device_driver: str
    memory: MemoryStats


@dataclass(frozen=True)
class Device:
    """forge_device_info: one Vulkan device; pass `index` or part of `name` as Model(device=...)."""

    index: int
    name: str
    driver: str
    type: int
    vendor_id: int
    api_version: int
    device_local_bytes: int
    max_storage_buffer_range: int
    max_allocation_size: int
    max_buffer_size: int
    subgroup_size: int
    fp16: bool
    int8: bool
    integer_dot_product: bool
    cooperative_matrix: bool
    usable: bool


@dataclass(frozen=True)
class SpecialTokens:
    """forge_special_tokens: the tokenizer's special ids (-1 where the model has none)."""

    bos: int
    eos: int
    eot: int
    pad: int
    unk: int
    eos_ids: tuple[int, ...]  # every id that ends generation
    sot: int


@dataclass(frozen=True)
class Metrics:
    """forge_metrics: the numbers of one generate, chat or batch item. The constraint_* fields
    and forced_tokens count only with a constraint (grammar=, json_schema=, json_object=,
    choices=, or a chat's tool_choice="required" / strict=True)."""

    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int
    cache_wrapped: bool
    ttft_ms: float
    prefill_ms: float
    decode_ms: float
    prefill_tok_s: float
    decode_tok_s: float
    peak_device_bytes: int
    prompt_cache_hits: int
    stop_reason: StopReason
    context_slides: int
    constraint_complete: bool  # the output matches the constraint whole (or ended outside a triggered span)
    forced_tokens: int         # generated tokens the constraint forced (written, not sampled)
    constraint_masks: int      # draws the device's candidates could not decide: the whole row was read on the host
    constraint_ms: float       # host time spent on the constraint: compiling, checks, masks, forced text
    draft_tokens: int = 0      # prompt lookup (forge_generate_params.lookup): tokens drafted and verified
    draft_accepted: int = 0    # of which kept


@dataclass(frozen=True)
class Classification:
    """One prompt's result from Session.classify: `id`, the token drawn after its last token
    (the argmax at temperature 0; "id" in `forge classify`'s JSON), that token's `text` as it
    continues the prompt, the prompt's token count and, when asked for, the logits after its
    last token. With choices=, `choice` is the index of the choice the model writes (token by
    token, as generate would; None without choices). `token` is a read-only alias of `id` (its
    earlier name)."""

    id: int
    text: str
    n_tokens: int
    logits: Optional[array] = None  # array('f') of n_vocab floats
    choice: Optional[int] = None    # with choices=: the index of the chosen one in the list

    @property
    def token(self) -> int:
        """The same as `id` (the field's name before it matched the CLI's JSON); read-only."""
        return self.id


_POOLING = {None: _ffi.POOLING_DEFAULT, "last": _ffi.POOLING_LAST, "mean": _ffi.POOLING_MEAN, "cls": _ffi.POOLING_CLS}
_POOLING_NAMES = {v: k for k, v in _POOLING.items() if k is not None}


@dataclass(frozen=True)
class EmbedInfo:
    """forge_embed_info: what Session.embed does with this model (Model.embed_info())."""

    dim: int                    # the vector's length before truncation (the last Dense's output, else hidden)
    pooling: str                # the checkpoint's pooling: "last", "mean" or "cls"
    normalize: bool             # the checkpoint ends in Normalize: vectors are unit length
    max_tokens: int             # the longest text embedded whole (max_seq_length, else the context)
    n_dense: int                # Dense projections after pooling
    bidirectional: bool         # attention sees both sides (EmbeddingGemma): embedding only
    sentence_transformers: bool  # the checkpoint's modules.json was read
    prompt_names: tuple[str, ...]  # config_sentence_transformers.json's prompts ("query", "document", ...)
    default_prompt_name: Optional[str]  # the prompt used when none is named, or None


def _numpy() -> Any:
    """numpy, or None when it does not import: Session.embed returns an array with it, lists
    without."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy


@dataclass
class Completion:
    """One prompt's result from Session.batch_generate. `error` is set (and the rest empty)
    when this prompt failed on its own; the other prompts still ran."""

    text: str
    tokens: list[int]
    metrics: Optional[Metrics]
    error: Optional[Error] = None


@dataclass
class ToolCall:
    """A function call: one of TokenStream.tool_calls (what Session.chat(..., tools=...) parsed
    out of the reply), and what an assistant message's "tool_calls" may hold. `arguments` is
    the parsed JSON object (a dict); `id` the call's id (the model's, or 9 letters and digits
    forge made), which a "tool" message answering it gives as its "tool_call_id" (Mistral v0.3 /
    Nemo's template requires both)."""

    name: str
    arguments: dict
    id: Optional[str] = None


def _convert(struct: ctypes.Structure, cls: type, **extra: Any) -> Any:
    """A dataclass of the same field names from a ctypes struct (char arrays to str, nested
    structs to their dataclass, int flags to bool where the dataclass says bool); `extra`
    gives the fields the struct does not have."""
    values = dict(extra)
    for f in fields(cls):
        if f.name in extra:
            continue
        v = getattr(struct, f.name)
        if isinstance(v, bytes):
            v = _ffi.text(v)
        elif isinstance(v, ctypes.Structure):
            v = _convert(v, MemoryStats)
        elif f.type in ("bool", bool):
            v = bool(v)
        elif f.type in ("StopReason",):
            v = StopReason(v)
        values[f.name] = v
    return cls(**values)


def _metrics(m: _ffi.Metrics) -> Metrics:
    return _convert(m, Metrics)


class Token(str):
    """One generated token: the str is the text it makes printable (may be "" while a
    character or a possible stop string is incomplete), `id` is the token id. The text held
    back at the end, when generation stops for another reason, comes as a Token with id -1."""

    id: int

    def __new__(cls, text: str, id: int) -> "Token":
        token = super().__new__(cls, text)
        token.id = id
        return token

    def __repr__(self) -> str:
        return f"Token({str.__repr__(self)}, id={self.id})"


# ---------------------------------------------------------------------------------------------
# Library-level calls
# ---------------------------------------------------------------------------------------------


def library_version() -> str:
    """The loaded libforge's version, "MAJOR.MINOR.PATCH"."""
    return _ffi.text(_ffi.lib().forge_version())


def status_name(status: int) -> str:
    """forge_status_name() of the loaded library: "FORGE_ERR_FORMAT"."""
    return _ffi.text(_ffi.lib().forge_status_name(status))


def devices() -> list[Device]:
    """The Vulkan devices, in the order forge's default choice prefers them. Raises DeviceError
    when there is no Vulkan loader or driver."""
    lib = _ffi.lib()
    count = ctypes.c_int(0)
    err = ctypes.create_string_buffer(512)
    status = lib.forge_list_devices(None, 0, ctypes.byref(count), err, len(err))
    if status == _ffi.OK and count.value:
        found = _ffi.sized_array(_ffi.DeviceInfo, count.value)
        status = lib.forge_list_devices(found, count.value, ctypes.byref(count), err, len(err))
    if status != _ffi.OK:
        raise _error(status, _ffi.text(err.value))
    return [_convert(found[i], Device) for i in range(count.value)] if count.value else []


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------


class Model:
    """A loaded model (forge_model): weights on the device, tokenizer, config.

    Model(path) loads a .gguf file, a safetensors directory (config.json + *.safetensors) or
    one .safetensors file beside its config.json. `device` picks the Vulkan device: its index
    in devices() or part of its name (None: discrete, then integrated, then CPU). `adapter` is
    a LoRA adapter directory (PEFT or mlx-lm) applied beside the base weights. `exact` keeps
    every product in f32 (no tensor cores; no int8 activations for Q4_0 / Q8_0 products, which
    GPUs use in decode and CPU devices in decode and prefill). `vocab_only` loads the tokenizer alone (no
    device): only tokenize, detokenize and the token lookups work then. `max_device_memory`
    (bytes; 0: the device's heap) caps what the model, its sessions and trainers may use
    together: a plan over it raises OutOfMemoryError before anything is allocated.

    Use it as a context manager, or call close(); closing frees the model's sessions and
    trainers first.
    Raises forge.Error (FileError for a missing file, FormatError for a malformed one, ...).
    """

    def __init__(self, path: PathLike, device: Union[int, str, None] = None, adapter: Optional[PathLike] = None,
                 exact: bool = False, vocab_only: bool = False, max_device_memory: int = 0):
        self._lib = _ffi.lib()
        self._handle: Optional[int] = None
        self._children: set[Union[_SessionHandle, _TrainerHandle]] = set()  # freed before the model
        self.path = os.fspath(path)
        params = self._lib.forge_model_default_params()
        if isinstance(device, bool) or not isinstance(device, (int, str, type(None))):
            raise TypeError(f"device must be an index (int) or part of a device name (str), not {device!r}")
        if isinstance(device, int):
            params.device_index = device
        elif isinstance(device, str):
            params.device_name = device.encode()
        if adapter is not None:
            params.adapter_path = os.fsencode(adapter)
        params.exact = int(bool(exact))
        params.vocab_only = int(bool(vocab_only))
        if max_device_memory < 0:
            raise ValueError(f"max_device_memory must be >= 0, not {max_device_memory}")
        params.max_device_memory = max_device_memory
        handle = ctypes.c_void_p()
        status = self._lib.forge_model_load(os.fsencode(path), ctypes.byref(params), ctypes.byref(handle))
        if status != _ffi.OK:
            # A failed load still returns a model that holds the message (NULL only when the
            # host ran out of memory): read it, then free it.
            message = _ffi.text(self._lib.forge_model_errmsg(handle)) if handle.value else "out of host memory"
            self._lib.forge_model_free(handle)
            raise _error(status, message)
        self._handle = handle.value
        _live_models.add(self)

    # -- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        """Frees the model (device memory included), after closing its open sessions and
        trainers. Safe to call twice."""
        if self._handle is None:
            return
        for child in list(self._children):
            child.free()
        self._children.clear()
        self._lib.forge_model_free(self._handle)
        self._handle = None

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None:
            self.close()

    def __repr__(self) -> str:
        return f"<forge.Model {self.path!r}{' closed' if self.closed else ''}>"

    def _h(self) -> int:
        if self._handle is None:
            raise InvalidArgumentError(Status.INVALID_ARGUMENT, f"the model {self.path!r} is closed")
        return self._handle

    def _raise(self, status: int) -> None:
        raise _error(status, _ffi.text(self._lib.forge_model_errmsg(self._h())))

    # -- facts -----------------------------------------------------------------------------

    @property
    def info(self) -> ModelInfo:
        """Architecture, shapes, parameter count, weight bytes, device and memory."""
        info = _ffi.sized(_ffi.ModelInfo)
        status = self._lib.forge_model_get_info(self._h(), ctypes.byref(info))
        memory = _ffi.sized(_ffi.MemoryStats)
        if status == _ffi.OK:
            status = self._lib.forge_model_memory(self._h(), ctypes.byref(memory))
        if status != _ffi.OK:
            self._raise(status)
        return _convert(info, ModelInfo, memory=_convert(memory, MemoryStats))

    @property
    def n_vocab(self) -> int:
        return int(self._lib.forge_model_n_vocab(self._h()))

    @property
    def special_tokens(self) -> SpecialTokens:
        """The tokenizer's special ids: bos, eos, eot (end of turn), pad, unk, sot, eos_ids."""
        sp = _ffi.sized(_ffi.SpecialTokens)
        status = self._lib.forge_model_special_tokens(self._h(), ctypes.byref(sp))
        if status != _ffi.OK:
            self._raise(status)
        return SpecialTokens(bos=sp.bos, eos=sp.eos, eot=sp.eot, pad=sp.pad, unk=sp.unk,
                             eos_ids=tuple(sp.eos_ids[: sp.n_eos]), sot=sp.sot)

    def embed_info(self) -> EmbedInfo:
        """What Session.embed does with this model (forge_embed_info_get): the vector's
        length, the pooling, whether vectors are normalized, the longest text embedded whole,
        the Dense projections, the prompts of config_sentence_transformers.json. The first
        call reads the checkpoint's sentence-transformers files: their errors are raised here
        (and by Session.embed)."""
        info = _ffi.sized(_ffi.EmbedInfo)
        status = self._lib.forge_embed_info_get(self._h(), ctypes.byref(info))
        if status != _ffi.OK:
            self._raise(status)
        names = _ffi.text(info.prompt_names)
        return EmbedInfo(dim=int(info.dim), pooling=_POOLING_NAMES.get(info.pooling, str(info.pooling)),
                         normalize=bool(info.normalize), max_tokens=int(info.max_tokens), n_dense=int(info.n_dense),
                         bidirectional=bool(info.bidirectional), sentence_transformers=bool(info.sentence_transformers),
                         prompt_names=tuple(names.split(",")) if names else (),
                         default_prompt_name=_ffi.text(info.default_prompt_name) if info.default_prompt_name else None)

    # -- tokenizer -------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """The token ids of `text`, as HuggingFace tokenizers' encode(text,
        add_special_tokens=add_special) gives them. With parse_special (the default) special
        tokens written in the text ("<|eot_id|>") become their ids; without, they are text."""
        data = text.encode("utf-8", "surrogatepass")
        flags = (_ffi.TOKENIZE_ADD_SPECIAL if add_special else 0) | (0 if parse_special else _ffi.TOKENIZE_NO_PARSE_SPECIAL)
        n = ctypes.c_size_t(0)
        capacity = len(data) + 8  # one id per byte and the added ones is always enough for BPE
        while True:
            ids = (ctypes.c_int32 * capacity)()
            status = self._lib.forge_tokenize(self._h(), data, len(data), flags, ids, capacity, ctypes.byref(n))
            if status == _ffi.ERR_BUFFER_TOO_SMALL:
                capacity = n.value
                continue
            if status != _ffi.OK:
                self._raise(status)
            return list(ids[: n.value])

    def detokenize(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """The text of `ids`, as HuggingFace's decode(ids, skip_special_tokens=skip_special)."""
        ids = list(ids)
        arr, n_ids = _ffi.int32_array(ids), len(ids)
        flags = _ffi.DETOKENIZE_SKIP_SPECIAL if skip_special else 0
        n = ctypes.c_size_t(0)
        capacity = 16 * n_ids + 16
        while True:
            buf = ctypes.create_string_buffer(capacity)
            status = self._lib.forge_detokenize(self._h(), arr, n_ids, flags, buf, capacity, ctypes.byref(n))
            if status == _ffi.ERR_BUFFER_TOO_SMALL:
                capacity = n.value + 1
                continue
            if status != _ffi.OK:
                self._raise(status)
            return buf.raw[: n.value].decode("utf-8", "replace")

    def token_piece(self, token: int) -> Optional[str]:
        """The vocabulary entry of `token` as stored ("▁the", "<0x0A>"), or None when out of range."""
        piece = self._lib.forge_token_piece(self._h(), token)
        return None if piece is None else _ffi.text(piece)

    def token_id(self, piece: str) -> Optional[int]:
        """The id of a vocabulary entry or added token (exact text), or None."""
        token = self._lib.forge_token_id(self._h(), piece.encode())
        return None if token < 0 else int(token)

    def is_special(self, token: int) -> bool:
        return bool(self._lib.forge_token_is_special(self._h(), token))

    # -- chat template ---------------------------------------------------------------------

    def render_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                    thinking: Optional[bool] = None, tools: Optional[Sequence[Mapping[str, Any]]] = None) -> str:
        """The conversation as the model's chat template renders it (Llama 3, ChatML, Gemma,
        Gemma 4). `thinking` is the template's enable_thinking (None: its default, on for Qwen 3,
        off for Gemma 4). Raises UnsupportedError for a model without a known chat format.

        `tools` are the functions the model may call, rendered as the template renders
        apply_chat_template(messages, tools=tools) (Llama 3.1+, Qwen 3, Qwen 3.5, Mistral v0.3 / Nemo, Gemma 4; another family
        raises UnsupportedError naming it): each in transformers' form {"type": "function",
        "function": {"name", "description", "parameters"}} or bare {"name", "description",
        "parameters"}, the parameters a JSON Schema (a dict, or its JSON text). Messages may
        carry what a tool-calling conversation holds: an assistant message's "tool_calls" (each
        {"name", "arguments"}, transformers' {"type": "function", "function": {...}, "id": ...} or
        a ToolCall; arguments a dict or JSON text) and "tool" messages with a call's result (and
        its "tool_call_id")."""
        msgs, keep = _chat_messages(messages)
        flags = _chat_flags(add_generation_prompt, thinking)
        c_tools, n_tools, tool_keep = _chat_tools(tools)
        n = ctypes.c_size_t(0)
        capacity = 2 * sum(len(k) for k in keep + tool_keep if isinstance(k, bytes)) + 1024
        while True:
            buf = ctypes.create_string_buffer(capacity)
            if tools is None:
                status = self._lib.forge_chat_render(self._h(), msgs, len(messages), flags, buf, capacity, ctypes.byref(n))
            else:
                status = self._lib.forge_chat_render_tools(self._h(), msgs, len(messages), c_tools, n_tools, flags, buf,
                                                           capacity, ctypes.byref(n))
            if status == _ffi.ERR_BUFFER_TOO_SMALL:
                capacity = n.value + 1
                continue
            if status != _ffi.OK:
                self._raise(status)
            return buf.raw[: n.value].decode("utf-8", "replace")

    # -- sessions --------------------------------------------------------------------------

    def session(self, n_ctx: int = 0, n_batch: int = 0, n_seq_max: int = 0, overflow: str = "fail",
                n_keep: int = 0, kv_type: str = "default") -> "Session":
        """A new Session (KV cache, scratch, sampler) on this model.

        n_ctx: tokens the KV cache holds (0: min(the model's, 4096)); n_batch: most tokens per
        prefill step (0: 512; also the most tokens classify runs at once); n_seq_max: sequences
        batch_generate decodes at once (0: 1); overflow: what a full context does, "fail",
        "shift" (llama.cpp's context shift) or "recompute"; n_keep: tokens a slide never drops;
        kv_type: the KV cache's type, "f16" (half the memory; the default on GPUs), "f32" (the
        default on CPU devices and for exact models), "q8_0" (0.53-0.56x f16's memory; head_dim a
        multiple of 32) or "default".
        """
        return Session(self, n_ctx=n_ctx, n_batch=n_batch, n_seq_max=n_seq_max, overflow=overflow, n_keep=n_keep,
                       kv_type=kv_type)

    # -- embeddings and reranking, on a session made for the call --------------------------

    def _batch_session(self, longest: int) -> "Session":
        """A session whose batch holds `longest` tokens (and grows toward 8,192, as the CLI's)."""
        limit = max(self.info.n_ctx_train, 1)
        n_batch = min(max(512, min(8192, longest * 8), (longest + 7) // 8 * 8), limit)
        return self.session(n_ctx=n_batch, n_batch=n_batch)

    def embed(self, texts: Sequence[Prompt], **options: Any) -> Any:
        """Session.embed on a session made for this call and freed after it (options as
        Session.embed's). A session of your own is faster for many calls."""
        info = self.embed_info()
        longest = min(info.max_tokens, max([len(self.tokenize(t, add_special=True)) if isinstance(t, str) else len(t) for t in texts] or [1]) + 256)
        with self._batch_session(longest) as s:
            return s.embed(texts, **options)

    def rerank(self, query: str, documents: Sequence[str], **options: Any) -> list[float]:
        """Session.rerank on a session made for this call and freed after it (options as
        Session.rerank's)."""
        q = len(self.tokenize(query))
        longest = q + max([len(self.tokenize(d)) for d in documents] or [1]) + 320
        with self._batch_session(longest) as s:
            return s.rerank(query, documents, **options)

    # -- training --------------------------------------------------------------------------

    def trainer(self, **options: Any) -> "Trainer":
        """A new Trainer (LoRA fine-tuning) on this model; the options are Trainer's."""
        return Trainer(self, **options)

    def training_plan(self, **options: Any) -> MemoryStats:
        """The device memory a Trainer with these options would need, without allocating it
        (forge_trainer_plan): adapters, gradients, AdamW moments, activations, scratch."""
        params, keep = _train_params(self._lib, **options)
        plan = _ffi.sized(_ffi.MemoryStats)
        status = self._lib.forge_trainer_plan(self._h(), ctypes.byref(params), ctypes.byref(plan))
        if status != _ffi.OK:
            self._raise(status)
        return _convert(plan, MemoryStats)


def _json_text(value: Any, what: str) -> bytes:
    """A JSON object given as a dict (json.dumps'd) or as its JSON text, as UTF-8."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, Mapping):
        return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    raise TypeError(f"{what} must be a dict or its JSON text (str), not {type(value).__name__}")


def _chat_messages(messages: Sequence[Mapping[str, Any]]) -> tuple[ctypes.Array, list]:
    keep: list = []
    msgs = _ffi.sized_array(_ffi.ChatMessage, len(messages))
    for i, m in enumerate(messages):
        try:
            role = m["role"]
            calls = m.get("tool_calls") or ()
            # an assistant message that only calls tools may leave its content out (or None)
            content = m["content"] if not calls or m.get("content") is not None else ""
        except (KeyError, TypeError, AttributeError) as e:
            raise TypeError(f"message {i} is not a {{'role': ..., 'content': ...}} mapping: {m!r}") from e
        if not isinstance(role, str) or not isinstance(content, str):
            raise TypeError(f"message {i}: role and content must be str: {m!r}")
        keep += [role.encode(), content.encode("utf-8", "surrogatepass")]
        msgs[i].role, msgs[i].content = keep[-2], keep[-1]
        if calls:
            c_calls = _ffi.sized_array(_ffi.ToolCall, len(calls))
            for j, call in enumerate(calls):
                if isinstance(call, ToolCall):
                    name, arguments, call_id = call.name, call.arguments, call.id
                elif isinstance(call, Mapping):
                    f = call.get("function", call)  # transformers' {"type": "function", "function": {...}, "id": ...}
                    name, arguments, call_id = f.get("name"), f.get("arguments"), call.get("id", f.get("id"))
                else:
                    raise TypeError(f"message {i}: tool call {j} is not a {{'name': ..., 'arguments': ...}} mapping: {call!r}")
                if name is not None:
                    keep.append(str(name).encode("utf-8", "surrogatepass"))
                    c_calls[j].name = keep[-1]
                if arguments is not None:
                    keep.append(_json_text(arguments, f"message {i}: tool call {j}'s arguments"))
                    c_calls[j].arguments = keep[-1]
                if call_id is not None:
                    keep.append(str(call_id).encode("utf-8", "surrogatepass"))
                    c_calls[j].id = keep[-1]
            keep.append(c_calls)
            msgs[i].tool_calls, msgs[i].n_tool_calls = c_calls, len(calls)
        if m.get("tool_call_id") is not None:
            keep.append(str(m["tool_call_id"]).encode("utf-8", "surrogatepass"))
            msgs[i].tool_call_id = keep[-1]
    return msgs, keep


def _chat_tools(tools: Optional[Sequence[Mapping[str, Any]]]) -> tuple[Any, int, list]:
    """forge_tool array of `tools` (transformers' {"type": "function", "function": {...}} or bare
    {"name", "description", "parameters"}), its length, and what it points into."""
    if tools is None:
        return None, 0, []
    if isinstance(tools, (str, bytes, Mapping)):
        raise TypeError("tools is a list of tools ({'name': ..., 'description': ..., 'parameters': ...})")
    keep: list = []
    arr = _ffi.sized_array(_ffi.Tool, len(tools))
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise TypeError(f"tool {i} is not a {{'name': ..., 'parameters': ...}} mapping: {tool!r}")
        f = tool.get("function", tool)
        if not isinstance(f, Mapping):
            raise TypeError(f"tool {i}'s function is not a mapping: {tool!r}")
        name, description, parameters = f.get("name"), f.get("description"), f.get("parameters")
        if name is not None:  # a tool without a name is forge's to refuse, in its words
            keep.append(str(name).encode("utf-8", "surrogatepass"))
            arr[i].name = keep[-1]
        if description is not None:
            keep.append(str(description).encode("utf-8", "surrogatepass"))
            arr[i].description = keep[-1]
        if parameters is not None:
            keep.append(_json_text(parameters, f"tool {i}'s parameters"))
            arr[i].parameters = keep[-1]
    keep.append(arr)
    return arr, len(tools), keep


def _chat_flags(add_generation_prompt: bool, thinking: Optional[bool]) -> int:
    think = 0 if thinking is None else _ffi.CHAT_THINKING_ON if thinking else _ffi.CHAT_THINKING_OFF
    return (0 if add_generation_prompt else _ffi.CHAT_NO_GENERATION_PROMPT) | think


# ---------------------------------------------------------------------------------------------
# Session
# ---------------------------------------------------------------------------------------------

_OVERFLOW = {"fail": 0, "shift": 1, "recompute": 2}
_KV_TYPE = {"default": 0, "f32": 1, "f16": 2, "q8_0": 3}


class _SessionHandle:
    """A C session and the stream running on it, shared by the Session and its Model: the model
    frees its sessions before itself whatever order the garbage collector finalizes them in (a
    Model and its Session that die in one collection have their __del__ run in any order, and
    weak references to them are cleared before)."""

    __slots__ = ("lib", "ptr", "stream", "__weakref__")

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self.ptr: Optional[int] = None
        self.stream: Optional[_StreamState] = None

    def close_stream(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None

    def free(self) -> None:
        self.close_stream()
        if self.ptr is not None:
            self.lib.forge_session_free(self.ptr)
            self.ptr = None


_Child = TypeVar("_Child", bound="_ModelChild")


class _ModelChild:
    """What Session and Trainer share: a C object held in self._box (a handle with `ptr` and
    `free()`) that self.model frees first when it closes, so it never outlives the model; freed
    by close(), by leaving a `with` block, or by the garbage collector."""

    _what = "object"  # the name in the message of a call on a closed one
    model: "Model"
    _box: Any

    def _adopt(self, handle: Optional[int]) -> None:
        self._box.ptr = handle
        self.model._children.add(self._box)

    def close(self) -> None:
        """Frees the object (a session first stops the stream still running on it). Safe to
        call twice."""
        self._box.free()
        self.model._children.discard(self._box)

    @property
    def closed(self) -> bool:
        return self._box.ptr is None

    def __enter__(self: _Child) -> _Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_box", None) is not None and hasattr(self, "model"):
            self.close()

    def _h(self) -> int:
        if self._box.ptr is None:
            raise InvalidArgumentError(Status.INVALID_ARGUMENT, f"the {self._what} is closed")
        return self._box.ptr


class Session(_ModelChild):
    """A session (forge_session) on a Model: its KV cache, scratch buffers and sampler. Made by
    Model.session(). It belongs to one thread at a time; make one per concurrent stream.

    The session keeps an exact-prefix prompt cache across calls: a prompt that continues what
    the cache holds (a chat's next turn) prefills only the new tokens. Only one stream runs on
    a session at a time: any other use of the session (a call, n_past, metrics) first closes
    the stream still open, as breaking out of it would. Use it as a context manager, or call
    close()."""

    _what = "session"

    def __init__(self, model: Model, n_ctx: int = 0, n_batch: int = 0, n_seq_max: int = 0, overflow: str = "fail",
                 n_keep: int = 0, kv_type: str = "default"):
        self.model = model  # keeps the model alive as long as its session
        self._lib = model._lib
        self._box = _SessionHandle(self._lib)
        if overflow not in _OVERFLOW:
            raise ValueError(f"overflow must be one of {sorted(_OVERFLOW)}, not {overflow!r}")
        if kv_type not in _KV_TYPE:
            raise ValueError(f"kv_type must be one of {sorted(_KV_TYPE)}, not {kv_type!r}")
        params = self._lib.forge_session_default_params()
        params.n_ctx, params.n_batch, params.n_seq_max = n_ctx, n_batch, n_seq_max
        params.overflow, params.n_keep, params.kv_type = _OVERFLOW[overflow], n_keep, _KV_TYPE[kv_type]
        handle = ctypes.c_void_p()
        status = self._lib.forge_session_create(model._h(), ctypes.byref(params), ctypes.byref(handle))
        if status != _ffi.OK:  # the message is on the model
            model._raise(status)
        self._adopt(handle.value)

    def _settle(self) -> None:
        """Closes the stream still open on this session, so the next call has it to itself."""
        self._box.close_stream()

    def _message(self) -> str:
        return _ffi.text(self._lib.forge_session_errmsg(self._h()))

    def _raise(self, status: int) -> None:
        raise _error(status, self._message())

    # -- state -----------------------------------------------------------------------------

    @property
    def n_past(self) -> int:
        """Tokens the session's cache holds (the next token is evaluated at this position)."""
        self._settle()
        return int(self._lib.forge_session_n_past(self._h()))

    @property
    def kv_type(self) -> str:
        """The KV cache's type: "f16", "f32" or "q8_0" (the session's kv_type, "default" resolved)."""
        return {v: k for k, v in _KV_TYPE.items()}[self._lib.forge_session_kv_type(self._h())]

    def truncate(self, n_keep: int = 0) -> None:
        """Forgets all but the first n_keep cached tokens (0: a fresh sequence)."""
        self._settle()
        status = self._lib.forge_session_truncate(self._h(), n_keep)
        if status != _ffi.OK:
            self._raise(status)

    @property
    def metrics(self) -> Metrics:
        """The metrics of the session's last generate or chat call."""
        self._settle()
        m = _ffi.sized(_ffi.Metrics)
        status = self._lib.forge_session_metrics(self._h(), ctypes.byref(m))
        if status != _ffi.OK:
            self._raise(status)
        return _metrics(m)

    @property
    def memory(self) -> MemoryStats:
        self._settle()
        stats = _ffi.sized(_ffi.MemoryStats)
        status = self._lib.forge_session_memory(self._h(), ctypes.byref(stats))
        if status != _ffi.OK:
            self._raise(status)
        return _convert(stats, MemoryStats)

    def save(self, path: PathLike) -> None:
        """Writes the session's tokens and KV cache to a state file (atomically)."""
        self._settle()
        status = self._lib.forge_session_save(self._h(), os.fsencode(path))
        if status != _ffi.OK:
            self._raise(status)

    def load(self, path: PathLike) -> None:
        """Replaces the session's state with a file that save() wrote for the same model."""
        self._settle()
        status = self._lib.forge_session_load(self._h(), os.fsencode(path))
        if status != _ffi.OK:
            self._raise(status)

    def prewarm(self, n_prompt: int = 0,
                progress: Optional[Callable[[int, int, Optional[str]], Any]] = None) -> None:
        """Compiles, before the first call, the kernels the session's first calls run
        (forge_session_prewarm): a prompt step of n_prompt tokens (0, or more than n_batch:
        n_batch; 1: a one-token prompt) and a generation step, so that the first prompt does not
        wait for the driver's compiler (lavapipe compiles each kernel when first dispatched, up
        to seconds each while Mesa's shader cache is cold). Run at install time, it fills the
        driver's disk cache so a user's first run starts warm.

        `progress(done, total, kernel)` is called before each kernel with its name, then once
        at the end as (total, total, None). Kernels the model has already prewarmed (on any of
        its sessions) are not counted: a second call reports only (0, 0, None). An exception
        in `progress` never crosses into C: progress is not called again, the kernels are still
        compiled, and the exception is raised when the call returns. n_prompt < 0 raises
        InvalidArgumentError; a driver failure raises DeviceError."""
        h = self._h()
        self._settle()
        if progress is not None and not callable(progress):
            raise TypeError(f"progress must be a callable(done, total, kernel) or None, not {progress!r}")
        raised: list[BaseException] = []

        def on_kernel(user: Optional[int], done: int, total: int, kernel: Optional[bytes]) -> None:
            if raised:  # the callback failed once: leave it alone
                return
            try:
                progress(done, total, None if kernel is None else kernel.decode("utf-8", "replace"))
            except BaseException as e:  # never let an exception cross into C
                raised.append(e)

        callback = _ffi.prewarm_fn() if progress is None else _ffi.prewarm_fn(on_kernel)  # (): NULL
        status = self._lib.forge_session_prewarm(h, n_prompt, callback, None)
        if raised:
            raise raised[0]
        if status != _ffi.OK:
            self._raise(status)

    # -- generation ------------------------------------------------------------------------

    def generate(self, prompt: Prompt = "", *, max_tokens: int = 256, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, min_p: float = 0.0, repeat_penalty: float = 1.0, repeat_window: int = 64,
                 seed: int = 0, stop: Union[str, Sequence[str], None] = None, stop_tokens: Sequence[int] = (),
                 ignore_eos: bool = False, add_special: bool = True, grammar: Optional[str] = None,
                 json_schema: Union[Mapping[str, Any], str, None] = None, json_object: bool = False,
                 choices: Optional[Sequence[str]] = None, trigger: Optional[str] = None,
                 sample_forced: bool = False, lookup: int = 0, draft: Optional["Session"] = None) -> "TokenStream":
        """Generates from `prompt` (text, or a list of token ids) and returns a TokenStream:
        iterate it for the tokens as they come (each a Token: its text, with .id). Breaking out
        of the loop (or closing the stream) stops generation before the next token and leaves
        the session usable, its cache holding the prompt and the tokens seen.

        Sampling as forge's (HuggingFace's order): repeat_penalty over the last repeat_window
        tokens, temperature (0: greedy), top_k (0: off), top_p (1: off), min_p (0: off), then
        a draw seeded by `seed`. `stop`: text (or texts) that ends generation, not emitted;
        `stop_tokens`: ids that do. add_special adds the tokenizer's BOS to a text prompt.
        Errors (a prompt longer than the context, ...) are raised while iterating.

        Structured output (forge.h's constraints), at most one of: `grammar` (GBNF text,
        llama.cpp's format, from rule root), `json_schema` (a dict, or its JSON text; the
        keywords forge enforces are in docs/features.md, any other is UnsupportedError naming
        it), `json_object=True` (any JSON object), `choices` (a list of str: exactly one of
        them). Only tokens the constraint allows are drawn, and the text it forces is written
        without sampling (sample_forced=True samples it too). The call stops when the match is
        whole (StopReason.CONSTRAINT, metrics.constraint_complete True); max_tokens, stop
        strings or a break leave a prefix of a match (constraint_complete False). `trigger`
        makes the constraint lazy: the text is free until the trigger string appears, and the
        text after it must match. A constraint forge cannot compile (a grammar or schema error,
        named by line, rule or keyword) raises while iterating, as other errors do.

        `lookup` (1 to 15; 0: off) turns on prompt lookup (forge_generate_params.lookup): up to
        that many tokens a step are drafted from what followed an earlier occurrence of the
        text's last tokens and checked in one pass; the tokens are the ones plain decoding draws
        with the same seed, faster where the output repeats its prompt (metrics.draft_tokens,
        draft_accepted). Off with a constraint. `draft` (a Session of a smaller model with the
        same vocabulary) drafts instead, `lookup` tokens a step (4 when 0), greedily: the same
        output, sooner the more often it guesses this model's next token
        (forge_generate_params.draft). The draft session is the call's until the stream ends:
        use it for nothing else meanwhile.
        """
        h = self._h()
        self._settle()
        params, keep = _generate_params(self._lib, max_tokens, temperature, top_k, top_p, min_p, repeat_penalty,
                                        repeat_window, seed, stop, stop_tokens, ignore_eos, add_special,
                                        grammar=grammar, json_schema=json_schema, json_object=json_object,
                                        choices=choices, trigger=trigger, sample_forced=sample_forced, lookup=lookup, draft=draft)
        if isinstance(prompt, str):
            data = prompt.encode("utf-8", "surrogatepass")

            def call(p: _ffi.GenerateParams, m: _ffi.Metrics) -> int:
                return self._lib.forge_generate(h, data, len(data), ctypes.byref(p), ctypes.byref(m))
        else:
            ids = list(prompt)
            arr = _ffi.int32_array(ids)

            def call(p: _ffi.GenerateParams, m: _ffi.Metrics) -> int:
                return self._lib.forge_generate_tokens(h, arr, len(ids), ctypes.byref(p), ctypes.byref(m))
        return self._start(call, params, keep)

    def chat(self, messages: Sequence[Mapping[str, Any]], *, tools: Optional[Sequence[Mapping[str, Any]]] = None,
             tool_choice: str = "auto", strict: bool = False, add_generation_prompt: bool = True,
             thinking: Optional[bool] = None, **sampling: Any) -> "TokenStream":
        """Generates the assistant's reply to `messages` ([{"role": "user", "content": ...}, ...]),
        rendered with the model's own chat template, streamed like generate() (same sampling
        and constraint keywords: a constraint applies to the reply, after a thinking reply's
        thinking). Pass the whole conversation each turn: the prompt cache makes a multi-turn
        chat prefill only the new turn. The family's end-of-turn token ends the reply.
        `thinking` is the template's enable_thinking (None: its default, on for Qwen 3, off for
        Gemma 4). A model without a known chat format
        raises UnsupportedError while iterating.

        Tool calling (Llama 3.1+, Qwen 3, Qwen 3.5): `tools` are the functions the model may
        call, as Model.render_chat takes them, and messages may hold earlier calls and "tool"
        results. The reply streams as usual; once the stream has ended, its `tool_calls` are
        the calls forge parsed out of it (ToolCall: name, arguments as a dict) and its `content`
        the rest of the reply. tool_choice="auto" leaves the choice to the model;
        tool_choice="required" makes the reply tool calls only, each naming a tool and matching
        its parameters' schema; strict=True holds a call the model opens to that too (both
        constrain the calls with a grammar, forge_chat_tools' FORGE_CHAT_TOOL_REQUIRED and
        FORGE_CHAT_TOOL_ARGUMENTS, and take no other constraint; a family forge does not
        constrain says so with UnsupportedError). A family without tool calls raises
        UnsupportedError while iterating."""
        h = self._h()
        self._settle()
        if tool_choice not in _TOOL_CHOICE:
            raise ValueError(f"tool_choice must be one of {list(_TOOL_CHOICE)}, not {tool_choice!r}")
        flags = _chat_flags(add_generation_prompt, thinking)
        if tool_choice == "required" or strict:
            if tools is None:
                raise ValueError("tool_choice='required' and strict=True go with tools=")
            given = _constraint_given(sampling)
            if given:
                raise ValueError(f"tool_choice='required' and strict=True constrain the reply themselves: "
                                 f"they take no {' or '.join(given)}")
            flags |= _TOOL_CHOICE[tool_choice] | (_ffi.CHAT_TOOL_ARGUMENTS if strict else 0)
        sampling.setdefault("add_special", True)
        params, keep = _generate_params(self._lib, **_sampling_args(sampling))
        msgs, texts = _chat_messages(messages)
        keep += [msgs, texts]
        n = len(messages)
        if tools is None:
            def call(p: _ffi.GenerateParams, m: _ffi.Metrics) -> int:
                return self._lib.forge_chat(h, msgs, n, flags, ctypes.byref(p), ctypes.byref(m))
            return self._start(call, params, keep)
        c_tools, n_tools, tool_keep = _chat_tools(tools)
        keep += tool_keep
        reply = _ffi.sized(_ffi.ChatReply)

        def call_tools(p: _ffi.GenerateParams, m: _ffi.Metrics) -> int:
            return self._lib.forge_chat_tools(h, msgs, n, c_tools, n_tools, flags, ctypes.byref(p), ctypes.byref(reply),
                                              ctypes.byref(m))
        # the reply's strings are the session's until its next call: copied out on the worker
        # thread as soon as the call returns, before the session can be used again
        return self._start(call_tools, params, keep, parse=lambda: _parse_reply(reply))

    def _start(self, call: Any, params: _ffi.GenerateParams, keep: list, parse: Any = None) -> "TokenStream":
        state = _StreamState(self, call, params, keep, parse)
        self._box.stream = state
        return TokenStream(state)

    def classify(self, prompts: Sequence[Prompt], *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.0, seed: int = 0, add_special: bool = True, logits: bool = False,
                 choices: Optional[Sequence[str]] = None, grammar: Optional[str] = None,
                 json_schema: Union[Mapping[str, Any], str, None] = None, json_object: bool = False,
                 trigger: Optional[str] = None, sample_forced: bool = False) -> list[Classification]:
        """One batched forward pass per batch over `prompts` (texts or token-id lists), no decode
        loop: for each, the token drawn from the logits after its last token (temperature 0:
        the argmax) and its text, and with logits=True those logits (array('f'), n_vocab).
        Each result equals the prompt's own run, whatever the batching. The session's cache is
        scratch here: afterwards it holds no tokens.

        With a constraint (generate()'s keywords) the token is drawn among those it allows
        first; with `choices` (a list of str) each Classification's `choice` is also the index
        of the choice the model writes, token by token, as generate(choices=...) would."""
        h = self._h()
        self._settle()
        n = len(prompts)
        constraint, c_keep = _constraint(grammar=grammar, json_schema=json_schema, json_object=json_object,
                                         choices=choices, trigger=trigger, sample_forced=sample_forced)
        if n == 0:
            return []
        c_prompts = _ffi.sized_array(_ffi.ClassifyPrompt, n)
        keep: list = []
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                data = prompt.encode("utf-8", "surrogatepass")
                keep.append(data)
                c_prompts[i].text, c_prompts[i].text_len = data, len(data)
            else:
                ids = list(prompt)
                arr = _ffi.int32_array(ids)
                keep.append(arr)
                c_prompts[i].tokens, c_prompts[i].n_tokens = arr, len(ids)
        params = self._lib.forge_classify_default_params()
        params.temperature, params.top_k, params.top_p, params.min_p = temperature, top_k, top_p, min_p
        params.seed, params.add_special = seed, int(bool(add_special))
        if constraint is not None:
            params.constraint = ctypes.pointer(constraint)
        n_vocab = self.model.n_vocab
        out_logits = None
        if logits:
            out_logits = (ctypes.c_float * (n * n_vocab))()
            params.logits, params.logits_capacity = out_logits, n * n_vocab
        results = _ffi.sized_array(_ffi.ClassifyResult, n)
        status = self._lib.forge_classify(h, c_prompts, n, ctypes.byref(params), results)
        del c_keep
        if status != _ffi.OK:
            self._raise(status)
        found = []
        for i in range(n):
            r = results[i]
            text = ctypes.string_at(r.text, r.text_len).decode("utf-8", "replace") if r.text else ""
            row = None
            if out_logits is not None:
                row = array("f", bytes(memoryview(out_logits).cast("B")[4 * i * n_vocab: 4 * (i + 1) * n_vocab]))
            choice = int(r.choice) if constraint is not None and r.choice >= 0 else None
            found.append(Classification(id=int(r.token), text=text, n_tokens=int(r.n_tokens), logits=row, choice=choice))
        return found

    def embed(self, texts: Sequence[Prompt], *, pooling: Optional[str] = None, normalize: Optional[bool] = None,
              dim: int = 0, prompt_name: Optional[str] = None, prompt: Optional[str] = None, truncate: bool = True,
              add_special: bool = True) -> Any:
        """Embeds `texts` (a list of str, or of token-id lists) as sentence-transformers'
        encode() does (forge_embed): batched as classify batches, each vector independent of
        the others in the call. Returns a numpy float32 array of shape [len(texts), dim] when
        numpy imports, else a list of lists of float.

        pooling: None (the checkpoint's Pooling module; without one the last token), "last",
        "mean" or "cls". normalize: None (as the checkpoint declares: its Normalize module,
        before truncation), False (never) or True (L2-normalize the vector returned, after
        truncation). dim: keep the first dim values (Matryoshka); 0: all. prompt_name: a
        prompt of config_sentence_transformers.json ("query", "document"; None: its
        default_prompt_name, or none) put before each text; prompt: the prefix text itself
        (wins over prompt_name; "" for none). Token-id lists get no prefix. truncate: a text
        longer than the model's limit (Model.embed_info().max_tokens) keeps its first tokens
        and the tokenizer's closing ones; False raises LimitError naming it instead. A
        prompt_name the model lacks raises InvalidArgumentError naming the ones it has. The
        session's cache is scratch here, as for classify."""
        h = self._h()
        self._settle()
        if isinstance(texts, (str, bytes)):
            raise TypeError("texts is a list of texts (str) or of token-id lists: embed([text]) for one")
        if pooling not in _POOLING:
            raise ValueError(f"pooling must be None or one of {sorted(k for k in _POOLING if k)}, not {pooling!r}")
        params = self._lib.forge_embed_default_params()
        params.pooling = _POOLING[pooling]
        params.normalize = -1 if normalize is None else int(bool(normalize))
        params.dim, params.truncate, params.add_special = dim, int(bool(truncate)), int(bool(add_special))
        keep: list = []
        if prompt_name is not None:
            keep.append(prompt_name.encode("utf-8", "surrogatepass"))
            params.prompt_name = keep[-1]
        if prompt is not None:
            keep.append(prompt.encode("utf-8", "surrogatepass"))
            params.prompt = keep[-1]
        n = len(texts)
        np = _numpy()
        c_texts = _ffi.sized_array(_ffi.ClassifyPrompt, n)
        for i, text in enumerate(texts):
            if isinstance(text, str):
                data = text.encode("utf-8", "surrogatepass")
                keep.append(data)
                c_texts[i].text, c_texts[i].text_len = data, len(data)
            elif isinstance(text, (bytes, int)):
                raise TypeError(f"text {i} is neither a str nor a list of token ids: {text!r}")
            else:
                ids = list(text)
                arr = _ffi.int32_array(ids)
                keep.append(arr)
                c_texts[i].tokens, c_texts[i].n_tokens = arr, len(ids)
        if n == 0:
            if np is None:
                return []
            return np.zeros((0, dim if dim > 0 else self.model.embed_info().dim), dtype=np.float32)
        # the vector's length: forge writes it with no vectors asked for (capacity 0)
        out_dim = ctypes.c_int(0)
        status = self._lib.forge_embed(h, c_texts, n, ctypes.byref(params), None, 0, ctypes.byref(out_dim))
        if status not in (_ffi.OK, _ffi.ERR_BUFFER_TOO_SMALL):
            self._raise(status)
        d = out_dim.value
        if np is not None:
            found = np.zeros((n, d), dtype=np.float32)
            vectors = found.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        else:
            found = (ctypes.c_float * (n * d))()
            vectors = found
        status = self._lib.forge_embed(h, c_texts, n, ctypes.byref(params), vectors, n * d, ctypes.byref(out_dim))
        del keep
        if status != _ffi.OK:
            self._raise(status)
        if np is not None:
            return found
        return [found[i * d:(i + 1) * d] for i in range(n)]

    def rerank(self, query: str, documents: Sequence[str], *, instruction: Optional[str] = None, raw: bool = False,
               truncate: bool = True) -> list[float]:
        """Scores each of `documents` against `query` (forge_rerank), higher for more relevant:
        a sequence-classification checkpoint's head (the pair as its tokenizer joins them, the
        logit through a sigmoid, as sentence-transformers' CrossEncoder.predict), or a causal
        LM with "yes" and "no" tokens as Qwen3-Reranker's model card prompts it (P("yes")).
        instruction: Qwen3-Reranker's <Instruct> (None: its default). raw: the logit instead
        of the probability. truncate: a pair longer than the context loses tokens from its
        longer part's end; False raises LimitError instead. A model with neither formulation
        raises UnsupportedError saying what it lacks."""
        h = self._h()
        self._settle()
        if isinstance(documents, (str, bytes)):
            raise TypeError("documents is a list of str: rerank(query, [document]) for one")
        if not isinstance(query, str) or not all(isinstance(d, str) for d in documents):
            raise TypeError("rerank takes a query (str) and documents (a list of str)")
        n = len(documents)
        if n == 0:
            return []
        params = self._lib.forge_rerank_default_params()
        keep: list = []
        if instruction is not None:
            keep.append(instruction.encode("utf-8", "surrogatepass"))
            params.instruction = keep[-1]
        params.raw, params.truncate = int(bool(raw)), int(bool(truncate))
        docs = [d.encode("utf-8", "surrogatepass") for d in documents]
        arr = (ctypes.c_char_p * n)(*docs)
        scores = (ctypes.c_float * n)()
        status = self._lib.forge_rerank(h, query.encode("utf-8", "surrogatepass"), arr, n, ctypes.byref(params), scores)
        del keep
        if status != _ffi.OK:
            self._raise(status)
        return list(scores)

    def batch_generate(self, prompts: Sequence[Prompt], *, max_tokens: int = 256, temperature: float = 0.0,
                       top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, repeat_penalty: float = 1.0,
                       repeat_window: int = 64, seed: int = 0, stop: Union[str, Sequence[str], None] = None,
                       stop_tokens: Sequence[int] = (), ignore_eos: bool = False, add_special: bool = True,
                       grammar: Optional[str] = None, json_schema: Union[Mapping[str, Any], str, None] = None,
                       json_object: bool = False, choices: Optional[Sequence[str]] = None,
                       trigger: Optional[str] = None, sample_forced: bool = False) -> list[Completion]:
        """Generates for every prompt together (forge_batch_generate): the session decodes up to
        its n_seq_max sequences in lockstep, a finished one's place taken by the next prompt.
        Sampling and constraints as generate()'s, the same for every prompt (each draws from its
        own generator seeded by `seed`, so each Completion equals generate() of its prompt alone
        on a fresh session). A prompt that fails on its own (too long, empty) gets
        Completion.error and the others still run; a device failure raises. The session's cache
        is scratch here."""
        h = self._h()
        self._settle()
        n = len(prompts)
        if n == 0:
            return []
        texts: list[list[str]] = [[] for _ in range(n)]
        ids: list[list[int]] = [[] for _ in range(n)]
        raised: list[BaseException] = []

        def on_token(user: Optional[int], token: int, text: Any, text_len: int) -> int:
            try:
                i = (user or 0) - 1  # user_data carries the item's index + 1 (0 reads back as None)
                texts[i].append(ctypes.string_at(text, text_len).decode("utf-8", "replace") if text_len else "")
                if token >= 0:
                    ids[i].append(token)
                return 0
            except BaseException as e:  # never let an exception cross into C
                raised.append(e)
                return 1

        callback = _ffi.token_fn(on_token)
        params, keep = _generate_params(self._lib, max_tokens, temperature, top_k, top_p, min_p, repeat_penalty,
                                        repeat_window, seed, stop, stop_tokens, ignore_eos, add_special,
                                        grammar=grammar, json_schema=json_schema, json_object=json_object,
                                        choices=choices, trigger=trigger, sample_forced=sample_forced)
        per_item = (_ffi.GenerateParams * n)()
        items = _ffi.sized_array(_ffi.BatchItem, n)
        for i, prompt in enumerate(prompts):
            per_item[i] = params  # a copy
            per_item[i].on_token, per_item[i].user_data = callback, i + 1
            items[i].params = ctypes.pointer(per_item[i])
            if isinstance(prompt, str):
                data = prompt.encode("utf-8", "surrogatepass")
                keep.append(data)
                items[i].text, items[i].text_len = data, len(data)
            else:
                toks = list(prompt)
                arr = _ffi.int32_array(toks)
                keep.append(arr)
                items[i].tokens, items[i].n_tokens = arr, len(toks)
        results = _ffi.sized_array(_ffi.BatchResult, n)
        status = self._lib.forge_batch_generate(h, items, n, results)
        if raised:
            raise raised[0]
        if status != _ffi.OK:
            self._raise(status)
        failed = [i for i in range(n) if results[i].status != _ffi.OK]
        completions = []
        for i in range(n):
            r = results[i]
            if r.status != _ffi.OK:
                # forge keeps the message of the last failed item only, on the session.
                message = self._message() if i == failed[-1] else f"prompt {i} failed"
                completions.append(Completion(text="", tokens=[], metrics=None, error=_error(r.status, message)))
            else:
                completions.append(Completion(text="".join(texts[i]), tokens=ids[i], metrics=_metrics(r.metrics)))
        return completions


_CONSTRAINTS = ("grammar", "json_schema", "json_object", "choices")
_SAMPLING = ("max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_window", "seed", "stop",
             "stop_tokens", "ignore_eos", "add_special") + _CONSTRAINTS + ("trigger", "sample_forced", "lookup", "draft")
_TOOL_CHOICE = {"auto": 0, "required": _ffi.CHAT_TOOL_REQUIRED | _ffi.CHAT_TOOL_ARGUMENTS}


def _sampling_args(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(kwargs) - set(_SAMPLING)
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {sorted(unknown)}; sampling takes {list(_SAMPLING)}")
    defaults = dict(max_tokens=256, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                    repeat_window=64, seed=0, stop=None, stop_tokens=(), ignore_eos=False, add_special=True,
                    grammar=None, json_schema=None, json_object=False, choices=None, trigger=None, sample_forced=False,
                    lookup=0, draft=None)
    defaults.update(kwargs)
    return defaults


def _constraint_given(kwargs: Mapping[str, Any]) -> list[str]:
    """The constraint keywords set in kwargs, named as "grammar=", ..., "json_object=True"."""
    return [("json_object=True" if k == "json_object" else f"{k}=") for k in _CONSTRAINTS
            if (bool(kwargs.get(k)) if k == "json_object" else kwargs.get(k) is not None)]


def _constraint(*, grammar: Optional[str] = None, json_schema: Union[Mapping[str, Any], str, None] = None,
                json_object: bool = False, choices: Optional[Sequence[str]] = None, trigger: Optional[str] = None,
                sample_forced: bool = False) -> tuple[Optional[_ffi.Constraint], list]:
    """forge_constraint from the keywords (None when none is given), and the objects its
    pointers point into (to be kept alive as long as it is used)."""
    given = _constraint_given(dict(grammar=grammar, json_schema=json_schema, json_object=json_object, choices=choices))
    if len(given) > 1:
        raise ValueError(f"one constraint at a time: {' and '.join(given)} were both given" if len(given) == 2 else
                         f"one constraint at a time: {', '.join(given)} were given")
    if not given:
        if trigger is not None or sample_forced:
            raise ValueError("trigger= and sample_forced= go with a constraint: grammar=, json_schema=, "
                             "json_object=True or choices=")
        return None, []
    c = _ffi.sized(_ffi.Constraint)
    keep: list = [c]
    if grammar is not None:
        if not isinstance(grammar, str):
            raise TypeError(f"grammar must be GBNF text (str), not {type(grammar).__name__}")
        c.kind = _ffi.CONSTRAINT_GBNF
        keep.append(grammar.encode("utf-8", "surrogatepass"))
        c.text, c.text_len = keep[-1], len(keep[-1])
    elif json_schema is not None:
        c.kind = _ffi.CONSTRAINT_JSON_SCHEMA
        keep.append(_json_text(json_schema, "json_schema"))
        c.text, c.text_len = keep[-1], len(keep[-1])
    elif json_object:
        c.kind = _ffi.CONSTRAINT_JSON_OBJECT
    else:
        if isinstance(choices, (str, bytes)) or not all(isinstance(x, str) for x in choices):
            raise TypeError(f"choices must be a list of str, not {choices!r}")
        encoded = [x.encode("utf-8", "surrogatepass") for x in choices]
        arr = (ctypes.c_char_p * max(len(encoded), 1))(*encoded)
        keep += [encoded, arr]
        c.kind = _ffi.CONSTRAINT_CHOICES
        c.choices, c.n_choices = ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p)), len(encoded)
    if trigger is not None:
        keep.append(trigger.encode("utf-8", "surrogatepass"))
        c.trigger = keep[-1]
    c.sample_forced = int(bool(sample_forced))
    return c, keep


def _parse_reply(r: _ffi.ChatReply) -> tuple[str, list[ToolCall]]:
    """The content and the tool calls of a forge_chat_reply, copied out of the session's strings."""
    content = ctypes.string_at(r.content, r.content_len).decode("utf-8", "replace") if r.content else ""
    calls = [ToolCall(name=_ffi.text(r.tool_names[i]), arguments=json.loads(_ffi.text(r.tool_arguments[i]) or "{}"),
                      id=_ffi.text(r.tool_ids[i]))
             for i in range(r.n_tool_calls)]
    return content, calls


def _generate_params(lib: ctypes.CDLL, max_tokens: int, temperature: float, top_k: int, top_p: float, min_p: float,
                     repeat_penalty: float, repeat_window: int, seed: int, stop: Union[str, Sequence[str], None],
                     stop_tokens: Sequence[int], ignore_eos: bool, add_special: bool, *,
                     grammar: Optional[str] = None, json_schema: Union[Mapping[str, Any], str, None] = None,
                     json_object: bool = False, choices: Optional[Sequence[str]] = None, trigger: Optional[str] = None,
                     sample_forced: bool = False, lookup: int = 0,
                     draft: Optional["Session"] = None) -> tuple[_ffi.GenerateParams, list]:
    """forge_generate_params from the keywords, and the objects its pointers point into (to be
    kept alive as long as the params are used)."""
    constraint, keep = _constraint(grammar=grammar, json_schema=json_schema, json_object=json_object, choices=choices,
                                   trigger=trigger, sample_forced=sample_forced)
    p = lib.forge_generate_default_params()
    if constraint is not None:
        p.constraint = ctypes.pointer(constraint)
    p.max_tokens, p.temperature, p.top_k, p.top_p, p.min_p = max_tokens, temperature, top_k, top_p, min_p
    p.repeat_penalty, p.repeat_window, p.seed = repeat_penalty, repeat_window, seed
    p.ignore_eos, p.add_special = int(bool(ignore_eos)), int(bool(add_special))
    p.lookup = lookup
    if draft is not None:
        if not isinstance(draft, Session):
            raise TypeError(f"draft must be a Session (of a draft model), not {type(draft).__name__}")
        draft._settle()
        p.draft = draft._h()
        keep.append(draft)
    strings = [stop] if isinstance(stop, str) else list(stop or [])
    if strings:
        encoded = [s.encode("utf-8", "surrogatepass") for s in strings]
        arr = (ctypes.c_char_p * len(encoded))(*encoded)
        keep += [encoded, arr]
        p.stop_strings, p.n_stop_strings = ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p)), len(encoded)
    ids = list(stop_tokens)
    if ids:
        arr = _ffi.int32_array(ids)
        keep.append(arr)
        p.stop_tokens, p.n_stop_tokens = arr, len(ids)
    return p, keep


# ---------------------------------------------------------------------------------------------
# Streaming: the C call runs on a worker thread; its token callback hands each token over and
# waits until the consumer asks for the next one, so a consumer that stops (break, close) stops
# generation before one more token is computed: the callback then returns non-zero, which
# forge.h defines as "stop" (FORGE_STOP_CALLBACK, session usable).
# ---------------------------------------------------------------------------------------------

_END = object()


class _StreamState:
    """What the worker thread shares with the consumer. The TokenStream the user holds points
    here, not the other way round, so dropping the TokenStream closes the stream even while the
    worker waits in the callback."""

    def __init__(self, session: Session, call: Any, params: _ffi.GenerateParams, keep: list, parse: Any = None):
        self.session = session
        self.call = call
        self.params = params
        self.keep = keep
        self.parse = parse  # chat with tools: reads the reply (content, tool calls) after the call
        self.reply: Optional[tuple[str, list[ToolCall]]] = None
        self.metrics_c = _ffi.sized(_ffi.Metrics)
        self.items: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self.go = threading.Semaphore(0)
        self.stop = False
        self.owed = False  # the worker waits for a go: the consumer has the last token
        self.thread: Optional[threading.Thread] = None
        self.done = False
        self.status = _ffi.OK
        self.raised: Optional[BaseException] = None
        self.callback = _ffi.token_fn(self._on_token)
        self.params.on_token = self.callback
        self.tokens: list[int] = []
        self.text: list[str] = []

    # worker side ----------------------------------------------------------------------------

    def _on_token(self, user: Any, token: int, text: Any, text_len: int) -> int:
        try:
            self.items.put((token, ctypes.string_at(text, text_len).decode("utf-8", "replace") if text_len else ""))
            if token < 0:  # the last call delivers held-back text; its return is not read
                return 0
            self.go.acquire()
            return 1 if self.stop else 0
        except BaseException as e:  # never let an exception cross into C: stop instead
            self.raised = e
            return 1

    def _run(self) -> None:
        try:
            self.status = self.call(self.params, self.metrics_c)
            if self.status == _ffi.OK and self.parse is not None:
                self.reply = self.parse()
        except BaseException as e:
            self.raised = e
        finally:
            self.items.put(_END)

    # consumer side --------------------------------------------------------------------------

    def next(self) -> Token:
        if self.done:
            raise StopIteration
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="forge-generate", daemon=True)
            self.thread.start()
        if self.owed:
            self.owed = False
            self.go.release()
        while True:
            item = self.items.get()
            if item is _END:
                self._finish()
                if self.raised is not None:
                    raise self.raised
                if self.status != _ffi.OK:
                    self.session._raise(self.status)
                raise StopIteration
            token, text = item
            self.text.append(text)
            if token >= 0:
                self.owed = True
                self.tokens.append(token)
                return Token(text, token)
            if text:
                return Token(text, -1)

    def close(self) -> None:
        if self.done:
            return
        if self.thread is None:  # never started: nothing ran
            self.done = True
            self._detach()
            return
        self.stop = True
        while True:
            if self.owed:
                self.owed = False
                self.go.release()
            item = self.items.get()
            if item is _END:
                break
            if item[0] >= 0:
                self.owed = True
        self._finish()

    def _finish(self) -> None:
        if self.thread is not None:
            self.thread.join()
        self.done = True
        self._detach()

    def _detach(self) -> None:
        if self.session._box.stream is self:
            self.session._box.stream = None


class TokenStream:
    """The tokens of one generate() or chat() call, as they come: iterate it (each item a
    Token, a str with .id). Breaking out, close(), or leaving a `with` block stops generation
    before the next token; the session stays usable. After the stream ends, `metrics` holds the
    call's Metrics (stop_reason CALLBACK when the consumer stopped it), `tokens` the generated
    ids and `text` the text so far; a chat with tools= also has the reply's `tool_calls` and its
    `content` without them. Errors of the call are raised from the iteration."""

    def __init__(self, state: _StreamState):
        self._state = state

    def __iter__(self) -> Iterator[Token]:
        return self

    def __next__(self) -> Token:
        return self._state.next()

    def close(self) -> None:
        """Stops generation (if running) and waits for the call to return."""
        self._state.close()

    def __enter__(self) -> "TokenStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        state = getattr(self, "_state", None)
        if state is not None:
            state.close()

    @property
    def done(self) -> bool:
        return self._state.done

    @property
    def tokens(self) -> list[int]:
        """The generated token ids so far."""
        return list(self._state.tokens)

    @property
    def text(self) -> str:
        """The generated text so far."""
        return "".join(self._state.text)

    @property
    def metrics(self) -> Optional[Metrics]:
        """The call's metrics once it has ended (None before)."""
        return _metrics(self._state.metrics_c) if self._state.done and self._state.thread is not None else None

    @property
    def tool_calls(self) -> list[ToolCall]:
        """Session.chat(..., tools=...): the tool calls forge parsed out of the reply (each a
        ToolCall: name, arguments as a dict), once the stream has ended; [] before, and
        without tools."""
        return list(self._state.reply[1]) if self._state.done and self._state.reply else []

    @property
    def content(self) -> str:
        """Session.chat(..., tools=...): the reply without its tool calls (and without a thinking
        reply's thinking), trimmed, once the stream has ended ("" before). Otherwise the same
        as `text`."""
        if self._state.parse is None:
            return self.text
        return self._state.reply[0] if self._state.done and self._state.reply else ""

    def read(self) -> str:
        """Runs the stream to its end and returns the whole generated text."""
        for _ in self:
            pass
        return self.text


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------

_SCHEDULES = {"constant": 0, "linear": 1, "cosine": 2}
_LOSSES = {"cross_entropy": 0, "mse_hidden": 1, "mse_logits": 2}
_ADAPTER_FORMATS = {"peft": 0, "mlx": 1}


@dataclass(frozen=True)
class TrainStats:
    """forge_train_stats: one training step's numbers."""

    loss: float               # the batch's mean loss before the update
    tokens: int               # counted targets (cross-entropy) or positions (MSE)
    grad_norm: float          # global gradient norm before clipping (0 unless applied)
    lr: float                 # learning rate applied (0 unless applied)
    applied: bool             # this step ended an accumulation and updated the adapters
    step: int                 # optimizer steps done so far
    ms: float                 # wall time of the call
    peak_device_bytes: int


def _choice(name: str, value: str, table: Mapping[str, int]) -> int:
    if value not in table:
        raise ValueError(f"{name} must be one of {sorted(table)}, not {value!r}")
    return table[value]


def _train_params(lib: ctypes.CDLL, *, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0,
                  targets: Union[str, Sequence[str]] = "q_proj,v_proj", n_layers: int = 0, seed: int = 0,
                  adapter: Optional[PathLike] = None, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                  eps: float = 1e-8, weight_decay: float = 0.01, schedule: str = "constant", warmup_steps: int = 0,
                  total_steps: int = 0, max_grad_norm: float = 0.0, accum_steps: int = 1, loss: str = "cross_entropy",
                  max_batch: int = 4, max_seq: int = 512, grad_checkpoint: Optional[bool] = None,
                  profile: bool = False) -> tuple[_ffi.TrainParams, list[bytes]]:
    params = lib.forge_train_default_params()
    keep: list[bytes] = []  # the strings the struct points to, alive as long as it is used
    if not isinstance(targets, str):
        targets = ",".join(targets)
    keep.append(targets.encode())
    params.targets = keep[-1]
    if adapter is not None:
        keep.append(os.fsencode(adapter))
        params.adapter_path = keep[-1]
    params.rank, params.alpha, params.dropout, params.n_layers, params.seed = rank, alpha, dropout, n_layers, seed
    params.lr, (params.beta1, params.beta2), params.eps, params.weight_decay = lr, betas, eps, weight_decay
    params.schedule = _choice("schedule", schedule, _SCHEDULES)
    params.warmup_steps, params.total_steps, params.max_grad_norm = warmup_steps, total_steps, max_grad_norm
    params.accum_steps, params.loss = accum_steps, _choice("loss", loss, _LOSSES)
    params.max_batch, params.max_seq = max_batch, max_seq
    params.grad_checkpoint = -1 if grad_checkpoint is None else int(bool(grad_checkpoint))
    params.profile = int(bool(profile))
    return params, keep


class _TrainerHandle:
    """A C trainer, freed by its Trainer or, first, by its Model's close (as _SessionHandle)."""

    __slots__ = ("lib", "ptr", "__weakref__")

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self.ptr: Optional[int] = None

    def free(self) -> None:
        if self.ptr is not None:
            self.lib.forge_trainer_free(self.ptr)
            self.ptr = None


class Trainer(_ModelChild):
    """LoRA fine-tuning of a Model (forge_trainer): low-rank adapters on chosen projections,
    trained on the device with AdamW while the base weights stay frozen. Made by
    Model.trainer(**options) or Trainer(model, **options).

    Options (forge_train_params): rank (8), alpha (16.0; scale = alpha / rank), dropout (0.0),
    targets ("q_proj,v_proj", a list of HF projection names, or "all"), n_layers (0: every
    layer; else the last n), seed, adapter (start from a PEFT or mlx-lm adapter directory),
    lr (1e-3), betas ((0.9, 0.999)), eps, weight_decay (0.01), schedule ("constant", "linear",
    "cosine"), warmup_steps, total_steps (required by linear and cosine), max_grad_norm (0: no
    clipping), accum_steps (1), loss ("cross_entropy", "mse_hidden", "mse_logits"), max_batch
    (4) and max_seq (512) (the largest batch; the device plan), grad_checkpoint (None: forge
    decides), profile.

    A batch is a list of sequences, each a str (tokenized with the model's special tokens) or a
    list of token ids; rows may differ in length. labels (same shape, -100 = not counted; None:
    the tokens themselves, shifted inside as HF does) and mask (0/1 per position) are optional;
    targets (MSE losses) is a float32 buffer or list of n_seqs x longest x (hidden or n_vocab).
    Use it as a context manager, or call close(); a trainer belongs to one thread at a time.
    """

    _what = "trainer"

    def __init__(self, model: Model, **options: Any):
        self.model = model  # keeps the model alive as long as its trainer
        self._lib = model._lib
        self._box = _TrainerHandle(self._lib)
        params, keep = _train_params(self._lib, **options)
        self._loss = params.loss
        handle = ctypes.c_void_p()
        status = self._lib.forge_trainer_create(model._h(), ctypes.byref(params), ctypes.byref(handle))
        del keep
        if status != _ffi.OK:  # the message is on the model
            model._raise(status)
        self._adopt(handle.value)

    def _raise(self, status: int) -> None:
        raise _error(status, _ffi.text(self._lib.forge_trainer_errmsg(self._h())))

    def _batch(self, sequences: Sequence[Union[str, Sequence[int]]], labels: Optional[Sequence[Sequence[int]]],
               mask: Optional[Sequence[Sequence[int]]], targets: Any) -> tuple[_ffi.TrainBatch, list]:
        if isinstance(sequences, (str, bytes)) or not len(sequences):
            raise ValueError("a batch is a non-empty list of sequences (str or lists of token ids)")
        rows = [self.model.tokenize(q, add_special=True) if isinstance(q, str) else [int(t) for t in q]
                for q in sequences]
        n, width = len(rows), max(len(r) for r in rows)
        if width == 0:
            raise ValueError("every sequence of the batch is empty")

        def grid(values: Optional[Sequence[Sequence[int]]], what: str, pad: int, ctype: Any) -> Any:
            if values is None:
                return None
            if len(values) != n:
                raise ValueError(f"{what} has {len(values)} rows for {n} sequences")
            out = (ctype * (n * width))(*([pad] * (n * width)))
            for i, (row, vals) in enumerate(zip(rows, values)):
                vals = list(vals)
                if len(vals) != len(row):
                    raise ValueError(f"{what} row {i} has {len(vals)} entries for {len(row)} tokens")
                out[i * width:i * width + len(vals)] = vals
            return out

        tokens = grid(rows, "tokens", 0, ctypes.c_int32)
        lengths = (ctypes.c_int32 * n)(*[len(r) for r in rows])
        lab = grid(labels, "labels", -100, ctypes.c_int32)
        msk = grid(mask, "mask", 0, ctypes.c_uint8)
        tgt = None
        if self._loss != _LOSSES["cross_entropy"]:
            if targets is None:
                raise ValueError("the MSE losses need targets")
            info = self.model.info
            dim = info.hidden if self._loss == _LOSSES["mse_hidden"] else info.n_vocab
            want = n * width * dim
            if isinstance(targets, (list, tuple)):
                tgt = (ctypes.c_float * want)(*targets) if len(targets) == want else None
                got = len(targets)
            else:
                view = memoryview(targets).cast("B")
                got = view.nbytes // 4
                tgt = (ctypes.c_float * want).from_buffer_copy(view) if view.nbytes == 4 * want else None
            if tgt is None:
                raise ValueError(f"targets has {got} floats, the batch needs {n} x {width} x {dim} = {want}")
        elif targets is not None:
            raise ValueError("targets go with the MSE losses (loss='mse_hidden' or 'mse_logits')")
        batch = _ffi.sized(_ffi.TrainBatch, n_seqs=n, seq_len=width, tokens=tokens, lengths=lengths, labels=lab, mask=msk,
                           targets=tgt)
        return batch, [tokens, lengths, lab, msk, tgt]

    def step(self, sequences: Sequence[Union[str, Sequence[int]]], labels: Optional[Sequence[Sequence[int]]] = None,
             mask: Optional[Sequence[Sequence[int]]] = None, targets: Any = None) -> TrainStats:
        """One forward and backward pass on the batch; every accum_steps-th call updates the
        adapters (stats.applied). Raises LimitError past max_batch / max_seq,
        InvalidArgumentError on an id outside the vocabulary or a batch with nothing counted."""
        batch, keep = self._batch(sequences, labels, mask, targets)
        stats = _ffi.sized(_ffi.TrainStats)
        status = self._lib.forge_train_step(self._h(), ctypes.byref(batch), ctypes.byref(stats))
        del keep
        if status != _ffi.OK:
            self._raise(status)
        return _convert(stats, TrainStats)

    def eval(self, sequences: Sequence[Union[str, Sequence[int]]], labels: Optional[Sequence[Sequence[int]]] = None,
             mask: Optional[Sequence[Sequence[int]]] = None, targets: Any = None) -> tuple[float, int]:
        """The batch's mean loss and counted targets, without updating anything (no dropout)."""
        batch, keep = self._batch(sequences, labels, mask, targets)
        loss, tokens = ctypes.c_double(0), ctypes.c_int64(0)
        status = self._lib.forge_train_eval(self._h(), ctypes.byref(batch), ctypes.byref(loss), ctypes.byref(tokens))
        del keep
        if status != _ffi.OK:
            self._raise(status)
        return loss.value, tokens.value

    def save(self, directory: PathLike, format: str = "peft") -> None:
        """Writes the adapters to `directory` (created if missing), each file atomically:
        "peft" (adapter_config.json + adapter_model.safetensors, loads in transformers + peft)
        or "mlx" (adapters.safetensors, loads in mlx-lm). Model(path, adapter=directory) and
        Trainer(adapter=directory) read both."""
        status = self._lib.forge_trainer_save(self._h(), os.fsencode(directory),
                                              _choice("format", format, _ADAPTER_FORMATS))
        if status != _ffi.OK:
            self._raise(status)

    @property
    def memory(self) -> MemoryStats:
        stats = _ffi.sized(_ffi.MemoryStats)
        status = self._lib.forge_trainer_memory(self._h(), ctypes.byref(stats))
        if status != _ffi.OK:
            self._raise(status)
        return _convert(stats, MemoryStats)

    @property
    def profile(self) -> dict:
        """With profile=True: device time per kernel, {"kernel": {"calls": N, "ms": T}, ...}."""
        import json
        capacity = 1 << 14
        while True:
            buf = ctypes.create_string_buffer(capacity)
            n = ctypes.c_size_t(0)
            status = self._lib.forge_trainer_profile(self._h(), buf, capacity, ctypes.byref(n))
            if status == _ffi.ERR_BUFFER_TOO_SMALL and capacity < (1 << 26):
                capacity *= 4
                continue
            if status != _ffi.OK:
                self._raise(status)
            return json.loads(buf.value.decode())
