// The model the request targets parse bodies for: the tiny vocabulary of fuzz_common.h, the
// DeepSeek-V3 chat template and tool-call format (with `dsml`, DeepSeek-V3.2's encoding and DSML),
// a grammar cache for structured output, a context of 512 tokens and at most 16 prompts a request.
#pragma once

#include "duet/server/openai.h"

namespace duet::fuzz {

const server::ServedModel& served_model(bool dsml = false);

}  // namespace duet::fuzz
