#!/usr/bin/env bash
# Configures and builds memfit into build/ (Release, warnings as errors).
# MEMFIT_BUILD_TARGET=memfit builds only the command (the demo does); default: everything.
# A new build/ uses CMake's default generator (Unix Makefiles), as a user's `cmake -S . -B b`
# does, so CI builds that way; MEMFIT_GENERATOR=Ninja picks another. An existing build/ keeps
# the generator it was configured with.
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
[ -f build/CMakeCache.txt ] || generator=(-G "${MEMFIT_GENERATOR:-Unix Makefiles}")
cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DMEMFIT_WERROR=ON "$@" >/dev/null
cmake --build build -j "$(nproc)" ${MEMFIT_BUILD_TARGET:+--target "$MEMFIT_BUILD_TARGET"}
