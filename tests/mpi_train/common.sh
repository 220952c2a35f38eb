# Shared by the data-parallel training tests: arguments, a scratch folder, a small prepared corpus.
# Usage (from CTest): bash TEST.sh MEMFIT MPIEXEC SOURCE_DIR [ZERO]
set -euo pipefail
MEMFIT=$(realpath "$1")
MPIEXEC=$2
SRC=$(realpath "$3")
ZERO=${4:-0}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/memfit_mpi_train.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
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

head -c 120000 "$SRC/data/tinyshakespeare.txt" > "$WORK/text.txt"
"$MEMFIT" prepare --tokenizer bytes --input "$WORK/text.txt" --out "$WORK/data" > /dev/null
