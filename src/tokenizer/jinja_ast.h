// The compiled form of a chat template (chat_template.h): the parser's tree (jinja_parse.cpp),
// what evaluates it (jinja_eval.cpp) and the builtins it calls (jinja_filters.cpp: filters,
// tests, globals; jinja_methods.cpp: attributes, items, str/dict/list methods). The tree is
// immutable once parsed, so one template renders from several threads; each render has its own
// Context. Internal to src/tokenizer/.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/chat_template.h"
#include "tokenizer/jinja_value.h"

namespace memfit::jinja {

// ---- one render's state ------------------------------------------------------------------------

// Variables of one scope. Jinja's scopes: the template, each iteration of a for loop, a macro
// call, a with block; an if does not open one.
struct Scope {
    Scope * parent = nullptr;
    std::unordered_map<std::string, Value> vars;
    bool captured = false;   // a macro defined here keeps it (Context::leave_scope)
};

class Context {
public:
    Context(const Dict & render_vars, const RenderBudgets & budgets);
    Context(const Context &) = delete;
    Context & operator=(const Context &) = delete;

    std::string * out = nullptr;  // where text goes (a macro or a set block captures it)
    Scope * scope = nullptr;      // the innermost scope
    int line = 0;                 // the line being evaluated, for error messages
    int depth = 0;                // macro calls in progress

