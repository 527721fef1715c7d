// `duet generate --model FILE --prompt TEXT`: streams generated text to stdout and prints prompt
// and generation speed to stderr.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include <fmt/format.h>

#include "duet/cli/commands.h"
#include "duet/cli/loading.h"
#include "duet/core/error.h"
#include "duet/engine/sampler.h"

namespace duet::cli {
namespace {

struct GenerateOptions {
  std::string model;
  std::string prompt;
  int64_t max_tokens = 128;
  int64_t context = 0;
  int threads = 0;
  SamplingParams sampling{0.8f, 40, 0.95f, 0};
  std::optional<uint64_t> seed;
  bool ignore_eos = false;
};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int run_generate(GenerateOptions o) {
  if (o.max_tokens < 0) fail(ErrorCode::kInvalidArgument, "--max-tokens is {}, expected >= 0", o.max_tokens);
  o.sampling.seed = o.seed ? *o.seed : std::random_device{}();
  Sampler sampler(o.sampling);
  LoadedModel m = load_model_file(o.model, o.threads, true);
  const ModelConfig& c = m.model->config();
  std::vector<int32_t> prompt = m.tokenizer->encode(o.prompt, true, true);
  if (prompt.empty()) fail(ErrorCode::kInvalidArgument, "the prompt is empty and the model adds no BOS token");
  const int64_t context = o.context > 0 ? o.context : std::min<int64_t>(c.context_length, 4096);
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  if (n_prompt >= context) {
    fail(ErrorCode::kInvalidArgument, "the prompt has {} tokens, the context holds {} (set --ctx)", n_prompt, context);
  }
  const int64_t budget = std::min(o.max_tokens, context - n_prompt);
  auto cache = m.model->new_cache(n_prompt + budget);
  std::vector<float> logits(static_cast<size_t>(c.num_vocab));

  std::fputs(o.prompt.c_str(), stdout);
  std::fflush(stdout);
  const auto prompt_start = Clock::now();
  if (budget > 0) m.model->forward(prompt, 0, *cache, logits.data(), false);
  const double prompt_secs = seconds_since(prompt_start);

  const auto gen_start = Clock::now();
  IncrementalDetokenizer detok(*m.tokenizer);
  const std::vector<int32_t>& stops = m.tokenizer->stop_ids();
  int64_t generated = 0;
  const char* reason = "length";
  for (int64_t pos = n_prompt; generated < budget;) {
    const int32_t id = sampler.sample(logits);
    ++generated;
    if (!o.ignore_eos && std::find(stops.begin(), stops.end(), id) != stops.end()) {
      reason = "stop";
      break;
    }
    const std::string text = detok.push(id);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    if (generated == budget) break;
    const int32_t one[1] = {id};
    m.model->forward(one, pos++, *cache, logits.data(), false);
  }
  const std::string rest = detok.flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  const double gen_secs = seconds_since(gen_start);
  fmt::print(stderr, "load: {:.2f} s; prompt: {} tokens in {:.3f} s ({:.1f} tok/s); generation: {} tokens in {:.3f} s "
             "({:.1f} tok/s); finish: {}; seed {}; {} threads\n",
             m.load_seconds, n_prompt, prompt_secs, prompt_secs > 0 ? n_prompt / prompt_secs : 0.0, generated, gen_secs,
             gen_secs > 0 ? generated / gen_secs : 0.0, reason, o.sampling.seed, m.backend->num_threads());
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("generate", "Generate text from a prompt");
  auto o = std::make_shared<GenerateOptions>();
  cmd->add_option("-m,--model", o->model, "GGUF model file")->required();
  cmd->add_option("-p,--prompt", o->prompt, "Prompt text")->required();
  cmd->add_option("-n,--max-tokens", o->max_tokens, "Tokens to generate at most")->capture_default_str();
  cmd->add_option("--temperature", o->sampling.temperature, "0 is greedy")->capture_default_str();
  cmd->add_option("--top-k", o->sampling.top_k, "Keep the k most likely tokens (0: all)")->capture_default_str();
  cmd->add_option("--top-p", o->sampling.top_p, "Keep the smallest set with this probability mass")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Random seed (default: random)");
  cmd->add_option("--ctx", o->context, "Context length (default: the model's, at most 4096)");
  cmd->add_option("-t,--threads", o->threads, "Threads (default: all)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating after an end-of-sequence token");
  cmd->callback([o, &exit_code] { exit_code = run_generate(*o); });
}

}  // namespace duet::cli
