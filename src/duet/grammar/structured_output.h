// What a request asks its output to be (OpenAI's response_format, vLLM's guided_* fields, a
// forced tool call), compiled to a grammar, with a cache so that the many requests that send the
// same schema share one grammar (and, in the engine, its automaton and token masks).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "duet/grammar/grammar.h"

namespace duet::grammar {

enum class ConstraintKind {
  kJsonObject,  // any JSON object
  kJsonSchema,  // text: the schema (JSON)
  kRegex,       // text: the regular expression
  kChoice,      // text: a JSON list of strings, one of which is the output
  kGrammar,     // text: GBNF
};

struct StructuredOutputSpec {
  ConstraintKind kind = ConstraintKind::kJsonObject;
  std::string text;
};

// Compiles a spec. Throws kInvalidArgument with what is wrong and where.
Grammar compile_structured_output(const StructuredOutputSpec& spec);

// Compiled grammars by spec, least recently used dropped past `capacity`. Thread-safe.
class GrammarCache {
 public:
  explicit GrammarCache(size_t capacity = 256) : capacity_(capacity) {}
  std::shared_ptr<const Grammar> get(const StructuredOutputSpec& spec);
  // Keeps a grammar built elsewhere (tool-call formats) under `key`, or returns the one there.
  std::shared_ptr<const Grammar> get_or_build(const std::string& key, const std::function<Grammar()>& build);
  size_t size() const;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const Grammar>>;
  mutable std::mutex mutex_;
  size_t capacity_;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

}  // namespace duet::grammar
