# Data-parallel flag errors: one clear line before any work.
# Usage: bash bad_flags.sh MEMFIT MPIEXEC SOURCE_DIR
source "$(dirname "$0")/common.sh"
cd "$WORK"
ARGS=(train --model nano --data "$WORK/data" --seq 32 --steps 2 --sample 0 --progress quiet --threads 1)
expect_error() {   # expect_error NEEDLE COMMAND...
    local needle=$1; shift
    if "$@" > out.log 2>&1; then cat out.log; fail "succeeded: $*"; fi
    grep -q -- "$needle" out.log || { cat out.log; fail "no '$needle' in the output of: $*"; }
    [ ! -e out ] || fail "wrote output before failing"
}
expect_error "memfit: error: --zero 4: expected 0" "$MEMFIT" "${ARGS[@]}" --zero 4 --out out
expect_error "memfit: error: --bucket-mb: must be a number from 0" "$MEMFIT" "${ARGS[@]}" --bucket-mb -1 --out out
expect_error "memfit: error: --batch 3 is not divisible by the 2 data-parallel ranks" mpi 2 "${ARGS[@]}" --batch 3 --out out
expect_error "memfit: error: --budget-file .* not supported with 2 ranks" \
    mpi 2 "${ARGS[@]}" --batch 2 --budget-file budget.txt --out out
# Ranks given different flags stop before the first collective, naming the flag (they hung or
# diverged before).
mpmd() {   # mpmd "RANK0 FLAGS" "RANK1 FLAGS"
    "$MPIEXEC" --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1 \
        -n 1 "$MEMFIT" "${ARGS[@]}" $1 --out out : -n 1 "$MEMFIT" "${ARGS[@]}" $2 --out out
}
expect_error "memfit: error: the ranks disagree on --checkpoint-every" mpmd "--checkpoint-every 1" "--checkpoint-every 2"
expect_error "memfit: error: the ranks disagree on --lr" mpmd "--lr 0.001" "--lr 0.002"
expect_error "memfit: error: the ranks disagree on --zero" mpmd "--zero 1" "--zero 2"
expect_error "memfit: error: the ranks disagree on --seed" mpmd "--seed 1" "--seed 2"
# The same --data path holding other token files on another node (here: another working folder).
mkdir -p a b
cp -r "$WORK/data" a/data
head -c 100000 "$SRC/data/tinyshakespeare.txt" > short.txt
"$MEMFIT" prepare --tokenizer bytes --input short.txt --out b/data > /dev/null
REL=(train --model nano --data data --seq 32 --steps 2 --sample 0 --progress quiet --threads 1 --out out)
expect_error "memfit: error: the ranks disagree on data/train.bin" \
    "$MPIEXEC" --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1 \
    -n 1 -wdir "$WORK/a" "$MEMFIT" "${REL[@]}" : -n 1 -wdir "$WORK/b" "$MEMFIT" "${REL[@]}"
[ ! -e a/out ] && [ ! -e b/out ] || fail "wrote output before failing on different data"
echo PASS
