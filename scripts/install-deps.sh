#!/usr/bin/env bash
# Installs everything memfit needs from Debian 12 packages. Idempotent; run as root (or with sudo).
# --test also installs what only the tests need (Chromium, to render the HTML report headless;
# clang and its libFuzzer runtime, for the fuzz targets' regression run; procps, for pgrep; tmux,
# for the monitor's terminal test).
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
PKGS=(
  build-essential cmake ninja-build pkg-config git
  libdnnl-dev            # oneDNN: matmuls on the CPU
  ocl-icd-opencl-dev opencl-c-headers  # dnnl-config.cmake looks for OpenCL (Debian builds oneDNN with it)
  libomp-dev             # OpenMP runtime headers (g++ ships libgomp; kept for clang builds)
  nlohmann-json3-dev     # JSON configs, metrics, summaries
  libcli11-dev           # command line
  libfmt-dev             # formatting
  libgtest-dev googletest # tests
  libpcre2-dev           # GPT-2 pre-tokenisation regex (Unicode classes)
  libsentencepiece-dev   # SentencePiece tokenizers (LLaMA folders)
  libicu-dev             # NFC normalisation of Hugging Face tokenizer.json files
  libopenmpi-dev openmpi-bin  # MPI: data-parallel ranks (src/comm) and `mpirun -np N memfit train`
)
if [ "${1:-}" = "--test" ]; then
  PKGS+=(chromium fonts-dejavu-core)   # headless rendering of report.html in the tests
  PKGS+=(clang libclang-rt-14-dev)     # scripts/fuzz.sh
  PKGS+=(procps)                       # pgrep: tests/mpi_train/rank_killed.sh finds a rank's process
  PKGS+=(tmux)                         # tests/mpi_train/monitor.sh: `memfit monitor` in a terminal
fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all packages present"
fi
