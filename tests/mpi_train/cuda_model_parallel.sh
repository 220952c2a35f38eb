# Tensor, sequence and pipeline parallel training on GPUs (every group's collectives and the
# pipeline's sends over NCCL), composed with data parallelism, a pipeline's checkpoint resumed on
# the CPU, and LoRA in bf16 over 2 data-parallel
# ranks (NCCL sums the bf16 gradients natively: no fp32 communication scratch is planned), each
# against the same run in one CPU process: the same losses.
# Needs 2 GPUs (4 for the composed run): exits 77 (CTest: skipped) with the reason otherwise. With
# MEMFIT_CUDA_EMU=1 and MEMFIT the emulator's build (memfit_emu), each rank has an emulated GPU.
# Usage: bash cuda_model_parallel.sh MEMFIT MPIEXEC SOURCE_DIR
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
[ "${MEMFIT_CUDA_EMU:-0}" = 1 ] && gpus=4
if [ "${gpus:-0}" -lt 2 ]; then
    echo "SKIP: needs 2 CUDA GPUs, nvidia-smi lists ${gpus:-0}"
    exit 77
fi
source "$(dirname "$0")/common.sh"
cd "$WORK"
ARGS=(train --model nano --data "$WORK/data" --batch 4 --seq 32 --lr 1e-3 --warmup 2 --steps 4
      --eval-every 2 --eval-batches 1 --sample 0 --progress plain --log-every 1 --seed 1337)

"$MEMFIT" "${ARGS[@]}" --grad-accum 2 --device cpu --out one2 > one2.log 2>&1 || { cat one2.log; fail "one CPU process"; }
"$MEMFIT" "${ARGS[@]}" --grad-accum 4 --device cpu --out one4 > one4.log 2>&1 || { cat one4.log; fail "one CPU process"; }

# device_line LOG: the run ends with the plan beside the device memory in use.
device_line() {
    grep -q "device memory: planned reserved" "$1" || { cat "$1"; fail "$1: no device-memory line"; }
}

mpi 2 "${ARGS[@]}" --grad-accum 2 --device cuda --tp 2 --out tp2 > tp2.log 2>&1 || { cat tp2.log; fail "--tp 2 on GPUs"; }
grep -q '^  tensor parallel: 2 ranks per group' tp2.log || { cat tp2.log; fail "no tensor-parallel line"; }
device_line tp2.log
same_as one2.log tp2.log "GPUs -np 2 --tp 2"

mpi 2 "${ARGS[@]}" --grad-accum 2 --device cuda --tp 2 --sp --out sp2 > sp2.log 2>&1 || { cat sp2.log; fail "--tp 2 --sp on GPUs"; }
same_as one2.log sp2.log "GPUs -np 2 --tp 2 --sp"

# Context parallel: each GPU two chunks of every sequence, the keys and values all-gathered and
# their gradients reduce-scattered over NCCL, the CUDA attention kernels of its own.
mpi 2 "${ARGS[@]}" --grad-accum 2 --device cuda --cp 2 --out cp2 > cp2.log 2>&1 || { cat cp2.log; fail "--cp 2 on GPUs"; }
grep -q '^  context parallel: 2 ranks per sequence' cp2.log || { cat cp2.log; fail "no context-parallel line"; }
device_line cp2.log
same_as one2.log cp2.log "GPUs -np 2 --cp 2"
# The ring: the blocks and their gradients pass between the GPUs with NCCL's send and receive.
mpi 2 "${ARGS[@]}" --grad-accum 2 --device cuda --cp 2 --cp-comm-type p2p --out ring2 > ring2.log 2>&1 ||
    { cat ring2.log; fail "--cp 2 --cp-comm-type p2p on GPUs"; }
same_as one2.log ring2.log "GPUs -np 2 --cp 2 --cp-comm-type p2p"

mpi 2 "${ARGS[@]}" --grad-accum 4 --device cuda --pp 2 --schedule 1f1b --checkpoint-every 2 --out pp2 > pp2.log 2>&1 ||
    { cat pp2.log; fail "--pp 2 on GPUs"; }
grep -q "^  pipeline parallel: 2 stages, .*schedule 1f1b, 4 micro-batches" pp2.log || { cat pp2.log; fail "no pipeline line"; }
device_line pp2.log
same_as one4.log pp2.log "GPUs -np 2 --pp 2 --schedule 1f1b"
# Its step-2 checkpoint (each stage's share, gathered from the devices) resumes on one CPU process.
"$MEMFIT" "${ARGS[@]}" --grad-accum 4 --device cpu --resume pp2/checkpoints/step-000002 --out pp2re > pp2re.log 2>&1 ||
    { cat pp2re.log; fail "resume the GPU pipeline's checkpoint on one CPU process"; }
