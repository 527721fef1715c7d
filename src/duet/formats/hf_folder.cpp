#include "duet/formats/hf_folder.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "duet/core/convert.h"
#include "duet/core/env.h"
#include "duet/core/error.h"
#include "duet/core/json_excerpt.h"
#include "duet/core/memory.h"
#include "duet/formats/safetensors.h"

namespace duet {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";
constexpr size_t kMaxListedProblems = 20;

// Hugging Face names inside model.layers.N. -> GGUF names inside blk.N., for llama, qwen2, qwen3,
// deepseek2 and deepseek32 (the names do not collide, so one table serves them all). A name that
// only one architecture has says which (`only`), so that another's folder holding it is refused
// rather than read without it.
struct LayerName {
  std::string_view hf;
  std::string_view gguf;
  std::string_view only = {};
};
constexpr LayerName kLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight", "qwen3"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight", "qwen3"},
    {"self_attn.q_a_proj.weight", "attn_q_a.weight"},
    {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"},
    {"self_attn.q_b_proj.weight", "attn_q_b.weight"},
    {"self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"},
    {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"},
    {"self_attn.kv_b_proj.weight", "attn_kv_b.weight"},
    {"self_attn.indexer.wq_b.weight", "indexer.attn_q_b.weight", "deepseek32"},
    {"self_attn.indexer.wk.weight", "indexer.attn_k.weight", "deepseek32"},
    {"self_attn.indexer.k_norm.weight", "indexer.k_norm.weight", "deepseek32"},
    {"self_attn.indexer.k_norm.bias", "indexer.k_norm.bias", "deepseek32"},
    {"self_attn.indexer.weights_proj.weight", "indexer.proj.weight", "deepseek32"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"mlp.gate.weight", "ffn_gate_inp.weight"},
    {"mlp.gate.e_score_correction_bias", "exp_probs_b.bias"},
    {"mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"},
    {"mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
    {"mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight"},
};
// mlp.experts.E.<hf> -> blk.N.<gguf>, stacked over E.
constexpr LayerName kExpertNames[] = {
    {"gate_proj.weight", "ffn_gate_exps.weight"},
    {"up_proj.weight", "ffn_up_exps.weight"},
    {"down_proj.weight", "ffn_down_exps.weight"},
};
constexpr LayerName kTopNames[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};
// Tensors of quantized checkpoints (AutoAWQ/GPTQ int4, FP8 block scales).
constexpr std::string_view kQuantizedSuffixes[] = {".qweight", ".qzeros", ".scales", ".g_idx", ".weight_scale_inv",
                                                   ".weight_scale", ".input_scale"};

// Reads a decimal number at the start of `s` and the '.' after it; advances `s` past both.
std::optional<int64_t> take_index(std::string_view& s) {
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr == s.data() || ptr == s.data() + s.size() || *ptr != '.' || v < 0) return std::nullopt;
  s.remove_prefix(static_cast<size_t>(ptr - s.data()) + 1);
  return v;
}

struct Mapped {
  enum Kind { kTensor, kExpert, kSkip, kMtp, kUnknown } kind = kUnknown;
  std::string gguf;
  int64_t layer = -1;
  int64_t expert = -1;
};

// DeepSeek-V3's multi-token-prediction layer: its own tensors (llama.cpp's nextn names) beside a
// decoder block named as the others.
constexpr LayerName kNextnNames[] = {
    {"enorm.weight", "nextn.enorm.weight"},
    {"hnorm.weight", "nextn.hnorm.weight"},
    {"eh_proj.weight", "nextn.eh_proj.weight"},
    {"shared_head.norm.weight", "nextn.shared_head_norm.weight"},
    {"shared_head.head.weight", "nextn.shared_head_head.weight"},
    {"embed_tokens.weight", "nextn.embed_tokens.weight"},
};

Mapped map_name(std::string_view hf, const std::string& architecture, int64_t num_layers, bool with_mtp) {
  Mapped m;
  for (const LayerName& t : kTopNames) {
    if (hf == t.hf) {
      m.kind = Mapped::kTensor;
      m.gguf = t.gguf;
      return m;
    }
  }
  std::string_view rest = hf;
  if (!rest.starts_with("model.layers.")) return m;
  rest.remove_prefix(std::strlen("model.layers."));
  const std::optional<int64_t> layer = take_index(rest);
  if (!layer) return m;
  m.layer = *layer;
  const std::string prefix = fmt::format("blk.{}.", *layer);
  if (*layer >= num_layers) {
    m.kind = Mapped::kMtp;
    if (!with_mtp) return m;
    for (const LayerName& t : kNextnNames) {
      if (rest == t.hf) {
        m.kind = Mapped::kTensor;
        m.gguf = prefix + std::string(t.gguf);
        return m;
      }
    }
    m.kind = Mapped::kUnknown;  // the block's tensors, named as in the other layers
  }
  if (rest.ends_with("rotary_emb.inv_freq")) {
    m.kind = Mapped::kSkip;  // recomputed from the config, as every loader does
    return m;
  }
  for (const LayerName& t : kLayerNames) {
    if (rest == t.hf && (t.only.empty() || t.only == architecture)) {
      m.kind = Mapped::kTensor;
      m.gguf = prefix + std::string(t.gguf);
      return m;
    }
  }
  if (rest.starts_with("mlp.experts.")) {
    rest.remove_prefix(std::strlen("mlp.experts."));
    const std::optional<int64_t> expert = take_index(rest);
    if (!expert) return m;
    for (const LayerName& t : kExpertNames) {
      if (rest == t.hf) {
        m.kind = Mapped::kExpert;
        m.gguf = prefix + std::string(t.gguf);
        m.expert = *expert;
        return m;
      }
    }
  }
  return m;
}

struct ShardedTensor {
  std::string name;
  const SafetensorsTensor* tensor;
  const SafetensorsFile* shard;
};

struct Shards {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::vector<ShardedTensor> tensors;  // in the order of the index (or of the single file)
};

std::string file_name(const SafetensorsFile& f) { return fs::path(f.path()).filename().string(); }

Shards open_shards(const fs::path& dir) {
  Shards s;
  const fs::path index_path = dir / kIndexName;
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    const Json index = read_json_file(index_path.string());
    const auto map_it = index.is_object() ? index.find("weight_map") : index.end();
    if (map_it == index.end() || !map_it->is_object()) {
      fail(ErrorCode::kDataLoss, "'{}': 'weight_map' is missing or not an object of tensor name -> shard file",
           index_path.string());
    }
    std::map<std::string, SafetensorsFile*> by_file;
    for (const auto& [name, file] : map_it->items()) {
      if (!file.is_string()) {
        fail(ErrorCode::kDataLoss, "'{}': weight_map['{}'] is {}, expected a file name", index_path.string(), name,
             json_excerpt(file));
      }
      const std::string shard_name = file.get<std::string>();
      if (shard_name.empty() || shard_name.find('/') != std::string::npos || shard_name == "." || shard_name == "..") {
        fail(ErrorCode::kDataLoss, "'{}': weight_map['{}'] is '{}', expected a file in the same folder",
             index_path.string(), name, shard_name);
      }
      auto it = by_file.find(shard_name);
      if (it == by_file.end()) {
        const fs::path shard_path = dir / shard_name;
        if (!fs::exists(shard_path, ec)) {
          fail(ErrorCode::kNotFound, "'{}' does not exist, but '{}' lists it (for tensor '{}')", shard_path.string(),
               index_path.string(), name);
        }
        s.files.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(shard_path.string())));
        it = by_file.emplace(shard_name, s.files.back().get()).first;
      }
      const SafetensorsTensor* t = it->second->find(name);
      if (t == nullptr) {
        fail(ErrorCode::kDataLoss, "'{}': tensor '{}' is not in it, but '{}' says it is", it->second->path(), name,
             index_path.string());
      }
      s.tensors.push_back({name, t, it->second});
    }
    return s;
  }
  const fs::path single = dir / kSingleName;
  if (!fs::exists(single, ec)) {
    const bool pytorch = fs::exists(dir / "pytorch_model.bin", ec) || fs::exists(dir / "pytorch_model.bin.index.json", ec);
    fail(ErrorCode::kNotFound, "'{}': neither {} nor {} is there{}", dir.string(), kIndexName, kSingleName,
         pytorch ? " (PyTorch .bin checkpoints are not read; convert them to safetensors)" : "");
  }
  s.files.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(single.string())));
  for (const SafetensorsTensor& t : s.files.back()->tensors()) s.tensors.push_back({t.name, &t, s.files.back().get()});
  return s;
}

