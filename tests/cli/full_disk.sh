# A checkpoint folder on a disk that fills up: a 2.5 MiB tmpfs, mounted in a private mount
# namespace, holds one of nano's 1.6 MB checkpoints but not two. The preflight warns; the second
# checkpoint's write fails with ENOSPC and the run stops with one line naming it; the first
# checkpoint is intact and no partial folder stays; a resume onto the full disk is refused before
# its first step, with the numbers; --offload optimizer onto the full disk is refused at start
# (the file's blocks are allocated then), with the numbers, leaving no file; and a run resumed
# from the intact checkpoint elsewhere ends bit for bit where the uninterrupted run does.
# Usage: bash full_disk.sh MEMFIT SOURCE_DIR
set -euo pipefail
MEMFIT=$(realpath "$1")
SRC=$(realpath "$2")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/memfit_full_disk.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*" >&2; exit 1; }
cd "$WORK"
head -c 60000 "$SRC/data/tinyshakespeare.txt" > text.txt
"$MEMFIT" prepare --tokenizer bytes --input text.txt --out data > /dev/null
ARGS=(train --model nano --data "$WORK/data" --seq 32 --micro-batch 2 --sample 0 --eval-every 0 --progress quiet
      --threads 1 --checkpoint-every 5)
"$MEMFIT" "${ARGS[@]}" --steps 10 --out alone > /dev/null

# Inside a mount namespace (root: unshare -m; otherwise an unprivileged user namespace, -rm).
cat > on_tmpfs.sh <<INNER
set -euo pipefail
mkdir -p disk
mount -t tmpfs -o size=2560k tmpfs disk
trap 'umount disk 2> /dev/null || true' EXIT   # where the namespace shares its mounts (below)
MEMFIT=$MEMFIT
ARGS=(${ARGS[*]@Q})
if "\$MEMFIT" "\${ARGS[@]}" --steps 10 --checkpoint-dir disk/ck --out job > job.log 2>&1; then exit 12; fi
grep -q "memfit: warning: --checkpoint-dir disk/ck: .* free; --keep-checkpoints" job.log || { cat job.log; exit 11; }
[ "\$(ls disk/ck)" = step-000005 ] || { ls -la disk/ck; exit 13; }
if "\$MEMFIT" "\${ARGS[@]}" --steps 10 --resume auto --checkpoint-dir disk/ck --out job > again.log 2>&1; then exit 14; fi
cp -r disk/ck/step-000005 kept
# --offload-dir on the nearly full disk: nano's 1.01 MiB of moments do not fit what is left.
if "\$MEMFIT" "\${ARGS[@]}" --steps 2 --offload optimizer --offload-dir disk --out off > off.log 2>&1; then exit 15; fi
[ -z "\$(ls -A disk | grep -v '^ck\$')" ] || { ls -la disk; exit 16; }
grep -v 'memfit: warning' job.log; cat again.log; grep 'memfit: error' off.log
INNER
if [ "$(id -u)" = 0 ]; then ns=(unshare -m); else ns=(unshare -rm); fi
# In a chroot, / is no mount point and unshare cannot make it private: keep the propagation (the
# script unmounts its tmpfs itself).
"${ns[@]}" true 2> /dev/null || ns+=(--propagation unchanged)
"${ns[@]}" bash on_tmpfs.sh > inner.log 2>&1 || {
    cat inner.log
    fail "on the tmpfs (${ns[*]}): exit 11: no free-space warning, 12: the full disk's checkpoint succeeded," \
         "13: the folder is not the first checkpoint alone, 14: a resume onto the full disk started," \
         "15: offloading onto the full disk started, 16: it left a file; other: no tmpfs"
}
grep -q "the checkpoint of step 10 failed (disk/ck/step-000005 is intact): .*No space left on device" inner.log ||
    { cat inner.log; fail "the failure was not one line naming the checkpoint and ENOSPC"; }
grep -q "^memfit: error: --checkpoint-dir disk/ck: .* free, a checkpoint needs 1.52 MiB" inner.log ||
    { cat inner.log; fail "a resume onto the full disk was not refused before its first step"; }
grep -q "^memfit: error: --offload-dir disk: cannot hold the 1.01 MiB of offloaded optimizer state (No space left" inner.log ||
    { cat inner.log; fail "offloading onto the full disk was not one line with the numbers"; }
[ "$(grep -c . inner.log)" = 3 ] || { cat inner.log; fail "not one line for each failure"; }
"$MEMFIT" "${ARGS[@]}" --steps 10 --resume kept --out resumed > /dev/null
cmp alone/checkpoints/step-000010/state.safetensors resumed/checkpoints/step-000010/state.safetensors ||
    fail "resumed from the intact checkpoint, the run did not end where the uninterrupted one does"
echo "ok: the full disk's checkpoint failed cleanly; the previous one resumed to the same end"
