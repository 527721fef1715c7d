// The syntax tree of a parsed template. Built once by the parser and never changed afterwards, so
// one tree can be rendered from several threads at once. Every node keeps the byte offset of
// where it starts in the source, for error messages.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "duet/tokenizer/jinja/value.h"

namespace duet::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind : uint8_t {
  kLiteral,   // none, bool, int, float or str
  kName,
  kList,
  kTuple,
  kDict,
  kGetAttr,   // obj.name
  kGetItem,   // obj[key]
  kSlice,     // obj[a:b:c]
  kCall,
  kFilter,    // value | name(args)
  kTest,      // value is [not] name(args)
  kUnary,     // -x, +x, not x
  kBinary,    // + - * / // % ** ~
  kAnd,
  kOr,
  kCompare,   // a < b <= c ..., in, not in
  kCondition, // a if cond else b
};

struct Expr {
  explicit Expr(ExprKind k, size_t p) : kind(k), pos(p) {}
  virtual ~Expr() = default;
  ExprKind kind;
  size_t pos;
  int height = 1;  // nodes on the longest path down from here (1: a leaf); set by the parser
};

struct LiteralExpr : Expr {
  LiteralExpr(size_t p, Value v) : Expr(ExprKind::kLiteral, p), value(std::move(v)) {}
  Value value;  // never a list or dict: those are built fresh by kList/kDict every time
};

struct NameExpr : Expr {
  NameExpr(size_t p, std::string n) : Expr(ExprKind::kName, p), name(std::move(n)) {}
  std::string name;
};

struct ListExpr : Expr {  // kList or kTuple
  ListExpr(ExprKind k, size_t p) : Expr(k, p) {}
  std::vector<ExprPtr> items;
};

