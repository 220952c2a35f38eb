#!/usr/bin/env bash
# An adversarial pass over the memfit command: bad and odd flags, config files, checkpoints and
# model folders, misuse of every command, kills and concurrent runs, on tiny models. Every
# trial must end in a clean result: exit 0, or a non-zero exit below 128 with exactly one line on
# stderr saying "memfit: error:" (warnings allowed before it). A trial that must be refused
# ("error") and exits 0 counts as accepted. Prints the counts per section and every trial that
# did not hold; exits non-zero when one did not.
#
# Usage: bash scripts/adversarial.sh [MEMFIT] [SECTION...]   (default: build/memfit, all sections)
# Sections: flags config checkpoints commands kills hostile (scripts/adversarial_hostile.sh: files
# from strangers).   About 15 minutes on 2 cores; python3 writes the mangled JSON files.
set -uo pipefail
MEMFIT=$(realpath "${1:-build/memfit}")
shift || true
SECTIONS=${*:-flags config checkpoints commands kills hostile}
SRC=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d "${TMPDIR:-/tmp}/memfit_adversarial.XXXXXX")
trap 'rm -rf "$W"' EXIT
cd "$W"
export OMP_NUM_THREADS=1
LIMIT=${LIMIT:-60}   # seconds a trial may take

declare -A HELD TOTAL RAN   # RAN: trials of "any" that ran (exit 0) rather than being refused
BAD=()
n=0
# try SECTION EXPECT(ok|error|any) COMMAND...: runs it, classifies the outcome.
try() {
    local section=$1 expect=$2; shift 2
    n=$((n + 1))
    timeout -s KILL "$LIMIT" "$@" > "out.$n" 2> "err.$n" < /dev/null
    local rc=$? verdict=held
    local errors
    errors=$(grep -c . "err.$n" | tr -d ' ')
    local warn
    warn=$(grep -c "warning\|^memfit: note: " "err.$n" | tr -d ' ')
    if [ $rc -eq 137 ]; then verdict="hang (killed after ${LIMIT}s)"
    elif [ $rc -ge 128 ]; then verdict="crash (exit $rc)"
    elif grep -q "terminate called\|Assertion\|what():" "err.$n"; then verdict="raw exception"
    elif [ $rc -ne 0 ]; then
        if [ "$expect" = ok ]; then verdict="failed (exit $rc)"
        elif ! grep -q "^memfit: error: \|^memfit [a-z]*: error: \|^generate: \|^memfit: rank .* is exiting" "err.$n"; then
            verdict="no error line"
        elif [ $((errors - warn)) -ne 1 ]; then verdict="$((errors - warn)) error lines"
        fi
    elif [ "$expect" = error ]; then verdict="accepted"
    elif [ "$expect" = any ]; then RAN[$section]=$((${RAN[$section]:-0} + 1))
    fi
    TOTAL[$section]=$((${TOTAL[$section]:-0} + 1))
    if [ "$verdict" = held ]; then
        HELD[$section]=$((${HELD[$section]:-0} + 1))
    else
        BAD+=("[$section] $verdict: $* :: $(head -c 300 "err.$n" | tr '\n' ' ')")
    fi
    rm -f "out.$n" "err.$n"
}

# --- the fixtures: a corpus, a run with checkpoints, its export, a LoRA run on it ---
head -c 60000 "$SRC/data/tinyshakespeare.txt" > text.txt
"$MEMFIT" prepare --tokenizer bytes --input text.txt --out data > /dev/null
# TA: a run without --model and --steps (a flag may be given once); T: with them.
TA=(train --data "$W/data" --seq 32 --micro-batch 2 --sample 0 --eval-every 0 --eval-batches 1 --progress quiet
    --threads 1)
T=("${TA[@]}" --model nano --steps 2)
"$MEMFIT" "${TA[@]}" --model nano --steps 4 --checkpoint-every 2 --out base > /dev/null
"$MEMFIT" export base/checkpoints --out model > /dev/null
"$MEMFIT" "${TA[@]}" --model "$W/model" --steps 4 --lora-rank 4 --checkpoint-every 2 --out lora > /dev/null
[ -f lora/checkpoints/step-000004/meta.json ] || { echo "the fixtures failed" >&2; exit 1; }
out() { mktemp -u "$W/o.XXXXXXXX"; }   # a fresh --out per trial

