// The safetensors reader: valid files read back exactly; every truncation, thousands of random
// corruptions, bad JSON, overlapping, out-of-range, misaligned and mis-sized entries give an Error
// naming the file (and the offset), never a crash. Runs under AddressSanitizer in `make test`.
#include <gtest/gtest.h>

#include "duet/core/error.h"
#include "duet/core/random.h"
#include "duet/formats/safetensors.h"
#include "safetensors_fixture.h"

namespace duet::testing {
namespace {

std::vector<StTensor> sample() {
  std::vector<uint8_t> bf16(2 * 3 * 2), f16(4 * 2), i8 = {1, 2, 3, 250}, fp8(6);
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = static_cast<uint8_t>(i * 7 + 1);
  for (size_t i = 0; i < f16.size(); ++i) f16[i] = static_cast<uint8_t>(i * 5 + 3);
  for (size_t i = 0; i < fp8.size(); ++i) fp8[i] = static_cast<uint8_t>(0x38 + i);
  std::vector<uint8_t> i32(4 * 2);
  i32[0] = 7;
  i32[4] = 0xff;
  return {
      {"model.embed_tokens.weight", "F32", {3, 4}, f32_bytes(12)},
      {"scalar", "F32", {}, f32_bytes(1, 9.0f)},
      {"ids", "I32", {2}, i32},
      {"model.norm.weight", "BF16", {2, 3}, bf16},
      {"half", "F16", {4}, f16},
      {"empty", "F16", {0, 5}, {}},
      {"bytes", "I8", {4}, i8},
      {"fp8", "F8_E4M3", {2, 3}, fp8},
  };
}

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string write(const std::vector<uint8_t>& bytes, const std::string& name = "t.safetensors") {
    write_bytes(dir_.path(name), bytes);
    return dir_.path(name);
  }
  // The message of the Error that opening `bytes` throws ("" when it opens), and its code.
  std::string error_of(const std::vector<uint8_t>& bytes, ErrorCode* code = nullptr) {
    const std::string p = write(bytes);
    try {
      SafetensorsFile::open(p);
    } catch (const Error& e) {
      if (code) *code = e.code();
      return e.what();
    }
    return "";
  }

  TempFolder dir_{"safetensors-test"};
};

TEST_F(SafetensorsTest, ReadsEveryTensorInPlace) {
  const std::vector<StTensor> tensors = sample();
  const std::string p = write(safetensors_bytes(tensors, {{"format", "pt"}, {"note", "x"}}));
  const SafetensorsFile f = SafetensorsFile::open(p);
  ASSERT_EQ(f.tensors().size(), tensors.size());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "x");
  for (const StTensor& t : tensors) {
    const SafetensorsTensor* s = f.find(t.name);
    ASSERT_NE(s, nullptr) << t.name;
    EXPECT_EQ(safetensors_dtype_name(s->dtype), t.dtype);
    EXPECT_EQ(s->shape, t.shape);
    ASSERT_EQ(s->nbytes, t.data.size());
    EXPECT_EQ(std::vector<uint8_t>(s->data, s->data + s->nbytes), t.data) << t.name;
    EXPECT_EQ(s->offset % safetensors_dtype_size(s->dtype), 0u) << t.name;
  }
  EXPECT_EQ(f.find("scalar")->num_elements(), 1);
  EXPECT_EQ(f.find("model.embed_tokens.weight")->shape_string(), "[3, 4]");
  EXPECT_EQ(f.find("missing"), nullptr);
  EXPECT_EQ(safetensors_to_dtype(f.find("model.norm.weight")->dtype), DType::kBF16);
  EXPECT_EQ(safetensors_to_dtype(f.find("fp8")->dtype), std::nullopt);
  // Listed in data order.
  for (size_t i = 1; i < f.tensors().size(); ++i) EXPECT_LE(f.tensors()[i - 1].offset, f.tensors()[i].offset);
  // A file without tensors.
  EXPECT_TRUE(SafetensorsFile::open(write(safetensors_bytes({}), "empty.safetensors")).tensors().empty());
}

TEST_F(SafetensorsTest, RejectsEveryTruncation) {
  const std::vector<uint8_t> bytes = safetensors_bytes(sample());
  for (size_t n = 0; n < bytes.size(); ++n) {
    ErrorCode code = ErrorCode::kInternal;
    const std::string e = error_of(std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<long>(n)), &code);
    ASSERT_FALSE(e.empty()) << "a file cut to " << n << " of " << bytes.size() << " bytes opened";
    EXPECT_EQ(code, ErrorCode::kDataLoss) << e;
    EXPECT_NE(e.find("t.safetensors"), std::string::npos) << e;
    EXPECT_NE(e.find("at offset"), std::string::npos) << e;
  }
}

