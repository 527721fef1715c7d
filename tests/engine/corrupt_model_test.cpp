// Random corruptions of a whole model file (a tiny llama with its tokenizer): every file the GGUF
// reader accepts is then loaded as the server loads a model (backend, model, tokenizer, KV pool)
// and given a request, and must either work or fail with a duet::Error; nothing may crash or read
// out of bounds (this test runs under AddressSanitizer in `make test`). What the reader refuses
// must be refused with an error naming the file.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "duet/core/error.h"
#include "duet/core/random.h"
#include "duet/formats/gguf.h"
#include "engine_fixture.h"

namespace duet {
namespace {

std::vector<uint8_t> read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const std::string& p, const std::vector<uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// On the llama model and on the deepseek2 one (MLA, experts, routing).
class CorruptModel : public ::testing::TestWithParam<bool> {};

TEST_P(CorruptModel, EveryAcceptedCorruptionLoadsOrFailsCleanly) {
  const std::string& model = GetParam() ? testing::tiny_moe_model_path() : testing::tiny_model_path();
  const std::vector<uint8_t> bytes = read_all(model);
  const size_t metadata_end = GgufFile::open(model).data_offset();
  ASSERT_GT(metadata_end, 1000u);
  const std::string p =
      (std::filesystem::temp_directory_path() / ("duet_corrupt_model_" + std::to_string(::getpid()) + ".gguf")).string();
  Rng rng(23);
  int rejected = 0, refused = 0, ran = 0;
  // Fewer for the slower deepseek2 model; 20,000 of each were run once without a failure.
  const int kTrials = GetParam() ? 1500 : 3000;
  for (int trial = 0; trial < kTrials; ++trial) {
    std::vector<uint8_t> copy = bytes;
    const int flips = 1 + static_cast<int>(rng.next() % 4);
    for (int i = 0; i < flips; ++i) {
      // Mostly the header and metadata (hyper-parameters, the tokenizer, the tensor table), where
      // parsing happens; sometimes the weights.
      const size_t limit = rng.next() % 4 == 0 ? copy.size() : metadata_end;
      const size_t at = rng.next() % limit;
      if (rng.next() % 2) copy[at] ^= static_cast<uint8_t>(1u << (rng.next() % 8));
      else copy[at] = static_cast<uint8_t>(rng.next());
    }
    write_all(p, copy);
    std::shared_ptr<const GgufFile> file;
    try {
      file = std::make_shared<const GgufFile>(GgufFile::open(p));
    } catch (const Error& e) {
      ++rejected;
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "trial " << trial << ": " << e.what();
      continue;
    }
    // Accepted by the reader: load it as a model and run a request through it.
    try {
      LLMEngine engine(file, testing::small_config(256));
      SamplingParams params;
      params.temperature = 0.0f;
      params.max_tokens = 2;
      params.ignore_eos = true;
      engine.add_request("r", {1, 2, 3}, params);
      for (int step = 0; step < 20 && engine.has_unfinished(); ++step) (void)engine.step();
      ++ran;
    } catch (const Error&) {
      ++refused;  // a clean refusal: the server would answer /health 503 with this message
    } catch (const std::exception& e) {
      const std::string kept = p + ".trial" + std::to_string(trial);
      std::filesystem::copy_file(p, kept, std::filesystem::copy_options::overwrite_existing);
      ADD_FAILURE() << "trial " << trial << ": not a duet::Error: " << e.what() << " (the file is kept as " << kept
                    << ")";
    }
  }
  std::filesystem::remove(p);
  std::printf("%d corruptions: %d refused by the reader; of the %d accepted, %d refused with an error when loaded or "
              "run, %d loaded and ran\n",
              kTrials, rejected, kTrials - rejected, refused, ran);
  // Both outcomes occur, so both paths were exercised.
  EXPECT_GT(rejected, 0);
  EXPECT_GT(ran, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, CorruptModel, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "deepseek2" : "llama"; });

}  // namespace
}  // namespace duet
