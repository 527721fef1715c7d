#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "duet/core/error.h"
#include "duet/core/quant.h"
#include "duet/core/random.h"
#include "duet/formats/gguf.h"
#include "duet/formats/gguf_writer.h"

namespace duet {
namespace {

namespace fs = std::filesystem;

class GgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("duet_gguf_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static std::vector<uint8_t> read_all(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  static void write_all(const std::string& p, const std::vector<uint8_t>& bytes) {
    std::ofstream out(p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }

  // A small file with every metadata type and one tensor of each computable type.
  std::string write_sample(uint32_t version = 3) {
    GgufWriter w;
    w.set("general.architecture", GgufValue::str("llama"));
    w.set("test.u8", GgufValue::u8(250));
    w.set("test.i8", GgufValue::i8(-100));
    w.set("test.u16", GgufValue::u16(65000));
    w.set("test.i16", GgufValue::i16(-32000));
    w.set("test.u32", GgufValue::u32(4000000000u));
    w.set("test.i32", GgufValue::i32(-2000000000));
    w.set("test.u64", GgufValue::u64(1ull << 60));
    w.set("test.i64", GgufValue::i64(-(1ll << 60)));
    w.set("test.f32", GgufValue::f32(1.5f));
    w.set("test.f64", GgufValue::f64(-2.25));
    w.set("test.bool", GgufValue::boolean(true));
    w.set("test.string", GgufValue::str("héllo\nworld"));
    w.set("test.strings", GgufValue::string_array({"a", "", "ccc"}));
    w.set("test.nested", GgufValue::array(GgufType::kArray, {GgufValue::i32_array({1, 2}), GgufValue::i32_array({3})}));
    w.set("test.empty", GgufValue::array(GgufType::kFloat32, {}));
    Rng rng(5);
    std::vector<float> values(64);
    for (float& v : values) v = static_cast<float>(rng.uniform() - 0.5);
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
      std::vector<uint8_t> data(row_size(t, 32) * 2);
      quantize_row_ref(t, values.data(), data.data(), 32);
      quantize_row_ref(t, values.data() + 32, data.data() + row_size(t, 32), 32);
      w.add_tensor(std::string("t.") + std::string(dtype_name(t)), t, {32, 2}, data);
    }
    const std::string p = path("sample_v" + std::to_string(version) + ".gguf");
    w.write(p, version);
    return p;
  }

  fs::path dir_;
};

TEST_F(GgufTest, RoundTripsEveryValueType) {
  for (uint32_t version : {2u, 3u}) {
    const GgufFile f = GgufFile::open(write_sample(version));
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.get_string("general.architecture"), "llama");
    EXPECT_EQ(f.get_int("test.u8"), 250);
    EXPECT_EQ(f.get_int("test.i8"), -100);
    EXPECT_EQ(f.get_int("test.u16"), 65000);
    EXPECT_EQ(f.get_int("test.i16"), -32000);
    EXPECT_EQ(f.get_int("test.u32"), 4000000000ll);
    EXPECT_EQ(f.get_int("test.i32"), -2000000000);
    EXPECT_EQ(f.get_int("test.u64"), 1ll << 60);
    EXPECT_EQ(f.get_int("test.i64"), -(1ll << 60));
    EXPECT_EQ(f.get_float("test.f32"), 1.5);
    EXPECT_EQ(f.get_float("test.f64"), -2.25);
    EXPECT_TRUE(f.get_bool_or("test.bool", false));
    EXPECT_EQ(f.get_string("test.string"), "héllo\nworld");
    EXPECT_EQ(f.get_string_array("test.strings"), (std::vector<std::string>{"a", "", "ccc"}));
    const auto& nested = std::get<GgufArray>(f.find("test.nested")->value);
    ASSERT_EQ(nested.items.size(), 2u);
    EXPECT_EQ(std::get<GgufArray>(nested.items[1].value).items.size(), 1u);
    EXPECT_TRUE(f.get_float_array("test.empty").empty());
    EXPECT_EQ(f.metadata().front().first, "general.architecture");  // order kept
    ASSERT_EQ(f.tensors().size(), 5u);
    for (const GgufTensorInfo& t : f.tensors()) {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{32, 2}));
      EXPECT_EQ(t.nbytes, row_size(t.type, 32) * 2);
      EXPECT_EQ((t.data - (t.data - t.offset)) % 32, 0);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 32, 0u) << t.name;  // mmap is page aligned
    }
    const GgufTensorInfo* q = f.find_tensor("t.q4_0");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->type, DType::kQ4_0);
  }
}

TEST_F(GgufTest, TypedGettersNameTheKey) {
  const GgufFile f = GgufFile::open(write_sample());
  try {
    (void)f.get_string("test.u32");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test.u32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("uint32"), std::string::npos) << e.what();
  }
  try {
    (void)f.get_int("no.such.key");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
  EXPECT_EQ(f.get_int_or("no.such.key", 7), 7);
}

TEST_F(GgufTest, RejectsEveryTruncation) {
  const std::string full = write_sample();
  const std::vector<uint8_t> bytes = read_all(full);
  // Only the padding after the last tensor's data may be cut off.
  size_t data_end = 0;
  {
    const GgufFile f = GgufFile::open(full);
    for (const GgufTensorInfo& t : f.tensors()) data_end = std::max<size_t>(data_end, f.data_offset() + t.offset + t.nbytes);
  }
  ASSERT_GT(data_end, bytes.size() - 32);
  const std::string p = path("truncated.gguf");
  for (size_t len = 0; len < bytes.size(); ++len) {
    write_all(p, std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(len)));
    try {
      (void)GgufFile::open(p);
      if (len < data_end) ADD_FAILURE() << "a file truncated to " << len << " of " << bytes.size() << " bytes was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(p), std::string::npos) << msg;
      EXPECT_NE(msg.find("offset"), std::string::npos) << msg;
    }
  }
}

