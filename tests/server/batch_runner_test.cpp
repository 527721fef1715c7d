// The batch runner (`duet run-batch`) against handlers that answer from other threads, late and
// out of order: one output line per input request, in the input's order, the window of requests
// in flight kept, the handler's errors passed on, and lines that are not requests answered with an
// error and never handed to the handler.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_set>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "duet/server/batch_runner.h"

namespace duet::server {
namespace {

using nlohmann::json;

std::string request_line(const std::string& id, const std::string& url = "/v1/completions", json body = {{"prompt", "x"}}) {
  return json{{"custom_id", id}, {"method", "POST"}, {"url", url}, {"body", std::move(body)}}.dump();
}

std::vector<json> lines_of(const std::string& text) {
  std::vector<json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line));
  return out;
}

// Answers each request from a thread of its own after a random delay; the body echoes what came in.
class LateHandler {
 public:
  explicit LateHandler(int max_delay_ms) : max_delay_ms_(max_delay_ms) {}
  ~LateHandler() {
    for (auto& t : threads_) t.join();
  }
  HttpHandler handler() {
    return [this](HttpRequest&& req, std::shared_ptr<Responder> res) {
      const int now = ++outstanding_;
      int seen = max_outstanding_.load();
      while (now > seen && !max_outstanding_.compare_exchange_weak(seen, now)) {
      }
      ++calls_;
      int delay = 0;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        delay = std::uniform_int_distribution<int>(0, max_delay_ms_)(rng_);
      }
      std::lock_guard<std::mutex> lock(mutex_);
      threads_.emplace_back([this, req = std::move(req), res, delay] {
        std::this_thread::sleep_for(std::chrono::milliseconds(delay));
        const json in = json::parse(req.body);
        json body = {{"path", req.path}, {"method", req.method}, {"prompt", in.value("prompt", "")},
                     {"usage", {{"prompt_tokens", 3}, {"completion_tokens", 2}}}};
        --outstanding_;
        res->send(200, "application/json", body.dump(), {{"X-Request-Id", fmt::format("r{}", in.value("prompt", ""))}});
      });
    };
  }
  int calls() const { return calls_; }
  int max_outstanding() const { return max_outstanding_; }

 private:
  const int max_delay_ms_;
  std::mutex mutex_;
  std::mt19937 rng_{7};
  std::vector<std::thread> threads_;
  std::atomic<int> outstanding_{0}, max_outstanding_{0}, calls_{0};
};

TEST(BatchRunner, AnswersInInputOrderWithinTheWindow) {
  std::string input;
  for (int i = 0; i < 40; ++i) input += request_line(fmt::format("req-{}", i), "/v1/completions", {{"prompt", std::to_string(i)}}) + "\n";
  std::istringstream in(input);
  std::ostringstream out;
  LateHandler late(20);
  BatchRunOptions options;
  options.max_in_flight = 6;
  const BatchRunStats stats = run_batch_lines(in, out, late.handler(), options);
  const std::vector<json> lines = lines_of(out.str());
  ASSERT_EQ(lines.size(), 40u);
  for (int i = 0; i < 40; ++i) {
    const json& l = lines[i];
    EXPECT_EQ(l["custom_id"], fmt::format("req-{}", i));
    EXPECT_EQ(l["response"]["status_code"], 200);
    EXPECT_EQ(l["response"]["request_id"], fmt::format("r{}", i));
    EXPECT_EQ(l["id"], fmt::format("batch_req_r{}", i));
    EXPECT_EQ(l["response"]["body"]["prompt"], std::to_string(i));
    EXPECT_EQ(l["response"]["body"]["path"], "/v1/completions");
    EXPECT_EQ(l["response"]["body"]["method"], "POST");
    EXPECT_TRUE(l["error"].is_null());
  }
  EXPECT_EQ(stats.lines, 40);
  EXPECT_EQ(stats.succeeded, 40);
  EXPECT_EQ(stats.failed, 0);
  EXPECT_EQ(stats.prompt_tokens, 120);
  EXPECT_EQ(stats.completion_tokens, 80);
  EXPECT_LE(late.max_outstanding(), 6);
  EXPECT_GE(late.max_outstanding(), 2);  // it did run several at once
}

