#!/usr/bin/env bash
# Issue 24's offload measurement: for each MODEL and optimizer (adamw, adamw-bf16, adamw-8bit),
# one run with every state in memory and one with --offload optimizer --offload-dir DIR, both
# training STEPS steps of BATCH x SEQ tokens from the bundled corpus and checkpointing at the end.
# Per run: the peak RSS (getrusage), the device's planned = measured peak live bytes, the
# offloaded bytes (the file), tokens/s, and whether the two runs' final states are equal byte for
# byte. The two runs of a pair go one after another: compare tokens/s as ratios within a pair.
# EMU=1 adds the same pair on the CUDA emulator (build/memfit_emu --device cuda, EMU_MODEL, default
# micro, in bf16): device bytes planned and measured, without the offloaded 12 bytes per parameter.
# OFFLOAD=optimizer+params: both runs of a pair under --zero 3 (one process), the second with the
# weights' shard offloaded too. OFFLOAD=activations: the second run's saved activations go to the
# file between each layer's forward and backward. EXTRA: more flags for both runs of every pair
# (e.g. EXTRA="--recompute full").
set -euo pipefail
cd "$(dirname "$0")/.."
MEMFIT=${MEMFIT:-build/memfit}
OUT=${OUT:-runs/offload-bench}
MODELS=${MODELS:-"gpt2-6l gpt2"}
OPTIMIZERS=${OPTIMIZERS:-"adamw adamw-bf16 adamw-8bit"}
PRECISION=${PRECISION:-fp32}
BATCH=${BATCH:-2}
SEQ=${SEQ:-64}
STEPS=${STEPS:-4}
OFFLOAD=${OFFLOAD:-optimizer}
read -r -a EXTRA_FLAGS <<< "${EXTRA:-}"
ZERO=()
[ "$OFFLOAD" = optimizer+params ] && ZERO=(--zero 3)
rm -rf "$OUT"
mkdir -p "$OUT/dir"
run() {   # cell, model, extra flags...
  local cell=$1 model=$2
  shift 2
  "$MEMFIT" train --model "$model" --micro-batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --precision "$PRECISION" \
    --eval-every 0 --eval-batches 1 --sample 0 --progress quiet --checkpoint-every "$STEPS" --out "$OUT/$cell" \
    "${ZERO[@]}" "${EXTRA_FLAGS[@]}" "$@" \
    > "$OUT/$cell.log" 2>&1
}
cells=""
for model in $MODELS; do
  for opt in $OPTIMIZERS; do
    run "$model-$opt-mem" "$model" --optimizer "$opt"
    run "$model-$opt-off" "$model" --optimizer "$opt" --offload "$OFFLOAD" --offload-dir "$OUT/dir"
    cells="$cells $model-$opt"
  done
done
if [ "${EMU:-0}" = 1 ]; then
  MEMFIT=build/memfit_emu PRECISION=bf16 EMU_MODEL=${EMU_MODEL:-micro}
  run "emu-$EMU_MODEL-adamw-mem" "$EMU_MODEL" --device cuda
  run "emu-$EMU_MODEL-adamw-off" "$EMU_MODEL" --device cuda --offload "$OFFLOAD"
  cells="$cells emu-$EMU_MODEL-adamw"
fi
# shellcheck disable=SC2086 # one argument per cell
python3 - "$OUT" "$STEPS" "$OFFLOAD" "${ZERO[*]}" $cells <<'PY'
import json, sys, filecmp
out, steps, offload, zero, cells = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
mib = lambda b: f"{b / 2**20:.1f}"
print(f"{sys.argv[0]}: MiB; device = planned peak live (= measured unless marked); tokens/s of the same run")
print("| run | offload | peak RSS | device | offloaded | RSS saved | tokens/s | ratio | final state |")
print("|---|---|---|---|---|---|---|---|---|")
for c in cells:
    s = {k: json.load(open(f"{out}/{c}-{k}/summary.json")) for k in ("mem", "off")}
    ck = lambda k: f"{out}/{c}-{k}/checkpoints/step-{steps:06d}/state.safetensors"
    same = "equal" if filecmp.cmp(ck("mem"), ck("off"), shallow=False) else "DIFFERS"
    for k in ("mem", "off"):
        p, m = s[k]["planned"]["peak_live"], s[k]["measured"]["peak_live"]
        dev = mib(p["total"]) + ("" if p["total"] == m["total"] else f" (measured {mib(m['total'])})")
        off = mib(m.get("offloaded", 0)) + ("" if p.get("offloaded", 0) == m.get("offloaded", 0) else " (plan differs)")
        rss = s[k]["peak_rss_bytes"]
        saved = "" if k == "mem" else mib(s["mem"]["peak_rss_bytes"] - rss)
        ratio = "" if k == "mem" else f"{s[k]['tokens_per_s'] / s['mem']['tokens_per_s']:.2f}"
        print(f"| {c} | {zero + ' ' if zero else ''}{'--offload ' + offload if k == 'off' else 'none'} | {mib(rss)} | {dev} | {off} | {saved} | "
              f"{s[k]['tokens_per_s']:.0f} | {ratio} | {same if k == 'off' else ''} |")
PY
