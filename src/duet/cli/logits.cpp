// `duet logits --model FILE --tokens "ID ID ..." [--top K] [--all-positions]`: one JSON line per
// position, {"pos": i, "top": [[id, logit], ...]}, for debugging and cross-checking engines.
#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "duet/cli/commands.h"
#include "duet/cli/engine_options.h"
#include "duet/cli/loading.h"
#include "duet/cli/parallel.h"
#include "duet/engine/model_path.h"
#include "duet/engine/rank_worker.h"
#include "duet/core/error.h"

namespace duet::cli {
namespace {

struct LogitsOptions {
  std::string model;
  std::string tokens;
  int64_t top = 10;
  bool all_positions = false;
  int threads = 0;
  PlacementOptions placement;
  KvDtype kv_dtype = KvDtype::kF16;
  ParallelOptions parallel;
};

int run_logits(const LogitsOptions& o) {
  const std::vector<int32_t> ids = parse_token_ids(o.tokens);
  if (ids.empty()) fail(ErrorCode::kInvalidArgument, "--tokens holds no token ids");
  if (o.top <= 0) fail(ErrorCode::kInvalidArgument, "--top is {}, expected a positive number", o.top);
  std::shared_ptr<ParallelGroup> parallel = start_parallel(o.parallel);
  if (is_worker(parallel)) {
    EngineConfig config;
    config.threads = o.threads;
    config.device_map = o.placement.spec();
    config.kv_cache_dtype = o.kv_dtype;
    config.parallel = parallel;
    return run_rank_worker(std::make_shared<const GgufFile>(open_model_path(o.model)), config);
  }
  LoadedModel m = load_model_file(o.model, o.threads, false, o.placement.spec(), o.kv_dtype, parallel);
  const int64_t vocab = m.model->config().num_vocab;
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t rows = o.all_positions ? n : 1;
  std::vector<float> logits(static_cast<size_t>(rows * vocab));
  SequenceRunner runner(*m.model, n, 16, o.kv_dtype);
  runner.forward(ids, 0, logits.data(), o.all_positions);
  const int64_t k = std::min(o.top, vocab);
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * vocab;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [row](int32_t a, int32_t b) {
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    std::string line = fmt::format("{{\"pos\": {}, \"top\": [", o.all_positions ? r : n - 1);
    for (int64_t i = 0; i < k; ++i) {
      fmt::format_to(std::back_inserter(line), "{}[{}, {}]", i ? ", " : "", order[i], row[order[i]]);
    }
    line += "]}\n";
    std::fputs(line.c_str(), stdout);
  }
  if (parallel) stop_other_ranks(*parallel);
  return 0;
}

}  // namespace

void add_logits_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("logits", "Print the top logits of a token sequence as JSON lines");
  auto o = std::make_shared<LogitsOptions>();
  cmd->add_option("-m,--model", o->model, "GGUF model file or Hugging Face model folder")->required();
  cmd->add_option("--tokens", o->tokens, "Token ids separated by spaces or commas")->required();
  cmd->add_option("--top", o->top, "Logits to print per position (the vocabulary size prints all)")->capture_default_str();
  cmd->add_flag("--all-positions", o->all_positions, "Print every position, not only the last");
  cmd->add_option("-t,--threads", o->threads, "Threads of the cpu device (default: all)");
  add_placement_options(cmd, o->placement);
  add_kv_dtype_option(cmd, o->kv_dtype);
  add_parallel_options(cmd, o->parallel);
  cmd->callback([o, &exit_code] { exit_code = run_logits(*o); });
}

}  // namespace duet::cli
