#include "duet/core/error.h"

namespace duet {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kNotFound: return "not_found";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kResourceExhausted: return "resource_exhausted";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kDataLoss: return "data_loss";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

}  // namespace duet
