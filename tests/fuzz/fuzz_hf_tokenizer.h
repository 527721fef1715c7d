// The two Hugging Face tokenizer targets share this: a folder holding a valid tokenizer.json and
// tokenizer_config.json (written once from the tiny vocabulary), one of which the input replaces;
// the folder is read as duet reads a model folder's tokenizer, and what it accepts is built into
// a Tokenizer that encodes and decodes, and its chat template (if any) renders a conversation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace duet::fuzz {

void run_hf_tokenizer(const std::string& file_name, const uint8_t* data, size_t size);

}  // namespace duet::fuzz
