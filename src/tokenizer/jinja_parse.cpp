// The parser: jinja2 3.1's grammar (its precedence, its tuple rules, its test arguments) over
// the lexer's tokens, into the tree of jinja_ast.h. What it does not implement is one
// FormatError naming the construct and the line.
#include <initializer_list>
#include <string_view>

#include <fmt/format.h>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_lex.h"

namespace memfit::jinja {

namespace {

constexpr int kMaxNesting = 200;   // of expressions and blocks: deeper is refused, not a stack overflow

using Names = std::initializer_list<std::string_view>;

bool contains(Names names, std::string_view n) {
    for (const auto & x : names)
        if (x == n) return true;
    return false;
}

class Parser {
public:
    explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

    Body parse_all() { return body({}, "", 0); }

private:
    // ---- tokens -----------------------------------------------------------------------------
    const Token & cur() const { return toks_[pos_]; }
    const Token & peek() const { return toks_[std::min(pos_ + 1, toks_.size() - 1)]; }
    void next() {
        if (pos_ + 1 < toks_.size()) ++pos_;
    }
    bool is_op(std::string_view op) const { return cur().kind == Tok::Op && cur().text == op; }
    bool is_name(std::string_view n) const { return cur().kind == Tok::Name && cur().text == n; }
    bool skip_op(std::string_view op) {
        if (!is_op(op)) return false;
        next();
        return true;
    }
    bool skip_name(std::string_view n) {
        if (!is_name(n)) return false;
        next();
        return true;
    }

    static std::string describe(const Token & t) {
        switch (t.kind) {
            case Tok::Text: return "text";
            case Tok::VarBegin: return "'{{'";
            case Tok::VarEnd: return "'}}'";
            case Tok::BlockBegin: return "'{%'";
            case Tok::BlockEnd: return "'%}'";
            case Tok::Name: return "'" + t.text + "'";
            case Tok::String: return "a string";
            case Tok::Int:
            case Tok::Float: return "the number " + t.text;
            case Tok::Op: return "'" + t.text + "'";
            case Tok::End: return "the end of the template";
        }
        return "?";
    }

    [[noreturn]] void fail(const std::string & what) const { syntax_error(cur().line, what); }

    void expect_op(std::string_view op) {
        if (!skip_op(op)) fail(fmt::format("expected '{}', got {}", op, describe(cur())));
    }
    std::string expect_name() {
        if (cur().kind != Tok::Name) fail(fmt::format("expected a name, got {}", describe(cur())));
        std::string n = cur().text;
        next();
        return n;
    }
    void expect_block_end() {
        if (cur().kind != Tok::BlockEnd) fail(fmt::format("expected '%}}', got {}", describe(cur())));
        next();
    }
    // The '%}' that opens a block's body; jinja2 allows a ':' before it, as in Python.
    void body_start() {
        skip_op(":");
        expect_block_end();
    }

    struct Nest {   // counts nesting, refusing what is too deep
        explicit Nest(Parser & p) : parser(p) {
            if (++parser.depth_ > kMaxNesting) parser.fail("the template nests deeper than memfit allows");
        }
        ~Nest() { --parser.depth_; }
        Parser & parser;
    };

    // ---- statements -------------------------------------------------------------------------

    // Statements up to a {% name %} with a name in `ends` (left as the current token, after its
    // '{%'), or to the end of the template when `ends` is empty.
    Body body(Names ends, std::string_view opener, int opener_line) {
        Nest nest(*this);
        Body out;
        for (;;) {
            const Token & t = cur();
            switch (t.kind) {
                case Tok::End:
                    if (ends.size() != 0)
                        syntax_error(opener_line, fmt::format("{{% {} %}} without {{% {} %}}", opener, *ends.begin()));
                    return out;
                case Tok::Text:
                    out.push_back(std::make_unique<TextStmt>(t.line, t.text));
                    next();
                    break;
                case Tok::VarBegin: {
                    const int line = t.line;
                    next();
                    ExprPtr e = tuple(true, {});
                    if (cur().kind != Tok::VarEnd) fail(fmt::format("expected '}}}}', got {}", describe(cur())));
                    next();
                    out.push_back(std::make_unique<OutputStmt>(line, std::move(e)));
                    break;
                }
                case Tok::BlockBegin:
                    next();
                    if (cur().kind == Tok::Name && contains(ends, cur().text)) return out;
                    out.push_back(statement());
                    break;
                default: fail(fmt::format("unexpected {}", describe(t)));
            }
        }
    }