TEST(BatchRunner, LinesThatAreNotRequestsGetAnErrorAndNeverReachTheHandler) {
  const std::string input =
      request_line("ok-1") + "\n" +
      "\n  \r\n" +                                   // blank: skipped, not a line of the output
      "{not json\n" +                                 // invalid_json
      "[1, 2]\n" +                                    // not an object
      R"({"method": "POST", "url": "/v1/completions", "body": {}})" "\n" +  // no custom_id
      request_line("ok-1") + "\n" +                   // repeated
      R"({"custom_id": "get", "method": "GET", "url": "/v1/completions", "body": {}})" "\n" +
      request_line("models", "/v1/models") + "\n" +
      request_line("query", "/v1/completions?x=1") + "\n" +
      R"({"custom_id": "nobody", "method": "POST", "url": "/v1/completions", "body": "text"})" "\n" +
      request_line("stream", "/v1/chat/completions", {{"messages", json::array()}, {"stream", true}}) + "\n" +
      request_line("background", "/v1/responses", {{"input", "hi"}, {"background", true}}) + "\n" +
      request_line("unstreamed", "/v1/completions", {{"prompt", "y"}, {"stream", false}}) + "\r\n";
  std::istringstream in(input);
  std::ostringstream out;
  LateHandler late(5);
  const BatchRunStats stats = run_batch_lines(in, out, late.handler());
  const std::vector<json> lines = lines_of(out.str());
  ASSERT_EQ(lines.size(), 12u);
  EXPECT_EQ(late.calls(), 2);
  EXPECT_EQ(stats.lines, 12);
  EXPECT_EQ(stats.succeeded, 2);
  EXPECT_EQ(stats.failed, 10);
  const std::vector<std::pair<json, std::string>> expected = {
      {"ok-1", ""}, {nullptr, "invalid_json"}, {nullptr, "invalid_request"}, {nullptr, "invalid_request"},
      {"ok-1", "duplicate_custom_id"}, {"get", "invalid_request"}, {"models", "invalid_url"},
      {"query", "invalid_url"}, {"nobody", "invalid_request"}, {"stream", "invalid_request"},
      {"background", "invalid_request"}, {"unstreamed", ""}};
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(i);
    const json& l = lines[i];
    EXPECT_EQ(l["custom_id"], expected[i].first);
    EXPECT_TRUE(l["id"].get<std::string>().starts_with("batch_req_"));
    if (expected[i].second.empty()) {
      EXPECT_EQ(l["response"]["status_code"], 200);
      EXPECT_TRUE(l["error"].is_null());
    } else {
      EXPECT_TRUE(l["response"].is_null());
      EXPECT_EQ(l["error"]["code"], expected[i].second);
      EXPECT_FALSE(l["error"]["message"].get<std::string>().empty());
    }
  }
  // The messages name the input line (blank lines counted).
  EXPECT_NE(lines[1]["error"]["message"].get<std::string>().find("line 4"), std::string::npos) << lines[1];
}

TEST(BatchRunner, ALongFirstRequestHoldsBackTheReadingNotTheMemory) {
  std::string input;
  for (int i = 0; i < 50; ++i) input += request_line(fmt::format("p{}", i)) + "\n";
  std::istringstream in(input);
  std::ostringstream out;
  std::atomic<int> calls{0}, calls_before_first{-1};
  std::thread first;
  HttpHandler handler = [&](HttpRequest&&, std::shared_ptr<Responder> res) {
    if (calls++ == 0) {
      // The first line runs long; every other one is answered at once.
      first = std::thread([&, res] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        calls_before_first = calls.load();
        res->send(200, "application/json", "{}", {});
      });
      return;
    }
    res->send(200, "application/json", "{}", {});
  };
  BatchRunOptions options;
  options.max_in_flight = 4;
  options.max_pending = 10;
  const BatchRunStats stats = run_batch_lines(in, out, handler, options);
  first.join();
  EXPECT_EQ(stats.succeeded, 50);
  // The first one in flight and nine answers held behind it: no more was read meanwhile.
  EXPECT_EQ(calls_before_first.load(), 10);
  const std::vector<json> lines = lines_of(out.str());
  ASSERT_EQ(lines.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(lines[i]["custom_id"], fmt::format("p{}", i));
}

