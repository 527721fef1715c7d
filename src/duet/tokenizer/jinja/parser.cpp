// The statement half of the parser: template data, {{ }}, and every {% %} tag.
#include "duet/tokenizer/jinja/parser.h"

#include "duet/tokenizer/jinja/parser_impl.h"

namespace duet::jinja {
namespace {

std::string quote_list(Tags tags) {
  std::string out;
  size_t i = 0;
  for (std::string_view t : tags) {
    if (i++) out += i == tags.size() ? " or " : ", ";
    out += fmt::format("'{}'", t);
  }
  return out;
}

}  // namespace

Body Parser::parse() {
  Body body = parse_body({}, 0, "");
  if (cur().kind != TokenKind::kEof) syntax_error(cur().pos, "encountered unknown tag '{}'", cur().text);
  return body;
}

// Statements until one of `end_tags` (left as the current token, after its '{%') or the end.
Body Parser::parse_body(Tags end_tags, size_t opener_pos, std::string_view opener) {
  Body body;
  while (true) {
    const Token& t = cur();
    switch (t.kind) {
      case TokenKind::kData:
        body.push_back(std::make_unique<TextStmt>(t.pos, t.text));
        advance();
        break;
      case TokenKind::kVarBegin: {
        advance();
        ExprPtr e = parse_tuple(true, {}, false);
        if (cur().kind != TokenKind::kVarEnd) unexpected("end of print statement '}}'");
        advance();
        body.push_back(std::make_unique<PrintStmt>(t.pos, std::move(e)));
        break;
      }
      case TokenKind::kBlockBegin: {
        const Token& name = peek();
        if (name.kind == TokenKind::kName &&
            std::find(end_tags.begin(), end_tags.end(), name.text) != end_tags.end()) {
          advance();
          return body;
        }
        advance();
        body.push_back(parse_statement(end_tags, opener));
        break;
      }
      case TokenKind::kEof:
        if (end_tags.size()) {
          syntax_error(opener_pos, "unexpected end of template: the '{}' block opened here is never closed (expected {})",
                       opener, quote_list(end_tags));
        }
        return body;
      default:
        syntax_error(t.pos, "unexpected {}", describe_token(t));
    }
  }
}

// The body of a block statement: `%}`, statements, then one of `end_tags` (consumed with its
// `%}` when it is the final tag). Returns which tag ended the body.
std::string Parser::block_body(Body& body, Tags end_tags, size_t opener_pos, std::string_view opener) {
  expect_block_end();
  body = parse_body(end_tags, opener_pos, opener);
  return advance().text;
}

StmtPtr Parser::parse_statement(Tags outer_end_tags, std::string_view outer) {
  const DepthGuard guard(depth_, cur().pos);
  const Token& t = cur();
  if (t.kind != TokenKind::kName) syntax_error(t.pos, "expected a tag name, got {}", describe_token(t));
  const std::string& tag = t.text;
  if (tag == "if") return parse_if();
  if (tag == "for") return parse_for();
  if (tag == "set") return parse_set();
  if (tag == "macro") return parse_macro();
  if (tag == "call") return parse_call_block();
  if (tag == "filter") return parse_filter_block();
  if (tag == "with") return parse_with();
  if (tag == "block") return parse_block();
  if (tag == "print") {
    advance();
    auto s = std::make_unique<PrintStmt>(t.pos, parse_tuple(true, {}, false));
    expect_block_end();
    return s;
  }
  if (tag == "generation") {  // Hugging Face's marker for assistant tokens: renders its body
    advance();
    auto s = std::make_unique<BodyStmt>(StmtKind::kBody, t.pos);
    block_body(s->body, {"endgeneration"}, t.pos, "generation");
    expect_block_end();
    return s;
  }
  if (tag == "break" || tag == "continue") {
    if (loop_depth_ == 0) syntax_error(t.pos, "'{}' outside of a loop", tag);
    advance();
    expect_block_end();
    return std::make_unique<BodyStmt>(tag == "break" ? StmtKind::kBreak : StmtKind::kContinue, t.pos);
  }
  if (tag == "extends" || tag == "include" || tag == "import" || tag == "from") {
    syntax_error(t.pos, "'{}' is not supported: templates are rendered on their own, without a loader", tag);
  }
  if (outer_end_tags.size()) {
    syntax_error(t.pos, "encountered unknown tag '{}'; the innermost open block is '{}', expecting {}", tag, outer,
                 quote_list(outer_end_tags));
  }
  syntax_error(t.pos, "encountered unknown tag '{}'", tag);
}

StmtPtr Parser::parse_if() {
  const size_t pos = advance().pos;
  auto s = std::make_unique<IfStmt>(pos);
  while (true) {
    ExprPtr cond = parse_tuple(false, {}, false);
    Body body;
    const std::string end = block_body(body, {"elif", "else", "endif"}, pos, "if");
    s->branches.emplace_back(std::move(cond), std::move(body));
    if (end == "elif") continue;
    if (end == "else") {
      block_body(s->else_body, {"endif"}, pos, "if");
    }
    break;
  }
  expect_block_end();
  return s;
}

// Names, optionally in parentheses, separated by commas.
Target Parser::parse_target(bool allow_namespace) {
  Target target;
  if (allow_namespace && cur().kind == TokenKind::kName && peek().kind == TokenKind::kOperator && peek().text == ".") {
    target.names.push_back(advance().text);
    advance();
    target.attribute = expect_identifier();
    return target;
  }
  const bool parens = skip_op("(");
  while (true) {
    if (cur().kind != TokenKind::kName) syntax_error(cur().pos, "can't assign to {}", describe_token(cur()));
    target.names.push_back(advance().text);
    if (!skip_op(",")) break;
    target.unpack = true;
    if (cur().kind != TokenKind::kName) break;  // trailing comma
  }
  if (parens) expect_op(")");
  for (const std::string& name : target.names) {
    if (name == "true" || name == "false" || name == "none" || name == "True" || name == "False" || name == "None") {
      syntax_error(cur().pos, "can't assign to the constant '{}'", name);
    }
  }
  return target;
}

StmtPtr Parser::parse_for() {
  const size_t pos = advance().pos;
  auto s = std::make_unique<ForStmt>(pos);
  s->target = parse_target(false);
  expect_name("in");
  s->iterable = parse_tuple(false, {"recursive", "if"}, false);
  if (skip_name("if")) s->filter = parse_expression(true);
  if (is_name("recursive")) syntax_error(cur().pos, "recursive loops are not supported");
  ++loop_depth_;
  const std::string end = block_body(s->body, {"endfor", "else"}, pos, "for");
  --loop_depth_;
  if (end == "else") block_body(s->else_body, {"endfor"}, pos, "for");
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_set() {
  const size_t pos = advance().pos;
  Target target = parse_target(true);
  if (skip_op("=")) {
    auto s = std::make_unique<SetStmt>(pos);
    s->target = std::move(target);
    s->value = parse_tuple(true, {}, false);
    expect_block_end();
    return s;
  }
  auto s = std::make_unique<SetBlockStmt>(pos);
  s->target = std::move(target);
  if (is_op("|")) s->filter = parse_filters(nullptr, false);
  block_body(s->body, {"endset"}, pos, "set");
  expect_block_end();
  return s;
}

std::vector<MacroParam> Parser::parse_params() {
  std::vector<MacroParam> params;
  expect_op("(");
  while (!is_op(")")) {
    if (!params.empty()) expect_op(",");
    if (is_op(")")) break;
    MacroParam p;
    p.name = expect_identifier();
    if (skip_op("=")) {
      p.default_value = parse_expression(true);
    } else if (!params.empty() && params.back().default_value) {
      syntax_error(cur().pos, "non-default argument '{}' follows default argument", p.name);
    }
    params.push_back(std::move(p));
  }
  advance();
  return params;
}

StmtPtr Parser::parse_macro() {
  const size_t pos = advance().pos;
  auto s = std::make_unique<MacroStmt>(pos);
  s->name = expect_identifier();
  s->params = parse_params();
  const int saved_depth = loop_depth_;
  loop_depth_ = 0;
  block_body(s->body, {"endmacro"}, pos, "macro");
  loop_depth_ = saved_depth;
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_call_block() {
  const size_t pos = advance().pos;
  auto s = std::make_unique<CallBlockStmt>(pos);
  if (is_op("(")) s->caller_params = parse_params();
  s->call = parse_expression(true);
  if (s->call->kind != ExprKind::kCall) syntax_error(s->call->pos, "expected a call after 'call'");
  const int saved_depth = loop_depth_;
  loop_depth_ = 0;
  block_body(s->body, {"endcall"}, pos, "call");
  loop_depth_ = saved_depth;
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_filter_block() {
  const size_t pos = advance().pos;
  auto s = std::make_unique<FilterBlockStmt>(pos);
  s->filter = parse_filters(nullptr, true);
  block_body(s->body, {"endfilter"}, pos, "filter");
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_with() {
  const size_t pos = advance().pos;
  auto s = std::make_unique<WithStmt>(pos);
  while (cur().kind != TokenKind::kBlockEnd) {
    if (!s->assignments.empty()) expect_op(",");
    Target target = parse_target(false);
    expect_op("=");
    s->assignments.emplace_back(std::move(target), parse_expression(true));
  }
  block_body(s->body, {"endwith"}, pos, "with");
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_block() {
  const size_t pos = advance().pos;
  const std::string name = expect_identifier();
  skip_name("scoped");
  skip_name("required");
  auto s = std::make_unique<WithStmt>(pos);
  block_body(s->body, {"endblock"}, pos, "block");
  skip_name(name);
  expect_block_end();
  return s;
}

Body parse_template(const std::vector<Token>& tokens) { return Parser(tokens).parse(); }

}  // namespace duet::jinja
