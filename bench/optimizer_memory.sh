#!/usr/bin/env bash
# Issue 24's measurement: bytes per category (planned and measured) and tokens/s for AdamW with
# fp32, bf16 and 8-bit moments (--optimizer adamw | adamw-bf16 | adamw-8bit), for each MODEL,
# in fp32 and bf16 compute. Each cell trains STEPS steps of BATCH x SEQ tokens from the bundled
# corpus; the three optimizers of one model and precision run one after another, so compare
# tokens/s as ratios within a row group. About 5 minutes on 2 cores with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
MEMFIT=${MEMFIT:-build/memfit}
OUT=${OUT:-runs/optimizer-bench}
MODELS=${MODELS:-"gpt2-6l gpt2"}
PRECISIONS=${PRECISIONS:-"fp32 bf16"}
BATCH=${BATCH:-2}
SEQ=${SEQ:-64}
STEPS=${STEPS:-4}
OPTIMIZERS="adamw adamw-bf16 adamw-8bit"
mkdir -p "$OUT"
for model in $MODELS; do
  for prec in $PRECISIONS; do
    for opt in $OPTIMIZERS; do
      cell="$OUT/$model-$prec-$opt"
      "$MEMFIT" train --model "$model" --micro-batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --precision "$prec" \
        --optimizer "$opt" --eval-every 0 --eval-batches 1 --sample 0 --progress quiet --out "$cell" > "$cell.log" 2>&1
    done
  done
done
python3 - "$OUT" "$MODELS" "$PRECISIONS" "$OPTIMIZERS" <<'PY'
import json, sys
out, models, precs, opts = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4].split()
cats = ["parameters", "master_weights", "gradients", "optimizer_states", "activations", "workspace"]
mib = lambda b: f"{b / 2**20:.1f}"
print("MiB, measured peak live (= planned unless marked); optimizer states ratio to adamw's; tokens/s")
print("| model | precision | optimizer | " + " | ".join(cats) + " | total | states ratio | tokens/s |")
print("|---" * (len(cats) + 6) + "|")
for m in models:
    for p in precs:
        base = None
        for o in opts:
            s = json.load(open(f"{out}/{m}-{p}-{o}/summary.json"))
            live, plan = s["measured"]["peak_live"], s["planned"]["peak_live"]
            cells = [mib(live[c]) + ("" if live[c] == plan[c] else f" (plan {mib(plan[c])})") for c in cats]
            base = base or live["optimizer_states"]
            print(f"| {m} | {p} | {o} | " + " | ".join(cells) +
                  f" | {mib(live['total'])} | {live['optimizer_states'] / base:.3f} | {s['tokens_per_s']:.0f} |")
PY
