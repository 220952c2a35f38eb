#!/usr/bin/env python3
"""Loads folders written by `memfit export` with Hugging Face transformers, as-is, and checks
that they compute what memfit computed: for each folder, memfit's greedy continuation of a
prompt (byte vocabulary, so ids are the bytes) must be transformers' argmax at every position
where transformers' top two logits differ by more than a rounding margin.

usage: hf_check.py DIR   (DIR holds <name>/ exported folders and <name>.prompt, <name>.out)
Prints one JSON line per model and exits non-zero if any check fails. Needs torch and
transformers (the GPU machine has both; nothing here needs a GPU).
"""
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM


def check(folder, prompt, out):
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    except TypeError:   # transformers before 4.56 names it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    model.eval()
    ids = list(prompt) + list(out)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    agree = ambiguous = 0
    first_bad = None
    for i in range(len(prompt) - 1, len(ids) - 1):
        row = logits[i]
        top2 = torch.topk(row, 2)
        if float(top2.values[0] - top2.values[1]) < 1e-3:
            ambiguous += 1   # a near tie: fp32 rounding may pick either
            continue
        if int(top2.indices[0]) == ids[i + 1]:
            agree += 1
        elif first_bad is None:
            first_bad = i + 1 - len(prompt)
    # generation_config.json (memfit export writes the tokenizer's eos/bos ids there): what
    # transformers' generate will stop at must be what the file says.
    gen_ok, eos = True, None
    gen_file = os.path.join(folder, "generation_config.json")
    if os.path.exists(gen_file):
        with open(gen_file) as f:
            want = json.load(f).get("eos_token_id")
        eos = model.generation_config.eos_token_id
        gen_ok = eos == want
    files = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    return {"model": os.path.basename(folder), "architecture": model.config.architectures[0],
            "params": sum(p.numel() for p in model.parameters()), "weight_files": len(files),
            "tokens": len(out), "agree": agree, "ambiguous": ambiguous, "first_mismatch": first_bad,
            "eos_token_id": eos, "ok": first_bad is None and agree > 0 and gen_ok}


def main():
    root = sys.argv[1]
    ok = True
    for name in sorted(os.listdir(root)):
        folder = os.path.join(root, name)
        if not os.path.isdir(folder):
            continue
        with open(folder + ".prompt", "rb") as f:
            prompt = f.read()
        with open(folder + ".out", "rb") as f:
            out = f.read()
        # memfit prints the prompt, the continuation and a newline.
        assert out.startswith(prompt) and out.endswith(b"\n"), name
        r = check(folder, prompt, out[len(prompt):-1])
        print(json.dumps(r), flush=True)
        ok = ok and r["ok"]
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
