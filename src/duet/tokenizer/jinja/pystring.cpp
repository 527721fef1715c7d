#include "duet/tokenizer/jinja/pystring.h"

#include <algorithm>

#include <fmt/format.h>

#include "duet/tokenizer/jinja/error.h"
#include "duet/tokenizer/unicode.h"

namespace duet::jinja {
namespace {

// The code point at s[pos] and its length; an invalid byte is taken as itself, length 1.
uint32_t next_codepoint(std::string_view s, size_t pos, size_t& len) {
  uint32_t cp = 0;
  len = decode_utf8(s, pos, cp);
  if (len == 0) {
    len = 1;
    cp = static_cast<unsigned char>(s[pos]);
  }
  return cp;
}

// The code point that ends at s[end] (exclusive) and where it starts.
uint32_t prev_codepoint(std::string_view s, size_t end, size_t& start) {
  start = end - 1;
  while (start > 0 && end - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  size_t len = 0;
  const uint32_t cp = next_codepoint(s, start, len);
  if (start + len != end) {  // not a well-formed sequence ending here: take the last byte alone
    start = end - 1;
    return static_cast<unsigned char>(s[start]);
  }
  return cp;
}

bool in_set(uint32_t cp, std::string_view chars) {
  for (size_t i = 0; i < chars.size();) {
    size_t len = 0;
    if (next_codepoint(chars, i, len) == cp) return true;
    i += len;
  }
  return false;
}

}  // namespace

bool is_python_space(uint32_t cp) {
  switch (cp) {
    case ' ': case '\t': case '\n': case '\r': case '\v': case '\f':
    case 0x1C: case 0x1D: case 0x1E: case 0x1F: case 0x85: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

size_t codepoint_count(std::string_view s) {
  if (is_ascii(s)) return s.size();
  size_t n = 0;
  for (size_t i = 0, len = 0; i < s.size(); i += len, ++n) next_codepoint(s, i, len);
  return n;
}

std::vector<size_t> codepoint_offsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  for (size_t i = 0, len = 0; i < s.size(); i += len) {
    offsets.push_back(i);
    next_codepoint(s, i, len);
  }
  offsets.push_back(s.size());
  return offsets;
}

std::vector<std::string> split_codepoints(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0, len = 0; i < s.size(); i += len) {
    next_codepoint(s, i, len);
    out.emplace_back(s.substr(i, len));
  }
  return out;
}

std::string_view python_strip(std::string_view s, bool left, bool right, std::optional<std::string_view> chars) {
  auto strip_it = [&](uint32_t cp) { return chars ? in_set(cp, *chars) : is_python_space(cp); };
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end) {
      size_t len = 0;
      if (!strip_it(next_codepoint(s, begin, len))) break;
      begin += len;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = 0;
      if (!strip_it(prev_codepoint(s, end, start))) break;
      end = start;
    }
  }
  return s.substr(begin, end - begin);
}

std::vector<std::string> python_split(std::string_view s, std::optional<std::string_view> sep, int64_t maxsplit,
                                      bool from_right) {
  std::vector<std::string> parts;
  if (sep) {
    if (sep->empty()) runtime_error("empty separator");
    if (!from_right) {
      size_t start = 0;
      while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
        const size_t at = s.find(*sep, start);
        if (at == std::string_view::npos) break;
        parts.emplace_back(s.substr(start, at - start));
        start = at + sep->size();
      }
      parts.emplace_back(s.substr(start));
    } else {
      size_t end = s.size();
      while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
        if (end < sep->size()) break;
        const size_t at = s.rfind(*sep, end - sep->size());
        if (at == std::string_view::npos) break;
        parts.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
        end = at;
      }
      parts.emplace_back(s.substr(0, end));
      std::reverse(parts.begin(), parts.end());
    }
    return parts;
  }
  // Runs of whitespace; empty strings never appear.
  auto space_at = [&](size_t pos, size_t& len) { return is_python_space(next_codepoint(s, pos, len)); };
  if (!from_right) {
    size_t i = 0;
    while (true) {
      size_t len = 0;
      while (i < s.size() && space_at(i, len)) i += len;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        parts.emplace_back(s.substr(i));
        break;
      }
      const size_t start = i;
      while (i < s.size() && !space_at(i, len)) i += len;
      parts.emplace_back(s.substr(start, i - start));
    }
  } else {
    size_t end = s.size();
    while (true) {
      size_t start = 0;
      while (end > 0 && is_python_space(prev_codepoint(s, end, start))) end = start;
      if (end == 0) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        parts.emplace_back(s.substr(0, end));
        break;
      }
      size_t word_start = end;
      while (word_start > 0 && !is_python_space(prev_codepoint(s, word_start, start))) word_start = start;
      parts.emplace_back(s.substr(word_start, end - word_start));
      end = word_start;
    }
    std::reverse(parts.begin(), parts.end());
  }
  return parts;
}

