# The layouts the field trains with, end to end against one process over 20 steps (6 on the CUDA
# engine, below) with accumulation, clipping (every step clips) and a checkpoint-resume halfway:
#   --zero 3 with LoRA and an nf4 base (FSDP-QLoRA) on 2 ranks (tests/mpi/test_lora_sharded.cpp
#   checks each rank's shard of the base to the byte): the one process's losses, each rank's plan
#   equal to its measurement; resumed at the half on 2 ranks, the uninterrupted run's last steps.
#   --mlp-chunk (TiledMLP) and --share-layers 2 under --tp 2 --sp --zero 3 (CPU);
#   QLoRA (nf4) with --tp 2 x 2 (4 ranks), resumed (each tensor rank quantizes its own slice of
#   the base, so its losses are within 2e-3, not 1e-4); and (CPU) LoRA on every projection under
#   --tp 2 --sp --zero 3, and QDoRA (DoRA on nf4) on every projection under --pp 2 x 2 --zero 3.
#   --zero 3 with --tp 2 --sp x 2 data-parallel ranks (4 ranks), resumed (CPU: also resharded, on
#   one process and on 2 ranks under ZeRO 1); and (CPU) --zero 2 with
#   --tp 2, and --tp 4 with fewer KV heads than tensor ranks x 2 (8 ranks).
#   --zero 3 with --pp 2 (1F1B) x 2 (4 ranks), resumed; and (CPU) QLoRA (nf4) with --pp 2 x 2,
#   resumed, and GPT-2's tied embedding under
#   --pp 2 --schedule interleaved:2 --zero 2.
# DEVICE cuda (MEMFIT the emulator's build, memfit_emu, with MEMFIT_CUDA_EMU=1, or GPUs): the
# ranks run on the CUDA engine against the one CPU process: 6 steps of each layout (the emulator
# runs a step in about 2 s per 4 ranks), one resume (the checkpoint code is the engines' shared
# one), and the CPU-only cases left out.
# Usage: bash layouts.sh MEMFIT MPIEXEC SOURCE_DIR [DEVICE]
source "$(dirname "$0")/common.sh"
DEVICE=${4:-cpu}
cd "$WORK"
STEPS=20
[ "$DEVICE" = cpu ] || STEPS=6
HALF=$((STEPS / 2))
CKPT="step-$(printf '%06d' "$HALF")"
BASE=(train --data "$WORK/data" --batch 4 --seq 32 --lr 1e-3 --warmup 2 --steps "$STEPS" --clip 0.5 --eval-every "$HALF"
      --eval-batches 1 --sample 0 --progress plain --log-every 1 --threads 1 --seed 1337)
ARGS=("${BASE[@]}" --model llama-micro --grad-accum 2)
ON=(--device "$DEVICE")

# resumed REFERENCE_LOG LOG WHAT: LOG's run resumed after step HALF and its losses are the reference's.
resumed() {
    local first
    first=$(losses "${2%.log}/metrics.jsonl" | head -1 | cut -d' ' -f1)
    [ "$first" = $((HALF + 1)) ] || { cat "$2"; fail "$3: first logged step is '$first', not $((HALF + 1)) (did it resume?)"; }
    same_as "$1" "$2" "$3" "uninterrupted"
}

# near REFERENCE_LOG LOG WHAT TOL: every step both logged within a relative TOL (a base quantized
# slice by slice under tensor parallelism: each slice's own scales, not the whole matrix's).
near() {
    local d
    d=$(loss_diff "${1%.log}/metrics.jsonl" "${2%.log}/metrics.jsonl")
    echo "$3: max relative loss difference $d (tolerance $4)"
    awk -v d="$d" -v t="$4" 'BEGIN { exit !(d != "none" && d < t) }' || { cat "$2"; fail "$3: step losses differ by $d"; }
}

