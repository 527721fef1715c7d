// Tool calling, the parts between the protocol and the model: the functions a request declares,
// the grammar that forces a call when tool_choice asks for one (in the model's own markup when a
// tool-call parser is configured, else as JSON the way vLLM does it), and the tool descriptions
// put into the system prompt when the chat template does not render `tools` itself.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "duet/grammar/grammar.h"
#include "duet/server/tool_parser.h"

namespace duet::server {

struct ToolFunction {
  std::string name;
  std::string description;
  nlohmann::ordered_json parameters;  // a JSON schema; an empty object when the tool gave none
};

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ToolRequest {
  std::vector<ToolFunction> functions;
  nlohmann::ordered_json tools;  // as the request gave them (for templates that render them)
  ToolChoice choice = ToolChoice::kNone;
  std::string named;             // kNamed: the function
  bool parallel = true;          // parallel_tool_calls
};

// The tools, tool_choice and parallel_tool_calls of a chat request. Throws kInvalidArgument with
// a message that starts with the field's name ("tools[1].function.name must be ...").
ToolRequest parse_tool_request(const nlohmann::ordered_json& body);

// The calls the model must make, in DeepSeek's markup for `format`: one call (or, when
// `parallel`, one or more) of the given functions, the arguments valid under each one's schema.
grammar::Grammar tool_markup_grammar(ToolCallFormat format, const std::vector<ToolFunction>& functions, bool parallel);

// Without a tool-call parser: the arguments of one named function as a JSON object, or, for
// tool_choice required, a JSON list of {"name": ..., "parameters": {...}} (one item unless
// `parallel`).
grammar::Grammar tool_arguments_grammar(const ToolFunction& function);
grammar::Grammar tool_list_grammar(const std::vector<ToolFunction>& functions, bool parallel);

// The tool descriptions for the system prompt, with the format to call them in (DeepSeek's
// markup for `format`, or the JSON list of tool_list_grammar without one).
std::string tool_system_prompt(const std::vector<ToolFunction>& functions, std::optional<ToolCallFormat> format);

}  // namespace duet::server
