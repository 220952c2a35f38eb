#!/usr/bin/env bash
# Regenerates the calibration tables of docs/plan.md from the tests that check them: each table
# sits between `<!-- table: TEST -->` and `<!-- /table -->`, and TEST (a gtest name in
# build/memfit_tests) prints it. Run after changing the time model or the catalog's efficiencies:
#   bash scripts/plan-tables.sh [build/memfit_tests]
# Exits non-zero when a test fails (its table is still written, so the change can be read).
set -euo pipefail
cd "$(dirname "$0")/.."
tests=${1:-build/memfit_tests}
[ -x "$tests" ] || { echo "plan-tables: $tests is not built (cmake --build build --target memfit_tests)" >&2; exit 2; }
doc=docs/plan.md
status=0
while read -r name; do
    out=$(mktemp)
    "$tests" --gtest_filter="$name" > "$out" 2>&1 || { status=1; echo "plan-tables: $name failed" >&2; }
    table=$(grep '^|' "$out" || true)
    rm -f "$out"
    [ -n "$table" ] || { echo "plan-tables: $name printed no table" >&2; exit 1; }
    TABLE="$table" python3 - "$doc" "$name" <<'PY'
import os, sys
path, name = sys.argv[1], sys.argv[2]
text = open(path).read()
start = f"<!-- table: {name} -->\n"
a = text.index(start) + len(start)
b = text.index("<!-- /table -->", a)
open(path + ".tmp", "w").write(text[:a] + os.environ["TABLE"] + "\n" + text[b:])
os.replace(path + ".tmp", path)
PY
    echo "plan-tables: $name -> $doc"
done < <(grep -o '<!-- table: [A-Za-z0-9_.]* -->' "$doc" | awk '{print $3}')
exit $status
