#!/usr/bin/env bash
# Tokenizer speed on the bundled corpus: GPT-2's BPE (data/gpt2-bpe) against a Hugging Face
# tokenizer.json (default: Qwen3's, tests/data/hf-tokenizers/qwen3). For each, `memfit tokenize`
# runs on an empty input (the load) and on the corpus repeated COPIES times, interleaved, RUNS
# times; encode time = median(corpus run) - median(empty run); tokens/s = tokens / encode time.
# Prints one line per tokenizer and the ratio. Usage: bash bench/tokenizer_speed.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MEMFIT=${MEMFIT:-build/memfit}
HF=${HF:-tests/data/hf-tokenizers/qwen3/tokenizer.json}
RUNS=${RUNS:-5}
COPIES=${COPIES:-4}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
for _ in $(seq "$COPIES"); do cat data/tinyshakespeare.txt; done > "$WORK/corpus.txt"
: > "$WORK/empty.txt"
seconds() {   # seconds for one run of: memfit tokenize --tokenizer $1 < $2 > $3
    local t0 t1
    t0=$(date +%s.%N)
    "$MEMFIT" tokenize --tokenizer "$1" < "$2" > "$3"
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }' 
}
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
declare -A RATE
for tok in gpt2 "$HF"; do
    : > "$WORK/load.t"; : > "$WORK/full.t"
    for _ in $(seq "$RUNS"); do
        seconds "$tok" "$WORK/empty.txt" /dev/null >> "$WORK/load.t"
        seconds "$tok" "$WORK/corpus.txt" "$WORK/ids.json" >> "$WORK/full.t"
    done
    n=$(tr ',' '\n' < "$WORK/ids.json" | grep -c '[0-9]')
    load=$(median < "$WORK/load.t"); full=$(median < "$WORK/full.t")
    bytes=$(stat -c %s "$WORK/corpus.txt")
    RATE[$tok]=$(awk -v n="$n" -v f="$full" -v l="$load" 'BEGIN { print n / (f - l) }')
    awk -v t="$tok" -v n="$n" -v b="$bytes" -v f="$full" -v l="$load" 'BEGIN {
        printf "%-50s %9d tokens of %d bytes: load %.3f s, encode %.3f s, %.0f tokens/s (%.2f MB/s)\n",
               t, n, b, l, f - l, n / (f - l), b / (f - l) / 1e6 }'
done
awk -v a="${RATE[$HF]}" -v b="${RATE[gpt2]}" 'BEGIN { printf "tokenizer.json / gpt2 tokens/s: %.2f\n", a / b }'
