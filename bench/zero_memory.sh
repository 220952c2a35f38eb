#!/usr/bin/env bash
# Issue 6's measurement: GPT-2 124M bytes per rank per category under data parallelism with
# ZeRO 0-3, fp32 and bf16, N = 1, 2, 4 ranks (oversubscribed on a small machine: memory, not
# speed). Each cell trains STEPS steps with `mpirun -np N memfit train` (global micro-batch
# BATCH x SEQ tokens, split over the ranks) and reads every rank's measured peak live bytes
# from summary.json; `memfit plan --hardware cpu --gpus N --zero K` gives the prediction, and
# the model states are compared with ZeRO's formulas (Rajbhandari et al. 2020):
#   mixed (bf16)  16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N
#   fp32          16Ψ, 8Ψ + 8Ψ/N,  4Ψ + 12Ψ/N, 16Ψ/N
# Needs ~4 x 2.2 GB of memory for N = 4 at stage 0 in fp32. About 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
MEMFIT=${MEMFIT:-build/memfit}
OUT=${OUT:-runs/zero-bench}
MODEL=${MODEL:-gpt2}
BATCH=${BATCH:-4}
SEQ=${SEQ:-64}
STEPS=${STEPS:-1}
RANKS=${RANKS:-"1 2 4"}
PRECISIONS=${PRECISIONS:-"fp32 bf16"}
mkdir -p "$OUT"
for prec in $PRECISIONS; do
  for n in $RANKS; do
    for zero in 0 1 2 3; do
      cell="$OUT/$prec-n$n-z$zero"
      OMP_NUM_THREADS=1 mpiexec --oversubscribe --allow-run-as-root --bind-to none -n "$n" \
        "$MEMFIT" train --model "$MODEL" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --precision "$prec" \
        --zero "$zero" --eval-every 0 --eval-batches 1 --sample 0 --progress quiet --out "$cell" > "$cell.log" 2>&1
      "$MEMFIT" plan --hardware cpu --model "$MODEL" --gpus "$n" --zero "$zero" --seq "$SEQ" --global-batch "$BATCH" \
        --precision "$prec" --tp 1 --pp 1 --offload none --micro-batch $((BATCH / n)) --recompute none \
        --attention flash --json > "$cell.plan.json"
    done
  done
done
python3 bench/zero_table.py "$OUT" "$RANKS" "$PRECISIONS"
