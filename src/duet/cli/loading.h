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
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;  // null when not asked for
  double load_seconds = 0.0;
};

LoadedModel load_model_file(const std::string& path, int threads, bool with_tokenizer);

// Parses "1 2 3" or "1,2,3" into ids; throws kInvalidArgument naming the bad entry.
std::vector<int32_t> parse_token_ids(const std::string& text);

}  // namespace duet::cli
