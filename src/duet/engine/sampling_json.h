// Sampling parameters from a JSON object, under vLLM's and OpenAI's names, for the prompts files
// of `duet generate` and the HTTP API. Unknown fields are ignored; a known field with a wrong
// type or value gets an Error naming it.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "duet/engine/sampling_params.h"

namespace duet {

// Fields: n, temperature, top_p, top_k, min_p, repetition_penalty, presence_penalty,
// frequency_penalty, logit_bias ({"id": bias}), allowed_token_ids, cache_salt, seed, stop (string
// or list), stop_token_ids,
// include_stop_str_in_output, ignore_eos, min_tokens, max_tokens (or max_completion_tokens),
// logprobs (a count, or true with top_logprobs), use_beam_search, length_penalty,
// skip_special_tokens. Starts from `defaults`. Throws kInvalidArgument; the message starts with
// the field name.
SamplingParams sampling_params_from_json(const nlohmann::json& body, SamplingParams defaults = {});

// The name of the field an error from sampling_params_from_json or SamplingParams::validate is
// about (its first word), or "" when it names none.
std::string error_param(const std::string& message);

}  // namespace duet
