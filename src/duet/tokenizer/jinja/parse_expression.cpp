// The expression half of the parser, following Jinja2's precedence (see parser.h).
#include <algorithm>

#include "duet/tokenizer/jinja/builtins.h"
#include "duet/tokenizer/jinja/parser_impl.h"

namespace duet::jinja {

namespace {

int height_of(const ExprPtr& e) { return e ? e->height : 0; }

int height_of(const ArgList& a) {
  int h = std::max(height_of(a.star_args), height_of(a.star_kwargs));
  for (const ExprPtr& e : a.args) h = std::max(h, height_of(e));
  for (const auto& kv : a.kwargs) h = std::max(h, height_of(kv.second));
  return h;
}

// The tallest child of `e`, whose children already have their heights.
int children_height(const Expr& e) {
  switch (e.kind) {
    case ExprKind::kLiteral:
    case ExprKind::kName: return 0;
    case ExprKind::kList:
    case ExprKind::kTuple: {
      int h = 0;
      for (const ExprPtr& x : static_cast<const ListExpr&>(e).items) h = std::max(h, height_of(x));
      return h;
    }
    case ExprKind::kDict: {
      int h = 0;
      for (const auto& [k, v] : static_cast<const DictExpr&>(e).items) h = std::max({h, height_of(k), height_of(v)});
      return h;
    }
    case ExprKind::kGetAttr: return height_of(static_cast<const GetAttrExpr&>(e).object);
    case ExprKind::kGetItem: {
      const auto& g = static_cast<const GetItemExpr&>(e);
      return std::max(height_of(g.object), height_of(g.key));
    }
    case ExprKind::kSlice: {
      const auto& s = static_cast<const SliceExpr&>(e);
      return std::max({height_of(s.object), height_of(s.start), height_of(s.stop), height_of(s.step)});
    }
    case ExprKind::kCall: {
      const auto& c = static_cast<const CallExpr&>(e);
      return std::max(height_of(c.callee), height_of(c.args));
    }
    case ExprKind::kFilter: {
      const auto& f = static_cast<const FilterExpr&>(e);
      return std::max(height_of(f.input), height_of(f.args));
    }
    case ExprKind::kTest: {
      const auto& t = static_cast<const TestExpr&>(e);
      return std::max(height_of(t.input), height_of(t.args));
    }
    case ExprKind::kUnary: return height_of(static_cast<const UnaryExpr&>(e).operand);
    case ExprKind::kBinary:
    case ExprKind::kAnd:
    case ExprKind::kOr: {
      const auto& b = static_cast<const BinaryExpr&>(e);
      return std::max(height_of(b.left), height_of(b.right));
    }
    case ExprKind::kCompare: {
      const auto& c = static_cast<const CompareExpr&>(e);
      int h = height_of(c.first);
      for (const auto& r : c.rest) h = std::max(h, height_of(r.second));
      return h;
    }
    case ExprKind::kCondition: {
      const auto& c = static_cast<const ConditionExpr&>(e);
      return std::max({height_of(c.then_value), height_of(c.condition), height_of(c.else_value)});
    }
  }
  return 0;
}

}  // namespace

ExprPtr Parser::bounded(ExprPtr node) {
  node->height = children_height(*node) + 1;
  if (node->height > kMaxHeight) {
    syntax_error(node->pos, "the expression is more than {} operations deep", kMaxHeight);
  }
  return node;
}

bool Parser::is_tuple_end(Tags extra_end) const {
  const TokenKind k = cur().kind;
  if (k == TokenKind::kVarEnd || k == TokenKind::kBlockEnd || k == TokenKind::kEof || is_op(")")) return true;
  for (std::string_view name : extra_end) {
    if (is_name(name)) return true;
  }
  return false;
}

// Expressions separated by commas form a tuple.
ExprPtr Parser::parse_tuple(bool with_condition, Tags extra_end, bool explicit_parens) {
  const size_t pos = cur().pos;
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  while (true) {
    if (!items.empty()) expect_op(",");
    if (is_tuple_end(extra_end)) break;
    items.push_back(parse_expression(with_condition));
    if (!is_op(",")) break;
    is_tuple = true;
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parens) syntax_error(cur().pos, "expected an expression, got {}", describe_token(cur()));
  }
  auto t = std::make_unique<ListExpr>(ExprKind::kTuple, pos);
  t->items = std::move(items);
  return bounded(std::move(t));
}

ExprPtr Parser::parse_expression(bool with_condition) {
  if (!with_condition) return parse_or();
  const size_t pos = cur().pos;
  ExprPtr value = parse_or();
  while (skip_name("if")) {
    const DepthGuard guard(depth_, cur().pos);  // a if b else c if d else ...: recursion on the else
    ExprPtr cond = parse_or();
    ExprPtr otherwise = skip_name("else") ? parse_expression(true) : nullptr;
    value = bounded(std::make_unique<ConditionExpr>(pos, std::move(value), std::move(cond), std::move(otherwise)));
  }
  return value;
}

