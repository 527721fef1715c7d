#pragma once

#include <memory>

#include "duet/model/model.h"

namespace duet {

// DeepSeek-V2, V2-Lite, V2.5, V3, R1 (GGUF architecture "deepseek2"): multi-head latent
// attention over a cache of compressed latents, and mixture-of-experts feed-forward layers.
std::unique_ptr<Model> make_deepseek2_model(std::shared_ptr<const GgufFile> file, Backend& backend);

}  // namespace duet
