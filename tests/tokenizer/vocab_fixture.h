// Helpers shared by the tokenizer tests: the shared vocab files and their test vectors, and
// small GGUF files written on the fly.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "duet/formats/gguf.h"
#include "duet/tokenizer/tokenizer.h"

namespace duet::testing {

// DUET_SHARED_TESTDATA/vocab, or "" when this build has no shared test data.
std::string vocab_dir();
// Path of ggml-vocab-NAME.gguf if it exists, otherwise "" and `why` says what is missing.
std::string vocab_path(const std::string& name, std::string* why = nullptr);
// main() of a test over one shared vocabulary: CTest's skip (exit 77, with the reason) when the
// file is absent, else every test.
int run_vocab_tests(const std::string& name, int argc, char** argv);

struct VocabCase {
  std::string text;
  std::vector<int32_t> ids;
};
// The NAME.gguf.inp / .out test vectors. Throws when the two files disagree in length.
std::vector<VocabCase> read_vocab_cases(const std::string& name);

// Loads ggml-vocab-NAME.gguf as any GGUF file is read (strictly: a damaged file is an error).
struct LoadedVocab {
  std::unique_ptr<Tokenizer> tokenizer;
  double open_ms = 0;   // GgufFile::open
  double build_ms = 0;  // Tokenizer::from_gguf
};
LoadedVocab load_vocab(const std::string& name);
// The metadata of ggml-vocab-NAME.gguf.
std::vector<std::pair<std::string, GgufValue>> load_vocab_metadata(const std::string& name);

// A directory for files a test writes, removed with this object.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path(const std::string& file) const { return (dir_ / file).string(); }

 private:
  std::filesystem::path dir_;
};

// Writes a tensor-less GGUF file with this metadata and returns its path.
std::string write_gguf(const std::string& path, const std::vector<std::pair<std::string, GgufValue>>& metadata);

// Tokenizer built from metadata through a real file (written, opened, parsed).
std::unique_ptr<Tokenizer> tokenizer_from_metadata(const std::vector<std::pair<std::string, GgufValue>>& metadata);

// "[1, 2, 3]" and a C-escaped rendering of text, for failure messages.
std::string ids_string(const std::vector<int32_t>& ids);
std::string escaped(const std::string& text);

}  // namespace duet::testing
