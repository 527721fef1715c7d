// `duet bench serve --base-url http://127.0.0.1:8000 --model NAME --concurrency 16 --num-prompts 200
// --input-len 512 --output-len 128`: drives any OpenAI-compatible server (duet serve, llama.cpp's
// llama-server, vLLM) with streaming requests of random prompts and reports what vLLM's
// benchmarks/benchmark_serving.py reports, with its definitions:
//   TTFT  from sending a request (connecting included) to its first chunk with non-empty text;
//   ITL   between consecutive chunks with non-empty text;
//   TPOT  (E2EL - TTFT) / (output tokens - 1), for requests with more than one output token;
//   E2EL  from sending to "data: [DONE]";
// mean, median, population std and percentiles (numpy's linear interpolation) over the successful
// requests; throughputs over the wall time from the first send to the last reply. Output tokens
// are usage.completion_tokens (stream_options.include_usage), else the number of text chunks;
// input tokens are usage.prompt_tokens, else the planned length.
//
// The server's tokenizer is unknown here, so text prompts are shuffled words from a fixed list,
// and a few probe requests before the run find the number of words that the server counts as
// --input-len tokens (see WordPrompts). --token-ids sends random token ids instead
// (/v1/completions only).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "duet/cli/bench_commands.h"
#include "duet/cli/progress.h"
#include "duet/core/error.h"
#include "duet/core/random.h"
#include "duet/server/bench_client.h"
#include "duet/server/http_server.h"

namespace duet::cli {
namespace {

using json = nlohmann::ordered_json;
using server::BenchRequest;
using server::BenchResult;

struct ServeBenchOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";
  std::string model;
  std::string api_key;
  std::string ca_file;  // --cacert
  int64_t concurrency = 0;
  int64_t num_prompts = 1000;
  int64_t input_len = 1024;
  int64_t output_len = 128;
  std::string request_rate = "inf";
  uint64_t seed = 0;
  double temperature = 0.0;
  bool ignore_eos = true;
  bool token_ids = false;
  int64_t vocab_size = 0;
  double timeout = 600.0;
  std::vector<double> percentiles{99.0};
  std::string json_file;
  std::string extra_body;  // JSON object merged into every request (response_format, tools, ...)
};

// Common English words, most of them one token (with the leading space) in the vocabularies of
// Llama, Qwen and DeepSeek models.
constexpr std::array<const char*, 160> kWords = {
    "the",    "of",     "and",    "to",     "in",     "is",     "that",   "for",    "it",     "as",
    "was",    "with",   "be",     "by",     "on",     "not",    "he",     "this",   "are",    "or",
    "his",    "from",   "at",     "which",  "but",    "have",   "an",     "had",    "they",   "you",
    "were",   "their",  "one",    "all",    "we",     "can",    "her",    "has",    "there",  "been",
    "if",     "more",   "when",   "will",   "would",  "who",    "so",     "no",     "time",   "people",
    "year",   "way",    "day",    "man",    "thing",  "woman",  "life",   "child",  "world",  "school",
    "state",  "family", "group",  "country", "problem", "hand",  "part",   "place",  "case",   "week",
    "company", "system", "program", "question", "work", "number", "night", "point",  "home",   "water",
    "room",   "mother", "area",   "money",  "story",  "fact",   "month",  "lot",    "right",  "study",
    "book",   "eye",    "job",    "word",   "business", "issue", "side",  "kind",   "head",   "house",
    "service", "friend", "father", "power", "hour",   "game",   "line",   "end",    "member", "law",
    "car",    "city",   "name",   "team",   "minute", "idea",   "body",   "back",   "face",   "other",
    "level",  "office", "door",   "health", "person", "art",    "war",    "history", "party", "result",
    "change", "morning", "reason", "research", "girl", "guy",   "moment", "air",    "teacher", "force",
    "good",   "new",    "first",  "last",   "long",   "great",  "little", "own",    "old",    "big",
    "high",   "small",  "large",  "next",   "early",  "young",  "few",    "public", "bad",    "able",
};

// Text prompts: a fixed first word, then a multiset of words shuffled for each prompt. The
// multiset of W words is the first W of a seeded order of kWords, cycled; words after the first
// are tokenized one by one (each with its leading space), so every prompt of W words costs the
// server the same number of tokens, and more words never cost fewer. That lets the calibration
// search for the W that hits --input-len exactly.
class WordPrompts {
 public:
  explicit WordPrompts(uint64_t seed) : order_(kWords.size()) {
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<uint32_t>(i);
    Rng rng(seed ^ 0x3011d5ULL);
    shuffle(order_, rng);
  }

