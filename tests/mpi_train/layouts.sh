# The layouts the field trains with, end to end against one process over 20 steps with
# accumulation, clipping (every step clips) and a checkpoint-resume in the middle:
#   --zero 3 with LoRA and an nf4 base (FSDP-QLoRA) on 2 ranks (tests/mpi/test_lora_zero3.cpp
#   checks each rank's shard of the base to the byte): the one process's losses, each rank's plan
#   equal to its measurement; resumed at step 10 on 2 ranks, the uninterrupted run's last steps.
# DEVICE cuda (MEMFIT the emulator's build, memfit_emu, with MEMFIT_CUDA_EMU=1, or GPUs): the
# ranks run on the CUDA engine against the one CPU process.
# Usage: bash layouts.sh MEMFIT MPIEXEC SOURCE_DIR [DEVICE]
source "$(dirname "$0")/common.sh"
DEVICE=${4:-cpu}
cd "$WORK"
ARGS=(train --model llama-micro --data "$WORK/data" --batch 4 --seq 32 --lr 1e-3 --warmup 2 --steps 20
      --grad-accum 2 --clip 0.5 --eval-every 10 --eval-batches 1 --sample 0 --progress plain --log-every 1
      --threads 1 --seed 1337)
ON=(--device "$DEVICE")

# resumed REFERENCE_LOG LOG WHAT: LOG's run resumed at step 11 and its losses are the reference's.
resumed() {
    local first
    first=$(losses "${2%.log}/metrics.jsonl" | head -1 | cut -d' ' -f1)
    [ "$first" = 11 ] || { cat "$2"; fail "$3: first logged step is '$first', not 11 (did it resume?)"; }
    same_as "$1" "$2" "$3" "uninterrupted"
}

# exact_per_rank LOG N: rank 0 listed N ranks, each one's plan equal to its measurement in every category.
exact_per_rank() {
    local n
    n=$(grep -cE '^  rank [0-9]+.*: planned .*, measured .* \(equal\)$' "$1" || true)
    [ "$n" = "$2" ] || { cat "$1"; fail "$1: $n of $2 ranks' plans equal their measurements"; }
}

# ---- LoRA with an nf4 base under ZeRO 3 ----
Q=(--lora-rank 8 --base-weights nf4)
"$MEMFIT" "${ARGS[@]}" "${Q[@]}" --out q1 > q1.log 2>&1 || { cat q1.log; fail "QLoRA, one process"; }
mpi 2 "${ARGS[@]}" "${Q[@]}" "${ON[@]}" --zero 3 --checkpoint-every 10 --out q2 > q2.log 2>&1 ||
    { cat q2.log; fail "QLoRA --zero 3 on 2 ranks"; }
grep -q 'ZeRO stage 3' q2.log || { cat q2.log; fail "QLoRA: not ZeRO stage 3"; }
[ "$DEVICE" = cpu ] || grep -q "device memory: planned reserved" q2.log || { cat q2.log; fail "QLoRA: not on the GPU engine"; }
same_as q1.log q2.log "-np 2 --zero 3 QLoRA nf4"
exact_per_rank q2.log 2
mpi 2 "${ARGS[@]}" "${Q[@]}" "${ON[@]}" --zero 3 --resume q2/checkpoints/step-000010 --out q2r > q2r.log 2>&1 ||
    { cat q2r.log; fail "QLoRA --zero 3 resumed on 2 ranks"; }
resumed q2.log q2r.log "-np 2 --zero 3 QLoRA resumed at step 10"
echo "PASS"
