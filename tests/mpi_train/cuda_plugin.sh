# The CUDA backend as a plug-in (backend/cuda_plugin.h): `memfit` itself, not the emulator's
# statically linked memfit_emu, loads the emulated backend (libmemfit_cuda_emu.so, through
# MEMFIT_CUDA_PLUGIN) on --device cuda and trains exactly as memfit_emu does, in one process and
# on 2 ranks over the (emulated) NCCL communicator; a run on the CPU maps no CUDA library; a
# plug-in that cannot be loaded is one clear line.
# Usage: bash cuda_plugin.sh MEMFIT MPIEXEC SOURCE_DIR MEMFIT_EMU EMU_PLUGIN
source "$(dirname "$0")/common.sh"
EMU=$(realpath "$4")
PLUGIN=$(realpath "$5")
cd "$WORK"
export MEMFIT_CUDA_EMU=1
ARGS=(train --device cuda --model nano --data "$WORK/data" --batch 4 --seq 32 --lr 1e-3 --warmup 2 --steps 4
      --eval-every 2 --eval-batches 2 --sample 0 --progress plain)
"$EMU" "${ARGS[@]}" --out linked > linked.log 2>&1 || { cat linked.log; fail "memfit_emu"; }
MEMFIT_CUDA_PLUGIN=$PLUGIN "$MEMFIT" "${ARGS[@]}" --out loaded > loaded.log 2>&1 || { cat loaded.log; fail "memfit with the plug-in"; }
grep -q 'device memory: planned reserved' loaded.log || { cat loaded.log; fail "no device-memory line"; }
cmp <(losses linked/metrics.jsonl) <(losses loaded/metrics.jsonl) || fail "the plug-in's losses differ from memfit_emu's"
echo "memfit + plug-in: $(final loaded.log) (memfit_emu: $(final linked.log))"
MEMFIT_CUDA_PLUGIN=$PLUGIN mpi 2 "${ARGS[@]}" --out two > two.log 2>&1 ||
    { cat two.log; fail "2 ranks with the plug-in"; }
grep -q "data parallel: 2 ranks (nccl)" two.log || { cat two.log; fail "2 ranks: not over NCCL"; }
d=$(loss_diff loaded/metrics.jsonl two/metrics.jsonl)
echo "2 ranks over the plug-in's NCCL against one process: max relative loss difference $d"
awk -v d="$d" 'BEGIN { exit !(d != "none" && d < 1e-4) }' || fail "2 ranks: losses differ by $d"

# A CPU run never loads a CUDA library (the dynamic loader's own record of what it opened).
LD_DEBUG=libs "$MEMFIT" train --model nano --data "$WORK/data" --batch 2 --seq 32 --steps 1 --sample 0 --out cpu \
    > cpu.log 2> cpu.ld || { cat cpu.log; fail "a CPU run"; }
if grep -E 'calling init: .*(libcudart|libcublas|libnccl|libmemfit_cuda)' cpu.ld; then fail "a CPU run loaded CUDA"; fi
grep -q 'calling init: .*libdnnl' cpu.ld || fail "LD_DEBUG recorded nothing (is this glibc?)"
echo "a CPU run: no CUDA library loaded"

# A plug-in that is missing: one line naming the path, exit 1, on the first --device cuda.
set +e
MEMFIT_CUDA_PLUGIN=$WORK/none.so "$MEMFIT" "${ARGS[@]}" --out none > none.log 2> none.err
code=$?
set -e
[ "$code" -eq 1 ] || { cat none.err; fail "a missing plug-in: exit $code, not 1"; }
[ "$(wc -l < none.err)" -eq 1 ] && grep -q "cannot load the CUDA backend: $WORK/none.so" none.err ||
    { cat none.err; fail "a missing plug-in: not one clear line"; }
echo "a missing plug-in: $(cat none.err)"
echo PASS
