#!/usr/bin/env python3
"""Random-weight checkpoints with real model shapes, for `forge bench`. numpy only.

    python3 tools/make_bench_model.py PRESET OUTDIR [--seed N] [--tiny] [--check]

Presets (see PRESETS):
  llama1b-f16      Llama-3.2-1B shape, HF layout: config.json + model.safetensors (F16)
  llama1b-q4_0     same weights as ONE GGUF (OUTDIR/model.gguf), 2-D weights Q4_0, norms F32
  llama1b-q8_0     same, Q8_0
  llama1b-mlx4     same weights as an mlx-lm 4-bit group-64 affine checkpoint (tied head = the
                   quantized embedding)
  llama8b-q4_0     Llama-3.1-8B shape (hidden 4096, 32 layers, ffn 14336, untied LM head) as ONE
                   GGUF, Q4_0 (4.7 GB)
  llama8b-bf16     the same weights, HF layout, BF16 (16 GB): PyTorch's side of bench/train_bench.sh's 8B row
  gemma3-1b-bf16   Gemma3-1B shape (gemma3_text), HF layout, BF16
  qwen3-0.6b-f16   Qwen3-0.6B shape, HF layout, F16
  gemma4-e2b-bf16  Gemma-4-E2B shape (gemma4_text: 35 layers 4 sliding : 1 full, head_dim 256 / 512, the
                   last 20 layers sharing the KV cache with a double-wide MLP, per-layer inputs of
                   256 from a 262144 x 8960 table), HF layout, BF16
  qwen3moe-30b-a3b-q4_0  Qwen3-30B-A3B shape (hidden 2048, 48 layers, 128 experts of 768, 8 per
                   token) as ONE GGUF `qwen3moe`, Q4_0 (16.5 GB; a token reads ~3.3B weights)
  qwen35-2b-f16    Qwen3.5-2B shape (hidden 2048, 24 layers: 18 Gated DeltaNet + 6 gated attention,
                   ffn 6144, tied; 1.88B weights) as ONE GGUF `qwen35`, F16 (3.5 GiB)
  qwen35moe-35b-a3b-q4_0  Qwen3.5-35B-A3B shape (hidden 2048, 40 layers: 30 Gated DeltaNet + 10 gated
                   attention, 256 experts of 512, 8 routed + 1 shared) as ONE GGUF `qwen35moe`, Q4_0
                   (34.7B weights, 18.2 GiB; written tensor by tensor, never whole in memory)

Weights: N(0, 0.02); RMSNorm weights 1 + N(0, 0.02) for Llama/Qwen and N(0, 0.1) for Gemma
(Gemma applies 1 + w). Qwen 3.5's other 1-D tensors (dt_bias, A_log) are drawn as norms,
1 + N(0, 0.02): decays exp(-e softplus(1 + a)) ~ 0.03 a step, finite; its norms but the gated one
are stored as 1 + w by the converter (about 2 in the GGUF files), which the next RMSNorm absorbs.
Every tensor has its own random stream, seeded from (--seed, tensor name), and is drawn in fixed
row chunks, so the same seed gives the same weights in every preset of a model: the Q4_0/Q8_0/MLX
files are quantizations of exactly the F16 checkpoint's values (the GGUF ones with llama.cpp's q/k
row permutation), which lets forge compare formats against each other.

Memory: one chunk of rows (4M elements) at a time, except the q/k projections of the GGUF
presets, which are permuted whole (a few MB), and Qwen 3.5's linear-attention tensors (up to 16M
values). Files are written tensor by tensor at offsets known up front.

GGUF files follow tools/hf_to_gguf.py (llama.cpp's converter conventions) and quantize with
llama.cpp's reference quantizers, i.e. what `llama-quantize --pure` would make from the
converted F16 file. They carry a synthetic SentencePiece-style vocabulary (tokenizer.ggml.model
"llama": <unk>, <s>, </s>, 256 byte tokens, then "▁t<id>") only so that llama.cpp can load them
(llama-bench needs a vocabulary of n_vocab tokens); the HF presets have no tokenizer files.

--tiny shrinks every dimension (same code path) for tests; --check re-reads the output and
compares tensors with the regenerated source weights.
"""

import argparse
import json
import os
import struct
import sys
import time
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # keep tools/ free of __pycache__
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import hf_to_gguf as gg  # noqa: E402
import mlx_quant as mq  # noqa: E402
import safetensors_np as stnp  # noqa: E402

CHUNK_ELEMS = 1 << 22
STD = 0.02


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# model configs (as the published config.json files have them)

def llama_config(tiny):
    c = {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
        "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
        "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
        "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "float16",
        "use_cache": True, "vocab_size": 128256,
    }
    if tiny:
        c.update(head_dim=16, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                 num_hidden_layers=2, num_key_value_heads=2, vocab_size=512, bos_token_id=1, eos_token_id=2)
    return c


