#include "tokenizer/jinja_value.h"

#include <unicode/locid.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

namespace memfit::jinja {

// ---- construction ------------------------------------------------------------------------------

Value Value::undefined(std::string why) {
    Value v;
    v.s = std::move(why);
    return v;
}
Value Value::none() {
    Value v;
    v.type = Type::None;
    return v;
}
Value Value::boolean(bool b) {
    Value v;
    v.type = Type::Bool;
    v.i = b ? 1 : 0;
    return v;
}
Value Value::integer(int64_t x) {
    Value v;
    v.type = Type::Int;
    v.i = x;
    return v;
}
Value Value::number(double x) {
    Value v;
    v.type = Type::Float;
    v.f = x;
    return v;
}
void check_text_size(uint64_t bytes, const char * what) {
    if (bytes > kMaxTextBytes)
        throw RenderError(fmt::format("{} would make a string of {} bytes: more than the {} MiB a chat template may "
                                      "build", what, bytes, kMaxTextBytes >> 20));
}

void check_list_size(uint64_t items, const char * what) {
    if (items > kMaxListItems)
        throw RenderError(fmt::format("{} would make a list of {} items: more than the {} a chat template may build",
                                      what, items, kMaxListItems));
}

void check_list_bytes(const std::vector<Value> & items, const char * what, uint64_t copies) {
    uint64_t bytes = 0;
    for (const Value & v : items) bytes += v.is_str() ? v.s.size() : 0;
    if (copies > 0 && bytes > 0 && copies > kMaxListBytes / bytes)
        throw RenderError(fmt::format("{} would make a list holding {} bytes of strings: more than the {} MiB a chat "
                                      "template may build", what, bytes * copies, kMaxListBytes >> 20));
}

Value Value::string(std::string x) {
    check_text_size(x.size(), "the template");
    Value v;
    v.type = Type::Str;
    v.s = std::move(x);
    return v;
}
Value Value::make_list(std::vector<Value> items, Type kind) {
    check_list_size(items.size(), "the template");
    Value v;
    v.type = kind;
    v.list = std::make_shared<const std::vector<Value>>(std::move(items));
    return v;
}
Value Value::make_dict(Dict d) {
    Value v;
    v.type = Type::Dict;
    v.dict = std::make_shared<const Dict>(std::move(d));
    return v;
}
Value Value::object(std::shared_ptr<Object> o) {
    Value v;
    v.type = Type::Object;
    v.obj = std::move(o);
    return v;
}

void Value::require_defined() const {
    if (type == Type::Undefined) throw RenderError(s);
}

const Value * Dict::find(const Value & key) const {
    for (const auto & [k, v] : entries)
        if (py_eq(k, key)) return &v;
    return nullptr;
}

const Value * Dict::find(std::string_view key) const {
    for (const auto & [k, v] : entries)
        if (k.type == Type::Str && k.s == key) return &v;
    return nullptr;
}

void Dict::set(Value key, Value v) {
    for (auto & [k, old] : entries)
        if (py_eq(k, key)) {
            old = std::move(v);
            return;
        }
    entries.emplace_back(std::move(key), std::move(v));
}

std::string Object::str() const { return fmt::format("<{} object>", type_name()); }
Value Object::attr(const std::string & name) const {
    return Value::undefined(fmt::format("'{} object' has no attribute '{}'", type_name(), name));
}
Value Object::call(Context &, Args &) const {
    throw RenderError(fmt::format("'{}' object is not callable", type_name()));
}

// ---- Python semantics --------------------------------------------------------------------------

bool truthy(const Value & v) {
    switch (v.type) {
        case Type::Undefined:
        case Type::None: return false;
        case Type::Bool:
        case Type::Int: return v.i != 0;
        case Type::Float: return v.f != 0;
        case Type::Str: return !v.s.empty();
        case Type::List:
        case Type::Tuple: return !v.list->empty();
        case Type::Dict: return !v.dict->entries.empty();
        case Type::Object: return true;
    }
    return false;
}

std::string type_name(const Value & v) {
    switch (v.type) {
        case Type::Undefined: return "Undefined";
        case Type::None: return "NoneType";
        case Type::Bool: return "bool";
        case Type::Int: return "int";
        case Type::Float: return "float";
        case Type::Str: return "str";
        case Type::List: return "list";
        case Type::Tuple: return "tuple";
        case Type::Dict: return "dict";
        case Type::Object: return v.obj->type_name();
    }
    return "?";
}

std::string object_type_repr(const Value & v) {
    if (v.is_none()) return "None";
    return type_name(v) + " object";
}

std::string float_repr(double d) {
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);   // shortest
    std::string_view sci(buf, size_t(r.ptr - buf));
    std::string out;
    if (sci.front() == '-') {
        out += '-';
        sci.remove_prefix(1);
    }
    const size_t e = sci.find('e');
    int exp = 0;
    std::from_chars(sci.data() + e + (sci[e + 1] == '+' ? 2 : 1), sci.data() + sci.size(), exp);
    std::string digits;
    for (const char c : sci.substr(0, e))
        if (c != '.') digits += c;
    if (exp >= -4 && exp < 16) {   // Python's repr writes these positionally
        if (exp >= 0) {
            if (digits.size() < size_t(exp) + 1) digits.append(size_t(exp) + 1 - digits.size(), '0');
            out += digits.substr(0, size_t(exp) + 1);
            out += '.';
            out += digits.size() > size_t(exp) + 1 ? digits.substr(size_t(exp) + 1) : "0";
        } else {
            out += "0.";
            out.append(size_t(-exp - 1), '0');
            out += digits;
        }
        return out;
    }
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
    return out;
}

