#include "duet/formats/hf_writer.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "duet/core/convert.h"
#include "duet/core/error.h"
#include "duet/core/quant.h"
#include "duet/formats/safetensors_writer.h"

namespace duet {
namespace {

using Json = nlohmann::ordered_json;

// GGUF names inside a layer -> Hugging Face names (the inverse of hf_folder's table).
const std::map<std::string, std::string> kLayerNames = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"attn_q_a.weight", "self_attn.q_a_proj.weight"},
    {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"},
    {"attn_q_b.weight", "self_attn.q_b_proj.weight"},
    {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight"},
    {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"},
    {"attn_kv_b.weight", "self_attn.kv_b_proj.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"ffn_gate_inp.weight", "mlp.gate.weight"},
    {"exp_probs_b.bias", "mlp.gate.e_score_correction_bias"},
    {"ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"},
    {"ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"},
    {"ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"},
    {"indexer.attn_q_b.weight", "self_attn.indexer.wq_b.weight"},
    {"indexer.attn_k.weight", "self_attn.indexer.wk.weight"},
    {"indexer.k_norm.weight", "self_attn.indexer.k_norm.weight"},
    {"indexer.k_norm.bias", "self_attn.indexer.k_norm.bias"},
    {"indexer.proj.weight", "self_attn.indexer.weights_proj.weight"},
};
// DeepSeek-V3's multi-token-prediction layer (llama.cpp's nextn names; its decoder block has the
// names above, at a layer index after the last one).
const std::map<std::string, std::string> kNextnNames = {
    {"nextn.enorm.weight", "enorm.weight"},
    {"nextn.hnorm.weight", "hnorm.weight"},
    {"nextn.eh_proj.weight", "eh_proj.weight"},
    {"nextn.shared_head_norm.weight", "shared_head.norm.weight"},
    {"nextn.shared_head_head.weight", "shared_head.head.weight"},
    {"nextn.embed_tokens.weight", "embed_tokens.weight"},
};
const std::map<std::string, std::string> kExpertNames = {
    {"ffn_gate_exps.weight", "gate_proj.weight"},
    {"ffn_up_exps.weight", "up_proj.weight"},
    {"ffn_down_exps.weight", "down_proj.weight"},
};
const std::map<std::string, std::string> kTopNames = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

// A float32 key as the double that reads back as the same float32.
double f32_key(const GgufFile& g, const std::string& key, double fallback) { return g.get_float_or(key, fallback); }

Json config_json(const GgufFile& g, const HfWriteOptions& o) {
  const std::string arch = g.get_string("general.architecture");
  const std::string a = arch + ".";
  const int64_t heads = g.get_int(a + "attention.head_count");
  const GgufTensorInfo* embd = g.find_tensor("token_embd.weight");
  const char* torch_dtype = o.quant == HfQuant::kAwq         ? "float16"
                            : o.quant == HfQuant::kFp8       ? "bfloat16"
                            : o.type == DType::kF32          ? "float32"
                            : o.type == DType::kF16          ? "float16"
                                                             : "bfloat16";
  Json c = Json::object();
  c["architectures"] = Json::array();
  c["hidden_size"] = g.get_int(a + "embedding_length");
  c["intermediate_size"] = g.get_int(a + "feed_forward_length");
  c["num_hidden_layers"] = g.get_int(a + "block_count");
  c["num_attention_heads"] = heads;
  const bool mla = arch == "deepseek2" || arch == "deepseek32";
  c["num_key_value_heads"] = mla ? heads : g.get_int_or(a + "attention.head_count_kv", heads);
  c["max_position_embeddings"] = g.get_int(a + "context_length");
  c["rms_norm_eps"] = f32_key(g, a + "attention.layer_norm_rms_epsilon", 1e-6);
  c["rope_theta"] = f32_key(g, a + "rope.freq_base", 10000.0);
  c["vocab_size"] = g.get_int_or(a + "vocab_size", embd != nullptr && embd->shape.size() == 2 ? embd->shape[1] : 0);
  c["hidden_act"] = "silu";
  c["tie_word_embeddings"] = g.find_tensor("output.weight") == nullptr;
  c["torch_dtype"] = torch_dtype;
  if (g.has("tokenizer.ggml.bos_token_id")) c["bos_token_id"] = g.get_int("tokenizer.ggml.bos_token_id");
  if (g.has("tokenizer.ggml.eos_token_id")) c["eos_token_id"] = g.get_int("tokenizer.ggml.eos_token_id");
  const std::string scaling = g.get_string_or(a + "rope.scaling.type", "none");
  if (arch == "llama" || arch == "qwen2" || arch == "qwen3") {
    c["architectures"].push_back(arch == "llama" ? "LlamaForCausalLM" : arch == "qwen2" ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM");
    c["model_type"] = arch;
    if (g.has(a + "attention.key_length")) c["head_dim"] = g.get_int(a + "attention.key_length");
    if (arch == "qwen3") c["attention_bias"] = false;
    if (scaling == "linear") {
      c["rope_scaling"] = {{"type", "linear"}, {"factor", f32_key(g, a + "rope.scaling.factor", 1.0)}};
    } else if (scaling == "yarn") {
      // attn_factor as vLLM reads it (and duet): multiplying YaRN's own magnitude factor, as
      // GGUF's yarn_attn_factor does.
      Json rs = {{"rope_type", "yarn"},
                 {"factor", f32_key(g, a + "rope.scaling.factor", 1.0)},
                 {"original_max_position_embeddings", g.get_int(a + "rope.scaling.original_context_length")}};
      for (const auto& [key, name] : {std::pair{"yarn_beta_fast", "beta_fast"}, std::pair{"yarn_beta_slow", "beta_slow"},
                                      std::pair{"yarn_attn_factor", "attn_factor"}}) {
        if (g.has(a + "rope.scaling." + key)) rs[name] = f32_key(g, a + "rope.scaling." + key, 1.0);
      }
      c["rope_scaling"] = rs;
    } else if (scaling == "none") {
      c["rope_scaling"] = nullptr;
    } else {
      fail(ErrorCode::kUnsupported, "'{}': {}rope.scaling.type '{}' has no Hugging Face form here (linear, yarn or none)",
           g.path(), a, scaling);
    }
    if (g.find_tensor("rope_freqs.weight") != nullptr) {
      fail(ErrorCode::kUnsupported, "'{}': rope_freqs.weight (Llama 3 rope scaling) is not written back", g.path());
    }
    if (arch == "qwen2") {
      const int64_t window = g.get_int_or(a + "attention.sliding_window", 0);
      c["use_sliding_window"] = window > 0;
      c["sliding_window"] = window > 0 ? window : 4096;
      c["max_window_layers"] = g.get_int_or(a + "attention.max_window_layers", 0);
    }
    return c;
  }
  if (!mla) {
    fail(ErrorCode::kUnsupported,
         "'{}': architecture '{}' has no Hugging Face form here (llama, qwen2, qwen3, deepseek2, deepseek32)", g.path(),
         arch);
  }
  const bool v3 = g.get_int_or(a + "expert_gating_func", 1) == 2;
  const int64_t rope = g.get_int(a + "rope.dimension_count");
  const bool mla_keys = g.has(a + "attention.key_length_mla");
  const int64_t key_length = g.get_int(a + (mla_keys ? "attention.key_length_mla" : "attention.key_length"));
  const int64_t groups = g.get_int_or(a + "expert_group_count", 1);
  if (arch == "deepseek32") {
    c["architectures"].push_back("DeepseekV32ForCausalLM");
    c["model_type"] = "deepseek_v32";
    c["index_n_heads"] = g.get_int(a + "attention.indexer.head_count");
    c["index_head_dim"] = g.get_int(a + "attention.indexer.key_length");
    c["index_topk"] = g.get_int(a + "attention.indexer.top_k");
  } else {
    c["architectures"].push_back(v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM");
    c["model_type"] = v3 ? "deepseek_v3" : "deepseek_v2";
  }
  c["q_lora_rank"] = g.has(a + "attention.q_lora_rank") ? Json(g.get_int(a + "attention.q_lora_rank")) : Json(nullptr);
  c["kv_lora_rank"] = g.get_int(a + "attention.kv_lora_rank");
  c["qk_nope_head_dim"] = key_length - rope;
  c["qk_rope_head_dim"] = rope;
  c["v_head_dim"] = g.get_int(a + (mla_keys ? "attention.value_length_mla" : "attention.value_length"));
  c["first_k_dense_replace"] = g.get_int_or(a + "leading_dense_block_count", 0);
  c["moe_layer_freq"] = 1;
  const bool moe = g.has(a + "expert_count");
  c["n_routed_experts"] = moe ? Json(g.get_int(a + "expert_count")) : Json(nullptr);
  c["n_shared_experts"] = g.get_int_or(a + "expert_shared_count", 0);
  c["num_experts_per_tok"] = moe ? Json(g.get_int(a + "expert_used_count")) : Json(nullptr);
  c["moe_intermediate_size"] = moe ? Json(g.get_int(a + "expert_feed_forward_length")) : Json(nullptr);
  c["routed_scaling_factor"] = f32_key(g, a + "expert_weights_scale", 1.0);
  c["norm_topk_prob"] = g.get_bool_or(a + "expert_weights_norm", false);
  c["scoring_func"] = v3 ? "sigmoid" : "softmax";
  c["topk_method"] = v3 ? "noaux_tc" : (groups > 1 ? "group_limited_greedy" : "greedy");
  c["n_group"] = groups;
  c["topk_group"] = g.get_int_or(a + "expert_group_used_count", groups);
  c["attention_bias"] = false;
  c["num_nextn_predict_layers"] = g.get_int_or(a + "nextn_predict_layers", 0);
  if (scaling == "yarn") {
    const double mscale = f32_key(g, a + "rope.scaling.yarn_log_multiplier", 0.0) / 0.1;
    c["rope_scaling"] = {{"type", "yarn"},
                         {"factor", f32_key(g, a + "rope.scaling.factor", 1.0)},
                         {"original_max_position_embeddings", g.get_int(a + "rope.scaling.original_context_length")},
                         {"beta_fast", 32},
                         {"beta_slow", 1},
                         {"mscale", mscale},
                         {"mscale_all_dim", mscale}};
  } else if (scaling == "none") {
    c["rope_scaling"] = nullptr;
  } else {
    fail(ErrorCode::kUnsupported, "'{}': {}rope.scaling.type '{}' has no Hugging Face form here (yarn or none)",
         g.path(), a, scaling);
  }
  return c;
}

SafetensorsDType st_type(DType t) {
  switch (t) {
    case DType::kF32: return SafetensorsDType::kF32;
    case DType::kF16: return SafetensorsDType::kF16;
    case DType::kBF16: return SafetensorsDType::kBF16;
    default:
      fail(ErrorCode::kInvalidArgument, "Hugging Face weights are written in f32, f16 or bf16, not {}",
           dtype_name(t));
  }
}

// One tensor of the folder: f32 rows [rows, cols] made on demand from the GGUF.
struct Source {
  int64_t rows = 0, cols = 0;
  std::function<void(float* dst)> make;  // rows * cols floats
  const GgufTensorInfo* raw = nullptr;   // when the bytes can be copied as they are (rows in order)
};

void write_json(const std::filesystem::path& path, const Json& j) {
  std::ofstream out(path, std::ios::trunc);
  out << j.dump(2) << '\n';
  if (!out) fail(ErrorCode::kUnavailable, "cannot write '{}'", path.string());
}

}  // namespace

std::vector<std::string> write_hf_model(const GgufFile& g, const std::string& dir, const HfWriteOptions& o) {
  const DType plain = o.quant == HfQuant::kFp8 ? DType::kBF16 : o.quant == HfQuant::kAwq ? DType::kF16 : o.type;
  (void)st_type(plain);
  Json config = config_json(g, o);
  const std::string arch = config["model_type"].get<std::string>();
  const int64_t heads = config["num_attention_heads"].get<int64_t>();
  const int64_t kv_heads = config["num_key_value_heads"].get<int64_t>();

  // f32 rows of a GGUF tensor (any type), rows [first, first + n) of its 2-D view.
  auto rows_of = [](const GgufTensorInfo* t, int64_t first, int64_t n, float* dst) {
    const int64_t cols = t->shape[0];
    const size_t rb = row_size(t->type, cols);
    for (int64_t r = 0; r < n; ++r) dequantize_row_ref(t->type, t->data + (first + r) * rb, dst + r * cols, cols);
  };
  std::vector<std::pair<std::string, Source>> out;
  auto plain_tensor = [&](const std::string& hf_name, const GgufTensorInfo* t) {
    Source s;
    s.cols = t->shape[0];
    s.rows = t->num_elements() / s.cols;
    s.raw = t;
    s.make = [t, s, rows_of](float* dst) { rows_of(t, 0, s.rows, dst); };
    out.emplace_back(hf_name, s);
  };
  std::vector<std::string> problems;
  for (const GgufTensorInfo& t : g.tensors()) {
    if (const auto it = kTopNames.find(t.name); it != kTopNames.end()) {
      plain_tensor(it->second, &t);
      continue;
    }
    const size_t dot1 = t.name.find('.'), dot2 = t.name.find('.', dot1 + 1);
    if (!t.name.starts_with("blk.") || dot2 == std::string::npos) {
      problems.push_back(t.name);
      continue;
    }
    const std::string layer = t.name.substr(dot1 + 1, dot2 - dot1 - 1), rest = t.name.substr(dot2 + 1);
    const std::string prefix = "model.layers." + layer + ".";
    if (const auto it = kExpertNames.find(rest); it != kExpertNames.end() && t.shape.size() == 3) {
      const int64_t cols = t.shape[0], rows = t.shape[1];
      for (int64_t e = 0; e < t.shape[2]; ++e) {
        Source s;
        s.rows = rows;
        s.cols = cols;
        s.make = [&t, rows, e, rows_of](float* dst) { rows_of(&t, e * rows, rows, dst); };
        out.emplace_back(prefix + "mlp.experts." + std::to_string(e) + "." + it->second, s);
      }
      continue;
    }
    if (rest == "attn_k_b.weight" || rest == "attn_v_b.weight") {
      // The split MLA layout: kv_b_proj is per head W_UK's nope rows (k_b [H, rank, nope]
      // transposed), then W_UV's v rows (v_b [H, v, rank]).
      if (rest == "attn_v_b.weight") continue;
      const GgufTensorInfo* kb = &t;
      const GgufTensorInfo* vb = g.find_tensor("blk." + layer + ".attn_v_b.weight");
      if (vb == nullptr || kb->shape.size() != 3 || vb->shape.size() != 3) {
        problems.push_back(t.name + " (without a 3-D attn_v_b beside it)");
        continue;
      }
      const int64_t nope = kb->shape[0], rank = kb->shape[1], H = kb->shape[2], vd = vb->shape[1];
      Source s;
      s.rows = H * (nope + vd);
      s.cols = rank;
      s.make = [kb, vb, nope, rank, H, vd, rows_of](float* dst) {
        std::vector<float> k(static_cast<size_t>(rank * nope));
        for (int64_t h = 0; h < H; ++h) {
          float* head = dst + h * (nope + vd) * rank;
          rows_of(kb, h * rank, rank, k.data());
          for (int64_t i = 0; i < nope; ++i) {
            for (int64_t r = 0; r < rank; ++r) head[i * rank + r] = k[static_cast<size_t>(r * nope + i)];
          }
          rows_of(vb, h * vd, vd, head + nope * rank);
        }
      };
      out.emplace_back(prefix + "self_attn.kv_b_proj.weight", s);
      continue;
    }
    if (const auto it = kNextnNames.find(rest); it != kNextnNames.end()) {
      plain_tensor(prefix + it->second, &t);
      continue;
    }
    const auto it = kLayerNames.find(rest);
    if (it == kLayerNames.end()) {
      problems.push_back(t.name);
      continue;
    }
    if (arch == "llama" && (rest == "attn_q.weight" || rest == "attn_k.weight")) {
      // GGUF row 2i + j of a head is Hugging Face's row j * (d / 2) + i.
      const int64_t n_head = rest == "attn_q.weight" ? heads : kv_heads;
      Source s;
      s.cols = t.shape[0];
      s.rows = t.shape[1];
      const int64_t half = s.rows / n_head / 2;
      s.make = [&t, s, n_head, half, rows_of](float* dst) {
        for (int64_t h = 0; h < n_head; ++h) {
          for (int64_t i = 0; i < half; ++i) {
            for (int64_t j = 0; j < 2; ++j) {
              rows_of(&t, h * 2 * half + 2 * i + j, 1, dst + (h * 2 * half + j * half + i) * s.cols);
            }
          }
        }
      };
      out.emplace_back(prefix + it->second, s);
      continue;
    }
    plain_tensor(prefix + it->second, &t);
  }
  if (!problems.empty()) {
    std::string list;
    for (const std::string& p : problems) list += (list.empty() ? "" : ", ") + p;
    fail(ErrorCode::kUnsupported, "'{}': tensors without a Hugging Face name here: {}", g.path(), list);
  }

  SafetensorsWriter w;
  for (auto& [name, src] : out) {
    const GgufTensorInfo* raw = src.raw;
    const bool vector = raw != nullptr && raw->shape.size() == 1;
    const bool kept_f32 = raw != nullptr && raw->type == DType::kF32 &&
                          (vector || name.ends_with("mlp.gate.weight"));  // norms, biases, the router
    // (Not the indexer's: its few heads' rows make no AWQ group; it stays in the float type.)
    const bool quantized = o.quant != HfQuant::kNone && name.starts_with("model.layers.") &&
                           name.ends_with("_proj.weight") && name.find(".indexer.") == std::string::npos;
    const std::vector<int64_t> shape =
        vector ? std::vector<int64_t>{src.cols} : std::vector<int64_t>{src.rows, src.cols};
    const int64_t rows = src.rows, cols = src.cols;
    auto make = src.make;
    if (quantized && o.quant == HfQuant::kFp8) {
      constexpr int64_t kBlock = 128;
      const int64_t br = (rows + kBlock - 1) / kBlock, bc = (cols + kBlock - 1) / kBlock;
      // Both tensors come from one quantization; each fill redoes it (the tensors are written apart).
      auto quantize = [make, rows, cols](std::vector<uint8_t>& q, std::vector<float>& scale) {
        std::vector<float> f(static_cast<size_t>(rows * cols));
        make(f.data());
        q.resize(f.size());
        scale.resize(static_cast<size_t>(((rows + kBlock - 1) / kBlock) * ((cols + kBlock - 1) / kBlock)));
        fp8_blocks_from_f32(f.data(), rows, cols, kBlock, q.data(), scale.data());
      };
      w.add_tensor(name, SafetensorsDType::kF8_E4M3, shape, [quantize](uint8_t* dst, size_t n) {
        std::vector<uint8_t> q;
        std::vector<float> s;
        quantize(q, s);
        std::memcpy(dst, q.data(), n);
      });
      w.add_tensor(name + "_scale_inv", SafetensorsDType::kF32, {br, bc}, [quantize](uint8_t* dst, size_t n) {
        std::vector<uint8_t> q;
        std::vector<float> s;
        quantize(q, s);
        std::memcpy(dst, s.data(), n);
      });
      continue;
    }
    if (quantized && o.quant == HfQuant::kAwq) {
      const int64_t in = cols, outs = rows, group = o.awq_group;
      if (outs % 8 != 0 || in % group != 0) {
        fail(ErrorCode::kInvalidArgument, "'{}' [{}, {}] cannot be AWQ int4 with group {}: the outputs must be a "
             "multiple of 8 and the inputs of the group", name, rows, cols, group);
      }
      struct Awq {
        std::vector<int32_t> qweight, qzeros;
        std::vector<uint16_t> scales;
      };
      auto quantize = [make, in, outs, group]() {
        std::vector<float> f(static_cast<size_t>(in * outs));
        make(f.data());
        Awq a{std::vector<int32_t>(static_cast<size_t>(in * outs / 8)),
              std::vector<int32_t>(static_cast<size_t>(in / group * outs / 8)),
              std::vector<uint16_t>(static_cast<size_t>(in / group * outs))};
        awq_from_f32(f.data(), in, outs, group, a.qweight.data(), a.qzeros.data(), a.scales.data());
        return a;
      };
      const std::string base = name.substr(0, name.size() - std::strlen(".weight"));
      w.add_tensor(base + ".qweight", SafetensorsDType::kI32, {in, outs / 8},
                   [quantize](uint8_t* dst, size_t n) { std::memcpy(dst, quantize().qweight.data(), n); });
      w.add_tensor(base + ".qzeros", SafetensorsDType::kI32, {in / group, outs / 8},
                   [quantize](uint8_t* dst, size_t n) { std::memcpy(dst, quantize().qzeros.data(), n); });
      w.add_tensor(base + ".scales", SafetensorsDType::kF16, {in / group, outs},
                   [quantize](uint8_t* dst, size_t n) { std::memcpy(dst, quantize().scales.data(), n); });
      continue;
    }
    const DType type = kept_f32 ? DType::kF32 : plain;
    if (raw != nullptr && raw->type == type) {
      w.add_tensor(name, st_type(type), shape, [raw](uint8_t* dst, size_t n) { std::memcpy(dst, raw->data, n); });
      continue;
    }
    w.add_tensor(name, st_type(type), shape, [make, rows, cols, type](uint8_t* dst, size_t) {
      std::vector<float> f(static_cast<size_t>(rows * cols));
      make(f.data());
      const size_t rb = row_size(type, cols);
      for (int64_t r = 0; r < rows; ++r) quantize_row_ref(type, f.data() + r * cols, dst + r * rb, cols);
    });
  }

  if (o.quant == HfQuant::kFp8) {
    config["quantization_config"] = {{"activation_scheme", "dynamic"},
                                     {"fmt", "e4m3"},
                                     {"quant_method", "fp8"},
                                     {"weight_block_size", {128, 128}}};
  } else if (o.quant == HfQuant::kAwq) {
    config["quantization_config"] = {{"bits", 4},
                                     {"group_size", o.awq_group},
                                     {"modules_to_not_convert", nullptr},
                                     {"quant_method", "awq"},
                                     {"version", "gemm"},
                                     {"zero_point", true}};
  }
  const std::filesystem::path base(dir);
  std::filesystem::create_directories(base);
  write_json(base / "config.json", config);
  Json gen = Json::object();
  gen["_from_model_config"] = true;
  if (config.contains("bos_token_id")) gen["bos_token_id"] = config["bos_token_id"];
  if (config.contains("eos_token_id")) gen["eos_token_id"] = config["eos_token_id"];
  write_json(base / "generation_config.json", gen);
  std::vector<std::string> files = {"config.json", "generation_config.json"};
  for (std::string& f : w.write_model(dir, o.max_shard_bytes)) files.push_back(std::move(f));
  return files;
}

}  // namespace duet
