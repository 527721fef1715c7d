// The structured-output fields of a request body, under OpenAI's and vLLM's names:
//   response_format   {"type": "text"} (no constraint), {"type": "json_object"},
//                     {"type": "json_schema", "json_schema": {"name", "schema", "strict"}};
//   guided_json       a schema (object, or its JSON text); guided_regex; guided_choice (strings);
//   guided_grammar    GBNF text;
//   structured_outputs {"json" | "regex" | "choice" | "grammar" | "json_object": ...} (vLLM's
//                     newer spelling of the same).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "duet/grammar/structured_output.h"

namespace duet::server {

struct RequestedOutput {
  std::string field;  // the field it came from (the `param` of errors about it)
  grammar::StructuredOutputSpec spec;
};

// nullopt when the request asks for none. Throws kInvalidArgument with a message that starts
// with the field's name, also when more than one is given. (Ordered, so that a schema's
// properties keep the request's order.)
std::optional<RequestedOutput> structured_output_spec(const nlohmann::ordered_json& body);

}  // namespace duet::server
