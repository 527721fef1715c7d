#include "lossy_gguf.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>

#include "duet/core/error.h"
#include "duet/tokenizer/tokenizer.h"
#include "duet/tokenizer/unicode.h"

namespace duet::testing {
namespace {

constexpr std::string_view kFffd = "\xEF\xBF\xBD";
constexpr uint32_t kGgufMagic = 0x46554747;

GgufValue value_from_bytes(GgufType t, const uint8_t* b) {
  auto get = [&](auto v) {
    std::memcpy(&v, b, sizeof v);
    return v;
  };
  switch (t) {
    case GgufType::kUint8: return GgufValue::u8(get(uint8_t{}));
    case GgufType::kInt8: return GgufValue::i8(get(int8_t{}));
    case GgufType::kUint16: return GgufValue::u16(get(uint16_t{}));
    case GgufType::kInt16: return GgufValue::i16(get(int16_t{}));
    case GgufType::kUint32: return GgufValue::u32(get(uint32_t{}));
    case GgufType::kInt32: return GgufValue::i32(get(int32_t{}));
    case GgufType::kUint64: return GgufValue::u64(get(uint64_t{}));
    case GgufType::kInt64: return GgufValue::i64(get(int64_t{}));
    case GgufType::kFloat32: return GgufValue::f32(get(float{}));
    case GgufType::kFloat64: return GgufValue::f64(get(double{}));
    case GgufType::kBool: return GgufValue::boolean(b[0] != 0);
    default: fail(ErrorCode::kInternal, "not a scalar type: {}", gguf_type_name(t));
  }
}

// GGUF v3 serialization of one value (little-endian host assumed, as everywhere in duet).
void serialize(std::string& out, const GgufValue& v) {
  auto pod = [&](auto x) { out.append(reinterpret_cast<const char*>(&x), sizeof x); };
  switch (v.type) {
    case GgufType::kString: {
      const auto& s = std::get<std::string>(v.value);
      pod(uint64_t{s.size()});
      out += s;
      return;
    }
    case GgufType::kArray: {
      const auto& arr = std::get<GgufArray>(v.value);
      pod(static_cast<uint32_t>(arr.elem_type));
      pod(uint64_t{arr.items.size()});
      for (const GgufValue& item : arr.items) serialize(out, item);
      return;
    }
    case GgufType::kFloat32: pod(static_cast<float>(std::get<double>(v.value))); return;
    case GgufType::kFloat64: pod(std::get<double>(v.value)); return;
    case GgufType::kBool: pod(static_cast<uint8_t>(std::get<bool>(v.value))); return;
    default: {
      const size_t w = gguf_scalar_size(v.type);
      uint64_t raw = 0;
      if (const auto* u = std::get_if<uint64_t>(&v.value)) raw = *u;
      else raw = static_cast<uint64_t>(std::get<int64_t>(v.value));
      out.append(reinterpret_cast<const char*>(&raw), w);
    }
  }
}

// A fixed-width field as it survived: known bytes, and -1 where one U+FFFD stands for one lost
// byte (>= 0x80).
struct Pattern {
  std::vector<int> bytes;
  size_t damaged_len = 0;  // bytes the field occupies in the damaged file
  int num_unknown = 0;
};

struct LostScalar {
  size_t kv_index;
  std::vector<uint64_t> candidates;  // raw little-endian values that reproduce the damage
};

class Repairer {
 public:
  explicit Repairer(std::string_view d) : d_(d) {}

