#!/usr/bin/env bash
# A mixture of experts on the CPU against the dense model with its active parameters (issue 56):
# bench/models/moe-small.json (Qwen3-MoE-shaped: 4 layers of 256 channels, 8 experts of 384, top
# 2) and moe-small-dense.json (the same attention, one MLP of 768 = 2 x 384: the parameters a
# token's matmuls read, equal), each training STEPS steps of BATCH x SEQ bytes of the bundled
# corpus, ROUNDS rounds interleaved (A B A B). Per run: tokens/s, the planned and measured peak
# bytes (equal), the final loss; then the median MoE / dense tokens/s ratio. The MoE adds the
# router, the routing (top-k, a counting sort), the dispatch and combine copies and smaller
# gemms (each expert's rows, in tiles); the ratio says what they cost on the cores at hand.
# EXTRA: more flags for both (e.g. EXTRA="--precision bf16").
set -euo pipefail
cd "$(dirname "$0")/.."
M=${MEMFIT:-build/memfit}
OUT=${OUT:-runs/moe-bench}
BATCH=${BATCH:-8}
SEQ=${SEQ:-256}
STEPS=${STEPS:-12}
ROUNDS=${ROUNDS:-3}
rm -rf "$OUT"
mkdir -p "$OUT"
python3 - "$M" "$OUT" "$BATCH" "$SEQ" "$STEPS" "$ROUNDS" "${EXTRA:-}" <<'PY'
import json, statistics, subprocess, sys
m, out, batch, seq, steps, rounds, extra = sys.argv[1:8]
models = {"moe": "bench/models/moe-small.json", "dense": "bench/models/moe-small-dense.json"}
tps = {k: [] for k in models}
for r in range(int(rounds)):
    for name, path in models.items():
        run = f"{out}/{name}-{r}"
        cmd = [m, "train", "--model", path, "--micro-batch", batch, "--seq", seq, "--steps", steps, "--eval-every", "0",
               "--eval-batches", "1", "--sample", "0", "--progress", "quiet", "--save-final", "false", "--out", run,
               *extra.split()]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"moe.sh: {name}: {p.stderr.strip()}")
        s = json.load(open(f"{run}/summary.json"))
        planned = sum(s["planned"]["peak_live"].values()) if isinstance(s["planned"]["peak_live"], dict) else s["planned"]["peak_live"]
        measured = sum(s["measured"]["peak_live"].values()) if isinstance(s["measured"]["peak_live"], dict) else s["measured"]["peak_live"]
        tps[name].append(s["tokens_per_s"])
        print(json.dumps({"round": r, "model": name, "params": s["config"]["params"], "tokens_per_s": round(s["tokens_per_s"]),
                          "planned_peak_bytes": planned, "measured_peak_bytes": measured, "planned_equals_measured": planned == measured,
                          "final_loss": round(s["final_loss"], 4)}))
ratios = [a / b for a, b in zip(tps["moe"], tps["dense"])]
print(json.dumps({"median_moe_tokens_per_s": round(statistics.median(tps["moe"])),
                  "median_dense_tokens_per_s": round(statistics.median(tps["dense"])),
                  "moe_over_dense": [round(x, 3) for x in ratios], "median_ratio": round(statistics.median(ratios), 3)}))
PY
