#include "duet/server/message_batches.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>

#include "duet/server/messages.h"
#include "duet/server/openai.h"

namespace duet::server {
namespace {

using nlohmann::json;

constexpr std::string_view kAnthropicPrefix = "msgbatch_";
constexpr std::string_view kOpenAiPrefix = "batch_";
constexpr size_t kMaxRequests = 100000;  // Anthropic's limit per batch

// Unix seconds as Anthropic writes them, or null for none.
json rfc3339(const json& seconds) {
  if (!seconds.is_number_integer()) return nullptr;
  return anthropic_time(seconds.get<int64_t>());
}

bool valid_custom_id(const std::string& id) {
  return !id.empty() && id.size() <= 64 && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

// Each non-blank line of a JSON-lines file, parsed (discarded when it does not parse), with its
// custom_id ("" for none).
template <typename F>
void each_line(std::string_view data, F&& f) {
  for (size_t pos = 0; pos < data.size();) {
    size_t eol = data.find('\n', pos);
    if (eol == std::string_view::npos) eol = data.size();
    const std::string_view line = data.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const json j = json::parse(line, nullptr, false);
    f(j, j.is_object() && j.contains("custom_id") && j["custom_id"].is_string() ? j["custom_id"].get<std::string>()
                                                                                : std::string());
  }
}

// The custom_ids of a batch file's lines, in order.
std::vector<std::string> custom_ids(std::string_view data) {
  std::vector<std::string> out;
  each_line(data, [&](const json&, std::string id) { out.push_back(std::move(id)); });
  return out;
}

// An output or error line of the OpenAI batch as Anthropic's result. A message without a
// stop_reason was cut short when the batch was cancelled or expired: `unanswered` (canceled or
// expired), as the requests never sent.
json result_of(const json& line, const char* unanswered) {
  const json& response = json_field(line, "response");
  if (response.is_object() && response.value("status_code", 0) == 200 && response.contains("body")) {
    if (response["body"].is_object() && response["body"].value("stop_reason", json()).is_null()) {
      return {{"type", unanswered}};
    }
    return {{"type", "succeeded"}, {"message", response["body"]}};
  }
  json error;
  if (response.is_object() && response.contains("body") && response["body"].is_object() &&
      response["body"].value("type", "") == "error") {
    error = response["body"];  // the /v1/messages route's own error, in Anthropic's shape
  } else {
    const json& e = json_field(line, "error");
    const std::string message = e.is_object() && e.contains("message") && e["message"].is_string()
                                    ? e["message"].get<std::string>()
                                    : "the request failed";
    error = {{"type", "error"}, {"error", {{"type", "invalid_request_error"}, {"message", message}}}};
  }
  return {{"type", "errored"}, {"error", std::move(error)}};
}

// The result type of the requests a batch in OpenAI `status` did not answer.
const char* unanswered_type(const std::string& status) {
  return status == "expired" ? "expired" : status == "failed" ? "errored" : "canceled";
}

}  // namespace

json MessageBatches::batch(const std::string& id) const {
  if (!id.starts_with(kAnthropicPrefix)) {
    throw ApiError(404, fmt::format("No such message batch: {}", id), "message_batch_id");
  }
  const std::string openai_id = std::string(kOpenAiPrefix) + id.substr(kAnthropicPrefix.size());
  json b;
  try {
    b = batches_.get(openai_id);
  } catch (const ApiError& e) {
    if (e.status() == 404) throw ApiError(404, fmt::format("No such message batch: {}", id), "message_batch_id");
    throw;
  }
  if (b.value("endpoint", "") != "/v1/messages") throw ApiError(404, fmt::format("No such message batch: {}", id), "message_batch_id");
  return b;
}

std::unordered_map<std::string, json> MessageBatches::answered(const json& b) const {
  std::unordered_map<std::string, json> out;
  const char* unanswered = unanswered_type(b["status"].get<std::string>());
  for (const char* key : {"output_file_id", "error_file_id"}) {
    if (!b[key].is_string()) continue;
    const auto data = files_.content(b[key].get<std::string>());
    if (!data) continue;
    each_line(*data, [&](const json& line, std::string custom_id) {
      if (!custom_id.empty()) out[std::move(custom_id)] = result_of(line, unanswered);
    });
  }
  return out;
}

json MessageBatches::to_anthropic(const json& b) const {
  const std::string openai_id = b["id"].get<std::string>();
  const std::string id = std::string(kAnthropicPrefix) + openai_id.substr(kOpenAiPrefix.size());
  const std::string status = b["status"].get<std::string>();
  const bool ended = batch_has_ended(status);
  const json& counts = b["request_counts"];
  int64_t total = counts.value("total", int64_t{0});
  int64_t succeeded = counts.value("completed", int64_t{0});
  const int64_t errored = counts.value("failed", int64_t{0});
  if (total == 0) {  // not yet validated: the requests are the input's lines
    if (auto data = files_.content(b["input_file_id"].get<std::string>())) {
      total = static_cast<int64_t>(custom_ids(*data).size());
    }
  }
  int64_t rest = std::max<int64_t>(0, total - succeeded - errored);
  if (status == "cancelled" || status == "expired") {
    // The requests a cancel or the deadline cut short answered with part of a message: counted
    // as the results show them (once: cut_short_), with the ones never sent.
    int64_t cut = -1;
    {
      const std::lock_guard<std::mutex> lock(cut_mutex_);
      if (const auto it = cut_short_.find(openai_id); it != cut_short_.end()) cut = it->second;
    }
    if (cut < 0) {
      cut = 0;
      for (const auto& [custom_id, result] : answered(b)) cut += result["type"] != "succeeded" && result["type"] != "errored";
      const std::lock_guard<std::mutex> lock(cut_mutex_);
      cut_short_[openai_id] = cut;
    }
    succeeded -= cut;
    rest += cut;
  }
  json request_counts = {{"processing", ended ? 0 : rest}, {"succeeded", succeeded}, {"errored", errored},
                         {"canceled", status == "cancelled" ? rest : 0}, {"expired", status == "expired" ? rest : 0}};
  if (status == "failed") request_counts["errored"] = errored + rest;  // the batch as a whole could not run
  json ended_at = nullptr;
  for (const char* key : {"completed_at", "failed_at", "expired_at", "cancelled_at"}) {
    if (b[key].is_number_integer()) ended_at = rfc3339(b[key]);
  }
  return {{"id", id},
          {"type", "message_batch"},
          {"processing_status", ended ? "ended" : status == "cancelling" ? "canceling" : "in_progress"},
          {"request_counts", std::move(request_counts)},
          {"ended_at", ended_at},
          {"created_at", rfc3339(b["created_at"])},
          {"expires_at", rfc3339(b["expires_at"])},
          {"archived_at", nullptr},
          {"cancel_initiated_at", rfc3339(b["cancelling_at"])},
          {"results_url", ended ? json("/v1/messages/batches/" + id + "/results") : json(nullptr)}};
}

json MessageBatches::create(const json& body) {
  if (!body.is_object()) throw ApiError(400, "the body must be a JSON object {\"requests\": [...]}");
  const json& requests = json_field(body, "requests");
  if (!requests.is_array() || requests.empty()) {
    throw ApiError(400, "requests: a list of {custom_id, params}, one at least, is required", "requests");
  }
  if (requests.size() > kMaxRequests) {
    throw ApiError(400, fmt::format("requests: {} of them; a batch holds at most {}", requests.size(), kMaxRequests),
                   "requests");
  }
  std::string file;
  std::unordered_set<std::string> seen;
  for (size_t i = 0; i < requests.size(); ++i) {
    const json& r = requests[i];
    const json& custom_id = r.is_object() ? json_field(r, "custom_id") : json();
    const json& params = r.is_object() ? json_field(r, "params") : json();
    if (!custom_id.is_string() || !valid_custom_id(custom_id.get<std::string>())) {
      throw ApiError(400, fmt::format("requests.{}.custom_id must be 1 to 64 letters, digits, '_' or '-'", i),
                     fmt::format("requests.{}.custom_id", i));
    }
    if (!seen.insert(custom_id.get<std::string>()).second) {
      throw ApiError(400, fmt::format("requests.{}.custom_id '{}' is used twice", i, custom_id.get<std::string>()),
                     fmt::format("requests.{}.custom_id", i));
    }
    if (!params.is_object()) {
      throw ApiError(400, fmt::format("requests.{}.params must be a Messages request object", i),
                     fmt::format("requests.{}.params", i));
    }
    if (params.contains("stream") && params["stream"] == true) {
      throw ApiError(400, fmt::format("requests.{}.params: a batch's requests are not streamed", i),
                     fmt::format("requests.{}.params.stream", i));
    }
    file += json{{"custom_id", custom_id}, {"method", "POST"}, {"url", "/v1/messages"}, {"body", params}}.dump();
    file += '\n';
  }
  const StoredFile input = files_.put(NewFile{"message_batch_requests.jsonl", "batch"}, std::move(file));
  try {
    return to_anthropic(batches_.create({{"input_file_id", input.id}, {"endpoint", "/v1/messages"}, {"completion_window", "24h"}}));
  } catch (...) {
    files_.erase(input.id);
    throw;
  }
}

json MessageBatches::get(const std::string& id) const { return to_anthropic(batch(id)); }

json MessageBatches::list(const std::string& before_id, const std::string& after_id, int64_t limit) const {
  if (!before_id.empty() && !after_id.empty()) throw ApiError(400, "give before_id or after_id, not both", "before_id");
  // Every message batch, newest first.
  std::vector<json> all;
  const json page = batches_.list("", INT64_MAX);
  for (const json& b : page["data"]) {
    if (b.value("endpoint", "") == "/v1/messages") all.push_back(to_anthropic(b));
  }
  const auto find = [&](const std::string& id, const char* param) {
    auto it = std::find_if(all.begin(), all.end(), [&](const json& b) { return b["id"] == id; });
    if (it == all.end()) throw ApiError(404, fmt::format("No such message batch: {}", id), param);
    return it - all.begin();
  };
  int64_t begin = 0, end = static_cast<int64_t>(all.size());
  if (!after_id.empty()) begin = find(after_id, "after_id") + 1;
  if (!before_id.empty()) {
    end = find(before_id, "before_id");
    begin = std::max<int64_t>(0, end - limit);
  }
  end = std::min(end, begin + limit);
  json data = json::array();
  for (int64_t i = begin; i < end; ++i) data.push_back(std::move(all[static_cast<size_t>(i)]));
  const bool more = before_id.empty() ? end < static_cast<int64_t>(all.size()) : begin > 0;
  return {{"data", data},
          {"has_more", more},
          {"first_id", data.empty() ? json(nullptr) : data.front()["id"]},
          {"last_id", data.empty() ? json(nullptr) : data.back()["id"]}};
}

json MessageBatches::cancel(const std::string& id) {
  const json b = batch(id);
  if (b["status"] == "cancelling") return to_anthropic(b);
  try {
    return to_anthropic(batches_.cancel(b["id"].get<std::string>()));
  } catch (const ApiError& e) {
    if (e.status() == 400) throw ApiError(400, fmt::format("the message batch {} has ended: it cannot be canceled", id));
    throw;
  }
}

json MessageBatches::erase(const std::string& id) {
  const json b = batch(id);
  if (!batch_has_ended(b["status"].get<std::string>())) {
    throw ApiError(400, fmt::format("the message batch {} has not ended: cancel it, then delete it", id));
  }
  batches_.erase(b["id"].get<std::string>());
  files_.erase(b["input_file_id"].get<std::string>());
  {
    const std::lock_guard<std::mutex> lock(cut_mutex_);
    cut_short_.erase(b["id"].get<std::string>());
  }
  return {{"id", id}, {"type", "message_batch_deleted"}};
}

std::string MessageBatches::results(const std::string& id) const {
  const json b = batch(id);
  if (!batch_has_ended(b["status"].get<std::string>())) {
    throw ApiError(400, fmt::format("the message batch {} is still being processed: its results come once it has ended", id));
  }
  std::unordered_map<std::string, json> answers = answered(b);
  const auto input = files_.content(b["input_file_id"].get<std::string>());
  if (!input) throw ApiError(404, fmt::format("the requests of the message batch {} are no longer kept", id));
  const json unanswered = {{"type", unanswered_type(b["status"].get<std::string>())}};
  std::string out;
  for (const std::string& custom_id : custom_ids(*input)) {
    auto it = answers.find(custom_id);
    json result = it != answers.end() ? std::move(it->second) : unanswered;
    if (it == answers.end() && b["status"] == "failed") {
      result["error"] = {{"type", "error"}, {"error", {{"type", "api_error"}, {"message", "the batch could not run"}}}};
    }
    out += json{{"custom_id", custom_id}, {"result", std::move(result)}}.dump();
    out += '\n';
  }
  return out;
}

}  // namespace duet::server
