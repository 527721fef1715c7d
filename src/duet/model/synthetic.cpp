#include "duet/model/synthetic.h"

#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "duet/core/error.h"
#include "duet/core/quant.h"
#include "duet/core/random.h"

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

// `rows` rows of `cols` values uniform in center +- half_width, one generator per row.
GgufWriter::Fill random_fill(ThreadPool& pool, uint64_t seed, const std::string& name, DType type, int64_t rows,
                             int64_t cols, float center, float half_width) {
  const uint64_t tensor_seed = seed ^ fnv1a(name);
  return [&pool, tensor_seed, type, rows, cols, center, half_width](uint8_t* dst, size_t nbytes) {
    const size_t rb = row_size(type, cols);
    if (rb * static_cast<size_t>(rows) != nbytes) fail(ErrorCode::kInternal, "synthetic tensor size mismatch");
    pool.parallel_for(rows, 64, [&](int64_t begin, int64_t end) {
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = begin; r < end; ++r) {
        Rng rng(tensor_seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(r + 1));
        for (float& v : row) v = center + half_width * static_cast<float>(2.0 * rng.uniform() - 1.0);
        quantize_row_ref(type, row.data(), dst + static_cast<size_t>(r) * rb, cols);
      }
    });
  };
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
  // The tiny shape as qwen2 (q/k/v biases, NEOX rope), without rope scaling.
  if (name == "qwen2-tiny") return spec("qwen2", 128, 2, 4, 2, 256, 512, 256, 10000.0, 1.0);
  // DeepSeek-R1-Distill-Qwen-1.5B's and -7B's exact shapes (their config.json: qwen2, rope_theta
  // 10000, rms_norm_eps 1e-6, 131072 positions, separate lm_head, use_sliding_window false; 1.78 B
  // and 7.6 B parameters).
  if (name == "r1-distill-qwen-1.5b") return spec("qwen2", 1536, 28, 12, 2, 8960, 151936, 131072, 10000.0, 1.0);
  if (name == "r1-distill-qwen-7b") return spec("qwen2", 3584, 28, 28, 4, 18944, 152064, 131072, 10000.0, 1.0);
  fail(ErrorCode::kInvalidArgument, "unknown preset '{}' (expected {})", name,
       fmt::join(synthetic_preset_names(), ", "));
}

std::vector<std::string> synthetic_preset_names() {
  return {"tiny", "deepseek-coder-1.3b", "qwen2-tiny", "r1-distill-qwen-1.5b", "r1-distill-qwen-7b"};
}

void add_synthetic_model(GgufWriter& w, const SyntheticSpec& s, DType type, uint64_t seed, ThreadPool& pool) {
  const uint32_t file_type = file_type_of(type);
  const bool qwen2 = s.architecture == "qwen2";
  if (!qwen2 && s.architecture != "llama") {
    fail(ErrorCode::kInvalidArgument, "synthetic models are llama or qwen2, not '{}'", s.architecture);
  }
  if (s.sliding_window < 0 || s.max_window_layers < 0 || (!qwen2 && (s.sliding_window != 0 || s.max_window_layers != 0))) {
    fail(ErrorCode::kInvalidArgument, "a sliding window ({} from layer {}) needs qwen2 and sizes >= 0, not {}",
         s.sliding_window, s.max_window_layers, s.architecture);
  }
  if (s.hidden_size <= 0 || s.num_layers <= 0 || s.intermediate_size <= 0 || s.num_vocab <= 0 ||
      s.context_length <= 0) {
    fail(ErrorCode::kInvalidArgument, "synthetic model sizes must be positive");
  }
  if (s.num_heads <= 0 || s.num_kv_heads <= 0 || s.hidden_size % s.num_heads != 0 ||
      s.num_heads % s.num_kv_heads != 0) {
    fail(ErrorCode::kInvalidArgument, "hidden size {} must split into {} heads, and the heads into {} kv heads",
         s.hidden_size, s.num_heads, s.num_kv_heads);
  }
  const int64_t head_dim = s.hidden_size / s.num_heads;
  if (head_dim % 2 != 0) fail(ErrorCode::kInvalidArgument, "head size {} must be even for rope", head_dim);
  const int64_t block = traits(type).block_size;
  if (s.hidden_size % block != 0 || s.intermediate_size % block != 0) {
    fail(ErrorCode::kInvalidArgument, "{} needs the hidden size ({}) and intermediate size ({}) to be multiples of {}",
         dtype_name(type), s.hidden_size, s.intermediate_size, block);
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
  if (s.rope_scale != 1.0) {
    w.set(a + ".rope.scaling.type", GgufValue::str("linear"));
    w.set(a + ".rope.scaling.factor", GgufValue::f32(static_cast<float>(s.rope_scale)));
  }
  if (s.sliding_window > 0) {
    w.set(a + ".attention.sliding_window", u32(s.sliding_window));
    if (s.max_window_layers > 0) w.set(a + ".attention.max_window_layers", u32(s.max_window_layers));
  }
  w.set(a + ".vocab_size", u32(s.num_vocab));

  const int64_t d = s.hidden_size;
  const int64_t kv = s.num_kv_heads * head_dim;
  const int64_t ff = s.intermediate_size;
  // Uniform weights with variance 1/fan_in keep activations near unit scale through the layers.
  auto linear = [&](const std::string& name, int64_t rows, int64_t cols) {
    const float a = std::sqrt(3.0f / static_cast<float>(cols));
    w.add_tensor(name, type, {cols, rows}, random_fill(pool, seed, name, type, rows, cols, 0.0f, a));
  };
  auto norm = [&](const std::string& name) {
    w.add_tensor(name, DType::kF32, {d}, random_fill(pool, seed, name, DType::kF32, 1, d, 1.0f, 0.1f));
  };
  // Biases of q, k and v, uniform in +-0.5: large enough to matter against activations of unit scale.
  auto bias = [&](const std::string& name, int64_t n) {
    if (qwen2) w.add_tensor(name, DType::kF32, {n}, random_fill(pool, seed, name, DType::kF32, 1, n, 0.0f, 0.5f));
  };
  linear("token_embd.weight", s.num_vocab, d);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight");
    linear(p + "attn_q.weight", d, d);
    bias(p + "attn_q.bias", d);
    linear(p + "attn_k.weight", kv, d);
    bias(p + "attn_k.bias", kv);
    linear(p + "attn_v.weight", kv, d);
    bias(p + "attn_v.bias", kv);
    linear(p + "attn_output.weight", d, d);
    norm(p + "ffn_norm.weight");
    linear(p + "ffn_gate.weight", ff, d);
    linear(p + "ffn_up.weight", ff, d);
    linear(p + "ffn_down.weight", d, ff);
  }
  norm("output_norm.weight");
  if (!s.tied) linear("output.weight", s.num_vocab, d);
}

}  // namespace duet
