// Speculative decoding: a cheap proposer drafts the next few tokens of a sequence, one forward
// pass computes the logits of all of them at once, and the engine keeps the drafts the model
// agrees with. Drafts are single tokens (not distributions), so verifying one is sampling the
// model's own token at its position, with the sequence's generator and every sampling option,
// and keeping the draft when they are equal; the first difference is kept in its place and ends
// the run, and when every draft matches, the last row adds one more token. The output is then
// the one decoding without drafts gives, token for token, greedy or seeded (each emitted token
// draws the generator once, as without drafts), only in fewer steps.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace duet {

enum class SpeculativeMethod {
  kNone,
  kNgram,  // prompt lookup: the tokens that followed the latest earlier occurrence of the suffix
  kMtp,    // DeepSeek-V3's multi-token-prediction layer
};

struct SpeculativeConfig {
  SpeculativeMethod method = SpeculativeMethod::kNone;
  int32_t num_speculative_tokens = 0;  // drafts per sequence and step at most
  int32_t prompt_lookup_min = 2;       // n-gram: the shortest suffix looked up
  int32_t prompt_lookup_max = 4;       // n-gram: the longest
};

// "none", "ngram", "mtp"; throws kInvalidArgument naming the choices otherwise.
SpeculativeMethod parse_speculative_method(std::string_view name);
std::string_view speculative_method_name(SpeculativeMethod method);
// Throws kInvalidArgument naming the setting when a method is chosen with a bad K or n-gram
// range. (Whether the model has an MTP layer is the engine's to check, once it is loaded.)
void validate_speculative_config(const SpeculativeConfig& config);

// N-gram (prompt lookup) drafting over `tokens` (prompt and output so far): for n from max_n down
// to min_n, the last n tokens are looked for earlier in `tokens`; at the latest earlier
// occurrence of the longest suffix found, up to `k` of the tokens that followed it are the
// drafts. Empty when no suffix recurs.
std::vector<int32_t> propose_ngram(std::span<const int32_t> tokens, int32_t k, int32_t min_n, int32_t max_n);

}  // namespace duet