// GGUF shape of a row-major tensor: the dimensions reversed.
std::vector<int64_t> gguf_shape(const std::vector<int64_t>& shape) { return {shape.rbegin(), shape.rend()}; }

class Problems {
 public:
  void add(std::string p) { list_.push_back(std::move(p)); }
  void unsupported(std::string p) {
    unsupported_ = true;
    add(std::move(p));
  }
  void report(const std::string& dir) const {
    if (list_.empty()) return;
    std::vector<std::string> shown(list_.begin(), list_.begin() + std::min(list_.size(), kMaxListedProblems));
    if (list_.size() > kMaxListedProblems) shown.push_back(fmt::format("... and {} more", list_.size() - kMaxListedProblems));
    fail(unsupported_ ? ErrorCode::kUnsupported : ErrorCode::kInvalidArgument, "'{}': {} problem{} with the model's tensors:\n  {}",
         dir, list_.size(), list_.size() == 1 ? "" : "s", fmt::join(shown, "\n  "));
  }

 private:
  std::vector<std::string> list_;
  bool unsupported_ = false;
};

// DUET_FP8=q8_0: FP8 checkpoints converted to Q8_0 at load (the integer kernels: faster prefill,
// less exact) instead of kept as they are (DUET_FP8=fp8, the default).
bool fp8_as_q8_0() { return env_choice("DUET_FP8", {"fp8", "q8_0"}) == 1; }

