#!/usr/bin/env bash
# Prepares the Hugging Face interoperability check (bench/hf_check.py): trains a small GPT-2 and
# a small LLaMA (grouped-query attention) on the bundled corpus for a few hundred steps, exports
# both, and records memfit's greedy continuation of a prompt; the LLaMA also exported in bf16 as
# shards (--dtype bf16 --max-shard-size 200KB), and LoRA-tuned from its export into a PEFT adapter
# folder and a merged one. Writes runs/hfcheck/ and runs/hfcheck-peft/. Then, where torch,
# transformers and peft are installed:
#   python3 bench/hf_check.py runs/hfcheck
#   python3 bench/peft_check.py --adapter runs/hfcheck-peft/adapter --merged runs/hfcheck-peft/merged \
#       --base runs/hfcheck/llama-nano
set -euo pipefail
cd "$(dirname "$0")/.."
M=${MEMFIT:-build/memfit}
out=runs/hfcheck
peft=runs/hfcheck-peft
rm -rf "$out" "$peft" runs/hfcheck-work && mkdir -p "$out" "$peft" runs/hfcheck-work
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
# The same LLaMA in bf16, in shards with an index: what transformers reads for an 8B model.
b=llama-nano-bf16-sharded
$M export $w/llama-nano/checkpoints --out $out/$b --dtype bf16 --max-shard-size 200KB >/dev/null
printf 'ROMEO:' > $out/$b.prompt
$M generate --model $out/$b --prompt 'ROMEO:' --max-new-tokens 64 --temperature 0 > $out/$b.out 2>/dev/null
echo "$b: $(ls $out/$b | tr '\n' ' ')"
# LoRA on every projection of the exported LLaMA: PEFT's adapter folder and the merged model.
$M train --quiet --model $out/llama-nano --data $w/data --batch 8 --seq 128 --steps 40 --lora-rank 8 \
   --lora-targets all --lr 1e-2 --eval-every 0 --sample 0 --checkpoint-every 40 --out $w/lora >/dev/null
$M export $w/lora/checkpoints --out $peft/adapter --adapter-only >/dev/null
$M export $w/lora/checkpoints --out $peft/merged --merge-lora --dtype fp32 >/dev/null
echo "peft: $(ls $peft/adapter | tr '\n' ' ')"
