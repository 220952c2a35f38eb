# Tensor and pipeline parallel training end to end: --tp 2, --pp 2 under GPipe, 1F1B and
# interleaved:2 (the 4-block micro model), and
# --tp 2 --pp 2 (also x 2 data-parallel ranks with ZeRO 1) end with the one-process run's final and
# validation losses; rank 0 prints one idle line per stage and summary.json names the layout; a
# --tp 2 --pp 2 checkpoint resumes on 1 process and on --pp 2; bad layouts fail with one clear error
# before any training.
# Usage: bash parallel3d.sh MEMFIT MPIEXEC SOURCE_DIR
source "$(dirname "$0")/common.sh"
cd "$WORK"
ARGS=(train --model nano --data "$WORK/data" --batch 4 --seq 32 --lr 1e-3 --warmup 2 --steps 6
      --eval-every 3 --eval-batches 2 --sample 0 --progress plain --log-every 1 --threads 1 --seed 1337)

# idle_lines LOG P: rank 0 alone printed the pipeline block, one idle line per stage 0..P-1.
idle_lines() {
    local s
    [ "$(grep -c '^pipeline idle per stage' "$1")" = 1 ] || { cat "$1"; fail "$1: not one 'pipeline idle per stage' header"; }
    [ "$(grep -cE '^  stage [0-9]+ \(rank [0-9]+\): idle [0-9.]+% of [0-9.]+ ms, [0-9]+ exchanges' "$1")" = "$2" ] ||
        { cat "$1"; fail "$1: not $2 stage idle lines"; }
    for s in $(seq 0 $(($2 - 1))); do
        grep -qE "^  stage $s \(rank" "$1" || { cat "$1"; fail "$1: no idle line for stage $s"; }
    done
    [ "$(grep -c '^memfit train: model nano' "$1")" = 1 ] || { cat "$1"; fail "$1: more than one rank printed"; }
}

# One-process references: 2 and 4 micro-batches accumulated.
"$MEMFIT" "${ARGS[@]}" --grad-accum 2 --out one2 > one2.log 2>&1 || { cat one2.log; fail "one process, --grad-accum 2"; }
"$MEMFIT" "${ARGS[@]}" --grad-accum 4 --out one4 > one4.log 2>&1 || { cat one4.log; fail "one process, --grad-accum 4"; }

# Tensor parallel over 2 ranks.
mpi 2 "${ARGS[@]}" --grad-accum 2 --tp 2 --out tp2 > tp2.log 2>&1 || { cat tp2.log; fail "-np 2 --tp 2"; }
grep -q '^  tensor parallel: 2 ranks per group' tp2.log || { cat tp2.log; fail "no tensor-parallel line"; }
same_as one2.log tp2.log "-np 2 --tp 2"

# Interleaved 1F1B: the 4-block micro model as 2 stages x 2 chunks, 4 micro-batches.
M=(train --model micro --data "$WORK/data" --batch 2 --seq 32 --lr 1e-3 --warmup 2 --steps 4
   --eval-every 2 --eval-batches 1 --sample 0 --progress plain --log-every 1 --threads 1 --seed 1337)
"$MEMFIT" "${M[@]}" --grad-accum 4 --out micro1 > micro1.log 2>&1 || { cat micro1.log; fail "micro one process"; }
mpi 2 "${M[@]}" --grad-accum 4 --pp 2 --schedule interleaved:2 --out inter > inter.log 2>&1 ||
    { cat inter.log; fail "-np 2 --pp 2 --schedule interleaved:2"; }
grep -q "^  pipeline parallel: 2 stages, blocks \[0, 1) \[1, 2) \[2, 3) \[3, 4) (virtual stage v on stage v mod 2), schedule interleaved:2" inter.log ||
    { cat inter.log; fail "no interleaved pipeline line"; }
same_as micro1.log inter.log "-np 2 --pp 2 --schedule interleaved:2 --grad-accum 4"

# Pipeline parallel over 2 stages, 4 micro-batches, both schedules.
for s in gpipe 1f1b; do
    mpi 2 "${ARGS[@]}" --grad-accum 4 --pp 2 --schedule $s --out pp2$s > pp2$s.log 2>&1 ||
        { cat pp2$s.log; fail "-np 2 --pp 2 --schedule $s"; }
    grep -q "^  pipeline parallel: 2 stages, .*schedule $s, 4 micro-batches" pp2$s.log ||
        { cat pp2$s.log; fail "no pipeline-parallel line for $s"; }
    grep -q 'ideal bubble (P-1)/(m+P-1) = 20.0% for P = 2, m = 4' pp2$s.log || { cat pp2$s.log; fail "no ideal bubble for $s"; }
    idle_lines pp2$s.log 2
    grep -qE '"pipeline_parallel": *2' pp2$s/summary.json || fail "$s: summary.json has no \"pipeline_parallel\": 2"
    same_as one4.log pp2$s.log "-np 2 --pp 2 --schedule $s --grad-accum 4"
done

