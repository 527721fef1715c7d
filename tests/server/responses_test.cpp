// The Responses API's pieces without a model: the output items and typed events ResponsesBuilder
// makes of a DeepSeek-R1 output that thinks, answers and calls two functions (fed whole, and one
// byte at a time), ResponseStore's byte budget and least-recently-used order, and a background
// stream's events kept, replayed from a number and followed; ConversationStore's items, pages,
// budget and refusals.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "duet/server/conversations.h"
#include "duet/server/response_store.h"
#include "duet/server/responses.h"

namespace duet::server {
namespace {

using nlohmann::json;

const std::string kOutput =
    "I should look it up.</think>Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
    "get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function"
    "<｜tool▁sep｜>get_time\n```json\n{\"tz\": \"Asia/Tokyo\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

struct Outcome {
  json response;
  std::vector<json> events;
};

// Feeds kOutput in pieces of `piece` bytes (one token each) to a builder, streaming.
Outcome run(size_t piece, bool stream) {
  ServedModel model;
  model.name = "m";
  model.reasoning_parser = true;
  model.tool_parser = ToolCallFormat::kDeepSeekV3;
  ParsedRequest request;
  request.chat = true;
  request.starts_in_reasoning = true;
  request.tool_output = ToolOutput::kMarkup;
  request.prompts = {{1, 2, 3}};
  const ResponsesRequest r = parse_responses_request(json{{"input", "Weather?"}}, R"({"input": "Weather?"})",
                                                     [](const std::string&) { return nullptr; });
  ResponsesBuilder b(request, model, r, "resp_x", 1);
  std::string wire = stream ? b.stream_start() : std::string();
  for (size_t at = 0; at < kOutput.size(); at += piece) {
    RequestOutput o;
    o.num_prompt_tokens = 3;
    CompletionDelta d;
    d.text = kOutput.substr(at, piece);
    d.token_ids = {7};
    if (at + piece >= kOutput.size()) d.finish_reason = FinishReason::kStop;
    o.outputs.push_back(d);
    o.finished = d.finish_reason.has_value();
    if (stream) {
      wire += b.stream_events(0, o);
    } else {
      b.accumulate(0, o);
    }
  }
  Outcome out;
  if (stream) {
    wire += b.stream_end(nullptr);
    for (size_t at = 0; at < wire.size();) {
      const size_t end = wire.find("\n\n", at);
      const std::string block = wire.substr(at, end - at);
      const size_t nl = block.find('\n');
      json e = json::parse(block.substr(nl + 7));
      EXPECT_EQ(block.substr(7, nl - 7), e["type"].get<std::string>());
      out.events.push_back(std::move(e));
      at = end + 2;
    }
  }
  out.response = json::parse(b.final_body());
  return out;
}

void expect_items(const json& r) {
  EXPECT_EQ(r["status"], "completed");
  const json& output = r["output"];
  ASSERT_EQ(output.size(), 4u) << output.dump();
  EXPECT_EQ(output[0]["type"], "reasoning");
  EXPECT_EQ(output[0]["content"][0]["text"], "I should look it up.");
  EXPECT_EQ(output[1]["type"], "message");
  EXPECT_EQ(output[1]["content"][0]["text"], "Let me look.");
  EXPECT_EQ(output[2]["type"], "function_call");
  EXPECT_EQ(output[2]["name"], "get_weather");
  EXPECT_EQ(output[2]["arguments"], "{\"city\": \"Paris\"}");
  EXPECT_EQ(output[3]["name"], "get_time");
  EXPECT_EQ(output[3]["arguments"], "{\"tz\": \"Asia/Tokyo\"}");
  EXPECT_NE(output[2]["call_id"], output[3]["call_id"]);
  for (const json& item : output) EXPECT_EQ(item["status"], "completed");
  EXPECT_EQ(r["usage"]["input_tokens"], 3);
}

TEST(ResponsesBuilder, ItemsOfThinkingAnAnswerAndCalls) {
  for (size_t piece : {kOutput.size(), size_t{1}, size_t{5}}) {
    SCOPED_TRACE(piece);
    const json r = run(piece, false).response;
    expect_items(r);
    // Tokens that only think are reasoning tokens (one byte each here: the 20 of the thought).
    EXPECT_EQ(r["usage"]["output_tokens_details"]["reasoning_tokens"], piece == 1 ? 20 : piece == 5 ? 4 : 0);
    EXPECT_EQ(r["usage"]["output_tokens"], (kOutput.size() + piece - 1) / piece);
  }
}

TEST(ResponsesBuilder, StreamedEventsAddUpToTheItems) {
  for (size_t piece : {kOutput.size(), size_t{1}, size_t{7}}) {
    SCOPED_TRACE(piece);
    const Outcome s = run(piece, true);
    expect_items(s.response);
    ASSERT_GE(s.events.size(), 3u);
    EXPECT_EQ(s.events.front()["type"], "response.created");
    EXPECT_EQ(s.events.back()["type"], "response.completed");
    EXPECT_EQ(s.events.back()["response"]["output"], s.response["output"]);
    // Sequence numbers count up from 0; each item is added, written and done before the next.
    std::vector<std::string> text(4), args(4);
    int open = -1;
    for (size_t i = 0; i < s.events.size(); ++i) {
      const json& e = s.events[i];
      EXPECT_EQ(e["sequence_number"], i);
      const std::string type = e["type"];
      if (type == "response.output_item.added") {
        EXPECT_EQ(open, -1);
        open = e["output_index"];
      } else if (type == "response.output_item.done") {
        EXPECT_EQ(e["output_index"], open);
        EXPECT_EQ(e["item"], s.response["output"][open]);
        open = -1;
      } else if (type == "response.reasoning_text.delta" || type == "response.output_text.delta") {
        EXPECT_EQ(e["output_index"], open);
        text[open] += e["delta"].get<std::string>();
      } else if (type == "response.function_call_arguments.delta") {
        EXPECT_EQ(e["output_index"], open);
        args[open] += e["delta"].get<std::string>();
      }
    }
    EXPECT_EQ(text[0], "I should look it up.");
    EXPECT_EQ(text[1], "Let me look.");
    EXPECT_EQ(args[2], "{\"city\": \"Paris\"}");
    EXPECT_EQ(args[3], "{\"tz\": \"Asia/Tokyo\"}");
  }
}

std::shared_ptr<StoredResponse> entry(const std::string& id, size_t bytes) {
  auto r = std::make_shared<StoredResponse>();
  r->id = id;
  r->input_items = json::array({std::string(bytes, 'x')});
  r->finish(json::object(), json::array());
  return r;
}

TEST(ResponseStore, KeepsTheMostRecentlyUsedWithinItsBudget) {
  ResponseStore store(10000);
  store.put(entry("a", 3000));
  store.put(entry("b", 3000));
  store.put(entry("c", 3000));
  ASSERT_NE(store.get("a"), nullptr);  // a is now the most recently used
  store.put(entry("d", 3000));         // past the budget: b (least recently used) goes
  EXPECT_EQ(store.get("b"), nullptr);
  EXPECT_NE(store.get("a"), nullptr);
  EXPECT_NE(store.get("c"), nullptr);
  EXPECT_NE(store.get("d"), nullptr);
  EXPECT_EQ(store.size(), 3u);
  EXPECT_LE(store.bytes(), 10000u);
  EXPECT_TRUE(store.erase("c"));
  EXPECT_FALSE(store.erase("c"));
  EXPECT_EQ(store.size(), 2u);
  // One entry larger than the budget stays alone (its conversation can go on).
  store.put(entry("big", 20000));
  EXPECT_EQ(store.size(), 1u);
  EXPECT_NE(store.get("big"), nullptr);
}

// A conversation's items in pages either way, added and deleted; a turn's items appended once
// each; the least recently used conversation dropped past the budget.
TEST(ConversationStore, ItemsPagesAndBudget) {
  ConversationStore store(3000);
  auto message = [](const std::string& text) { return nlohmann::json{{"role", "user"}, {"content", text}}; };
  const nlohmann::json a = store.create({{"items", {message("one"), message("two"), message("three")}}});
  const std::string id = a["id"];
  EXPECT_EQ(id.substr(0, 5), "conv_");
  EXPECT_EQ(a["metadata"], nlohmann::json::object());
  const nlohmann::json page = store.list_items(id, "asc", "", 2);
  ASSERT_EQ(page["data"].size(), 2u);
  EXPECT_EQ(page["data"][0]["content"][0]["text"], "one");
  EXPECT_EQ(page["data"][0]["type"], "message");
  EXPECT_TRUE(page["has_more"]);
  const nlohmann::json rest = store.list_items(id, "asc", page["last_id"], 20);
  ASSERT_EQ(rest["data"].size(), 1u);
  EXPECT_EQ(rest["data"][0]["content"][0]["text"], "three");
  EXPECT_FALSE(rest["has_more"]);
  EXPECT_EQ(store.list_items(id, "desc", "", 1)["data"][0]["content"][0]["text"], "three");
  EXPECT_THROW(store.list_items(id, "sideways", "", 1), ApiError);
  EXPECT_THROW(store.list_items(id, "asc", "msg_none", 1), ApiError);
  // A turn's items: one already there (an item it referred to) is not added twice.
  const nlohmann::json first = page["data"][0];
  store.append(id, {first, {{"id", "msg_answer"}, {"type", "message"}, {"role", "assistant"}, {"content", "four"}}});
  EXPECT_EQ(store.items(id).size(), 4u);
  EXPECT_EQ(store.get_item(id, "msg_answer")["content"], "four");
  EXPECT_EQ(store.delete_item(id, first["id"])["id"], id);
  EXPECT_EQ(store.items(id).size(), 3u);
  EXPECT_THROW(store.get_item(id, first["id"]), ApiError);
  nlohmann::json many = nlohmann::json::array();
  for (int i = 0; i < 21; ++i) many.push_back(message("x"));
  EXPECT_THROW(store.add_items(id, {{"items", many}}), ApiError);
  EXPECT_THROW(store.create({{"items", {{{"role", "pilot"}, {"content", "x"}}}}}), ApiError);
  EXPECT_THROW(store.update(id, {{"metadata", {{"k", 1}}}}), ApiError);
  // Past the budget the least recently used goes: b, since a was used after it.
  const std::string b = store.create({{"items", {message(std::string(1500, 'b'))}}})["id"];
  store.get(id);
  const std::string c = store.create({{"items", {message(std::string(1500, 'c'))}}})["id"];
  EXPECT_THROW(store.get(b), ApiError);
  EXPECT_EQ(store.get(id)["id"], id);
  EXPECT_EQ(store.get(c)["id"], c);
  EXPECT_EQ(store.erase(c)["deleted"], true);
  EXPECT_THROW(store.get(c), ApiError);
  store.append(c, {message("gone")});  // a conversation deleted meanwhile: nothing
  EXPECT_THROW(ConversationStore(0).create(nlohmann::json::object()), ApiError);
}

TEST(ResponseStore, KeepsRunningResponsesPastTheBudget) {
  ResponseStore store(5000);
  auto running = std::make_shared<StoredResponse>();
  running->id = "bg";
  running->input_items = json::array({std::string(3000, 'x')});
  bool cancelled = false;
  running->set_running([] { return json{{"status", "in_progress"}}; }, [&] { cancelled = true; });
  store.put(running);
  store.put(entry("a", 3000));
  store.put(entry("b", 3000));  // a goes, not the older running one
  EXPECT_NE(store.get("bg"), nullptr);
  EXPECT_EQ(store.get("a"), nullptr);
  EXPECT_EQ(running->response()["status"], "in_progress");
  EXPECT_TRUE(running->cancel());
  EXPECT_TRUE(cancelled);
  running->finish(json{{"status", "cancelled"}}, json::array());
  EXPECT_FALSE(running->cancel());
  EXPECT_EQ(running->response()["status"], "cancelled");
  // Deleted while it ran: finishing does not bring it back.
  auto gone = entry("gone", 10);
  store.put(gone);
  gone->mark_deleted();
  EXPECT_TRUE(store.erase("gone"));
  store.put(gone);
  EXPECT_EQ(store.get("gone"), nullptr);
  ResponseStore off(0);
  off.put(entry("x", 10));
  EXPECT_EQ(off.get("x"), nullptr);
}

// Collects a stream as a client would read it.
class StreamCollector : public Responder {
 public:
  void send(int, const std::string&, std::string, std::vector<std::pair<std::string, std::string>>) override {}
  void start_stream(int, const std::string&, std::vector<std::pair<std::string, std::string>>) override {}
  void write(std::string chunk) override { text += chunk; }
  void finish() override { finished = true; }
  void on_disconnect(std::function<void()>) override {}
  bool disconnected() const override { return gone; }
  std::string text;
  bool finished = false;
  bool gone = false;
};

std::string numbered(int from, int to) {
  std::string out;
  for (int i = from; i < to; ++i) {
    out += "event: response.output_text.delta\ndata: " + json{{"sequence_number", i}, {"delta", "\n\n"}}.dump() + "\n\n";
  }
  return out;
}

TEST(StoredResponse, StreamsItsEventsAgainFromANumberAndFollowsTheRun) {
  StoredResponse r;
  auto early = std::make_shared<StreamCollector>();
  EXPECT_FALSE(r.follow_events(-1, early));  // keeps none yet
  r.keep_events();
  r.record_events(numbered(0, 3));  // one chunk, three events
  r.record_events(numbered(3, 4));
  // Joins while the run goes on: the kept events after 1, then the later ones as they come.
  auto follower = std::make_shared<StreamCollector>();
  auto ahead = std::make_shared<StreamCollector>();
  auto leaving = std::make_shared<StreamCollector>();
  ASSERT_TRUE(r.follow_events(1, follower));
  ASSERT_TRUE(r.follow_events(5, ahead));  // past what was sent so far
  ASSERT_TRUE(r.follow_events(-1, leaving));
  EXPECT_EQ(follower->text, numbered(2, 4));
  EXPECT_EQ(ahead->text, "");
  leaving->gone = true;
  r.record_events(numbered(4, 7));
  EXPECT_EQ(follower->text, numbered(2, 7));
  EXPECT_EQ(ahead->text, numbered(6, 7));
  EXPECT_EQ(leaving->text, numbered(0, 4));  // nothing after it went
  EXPECT_FALSE(follower->finished);
  r.end_events();
  EXPECT_TRUE(follower->finished);
  EXPECT_TRUE(ahead->finished);
  r.record_events(numbered(7, 8));  // after the end: not kept
  // After the run: everything after the number, and the end at once.
  auto late = std::make_shared<StreamCollector>();
  ASSERT_TRUE(r.follow_events(-1, late));
  EXPECT_EQ(late->text, numbered(0, 7));
  EXPECT_TRUE(late->finished);
  EXPECT_GE(r.bytes(), numbered(0, 7).size());  // counted against the store's budget
}

}  // namespace
}  // namespace duet::server