ExprPtr Parser::parse_or() {
  ExprPtr left = parse_and();
  while (is_name("or")) {
    const size_t pos = advance().pos;
    left = bounded(std::make_unique<BinaryExpr>(ExprKind::kOr, pos, "or", std::move(left), parse_and()));
  }
  return left;
}

ExprPtr Parser::parse_and() {
  ExprPtr left = parse_not();
  while (is_name("and")) {
    const size_t pos = advance().pos;
    left = bounded(std::make_unique<BinaryExpr>(ExprKind::kAnd, pos, "and", std::move(left), parse_not()));
  }
  return left;
}

ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    const DepthGuard guard(depth_, cur().pos);
    const size_t pos = advance().pos;
    return bounded(std::make_unique<UnaryExpr>(pos, "not", parse_not()));
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  const size_t pos = cur().pos;
  ExprPtr first = parse_add();
  std::unique_ptr<CompareExpr> cmp;
  while (true) {
    std::string op;
    if (cur().kind == TokenKind::kOperator &&
        (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" || cur().text == ">" ||
         cur().text == ">=")) {
      op = advance().text;
    } else if (is_name("in")) {
      advance();
      op = "in";
    } else if (is_name("not") && peek().kind == TokenKind::kName && peek().text == "in") {
      advance();
      advance();
      op = "notin";
    } else {
      break;
    }
    if (!cmp) cmp = std::make_unique<CompareExpr>(pos, std::move(first));
    cmp->rest.emplace_back(op, parse_add());
  }
  if (cmp) return bounded(std::move(cmp));
  return first;
}

ExprPtr Parser::parse_add() {
  ExprPtr left = parse_concat();
  while (is_op("+") || is_op("-")) {
    const Token& op = advance();
    left = bounded(std::make_unique<BinaryExpr>(ExprKind::kBinary, op.pos, op.text, std::move(left), parse_concat()));
  }
  return left;
}

ExprPtr Parser::parse_concat() {
  ExprPtr left = parse_mul();
  while (is_op("~")) {
    const Token& op = advance();
    left = bounded(std::make_unique<BinaryExpr>(ExprKind::kBinary, op.pos, "~", std::move(left), parse_mul()));
  }
  return left;
}

ExprPtr Parser::parse_mul() {
  ExprPtr left = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const Token& op = advance();
    left = bounded(std::make_unique<BinaryExpr>(ExprKind::kBinary, op.pos, op.text, std::move(left), parse_pow()));
  }
  return left;
}

ExprPtr Parser::parse_pow() {
  ExprPtr left = parse_unary(true);
  while (is_op("**")) {
    const Token& op = advance();
    left = bounded(std::make_unique<BinaryExpr>(ExprKind::kBinary, op.pos, "**", std::move(left), parse_unary(true)));
  }
  return left;
}

// As in Jinja2, a filter after a unary minus applies to the negated value: -x|abs is abs(-x).
ExprPtr Parser::parse_unary(bool with_filter) {
  const DepthGuard guard(depth_, cur().pos);
  ExprPtr node;
  if (is_op("-") || is_op("+")) {
    const Token& op = advance();
    node = bounded(std::make_unique<UnaryExpr>(op.pos, op.text, parse_unary(false)));
  } else {
    node = parse_primary();
  }
  node = parse_postfix(std::move(node));
  if (with_filter) node = parse_filter_expr(std::move(node));
  return node;
}

ExprPtr Parser::parse_primary() {
  const Token& t = cur();
  switch (t.kind) {
    case TokenKind::kName: {
      advance();
      if (t.text == "true" || t.text == "True") return std::make_unique<LiteralExpr>(t.pos, Value(true));
      if (t.text == "false" || t.text == "False") return std::make_unique<LiteralExpr>(t.pos, Value(false));
      if (t.text == "none" || t.text == "None") return std::make_unique<LiteralExpr>(t.pos, Value::none());
      return std::make_unique<NameExpr>(t.pos, t.text);
    }
    case TokenKind::kString: {
      std::string text = advance().text;
      while (cur().kind == TokenKind::kString) text += advance().text;  // adjacent literals join
      return std::make_unique<LiteralExpr>(t.pos, Value(std::move(text)));
    }
    case TokenKind::kInt: advance(); return std::make_unique<LiteralExpr>(t.pos, Value(t.int_value));
    case TokenKind::kFloat: advance(); return std::make_unique<LiteralExpr>(t.pos, Value(t.float_value));
    case TokenKind::kOperator:
      if (t.text == "(") {
        advance();
        ExprPtr e = parse_tuple(true, {}, true);
        expect_op(")");
        return e;
      }
      if (t.text == "[") return parse_list();
      if (t.text == "{") return parse_dict();
      break;
    default:
      break;
  }
  syntax_error(t.pos, "unexpected {}", describe_token(t));
}

ExprPtr Parser::parse_list() {
  auto l = std::make_unique<ListExpr>(ExprKind::kList, advance().pos);
  while (!is_op("]")) {
    if (!l->items.empty()) expect_op(",");
    if (is_op("]")) break;
    l->items.push_back(parse_expression(true));
  }
  advance();
  return bounded(std::move(l));
}

