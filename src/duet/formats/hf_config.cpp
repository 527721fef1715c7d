#include "duet/formats/hf_config.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <system_error>

#include <fmt/format.h>

#include "duet/core/error.h"
#include "duet/core/json_excerpt.h"

namespace duet {
namespace {

using Json = nlohmann::json;

// Typed reads of one JSON object with errors that name the file and the key. A key whose value
// is null counts as absent, as in Hugging Face's configs (q_lora_rank: null).
class ConfigReader {
 public:
  ConfigReader(const Json& json, const std::string& path, std::string what)
      : json_(json), path_(path), what_(std::move(what)) {}

  const std::string& path() const { return path_; }
  const Json* find(const std::string& key) const {
    auto it = json_.find(key);
    return it == json_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const std::string& key) const { return find(key) != nullptr; }

  std::optional<int64_t> int_opt(const std::string& key) const {
    const Json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (v->is_number_integer()) return v->get<int64_t>();
    // Some configs write integral values as floats (4096.0).
    if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() && std::abs(v->get<double>()) < 9e15) {
      return static_cast<int64_t>(v->get<double>());
    }
    bad(key, *v, "an integer");
  }
  int64_t positive(const std::string& key) const {
    const std::optional<int64_t> v = int_opt(key);
    if (!v) fail(ErrorCode::kInvalidArgument, "'{}': '{}' is missing ({} needs it)", path_, key, what_);
    if (*v <= 0 || *v > INT32_MAX) bad(key, json_[key], "a positive integer below 2^31");
    return *v;
  }
  int64_t positive_or(const std::string& key, int64_t fallback) const { return has(key) ? positive(key) : fallback; }
  int64_t non_negative_or(const std::string& key, int64_t fallback) const {
    const int64_t v = int_opt(key).value_or(fallback);
    if (v < 0 || v > INT32_MAX) bad(key, json_[key], "an integer >= 0 and below 2^31");
    return v;
  }
  double number_or(const std::string& key, double fallback) const {
    const Json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_number()) bad(key, *v, "a number");
    return v->get<double>();
  }
  bool bool_or(const std::string& key, bool fallback) const {
    const Json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) bad(key, *v, "true or false");
    return v->get<bool>();
  }
  std::string string_or(const std::string& key, std::string fallback) const {
    const Json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) bad(key, *v, "a string");
    return v->get<std::string>();
  }

  [[noreturn]] void bad(const std::string& key, const Json& v, std::string_view expected) const {
    fail(ErrorCode::kInvalidArgument, "'{}': '{}' is {}, expected {}", path_, key, json_excerpt(v), expected);
  }
  [[noreturn]] void unsupported(const std::string& key, const Json& v, std::string_view why) const {
    fail(ErrorCode::kUnsupported, "'{}': '{}' is {}: {}", path_, key, json_excerpt(v), why);
  }

 private:
  const Json& json_;
  const std::string& path_;
  std::string what_;
};

struct Architecture {
  const char* hf_name;
  const char* gguf_name;
};

constexpr Architecture kArchitectures[] = {
    {"LlamaForCausalLM", "llama"},
    {"Qwen2ForCausalLM", "qwen2"},
    {"Qwen3ForCausalLM", "qwen3"},
    {"DeepseekV2ForCausalLM", "deepseek2"},
    {"DeepseekV3ForCausalLM", "deepseek2"},
    {"DeepseekV32ForCausalLM", "deepseek32"},
};

GgufValue u32(int64_t v) { return GgufValue::u32(static_cast<uint32_t>(v)); }  // ConfigReader's counts: below 2^31
GgufValue f32(double v) { return GgufValue::f32(static_cast<float>(v)); }

// general.file_type of llama.cpp for torch_dtype (absent for another or no dtype).
std::optional<uint32_t> file_type_of(const std::string& torch_dtype) {
  if (torch_dtype == "float32") return 0;
  if (torch_dtype == "float16") return 1;
  if (torch_dtype == "bfloat16") return 32;
  return std::nullopt;
}

