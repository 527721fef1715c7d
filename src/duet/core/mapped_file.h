// A read-only memory map of a whole file; weights are used in place from it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace duet {

class MappedFile {
 public:
  // Maps `path` read-only. Throws kNotFound / kUnavailable naming the path and the OS error.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace duet