section_flags() {
    # Every numeric flag of train with values no run should take, and edges a run may take or
    # refuse (but never crash on, hang on, or answer with a raw error).
    local f v
    for f in --seq --micro-batch --grad-accum --global-batch --batch --lora-rank --lora-alpha --lora-dropout \
             --zero --tp --pp --loss-chunk --loss-scale --initial-loss-scale --loss-scale-window \
             --min-loss-scale --clip --seed --threads --bucket-mb --steps --lr --warmup --min-lr-ratio \
             --weight-decay --adam-beta1 --adam-beta2 --adam-epsilon --eval-every --eval-batches --log-every \
             --sample --checkpoint-every --keep-checkpoints; do
        local cmd=("$MEMFIT" "${TA[@]}" --model nano)
        [ "$f" = --steps ] || cmd+=(--steps 2)
        for v in nan inf -inf abc "" 1e400 -1 -2147483649 "1 2"; do try flags error "${cmd[@]}" "$f" "$v" --out "$(out)"; done
        for v in 0 1e30 2147483648 99999999999999999999 0.5 1e-45 3 0x10; do try flags any "${cmd[@]}" "$f" "$v" --out "$(out)"; done
    done
    for f in --model --precision --attention --recompute --optimizer --lora-targets --base-weights --schedule \
             --offload --device --memory-budget --fit --data --tokenizer --lr-scheduler --progress; do
        local cmd=("$MEMFIT" "${TA[@]}" --steps 2)
        [ "$f" = --model ] || cmd+=(--model nano)
        for v in nope "../../../etc/passwd" "$(printf 'x%.0s' {1..5000})" "a b" -1; do
            try flags error "${cmd[@]}" "$f" "$v" --out "$(out)"
        done
        try flags any "${cmd[@]}" "$f" "" --out "$(out)"   # "" is the default of some
    done
    for v in 0 0B 1 1B 1KiB 1.5GiB 1e30GiB 18446744073709551616 -1GiB 1TiB "" GiB; do
        try flags any "$MEMFIT" "${T[@]}" --memory-budget "$v" --out "$(out)"
    done
    # Flags that do not combine, and batch arithmetic that does not add up.
    try flags error "$MEMFIT" "${T[@]}" --micro-batch 2 --grad-accum 2 --global-batch 5 --out "$(out)"
    try flags error "$MEMFIT" "${T[@]}" --global-batch 3 --micro-batch 2 --out "$(out)"
    try flags error "$MEMFIT" "${T[@]}" --batch 2 --micro-batch 4 --out "$(out)"
    try flags error "$MEMFIT" "${T[@]}" --precision auto --out "$(out)"
    try flags ok "$MEMFIT" "${T[@]}" --optimizer sgd --out "$(out)"   # SGD with momentum trains (issue 24)
    try flags error "$MEMFIT" "${T[@]}" --offload optimizer --out "$(out)"
    try flags error "$MEMFIT" "${T[@]}" --lora-rank 4 --base-weights bf16 --precision fp16 --out "$(out)"
    try flags error "$MEMFIT" "${T[@]}" --sp --out "$(out)"
    try flags error "$MEMFIT" "${T[@]}" --tp 2 --out "$(out)"
    try flags error "$MEMFIT" "${T[@]}" --schedule interleaved:0 --out "$(out)"
    try flags error "$MEMFIT" "${TA[@]}" --model nano --check-leaks --steps 3 --out "$(out)"
    try flags error "$MEMFIT" "${T[@]}" --resume "$W/nope" --out "$(out)"
    try flags error "$MEMFIT" "${T[@]}" --out /proc/self/nope
    try flags error "$MEMFIT" "${T[@]}" --out "$W/text.txt"
    try flags any "$MEMFIT" "${T[@]}" --budget-file "$W/nope/budget" --out "$(out)"   # may be written later
    try flags any "$MEMFIT" "${T[@]}" --fit auto --memory-budget 64MiB --out "$(out)"
    try flags error "$MEMFIT" "${T[@]}" --fit auto --memory-budget 1KiB --out "$(out)"
    try flags any "$MEMFIT" "${T[@]}" --precision fp16 --loss-scale 1e38 --out "$(out)"
    try flags any "$MEMFIT" "${TA[@]}" --model nano --lr 1e30 --steps 4 --out "$(out)"
    try flags error "$MEMFIT" "${TA[@]}" --steps 2 --lora-rank 4 --lora-alpha 1e30 --model "$W/model" --out "$(out)"
    try flags error "$MEMFIT" train --nope
    try flags error "$MEMFIT" nope
    try flags error "$MEMFIT" "${T[@]}" extra positional --out "$(out)"
}

