// A Hugging Face folder's tokenizer files translated to the GGUF keys Tokenizer::from_gguf and
// ChatTemplate read (tokenizer.ggml.*, tokenizer.chat_template), the way llama.cpp's converter
// writes them:
//   tokenizer.json, model BPE without byte_fallback -> "gpt2" (byte-level BPE): vocabulary,
//     merges ("a b" strings or [a, b] pairs), added tokens (special -> control, others
//     user-defined), and the pre-tokenizer: its Sequence of Split regexes, Digits and ByteLevel
//     steps must be exactly one of duet's named pre-tokenizers (deepseek-llm, deepseek-coder,
//     deepseek-v3, qwen2, llama3, gpt2), otherwise kUnsupported shows the patterns;
//   model BPE with byte_fallback -> "llama" (SentencePiece-style BPE): scores from the merge
//     ranks (a token made by merge r scores -(r + 1), others 0), <0xHH> tokens as bytes, the
//     space prefix from the normalizer (Prepend "▁") or a Metaspace pre-tokenizer;
//   tokenizer_config.json: bos/eos/unk/pad tokens (strings or AddedToken objects), add_bos_token,
//     add_eos_token, chat_template (a string or a list of named templates; chat_template.jinja
//     beside it wins); config.json's bos/eos_token_id when the tokenizer files name none;
//   the vocabulary is padded with unused "[PAD<id>]" tokens up to config.json's vocab_size.
// Normalizers: none or NFC for byte-level BPE (NFC is not applied, as with GGUF files of the same
// models); anything else is refused.
#pragma once

#include <string>

#include "duet/formats/hf_config.h"

namespace duet {

// The tokenizer keys of the folder `dir`; empty when it has no tokenizer.json. Throws Error
// (kDataLoss for a file that does not parse, kInvalidArgument for inconsistent contents,
// kUnsupported for a tokenizer duet does not implement), naming the file.
GgufMetadata hf_tokenizer_metadata(const std::string& dir);

}  // namespace duet
