#!/usr/bin/env bash
# The CUDA backend's checks on the GPU machine, in one go (under 8 minutes), ending in one table.
#
#   here:  bash scripts/gpu-bundle.sh          # builds build-gpu/ and fills .gpu/ (ignored)
#   there: bash scripts/gpu-check.sh           # device tool: carry [".gpu"], from the repo root
#          bash scripts/gpu-check.sh --dry-run # print the commands only
#   options: --batch B (skip the plan, use micro-batch B), --steps N (memfit steps, default 12)
#
# Steps:
#   a. the bundle's libraries: .gpu/lib (+ .gpu/lib/cxx only if the system's libstdc++ is too old),
#      the CUDA toolkit's lib64 and python3's site-packages/nvidia/*/lib (libnccl.so.2,
#      libcublasLt.so.13); stop if ldd finds anything missing. These are set for memfit only:
#      PyTorch runs with the environment it came with.
#   b. nvidia-smi -L, then .gpu/bin/memfit_cuda_tests (all tests; counts passed/failed/skipped).
#      Stops here, exit 3, when no GPU is usable (the tests skip saying 'no CUDA device').
#   c. memfit verify --device cuda on tests/data/{gpt2,llama,llama31,qwen2,qwen3,mistral}_tiny.safetensors (fp32).
#   d. the micro-batch B: the largest of 64, 32, 16, 8 for which `memfit plan --hardware h200 --model
#      gpt2 --precision bf16 --seq 1024 --gpus 1 --global-batch B --micro-batch B` has a fitting plan
#      with accumulation 1 (64 is a cap for time, not memory); 32 if the planner cannot answer.
#   e. memfit train --device cuda, GPT-2 124M, bf16, T=1024, flash attention, no recomputation, on the
#      bundled Shakespeare tokenized for GPT-2 with no validation split (no evaluation, as PyTorch);
#      tokens/s: median of the per-step rates of steps 3.. (metrics.jsonl); memory from summary.json;
#      its --tensorboard files read back by TensorBoard's EventAccumulator (the loss at every step,
#      the bytes of parameters, gradients, optimizer states, activations).
#   e2. memfit bench --timeline at micro-batch 16: where the step's time goes, by op class.
#   f. python3 bench/pytorch_gpt2.py --batches B --steps 20 (5 warm-up steps; median).
#   h. fine-tuning on the GPU: llama-mini pre-trained 200 steps with the 259-token ChatML tokenizer,
#      exported, LoRA and QLoRA --epochs 1 on chat data (bench/make_chat.py), exported bf16,
#      generate --chat --device cuda; the table's steps line says whether every command ran.
#   g. the table: tokens/s, MFU (bench/pytorch_gpt2.py's formula, against 989 TFLOP/s), predicted vs
#      measured device memory, memfit/PyTorch ratios, and PASS/FAIL for the issue's targets.
# Files (at most 8) go to ${OUT:-/tmp/gpu-check}: check.log (all of this), cuda_tests.log, verify.log,
# memfit_train.log, memfit_summary.json, memfit_metrics.jsonl, pytorch.log, results.json.
# Exit: 0 every step ran (the table says which targets missed), 1 a step failed to run, 2 usage or
# bundle missing, 3 no usable GPU.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
G=.gpu
DRY=false
BATCH=""
STEPS=12
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=true ;;
        --batch) BATCH=${2:?--batch needs a number}; shift ;;
        --steps) STEPS=${2:?--steps needs a number}; shift ;;
        -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
        *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

OUTD=${OUT:-/tmp/gpu-check}
mkdir -p "$OUTD" || exit 2
LOG=$OUTD/check.log
if ! $DRY; then
    rm -f "$OUTD"/{check.log,cuda_tests.log,verify.log,memfit_train.log,memfit_summary.json,memfit_metrics.jsonl,pytorch.log,results.json}
    exec > >(tee -a "$LOG") 2>&1
    TEE_PID=$!
fi
SCR=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX") || exit 2
# shellcheck disable=SC2317  # (called by the EXIT trap)
finish() {
    rm -rf "$SCR"
    # let tee write the last lines of check.log before the device tool collects $OUT
    if [ -n "${TEE_PID:-}" ]; then exec 1>&- 2>&-; wait "$TEE_PID" 2>/dev/null; fi
}
trap finish EXIT

DEADLINE=450   # seconds for everything; the device call allows 8 minutes
T0=$SECONDS
say() { printf '[gpu-check %3ds] %s\n' $((SECONDS - T0)) "$*"; }
# budget CAP RESERVE: seconds for a step: at most CAP, leaving RESERVE for the steps after it.
budget() {
    local left=$((DEADLINE - (SECONDS - T0) - $2))
    [ "$left" -lt "$1" ] || left=$1
    [ "$left" -ge 15 ] || left=15
    echo "$left"
}
show() { printf '+ %s\n' "$*"; }
py() { python3 - "$@"; }

