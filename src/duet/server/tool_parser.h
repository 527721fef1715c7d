// DeepSeek's tool-call markup in generated text, turned into OpenAI tool calls as the text
// streams in (--tool-call-parser):
//
//   deepseek_v3  (V3, R1):  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
//                           ```json
//                           {"arguments": ...}
//                           ```<｜tool▁call▁end｜>  (calls separated by "\n")  <｜tool▁calls▁end｜>
//   deepseek_v31 (V3.1):    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{"arguments": ...}
//                           <｜tool▁call▁end｜>... <｜tool▁calls▁end｜>
//   deepseek_v32 (V3.2):    \n\n<｜DSML｜function_calls>
//                           <｜DSML｜invoke name="NAME">
//                           <｜DSML｜parameter name="KEY" string="true">text</｜DSML｜parameter>
//                           <｜DSML｜parameter name="KEY2" string="false">JSON</｜DSML｜parameter>
//                           </｜DSML｜invoke>  (calls separated by "\n")  </｜DSML｜function_calls>
//                           Each call's parameters become one JSON object, {"KEY": "text",
//                           "KEY2": JSON}, as DeepSeek's encoding reads them back.
//
// Text before the markup is content. push() returns what became certain with each piece of
// text: content, a new call (its name), more of a call's arguments. Text that might still turn
// out to be the start of a marker is held back until it is known; flush() releases it at the end.
// Arguments stream as the model writes them (as vLLM's parsers do); the complete ones are in
// calls().
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace duet::server {

enum class ToolCallFormat { kDeepSeekV3, kDeepSeekV31, kDeepSeekV32 };

// The markers of that markup: the parser reads them, tool_calls.h's grammars and prompts write them.
namespace markup {
inline constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
inline constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
inline constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
inline constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
inline constexpr std::string_view kSep = "<｜tool▁sep｜>";
inline constexpr std::string_view kDsmlCallsBegin = "<｜DSML｜function_calls>";
inline constexpr std::string_view kDsmlCallsEnd = "</｜DSML｜function_calls>";
inline constexpr std::string_view kDsmlInvoke = "<｜DSML｜invoke";
inline constexpr std::string_view kDsmlInvokeEnd = "</｜DSML｜invoke>";
inline constexpr std::string_view kDsmlParameter = "<｜DSML｜parameter";
inline constexpr std::string_view kDsmlParameterEnd = "</｜DSML｜parameter>";
}  // namespace markup

// "deepseek_v3", "deepseek_v31" or "deepseek_v32"; nullopt for another name.
std::optional<ToolCallFormat> tool_call_format(std::string_view name);

class ToolCallParser {
 public:
  struct Call {
    std::string name;
    std::string arguments;
  };
  struct CallDelta {
    size_t index = 0;
    std::optional<std::string> name;  // set on the call's first delta
    std::string arguments;
  };
  struct Delta {
    std::string content;
    std::vector<CallDelta> calls;
    bool empty() const { return content.empty() && calls.empty(); }
  };

  explicit ToolCallParser(ToolCallFormat format) : format_(format) {}

  Delta push(std::string_view text);
  Delta flush();
  const std::vector<Call>& calls() const { return calls_; }

 private:
  enum class State { kContent, kBetweenCalls, kHeader, kArguments, kParameters, kValue, kDone };
  // Runs the state machine over buffer_; `final` releases what is held back.
  void run(Delta& out, bool final);
  // The same for DSML (V3.2); kHeader is an invoke's attributes, kParameters between its
  // parameters, kValue a parameter's value.
  void run_dsml(Delta& out, bool final);
  void emit_arguments(Delta& out, std::string_view text);
  void emit_value(Delta& out, std::string_view text);  // JSON-escaped in a text parameter

  ToolCallFormat format_;
  State state_ = State::kContent;
  size_t parameters_ = 0;     // DSML: parameters of the open call so far
  bool text_value_ = false;   // DSML: the open parameter is text (string="true")
  std::string buffer_;  // text not consumed yet
  std::vector<Call> calls_;
};

}  // namespace duet::server
