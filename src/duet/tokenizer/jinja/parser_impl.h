// The parser's state and grammar, shared by parser.cpp (statements) and
// parse_expression.cpp (expressions). Internal to the jinja folder.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "duet/tokenizer/jinja/ast.h"
#include "duet/tokenizer/jinja/error.h"
#include "duet/tokenizer/jinja/lexer.h"

namespace duet::jinja {

using Tags = std::initializer_list<std::string_view>;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  Body parse();

 private:
  const Token& cur() const { return tokens_[i_]; }
  const Token& peek(size_t n = 1) const { return tokens_[std::min(i_ + n, tokens_.size() - 1)]; }
  const Token& advance() {
    const Token& t = tokens_[i_];
    if (i_ + 1 < tokens_.size()) ++i_;
    return t;
  }
  bool is_op(std::string_view op) const { return cur().kind == TokenKind::kOperator && cur().text == op; }
  bool is_name(std::string_view name) const { return cur().kind == TokenKind::kName && cur().text == name; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    advance();
    return true;
  }
  [[noreturn]] void unexpected(std::string_view expected) const {
    syntax_error(cur().pos, "expected {}, got {}", expected, describe_token(cur()));
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) unexpected(fmt::format("'{}'", op));
  }
  void expect_name(std::string_view name) {
    if (!skip_name(name)) unexpected(fmt::format("'{}'", name));
  }
  std::string expect_identifier() {
    if (cur().kind != TokenKind::kName) unexpected("a name");
    return advance().text;
  }
  void expect_block_end() {
    if (cur().kind != TokenKind::kBlockEnd) unexpected("end of statement block '%}'");
    advance();
  }

  // Guards the recursion of the parser (and so of the evaluator, which walks the same depth)
  // against templates nested deeply enough to overflow the stack.
  class DepthGuard {
   public:
    DepthGuard(int& depth, size_t pos) : depth_(depth) {
      if (++depth_ > kMaxNesting) syntax_error(pos, "the template is nested more than {} levels deep", kMaxNesting);
    }
    ~DepthGuard() { --depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    int& depth_;
  };
  static constexpr int kMaxNesting = 200;

  // Sets node->height from its children's and refuses a tree taller than kMaxHeight. A chain
  // written without nesting (a ~ b ~ c ..., x|f|g ..., x.a.b ..., a if b else c if d ...) makes a
  // tree as tall as it is long, and the evaluator walks it (and the destructor frees it) by
  // recursion: 100,000 links overflowed the stack.
  ExprPtr bounded(ExprPtr node);
  static constexpr int kMaxHeight = 500;

  // Statements (parser.cpp).
  // Statements until one of `end_tags` (left as the current token, after its '{%') or the end.
  Body parse_body(Tags end_tags, size_t opener_pos, std::string_view opener);
  // The body of a block statement: `%}`, statements, then one of `end_tags` (consumed with its
  // `%}` when it is the final tag). Returns which tag ended the body.
  std::string block_body(Body& body, Tags end_tags, size_t opener_pos, std::string_view opener);
  StmtPtr parse_statement(Tags outer_end_tags, std::string_view outer);
  StmtPtr parse_if();
  // Names, optionally in parentheses, separated by commas.
  Target parse_target(bool allow_namespace);
  StmtPtr parse_for();
  StmtPtr parse_set();
  std::vector<MacroParam> parse_params();
  StmtPtr parse_macro();
  StmtPtr parse_call_block();
  StmtPtr parse_filter_block();
  StmtPtr parse_with();
  StmtPtr parse_block();

  // Expressions (parse_expression.cpp).
  bool is_tuple_end(Tags extra_end) const;
  // Expressions separated by commas form a tuple.
  ExprPtr parse_tuple(bool with_condition, Tags extra_end, bool explicit_parens);
  ExprPtr parse_expression(bool with_condition);
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_add();
  ExprPtr parse_concat();
  ExprPtr parse_mul();
  ExprPtr parse_pow();
  // As in Jinja2, a filter after a unary minus applies to the negated value: -x|abs is abs(-x).
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_list();
  ExprPtr parse_dict();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr object);
  ArgList parse_args();
  ExprPtr parse_call(ExprPtr callee);
  std::string parse_dotted_name();
  // `| f(args) | g ...`; with `start_inline` the first filter has no leading '|'.
  ExprPtr parse_filters(ExprPtr node, bool start_inline);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_test(ExprPtr node);

  const std::vector<Token>& tokens_;
  size_t i_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
};

}  // namespace duet::jinja
