// multipart/form-data uploads (as OpenAI's clients send files), the file store's budget and lists,
// and batches run against a handler of the test's: results split into output and error files,
// validation that fails a batch naming its lines, cancellation, and the list; a folder that keeps
// files and batches for the next server, which goes on with a batch where it stopped; uploads in
// parts (the Uploads API).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/server/batches.h"
#include "duet/server/multipart.h"
#include "duet/server/openai.h"

namespace duet::server {
namespace {

using nlohmann::json;

TEST(Multipart, PartsWithNamesFilenamesAndBytes) {
  const std::string body =
      "preamble to ignore\r\n"
      "--XyZ\r\n"
      "Content-Disposition: form-data; name=\"purpose\"\r\n"
      "\r\n"
      "batch\r\n"
      "--XyZ  \r\n"
      "content-disposition: form-data; name=\"file\"; filename=\"my \\\"data\\\".jsonl\"\r\n"
      "Content-Type: application/jsonl\r\n"
      "\r\n"
      "line 1\r\n--XyZnot a boundary\r\nline 2\n\r\n"
      "--XyZ--\r\n"
      "epilogue";
  const std::vector<FormPart> parts = parse_multipart("multipart/form-data; boundary=\"XyZ\"", body);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].name, "purpose");
  EXPECT_EQ(parts[0].filename, "");
  EXPECT_EQ(parts[0].data, "batch");
  EXPECT_EQ(parts[1].name, "file");
  EXPECT_EQ(parts[1].filename, "my \"data\".jsonl");
  EXPECT_EQ(parts[1].content_type, "application/jsonl");
  EXPECT_EQ(parts[1].data, "line 1\r\n--XyZnot a boundary\r\nline 2\n");
  // Unquoted boundary, upper-case type, an empty part.
  const std::vector<FormPart> more =
      parse_multipart("Multipart/Form-Data;charset=utf-8;BOUNDARY=b1", "--b1\r\nContent-Disposition: form-data; name=a\r\n\r\n\r\n--b1--");
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(more[0].name, "a");
  EXPECT_EQ(more[0].data, "");
}

TEST(Multipart, MalformedBodiesAreRefusedNamingWhy) {
  const std::string ok_part = "--b\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\nx\r\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"application/json", "multipart/form-data"},
      {"multipart/form-data", "boundary"},
      {"multipart/form-data; boundary=\"b", "not closed"},
  };
  for (const auto& [type, why] : cases) {
    try {
      parse_multipart(type, ok_part + "--b--");
      ADD_FAILURE() << type;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
  const std::vector<std::pair<std::string, std::string>> bodies = {
      {"no boundary at all", "no boundary line"},
      {"--b\r\nContent-Disposition: form-data; name=\"f\"\r\n", "headers do not end"},
      {ok_part, "closing boundary"},
      {ok_part + "--b", "closing boundary"},
      {"--b\r\nContent-Type: text/plain\r\n\r\nx\r\n--b--", "Content-Disposition"},
      {"--b\r\nContent-Disposition: attachment; name=\"f\"\r\n\r\nx\r\n--b--", "not form-data"},
      {"--b\r\nno colon here\r\n\r\nx\r\n--b--", "no ':'"},
      {"--bjunk\r\n", "does not end"},
  };
  for (const auto& [body, why] : bodies) {
    try {
      parse_multipart("multipart/form-data; boundary=b", body);
      ADD_FAILURE() << body;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << body << ": " << e.what();
    }
  }
  std::string many;
  for (int i = 0; i < 65; ++i) many += "--b\r\nContent-Disposition: form-data; name=\"p\"\r\n\r\nv\r\n";
  EXPECT_THROW(parse_multipart("multipart/form-data; boundary=b", many + "--b--"), Error);
}

TEST(FileStore, BudgetListsAndDeletion) {
  FileStore store(100);
  const StoredFile a = store.put({"a.jsonl", "batch"}, std::string(60, 'a'));
  EXPECT_TRUE(a.id.starts_with("file-"));
  EXPECT_EQ(a.to_json()["bytes"], 60);
  try {
    store.put({"b.jsonl", "batch"}, std::string(41, 'b'));
    ADD_FAILURE() << "over the budget";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("40 of its 100 left"), std::string::npos) << e.what();
  }
  const StoredFile b = store.put({"b.jsonl", "batch_output"}, std::string(40, 'b'));
  EXPECT_EQ(store.bytes(), 100u);
  const json desc = store.list("", "desc", "", 10);
  ASSERT_EQ(desc["data"].size(), 2u);
  EXPECT_EQ(desc["data"][0]["id"], b.id);
  EXPECT_EQ(desc["first_id"], b.id);
  EXPECT_EQ(desc["last_id"], a.id);
  EXPECT_FALSE(desc["has_more"]);
  const json one = store.list("", "asc", "", 1);
  ASSERT_EQ(one["data"].size(), 1u);
  EXPECT_EQ(one["data"][0]["id"], a.id);
  EXPECT_TRUE(one["has_more"]);
  EXPECT_EQ(store.list("", "asc", a.id, 5)["data"][0]["id"], b.id);
  EXPECT_EQ(store.list("batch_output", "desc", "", 5)["data"].size(), 1u);
  EXPECT_THROW(store.list("", "sideways", "", 5), ApiError);
  EXPECT_THROW(store.list("", "asc", "file-none", 5), ApiError);
  EXPECT_TRUE(store.erase(a.id));
  EXPECT_FALSE(store.erase(a.id));
  EXPECT_EQ(store.get(a.id), nullptr);
  EXPECT_EQ(store.bytes(), 40u);
  EXPECT_EQ(store.put({"c", "batch"}, std::string(60, 'c')).bytes, 60u);  // the room came back
}

