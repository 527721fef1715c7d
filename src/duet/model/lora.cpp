#include "duet/model/lora.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/core/json_excerpt.h"
#include "duet/core/quant.h"
#include "duet/core/random.h"
#include "duet/formats/gguf.h"
#include "duet/formats/safetensors.h"

namespace duet {

namespace {

using Json = nlohmann::json;

constexpr std::array<const char*, kNumLoraModules> kPeftNames = {
    "q_proj",   "k_proj",   "v_proj",             "o_proj",    "gate_proj",                "up_proj",
    "down_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "shared_experts.gate_proj",
    "shared_experts.up_proj", "shared_experts.down_proj"};

Json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCode::kNotFound, "cannot open '{}'", path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail(ErrorCode::kInvalidArgument, "'{}' is not a JSON object", path);
  return j;
}

// One LoRA matrix as a file holds it, before it is checked and copied.
struct RawMatrix {
  std::string name;
  int64_t layer = 0;
  size_t module = 0;  // a LoraModule, or kNumLoraModules + expert * 3 + (0 gate, 1 up, 2 down)
  int which = 0;      // 0: A (rank x in), 1: B (out x rank)
  int64_t rows = 0, cols = 0;
  DType type = DType::kF32;
  const void* data = nullptr;
};

// llama.cpp's GGUF names of the projections, in LoraModule order.
constexpr std::array<const char*, kNumLoraModules> kGgufNames = {
    "attn_q",   "attn_k",   "attn_v",        "attn_output", "ffn_gate",       "ffn_up",       "ffn_down",
    "attn_q_a", "attn_q_b", "attn_kv_a_mqa", "attn_kv_b",   "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"};

// Tensor names come from the file: they are read by hand, not by a regular expression. `prefix`
// taken off the front of `name`, or false with `name` as it was.
bool take(std::string_view& name, std::string_view prefix) {
  if (name.substr(0, prefix.size()) != prefix) return false;
  name.remove_prefix(prefix.size());
  return true;
}

// A layer number (1 to 7 digits) taken off the front of `name`.
std::optional<int64_t> take_layer(std::string_view& name) {
  int64_t layer = 0;
  size_t digits = 0;
  while (digits < name.size() && digits < 7 && name[digits] >= '0' && name[digits] <= '9') {
    layer = layer * 10 + (name[digits] - '0');
    ++digits;
  }
  if (digits == 0) return std::nullopt;
  name.remove_prefix(digits);
  return layer;
}

// A PEFT tensor name, [base_model.model.]model.layers.N.{self_attn|mlp}.MODULE.lora_{A|B}[.default].weight:
// its layer, module and matrix (0 for A, 1 for B); nullopt for any other name.
std::optional<RawMatrix> parse_peft_name(std::string_view name) {
  RawMatrix out;
  take(name, "base_model.model.");
  if (!take(name, "model.layers.")) return std::nullopt;
  const std::optional<int64_t> layer = take_layer(name);
  if (!layer || (!take(name, ".self_attn.") && !take(name, ".mlp."))) return std::nullopt;
  out.layer = *layer;
  bool named = false;
  if (take(name, "experts.")) {  // a routed expert's: experts.E.{gate,up,down}_proj
    const std::optional<int64_t> expert = take_layer(name);
    if (!expert || !take(name, ".")) return std::nullopt;
    int which = -1;
    if (take(name, "gate_proj.")) which = 0;
    else if (take(name, "up_proj.")) which = 1;
    else if (take(name, "down_proj.")) which = 2;
    if (which < 0) return std::nullopt;
    out.module = static_cast<size_t>(kNumLoraModules + *expert * 3 + which);
    named = true;
  }
  for (size_t m = 0; m < kPeftNames.size() && !named; ++m) {
    if (take(name, std::string(kPeftNames[m]) + ".")) {
      out.module = m;
      named = true;
    }
  }
  if (!named) return std::nullopt;
  if (take(name, "lora_A")) {
    out.which = 0;
  } else if (take(name, "lora_B")) {
    out.which = 1;
  } else {
    return std::nullopt;
  }
  take(name, ".default");
  if (name != ".weight") return std::nullopt;
  return out;
}

// blk.N.NAME.weight.lora_{a|b}, as llama.cpp's convert_lora_to_gguf writes it: the same.
std::optional<RawMatrix> parse_gguf_name(std::string_view name) {
  RawMatrix out;
  if (!take(name, "blk.")) return std::nullopt;
  const std::optional<int64_t> layer = take_layer(name);
  if (!layer || !take(name, ".")) return std::nullopt;
  out.layer = *layer;
  for (size_t m = 0; m < kGgufNames.size(); ++m) {
    const std::string a = std::string(kGgufNames[m]) + ".weight.lora_a", b = std::string(kGgufNames[m]) + ".weight.lora_b";
    if (name == a || name == b) {
      out.module = m;
      out.which = name == a ? 0 : 1;
      return out;
    }
  }
  return std::nullopt;
}

// One head's rows between Hugging Face's order (the first half of the head, then the second) and
// llama.cpp's adjacent pairs (row 2j + t of a head is HF row t * head_dim / 2 + j): to_pairs
// goes that way, otherwise back.
void reorder_rows(std::vector<float>& m, int64_t rows, int64_t cols, int64_t heads, bool to_pairs) {
  const int64_t hd = rows / heads, half = hd / 2;
  const std::vector<float> src = m;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < half; ++j) {
      for (int64_t t = 0; t < 2; ++t) {
        const int64_t pairs = h * hd + 2 * j + t, halves = h * hd + t * half + j;
        std::copy_n(src.data() + (to_pairs ? halves : pairs) * cols, cols, m.data() + (to_pairs ? pairs : halves) * cols);
      }
    }
  }
}

}  // namespace

