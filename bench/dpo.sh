#!/usr/bin/env bash
# Preference tuning end to end (docs/fine-tune.md holds its figures): SFT, then DPO with each
# reference, on data the project makes.
#   1. a base model: llama-mini (6 layers, 256 wide) pre-trained PRE_STEPS steps on the bundled
#      corpus with tests/data/hf-tokenizers/tiny-chat (vocab 259, ChatML), exported;
#   2. SFT: LoRA on RECORDS conversations made from the corpus (bench/make_chat.py), merged and
#      exported: the model DPO starts from;
#   3. PAIRS preference pairs from the corpus (bench/make_preference.py: the prompt a speech, chosen
#      the speech that follows it, rejected that speech with its words shuffled);
#   4. DPO (LoRA rank 16 on every projection, bf16, beta 0.1, lr LR) for STEPS steps with each
#      reference: adapters-off, precompute, copy (bf16) and copy (nf4).
# Prints, per reference, the DPO metrics every LOG steps (loss, rewards/margins,
# rewards/accuracies, train and eval), the planned and measured peak bytes by category and
# tokens/s. About 10 minutes on a 2-core machine; compare ratios within one run.
set -euo pipefail
cd "$(dirname "$0")/.."
MEMFIT=${MEMFIT:-build/memfit}
OUT=${OUT:-runs/dpo-bench}
PRE_STEPS=${PRE_STEPS:-300}
RECORDS=${RECORDS:-600}
PAIRS=${PAIRS:-600}
STEPS=${STEPS:-60}
LR=${LR:-5e-5}
LOG=${LOG:-10}
SEQ=${SEQ:-256}
TOK=tests/data/hf-tokenizers/tiny-chat
rm -rf "$OUT"
mkdir -p "$OUT"
# 1. The base folder.
"$MEMFIT" prepare --tokenizer "$TOK/tokenizer.json" --out "$OUT/corpus" > "$OUT/prepare-corpus.log"
"$MEMFIT" train --model llama-mini --data "$OUT/corpus" --steps "$PRE_STEPS" --batch 8 --seq 256 --eval-every 0 \
  --sample 0 --progress plain --log-every 100 --out "$OUT/pre" > "$OUT/pre.log"
"$MEMFIT" export "$OUT/pre/checkpoints" --out "$OUT/base" > "$OUT/export-base.log"
# 2. SFT.
python3 bench/make_chat.py "$OUT/chat.jsonl" "$RECORDS" 400
"$MEMFIT" prepare --format jsonl --input "$OUT/chat.jsonl" --tokenizer "$OUT/base/tokenizer.json" --out "$OUT/chat" \
  > "$OUT/prepare-chat.log"
"$MEMFIT" train --model "$OUT/base" --data "$OUT/chat" --lora-rank 16 --packing --seq 512 --precision bf16 --epochs 1 \
  --sample 0 --progress plain --out "$OUT/sft" > "$OUT/sft.log"
"$MEMFIT" export "$OUT/sft/checkpoints" --merge-lora --out "$OUT/sft-model" > "$OUT/export-sft.log"
# 3. The pairs.
python3 bench/make_preference.py "$OUT/prefs.jsonl" --records "$PAIRS" --max-chars 400
"$MEMFIT" prepare --format preference --input "$OUT/prefs.jsonl" --tokenizer "$OUT/sft-model/tokenizer.json" \
  --out "$OUT/prefs" > "$OUT/prepare-prefs.log"
# 4. DPO with each reference.
declare -A ref=([adapters-off]="--reference adapters-off" [precompute]="--reference precompute"
                [copy-bf16]="--reference copy --reference-weights compute" [copy-nf4]="--reference copy --reference-weights nf4")
for name in adapters-off precompute copy-bf16 copy-nf4; do
  # shellcheck disable=SC2086
  "$MEMFIT" train --model "$OUT/sft-model" --data "$OUT/prefs" --objective dpo ${ref[$name]} --lora-rank 16 \
    --lr "$LR" --seq "$SEQ" --batch 8 --precision bf16 --steps "$STEPS" --eval-every "$LOG" --eval-batches 4 \
    --log-every "$LOG" --sample 0 --progress plain --out "$OUT/dpo-$name" > "$OUT/dpo-$name.log"
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
names = ["adapters-off", "precompute", "copy-bf16", "copy-nf4"]
cats = ["parameters", "reference", "master_weights", "gradients", "optimizer_states", "activations", "workspace"]
mib = lambda b: f"{b / 2**20:.2f}"
print("| reference | " + " | ".join(cats) + " | peak MiB planned | measured | tokens/s |")
print("|---" * (len(cats) + 4) + "|")
for n in names:
    s = json.load(open(f"{out}/dpo-{n}/summary.json"))
    p, m = s["planned"]["peak_live"], s["measured"]["peak_live"]
    print(f"| {n} | " + " | ".join(mib(p.get(c, 0)) for c in cats) +
          f" | {mib(p['total'])} | {mib(m['total'])} | {s['tokens_per_s']:.0f} |")
print()
for n in names:
    rows = [json.loads(l) for l in open(f"{out}/dpo-{n}/metrics.jsonl")]
    rows = [r for r in rows if "rewards/margins" in r]
    print(f"{n}: step: loss, margin, accuracy (train) | eval loss, margin, accuracy")
    for r in rows:
        ev = (f" | {r['val_loss']:.4f}, {r['eval_rewards/margins']:.4f}, {r['eval_rewards/accuracies']:.3f}"
              if "eval_rewards/margins" in r else "")
        print(f"  {r['step']}: {r['loss']:.4f}, {r['rewards/margins']:.4f}, {r['rewards/accuracies']:.3f}{ev}")
PY
