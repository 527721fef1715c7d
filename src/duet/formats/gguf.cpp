#include "duet/formats/gguf.h"

#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "duet/core/error.h"

namespace duet {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as little-endian uint32
constexpr int kMaxArrayDepth = 8;
constexpr int kMaxDims = 4;
constexpr uint64_t kMaxKeyLength = 65535;

// Bounds-checked little-endian reader over the mapped bytes. Every failure names the file and
// the offset at which the bad field starts.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& path) : data_(data), size_(size), path_(path) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  template <typename... Args>
  [[noreturn]] void error_at(size_t offset, fmt::format_string<Args...> format, Args&&... args) const {
    throw Error(ErrorCode::kDataLoss, fmt::format("'{}': at offset {}: {}", path_, offset,
                                                  fmt::format(format, std::forward<Args>(args)...)));
  }

  template <typename T>
  T read(std::string_view what) {
    if (remaining() < sizeof(T)) {
      error_at(pos_, "file ends while reading {} ({} bytes needed, {} left)", what, sizeof(T), remaining());
    }
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(std::string_view what, uint64_t max_length = std::numeric_limits<uint64_t>::max()) {
    const size_t start = pos_;
    const uint64_t len = read<uint64_t>(what);
    if (len > max_length) error_at(start, "{} has length {}, more than the limit {}", what, len, max_length);
    if (len > remaining()) {
      error_at(start, "{} has length {} but only {} bytes are left in the file", what, len, remaining());
    }
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
};

bool valid_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kFloat64); }

bool is_integer_type(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kUint16:
    case GgufType::kInt16:
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kUint64:
    case GgufType::kInt64:
      return true;
    default:
      return false;
  }
}

// Smallest encoding of one value of `type`, used to reject element counts the file cannot hold:
// a string is at least its 8-byte length, an array its type and count.
size_t min_encoded_size(GgufType type) {
  if (type == GgufType::kString) return 8;
  if (type == GgufType::kArray) return 12;
  return gguf_scalar_size(type);
}

GgufValue read_value(Cursor& c, GgufType type, const std::string& key, int depth) {
  switch (type) {
    case GgufType::kUint8: return GgufValue::u8(c.read<uint8_t>(key));
    case GgufType::kInt8: return GgufValue::i8(c.read<int8_t>(key));
    case GgufType::kUint16: return GgufValue::u16(c.read<uint16_t>(key));
    case GgufType::kInt16: return GgufValue::i16(c.read<int16_t>(key));
    case GgufType::kUint32: return GgufValue::u32(c.read<uint32_t>(key));
    case GgufType::kInt32: return GgufValue::i32(c.read<int32_t>(key));
    case GgufType::kUint64: return GgufValue::u64(c.read<uint64_t>(key));
    case GgufType::kInt64: return GgufValue::i64(c.read<int64_t>(key));
    case GgufType::kFloat32: return GgufValue::f32(c.read<float>(key));
    case GgufType::kFloat64: return GgufValue::f64(c.read<double>(key));
    case GgufType::kBool: {
      const size_t at = c.pos();
      const uint8_t b = c.read<uint8_t>(key);
      if (b > 1) c.error_at(at, "bool value of '{}' is {}, expected 0 or 1", key, b);
      return GgufValue::boolean(b != 0);
    }
    case GgufType::kString: return GgufValue::str(c.read_string(fmt::format("string value of '{}'", key)));
    case GgufType::kArray: {
      const size_t at = c.pos();
      if (depth >= kMaxArrayDepth) c.error_at(at, "arrays in '{}' are nested deeper than {}", key, kMaxArrayDepth);
      const uint32_t elem = c.read<uint32_t>(key);
      if (!valid_type(elem)) c.error_at(at, "array '{}' has unknown element type {}", key, elem);
      const GgufType elem_type = static_cast<GgufType>(elem);
      const size_t count_at = c.pos();
      const uint64_t count = c.read<uint64_t>(key);
      if (count > c.remaining() / min_encoded_size(elem_type)) {
        c.error_at(count_at, "array '{}' claims {} elements of {} but only {} bytes are left", key, count,
                   gguf_type_name(elem_type), c.remaining());
      }
      GgufArray arr;
      arr.elem_type = elem_type;
      arr.items.reserve(static_cast<size_t>(count));
      for (uint64_t i = 0; i < count; ++i) arr.items.push_back(read_value(c, elem_type, key, depth + 1));
      return GgufValue{GgufType::kArray, std::move(arr)};
    }
  }
  c.error_at(c.pos(), "value of '{}' has unknown type {}", key, static_cast<uint32_t>(type));
}

