#!/usr/bin/env python3
"""memfit against PyTorch eager on the CPU, in one sitting, interleaved.

The configuration of the CPU-speed issue: GPT-2 with 6 layers x 384 channels x 6 heads, the GPT-2
vocabulary (50,257, tied head), B = 8, T = 256, AdamW, 2 threads. Four runs per round, in turn:
memfit fp32, memfit bf16 (`memfit bench`, its defaults otherwise), PyTorch fp32 and PyTorch bf16
autocast (the same model written below in plain PyTorch, with fp32 master weights). Each run is
its own process; the table gives per run the median tokens/s over the rounds (min-max), the
median ms/step and the peak RSS, then the ratios the issue asks about.

PyTorch's setup is its fastest on these machines: Debian's python3-torch (1.13) on OpenBLAS's
OpenMP build, OPENBLAS_CORETYPE=SkylakeX where the CPU has AVX-512 (Haswell otherwise),
OMP_NUM_THREADS and torch.set_num_threads at the thread count, and tcmalloc preloaded (the
allocator PyTorch's CPU performance guides recommend: with glibc's malloc each step's large
tensors are mapped and unmapped again, and on the 2-core Zen 5 VM PyTorch then spent most of a
step in page faults: fp32 330 against 1,310 tokens/s with tcmalloc). Debian's torch calls
whatever libblas.so.3 is installed: `apt-get install python3-torch libopenblas0-openmp
libtcmalloc-minimal4` (with only the reference BLAS, libblas3, its fp32 matmuls run at about 3
GFLOP/s; the script refuses, as it does without tcmalloc). Torch 1.13 has no
scaled_dot_product_attention: attention is the explicit masked softmax.

usage: python3 bench/cpu_vs_pytorch.py [--memfit build/memfit] [--rounds 3] [--steps 5]
(run with /usr/bin/python3, which has Debian's torch)
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def torch_run(a):
    """Child process: time PyTorch steps; print one JSON line."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    C, NH, V, T, B = a.embd, a.heads, a.vocab, a.seq, a.batch

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x, mask):
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / (C // NH) ** 0.5)
            att = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + self.proj(y)
            return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(1024, C)
            self.h = nn.ModuleList(Block() for _ in range(a.layers))
            self.lnf = nn.LayerNorm(C)
            self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1), persistent=False)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(T))
            for b in self.h:
                x = b(x, self.mask)
            logits = F.linear(self.lnf(x), self.wte.weight)   # tied head
            return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))

    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    ms = []
    for i in range(a.warmup + a.steps):
        idx = torch.randint(0, V, (B, T))
        tgt = torch.randint(0, V, (B, T))
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.torch == "bf16"):
            loss = model(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= a.warmup:
            ms.append((time.perf_counter() - t0) * 1e3)
    med = statistics.median(ms)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # before the matmul probe's buffers
    print(json.dumps({"ms_per_step": med, "tokens_per_s": B * T / (med / 1e3), "peak_rss_bytes": rss,
                      "torch": torch.__version__, "matmul_gflops": torch_matmul_gflops(torch, a.torch)}))


def torch_matmul_gflops(torch, dtype):
    """PyTorch's own matmul rate on the shapes memfit's probe uses (the MLP's up projection at
    B*T = 2048), median of 5: OpenBLAS for fp32, oneDNN (mkldnn) for bf16."""
    dt = torch.float32 if dtype == "fp32" else torch.bfloat16
    a, b = torch.randn(2048, 384, dtype=dt), torch.randn(384, 1536, dtype=dt)
    torch.mm(a, b)
    secs = []
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(a, b)
        secs.append(time.perf_counter() - t0)
    return 2 * 2048 * 384 * 1536 / statistics.median(secs) / 1e9


def cpu_facts():
    name, flags = "unknown CPU", ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and name == "unknown CPU":
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1]
    return name, set(flags.split())


