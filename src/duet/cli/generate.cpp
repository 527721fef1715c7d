// `duet generate`: with --prompt, streams one completion to stdout and prints prompt and
// generation speed to stderr; with --prompts-file, runs every line of a JSONL file through the
// engine at once and writes one JSON line per prompt, in input order.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "duet/cli/commands.h"
#include "duet/cli/engine_options.h"
#include "duet/cli/loading.h"
#include "duet/cli/progress.h"
#include "duet/core/error.h"
#include "duet/engine/llm.h"
#include "duet/engine/model_path.h"
#include "duet/engine/sampling_json.h"

namespace duet::cli {
namespace {

using nlohmann::json;

struct GenerateOptions {
  std::string model;
  std::string prompt;
  std::string prompts_file;
  std::string output_file;
  EngineOptions engine;
  SamplingParams sampling;
  std::optional<uint64_t> seed;
  std::string lora;  // the --lora-modules adapter every prompt runs with
  bool quiet = false;
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void write_all(std::FILE* f, const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), f);
  std::fflush(f);
}

int run_single(const GenerateOptions& o, EngineConfig config) {
  SamplingParams p = o.sampling;
  if (o.seed) p.seed = o.seed;
  p.validate();
  const auto load_start = Clock::now();
  auto file = std::make_shared<const GgufFile>(open_model_path(
      o.model, ConvertedCopies::kKeep, config.speculative.method == SpeculativeMethod::kMtp));
  std::vector<int32_t> ids = Tokenizer::from_gguf(*file)->encode(o.prompt, true, true);
  if (ids.empty()) fail(ErrorCode::kInvalidArgument, "the prompt is empty and the model adds no BOS token");
  if (config.kv_cache_bytes == 0 && config.kv_cache_tokens == 0) {
    // One request: a pool for its prompt and outputs, not a share of the machine.
    config.kv_cache_tokens = (static_cast<int64_t>(ids.size()) + p.max_tokens + config.block_size) * p.n;
  }
  auto engine = std::make_unique<LLMEngine>(file, config);
  const double load_secs = seconds_since(load_start);

  if (!o.quiet) write_all(stdout, o.prompt);
  const auto start = Clock::now();
  engine->add_request("cli", ids, p);
  std::optional<double> first_token_secs;
  int64_t generated = 0;
  std::string reason = "length";
  while (engine->has_unfinished()) {
    for (const RequestOutput& out : engine->step()) {
      if (!out.error.empty()) fail(ErrorCode::kResourceExhausted, "{}", out.error);
      for (const CompletionDelta& d : out.outputs) {
        if (d.index != 0) continue;
        if (!d.token_ids.empty() && !first_token_secs) first_token_secs = seconds_since(start);
        generated += static_cast<int64_t>(d.token_ids.size());
        if (!o.quiet) write_all(stdout, d.text);
        if (d.finish_reason) reason = std::string(finish_reason_name(*d.finish_reason));
      }
    }
  }
  if (!o.quiet) write_all(stdout, "\n");
  const double total = seconds_since(start);
  const double prompt_secs = first_token_secs.value_or(total);
  const double gen_secs = total - prompt_secs;
  const int64_t n_prompt = static_cast<int64_t>(ids.size());
  // The first generated token comes with the prompt pass; the rest are the generation speed.
  const int64_t decoded = std::max<int64_t>(0, generated - 1);
  fmt::print(stderr,
             "load: {:.2f} s; prompt: {} tokens in {:.3f} s ({:.1f} tok/s); generation: {} tokens in {:.3f} s "
             "({:.1f} tok/s); finish: {}; {} threads\n",
             load_secs, n_prompt, prompt_secs, prompt_secs > 0 ? n_prompt / prompt_secs : 0.0, generated, gen_secs,
             gen_secs > 0 ? decoded / gen_secs : 0.0, reason, placement_threads(engine->placement()));
  if (engine->config().speculative.method != SpeculativeMethod::kNone) {
    const EngineMetrics m = engine->metrics();
    const auto rate = [](int64_t a, int64_t b) { return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : 0.0; };
    fmt::print(stderr, "speculative ({}): {} of {} drafts kept ({:.1f}%) in {} verifying steps, {:.2f} tokens a step\n",
               speculative_method_name(engine->config().speculative.method), m.spec_decode_num_accepted_tokens_total,
               m.spec_decode_num_draft_tokens_total,
               100.0 * rate(m.spec_decode_num_accepted_tokens_total, m.spec_decode_num_draft_tokens_total),
               m.spec_decode_num_drafts_total,
               1.0 + rate(m.spec_decode_num_accepted_tokens_total, m.spec_decode_num_drafts_total));
  }
  return 0;
}

json logprobs_json(const std::vector<SampledToken>& lps) {
  json arr = json::array();
  for (const SampledToken& t : lps) {
    json top = json::array();
    for (const TokenLogprob& c : t.top) top.push_back({c.token_id, c.logprob});
    arr.push_back({{"token_id", t.token_id}, {"logprob", t.logprob}, {"top", top}});
  }
  return arr;
}

json choice_json(const CompletionResult& c, const SamplingParams& p) {
  json j = {{"index", c.index}, {"text", c.text}, {"token_ids", c.token_ids},
            {"finish_reason", finish_reason_name(c.finish_reason)}};
  if (!c.stop_reason.empty()) j["stop_reason"] = c.stop_reason;
  if (p.logprobs || p.use_beam_search) j["cumulative_logprob"] = c.cumulative_logprob;
  if (p.logprobs) j["logprobs"] = logprobs_json(c.logprobs);
  return j;
}

int run_file(const GenerateOptions& o, const EngineConfig& config) {
  std::ifstream in(o.prompts_file);
  if (!in) fail(ErrorCode::kNotFound, "cannot read '{}'", o.prompts_file);
  LLM llm(o.model, config);
  struct Line {
    std::optional<std::string> error;
    PromptInput prompt;
    SamplingParams params;
  };
  std::vector<Line> lines;
  std::string text;
  SamplingParams defaults = o.sampling;
  if (o.seed) defaults.seed = o.seed;
  for (int64_t number = 1; std::getline(in, text); ++number) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    Line line;
    try {
      const json j = json::parse(text);
      line.params = sampling_params_from_json(j, defaults);
      line.params.validate(llm.engine().model_config().num_vocab);
      if (j.contains("prompt_token_ids")) {
        line.prompt.token_ids = j.at("prompt_token_ids").get<std::vector<int32_t>>();
      } else if (j.contains("prompt") && j.at("prompt").is_string()) {
        line.prompt.text = j.at("prompt").get<std::string>();
        line.prompt.token_ids = llm.tokenize(line.prompt.text);
      } else {
        fail(ErrorCode::kInvalidArgument, "prompt must be a string (or give prompt_token_ids)");
      }
      if (line.prompt.token_ids->empty()) fail(ErrorCode::kInvalidArgument, "prompt is empty");
    } catch (const std::exception& e) {
      line.error = fmt::format("line {}: {}", number, e.what());
    }
    lines.push_back(std::move(line));
  }
  // Everything valid runs in one batch; a line the engine refuses is reported on its own.
  std::vector<PromptInput> prompts;
  std::vector<SamplingParams> params;
  std::vector<size_t> index;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].error) continue;
    prompts.push_back(lines[i].prompt);
    params.push_back(lines[i].params);
    index.push_back(i);
  }
  std::vector<GenerationResult> results;
  Progress progress("generating");
  while (true) {
    try {
      results = llm.generate(prompts, params, [&](size_t done, size_t total) { progress.update(done, total); });
      break;
    } catch (const Error& e) {
      // "prompt K: ..." names the refused prompt; report it and run the others.
      const std::string msg = e.what();
      size_t k = 0;
      if (std::sscanf(msg.c_str(), "prompt %zu:", &k) != 1 || k >= prompts.size()) throw;
      lines[index[k]].error = msg.substr(msg.find(':') + 2);
      prompts.erase(prompts.begin() + static_cast<std::ptrdiff_t>(k));
      params.erase(params.begin() + static_cast<std::ptrdiff_t>(k));
      index.erase(index.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  progress.finish();
  std::FILE* out = stdout;
  if (!o.output_file.empty()) {
    out = std::fopen(o.output_file.c_str(), "w");
    if (out == nullptr) fail(ErrorCode::kUnavailable, "cannot write '{}'", o.output_file);
  }
  size_t r = 0;
  int failed = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    json j;
    if (lines[i].error) {
      j = {{"index", i}, {"error", *lines[i].error}};
      ++failed;
    } else {
      const GenerationResult& res = results[r++];
      const SamplingParams& lp = lines[i].params;
      j = {{"index", i}, {"num_prompt_tokens", res.prompt_token_ids.size()}, {"num_cached_tokens", res.num_cached_tokens}};
      if (!res.error.empty()) {
        j["error"] = res.error;
        ++failed;
      }
      if (!res.outputs.empty()) {
        const json first = choice_json(res.outputs.front(), lp);
        for (auto it = first.begin(); it != first.end(); ++it) {
          if (it.key() != "index") j[it.key()] = it.value();
        }
      }
      if (res.outputs.size() > 1) {
        j["choices"] = json::array();
        for (const CompletionResult& c : res.outputs) j["choices"].push_back(choice_json(c, lp));
      }
    }
    write_all(out, j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n");
  }
  if (out != stdout) std::fclose(out);
  if (failed > 0) fmt::print(stderr, "{} of {} prompts failed (see their \"error\")\n", failed, lines.size());
  return failed > 0 ? 1 : 0;
}

int run_generate(GenerateOptions o) {
  if (o.prompt.empty() == o.prompts_file.empty()) {
    fail(ErrorCode::kInvalidArgument, "give exactly one of --prompt and --prompts-file");
  }
  EngineConfig config = o.engine.resolve();
  if (!o.lora.empty()) {
    const auto& a = config.lora_adapters;
    const auto it = std::find_if(a.begin(), a.end(), [&](const LoraSource& s) { return s.name == o.lora; });
    if (it == a.end()) fail(ErrorCode::kInvalidArgument, "--lora {}: no such adapter in --lora-modules", o.lora);
    o.sampling.lora_adapter = static_cast<int32_t>(it - a.begin()) + 1;
  }
  config.parallel = start_parallel(o.engine.parallel);
  if (is_worker(config.parallel)) return run_worker_rank(o.model, config);
  return o.prompts_file.empty() ? run_single(o, config) : run_file(o, config);
}

}  // namespace

void add_generate_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("generate", "Generate text for a prompt, or for every line of a JSONL file");
  auto o = std::make_shared<GenerateOptions>();
  o->sampling.temperature = 0.8f;
  o->sampling.top_k = 40;
  o->sampling.top_p = 0.95f;
  o->sampling.max_tokens = 128;
  cmd->add_option("-m,--model", o->model, "GGUF model file or Hugging Face model folder")->required();
  cmd->add_option("-p,--prompt", o->prompt, "Prompt text (streams the completion)");
  cmd->add_option("--prompts-file", o->prompts_file,
                  "JSONL file: one {\"prompt\": ..., sampling parameters...} per line; writes one JSON line each");
  cmd->add_option("-o,--output", o->output_file, "Write the JSON lines here instead of stdout");
  cmd->add_option("-n,--max-tokens", o->sampling.max_tokens, "Tokens to generate at most")->capture_default_str();
  cmd->add_option("--temperature", o->sampling.temperature, "0 is greedy")->capture_default_str();
  cmd->add_option("--top-k", o->sampling.top_k, "Keep the k most likely tokens (0: all)")->capture_default_str();
  cmd->add_option("--top-p", o->sampling.top_p, "Keep the smallest set with this probability mass")->capture_default_str();
  cmd->add_option("--min-p", o->sampling.min_p, "Drop tokens below this share of the most likely")->capture_default_str();
  cmd->add_option("--repetition-penalty", o->sampling.repetition_penalty, "> 1 discourages repeats")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Random seed (default: random)");
  cmd->add_flag("--ignore-eos", o->sampling.ignore_eos, "Keep generating after an end-of-sequence token");
  cmd->add_flag("-q,--quiet", o->quiet, "Print only the speed line (with --prompt)");
  cmd->add_option("--lora", o->lora, "Run every prompt with this adapter of --lora-modules (its NAME)");
  add_engine_options(cmd, o->engine);
  cmd->callback([o, &exit_code] { exit_code = run_generate(*o); });
}

}  // namespace duet::cli
