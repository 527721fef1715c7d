// duet::Regex: std::regex_search's meaning, PCRE2's limits. The inputs that ended the process
// (long runs under a repeat, deep nesting) or ran for minutes (nested repeats) under std::regex
// are answered at once.
#include "duet/core/regex.h"

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "duet/core/error.h"

namespace duet {
namespace {

TEST(RegexTest, SearchesAnywhereInTheText) {
  const Regex r(R"(blk\.[0-9]+\.ffn_(up|down))");
  EXPECT_TRUE(r.search("blk.12.ffn_up.weight"));
  EXPECT_TRUE(r.search("x blk.3.ffn_down"));
  EXPECT_FALSE(r.search("blk.x.ffn_up"));
  EXPECT_TRUE(Regex("^$").search(""));
  EXPECT_TRUE(Regex("(^|[^A-Za-z0-9])[Rr]1([^0-9]|$)").search("DeepSeek-R1"));
  EXPECT_FALSE(Regex("(^|[^A-Za-z0-9])[Rr]1([^0-9]|$)").search("DeepSeek-R10"));
}

TEST(RegexTest, BadPatternsAreNamedErrors) {
  try {
    Regex r("ffn_(", "--override-tensor pattern");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("--override-tensor pattern 'ffn_(' is not a valid regular expression (at "
                                         "offset 5): missing closing parenthesis"),
              std::string::npos)
        << e.what();
  }
  const std::string nested = std::string(20000, '(') + "x" + std::string(20000, ')');
  try {
    Regex r(nested);
    ADD_FAILURE() << "20,000 nested groups accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("too deeply nested"), std::string::npos) << e.what();
  }
}

TEST(RegexTest, LongTextsAndNestedRepeatsEndQuickly) {
  const auto start = std::chrono::steady_clock::now();
  // A million spaces under \s*: std::regex recursed once per character (a stack overflow).
  const Regex loop(R"(\{%-?\s*for\s+\w+\s+in\s+[\w.\[\]'"]*content\b)");
  EXPECT_TRUE(loop.search("{% for " + std::string(1000000, ' ') + "part in message.content %}"));
  EXPECT_FALSE(loop.search(std::string(1000000, '{')));
  // Nested repeats: no match, found (or given up on, as an error) in well under a second.
  const Regex nested("(.*)*(.*)*(.*)*(.*)*z");
  EXPECT_FALSE(nested.search("blk.0.ffn_gate_exps.weight"));
  // Exponential backtracking (Fibonacci(60) ways to split the a's) stops at the step limit.
  const Regex exponential("^(a|aa)*(b|c)x");
  try {
    exponential.search(std::string(60, 'a') + "dx");
    ADD_FAILURE() << "an exponential search ended within the limit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("match limit"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(RegexTest, OneRegexServesSeveralThreads) {
  const Regex r("content\\b");
  std::vector<std::thread> threads;
  std::vector<int> found(4, 0);
  for (size_t t = 0; t < found.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) found[t] += r.search(i % 2 ? "message.content }}" : "contents") ? 1 : 0;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int f : found) EXPECT_EQ(f, 1000);
}

}  // namespace
}  // namespace duet
