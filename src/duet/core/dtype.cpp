#include "duet/core/dtype.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

#include "duet/core/error.h"

namespace duet {
namespace {

struct Entry {
  uint32_t id;
  DTypeTraits traits;
};

// Block geometry of every GGML type duet can at least describe (inspect, validate sizes).
constexpr std::array<Entry, 33> kTypes = {{
    {0, {"f32", 1, 4, true}},
    {1, {"f16", 1, 2, true}},
    {2, {"q4_0", 32, 18, true}},
    {3, {"q4_1", 32, 20, true}},
    {6, {"q5_0", 32, 22, true}},
    {7, {"q5_1", 32, 24, true}},
    {8, {"q8_0", 32, 34, true}},
    {9, {"q8_1", 32, 36, false}},
    {10, {"q2_k", 256, 84, false}},
    {11, {"q3_k", 256, 110, false}},
    {12, {"q4_k", 256, 144, true}},
    {13, {"q5_k", 256, 176, true}},
    {14, {"q6_k", 256, 210, true}},
    {15, {"q8_k", 256, 292, false}},
    {16, {"iq2_xxs", 256, 66, false}},
    {17, {"iq2_xs", 256, 74, false}},
    {18, {"iq3_xxs", 256, 98, false}},
    {19, {"iq1_s", 256, 50, false}},
    {20, {"iq4_nl", 32, 18, false}},
    {21, {"iq3_s", 256, 110, false}},
    {22, {"iq2_s", 256, 82, false}},
    {23, {"iq4_xs", 256, 136, false}},
    {24, {"i8", 1, 1, false}},
    {25, {"i16", 1, 2, false}},
    {26, {"i32", 1, 4, false}},
    {27, {"i64", 1, 8, false}},
    {28, {"f64", 1, 8, false}},
    {29, {"iq1_m", 256, 56, false}},
    {30, {"bf16", 1, 2, true}},
    {34, {"tq1_0", 256, 54, false}},
    {35, {"tq2_0", 256, 66, false}},
    {39, {"mxfp4", 32, 17, false}},
    {1000, {"fp8_e4m3_b128", 128, 132, true}},
}};

const Entry* find(uint32_t id) {
  for (const Entry& e : kTypes) {
    if (e.id == id) return &e;
  }
  return nullptr;
}

}  // namespace

std::optional<DTypeTraits> dtype_traits(uint32_t id) {
  const Entry* e = find(id);
  if (e == nullptr) return std::nullopt;
  return e->traits;
}

const DTypeTraits& traits(DType type) {
  const Entry* e = find(static_cast<uint32_t>(type));
  if (e == nullptr) fail(ErrorCode::kInvalidArgument, "unknown tensor type id {}", static_cast<uint32_t>(type));
  return e->traits;
}

std::string_view dtype_name(DType type) { return traits(type).name; }

std::optional<DType> parse_dtype(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const Entry& e : kTypes) {
    if (e.traits.name == lower) return static_cast<DType>(e.id);
  }
  return std::nullopt;
}

size_t row_size(DType type, int64_t n) {
  const DTypeTraits& t = traits(type);
  if (type == DType::kFP8_E4M3_B128 && n >= 0) {
    const int64_t rest = n % t.block_size;
    return static_cast<size_t>(n / t.block_size) * t.type_size + (rest > 0 ? sizeof(float) + rest : 0);
  }
  if (n % t.block_size != 0) {
    fail(ErrorCode::kInvalidArgument, "row of {} elements is not a multiple of the {} block size {}", n, t.name,
         t.block_size);
  }
  return static_cast<size_t>(n / t.block_size) * t.type_size;
}

}  // namespace duet
