#include "duet/model/model.h"

#include <fmt/format.h>

#include "duet/core/error.h"
#include "duet/model/llama.h"

namespace duet {
namespace {

using Factory = std::unique_ptr<Model> (*)(std::shared_ptr<const GgufFile>, Backend&);

struct Registration {
  const char* architecture;
  Factory factory;
};

// One line per architecture.
constexpr Registration kArchitectures[] = {
    {"llama", make_llama_model},
};

}  // namespace

ContiguousKvCache::ContiguousKvCache(int64_t num_layers, int64_t capacity, int64_t kv_dim) : capacity_(capacity) {
  const size_t per_layer = static_cast<size_t>(capacity * kv_dim);
  k_.assign(static_cast<size_t>(num_layers), std::vector<float>(per_layer));
  v_.assign(static_cast<size_t>(num_layers), std::vector<float>(per_layer));
}

std::unique_ptr<Model> load_model(std::shared_ptr<const GgufFile> file, Backend& backend) {
  const std::string arch = file->get_string_or("general.architecture", "");
  for (const Registration& r : kArchitectures) {
    if (arch == r.architecture) return r.factory(std::move(file), backend);
  }
  fail(ErrorCode::kUnsupported, "'{}': architecture '{}' is not supported (supported: {})", file->path(),
       arch.empty() ? "(general.architecture missing)" : arch, fmt::join(supported_architectures(), ", "));
}

std::vector<std::string> supported_architectures() {
  std::vector<std::string> names;
  for (const Registration& r : kArchitectures) names.emplace_back(r.architecture);
  return names;
}

}  // namespace duet