std::string line(const std::string& id, const std::string& url, json body) {
  return json{{"custom_id", id}, {"method", "POST"}, {"url", url}, {"body", std::move(body)}}.dump() + "\n";
}

json wait_for_end(BatchManager& m, const std::string& id) {
  for (int i = 0; i < 500; ++i) {
    json b = m.get(id);
    const std::string s = b["status"];
    if (s == "completed" || s == "failed" || s == "cancelled" || s == "expired") return b;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "batch " << id << " did not end";
  return m.get(id);
}

std::vector<json> file_lines(const FileStore& store, const json& id) {
  std::vector<json> out;
  if (id.is_null()) return out;
  const auto data = store.content(id.get<std::string>());
  EXPECT_NE(data, nullptr);
  if (!data) return out;
  size_t pos = 0;
  while (pos < data->size()) {
    const size_t end = data->find('\n', pos);
    out.push_back(json::parse(data->substr(pos, end - pos)));
    pos = end + 1;
  }
  return out;
}

TEST(BatchManager, RunsSplitsValidatesCancelsAndLists) {
  FileStore store(1 << 20);
  std::atomic<int> calls{0};
  std::atomic<bool> hold{false};
  HttpHandler handler = [&](HttpRequest&& req, std::shared_ptr<Responder> res) {
    ++calls;
    const json body = json::parse(req.body);
    // Lines run after live requests under the priority policy, unless they say otherwise.
    EXPECT_EQ(body.value("priority", -1), body.value("n", 0) == 7 ? 3 : kBatchPriority) << req.body;
    if (hold) {
      // Answered only when the batch is cancelled (its client goes away).
      res->on_disconnect([res] { res->send(200, "application/json", R"({"aborted": true})", {}); });
      return;
    }
    const bool fail = body.value("fail", false);
    res->send(fail ? 400 : 200, "application/json",
              fail ? R"({"error": {"message": "bad"}})" : json{{"echo", body.value("n", 0)}}.dump(), {});
  };
  BatchManager batches(store, handler, 3);
  batches.start();

  std::string input;
  for (int i = 0; i < 10; ++i) {
    json body = {{"n", i}, {"fail", i == 4}};
    if (i == 7) body["priority"] = 3;
    input += line(fmt::format("r{}", i), "/v1/chat/completions", body);
  }
  const StoredFile in = store.put({"in.jsonl", "batch"}, input);
  const json created = batches.create({{"input_file_id", in.id}, {"endpoint", "/v1/chat/completions"},
                                       {"completion_window", "24h"}, {"metadata", {{"job", "nightly"}}},
                                       {"output_expires_after", {{"anchor", "created_at"}, {"seconds", 7200}}}});
  EXPECT_EQ(created["status"], "validating");
  EXPECT_EQ(created["metadata"]["job"], "nightly");
  EXPECT_EQ(created["expires_at"].get<int64_t>() - created["created_at"].get<int64_t>(), 86400);
  const json done = wait_for_end(batches, created["id"]);
  EXPECT_EQ(done["status"], "completed");
  EXPECT_EQ(done["request_counts"], json({{"total", 10}, {"completed", 9}, {"failed", 1}}));
  EXPECT_FALSE(done["in_progress_at"].is_null());
  EXPECT_FALSE(done["completed_at"].is_null());
  const std::vector<json> out = file_lines(store, done["output_file_id"]);
  const std::vector<json> err = file_lines(store, done["error_file_id"]);
  for (const json& id : {done["output_file_id"], done["error_file_id"]}) {
    const auto f = store.get(id.get<std::string>());
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->expires_at - f->created_at, 7200);  // output_expires_after
  }
  EXPECT_EQ(store.get(in.id)->expires_at - store.get(in.id)->created_at, kFileLifetimeSeconds);
  ASSERT_EQ(out.size(), 9u);
  ASSERT_EQ(err.size(), 1u);
  for (size_t i = 0, n = 0; i < out.size(); ++i, ++n) {
    if (n == 4) ++n;
    EXPECT_EQ(out[i]["custom_id"], fmt::format("r{}", n));
    EXPECT_EQ(out[i]["response"]["body"]["echo"], n);
  }
  EXPECT_EQ(err[0]["custom_id"], "r4");
  EXPECT_EQ(err[0]["response"]["status_code"], 400);
  EXPECT_EQ(store.get(done["output_file_id"])->purpose, "batch_output");

  // Lines for another endpoint, and bad JSON: the batch fails before anything runs.
  const int before = calls;
  const StoredFile bad = store.put({"bad.jsonl", "batch"}, line("a", "/v1/chat/completions", json::object()) +
                                                             line("b", "/v1/completions", json::object()) + "{oops\n");
  const json failed = wait_for_end(batches, batches.create({{"input_file_id", bad.id}, {"endpoint", "/v1/chat/completions"},
                                                            {"completion_window", "24h"}})["id"]);
  EXPECT_EQ(failed["status"], "failed");
  ASSERT_EQ(failed["errors"]["data"].size(), 2u);
  EXPECT_EQ(failed["errors"]["data"][0]["line"], 2);
  EXPECT_EQ(failed["errors"]["data"][0]["code"], "invalid_url");
  EXPECT_EQ(failed["errors"]["data"][1]["line"], 3);
  EXPECT_EQ(calls.load(), before);
  const StoredFile empty = store.put({"empty.jsonl", "batch"}, "\n\n");
  const json nothing = wait_for_end(batches, batches.create({{"input_file_id", empty.id}, {"endpoint", "/v1/embeddings"},
                                                             {"completion_window", "24h"}})["id"]);
  EXPECT_EQ(nothing["status"], "failed");
  EXPECT_EQ(nothing["errors"]["data"][0]["code"], "empty_file");

  // A batch whose lines wait: cancelled while in progress, its three lines in flight answered.
  hold = true;
  const int held_before = calls;
  std::string many;
  for (int i = 0; i < 20; ++i) many += line(fmt::format("h{}", i), "/v1/embeddings", {{"n", i}});
  const StoredFile held = store.put({"held.jsonl", "batch"}, many);
  const std::string held_id =
      batches.create({{"input_file_id", held.id}, {"endpoint", "/v1/embeddings"}, {"completion_window", "24h"}})["id"];
  // In progress with its three lines in flight (dispatching them may lag, under ASan).
  for (int i = 0; i < 1000 && (batches.get(held_id)["status"] != "in_progress" || calls - held_before < 3); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(calls - held_before, 3);
  EXPECT_TRUE(store.erase(held.id));  // the running batch keeps its input
  const json cancelling = batches.cancel(held_id);
  EXPECT_EQ(cancelling["status"], "cancelling");
  const json cancelled = wait_for_end(batches, held_id);
  EXPECT_EQ(cancelled["status"], "cancelled");
  EXPECT_FALSE(cancelled["cancelled_at"].is_null());
  EXPECT_EQ(cancelled["request_counts"]["completed"], 3);
  EXPECT_EQ(file_lines(store, cancelled["output_file_id"]).size(), 3u);
  try {
    batches.cancel(held_id);
    ADD_FAILURE() << "a cancelled batch cancelled again";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
  }

  // The list: newest first, paged.
  const json page = batches.list("", 2);
  ASSERT_EQ(page["data"].size(), 2u);
  EXPECT_EQ(page["data"][0]["id"], held_id);
  EXPECT_TRUE(page["has_more"]);
  const json rest = batches.list(page["last_id"], 100);
  EXPECT_EQ(rest["data"].size(), 2u);
  EXPECT_FALSE(rest["has_more"]);
  EXPECT_EQ(rest["data"][1]["id"], created["id"]);

  // Bodies that cannot make a batch.
  const std::vector<std::pair<json, int>> refused = {
      {{{"endpoint", "/v1/completions"}, {"completion_window", "24h"}}, 400},
      {{{"input_file_id", "file-none"}, {"endpoint", "/v1/completions"}, {"completion_window", "24h"}}, 404},
      {{{"input_file_id", in.id}, {"endpoint", "/v1/models"}, {"completion_window", "24h"}}, 400},
      {{{"input_file_id", in.id}, {"endpoint", "/v1/completions"}, {"completion_window", "1h"}}, 400},
      {{{"input_file_id", in.id}, {"endpoint", "/v1/completions"}, {"completion_window", "24h"}, {"metadata", {{"k", 1}}}}, 400},
      {{{"input_file_id", done["output_file_id"]}, {"endpoint", "/v1/completions"}, {"completion_window", "24h"}}, 400},
  };
  for (const auto& [body, status] : refused) {
    try {
      batches.create(body);
      ADD_FAILURE() << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), status) << body << ": " << e.what();
    }
  }
  EXPECT_THROW(batches.get("batch_none"), ApiError);
}