  // W words, in a random order when `rng` is given.
  std::string make(int64_t num_words, Rng* rng) const {
    std::vector<uint32_t> ids(static_cast<size_t>(num_words));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = order_[i % order_.size()];
    if (rng != nullptr) shuffle(ids, *rng);
    std::string text = "Words:";
    for (uint32_t id : ids) (text += ' ') += kWords[id];
    return text;
  }

 private:
  static void shuffle(std::vector<uint32_t>& v, Rng& rng) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.next() % i]);
  }

  std::vector<uint32_t> order_;
};

bool is_chat(const std::string& endpoint) { return endpoint.ends_with("chat/completions"); }

std::string request_body(const ServeBenchOptions& o, const json& prompt, int64_t max_tokens) {
  json body;
  body["model"] = o.model;
  if (is_chat(o.endpoint)) {
    body["messages"] = json::array({{{"role", "user"}, {"content", prompt}}});
  } else {
    body["prompt"] = prompt;
  }
  body["max_tokens"] = max_tokens;
  body["temperature"] = o.temperature;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (o.ignore_eos) body["ignore_eos"] = true;
  if (!o.extra_body.empty()) {
    const json extra = json::parse(o.extra_body, nullptr, false);
    if (!extra.is_object()) fail(ErrorCode::kInvalidArgument, "--extra-body must be a JSON object, got '{}'", o.extra_body);
    for (auto it = extra.begin(); it != extra.end(); ++it) body[it.key()] = it.value();
  }
  return body.dump();
}

server::BenchClientConfig client_config(const ServeBenchOptions& o) {
  server::BenchClientConfig c;
  c.url = server::parse_base_url(o.base_url);
  c.endpoint = o.endpoint;
  c.api_key = o.api_key;
  c.max_concurrency = o.concurrency;
  c.timeout_seconds = o.timeout;
  c.ca_file = o.ca_file;
  return c;
}

// One calibration request on its own (its one output token may be held back as part of a
// character, so no text is required); a failure ends the benchmark with the server's reason.
BenchResult send_probe(const ServeBenchOptions& o, const std::string& prompt) {
  server::BenchClientConfig c = client_config(o);
  c.max_concurrency = 1;
  BenchRequest req{request_body(o, prompt, 1), o.ignore_eos ? 1 : 0, false};
  BenchResult r = server::run_bench_requests(c, {req}, {0.0}).results.at(0);
  if (!r.success) {
    fail(ErrorCode::kUnavailable, "a calibration request to {}{} failed: {} (check --base-url, --endpoint and --model)",
         o.base_url, o.endpoint, r.error);
  }
  return r;
}

struct Calibration {
  int64_t words = 0;
  int64_t tokens = -1;  // what the server counts for a prompt of `words` words; -1: no usage
};