# ---- LoRA with an nf4 base under ZeRO 3 ----
Q=(--lora-rank 8 --base-weights nf4)
"$MEMFIT" "${ARGS[@]}" "${Q[@]}" --out q1 > q1.log 2>&1 || { cat q1.log; fail "QLoRA, one process"; }
mpi 2 "${ARGS[@]}" "${Q[@]}" "${ON[@]}" --zero 3 --checkpoint-every "$HALF" --out q2 > q2.log 2>&1 ||
    { cat q2.log; fail "QLoRA --zero 3 on 2 ranks"; }
grep -q 'ZeRO stage 3' q2.log || { cat q2.log; fail "QLoRA: not ZeRO stage 3"; }
[ "$DEVICE" = cpu ] || grep -q "device memory: planned reserved" q2.log || { cat q2.log; fail "QLoRA: not on the GPU engine"; }
same_as q1.log q2.log "-np 2 --zero 3 QLoRA nf4"
exact_per_rank q2.log 2
mpi 2 "${ARGS[@]}" "${Q[@]}" "${ON[@]}" --zero 3 --resume q2/checkpoints/"$CKPT" --out q2r > q2r.log 2>&1 ||
    { cat q2r.log; fail "QLoRA --zero 3 resumed on 2 ranks"; }
resumed q2.log q2r.log "-np 2 --zero 3 QLoRA resumed at step $HALF"
# ---- LoRA / QLoRA with tensor parallelism: B split on q|k|v and gate|up, A on o and down ----
mpi 4 "${ARGS[@]}" "${Q[@]}" "${ON[@]}" --tp 2 --checkpoint-every "$HALF" --out qt > qt.log 2>&1 ||
    { cat qt.log; fail "QLoRA --tp 2 on 4 ranks"; }
grep -q '^  tensor parallel: 2 ranks per group' qt.log || { cat qt.log; fail "QLoRA --tp 2: no tensor-parallel line"; }
near q1.log qt.log "-np 4 --tp 2 QLoRA nf4 (tests/mpi/test_lora_sharded.cpp: exact against its own dequantized base)" 2e-3
exact_per_rank qt.log 4
if [ "$DEVICE" = cpu ]; then   # resumed (the emulated GPU: once, above; the checkpoint code is shared)
    mpi 4 "${ARGS[@]}" "${Q[@]}" "${ON[@]}" --tp 2 --resume qt/checkpoints/"$CKPT" --out qtr > qtr.log 2>&1 ||
        { cat qtr.log; fail "QLoRA --tp 2 resumed"; }
    resumed qt.log qtr.log "-np 4 --tp 2 QLoRA resumed at step $HALF"
fi
if [ "$DEVICE" = cpu ]; then   # every projection adapted, with sequence parallelism and the base sharded
    A=(--lora-rank 8 --lora-targets all)
    "$MEMFIT" "${ARGS[@]}" "${A[@]}" --out la1 > la1.log 2>&1 || { cat la1.log; fail "LoRA all, one process"; }
    mpi 4 "${ARGS[@]}" "${A[@]}" --tp 2 --sp --zero 3 --out lat > lat.log 2>&1 ||
        { cat lat.log; fail "LoRA all --tp 2 --sp --zero 3 on 4 ranks"; }
    same_as la1.log lat.log "-np 4 --tp 2 --sp --zero 3 LoRA on every projection"
    exact_per_rank lat.log 4
fi
if [ "$DEVICE" = cpu ]; then   # QDoRA: the magnitudes sharded and gathered with their layer, the norms per stage
    D=(--lora-rank 8 --lora-targets all --lora-variant dora --base-weights nf4)
    "$MEMFIT" "${ARGS[@]}" "${D[@]}" --out qd1 > qd1.log 2>&1 || { cat qd1.log; fail "QDoRA, one process"; }
    mpi 4 "${ARGS[@]}" "${D[@]}" --pp 2 --zero 3 --out qdp > qdp.log 2>&1 || { cat qdp.log; fail "QDoRA --pp 2 --zero 3 x 2"; }
    same_as qd1.log qdp.log "-np 4 --pp 2 x 2 --zero 3 QDoRA nf4 on every projection"
    exact_per_rank qdp.log 4
fi