TEST(BatchManager, ABatchPastItsWindowExpiresKeepingItsResults) {
  FileStore store(1 << 20);
  HttpHandler handler = [](HttpRequest&&, std::shared_ptr<Responder> res) {
    res->on_disconnect([res] { res->send(200, "application/json", R"({"partial": true})", {}); });
  };
  BatchManager batches(store, handler, 2, std::chrono::milliseconds(300));
  batches.start();
  std::string many;
  for (int i = 0; i < 6; ++i) many += line(fmt::format("x{}", i), "/v1/completions", json::object());
  const StoredFile f = store.put({"f.jsonl", "batch"}, many);
  const json body = {{"input_file_id", f.id}, {"endpoint", "/v1/completions"}, {"completion_window", "24h"}};
  const std::string running = batches.create(body)["id"], waiting = batches.create(body)["id"];
  const json first = wait_for_end(batches, running);
  EXPECT_EQ(first["status"], "expired");
  EXPECT_FALSE(first["expired_at"].is_null());
  EXPECT_FALSE(first["in_progress_at"].is_null());
  EXPECT_EQ(first["request_counts"]["completed"], 2);  // the two in flight, stopped
  EXPECT_EQ(file_lines(store, first["output_file_id"]).size(), 2u);
  const json second = wait_for_end(batches, waiting);
  EXPECT_EQ(second["status"], "expired");  // its window passed while it waited
  EXPECT_TRUE(second["in_progress_at"].is_null());
  EXPECT_EQ(batches.counts()[5], std::make_pair(std::string("expired"), int64_t{2}));
}

