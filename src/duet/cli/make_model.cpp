// `duet make-model`: writes a llama-, qwen2-, qwen3-, deepseek2- or deepseek32-architecture GGUF with
// deterministic random weights and a vocabulary the project learns itself, so a generated file carries
// no third-party data.
// With --format hf the same model as a Hugging Face folder (config.json, safetensors, tokenizer.json,
// ...): the GGUF is written first, into the folder, converted, and removed.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "duet/cli/commands.h"
#include "duet/cli/progress.h"
#include "duet/core/error.h"
#include "duet/core/thread_pool.h"
#include "duet/formats/gguf_writer.h"
#include "duet/formats/hf_writer.h"
#include "duet/model/synthetic.h"
#include "duet/tokenizer/bpe_trainer.h"
#include "duet/tokenizer/hf_tokenizer_writer.h"
#include "duet/tokenizer/tokenizer.h"

namespace duet::cli {
namespace {

struct MakeModelOptions {
  std::string preset = "tiny";
  std::string type;  // default: f32 for gguf, bf16 for hf
  std::string format = "gguf";
  uint64_t shard_size = 5'000'000'000;
  int64_t awq_group = 128;
  std::string output;
  std::string corpus_file;
  std::string vocab_file;
  uint64_t seed = 1;
  int threads = 0;
  int64_t hidden_size = 0, num_layers = 0, num_heads = 0, num_kv_heads = 0, intermediate_size = 0, num_vocab = 0,
          context_length = 0;
  double rope_base = 0.0, rope_scale = 0.0;
  int64_t head_dim = 0, yarn_original_context = -1;
  double yarn_attn_factor = 0.0;
  int64_t sliding_window = -1, max_window_layers = -1;
  bool tied = false;
  bool split_mla = false;
  int64_t num_mtp_layers = 0;
  bool mtp_own_head = false;
  int64_t padded_vocab = 0;
  int64_t outlier_channels = 0;
  double outlier_scale = 1.0;
  // deepseek2 (-1: the preset's value)
  int64_t num_experts = -1, num_experts_used = -1, num_shared_experts = -1, num_expert_groups = -1,
          num_expert_groups_used = -1, num_dense_layers = -1, expert_intermediate_size = -1, q_lora_rank = -1,
          kv_lora_rank = -1, expert_weights_norm = -1;
  double expert_weights_scale = -1.0;
  // deepseek32 (-1: the preset's value)
  int64_t index_heads = -1, index_head_dim = -1, index_topk = -1;
};

using Metadata = std::vector<std::pair<std::string, GgufValue>>;

GgufArray* array_of(Metadata& m, std::string_view key) {
  for (auto& [k, v] : m) {
    if (k == key) return std::get_if<GgufArray>(&v.value);
  }
  return nullptr;
}

// The tokenizer.* keys of `path` (a real model's GGUF file or llama.cpp's ggml-vocab-*.gguf).
Metadata read_vocab_metadata(const std::string& path) {
  const GgufFile file = GgufFile::open(path);
  Metadata out;
  for (const auto& [key, value] : file.metadata()) {
    if (key.starts_with("tokenizer.")) out.emplace_back(key, value);
  }
  if (array_of(out, "tokenizer.ggml.tokens") == nullptr) fail(ErrorCode::kInvalidArgument, "--vocab '{}' has no tokenizer.ggml.tokens list", path);
  return out;
}

// Pads the token list to a model of `num_vocab` rows as llama.cpp's converter does when
// config.json's vocab_size exceeds the tokenizer's: "[PAD<id>]", type unused, score 0.
void pad_vocab(Metadata& m, int64_t num_vocab) {
  std::vector<GgufValue>& tokens = array_of(m, "tokenizer.ggml.tokens")->items;
  const auto num_tokens = static_cast<int64_t>(tokens.size());
  for (int64_t id = num_tokens; id < num_vocab; ++id) tokens.push_back(GgufValue::str(fmt::format("[PAD{}]", id)));
  if (GgufArray* types = array_of(m, "tokenizer.ggml.token_type"); types != nullptr && !types->items.empty()) {
    GgufValue unused = types->items.back();  // the file's integer type and signedness
    if (std::holds_alternative<uint64_t>(unused.value)) unused.value = static_cast<uint64_t>(TokenType::kUnused);
    else unused.value = static_cast<int64_t>(TokenType::kUnused);
    types->items.resize(static_cast<size_t>(num_vocab), unused);
  }
  if (GgufArray* scores = array_of(m, "tokenizer.ggml.scores"); scores != nullptr && !scores->items.empty()) {
    scores->items.resize(static_cast<size_t>(num_vocab), GgufValue{scores->elem_type, 0.0});
  }
}

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
  if (o.yarn_original_context >= 0) s.yarn_original_context = o.yarn_original_context;
  if (o.yarn_attn_factor > 0) s.yarn_attn_factor = o.yarn_attn_factor;
  if (o.yarn_original_context == 0) s.yarn_attn_factor = 1.0;  // linear scaling: no YaRN keys
  if (o.tied) s.tied = true;
  s.outlier_channels = o.outlier_channels;
  s.outlier_scale = o.outlier_scale;
  if (o.sliding_window >= 0) s.sliding_window = o.sliding_window;
  if (o.max_window_layers >= 0) s.max_window_layers = o.max_window_layers;
  // deepseek2, or deepseek32 (the same with an indexer): "deepseek2" below means both.
  const bool deepseek2 = s.architecture == "deepseek2" || s.architecture == "deepseek32";
  if ((o.index_heads >= 0 || o.index_head_dim >= 0 || o.index_topk >= 0) && s.architecture != "deepseek32") {
    fail(ErrorCode::kInvalidArgument, "the indexer options apply to deepseek32 presets (deepseek32-tiny, "
         "deepseek-v3.2), not to '{}' ({})", o.preset, s.architecture);
  }
  if (o.index_heads >= 0) s.index_heads = o.index_heads;
  if (o.index_head_dim >= 0) s.index_head_dim = o.index_head_dim;
  if (o.index_topk >= 0) s.index_topk = o.index_topk;
  if (deepseek2 && o.yarn_attn_factor > 0) {
    fail(ErrorCode::kInvalidArgument, "--yarn-attn-factor applies to llama, qwen2 and qwen3 (deepseek2's is mscale_all_dim)");
  }
  if (o.head_dim != 0) {
    if (deepseek2) fail(ErrorCode::kInvalidArgument, "--head-dim applies to llama, qwen2 and qwen3 (deepseek2's heads are MLA's)");
    s.head_dim = o.head_dim;
  }
  if (deepseek2 && o.outlier_channels != 0) fail(ErrorCode::kInvalidArgument, "--outlier-channels applies to llama, qwen2 and qwen3");
  if (o.num_kv_heads && deepseek2) {
    fail(ErrorCode::kInvalidArgument, "--n-head-kv does not apply to deepseek2 (MLA has a kv head per head)");
  }
  if (o.num_heads && deepseek2) s.num_kv_heads = s.num_heads;
  const int64_t deepseek2_options[] = {o.num_experts,        o.num_experts_used, o.num_shared_experts,
                                       o.num_expert_groups,  o.num_expert_groups_used, o.num_dense_layers,
                                       o.expert_intermediate_size, o.q_lora_rank,  o.kv_lora_rank,
                                       o.expert_weights_norm};
  bool any_deepseek2_option = o.expert_weights_scale >= 0 || o.split_mla || o.num_mtp_layers != 0 || o.mtp_own_head;
  for (int64_t v : deepseek2_options) any_deepseek2_option |= v >= 0;
  if (any_deepseek2_option && !deepseek2) {
    fail(ErrorCode::kInvalidArgument, "the MoE and MLA options apply to deepseek2 presets, not to '{}' ({})", o.preset,
         s.architecture);
  }
  if (o.num_experts >= 0) s.num_experts = o.num_experts;
  if (o.num_experts_used >= 0) s.num_experts_used = o.num_experts_used;
  if (o.num_shared_experts >= 0) s.num_shared_experts = o.num_shared_experts;
  if (o.num_expert_groups >= 0) s.num_expert_groups = o.num_expert_groups;
  if (o.num_expert_groups_used >= 0) s.num_expert_groups_used = o.num_expert_groups_used;
  if (o.num_dense_layers >= 0) s.num_dense_layers = o.num_dense_layers;
  if (o.expert_intermediate_size >= 0) s.expert_intermediate_size = o.expert_intermediate_size;
  if (o.q_lora_rank >= 0) s.q_lora_rank = o.q_lora_rank;
  if (o.kv_lora_rank >= 0) s.kv_lora_rank = o.kv_lora_rank;
  if (o.expert_weights_norm >= 0) s.expert_weights_norm = o.expert_weights_norm != 0;
  if (o.expert_weights_scale >= 0) s.expert_weights_scale = o.expert_weights_scale;
  s.split_mla = o.split_mla;
  s.num_nextn_layers = o.num_mtp_layers;
  s.nextn_own_head = o.mtp_own_head;
  if (o.mtp_own_head && o.num_mtp_layers == 0) {
    fail(ErrorCode::kInvalidArgument, "--mtp-own-head needs --mtp-layers (1: DeepSeek-V3's one MTP layer)");
  }
  // Fewer layers than the preset's leading dense ones: all dense.
  if (deepseek2 && s.num_dense_layers > s.num_layers) s.num_dense_layers = s.num_layers;
  const bool hf = o.format == "hf";
  if (!hf && o.format != "gguf") {
    fail(ErrorCode::kInvalidArgument, "unknown --format '{}' (expected gguf or hf)", o.format);
  }
  const std::string type_name = !o.type.empty() ? o.type : hf ? "bf16" : "f32";
  HfWriteOptions hf_options;
  hf_options.max_shard_bytes = o.shard_size;
  hf_options.awq_group = o.awq_group;
  std::optional<DType> type;
  if (hf) {
    // The GGUF in between holds the folder's values: in its float type, or f32 to quantize from.
    if (type_name == "fp8" || type_name == "awq") {
      hf_options.quant = type_name == "fp8" ? HfQuant::kFp8 : HfQuant::kAwq;
      type = DType::kF32;
    } else if (type_name == "f32" || type_name == "f16" || type_name == "bf16") {
      type = parse_dtype(type_name);
      hf_options.type = *type;
    } else {
      fail(ErrorCode::kInvalidArgument, "unknown --type '{}' for --format hf (expected f32, f16, bf16, fp8 or awq)",
           type_name);
    }
    if (s.split_mla) {
      fail(ErrorCode::kInvalidArgument, "--split-mla is a GGUF layout; Hugging Face folders hold kv_b_proj");
    }
  } else {
    type = parse_dtype(type_name);
    if (!type) {
      fail(ErrorCode::kInvalidArgument, "unknown --type '{}' (expected f32, f16, bf16, q8_0 or q4_0)", type_name);
    }
  }

