#include "duet/cli/loading.h"

#include <charconv>
#include <chrono>

#include "duet/core/error.h"
#include "duet/core/log.h"
#include "duet/engine/model_path.h"

namespace duet::cli {

std::string LoadedModel::backend_name() const { return model->placement().devices.front()->backend().name(); }

int LoadedModel::num_threads() const { return placement_threads(model->placement()); }

int placement_threads(const Placement& placement) {
  int n = 0;
  for (const auto& d : placement.devices) {
    if (d->remote_rank() < 0) n += d->backend().num_threads();  // this process's devices
  }
  return n;
}

LoadedModel load_model_file(const std::string& path, int threads, bool with_tokenizer, const DeviceMapSpec& map,
                            KvDtype kv_dtype, std::shared_ptr<ParallelGroup> parallel, bool with_mtp,
                            std::vector<LoraSource> lora) {
  const auto start = std::chrono::steady_clock::now();
  LoadedModel m;
  m.file = std::make_shared<const GgufFile>(open_model_path(path, ConvertedCopies::kDiscardable, with_mtp));
  m.devices = std::make_unique<DeviceRegistry>(DeviceRegistry::Options{threads, default_matmul_mode()});
  Placement placement = plan_model_placement(*m.file, map, *m.devices, KvBudget{}, kv_dtype, std::move(parallel));
  placement.mtp = with_mtp;
  placement.lora_adapters = std::move(lora);
  m.model = load_model(m.file, std::move(placement));
  if (with_tokenizer) m.tokenizer = Tokenizer::from_gguf(*m.file);
  m.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("loaded {} ({}, {} layers) on {} with {} threads in {:.2f} s", path, m.model->config().architecture,
               m.model->config().num_layers, m.backend_name(), m.num_threads(), m.load_seconds);
  if (m.model->placement().devices.size() > 1) spdlog::info("devices\n{}", m.model->placement().describe());
  return m;
}

std::vector<int32_t> parse_token_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ' ' || text[i] == ',' || text[i] == '\t' || text[i] == '\n') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && !(text[j] == ' ' || text[j] == ',' || text[j] == '\t' || text[j] == '\n')) ++j;
    int32_t id = 0;
    const auto [ptr, ec] = std::from_chars(text.data() + i, text.data() + j, id);
    if (ec != std::errc() || ptr != text.data() + j) {
      fail(ErrorCode::kInvalidArgument, "'{}' is not a token id", text.substr(i, j - i));
    }
    ids.push_back(id);
    i = j;
  }
  return ids;
}

}  // namespace duet::cli
