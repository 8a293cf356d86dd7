#!/usr/bin/env python3
"""Embedding throughput, forge beside sentence-transformers (bench/embed_bench.sh runs both).

  python3 bench/embed_bench.py make DIR TOKENIZERS   the two models and the texts:
      DIR/qwen3-embedding-0.6b   Qwen3-Embedding-0.6B's shape (Qwen3Model: hidden 1024, 28
                                 layers, 16 / 8 heads of 128, MLP 3072, vocab 151669), random
                                 BF16 weights, last-token pooling, Normalize, its query prompt
      DIR/embeddinggemma-300m    EmbeddingGemma-300M's shape (Gemma3TextModel, bidirectional:
                                 hidden 768, 24 layers, 3 / 1 heads of 256, MLP 1152, vocab
                                 262144, sliding window 512 on 5 of 6 layers), random BF16
                                 weights, mean pooling, Dense 768 -> 3072 -> 768, Normalize
      DIR/texts.json             1,000 texts of 64-512 tokens (a fixed pseudo-random draw of
                                 words), the same for both
    TOKENIZERS holds qwen3/tokenizer.json and gemma3/tokenizer.json (../shared/tokenizers).
  python3 bench/embed_bench.py make-np DIR TOKENIZERS   the same shapes and files with numpy
      alone (no torch: a machine without a GPU stack; texts of the same lengths in words)
  python3 bench/embed_bench.py peer DIR MODEL OUT.json [VECTORS.f32]
      sentence-transformers' encode() of the texts on CUDA, batch 32, BF16 as the weights are
      saved: the best of 3 timed runs after a warm-up, texts per second; with VECTORS.f32 (forge's
      vectors, [n, dim] float32) also how far they are from its own (max |a - b|, min cosine).
"""

import json
import os
import random
import sys
import time


def make(out, toks):
    import torch
    import transformers
    from safetensors.torch import save_file

    torch.manual_seed(0)
    os.makedirs(out, exist_ok=True)
    rng = random.Random(7)
    syll = ["ka", "lo", "mi", "ren", "ta", "vor", "qui", "ze", "pan", "dor", "li", "sen", "mo", "tri", "gal", "ux"]
    words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 3))) for _ in range(3000)] + \
        "the of and to in is that for it as with was on be by this are from at or".split()
    tk = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(toks, "qwen3", "tokenizer.json"))
    texts = []
    while len(texts) < 1000:
        want = rng.randint(64, 512)
        t = " ".join(rng.choice(words) for _ in range(int(want * 0.45)))
        ids = tk(t)["input_ids"]
        if len(ids) > want:
            t = tk.decode(ids[:want])
        texts.append(t)
    json.dump(texts, open(os.path.join(out, "texts.json"), "w"))

    def st_files(d, pooling, prompts, max_seq, dense=()):
        mods = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        os.makedirs(os.path.join(d, "1_Pooling"), exist_ok=True)
        pc = {k: False for k in ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                                 "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")}
        pc[pooling] = True
        pc["include_prompt"] = True
        pc["word_embedding_dimension"] = 1024 if "qwen3" in d else 768
        json.dump(pc, open(os.path.join(d, "1_Pooling", "config.json"), "w"))
        for w in dense:
            path = f"{len(mods)}_Dense"
            os.makedirs(os.path.join(d, path), exist_ok=True)
            json.dump({"in_features": w.shape[1], "out_features": w.shape[0], "bias": False,
                       "activation_function": "torch.nn.modules.linear.Identity"}, open(os.path.join(d, path, "config.json"), "w"))
            save_file({"linear.weight": w.contiguous()}, os.path.join(d, path, "model.safetensors"))
            mods.append({"idx": len(mods), "name": str(len(mods)), "path": path, "type": "sentence_transformers.models.Dense"})
        mods.append({"idx": len(mods), "name": str(len(mods)), "path": f"{len(mods)}_Normalize", "type": "sentence_transformers.models.Normalize"})
        os.makedirs(os.path.join(d, mods[-1]["path"]), exist_ok=True)
        json.dump(mods, open(os.path.join(d, "modules.json"), "w"))
        json.dump({"prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"},
                  open(os.path.join(d, "config_sentence_transformers.json"), "w"))
        json.dump({"max_seq_length": max_seq, "do_lower_case": False}, open(os.path.join(d, "sentence_bert_config.json"), "w"))

    def tok_files(d, family, extra):
        t = json.load(open(os.path.join(toks, family, "tokenizer.json"), encoding="utf-8"))
        if family == "qwen3":  # Qwen3-Embedding appends <|endoftext|>
            t["post_processor"] = {"type": "TemplateProcessing",
                                   "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
                                   "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                            {"Sequence": {"id": "B", "type_id": 1}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 1}}],
                                   "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [151643], "tokens": ["<|endoftext|>"]}}}
        else:  # EmbeddingGemma adds <bos> and <eos>
            t["post_processor"] = {"type": "TemplateProcessing",
                                   "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                              {"SpecialToken": {"id": "<eos>", "type_id": 0}}],
                                   "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                            {"SpecialToken": {"id": "<eos>", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                                            {"SpecialToken": {"id": "<eos>", "type_id": 1}}],
                                   "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]},
                                                      "<eos>": {"id": "<eos>", "ids": [1], "tokens": ["<eos>"]}}}
        json.dump(t, open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8"), ensure_ascii=False)
        cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 32768}
        cfg.update(extra)
        json.dump(cfg, open(os.path.join(d, "tokenizer_config.json"), "w"))

    def spread(model):
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "norm" not in n:
                    p.normal_(0.0, 0.02)

    d = os.path.join(out, "qwen3-embedding-0.6b")
    cfg = transformers.Qwen3Config(vocab_size=151669, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                   num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
                                   rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=151643,
                                   eos_token_id=151643, bos_token_id=151643)
    m = transformers.Qwen3Model(cfg)
    spread(m)
    m.to(torch.bfloat16).save_pretrained(d)
    tok_files(d, "qwen3", {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "padding_side": "left"})
    st_files(d, "pooling_mode_lasttoken", {"query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:",
                                           "document": ""}, 8192)
    del m

    d = os.path.join(out, "embeddinggemma-300m")
    cfg = transformers.Gemma3TextConfig(vocab_size=262144, hidden_size=768, intermediate_size=1152, num_hidden_layers=24,
                                        num_attention_heads=3, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                                        sliding_window=512, max_position_embeddings=2048, use_bidirectional_attention=True,
                                        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 4,
                                        pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True)
    m = transformers.Gemma3TextModel(cfg)
    spread(m)
    m.to(torch.bfloat16).save_pretrained(d)
    tok_files(d, "gemma3", {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "padding_side": "right"})
    st_files(d, "pooling_mode_mean_tokens", {"query": "task: search result | query: ", "document": "title: none | text: "}, 2048,
             [(torch.randn(3072, 768) * 0.02).to(torch.bfloat16), (torch.randn(768, 3072) * 0.02).to(torch.bfloat16)])