  LossyRepair run() {
    if (read_intact<uint32_t>("magic") != kGgufMagic) fail(ErrorCode::kInvalidArgument, "not a GGUF file");
    const uint32_t version = read_intact<uint32_t>("version");
    if (version != 3) fail(ErrorCode::kUnsupported, "GGUF version {} (only 3 is repaired)", version);
    const auto num_tensors = read_intact<uint64_t>("tensor count");
    if (num_tensors != 0) fail(ErrorCode::kUnsupported, "the file has {} tensors; only vocab-only files are repaired", num_tensors);
    num_kv_ = read_intact<uint64_t>("metadata count");

    std::vector<std::pair<size_t, size_t>> spans;
    for (kv_ = 0; kv_ < num_kv_; ++kv_) {
      const size_t start = p_;
      const auto key_len = read_intact<uint64_t>("key length");
      if (key_len == 0 || key_len > 256 || p_ + key_len > d_.size()) fail_here("bad key length {}", key_len);
      std::string key(d_.substr(p_, key_len));
      p_ += key_len;
      key_ = key;
      const auto type = static_cast<GgufType>(read_intact<uint32_t>("value type"));
      out_.metadata.emplace_back(key, parse_value(type));
      spans.emplace_back(start, p_);
    }
    if (p_ != d_.size() && d_.find_first_not_of('\0', p_) != std::string_view::npos) {
      fail_here("{} unexpected bytes after the metadata", d_.size() - p_);
    }
    resolve_lost_scalars();

    // Check: every key/value pair, put through the same lossy round trip, gives its damaged bytes.
    for (size_t i = 0; i < out_.metadata.size(); ++i) {
      if (dropped_.count(i)) continue;
      std::string encoded;
      const uint64_t key_len = out_.metadata[i].first.size();
      encoded.append(reinterpret_cast<const char*>(&key_len), 8);
      encoded += out_.metadata[i].first;
      const auto type = static_cast<uint32_t>(out_.metadata[i].second.type);
      encoded.append(reinterpret_cast<const char*>(&type), 4);
      serialize(encoded, out_.metadata[i].second);
      const auto [start, end] = spans[i];
      if (lossy_utf8_round_trip(encoded) != d_.substr(start, end - start)) {
        fail(ErrorCode::kDataLoss, "the rebuilt value of '{}' does not reproduce the damaged bytes at offset {}",
             out_.metadata[i].first, start);
      }
    }
    std::vector<std::pair<std::string, GgufValue>> kept;
    for (size_t i = 0; i < out_.metadata.size(); ++i) {
      if (!dropped_.count(i)) kept.push_back(std::move(out_.metadata[i]));
    }
    out_.metadata = std::move(kept);
    return std::move(out_);
  }

 private:
  template <typename... Args>
  [[noreturn]] void fail_here(fmt::format_string<Args...> format, Args&&... args) const {
    fail(ErrorCode::kDataLoss, "at offset {} (key '{}'): {}", p_, key_, fmt::format(format, std::forward<Args>(args)...));
  }

  // Whether a replacement character starts within the n bytes at pos (or they run past the end).
  bool damaged(size_t pos, size_t n) const {
    if (pos + n > d_.size()) return true;
    const size_t hit = d_.substr(pos, n + 2).find(kFffd);
    return hit != std::string_view::npos && hit < n;
  }

  template <typename T>
  T read_intact(std::string_view what) {
    if (damaged(p_, sizeof(T))) fail_here("the {} is damaged", what);
    T v;
    std::memcpy(&v, d_.data() + p_, sizeof v);
    p_ += sizeof v;
    return v;
  }

  Pattern walk(size_t pos, size_t width) const {
    Pattern pat;
    size_t q = pos;
    for (size_t i = 0; i < width; ++i) {
      if (q >= d_.size()) fail_here("file ends inside a field");
      if (d_.compare(q, 3, kFffd) == 0) {
        pat.bytes.push_back(-1);
        ++pat.num_unknown;
        q += 3;
      } else {
        pat.bytes.push_back(static_cast<uint8_t>(d_[q]));
        ++q;
      }
    }
    pat.damaged_len = q - pos;
    return pat;
  }

  // Raw values (little-endian) of the field that reproduce its damaged bytes.
  std::vector<uint64_t> candidates(const Pattern& pat, size_t pos) const {
    std::vector<uint64_t> out;
    if (pat.num_unknown > 2) return out;
    const std::string_view seen = d_.substr(pos, pat.damaged_len);
    const int combos = 1 << (7 * pat.num_unknown);
    std::string bytes(pat.bytes.size(), '\0');
    for (int c = 0; c < combos; ++c) {
      int k = 0;
      for (size_t i = 0; i < pat.bytes.size(); ++i) {
        const int b = pat.bytes[i] >= 0 ? pat.bytes[i] : 0x80 | ((c >> (7 * k++)) & 0x7F);
        bytes[i] = static_cast<char>(b);
      }
      if (lossy_utf8_round_trip(bytes) != seen) continue;
      uint64_t v = 0;
      std::memcpy(&v, bytes.data(), std::min<size_t>(bytes.size(), 8));
      out.push_back(v);
    }
    return out;
  }