section_config() {
    # memfit's keys, DeepSpeed's keys and a summary's run_config, each mangled key by key.
    printf '{"model": "nano", "micro-batch": 2, "seq": 32, "steps": 2, "lr": 0.001, "precision": "fp32"}' > good.json
    printf '%s' '{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 1, "total_num_steps": 2}},
        "gradient_clipping": 1.0, "zero_optimization": {"stage": 1}, "bf16": {"enabled": false}}' > ds.json
    local C=(train --data "$W/data" --sample 0 --eval-every 0 --progress quiet --threads 1 --steps 2)
    try config ok "$MEMFIT" "${C[@]}" --config good.json --out "$(out)"
    try config ok "$MEMFIT" "${C[@]}" --model nano --seq 32 --config ds.json --out "$(out)"
    try config ok "$MEMFIT" "${C[@]}" --config base/summary.json --out "$(out)"
    local src i variant
    for src in good.json ds.json base/summary.json; do
        i=0
        while IFS= read -r variant; do
            i=$((i + 1))
            printf '%s' "$variant" > "mangled.$i.json"
            try config any "$MEMFIT" "${C[@]}" --model nano --seq 32 --config "mangled.$i.json" --out "$(out)"
        done < <(python3 - "$src" <<'PY'
import json, sys
base = json.load(open(sys.argv[1]))
def paths(j, p=()):
    if isinstance(j, dict):
        for k, v in j.items():
            yield p + (k,)
            yield from paths(v, p + (k,))
def put(j, p, v):
    j = json.loads(json.dumps(j))
    cur = j
    for k in p[:-1]:
        cur = cur[k]
    if v is KeyError: del cur[p[-1]]
    else: cur[p[-1]] = v
    return j
for p in paths(base):
    for v in (KeyError, None, "x", -1, 1e300, [], {}, True, 2**64):
        print(json.dumps(put(base, p, v)))
PY
)
    done
    for bad in '' '[]' '{' 'null' '{"model": "nano", "model": "micro"}' '{"nope": 1}' '{"micro-batch": "x"}' \
               '{"config": "good.json"}' '{"zero_optimization": {"stage": 1, "stage": 2}}' \
               "$(head -c 3000 /dev/urandom | base64 -w0)"; do
        printf '%s' "$bad" > odd.json
        try config error "$MEMFIT" "${C[@]}" --config odd.json --out "$(out)"
    done
    try config error "$MEMFIT" "${C[@]}" --config "$W/nope.json" --out "$(out)"
    try config error "$MEMFIT" "${C[@]}" --config "$W" --out "$(out)"
    try config error "$MEMFIT" "${C[@]}" --config /dev/zero --out "$(out)"
    try config any "$MEMFIT" plan --config ds.json --model nano --hardware h100-80g
    try config any "$MEMFIT" plan --config good.json --hardware h100-80g
}