    // The end tag `name` (current) closes a block: skip it and its '%}'.
    void end_tag() {
        next();
        expect_block_end();
    }

    StmtPtr statement() {
        const int line = cur().line;
        if (cur().kind != Tok::Name) fail(fmt::format("expected a tag name, got {}", describe(cur())));
        const std::string tag = cur().text;
        if (tag == "if") return if_stmt();
        if (tag == "for") return for_stmt();
        if (tag == "set") return set_stmt();
        if (tag == "macro") return macro_stmt();
        if (tag == "call") return call_stmt();
        if (tag == "filter") return filter_stmt();
        if (tag == "with") return with_stmt();
        if (tag == "generation") {   // transformers' AssistantTracker tag: its body, as it is
            auto s = std::make_unique<PlainBlockStmt>(line);
            next();
            body_start();
            s->body = body({"endgeneration"}, "generation", line);
            end_tag();
            return s;
        }
        if (tag == "break" || tag == "continue") {
            if (loops_ == 0) fail(fmt::format("{{% {} %}} outside a for loop", tag));
            next();
            expect_block_end();
            return std::make_unique<LoopControlStmt>(line, tag == "break" ? Flow::Break : Flow::Continue);
        }
        static const Names kNotImplemented = {"extends", "block", "include", "import", "from", "autoescape", "do",
                                              "trans", "pluralize", "debug"};
        if (contains(kNotImplemented, tag))
            fail(fmt::format("{{% {} %}} is not implemented (memfit renders one self-contained chat template)", tag));
        if (tag.starts_with("end") || tag == "else" || tag == "elif") fail(fmt::format("unexpected {{% {} %}}", tag));
        fail(fmt::format("unknown tag '{}'", tag));
    }

    StmtPtr if_stmt() {
        auto s = std::make_unique<IfStmt>(cur().line);
        const int line = cur().line;
        next();
        for (;;) {
            ExprPtr cond = tuple(false, {});
            body_start();
            s->branches.emplace_back(std::move(cond), body({"elif", "else", "endif"}, "if", line));
            if (skip_name("elif")) continue;
            if (skip_name("else")) {
                body_start();
                s->otherwise = body({"endif"}, "if", line);
            }
            end_tag();
            return s;
        }
    }

    StmtPtr for_stmt() {
        auto s = std::make_unique<ForStmt>(cur().line);
        const int line = cur().line;
        next();
        const bool parens = skip_op("(");
        s->target.names.push_back(expect_name());
        while (skip_op(",")) {
            s->target.unpack = true;
            if (is_name("in") || is_op(")")) break;
            s->target.names.push_back(expect_name());
        }
        if (parens) expect_op(")");
        if (!skip_name("in")) fail(fmt::format("expected 'in', got {}", describe(cur())));
        s->iter = tuple(false, {"recursive"});
        if (skip_name("if")) s->filter = expression(true);
        if (is_name("recursive")) fail("recursive for loops are not implemented");
        body_start();
        ++loops_;
        s->body = body({"endfor", "else"}, "for", line);
        --loops_;
        if (skip_name("else")) {
            body_start();
            s->otherwise = body({"endfor"}, "for", line);
        }
        end_tag();
        return s;
    }