namespace {

bool py_printable(char32_t c) {
    if (c < 0x20 || c == 0x7f) return false;
    if (c < 0x7f) return true;
    switch (u_charType(UChar32(c))) {
        case U_CONTROL_CHAR: case U_FORMAT_CHAR: case U_SURROGATE: case U_PRIVATE_USE_CHAR:
        case U_UNASSIGNED: case U_LINE_SEPARATOR: case U_PARAGRAPH_SEPARATOR: case U_SPACE_SEPARATOR:
            return false;
        default: return true;
    }
}

std::string str_repr(const std::string & s) {
    const char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
    std::string out(1, quote);
    for (const char32_t c : decode_utf8(s)) {
        if (c == char32_t(quote) || c == '\\') {
            out += '\\';
            out += char(c);
        } else if (c == '\t') {
            out += "\\t";
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (py_printable(c)) {
            append_utf8(out, c);
        } else if (c <= 0xff) {
            out += fmt::format("\\x{:02x}", uint32_t(c));
        } else if (c <= 0xffff) {
            out += fmt::format("\\u{:04x}", uint32_t(c));
        } else {
            out += fmt::format("\\U{:08x}", uint32_t(c));
        }
    }
    out += quote;
    return out;
}

}  // namespace

std::string py_str(const Value & v) {
    switch (v.type) {
        case Type::Undefined: return "";
        case Type::Str: return v.s;
        case Type::Object: return v.obj->str();
        default: return py_repr(v);
    }
}

std::string py_repr(const Value & v) {
    switch (v.type) {
        case Type::Undefined: return "Undefined";
        case Type::None: return "None";
        case Type::Bool: return v.i ? "True" : "False";
        case Type::Int: return std::to_string(v.i);
        case Type::Float: return float_repr(v.f);
        case Type::Str: return str_repr(v.s);
        case Type::List:
        case Type::Tuple: {
            const bool tuple = v.type == Type::Tuple;
            std::string out = tuple ? "(" : "[";
            for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + py_repr((*v.list)[k]);
            if (tuple && v.list->size() == 1) out += ',';
            return out + (tuple ? ")" : "]");
        }
        case Type::Dict: {
            std::string out = "{";
            bool first = true;
            for (const auto & [k, x] : v.dict->entries) {
                out += (first ? "" : ", ") + py_repr(k) + ": " + py_repr(x);
                first = false;
            }
            return out + "}";
        }
        case Type::Object: return v.obj->str();
    }
    return "";
}

bool py_eq(const Value & a, const Value & b) {
    if (a.is_number() && b.is_number()) {
        if (a.is_int() && b.is_int()) return a.i == b.i;
        return a.as_double() == b.as_double();
    }
    if (a.type != b.type) return false;
    switch (a.type) {
        case Type::Undefined:
        case Type::None: return true;
        case Type::Str: return a.s == b.s;
        case Type::List:
        case Type::Tuple: {
            if (a.list->size() != b.list->size()) return false;
            for (size_t k = 0; k < a.list->size(); ++k)
                if (!py_eq((*a.list)[k], (*b.list)[k])) return false;
            return true;
        }
        case Type::Dict: {
            if (a.dict->entries.size() != b.dict->entries.size()) return false;
            for (const auto & [k, x] : a.dict->entries) {
                const Value * y = b.dict->find(k);
                if (!y || !py_eq(x, *y)) return false;
            }
            return true;
        }
        case Type::Object: return a.obj == b.obj;
        default: return false;
    }
}

int py_cmp(const Value & a, const Value & b, std::string_view op) {
    a.require_defined();
    b.require_defined();
    if (a.is_number() && b.is_number()) {
        if (a.is_int() && b.is_int()) return a.i < b.i ? -1 : a.i > b.i ? 1 : 0;
        const double x = a.as_double(), y = b.as_double();
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.type == b.type && a.type == Type::Str) return a.s.compare(b.s) < 0 ? -1 : a.s == b.s ? 0 : 1;   // UTF-8 orders as code points
    if (a.type == b.type && a.is_seq()) {
        const auto & x = *a.list;
        const auto & y = *b.list;
        for (size_t k = 0; k < x.size() && k < y.size(); ++k)
            if (!py_eq(x[k], y[k])) return py_cmp(x[k], y[k], op);
        return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
    }
    throw RenderError(fmt::format("'{}' not supported between instances of '{}' and '{}'", op, type_name(a), type_name(b)));
}

int64_t py_len(const Value & v) {
    switch (v.type) {
        case Type::Undefined: return 0;
        case Type::Str: return cp_length(v.s);
        case Type::List:
        case Type::Tuple: return int64_t(v.list->size());
        case Type::Dict: return int64_t(v.dict->entries.size());
        default: throw RenderError(fmt::format("object of type '{}' has no len()", type_name(v)));
    }
}

std::vector<Value> iterate(const Value & v) {
    switch (v.type) {
        case Type::Undefined: return {};
        case Type::List:
        case Type::Tuple: return *v.list;
        case Type::Dict: {
            std::vector<Value> keys;
            for (const auto & e : v.dict->entries) keys.push_back(e.first);
            return keys;
        }
        case Type::Str: {
            std::vector<Value> chars;
            if (v.s.size() > kMaxListItems) check_list_size(decode_utf8(v.s).size(), "iterating a string");
            for (const char32_t c : decode_utf8(v.s)) {
                std::string one;
                append_utf8(one, c);
                chars.push_back(Value::string(std::move(one)));
            }
            return chars;
        }
        default: throw RenderError(fmt::format("'{}' object is not iterable", type_name(v)));
    }
}

// ---- json.dumps --------------------------------------------------------------------------------

namespace {

void json_string(std::string & out, const std::string & s, bool ensure_ascii) {
    out += '"';
    for (const char32_t c : decode_utf8(s)) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            default:
                if (c < 0x20) {
                    out += fmt::format("\\u{:04x}", uint32_t(c));
                } else if (ensure_ascii && c > 0x7f) {
                    if (c > 0xffff) {
                        const uint32_t x = uint32_t(c) - 0x10000;
                        out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (x >> 10), 0xdc00 + (x & 0x3ff));
                    } else {
                        out += fmt::format("\\u{:04x}", uint32_t(c));
                    }
                } else {
                    append_utf8(out, c);
                }
        }
    }
    out += '"';
}

