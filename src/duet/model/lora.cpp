#include "duet/model/lora.h"

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
#include "duet/formats/safetensors.h"

namespace duet {

namespace {

using Json = nlohmann::json;

constexpr std::array<const char*, kNumLoraModules> kPeftNames = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                                  "gate_proj", "up_proj", "down_proj"};

Json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCode::kNotFound, "cannot open '{}'", path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail(ErrorCode::kInvalidArgument, "'{}' is not a JSON object", path);
  return j;
}

// A PEFT tensor name, [base_model.model.]model.layers.N.{self_attn|mlp}.MODULE.lora_{A|B}[.default].weight,
// read without a regular expression (names come from the file): layer, module, 0 for A or 1 for
// B; nullopt for any other name.
struct PeftName {
  int64_t layer = 0;
  size_t module = 0;
  int which = 0;
};
std::optional<PeftName> parse_peft_name(std::string_view name) {
  const auto take = [&](std::string_view prefix) {
    if (name.substr(0, prefix.size()) != prefix) return false;
    name.remove_prefix(prefix.size());
    return true;
  };
  take("base_model.model.");
  if (!take("model.layers.")) return std::nullopt;
  PeftName out;
  size_t digits = 0;
  while (digits < name.size() && digits < 7 && name[digits] >= '0' && name[digits] <= '9') {
    out.layer = out.layer * 10 + (name[digits] - '0');
    ++digits;
  }
  if (digits == 0) return std::nullopt;
  name.remove_prefix(digits);
  if (!take(".self_attn.") && !take(".mlp.")) return std::nullopt;
  out.module = kPeftNames.size();
  for (size_t m = 0; m < kPeftNames.size(); ++m) {
    if (take(std::string(kPeftNames[m]) + ".")) {
      out.module = m;
      break;
    }
  }
  if (out.module == kPeftNames.size()) return std::nullopt;
  if (take("lora_A")) {
    out.which = 0;
  } else if (take("lora_B")) {
    out.which = 1;
  } else {
    return std::nullopt;
  }
  take(".default");
  if (name != ".weight") return std::nullopt;
  return out;
}

// HF's rows of one head, [first half, second half], in llama.cpp's adjacent-pair order.
void permute_rows(std::vector<float>& m, int64_t rows, int64_t cols, int64_t heads) {
  const int64_t hd = rows / heads, half = hd / 2;
  const std::vector<float> src = m;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < half; ++j) {
      for (int64_t two = 0; two < 2; ++two) {
        const int64_t to = h * hd + 2 * j + two, from = h * hd + two * half + j;
        std::copy_n(src.data() + from * cols, cols, m.data() + to * cols);
      }
    }
  }
}

}  // namespace

int64_t LoraShape::in(LoraModule m) const {
  switch (m) {
    case LoraModule::kO: return q_dim;
    case LoraModule::kDown: return ff;
    default: return hidden;
  }
}

int64_t LoraShape::out(LoraModule m) const {
  switch (m) {
    case LoraModule::kQ: return q_dim;
    case LoraModule::kK:
    case LoraModule::kV: return kv_dim;
    case LoraModule::kGate:
    case LoraModule::kUp: return ff;
    default: return hidden;
  }
}

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