TEST(BatchManager, StoppingCancelsWhatWaitsAndWhatRuns) {
  FileStore store(1 << 20);
  HttpHandler handler = [](HttpRequest&&, std::shared_ptr<Responder> res) {
    res->on_disconnect([res] { res->send(503, "application/json", R"({"error": {"message": "stopping"}})", {}); });
  };
  auto batches = std::make_unique<BatchManager>(store, handler, 2);
  batches->start();
  std::string many;
  for (int i = 0; i < 5; ++i) many += line(fmt::format("s{}", i), "/v1/completions", json::object());
  const StoredFile f = store.put({"f.jsonl", "batch"}, many);
  const json body = {{"input_file_id", f.id}, {"endpoint", "/v1/completions"}, {"completion_window", "24h"}};
  const std::string first = batches->create(body)["id"], second = batches->create(body)["id"];
  for (int i = 0; i < 500 && batches->get(first)["status"] != "in_progress"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  batches->stop();
  EXPECT_EQ(batches->get(second)["status"], "cancelled");
  EXPECT_EQ(wait_for_end(*batches, first)["status"], "cancelled");
  EXPECT_THROW(batches->create(body), ApiError);
  batches.reset();  // joins without waiting on anything
}

// A folder of the test's own, removed at its end.
struct TempFolder {
  std::string path;
  TempFolder() {
    std::string pattern = testing::TempDir() + "duet-files-XXXXXX";
    path = mkdtemp(pattern.data());
  }
  ~TempFolder() { std::filesystem::remove_all(path); }
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(FileStore, AFolderKeepsFilesForTheNextStoreAndOneServerUsesIt) {
  TempFolder dir;
  std::string a_id, b_id;
  {
    FileStore store(100, dir.path);
    EXPECT_EQ(store.dir(), dir.path);
    a_id = store.put({"a.jsonl", "batch"}, std::string(60, 'a')).id;
    {
      std::ofstream(dir.path + "/made-elsewhere") << std::string(30, 'b');
    }
    const StoredFile b = store.adopt({"b.jsonl", "batch_output"}, dir.path + "/made-elsewhere");
    b_id = b.id;
    EXPECT_EQ(b.bytes, 30u);
    EXPECT_FALSE(std::filesystem::exists(dir.path + "/made-elsewhere"));  // moved in
    EXPECT_EQ(*store.content(b_id), std::string(30, 'b'));
    EXPECT_EQ(store.get(a_id)->data, nullptr);  // not held in memory
    EXPECT_THROW(store.put({"c", "batch"}, std::string(11, 'c')), ApiError);  // 90 of 100 used
    try {
      FileStore second(100, dir.path);
      ADD_FAILURE() << "two stores on one folder";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("another server uses this folder"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(store.link_content(a_id, dir.path + "/batches/second-name"));
    EXPECT_FALSE(store.link_content("file-none", dir.path + "/batches/none"));
  }
  // What a stop halfway through a write leaves, and a description that is not one.
  std::ofstream(dir.path + "/files/file-orphan") << "contents without a description";
  std::ofstream(dir.path + "/files/file-x.json.tmp") << "{";
  std::ofstream(dir.path + "/files/file-bad.json") << "not json";
  std::ofstream(dir.path + "/files/file-bad") << "x";
  FileStore store(100, dir.path);
  const json list = store.list("", "asc", "", 10);
  ASSERT_EQ(list["data"].size(), 2u);
  EXPECT_EQ(list["data"][0]["id"], a_id);
  EXPECT_EQ(list["data"][0]["filename"], "a.jsonl");
  EXPECT_EQ(list["data"][1]["id"], b_id);
  EXPECT_EQ(list["data"][1]["purpose"], "batch_output");
  EXPECT_EQ(list["data"][1]["bytes"], 30);
  EXPECT_EQ(store.bytes(), 90u);
  EXPECT_EQ(*store.content(a_id), std::string(60, 'a'));
  EXPECT_FALSE(std::filesystem::exists(dir.path + "/files/file-orphan"));
  EXPECT_FALSE(std::filesystem::exists(dir.path + "/files/file-x.json.tmp"));
  EXPECT_TRUE(store.erase(a_id));
  EXPECT_FALSE(std::filesystem::exists(dir.path + "/files/" + a_id));
  EXPECT_EQ(store.content(a_id), nullptr);
  EXPECT_EQ(slurp(dir.path + "/batches/second-name"), std::string(60, 'a'));  // the second name stays
  EXPECT_EQ(store.bytes(), 30u);
}

// A download's body read in pieces (open_content) gives the file back whole, and one opened
// before the file is deleted still reads to its end.
void read_in_pieces(const std::string& dir) {
  FileStore store(1 << 20, dir);
  std::string data(300001, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 % 251);
  const std::string id = store.put({"p.jsonl", "batch"}, data).id;
  std::optional<BodySource> body = store.open_content(id);
  ASSERT_TRUE(body.has_value());
  EXPECT_EQ(body->size, data.size());
  EXPECT_TRUE(store.erase(id));
  EXPECT_FALSE(store.open_content(id).has_value());
  std::string back;
  for (size_t piece : {1u, 4095u, 65536u}) back += body->read(back.size(), piece);
  while (back.size() < body->size) back += body->read(back.size(), 100000);
  EXPECT_EQ(back, data);
  EXPECT_EQ(body->read(data.size(), 10), "");  // past the end: nothing
  EXPECT_EQ(body->read(data.size() - 3, 10), data.substr(data.size() - 3));
  // What a reply that never reaches a socket does with it: the whole body, sent once.
  struct Collect : Responder {
    std::string got;
    int sends = 0;
    void send(int, const std::string&, std::string b, std::vector<std::pair<std::string, std::string>>) override {
      got = std::move(b);
      ++sends;
    }
    void start_stream(int, const std::string&, std::vector<std::pair<std::string, std::string>>) override {}
    void write(std::string) override {}
    void finish() override {}
    void on_disconnect(std::function<void()>) override {}
    bool disconnected() const override { return false; }
  } collect;
  collect.send_body(200, "application/octet-stream", *body);
  EXPECT_EQ(collect.sends, 1);
  EXPECT_EQ(collect.got, data);
}

TEST(FileStore, ADownloadReadsInPiecesFromMemory) { read_in_pieces(""); }

TEST(FileStore, ADownloadReadsInPiecesFromAFolder) {
  TempFolder dir;
  read_in_pieces(dir.path);
}

TEST(BatchManager, AFolderKeepsBatchesAndTheNextServerGoesOnWhereOneStopped) {
  TempFolder dir;
  std::string running, waiting, finished, output_id;
  std::mutex mutex;
  std::multiset<std::string> first_calls, second_calls;
  {
    FileStore store(1 << 20, dir.path);
    // The first server answers three lines of the running batch and then stops with two in flight.
    std::atomic<int> answered{0};
    HttpHandler handler = [&](HttpRequest&& req, std::shared_ptr<Responder> res) {
      const json body = json::parse(req.body);
      {
        std::lock_guard<std::mutex> lock(mutex);
        first_calls.insert(body["id"].get<std::string>());
      }
      const std::string id = body["id"];
      if (id.starts_with("w") || (id.starts_with("r") && ++answered > 3)) {
        res->on_disconnect([res] { res->send(503, "application/json", R"({"error": {"message": "stopping"}})", {}); });
        return;
      }
      res->send(200, "application/json", json{{"echo", body["id"]}}.dump(), {});
    };
    auto batches = std::make_unique<BatchManager>(store, handler, 2);
    batches->start();
    const StoredFile one = store.put({"one.jsonl", "batch"}, line("only", "/v1/completions", {{"id", "only"}}));
    finished = batches->create({{"input_file_id", one.id}, {"endpoint", "/v1/completions"}, {"completion_window", "24h"}})["id"];
    const json done = wait_for_end(*batches, finished);
    ASSERT_EQ(done["status"], "completed");
    output_id = done["output_file_id"];
    std::string input;
    for (int i = 0; i < 8; ++i) input += line(fmt::format("r{}", i), "/v1/completions", {{"id", fmt::format("r{}", i)}});
    const StoredFile f = store.put({"f.jsonl", "batch"}, input);
    running = batches->create({{"input_file_id", f.id}, {"endpoint", "/v1/completions"}, {"completion_window", "24h"},
                               {"metadata", {{"job", "night"}}}})["id"];
    const StoredFile g = store.put({"g.jsonl", "batch"}, line("w0", "/v1/completions", {{"id", "w0"}}));
    waiting = batches->create({{"input_file_id", g.id}, {"endpoint", "/v1/completions"}, {"completion_window", "24h"}})["id"];
    EXPECT_TRUE(store.erase(g.id));  // the batch keeps its input
    for (int i = 0; i < 500; ++i) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (first_calls.size() == 6) break;  // the finished one, three answered, two held
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the answers written
    batches.reset();  // the server stops: the held lines are aborted, not written
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_EQ(first_calls.size(), 6u);
    EXPECT_EQ(first_calls.count("w0"), 0u);
  }
  // A line the stop cut short.
  std::ofstream(dir.path + "/batches/" + running + ".output.jsonl", std::ios::app) << R"({"id": "batch_req_x", "custom_id": "r7)";
  FileStore store(1 << 20, dir.path);
  HttpHandler handler = [&](HttpRequest&& req, std::shared_ptr<Responder> res) {
    const json body = json::parse(req.body);
    {
      std::lock_guard<std::mutex> lock(mutex);
      second_calls.insert(body["id"].get<std::string>());
    }
    res->send(200, "application/json", json{{"echo", body["id"]}}.dump(), {});
  };
  BatchManager batches(store, handler, 2);
  // Before start(): as the first server left them.
  const json kept = batches.get(running);
  EXPECT_EQ(kept["status"], "in_progress");
  EXPECT_EQ(kept["metadata"]["job"], "night");
  EXPECT_EQ(kept["request_counts"]["total"], 8);
  EXPECT_EQ(kept["request_counts"]["completed"], 3);
  EXPECT_EQ(batches.get(waiting)["status"], "validating");
  EXPECT_EQ(batches.get(finished)["status"], "completed");
  EXPECT_EQ(batches.get(finished)["output_file_id"], output_id);
  EXPECT_EQ(file_lines(store, json(output_id)).size(), 1u);
  EXPECT_EQ(batches.list("", 10)["data"][0]["id"], waiting);  // newest first, as before
  batches.start();
  const json done = wait_for_end(batches, running);
  EXPECT_EQ(done["status"], "completed");
  EXPECT_EQ(done["request_counts"], json({{"total", 8}, {"completed", 8}, {"failed", 0}}));
  EXPECT_EQ(done["in_progress_at"], kept["in_progress_at"]);
  std::set<std::string> ids;
  for (const json& l : file_lines(store, done["output_file_id"])) ids.insert(l["custom_id"].get<std::string>());
  EXPECT_EQ(ids.size(), 8u);  // each line once
  EXPECT_TRUE(done["error_file_id"].is_null());  // the aborted answers were not written
  EXPECT_EQ(wait_for_end(batches, waiting)["status"], "completed");
  std::lock_guard<std::mutex> lock(mutex);
  // Only what the first server had not answered ran again.
  EXPECT_EQ(second_calls, (std::multiset<std::string>{"r3", "r4", "r5", "r6", "r7", "w0"}));
  for (const char* suffix : {".input", ".output.jsonl", ".errors.jsonl"}) {
    EXPECT_FALSE(std::filesystem::exists(dir.path + "/batches/" + running + suffix)) << suffix;
  }
}

TEST(BatchManager, AFolderKeepsACancelAndAnExpiry) {
  TempFolder dir;
  std::string cancelling, late;
  HttpHandler hold = [&](HttpRequest&&, std::shared_ptr<Responder> res) {
    res->on_disconnect([res] { res->send(200, "application/json", R"({"partial": true})", {}); });
  };
  {
    FileStore store(1 << 20, dir.path);
    auto batches = std::make_unique<BatchManager>(store, hold, 2, std::chrono::milliseconds(1500));
    std::string input;
    for (int i = 0; i < 4; ++i) input += line(fmt::format("c{}", i), "/v1/completions", json::object());
    const StoredFile f = store.put({"f.jsonl", "batch"}, input);
    const json body = {{"input_file_id", f.id}, {"endpoint", "/v1/completions"}, {"completion_window", "24h"}};
    cancelling = batches->create(body)["id"];
    late = batches->create(body)["id"];
    // Not started: the first is cancelled before it runs; the second waits past its window.
    EXPECT_EQ(batches->cancel(cancelling)["status"], "cancelled");
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  FileStore store(1 << 20, dir.path);
  BatchManager batches(store, hold, 2);
  EXPECT_EQ(batches.get(cancelling)["status"], "cancelled");
  batches.start();
  const json expired = wait_for_end(batches, late);
  EXPECT_EQ(expired["status"], "expired");
  EXPECT_TRUE(expired["in_progress_at"].is_null());
}

// An upload in parts, as OpenAI's Uploads API, in memory and in a folder: the parts in the order
// named make the file, the declared size is held from the start, and what is wrong is refused.
void upload_in_parts(const std::string& dir) {
  FileStore store(100, dir);
  UploadStore uploads(store);
  auto create = [&](int64_t bytes) {
    return uploads.create({{"filename", "in.jsonl"}, {"purpose", "batch"}, {"bytes", bytes}, {"mime_type", "text/jsonl"}});
  };
  const json u = uploads.create({{"filename", "in.jsonl"}, {"purpose", "batch"}, {"bytes", 11}, {"mime_type", "text/jsonl"},
                                 {"expires_after", {{"anchor", "created_at"}, {"seconds", 3600}}}});
  EXPECT_EQ(u["object"], "upload");
  EXPECT_EQ(u["status"], "pending");
  EXPECT_TRUE(u["file"].is_null());
  EXPECT_EQ(u["expires_at"].get<int64_t>() - u["created_at"].get<int64_t>(), 3600);
  const std::string id = u["id"];
  try {
    create(90);  // 11 of 100 held
    ADD_FAILURE() << "past the room left";
  } catch (const ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("89 of its 100 left"), std::string::npos) << e.what();
  }
  const json world = uploads.add_part(id, "world\n");
  EXPECT_EQ(world["object"], "upload.part");
  EXPECT_EQ(world["upload_id"], id);
  const json hello = uploads.add_part(id, "hello");
  EXPECT_THROW(uploads.add_part(id, "!"), ApiError);  // past the 11 bytes declared
  EXPECT_THROW(uploads.add_part("upload_none", "x"), ApiError);
  EXPECT_THROW(uploads.complete(id, {{"part_ids", {world["id"]}}}), ApiError);  // 6 of 11 bytes
  EXPECT_THROW(uploads.complete(id, {{"part_ids", {world["id"], world["id"]}}}), ApiError);
  EXPECT_THROW(uploads.complete(id, {{"part_ids", {"part_none"}}}), ApiError);
  try {
    uploads.complete(id, {{"part_ids", {hello["id"], world["id"]}}, {"md5", "00000000000000000000000000000000"}});
    ADD_FAILURE() << "a wrong md5";
  } catch (const ApiError& e) {
    // md5("hello" "world\n")
    EXPECT_NE(std::string(e.what()).find("d73b04b0e696b0945283defa3eee4538"), std::string::npos) << e.what();
  }
  const json done = uploads.complete(id, {{"part_ids", {hello["id"], world["id"]}}, {"md5", "D73B04B0E696B0945283DEFA3EEE4538"}});
  EXPECT_EQ(done["status"], "completed");
  EXPECT_EQ(done["file"]["bytes"], 11);
  EXPECT_EQ(done["file"]["filename"], "in.jsonl");
  EXPECT_EQ(done["file"]["purpose"], "batch");
  EXPECT_EQ(done["file"]["expires_at"].get<int64_t>() - done["file"]["created_at"].get<int64_t>(), 3600);
  EXPECT_EQ(*store.content(done["file"]["id"]), "helloworld\n");
  EXPECT_EQ(store.bytes(), 11u);
  EXPECT_THROW(uploads.complete(id, {{"part_ids", {hello["id"], world["id"]}}}), ApiError);  // once
  EXPECT_THROW(uploads.cancel(id), ApiError);
  // The room held by a cancelled upload comes back.
  const std::string big = create(89)["id"];
  EXPECT_THROW(create(1), ApiError);
  uploads.add_part(big, std::string(50, 'x'));
  EXPECT_EQ(uploads.cancel(big)["status"], "cancelled");
  EXPECT_THROW(uploads.add_part(big, "x"), ApiError);
  EXPECT_EQ(create(89)["status"], "pending");
  EXPECT_THROW(uploads.create({{"filename", "x"}, {"purpose", "fine-tune"}, {"bytes", 1}, {"mime_type", "text/plain"}}), ApiError);
  EXPECT_THROW(uploads.create({{"filename", "x"}, {"purpose", "batch"}, {"bytes", -1}, {"mime_type", "text/plain"}}), ApiError);
  EXPECT_THROW(uploads.create({{"filename", "x"}, {"purpose", "batch"}, {"bytes", 1}}), ApiError);
  if (!dir.empty()) {
    EXPECT_TRUE(std::filesystem::exists(dir + "/uploads"));
  }
}

TEST(UploadStore, PartsMakeOneFileInMemory) { upload_in_parts(""); }

TEST(UploadStore, PartsMakeOneFileInAFolder) {
  TempFolder dir;
  upload_in_parts(dir.path);
  // A new store on the folder keeps the upload left pending (89 bytes), and its room.
  FileStore store(100, dir.path);
  EXPECT_EQ(store.bytes(), 11u);
  UploadStore uploads(store);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path + "/uploads"), {}), 1);
  EXPECT_THROW(uploads.create({{"filename", "x"}, {"purpose", "batch"}, {"bytes", 1}, {"mime_type", "text/plain"}}), ApiError);
}

