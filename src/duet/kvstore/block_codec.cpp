#include "duet/kvstore/block_codec.h"

#include <cstring>

#include <fmt/format.h>

#include "duet/core/error.h"
#include "duet/core/random.h"

namespace duet {
namespace {

constexpr char kMagic[4] = {'D', 'K', 'V', 'B'};
constexpr size_t kHeaderBytes = 64;
constexpr size_t kChecksumBytes = 8;

uint64_t load_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint32_t load_le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
void store_le64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void store_le32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

size_t tokens_bytes(const BlockLayout& l) { return static_cast<size_t>(l.block_size) * 4; }

}  // namespace

uint64_t checksum64(const void* data, size_t size, uint64_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t lane[4] = {seed ^ kGolden, seed + 2 * kGolden, seed ^ 0xD6E8FEB86659FD93ull, seed + 0xA0761D6478BD642Full};
  size_t i = 0;
  for (; i + 32 <= size; i += 32) {
    for (int k = 0; k < 4; ++k) lane[k] = mix64(lane[k] ^ load_le64(p + i + 8 * k)) + kGolden;
  }
  for (; i + 8 <= size; i += 8) lane[0] = mix64(lane[0] ^ load_le64(p + i)) + kGolden;
  uint64_t tail = 0;
  for (size_t k = 0; i + k < size; ++k) tail |= static_cast<uint64_t>(p[i + k]) << (8 * k);
  uint64_t h = mix64(lane[0] ^ tail ^ (static_cast<uint64_t>(size) * kGolden));
  h = mix64(h ^ lane[1]);
  h = mix64(h ^ lane[2]);
  return mix64(h ^ lane[3]);
}

uint64_t kv_tier_identity(uint64_t model_fingerprint, std::string_view kv_dtype, const BlockLayout& layout) {
  uint8_t fields[8 + 4 + 4 + 4 + 8 + 8];
  store_le64(fields, model_fingerprint);
  store_le32(fields + 8, kBlockCodecVersion);
  store_le32(fields + 12, static_cast<uint32_t>(layout.block_size));
  store_le32(fields + 16, static_cast<uint32_t>(layout.num_layers));
  store_le64(fields + 20, static_cast<uint64_t>(layout.k_bytes));
  store_le64(fields + 28, static_cast<uint64_t>(layout.v_bytes));
  return checksum64(fields, sizeof(fields), checksum64(kv_dtype.data(), kv_dtype.size(), 0x6B76746965726964ull));
}

std::string block_key(uint64_t identity, uint64_t hash) {
  return fmt::format("duet:kv:v{}:{:016x}:{:016x}", kBlockCodecVersion, identity, hash);
}

size_t block_value_size(const BlockLayout& layout) {
  return kHeaderBytes + tokens_bytes(layout) + static_cast<size_t>(layout.payload_bytes()) + kChecksumBytes;
}

std::string encode_block(const BlockMeta& meta, std::span<const int32_t> tokens, std::span<const uint8_t> payload) {
  const BlockLayout& l = meta.layout;
  if (l.block_size <= 0 || l.num_layers <= 0 || l.k_bytes < 0 || l.v_bytes < 0) {
    fail(ErrorCode::kInvalidArgument, "encode_block: layout of {} tokens, {} layers, {} + {} bytes per layer",
         l.block_size, l.num_layers, l.k_bytes, l.v_bytes);
  }
  if (tokens.size() != static_cast<size_t>(l.block_size) || payload.size() != static_cast<size_t>(l.payload_bytes())) {
    fail(ErrorCode::kInvalidArgument, "encode_block: {} tokens and {} payload bytes, expected {} and {}",
         tokens.size(), payload.size(), l.block_size, l.payload_bytes());
  }
  std::string value(block_value_size(l), '\0');
  auto* p = reinterpret_cast<uint8_t*>(value.data());
  std::memcpy(p, kMagic, 4);
  store_le32(p + 4, kBlockCodecVersion);
  store_le64(p + 8, meta.identity);
  store_le64(p + 16, meta.hash);
  store_le64(p + 24, meta.parent);
  store_le32(p + 32, static_cast<uint32_t>(l.block_size));
  store_le32(p + 36, static_cast<uint32_t>(l.num_layers));
  store_le64(p + 40, static_cast<uint64_t>(l.k_bytes));
  store_le64(p + 48, static_cast<uint64_t>(l.v_bytes));
  store_le64(p + 56, static_cast<uint64_t>(l.payload_bytes()));
  uint8_t* t = p + kHeaderBytes;
  for (size_t i = 0; i < tokens.size(); ++i) store_le32(t + 4 * i, static_cast<uint32_t>(tokens[i]));
  if (!payload.empty()) std::memcpy(t + tokens_bytes(l), payload.data(), payload.size());
  const size_t body = value.size() - kChecksumBytes;
  store_le64(p + body, checksum64(p, body));
  return value;
}

std::optional<std::span<const uint8_t>> decode_block(std::string_view value, const BlockMeta& expected,
                                                     std::span<const int32_t> tokens, std::string* why) {
  const auto reject = [&](std::string reason) -> std::optional<std::span<const uint8_t>> {
    if (why != nullptr) *why = std::move(reason);
    return std::nullopt;
  };
  const BlockLayout& l = expected.layout;
  const size_t size = block_value_size(l);
  if (value.size() != size) return reject(fmt::format("{} bytes, expected {}", value.size(), size));
  const auto* p = reinterpret_cast<const uint8_t*>(value.data());
  if (std::memcmp(p, kMagic, 4) != 0) return reject("no DKVB magic");
  if (load_le32(p + 4) != kBlockCodecVersion) {
    return reject(fmt::format("codec version {}, expected {}", load_le32(p + 4), kBlockCodecVersion));
  }
  const size_t body = size - kChecksumBytes;
  const uint64_t sum = checksum64(p, body);
  if (load_le64(p + body) != sum) {
    return reject(fmt::format("checksum {:016x}, expected {:016x}", load_le64(p + body), sum));
  }
  if (load_le64(p + 8) != expected.identity) {
    return reject(fmt::format("identity {:016x}, expected {:016x}", load_le64(p + 8), expected.identity));
  }
  if (load_le64(p + 16) != expected.hash || load_le64(p + 24) != expected.parent) {
    return reject(fmt::format("block {:016x} after {:016x}, expected {:016x} after {:016x}", load_le64(p + 16),
                              load_le64(p + 24), expected.hash, expected.parent));
  }
  const BlockLayout found{static_cast<int32_t>(load_le32(p + 32)), static_cast<int32_t>(load_le32(p + 36)),
                          static_cast<int64_t>(load_le64(p + 40)), static_cast<int64_t>(load_le64(p + 48))};
  if (!(found == l) || load_le64(p + 56) != static_cast<uint64_t>(l.payload_bytes())) {
    return reject(fmt::format("layout {} tokens, {} layers, {} + {} bytes per layer, expected {}, {}, {} + {}",
                              found.block_size, found.num_layers, found.k_bytes, found.v_bytes, l.block_size,
                              l.num_layers, l.k_bytes, l.v_bytes));
  }
  if (tokens.size() != static_cast<size_t>(l.block_size)) {
    return reject(fmt::format("{} tokens expected, the layout has {}", tokens.size(), l.block_size));
  }
  const uint8_t* t = p + kHeaderBytes;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (static_cast<int32_t>(load_le32(t + 4 * i)) != tokens[i]) {
      return reject(fmt::format("token {} is {}, expected {}", i, static_cast<int32_t>(load_le32(t + 4 * i)), tokens[i]));
    }
  }
  return std::span<const uint8_t>(t + tokens_bytes(l), static_cast<size_t>(l.payload_bytes()));
}

std::span<const uint8_t> block_payload(std::string_view value, const BlockLayout& layout) {
  const size_t offset = kHeaderBytes + tokens_bytes(layout);
  if (value.size() != block_value_size(layout)) {
    fail(ErrorCode::kInvalidArgument, "block_payload: a value of {} bytes, expected {}", value.size(),
         block_value_size(layout));
  }
  return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(value.data()) + offset,
                                  static_cast<size_t>(layout.payload_bytes()));
}

}  // namespace duet