std::string type_mismatch(std::string_view key, std::string_view expected, const GgufValue& v) {
  return fmt::format("metadata '{}' is {}, expected {}", key, gguf_type_name(v.type), expected);
}

}  // namespace

std::string_view gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::kUint8: return "uint8";
    case GgufType::kInt8: return "int8";
    case GgufType::kUint16: return "uint16";
    case GgufType::kInt16: return "int16";
    case GgufType::kUint32: return "uint32";
    case GgufType::kInt32: return "int32";
    case GgufType::kFloat32: return "float32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kUint64: return "uint64";
    case GgufType::kInt64: return "int64";
    case GgufType::kFloat64: return "float64";
  }
  return "unknown";
}

GgufValue GgufValue::string_array(const std::vector<std::string>& items) {
  std::vector<GgufValue> v;
  v.reserve(items.size());
  for (const std::string& s : items) v.push_back(str(s));
  return array(GgufType::kString, std::move(v));
}

GgufValue GgufValue::f32_array(const std::vector<float>& items) {
  std::vector<GgufValue> v;
  v.reserve(items.size());
  for (float f : items) v.push_back(f32(f));
  return array(GgufType::kFloat32, std::move(v));
}

GgufValue GgufValue::i32_array(const std::vector<int32_t>& items) {
  std::vector<GgufValue> v;
  v.reserve(items.size());
  for (int32_t i : items) v.push_back(i32(i));
  return array(GgufType::kInt32, std::move(v));
}

size_t gguf_scalar_size(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    case GgufType::kString:
    case GgufType::kArray:
      return 0;
  }
  return 0;
}

bool GgufValue::is_integer() const { return is_integer_type(type); }

std::string GgufValue::to_string(size_t max_items) const {
  if (const auto* u = std::get_if<uint64_t>(&value)) return std::to_string(*u);
  if (const auto* i = std::get_if<int64_t>(&value)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&value)) {
    // A float32 prints as the shortest text that reads back as the same float32.
    return type == GgufType::kFloat32 ? fmt::format("{}", static_cast<float>(*d)) : fmt::format("{}", *d);
  }
  if (const auto* b = std::get_if<bool>(&value)) return *b ? "true" : "false";
  if (const auto* s = std::get_if<std::string>(&value)) {
    std::string out = "\"";
    size_t shown = 0;
    for (char ch : *s) {
      if (++shown > 80) {
        out += "...";
        break;
      }
      if (ch == '\n') out += "\\n";
      else if (ch == '"') out += "\\\"";
      else out += ch;
    }
    out += '"';
    return out;
  }
  const auto& arr = std::get<GgufArray>(value);
  std::string out = fmt::format("[{} x {}:", arr.items.size(), gguf_type_name(arr.elem_type));
  for (size_t i = 0; i < arr.items.size() && i < max_items; ++i) {
    out += ' ';
    out += arr.items[i].to_string(max_items);
  }
  if (arr.items.size() > max_items) out += " ...";
  out += ']';
  return out;
}

