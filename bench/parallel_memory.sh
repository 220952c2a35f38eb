#!/usr/bin/env bash
# Peak live bytes per rank by category under tensor, sequence and pipeline parallelism: one model
# (default gpt2-6l: 6 blocks, 384 channels, 6 heads, GPT-2 vocabulary, fp32), one global batch
# (--batch 8 --seq 256 --grad-accum 4 = 8192 tokens per step) in every layout: 1 process, --tp 2,
# --tp 2 --sp, --pp 2 with GPipe, 1F1B and interleaved 1F1B (V = 2), and --tp 2 --pp 2 (1F1B) with
# and without --sp. Each cell trains STEPS optimizer steps with `mpiexec -n N memfit train` and
# reads every rank's measured peak live bytes per category from summary.json (per_rank.by_rank);
# planned == measured is checked exactly per category on rank 0 (summary.json holds rank 0's plan)
# and per rank on the total (the trainer's "per rank: planned vs measured peak live" lines, which
# compare bytes, not the rounded MiB). One row per pipeline stage: the tensor-parallel ranks of a
# stage are listed together (the max over them, they are equal here). --grad-accum is the number
# of micro-batches flowing through the pipeline, so stage 0 keeps 4 micro-batches' activations
# under GPipe and at most P = 2 under 1F1B; without a pipeline it is plain accumulation.
#
# --eval-every 0 still evaluates once after the last step (--eval-batches 1); the evaluation
# program is part of the plan and peaks below the training step, so it leaves the peak alone.
# Memory, not speed: the ranks are oversubscribed (up to 4 single-threaded ranks on 2 cores here,
# each waiting rank's MPI polling taking cycles from a working one), so times mean nothing and one
# step per cell is enough; every byte count is exact and does not depend on the machine. About
# 6 minutes on 2 cores; MODEL=mini (6 blocks, 256 channels, 8 heads, byte vocabulary) about 1.
set -euo pipefail
cd "$(dirname "$0")/.."
MEMFIT=${MEMFIT:-build/memfit}
MPIEXEC=${MPIEXEC:-mpiexec}
OUT=${OUT:-runs/parallel-memory-bench}
MODEL=${MODEL:-gpt2-6l}   # heads and MLP width divisible by 2, at least 4 blocks (interleaved:2)
BATCH=${BATCH:-8}
SEQ=${SEQ:-256}
ACCUM=${ACCUM:-4}
STEPS=${STEPS:-1}
PRECISION=${PRECISION:-fp32}
# name:ranks:flags, flags with commas for spaces
ALL="1p:1:  tp2:2:--tp,2  tp2-sp:2:--tp,2,--sp  pp2-gpipe:2:--pp,2,--schedule,gpipe  pp2-1f1b:2:--pp,2,--schedule,1f1b
     pp2-interleaved2:2:--pp,2,--schedule,interleaved:2  tp2-pp2-1f1b:4:--tp,2,--pp,2,--schedule,1f1b
     tp2-sp-pp2-1f1b:4:--tp,2,--sp,--pp,2,--schedule,1f1b"