def save_bf16(path, tensors):
    """A safetensors file of numpy float32 arrays stored as BF16 (rounded to nearest even)."""
    import numpy as np
    header, blobs, at = {}, [], 0
    for name, a in tensors.items():
        u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
        b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h)
        for b in blobs:
            f.write(b)


def make_np(out, toks):
    """The same two shapes, texts and sentence-transformers files without torch (numpy only), for
    a machine without a GPU stack: the lavapipe measurement. Weights N(0, 0.02), norms 1
    (Gemma's stored as 0: it multiplies by 1 + w)."""
    import numpy as np
    rng = np.random.default_rng(0)
    os.makedirs(out, exist_ok=True)
    r = random.Random(7)
    syll = ["ka", "lo", "mi", "ren", "ta", "vor", "qui", "ze", "pan", "dor", "li", "sen", "mo", "tri", "gal", "ux"]
    words = ["".join(r.choice(syll) for _ in range(r.randint(1, 3))) for _ in range(3000)] + \
        "the of and to in is that for it as with was on be by this are from at or".split()
    texts = [" ".join(r.choice(words) for _ in range(int(r.randint(64, 512) * 0.45))) for _ in range(1000)]
    json.dump(texts, open(os.path.join(out, "texts.json"), "w"))

    def w(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02)

    def model(d, cfg, layers, norm_one, extra_norms, st_pooling, prompts, max_seq, dense, family, special):
        os.makedirs(d, exist_ok=True)
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=1)
        H, D, nh, nkv, F = cfg["hidden_size"], cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]
        one = np.ones if norm_one else np.zeros
        t = {"embed_tokens.weight": w(cfg["vocab_size"], H), "norm.weight": one(H, np.float32)}
        for l in range(layers):
            p = f"layers.{l}."
            t.update({p + "self_attn.q_proj.weight": w(nh * D, H), p + "self_attn.k_proj.weight": w(nkv * D, H),
                      p + "self_attn.v_proj.weight": w(nkv * D, H), p + "self_attn.o_proj.weight": w(H, nh * D),
                      p + "self_attn.q_norm.weight": one(D, np.float32), p + "self_attn.k_norm.weight": one(D, np.float32),
                      p + "input_layernorm.weight": one(H, np.float32), p + "post_attention_layernorm.weight": one(H, np.float32),
                      p + "mlp.gate_proj.weight": w(F, H), p + "mlp.up_proj.weight": w(F, H), p + "mlp.down_proj.weight": w(H, F)})
            for n in extra_norms:
                t[p + n + ".weight"] = one(H, np.float32)
        save_bf16(os.path.join(d, "model.safetensors"), t)
        tj = json.load(open(os.path.join(toks, family, "tokenizer.json"), encoding="utf-8"))
        tj["post_processor"] = special
        json.dump(tj, open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8"), ensure_ascii=False)
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, open(os.path.join(d, "tokenizer_config.json"), "w"))
        mods = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        os.makedirs(os.path.join(d, "1_Pooling"), exist_ok=True)
        json.dump({"word_embedding_dimension": H, st_pooling: True, "include_prompt": True}, open(os.path.join(d, "1_Pooling", "config.json"), "w"))
        for (o, i) in dense:
            path = f"{len(mods)}_Dense"
            os.makedirs(os.path.join(d, path), exist_ok=True)
            json.dump({"in_features": i, "out_features": o, "bias": False, "activation_function": "torch.nn.modules.linear.Identity"},
                      open(os.path.join(d, path, "config.json"), "w"))
            save_bf16(os.path.join(d, path, "model.safetensors"), {"linear.weight": w(o, i)})
            mods.append({"idx": len(mods), "name": str(len(mods)), "path": path, "type": "sentence_transformers.models.Dense"})
        mods.append({"idx": len(mods), "name": str(len(mods)), "path": f"{len(mods)}_Normalize", "type": "sentence_transformers.models.Normalize"})
        json.dump(mods, open(os.path.join(d, "modules.json"), "w"))
        json.dump({"prompts": prompts}, open(os.path.join(d, "config_sentence_transformers.json"), "w"))
        json.dump({"max_seq_length": max_seq}, open(os.path.join(d, "sentence_bert_config.json"), "w"))

    tmpl = lambda first, last: {"type": "TemplateProcessing", "single": ([{"SpecialToken": {"id": first[0], "type_id": 0}}] if first else []) +
                                [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": last[0], "type_id": 0}}], "pair": [],
                                "special_tokens": {n: {"id": n, "ids": [i], "tokens": [n]} for n, i in ([first] if first else []) + [last]}}
    model(os.path.join(out, "qwen3-embedding-0.6b"),
          {"architectures": ["Qwen3Model"], "model_type": "qwen3", "vocab_size": 151669, "hidden_size": 1024, "intermediate_size": 3072,
           "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 32768,
           "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "dtype": "bfloat16"},
          28, True, [], "pooling_mode_lasttoken", {"query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"},
          8192, [], "qwen3", tmpl(None, ("<|endoftext|>", 151643)))
    model(os.path.join(out, "embeddinggemma-300m"),
          {"architectures": ["Gemma3TextModel"], "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 768, "intermediate_size": 1152,
           "num_hidden_layers": 24, "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 256, "query_pre_attn_scalar": 256,
           "sliding_window": 512, "max_position_embeddings": 2048, "use_bidirectional_attention": True, "rms_norm_eps": 1e-6,
           "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 4, "hidden_activation": "gelu_pytorch_tanh",
           "rope_parameters": {"full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
                               "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
           "tie_word_embeddings": True, "dtype": "bfloat16"},
          24, False, ["pre_feedforward_layernorm", "post_feedforward_layernorm"], "pooling_mode_mean_tokens",
          {"query": "task: search result | query: ", "document": "title: none | text: "}, 2048, [(3072, 768), (768, 3072)], "gemma3",
          tmpl(("<bos>", 2), ("<eos>", 1)))


def peer(out, model, dst, vectors=None):
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    texts = json.load(open(os.path.join(out, "texts.json")))
    st = SentenceTransformer(os.path.join(out, model), device="cuda", model_kwargs={"torch_dtype": torch.bfloat16})
    st.encode(texts[:64], batch_size=32)
    best = 1e9
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        v = st.encode(texts, batch_size=32, convert_to_numpy=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    r = {"model": model, "peer": "sentence-transformers " + __import__("sentence_transformers").__version__ + ", torch " + torch.__version__,
         "device": torch.cuda.get_device_name(0), "texts": len(texts), "seconds": best, "texts_per_s": len(texts) / best,
         "dtype": str(next(st.parameters()).dtype)}
    if vectors:
        f = np.fromfile(vectors, dtype=np.float32).reshape(len(texts), -1)
        v = v.astype(np.float32)
        cos = (f * v).sum(1) / (np.linalg.norm(f, axis=1) * np.linalg.norm(v, axis=1))
        r["forge_vs_peer"] = {"max_abs": float(np.abs(f - v).max()), "min_cosine": float(cos.min()), "mean_cosine": float(cos.mean())}
    json.dump(r, open(dst, "w"))
    print(json.dumps(r))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "make-np":
        make_np(sys.argv[2], sys.argv[3])
    else:
        peer(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else None)
