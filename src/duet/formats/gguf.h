// GGUF (versions 2 and 3): metadata of every value type, including nested arrays, and tensor
// infos whose data is used in place through mmap. Every read is bounds-checked; a malformed file
// gets an Error naming the file, the byte offset and what was wrong.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "duet/core/dtype.h"
#include "duet/core/mapped_file.h"

namespace duet {

enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

std::string_view gguf_type_name(GgufType type);
// Bytes of one value of a fixed-size type; 0 for strings and arrays.
size_t gguf_scalar_size(GgufType type);

struct GgufValue;

struct GgufArray {
  GgufType elem_type = GgufType::kUint8;
  std::vector<GgufValue> items;
};

// One metadata value. Integers of every width are held as int64/uint64 with their declared type.
struct GgufValue {
  GgufType type = GgufType::kUint8;
  std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray> value;

  static GgufValue u8(uint8_t v) { return {GgufType::kUint8, uint64_t{v}}; }
  static GgufValue i8(int8_t v) { return {GgufType::kInt8, int64_t{v}}; }
  static GgufValue u16(uint16_t v) { return {GgufType::kUint16, uint64_t{v}}; }
  static GgufValue i16(int16_t v) { return {GgufType::kInt16, int64_t{v}}; }
  static GgufValue u32(uint32_t v) { return {GgufType::kUint32, uint64_t{v}}; }
  static GgufValue i32(int32_t v) { return {GgufType::kInt32, int64_t{v}}; }
  static GgufValue u64(uint64_t v) { return {GgufType::kUint64, v}; }
  static GgufValue i64(int64_t v) { return {GgufType::kInt64, v}; }
  static GgufValue f32(float v) { return {GgufType::kFloat32, double{v}}; }
  static GgufValue f64(double v) { return {GgufType::kFloat64, v}; }
  static GgufValue boolean(bool v) { return {GgufType::kBool, v}; }
  static GgufValue str(std::string v) { return {GgufType::kString, std::move(v)}; }
  static GgufValue array(GgufType elem_type, std::vector<GgufValue> items) {
    return {GgufType::kArray, GgufArray{elem_type, std::move(items)}};
  }
  static GgufValue string_array(const std::vector<std::string>& items);
  static GgufValue f32_array(const std::vector<float>& items);
  static GgufValue i32_array(const std::vector<int32_t>& items);

  bool is_integer() const;
  bool is_float() const { return type == GgufType::kFloat32 || type == GgufType::kFloat64; }
  // Short human-readable rendering; arrays show their length and first items.
  std::string to_string(size_t max_items = 8) const;
};

struct GgufTensorInfo {
  std::string name;
  DType type = DType::kF32;
  std::vector<int64_t> shape;  // GGML order: shape[0] is the innermost (row) dimension
  uint64_t offset = 0;         // relative to the start of the data section
  size_t nbytes = 0;
  const uint8_t* data = nullptr;

  int64_t num_elements() const;
  std::string shape_string() const;  // "[2048, 32256]"
};

class GgufFile {
 public:
  // Maps and parses `path`. Throws Error (kNotFound, kDataLoss, kUnsupported, ...) on failure.
  static GgufFile open(const std::string& path);
  // A file built in memory (a Hugging Face folder read as GGUF): `metadata` in order, `tensors`
  // whose data points into memory that `keep_alive` owns (mapped shards, owned buffers); it is
  // kept for the life of the GgufFile. version() is 0 and file_size() the tensors' bytes.
  // Throws kInvalidArgument for a duplicate key or tensor name, or a tensor without data.
  static GgufFile assemble(std::string path, std::vector<std::pair<std::string, GgufValue>> metadata,
                           std::vector<GgufTensorInfo> tensors, std::vector<std::shared_ptr<const void>> keep_alive);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  size_t file_size() const { return map_ ? map_->size() : assembled_bytes_; }
  bool assembled() const { return version_ == 0; }

  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed getters. The *_or variants return the fallback when the key is absent; every getter
  // throws kInvalidArgument naming the key when it is present with an incompatible type.
  std::string get_string(std::string_view key) const;
  std::string get_string_or(std::string_view key, std::string fallback) const;
  int64_t get_int(std::string_view key) const;
  int64_t get_int_or(std::string_view key, int64_t fallback) const;
  double get_float(std::string_view key) const;
  double get_float_or(std::string_view key, double fallback) const;
  bool get_bool_or(std::string_view key, bool fallback) const;
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<float> get_float_array(std::string_view key) const;
  std::vector<int32_t> get_int_array(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

 private:
  GgufFile() = default;
  const GgufValue& require(std::string_view key) const;

  std::string path_;
  std::shared_ptr<MappedFile> map_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
  std::vector<std::shared_ptr<const void>> keep_alive_;
  size_t assembled_bytes_ = 0;
};

}  // namespace duet
