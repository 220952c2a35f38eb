#!/usr/bin/env bash
# The main job: install dependencies, build, and train the default small GPT on the bundled
# Shakespeare on the CPU, ending with the memory report (planned vs measured) and a text sample.
# Extra arguments go to `memfit train`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
MEMFIT_BUILD_TARGET=memfit bash scripts/build.sh
exec ./build/memfit train "$@"
