#!/usr/bin/env bash
# Builds the whole tree (C++, CUDA objects and the CUDA emulator where nvcc is present, tests) for
# several CPU targets with warnings as errors, and fails if any build prints a warning at all
# (GCC's flow-dependent warnings are not errors, CMakeLists.txt: they must still not appear).
#
#   bash scripts/check-targets.sh                       # x86-64-v3 (AVX2), x86-64-v4 (AVX-512), native
#   bash scripts/check-targets.sh x86-64-v3 native      # just these
#
# Build folders: build-arch-<target>/ (ignored by git), rebuilt from clean so that every object's
# warnings are seen; log: build-arch-<target>/check-targets.log. About 10 minutes a target on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(x86-64-v3 x86-64-v4 native)
fail=0
for t in "${targets[@]}"; do
    dir="build-arch-$t"
    log="$dir/check-targets.log"
    mkdir -p "$dir"
    echo "check-targets: -march=$t into $dir"
    if ! { cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEMFIT_WERROR=ON -DMEMFIT_ARCH="$t" &&
           cmake --build "$dir" -j "$(nproc)" --clean-first; } >"$log" 2>&1; then
        echo "check-targets: $t: build FAILED (see $log)"; grep -m 20 -E 'error|warning' "$log" || true
        fail=1
        continue
    fi
    n=$(grep -c -E '(^|: )warning[: ]' "$log" || true)
    if [ "$n" -gt 0 ]; then
        echo "check-targets: $t: $n warning lines (see $log)"; grep -m 20 -E '(^|: )warning[: ]' "$log"
        fail=1
    else
        echo "check-targets: $t: clean"
    fi
done
exit $fail
