# Shared by the data-parallel training tests: arguments, a scratch folder, a small prepared corpus.
# Usage (from CTest): bash TEST.sh MEMFIT MPIEXEC SOURCE_DIR [ZERO]
set -euo pipefail
MEMFIT=$(realpath "$1")
MPIEXEC=$2
SRC=$(realpath "$3")
ZERO=${4:-0}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/memfit_mpi_train.XXXXXX")
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1

fail() { echo "FAIL: $*" >&2; exit 1; }

# N ranks of memfit with the given arguments.
mpi() {
    local n=$1; shift
    "$MPIEXEC" --oversubscribe --allow-run-as-root --bind-to none -n "$n" -x OMP_NUM_THREADS=1 "$MEMFIT" "$@"
}

# The loss of every step logged in a metrics.jsonl, one "step loss" per line.
losses() {
    sed -E 's/.*"loss":([^,}]*).*"step":([0-9]+).*/\2 \1/' "$1"
}

# Max relative difference of the losses of steps both files logged.
loss_diff() {
    join <(losses "$1" | sort -k1,1) <(losses "$2" | sort -k1,1) |
        awk 'BEGIN { m = 0; n = 0 } { d = $2 - $3; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > m) m = r; n++ }
             END { if (n == 0) print "none"; else printf "%.3g\n", m }'
}

# "final loss X, validation loss Y" of a log's done: line.
final() {
    sed -nE 's/^done: .*(final loss [0-9.]+, validation loss [0-9.]+).*/\1/p' "$1"
}

# same_as REFERENCE_LOG LOG WHAT [REFERENCE_NAME]: the done: lines' losses agree to the printed
# 4 decimals (one unit in the last place allowed for fp32 rounding at a boundary), and every step
# both logged to a relative 1e-4.
same_as() {
    local a b
    a=$(final "$1"); b=$(final "$2")
    [ -n "$a" ] || { cat "$1"; fail "no done: line in $1"; }
    [ -n "$b" ] || { cat "$2"; fail "$3: no done: line"; }
    echo "$3: $b (${4:-one process}: $a)"
    paste <(echo "$a" | grep -oE '[0-9]+\.[0-9]+') <(echo "$b" | grep -oE '[0-9]+\.[0-9]+') |
        awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1.5e-4) exit 1 }' ||
        fail "$3: '$b' differs from the one-process run's '$a'"
    local d
    d=$(loss_diff "${1%.log}/metrics.jsonl" "${2%.log}/metrics.jsonl")
    awk -v d="$d" 'BEGIN { exit !(d != "none" && d < 1e-4) }' || fail "$3: step losses differ by $d"
}

head -c 120000 "$SRC/data/tinyshakespeare.txt" > "$WORK/text.txt"
"$MEMFIT" prepare --tokenizer bytes --input "$WORK/text.txt" --out "$WORK/data" > /dev/null

# exact_per_rank LOG N: rank 0 listed N ranks, each one's plan equal to its measurement in every category.
exact_per_rank() {
    local n
    n=$(grep -cE '^  rank [0-9]+.*: planned .*, measured .* \(equal\)$' "$1" || true)
    [ "$n" = "$2" ] || { cat "$1"; fail "$1: $n of $2 ranks' plans equal their measurements"; }
}