# Step outcomes: ran | failed (<why>) | skipped (<why>)
declare -A STATUS
FAILED_TO_RUN=0
step_failed() { STATUS[$1]="failed: $2"; FAILED_TO_RUN=1; say "step $1 FAILED TO RUN: $2"; }

# ------------------------------------------------------------------------------------------------
say "a. bundle and libraries"
# The binaries and memfit's CUDA plug-in travel xz-compressed (gpu-bundle.sh): unpacked in place, once.
for b in memfit memfit_cuda_tests libmemfit_cuda.so; do
    if [ -f "$G/bin/$b.xz" ] && [ ! -x "$G/bin/$b" ] && ! $DRY; then
        if command -v xz >/dev/null; then
            xz -dc "$G/bin/$b.xz" >"$G/bin/$b"
        else
            python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$G/bin/$b.xz" "$G/bin/$b"
        fi && chmod 755 "$G/bin/$b" || { echo "gpu-check: cannot unpack $G/bin/$b.xz" >&2; exit 2; }
    fi
done
if [ ! -x "$G/bin/memfit" ] || [ ! -x "$G/bin/memfit_cuda_tests" ] || [ ! -f "$G/bin/libmemfit_cuda.so" ]; then
    echo "gpu-check: no bundle: $G/bin/memfit missing. Run 'bash scripts/gpu-bundle.sh' on the build machine and carry .gpu" >&2
    $DRY || exit 2
