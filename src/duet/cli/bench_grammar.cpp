// `duet bench grammar --vocab MODEL.gguf (--schema FILE | --regex R | --json-object) [--streams 16]
// [--tokens 256] [--seed 1]`: what structured output costs the engine per decode step, without a
// model: `--streams` sequences walk the grammar together, each step drawing a random allowed
// token per sequence, and the time to get each sequence's token mask is measured (first sight
// of a state: computed over the vocabulary's trie; later: from the cache), with the time to
// apply a mask to a row of logits. Any GGUF with a tokenizer works as --vocab (the vocabulary-only
// files of llama.cpp's test data included), so real vocabularies can be measured with no weights.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include <fmt/format.h>

#include "duet/cli/bench_commands.h"
#include "duet/core/error.h"
#include "duet/engine/model_path.h"
#include "duet/grammar/matcher.h"
#include "duet/grammar/structured_output.h"
#include "duet/tokenizer/tokenizer.h"

namespace duet::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct GrammarBenchOptions {
  std::string vocab;
  std::string schema_file;
  std::string regex;
  bool json_object = false;
  int streams = 16;
  int tokens = 256;
  uint64_t seed = 1;
};

double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p / 100.0 * static_cast<double>(v.size() - 1))];
}

int run_grammar_bench(const GrammarBenchOptions& o) {
  grammar::StructuredOutputSpec spec;
  if (!o.schema_file.empty()) {
    std::ifstream in(o.schema_file);
    if (!in) fail(ErrorCode::kNotFound, "cannot read --schema '{}'", o.schema_file);
    std::stringstream ss;
    ss << in.rdbuf();
    spec = {grammar::ConstraintKind::kJsonSchema, ss.str()};
  } else if (!o.regex.empty()) {
    spec = {grammar::ConstraintKind::kRegex, o.regex};
  } else if (o.json_object) {
    spec = {grammar::ConstraintKind::kJsonObject, {}};
  } else {
    fail(ErrorCode::kInvalidArgument, "give --schema FILE, --regex R or --json-object");
  }
  if (o.streams < 1 || o.tokens < 1) fail(ErrorCode::kInvalidArgument, "--streams and --tokens must be at least 1");

  const GgufFile file = open_model_path(o.vocab);
  const std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(file);
  auto t0 = Clock::now();
  auto vocabulary = std::make_shared<const grammar::TokenVocabulary>(*tok, tok->vocab_size(), tok->stop_ids());
  const double vocab_ms = us_since(t0) / 1000.0;
  t0 = Clock::now();
  auto g = std::make_shared<const grammar::Grammar>(grammar::compile_structured_output(spec));
  auto compiled = std::make_shared<grammar::CompiledGrammar>(g, vocabulary);
  const double compile_ms = us_since(t0) / 1000.0;

  std::mt19937_64 rng(o.seed);
  std::vector<grammar::GrammarMatcher> seqs(static_cast<size_t>(o.streams), grammar::GrammarMatcher(compiled));
  std::vector<bool> done(seqs.size(), false);
  std::vector<double> cold, warm, steps;
  std::vector<float> logits(static_cast<size_t>(vocabulary->num_vocab()), 0.5f);
  double apply_us = 0.0;
  int64_t applied = 0, total_tokens = 0;
  std::vector<int32_t> allowed;
  for (int step = 0; step < o.tokens; ++step) {
    double step_us = 0.0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (done[i]) continue;
      const size_t cached = compiled->num_cached_masks();
      auto t = Clock::now();
      const grammar::TokenMask& mask = seqs[i].mask();
      const double us = us_since(t);
      (compiled->num_cached_masks() > cached ? cold : warm).push_back(us);
      step_us += us;
      // Applying it, as the sampler does: disallowed logits to -inf.
      t = Clock::now();
      for (size_t w = 0; w < mask.size(); ++w) {
        if (mask[w] == ~uint64_t{0}) continue;
        for (size_t b = w * 64; b < std::min(logits.size(), w * 64 + 64); ++b) {
          if (((mask[w] >> (b & 63)) & 1) == 0) logits[b] = -std::numeric_limits<float>::infinity();
        }
      }
      apply_us += us_since(t);
      ++applied;
      allowed.clear();
      for (size_t w = 0; w < mask.size(); ++w) {
        for (uint64_t bits = mask[w]; bits != 0; bits &= bits - 1) {
          allowed.push_back(static_cast<int32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(bits))));
        }
      }
      std::fill(logits.begin(), logits.end(), 0.5f);
      const int32_t pick = allowed.empty() ? -1 : allowed[rng() % allowed.size()];
      if (pick < 0 || vocabulary->is_end(pick) || !seqs[i].accept_token(pick) || seqs[i].finished()) {
        done[i] = true;
        continue;
      }
      ++total_tokens;
    }
    steps.push_back(step_us);
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
  }
  double cold_sum = 0, warm_sum = 0;
  for (double v : cold) cold_sum += v;
  for (double v : warm) warm_sum += v;
  fmt::print("vocabulary: {} tokens ({} in the trie, {} nodes), built in {:.1f} ms\n", vocabulary->num_vocab(),
             vocabulary->sorted_ids().size(), vocabulary->nodes().size(), vocab_ms);
  fmt::print("grammar: {} rules, {} elements, compiled in {:.2f} ms; {} automaton states after the run\n",
             g->num_rules(), g->num_elements(), compile_ms, compiled->automaton().num_states());
  fmt::print("{} streams, {} steps, {} tokens accepted\n", o.streams, steps.size(), total_tokens);
  fmt::print("mask, first sight of a state: {} masks, mean {:.1f} us, p99 {:.1f} us\n", cold.size(),
             cold.empty() ? 0.0 : cold_sum / static_cast<double>(cold.size()), percentile(cold, 99));
  fmt::print("mask, cached: {} masks, mean {:.2f} us\n", warm.size(),
             warm.empty() ? 0.0 : warm_sum / static_cast<double>(warm.size()));
  fmt::print("masks per step (all streams): mean {:.1f} us, p99 {:.1f} us, max {:.1f} us\n",
             steps.empty() ? 0.0 : (cold_sum + warm_sum) / static_cast<double>(steps.size()), percentile(steps, 99),
             steps.empty() ? 0.0 : *std::max_element(steps.begin(), steps.end()));
  fmt::print("applying a mask to a row of logits: mean {:.1f} us\n", applied ? apply_us / static_cast<double>(applied) : 0.0);
  return 0;
}

}  // namespace

void add_bench_grammar_command(CLI::App* bench, int& exit_code) {
  auto* cmd = bench->add_subcommand("grammar", "Cost of structured output's token masks per decode step");
  auto o = std::make_shared<GrammarBenchOptions>();
  cmd->add_option("--vocab", o->vocab, "GGUF file (or model folder) whose tokenizer is used")->required();
  cmd->add_option("--schema", o->schema_file, "JSON schema file");
  cmd->add_option("--regex", o->regex, "Regular expression");
  cmd->add_flag("--json-object", o->json_object, "Any JSON object");
  cmd->add_option("--streams", o->streams, "Sequences walking the grammar together")->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "Steps at most")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the random token choices")->capture_default_str();
  cmd->callback([o, &exit_code] { exit_code = run_grammar_bench(*o); });
}

}  // namespace duet::cli
