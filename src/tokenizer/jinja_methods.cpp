// Attribute and item access as jinja2's ImmutableSandboxedEnvironment does them, and the
// methods of str, dict, list and tuple a template may call (Python's semantics). What would
// change a value (list.append, dict.update, ...) is refused, as the sandbox refuses it.
#include <algorithm>

#include <fmt/format.h>

#include "tokenizer/jinja_ast.h"

namespace memfit::jinja {

namespace {

using Cps = std::u32string;

template <size_t N>
bool in_list(std::string_view name, const std::string_view (&names)[N]) {
    return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

constexpr std::string_view kStrMethods[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "upper", "lower",
    "title", "capitalize", "swapcase", "casefold", "replace", "find", "rfind", "index", "rindex", "count",
    "join", "isdigit", "isdecimal", "isnumeric", "isalpha", "isalnum", "isspace", "isupper", "islower",
    "isascii", "format", "removeprefix", "removesuffix", "partition", "rpartition", "ljust", "rjust",
    "center", "zfill"};
constexpr std::string_view kStrOther[] = {"encode", "expandtabs", "format_map", "isidentifier",
                                                               "isprintable", "istitle", "maketrans", "translate"};
constexpr std::string_view kDictMethods[] = {"items", "keys", "values", "get", "copy"};
constexpr std::string_view kDictUnsafe[] = {"clear", "pop", "popitem", "setdefault", "update"};
constexpr std::string_view kListMethods[] = {"index", "count", "copy"};
constexpr std::string_view kListUnsafe[] = {"append", "extend", "insert", "pop", "remove",
                                                                 "clear", "sort", "reverse"};

std::string str_of(const Value & v, std::string_view what) {
    if (!v.is_str()) throw RenderError(fmt::format("{} must be str, not {}", what, type_name(v)));
    return v.s;
}

int64_t int_of(const Value & v, std::string_view what) {
    if (!v.is_int()) throw RenderError(fmt::format("{} must be an integer, not {}", what, type_name(v)));
    return v.i;
}

// The code point index of a byte offset.
int64_t cp_index(const std::string & s, size_t byte) { return cp_length(std::string_view(s).substr(0, byte)); }

Value str_list(std::vector<std::string> parts) {
    std::vector<Value> out;
    for (auto & p : parts) out.push_back(Value::string(std::move(p)));
    return Value::make_list(std::move(out));
}

// str.split / str.rsplit: on whitespace runs (sep None) or on `sep`, at most `maxsplit` times.
std::vector<std::string> split(const std::string & s, const Value & sep, int64_t maxsplit, bool from_right) {
    std::vector<std::string> out;
    if (sep.is_none() || sep.is_undefined()) {
        Cps cps = decode_utf8(s);
        if (from_right) std::reverse(cps.begin(), cps.end());
        size_t k = 0;
        while (k < cps.size()) {
            while (k < cps.size() && is_py_space(cps[k])) ++k;
            if (k == cps.size()) break;
            if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {   // the rest, right side kept
                Cps rest = cps.substr(k);
                if (from_right) std::reverse(rest.begin(), rest.end());
                out.push_back(encode_utf8(rest));
                break;
            }
            const size_t b = k;
            while (k < cps.size() && !is_py_space(cps[k])) ++k;
            Cps word = cps.substr(b, k - b);
            if (from_right) std::reverse(word.begin(), word.end());
            out.push_back(encode_utf8(word));
        }
        if (from_right) std::reverse(out.begin(), out.end());
        return out;
    }
    const std::string sp = str_of(sep, "the separator");
    if (sp.empty()) throw RenderError("empty separator");
    if (!from_right) {
        size_t b = 0;
        for (size_t at = s.find(sp); at != std::string::npos && (maxsplit < 0 || int64_t(out.size()) < maxsplit);
             at = s.find(sp, b)) {
            out.push_back(s.substr(b, at - b));
            b = at + sp.size();
        }
        out.push_back(s.substr(b));
        return out;
    }
    size_t e = s.size();
    while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
        if (e < sp.size()) break;
        const size_t at = s.rfind(sp, e - sp.size());
        if (at == std::string::npos) break;
        out.push_back(s.substr(at + sp.size(), e - at - sp.size()));
        e = at;
    }
    out.push_back(s.substr(0, e));
    std::reverse(out.begin(), out.end());
    return out;
}

std::string replace(const std::string & s, const std::string & old, const std::string & with, int64_t count) {
    std::string out;
    if (old.empty()) {   // Python puts `with` around every character
        const Cps cps = decode_utf8(s);
        int64_t n = 0;
        for (size_t k = 0; k <= cps.size(); ++k) {
            if (count < 0 || n < count) out += with, ++n;
            if (k < cps.size()) append_utf8(out, cps[k]);
        }
        return out;
    }
    size_t b = 0;
    int64_t n = 0;
    for (size_t at = s.find(old); at != std::string::npos && (count < 0 || n < count); at = s.find(old, b), ++n) {
        out.append(s, b, at - b);
        out += with;
        b = at + old.size();
    }
    return out + s.substr(b);
}

// str.format with {} {0} {name} fields and {{ }}; conversions and format specs are refused.
std::string format(const std::string & fmt_str, const Args & args) {
    std::string out;
    size_t auto_index = 0;
    for (size_t k = 0; k < fmt_str.size(); ++k) {
        const char c = fmt_str[k];
        if ((c == '{' || c == '}') && k + 1 < fmt_str.size() && fmt_str[k + 1] == c) {
            out += c;
            ++k;
            continue;
        }
        if (c == '}') throw RenderError("Single '}' encountered in format string");
        if (c != '{') {
            out += c;
            continue;
        }
        const size_t end = fmt_str.find('}', k);
        if (end == std::string::npos) throw RenderError("Single '{' encountered in format string");
        const std::string field = fmt_str.substr(k + 1, end - k - 1);
        if (field.find_first_of("!:.[") != std::string::npos)
            throw RenderError(fmt::format("the format field '{{{}}}' is not implemented (only {{}}, {{0}}, {{name}})", field));
        const Value * v = nullptr;
        if (field.empty() || std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
            const size_t idx = field.empty() ? auto_index++ : size_t(std::stoul(field));
            if (idx >= args.pos.size()) throw RenderError("Replacement index " + std::to_string(idx) + " out of range for positional args tuple");
            v = &args.pos[idx];
        } else {
            for (const auto & [name, x] : args.kw)
                if (name == field) v = &x;
            if (!v) throw RenderError("'" + field + "'");
        }
        out += py_str(*v);
        k = end;
    }
    return out;
}

// s padded to `width` code points: left, right or centred as Python's ljust/rjust/center.
std::string pad(const std::string & s, const Args & a, const char * fn, char how) {
    const Bound p(a, {"width", "fillchar"}, fn);
    const int64_t width = int_of(p[0], "width");
    const std::string fill = p.has(1) ? str_of(p[1], "fillchar") : " ";
    if (cp_length(fill) != 1) throw RenderError("The fill character must be exactly one character long");
    const int64_t len = cp_length(s);
    if (width <= len) return s;
    check_text_size(uint64_t(width) * fill.size(), fn);
    const int64_t marg = width - len;
    const int64_t left = how == 'l' ? 0 : how == 'r' ? marg : marg / 2 + (marg & width & 1);
    std::string out;
    for (int64_t k = 0; k < left; ++k) out += fill;
    out += s;
    for (int64_t k = 0; k < marg - left; ++k) out += fill;
    return out;
}

Value str_method(const std::string & s, const std::string & name, Args & a) {
    const auto no_args = [&] {
        if (!a.pos.empty() || !a.kw.empty()) throw RenderError(fmt::format("str.{}() takes no arguments", name));
    };
    const auto all_cps = [&](bool (*pred)(char32_t)) {
        no_args();
        const Cps cps = decode_utf8(s);
        return Value::boolean(!cps.empty() && std::all_of(cps.begin(), cps.end(), pred));
    };
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const Bound p(a, {"chars"}, name);
        return Value::string(py_strip(s, p.get_or(0, Value::none()), name != "rstrip", name != "lstrip"));
    }
    if (name == "split" || name == "rsplit") {
        const Bound p(a, {"sep", "maxsplit"}, name);
        return str_list(split(s, p.get_or(0, Value::none()), p.has(1) ? int_of(p[1], "maxsplit") : -1, name == "rsplit"));
    }
    if (name == "splitlines") {
        const Bound p(a, {"keepends"}, name);
        return str_list(py_splitlines(s, truthy(p[0])));
    }
    if (name == "startswith" || name == "endswith") {
        const Bound p(a, {"prefix"}, name);
        std::vector<Value> options = p[0].type == Type::Tuple ? p[0].items() : std::vector<Value>{p[0]};
        for (const Value & o : options) {
            const std::string x = str_of(o, fmt::format("the argument of {}", name));
            if (name == "startswith" ? s.starts_with(x) : s.ends_with(x)) return Value::boolean(true);
        }
        return Value::boolean(false);
    }
    if (name == "upper" || name == "lower" || name == "casefold" || name == "title" || name == "capitalize" || name == "swapcase") {
        no_args();
        if (name == "upper") return Value::string(py_upper(s));
        if (name == "lower" || name == "casefold") return Value::string(py_lower(s));
        if (name == "title") return Value::string(py_title(s));
        if (name == "capitalize") return Value::string(py_capitalize(s));
        std::string out;
        for (const char32_t c : decode_utf8(s)) append_utf8(out, py_is_upper_cp(c) ? py_lower_cp(c) : py_upper_cp(c));
        return Value::string(out);
    }
    if (name == "replace") {
        const Bound p(a, {"old", "new", "count"}, name);
        const std::string old_s = str_of(p[0], "old"), new_s = str_of(p[1], "new");
        // Every match becomes `new` (an empty `old` matches between every two characters).
        uint64_t matches = old_s.empty() ? uint64_t(cp_length(s)) + 1 : 0;
        for (size_t at = old_s.empty() ? std::string::npos : s.find(old_s); at != std::string::npos;
             at = s.find(old_s, at + old_s.size()))
            ++matches;
        check_text_size(s.size() + matches * new_s.size(), "replace");
        return Value::string(replace(s, old_s, new_s, p.has(2) ? int_of(p[2], "count") : -1));
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
        const Bound p(a, {"sub"}, name);
        const std::string sub = str_of(p[0], "the substring");
        const size_t at = name == "find" || name == "index" ? s.find(sub) : s.rfind(sub);
        if (at == std::string::npos && (name == "index" || name == "rindex")) throw RenderError("substring not found");
        return Value::integer(at == std::string::npos ? -1 : cp_index(s, at));
    }
    if (name == "count") {
        const Bound p(a, {"sub"}, name);
        const std::string sub = str_of(p[0], "the substring");
        if (sub.empty()) return Value::integer(cp_length(s) + 1);
        int64_t n = 0;
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
        return Value::integer(n);
    }
    if (name == "join") {
        const Bound p(a, {"iterable"}, name);
        std::string out;
        const std::vector<Value> items = iterate(p[0]);
        for (size_t k = 0; k < items.size(); ++k) {
            if (!items[k].is_str())
                throw RenderError(fmt::format("sequence item {}: expected str instance, {} found", k, type_name(items[k])));
            out += (k ? s : "") + items[k].s;
            check_text_size(out.size(), "join");
        }
        return Value::string(out);
    }
    if (name == "isdigit" || name == "isdecimal" || name == "isnumeric") return all_cps(py_is_digit_cp);
    if (name == "isalpha") return all_cps(py_is_alpha_cp);
    if (name == "isalnum") return all_cps(py_is_alnum_cp);
    if (name == "isspace") return all_cps(is_py_space);
    if (name == "isascii") {
        no_args();
        return Value::boolean(std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }));
    }
    if (name == "isupper" || name == "islower") {   // some cased character, and none of the other case
        no_args();
        bool cased = false, wrong = false;
        for (const char32_t c : decode_utf8(s)) {
            cased = cased || py_is_cased(c);
            wrong = wrong || (name == "isupper" ? py_is_lower_cp(c) : py_is_upper_cp(c));
        }
        return Value::boolean(cased && !wrong);
    }
    if (name == "format") return Value::string(format(s, a));
    if (name == "removeprefix" || name == "removesuffix") {
        const Bound p(a, {"affix"}, name);
        const std::string x = str_of(p[0], "the affix");
        if (name == "removeprefix") return Value::string(s.starts_with(x) ? s.substr(x.size()) : s);
        return Value::string(s.ends_with(x) ? s.substr(0, s.size() - x.size()) : s);
    }
    if (name == "partition" || name == "rpartition") {
        const Bound p(a, {"sep"}, name);
        const std::string sep = str_of(p[0], "the separator");
        if (sep.empty()) throw RenderError("empty separator");
        const size_t at = name == "partition" ? s.find(sep) : s.rfind(sep);
        std::vector<Value> parts;
        if (at == std::string::npos) {
            parts = name == "partition" ? std::vector<Value>{Value::string(s), Value::string(""), Value::string("")}
                                        : std::vector<Value>{Value::string(""), Value::string(""), Value::string(s)};
        } else {
            parts = {Value::string(s.substr(0, at)), Value::string(sep), Value::string(s.substr(at + sep.size()))};
        }
        return Value::make_list(std::move(parts), Type::Tuple);
    }
    if (name == "ljust") return Value::string(pad(s, a, "ljust", 'l'));
    if (name == "rjust") return Value::string(pad(s, a, "rjust", 'r'));
    if (name == "center") return Value::string(pad(s, a, "center", 'c'));
    if (name == "zfill") {
        const Bound p(a, {"width"}, name);
        const int64_t width = int_of(p[0], "width"), len = cp_length(s);
        if (width <= len) return Value::string(s);
        const bool sign = !s.empty() && (s[0] == '+' || s[0] == '-');
        return Value::string((sign ? s.substr(0, 1) : "") + std::string(size_t(width - len), '0') + s.substr(sign ? 1 : 0));
    }
    throw RenderError(fmt::format("str.{} is not implemented", name));
}

