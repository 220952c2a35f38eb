"""Issue 27's long-context table: the longest sequence whose exact plan fits a budget.

For each model and technique set, binary-searches the largest --seq (a multiple of STEP) whose
`memfit plan --hardware cpu --json` (the engine's own program, placed: exact) needs at most BUDGET
bytes on the device, runtime excluded, at micro-batch 1. The models' position limits are lifted by
writing their config.json with max_position_embeddings (n_positions for GPT-2, whose learned
position table then grows with the sequence, as it must) set to the probed length.

usage: long_context.py MEMFIT OUTDIR BUDGET_BYTES STEP MAX_SEQ
"""
import json
import subprocess
import sys

memfit, out, budget, step, max_seq = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])

MODELS = {
    # llama-mini's shape with a byte vocabulary (what the demo trains), RoPE: any length.
    "llama-mini": lambda T: {"model_type": "llama", "vocab_size": 256, "hidden_size": 256, "intermediate_size": 688,
                             "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 4,
                             "max_position_embeddings": T, "rope_theta": 10000.0},
    # gpt2-6l: 6 layers x 384, GPT-2's vocabulary and learned positions (T rows of them).
    "gpt2-6l": lambda T: {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 384, "n_layer": 6, "n_head": 6,
                          "n_positions": T},
}
BASE = ["--attention", "flash", "--recompute", "full", "--loss-chunk", "1024"]
TECHNIQUES = {
    "flash": ["--attention", "flash"],
    "flash + full recompute + loss chunk 1024": BASE,
    "... + TiledMLP (--mlp-chunk 1024)": BASE + ["--mlp-chunk", "1024"],
}


def planned(model, flags, T):
    """Device bytes (runtime excluded) of the exact plan at sequence T, and its activations."""
    path = f"{out}/{model}-{T}.json"
    with open(path, "w") as f:
        json.dump(MODELS[model](T), f)
    cmd = [memfit, "plan", "--model", path, "--hardware", "cpu", "--gpus", "1", "--seq", str(T), "--micro-batch", "1",
           "--global-batch", "1", "--precision", "fp32", "--offload", "none", "--zero", "0", "--calibration", "",
           "--json"] + flags
    r = subprocess.run(cmd, capture_output=True, text=True)
    plan = json.loads(r.stdout)
    if not plan["best"]:   # not even this machine's memory (rejected by the analytic model)
        return float("inf"), float("inf")
    p = plan["best"][0]
    assert p["memory"]["exact"], f"not an exact plan: {' '.join(cmd)}"
    mem = p["memory"]["per_device"]
    return sum(v for k, v in mem.items() if k != "runtime"), mem["activations"]


def largest(model, flags):
    lo, hi = 0, max_seq // step   # in units of step: fits(lo * step) holds (or lo = 0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if planned(model, flags, mid * step)[0] <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo * step


print(f"budget {budget / 2**30:.2f} GiB per device (runtime excluded), micro-batch 1, fp32, exact plans")
print("| model | techniques | longest seq | planned bytes there | activations there |")
print("|---|---|---|---|---|")
for model in MODELS:
    for name, flags in TECHNIQUES.items():
        T = largest(model, flags)
        total, act = planned(model, flags, T) if T else (0, 0)
        print(f"| {model} | {name} | {T:,} | {total:,} | {act:,} |", flush=True)
