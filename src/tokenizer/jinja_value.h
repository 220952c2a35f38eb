// The values of memfit's Jinja interpreter (chat_template.h), modelled on Python's, since a chat
// template computes with what jinja2 hands it: None, bool, int, float, str, list, tuple, dict,
// jinja2's Undefined, and a few objects (macros, bound methods, the loop, namespace()). The
// functions below are Python's semantics for them: truth, str(), repr(), ==, ordering,
// json.dumps. Strings are UTF-8; where Python counts characters (len, slices, strip's
// characters) they are decoded to code points, a byte that is not UTF-8 becoming U+DC80+byte
// (Python's surrogateescape) and coming back unchanged. Internal to src/tokenizer/.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace memfit::jinja {

// A failure while rendering. ChatTemplate::render turns it into a ConfigError: `raised` marks
// the template's own raise_exception(msg), whose text is given verbatim.
class RenderError : public std::runtime_error {
public:
    explicit RenderError(const std::string & msg, bool by_template = false)
        : std::runtime_error(msg), raised(by_template) {}
    bool raised;
};

// A template from a stranger is a program: its budgets (docs/reliability.md). Any string it
// builds, its rendered text included, is at most kMaxTextBytes, any list kMaxListItems (holding
// at most kMaxListBytes of strings); a render's steps, bytes and time are RenderBudgets
// (chat_template.h), at most
// kMaxRenderSteps statements and macro calls. Past either: a RenderError naming the budget.
constexpr size_t kMaxTextBytes = size_t(64) << 20;
constexpr size_t kMaxListItems = size_t(1) << 22;   // about 100 bytes each: 400 MiB at most
constexpr size_t kMaxListBytes = size_t(256) << 20;       // the strings one list holds

// RenderError when a string of `bytes` would pass kMaxTextBytes (checked before it is built where
// its size is known ahead: padding, indentation, replacement, joins, repetition).
void check_text_size(uint64_t bytes, const char * what);
// The same for a list (or the characters of a string iterated) of `items`.
void check_list_size(uint64_t items, const char * what);

enum class Type { Undefined, None, Bool, Int, Float, Str, List, Tuple, Dict, Object };

struct Dict;
class Object;
class Context;

struct Value {
    Type type = Type::Undefined;
    int64_t i = 0;                                   // Bool (0 or 1), Int
    double f = 0;                                    // Float
    std::string s;                                   // Str; Undefined: what using it raises
    std::shared_ptr<const std::vector<Value>> list;  // List, Tuple
    std::shared_ptr<const Dict> dict;                // Dict
    std::shared_ptr<Object> obj;                     // Object

    static Value undefined(std::string why);
    static Value none();
    static Value boolean(bool b);
    static Value integer(int64_t v);
    static Value number(double v);
    static Value string(std::string v);
    static Value make_list(std::vector<Value> items, Type kind = Type::List);
    static Value make_dict(Dict d);
    static Value object(std::shared_ptr<Object> o);

    bool is_undefined() const { return type == Type::Undefined; }
    bool is_none() const { return type == Type::None; }
    bool is_str() const { return type == Type::Str; }
    bool is_int() const { return type == Type::Int || type == Type::Bool; }   // Python: bool is an int
    bool is_number() const { return is_int() || type == Type::Float; }
    bool is_seq() const { return type == Type::List || type == Type::Tuple; }
    double as_double() const { return type == Type::Float ? f : double(i); }
    const std::vector<Value> & items() const { return *list; }
    // Raises this Undefined's error (`s`); a no-op for other values.
    void require_defined() const;
};

// A Python dict: insertion order, keys unique under Python's ==.
struct Dict {
    std::vector<std::pair<Value, Value>> entries;
    const Value * find(const Value & key) const;
    const Value * find(std::string_view key) const;
    void set(Value key, Value v);   // replaces the value of an equal key, else appends
};

// A call's arguments, as the template wrote them.
struct Args {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
};

// Macros, builtins, bound methods, the loop, namespace(): what is neither data nor Undefined.
class Object {
public:
    virtual ~Object() = default;
    virtual std::string type_name() const = 0;           // Python's type(x).__name__
    virtual std::string str() const;                     // Python's str(x)
    virtual Value attr(const std::string & name) const;  // x.name: undefined when there is none
    virtual bool callable() const { return false; }
    virtual Value call(Context & ctx, Args & args) const;
};

// ---- Python semantics ---------------------------------------------------------------------------
bool truthy(const Value & v);
std::string type_name(const Value & v);        // "NoneType", "int", "str", "dict", ...
std::string object_type_repr(const Value & v); // jinja2's: "None", "dict object", ...
std::string py_str(const Value & v);           // str(v); Undefined prints as ""
std::string py_repr(const Value & v);
std::string float_repr(double d);              // repr(float): shortest round trip, "1.0", "1e+16"
bool py_eq(const Value & a, const Value & b);
// Python's ordering: <0, 0, >0. RenderError where Python raises TypeError; `op` ("<", ...) is
// the operator the message names.
int py_cmp(const Value & a, const Value & b, std::string_view op);
// Python's len(); RenderError for what has none.
int64_t py_len(const Value & v);
// RenderError when the strings `items` holds (one level), `copies` times over, pass kMaxListBytes.
void check_list_bytes(const std::vector<Value> & items, const char * what, uint64_t copies = 1);

// The items of `for x in v` / list(v): a list's items, a dict's keys, a str's characters,
// nothing for Undefined; RenderError for what is not iterable.
std::vector<Value> iterate(const Value & v);

// json.dumps(v, ensure_ascii, indent, separators, sort_keys) exactly.
struct JsonStyle {
    bool ensure_ascii = false;
    bool pretty = false;         // indent is not None
    std::string indent;          // the string one level indents by
    std::string item_sep = ", ", key_sep = ": ";
    bool sort_keys = false;
};
std::string to_json(const Value & v, const JsonStyle & style);

// ---- strings as Python sees them ---------------------------------------------------------------
std::u32string decode_utf8(std::string_view s);
std::string encode_utf8(std::u32string_view s);
void append_utf8(std::string & out, char32_t c);
int64_t cp_length(std::string_view s);
bool is_py_space(char32_t c);                  // str.isspace()
std::string py_upper(std::string_view s);      // full Unicode case mapping, as str.upper()
std::string py_lower(std::string_view s);
std::string py_title(std::string_view s);      // str.title()
std::string py_capitalize(std::string_view s); // str.capitalize()
bool py_is_cased(char32_t c);
bool py_is_upper_cp(char32_t c);
bool py_is_lower_cp(char32_t c);
bool py_is_alnum_cp(char32_t c);
bool py_is_alpha_cp(char32_t c);
bool py_is_digit_cp(char32_t c);
char32_t py_upper_cp(char32_t c);              // one code point's simple mapping
char32_t py_lower_cp(char32_t c);
char32_t py_title_cp(char32_t c);

}  // namespace memfit::jinja
