// Tensor-parallel shards of weight matrices: a range of rows is a view into the same memory (the
// mapped file, so a rank reads only its rows); a range of columns is copied once into memory of
// its own (whole blocks of the matrix's type).
#pragma once

#include <cstdint>
#include <deque>

#include "duet/backend/backend.h"
#include "duet/core/memory.h"

namespace duet {

class WeightShards {
 public:
  // Rows [first, first + count) as a matrix of its own; a view without data stays one.
  static WeightView rows(const WeightView& w, int64_t first, int64_t count);
  // Elements [first, first + count) of a 1 x n f32 vector.
  static WeightView elements(const WeightView& v, int64_t first, int64_t count);
  // Columns [first, first + count) of every row, copied here. Throws kInvalidArgument naming the
  // tensor when the range does not fall on whole blocks of its type.
  WeightView columns(const WeightView& w, int64_t first, int64_t count);

 private:
  std::deque<AnonymousMemory> copies_;
};

}  // namespace duet
