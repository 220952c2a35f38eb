#!/usr/bin/env bash
# Expert parallelism against data parallelism on 2 ranks (issue 57): bench/models/moe-small.json
# (4 layers of 256 channels, 8 experts of 384, top 2) trained STEPS steps of BATCH x SEQ bytes per
# rank by `mpirun -np 2 memfit train`, with every expert on both ranks (data parallel) and with
# --ep 2 (4 experts a rank, routed rows all-to-all; capacity factor CF), ROUNDS rounds interleaved
# (A B A B), one thread a rank. Per run: tokens/s, each rank's planned and measured peak bytes
# (equal), the parameters + gradients + optimizer states a rank holds, the choices dropped; then
# the median EP / DP tokens/s ratio and the bytes saved. On a CPU the all-to-all is a memory copy
# between processes, so the ratio prices the capacity layout's copies and padding rows, not a
# network.
set -euo pipefail
cd "$(dirname "$0")/.."
M=${MEMFIT:-build/memfit}
OUT=${OUT:-runs/ep-bench}
BATCH=${BATCH:-8}
SEQ=${SEQ:-256}
STEPS=${STEPS:-12}
ROUNDS=${ROUNDS:-3}
CF=${CF:-1.25}
MPIRUN=${MPIRUN:-mpirun}
rm -rf "$OUT"
mkdir -p "$OUT"
python3 - "$M" "$OUT" "$BATCH" "$SEQ" "$STEPS" "$ROUNDS" "$CF" "$MPIRUN" <<'PY'
import json, statistics, subprocess, sys
m, out, batch, seq, steps, rounds, cf, mpirun = sys.argv[1:9]
modes = {"dp": [], "ep": ["--ep", "2", "--moe-capacity-factor", cf]}
tps = {k: [] for k in modes}
held = {}
for r in range(int(rounds)):
    for name, extra in modes.items():
        run = f"{out}/{name}-{r}"
        cmd = [mpirun, "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "-np", "2", "-x", "OMP_NUM_THREADS=1",
               m, "train", "--model", "bench/models/moe-small.json", "--micro-batch", batch, "--seq", seq, "--steps", steps,
               "--eval-every", "0", "--eval-batches", "1", "--sample", "0", "--progress", "quiet", "--save-final", "false",
               "--threads", "1", "--out", run, *extra]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"expert_parallel.sh: {name}: {p.stderr.strip()[-2000:]}")
        s = json.load(open(f"{run}/summary.json"))
        ranks = s["per_rank"]["by_rank"]
        equal = all(x["planned"]["peak_live"] == x["peak_live"] for x in ranks)
        state = sum(ranks[0]["peak_live"][k] for k in ("parameters", "gradients", "optimizer_states", "master_weights"))
        held[name] = state
        dropped = 0
        with open(f"{run}/metrics.jsonl") as f:
            for line in f:
                dropped += json.loads(line).get("moe/dropped", 0)
        tps[name].append(s["tokens_per_s"])
        print(json.dumps({"round": r, "mode": name, "tokens_per_s": round(s["tokens_per_s"]),
                          "peak_bytes_rank0": ranks[0]["peak_live"]["total"], "planned_equals_measured": equal,
                          "model_state_bytes_rank0": state, "dropped_logged": dropped,
                          "final_loss": round(s["final_loss"], 4)}))
ratios = [a / b for a, b in zip(tps["ep"], tps["dp"])]
print(json.dumps({"median_dp_tokens_per_s": round(statistics.median(tps["dp"])),
                  "median_ep_tokens_per_s": round(statistics.median(tps["ep"])),
                  "ep_over_dp": [round(x, 3) for x in ratios], "median_ratio": round(statistics.median(ratios), 3),
                  "model_state_bytes_dp": held["dp"], "model_state_bytes_ep": held["ep"]}))
PY
