// multipart/form-data bodies (RFC 7578), as OpenAI's clients upload files to POST /v1/files: the
// boundary from the Content-Type header, then each part's name, filename, content type and bytes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace duet::server {

struct FormPart {
  std::string name;          // Content-Disposition's name
  std::string filename;      // its filename, empty when the part is not a file
  std::string content_type;  // the part's Content-Type, empty when it has none
  std::string_view data;     // into the body given to parse_multipart
};

// The parts of `body`, sent with `content_type` (multipart/form-data; boundary=...). Throws Error
// (kInvalidArgument) naming what is wrong: another content type, no boundary, a part without its
// headers' end or without a name, a body that does not end with the closing boundary, more than
// 64 parts.
std::vector<FormPart> parse_multipart(std::string_view content_type, std::string_view body);

}  // namespace duet::server