    Target set_target() {
        Target t;
        t.names.push_back(expect_name());
        if (skip_op(".")) {
            t.ns_attr = expect_name();
            return t;
        }
        while (skip_op(",")) {
            t.unpack = true;
            if (is_op("=") || is_op("|") || cur().kind == Tok::BlockEnd) break;
            t.names.push_back(expect_name());
        }
        return t;
    }

    StmtPtr set_stmt() {
        const int line = cur().line;
        next();
        Target target = set_target();
        if (skip_op("=")) {
            ExprPtr value = tuple(true, {});
            expect_block_end();
            return std::make_unique<SetStmt>(line, std::move(target), std::move(value));
        }
        auto s = std::make_unique<SetBlockStmt>(line);
        s->target = std::move(target);
        while (skip_op("|")) s->filters.push_back(filter_call());
        body_start();
        s->body = body({"endset"}, "set", line);
        end_tag();
        return s;
    }

    // (a, b=default, ...) of a macro or a call block.
    void signature(MacroDef & def) {
        expect_op("(");
        bool defaults = false;
        while (!is_op(")")) {
            if (!def.params.empty()) expect_op(",");
            if (is_op(")")) break;
            std::string name = expect_name();
            ExprPtr dflt;
            if (skip_op("=")) dflt = expression(true);
            else if (defaults) fail("a parameter without a default after one with a default");
            defaults = defaults || dflt;
            def.params.emplace_back(std::move(name), std::move(dflt));
        }
        next();
    }

    // A macro's (or call block's) body: loops outside it do not count for break/continue.
    Body macro_body(MacroDef & def, std::string_view end, std::string_view opener, int line) {
        macros_.push_back(&def);
        const int loops = loops_;
        loops_ = 0;
        Body b = body({end}, opener, line);
        loops_ = loops;
        macros_.pop_back();
        return b;
    }

    StmtPtr macro_stmt() {
        auto s = std::make_unique<MacroStmt>(cur().line);
        next();
        s->def.name = expect_name();
        signature(s->def);
        body_start();
        s->def.body = macro_body(s->def, "endmacro", "macro", s->line);
        end_tag();
        return s;
    }

    StmtPtr call_stmt() {
        auto s = std::make_unique<CallBlockStmt>(cur().line);
        next();
        s->caller.name = "caller";
        if (is_op("(")) signature(s->caller);
        ExprPtr e = expression(true);
        if (!dynamic_cast<CallExpr *>(e.get())) fail("{% call %} needs a call, as in {% call m(x) %}");
        s->call.reset(static_cast<CallExpr *>(e.release()));
        body_start();
        s->caller.body = macro_body(s->caller, "endcall", "call", s->line);
        end_tag();
        return s;
    }

    StmtPtr filter_stmt() {
        auto s = std::make_unique<FilterBlockStmt>(cur().line);
        next();
        do s->filters.push_back(filter_call());
        while (skip_op("|"));
        body_start();
        s->body = body({"endfilter"}, "filter", s->line);
        end_tag();
        return s;
    }

    StmtPtr with_stmt() {
        auto s = std::make_unique<WithStmt>(cur().line);
        next();
        while (cur().kind != Tok::BlockEnd) {
            if (!s->assigns.empty()) expect_op(",");
            std::string name = expect_name();
            expect_op("=");
            s->assigns.emplace_back(std::move(name), expression(true));
        }
        body_start();
        s->body = body({"endwith"}, "with", s->line);
        end_tag();
        return s;
    }

    // ---- expressions ------------------------------------------------------------------------

