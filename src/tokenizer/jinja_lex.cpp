#include "tokenizer/jinja_lex.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "core/error.h"
#include "tokenizer/jinja_value.h"

namespace memfit::jinja {

void syntax_error(int line, const std::string & what) {
    throw FormatError(fmt::format("chat template line {}: {}", line, what));
}

namespace {

constexpr size_t kMaxTagTokens = 4000;

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

int count_newlines(std::string_view s) {
    int n = 0;
    for (const char c : s) n += c == '\n';
    return n;
}

// Python's str.rstrip(): every trailing whitespace character.
std::string rstrip_py(const std::string & s) {
    std::u32string cps = decode_utf8(s);
    while (!cps.empty() && is_py_space(cps.back())) cps.pop_back();
    return encode_utf8(cps);
}

// lstrip_blocks: spaces and tabs between the start of the line and a block tag go, when
// nothing else is there (`line_starting`: the text begins a line).
std::string lstrip_block(const std::string & text, bool line_starting) {
    const size_t nl = text.rfind('\n');
    const size_t from = nl == std::string::npos ? 0 : nl + 1;
    if (from == 0 && !line_starting) return text;
    if (text.find_first_not_of(" \t", from) != std::string::npos) return text;
    return text.substr(0, from);
}

class Lexer {
public:
    explicit Lexer(const std::string & source) {
        // jinja2 splits the source on \r\n, \r and \n, drops one trailing newline and joins with \n.
        for (size_t k = 0; k < source.size(); ++k) {
            if (source[k] == '\r') {
                src_ += '\n';
                if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
            } else {
                src_ += source[k];
            }
        }
        if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    }

    std::vector<Token> run() {
        bool line_starting = true;   // what lstrip_blocks asks: does the text start a line?
        while (pos_ < src_.size()) {
            const size_t tag = next_tag(pos_);
            std::string text = src_.substr(pos_, tag == std::string::npos ? std::string::npos : tag - pos_);
            const int text_line = line_;
            line_ += count_newlines(text);
            if (tag == std::string::npos) {
                emit_text(text, text_line);
                break;
            }
            const char kind = src_[tag + 1];
            const char mod = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+') ? src_[tag + 2] : 0;
            if (mod == '-') text = rstrip_py(text);
            else if (mod != '+' && kind != '{') text = lstrip_block(text, line_starting);
            emit_text(text, text_line);
            pos_ = tag + 2 + (mod ? 1 : 0);
            if (kind == '#') comment();
            else if (kind == '%' && raw_block()) {}
            else tag_tokens(kind);
            line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
        }
        push(Tok::End, "", line_);
        return std::move(out_);
    }

private:
    size_t next_tag(size_t from) const {
        for (size_t k = src_.find('{', from); k != std::string::npos; k = src_.find('{', k + 1))
            if (k + 1 < src_.size() && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
        return std::string::npos;
    }

    void push(Tok kind, std::string text, int line) {
        Token t;
        t.kind = kind;
        t.text = std::move(text);
        t.line = line;
        out_.push_back(std::move(t));
    }
    void emit_text(const std::string & text, int line) {
        if (!text.empty()) push(Tok::Text, text, line);
    }

    bool at(std::string_view s) const { return src_.compare(pos_, s.size(), s) == 0; }

    void skip_space() {
        while (pos_ < src_.size() && is_space(src_[pos_])) line_ += src_[pos_++] == '\n';
    }

    // After a closing delimiter: '-' strips all whitespace; trim_blocks one newline unless '+'.
    void after_close(char mod, bool trim) {
        if (mod == '-') skip_space();
        else if (trim && mod != '+' && pos_ < src_.size() && src_[pos_] == '\n') ++pos_, ++line_;
    }

    void comment() {
        const int start = line_;
        const size_t end = src_.find("#}", pos_);
        if (end == std::string::npos) syntax_error(start, "a comment {# is not closed");
        const char mod = end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
        line_ += count_newlines(std::string_view(src_).substr(pos_, end - pos_));
        pos_ = end + 2;
        after_close(mod, true);
    }

    // {% raw %}...{% endraw %}: the text between, as it is. False when the tag is not raw.
    bool raw_block() {
        size_t p = pos_;
        while (p < src_.size() && is_space(src_[p])) ++p;
        if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && is_name_char(src_[p + 3]))) return false;
        p += 3;
        while (p < src_.size() && is_space(src_[p])) ++p;
        const bool minus = src_.compare(p, 3, "-%}") == 0;
        if (!minus && src_.compare(p, 2, "%}") != 0) return false;
        const int start = line_;
        line_ += count_newlines(std::string_view(src_).substr(pos_, p - pos_));
        pos_ = p + (minus ? 3 : 2);
        if (minus) skip_space();
        for (size_t k = src_.find("{%", pos_); k != std::string::npos; k = src_.find("{%", k + 2)) {
            size_t q = k + 2;
            const char mod = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q++] : 0;
            while (q < src_.size() && is_space(src_[q])) ++q;
            if (src_.compare(q, 6, "endraw") != 0) continue;
            q += 6;
            while (q < src_.size() && is_space(src_[q])) ++q;
            const char end_mod = src_.compare(q, 3, "-%}") == 0 ? '-' : src_.compare(q, 3, "+%}") == 0 ? '+' : 0;
            if (!end_mod && src_.compare(q, 2, "%}") != 0) continue;
            std::string text = src_.substr(pos_, k - pos_);
            const int text_line = line_;
            line_ += count_newlines(std::string_view(src_).substr(pos_, q - pos_));
            if (mod == '-') text = rstrip_py(text);
            else if (mod != '+') text = lstrip_block(text, false);
            emit_text(text, text_line);
            pos_ = q + (end_mod ? 3 : 2);
            after_close(end_mod, true);
            return true;
        }
        syntax_error(start, "{% raw %} without {% endraw %}");
    }

