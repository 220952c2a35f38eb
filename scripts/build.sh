#!/usr/bin/env bash
# Configures and builds memfit into build/ (Release, warnings as errors).
# MEMFIT_BUILD_TARGET=memfit builds only the command (the demo does); default: everything.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEMFIT_WERROR=ON "$@" >/dev/null
cmake --build build -j "$(nproc)" ${MEMFIT_BUILD_TARGET:+--target "$MEMFIT_BUILD_TARGET"}
