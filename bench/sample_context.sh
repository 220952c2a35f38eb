#!/usr/bin/env bash
# Does text past the trained context read as well as before it? Trains the default run (`micro`:
# 256 positions, trained on 128), exports it, and generates 250 characters for 20 seeds two ways:
# within the trained context (the default: the window slides) and with --seq 256 (walking into
# positions 128-255, which training never reached). Score: the fraction of words that occur in
# the corpus, in characters 0-127 and 128-249 (median over the seeds). One JSON line per way.
# About a minute on 2 cores; OUT (default runs/sample-context) holds the run.
set -euo pipefail
cd "$(dirname "$0")/.."
M=${MEMFIT:-build/memfit}
OUT=${OUT:-runs/sample-context}
rm -rf "$OUT"
"$M" train --out "$OUT" --checkpoint-every 1500 --progress quiet --sample 0
"$M" export "$OUT/checkpoints" --out "$OUT/hf" >/dev/null
python3 - "$M" "$OUT/hf" <<'PY'
import json, re, statistics, subprocess, sys
m, folder = sys.argv[1], sys.argv[2]
corpus = set(re.findall(r"[a-z']+", open("data/tinyshakespeare.txt").read().lower()))
def score(text):
    words = re.findall(r"[A-Za-z']+", text)
    return sum(w.lower() in corpus for w in words) / max(1, len(words))
for way, extra in (("within the trained context (default)", []), ("--seq 256: past it", ["--seq", "256"])):
    first, second = [], []
    for seed in range(1, 21):
        out = subprocess.run([m, "generate", "--model", folder, "--prompt", "\n", "--max-new-tokens", "250",
                              "--seed", str(seed)] + extra, capture_output=True, text=True, errors="replace").stdout[1:]
        first.append(score(out[:128]))
        second.append(score(out[128:250]))
    print(json.dumps({"generation": way, "words_in_corpus_chars_0_127": round(statistics.median(first), 3),
                      "words_in_corpus_chars_128_249": round(statistics.median(second), 3)}))
PY
