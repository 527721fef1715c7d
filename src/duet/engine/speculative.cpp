#include "duet/engine/speculative.h"

#include <algorithm>

#include "duet/core/error.h"

namespace duet {

SpeculativeMethod parse_speculative_method(std::string_view name) {
  if (name == "none" || name.empty()) return SpeculativeMethod::kNone;
  if (name == "ngram") return SpeculativeMethod::kNgram;
  if (name == "mtp") return SpeculativeMethod::kMtp;
  fail(ErrorCode::kInvalidArgument, "speculative method is '{}', expected ngram, mtp or none", name);
}

std::string_view speculative_method_name(SpeculativeMethod method) {
  switch (method) {
    case SpeculativeMethod::kNone: return "none";
    case SpeculativeMethod::kNgram: return "ngram";
    case SpeculativeMethod::kMtp: return "mtp";
  }
  return "unknown";
}

void validate_speculative_config(const SpeculativeConfig& c) {
  if (c.method == SpeculativeMethod::kNone) return;
  if (c.num_speculative_tokens < 1 || c.num_speculative_tokens > 16) {
    fail(ErrorCode::kInvalidArgument, "num_speculative_tokens is {}, expected 1 to 16 with speculative method {}",
         c.num_speculative_tokens, speculative_method_name(c.method));
  }
  if (c.prompt_lookup_min < 1 || c.prompt_lookup_max < c.prompt_lookup_min) {
    fail(ErrorCode::kInvalidArgument, "prompt_lookup_min is {} and prompt_lookup_max {}, expected 1 <= min <= max",
         c.prompt_lookup_min, c.prompt_lookup_max);
  }
}

std::vector<int32_t> propose_ngram(std::span<const int32_t> tokens, int32_t k, int32_t min_n, int32_t max_n) {
  const auto len = static_cast<int64_t>(tokens.size());
  if (k <= 0 || min_n < 1) return {};
  for (int64_t n = std::min<int64_t>(max_n, len - 1); n >= min_n; --n) {
    const std::span<const int32_t> suffix = tokens.subspan(static_cast<size_t>(len - n));
    // The latest earlier occurrence: starts from len - n - 1 down to 0.
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const int64_t from = start + n;
      const int64_t count = std::min<int64_t>(k, len - from);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + count);
    }
  }
  return {};
}

}  // namespace duet
