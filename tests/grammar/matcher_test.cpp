// Token masks against brute force (every token's bytes run through the automaton), on a real
// byte-level BPE vocabulary trained from the built-in corpus.
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "duet/formats/gguf.h"
#include "duet/grammar/json_schema.h"
#include "duet/grammar/matcher.h"
#include "duet/grammar/structured_output.h"
#include "duet/tokenizer/bpe_trainer.h"
#include "grammar_fixture.h"

namespace duet::grammar {
namespace {

const Tokenizer& tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    const GgufFile file = GgufFile::assemble("memory", tokenizer_metadata(train_bpe(builtin_corpus(), 2000, "deepseek-coder"),
                                                                         "deepseek-coder"),
                                             {}, {});
    return Tokenizer::from_gguf(file);
  }();
  return *tok;
}

std::shared_ptr<const TokenVocabulary> vocabulary() {
  static const auto v = std::make_shared<const TokenVocabulary>(tokenizer(), 2048, std::vector<int32_t>{tokenizer().eos_id()});
  return v;
}

TEST(TokenVocabulary, TrieHoldsEveryTextTokenOnce) {
  const TokenVocabulary& v = *vocabulary();
  std::vector<int> seen(static_cast<size_t>(v.num_vocab()), 0);
  for (int32_t id : v.sorted_ids()) ++seen[static_cast<size_t>(id)];
  for (int32_t id = 0; id < tokenizer().vocab_size(); ++id) {
    const bool text = !v.bytes(id).empty() && !tokenizer().is_control(id) && id != tokenizer().eos_id();
    EXPECT_EQ(seen[static_cast<size_t>(id)], text ? 1 : 0) << id;
  }
  // Walking node depths rebuilds each token's bytes.
  std::string path;
  for (const TokenVocabulary::Node& n : v.nodes()) {
    path.resize(n.depth - 1u);
    path += static_cast<char>(n.byte);
    for (uint32_t t = n.token_begin; t < n.token_end; ++t) EXPECT_EQ(v.bytes(v.sorted_ids()[t]), path);
  }
}

TEST(CompiledGrammar, MasksEqualBruteForce) {
  const std::vector<StructuredOutputSpec> specs = {
      {ConstraintKind::kJsonSchema, R"({"type": "object", "properties": {"name": {"type": "string"},
         "n": {"type": "integer", "minimum": -5, "maximum": 500}, "x": {"type": "array", "items": {"type": "number"}}},
         "required": ["name", "n"]})"},
      {ConstraintKind::kJsonObject, ""},
      {ConstraintKind::kRegex, "(def|class) [a-z_]+\\(\\):\n    return [0-9]+"},
      {ConstraintKind::kChoice, R"(["positive", "negative", "neutral"])"},
  };
  std::mt19937 rng(2);
  for (const StructuredOutputSpec& spec : specs) {
    auto compiled = std::make_shared<CompiledGrammar>(std::make_shared<const Grammar>(compile_structured_output(spec)),
                                                      vocabulary());
    Automaton& a = compiled->automaton();
    // States along random complete matches.
    for (int walk = 0; walk < 6; ++walk) {
      std::string text;
      ASSERT_TRUE(testing::random_match(a, rng, text, 120, 0.2));
      int32_t s = a.start();
      for (size_t i = 0; i <= text.size(); i += 1 + i % 3) {
        s = a.run(a.start(), text.substr(0, i));
        const TokenMask& mask = compiled->mask(s);
        for (int32_t id = 0; id < vocabulary()->num_vocab(); ++id) {
          bool allowed = false;
          if (id == tokenizer().eos_id()) {
            allowed = a.accepting(s);
          } else if (id < tokenizer().vocab_size() && !tokenizer().is_control(id) && !vocabulary()->bytes(id).empty()) {
            allowed = a.run(s, vocabulary()->bytes(id)) != Automaton::kDead;
          }
          ASSERT_EQ(mask_has(mask, id), allowed) << "token " << id << " '" << vocabulary()->bytes(id) << "' after '"
                                                 << text.substr(0, i) << "'";
        }
      }
    }
  }
}