// rope_scaling's type ("type" in older configs, "rope_type" in newer ones); "" when absent.
std::string rope_scaling_type(const ConfigReader& c) {
  const Json* rs = c.find("rope_scaling");
  if (rs == nullptr) return "";
  if (!rs->is_object()) c.bad("rope_scaling", *rs, "an object or null");
  const ConfigReader r(*rs, c.path(), "rope_scaling");
  const std::string type = r.has("rope_type") ? r.string_or("rope_type", "") : r.string_or("type", "");
  if (type.empty()) c.bad("rope_scaling", *rs, "an object with \"type\" or \"rope_type\"");
  return type == "default" ? "" : type;
}

// What llama, qwen2 and qwen3 share: sizes, heads, norms, rope (none, linear or YaRN scaling; llama3's
// for llama).
void add_llama_like(const ConfigReader& c, const std::string& arch, HfModelConfig& out) {
  GgufMetadata& m = out.metadata;
  const std::string a = arch + ".";
  const int64_t hidden = c.positive("hidden_size");
  const int64_t heads = c.positive("num_attention_heads");
  const int64_t kv_heads = c.positive_or("num_key_value_heads", heads);
  const int64_t head_dim = c.positive_or("head_dim", hidden / heads);
  if (!c.has("head_dim") && hidden % heads != 0) {
    fail(ErrorCode::kInvalidArgument, "'{}': hidden_size {} does not split into num_attention_heads {}", c.path(),
         hidden, heads);
  }
  const std::string act = c.string_or("hidden_act", "silu");
  if (act != "silu") c.unsupported("hidden_act", Json(act), "duet's llama-like decoder uses SiLU (SwiGLU)");
  if (c.bool_or("mlp_bias", false)) c.unsupported("mlp_bias", Json(true), "duet's llama-like decoder has no MLP biases");
  if (arch != "qwen2" && c.bool_or("attention_bias", false)) {
    c.unsupported("attention_bias", Json(true), fmt::format("duet's {} has no q/k/v/o biases", arch));
  }
  m.emplace_back(a + "context_length", u32(c.positive("max_position_embeddings")));
  m.emplace_back(a + "embedding_length", u32(hidden));
  m.emplace_back(a + "block_count", u32(out.num_layers));
  m.emplace_back(a + "feed_forward_length", u32(c.positive("intermediate_size")));
  m.emplace_back(a + "attention.head_count", u32(heads));
  m.emplace_back(a + "attention.head_count_kv", u32(kv_heads));
  if (head_dim != hidden / heads) {
    m.emplace_back(a + "attention.key_length", u32(head_dim));
    m.emplace_back(a + "attention.value_length", u32(head_dim));
  }
  m.emplace_back(a + "attention.layer_norm_rms_epsilon", f32(c.number_or("rms_norm_eps", 1e-6)));
  m.emplace_back(a + "rope.freq_base", f32(c.number_or("rope_theta", 10000.0)));
  m.emplace_back(a + "rope.dimension_count", u32(head_dim));
  const std::string scaling = rope_scaling_type(c);
  if (scaling == "linear") {
    const ConfigReader r(*c.find("rope_scaling"), c.path(), "rope_scaling");
    const double factor = r.number_or("factor", 0.0);
    if (!(factor > 0.0)) c.bad("rope_scaling", *c.find("rope_scaling"), "a positive \"factor\"");
    m.emplace_back(a + "rope.scaling.type", GgufValue::str("linear"));
    m.emplace_back(a + "rope.scaling.factor", f32(factor));
  } else if (scaling == "yarn") {
    const Json& rs = *c.find("rope_scaling");
    const ConfigReader r(rs, c.path(), "rope_scaling");
    const double factor = r.number_or("factor", 0.0);
    if (!(factor >= 1.0)) c.bad("rope_scaling", rs, "a YaRN \"factor\" >= 1");
    // The rotary's magnitude factor: Hugging Face's attention_factor replaces YaRN's own
    // 0.1 ln(factor) + 1; attn_factor (vLLM's, and DeepSeek-R1-0528-Qwen3-8B's config) multiplies
    // it. GGUF's yarn_attn_factor multiplies it (llama.cpp's rope), so it is the product over that.
    const double own = factor > 1.0 ? 1.0 + 0.1 * std::log(factor) : 1.0;
    const double magnitude = r.number_or("attention_factor", own) * r.number_or("attn_factor", 1.0);
    if (!(magnitude > 0.0)) c.bad("rope_scaling", rs, "a positive attention_factor and attn_factor");
    if (r.number_or("extrapolation_factor", 1.0) != 1.0) {
      c.unsupported("rope_scaling", rs, "YaRN with an extrapolation_factor other than 1 is not implemented");
    }
    if (r.has("mscale") || r.has("mscale_all_dim")) {
      c.unsupported("rope_scaling", rs, fmt::format("YaRN's mscale and mscale_all_dim are DeepSeek-V2/V3's; not read for {}", arch));
    }
    m.emplace_back(a + "rope.scaling.type", GgufValue::str("yarn"));
    m.emplace_back(a + "rope.scaling.factor", f32(factor));
    m.emplace_back(a + "rope.scaling.original_context_length", u32(r.positive("original_max_position_embeddings")));
    if (r.has("beta_fast")) m.emplace_back(a + "rope.scaling.yarn_beta_fast", f32(r.number_or("beta_fast", 32.0)));
    if (r.has("beta_slow")) m.emplace_back(a + "rope.scaling.yarn_beta_slow", f32(r.number_or("beta_slow", 1.0)));
    if (magnitude != own) m.emplace_back(a + "rope.scaling.yarn_attn_factor", f32(magnitude / own));
  } else if (scaling == "llama3" && arch == "llama") {
    const ConfigReader r(*c.find("rope_scaling"), c.path(), "rope_scaling");
    const double factor = r.number_or("factor", 8.0);
    const double low = r.number_or("low_freq_factor", 1.0);
    const double high = r.number_or("high_freq_factor", 4.0);
    const double orig = r.number_or("original_max_position_embeddings", 8192.0);
    if (!(factor > 0.0) || !(high > low) || !(orig > 0.0)) {
      c.bad("rope_scaling", *c.find("rope_scaling"), "llama3 scaling with factor > 0, high_freq_factor > low_freq_factor");
    }
    out.rope_freq_factors =
        llama3_rope_freq_factors(c.number_or("rope_theta", 10000.0), head_dim, factor, low, high, orig);
  } else if (!scaling.empty()) {
    c.unsupported("rope_scaling", *c.find("rope_scaling"),
                  fmt::format("rope scaling '{}' is not implemented for {} (supported: linear, yarn{})", scaling,
                              arch, arch == "llama" ? ", llama3" : ""));
  }
}

