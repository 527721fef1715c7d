// Cross-origin resource sharing: what lets a page served from another origin (a chat front end
// on its own host, a notebook) call the API from a browser. The settings are vLLM's
// (--allowed-origins, --allowed-methods, --allowed-headers, --allow-credentials, every origin
// allowed by default) and the answers those of the CORS middleware vLLM's server uses:
//  - a preflight (OPTIONS with Origin and Access-Control-Request-Method) is answered here, before
//    authentication (browsers send no credentials with it): 200 with the allowed methods and
//    headers, or 400 naming what is not allowed;
//  - any other request from an allowed origin gets Access-Control-Allow-Origin (and
//    Access-Control-Expose-Headers: X-Request-Id) on its reply, errors included; one from an
//    origin not allowed is served without them, so the browser withholds the reply.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "duet/server/http_server.h"

namespace duet::server {

struct CorsConfig {
  std::vector<std::string> allowed_origins{"*"};  // exact origins ("https://chat.example.com"), or "*"
  std::vector<std::string> allowed_methods{"*"};
  std::vector<std::string> allowed_headers{"*"};  // request headers a page may send, or "*"
  bool allow_credentials = false;                 // cookies and HTTP authentication from the page

  // Throws kInvalidArgument for an empty list or an empty entry.
  void check() const;
};

// A flag's list: a JSON array of strings, as vLLM takes it ('["https://a.example"]'), or names
// separated by commas. Throws kInvalidArgument naming `flag`.
std::vector<std::string> parse_cors_list(std::string_view text, std::string_view flag);

using Headers = std::vector<std::pair<std::string, std::string>>;

class Cors {
 public:
  explicit Cors(CorsConfig config);

  static bool is_preflight(const HttpRequest& req);
  // The reply to a preflight.
  void answer_preflight(const HttpRequest& req, Responder& res) const;
  // The headers a reply to a request from `origin` carries: none when there is no origin or it
  // is not allowed.
  Headers reply_headers(const std::string& origin) const;

 private:
  bool origin_allowed(const std::string& origin) const;
  // Access-Control-Allow-Origin (and -Credentials) for an allowed origin.
  Headers origin_headers(const std::string& origin) const;

  CorsConfig config_;
  bool any_origin_ = false;
  bool any_method_ = false;
  bool any_header_ = false;
};

// `inner` with `headers` added to its reply (whole or streamed).
std::shared_ptr<Responder> with_headers(std::shared_ptr<Responder> inner, Headers headers);

}  // namespace duet::server
