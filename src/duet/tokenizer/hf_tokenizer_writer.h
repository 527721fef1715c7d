// A GGUF file's byte-level BPE tokenizer (tokenizer.ggml.model "gpt2") written as Hugging Face's
// tokenizer.json and tokenizer_config.json, the inverse of hf_tokenizer.h: the vocabulary (without
// unused padding tokens, which the reader restores from config.json's vocab_size) and merges, control tokens as special added tokens and user-defined ones as plain added tokens, the
// pre-tokenizer as a Sequence of the named pre-tokenizer's Split regexes and a ByteLevel step
// without its own regex (so hf_tokenizer recognises the same name), the ByteLevel decoder;
// tokenizer_config.json with bos/eos tokens, add_bos_token / add_eos_token and the chat template
// (the file's own, else the built-in one duet would use for it).
#pragma once

#include <string>
#include <vector>

#include "duet/formats/gguf.h"

namespace duet {

// Writes both files into `dir` and returns their names. Throws kUnsupported for another tokenizer
// model (SentencePiece-style BPE is not written) or an unknown pre-tokenizer.
std::vector<std::string> write_hf_tokenizer(const GgufFile& gguf, const std::string& dir);

}  // namespace duet
