# --optimizer-in-backward under data parallel: 2 ranks of micro, --zero 0, 2 and 3 (1 is the
# engine test's ZeRO-0 path with a sharded update), each fused run's losses equal to the unfused
# run's of the same layout, every rank's plan equal to its measurement, and the planned gradients
# below the unfused run's.
# Usage: bash optimizer_in_backward.sh MEMFIT MPIEXEC SOURCE_DIR
source "$(dirname "$0")/common.sh"
cd "$WORK"
ARGS=(train --model micro --seq 64 --micro-batch 2 --steps 4 --sample 0 --eval-every 0 --log-every 1 --threads 1
      --progress plain --lr 1e-3)
grads() { sed -nE 's/^  gradients +([0-9.]+ [KMG]?i?B).*/\1/p' "$1" | head -1; }
for zero in 0 2 3; do
    mpi 2 "${ARGS[@]}" --zero $zero --out plain$zero > plain$zero.log 2>&1 || { cat plain$zero.log; fail "--zero $zero"; }
    mpi 2 "${ARGS[@]}" --zero $zero --optimizer-in-backward --out fused$zero > fused$zero.log 2>&1 ||
        { cat fused$zero.log; fail "--zero $zero fused"; }
    d=$(loss_diff plain$zero/metrics.jsonl fused$zero/metrics.jsonl)
    [ "$d" != none ] && awk -v d="$d" 'BEGIN { exit !(d < 1e-6) }' || fail "--zero $zero: losses differ by $d"
    [ "$(grep -cE '^  rank [0-9]+.*\(equal\)$' fused$zero.log)" = 2 ] || { cat fused$zero.log; fail "--zero $zero: plan != measured"; }
    echo "--zero $zero: gradients $(grads plain$zero.log) unfused, $(grads fused$zero.log) fused"
    [ "$(grads plain$zero.log)" != "$(grads fused$zero.log)" ] || fail "--zero $zero: the fused step kept the gradients"
done
echo "ok: --optimizer-in-backward on 2 ranks (--zero 0, 2, 3) trains as the unfused step, planned = measured"
