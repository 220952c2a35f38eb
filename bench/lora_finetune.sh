#!/usr/bin/env bash
# Issue 9's measurement on the CPU: full fine-tune vs LoRA (bf16 base) vs QLoRA (NF4 base) of a
# small LLaMA preset, from the same pre-trained weights, for the same steps and data.
#   1. pre-trains llama-mini on the bundled corpus (PRE_STEPS, fp32) and exports it;
#   2. fine-tunes that folder three ways in bf16 (STEPS each, same seed, batch and lr schedule);
#   3. prints bytes per category (planned reserved = measured on this engine), tokens/s and the
#      final training and validation losses, from each run's summary.json.
# Runs ~10-15 min on a 2-core machine. Compare ratios within one run: the machine is shared.
set -euo pipefail
cd "$(dirname "$0")/.."
MEMFIT=${MEMFIT:-build/memfit}
OUT=${OUT:-runs/lora-bench}
PRE_STEPS=${PRE_STEPS:-400}
STEPS=${STEPS:-150}
RANK=${RANK:-16}
COMMON="--batch 8 --seq 128 --eval-every 0 --eval-batches 8 --log-every 50 --sample 0 --progress plain"
mkdir -p "$OUT"
if [ ! -f "$OUT/base/model.safetensors" ]; then
  "$MEMFIT" train --model llama-mini --steps "$PRE_STEPS" --lr 3e-3 $COMMON --checkpoint-every "$PRE_STEPS" \
    --out "$OUT/pre" > "$OUT/pre.log"
  "$MEMFIT" export "$OUT/pre/checkpoints" --out "$OUT/base"
fi
declare -A rows=(
  [full]="--precision bf16 --lr 3e-4"
  [lora]="--precision bf16 --lr 2e-3 --lora-rank $RANK --lora-targets all --base-weights bf16"
  [qlora]="--precision bf16 --lr 2e-3 --lora-rank $RANK --lora-targets all --base-weights nf4"
)
for name in full lora qlora; do
  # shellcheck disable=SC2086
  "$MEMFIT" train --model "$OUT/base" --steps "$STEPS" --warmup 10 $COMMON ${rows[$name]} --out "$OUT/$name" \
    > "$OUT/$name.log"
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
cats = ["parameters", "master_weights", "gradients", "optimizer_states", "activations", "workspace"]
def mib(b): return f"{b / 2**20:.2f}"
print("| run | trainable | " + " | ".join(cats) + " | total MiB | tokens/s | train loss | val loss |")
print("|---" * (len(cats) + 6) + "|")
for name in ["full", "lora", "qlora"]:
    s = json.load(open(f"{out}/{name}/summary.json"))
    r = s["planned"]["reserved"]
    m = s["measured"]["reserved"]
    assert all(r.get(c, 0) == m.get(c, 0) for c in cats), f"{name}: planned != measured"
    total = r["total"]
    print(f"| {name} | {s['config']['trainable_params']:,} | " + " | ".join(mib(r.get(c, 0)) for c in cats) +
          f" | {mib(total)} | {s['tokens_per_s']:.0f} | {s['final_loss']:.4f} | {s.get('final_val_loss', float('nan')):.4f} |")
PY
