# The watchdog (--comm-timeout): a rank that stops answering (SIGSTOP: frozen, as a hung rank is)
# and a rank that exits 0 early each leave the other blocked in a collective; within the timeout
# every rank ends, non-zero, with one line naming the operation, the step and the rank that did
# not arrive.
# Usage: bash watchdog.sh MEMFIT MPIEXEC SOURCE_DIR
source "$(dirname "$0")/common.sh"
cd "$WORK"
ARGS=(train --model nano --data "$WORK/data" --seq 32 --micro-batch 2 --steps 100000 --sample 0 --eval-every 0
      --log-every 1 --progress quiet --threads 1 --comm-timeout 5)
# 1. Rank 1 frozen once the job is running.
"$MPIEXEC" --oversubscribe --allow-run-as-root --bind-to none -n 2 -x OMP_NUM_THREADS=1 "$MEMFIT" "${ARGS[@]}" \
    --out frozen > frozen.log 2>&1 &
job=$!
until grep -q '"step":20,' frozen/metrics.jsonl 2> /dev/null; do
    kill -0 $job 2> /dev/null || { cat frozen.log; fail "the job ended before it was frozen"; }
    sleep 0.05
done
rank1=""
for p in $(pgrep -f "memfit train --model nano --data $WORK/data"); do
    tr '\0' '\n' < /proc/$p/environ 2> /dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 && rank1=$p
done
[ -n "$rank1" ] || fail "rank 1's process not found"
start=$SECONDS
kill -STOP "$rank1"
if wait $job; then cat frozen.log; fail "the frozen job exited 0"; fi
took=$((SECONDS - start))
[ $took -le 60 ] || fail "the watchdog took ${took}s for a 5 s timeout"
grep -q "memfit: error: MPI .* on rank 0 of 2 at step [0-9]* has not completed in 5 s (--comm-timeout); world ranks that did not arrive: 1 (no answer" frozen.log ||
    { cat frozen.log; fail "no watchdog line naming rank 1"; }
kill -KILL "$rank1" 2> /dev/null || true
# 2. Rank 1 exits 0 at step 7 (it would wait in MPI_Finalize forever).
start=$SECONDS
if "$MPIEXEC" --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1 -n 1 "$MEMFIT" "${ARGS[@]}" \
        --out early : -n 1 -x MEMFIT_TEST_EXIT_AT_STEP=7 "$MEMFIT" "${ARGS[@]}" --out early > early.log 2>&1; then
    cat early.log; fail "the job with a rank that left early exited 0"
fi
took=$((SECONDS - start))
[ $took -le 60 ] || fail "the watchdog took ${took}s for a 5 s timeout"
grep -q "at step 7 has not completed in 5 s (--comm-timeout); world ranks that did not arrive: 1 (no answer" early.log ||
    { cat early.log; fail "no watchdog line naming rank 1 at step 7"; }
echo PASS
