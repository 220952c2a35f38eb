#!/usr/bin/env bash
# Issue 26's instruction-data measurement: conversations made from the bundled corpus (a user turn
# holding one speech, the assistant's the next; one to three turns), prepared with Qwen3's
# tokenizer.json and chat template, then a LoRA fine-tune (rank 8 on q,k,v,o,gate,up,down) of a
# small LLaMA at Qwen3's vocabulary, STEPS steps of BATCH x SEQ tokens, once padded (one
# conversation per row) and once packed (--packing). Prints per run: the rows the data makes, the
# share of token slots that train, tokens/s and trained tokens/s (the targets the loss counts),
# the validation loss, and planned = measured peak bytes. The runs alternate, padded then packed,
# PAIRS times (default 2): compare them as ratios of the medians. RECORDS conversations (default
# 1500), SEQ (256), BATCH (8), STEPS (20).
set -euo pipefail
cd "$(dirname "$0")/.."
MEMFIT=${MEMFIT:-build/memfit}
OUT=${OUT:-runs/instruct-bench}
RECORDS=${RECORDS:-1500}
SEQ=${SEQ:-256}
BATCH=${BATCH:-8}
STEPS=${STEPS:-20}
PAIRS=${PAIRS:-2}
TOKENIZER=tests/data/hf-tokenizers/qwen3/tokenizer.json
rm -rf "$OUT"
mkdir -p "$OUT"
python3 bench/make_chat.py "$OUT/chat.jsonl" "$RECORDS"
cat > "$OUT/model.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "intermediate_size": 352,
 "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 151669,
 "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false}
EOF
"$MEMFIT" prepare --format jsonl --input "$OUT/chat.jsonl" --tokenizer "$TOKENIZER" --out "$OUT/data" \
  | tee "$OUT/prepare.log"
for pair in $(seq 1 "$PAIRS"); do
  for mode in padded packed; do
    flag=""
    [ "$mode" = packed ] && flag="--packing"
    "$MEMFIT" train --model "$OUT/model.json" --data "$OUT/data" --seq "$SEQ" --micro-batch "$BATCH" --steps "$STEPS" \
      --lora-rank 8 --lora-targets all --lr 2e-3 --warmup 5 --loss-chunk 256 --eval-every 0 --eval-batches 8 \
      --sample 0 --progress plain --log-every "$STEPS" --out "$OUT/$mode$pair" $flag > "$OUT/$mode$pair.log" 2>&1
  done
done
python3 - "$OUT" "$PAIRS" <<'EOF'
import json, re, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
print(f"| run | rows | trained share of slots | tokens/s | trained tokens/s | validation loss | peak planned = measured |")
print("|---|---|---|---|---|---|---|")
rate = {"padded": [], "packed": []}
for pair in range(1, pairs + 1):
    for mode in ("padded", "packed"):
        s = json.load(open(f"{out}/{mode}{pair}/summary.json"))
        log = open(f"{out}/{mode}{pair}.log").read()
        m = re.search(r"in (\d+) rows of \d+ \([^)]*\), ([\d.]+)% of the token slots trained", log)
        same = s["planned"]["peak_live"] == s["measured"]["peak_live"]
        rate[mode].append(s["trained_tokens_per_s"])
        print(f"| {mode} | {m.group(1)} | {m.group(2)}% | {s['tokens_per_s']:.0f} | {s['trained_tokens_per_s']:.0f} | "
              f"{s['final_val_loss']:.4f} | {s['measured']['peak_live']['total'] / 2**20:.2f} MiB, {same} |")
ratio = statistics.median(rate["packed"]) / statistics.median(rate["padded"])
print(f"packed / padded trained tokens/s (medians): {ratio:.2f}x")
EOF
