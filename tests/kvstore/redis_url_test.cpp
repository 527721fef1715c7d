#include "duet/kvstore/redis_url.h"

#include <string>

#include <gtest/gtest.h>

#include "duet/core/error.h"

namespace duet {
namespace {

TEST(RedisUrl, HostPortAndDatabase) {
  RedisUrl u = parse_redis_url("redis://127.0.0.1:6380/2");
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, 6380);
  EXPECT_EQ(u.db, 2);
  EXPECT_TRUE(u.password.empty());
  EXPECT_EQ(u.display(), "redis://127.0.0.1:6380/2");
  u = parse_redis_url("redis://cache.internal");
  EXPECT_EQ(u.host, "cache.internal");
  EXPECT_EQ(u.port, 6379);
  EXPECT_EQ(u.db, 0);
  u = parse_redis_url("redis://cache:7000/");
  EXPECT_EQ(u.port, 7000);
  EXPECT_EQ(u.db, 0);
  u = parse_redis_url("redis://[::1]:6390/1");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, 6390);
  EXPECT_EQ(u.display(), "redis://[::1]:6390/1");
}

TEST(RedisUrl, PasswordIsKeptButNotShown) {
  RedisUrl u = parse_redis_url("redis://:s3cret@host:1234/3");
  EXPECT_EQ(u.password, "s3cret");
  EXPECT_EQ(u.display(), "redis://:***@host:1234/3");
  u = parse_redis_url("redis://user:pw@host");
  EXPECT_EQ(u.password, "pw");
}

TEST(RedisUrl, BadUrlsAreRefusedWithTheReason) {
  const auto refused = [](const std::string& url, const std::string& reason) {
    try {
      parse_redis_url(url);
      ADD_FAILURE() << url << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("redis://HOST:PORT"), std::string::npos) << e.what();
    }
  };
  refused("http://host:6379", "not a redis:// URL");
  refused("host:6379", "not a redis:// URL");
  refused("rediss://host:6379", "TLS");
  refused("redis://", "no host");
  refused("redis://:6379", "no host");
  refused("redis://host:", "empty port");
  refused("redis://host:0", "port '0'");
  refused("redis://host:70000", "port '70000'");
  refused("redis://host:12ab", "port '12ab'");
  refused("redis://host:6379/x", "database 'x'");
  refused("redis://host:6379/1/2", "database '1/2'");
  refused("redis://[::1", "IPv6");
}

}  // namespace
}  // namespace duet
