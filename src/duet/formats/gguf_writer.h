// Writes GGUF version 3 files: metadata in insertion order, tensor data aligned to
// general.alignment (default 32). Tensor data is produced on demand while writing, so a model
// larger than memory can be written tensor by tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "duet/core/dtype.h"
#include "duet/formats/gguf.h"

namespace duet {

class GgufWriter {
 public:
  // Fills exactly `nbytes` bytes of tensor data at `dst`.
  using Fill = std::function<void(uint8_t* dst, size_t nbytes)>;

  // Adds or replaces a metadata value.
  void set(const std::string& key, GgufValue value);
  void add_tensor(std::string name, DType type, std::vector<int64_t> shape, Fill fill);
  void add_tensor(std::string name, DType type, std::vector<int64_t> shape, std::vector<uint8_t> data);

  // Writes the file (through a temporary name, renamed into place when complete).
  // `on_tensor(i, n)` is called after each tensor, for progress reports.
  void write(const std::string& path, uint32_t version = 3,
             const std::function<void(size_t, size_t)>& on_tensor = nullptr) const;

 private:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> shape;
    size_t nbytes;
    Fill fill;
  };
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace duet
