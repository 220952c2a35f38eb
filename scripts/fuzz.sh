#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, with AddressSanitizer and UBSan: safetensors headers, model
# config.json, and the one reader of untrusted JSON, core/json_read.h) and runs each for
# SECONDS (default 30) over its corpus in fuzz/corpus/<target>/: the seeds plus every crasher
# found and fixed, kept as regression inputs. New findings are written to build-fuzz/.
#   bash scripts/fuzz.sh 600     # the 10-minute local run
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-30}
OUT=build-fuzz
mkdir -p "$OUT"
CXX=${FUZZ_CXX:-clang++}
FLAGS="-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Isrc -DMEMFIT_SOURCE_DIR=\"$PWD\""
SRC_COMMON="src/core/error.cpp src/core/units.cpp src/core/json_read.cpp"
build() {   # name sources...
  local name=$1; shift
  if [ ! -x "$OUT/$name" ] || [ -n "$(find fuzz "$@" -newer "$OUT/$name" -print -quit)" ]; then
    # shellcheck disable=SC2086
    $CXX $FLAGS "fuzz/$name.cpp" "$@" $SRC_COMMON -lfmt -o "$OUT/$name"
  fi
}
build fuzz_safetensors src/model/safetensors.cpp src/core/atomic_file.cpp
build fuzz_config src/model/config.cpp src/core/paths.cpp
build fuzz_json
for t in safetensors config json; do
  mkdir -p "$OUT/corpus_$t"
  echo "fuzz_$t: ${SECONDS_EACH}s"
  "$OUT/fuzz_$t" -max_total_time="$SECONDS_EACH" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$OUT/crash_$t-" -print_final_stats=1 "$OUT/corpus_$t" "fuzz/corpus/$t" 2>&1 |
    grep -E "^#[0-9]+ +DONE|stat::number_of_executed_units|ERROR|SUMMARY" || true
  if ls "$OUT"/crash_"$t"-* >/dev/null 2>&1; then
    echo "fuzz_$t: crashing inputs in $OUT/ (copy them into fuzz/corpus/$t once fixed)" >&2
    exit 1
  fi
done
