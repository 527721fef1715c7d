// Structured output in the engine: every finished output is a complete match of its grammar
// (sampled, greedy, n > 1, batched with unconstrained requests, under preemption), the end of
// max_tokens still closes the match, and a grammar that starts after a marker leaves the text
// before it alone.
#include <algorithm>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "duet/grammar/structured_output.h"
#include "engine_fixture.h"

namespace duet {
namespace {

using testing::Finished;
using testing::run_to_completion;
using testing::small_config;
using testing::tiny_model_path;

std::unique_ptr<LLMEngine> make_engine(const EngineConfig& c) {
  return std::make_unique<LLMEngine>(std::make_shared<const GgufFile>(GgufFile::open(tiny_model_path())), c);
}

std::shared_ptr<const grammar::Grammar> compile(grammar::ConstraintKind kind, std::string text) {
  return std::make_shared<const grammar::Grammar>(grammar::compile_structured_output({kind, std::move(text)}));
}

bool full_match(const std::shared_ptr<const grammar::Grammar>& g, const std::string& text) {
  grammar::Automaton a(g);
  const int32_t s = a.run(a.start(), text);
  return s != grammar::Automaton::kDead && a.accepting(s);
}

const char* kSchema = R"({"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
  "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}, "name": {"type": "string"}},
  "required": ["id", "tags", "name"]})";

TEST(StructuredOutput, EveryOutputMatchesItsGrammar) {
  const auto json = compile(grammar::ConstraintKind::kJsonSchema, kSchema);
  const auto regex = compile(grammar::ConstraintKind::kRegex, "(yes|no), [0-9]{2,4}!");
  // A small KV pool forces preemption while sixteen requests run.
  EngineConfig c = small_config(640);
  auto engine = make_engine(c);
  const Tokenizer& tok = engine->tokenizer();
  for (int i = 0; i < 16; ++i) {
    SamplingParams p;
    p.max_tokens = 200;
    p.seed = static_cast<uint64_t>(i);
    p.temperature = i % 4 == 0 ? 0.0f : 1.0f;
    p.n = i % 5 == 0 ? 2 : 1;
    if (i % 3 != 2) {
      p.grammar = i % 2 == 0 ? json : regex;  // every third request is unconstrained
    }
    engine->add_request("r" + std::to_string(i), tok.encode("def f(x): return", true, false), p);
  }
  const std::map<std::string, Finished> done = run_to_completion(*engine);
  ASSERT_EQ(done.size(), 16u);
  for (int i = 0; i < 16; ++i) {
    const Finished& f = done.at("r" + std::to_string(i));
    ASSERT_TRUE(f.error.empty()) << f.error;
    if (i % 3 == 2) continue;
    for (const CompletionDelta& d : f.outputs) {
      ASSERT_TRUE(d.finish_reason == FinishReason::kStop || d.finish_reason == FinishReason::kLength);
      EXPECT_TRUE(full_match(i % 2 == 0 ? json : regex, d.text)) << "request " << i << ": " << d.text;
      if (i % 2 == 0) {
        EXPECT_TRUE(nlohmann::json::accept(d.text)) << d.text;
      }
    }
  }
  EXPECT_GT(engine->metrics().preemptions_total, 0);
  EXPECT_EQ(engine->kv_cache().stats().num_used_blocks, 0);
}

TEST(StructuredOutput, TheEndOfMaxTokensStillClosesTheMatch) {
  const auto json = compile(grammar::ConstraintKind::kJsonSchema, kSchema);
  auto engine = make_engine(small_config());
  for (int max_tokens : {30, 45, 60}) {
    for (uint64_t seed = 0; seed < 4; ++seed) {
      SamplingParams p;
      p.max_tokens = max_tokens;
      p.seed = seed;
      p.grammar = json;
      const std::string id = "m" + std::to_string(max_tokens) + "-" + std::to_string(seed);
      engine->add_request(id, engine->tokenizer().encode("x", true, false), p);
      const Finished f = run_to_completion(*engine).at(id);
      const CompletionDelta& d = f.outputs.at(0);
      EXPECT_LE(static_cast<int>(d.token_ids.size()), max_tokens);
      EXPECT_TRUE(full_match(json, d.text)) << d.text;
    }
  }
}

TEST(StructuredOutput, GrammarAfterAMarkerLeavesTheTextBeforeIt) {
  // A free greedy run, then the same run with a grammar that starts after the text of one of its
  // tokens: the tokens up to that one are the same, and the grammar decides the rest.
  const auto choice = compile(grammar::ConstraintKind::kChoice, R"(["alpha", "beta"])");
  auto engine = make_engine(small_config());
  const Tokenizer& tok = engine->tokenizer();
  SamplingParams free_run;
  free_run.temperature = 0.0f;
  free_run.max_tokens = 12;
  free_run.ignore_eos = true;
  engine->add_request("free", tok.encode("x", true, false), free_run);
  const std::vector<int32_t> free_ids = run_to_completion(*engine).at("free").outputs.at(0).token_ids;
  size_t k = 1;
  auto ascii = [](const std::string& s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c > 0x20 && c < 0x7F; });
  };
  while (k < free_ids.size() && !ascii(tok.token_to_piece(free_ids[k], false))) ++k;
  ASSERT_LT(k, free_ids.size());
  SamplingParams p = free_run;
  p.max_tokens = 40;
  p.grammar = choice;
  p.grammar_after = tok.token_to_piece(free_ids[k], false);
  engine->add_request("after", tok.encode("x", true, false), p);
  const CompletionDelta d = run_to_completion(*engine).at("after").outputs.at(0);
  ASSERT_GT(d.token_ids.size(), k);
  // Free until the marker first appears (at token k, or earlier when an earlier token has it).
  std::string free_text;
  size_t marker_token = 0;
  for (; marker_token < free_ids.size(); ++marker_token) {
    free_text += tok.token_to_piece(free_ids[marker_token], false);
    if (free_text.find(p.grammar_after) != std::string::npos) break;
  }
  for (size_t i = 0; i <= marker_token; ++i) EXPECT_EQ(d.token_ids[i], free_ids[i]) << i;
  EXPECT_TRUE(d.text.ends_with("alpha") || d.text.ends_with("beta")) << d.text;
  EXPECT_EQ(d.finish_reason, FinishReason::kStop);
}

TEST(StructuredOutput, BeamSearchIsRefused) {
  auto engine = make_engine(small_config());
  SamplingParams p;
  p.use_beam_search = true;
  p.n = 2;
  p.grammar = compile(grammar::ConstraintKind::kRegex, "a+");
  EXPECT_THROW(engine->add_request("b", {1, 2, 3}, p), Error);
}

}  // namespace
}  // namespace duet
