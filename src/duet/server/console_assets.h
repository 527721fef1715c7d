// The web console's static files (src/duet/server/console/), built into the binary so a served
// page needs nothing from the network: "/" is index.html, "/console/NAME" the others.
#pragma once

#include <string_view>

namespace duet::server {

struct ConsoleAsset {
  std::string_view path;          // "/", "/console/app.js", ...
  std::string_view content_type;
  std::string_view body;
};

// The asset served at `path`, or nullptr.
const ConsoleAsset* find_console_asset(std::string_view path);

}  // namespace duet::server