fi
[ -f "$G/MANIFEST" ] && sed 's/^/  bundle: /' "$G/MANIFEST"
if [ -f "$G/MANIFEST" ]; then
    want=$(sed -n 's/^source_fingerprint=//p' "$G/MANIFEST")
    have=$(find src tests/cuda CMakeLists.txt -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
    [ "$want" = "$have" ] || say "WARNING: the bundle was built from other sources than this tree (fingerprint $want, tree $have): rerun scripts/gpu-bundle.sh"
fi
echo "  system: $(uname -m), $(ldd --version 2>/dev/null | head -1)"
# The bundle targets x86-64-v3 (MANIFEST march=): every AVX2 CPU. Anything less would die on an
# illegal instruction somewhere in the middle; say so first.
march=$(sed -n 's/^march=//p' "$G/MANIFEST" 2>/dev/null)
if [ "$march" = "x86-64-v3" ]; then
    for flag in avx2 fma bmi2 f16c movbe; do
        grep -qw "$flag" /proc/cpuinfo || { echo "gpu-check: this CPU lacks $flag, which the bundle's target $march needs; rebuild it with MEMFIT_ARCH= (the compiler's default) in scripts/gpu-bundle.sh" >&2; exit 2; }
    done
fi

# Libraries stored compressed (NAME.xz) are unpacked into scratch, leaving .gpu as it came.
LIBX=$SCR/lib
mkdir -p "$LIBX"
for f in "$G"/lib/*.xz; do
    [ -e "$f" ] || continue
    b=$(basename "$f" .xz)
    if command -v xz >/dev/null; then
        xz -dc "$f" >"$LIBX/$b"
    else
        python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$f" "$LIBX/$b"
    fi || { echo "gpu-check: cannot unpack $f" >&2; exit 2; }
done

# CUDA: the toolkit's libraries and PyTorch's pip packages (nvidia-nccl-cu13, nvidia-cublas, ...).
cuda_dirs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64; do
    [ -d "$d" ] && cuda_dirs="$cuda_dirs:$d"
done
pip_dirs=$(python3 - 2>/dev/null <<'EOF'
import glob, os, site
roots = []
try:
    import nvidia
    roots += list(nvidia.__path__)
except Exception:
    pass
try:
    for sp in site.getsitepackages() + [site.getusersitepackages()]:
        roots.append(os.path.join(sp, "nvidia"))
except Exception:
    pass
seen = []
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "*", "lib"))):
        d = os.path.realpath(d)
        if os.path.isdir(d) and d not in seen:
            seen.append(d)
print(":".join(seen))
EOF
)
base_ld="$ROOT/$G/lib:$LIBX$cuda_dirs${pip_dirs:+:$pip_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
MF_LD=$base_ld
missing=$(LD_LIBRARY_PATH=$MF_LD ldd "$G/bin/memfit" "$G/bin/memfit_cuda_tests" "$G/bin/libmemfit_cuda.so" 2>&1 | grep 'not found' | sort -u)
if [ -n "$missing" ] && [ -d "$G/lib/cxx" ]; then
    say "with the system's libstdc++: $(echo "$missing" | head -3 | tr -s ' \t' ' ') ...; trying the bundle's (.gpu/lib/cxx)"
    MF_LD="$ROOT/$G/lib/cxx:$base_ld"
    missing=$(LD_LIBRARY_PATH=$MF_LD ldd "$G/bin/memfit" "$G/bin/memfit_cuda_tests" "$G/bin/libmemfit_cuda.so" 2>&1 | grep 'not found' | sort -u)
fi
echo "  LD_LIBRARY_PATH for memfit: $MF_LD"
echo "  ldd .gpu/bin/memfit | grep 'not found':"
echo "${missing:-(nothing)}" | sed 's/^/    /'
LD_LIBRARY_PATH=$MF_LD ldd "$G/bin/memfit" | grep -E 'libcuda\.|libcudart|libcublas|libnccl|libstdc\+\+' | sed 's/^\s*/    /'
if [ -n "$missing" ]; then
    echo "gpu-check: STOP: memfit's libraries do not all resolve here (above); nothing was run" >&2
    exit 1
fi
MF=(env "LD_LIBRARY_PATH=$MF_LD" "MEMFIT_DATA_DIR=$ROOT/data" "$ROOT/$G/bin/memfit")
MFT=(env "LD_LIBRARY_PATH=$MF_LD" "MEMFIT_DATA_DIR=$ROOT/data" "MEMFIT_TEST_DATA=$ROOT/tests/data" "$ROOT/$G/bin/memfit_cuda_tests")
echo "  memfit runs as: env LD_LIBRARY_PATH=<above> MEMFIT_DATA_DIR=$ROOT/data $G/bin/memfit (data/ of this tree, not the build machine's path)"
STATUS[a]=ran

# ------------------------------------------------------------------------------------------------
say "b. GPU and memfit_cuda_tests"
GPU_NAME=""
show "nvidia-smi -L"
if ! $DRY; then
    if command -v nvidia-smi >/dev/null; then
        GPU_NAME=$(nvidia-smi -L 2>&1 | head -4)
        echo "$GPU_NAME"
        nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader 2>&1 | sed 's/^/  /'
    else
        GPU_NAME="nvidia-smi: not found"
        say "nvidia-smi not found; memfit_cuda_tests decides"
    fi
fi
# memfit_cuda_tests has the build machine's build-gpu/memfit compiled in (MEMFIT_BINARY, for tests
# that run the CLI): where that path does not exist here, it becomes a link to the bundle's memfit.
baked=$(sed -n 's/^build_dir=//p' "$G/MANIFEST" 2>/dev/null)
if [ -n "$baked" ] && [ ! -e "$baked/memfit" ] && ! $DRY; then
    if mkdir -p "$baked" 2>/dev/null && ln -s "$ROOT/$G/bin/memfit" "$baked/memfit" 2>/dev/null; then
        echo "  linked $baked/memfit -> $G/bin/memfit (the path memfit_cuda_tests runs)"
    else
        echo "  note: cannot create $baked/memfit; tests that run the memfit CLI will not find it"
    fi
fi
t=$(budget 150 240)
show "timeout $t memfit_cuda_tests --gtest_color=no --gtest_output=json:$SCR/cuda_tests.json > $OUTD/cuda_tests.log"
T_PASS=0 T_FAIL=0 T_SKIP=0 T_TOTAL=0 T_FAILED_NAMES=""
if ! $DRY; then
    timeout -k 10 "$t" "${MFT[@]}" --gtest_color=no --gtest_output="json:$SCR/cuda_tests.json" >"$OUTD/cuda_tests.log" 2>&1
    rc=$?
    read -r T_TOTAL T_PASS T_FAIL T_SKIP T_FAILED_NAMES < <(py "$SCR/cuda_tests.json" "$OUTD/cuda_tests.log" <<'EOF'
import json, re, sys
js, log = sys.argv[1], sys.argv[2]
p = f = s = 0
failed = []
try:
    for suite in json.load(open(js))["testsuites"]:
        for t in suite["testsuite"]:
            name = suite["name"] + "." + t["name"]
            if t.get("result") == "SKIPPED": s += 1
            elif t.get("failures"): f += 1; failed.append(name)
            elif t.get("status", "RUN") == "RUN": p += 1
except Exception:   # no JSON (a crash): count the console lines
    text = open(log, errors="replace").read()
    p = len(re.findall(r"^\[       OK \] \S+ \(", text, re.M))
    failed = re.findall(r"^\[  FAILED  \] (\S+) \(", text, re.M)
    f = len(failed)
    s = len(re.findall(r"^\[  SKIPPED \] \S+ \(", text, re.M))
print(p + f + s, p, f, s, ",".join(failed) or "-")
EOF
)
    grep -E '^\[==========\] [0-9]+ tests? from .* ran|^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$OUTD/cuda_tests.log" | sed 's/^/  /'
    say "memfit_cuda_tests: exit $rc; $T_TOTAL tests: $T_PASS passed, $T_FAIL failed, $T_SKIP skipped"
    # The tests skip, saying "no CUDA device: <why>", where no GPU is usable (CudaCli's no-GPU test passes).
    why=$(grep -m1 -o '^no CUDA device.*' "$OUTD/cuda_tests.log" || true)
    if [ -n "$why" ] || { [ "$T_TOTAL" -gt 0 ] && [ "$T_PASS" -eq 0 ] && [ "$T_FAIL" -eq 0 ]; }; then
        echo "gpu-check: STOP: no usable GPU here (${GPU_NAME:-?}; memfit_cuda_tests: $T_PASS passed, $T_SKIP skipped${why:+, \"$why\"}); nothing to measure. Files: $OUTD"
        exit 3
    fi
    if [ "$rc" -ge 124 ] || [ "$T_TOTAL" -eq 0 ]; then
        step_failed b "memfit_cuda_tests exit $rc ($([ "$rc" -ge 124 ] && echo "timed out or crashed" || echo "no tests ran")); see cuda_tests.log"
    else
        STATUS[b]=ran
    fi
fi

# ------------------------------------------------------------------------------------------------
say "c. memfit verify --device cuda (fp32)"
VERIFY_OK=0 VERIFY_N=0 VERIFY_DESC=""
if ! $DRY && ! "${MF[@]}" verify --help 2>&1 | grep -q -- '--device'; then
    step_failed c "this memfit has no 'verify --device' (rebuild the bundle from sources that have it)"
else
    for fx in tests/data/gpt2_tiny.safetensors tests/data/gpt2_gelu_tiny.safetensors tests/data/llama_tiny.safetensors tests/data/llama31_tiny.safetensors tests/data/qwen2_tiny.safetensors tests/data/qwen3_tiny.safetensors tests/data/mistral_tiny.safetensors tests/data/phi3_tiny.safetensors tests/data/phi3_longrope_tiny.safetensors; do
        t=$(budget 45 180)
        show "timeout $t memfit verify --device cuda $fx >> $OUTD/verify.log"
        $DRY && continue
        VERIFY_N=$((VERIFY_N + 1))
        timeout -k 5 "$t" "${MF[@]}" verify --device cuda "$fx" >"$SCR/v.json" 2>"$SCR/v.err"
        rc=$?
        { echo "== memfit verify --device cuda $fx: exit $rc"; cat "$SCR/v.json" "$SCR/v.err"; } >>"$OUTD/verify.log"
        res=$(py "$SCR/v.json" <<'EOF'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
    print("ok" if j.get("ok") else "bad", "%.3g" % j["max_error"], j.get("worst", "?"), j.get("device", "?"))
except Exception:
    print("none")
EOF
)
        echo "  $fx: exit $rc, $res $(tail -1 "$SCR/v.err")"
        case "$res" in
            ok*) VERIFY_OK=$((VERIFY_OK + 1)); VERIFY_DESC="$VERIFY_DESC $(basename "$fx" .safetensors)=ok(${res#ok })" ;;
            bad*) VERIFY_DESC="$VERIFY_DESC $(basename "$fx" .safetensors)=FAIL(${res#bad })" ;;
            *) VERIFY_DESC="$VERIFY_DESC $(basename "$fx" .safetensors)=no-result(exit $rc)"
               step_failed c "verify $fx gave no JSON (exit $rc); see verify.log" ;;
        esac
    done
    [ -n "${STATUS[c]:-}" ] || STATUS[c]=ran
