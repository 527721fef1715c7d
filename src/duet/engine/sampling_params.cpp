#include "duet/engine/sampling_params.h"

#include <cmath>

#include <fmt/format.h>

#include "duet/core/error.h"

namespace duet {
namespace {

// Every check is written so that NaN fails it: `!(value in range)`.
template <typename... Args>
InvalidParam invalid(std::string param, fmt::format_string<Args...> format, Args&&... args) {
  return InvalidParam{std::move(param), fmt::format(format, std::forward<Args>(args)...)};
}

}  // namespace

std::optional<InvalidParam> SamplingParams::find_invalid(int32_t vocab_size, int32_t max_logprobs) const {
  const bool check_ids = vocab_size > 0;
  if (!(n >= 1)) return invalid("n", "n is {}, expected an integer >= 1", n);
  if (best_of != 0 && !(best_of >= n)) {
    return invalid("best_of", "best_of is {}, expected an integer >= n ({}): the candidates n are chosen from", best_of, n);
  }
  if (best_of > n && use_beam_search) {
    return invalid("best_of", "best_of cannot be combined with use_beam_search (n is the beam width)");
  }
  if (!(std::isfinite(temperature) && temperature >= 0.0f)) {
    return invalid("temperature", "temperature is {}, expected a finite number >= 0", temperature);
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return invalid("top_p", "top_p is {}, expected a number in (0, 1]", top_p);
  }
  if (!(top_k >= -1)) {
    return invalid("top_k", "top_k is {}, expected -1 or 0 (no limit) or a positive integer", top_k);
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return invalid("min_p", "min_p is {}, expected a number in [0, 1]", min_p);
  }
  if (!(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f)) {
    return invalid("repetition_penalty", "repetition_penalty is {}, expected a finite number > 0",
                   repetition_penalty);
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return invalid("presence_penalty", "presence_penalty is {}, expected a number in [-2, 2]", presence_penalty);
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return invalid("frequency_penalty", "frequency_penalty is {}, expected a number in [-2, 2]", frequency_penalty);
  }
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0 || (check_ids && id >= vocab_size)) {
      if (check_ids) {
        return invalid("logit_bias", "logit_bias has token id {}, expected an id in [0, {})", id, vocab_size);
      }
      return invalid("logit_bias", "logit_bias has token id {}, expected an id >= 0", id);
    }
    if (!(bias >= -kMaxLogitBias && bias <= kMaxLogitBias)) {
      return invalid("logit_bias", "logit_bias for token {} is {}, expected a number in [-{}, {}]", id, bias,
                     kMaxLogitBias, kMaxLogitBias);
    }
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty()) return invalid("stop", "stop[{}] is an empty string, expected a non-empty stop string", i);
  }
  // A list of token ids: the first outside the vocabulary.
  auto bad_id = [&](const char* name, const std::vector<int32_t>& ids) -> std::optional<InvalidParam> {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || (check_ids && ids[i] >= vocab_size)) {
        if (check_ids) return invalid(name, "{}[{}] is {}, expected an id in [0, {})", name, i, ids[i], vocab_size);
        return invalid(name, "{}[{}] is {}, expected an id >= 0", name, i, ids[i]);
      }
    }
    return std::nullopt;
  };
  if (auto bad = bad_id("stop_token_ids", stop_token_ids)) return bad;
  if (auto bad = bad_id("allowed_token_ids", allowed_token_ids)) return bad;
  for (size_t i = 0; i < bad_words_token_ids.size(); ++i) {
    for (int32_t id : bad_words_token_ids[i]) {
      if (id < 0 || (check_ids && id >= vocab_size)) {
        return invalid("bad_words", "bad_words[{}] has token id {}, outside the vocabulary", i, id);
      }
    }
  }
  if ((!allowed_token_ids.empty() || !bad_words_token_ids.empty()) && use_beam_search) {
    return invalid("use_beam_search", "use_beam_search cannot be combined with allowed_token_ids or bad_words");
  }
  if (!(max_tokens >= 1)) return invalid("max_tokens", "max_tokens is {}, expected an integer >= 1", max_tokens);
  if (!(min_tokens >= 0 && min_tokens <= max_tokens)) {
    return invalid("min_tokens", "min_tokens is {}, expected an integer in [0, max_tokens] = [0, {}]", min_tokens,
                   max_tokens);
  }
  // At most max_logprobs (the server's --max-logprobs); with -1 there, up to the vocabulary, and -1
  // for all of it.
  const bool whole = max_logprobs < 0;
  const int64_t most = !whole ? max_logprobs : vocab_size > 0 ? vocab_size : INT32_MAX;
  for (const auto& [name, v] : {std::pair{"logprobs", logprobs}, std::pair{"prompt_logprobs", prompt_logprobs}}) {
    if (!v || (*v >= 0 && *v <= most) || (whole && *v == -1)) continue;
    if (whole) return invalid(name, "{} is {}, expected -1 (the whole vocabulary) or an integer in [0, {}]", name, *v, most);
    if (max_logprobs == kMaxLogprobs) return invalid(name, "{} is {}, expected an integer in [0, {}]", name, *v, most);
    return invalid(name, "{} is {}, expected an integer in [0, {}] (the server's --max-logprobs)", name, *v, most);
  }
  if (prompt_logprobs && embedding) return invalid("prompt_logprobs", "prompt_logprobs is not for embeddings");
  if (!std::isfinite(length_penalty)) {
    return invalid("length_penalty", "length_penalty is {}, expected a finite number", length_penalty);
  }
  if (grammar && use_beam_search) {
    return invalid("use_beam_search", "use_beam_search cannot be combined with structured output (response_format, "
                   "guided_*, a forced tool call)");
  }
  if (embedding && (n != 1 || use_beam_search)) {
    return invalid("n", "an embedding request has one output (n 1, no beam search)");
  }
  return std::nullopt;
}

void SamplingParams::resolve_logprobs(int32_t vocab_size) {
  if (logprobs == -1) logprobs = vocab_size;
  if (prompt_logprobs == -1) prompt_logprobs = vocab_size;
}

void SamplingParams::validate(int32_t vocab_size, int32_t max_logprobs) const {
  if (std::optional<InvalidParam> bad = find_invalid(vocab_size, max_logprobs)) {
    fail(ErrorCode::kInvalidArgument, "{}", bad->message);
  }
}

}  // namespace duet
