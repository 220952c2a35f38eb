# Packed instruction data under data parallel: conversations prepared with the bytes tokenizer and
# memfit's ChatML template, trained --packing by one process (micro-batch 4) and by 2 ranks
# (micro-batch 2 each, --zero 0 and 1), and by 2 ranks of --tp 2 --sp (LLaMA) or --pp 2: the same
# global batch, so the same losses to fp32 rounding, the same trained-token counts, and each
# rank's plan equal to its measurement.
# Usage: bash packing.sh MEMFIT MPIEXEC SOURCE_DIR
source "$(dirname "$0")/common.sh"
cd "$WORK"
for i in $(seq 1 40); do
    turns=$((1 + i % 3)) msgs=""
    for t in $(seq 1 $turns); do
        a=$((i * 7 + t)) b=$((t * 13))
        msgs="$msgs{\"role\": \"user\", \"content\": \"$a+$b?\"}, "
        msgs="$msgs{\"role\": \"assistant\", \"content\": \"$((a + b)).\"}, "
    done
    echo "{\"messages\": [${msgs%, }]}"
done > chat.jsonl
"$MEMFIT" prepare --input chat.jsonl --tokenizer bytes --chat-template chatml --out chat > /dev/null ||
    fail "prepare"
# Conversations of 67 to 200 bytes: two or three share a row.
BASE=(train --data "$WORK/chat" --seq 256 --packing --sample 0 --eval-every 0 --log-every 1 --threads 1 --lr 1e-3
      --steps 4)
ARGS=("${BASE[@]}" --model nano --progress quiet)
"$MEMFIT" "${ARGS[@]}" --micro-batch 4 --out one > one.log 2>&1 || { cat one.log; fail "one process"; }
for zero in 0 1; do
    mpi 2 "${ARGS[@]}" --micro-batch 2 --zero $zero --out two$zero > two.log 2>&1 || { cat two.log; fail "--zero $zero"; }
    d=$(loss_diff one/metrics.jsonl two$zero/metrics.jsonl)
    [ "$d" != none ] && awk -v d="$d" 'BEGIN { exit !(d < 1e-4) }' || fail "--zero $zero: losses differ by $d"
    want=$(grep -o '"trained_tokens": [0-9]*' one/summary.json)
    grep -q "$want" two$zero/summary.json || fail "--zero $zero: trained tokens differ from one process's ($want)"
    # Every per-category "peak_live" block of the summary (planned, measured, each rank's measured and
    # planned): one total.
    totals=$(awk '/"peak_live": \{/ { inside = 1; next } inside && /^ *\}/ { inside = 0 }
                  inside && /"total": [0-9]/ { print $2; inside = 0 }' two$zero/summary.json | tr -d ,)
    [ "$(echo "$totals" | wc -l)" -eq 6 ] && [ "$(echo "$totals" | sort -u | wc -l)" -eq 1 ] ||
        fail "--zero $zero: a rank's peak differs from the plan:" $totals
done
# Tensor and pipeline parallel: each micro-batch's document starts reach its stage's attention (and
# GPT-2's positions on the first stage); the tensor group attends whole documents. LLaMA-micro
# (RoPE) under --tp 2 --sp, nano and llama-micro under --pp 2, 2 micro-batches a step.
for model in nano llama-micro; do
    P=("${BASE[@]}" --model "$model" --progress plain --micro-batch 4 --grad-accum 2)
    "$MEMFIT" "${P[@]}" --out one$model > one$model.log 2>&1 || { cat one$model.log; fail "$model: one process"; }
    layouts=("--pp 2 --schedule 1f1b")
    [ "$model" = nano ] || layouts+=("--tp 2 --sp")
    for layout in "${layouts[@]}"; do
        # shellcheck disable=SC2086
        mpi 2 "${P[@]}" $layout --out split > split.log 2>&1 || { cat split.log; fail "$model $layout"; }
        d=$(loss_diff one$model/metrics.jsonl split/metrics.jsonl)
        echo "$model $layout: max relative loss difference $d"
        [ "$d" != none ] && awk -v d="$d" 'BEGIN { exit !(d < 1e-4) }' || fail "$model $layout: losses differ by $d"
        [ "$(grep -cE '^  rank [0-9]+.*\(equal\)$' split.log)" = 2 ] || { cat split.log; fail "$model $layout: plan != measured"; }
    done
done
echo "ok: --packing over 2 ranks (--zero 0, 1; --tp 2 --sp; --pp 2) trains as one process on the same global batch"
