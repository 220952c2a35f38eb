# --offload under data parallel: each rank keeps its shard's master weights and moments (and with
# optimizer+params its ZeRO-3 weight shard) in a file of its own under --offload-dir; --zero 1
# (shards), --zero 0 (whole states) and --zero 3 in bf16 end bit for bit where the in-memory jobs
# end (also --tp 2 --sp --zero 3 with the weights offloaded), and nothing is left in the folder.
# Usage: bash offload.sh MEMFIT MPIEXEC SOURCE_DIR
source "$(dirname "$0")/common.sh"
cd "$WORK"
mkdir -p states
ARGS=(train --model nano --data "$WORK/data" --seq 32 --micro-batch 2 --precision bf16 --sample 0
      --progress quiet --threads 1 --lr 1e-3 --steps 8 --checkpoint-every 8)
for zero in 0 1; do
    rm -rf mem off
    mpi 2 "${ARGS[@]}" --eval-every 0 --zero $zero --out mem > mem.log 2>&1 || { cat mem.log; fail "--zero $zero in memory"; }
    mpi 2 "${ARGS[@]}" --eval-every 0 --zero $zero --offload optimizer --offload-dir states --out off > off.log 2>&1 ||
        { cat off.log; fail "--zero $zero offloaded"; }
    n=0
    for f in mem/checkpoints/step-000008/state*.safetensors; do
        cmp "$f" "off/checkpoints/step-000008/$(basename "$f")" || fail "--zero $zero: $(basename "$f") differs"
        n=$((n + 1))
    done
    [ "$n" -ge 1 ] || fail "--zero $zero: no state files"
    grep -q '"offloaded": [1-9]' off/summary.json || fail "--zero $zero: no offloaded bytes in summary.json"
done
# --offload optimizer+params: the ZeRO-3 weight shard in the file too, read a layer ahead of each
# gather; with accumulation (the first, middle and last programs share the file) and validation.
for accum in 1 3; do
    rm -rf mem off
    mpi 2 "${ARGS[@]}" --zero 3 --grad-accum $accum --eval-every 4 --out mem > mem.log 2>&1 ||
        { cat mem.log; fail "--zero 3 accum $accum in memory"; }
    mpi 2 "${ARGS[@]}" --zero 3 --grad-accum $accum --eval-every 4 --offload optimizer+params --offload-dir states \
        --out off > off.log 2>&1 || { cat off.log; fail "--zero 3 accum $accum, optimizer+params offloaded"; }
    for f in mem/checkpoints/step-000008/state*.safetensors; do
        cmp "$f" "off/checkpoints/step-000008/$(basename "$f")" || fail "optimizer+params accum $accum: $(basename "$f") differs"
    done
    [ "$(losses mem/metrics.jsonl | wc -l)" -ge 3 ] || fail "accum $accum: fewer than 3 losses logged"
    cmp <(losses mem/metrics.jsonl) <(losses off/metrics.jsonl) || fail "optimizer+params accum $accum: losses differ"
    # Validation (every 4 steps) runs its own program over the same offloaded weights.
    val() { grep -o '"val_loss":[^,}]*' "$1"; }
    [ "$(val mem/metrics.jsonl | wc -l)" -ge 1 ] || fail "accum $accum: no validation loss logged"
    [ "$(val mem/metrics.jsonl)" = "$(val off/metrics.jsonl)" ] || fail "optimizer+params accum $accum: validation differs"
    # The planned device peak (the categories' peaks but the offloaded one, summed: "total") is lower.
    dev() { awk '/^  "planned": \{/ { p = 1 } p && /"total"/ { gsub(/[^0-9]/, ""); print; exit }' "$1"; }
    m=$(dev mem/summary.json) o=$(dev off/summary.json)
    [ "$o" -lt "$m" ] || fail "optimizer+params accum $accum: planned device peak $o bytes, not below $m"
    echo "accum $accum: planned device peak $m -> $o bytes"
done
# With tensor and sequence parallelism: each tensor rank streams its own slice's shard.
rm -rf mem off
T=("${ARGS[@]/nano/llama-micro}" --eval-every 0 --tp 2 --sp --zero 3 --grad-accum 2)
mpi 2 "${T[@]}" --out mem > mem.log 2>&1 || { cat mem.log; fail "--tp 2 --sp --zero 3 in memory"; }
mpi 2 "${T[@]}" --offload optimizer+params --offload-dir states --out off > off.log 2>&1 ||
    { cat off.log; fail "--tp 2 --sp --zero 3, optimizer+params offloaded"; }
for f in mem/checkpoints/step-000008/state*.safetensors; do
    cmp "$f" "off/checkpoints/step-000008/$(basename "$f")" || fail "optimizer+params --tp 2: $(basename "$f") differs"
done
# --offload activations: each rank's saved activations in its file between forward and backward,
# under ZeRO-2, ZeRO-3 with the weights offloaded too, and tensor parallelism with LLaMA's
# grouped KV heads; the same checkpoints as the resident runs, planned = measured offloaded bytes.
for extra in "--zero 2|activations" "--zero 3|optimizer+params+activations" "--tp 2 --sp --grad-accum 2|activations"; do
    rm -rf mem off
    flags=${extra%|*} what=${extra#*|}
    read -r -a F <<< "$flags"
    A=("${ARGS[@]/nano/llama-micro}" --eval-every 0 "${F[@]}")
    mpi 2 "${A[@]}" --out mem > mem.log 2>&1 || { cat mem.log; fail "$flags in memory"; }
    mpi 2 "${A[@]}" --offload "$what" --offload-dir states --out off > off.log 2>&1 ||
        { cat off.log; fail "$flags, --offload $what"; }
    for f in mem/checkpoints/step-000008/state*.safetensors; do
        cmp "$f" "off/checkpoints/step-000008/$(basename "$f")" || fail "--offload $what with $flags: $(basename "$f") differs"
    done
    grep -q '"offloaded": [1-9]' off/summary.json || fail "--offload $what with $flags: no offloaded bytes"
done
[ -z "$(ls -A states)" ] || { ls -la states; fail "offload files left behind"; }
echo "ok: offloaded states end bit for bit where the in-memory jobs end (--zero 0, 1; --zero 3 optimizer+params, also under --tp 2 --sp; activations under --zero 2, --zero 3, --tp 2 --sp; 2 ranks)"
