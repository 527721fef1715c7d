// /v1/embeddings: each input (a text, or token ids) is an engine request that finishes once its
// prompt is computed (SamplingParams::embedding); its embedding is the last token's final
// normalised hidden state (last-token pooling, as decoder-only embedding models such as
// gte-Qwen2 are trained for), scaled to unit length unless the request says not to.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "duet/server/openai.h"

namespace duet::server {

struct EmbeddingsRequest {
  ParsedRequest parsed;  // one prompt per input, params.embedding set
  bool base64 = false;   // encoding_format "base64": little-endian float32 bytes
  bool normalize = true;
};

// Reads a body (parsed by parse_json_body). Throws ApiError naming the parameter.
EmbeddingsRequest parse_embeddings_request(const nlohmann::json& body, const ServedModel& model);

class EmbeddingsBuilder : public OutputBuilder {
 public:
  EmbeddingsBuilder(const EmbeddingsRequest& request, const ServedModel& model);

  // Embeddings are not streamed: these are never asked for.
  std::string stream_events(size_t, const RequestOutput&) override { return {}; }
  std::string stream_end(const ApiError*) override { return {}; }
  void accumulate(size_t prompt, const RequestOutput& output) override;
  // {"object": "list", "data": [{"object": "embedding", "index", "embedding"}...], "model", "usage"}
  std::string final_body() override;
  // An input whose embedding never came (its request was aborted).
  std::optional<ApiError> failure() const override;

  int64_t prompt_tokens() const override;
  int64_t completion_tokens() const override { return 0; }
  const std::string& last_finish_reason() const override { return finish_reason_; }

 private:
  const EmbeddingsRequest& request_;
  const ServedModel& model_;
  std::vector<std::vector<float>> embeddings_;
  std::string finish_reason_;
};

}  // namespace duet::server
