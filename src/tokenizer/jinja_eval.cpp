// Evaluation of the tree (jinja_ast.h): Python's operators, jinja2's scopes (a for loop's
// iteration, a macro call and a with block open one; an if does not), loops with `loop`,
// macros and call blocks.
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "tokenizer/jinja_ast.h"

#include "core/units.h"

namespace memfit::jinja {

// ---- context -------------------------------------------------------------------------------------

Context::Context(const Dict & render_vars, const RenderBudgets & budgets) : vars_(render_vars), budgets_(budgets) {
    scope = push_scope(nullptr);
}

Scope * Context::push_scope(Scope * parent) {
    scopes_.emplace_back();
    scopes_.back().parent = parent;
    return &scopes_.back();
}

void Context::leave_scope(Scope * s) {
    // Scopes are left in the order they were entered; one a macro keeps (and so every scope
    // entered before it, its ancestors among them) stays until the render ends.
    if (!scopes_.empty() && &scopes_.back() == s && !s->captured) scopes_.pop_back();
}

void Context::step() {
    if (++steps_ > budgets_.steps)
        throw RenderError(fmt::format("the template ran more than {} statements, loop iterations and macro calls (a "
                                      "loop or recursion that large is refused)", budgets_.steps));
    if (steps_ % 4096 == 0 && std::chrono::steady_clock::now() - start_ > std::chrono::seconds(budgets_.seconds))
        throw RenderError(fmt::format("the template ran for more than {} s on one conversation", budgets_.seconds));
}

void Context::charge(uint64_t bytes) {
    bytes_ += bytes;
    if (bytes_ > budgets_.bytes)
        throw RenderError(fmt::format("the template's expressions made more than {} of strings on one conversation "
                                      "(a loop copying a long string that often is refused)", format_bytes(budgets_.bytes)));
}

Value Context::lookup(const std::string & name) const {
    for (const Scope * s = scope; s; s = s->parent) {
        const auto it = s->vars.find(name);
        if (it != s->vars.end()) return it->second;
    }
    if (const Value * v = vars_.find(std::string_view(name))) return *v;
    if (const Value * v = globals().find(std::string_view(name))) return *v;
    return Value::undefined(fmt::format("'{}' is undefined", name));
}

namespace {

// Runs with ctx.scope set to `s`, and back after; `s`, a scope pushed for this, is then left (a
// loop's iterations no longer keep theirs until the render ends: 750 bytes each, 5.5 GB for two
// nested range(3000)).
class InScope {
public:
    InScope(Context & ctx, Scope * s) : ctx_(ctx), saved_(ctx.scope), s_(s) { ctx.scope = s; }
    ~InScope() {
        ctx_.scope = saved_;
        ctx_.leave_scope(s_);
    }
    InScope(const InScope &) = delete;
    InScope & operator=(const InScope &) = delete;

private:
    Context & ctx_;
    Scope * saved_;
    Scope * s_;
};

// What the body writes while it lives goes to `text`.
class Capture {
public:
    explicit Capture(Context & ctx) : ctx_(ctx), saved_(ctx.out) { ctx.out = &text; }
    ~Capture() { ctx_.out = saved_; }
    Capture(const Capture &) = delete;
    Capture & operator=(const Capture &) = delete;
    std::string text;

private:
    Context & ctx_;
    std::string * saved_;
};

[[noreturn]] void overflow() { throw RenderError("integer overflow (memfit's template integers are 64-bit)"); }

std::string operand_error(std::string_view op, const Value & a, const Value & b) {
    return fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b));
}

// s * n, list * n; n <= 0 gives an empty one. Within the budgets (jinja_value.h), checked first.
Value repeat(const Value & seq, int64_t n) {
    const int64_t len = seq.is_str() ? int64_t(seq.s.size()) : int64_t(seq.list->size());
    if (n > int64_t(1) << 36 && len > 0) throw RenderError(fmt::format("'* {}': a repeated string or list that large is refused", n));
    if (n > 0) (seq.is_str() ? check_text_size : check_list_size)(uint64_t(len) * uint64_t(n), "*");
    if (seq.is_str()) {   // by doubling: log2(n) copies, not n appends ('x' * 60000000)
        std::string out;
        if (n <= 0 || len == 0) return Value::string(std::move(out));
        const size_t total = size_t(len) * size_t(n);
        out.reserve(total);
        out.append(seq.s);
        while (out.size() * 2 <= total) out.append(out.data(), out.size());
        out.append(out.data(), total - out.size());
        return Value::string(std::move(out));
    }
    if (n > 0) check_list_bytes(*seq.list, "*", uint64_t(n));
    std::vector<Value> out;
    for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
    return Value::make_list(std::move(out), seq.type);
}