section_checkpoints() {
    # A copy of a checkpoint with one thing changed, resumed and exported.
    local R=("${TA[@]}" --model nano --steps 6 --checkpoint-every 2)
    local meta=base/checkpoints/step-000004/meta.json field v i=0
    while IFS= read -r variant; do
        i=$((i + 1))
        rm -rf ck && mkdir -p ck && cp -r base/checkpoints/step-000004 ck/
        printf '%s' "$variant" > ck/step-000004/meta.json
        try checkpoints any "$MEMFIT" "${R[@]}" --resume ck --out "$(out)"
        try checkpoints any "$MEMFIT" export ck --out "$(out)"
    done < <(python3 - "$meta" <<'PY'
import json, sys
base = json.load(open(sys.argv[1]))
def paths(j, p=()):
    if isinstance(j, dict):
        for k, v in j.items():
            yield p + (k,)
            if k != "model": yield from paths(v, p + (k,))
def put(j, p, v):
    j = json.loads(json.dumps(j))
    cur = j
    for k in p[:-1]: cur = cur[k]
    if v is KeyError: del cur[p[-1]]
    else: cur[p[-1]] = v
    return j
for p in paths(base):
    for v in (KeyError, None, "x", -1, 2**31, 1e300, [], {}):
        print(json.dumps(put(base, p, v)))
PY
)
    local size cut
    size=$(stat -c %s base/checkpoints/step-000004/state.safetensors)
    for cut in 0 1 8 9 100 $((size / 2)) $((size - 1)); do
        rm -rf ck && mkdir -p ck && cp -r base/checkpoints/step-000004 ck/
        truncate -s "$cut" ck/step-000004/state.safetensors
        try checkpoints error "$MEMFIT" "${R[@]}" --resume ck --out "$(out)"
        try checkpoints error "$MEMFIT" export ck --out "$(out)"
    done
    for at in 0 4 8 20 60 $((size - 4)) $((size / 2)); do
        rm -rf ck && mkdir -p ck && cp -r base/checkpoints/step-000004 ck/
        printf '\xff\xff\xff\xff' | dd of=ck/step-000004/state.safetensors bs=1 seek="$at" conv=notrunc 2> /dev/null
        try checkpoints error "$MEMFIT" "${R[@]}" --resume ck --out "$(out)"
        try checkpoints error "$MEMFIT" export ck --out "$(out)"
    done
    # Files missing, swapped, or the folder a file; the LoRA checkpoint's record.
    rm -rf ck && mkdir -p ck && cp -r base/checkpoints/step-000004 ck/ && rm ck/step-000004/meta.json
    try checkpoints error "$MEMFIT" "${R[@]}" --resume ck --out "$(out)"
    rm -rf ck && mkdir -p ck && cp -r base/checkpoints/step-000004 ck/ && rm ck/step-000004/state.safetensors
    try checkpoints error "$MEMFIT" "${R[@]}" --resume ck --out "$(out)"
    rm -rf ck && mkdir -p ck && cp -r base/checkpoints/step-000004 ck/ &&
        cp base/checkpoints/step-000002/state.safetensors ck/step-000004/
    try checkpoints error "$MEMFIT" "${R[@]}" --resume ck --out "$(out)"
    try checkpoints error "$MEMFIT" "${R[@]}" --resume "$W/text.txt" --out "$(out)"
    try checkpoints error "$MEMFIT" export lora/checkpoints --out "$(out)"
    try checkpoints ok "$MEMFIT" export lora/checkpoints --merge-lora --out "$(out)"
    try checkpoints ok "$MEMFIT" export lora/checkpoints --adapter-only --out "$(out)"
    try checkpoints error "$MEMFIT" export lora/checkpoints --merge-lora --base-model "$W/data" --out "$(out)"
    try checkpoints error "$MEMFIT" export base/checkpoints --merge-lora --out "$(out)"
    try checkpoints error "$MEMFIT" "${TA[@]}" --model nano --steps 6 --resume lora/checkpoints --out "$(out)"
    try checkpoints error "$MEMFIT" "${TA[@]}" --steps 6 --lora-rank 8 --model "$W/model" --resume lora/checkpoints \
        --out "$(out)"
    try checkpoints error "$MEMFIT" "${TA[@]}" --model nano --steps 3 --resume base/checkpoints --out "$(out)"
    try checkpoints error "$MEMFIT" train --data "$W/data" --seq 64 --model nano --steps 6 --resume base/checkpoints \
        --progress quiet --out "$(out)"
    try checkpoints ok "$MEMFIT" "${TA[@]}" --steps 6 --model "$W/model" --resume base/checkpoints --out "$(out)"
    # A model folder with something wrong in it.
    local f
    for f in config.json model.safetensors; do
        rm -rf m2 && cp -r model m2 && printf '{' > "m2/$f"
        try checkpoints error "$MEMFIT" "${TA[@]}" --steps 2 --model "$W/m2" --out "$(out)"
        try checkpoints error "$MEMFIT" generate --model "$W/m2" --prompt hi --max-new-tokens 2
        rm -rf m2 && cp -r model m2 && rm "m2/$f"
        # Without weights, a folder's config.json is an architecture to train from scratch.
        try checkpoints "$([ $f = config.json ] && echo error || echo ok)" "$MEMFIT" "${TA[@]}" --steps 2 \
            --model "$W/m2/" --out "$(out)"
    done
    rm -rf m2 && cp -r model m2
    python3 - m2/model.safetensors <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
n = struct.unpack('<Q', b[:8])[0]
b[8 + n + 40: 8 + n + 44] = struct.pack('<f', float('inf'))
open(sys.argv[1], 'wb').write(b)
PY
    try checkpoints error "$MEMFIT" "${TA[@]}" --steps 2 --model "$W/m2" --out "$(out)"
    try checkpoints error "$MEMFIT" generate --model "$W/m2" --prompt hi --max-new-tokens 2
    try checkpoints error "$MEMFIT" export lora/checkpoints --merge-lora --base-model "$W/m2" --out "$(out)"
}

