// `duet logits --model FILE --tokens "ID ID ..." [--top K] [--all-positions]`: one JSON line per
// position, {"pos": i, "top": [[id, logit], ...]}, for debugging and cross-checking engines.
// With --mtp (a deepseek2 model with an MTP layer), the MTP layer's logits instead: at position i
// (0 .. n-2), from the model's final normalised hidden state at i and token i + 1, the logits of
// token i + 2.
#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "duet/cli/commands.h"
#include "duet/cli/engine_options.h"
#include "duet/cli/loading.h"
#include "duet/cli/parallel.h"
#include "duet/core/error.h"

namespace duet::cli {
namespace {

struct LogitsOptions {
  std::string model;
  std::string tokens;
  int64_t top = 10;
  bool all_positions = false;
  bool mtp = false;
  std::string lora;  // a PEFT adapter folder every position runs with
  int threads = 0;
  PlacementOptions placement;
  KvDtype kv_dtype = KvDtype::kF16;
  ParallelOptions parallel;
};

// The MTP layer's logits over `ids`: the model's forward pass with its hidden states kept, then
// the MTP layer at positions 0 .. n-2 with tokens 1 .. n-1; every row's logits, or the last's.
std::vector<float> mtp_logits(Model& model, const std::vector<int32_t>& ids, KvDtype kv_dtype, bool all) {
  const int64_t n = static_cast<int64_t>(ids.size()), d = model.config().hidden_size;
  const int64_t vocab = model.config().num_vocab;
  constexpr int32_t kBlock = 16;
  std::unique_ptr<PagedKvCache> cache = model.new_kv_cache((n + kBlock - 1) / kBlock, kBlock, kv_dtype);
  std::vector<int32_t> table(static_cast<size_t>(cache->num_blocks()));
  std::iota(table.begin(), table.end(), 0);
  std::vector<float> hidden(static_cast<size_t>(n * d)), last(static_cast<size_t>(vocab));
  BatchInput batch;
  batch.attention.block_size = kBlock;
  batch.add_sequence(ids, 0, table, BatchInput::Logits::kLast);
  batch.hidden_out = hidden.data();
  model.forward(batch, *cache, last.data());
  BatchInput next;
  next.attention.block_size = kBlock;
  next.add_sequence(std::span<const int32_t>(ids).subspan(1), 0, table,
                    all ? BatchInput::Logits::kAll : BatchInput::Logits::kLast);
  std::vector<float> logits(next.logits_rows.size() * static_cast<size_t>(vocab));
  std::vector<float> out(static_cast<size_t>((n - 1) * d));
  model.mtp_forward(next, hidden.data(), *cache, logits.data(), out.data());
  return logits;
}

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
    config.parallel = std::move(parallel);
    if (!o.lora.empty()) config.lora_adapters.push_back(LoraSource{"lora", o.lora});
    return run_worker_rank(o.model, config);
  }
  if (o.mtp && parallel) fail(ErrorCode::kInvalidArgument, "--mtp runs in one process");
  if (o.mtp && !o.lora.empty()) fail(ErrorCode::kInvalidArgument, "--mtp and --lora: the MTP layer has no adapter");
  std::vector<LoraSource> lora;
  if (!o.lora.empty()) lora.push_back(LoraSource{"lora", o.lora});
  LoadedModel m = load_model_file(o.model, o.threads, false, o.placement.spec(), o.kv_dtype, parallel, o.mtp, lora);
  const int64_t vocab = m.model->config().num_vocab;
  int64_t n = static_cast<int64_t>(ids.size());
  std::vector<float> logits;
  if (o.mtp) {
    if (m.model->num_mtp_layers() == 0) {
      fail(ErrorCode::kUnsupported, "'{}' has no multi-token-prediction layer (--mtp)", o.model);
    }
    if (n < 2) fail(ErrorCode::kInvalidArgument, "--mtp needs at least 2 tokens");
    n -= 1;  // positions 0 .. n-2 of the list
    logits = mtp_logits(*m.model, ids, o.kv_dtype, o.all_positions);
  } else {
    logits.resize(static_cast<size_t>((o.all_positions ? n : 1) * vocab));
    SequenceRunner runner(*m.model, n, 16, o.kv_dtype);
    runner.set_lora_adapter(lora.empty() ? 0 : 1);
    runner.forward(ids, 0, logits.data(), o.all_positions);
  }
  const int64_t rows = o.all_positions ? n : 1;
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
  cmd->add_flag("--mtp", o->mtp,
                "The multi-token-prediction layer's logits: at position i, of token i + 2 given the hidden state at i "
                "and token i + 1 (DeepSeek-V3's MTP layer; a Hugging Face folder's is read too)");
  cmd->add_option("--lora", o->lora, "A LoRA adapter (PEFT folder) every position runs with");
  cmd->add_option("-t,--threads", o->threads, "Threads of the cpu device (default: all)");
  add_placement_options(cmd, o->placement);
  add_kv_dtype_option(cmd, o->kv_dtype);
  add_parallel_options(cmd, o->parallel);
  cmd->callback([o, &exit_code] { exit_code = run_logits(*o); });
}

}  // namespace duet::cli