    // The tokens of a {{ ... }} or {% ... %} up to and including its closing delimiter.
    void tag_tokens(char kind) {
        const int start = line_;
        push(kind == '{' ? Tok::VarBegin : Tok::BlockBegin, "", start);
        std::string brackets;   // the closers still expected
        const size_t first = out_.size();
        for (;;) {
            // A bound on one tag's tokens bounds its expression's depth, so that evaluating
            // (and freeing) it cannot exhaust the stack.
            if (out_.size() - first > kMaxTagTokens)
                syntax_error(start, fmt::format("a tag of more than {} tokens (memfit's limit)", kMaxTagTokens));
            skip_space();
            if (pos_ >= src_.size())
                syntax_error(start, kind == '{' ? "a {{ is not closed" : "a {% is not closed");
            if (brackets.empty()) {   // the closing delimiter counts only outside brackets
                const std::string close = kind == '{' ? "}}" : "%}";
                const char mod = src_[pos_];
                if ((mod == '-' || (mod == '+' && kind == '%')) && src_.compare(pos_ + 1, 2, close) == 0) {
                    pos_ += 3;
                    push(kind == '{' ? Tok::VarEnd : Tok::BlockEnd, "", line_);
                    after_close(mod, kind == '%');
                    return;
                }
                if (at(close)) {
                    pos_ += 2;
                    push(kind == '{' ? Tok::VarEnd : Tok::BlockEnd, "", line_);
                    after_close(0, kind == '%');
                    return;
                }
            }
            const char c = src_[pos_];
            if (is_digit(c)) number();
            else if (is_name_start(c)) name();
            else if (c == '\'' || c == '"') string_literal();
            else op(brackets);
        }
    }

    void name() {
        const size_t b = pos_;
        while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
        push(Tok::Name, src_.substr(b, pos_ - b), line_);
    }

    // Digits with '_' between them; a float has a fraction or an exponent (not after a '.').
    void number() {
        const auto digits = [&](std::string & into) {
            while (pos_ < src_.size() && (is_digit(src_[pos_]) || (src_[pos_] == '_' && pos_ + 1 < src_.size() && is_digit(src_[pos_ + 1]))))
                if (src_[pos_++] != '_') into += src_[pos_ - 1];
        };
        const bool after_dot = pos_ > 0 && src_[pos_ - 1] == '.';
        std::string text;
        digits(text);
        bool is_float = false;
        if (!after_dot && pos_ + 1 < src_.size() && src_[pos_] == '.' && is_digit(src_[pos_ + 1])) {
            text += '.';
            ++pos_;
            digits(text);
            is_float = true;
        }
        if (!after_dot && pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
            size_t p = pos_ + 1;
            if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
            if (p < src_.size() && is_digit(src_[p])) {
                text += 'e';
                text.append(src_, pos_ + 1, p - pos_ - 1);
                pos_ = p;
                digits(text);
                is_float = true;
            }
        }
        Token t;
        t.line = line_;
        if (is_float) {
            t.kind = Tok::Float;
            t.f = std::strtod(text.c_str(), nullptr);
        } else {
            t.kind = Tok::Int;
            errno = 0;
            char * end = nullptr;
            t.i = std::strtoll(text.c_str(), &end, 10);
            if (errno == ERANGE) syntax_error(line_, fmt::format("the integer {} does not fit in 64 bits", text));
        }
        t.text = text;
        out_.push_back(std::move(t));
    }