fi

# ------------------------------------------------------------------------------------------------
say "d. micro-batch from memfit plan (h200, gpt2, bf16, T=1024, accumulation 1, cap 64)"
PLAN_JSON=$SCR/plan.json
B_WHY=""
if [ -n "$BATCH" ]; then
    B=$BATCH; B_WHY="--batch $BATCH given"
else
    B=""
    for cand in 64 32 16 8; do
        show "memfit plan --hardware h200 --model gpt2 --precision bf16 --seq 1024 --gpus 1 --global-batch $cand --micro-batch $cand --attention flash --recompute none --json"
        $DRY && { B=64; B_WHY="(dry run: the largest of 64/32/16/8 whose plan fits)"; break; }
        timeout 20 "${MF[@]}" plan --hardware h200 --model gpt2 --precision bf16 --seq 1024 --gpus 1 \
            --global-batch "$cand" --micro-batch "$cand" --attention flash --recompute none --json \
            >"$SCR/plan_$cand.json" 2>"$SCR/plan_$cand.err"
        fit=$(py "$SCR/plan_$cand.json" "$cand" <<'EOF'
import json, sys
try:
    b = json.load(open(sys.argv[1]))["best"][0]
    ok = b["fits"] and b["micro_batch"] == int(sys.argv[2]) and b["accumulation"] == 1
    print("yes" if ok else "no", b["memory"]["total"], round(b["tokens_per_s"]), round(b["mfu"], 3))
except Exception as e:
    print("error", type(e).__name__)
EOF
)
        echo "  plan B=$cand: $fit $(head -c 300 "$SCR/plan_$cand.err")"
        if [ "${fit%% *}" = yes ]; then
            B=$cand; cp "$SCR/plan_$cand.json" "$PLAN_JSON"
            B_WHY="largest of 64/32/16/8 the plan fits with accumulation 1 (plan: $fit)"
            break
        fi
        [ "${fit%% *}" = error ] && break
    done
    if [ -z "$B" ]; then B=32; B_WHY="the planner gave no answer; 32 by default"; fi
