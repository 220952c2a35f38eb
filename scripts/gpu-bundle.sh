#!/usr/bin/env bash
# Build a Release CUDA memfit here and pack what the GPU machine needs into .gpu/ (ignored; carry it).
#
#   bash scripts/gpu-bundle.sh      # configure + build build-gpu/ (incremental), then fill .gpu/
#
# .gpu/ afterwards:
#   bin/memfit.xz, bin/memfit_cuda_tests.xz   stripped, xz-compressed (gpu-check.sh unpacks them)
#   bin/libmemfit_cuda.so.xz                  the CUDA backend, memfit's plug-in (loaded from beside it)
#   lib/                                every shared library they need that the GPU machine lacks
#                                       (oneDNN, OpenMPI, fmt, sentencepiece, pcre2, gomp, hwloc, ...);
#                                       libraries over 4 MiB are stored xz-compressed (NAME.xz):
#                                       scripts/gpu-check.sh unpacks them there
#   lib/cxx/                            this machine's libstdc++ and libgcc_s, used there only when the
#                                       system's are too old for the binaries (gpu-check.sh decides)
#   MANIFEST                            commit, source fingerprint, glibc needed, sizes
# Not bundled: the C runtime (libc, libm, libdl, libpthread, librt, ld-linux) and the CUDA libraries
# (libcuda, libcudart, libcublas, libcublasLt, libnccl, libnvidia-*): the GPU machine has those
# (/usr/local/cuda/lib64 and python3's site-packages/nvidia/*/lib).
#
# Then, with the device tool: carry [".gpu"], command `bash scripts/gpu-check.sh`.
# MEMFIT_ARCH=x86-64-v3 (any AVX2 CPU): a portable target, since the GPU machine's CPU may lack
# this one's extensions (AVX-512 here); gpu-check.sh checks the host has AVX2 before running.
# The binaries embed this checkout's absolute path for data/ (MEMFIT_SOURCE_DIR); on the GPU machine
# gpu-check.sh sets MEMFIT_DATA_DIR=$PWD/data (src/core/paths.cpp reads it first).
set -euo pipefail

LIMIT_MIB=60
BUILD="build-gpu"
DEST=".gpu"
for a in "$@"; do
    case "$a" in
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "gpu-bundle: unknown argument '$a' (see --help)" >&2; exit 2 ;;
    esac
done

cd "$(dirname "$0")/.."
root=$PWD
die() { echo "gpu-bundle: $*" >&2; exit 1; }

ARCH="x86-64-v3"
grep -q 'MEMFIT_ARCH' CMakeLists.txt || die "CMakeLists.txt has no MEMFIT_ARCH setting"
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || die "nvcc not found: the CUDA build needs the CUDA toolkit"
export PATH="$PATH:/usr/local/cuda/bin"

# The sources the binaries come from (gpu-check.sh compares it with the tree it runs in).
fingerprint() { find src tests/cuda CMakeLists.txt -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16; }
fp_before=$(fingerprint)

# ---- build (incremental) ----
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEMFIT_ARCH="$ARCH" -DMEMFIT_WERROR=ON \
      -DMEMFIT_CUDA=ON -DMEMFIT_TESTS=ON
grep -q '^MEMFIT_CUDA:BOOL=ON' "$BUILD/CMakeCache.txt" || die "$BUILD is not a CUDA build (MEMFIT_CUDA off)"
grep -q "^MEMFIT_ARCH:STRING=$ARCH\$" "$BUILD/CMakeCache.txt" || die "$BUILD: MEMFIT_ARCH is not $ARCH"
cmake --build "$BUILD" --target memfit memfit_cuda_tests -j "$(nproc)"
for b in memfit memfit_cuda_tests; do
    [ -x "$BUILD/$b" ] || die "$BUILD/$b missing after the build"
done
fp_after=$(fingerprint)
[ "$fp_before" = "$fp_after" ] || die "sources under src/, tests/cuda or CMakeLists.txt changed during the build: run it again"

# ---- the .gpu folder, ignored by git ----
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
touch "$exclude"
grep -qxF '/.gpu/' "$exclude" || echo '/.gpu/' >>"$exclude"
git check-ignore -q "$DEST/x" || die "$DEST is not ignored by git (check $exclude)"

rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/lib/cxx"
for b in memfit memfit_cuda_tests; do
    strip -o "$DEST/bin/$b" "$BUILD/$b"
    chmod 755 "$DEST/bin/$b"
done
# The CUDA backend is memfit's plug-in, loaded from beside the binary (backend/cuda_plugin.h).
[ -f "$BUILD/libmemfit_cuda.so" ] || die "$BUILD/libmemfit_cuda.so missing after the build"
strip --strip-unneeded -o "$DEST/bin/libmemfit_cuda.so" "$BUILD/libmemfit_cuda.so"

# Shared libraries: everything ldd resolves, except the C runtime and CUDA's own.
skip_re='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libutil\.so|libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so|libnvidia-)'
cxx_re='^(libstdc\+\+\.so|libgcc_s\.so)'
missing=$(ldd "$BUILD/memfit" "$BUILD/memfit_cuda_tests" "$BUILD/libmemfit_cuda.so" | grep 'not found' || true)
[ -z "$missing" ] || die "unresolved libraries here: $missing"
ldd "$BUILD/memfit" "$BUILD/memfit_cuda_tests" "$BUILD/libmemfit_cuda.so" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
while read -r name path; do
    if [[ $name =~ $skip_re ]]; then continue; fi
    if [[ $name =~ $cxx_re ]]; then cp -L "$path" "$DEST/lib/cxx/$name"; else cp -L "$path" "$DEST/lib/$name"; fi
done
chmod 644 "$DEST"/lib/*.so* "$DEST"/lib/cxx/*.so* 2>/dev/null || true

# The highest glibc / libstdc++ symbol versions anything in the bundle asks for.
maxver() { objdump -T "$DEST"/bin/* "$DEST"/lib/*.so* "$DEST"/lib/cxx/*.so* 2>/dev/null |
           grep -o "$1[0-9.]*" | sort -uV | tail -1; }
need_glibc=$(maxver 'GLIBC_2\.')
need_cxx=$(maxver 'GLIBCXX_3\.')
raw=$(du -sb "$DEST" | cut -f1)

# Compress the big libraries (oneDNN is ~38 MiB raw, ~8 MiB as xz) and the two binaries (38 MiB
# raw, 6.5 as xz; gpu-check.sh unpacks them): more room for the working tree.
find "$DEST/lib" -maxdepth 1 -name '*.so*' -size +4M -print0 | xargs -0 -r xz -T0 -6
xz -T0 -6 "$DEST/bin/memfit" "$DEST/bin/memfit_cuda_tests" "$DEST/bin/libmemfit_cuda.so"
packed=$(du -sb "$DEST" | cut -f1)

{
    echo "built_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src tests CMakeLists.txt || echo '+dirty')"
    echo "source_fingerprint=$fp_after"
    echo "build_dir=$root/$BUILD"
    echo "march=$ARCH"
    echo "nvcc=$(nvcc --version | grep -o 'release [0-9.]*' | head -1)"
    echo "glibc_needed=$need_glibc"
    echo "glibcxx_needed=$need_cxx"
    echo "raw_bytes=$raw"
    echo "bytes=$packed"
    echo "libs=$(find "$DEST/lib" -maxdepth 1 -type f -printf '%f ' | tr ' ' '\n' | sort | tr '\n' ' ')"
    echo "cxx_libs=$(find "$DEST/lib/cxx" -maxdepth 1 -type f -printf '%f ' | tr ' ' '\n' | sort | tr '\n' ' ')"
} >"$DEST/MANIFEST"

echo
echo "gpu-bundle: $DEST ready"
cat "$DEST/MANIFEST"
du -ah "$DEST" | sort -k2
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
echo "gpu-bundle: total $(mib "$packed") MiB (uncompressed $(mib "$raw") MiB), limit $LIMIT_MIB MiB"
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
echo "gpu-bundle: the working tree that travels with it: $(mib "$tree") MiB; together $(mib $((tree + packed))) MiB of 64"
[ "$((tree + packed))" -le $((LIMIT_MIB * 1048576)) ] ||
    die "the bundle and the working tree are $(mib $((tree + packed))) MiB, over $LIMIT_MIB MiB (64 travel, some left for carried runs)"
echo "gpu-bundle: next: device run with carry [\".gpu\"] and command 'bash scripts/gpu-check.sh'"
