# --offload optimizer under data parallel: each rank keeps its shard's master weights and moments in
# a file of its own under --offload-dir; --zero 1 (shards) and --zero 0 (whole states) in bf16 end
# bit for bit where the in-memory jobs end, and nothing is left in the folder.
# Usage: bash offload.sh MEMFIT MPIEXEC SOURCE_DIR
source "$(dirname "$0")/common.sh"
cd "$WORK"
mkdir -p states
ARGS=(train --model nano --data "$WORK/data" --seq 32 --micro-batch 2 --precision bf16 --sample 0 --eval-every 0
      --progress quiet --threads 1 --lr 1e-3 --steps 8 --checkpoint-every 8)
for zero in 0 1; do
    rm -rf mem off
    mpi 2 "${ARGS[@]}" --zero $zero --out mem > mem.log 2>&1 || { cat mem.log; fail "--zero $zero in memory"; }
    mpi 2 "${ARGS[@]}" --zero $zero --offload optimizer --offload-dir states --out off > off.log 2>&1 ||
        { cat off.log; fail "--zero $zero offloaded"; }
    n=0
    for f in mem/checkpoints/step-000008/state*.safetensors; do
        cmp "$f" "off/checkpoints/step-000008/$(basename "$f")" || fail "--zero $zero: $(basename "$f") differs"
        n=$((n + 1))
    done
    [ "$n" -ge 1 ] || fail "--zero $zero: no state files"
    grep -q '"offloaded": [1-9]' off/summary.json || fail "--zero $zero: no offloaded bytes in summary.json"
done
[ -z "$(ls -A states)" ] || { ls -la states; fail "offload files left behind"; }
echo "ok: offloaded states end bit for bit where the in-memory jobs end (--zero 0, 1; 2 ranks)"
