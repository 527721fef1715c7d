// Binds a model's tensors by name with their expected shapes, collecting every problem before
// it reports, so one error lists all missing or mismatched tensors of a file.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "duet/backend/backend.h"
#include "duet/formats/gguf.h"

namespace duet {

// A vector's floats (a 1 x n f32 view bound by WeightBinder::vector), in its device's memory.
inline const float* f32(const WeightView& v) { return static_cast<const float*>(v.data); }

class WeightBinder {
 public:
  explicit WeightBinder(const GgufFile& file) : file_(file) {}

  bool has(const std::string& name) const { return file_.find_tensor(name) != nullptr; }
  // A matrix of `rows` rows of `cols` elements (GGUF shape [cols, rows]).
  WeightView matrix(const std::string& name, int64_t rows, int64_t cols);
  // A vector of n floats, as a 1 x n f32 view (converted and kept here when stored in another
  // type).
  WeightView vector(const std::string& name, int64_t n);
  // Experts stacked in one tensor (GGUF shape [cols, rows, num_experts]): one view whose rows are
  // every expert's rows in turn; expert e's matrix starts at row e * rows.
  WeightView experts(const std::string& name, int64_t num_experts, int64_t rows, int64_t cols);
  // Throws kInvalidArgument listing every problem found so far; does nothing if there was none.
  void finish() const;

 private:
  const GgufTensorInfo* lookup(const std::string& name, const std::vector<int64_t>& shape, const std::string& what);

  const GgufFile& file_;
  std::vector<std::string> problems_;
  std::deque<std::vector<float>> converted_;
};

}  // namespace duet
