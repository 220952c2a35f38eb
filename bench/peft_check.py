#!/usr/bin/env python3
"""Checks `memfit export --adapter-only` and `--merge-lora` against Hugging Face PEFT.

Loads the base model folder plus memfit's adapter folder with transformers + peft
(PeftModel.from_pretrained), and memfit's merged folder with transformers alone, and checks:
  1. every tensor of adapter_model.safetensors landed in the PEFT model unchanged (no key was
     silently ignored: PEFT warns, it does not fail, on names it does not recognise);
  2. the PEFT model's logits equal the merged folder's logits (max |diff| / max |logit|);
  3. PEFT's own merge (merge_and_unload) gives the merged folder's weights, tensor by tensor.
For an int8 or nf4 base (adapter_model.safetensors metadata "memfit.base_weights"), memfit merged
into the dequantized base it trained against while PEFT adds the adapters to the fp32 base here,
so 2 and 3 differ by the quantization error: they are reported, not failed.

usage: peft_check.py --adapter DIR --merged DIR [--base DIR] [--tol 1e-4] [--tokens 32]
  --base defaults to adapter_config.json's base_model_name_or_path.
Prints one JSON line and exits non-zero if a check fails. Needs torch, transformers, peft and
safetensors (no GPU). Not run in CI.

A run to check, from the repository root:
  memfit train --model llama-nano --steps 30 --checkpoint-every 30 --out /tmp/pc/full
  memfit export /tmp/pc/full/checkpoints --out /tmp/pc/base
  memfit train --model /tmp/pc/base --lora-rank 8 --lora-targets all --steps 20 \\
      --checkpoint-every 20 --out /tmp/pc/lora
  memfit export /tmp/pc/lora/checkpoints --out /tmp/pc/adapter --adapter-only
  memfit export /tmp/pc/lora/checkpoints --out /tmp/pc/merged --merge-lora
  python3 bench/peft_check.py --adapter /tmp/pc/adapter --merged /tmp/pc/merged
"""
import argparse
import json
import os
import sys

import torch
from peft import PeftModel
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def load(folder):
    try:
        m = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    except TypeError:   # transformers before 4.56 names it torch_dtype
        m = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    return m.eval()


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--merged", required=True)
    ap.add_argument("--base")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--tokens", type=int, default=32)
    a = ap.parse_args()

    with open(os.path.join(a.adapter, "adapter_config.json")) as f:
        cfg = json.load(f)
    base_dir = a.base or cfg.get("base_model_name_or_path")
    if not base_dir:
        sys.exit("peft_check: the adapter records no base folder (the run started from the seed's "
                 "initialisation); pass --base")
    adapter_file = os.path.join(a.adapter, "adapter_model.safetensors")
    with safe_open(adapter_file, "pt") as f:
        meta = f.metadata() or {}
    quantized = meta.get("memfit.base_weights", "compute") not in ("compute", "")

    base = load(base_dir)
    peft = PeftModel.from_pretrained(base, a.adapter).eval()
    merged = load(a.merged)

    # 1. Every adapter tensor is in the PEFT model (PEFT inserts the adapter name, "default").
    sd = peft.state_dict()
    ours = load_file(adapter_file)
    missing, changed = [], []
    for name, t in ours.items():
        key = name.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")
        if key not in sd:
            missing.append(name)
        elif not torch.equal(sd[key].float().cpu(), t.float()):
            changed.append(name)

    # 2. Logits on a fixed random sequence.
    vocab = merged.config.vocab_size
    n = min(a.tokens, getattr(merged.config, "n_positions", None) or merged.config.max_position_embeddings)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, n), generator=g)
    with torch.no_grad():
        lp = peft(ids).logits[0]
        lm = merged(ids).logits[0]
    logits_rel = rel(lp, lm)

    # 3. PEFT's merge against memfit's, tensor by tensor (GPT-2's tied lm_head is wte).
    folded = peft.merge_and_unload().state_dict()
    msd = merged.state_dict()
    worst_name, worst = None, 0.0
    for name, t in msd.items():
        if name not in folded:
            continue
        r = rel(folded[name], t) if t.abs().max() > 0 else float((folded[name] - t).abs().max())
        if r > worst:
            worst_name, worst = name, r

    ok_keys = not missing and not changed
    ok = ok_keys and (quantized or (logits_rel <= a.tol and worst <= a.tol))
    print(json.dumps({"base": base_dir, "adapter": a.adapter, "merged": a.merged,
                      "architecture": merged.config.architectures[0], "r": cfg["r"],
                      "lora_alpha": cfg["lora_alpha"], "target_modules": cfg["target_modules"],
                      "base_weights": meta.get("memfit.base_weights", "compute"),
                      "adapter_tensors": len(ours), "missing": missing[:5], "changed": changed[:5],
                      "logits_max_rel": logits_rel, "weights_max_rel": worst, "worst_tensor": worst_name,
                      "tolerance": a.tol, "checked_strictly": not quantized, "ok": ok}), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
