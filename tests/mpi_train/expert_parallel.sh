# Expert parallelism end to end (model/expert_parallel.h): a tiny Mixtral trained 20 steps by
# `mpirun -np 2 memfit train --ep 2 --moe-capacity-factor 4` (each rank half the experts, routed
# rows exchanged by all-to-all; a capacity that drops nothing) against one process on the same
# global batch: the same losses (the router's load-balancing and z losses included), each rank's
# plan equal to its measurement, `moe/dropped` 0 in metrics.jsonl; its step-10 checkpoint (the
# whole model, gathered from both ranks' experts) resumed on one process; 4 ranks as 2 expert
# groups x 2 under ZeRO-1; accumulation under ZeRO-2; ZeRO-3 with full recomputation and both
# offloads; and a capacity of 0.25 dropping choices, counted.
# DEVICE cuda (MEMFIT the emulator's build with MEMFIT_CUDA_EMU=1, or GPUs): the ranks on the CUDA
# engine, the all-to-alls over NCCL, against the one CPU process; 6 steps.
# Usage: bash expert_parallel.sh MEMFIT MPIEXEC SOURCE_DIR [DEVICE]
source "$(dirname "$0")/common.sh"
DEVICE=${4:-cpu}
cd "$WORK"
STEPS=20
[ "$DEVICE" = cpu ] || STEPS=6
HALF=$((STEPS / 2))
CKPT="step-$(printf '%06d' "$HALF")"
BASE=(train --model mixtral-nano --data "$WORK/data" --batch 4 --seq 32 --lr 1e-3 --warmup 2
      --clip 0.5 --eval-every "$HALF" --eval-batches 1 --sample 0 --progress plain --log-every 1 --threads 1 --seed 1337)
ARGS=("${BASE[@]}" --steps "$STEPS")

"$MEMFIT" "${ARGS[@]}" --device cpu --out one > one.log 2>&1 || { cat one.log; fail "one process"; }

mpi 2 "${ARGS[@]}" --device "$DEVICE" --ep 2 --moe-capacity-factor 4 --checkpoint-every "$HALF" --out ep2 > ep2.log 2>&1 ||
    { cat ep2.log; fail "-np 2 --ep 2"; }
grep -q '^  expert parallel: 2 ranks per group' ep2.log || { cat ep2.log; fail "no expert-parallel line"; }
same_as one.log ep2.log "-np 2 --ep 2 --moe-capacity-factor 4 ($DEVICE)"
exact_per_rank ep2.log 2
grep -q '"expert_parallel":2' <(tr -d ' \n' < ep2/summary.json) || fail "ep2: summary.json's config has no expert_parallel 2"
grep -q '"moe/dropped":0' ep2/metrics.jsonl || { head -2 ep2/metrics.jsonl; fail "ep2: moe/dropped is not 0"; }

# The checkpoint holds the whole model: one process resumes it where the two ranks left off.
"$MEMFIT" "${ARGS[@]}" --device cpu --resume "ep2/checkpoints/$CKPT" --out re > re.log 2>&1 ||
    { cat re.log; fail "resume the --ep 2 checkpoint on one process"; }
same_as ep2.log re.log "--ep 2 step-$HALF checkpoint resumed on one process" "--ep 2"

[ "$DEVICE" = cpu ] || exit 0
# Gradient accumulation under ZeRO-2: each micro-batch's buckets reduce-scattered into the shard,
# the dense part's summed over the expert group once, after the last.
"$MEMFIT" "${BASE[@]}" --steps 6 --grad-accum 2 --out acc1 > acc1.log 2>&1 || { cat acc1.log; fail "one process, accumulation"; }
mpi 2 "${BASE[@]}" --steps 6 --grad-accum 2 --ep 2 --moe-capacity-factor 4 --zero 2 --out acc2 > acc2.log 2>&1 ||
    { cat acc2.log; fail "-np 2 --ep 2 --zero 2 --grad-accum 2"; }
same_as acc1.log acc2.log "-np 2 --ep 2 --zero 2 --grad-accum 2"
mpi 4 "${ARGS[@]}" --ep 2 --moe-capacity-factor 4 --zero 1 --out ep4 > ep4.log 2>&1 || { cat ep4.log; fail "-np 4 --ep 2 --zero 1"; }
same_as one.log ep4.log "-np 4 --ep 2 --zero 1 (2 expert groups x 2)"
exact_per_rank ep4.log 4

# ZeRO-3 with full recomputation, the optimizer's states and the saved activations offloaded.
mkdir -p off
mpi 2 "${ARGS[@]}" --ep 2 --moe-capacity-factor 4 --zero 3 --recompute full --offload optimizer+activations \
    --offload-dir "$WORK/off" --out off2 > off2.log 2>&1 || { cat off2.log; fail "-np 2 --ep 2 --zero 3 --offload"; }
same_as one.log off2.log "-np 2 --ep 2 --zero 3 --recompute full --offload optimizer+activations"
exact_per_rank off2.log 2

mpi 2 "${BASE[@]}" --steps 2 --ep 2 --moe-capacity-factor 0.25 --out tight > tight.log 2>&1 ||
    { cat tight.log; fail "-np 2 --ep 2 --moe-capacity-factor 0.25"; }
grep -qE '"moe/dropped":[1-9]' tight/metrics.jsonl || { cat tight/metrics.jsonl; fail "a capacity of 0.25 dropped nothing"; }
echo "ok"
