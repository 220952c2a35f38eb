#!/usr/bin/env bash
# The map of src/: fails when a file under src/<layer>/ includes a header of a layer it may not
# reach, i.e. one that is not below it in the table. Run by CTest (test `layers`); by hand:
#   bash scripts/check-layers.sh
# CMakeLists.txt reads the same table: each layer's library links exactly the layers its row
# names, so the linker and this check enforce one set of arrows. docs/design.md ("The map")
# describes the layers.
set -euo pipefail
cd "$(dirname "$0")/.."

# ---- the map ----------------------------------------------------------------------------------
# layer: the layers directly below it. A file of the layer may include its own layer's headers
# and those of every layer reachable through the table (app reaches train through infer, and so
# on down to core). A layer without a folder yet (run/) is allowed.
MAP=$(cat <<'MAP'
core:
memory:     core
backend:    memory
comm:       backend
tokenizer:  core
model:      backend
run:        model
data:       tokenizer
train:      run model comm
infer:      train
plan:       infer
report:     memory
app:        infer plan report data
cli:        app
MAP
)
# Within backend/: the CPU and CUDA backends do not include each other (what both need is in
# backend/ itself, e.g. backend/quant_format.h), and the planner includes neither (it sizes
# through the Backend interface: backend/cuda_sizing.h, make_backend.h).
FORBIDDEN=(
    "backend/cuda/ backend/cpu/"
    "backend/cpu/ backend/cuda/"
    "plan/ backend/cpu/"
    "plan/ backend/cuda/"
)
# -------------------------------------------------------------------------------------------------

declare -A below=()   # layer -> the layers its row names
layers=()
while IFS= read -r line; do
    [ -n "$line" ] || continue
    name=${line%%:*}
    below[$name]=$(echo "${line#*:}" | xargs)
    layers+=("$name")
done <<<"$MAP"

declare -A reach=()   # layer -> every layer below it, transitively
reach_of() {
    local l=$1 seen=" " stack=() d
    read -r -a stack <<<"${below[$l]}"
    while [ ${#stack[@]} -gt 0 ]; do
        d=${stack[-1]}
        unset 'stack[-1]'
        [[ $seen == *" $d "* ]] && continue
        if [ -z "${below[$d]+x}" ]; then
            echo "check-layers: the map names '$d' (below $l), which has no row" >&2
            exit 2
        fi
        seen+="$d "
        local more=()
        read -r -a more <<<"${below[$d]}"
        stack+=("${more[@]}")
    done
    echo "$seen"
}
for l in "${layers[@]}"; do
    reach[$l]=$(reach_of "$l")
    if [[ ${reach[$l]} == *" $l "* ]]; then
        echo "check-layers: the map has a cycle through $l" >&2
        exit 2
    fi
done

fail=0
for dir in src/*/; do
    l=$(basename "$dir")
    if [ -z "${below[$l]+x}" ]; then
        echo "check-layers: src/$l/ is not in the map (scripts/check-layers.sh): add its row" >&2
        fail=1
    fi
done

# Every quoted include whose first path component is a folder of src/ or a layer of the map.
while IFS= read -r hit; do
    file=${hit%%:*}
    rest=${hit#*:}
    lineno=${rest%%:*}
    [[ ${rest#*:} =~ \"([^\"]+)\" ]] || continue
    inc=${BASH_REMATCH[1]}
    [[ $inc == */* ]] || continue
    from=${file#src/}
    from=${from%%/*}
    to=${inc%%/*}
    [ -n "${below[$to]+x}" ] || [ -d "src/$to" ] || continue
    if [ "$to" != "$from" ] && [[ ${reach[$from]:-} != *" $to "* ]]; then
        echo "$file:$lineno: $from includes $inc, but $to is not below $from in the map"
        fail=1
        continue
    fi
    for rule in "${FORBIDDEN[@]}"; do
        src_prefix=${rule%% *}
        inc_prefix=${rule#* }
        if [[ ${file#src/} == "$src_prefix"* && $inc == "$inc_prefix"* ]]; then
            echo "$file:$lineno: includes $inc (${src_prefix} may not include ${inc_prefix})"
            fail=1
        fi
    done
done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' src \
             --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' | sort)

if [ $fail -ne 0 ]; then
    echo "check-layers: FAILED: dependencies point down (docs/design.md, \"The map\")" >&2
    exit 1
fi
echo "check-layers: ${#layers[@]} layers, every include points down"
