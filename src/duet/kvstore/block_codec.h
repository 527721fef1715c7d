// The Redis KV tier's block format: where a block lives (its key) and what is stored there (its
// value). Knows no model: the engine hands it hashes, tokens and the bytes of a block's K/V rows.
//
// Key:   duet:kv:v<version>:<identity>:<chain>     (identity and chain as 16 hex digits)
// Value: header | tokens (int32 each) | payload | checksum
//        header: magic "DKVB", version, identity, chain hash, parent hash, block size, layers,
//        K and V bytes per layer, payload bytes (all little-endian); payload: per layer its K
//        rows then its V rows; checksum: checksum64 of everything before it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace duet {

// Bumped whenever the value's layout or the meaning of its payload changes: it is part of every
// key, so an engine never reads blocks of another version.
inline constexpr uint32_t kBlockCodecVersion = 1;

// The shape of one block's storage.
struct BlockLayout {
  int32_t block_size = 0;  // tokens
  int32_t num_layers = 0;
  int64_t k_bytes = 0;  // one layer's K rows of one block
  int64_t v_bytes = 0;  // one layer's V rows of one block (0: no V, as for MLA)

  int64_t payload_bytes() const { return num_layers * (k_bytes + v_bytes); }
  bool operator==(const BlockLayout&) const = default;
};

// What a block is: whose (identity), which prefix (its chained hash and its parent's).
struct BlockMeta {
  uint64_t identity = 0;
  uint64_t hash = 0;
  uint64_t parent = 0;
  BlockLayout layout;
};

// A 64-bit hash of bytes, seeded: four independent lanes over 8-byte words, then the tail and
// the length. Detects corruption; it is not a cryptographic hash.
uint64_t checksum64(const void* data, size_t size, uint64_t seed = 0);

// The identity of a tier's blocks: the model's fingerprint, the cache dtype's name, the layout
// (block size, layers, bytes per layer) and the codec version. Anything that makes two engines'
// blocks incompatible gives another identity.
uint64_t kv_tier_identity(uint64_t model_fingerprint, std::string_view kv_dtype, const BlockLayout& layout);

// "duet:kv:v1:0123456789abcdef:fedcba9876543210"
std::string block_key(uint64_t identity, uint64_t hash);

// Bytes of the value of a block of this layout.
size_t block_value_size(const BlockLayout& layout);
// The value for a block: `tokens` must be block_size long and `payload` payload_bytes() long
// (throws kInvalidArgument otherwise).
std::string encode_block(const BlockMeta& meta, std::span<const int32_t> tokens, std::span<const uint8_t> payload);

// Checks `value` against what the reader expects (identity, hash, parent, layout, tokens, size,
// checksum). Returns the payload (a view into `value`), or nullopt with the first mismatch in
// `why` (when given).
std::optional<std::span<const uint8_t>> decode_block(std::string_view value, const BlockMeta& expected,
                                                     std::span<const int32_t> tokens, std::string* why = nullptr);

// The payload of a value decode_block accepted for this layout (no checks).
std::span<const uint8_t> block_payload(std::string_view value, const BlockLayout& layout);

}  // namespace duet
