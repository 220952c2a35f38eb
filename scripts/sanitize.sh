#!/usr/bin/env bash
# Builds memfit and its tests with AddressSanitizer + UBSan into build-asan/ (RelWithDebInfo,
# CUDA off) and runs the tests that drive the command end to end: the CLI, hostile-input, stop and
# signal tests, checkpoints, and the MPI runs (kills, preemption, offload, ZeRO 0-3).
# Any sanitizer report fails the run (halt_on_error); the log is build-asan/sanitize.log.
#   bash scripts/sanitize.sh              # build + the default selection
#   bash scripts/sanitize.sh 'Cli\.'      # build + the tests whose names match a ctest -R regex
# On 2 cores: build about 25 min, the default selection about 20 min.
set -euo pipefail
cd "$(dirname "$0")/.."
SELECT=${1:-'^(Cli|CliHostile|CliInstruct|CliWatch|PlanToRun|StopRequest|Checkpoint|CheckpointShards|OffloadStoreTest|JsonRead|ChatTemplate|HfTokenizer|Instruct|mpi_|cli_)'}
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEMFIT_SANITIZE=ON \
  -DMEMFIT_CUDA=OFF -DMEMFIT_WERROR=ON >/dev/null
cmake --build build-asan -j "$(nproc)" --target memfit memfit_tests memfit_mpi_tests
# detect_leaks=0: the run's arenas live until exit by design; leak checking reports them all.
# quarantine_size_mb=64 (default 256): freed memory waits there, counted in the RSS that
# ChatTemplate.LoopsRetainNoMemoryPerIteration bounds to 150 MiB of growth.
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=0:abort_on_error=0:detect_stack_use_after_return=0:quarantine_size_mb=64
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive
set +e
ctest --test-dir build-asan -R "$SELECT" -j "$(nproc)" --timeout 1800 --output-on-failure \
  >build-asan/sanitize.log 2>&1
rc=$?
set -e
grep -E "tests passed|tests failed|The following tests" -A 30 build-asan/sanitize.log | head -40
if grep -qE "ERROR: AddressSanitizer|runtime error:" build-asan/sanitize.log; then
  echo "sanitize: sanitizer reports in build-asan/sanitize.log:" >&2
  grep -E "ERROR: AddressSanitizer|runtime error:" build-asan/sanitize.log | sort | uniq -c | head -20 >&2
  exit 1
fi
exit $rc