int64_t GgufTensorInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string GgufTensorInfo::shape_string() const { return fmt::format("[{}]", fmt::join(shape, ", ")); }

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.path_ = path;
  f.map_ = std::make_shared<MappedFile>(path);
  Cursor c(f.map_->data(), f.map_->size(), f.path_);

  const uint32_t magic = c.read<uint32_t>("the magic number");
  if (magic != kGgufMagic) {
    c.error_at(0, "not a GGUF file (magic {:#010x}, expected {:#010x} \"GGUF\")", magic, kGgufMagic);
  }
  f.version_ = c.read<uint32_t>("the version");
  if (f.version_ == 1) {
    throw Error(ErrorCode::kUnsupported, fmt::format("'{}': GGUF version 1 is not supported (only 2 and 3); "
                                                     "convert the file again with a current converter", path));
  }
  if (f.version_ != 2 && f.version_ != 3) {
    if ((f.version_ & 0xffff) == 0 && f.version_ != 0) {
      throw Error(ErrorCode::kUnsupported, fmt::format("'{}': big-endian GGUF files are not supported", path));
    }
    c.error_at(4, "unknown GGUF version {} (expected 2 or 3)", f.version_);
  }
  const size_t counts_at = c.pos();
  const uint64_t num_tensors = c.read<uint64_t>("the tensor count");
  const uint64_t num_kv = c.read<uint64_t>("the metadata count");
  // A tensor info needs at least 24 bytes and a key/value pair at least 13.
  if (num_tensors > c.remaining() / 24) {
    c.error_at(counts_at, "tensor count {} cannot fit in the {} bytes that follow", num_tensors, c.remaining());
  }
  if (num_kv > c.remaining() / 13) {
    c.error_at(counts_at + 8, "metadata count {} cannot fit in the {} bytes that follow", num_kv, c.remaining());
  }

  f.kv_.reserve(static_cast<size_t>(num_kv));
  for (uint64_t i = 0; i < num_kv; ++i) {
    const size_t at = c.pos();
    std::string key = c.read_string(fmt::format("the key of metadata entry {}", i), kMaxKeyLength);
    if (key.empty()) c.error_at(at, "metadata entry {} has an empty key", i);
    if (f.kv_index_.count(key) != 0) c.error_at(at, "duplicate metadata key '{}'", key);
    const size_t type_at = c.pos();
    const uint32_t type = c.read<uint32_t>(key);
    if (!valid_type(type)) c.error_at(type_at, "metadata '{}' has unknown value type {}", key, type);
    GgufValue value = read_value(c, static_cast<GgufType>(type), key, 0);
    f.kv_index_.emplace(key, f.kv_.size());
    f.kv_.emplace_back(std::move(key), std::move(value));
  }

  if (const GgufValue* a = f.find("general.alignment")) {
    if (!a->is_integer()) {
      throw Error(ErrorCode::kDataLoss, fmt::format("'{}': {}", path, type_mismatch("general.alignment", "an integer", *a)));
    }
    const int64_t align = f.get_int("general.alignment");
    if (align <= 0 || (align & (align - 1)) != 0) {
      throw Error(ErrorCode::kDataLoss,
                  fmt::format("'{}': general.alignment is {}, expected a power of two", path, align));
    }
    f.alignment_ = static_cast<uint64_t>(align);
  }

  f.tensors_.reserve(static_cast<size_t>(num_tensors));
  std::vector<size_t> info_offsets;
  for (uint64_t i = 0; i < num_tensors; ++i) {
    const size_t at = c.pos();
    info_offsets.push_back(at);
    GgufTensorInfo t;
    t.name = c.read_string(fmt::format("the name of tensor {}", i), kMaxKeyLength);
    if (f.tensor_index_.count(t.name) != 0) c.error_at(at, "duplicate tensor name '{}'", t.name);
    const size_t dims_at = c.pos();
    const uint32_t n_dims = c.read<uint32_t>("the dimension count");
    if (n_dims > kMaxDims) c.error_at(dims_at, "tensor '{}' has {} dimensions, at most {} are allowed", t.name, n_dims, kMaxDims);
    int64_t n = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const size_t dim_at = c.pos();
      const uint64_t dim = c.read<uint64_t>("a dimension");
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (dim != 0 && static_cast<uint64_t>(n) > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / dim)) {
        c.error_at(dim_at, "tensor '{}' dimension {} is {}: the element count overflows", t.name, d, dim);
      }
      t.shape.push_back(static_cast<int64_t>(dim));
      n *= static_cast<int64_t>(dim);
    }
    const size_t type_at = c.pos();
    const uint32_t type_id = c.read<uint32_t>("the tensor type");
    const std::optional<DTypeTraits> tt = dtype_traits(type_id);
    if (!tt || static_cast<DType>(type_id) == DType::kFP8_E4M3_B128) {
      c.error_at(type_at, "tensor '{}' has unknown type id {}", t.name, type_id);
    }
    t.type = static_cast<DType>(type_id);
    const int64_t row = t.shape.empty() ? 1 : t.shape[0];
    if (row % tt->block_size != 0) {
      c.error_at(dims_at, "tensor '{}' of type {} has rows of {} elements, not a multiple of its block size {}",
                 t.name, tt->name, row, tt->block_size);
    }
    const uint64_t blocks = static_cast<uint64_t>(n / tt->block_size);
    if (blocks > std::numeric_limits<uint64_t>::max() / tt->type_size) {
      c.error_at(dims_at, "tensor '{}' byte size overflows", t.name);
    }
    t.nbytes = static_cast<size_t>(blocks * tt->type_size);
    const size_t off_at = c.pos();
    t.offset = c.read<uint64_t>("the tensor data offset");
    if (t.offset % f.alignment_ != 0) {
      c.error_at(off_at, "tensor '{}' data offset {} is not a multiple of the alignment {}", t.name, t.offset,
                 f.alignment_);
    }
    f.tensor_index_.emplace(t.name, f.tensors_.size());
    f.tensors_.push_back(std::move(t));
  }

  const uint64_t pos = c.pos();
  f.data_offset_ = (pos + f.alignment_ - 1) / f.alignment_ * f.alignment_;
  const uint64_t file_size = f.map_->size();
  for (size_t i = 0; i < f.tensors_.size(); ++i) {
    GgufTensorInfo& t = f.tensors_[i];
    const uint64_t available = file_size > f.data_offset_ ? file_size - f.data_offset_ : 0;
    if (t.offset > available || t.nbytes > available - t.offset) {
      c.error_at(info_offsets[i],
                 "tensor '{}' ({} {}, {} bytes at data offset {}) extends past the end of the file "
                 "(data section starts at {}, file is {} bytes): the file is truncated",
                 t.name, dtype_name(t.type), t.shape_string(), t.nbytes, t.offset, f.data_offset_, file_size);
    }
    t.data = f.map_->data() + f.data_offset_ + t.offset;
  }
  return f;
}