TEST(BatchRunner, OneEndpointAndAnErrorFile) {
  const std::string input = request_line("c1", "/v1/chat/completions", {{"messages", json::array()}}) + "\n" +
                            request_line("x1", "/v1/completions") + "\n" +
                            request_line("c2", "/v1/chat/completions", {{"messages", json::array()}, {"fail", true}}) +
                            "\n" + request_line("c3", "/v1/chat/completions", {{"messages", json::array()}}) + "\n";
  HttpHandler handler = [](HttpRequest&& req, std::shared_ptr<Responder> res) {
    EXPECT_TRUE(req.internal);
    const bool fail = json::parse(req.body).value("fail", false);
    res->send(fail ? 400 : 200, "application/json", fail ? R"({"error": {"message": "no"}})" : "{}", {});
  };
  {
    std::istringstream in(input);
    std::ostringstream out, errors;
    BatchRunOptions options;
    options.endpoint = "/v1/chat/completions";
    options.errors = &errors;
    const BatchRunStats stats = run_batch_lines(in, out, handler, options);
    EXPECT_EQ(stats.succeeded, 2);
    EXPECT_EQ(stats.failed, 2);
    const std::vector<json> ok = lines_of(out.str()), bad = lines_of(errors.str());
    ASSERT_EQ(ok.size(), 2u);
    ASSERT_EQ(bad.size(), 2u);
    EXPECT_EQ(ok[0]["custom_id"], "c1");
    EXPECT_EQ(ok[1]["custom_id"], "c3");
    EXPECT_EQ(bad[0]["custom_id"], "x1");
    EXPECT_EQ(bad[0]["error"]["code"], "invalid_url");
    EXPECT_EQ(bad[1]["custom_id"], "c2");
    EXPECT_EQ(bad[1]["response"]["status_code"], 400);
  }
  {
    std::istringstream in(input + "\n{bad\n" + request_line("c1", "/v1/chat/completions") + "\n");
    int64_t requests = 0;
    const std::vector<BatchLineError> errors = validate_batch_lines(in, "/v1/chat/completions", 10, &requests);
    EXPECT_EQ(requests, 6);
    ASSERT_EQ(errors.size(), 3u);
    EXPECT_EQ(errors[0].line, 2);
    EXPECT_EQ(errors[0].code, "invalid_url");
    EXPECT_EQ(errors[1].line, 6);
    EXPECT_EQ(errors[1].code, "invalid_json");
    EXPECT_EQ(errors[2].line, 7);
    EXPECT_EQ(errors[2].code, "duplicate_custom_id");
    std::istringstream again(input);
    EXPECT_EQ(validate_batch_lines(again, "/v1/chat/completions", 0).size(), 0u);  // counted, none kept
  }
}

TEST(BatchRunner, CancelledRunsAbortWhatIsInFlightAndSendNoMore) {
  std::string input;
  for (int i = 0; i < 20; ++i) input += request_line(fmt::format("k{}", i)) + "\n";
  std::istringstream in(input);
  std::ostringstream out;
  std::atomic<bool> cancel{false};
  std::atomic<int> calls{0};
  std::mutex mutex;
  std::vector<std::thread> threads;
  // Nothing is answered until its client goes away; half of the requests register for that late.
  HttpHandler handler = [&](HttpRequest&&, std::shared_ptr<Responder> res) {
    const int n = calls++;
    auto answer_when_gone = [res] {
      res->on_disconnect([res] { res->send(200, "application/json", R"({"aborted": true})", {}); });
    };
    if (n % 2 == 0) return answer_when_gone();
    std::lock_guard<std::mutex> lock(mutex);
    threads.emplace_back([answer_when_gone] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      answer_when_gone();
    });
  };
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cancel = true;
  });
  BatchRunOptions options;
  options.max_in_flight = 4;
  options.cancel = &cancel;
  const BatchRunStats stats = run_batch_lines(in, out, handler, options);
  canceller.join();
  for (auto& t : threads) t.join();
  EXPECT_EQ(calls.load(), 4);
  EXPECT_EQ(stats.lines, 4);
  EXPECT_EQ(stats.succeeded, 4);
  const std::vector<json> lines = lines_of(out.str());
  ASSERT_EQ(lines.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(lines[i]["custom_id"], fmt::format("k{}", i));
    EXPECT_EQ(lines[i]["response"]["body"]["aborted"], true);
  }
}

