// The OpenAI request parser: a body of /v1/chat/completions (first input byte odd) or
// /v1/completions (even) parsed and validated against a served model with the DeepSeek-V3 chat
// template, tool calls and structured output, as the server does before anything reaches the
// engine. Bad bodies must be ApiErrors (a 4xx naming the parameter) or duet::Errors.
#include "duet/core/error.h"
#include "duet/server/openai.h"
#include "fuzz_common.h"
#include "fuzz_served_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace duet;
  if (size == 0) return 0;
  const server::ServedModel& model = fuzz::served_model();
  const bool chat = (data[0] & 1) != 0;
  try {
    const server::ParsedRequest r = server::parse_request(std::string(fuzz::as_text(data + 1, size - 1)), model, chat);
    for (const auto& prompt : r.prompts) {
      for (int32_t id : prompt) {
        if (id < 0 || id >= model.vocab_size) __builtin_trap();  // the engine would get a bad id
      }
    }
  } catch (const server::ApiError&) {
  } catch (const Error&) {
  }
  return 0;
}