GgufFile GgufFile::assemble(std::string path, std::vector<std::pair<std::string, GgufValue>> metadata,
                            std::vector<GgufTensorInfo> tensors, std::vector<std::shared_ptr<const void>> keep_alive) {
  GgufFile f;
  f.path_ = std::move(path);
  f.version_ = 0;
  f.kv_ = std::move(metadata);
  for (size_t i = 0; i < f.kv_.size(); ++i) {
    if (!f.kv_index_.emplace(f.kv_[i].first, i).second) {
      fail(ErrorCode::kInvalidArgument, "'{}': metadata key '{}' is set twice", f.path_, f.kv_[i].first);
    }
  }
  f.tensors_ = std::move(tensors);
  for (size_t i = 0; i < f.tensors_.size(); ++i) {
    const GgufTensorInfo& t = f.tensors_[i];
    if (!f.tensor_index_.emplace(t.name, i).second) {
      fail(ErrorCode::kInvalidArgument, "'{}': tensor '{}' is given twice", f.path_, t.name);
    }
    if (t.data == nullptr && t.nbytes > 0) fail(ErrorCode::kInvalidArgument, "'{}': tensor '{}' has no data", f.path_, t.name);
    f.assembled_bytes_ += t.nbytes;
  }
  f.keep_alive_ = std::move(keep_alive);
  return f;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufValue& GgufFile::require(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) fail(ErrorCode::kNotFound, "'{}': metadata key '{}' is missing", path_, key);
  return *v;
}

