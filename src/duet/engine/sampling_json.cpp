#include "duet/engine/sampling_json.h"

#include <cctype>
#include <charconv>
#include <climits>
#include <cmath>
#include <optional>

#include "duet/core/error.h"

namespace duet {
namespace {

using nlohmann::json;

std::string type_name(const json& v) { return v.type_name(); }

double number(const json& body, const char* key) {
  const json& v = body.at(key);
  if (!v.is_number()) fail(ErrorCode::kInvalidArgument, "{} must be a number, got {}", key, type_name(v));
  return v.get<double>();
}

// A JSON integer as int64_t, or nothing when it is not an integer or does not fit (an unsigned
// value above INT64_MAX would otherwise wrap to a negative one).
std::optional<int64_t> as_int64(const json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return std::nullopt;
}

int64_t integer(const json& body, const char* key) {
  const json& v = body.at(key);
  if (v.is_number_integer()) {
    const std::optional<int64_t> i = as_int64(v);
    if (!i) fail(ErrorCode::kInvalidArgument, "{} is {}, out of range", key, v.dump());
    return *i;
  }
  if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() && std::fabs(v.get<double>()) < 1e15) {
    return static_cast<int64_t>(v.get<double>());
  }
  fail(ErrorCode::kInvalidArgument, "{} must be an integer, got {}", key, v.is_number() ? v.dump() : type_name(v));
}

int32_t int32(const json& body, const char* key) {
  const int64_t v = integer(body, key);
  if (v < INT32_MIN || v > INT32_MAX) fail(ErrorCode::kInvalidArgument, "{} is {}, out of range", key, v);
  return static_cast<int32_t>(v);
}

bool boolean(const json& body, const char* key) {
  const json& v = body.at(key);
  if (!v.is_boolean()) fail(ErrorCode::kInvalidArgument, "{} must be true or false, got {}", key, type_name(v));
  return v.get<bool>();
}

bool present(const json& body, const char* key) { return body.contains(key) && !body.at(key).is_null(); }

}  // namespace