const char* lora_module_name(LoraModule m) { return kPeftNames[static_cast<size_t>(m)]; }

LoraSource parse_lora_source(const std::string& text) {
  if (!text.empty() && text.front() == '{') {
    // vLLM's JSON form: {"name": ..., "path": ...[, "base_model_name": ...]}.
    const Json j = Json::parse(text, nullptr, false);
    const auto str = [&](const char* key) {
      auto it = j.is_object() ? j.find(key) : j.end();
      return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    if (str("name").empty() || str("path").empty()) {
      fail(ErrorCode::kInvalidArgument, "a LoRA module in JSON is {{\"name\": ..., \"path\": ...}}, got '{}'", text);
    }
    return LoraSource{str("name"), str("path")};
  }
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size()) {
    fail(ErrorCode::kInvalidArgument, "a LoRA module is NAME=PATH (a PEFT adapter folder), got '{}'", text);
  }
  return LoraSource{text.substr(0, eq), text.substr(eq + 1)};
}

std::vector<std::string> LoraAdapter::modules() const {
  std::vector<std::string> out;
  for (int m = 0; m < kNumLoraModules; ++m) {
    bool any = false;
    for (const auto& layer : layers_) any = any || layer[static_cast<size_t>(m)].present();
    if (any) out.emplace_back(kPeftNames[static_cast<size_t>(m)]);
  }
  for (const auto& layer : experts_) {
    if (!layer.empty()) {
      out.emplace_back("experts.N.*_proj");
      break;
    }
  }
  return out;
}

int64_t LoraAdapter::bytes() const {
  int64_t n = 0;
  for (const std::vector<float>& s : storage_) n += static_cast<int64_t>(s.size() * sizeof(float));
  for (const std::vector<uint8_t>& q : quantized_) n += static_cast<int64_t>(q.size());
  return n;
}

void LoraAdapter::quantize_pair_q8_0(int64_t layer, LoraModule module) {
  LoraPair& p = pair(layer, module);
  if (!p.present() || p.a.type != DType::kF32 || p.a.cols % kQK8_0 != 0) return;
  const int64_t rank = p.a.rows, padded = (rank + kQK8_0 - 1) / kQK8_0 * kQK8_0;
  const auto quantize = [&](const WeightView& w, int64_t rows, int64_t cols, auto&& value) {
    std::vector<float> row(static_cast<size_t>(cols));
    std::vector<uint8_t>& out = quantized_.emplace_back(static_cast<size_t>(rows) * row_size(DType::kQ8_0, cols));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) row[static_cast<size_t>(c)] = value(r, c);
      quantize_row_q8_0_ref(row.data(), reinterpret_cast<BlockQ8_0*>(out.data() + r * row_size(DType::kQ8_0, cols)), cols);
    }
    return WeightView{w.name, DType::kQ8_0, rows, cols, out.data()};
  };
  const auto* a = static_cast<const float*>(p.a.data);
  const auto* b = static_cast<const float*>(p.b.data);
  const int64_t in = p.a.cols;
  p.a = quantize(p.a, padded, in, [&](int64_t r, int64_t c) { return r < rank ? a[r * in + c] : 0.0f; });
  p.b = quantize(p.b, p.b.rows, padded, [&](int64_t r, int64_t c) { return c < rank ? b[r * rank + c] : 0.0f; });
  for (std::vector<float>& s : storage_) {  // the f32 matrices are read no more
    if (s.data() == a || s.data() == b) std::vector<float>().swap(s);
  }
}