def llama8b_config(tiny):
    """Llama-3.1-8B shape: untied LM head (lm_head.weight, GGUF output.weight)."""
    c = llama_config(tiny)
    if not tiny:
        c.update(head_dim=128, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32)
        c["rope_scaling"] = dict(c["rope_scaling"], factor=8.0)
    c.update(tie_word_embeddings=False, torch_dtype="bfloat16")
    return c


def gemma3_config(tiny):
    n = 26
    c = {
        "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": 1,
        "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 1152, "initializer_range": 0.02, "intermediate_size": 6912,
        "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
        "num_hidden_layers": n, "num_key_value_heads": 1, "pad_token_id": 0,
        "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
        "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 512,
        "sliding_window_pattern": 6, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "use_cache": True, "vocab_size": 262144,
    }
    if tiny:
        c.update(head_dim=16, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                 num_hidden_layers=6, num_key_value_heads=1, vocab_size=512, sliding_window=8,
                 query_pre_attn_scalar=16, max_position_embeddings=4096)
    c["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                        for i in range(c["num_hidden_layers"])]
    return dict(sorted(c.items()))


def qwen3_config(tiny):
    c = {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
        "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
        "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None,
        "tie_word_embeddings": True, "torch_dtype": "float16", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 151936,
    }
    if tiny:
        c.update(head_dim=32, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                 num_hidden_layers=2, num_key_value_heads=2, vocab_size=512, bos_token_id=1, eos_token_id=2)
    return c


def qwen3moe_config(tiny):
    """Qwen3-30B-A3B's config.json (every layer sparse, norm_topk_prob)."""
    c = {
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
        "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
        "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
        "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
    }
    if tiny:
        c.update(head_dim=32, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_attention_heads=4,
                 num_hidden_layers=2, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, vocab_size=512,
                 bos_token_id=1, eos_token_id=2)
    return c


def qwen35_config(tiny):
    """Qwen3.5-2B's text config (Qwen/Qwen3.5-2B's config.json, text_config: hidden 2048, 24 layers,
    every 4th full attention with 8 query heads of 256 (query | gate rows) over 2 KV heads, the rest
    Gated DeltaNet with 16 key and 16 value heads of 128, ffn 6144, tied embeddings, vocab 248320;
    the numbers as two public reimplementations quote that config.json, found with the library
    search, 2026-11-27). Written flat (model_type qwen3_5_text), as tools/hf_to_gguf.py reads it."""
    c = {
        "architectures": ["Qwen3_5ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 248044, "eos_token_id": 248046, "full_attention_interval": 4, "head_dim": 256,
        "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 16, "linear_value_head_dim": 128, "max_position_embeddings": 262144,
        "model_type": "qwen3_5_text", "num_attention_heads": 8, "num_hidden_layers": 24, "num_key_value_heads": 2,
        "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25,
                            "rope_theta": 10000000.0, "rope_type": "default"},
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 248320,
    }
    if tiny:  # head_dim 32: a rotated part of 8, sections 2 + 1 + 1 of its 4 pairs
        c.update(head_dim=32, hidden_size=64, intermediate_size=128, linear_key_head_dim=16, linear_value_head_dim=16,
                 linear_num_key_heads=4, linear_num_value_heads=4, num_attention_heads=4, num_hidden_layers=4,
                 num_key_value_heads=2, vocab_size=512, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096)
        c["rope_parameters"] = dict(c["rope_parameters"], mrope_section=[2, 1, 1])
    return c


def qwen35moe_config(tiny):
    """Qwen3.5-35B-A3B's text config (Qwen/Qwen3.5-35B-A3B's config.json, text_config: hidden 2048,
    40 layers, every 4th full attention with 16 query heads of 256 over 2 KV heads, Gated DeltaNet
    with 16 key heads and 32 value heads of 128, 256 experts of 512 rows, 8 routed + 1 shared expert
    of 512, untied LM head, vocab 248320; as public reimplementations' tests quote it, with the GGUF
    keys llama.cpp's converter writes for it, found with the library search, 2026-11-27)."""
    c = {
        "architectures": ["Qwen3_5MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 248044, "eos_token_id": 248046, "full_attention_interval": 4, "head_dim": 256,
        "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 32, "linear_value_head_dim": 128, "max_position_embeddings": 262144,
        "model_type": "qwen3_5_moe_text", "moe_intermediate_size": 512, "num_attention_heads": 16, "num_experts": 256,
        "num_experts_per_tok": 8, "num_hidden_layers": 40, "num_key_value_heads": 2, "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25,
                            "rope_theta": 10000000.0, "rope_type": "default"},
        "shared_expert_intermediate_size": 512, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "use_cache": True, "vocab_size": 248320,
    }
    if tiny:  # value heads twice the key heads, as the real shape has (the tiled reorder runs)
        c.update(head_dim=32, hidden_size=64, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                 linear_num_value_heads=4, moe_intermediate_size=32, num_attention_heads=4, num_experts=8,
                 num_experts_per_tok=2, num_hidden_layers=4, num_key_value_heads=2, shared_expert_intermediate_size=64,
                 vocab_size=512, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096)
        c["rope_parameters"] = dict(c["rope_parameters"], mrope_section=[2, 1, 1])
    return c


def gemma4_config(tiny):
    """Gemma-4-E2B's text config (as google/gemma-4-E2B's config.json has it)."""
    n = 35
    c = {
        "architectures": ["Gemma4ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attention_k_eq_v": False, "bos_token_id": 2, "enable_moe_block": False, "eos_token_id": 1,
        "final_logit_softcapping": 30.0, "global_head_dim": 512, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 1536, "hidden_size_per_layer_input": 256, "initializer_range": 0.02, "intermediate_size": 6144,
        "max_position_embeddings": 131072, "model_type": "gemma4_text", "num_attention_heads": 8, "num_hidden_layers": n,
        "num_key_value_heads": 1, "num_kv_shared_layers": 20, "pad_token_id": 0, "rms_norm_eps": 1e-06,
        "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
                            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
        "sliding_window": 512, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
        "use_double_wide_mlp": True, "vocab_size": 262144, "vocab_size_per_layer_input": 262144,
    }
    if tiny:
        c.update(head_dim=16, global_head_dim=32, hidden_size=64, hidden_size_per_layer_input=8, intermediate_size=128,
                 num_attention_heads=4, num_hidden_layers=10, num_kv_shared_layers=4, vocab_size=512,
                 vocab_size_per_layer_input=512, sliding_window=8, max_position_embeddings=4096)
    c["layer_types"] = ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(c["num_hidden_layers"])]
    return dict(sorted(c.items()))


def norms_offset(cfg):
    """Gemma 2/3 multiply by 1 + w (their norm weights are drawn small); every other family by w."""
    return cfg["model_type"] in ("gemma2", "gemma3_text")


MODELS = {"llama": llama_config, "llama8b": llama8b_config, "gemma3": gemma3_config, "qwen3": qwen3_config,
          "qwen3moe": qwen3moe_config, "gemma4": gemma4_config, "qwen35": qwen35_config, "qwen35moe": qwen35moe_config}
# preset -> (model, format, type)
PRESETS = {
    "llama1b-f16": ("llama", "hf", "float16"),
    "llama1b-q4_0": ("llama", "gguf", "q4_0"),
    "llama1b-q8_0": ("llama", "gguf", "q8_0"),
    "llama1b-mlx4": ("llama", "mlx", "float16"),
    "llama8b-q4_0": ("llama8b", "gguf", "q4_0"),
    "llama8b-bf16": ("llama8b", "hf", "bfloat16"),
    "gemma3-1b-bf16": ("gemma3", "hf", "bfloat16"),
    "qwen3-0.6b-f16": ("qwen3", "hf", "float16"),
    "qwen3moe-30b-a3b-q4_0": ("qwen3moe", "gguf", "q4_0"),
    "gemma4-e2b-bf16": ("gemma4", "hf", "bfloat16"),
    "qwen35-2b-f16": ("qwen35", "gguf", "f16"),
    "qwen35moe-35b-a3b-q4_0": ("qwen35moe", "gguf", "q4_0"),
}
MLX_GROUP, MLX_BITS = 64, 4


def tensor_specs(cfg):
    """[(HF name, shape, kind)], kind in {embed, linear, norm}; lm_head only when untied. A
    mixture-of-experts layer's experts are one 3-D tensor per projection [E, rows, cols] (named
    as transformers 5 names its fused parameters; the GGUF writer maps them to ffn_*_exps)."""
    if cfg["model_type"] in ("qwen3_5_text", "qwen3_5_moe_text"):
        return qwen35_specs(cfg)
    E, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or E // H
    gemma = cfg["model_type"].startswith("gemma")
    if cfg["model_type"] == "gemma4_text":
        return gemma4_specs(cfg)
    qk_norm = cfg["model_type"] in ("qwen3", "qwen3_moe", "gemma3_text")
    moe = cfg["model_type"] == "qwen3_moe"
    out = [("model.embed_tokens.weight", (V, E), "embed")]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.append((p + "input_layernorm.weight", (E,), "norm"))
        out += [(p + "self_attn.q_proj.weight", (H * D, E), "linear"),
                (p + "self_attn.k_proj.weight", (KV * D, E), "linear"),
                (p + "self_attn.v_proj.weight", (KV * D, E), "linear"),
                (p + "self_attn.o_proj.weight", (E, H * D), "linear")]
        if qk_norm:
            out += [(p + "self_attn.q_norm.weight", (D,), "norm"), (p + "self_attn.k_norm.weight", (D,), "norm")]
        out.append((p + "post_attention_layernorm.weight", (E,), "norm"))
        if gemma:
            out += [(p + "pre_feedforward_layernorm.weight", (E,), "norm"),
                    (p + "post_feedforward_layernorm.weight", (E,), "norm")]
        if moe:
            X, I = cfg["num_experts"], cfg["moe_intermediate_size"]
            out += [(p + "mlp.gate.weight", (X, E), "linear"), (p + "mlp.experts.gate_proj", (X, I, E), "linear"),
                    (p + "mlp.experts.up_proj", (X, I, E), "linear"), (p + "mlp.experts.down_proj", (X, E, I), "linear")]
            continue
        out += [(p + "mlp.gate_proj.weight", (F, E), "linear"), (p + "mlp.up_proj.weight", (F, E), "linear"),
                (p + "mlp.down_proj.weight", (E, F), "linear")]
    out.append(("model.norm.weight", (E,), "norm"))
    if not cfg.get("tie_word_embeddings", True):
        out.append(("lm_head.weight", (V, E), "linear"))
    return out


def gemma4_specs(cfg):
    """Gemma 4's tensors: per-layer head sizes (full layers global_head_dim), no k/v projections
    on the KV-shared tail (nor v_proj on k = v layers), the double-wide MLP there, per-layer
    inputs, layer_scalar."""
    E, V, H, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    P, shared = cfg["hidden_size_per_layer_input"], cfg["num_kv_shared_layers"]
    out = [("model.embed_tokens.weight", (V, E), "embed")]
    if P:
        out += [("model.embed_tokens_per_layer.weight", (cfg["vocab_size_per_layer_input"], L * P), "embed"),
                ("model.per_layer_model_projection.weight", (L * P, E), "linear"),
                ("model.per_layer_projection_norm.weight", (P,), "norm")]
    for i in range(L):
        p = f"model.layers.{i}."
        full = cfg["layer_types"][i] == "full_attention"
        D = cfg["global_head_dim"] if full else cfg["head_dim"]
        KV = cfg.get("num_global_key_value_heads") or cfg["num_key_value_heads"] if full and cfg["attention_k_eq_v"] \
            else cfg["num_key_value_heads"]
        is_shared = i >= L - shared
        F = cfg["intermediate_size"] * (2 if is_shared and cfg["use_double_wide_mlp"] else 1)
        out += [(p + "input_layernorm.weight", (E,), "norm"), (p + "self_attn.q_proj.weight", (H * D, E), "linear"),
                (p + "self_attn.q_norm.weight", (D,), "norm")]
        if not is_shared:
            out += [(p + "self_attn.k_proj.weight", (KV * D, E), "linear"), (p + "self_attn.k_norm.weight", (D,), "norm")]
            if not (full and cfg["attention_k_eq_v"]):
                out.append((p + "self_attn.v_proj.weight", (KV * D, E), "linear"))
        out += [(p + "self_attn.o_proj.weight", (E, H * D), "linear"),
                (p + "post_attention_layernorm.weight", (E,), "norm"), (p + "pre_feedforward_layernorm.weight", (E,), "norm"),
                (p + "post_feedforward_layernorm.weight", (E,), "norm"),
                (p + "mlp.gate_proj.weight", (F, E), "linear"), (p + "mlp.up_proj.weight", (F, E), "linear"),
                (p + "mlp.down_proj.weight", (E, F), "linear"), (p + "layer_scalar", (1,), "norm")]
        if P:
            out += [(p + "per_layer_input_gate.weight", (P, E), "linear"), (p + "per_layer_projection.weight", (E, P), "linear"),
                    (p + "post_per_layer_input_norm.weight", (E,), "norm")]
    out.append(("model.norm.weight", (E,), "norm"))
    return out


def qwen35_specs(cfg):
    """Qwen 3.5's tensors under transformers' names (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM):
    Gated DeltaNet layers (linear_attn.*: the fused q|k|v in-projection, z, b, a, the depthwise
    conv [conv_dim, 1, K], dt_bias, A_log, the gated norm over a value head, out_proj) and every
    full_attention_interval-th layer gated attention (q_proj's rows a head's query then its gate,
    q/k norms); the MLP dense or 256 experts with a shared expert and its sigmoid gate."""
    E, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    H, KV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    conv_dim = 2 * nk * dk + nv * dv
    moe = cfg["model_type"] == "qwen3_5_moe_text"
    out = [("model.embed_tokens.weight", (V, E), "embed")]
    for i, kind in enumerate(gg.qwen35_layer_types(cfg)):
        p = f"model.layers.{i}."
        out.append((p + "input_layernorm.weight", (E,), "norm"))
        if kind == "linear_attention":
            a = p + "linear_attn."
            out += [(a + "in_proj_qkv.weight", (conv_dim, E), "linear"), (a + "in_proj_z.weight", (nv * dv, E), "linear"),
                    (a + "in_proj_b.weight", (nv, E), "linear"), (a + "in_proj_a.weight", (nv, E), "linear"),
                    (a + "conv1d.weight", (conv_dim, 1, K), "linear"), (a + "dt_bias", (nv,), "norm"),
                    (a + "A_log", (nv,), "norm"), (a + "norm.weight", (dv,), "norm"),
                    (a + "out_proj.weight", (E, nv * dv), "linear")]
        else:
            out += [(p + "self_attn.q_proj.weight", (2 * H * D, E), "linear"),
                    (p + "self_attn.k_proj.weight", (KV * D, E), "linear"),
                    (p + "self_attn.v_proj.weight", (KV * D, E), "linear"),
                    (p + "self_attn.o_proj.weight", (E, H * D), "linear"),
                    (p + "self_attn.q_norm.weight", (D,), "norm"), (p + "self_attn.k_norm.weight", (D,), "norm")]
        out.append((p + "post_attention_layernorm.weight", (E,), "norm"))
        if moe:
            X, I, S = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
            out += [(p + "mlp.gate.weight", (X, E), "linear"), (p + "mlp.experts.gate_proj", (X, I, E), "linear"),
                    (p + "mlp.experts.up_proj", (X, I, E), "linear"), (p + "mlp.experts.down_proj", (X, E, I), "linear"),
                    (p + "mlp.shared_expert.gate_proj.weight", (S, E), "linear"),
                    (p + "mlp.shared_expert.up_proj.weight", (S, E), "linear"),
                    (p + "mlp.shared_expert.down_proj.weight", (E, S), "linear"),
                    (p + "mlp.shared_expert_gate.weight", (1, E), "linear")]
        else:
            F = cfg["intermediate_size"]
            out += [(p + "mlp.gate_proj.weight", (F, E), "linear"), (p + "mlp.up_proj.weight", (F, E), "linear"),
                    (p + "mlp.down_proj.weight", (E, F), "linear")]
    out.append(("model.norm.weight", (E,), "norm"))
    if not cfg.get("tie_word_embeddings", True):
        out.append(("lm_head.weight", (V, E), "linear"))
    return out


# ---------------------------------------------------------------------------
# weights

def chunk_rows(shape):
    cols = shape[-1] if len(shape) > 1 else shape[0]
    rows = shape[0] if len(shape) > 1 else 1
    return max(1, min(rows, CHUNK_ELEMS // cols))


def gen_chunks(seed, name, shape, kind, gemma, dtype):
    """Yield (first row, float32 rows already rounded to the checkpoint dtype)."""
    rng = np.random.Generator(np.random.SFC64(np.random.SeedSequence([seed, zlib.crc32(name.encode())])))
    if len(shape) == 1:
        x = rng.standard_normal(shape[0], dtype=np.float32)
        x = x * np.float32(0.1) if gemma else np.float32(1) + x * np.float32(STD)
        yield 0, mq.round_to(x, dtype)
        return
    rows, cols = int(np.prod(shape[:-1])), shape[-1]  # (a 3-D expert tensor: its rows one after another)
    step = chunk_rows((rows, cols))
    for r0 in range(0, rows, step):
        r = min(step, rows - r0)
        x = rng.standard_normal((r, cols), dtype=np.float32)
        x *= np.float32(STD)
        yield r0, mq.round_to(x, dtype)


def full_tensor(seed, name, shape, kind, gemma, dtype):
    parts = [c for _, c in gen_chunks(seed, name, shape, kind, gemma, dtype)]
    return np.concatenate(parts, axis=0).reshape(shape) if len(shape) > 1 else parts[0]


# ---------------------------------------------------------------------------
# safetensors, written at precomputed offsets

def st_open(path, entries, metadata):
    items = sorted(entries, key=lambda t: (-stnp.DTYPES[t[1]].itemsize, t[0]))
    header = {"__metadata__": metadata} if metadata else {}
    rel, off = {}, 0
    for name, dt, shape in items:
        nb = int(np.prod(shape, dtype=np.int64)) * stnp.DTYPES[dt].itemsize
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + nb]}
        rel[name] = off
        off += nb
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    base = 8 + len(hb)
    f = open(path, "wb")
    f.write(struct.pack("<Q", len(hb)))
    f.write(hb)
    f.truncate(base + off)
    return f, {k: base + v for k, v in rel.items()}, off


def st_put(f, offset, arr):
    f.seek(offset)
    f.write(np.ascontiguousarray(arr).view(np.uint8).reshape(-1).data)


def st_read_lazy(path):
    """Header + memmap (for checks of big files)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    meta = header.pop("__metadata__", {})
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for k, v in header.items():
        b, e = v["data_offsets"]
        out[k] = (v["dtype"], mm[8 + n + b:8 + n + e].view(stnp.DTYPES[v["dtype"]]).reshape(v["shape"]))
    if 8 + n + max(v["data_offsets"][1] for v in header.values()) != len(mm):
        raise ValueError(f"{path}: size does not match the header")
    return out, meta


def st_dtype(dtype):
    return mq.SAFETENSORS_DTYPE[dtype]


def write_hf(out, cfg, dtype, seed, specs, progress):
    gemma = norms_offset(cfg)
    sd = st_dtype(dtype)
    entries = [(n, sd, s) for n, s, _ in specs]
    f, offs, total = st_open(os.path.join(out, "model.safetensors"), entries, {"format": "pt"})
    with f:
        for i, (name, shape, kind) in enumerate(specs):
            rb = (shape[-1] if len(shape) > 1 else shape[0]) * 2
            for r0, x in gen_chunks(seed, name, shape, kind, gemma, dtype):
                st_put(f, offs[name] + r0 * rb, mq.to_storage(x, dtype))
            progress(name, int(np.prod(shape)))
    return total


def pack4(codes):
    """mq.pack(codes, 4) for 4-bit codes, vectorized with shifts (checked against mq.pack)."""
    r, n = codes.shape
    c = codes.reshape(r, n // 8, 8).astype(np.uint32)
    w = c[..., 0].copy()
    for k in range(1, 8):
        w |= c[..., k] << np.uint32(4 * k)
    return w


def write_mlx(out, cfg, dtype, seed, specs, progress):
    sd = st_dtype(dtype)
    entries, quantized = [], set()
    for name, shape, kind in specs:
        if kind in ("embed", "linear") and shape[-1] % MLX_GROUP == 0:
            mod = name[: -len(".weight")]
            quantized.add(name)
            entries += [(mod + ".weight", "U32", (shape[0], shape[1] * MLX_BITS // 32)),
                        (mod + ".scales", sd, (shape[0], shape[1] // MLX_GROUP)),
                        (mod + ".biases", sd, (shape[0], shape[1] // MLX_GROUP))]
        else:
            entries.append((name, sd, shape))
    f, offs, total = st_open(os.path.join(out, "model.safetensors"), entries, {"format": "mlx"})
    checked_pack = False
    with f:
        for name, shape, kind in specs:
            if name not in quantized:
                rb = (shape[-1] if len(shape) > 1 else shape[0]) * 2
                for r0, x in gen_chunks(seed, name, shape, kind, False, dtype):
                    st_put(f, offs[name] + r0 * rb, mq.to_storage(x, dtype))
            else:
                mod = name[: -len(".weight")]
                g = shape[1] // MLX_GROUP
                for r0, x in gen_chunks(seed, name, shape, kind, False, dtype):
                    codes, s, b = mq.quantize_codes(x, MLX_GROUP, MLX_BITS)
                    words = pack4(codes)
                    if not checked_pack:
                        assert np.array_equal(words[:4], mq.pack(codes[:4], MLX_BITS)), "pack4 != mq.pack"
                        checked_pack = True
                    st_put(f, offs[mod + ".weight"] + r0 * shape[1] * MLX_BITS // 8, words)
                    st_put(f, offs[mod + ".scales"] + r0 * g * 2, mq.to_storage(s, dtype))
                    st_put(f, offs[mod + ".biases"] + r0 * g * 2, mq.to_storage(b, dtype))
            progress(name, int(np.prod(shape)))
    index = {"metadata": {"total_size": total, "total_parameters": sum(int(np.prod(s)) for _, s, _ in specs)},
             "weight_map": {k: "model.safetensors" for k in sorted(n for n, _, _ in entries)}}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as fi:
        json.dump(index, fi, indent=4)
    return total


def synthetic_vocab(w, n_vocab):
    """A SentencePiece-style vocabulary of n_vocab tokens so that llama.cpp accepts the file."""
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    toks += [f"\u2581t{i}" for i in range(len(toks), n_vocab)]
    toks = toks[:n_vocab]
    types = ([2, 3, 3] + [6] * 256 + [1] * n_vocab)[:n_vocab]
    scores = [0.0] * min(n_vocab, 259) + [-float(i) for i in range(max(0, n_vocab - 259))]
    w.add("tokenizer.ggml.model", gg.STRING, "llama")
    w.add("tokenizer.ggml.tokens", gg.ARRAY, (gg.STRING, toks))
    w.add("tokenizer.ggml.scores", gg.ARRAY, (gg.F32V, scores))
    w.add("tokenizer.ggml.token_type", gg.ARRAY, (gg.I32, types))
    w.add("tokenizer.ggml.bos_token_id", gg.U32, 1)
    w.add("tokenizer.ggml.eos_token_id", gg.U32, 2)
    w.add("tokenizer.ggml.unknown_token_id", gg.U32, 0)
    w.add("tokenizer.ggml.add_bos_token", gg.BOOL, True)
    w.add("tokenizer.ggml.add_eos_token", gg.BOOL, False)


def gguf_plan(cfg, outtype, specs):
    hp, _ = gg.hparams_of(cfg)
    arch = gg.ARCHS[cfg["model_type"]]
    plan = []  # (gguf name, hf name or None, shape, ggml type)
    for gname, arr in gg.extra_tensors(cfg, arch):
        plan.append((gname, None, arr.shape, gg.GGML_F32, arr))
    for name, shape, kind in specs:
        if ".mlp.experts." in name:  # blk.N.ffn_{gate,up,down}_exps
            bid, proj = name.split(".")[2], name.rsplit(".", 1)[1].split("_")[0]
            gname = f"blk.{bid}.ffn_{proj}_exps.weight"
        else:
            gname = gg.gguf_tensor_name(name, arch)
        if gname.endswith(".ssm_conv1d.weight"):  # the converter squeezes the conv's [conv_dim, 1, K] to [conv_dim, K]
            shape = (shape[0], shape[-1])
        plan.append((gname, name, shape, gg.out_type(gname, shape, outtype), None))
    return arch, hp, plan


_GGUF_JOB = {}  # what the tensor encoders need; set before the pool forks


def _gguf_tensor(gname):
    """One GGUF tensor's bytes (run in a worker process: quantizing is most of the time)."""
    j = _GGUF_JOB
    hf, shape, gt, arr = j["by_name"][gname]
    if hf is None:
        return gname, None, gg.encode(arr, gt)
    arch, hp, seed = j["arch"], j["hp"], j["seed"]
    gemma = arch.startswith("gemma")
    kind = "norm" if len(shape) == 1 else "linear"
    permuted = arch == "llama" and hf.endswith(("q_proj.weight", "k_proj.weight"))
    # Qwen 3.5's linear-attention tensors move whole rows between the q|k and v parts (value heads
    # reordered to ggml's tiled order), so they are transformed whole (the largest, in_proj_qkv of
    # the 35B shape, is 16M values)
    permuted |= arch in gg.QWEN35 and ".linear_attn." in hf
    if permuted or len(shape) == 1:
        x = full_tensor(seed, hf, shape, kind, gemma, "float16")
        pieces = [gg.encode(gg.transform(hf, x, "F16", arch, hp), gt)]
    else:
        pieces = [gg.encode(gg.transform(hf, x, "F16", arch, hp), gt)
                  for _, x in gen_chunks(seed, hf, shape, kind, gemma, "float16")]
    return gname, hf, np.concatenate([np.ascontiguousarray(p).view(np.uint8).reshape(-1) for p in pieces])


def write_gguf(out, cfg, outtype, seed, specs, progress, preset):
    arch, hp, plan = gguf_plan(cfg, outtype, specs)
    w = gg.GGUFWriter(arch)
    gg.gguf_metadata(w, cfg, outtype, preset)
    synthetic_vocab(w, cfg["vocab_size"])
    w.add("general.quantization_version", gg.U32, gg.GGML_QUANT_VERSION)
    by_name = {}
    for gname, hf, shape, gt, arr in plan:
        w.add_tensor(gname, shape, gt)
        by_name[gname] = (hf, shape, gt, arr)
    _GGUF_JOB.update(by_name=by_name, arch=arch, hp=hp, seed=seed)
    order = [name for name, *_ in w.layout()]
    # tensors are made in worker processes, in file order, and written as they arrive
    import multiprocessing as mp
    with mp.get_context("fork").Pool(max(1, min(len(order), os.cpu_count() or 1))) as pool:
        made = pool.imap(_gguf_tensor, order)

        def produce(gname, shape, gt):
            got, hf, data = next(made)
            assert got == gname, (got, gname)
            yield data
            if hf is not None:
                progress(hf, int(np.prod(shape)))

        return w.write(os.path.join(out, "model.gguf"), produce)


# ---------------------------------------------------------------------------
# checks

def check(out, preset, cfg, seed, specs):
    """Re-read the output; compare tensors with the regenerated source weights."""
    model, fmt, typ = PRESETS[preset]
    gemma = norms_offset(cfg)
    dtype = "bfloat16" if cfg["model_type"].startswith("gemma") else "float16"
    n_full = len(specs) if cfg["vocab_size"] <= 4096 else 0  # tiny: every tensor
    picks = specs if n_full else [s for s in specs if s[0] in (
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.input_layernorm.weight", "model.norm.weight", "model.layers.1.mlp.down_proj.weight")]
    lines = []
    if fmt in ("hf", "mlx"):
        path = os.path.join(out, "model.safetensors")
        t, meta = (stnp.read(path) if os.path.getsize(path) < (256 << 20) else st_read_lazy(path))
        assert meta == {"format": "mlx" if fmt == "mlx" else "pt"}, meta
        for name, shape, kind in picks:
            src = full_tensor(seed, name, shape, kind, gemma, dtype)
            if fmt == "hf" or name.endswith("norm.weight"):
                dt, a = t[name]
                got = mq.storage_to_f32(np.asarray(a), dtype)
                assert got.shape == tuple(shape) and np.array_equal(got, src), name
            else:
                mod = name[: -len(".weight")]
                r = mq.quantize(src, MLX_GROUP, MLX_BITS, dtype)  # reference path, incl. mq.pack
                for leaf in ("weight", "scales", "biases"):
                    assert np.array_equal(np.asarray(t[f"{mod}.{leaf}"][1]), r[leaf]), f"{mod}.{leaf}"
                deq = mq.dequantize(t[mod + ".weight"][1], t[mod + ".scales"][1], t[mod + ".biases"][1],
                                    MLX_GROUP, MLX_BITS, dtype)
                step = np.abs(mq.storage_to_f32(np.asarray(t[mod + ".scales"][1]), dtype)).repeat(MLX_GROUP, 1)
                err = np.abs(deq - src)
                assert (err <= step * 1.01 + 1e-6).all(), name  # clamped ends: up to one step
            lines.append(name)
        n_st = len(t)
        lines = [f"safetensors: {n_st} tensors, {len(lines)} compared with the source weights"]
    else:
        g = gg.GGUFFile(os.path.join(out, "model.gguf"))
        arch, hp, plan = gguf_plan(cfg, typ, specs)
        assert g.kv["general.architecture"] == arch
        assert g.kv["general.file_type"] == gg.FILE_TYPE[typ]
        assert len(g.kv["tokenizer.ggml.tokens"]) == cfg["vocab_size"]
        assert set(g.tensors) == {p[0] for p in plan}
        worst = {}
        for gname, hf, shape, gt, arr in plan:
            info = g.tensors[gname]
            assert info["shape"] == tuple(shape) and info["type"] == gt, gname
            if hf is None:
                assert np.array_equal(g.get(gname, np.float32), arr)
                continue
            if hf not in {p[0] for p in picks}:
                continue
            src = gg.transform(hf, full_tensor(seed, hf, shape, "norm" if len(shape) == 1 else "linear", gemma, "float16"),
                               "F16", arch, hp)
            got = g.get(gname, np.float32)
            if gt == gg.GGML_F32:
                assert np.array_equal(got, src), gname
                continue
            assert np.array_equal(np.asarray(g.raw(gname)).reshape(-1), gg.encode(src, gt).view(np.uint8).reshape(-1)), gname
            amax = np.abs(src.reshape(-1, 32)).max(1, keepdims=True)
            step = amax / 8 if gt == gg.GGML_Q4_0 else amax / 127 * 1.2 / 2
            err = np.abs(got - src).reshape(-1, 32)
            assert (err <= step * 1.01 + 1e-7).all(), gname
            worst[gname] = float((err / np.maximum(amax, 1e-30)).max())
        lines = [f"gguf: {len(g.tensors)} tensors, {len(g.kv)} keys, data at {g.data_offset}; "
                 f"{len(worst)} quantized tensors byte-identical to a fresh quantization of the source and "
                 f"within quantization error (max |err|/amax {max(worst.values()) if worst else 0:.3g})"]
    return lines


# ---------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description="random-weight bench checkpoints with real shapes")
    ap.add_argument("preset", choices=sorted(PRESETS))
    ap.add_argument("outdir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="shrink every dimension (tests)")
    ap.add_argument("--check", action="store_true", help="re-read and compare with the source weights")
    args = ap.parse_args()
    model, fmt, typ = PRESETS[args.preset]
    cfg = MODELS[model](args.tiny)
    specs = tensor_specs(cfg)
    n_params = sum(int(np.prod(s)) for _, s, _ in specs)
    os.makedirs(args.outdir, exist_ok=True)
    t0 = time.time()
    done = [0]
    last = [0.0]

    def progress(name, n):
        done[0] += n
        now = time.time()
        if now - last[0] > 2 or done[0] == n_params:
            last[0] = now
            log(f"  {100.0 * done[0] / n_params:5.1f}%  {done[0] / 1e6:8.1f}M / {n_params / 1e6:.1f}M params"
                f"  {now - t0:6.1f}s  {name}")

    log(f"{args.preset}: {n_params / 1e6:.1f}M parameters -> {args.outdir}")
    if fmt == "gguf":
        size = write_gguf(args.outdir, cfg, typ, args.seed, specs, progress, args.preset)
    else:
        conf = dict(cfg)
        if fmt == "mlx":
            q = {"group_size": MLX_GROUP, "bits": MLX_BITS, "mode": "affine"}
            conf["quantization"] = q
            conf["quantization_config"] = dict(q)
            conf = dict(sorted(conf.items()))
        with open(os.path.join(args.outdir, "config.json"), "w") as f:
            json.dump(conf, f, indent=2)
        writer = write_mlx if fmt == "mlx" else write_hf
        size = writer(args.outdir, cfg, typ, args.seed, specs, progress)
    dt = time.time() - t0
    log(f"{args.preset}: wrote {size / 2**30:.3f} GiB of tensor data in {dt:.1f}s")
    if args.check:
        t1 = time.time()
        for line in check(args.outdir, args.preset, cfg, args.seed, specs):
            log("check ok: " + line)
        log(f"check took {time.time() - t1:.1f}s")


if __name__ == "__main__":
    main()