    // `a, b` is a tuple where jinja2 allows one: output, set, the for's iterable, parentheses.
    ExprPtr tuple(bool with_condexpr, Names extra_end, bool explicit_parens = false) {
        const int line = cur().line;
        std::vector<ExprPtr> items;
        bool is_tuple = false;
        for (;;) {
            if (!items.empty()) expect_op(",");
            if (cur().kind == Tok::VarEnd || cur().kind == Tok::BlockEnd || is_op(")") ||
                (cur().kind == Tok::Name && contains(extra_end, cur().text)))
                break;
            items.push_back(expression(with_condexpr));
            if (is_op(",")) is_tuple = true;
            else break;
        }
        if (!is_tuple) {
            if (!items.empty()) return std::move(items[0]);
            if (!explicit_parens) fail(fmt::format("expected an expression, got {}", describe(cur())));
        }
        auto t = std::make_unique<ListExpr>(line, Type::Tuple);
        t->items = std::move(items);
        return t;
    }

    ExprPtr expression(bool with_condexpr) { return with_condexpr ? cond_expr() : or_expr(); }

    ExprPtr cond_expr() {
        Nest nest(*this);
        ExprPtr e = or_expr();
        while (is_name("if")) {
            const int line = cur().line;
            next();
            ExprPtr cond = or_expr();
            ExprPtr otherwise = skip_name("else") ? cond_expr() : nullptr;
            e = std::make_unique<CondExpr>(line, std::move(cond), std::move(e), std::move(otherwise));
        }
        return e;
    }

    ExprPtr binary_chain(ExprPtr (Parser::*operand)(), std::initializer_list<std::pair<std::string_view, BinaryExpr::Op>> ops,
                         bool names) {
        ExprPtr e = (this->*operand)();
        for (;;) {
            const auto * hit = static_cast<const std::pair<std::string_view, BinaryExpr::Op> *>(nullptr);
            for (const auto & o : ops)
                if (names ? is_name(o.first) : is_op(o.first)) hit = &o;
            if (!hit) return e;
            const int line = cur().line;
            next();
            ExprPtr rhs = (this->*operand)();
            e = std::make_unique<BinaryExpr>(line, hit->second, std::move(e), std::move(rhs));
        }
    }

    ExprPtr or_expr() { return binary_chain(&Parser::and_expr, {{"or", BinaryExpr::Or}}, true); }
    ExprPtr and_expr() { return binary_chain(&Parser::not_expr, {{"and", BinaryExpr::And}}, true); }

    ExprPtr not_expr() {
        if (!is_name("not")) return compare();
        Nest nest(*this);
        const int line = cur().line;
        next();
        return std::make_unique<UnaryExpr>(line, UnaryExpr::Not, not_expr());
    }

    ExprPtr compare() {
        static const std::pair<std::string_view, CompareExpr::Op> kOps[] = {
            {"==", CompareExpr::Eq}, {"!=", CompareExpr::Ne}, {"<", CompareExpr::Lt},
            {"<=", CompareExpr::Le}, {">", CompareExpr::Gt}, {">=", CompareExpr::Ge}};
        const int line = cur().line;
        ExprPtr head = math1();
        std::unique_ptr<CompareExpr> cmp;
        for (;;) {
            CompareExpr::Op op{};
            bool found = false;
            for (const auto & [text, o] : kOps)
                if (is_op(text)) op = o, found = true;
            if (found) {
                next();
            } else if (is_name("in")) {
                next();
                op = CompareExpr::In;
            } else if (is_name("not") && peek().kind == Tok::Name && peek().text == "in") {
                next();
                next();
                op = CompareExpr::NotIn;
            } else {
                break;
            }
            if (!cmp) cmp = std::make_unique<CompareExpr>(line, std::move(head));
            cmp->rest.emplace_back(op, math1());
        }
        if (cmp) return cmp;
        return head;
    }

    ExprPtr math1() { return binary_chain(&Parser::concat, {{"+", BinaryExpr::Add}, {"-", BinaryExpr::Sub}}, false); }
    ExprPtr concat() { return binary_chain(&Parser::math2, {{"~", BinaryExpr::Concat}}, false); }
    ExprPtr math2() {
        return binary_chain(&Parser::pow,
                            {{"*", BinaryExpr::Mul}, {"/", BinaryExpr::Div}, {"//", BinaryExpr::FloorDiv}, {"%", BinaryExpr::Mod}},
                            false);
    }
    ExprPtr pow() { return binary_chain(&Parser::unary_filtered, {{"**", BinaryExpr::Pow}}, false); }
    ExprPtr unary_filtered() { return unary(true); }