section_commands() {
    local G=(generate --model "$W/model" --prompt "ROMEO:")
    try commands ok "$MEMFIT" "${G[@]}" --max-new-tokens 8
    for a in "--max-new-tokens -1" "--max-new-tokens 1e9x" "--temperature -1" "--temperature nan" "--top-k -1" \
             "--top-p 2" "--top-p nan" "--seq -1" "--weights fp8" "--threads -1" "--seed -1"; do
        try commands error "$MEMFIT" "${G[@]}" $a
    done
    for a in "--max-new-tokens 0" "--seq 1" "--seq 100000" "--weights int8" "--weights nf4" "--weights bf16" \
             "--top-k 100000" "--temperature 1e30" "--temperature 1e-30"; do
        try commands any "$MEMFIT" "${G[@]}" $a
    done
    try commands any "$MEMFIT" generate --model "$W/model" --prompt "$(head -c 20000 text.txt)" --max-new-tokens 2
    try commands error "$MEMFIT" generate --model "$W/data" --prompt hi
    try commands error "$MEMFIT" generate --model "$W/model" --prompt hi --tokenizer nope
    try commands error "$MEMFIT" prepare --input "$W/nope.txt" --out "$(out)"
    try commands error "$MEMFIT" prepare --input "$W" --out "$(out)"
    try commands error "$MEMFIT" prepare --input text.txt --val-fraction 1 --out "$(out)"
    try commands error "$MEMFIT" prepare --input text.txt --val-fraction nan --out "$(out)"
    try commands error "$MEMFIT" prepare --input text.txt --tokenizer "$W/text.txt" --out "$(out)"
    try commands error "$MEMFIT" prepare --input text.txt --out "$W/text.txt"
    : > empty.txt
    try commands error "$MEMFIT" prepare --input empty.txt --out "$(out)"
    try commands any "$MEMFIT" tokenize --tokenizer bytes < /dev/null
    try commands error "$MEMFIT" tokenize --tokenizer nope
    try commands error "$MEMFIT" verify "$W/nope.json"
    try commands error "$MEMFIT" verify "$W/text.txt"
    try commands error "$MEMFIT" verify "$W/good.json"
    for a in "--gpus 0" "--gpus -1" "--gpus 2147483648" "--nodes 0" "--top -1" "--hardware nope" \
             "--model nope" "--seq 0" "--global-batch 0" "--min-gpus -1" "--calibration $W/nope.json" \
             "--calibration $W/text.txt" "--zero 5" "--tp 0" "--pp 0" "--schedule nope"; do
        try commands error "$MEMFIT" plan $a
    done
    for a in "--gpus 1048576" "--gpus 3 --tp 2" "--model nano --gpus 1" "--model llama2-70b --gpus 1" \
             "--explain --top 0" "--json --top 100" "--model $W/model" "--pp 64 --gpus 64"; do
        try commands any "$MEMFIT" plan $a
    done
    for a in "--steps 0" "--steps -1" "--json --steps 1" "--device nope"; do
        try commands any "$MEMFIT" bench --model nano --seq 32 --micro-batch 2 --threads 1 $a
    done
    try commands any "$MEMFIT" profile --model nano --data "$W/data" --seq 32 --micro-batch 2 --steps 2 --threads 1 \
        --out "$(out)"
    try commands error "$MEMFIT" export "$W/nope" --out "$(out)"
    try commands error "$MEMFIT" export base/checkpoints --out "$W/text.txt"
    try commands error "$MEMFIT" export base/checkpoints --out /proc/nope
    try commands error "$MEMFIT" export base/checkpoints --adapter-only --out "$(out)"
    try commands error "$MEMFIT" export base/checkpoints --base-model "$W/model" --out "$(out)"
}

