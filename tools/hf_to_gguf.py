#!/usr/bin/env python3
"""HF checkpoint -> GGUF, following llama.cpp's converter conventions; numpy only.

    python3 tools/hf_to_gguf.py HF_DIR OUT.gguf [--outtype f32|f16|q8_0|q4_0]
    python3 tools/hf_to_gguf.py --verify OUT.gguf PARITY_DIR [--tol 1e-4]  # float64 forward vs HF logits
    python3 tools/hf_to_gguf.py --make-fixtures tests/fixtures   # the committed GGUF fixtures

Architectures: llama (Mistral too), qwen2, qwen3, qwen3moe, gemma2, gemma3 (text), gemma4 (text), qwen35,
qwen35moe. This is a numpy re-statement of
what llama.cpp's `convert_hf_to_gguf.py` (now the `conversion/` package: base.py TextModel,
llama.py LlamaModel, qwen.py Qwen2Model/Qwen3Model, gemma.py Gemma2Model/Gemma3Model) and
gguf-py (constants.py, tensor_mapping.py, gguf_writer.py) do; see tests/fixtures/gguf/README.md
for the keys written per architecture and where each convention comes from.

  * tensor names: token_embd, output_norm, output, rope_freqs, blk.N.{attn_norm, attn_q, attn_k,
    attn_v, attn_output, attn_q_norm, attn_k_norm, ffn_norm, ffn_gate, ffn_up, ffn_down}, and for
    Gemma 2/3 blk.N.post_attention_norm / post_ffw_norm (pre_feedforward_layernorm -> ffn_norm).
  * llama: q_proj/k_proj rows permuted per head (LlamaModel.permute) so that llama.cpp's "normal"
    RoPE on adjacent pairs equals HF's rotate-half; llama3 RoPE scaling stored as the F32 tensor
    rope_freqs.weight of per-frequency divisors (LlamaModel.generate_extra_tensors).
  * gemma2/gemma3: every tensor whose HF name ends in "norm.weight" gets +1 (the GGUF weight is the
    effective multiplier), computed in the source dtype as torch does; lm_head is dropped.
  * outtype f32: every tensor F32. f16: 1-D tensors and *_norm.weight F32, the rest F16.
  * gemma2/gemma3 extension: `{arch}.attention.scale` = query_pre_attn_scalar**-0.5 is written
    only when it differs from the scale llama.cpp hard-codes (1/sqrt(head_dim), or
    1/sqrt(hidden/heads) for the 27B layer counts); llama.cpp itself does not read it for these
    architectures. `gemma3.attention.sliding_window_pattern` (bool per layer) likewise only when the
    layer types differ from llama.cpp's fixed pattern of 6.
  * qwen3moe (Qwen3MoeModel / Qwen2MoeModel): {arch}.expert_count, expert_used_count,
    expert_feed_forward_length; the router mlp.gate -> blk.N.ffn_gate_inp; the experts stacked
    into blk.N.ffn_{gate,up,down}_exps [E, rows, cols] (per-expert tensors, or transformers 5's
    fused experts.gate_up_proj split into its gate and up halves). Extensions: a dense layer
    (mlp_only_layers, which llama.cpp cannot load) keeps blk.N.ffn_{gate,up,down}, and
    `{arch}.expert_weights_norm` = false is written where norm_topk_prob is false (llama.cpp's
    graph always renormalizes the chosen experts' weights).
  * gemma4 (Gemma4Model): per-layer arrays (INT32) for feed_forward_length and
    attention.head_count_kv where layers differ; key_length / key_length_swa the full and sliding
    head sizes; sliding_window_pattern (bool a layer), shared_kv_layers,
    embedding_length_per_layer_input, rope.freq_base(_swa), rope.dimension_count(_swa); norms as
    stored (no +1); rope_freqs.weight = 1 for the rotating pairs of proportional RoPE, 1e30 for the
    rest; the per-layer input, layer_output_scale and MoE tensors (router ffn_gate_inp F32 with
    its .scale, experts kept fused as ffn_gate_up_exps, per_expert_scale as ffn_down_exps.scale);
    the multimodal towers dropped. tests/fixtures/gguf/README.md lists them.
  * mistral: MistralForCausalLM is LlamaModel's (arch llama); its sliding window is not written.
  * qwen35 / qwen35moe (Qwen3_5TextModel / Qwen3_5MoeTextModel: _LinearAttentionVReorderBase over
    Qwen3NextModel over Qwen2MoeModel): the ssm.* keys, full_attention_interval, the rotated part of
    a head as rope.dimension_count, rope.dimension_sections; the linear layers as attn_qkv,
    attn_gate, ssm_beta, ssm_alpha, ssm_conv1d [conv_dim, K], ssm_dt.bias, ssm_a = -exp(A_log),
    ssm_norm, ssm_out, their value heads reordered from grouped to tiled; post_attention_layernorm as
    post_attention_norm; every norm but the gated one + 1; the shared expert as *_shexp. Extension:
    attention.recurrent_layers where the layer types are not what full_attention_interval says.
  * outtype q8_0 (the converter's) / q4_0 (as llama-quantize --pure): 2-D weights quantized with the
    reference quantizers below, F16 where a row is not whole 32-blocks.

The module also holds the GGUF writer (streaming, tensor by tensor), a validating reader, and
llama.cpp's reference Q4_0 / Q8_0 quantizers (ggml-quants.c quantize_row_q4_0_ref /
quantize_row_q8_0_ref, float32 arithmetic) used by tools/make_bench_model.py.
"""

import json
import math
import os
import re
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # keep tools/ free of __pycache__
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import mlx_quant as mq  # noqa: E402  (bfloat16 helpers)
import safetensors_np as stnp  # noqa: E402

# ---------------------------------------------------------------------------
# GGUF constants (gguf-py/gguf/constants.py)

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
GGUF_ALIGNMENT = 32
GGML_QUANT_VERSION = 2

# GGUFValueType
U8, I8, U16, I16, U32, I32, F32V, BOOL, STRING, ARRAY, U64, I64, F64V = range(13)
_SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32V: "<f",
               BOOL: "<?", U64: "<Q", I64: "<q", F64V: "<d"}
_SCALAR_NP = {U8: "<u1", I8: "<i1", U16: "<u2", I16: "<i2", U32: "<u4", I32: "<i4", F32V: "<f4",
              BOOL: "<u1", U64: "<u8", I64: "<i8", F64V: "<f8"}

# GGMLQuantizationType: (id, block size, bytes per block)
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0, GGML_BF16 = 0, 1, 2, 8, 30
GGML_TYPES = {GGML_F32: ("F32", 1, 4), GGML_F16: ("F16", 1, 2), GGML_Q4_0: ("Q4_0", 32, 18),
              GGML_Q8_0: ("Q8_0", 32, 34), GGML_BF16: ("BF16", 1, 2)}
# LlamaFileType (general.file_type)
FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "bf16": 32}
OUT_GGML = {"f32": GGML_F32, "f16": GGML_F16, "q4_0": GGML_Q4_0, "q8_0": GGML_Q8_0, "bf16": GGML_BF16}


def tensor_nbytes(shape, gtype):
    """Bytes of a tensor of numpy `shape` (last axis contiguous) stored as `gtype`."""
    _, bs, bb = GGML_TYPES[gtype]
    n = int(np.prod(shape, dtype=np.int64))
    if shape[-1] % bs:
        raise ValueError(f"row length {shape[-1]} is not a multiple of block size {bs}")
    return n // bs * bb


def _align(n, a=GGUF_ALIGNMENT):
    return (n + a - 1) // a * a


# ---------------------------------------------------------------------------
# llama.cpp reference quantizers (ggml/src/ggml-quants.c), float32 arithmetic

def quantize_q4_0(x):
    """quantize_row_q4_0_ref: rows [..., n] (n % 32 == 0) -> uint8 [..., n/32*18].

    Per block of 32: max = the element of largest magnitude (first one on ties), d = max / -8,
    id = 1/d (0 if d == 0), q = min(15, (int8)(x*id + 8.5)), d stored as f16,
    qs[j] = q[j] | q[j+16] << 4.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    lead = x.shape[:-1]
    b = x.reshape(-1, 32)
    idx = np.abs(b).argmax(axis=1)
    mx = b[np.arange(b.shape[0]), idx]
    d = (mx / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (b * inv[:, None]).astype(np.float32) + np.float32(8.5)  # float32, as in C
    q = np.minimum(np.trunc(v), 15).astype(np.uint8)
    out = np.empty((b.shape[0], 18), np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    return out.reshape(*lead, -1)


def dequantize_q4_0(raw, n):
    """uint8 [..., n/32*18] -> float32 [..., n] (dequantize_row_q4_0)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    lead = raw.shape[:-1]
    b = raw.reshape(-1, 18)
    d = b[:, :2].copy().view("<f2").astype(np.float32)
    qs = b[:, 2:]
    lo = (qs & 0x0F).astype(np.int32) - 8
    hi = (qs >> 4).astype(np.int32) - 8
    y = np.concatenate([lo, hi], axis=1).astype(np.float32) * d
    return y.reshape(*lead, n)


