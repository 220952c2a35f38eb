# Preemption under mpirun: SIGUSR1 to mpirun (which forwards it to every rank) stops the job at
# one step boundary on every rank, with every rank's shard checkpointed and exit 0; the same
# command with --resume auto continues; the final shards equal an uninterrupted job's bit for bit.
# And a sharded checkpoint that fails on the ranks is one clean stop, not a hang.
# Usage: bash preempt.sh MEMFIT MPIEXEC SOURCE_DIR
source "$(dirname "$0")/common.sh"
cd "$WORK"
ARGS=(train --model nano --data "$WORK/data" --seq 32 --micro-batch 2 --steps 600 --checkpoint-every 200 --zero 1
      --sample 0 --eval-every 0 --log-every 1 --progress quiet --threads 1)
mpi 2 "${ARGS[@]}" --out ref > /dev/null
for at in 100 400; do
    "$MPIEXEC" --oversubscribe --allow-run-as-root --bind-to none -n 2 -x OMP_NUM_THREADS=1 "$MEMFIT" "${ARGS[@]}" \
        --resume auto --out job > job.log 2>&1 &
    pid=$!
    until grep -q "\"step\":$at," job/metrics.jsonl 2> /dev/null; do
        kill -0 $pid 2> /dev/null || break
        sleep 0.01
    done
    kill -USR1 $pid
    wait $pid || { cat job.log; fail "the stopped job exited non-zero"; }
    grep -q "memfit: stopped by SIGUSR1 at step" job.log || { cat job.log; fail "no stop line"; }
    step=$(sed -nE 's/.*stopped by SIGUSR1 at step ([0-9]+) .*/\1/p' job.log)
    [ -f "job/checkpoints/$(printf 'step-%06d' "$step")/state-rank-00001-of-00002.safetensors" ] ||
        fail "no checkpoint of both ranks at the stop step $step"
done
mpi 2 "${ARGS[@]}" --resume auto --out job > /dev/null
for f in ref/checkpoints/step-000600/state-rank-*; do
    cmp "$f" "job/checkpoints/step-000600/$(basename "$f")" || fail "$(basename "$f") differs from the uninterrupted job's"
done
# A sharded checkpoint that one rank cannot write (a file-size limit on rank 1 only: EFBIG, as a
# full disk gives ENOSPC): both ranks stop with the error (rank 0 does not wait for rank 1's
# shard), the previous checkpoint is intact and no partial folder stays. (The limit is set inside
# the rank: OpenMPI's own shared-memory files need more; btl tcp keeps them out of the ranks.)
DARGS=(train --model nano --data "$WORK/data" --seq 32 --micro-batch 2 --checkpoint-every 5 --zero 1 --sample 0
       --eval-every 0 --progress quiet --threads 1 --out disk)
mpi 2 "${DARGS[@]}" --steps 5 > /dev/null
if timeout 120 "$MPIEXEC" --oversubscribe --allow-run-as-root --bind-to none --mca btl self,tcp -n 2 \
        -x OMP_NUM_THREADS=1 bash -c '[ "$OMPI_COMM_WORLD_RANK" = 1 ] && ulimit -f 300; exec "$0" "$@"' \
        "$MEMFIT" "${DARGS[@]}" --steps 10 --resume auto > disk.log 2>&1; then
    cat disk.log; fail "a checkpoint over rank 1's file-size limit succeeded"
fi
grep -q "the checkpoint of step 10 failed (disk/checkpoints/step-000005 is intact)" disk.log ||
    { cat disk.log; fail "no clear line for the failed sharded checkpoint (or a hang)"; }
[ "$(ls -A disk/checkpoints)" = "step-000005" ] || { ls -A disk/checkpoints; fail "a partial checkpoint folder stayed"; }
mpi 2 "${DARGS[@]}" --steps 10 --resume auto > /dev/null
[ -f disk/checkpoints/step-000010/meta.json ] || fail "the intact checkpoint did not resume"
echo PASS