// The number of words per prompt whose prompt tokens (as the server counts them: special tokens
// and chat template included) come closest to --input-len: probe requests with one output token,
// doubling from input_len / 4 words until past the target, then interpolating between the closest
// counts below and above.
Calibration calibrate_words(const ServeBenchOptions& o, const WordPrompts& prompts) {
  const int64_t target = o.input_len;
  std::map<int64_t, int64_t> measured;  // words -> prompt tokens, increasing in both
  auto measure = [&](int64_t words) {
    measured[words] = send_probe(o, prompts.make(words, nullptr)).prompt_tokens;
    return measured[words];
  };
  if (measure(std::max<int64_t>(1, target / 4)) < 0) {
    fmt::print(stderr, "duet bench serve: the server reports no usage.prompt_tokens; prompts are {} words\n", target);
    return {target, -1};
  }
  for (int step = 0; step < 24; ++step) {
    std::optional<std::pair<int64_t, int64_t>> below, above;  // closest (words, tokens) <= and > target
    for (const auto& [w, t] : measured) {
      if (t <= target) below = {w, t};
      if (t > target && !above) above = {w, t};
    }
    int64_t next = 0;
    if (below && below->second == target) break;
    if (!above) {
      if (below->first > 16 * target) break;  // the server's counts do not grow with the prompt
      next = below->first * 2;
    } else if (!below) {
      if (above->first == 1) break;
      next = std::max<int64_t>(1, above->first / 2);
    } else {
      if (above->first - below->first <= 1) break;
      const double f = static_cast<double>(target - below->second) / static_cast<double>(above->second - below->second);
      next = below->first + std::llround(f * static_cast<double>(above->first - below->first));
      next = std::clamp(next, below->first + 1, above->first - 1);
    }
    measure(next);
  }
  Calibration best{measured.begin()->first, measured.begin()->second};
  for (const auto& [w, t] : measured) {
    if (std::abs(t - target) < std::abs(best.tokens - target)) best = {w, t};
  }
  fmt::print(stderr, "duet bench serve: prompts are {} word{}, {} tokens for this server ({} calibration requests)\n",
             best.words, best.words == 1 ? "" : "s", best.tokens, measured.size());
  if (best.tokens > target && best.words == 1) {
    fmt::print(stderr, "duet bench serve: even one word makes {} prompt tokens, more than --input-len {}\n", best.tokens,
               target);
  }
  return best;
}

// Seconds after the start at which each request arrives: all at once for an infinite rate, else a
// Poisson process (exponential gaps), scaled so the last one arrives at num_prompts / rate as
// vLLM does.
std::vector<double> arrival_times(int64_t n, double rate, uint64_t seed) {
  std::vector<double> t(static_cast<size_t>(n), 0.0);
  if (std::isinf(rate)) return t;
  Rng rng(seed ^ 0xa11ea1ULL);
  double now = 0.0;
  for (double& x : t) {
    now += -std::log(1.0 - rng.uniform()) / rate;
    x = now;
  }
  if (now > 0.0) {
    const double scale = static_cast<double>(n) / rate / now;
    for (double& x : t) x *= scale;
  }
  return t;
}

// numpy.percentile's default (linear interpolation between the closest ranks).
double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0.0;
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(sorted.size() - 1, lo + 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - static_cast<double>(lo));
}

struct Summary {
  double mean = 0.0, median = 0.0, std = 0.0;
  std::vector<double> percentiles;  // in the order of --percentiles
};

// Seconds in, milliseconds out; an empty list gives zeros (as vLLM's `np.mean(x or 0)`).
Summary summarize(std::vector<double> x, const std::vector<double>& percentiles) {
  Summary s;
  for (double& v : x) v *= 1000.0;
  std::sort(x.begin(), x.end());
  if (!x.empty()) {
    for (double v : x) s.mean += v / static_cast<double>(x.size());
    for (double v : x) s.std += (v - s.mean) * (v - s.mean) / static_cast<double>(x.size());
    s.std = std::sqrt(s.std);
    s.median = percentile(x, 50.0);
  }
  for (double p : percentiles) s.percentiles.push_back(percentile(x, p));
  return s;
}

std::string percentile_name(double p) {
  return p == std::floor(p) ? fmt::format("{}", static_cast<int64_t>(p)) : fmt::format("{}", p);
}