// Python's float // and % (divmod's rounding).
std::pair<double, double> float_divmod(double x, double y) {
    double mod = std::fmod(x, y);
    double div = (x - mod) / y;
    if (mod != 0) {
        if ((y < 0) != (mod < 0)) {
            mod += y;
            div -= 1.0;
        }
    } else {
        mod = std::copysign(0.0, y);
    }
    double floordiv = 0;
    if (div != 0) {
        floordiv = std::floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
        floordiv = std::copysign(0.0, x / y);
    }
    return {floordiv, mod};
}

Value int_pow(int64_t base, int64_t exp) {
    int64_t result = 1;
    while (exp > 0) {
        if ((exp & 1) && __builtin_mul_overflow(result, base, &result)) overflow();
        exp >>= 1;
        if (exp > 0 && __builtin_mul_overflow(base, base, &base)) overflow();
    }
    return Value::integer(result);
}

}  // namespace

Value py_arith(BinaryExpr::Op op, const Value & a, const Value & b) {
    if (op == BinaryExpr::Concat) {   // Undefined is ""
        const std::string x = py_str(a), y = py_str(b);
        check_text_size(x.size() + y.size(), "~");
        return Value::string(x + y);
    }
    a.require_defined();
    b.require_defined();
    const bool ints = a.is_int() && b.is_int(), nums = a.is_number() && b.is_number();
    int64_t r = 0;
    switch (op) {
        case BinaryExpr::Add:
            if (ints) {
                if (__builtin_add_overflow(a.i, b.i, &r)) overflow();
                return Value::integer(r);
            }
            if (nums) return Value::number(a.as_double() + b.as_double());
            if (a.is_str() && b.is_str()) {
                check_text_size(a.s.size() + b.s.size(), "+");
                return Value::string(a.s + b.s);
            }
            if (a.is_seq() && a.type == b.type) {
                check_list_size(a.list->size() + b.list->size(), "+");
                std::vector<Value> out = *a.list;
                out.insert(out.end(), b.list->begin(), b.list->end());
                check_list_bytes(out, "+");
                return Value::make_list(std::move(out), a.type);
            }
            if (a.is_str() || a.is_seq())
                throw RenderError(fmt::format("can only concatenate {} (not \"{}\") to {}", type_name(a), type_name(b), type_name(a)));
            throw RenderError(operand_error("+", a, b));
        case BinaryExpr::Sub:
            if (ints) {
                if (__builtin_sub_overflow(a.i, b.i, &r)) overflow();
                return Value::integer(r);
            }
            if (nums) return Value::number(a.as_double() - b.as_double());
            throw RenderError(operand_error("-", a, b));
        case BinaryExpr::Mul:
            if (ints) {
                if (__builtin_mul_overflow(a.i, b.i, &r)) overflow();
                return Value::integer(r);
            }
            if (nums) return Value::number(a.as_double() * b.as_double());
            if ((a.is_str() || a.is_seq()) && b.is_int()) return repeat(a, b.i);
            if (a.is_int() && (b.is_str() || b.is_seq())) return repeat(b, a.i);
            if (a.is_str() || a.is_seq() || b.is_str() || b.is_seq())
                throw RenderError(fmt::format("can't multiply sequence by non-int of type '{}'",
                                              type_name(a.is_str() || a.is_seq() ? b : a)));
            throw RenderError(operand_error("*", a, b));
        case BinaryExpr::Div:
            if (!nums) throw RenderError(operand_error("/", a, b));
            if (b.as_double() == 0) throw RenderError("division by zero");
            return Value::number(a.as_double() / b.as_double());
        case BinaryExpr::FloorDiv:
        case BinaryExpr::Mod: {
            const bool div = op == BinaryExpr::FloorDiv;
            if (a.is_str() && !div) throw RenderError("string formatting with % is not implemented");
            if (!nums) throw RenderError(operand_error(div ? "//" : "%", a, b));
            if (ints) {
                if (b.i == 0) throw RenderError(div ? "integer division or modulo by zero" : "integer modulo by zero");
                if (a.i == std::numeric_limits<int64_t>::min() && b.i == -1) overflow();
                int64_t q = a.i / b.i, m = a.i % b.i;
                if (m != 0 && ((m < 0) != (b.i < 0))) m += b.i, q -= 1;
                return Value::integer(div ? q : m);
            }
            if (b.as_double() == 0) throw RenderError(div ? "float floor division by zero" : "float modulo");
            const auto [q, m] = float_divmod(a.as_double(), b.as_double());
            return Value::number(div ? q : m);
        }
        case BinaryExpr::Pow:
            if (!nums) throw RenderError(operand_error("** or pow()", a, b));
            if (ints && b.i >= 0) return int_pow(a.i, b.i);
            if (a.as_double() == 0 && b.as_double() < 0) throw RenderError("0.0 cannot be raised to a negative power");
            if (a.as_double() < 0 && b.type == Type::Float && b.f != std::floor(b.f))
                throw RenderError("a negative number to a fractional power is complex, which memfit does not implement");
            return Value::number(std::pow(a.as_double(), b.as_double()));
        default: break;
    }
    throw RenderError("unknown operator");
}

