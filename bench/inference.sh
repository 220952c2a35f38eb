#!/usr/bin/env bash
# Serving inside a memory budget (docs/inference.md holds its tables): a small LLaMA-shaped model
# trained here on the bundled corpus, then `memfit generate --prompts`:
#   1. memory: NREQ requests of mixed lengths (prompts of 16 to 240 bytes of the corpus, replies
#      of 16 to 400 tokens, long-tailed) served with a KV pool of KV_CONTEXTS whole contexts, by
#      the paged cache (blocks as sequences grow) and by the contiguous baseline (each sequence
#      reserves its whole context when admitted): sequences served at once, steps, time, the pool's
#      use at its peak and how much of that holds keys; and whether both give every request the
#      same tokens (they must: greedy, batch-invariant steps);
#   2. speed: NUNI requests of 64-byte prompts and 128-token replies at 1, 8 and 32 sequences at
#      once (--max-num-seqs), tokens generated per second, beside one prompt through the
#      contiguous single-request decoder (`memfit generate --prompt`);
#   3. the plan: `memfit plan --inference --hardware cpu` for the model and the pool of part 1.
# The first part also serves the mixed requests from an int8 KV cache (--kv-dtype int8) in the same
# bytes. About 4 minutes on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
MEMFIT=${MEMFIT:-build/memfit}
OUT=${OUT:-runs/inference-bench}
MODEL=${MODEL:-llama-mini}
STEPS=${STEPS:-300}
SEQ=${SEQ:-512}
NREQ=${NREQ:-96}
NUNI=${NUNI:-64}
KV_CONTEXTS=${KV_CONTEXTS:-8}
if [ "${REUSE:-0}" != 1 ] || [ ! -f "$OUT/model/config.json" ]; then   # REUSE=1: the model trained last time
  rm -rf "$OUT"
  mkdir -p "$OUT"
  "$MEMFIT" prepare --tokenizer bytes --out "$OUT/data" > "$OUT/prepare.log"
  "$MEMFIT" train --model "$MODEL" --data "$OUT/data" --steps "$STEPS" --batch 8 --seq 256 --lr 2e-3 --eval-every 0 \
    --sample 0 --progress plain --log-every 100 --out "$OUT/pre" > "$OUT/pre.log"
  "$MEMFIT" export "$OUT/pre/checkpoints" --out "$OUT/model" > "$OUT/export.log"
fi
python3 - "$OUT" "$NREQ" "$NUNI" <<'PY'
import json, random, sys
out, n, nuni = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
text = open("data/tinyshakespeare.txt", encoding="utf-8").read()
rng = random.Random(7)
with open(f"{out}/mixed.jsonl", "w") as f:
    for i in range(n):
        start, plen = rng.randrange(len(text) - 400), rng.randint(16, 240)
        reply = min(400, 16 + int(rng.expovariate(1 / 90)))   # long-tailed, as chat replies are
        f.write(json.dumps({"prompt": text[start:start + plen], "max_tokens": reply, "temperature": 0}) + "\n")
with open(f"{out}/uniform.jsonl", "w") as f:
    for i in range(nuni):
        start = rng.randrange(len(text) - 100)
        f.write(json.dumps({"prompt": text[start:start + 64], "max_tokens": 128, "temperature": 0}) + "\n")
PY
CFG="$OUT/model/config.json"
PER_POS=$(python3 -c "import json;c=json.load(open('$CFG'));h=c['hidden_size']//c['num_attention_heads'];print(2*c['num_hidden_layers']*c.get('num_key_value_heads',c['num_attention_heads'])*h*4)")
KV_MEM=$((PER_POS * SEQ * KV_CONTEXTS))
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; model $MODEL ($STEPS steps), context $SEQ, fp32"
echo
echo "1. $NREQ mixed requests, KV pool $((KV_MEM / 1048576)) MiB ($KV_CONTEXTS contexts of $SEQ positions)"
printf '%-11s %9s %7s %8s %10s %12s %10s %11s\n' cache "at once" steps seconds "tokens/s" "pool in use" "holds keys" pre-empted
serve() {   # name, cache kind, KV dtype -> the closing line
  "$MEMFIT" generate --model "$OUT/model" --prompts "$OUT/mixed.jsonl" --out "$OUT/mixed-$1.jsonl" --seq "$SEQ" \
    --kv-memory "$KV_MEM" --max-num-seqs 64 --max-num-batched-tokens 256 --kv-cache "$2" --kv-dtype "$3" 2>&1 >/dev/null \
    | grep 'requests, .* tokens generated'
}
for row in "paged paged auto" "contiguous contiguous auto" "paged-int8 paged int8"; do
  read -r cache kind dtype <<< "$row"
  line=$(serve "$cache" "$kind" "$dtype")
  python3 - "$cache" "$line" <<'PY'
import re, sys
c, l = sys.argv[1], sys.argv[2]
pats = [r"at most (\d+) sequences", r"(\d+) steps", r"in ([\d.]+) s", r"\(([\d.]+) tokens/s\)",
        r"in use \((\d+%)\)", r"(\d+%) of it holding", r"(\d+) pre-emptions"]
v = [re.search(p, l).group(1) for p in pats]
print("%-11s %9s %7s %8s %10s %12s %10s %11s" % tuple([c] + v))
PY
done
if cmp -s <(python3 -c "import json,sys;[print(json.loads(l)['text']) for l in open('$OUT/mixed-paged.jsonl')]") \
          <(python3 -c "import json,sys;[print(json.loads(l)['text']) for l in open('$OUT/mixed-contiguous.jsonl')]"); then
  echo "every request's text: identical under both caches"
else
  echo "every request's text: DIFFERS between the caches"; exit 1
fi
echo
echo "2. $NUNI requests of 64 bytes + 128 tokens"
printf '%-22s %10s %8s\n' "sequences at once" "tokens/s" seconds
for c in 1 8 32; do
  line=$("$MEMFIT" generate --model "$OUT/model" --prompts "$OUT/uniform.jsonl" --out "$OUT/uniform-$c.jsonl" \
    --seq "$SEQ" --max-num-seqs "$c" --max-num-batched-tokens 256 2>&1 >/dev/null | grep 'requests, .* tokens generated')
  printf '%-22s %10s %8s\n' "$c (paged)" "$(sed -n 's/.*(\([0-9.]*\) tokens\/s).*/\1/p' <<< "$line")" \
    "$(sed -n 's/.* in \([0-9.]*\) s .*/\1/p' <<< "$line")"
done
one=$("$MEMFIT" generate --model "$OUT/model" --prompt "$(head -c 64 data/tinyshakespeare.txt)" --max-new-tokens 128 \
  --temperature 0 --seq "$SEQ" 2>&1 >/dev/null | grep 'tokens in')
printf '%-22s %10s %8s\n' "1 (single-request)" "$(sed -n 's/.*(\([0-9.]*\) tokens\/s).*/\1/p' <<< "$one")" \
  "$(sed -n 's/.* in \([0-9.]*\) s .*/\1/p' <<< "$one")"
echo
echo "3. memfit plan --inference --hardware cpu --model $OUT/model --weights fp32 --context $SEQ --concurrency $KV_CONTEXTS --kv-block 16 --max-num-batched-tokens 256"
"$MEMFIT" plan --inference --hardware cpu --model "$OUT/model" --weights fp32 --context "$SEQ" \
  --concurrency "$KV_CONTEXTS" --kv-block 16 --max-num-batched-tokens 256
