// tokenizer_config.json of a Hugging Face folder (beside a valid tokenizer.json): special tokens,
// flags and the chat template, which is then rendered.
#include "fuzz_hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  duet::fuzz::run_hf_tokenizer("tokenizer_config.json", data, size);
  return 0;
}