// With a folder a pending upload outlives its server: the next one goes on with its parts (those a
// stop cut short and folders that are not uploads left out), holds its room, and forgets it once
// it has expired.
TEST(UploadStore, APendingUploadInAFolderOutlivesTheServer) {
  TempFolder dir;
  auto declare = [](UploadStore& u, int64_t bytes) {
    return u.create({{"filename", "in.jsonl"}, {"purpose", "batch"}, {"bytes", bytes}, {"mime_type", "text/jsonl"}})["id"]
        .get<std::string>();
  };
  std::string a, b, hello;
  {
    FileStore store(100, dir.path);
    UploadStore uploads(store);
    a = declare(uploads, 11);
    b = declare(uploads, 20);
    hello = uploads.add_part(a, "hello")["id"];
  }
  const std::string folder = dir.path + "/uploads/" + a;
  std::ofstream(folder + "/part_cut.tmp") << "wor";
  std::ofstream(folder + "/file") << "hel";
  std::filesystem::create_directories(dir.path + "/uploads/upload_bad");
  {
    FileStore store(100, dir.path);
    UploadStore uploads(store);
    EXPECT_FALSE(std::filesystem::exists(folder + "/part_cut.tmp"));
    EXPECT_FALSE(std::filesystem::exists(folder + "/file"));
    EXPECT_FALSE(std::filesystem::exists(dir.path + "/uploads/upload_bad"));
    try {
      declare(uploads, 70);
      ADD_FAILURE() << "the kept uploads' room";
    } catch (const ApiError& e) {
      EXPECT_NE(std::string(e.what()).find("69 of its 100 left"), std::string::npos) << e.what();
    }
    EXPECT_THROW(uploads.add_part(a, "world!!"), ApiError);  // 5 + 7 > 11: the kept part counts
    const json world = uploads.add_part(a, "world\n");
    const json done = uploads.complete(a, {{"part_ids", {hello, world["id"]}}});
    EXPECT_EQ(done["status"], "completed");
    EXPECT_EQ(*store.content(done["file"]["id"]), "helloworld\n");
    EXPECT_FALSE(std::filesystem::exists(folder));
    EXPECT_EQ(uploads.cancel(b)["status"], "cancelled");
    EXPECT_EQ(declare(uploads, 84).substr(0, 7), "upload_");  // the room back: 100 - 11
  }
  // One that expires while no server runs is gone for the next.
  std::string c;
  {
    FileStore store(100, dir.path);
    UploadStore uploads(store, std::chrono::milliseconds(100));
    c = declare(uploads, 5);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  FileStore store(100, dir.path);
  UploadStore uploads(store);
  EXPECT_FALSE(std::filesystem::exists(dir.path + "/uploads/" + c));
  EXPECT_THROW(uploads.add_part(c, "x"), ApiError);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path + "/uploads"), {}), 1);  // the 84 bytes' upload
}