def quantize_q8_0(x):
    """quantize_row_q8_0_ref: d = amax/127, id = 1/d (0 if d == 0), q = roundf(x*id), d as f16."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    lead = x.shape[:-1]
    b = x.reshape(-1, 32)
    amax = np.abs(b).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (b * inv[:, None]).astype(np.float32)
    # roundf rounds halves away from zero; rint rounds them to even: fix the exact halves
    t = np.trunc(v)
    q = np.rint(v)
    q = np.where(np.abs(v - t) == np.float32(0.5), t + np.sign(v), q).astype(np.int8)
    out = np.empty((b.shape[0], 34), np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(*lead, -1)


def dequantize_q8_0(raw, n):
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    lead = raw.shape[:-1]
    b = raw.reshape(-1, 34)
    d = b[:, :2].copy().view("<f2").astype(np.float32)
    q = b[:, 2:].copy().view(np.int8).astype(np.float32)
    return (q * d).reshape(*lead, n)


def encode(x, gtype):
    """float32 rows -> bytes of `gtype` (numpy array, any dtype; its raw bytes are the payload)."""
    if gtype == GGML_F32:
        return np.ascontiguousarray(x, dtype="<f4")
    if gtype == GGML_F16:
        return np.ascontiguousarray(x, dtype=np.float32).astype("<f2")
    if gtype == GGML_BF16:
        return mq.f32_to_bf16_bits(x)
    if gtype == GGML_Q4_0:
        return quantize_q4_0(x)
    if gtype == GGML_Q8_0:
        return quantize_q8_0(x)
    raise ValueError(gtype)


def decode(raw, shape, gtype):
    """Raw bytes (uint8 array) of one tensor -> float32 array of numpy `shape`."""
    raw = np.ascontiguousarray(raw).view(np.uint8)
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    n = shape[-1]
    if gtype == GGML_F32:
        y = raw.view("<f4").astype(np.float32)
    elif gtype == GGML_F16:
        y = raw.view("<f2").astype(np.float32)
    elif gtype == GGML_BF16:
        y = mq.bf16_bits_to_f32(raw.view("<u2"))
    elif gtype == GGML_Q4_0:
        y = dequantize_q4_0(raw.reshape(rows, -1), n)
    elif gtype == GGML_Q8_0:
        y = dequantize_q8_0(raw.reshape(rows, -1), n)
    else:
        raise ValueError(f"unsupported ggml type {gtype}")
    return y.reshape(shape)


# ---------------------------------------------------------------------------
# GGUF writer (streaming) and reader

def _pack_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _pack_value(vtype, value):
    if vtype == STRING:
        return _pack_string(value)
    if vtype == ARRAY:
        etype, items = value
        head = struct.pack("<IQ", etype, len(items))
        if etype == STRING:
            return head + b"".join(_pack_string(s) for s in items)
        return head + np.asarray(items, dtype=_SCALAR_NP[etype]).tobytes()
    return struct.pack(_SCALAR_FMT[vtype], value)


class GGUFWriter:
    """Collects metadata and tensor infos, then streams tensor data in declared order.

    Keys keep their first insertion position; setting a key again replaces its value
    (gguf-py's GGUFWriter warns and overwrites the same way).
    """

    def __init__(self, arch):
        self.kv = {}
        self.tensors = []  # (name, numpy shape, ggml type)
        self.arch = arch
        self.add("general.architecture", STRING, arch)

    def add(self, key, vtype, value):
        key = key.replace("{arch}", self.arch)
        self.kv[key] = (vtype, value)

    def add_tensor(self, name, shape, gtype):
        if any(t[0] == name for t in self.tensors):
            raise ValueError(f"duplicate tensor {name}")
        self.tensors.append((name, tuple(int(s) for s in shape), gtype))

    def layout(self):
        """[(name, shape, gtype, offset, nbytes)] with offsets relative to the data section."""
        out, off = [], 0
        for name, shape, gtype in self.tensors:
            nb = tensor_nbytes(shape, gtype)
            out.append((name, shape, gtype, off, nb))
            off = _align(off + nb)
        return out

    def header_bytes(self):
        parts = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(self.tensors), len(self.kv))]
        for k, (vt, v) in self.kv.items():
            parts += [_pack_string(k), struct.pack("<I", vt), _pack_value(vt, v)]
        for name, shape, gtype, off, _ in self.layout():
            ne = list(reversed(shape))  # GGUF dims: ne[0] is the contiguous axis
            parts += [_pack_string(name), struct.pack("<I", len(ne)),
                      struct.pack(f"<{len(ne)}Q", *ne), struct.pack("<IQ", gtype, off)]
        h = b"".join(parts)
        return h + b"\0" * (_align(len(h)) - len(h))

    def write(self, path, produce, progress=None):
        """`produce(name, shape, gtype)` yields array pieces whose raw bytes, concatenated, are the
        tensor's data (so big tensors can be made in row chunks)."""
        lay = self.layout()
        with open(path, "wb") as f:
            hb = self.header_bytes()
            f.write(hb)
            base = len(hb)
            for i, (name, shape, gtype, off, nb) in enumerate(lay):
                assert f.tell() == base + off, name
                n = 0
                for piece in produce(name, shape, gtype):
                    by = np.ascontiguousarray(piece).view(np.uint8).reshape(-1)
                    f.write(by.data)
                    n += by.size
                if n != nb:
                    raise ValueError(f"{name}: produced {n} bytes, expected {nb}")
                f.write(b"\0" * (_align(nb) - nb) if i + 1 < len(lay) else b"")
                if progress:
                    progress(i + 1, len(lay), name)
        return os.path.getsize(path)


class GGUFFile:
    """Minimal validating GGUF v2/v3 reader (mmap). kv: {key: value}; tensors: {name: info}."""

    def __init__(self, path):
        self.path = path
        self.mm = np.memmap(path, dtype=np.uint8, mode="r")
        buf = self.mm
        self.pos = 0

        def take(n):
            if self.pos + n > len(buf):
                raise ValueError(f"{path}: truncated at byte {self.pos}")
            b = bytes(buf[self.pos:self.pos + n])
            self.pos += n
            return b

        def scalar(vt):
            fmt = _SCALAR_FMT[vt]
            return struct.unpack(fmt, take(struct.calcsize(fmt)))[0]

        def string():
            (n,) = struct.unpack("<Q", take(8))
            if n > len(buf):
                raise ValueError(f"{path}: string length {n} beyond the file")
            return take(n).decode("utf-8")

        def value(vt):
            if vt == STRING:
                return string()
            if vt == ARRAY:
                et, n = struct.unpack("<IQ", take(12))
                if et == STRING:
                    return [string() for _ in range(n)]
                if et not in _SCALAR_NP:
                    raise ValueError(f"{path}: bad array element type {et}")
                width = np.dtype(_SCALAR_NP[et]).itemsize
                if n * width > len(buf):
                    raise ValueError(f"{path}: array of {n} beyond the file")
                return np.frombuffer(take(n * width), dtype=_SCALAR_NP[et]).copy()
            if vt not in _SCALAR_FMT:
                raise ValueError(f"{path}: bad value type {vt}")
            return scalar(vt)

        if take(4) != GGUF_MAGIC:
            raise ValueError(f"{path}: not a GGUF file")
        self.version, n_tensors, n_kv = struct.unpack("<IQQ", take(20))
        if self.version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {self.version}")
        self.kv, self.kv_types = {}, {}
        for _ in range(n_kv):
            k = string()
            (vt,) = struct.unpack("<I", take(4))
            if k in self.kv:
                raise ValueError(f"{path}: duplicate key {k}")
            self.kv[k] = value(vt)
            self.kv_types[k] = vt
        self.alignment = int(self.kv.get("general.alignment", GGUF_ALIGNMENT))
        infos = []
        for _ in range(n_tensors):
            name = string()
            (nd,) = struct.unpack("<I", take(4))
            if nd < 1 or nd > 4:
                raise ValueError(f"{path}: {name}: {nd} dims")
            ne = struct.unpack(f"<{nd}Q", take(8 * nd))
            gtype, off = struct.unpack("<IQ", take(12))
            if gtype not in GGML_TYPES:
                raise ValueError(f"{path}: {name}: unsupported type {gtype}")
            infos.append((name, tuple(reversed(ne)), gtype, off))
        self.data_offset = _align(self.pos, self.alignment)
        self.tensors = {}
        spans = []
        for name, shape, gtype, off in infos:
            if name in self.tensors:
                raise ValueError(f"{path}: duplicate tensor {name}")
            if off % self.alignment:
                raise ValueError(f"{path}: {name}: offset {off} not aligned")
            nb = tensor_nbytes(shape, gtype)
            if self.data_offset + off + nb > len(buf):
                raise ValueError(f"{path}: {name}: data beyond the end of the file")
            self.tensors[name] = {"shape": shape, "type": gtype, "offset": off, "nbytes": nb}
            spans.append((off, off + nb, name))
        spans.sort()
        for a, b in zip(spans, spans[1:]):
            if b[0] < a[1]:
                raise ValueError(f"{path}: tensors {a[2]} and {b[2]} overlap")

    def raw(self, name):
        t = self.tensors[name]
        s = self.data_offset + t["offset"]
        return self.mm[s:s + t["nbytes"]]

    def get(self, name, dtype=np.float64):
        t = self.tensors[name]
        return decode(self.raw(name), t["shape"], t["type"]).astype(dtype)


# ---------------------------------------------------------------------------
# HF config -> conversion plan (what convert_hf_to_gguf.py would do)

ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "gemma2": "gemma2",
         "gemma3_text": "gemma3", "gemma3": "gemma3", "gemma4_text": "gemma4", "gemma4": "gemma4",
         "mistral": "llama",  # MistralForCausalLM is registered to LlamaModel
         "qwen3_5_text": "qwen35", "qwen3_5": "qwen35", "qwen3_5_moe_text": "qwen35moe", "qwen3_5_moe": "qwen35moe"}
QWEN35 = ("qwen35", "qwen35moe")


def hparams_of(config):
    """TextModel.__init__: text_config merged to the root; rope_parameters normalized."""
    hp = dict(config)
    if "text_config" in hp:
        hp = {**hp, **hp["text_config"]}
    rp = hp.get("rope_parameters", hp.get("rope_scaling")) or {}
    rp = json.loads(json.dumps(rp))

    def find(keys):
        return next((hp[k] for k in keys if k in hp), None)
    theta = find(["global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta", "rotary_emb_base"])
    local = find(["local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta", "rope_local_base_freq"])
    if "full_attention" not in rp and "sliding_attention" not in rp:
        if local is not None:
            rp["sliding_attention"] = {"rope_theta": local}
        if "rope_theta" not in rp and theta is not None:
            rp["rope_theta"] = theta
        if "rope_type" not in rp and rp.get("type") is not None:
            rp["rope_type"] = rp["type"]
    return hp, rp


def n_experts_of(hp):
    """Qwen3-MoE's expert count: num_experts, which transformers 5 writes as num_local_experts."""
    return hp["num_experts"] if "num_experts" in hp else hp["num_local_experts"]


