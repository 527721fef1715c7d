// UTF-8 helpers for the tokenizers: strict decoding, validation with U+FFFD replacement, and the
// GPT-2 byte-to-unicode mapping that byte-level BPE vocabularies are written in.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace duet {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

// Appends the UTF-8 encoding of `cp` (which must be a Unicode scalar value).
void append_utf8(std::string& out, uint32_t cp);

// Length in bytes of the valid UTF-8 sequence starting at s[pos], or 0 when the bytes there are
// not a complete, well-formed sequence (overlong forms, surrogates and values above U+10FFFF are
// rejected). On success `cp` receives the code point.
size_t decode_utf8(std::string_view s, size_t pos, uint32_t& cp);

// Length of the maximal prefix of s[pos..] that could still begin a well-formed sequence
// (the "maximal subpart" of Unicode's replacement rules); at least 1. Used to replace an invalid
// sequence with one U+FFFD and to know how far an incomplete tail may grow.
size_t utf8_maximal_subpart(std::string_view s, size_t pos);

bool is_valid_utf8(std::string_view s);

// Replaces each ill-formed subsequence with U+FFFD, like every standard UTF-8 decoder does.
std::string sanitize_utf8(std::string_view s);

// Length of the longest prefix of `s` that does not end in the middle of a sequence that could
// still become valid when more bytes arrive. Everything after it (at most 3 bytes) is such an
// incomplete but so-far well-formed sequence.
size_t utf8_complete_prefix(std::string_view s);

// GPT-2's reversible byte-to-unicode table: printable Latin-1 bytes map to themselves, the other
// 68 bytes to U+0100.. in order. Entries are UTF-8 strings.
const std::array<std::string, 256>& byte_to_unicode();

// The byte a code point of byte_to_unicode() stands for, or -1 when it is not in the table.
int unicode_to_byte(uint32_t cp);

// Encodes raw bytes in the byte-level alphabet ("hello world" -> "helloĠworld").
std::string bytes_to_unicode_text(std::string_view bytes);

}  // namespace duet
