#include "duet/tokenizer/jinja/interpreter.h"

#include "duet/tokenizer/jinja/builtins.h"
#include "duet/tokenizer/jinja/error.h"
#include "duet/tokenizer/jinja/operators.h"
#include "duet/tokenizer/jinja/pystring.h"

namespace duet::jinja {
namespace {

constexpr int kMaxCallDepth = 256;
// Work one render may do, counted in statements run, loop iterations and macro calls. DeepSeek's
// templates take about 13 a message (26,000 for 2,000 messages with tool calls and 100 tools), so
// a million is more than any context holds; past it are loops nested over large ranges or macros
// that fan out, which would otherwise hold the rendering thread for hours.
constexpr int64_t kMaxSteps = int64_t{1} << 20;

// Makes `scope` the current scope until destroyed.
class ScopeSwitch {
 public:
  ScopeSwitch(std::shared_ptr<Scope>& current, std::shared_ptr<Scope> scope) : current_(current), saved_(current) {
    current_ = std::move(scope);
  }
  ~ScopeSwitch() { current_ = std::move(saved_); }
  ScopeSwitch(const ScopeSwitch&) = delete;
  ScopeSwitch& operator=(const ScopeSwitch&) = delete;

 private:
  std::shared_ptr<Scope>& current_;
  std::shared_ptr<Scope> saved_;
};

std::shared_ptr<Scope> child_of(const std::shared_ptr<Scope>& parent) {
  auto scope = std::make_shared<Scope>();
  scope->parent = parent;
  return scope;
}

// The loop variable: a dict whose entries are updated in place for every iteration.
enum LoopField { kIndex, kIndex0, kRevindex, kRevindex0, kFirst, kLast, kLength, kPrevitem, kNextitem, kNumLoopFields };

Value make_loop_object(int64_t length) {
  Value loop = Value::dict();
  auto& items = loop.as_dict().items;
  for (const char* key : {"index", "index0", "revindex", "revindex0", "first", "last", "length", "previtem", "nextitem"}) {
    items.emplace_back(Value(key), Value());
  }
  items[kLength].second = Value(length);
  items.emplace_back(Value("depth"), Value(1));
  items.emplace_back(Value("depth0"), Value(0));
  std::weak_ptr<DictData> weak = loop.dict_ptr();
  items.emplace_back(Value("cycle"), make_function("loop.cycle", [weak](Interpreter&, const CallArgs& args) {
                       if (args.args.empty()) runtime_error("no items for cycling given");
                       const auto loop_data = weak.lock();
                       const int64_t index0 = loop_data ? loop_data->items[kIndex0].second.as_int() : 0;
                       return args.args[static_cast<size_t>(index0) % args.args.size()];
                     }));
  return loop;
}

void update_loop_object(DictData& loop, const std::vector<Value>& items, size_t i) {
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t index0 = static_cast<int64_t>(i);
  auto& f = loop.items;
  f[kIndex].second = Value(index0 + 1);
  f[kIndex0].second = Value(index0);
  f[kRevindex].second = Value(n - index0);
  f[kRevindex0].second = Value(n - index0 - 1);
  f[kFirst].second = Value(i == 0);
  f[kLast].second = Value(index0 == n - 1);
  f[kPrevitem].second = i > 0 ? items[i - 1] : Value::undefined("there is no previous item");
  f[kNextitem].second = index0 + 1 < n ? items[i + 1] : Value::undefined("there is no next item");
}

}  // namespace

Value* Scope::find(std::string_view name) {
  for (auto& [key, value] : vars) {
    if (key == name) return &value;
  }
  return nullptr;
}

void Scope::set(std::string_view name, Value value) {
  if (Value* v = find(name)) {
    *v = std::move(value);
  } else {
    vars.emplace_back(std::string(name), std::move(value));
  }
}

Interpreter::Interpreter(const Value& context)
    : context_(context.is_dict() ? &context.as_dict() : nullptr), root_(std::make_shared<Scope>()), current_(root_) {}

Interpreter::~Interpreter() {
  for (const auto& weak : namespaces_) {
    if (const DictPtr ns = weak.lock()) {
      std::vector<std::pair<Value, Value>> items;
      items.swap(ns->items);  // destroyed here, after ns->items is already empty
    }
  }
}

void Interpreter::render(const Body& body, std::string& out) { exec_body(body, out); }

Interpreter::Flow Interpreter::exec_body(const Body& body, std::string& out) {
  for (const StmtPtr& stmt : body) {
    const Flow flow = exec(*stmt, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

void Interpreter::step() {
  if (++steps_ > kMaxSteps) {
    runtime_error("the template ran more than {} steps (statements, loop iterations and macro calls), more than a "
                  "template may take",
                  kMaxSteps);
  }
}

Interpreter::Flow Interpreter::exec(const Stmt& stmt, std::string& out) {
  try {
    step();
    switch (stmt.kind) {
      case StmtKind::kText: out += static_cast<const TextStmt&>(stmt).text; break;
      case StmtKind::kPrint: {
        const Value v = eval(*static_cast<const PrintStmt&>(stmt).expr);
        if (v.is_string()) out += v.as_string();
        else out += v.str();
        break;
      }
      case StmtKind::kIf: {
        const auto& s = static_cast<const IfStmt&>(stmt);
        for (const auto& [cond, body] : s.branches) {
          if (eval(*cond).truthy()) return exec_body(body, out);
        }
        return exec_body(s.else_body, out);
      }
      case StmtKind::kFor: return exec_for(static_cast<const ForStmt&>(stmt), out);
      case StmtKind::kSet: {
        const auto& s = static_cast<const SetStmt&>(stmt);
        assign(s.target, eval(*s.value));
        break;
      }
      case StmtKind::kSetBlock: {
        const auto& s = static_cast<const SetBlockStmt&>(stmt);
        std::string text;
        exec_body(s.body, text);
        Value value(std::move(text));
        if (s.filter) value = apply_filters(static_cast<const FilterExpr&>(*s.filter), &value);
        assign(s.target, std::move(value));
        break;
      }
      case StmtKind::kMacro: {
        const auto& s = static_cast<const MacroStmt&>(stmt);
        std::weak_ptr<Scope> defined_in = current_;
        const MacroStmt* macro = &s;
        current_->set(s.name, make_function(s.name, [macro, defined_in](Interpreter& interp, const CallArgs& args) {
                        return interp.call_macro(macro->name, macro->params, macro->body, defined_in, args);
                      }));
        break;
      }
      case StmtKind::kCallBlock: exec_call_block(static_cast<const CallBlockStmt&>(stmt), out); break;
      case StmtKind::kFilterBlock: {
        const auto& s = static_cast<const FilterBlockStmt&>(stmt);
        std::string text;
        exec_body(s.body, text);
        const Value input(std::move(text));
        out += apply_filters(static_cast<const FilterExpr&>(*s.filter), &input).str();
        break;
      }
      case StmtKind::kWith: {
        const auto& s = static_cast<const WithStmt&>(stmt);
        std::vector<Value> values;
        for (const auto& assignment : s.assignments) values.push_back(eval(*assignment.second));
        ScopeSwitch with_scope(current_, child_of(current_));
        for (size_t i = 0; i < values.size(); ++i) assign(s.assignments[i].first, std::move(values[i]));
        return exec_body(s.body, out);
      }
      case StmtKind::kBody: return exec_body(static_cast<const BodyStmt&>(stmt).body, out);
      case StmtKind::kBreak: return Flow::kBreak;
      case StmtKind::kContinue: return Flow::kContinue;
    }
    if (static_cast<int64_t>(out.size()) > kMaxStringSize) {
      runtime_error("the rendered text grew past {} bytes, more than a template may make", kMaxStringSize);
    }
  } catch (TemplateError& e) {
    e.set_pos_if_unknown(stmt.pos);
    throw;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec_for(const ForStmt& s, std::string& out) {
  std::vector<Value> items = iterate(eval(*s.iterable));
  if (s.filter) {
    std::vector<Value> kept;
    for (Value& item : items) {
      step();
      ScopeSwitch filter_scope(current_, child_of(current_));
      assign(s.target, item);
      if (eval(*s.filter).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec_body(s.else_body, out);
  const Value loop = make_loop_object(static_cast<int64_t>(items.size()));
  for (size_t i = 0; i < items.size(); ++i) {
    step();
    ScopeSwitch iteration(current_, child_of(current_));
    update_loop_object(loop.as_dict(), items, i);
    current_->vars.emplace_back("loop", loop);
    assign(s.target, items[i]);
    if (exec_body(s.body, out) == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

void Interpreter::exec_call_block(const CallBlockStmt& s, std::string& out) {
  const auto& call_expr = static_cast<const CallExpr&>(*s.call);
  const Value callee = eval(*call_expr.callee);
  CallArgs args = eval_args(call_expr.args);
  // caller() renders the block body with the caller's parameters, in the scope of the call.
  std::weak_ptr<Scope> defined_in = current_;
  const CallBlockStmt* block = &s;
  args.kwargs.emplace_back("caller", make_function("caller", [block, defined_in](Interpreter& interp, const CallArgs& a) {
                             return interp.call_macro("caller", block->caller_params, block->body, defined_in, a);
                           }));
  out += call(callee, args).str();
}

Value Interpreter::call_macro(std::string_view name, const std::vector<MacroParam>& params, const Body& body,
                              const std::weak_ptr<Scope>& defined_in, const CallArgs& args) {
  if (call_depth_ >= kMaxCallDepth) runtime_error("maximum recursion depth exceeded in macro '{}'", name);
  step();
  std::shared_ptr<Scope> parent = defined_in.lock();
  auto scope = child_of(parent ? parent : root_);
  std::vector<bool> given(params.size(), false);
  std::vector<Value> varargs;
  Value kwargs = Value::dict();
  for (size_t i = 0; i < args.args.size(); ++i) {
    if (i < params.size()) {
      scope->set(params[i].name, args.args[i]);
      given[i] = true;
    } else {
      varargs.push_back(args.args[i]);
    }
  }
  for (const auto& [key, value] : args.kwargs) {
    size_t i = 0;
    while (i < params.size() && params[i].name != key) ++i;
    if (i < params.size()) {
      if (given[i]) runtime_error("macro '{}' got multiple values for argument '{}'", name, key);
      scope->set(key, value);
      given[i] = true;
    } else if (key == "caller") {
      scope->set("caller", value);
    } else {
      kwargs.as_dict().set(key, value);
    }
  }
  ScopeSwitch macro_scope(current_, scope);
  for (size_t i = 0; i < params.size(); ++i) {
    if (given[i]) continue;
    scope->set(params[i].name, params[i].default_value
                                   ? eval(*params[i].default_value)
                                   : Value::undefined(fmt::format("parameter '{}' was not provided", params[i].name)));
  }
  scope->set("varargs", Value::tuple(std::move(varargs)));
  scope->set("kwargs", std::move(kwargs));
  ++call_depth_;
  std::string out;
  try {
    exec_body(body, out);
  } catch (...) {
    --call_depth_;
    throw;
  }
  --call_depth_;
  return Value(std::move(out));
}

void Interpreter::assign(const Target& target, Value value) {
  if (!target.attribute.empty()) {
    const Value ns = lookup(target.names[0]);
    if (!ns.is_namespace()) runtime_error("cannot assign attribute on non-namespace object '{}'", target.names[0]);
    ns.as_dict().set(target.attribute, std::move(value));
    return;
  }
  if (!target.unpack) {
    current_->set(target.names[0], std::move(value));
    return;
  }
  std::vector<Value> items = iterate(value);
  if (items.size() < target.names.size()) {
    runtime_error("not enough values to unpack (expected {}, got {})", target.names.size(), items.size());
  }
  if (items.size() > target.names.size()) runtime_error("too many values to unpack (expected {})", target.names.size());
  for (size_t i = 0; i < items.size(); ++i) current_->set(target.names[i], std::move(items[i]));
}

Value Interpreter::lookup(const std::string& name) {
  for (Scope* s = current_.get(); s; s = s->parent.get()) {
    if (Value* v = s->find(name)) return *v;
  }
  if (context_) {
    if (const Value* v = context_->find(std::string_view(name))) return *v;
  }
  if (const Value* g = find_global(name)) return *g;
  return Value::undefined(fmt::format("'{}' is undefined", name));
}

Value Interpreter::eval(const Expr& expr) {
  try {
    return eval_inner(expr);
  } catch (TemplateError& e) {
    e.set_pos_if_unknown(expr.pos);
    throw;
  }
}

Value Interpreter::eval_inner(const Expr& expr) {
  switch (expr.kind) {
    case ExprKind::kLiteral: return static_cast<const LiteralExpr&>(expr).value;
    case ExprKind::kName: return lookup(static_cast<const NameExpr&>(expr).name);
    case ExprKind::kList: case ExprKind::kTuple: {
      std::vector<Value> items;
      for (const ExprPtr& item : static_cast<const ListExpr&>(expr).items) items.push_back(eval(*item));
      return expr.kind == ExprKind::kTuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    case ExprKind::kDict: {
      Value d = Value::dict();
      for (const auto& [key, value] : static_cast<const DictExpr&>(expr).items) {
        Value k = eval(*key);
        d.as_dict().set(std::move(k), eval(*value));
      }
      return d;
    }
    case ExprKind::kGetAttr: {
      const auto& e = static_cast<const GetAttrExpr&>(expr);
      return get_attr(eval(*e.object), e.name);
    }
    case ExprKind::kGetItem: {
      const auto& e = static_cast<const GetItemExpr&>(expr);
      const Value object = eval(*e.object);
      return get_item(object, eval(*e.key));
    }
    case ExprKind::kSlice: return eval_slice(static_cast<const SliceExpr&>(expr));
    case ExprKind::kCall: return eval_call(static_cast<const CallExpr&>(expr));
    case ExprKind::kFilter: return apply_filters(static_cast<const FilterExpr&>(expr), nullptr);
    case ExprKind::kTest: {
      const auto& e = static_cast<const TestExpr&>(expr);
      const Value value = eval(*e.input);
      return Value(apply_test(*this, e.name, value, eval_args(e.args)) != e.negated);
    }
    case ExprKind::kUnary: {
      const auto& e = static_cast<const UnaryExpr&>(expr);
      const Value v = eval(*e.operand);
      if (e.op == "not") return Value(!v.truthy());
      return unary_op(e.op, v);
    }
    case ExprKind::kBinary: {
      const auto& e = static_cast<const BinaryExpr&>(expr);
      const Value left = eval(*e.left);
      return binary_op(e.op, left, eval(*e.right));
    }
    case ExprKind::kAnd: {
      const auto& e = static_cast<const BinaryExpr&>(expr);
      Value left = eval(*e.left);
      return left.truthy() ? eval(*e.right) : left;
    }
    case ExprKind::kOr: {
      const auto& e = static_cast<const BinaryExpr&>(expr);
      Value left = eval(*e.left);
      return left.truthy() ? left : eval(*e.right);
    }
    case ExprKind::kCompare: {
      const auto& e = static_cast<const CompareExpr&>(expr);
      Value left = eval(*e.first);
      for (const auto& [op, operand] : e.rest) {
        Value right = eval(*operand);
        bool ok = false;
        if (op == "in") ok = contains(right, left);
        else if (op == "notin") ok = !contains(right, left);
        else ok = compare_op(op, left, right);
        if (!ok) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case ExprKind::kCondition: {
      const auto& e = static_cast<const ConditionExpr&>(expr);
      if (eval(*e.condition).truthy()) return eval(*e.then_value);
      if (e.else_value) return eval(*e.else_value);
      return Value::undefined("the inline if-expression evaluated to false and has no else section");
    }
  }
  runtime_error("unknown expression");
}

CallArgs Interpreter::eval_args(const ArgList& list) {
  CallArgs args;
  args.args.reserve(list.args.size());
  for (const ExprPtr& a : list.args) args.args.push_back(eval(*a));
  if (list.star_args) {
    for (Value& v : iterate(eval(*list.star_args))) args.args.push_back(std::move(v));
  }
  for (const auto& [key, value] : list.kwargs) args.kwargs.emplace_back(key, eval(*value));
  if (list.star_kwargs) {
    const Value d = eval(*list.star_kwargs);
    if (!d.is_dict() || d.is_namespace()) runtime_error("argument after ** must be a mapping, not {}", d.type_name());
    for (const auto& [key, value] : d.as_dict().items) {
      if (!key.is_string()) runtime_error("keywords must be strings");
      args.kwargs.emplace_back(key.as_string(), value);
    }
  }
  return args;
}

Value Interpreter::eval_call(const CallExpr& c) {
  if (c.callee->kind == ExprKind::kGetAttr) {  // method calls skip creating a bound method
    const auto& attr = static_cast<const GetAttrExpr&>(*c.callee);
    const Value object = eval(*attr.object);
    if (has_method(object, attr.name)) {
      const CallArgs args = eval_args(c.args);
      return call_method(object, attr.name, args);
    }
    const Value callee = get_attr(object, attr.name);
    return call(callee, eval_args(c.args));
  }
  const Value callee = eval(*c.callee);
  return call(callee, eval_args(c.args));
}

Value Interpreter::call(const Value& callee, const CallArgs& args) {
  if (callee.is_function()) return callee.as_function().call(*this, args);
  if (callee.is_undefined()) callee.fail_undefined();
  runtime_error("'{}' object is not callable", callee.type_name());
}

Value Interpreter::apply_filters(const FilterExpr& f, const Value* block_input) {
  Value input;
  if (f.input) {
    input = f.input->kind == ExprKind::kFilter && block_input
                ? apply_filters(static_cast<const FilterExpr&>(*f.input), block_input)
                : eval(*f.input);
  } else if (block_input) {
    input = *block_input;
  }
  return apply_filter(*this, f.name, input, eval_args(f.args));
}

Value Interpreter::get_attr(const Value& object, std::string_view name) {
  switch (object.kind()) {
    case Value::Kind::kUndefined: object.fail_undefined();
    case Value::Kind::kDict:
      if (!object.is_namespace() && has_method(object, name)) break;
      if (const Value* v = object.as_dict().find(name)) return *v;
      return Value::undefined(fmt::format("'{} object' has no attribute '{}'", object.type_name(), name));
    default: break;
  }
  if (is_unsafe_method(object, name)) {  // as the sandbox does: undefined, failing when used
    return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe", name, object.type_name()));
  }
  if (has_method(object, name)) {
    Value bound = object;
    std::string method(name);
    return make_function(method, [bound, method](Interpreter&, const CallArgs& args) {
      return call_method(bound, method, args);
    });
  }
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", object.type_name(), name));
}

Value Interpreter::get_item(const Value& object, const Value& key) {
  switch (object.kind()) {
    case Value::Kind::kUndefined: object.fail_undefined();
    case Value::Kind::kDict:
      if (object.is_namespace()) break;
      if (const Value* v = object.as_dict().find(key)) return *v;
      break;
    case Value::Kind::kList:
      if (key.is_int() || key.is_bool()) {
        const auto& items = object.as_list().items;
        int64_t i = key.as_int();
        if (i < 0) i += static_cast<int64_t>(items.size());
        if (i >= 0 && i < static_cast<int64_t>(items.size())) return items[static_cast<size_t>(i)];
        return Value::undefined(fmt::format("'{} object' has no element {}", object.type_name(), key.as_int()));
      }
      break;
    case Value::Kind::kString:
      if (key.is_int() || key.is_bool()) {
        const std::string& s = object.as_string();
        const std::vector<size_t> offsets = codepoint_offsets(s);
        const int64_t n = static_cast<int64_t>(offsets.size()) - 1;
        int64_t i = key.as_int();
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
          return Value(s.substr(offsets[static_cast<size_t>(i)], offsets[static_cast<size_t>(i) + 1] - offsets[static_cast<size_t>(i)]));
        }
        return Value::undefined(fmt::format("'str object' has no element {}", key.as_int()));
      }
      break;
    default: break;
  }
  if (key.is_string()) return get_attr(object, key.as_string());
  return Value::undefined(fmt::format("'{} object' has no element {}", object.type_name(), key.repr()));
}

Value Interpreter::eval_slice(const SliceExpr& s) {
  const Value object = eval(*s.object);
  auto bound = [&](const ExprPtr& e) -> std::optional<int64_t> {
    if (!e) return std::nullopt;
    const Value v = eval(*e);
    if (v.is_none()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) runtime_error("slice indices must be integers or None, not {}", v.type_name());
    return v.as_int();
  };
  const std::optional<int64_t> start = bound(s.start), stop = bound(s.stop), step = bound(s.step);
  if (object.is_undefined()) object.fail_undefined();
  if (object.is_list()) {
    const auto& items = object.as_list().items;
    std::vector<Value> out;
    for (int64_t i : slice_indexes(static_cast<int64_t>(items.size()), start, stop, step)) out.push_back(items[static_cast<size_t>(i)]);
    return object.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
  }
  if (object.is_string()) {
    const std::string& str = object.as_string();
    std::string out;
    if (is_ascii(str)) {
      for (int64_t i : slice_indexes(static_cast<int64_t>(str.size()), start, stop, step)) out += str[static_cast<size_t>(i)];
    } else {
      const std::vector<size_t> offsets = codepoint_offsets(str);
      for (int64_t i : slice_indexes(static_cast<int64_t>(offsets.size()) - 1, start, stop, step)) {
        const size_t k = static_cast<size_t>(i);
        out.append(str, offsets[k], offsets[k + 1] - offsets[k]);
      }
    }
    return Value(std::move(out));
  }
  runtime_error("'{}' object is not subscriptable", object.type_name());
}

}  // namespace duet::jinja