std::string json_float(double d) {
    if (std::isnan(d)) return "NaN";
    if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
    return float_repr(d);
}

void json_value(std::string & out, const Value & v, const JsonStyle & st, int level) {
    const auto newline = [&](int lvl) {
        out += '\n';
        for (int k = 0; k < lvl; ++k) out += st.indent;
    };
    switch (v.type) {
        case Type::None: out += "null"; return;
        case Type::Bool: out += v.i ? "true" : "false"; return;
        case Type::Int: out += std::to_string(v.i); return;
        case Type::Float: out += json_float(v.f); return;
        case Type::Str: json_string(out, v.s, st.ensure_ascii); return;
        case Type::List:
        case Type::Tuple: {
            if (v.list->empty()) {
                out += "[]";
                return;
            }
            out += '[';
            for (size_t k = 0; k < v.list->size(); ++k) {
                if (k) out += st.item_sep;
                if (st.pretty) newline(level + 1);
                json_value(out, (*v.list)[k], st, level + 1);
            }
            if (st.pretty) newline(level);
            out += ']';
            return;
        }
        case Type::Dict: {
            if (v.dict->entries.empty()) {
                out += "{}";
                return;
            }
            std::vector<const std::pair<Value, Value> *> entries;
            for (const auto & e : v.dict->entries) entries.push_back(&e);
            if (st.sort_keys)
                std::stable_sort(entries.begin(), entries.end(),
                                 [](const auto * a, const auto * b) { return py_cmp(a->first, b->first, "<") < 0; });
            out += '{';
            bool first = true;
            for (const auto * e : entries) {
                const Value & k = e->first;
                std::string key;
                if (k.is_str()) key = k.s;
                else if (k.type == Type::Bool) key = k.i ? "true" : "false";
                else if (k.type == Type::Int) key = std::to_string(k.i);
                else if (k.type == Type::Float) key = json_float(k.f);
                else if (k.is_none()) key = "null";
                else throw RenderError(fmt::format("keys must be str, int, float, bool or None, not {}", type_name(k)));
                if (!first) out += st.item_sep;
                first = false;
                if (st.pretty) newline(level + 1);
                json_string(out, key, st.ensure_ascii);
                out += st.key_sep;
                json_value(out, e->second, st, level + 1);
            }
            if (st.pretty) newline(level);
            out += '}';
            return;
        }
        default: throw RenderError(fmt::format("Object of type {} is not JSON serializable", type_name(v)));
    }
}

}  // namespace

