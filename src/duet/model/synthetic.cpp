#include "duet/model/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "duet/core/error.h"
#include "duet/core/quant.h"
#include "duet/core/random.h"
#include "duet/formats/hf_config.h"

namespace duet {
namespace {

uint32_t file_type_of(DType t) {
  switch (t) {
    case DType::kF32: return 0;
    case DType::kF16: return 1;
    case DType::kQ4_0: return 2;
    case DType::kQ8_0: return 7;
    case DType::kBF16: return 32;
    default:
      fail(ErrorCode::kInvalidArgument, "synthetic models are written in f32, f16, bf16, q8_0 or q4_0, not {}",
           dtype_name(t));
  }
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

uint64_t tensor_seed_of(uint64_t seed, const std::string& name) { return seed ^ fnv1a(name); }

// Row r of a tensor's random values: `cols` values uniform in center +- half_width from a
// generator of its own, so any row can be made alone and in any order.
void random_row(uint64_t tensor_seed, int64_t r, float center, float half_width, float* row, int64_t cols) {
  Rng rng(tensor_seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(r + 1));
  for (int64_t i = 0; i < cols; ++i) row[i] = center + half_width * static_cast<float>(2.0 * rng.uniform() - 1.0);
}

// `rows` rows of `cols` values uniform in center +- half_width, one generator per row.
GgufWriter::Fill random_fill(ThreadPool& pool, uint64_t seed, const std::string& name, DType type, int64_t rows,
                             int64_t cols, float center, float half_width) {
  const uint64_t tensor_seed = tensor_seed_of(seed, name);
  return [&pool, tensor_seed, type, rows, cols, center, half_width](uint8_t* dst, size_t nbytes) {
    const size_t rb = row_size(type, cols);
    if (rb * static_cast<size_t>(rows) != nbytes) fail(ErrorCode::kInternal, "synthetic tensor size mismatch");
    pool.parallel_for(rows, 64, [&](int64_t begin, int64_t end) {
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = begin; r < end; ++r) {
        random_row(tensor_seed, r, center, half_width, row.data(), cols);
        quantize_row_ref(type, row.data(), dst + static_cast<size_t>(r) * rb, cols);
      }
    });
  };
}

// The split MLA layout of a random kv_b [H * (nope + vd), rank] named `kv_b_name`: attn_k_b holds
// per head the nope rows transposed ([rank, nope] per head), attn_v_b the vd rows as they are.
GgufWriter::Fill split_kv_b_fill(ThreadPool& pool, uint64_t seed, const std::string& kv_b_name, DType type,
                                 int64_t heads, int64_t nope, int64_t vd, int64_t rank, bool k_half) {
  const uint64_t tensor_seed = tensor_seed_of(seed, kv_b_name);
  const float hw = std::sqrt(3.0f / static_cast<float>(rank));
  return [&pool, tensor_seed, type, heads, nope, vd, rank, hw, k_half](uint8_t* dst, size_t nbytes) {
    const int64_t rows = k_half ? rank : vd, cols = k_half ? nope : rank;
    const size_t rb = row_size(type, cols);
    if (rb * static_cast<size_t>(heads * rows) != nbytes) fail(ErrorCode::kInternal, "synthetic tensor size mismatch");
    pool.parallel_for(heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> kv(static_cast<size_t>(rank)), k(static_cast<size_t>(rank * nope));
      for (int64_t h = begin; h < end; ++h) {
        const int64_t first = h * (nope + vd);
        uint8_t* out = dst + static_cast<size_t>(h * rows) * rb;
        if (!k_half) {
          for (int64_t j = 0; j < vd; ++j) {
            random_row(tensor_seed, first + nope + j, 0.0f, hw, kv.data(), rank);
            quantize_row_ref(type, kv.data(), out + static_cast<size_t>(j) * rb, rank);
          }
          continue;
        }
        for (int64_t i = 0; i < nope; ++i) {
          random_row(tensor_seed, first + i, 0.0f, hw, kv.data(), rank);
          for (int64_t r = 0; r < rank; ++r) k[static_cast<size_t>(r * nope + i)] = kv[static_cast<size_t>(r)];
        }
        for (int64_t r = 0; r < rank; ++r) {
          quantize_row_ref(type, k.data() + r * nope, out + static_cast<size_t>(r) * rb, nope);
        }
      }
    });
  };
}

// DeepSeek-V2/V3 (llama.cpp's LLM_ARCH_DEEPSEEK2 layout): MLA attention (optionally a low-rank
// query), leading dense FFN layers, then mixture-of-experts layers with a softmax (V2) or sigmoid
// plus correction bias (V3) router, grouped routing and shared experts; with V3.2's indexer for
// deepseek32 (LLM_ARCH_DEEPSEEK32).
void add_deepseek2(GgufWriter& w, const SyntheticSpec& s, DType type, uint32_t file_type, uint64_t seed,
                   ThreadPool& pool) {
  const int64_t d = s.hidden_size, H = s.num_heads, nope = s.qk_nope_head_dim, rope = s.qk_rope_head_dim,
                vd = s.v_head_dim, E = s.num_experts, G = s.num_expert_groups;
  if (d <= 0 || s.num_layers <= 0 || s.intermediate_size <= 0 || s.num_vocab <= 0 || s.context_length <= 0 ||
      H <= 0 || s.kv_lora_rank <= 0 || nope <= 0 || vd <= 0 || s.q_lora_rank < 0) {
    fail(ErrorCode::kInvalidArgument, "synthetic deepseek2 sizes must be positive (q_lora_rank may be 0)");
  }
  if (s.num_kv_heads != H) {
    fail(ErrorCode::kInvalidArgument, "deepseek2 has as many kv heads as heads ({}), not {}", H, s.num_kv_heads);
  }
  const bool indexer = s.architecture == "deepseek32";
  const int64_t Hi = s.index_heads, Di = s.index_head_dim;
  if (indexer && (Hi <= 0 || Di < rope || s.index_topk <= 0 || s.q_lora_rank <= 0)) {
    fail(ErrorCode::kInvalidArgument, "deepseek32's indexer needs heads > 0 (have {}), a head size of at least the {} "
         "rotated dimensions (have {}), top-k > 0 (have {}) and a q_lora_rank > 0 (have {})", Hi, rope, Di,
         s.index_topk, s.q_lora_rank);
  }
  if (!indexer && (Hi != 0 || Di != 0 || s.index_topk != 0)) {
    fail(ErrorCode::kInvalidArgument, "an indexer ({} heads of {}, top-{}) needs deepseek32, not deepseek2", Hi, Di,
         s.index_topk);
  }
  if (rope <= 0 || rope % 2 != 0) {
    fail(ErrorCode::kInvalidArgument, "qk_rope_head_dim {} must be even and positive", rope);
  }
  if (s.sliding_window != 0 || s.max_window_layers != 0) {
    fail(ErrorCode::kInvalidArgument, "deepseek2 has no sliding window (got {} from layer {})", s.sliding_window,
         s.max_window_layers);
  }
  if (s.num_dense_layers < 0 || s.num_dense_layers > s.num_layers) {
    fail(ErrorCode::kInvalidArgument, "{} leading dense layers out of {} layers", s.num_dense_layers, s.num_layers);
  }
  const bool moe = s.num_dense_layers < s.num_layers;
  const bool sigmoid = s.expert_gating_func == 2;
  if (s.expert_gating_func != 1 && !sigmoid) {
    fail(ErrorCode::kInvalidArgument, "expert gating function {} (expected 1: softmax, 2: sigmoid)",
         s.expert_gating_func);
  }
  if (moe) {
    if (E <= 0 || s.expert_intermediate_size <= 0 || s.num_shared_experts < 0 || s.num_experts_used <= 0 ||
        s.num_experts_used > E) {
      fail(ErrorCode::kInvalidArgument,
           "MoE layers need experts > 0 (have {}), 0 < experts used <= experts (have {}), an expert feed-forward "
           "size > 0 (have {}) and shared experts >= 0 (have {})",
           E, s.num_experts_used, s.expert_intermediate_size, s.num_shared_experts);
    }
    if (G <= 0 || E % G != 0 || s.num_expert_groups_used <= 0 || s.num_expert_groups_used > G) {
      fail(ErrorCode::kInvalidArgument, "{} experts do not split into {} groups of which {} are used (--expert-groups, "
           "--expert-groups-used)", E, G, s.num_expert_groups_used);
    }
    if (s.num_experts_used > s.num_expert_groups_used * (E / G)) {
      fail(ErrorCode::kInvalidArgument, "top-{} experts cannot come from {} groups of {} experts (--experts-used, "
           "--expert-groups, --expert-groups-used)", s.num_experts_used, s.num_expert_groups_used, E / G);
    }
    if (sigmoid && E / G < 2) {
      fail(ErrorCode::kInvalidArgument, "sigmoid routing scores a group by its two best experts: {} experts in {} "
           "groups leave {} per group (--expert-groups)", E, G, E / G);
    }
  }
  const int64_t block = traits(type).block_size;
  const int64_t ff_sh = s.expert_intermediate_size * s.num_shared_experts;
  // Every matrix's rows (its innermost dimension) must split into whole quantization blocks.
  const std::pair<const char*, int64_t> row_lengths[] = {
      {"hidden size", d},
      {"intermediate size", s.intermediate_size},
      {"q_lora_rank", s.q_lora_rank},
      {"kv_lora_rank", s.kv_lora_rank},
      {"heads * v_head_dim", H * vd},
      {"qk_nope_head_dim (rows of attn_k_b)", s.split_mla ? nope : 0},
      {"expert feed-forward size", moe ? s.expert_intermediate_size : 0},
      {"shared experts' feed-forward size", moe ? ff_sh : 0}};
  for (const auto& [what, n] : row_lengths) {
    if (n % block != 0) {
      fail(ErrorCode::kInvalidArgument, "{} needs the {} ({}) to be a multiple of {}", dtype_name(type), what, n,
           block);
    }
  }

  auto u32 = [](int64_t v) { return GgufValue::u32(static_cast<uint32_t>(v)); };
  auto f32 = [](double v) { return GgufValue::f32(static_cast<float>(v)); };
  const std::string a = s.architecture + ".";
  w.set("general.architecture", GgufValue::str(s.architecture));
  w.set("general.file_type", GgufValue::u32(file_type));
  if (block > 1) w.set("general.quantization_version", GgufValue::u32(2));
  w.set(a + "context_length", u32(s.context_length));
  w.set(a + "embedding_length", u32(d));
  w.set(a + "block_count", u32(s.num_layers));
  w.set(a + "feed_forward_length", u32(s.intermediate_size));
  w.set(a + "attention.head_count", u32(H));
  w.set(a + "attention.head_count_kv", u32(s.split_mla ? 1 : H));
  w.set(a + "attention.layer_norm_rms_epsilon", f32(s.rms_norm_eps));
  if (s.q_lora_rank > 0) w.set(a + "attention.q_lora_rank", u32(s.q_lora_rank));
  w.set(a + "attention.kv_lora_rank", u32(s.kv_lora_rank));
  if (s.split_mla) {
    // As llama.cpp's converter: MQA over the latent, the heads' sizes under *_mla.
    w.set(a + "attention.key_length", u32(s.kv_lora_rank + rope));
    w.set(a + "attention.value_length", u32(s.kv_lora_rank));
    w.set(a + "attention.key_length_mla", u32(nope + rope));
    w.set(a + "attention.value_length_mla", u32(vd));
  } else {
    w.set(a + "attention.key_length", u32(nope + rope));
    w.set(a + "attention.value_length", u32(vd));
  }
  w.set(a + "rope.dimension_count", u32(rope));
  w.set(a + "rope.freq_base", f32(s.rope_base));
  if (s.rope_scale != 1.0) {
    if (s.rope_scale < 1.0 || s.yarn_original_context <= 0) {
      fail(ErrorCode::kInvalidArgument, "YaRN needs a factor > 1 (have {}) and an original context (have {})",
           s.rope_scale, s.yarn_original_context);
    }
    w.set(a + "rope.scaling.type", GgufValue::str("yarn"));
    w.set(a + "rope.scaling.factor", f32(s.rope_scale));
    w.set(a + "rope.scaling.original_context_length", u32(s.yarn_original_context));
    w.set(a + "rope.scaling.yarn_log_multiplier", f32(s.yarn_log_multiplier));
  }
  w.set(a + "leading_dense_block_count", u32(s.num_dense_layers));
  if (moe) {
    w.set(a + "expert_feed_forward_length", u32(s.expert_intermediate_size));
    w.set(a + "expert_count", u32(E));
    w.set(a + "expert_shared_count", u32(s.num_shared_experts));
    w.set(a + "expert_used_count", u32(s.num_experts_used));
    w.set(a + "expert_weights_scale", f32(s.expert_weights_scale));
    w.set(a + "expert_weights_norm", GgufValue::boolean(s.expert_weights_norm));
    w.set(a + "expert_gating_func", GgufValue::u32(s.expert_gating_func));
    w.set(a + "expert_group_count", u32(G));
    w.set(a + "expert_group_used_count", u32(s.num_expert_groups_used));
  }
  w.set(a + "vocab_size", u32(s.num_vocab));
  if (s.num_nextn_layers < 0) fail(ErrorCode::kInvalidArgument, "{} MTP layers, expected >= 0", s.num_nextn_layers);
  if (s.num_nextn_layers > 0) w.set(a + "nextn_predict_layers", u32(s.num_nextn_layers));
  if (indexer) {
    w.set(a + "attention.indexer.head_count", u32(Hi));
    w.set(a + "attention.indexer.key_length", u32(Di));
    w.set(a + "attention.indexer.top_k", u32(s.index_topk));
  }

  // Uniform weights with variance 1/fan_in keep activations near unit scale through the layers.
  auto linear = [&](const std::string& name, int64_t rows, int64_t cols) {
    const float hw = std::sqrt(3.0f / static_cast<float>(cols));
    w.add_tensor(name, type, {cols, rows}, random_fill(pool, seed, name, type, rows, cols, 0.0f, hw));
  };
  // The experts' 3-D tensors [cols, rows, E]: E such matrices, expert e's rows at e * rows.
  auto experts = [&](const std::string& name, int64_t rows, int64_t cols) {
    const float hw = std::sqrt(3.0f / static_cast<float>(cols));
    w.add_tensor(name, type, {cols, rows, E}, random_fill(pool, seed, name, type, rows * E, cols, 0.0f, hw));
  };
  auto f32_vector = [&](const std::string& name, int64_t n, float center, float half_width) {
    w.add_tensor(name, DType::kF32, {n}, random_fill(pool, seed, name, DType::kF32, 1, n, center, half_width));
  };
  auto norm = [&](const std::string& name, int64_t n) { f32_vector(name, n, 1.0f, 0.1f); };
  const int64_t ff_e = s.expert_intermediate_size;
  linear("token_embd.weight", s.num_vocab, d);
  auto add_layer = [&](int64_t l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight", d);
    if (s.q_lora_rank > 0) {
      linear(p + "attn_q_a.weight", s.q_lora_rank, d);
      norm(p + "attn_q_a_norm.weight", s.q_lora_rank);
      linear(p + "attn_q_b.weight", H * (nope + rope), s.q_lora_rank);
    } else {
      linear(p + "attn_q.weight", H * (nope + rope), d);
    }
    linear(p + "attn_kv_a_mqa.weight", s.kv_lora_rank + rope, d);
    norm(p + "attn_kv_a_norm.weight", s.kv_lora_rank);
    if (s.split_mla) {
      const std::string kv_b = p + "attn_kv_b.weight";
      w.add_tensor(p + "attn_k_b.weight", type, {nope, s.kv_lora_rank, H},
                   split_kv_b_fill(pool, seed, kv_b, type, H, nope, vd, s.kv_lora_rank, true));
      w.add_tensor(p + "attn_v_b.weight", type, {s.kv_lora_rank, vd, H},
                   split_kv_b_fill(pool, seed, kv_b, type, H, nope, vd, s.kv_lora_rank, false));
    } else {
      linear(p + "attn_kv_b.weight", H * (nope + vd), s.kv_lora_rank);
    }
    linear(p + "attn_output.weight", d, H * vd);
    if (indexer) {
      linear(p + "indexer.attn_q_b.weight", Hi * Di, s.q_lora_rank);
      linear(p + "indexer.attn_k.weight", Di, d);
      norm(p + "indexer.k_norm.weight", Di);
      f32_vector(p + "indexer.k_norm.bias", Di, 0.0f, 0.1f);
      linear(p + "indexer.proj.weight", Hi, d);
    }
    norm(p + "ffn_norm.weight", d);
    if (l < s.num_dense_layers || !moe) {  // (an MTP layer, after the last, is dense in a dense model)
      linear(p + "ffn_gate.weight", s.intermediate_size, d);
      linear(p + "ffn_up.weight", s.intermediate_size, d);
      linear(p + "ffn_down.weight", d, s.intermediate_size);
      return;
    }
    // The router in f32, logits of unit scale; V3's correction bias positive (0.01 to 0.19), so
    // that it moves the choice between experts whose sigmoid scores are close and every biased
    // score stays > 0 (where HF's masked_fill(0.0) and -inf agree).
    const std::string router = p + "ffn_gate_inp.weight";
    w.add_tensor(router, DType::kF32, {d, E},
                 random_fill(pool, seed, router, DType::kF32, E, d, 0.0f, std::sqrt(3.0f / static_cast<float>(d))));
    if (sigmoid) f32_vector(p + "exp_probs_b.bias", E, 0.1f, 0.09f);
    experts(p + "ffn_gate_exps.weight", ff_e, d);
    experts(p + "ffn_up_exps.weight", ff_e, d);
    experts(p + "ffn_down_exps.weight", d, ff_e);
    if (ff_sh > 0) {
      linear(p + "ffn_gate_shexp.weight", ff_sh, d);
      linear(p + "ffn_up_shexp.weight", ff_sh, d);
      linear(p + "ffn_down_shexp.weight", d, ff_sh);
    }
  };
  for (int64_t l = 0; l < s.num_layers; ++l) add_layer(l);
  for (int64_t l = s.num_layers; l < s.num_layers + s.num_nextn_layers; ++l) {
    add_layer(l);
    const std::string p = "blk." + std::to_string(l) + ".nextn.";
    norm(p + "enorm.weight", d);
    norm(p + "hnorm.weight", d);
    linear(p + "eh_proj.weight", d, 2 * d);
    norm(p + "shared_head_norm.weight", d);
    if (s.nextn_own_head) {
      linear(p + "embed_tokens.weight", s.num_vocab, d);
      linear(p + "shared_head_head.weight", s.num_vocab, d);
    }
  }
  norm("output_norm.weight", d);
  if (!s.tied) linear("output.weight", s.num_vocab, d);
}

}  // namespace

