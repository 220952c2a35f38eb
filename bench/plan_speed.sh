#!/usr/bin/env bash
# Search speed of `memfit plan`: candidates evaluated per second for the issue's examples
# (llama2-70b on 64 and on 1024 H100s), median of 5 runs each. Prints one JSON line per case.
set -euo pipefail
cd "$(dirname "$0")/.."
M=${MEMFIT:-build/memfit}
for gpus in 64 1024; do
  python3 - "$M" "$gpus" <<'PY'
import json, statistics, subprocess, sys
m, gpus = sys.argv[1], sys.argv[2]
runs = []
for _ in range(5):
    out = subprocess.run([m, "plan", "--model", "llama2-70b", "--hardware", "h100-80g", "--gpus", gpus, "--seq", "4096",
                          "--global-batch", "1024", "--json"], check=True, capture_output=True, text=True).stdout
    runs.append(json.loads(out))
secs = statistics.median(r["seconds"] for r in runs)
print(json.dumps({"gpus": int(gpus), "evaluated": runs[0]["evaluated"], "median_search_s": secs,
                  "candidates_per_s": round(runs[0]["evaluated"] / secs)}))
PY
done
