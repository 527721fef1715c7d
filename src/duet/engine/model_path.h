// Opening what a user names as a model: a GGUF file, or a Hugging Face folder (config.json,
// safetensors shards, tokenizer files) read as an in-memory GgufFile, so that everything
// downstream (the models' WeightBinder and HParams, Tokenizer::from_gguf, ChatTemplate) reads one
// thing. It lives here because a folder needs both formats/ (config, weights) and tokenizer/ (the
// pre-tokenizer names).
#pragma once

#include <string>

#include "duet/formats/gguf.h"
#include "duet/formats/hf_folder.h"

namespace duet {

// A directory with a config.json is read as a Hugging Face folder (hf_folder.h, hf_tokenizer.h),
// anything else as a GGUF file. Throws Error naming the path. `copies`: what becomes of a
// folder's converted weights once packed (hf_folder.h); kDiscardable for a caller that only runs
// the model it loads from the file. `with_mtp`: a folder's multi-token-prediction layers are read
// too (for --speculative-method mtp; otherwise they are skipped, see open_hf_folder).
GgufFile open_model_path(const std::string& path, ConvertedCopies copies = ConvertedCopies::kKeep,
                         bool with_mtp = false);

}  // namespace duet
