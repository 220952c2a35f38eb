#!/usr/bin/env bash
# Benchmarks for the engine-foundation targets, printed as JSON lines (numbers, not pass/fail):
#  1. GPT-2 6 layers x 384 channels x 6 heads, GPT-2 vocabulary, B=8, T=256, fp32, naive attention
#     (as when the README figures were taken), 2 threads:
#     tokens/s, ms/step, MFU against the oneDNN matmul peak measured in the same process;
#  2. peak RSS of that run against the planned peak (target: RSS <= planned + 150 MiB).
# The machines are shared: run it on a quiet machine and compare ratios, not absolute numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
MEMFIT=${MEMFIT:-build/memfit}
STEPS=${STEPS:-5}
out=$("$MEMFIT" bench --model gpt2-6l --batch 8 --seq 256 --attention naive --threads 2 --steps "$STEPS" --warmup 1)
echo "$out"
python3 - "$out" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
over = (j["peak_rss_bytes"] - j["planned_reserved_bytes"]) / 2**20
print(json.dumps({"mfu": round(j["mfu"], 3), "mfu_target": 0.60,
                  "tokens_per_s": round(j["tokens_per_s"], 1),
                  "rss_over_plan_mib": round(over, 1), "rss_over_plan_target_mib": 150}))
PY