void LoraAdapter::shard_pair(int64_t layer, LoraModule module, const LoraShard& shard) {
  LoraPair& p = pair(layer, module);
  if (!p.present() || p.a.type != DType::kF32) return;
  const auto* a = static_cast<const float*>(p.a.data);
  const auto* b = static_cast<const float*>(p.b.data);
  const int64_t rank = p.a.rows, in = p.a.cols;
  if (shard.b_rows >= 0 && (shard.b_row0 != 0 || shard.b_rows != p.b.rows)) {
    if (shard.b_row0 < 0 || shard.b_row0 + shard.b_rows > p.b.rows) {
      fail(ErrorCode::kInternal, "LoRA B rows [{}, +{}) outside {}", shard.b_row0, shard.b_rows, p.b.rows);
    }
    std::vector<float>& rows = storage_.emplace_back(b + shard.b_row0 * rank, b + (shard.b_row0 + shard.b_rows) * rank);
    p.b = WeightView{p.b.name, DType::kF32, shard.b_rows, rank, rows.data()};
  }
  if (shard.a_cols >= 0 && (shard.a_col0 != 0 || shard.a_cols != in)) {
    if (shard.a_col0 < 0 || shard.a_col0 + shard.a_cols > in) {
      fail(ErrorCode::kInternal, "LoRA A columns [{}, +{}) outside {}", shard.a_col0, shard.a_cols, in);
    }
    std::vector<float>& cols = storage_.emplace_back(static_cast<size_t>(rank * shard.a_cols));
    for (int64_t r = 0; r < rank; ++r) {
      std::copy_n(a + r * in + shard.a_col0, shard.a_cols, cols.data() + r * shard.a_cols);
    }
    p.a = WeightView{p.a.name, DType::kF32, rank, shard.a_cols, cols.data()};
  }
  for (std::vector<float>& s : storage_) {  // the whole matrices are read no more
    if ((s.data() == a && p.a.data != a) || (s.data() == b && p.b.data != b)) std::vector<float>().swap(s);
  }
}

void LoraAdapter::set_derived(int64_t layer, LoraModule module, int which, std::vector<float> values, int64_t rows,
                              int64_t cols) {
  LoraPair& p = pair(layer, module);
  if (static_cast<int64_t>(values.size()) != rows * cols || which < 0 || which > 1) {
    fail(ErrorCode::kInternal, "LoRA derived matrix {} of {} x {} from {} values", which, rows, cols, values.size());
  }
  std::vector<float>& kept = storage_.emplace_back(std::move(values));
  const std::string& name = names_.emplace_back(fmt::format("{}.derived{}", p.a.name, which));
  p.derived[static_cast<size_t>(which)] = WeightView{name, DType::kF32, rows, cols, kept.data()};
}

void LoraAdapter::drop_expert_pair(int64_t layer, int64_t expert, int which) {
  LoraPair& p = expert_pair(layer, expert, which);
  for (std::vector<float>& s : storage_) {
    if (s.data() == p.a.data || s.data() == p.b.data) std::vector<float>().swap(s);
  }
  p = LoraPair{};
}

void LoraAdapter::drop_pair(int64_t layer, LoraModule module) {
  LoraPair& p = pair(layer, module);
  if (!p.present()) return;
  for (std::vector<float>& s : storage_) {
    if (s.data() == p.a.data || s.data() == p.b.data || s.data() == p.derived[0].data || s.data() == p.derived[1].data) {
      std::vector<float>().swap(s);
    }
  }
  p = LoraPair{};
}

