# The "hostile" section of scripts/adversarial.sh (sourced by it; uses its try, out, MEMFIT, SRC,
# W, TA, T and the fixtures base/, model/, data/): files from strangers (issue 50). Deep and huge
# JSON in every reader, special files where files go, chat templates that try to exhaust memory,
# edited checkpoints, hostile instruction data, monitor on runs that are not runs, and the flags
# added since the last pass. python3 writes the files.

section_hostile() {
    local Q=$SRC/tests/data/hf-tokenizers/qwen3
    python3 - "$Q" <<'PY'
import json, os, sys
q = sys.argv[1]
deep_a = "[" * 20000 + "]" * 20000
deep_o = '{"a": ' * 20000 + "1" + "}" * 20000
os.makedirs("h", exist_ok=True)
open("h/deep_a.json", "w").write(deep_a)
open("h/deep_o.json", "w").write(deep_o)
tok = json.load(open(q + "/tokenizer.json"))
for part in ("normalizer", "decoder", "pre_tokenizer", "post_processor"):
    os.makedirs("h/tok_" + part, exist_ok=True)
    text = json.dumps(tok).replace('"%s": ' % part, '"%s": %s, "x_%s": ' % (part, deep_o, part), 1)
    open("h/tok_%s/tokenizer.json" % part, "w").write(text)
os.makedirs("h/tc_deep", exist_ok=True)
open("h/tc_deep/tokenizer.json", "w").write(json.dumps(tok))
open("h/tc_deep/tokenizer_config.json", "w").write('{"chat_template": "x", "added_tokens_decoder": %s}' % deep_o)
os.makedirs("h/cfg_deep", exist_ok=True)
open("h/cfg_deep/config.json", "w").write('{"model_type": "llama", "rope_scaling": %s}' % deep_o)
chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
good = "\n".join([json.dumps(chat)] * 10) + "\n"
open("h/good.jsonl", "w").write(good)
open("h/deep.jsonl", "w").write(good + '{"messages": %s}\n' % deep_a)
open("h/huge_line.jsonl", "w").write(good + '{"messages": [{"role": "user", "content": "' + "x" * (65 << 20) + '"}]}\n')
odd = ['null', '[]', '1', '"s"', '{"messages": "x"}', '{"messages": [{"role": 7, "content": "a"}]}',
       '{"messages": [{"role": "user", "content": {"a": 1}}]}', '{"messages": [{"role": "user"}]}',
       '{"prompt": 1, "completion": 2}', '{"conversations": [{"from": "gpt"}]}', '{"instruction": null}']
for i, line in enumerate(odd):
    open("h/odd%d.jsonl" % i, "w").write(good + line + "\n")
open("h/badutf8.jsonl", "wb").write(good.encode() + b'{"messages": [{"role": "user", "content": "\xff\xfe"}, '
                                    b'{"role": "assistant", "content": "\xc3"}]}\n')
open("h/nul.json", "wb").write(b'{"steps": 2\x00}')
open("h/bom.json", "wb").write(b'\xef\xbb\xbf{"steps": 2}')
for name, text in {"big_num": '{"steps": 1e400}', "dup": '{"steps": 2, "steps": 3}', "trunc": '{"steps": ',
                   "empty": "", "str": '"train"', "long_key": '{"%s": 1}' % ("k" * 1000000),
                   "long_val": '{"model": "%s"}' % ("m" * 10000000)}.items():
    open("h/%s.json" % name, "w").write(text)
templates = {
    "double": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "ljust": "{{ 'x'.ljust(2**40) }}", "center": "{{ 'x'.center(2**40) }}", "indent": "{{ 'a' | indent(10**9) }}",
    "tojson": "{{ messages | tojson(indent=10**9) }}", "replace": "{{ ('ab' * 1000000).replace('', 'x' * 1000) }}",
    "list": "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
    "fan": "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}",
    "recurse": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "raise": "{{ raise_exception('A' * 10000000) }}", "range": "{% for i in range(10**12) %}{% endfor %}",
    "syntax": "{% for %}", "unclosed": "{% if true %}", "strrepeat": "{{ 'y' * 10**12 }}",
}
for name, text in templates.items():
    open("h/t_%s.jinja" % name, "w").write(text)
PY
    local P=("$MEMFIT" prepare --format jsonl --tokenizer "$Q/tokenizer.json")
    # Deep JSON in every reader.
    try hostile error "$MEMFIT" "${T[@]}" --config h/deep_a.json --out "$(out)"
    try hostile error "$MEMFIT" "${T[@]}" --config h/deep_o.json --out "$(out)"
    try hostile error "$MEMFIT" plan --config h/deep_o.json
    try hostile error "$MEMFIT" plan --model "$W/h/cfg_deep"
    try hostile error "$MEMFIT" "${TA[@]}" --steps 2 --model "$W/h/cfg_deep" --out "$(out)"
    local part
    for part in normalizer decoder pre_tokenizer post_processor; do
        try hostile error "$MEMFIT" prepare --tokenizer "h/tok_$part/tokenizer.json" --input text.txt --out "$(out)"
    done
    try hostile error "$MEMFIT" prepare --format jsonl --tokenizer h/tc_deep/tokenizer.json --input h/good.jsonl \
        --out "$(out)"
    try hostile error "${P[@]}" --input h/deep.jsonl --out "$(out)"
    # Odd JSON and special files where a JSON file goes.
    local f
    for f in nul big_num trunc empty str long_key; do try hostile error "$MEMFIT" "${T[@]}" --config "h/$f.json" --out "$(out)"; done
    for f in dup bom long_val; do try hostile any "$MEMFIT" "${T[@]}" --config "h/$f.json" --out "$(out)"; done
    mkfifo h/fifo.json
    for f in /dev/zero /dev/urandom /dev/null "$W/h/fifo.json" "$W/h" /proc/self/mem; do
        try hostile error "$MEMFIT" "${T[@]}" --config "$f" --out "$(out)"
        try hostile error "$MEMFIT" plan --config "$f"
        try hostile error "$MEMFIT" prepare --tokenizer "$f" --input text.txt --out "$(out)"
        try hostile error "$MEMFIT" prepare --format jsonl --input "$f" --tokenizer "$Q/tokenizer.json" --out "$(out)"
    done
    # Chat templates: each way to grow a string or a list, runaway loops and recursion.
    for f in h/t_*.jinja; do try hostile error "${P[@]}" --input h/good.jsonl --chat-template "$f" --out "$(out)"; done
    # Instruction data: a 65 MiB record, records of the wrong shape, invalid UTF-8.
    try hostile error "${P[@]}" --input h/huge_line.jsonl --out "$(out)"
    for f in h/odd*.jsonl h/badutf8.jsonl; do try hostile error "${P[@]}" --input "$f" --out "$(out)"; done
    hostile_checkpoints
    hostile_flags
}

