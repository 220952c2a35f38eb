# Preference tuning (--objective dpo) on 2 data-parallel ranks against one process: each rank
# holds whole pairs (a global batch of 4 rows: one pair a rank), the pairs' loss summed over the
# ranks, TRL's metrics reduced the same way. With a frozen copy under ZeRO 2 (accumulating 2
# micro-batches), resumed halfway; with precomputed reference log-probabilities under ZeRO 1 (the
# table computed once, kept beside the data, read back by the resumed run); LoRA with the adapters
# switched off. Every step's loss within 1e-4 of the one process's, each rank's plan equal to its
# measurement.
# Usage: bash dpo.sh MEMFIT MPIEXEC SOURCE_DIR
source "$(dirname "$0")/common.sh"
cd "$WORK"
TOK="$SRC/tests/data/hf-tokenizers/tiny-chat/tokenizer.json"
words=(apple river stone cloud ember violet harbor lantern meadow quartz)
for i in $(seq 0 39); do
    a=${words[$((i % 10))]} b=${words[$(((i * 3 + 1) % 10))]} c=${words[$(((i * 7 + 2) % 10))]}
    printf '{"prompt": [{"role": "user", "content": "Say %s %s %s."}], ' "$a" "$b" "$c"
    printf '"chosen": [{"role": "assistant", "content": "%s %s %s."}], ' "$a" "$b" "$c"
    printf '"rejected": [{"role": "assistant", "content": "%s %s %s."}]}\n' "$c" "$a" "$b"
done > prefs.jsonl
"$MEMFIT" prepare --format preference --input prefs.jsonl --tokenizer "$TOK" --out prefs > /dev/null ||
    fail "prepare --format preference"
BASE=(train --model llama-nano --data prefs --objective dpo --batch 4 --seq 64 --lr 1e-3 --warmup 0 --steps 8
      --eval-every 4 --eval-batches 1 --sample 0 --progress plain --log-every 1 --threads 1 --seed 7)

# ---- a frozen copy, ZeRO 2 with accumulation, resumed ----
C=(--reference copy --grad-accum 2)
"$MEMFIT" "${BASE[@]}" "${C[@]}" --out c1 > c1.log 2>&1 || { cat c1.log; fail "DPO copy, one process"; }
mpi 2 "${BASE[@]}" "${C[@]}" --zero 2 --checkpoint-every 4 --out c2 > c2.log 2>&1 ||
    { cat c2.log; fail "DPO copy --zero 2 on 2 ranks"; }
grep -q 'ZeRO stage 2' c2.log || { cat c2.log; fail "DPO copy: not ZeRO stage 2"; }
same_as c1.log c2.log "-np 2 --zero 2 DPO copy"
exact_per_rank c2.log 2
grep -q '"rewards/margins"' c2/metrics.jsonl || fail "DPO copy: no rewards/margins in metrics.jsonl"
mpi 2 "${BASE[@]}" "${C[@]}" --zero 2 --resume c2/checkpoints/step-000004 --out c2r > c2r.log 2>&1 ||
    { cat c2r.log; fail "DPO copy resumed on 2 ranks"; }
same_as c1.log c2r.log "-np 2 --zero 2 DPO copy, resumed" "uninterrupted"

# ---- precomputed reference log-probabilities, ZeRO 1, resumed ----
P=(--reference precompute)
"$MEMFIT" "${BASE[@]}" "${P[@]}" --out p1 > p1.log 2>&1 || { cat p1.log; fail "DPO precompute, one process"; }
grep -q 'computed in' p1.log || { cat p1.log; fail "DPO precompute: the table was not computed"; }
mpi 2 "${BASE[@]}" "${P[@]}" --zero 1 --checkpoint-every 4 --out p2 > p2.log 2>&1 ||
    { cat p2.log; fail "DPO precompute --zero 1 on 2 ranks"; }
grep -q 'computed in' p2.log && { cat p2.log; fail "DPO precompute on 2 ranks: the stored table was not read"; }
same_as p1.log p2.log "-np 2 --zero 1 DPO precompute"
mpi 2 "${BASE[@]}" "${P[@]}" --zero 1 --resume p2/checkpoints/step-000004 --out p2r > p2r.log 2>&1 ||
    { cat p2r.log; fail "DPO precompute resumed on 2 ranks"; }
same_as p1.log p2r.log "-np 2 --zero 1 DPO precompute, resumed" "uninterrupted"

# ---- LoRA with the adapters switched off ----
L=(--lora-rank 4 --reference adapters-off)
"$MEMFIT" "${BASE[@]}" "${L[@]}" --out l1 > l1.log 2>&1 || { cat l1.log; fail "DPO LoRA, one process"; }
mpi 2 "${BASE[@]}" "${L[@]}" --zero 2 --out l2 > l2.log 2>&1 || { cat l2.log; fail "DPO LoRA --zero 2 on 2 ranks"; }
same_as l1.log l2.log "-np 2 --zero 2 DPO LoRA adapters-off"
exact_per_rank l2.log 2
echo "PASS"
