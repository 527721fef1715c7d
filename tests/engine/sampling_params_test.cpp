#include "duet/engine/sampling_params.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "duet/core/error.h"
#include "duet/engine/sampling_json.h"

namespace duet {
namespace {

constexpr int32_t kVocab = 1000;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

struct BadCase {
  std::string param;  // the field validation must name
  std::function<void(SamplingParams&)> set;
};

TEST(SamplingParams, DefaultsAreValid) {
  SamplingParams p;
  EXPECT_FALSE(p.find_invalid(kVocab).has_value());
  EXPECT_NO_THROW(p.validate(kVocab));
  EXPECT_NO_THROW(p.validate());
}

TEST(SamplingParams, BoundaryValuesAreValid) {
  const std::vector<std::function<void(SamplingParams&)>> good = {
      [](SamplingParams& p) { p.temperature = 0.0f; },
      [](SamplingParams& p) { p.temperature = 5.0f; },
      [](SamplingParams& p) { p.top_p = 1.0f; },
      [](SamplingParams& p) { p.top_p = 1e-6f; },
      [](SamplingParams& p) { p.top_k = -1; },
      [](SamplingParams& p) { p.top_k = 0; },
      [](SamplingParams& p) { p.top_k = 100000; },  // larger than the vocabulary: no limit
      [](SamplingParams& p) { p.min_p = 0.0f; },
      [](SamplingParams& p) { p.min_p = 1.0f; },
      [](SamplingParams& p) { p.repetition_penalty = 0.01f; },
      [](SamplingParams& p) { p.presence_penalty = -2.0f; },
      [](SamplingParams& p) { p.presence_penalty = 2.0f; },
      [](SamplingParams& p) { p.frequency_penalty = -2.0f; },
      [](SamplingParams& p) { p.frequency_penalty = 2.0f; },
      [](SamplingParams& p) { p.logit_bias = {{0, -100.0f}, {kVocab - 1, 100.0f}}; },
      [](SamplingParams& p) { p.stop_token_ids = {0, kVocab - 1}; },
      [](SamplingParams& p) { p.stop = {"a", "\n\n"}; },
      [](SamplingParams& p) { p.min_tokens = p.max_tokens; },
      [](SamplingParams& p) { p.max_tokens = 1; },
      [](SamplingParams& p) { p.logprobs = 0; },
      [](SamplingParams& p) { p.logprobs = 20; },
      [](SamplingParams& p) { p.n = 4; },
      // Beam search ranks by raw logprobs; sampling options are accepted and ignored.
      [](SamplingParams& p) { p.use_beam_search = true; p.n = 4; p.temperature = 0.7f; p.top_p = 0.9f; },
      [](SamplingParams& p) { p.use_beam_search = true; p.length_penalty = -1.5f; },
      [](SamplingParams& p) { p.seed = 0; },
  };
  for (size_t i = 0; i < good.size(); ++i) {
    SamplingParams p;
    good[i](p);
    const auto bad = p.find_invalid(kVocab);
    EXPECT_FALSE(bad.has_value()) << "case " << i << ": " << (bad ? bad->message : "");
  }
}

TEST(SamplingParams, RejectsEachBadParameterByName) {
  const std::vector<BadCase> cases = {
      {"n", [](SamplingParams& p) { p.n = 0; }},
      {"n", [](SamplingParams& p) { p.n = -3; }},
      {"temperature", [](SamplingParams& p) { p.temperature = -0.1f; }},
      {"temperature", [](SamplingParams& p) { p.temperature = kNaN; }},
      {"temperature", [](SamplingParams& p) { p.temperature = kInf; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 0.0f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 1.5f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = kNaN; }},
      {"top_k", [](SamplingParams& p) { p.top_k = -2; }},
      {"min_p", [](SamplingParams& p) { p.min_p = -0.1f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = 1.1f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = kNaN; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = 0.0f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = -1.0f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = kInf; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = 2.5f; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = kNaN; }},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = -2.01f; }},
      {"logit_bias", [](SamplingParams& p) { p.logit_bias = {{kVocab, 1.0f}}; }},
      {"logit_bias", [](SamplingParams& p) { p.logit_bias = {{-1, 1.0f}}; }},
      {"logit_bias", [](SamplingParams& p) { p.logit_bias = {{5, 100.5f}}; }},
      {"logit_bias", [](SamplingParams& p) { p.logit_bias = {{5, -kInf}}; }},
      {"logit_bias", [](SamplingParams& p) { p.logit_bias = {{5, kNaN}}; }},
      {"stop", [](SamplingParams& p) { p.stop = {"ok", ""}; }},
      {"stop_token_ids", [](SamplingParams& p) { p.stop_token_ids = {3, kVocab}; }},
      {"stop_token_ids", [](SamplingParams& p) { p.stop_token_ids = {-7}; }},
      {"max_tokens", [](SamplingParams& p) { p.max_tokens = 0; }},
      {"min_tokens", [](SamplingParams& p) { p.min_tokens = -1; }},
      {"min_tokens", [](SamplingParams& p) { p.max_tokens = 10; p.min_tokens = 11; }},
      {"logprobs", [](SamplingParams& p) { p.logprobs = -1; }},
      {"logprobs", [](SamplingParams& p) { p.logprobs = 21; }},
      {"length_penalty", [](SamplingParams& p) { p.length_penalty = kNaN; }},
      {"length_penalty", [](SamplingParams& p) { p.length_penalty = -kInf; }},
  };
  for (const BadCase& c : cases) {
    SamplingParams p;
    c.set(p);
    const auto bad = p.find_invalid(kVocab);
    ASSERT_TRUE(bad.has_value()) << c.param;
    EXPECT_EQ(bad->param, c.param);
    EXPECT_EQ(bad->message.rfind(c.param + " ", 0) == 0 || bad->message.rfind(c.param + "[", 0) == 0, true)
        << "message should begin with the parameter name: " << bad->message;
    try {
      p.validate(kVocab);
      ADD_FAILURE() << c.param << " was not rejected";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(c.param), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()), bad->message);
    }
  }
}

