// Opening a model file for the commands that run it.
#pragma once

#include <memory>
#include <string>

#include "duet/backend/backend.h"
#include "duet/formats/gguf.h"
#include "duet/model/model.h"
#include "duet/tokenizer/tokenizer.h"

namespace duet::cli {

struct LoadedModel {
  std::shared_ptr<const GgufFile> file;
  std::unique_ptr<DeviceRegistry> devices;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;  // null when not asked for
  double load_seconds = 0.0;

  // The backend of the first device ("cpu (avx512)"), and the threads of all devices together.
  std::string backend_name() const;
  int num_threads() const;
};

// Loads a model onto the devices `map` names (an empty map: all on `cpu` with `threads` threads),
// planning the KV rows for `kv_dtype`.
// With `parallel`, this rank's share of it (see plan_model_placement). `with_mtp`: its
// multi-token-prediction layer too (Placement::mtp); `lora`: LoRA adapters beside it.
LoadedModel load_model_file(const std::string& path, int threads, bool with_tokenizer, const DeviceMapSpec& map = {},
                            KvDtype kv_dtype = KvDtype::kF16, std::shared_ptr<ParallelGroup> parallel = nullptr,
                            bool with_mtp = false, std::vector<LoraSource> lora = {});
// The threads of every device of a placement together.
int placement_threads(const Placement& placement);

// Parses "1 2 3" or "1,2,3" into ids; throws kInvalidArgument naming the bad entry.
std::vector<int32_t> parse_token_ids(const std::string& text);

}  // namespace duet::cli
