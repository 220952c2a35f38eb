#!/usr/bin/env bash
# Install dependencies, build, and run the whole test suite (CTest + GoogleTest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --test
bash scripts/build.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
# Two tests run at once on 2 cores: idle OpenMP threads sleep instead of spinning, or each test's
# spinning threads starve the other's (measured: the suite's CTest time 338 s -> 100 s).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
status=0
ctest --test-dir build --output-on-failure -j 2 --timeout 900 || status=$?
# Where the time went (CI's limit: the suite under 25 minutes on 2 cores): the slowest tests.
bash scripts/test-times.sh build 15 || true
[ "$status" -eq 0 ] || exit "$status"
# The 8 fuzz targets over their corpora (seeds and fixed crashers) plus a short search: 8 x 5 s
# (their build, each library source compiled once; at -O0, which compiles in 65% of -O1's time).
FUZZ_OPT=-O0 bash scripts/fuzz.sh 5
