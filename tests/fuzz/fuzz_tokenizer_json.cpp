// tokenizer.json of a Hugging Face folder (beside a valid tokenizer_config.json).
#include "fuzz_hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  duet::fuzz::run_hf_tokenizer("tokenizer.json", data, size);
  return 0;
}
