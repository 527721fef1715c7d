// Helpers shared by the libFuzzer targets: a scratch folder per process for the readers that take
// a path, and the tiny vocabulary the request and tokenizer targets need, built once in memory
// from the project's own corpus.
//
// A target calls the code under test and catches only the errors that code promises for bad
// input (duet::Error, and server::ApiError for the request parser). Any other exception escapes
// and libFuzzer reports it, as it reports every crash, sanitizer finding, leak and timeout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "duet/formats/gguf.h"
#include "duet/tokenizer/tokenizer.h"

namespace duet::fuzz {

// A folder of this process's own under $TMPDIR (or /dev/shm), removed at exit.
const std::string& scratch_dir();
// Writes `data` to scratch_dir()/name and returns the path.
std::string write_scratch(const std::string& name, std::string_view data);
inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A byte-level BPE vocabulary of 320 tokens learned from the built-in corpus (pre-tokenizer
// deepseek-llm), as a GGUF file assembled in memory, and its Tokenizer.
const GgufFile& tiny_vocab_file();
const Tokenizer& tiny_tokenizer();

}  // namespace duet::fuzz