# ---- ZeRO 2/3 with tensor (and sequence) parallelism ----
"$MEMFIT" "${ARGS[@]}" --out one > one.log 2>&1 || { cat one.log; fail "one process"; }
mpi 4 "${ARGS[@]}" "${ON[@]}" --tp 2 --sp --zero 3 --checkpoint-every "$HALF" --out tz3 > tz3.log 2>&1 ||
    { cat tz3.log; fail "--tp 2 --sp --zero 3 on 4 ranks"; }
grep -q 'ZeRO stage 3' tz3.log && grep -q '^  tensor parallel: 2 ranks per group' tz3.log ||
    { cat tz3.log; fail "--tp 2 --sp --zero 3: not the layout asked for"; }
same_as one.log tz3.log "-np 4 --tp 2 --sp --zero 3"
exact_per_rank tz3.log 4
if [ "$DEVICE" = cpu ]; then   # resumed (the emulated GPU: once, above; the checkpoint code is shared)
    mpi 4 "${ARGS[@]}" "${ON[@]}" --tp 2 --sp --zero 3 --resume tz3/checkpoints/"$CKPT" --out tz3r > tz3r.log 2>&1 ||
        { cat tz3r.log; fail "--tp 2 --sp --zero 3 resumed"; }
    resumed tz3.log tz3r.log "-np 4 --tp 2 --sp --zero 3 resumed at step $HALF"
    # Resharding: the same checkpoint continues on one process (tp 2 -> 1, ZeRO 3 over 2 -> none)
    # and on 2 data-parallel ranks under ZeRO 1, with the uninterrupted run's losses.
    "$MEMFIT" "${ARGS[@]}" --resume tz3/checkpoints/"$CKPT" --out tz3one > tz3one.log 2>&1 ||
        { cat tz3one.log; fail "--tp 2 --sp --zero 3 checkpoint resumed on one process"; }
    resumed tz3.log tz3one.log "--tp 2 --sp --zero 3 (4 ranks) resumed on one process"
    mpi 2 "${ARGS[@]}" --zero 1 --resume tz3/checkpoints/"$CKPT" --out tz3dp > tz3dp.log 2>&1 ||
        { cat tz3dp.log; fail "--tp 2 --sp --zero 3 checkpoint resumed on -np 2 --zero 1"; }
    resumed tz3.log tz3dp.log "--tp 2 --sp --zero 3 (4 ranks) resumed on -np 2 --zero 1"
fi
if [ "$DEVICE" = cpu ]; then   # ZeRO-2; 2 KV heads over 4 tensor ranks: each KV head's gradient summed over its 2 holders
    mpi 4 "${ARGS[@]}" --tp 2 --zero 2 --out tz2 > tz2.log 2>&1 || { cat tz2.log; fail "--tp 2 --zero 2 on 4 ranks"; }
    same_as one.log tz2.log "-np 4 --tp 2 --zero 2"
    exact_per_rank tz2.log 4
    # TiledMLP (--mlp-chunk) under tensor and sequence parallelism: chunks of the gathered rows
    "$MEMFIT" "${ARGS[@]}" --mlp-chunk 48 --out mc1 > mc1.log 2>&1 || { cat mc1.log; fail "--mlp-chunk, one process"; }
    mpi 4 "${ARGS[@]}" --mlp-chunk 48 --tp 2 --sp --zero 3 --out mct > mct.log 2>&1 ||
        { cat mct.log; fail "--mlp-chunk 48 --tp 2 --sp --zero 3 on 4 ranks"; }
    same_as mc1.log mct.log "-np 4 --mlp-chunk 48 --tp 2 --sp --zero 3"
    exact_per_rank mct.log 4
    # Cross-layer sharing (--share-layers 2) under tensor parallelism: each rank's slice of a stored block
    "$MEMFIT" "${ARGS[@]}" --share-layers 2 --out sh1 > sh1.log 2>&1 || { cat sh1.log; fail "--share-layers, one process"; }
    mpi 4 "${ARGS[@]}" --share-layers 2 --tp 2 --sp --zero 3 --out sht > sht.log 2>&1 ||
        { cat sht.log; fail "--share-layers 2 --tp 2 --sp --zero 3 on 4 ranks"; }
    same_as sh1.log sht.log "-np 4 --share-layers 2 --tp 2 --sp --zero 3"
    exact_per_rank sht.log 4
    mpi 8 "${ARGS[@]}" --tp 4 --zero 2 --out t4 > t4.log 2>&1 || { cat t4.log; fail "--tp 4 --zero 2 on 8 ranks"; }
    grep -q '(1 of 2 KV)' t4.log || { cat t4.log; fail "--tp 4: KV heads not replicated"; }
    same_as one.log t4.log "-np 8 --tp 4 --zero 2"
    exact_per_rank t4.log 8