void add_qwen2_window(const ConfigReader& c, GgufMetadata& m) {
  // Hugging Face's defaults: use_sliding_window false, so a window in the config is only
  // honoured when asked for (R1-Distill-Qwen has 4096 but false).
  if (!c.has("sliding_window")) return;
  m.emplace_back("qwen2.attention.sliding_window", u32(c.positive("sliding_window")));
  m.emplace_back("qwen2.attention.use_sliding_window", GgufValue::boolean(c.bool_or("use_sliding_window", false)));
  if (c.has("max_window_layers")) {
    m.emplace_back("qwen2.attention.max_window_layers", u32(c.non_negative_or("max_window_layers", 0)));
  }
}

void add_deepseek2(const ConfigReader& c, HfModelConfig& out) {
  GgufMetadata& m = out.metadata;
  const std::string a = out.architecture + ".";  // deepseek2, or deepseek32 (V3.2: V3 with an indexer)
  const int64_t heads = c.positive("num_attention_heads");
  const std::string act = c.string_or("hidden_act", "silu");
  if (act != "silu") c.unsupported("hidden_act", Json(act), "duet's deepseek2 uses SiLU (SwiGLU)");
  if (c.bool_or("attention_bias", false)) c.unsupported("attention_bias", Json(true), "duet's deepseek2 has no attention biases");
  m.emplace_back(a + "context_length", u32(c.positive("max_position_embeddings")));
  m.emplace_back(a + "embedding_length", u32(c.positive("hidden_size")));
  m.emplace_back(a + "block_count", u32(out.num_layers));
  m.emplace_back(a + "feed_forward_length", u32(c.positive("intermediate_size")));
  m.emplace_back(a + "attention.head_count", u32(heads));
  m.emplace_back(a + "attention.head_count_kv", u32(c.positive_or("num_key_value_heads", heads)));
  m.emplace_back(a + "attention.layer_norm_rms_epsilon", f32(c.number_or("rms_norm_eps", 1e-6)));
  if (c.has("q_lora_rank")) m.emplace_back(a + "attention.q_lora_rank", u32(c.positive("q_lora_rank")));
  m.emplace_back(a + "attention.kv_lora_rank", u32(c.positive("kv_lora_rank")));
  const int64_t rope = c.positive("qk_rope_head_dim");
  m.emplace_back(a + "attention.key_length", u32(c.positive("qk_nope_head_dim") + rope));
  m.emplace_back(a + "attention.value_length", u32(c.positive("v_head_dim")));
  m.emplace_back(a + "rope.dimension_count", u32(rope));
  m.emplace_back(a + "rope.freq_base", f32(c.number_or("rope_theta", 10000.0)));
  if (out.architecture == "deepseek32") {
    // DeepSeek-V3.2's lightning indexer (its config's defaults: Hugging Face's DeepseekV32Config).
    if (!c.has("q_lora_rank")) {
      c.bad("q_lora_rank", Json(nullptr), "a q_lora_rank (the indexer reads the low-rank query)");
    }
    m.emplace_back(a + "attention.indexer.head_count", u32(c.positive_or("index_n_heads", 64)));
    m.emplace_back(a + "attention.indexer.key_length", u32(c.positive_or("index_head_dim", 128)));
    m.emplace_back(a + "attention.indexer.top_k", u32(c.positive_or("index_topk", 2048)));
  }

  const std::string scaling = rope_scaling_type(c);
  if (scaling == "yarn") {
    const Json& rs = *c.find("rope_scaling");
    const ConfigReader r(rs, c.path(), "rope_scaling");
    const double factor = r.number_or("factor", 1.0);
    if (!(factor >= 1.0)) c.bad("rope_scaling", rs, "a YaRN \"factor\" >= 1");
    // duet's YaRN follows llama.cpp: correction range from beta_fast 32 / beta_slow 1, and the
    // softmax scale from mscale_all_dim, which needs the rotary's own factor
    // yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim) to be 1.
    if (r.number_or("beta_fast", 32.0) != 32.0 || r.number_or("beta_slow", 1.0) != 1.0) {
      c.unsupported("rope_scaling", rs, "YaRN with beta_fast other than 32 or beta_slow other than 1 is not implemented");
    }
    const double mscale = r.number_or("mscale", 1.0);
    const double mscale_all_dim = r.number_or("mscale_all_dim", 0.0);
    if (factor > 1.0 && mscale != mscale_all_dim) {
      c.unsupported("rope_scaling", rs, "YaRN with mscale != mscale_all_dim is not implemented (every DeepSeek release has them equal)");
    }
    m.emplace_back(a + "rope.scaling.type", GgufValue::str("yarn"));
    m.emplace_back(a + "rope.scaling.factor", f32(factor));
    m.emplace_back(a + "rope.scaling.original_context_length", u32(r.positive("original_max_position_embeddings")));
    m.emplace_back(a + "rope.scaling.yarn_log_multiplier", f32(0.1 * mscale_all_dim));
  } else if (!scaling.empty()) {
    c.unsupported("rope_scaling", *c.find("rope_scaling"),
                  fmt::format("rope scaling '{}' is not implemented for deepseek2 (supported: yarn)", scaling));
  }

  out.num_experts = c.non_negative_or("n_routed_experts", 0);
  if (out.num_experts == 0) {
    // A dense model: every layer is a dense one.
    m.emplace_back(a + "leading_dense_block_count", u32(out.num_layers));
    return;
  }
  if (c.non_negative_or("moe_layer_freq", 1) != 1) {
    c.unsupported("moe_layer_freq", *c.find("moe_layer_freq"), "only every layer after first_k_dense_replace being MoE (1) is implemented");
  }
  m.emplace_back(a + "leading_dense_block_count", u32(c.non_negative_or("first_k_dense_replace", 0)));
  m.emplace_back(a + "expert_feed_forward_length", u32(c.positive("moe_intermediate_size")));
  m.emplace_back(a + "expert_count", u32(out.num_experts));
  m.emplace_back(a + "expert_shared_count", u32(c.non_negative_or("n_shared_experts", 0)));
  m.emplace_back(a + "expert_used_count", u32(c.positive("num_experts_per_tok")));
  m.emplace_back(a + "expert_weights_scale", f32(c.number_or("routed_scaling_factor", 1.0)));
  m.emplace_back(a + "expert_weights_norm", GgufValue::boolean(c.bool_or("norm_topk_prob", false)));
  const std::string scoring = c.string_or("scoring_func", "softmax");
  const std::string topk = c.string_or("topk_method", scoring == "sigmoid" ? "noaux_tc" : "greedy");
  // duet routes the way each release does: softmax scores with greedy or group-limited top-k
  // (a group scored by its best expert), or sigmoid scores with the correction bias and groups
  // scored by their best two (noaux_tc).
  uint32_t gating = 0;
  if (scoring == "softmax" && (topk == "greedy" || topk == "group_limited_greedy")) gating = 1;
  if (scoring == "sigmoid" && topk == "noaux_tc") gating = 2;
  if (gating == 0) {
    fail(ErrorCode::kUnsupported,
         "'{}': scoring_func '{}' with topk_method '{}' is not implemented (supported: softmax with greedy or "
         "group_limited_greedy, sigmoid with noaux_tc)",
         c.path(), scoring, topk);
  }
  m.emplace_back(a + "expert_gating_func", GgufValue::u32(gating));
  const bool grouped = topk != "greedy";
  m.emplace_back(a + "expert_group_count", u32(grouped ? c.positive_or("n_group", 1) : 1));
  m.emplace_back(a + "expert_group_used_count", u32(grouped ? c.positive_or("topk_group", 1) : 1));
}

}  // namespace

