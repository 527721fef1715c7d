// Synthetic llama, qwen2, qwen3, deepseek2 and deepseek32 models: the hyper-parameters of a preset and deterministic
// random weights, for tests, benchmarks and the demo. Values depend only on (seed, tensor name, row), so
// the same seed gives the same underlying weights in every type and with any number of threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "duet/core/dtype.h"
#include "duet/core/thread_pool.h"
#include "duet/formats/gguf_writer.h"

namespace duet {

struct SyntheticSpec {
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t intermediate_size = 0;
  int64_t num_vocab = 0;
  int64_t context_length = 0;
  double rope_base = 10000.0;
  double rope_scale = 1.0;  // linear factor (YaRN's with yarn_original_context); 1 writes no scaling keys
  // llama, qwen2, qwen3: the head size (0: hidden_size / num_heads; qwen3's is its own, 128).
  int64_t head_dim = 0;
  // llama only: Llama 3 rope scaling (Llama 3.1, R1-Distill-Llama), written as llama.cpp's
  // converter writes it, a rope_freqs.weight of per-pair divisors (llama3_rope_freq_factors);
  // llama3_rope_factor 0: none.
  double llama3_rope_factor = 0.0;
  double llama3_low_freq_factor = 1.0;
  double llama3_high_freq_factor = 4.0;
  int64_t llama3_original_context = 8192;
  double rms_norm_eps = 1e-6;
  bool tied = false;  // no output.weight: the head reuses the token embedding
  // "llama"; "qwen2": f32 biases on q, k and v (blk.N.attn_{q,k,v}.bias), qwen2.* keys; "qwen3":
  // f32 norms of each q and k head (blk.N.attn_{q,k}_norm.weight), qwen3.* keys.
  std::string architecture = "llama";
  // llama, qwen2, qwen3: YaRN instead of linear scaling when yarn_original_context > 0, factor
  // rope_scale, and yarn_attn_factor (1: the key is not written) multiplying its magnitude factor
  // (rope.scaling.yarn_attn_factor, llama.cpp's key for config.json's attn_factor).
  double yarn_attn_factor = 1.0;
  // qwen2 only: a sliding attention window of this many positions (0: none) on the layers from
  // max_window_layers on (qwen2.attention.sliding_window, qwen2.attention.max_window_layers).
  int64_t sliding_window = 0;
  int64_t max_window_layers = 0;
  // llama, qwen2 and qwen3: every (hidden_size / outlier_channels)-th channel of the attn_norm and
  // ffn_norm weights multiplied by outlier_scale, so that a few input channels of q/k/v and
  // gate/up carry activations far larger than the rest, as in trained models (0: none). Random
  // weights alone give every channel the same scale, where activation-aware quantization has
  // nothing to find.
  int64_t outlier_channels = 0;
  double outlier_scale = 1.0;

  // deepseek2 only (DeepSeek-V2/V3: MLA attention, mixture of experts; llama.cpp's deepseek2.*
  // keys). num_kv_heads must equal num_heads; hidden_size need not split into the heads. rope_scale
  // is the YaRN factor (1: no scaling) over yarn_original_context positions (which the llama-like
  // architectures read too, see yarn_attn_factor).
  int64_t q_lora_rank = 0;  // 0: a direct query projection (attn_q), as DeepSeek-V2-Lite
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t yarn_original_context = 0;
  double yarn_log_multiplier = 0.0;  // 0.1 * mscale_all_dim
  int64_t num_dense_layers = 0;      // leading layers with a dense FFN (first_k_dense_replace)
  int64_t expert_intermediate_size = 0;
  int64_t num_experts = 0;  // routed
  int64_t num_shared_experts = 0;
  int64_t num_experts_used = 0;  // top-k
  int64_t num_expert_groups = 1;
  int64_t num_expert_groups_used = 1;
  double expert_weights_scale = 1.0;  // routed_scaling_factor
  bool expert_weights_norm = false;   // norm_topk_prob
  // 1: softmax (DeepSeek-V2); 2: sigmoid with a score correction bias, blk.N.exp_probs_b.bias
  // (DeepSeek-V3).
  uint32_t expert_gating_func = 1;
  // The MLA layout of llama.cpp's newer converters: kv_b split per head into attn_k_b (W_UK
  // transposed, GGUF shape [nope, kv_lora_rank, heads]) and attn_v_b (W_UV, [kv_lora_rank,
  // v_head_dim, heads]), key_length/value_length the latent's widths, key_length_mla and
  // value_length_mla the heads', one kv head. The same values as attn_kv_b of the same seed.
  bool split_mla = false;
  // DeepSeek-V3's multi-token-prediction layers after the last one (deepseek2.nextn_predict_layers):
  // a decoder block as the others (MoE when the model has MoE layers) under blk.N.*, and
  // llama.cpp's nextn tensors blk.N.nextn.{enorm,hnorm,eh_proj,shared_head_norm}.weight; with
  // nextn_own_head also blk.N.nextn.{embed_tokens,shared_head_head}.weight (otherwise the layer
  // shares the model's embedding and head, as V3's checkpoint allows).
  int64_t num_nextn_layers = 0;
  bool nextn_own_head = false;
  // "deepseek32" (DeepSeek-V3.2, llama.cpp's deepseek32.* keys): deepseek2 with a lightning indexer
  // in every layer (blk.N.indexer.{attn_q_b,attn_k,proj}.weight, blk.N.indexer.k_norm.{weight,bias})
  // of index_heads heads of index_head_dim, keeping each query's index_topk best positions; needs
  // q_lora_rank > 0.
  int64_t index_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
};

// A preset by name (see synthetic_preset_names()); throws kInvalidArgument for another name.
SyntheticSpec synthetic_preset(const std::string& name);
// "tiny", "deepseek-coder-1.3b", "deepseek-llm-7b", "r1-distill-llama-8b", "qwen2-tiny",
// "r1-distill-qwen-1.5b", "r1-distill-qwen-7b", "qwen3-tiny", "r1-0528-qwen3-8b", "deepseek-v2-lite", "deepseek-v3",
// "deepseek2-tiny-v2", "deepseek2-tiny-v3".
std::vector<std::string> synthetic_preset_names();

// Adds the <architecture>.* hyper-parameters, general.architecture/file_type and every weight
// tensor (norms, biases and the MoE router in f32, matrices and 3-D expert tensors in `type`) to
// `w`. The pool fills tensors while `w`
// writes, so it must outlive the write. Throws kInvalidArgument for inconsistent dimensions or an
// unknown architecture.
void add_synthetic_model(GgufWriter& w, const SyntheticSpec& spec, DType type, uint64_t seed, ThreadPool& pool);

// The same; kept for the callers written when llama was the only architecture.
inline void add_synthetic_llama(GgufWriter& w, const SyntheticSpec& spec, DType type, uint64_t seed,
                                ThreadPool& pool) {
  add_synthetic_model(w, spec, type, seed, pool);
}

}  // namespace duet
