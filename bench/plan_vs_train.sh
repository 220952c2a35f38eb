#!/usr/bin/env bash
# Issue 28's CPU entry: `memfit plan --hardware cpu` (rates from `memfit bench --calibrate`) against
# `memfit train`'s measured step time on this machine, over a grid of presets, batch, sequence,
# precision and recompute policies. Each cell trains STEPS steps on the bundled corpus and takes
# the median of metrics.jsonl's step times after the first (warm-up) step; the plan is the same
# configuration fixed (--gpus 1 --micro-batch B --recompute R --attention flash). Prints the
# table docs/plan.md shows: planned s, measured s, ratio. Cells: "model batch seq precision
# recompute", space-separated, one per line in CELLS. About 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
MEMFIT=${MEMFIT:-build/memfit}
OUT=${OUT:-runs/plan-vs-train}
STEPS=${STEPS:-10}
CALIBRATION=${CALIBRATION:-$OUT/calibration.json}
CELLS=${CELLS:-"micro 16 128 fp32 none
mini 8 256 fp32 none
gpt2-6l 8 256 fp32 none
gpt2-6l 8 256 bf16 none
gpt2-6l 8 256 fp32 selective
gpt2-6l 8 256 fp32 full
gpt2-6l 2 1024 fp32 none
gpt2-6l 16 128 bf16 full
llama-mini 8 256 fp32 none
llama-mini 8 256 bf16 full"}
mkdir -p "$OUT"
# Calibrate in the same sitting as the measurements: the machine's rates today. Three times, keeping
# the run with the median bandwidth (a neighbour's burst on a shared machine can halve one triad).
for k in 1 2 3; do
  "$MEMFIT" bench --calibrate --calibration "$OUT/calibration-$k.json" > "$OUT/calibrate-$k.log" 2>&1
done
python3 - "$OUT" "$CALIBRATION" <<'PY'
import json, shutil, sys
runs = sorted((json.load(open(f"{sys.argv[1]}/calibration-{k}.json"))["mem_bw_gbs"], k) for k in (1, 2, 3))
shutil.copy(f"{sys.argv[1]}/calibration-{runs[1][1]}.json", sys.argv[2])
PY
i=0
while read -r model batch seq prec rc; do
  [ -z "$model" ] && continue
  i=$((i + 1))
  cell="$OUT/$i-$model-b$batch-t$seq-$prec-$rc"
  "$MEMFIT" train --model "$model" --batch "$batch" --seq "$seq" --precision "$prec" --recompute "$rc" \
    --attention flash --steps "$STEPS" --eval-every 0 --eval-batches 1 --sample 0 --progress quiet \
    --out "$cell" > "$cell.log" 2>&1
  "$MEMFIT" plan --hardware cpu --calibration "$CALIBRATION" --model "$model" --gpus 1 --seq "$seq" \
    --global-batch "$batch" --micro-batch "$batch" --precision "$prec" --recompute "$rc" --attention flash \
    --zero 0 --tp 1 --pp 1 --offload none --json > "$cell.plan.json"
  echo "$cell $model $batch $seq $prec $rc" >> "$OUT/cells.txt.new"
done <<< "$CELLS"
mv "$OUT/cells.txt.new" "$OUT/cells.txt"
python3 bench/plan_vs_train.py "$OUT/cells.txt" "$CALIBRATION"
