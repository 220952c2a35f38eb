# An allocation that fails on one rank of a 2-rank job (MEMFIT_TEST_FAIL_ACQUIRE on rank 1 only):
# that rank writes the picture of its failing step beside the run's report (report-rank1.html,
# trace-rank1.json, up to the op that failed), names them in its error line, and the job ends
# non-zero; `memfit monitor` of the folder then says the run ended without a summary.
# Usage: bash oom_report.sh MEMFIT MPIEXEC SOURCE_DIR
source "$(dirname "$0")/common.sh"
cd "$WORK"
ARGS=(train --model nano --data "$WORK/data" --seq 32 --micro-batch 1 --sample 0 --eval-every 0 --progress quiet
      --threads 1 --steps 20 --out job)
if "$MPIEXEC" --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1 -n 1 "$MEMFIT" "${ARGS[@]}" \
        : -n 1 -x MEMFIT_TEST_FAIL_ACQUIRE=120 "$MEMFIT" "${ARGS[@]}" > job.log 2>&1; then
    cat job.log; fail "the job whose rank 1 ran out of memory exited 0"
fi
grep -q "failed (injected); rank 1 of 2.*; step [0-9]*'s memory up to op [0-9]* ([a-z_0-9]*), where it failed: job/report-rank1.html and job/trace-rank1.json" job.log ||
    { cat job.log; fail "rank 1's error line does not name its report"; }
[ -f job/report-rank1.html ] && [ -f job/trace-rank1.json ] || { ls job; fail "rank 1's report is missing"; }
grep -q 'class="failure" data-failed-op="[0-9]*"' job/report-rank1.html || fail "no failure banner in report-rank1.html"
op=$(sed -nE 's/.*"failed_op":([0-9]+).*/\1/p' job/trace-rank1.json)
[ -n "$op" ] && grep -q "up to op $op " job.log || { cat job.log; fail "the trace's failed op ($op) is not the error line's"; }
[ ! -f job/summary.json ] || fail "a failed job wrote summary.json"
# The monitor of the ended job (its ranks may take a moment to be gone) exits 1: no summary.
if out=$(timeout 60 "$MEMFIT" monitor job --interval 0.1); then echo "$out"; fail "the monitor of a failed run exited 0"; fi
grep -q "ended without summary.json" <<< "$out" || { echo "$out"; fail "the monitor does not say the run failed"; }
echo "ok: rank 1's out-of-memory step left report-rank1.html and trace-rank1.json, named in its error line"
