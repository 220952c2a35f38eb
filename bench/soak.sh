#!/usr/bin/env bash
# Soak: a training run of about MINUTES minutes interrupted by random SIGTERMs (a preemption: stop
# with a checkpoint) and SIGKILLs (no warning: the newest complete checkpoint is what is left),
# restarted each time with the same command line and --resume auto, against the same run left
# alone (beside it, one thread each). Prints the interruptions survived and whether the final
# state equals the uninterrupted run's bit for bit; exits non-zero when it does not.
#
# Usage: bash bench/soak.sh [MINUTES (30)] [INTERRUPTIONS (20)] [MEMFIT (build/memfit)]
set -uo pipefail
MINUTES=${1:-30}
WANT=${2:-20}
MEMFIT=$(realpath "${3:-build/memfit}")
SRC=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d "${TMPDIR:-/tmp}/memfit_soak.XXXXXX")
trap 'kill $(jobs -p) 2> /dev/null; rm -rf "$W"' EXIT
cd "$W"
export OMP_NUM_THREADS=1
"$MEMFIT" prepare --tokenizer bytes --input "$SRC/data/tinyshakespeare.txt" --out data > /dev/null
BASE=(train --model micro --data "$W/data" --sample 0 --eval-every 100 --eval-batches 2 --progress quiet --threads 1)

# Steps for MINUTES of training, from the time of a short run.
"$MEMFIT" "${BASE[@]}" --steps 20 --out probe > /dev/null
step_s=$(python3 -c "import json; s=json.load(open('probe/summary.json')); print(s['wall_s'] / 20)")
STEPS=$(python3 -c "print(max(100, int($MINUTES * 60 / $step_s)))")
EVERY=$(( STEPS / 60 > 1 ? STEPS / 60 : 1 ))
RUN=("${BASE[@]}" --steps "$STEPS" --checkpoint-every "$EVERY" --keep-checkpoints 2)
echo "soak: micro, $STEPS steps (~${MINUTES} min at $(printf '%.3f' "$step_s") s/step), a checkpoint every $EVERY steps"

"$MEMFIT" "${RUN[@]}" --out alone > alone.log 2>&1 &
alone=$!

# The interrupted run: started, killed at a random moment (TERM or KILL), restarted, until it ends.
mean=$(python3 -c "print(max(2.0, $MINUTES * 60 / ($WANT + 1)))")
term=0 killed=0 starts=0
while :; do
    starts=$((starts + 1))
    "$MEMFIT" "${RUN[@]}" --resume auto --out soak >> soak.log 2>&1 &
    pid=$!
    if [ $((term + killed)) -lt "$WANT" ]; then
        wait_s=$(python3 -c "import random; print(round(random.uniform(0.3, 1.7) * $mean, 2))")
        end=$(python3 -c "import time; print(time.time() + $wait_s)")
        while kill -0 $pid 2> /dev/null && python3 -c "import time,sys; sys.exit(time.time() >= $end)"; do sleep 0.2; done
    fi
    if kill -0 $pid 2> /dev/null && [ $((term + killed)) -lt "$WANT" ]; then
        if [ $((RANDOM % 2)) = 0 ]; then kill -TERM $pid; term=$((term + 1)); else kill -KILL $pid; killed=$((killed + 1)); fi
    fi
    { wait $pid; } 2> /dev/null   # no "Killed" line from the shell
    rc=$?
    done_steps=$(python3 -c "import json; print(json.load(open('soak/summary.json')).get('steps_done', 0))" 2> /dev/null || echo 0)
    if [ $rc -eq 0 ] && [ "$done_steps" = "$STEPS" ] && [ -d "soak/checkpoints/$(printf 'step-%06d' "$STEPS")" ]; then break; fi
    if [ $rc -ne 0 ] && [ $rc -ne 137 ] && [ $rc -ne 143 ]; then   # 143: a TERM before the handlers
        echo "soak: a run exited $rc:"; tail -5 soak.log; exit 1
    fi
done
wait $alone || { echo "soak: the uninterrupted run failed"; tail -5 alone.log; exit 1; }

final=$(printf 'step-%06d' "$STEPS")
if cmp -s "alone/checkpoints/$final/state.safetensors" "soak/checkpoints/$final/state.safetensors"; then
    equal=yes
else
    equal=no
fi
echo "soak: $((term + killed)) interruptions survived ($term SIGTERM, $killed SIGKILL) in $starts starts;" \
     "final state bit for bit equal to the uninterrupted run: $equal"
[ "$equal" = yes ]
