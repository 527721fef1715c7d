// A small byte-level BPE trainer for the synthetic models that `duet make-model` writes: the
// vocabulary comes from text the project wrote itself (builtin_corpus()), never third-party data.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "duet/formats/gguf.h"

namespace duet {

struct TrainedVocab {
  std::vector<std::string> tokens;   // byte-level text (GPT-2 byte-to-unicode form)
  std::vector<int32_t> token_types;  // TokenType values
  std::vector<std::string> merges;   // "left right", rank = index
  int32_t bos_id = -1;
  int32_t eos_id = -1;
};

// Byte-level BPE: the 256 byte tokens (token id = byte value), then merges learned from `corpus`
// pre-tokenized with `pre` (a tokenizer.ggml.pre name such as "deepseek-coder"), most frequent
// pair first (ties: the pair with the smaller left id, then the smaller right id), until the
// vocabulary holds vocab_size - 2 tokens or no pair occurs twice. Then the specials
// "<｜begin▁of▁sentence｜>" (bos) and "<｜end▁of▁sentence｜>" (eos), control tokens, and unused
// "<|reserved_N|>" placeholders up to exactly vocab_size entries. Deterministic.
// Throws kInvalidArgument when vocab_size < 258, kUnsupported for an unknown `pre`.
TrainedVocab train_bpe(std::string_view corpus, int32_t vocab_size, std::string_view pre);

// The tokenizer.ggml.* metadata of a trained vocabulary ("gpt2" model, add_bos_token true).
std::vector<std::pair<std::string, GgufValue>> tokenizer_metadata(const TrainedVocab& vocab, std::string_view pre);

// A few tens of KB of text written for this project: English prose about computing, C++ and
// Python-like code, numbers, punctuation and a little non-ASCII text.
std::string_view builtin_corpus();

}  // namespace duet
