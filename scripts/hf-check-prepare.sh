#!/usr/bin/env bash
# Prepares the Hugging Face interoperability check (bench/hf_check.py): trains a small GPT-2 and
# a small LLaMA (grouped-query attention) on the bundled corpus for a few hundred steps, exports
# both, and records memfit's greedy continuation of a prompt. Writes runs/hfcheck/. Then, where
# torch and transformers are installed:  python3 bench/hf_check.py runs/hfcheck
set -euo pipefail
cd "$(dirname "$0")/.."
M=${MEMFIT:-build/memfit}
out=runs/hfcheck
rm -rf "$out" runs/hfcheck-work && mkdir -p "$out" runs/hfcheck-work
w=runs/hfcheck-work
$M prepare --tokenizer bytes --out $w/data >/dev/null
for model in nano llama-nano; do
  $M train --quiet --model $model --data $w/data --batch 8 --seq 128 --steps 300 --eval-every 0 --sample 0 \
     --checkpoint-every 300 --out $w/$model >/dev/null
  $M export $w/$model/checkpoints --out $out/$model >/dev/null
  printf 'ROMEO:' > $out/$model.prompt
  $M generate --model $out/$model --prompt 'ROMEO:' --max-new-tokens 64 --temperature 0 > $out/$model.out 2>/dev/null
  echo "$model: $(head -c 80 $out/$model.out | tr '\n' ' ')"
done
