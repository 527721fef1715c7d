#include "vocab_fixture.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "duet/core/error.h"
#include "duet/formats/gguf_writer.h"

namespace duet::testing {
namespace {

constexpr std::string_view kSeparator = "\n__ggml_vocab_test__\n";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCode::kNotFound, "cannot open '{}'", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::string vocab_dir() {
#ifdef DUET_SHARED_TESTDATA
  return std::string(DUET_SHARED_TESTDATA) + "/vocab";
#else
  return "";
#endif
}

int run_vocab_tests(const std::string& name, int argc, char** argv) {
  std::string why;
  if (vocab_path(name, &why).empty()) {
    std::printf("skipped: %s\n", why.c_str());
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

std::string vocab_path(const std::string& name, std::string* why) {
  const std::string dir = vocab_dir();
  if (dir.empty()) {
    if (why) *why = "this build defines no DUET_SHARED_TESTDATA";
    return "";
  }
  const std::string path = dir + "/ggml-vocab-" + name + ".gguf";
  if (!std::filesystem::exists(path)) {
    if (why) *why = fmt::format("'{}' does not exist (shared test data not available)", path);
    return "";
  }
  return path;
}

std::vector<VocabCase> read_vocab_cases(const std::string& name) {
  const std::string base = vocab_dir() + "/ggml-vocab-" + name + ".gguf";
  const std::string inp = read_file(base + ".inp");
  const std::string out = read_file(base + ".out");

  std::vector<std::string> texts;
  size_t pos = 0;
  for (size_t hit; (hit = inp.find(kSeparator, pos)) != std::string::npos; pos = hit + kSeparator.size()) {
    texts.push_back(inp.substr(pos, hit - pos));
  }
  if (pos != inp.size()) fail(ErrorCode::kInvalidArgument, "'{}.inp' has text after its last separator", base);

  std::vector<std::string> lines;
  pos = 0;
  for (size_t hit; (hit = out.find('\n', pos)) != std::string::npos; pos = hit + 1) lines.push_back(out.substr(pos, hit - pos));
  if (pos != out.size()) lines.push_back(out.substr(pos));
  if (lines.size() != texts.size()) {
    fail(ErrorCode::kInvalidArgument, "'{}.inp' has {} cases but '{}.out' has {} lines", base, texts.size(), base,
         lines.size());
  }

  std::vector<VocabCase> cases;
  for (size_t i = 0; i < texts.size(); ++i) {
    VocabCase c{texts[i], {}};
    std::istringstream ss(lines[i]);
    for (int64_t id; ss >> id;) c.ids.push_back(static_cast<int32_t>(id));
    cases.push_back(std::move(c));
  }
  return cases;
}

LoadedVocab load_vocab(const std::string& name) {
  std::string why;
  const std::string path = vocab_path(name, &why);
  if (path.empty()) fail(ErrorCode::kNotFound, "{}", why);
  LoadedVocab v;
  auto t0 = std::chrono::steady_clock::now();
  const GgufFile file = GgufFile::open(path);
  v.open_ms = ms_since(t0);
  t0 = std::chrono::steady_clock::now();
  v.tokenizer = Tokenizer::from_gguf(file);
  v.build_ms = ms_since(t0);
  return v;
}

std::vector<std::pair<std::string, GgufValue>> load_vocab_metadata(const std::string& name) {
  std::string why;
  const std::string path = vocab_path(name, &why);
  if (path.empty()) fail(ErrorCode::kNotFound, "{}", why);
  return GgufFile::open(path).metadata();
}

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  dir_ = std::filesystem::temp_directory_path() /
         fmt::format("duet-tokenizer-test-{}-{}", static_cast<long>(::getpid()), counter++);
  std::filesystem::create_directories(dir_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string write_gguf(const std::string& path, const std::vector<std::pair<std::string, GgufValue>>& metadata) {
  GgufWriter writer;
  for (const auto& [key, value] : metadata) writer.set(key, value);
  writer.write(path);
  return path;
}

std::unique_ptr<Tokenizer> tokenizer_from_metadata(const std::vector<std::pair<std::string, GgufValue>>& metadata) {
  TempDir dir;
  const GgufFile file = GgufFile::open(write_gguf(dir.path("vocab.gguf"), metadata));
  return Tokenizer::from_gguf(file);
}

std::string ids_string(const std::vector<int32_t>& ids) { return fmt::format("[{}]", fmt::join(ids, ", ")); }

std::string escaped(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      default:
        if (c < 0x20 || c == 0x7F) out += fmt::format("\\x{:02x}", c);
        else out.push_back(static_cast<char>(c));
    }
  }
  return out + "\"";
}

}  // namespace duet::testing