    // jinja2: -x|f is (-x)|f; the operand of '-' takes no filters of its own.
    ExprPtr unary(bool with_filter) {
        Nest nest(*this);
        const int line = cur().line;
        ExprPtr e;
        if (skip_op("-")) e = std::make_unique<UnaryExpr>(line, UnaryExpr::Neg, unary(false));
        else if (skip_op("+")) e = std::make_unique<UnaryExpr>(line, UnaryExpr::Pos, unary(false));
        else e = primary();
        e = postfix(std::move(e));
        if (with_filter) e = filters_and_tests(std::move(e));
        return e;
    }

    ExprPtr primary() {
        const Token & t = cur();
        const int line = t.line;
        if (t.kind == Tok::Name) {
            const std::string n = t.text;
            next();
            if (n == "true" || n == "True") return std::make_unique<Literal>(line, Value::boolean(true));
            if (n == "false" || n == "False") return std::make_unique<Literal>(line, Value::boolean(false));
            if (n == "none" || n == "None") return std::make_unique<Literal>(line, Value::none());
            if (!macros_.empty()) {
                macros_.back()->uses_varargs |= n == "varargs";
                macros_.back()->uses_kwargs |= n == "kwargs";
                macros_.back()->uses_caller |= n == "caller";
            }
            return std::make_unique<NameExpr>(line, n);
        }
        if (t.kind == Tok::String) {   // adjacent strings join, as in Python
            std::string s;
            while (cur().kind == Tok::String) {
                s += cur().text;
                next();
            }
            return std::make_unique<Literal>(line, Value::string(std::move(s)));
        }
        if (t.kind == Tok::Int || t.kind == Tok::Float) {
            Value v = t.kind == Tok::Int ? Value::integer(t.i) : Value::number(t.f);
            next();
            return std::make_unique<Literal>(line, std::move(v));
        }
        if (skip_op("(")) {
            ExprPtr e = tuple(true, {}, true);
            expect_op(")");
            return e;
        }
        if (skip_op("[")) {
            auto l = std::make_unique<ListExpr>(line, Type::List);
            while (!is_op("]")) {
                if (!l->items.empty()) expect_op(",");
                if (is_op("]")) break;
                l->items.push_back(expression(true));
            }
            next();
            return l;
        }
        if (skip_op("{")) {
            auto d = std::make_unique<DictExpr>(line);
            while (!is_op("}")) {
                if (!d->items.empty()) expect_op(",");
                if (is_op("}")) break;
                ExprPtr k = expression(true);
                expect_op(":");
                d->items.emplace_back(std::move(k), expression(true));
            }
            next();
            return d;
        }
        fail(fmt::format("unexpected {}", describe(t)));
    }

    ExprPtr postfix(ExprPtr e) {
        for (;;) {
            const int line = cur().line;
            if (skip_op(".")) {
                if (cur().kind == Tok::Name) {
                    e = std::make_unique<AttrExpr>(line, std::move(e), expect_name());
                } else if (cur().kind == Tok::Int) {   // a.0 is a[0]
                    auto idx = std::make_unique<Literal>(line, Value::integer(cur().i));
                    next();
                    e = std::make_unique<ItemExpr>(line, std::move(e), std::move(idx));
                } else {
                    fail(fmt::format("expected a name after '.', got {}", describe(cur())));
                }
            } else if (skip_op("[")) {
                e = subscript(std::move(e), line);
            } else if (is_op("(")) {
                e = call(std::move(e));
            } else {
                return e;
            }
        }
    }

