#include "duet/model/shard.h"

#include <cstring>

#include "duet/core/error.h"

namespace duet {

WeightView WeightShards::rows(const WeightView& w, int64_t first, int64_t count) {
  if (w.data == nullptr) return w;
  if (first < 0 || count < 0 || first + count > w.rows) {
    fail(ErrorCode::kInternal, "rows [{}, {}) of '{}', which has {}", first, first + count, w.name, w.rows);
  }
  return w.rows_from(first, count);
}

WeightView WeightShards::elements(const WeightView& v, int64_t first, int64_t count) {
  if (v.data == nullptr) return v;
  if (first < 0 || count < 0 || first + count > v.cols) {
    fail(ErrorCode::kInternal, "elements [{}, {}) of '{}', which has {}", first, first + count, v.name, v.cols);
  }
  return WeightView{v.name, v.type, v.rows, count, static_cast<const float*>(v.data) + first};
}

WeightView WeightShards::columns(const WeightView& w, int64_t first, int64_t count) {
  if (w.data == nullptr) return w;
  const int64_t block = traits(w.type).block_size;
  if (first % block != 0 || count % block != 0 || first + count > w.cols) {
    fail(ErrorCode::kInvalidArgument,
         "tensor parallelism needs columns [{}, {}) of '{}' ({} columns of {}), which do not fall on its blocks of {}: "
         "use fewer ranks or another weight type",
         first, first + count, w.name, w.cols, dtype_name(w.type), block);
  }
  const size_t row_bytes = row_size(w.type, count);
  const size_t offset = row_size(w.type, first);
  AnonymousMemory& mem = copies_.emplace_back(row_bytes * static_cast<size_t>(w.rows));
  auto* dst = static_cast<uint8_t*>(mem.data());
  for (int64_t r = 0; r < w.rows; ++r) std::memcpy(dst + static_cast<size_t>(r) * row_bytes, w.row(r) + offset, row_bytes);
  return WeightView{w.name, w.type, w.rows, count, dst};
}

}  // namespace duet