SyntheticSpec synthetic_preset(const std::string& name) {
  auto spec = [](const char* arch, int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads, int64_t ff,
                 int64_t vocab, int64_t context, double rope_base, double rope_scale) {
    SyntheticSpec s;
    s.architecture = arch;
    s.hidden_size = hidden;
    s.num_layers = layers;
    s.num_heads = heads;
    s.num_kv_heads = kv_heads;
    s.intermediate_size = ff;
    s.num_vocab = vocab;
    s.context_length = context;
    s.rope_base = rope_base;
    s.rope_scale = rope_scale;
    s.rms_norm_eps = 1e-6;
    return s;
  };
  if (name == "tiny") return spec("llama", 128, 2, 4, 2, 256, 512, 256, 10000.0, 4.0);
  // DeepSeek-Coder-1.3B's exact shape (llama architecture, 1.35 B parameters).
  if (name == "deepseek-coder-1.3b") return spec("llama", 2048, 24, 16, 16, 5504, 32256, 16384, 100000.0, 4.0);
  // DeepSeek-LLM-7B's exact shape (its config.json: 30 layers, 32 heads, rope_theta 10000, 4096
  // positions; 6.9 B parameters).
  if (name == "deepseek-llm-7b") return spec("llama", 4096, 30, 32, 32, 11008, 102400, 4096, 10000.0, 1.0);
  // DeepSeek-R1-Distill-Llama-8B's exact shape, Llama 3.1 8B's (its config.json: 32 layers, 32
  // heads over 8 kv heads, rope_theta 500000 with llama3 scaling factor 8 (low 1, high 4) over
  // 8192 positions, 131072 positions, rms_norm_eps 1e-5, vocab 128256; 8.0 B parameters).
  if (name == "r1-distill-llama-8b") {
    SyntheticSpec s = spec("llama", 4096, 32, 32, 8, 14336, 128256, 131072, 500000.0, 1.0);
    s.rms_norm_eps = 1e-5;
    s.llama3_rope_factor = 8.0;
    s.llama3_low_freq_factor = 1.0;
    s.llama3_high_freq_factor = 4.0;
    s.llama3_original_context = 8192;
    return s;
  }
  // The tiny shape as qwen2 (q/k/v biases, NEOX rope), without rope scaling.
  if (name == "qwen2-tiny") return spec("qwen2", 128, 2, 4, 2, 256, 512, 256, 10000.0, 1.0);
  // DeepSeek-R1-Distill-Qwen-1.5B's and -7B's exact shapes (their config.json: qwen2, rope_theta
  // 10000, rms_norm_eps 1e-6, 131072 positions, separate lm_head, use_sliding_window false; 1.78 B
  // and 7.6 B parameters).
  if (name == "r1-distill-qwen-1.5b") return spec("qwen2", 1536, 28, 12, 2, 8960, 151936, 131072, 10000.0, 1.0);
  if (name == "r1-distill-qwen-7b") return spec("qwen2", 3584, 28, 28, 4, 18944, 152064, 131072, 10000.0, 1.0);
  // The tiny shape as qwen3 (per-head q/k norms, no biases, NEOX rope) with heads of 48 (not 128
  // / 4 = 32, as Qwen3's head size is its own) and YaRN x4 over 1024 positions: with 48 rope dims
  // and base 10000 the correction range is pairs 4 to 14 of 24, so all three kinds of frequency
  // (kept, blended, interpolated) are in play at short positions; no attn_factor, so YaRN's
  // magnitude factor 1 + 0.1 ln 4 shows.
  if (name == "qwen3-tiny") {
    SyntheticSpec s = spec("qwen3", 128, 2, 4, 2, 256, 512, 4096, 10000.0, 4.0);
    s.head_dim = 48;
    s.yarn_original_context = 1024;
    return s;
  }
  // DeepSeek-R1-0528-Qwen3-8B's exact shape (its config.json: qwen3, 36 layers, 32 heads of 128
  // over 8 kv heads, rope_theta 1000000 with YaRN factor 4 over 32768 positions and attn_factor
  // 0.8782488562869419 (= 1 / (1 + 0.1 ln 4): the magnitude factor cancels), 131072 positions,
  // rms_norm_eps 1e-6, separate lm_head, vocab 151936; 8.2 B parameters).
  if (name == "r1-0528-qwen3-8b") {
    SyntheticSpec s = spec("qwen3", 4096, 36, 32, 8, 12288, 151936, 131072, 1000000.0, 4.0);
    s.head_dim = 128;
    s.yarn_original_context = 32768;
    s.yarn_attn_factor = 0.8782488562869419;
    return s;
  }
  // deepseek2: (hidden, layers, heads, intermediate, vocab, context), then MLA, YaRN and MoE.
  auto mla = [&](int64_t hidden, int64_t layers, int64_t heads, int64_t ff, int64_t vocab, int64_t context,
                 int64_t q_lora, int64_t kv_lora, int64_t nope, int64_t rope, int64_t v) {
    SyntheticSpec s = spec("deepseek2", hidden, layers, heads, heads, ff, vocab, context, 10000.0, 1.0);
    s.q_lora_rank = q_lora;
    s.kv_lora_rank = kv_lora;
    s.qk_nope_head_dim = nope;
    s.qk_rope_head_dim = rope;
    s.v_head_dim = v;
    return s;
  };
  auto yarn = [](SyntheticSpec& s, double factor, int64_t original_context, double mscale_all_dim) {
    s.rope_scale = factor;
    s.yarn_original_context = original_context;
    s.yarn_log_multiplier = 0.1 * mscale_all_dim;
  };
  auto experts = [](SyntheticSpec& s, int64_t dense, int64_t ff_exp, int64_t n, int64_t shared, int64_t used,
                    int64_t groups, int64_t groups_used, double scale, bool norm, uint32_t gating) {
    s.num_dense_layers = dense;
    s.expert_intermediate_size = ff_exp;
    s.num_experts = n;
    s.num_shared_experts = shared;
    s.num_experts_used = used;
    s.num_expert_groups = groups;
    s.num_expert_groups_used = groups_used;
    s.expert_weights_scale = scale;
    s.expert_weights_norm = norm;
    s.expert_gating_func = gating;
    return s;
  };
  // DeepSeek-V2-Lite's config.json (15.7 B parameters, 2.4 B active): no q_lora, 64 routed + 2
  // shared experts, top-6 greedy softmax routing (n_group 1), routed_scaling_factor 1.0,
  // norm_topk_prob false, first_k_dense_replace 1, YaRN factor 40 over 4096 positions with
  // mscale = mscale_all_dim = 0.707, rope_theta 10000, rms_norm_eps 1e-6.
  if (name == "deepseek-v2-lite") {
    SyntheticSpec s = mla(2048, 27, 16, 10944, 102400, 163840, 0, 512, 128, 64, 128);
    yarn(s, 40.0, 4096, 0.707);
    return experts(s, 1, 1408, 64, 2, 6, 1, 1, 1.0, false, 1);
  }
  // DeepSeek-V3's (and R1's) config.json (671 B parameters): q_lora 1536, 256 routed + 1 shared
  // experts, top-8 within 4 of 8 groups, sigmoid scores with e_score_correction_bias (noaux_tc),
  // norm_topk_prob true, routed_scaling_factor 2.5, first_k_dense_replace 3, YaRN factor 40 over
  // 4096 with mscale = mscale_all_dim = 1.0. Usable only shrunk (--layers, --experts).
  if (name == "deepseek-v3") {
    SyntheticSpec s = mla(7168, 61, 128, 18432, 129280, 163840, 1536, 512, 128, 64, 128);
    yarn(s, 40.0, 4096, 1.0);
    return experts(s, 3, 2048, 256, 1, 8, 8, 4, 2.5, true, 2);
  }
  // The same features in miniature for the reference tests. YaRN x4 over 1024 positions: with 8
  // rope dims the correction range is dims [0, 3], so the 4 frequencies are extrapolated, blended
  // 2/3 and 1/3, and interpolated. Routed scaling 2.0 (V2-Lite's 1.0 would not show a missing
  // factor); V3-style top-3 within 2 of 4 groups of 2.
  if (name == "deepseek2-tiny-v2") {
    SyntheticSpec s = mla(64, 3, 4, 128, 512, 4096, 0, 32, 16, 8, 16);
    yarn(s, 4.0, 1024, 0.707);
    return experts(s, 1, 32, 8, 2, 3, 1, 1, 2.0, false, 1);
  }
  if (name == "deepseek2-tiny-v3") {
    SyntheticSpec s = mla(128, 3, 8, 256, 512, 4096, 64, 32, 16, 8, 16);
    yarn(s, 4.0, 1024, 1.0);
    return experts(s, 1, 32, 8, 1, 3, 4, 2, 2.5, true, 2);
  }
  // DeepSeek-V3.2's indexer: 64 heads of 128, each query's 2048 best positions.
  auto indexer = [](SyntheticSpec s, int64_t heads, int64_t dim, int64_t topk) {
    s.architecture = "deepseek32";
    s.index_heads = heads;
    s.index_head_dim = dim;
    s.index_topk = topk;
    return s;
  };
  // DeepSeek-V3.2's config.json (V3's shape and routing, plus index_n_heads 64, index_head_dim
  // 128, index_topk 2048). Usable only shrunk.
  if (name == "deepseek-v3.2") return indexer(synthetic_preset("deepseek-v3"), 64, 128, 2048);
  // deepseek2-tiny-v3 with an indexer of 4 heads of 32 keeping 8 positions: a query from the
  // ninth position on attends to 8 of them.
  if (name == "deepseek32-tiny") return indexer(synthetic_preset("deepseek2-tiny-v3"), 4, 32, 8);
  fail(ErrorCode::kInvalidArgument, "unknown preset '{}' (expected {})", name,
       fmt::join(synthetic_preset_names(), ", "));
}

