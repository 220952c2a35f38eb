#!/usr/bin/env bash
# `memfit prepare` time on one long conversation: a JSONL of 10 records whose first is a
# conversation of N turns (N/2 user and N/2 assistant messages), with Qwen3's tokenizer.json and
# chat template, for N = 1,000, 4,000 and 16,000; then 16,000 turns with a template that has no
# end-of-turn text (a blank line after each message). One line each: the turns, the template, the
# wall seconds, the peak RSS. The target: 16,000 turns under 15 s (it took minutes when every turn was rendered by
# itself, data/instruct.h's TurnSearch).
set -euo pipefail
cd "$(dirname "$0")/.."
M=${MEMFIT:-build/memfit}
TOK=tests/data/hf-tokenizers/qwen3/tokenizer.json
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
printf '%s' "{% for m in messages %}{{ m.role }}: {{ m.content }}

{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}" > "$W/plain.jinja"
for run in 1000:auto 4000:auto 16000:auto 16000:plain; do
    n=${run%%:*} t=${run#*:}
    tflag=$([ "$t" = plain ] && echo "--chat-template $W/plain.jinja" || echo "")
    python3 - "$n" > "$W/turns.jsonl" <<'PY'
import json, sys
n = int(sys.argv[1])
msgs = []
for i in range(n // 2):
    msgs.append({"role": "user", "content": f"Question {i}?"})
    msgs.append({"role": "assistant", "content": f"Answer {i}."})
print(json.dumps({"messages": msgs}))
for _ in range(9):
    print(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}))
PY
    # shellcheck disable=SC2086
    /usr/bin/time -f "{\"turns\": $n, \"template\": \"$t\", \"wall_s\": %e, \"peak_rss_kb\": %M}" \
        "$M" prepare --format jsonl --tokenizer "$TOK" --input "$W/turns.jsonl" --out "$W/out$n$t" $tflag > /dev/null
done
