// Test helper: safetensors files written byte by byte (the format is small enough that the tests
// spell it out, independent of the reader), and a temporary folder.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace duet::testing {

struct StTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

inline size_t st_dtype_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  return 1;
}

inline std::vector<uint8_t> safetensors_raw(std::string header, const std::vector<uint8_t>& data);

// Bytes of a file with these tensors in this order (callers order them by element size when
// they want a valid file), the header padded with spaces to a multiple of 8.
inline std::vector<uint8_t> safetensors_bytes(const std::vector<StTensor>& tensors,
                                              const nlohmann::json& metadata = nullptr) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  for (const StTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  if (!metadata.is_null()) header["__metadata__"] = metadata;
  std::vector<uint8_t> data;
  for (const StTensor& t : tensors) data.insert(data.end(), t.data.begin(), t.data.end());
  return safetensors_raw(header.dump(), data);
}

// A file whose header is `header` (padded with spaces to a multiple of 8) followed by `data`.
inline std::vector<uint8_t> safetensors_raw(std::string header, const std::vector<uint8_t>& data) {
  while (header.size() % 8 != 0) header.push_back(' ');
  std::vector<uint8_t> out;
  out.reserve(8 + header.size() + data.size());
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// n values of a float32 pattern (i * 0.25 - 1), as bytes.
inline std::vector<uint8_t> f32_bytes(int64_t n, float offset = 0.0f) {
  std::vector<uint8_t> out(static_cast<size_t>(n) * 4);
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(i) * 0.25f - 1.0f + offset;
    std::memcpy(out.data() + i * 4, &v, 4);
  }
  return out;
}

class TempFolder {
 public:
  explicit TempFolder(const std::string& tag) {
    static int counter = 0;
    dir_ = std::filesystem::temp_directory_path() /
           ("duet-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(dir_);
  }
  ~TempFolder() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
  std::string path(const std::string& name = "") const { return (dir_ / name).string(); }

 private:
  std::filesystem::path dir_;
};

}  // namespace duet::testing