fi
say "micro-batch B=$B: $B_WHY"
STATUS[d]=ran

# ------------------------------------------------------------------------------------------------
say "e. memfit train --device cuda (gpt2, bf16, T=1024, B=$B, $STEPS steps)"
DATA=$SCR/data-gpt2
RUN=$SCR/memfit_run
show "memfit prepare --tokenizer gpt2 --out $DATA && rm $DATA/val.bin   # no validation split: no evaluation"
train_args=(train --device cuda --model gpt2 --precision bf16 --seq 1024 --batch "$B" --steps "$STEPS"
            --attention flash --recompute none --data "$DATA" --eval-every 0 --sample 0 --log-every 1
            --progress plain --out "$RUN" --tensorboard "$SCR/tb")
t=$(budget 180 100)
show "timeout $t memfit ${train_args[*]} > $OUTD/memfit_train.log"
if ! $DRY; then
    if timeout 60 "${MF[@]}" prepare --tokenizer gpt2 --out "$DATA" >"$SCR/prepare.log" 2>&1; then
        rm -f "$DATA/val.bin"
        tail -1 "$SCR/prepare.log" | cut -c1-200
        timeout -k 10 "$t" "${MF[@]}" "${train_args[@]}" 2>&1 | tee "$OUTD/memfit_train.log" | tail -60
        rc=${PIPESTATUS[0]}
        cp "$RUN/summary.json" "$OUTD/memfit_summary.json" 2>/dev/null
        cp "$RUN/metrics.jsonl" "$OUTD/memfit_metrics.jsonl" 2>/dev/null
        if [ "$rc" -ne 0 ] || [ ! -f "$OUTD/memfit_summary.json" ]; then
            step_failed e "memfit train exit $rc$([ "$rc" -ge 124 ] && echo ' (timed out or killed)'); see memfit_train.log"
        else
            STATUS[e]=ran
            # --tensorboard's files through TensorBoard's own reader (the GPU machine has it).
            py "$SCR/tb/rank0" "$STEPS" <<'PYEOF' 2>&1 | tee -a "$OUTD/memfit_train.log"
import sys
try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:
    print(f"tensorboard EventAccumulator: not run ({e})"); sys.exit(0)
acc = EventAccumulator(sys.argv[1]); acc.Reload()
tags = acc.Tags()["scalars"]
need = ["train/loss", "memory/peak/parameters", "memory/peak/gradients", "memory/peak/optimizer_states",
        "memory/peak/activations"]
missing = [t for t in need if t not in tags]
steps = [e.step for e in acc.Scalars("train/loss")] if "train/loss" in tags else []
ok = not missing and len(steps) == int(sys.argv[2])
print(f"tensorboard EventAccumulator: {len(tags)} scalar tags, train/loss at {len(steps)} steps, "
      f"missing {missing}: {'OK' if ok else 'FAIL'}")
PYEOF
        fi
    else
        cat "$SCR/prepare.log"
        step_failed e "memfit prepare --tokenizer gpt2 failed (data/gpt2-bpe, MEMFIT_DATA_DIR=$ROOT/data)"
    fi
fi