std::vector<std::string> synthetic_preset_names() {
  return {"tiny",
          "deepseek-coder-1.3b",
          "deepseek-llm-7b",
          "r1-distill-llama-8b",
          "qwen2-tiny",
          "r1-distill-qwen-1.5b",
          "r1-distill-qwen-7b",
          "qwen3-tiny",
          "r1-0528-qwen3-8b",
          "deepseek-v2-lite",
          "deepseek-v3",
          "deepseek2-tiny-v2",
          "deepseek2-tiny-v3",
          "deepseek-v3.2",
          "deepseek32-tiny"};
}

void add_synthetic_model(GgufWriter& w, const SyntheticSpec& s, DType type, uint64_t seed, ThreadPool& pool) {
  const uint32_t file_type = file_type_of(type);
  if (s.architecture == "deepseek2" || s.architecture == "deepseek32") {
    return add_deepseek2(w, s, type, file_type, seed, pool);
  }
  const bool qwen2 = s.architecture == "qwen2", qwen3 = s.architecture == "qwen3";
  if (!qwen2 && !qwen3 && s.architecture != "llama") {
    fail(ErrorCode::kInvalidArgument, "synthetic models are llama, qwen2, qwen3, deepseek2 or deepseek32, not '{}'",
         s.architecture);
  }
  if (s.sliding_window < 0 || s.max_window_layers < 0 || (!qwen2 && (s.sliding_window != 0 || s.max_window_layers != 0))) {
    fail(ErrorCode::kInvalidArgument, "a sliding window ({} from layer {}) needs qwen2 and sizes >= 0, not {}",
         s.sliding_window, s.max_window_layers, s.architecture);
  }
  if (s.hidden_size <= 0 || s.num_layers <= 0 || s.intermediate_size <= 0 || s.num_vocab <= 0 ||
      s.context_length <= 0) {
    fail(ErrorCode::kInvalidArgument, "synthetic model sizes must be positive");
  }
  if (s.num_heads <= 0 || s.num_kv_heads <= 0 || (s.head_dim == 0 && s.hidden_size % s.num_heads != 0) ||
      s.num_heads % s.num_kv_heads != 0) {
    fail(ErrorCode::kInvalidArgument,
         "hidden size {} must split into {} heads (or the head size be given), and the heads into {} kv heads",
         s.hidden_size, s.num_heads, s.num_kv_heads);
  }
  const int64_t head_dim = s.head_dim > 0 ? s.head_dim : s.hidden_size / s.num_heads;
  if (head_dim <= 0 || head_dim % 2 != 0) {
    fail(ErrorCode::kInvalidArgument, "head size {} must be positive and even for rope", head_dim);
  }
  if (s.yarn_original_context < 0 || (s.yarn_original_context > 0 && !(s.rope_scale >= 1.0)) ||
      !(s.yarn_attn_factor > 0.0) || (s.yarn_attn_factor != 1.0 && s.yarn_original_context == 0)) {
    fail(ErrorCode::kInvalidArgument,
         "YaRN needs an original context > 0, a factor >= 1 and an attn factor > 0; found {}, {}, {}",
         s.yarn_original_context, s.rope_scale, s.yarn_attn_factor);
  }
  const int64_t block = traits(type).block_size;
  if (s.hidden_size % block != 0 || s.intermediate_size % block != 0 || (s.num_heads * head_dim) % block != 0) {
    fail(ErrorCode::kInvalidArgument,
         "{} needs the hidden size ({}), intermediate size ({}) and heads x head size ({}) to be multiples of {}",
         dtype_name(type), s.hidden_size, s.intermediate_size, s.num_heads * head_dim, block);
  }
  auto u32 = [](int64_t v) { return GgufValue::u32(static_cast<uint32_t>(v)); };
  const std::string& a = s.architecture;
  w.set("general.architecture", GgufValue::str(a));
  w.set("general.file_type", GgufValue::u32(file_type));
  if (block > 1) w.set("general.quantization_version", GgufValue::u32(2));
  w.set(a + ".context_length", u32(s.context_length));
  w.set(a + ".embedding_length", u32(s.hidden_size));
  w.set(a + ".block_count", u32(s.num_layers));
  w.set(a + ".feed_forward_length", u32(s.intermediate_size));
  w.set(a + ".attention.head_count", u32(s.num_heads));
  w.set(a + ".attention.head_count_kv", u32(s.num_kv_heads));
  w.set(a + ".attention.layer_norm_rms_epsilon", GgufValue::f32(static_cast<float>(s.rms_norm_eps)));
  w.set(a + ".rope.freq_base", GgufValue::f32(static_cast<float>(s.rope_base)));
  w.set(a + ".rope.dimension_count", u32(head_dim));
  if (s.yarn_original_context > 0) {
    w.set(a + ".rope.scaling.type", GgufValue::str("yarn"));
    w.set(a + ".rope.scaling.factor", GgufValue::f32(static_cast<float>(s.rope_scale)));
    w.set(a + ".rope.scaling.original_context_length", u32(s.yarn_original_context));
    if (s.yarn_attn_factor != 1.0) {
      w.set(a + ".rope.scaling.yarn_attn_factor", GgufValue::f32(static_cast<float>(s.yarn_attn_factor)));
    }
  } else if (s.rope_scale != 1.0) {
    w.set(a + ".rope.scaling.type", GgufValue::str("linear"));
    w.set(a + ".rope.scaling.factor", GgufValue::f32(static_cast<float>(s.rope_scale)));
  }
  if (head_dim * s.num_heads != s.hidden_size) {
    w.set(a + ".attention.key_length", u32(head_dim));
    w.set(a + ".attention.value_length", u32(head_dim));
  }
  if (s.sliding_window > 0) {
    w.set(a + ".attention.sliding_window", u32(s.sliding_window));
    if (s.max_window_layers > 0) w.set(a + ".attention.max_window_layers", u32(s.max_window_layers));
  }
  w.set(a + ".vocab_size", u32(s.num_vocab));

  const int64_t d = s.hidden_size;
  const int64_t q_dim = s.num_heads * head_dim;
  const int64_t kv = s.num_kv_heads * head_dim;
  const int64_t ff = s.intermediate_size;
  // Uniform weights with variance 1/fan_in keep activations near unit scale through the layers.
  auto linear = [&](const std::string& name, int64_t rows, int64_t cols) {
    const float a = std::sqrt(3.0f / static_cast<float>(cols));
    w.add_tensor(name, type, {cols, rows}, random_fill(pool, seed, name, type, rows, cols, 0.0f, a));
  };
  if (s.outlier_channels < 0 || s.outlier_channels > d || !(s.outlier_scale > 0.0)) {
    fail(ErrorCode::kInvalidArgument, "outlier channels {} (scale {}) must be 0 to the hidden size {}, the scale positive",
         s.outlier_channels, s.outlier_scale, d);
  }
  auto norm = [&](const std::string& name, bool outliers, int64_t len) {
    GgufWriter::Fill fill = random_fill(pool, seed, name, DType::kF32, 1, len, 1.0f, 0.1f);
    if (outliers && s.outlier_channels > 0) {
      fill = [fill, d, n = s.outlier_channels, scale = static_cast<float>(s.outlier_scale)](uint8_t* dst, size_t nbytes) {
        fill(dst, nbytes);
        auto* x = reinterpret_cast<float*>(dst);
        for (int64_t c = 0; c < n; ++c) x[c * (d / n)] *= scale;
      };
    }
    w.add_tensor(name, DType::kF32, {len}, std::move(fill));
  };
  // Biases of q, k and v, uniform in +-0.5: large enough to matter against activations of unit scale.
  auto bias = [&](const std::string& name, int64_t n) {
    if (qwen2) w.add_tensor(name, DType::kF32, {n}, random_fill(pool, seed, name, DType::kF32, 1, n, 0.0f, 0.5f));
  };
  linear("token_embd.weight", s.num_vocab, d);
  if (s.llama3_rope_factor != 0.0) {
    if (s.architecture != "llama" || !(s.llama3_rope_factor > 0.0) || !(s.llama3_high_freq_factor > s.llama3_low_freq_factor) ||
        s.llama3_original_context <= 0 || s.rope_scale != 1.0) {
      fail(ErrorCode::kInvalidArgument,
           "Llama 3 rope scaling needs llama, factor > 0, high_freq_factor > low_freq_factor, original context > 0 "
           "and no linear scaling; found {}, factor {}, low {}, high {}, context {}, linear {}",
           s.architecture, s.llama3_rope_factor, s.llama3_low_freq_factor, s.llama3_high_freq_factor,
           s.llama3_original_context, s.rope_scale);
    }
    const std::vector<float> divisors =
        llama3_rope_freq_factors(s.rope_base, head_dim, s.llama3_rope_factor, s.llama3_low_freq_factor,
                                 s.llama3_high_freq_factor, static_cast<double>(s.llama3_original_context));
    w.add_tensor("rope_freqs.weight", DType::kF32, {head_dim / 2}, [divisors](uint8_t* dst, size_t nbytes) {
      std::memcpy(dst, divisors.data(), std::min(nbytes, divisors.size() * sizeof(float)));
    });
  }
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight", true, d);
    linear(p + "attn_q.weight", q_dim, d);
    bias(p + "attn_q.bias", q_dim);
    linear(p + "attn_k.weight", kv, d);
    bias(p + "attn_k.bias", kv);
    linear(p + "attn_v.weight", kv, d);
    bias(p + "attn_v.bias", kv);
    if (qwen3) {
      norm(p + "attn_q_norm.weight", false, head_dim);
      norm(p + "attn_k_norm.weight", false, head_dim);
    }
    linear(p + "attn_output.weight", d, q_dim);
    norm(p + "ffn_norm.weight", true, d);
    linear(p + "ffn_gate.weight", ff, d);
    linear(p + "ffn_up.weight", ff, d);
    linear(p + "ffn_down.weight", d, ff);
  }
  norm("output_norm.weight", false, d);
  if (!s.tied) linear("output.weight", s.num_vocab, d);
}

}  // namespace duet
