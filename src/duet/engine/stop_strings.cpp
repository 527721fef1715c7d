#include "duet/engine/stop_strings.h"

#include <algorithm>
#include <utility>

namespace duet {
namespace {

bool is_continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// Where an incomplete UTF-8 character at the end of s begins, or s.size() when s ends on a
// character boundary. Bytes that are not UTF-8 at all count as complete characters.
size_t incomplete_tail(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(n, 4); ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;
    const size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

}  // namespace

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops, bool include_stop) : include_stop_(include_stop) {
  for (std::string& s : stops) {
    if (s.empty()) continue;
    max_len_ = std::max(max_len_, s.size());
    stops_.push_back(std::move(s));
  }
}

StopStringMatcher::Result StopStringMatcher::push(std::string_view text) {
  Result result;
  if (stopped_) return result;
  const size_t old_size = pending_.size();
  pending_.append(text);

  // pending_ held no complete stop string before, so a match ends in the new text. The first
  // occurrence of a stop string is also its earliest-ending one.
  const std::string* best = nullptr;
  size_t best_pos = std::string::npos;
  size_t best_end = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t from = old_size >= s.size() ? old_size - (s.size() - 1) : 0;
    const size_t pos = pending_.find(s, from);
    if (pos == std::string::npos) continue;
    const size_t end = pos + s.size();
    if (end < best_end || (end == best_end && pos < best_pos)) {
      best = &s;
      best_pos = pos;
      best_end = end;
    }
  }
  if (best != nullptr) {
    stopped_ = true;
    result.stopped = true;
    result.matched = *best;
    result.text = pending_.substr(0, include_stop_ ? best_end : best_pos);
    pending_.clear();
    return result;
  }

  // Hold back from the earliest position whose rest of the text is a proper prefix of a stop
  // string: that text may still become one. Everything before it can never be part of a match.
  const size_t size = pending_.size();
  size_t keep = size;
  for (size_t p = size - std::min(size, max_len_ > 0 ? max_len_ - 1 : 0); p < size && keep == size; ++p) {
    const std::string_view tail(pending_.data() + p, size - p);
    for (const std::string& s : stops_) {
      if (s.size() > tail.size() && std::string_view(s).starts_with(tail)) {
        keep = p;
        break;
      }
    }
  }
  // Cut at a character boundary only (a stop string begins with a lead byte, so this only
  // matters for text that ends inside a character, or for stop strings that are not UTF-8).
  keep = std::min(keep, incomplete_tail(pending_));
  while (keep > 0 && keep < size && is_continuation(pending_[keep])) --keep;

  result.text = pending_.substr(0, keep);
  pending_.erase(0, keep);
  return result;
}

std::string StopStringMatcher::flush() {
  if (stopped_) return {};
  return std::exchange(pending_, std::string());
}

}  // namespace duet
