// Writes safetensors files (the layout safetensors.h reads) and Hugging Face's sharded form of a
// model's weights. Tensors are laid out largest element size first (then in the order added), so
// that each starts aligned to its element size; the header is padded with spaces to a multiple of
// 8 bytes. Tensor data is produced on demand while writing, one tensor at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "duet/formats/safetensors.h"

namespace duet {

class SafetensorsWriter {
 public:
  // Fills exactly `nbytes` bytes of tensor data at `dst`.
  using Fill = std::function<void(uint8_t* dst, size_t nbytes)>;

  // Throws kInvalidArgument for a name added twice or a negative dimension.
  void add_tensor(std::string name, SafetensorsDType dtype, std::vector<int64_t> shape, Fill fill);
  void add_tensor(std::string name, SafetensorsDType dtype, std::vector<int64_t> shape, std::vector<uint8_t> data);
  // An entry of "__metadata__" ({"format": "pt"} unless replaced).
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

  size_t num_tensors() const { return tensors_.size(); }
  // Bytes of tensor data (the file is this plus 8 plus the header).
  uint64_t data_size() const;

  // Writes the file through a temporary name, renamed into place when complete. Throws
  // kUnavailable when it cannot be written.
  void write(const std::string& path) const;

  // Splits the tensors, in the order added, into shards of at most max_shard_bytes of data each
  // (a tensor larger than that gets a shard of its own; 0: one shard) and writes them into `dir` (created if needed):
  // model.safetensors when one shard is enough, otherwise model-0000i-of-0000n.safetensors and
  // model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map": {name: file}}).
  // Returns the file names written (the index last).
  std::vector<std::string> write_model(const std::string& dir, uint64_t max_shard_bytes) const;

 private:
  struct Tensor {
    std::string name;
    SafetensorsDType dtype;
    std::vector<int64_t> shape;
    size_t nbytes;
    Fill fill;
  };
  std::vector<Tensor> tensors_;
  std::map<std::string, std::string> metadata_{{"format", "pt"}};
};

}  // namespace duet
