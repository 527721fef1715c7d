// `duet bench throughput`: offline throughput like vLLM's benchmark_throughput. Random prompts
// of --input-len tokens, each generating exactly --output-len tokens, all submitted at once;
// reports requests/s, output tokens/s and total tokens/s.
#include <chrono>

#include <fmt/format.h>

#include "duet/cli/bench_commands.h"
#include "duet/cli/engine_options.h"
#include "duet/cli/progress.h"
#include "duet/core/error.h"
#include "duet/core/random.h"
#include "duet/engine/llm.h"

namespace duet::cli {
namespace {

struct ThroughputOptions {
  std::string model;
  int64_t num_prompts = 64;
  int64_t input_len = 128;
  int64_t output_len = 128;
  uint64_t seed = 0;
  EngineOptions engine;
};

int run_throughput(const ThroughputOptions& o) {
  if (o.num_prompts < 1 || o.input_len < 1 || o.output_len < 1) {
    fail(ErrorCode::kInvalidArgument, "--num-prompts, --input-len and --output-len must be at least 1");
  }
  EngineConfig config = o.engine.resolve();
  config.parallel = start_parallel(o.engine.parallel);
  if (is_worker(config.parallel)) return run_worker_rank(o.model, config);
  LLM llm(o.model, config);
  const int64_t vocab = llm.engine().model_config().num_vocab;
  Rng rng(o.seed);
  std::vector<PromptInput> prompts(static_cast<size_t>(o.num_prompts));
  for (PromptInput& p : prompts) {
    std::vector<int32_t> ids(static_cast<size_t>(o.input_len));
    for (int32_t& id : ids) id = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab));
    p.token_ids = std::move(ids);
  }
  SamplingParams params;
  params.temperature = 1.0f;
  params.ignore_eos = true;
  params.max_tokens = static_cast<int32_t>(o.output_len);
  params.seed = o.seed;
  Progress progress("requests");
  const auto start = std::chrono::steady_clock::now();
  const std::vector<GenerationResult> results =
      llm.generate(prompts, {params}, [&](size_t done, size_t total) { progress.update(done, total); });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  progress.finish();
  int64_t output_tokens = 0;
  for (const GenerationResult& r : results) {
    if (!r.error.empty()) fail(ErrorCode::kInternal, "request {} failed: {}", r.request_id, r.error);
    for (const CompletionResult& c : r.outputs) output_tokens += static_cast<int64_t>(c.token_ids.size());
  }
  const int64_t total_tokens = output_tokens + o.num_prompts * o.input_len;
  const EngineMetrics m = llm.engine().metrics();
  for (const DeviceMetrics& d : m.devices) {
    const int64_t steps = d.step_seconds.count();
    fmt::print("Device {}: busy {:.2f} s ({:.0f}% of the run) over {} steps; copies in {:.2f} ms ({:.1f} KiB) per step\n",
               d.name, d.busy_seconds_total, 100.0 * d.busy_seconds_total / secs, steps,
               steps > 0 ? 1e3 * d.copy_seconds_total / static_cast<double>(steps) : 0.0,
               steps > 0 ? static_cast<double>(d.copy_bytes_total) / 1024.0 / static_cast<double>(steps) : 0.0);
  }
  fmt::print("Throughput: {:.2f} requests/s, {:.2f} total tokens/s, {:.2f} output tokens/s\n",
             static_cast<double>(o.num_prompts) / secs, static_cast<double>(total_tokens) / secs,
             static_cast<double>(output_tokens) / secs);
  fmt::print("Requests: {} ({} input + {} output tokens each) in {:.2f} s; max {} sequences at once; {} preemptions; "
             "{} KV blocks of {} tokens\n",
             o.num_prompts, o.input_len, o.output_len, secs, llm.engine().scheduler().config().max_num_seqs,
             m.preemptions_total, llm.engine().num_kv_blocks(), llm.engine().config().block_size);
  return 0;
}

}  // namespace

void add_bench_throughput_command(CLI::App* bench, int& exit_code) {
  auto* cmd = bench->add_subcommand("throughput", "Offline throughput over many concurrent requests");
  auto o = std::make_shared<ThroughputOptions>();
  cmd->add_option("-m,--model", o->model, "GGUF model file or Hugging Face model folder")->required();
  cmd->add_option("--num-prompts", o->num_prompts, "Requests")->capture_default_str();
  cmd->add_option("--input-len", o->input_len, "Prompt tokens per request")->capture_default_str();
  cmd->add_option("--output-len", o->output_len, "Generated tokens per request")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed for the prompts and sampling")->capture_default_str();
  add_engine_options(cmd, o->engine);
  cmd->callback([o, &exit_code] { exit_code = run_throughput(*o); });
}

}  // namespace duet::cli