TEST(SamplingParams, MessagesNameValueAndRange) {
  SamplingParams p;
  p.top_p = 1.5f;
  EXPECT_EQ(p.find_invalid()->message, "top_p is 1.5, expected a number in (0, 1]");
  p = SamplingParams();
  p.logit_bias = {{40000, 1.0f}};
  EXPECT_EQ(p.find_invalid(32000)->message, "logit_bias has token id 40000, expected an id in [0, 32000)");
  p = SamplingParams();
  p.logit_bias = {{12, 150.0f}};
  EXPECT_EQ(p.find_invalid(32000)->message, "logit_bias for token 12 is 150, expected a number in [-100, 100]");
  p = SamplingParams();
  p.stop_token_ids = {1, 2, 32000};
  EXPECT_EQ(p.find_invalid(32000)->message, "stop_token_ids[2] is 32000, expected an id in [0, 32000)");
  p = SamplingParams();
  p.max_tokens = 8;
  p.min_tokens = 9;
  EXPECT_EQ(p.find_invalid()->message, "min_tokens is 9, expected an integer in [0, max_tokens] = [0, 8]");
  p = SamplingParams();
  p.logprobs = 30;
  EXPECT_EQ(p.find_invalid()->message, "logprobs is 30, expected an integer in [0, 20]");
}

