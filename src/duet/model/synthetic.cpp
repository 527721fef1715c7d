#include "duet/model/synthetic.h"

#include <cmath>
#include <vector>

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
  if (name == "tiny") return {128, 2, 4, 2, 256, 512, 256, 10000.0, 4.0, 1e-6, false};
  // DeepSeek-Coder-1.3B's exact shape (llama architecture, 1.35 B parameters).
  if (name == "deepseek-coder-1.3b") return {2048, 24, 16, 16, 5504, 32256, 16384, 100000.0, 4.0, 1e-6, false};
  fail(ErrorCode::kInvalidArgument, "unknown preset '{}' (expected tiny or deepseek-coder-1.3b)", name);
}

void add_synthetic_llama(GgufWriter& w, const SyntheticSpec& s, DType type, uint64_t seed, ThreadPool& pool) {
  const uint32_t file_type = file_type_of(type);
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
  w.set("general.architecture", GgufValue::str("llama"));
  w.set("general.file_type", GgufValue::u32(file_type));
  if (block > 1) w.set("general.quantization_version", GgufValue::u32(2));
  w.set("llama.context_length", u32(s.context_length));
  w.set("llama.embedding_length", u32(s.hidden_size));
  w.set("llama.block_count", u32(s.num_layers));
  w.set("llama.feed_forward_length", u32(s.intermediate_size));
  w.set("llama.attention.head_count", u32(s.num_heads));
  w.set("llama.attention.head_count_kv", u32(s.num_kv_heads));
  w.set("llama.attention.layer_norm_rms_epsilon", GgufValue::f32(static_cast<float>(s.rms_norm_eps)));
  w.set("llama.rope.freq_base", GgufValue::f32(static_cast<float>(s.rope_base)));
  w.set("llama.rope.dimension_count", u32(head_dim));
  if (s.rope_scale != 1.0) {
    w.set("llama.rope.scaling.type", GgufValue::str("linear"));
    w.set("llama.rope.scaling.factor", GgufValue::f32(static_cast<float>(s.rope_scale)));
  }
  w.set("llama.vocab_size", u32(s.num_vocab));

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
  linear("token_embd.weight", s.num_vocab, d);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight");
    linear(p + "attn_q.weight", d, d);
    linear(p + "attn_k.weight", kv, d);
    linear(p + "attn_v.weight", kv, d);
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