  // --vocab: a real tokenizer instead of a learned one. The model's rows cover its tokens (the
  // preset's vocab_size, or the file's token count when that is larger and --vocab-size is not given).
  Metadata vocab_file;
  if (!o.vocab_file.empty()) {
    if (!o.corpus_file.empty()) fail(ErrorCode::kInvalidArgument, "--vocab and --corpus exclude each other");
    vocab_file = read_vocab_metadata(o.vocab_file);
    const auto num_tokens = static_cast<int64_t>(array_of(vocab_file, "tokenizer.ggml.tokens")->items.size());
    if (num_tokens > s.num_vocab) {
      if (o.num_vocab) {
        fail(ErrorCode::kInvalidArgument, "--vocab '{}' has {} tokens, more than --vocab-size {}", o.vocab_file,
             num_tokens, o.num_vocab);
      }
      s.num_vocab = num_tokens;
    }
    pad_vocab(vocab_file, s.num_vocab);
  }
  std::string corpus(builtin_corpus());
  if (!o.corpus_file.empty()) {
    std::ifstream in(o.corpus_file, std::ios::binary);
    if (!in) fail(ErrorCode::kNotFound, "cannot read corpus '{}'", o.corpus_file);
    std::stringstream ss;
    ss << in.rdbuf();
    corpus = ss.str();
  }
  // qwen2's pre-tokenizer for qwen2 and qwen3 models (DeepSeek-R1-Distill-Qwen files say
  // deepseek-r1-qwen, the same regex), DeepSeek-Coder's for llama; for deepseek2 the one of the real model family:
  // DeepSeek-V3/R1's for sigmoid routing, DeepSeek-LLM's (DeepSeek-V2, V2-Lite) for softmax.
  std::string pre = s.architecture == "qwen2" || s.architecture == "qwen3" ? "qwen2" : "deepseek-coder";
  if (deepseek2) pre = s.expert_gating_func == 2 ? "deepseek-v3" : "deepseek-llm";
  TrainedVocab vocab;
  if (vocab_file.empty()) vocab = train_bpe(corpus, static_cast<int32_t>(s.num_vocab), pre);
  if (o.padded_vocab < 0) fail(ErrorCode::kInvalidArgument, "--padded-vocab is {}, expected >= 0", o.padded_vocab);
  s.num_vocab += o.padded_vocab;  // rows of logits the tokenizer has no token for

