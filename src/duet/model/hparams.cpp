#include "duet/model/hparams.h"

#include "duet/core/error.h"

namespace duet {

int64_t HParams::positive(const std::string& suffix) const {
  const int64_t v = file_.get_int(key(suffix));
  if (v <= 0) fail(ErrorCode::kInvalidArgument, "'{}': {} is {}, expected a positive number", file_.path(), key(suffix), v);
  return v;
}

int64_t HParams::layer_count(const std::string& suffix) const {
  const int64_t v = positive(suffix);
  const auto tensors = static_cast<int64_t>(file_.tensors().size());
  if (v > tensors) {
    fail(ErrorCode::kInvalidArgument, "'{}': {} is {}, but the file has {} tensors (each layer has its own)",
         file_.path(), key(suffix), v, tensors);
  }
  return v;
}

}  // namespace duet
