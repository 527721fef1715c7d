#include "fuzz_common.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

#include "duet/core/error.h"
#include "duet/tokenizer/bpe_trainer.h"

namespace duet::fuzz {

namespace {

struct ScratchDir {
  std::string path;
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string base = tmp != nullptr && *tmp != '\0' ? tmp : "/dev/shm";
    if (!std::filesystem::is_directory(base)) base = "/tmp";
    path = base + "/duet-fuzz-" + std::to_string(getpid());
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

const std::string& scratch_dir() {
  static ScratchDir dir;
  return dir.path;
}

std::string write_scratch(const std::string& name, std::string_view data) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!out) fail(ErrorCode::kUnavailable, "cannot write the scratch file '{}'", path);
  return path;
}

const GgufFile& tiny_vocab_file() {
  static const GgufFile file = [] {
    const TrainedVocab vocab = train_bpe(builtin_corpus(), 320, "deepseek-llm");
    auto metadata = tokenizer_metadata(vocab, "deepseek-llm");
    metadata.emplace_back("general.architecture", GgufValue::str("llama"));
    return GgufFile::assemble("tiny-vocab", std::move(metadata), {}, {});
  }();
  return file;
}

const Tokenizer& tiny_tokenizer() {
  static const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_gguf(tiny_vocab_file());
  return *tokenizer;
}

}  // namespace duet::fuzz
