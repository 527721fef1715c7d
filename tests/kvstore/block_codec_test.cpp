#include "duet/kvstore/block_codec.h"

#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "duet/cache/kv_cache_manager.h"
#include "duet/core/error.h"

namespace duet {
namespace {

BlockLayout layout() { return BlockLayout{4, 3, 40, 24}; }  // 4 tokens, 3 layers, K 40 and V 24 bytes each

struct Block {
  BlockMeta meta;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> payload;
  std::string value;
};

Block make_block(uint64_t seed = 1) {
  Block b;
  b.meta = BlockMeta{0x1234, 0xabcd + seed, 0x99, layout()};
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int i = 0; i < 4; ++i) b.tokens.push_back(static_cast<int32_t>(rng() % 50000));
  b.payload.resize(static_cast<size_t>(layout().payload_bytes()));
  for (uint8_t& x : b.payload) x = static_cast<uint8_t>(rng());
  b.value = encode_block(b.meta, b.tokens, b.payload);
  return b;
}

TEST(BlockKey, HasTheVersionTheIdentityAndTheChainHash) {
  EXPECT_EQ(block_key(0x0123456789abcdefull, 0xfedcba9876543210ull),
            "duet:kv:v1:0123456789abcdef:fedcba9876543210");
  EXPECT_EQ(block_key(1, 2), "duet:kv:v1:0000000000000001:0000000000000002");
  EXPECT_EQ(kBlockCodecVersion, 1u) << "a new version changes every key: update this test and the docs";
}

TEST(BlockKey, IdentityChangesWithEveryInput) {
  const BlockLayout l = layout();
  const uint64_t base = kv_tier_identity(7, "f16", l);
  EXPECT_EQ(base, kv_tier_identity(7, "f16", l)) << "deterministic";
  std::set<uint64_t> seen{base};
  EXPECT_TRUE(seen.insert(kv_tier_identity(8, "f16", l)).second) << "another model";
  EXPECT_TRUE(seen.insert(kv_tier_identity(7, "q8_0", l)).second) << "another cache dtype";
  EXPECT_TRUE(seen.insert(kv_tier_identity(7, "f32", l)).second) << "another cache dtype";
  BlockLayout other = l;
  other.block_size = 8;
  EXPECT_TRUE(seen.insert(kv_tier_identity(7, "f16", other)).second) << "another block size";
  other = l;
  other.num_layers = 4;
  EXPECT_TRUE(seen.insert(kv_tier_identity(7, "f16", other)).second) << "another number of layers";
  other = l;
  other.k_bytes = 48;
  EXPECT_TRUE(seen.insert(kv_tier_identity(7, "f16", other)).second) << "another K width";
  other = l;
  other.v_bytes = 0;
  EXPECT_TRUE(seen.insert(kv_tier_identity(7, "f16", other)).second) << "no V";
}

TEST(BlockKey, ChainHashesAreThePrefixCachesOwn) {
  // The key's chain hash is the prefix cache's: a block's key depends on every token before it.
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<int32_t> b = a;
  b[0] = 9;  // a different first block
  const std::vector<BlockHash> ha = chain_hashes(a, 2, 4), hb = chain_hashes(b, 2, 4);
  EXPECT_EQ(ha[0], hash_block(0, std::span<const int32_t>(a).first(4)));
  EXPECT_EQ(ha[1], hash_block(ha[0], std::span<const int32_t>(a).subspan(4, 4)));
  EXPECT_NE(ha[1], hb[1]) << "same second block, another prefix: another key";
  EXPECT_NE(block_key(1, ha[1]), block_key(1, hb[1]));
}

TEST(BlockCodec, RoundTrips) {
  const Block b = make_block();
  EXPECT_EQ(b.value.size(), block_value_size(layout()));
  EXPECT_EQ(b.value.size(), 64u + 4 * 4 + 3 * (40 + 24) + 8);
  std::string why;
  const auto payload = decode_block(b.value, b.meta, b.tokens, &why);
  ASSERT_TRUE(payload) << why;
  ASSERT_EQ(payload->size(), b.payload.size());
  EXPECT_EQ(std::memcmp(payload->data(), b.payload.data(), b.payload.size()), 0);
  EXPECT_EQ(block_payload(b.value, layout()).data(), payload->data());
}

TEST(BlockCodec, EveryFlippedByteIsRefused) {
  const Block b = make_block(3);
  for (size_t i = 0; i < b.value.size(); ++i) {
    std::string bad = b.value;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    std::string why;
    EXPECT_FALSE(decode_block(bad, b.meta, b.tokens, &why)) << "byte " << i;
    EXPECT_FALSE(why.empty());
  }
}

TEST(BlockCodec, WrongSizesAreRefused) {
  const Block b = make_block(4);
  std::string why;
  EXPECT_FALSE(decode_block(b.value.substr(0, b.value.size() - 1), b.meta, b.tokens, &why));
  EXPECT_NE(why.find("bytes, expected"), std::string::npos) << why;
  EXPECT_FALSE(decode_block(b.value + "x", b.meta, b.tokens));
  EXPECT_FALSE(decode_block("", b.meta, b.tokens));
  EXPECT_FALSE(decode_block("garbage", b.meta, b.tokens));
}

TEST(BlockCodec, ForeignBlocksAreRefused) {
  const Block b = make_block(5);
  std::string why;
  BlockMeta m = b.meta;
  m.identity ^= 1;  // another model or dtype
  EXPECT_FALSE(decode_block(b.value, m, b.tokens, &why));
  EXPECT_NE(why.find("identity"), std::string::npos) << why;
  m = b.meta;
  m.hash ^= 1;
  EXPECT_FALSE(decode_block(b.value, m, b.tokens));
  m = b.meta;
  m.parent ^= 1;  // the same block after another prefix
  EXPECT_FALSE(decode_block(b.value, m, b.tokens));
  std::vector<int32_t> tokens = b.tokens;
  tokens[2] += 1;  // a hash collision would be caught by the tokens
  EXPECT_FALSE(decode_block(b.value, b.meta, tokens, &why));
  EXPECT_NE(why.find("token 2"), std::string::npos) << why;
  // Another layout of the same size: refused by the header, not only by the size.
  m = b.meta;
  m.layout = BlockLayout{4, 3, 24, 40};
  EXPECT_FALSE(decode_block(b.value, m, b.tokens, &why));
  EXPECT_NE(why.find("layout"), std::string::npos) << why;
}

TEST(BlockCodec, AValueReencodedWithAnotherIdentityIsRefused) {
  // Garbage with a valid checksum (as a buggy or hostile writer could store) still has to match.
  Block b = make_block(6);
  BlockMeta other = b.meta;
  other.identity = 0x4321;
  const std::string foreign = encode_block(other, b.tokens, b.payload);
  EXPECT_FALSE(decode_block(foreign, b.meta, b.tokens));
  EXPECT_TRUE(decode_block(foreign, other, b.tokens));
}

TEST(BlockCodec, EncodeRefusesWrongSizes) {
  const Block b = make_block(7);
  EXPECT_THROW(encode_block(b.meta, std::vector<int32_t>(3), b.payload), Error);
  EXPECT_THROW(encode_block(b.meta, b.tokens, std::vector<uint8_t>(10)), Error);
  EXPECT_THROW(block_payload("short", layout()), Error);
}

TEST(Checksum, DependsOnEveryByteTheLengthAndTheSeed) {
  std::vector<uint8_t> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7);
  const uint64_t base = checksum64(data.data(), data.size());
  EXPECT_EQ(base, checksum64(data.data(), data.size()));
  std::set<uint64_t> seen{base};
  for (size_t i = 0; i < data.size(); i += 37) {
    data[i] ^= 1;
    EXPECT_TRUE(seen.insert(checksum64(data.data(), data.size())).second) << "byte " << i;
    data[i] ^= 1;
  }
  EXPECT_TRUE(seen.insert(checksum64(data.data(), data.size() - 1)).second);
  EXPECT_TRUE(seen.insert(checksum64(data.data(), data.size(), 1)).second);
  // Zeros of different lengths differ too.
  const std::vector<uint8_t> zeros(64, 0);
  std::set<uint64_t> lengths;
  for (size_t n = 0; n <= 64; ++n) lengths.insert(checksum64(zeros.data(), n));
  EXPECT_EQ(lengths.size(), 65u);
}

}  // namespace
}  // namespace duet