# ------------------------------------------------------------------------------------------------
# Where memfit's step time goes on this GPU: `memfit bench --timeline` (each op timed on its own,
# so the sum exceeds the plain step), the costliest op classes first. Into check.log only.
say "e2. memfit bench --device cuda --timeline (gpt2, bf16, T=1024, micro-batch 16, 3 steps)"
t=$(budget 90 160)
show "timeout $t memfit bench --device cuda --model gpt2 --precision bf16 --seq 1024 --micro-batch 16 --steps 3 --attention flash --timeline"
if ! $DRY; then
    timeout -k 10 "$t" "${MF[@]}" bench --device cuda --model gpt2 --precision bf16 --seq 1024 --micro-batch 16 \
        --steps 3 --attention flash --timeline >"$SCR/bench.json" 2>"$SCR/bench.err"
    rc=$?
    py "$SCR/bench.json" <<'PYEOF' || { tail -5 "$SCR/bench.err"; say "bench --timeline: exit $rc, no table"; }
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f"  bench: {j['tokens_per_s']:.0f} tokens/s, {j['ms_per_step']:.1f} ms/step "
      f"({j['ms_per_step_with_timeline']:.1f} with the timeline)")
print(f"  {'op class':<28} {'calls':>6} {'ms/step':>9} {'share':>6} {'GFLOP/s':>9}")
for c in j["op_classes"][:14]:
    print(f"  {c.get('op', c.get('name', '?')):<28} {c.get('calls', 0):>6} {c.get('ms', c.get('ms_per_step', 0)):>9.2f} "
          f"{100 * c.get('share', 0):>5.1f}% {c.get('gflops', 0):>9.0f}")
PYEOF
fi

# ------------------------------------------------------------------------------------------------
say "f. PyTorch eager (bench/pytorch_gpt2.py, B=$B)"
t=$(budget 150 5)
show "timeout $t python3 bench/pytorch_gpt2.py --batches $B --steps 20 > $OUTD/pytorch.log"
if ! $DRY; then
    PYTHONUNBUFFERED=1 timeout -k 10 "$t" python3 bench/pytorch_gpt2.py --batches "$B" --steps 20 >"$OUTD/pytorch.log" 2>&1
    rc=$?
    tail -5 "$OUTD/pytorch.log"
    if grep -q '^{.*"tokens_per_s"' "$OUTD/pytorch.log"; then
        STATUS[f]=ran
    else
        step_failed f "no result line from bench/pytorch_gpt2.py (exit $rc$(grep -q '"oom": true' "$OUTD/pytorch.log" && echo ', out of memory')); see pytorch.log"
    fi
fi

# ------------------------------------------------------------------------------------------------
# Fine-tuning on the GPU as docs/fine-tune.md runs it on the CPU (bench/fine_tune.sh, smaller): a
# llama-mini pre-trained on the corpus with the 259-token ChatML tokenizer and exported, then LoRA
# and QLoRA (nf4) on chat data with the fine-tuning defaults, each exported (bf16) and generated
# from with --chat on the GPU. Lines into check.log; the table says whether every command ran.
say "h. fine-tune on the GPU (llama-mini, LoRA and QLoRA, export, generate --chat)"
FT=$SCR/ft
t=$(budget 120 10)
show "timeout $t: prepare, train llama-mini 200 steps, export, LoRA and QLoRA --epochs 1, export, generate --device cuda"
if ! $DRY; then
    mkdir -p "$FT"
    python3 bench/make_chat.py "$FT/chat.jsonl" 300 400
    ft_run() { timeout -k 5 "$t" "${MF[@]}" "$@"; }
    ft_ok=true
    (
        cd "$FT" || exit 1
        tok=$ROOT/tests/data/hf-tokenizers/tiny-chat/tokenizer.json
        ft_run prepare --tokenizer "$tok" --out corpus >/dev/null &&
        ft_run train --device cuda --model llama-mini --data corpus --steps 200 --batch 8 --seq 256 --eval-every 0 \
            --sample 0 --out pre --progress plain --log-every 200 | grep -E "^done|device memory" &&
        ft_run export pre/checkpoints --out base >/dev/null &&
        ft_run prepare --format jsonl --input chat.jsonl --tokenizer base/tokenizer.json --out chat >/dev/null || exit 1
        for q in lora qlora; do
            extra=""
            [ "$q" = qlora ] && extra="--base-weights nf4"
            # shellcheck disable=SC2086
            ft_run train --device cuda --model base --data chat --lora-rank 16 $extra --packing --seq 512 \
                --precision bf16 --epochs 1 --out "$q" --progress plain --log-every 1000 |
                grep -E "schedule|LoRA rank|^done|device memory|checkpoint $q" || exit 1
            ft_run export "$q/checkpoints" --merge-lora --out "$q-bf16" || exit 1
            ft_run generate --device cuda --model "$q-bf16" --chat --prompt "Continue the scene after:
ROMEO: But, soft! what light through yonder window breaks?" --temperature 0 --max-new-tokens 60 || exit 1
            echo
        done
    ) 2>&1 | sed 's/^/  /' || ft_ok=false
    [ -f "$FT/qlora-bf16/model.safetensors" ] || ft_ok=false
    if $ft_ok; then STATUS[h]=ran; else step_failed h "a fine-tune command failed (above)"; fi
