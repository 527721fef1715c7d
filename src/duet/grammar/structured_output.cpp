#include "duet/grammar/structured_output.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/core/ordered_json.h"
#include "duet/grammar/gbnf.h"
#include "duet/grammar/json_schema.h"
#include "duet/grammar/regex.h"

namespace duet::grammar {

Grammar compile_structured_output(const StructuredOutputSpec& spec) {
  switch (spec.kind) {
    case ConstraintKind::kJsonObject: return json_object_grammar();
    case ConstraintKind::kJsonSchema: {
      nlohmann::ordered_json schema;
      try {
        schema = parse_ordered_json(spec.text);
      } catch (const std::exception& e) {
        fail(ErrorCode::kInvalidArgument, "the JSON schema is not valid JSON: {}", e.what());
      }
      return json_schema_grammar(schema);
    }
    case ConstraintKind::kRegex: {
      GrammarBuilder b;
      const int32_t root = b.add("root", regex_expr(spec.text, RegexTarget::kText));
      return std::move(b).build(root);
    }
    case ConstraintKind::kChoice: {
      const nlohmann::json choices = nlohmann::json::parse(spec.text, nullptr, false);
      if (!choices.is_array() || choices.empty()) fail(ErrorCode::kInvalidArgument, "the choices must be a non-empty list of strings");
      std::vector<ExprPtr> alts;
      for (const auto& c : choices) {
        if (!c.is_string() || c.get<std::string>().empty()) {
          fail(ErrorCode::kInvalidArgument, "the choices must be non-empty strings");
        }
        alts.push_back(literal(c.get<std::string>()));
      }
      GrammarBuilder b;
      const int32_t root = b.add("root", alt(std::move(alts)));
      return std::move(b).build(root);
    }
    case ConstraintKind::kGrammar: return parse_gbnf(spec.text);
  }
  fail(ErrorCode::kInternal, "unknown constraint kind {}", static_cast<int>(spec.kind));
}

std::shared_ptr<const Grammar> GrammarCache::get_or_build(const std::string& key, const std::function<Grammar()>& build) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  auto grammar = std::make_shared<const Grammar>(build());  // outside the lock: compiling may take a while
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = index_.find(key);
  if (it != index_.end()) return it->second->second;
  lru_.emplace_front(key, grammar);
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return grammar;
}

std::shared_ptr<const Grammar> GrammarCache::get(const StructuredOutputSpec& spec) {
  return get_or_build(fmt::format("{}:{}", static_cast<int>(spec.kind), spec.text),
                      [&spec] { return compile_structured_output(spec); });
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lru_.size();
}

}  // namespace duet::grammar