def run_json(cmd, env):
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--memfit", default="build/memfit")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--embd", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--torch", choices=["fp32", "bf16"], help=argparse.SUPPRESS)   # child mode
    a = p.parse_args()
    if a.torch:
        return torch_run(a)
    if (a.layers, a.embd, a.heads, a.vocab) != (6, 384, 6, 50257):
        sys.exit("memfit's side is the gpt2-6l preset: keep --layers 6 --embd 384 --heads 6 --vocab 50257")

    blas = subprocess.run(["update-alternatives", "--query", "libblas.so.3-x86_64-linux-gnu"],
                          capture_output=True, text=True).stdout
    if "openblas" not in blas.split("Value:", 1)[-1].split("\n", 1)[0]:
        sys.exit("libblas.so.3 is not OpenBLAS: apt-get install libopenblas0-openmp (Debian's torch would run its "
                 "matmuls on the reference BLAS)")
    if not os.path.exists(TCMALLOC):
        sys.exit(f"{TCMALLOC} is missing: apt-get install libtcmalloc-minimal4 (PyTorch on glibc's malloc maps and "
                 "unmaps its large tensors every step, 2-4x slower on these VMs)")
    name, flags = cpu_facts()
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads),
               OPENBLAS_CORETYPE="SkylakeX" if "avx512f" in flags else "Haswell")
    torch_env = dict(env, LD_PRELOAD=TCMALLOC)
    common = ["--batch", str(a.batch), "--seq", str(a.seq), "--threads", str(a.threads),
              "--steps", str(a.steps), "--warmup", str(a.warmup)]
    runs = {
        "memfit fp32": [a.memfit, "bench", "--model", "gpt2-6l", "--precision", "fp32"] + common,
        "memfit bf16": [a.memfit, "bench", "--model", "gpt2-6l", "--precision", "bf16"] + common,
        "PyTorch fp32": [sys.executable, __file__, "--torch", "fp32"] + common,
        "PyTorch bf16 autocast": [sys.executable, __file__, "--torch", "bf16"] + common,
    }
    res = {k: [] for k in runs}
    for r in range(a.rounds):
        for k, cmd in runs.items():
            j = run_json(cmd, env if k.startswith("memfit") else torch_env)
            res[k].append(j)
            print(f"round {r + 1}/{a.rounds} {k}: {j['tokens_per_s']:.0f} tokens/s", file=sys.stderr)

    def med(k, f):
        return statistics.median(x[f] for x in res[k])

    print(f"{name}; avx512_bf16: {'yes' if 'avx512_bf16' in flags else 'no'}; {a.threads} threads; "
          f"GPT-2 {a.layers}x{a.embd}, vocabulary {a.vocab}, B={a.batch}, T={a.seq}; "
          f"{a.rounds} interleaved rounds of {a.steps} timed steps; PyTorch {res['PyTorch fp32'][0]['torch']} on "
          f"OpenBLAS (OpenMP build, OPENBLAS_CORETYPE={env['OPENBLAS_CORETYPE']}) for fp32 and oneDNN for bf16, "
          f"tcmalloc preloaded; "
          f"memfit's bf16 path: {res['memfit bf16'][0].get('bf16_path', '?')}\n")
    print("| run | tokens/s (median, min-max) | ms/step | peak RSS |")
    print("|---|---|---|---|")
    for k in runs:
        tps = [x["tokens_per_s"] for x in res[k]]
        if k.startswith("memfit"):
            peak = "matmul_peak_gflops" if k.endswith("fp32") else "mfu_peak_gflops"
            extra = f" (MFU {med(k, 'mfu'):.2f}; matmul {med(k, peak):.0f} GFLOP/s)"
        else:
            extra = f" (its matmul {med(k, 'matmul_gflops'):.0f} GFLOP/s)"
        print(f"| {k} | {med(k, 'tokens_per_s'):,.0f} ({min(tps):,.0f}-{max(tps):,.0f}){extra} | "
              f"{med(k, 'ms_per_step'):,.0f} | {med(k, 'peak_rss_bytes') / 2**20:,.0f} MiB |")
    mf = max(med("memfit fp32", "tokens_per_s"), med("memfit bf16", "tokens_per_s"))
    pt = max(med("PyTorch fp32", "tokens_per_s"), med("PyTorch bf16 autocast", "tokens_per_s"))
    ratios = {
        "memfit bf16 / memfit fp32 tokens/s": med("memfit bf16", "tokens_per_s") / med("memfit fp32", "tokens_per_s"),
        "memfit best / PyTorch best tokens/s": mf / pt,
        "memfit fp32 / PyTorch best tokens/s": med("memfit fp32", "tokens_per_s") / pt,
        "memfit fp32 peak RSS / PyTorch fp32's": med("memfit fp32", "peak_rss_bytes") / med("PyTorch fp32", "peak_rss_bytes"),
    }
    print()
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}")
    print(json.dumps({"cpu": name, "runs": {k: {"tokens_per_s": med(k, "tokens_per_s"),
                                                  "peak_rss_bytes": med(k, "peak_rss_bytes")} for k in runs},
                      "ratios": ratios}))


if __name__ == "__main__":
    main()
