// The safetensors writer: what it writes, the reader reads back exactly (every dtype, empty and
// scalar tensors, each tensor aligned to its element size), and a model split into shards comes
// with an index that names every tensor's file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/formats/safetensors.h"
#include "duet/formats/safetensors_writer.h"
#include "safetensors_fixture.h"

namespace duet::testing {
namespace {

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(seed + i * 13);
  return out;
}

struct Added {
  std::string name;
  SafetensorsDType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

std::vector<Added> sample() {
  return {
      {"one_byte", SafetensorsDType::kI8, {3}, pattern(3, 1)},  // an odd size before wider types
      {"model.embed_tokens.weight", SafetensorsDType::kBF16, {3, 5}, pattern(30, 2)},
      {"scalar", SafetensorsDType::kF32, {}, pattern(4, 3)},
      {"fp8", SafetensorsDType::kF8_E4M3, {2, 3}, pattern(6, 4)},
      {"empty", SafetensorsDType::kF16, {0, 4}, {}},
      {"ids", SafetensorsDType::kI64, {2}, pattern(16, 5)},
      {"qweight", SafetensorsDType::kI32, {4, 1}, pattern(16, 6)},
  };
}

TEST(SafetensorsWriter, ReadsBackExactly) {
  TempFolder dir("st-writer");
  SafetensorsWriter w;
  for (const Added& a : sample()) w.add_tensor(a.name, a.dtype, a.shape, a.data);
  w.set_metadata("producer", "duet");
  const std::string path = dir.path("t.safetensors");
  w.write(path);
  const SafetensorsFile f = SafetensorsFile::open(path);
  ASSERT_EQ(f.tensors().size(), sample().size());
  for (const Added& a : sample()) {
    const SafetensorsTensor* t = f.find(a.name);
    ASSERT_NE(t, nullptr) << a.name;
    EXPECT_EQ(t->dtype, a.dtype) << a.name;
    EXPECT_EQ(t->shape, a.shape) << a.name;
    ASSERT_EQ(t->nbytes, a.data.size()) << a.name;
    EXPECT_TRUE(std::equal(a.data.begin(), a.data.end(), t->data)) << a.name;
    EXPECT_EQ(t->offset % safetensors_dtype_size(a.dtype), 0u) << a.name;
  }
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("producer"), "duet");
  EXPECT_EQ(w.data_size(), 3u + 30 + 4 + 6 + 16 + 16);
}

TEST(SafetensorsWriter, RefusesWhatItCannotWrite) {
  SafetensorsWriter w;
  w.add_tensor("a", SafetensorsDType::kF32, {2}, pattern(8, 1));
  EXPECT_THROW(w.add_tensor("a", SafetensorsDType::kF32, {2}, pattern(8, 1)), Error);
  EXPECT_THROW(w.add_tensor("b", SafetensorsDType::kF32, {3}, pattern(8, 1)), Error);
  EXPECT_THROW(w.add_tensor("c", SafetensorsDType::kF32, {-1}, SafetensorsWriter::Fill{}), Error);
  EXPECT_EQ(w.num_tensors(), 1u);
}

TEST(SafetensorsWriter, ShardsWithAnIndex) {
  TempFolder dir("st-writer");
  SafetensorsWriter w;
  for (int i = 0; i < 5; ++i) {
    w.add_tensor("t" + std::to_string(i), SafetensorsDType::kF32, {10}, pattern(40, static_cast<uint8_t>(i)));
  }
  // Small enough for one file: no index.
  EXPECT_EQ(w.write_model(dir.path("one"), 0), std::vector<std::string>{"model.safetensors"});
  // 100 bytes per shard: two tensors each, the last alone.
  std::filesystem::create_directories(dir.path("sharded"));
  const std::vector<std::string> files = w.write_model(dir.path("sharded"), 100);
  ASSERT_EQ(files.size(), 4u);
  EXPECT_EQ(files[0], "model-00001-of-00003.safetensors");
  EXPECT_EQ(files[2], "model-00003-of-00003.safetensors");
  EXPECT_EQ(files[3], "model.safetensors.index.json");
  std::ifstream in(dir.path("sharded/model.safetensors.index.json"));
  const nlohmann::json index = nlohmann::json::parse(in);
  EXPECT_EQ(index["metadata"]["total_size"], 200);
  ASSERT_EQ(index["weight_map"].size(), 5u);
  for (int i = 0; i < 5; ++i) {
    const std::string name = "t" + std::to_string(i);
    const std::string file = index["weight_map"][name];
    EXPECT_EQ(file, files[static_cast<size_t>(i / 2)]);
    const SafetensorsFile shard = SafetensorsFile::open(dir.path("sharded/" + file));
    const SafetensorsTensor* t = shard.find(name);
    ASSERT_NE(t, nullptr) << name;
    const std::vector<uint8_t> want = pattern(40, static_cast<uint8_t>(i));
    EXPECT_TRUE(std::equal(want.begin(), want.end(), t->data)) << name;
  }
}

}  // namespace
}  // namespace duet::testing
