// Chat templates: the Jinja source in a Hugging Face tokenizer_config.json's `chat_template`,
// rendered exactly as transformers renders it with Python's jinja2 3.1 (byte for byte): an
// ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the loopcontrols extension,
// the globals raise_exception(msg) and strftime_now(fmt) (local time), and transformers' tojson
// filter (json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)).
//
// Implemented, with jinja2's semantics (its scoping, Python's operators and printing):
//   text, {{ }}, {% %}, {# #}, '-' and '+' whitespace control, {% raw %}
//   if/elif/else; for (tuple targets, `if` filter, else, loop.index/index0/revindex/revindex0/
//   first/last/length/previtem/nextitem/cycle/changed, break, continue); set (name, a, b unpacking,
//   ns.attr, block set); macro (defaults, keywords, varargs, kwargs, caller); call blocks;
//   filter blocks; with; transformers' {% generation %} (renders its body)
//   literals, attributes and items (a.b falls back to a['b'] and a['b'] to a.b), slices, calls,
//   filters, tests, + - * / // % ** ~, comparisons, in, and/or/not, a if c else b
//   jinja2's Undefined: prints as "", is false and empty; using it otherwise is an error
//   the filters and tests of jinja2 that chat templates use (jinja_filters.cpp) and the str,
//   dict and list methods a sandboxed template may call (jinja_methods.cpp); globals range,
//   dict, namespace
// Refused at construction (FormatError "chat template line N: ..."): extends, block, include,
// import, from, autoescape, do, trans, recursive loops, *args in calls, tuple subscripts, \N{}
// escapes, and the filters batch, filesizeformat, format, groupby, pprint, random, slice,
// striptags, truncate, urlencode, urlize, wordwrap, xmlattr (also in a branch that would not
// run, where jinja2 fails only when it runs). Where memfit differs from Python only in
// printing: dict.items() and map/select/reverse/range results are lists (Python prints
// dict_items([...]), generators and range objects, which no chat template prints).
// Integers are 64-bit (an overflow is an error, not a big integer).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace memfit {

// A template is a program from a stranger: what one render may spend (docs/reliability.md), on
// top of the size limits on any one string or list (jinja_value.h). Past one: a ConfigError.
struct RenderBudgets {
    uint64_t steps = 20'000'000;           // statements, loop iterations and macro calls
    uint64_t bytes = uint64_t(2) << 30;    // the strings its expressions make (built or copied), in all
    int seconds = 60;                      // wall time, the last resort
};

class ChatTemplate {   // compiled once, rendered many times; render is const and thread-safe
public:
    // FormatError "chat template line N: ..." for syntax it does not implement, or malformed.
    explicit ChatTemplate(const std::string & source);

    // `vars`: a JSON object of the template's variables (messages, add_generation_prompt,
    // bos_token, eos_token, tools, date_string, ...). An ordered_json keeps the key order of
    // messages and tools as given, which tojson prints; a plain nlohmann::json converts (sorted
    // keys). An error while rendering is a ConfigError: raise_exception(msg) gives
    // "chat template: " + msg, other errors (an Undefined used where jinja2 raises, a type
    // error) "chat template line N: " + Python's message.
    std::string render(const nlohmann::ordered_json & vars, const RenderBudgets & budgets = {}) const;

    const std::string & source() const;

private:
    struct Compiled;
    std::shared_ptr<const Compiled> compiled_;
};

// memfit's own formats, for tokenizers without a chat_template (Jinja sources, rendered as
// above; "" for an unknown name):
//   "chatml"   <|im_start|>{role}\n{content}<|im_end|>\n per message; the generation prompt
//              is <|im_start|>assistant\n
//   "llama3"   bos_token, then <|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}
//              <|eot_id|> per message; the generation prompt is the assistant's header
//   "mistral"  bos_token, then [INST] {user} [/INST] and " {assistant}" eos_token; a system
//              message goes before the first user message's text with "\n\n"; roles must
//              alternate user/assistant (raise_exception otherwise); no generation prompt
std::string builtin_chat_template(const std::string & name);

}  // namespace memfit