// The GGML type of a checkpoint tensor duet can compute with, or a problem.
std::optional<DType> computable_type(const ShardedTensor& t, Problems& problems) {
  const SafetensorsDType st = t.tensor->dtype;
  if (st == SafetensorsDType::kF32 || st == SafetensorsDType::kF16 || st == SafetensorsDType::kBF16) {
    return safetensors_to_dtype(st);
  }
  problems.unsupported(fmt::format("tensor '{}' in {} is {}: duet computes with F32, F16 and BF16 tensors, and FP8 "
                                   "blocks or AWQ int4 when config.json's quantization_config declares them",
                                   t.name, file_name(*t.shard), safetensors_dtype_name(st)));
  return std::nullopt;
}

// A weight as duet computes with it: the checkpoint's bytes in place (F32/F16/BF16), or a copy
// made at load: FP8 e4m3 blocks (with <name>_scale_inv) as they are, in rows that carry their
// scales (FP8 blocks of 128; Q8_0 for other block sizes or with DUET_FP8=q8_0), AutoAWQ int4
// (<base>.qweight with .qzeros and .scales) to Q4_1. hf_shape is row-major, as in the checkpoint.
struct Materialized {
  DType type = DType::kF32;
  std::vector<int64_t> hf_shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::shared_ptr<const void> owner;
};

using TensorIndex = std::map<std::string, const ShardedTensor*, std::less<>>;

const ShardedTensor* companion(const TensorIndex& index, const std::string& name, SafetensorsDType dtype,
                               const ShardedTensor& of, Problems& problems) {
  auto it = index.find(name);
  if (it == index.end()) {
    problems.add(fmt::format("tensor '{}' (for '{}' in {}) is missing", name, of.name, file_name(*of.shard)));
    return nullptr;
  }
  if (it->second->tensor->dtype != dtype) {
    problems.add(fmt::format("tensor '{}' in {} is {}, expected {}", name, file_name(*it->second->shard),
                             safetensors_dtype_name(it->second->tensor->dtype), safetensors_dtype_name(dtype)));
    return nullptr;
  }
  return it->second;
}

// What became of a folder's FP8 weights, for the log.
struct Fp8Stats {
  int64_t matrices = 0;
  int64_t weights = 0;
  size_t bytes = 0;
  DType type = DType::kFP8_E4M3_B128;
};

