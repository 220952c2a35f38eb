#!/usr/bin/env bash
# The memory-techniques table (issue: "the memory techniques on one process"): GPT-2 12 layers,
# 768 channels, 12 heads, GPT-2 vocabulary, T=512, B=4 on the CPU, one `memfit bench` process
# per row (so peak RSS is that row's). Prints one JSON line per row, then a markdown table with
# planned peak, measured peak, peak RSS, tokens/s and the ratio to the first row. Also the
# attention rows at T=2048, B=1. Runs ~20 min on a 2-core machine; run it on a quiet machine
# and compare ratios, not absolute numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
MEMFIT=${MEMFIT:-build/memfit}
STEPS=${STEPS:-3}
THREADS=${THREADS:-2}
T512="--model gpt2 --batch 4 --seq 512"
T2048="--model bench/gpt2_ctx2048.json --batch 1 --seq 2048"   # GPT-2 small with a 2048-position table
rows=(
  "$T512 --precision fp32 --attention flash --recompute none"
  "$T512 --precision fp32 --attention flash --recompute selective"
  "$T512 --precision fp32 --attention flash --recompute sqrt"
  "$T512 --precision fp32 --attention flash --recompute full"
  "$T512 --precision fp32 --attention naive --recompute none"
  "$T512 --precision bf16 --attention flash --recompute none"
  "$T512 --precision bf16 --attention flash --recompute selective"
  "$T512 --precision bf16 --attention flash --recompute sqrt"
  "$T512 --precision bf16 --attention flash --recompute full"
  "$T2048 --precision fp32 --attention naive --recompute none"
  "$T2048 --precision fp32 --attention flash --recompute none"
)
results=()
for r in "${rows[@]}"; do
  # shellcheck disable=SC2086
  line=$("$MEMFIT" bench --threads "$THREADS" --steps "$STEPS" --warmup 1 $r)
  echo "$line"
  results+=("$line")
done
printf '%s\n' "${results[@]}" | python3 bench/techniques_table.py
