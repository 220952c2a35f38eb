# 2 ranks train a tiny model on the global batch of one process and match its losses; a sharded
# checkpoint resumes bit for bit on 2 ranks, re-shards onto 1 process (and a 4-rank one onto 2),
# and exports as one folder.
# Usage: bash train_resume_export.sh MEMFIT MPIEXEC SOURCE_DIR ZERO
source "$(dirname "$0")/common.sh"
cd "$WORK"
ARGS=(train --model nano --data "$WORK/data" --batch 4 --grad-accum 2 --seq 32 --lr 1e-3 --warmup 2
      --eval-every 3 --eval-batches 2 --sample 0 --progress plain --threads 1 --zero "$ZERO")

"$MEMFIT" "${ARGS[@]}" --steps 6 --out one > one.log 2>&1 || { cat one.log; fail "one process"; }
mpi 2 "${ARGS[@]}" --steps 6 --checkpoint-every 3 --out two > two.log 2>&1 || { cat two.log; fail "2 ranks"; }

# Rank 0 alone prints: one header line, not two.
[ "$(grep -c '^memfit train: model nano' two.log)" = 1 ] || { cat two.log; fail "more than one rank printed"; }
grep -q 'data parallel: 2 ranks (mpi), micro-batch 2 per rank, ZeRO stage '"$ZERO" two.log || { cat two.log; fail "no data-parallel line"; }
grep -q 'memory per rank (2 ranks): reserved min' two.log || { cat two.log; fail "no per-rank memory line"; }
grep -q '"per_rank"' two/summary.json || fail "summary.json has no per_rank memory"

# Same global batch: the same losses to fp32 rounding (validation too).
d=$(loss_diff one/metrics.jsonl two/metrics.jsonl)
echo "1 process vs 2 ranks: max relative loss difference $d"
awk -v d="$d" 'BEGIN { exit !(d != "none" && d < 1e-4) }' || fail "losses differ by $d"
v1=$(sed -nE '/"step":6,/ s/.*"val_loss":([^,}]*).*/\1/p' one/metrics.jsonl)
v2=$(sed -nE '/"step":6,/ s/.*"val_loss":([^,}]*).*/\1/p' two/metrics.jsonl)
awk -v a="$v1" -v b="$v2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d / a < 1e-4) }' ||
    fail "validation losses differ: $v1 vs $v2"

# The sharded layout.
C3=two/checkpoints/step-000003
for r in 0 1; do
    [ -s $C3/state-rank-0000$r-of-00002.safetensors ] || { ls -la $C3; fail "no shard file of rank $r"; }
done
grep -q '"world_size": 2' $C3/meta.json || fail "meta.json has no world_size"

# Resume on 2 ranks from step 3: bit for bit (same losses, same final shards).
mpi 2 "${ARGS[@]}" --steps 6 --checkpoint-every 3 --resume $C3 --out again > again.log 2>&1 ||
    { cat again.log; fail "resume on 2 ranks"; }
for r in 0 1; do
    f=step-000006/state-rank-0000$r-of-00002.safetensors
    cmp two/checkpoints/$f again/checkpoints/$f || fail "resumed run's $f differs from the straight run's"
done
[ "$(losses two/metrics.jsonl | grep -E '^(4|5|6) ')" = "$(losses again/metrics.jsonl | grep -E '^(4|5|6) ')" ] ||
    fail "resumed losses differ"

# Resume on one process (re-sharded): the same run to fp32 rounding.
"$MEMFIT" "${ARGS[@]}" --steps 6 --checkpoint-every 3 --resume two/checkpoints/step-000003 --out solo > solo.log 2>&1 ||
    { cat solo.log; fail "resume on 1 process"; }
d=$(loss_diff two/metrics.jsonl solo/metrics.jsonl)
echo "2 ranks vs resumed on 1 process: max relative loss difference $d"
awk -v d="$d" 'BEGIN { exit !(d != "none" && d < 1e-4) }' || fail "re-sharded resume's losses differ by $d"

# 4 ranks save, 2 ranks resume (each reads the two shard files its range overlaps): the 4-rank run
# continued to fp32 rounding.
mpi 4 "${ARGS[@]}" --steps 6 --checkpoint-every 3 --out four > four.log 2>&1 || { cat four.log; fail "4 ranks"; }
[ -s four/checkpoints/step-000003/state-rank-00003-of-00004.safetensors ] || fail "no shard file of rank 3 of 4"
mpi 2 "${ARGS[@]}" --steps 6 --resume four/checkpoints/step-000003 --out four2 > four2.log 2>&1 ||
    { cat four2.log; fail "resume 4 -> 2 ranks"; }
d=$(loss_diff four/metrics.jsonl four2/metrics.jsonl)
echo "4 ranks vs resumed on 2 ranks: max relative loss difference $d"
awk -v d="$d" 'BEGIN { exit !(d != "none" && d < 1e-4) }' || fail "4 -> 2 re-sharded losses differ by $d"

# A shard file missing: one clear error naming it.
cp -r $C3 broken
rm broken/state-rank-00001-of-00002.safetensors
if "$MEMFIT" "${ARGS[@]}" --steps 6 --resume broken --out x > broken.log 2>&1; then fail "resumed without a shard"; fi
grep -q 'memfit: error: .*broken/state-rank-00001-of-00002.safetensors: shard file of rank 1 of 2 is missing' broken.log ||
    { cat broken.log; fail "no clear error for a missing shard"; }

# Export consolidates the shards into one Hugging Face folder, which trains again.
"$MEMFIT" export two/checkpoints --out hf > export.log 2>&1 || { cat export.log; fail "export"; }
[ -s hf/model.safetensors ] && [ -s hf/config.json ] || fail "export wrote no model"
"$MEMFIT" export solo/checkpoints --out hf_solo > /dev/null 2>&1 || fail "export of the 1-process checkpoint"
[ "$(stat -c %s hf/model.safetensors)" = "$(stat -c %s hf_solo/model.safetensors)" ] || fail "exports differ in size"
"$MEMFIT" train --model hf --data "$WORK/data" --batch 2 --seq 32 --steps 1 --eval-batches 1 --sample 0 \
    --progress quiet --threads 1 --out fromhf > fromhf.log 2>&1 || { cat fromhf.log; fail "training from the export"; }
# --fit auto plans the per-rank shape (every rank the same choice, weighing the most loaded rank).
mpi 2 train --model nano --data "$WORK/data" --batch 8 --seq 64 --steps 2 --eval-batches 1 --sample 0 \
    --progress plain --threads 1 --zero "$ZERO" --fit auto --memory-budget 3MiB --out fit > fit.log 2>&1 ||
    { cat fit.log; fail "--fit auto on 2 ranks"; }
grep -q -- '--fit auto chose' fit.log || { cat fit.log; fail "--fit auto said nothing"; }
echo "PASS (zero $ZERO)"
