# A rank killed mid-run (kill -9): mpiexec exits non-zero within 30 s naming the rank, and the
# newest checkpoint is complete: the run resumes from it.
# Usage: bash rank_killed.sh MEMFIT MPIEXEC SOURCE_DIR [ZERO]
source "$(dirname "$0")/common.sh"
cd "$WORK"
ARGS=(train --model nano --data "$WORK/data" --batch 4 --seq 32 --eval-every 0 --eval-batches 1 --sample 0
      --progress plain --log-every 1 --threads 1 --zero "$ZERO" --checkpoint-every 1 --keep-checkpoints 3)

"$MPIEXEC" --oversubscribe --allow-run-as-root --bind-to none -n 2 -x OMP_NUM_THREADS=1 \
    "$MEMFIT" "${ARGS[@]}" --steps 100000 --out run > run.log 2>&1 &
MPI_PID=$!
# Wait for a few checkpoints: the newest at step 3 or later (older ones are removed as new ones
# come, so on a fast machine any given step's folder may already be gone when polled).
newest_step() {
    local d
    d=$(ls -d run/checkpoints/step-* 2> /dev/null | sort | tail -1)
    [ -n "$d" ] && echo $((10#${d##*step-})) || echo 0
}
for _ in $(seq 300); do
    [ "$(newest_step)" -ge 3 ] && break
    kill -0 $MPI_PID 2> /dev/null || { cat run.log; fail "mpiexec ended early"; }
    sleep 0.1
done
[ "$(newest_step)" -ge 3 ] || { kill -9 $MPI_PID; cat run.log; fail "no checkpoint within 30 s"; }

# Rank 1's process: a child of mpiexec whose environment says rank 1.
VICTIM=
for p in $(pgrep -P $MPI_PID); do
    if tr '\0' '\n' < /proc/$p/environ 2> /dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then VICTIM=$p; fi
done
[ -n "$VICTIM" ] || { kill -9 $MPI_PID; fail "rank 1's process not found among mpiexec's children"; }
kill -9 "$VICTIM"
START=$(date +%s)
RC=0
for _ in $(seq 300); do kill -0 $MPI_PID 2> /dev/null || break; sleep 0.1; done
if kill -0 $MPI_PID 2> /dev/null; then
    kill -9 $MPI_PID
    cat run.log
    fail "mpiexec still running 30 s after rank 1 was killed"
fi
wait $MPI_PID || RC=$?
echo "mpiexec exited with status $RC after $(( $(date +%s) - START )) s"
[ "$RC" != 0 ] || fail "mpiexec exited 0 after a rank was killed"
grep -E "process rank 1 .*(signal 9|Killed)" run.log || { cat run.log; fail "the output does not name rank 1"; }
# No rank is left over.
for p in $(pgrep -f "$WORK/data" || true); do fail "process $p still running"; done

# The newest complete checkpoint loads and the run continues from it (on one process: re-sharded).
NEWEST=$(ls -d run/checkpoints/step-* | sort | tail -1)
STEP=$((10#${NEWEST##*step-}))
echo "newest checkpoint: $NEWEST (step $STEP)"
"$MEMFIT" "${ARGS[@]}" --steps $((STEP + 2)) --resume run/checkpoints --out resumed > resumed.log 2>&1 ||
    { cat resumed.log; fail "resume from the newest checkpoint"; }
grep -q "step $((STEP + 2))/$((STEP + 2))" resumed.log || { cat resumed.log; fail "resumed run did not reach its end"; }
echo PASS