  // Whether a string array element (or the next key) can start at q: its length field is
  // intact, or lost only in its low byte, and its content is valid UTF-8 followed by another such
  // element, `depth` levels deep.
  bool plausible_next(size_t q, int depth) const {
    if (plausible_kv_start(q)) return true;
    if (q + 8 > d_.size()) return false;
    if (damaged(q, 8)) {  // [FFFD, hi, 0 x 6]: accept without looking further
      return d_.compare(q, 3, kFffd) == 0 && q + 10 <= d_.size() &&
             d_.substr(q + 4, 6).find_first_not_of('\0') == std::string_view::npos;
    }
    uint64_t len = 0;
    std::memcpy(&len, d_.data() + q, 8);
    if (len > d_.size() - q - 8 || !is_valid_utf8(d_.substr(q + 8, len))) return false;
    return depth == 0 || plausible_next(q + 8 + len, depth - 1);
  }

  bool plausible_kv_start(size_t q) const {
    if (q == d_.size()) return true;
    if (q + 8 > d_.size() || damaged(q, 8)) return false;
    uint64_t len = 0;
    std::memcpy(&len, d_.data() + q, 8);
    if (len == 0 || len > 256 || q + 8 + len + 4 > d_.size()) return false;
    const std::string_view key = d_.substr(q + 8, len);
    if (key.find('.') == std::string_view::npos) return false;
    for (char c : key) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.')) return false;
    }
    uint32_t type = 0;
    std::memcpy(&type, d_.data() + q + 8 + len, 4);
    return type <= static_cast<uint32_t>(GgufType::kFloat64);
  }

  std::string parse_string() {
    if (!damaged(p_, 8)) {
      uint64_t len = 0;
      std::memcpy(&len, d_.data() + p_, 8);
      if (p_ + 8 + len > d_.size()) fail_here("string of length {} runs past the end", len);
      std::string s(d_.substr(p_ + 8, len));
      p_ += 8 + len;
      return s;
    }
    const size_t start = p_;
    const Pattern pat = walk(p_, 8);
    for (uint64_t len : candidates(pat, p_)) {
      const size_t content = start + pat.damaged_len;
      const size_t end = content + len;
      if (end > d_.size() || !is_valid_utf8(d_.substr(content, len))) continue;
      if (plausible_next(end, 2)) {
        ++num_lengths_;
        p_ = end;
        return std::string(d_.substr(content, len));
      }
    }
    fail_here("cannot recover a damaged string length");
  }

  GgufValue parse_scalar(GgufType type) {
    const size_t w = gguf_scalar_size(type);
    if (!damaged(p_, w)) {
      GgufValue v = value_from_bytes(type, reinterpret_cast<const uint8_t*>(d_.data() + p_));
      p_ += w;
      return v;
    }
    const Pattern pat = walk(p_, w);
    lost_.push_back({out_.metadata.size(), candidates(pat, p_)});
    p_ += pat.damaged_len;
    return GgufValue{type, uint64_t{0}};  // replaced (or dropped) by resolve_lost_scalars
  }

  // One float of a SentencePiece score array (see the header for the layout guessed here).
  float parse_score(size_t index) {
    if (!damaged(p_, 4)) {
      float v;
      std::memcpy(&v, d_.data() + p_, 4);
      p_ += 4;
      if (v != 0.0f && score_base_ < 0) score_base_ = static_cast<int64_t>(index);
      return v;
    }
    std::vector<float> guesses = {0.0f, -1e9f};
    if (score_base_ >= 0) guesses.push_back(-static_cast<float>(static_cast<int64_t>(index) - score_base_));
    for (float g : guesses) {
      const std::string damaged_form = lossy_utf8_round_trip(std::string_view(reinterpret_cast<const char*>(&g), 4));
      if (d_.compare(p_, damaged_form.size(), damaged_form) == 0) {
        p_ += damaged_form.size();
        if (g != 0.0f && score_base_ < 0) score_base_ = static_cast<int64_t>(index);
        ++num_floats_;
        return g;
      }
    }
    fail_here("cannot recover float element {}", index);
  }

