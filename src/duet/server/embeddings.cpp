#include "duet/server/embeddings.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include <fmt/format.h>
#include <openssl/evp.h>

namespace duet::server {
namespace {

using nlohmann::json;

// The most inputs one request may list (OpenAI's limit).
constexpr size_t kMaxInputs = 2048;

// The vector's little-endian float32 bytes in base64 (OpenSSL's encoder; x86 and ARM are both
// little-endian, so the bytes are the floats as they are).
std::string base64(const std::vector<float>& v) {
  static_assert(std::endian::native == std::endian::little);
  const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
  const size_t n = v.size() * sizeof(float);
  std::string out(4 * ((n + 2) / 3), '\0');
  const int written = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), bytes, static_cast<int>(n));
  out.resize(static_cast<size_t>(written));
  return out;
}


}  // namespace

EmbeddingsRequest parse_embeddings_request(const json& body, const ServedModel& model) {
  if (!body.is_object()) throw ApiError(400, "the body must be a JSON object");
  const json& name = json_field(body, "model");
  if (!name.is_null() && (!name.is_string() || name.get<std::string>() != model.name)) {
    throw ApiError(404, fmt::format("The model `{}` does not exist.", name.is_string() ? name.get<std::string>() : name.dump()),
                   "model", "model_not_found");
  }
  EmbeddingsRequest r;
  const json& format = json_field(body, "encoding_format");
  if (!format.is_null() && format != "float" && format != "base64") {
    throw ApiError(400, "encoding_format must be \"float\" or \"base64\"", "encoding_format");
  }
  r.base64 = format == "base64";
  r.normalize = get_bool(body, "normalize", true);
  const bool add_special = get_bool(body, "add_special_tokens", true);
  const json& dims = json_field(body, "dimensions");
  if (!dims.is_null() && !(dims.is_number_integer() && dims.get<int64_t>() == model.hidden_size)) {
    throw ApiError(400,
                   fmt::format("dimensions is {}: this model's embeddings have {} (it cannot shorten them)", dims.dump(),
                               model.hidden_size),
                   "dimensions");
  }
  const json& user = json_field(body, "user");
  if (!user.is_null() && !user.is_string()) throw ApiError(400, "user must be a string", "user");
  const int64_t keep = truncate_prompt_tokens(body, model);  // the last `keep` tokens of each input (0: all)

  const json& input = json_field(body, "input");
  std::vector<std::vector<int32_t>>& prompts = r.parsed.prompts;
  auto add_text = [&](const json& t) {
    if (t.get_ref<const std::string&>().empty()) throw ApiError(400, "input must not contain empty strings", "input");
    prompts.push_back(model.tokenizer->encode(t.get<std::string>(), add_special, true));
  };
  const json& messages = json_field(body, "messages");
  if (!messages.is_null()) {
    // vLLM's chat form: one input, the messages rendered by the chat template (no generation
    // prompt unless asked for), as /v1/chat/completions would render them.
    if (!input.is_null()) throw ApiError(400, "give input or messages, not both", "messages");
    prompts.push_back(chat_prompt_ids(messages, get_bool(body, "add_generation_prompt", false),
                                      json_field(body, "chat_template_kwargs"), model));
  } else if (input.is_string()) {
    add_text(input);
  } else if (input.is_array() && !input.empty() && input[0].is_number()) {
    prompts.push_back(token_list(input, model, "input"));
  } else if (input.is_array() && !input.empty()) {
    const size_t most = model.max_prompts > 0 ? std::min<size_t>(kMaxInputs, static_cast<size_t>(model.max_prompts)) : kMaxInputs;
    if (input.size() > most) {
      throw ApiError(400, fmt::format("input lists {} inputs, more than the {} one request may have", input.size(), most),
                     "input");
    }
    for (const json& item : input) {
      if (item.is_string()) {
        add_text(item);
      } else if (item.is_array() && !item.empty()) {
        prompts.push_back(token_list(item, model, "input"));
      } else {
        throw ApiError(400, "input must be a string, a list of strings, token ids, or lists of token ids", "input");
      }
    }
  } else {
    throw ApiError(400, "input must be a non-empty string, a list of strings, token ids, or lists of token ids", "input");
  }
  for (std::vector<int32_t>& p : prompts) {
    if (keep > 0 && static_cast<int64_t>(p.size()) > keep) p.erase(p.begin(), p.end() - keep);
    if (p.empty()) throw ApiError(400, "an input has no tokens", "input");
    if (static_cast<int64_t>(p.size()) > model.max_model_len) {
      throw ApiError(400,
                     fmt::format("This model's maximum context length is {} tokens. However, an input has {} tokens. "
                                 "Please reduce the length of the input (or set truncate_prompt_tokens).",
                                 model.max_model_len, p.size()),
                     "input", "context_length_exceeded");
    }
  }
  r.parsed.params = SamplingParams{};
  r.parsed.params.lora_adapter = model.lora_adapter;
  r.parsed.params.embedding = true;
  r.parsed.params.max_tokens = 1;
  r.parsed.params.temperature = 0.0f;
  const json& priority = json_field(body, "priority");
  if (!priority.is_null()) {
    if (!priority.is_number_integer() || priority.get<int64_t>() < INT32_MIN || priority.get<int64_t>() > INT32_MAX) {
      throw ApiError(400, "priority must be a 32-bit integer", "priority");
    }
    r.parsed.priority = static_cast<int32_t>(priority.get<int64_t>());
  }
  return r;
}

