// `duet bench --model M [-p 512] [-n 128] [-d 0] [-r 3]`: prompt processing (pp) and text
// generation (tg) speed in tokens/s, measured the way llama-bench does: pp runs a prompt of random
// tokens in forward passes of up to -b tokens, tg generates tokens one at a time; both after -d
// tokens already in the cache (llama-bench's depth: that context is processed first, untimed, and
// the test is named "pp512 @ d8192"). Each test repeats -r times after one warm-up run, and the
// table shows mean +- standard deviation. `-o jsonl` prints one JSON object per test instead,
// with llama-bench's field names.
#include <chrono>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "duet/cli/bench_commands.h"
#include "duet/cli/commands.h"
#include "duet/cli/engine_options.h"
#include "duet/cli/loading.h"
#include "duet/cli/units.h"
#include "duet/core/error.h"
#include "duet/core/random.h"

namespace duet::cli {
namespace {

struct BenchOptions {
  std::string model;
  std::vector<int64_t> prompt_lengths{512};
  std::vector<int64_t> gen_lengths{128};
  std::vector<int64_t> depths{0};
  int64_t batch = 2048;
  int repetitions = 3;
  int threads = 0;
  PlacementOptions placement;
  std::string output = "md";
  KvDtype kv_dtype = KvDtype::kF16;
  ParallelOptions parallel;
};

using Clock = std::chrono::steady_clock;

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab));
  return ids;
}

// A sequence with `depth` random tokens already in its cache (processed in forward passes of
// `batch`), on which tests run at positions depth..: each run overwrites the same positions, so
// the context is filled once for all of a test's runs.
class DepthRunner {
 public:
  DepthRunner(Model& model, int64_t depth, int64_t room, int64_t batch, KvDtype kv_dtype)
      : model_(model), depth_(depth), batch_(batch), runner_(model, std::max<int64_t>(1, depth + room), 16, kv_dtype),
        logits_(static_cast<size_t>(model.config().num_vocab)) {
    prompt(random_tokens(depth, model.config().num_vocab, 0x5eed), 0);
  }