// --max-logprobs: a server's own cap, or -1 for the whole vocabulary (which -1 then asks for).
TEST(SamplingParams, MaxLogprobsCapsOrOpensTheVocabulary) {
  SamplingParams p;
  p.logprobs = 30;
  EXPECT_FALSE(p.find_invalid(32000, 50).has_value());
  p.prompt_logprobs = 51;
  ASSERT_TRUE(p.find_invalid(32000, 50).has_value());
  EXPECT_EQ(p.find_invalid(32000, 50)->param, "prompt_logprobs");
  EXPECT_EQ(p.find_invalid(32000, 50)->message, "prompt_logprobs is 51, expected an integer in [0, 50] (the server's --max-logprobs)");
  p = SamplingParams();
  p.logprobs = -1;
  EXPECT_EQ(p.find_invalid(32000)->message, "logprobs is -1, expected an integer in [0, 20]");
  EXPECT_FALSE(p.find_invalid(32000, -1).has_value());
  p.prompt_logprobs = 32000;
  EXPECT_FALSE(p.find_invalid(32000, -1).has_value());
  p.prompt_logprobs = 32001;
  EXPECT_EQ(p.find_invalid(32000, -1)->message,
            "prompt_logprobs is 32001, expected -1 (the whole vocabulary) or an integer in [0, 32000]");
  p.prompt_logprobs = -1;
  p.resolve_logprobs(32000);
  EXPECT_EQ(p.logprobs, 32000);
  EXPECT_EQ(p.prompt_logprobs, 32000);
  p.logprobs = -2;
  EXPECT_EQ(p.find_invalid(32000, -1)->param, "logprobs");
  p = SamplingParams();
  p.logprobs = 0;
  EXPECT_FALSE(p.find_invalid(32000, 0).has_value());
  p.logprobs = 1;
  EXPECT_TRUE(p.find_invalid(32000, 0).has_value());
}

TEST(SamplingParams, VocabularyBoundOnlyWhenKnown) {
  SamplingParams p;
  p.logit_bias = {{50000, 1.0f}};
  p.stop_token_ids = {60000};
  EXPECT_FALSE(p.find_invalid(0).has_value());
  EXPECT_EQ(p.find_invalid(32000)->param, "logit_bias");
  p.logit_bias.clear();
  EXPECT_EQ(p.find_invalid(32000)->param, "stop_token_ids");
  EXPECT_TRUE(p.find_invalid(60001) == std::nullopt);
}

// JSON integers that do not fit the 32-bit fields are refused, naming the field, instead of
// wrapping to another value (2^32 was token 0; 2^64 - 1 read as a signed number was -1).
TEST(SamplingParamsJson, IntegersBeyond32BitsAreRefused) {
  const auto param_of = [](const char* body) -> std::string {
    try {
      (void)sampling_params_from_json(nlohmann::json::parse(body));
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      return error_param(e.what());
    }
    return "(accepted)";
  };
  EXPECT_EQ(param_of(R"({"logit_bias": {"4294967296": 1}})"), "logit_bias");
  EXPECT_EQ(param_of(R"({"logit_bias": {"-4294967297": 1}})"), "logit_bias");
  EXPECT_EQ(param_of(R"({"logit_bias": {"99999999999999999999999": 1}})"), "logit_bias");
  EXPECT_EQ(param_of(R"({"logit_bias": {"12abc": 1}})"), "logit_bias");
  EXPECT_EQ(param_of(R"({"stop_token_ids": [4294967296]})"), "stop_token_ids");
  EXPECT_EQ(param_of(R"({"stop_token_ids": [18446744073709551615]})"), "stop_token_ids");
  EXPECT_EQ(param_of(R"({"max_tokens": 18446744073709551615})"), "max_tokens");
  EXPECT_EQ(param_of(R"({"n": 4294967297})"), "n");
  // In range, they are taken as given (the vocabulary is checked later, by validate).
  const SamplingParams p = sampling_params_from_json(
      nlohmann::json::parse(R"({"logit_bias": {"2147483647": 1}, "stop_token_ids": [0, 2147483647]})"));
  ASSERT_EQ(p.logit_bias.size(), 1u);
  EXPECT_EQ(p.logit_bias[0].first, 2147483647);
  EXPECT_EQ(p.stop_token_ids, (std::vector<int32_t>{0, 2147483647}));
  // Messages about one element of a list still name the list.
  EXPECT_EQ(error_param("stop_token_ids[2] is 32000, expected an id in [0, 32000)"), "stop_token_ids");
}

}  // namespace
}  // namespace duet
