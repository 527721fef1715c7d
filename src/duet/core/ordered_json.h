// nlohmann::ordered_json (objects keep their keys in document order) built in time linear in the
// input. nlohmann's own parse and copy look each new key up in the object being built, a linear
// search per key, so an object of n keys costs n^2 / 2 comparisons: a request body with one
// object of 100,000 keys took 9 s to parse, and the 8 MiB a body may hold, minutes.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

namespace duet {

// As nlohmann::ordered_json::parse(text): the same value (a repeated key keeps its first place
// and its last value) and the same exceptions (nlohmann::json::parse_error, out_of_range).
nlohmann::ordered_json parse_ordered_json(std::string_view text);

// `j` as an ordered_json, its keys in j's (sorted) order.
nlohmann::ordered_json to_ordered_json(const nlohmann::json& j);

}  // namespace duet