bool py_contains(const Value & container, const Value & item) {
    switch (container.type) {
        case Type::Undefined: return false;
        case Type::Str:
            if (!item.is_str())
                throw RenderError(fmt::format("'in <string>' requires string as left operand, not {}", type_name(item)));
            return container.s.find(item.s) != std::string::npos;
        case Type::List:
        case Type::Tuple:
            for (const Value & x : *container.list)
                if (py_eq(x, item)) return true;
            return false;
        case Type::Dict: return container.dict->find(item) != nullptr;
        default: throw RenderError(fmt::format("argument of type '{}' is not iterable", type_name(container)));
    }
}

namespace {

bool compare(CompareExpr::Op op, const Value & a, const Value & b) {
    switch (op) {
        case CompareExpr::Eq: return py_eq(a, b);
        case CompareExpr::Ne: return !py_eq(a, b);
        case CompareExpr::Lt: return py_cmp(a, b, "<") < 0;
        case CompareExpr::Le: return py_cmp(a, b, "<=") <= 0;
        case CompareExpr::Gt: return py_cmp(a, b, ">") > 0;
        case CompareExpr::Ge: return py_cmp(a, b, ">=") >= 0;
        case CompareExpr::In: return py_contains(b, a);
        case CompareExpr::NotIn: return !py_contains(b, a);
    }
    return false;
}

// Python's slice of a list, tuple or str; an Undefined (as jinja2 gives) for what has none.
Value slice(const Value & obj, const Value & start, const Value & stop, const Value & step) {
    obj.require_defined();
    for (const Value * v : {&start, &stop, &step}) {
        if (v->is_undefined()) throw RenderError("slice indices must be integers or None or have an __index__ method");
        if (!v->is_none() && !v->is_int())
            return Value::undefined(fmt::format("{} has no element slice", object_type_repr(obj)));
    }
    if (!obj.is_str() && !obj.is_seq()) return Value::undefined(fmt::format("{} has no element slice", object_type_repr(obj)));
    const int64_t st = step.is_int() ? step.i : 1;
    if (st == 0) throw RenderError("slice step cannot be zero");
    std::u32string cps;
    if (obj.is_str()) cps = decode_utf8(obj.s);
    const int64_t n = obj.is_str() ? int64_t(cps.size()) : int64_t(obj.list->size());
    const auto adjust = [&](const Value & v, int64_t dflt) {
        if (!v.is_int()) return dflt;
        int64_t x = v.i;
        if (x < 0) {
            x += n;
            if (x < 0) x = st < 0 ? -1 : 0;
        } else if (x >= n) {
            x = st < 0 ? n - 1 : n;
        }
        return x;
    };
    const int64_t b = adjust(start, st > 0 ? 0 : n - 1), e = adjust(stop, st > 0 ? n : -1);
    std::u32string s;
    std::vector<Value> items;
    for (int64_t k = b; st > 0 ? k < e : k > e; k += st) {
        if (obj.is_str()) s += cps[size_t(k)];
        else items.push_back((*obj.list)[size_t(k)]);
    }
    if (obj.is_str()) return Value::string(encode_utf8(s));
    return Value::make_list(std::move(items), obj.type);
}

// ---- macros and the loop -----------------------------------------------------------------------

constexpr int kMaxMacroDepth = 200;

class Macro : public Object {
public:
    Macro(const MacroDef & def, Scope * closure) : def_(def), closure_(closure) {}
    std::string type_name() const override { return "Macro"; }
    std::string str() const override { return fmt::format("<Macro '{}'>", def_.name); }
    bool callable() const override { return true; }