TEST(UploadStore, APendingUploadExpiresAndGivesBackItsRoom) {
  FileStore store(100);
  UploadStore uploads(store, std::chrono::milliseconds(200));
  const std::string id =
      uploads.create({{"filename", "x"}, {"purpose", "batch"}, {"bytes", 100}, {"mime_type", "text/plain"}})["id"];
  EXPECT_THROW(store.put({"y", "batch"}, "y"), ApiError);  // all of it held
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  try {
    uploads.add_part(id, "x");
    ADD_FAILURE() << "an expired upload took a part";
  } catch (const ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("is expired"), std::string::npos) << e.what();
  }
  EXPECT_EQ(store.put({"y", "batch"}, "y").bytes, 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_EQ(uploads.create({{"filename", "x"}, {"purpose", "batch"}, {"bytes", 1}, {"mime_type", "a/b"}})["status"], "pending");
  EXPECT_THROW(uploads.cancel(id), ApiError);  // forgotten: 404
}

// Files expire (OpenAI's expires_after; 30 days by default for a batch's files) and give their room
// back, in memory and in a folder (where the next store does not find them either).
void files_expire(const std::string& dir) {
  std::atomic<int64_t> now{1000000};
  auto clock = [&] { return now.load(); };
  std::string kept_id;
  {
    FileStore store(100, dir, clock);
    const StoredFile a = store.put({"a", "batch"}, std::string(60, 'a'));
    EXPECT_EQ(a.expires_at, 1000000 + kFileLifetimeSeconds);
    EXPECT_EQ(a.to_json()["expires_at"], 1000000 + kFileLifetimeSeconds);
    const StoredFile b = store.put({"b", "batch", 3600}, std::string(40, 'b'));
    const StoredFile c = store.put({"c", "batch", 0}, "");  // kept until deleted
    EXPECT_TRUE(c.to_json()["expires_at"].is_null());
    EXPECT_THROW(store.put({"d", "batch"}, "d"), ApiError);  // full
    now += 3600;
    EXPECT_EQ(store.get(b.id), nullptr);
    EXPECT_EQ(store.bytes(), 60u);
    EXPECT_EQ(store.put({"d", "batch"}, std::string(40, 'd')).bytes, 40u);  // b's room came back
    EXPECT_EQ(store.list("", "asc", "", 10)["data"].size(), 3u);
    if (!dir.empty()) {
      EXPECT_FALSE(std::filesystem::exists(dir + "/files/" + b.id));
    }
    kept_id = a.id;
  }
  if (dir.empty()) return;
  now += kFileLifetimeSeconds;  // a's 30 days are over when the next store opens the folder
  FileStore store(100, dir, clock);
  EXPECT_EQ(store.get(kept_id), nullptr);
  EXPECT_FALSE(std::filesystem::exists(dir + "/files/" + kept_id));
  EXPECT_EQ(store.list("", "asc", "", 10)["data"].size(), 1u);  // c, kept until deleted
}

