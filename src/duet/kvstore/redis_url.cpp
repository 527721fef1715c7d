#include "duet/kvstore/redis_url.h"

#include <charconv>

#include <fmt/format.h>

#include "duet/core/error.h"

namespace duet {
namespace {

// A decimal number in [lo, hi], or -1.
int parse_int(std::string_view s, int lo, int hi) {
  int v = -1;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi) return -1;
  return v;
}

}  // namespace

std::string RedisUrl::display() const {
  return fmt::format("redis://{}{}:{}/{}", password.empty() ? "" : ":***@", host.find(':') != std::string::npos ? "[" + host + "]" : host, port, db);
}

RedisUrl parse_redis_url(const std::string& url) {
  const std::string_view scheme = "redis://";
  const auto bad = [&](const std::string& why) {
    fail(ErrorCode::kInvalidArgument, "--kv-cache-redis '{}': {}, expected redis://HOST:PORT[/DB]", url, why);
  };
  if (url.rfind(scheme, 0) != 0) {
    bad(url.rfind("rediss://", 0) == 0 ? "TLS (rediss://) is not supported" : "not a redis:// URL");
  }
  std::string_view rest = std::string_view(url).substr(scheme.size());
  RedisUrl out;
  if (const size_t at = rest.rfind('@'); at != std::string_view::npos) {
    std::string_view auth = rest.substr(0, at);
    rest = rest.substr(at + 1);
    if (!auth.empty() && auth.front() == ':') auth.remove_prefix(1);  // redis://:PASSWORD@...
    if (const size_t colon = auth.find(':'); colon != std::string_view::npos) auth = auth.substr(colon + 1);  // user:pass
    out.password = std::string(auth);
  }
  std::string_view hostport = rest;
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    hostport = rest.substr(0, slash);
    const std::string_view db = rest.substr(slash + 1);
    if (!db.empty()) {
      out.db = parse_int(db, 0, 65535);
      if (out.db < 0) bad(fmt::format("the database '{}' is not a number from 0 to 65535", db));
    }
  }
  std::string_view port;
  if (!hostport.empty() && hostport.front() == '[') {  // [IPv6]:PORT
    const size_t close = hostport.find(']');
    if (close == std::string_view::npos) bad("an IPv6 address without its ']'");
    out.host = std::string(hostport.substr(1, close - 1));
    const std::string_view after = hostport.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') bad("text after the IPv6 address");
      port = after.substr(1);
      if (port.empty()) bad("an empty port");
    }
  } else if (const size_t colon = hostport.rfind(':'); colon != std::string_view::npos) {
    out.host = std::string(hostport.substr(0, colon));
    port = hostport.substr(colon + 1);
    if (port.empty()) bad("an empty port");
  } else {
    out.host = std::string(hostport);
  }
  if (out.host.empty()) bad("no host");
  if (!port.empty()) {
    out.port = parse_int(port, 1, 65535);
    if (out.port < 0) bad(fmt::format("the port '{}' is not a number from 1 to 65535", port));
  }
  return out;
}

}  // namespace duet
