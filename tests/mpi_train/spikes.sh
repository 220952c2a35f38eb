# --skip-spikes under data parallel: a bad batch on rank 0 alone (MEMFIT_TEST_GRAD_SPIKES
# "STEP:batch") is a loss outlier of the whole step, which both ranks leave out together: every
# rank's shard after the step is the one before it, bit for bit (rank 1's own rows were fine: had
# it decided alone, it would have applied the step). The bad step's loss gradient is scaled down
# tenfold ("400:0.1"), so that its gradient norm, which every rank shares, is no outlier: the loss
# alone gives it away. And under --pp 2, where only the last stage computes the loss, the first
# stage leaves the step out too.
# Usage: bash spikes.sh MEMFIT MPIEXEC SOURCE_DIR
source "$(dirname "$0")/common.sh"
cd "$WORK"
for layout in "--zero 1" "--pp 2"; do
    rm -rf job
    # shellcheck disable=SC2086
    MEMFIT_TEST_GRAD_SPIKES=400:batch,400:0.1 "$MPIEXEC" --oversubscribe --allow-run-as-root --bind-to none -n 2 \
        -x OMP_NUM_THREADS=1 -x MEMFIT_TEST_GRAD_SPIKES "$MEMFIT" train --model nano --data "$WORK/data" --seq 32 \
        --micro-batch 4 $layout --sample 0 --eval-every 0 --log-every 1 --progress quiet --threads 1 \
        --skip-spikes 3 --spike-rollback 0 --lr 1e-3 --steps 400 --checkpoint-every 1 --keep-checkpoints 2 \
        --out job > job.log 2>&1 || { cat job.log; fail "$layout: the job failed"; }
    grep '"step":400,' job/metrics.jsonl | grep -q '"spike":"loss ' ||
        { tail -2 job/metrics.jsonl; fail "$layout: step 400's loss was no outlier"; }
    for f in job/checkpoints/step-000399/state-rank-*; do
        cmp "$f" "job/checkpoints/step-000400/$(basename "$f")" || fail "$layout: $(basename "$f"): the bad step was applied"
    done
done
echo "ok: the bad rows of rank 0 left out on both ranks (--zero 1, --pp 2)"