std::optional<Materialized> materialize(const ShardedTensor& st, const TensorIndex& index, const HfModelConfig& config,
                                        Problems& problems, ConvertedCopies copies, Fp8Stats& fp8) {
  const SafetensorsTensor& t = *st.tensor;
  Materialized m;
  if (st.name.ends_with(".qweight") && config.awq_group > 0) {
    const std::string base = st.name.substr(0, st.name.size() - std::strlen(".qweight"));
    const ShardedTensor* qz = companion(index, base + ".qzeros", SafetensorsDType::kI32, st, problems);
    const ShardedTensor* sc = companion(index, base + ".scales", SafetensorsDType::kF16, st, problems);
    if (qz == nullptr || sc == nullptr) return std::nullopt;
    if (t.dtype != SafetensorsDType::kI32 || t.shape.size() != 2) {
      problems.add(fmt::format("tensor '{}' in {} is {} {}, expected I32 [in, out / 8]", st.name, file_name(*st.shard),
                               safetensors_dtype_name(t.dtype), t.shape_string()));
      return std::nullopt;
    }
    const int64_t in = t.shape[0], out = t.shape[1] * 8, g = config.awq_group;
    if (in % g != 0 || qz->tensor->shape != std::vector<int64_t>{in / g, out / 8} ||
        sc->tensor->shape != std::vector<int64_t>{in / g, out}) {
      problems.add(fmt::format("AWQ tensors of '{}' have shapes {}, {} and {}, expected [{}, {}], [{}, {}] and [{}, {}] "
                               "(group_size {})", base, t.shape_string(), qz->tensor->shape_string(),
                               sc->tensor->shape_string(), in, out / 8, in / g, out / 8, in / g, out, g));
      return std::nullopt;
    }
    auto buffer = std::make_shared<AnonymousMemory>(static_cast<size_t>(out * (in / 32)) * sizeof(BlockQ4_1));
    awq_to_q4_1(reinterpret_cast<const int32_t*>(t.data), reinterpret_cast<const int32_t*>(qz->tensor->data),
                reinterpret_cast<const uint16_t*>(sc->tensor->data), in, out, g,
                static_cast<BlockQ4_1*>(buffer->data()));
    // The checkpoint's pages are not read again: out of memory (and the page cache) they go.
    for (const ShardedTensor* source : {&st, qz, sc}) release_pages(source->tensor->data, source->tensor->nbytes);
    if (copies == ConvertedCopies::kDiscardable) buffer->allow_discard();
    m.type = DType::kQ4_1;
    m.hf_shape = {out, in};
    m.data = static_cast<const uint8_t*>(buffer->data());
    m.nbytes = buffer->size();
    m.owner = std::move(buffer);
    return m;
  }
  if (t.dtype == SafetensorsDType::kF8_E4M3 && config.fp8_block > 0) {
    const ShardedTensor* si = companion(index, st.name + "_scale_inv", SafetensorsDType::kF32, st, problems);
    if (si == nullptr) return std::nullopt;
    const int64_t b = config.fp8_block;
    const bool keep = b == kQKFP8 && !fp8_as_q8_0();
    if (t.shape.size() != 2 || (!keep && t.shape[1] % 32 != 0)) {
      problems.add(fmt::format("FP8 tensor '{}' in {} has shape {}, expected a matrix{}", st.name, file_name(*st.shard),
                               t.shape_string(), keep ? "" : " with rows of a multiple of 32 (to become Q8_0)"));
      return std::nullopt;
    }
    const int64_t rows = t.shape[0], cols = t.shape[1];
    const std::vector<int64_t> want{(rows + b - 1) / b, (cols + b - 1) / b};
    if (si->tensor->shape != want) {
      problems.add(fmt::format("tensor '{}' has shape {}, expected [{}, {}] for {} in blocks of {}", si->name,
                               si->tensor->shape_string(), want[0], want[1], t.shape_string(), b));
      return std::nullopt;
    }
    const auto* scales = reinterpret_cast<const float*>(si->tensor->data);
    for (int64_t i = 0; i < want[0] * want[1]; ++i) {
      // Kept FP8 is decoded with 256 * scale (backend/cpu/kernels_fp8.h): that must not overflow.
      if (!(std::fabs(scales[i]) < 0x1p100f)) {
        problems.add(fmt::format("tensor '{}' in {} has scale {} at block [{}, {}], expected a finite value below 2^100",
                                 si->name, file_name(*si->shard), scales[i], i / want[1], i % want[1]));
        return std::nullopt;
      }
    }
    const DType type = keep ? DType::kFP8_E4M3_B128 : DType::kQ8_0;
    auto buffer = std::make_shared<AnonymousMemory>(static_cast<size_t>(rows) * row_size(type, cols));
    if (keep) {
      fp8_blocks_to_rows(t.data, scales, rows, cols, static_cast<uint8_t*>(buffer->data()));
    } else {
      fp8_blocks_to_q8_0(t.data, scales, rows, cols, b, static_cast<BlockQ8_0*>(buffer->data()));
    }
    for (const ShardedTensor* source : {&st, si}) release_pages(source->tensor->data, source->tensor->nbytes);
    if (copies == ConvertedCopies::kDiscardable) buffer->allow_discard();
    ++fp8.matrices;
    fp8.weights += rows * cols;
    fp8.bytes += buffer->size();
    fp8.type = type;
    m.type = type;
    m.hf_shape = t.shape;
    m.data = static_cast<const uint8_t*>(buffer->data());
    m.nbytes = buffer->size();
    m.owner = std::move(buffer);
    return m;
  }
  const std::optional<DType> type = computable_type(st, problems);
  if (!type) return std::nullopt;
  m.type = *type;
  m.hf_shape = t.shape;
  m.data = t.data;
  m.nbytes = t.nbytes;
  return m;
}

