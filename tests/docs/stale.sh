#!/usr/bin/env bash
# scripts/check-docs.sh catches a stale page: README.md passes as written, and fails once a quoted
# output line, a figure or a flag in it no longer matches the program.
#   tests/docs/stale.sh MEMFIT_BINARY
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
MEMFIT="$1"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
check() { bash "$ROOT/scripts/check-docs.sh" --memfit "$MEMFIT" "$T/README.md" >"$T/log" 2>&1; }
expect_fail() {   # what the change is; the log must name the failure
  if check; then echo "stale.sh: check-docs passed after $1" >&2; cat "$T/log" >&2; exit 1; fi
  grep -q "check-docs: FAIL" "$T/log" || { echo "stale.sh: no FAIL line after $1" >&2; cat "$T/log" >&2; exit 1; }
}
cp "$ROOT/README.md" "$T/README.md"
check || { echo "stale.sh: README.md as written fails" >&2; cat "$T/log" >&2; exit 1; }
# A figure inside an output block (the first plan's best row's bytes).
grep -q '^  1   8 x 1 x 1        3 .* exact$' "$T/README.md" || { echo "stale.sh: the README's first plan row moved; update this test" >&2; exit 1; }
sed -i -E '0,/^  1   8 x 1 x 1        3 /s/([0-9]+)\.([0-9]+) GiB/\1.9\2 GiB/' "$T/README.md"
expect_fail "a plan figure changed"
# A flag renamed in a block that only lists commands.
cp "$ROOT/README.md" "$T/README.md"
sed -i 's/--lora-rank 16 --base-weights nf4 --packing/--lora-r 16 --base-weights nf4 --packing/' "$T/README.md"
expect_fail "a flag renamed"
grep -q "has no flag --lora-r" "$T/log" || { echo "stale.sh: the renamed flag is not named" >&2; cat "$T/log" >&2; exit 1; }
# A quoted figure in prose.
cp "$ROOT/README.md" "$T/README.md"
printf '\n<!-- check: quotes "fewest devices that fit: 9 x a100-80g" in: memfit plan --model llama3-70b --hardware a100-80g --seq 4096 --global-batch 512 --min-gpus --top 1 -->\n' >>"$T/README.md"
expect_fail "a quoted figure changed"
# A runnable block that stops working.
cp "$ROOT/README.md" "$T/README.md"
# shellcheck disable=SC2016  # the backticks are markdown
printf '\n<!-- check: run -->\n```sh\nmemfit train --model no-such-preset --steps 1\n```\n' >>"$T/README.md"
expect_fail "a command that fails"
echo "stale.sh: check-docs failed on each of 4 stale changes and passed on README.md as written"
