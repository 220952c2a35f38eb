#!/usr/bin/env bash
# Issue 25's distillation measurement, on the bundled corpus (bytes):
#  1. quality: a mini teacher trained TEACHER_STEPS steps and exported; then a nano student
#     trained STEPS steps alone and, from the same seed, against the teacher (--teacher,
#     alpha ALPHA, temperature TEMP); the validation loss (plain cross-entropy, EVAL_BATCHES
#     batches) of the teacher and of both students;
#  2. bytes and speed: per category, planned = measured peak live bytes and tokens/s for each
#     STUDENT:TEACHER pair of presets (random teacher weights: `memfit bench` times the step),
#     against the student alone.
# About 25 minutes on 2 cores with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
MEMFIT=${MEMFIT:-build/memfit}
OUT=${OUT:-runs/distill-bench}
TEACHER_STEPS=${TEACHER_STEPS:-1000}
STEPS=${STEPS:-400}
ALPHA=${ALPHA:-0.5}
TEMP=${TEMP:-1}
EVAL_BATCHES=${EVAL_BATCHES:-40}
PAIRS=${PAIRS:-"gpt2-6l:gpt2 gpt2:gpt2-medium"}
BENCH=${BENCH:-"--precision bf16 --batch 8 --seq 256 --threads 2 --steps 2 --warmup 1"}
mkdir -p "$OUT"
common="--eval-batches $EVAL_BATCHES --sample 0 --progress quiet --seed 1"
if [ ! -f "$OUT/teacher-hf/model.safetensors" ]; then
  "$MEMFIT" train --model mini --steps "$TEACHER_STEPS" --eval-every 0 --checkpoint-every "$TEACHER_STEPS" $common \
    --out "$OUT/teacher" > "$OUT/teacher.log" 2>&1
  "$MEMFIT" export "$OUT/teacher/checkpoints" --out "$OUT/teacher-hf" > /dev/null
fi
"$MEMFIT" train --model nano --steps "$STEPS" --eval-every 0 $common --out "$OUT/alone" > "$OUT/alone.log" 2>&1
"$MEMFIT" train --model nano --steps "$STEPS" --eval-every 0 $common --teacher "$OUT/teacher-hf" \
  --distill-alpha "$ALPHA" --distill-temperature "$TEMP" --out "$OUT/distilled" > "$OUT/distilled.log" 2>&1
for pair in $PAIRS; do
  s=${pair%%:*} t=${pair##*:}
  "$MEMFIT" bench --model "$s" $BENCH > "$OUT/bench-$s.json"
  "$MEMFIT" bench --model "$s" $BENCH --teacher "$t" > "$OUT/bench-$s-$t.json"
done
python3 - "$OUT" "$PAIRS" <<'PY'
import json, sys
out, pairs = sys.argv[1], sys.argv[2].split()
val = lambda run: json.load(open(f"{out}/{run}/summary.json"))["final_val_loss"]
print(f"validation loss: mini teacher {val('teacher'):.4f}; nano alone {val('alone'):.4f}; "
      f"nano distilled {val('distilled'):.4f} ({val('distilled') / val('alone'):.3f}x alone's)")
cats = ["parameters", "teacher", "master_weights", "gradients", "optimizer_states", "activations", "workspace"]
mib = lambda b: f"{b / 2**20:.1f}"
print("| student | teacher | " + " | ".join(cats) + " | total MiB | tokens/s |")
print("|---" * (len(cats) + 4) + "|")
for p in pairs:
    s, t = p.split(":")
    for name, teacher in ((f"bench-{s}", "none"), (f"bench-{s}-{t}", t)):
        b = json.loads(open(f"{out}/{name}.json").readline())
        live = b["planned_peak_by_category"]
        assert b["planned_peak_bytes"] == b["measured_peak_bytes"], f"{name}: planned != measured"
        print(f"| {s} | {teacher} | " + " | ".join(mib(live.get(c, 0)) for c in cats) +
              f" | {mib(sum(live.values()))} | {b['tokens_per_s']:.0f} |")
PY