EmbeddingsBuilder::EmbeddingsBuilder(const EmbeddingsRequest& request, const ServedModel& model)
    : request_(request), model_(model), embeddings_(request.parsed.prompts.size()) {}

void EmbeddingsBuilder::accumulate(size_t prompt, const RequestOutput& output) {
  if (!output.embedding.empty() && prompt < embeddings_.size()) embeddings_[prompt] = output.embedding;
  for (const CompletionDelta& d : output.outputs) {
    if (d.finish_reason) finish_reason_ = std::string(finish_reason_name(*d.finish_reason));
  }
}

std::optional<ApiError> EmbeddingsBuilder::failure() const {
  for (const std::vector<float>& v : embeddings_) {
    if (v.empty()) {
      return ApiError(503, "the request ended before its embeddings were computed (the server is stopping); retry");
    }
  }
  return std::nullopt;
}

int64_t EmbeddingsBuilder::prompt_tokens() const {
  int64_t n = 0;
  for (const auto& p : request_.parsed.prompts) n += static_cast<int64_t>(p.size());
  return n;
}

std::string EmbeddingsBuilder::final_body() {
  json data = json::array();
  for (size_t i = 0; i < embeddings_.size(); ++i) {
    std::vector<float> v = embeddings_[i];
    if (request_.normalize) {
      double sum = 0.0;
      for (float x : v) sum += static_cast<double>(x) * x;
      const double norm = std::sqrt(sum);
      if (norm > 0.0) {
        for (float& x : v) x = static_cast<float>(x / norm);
      }
    }
    data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", request_.base64 ? json(base64(v)) : json(v)}});
  }
  const int64_t n = prompt_tokens();
  json body = {{"object", "list"},
               {"data", std::move(data)},
               {"model", model_.name},
               {"usage", {{"prompt_tokens", n}, {"total_tokens", n}}}};
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

// A string, or a non-empty list of strings, as a list.
std::vector<std::string> texts(const json& v, const char* key) {
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array() && !v.empty()) {
    for (const json& t : v) {
      if (!t.is_string()) throw ApiError(400, fmt::format("{} must be a string or a list of strings", key), key);
      out.push_back(t.get<std::string>());
    }
  } else {
    throw ApiError(400, fmt::format("{} must be a string or a non-empty list of strings", key), key);
  }
  for (const std::string& t : out) {
    if (t.empty()) throw ApiError(400, fmt::format("{} must not contain empty strings", key), key);
  }
  return out;
}

}  // namespace