fi
# ---- ZeRO 2/3 with pipeline parallelism: every micro-batch's gradients reduce-scattered into the shard ----
P4=("${BASE[@]}" --model llama-micro --grad-accum 4)
"$MEMFIT" "${P4[@]}" --out one4 > one4.log 2>&1 || { cat one4.log; fail "one process, --grad-accum 4"; }
mpi 4 "${P4[@]}" "${ON[@]}" --pp 2 --schedule 1f1b --zero 3 --checkpoint-every "$HALF" --out pz3 > pz3.log 2>&1 ||
    { cat pz3.log; fail "--pp 2 --zero 3 on 4 ranks"; }
grep -q 'ZeRO stage 3' pz3.log && grep -q '^  pipeline parallel: 2 stages' pz3.log ||
    { cat pz3.log; fail "--pp 2 --zero 3: not the layout asked for"; }
same_as one4.log pz3.log "-np 4 --pp 2 --zero 3"
exact_per_rank pz3.log 4
if [ "$DEVICE" = cpu ]; then   # resumed (the emulated GPU: once, above; the checkpoint code is shared)
    mpi 4 "${P4[@]}" "${ON[@]}" --pp 2 --schedule 1f1b --zero 3 --resume pz3/checkpoints/"$CKPT" --out pz3r > pz3r.log 2>&1 ||
        { cat pz3r.log; fail "--pp 2 --zero 3 resumed"; }
    resumed pz3.log pz3r.log "-np 4 --pp 2 --zero 3 resumed at step $HALF"
fi
if [ "$DEVICE" = cpu ]; then   # QLoRA on a pipeline: each stage's adapters and its part of the base
    "$MEMFIT" "${P4[@]}" "${Q[@]}" --out q4 > q4.log 2>&1 || { cat q4.log; fail "QLoRA, one process, --grad-accum 4"; }
    mpi 4 "${P4[@]}" "${Q[@]}" --pp 2 --schedule 1f1b --checkpoint-every "$HALF" --out qp > qp.log 2>&1 ||
        { cat qp.log; fail "QLoRA --pp 2 on 4 ranks"; }
    same_as q4.log qp.log "-np 4 --pp 2 QLoRA nf4"
    exact_per_rank qp.log 4
    mpi 4 "${P4[@]}" "${Q[@]}" --pp 2 --schedule 1f1b --resume qp/checkpoints/"$CKPT" --out qpr > qpr.log 2>&1 ||
        { cat qpr.log; fail "QLoRA --pp 2 resumed"; }
    resumed qp.log qpr.log "-np 4 --pp 2 QLoRA resumed at step $HALF"
fi
if [ "$DEVICE" = cpu ]; then   # GPT-2's tied embedding across the two ends, the interleaved schedule, ZeRO-2
    G4=("${BASE[@]}" --model micro --grad-accum 4)
    "$MEMFIT" "${G4[@]}" --out gone > gone.log 2>&1 || { cat gone.log; fail "micro, one process"; }
    mpi 4 "${G4[@]}" --pp 2 --schedule interleaved:2 --zero 2 --out pz2 > pz2.log 2>&1 ||
        { cat pz2.log; fail "--pp 2 --schedule interleaved:2 --zero 2 on 4 ranks"; }
    same_as gone.log pz2.log "-np 4 --pp 2 --schedule interleaved:2 --zero 2 (tied embedding)"
    exact_per_rank pz2.log 4
fi
echo "PASS"