# Edited checkpoints: meta.json changed, digests removed, files swapped for special files.
hostile_checkpoints() {
    local R=("$MEMFIT" "${TA[@]}" --model nano --steps 6)
    local c edit
    for edit in 'm["tokenizer"] = "/etc/passwd"' 'm["tokenizer"] = "../../../../etc/hostname.json"' \
                'm["step"] = 10**30' 'm["loss"] = -1' 'm["data"] = None' 'del m["data"]' 'm["world_size"] = 0' \
                'm["zero"] = 9' 'del m["meta_digest"]' 'm["checksums"]["state.safetensors"] = "0" * 16'; do
        c=$(out); cp -r base/checkpoints/step-000004 "$c"
        python3 -c "import json,sys; m=json.load(open(sys.argv[1])); $edit; json.dump(m, open(sys.argv[1], 'w'))" "$c/meta.json"
        try hostile error "${R[@]}" --resume "$c" --out "$(out)"
        try hostile error "$MEMFIT" export "$c" --out "$(out)"
    done
    c=$(out); cp -r base/checkpoints/step-000004 "$c"
    python3 -c "import json,sys; m=json.load(open(sys.argv[1])); del m['checksums']; del m['meta_digest']; json.dump(m, open(sys.argv[1], 'w'))" "$c/meta.json"
    try hostile error "${R[@]}" --resume "$c" --out "$(out)"
    try hostile ok "${R[@]}" --resume "$c" --allow-unverified --out "$(out)"
    try hostile ok "$MEMFIT" export "$c" --allow-unverified --out "$(out)"
    for f in /dev/zero /dev/null; do
        c=$(out); cp -r base/checkpoints/step-000004 "$c"; rm "$c/state.safetensors"; ln -s "$f" "$c/state.safetensors"
        try hostile error "${R[@]}" --resume "$c" --out "$(out)"
    done
    c=$(out); cp -r base/checkpoints/step-000004 "$c"; truncate -s 1000 "$c/state.safetensors"
    try hostile error "${R[@]}" --resume "$c" --out "$(out)"
    # monitor on what is not a running memfit: garbage, pid 1, a folder that is not a run.
    local m
    m=$(out); mkdir -p "$m"; echo 'garbage' > "$m/run.json"
    try hostile error "$MEMFIT" monitor "$m" --once --wait 1
    echo '{"pid": 1, "pid_start": 1}' > "$m/run.json"
    try hostile error "$MEMFIT" monitor "$m" --once --wait 1
    echo "{\"pid\": $$}" > "$m/run.json"
    try hostile error "$MEMFIT" monitor "$m" --wait 1
    try hostile error "$MEMFIT" monitor "$W/nope" --wait 1
}