std::string GgufFile::get_string(std::string_view key) const {
  const GgufValue& v = require(key);
  if (v.type != GgufType::kString) fail(ErrorCode::kInvalidArgument, "'{}': {}", path_, type_mismatch(key, "a string", v));
  return std::get<std::string>(v.value);
}

std::string GgufFile::get_string_or(std::string_view key, std::string fallback) const {
  return has(key) ? get_string(key) : std::move(fallback);
}

int64_t GgufFile::get_int(std::string_view key) const {
  const GgufValue& v = require(key);
  if (const auto* i = std::get_if<int64_t>(&v.value)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&v.value)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail(ErrorCode::kInvalidArgument, "'{}': metadata '{}' is {}, too large", path_, key, *u);
    }
    return static_cast<int64_t>(*u);
  }
  fail(ErrorCode::kInvalidArgument, "'{}': {}", path_, type_mismatch(key, "an integer", v));
}

int64_t GgufFile::get_int_or(std::string_view key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}

double GgufFile::get_float(std::string_view key) const {
  const GgufValue& v = require(key);
  if (const auto* d = std::get_if<double>(&v.value)) return *d;
  if (v.is_integer()) return static_cast<double>(get_int(key));
  fail(ErrorCode::kInvalidArgument, "'{}': {}", path_, type_mismatch(key, "a number", v));
}

double GgufFile::get_float_or(std::string_view key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

bool GgufFile::get_bool_or(std::string_view key, bool fallback) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return fallback;
  if (const auto* b = std::get_if<bool>(&v->value)) return *b;
  fail(ErrorCode::kInvalidArgument, "'{}': {}", path_, type_mismatch(key, "a bool", *v));
}

std::vector<std::string> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue& v = require(key);
  const auto* arr = std::get_if<GgufArray>(&v.value);
  if (arr == nullptr || arr->elem_type != GgufType::kString) {
    fail(ErrorCode::kInvalidArgument, "'{}': {}", path_, type_mismatch(key, "an array of strings", v));
  }
  std::vector<std::string> out;
  out.reserve(arr->items.size());
  for (const GgufValue& item : arr->items) out.push_back(std::get<std::string>(item.value));
  return out;
}

std::vector<float> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue& v = require(key);
  const auto* arr = std::get_if<GgufArray>(&v.value);
  if (arr == nullptr || !(arr->elem_type == GgufType::kFloat32 || arr->elem_type == GgufType::kFloat64)) {
    fail(ErrorCode::kInvalidArgument, "'{}': {}", path_, type_mismatch(key, "an array of floats", v));
  }
  std::vector<float> out;
  out.reserve(arr->items.size());
  for (const GgufValue& item : arr->items) out.push_back(static_cast<float>(std::get<double>(item.value)));
  return out;
}

std::vector<int32_t> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue& v = require(key);
  const auto* arr = std::get_if<GgufArray>(&v.value);
  if (arr == nullptr || !is_integer_type(arr->elem_type)) {
    fail(ErrorCode::kInvalidArgument, "'{}': {}", path_, type_mismatch(key, "an array of integers", v));
  }
  std::vector<int32_t> out;
  out.reserve(arr->items.size());
  for (const GgufValue& item : arr->items) {
    if (const auto* i = std::get_if<int64_t>(&item.value)) out.push_back(static_cast<int32_t>(*i));
    else out.push_back(static_cast<int32_t>(std::get<uint64_t>(item.value)));
  }
  return out;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace duet