std::unique_ptr<LoraAdapter> LoraAdapter::read(const LoraSource& source, const LoraShape& shape) {
  namespace fs = std::filesystem;
  const std::string& path = source.path;
  std::error_code ec;
  auto adapter = std::unique_ptr<LoraAdapter>(new LoraAdapter());
  adapter->name_ = source.name;
  adapter->path_ = path;
  adapter->layers_.resize(static_cast<size_t>(shape.num_layers));
  std::vector<RawMatrix> matrices;
  std::vector<std::string> problems;
  std::string weights_path;
  bool rows_permuted = false;  // the file's q/k B rows are in llama.cpp's adjacent-pair order
  // Either file stays open while its matrices are copied below.
  std::optional<SafetensorsFile> safetensors;
  std::optional<GgufFile> gguf;

  if (fs::is_regular_file(path, ec)) {
    // A GGUF adapter (llama.cpp's convert_lora_to_gguf): general.type adapter, adapter.type lora,
    // adapter.lora.alpha (0 or absent: scale 1, as llama.cpp takes it), the rank from the matrices.
    weights_path = path;
    gguf.emplace(GgufFile::open(path));
    const GgufFile& g = *gguf;
    if (g.get_string_or("general.type", "") != "adapter" || g.get_string_or("adapter.type", "") != "lora") {
      fail(ErrorCode::kInvalidArgument, "LoRA adapter '{}': '{}' is not a LoRA adapter (general.type '{}', "
           "adapter.type '{}'; expected adapter and lora, or a PEFT folder)", source.name, path,
           g.get_string_or("general.type", ""), g.get_string_or("adapter.type", ""));
    }
    const std::string arch = g.get_string_or("general.architecture", "");
    if (arch != shape.architecture) {
      fail(ErrorCode::kInvalidArgument, "LoRA adapter '{}': '{}' is for {}, the model is {}", source.name, path, arch,
           shape.architecture);
    }
    rows_permuted = arch == "llama";  // the converter permutes llama's q/k rows, B's with them
    for (const GgufTensorInfo& t : g.tensors()) {
      std::optional<RawMatrix> m = parse_gguf_name(t.name);
      if (!m || t.shape.size() != 2) {
        problems.push_back(fmt::format("'{}': not a LoRA matrix of a supported projection ({}; token_embd, output and "
                                       "other tensors are not served)", t.name, fmt::join(kGgufNames, ", ")));
        continue;
      }
      m->name = t.name;
      m->rows = t.shape[1];
      m->cols = t.shape[0];
      m->type = t.type;
      m->data = t.data;
      matrices.push_back(*m);
    }
    for (const RawMatrix& m : matrices) {
      if (m.which == 0 && adapter->rank_ == 0) adapter->rank_ = m.rows;
    }
    const double alpha = g.get_float_or("adapter.lora.alpha", 0.0);
    adapter->scale_ = alpha != 0.0 && adapter->rank_ > 0 ? alpha / static_cast<double>(adapter->rank_) : 1.0;
  } else if (fs::is_directory(path, ec)) {
    const std::string config_path = (fs::path(path) / "adapter_config.json").string();
    const Json config = read_json(config_path);
    const auto bad = [&](ErrorCode code, const std::string& key, const std::string& why) {
      fail(code, "LoRA adapter '{}': '{}': '{}' is {}: {}", source.name, config_path, key,
           config.contains(key) ? json_excerpt(config[key]) : std::string("missing"), why);
    };
    const auto flag = [&](const char* key) {
      auto it = config.find(key);
      return it != config.end() && it->is_boolean() && it->get<bool>();
    };
    const auto non_empty = [&](const char* key) {
      auto it = config.find(key);
      return it != config.end() && !it->is_null() && !(it->is_boolean() && !it->get<bool>()) &&
             !((it->is_object() || it->is_array() || it->is_string()) && it->empty());
    };
    if (config.contains("peft_type") && config["peft_type"] != "LORA") {
      bad(ErrorCode::kUnsupported, "peft_type", "only LORA adapters are served");
    }
    auto r_it = config.find("r");
    if (r_it == config.end() || !r_it->is_number_integer() || r_it->get<int64_t>() <= 0) {
      bad(ErrorCode::kInvalidArgument, "r", "expected a positive integer (the rank)");
    }
    const int64_t rank = r_it->get<int64_t>();
    auto alpha_it = config.find("lora_alpha");
    if (alpha_it != config.end() && !alpha_it->is_number()) bad(ErrorCode::kInvalidArgument, "lora_alpha", "expected a number");
    const double alpha = alpha_it == config.end() ? 8.0 : alpha_it->get<double>();  // PEFT's default
    if (flag("use_dora")) bad(ErrorCode::kUnsupported, "use_dora", "DoRA adapters are not served");
    if (flag("fan_in_fan_out")) bad(ErrorCode::kUnsupported, "fan_in_fan_out", "transposed (Conv1D) layers are not served");
    if (config.contains("bias") && config["bias"] != "none") bad(ErrorCode::kUnsupported, "bias", "adapters with biases are not served");
    if (non_empty("rank_pattern")) bad(ErrorCode::kUnsupported, "rank_pattern", "one rank for every module is served");
    if (non_empty("alpha_pattern")) bad(ErrorCode::kUnsupported, "alpha_pattern", "one alpha for every module is served");
    if (non_empty("modules_to_save")) {
      bad(ErrorCode::kUnsupported, "modules_to_save", "adapters that replace whole modules are not served");
    }
    adapter->rank_ = rank;
    adapter->scale_ = flag("use_rslora") ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
    weights_path = (fs::path(path) / "adapter_model.safetensors").string();
    if (!fs::exists(weights_path, ec)) {
      fail(ErrorCode::kNotFound, "LoRA adapter '{}': '{}' is missing (adapters saved as adapter_model.bin are not "
           "read: save with safe_serialization)", source.name, weights_path);
    }
    safetensors.emplace(SafetensorsFile::open(weights_path));
    for (const SafetensorsTensor& t : safetensors->tensors()) {
      std::optional<RawMatrix> m = parse_peft_name(t.name);
      if (!m || t.shape.size() != 2) {
        problems.push_back(fmt::format("'{}': not a LoRA matrix of a supported projection ({}, experts.N.*_proj; "
                                       "embeddings, lm_head and other modules are not served)", t.name,
                                       fmt::join(kPeftNames, ", ")));
        continue;
      }
      const std::optional<DType> type = safetensors_to_dtype(t.dtype);
      if (!type || (*type != DType::kF32 && *type != DType::kF16 && *type != DType::kBF16)) {
        problems.push_back(fmt::format("'{}' is {}, expected F32, F16 or BF16", t.name, safetensors_dtype_name(t.dtype)));
        continue;
      }
      m->name = t.name;
      m->rows = t.shape[0];
      m->cols = t.shape[1];
      m->type = *type;
      m->data = t.data;
      matrices.push_back(*m);
    }
  } else {
    fail(ErrorCode::kNotFound, "LoRA adapter '{}': '{}' is neither a folder (PEFT: adapter_config.json and "
         "adapter_model.safetensors) nor a file (a GGUF adapter)", source.name, path);
  }

  const int64_t rank = adapter->rank_;
  // Each projection's two matrices by layer and slot (a module, or kNumLoraModules + expert * 3 +
  // which), [0 = A, 1 = B].
  const size_t num_slots = static_cast<size_t>(kNumLoraModules + 3 * shape.num_experts);
  const auto slot_name = [&](size_t slot) {
    if (slot < kNumLoraModules) return std::string(kPeftNames[slot]);
    const size_t e = (slot - kNumLoraModules) / 3, which = (slot - kNumLoraModules) % 3;
    return fmt::format("experts.{}.{}", e, which == 0 ? "gate_proj" : which == 1 ? "up_proj" : "down_proj");
  };
  // in x out of a slot's projection; 0 x 0 for one the model does not have.
  const auto dims = [&](size_t slot) -> std::pair<int64_t, int64_t> {
    if (slot < kNumLoraModules) return {shape.in(static_cast<LoraModule>(slot)), shape.out(static_cast<LoraModule>(slot))};
    const bool down = (slot - kNumLoraModules) % 3 == 2;
    return down ? std::pair{shape.expert_ff, shape.hidden} : std::pair{shape.hidden, shape.expert_ff};
  };
  std::vector<std::vector<std::array<const RawMatrix*, 2>>> found(static_cast<size_t>(shape.num_layers),
                                                                  std::vector<std::array<const RawMatrix*, 2>>(num_slots));
  std::vector<std::vector<bool>> refused(static_cast<size_t>(shape.num_layers), std::vector<bool>(num_slots));
  const auto refuse = [&](const RawMatrix& m, std::string problem) {
    problems.push_back(std::move(problem));
    if (m.layer < shape.num_layers && m.module < num_slots) refused[static_cast<size_t>(m.layer)][m.module] = true;
  };
  for (const RawMatrix& m : matrices) {
    if (m.layer >= shape.num_layers) {
      problems.push_back(fmt::format("'{}': layer {} beyond the model's {}", m.name, m.layer, shape.num_layers));
      continue;
    }
    if (m.module >= num_slots) {
      problems.push_back(shape.num_experts == 0
                             ? fmt::format("'{}': the {} model has no routed experts", m.name, shape.architecture)
                             : fmt::format("'{}': expert {} beyond the model's {}", m.name,
                                           (m.module - kNumLoraModules) / 3, shape.num_experts));
      continue;
    }
    const auto [in, out] = dims(m.module);
    if (in == 0) {
      refuse(m, fmt::format("'{}': the {} model has no {}", m.name, shape.architecture, slot_name(m.module)));
      continue;
    }
    const int64_t want_rows = m.which == 0 ? rank : out, want_cols = m.which == 0 ? in : rank;
    if (m.rows != want_rows || m.cols != want_cols) {
      refuse(m, fmt::format("'{}' is {} x {}, expected {} x {} (rank {} of the model's {} x {})", m.name, m.rows,
                            m.cols, want_rows, want_cols, rank, out, in));
      continue;
    }
    if (!traits(m.type).can_compute) {
      refuse(m, fmt::format("'{}' has type {}, which this build cannot read", m.name, dtype_name(m.type)));
      continue;
    }
    found[static_cast<size_t>(m.layer)][m.module][static_cast<size_t>(m.which)] = &m;
  }
  int64_t num_pairs = 0;
  adapter->experts_.resize(static_cast<size_t>(shape.num_layers));
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    for (size_t slot = 0; slot < num_slots; ++slot) {
      const auto& ab = found[static_cast<size_t>(l)][slot];
      if (ab[0] == nullptr && ab[1] == nullptr) continue;
      if (ab[0] == nullptr || ab[1] == nullptr) {
        if (refused[static_cast<size_t>(l)][slot]) continue;  // said already
        problems.push_back(fmt::format("layer {} {}: lora_{} without lora_{}", l, slot_name(slot),
                                       ab[0] != nullptr ? "A" : "B", ab[0] != nullptr ? "B" : "A"));
        continue;
      }
      const bool expert = slot >= kNumLoraModules;
      if (expert && adapter->experts_[static_cast<size_t>(l)].empty()) {
        adapter->experts_[static_cast<size_t>(l)].resize(static_cast<size_t>(3 * shape.num_experts));
      }
      LoraPair& pair = expert ? adapter->experts_[static_cast<size_t>(l)][slot - kNumLoraModules]
                              : adapter->pair(l, static_cast<LoraModule>(slot));
      for (int which = 0; which < 2; ++which) {
        const RawMatrix& m = *ab[static_cast<size_t>(which)];
        std::vector<float>& data = adapter->storage_.emplace_back(static_cast<size_t>(m.rows * m.cols));
        for (int64_t r = 0; r < m.rows; ++r) {
          dequantize_row_ref(m.type, static_cast<const uint8_t*>(m.data) + static_cast<size_t>(r) * row_size(m.type, m.cols),
                             data.data() + r * m.cols, m.cols);
        }
        if (which == 1) {
          for (float& x : data) x = static_cast<float>(x * adapter->scale_);
          const bool qk = slot == static_cast<size_t>(LoraModule::kQ) || slot == static_cast<size_t>(LoraModule::kK);
          if (shape.permuted_qk != rows_permuted && qk) {
            const int64_t heads = slot == static_cast<size_t>(LoraModule::kQ) ? shape.num_heads : shape.num_kv_heads;
            reorder_rows(data, m.rows, m.cols, heads, shape.permuted_qk);
          }
        }
        const std::string& name = adapter->names_.emplace_back(
            fmt::format("lora.{}.blk.{}.{}.lora_{}", source.name, l, slot_name(slot), which == 0 ? "a" : "b"));
        (which == 0 ? pair.a : pair.b) = WeightView{name, DType::kF32, m.rows, m.cols, data.data()};
      }
      ++num_pairs;
    }
  }
  if (!problems.empty()) {
    fail(ErrorCode::kInvalidArgument, "LoRA adapter '{}' ('{}'): {} problem{} with its tensors:\n  {}", source.name,
         weights_path, problems.size(), problems.size() == 1 ? "" : "s", fmt::join(problems, "\n  "));
  }
  if (num_pairs == 0) {
    fail(ErrorCode::kInvalidArgument, "LoRA adapter '{}' ('{}') holds no LoRA matrices", source.name, weights_path);
  }
  uint64_t h = mix64(kGolden ^ static_cast<uint64_t>(adapter->rank_));
  for (unsigned char ch : source.name) h = mix64((h + kGolden) ^ ch);
  for (const std::vector<float>& s : adapter->storage_) {
    h = mix64(h ^ (s.size() * kGolden));
    for (float x : s) {
      uint32_t bits;
      std::memcpy(&bits, &x, sizeof(bits));
      h = mix64((h + kGolden) ^ bits);
    }
  }
  adapter->fingerprint_ = h == 0 ? 1 : h;
  return adapter;
}

}  // namespace duet
