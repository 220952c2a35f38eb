// jinja2 3.1's filters and tests that chat templates use, transformers' tojson, and the globals
// (range, namespace, dict, raise_exception, strftime_now). Each behaves as its Python original,
// including the quirks templates rely on (`"4.2"|int` is 4, `x|default` only for Undefined).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "tokenizer/jinja_ast.h"

namespace memfit::jinja {

Bound::Bound(const Args & args, std::initializer_list<const char *> params, std::string_view fn)
    : values_(params.size()) {
    if (args.pos.size() > params.size())
        throw RenderError(fmt::format("{}() takes at most {} argument(s) ({} given)", fn, params.size(), args.pos.size()));
    for (size_t k = 0; k < args.pos.size(); ++k) values_[k] = args.pos[k];
    for (const auto & [name, v] : args.kw) {
        size_t k = 0;
        for (const char * p : params) {
            if (name == p) break;
            ++k;
        }
        if (k == params.size()) throw RenderError(fmt::format("{}() got an unexpected keyword argument '{}'", fn, name));
        if (values_[k]) throw RenderError(fmt::format("{}() got multiple values for argument '{}'", fn, name));
        values_[k] = v;
    }
}

const Value & Bound::operator[](size_t k) const {
    static const Value missing = Value::undefined("a missing argument");
    return values_[k] ? *values_[k] : missing;
}

namespace {

// A filter that takes no argument but its input.
void no_args(const Args & a, const char * fn) { const Bound none(a, {}, fn); }

// Calls the str method `name` of s (the filters that are str methods under another name).
Value str_call(Context & ctx, const std::string & s, const char * name, Args args) {
    return call_value(ctx, get_attr(Value::string(s), name), args);
}

// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then the item 0.
Value attr_path(const Value & item, const std::string & path) {
    Value v = item;
    size_t b = 0;
    for (;;) {
        const size_t dot = path.find('.', b);
        const std::string part = path.substr(b, dot == std::string::npos ? std::string::npos : dot - b);
        const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
        v = get_item(v, digits ? Value::integer(std::stoll(part)) : Value::string(part));
        if (dot == std::string::npos) return v;
        b = dot + 1;
    }
}

// What sort, unique, min, max (and join, sum) take of an item: its attribute when one is
// named, lowercased unless case-sensitive.
Value sort_key(const Value & item, const Value & attribute, bool case_sensitive) {
    Value v = attribute.is_str() ? attr_path(item, attribute.s) : attribute.is_int() ? get_item(item, attribute) : item;
    if (!case_sensitive && v.is_str()) v.s = py_lower(v.s);
    return v;
}

// ---- parsing numbers as int() and float() do ------------------------------------------------------

std::string strip_ws(const std::string & s) { return py_strip(s, Value::none(), true, true); }

// "1_000" -> "1000"; false when an underscore is not between two digits.
bool drop_underscores(std::string & s, bool (*digit)(char)) {
    std::string out;
    for (size_t k = 0; k < s.size(); ++k) {
        if (s[k] != '_') {
            out += s[k];
            continue;
        }
        if (k == 0 || k + 1 == s.size() || !digit(s[k - 1]) || !digit(s[k + 1])) return false;
    }
    s = out;
    return true;
}

std::optional<int64_t> parse_int(const std::string & text, int64_t base) {
    std::string s = strip_ws(text);
    bool neg = false;
    if (!s.empty() && (s[0] == '+' || s[0] == '-')) neg = s[0] == '-', s.erase(0, 1);
    const auto prefix = [&](char p) { return s.size() > 2 && s[0] == '0' && (s[1] == p || s[1] == p - 32); };
    if ((base == 0 || base == 16) && prefix('x')) base = 16, s.erase(0, 2);
    else if ((base == 0 || base == 8) && prefix('o')) base = 8, s.erase(0, 2);
    else if ((base == 0 || base == 2) && prefix('b')) base = 2, s.erase(0, 2);
    if (base == 0) base = 10;
    if (base < 2 || base > 36 || s.empty()) return std::nullopt;
    if (!s.empty() && s[0] == '_') s.erase(0, 1);   // 0x_1f
    if (!drop_underscores(s, [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; })) return std::nullopt;
    int64_t v = 0;
    for (const char c : s) {
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'z' ? c - 'a' + 10 : c >= 'A' && c <= 'Z' ? c - 'A' + 10 : 99;
        if (d >= base || __builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v)) return std::nullopt;
    }
    return neg ? -v : v;
}

std::optional<double> parse_float(const std::string & text) {
    std::string s = strip_ws(text);
    if (s.find_first_of("xXpP(") != std::string::npos || s.empty()) return std::nullopt;
    if (!drop_underscores(s, [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
    char * end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (end != s.c_str() + s.size()) return std::nullopt;
    return d;
}

std::optional<int64_t> float_to_int(double d) {
    if (!std::isfinite(d) || d >= 9.2233720368547758e18 || d < -9.2233720368547758e18) return std::nullopt;
    return int64_t(d);
}

// ---- filters ---------------------------------------------------------------------------------------

Value f_abs(Context &, const Value & v, Args & a) {
    no_args(a, "abs");
    if (v.type == Type::Float) return Value::number(std::fabs(v.f));
    if (!v.is_int()) throw RenderError(fmt::format("bad operand type for abs(): '{}'", type_name(v)));
    if (v.i == INT64_MIN) throw RenderError("integer overflow");
    return Value::integer(v.i < 0 ? -v.i : v.i);
}

Value f_attr(Context &, const Value & v, Args & a) {   // getattr only: no item fallback
    const Bound p(a, {"name"}, "attr");
    const std::string name = py_str(p[0]);
    if (v.type == Type::Dict) {
        const Value m = get_attr(Value::make_dict({}), name);   // a dict method, or why not
        return m.is_undefined() ? m : get_attr(v, name);
    }
    return get_attr(v, name);
}

Value f_capitalize(Context &, const Value & v, Args & a) {
    no_args(a, "capitalize");
    return Value::string(py_capitalize(py_str(v)));
}

Value f_center(Context & ctx, const Value & v, Args & a) {
    const Bound p(a, {"width"}, "center");
    return str_call(ctx, py_str(v), "center", Args{{p.get_or(0, Value::integer(80))}, {}});
}

Value f_length(Context &, const Value & v, Args & a) {
    no_args(a, "length");
    return Value::integer(py_len(v));
}

Value f_default(Context &, const Value & v, Args & a) {
    const Bound p(a, {"default_value", "boolean"}, "default");
    if (v.is_undefined() || (truthy(p[1]) && !truthy(v))) return p.get_or(0, Value::string(""));
    return v;
}

Value f_dictsort(Context &, const Value & v, Args & a) {
    const Bound p(a, {"case_sensitive", "by", "reverse"}, "dictsort");
    if (v.type != Type::Dict) throw RenderError("dictsort: the value is not a dict");
    const std::string by = p.has(1) ? py_str(p[1]) : "key";
    if (by != "key" && by != "value") throw RenderError("You can only sort by either \"key\" or \"value\"");
    const bool cs = truthy(p[0]), rev = truthy(p[2]);
    std::vector<std::pair<Value, Value>> items = v.dict->entries;
    std::stable_sort(items.begin(), items.end(), [&](const auto & x, const auto & y) {
        const Value kx = sort_key(by == "key" ? x.first : x.second, Value(), cs);
        const Value ky = sort_key(by == "key" ? y.first : y.second, Value(), cs);
        return rev ? py_cmp(ky, kx, "<") < 0 : py_cmp(kx, ky, "<") < 0;
    });
    std::vector<Value> out;
    for (auto & [k, x] : items) out.push_back(Value::make_list({k, x}, Type::Tuple));
    return Value::make_list(std::move(out));
}

Value f_escape(Context &, const Value & v, Args & a) {
    no_args(a, "escape");
    std::string out;
    for (const char c : py_str(v)) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&#34;"; break;
            case '\'': out += "&#39;"; break;
            default: out += c;
        }
    }
    return Value::string(out);
}

Value f_first(Context &, const Value & v, Args & a) {
    no_args(a, "first");
    const std::vector<Value> items = iterate(v);
    return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Context &, const Value & v, Args & a) {
    no_args(a, "last");
    const std::vector<Value> items = iterate(v);
    return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_float(Context &, const Value & v, Args & a) {
    const Bound p(a, {"default"}, "float");
    if (v.is_number()) return Value::number(v.as_double());
    if (v.is_str())
        if (const auto d = parse_float(v.s)) return Value::number(*d);
    return p.get_or(0, Value::number(0.0));
}

Value f_int(Context &, const Value & v, Args & a) {
    const Bound p(a, {"default", "base"}, "int");
    if (v.is_int()) return Value::integer(v.i);
    std::optional<int64_t> r;
    if (v.type == Type::Float) r = float_to_int(v.f);
    if (v.is_str()) {
        r = parse_int(v.s, p.has(1) ? p[1].i : 10);
        if (!r)
            if (const auto d = parse_float(v.s)) r = float_to_int(*d);   // "42.23"|int is 42
    }
    return r ? Value::integer(*r) : p.get_or(0, Value::integer(0));
}

Value f_indent(Context &, const Value & v, Args & a) {
    const Bound p(a, {"width", "first", "blank"}, "indent");
    const int64_t width = p[0].is_str() ? 0 : std::max<int64_t>(0, p.get_or(0, Value::integer(4)).i);
    check_text_size(uint64_t(width), "indent");
    const std::string ind = p[0].is_str() ? p[0].s : std::string(size_t(width), ' ');
    const std::vector<std::string> lines = py_splitlines(py_str(v) + "\n", false);
    check_text_size(py_str(v).size() + uint64_t(lines.size() + 1) * ind.size(), "indent");
    std::string out;
    for (size_t k = 0; k < lines.size(); ++k) {
        if (k) out += '\n';
        if (k && (truthy(p[2]) || !lines[k].empty())) out += ind;
        out += lines[k];
    }
    if (truthy(p[1])) out = ind + out;
    return Value::string(out);
}

Value f_items(Context &, const Value & v, Args & a) {
    no_args(a, "items");
    if (v.is_undefined()) return Value::make_list({});
    if (v.type != Type::Dict) throw RenderError("Can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto & [k, x] : v.dict->entries) out.push_back(Value::make_list({k, x}, Type::Tuple));
    return Value::make_list(std::move(out));
}

Value f_join(Context &, const Value & v, Args & a) {
    const Bound p(a, {"d", "attribute"}, "join");
    const std::string sep = p.has(0) ? py_str(p[0]) : "";
    std::string out;
    bool first = true;
    for (const Value & item : iterate(v)) {
        out += (first ? "" : sep) + py_str(p.has(1) ? sort_key(item, p[1], true) : item);
        check_text_size(out.size(), "join");
        first = false;
    }
    return Value::string(out);
}

Value f_list(Context &, const Value & v, Args & a) {
    no_args(a, "list");
    return Value::make_list(iterate(v));
}

Value f_lower(Context &, const Value & v, Args & a) {
    no_args(a, "lower");
    return Value::string(py_lower(py_str(v)));
}

Value f_upper(Context &, const Value & v, Args & a) {
    no_args(a, "upper");
    return Value::string(py_upper(py_str(v)));
}

Value f_map(Context & ctx, const Value & v, Args & a) {
    std::vector<Value> out;
    const std::vector<Value> items = iterate(v);
    if (a.pos.empty()) {   // map(attribute='x', default=y)
        const Bound p(a, {"attribute", "default"}, "map");
        if (!p.has(0)) throw RenderError("map: give a filter name or attribute=");
        for (const Value & item : items) {
            Value x = attr_path(item, py_str(p[0]));
            if (x.is_undefined() && p.has(1) && !p[1].is_none()) x = p[1];
            out.push_back(std::move(x));
        }
        return Value::make_list(std::move(out));
    }
    const std::string name = py_str(a.pos[0]);
    const FilterFn fn = find_filter(name);
    if (!fn) throw RenderError(fmt::format("No filter named '{}'.", name));
    Args rest{std::vector<Value>(a.pos.begin() + 1, a.pos.end()), a.kw};
    for (const Value & item : items) {
        Args each = rest;
        out.push_back(fn(ctx, item, each));
    }
    return Value::make_list(std::move(out));
}

Value min_max(const Value & v, Args & a, bool max) {
    const Bound p(a, {"case_sensitive", "attribute"}, max ? "max" : "min");
    const std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    size_t best = 0;
    for (size_t k = 1; k < items.size(); ++k) {
        const int c = py_cmp(sort_key(items[k], p[1], truthy(p[0])), sort_key(items[best], p[1], truthy(p[0])), max ? ">" : "<");
        if (max ? c > 0 : c < 0) best = k;
    }
    return items[best];
}
Value f_max(Context &, const Value & v, Args & a) { return min_max(v, a, true); }
Value f_min(Context &, const Value & v, Args & a) { return min_max(v, a, false); }

// select, reject, selectattr, rejectattr: keep the items whose (attribute's) test is `keep`.
Value select(Context & ctx, const Value & v, Args & a, bool by_attr, bool keep) {
    size_t off = 0;
    std::string attribute;
    if (by_attr) {
        if (a.pos.empty()) throw RenderError("Missing parameter for attribute name");
        attribute = py_str(a.pos[0]);
        off = 1;
    }
    TestFn test = nullptr;
    Args targs{{}, a.kw};
    if (a.pos.size() > off) {
        const std::string name = py_str(a.pos[off]);
        test = find_test(name);
        if (!test) throw RenderError(fmt::format("No test named '{}'.", name));
        targs.pos.assign(a.pos.begin() + long(off) + 1, a.pos.end());
    }
    std::vector<Value> out;
    for (const Value & item : iterate(v)) {
        const Value x = by_attr ? attr_path(item, attribute) : item;
        Args each = targs;
        if ((test ? test(ctx, x, each) : truthy(x)) == keep) out.push_back(item);
    }
    return Value::make_list(std::move(out));
}
Value f_select(Context & c, const Value & v, Args & a) { return select(c, v, a, false, true); }
Value f_reject(Context & c, const Value & v, Args & a) { return select(c, v, a, false, false); }
Value f_selectattr(Context & c, const Value & v, Args & a) { return select(c, v, a, true, true); }
Value f_rejectattr(Context & c, const Value & v, Args & a) { return select(c, v, a, true, false); }

Value f_replace(Context & ctx, const Value & v, Args & a) {
    const Bound p(a, {"old", "new", "count"}, "replace");
    Args args{{Value::string(py_str(p[0])), Value::string(py_str(p[1]))}, {}};
    if (p.has(2) && !p[2].is_none()) args.pos.push_back(p[2]);
    return str_call(ctx, py_str(v), "replace", args);
}

Value f_reverse(Context &, const Value & v, Args & a) {
    no_args(a, "reverse");
    if (v.is_str()) {
        std::u32string cps = decode_utf8(v.s);
        std::reverse(cps.begin(), cps.end());
        return Value::string(encode_utf8(cps));
    }
    std::vector<Value> items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::make_list(std::move(items));
}

Value f_round(Context &, const Value & v, Args & a) {
    const Bound p(a, {"precision", "method"}, "round");
    const int64_t n = p.has(0) ? p[0].i : 0;
    const std::string method = p.has(1) ? py_str(p[1]) : "common";
    if (method != "common" && method != "ceil" && method != "floor") throw RenderError("method must be common, ceil or floor");
    if (!v.is_number()) throw RenderError(fmt::format("type {} doesn't define __round__ method", type_name(v)));
    if (method != "common") {
        const double scale = std::pow(10.0, double(n));
        return Value::number((method == "ceil" ? std::ceil(v.as_double() * scale) : std::floor(v.as_double() * scale)) / scale);
    }
    if (v.is_int() && n >= 0) return Value::integer(v.i);
    const double x = v.as_double();
    double r = 0;
    if (n >= 0) {   // printf rounds the exact binary value, ties to even, as Python's round does
        if (n > 20 || !std::isfinite(x)) return Value::number(x);
        char buf[400];
        std::snprintf(buf, sizeof buf, "%.*f", int(n), x);
        r = std::strtod(buf, nullptr);
    } else {
        const double scale = std::pow(10.0, double(-n));
        r = std::nearbyint(x / scale) * scale;
    }
    return v.is_int() ? Value::integer(int64_t(r)) : Value::number(r);
}

Value f_safe(Context &, const Value & v, Args & a) {
    no_args(a, "safe");
    return v;
}

Value f_sort(Context &, const Value & v, Args & a) {
    const Bound p(a, {"reverse", "case_sensitive", "attribute"}, "sort");
    std::vector<Value> items = iterate(v);
    const bool rev = truthy(p[0]), cs = truthy(p[1]);
    std::stable_sort(items.begin(), items.end(), [&](const Value & x, const Value & y) {
        const Value kx = sort_key(x, p[2], cs), ky = sort_key(y, p[2], cs);
        return rev ? py_cmp(ky, kx, "<") < 0 : py_cmp(kx, ky, "<") < 0;
    });
    return Value::make_list(std::move(items));
}

Value f_string(Context &, const Value & v, Args & a) {
    no_args(a, "string");
    return Value::string(py_str(v));
}

Value f_sum(Context &, const Value & v, Args & a) {
    const Bound p(a, {"attribute", "start"}, "sum");
    Value total = p.get_or(1, Value::integer(0));
    if (total.is_str()) throw RenderError("sum() can't sum strings [use ''.join(seq) instead]");
    for (const Value & item : iterate(v)) total = py_arith(BinaryExpr::Add, total, sort_key(item, p[0], true));
    return total;
}

Value f_title(Context &, const Value & v, Args & a) {   // jinja2's own: words begin after - ( { [ < or space
    no_args(a, "title");
    std::string out;
    bool begin = true;
    for (const char32_t c : decode_utf8(py_str(v))) {
        std::string one;
        append_utf8(one, c);
        const bool sep = is_py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
        out += sep ? one : begin ? py_upper(one) : py_lower(one);
        begin = sep;
    }
    return Value::string(out);
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Value f_tojson(Context &, const Value & v, Args & a) {
    const Bound p(a, {"ensure_ascii", "indent", "separators", "sort_keys"}, "tojson");
    JsonStyle st;
    st.ensure_ascii = truthy(p[0]);
    st.sort_keys = truthy(p[3]);
    if (p.has(1) && !p[1].is_none()) {
        st.pretty = true;
        if (!p[1].is_str()) check_text_size(uint64_t(std::max<int64_t>(0, p[1].i)), "tojson's indent");
        st.indent = p[1].is_str() ? p[1].s : std::string(size_t(std::max<int64_t>(0, p[1].i)), ' ');
        st.item_sep = ",";
    }
    if (p.has(2) && !p[2].is_none()) {
        if (!p[2].is_seq() || p[2].items().size() != 2 || !p[2].items()[0].is_str() || !p[2].items()[1].is_str())
            throw RenderError("tojson: separators must be a pair of strings");
        st.item_sep = p[2].items()[0].s;
        st.key_sep = p[2].items()[1].s;
    }
    return Value::string(to_json(v, st));
}

Value f_trim(Context &, const Value & v, Args & a) {
    const Bound p(a, {"chars"}, "trim");
    return Value::string(py_strip(py_str(v), p.get_or(0, Value::none()), true, true));
}

Value f_unique(Context &, const Value & v, Args & a) {
    const Bound p(a, {"case_sensitive", "attribute"}, "unique");
    std::vector<Value> out, seen;
    for (const Value & item : iterate(v)) {
        const Value key = sort_key(item, p[1], truthy(p[0]));
        if (std::any_of(seen.begin(), seen.end(), [&](const Value & s) { return py_eq(s, key); })) continue;
        seen.push_back(key);
        out.push_back(item);
    }
    return Value::make_list(std::move(out));
}

Value f_wordcount(Context &, const Value & v, Args & a) {
    no_args(a, "wordcount");
    int64_t n = 0;
    bool in_word = false;
    for (const char32_t c : decode_utf8(py_str(v))) {
        const bool w = c == '_' || py_is_alnum_cp(c);
        n += w && !in_word;
        in_word = w;
    }
    return Value::integer(n);
}

// ---- tests -----------------------------------------------------------------------------------------

// The tests that take no argument: a predicate each.
template <bool (*Pred)(const Value &)>
bool no_arg_test(Context &, const Value & v, Args & a) {
    if (!a.pos.empty() || !a.kw.empty()) throw RenderError("this test takes no argument");
    return Pred(v);
}
bool p_defined(const Value & v) { return !v.is_undefined(); }
bool p_undefined(const Value & v) { return v.is_undefined(); }
bool p_none(const Value & v) { return v.is_none(); }
bool p_boolean(const Value & v) { return v.type == Type::Bool; }
bool p_false(const Value & v) { return v.type == Type::Bool && !v.i; }
bool p_true(const Value & v) { return v.type == Type::Bool && v.i; }
bool p_integer(const Value & v) { return v.type == Type::Int; }
bool p_float(const Value & v) { return v.type == Type::Float; }
bool p_number(const Value & v) { return v.is_number(); }
bool p_string(const Value & v) { return v.is_str(); }
bool p_mapping(const Value & v) { return v.type == Type::Dict; }
bool p_iterable(const Value & v) {   // Undefined iterates (as nothing)
    return v.is_str() || v.is_seq() || v.type == Type::Dict || v.is_undefined();
}
bool p_callable(const Value & v) { return v.is_undefined() || (v.type == Type::Object && v.obj->callable()); }
bool p_escaped(const Value &) { return false; }   // no Markup strings here
bool p_odd(const Value & v) { return py_eq(py_arith(BinaryExpr::Mod, v, Value::integer(2)), Value::integer(1)); }
bool p_even(const Value & v) { return py_eq(py_arith(BinaryExpr::Mod, v, Value::integer(2)), Value::integer(0)); }
bool p_filter(const Value & v) { return v.is_str() && find_filter(v.s); }
bool p_test(const Value & v) { return v.is_str() && find_test(v.s); }
bool t_sameas(Context &, const Value & v, Args & a) {
    const Bound p(a, {"other"}, "sameas");
    if (v.type == Type::Object || p[0].type == Type::Object) return v.obj == p[0].obj;
    return v.type == p[0].type && py_eq(v, p[0]);
}
bool t_in(Context &, const Value & v, Args & a) {
    const Bound p(a, {"seq"}, "in");
    return py_contains(p[0], v);
}
bool t_divisibleby(Context &, const Value & v, Args & a) {
    const Bound p(a, {"num"}, "divisibleby");
    return py_eq(py_arith(BinaryExpr::Mod, v, p[0]), Value::integer(0));
}
bool t_eq(Context &, const Value & v, Args & a) { return py_eq(v, Bound(a, {"other"}, "eq")[0]); }
bool t_ne(Context &, const Value & v, Args & a) { return !py_eq(v, Bound(a, {"other"}, "ne")[0]); }
bool t_lt(Context &, const Value & v, Args & a) { return py_cmp(v, Bound(a, {"other"}, "lt")[0], "<") < 0; }
bool t_le(Context &, const Value & v, Args & a) { return py_cmp(v, Bound(a, {"other"}, "le")[0], "<=") <= 0; }
bool t_gt(Context &, const Value & v, Args & a) { return py_cmp(v, Bound(a, {"other"}, "gt")[0], ">") > 0; }
bool t_ge(Context &, const Value & v, Args & a) { return py_cmp(v, Bound(a, {"other"}, "ge")[0], ">=") >= 0; }
bool t_lower(Context & ctx, const Value & v, Args & a) { return truthy(str_call(ctx, py_str(v), "islower", a)); }
bool t_upper(Context & ctx, const Value & v, Args & a) { return truthy(str_call(ctx, py_str(v), "isupper", a)); }

const std::map<std::string_view, FilterFn> & filters() {
    static const std::map<std::string_view, FilterFn> table = {
        {"abs", f_abs},         {"attr", f_attr},       {"capitalize", f_capitalize}, {"center", f_center},
        {"count", f_length},    {"d", f_default},       {"default", f_default},       {"dictsort", f_dictsort},
        {"e", f_escape},        {"escape", f_escape},   {"first", f_first},           {"float", f_float},
        {"forceescape", f_escape}, {"indent", f_indent}, {"int", f_int},              {"items", f_items},
        {"join", f_join},       {"last", f_last},       {"length", f_length},         {"list", f_list},
        {"lower", f_lower},     {"map", f_map},         {"max", f_max},               {"min", f_min},
        {"reject", f_reject},   {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse},
        {"round", f_round},     {"safe", f_safe},       {"select", f_select},         {"selectattr", f_selectattr},
        {"sort", f_sort},       {"string", f_string},   {"sum", f_sum},               {"title", f_title},
        {"tojson", f_tojson},   {"trim", f_trim},       {"unique", f_unique},         {"upper", f_upper},
        {"wordcount", f_wordcount}};
    return table;
}

const std::map<std::string_view, TestFn> & tests() {
    static const std::map<std::string_view, TestFn> table = {
        {"defined", no_arg_test<p_defined>},   {"undefined", no_arg_test<p_undefined>},
        {"none", no_arg_test<p_none>},         {"boolean", no_arg_test<p_boolean>},
        {"false", no_arg_test<p_false>},       {"true", no_arg_test<p_true>},
        {"integer", no_arg_test<p_integer>},   {"float", no_arg_test<p_float>},
        {"number", no_arg_test<p_number>},     {"string", no_arg_test<p_string>},
        {"mapping", no_arg_test<p_mapping>},   {"iterable", no_arg_test<p_iterable>},
        {"sequence", no_arg_test<p_iterable>}, {"callable", no_arg_test<p_callable>},
        {"escaped", no_arg_test<p_escaped>},   {"odd", no_arg_test<p_odd>},
        {"even", no_arg_test<p_even>},         {"filter", no_arg_test<p_filter>},
        {"test", no_arg_test<p_test>},         {"lower", t_lower},
        {"upper", t_upper},                    {"sameas", t_sameas},
        {"in", t_in},                          {"divisibleby", t_divisibleby},
        {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq}, {"ne", t_ne}, {"!=", t_ne},
        {"lt", t_lt}, {"lessthan", t_lt}, {"<", t_lt}, {"le", t_le}, {"<=", t_le},
        {"gt", t_gt}, {"greaterthan", t_gt}, {">", t_gt}, {"ge", t_ge}, {">=", t_ge}};
    return table;
}

// ---- globals ---------------------------------------------------------------------------------------

class Builtin : public Object {
public:
    using Fn = Value (*)(Context &, Args &);
    Builtin(const char * name, Fn fn) : name_(name), fn_(fn) {}
    std::string type_name() const override { return "builtin_function_or_method"; }
    std::string str() const override { return fmt::format("<built-in function {}>", name_); }
    bool callable() const override { return true; }
    Value call(Context & ctx, Args & args) const override { return fn_(ctx, args); }

private:
    const char * name_;
    Fn fn_;
};

constexpr int64_t kMaxRange = 100000;   // the sandbox's MAX_RANGE

Value g_range(Context &, Args & a) {
    if (!a.kw.empty()) throw RenderError("range() takes no keyword arguments");
    if (a.pos.empty() || a.pos.size() > 3) throw RenderError(fmt::format("range expected 1 to 3 arguments, got {}", a.pos.size()));
    for (const Value & v : a.pos)
        if (!v.is_int()) throw RenderError(fmt::format("'{}' object cannot be interpreted as an integer", type_name(v)));
    const int64_t start = a.pos.size() > 1 ? a.pos[0].i : 0, stop = a.pos.size() > 1 ? a.pos[1].i : a.pos[0].i;
    const int64_t step = a.pos.size() > 2 ? a.pos[2].i : 1;
    if (step == 0) throw RenderError("range() arg 3 must not be zero");
    std::vector<Value> out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
        if (int64_t(out.size()) >= kMaxRange)
            throw RenderError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        out.push_back(Value::integer(k));
    }
    return Value::make_list(std::move(out));
}

// dict(mapping, **kw) and namespace(mapping, **kw).
Dict dict_of(Args & a, const char * fn) {
    Dict d;
    if (a.pos.size() > 1) throw RenderError(fmt::format("{} expected at most 1 argument, got {}", fn, a.pos.size()));
    if (!a.pos.empty()) {
        if (a.pos[0].type == Type::Dict) {
            d = *a.pos[0].dict;
        } else {
            for (const Value & pair : iterate(a.pos[0])) {
                if (!pair.is_seq() || pair.items().size() != 2) throw RenderError("dictionary update sequence element has the wrong length");
                d.set(pair.items()[0], pair.items()[1]);
            }
        }
    }
    for (auto & [k, v] : a.kw) d.set(Value::string(k), v);
    return d;
}

Value g_dict(Context &, Args & a) { return Value::make_dict(dict_of(a, "dict")); }

Value g_namespace(Context &, Args & a) {
    auto ns = std::make_shared<Namespace>();
    ns->attrs = dict_of(a, "namespace");
    return Value::object(ns);
}

// The template's own message, cut to one screen line's worth and with control bytes shown as
// spaces (a template from a stranger can raise ten megabytes, or escape sequences).
Value g_raise_exception(Context &, Args & a) {
    const Bound p(a, {"message"}, "raise_exception");
    constexpr size_t kMaxMessage = 300;
    std::string m = py_str(p[0]);
    if (m.size() > kMaxMessage) m = m.substr(0, kMaxMessage) + fmt::format("... ({} bytes)", m.size());
    for (char & c : m)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
    throw RenderError(m, true);
}

Value g_strftime_now(Context &, Args & a) {
    const Bound p(a, {"format"}, "strftime_now");
    if (!p[0].is_str()) throw RenderError("strftime_now: the format must be a string");
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    std::string buf(256, '\0');
    for (;;) {
        const size_t n = std::strftime(buf.data(), buf.size(), p[0].s.c_str(), &local);
        if (n > 0 || p[0].s.empty() || buf.size() > 65536) return Value::string(buf.substr(0, n));
        buf.resize(buf.size() * 4);
    }
}

}  // namespace

FilterFn find_filter(std::string_view name) {
    const auto it = filters().find(name);
    return it == filters().end() ? nullptr : it->second;
}

TestFn find_test(std::string_view name) {
    const auto it = tests().find(name);
    return it == tests().end() ? nullptr : it->second;
}

bool is_jinja_filter(std::string_view name) {
    static const std::initializer_list<std::string_view> more = {
        "batch", "filesizeformat", "format", "groupby", "pprint", "random", "slice", "striptags",
        "truncate", "urlencode", "urlize", "wordwrap", "xmlattr"};
    return find_filter(name) || std::find(more.begin(), more.end(), name) != more.end();
}

bool is_jinja_test(std::string_view name) { return find_test(name) != nullptr; }

const Dict & globals() {
    static const Dict table = [] {
        Dict d;
        const auto add = [&](const char * name, Builtin::Fn fn) {
            d.set(Value::string(name), Value::object(std::make_shared<Builtin>(name, fn)));
        };
        add("range", g_range);
        add("dict", g_dict);
        add("namespace", g_namespace);
        add("raise_exception", g_raise_exception);
        add("strftime_now", g_strftime_now);
        return d;
    }();
    return table;
}

}  // namespace memfit::jinja
