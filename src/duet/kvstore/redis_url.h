// `redis://[:PASSWORD@]HOST[:PORT][/DB]`: where the Redis KV tier lives.
#pragma once

#include <string>

namespace duet {

struct RedisUrl {
  std::string host;
  int port = 6379;
  int db = 0;
  std::string password;  // empty: no AUTH

  // The URL without its password, for logs.
  std::string display() const;
};

// Throws kInvalidArgument naming the URL and what is wrong (another scheme, no host, a port
// outside 1-65535, a database that is not a number from 0 to 65535, anything after the database).
RedisUrl parse_redis_url(const std::string& url);

}  // namespace duet
