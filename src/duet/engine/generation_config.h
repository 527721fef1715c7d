// A model's own generation settings: what a Hugging Face folder's generation_config.json says,
// kept by hf_folder.h as duet.generation.* keys (GGUF files have none of them). As vLLM does,
// the server starts every request from the model's temperature, top_p, top_k and
// repetition_penalty (a request's own values win), and generation also stops at every
// eos_token_id the config lists, besides the tokenizer's end tokens. do_sample is kept but not
// applied (a request that wants greedy decoding asks for temperature 0).
#pragma once

#include <cstdint>
#include <vector>

#include "duet/engine/sampling_params.h"
#include "duet/formats/gguf.h"
#include "duet/tokenizer/tokenizer.h"

namespace duet {

// SamplingParams{} with the model's sampling values. Throws kInvalidArgument naming the key
// and the file when a value is out of range.
SamplingParams model_sampling_defaults(const GgufFile& file);

// The tokenizer's stop ids, then duet.generation.eos_token_ids that are in the vocabulary and
// not already there.
std::vector<int32_t> model_stop_ids(const GgufFile& file, const Tokenizer& tokenizer);

}  // namespace duet
