// Long and deep inputs, which the other targets' mutations of a few kilobytes never reach: 100,000
// nested groups, chains of 100,000 filters, 65,000 rules each naming the next. The input describes
// the text instead of being it:
//
//   byte 0: what the text is (mod 3): 0 a chat template, 1 a /v1/chat/completions body, 2 a
//           /v1/completions body (handled as fuzz_jinja and fuzz_openai_request handle them)
//   bytes 1-2: N, little-endian
//   the rest: PREFIX \x1f OPEN \x1f MIDDLE \x1f CLOSE \x1f SUFFIX (missing pieces are empty)
//
// The text is PREFIX + OPEN x N + MIDDLE + CLOSE x N + SUFFIX, where \x01 becomes the
// repetition's index (0 outside OPEN and CLOSE), \x02 the index plus one and \x03 N (a chain of
// rules: OPEN "r\x01 ::= r\x02\n", MIDDLE "r\x03 ::= \"a\"").
// Texts past 4 MiB are cut there. The code must refuse what is too deep or too long with its
// promised error, in time, within the stack and memory limits, as for any other input.
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/server/openai.h"
#include "duet/tokenizer/chat_template.h"
#include "fuzz_common.h"
#include "fuzz_served_model.h"

namespace {

constexpr size_t kMaxText = size_t{4} << 20;

// Appends `piece` with its placeholders filled in for repetition i of n; false once the text is
// full.
bool append(std::string& text, std::string_view piece, size_t i, size_t n) {
  for (const char c : piece) {
    if (c == '\x01') text += std::to_string(i);
    else if (c == '\x02') text += std::to_string(i + 1);
    else if (c == '\x03') text += std::to_string(n);
    else text += c;
  }
  if (text.size() < kMaxText) return true;
  text.resize(kMaxText);
  return false;
}

std::string expand(const uint8_t* data, size_t size) {
  const size_t count = data[1] | (static_cast<size_t>(data[2]) << 8);
  std::vector<std::string_view> pieces;
  std::string_view rest = duet::fuzz::as_text(data + 3, size - 3);
  while (pieces.size() < 4) {
    const size_t cut = rest.find('\x1f');
    if (cut == std::string_view::npos) break;
    pieces.push_back(rest.substr(0, cut));
    rest.remove_prefix(cut + 1);
  }
  pieces.push_back(rest);
  pieces.resize(5);
  const std::string_view prefix = pieces[0], open = pieces[1], middle = pieces[2], close = pieces[3],
                         suffix = pieces[4];
  std::string text;
  bool room = append(text, prefix, 0, count);
  for (size_t i = 0; room && !open.empty() && i < count; ++i) room = append(text, open, i, count);
  if (room) room = append(text, middle, 0, count);
  for (size_t i = 0; room && !close.empty() && i < count; ++i) room = append(text, close, count - 1 - i, count);
  if (room) append(text, suffix, 0, count);
  return text;
}

void render_template(const std::string& source) {
  using namespace duet;
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
     "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "2"}])");
  static const nlohmann::ordered_json vars =
      nlohmann::ordered_json::parse(R"({"add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  try {
    const ChatTemplate t = ChatTemplate::parse(source);
    (void)t.render(messages, vars);
  } catch (const Error&) {
  }
}

void parse_body(const std::string& body, bool chat) {
  using namespace duet;
  try {
    (void)server::parse_request(body, fuzz::served_model(), chat);
  } catch (const server::ApiError&) {
  } catch (const Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const std::string text = expand(data, size);
  switch (data[0] % 3) {
    case 0: render_template(text); break;
    case 1: parse_body(text, true); break;
    default: parse_body(text, false); break;
  }
  return 0;
}
