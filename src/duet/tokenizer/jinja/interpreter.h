// The tree-walking evaluator. One Interpreter renders one template once: it owns the scopes and
// the variables of that render, while the syntax tree it walks is shared and never changed.
//
// Scoping follows Jinja2: a for loop gives each iteration a scope of its own (so `set` inside a
// loop is not seen after it: use a namespace), macros see the scope they were defined in, and
// `if` has no scope of its own.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "duet/tokenizer/jinja/ast.h"
#include "duet/tokenizer/jinja/value.h"

namespace duet::jinja {

struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;

  Value* find(std::string_view name);
  void set(std::string_view name, Value value);
};

class Interpreter {
 public:
  // `context`: a dict with the variables the template is rendered with.
  explicit Interpreter(const Value& context);
  // Empties the namespaces the render created, so that a namespace that refers to itself
  // (ns.self = ns) cannot outlive the render through a reference cycle.
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Called by namespace(): remembers a namespace created during this render.
  void track_namespace(const DictPtr& ns) { namespaces_.push_back(ns); }

  void render(const Body& body, std::string& out);

  Value eval(const Expr& expr);
  // Calls a function value; throws for anything else ("'str' object is not callable").
  Value call(const Value& callee, const CallArgs& args);
  // Jinja's obj.name: the attribute (a method), else the item; undefined when neither exists.
  Value get_attr(const Value& object, std::string_view name);
  // Jinja's obj[key]: the item, else the attribute; undefined when neither exists.
  Value get_item(const Value& object, const Value& key);

  // Runs a macro body (for the function values that {% macro %} and {% call %} create): binds
  // the arguments to `params` in a new scope below `defined_in` and returns what the body printed.
  Value call_macro(std::string_view name, const std::vector<MacroParam>& params, const Body& body,
                   const std::weak_ptr<Scope>& defined_in, const CallArgs& args);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  // Counts one unit of the render's work; an error past the budget.
  void step();
  Flow exec_body(const Body& body, std::string& out);
  Flow exec(const Stmt& stmt, std::string& out);
  Flow exec_for(const ForStmt& stmt, std::string& out);
  void exec_call_block(const CallBlockStmt& stmt, std::string& out);
  void assign(const Target& target, Value value);

  Value eval_inner(const Expr& expr);
  Value eval_call(const CallExpr& call);
  Value eval_slice(const SliceExpr& slice);
  Value apply_filters(const FilterExpr& filter, const Value* block_input);
  CallArgs eval_args(const ArgList& args);
  Value lookup(const std::string& name);

  const DictData* context_;
  std::shared_ptr<Scope> root_;
  std::shared_ptr<Scope> current_;
  int call_depth_ = 0;
  int64_t steps_ = 0;
  std::vector<std::weak_ptr<DictData>> namespaces_;
};

}  // namespace duet::jinja