struct ExpertSet {
  std::map<int64_t, const ShardedTensor*> experts;  // by expert number: as many as the folder has, whatever config.json says
  int64_t layer = 0;
};

// Sort key that lists tensors the way GGUF files do: the embedding, the layers in order, the rest.
std::tuple<int, int64_t, std::string> order_key(const GgufTensorInfo& t) {
  if (t.name == "token_embd.weight") return {0, 0, t.name};
  if (t.name.starts_with("blk.")) {
    std::string_view rest = std::string_view(t.name).substr(4);
    return {1, take_index(rest).value_or(0), t.name};
  }
  return {2, 0, t.name};
}

}  // namespace

bool is_hf_folder(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / "config.json", ec);
}

GgufFile open_hf_folder(const std::string& dir_arg, GgufMetadata tokenizer_metadata, ConvertedCopies copies,
                        bool with_mtp) {
  fs::path dir(dir_arg);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail(ErrorCode::kNotFound, "'{}' is not a folder", dir_arg);
  const std::string name = (dir.filename().empty() ? dir.parent_path() : dir).filename().string();
  HfModelConfig config = read_hf_config((dir / "config.json").string(), name);
  GgufMetadata metadata = std::move(config.metadata);
  if (config.architecture == "llama") {
    // Hugging Face's llama q/k rows rotate halves; llama GGUF files permute them to pairs.
    metadata.emplace_back("duet.rope.layout", GgufValue::str("neox"));
  }

  Shards shards = open_shards(dir);
  Problems problems;
  std::vector<GgufTensorInfo> tensors;
  std::map<std::string, ExpertSet> expert_sets;
  std::set<int64_t> mtp_layers;
  std::vector<std::string> unknown;
  bool quantized_names = false;
  bool has_lm_head = false;
  std::vector<std::shared_ptr<const void>> keep_alive;
  TensorIndex index;
  Fp8Stats fp8;
  for (const ShardedTensor& st : shards.tensors) index.emplace(st.name, &st);
  for (const ShardedTensor& st : shards.tensors) {
    // Quantized checkpoints: a weight's companions are read with it.
    std::string hf_name = st.name;
    if (config.awq_group > 0) {
      if (st.name.ends_with(".qzeros") || st.name.ends_with(".scales")) continue;
      if (st.name.ends_with(".qweight")) hf_name = st.name.substr(0, st.name.size() - std::strlen(".qweight")) + ".weight";
    }
    if (config.fp8_block > 0 && st.name.ends_with(".weight_scale_inv")) continue;
    const Mapped m = map_name(hf_name, config.architecture, config.num_layers, with_mtp);
    if (m.kind != Mapped::kUnknown && m.layer >= config.num_layers) mtp_layers.insert(m.layer);
    if (m.kind == Mapped::kMtp) {
      mtp_layers.insert(m.layer);
      continue;
    }
    if (m.kind == Mapped::kSkip) continue;
    if (m.kind == Mapped::kUnknown) {
      for (std::string_view suffix : kQuantizedSuffixes) quantized_names = quantized_names || st.name.ends_with(suffix);
      unknown.push_back(st.name);
      continue;
    }
    if (m.kind == Mapped::kExpert) {
      if (m.expert >= config.num_experts) {
        problems.add(fmt::format("tensor '{}' in {} is expert {}, but config.json has n_routed_experts {}", st.name,
                                 file_name(*st.shard), m.expert, config.num_experts));
        continue;
      }
      ExpertSet& set = expert_sets[m.gguf];
      set.layer = m.layer;
      set.experts[m.expert] = &st;
      continue;
    }
    if (m.gguf == "output.weight") {
      has_lm_head = true;
      if (config.tied_embeddings) continue;  // tie_word_embeddings: the head is the embedding
    }
    std::optional<Materialized> mat = materialize(st, index, config, problems, copies, fp8);
    if (!mat) continue;
    if (mat->hf_shape.empty() || mat->hf_shape.size() > 4) {
      problems.add(fmt::format("tensor '{}' in {} has shape {}, expected 1 to 4 dimensions", st.name,
                               file_name(*st.shard), st.tensor->shape_string()));
      continue;
    }
    GgufTensorInfo t;
    t.name = m.gguf;
    t.type = mat->type;
    t.shape = gguf_shape(mat->hf_shape);
    t.offset = mat->owner ? 0 : st.tensor->offset;
    t.nbytes = mat->nbytes;
    t.data = mat->data;
    tensors.push_back(std::move(t));
    if (mat->owner) keep_alive.push_back(std::move(mat->owner));
  }
  if (!unknown.empty()) {
    const std::string listed = fmt::format("{}{}", fmt::join(unknown.begin(), unknown.begin() + std::min<size_t>(unknown.size(), 5), ", "),
                                           unknown.size() > 5 ? fmt::format(", ... ({} in all)", unknown.size()) : "");
    if (quantized_names) {
      problems.unsupported(fmt::format("quantized weights ({}) that config.json's quantization_config does not declare "
                                       "(duet reads FP8 blocks and AWQ int4 when it does)", listed));
    } else {
      problems.add(fmt::format("tensors that {} ({}) has no place for: {}", config.hf_architecture,
                               config.architecture, listed));
    }
  }
  if (!config.tied_embeddings && !has_lm_head) {
    problems.add("tensor 'lm_head.weight' is missing (config.json has tie_word_embeddings false)");
  }

  // Stack each layer's experts into one [cols, rows, E] tensor.
  for (const auto& [gguf_name, present] : expert_sets) {
    const int64_t num_missing = config.num_experts - static_cast<int64_t>(present.experts.size());
    if (num_missing > 0) {  // the first few named, without walking a count config.json may have made huge
      std::vector<int64_t> missing;
      for (int64_t e = 0; e < config.num_experts && missing.size() < 8; ++e) {
        if (!present.experts.contains(e)) missing.push_back(e);
      }
      problems.add(fmt::format("{} of {} experts of layer {} are missing for '{}' (experts {}{})", num_missing,
                               config.num_experts, present.layer, gguf_name, fmt::join(missing, ", "),
                               num_missing > 8 ? ", ..." : ""));
      continue;
    }
    std::vector<const ShardedTensor*> experts;  // every one is there: in order
    for (const auto& [e, t] : present.experts) experts.push_back(t);
    // Each expert goes into the stacked buffer as soon as it is read (or converted), so no more
    // than one converted expert exists beside the stack, and the checkpoint's pages are released.
    const ShardedTensor& first = *experts[0];
    std::optional<Materialized> head;
    std::shared_ptr<AnonymousMemory> buffer;
    size_t each = 0;
    size_t stacked = 0;
    for (const ShardedTensor* e : experts) {
      std::optional<Materialized> mat = materialize(*e, index, config, problems, copies, fp8);
      if (!mat) break;
      if (!head) {
        if (mat->hf_shape.size() != 2) {
          problems.add(fmt::format("tensor '{}' in {} has shape {}, expected a matrix", first.name,
                                   file_name(*first.shard), first.tensor->shape_string()));
          break;
        }
        if (mat->nbytes == 0) {
          problems.add(fmt::format("tensor '{}' in {} is empty ({})", first.name, file_name(*first.shard),
                                   first.tensor->shape_string()));
          break;
        }
        each = mat->nbytes;
        head = Materialized{mat->type, mat->hf_shape, nullptr, each, nullptr};
        buffer = std::make_shared<AnonymousMemory>(each * experts.size());
        if (copies == ConvertedCopies::kDiscardable) buffer->allow_discard();
      } else if (mat->type != head->type || mat->hf_shape != head->hf_shape) {
        problems.add(fmt::format("tensor '{}' in {} is {} {}, but '{}' is {} {} (experts of one layer must match)",
                                 e->name, file_name(*e->shard), safetensors_dtype_name(e->tensor->dtype),
                                 e->tensor->shape_string(), first.name, safetensors_dtype_name(first.tensor->dtype),
                                 first.tensor->shape_string()));
        break;
      }
      std::memcpy(static_cast<uint8_t*>(buffer->data()) + stacked * each, mat->data, each);
      if (!mat->owner) release_pages(mat->data, each);  // the checkpoint's own bytes, copied
      ++stacked;
    }
    if (stacked != experts.size()) continue;
    auto* dst = static_cast<uint8_t*>(buffer->data());
    GgufTensorInfo t;
    t.name = gguf_name;
    t.type = head->type;
    t.shape = gguf_shape(head->hf_shape);
    t.shape.push_back(static_cast<int64_t>(experts.size()));
    t.nbytes = buffer->size();
    t.data = dst;
    tensors.push_back(std::move(t));
    keep_alive.push_back(std::move(buffer));
  }
  problems.report(dir_arg);
  if (fp8.matrices > 0) {
    const double gib = static_cast<double>(fp8.bytes) / (1 << 30);
    if (fp8.type == DType::kFP8_E4M3_B128) {
      spdlog::info("fp8: {} matrices ({:.3f} B weights) kept as FP8 e4m3 with their block scales: {:.2f} GiB, {:.3f} "
                   "bytes per weight", fp8.matrices, static_cast<double>(fp8.weights) * 1e-9, gib,
                   static_cast<double>(fp8.bytes) / static_cast<double>(fp8.weights));
    } else {
      spdlog::info("fp8: {} matrices ({:.3f} B weights) converted to Q8_0{}: {:.2f} GiB", fp8.matrices,
                   static_cast<double>(fp8.weights) * 1e-9,
                   config.fp8_block != kQKFP8 ? fmt::format(" (blocks of {}, not 128)", config.fp8_block)
                                              : std::string(" (DUET_FP8=q8_0)"), gib);
    }
  }
  if (!config.rope_freq_factors.empty()) {
    // llama3 rope scaling as llama.cpp's converter stores it: a tensor of divisors.
    auto buffer = std::make_shared<std::vector<float>>(config.rope_freq_factors);
    GgufTensorInfo t;
    t.name = "rope_freqs.weight";
    t.type = DType::kF32;
    t.shape = {static_cast<int64_t>(buffer->size())};
    t.nbytes = buffer->size() * sizeof(float);
    t.data = reinterpret_cast<const uint8_t*>(buffer->data());
    tensors.push_back(std::move(t));
    keep_alive.push_back(std::move(buffer));
  }

  std::stable_sort(tensors.begin(), tensors.end(),
                   [](const GgufTensorInfo& a, const GgufTensorInfo& b) { return order_key(a) < order_key(b); });
  if (with_mtp && !mtp_layers.empty()) {
    metadata.emplace_back(config.architecture + ".nextn_predict_layers",
                          GgufValue::u32(static_cast<uint32_t>(mtp_layers.size())));
  } else if (config.num_mtp_layers > 0 || !mtp_layers.empty()) {
    metadata.emplace_back("duet.hf.mtp_layers_skipped", GgufValue::u32(static_cast<uint32_t>(mtp_layers.size())));
  }
  metadata.emplace_back("duet.hf.num_shards", GgufValue::u32(static_cast<uint32_t>(shards.files.size())));
  add_hf_generation_config((dir / "generation_config.json").string(), metadata);
  for (auto& kv : tokenizer_metadata) metadata.push_back(std::move(kv));
  for (const auto& f : shards.files) keep_alive.push_back(f->mapping());
  return GgufFile::assemble(dir_arg, std::move(metadata), std::move(tensors), std::move(keep_alive));
}

}  // namespace duet
