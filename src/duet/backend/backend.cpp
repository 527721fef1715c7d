#include "duet/backend/backend.h"

#include "duet/core/error.h"

namespace duet {

size_t kv_row_bytes(KvDtype dtype, int64_t dim) {
  switch (dtype) {
    case KvDtype::kF32: return static_cast<size_t>(dim) * 4;
    case KvDtype::kF16: return static_cast<size_t>(dim) * 2;
    case KvDtype::kQ8_0:
      if (dim % 32 != 0) {
        fail(ErrorCode::kInvalidArgument, "a q8_0 KV cache holds rows of whole 32-value blocks, not {} values", dim);
      }
      return row_size(DType::kQ8_0, dim);
  }
  return 0;
}

std::string_view kv_dtype_name(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32: return "f32";
    case KvDtype::kF16: return "f16";
    case KvDtype::kQ8_0: return "q8_0";
  }
  return "?";
}

KvDtype parse_kv_dtype(std::string_view name) {
  if (name == "f16") return KvDtype::kF16;
  if (name == "f32") return KvDtype::kF32;
  if (name == "q8_0") return KvDtype::kQ8_0;
  fail(ErrorCode::kInvalidArgument, "KV cache type is '{}', expected f16, q8_0 or f32", name);
}

}  // namespace duet
