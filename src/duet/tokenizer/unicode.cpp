#include "duet/tokenizer/unicode.h"

namespace duet {
namespace {

// Number of bytes a sequence with this lead byte has, or 0 when it cannot lead a sequence.
size_t sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Valid range of the second byte after `lead` (the later bytes are always 0x80..0xBF).
void second_byte_range(uint8_t lead, uint8_t& lo, uint8_t& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (lead == 0xE0) lo = 0xA0;       // no overlong 3-byte forms
  else if (lead == 0xED) hi = 0x9F;  // no surrogates
  else if (lead == 0xF0) lo = 0x90;  // no overlong 4-byte forms
  else if (lead == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
}

// How many bytes of s[pos..] form a well-formed (possibly incomplete) prefix of one sequence.
size_t valid_prefix_length(std::string_view s, size_t pos, size_t& expected) {
  const auto lead = static_cast<uint8_t>(s[pos]);
  expected = sequence_length(lead);
  if (expected == 0) return 0;
  size_t n = 1;
  while (n < expected && pos + n < s.size()) {
    const auto b = static_cast<uint8_t>(s[pos + n]);
    uint8_t lo = 0x80, hi = 0xBF;
    if (n == 1) second_byte_range(lead, lo, hi);
    if (b < lo || b > hi) break;
    ++n;
  }
  return n;
}

struct ByteTables {
  std::array<std::string, 256> to_unicode;
  std::array<int16_t, 0x144> to_byte;  // code points 0..0x143 cover the whole table
};

const ByteTables& byte_tables() {
  static const ByteTables tables = [] {
    ByteTables t;
    t.to_byte.fill(-1);
    uint32_t next_extra = 0x100;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const uint32_t cp = printable ? b : next_extra++;
      append_utf8(t.to_unicode[b], cp);
      t.to_byte[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return tables;
}

}  // namespace

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t decode_utf8(std::string_view s, size_t pos, uint32_t& cp) {
  size_t expected = 0;
  const size_t n = valid_prefix_length(s, pos, expected);
  if (n == 0 || n < expected) return 0;
  const auto lead = static_cast<uint8_t>(s[pos]);
  if (n == 1) {
    cp = lead;
    return 1;
  }
  cp = lead & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<uint8_t>(s[pos + i]) & 0x3F);
  return n;
}

size_t utf8_maximal_subpart(std::string_view s, size_t pos) {
  size_t expected = 0;
  const size_t n = valid_prefix_length(s, pos, expected);
  return n == 0 ? 1 : n;
}

bool is_valid_utf8(std::string_view s) {
  uint32_t cp = 0;
  for (size_t pos = 0; pos < s.size();) {
    if (static_cast<uint8_t>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t n = decode_utf8(s, pos, cp);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  uint32_t cp = 0;
  for (size_t pos = 0; pos < s.size();) {
    const size_t n = decode_utf8(s, pos, cp);
    if (n > 0) {
      out.append(s.substr(pos, n));
      pos += n;
    } else {
      append_utf8(out, kReplacementChar);
      pos += utf8_maximal_subpart(s, pos);
    }
  }
  return out;
}

size_t utf8_complete_prefix(std::string_view s) {
  // The last sequence starts at most 3 bytes before the end.
  const size_t size = s.size();
  for (size_t back = 1; back <= 3 && back <= size; ++back) {
    const size_t pos = size - back;
    const auto b = static_cast<uint8_t>(s[pos]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: keep looking for its lead
    size_t expected = 0;
    const size_t n = valid_prefix_length(s, pos, expected);
    // Hold back only a well-formed prefix that is still missing bytes.
    return (n == back && n < expected) ? pos : size;
  }
  return size;
}

const std::array<std::string, 256>& byte_to_unicode() { return byte_tables().to_unicode; }

int unicode_to_byte(uint32_t cp) {
  const ByteTables& t = byte_tables();
  return cp < t.to_byte.size() ? t.to_byte[cp] : -1;
}

std::string bytes_to_unicode_text(std::string_view bytes) {
  const auto& table = byte_to_unicode();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += table[static_cast<uint8_t>(c)];
  return out;
}

}  // namespace duet