std::string to_json(const Value & v, const JsonStyle & style) {
    std::string out;
    json_value(out, v, style, 0);
    return out;
}

// ---- UTF-8 -------------------------------------------------------------------------------------

std::u32string decode_utf8(std::string_view s) {
    std::u32string out;
    out.reserve(s.size());
    for (size_t k = 0; k < s.size();) {
        const auto c0 = static_cast<unsigned char>(s[k]);
        size_t len = c0 < 0x80 ? 1 : (c0 & 0xe0) == 0xc0 ? 2 : (c0 & 0xf0) == 0xe0 ? 3 : (c0 & 0xf8) == 0xf0 ? 4 : 0;
        char32_t cp = len == 1 ? c0 : len == 2 ? (c0 & 0x1f) : len == 3 ? (c0 & 0x0f) : (c0 & 0x07);
        bool ok = len > 0 && k + len <= s.size();
        for (size_t j = 1; ok && j < len; ++j) {
            const auto cj = static_cast<unsigned char>(s[k + j]);
            ok = (cj & 0xc0) == 0x80;
            cp = (cp << 6) | (cj & 0x3f);
        }
        // Overlong forms, surrogates and values past U+10FFFF are not UTF-8 either.
        ok = ok && !(len == 2 && cp < 0x80) && !(len == 3 && cp < 0x800) && !(len == 4 && (cp < 0x10000 || cp > 0x10ffff)) &&
             !(cp >= 0xd800 && cp <= 0xdfff);
        if (!ok) {
            out += char32_t(0xdc00 + c0);   // surrogateescape
            ++k;
        } else {
            out += cp;
            k += len;
        }
    }
    return out;
}