Json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) fail(ErrorCode::kNotFound, "'{}' does not exist", path);
    fail(ErrorCode::kUnavailable, "cannot read '{}'", path);
  }
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    std::string what = e.what();
    if (const size_t at = what.find("syntax error"); at != std::string::npos) what = what.substr(at);
    fail(ErrorCode::kDataLoss, "'{}': at offset {}: the JSON does not parse: {}", path, e.byte > 0 ? e.byte - 1 : 0,
         what);
  } catch (const Json::exception& e) {  // a number beyond double's range (out_of_range 406)
    fail(ErrorCode::kDataLoss, "'{}': the JSON does not parse: {}", path, e.what());
  }
}

std::vector<float> llama3_rope_freq_factors(double theta, int64_t head_dim, double factor, double low_freq_factor,
                                            double high_freq_factor, double original_context) {
  const double pi = 3.14159265358979323846;
  std::vector<float> out;
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const double freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    const double wavelen = 2.0 * pi / freq;
    double divisor = 1.0;
    if (wavelen > original_context / low_freq_factor) {
      divisor = factor;
    } else if (wavelen >= original_context / high_freq_factor) {
      const double smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      divisor = 1.0 / ((1.0 - smooth) / factor + smooth);
    }
    out.push_back(static_cast<float>(divisor));
  }
  return out;
}

