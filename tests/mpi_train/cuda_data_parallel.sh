# `mpirun -np 2 memfit train --device cuda --zero K` (NCCL) against one GPU process on the same
# global batch: the same losses to fp32 rounding, every ZeRO stage, and the device-memory line.
# Needs 2 GPUs: exits 77 (CTest: skipped) with the reason otherwise. With MEMFIT_CUDA_EMU=1 and
# MEMFIT the emulator's build (memfit_emu), each rank has an emulated GPU of its own.
# Usage: bash cuda_data_parallel.sh MEMFIT MPIEXEC SOURCE_DIR
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
[ "${MEMFIT_CUDA_EMU:-0}" = 1 ] && gpus=2
if [ "${gpus:-0}" -lt 2 ]; then
    echo "SKIP: needs 2 CUDA GPUs, nvidia-smi lists ${gpus:-0}"
    exit 77
fi
source "$(dirname "$0")/common.sh"
cd "$WORK"
ARGS=(train --device cuda --model nano --data "$WORK/data" --batch 4 --grad-accum 2 --seq 32 --lr 1e-3 --warmup 2
      --eval-every 3 --eval-batches 2 --sample 0 --progress plain)
"$MEMFIT" "${ARGS[@]}" --steps 6 --out one > one.log 2>&1 || { cat one.log; fail "one GPU process"; }
grep -q 'device memory: planned reserved' one.log || { cat one.log; fail "no device-memory line"; }
for zero in 0 1 2 3; do
    mpi 2 "${ARGS[@]}" --zero $zero --steps 6 --out two$zero > two$zero.log 2>&1 || { cat two$zero.log; fail "2 ranks, ZeRO $zero"; }
    grep -q "data parallel: 2 ranks (nccl)" two$zero.log || { cat two$zero.log; fail "not over NCCL"; }
    d=$(loss_diff one/metrics.jsonl two$zero/metrics.jsonl)
    echo "ZeRO $zero: 1 GPU vs 2 ranks over NCCL: max relative loss difference $d"
    awk -v d="$d" 'BEGIN { exit !(d != "none" && d < 1e-4) }' || fail "ZeRO $zero: losses differ by $d"
done
