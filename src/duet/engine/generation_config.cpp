#include "duet/engine/generation_config.h"

#include <algorithm>
#include <string>

#include "duet/core/error.h"

namespace duet {

SamplingParams model_sampling_defaults(const GgufFile& file) {
  SamplingParams p;
  const std::string k = "duet.generation.";
  p.temperature = static_cast<float>(file.get_float_or(k + "temperature", p.temperature));
  p.top_p = static_cast<float>(file.get_float_or(k + "top_p", p.top_p));
  p.top_k = static_cast<int32_t>(file.get_int_or(k + "top_k", p.top_k));
  p.repetition_penalty = static_cast<float>(file.get_float_or(k + "repetition_penalty", p.repetition_penalty));
  if (std::optional<InvalidParam> bad = p.find_invalid()) {
    fail(ErrorCode::kInvalidArgument, "'{}': the model's generation config has {} (key {}{})", file.path(),
         bad->message, k, bad->param);
  }
  return p;
}

std::vector<int32_t> model_stop_ids(const GgufFile& file, const Tokenizer& tokenizer) {
  std::vector<int32_t> ids = tokenizer.stop_ids();
  if (!file.has("duet.generation.eos_token_ids")) return ids;
  for (int32_t id : file.get_int_array("duet.generation.eos_token_ids")) {
    if (id >= 0 && id < tokenizer.vocab_size() && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

}  // namespace duet
