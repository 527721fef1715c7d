#include "duet/backend/backend.h"

#include "duet/core/error.h"

namespace duet {

size_t kv_dtype_size(KvDtype dtype) { return dtype == KvDtype::kF16 ? 2 : 4; }

std::string_view kv_dtype_name(KvDtype dtype) { return dtype == KvDtype::kF16 ? "f16" : "f32"; }

KvDtype parse_kv_dtype(std::string_view name) {
  if (name == "f16") return KvDtype::kF16;
  if (name == "f32") return KvDtype::kF32;
  fail(ErrorCode::kInvalidArgument, "KV cache type is '{}', expected f16 or f32", name);
}

}  // namespace duet
