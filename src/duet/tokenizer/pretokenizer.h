// Pre-tokenizers of byte-level BPE vocabularies, chosen by tokenizer.ggml.pre. Each one is a
// sequence of regular expressions applied one after another: every regex splits each piece left
// by the previous one into its matches and the text between them, keeping both (Hugging Face
// tokenizers' `Split` with behavior "Isolated"). Regexes run on PCRE2 (UTF + UCP, JIT-compiled
// when the platform allows, the interpreter otherwise).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace duet {

class PreTokenizer {
 public:
  // Compiles the pre-tokenizer called `name` ("deepseek-llm", "qwen2", ...). Throws Error
  // kUnsupported naming the value and the supported names.
  explicit PreTokenizer(std::string_view name);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Every accepted value of tokenizer.ggml.pre (aliases included).
  static const std::vector<std::string_view>& supported_names();
  static bool is_supported(std::string_view name);
  // The name of the pre-tokenizer that applies exactly these regexes in this order (each a
  // Hugging Face `Split` with behavior Isolated), or "" when none does. Patterns are compared in
  // one spelling: every character outside printable ASCII, and the escapes \r \n \t \f \v
  // \xHH \x{H...} \uHHHH, written as \x{HEX}, so a tokenizer.json that has the characters
  // themselves matches the definitions here.
  static std::string name_for_patterns(const std::vector<std::string>& patterns);
  // That spelling of one pattern.
  static std::string canonical_pattern(std::string_view pattern);
  // The regexes of the pre-tokenizer called `name`, in order (what a tokenizer.json spells as
  // Split steps). Throws kUnsupported for an unknown name.
  static std::vector<std::string> patterns_for(std::string_view name);

  const std::string& name() const { return name_; }
  // Whether a piece that is already a vocabulary entry skips BPE merging (Llama 3 does this).
  bool ignore_merges() const { return ignore_merges_; }
  // Whether every regex runs JIT-compiled.
  bool jit() const { return jit_; }

  // Appends the pieces of `text` to `out` as views into `text`; together they cover it exactly.
  // Bytes that are not valid UTF-8 become pieces of their own and never reach a regex. Safe to
  // call from several threads at once.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct Regex;

  std::string name_;
  bool ignore_merges_ = false;
  bool jit_ = true;
  std::vector<std::unique_ptr<Regex>> regexes_;
  unsigned max_ovector_pairs_ = 1;
};

}  // namespace duet
