#!/usr/bin/env bash
# A hostile chat template under a 2 GB address-space limit (`ulimit -v 2000000`): two nested
# range(3000) loops that set a variable each iteration (9M iterations per record, 10 records; it held 5.5 GB before
# loops let go of their scopes), then a string that doubles each iteration (stopped at the 64 MiB
# budget). One line each: what ran, the exit code, the wall seconds, the peak RSS, the message.
# The target: both end within 60 s, the first with exit 0, the second with one line and exit 1.
set -uo pipefail
cd "$(dirname "$0")/.."
M=${MEMFIT:-build/memfit}
TOK=tests/data/hf-tokenizers/qwen3/tokenizer.json
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
for _ in 1 2 3 4 5 6 7 8 9 10; do
    echo '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'
done > "$W/chat.jsonl"
cat > "$W/loops.jinja" <<'J'
{% for i in range(3000) %}{% for j in range(3000) %}{% set k = i + j %}{% endfor %}{% endfor %}{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}
J
cat > "$W/doubling.jinja" <<'J'
{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}
J
for t in loops doubling; do
    ( ulimit -v 2000000
      /usr/bin/time -o "$W/time" -f "%e %M" "$M" prepare --format jsonl --tokenizer "$TOK" --input "$W/chat.jsonl" \
          --chat-template "$W/$t.jinja" --out "$W/out-$t" > /dev/null 2> "$W/err" )
    rc=$?
    read -r wall rss < <(tail -1 "$W/time")
    msg=$(grep -v "Command exited" "$W/err" | head -c 300 | tr '\n' ' ')
    echo "{\"template\": \"$t\", \"exit\": $rc, \"wall_s\": $wall, \"peak_rss_kb\": $rss, \"stderr\": \"${msg//\"/\\\"}\"}"
done