Value dict_method(const Dict & d, const std::string & name, Args & a) {
    if (name == "get") {
        const Bound p(a, {"key", "default"}, name);
        const Value * v = d.find(p[0]);
        return v ? *v : p.get_or(1, Value::none());
    }
    const Bound p(a, {}, name);
    std::vector<Value> out;
    for (const auto & [k, v] : d.entries) {
        if (name == "items") out.push_back(Value::make_list({k, v}, Type::Tuple));
        else out.push_back(name == "values" ? v : k);
    }
    if (name == "copy") return Value::make_dict(d);
    return Value::make_list(std::move(out));
}

Value list_method(const Value & self, const std::string & name, Args & a) {
    if (name == "copy") return Value::make_list(self.items(), self.type);
    const Bound p(a, {"value"}, name);
    int64_t n = 0;
    for (size_t k = 0; k < self.items().size(); ++k) {
        if (!py_eq(self.items()[k], p[0])) continue;
        if (name == "index") return Value::integer(int64_t(k));
        ++n;
    }
    if (name == "index") throw RenderError(fmt::format("{} is not in {}", py_repr(p[0]), type_name(self)));
    return Value::integer(n);
}

// x.name where x has such a method: a callable bound to x.
class Method : public Object {
public:
    Method(Value self, std::string name) : self_(std::move(self)), name_(std::move(name)) {}
    std::string type_name() const override { return "builtin_function_or_method"; }
    std::string str() const override { return fmt::format("<built-in method {} of {} object>", name_, jinja::type_name(self_)); }
    bool callable() const override { return true; }
    Value call(Context &, Args & args) const override {
        if (self_.is_str()) return str_method(self_.s, name_, args);
        if (self_.type == Type::Dict) return dict_method(*self_.dict, name_, args);
        return list_method(self_, name_, args);
    }

private:
    Value self_;
    std::string name_;
};