std::vector<std::string> python_splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> lines;
  size_t start = 0, i = 0;
  while (i < s.size()) {
    size_t len = 0;
    const uint32_t cp = next_codepoint(s, i, len);
    const bool is_break = cp == '\n' || cp == '\r' || cp == '\v' || cp == '\f' || cp == 0x1C || cp == 0x1D ||
                          cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!is_break) {
      i += len;
      continue;
    }
    size_t end = i + len;
    if (cp == '\r' && end < s.size() && s[end] == '\n') ++end;
    lines.emplace_back(s.substr(start, (keepends ? end : i) - start));
    start = i = end;
  }
  if (start < s.size()) lines.emplace_back(s.substr(start));
  return lines;
}

std::string python_replace(std::string_view s, std::string_view old, std::string_view replacement, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {  // Python inserts the replacement before every code point and at the end
    for (size_t i = 0, len = 0; i <= s.size(); i += len) {
      if (count < 0 || done < count) {
        out += replacement;
        ++done;
      }
      if (i == s.size()) break;
      next_codepoint(s, i, len);
      out += s.substr(i, len);
    }
    return out;
  }
  size_t start = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, start);
    if (at == std::string_view::npos) break;
    out += s.substr(start, at - start);
    out += replacement;
    start = at + old.size();
    ++done;
  }
  out += s.substr(start);
  return out;
}

int64_t python_find(std::string_view s, std::string_view sub, int64_t start, bool from_right) {
  const std::vector<size_t> offsets = codepoint_offsets(s);
  const int64_t n = static_cast<int64_t>(offsets.size()) - 1;
  if (start < 0) start = std::max<int64_t>(0, start + n);
  if (start > n) return -1;
  const size_t byte_start = offsets[static_cast<size_t>(start)];
  size_t at = std::string_view::npos;
  if (!from_right) {
    at = s.find(sub, byte_start);
  } else {
    at = s.rfind(sub);
    if (at != std::string_view::npos && at < byte_start) at = std::string_view::npos;
  }
  if (at == std::string_view::npos) return -1;
  return std::lower_bound(offsets.begin(), offsets.end(), at) - offsets.begin();
}

