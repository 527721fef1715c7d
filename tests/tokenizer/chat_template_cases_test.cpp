// Every case of ../shared/testdata/chat-templates/cases.jsonl: the real DeepSeek chat templates
// rendered by duet must give exactly the string Hugging Face's apply_chat_template gives, and
// fail where it fails. Also checks that duet's built-in templates render what the published
// templates render. Skipped (exit code 77) when the shared test data is missing.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/tokenizer/chat_template.h"

namespace duet {
namespace {

using nlohmann::ordered_json;

const std::filesystem::path kDir = std::filesystem::path(DUET_SHARED_TESTDATA) / "chat-templates";

struct Case {
  std::string template_file;
  std::string name;
  ordered_json messages;
  ordered_json vars;
  std::optional<std::string> expected;
};

std::string read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<Case> load_cases() {
  std::vector<Case> cases;
  std::ifstream f(kDir / "cases.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    const ordered_json j = ordered_json::parse(line);
    Case c{j.at("template").get<std::string>(), j.at("case").get<std::string>(), j.at("messages"), j.at("vars"), std::nullopt};
    if (!j.at("expected").is_null()) c.expected = j.at("expected").get<std::string>();
    cases.push_back(std::move(c));
  }
  return cases;
}

const ChatTemplate& published(const std::string& file) {
  static std::map<std::string, ChatTemplate> templates;
  auto it = templates.find(file);
  if (it == templates.end()) it = templates.emplace(file, ChatTemplate::parse(read_file(kDir / file), file)).first;
  return it->second;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = info.param.template_file.substr(0, info.param.template_file.find('.')) + "_" + info.param.name;
  for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

class ChatTemplateCaseTest : public ::testing::TestWithParam<Case> {};

TEST_P(ChatTemplateCaseTest, MatchesHuggingFace) {
  const Case& c = GetParam();
  const ChatTemplate& t = published(c.template_file);
  if (c.expected) {
    EXPECT_EQ(t.render(c.messages, c.vars), *c.expected);
  } else {
    try {
      const std::string out = t.render(c.messages, c.vars);
      FAIL() << "Hugging Face fails on this case; duet rendered: " << out;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(c.template_file), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("line 1, column"), std::string::npos) << e.what();
    }
  }
}

// The built-in template that stands for a published one renders the same where the published one
// renders (the built-ins refuse what the published templates cannot render).
TEST_P(ChatTemplateCaseTest, BuiltinTemplateMatchesPublished) {
  const Case& c = GetParam();
  std::optional<BuiltinChatFormat> format;
  if (c.template_file == "deepseek-llm-chat.jinja") format = BuiltinChatFormat::kDeepSeekLLM;
  if (c.template_file == "deepseek-r1-distill-qwen.jinja") format = BuiltinChatFormat::kDeepSeekR1;
  if (!format || !c.expected) GTEST_SKIP() << "no built-in counterpart for this case";
  EXPECT_EQ(builtin_chat_template(*format).render(c.messages, c.vars), *c.expected);
}

INSTANTIATE_TEST_SUITE_P(Cases, ChatTemplateCaseTest, ::testing::ValuesIn(load_cases()), case_name);

// A template keeps nothing from one render to the next: the largest published template renders two
// 10-message conversations that differ in one message, alternately, 500 times; each render holds
// its own conversation's text, never the other's, and equals the first render of it; a one-message
// conversation in between changes nothing. The time per render is printed (reported, not checked).
TEST(ChatTemplateCasesTest, RendersAreIndependentOfEachOther) {
  const ChatTemplate& t = published("deepseek-v3.1.jinja");
  const auto conversation = [](const std::string& last) {
    ordered_json m = ordered_json::array();
    m.push_back({{"role", "system"}, {"content", "You are a helpful assistant."}});
    for (int i = 0; i < 8; ++i) {
      m.push_back({{"role", i % 2 == 0 ? "user" : "assistant"},
                   {"content", "Message number " + std::to_string(i) + " with some ordinary text in it."}});
    }
    m.push_back({{"role", "user"}, {"content", last}});
    return m;
  };
  const ordered_json a = conversation("What is the capital of France?");
  const ordered_json b = conversation("Name three prime numbers.");
  ordered_json one = ordered_json::array();
  one.push_back({{"role", "user"}, {"content", "Just one question?"}});
  const ordered_json vars = {{"bos_token", "<｜begin▁of▁sentence｜>"}, {"add_generation_prompt", true}};
  const std::string first_a = t.render(a, vars), first_b = t.render(b, vars);
  ASSERT_NE(first_a.find("capital of France"), std::string::npos) << first_a;
  ASSERT_NE(first_b.find("three prime numbers"), std::string::npos) << first_b;
  const int kRuns = 500;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRuns; ++i) {
    const bool is_a = i % 2 == 0;
    const std::string out = t.render(is_a ? a : b, vars);
    ASSERT_EQ(out, is_a ? first_a : first_b) << "render " << i;
    if (i == kRuns / 2) {
      EXPECT_NE(t.render(one, vars).find("Just one question?"), std::string::npos);
    }
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / kRuns;
  std::printf("deepseek-v3.1.jinja, 10 messages: %.1f us per render (%zu bytes)\n", us, first_a.size());
}

}  // namespace
}  // namespace duet

int main(int argc, char** argv) {
  if (!std::filesystem::exists(duet::kDir / "cases.jsonl")) {
    std::printf("skipped: %s not found (the shared test data lives beside the checkout)\n",
                (duet::kDir / "cases.jsonl").c_str());
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