std::vector<std::string> supported_hf_architectures() {
  std::vector<std::string> names;
  for (const Architecture& a : kArchitectures) names.emplace_back(a.hf_name);
  return names;
}

HfModelConfig read_hf_config(const std::string& config_path, const std::string& name) {
  const Json json = read_json_file(config_path);
  if (!json.is_object()) {
    fail(ErrorCode::kInvalidArgument, "'{}' is a JSON {}, expected an object", config_path, json.type_name());
  }
  HfModelConfig out;
  const ConfigReader top(json, config_path, "the model");
  const Json* archs = top.find("architectures");
  if (archs == nullptr || !archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
    fail(ErrorCode::kInvalidArgument, "'{}': 'architectures' is missing or not a list of names (expected e.g. "
         "[\"LlamaForCausalLM\"])", config_path);
  }
  out.hf_architecture = (*archs)[0].get<std::string>();
  for (const Architecture& a : kArchitectures) {
    if (out.hf_architecture == a.hf_name) out.architecture = a.gguf_name;
  }
  if (out.architecture.empty()) {
    fail(ErrorCode::kUnsupported, "'{}': architecture '{}' is not supported (supported: {})", config_path,
         out.hf_architecture, fmt::join(supported_hf_architectures(), ", "));
  }
  const ConfigReader c(json, config_path, out.hf_architecture);
  out.num_layers = c.positive("num_hidden_layers");
  out.tied_embeddings = c.bool_or("tie_word_embeddings", false);
  GgufMetadata& m = out.metadata;
  m.emplace_back("general.architecture", GgufValue::str(out.architecture));
  if (!name.empty()) m.emplace_back("general.name", GgufValue::str(name));
  if (const Json* q = c.find("quantization_config")) {
    if (!q->is_object()) c.bad("quantization_config", *q, "an object");
    const ConfigReader qc(*q, config_path, "quantization_config");
    const std::string method = qc.string_or("quant_method", "");
    if (method == "fp8") {
      const Json* block = qc.find("weight_block_size");
      if (block == nullptr || !block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() ||
          (*block)[0] != (*block)[1] || (*block)[0].get<int64_t>() <= 0) {
        c.unsupported("quantization_config", *q, "FP8 weights need a square weight_block_size such as [128, 128]");
      }
      if (qc.string_or("fmt", "e4m3") != "e4m3") c.unsupported("quantization_config", *q, "FP8 in a format other than e4m3");
      out.fp8_block = (*block)[0].get<int64_t>();
    } else if (method == "awq") {
      if (qc.positive_or("bits", 4) != 4 || !qc.bool_or("zero_point", true) ||
          qc.string_or("version", "gemm") != "gemm") {
        c.unsupported("quantization_config", *q, "AWQ other than 4-bit GEMM layout with zero points");
      }
      out.awq_group = qc.positive_or("group_size", 128);
      if (out.awq_group % 32 != 0) c.unsupported("quantization_config", *q, "an AWQ group_size that is not a multiple of 32");
    } else {
      c.unsupported("quantization_config", *q,
                    fmt::format("quant_method '{}' is not read (supported: fp8 blocks, awq)", method));
    }
  }
  // torch_dtype, called dtype by newer transformers.
  if (const std::optional<uint32_t> ft = file_type_of(c.string_or("torch_dtype", c.string_or("dtype", "")))) {
    m.emplace_back("general.file_type", GgufValue::u32(*ft));
  }
  if (out.architecture == "deepseek2" || out.architecture == "deepseek32") {
    add_deepseek2(c, out);
    out.num_mtp_layers = c.non_negative_or("num_nextn_predict_layers", 0);
  } else {
    add_llama_like(c, out.architecture, out);
    if (out.architecture == "qwen2") add_qwen2_window(c, m);
  }
  m.emplace_back(out.architecture + ".vocab_size", u32(c.positive("vocab_size")));
  return out;
}

