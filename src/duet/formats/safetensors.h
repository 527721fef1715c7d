// safetensors files (Hugging Face): an 8-byte little-endian header length, a JSON header that maps
// each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the
// byte after the header) plus an optional "__metadata__" object of strings, then the tensor data.
// The file is mapped and the tensors are used in place. Every offset is checked: the tensors must
// tile the data section exactly (no overlap, no gap, nothing past the end), each one must hold
// exactly its shape's bytes and start aligned to its element size, as the reference
// implementation requires. A malformed file gets an Error naming the file, the byte offset and
// what was wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "duet/core/dtype.h"
#include "duet/core/mapped_file.h"

namespace duet {

// Element types of the safetensors format. Only F32, F16 and BF16 map to types duet computes
// with; the others are read so that the file can be listed.
enum class SafetensorsDType {
  kBool,
  kU8,
  kI8,
  kF8_E5M2,
  kF8_E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
};

std::string_view safetensors_dtype_name(SafetensorsDType type);  // "BF16", "F8_E4M3", ...
std::optional<SafetensorsDType> parse_safetensors_dtype(std::string_view name);
size_t safetensors_dtype_size(SafetensorsDType type);
// The GGML type of the same bits (F32, F16, BF16, I8, I16, I32, I64, F64), or nullopt.
std::optional<DType> safetensors_to_dtype(SafetensorsDType type);

struct SafetensorsTensor {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;  // row-major, as PyTorch has it: shape.back() is the innermost
  uint64_t offset = 0;         // of the data within the file (header included)
  size_t nbytes = 0;
  const uint8_t* data = nullptr;

  int64_t num_elements() const;
  std::string shape_string() const;  // "[32256, 2048]"
};

class SafetensorsFile {
 public:
  // Maps and parses `path`. Throws Error (kNotFound, kDataLoss for a malformed file,
  // kUnsupported for an unknown dtype) naming the file.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  size_t file_size() const { return map_->size(); }
  // Tensors in the order of their data.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(std::string_view name) const;
  // "__metadata__" (string values only), empty when absent.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The mapping; tensors point into it, so it must live while they are used.
  const std::shared_ptr<const MappedFile>& mapping() const { return map_; }

 private:
  SafetensorsFile() = default;

  std::string path_;
  std::shared_ptr<const MappedFile> map_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace duet