# The flags added since the last pass, with values they should refuse or may take.
hostile_flags() {
    local v
    try hostile any "$MEMFIT" plan --model nano --hardware cpu --include-plan-only --json
    try hostile any "$MEMFIT" plan --model llama2-7b --gpus 8 --wide
    try hostile any "$MEMFIT" plan --model llama2-7b --gpus 8 --max-seq
    try hostile any "$MEMFIT" plan --model llama2-7b --gpus 8 --max-micro-batch
    try hostile any "$MEMFIT" plan --model llama2-7b --gpus 8 --max-seq --max-micro-batch
    try hostile any "$MEMFIT" plan --model llama2-7b --gpus 8 --max-model llama
    for v in nope "../../x" "$(printf 'x%.0s' {1..5000})"; do
        try hostile error "$MEMFIT" plan --model llama2-7b --gpus 8 --max-model "$v"
    done
    try hostile any "$MEMFIT" plan --model llama2-7b --gpus 8 --max-model ""   # "": every preset, as no value
    for v in /proc/nope "$W/h" "$W/text.txt/x" ""; do
        try hostile error "$MEMFIT" plan --model llama2-7b --gpus 8 --emit-config "$v"
        try hostile error "$MEMFIT" plan --model llama2-7b --gpus 8 --emit-deepspeed "$v"
    done
    for v in 0 -1 3 1e30 nope; do
        try hostile error "$MEMFIT" plan --model llama2-7b --gpus "$v" --nodes 2 --hardware h100-80g
    done
    try hostile error "$MEMFIT" plan --model llama2-7b --top 0
    try hostile error "$MEMFIT" plan --model llama2-7b --hardware nope
    for v in "$W/nope" "$W/text.txt" /dev/null ""; do
        try hostile error "$MEMFIT" "${T[@]}" --offload optimizer --offload-dir "$v" --out "$(out)"
    done
    for v in --allow-unverified "--sp=false" --no-sp "--distill-alpha 0.3" "--distill-temperature 2" \
             "--teacher-weights nf4" "--teacher-weights int3"; do
        # shellcheck disable=SC2086
        try hostile any "$MEMFIT" "${T[@]}" $v --out "$(out)"
    done
    try hostile error "$MEMFIT" "${T[@]}" --weight-decay 1e10 --out "$(out)"
    try hostile error "$MEMFIT" "${T[@]}" --checkpoint-dir "" --out "$(out)"
    try hostile error "$MEMFIT" "${T[@]}" --data "" --out "$(out)"
    try hostile error "$MEMFIT" "${T[@]}" --out ""
}
