// `duet make-model`: writes a llama- or qwen2-architecture GGUF with deterministic random weights
// and a vocabulary the project learns itself, so a generated file carries no third-party data.
#include <chrono>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "duet/cli/commands.h"
#include "duet/cli/progress.h"
#include "duet/core/error.h"
#include "duet/core/thread_pool.h"
#include "duet/formats/gguf_writer.h"
#include "duet/model/synthetic.h"
#include "duet/tokenizer/bpe_trainer.h"

namespace duet::cli {
namespace {

struct MakeModelOptions {
  std::string preset = "tiny";
  std::string type = "f32";
  std::string output;
  std::string corpus_file;
  uint64_t seed = 1;
  int threads = 0;
  int64_t hidden_size = 0, num_layers = 0, num_heads = 0, num_kv_heads = 0, intermediate_size = 0, num_vocab = 0,
          context_length = 0;
  double rope_base = 0.0, rope_scale = 0.0;
  int64_t sliding_window = -1, max_window_layers = -1;
  bool tied = false;
};

int run_make_model(const MakeModelOptions& o) {
  SyntheticSpec s = synthetic_preset(o.preset);
  if (o.hidden_size) s.hidden_size = o.hidden_size;
  if (o.num_layers) s.num_layers = o.num_layers;
  if (o.num_heads) s.num_heads = o.num_heads;
  if (o.num_kv_heads) s.num_kv_heads = o.num_kv_heads;
  if (o.intermediate_size) s.intermediate_size = o.intermediate_size;
  if (o.num_vocab) s.num_vocab = o.num_vocab;
  if (o.context_length) s.context_length = o.context_length;
  if (o.rope_base > 0) s.rope_base = o.rope_base;
  if (o.rope_scale > 0) s.rope_scale = o.rope_scale;
  if (o.tied) s.tied = true;
  if (o.sliding_window >= 0) s.sliding_window = o.sliding_window;
  if (o.max_window_layers >= 0) s.max_window_layers = o.max_window_layers;
  const std::optional<DType> type = parse_dtype(o.type);
  if (!type) fail(ErrorCode::kInvalidArgument, "unknown --type '{}' (expected f32, f16, bf16, q8_0 or q4_0)", o.type);

  std::string corpus(builtin_corpus());
  if (!o.corpus_file.empty()) {
    std::ifstream in(o.corpus_file, std::ios::binary);
    if (!in) fail(ErrorCode::kNotFound, "cannot read corpus '{}'", o.corpus_file);
    std::stringstream ss;
    ss << in.rdbuf();
    corpus = ss.str();
  }
  // qwen2's pre-tokenizer for qwen2 models (DeepSeek-R1-Distill-Qwen files say deepseek-r1-qwen,
  // the same regex), DeepSeek-Coder's for llama.
  const std::string pre = s.architecture == "qwen2" ? "qwen2" : "deepseek-coder";
  const TrainedVocab vocab = train_bpe(corpus, static_cast<int32_t>(s.num_vocab), pre);

  ThreadPool pool(o.threads);
  GgufWriter w;
  add_synthetic_model(w, s, *type, o.seed, pool);
  w.set("general.name", GgufValue::str(fmt::format("duet synthetic {} (seed {})", o.preset, o.seed)));
  for (auto& [key, value] : tokenizer_metadata(vocab, pre)) w.set(key, std::move(value));

  const auto start = std::chrono::steady_clock::now();
  Progress progress("writing " + o.output);
  w.write(o.output, 3, [&](size_t done, size_t total) { progress.update(done, total); });
  progress.finish();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print(stderr, "wrote {} ({}, {} layers, hidden {}, vocab {} with {} learned merges, {}) in {:.1f} s\n", o.output,
             s.architecture, s.num_layers, s.hidden_size, s.num_vocab, vocab.merges.size(), dtype_name(*type), secs);
  return 0;
}

}  // namespace

void add_make_model_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("make-model", "Write a GGUF model with deterministic random weights");
  auto o = std::make_shared<MakeModelOptions>();
  cmd->add_option("-o,--output", o->output, "Output GGUF file")->required();
  cmd->add_option("--preset", o->preset, fmt::format("{}", fmt::join(synthetic_preset_names(), ", ")))
      ->capture_default_str();
  cmd->add_option("--type", o->type, "Weight type: f32, f16, bf16, q8_0 or q4_0")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  cmd->add_option("--threads", o->threads, "Threads (default: all)");
  cmd->add_option("--corpus", o->corpus_file, "Text to learn the BPE merges from (default: built-in text)");
  cmd->add_option("--n-embd", o->hidden_size, "Hidden size");
  cmd->add_option("--n-layer,--layers", o->num_layers, "Layers (e.g. fewer than the preset's)");
  cmd->add_option("--n-head", o->num_heads, "Attention heads");
  cmd->add_option("--n-head-kv", o->num_kv_heads, "Key/value heads");
  cmd->add_option("--n-ff", o->intermediate_size, "Feed-forward size");
  cmd->add_option("--vocab-size", o->num_vocab, "Vocabulary size");
  cmd->add_option("--ctx", o->context_length, "Training context length");
  cmd->add_option("--rope-base", o->rope_base, "RoPE frequency base");
  cmd->add_option("--rope-scale", o->rope_scale, "Linear RoPE scaling factor (1: none)");
  cmd->add_flag("--tied", o->tied, "Tie the output head to the token embedding");
  cmd->add_option("--sliding-window", o->sliding_window, "qwen2: attention window in positions (0: none)");
  cmd->add_option("--max-window-layers", o->max_window_layers, "qwen2: layers before this one attend fully");
  cmd->callback([o, &exit_code] { exit_code = run_make_model(*o); });
}

}  // namespace duet::cli
