# `memfit monitor` of a running 2-rank job, in a terminal (tmux, read back with capture-pane):
# while the job runs the view shows both ranks' memory by category with their peaks equal to
# their plans; when the job ends with its summary, the monitor says so and exits 0.
# Usage: bash monitor.sh MEMFIT MPIEXEC SOURCE_DIR
source "$(dirname "$0")/common.sh"
cd "$WORK"
command -v tmux > /dev/null || fail "tmux is not installed (bash scripts/install-deps.sh --test installs it)"
TMUX_CMD=(tmux -S "$WORK/tmux.sock")
trap '"${TMUX_CMD[@]}" kill-server 2> /dev/null || true; rm -rf "$WORK"' EXIT
mpi 2 train --model nano --data "$WORK/data" --seq 32 --micro-batch 2 --sample 0 --eval-every 0 --progress quiet \
    --threads 1 --steps 3000 --log-every 10 --out job > job.log 2>&1 &
JOB=$!
"${TMUX_CMD[@]}" new-session -d -s mon -x 150 -y 45 -c "$WORK" \
    "'$MEMFIT' monitor job --interval 0.2; echo \"monitor exited \$?\" > mon.rc; sleep 60"
screen() { "${TMUX_CMD[@]}" capture-pane -p -t mon; }
# While the job runs: both ranks, each rank's peak its plan, a step past the first.
seen=""
for _ in $(seq 300); do
    s=$(screen)
    if grep -q "2 ranks (pid [0-9]*), running" <<< "$s" && grep -q "^rank 1 " <<< "$s" &&
        [ "$(grep -c "peak 100.0% of plan" <<< "$s")" -eq 2 ] && grep -qE "^step [1-9][0-9]*/3000" <<< "$s"; then
        seen=$s
        break
    fi
    kill -0 "$JOB" 2> /dev/null || break
    sleep 0.1
done
[ -n "$seen" ] || { screen; cat job.log; fail "the monitor never showed both ranks of the running job"; }
grep -q "optimizer_states" <<< "$seen" || { echo "$seen"; fail "no category rows in the view"; }
wait "$JOB" || { cat job.log; fail "the job failed"; }
for _ in $(seq 100); do [ -f mon.rc ] && break; sleep 0.1; done
[ "$(cat mon.rc 2> /dev/null)" = "monitor exited 0" ] || { screen; fail "the monitor did not exit 0 when the job ended"; }
screen | grep -q "done (summary.json written)" || { screen; fail "the monitor's last view does not say the run is done"; }
screen | grep -qE "^step 3000/3000" || { screen; fail "the monitor's last view is not the last step"; }
# The job's report: each rank's peak by category and its memory over the step; the trace: a process per rank.
[ "$(grep -o '<g class="rank" data-rank="[01]"' job/report.html | wc -l)" -eq 2 ] || fail "report.html has no bar per rank"
[ "$(grep -o '<g class="rank-line" data-rank="[01]"' job/report.html | wc -l)" -eq 2 ] ||
    fail "report.html has no memory curve per rank"
for k in 0 1; do
    grep -q "\"name\":\"rank $k\"" job/trace.json || fail "trace.json has no process for rank $k"
done
echo "ok: memfit monitor showed both ranks of the running job and exited 0 at its end; the report shows both ranks"
