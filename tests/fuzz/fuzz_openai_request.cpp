// The OpenAI request parsers: a body of /v1/messages (first input byte with bit 3 set, Anthropic's),
// /v1/embeddings (else bit 2 set), /v1/responses (else bit 1 set), /v1/chat/completions (else odd)
// or /v1/completions (even)
// parsed and validated against a served model with the DeepSeek-V3 chat template (DeepSeek-V3.2's
// encoding and DSML tool calls when the first byte has bit 5 set), tool calls and structured output, as the server does before anything reaches the engine; a Responses body's
// conversation has two items (a message and a function call) that item references may name. Bad
// bodies must be ApiErrors (a 4xx naming the parameter) or duet::Errors.
#include "duet/core/error.h"
#include "duet/server/embeddings.h"
#include "duet/server/messages.h"
#include "duet/server/openai.h"
#include "duet/server/responses.h"
#include "fuzz_common.h"
#include "fuzz_served_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace duet;
  if (size == 0) return 0;
  const server::ServedModel& model = fuzz::served_model((data[0] & 32) != 0);
  const bool chat = (data[0] & 1) != 0;
  const bool responses = (data[0] & 2) != 0;
  try {
    const std::string text(fuzz::as_text(data + 1, size - 1));
    server::ParsedRequest r;
    if ((data[0] & 8) != 0) {
      const bool counting = (data[0] & 16) != 0;
      r = server::parse_messages_chat(server::parse_messages_request(server::parse_json_body(text), text, counting), model);
    } else if ((data[0] & 4) != 0) {
      r = server::parse_embeddings_request(server::parse_json_body(text), model).parsed;
    } else if (responses) {
      static const nlohmann::json kItems = nlohmann::json::parse(
          R"([{"id": "msg_1", "type": "message", "role": "user", "content": "hi"},
              {"id": "fc_1", "type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}])");
      server::ResponsesRequest rr = server::parse_responses_request(
          server::parse_json_body(text), text, [](const std::string&) { return nullptr; },
          [](const std::string&) { return kItems; });
      r = server::parse_responses_chat(rr, model);
    } else {
      r = server::parse_request(text, model, chat);
    }
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