    // After '[': an index or a slice a[start:stop:step], each part optional.
    ExprPtr subscript(ExprPtr obj, int line) {
        ExprPtr first;
        if (!is_op(":")) {
            first = expression(true);
            if (is_op(",")) fail("a subscript with several indices (a tuple) is not implemented");
            if (skip_op("]")) return std::make_unique<ItemExpr>(line, std::move(obj), std::move(first));
        }
        auto s = std::make_unique<SliceExpr>(line, std::move(obj));
        s->start = std::move(first);
        expect_op(":");
        if (!is_op(":") && !is_op("]")) s->stop = expression(true);
        if (skip_op(":") && !is_op("]")) s->step = expression(true);
        expect_op("]");
        return s;
    }

    ExprPtr call(ExprPtr fn) {
        auto c = std::make_unique<CallExpr>(cur().line, std::move(fn));
        call_args(c->args);
        return c;
    }

    // (a, b, k=v): the current token is '('.
    void call_args(CallArgs & args) {
        expect_op("(");
        bool any = false;
        while (!is_op(")")) {
            if (any) expect_op(",");
            if (is_op(")")) break;
            any = true;
            if (is_op("*") || is_op("**")) fail("*args and **kwargs in a call are not implemented");
            if (cur().kind == Tok::Name && peek().kind == Tok::Op && peek().text == "=") {
                std::string name = expect_name();
                next();
                args.kw.emplace_back(std::move(name), expression(true));
            } else {
                if (!args.kw.empty()) fail("a positional argument after a keyword argument");
                args.pos.push_back(expression(true));
            }
        }
        next();
    }

    std::string dotted_name() {
        std::string n = expect_name();
        while (skip_op(".")) {
            n += '.';
            n += expect_name();
        }
        return n;
    }

    FilterCall filter_call() {
        FilterCall f;
        f.name = dotted_name();
        f.fn = find_filter(f.name);
        if (!f.fn)
            fail(is_jinja_filter(f.name) ? fmt::format("the filter '{}' is not implemented", f.name)
                                         : fmt::format("there is no filter '{}'", f.name));
        if (is_op("(")) call_args(f.args);
        return f;
    }

    ExprPtr filters_and_tests(ExprPtr e) {
        for (;;) {
            const int line = cur().line;
            if (skip_op("|")) {
                auto f = std::make_unique<FilterExpr>(line, std::move(e));
                f->filter = filter_call();
                e = std::move(f);
            } else if (is_name("is")) {
                e = test(std::move(e));
            } else if (is_op("(")) {
                e = call(std::move(e));
            } else {
                return e;
            }
        }
    }

    // `x is [not] name`, its argument in parentheses or one bare primary (`divisibleby 3`).
    ExprPtr test(ExprPtr input) {
        const int line = cur().line;
        next();
        const bool negated = skip_name("not");
        auto t = std::make_unique<TestExpr>(line, std::move(input));
        t->name = dotted_name();
        t->fn = find_test(t->name);
        if (!t->fn)
            fail(is_jinja_test(t->name) ? fmt::format("the test '{}' is not implemented", t->name)
                                        : fmt::format("there is no test '{}'", t->name));
        const Tok k = cur().kind;
        if (is_op("(")) {
            call_args(t->args);
        } else if ((k == Tok::Name || k == Tok::String || k == Tok::Int || k == Tok::Float || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
            if (is_name("is")) fail("tests cannot be chained with 'is'");
            t->args.pos.push_back(postfix(primary()));
        }
        if (!negated) return t;
        return std::make_unique<UnaryExpr>(line, UnaryExpr::Not, std::move(t));
    }

    std::vector<Token> toks_;
    size_t pos_ = 0;
    int loops_ = 0;                   // for loops around the current statement (break, continue)
    int depth_ = 0;
    std::vector<MacroDef *> macros_;  // the macros being parsed (varargs, kwargs, caller)
};

}  // namespace

Body parse_template(const std::string & source) { return Parser(lex(source)).parse_all(); }

}  // namespace memfit::jinja