TEST(GrammarMatcher, FollowsTokensAndRefusesOthers) {
  auto compiled = std::make_shared<CompiledGrammar>(
      std::make_shared<const Grammar>(compile_structured_output({ConstraintKind::kChoice, R"(["return 1", "pass"])"})),
      vocabulary());
  GrammarMatcher m(compiled);
  const std::vector<int32_t> ids = tokenizer().encode("return 1", false, false);
  const int32_t eos = tokenizer().eos_id();
  EXPECT_FALSE(mask_has(m.mask(), eos));
  for (int32_t id : ids) {
    EXPECT_FALSE(m.finished());
    EXPECT_TRUE(mask_has(m.mask(), id));
    ASSERT_TRUE(m.accept_token(id));
  }
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.finished());
  EXPECT_TRUE(mask_has(m.mask(), eos));
  EXPECT_FALSE(m.accept_token(ids.front()));
  GrammarMatcher other(compiled);
  EXPECT_FALSE(other.accept_token(tokenizer().encode("x", false, false).front()));
  EXPECT_FALSE(other.accept_token(eos));
  EXPECT_EQ(other.state(), compiled->automaton().start());
}

TEST(Automaton, DistanceToEndIsTheShortestCompletion) {
  auto g = std::make_shared<const Grammar>(compile_structured_output({ConstraintKind::kRegex, "ab[0-9]{3}(xyz)?"}));
  Automaton a(g);
  EXPECT_EQ(a.distance_to_end(a.start()), 5);
  EXPECT_EQ(a.distance_to_end(a.run(a.start(), "a")), 4);
  EXPECT_EQ(a.distance_to_end(a.run(a.start(), "ab12")), 1);
  EXPECT_EQ(a.distance_to_end(a.run(a.start(), "ab123")), 0);
  EXPECT_EQ(a.distance_to_end(a.run(a.start(), "ab123x")), 2);
  auto json = std::make_shared<const Grammar>(compile_structured_output(
      {ConstraintKind::kJsonSchema, R"({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})"}));
  Automaton j(json);
  EXPECT_EQ(j.distance_to_end(j.start()), static_cast<int32_t>(std::string(R"({"ok":true})").size()));
}

TEST(CompiledGrammar, TheLastTokensOfABudgetStillCompleteTheMatch) {
  // Tokens drawn at random from mask_within with a budget that runs down: every walk ends as a
  // complete match within the budget, and every token the narrowed mask keeps leaves room.
  const std::vector<std::string> schemas = {
      R"({"type": "object", "properties": {"label": {"enum": ["positive", "negative"]}, "notes": {"type": "string"},
          "scores": {"type": "array", "items": {"type": "number"}}}, "required": ["label", "notes", "scores"]})",
      R"({"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]}})"};
  std::mt19937 rng(8);
  for (const std::string& schema : schemas) {
    auto compiled = std::make_shared<CompiledGrammar>(
        std::make_shared<const Grammar>(compile_structured_output({ConstraintKind::kJsonSchema, schema})), vocabulary());
    for (int budget : {60, 90, 150}) {
      for (int walk = 0; walk < 5; ++walk) {
        GrammarMatcher m(compiled);
        TokenMask scratch;
        std::string text;
        bool ended = false;
        for (int used = 0; used < budget && !ended; ++used) {
          bool restricted = false;
          const TokenMask& mask = m.mask_within(budget - used - 1, scratch, restricted);
          std::vector<int32_t> allowed;
          for (int32_t id = 0; id < vocabulary()->num_vocab(); ++id) {
            if (mask_has(mask, id)) allowed.push_back(id);
          }
          ASSERT_FALSE(allowed.empty());
          const int32_t t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
          if (t == tokenizer().eos_id()) {
            ASSERT_TRUE(m.can_end());
            ended = true;
            break;
          }
          if (restricted) {
            const int32_t next = compiled->advance(m.state(), t);
            ASSERT_LE(compiled->tokens_to_end(next), budget - used - 1);
          }
          ASSERT_TRUE(m.accept_token(t));
          text += vocabulary()->bytes(t);
          ended = m.finished();
        }
        ASSERT_TRUE(ended) << "budget " << budget << ": " << text;
        EXPECT_TRUE(nlohmann::json::accept(text)) << text;
      }
    }
  }
}

}  // namespace
}  // namespace duet::grammar