SamplingParams sampling_params_from_json(const json& body, SamplingParams p) {
  if (!body.is_object()) fail(ErrorCode::kInvalidArgument, "request must be a JSON object, got {}", type_name(body));
  if (present(body, "n")) p.n = int32(body, "n");
  if (present(body, "best_of")) p.best_of = int32(body, "best_of");
  if (present(body, "temperature")) p.temperature = static_cast<float>(number(body, "temperature"));
  if (present(body, "top_p")) p.top_p = static_cast<float>(number(body, "top_p"));
  if (present(body, "top_k")) p.top_k = int32(body, "top_k");
  if (present(body, "min_p")) p.min_p = static_cast<float>(number(body, "min_p"));
  if (present(body, "repetition_penalty")) p.repetition_penalty = static_cast<float>(number(body, "repetition_penalty"));
  if (present(body, "presence_penalty")) p.presence_penalty = static_cast<float>(number(body, "presence_penalty"));
  if (present(body, "frequency_penalty")) p.frequency_penalty = static_cast<float>(number(body, "frequency_penalty"));
  if (present(body, "logit_bias")) {
    const json& lb = body.at("logit_bias");
    if (!lb.is_object()) fail(ErrorCode::kInvalidArgument, "logit_bias must be an object of token id to bias, got {}", type_name(lb));
    p.logit_bias.clear();
    for (auto it = lb.begin(); it != lb.end(); ++it) {
      // A decimal token id, whole and within 32 bits: a longer one must not wrap to another id.
      const std::string& key = it.key();
      int64_t parsed = 0;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), parsed);
      if (key.empty() || end != key.data() + key.size() || (ec != std::errc() && ec != std::errc::result_out_of_range)) {
        fail(ErrorCode::kInvalidArgument, "logit_bias key '{}' is not a token id", key);
      }
      if (ec == std::errc::result_out_of_range || parsed < INT32_MIN || parsed > INT32_MAX) {
        fail(ErrorCode::kInvalidArgument, "logit_bias has token id {}, expected an id in [0, {}]", key, INT32_MAX);
      }
      const auto id = static_cast<int32_t>(parsed);
      if (!it.value().is_number()) fail(ErrorCode::kInvalidArgument, "logit_bias value for {} must be a number", it.key());
      p.logit_bias.emplace_back(id, it.value().get<float>());
    }
  }
  if (present(body, "allowed_token_ids")) {
    const json& v = body.at("allowed_token_ids");
    if (!v.is_array() || v.empty()) fail(ErrorCode::kInvalidArgument, "allowed_token_ids must be a non-empty list of token ids");
    p.allowed_token_ids.clear();
    for (size_t i = 0; i < v.size(); ++i) {
      const std::optional<int64_t> id = v[i].is_number_integer() ? as_int64(v[i]) : std::nullopt;
      if (!id || *id < INT32_MIN || *id > INT32_MAX) {
        fail(ErrorCode::kInvalidArgument, "allowed_token_ids[{}] is {}, expected a token id", i, v[i].dump());
      }
      p.allowed_token_ids.push_back(static_cast<int32_t>(*id));
    }
  }
  if (present(body, "cache_salt")) {
    const json& v = body.at("cache_salt");
    if (!v.is_string() || v.get<std::string>().empty()) {
      fail(ErrorCode::kInvalidArgument, "cache_salt must be a non-empty string, got {}", v.is_string() ? "\"\"" : type_name(v));
    }
    p.cache_salt = v.get<std::string>();
  }
  if (present(body, "seed")) {
    const json& v = body.at("seed");
    if (!v.is_number_integer()) fail(ErrorCode::kInvalidArgument, "seed must be an integer, got {}", type_name(v));
    p.seed = v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(v.get<int64_t>());
  }
  if (present(body, "stop")) {
    const json& v = body.at("stop");
    p.stop.clear();
    if (v.is_string()) {
      p.stop.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      for (const json& s : v) {
        if (!s.is_string()) fail(ErrorCode::kInvalidArgument, "stop must be a string or a list of strings");
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      fail(ErrorCode::kInvalidArgument, "stop must be a string or a list of strings, got {}", type_name(v));
    }
  }
  if (present(body, "stop_token_ids")) {
    const json& v = body.at("stop_token_ids");
    if (!v.is_array()) fail(ErrorCode::kInvalidArgument, "stop_token_ids must be a list of token ids");
    p.stop_token_ids.clear();
    for (size_t i = 0; i < v.size(); ++i) {
      const json& t = v[i];
      if (!t.is_number_integer()) fail(ErrorCode::kInvalidArgument, "stop_token_ids must be a list of token ids");
      const std::optional<int64_t> id = as_int64(t);
      if (!id || *id < INT32_MIN || *id > INT32_MAX) {
        fail(ErrorCode::kInvalidArgument, "stop_token_ids[{}] is {}, expected a token id in [0, {}]", i, t.dump(),
             INT32_MAX);
      }
      p.stop_token_ids.push_back(static_cast<int32_t>(*id));
    }
  }
  if (present(body, "include_stop_str_in_output")) p.include_stop_str_in_output = boolean(body, "include_stop_str_in_output");
  if (present(body, "ignore_eos")) p.ignore_eos = boolean(body, "ignore_eos");
  if (present(body, "min_tokens")) p.min_tokens = int32(body, "min_tokens");
  if (present(body, "max_completion_tokens")) p.max_tokens = int32(body, "max_completion_tokens");
  if (present(body, "max_tokens")) p.max_tokens = int32(body, "max_tokens");
  if (present(body, "logprobs")) {
    const json& v = body.at("logprobs");
    if (v.is_boolean()) {  // chat completions: logprobs: true, top_logprobs: k
      if (v.get<bool>()) p.logprobs = present(body, "top_logprobs") ? int32(body, "top_logprobs") : 0;
      else p.logprobs.reset();
    } else {
      p.logprobs = int32(body, "logprobs");
    }
  } else if (present(body, "top_logprobs")) {
    p.logprobs = int32(body, "top_logprobs");
  }
  if (present(body, "prompt_logprobs")) p.prompt_logprobs = int32(body, "prompt_logprobs");
  if (present(body, "use_beam_search")) p.use_beam_search = boolean(body, "use_beam_search");
  if (present(body, "length_penalty")) p.length_penalty = static_cast<float>(number(body, "length_penalty"));
  if (present(body, "skip_special_tokens")) p.skip_special_tokens = boolean(body, "skip_special_tokens");
  return p;
}

std::string error_param(const std::string& message) {
  const size_t end = message.find_first_of(" ,:[");
  const std::string first = message.substr(0, end);
  for (char c : first) {
    if (!(std::islower(static_cast<unsigned char>(c)) || c == '_')) return "";
  }
  return first;
}

}  // namespace duet
