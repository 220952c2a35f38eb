#!/usr/bin/env python3
"""GPT-2 124M training steps in plain PyTorch eager: the baseline memfit's CUDA backend is
measured against (issue: CUDA backend). A model written here (no transformers), bf16 autocast
with fp32 master weights, AdamW, scaled_dot_product_attention (flash on Hopper), T = 1024.
For each micro-batch it prints one JSON line: tokens/s (median of the timed steps), ms/step,
peak allocated and reserved bytes, MFU against the bf16 dense peak given by --peak-tflops.

usage: python3 bench/pytorch_gpt2.py [--batches 8,16,32] [--steps 20] [--peak-tflops 989]
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.NH = NH

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, V=50257, P=1024, C=768, L=12, NH=12):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(P, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = nn.LayerNorm(C)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.lnf(x), self.wte.weight)   # tied head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def run(B, T, steps, warmup, peak):
    torch.manual_seed(0)
    model = GPT2().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    flops_per_token = 6 * n + 12 * 12 * 768 * T
    idx = torch.randint(0, 50257, (B, T), device="cuda")
    tgt = torch.randint(0, 50257, (B, T), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    s = statistics.median(times)
    tps = B * T / s
    return {"impl": "pytorch-eager", "torch": torch.__version__, "device": torch.cuda.get_device_name(),
            "B": B, "T": T, "steps": steps, "ms_per_step": 1e3 * s, "tokens_per_s": tps,
            "mfu": tps * flops_per_token / (peak * 1e12), "loss": float(loss),
            "peak_allocated": torch.cuda.max_memory_allocated(), "peak_reserved": torch.cuda.max_memory_reserved()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="8,16,32")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    for B in (int(b) for b in a.batches.split(",")):
        try:
            print(json.dumps(run(B, a.seq, a.steps, a.warmup, a.peak_tflops)), flush=True)
        except torch.cuda.OutOfMemoryError:
            print(json.dumps({"B": B, "oom": True}), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