fi

# ------------------------------------------------------------------------------------------------
if $DRY; then
    say "g. (dry run) the table would be printed from $OUTD/memfit_summary.json, memfit_metrics.jsonl, pytorch.log"
    exit 0
fi
say "g. results"
export GC_OUT=$OUTD GC_B=$B GC_BWHY=$B_WHY GC_STEPS=$STEPS GC_PLAN=$PLAN_JSON GC_GPU="$GPU_NAME"
export GC_TPASS=$T_PASS GC_TFAIL=$T_FAIL GC_TSKIP=$T_SKIP GC_TTOTAL=$T_TOTAL GC_TFAILED=$T_FAILED_NAMES
export GC_VOK=$VERIFY_OK GC_VN=$VERIFY_N GC_VDESC=$VERIFY_DESC GC_ELAPSED=$((SECONDS - T0))
export GC_STATUS
GC_STATUS=$(for k in a b c d e f h; do echo "$k=${STATUS[$k]:-not run}"; done)
py <<'EOF'
import json, os, statistics

E = os.environ
out = E["GC_OUT"]
PEAK = 989e12                     # bf16 dense peak, as bench/pytorch_gpt2.py --peak-tflops default
GiB = 2.0 ** 30

def load(path):
    try:
        return json.load(open(path))
    except Exception:
        return None

res = {"gpu": E["GC_GPU"], "micro_batch": int(E["GC_B"]), "micro_batch_why": E["GC_BWHY"],
       "steps": dict(l.split("=", 1) for l in E["GC_STATUS"].splitlines()),
       "elapsed_s": int(E["GC_ELAPSED"])}
res["cuda_tests"] = {"total": int(E["GC_TTOTAL"]), "passed": int(E["GC_TPASS"]), "failed": int(E["GC_TFAIL"]),
                     "skipped": int(E["GC_TSKIP"]), "failed_names": E["GC_TFAILED"]}
res["verify"] = {"ok": int(E["GC_VOK"]), "runs": int(E["GC_VN"]), "detail": E["GC_VDESC"].strip()}

# memfit
m = None
s = load(os.path.join(out, "memfit_summary.json"))
if s:
    c = s["config"]
    C, L, T = c["n_embd"], c["n_layer"], c["seq"]
    n = c["params"] - 1024 * C                     # GPT-2: parameters less wpe (1024 x C), as the script
    fpt = 6 * n + 12 * L * C * T
    rates = []
    try:
        for line in open(os.path.join(out, "memfit_metrics.jsonl")):
            j = json.loads(line)
            if j.get("step", 0) >= 3:
                rates.append(j["tokens_per_s"])
    except Exception:
        pass
    tps = statistics.median(rates) if rates else s["tokens_per_s"]
    d = s.get("device", {})
    planned_rsv = s["planned"]["reserved"]["total"]
    runtime = d.get("runtime_bytes", 0)
    used = d.get("used_delta_bytes", 0)
    m = {"tokens_per_s": tps, "tokens_per_s_mean_all_steps": s["tokens_per_s"], "steady_steps": len(rates),
         "flops_per_token": fpt, "mfu": tps * fpt / PEAK, "planned_reserved": planned_rsv, "runtime": runtime,
         "predicted": planned_rsv + runtime, "used_delta": used,
         "measured_reserved": s["measured"]["reserved"]["total"],
         # device bytes beyond the runtime (context): as PyTorch's reserved (None: no device measurement)
         "peak": (used - runtime) if used > runtime else None,
         "device": d.get("name"), "final_loss": s.get("final_loss")}
    m["pred_err"] = (m["predicted"] - used) / used if used else None
res["memfit"] = m

# PyTorch
p = None
try:
    for line in open(os.path.join(out, "pytorch.log")):
        if line.startswith("{") and '"tokens_per_s"' in line:
            p = json.loads(line)
except Exception:
    pass
res["pytorch"] = p
plan = load(E["GC_PLAN"])
if plan:
    b = plan["best"][0]
    res["plan"] = {"tokens_per_s": b["tokens_per_s"], "mfu": b["mfu"], "memory_total": b["memory"]["total"],
                   "per_device": b["memory"]["per_device"]}

def f_tps(x): return "%.0f" % x
def f_pct(x): return "%.1f%%" % (100 * x)
def f_gib(x): return "%.2f GiB" % (x / GiB)
na = "n/a"

rows = [("impl", "tokens/s", "MFU", "predicted mem", "measured peak", "pred/meas")]
if m:
    rows.append(("memfit", f_tps(m["tokens_per_s"]), f_pct(m["mfu"]), f_gib(m["predicted"]),
                 f_gib(m["used_delta"]), "%+.2f%%" % (100 * m["pred_err"]) if m["pred_err"] is not None else na))
