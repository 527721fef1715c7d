#include "duet/formats/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/core/json_excerpt.h"

namespace duet {
namespace {

using Json = nlohmann::json;

// The reference implementation's limit on the header (100 MB).
constexpr uint64_t kMaxHeaderSize = 100'000'000;

struct DTypeInfo {
  SafetensorsDType type;
  std::string_view name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {SafetensorsDType::kBool, "BOOL", 1},    {SafetensorsDType::kU8, "U8", 1},
    {SafetensorsDType::kI8, "I8", 1},        {SafetensorsDType::kF8_E5M2, "F8_E5M2", 1},
    {SafetensorsDType::kF8_E4M3, "F8_E4M3", 1}, {SafetensorsDType::kI16, "I16", 2},
    {SafetensorsDType::kU16, "U16", 2},      {SafetensorsDType::kF16, "F16", 2},
    {SafetensorsDType::kBF16, "BF16", 2},    {SafetensorsDType::kI32, "I32", 4},
    {SafetensorsDType::kU32, "U32", 4},      {SafetensorsDType::kF32, "F32", 4},
    {SafetensorsDType::kF64, "F64", 8},      {SafetensorsDType::kI64, "I64", 8},
    {SafetensorsDType::kU64, "U64", 8},
};

const DTypeInfo& info(SafetensorsDType type) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.type == type) return d;
  }
  fail(ErrorCode::kInternal, "unknown safetensors dtype {}", static_cast<int>(type));
}

template <typename... Args>
[[noreturn]] void corrupt(const std::string& path, uint64_t offset, fmt::format_string<Args...> format,
                          Args&&... args) {
  throw Error(ErrorCode::kDataLoss, fmt::format("'{}': at offset {}: {}", path, offset,
                                                fmt::format(format, std::forward<Args>(args)...)));
}

// A non-negative JSON integer, or nullopt.
std::optional<uint64_t> json_uint(const Json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  return std::nullopt;
}

}  // namespace

std::string_view safetensors_dtype_name(SafetensorsDType type) { return info(type).name; }

size_t safetensors_dtype_size(SafetensorsDType type) { return info(type).size; }

std::optional<SafetensorsDType> parse_safetensors_dtype(std::string_view name) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.name == name) return d.type;
  }
  return std::nullopt;
}

std::optional<DType> safetensors_to_dtype(SafetensorsDType type) {
  switch (type) {
    case SafetensorsDType::kF32: return DType::kF32;
    case SafetensorsDType::kF16: return DType::kF16;
    case SafetensorsDType::kBF16: return DType::kBF16;
    case SafetensorsDType::kF64: return DType::kF64;
    case SafetensorsDType::kI8: return DType::kI8;
    case SafetensorsDType::kI16: return DType::kI16;
    case SafetensorsDType::kI32: return DType::kI32;
    case SafetensorsDType::kI64: return DType::kI64;
    default: return std::nullopt;
  }
}

