#!/usr/bin/env python3
"""PyTorch + PEFT LoRA training speed on a checkpoint, to set beside `forge bench --train`.

    python3 bench/train_torch.py HF_DIR [--batch 4] [--seq 512] [--rank 16] [--targets all]
                                 [--grad-checkpoint] [--attn sdpa|eager] [--reps 5]

What it runs is what a PEFT user runs: the base model in bfloat16 on the GPU, attention as
transformers' `attn_implementation` (sdpa, PyTorch's fused scaled_dot_product_attention, the
default a user gets; eager, the plain matmul-softmax-matmul, for comparison),
LoRA (r, alpha 2r, dropout 0) on the chosen projections with PEFT's float32 adapters, the
forward pass under torch.autocast(bfloat16), HF's causal-LM loss on the batch (labels = the
tokens), backward, torch.optim.AdamW (lr 1e-4). One warm-up step, then `reps` timed steps
(wall time around each step after torch.cuda.synchronize). Prints one JSON object: the step
time (median), training tokens/s (batch x seq over that), and the peak of
torch.cuda.max_memory_allocated (the caching allocator's own figure; nvidia-smi would show more).
Random token ids, seeded; the checkpoint's weights are what they are.
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
import peft  # noqa: E402

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--targets", default="all")
    ap.add_argument("--grad-checkpoint", action="store_true")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    targets = ALL if a.targets == "all" else a.targets.split(",")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    t0 = time.time()
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation=a.attn).to(dev)
    load_s = time.time() - t0
    if a.grad_checkpoint:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    cfg = peft.LoraConfig(r=a.rank, lora_alpha=2 * a.rank, lora_dropout=0.0, target_modules=targets, bias="none", task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, cfg)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    n_train = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=1e-4)
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (a.batch, a.seq), generator=g).to(dev)
    times, losses = [], []
    torch.cuda.reset_peak_memory_stats()
    for i in range(a.reps + 1):
        torch.cuda.synchronize()
        s = time.time()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i:
            times.append(time.time() - s)
        losses.append(float(out.loss.detach()))
    step = statistics.median(times)
    print(json.dumps({
        "framework": f"torch {torch.__version__} + transformers {transformers.__version__} + peft {peft.__version__}",
        "device": torch.cuda.get_device_name(0), "model": a.model, "dtype": "bf16 weights, bf16 autocast, fp32 adapters",
        "attention": a.attn, "train_batch": a.batch, "train_seq": a.seq, "rank": a.rank, "targets": a.targets,
        "grad_checkpoint": a.grad_checkpoint, "trainable_parameters": n_train, "reps": a.reps,
        "train_step_ms": round(step * 1e3, 3), "train_tok_s": round(a.batch * a.seq / step, 2),
        "train_loss": losses[-1], "peak_device_bytes": torch.cuda.max_memory_allocated(), "load_s": round(load_s, 3)}))


if __name__ == "__main__":
    sys.exit(main())
