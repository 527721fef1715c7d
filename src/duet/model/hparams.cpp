#include "duet/model/hparams.h"

#include "duet/core/error.h"

namespace duet {

int64_t HParams::positive(const std::string& suffix) const {
  const int64_t v = file_.get_int(key(suffix));
  if (v <= 0) fail(ErrorCode::kInvalidArgument, "'{}': {} is {}, expected a positive number", file_.path(), key(suffix), v);
  return v;
}

}  // namespace duet