// What a run measured, computed as vLLM's calculate_metrics: over the successful requests only.
struct ServeMetrics {
  int64_t completed = 0, failed = 0, total_input = 0, total_output = 0;
  int64_t peak_concurrency = 0, peak_output_tokens_per_s = 0;
  double duration = 0.0;
  std::vector<double> ttfts, tpots, itls, e2els;               // seconds
  std::vector<std::pair<int64_t, std::string>> errors;          // count, reason; most frequent first
  json input_lens = json::array(), output_lens = json::array(), ttft_list = json::array();  // per request
  // What the server's duet:energy_joules_total rose by during the run; none when it has no
  // such metric (the machine exposes no energy counter, or another engine).
  std::optional<double> energy_joules;
};

ServeMetrics compute_metrics(const server::BenchRun& run, int64_t planned_input_tokens) {
  ServeMetrics m;
  m.duration = run.duration_seconds;
  std::map<std::string, int64_t> errors;
  std::vector<std::pair<double, int>> spans;  // request start (+1) and end (-1)
  std::map<int64_t, int64_t> tokens_per_second;
  for (const BenchResult& r : run.results) {
    if (!r.success) {
      ++m.failed;
      ++errors[r.error];
      m.input_lens.push_back(0);
      m.output_lens.push_back(0);
      m.ttft_list.push_back(0.0);
      continue;
    }
    ++m.completed;
    const int64_t in = r.prompt_tokens >= 0 ? r.prompt_tokens : planned_input_tokens;
    m.total_input += in;
    m.total_output += r.output_tokens;
    m.input_lens.push_back(in);
    m.output_lens.push_back(r.output_tokens);
    m.ttft_list.push_back(r.ttft);
    m.ttfts.push_back(r.ttft);
    m.e2els.push_back(r.latency);
    m.itls.insert(m.itls.end(), r.itl.begin(), r.itl.end());
    if (r.output_tokens > 1) m.tpots.push_back((r.latency - r.ttft) / static_cast<double>(r.output_tokens - 1));
    spans.push_back({r.start, 1});
    spans.push_back({r.start + r.latency, -1});
    double t = r.start + r.ttft;  // one text chunk counted as one token, as vLLM does here
    ++tokens_per_second[static_cast<int64_t>(t)];
    for (double gap : r.itl) ++tokens_per_second[static_cast<int64_t>(t += gap)];
  }
  std::sort(spans.begin(), spans.end());  // an end before a start at the same time
  int64_t in_flight = 0;
  for (const auto& [t, delta] : spans) m.peak_concurrency = std::max(m.peak_concurrency, in_flight += delta);
  for (const auto& [second, n] : tokens_per_second) m.peak_output_tokens_per_s = std::max(m.peak_output_tokens_per_s, n);
  for (const auto& [reason, n] : errors) m.errors.push_back({n, reason});
  std::stable_sort(m.errors.begin(), m.errors.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return m;
}

// Prints vLLM's result table on stdout and returns the JSON result with vLLM's field names.
json report(const ServeBenchOptions& o, double rate, const ServeMetrics& m) {
  const double dur = m.duration;
  auto row = [](std::string_view name, const auto& value) { fmt::print("{:<40} {:<10}\n", name, value); };
  auto frow = [](std::string_view name, double value) { fmt::print("{:<40} {:<10.2f}\n", name, value); };
  fmt::print("{:=^50}\n", " Serving Benchmark Result ");
  row("Successful requests:", m.completed);
  row("Failed requests:", m.failed);
  if (o.concurrency > 0) row("Maximum request concurrency:", o.concurrency);
  if (!std::isinf(rate)) frow("Request rate configured (RPS):", rate);
  frow("Benchmark duration (s):", dur);
  row("Total input tokens:", m.total_input);
  row("Total generated tokens:", m.total_output);
  frow("Request throughput (req/s):", static_cast<double>(m.completed) / dur);
  frow("Output token throughput (tok/s):", static_cast<double>(m.total_output) / dur);
  frow("Peak output token throughput (tok/s):", static_cast<double>(m.peak_output_tokens_per_s));
  frow("Peak concurrent requests:", static_cast<double>(m.peak_concurrency));
  frow("Total Token throughput (tok/s):", static_cast<double>(m.total_input + m.total_output) / dur);
  if (m.energy_joules) {
    frow("Energy (J):", *m.energy_joules);
    frow("Energy per output token (J/tok):", m.total_output > 0 ? *m.energy_joules / static_cast<double>(m.total_output) : 0.0);
  }

  std::array<char, 32> date{};
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(date.data(), date.size(), "%Y%m%d-%H%M%S", &local);
  json r;
  r["date"] = date.data();
  r["backend"] = is_chat(o.endpoint) ? "openai-chat" : "openai";
  r["base_url"] = o.base_url;
  r["endpoint"] = o.endpoint;
  r["model_id"] = o.model;
  r["num_prompts"] = o.num_prompts;
  r["input_len"] = o.input_len;
  r["output_len"] = o.output_len;
  r["request_rate"] = std::isinf(rate) ? json("inf") : json(rate);
  r["burstiness"] = 1.0;
  r["max_concurrency"] = o.concurrency > 0 ? json(o.concurrency) : json(nullptr);
  r["duration"] = dur;
  r["completed"] = m.completed;
  r["failed"] = m.failed;
  r["total_input_tokens"] = m.total_input;
  r["total_output_tokens"] = m.total_output;
  r["request_throughput"] = static_cast<double>(m.completed) / dur;
  r["output_throughput"] = static_cast<double>(m.total_output) / dur;
  r["total_token_throughput"] = static_cast<double>(m.total_input + m.total_output) / dur;
  r["max_output_tokens_per_s"] = m.peak_output_tokens_per_s;
  r["max_concurrent_requests"] = m.peak_concurrency;
  r["energy_joules"] = m.energy_joules ? json(*m.energy_joules) : json(nullptr);
  r["joules_per_output_token"] = m.energy_joules && m.total_output > 0
                                     ? json(*m.energy_joules / static_cast<double>(m.total_output))
                                     : json(nullptr);

  const std::array<std::tuple<const char*, const char*, const char*, const std::vector<double>*>, 4> metrics = {{
      {"ttft", "TTFT", "Time to First Token", &m.ttfts},
      {"tpot", "TPOT", "Time per Output Token (excl. 1st token)", &m.tpots},
      {"itl", "ITL", "Inter-token Latency", &m.itls},
      {"e2el", "E2EL", "End-to-end Latency", &m.e2els},
  }};
  for (const auto& [key, name, header, values] : metrics) {
    const Summary s = summarize(*values, o.percentiles);
    fmt::print("{:-^50}\n", header);
    frow(fmt::format("Mean {} (ms):", name), s.mean);
    frow(fmt::format("Median {} (ms):", name), s.median);
    frow(fmt::format("Std {} (ms):", name), s.std);
    r[fmt::format("mean_{}_ms", key)] = s.mean;
    r[fmt::format("median_{}_ms", key)] = s.median;
    r[fmt::format("std_{}_ms", key)] = s.std;
    for (size_t i = 0; i < o.percentiles.size(); ++i) {
      const std::string p = percentile_name(o.percentiles[i]);
      frow(fmt::format("P{} {} (ms):", p, name), s.percentiles[i]);
      r[fmt::format("p{}_{}_ms", p, key)] = s.percentiles[i];
    }
  }
  fmt::print("{:=^50}\n", "");
  std::fflush(stdout);

  json errors = json::array();  // the distinct reasons, ten at most
  for (size_t i = 0; i < m.errors.size() && i < 10; ++i) {
    const auto& [n, reason] = m.errors[i];
    fmt::print(stderr, "duet bench serve: {} request{} failed: {}\n", n, n == 1 ? "" : "s", reason);
    errors.push_back(fmt::format("{} x {}", n, reason));
  }
  r["errors"] = errors;
  r["input_lens"] = m.input_lens;
  r["output_lens"] = m.output_lens;
  r["ttfts"] = m.ttft_list;
  return r;
}

double parse_request_rate(const std::string& text) {
  if (text == "inf") return std::numeric_limits<double>::infinity();
  double rate = -1.0;
  try {
    size_t used = 0;
    rate = std::stod(text, &used);
    if (used != text.size()) rate = -1.0;
  } catch (const std::exception&) {
  }
  if (!(rate > 0.0) || std::isinf(rate)) fail(ErrorCode::kInvalidArgument, "--request-rate is '{}', expected inf or requests/s > 0", text);
  return rate;
}

int run_bench_serve(const ServeBenchOptions& o) {
  if (o.num_prompts < 1 || o.input_len < 1 || o.output_len < 1) {
    fail(ErrorCode::kInvalidArgument, "--num-prompts, --input-len and --output-len must be at least 1");
  }
  if (o.concurrency < 0) fail(ErrorCode::kInvalidArgument, "--concurrency is {}, expected 0 (no limit) or more", o.concurrency);
  if (!o.endpoint.starts_with('/')) fail(ErrorCode::kInvalidArgument, "--endpoint '{}' must start with '/'", o.endpoint);
  if (o.token_ids && is_chat(o.endpoint)) {
    fail(ErrorCode::kInvalidArgument, "--token-ids works with /v1/completions only, not '{}'", o.endpoint);
  }
  if (o.token_ids && o.vocab_size < 1) fail(ErrorCode::kInvalidArgument, "--token-ids needs --vocab-size (the model's)");
  for (double p : o.percentiles) {
    if (!(p > 0.0 && p < 100.0)) fail(ErrorCode::kInvalidArgument, "--percentiles has {}, expected values in (0, 100)", p);
  }
  const double rate = parse_request_rate(o.request_rate);
  const server::BenchClientConfig config = client_config(o);  // checks --base-url
  server::raise_open_file_limit();

  // Prompts: calibrated shuffled words, or random token ids.
  const WordPrompts word_prompts(o.seed);
  const Calibration cal = o.token_ids ? Calibration{o.input_len, o.input_len} : calibrate_words(o, word_prompts);
  Rng rng(o.seed);
  std::vector<BenchRequest> requests;
  for (int64_t i = 0; i < o.num_prompts; ++i) {
    json prompt;
    if (o.token_ids) {
      prompt = json::array();
      for (int64_t k = 0; k < o.input_len; ++k) prompt.push_back(rng.next() % static_cast<uint64_t>(o.vocab_size));
    } else {
      prompt = word_prompts.make(cal.words, &rng);
    }
    requests.push_back({request_body(o, prompt, o.output_len), o.ignore_eos ? o.output_len : 0, true});
  }

  // As vLLM: one real request first, so that a wrong setting fails fast with the server's reason.
  fmt::print(stderr, "duet bench serve: initial test request...\n");
  server::BenchClientConfig alone = config;
  alone.max_concurrency = 1;
  const BenchResult test = server::run_bench_requests(alone, {requests[0]}, {0.0}).results.at(0);
  if (!test.success) fail(ErrorCode::kUnavailable, "the initial test request to {}{} failed: {}", o.base_url, o.endpoint, test.error);
  fmt::print(stderr, "duet bench serve: {} requests, request rate {}, max concurrency {}\n", o.num_prompts,
             o.request_rate, o.concurrency > 0 ? fmt::format("{}", o.concurrency) : std::string("unlimited"));

  // The server's energy counter around the run (duet's /metrics, where the machine exposes one).
  auto energy_now = [&]() -> std::optional<double> {
    const std::optional<std::string> text = server::http_get(config.url, "/metrics", o.api_key, o.ca_file);
    return text ? server::energy_joules_in_metrics(*text) : std::nullopt;
  };
  const std::optional<double> energy_before = energy_now();
  Progress progress("requests");
  const size_t total = requests.size();
  const server::BenchRun run = server::run_bench_requests(config, requests, arrival_times(o.num_prompts, rate, o.seed),
                                                          [&](size_t done) { progress.update(done, total); });
  progress.finish();
  ServeMetrics metrics = compute_metrics(run, cal.tokens >= 0 ? cal.tokens : cal.words);
  if (const std::optional<double> energy_after = energy_now(); energy_before && energy_after) {
    metrics.energy_joules = *energy_after - *energy_before;
  } else {
    fmt::print(stderr, "duet bench serve: the server reports no duet:energy_joules_total (no energy counter on its "
               "machine, or not duet): no energy figures\n");
  }
  const json result = report(o, rate, metrics);
  if (!o.json_file.empty()) {
    std::ofstream f(o.json_file);
    f << result.dump(2) << '\n';
    if (!f) fail(ErrorCode::kUnavailable, "cannot write --json '{}'", o.json_file);
  }
  if (metrics.completed == 0) fail(ErrorCode::kUnavailable, "all {} requests failed", metrics.failed);
  return 0;
}

}  // namespace

