#include "duet/formats/safetensors_writer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "duet/core/error.h"

namespace duet {
namespace {

// Writes `tensors` (in that order in the file's data) to `path`.
template <typename T>
void write_file(const std::string& path, const std::vector<const T*>& tensors,
                const std::map<std::string, std::string>& metadata) {
  // The reader wants every tensor aligned to its element size: largest elements first.
  std::vector<const T*> order = tensors;
  std::stable_sort(order.begin(), order.end(), [](const T* a, const T* b) {
    return safetensors_dtype_size(a->dtype) > safetensors_dtype_size(b->dtype);
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const T* t : order) {
    header[t->name] = {{"dtype", safetensors_dtype_name(t->dtype)},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + t->nbytes}}};
    offset += t->nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(ErrorCode::kUnavailable, "cannot write '{}'", tmp);
    uint8_t size[8];
    for (int i = 0; i < 8; ++i) size[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
    out.write(reinterpret_cast<const char*>(size), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    std::vector<uint8_t> buffer;
    for (const T* t : order) {
      buffer.assign(t->nbytes, 0);
      t->fill(buffer.data(), buffer.size());
      out.write(reinterpret_cast<const char*>(buffer.data()), static_cast<std::streamsize>(buffer.size()));
    }
    out.flush();
    if (!out) fail(ErrorCode::kUnavailable, "writing '{}' failed (disk full?)", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail(ErrorCode::kUnavailable, "cannot rename '{}' to '{}': {}", tmp, path, ec.message());
}

}  // namespace

void SafetensorsWriter::add_tensor(std::string name, SafetensorsDType dtype, std::vector<int64_t> shape, Fill fill) {
  for (const Tensor& t : tensors_) {
    if (t.name == name) fail(ErrorCode::kInvalidArgument, "safetensors tensor '{}' added twice", name);
  }
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) fail(ErrorCode::kInvalidArgument, "safetensors tensor '{}' has a negative dimension {}", name, d);
    n *= static_cast<uint64_t>(d);
  }
  const size_t nbytes = static_cast<size_t>(n * safetensors_dtype_size(dtype));
  tensors_.push_back(Tensor{std::move(name), dtype, std::move(shape), nbytes, std::move(fill)});
}

void SafetensorsWriter::add_tensor(std::string name, SafetensorsDType dtype, std::vector<int64_t> shape,
                                   std::vector<uint8_t> data) {
  const std::string what = name;
  add_tensor(std::move(name), dtype, std::move(shape), Fill{});
  Tensor& t = tensors_.back();
  if (data.size() != t.nbytes) {
    tensors_.pop_back();
    fail(ErrorCode::kInvalidArgument, "safetensors tensor '{}' has {} bytes of data, its shape needs {}", what,
         data.size(), t.nbytes);
  }
  t.fill = [bytes = std::move(data)](uint8_t* dst, size_t n) { std::copy_n(bytes.data(), n, dst); };
}

uint64_t SafetensorsWriter::data_size() const {
  uint64_t total = 0;
  for (const Tensor& t : tensors_) total += t.nbytes;
  return total;
}

void SafetensorsWriter::write(const std::string& path) const {
  std::vector<const Tensor*> all;
  for (const Tensor& t : tensors_) all.push_back(&t);
  write_file(path, all, metadata_);
}

std::vector<std::string> SafetensorsWriter::write_model(const std::string& dir, uint64_t max_shard_bytes) const {
  std::vector<std::vector<const Tensor*>> shards(1);
  uint64_t in_shard = 0;
  for (const Tensor& t : tensors_) {
    if (max_shard_bytes > 0 && !shards.back().empty() && in_shard + t.nbytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&t);
    in_shard += t.nbytes;
  }
  const std::filesystem::path base(dir);
  std::error_code ec;
  std::filesystem::create_directories(base, ec);
  if (ec) fail(ErrorCode::kUnavailable, "cannot create the folder '{}': {}", dir, ec.message());
  if (shards.size() == 1) {
    write_file((base / "model.safetensors").string(), shards[0], metadata_);
    return {"model.safetensors"};
  }
  std::vector<std::string> files;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    write_file((base / file).string(), shards[i], metadata_);
    for (const Tensor* t : shards[i]) weight_map[t->name] = file;
    files.push_back(file);
  }
  const nlohmann::ordered_json index = {{"metadata", {{"total_size", data_size()}}}, {"weight_map", weight_map}};
  const std::string index_path = (base / "model.safetensors.index.json").string();
  std::ofstream out(index_path, std::ios::trunc);
  out << index.dump(2) << '\n';
  if (!out) fail(ErrorCode::kUnavailable, "cannot write '{}'", index_path);
  files.push_back("model.safetensors.index.json");
  return files;
}

}  // namespace duet