void append_utf8(std::string & out, char32_t c) {
    if (c >= 0xdc80 && c <= 0xdcff) {   // a byte that was not UTF-8 goes back as it was
        out += char(c - 0xdc00);
    } else if (c < 0x80) {
        out += char(c);
    } else if (c < 0x800) {
        out += char(0xc0 | (c >> 6));
        out += char(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
        out += char(0xe0 | (c >> 12));
        out += char(0x80 | ((c >> 6) & 0x3f));
        out += char(0x80 | (c & 0x3f));
    } else {
        out += char(0xf0 | (c >> 18));
        out += char(0x80 | ((c >> 12) & 0x3f));
        out += char(0x80 | ((c >> 6) & 0x3f));
        out += char(0x80 | (c & 0x3f));
    }
}

std::string encode_utf8(std::u32string_view s) {
    std::string out;
    out.reserve(s.size());
    for (const char32_t c : s) append_utf8(out, c);
    return out;
}

int64_t cp_length(std::string_view s) {
    bool ascii = true;
    for (const char c : s) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
    return ascii ? int64_t(s.size()) : int64_t(decode_utf8(s).size());
}

bool is_py_space(char32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// ---- case -----------------------------------------------------------------------------------------

namespace {

bool ascii_only(std::string_view s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

// ICU's full case mapping (ß -> SS), as Python's; text with bytes that are not UTF-8 is mapped
// one code point at a time instead, so that those bytes survive.
std::string icu_case(std::string_view s, bool upper) {
    const std::u32string cps = decode_utf8(s);
    const bool clean = std::none_of(cps.begin(), cps.end(), [](char32_t c) { return c >= 0xdc80 && c <= 0xdcff; });
    if (!clean) {
        std::string out;
        for (const char32_t c : cps) append_utf8(out, upper ? py_upper_cp(c) : py_lower_cp(c));
        return out;
    }
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), int32_t(s.size())));
    if (upper) u.toUpper(icu::Locale::getRoot());
    else u.toLower(icu::Locale::getRoot());
    std::string out;
    u.toUTF8String(out);
    return out;
}

}  // namespace

char32_t py_upper_cp(char32_t c) { return c >= 0xdc80 && c <= 0xdcff ? c : char32_t(u_toupper(UChar32(c))); }
char32_t py_lower_cp(char32_t c) { return c >= 0xdc80 && c <= 0xdcff ? c : char32_t(u_tolower(UChar32(c))); }
char32_t py_title_cp(char32_t c) { return c >= 0xdc80 && c <= 0xdcff ? c : char32_t(u_totitle(UChar32(c))); }
bool py_is_cased(char32_t c) { return u_hasBinaryProperty(UChar32(c), UCHAR_CASED); }
bool py_is_upper_cp(char32_t c) { return u_hasBinaryProperty(UChar32(c), UCHAR_UPPERCASE); }
bool py_is_lower_cp(char32_t c) { return u_hasBinaryProperty(UChar32(c), UCHAR_LOWERCASE); }
bool py_is_alpha_cp(char32_t c) { return u_isalpha(UChar32(c)); }
bool py_is_digit_cp(char32_t c) {
    const int t = u_getIntPropertyValue(UChar32(c), UCHAR_NUMERIC_TYPE);
    return t == U_NT_DECIMAL || t == U_NT_DIGIT;
}
bool py_is_alnum_cp(char32_t c) {
    return u_isalpha(UChar32(c)) || u_getIntPropertyValue(UChar32(c), UCHAR_NUMERIC_TYPE) != U_NT_NONE;
}

std::string py_upper(std::string_view s) {
    if (!ascii_only(s)) return icu_case(s, true);
    std::string out(s);
    for (char & c : out)
        if (c >= 'a' && c <= 'z') c = char(c - 32);
    return out;
}

std::string py_lower(std::string_view s) {
    if (!ascii_only(s)) return icu_case(s, false);
    std::string out(s);
    for (char & c : out)
        if (c >= 'A' && c <= 'Z') c = char(c + 32);
    return out;
}

std::string py_title(std::string_view s) {
    std::string out;
    bool prev_cased = false;
    for (const char32_t c : decode_utf8(s)) {
        append_utf8(out, prev_cased ? py_lower_cp(c) : py_title_cp(c));
        prev_cased = py_is_cased(c);
    }
    return out;
}

std::string py_capitalize(std::string_view s) {
    const std::u32string cps = decode_utf8(s);
    if (cps.empty()) return "";
    std::string out;
    append_utf8(out, py_title_cp(cps[0]));
    return out + py_lower(encode_utf8(std::u32string_view(cps).substr(1)));
}

}  // namespace memfit::jinja
