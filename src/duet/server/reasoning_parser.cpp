#include "duet/server/reasoning_parser.h"

namespace duet::server {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

// Length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t partial_suffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

ReasoningParser::ReasoningParser(bool starts_in_reasoning)
    : state_(starts_in_reasoning ? State::kReasoning : State::kStart) {}

ReasoningParser::Delta ReasoningParser::push(std::string_view text) {
  Delta d;
  pending_ += text;
  for (;;) {
    if (state_ == State::kStart) {
      // Leading whitespace, then either <think> (reasoning follows) or anything else: in that
      // case the model answers without thinking and all of it is content.
      const size_t first = pending_.find_first_not_of(" \t\r\n");
      if (first == std::string::npos) return d;
      const std::string_view rest = std::string_view(pending_).substr(first);
      if (rest.size() < kOpen.size() && kOpen.substr(0, rest.size()) == rest) return d;  // undecided
      if (rest.substr(0, kOpen.size()) == kOpen) {
        pending_.erase(0, first + kOpen.size());
        state_ = State::kReasoning;
        continue;
      }
      state_ = State::kContent;
      continue;
    }
    if (state_ == State::kReasoning) {
      const size_t close = pending_.find(kClose);
      if (close != std::string::npos) {
        d.reasoning += pending_.substr(0, close);
        pending_.erase(0, close + kClose.size());
        state_ = State::kContent;
        continue;
      }
      const size_t keep = partial_suffix(pending_, kClose);
      d.reasoning += pending_.substr(0, pending_.size() - keep);
      pending_.erase(0, pending_.size() - keep);
      return d;
    }
    d.content += pending_;
    pending_.clear();
    return d;
  }
}

ReasoningParser::Delta ReasoningParser::flush() {
  Delta d;
  if (state_ == State::kReasoning) d.reasoning = pending_;
  else d.content = pending_;
  pending_.clear();
  return d;
}

}  // namespace duet::server
