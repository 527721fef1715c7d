#include "duet/tokenizer/special_tokens.h"

#include <algorithm>
#include <functional>

#include "duet/tokenizer/tokenizer.h"

namespace duet {
namespace {

constexpr uint8_t kAlways = 1;
constexpr uint8_t kParsed = 2;

}  // namespace

void SpecialTokenMatcher::build(const std::vector<std::string>& tokens, const std::vector<TokenType>& types) {
  entries_.clear();
  for (auto& lengths : lengths_by_first_byte_) lengths.clear();
  first_byte_flags_.fill(0);
  num_always_ = num_parsed_ = 0;
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string& text = tokens[id];
    const TokenType type = types[id];
    if (text.empty()) continue;
    bool always = false;
    if (type == TokenType::kUserDefined) {
      always = true;
    } else if (type != TokenType::kControl && type != TokenType::kUnknown) {
      continue;
    }
    if (!entries_.emplace(text, Entry{static_cast<int32_t>(id), always}).second) continue;
    const auto first = static_cast<uint8_t>(text[0]);
    lengths_by_first_byte_[first].push_back(static_cast<uint32_t>(text.size()));
    first_byte_flags_[first] |= always ? kAlways : kParsed;
    ++(always ? num_always_ : num_parsed_);
  }
  for (auto& lengths : lengths_by_first_byte_) {
    std::sort(lengths.begin(), lengths.end(), std::greater<>());
    lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  }
}

void SpecialTokenMatcher::split(std::string_view text, bool parse_special, std::vector<Fragment>& out) const {
  const uint8_t wanted = parse_special ? (kAlways | kParsed) : kAlways;
  size_t plain_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const auto first = static_cast<uint8_t>(text[pos]);
    size_t hit_len = 0;
    int32_t hit_id = -1;
    if (first_byte_flags_[first] & wanted) {
      for (uint32_t len : lengths_by_first_byte_[first]) {
        if (len > text.size() - pos) continue;
        auto it = entries_.find(text.substr(pos, len));
        if (it != entries_.end() && (it->second.always || parse_special)) {
          hit_len = len;
          hit_id = it->second.id;
          break;
        }
      }
    }
    if (hit_id < 0) {
      ++pos;
      continue;
    }
    if (pos > plain_start) out.push_back({text.substr(plain_start, pos - plain_start), -1});
    out.push_back({text.substr(pos, hit_len), hit_id});
    pos += hit_len;
    plain_start = pos;
  }
  if (plain_start < text.size()) out.push_back({text.substr(plain_start), -1});
}

}  // namespace duet