ExprPtr Parser::parse_dict() {
  auto d = std::make_unique<DictExpr>(advance().pos);
  while (!is_op("}")) {
    if (!d->items.empty()) expect_op(",");
    if (is_op("}")) break;
    ExprPtr key = parse_expression(true);
    expect_op(":");
    d->items.emplace_back(std::move(key), parse_expression(true));
  }
  advance();
  return bounded(std::move(d));
}

ExprPtr Parser::parse_postfix(ExprPtr node) {
  while (true) {
    if (is_op(".")) {
      const size_t pos = advance().pos;
      if (cur().kind == TokenKind::kName) {
        node = bounded(std::make_unique<GetAttrExpr>(pos, std::move(node), advance().text));
      } else if (cur().kind == TokenKind::kInt) {
        auto key = std::make_unique<LiteralExpr>(cur().pos, Value(advance().int_value));
        node = bounded(std::make_unique<GetItemExpr>(pos, std::move(node), std::move(key)));
      } else {
        unexpected("a name or number after '.'");
      }
    } else if (is_op("[")) {
      node = parse_subscript(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr object) {
  const size_t pos = advance().pos;  // '['
  ExprPtr first;
  if (!is_op(":")) {
    first = parse_expression(true);
    if (is_op("]")) {
      advance();
      return bounded(std::make_unique<GetItemExpr>(pos, std::move(object), std::move(first)));
    }
    if (is_op(",")) {  // x[a, b]: a tuple key
      auto t = std::make_unique<ListExpr>(ExprKind::kTuple, first->pos);
      t->items.push_back(std::move(first));
      while (skip_op(",")) {
        if (is_op("]")) break;
        t->items.push_back(parse_expression(true));
      }
      expect_op("]");
      return bounded(std::make_unique<GetItemExpr>(pos, std::move(object), bounded(std::move(t))));
    }
  }
  auto s = std::make_unique<SliceExpr>(pos, std::move(object));
  s->start = std::move(first);
  expect_op(":");
  if (!is_op("]") && !is_op(":")) s->stop = parse_expression(true);
  if (skip_op(":") && !is_op("]")) s->step = parse_expression(true);
  expect_op("]");
  return bounded(std::move(s));
}

ArgList Parser::parse_args() {
  ArgList a;
  expect_op("(");
  bool need_comma = false;
  while (!is_op(")")) {
    if (need_comma) {
      expect_op(",");
      if (is_op(")")) break;
    }
    if (skip_op("*")) {
      a.star_args = parse_expression(true);
    } else if (skip_op("**")) {
      a.star_kwargs = parse_expression(true);
    } else if (cur().kind == TokenKind::kName && peek().kind == TokenKind::kOperator && peek().text == "=") {
      std::string key = advance().text;
      advance();
      a.kwargs.emplace_back(std::move(key), parse_expression(true));
    } else {
      if (!a.kwargs.empty() || a.star_args || a.star_kwargs) {
        syntax_error(cur().pos, "positional argument follows keyword argument");
      }
      a.args.push_back(parse_expression(true));
    }
    need_comma = true;
  }
  advance();
  return a;
}

ExprPtr Parser::parse_call(ExprPtr callee) {
  const size_t pos = callee->pos;
  auto c = std::make_unique<CallExpr>(pos, std::move(callee));
  c->args = parse_args();
  return bounded(std::move(c));
}

std::string Parser::parse_dotted_name() {
  std::string name = expect_identifier();
  while (skip_op(".")) {
    name += '.';
    name += expect_identifier();
  }
  return name;
}

// `| f(args) | g ...`; with `start_inline` the first filter has no leading '|'.
ExprPtr Parser::parse_filters(ExprPtr node, bool start_inline) {
  while (is_op("|") || start_inline) {
    if (!start_inline) advance();
    start_inline = false;
    const size_t pos = cur().pos;
    std::string name = parse_dotted_name();
    if (!is_filter(name)) syntax_error(pos, "no filter named '{}'", name);
    auto f = std::make_unique<FilterExpr>(pos, std::move(node), std::move(name));
    if (is_op("(")) f->args = parse_args();
    node = bounded(std::move(f));
  }
  return node;
}

ExprPtr Parser::parse_filter_expr(ExprPtr node) {
  while (true) {
    if (is_op("|")) {
      node = parse_filters(std::move(node), false);
    } else if (is_name("is")) {
      node = parse_test(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_test(ExprPtr node) {
  const size_t pos = advance().pos;  // 'is'
  const bool negated = skip_name("not");
  const size_t name_pos = cur().pos;
  std::string name = parse_dotted_name();
  if (!is_test(name)) syntax_error(name_pos, "no test named '{}'", name);
  auto t = std::make_unique<TestExpr>(pos, std::move(node), std::move(name), negated);
  if (is_op("(")) {
    t->args = parse_args();
  } else if ((cur().kind == TokenKind::kName || cur().kind == TokenKind::kString || cur().kind == TokenKind::kInt ||
              cur().kind == TokenKind::kFloat || is_op("[") || is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) syntax_error(cur().pos, "you cannot chain multiple tests with 'is'");
    t->args.args.push_back(parse_postfix(parse_primary()));
  }
  return bounded(std::move(t));
}

}  // namespace duet::jinja
