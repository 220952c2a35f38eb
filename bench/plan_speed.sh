#!/usr/bin/env bash
# Search speed of `memfit plan` for every search the README quotes: llama2-70b on 64 and 1,024
# H100s (seq 4096, global batch 1024), the same with --top 50, the 1T-parameter GPT of Megatron-LM
# on 3,072 A100s, the one-GPU LoRA / QLoRA plans of Llama 2, and Qwen3-30B-A3B's (a mixture of
# experts: full fine-tune on 8 H100s, QLoRA of every expert on one). Median of 5 runs each; one JSON
# line per case: candidates evaluated, engine programs recorded (exact plans), the search's own
# seconds (the JSON's `seconds`) and the whole process's wall seconds (start-up and printing
# included). The target: every search under 1 s.
set -euo pipefail
cd "$(dirname "$0")/.."
M=${MEMFIT:-build/memfit}
python3 - "$M" <<'PY'
import json, statistics, subprocess, sys, time
m = sys.argv[1]
big = ["--model", "llama2-70b", "--hardware", "h100-80g", "--seq", "4096", "--global-batch", "1024"]
one = ["--hardware", "h100-80g", "--gpus", "1", "--seq", "512", "--global-batch", "1"]
lora = ["--lora-rank", "16", "--lora-targets", "q,v"]
cases = {
    "llama2-70b, 64 x h100-80g": big + ["--gpus", "64"],
    "llama2-70b, 1024 x h100-80g": big + ["--gpus", "1024"],
    "llama2-70b, 64 x h100-80g, --top 50": big + ["--gpus", "64", "--top", "50"],
    "GPT 1T, 3072 x a100-80g": ["--model", "bench/models/gpt-1t.json", "--hardware", "a100-80g", "--gpus", "3072",
                                "--seq", "2048", "--global-batch", "3072"],
    "llama2-7b LoRA, 1 x h100-80g": ["--model", "llama2-7b"] + one + lora,
    "llama2-7b QLoRA, 1 x h100-80g": ["--model", "llama2-7b"] + one + lora + ["--base-weights", "nf4"],
    "llama2-70b QLoRA full recompute, 1 x h100-80g": ["--model", "llama2-70b"] + one + lora +
        ["--base-weights", "nf4", "--recompute", "full"],
    # A mixture of experts (issue 56's target): 48 layers of 128 experts, the exact programs recorded.
    "qwen3-30b-a3b, 8 x h100-80g": ["--model", "qwen3-30b-a3b", "--hardware", "h100-80g", "--gpus", "8"],
    "qwen3-30b-a3b QLoRA all, 1 x h100-80g": ["--model", "qwen3-30b-a3b", "--hardware", "h100-80g", "--gpus", "1",
                                               "--lora-rank", "16", "--lora-targets", "all", "--base-weights", "nf4"],
}
for name, args in cases.items():
    runs, walls = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        p = subprocess.run([m, "plan", *args, "--json"], capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        if not p.stdout.strip():
            sys.exit(f"plan_speed: {name}: no JSON (exit {p.returncode}): {p.stderr.strip()}")
        runs.append(json.loads(p.stdout))
    secs = statistics.median(r["seconds"] for r in runs)
    print(json.dumps({"case": name, "evaluated": runs[0]["evaluated"], "exact_recorded": runs[0]["exact_recorded"],
                      "listed": len(runs[0]["best"]), "median_search_s": round(secs, 4),
                      "median_wall_s": round(statistics.median(walls), 4), "under_1_s": secs < 1.0}))
PY