// Random corruptions of the reader's sample (every metadata type, nested arrays): a file the reader
// refuses gets an error naming it; a file it accepts has every tensor inside the file and every
// metadata value readable as its own type; one whose magic was hit is always refused. (Whole
// model files, corrupted and then loaded and run, are tests/engine/corrupt_model_test.)
TEST_F(GgufTest, SurvivesRandomCorruption) {
  const std::vector<uint8_t> bytes = read_all(write_sample());
  const std::string p = path("corrupt.gguf");
  Rng rng(11);
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<uint8_t> copy = bytes;
    const int flips = 1 + static_cast<int>(rng.next() % 4);
    bool magic_hit = false;
    for (int i = 0; i < flips; ++i) {
      // Corrupt the header and metadata region most of the time: that is where parsing happens.
      const size_t limit = rng.next() % 4 == 0 ? copy.size() : std::min<size_t>(copy.size(), 1200);
      const size_t at = rng.next() % limit;
      const uint8_t before = copy[at];
      if (rng.next() % 2) copy[at] ^= static_cast<uint8_t>(1u << (rng.next() % 8));
      else copy[at] = static_cast<uint8_t>(rng.next());
      magic_hit = magic_hit || (at < 4 && copy[at] != before);
    }
    write_all(p, copy);
    try {
      const GgufFile f = GgufFile::open(p);
      EXPECT_FALSE(magic_hit) << "trial " << trial << ": a file with a corrupt magic was accepted";
      for (const GgufTensorInfo& t : f.tensors()) {
        EXPECT_LE(f.data_offset() + t.offset + t.nbytes, f.file_size()) << "trial " << trial << " " << t.name;
      }
      for (const auto& [key, value] : f.metadata()) {
        if (value.type == GgufType::kString) {
          EXPECT_NO_THROW((void)f.get_string(key)) << key;
        }
        if (value.type == GgufType::kFloat32 || value.type == GgufType::kFloat64) {
          EXPECT_NO_THROW((void)f.get_float(key)) << key;
        }
      }
    } catch (const Error& e) {
      ++rejected;
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
  std::printf("%d of 3000 corruptions refused\n", rejected);
}

// Builds a raw header by hand: magic, version, tensor count, kv count.
std::vector<uint8_t> header(uint32_t magic, uint32_t version, uint64_t tensors, uint64_t kvs) {
  std::vector<uint8_t> b(24);
  std::memcpy(b.data(), &magic, 4);
  std::memcpy(b.data() + 4, &version, 4);
  std::memcpy(b.data() + 8, &tensors, 8);
  std::memcpy(b.data() + 16, &kvs, 8);
  return b;
}

void expect_error(const std::string& p, const std::string& fragment) {
  try {
    (void)GgufFile::open(p);
    ADD_FAILURE() << "accepted; expected an error containing '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST_F(GgufTest, ClearErrorsForBadHeaders) {
  const std::string p = path("bad.gguf");
  write_all(p, header(0x12345678, 3, 0, 0));
  expect_error(p, "not a GGUF file");
  write_all(p, header(0x46554747, 1, 0, 0));
  expect_error(p, "version 1 is not supported");
  write_all(p, header(0x46554747, 0x03000000, 0, 0));
  expect_error(p, "big-endian");
  write_all(p, header(0x46554747, 7, 0, 0));
  expect_error(p, "unknown GGUF version 7");
  write_all(p, header(0x46554747, 3, 1ull << 62, 0));
  expect_error(p, "tensor count");
  write_all(p, header(0x46554747, 3, 0, 1ull << 62));
  expect_error(p, "metadata count");
  write_all(p, {});
  expect_error(p, "file ends");
  expect_error(path("missing.gguf"), "cannot open");
}

TEST_F(GgufTest, ClearErrorsForBadTensorsAndValues) {
  const std::string p = path("bad.gguf");
  {
    GgufWriter w;
    w.add_tensor("x", DType::kF32, {4}, std::vector<uint8_t>(16));
    w.write(p);
  }
  std::vector<uint8_t> bytes = read_all(p);
  // Layout after the 24-byte header: name (8 + 1), n_dims (4), dim (8), type (4), offset (8).
  const size_t type_at = 24 + 9 + 4 + 8;
  std::vector<uint8_t> bad = bytes;
  bad[type_at] = 200;
  write_all(p, bad);
  expect_error(p, "unknown type id 200");
  bad = bytes;
  bad[type_at + 4] = 8;  // offset 8: not aligned
  write_all(p, bad);
  expect_error(p, "not a multiple of the alignment");
  bad = bytes;
  bad[type_at + 4 + 1] = 1;  // offset 256: past the end
  write_all(p, bad);
  expect_error(p, "truncated");
  bad = bytes;
  bad[24 + 9] = 5;  // 5 dimensions
  write_all(p, bad);
  expect_error(p, "5 dimensions");
  {
    GgufWriter w;
    w.add_tensor("q", DType::kQ8_0, {32}, std::vector<uint8_t>(34));
    w.write(p);
  }
  bytes = read_all(p);
  bytes[24 + 9 + 4] = 33;  // 33 elements: not a multiple of 32
  write_all(p, bytes);
  expect_error(p, "not a multiple of its block size 32");
  {
    GgufWriter w;
    w.set("k", GgufValue::boolean(true));
    w.write(p);
  }
  bytes = read_all(p);
  bytes[24 + 9 + 4] = 2;  // the bool value, after the key "k" and its type
  write_all(p, bytes);
  expect_error(p, "expected 0 or 1");
}

}  // namespace
}  // namespace duet