def layer_types_of(hp, arch):
    n = hp["num_hidden_layers"]
    if hp.get("layer_types"):
        return list(hp["layer_types"])
    if arch == "gemma2":
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    if arch == "gemma3":
        pat = hp.get("sliding_window_pattern", 6)
        return ["full_attention" if (i + 1) % pat == 0 else "sliding_attention" for i in range(n)]
    return ["full_attention"] * n


def gemma4_layers(hp):
    """Gemma 4's layers as transformers builds them: [{"sliding", "head_dim", "kv_heads", "ffn",
    "kv_source"}] (full layers take global_head_dim and, with attention_k_eq_v,
    num_global_key_value_heads, unless per_layer_config spells them out; the last
    num_kv_shared_layers layers share the last earlier layer of their type and, with
    use_double_wide_mlp, have twice the MLP)."""
    n = hp["num_hidden_layers"]
    lt = list(hp.get("layer_types") or [])
    if not lt:
        pat = hp.get("sliding_window_pattern", 5)
        lt = ["full_attention" if (i + 1) % pat == 0 else "sliding_attention" for i in range(n)]
    lt[-1] = "full_attention"
    k_eq_v = bool(hp.get("attention_k_eq_v"))
    plc = hp.get("per_layer_config")
    rows = []
    for i, t in enumerate(lt):
        full = t == "full_attention"
        r = {"sliding": not full, "head_dim": hp["head_dim"], "kv_heads": hp["num_key_value_heads"],
             "ffn": hp["intermediate_size"], "kv_source": i, "k_eq_v": k_eq_v and full}
        if full and not plc:
            r["head_dim"] = hp.get("global_head_dim") or 512
            if k_eq_v and hp.get("num_global_key_value_heads"):
                r["kv_heads"] = hp["num_global_key_value_heads"]
        for key, ov in (plc or {}).items():
            if key == str(i) or key == t:
                r["head_dim"] = ov.get("head_dim", r["head_dim"])
                r["kv_heads"] = ov.get("num_key_value_heads", r["kv_heads"])
                r["ffn"] = ov.get("intermediate_size", r["ffn"])
        rows.append(r)
    first = n - (hp.get("num_kv_shared_layers") or 0)
    for i in range(first, n):
        src = max(j for j in range(first) if rows[j]["sliding"] == rows[i]["sliding"])
        rows[i].update(kv_source=src, head_dim=rows[src]["head_dim"], kv_heads=rows[src]["kv_heads"])
        if hp.get("use_double_wide_mlp"):
            rows[i]["ffn"] *= 2
    return rows