  // Seconds for one run of the test after the context.
  double run(int64_t n_prompt, int64_t n_gen, uint64_t seed) {
    const int64_t vocab = model_.config().num_vocab;
    const auto start = Clock::now();
    if (n_prompt > 0) {
      prompt(random_tokens(n_prompt, vocab, seed), depth_);
    } else {
      const std::vector<int32_t> ids = random_tokens(n_gen, vocab, seed);
      for (int64_t i = 0; i < n_gen; ++i) {
        runner_.forward(std::span<const int32_t>(&ids[i], 1), depth_ + i, logits_.data(), false);
      }
    }
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

 private:
  void prompt(const std::vector<int32_t>& ids, int64_t pos0) {
    const auto n = static_cast<int64_t>(ids.size());
    for (int64_t i = 0; i < n; i += batch_) {
      const int64_t len = std::min(batch_, n - i);
      runner_.forward(std::span<const int32_t>(ids.data() + i, static_cast<size_t>(len)), pos0 + i, logits_.data(),
                      false);
    }
  }

  Model& model_;
  int64_t depth_;
  int64_t batch_;
  SequenceRunner runner_;
  std::vector<float> logits_;
};

int run_bench(const BenchOptions& o) {
  if (o.repetitions < 1) fail(ErrorCode::kInvalidArgument, "-r is {}, expected at least 1", o.repetitions);
  if (o.batch < 1) fail(ErrorCode::kInvalidArgument, "-b is {}, expected at least 1", o.batch);
  for (int64_t d : o.depths) {
    if (d < 0) fail(ErrorCode::kInvalidArgument, "-d is {}, expected 0 or more", d);
  }
  if (o.output != "md" && o.output != "jsonl") {
    fail(ErrorCode::kInvalidArgument, "-o is '{}', expected md or jsonl", o.output);
  }
  const bool jsonl = o.output == "jsonl";
  std::shared_ptr<ParallelGroup> parallel = start_parallel(o.parallel);
  if (is_worker(parallel)) return run_worker_rank(o.model, o.threads, o.placement.spec(), o.kv_dtype, parallel);
  LoadedModel m = load_model_file(o.model, o.threads, false, o.placement.spec(), o.kv_dtype, parallel);
  int64_t params = 0;
  size_t bytes = 0;
  for (const GgufTensorInfo& t : m.file->tensors()) {
    params += t.num_elements();
    bytes += t.nbytes;
  }
  if (!jsonl) {
    fmt::print("| model | size | params | backend | threads | test | t/s |\n");
    fmt::print("| --- | ---: | ---: | --- | ---: | ---: | ---: |\n");
  }
  auto report = [&](int64_t depth, int64_t n_prompt, int64_t n_gen) {
    const int64_t tokens = n_prompt > 0 ? n_prompt : n_gen;
    std::string test = n_prompt > 0 ? fmt::format("pp{}", n_prompt) : fmt::format("tg{}", n_gen);
    if (depth > 0) test += fmt::format(" @ d{}", depth);
    DepthRunner runner(*m.model, depth, tokens, o.batch, o.kv_dtype);
    (void)runner.run(n_prompt, n_gen, 1);  // warm-up: page in the weights
    std::vector<double> rates;
    for (int r = 0; r < o.repetitions; ++r) rates.push_back(static_cast<double>(tokens) / runner.run(n_prompt, n_gen, 2 + r));
    double mean = 0.0, var = 0.0;
    for (double x : rates) mean += x / static_cast<double>(rates.size());
    for (double x : rates) var += (x - mean) * (x - mean) / std::max<double>(1.0, static_cast<double>(rates.size()) - 1.0);
    if (jsonl) {
      const nlohmann::json j = {{"model_filename", o.model},
                                {"model_type", m.model->config().architecture},
                                {"model_size", bytes},
                                {"model_n_params", params},
                                {"backends", m.backend_name()},
                                {"n_threads", m.num_threads()},
                                {"type_k", kv_dtype_name(o.kv_dtype)},
                                {"type_v", kv_dtype_name(o.kv_dtype)},
                                {"n_prompt", n_prompt},
                                {"n_gen", n_gen},
                                {"n_depth", depth},
                                {"n_batch", o.batch},
                                {"test", test},
                                {"avg_ts", mean},
                                {"stddev_ts", std::sqrt(var)},
                                {"samples_ts", rates}};
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print("| {} | {} | {} | {} | {} | {} | {:.2f} ± {:.2f} |\n", m.model->config().architecture,
                 human_bytes(static_cast<double>(bytes)), human_count(params), m.backend_name(),
                 m.num_threads(), test, mean, std::sqrt(var));
    }
    std::fflush(stdout);
  };
  for (int64_t d : o.depths) {
    for (int64_t p : o.prompt_lengths) {
      if (p > 0) report(d, p, 0);
    }
    for (int64_t n : o.gen_lengths) {
      if (n > 0) report(d, 0, n);
    }
  }
  if (parallel) stop_other_ranks(*parallel);
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("bench", "Measure prompt processing and generation speed (like llama-bench)");
  auto o = std::make_shared<BenchOptions>();
  add_bench_throughput_command(cmd, exit_code);
  add_bench_serve_command(cmd, exit_code);
  add_bench_bandwidth_command(cmd, exit_code);
  add_bench_grammar_command(cmd, exit_code);
  add_bench_allreduce_command(cmd, exit_code);
  cmd->add_option("-m,--model", o->model, "GGUF model file or Hugging Face model folder");
  cmd->add_option("-p,--n-prompt", o->prompt_lengths, "Prompt lengths (comma separated)")->delimiter(',')->capture_default_str();
  cmd->add_option("-n,--n-gen", o->gen_lengths, "Generation lengths (comma separated)")->delimiter(',')->capture_default_str();
  cmd->add_option("-d,--n-depth", o->depths,
                  "Tokens already in the context before each test (comma separated; llama-bench's depth)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("-b,--batch-size", o->batch, "Most tokens per forward pass of a prompt")->capture_default_str();
  cmd->add_option("-r,--repetitions", o->repetitions, "Runs per test")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Threads of the cpu device (default: all)");
  add_placement_options(cmd, o->placement);
  cmd->add_option("-o,--output", o->output, "md (a markdown table) or jsonl (one JSON object per test)")
      ->capture_default_str();
  add_kv_dtype_option(cmd, o->kv_dtype);
  add_numa_option(cmd);
  add_parallel_options(cmd, o->parallel);
  cmd->callback([cmd, o, &exit_code] {
    if (!cmd->get_subcommands().empty()) return;  // a subcommand (throughput, serve, bandwidth, grammar, allreduce) ran instead
    if (o->model.empty()) fail(ErrorCode::kInvalidArgument, "--model is required");
    exit_code = run_bench(*o);
  });
}

}  // namespace duet::cli
