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

 protected:
  const EmbeddingsRequest& request_;
  const ServedModel& model_;
  std::vector<std::vector<float>> embeddings_;
  std::string finish_reason_;
};

// vLLM's score and rerank APIs for an embedding model: the score of two texts is the cosine of
// their embeddings (as above, one engine request per distinct text).
// /score, /v1/score: {text_1, text_2}, each a string or a list of strings: one against each of the
// other list, or the two lists pair by pair.
// /rerank, /v1/rerank, /v2/rerank: {query, documents, top_n}: the documents by their score
// against the query, best first, the top_n of them (0 or absent: all).
struct ScoreRequest {
  EmbeddingsRequest embed;                          // the distinct texts
  std::vector<std::pair<size_t, size_t>> pairs;     // prompts scored against each other
  bool rerank = false;
  std::vector<std::string> documents;               // rerank: the documents, in the request's order
  size_t top_n = 0;                                  // rerank: 0 for all
};

ScoreRequest parse_score_request(const nlohmann::json& body, const ServedModel& model, bool rerank);

class ScoreBuilder : public EmbeddingsBuilder {
 public:
  ScoreBuilder(const ScoreRequest& request, const ServedModel& model, std::string id, int64_t created);
  std::string final_body() override;

 private:
  const ScoreRequest& score_;
  std::string id_;
  int64_t created_;
};

}  // namespace duet::server
