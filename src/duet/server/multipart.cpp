#include "duet/server/multipart.h"

#include <algorithm>
#include <cctype>
#include <optional>

#include "duet/core/error.h"

namespace duet::server {
namespace {

constexpr size_t kMaxParts = 64;

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The parameters of a header value after its first ';' (type; a=b; c="d"), names lower-cased, a
// quoted value unquoted (backslash escapes one character).
std::vector<std::pair<std::string, std::string>> header_params(std::string_view value) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t i = value.find(';');
  while (i != std::string_view::npos && i < value.size()) {
    ++i;  // past ';'
    while (i < value.size() && (value[i] == ' ' || value[i] == '\t')) ++i;
    const size_t eq = value.find_first_of("=;", i);
    if (eq == std::string_view::npos || value[eq] == ';') {
      i = eq;
      continue;  // a parameter without a value
    }
    std::string name(trim(value.substr(i, eq - i)));
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    std::string v;
    size_t j = eq + 1;
    while (j < value.size() && (value[j] == ' ' || value[j] == '\t')) ++j;
    if (j < value.size() && value[j] == '"') {
      ++j;
      while (j < value.size() && value[j] != '"') {
        if (value[j] == '\\' && j + 1 < value.size()) ++j;
        v += value[j++];
      }
      if (j >= value.size()) throw Error(ErrorCode::kInvalidArgument, "multipart: a quoted parameter is not closed");
      ++j;  // past the closing quote
      i = value.find(';', j);
    } else {
      const size_t end = value.find(';', j);
      v = std::string(trim(value.substr(j, end == std::string_view::npos ? std::string_view::npos : end - j)));
      i = end;
    }
    out.emplace_back(std::move(name), std::move(v));
  }
  return out;
}

std::optional<std::string> param(const std::vector<std::pair<std::string, std::string>>& params, std::string_view name) {
  for (const auto& [k, v] : params) {
    if (k == name) return v;
  }
  return std::nullopt;
}

// Whether what follows a boundary at `pos` ends a delimiter line: "--", or padding and CRLF.
bool delimiter_line(std::string_view body, size_t pos) {
  if (body.substr(pos, 2) == "--") return true;
  while (pos < body.size() && (body[pos] == ' ' || body[pos] == '\t')) ++pos;
  return body.substr(pos, 2) == "\r\n";
}

}  // namespace

std::vector<FormPart> parse_multipart(std::string_view content_type, std::string_view body) {
  const std::string_view type = trim(content_type.substr(0, content_type.find(';')));
  if (!iequals(type, "multipart/form-data")) {
    throw Error(ErrorCode::kInvalidArgument, "the body must be multipart/form-data (a file upload), not '" +
                                                 std::string(type.substr(0, 100)) + "'");
  }
  const std::optional<std::string> boundary = param(header_params(content_type), "boundary");
  if (!boundary || boundary->empty() || boundary->size() > 200) {
    throw Error(ErrorCode::kInvalidArgument, "multipart/form-data without a boundary parameter");
  }
  const std::string delimiter = "--" + *boundary;
  // The first delimiter: at the start, or after the preamble's line break.
  size_t pos = 0;
  if (body.substr(0, delimiter.size()) != delimiter) {
    pos = body.find("\r\n" + delimiter);
    if (pos == std::string_view::npos) throw Error(ErrorCode::kInvalidArgument, "multipart: no boundary line in the body");
    pos += 2;
  }
  const std::string next_delimiter = "\r\n" + delimiter;
  std::vector<FormPart> parts;
  for (;;) {
    pos += delimiter.size();
    if (body.substr(pos, 2) == "--") return parts;  // the closing delimiter
    // Transport padding, then the line break that ends the delimiter line.
    while (pos < body.size() && (body[pos] == ' ' || body[pos] == '\t')) ++pos;
    if (body.substr(pos, 2) != "\r\n") throw Error(ErrorCode::kInvalidArgument, "multipart: a boundary line does not end");
    pos += 2;
    if (parts.size() == kMaxParts) {
      throw Error(ErrorCode::kInvalidArgument, "multipart: more than " + std::to_string(kMaxParts) + " parts");
    }
    FormPart part;
    bool disposition = false;
    // The part's headers, up to the empty line.
    for (;;) {
      const size_t eol = body.find("\r\n", pos);
      if (eol == std::string_view::npos) throw Error(ErrorCode::kInvalidArgument, "multipart: a part's headers do not end");
      const std::string_view line = body.substr(pos, eol - pos);
      pos = eol + 2;
      if (line.empty()) break;
      const size_t colon = line.find(':');
      if (colon == std::string_view::npos) throw Error(ErrorCode::kInvalidArgument, "multipart: a part's header has no ':'");
      const std::string_view name = trim(line.substr(0, colon));
      const std::string_view value = trim(line.substr(colon + 1));
      if (iequals(name, "content-disposition")) {
        if (!iequals(trim(value.substr(0, value.find(';'))), "form-data")) {
          throw Error(ErrorCode::kInvalidArgument, "multipart: a part's Content-Disposition is not form-data");
        }
        const auto params = header_params(value);
        part.name = param(params, "name").value_or("");
        part.filename = param(params, "filename").value_or("");
        disposition = true;
      } else if (iequals(name, "content-type")) {
        part.content_type = std::string(value);
      }
    }
    if (!disposition || part.name.empty()) {
      throw Error(ErrorCode::kInvalidArgument, "multipart: a part without Content-Disposition: form-data; name=...");
    }
    // The next delimiter line: the boundary, then "--" or the line's end (anything else is data
    // that happens to start like one).
    size_t end = body.find(next_delimiter, pos);
    while (end != std::string_view::npos && !delimiter_line(body, end + next_delimiter.size())) {
      end = body.find(next_delimiter, end + 1);
    }
    if (end == std::string_view::npos) {
      throw Error(ErrorCode::kInvalidArgument, "multipart: the body ends before the closing boundary");
    }
    part.data = body.substr(pos, end - pos);
    parts.push_back(std::move(part));
    pos = end + 2;
  }
}

}  // namespace duet::server
