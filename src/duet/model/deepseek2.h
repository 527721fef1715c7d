#pragma once

#include <memory>

#include "duet/model/model.h"

namespace duet {

// DeepSeek-V2, V2-Lite, V2.5, V3, R1 (GGUF architecture "deepseek2"): multi-head latent
// attention over a cache of compressed latents, and mixture-of-experts feed-forward layers; and
// DeepSeek-V3.2 ("deepseek32"): the same with a lightning indexer choosing each query's positions.
std::unique_ptr<Model> make_deepseek2_model(std::shared_ptr<const GgufFile> file, Placement placement);
// K and V elements per token and layer of its cache (the latent and the rope key; V: none, or
// the indexer's key).
std::pair<int64_t, int64_t> deepseek2_cache_dims(const GgufFile& file);

}  // namespace duet