ScoreRequest parse_score_request(const json& body, const ServedModel& model, bool rerank) {
  if (!body.is_object()) throw ApiError(400, "the body must be a JSON object");
  ScoreRequest r;
  r.rerank = rerank;
  std::vector<std::string> left, right;
  if (rerank) {
    const json& query = json_field(body, "query");
    if (!query.is_string() || query.get_ref<const std::string&>().empty()) {
      throw ApiError(400, "query must be a non-empty string", "query");
    }
    left.push_back(query.get<std::string>());
    right = texts(json_field(body, "documents"), "documents");
    r.documents = right;
    const json& top_n = json_field(body, "top_n");
    if (!top_n.is_null()) {
      if (!top_n.is_number_integer() || top_n.get<int64_t>() < 0) throw ApiError(400, "top_n must be an integer >= 0", "top_n");
      r.top_n = static_cast<size_t>(top_n.get<int64_t>());
    }
  } else {
    left = texts(json_field(body, "text_1"), "text_1");
    right = texts(json_field(body, "text_2"), "text_2");
    if (left.size() > 1 && left.size() != right.size()) {
      throw ApiError(400, fmt::format("text_1 lists {} texts and text_2 {}: give one text_1, or as many as text_2",
                                      left.size(), right.size()), "text_2");
    }
  }
  // The distinct texts become the embedding inputs.
  std::vector<std::string> inputs;
  auto index_of = [&](const std::string& t) {
    const auto it = std::find(inputs.begin(), inputs.end(), t);
    if (it != inputs.end()) return static_cast<size_t>(it - inputs.begin());
    inputs.push_back(t);
    return inputs.size() - 1;
  };
  for (size_t i = 0; i < right.size(); ++i) {
    const size_t a = index_of(left.size() == 1 ? left[0] : left[i]);
    r.pairs.emplace_back(a, index_of(right[i]));
  }
  json embed_body = {{"input", inputs}};
  for (const char* key : {"model", "truncate_prompt_tokens", "priority", "add_special_tokens"}) {
    if (body.contains(key)) embed_body[key] = body[key];
  }
  r.embed = parse_embeddings_request(embed_body, model);
  return r;
}

ScoreBuilder::ScoreBuilder(const ScoreRequest& request, const ServedModel& model, std::string id, int64_t created)
    : EmbeddingsBuilder(request.embed, model), score_(request), id_(std::move(id)), created_(created) {}

std::string ScoreBuilder::final_body() {
  auto cosine = [&](size_t a, size_t b) {
    const std::vector<float>& x = embeddings_.at(a);
    const std::vector<float>& y = embeddings_.at(b);
    double dot = 0.0, xx = 0.0, yy = 0.0;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      dot += static_cast<double>(x[i]) * y[i];
      xx += static_cast<double>(x[i]) * x[i];
      yy += static_cast<double>(y[i]) * y[i];
    }
    return xx > 0.0 && yy > 0.0 ? dot / std::sqrt(xx * yy) : 0.0;
  };
  const int64_t n = prompt_tokens();
  json body;
  if (score_.rerank) {
    std::vector<std::pair<double, size_t>> ranked;
    for (size_t i = 0; i < score_.pairs.size(); ++i) ranked.emplace_back(cosine(score_.pairs[i].first, score_.pairs[i].second), i);
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    if (score_.top_n > 0 && ranked.size() > score_.top_n) ranked.resize(score_.top_n);
    json results = json::array();
    for (const auto& [s, i] : ranked) {
      results.push_back({{"index", i}, {"document", {{"text", score_.documents[i]}}}, {"relevance_score", s}});
    }
    body = {{"id", "rerank-" + id_}, {"model", model_.name}, {"usage", {{"total_tokens", n}}}, {"results", results}};
  } else {
    json data = json::array();
    for (size_t i = 0; i < score_.pairs.size(); ++i) {
      data.push_back({{"index", i}, {"object", "score"}, {"score", cosine(score_.pairs[i].first, score_.pairs[i].second)}});
    }
    body = {{"id", "score-" + id_},
            {"object", "list"},
            {"created", created_},
            {"model", model_.name},
            {"data", data},
            {"usage", {{"prompt_tokens", n}, {"total_tokens", n}, {"completion_tokens", 0}}}};
  }
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace duet::server
