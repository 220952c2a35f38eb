#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, with AddressSanitizer and UBSan), one per reader of
# untrusted files, and runs each for SECONDS (default 30) over its corpus in fuzz/corpus/<target>/:
# the seeds plus every crasher found and fixed, kept as regression inputs. New findings are
# written to build-fuzz/.
#   fuzz_safetensors        safetensors headers and tensors (model/safetensors.h)
#   fuzz_config             a model's config.json (model/config.h)
#   fuzz_json               core/json_read.h, the one parser of untrusted JSON
#   fuzz_tokenizer          tokenizer.json, then an encode and decode (tokenizer/hf_tokenizer.h)
#   fuzz_tokenizer_config   tokenizer_config.json and its chat template (tokenizer/tokenizer_config.h)
#   fuzz_chat_template      a Jinja chat template, rendered with a fixed conversation (chat_template.h)
#   fuzz_jsonl              instruction records, one per line, as prepare encodes them (data/instruct.h)
#   fuzz_meta               a checkpoint's meta.json, as --resume checks it (train/checkpoint.h)
#   bash scripts/fuzz.sh 600     # the 10-minute local run
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-30}
OUT=build-fuzz
mkdir -p "$OUT"
CXX=${FUZZ_CXX:-clang++}
# FUZZ_OPT: the optimisation level (default -O1; scripts/test.sh's short CI run takes -O0, which
# compiles in 65% of the time), each level's objects in their own folder.
OPT=${FUZZ_OPT:--O1}
FLAGS="-std=c++20 $OPT -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Isrc \
  -DMEMFIT_SOURCE_DIR=\"$PWD\" $(pkg-config --cflags mpi) -DOMPI_SKIP_MPICXX=1 -DMPICH_SKIP_MPICXX=1"
COMMON="src/core/error.cpp src/core/units.cpp src/core/json_read.cpp"
TOKENIZER="src/tokenizer/bpe.cpp src/tokenizer/hf_tokenizer.cpp src/tokenizer/tokenizer_config.cpp src/tokenizer/unicode_norm.cpp src/core/paths.cpp"
JINJA="src/tokenizer/chat_template.cpp src/tokenizer/jinja_eval.cpp src/tokenizer/jinja_filters.cpp src/tokenizer/jinja_lex.cpp src/tokenizer/jinja_methods.cpp src/tokenizer/jinja_parse.cpp src/tokenizer/jinja_value.cpp"
CHECKPOINT="src/train/checkpoint.cpp src/model/safetensors.cpp src/core/atomic_file.cpp src/core/file_digest.cpp src/comm/communicator.cpp src/comm/mpi_communicator.cpp src/backend/collectives.cpp"   # checkpoint.cpp needs comm/
# name: the sources it links beside fuzz/NAME.cpp and COMMON, then its libraries.
TARGETS=(
  "safetensors|src/model/safetensors.cpp src/core/atomic_file.cpp|"
  "config|src/model/config.cpp src/model/llama_types.cpp src/model/moe_config.cpp src/core/paths.cpp|"
  "json||"
  "tokenizer|$TOKENIZER|-lpcre2-8 -licuuc"
  "tokenizer_config|src/tokenizer/tokenizer_config.cpp src/core/paths.cpp $JINJA|-licuuc"
  "chat_template|$JINJA|-licuuc"
  "jsonl|src/data/instruct.cpp src/tokenizer/tokenizer.cpp src/tokenizer/sentencepiece.cpp $TOKENIZER $JINJA|-lpcre2-8 -licuuc -lsentencepiece"
  "meta|$CHECKPOINT|$(pkg-config --libs mpi)"
)
obj() { echo "$OUT/obj$OPT/${1//\//_}.o"; }
# Each library source is compiled once (stale when it, or any header, changed), nproc at a time;
# then each target links its objects.
compile() {
  local o
  o=$(obj "$1")
  if [ ! -f "$o" ] || [ "$1" -nt "$o" ] || [ -n "$(find src fuzz -name '*.h' -newer "$o" -print -quit)" ]; then
    # shellcheck disable=SC2086
    $CXX $FLAGS -c "$1" -o "$o"
  fi
}
export -f compile obj
export CXX FLAGS OUT OPT
mkdir -p "$OUT/obj$OPT"
for t in "${TARGETS[@]}"; do IFS='|' read -r _ srcs _ <<< "$t"; printf '%s\n' $srcs; done |
  cat - <(printf '%s\n' $COMMON) | sort -u | xargs -P "$(nproc)" -I{} bash -c 'compile "$@"' _ {}
for t in "${TARGETS[@]}"; do
  IFS='|' read -r name srcs libs <<< "$t"
  objs=$(for f in $srcs $COMMON; do obj "$f"; done)
  bin=$OUT/fuzz_$name$OPT
  # shellcheck disable=SC2086
  if [ ! -x "$bin" ] || [ -n "$(find fuzz/fuzz_$name.cpp fuzz/*.h $objs -newer "$bin" -print -quit)" ]; then
    $CXX $FLAGS "fuzz/fuzz_$name.cpp" $objs $libs -lfmt -o "$bin"
  fi
done
# target:timeout (s). fuzz_chat_template renders with budgets that end any render within 5 s.
for t in safetensors:10 config:10 json:10 tokenizer:10 tokenizer_config:10 chat_template:20 jsonl:10 meta:10; do
  timeout=${t#*:} t=${t%%:*}
  mkdir -p "$OUT/corpus_$t"
  echo "fuzz_$t: ${SECONDS_EACH}s"
  "$OUT/fuzz_$t$OPT" -max_total_time="$SECONDS_EACH" -max_len=4096 -timeout="$timeout" -report_slow_units="$timeout" \
    -rss_limit_mb=2048 -artifact_prefix="$OUT/crash_$t-" -print_final_stats=1 "$OUT/corpus_$t" "fuzz/corpus/$t" 2>&1 |
    grep -E "^#[0-9]+ +DONE|stat::number_of_executed_units|ERROR|SUMMARY" || true
  if ls "$OUT"/crash_"$t"-* >/dev/null 2>&1; then
    echo "fuzz_$t: crashing inputs in $OUT/ (copy them into fuzz/corpus/$t once fixed)" >&2
    exit 1
  fi
done