struct DictExpr : Expr {
  explicit DictExpr(size_t p) : Expr(ExprKind::kDict, p) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

struct GetAttrExpr : Expr {
  GetAttrExpr(size_t p, ExprPtr o, std::string n) : Expr(ExprKind::kGetAttr, p), object(std::move(o)), name(std::move(n)) {}
  ExprPtr object;
  std::string name;
};

struct GetItemExpr : Expr {
  GetItemExpr(size_t p, ExprPtr o, ExprPtr k) : Expr(ExprKind::kGetItem, p), object(std::move(o)), key(std::move(k)) {}
  ExprPtr object;
  ExprPtr key;
};

struct SliceExpr : Expr {
  SliceExpr(size_t p, ExprPtr o) : Expr(ExprKind::kSlice, p), object(std::move(o)) {}
  ExprPtr object;
  ExprPtr start, stop, step;  // each may be null
};

// Arguments as written in a call, filter or test: positional, keyword, *args and **kwargs.
struct ArgList {
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr star_args;
  ExprPtr star_kwargs;
};

struct CallExpr : Expr {
  CallExpr(size_t p, ExprPtr c) : Expr(ExprKind::kCall, p), callee(std::move(c)) {}
  ExprPtr callee;
  ArgList args;
};

// One filter application; `input` is null inside {% filter %} blocks and {% set x | f %}.
struct FilterExpr : Expr {
  FilterExpr(size_t p, ExprPtr in, std::string n) : Expr(ExprKind::kFilter, p), input(std::move(in)), name(std::move(n)) {}
  ExprPtr input;
  std::string name;
  ArgList args;
};

struct TestExpr : Expr {
  TestExpr(size_t p, ExprPtr in, std::string n, bool neg)
      : Expr(ExprKind::kTest, p), input(std::move(in)), name(std::move(n)), negated(neg) {}
  ExprPtr input;
  std::string name;
  bool negated;
  ArgList args;
};

struct UnaryExpr : Expr {
  UnaryExpr(size_t p, std::string o, ExprPtr x) : Expr(ExprKind::kUnary, p), op(std::move(o)), operand(std::move(x)) {}
  std::string op;  // "-", "+" or "not"
  ExprPtr operand;
};

struct BinaryExpr : Expr {  // kBinary, kAnd, kOr
  BinaryExpr(ExprKind k, size_t p, std::string o, ExprPtr l, ExprPtr r)
      : Expr(k, p), op(std::move(o)), left(std::move(l)), right(std::move(r)) {}
  std::string op;
  ExprPtr left, right;
};

struct CompareExpr : Expr {
  CompareExpr(size_t p, ExprPtr f) : Expr(ExprKind::kCompare, p), first(std::move(f)) {}
  ExprPtr first;
  std::vector<std::pair<std::string, ExprPtr>> rest;  // op ("==", "<", "in", "notin", ...) and operand
};

struct ConditionExpr : Expr {
  ConditionExpr(size_t p, ExprPtr t, ExprPtr c, ExprPtr e)
      : Expr(ExprKind::kCondition, p), then_value(std::move(t)), condition(std::move(c)), else_value(std::move(e)) {}
  ExprPtr then_value, condition, else_value;  // else_value may be null (undefined)
};

enum class StmtKind : uint8_t {
  kText,      // template data
  kPrint,     // {{ expr }}
  kIf,
  kFor,
  kSet,
  kSetBlock,
  kMacro,
  kCallBlock,
  kFilterBlock,
  kWith,      // {% with %} and {% block %} (a scope of its own)
  kBreak,
  kContinue,
  kBody,      // a body that needs no scope of its own ({% generation %})
};

struct Stmt {
  explicit Stmt(StmtKind k, size_t p) : kind(k), pos(p) {}
  virtual ~Stmt() = default;
  StmtKind kind;
  size_t pos;
};

struct TextStmt : Stmt {
  TextStmt(size_t p, std::string t) : Stmt(StmtKind::kText, p), text(std::move(t)) {}
  std::string text;
};

struct PrintStmt : Stmt {
  PrintStmt(size_t p, ExprPtr e) : Stmt(StmtKind::kPrint, p), expr(std::move(e)) {}
  ExprPtr expr;
};

struct IfStmt : Stmt {
  explicit IfStmt(size_t p) : Stmt(StmtKind::kIf, p) {}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if and every elif
  Body else_body;
};

// Where a value is assigned: a name, a namespace attribute (ns.x) or names to unpack (a, b).
struct Target {
  std::vector<std::string> names;  // one name, or several for unpacking
  std::string attribute;           // set for ns.attr: names[0] is the namespace
  bool unpack = false;
};

struct ForStmt : Stmt {
  explicit ForStmt(size_t p) : Stmt(StmtKind::kFor, p) {}
  Target target;
  ExprPtr iterable;
  ExprPtr filter;  // {% for x in xs if cond %}, may be null
  Body body;
  Body else_body;
};

struct SetStmt : Stmt {
  explicit SetStmt(size_t p) : Stmt(StmtKind::kSet, p) {}
  Target target;
  ExprPtr value;
};

struct SetBlockStmt : Stmt {
  explicit SetBlockStmt(size_t p) : Stmt(StmtKind::kSetBlock, p) {}
  Target target;
  ExprPtr filter;  // a FilterExpr chain whose innermost input is null, or null
  Body body;
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct MacroStmt : Stmt {
  explicit MacroStmt(size_t p) : Stmt(StmtKind::kMacro, p) {}
  std::string name;
  std::vector<MacroParam> params;
  Body body;
};

struct CallBlockStmt : Stmt {
  explicit CallBlockStmt(size_t p) : Stmt(StmtKind::kCallBlock, p) {}
  std::vector<MacroParam> caller_params;
  ExprPtr call;  // a CallExpr
  Body body;
};

struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(size_t p) : Stmt(StmtKind::kFilterBlock, p) {}
  ExprPtr filter;  // a FilterExpr chain whose innermost input is null
  Body body;
};

struct WithStmt : Stmt {
  explicit WithStmt(size_t p) : Stmt(StmtKind::kWith, p) {}
  std::vector<std::pair<Target, ExprPtr>> assignments;
  Body body;
};

struct BodyStmt : Stmt {  // kBody, kBreak, kContinue
  BodyStmt(StmtKind k, size_t p) : Stmt(k, p) {}
  Body body;
};

}  // namespace duet::jinja