section_kills() {
    # SIGKILL at a random moment of a run that checkpoints every step: the newest complete
    # checkpoint resumes and the run finishes. Two runs on one --out: one is refused, one finishes.
    local i ms pid
    for i in $(seq 1 12); do
        rm -rf kr
        "$MEMFIT" "${TA[@]}" --model nano --steps 100000 --checkpoint-every 1 --keep-checkpoints 2 --out kr \
            > /dev/null 2>&1 &
        pid=$!
        ms=$((300 + RANDOM % 1500))
        sleep "$(printf '0.%03d' $((ms % 1000)))"; [ $ms -ge 1000 ] && sleep 1
        kill -9 $pid 2> /dev/null
        wait $pid 2> /dev/null
        local newest
        newest=$(ls kr/checkpoints 2> /dev/null | grep '^step-' | sort | tail -1)
        if [ -n "$newest" ]; then
            try kills ok "$MEMFIT" "${TA[@]}" --model nano --steps $((10#${newest#step-} + 3)) --checkpoint-every 1 \
                --keep-checkpoints 2 --resume kr/checkpoints --out kr
        else
            try kills ok "$MEMFIT" "${TA[@]}" --model nano --steps 4 --checkpoint-every 1 --out kr   # killed before the first
        fi
    done
    for i in $(seq 1 4); do
        rm -rf two
        "$MEMFIT" "${TA[@]}" --model nano --steps 30 --checkpoint-every 1 --out two > two.a 2>&1 &
        local pa=$!
        "$MEMFIT" "${TA[@]}" --model nano --steps 30 --checkpoint-every 1 --out two > two.b 2>&1 &
        local pb=$!
        wait $pa; local ra=$?
        wait $pb; local rb=$?
        TOTAL[kills]=$((${TOTAL[kills]:-0} + 1))
        if { [ $ra -eq 0 ] && [ $rb -ne 0 ] && grep -q "another memfit run" two.b; } ||
           { [ $rb -eq 0 ] && [ $ra -ne 0 ] && grep -q "another memfit run\|holds the checkpoints of another run" two.a; } ||
           { [ $ra -eq 0 ] && [ $rb -ne 0 ] && grep -q "holds the checkpoints of another run" two.b; }; then
            HELD[kills]=$((${HELD[kills]:-0} + 1))
        else
            BAD+=("[kills] two runs on one --out: exits $ra $rb :: $(cat two.a two.b | head -c 300 | tr '\n' ' ')")
        fi
        try kills ok "$MEMFIT" "${TA[@]}" --model nano --steps 31 --checkpoint-every 1 --resume two/checkpoints --out two
    done
}

# shellcheck source=scripts/adversarial_hostile.sh
. "$SRC/scripts/adversarial_hostile.sh"
for s in $SECTIONS; do
    start=$SECONDS
    "section_$s"
    printf '%-12s %4d of %4d held, %d edge cases of them ran (%ds)\n' "$s" "${HELD[$s]:-0}" "${TOTAL[$s]:-0}" \
        "${RAN[$s]:-0}" $((SECONDS - start))
done
held=0 total=0
for s in $SECTIONS; do held=$((held + ${HELD[$s]:-0})); total=$((total + ${TOTAL[$s]:-0})); done
echo "all: $held of $total held"
for b in "${BAD[@]}"; do echo "  $b"; done
[ "$held" -eq "$total" ]