int64_t SafetensorsTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string SafetensorsTensor::shape_string() const { return fmt::format("[{}]", fmt::join(shape, ", ")); }

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  f.map_ = std::make_shared<const MappedFile>(path);
  const uint8_t* bytes = f.map_->data();
  const uint64_t file_size = f.map_->size();

  if (file_size < 8) corrupt(path, 0, "file ends while reading the header length ({} bytes, 8 needed)", file_size);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes, 8);  // little-endian, as every platform duet builds for
  if (header_size > kMaxHeaderSize) {
    corrupt(path, 0, "header length {} is more than the limit {}: not a safetensors file, or a corrupt one",
            header_size, kMaxHeaderSize);
  }
  if (header_size > file_size - 8) {
    corrupt(path, 0, "header length {} is more than the {} bytes that follow: the file is truncated", header_size,
            file_size - 8);
  }
  const uint64_t data_start = 8 + header_size;
  const uint64_t data_size = file_size - data_start;
  const auto* header_begin = reinterpret_cast<const char*>(bytes + 8);

  // Duplicate names at the top level are an error (JSON readers differ on which one wins).
  std::set<std::string> seen;
  std::string duplicate;
  const Json::parser_callback_t check_duplicates = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth == 1 && event == Json::parse_event_t::key && duplicate.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second) duplicate = key;
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(header_begin, header_begin + header_size, check_duplicates);
  } catch (const Json::parse_error& e) {
    const uint64_t at = 8 + (e.byte > 0 ? std::min<uint64_t>(e.byte - 1, header_size) : 0);
    std::string what = e.what();
    if (const size_t colon = what.find("syntax error"); colon != std::string::npos) what = what.substr(colon);
    corrupt(path, at, "the JSON header does not parse: {}", what);
  } catch (const Json::exception& e) {  // a number beyond double's range (out_of_range 406)
    corrupt(path, 8, "the JSON header does not parse: {}", e.what());
  }
  if (!duplicate.empty()) corrupt(path, 8, "the header names '{}' twice", duplicate);
  if (!header.is_object()) corrupt(path, 8, "the header is a JSON {}, expected an object", header.type_name());

  struct Span {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Span> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) corrupt(path, 8, "__metadata__ is a JSON {}, expected an object", entry.type_name());
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          corrupt(path, 8, "__metadata__ entry '{}' is a JSON {}, expected a string", key, value.type_name());
        }
        f.metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) corrupt(path, 8, "tensor '{}' is described by a JSON {}, expected an object", name, entry.type_name());
    SafetensorsTensor t;
    t.name = name;
    const auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end() || !dtype_it->is_string()) corrupt(path, 8, "tensor '{}' has no dtype string", name);
    const std::string dtype = dtype_it->get<std::string>();
    const std::optional<SafetensorsDType> parsed = parse_safetensors_dtype(dtype);
    if (!parsed) {
      std::vector<std::string_view> names;
      for (const DTypeInfo& d : kDTypes) names.push_back(d.name);
      fail(ErrorCode::kUnsupported, "'{}': tensor '{}' has dtype '{}', which duet does not know (known: {})", path, name,
           dtype, fmt::join(names, ", "));
    }
    t.dtype = *parsed;
    const auto shape_it = entry.find("shape");
    if (shape_it == entry.end() || !shape_it->is_array()) corrupt(path, 8, "tensor '{}' has no shape array", name);
    uint64_t elements = 1;
    for (const Json& dim : *shape_it) {
      const std::optional<uint64_t> d = json_uint(dim);
      if (!d) corrupt(path, 8, "tensor '{}' has shape {}, expected non-negative integers", name, json_excerpt(*shape_it));
      if (*d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (*d != 0 && elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / *d)) {
        corrupt(path, 8, "tensor '{}' has shape {}: the element count overflows", name, json_excerpt(*shape_it));
      }
      elements *= *d;
      t.shape.push_back(static_cast<int64_t>(*d));
    }
    const auto offsets_it = entry.find("data_offsets");
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
        !json_uint((*offsets_it)[0]) || !json_uint((*offsets_it)[1])) {
      corrupt(path, 8, "tensor '{}' needs data_offsets [begin, end] of non-negative integers", name);
    }
    const uint64_t begin = *json_uint((*offsets_it)[0]);
    const uint64_t end = *json_uint((*offsets_it)[1]);
    const size_t elem = safetensors_dtype_size(t.dtype);
    if (end < begin) corrupt(path, 8, "tensor '{}' has data_offsets [{}, {}]: the end is before the begin", name, begin, end);
    if (elements > std::numeric_limits<uint64_t>::max() / elem || end - begin != elements * elem) {
      corrupt(path, 8, "tensor '{}' ({} {}) needs {} bytes, but its data_offsets [{}, {}] hold {}", name, dtype,
              json_excerpt(*shape_it), elements * elem, begin, end, end - begin);
    }
    if (end > data_size) {
      corrupt(path, data_start + std::min(begin, data_size),
              "tensor '{}' ({} bytes at data offset {}) extends past the end of the file (data section of {} bytes "
              "starts at {}): the file is truncated",
              name, end - begin, begin, data_size, data_start);
    }
    if ((data_start + begin) % elem != 0) {
      corrupt(path, data_start + begin, "tensor '{}' of {} starts at file offset {}, not a multiple of its element size {}",
              name, dtype, data_start + begin, elem);
    }
    t.offset = data_start + begin;
    t.nbytes = static_cast<size_t>(end - begin);
    t.data = bytes + t.offset;
    spans.push_back({begin, end, f.tensors_.size()});
    f.tensors_.push_back(std::move(t));
  }

  // The tensors must tile the data section: sorted by begin, each starts where the last ended.
  std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  const SafetensorsTensor* previous = nullptr;
  for (const Span& s : spans) {
    const SafetensorsTensor& t = f.tensors_[s.index];
    if (s.begin < expected) {
      corrupt(path, data_start + s.begin, "tensor '{}' (data offsets [{}, {}]) overlaps tensor '{}' (which ends at {})",
              t.name, s.begin, s.end, previous->name, expected);
    }
    if (s.begin > expected) {
      corrupt(path, data_start + expected, "{} bytes of the data section at data offset {} belong to no tensor (next is '{}')",
              s.begin - expected, expected, t.name);
    }
    expected = s.end;
    previous = &t;
  }
  if (expected != data_size) {
    corrupt(path, data_start + expected, "the tensors end at data offset {}, but the data section holds {} bytes",
            expected, data_size);
  }

  // Data order, the order a reader expects when listing.
  std::vector<SafetensorsTensor> ordered;
  ordered.reserve(spans.size());
  for (const Span& s : spans) ordered.push_back(std::move(f.tensors_[s.index]));
  f.tensors_ = std::move(ordered);
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_.emplace(f.tensors_[i].name, i);
  return f;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace duet