    Value call(Context & ctx, Args & args) const override {
        if (ctx.depth >= kMaxMacroDepth) throw RenderError(fmt::format("macro '{}': maximum recursion depth exceeded", def_.name));
        ctx.step();
        const size_t np = def_.params.size();
        if (args.pos.size() > np && !def_.uses_varargs)
            throw RenderError(fmt::format("macro '{}' takes not more than {} argument(s)", def_.name, np));
        Scope * s = ctx.push_scope(closure_);
        std::vector<bool> given(np, false);
        for (size_t k = 0; k < np && k < args.pos.size(); ++k) {
            s->vars[def_.params[k].first] = args.pos[k];
            given[k] = true;
        }
        Dict extra;
        Value caller = Value::undefined("No caller defined");
        for (auto & [name, v] : args.kw) {
            size_t k = 0;
            while (k < np && def_.params[k].first != name) ++k;
            if (k < np) {
                if (given[k]) throw RenderError(fmt::format("macro '{}' got multiple values for argument '{}'", def_.name, name));
                s->vars[name] = v;
                given[k] = true;
            } else if (name == "caller" && def_.uses_caller) {
                caller = v;
            } else if (def_.uses_kwargs) {
                extra.set(Value::string(name), v);
            } else {
                throw RenderError(fmt::format("macro '{}' takes no keyword argument '{}'", def_.name, name));
            }
        }
        const InScope in(ctx, s);
        for (size_t k = 0; k < np; ++k) {   // defaults, in the macro's scope (they see earlier parameters)
            if (given[k]) continue;
            const auto & [name, dflt] = def_.params[k];
            s->vars[name] = dflt ? dflt->eval(ctx) : Value::undefined(fmt::format("parameter '{}' was not provided", name));
        }
        if (def_.uses_varargs) {
            std::vector<Value> rest;
            for (size_t k = np; k < args.pos.size(); ++k) rest.push_back(args.pos[k]);
            s->vars["varargs"] = Value::make_list(std::move(rest), Type::Tuple);
        }
        if (def_.uses_kwargs) s->vars["kwargs"] = Value::make_dict(std::move(extra));
        if (def_.uses_caller) s->vars["caller"] = caller;
        Capture out(ctx);
        ++ctx.depth;
        exec_body(def_.body, ctx);
        --ctx.depth;
        return Value::string(std::move(out.text));
    }

private:
    const MacroDef & def_;
    Scope * closure_;
};

class Loop : public Object, public std::enable_shared_from_this<Loop> {
public:
    explicit Loop(std::vector<Value> items) : items_(std::move(items)) {}
    std::string type_name() const override { return "LoopContext"; }
    std::string str() const override { return fmt::format("<LoopContext {}/{}>", index0 + 1, items_.size()); }

