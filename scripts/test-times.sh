#!/usr/bin/env bash
# The slowest tests of the last CTest run in BUILD (default build/), to find what to move to
# bench/ or shrink: the N slowest (default 15) with their seconds, then the count and the sum.
# scripts/test.sh prints it after the suite.   usage: bash scripts/test-times.sh [BUILD] [N]
set -euo pipefail
cd "$(dirname "$0")/.."
LOG="${1:-build}/Testing/Temporary/LastTest.log"
N="${2:-15}"
[ -f "$LOG" ] || { echo "test-times: no $LOG (run ctest first)" >&2; exit 1; }
awk -v n="$N" '
    /^[0-9]+\/[0-9]+ Test: / { name = $3 }
    /^Test time = / { t[name] = $4; sum += $4; count++ }
    END {
        printf "the %d slowest of %d tests (%.0f s of test time in all; with -j 2 the wall time is less):\n", n, count, sum
        for (k in t) print t[k], k | "sort -rn | head -n " n " | awk '\''{ printf \"  %8.1f s  %s\\n\", $1, $2 }'\''"
    }' "$LOG"