TEST(FileStore, FilesExpireInMemory) { files_expire(""); }

TEST(FileStore, FilesExpireInAFolder) {
  TempFolder dir;
  files_expire(dir.path);
}

TEST(FileStore, ExpiresAfterIsOpenAIsObject) {
  EXPECT_EQ(expires_after_seconds(nullptr, "expires_after"), kFileLifetimeSeconds);
  EXPECT_EQ(expires_after_seconds({{"anchor", "created_at"}, {"seconds", 3600}}, "expires_after"), 3600);
  EXPECT_EQ(expires_after_seconds({{"anchor", "created_at"}, {"seconds", 2592000}}, "expires_after"), 2592000);
  for (const json& bad : {json{{"anchor", "created_at"}, {"seconds", 3599}}, json{{"anchor", "created_at"}, {"seconds", 2592001}},
                          json{{"anchor", "last_used"}, {"seconds", 3600}}, json{{"seconds", 3600}}, json(3600),
                          json{{"anchor", "created_at"}, {"seconds", "3600"}}}) {
    try {
      expires_after_seconds(bad, "output_expires_after");
      ADD_FAILURE() << bad;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_NE(std::string(e.what()).find("output_expires_after"), std::string::npos) << e.what();
    }
  }
}

// --max-running-batches 2: a second batch runs beside a first one whose lines are held, and a
// third waits for one of them to end.
TEST(BatchManager, SeveralBatchesRunAtOnce) {
  FileStore store(1 << 20);
  std::mutex mutex;
  std::vector<std::shared_ptr<Responder>> held;
  std::set<std::string> seen;
  HttpHandler handler = [&](HttpRequest&& req, std::shared_ptr<Responder> res) {
    const std::string id = json::parse(req.body)["id"];
    std::lock_guard<std::mutex> lock(mutex);
    seen.insert(id);
    if (id.starts_with("a")) {
      held.push_back(res);  // answered when the test lets them go
      return;
    }
    res->send(200, "application/json", json{{"echo", id}}.dump(), {});
  };
  BatchManager batches(store, handler, 2, std::chrono::hours(24), 2);
  batches.start();
  auto make = [&](const std::string& prefix, int lines) {
    std::string input;
    for (int i = 0; i < lines; ++i) input += line(prefix + std::to_string(i), "/v1/completions", {{"id", prefix + std::to_string(i)}});
    const StoredFile f = store.put({prefix + ".jsonl", "batch"}, input);
    return batches.create({{"input_file_id", f.id}, {"endpoint", "/v1/completions"}, {"completion_window", "24h"}})["id"]
        .get<std::string>();
  };
  const std::string a = make("a", 2), b = make("b", 3);
  const json done_b = wait_for_end(batches, b);  // while a's lines are held
  EXPECT_EQ(done_b["status"], "completed");
  EXPECT_EQ(done_b["request_counts"]["completed"], 3);
  EXPECT_EQ(batches.get(a)["status"], "in_progress");
  const std::string c = make("a_late", 1);  // a and c run: c's line is held too
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (held.size() == 3) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::string d = make("d", 1);  // two run: d waits
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(batches.get(d)["status"], "validating");
  {
    std::lock_guard<std::mutex> lock(mutex);
    ASSERT_EQ(held.size(), 3u);
    for (auto& r : held) r->send(200, "application/json", R"({"late": true})", {});
    held.clear();
  }
  EXPECT_EQ(wait_for_end(batches, a)["status"], "completed");
  EXPECT_EQ(wait_for_end(batches, c)["status"], "completed");
  EXPECT_EQ(wait_for_end(batches, d)["status"], "completed");
  std::lock_guard<std::mutex> lock(mutex);
  EXPECT_EQ(seen.size(), 7u);
}

}  // namespace
}  // namespace duet::server