    Value attr(const std::string & name) const override {
        const auto n = int64_t(items_.size()), k = int64_t(index0);
        if (name == "index") return Value::integer(k + 1);
        if (name == "index0") return Value::integer(k);
        if (name == "revindex") return Value::integer(n - k);
        if (name == "revindex0") return Value::integer(n - k - 1);
        if (name == "first") return Value::boolean(k == 0);
        if (name == "last") return Value::boolean(k == n - 1);
        if (name == "length") return Value::integer(n);
        if (name == "depth") return Value::integer(1);
        if (name == "depth0") return Value::integer(0);
        if (name == "previtem") return k > 0 ? items_[size_t(k - 1)] : Value::undefined("there is no previous item");
        if (name == "nextitem") return k + 1 < n ? items_[size_t(k + 1)] : Value::undefined("there is no next item");
        if (name == "cycle") return Value::object(std::make_shared<Cycle>(shared_from_this()));
        if (name == "changed") return Value::object(std::make_shared<Changed>(shared_from_this()));
        return Object::attr(name);
    }

    size_t index0 = 0;

private:
    class Changed : public Object {   // loop.changed(x, ...): whether the arguments differ from the last call's
    public:
        explicit Changed(std::shared_ptr<const Loop> loop) : loop_(std::move(loop)) {}
        std::string type_name() const override { return "method"; }
        bool callable() const override { return true; }
        Value call(Context &, Args & args) const override {
            const Value now = Value::make_list(args.pos);
            if (loop_->changed_seen_ && py_eq(loop_->last_changed_, now)) return Value::boolean(false);
            loop_->changed_seen_ = true;
            loop_->last_changed_ = now;
            return Value::boolean(true);
        }

    private:
        std::shared_ptr<const Loop> loop_;
    };

    class Cycle : public Object {   // loop.cycle(a, b, ...): the argument at the iteration's index
    public:
        explicit Cycle(std::shared_ptr<const Loop> loop) : loop_(std::move(loop)) {}
        std::string type_name() const override { return "method"; }
        bool callable() const override { return true; }
        Value call(Context &, Args & args) const override {
            if (args.pos.empty()) throw RenderError("no items for cycling given");
            return args.pos[loop_->index0 % args.pos.size()];
        }

    private:
        std::shared_ptr<const Loop> loop_;
    };

    std::vector<Value> items_;
    mutable bool changed_seen_ = false;   // loop.changed's memory
    mutable Value last_changed_;
};

}  // namespace

std::string Namespace::str() const {
    Value d = Value::make_dict(attrs);
    return "<Namespace " + py_repr(d) + ">";
}

Value Namespace::attr(const std::string & name) const {
    if (const Value * v = attrs.find(std::string_view(name))) return *v;
    return Value::undefined(fmt::format("'jinja2.utils.Namespace object' has no attribute '{}'", name));
}

Value call_value(Context & ctx, const Value & fn, Args & args) {
    fn.require_defined();
    if (fn.type != Type::Object || !fn.obj->callable())
        throw RenderError(fmt::format("'{}' object is not callable", type_name(fn)));
    return fn.obj->call(ctx, args);
}

// ---- expressions ---------------------------------------------------------------------------------

Value Expr::eval(Context & ctx) const {
    const int saved = ctx.line;
    ctx.line = line;
    Value v = do_eval(ctx);
    if (v.is_str()) ctx.charge(v.s.size());
    ctx.line = saved;
    return v;
}

Args CallArgs::eval(Context & ctx) const {
    Args a;
    for (const auto & e : pos) a.pos.push_back(e->eval(ctx));
    for (const auto & [name, e] : kw) a.kw.emplace_back(name, e->eval(ctx));
    return a;
}

Value FilterCall::apply(Context & ctx, const Value & input) const {
    Args a = args.eval(ctx);
    return fn(ctx, input, a);
}

Value Literal::do_eval(Context &) const { return value; }
Value NameExpr::do_eval(Context & ctx) const { return ctx.lookup(name); }

Value ListExpr::do_eval(Context & ctx) const {
    std::vector<Value> out;
    for (const auto & e : items) out.push_back(e->eval(ctx));
    return Value::make_list(std::move(out), kind);
}