std::unique_ptr<LoraAdapter> LoraAdapter::read(const LoraSource& source, const LoraShape& shape) {
  namespace fs = std::filesystem;
  const std::string& dir = source.path;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    fail(ErrorCode::kNotFound, "LoRA adapter '{}': '{}' is not a folder (expected a PEFT adapter folder with "
         "adapter_config.json and adapter_model.safetensors)", source.name, dir);
  }
  const std::string config_path = (fs::path(dir) / "adapter_config.json").string();
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

  auto adapter = std::unique_ptr<LoraAdapter>(new LoraAdapter());
  adapter->name_ = source.name;
  adapter->path_ = dir;
  adapter->rank_ = rank;
  adapter->scale_ = flag("use_rslora") ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
  adapter->layers_.resize(static_cast<size_t>(shape.num_layers));

  const std::string weights_path = (fs::path(dir) / "adapter_model.safetensors").string();
  if (!fs::exists(weights_path, ec)) {
    fail(ErrorCode::kNotFound, "LoRA adapter '{}': '{}' is missing (adapters saved as adapter_model.bin are not "
         "read: save with safe_serialization)", source.name, weights_path);
  }
  const SafetensorsFile file = SafetensorsFile::open(weights_path);
  std::vector<std::string> problems;
  // Each projection's two matrices, as read: [layer][module][0 = A, 1 = B].
  std::vector<std::array<std::array<const SafetensorsTensor*, 2>, kNumLoraModules>> found(
      static_cast<size_t>(shape.num_layers));
  for (const SafetensorsTensor& t : file.tensors()) {
    const std::optional<PeftName> parsed = parse_peft_name(t.name);
    if (!parsed) {
      problems.push_back(fmt::format("'{}': not a LoRA matrix of a supported projection ({}; embeddings, lm_head and "
                                     "other modules are not served)", t.name, fmt::join(kPeftNames, ", ")));
      continue;
    }
    const int64_t layer = parsed->layer;
    if (layer >= shape.num_layers) {
      problems.push_back(fmt::format("'{}': layer {} beyond the model's {}", t.name, layer, shape.num_layers));
      continue;
    }
    const size_t module = parsed->module;
    const int which = parsed->which;
    const auto lm = static_cast<LoraModule>(module);
    const std::vector<int64_t> want = which == 0 ? std::vector<int64_t>{rank, shape.in(lm)}
                                                 : std::vector<int64_t>{shape.out(lm), rank};
    if (t.shape != want) {
      problems.push_back(fmt::format("'{}' has shape {}, expected [{}, {}] (rank {} of the model's {} x {})", t.name,
                                     t.shape_string(), want[0], want[1], rank, shape.out(lm), shape.in(lm)));
      continue;
    }
    const std::optional<DType> type = safetensors_to_dtype(t.dtype);
    if (!type || (*type != DType::kF32 && *type != DType::kF16 && *type != DType::kBF16)) {
      problems.push_back(fmt::format("'{}' is {}, expected F32, F16 or BF16", t.name, safetensors_dtype_name(t.dtype)));
      continue;
    }
    found[static_cast<size_t>(layer)][module][static_cast<size_t>(which)] = &t;
  }
  int64_t num_pairs = 0;
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    for (int mi = 0; mi < kNumLoraModules; ++mi) {
      const auto& ab = found[static_cast<size_t>(l)][static_cast<size_t>(mi)];
      if (ab[0] == nullptr && ab[1] == nullptr) continue;
      if (ab[0] == nullptr || ab[1] == nullptr) {
        problems.push_back(fmt::format("layer {} {}: lora_{} without lora_{}", l, kPeftNames[static_cast<size_t>(mi)],
                                       ab[0] != nullptr ? "A" : "B", ab[0] != nullptr ? "B" : "A"));
        continue;
      }
      const auto lm = static_cast<LoraModule>(mi);
      LoraPair& pair = adapter->pair(l, lm);
      for (int which = 0; which < 2; ++which) {
        const SafetensorsTensor& t = *ab[static_cast<size_t>(which)];
        const int64_t rows = t.shape[0], cols = t.shape[1];
        std::vector<float>& data = adapter->storage_.emplace_back(static_cast<size_t>(rows * cols));
        dequantize_row_ref(*safetensors_to_dtype(t.dtype), t.data, data.data(), rows * cols);
        if (which == 1) {
          for (float& x : data) x = static_cast<float>(x * adapter->scale_);
          if (shape.permuted_qk && (lm == LoraModule::kQ || lm == LoraModule::kK)) {
            permute_rows(data, rows, cols, lm == LoraModule::kQ ? shape.num_heads : shape.num_kv_heads);
          }
        }
        const std::string& name = adapter->names_.emplace_back(
            fmt::format("lora.{}.blk.{}.{}.lora_{}", source.name, l, kPeftNames[static_cast<size_t>(mi)], which == 0 ? "a" : "b"));
        (which == 0 ? pair.a : pair.b) = WeightView{name, DType::kF32, rows, cols, data.data()};
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
