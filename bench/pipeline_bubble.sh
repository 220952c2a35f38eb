#!/usr/bin/env bash
# Pipeline bubble of `memfit train --pp P`: P = 4 stages (`mpirun -np 4`), GPipe and 1F1B, m = 4, 8
# and 16 micro-batches per step (--grad-accum m, --batch 4). Each cell trains STEPS steps; rank 0's
# per-stage idle lines (time in transfers over the last step) are set beside the ideal bubble
# (P-1)/(m+P-1), with the stages' exchange counts, the run's tokens/s and rank 0's measured peak
# live bytes from summary.json: GPipe keeps all m micro-batches' activations on stage 0 until the
# backwards start, 1F1B at most P, so rank 0's activations grow with m under GPipe only.
#
# Times are distorted on a small machine: the P ranks are oversubscribed (4 single-threaded ranks
# on 2 cores here), so a stage "idle" in a transfer is often waiting for a neighbour that is
# runnable but descheduled, and a waiting rank's MPI progress polling (Open MPI yields when
# oversubscribed, but still spins between yields) takes cycles from a working one. The
# measured idle therefore sits above the ideal bubble and varies from run to run, and tokens/s is
# not the pipeline's speed on P devices; exchange counts, the ideal bubble and memory are exact.
# About 15 s on 2 cores with the default micro model (4 blocks, one per stage); MODEL=mini (6
# blocks, 256 channels) takes about 2 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
MEMFIT=${MEMFIT:-build/memfit}
MPIEXEC=${MPIEXEC:-mpiexec}
OUT=${OUT:-runs/pipeline-bench}
MODEL=${MODEL:-micro}   # needs at least P blocks
P=${P:-4}
MS=${MS:-"4 8 16"}
SCHEDULES=${SCHEDULES:-"gpipe 1f1b"}
BATCH=${BATCH:-4}
SEQ=${SEQ:-128}
STEPS=${STEPS:-5}
mkdir -p "$OUT"
for schedule in $SCHEDULES; do
  for m in $MS; do
    cell="$OUT/$schedule-m$m"
    OMP_NUM_THREADS=1 "$MPIEXEC" --oversubscribe --allow-run-as-root --bind-to none -n "$P" -x OMP_NUM_THREADS=1 \
      "$MEMFIT" train --model "$MODEL" --pp "$P" --schedule "$schedule" --grad-accum "$m" --batch "$BATCH" \
      --seq "$SEQ" --steps "$STEPS" --eval-every 0 --eval-batches 1 --sample 0 --progress plain --threads 1 \
      --out "$cell" > "$cell.log" 2>&1 || { cat "$cell.log"; echo "FAIL: $schedule m=$m" >&2; exit 1; }
  done
done
python3 - "$OUT" "$P" "$MS" "$SCHEDULES" "$MODEL" <<'PY'
import json, re, sys
out, P, ms, schedules, model = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split(), sys.argv[5]
STAGE = re.compile(r"^  stage (\d+) \(rank \d+\): idle ([0-9.]+)% of ([0-9.]+) ms, (\d+) exchanges")
print(f"model {model}, P = {P} stages; idle = time in transfers / step time, last step; "
      "MiB = rank 0's measured peak live (activations among it)")
print("| schedule | m | ideal (P-1)/(m+P-1) | idle stage 0 | mean idle | exchanges per stage | step ms (stage 0) "
      "| tokens/s | rank 0 peak live MiB | rank 0 activations MiB |")
print("|---" * 10 + "|")
for schedule in schedules:
    for m in ms:
        cell = f"{out}/{schedule}-m{m}"
        stages = {}
        tokens = None
        for line in open(f"{cell}.log"):
            s = STAGE.match(line)
            if s:
                stages[int(s[1])] = (float(s[2]), float(s[3]), int(s[4]))
            d = re.match(r"^done: .*, ([0-9]+) tokens/s", line)
            if d:
                tokens = int(d[1])
        if sorted(stages) != list(range(P)) or tokens is None:
            sys.exit(f"FAIL: {cell}.log: not {P} stage idle lines and a done: line")
        summary = json.load(open(f"{cell}/summary.json"))
        by_rank = summary.get("per_rank", {}).get("by_rank")
        rank0 = by_rank[0]["peak_live"] if by_rank else summary["measured"]["peak_live"]
        ideal = (P - 1) / (int(m) + P - 1)
        idle = [stages[s][0] for s in range(P)]
        print(f"| {schedule} | {m} | {100 * ideal:.1f}% | {idle[0]:.1f}% | {sum(idle) / P:.1f}% "
              f"| {'/'.join(str(stages[s][2]) for s in range(P))} | {stages[0][1]:.1f} | {tokens} "
              f"| {summary['measured']['peak_live_total'] / 2**20:.2f} | {rank0['activations'] / 2**20:.2f} |")
PY