void add_bench_serve_command(CLI::App* bench, int& exit_code) {
  auto* cmd = bench->add_subcommand("serve", "Benchmark an OpenAI-compatible server with streaming requests (like vLLM's)");
  auto o = std::make_shared<ServeBenchOptions>();
  if (const char* key = std::getenv("OPENAI_API_KEY")) o->api_key = key;
  cmd->add_option("--base-url", o->base_url, "Server address (http:// or https://)")->capture_default_str();
  cmd->add_option("--cacert", o->ca_file, "https: CA certificates (PEM) to trust besides the system's");
  cmd->add_option("--endpoint", o->endpoint, "/v1/completions or /v1/chat/completions")->capture_default_str();
  cmd->add_option("--model", o->model, "Model name sent in each request")->required();
  cmd->add_option("--api-key", o->api_key, "Sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY)");
  cmd->add_option("-c,--concurrency,--max-concurrency", o->concurrency, "Requests in flight at most (0: no limit)")
      ->capture_default_str();
  cmd->add_option("-n,--num-prompts", o->num_prompts, "Requests")->capture_default_str();
  cmd->add_option("--input-len", o->input_len, "Prompt tokens per request")->capture_default_str();
  cmd->add_option("--output-len", o->output_len, "Generated tokens per request (max_tokens)")->capture_default_str();
  cmd->add_option("--request-rate", o->request_rate, "Requests/s, Poisson arrivals; inf: all at once")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed for the prompts and arrival times")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "Sampling temperature")->capture_default_str();
  cmd->add_flag("--ignore-eos,!--no-ignore-eos", o->ignore_eos,
                "Send ignore_eos so every request generates --output-len tokens, fewer is a failure (default: on)");
  cmd->add_flag("--token-ids", o->token_ids, "Send random token ids as the prompt instead of words (needs --vocab-size)");
  cmd->add_option("--vocab-size", o->vocab_size, "Token ids are drawn from [0, N) with --token-ids");
  cmd->add_option("--timeout", o->timeout, "Seconds a request may wait for any data before it fails")->capture_default_str();
  cmd->add_option("--percentiles", o->percentiles, "Percentiles reported (comma separated)")->delimiter(',')->capture_default_str();
  cmd->add_option("--extra-body", o->extra_body,
                  "A JSON object merged into every request, e.g. '{\"response_format\": {\"type\": \"json_object\"}}'");
  cmd->add_option("--json", o->json_file, "Also write the results as JSON with vLLM's field names");
  cmd->callback([o, &exit_code] { exit_code = run_bench_serve(*o); });
}

}  // namespace duet::cli