  GgufValue parse_value(GgufType type) {
    if (type == GgufType::kString) return GgufValue::str(parse_string());
    if (type != GgufType::kArray) {
      if (gguf_scalar_size(type) == 0) fail_here("unknown value type {}", static_cast<uint32_t>(type));
      return parse_scalar(type);
    }
    const auto elem = static_cast<GgufType>(read_intact<uint32_t>("array element type"));
    std::optional<uint64_t> count;
    std::set<uint64_t> possible_counts;
    if (!damaged(p_, 8)) {
      count = read_intact<uint64_t>("array count");
    } else {
      const Pattern pat = walk(p_, 8);
      for (uint64_t c : candidates(pat, p_)) possible_counts.insert(c);
      if (possible_counts.empty()) fail_here("cannot recover a damaged array count");
      p_ += pat.damaged_len;
    }

    std::vector<GgufValue> items;
    if (elem == GgufType::kString) {
      while (count ? items.size() < *count : true) {
        if (!count && possible_counts.count(items.size()) && plausible_kv_start(p_)) break;
        if (p_ >= d_.size()) fail_here("array runs past the end of the file");
        items.push_back(GgufValue::str(parse_string()));
      }
    } else if (elem == GgufType::kFloat32 && count) {
      score_base_ = -1;
      for (uint64_t i = 0; i < *count; ++i) items.push_back(GgufValue::f32(parse_score(i)));
    } else {
      const size_t w = gguf_scalar_size(elem);
      if (w == 0) fail_here("arrays of {} are not repaired", gguf_type_name(elem));
      if (!count) {
        size_t end = p_;
        while (end < d_.size() && !plausible_kv_start(end)) ++end;
        if ((end - p_) % w != 0 || !possible_counts.count((end - p_) / w) || damaged(p_, end - p_)) {
          fail_here("cannot recover the count of a damaged {} array", gguf_type_name(elem));
        }
        count = (end - p_) / w;
      }
      for (uint64_t i = 0; i < *count; ++i) {
        if (damaged(p_, w)) fail_here("element {} of a {} array is damaged", i, gguf_type_name(elem));
        items.push_back(value_from_bytes(elem, reinterpret_cast<const uint8_t*>(d_.data() + p_)));
        p_ += w;
      }
    }
    if (!count) ++num_counts_;
    return GgufValue::array(elem, std::move(items));
  }

  const GgufValue* find(std::string_view key) const {
    for (const auto& [k, v] : out_.metadata) {
      if (k == key) return &v;
    }
    return nullptr;
  }

  void resolve_lost_scalars() {
    const GgufValue* tokens = find("tokenizer.ggml.tokens");
    const GgufValue* types = find("tokenizer.ggml.token_type");
    for (const LostScalar& lost : lost_) {
      auto& [key, value] = out_.metadata[lost.kv_index];
      std::vector<uint64_t> picks;
      if (key.ends_with("_token_id") && tokens != nullptr && types != nullptr) {
        const auto& tok = std::get<GgufArray>(tokens->value).items;
        const auto& typ = std::get<GgufArray>(types->value).items;
        for (uint64_t id : lost.candidates) {
          if (id < tok.size() && std::get<int64_t>(typ[id].value) == static_cast<int64_t>(TokenType::kControl)) {
            picks.push_back(id);
          }
        }
        if (picks.size() > 1) {  // a role hint in the key breaks the tie
          const bool begin = key.find("bos") != std::string::npos;
          std::vector<uint64_t> hinted;
          for (uint64_t id : picks) {
            const auto& text = std::get<std::string>(tok[id].value);
            const bool says_begin = text.find("begin") != std::string::npos || text == "<s>";
            const bool says_end = text.find("end") != std::string::npos || text == "</s>";
            if (begin ? says_begin : says_end) hinted.push_back(id);
          }
          picks = hinted;
        }
        if (picks.size() == 1) {
          value = value_from_bytes(value.type, reinterpret_cast<const uint8_t*>(&picks[0]));
          out_.notes.push_back(fmt::format("{}: lost bytes, recovered as {} '{}' (the control token that fits)", key,
                                           picks[0], std::get<std::string>(tok[picks[0]].value)));
          continue;
        }
      }
      dropped_.insert(lost.kv_index);
      out_.notes.push_back(fmt::format("{}: lost bytes, dropped ({} possible values)", key, lost.candidates.size()));
    }
    if (num_lengths_ > 0) out_.notes.push_back(fmt::format("{} damaged string lengths recovered", num_lengths_));
    if (num_counts_ > 0) out_.notes.push_back(fmt::format("{} damaged array counts recovered", num_counts_));
    if (num_floats_ > 0) out_.notes.push_back(fmt::format("{} damaged scores recovered", num_floats_));
  }

  std::string_view d_;
  size_t p_ = 0;
  uint64_t num_kv_ = 0;
  uint64_t kv_ = 0;
  std::string key_;
  int64_t score_base_ = -1;
  size_t num_lengths_ = 0;
  size_t num_counts_ = 0;
  size_t num_floats_ = 0;
  std::vector<LostScalar> lost_;
  std::set<size_t> dropped_;
  LossyRepair out_;
};

}  // namespace

std::string lossy_utf8_round_trip(std::string_view bytes) { return sanitize_utf8(bytes); }

LossyRepair repair_lossy_gguf(std::string_view bytes) { return Repairer(bytes).run(); }

}  // namespace duet::testing