Value DictExpr::do_eval(Context & ctx) const {
    Dict d;
    for (const auto & [k, v] : items) {
        Value key = k->eval(ctx);
        if (key.is_seq() && key.type == Type::List) throw RenderError("unhashable type: 'list'");
        if (key.type == Type::Dict) throw RenderError("unhashable type: 'dict'");
        d.set(std::move(key), v->eval(ctx));
    }
    return Value::make_dict(std::move(d));
}

Value AttrExpr::do_eval(Context & ctx) const { return get_attr(obj->eval(ctx), name); }
Value ItemExpr::do_eval(Context & ctx) const {
    Value o = obj->eval(ctx);
    return get_item(o, key->eval(ctx));
}

Value SliceExpr::do_eval(Context & ctx) const {
    Value o = obj->eval(ctx);
    const auto part = [&](const ExprPtr & e) { return e ? e->eval(ctx) : Value::none(); };
    Value b = part(start), e = part(stop), st = part(step);
    return slice(o, b, e, st);
}

Value CallExpr::invoke(Context & ctx, const Value * caller) const {
    Value f = fn->eval(ctx);
    Args a = args.eval(ctx);
    if (caller) a.kw.emplace_back("caller", *caller);
    return call_value(ctx, f, a);
}
Value CallExpr::do_eval(Context & ctx) const { return invoke(ctx, nullptr); }

Value FilterExpr::do_eval(Context & ctx) const { return filter.apply(ctx, input->eval(ctx)); }

Value TestExpr::do_eval(Context & ctx) const {
    Value v = input->eval(ctx);
    Args a = args.eval(ctx);
    return Value::boolean(fn(ctx, v, a));
}

Value UnaryExpr::do_eval(Context & ctx) const {
    Value v = operand->eval(ctx);
    if (op == Not) return Value::boolean(!truthy(v));
    v.require_defined();
    if (v.type == Type::Float) return Value::number(op == Neg ? -v.f : v.f);
    if (!v.is_int())
        throw RenderError(fmt::format("bad operand type for unary {}: '{}'", op == Neg ? '-' : '+', type_name(v)));
    if (op == Pos) return Value::integer(v.i);
    if (v.i == std::numeric_limits<int64_t>::min()) overflow();
    return Value::integer(-v.i);
}

Value BinaryExpr::do_eval(Context & ctx) const {
    Value a = left->eval(ctx);
    if (op == And) return truthy(a) ? right->eval(ctx) : a;
    if (op == Or) return truthy(a) ? a : right->eval(ctx);
    return py_arith(op, a, right->eval(ctx));
}

Value CompareExpr::do_eval(Context & ctx) const {
    Value a = head->eval(ctx);
    for (const auto & [op, e] : rest) {
        Value b = e->eval(ctx);
        if (!compare(op, a, b)) return Value::boolean(false);
        a = std::move(b);
    }
    return Value::boolean(true);
}

Value CondExpr::do_eval(Context & ctx) const {
    if (truthy(cond->eval(ctx))) return then->eval(ctx);
    if (otherwise) return otherwise->eval(ctx);
    return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
}

// ---- statements ----------------------------------------------------------------------------------