TEST(BatchRunner, AnInterruptedRunWritesNothingMoreAndSkippedLinesAreNotSent) {
  // Lines k0..k9; k1 and k4 were answered by an earlier run (skip). The first three sent are
  // answered at once, the next two only when their client goes away: the interrupt comes then.
  std::string input;
  for (int i = 0; i < 10; ++i) {
    const std::string id = fmt::format("k{}", i);
    input += request_line(id, "/v1/completions", {{"prompt", id}}) + "\n";
  }
  std::istringstream in(input);
  std::ostringstream out;
  std::atomic<bool> interrupt{false};
  std::mutex mutex;
  std::vector<std::string> sent;
  HttpHandler handler = [&](HttpRequest&& req, std::shared_ptr<Responder> res) {
    size_t n = 0;
    {
      std::lock_guard<std::mutex> lock(mutex);
      sent.push_back(json::parse(req.body)["prompt"]);
      n = sent.size();
    }
    if (n <= 3) return res->send(200, "application/json", R"({"ok": true})", {});
    res->on_disconnect([res] { res->send(200, "application/json", R"({"aborted": true})", {}); });
    if (n == 5) interrupt = true;
  };
  const std::unordered_set<std::string> skip = {"k1", "k4"};
  BatchRunOptions options;
  options.max_in_flight = 2;
  options.interrupt = &interrupt;
  options.skip = &skip;
  run_batch_lines(in, out, handler, options);
  std::lock_guard<std::mutex> lock(mutex);
  EXPECT_EQ(sent, (std::vector<std::string>{"k0", "k2", "k3", "k5", "k6"}));  // nothing after the interrupt
  const std::vector<json> lines = lines_of(out.str());
  ASSERT_EQ(lines.size(), 3u);  // the aborted answers are not written
  const char* want[] = {"k0", "k2", "k3"};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(lines[i]["custom_id"], want[i]);
    EXPECT_EQ(lines[i]["response"]["body"]["ok"], true);
  }
}

TEST(BatchRunner, A503IsTheLinesAnswer) {
  std::string input;
  for (int i = 0; i < 5; ++i) input += request_line(fmt::format("u{}", i)) + "\n";
  std::istringstream in(input);
  std::ostringstream out;
  std::atomic<int> calls{0};
  HttpHandler unavailable = [&calls](HttpRequest&&, std::shared_ptr<Responder> res) {
    ++calls;
    res->send(503, "application/json", R"({"error": {"message": "the engine is unhealthy"}})", {});
  };
  const BatchRunStats stats = run_batch_lines(in, out, unavailable);
  EXPECT_EQ(stats.failed, 5);
  EXPECT_EQ(stats.succeeded, 0);
  EXPECT_EQ(calls.load(), 5);
  const std::vector<json> lines = lines_of(out.str());
  ASSERT_EQ(lines.size(), 5u);
  for (const json& l : lines) {
    EXPECT_EQ(l["response"]["status_code"], 503);
    EXPECT_EQ(l["response"]["body"]["error"]["message"], "the engine is unhealthy");
  }
}

TEST(BatchRunner, AStreamedReplyIsKeptAsText) {
  std::istringstream in(request_line("s") + "\n");
  std::ostringstream out;
  HttpHandler streams = [](HttpRequest&&, std::shared_ptr<Responder> res) {
    res->start_stream(200, "text/event-stream", {{"X-Request-Id", "abc"}});
    res->write("data: 1\n\n");
    res->write("data: [DONE]\n\n");
    res->finish();
  };
  const BatchRunStats stats = run_batch_lines(in, out, streams);
  EXPECT_EQ(stats.succeeded, 1);
  const std::vector<json> lines = lines_of(out.str());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["response"]["body"], "data: 1\n\ndata: [DONE]\n\n");
  EXPECT_EQ(lines[0]["response"]["request_id"], "abc");
}

TEST(BatchRunner, AnEmptyInputWritesNothing) {
  std::istringstream in("\n\n");
  std::ostringstream out;
  std::atomic<int> calls{0};
  const BatchRunStats stats =
      run_batch_lines(in, out, [&calls](HttpRequest&&, std::shared_ptr<Responder>) { ++calls; });
  EXPECT_EQ(stats.lines, 0);
  EXPECT_EQ(calls.load(), 0);
  EXPECT_TRUE(out.str().empty());
}

}  // namespace
}  // namespace duet::server
