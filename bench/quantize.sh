#!/usr/bin/env bash
# Post-training quantization, quality and memory (docs/quantization.md holds its table): a small
# GPT trained here, then its validation perplexity, weight bytes and generate's peak memory with
# the weights stored as fp32, bf16, int8, NF4, round-to-nearest 4-bit and GPTQ 4-bit (groups of
# GROUP; GPTQ with and without act-order), all on the same validation windows.
#   1. MODEL (default micro: 4 layers, 128 wide, GPT-2 blocks) pre-trained STEPS steps (lr LR) on
#      the bundled corpus with the bytes tokenizer, exported (a model trained this far is what
#      quantization can hurt: an under-trained one barely notices 4 bits);
#   2. memfit quantize --method rtn and --method gptq (NSAMPLES windows of SEQ tokens from the
#      training split as calibration);
#   3. memfit eval on EVAL_BATCHES x 4 windows of SEQ tokens of the validation split, and memfit
#      generate (64 tokens, greedy) for its planned and measured peak.
# About 12 minutes on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
MEMFIT=${MEMFIT:-build/memfit}
OUT=${OUT:-runs/quantize-bench}
MODEL=${MODEL:-micro}
STEPS=${STEPS:-2000}
LR=${LR:-2e-3}
GROUP=${GROUP:-128}
BITS=${BITS:-4}
NSAMPLES=${NSAMPLES:-128}
SEQ=${SEQ:-256}
EVAL_BATCHES=${EVAL_BATCHES:-8}
rm -rf "$OUT"
mkdir -p "$OUT"
"$MEMFIT" prepare --tokenizer bytes --out "$OUT/data" > "$OUT/prepare.log"
"$MEMFIT" train --model "$MODEL" --data "$OUT/data" --steps "$STEPS" --batch 16 --seq "$SEQ" --lr "$LR" --eval-every 0 \
  --sample 0 --progress plain --log-every 250 --out "$OUT/pre" > "$OUT/pre.log"
"$MEMFIT" export "$OUT/pre/checkpoints" --out "$OUT/fp32" > "$OUT/export.log"
q="--model $OUT/fp32 --bits $BITS --group-size $GROUP --calibration $OUT/data --nsamples $NSAMPLES --seq $SEQ"
# shellcheck disable=SC2086
"$MEMFIT" quantize $q --method rtn --out "$OUT/rtn" 2> "$OUT/rtn.log" | tee -a "$OUT/quantize.txt"
# shellcheck disable=SC2086
"$MEMFIT" quantize $q --method gptq --out "$OUT/gptq" 2> "$OUT/gptq.log" | tee -a "$OUT/quantize.txt"
# shellcheck disable=SC2086
"$MEMFIT" quantize $q --method gptq --desc-act --out "$OUT/gptq-act" 2> "$OUT/gptq-act.log" | tee -a "$OUT/quantize.txt"
printf '%-22s %10s %12s %14s %14s\n' weights val_loss perplexity "weight bytes" "generate peak"
row() {   # name, folder, --weights
  local e g
  e=$("$MEMFIT" eval --model "$2" --data "$OUT/data" --seq "$SEQ" --batch 4 --batches "$EVAL_BATCHES" --weights "$3")
  g=$("$MEMFIT" generate --model "$2" --weights "$3" --prompt "ROMEO:" --max-new-tokens 64 --temperature 0 2>&1 >/dev/null \
      | sed -n 's/.*memory planned \([^,]*\), measured \([^:]*\):.*/\1 planned, \2 measured/p')
  python3 - "$1" "$e" "$g" <<'PY'
import json, sys
name, e, g = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
print(f"{name:22s} {e['val_loss']:10.4f} {e['perplexity']:12.4f} {e['weights_bytes']:14d}   {g}")
PY
}
row fp32 "$OUT/fp32" fp32
row bf16 "$OUT/fp32" bf16
row int8 "$OUT/fp32" int8
row nf4 "$OUT/fp32" nf4
row "rtn ${BITS}-bit g${GROUP}" "$OUT/rtn" fp32
row "gptq ${BITS}-bit g${GROUP}" "$OUT/gptq" fp32
row "gptq ${BITS}-bit g${GROUP} act" "$OUT/gptq-act" fp32