void add_hf_generation_config(const std::string& path, GgufMetadata& metadata) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  const Json json = read_json_file(path);
  if (!json.is_object()) {
    fail(ErrorCode::kInvalidArgument, "'{}' is a JSON {}, expected an object", path, json.type_name());
  }
  const ConfigReader c(json, path, "generation_config.json");
  const std::string p = "duet.generation.";
  if (c.has("temperature")) metadata.emplace_back(p + "temperature", f32(c.number_or("temperature", 1.0)));
  if (c.has("top_p")) metadata.emplace_back(p + "top_p", f32(c.number_or("top_p", 1.0)));
  if (const std::optional<int64_t> top_k = c.int_opt("top_k")) {  // past 2^31 as 2^31 - 1: more than any vocabulary
    if (*top_k < 0) c.bad("top_k", *c.find("top_k"), "an integer >= 0");
    metadata.emplace_back(p + "top_k", GgufValue::i32(static_cast<int32_t>(std::min<int64_t>(*top_k, INT32_MAX))));
  }
  if (c.has("repetition_penalty")) {
    metadata.emplace_back(p + "repetition_penalty", f32(c.number_or("repetition_penalty", 1.0)));
  }
  if (c.has("do_sample")) metadata.emplace_back(p + "do_sample", GgufValue::boolean(c.bool_or("do_sample", false)));
  if (c.has("bos_token_id")) {
    metadata.emplace_back(p + "bos_token_id", GgufValue::i32(static_cast<int32_t>(c.non_negative_or("bos_token_id", 0))));
  }
  if (const Json* eos = c.find("eos_token_id")) {
    std::vector<int32_t> ids;
    const Json list = eos->is_array() ? *eos : Json::array({*eos});
    for (const Json& id : list) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        c.bad("eos_token_id", *eos, "a token id or a list of them");
      }
      ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    metadata.emplace_back(p + "eos_token_ids", GgufValue::i32_array(ids));
  }
}

}  // namespace duet