namespace {

// Simple case mappings (one code point to one), for the scripts pystring.h names.
uint32_t upper_of(uint32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c == 0xB5) return 0x39C;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 0x20;
  if (c == 0xFF) return 0x178;
  if ((c >= 0x100 && c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return c & ~1u;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1u) ? c : c - 1;
  if (c == 0x131) return 'I';
  if (c == 0x17F) return 'S';
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 0x25;
  if (c == 0x3C2) return 0x3A3;
  if ((c >= 0x3B1 && c <= 0x3C1) || (c >= 0x3C3 && c <= 0x3CB)) return c - 0x20;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 0x3F;
  if (c >= 0x430 && c <= 0x44F) return c - 0x20;
  if (c >= 0x450 && c <= 0x45F) return c - 0x50;
  if (c >= 0xFF41 && c <= 0xFF5A) return c - 0x20;
  return c;
}

uint32_t lower_of(uint32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 0x20;
  if (c == 0x178) return 0xFF;
  if ((c >= 0x100 && c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return c | 1u;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1u) ? c + 1 : c;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 0x25;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 0x3F;
  if ((c >= 0x391 && c <= 0x3A1) || (c >= 0x3A3 && c <= 0x3AB)) return c + 0x20;
  if (c >= 0x410 && c <= 0x42F) return c + 0x20;
  if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 0x20;
  return c;
}

bool is_cased(uint32_t c) { return upper_of(c) != c || lower_of(c) != c || c == 0xDF; }

void append_upper(std::string& out, uint32_t c) {
  if (c == 0xDF) {  // ß has no single upper-case letter: Python gives "SS"
    out += "SS";
    return;
  }
  append_utf8(out, upper_of(c));
}

// Maps each code point with `f(index, cp, previous_cased)`, which appends to `out`.
template <typename F>
std::string map_codepoints(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  bool previous_cased = false;
  for (size_t i = 0, len = 0; i < s.size(); i += len) {
    const uint32_t cp = next_codepoint(s, i, len);
    if (len == 1 && cp >= 0x80) {
      out += s[i];  // an invalid byte stays as it is
    } else {
      f(out, i, cp, previous_cased);
    }
    previous_cased = is_cased(cp);
  }
  return out;
}

}  // namespace

std::string python_upper(std::string_view s) {
  return map_codepoints(s, [](std::string& out, size_t, uint32_t cp, bool) { append_upper(out, cp); });
}

std::string python_lower(std::string_view s) {
  return map_codepoints(s, [](std::string& out, size_t, uint32_t cp, bool) { append_utf8(out, lower_of(cp)); });
}

std::string python_title(std::string_view s) {
  return map_codepoints(s, [](std::string& out, size_t, uint32_t cp, bool previous_cased) {
    if (previous_cased) append_utf8(out, lower_of(cp));
    else append_upper(out, cp);
  });
}

std::string python_capitalize(std::string_view s) {
  return map_codepoints(s, [](std::string& out, size_t i, uint32_t cp, bool) {
    if (i == 0) append_upper(out, cp);
    else append_utf8(out, lower_of(cp));
  });
}

bool is_lower_case(std::string_view s) { return python_lower(s) == s && python_upper(s) != s; }
bool is_upper_case(std::string_view s) { return python_upper(s) == s && python_lower(s) != s; }

std::string jinja_title(std::string_view s) {
  bool word_start = true;
  return map_codepoints(s, [&](std::string& out, size_t, uint32_t cp, bool) {
    const bool separator = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || is_python_space(cp);
    if (separator) {
      append_utf8(out, cp);
      word_start = true;
      return;
    }
    if (word_start) append_upper(out, cp);
    else append_utf8(out, lower_of(cp));
    word_start = false;
  });
}

void append_string_repr(std::string& out, std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out += quote;
  for (size_t i = 0, len = 0; i < s.size(); i += len) {
    const uint32_t cp = next_codepoint(s, i, len);
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || (cp >= 0x7F && cp < 0xA1) || cp == 0xAD) {
      out += fmt::format("\\x{:02x}", cp);
    } else if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) ||
               (cp >= 0x205F && cp <= 0x2064) || cp == 0x3000 || cp == 0xFEFF) {
      out += fmt::format("\\u{:04x}", cp);  // separators and format characters: not printable
    } else {
      out += s.substr(i, len);
    }
  }
  out += quote;
}

std::vector<int64_t> slice_indexes(int64_t length, std::optional<int64_t> start, std::optional<int64_t> stop,
                                   std::optional<int64_t> step) {
  const int64_t st = step.value_or(1);
  if (st == 0) runtime_error("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t x = *v;
    if (x < 0) x += length;
    if (st > 0) return std::clamp<int64_t>(x, 0, length);
    return std::clamp<int64_t>(x, -1, length - 1);
  };
  std::vector<int64_t> out;
  // Each loop stops before i + st would pass the end (or overflow, for a step near 2^63).
  if (st > 0) {
    for (int64_t i = clamp(start, 0), end = clamp(stop, length); i < end; i += st) {
      out.push_back(i);
      if (st >= end - i) break;
    }
  } else {
    for (int64_t i = clamp(start, length - 1), end = clamp(stop, -1); i > end; i += st) {
      out.push_back(i);
      if (st <= end - i) break;
    }
  }
  return out;
}

}  // namespace duet::jinja