    // A quoted string with Python's escapes (jinja2 decodes them as "unicode-escape").
    void string_literal() {
        const int start = line_;
        const char quote = src_[pos_++];
        std::string value;
        for (;;) {
            if (pos_ >= src_.size()) syntax_error(start, "a string is not closed");
            const char c = src_[pos_++];
            if (c == quote) break;
            line_ += c == '\n';
            if (c != '\\') {
                value += c;
                continue;
            }
            if (pos_ >= src_.size()) syntax_error(start, "a string is not closed");
            const char e = src_[pos_++];
            const auto hex = [&](int n) {
                if (pos_ + size_t(n) > src_.size()) syntax_error(line_, "a \\x, \\u or \\U escape is cut short");
                uint32_t v = 0;
                for (int k = 0; k < n; ++k) {
                    const char h = src_[pos_++];
                    const int d = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
                    if (d < 0) syntax_error(line_, "a \\x, \\u or \\U escape with a character that is not hex");
                    v = v * 16 + uint32_t(d);
                }
                if (v > 0x10ffff) syntax_error(line_, "a \\U escape past U+10FFFF");
                append_utf8(value, char32_t(v));
            };
            switch (e) {
                case '\n': ++line_; break;   // a continued line
                case '\\': value += '\\'; break;
                case '\'': value += '\''; break;
                case '"': value += '"'; break;
                case 'a': value += '\a'; break;
                case 'b': value += '\b'; break;
                case 'f': value += '\f'; break;
                case 'n': value += '\n'; break;
                case 'r': value += '\r'; break;
                case 't': value += '\t'; break;
                case 'v': value += '\v'; break;
                case 'x': hex(2); break;
                case 'u': hex(4); break;
                case 'U': hex(8); break;
                case 'N': syntax_error(line_, "a \\N{name} escape is not implemented (write the character or \\u)");
                default:
                    if (e >= '0' && e <= '7') {   // up to three octal digits
                        uint32_t v = uint32_t(e - '0');
                        for (int k = 0; k < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7'; ++k)
                            v = v * 8 + uint32_t(src_[pos_++] - '0');
                        append_utf8(value, char32_t(v));
                    } else {   // Python keeps an unknown escape as it is
                        value += '\\';
                        value += e;
                        line_ += e == '\n';
                    }
            }
        }
        push(Tok::String, std::move(value), start);
    }

    void op(std::string & brackets) {
        static const char * const two[] = {"**", "//", "==", "!=", ">=", "<="};
        for (const char * t : two)
            if (at(t)) {
                push(Tok::Op, t, line_);
                pos_ += 2;
                return;
            }
        const char c = src_[pos_];
        if (!std::strchr("+-*/%~[](){}<>=.:|,;", c)) syntax_error(line_, fmt::format("unexpected character '{}'", c));
        if (c == '(') brackets += ')';
        if (c == '[') brackets += ']';
        if (c == '{') brackets += '}';
        if (c == ')' || c == ']' || c == '}') {
            if (brackets.empty()) syntax_error(line_, fmt::format("unexpected '{}'", c));
            if (brackets.back() != c) syntax_error(line_, fmt::format("unexpected '{}', expected '{}'", c, brackets.back()));
            brackets.pop_back();
        }
        push(Tok::Op, std::string(1, c), line_);
        ++pos_;
    }

    std::string src_;
    size_t pos_ = 0;
    int line_ = 1;
    std::vector<Token> out_;
};

}  // namespace

std::vector<Token> lex(const std::string & source) { return Lexer(source).run(); }

}  // namespace memfit::jinja
