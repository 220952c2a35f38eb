# --cp 2: every sequence split over two ranks (two mirrored chunks each), attention over the
# group's gathered keys and values. Against one process over 20 steps (LLaMA with grouped KV
# heads, GPT-2 with learned positions): the same step and validation losses within fp32
# rounding, every rank's plan equal to its measurement; on 4 ranks (2 groups of sequences x cp 2)
# with ZeRO-2 and accumulation too; a tiny LLaMA with llama3 RoPE scaling on packed conversations;
# a sequence one process refuses under --memory-budget fits
# two context ranks; the flag's mistakes are one clear line.
# Usage: bash context_parallel.sh MEMFIT MPIEXEC SOURCE_DIR
source "$(dirname "$0")/common.sh"
cd "$WORK"
ARGS=(train --data "$WORK/data" --sample 0 --progress plain --threads 1 --lr 1e-3
      --steps 20 --eval-every 10 --eval-batches 2)
for model in llama-micro micro; do
    "$MEMFIT" "${ARGS[@]}" --model "$model" --seq 64 --micro-batch 2 --out "one_$model" > "one_$model.log" 2>&1 ||
        { cat "one_$model.log"; fail "$model: one process"; }
    mpi 2 "${ARGS[@]}" --model "$model" --seq 64 --micro-batch 2 --cp 2 --out "cp_$model" > "cp_$model.log" 2>&1 ||
        { cat "cp_$model.log"; fail "$model: --cp 2"; }
    same_as "one_$model.log" "cp_$model.log" "--cp 2 ($model)"
    exact_per_rank "cp_$model.log" 2
done
# LLaMA with grouped KV heads and Llama 3.1's RoPE scaling (a tiny config.json) on packed
# conversations (two or three a row): positions, scaling and document masks across the chunks.
cat > rope.json <<'JSON'
{"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024, "rms_norm_eps": 1e-05,
 "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
 "high_freq_factor": 4.0, "original_max_position_embeddings": 64}, "tie_word_embeddings": false}
JSON
for i in $(seq 1 60); do
    a=$((i * 7)) b=$((i * 13 % 97))
    echo "{\"messages\": [{\"role\": \"user\", \"content\": \"$a+$b?\"}, {\"role\": \"assistant\", \"content\": \"$((a + b)).\"}]}"
done > chat.jsonl
"$MEMFIT" prepare --input chat.jsonl --tokenizer bytes --chat-template chatml --out chat > /dev/null || fail "prepare"
P=(train --model "$WORK/rope.json" --data "$WORK/chat" --seq 128 --packing --micro-batch 2 --sample 0 --progress plain
   --threads 1 --lr 1e-3 --steps 20 --eval-every 10 --eval-batches 1)
"$MEMFIT" "${P[@]}" --out packed1 > packed1.log 2>&1 || { cat packed1.log; fail "packed, one process"; }
mpi 2 "${P[@]}" --cp 2 --out packed2 > packed2.log 2>&1 || { cat packed2.log; fail "packed, --cp 2"; }
same_as packed1.log packed2.log "--cp 2 (LLaMA, llama3 RoPE scaling, packed conversations)"
exact_per_rank packed2.log 2
# The ring (--cp-comm-type p2p): on 2 ranks, and around 4 (four hops a layer).
mpi 2 "${P[@]}" --cp 2 --cp-comm-type p2p --out ring2 > ring2.log 2>&1 || { cat ring2.log; fail "packed, --cp 2 p2p"; }
same_as packed1.log ring2.log "--cp 2 --cp-comm-type p2p (packed conversations)"
exact_per_rank ring2.log 2
mpi 4 "${P[@]}" --cp 4 --cp-comm-type p2p --out ring4 > ring4.log 2>&1 || { cat ring4.log; fail "packed, --cp 4 p2p"; }
same_as packed1.log ring4.log "--cp 4 --cp-comm-type p2p on 4 ranks (packed conversations)"
exact_per_rank ring4.log 4
G=(--model llama-micro --seq 64 --global-batch 4)
"$MEMFIT" "${ARGS[@]}" "${G[@]}" --micro-batch 2 --out one4 > one4.log 2>&1 || { cat one4.log; fail "one process, batch 4"; }
mpi 4 "${ARGS[@]}" "${G[@]}" --micro-batch 1 --cp 2 --zero 2 --out cp4 > cp4.log 2>&1 ||
    { cat cp4.log; fail "4 ranks: --cp 2 --zero 2"; }
same_as one4.log cp4.log "--cp 2 --zero 2 on 4 ranks (accumulation 2)"
exact_per_rank cp4.log 4
# A sequence one process cannot hold within the budget fits when two ranks share it.
B=(train --model llama-micro --data "$WORK/data" --seq 256 --micro-batch 4 --sample 0 --eval-every 0 --progress plain
   --threads 1 --steps 2 --memory-budget 40MiB)
if "$MEMFIT" "${B[@]}" --out big1 > big1.log 2>&1; then cat big1.log; fail "one process fit the budget"; fi
grep -q "does not fit: the plan needs" big1.log || { cat big1.log; fail "one process: no 'does not fit' line"; }
# The activations lead that plan: the hint names the long-context remedies.
grep -q "the activations lead: --offload activations .*--cp N splits each sequence over N ranks" big1.log ||
    { cat big1.log; fail "one process: the hint names neither --offload activations nor --cp"; }
mpi 2 "${B[@]}" --cp 2 --out big2 > big2.log 2>&1 || { cat big2.log; fail "--cp 2 did not fit the budget"; }
exact_per_rank big2.log 2
# Mistakes: one line each, before any work.
bad() {
    if mpi "$1" "${ARGS[@]}" --model llama-micro --micro-batch 2 "${@:3}" --out bad > bad.log 2>&1; then fail "accepted: ${*:3}"; fi
    grep -q -- "$2" bad.log || { cat bad.log; fail "${*:3}: no '$2' in the error"; }
}
bad 2 "cannot be laid out as --tp 1 x --cp 3" --cp 3 --seq 64
bad 2 "not a multiple of 4" --cp 2 --seq 66
bad 2 "expected all_gather or p2p" --cp 2 --cp-comm-type ring --seq 64
bad 4 "with --tp 2: not yet" --cp 2 --tp 2 --seq 64
echo "ok: --cp 2 trains as one process (LLaMA, GPT-2, LLaMA with llama3 RoPE scaling on packed conversations; 4 ranks with ZeRO-2), each rank's plan exact; fits a sequence one process refuses"