TEST_F(SafetensorsTest, SurvivesRandomCorruption) {
  const std::vector<uint8_t> bytes = safetensors_bytes(sample());
  Rng rng(11);
  int rejected = 0;
  constexpr int kRuns = 3000;
  for (int run = 0; run < kRuns; ++run) {
    std::vector<uint8_t> bad = bytes;
    const int flips = 1 + static_cast<int>(rng.uniform() * 4);
    for (int i = 0; i < flips; ++i) {
      // Mostly the length and the header, where a flip changes meaning.
      const size_t limit = rng.uniform() < 0.9 ? std::min<size_t>(bad.size(), 8 + 600) : bad.size();
      bad[static_cast<size_t>(rng.uniform() * static_cast<double>(limit))] = static_cast<uint8_t>(rng.uniform() * 256);
    }
    ErrorCode code = ErrorCode::kInternal;
    const std::string e = error_of(bad, &code);
    if (e.empty()) {
      // Opened: every tensor must still lie inside the file.
      const SafetensorsFile f = SafetensorsFile::open(dir_.path("t.safetensors"));
      for (const SafetensorsTensor& t : f.tensors()) ASSERT_LE(t.offset + t.nbytes, f.file_size());
      continue;
    }
    ++rejected;
    EXPECT_TRUE(code == ErrorCode::kDataLoss || code == ErrorCode::kUnsupported) << e;
    EXPECT_NE(e.find("t.safetensors"), std::string::npos) << e;
  }
  EXPECT_GT(rejected, kRuns / 2);
}

TEST_F(SafetensorsTest, BadHeadersGiveClearErrors) {
  const std::vector<uint8_t> data = f32_bytes(4);
  auto expect = [&](const std::vector<uint8_t>& bytes, const std::string& part, ErrorCode want = ErrorCode::kDataLoss) {
    ErrorCode code = ErrorCode::kInternal;
    const std::string e = error_of(bytes, &code);
    EXPECT_NE(e.find(part), std::string::npos) << "expected '" << part << "' in: " << e;
    EXPECT_EQ(code, want) << e;
  };
  expect(safetensors_raw("{\"a\": {\"dtype\": \"F32\", ", data), "does not parse");
  expect(safetensors_raw("[1, 2]", {}), "expected an object");
  expect(safetensors_raw(R"({"a": 3})", {}), "tensor 'a' is described by a JSON number");
  expect(safetensors_raw(R"({"a": {"shape": [4], "data_offsets": [0, 16]}})", data), "no dtype");
  expect(safetensors_raw(R"({"a": {"dtype": "F33", "shape": [4], "data_offsets": [0, 16]}})", data),
         "dtype 'F33'", ErrorCode::kUnsupported);
  expect(safetensors_raw(R"({"a": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})", data),
         "expected non-negative integers");
  expect(safetensors_raw(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0]}})", data), "data_offsets [begin, end]");
  expect(safetensors_raw(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})", data),
         "needs 12 bytes, but its data_offsets [0, 16] hold 16");
  expect(safetensors_raw(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}})", data), "end is before");
  expect(safetensors_raw(R"({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}})", data),
         "extends past the end of the file");
  expect(safetensors_raw(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296], "data_offsets": [0, 16]}})", data),
         "overflows");
  // Two tensors over the same bytes, a gap, bytes left over.
  expect(safetensors_raw(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
                         R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", data),
         "overlaps tensor 'a'");
  expect(safetensors_raw(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", data), "belong to no tensor");
  expect(safetensors_raw(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", data),
         "the data section holds 16 bytes");
  // An F32 tensor after 2 bytes of BF16: misaligned (the header is 8-byte padded here).
  expect(safetensors_raw(R"({"a": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}, "b": {"dtype": "F32", "shape": [3], "data_offsets": [2, 14]}})",
                         std::vector<uint8_t>(14)),
         "not a multiple of its element size 4");
  expect(safetensors_raw(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                         std::vector<uint8_t>(8)),
         "names 'a' twice");
  expect(safetensors_raw(R"({"__metadata__": {"k": 1}})", {}), "__metadata__ entry 'k'");
  // A header length beyond the file or the format's limit.
  std::vector<uint8_t> huge = safetensors_raw("{}", {});
  huge[5] = 1;
  expect(huge, "more than the limit");
  huge = safetensors_raw("{}", {});
  huge[0] = 200;
  expect(huge, "is more than the 8 bytes that follow");
  expect({1, 2, 3}, "file ends while reading the header length");
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  try {
    SafetensorsFile::open(dir_.path("nope.safetensors"));
    FAIL() << "opened a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("nope.safetensors"), std::string::npos);
  }
}

}  // namespace
}  // namespace duet::testing
