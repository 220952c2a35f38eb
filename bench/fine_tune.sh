#!/usr/bin/env bash
# Fine-tuning end to end with the defaults a user gets (docs/fine-tune.md holds its figures):
#   1. a base model the project makes: llama-mini (6 layers, 256 wide, grouped-query attention)
#      pre-trained PRE_STEPS steps on the bundled corpus, tokenized with tests/data/hf-tokenizers/
#      tiny-chat (Qwen's byte-level tokenizer cut to its 256 bytes plus the ChatML tokens, vocab 259),
#      exported as a Hugging Face folder with that tokenizer and its chat template;
#   2. RECORDS conversations made from the corpus (a speech as the user's turn, the next as the
#      assistant's; one to three turns), prepared with the folder's own tokenizer;
#   3. LoRA and QLoRA (nf4 base) fine-tunes of the folder for EPOCHS epochs, packed rows of SEQ,
#      bf16, every other setting left to the fine-tuning defaults (printed by memfit: lr 2e-4,
#      3% warmup, rank 16 on all seven projections);
#   4. each exported (bf16: the training precision) and as fp32, reloaded by `memfit generate
#      --chat` from the bf16 folder, and the same prompt generated from the fp32 one.
# Prints the loss curve of each fine-tune (metrics.jsonl), its planned and measured peak bytes by
# category, tokens/s and trained tokens/s, the export sizes, and the replies. About 5 minutes on a
# 2-core machine; compare ratios within one run (shared machines are noisy).
set -euo pipefail
cd "$(dirname "$0")/.."
MEMFIT=${MEMFIT:-build/memfit}
OUT=${OUT:-runs/fine-tune-bench}
PRE_STEPS=${PRE_STEPS:-300}
RECORDS=${RECORDS:-600}
EPOCHS=${EPOCHS:-1}
SEQ=${SEQ:-512}
TOK=tests/data/hf-tokenizers/tiny-chat
rm -rf "$OUT"
mkdir -p "$OUT"
# 1. The base folder.
"$MEMFIT" prepare --tokenizer "$TOK/tokenizer.json" --out "$OUT/corpus" > "$OUT/prepare-corpus.log"
"$MEMFIT" train --model llama-mini --data "$OUT/corpus" --steps "$PRE_STEPS" --batch 8 --seq 256 --eval-every 0 \
  --sample 0 --progress plain --log-every 100 --out "$OUT/pre" > "$OUT/pre.log"
"$MEMFIT" export "$OUT/pre/checkpoints" --out "$OUT/base" > "$OUT/export-base.log"
# 2. The conversations.
python3 bench/make_chat.py "$OUT/chat.jsonl" "$RECORDS" 400
"$MEMFIT" prepare --format jsonl --input "$OUT/chat.jsonl" --tokenizer "$OUT/base/tokenizer.json" --out "$OUT/chat" \
  > "$OUT/prepare-chat.log"
# 3. and 4. The fine-tunes, their exports and replies.
declare -A base=([lora]="" [qlora]="--base-weights nf4")
PROMPT="Continue the scene after:
ROMEO: But, soft! what light through yonder window breaks?"
for name in lora qlora; do
  # shellcheck disable=SC2086
  "$MEMFIT" train --model "$OUT/base" --data "$OUT/chat" --lora-rank 16 ${base[$name]} --packing --seq "$SEQ" \
    --precision bf16 --epochs "$EPOCHS" --log-every 5 --progress plain --out "$OUT/$name" > "$OUT/$name.log"
  "$MEMFIT" export "$OUT/$name/checkpoints" --merge-lora --out "$OUT/$name-bf16" > "$OUT/$name-export.log"
  "$MEMFIT" export "$OUT/$name/checkpoints" --merge-lora --dtype fp32 --out "$OUT/$name-fp32" >> "$OUT/$name-export.log"
  for dtype in bf16 fp32; do
    "$MEMFIT" generate --model "$OUT/$name-$dtype" --chat --prompt "$PROMPT" --temperature 0 --max-new-tokens 120 \
      > "$OUT/$name-$dtype.reply" 2> "$OUT/$name-$dtype.gen.log"
  done
done
python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
cats = ["parameters", "master_weights", "gradients", "optimizer_states", "activations", "workspace"]
mib = lambda b: f"{b / 2**20:.2f}"
log = open(f"{out}/lora.log").read()
print([l.strip() for l in log.splitlines() if l.strip().startswith("schedule")][0])
print()
print("| run | trainable | " + " | ".join(cats) + " | peak MiB planned | measured | tokens/s | trained tokens/s | "
      "train / val loss |")
print("|---" * (len(cats) + 7) + "|")
for name in ("lora", "qlora"):
    s = json.load(open(f"{out}/{name}/summary.json"))
    p, m = s["planned"]["peak_live"], s["measured"]["peak_live"]
    print(f"| {name} | {s['config']['trainable_params']:,} | " + " | ".join(mib(p.get(c, 0)) for c in cats) +
          f" | {mib(p['total'])} | {mib(m['total'])} | {s['tokens_per_s']:.0f} | {s['trained_tokens_per_s']:.0f} | "
          f"{s['final_loss']:.4f} / {s.get('final_val_loss', float('nan')):.4f} |")
print()
for name in ("lora", "qlora"):
    curve = [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl") if '"loss"' in l]
    print(f"{name} loss by step: " + ", ".join(f"{c['step']}: {c['loss']:.3f}" for c in curve if "loss" in c))
print()
for name in ("lora", "qlora"):
    b16 = os.path.getsize(f"{out}/{name}-bf16/model.safetensors")
    f32 = os.path.getsize(f"{out}/{name}-fp32/model.safetensors")
    a, b = open(f"{out}/{name}-bf16.reply", "rb").read(), open(f"{out}/{name}-fp32.reply", "rb").read()
    same = len(os.path.commonprefix([a, b]))
    print(f"{name}: export bf16 {b16:,} bytes, fp32 {f32:,} ({b16 / f32:.3f}x); the greedy replies from the two "
          f"share their first {same} of {max(len(a), len(b))} bytes")
    print(f"  bf16 reply: {a[:160]!r}")
EOF
