#pragma once

#include <memory>

#include "duet/model/model.h"

namespace duet {

std::unique_ptr<Model> make_qwen3_model(std::shared_ptr<const GgufFile> file, Placement placement);

}  // namespace duet