def gemma4_rope_factors(rp, d_full):
    """Gemma4Model.generate_extra_tensors: proportional RoPE as divisors, 1 for the rotating
    pairs (the first partial_rotary_factor * head_dim / 2) and 1e30 for the rest."""
    full = rp.get("full_attention", {})
    k = int(d_full * full.get("partial_rotary_factor", 1.0) / 2) if full.get("rope_type") == "proportional" else d_full // 2
    return np.array([1.0] * k + [1e30] * (d_full // 2 - k), dtype=np.float32)


def llama3_rope_factors(rp, hp, dim):
    """LlamaModel.generate_extra_tensors, in float32 like the torch original."""
    base = rp.get("rope_theta", 10000.0)
    freqs = (np.float32(1.0) / (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))).astype(np.float32)
    factor = rp.get("factor", 8.0)
    lo = rp.get("low_freq_factor", 1.0)
    hi = rp.get("high_freq_factor", 4.0)
    # the converter reads original_max_position_embeddings from the top-level hparams (default 8192)
    old = hp.get("original_max_position_embeddings", 8192)
    lo_wl, hi_wl = old / lo, old / hi
    f32 = np.float32
    out = []
    for f in freqs:  # every operation below is float32, as with torch's 0-d float32 tensors
        wl = f32(f32(2 * math.pi) / f)
        if wl < hi_wl:
            out.append(1.0)
        elif wl > lo_wl:
            out.append(factor)
        else:
            smooth = f32(f32(f32(f32(old) / wl) - f32(lo)) / f32(hi - lo))
            out.append(f32(1) / f32(f32(f32(1) - smooth) / f32(factor) + smooth))
    return np.array(out, dtype=np.float32)


def llamacpp_attention_scale(arch, hp):
    """f_attention_scale as llama.cpp's load_hparams hard-codes it for gemma2/gemma3."""
    head_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    is_27b = (arch == "gemma2" and hp["num_hidden_layers"] == 46) or (arch == "gemma3" and hp["num_hidden_layers"] == 62)
    d = hp["hidden_size"] // hp["num_attention_heads"] if is_27b else head_dim
    return 1.0 / math.sqrt(d)


def gguf_metadata(w, config, outtype, name):
    """Add the metadata keys convert_hf_to_gguf.py writes for this config (tokenizer aside)."""
    hp, rp = hparams_of(config)
    arch = w.arch
    a = "{arch}."
    w.add("general.type", STRING, "model")
    w.add("general.name", STRING, name)
    ftype = FILE_TYPE[outtype]
    head_dim = hp.get("head_dim")
    n_layer = hp["num_hidden_layers"]

    def text_model_params():  # TextModel.set_gguf_parameters
        w.add(a + "block_count", U32, n_layer)
        if hp.get("max_position_embeddings") is not None:
            w.add(a + "context_length", U32, hp["max_position_embeddings"])
        w.add(a + "embedding_length", U32, hp["hidden_size"])
        if hp.get("intermediate_size") is not None:  # (Qwen 3.5-MoE has none)
            w.add(a + "feed_forward_length", U32, hp["intermediate_size"])
        w.add(a + "attention.head_count", U32, hp["num_attention_heads"])
        if hp.get("num_key_value_heads") is not None:
            w.add(a + "attention.head_count_kv", U32, hp["num_key_value_heads"])
        full = rp.get("full_attention", rp)
        rtype = full.get("rope_type")
        if rtype == "linear" and full.get("factor") is not None:
            w.add(a + "rope.scaling.type", STRING, "linear")
            w.add(a + "rope.scaling.factor", F32V, float(full["factor"]))
        elif rtype not in (None, "default", "llama3"):
            raise NotImplementedError(f"rope_type {rtype}")
        if "mrope_section" in rp:  # padded to 4 (INT32 array, as gguf-py writes a list of ints)
            sec = list(rp["mrope_section"])[:4]
            w.add(a + "rope.dimension_sections", ARRAY, (I32, sec + [0] * (4 - len(sec))))
        if full.get("rope_theta") is not None:
            w.add(a + "rope.freq_base", F32V, float(full["rope_theta"]))
        if rp.get("sliding_attention", {}).get("rope_theta") is not None:
            w.add(a + "rope.freq_base_swa", F32V, float(rp["sliding_attention"]["rope_theta"]))
        if hp.get("rms_norm_eps") is not None:
            w.add(a + "attention.layer_norm_rms_epsilon", F32V, float(hp["rms_norm_eps"]))
        if head_dim is not None:
            w.add(a + "attention.key_length", U32, head_dim)
            w.add(a + "attention.value_length", U32, head_dim)
        w.add("general.file_type", U32, ftype)

    if arch in ("llama", "qwen2", "qwen3", "qwen3moe") + QWEN35:
        text_model_params()
        if arch in ("qwen3moe", "qwen35moe"):  # TextModel / Qwen2MoeModel.set_gguf_parameters
            w.add(a + "expert_count", U32, n_experts_of(hp))
            w.add(a + "expert_used_count", U32, hp["num_experts_per_tok"])
            w.add(a + "expert_feed_forward_length", U32, hp["moe_intermediate_size"])
            if arch == "qwen3moe" and not hp.get("norm_topk_prob", False):
                w.add(a + "expert_weights_norm", BOOL, False)
            if hp.get("shared_expert_intermediate_size") is not None:
                w.add(a + "expert_shared_feed_forward_length", U32, hp["shared_expert_intermediate_size"])
        if arch in QWEN35:
            qwen35_metadata(w, hp, rp)
        if arch == "llama":  # LlamaModel.set_gguf_parameters
            w.add(a + "vocab_size", U32, hp["vocab_size"])
            w.add(a + "rope.dimension_count", U32, head_dim or hp["hidden_size"] // hp["num_attention_heads"])
            if hp.get("sliding_window") is not None and hp.get("model_type") == "mistral":
                print(f"note: {name}: sliding_window {hp['sliding_window']} is not written (llama.cpp's llama architecture has "
                      "none: the file attends to every earlier position)", file=sys.stderr)
    elif arch == "gemma2":  # Gemma2Model.set_gguf_parameters (no super(): no rope keys)
        w.add(a + "context_length", U32, hp["max_position_embeddings"])
        w.add(a + "embedding_length", U32, hp["hidden_size"])
        w.add(a + "block_count", U32, n_layer)
        w.add(a + "feed_forward_length", U32, hp["intermediate_size"])
        w.add(a + "attention.head_count", U32, hp["num_attention_heads"])
        w.add(a + "attention.head_count_kv", U32, hp.get("num_key_value_heads", hp["num_attention_heads"]))
        w.add(a + "attention.layer_norm_rms_epsilon", F32V, float(hp["rms_norm_eps"]))
        w.add(a + "attention.key_length", U32, hp["head_dim"])
        w.add(a + "attention.value_length", U32, hp["head_dim"])
        w.add("general.file_type", U32, ftype)
        w.add(a + "attn_logit_softcapping", F32V, float(hp["attn_logit_softcapping"]))
        w.add(a + "final_logit_softcapping", F32V, float(hp["final_logit_softcapping"]))
        w.add(a + "attention.sliding_window", U32, hp["sliding_window"])
        theta = rp.get("rope_theta", 10000.0)
        if theta != 10000.0:
            raise NotImplementedError("gemma2 with rope_theta != 10000: llama.cpp's converter writes no rope key")
    elif arch == "gemma3":  # Gemma3Model.set_gguf_parameters: super() then overrides
        text_model_params()
        w.add(a + "context_length", U32, hp.get("max_position_embeddings", 131072))
        w.add(a + "attention.head_count", U32, hp.get("num_attention_heads", 8))
        w.add(a + "attention.layer_norm_rms_epsilon", F32V, float(hp.get("rms_norm_eps", 1e-6)))
        w.add(a + "attention.key_length", U32, hp.get("head_dim", 256))
        w.add(a + "attention.value_length", U32, hp.get("head_dim", 256))
        w.add(a + "rope.freq_base", F32V, float(rp.get("full_attention", rp).get("rope_theta", 1_000_000.0)))
        if hp.get("attn_logit_softcapping") is not None:
            raise ValueError("gemma3 has no attention softcapping")
        if hp.get("final_logit_softcapping"):
            w.add(a + "final_logit_softcapping", F32V, float(hp["final_logit_softcapping"]))
        if hp.get("sliding_window_pattern") != 1:
            w.add(a + "attention.sliding_window", U32, hp["sliding_window"])
        w.add(a + "attention.head_count_kv", U32, hp.get("num_key_value_heads", 4))
    elif arch == "gemma4":  # Gemma4Model.set_gguf_parameters (over Gemma3Model's and TextModel's)
        rows = gemma4_layers(hp)
        d_full = [r["head_dim"] for r in rows if not r["sliding"]]
        d_swa = [r["head_dim"] for r in rows if r["sliding"]] or d_full
        if len(set(d_full)) > 1 or len(set(d_swa)) > 1:
            raise NotImplementedError("gemma4 with several head sizes per layer type")
        kv = [r["kv_heads"] for r in rows]
        ffn = [r["ffn"] for r in rows]
        w.add(a + "block_count", U32, n_layer)
        w.add(a + "context_length", U32, hp.get("max_position_embeddings", 131072))
        w.add(a + "embedding_length", U32, hp["hidden_size"])
        # integer arrays go in as INT32 (GGUFValueType.get_type of a Python int)
        w.add(a + "feed_forward_length", *((U32, ffn[0]) if len(set(ffn)) == 1 else (ARRAY, (I32, ffn))))
        w.add(a + "attention.head_count", U32, hp["num_attention_heads"])
        w.add(a + "attention.head_count_kv", *((U32, kv[0]) if len(set(kv)) == 1 else (ARRAY, (I32, kv))))
        w.add(a + "attention.key_length", U32, d_full[0])
        w.add(a + "attention.value_length", U32, d_full[0])
        w.add(a + "attention.key_length_swa", U32, d_swa[0])
        w.add(a + "attention.value_length_swa", U32, d_swa[0])
        w.add(a + "attention.layer_norm_rms_epsilon", F32V, float(hp.get("rms_norm_eps", 1e-6)))
        w.add(a + "attention.sliding_window", U32, hp["sliding_window"])
        w.add(a + "attention.sliding_window_pattern", ARRAY, (BOOL, [r["sliding"] for r in rows]))
        w.add(a + "attention.shared_kv_layers", U32, hp.get("num_kv_shared_layers") or 0)
        w.add(a + "embedding_length_per_layer_input", U32, hp.get("hidden_size_per_layer_input") or 0)
        w.add(a + "rope.freq_base", F32V, float(rp["full_attention"]["rope_theta"]))
        w.add(a + "rope.freq_base_swa", F32V, float(rp["sliding_attention"]["rope_theta"]))
        w.add(a + "rope.dimension_count", U32, d_full[0])
        w.add(a + "rope.dimension_count_swa", U32, d_swa[0])
        if rp["sliding_attention"].get("rope_type", "default") != "default":
            raise NotImplementedError("gemma4 with scaled sliding-layer RoPE")
        if hp.get("final_logit_softcapping"):
            w.add(a + "final_logit_softcapping", F32V, float(hp["final_logit_softcapping"]))
        if hp.get("enable_moe_block"):
            w.add(a + "expert_count", U32, hp["num_experts"])
            w.add(a + "expert_used_count", U32, hp["top_k_experts"])
            w.add(a + "expert_feed_forward_length", U32, hp["moe_intermediate_size"])
        w.add("general.file_type", U32, ftype)
    else:
        raise NotImplementedError(arch)

    # forge extensions (see the module docstring): only where llama.cpp's hard-coded value is wrong
    if arch in ("gemma2", "gemma3"):
        want = float(hp["query_pre_attn_scalar"]) ** -0.5
        if not math.isclose(want, llamacpp_attention_scale(arch, hp), rel_tol=1e-6):
            w.add(a + "attention.scale", F32V, want)
    if arch == "gemma3":
        lt = layer_types_of(hp, arch)
        fixed = ["sliding_attention" if i % 6 < 5 else "full_attention" for i in range(n_layer)]
        if lt != fixed:
            w.add(a + "attention.sliding_window_pattern", ARRAY, (BOOL, [t == "sliding_attention" for t in lt]))
        if rp.get("sliding_attention", {}).get("rope_type", "default") != "default":
            raise NotImplementedError("gemma3 with scaled local RoPE")


def qwen35_layer_types(hp):
    """Qwen 3.5's layer types as transformers builds them: layer_types, else every
    full_attention_interval-th layer (default 4) full attention."""
    n = hp["num_hidden_layers"]
    if hp.get("layer_types"):
        return list(hp["layer_types"])
    iv = hp.get("full_attention_interval", 4)
    return ["full_attention" if (i + 1) % iv == 0 else "linear_attention" for i in range(n)]


def qwen35_metadata(w, hp, rp):
    """Qwen3NextModel.set_gguf_parameters (the linear layers' ssm.* keys, full_attention_interval,
    rope.dimension_count = the rotated part of a head) and _Qwen35MRopeMixin (the default
    multimodal RoPE sections where the config has none). Extension: where the layer types are not
    every full_attention_interval-th layer full (llama.cpp's converter reads only the interval, 4 by
    default), attention.recurrent_layers (a bool a layer), which llama.cpp reads first."""
    a = "{arch}."
    w.add(a + "ssm.conv_kernel", U32, hp["linear_conv_kernel_dim"])
    w.add(a + "ssm.state_size", U32, hp["linear_key_head_dim"])
    w.add(a + "ssm.group_count", U32, hp["linear_num_key_heads"])
    w.add(a + "ssm.time_step_rank", U32, hp["linear_num_value_heads"])
    w.add(a + "ssm.inner_size", U32, hp["linear_value_head_dim"] * hp["linear_num_value_heads"])
    interval = hp.get("full_attention_interval", 4)
    w.add(a + "full_attention_interval", U32, interval)
    head_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    w.add(a + "rope.dimension_count", U32, int(head_dim * hp.get("partial_rotary_factor", 0.25)))
    if "mrope_section" not in rp:
        w.add(a + "rope.dimension_sections", ARRAY, (I32, [11, 11, 10, 0]))
    lt = qwen35_layer_types(hp)
    if lt != ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(len(lt))]:
        w.add(a + "attention.recurrent_layers", ARRAY, (BOOL, [t == "linear_attention" for t in lt]))


def qwen35_v_tiled(x, dim, hp, head_dim):
    """_LinearAttentionVReorderBase._reorder_v_heads: the value heads along axis `dim` (each
    head_dim long) from transformers' grouped order (key head g's value heads together) to
    ggml's tiled order (new head r * n_k + g = old head g * (n_v / n_k) + r)."""
    nk, nv = hp["linear_num_key_heads"], hp["linear_num_value_heads"]
    if nk == nv:
        return x
    shape = x.shape
    y = x.reshape(shape[:dim] + (nk, nv // nk, head_dim) + shape[dim + 1:])
    return np.ascontiguousarray(np.swapaxes(y, dim, dim + 1)).reshape(shape)


GEMMA4_GLOBAL = {"model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
                 "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
                 "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight"}
QWEN35_LAYER = {  # tensor_mapping.py's qwen3.5 / qwen3next entries (dt_bias is renamed dt_proj.bias first)
    "linear_attn.in_proj_qkv": "attn_qkv.weight", "linear_attn.in_proj_z": "attn_gate.weight",
    "linear_attn.in_proj_b": "ssm_beta.weight", "linear_attn.in_proj_a": "ssm_alpha.weight",
    "linear_attn.conv1d": "ssm_conv1d.weight", "linear_attn.dt_bias": "ssm_dt.bias", "linear_attn.A_log": "ssm_a",
    "linear_attn.norm": "ssm_norm.weight", "linear_attn.out_proj": "ssm_out.weight",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp.weight",
}
GEMMA4_LAYER = {  # tensor_mapping.py's Gemma 3n / Gemma 4 entries, and Gemma4Model.modify_tensors
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
    "per_layer_input_gate.weight": "inp_gate.weight", "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight", "layer_scalar": "layer_output_scale.weight",
    "router.proj.weight": "ffn_gate_inp.weight", "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
    "experts.gate_up_proj": "ffn_gate_up_exps.weight", "experts.down_proj": "ffn_down_exps.weight",
}


def gguf_tensor_name(hf, arch):
    """tensor_mapping.py for the names these architectures use; None = not written."""
    if hf.startswith("language_model."):
        hf = hf[len("language_model."):]
    if arch in QWEN35:
        if hf.startswith("model.language_model."):  # the published multimodal layout
            hf = "model." + hf[len("model.language_model."):]
        elif hf.startswith(("model.visual.", "mtp.", "model.mtp.")):
            return None  # the vision tower goes to the --mmproj file; the MTP block is not converted (--no-mtp)
        m = re.match(r"model\.layers\.(\d+)\.(linear_attn\.[^.]*|mlp\.shared_expert_gate)(?:\.(weight|bias))?$", hf)
        if m and m.group(2) in QWEN35_LAYER:
            return f"blk.{m.group(1)}.{QWEN35_LAYER[m.group(2)]}"
    if arch == "gemma4":
        if hf.startswith("model.language_model."):  # transformers 5's multimodal checkpoint
            hf = "model." + hf[len("model.language_model."):]
        elif hf.startswith(("model.vision", "model.audio", "model.embed_vision", "model.embed_audio")):
            return None  # the towers go to the --mmproj file
        if hf in GEMMA4_GLOBAL:
            return GEMMA4_GLOBAL[hf]
        m = re.match(r"model\.layers\.(\d+)\.(.*)$", hf)
        if m and m.group(2) in GEMMA4_LAYER:
            return f"blk.{m.group(1)}.{GEMMA4_LAYER[m.group(2)]}"
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return None if arch in ("gemma2", "gemma3", "gemma4") else "output.weight"
    if hf.endswith("rotary_emb.inv_freq"):
        return None
    p = hf.split(".")
    if p[:2] != ["model", "layers"]:
        raise KeyError(f"unmapped tensor {hf}")
    bid, rest = p[2], ".".join(p[3:])
    gemma = arch in ("gemma2", "gemma3", "gemma4")
    table = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
        # qwen35's tensor list has ATTN_POST_NORM, not FFN_NORM (both map post_attention_layernorm)
        "post_attention_layernorm": "post_attention_norm" if gemma or arch in QWEN35 else "ffn_norm",
        "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
        "mlp.shared_expert.down_proj": "ffn_down_shexp",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
        "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
        "mlp.gate": "ffn_gate_inp",
    }
    mod, _, leaf = rest.rpartition(".")
    if mod not in table:
        raise KeyError(f"unmapped tensor {hf}")
    return f"blk.{bid}.{table[mod]}.{leaf}"


def llama_permute(w, n_head, n_head_kv):
    """LlamaModel.permute (rows of q_proj / k_proj, weight or bias)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def transform(hf_name, data, src_dtype, arch, hp):
    """modify_tensors: llama q/k permutation, Gemma norm + 1 (in the source dtype). float32 out."""
    x = np.asarray(data, dtype=np.float32)
    if arch == "llama":
        nh, nkv = hp["num_attention_heads"], hp.get("num_key_value_heads", hp["num_attention_heads"])
        if hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            x = llama_permute(x, nh, nh)
        elif hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            x = llama_permute(x, nh, nkv)
    if arch in QWEN35:
        x = qwen35_transform(hf_name, x, src_dtype, hp)
    if arch in ("gemma2", "gemma3") and hf_name.endswith("norm.weight"):
        # prepare_tensors converts BF16 (any dtype but F16/F32) to F32 *before* modify_tensors,
        # so the +1 is exact for BF16 sources and rounded to F16 for F16 sources
        x = x + np.float32(1)
        if src_dtype == "F16":
            x = x.astype(np.float16).astype(np.float32)
    return np.ascontiguousarray(x, dtype=np.float32)


def qwen35_transform(hf_name, x, src_dtype, hp):
    """_LinearAttentionVReorderBase then Qwen3NextModel.modify_tensors: the value heads tiled
    (qwen35_v_tiled) where the key and value heads differ in number; A_log -> -exp(A_log); the
    convolution squeezed to [conv_dim, K]; every norm but the gated one (linear_attn.norm) + 1.
    BF16 sources are F32 by then (prepare_tensors), F16 ones stay F16 (results rounded to it)."""
    nk, dk = hp["linear_num_key_heads"], hp["linear_key_head_dim"]
    dv = hp["linear_value_head_dim"]
    if ".linear_attn." in hf_name:
        if hf_name.endswith("in_proj_qkv.weight"):
            x = np.concatenate([x[:2 * nk * dk], qwen35_v_tiled(x[2 * nk * dk:], 0, hp, dv)])
        elif hf_name.endswith("in_proj_z.weight"):
            x = qwen35_v_tiled(x, 0, hp, dv)
        elif hf_name.endswith(("in_proj_b.weight", "in_proj_a.weight", ".A_log", ".dt_bias")):
            x = qwen35_v_tiled(x, 0, hp, 1)
        elif hf_name.endswith("conv1d.weight"):
            x = x.reshape(x.shape[0], -1)
            x = np.concatenate([x[:2 * nk * dk], qwen35_v_tiled(x[2 * nk * dk:], 0, hp, dv)])
        elif hf_name.endswith("out_proj.weight"):
            x = qwen35_v_tiled(x, 1, hp, dv)
    f16 = src_dtype == "F16"
    if hf_name.endswith(".A_log"):
        x = -np.exp(x.astype(np.float16) if f16 else x).astype(np.float32)
    elif hf_name.endswith("norm.weight") and not hf_name.endswith("linear_attn.norm.weight"):
        x = x + np.float32(1)
        if f16:
            x = x.astype(np.float16).astype(np.float32)
    return x


def out_type(gguf_name, shape, outtype):
    """prepare_tensors: 1-D tensors, norms, MoE routers (ffn_gate_inp), the SSM convolution and names
    not ending in .weight (Gemma 4's .scale tensors) stay F32 (llama-quantize keeps the same ones).
    q8_0 / q4_0: a row that is not a whole number of 32-blocks falls back to F16 (the converter's
    QuantError fallback)."""
    if len(shape) <= 1 or gguf_name.endswith("_norm.weight") or ".ffn_gate_inp." in gguf_name or ".ssm_conv1d." in gguf_name \
            or outtype == "f32" or not gguf_name.endswith(".weight"):
        return GGML_F32
    if outtype in ("q8_0", "q4_0") and shape[-1] % 32:
        return GGML_F16
    return OUT_GGML[outtype]


def extra_tensors(config, arch):
    """generate_extra_tensors: rope_freqs.weight for llama3 RoPE scaling."""
    hp, rp = hparams_of(config)
    full = rp.get("full_attention", rp)
    if arch == "llama" and str(full.get("rope_type", "")).lower() == "llama3":
        dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
        return [("rope_freqs.weight", llama3_rope_factors(full, hp, dim))]
    if arch == "gemma4":
        d_full = next(r["head_dim"] for r in gemma4_layers(hp) if not r["sliding"])
        return [("rope_freqs.weight", gemma4_rope_factors(rp, d_full))]
    return []


# ---------------------------------------------------------------------------
# HF directory -> GGUF

def load_hf(d):
    with open(os.path.join(d, "config.json")) as f:
        config = json.load(f)
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(x for x in os.listdir(d) if x.endswith(".safetensors"))
    tensors = {}
    for fn in files:
        t, _ = stnp.read(os.path.join(d, fn))
        tensors.update(t)
    return config, tensors


def convert(hf_dir, out_path, outtype="f32", name=None):
    config, tensors = load_hf(hf_dir)
    hp, _ = hparams_of(config)
    mt = hp.get("model_type", config.get("model_type"))
    if mt not in ARCHS:
        raise NotImplementedError(f"model_type {mt}")
    arch = ARCHS[mt]
    if config.get("quantization") or config.get("quantization_config"):
        raise NotImplementedError("quantized HF checkpoints")
    w = GGUFWriter(arch)
    gguf_metadata(w, config, outtype, name or os.path.basename(os.path.normpath(hf_dir)))
    w.add("general.quantization_version", U32, GGML_QUANT_VERSION)
    data = {}
    for gname, arr in extra_tensors(config, arch):
        data[gname] = arr
        w.add_tensor(gname, arr.shape, GGML_F32)
    experts = {}  # (layer, "gate" | "up" | "down") -> {expert: array}
    for hf_name in tensors:  # file order, like the converter
        m = None if arch == "gemma4" else re.match(r"(?:language_model\.)?model\.(?:language_model\.)?layers\.(\d+)\.mlp\.experts\.(?:(\d+)\.(gate|up|down)_proj\.weight|(gate_up|down)_proj)$", hf_name)
        if m:
            dt, a = tensors[hf_name]
            f32 = mq.bf16_bits_to_f32(a) if dt == "BF16" else a.astype(np.float32)
            bid = int(m.group(1))
            if m.group(2) is not None:
                experts.setdefault((bid, m.group(3)), {})[int(m.group(2))] = f32
            elif m.group(4) == "gate_up":  # [E, 2I, H]: gate rows first
                half = f32.shape[1] // 2
                experts[(bid, "gate")] = dict(enumerate(f32[:, :half]))
                experts[(bid, "up")] = dict(enumerate(f32[:, half:]))
            else:
                experts[(bid, "down")] = dict(enumerate(f32))
            if (bid, "gate") in experts and (bid, "up") in experts and (bid, "down") in experts \
                    and all(len(experts[(bid, k)]) == n_experts_of(hp) for k in ("gate", "up", "down")):
                for k in ("gate", "up", "down"):
                    gname = f"blk.{bid}.ffn_{k}_exps.weight"
                    x = np.ascontiguousarray(np.stack([experts[(bid, k)][e] for e in range(n_experts_of(hp))]), dtype=np.float32)
                    data[gname] = x
                    w.add_tensor(gname, x.shape, out_type(gname, x.shape, outtype))
                    del experts[(bid, k)]
            continue
        gname = gguf_tensor_name(hf_name, arch)
        if gname is None:
            continue
        dt, a = tensors[hf_name]
        f32 = mq.bf16_bits_to_f32(a) if dt == "BF16" else a.astype(np.float32)
        x = transform(hf_name, f32, dt, arch, hp)
        data[gname] = x
        w.add_tensor(gname, x.shape, out_type(gname, x.shape, outtype))
    if experts:
        raise ValueError(f"incomplete experts: {sorted(experts)}")
    w.write(out_path, lambda n, shape, gt: [encode(data[n], gt)])
    return w


# ---------------------------------------------------------------------------
# Independent float64 forward pass reading a GGUF the way llama.cpp does

def _kv(g, key, default=None):
    v = g.kv.get(key.replace("{arch}", g.kv["general.architecture"]), default)
    return v



def gelu(x):
    """GELU, tanh approximation (gelu_pytorch_tanh; ggml's gelu)."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _gemma4_forward(g, W, tokens, mutate):
    """gguf_forward for gemma4, as llama.cpp's gemma4 graph reads the file: per-layer head sizes
    (key_length for full layers, key_length_swa for sliding ones), head_count_kv and
    feed_forward_length scalars or per-layer arrays; NEOX RoPE over the whole head, full layers
    at rope.freq_base with the rope_freqs divisors (1e30: a pair that does not turn), sliding
    layers at rope.freq_base_swa; queries and keys RMS-normed with their weights, values without
    one; V = the raw K projection where attn_v is absent; attention scale 1; the last
    shared_kv_layers layers attend to the cache of the last earlier layer of their type (the
    rule transformers applies; llama.cpp's n_layer_kv_from_start - (swa ? 2 : 1) agrees with it on
    the published models); norms as stored; embeddings * sqrt(n_embd); per-layer inputs; the MoE
    block beside the dense MLP; layer_output_scale; the final soft cap."""
    arch = "gemma4"
    L = int(_kv(g, "{arch}.block_count"))
    E = int(_kv(g, "{arch}.embedding_length"))
    H = int(_kv(g, "{arch}.attention.head_count"))
    eps = float(_kv(g, "{arch}.attention.layer_norm_rms_epsilon"))
    per_layer = lambda v: [int(x) for x in v] if isinstance(v, (list, np.ndarray)) else [int(v)] * L  # noqa: E731
    HKV = per_layer(_kv(g, "{arch}.attention.head_count_kv", H))
    d_full = int(_kv(g, "{arch}.attention.key_length"))
    d_swa = int(_kv(g, "{arch}.attention.key_length_swa", d_full))
    swa = [bool(x) for x in _kv(g, "{arch}.attention.sliding_window_pattern")]
    n_swa = int(_kv(g, "{arch}.attention.sliding_window"))
    shared = int(_kv(g, "{arch}.attention.shared_kv_layers", 0))
    P = int(_kv(g, "{arch}.embedding_length_per_layer_input", 0))
    base, base_swa = float(_kv(g, "{arch}.rope.freq_base")), float(_kv(g, "{arch}.rope.freq_base_swa", 10000.0))
    final_cap = float(_kv(g, "{arch}.final_logit_softcapping", 0.0) or 0.0)
    n_used = int(_kv(g, "{arch}.expert_used_count", 0) or 0)
    ff = None if "rope_freqs" in mutate else W.get("rope_freqs.weight")
    first_shared = L - shared

    def norm(x, w=None):
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        return y if w is None else y * w

    def rope(x, pos, d, fbase, factors):
        i = np.arange(d // 2, dtype=np.float64)
        theta = pos[:, None] * fbase ** (-2.0 * i / d)[None, :]
        if factors is not None:
            theta = theta / factors[None, :].astype(np.float64)
        c, s_ = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        a, b = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([a * c - b * s_, a * s_ + b * c], axis=-1)

    def lin(name, x):
        return x @ W[name].T

    def mlp(p, h):
        return lin(p + "ffn_down.weight", gelu(lin(p + "ffn_gate.weight", h)) * lin(p + "ffn_up.weight", h))

    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)
    x = W["token_embd.weight"][tokens] * math.sqrt(E)
    if P:
        tok = W["per_layer_token_embd.weight"][tokens].reshape(T, L, P) * math.sqrt(P)
        proj = (x @ W["per_layer_model_proj.weight"].T * (1.0 / math.sqrt(E))).reshape(T, L, P)
        ple = (norm(proj, W["per_layer_proj_norm.weight"]) + tok) * (1.0 / math.sqrt(2.0))
    qi, ki = np.arange(T)[:, None], np.arange(T)[None, :]
    cache = {}
    for il in range(L):
        p = f"blk.{il}."
        D = d_swa if swa[il] else d_full
        h = norm(x, W[p + "attn_norm.weight"])
        q = norm(lin(p + "attn_q.weight", h).reshape(T, H, D), W[p + "attn_q_norm.weight"])
        fb, fct = (base_swa, None) if swa[il] else (base, ff)
        q = rope(q, pos, D, fb, fct)
        if il < first_shared:
            kr = lin(p + "attn_k.weight", h).reshape(T, HKV[il], D)
            vr = lin(p + "attn_v.weight", h).reshape(T, HKV[il], D) if p + "attn_v.weight" in W else kr
            k = rope(norm(kr, W[p + "attn_k_norm.weight"]), pos, D, fb, fct)
            v = vr if "v_norm" in mutate else norm(vr)
            cache[il] = (k, v)
        else:
            src = max(j for j in range(first_shared) if swa[j] == swa[il])
            k, v = cache[src]
        rep = H // k.shape[1]
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        sc = np.einsum("qhd,khd->hqk", q, k)  # attention scale 1
        allowed = ki <= qi
        if swa[il] and "sliding_window" not in mutate:
            allowed &= (qi - ki) < n_swa
        sc = np.where(allowed[None], sc, -np.inf)
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        sc /= sc.sum(-1, keepdims=True)
        o = lin(p + "attn_output.weight", np.einsum("hqk,khd->qhd", sc, v).reshape(T, H * D))
        x = x + norm(o, W[p + "post_attention_norm.weight"])
        h2 = norm(x, W[p + "ffn_norm.weight"])
        if p + "ffn_gate_inp.weight" in W:  # the experts beside the dense MLP
            dense = norm(mlp(p, h2), W[p + "post_ffw_norm_1.weight"])
            r = norm(x) * (1.0 / math.sqrt(E)) * W[p + "ffn_gate_inp.scale"]
            lg_r = r @ W[p + "ffn_gate_inp.weight"].T
            pr = np.exp(lg_r - lg_r.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            h3 = norm(x, W[p + "pre_ffw_norm_2.weight"])
            gu, dn = W[p + "ffn_gate_up_exps.weight"], W[p + "ffn_down_exps.weight"]
            half = gu.shape[1] // 2
            k_used = 1 if "top1" in mutate else n_used
            ex = np.zeros_like(x)
            for t in range(T):
                sel = np.argsort(-pr[t], kind="stable")[:k_used]
                wsel = pr[t, sel] / pr[t, sel].sum()
                if "expert_scale" not in mutate:
                    wsel = wsel * W[p + "ffn_down_exps.scale"][sel]
                for e, we in zip(sel, wsel):
                    a = gu[e] @ h3[t]
                    ex[t] += we * (dn[e] @ (gelu(a[:half]) * a[half:]))
            m = dense + norm(ex, W[p + "post_ffw_norm_2.weight"])
        else:
            m = mlp(p, h2)
        x = x + norm(m, W[p + "post_ffw_norm.weight"])
        if P and "per_layer_inputs" not in mutate:
            gt = gelu(lin(p + "inp_gate.weight", x)) * ple[:, il, :]
            x = x + norm(lin(p + "proj.weight", gt), W[p + "post_norm.weight"])
        if p + "layer_output_scale.weight" in W and "layer_scale" not in mutate:
            x = x * W[p + "layer_output_scale.weight"].reshape(-1)[0]
    x = norm(x, W["output_norm.weight"])
    lg = x @ W.get("output.weight", W["token_embd.weight"]).T
    if final_cap:
        lg = np.tanh(lg / final_cap) * final_cap
    return lg


def _attention_keys(g):
    """(embedding_length, head_count, head_count_kv, key_length, rope.dimension_count, rms eps,
    rope.freq_base) with llama.cpp's defaults."""
    E = int(_kv(g, "{arch}.embedding_length"))
    H = int(_kv(g, "{arch}.attention.head_count"))
    D = int(_kv(g, "{arch}.attention.key_length", E // H))
    return (E, H, int(_kv(g, "{arch}.attention.head_count_kv", H)), D, int(_kv(g, "{arch}.rope.dimension_count", D)),
            float(_kv(g, "{arch}.attention.layer_norm_rms_epsilon")), float(_kv(g, "{arch}.rope.freq_base", 10000.0)))


def _qwen35_forward(g, W, tokens, mutate):
    """gguf_forward for qwen35 / qwen35moe, as llama.cpp's graph (src/models/qwen35.cpp,
    qwen35moe.cpp) reads the file: layer types from attention.recurrent_layers, else every
    full_attention_interval-th layer full (the first block_count - nextn_predict_layers blocks);
    norms as stored (their 1 added); linear layers: attn_qkv -> causal depthwise conv over
    ssm_conv1d's K taps + SiLU, q/k L2-normed (eps = the rms eps; q times 1/sqrt(state_size)),
    value head h reading key head h % group_count (the tiled order), beta = sigmoid(ssm_beta x),
    decay = exp(ssm_a * softplus(ssm_alpha x + ssm_dt.bias)) with ssm_a = -exp(A_log) as stored,
    the delta rule, RMSNorm(o) * ssm_norm * silu(attn_gate x), ssm_out; full layers: attn_q gives
    per head the query then its gate, q/k RMS-normed, NEOX RoPE over the first
    rope.dimension_count dims (text: the multimodal sections all see the same position), scale
    1/sqrt(key_length), output times sigmoid(gate); MLP (SiLU) or experts (softmax, top k
    renormalized) plus the shared expert times sigmoid(ffn_gate_inp_shexp x)."""
    arch = g.kv["general.architecture"]
    n_all = int(_kv(g, "{arch}.block_count"))
    L = n_all - int(_kv(g, "{arch}.nextn_predict_layers", 0))
    E, H, HKV, D, n_rot, eps, base = _attention_keys(g)
    K, DK = int(_kv(g, "{arch}.ssm.conv_kernel")), int(_kv(g, "{arch}.ssm.state_size"))
    NK, NV = int(_kv(g, "{arch}.ssm.group_count")), int(_kv(g, "{arch}.ssm.time_step_rank"))
    DV = int(_kv(g, "{arch}.ssm.inner_size")) // NV
    rl = _kv(g, "{arch}.attention.recurrent_layers")
    if rl is not None:
        linear = [bool(x) for x in rl][:L]
    else:
        iv = int(_kv(g, "{arch}.full_attention_interval", 4))
        linear = [(i + 1) % iv != 0 for i in range(L)]
    n_used = int(_kv(g, "{arch}.expert_used_count", 0) or 0)

    def norm(x, w):
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        return y * (w + 1.0 if "norm_plus_one" in mutate else w)

    def silu(x):
        return x / (1.0 + np.exp(-x))

    def lin(name, x):
        return x @ W[name].T

    def l2(x):
        return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)

    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)
    x = W["token_embd.weight"][tokens]
    qi, ki = np.arange(T)[:, None], np.arange(T)[None, :]
    for il in range(L):
        p = f"blk.{il}."
        h = norm(x, W[p + "attn_norm.weight"])
        if linear[il]:
            mixed = lin(p + "attn_qkv.weight", h)
            cw = W[p + "ssm_conv1d.weight"]  # [channels, K]
            padded = np.concatenate([np.zeros((K - 1, mixed.shape[1])), mixed], 0)
            conv = silu(sum(cw[:, j][None, :] * padded[j:j + T] for j in range(K)))
            q = l2(conv[:, :NK * DK].reshape(T, NK, DK)) / math.sqrt(DK)
            k = l2(conv[:, NK * DK:2 * NK * DK].reshape(T, NK, DK))
            v = conv[:, 2 * NK * DK:].reshape(T, NV, DV)
            beta = 1.0 / (1.0 + np.exp(-lin(p + "ssm_beta.weight", h)))
            al = lin(p + "ssm_alpha.weight", h) + W[p + "ssm_dt.bias"]
            sp = np.where(al > 20.0, al, np.log1p(np.exp(np.minimum(al, 20.0))))
            a = -np.exp(W[p + "ssm_a"]) if "ssm_a_log" in mutate else W[p + "ssm_a"]
            g_ = a * sp
            S = np.zeros((NV, DK, DV))
            o = np.zeros((T, NV, DV))
            for t in range(T):
                for hv in range(NV):
                    kh = hv // (NV // NK) if "v_grouped" in mutate else hv % NK
                    S[hv] *= math.exp(g_[t, hv])
                    delta = (v[t, hv] - S[hv].T @ k[t, kh]) * beta[t, hv]
                    S[hv] += np.outer(k[t, kh], delta)
                    o[t, hv] = S[hv].T @ q[t, kh]
            z = lin(p + "attn_gate.weight", h).reshape(T, NV, DV)
            o = o / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + eps) * W[p + "ssm_norm.weight"] * silu(z)
            x = x + lin(p + "ssm_out.weight", o.reshape(T, NV * DV))
        else:
            qg = lin(p + "attn_q.weight", h).reshape(T, H, 2 * D)
            q, gate = qg[..., :D], qg[..., D:].reshape(T, H * D)
            k = lin(p + "attn_k.weight", h).reshape(T, HKV, D)
            v = lin(p + "attn_v.weight", h).reshape(T, HKV, D)
            q, k = norm(q, W[p + "attn_q_norm.weight"]), norm(k, W[p + "attn_k_norm.weight"])
            r = D if "rope_style" in mutate else n_rot
            i = np.arange(r // 2, dtype=np.float64)
            theta = pos[:, None] * base ** (-2.0 * i / r)[None, :]
            c, s_ = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]

            def rope(y):
                y = y.copy()
                a0, b0 = y[..., : r // 2].copy(), y[..., r // 2: r].copy()
                y[..., : r // 2], y[..., r // 2: r] = a0 * c - b0 * s_, a0 * s_ + b0 * c
                return y
            q, k = rope(q), rope(k)
            rep = H // HKV
            k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
            sc = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(D)
            sc = np.where((ki <= qi)[None], sc, -np.inf)
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            sc /= sc.sum(-1, keepdims=True)
            o = np.einsum("hqk,khd->qhd", sc, v).reshape(T, H * D)
            if "no_gate" not in mutate:
                o = o / (1.0 + np.exp(-gate))
            x = x + lin(p + "attn_output.weight", o)
        h2 = norm(x, W[p + "post_attention_norm.weight"])
        if p + "ffn_gate_inp.weight" in W:
            lg_r = h2 @ W[p + "ffn_gate_inp.weight"].T
            pr = np.exp(lg_r - lg_r.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            out = np.zeros_like(x)
            for t in range(T):
                sel = np.argsort(-pr[t], kind="stable")[:1 if "top1" in mutate else n_used]
                for e, we in zip(sel, pr[t, sel] / pr[t, sel].sum()):
                    a_ = W[p + "ffn_gate_exps.weight"][e] @ h2[t]
                    out[t] += we * (W[p + "ffn_down_exps.weight"][e] @ (silu(a_) * (W[p + "ffn_up_exps.weight"][e] @ h2[t])))
            sh = lin(p + "ffn_down_shexp.weight", silu(lin(p + "ffn_gate_shexp.weight", h2)) * lin(p + "ffn_up_shexp.weight", h2))
            gsh = h2 @ W[p + "ffn_gate_inp_shexp.weight"].reshape(-1)
            x = x + out + (sh if "shexp_gate" in mutate else sh / (1.0 + np.exp(-gsh))[:, None])
        else:
            x = x + lin(p + "ffn_down.weight", silu(lin(p + "ffn_gate.weight", h2)) * lin(p + "ffn_up.weight", h2))
    x = norm(x, W["output_norm.weight"])
    return x @ W.get("output.weight", W["token_embd.weight"]).T


def gguf_forward(path, tokens, mutate=None):
    """Logits [T, n_vocab] (float64) for `tokens`, from the GGUF alone.

    llama.cpp semantics: llama -> RoPE on adjacent pairs (LLAMA_ROPE_TYPE_NORM) with rope_freqs
    divisors; qwen2/qwen3/gemma2/gemma3 -> NEOX (pairs offset by n_rot/2). Norm weights are used as
    stored (Gemma's +1 is already in the file). Gemma: embeddings * sqrt(n_embd), attention scale
    `{arch}.attention.scale` if present else 1/sqrt(head_dim); gemma2 sliding on even layers,
    gemma3 on layers with il % 6 < 5 (or `{arch}.attention.sliding_window_pattern`); gemma3 local
    layers use rope.freq_base_swa (default 10000) and no rope scaling. `mutate` (a set of names)
    switches conventions off for negative controls.
    """
    mutate = mutate or set()
    g = GGUFFile(path)
    arch = g.kv["general.architecture"]
    if arch == "gemma4":
        return _gemma4_forward(g, {n: g.get(n) for n in g.tensors}, tokens, mutate)
    if arch in QWEN35:
        return _qwen35_forward(g, {n: g.get(n) for n in g.tensors}, tokens, mutate)
    L = int(_kv(g, "{arch}.block_count"))
    E, H, HKV, D, n_rot, eps, base = _attention_keys(g)
    scale_type = _kv(g, "{arch}.rope.scaling.type", "none")
    factor = float(_kv(g, "{arch}.rope.scaling.factor", 0.0) or 0.0)
    freq_scale = 1.0 / factor if (factor and scale_type == "linear") else 1.0
    gemma = arch in ("gemma2", "gemma3")
    neox = arch != "llama"
    if "rope_style" in mutate:
        neox = not neox
    W = {n: g.get(n) for n in g.tensors}
    ff = W.get("rope_freqs.weight")
    if "rope_freqs" in mutate:
        ff = None
    n_swa = int(_kv(g, "{arch}.attention.sliding_window", 0) or 0)
    if arch == "gemma2":
        n_swa = n_swa or 4096
        swa = [i % 2 < 1 for i in range(L)]
    elif arch == "gemma3" and n_swa > 0:
        pat = _kv(g, "{arch}.attention.sliding_window_pattern")
        swa = [bool(x) for x in pat] if pat is not None else [i % 6 < 5 for i in range(L)]
    else:
        swa = [False] * L
    base_swa = float(_kv(g, "{arch}.rope.freq_base_swa", 10000.0)) if arch == "gemma3" else base
    scale_swa = 1.0 if arch == "gemma3" else freq_scale
    if gemma:
        kq_scale = float(_kv(g, "{arch}.attention.scale", 0.0) or 0.0) or 1.0 / math.sqrt(D)
        if "attention_scale" in mutate:
            kq_scale = 1.0 / math.sqrt(D)
    else:
        kq_scale = 1.0 / math.sqrt(D)
    attn_cap = float(_kv(g, "{arch}.attn_logit_softcapping", 0.0) or 0.0) if arch == "gemma2" else 0.0
    final_cap = float(_kv(g, "{arch}.final_logit_softcapping", 0.0) or 0.0)

    def norm(x, w):
        if "norm_plus_one" in mutate and gemma:
            w = w + 1.0
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def rope(x, pos, fbase, fscale):
        i = np.arange(n_rot // 2, dtype=np.float64)
        theta = pos[:, None] * fscale * fbase ** (-2.0 * i / n_rot)[None, :]
        if ff is not None:
            theta = theta / ff[None, :]
        c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        y = x.copy()
        if neox:
            a, b = x[..., : n_rot // 2], x[..., n_rot // 2: n_rot]
            y[..., : n_rot // 2] = a * c - b * s
            y[..., n_rot // 2: n_rot] = a * s + b * c
        else:
            a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
            y[..., 0:n_rot:2] = a * c - b * s
            y[..., 1:n_rot:2] = a * s + b * c
        return y

    def lin(name, x):
        y = x @ W[name + ".weight"].T
        b = W.get(name + ".bias")
        return y + b if b is not None else y

    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)
    x = W["token_embd.weight"][tokens]
    if gemma:
        x = x * math.sqrt(E)
    qi, ki = np.arange(T)[:, None], np.arange(T)[None, :]
    for il in range(L):
        p = f"blk.{il}."
        h = norm(x, W[p + "attn_norm.weight"])
        q = lin(p + "attn_q", h).reshape(T, H, D)
        k = lin(p + "attn_k", h).reshape(T, HKV, D)
        v = lin(p + "attn_v", h).reshape(T, HKV, D)
        if p + "attn_q_norm.weight" in W:
            q = norm(q, W[p + "attn_q_norm.weight"])
            k = norm(k, W[p + "attn_k_norm.weight"])
        fb, fs = (base_swa, scale_swa) if swa[il] else (base, freq_scale)
        if "local_rope" in mutate:
            fb, fs = base, freq_scale
        if "rope_scale" in mutate:
            fs = 1.0
        q, k = rope(q, pos, fb, fs), rope(k, pos, fb, fs)
        rep = H // HKV
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) * kq_scale
        if attn_cap:
            s = np.tanh(s / attn_cap) * attn_cap
        allowed = ki <= qi
        if swa[il] and "sliding_window" not in mutate:
            allowed &= (qi - ki) < n_swa  # llama.cpp masks p1 - p0 >= n_swa
        s = np.where(allowed[None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = lin(p + "attn_output", np.einsum("hqk,khd->qhd", s, v).reshape(T, H * D))
        if p + "ffn_gate_inp.weight" in W:  # qwen3moe: llama.cpp's build_moe_ffn (softmax gating)
            x = x + o
            h2 = norm(x, W[p + "ffn_norm.weight"])
            lg_r = h2 @ W[p + "ffn_gate_inp.weight"].T
            pr = np.exp(lg_r - lg_r.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            k = int(_kv(g, "{arch}.expert_used_count"))
            if "top1" in mutate:
                k = 1
            out = np.zeros_like(x)
            for t in range(T):
                sel = np.argsort(-pr[t], kind="stable")[:k]
                wsel = pr[t, sel]
                if bool(_kv(g, "{arch}.expert_weights_norm", True)) and "moe_renorm" not in mutate:
                    wsel = wsel / wsel.sum()
                for e, we in zip(sel, wsel):
                    gt = h2[t] @ W[p + "ffn_gate_exps.weight"][e].T
                    up = h2[t] @ W[p + "ffn_up_exps.weight"][e].T
                    out[t] += we * ((gt / (1.0 + np.exp(-gt)) * up) @ W[p + "ffn_down_exps.weight"][e].T)
            x = x + out
        elif gemma:
            x = x + norm(o, W[p + "post_attention_norm.weight"])
            h2 = norm(x, W[p + "ffn_norm.weight"])
            m = lin(p + "ffn_down", gelu(lin(p + "ffn_gate", h2)) * lin(p + "ffn_up", h2))
            x = x + norm(m, W[p + "post_ffw_norm.weight"])
        else:
            x = x + o
            h2 = norm(x, W[p + "ffn_norm.weight"])
            gt = lin(p + "ffn_gate", h2)
            x = x + lin(p + "ffn_down", gt / (1.0 + np.exp(-gt)) * lin(p + "ffn_up", h2))
    x = norm(x, W["output_norm.weight"])
    lg = x @ W.get("output.weight", W["token_embd.weight"]).T
    if final_cap:
        lg = np.tanh(lg / final_cap) * final_cap
    return lg


def verify(gguf_path, ref_dir, tol=1e-4, controls=True, quiet=False):
    """Compare gguf_forward with the HF reference logits of a parity fixture."""
    with open(os.path.join(ref_dir, "reference.json")) as f:
        ref = json.load(f)
    V = ref["n_vocab"]
    results, ok = [], True
    refs = []
    for s in ref["sequences"]:
        key = "logits_f64" if "logits_f64" in s else "logits"
        r = np.fromfile(os.path.join(ref_dir, s[key]), dtype="<f4").reshape(len(s["tokens"]), V).astype(np.float64)
        refs.append((s["tokens"], r))
    for tokens, r in refs:
        lg = gguf_forward(gguf_path, tokens)
        rel = float(np.abs(lg - r).max() / np.abs(r).max())
        am = bool((lg.argmax(-1) == r.argmax(-1)).all())
        ok &= rel <= tol and am
        results.append({"n_tokens": len(tokens), "rel": rel, "argmax_equal": am})
    negative = {}
    if controls:
        arch = GGUFFile(gguf_path).kv["general.architecture"]
        names = ["rope_style"]
        if arch == "llama" and "rope_freqs.weight" in GGUFFile(gguf_path).tensors:
            names.append("rope_freqs")
        if arch in ("gemma2", "gemma3"):
            names += ["norm_plus_one", "sliding_window"]
            if "%s.attention.scale" % arch in GGUFFile(gguf_path).kv:
                names.append("attention_scale")
        if arch == "gemma3":
            names.append("local_rope")
        if arch == "qwen3moe":
            names += ["top1", "moe_renorm"]
        if arch == "gemma4":
            kv = GGUFFile(gguf_path).kv
            names = ["rope_freqs", "v_norm", "sliding_window", "layer_scale"]
            if kv.get("gemma4.embedding_length_per_layer_input"):
                names.append("per_layer_inputs")
            if kv.get("gemma4.expert_count"):
                names += ["top1", "expert_scale"]
        if arch in QWEN35:
            kv = GGUFFile(gguf_path).kv
            names = ["rope_style", "norm_plus_one", "ssm_a_log", "no_gate"]
            if kv["%s.ssm.group_count" % arch] != kv["%s.ssm.time_step_rank" % arch]:
                names.append("v_grouped")
            if kv.get("%s.expert_count" % arch):
                names += ["top1", "shexp_gate"]
        if "%s.rope.scaling.factor" % arch in GGUFFile(gguf_path).kv:
            names.append("rope_scale")
        tokens, r = max(refs, key=lambda t: len(t[0]))
        for m in names:
            lg = gguf_forward(gguf_path, tokens, mutate={m})
            negative[m] = float(np.abs(lg - r).max() / np.abs(r).max())
            if negative[m] <= tol:
                ok = False  # a convention the check cannot see is not checked
    if not quiet:
        print(f"{'ok  ' if ok else 'FAIL'} {gguf_path}: " + "; ".join(
            f"[{x['n_tokens']}] rel {x['rel']:.2e} argmax {'ok' if x['argmax_equal'] else 'DIFFERS'}" for x in results)
            + ("; negative controls (must fail): " + ", ".join(f"{k} {v:.1e}" for k, v in negative.items()) if negative else ""))
    return ok, results, negative


FIXTURES = ["llama3_f32_untied", "qwen2_f32_tied", "qwen3_f32_sharded", "gemma2_f32", "gemma3_text_f32", "qwen3_moe_f32",
            "gemma4_text_f32", "gemma4_moe_f32", "qwen3_5_text_f32", "qwen3_5_moe_f32", "mistral_v03_bf16"]


# Quantized conversions (outtype q8_0 as the converter writes it; q4_0 as llama-quantize --pure
# would, the same tensors quantized), checked against the float64 forward of their exactly
# dequantized weights: the reference written beside each file, gguf/NAME/ (reference.json, seqN.f32).
QUANT_FIXTURES = [("qwen3_5_text_f32", "q8_0"), ("qwen3_5_text_f32", "q4_0"), ("qwen3_5_moe_f32", "q8_0")]


def make_quant_fixture(root, src_name, outtype):
    src = os.path.join(root, "parity", src_name)
    name = src_name.replace("_f32", "_" + outtype)
    dst = os.path.join(root, "gguf", name + ".gguf")
    convert(src, dst, outtype, name)
    with open(os.path.join(src, "reference.json")) as f:
        ref = json.load(f)
    ref_dir = os.path.join(root, "gguf", name)
    os.makedirs(ref_dir, exist_ok=True)
    seqs, rels = [], []
    for i, s in enumerate(ref["sequences"]):
        lg = gguf_forward(dst, s["tokens"])
        hf = np.fromfile(os.path.join(src, s["logits"]), dtype="<f4").reshape(lg.shape)
        rels.append(float(np.abs(lg - hf).max() / np.abs(hf).max()))
        lg.astype("<f4").tofile(os.path.join(ref_dir, f"seq{i}.f32"))
        seqs.append({"tokens": s["tokens"], "n_tokens": len(s["tokens"]), "logits": f"seq{i}.f32"})
    g = GGUFFile(dst)
    doc = {"generator": "tools/hf_to_gguf.py --make-fixtures", "source": f"../../parity/{src_name}", "gguf": f"../{name}.gguf",
           "n_vocab": ref["n_vocab"], "reference_dtype": "float64",
           "reference": "gguf_forward: the float64 forward (llama.cpp's graph) of the file's exactly dequantized weights",
           "quantized_vs_hf_rel": rels, "tensor_types": {k: GGML_TYPES[t["type"]][0] for k, t in g.tensors.items()},
           "sequences": seqs}
    with open(os.path.join(ref_dir, "reference.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(f"ok   {dst}: exact references written; quantized vs HF's f32 logits: " + ", ".join(f"{r:.2e}" for r in rels))
    return {"bytes": os.path.getsize(dst), "quantized_vs_hf_rel": rels}


def make_fixtures(root):
    out_dir = os.path.join(root, "gguf")
    os.makedirs(out_dir, exist_ok=True)
    summary = {}
    for name in FIXTURES:
        src = os.path.join(root, "parity", name)
        dst = os.path.join(out_dir, name + ".gguf")
        convert(src, dst, "f32", name)
        ok, res, neg = verify(dst, src)
        g = GGUFFile(dst)
        summary[name] = {"ok": ok, "bytes": os.path.getsize(dst), "results": res, "negative_controls": neg,
                         "keys": {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in g.kv.items()},
                         "tensors": {k: [GGML_TYPES[t["type"]][0], list(t["shape"])] for k, t in g.tensors.items()}}
        if not ok:
            raise SystemExit(f"{name}: verification failed")
    for src_name, outtype in QUANT_FIXTURES:
        summary[src_name.replace("_f32", "_" + outtype)] = make_quant_fixture(root, src_name, outtype)
    return summary


def main(argv):
    if len(argv) >= 2 and argv[1] == "--verify":
        if len(argv) not in (4, 6) or (len(argv) == 6 and argv[4] != "--tol"):
            raise SystemExit("usage: hf_to_gguf.py --verify FILE.gguf PARITY_DIR [--tol 1e-4]")
        ok, _, _ = verify(argv[2], argv[3], tol=float(argv[5]) if len(argv) == 6 else 1e-4)
        sys.exit(0 if ok else 1)
    if len(argv) >= 2 and argv[1] == "--make-fixtures":
        root = argv[2] if len(argv) > 2 else "tests/fixtures"
        s = make_fixtures(root)
        if len(argv) > 3:
            with open(argv[3], "w") as f:
                json.dump(s, f, indent=1)
        print(f"{len(s)} GGUF fixtures written and verified")
        return
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("hf_dir")
    ap.add_argument("out")
    ap.add_argument("--outtype", choices=["f32", "f16", "q8_0", "q4_0"], default="f32")
    args = ap.parse_args(argv[1:])
    w = convert(args.hf_dir, args.out, args.outtype)
    print(f"wrote {args.out}: {len(w.tensors)} tensors, {len(w.kv)} keys, {os.path.getsize(args.out)} bytes")


if __name__ == "__main__":
    main(sys.argv)
