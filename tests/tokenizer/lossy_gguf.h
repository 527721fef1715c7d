// Test-data repair for GGUF vocabulary files that went through a lossy UTF-8 round trip.
//
// The shared vocab files (testdata/vocab/ggml-vocab-*.gguf) reached this project as text: every
// byte sequence that is not valid UTF-8 was replaced by U+FFFD (EF BF BD). Token strings and
// merges are valid UTF-8 and survive; what breaks are binary fields with bytes >= 0x80: string
// lengths of 128 bytes and more, array counts, some token ids, and most float scores. GGUF
// readers rightly reject such a file.
//
// repair_lossy_gguf() rebuilds the metadata of such a file (vocab-only files, no tensors):
//   - lengths and counts are recovered from the structure (the one value that makes the next
//     field line up);
//   - float array elements are recovered from the known layout of SentencePiece scores written
//     by llama.cpp's converter (0 for special/byte pieces, -1e9 for user-defined ones, and
//     -(id - first scored id) for the rest);
//   - lost token ids are recovered when exactly one control token fits the surviving bytes (a
//     role hint in the key, "bos"/"eos", breaks a tie between e.g. begin/end of sentence);
//   - any other lost scalar is dropped and listed in the notes.
// Every recovered value is checked by putting it through the same lossy round trip: the result
// must reproduce the damaged bytes of its key/value pair exactly. Throws Error when it cannot.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "duet/formats/gguf.h"

namespace duet::testing {

struct LossyRepair {
  std::vector<std::pair<std::string, GgufValue>> metadata;  // in file order
  std::vector<std::string> notes;                           // what was recovered or dropped
};

LossyRepair repair_lossy_gguf(std::string_view bytes);

// The lossy round trip itself: each ill-formed UTF-8 subsequence becomes U+FFFD.
std::string lossy_utf8_round_trip(std::string_view bytes);

}  // namespace duet::testing