first=$(losses pp2re/metrics.jsonl | head -1 | cut -d' ' -f1)
[ "$first" = 3 ] || { cat pp2re.log; fail "the resumed run's first logged step is '$first', not 3"; }
same_as pp2.log pp2re.log "GPUs --pp 2 step-2 checkpoint resumed on one CPU process" "GPUs --pp 2"

mpi 2 "${ARGS[@]}" --grad-accum 4 --device cuda --pp 2 --schedule gpipe --out gpipe > gpipe.log 2>&1 ||
    { cat gpipe.log; fail "--pp 2 --schedule gpipe on GPUs"; }
same_as one4.log gpipe.log "GPUs -np 2 --pp 2 --schedule gpipe"

# The interleaved schedule: sends stay outstanding while a stage receives, on NCCL from a stream
# and communicators of their own (open_send_channels); the emulator's NCCL completes a send only
# once its receive is posted, and a stream's work only once its sends and receives are done.
"$MEMFIT" "${ARGS[@]/nano/micro}" --grad-accum 4 --device cpu --out micro4 > micro4.log 2>&1 ||
    { cat micro4.log; fail "micro, one CPU process"; }
mpi 2 "${ARGS[@]/nano/micro}" --grad-accum 4 --device cuda --pp 2 --schedule interleaved:2 --out inter > inter.log 2>&1 ||
    { cat inter.log; fail "--pp 2 --schedule interleaved:2 on GPUs"; }
grep -q "^  pipeline parallel: 2 stages, .*schedule interleaved:2" inter.log || { cat inter.log; fail "no interleaved line"; }
device_line inter.log
same_as micro4.log inter.log "GPUs -np 2 --pp 2 --schedule interleaved:2"
exact_per_rank inter.log 2

if [ "$gpus" -ge 4 ]; then
    mpi 4 "${ARGS[@]}" --grad-accum 2 --device cuda --tp 2 --zero 1 --out tp2dp2 > tp2dp2.log 2>&1 ||
        { cat tp2dp2.log; fail "--tp 2 x 2 data-parallel ranks on GPUs"; }
    grep -q 'data parallel: 2 ranks (nccl)' tp2dp2.log || { cat tp2dp2.log; fail "data parallel not over NCCL"; }
    same_as one2.log tp2dp2.log "GPUs -np 4 --tp 2 --zero 1 (2 data-parallel ranks)"
else
    echo "tp 2 x dp 2: skipped, needs 4 GPUs"
fi

# LoRA in bf16 on 2 data-parallel ranks: bf16 gradients summed by NCCL, no fp32 copy planned.
L=(train --model nano --data "$WORK/data" --batch 4 --seq 32 --lr 1e-3 --warmup 2 --steps 4 --sample 0
   --progress plain --log-every 1 --seed 1337 --lora-rank 4 --lora-targets all --precision bf16)
"$MEMFIT" "${L[@]}" --device cpu --out lora1 > lora1.log 2>&1 || { cat lora1.log; fail "LoRA, one CPU process"; }
mpi 2 "${L[@]}" --device cuda --out lora2 > lora2.log 2>&1 || { cat lora2.log; fail "LoRA on 2 GPUs"; }
grep -q 'data parallel: 2 ranks (nccl)' lora2.log || { cat lora2.log; fail "LoRA: not over NCCL"; }
# The memory table lists the categories that hold bytes: MPI's run plans fp32 copies, NCCL's none.
grep -qE '^  communication ' lora2.log && { cat lora2.log; fail "LoRA over NCCL: communication scratch planned"; }
mpi 2 "${L[@]}" --device cpu --out lora2cpu > lora2cpu.log 2>&1 || { cat lora2cpu.log; fail "LoRA on 2 CPU ranks"; }
grep -qE '^  communication ' lora2cpu.log || { cat lora2cpu.log; fail "LoRA over MPI: no fp32 scratch planned"; }
d=$(loss_diff lora1/metrics.jsonl lora2/metrics.jsonl)
echo "LoRA bf16, 1 CPU process vs 2 GPUs: max relative loss difference $d"
awk -v d="$d" 'BEGIN { exit !(d != "none" && d < 2e-2) }' || fail "LoRA: losses differ by $d"
echo PASS