Flow exec_body(const Body & body, Context & ctx) {
    for (const auto & s : body) {
        ctx.line = s->line;
        ctx.step();
        const Flow f = s->exec(ctx);
        if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
}

void Target::assign(Context & ctx, const Value & v) const {
    if (!ns_attr.empty()) {
        const Value ns = ctx.lookup(names[0]);
        auto * n = ns.type == Type::Object ? dynamic_cast<Namespace *>(ns.obj.get()) : nullptr;
        if (!n) {
            ns.require_defined();
            throw RenderError("cannot assign attribute on non-namespace object");
        }
        n->attrs.set(Value::string(ns_attr), v);
        return;
    }
    if (!unpack) {
        ctx.scope->vars[names[0]] = v;
        return;
    }
    if (!v.is_seq() && !v.is_str() && v.type != Type::Dict && !v.is_undefined())
        throw RenderError(fmt::format("cannot unpack non-iterable {} object", type_name(v)));
    const std::vector<Value> parts = iterate(v);
    if (parts.size() < names.size())
        throw RenderError(fmt::format("not enough values to unpack (expected {}, got {})", names.size(), parts.size()));
    if (parts.size() > names.size()) throw RenderError(fmt::format("too many values to unpack (expected {})", names.size()));
    for (size_t k = 0; k < names.size(); ++k) ctx.scope->vars[names[k]] = parts[k];
}

Flow TextStmt::exec(Context & ctx) const {
    *ctx.out += text;
    return Flow::Normal;
}

Flow OutputStmt::exec(Context & ctx) const {
    const std::string text = py_str(expr->eval(ctx));
    check_text_size(ctx.out->size() + text.size(), "the rendered text");
    *ctx.out += text;
    return Flow::Normal;
}

Flow IfStmt::exec(Context & ctx) const {
    for (const auto & [cond, body] : branches)
        if (truthy(cond->eval(ctx))) return exec_body(body, ctx);
    return exec_body(otherwise, ctx);
}

Flow ForStmt::exec(Context & ctx) const {
    Scope * outer = ctx.scope;
    std::vector<Value> items = iterate(iter->eval(ctx));
    if (filter) {   // `for x in y if cond`: the loop (and its length) sees only what passes
        std::vector<Value> kept;
        for (Value & item : items) {
            ctx.step();
            const InScope in(ctx, ctx.push_scope(outer));
            target.assign(ctx, item);
            if (truthy(filter->eval(ctx))) kept.push_back(std::move(item));
        }
        items = std::move(kept);
    }
    if (items.empty()) {
        const InScope in(ctx, ctx.push_scope(outer));
        return exec_body(otherwise, ctx);   // a break there belongs to an enclosing loop
    }
    const auto loop = std::make_shared<Loop>(items);
    const Value loop_value = Value::object(loop);
    for (size_t k = 0; k < items.size(); ++k) {
        ctx.step();
        const InScope in(ctx, ctx.push_scope(outer));   // each iteration starts from the enclosing scope
        loop->index0 = k;
        ctx.scope->vars["loop"] = loop_value;
        target.assign(ctx, items[k]);
        if (exec_body(body, ctx) == Flow::Break) break;
    }
    return Flow::Normal;
}

Flow SetStmt::exec(Context & ctx) const {
    target.assign(ctx, value->eval(ctx));
    return Flow::Normal;
}

Flow SetBlockStmt::exec(Context & ctx) const {
    Value v;
    {
        const InScope in(ctx, ctx.push_scope(ctx.scope));   // what the body sets stays in it
        Capture out(ctx);
        exec_body(body, ctx);
        v = Value::string(std::move(out.text));
    }
    for (const FilterCall & f : filters) v = f.apply(ctx, v);
    target.assign(ctx, v);
    return Flow::Normal;
}

Flow MacroStmt::exec(Context & ctx) const {
    ctx.scope->captured = true;   // the macro keeps its scope
    ctx.scope->vars[def.name] = Value::object(std::make_shared<Macro>(def, ctx.scope));
    return Flow::Normal;
}

Flow CallBlockStmt::exec(Context & ctx) const {
    ctx.scope->captured = true;
    const Value caller_value = Value::object(std::make_shared<Macro>(caller, ctx.scope));
    *ctx.out += py_str(call->invoke(ctx, &caller_value));
    return Flow::Normal;
}

Flow FilterBlockStmt::exec(Context & ctx) const {
    Value v;
    {
        const InScope in(ctx, ctx.push_scope(ctx.scope));
        Capture out(ctx);
        exec_body(body, ctx);
        v = Value::string(std::move(out.text));
    }
    for (const FilterCall & f : filters) v = f.apply(ctx, v);
    *ctx.out += py_str(v);
    return Flow::Normal;
}

Flow WithStmt::exec(Context & ctx) const {
    std::vector<Value> values;   // evaluated in the enclosing scope, as jinja2 does
    for (const auto & a : assigns) values.push_back(a.second->eval(ctx));
    const InScope in(ctx, ctx.push_scope(ctx.scope));
    for (size_t k = 0; k < assigns.size(); ++k) ctx.scope->vars[assigns[k].first] = values[k];
    return exec_body(body, ctx);
}

Flow PlainBlockStmt::exec(Context & ctx) const { return exec_body(body, ctx); }

}  // namespace memfit::jinja