CELLS=${CELLS:-$(for c in $ALL; do echo -n "${c%%:*} "; done)}
mkdir -p "$OUT"
start=$SECONDS
failed=""
for name in $CELLS; do
  spec=$(for c in $ALL; do if [[ ${c%%:*} == "$name" ]]; then echo "$c"; fi; done)
  [[ -n $spec ]] || { echo "unknown cell $name (cells: $(for c in $ALL; do echo -n "${c%%:*} "; done))" >&2; exit 2; }
  rest=${spec#*:}; n=${rest%%:*}; flags=${rest#*:}; flags=${flags//,/ }
  cell="$OUT/$name"
  rm -rf "$cell"
  t0=$SECONDS
  # shellcheck disable=SC2086  # $flags is a list of words
  if OMP_NUM_THREADS=1 "$MPIEXEC" --oversubscribe --allow-run-as-root --bind-to none -n "$n" -x OMP_NUM_THREADS=1 \
      "$MEMFIT" train --model "$MODEL" $flags --batch "$BATCH" --seq "$SEQ" --grad-accum "$ACCUM" --steps "$STEPS" \
      --precision "$PRECISION" --eval-every 0 --eval-batches 1 --sample 0 --progress plain --threads 1 \
      --out "$cell" > "$cell.log" 2>&1 && [[ -f $cell/summary.json ]]; then
    echo "$name: $((SECONDS - t0)) s" >&2
  else
    echo "FAIL: $name ($((SECONDS - t0)) s): $MPIEXEC -n $n $MEMFIT train --model $MODEL $flags ...; last lines of $cell.log:" >&2
    tail -n 12 "$cell.log" >&2
    failed="$failed $name"
  fi
done
python3 - "$OUT" "$MODEL" "$BATCH" "$SEQ" "$ACCUM" "$PRECISION" "$CELLS" <<'PY'
import json, os, re, sys
out, model, batch, seq, accum, prec, cells = sys.argv[1:8]
CATS = ["parameters", "gradients", "optimizer_states", "activations", "workspace", "communication"]
LAYOUT = {"1p": "1 process", "tp2": "tp 2", "tp2-sp": "tp 2 + sp", "pp2-gpipe": "pp 2 gpipe",
          "pp2-1f1b": "pp 2 1f1b", "pp2-interleaved2": "pp 2 interleaved:2", "tp2-pp2-1f1b": "tp 2, pp 2 1f1b",
          "tp2-sp-pp2-1f1b": "tp 2 + sp, pp 2 1f1b"}
RANK = re.compile(r"^  rank (\d+) \(tp (\d+), pp (\d+), dp (\d+)\): planned .*, measured .*?( \(equal\))?$")
mib = lambda b: f"{b / 2**20:.1f}"
print(f"model {model}, {prec}, --batch {batch} --seq {seq} --grad-accum {accum} (global batch "
      f"{int(batch) * int(accum)} x {seq} tokens) in every layout. MiB of measured peak live per rank by category; "
      "total = the rank's peak of the sum (workspace included); planned == measured: exact bytes, per category on "
      "rank 0, on the total on every rank.")
print("| layout | ranks | stage | " + " | ".join(CATS) + " | total | planned == measured |")
print("|---" * (len(CATS) + 5) + "|")
acts = {}   # (cell, stage) -> activations bytes (max over the stage's ranks)
for name in cells.split():
    label = LAYOUT.get(name, name)
    path = f"{out}/{name}/summary.json"
    if not os.path.exists(path):
        print(f"| {label} | - | - | " + " | ".join("-" for _ in CATS) + f" | - | FAILED, see {out}/{name}.log |")
        continue
    s = json.load(open(path))
    by_rank = {r["rank"]: r["peak_live"] for r in s["per_rank"]["by_rank"]}
    coords, equal = {}, {}
    for line in open(f"{out}/{name}.log"):
        m = RANK.match(line.rstrip("\n"))
        if m:
            k = int(m[1])
            coords[k] = int(m[3])
            equal[k] = bool(m[5])
    if not coords:   # no tp/pp: no per-rank plan lines; every rank runs rank 0's plan
        coords = {k: 0 for k in by_rank}
        equal = {k: by_rank[k]["total"] == s["planned"]["peak_live"]["total"] for k in by_rank}
    if sorted(coords) != sorted(by_rank):
        sys.exit(f"FAIL: {name}: per-rank plan lines for ranks {sorted(coords)}, summary.json has {sorted(by_rank)}")
    p0, m0 = s["planned"]["peak_live"], s["measured"]["peak_live"]
    rank0_exact = all(p0[c] == m0[c] for c in p0) and m0 == by_rank[0]
    for stage in sorted(set(coords.values())):
        ranks = [k for k in sorted(coords) if coords[k] == stage]
        live = {c: max(by_rank[k][c] for k in ranks) for c in CATS + ["total"]}
        differ = any(by_rank[k] != by_rank[ranks[0]] for k in ranks)
        ok = all(equal[k] for k in ranks) and (0 not in ranks or rank0_exact)
        bad = [k for k in ranks if not equal[k]] + ([0] if 0 in ranks and not rank0_exact else [])
        acts[(name, stage)] = live["activations"]
        print(f"| {label} | {','.join(map(str, ranks))}{' (max)' if differ else ''} | {stage} | "
              + " | ".join(mib(live[c]) for c in CATS) + f" | {mib(live['total'])} | "
              + ("yes" if ok else f"NO (ranks {sorted(set(bad))})") + " |")
print()
def ratio(what, a, b):
    if a in acts and b in acts:
        print(f"- {what}: {mib(acts[a])} / {mib(acts[b])} MiB = {acts[a] / acts[b]:.3f}")
    else:
        print(f"- {what}: n/a (a cell failed or was not run)")
print("Activations (peak live, MiB):")
ratio("tp 2 vs 1 process", ("tp2", 0), ("1p", 0))
ratio("tp 2 + sp vs tp 2", ("tp2-sp", 0), ("tp2", 0))
ratio("pp 2 stage 0, 1f1b vs gpipe", ("pp2-1f1b", 0), ("pp2-gpipe", 0))
ratio("pp 2 stage 0, interleaved:2 vs 1f1b", ("pp2-interleaved2", 0), ("pp2-1f1b", 0))
ratio("tp 2 + pp 2 stage 0, sp vs no sp", ("tp2-sp-pp2-1f1b", 0), ("tp2-pp2-1f1b", 0))
PY
echo "runtime $((SECONDS - start)) s" >&2
if [[ -n $failed ]]; then echo "FAILED cells:$failed" >&2; exit 1; fi
