// The reference of a mixture-of-experts router (see MoeRouting in backend.h): plain host code over
// host arrays, in double, as Hugging Face's MoEGate computes it. Backends run it (the CPU) or test
// against it (other devices).
#pragma once

#include <cstdint>

#include "duet/backend/backend.h"

namespace duet {

// ids and weights: [n, r.num_used]. Throws kInvalidArgument when the routing is inconsistent.
void moe_route_ref(const float* logits, int64_t n, const MoeRouting& r, int32_t* ids, float* weights);

}  // namespace duet
