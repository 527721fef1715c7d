#include "duet/formats/gguf_writer.h"

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "duet/core/error.h"

namespace duet {
namespace {

class Output {
 public:
  explicit Output(const std::string& path) : path_(path), file_(std::fopen(path.c_str(), "wb")) {
    if (file_ == nullptr) fail(ErrorCode::kUnavailable, "cannot create '{}': {}", path, std::strerror(errno));
  }
  ~Output() {
    if (file_ != nullptr) std::fclose(file_);
  }
  void bytes(const void* p, size_t n) {
    if (n != 0 && std::fwrite(p, 1, n, file_) != n) {
      fail(ErrorCode::kUnavailable, "cannot write '{}': {}", path_, std::strerror(errno));
    }
    pos_ += n;
  }
  template <typename T>
  void pod(T v) {
    bytes(&v, sizeof v);
  }
  void string(const std::string& s) {
    pod<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(uint64_t alignment) {
    static const uint8_t zeros[64] = {};
    while (pos_ % alignment != 0) bytes(zeros, std::min<uint64_t>(sizeof zeros, alignment - pos_ % alignment));
  }
  void close() {
    if (std::fclose(std::exchange(file_, nullptr)) != 0) {
      fail(ErrorCode::kUnavailable, "cannot finish '{}': {}", path_, std::strerror(errno));
    }
  }
  uint64_t pos() const { return pos_; }

 private:
  std::string path_;
  std::FILE* file_;
  uint64_t pos_ = 0;
};

void write_value(Output& out, const GgufValue& v) {
  switch (v.type) {
    case GgufType::kUint8: out.pod<uint8_t>(static_cast<uint8_t>(std::get<uint64_t>(v.value))); return;
    case GgufType::kInt8: out.pod<int8_t>(static_cast<int8_t>(std::get<int64_t>(v.value))); return;
    case GgufType::kUint16: out.pod<uint16_t>(static_cast<uint16_t>(std::get<uint64_t>(v.value))); return;
    case GgufType::kInt16: out.pod<int16_t>(static_cast<int16_t>(std::get<int64_t>(v.value))); return;
    case GgufType::kUint32: out.pod<uint32_t>(static_cast<uint32_t>(std::get<uint64_t>(v.value))); return;
    case GgufType::kInt32: out.pod<int32_t>(static_cast<int32_t>(std::get<int64_t>(v.value))); return;
    case GgufType::kUint64: out.pod<uint64_t>(std::get<uint64_t>(v.value)); return;
    case GgufType::kInt64: out.pod<int64_t>(std::get<int64_t>(v.value)); return;
    case GgufType::kFloat32: out.pod<float>(static_cast<float>(std::get<double>(v.value))); return;
    case GgufType::kFloat64: out.pod<double>(std::get<double>(v.value)); return;
    case GgufType::kBool: out.pod<uint8_t>(std::get<bool>(v.value) ? 1 : 0); return;
    case GgufType::kString: out.string(std::get<std::string>(v.value)); return;
    case GgufType::kArray: {
      const GgufArray& arr = std::get<GgufArray>(v.value);
      out.pod<uint32_t>(static_cast<uint32_t>(arr.elem_type));
      out.pod<uint64_t>(arr.items.size());
      for (const GgufValue& item : arr.items) {
        if (item.type != arr.elem_type) {
          fail(ErrorCode::kInvalidArgument, "array of {} holds a {}", gguf_type_name(arr.elem_type),
               gguf_type_name(item.type));
        }
        write_value(out, item);
      }
      return;
    }
  }
}

}  // namespace

void GgufWriter::set(const std::string& key, GgufValue value) {
  for (auto& [k, v] : kv_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  kv_.emplace_back(key, std::move(value));
}

void GgufWriter::add_tensor(std::string name, DType type, std::vector<int64_t> shape, Fill fill) {
  if (shape.empty() || shape.size() > 4) {
    fail(ErrorCode::kInvalidArgument, "tensor '{}' has {} dimensions, expected 1 to 4", name, shape.size());
  }
  if (type == DType::kFP8_E4M3_B128) {
    fail(ErrorCode::kUnsupported, "tensor '{}' is {}, duet's in-memory layout of FP8 weights, which GGUF has no type "
         "for: quantize it to another type", name, dtype_name(type));
  }
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const size_t nbytes = row_size(type, shape[0]) * static_cast<size_t>(n / shape[0]);
  for (const Tensor& t : tensors_) {
    if (t.name == name) fail(ErrorCode::kInvalidArgument, "tensor '{}' added twice", name);
  }
  tensors_.push_back(Tensor{std::move(name), type, std::move(shape), nbytes, std::move(fill)});
}

void GgufWriter::add_tensor(std::string name, DType type, std::vector<int64_t> shape, std::vector<uint8_t> data) {
  auto shared = std::make_shared<std::vector<uint8_t>>(std::move(data));
  const std::string label = name;
  add_tensor(std::move(name), type, std::move(shape), [shared, label](uint8_t* dst, size_t nbytes) {
    if (shared->size() != nbytes) {
      fail(ErrorCode::kInvalidArgument, "tensor '{}' has {} bytes of data, its shape needs {}", label, shared->size(),
           nbytes);
    }
    std::memcpy(dst, shared->data(), nbytes);
  });
}

void GgufWriter::write(const std::string& path, uint32_t version,
                       const std::function<void(size_t, size_t)>& on_tensor) const {
  if (version != 2 && version != 3) fail(ErrorCode::kInvalidArgument, "cannot write GGUF version {}", version);
  uint64_t alignment = 32;
  for (const auto& [k, v] : kv_) {
    if (k != "general.alignment") continue;
    const auto* a = std::get_if<uint64_t>(&v.value);
    if (a == nullptr || *a == 0 || (*a & (*a - 1)) != 0) {
      fail(ErrorCode::kInvalidArgument, "general.alignment must be an unsigned power of two");
    }
    alignment = *a;
  }
  const std::string tmp = path + ".tmp";
  try {
    Output out(tmp);
    out.pod<uint32_t>(0x46554747);
    out.pod<uint32_t>(version);
    out.pod<uint64_t>(tensors_.size());
    out.pod<uint64_t>(kv_.size());
    for (const auto& [k, v] : kv_) {
      out.string(k);
      out.pod<uint32_t>(static_cast<uint32_t>(v.type));
      write_value(out, v);
    }
    uint64_t offset = 0;
    for (const Tensor& t : tensors_) {
      out.string(t.name);
      out.pod<uint32_t>(static_cast<uint32_t>(t.shape.size()));
      for (int64_t d : t.shape) out.pod<uint64_t>(static_cast<uint64_t>(d));
      out.pod<uint32_t>(static_cast<uint32_t>(t.type));
      out.pod<uint64_t>(offset);
      offset += (t.nbytes + alignment - 1) / alignment * alignment;
    }
    out.pad_to(alignment);
    std::vector<uint8_t> buffer;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      buffer.assign(t.nbytes, 0);
      t.fill(buffer.data(), t.nbytes);
      out.bytes(buffer.data(), buffer.size());
      out.pad_to(alignment);
      if (on_tensor) on_tensor(i + 1, tensors_.size());
    }
    out.close();
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    fail(ErrorCode::kUnavailable, "cannot rename '{}' to '{}': {}", tmp, path, std::strerror(err));
  }
}

}  // namespace duet
