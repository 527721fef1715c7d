// Python str semantics on UTF-8 strings: lengths, indexes and slices count code points, not
// bytes; whitespace is Python's (str.isspace); case mapping covers Latin (ASCII, Latin-1,
// Latin Extended-A), Greek, Cyrillic and fullwidth Latin letters (other scripts are left as they
// are; Greek final sigma is not special-cased).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace duet::jinja {

bool is_python_space(uint32_t cp);

// Number of code points (a byte that does not start a valid sequence counts as one).
size_t codepoint_count(std::string_view s);
// Byte offset of every code point, plus s.size() at the end (so size() is count + 1).
std::vector<size_t> codepoint_offsets(std::string_view s);
bool is_ascii(std::string_view s);

// The code points of s as separate strings (Python's list(s)).
std::vector<std::string> split_codepoints(std::string_view s);

// str.strip / lstrip / rstrip: `chars` (a set of code points) or Python whitespace when absent.
std::string_view python_strip(std::string_view s, bool left, bool right, std::optional<std::string_view> chars);

// str.split / str.rsplit: on `sep`, or on runs of whitespace when absent. maxsplit < 0: no limit.
std::vector<std::string> python_split(std::string_view s, std::optional<std::string_view> sep, int64_t maxsplit,
                                      bool from_right);
std::vector<std::string> python_splitlines(std::string_view s, bool keepends);

std::string python_replace(std::string_view s, std::string_view old, std::string_view replacement, int64_t count);

// str.find: the code-point index of the first occurrence at or after code point `start`, or -1.
int64_t python_find(std::string_view s, std::string_view sub, int64_t start, bool from_right);

std::string python_upper(std::string_view s);
std::string python_lower(std::string_view s);
std::string python_title(std::string_view s);       // str.title: each cased run starts upper case
std::string python_capitalize(std::string_view s);  // str.capitalize: first upper, the rest lower
// str.islower / str.isupper: at least one cased character, and all of them in that case.
bool is_lower_case(std::string_view s);
bool is_upper_case(std::string_view s);
// Jinja2's title filter: words start after "-", whitespace, or one of "({[<".
std::string jinja_title(std::string_view s);

// Python's repr() of a str: single quotes unless the text has ' and no ", escapes for
// backslash, quote, \n \r \t and other control characters.
void append_string_repr(std::string& out, std::string_view s);

// Python slice semantics: the indexes selected by [start:stop:step] of a sequence of `length`
// items. Throws for a zero step.
std::vector<int64_t> slice_indexes(int64_t length, std::optional<int64_t> start, std::optional<int64_t> stop,
                                   std::optional<int64_t> step);

}  // namespace duet::jinja