    // A new scope whose parent is `parent`, alive until the render ends (a macro keeps the
    // scope it was defined in).
    Scope * push_scope(Scope * parent);
    // Leaves `s`, the newest scope, unless a macro keeps it: its memory is reused.
    void leave_scope(Scope * s);
    // One statement, loop iteration or macro call; RenderError past budgets.steps, or once the
    // render has run budgets.seconds (checked every 4096 steps).
    void step();
    // A string of `bytes` made by an expression (each is built or copied): RenderError once the
    // render's total passes budgets.bytes (a loop copying a 60 MB string 100,000 times).
    void charge(uint64_t bytes);
    // A name: the scopes outwards, then the render's variables, then the globals.
    Value lookup(const std::string & name) const;

private:
    const Dict & vars_;
    const RenderBudgets budgets_;
    std::deque<Scope> scopes_;
    uint64_t steps_ = 0, bytes_ = 0;
    std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// ---- expressions -------------------------------------------------------------------------------

struct Expr {
    explicit Expr(int l) : line(l) {}
    virtual ~Expr() = default;
    Value eval(Context & ctx) const;   // do_eval, with ctx.line at this node while it runs
    const int line;

protected:
    virtual Value do_eval(Context & ctx) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

struct CallArgs {
    std::vector<ExprPtr> pos;
    std::vector<std::pair<std::string, ExprPtr>> kw;
    Args eval(Context & ctx) const;
};

using FilterFn = Value (*)(Context & ctx, const Value & input, Args & args);
using TestFn = bool (*)(Context & ctx, const Value & input, Args & args);

struct FilterCall {   // `| name(args)`
    std::string name;
    FilterFn fn = nullptr;
    CallArgs args;
    Value apply(Context & ctx, const Value & input) const;
};

struct Literal : Expr {
    Literal(int l, Value v) : Expr(l), value(std::move(v)) {}
    Value do_eval(Context & ctx) const override;
    Value value;
};
struct NameExpr : Expr {
    NameExpr(int l, std::string n) : Expr(l), name(std::move(n)) {}
    Value do_eval(Context & ctx) const override;
    std::string name;
};
struct ListExpr : Expr {   // [a, b] or (a, b)
    ListExpr(int l, Type k) : Expr(l), kind(k) {}
    Value do_eval(Context & ctx) const override;
    Type kind;
    std::vector<ExprPtr> items;
};
struct DictExpr : Expr {
    explicit DictExpr(int l) : Expr(l) {}
    Value do_eval(Context & ctx) const override;
    std::vector<std::pair<ExprPtr, ExprPtr>> items;
};
struct AttrExpr : Expr {   // a.name
    AttrExpr(int l, ExprPtr o, std::string n) : Expr(l), obj(std::move(o)), name(std::move(n)) {}
    Value do_eval(Context & ctx) const override;
    ExprPtr obj;
    std::string name;
};
struct ItemExpr : Expr {   // a[key]
    ItemExpr(int l, ExprPtr o, ExprPtr k) : Expr(l), obj(std::move(o)), key(std::move(k)) {}
    Value do_eval(Context & ctx) const override;
    ExprPtr obj, key;
};
struct SliceExpr : Expr {  // a[start:stop:step], each optional
    SliceExpr(int l, ExprPtr o) : Expr(l), obj(std::move(o)) {}
    Value do_eval(Context & ctx) const override;
    ExprPtr obj, start, stop, step;
};
struct CallExpr : Expr {
    CallExpr(int l, ExprPtr f) : Expr(l), fn(std::move(f)) {}
    Value do_eval(Context & ctx) const override;
    // The call with `caller` added to its keywords (a {% call %} block).
    Value invoke(Context & ctx, const Value * caller) const;
    ExprPtr fn;
    CallArgs args;
};
struct FilterExpr : Expr {
    FilterExpr(int l, ExprPtr in) : Expr(l), input(std::move(in)) {}
    Value do_eval(Context & ctx) const override;
    ExprPtr input;
    FilterCall filter;
};
struct TestExpr : Expr {   // a is name(args)
    TestExpr(int l, ExprPtr in) : Expr(l), input(std::move(in)) {}
    Value do_eval(Context & ctx) const override;
    ExprPtr input;
    std::string name;
    TestFn fn = nullptr;
    CallArgs args;
};
struct UnaryExpr : Expr {
    enum Op { Neg, Pos, Not };
    UnaryExpr(int l, Op o, ExprPtr x) : Expr(l), op(o), operand(std::move(x)) {}
    Value do_eval(Context & ctx) const override;
    Op op;
    ExprPtr operand;
};
struct BinaryExpr : Expr {
    enum Op { Add, Sub, Mul, Div, FloorDiv, Mod, Pow, Concat, And, Or };
    BinaryExpr(int l, Op o, ExprPtr a, ExprPtr b) : Expr(l), op(o), left(std::move(a)), right(std::move(b)) {}
    Value do_eval(Context & ctx) const override;
    Op op;
    ExprPtr left, right;
};
struct CompareExpr : Expr {   // a < b <= c ..., as Python chains them
    enum Op { Eq, Ne, Lt, Le, Gt, Ge, In, NotIn };
    CompareExpr(int l, ExprPtr first) : Expr(l), head(std::move(first)) {}
    Value do_eval(Context & ctx) const override;
    ExprPtr head;
    std::vector<std::pair<Op, ExprPtr>> rest;
};
struct CondExpr : Expr {   // a if cond else b (b optional: undefined)
    CondExpr(int l, ExprPtr c, ExprPtr a, ExprPtr b)
        : Expr(l), cond(std::move(c)), then(std::move(a)), otherwise(std::move(b)) {}
    Value do_eval(Context & ctx) const override;
    ExprPtr cond, then, otherwise;
};

// ---- statements ------------------------------------------------------------------------------

enum class Flow { Normal, Break, Continue };

struct Stmt {
    explicit Stmt(int l) : line(l) {}
    virtual ~Stmt() = default;
    virtual Flow exec(Context & ctx) const = 0;
    const int line;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;
Flow exec_body(const Body & body, Context & ctx);

// What a set or a for assigns: names (several: unpacking), or a namespace's attribute.
struct Target {
    std::vector<std::string> names;
    bool unpack = false;   // `a, b` (even of one name: `a,`)
    std::string ns_attr;   // `ns.attr`: names[0] is the namespace
    void assign(Context & ctx, const Value & v) const;
};

struct TextStmt : Stmt {
    TextStmt(int l, std::string t) : Stmt(l), text(std::move(t)) {}
    Flow exec(Context & ctx) const override;
    std::string text;
};
struct OutputStmt : Stmt {   // {{ expr }}
    OutputStmt(int l, ExprPtr e) : Stmt(l), expr(std::move(e)) {}
    Flow exec(Context & ctx) const override;
    ExprPtr expr;
};
struct IfStmt : Stmt {
    explicit IfStmt(int l) : Stmt(l) {}
    Flow exec(Context & ctx) const override;
    std::vector<std::pair<ExprPtr, Body>> branches;   // if, elif...
    Body otherwise;
};
struct ForStmt : Stmt {
    explicit ForStmt(int l) : Stmt(l) {}
    Flow exec(Context & ctx) const override;
    Target target;
    ExprPtr iter, filter;   // filter: `for x in y if cond` (optional)
    Body body, otherwise;
};
struct SetStmt : Stmt {
    SetStmt(int l, Target t, ExprPtr v) : Stmt(l), target(std::move(t)), value(std::move(v)) {}
    Flow exec(Context & ctx) const override;
    Target target;
    ExprPtr value;
};
struct SetBlockStmt : Stmt {   // {% set x | filters %}body{% endset %}
    explicit SetBlockStmt(int l) : Stmt(l) {}
    Flow exec(Context & ctx) const override;
    Target target;
    std::vector<FilterCall> filters;
    Body body;
};
struct MacroDef {
    std::string name;
    std::vector<std::pair<std::string, ExprPtr>> params;   // default: null when none
    Body body;
    bool uses_varargs = false, uses_kwargs = false, uses_caller = false;
};
struct MacroStmt : Stmt {
    explicit MacroStmt(int l) : Stmt(l) {}
    Flow exec(Context & ctx) const override;
    MacroDef def;
};
struct CallBlockStmt : Stmt {   // {% call(params) macro(args) %}body{% endcall %}
    explicit CallBlockStmt(int l) : Stmt(l) {}
    Flow exec(Context & ctx) const override;
    std::unique_ptr<CallExpr> call;
    MacroDef caller;
};
struct FilterBlockStmt : Stmt {
    explicit FilterBlockStmt(int l) : Stmt(l) {}
    Flow exec(Context & ctx) const override;
    std::vector<FilterCall> filters;
    Body body;
};
struct WithStmt : Stmt {
    explicit WithStmt(int l) : Stmt(l) {}
    Flow exec(Context & ctx) const override;
    std::vector<std::pair<std::string, ExprPtr>> assigns;
    Body body;
};
struct LoopControlStmt : Stmt {   // {% break %}, {% continue %}
    LoopControlStmt(int l, Flow f) : Stmt(l), flow(f) {}
    Flow exec(Context &) const override { return flow; }
    Flow flow;
};
struct PlainBlockStmt : Stmt {   // transformers' {% generation %}: renders its body
    explicit PlainBlockStmt(int l) : Stmt(l) {}
    Flow exec(Context & ctx) const override;
    Body body;
};

// namespace(...): the one mutable value; {% set ns.attr = ... %} assigns its attributes.
class Namespace : public Object {
public:
    std::string type_name() const override { return "Namespace"; }
    std::string str() const override;   // <Namespace {'a': 1}>
    Value attr(const std::string & name) const override;
    Dict attrs;
};

// ---- parsing and builtins ----------------------------------------------------------------------

// The template's statements; FormatError "chat template line N: ..." when it is malformed or
// uses what is not implemented.
Body parse_template(const std::string & source);

FilterFn find_filter(std::string_view name);   // null when not implemented
TestFn find_test(std::string_view name);
bool is_jinja_filter(std::string_view name);   // jinja2 has it (implemented or not)
bool is_jinja_test(std::string_view name);
const Dict & globals();                        // range, namespace, dict, raise_exception, strftime_now

// jinja2's sandboxed getattr (a.b: attribute or method first, then item) and getitem (a[b]:
// item first, then attribute); an Undefined that names what is missing when neither is there.
Value get_attr(const Value & obj, const std::string & name);
Value get_item(const Value & obj, const Value & key);
// Calls a callable value (Undefined raises its error).
Value call_value(Context & ctx, const Value & fn, Args & args);

// Python's `item in container` and arithmetic operators (Add ... Concat) (jinja_eval.cpp).
bool py_contains(const Value & container, const Value & item);
Value py_arith(BinaryExpr::Op op, const Value & a, const Value & b);

// str methods the filters share (jinja_methods.cpp): strip(chars) (chars None: whitespace) and
// splitlines(keepends).
std::string py_strip(const std::string & s, const Value & chars, bool left, bool right);
std::vector<std::string> py_splitlines(const std::string & s, bool keepends);

// A builtin's arguments bound to its parameters by position and keyword, as Python binds them;
// RenderError for an unknown keyword or too many positionals.
class Bound {
public:
    Bound(const Args & args, std::initializer_list<const char *> params, std::string_view fn);
    bool has(size_t k) const { return values_[k].has_value(); }
    const Value & operator[](size_t k) const;   // Undefined when not given
    Value get_or(size_t k, Value dflt) const { return has(k) ? *values_[k] : std::move(dflt); }

private:
    std::vector<std::optional<Value>> values_;
};

}  // namespace memfit::jinja
