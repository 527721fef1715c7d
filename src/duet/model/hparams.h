// Reads an architecture's hyper-parameters from GGUF keys prefixed with its name
// ("llama.block_count"), with errors that name the key.
#pragma once

#include <string>

#include "duet/formats/gguf.h"

namespace duet {

class HParams {
 public:
  HParams(const GgufFile& file, std::string arch) : file_(file), arch_(std::move(arch)) {}

  std::string key(const std::string& suffix) const { return arch_ + "." + suffix; }
  bool has(const std::string& suffix) const { return file_.has(key(suffix)); }
  // A required positive integer.
  int64_t positive(const std::string& suffix) const;
  // A required layer count: positive, and at most the file's number of tensors (every layer has
  // tensors of its own), so that a corrupt count is refused here rather than allocated for.
  int64_t layer_count(const std::string& suffix) const;
  int64_t int_or(const std::string& suffix, int64_t fallback) const { return file_.get_int_or(key(suffix), fallback); }
  double float_or(const std::string& suffix, double fallback) const {
    return file_.get_float_or(key(suffix), fallback);
  }
  std::string string_or(const std::string& suffix, std::string fallback) const {
    return file_.get_string_or(key(suffix), std::move(fallback));
  }

 private:
  const GgufFile& file_;
  std::string arch_;
};

}  // namespace duet