Value method(const Value & self, const std::string & name) { return Value::object(std::make_shared<Method>(self, name)); }

Value unsafe(const Value & obj, const std::string & name) {
    return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type_name(obj)));
}

Value no_attribute(const Value & obj, const std::string & name) {
    return Value::undefined(fmt::format("{} has no attribute {}", py_repr(Value::string(object_type_repr(obj))),
                                        py_repr(Value::string(name))));
}

Value no_element(const Value & obj, const Value & key) {
    return Value::undefined(fmt::format("{} has no element {}", object_type_repr(obj), py_repr(key)));
}

}  // namespace

std::string py_strip(const std::string & s, const Value & chars, bool left, bool right) {
    Cps set;
    if (!chars.is_none() && !chars.is_undefined()) set = decode_utf8(str_of(chars, "strip's argument"));
    const bool ws = chars.is_none() || chars.is_undefined();
    const auto strip = [&](char32_t c) { return ws ? is_py_space(c) : set.find(c) != Cps::npos; };
    const Cps cps = decode_utf8(s);
    size_t b = 0, e = cps.size();
    while (left && b < e && strip(cps[b])) ++b;
    while (right && e > b && strip(cps[e - 1])) --e;
    return encode_utf8(std::u32string_view(cps).substr(b, e - b));
}