else:
    rows.append(("memfit", na, na, na, na, na))
if p:
    rows.append(("pytorch-eager", f_tps(p["tokens_per_s"]), f_pct(p["mfu"]), "-", f_gib(p["peak_reserved"]), "-"))
else:
    rows.append(("pytorch-eager", na, na, "-", na, "-"))
if "plan" in res:
    rows.append(("memfit plan", f_tps(res["plan"]["tokens_per_s"]), f_pct(res["plan"]["mfu"]),
                 f_gib(res["plan"]["memory_total"]), "-", "-"))
if m and p:
    rows.append(("memfit/pytorch", "%.2fx" % (m["tokens_per_s"] / p["tokens_per_s"]), "%.2fx" % (m["mfu"] / p["mfu"]),
                 "-", "%.2fx" % (m["peak"] / p["peak_reserved"]) if m["peak"] is not None else na, "-"))
w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
lines = []
def emit(s=""):
    lines.append(s)
emit("GPT-2 124M, bf16, T=1024, micro-batch %d (%s), on %s" % (res["micro_batch"], res["micro_batch_why"],
                                                              (m or {}).get("device") or res["gpu"]))
for i, r in enumerate(rows):
    emit("  ".join(c.ljust(w[k]) if k == 0 else c.rjust(w[k]) for k, c in enumerate(r)))
    if i == 0:
        emit("  ".join("-" * x for x in w))
emit("memfit: tokens/s = median of steps 3..%s (mean over all steps %s); predicted = planned reserved %s + runtime %s;"
     % (E["GC_STEPS"], f_tps(m["tokens_per_s_mean_all_steps"]) if m else na, f_gib(m["planned_reserved"]) if m else na,
        f_gib(m["runtime"]) if m else na))
emit("        measured peak = device bytes used by the process (cudaMemGetInfo delta, context included); the memory")
emit("        ratio and target compare memfit's bytes beyond its runtime (%s) with PyTorch's max_memory_reserved."
     % (f_gib(m["peak"]) if m and m["peak"] is not None else na))
emit("MFU: tokens/s x (6 x (params - wpe) + 12 x L x C x T) / 989 TFLOP/s, as bench/pytorch_gpt2.py.")

def target(name, ok, detail):
    return (name, "n/a" if ok is None else ("PASS" if ok else "FAIL"), detail)

ct = res["cuda_tests"]
t = [
    target("MFU >= 40%", m and m["mfu"] >= 0.40, f_pct(m["mfu"]) if m else na),
    target("tokens/s >= 1.2x PyTorch", (m["tokens_per_s"] >= 1.2 * p["tokens_per_s"]) if (m and p) else None,
           "%.2fx" % (m["tokens_per_s"] / p["tokens_per_s"]) if (m and p) else na),
    target("memfit peak <= PyTorch peak reserved",
           (m["peak"] <= p["peak_reserved"]) if (m and p and m["peak"] is not None) else None,
           "%s vs %s" % (f_gib(m["peak"]), f_gib(p["peak_reserved"])) if (m and p and m["peak"] is not None) else na),
    target("predicted within 2% of measured", (abs(m["pred_err"]) <= 0.02) if (m and m["pred_err"] is not None) else None,
           "%+.2f%%" % (100 * m["pred_err"]) if (m and m["pred_err"] is not None) else na),
    target("GPU tests all passed", (ct["failed"] == 0 and ct["passed"] > 0) if ct["total"] else None,
           "%d passed, %d failed, %d skipped%s" % (ct["passed"], ct["failed"], ct["skipped"],
                                                  "" if ct["failed"] == 0 else ": " + ct["failed_names"])),
    target("verify passed (fp32, every fixture)",
           (res["verify"]["ok"] == res["verify"]["runs"]) if res["verify"]["runs"] else None,
           res["verify"]["detail"] or na),
]
res["targets"] = [{"target": a, "result": b, "detail": c} for a, b, c in t]
emit()
tw = max(len(a) for a, _, _ in t)
for a, b, c in t:
    emit("%s  %-4s  %s" % (a.ljust(tw), b, c))
emit("targets met: %d of %d; steps: %s" % (sum(b == "PASS" for _, b, _ in t), len(t),
                                           ", ".join("%s %s" % kv for kv in res["steps"].items())))
json.dump(res, open(os.path.join(out, "results.json"), "w"), indent=1)
print("\n".join(lines))
EOF
say "files in $OUTD: $(cd "$OUTD" && ls | tr '\n' ' ')"
exit $FAILED_TO_RUN
