// Text produced the way Python produces it: json.dumps (behind the tojson filter, with Hugging
// Face's defaults: non-ASCII kept, no HTML escaping), printf-style `%` formatting (the format
// filter and str % args) and str.format.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "duet/tokenizer/jinja/value.h"

namespace duet::jinja {

struct JsonDumpOptions {
  std::optional<std::string> indent;  // newline plus this per level; none: everything on one line
  std::string item_separator = ", ";  // Python's default; "," when indent is set
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;  // true: non-ASCII characters become \uXXXX escapes
};

std::string json_dumps(const Value& v, const JsonDumpOptions& options);

// `s` as a JSON string literal (quotes included), appended to `out` as json.dumps writes it:
// quotes, backslashes and control characters escaped; without ensure_ascii the other bytes as
// they are (so a piece of UTF-8 cut anywhere escapes as the whole would).
void append_json_string(std::string& out, std::string_view s, bool ensure_ascii);

// `format % args`: args is a tuple of values, a dict for %(name)s, or a single value.
std::string percent_format(std::string_view format, const Value& args);

// `format.format(*args, **kwargs)`: {} {0} {name}, with an optional :spec (fill, align, sign,
// width, precision, type) and !s / !r conversions.
std::string str_format(std::string_view format, const std::vector<Value>& args,
                       const std::vector<std::pair<std::string, Value>>& kwargs);

}  // namespace duet::jinja