std::vector<std::string> py_splitlines(const std::string & s, bool keepends) {
    const Cps cps = decode_utf8(s);
    std::vector<std::string> out;
    size_t b = 0;
    for (size_t k = 0; k < cps.size(); ++k) {
        const char32_t c = cps[k];
        const bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
                         c == 0x85 || c == 0x2028 || c == 0x2029;
        if (!brk) continue;
        size_t end = k + 1;
        if (c == '\r' && end < cps.size() && cps[end] == '\n') ++end;
        out.push_back(encode_utf8(std::u32string_view(cps).substr(b, (keepends ? end : k) - b)));
        b = end;
        k = end - 1;
    }
    if (b < cps.size()) out.push_back(encode_utf8(std::u32string_view(cps).substr(b)));
    return out;
}

Value get_attr(const Value & obj, const std::string & name) {
    switch (obj.type) {
        case Type::Undefined: obj.require_defined(); break;
        case Type::Str:
            if (in_list(name, kStrMethods)) return method(obj, name);
            if (in_list(name, kStrOther)) return Value::undefined(fmt::format("str.{} is not implemented", name));
            break;
        case Type::Dict:
            if (in_list(name, kDictMethods)) return method(obj, name);
            if (in_list(name, kDictUnsafe)) return unsafe(obj, name);
            if (const Value * v = obj.dict->find(std::string_view(name))) return *v;
            break;
        case Type::List:
        case Type::Tuple:
            if (in_list(name, kListMethods) && (obj.type == Type::List || name != "copy")) return method(obj, name);
            if (obj.type == Type::List && in_list(name, kListUnsafe)) return unsafe(obj, name);
            break;
        case Type::Object: return obj.obj->attr(name);
        default: break;
    }
    return no_attribute(obj, name);
}

Value get_item(const Value & obj, const Value & key) {
    obj.require_defined();
    if ((obj.is_seq() || obj.is_str()) && key.is_int()) {
        const int64_t n = obj.is_str() ? cp_length(obj.s) : int64_t(obj.list->size());
        const int64_t k = key.i < 0 ? key.i + n : key.i;
        if (k < 0 || k >= n) return no_element(obj, key);
        if (obj.is_seq()) return (*obj.list)[size_t(k)];
        std::string one;
        append_utf8(one, decode_utf8(obj.s)[size_t(k)]);
        return Value::string(one);
    }
    if (obj.type == Type::Dict)
        if (const Value * v = obj.dict->find(key)) return *v;
    if (key.is_str()) return get_attr(obj, key.s);   // a['b'] falls back to a.b
    return no_element(obj, key);
}

}  // namespace memfit::jinja