  ThreadPool pool(o.threads);
  GgufWriter w;
  add_synthetic_model(w, s, *type, o.seed, pool);
  w.set("general.name", GgufValue::str(fmt::format("duet synthetic {} (seed {})", o.preset, o.seed)));
  for (auto& [key, value] : vocab_file.empty() ? tokenizer_metadata(vocab, pre) : std::move(vocab_file)) {
    w.set(key, std::move(value));
  }

  const auto start = std::chrono::steady_clock::now();
  std::string gguf_path = o.output;
  if (hf) {
    if (std::filesystem::exists(o.output) && !std::filesystem::is_directory(o.output)) {
      fail(ErrorCode::kInvalidArgument, "--format hf writes a folder, and '{}' is a file", o.output);
    }
    std::filesystem::create_directories(o.output);
    gguf_path = (std::filesystem::path(o.output) / ".make-model.gguf").string();
  }
  Progress progress("writing " + gguf_path);
  w.write(gguf_path, 3, [&](size_t done, size_t total) { progress.update(done, total); });
  progress.finish();
  if (hf) {
    struct Remove {
      std::string path;
      ~Remove() {
        std::error_code ec;
        std::filesystem::remove(path, ec);
      }
    } remove{gguf_path};
    const GgufFile gguf = GgufFile::open(gguf_path);
    std::vector<std::string> files = write_hf_model(gguf, o.output, hf_options);
    for (std::string& f : write_hf_tokenizer(gguf, o.output)) files.push_back(std::move(f));
    // The shards as one entry: "model-0000{1..N}-of-0000N.safetensors".
    std::vector<std::string> shown;
    size_t shards = 0;
    for (const std::string& f : files) {
      if (f.starts_with("model-")) {
        if (shards++ == 0) shown.emplace_back();
      } else {
        shown.push_back(f);
      }
    }
    for (std::string& f : shown) {
      if (f.empty()) f = fmt::format("{} safetensors shards", shards);
    }
    fmt::print(stderr, "wrote {}/: {}\n", o.output, fmt::join(shown, ", "));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string moe =
      deepseek2 && s.num_dense_layers < s.num_layers
          ? fmt::format(", {} experts + {} shared, top-{}", s.num_experts, s.num_shared_experts, s.num_experts_used)
          : "";
  const std::string tokenizer = o.vocab_file.empty() ? fmt::format("{} learned merges", vocab.merges.size())
                                                     : fmt::format("the tokenizer of {}", o.vocab_file);
  fmt::print(stderr, "wrote {} ({}, {} layers, hidden {}{}, vocab {} with {}, {}) in {:.1f} s\n", o.output,
             s.architecture, s.num_layers, s.hidden_size, moe, s.num_vocab, tokenizer,
             hf ? type_name : std::string(dtype_name(*type)), secs);
  return 0;
}

}  // namespace

void add_make_model_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("make-model", "Write a GGUF model with deterministic random weights");
  auto o = std::make_shared<MakeModelOptions>();
  cmd->add_option("-o,--output", o->output, "Output GGUF file, or folder with --format hf")->required();
  cmd->add_option("--format", o->format, "gguf, or hf: a Hugging Face folder (config.json, safetensors, tokenizer)")
      ->capture_default_str();
  cmd->add_option("--shard-size", o->shard_size, "hf: safetensors shards of at most this size (e.g. 5GB; 0: one file)")
      ->transform(CLI::AsSizeValue(true))
      ->capture_default_str();
  cmd->add_option("--awq-group", o->awq_group, "hf --type awq: inputs per scale and zero point")->capture_default_str();
  cmd->add_option("--preset", o->preset, fmt::format("{}", fmt::join(synthetic_preset_names(), ", ")))
      ->capture_default_str();
  cmd->add_option("--type", o->type,
                  "Weight type: f32 (default), f16, bf16, q8_0 or q4_0; hf: bf16 (default), f16, f32, fp8 (DeepSeek "
                  "FP8 blocks) or awq (AutoAWQ int4)");
  cmd->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  cmd->add_option("--threads", o->threads, "Threads (default: all)");
  cmd->add_option("--corpus", o->corpus_file, "Text to learn the BPE merges from (default: built-in text)");
  cmd->add_option("--vocab", o->vocab_file,
                  "Copy the tokenizer (tokenizer.* keys) of this GGUF file instead of learning one, e.g. "
                  "ggml-vocab-qwen2.gguf for r1-distill-qwen-*");
  cmd->add_option("--n-embd", o->hidden_size, "Hidden size");
  cmd->add_option("--n-layer,--layers", o->num_layers, "Layers (e.g. fewer than the preset's)");
  cmd->add_option("--n-head", o->num_heads, "Attention heads");
  cmd->add_option("--n-head-kv", o->num_kv_heads, "Key/value heads");
  cmd->add_option("--n-ff", o->intermediate_size, "Feed-forward size");
  cmd->add_option("--vocab-size", o->num_vocab, "Vocabulary size");
  cmd->add_option("--padded-vocab", o->padded_vocab,
                  "Rows of logits past the tokenizer's vocabulary (an embedding rounded up, as Qwen2's)");
  cmd->add_option("--ctx", o->context_length, "Training context length");
  cmd->add_option("--rope-base", o->rope_base, "RoPE frequency base");
  cmd->add_option("--rope-scale", o->rope_scale,
                  "RoPE scaling factor, linear (YaRN's with --yarn-orig-ctx; deepseek2: YaRN) (1: none)");
  cmd->add_option("--yarn-orig-ctx", o->yarn_original_context,
                  "YaRN over this many original positions, with --rope-scale as its factor (llama, qwen2, qwen3; 0: "
                  "linear scaling; deepseek2: its original context)");
  cmd->add_option("--yarn-attn-factor", o->yarn_attn_factor,
                  "YaRN: multiplies its magnitude factor 1 + 0.1 ln(factor) (config.json's attn_factor)");
  cmd->add_option("--head-dim", o->head_dim, "llama, qwen2, qwen3: head size (default: hidden size / heads)");
  cmd->add_flag("--tied", o->tied, "Tie the output head to the token embedding");
  cmd->add_option("--outlier-channels", o->outlier_channels,
                  "llama, qwen2: this many channels of the attn/ffn norm weights scaled by --outlier-scale (0: none)");
  cmd->add_option("--outlier-scale", o->outlier_scale, "The factor of the outlier channels")->capture_default_str();
  cmd->add_option("--sliding-window", o->sliding_window, "qwen2: attention window in positions (0: none)");
  cmd->add_option("--max-window-layers", o->max_window_layers, "qwen2: layers before this one attend fully");
  cmd->add_option("--experts", o->num_experts, "deepseek2: routed experts (e.g. fewer than the preset's)");
  cmd->add_option("--experts-used", o->num_experts_used, "deepseek2: experts chosen per token (top-k)");
  cmd->add_option("--shared-experts", o->num_shared_experts, "deepseek2: shared experts");
  cmd->add_option("--expert-groups", o->num_expert_groups, "deepseek2: expert groups (1: no group limit)");
  cmd->add_option("--expert-groups-used", o->num_expert_groups_used, "deepseek2: groups a token may route to");
  cmd->add_option("--expert-ff", o->expert_intermediate_size, "deepseek2: feed-forward size of one expert");
  cmd->add_option("--expert-weights-scale", o->expert_weights_scale, "deepseek2: routed_scaling_factor");
  cmd->add_option("--expert-weights-norm", o->expert_weights_norm, "deepseek2: norm_topk_prob (0 or 1)");
  cmd->add_option("--dense-layers", o->num_dense_layers, "deepseek2: leading layers with a dense FFN");
  cmd->add_option("--q-lora-rank", o->q_lora_rank, "deepseek2: query compression rank (0: direct attn_q)");
  cmd->add_option("--kv-lora-rank", o->kv_lora_rank, "deepseek2: key/value compression rank");
  cmd->add_flag("--split-mla", o->split_mla,
                "deepseek2: MLA as attn_k_b/attn_v_b with key_length_mla (llama.cpp's converter since 2025)");
  cmd->add_option("--mtp-layers", o->num_mtp_layers,
                  "deepseek2: multi-token-prediction layers after the last one (DeepSeek-V3 has 1), for "
                  "--speculative-method mtp")->capture_default_str();
  cmd->add_option("--index-heads", o->index_heads, "deepseek32: the indexer's heads (index_n_heads)");
  cmd->add_option("--index-head-dim", o->index_head_dim, "deepseek32: the indexer's head size (index_head_dim)");
  cmd->add_option("--index-topk", o->index_topk, "deepseek32: positions each query attends to (index_topk)");
  cmd->add_flag("--mtp-own-head", o->mtp_own_head,
                "deepseek2: the MTP layers get their own embed_tokens and shared_head.head (default: shared)");
  cmd->callback([o, &exit_code] { exit_code = run_make_model(*o); });
}

}  // namespace duet::cli
