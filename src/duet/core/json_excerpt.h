#pragma once

#include <cstddef>
#include <string>

namespace duet {

namespace detail {

template <typename Json>
void append_json_excerpt(const Json& j, std::string& out, size_t max_chars, int depth) {
  constexpr int kMaxDepth = 8;
  if (out.size() > max_chars) return;
  if (j.is_array() || j.is_object()) {
    const bool array = j.is_array();
    out += array ? '[' : '{';
    if (depth >= kMaxDepth && !j.empty()) {
      out += "...";
    } else {
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        if (out.size() > max_chars) {
          out += "...";
          break;
        }
        if (!array) out += Json(it.key()).dump() + ": ";
        append_json_excerpt(*it, out, max_chars, depth + 1);
      }
    }
    out += array ? ']' : '}';
    return;
  }
  out += j.dump();  // a scalar: no recursion
}

}  // namespace detail

// A JSON value as text for an error message: about `max_chars` characters at most and 8 levels
// deep (deeper containers print as [...] and {...}), however large or deep the value. dump()
// recursed once per level, so a tokenizer.json nested 100,000 deep, quoted in an error, ended the
// process with a stack overflow; and a whole large value made an unreadable message.
template <typename Json>
std::string json_excerpt(const Json& j, size_t max_chars = 200) {
  std::string out;
  detail::append_json_excerpt(j, out, max_chars, 0);
  if (out.size() > max_chars + 3) out = out.substr(0, max_chars) + "...";
  return out;
}

}  // namespace duet