# Both: 2 x 2 over 4 ranks, saving checkpoints at steps 3 and 6.
mpi 4 "${ARGS[@]}" --grad-accum 2 --tp 2 --pp 2 --checkpoint-every 3 --out tp2pp2 > tp2pp2.log 2>&1 ||
    { cat tp2pp2.log; fail "-np 4 --tp 2 --pp 2"; }
idle_lines tp2pp2.log 2
grep -qE '"pipeline_parallel": *2' tp2pp2/summary.json || fail "summary.json has no \"pipeline_parallel\": 2"
grep -qE '"tensor_parallel": *2' tp2pp2/summary.json || fail "summary.json has no \"tensor_parallel\": 2"
same_as one2.log tp2pp2.log "-np 4 --tp 2 --pp 2 --grad-accum 2"

# And x 2 data-parallel ranks with ZeRO 1 (8 ranks, oversubscribed).
mpi 8 "${ARGS[@]}" --grad-accum 2 --tp 2 --pp 2 --zero 1 --out d3 > d3.log 2>&1 ||
    { cat d3.log; fail "-np 8 --tp 2 --pp 2 --zero 1"; }
grep -q 'data parallel: 2 ranks (mpi), micro-batch 2 per rank, ZeRO stage 1' d3.log || { cat d3.log; fail "no data-parallel line"; }
same_as one2.log d3.log "-np 8 --tp 2 --pp 2 --zero 1 --grad-accum 2"

# The --tp 2 --pp 2 checkpoint holds the whole model, every rank a share: it resumes on one
# process and on --pp 2 alone, continuing from step 4 to the uninterrupted run's losses.
C3=tp2pp2/checkpoints/step-000003
for r in 0 1 2 3; do
    [ -s $C3/state-rank-0000$r-of-00004.safetensors ] || { ls -la $C3; fail "no shard file of rank $r"; }
done
resumed() {   # resumed LOG WHAT: the resumed run's first logged step is 4 and its losses match
    local first
    first=$(losses "${1%.log}/metrics.jsonl" | head -1 | cut -d' ' -f1)
    [ "$first" = 4 ] || { cat "$1"; fail "$2: first logged step is '$first', not 4 (did it resume?)"; }
    same_as tp2pp2.log "$1" "$2" "uninterrupted"
}
"$MEMFIT" "${ARGS[@]}" --grad-accum 2 --resume $C3 --out solo > solo.log 2>&1 ||
    { cat solo.log; fail "resume the --tp 2 --pp 2 checkpoint on 1 process"; }
resumed solo.log "--tp 2 --pp 2 step 3 resumed on 1 process"
mpi 2 "${ARGS[@]}" --grad-accum 2 --pp 2 --resume $C3 --out re_pp2 > re_pp2.log 2>&1 ||
    { cat re_pp2.log; fail "resume the --tp 2 --pp 2 checkpoint on -np 2 --pp 2"; }
resumed re_pp2.log "--tp 2 --pp 2 step 3 resumed on -np 2 --pp 2"

# Bad layouts: non-zero exit, the error line, no output folder, no training step.
B=(train --model nano --data "$WORK/data" --seq 32 --steps 2 --sample 0 --progress plain --threads 1)
expect_error() {   # expect_error NEEDLE COMMAND...
    local needle=$1; shift
    rm -rf out
    if "$@" > out.log 2>&1; then cat out.log; fail "succeeded: $*"; fi
    grep -q -- "$needle" out.log || { cat out.log; fail "no '$needle' in the output of: $*"; }
    ! grep -qE '^step [0-9]+/' out.log || { cat out.log; fail "trained before failing: $*"; }
    [ ! -e out ] || fail "wrote output before failing: $*"
}
expect_error "memfit: error: 2 ranks cannot be laid out as --tp 3 x --pp 1: the world size must be a multiple of tp x pp = 3" \
    mpi 2 "${B[@]}" --tp 3 --out out
expect_error "memfit: error: --pp 3: the model has 2 blocks; every stage needs at least one" \
    mpi 3 "${B[@]}" --batch 3 --pp 3 --out out
expect_error "memfit: error: --pp 2 with --schedule interleaved:2 needs 4 chunks of blocks, the model has 2 blocks" \
    mpi 2 "${B[@]}" --pp 2 --schedule interleaved:2 --out out
expect_error "memfit: error: --schedule interleaved:2 sends micro-batches through the stages 2 at a time: --grad-accum 3" \
    mpi 2 "${M[@]}" --pp 2 --schedule interleaved:2 --grad-accum 3 --out out
expect_error "memfit: error: --schedule 'foo': expected gpipe, 1f1b or interleaved:V" mpi 2 "${B[@]}" --pp 2 --schedule foo --out out
expect_error "memfit: error: --packing with --tp 2: model 'nano' learns absolute positions" \
    mpi 2 "${B[@]}" --tp 2 --packing --out out
expect_error "memfit: error: --fit auto .*with --tp or --pp set them yourself" mpi 2 "${B[@]}" --tp 2 --fit auto --out out
expect_error "memfit: error: 1 rank cannot be laid out as --tp 1 x --pp 2" "$MEMFIT" "${B[@]}" --pp 2 --out out
echo PASS
