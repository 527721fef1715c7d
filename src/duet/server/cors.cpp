#include "duet/server/cors.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "duet/core/error.h"

namespace duet::server {
namespace {

// What the answer to a preflight lists for "*" (the methods an HTTP API is called with).
constexpr std::string_view kAllMethods = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT";
// Request headers a page may always send (the CORS-safelisted ones).
const std::vector<std::string> kSafeHeaders = {"accept", "accept-language", "content-language", "content-type"};
constexpr std::string_view kMaxAgeSeconds = "600";

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

// The pieces of `text` between commas, trimmed (empty ones kept: "a,,b" is three).
std::vector<std::string> split_commas(std::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    out.push_back(trim(text.substr(start, comma - start)));
    start = comma + 1;
  }
  return out;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

bool contains(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

class HeaderAdder final : public ForwardingResponder {
 public:
  HeaderAdder(std::shared_ptr<Responder> inner, Headers headers)
      : ForwardingResponder(std::move(inner)), headers_(std::move(headers)) {}
  void send(int status, const std::string& content_type, std::string body, Headers headers) override {
    headers.insert(headers.end(), headers_.begin(), headers_.end());
    inner_->send(status, content_type, std::move(body), std::move(headers));
  }
  void send_body(int status, const std::string& content_type, BodySource body, Headers headers) override {
    headers.insert(headers.end(), headers_.begin(), headers_.end());
    inner_->send_body(status, content_type, std::move(body), std::move(headers));
  }
  void start_stream(int status, const std::string& content_type, Headers headers) override {
    headers.insert(headers.end(), headers_.begin(), headers_.end());
    inner_->start_stream(status, content_type, std::move(headers));
  }

 private:
  Headers headers_;
};

}  // namespace

void CorsConfig::check() const {
  for (const auto& [flag, list] : {std::pair{"--allowed-origins", &allowed_origins},
                                   std::pair{"--allowed-methods", &allowed_methods},
                                   std::pair{"--allowed-headers", &allowed_headers}}) {
    if (list->empty()) fail(ErrorCode::kInvalidArgument, "{} is empty: give at least one entry, or \"*\" for any", flag);
    for (const std::string& item : *list) {
      if (item.empty()) fail(ErrorCode::kInvalidArgument, "{} has an empty entry", flag);
    }
  }
}

std::vector<std::string> parse_cors_list(std::string_view text, std::string_view flag) {
  std::vector<std::string> out;
  const std::string trimmed = trim(text);
  if (!trimmed.empty() && trimmed.front() == '[') {
    const nlohmann::json list = nlohmann::json::parse(trimmed, nullptr, false);
    if (!list.is_array()) fail(ErrorCode::kInvalidArgument, "{} is not a JSON list: {}", flag, trimmed);
    for (const auto& item : list) {
      if (!item.is_string()) fail(ErrorCode::kInvalidArgument, "{}: every entry must be a string, got {}", flag, item.dump());
      out.push_back(trim(item.get<std::string>()));
    }
  } else {
    out = split_commas(trimmed);
  }
  for (const std::string& item : out) {
    if (item.empty()) fail(ErrorCode::kInvalidArgument, "{} has an empty entry: '{}'", flag, trimmed);
  }
  return out;
}

Cors::Cors(CorsConfig config) : config_(std::move(config)) {
  any_origin_ = contains(config_.allowed_origins, "*");
  any_method_ = contains(config_.allowed_methods, "*");
  any_header_ = contains(config_.allowed_headers, "*");
  for (std::string& h : config_.allowed_headers) h = lower(h);
}

bool Cors::is_preflight(const HttpRequest& req) {
  return req.method == "OPTIONS" && !req.header("origin").empty() && !req.header("access-control-request-method").empty();
}

bool Cors::origin_allowed(const std::string& origin) const {
  return any_origin_ || contains(config_.allowed_origins, origin);
}

Headers Cors::origin_headers(const std::string& origin) const {
  Headers h;
  // "*" cannot go with credentials (browsers refuse it): the origin itself then, and caches
  // keep replies to different origins apart.
  if (any_origin_ && !config_.allow_credentials) {
    h.emplace_back("Access-Control-Allow-Origin", "*");
  } else {
    h.emplace_back("Access-Control-Allow-Origin", origin);
    h.emplace_back("Vary", "Origin");
  }
  if (config_.allow_credentials) h.emplace_back("Access-Control-Allow-Credentials", "true");
  return h;
}

Headers Cors::reply_headers(const std::string& origin) const {
  if (origin.empty() || !origin_allowed(origin)) return {};
  Headers h = origin_headers(origin);
  h.emplace_back("Access-Control-Expose-Headers", "X-Request-Id");
  return h;
}

void Cors::answer_preflight(const HttpRequest& req, Responder& res) const {
  const std::string origin = req.header("origin");
  const std::string method = req.header("access-control-request-method");
  const std::string requested = req.header("access-control-request-headers");
  std::vector<std::string> problems;
  if (!origin_allowed(origin)) problems.push_back("origin");
  if (!any_method_ && !contains(config_.allowed_methods, method)) problems.push_back("method");
  if (!any_header_) {
    for (const std::string& piece : split_commas(requested)) {
      const std::string h = lower(piece);
      if (!h.empty() && !contains(config_.allowed_headers, h) && !contains(kSafeHeaders, h)) {
        problems.push_back("headers");
        break;
      }
    }
  }
  Headers h = origin_allowed(origin) ? origin_headers(origin) : Headers{{"Vary", "Origin"}};
  h.emplace_back("Access-Control-Allow-Methods", any_method_ ? std::string(kAllMethods) : join(config_.allowed_methods));
  std::vector<std::string> headers = kSafeHeaders;
  if (any_header_) {
    if (!requested.empty()) headers = {requested};
  } else {
    for (const std::string& a : config_.allowed_headers) {
      if (!contains(headers, a)) headers.push_back(a);
    }
  }
  h.emplace_back("Access-Control-Allow-Headers", join(headers));
  h.emplace_back("Access-Control-Max-Age", std::string(kMaxAgeSeconds));
  if (problems.empty()) return res.send(200, "text/plain; charset=utf-8", "OK", std::move(h));
  res.send(400, "text/plain; charset=utf-8", "Disallowed CORS " + join(problems), std::move(h));
}

std::shared_ptr<Responder> with_headers(std::shared_ptr<Responder> inner, Headers headers) {
  if (headers.empty()) return inner;
  return std::make_shared<HeaderAdder>(std::move(inner), std::move(headers));
}

}  // namespace duet::server
