#!/usr/bin/env bash
# Install dependencies, build, and run the whole test suite (CTest + GoogleTest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --test
bash scripts/build.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
ctest --test-dir build --output-on-failure -j 2 --timeout 900
# The fuzz targets over their corpora (seeds and fixed crashers) plus a short search: 2 x 20 s.
bash scripts/fuzz.sh 20
