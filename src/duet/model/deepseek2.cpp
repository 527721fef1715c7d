// The deepseek2 architecture (DeepSeek-V2/V2-Lite/V2.5/V3/R1), written after Hugging Face's
// modeling_deepseek for V2 and V3, on llama.cpp's GGUF layout.
//
// Attention is MLA. The cache holds, per token and layer, the compressed latent c (kv_lora_rank
// floats, after kv_a_layernorm) followed by the rope part of the key k_pe (qk_rope_head_dim
// floats, rotated): 576 floats for V2/V3 instead of 2 x heads x head size. Keys and values are
// never decompressed: with W_UK / W_UV the per-head halves of kv_b,
//   q_nope . k_nope = q_nope . (W_UK c) = (W_UK^T q_nope) . c
//   out_h = W_UV (sum_j p_j c_j),
// so each head's query becomes [W_UK^T q_nope, q_pe] against the cache rows [c, k_pe], all heads
// share that one "kv head", the value is the first kv_lora_rank floats of the same row, and W_UV
// is applied after attention. The PyTorch reference decompresses K and V the plain way, so the
// two formulations check each other.
// A long prefill chunk may instead attend in that plain (expanded) form where the backend allows
// it (Backend::expands_mla_prefill): each head's keys [W_UK c, k_pe] and values W_UV c made from
// the cached latents, 192 + 128 multiply-adds a query, key and head against 576 + 512 (V2's
// shapes), for a decompression per key instead of the absorption per query (see expand()).
//
// Two GGUF layouts of kv_b: attn_kv_b [heads * (nope + v), kv_lora_rank] as converted before
// 2025, or (llama.cpp's converter since) attn_k_b [heads, kv_lora_rank, nope] (W_UK^T already)
// and attn_v_b [heads, v, kv_lora_rank] (W_UV), where key_length / value_length describe the
// latent MQA (kv_lora_rank + rope, kv_lora_rank) and key_length_mla / value_length_mla the heads.
//
// Feed-forward: leading_dense_block_count dense SwiGLU layers, then mixture-of-experts layers:
// a router (softmax scores for V2, sigmoid + e_score_correction_bias for choosing in V3),
// optionally limited to the best expert groups, top-k experts weighted (normalized and/or
// scaled as the version does), plus shared experts.
//
// DeepSeek-V3.2 (GGUF architecture deepseek32, llama.cpp's layout) is V3 with DeepSeek Sparse
// Attention: each layer's lightning indexer scores every earlier position for each query and the
// query attends to its best index_topk positions only. Its query is indexer.attn_q_b times the
// normalised low-rank query (index_heads heads of index_dim), its key indexer.attn_k times the
// layer's input through a LayerNorm (weight and bias, eps 1e-6), both roped on their first
// qk_rope dimensions in halves (NEOX; MLA's own rope is on adjacent pairs), and the heads'
// weights indexer.proj times the input; position s scores, for the query t,
//   sum_h w_h / sqrt(index_heads) * relu(q_h . k_s) / sqrt(index_dim),   s <= t
// (Hugging Face's formulation, in f32). DeepSeek's own kernels (its inference code, vLLM's and
// SGLang's) round q and k to FP8 after a Hadamard rotation (orthogonal: it leaves q . k as it is,
// but not their rounding); DUET_INDEXER=fp8 rounds them as those do (indexer_rows). The
// indexer's keys are the cache's V rows (MLA has none of its own), so paging, prefix sharing and
// persistence keep them with the latents. A query with at most index_topk positions before it
// attends to all of them, as V3 does; one with more attends to its chosen rows, in position
// order (sparse_attention).
#include "duet/model/deepseek2.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <tuple>

#include "duet/core/convert.h"
#include "duet/core/env.h"
#include "duet/core/error.h"
#include "duet/core/quant.h"
#include "duet/model/hparams.h"
#include "duet/model/shard.h"
#include "duet/model/weights.h"

namespace duet {
namespace {

enum class Gating { kSoftmax = 1, kSigmoid = 2 };

struct Ds2Params {
  int64_t q_lora_rank = 0;  // 0: a direct query projection (V2-Lite)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope = 0;
  int64_t qk_rope = 0;
  int64_t v_head_dim = 0;
  int64_t num_dense_layers = 0;
  int64_t num_experts = 0;
  int64_t num_shared_experts = 0;
  int64_t num_experts_used = 0;
  int64_t expert_ff = 0;
  int64_t num_groups = 1;
  int64_t num_groups_used = 1;
  double routed_scaling = 1.0;
  bool norm_topk = false;
  Gating gating = Gating::kSoftmax;
  float softmax_scale = 0.0f;
  // DeepSeek-V3.2's lightning indexer (architecture deepseek32; 0 heads: none).
  int64_t index_heads = 0;
  int64_t index_dim = 0;
  int64_t index_topk = 0;
  bool index_fp8 = false;  // DUET_INDEXER=fp8: q and k rounded as DeepSeek's kernels round them
};

struct Ds2Layer {
  WeightView attn_norm;
  WeightView wq;                      // direct query projection, or
  WeightView wq_a, wq_b;              // the low-rank one
  WeightView q_a_norm;
  WeightView wkv_a;                   // -> [kv_lora_rank + qk_rope]
  WeightView kv_a_norm;
  WeightView wkv_b;                   // [heads * (nope + v), kv_lora_rank], or
  WeightView wk_b, wv_b;              // [heads * kv_lora_rank, nope] and [heads * v, kv_lora_rank]
  std::vector<float> wk_absorbed;     // per head: W_UK^T as [kv_lora_rank, nope], f32 (made at load from kv_b)
  std::vector<uint8_t> wk_rows;       // or kv_b's k rows as they are, [heads * nope, kv_lora_rank] in its type
  bool uk_transposed = false;         // w_uk is wk_rows, run through matmul_heads_t
  WeightView w_uk;                    // wk_b, wk_absorbed as [heads * kv_lora_rank, nope], or wk_rows; on the device
  WeightView wo;
  WeightView ffn_norm;
  bool moe = false;
  WeightView w_gate, w_up, w_down;    // dense layers
  WeightView router;                  // [experts, hidden]
  WeightView router_bias;             // e_score_correction_bias (V3)
  WeightView gate_exps, up_exps, down_exps;
  WeightView gate_shexp, up_shexp, down_shexp;
  // The indexer (deepseek32): its query from the normalised low-rank query, its key and the
  // heads' weights from the layer's input, the key's LayerNorm.
  WeightView ix_q_b;                  // [index_heads * index_dim, q_lora_rank]
  WeightView ix_k;                    // [index_dim, hidden]
  WeightView ix_k_norm, ix_k_norm_b;  // [index_dim]
  WeightView ix_proj;                 // [index_heads, hidden]
};

// Scratch slots of a device's workspace.
enum Scratch {
  kH, kQ, kQa, kKv, kQm, kLat, kAttn, kTmp, kTmpOut, kGate, kUp, kRouter, kMtpIn, kMtpRow,
  kExpLatent, kExpC, kExpKvb, kExpK, kExpV, kExpQ, kExpOut,  // the expanded form's
  kLoraMid, kLoraOut, kLoraU, kLoraTmp, kLoraG,              // LoRA updates'
  kLoraIds, kLoraX, kLoraGate, kLoraUp, kLoraDown,            // routed experts' with LoRA
  kIxQ, kIxK, kIxW                                            // the indexer's
};

// Whether a sequence's n new tokens over its context of C keys attend in the expanded form. It
// costs a decompression per key (kv_b times the latent, then the keys and values laid out) where
// the absorbed form costs W_UK and W_UV per query, and per query and key it saves the difference
// of the two attentions (1088 against 320 multiply-adds a head for V2's shapes). Fitted to V2-Lite
// Q8_0 on the Zen 4's AVX2 table, 2 threads (bench/RESULTS.md, 2026-12-04, twelfth session: pp512,
// pp2048 and pp128 at depth 4096 in both forms): a key's decompression costs about what 160
// query-key pairs save, a query's absorption what 96 do. Expanded when
//   C x kKeyCost < n x kQueryCost + n x (C - n / 2)   (n x (C - n / 2): the pairs, causally),
// so from an empty cache for prompts of more than 128 tokens, and after a long cached prefix for
// chunks of about 160 tokens or more; never for decode.
constexpr int64_t kKeyCost = 160, kQueryCost = 96;
bool expand(const PagedSequence& s) {
  const int64_t n = s.num_tokens, c = s.context_len;
  if (n <= 0 || c < n) return false;  // not a real sequence (a decode graph's padding row)
  return 2 * c * kKeyCost < 2 * n * (kQueryCost + c) - n * n;
}
// Floats of expanded keys, values and decompressed rows a group of heads may hold at once:
// DUET_MLA_EXPAND_MIB (default 128; V2-Lite's 16 heads then go at once up to 3.6k keys, in groups
// of fewer beyond).
int64_t expand_floats() {
  static const int64_t floats = [] {
    const char* v = std::getenv("DUET_MLA_EXPAND_MIB");
    if (v == nullptr || *v == '\0') return int64_t{128} << 18;
    char* end = nullptr;
    const long mib = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || mib < 1 || mib > (1 << 20)) {
      fail(ErrorCode::kInvalidArgument, "DUET_MLA_EXPAND_MIB is '{}', expected a number of MiB from 1", v);
    }
    return int64_t{mib} << 18;
  }();
  return floats;
}

// DUET_INDEXER: f32 (default) or fp8 (the indexer's queries and keys rounded as DeepSeek's
// kernels round them).
bool indexer_fp8() {
  static const bool fp8 = env_choice("DUET_INDEXER", {"f32", "fp8"}) == 1;
  return fp8;
}

// The multi-token-prediction layer's own tensors (its decoder block is a Ds2Layer).
struct MtpWeights {
  WeightView enorm, hnorm;  // RMSNorm of the next token's embedding, and of the model's hidden state
  WeightView eh_proj;       // [hidden, 2 * hidden]: the two, concatenated, into the block
  WeightView head_norm;     // shared_head.norm
  WeightView embed, head;   // the model's embedding and head unless the layer has its own
};

class Deepseek2Model final : public Model {
 public:
  Deepseek2Model(std::shared_ptr<const GgufFile> file, Placement placement)
      : Model(std::move(file), std::move(placement)), weights_(*file_) {
    read_config();
    bind_weights();
    (void)expand_floats();  // a bad DUET_MLA_EXPAND_MIB stops the load, not a later request
  }

  const ModelConfig& config() const override { return config_; }
  int64_t cache_k_dim() const override { return p_.kv_lora_rank + p_.qk_rope; }
  int64_t cache_v_dim() const override { return p_.index_heads > 0 ? p_.index_dim : 0; }
  std::pair<int64_t, int64_t> cache_head_dims() const override { return {cache_k_dim(), p_.kv_lora_rank}; }
  bool values_in_key_rows() const override { return true; }
  int64_t num_mtp_layers() const override { return mtp_layers_; }
  void mtp_forward(const BatchInput& batch, const float* hidden, PagedKvCache& cache, float* logits,
                   float* hidden_out) override;

 private:
  void read_config();
  void bind_weights();
  void bind_layer(int64_t l);
  void absorb_and_lay_out();
  // This rank's shard under tensor parallelism: query heads, dense feed-forward and shared-expert
  // rows, routed experts (expert parallelism), head vocabulary; the latent stays whole.
  void shard_weights();
  void lay_out_parts();
  void embed(PartContext& c) const;
  void attention(int64_t layer, PartContext& c) const;
  // The absorbed form for the sequences of `seqs` (q: the batch's roped queries) into their rows
  // of attn, and the expanded form for one sequence.
  // With kv_b_update (`seqs` is then the whole batch), kv_b's LoRA updates too.
  // With an indexer (`ix`: the batch's indexer queries and weights), a sequence's queries with
  // more than index_topk positions before them attend through sparse_attention.
  struct IndexerRows {
    const float* q = nullptr;  // [n, index_heads, index_dim], roped
    const float* w = nullptr;  // [n, index_heads], scaled by 1 / sqrt(index_heads * index_dim)
  };
  void absorbed_attention(int64_t layer, PartContext& c, const float* q, const PagedAttentionBatch& seqs,
                          float* attn, bool kv_b_update, const IndexerRows* ix) const;
  // The indexer's rows of the batch's tokens: queries and weights into `ix` (scratch), keys to the
  // cache. `h`: the normalised layer input, `qa`: the normalised low-rank query, `ik` and `iw`
  // the indexer's key and weight projections of h (made with the layer's other projections).
  void indexer_rows(int64_t layer, PartContext& c, const float* qa, float* ik, float* iw, IndexerRows& ix) const;
  // How many of a sequence's new tokens (the first ones) attend to every position before them.
  int64_t dense_queries(const PagedSequence& s) const;
  // The cache slots of the index_topk positions (in position order) each of the queries
  // [first, s.num_tokens) of `s` attends to, index_topk a query from chosen[0].
  void choose(int64_t layer, PartContext& c, const PagedSequence& s, int64_t first, const IndexerRows& ix,
              std::vector<int32_t>& chosen) const;
  // Queries [first, s.num_tokens) of `s` (absorbed, in qm) over the positions the indexer chose for
  // each, into their rows of lat.
  void sparse_attention(int64_t layer, PartContext& c, const PagedSequence& s, int64_t first, const float* qm,
                        float* lat, const IndexerRows& ix) const;
  // The indexer runs its choice on the host: its layers' attention on a CPU device.
  void check_indexer_device(const Device& device, int64_t layer) const;
  bool can_expand(const Ds2Layer& L, const Backend& ops) const;
  void expanded_attention(int64_t layer, PartContext& c, const float* q, const PagedSequence& s, float* attn) const;
  void dense_feed_forward(int64_t layer, PartContext& c) const;
  void moe_feed_forward(int64_t layer, PartContext& c) const;
  void experts(int64_t layer, PartContext& c) const;
  void combine(int64_t layer, PartContext& c) const;
  void head(PartContext& c) const;
  // out = down(silu(gate in) * up in) for `rows` rows, with the batch's LoRA updates of `modules`
  // (gate, up, down) of `layer`.
  void mlp(PartContext& c, int64_t layer, std::array<LoraModule, 3> modules, const WeightView& gate,
           const WeightView& up, const WeightView& down, const float* in, int64_t rows, float* out) const;

  // LoRA adapters (every projection but the routed experts'; lora.h).
  void add_lora(PartContext& c, int64_t layer, std::initializer_list<LoraOutput> outputs, const float* in) const {
    Model::add_lora(c, layer, outputs, in, kLoraMid, kLoraOut);
  }
  // The update of kv_b of `layer` that a run of the batch has, or null; whether any run has one
  // (the attention then stays absorbed).
  const LoraPair* kv_b_pair(const BatchInput::LoraRun& run, int64_t layer) const;
  bool kv_b_lora(const PartContext& c, int64_t layer) const;
  // kv_b's update B A in the absorbed form, per run with it: each head's absorbed query gains
  // A^T (B_k,h^T q_nope), before attention (`queries`); its output gains B_v,h (A latent) after.
  void kv_b_lora_queries(PartContext& c, int64_t layer, const float* q, float* qm) const;
  void kv_b_lora_values(PartContext& c, int64_t layer, const float* lat, float* attn) const;
  void enable_adapters();
  const WeightView* lora_base(int64_t layer, LoraModule module) const override;
  LoraShard lora_shard(LoraModule module) const override { return lora_shards_[static_cast<size_t>(module)]; }
  bool derive_lora(int64_t layer, LoraModule module, LoraAdapter& adapter) const override;
  bool lora_has_experts(int64_t layer) const override { return layers_[static_cast<size_t>(layer)].moe; }
  std::pair<int64_t, int64_t> lora_expert_range() const override { return {expert0_, experts_}; }
  // The rows of a run whose adapter updates `layer`'s routed experts, [row0, row0 + rows): each
  // token's experts (local ids, -1: another rank's) with their updates, weighted, added to out,
  // each expert's matrices multiplying all its rows at once.
  void lora_experts(PartContext& c, int64_t layer, const LoraAdapter& adapter, int64_t row0, int64_t rows,
                    const int32_t* ids, float* out) const;

  WeightBinder weights_;
  ModelConfig config_;
  Ds2Params p_;
  RopeParams rope_;
  WeightView token_embd_;
  std::vector<Ds2Layer> layers_;
  WeightView output_norm_;
  WeightView output_;
  // Tensor parallelism (one rank: everything): this rank's query heads, dense feed-forward rows,
  // shared-expert rows, routed experts [expert0_, expert0_ + experts_), and head vocabulary rows.
  Communicator* tensor_ = nullptr;
  int64_t heads_ = 0, ff_ = 0, shared_ff_ = 0, expert0_ = 0, experts_ = 0;
  int64_t vocab0_ = 0, vocab_ = 0, vocab_share_ = 0;
  WeightShards shards_;
  std::array<LoraShard, kNumLoraModules> lora_shards_{};  // the same rows and columns as the base's
  // The MTP layer (layers_[num_layers]) when loaded, and what mtp_forward runs with.
  int64_t mtp_layers_ = 0;
  MtpWeights mtp_;
  std::unique_ptr<Workspace> mtp_scratch_, mtp_carried_;
  // Carried buffers: the residual stream; for MoE layers the normalised rows, each token's experts
  // and weights, the shared experts' output and the routed experts' sum.
  int x_ = 0, h_ = 0, ids_ = 0, weights_of_ = 0, shared_ = 0, moe_ = 0;
};

void Deepseek2Model::read_config() {
  const GgufFile& f = *file_;
  ModelConfig& c = config_;
  c.architecture = f.get_string("general.architecture");
  c.name = f.get_string_or("general.name", "");
  const HParams hp(f, c.architecture);
  c.hidden_size = hp.positive("embedding_length");
  c.num_layers = hp.layer_count("block_count");
  c.intermediate_size = hp.positive("feed_forward_length");
  c.num_heads = hp.positive("attention.head_count");
  c.num_kv_heads = c.num_heads;
  c.context_length = hp.int_or("context_length", 4096);
  c.rms_norm_eps = static_cast<float>(hp.float_or("attention.layer_norm_rms_epsilon", 1e-6));
  p_.q_lora_rank = hp.int_or("attention.q_lora_rank", 0);
  p_.kv_lora_rank = hp.positive("attention.kv_lora_rank");
  // Files with the split kv_b say the heads' sizes under *_mla (their key_length is the latent's).
  const bool mla_keys = hp.has("attention.key_length_mla");
  const std::string key_key = mla_keys ? "attention.key_length_mla" : "attention.key_length";
  const int64_t key_length = hp.positive(key_key);
  p_.v_head_dim = hp.positive(mla_keys ? "attention.value_length_mla" : "attention.value_length");
  p_.qk_rope = hp.positive("rope.dimension_count");
  p_.qk_nope = key_length - p_.qk_rope;
  if (p_.qk_nope <= 0 || p_.qk_rope % 2 != 0) {
    fail(ErrorCode::kInvalidArgument, "'{}': {} is {} and {} is {}: expected an even rope part smaller than the key",
         f.path(), hp.key(key_key), key_length, hp.key("rope.dimension_count"), p_.qk_rope);
  }
  if (mla_keys && hp.int_or("attention.key_length", p_.kv_lora_rank + p_.qk_rope) != p_.kv_lora_rank + p_.qk_rope) {
    fail(ErrorCode::kInvalidArgument, "'{}': {} is {}, expected {} (kv_lora_rank {} + rope {}) beside {}", f.path(),
         hp.key("attention.key_length"), hp.int_or("attention.key_length", 0), p_.kv_lora_rank + p_.qk_rope,
         p_.kv_lora_rank, p_.qk_rope, hp.key(key_key));
  }
  c.head_dim = key_length;
  p_.num_dense_layers = hp.int_or("leading_dense_block_count", 0);
  p_.num_experts = hp.int_or("expert_count", 0);
  p_.num_shared_experts = hp.int_or("expert_shared_count", 0);
  p_.num_experts_used = hp.int_or("expert_used_count", 0);
  p_.expert_ff = hp.int_or("expert_feed_forward_length", 0);
  p_.num_groups = std::max<int64_t>(1, hp.int_or("expert_group_count", 1));
  p_.num_groups_used = std::max<int64_t>(1, hp.int_or("expert_group_used_count", p_.num_groups));
  p_.routed_scaling = hp.float_or("expert_weights_scale", 1.0);
  p_.norm_topk = f.get_bool_or(hp.key("expert_weights_norm"), false);
  const int64_t gating = hp.int_or("expert_gating_func", 1);  // absent in older V2 files: softmax
  if (gating != 1 && gating != 2) {
    fail(ErrorCode::kUnsupported, "'{}': {} is {} (expected 1 softmax or 2 sigmoid)", f.path(),
         hp.key("expert_gating_func"), gating);
  }
  p_.gating = static_cast<Gating>(gating);
  if (p_.num_dense_layers < c.num_layers) {
    if (p_.num_experts <= 0 || p_.num_experts_used <= 0 || p_.num_experts_used > p_.num_experts || p_.expert_ff <= 0) {
      fail(ErrorCode::kInvalidArgument, "'{}': mixture-of-experts layers need {} ({}) >= {} ({}) > 0 and {} > 0",
           f.path(), hp.key("expert_count"), p_.num_experts, hp.key("expert_used_count"), p_.num_experts_used,
           hp.key("expert_feed_forward_length"));
    }
    if (p_.num_experts % p_.num_groups != 0 || p_.num_groups_used > p_.num_groups) {
      fail(ErrorCode::kInvalidArgument, "'{}': {} experts cannot split into {} groups of which {} are used", f.path(),
           p_.num_experts, p_.num_groups, p_.num_groups_used);
    }
  }
  // RoPE on adjacent pairs of the rope part (the checkpoints' own layout), optionally YaRN.
  rope_.mode = RopeMode::kNormal;
  rope_.dim = p_.qk_rope;
  rope_.freq_base = hp.float_or("rope.freq_base", 10000.0);
  double mscale = 1.0;
  const std::string scaling = hp.string_or("rope.scaling.type", "none");
  if (scaling == "yarn") {
    const double factor = hp.float_or("rope.scaling.factor", 1.0);
    if (!(factor >= 1.0)) {
      fail(ErrorCode::kInvalidArgument, "'{}': {} is {}, expected >= 1", f.path(), hp.key("rope.scaling.factor"), factor);
    }
    rope_.freq_scale = 1.0 / factor;
    rope_.yarn_orig_ctx = hp.float_or("rope.scaling.original_context_length", static_cast<double>(c.context_length));
    // yarn_log_multiplier is 0.1 * mscale_all_dim; with mscale == mscale_all_dim (every DeepSeek
    // release) the rotary's own magnitude factor is 1 and only the softmax scale grows.
    const double log_mul = hp.float_or("rope.scaling.yarn_log_multiplier", 0.0);
    mscale = factor > 1.0 ? 1.0 + log_mul * std::log(factor) : 1.0;
    c.rope_scaling_factor = factor;
  } else if (scaling != "none") {
    fail(ErrorCode::kUnsupported, "'{}': {} '{}' is not supported for deepseek2 (expected yarn or none)", f.path(),
         hp.key("rope.scaling.type"), scaling);
  }
  c.rope = rope_;
  p_.softmax_scale = static_cast<float>(mscale * mscale / std::sqrt(static_cast<double>(key_length)));
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  c.num_vocab = hp.int_or("vocab_size", embd != nullptr && embd->shape.size() == 2 ? embd->shape[1] : 0);
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  // DeepSeek-V3 has one MTP layer; with more, the first is the drafter (chained on itself).
  if (placement_.mtp && hp.int_or("nextn_predict_layers", 0) > 0) mtp_layers_ = 1;
  if (c.architecture == "deepseek32") {
    p_.index_heads = hp.positive("attention.indexer.head_count");
    p_.index_dim = hp.positive("attention.indexer.key_length");
    p_.index_topk = hp.positive("attention.indexer.top_k");
    if (p_.q_lora_rank <= 0) {
      fail(ErrorCode::kInvalidArgument, "'{}': the indexer reads the low-rank query, and {} is missing or 0",
           f.path(), hp.key("attention.q_lora_rank"));
    }
    if (p_.index_dim < p_.qk_rope) {
      fail(ErrorCode::kInvalidArgument, "'{}': {} is {}, less than the {} rotated dimensions", f.path(),
           hp.key("attention.indexer.key_length"), p_.index_dim, p_.qk_rope);
    }
    p_.index_fp8 = indexer_fp8();
    if (p_.index_fp8 && (p_.index_dim & (p_.index_dim - 1)) != 0) {
      fail(ErrorCode::kInvalidArgument, "'{}': DUET_INDEXER=fp8 rotates the indexer's heads by a Hadamard transform, "
           "which needs {} ({}) to be a power of two", f.path(), hp.key("attention.indexer.key_length"), p_.index_dim);
    }
  }
}

void Deepseek2Model::bind_weights() {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size;
  token_embd_ = weights_.matrix("token_embd.weight", c.num_vocab, d);
  layers_.resize(static_cast<size_t>(c.num_layers + mtp_layers_));
  for (int64_t l = 0; l < c.num_layers + mtp_layers_; ++l) bind_layer(l);
  output_norm_ = weights_.vector("output_norm.weight", d);
  output_ = c.tied_embeddings ? token_embd_ : weights_.matrix("output.weight", c.num_vocab, d);
  if (mtp_layers_ > 0) {
    const std::string pre = "blk." + std::to_string(c.num_layers) + ".nextn.";
    mtp_.enorm = weights_.vector(pre + "enorm.weight", d);
    mtp_.hnorm = weights_.vector(pre + "hnorm.weight", d);
    mtp_.eh_proj = weights_.matrix(pre + "eh_proj.weight", d, 2 * d);
    mtp_.head_norm = weights_.vector(pre + "shared_head_norm.weight", d);
    mtp_.embed = weights_.has(pre + "embed_tokens.weight") ? weights_.matrix(pre + "embed_tokens.weight", c.num_vocab, d)
                                                            : token_embd_;
    mtp_.head = weights_.has(pre + "shared_head_head.weight")
                    ? weights_.matrix(pre + "shared_head_head.weight", c.num_vocab, d)
                    : output_;
  }
  weights_.finish();
  absorb_and_lay_out();
  enable_adapters();
}

void Deepseek2Model::enable_adapters() {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, H = c.num_heads, qk = p_.qk_nope + p_.qk_rope;
  LoraShape lora;
  lora.architecture = c.architecture;
  lora.num_layers = c.num_layers;
  lora.num_heads = lora.num_kv_heads = H;
  if (p_.q_lora_rank > 0) {
    lora.set(LoraModule::kQA, d, p_.q_lora_rank);
    lora.set(LoraModule::kQB, p_.q_lora_rank, H * qk);
  } else {
    lora.set(LoraModule::kQ, d, H * qk);
  }
  lora.set(LoraModule::kKvA, d, p_.kv_lora_rank + p_.qk_rope);
  lora.set(LoraModule::kKvB, p_.kv_lora_rank, H * (p_.qk_nope + p_.v_head_dim));
  lora.set(LoraModule::kO, H * p_.v_head_dim, d);
  if (p_.num_dense_layers > 0) {
    lora.set(LoraModule::kGate, d, c.intermediate_size);
    lora.set(LoraModule::kUp, d, c.intermediate_size);
    lora.set(LoraModule::kDown, c.intermediate_size, d);
  }
  const int64_t shared = p_.expert_ff * p_.num_shared_experts;
  if (p_.num_dense_layers < c.num_layers) {
    lora.num_experts = p_.num_experts;
    lora.expert_ff = p_.expert_ff;
    lora.hidden = d;
  }
  if (p_.num_dense_layers < c.num_layers && shared > 0) {
    lora.set(LoraModule::kShGate, d, shared);
    lora.set(LoraModule::kShUp, d, shared);
    lora.set(LoraModule::kShDown, shared, d);
  }
  enable_lora(lora);
}

const WeightView* Deepseek2Model::lora_base(int64_t layer, LoraModule module) const {
  const Ds2Layer& L = layers_[static_cast<size_t>(layer)];
  const bool q_lora = p_.q_lora_rank > 0, shared = L.moe && p_.num_shared_experts > 0;
  switch (module) {
    case LoraModule::kQ: return q_lora ? nullptr : &L.wq;
    case LoraModule::kQA: return q_lora ? &L.wq_a : nullptr;
    case LoraModule::kQB: return q_lora ? &L.wq_b : nullptr;
    case LoraModule::kKvA: return &L.wkv_a;
    case LoraModule::kKvB: return &L.wkv_b;  // its update is derived (derive_lora), whichever layout
    case LoraModule::kO: return &L.wo;
    case LoraModule::kGate: return L.moe ? nullptr : &L.w_gate;
    case LoraModule::kUp: return L.moe ? nullptr : &L.w_up;
    case LoraModule::kDown: return L.moe ? nullptr : &L.w_down;
    case LoraModule::kShGate: return shared ? &L.gate_shexp : nullptr;
    case LoraModule::kShUp: return shared ? &L.up_shexp : nullptr;
    case LoraModule::kShDown: return shared ? &L.down_shexp : nullptr;
    default: return nullptr;
  }
}

// kv_b's update goes through the absorbed form (kv_b_lora_queries, kv_b_lora_values), which
// multiplies by each head's key rows of B transposed ([heads * rank, nope]: row h * rank + j is
// column j of head h's nope rows) and by A transposed ([kv_lora_rank, rank]): both made here, once,
// from this rank's heads.
bool Deepseek2Model::derive_lora(int64_t layer, LoraModule module, LoraAdapter& adapter) const {
  if (module != LoraModule::kKvB) return false;
  const LoraPair& pair = adapter.pair(layer, module);
  const int64_t r = pair.a.rows, kv_rank = pair.a.cols, nope = p_.qk_nope, step = p_.qk_nope + p_.v_head_dim;
  const auto* a = static_cast<const float*>(pair.a.data);
  const auto* b = static_cast<const float*>(pair.b.data);
  if (pair.a.type != DType::kF32 || pair.b.type != DType::kF32 || pair.b.rows != heads_ * step || pair.b.cols != r) {
    fail(ErrorCode::kInternal, "kv_b's LoRA pair is {} x {} ({}), expected {} x {} in f32", pair.b.rows, pair.b.cols,
         dtype_name(pair.b.type), heads_ * step, r);
  }
  std::vector<float> bk_t(static_cast<size_t>(heads_ * r * nope));
  for (int64_t h = 0; h < heads_; ++h) {
    for (int64_t i = 0; i < nope; ++i) {
      for (int64_t j = 0; j < r; ++j) bk_t[static_cast<size_t>((h * r + j) * nope + i)] = b[(h * step + i) * r + j];
    }
  }
  std::vector<float> a_t(static_cast<size_t>(kv_rank * r));
  for (int64_t j = 0; j < r; ++j) {
    for (int64_t col = 0; col < kv_rank; ++col) a_t[static_cast<size_t>(col * r + j)] = a[j * kv_rank + col];
  }
  adapter.set_derived(layer, module, 0, std::move(bk_t), heads_ * r, nope);
  adapter.set_derived(layer, module, 1, std::move(a_t), kv_rank, r);
  return true;
}

const LoraPair* Deepseek2Model::kv_b_pair(const BatchInput::LoraRun& run, int64_t layer) const {
  const LoraAdapter* adapter = lora_adapter(run.adapter);
  if (adapter == nullptr || layer >= adapter->num_layers()) return nullptr;
  const LoraPair& p = adapter->pair(layer, LoraModule::kKvB);
  return p.present() ? &p : nullptr;
}

bool Deepseek2Model::kv_b_lora(const PartContext& c, int64_t layer) const {
  return std::any_of(c.batch.lora_runs.begin(), c.batch.lora_runs.end(),
                     [&](const BatchInput::LoraRun& run) { return kv_b_pair(run, layer) != nullptr; });
}

void Deepseek2Model::kv_b_lora_queries(PartContext& c, int64_t layer, const float* q, float* qm) const {
  Backend& ops = c.ops;
  const int64_t H = heads_, nope = p_.qk_nope, qk = p_.qk_nope + p_.qk_rope, rank = p_.kv_lora_rank;
  const int64_t row = rank + p_.qk_rope;
  for (const BatchInput::LoraRun& run : c.batch.lora_runs) {
    const LoraPair* pair = kv_b_pair(run, layer);
    if (pair == nullptr) continue;
    const LoraPair& p = *pair;
    const int64_t m = run.rows, r = p.a.rows;
    float* u = c.scratch.f32(kLoraU, m * H * r);
    float* tmp = c.scratch.f32(kLoraTmp, m * (nope + r));
    ops.matmul_heads(p.derived[0], HeadRows{H, r, 0, r}, q + run.row0 * H * qk, H * qk, qk, m, u, H * r, r, tmp);
    float* delta = c.scratch.f32(kLoraOut, m * H * rank);
    ops.matmul(p.derived[1], u, m * H, delta);
    // Into each head's absorbed part of qm ([n, H, rank + rope]), through a compact copy.
    float* g = c.scratch.f32(kLoraG, m * H * rank);
    float* qm_run = qm + run.row0 * H * row;
    ops.copy_2d(qm_run, row, g, rank, m * H, rank);
    ops.add(g, delta, m * H * rank);
    ops.copy_2d(g, rank, qm_run, row, m * H, rank);
  }
}

void Deepseek2Model::kv_b_lora_values(PartContext& c, int64_t layer, const float* lat, float* attn) const {
  Backend& ops = c.ops;
  const int64_t H = heads_, nope = p_.qk_nope, rank = p_.kv_lora_rank, vd = p_.v_head_dim;
  for (const BatchInput::LoraRun& run : c.batch.lora_runs) {
    const LoraPair* pair = kv_b_pair(run, layer);
    if (pair == nullptr) continue;
    const LoraPair& p = *pair;
    const int64_t m = run.rows, r = p.a.rows;
    float* w = c.scratch.f32(kLoraU, m * H * r);
    ops.matmul(p.a, lat + run.row0 * H * rank, m * H, w);
    float* delta = c.scratch.f32(kLoraOut, m * H * vd);
    float* tmp = c.scratch.f32(kLoraTmp, m * (r + vd));
    ops.matmul_heads(p.b, HeadRows{H, vd, nope, nope + vd}, w, H * r, r, m, delta, H * vd, vd, tmp);
    ops.add(attn + run.row0 * H * vd, delta, m * H * vd);
  }
}

void Deepseek2Model::bind_layer(int64_t l) {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, H = c.num_heads;
  const int64_t q_dim = H * (p_.qk_nope + p_.qk_rope);
  Ds2Layer& L = layers_[static_cast<size_t>(l)];
  const std::string pre = "blk." + std::to_string(l) + ".";
  L.attn_norm = weights_.vector(pre + "attn_norm.weight", d);
  if (p_.q_lora_rank > 0) {
    L.wq_a = weights_.matrix(pre + "attn_q_a.weight", p_.q_lora_rank, d);
    L.q_a_norm = weights_.vector(pre + "attn_q_a_norm.weight", p_.q_lora_rank);
    L.wq_b = weights_.matrix(pre + "attn_q_b.weight", q_dim, p_.q_lora_rank);
  } else {
    L.wq = weights_.matrix(pre + "attn_q.weight", q_dim, d);
  }
  L.wkv_a = weights_.matrix(pre + "attn_kv_a_mqa.weight", p_.kv_lora_rank + p_.qk_rope, d);
  L.kv_a_norm = weights_.vector(pre + "attn_kv_a_norm.weight", p_.kv_lora_rank);
  if (weights_.has(pre + "attn_kv_b.weight") || !weights_.has(pre + "attn_k_b.weight")) {
    L.wkv_b = weights_.matrix(pre + "attn_kv_b.weight", H * (p_.qk_nope + p_.v_head_dim), p_.kv_lora_rank);
  } else {
    L.wk_b = weights_.experts(pre + "attn_k_b.weight", H, p_.kv_lora_rank, p_.qk_nope);
    L.wv_b = weights_.experts(pre + "attn_v_b.weight", H, p_.v_head_dim, p_.kv_lora_rank);
  }
  L.wo = weights_.matrix(pre + "attn_output.weight", d, H * p_.v_head_dim);
  if (p_.index_heads > 0) {
    L.ix_q_b = weights_.matrix(pre + "indexer.attn_q_b.weight", p_.index_heads * p_.index_dim, p_.q_lora_rank);
    L.ix_k = weights_.matrix(pre + "indexer.attn_k.weight", p_.index_dim, d);
    L.ix_k_norm = weights_.vector(pre + "indexer.k_norm.weight", p_.index_dim);
    L.ix_k_norm_b = weights_.vector(pre + "indexer.k_norm.bias", p_.index_dim);
    L.ix_proj = weights_.matrix(pre + "indexer.proj.weight", p_.index_heads, d);
  }
  L.ffn_norm = weights_.vector(pre + "ffn_norm.weight", d);
  L.moe = l >= p_.num_dense_layers && p_.num_dense_layers < c.num_layers;  // an MTP layer: as the model's last
  if (!L.moe) {
    L.w_gate = weights_.matrix(pre + "ffn_gate.weight", c.intermediate_size, d);
    L.w_up = weights_.matrix(pre + "ffn_up.weight", c.intermediate_size, d);
    L.w_down = weights_.matrix(pre + "ffn_down.weight", d, c.intermediate_size);
    return;
  }
  L.router = weights_.matrix(pre + "ffn_gate_inp.weight", p_.num_experts, d);
  if (p_.gating == Gating::kSigmoid && weights_.has(pre + "exp_probs_b.bias")) {
    L.router_bias = weights_.vector(pre + "exp_probs_b.bias", p_.num_experts);
  }
  L.gate_exps = weights_.experts(pre + "ffn_gate_exps.weight", p_.num_experts, p_.expert_ff, d);
  L.up_exps = weights_.experts(pre + "ffn_up_exps.weight", p_.num_experts, p_.expert_ff, d);
  L.down_exps = weights_.experts(pre + "ffn_down_exps.weight", p_.num_experts, d, p_.expert_ff);
  if (p_.num_shared_experts > 0) {
    const int64_t ff = p_.expert_ff * p_.num_shared_experts;
    L.gate_shexp = weights_.matrix(pre + "ffn_gate_shexp.weight", ff, d);
    L.up_shexp = weights_.matrix(pre + "ffn_up_shexp.weight", ff, d);
    L.down_shexp = weights_.matrix(pre + "ffn_down_shexp.weight", d, ff);
  }
}

void Deepseek2Model::absorb_and_lay_out() {
  const ModelConfig& c = config_;
  const int64_t H = c.num_heads;

  // W_UK^T of every head as [kv_lora_rank, nope]: attn_k_b as it is in the file (its own type, so
  // decode reads no more than the file holds). From a quantized kv_b, where the layer's backend has
  // the transposed product per head: the k rows of kv_b copied once in their own type (the backend
  // may pack kv_b for W_UV and drop its original), a step reading them and not an f32 W_UK^T of
  // 8 (Q4_0) or 3.8 (Q8_0) times their bytes; Q4_0 and Q5_0 rows as the Q8_0 blocks of the same
  // values (convert_row_to_q8_0_exact), which the CPU backend reads in place in decode instead of
  // decoding Q4_0 rows every step (V2-Lite Q4_0 decode: that decoding was 6% of the step).
  // Otherwise (a float kv_b, whose f32 copy is at most twice its bytes and gives the bits of the
  // split layout's f32 matmul; FP8, whose logits are those of an f32 checkpoint of the decoded
  // weights, bit for bit) the k half of kv_b transposed, once, in f32. W_UV is then attn_v_b, or
  // the v half of kv_b.
  const int64_t rank = p_.kv_lora_rank, nope = p_.qk_nope, vd = p_.v_head_dim;
  std::vector<float> row(static_cast<size_t>(rank));
  for (int64_t l = 0; l < c.num_layers + mtp_layers_; ++l) {
    Ds2Layer& L = layers_[static_cast<size_t>(l)];
    if (l < c.num_layers && placement_.device({PartKind::kAttention, l}).remote_rank() >= 0) continue;  // another rank's
    if (L.wk_b.data != nullptr) {
      L.w_uk = L.wk_b;
      continue;
    }
    const PartId part = l < c.num_layers ? PartId{PartKind::kAttention, l} : PartId{PartKind::kHead, -1};
    const DType t = L.wkv_b.type;
    const bool quantized = t != DType::kF32 && t != DType::kF16 && t != DType::kBF16 && t != DType::kFP8_E4M3_B128;
    if (quantized && ops(part).has_matmul_heads_t(L.wkv_b)) {
      const bool as_q8_0 = (t == DType::kQ4_0 || t == DType::kQ5_0) &&
                           ops(part).has_matmul_heads_t(WeightView{"w_uk", DType::kQ8_0, 0, rank, nullptr});
      const DType ct = as_q8_0 ? DType::kQ8_0 : t;
      const size_t rb = row_size(ct, rank);
      L.wk_rows.resize(static_cast<size_t>(H * nope) * rb);
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < nope; ++i) {
          uint8_t* dst = L.wk_rows.data() + static_cast<size_t>(h * nope + i) * rb;
          const uint8_t* src = L.wkv_b.row(h * (nope + vd) + i);
          if (as_q8_0) {
            convert_row_to_q8_0_exact(t, src, reinterpret_cast<BlockQ8_0*>(dst), rank);
          } else {
            std::memcpy(dst, src, rb);
          }
        }
      }
      L.w_uk = WeightView{"w_uk", ct, H * nope, rank, L.wk_rows.data()};
      L.uk_transposed = true;
      continue;
    }
    L.wk_absorbed.assign(static_cast<size_t>(H * rank * nope), 0.0f);
    for (int64_t h = 0; h < H; ++h) {
      float* dst = L.wk_absorbed.data() + h * rank * nope;
      for (int64_t i = 0; i < nope; ++i) {
        dequantize_row_ref(L.wkv_b.type, L.wkv_b.row(h * (nope + vd) + i), row.data(), rank);
        for (int64_t r = 0; r < rank; ++r) dst[r * nope + i] = row[static_cast<size_t>(r)];
      }
    }
    L.w_uk = WeightView{"w_uk", DType::kF32, H * rank, nope, L.wk_absorbed.data()};
  }
  shard_weights();
  lay_out_parts();
}

void Deepseek2Model::shard_weights() {
  const ModelConfig& c = config_;
  heads_ = c.num_heads;
  ff_ = c.intermediate_size;
  shared_ff_ = p_.expert_ff * p_.num_shared_experts;
  expert0_ = 0;
  experts_ = p_.num_experts;
  vocab_ = vocab_share_ = c.num_vocab;
  const int T = placement_.tensor_size();
  if (T == 1) return;
  const ParallelGroup& g = *placement_.parallel;
  tensor_ = &g.tensor();
  const int64_t H = c.num_heads, qk = p_.qk_nope + p_.qk_rope, rank = p_.kv_lora_rank, vd = p_.v_head_dim;
  const auto [h0, hn] = g.shard(H, 1, "the attention heads");
  heads_ = hn;
  const bool any_moe = p_.num_dense_layers < c.num_layers;
  const auto [f0, fn] = p_.num_dense_layers > 0 ? g.shard(c.intermediate_size, 1, "the feed-forward size")
                                                : std::pair<int64_t, int64_t>{0, 0};
  ff_ = fn;
  int64_t s0 = 0, sn = 0;
  if (any_moe && shared_ff_ > 0) std::tie(s0, sn) = g.shard(shared_ff_, 1, "the shared experts' size");
  if (any_moe) std::tie(expert0_, experts_) = g.shard(p_.num_experts, 1, "the routed experts");
  shared_ff_ = sn;
  const auto rows = [](int64_t r0, int64_t n) { return LoraShard{r0, n, 0, -1}; };
  const auto cols = [](int64_t c0, int64_t n) { return LoraShard{0, -1, c0, n}; };
  lora_shards_[static_cast<size_t>(LoraModule::kQ)] = rows(h0 * qk, hn * qk);
  lora_shards_[static_cast<size_t>(LoraModule::kQB)] = rows(h0 * qk, hn * qk);
  lora_shards_[static_cast<size_t>(LoraModule::kKvB)] = rows(h0 * (p_.qk_nope + vd), hn * (p_.qk_nope + vd));
  lora_shards_[static_cast<size_t>(LoraModule::kO)] = cols(h0 * vd, hn * vd);
  lora_shards_[static_cast<size_t>(LoraModule::kGate)] = rows(f0, fn);
  lora_shards_[static_cast<size_t>(LoraModule::kUp)] = rows(f0, fn);
  lora_shards_[static_cast<size_t>(LoraModule::kDown)] = cols(f0, fn);
  lora_shards_[static_cast<size_t>(LoraModule::kShGate)] = rows(s0, sn);
  lora_shards_[static_cast<size_t>(LoraModule::kShUp)] = rows(s0, sn);
  lora_shards_[static_cast<size_t>(LoraModule::kShDown)] = cols(s0, sn);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    Ds2Layer& L = layers_[static_cast<size_t>(l)];
    if (placement_.device({PartKind::kAttention, l}).remote_rank() >= 0) continue;
    L.wq = WeightShards::rows(L.wq, h0 * qk, hn * qk);
    L.wq_b = WeightShards::rows(L.wq_b, h0 * qk, hn * qk);
    const int64_t uk_rows = L.uk_transposed ? p_.qk_nope : rank;  // W_UK's rows per head
    L.w_uk = WeightShards::rows(L.w_uk, h0 * uk_rows, hn * uk_rows);
    L.wv_b = WeightShards::rows(L.wv_b, h0 * vd, hn * vd);
    L.wkv_b = WeightShards::rows(L.wkv_b, h0 * (p_.qk_nope + vd), hn * (p_.qk_nope + vd));
    L.wo = shards_.columns(L.wo, h0 * vd, hn * vd);
    if (!L.moe) {
      L.w_gate = WeightShards::rows(L.w_gate, f0, fn);
      L.w_up = WeightShards::rows(L.w_up, f0, fn);
      L.w_down = shards_.columns(L.w_down, f0, fn);
      continue;
    }
    L.gate_shexp = WeightShards::rows(L.gate_shexp, s0, sn);
    L.up_shexp = WeightShards::rows(L.up_shexp, s0, sn);
    L.down_shexp = shards_.columns(L.down_shexp, s0, sn);
    L.gate_exps = WeightShards::rows(L.gate_exps, expert0_ * p_.expert_ff, experts_ * p_.expert_ff);
    L.up_exps = WeightShards::rows(L.up_exps, expert0_ * p_.expert_ff, experts_ * p_.expert_ff);
    L.down_exps = WeightShards::rows(L.down_exps, expert0_ * c.hidden_size, experts_ * c.hidden_size);
  }
  vocab_share_ = (c.num_vocab + T - 1) / T;
  vocab0_ = std::min<int64_t>(c.num_vocab, vocab_share_ * g.tensor_rank());
  vocab_ = std::min<int64_t>(c.num_vocab, vocab0_ + vocab_share_) - vocab0_;
  output_ = WeightShards::rows(output_, vocab0_, vocab_);
}

void Deepseek2Model::lay_out_parts() {
  const int64_t d = config_.hidden_size, k = p_.num_experts_used;
  constexpr int64_t f = sizeof(float);
  x_ = add_carried("x", d * f);
  const bool any_moe = p_.num_dense_layers < config_.num_layers;
  if (any_moe) {
    h_ = add_carried("h", d * f);
    ids_ = add_carried("expert ids", k * static_cast<int64_t>(sizeof(int32_t)));
    weights_of_ = add_carried("expert weights", k * f);
    if (p_.num_shared_experts > 0) shared_ = add_carried("shared experts", d * f);
    moe_ = add_carried("experts", d * f);
  }
  std::vector<std::pair<PartId, WeightRef>> tensors;
  const PartId embed_part{PartKind::kEmbed, -1}, head_part{PartKind::kHead, -1};
  add_part(embed_part, {}, {x_}, [this](PartContext& c) { embed(c); });
  tensors.push_back({embed_part, {&token_embd_, false}});
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    Ds2Layer& L = layers_[static_cast<size_t>(l)];
    const PartId attn{PartKind::kAttention, l}, ffn{PartKind::kFeedForward, l}, exps{PartKind::kExperts, l};
    add_part(attn, {x_}, {x_}, [this, l](PartContext& c) { attention(l, c); });
    for (WeightView* v : {&L.attn_norm, &L.q_a_norm, &L.kv_a_norm, &L.ix_k_norm, &L.ix_k_norm_b}) {
      tensors.push_back({attn, {v, false}});
    }
    // Experts and heads are row ranges of these (the backend serves them from the same copies).
    for (WeightView* v :
         {&L.wq, &L.wq_a, &L.wq_b, &L.wkv_a, &L.wkv_b, &L.wv_b, &L.wo, &L.ix_q_b, &L.ix_k, &L.ix_proj}) {
      tensors.push_back({attn, {v, true}});
    }
    check_indexer_device(placement_.device(attn), l);
    tensors.push_back({attn, {&L.w_uk, !L.uk_transposed}});  // not a matmul's when transposed
    tensors.push_back({ffn, {&L.ffn_norm, false}});
    if (!L.moe) {
      add_part(ffn, {x_}, {x_}, [this, l](PartContext& c) { dense_feed_forward(l, c); });
      for (WeightView* v : {&L.w_gate, &L.w_up, &L.w_down}) tensors.push_back({ffn, {v, true}});
      continue;
    }
    // Routed first into their own sum, then the shared experts, then the residual, whatever the
    // devices: the same additions in the same order under any map.
    std::vector<int> ffn_writes = {h_, ids_, weights_of_};
    if (p_.num_shared_experts > 0) ffn_writes.push_back(shared_);
    add_part(ffn, {x_}, ffn_writes, [this, l](PartContext& c) { moe_feed_forward(l, c); });
    add_part(exps, {h_, ids_, weights_of_}, {moe_}, [this, l](PartContext& c) { experts(l, c); });
    std::vector<int> combine_reads = {x_, moe_};
    if (p_.num_shared_experts > 0) combine_reads.push_back(shared_);
    add_part(ffn, combine_reads, {x_}, [this, l](PartContext& c) { combine(l, c); });
    tensors.push_back({ffn, {&L.router_bias, false}});
    for (WeightView* v : {&L.router, &L.gate_shexp, &L.up_shexp, &L.down_shexp}) tensors.push_back({ffn, {v, true}});
    for (WeightView* v : {&L.gate_exps, &L.up_exps, &L.down_exps}) tensors.push_back({exps, {v, true}});
  }
  add_part(head_part, {x_}, {}, [this](PartContext& c) { head(c); });
  tensors.push_back({head_part, {&output_norm_, false}});
  tensors.push_back({head_part, {&output_, true}});
  if (mtp_layers_ > 0) {
    // The MTP layer runs after the model, on the head's device (mtp_forward).
    Ds2Layer& L = layers_.back();
    for (WeightView* v : {&mtp_.enorm, &mtp_.hnorm, &mtp_.head_norm, &L.attn_norm, &L.q_a_norm, &L.kv_a_norm,
                          &L.ffn_norm, &L.router_bias, &L.ix_k_norm, &L.ix_k_norm_b}) {
      tensors.push_back({head_part, {v, false}});
    }
    tensors.push_back({head_part, {&L.w_uk, !L.uk_transposed}});
    for (WeightView* v : {&mtp_.eh_proj, &L.wq, &L.wq_a, &L.wq_b, &L.wkv_a, &L.wkv_b, &L.wv_b, &L.wo,
                          &L.w_gate, &L.w_up, &L.w_down, &L.router, &L.gate_shexp, &L.up_shexp, &L.down_shexp,
                          &L.gate_exps, &L.up_exps, &L.down_exps, &L.ix_q_b, &L.ix_k, &L.ix_proj}) {
      tensors.push_back({head_part, {v, true}});
    }
    check_indexer_device(placement_.device(head_part), config_.num_layers);
    if (mtp_.embed.data != token_embd_.data) tensors.push_back({head_part, {&mtp_.embed, false}});
    if (mtp_.head.data != output_.data) tensors.push_back({head_part, {&mtp_.head, true}});
  }
  load_weights(tensors);
  if (mtp_layers_ > 0) {
    // The embedding and head may be the model's, whose views load_weights repointed.
    if (mtp_.embed.name == token_embd_.name) mtp_.embed = token_embd_;
    if (mtp_.head.name == output_.name) mtp_.head = output_;
    Device& device = placement_.device(head_part);
    mtp_scratch_ = std::make_unique<Workspace>(device);
    mtp_carried_ = std::make_unique<Workspace>(device);
  }
}

void Deepseek2Model::embed(PartContext& c) const {
  c.ops.get_rows(token_embd_, c.batch.token_ids.data(), c.batch.num_tokens(), c.buffer<float>(x_));
}

// Only the rows that need logits go through the output norm and head.
void Deepseek2Model::head(PartContext& c) const {
  const BatchInput& batch = c.batch;
  const int64_t d = config_.hidden_size;
  const int64_t rows = static_cast<int64_t>(batch.logits_rows.size());
  const float* x = c.buffer<float>(x_);
  if (batch.hidden_out != nullptr) c.ops.rms_norm(x, f32(output_norm_), batch.hidden_out, batch.num_tokens(), d, config_.rms_norm_eps);
  if (rows == 0) return;
  float* h = c.scratch.f32(kH, rows * d);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t src = batch.logits_rows[static_cast<size_t>(r)];
    c.ops.rms_norm(x + src * d, f32(output_norm_), h + r * d, 1, d, config_.rms_norm_eps);
  }
  if (tensor_ == nullptr) {
    c.ops.matmul(output_, h, rows, c.logits);
  } else {
    // This rank's share of the vocabulary, then every rank's, row by row.
    const int T = tensor_->size();
    const int64_t V = config_.num_vocab;
    float* mine = c.scratch.f32(kQ, rows * vocab_share_);
    float* all = c.scratch.f32(kAttn, rows * vocab_share_ * T);
    if (vocab_ > 0) c.ops.matmul(output_, h, rows, mine);
    tensor_->allgather(mine, all, float_bytes(rows * vocab_share_));
    for (int t = 0; t < T; ++t) {
      const int64_t v0 = std::min<int64_t>(V, vocab_share_ * t);
      const int64_t count = std::min<int64_t>(V, v0 + vocab_share_) - v0;
      for (int64_t r = 0; r < rows; ++r) std::copy_n(all + (t * rows + r) * vocab_share_, count, c.logits + r * V + v0);
    }
  }
  write_hidden_rows(c, h);
}

void Deepseek2Model::attention(int64_t layer, PartContext& c) const {
  const ModelConfig& cfg = config_;
  const Ds2Layer& L = layers_[static_cast<size_t>(layer)];
  const BatchInput& batch = c.batch;
  Backend& ops = c.ops;
  const int64_t n = batch.num_tokens(), d = cfg.hidden_size;
  const int64_t H = heads_, nope = p_.qk_nope, rope = p_.qk_rope, rank = p_.kv_lora_rank, vd = p_.v_head_dim;
  const int64_t qk = nope + rope, row = rank + rope;
  float* x = c.buffer<float>(x_);
  float* h = c.scratch.f32(kH, n * d);
  ops.rms_norm(x, f32(L.attn_norm), h, n, d, cfg.rms_norm_eps);
  float* q = c.scratch.f32(kQ, n * H * qk);
  // The cache row of each token: [kv_a_layernorm(c), rope(k_pe)].
  float* kv = c.scratch.f32(kKv, n * row);
  IndexerRows ix;
  if (p_.q_lora_rank > 0) {
    float* qa = c.scratch.f32(kQa, n * p_.q_lora_rank);
    // With an indexer, its key and weight projections of h in the same pass.
    const bool indexer = p_.index_heads > 0;
    float* ik = indexer ? c.scratch.f32(kIxK, n * p_.index_dim) : nullptr;
    float* iw = indexer ? c.scratch.f32(kIxW, n * p_.index_heads) : nullptr;
    const Backend::MatmulPart a[] = {{L.wq_a, qa}, {L.wkv_a, kv}, {L.ix_k, ik}, {L.ix_proj, iw}};
    ops.matmul_shared(std::span(a, indexer ? 4 : 2), h, n);
    add_lora(c, layer, {{LoraModule::kQA, qa}, {LoraModule::kKvA, kv}}, h);
    ops.rms_norm(qa, f32(L.q_a_norm), qa, n, p_.q_lora_rank, cfg.rms_norm_eps);
    if (indexer) indexer_rows(layer, c, qa, ik, iw, ix);
    ops.matmul(L.wq_b, qa, n, q);
    add_lora(c, layer, {{LoraModule::kQB, q}}, qa);
  } else {
    const Backend::MatmulPart a[] = {{L.wq, q}, {L.wkv_a, kv}};
    ops.matmul_shared(a, h, n);
    add_lora(c, layer, {{LoraModule::kQ, q}, {LoraModule::kKvA, kv}}, h);
  }
  for (int64_t t = 0; t < n; ++t) ops.rms_norm(kv + t * row, f32(L.kv_a_norm), kv + t * row, 1, rank, cfg.rms_norm_eps);
  RopeParams k_rope = rope_;
  k_rope.offset = rank;
  ops.rope(kv, n, 1, row, batch.positions.data(), k_rope);
  RopeParams q_rope = rope_;
  q_rope.offset = nope;
  ops.rope(q, n, H, qk, batch.positions.data(), q_rope);
  ops.store_kv(kv, batch.slot_mapping.data(), n, row, c.cache.k(layer), c.cache.dtype());

  float* attn = c.scratch.f32(kAttn, n * H * vd);
  const std::vector<PagedSequence>& seqs = batch.attention.seqs;
  // kv_b's LoRA updates go through the absorbed form: with one, every sequence stays absorbed.
  const bool kv_b_update = kv_b_lora(c, layer);
  const IndexerRows* indexed = p_.index_heads > 0 ? &ix : nullptr;
  // A sequence with sparse queries stays absorbed: the expanded form's keys are worth making for
  // many queries that read each of them, and each sparse query reads a set of its own (tried: a
  // 512-token chunk at depth 8192 on V3.2's head sizes took several times as long).
  const auto expands = [&](const PagedSequence& s) { return expand(s) && dense_queries(s) == s.num_tokens; };
  if (kv_b_update || !can_expand(L, ops) || std::none_of(seqs.begin(), seqs.end(), expands)) {
    absorbed_attention(layer, c, q, batch.attention, attn, kv_b_update, indexed);
  } else {
    PagedAttentionBatch rest;  // the sequences that stay absorbed
    rest.block_size = batch.attention.block_size;
    for (const PagedSequence& s : seqs) {
      if (expands(s)) {
        expanded_attention(layer, c, q, s, attn);
      } else {
        rest.seqs.push_back(s);
        rest.num_tokens += s.num_tokens;
      }
    }
    if (!rest.seqs.empty()) absorbed_attention(layer, c, q, rest, attn, false, indexed);
  }
  ops.matmul(L.wo, attn, n, h);
  add_lora(c, layer, {{LoraModule::kO, h}}, attn);
  if (tensor_ != nullptr) tensor_->allreduce_sum(h, n * d);  // every rank's heads
  ops.add(x, h, n * d);
}

void Deepseek2Model::absorbed_attention(int64_t layer, PartContext& c, const float* q,
                                        const PagedAttentionBatch& seqs, float* attn, bool kv_b_update,
                                        const IndexerRows* ix) const {
  const Ds2Layer& L = layers_[static_cast<size_t>(layer)];
  Backend& ops = c.ops;
  const int64_t n = c.batch.num_tokens();
  const int64_t H = heads_, nope = p_.qk_nope, rope = p_.qk_rope, rank = p_.kv_lora_rank, vd = p_.v_head_dim;
  const int64_t qk = nope + rope, row = rank + rope;
  float* qm = c.scratch.f32(kQm, n * H * row);
  float* lat = c.scratch.f32(kLat, n * H * rank);
  float* tmp = c.scratch.f32(kTmp, n * (std::max(nope, rank) + std::max(rank, vd)));  // matmul_heads' scratch
  // The projections on each run of consecutive rows of these sequences (all n rows at once when
  // every sequence is here).
  auto each_run = [&](auto&& f) {
    size_t i = 0;
    while (i < seqs.seqs.size()) {
      const int64_t r0 = seqs.seqs[i].token_start;
      int64_t r1 = r0 + seqs.seqs[i].num_tokens;
      for (++i; i < seqs.seqs.size() && seqs.seqs[i].token_start == r1; ++i) r1 += seqs.seqs[i].num_tokens;
      if (r1 > r0) f(r0, r1 - r0);
    }
  };
  // Absorbed queries [n, H, rank + rope]: W_UK^T q_nope per head, then q_pe (every head's in one
  // copy: the rows of q and qm taken per token and head).
  each_run([&](int64_t r0, int64_t m) {
    const float* qr = q + r0 * H * qk;
    float* qmr = qm + r0 * H * row;
    if (L.uk_transposed) {
      ops.matmul_heads_t(L.w_uk, HeadRows{H, nope, 0, nope}, qr, H * qk, qk, m, qmr, H * row, row);
    } else {
      ops.matmul_heads(L.w_uk, HeadRows{H, rank, 0, rank}, qr, H * qk, qk, m, qmr, H * row, row, tmp);
    }
    ops.copy_2d(qr + nope, qk, qmr + rank, row, m * H, rope);
  });
  if (kv_b_update) kv_b_lora_queries(c, layer, q, qm);
  const Backend::AttentionShape shape{H, 1, row, rank, row, row, c.cache.dtype()};
  if (ix == nullptr) {
    ops.paged_attention(qm, c.cache.k(layer), c.cache.k(layer), lat, seqs, shape, p_.softmax_scale);
  } else {
    // Each sequence's first queries over every position before them, the rest sparse.
    PagedAttentionBatch dense;
    dense.block_size = seqs.block_size;
    for (const PagedSequence& s : seqs.seqs) {
      const auto m = static_cast<int32_t>(dense_queries(s));
      if (m == 0) continue;
      dense.seqs.push_back(
          PagedSequence{s.token_start, m, s.context_len - s.num_tokens + m, s.block_table, s.num_blocks});
      dense.num_tokens += m;
    }
    if (!dense.seqs.empty()) {
      ops.paged_attention(qm, c.cache.k(layer), c.cache.k(layer), lat, dense, shape, p_.softmax_scale);
    }
    for (const PagedSequence& s : seqs.seqs) {
      const int64_t m = dense_queries(s);
      if (m < s.num_tokens) sparse_attention(layer, c, s, m, qm, lat, *ix);
    }
  }
  // Per head, the latent output through W_UV (the v rows of kv_b).
  const bool split_kv_b = L.wv_b.data != nullptr;
  each_run([&](int64_t r0, int64_t m) {
    ops.matmul_heads(split_kv_b ? L.wv_b : L.wkv_b,
                     split_kv_b ? HeadRows{H, vd, 0, vd} : HeadRows{H, vd, nope, nope + vd}, lat + r0 * H * rank,
                     H * rank, rank, m, attn + r0 * H * vd, H * vd, vd, tmp);
  });
  if (kv_b_update) kv_b_lora_values(c, layer, lat, attn);
}

void Deepseek2Model::indexer_rows(int64_t layer, PartContext& c, const float* qa, float* ik, float* iw,
                                  IndexerRows& ix) const {
  const Ds2Layer& L = layers_[static_cast<size_t>(layer)];
  Backend& ops = c.ops;
  const BatchInput& batch = c.batch;
  const int64_t n = batch.num_tokens(), Hi = p_.index_heads, D = p_.index_dim;
  float* iq = c.scratch.f32(kIxQ, n * Hi * D);
  ops.matmul(L.ix_q_b, qa, n, iq);
  // The key's LayerNorm (mean removed, then weight and bias), in double per row.
  const float* gamma = f32(L.ix_k_norm);
  const float* beta = f32(L.ix_k_norm_b);
  for (int64_t t = 0; t < n; ++t) {
    float* k = ik + t * D;
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < D; ++i) mean += k[i];
    mean /= static_cast<double>(D);
    for (int64_t i = 0; i < D; ++i) var += (k[i] - mean) * (k[i] - mean);
    const double inv = 1.0 / std::sqrt(var / static_cast<double>(D) + 1e-6);
    for (int64_t i = 0; i < D; ++i) k[i] = static_cast<float>((k[i] - mean) * inv) * gamma[i] + beta[i];
  }
  RopeParams ix_rope = rope_;  // MLA's frequencies, on halves
  ix_rope.mode = RopeMode::kNeox;
  ix_rope.offset = 0;
  ops.rope(iq, n, Hi, D, batch.positions.data(), ix_rope);
  ops.rope(ik, n, 1, D, batch.positions.data(), ix_rope);
  if (p_.index_fp8) {
    // DeepSeek's rounding: each head's query and each key rotated (Hadamard, times D^-1/2), then
    // to e4m3 with a power-of-two scale per 128 values, and taken as the values those stand for.
    // The scales are powers of two, so the dot products of these values are DeepSeek's products
    // of codes times its scales, which its kernel applies after the relu.
    ops.index_fp8_round(iq, n * Hi, D);
    ops.index_fp8_round(ik, n, D);
  }
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Hi * D)));
  for (int64_t i = 0; i < n * Hi; ++i) iw[i] *= scale;
  ops.store_kv(ik, batch.slot_mapping.data(), n, D, c.cache.v(layer), c.cache.dtype());
  ix.q = iq;
  ix.w = iw;
}

int64_t Deepseek2Model::dense_queries(const PagedSequence& s) const {
  if (p_.index_heads == 0) return s.num_tokens;
  const int64_t first = s.context_len - s.num_tokens;  // the first new token's position
  return std::clamp<int64_t>(p_.index_topk - first, 0, s.num_tokens);
}

// The backend's index_topk over the sequence's indexer keys in the cache: each position's
// scores (every query head against its key) summed over the heads with relu, the index_topk best
// of the positions up to the query's own (ties to the earlier) in position order; then their slots.
void Deepseek2Model::choose(int64_t layer, PartContext& c, const PagedSequence& s, int64_t first,
                            const IndexerRows& ix, std::vector<int32_t>& chosen) const {
  Backend& ops = c.ops;
  const int64_t Hi = p_.index_heads, D = p_.index_dim, K = p_.index_topk;
  const int64_t C = s.context_len, p0 = C - s.num_tokens, bs = c.batch.attention.block_size;
  std::vector<int64_t> slots(static_cast<size_t>(C));
  for (int64_t p = 0; p < C; ++p) slots[static_cast<size_t>(p)] = s.slot(p, bs);
  const int64_t m = s.num_tokens - first, r0 = s.token_start + first;
  chosen.resize(static_cast<size_t>(m * K));
  ops.index_topk(ix.q + r0 * Hi * D, c.cache.v(layer), c.cache.dtype(), slots.data(), C, ix.w + r0 * Hi, m, Hi, D,
                 p0 + first, K, chosen.data());
  for (int32_t& k : chosen) k = static_cast<int32_t>(slots[static_cast<size_t>(k)]);  // positions to slots
}

// Each query over its chosen slots of the cache in position order: a sequence of its own whose
// blocks are single slots (block size 1, the slots as its table), nothing copied.
void Deepseek2Model::sparse_attention(int64_t layer, PartContext& c, const PagedSequence& s, int64_t first,
                                      const float* qm, float* lat, const IndexerRows& ix) const {
  const int64_t H = heads_, rank = p_.kv_lora_rank, row = rank + p_.qk_rope, K = p_.index_topk;
  const int64_t m = s.num_tokens - first;
  std::vector<int32_t> chosen;
  choose(layer, c, s, first, ix, chosen);
  PagedAttentionBatch one_each;
  one_each.block_size = 1;
  one_each.num_tokens = static_cast<int32_t>(m);
  for (int64_t j = 0; j < m; ++j) {
    one_each.seqs.push_back(PagedSequence{static_cast<int32_t>(s.token_start + first + j), 1, static_cast<int32_t>(K),
                                          chosen.data() + j * K, static_cast<int32_t>(K)});
  }
  const Backend::AttentionShape shape{H, 1, row, rank, row, row, c.cache.dtype()};
  c.ops.paged_attention(qm, c.cache.k(layer), c.cache.k(layer), lat, one_each, shape, p_.softmax_scale);
}

void Deepseek2Model::check_indexer_device(const Device& device, int64_t layer) const {
  if (p_.index_heads > 0 && device.remote_rank() < 0 && !device.host_accessible()) {
    fail(ErrorCode::kUnsupported,
         "layer {}'s attention is on {}: DeepSeek-V3.2's indexer chooses its positions on the host, so its "
         "layers' attention needs a CPU device (a device map may still put their experts on a GPU)",
         layer, device.name());
  }
}

// W_UK from kv_b's rows (a quantized kv_b), or W_UK^T through the transposed product.
bool Deepseek2Model::can_expand(const Ds2Layer& L, const Backend& ops) const {
  return ops.expands_mla_prefill() && (L.uk_transposed || ops.has_matmul_heads_t(L.w_uk));
}

// The sequence's C cached latents read back once; then per group of heads (as many as
// expand_floats() allows) their keys [W_UK c, k_pe] and values W_UV c made into a cache of their own
// (positions in order, block after block), and paged attention over it with the queries as they
// are ([q_nope, q_pe], roped), into the sequence's rows of attn.
void Deepseek2Model::expanded_attention(int64_t layer, PartContext& c, const float* q, const PagedSequence& s,
                                        float* attn) const {
  const Ds2Layer& L = layers_[static_cast<size_t>(layer)];
  Backend& ops = c.ops;
  const int64_t H = heads_, nope = p_.qk_nope, rope = p_.qk_rope, rank = p_.kv_lora_rank, vd = p_.v_head_dim;
  const int64_t qk = nope + rope, row = rank + rope, C = s.context_len, n = s.num_tokens;
  const int64_t bs = c.batch.attention.block_size, blocks = (C + bs - 1) / bs;
  std::vector<int64_t> slots(static_cast<size_t>(C));
  for (int64_t p = 0; p < C; ++p) slots[static_cast<size_t>(p)] = s.slot(p, bs);
  float* latent = c.scratch.f32(kExpLatent, C * row);
  ops.load_kv(c.cache.k(layer), c.cache.dtype(), slots.data(), C, row, latent);
  float* cs = c.scratch.f32(kExpC, C * rank);  // the latents alone, the decompression's input
  ops.copy_2d(latent, row, cs, rank, C, rank);

  const int64_t per_head = blocks * bs * (qk + vd) + C * (nope + vd);
  const int64_t hg = std::clamp<int64_t>(expand_floats() / per_head, 1, H);
  float* kvb = c.scratch.f32(kExpKvb, C * hg * (nope + vd));
  float* keys = c.scratch.f32(kExpK, blocks * bs * hg * qk);
  float* values = c.scratch.f32(kExpV, blocks * bs * hg * vd);
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  PagedAttentionBatch one;  // the sequence over its own cache, its queries from row 0
  one.block_size = static_cast<int32_t>(bs);
  one.num_tokens = static_cast<int32_t>(n);
  one.seqs.push_back(PagedSequence{0, s.num_tokens, s.context_len, table.data(), static_cast<int32_t>(blocks)});
  for (int64_t h0 = 0; h0 < H; h0 += hg) {
    const int64_t g = std::min(hg, H - h0);
    if (L.uk_transposed) {
      // A quantized kv_b: the group's k and v rows in one matmul.
      ops.matmul(L.wkv_b.rows_from(h0 * (nope + vd), g * (nope + vd)), cs, C, kvb);
      ops.copy_2d(kvb, nope + vd, keys, qk, C * g, nope);
      ops.copy_2d(kvb + nope, nope + vd, values, vd, C * g, vd);
    } else {
      // W_UK^T (attn_k_b, or a float kv_b's k rows transposed at load) through the transposed
      // product, the same bits for both layouts; W_UV as attn_v_b's rows, or per head.
      ops.matmul_heads_t(L.w_uk, HeadRows{g, rank, h0 * rank, rank}, cs, rank, 0, C, keys, g * qk, qk);
      if (L.wv_b.data != nullptr) {
        ops.matmul(L.wv_b.rows_from(h0 * vd, g * vd), cs, C, values);
      } else {
        for (int64_t j = 0; j < g; ++j) {
          ops.matmul(L.wkv_b.rows_from((h0 + j) * (nope + vd) + nope, vd), cs, C, kvb);
          ops.copy_2d(kvb, vd, values + j * vd, g * vd, C, vd);
        }
      }
    }
    for (int64_t j = 0; j < g; ++j) ops.copy_2d(latent + rank, row, keys + j * qk + nope, g * qk, C, rope);

    // The group's queries and outputs: the batch's own rows when it is every head.
    const float* qg = q + s.token_start * H * qk;
    float* out = attn + s.token_start * H * vd;
    if (g < H) {
      float* qc = c.scratch.f32(kExpQ, n * g * qk);
      ops.copy_2d(qg + h0 * qk, H * qk, qc, g * qk, n, g * qk);
      qg = qc;
      out = c.scratch.f32(kExpOut, n * g * vd);
    }
    const Backend::AttentionShape shape{g, g, qk, vd, g * qk, g * vd, KvDtype::kF32};
    ops.paged_attention(qg, keys, values, out, one, shape, p_.softmax_scale);
    if (g < H) ops.copy_2d(out, g * vd, attn + s.token_start * H * vd + h0 * vd, H * vd, n, g * vd);
  }
}

void Deepseek2Model::mlp(PartContext& c, int64_t layer, std::array<LoraModule, 3> modules, const WeightView& gate,
                         const WeightView& up, const WeightView& down, const float* in, int64_t rows, float* out) const {
  float* g = c.scratch.f32(kGate, rows * gate.rows);
  float* u = c.scratch.f32(kUp, rows * up.rows);
  const Backend::MatmulPart gate_up[] = {{gate, g}, {up, u}};
  c.ops.matmul_shared(gate_up, in, rows);
  add_lora(c, layer, {{modules[0], g}, {modules[1], u}}, in);
  c.ops.silu_mul(g, u, g, rows * gate.rows);
  c.ops.matmul(down, g, rows, out);
  add_lora(c, layer, {{modules[2], out}}, g);
}

void Deepseek2Model::dense_feed_forward(int64_t layer, PartContext& c) const {
  const Ds2Layer& L = layers_[static_cast<size_t>(layer)];
  const int64_t n = c.batch.num_tokens(), d = config_.hidden_size;
  float* x = c.buffer<float>(x_);
  float* h = c.scratch.f32(kH, n * d);
  float* out = c.scratch.f32(kTmpOut, n * d);
  c.ops.rms_norm(x, f32(L.ffn_norm), h, n, d, config_.rms_norm_eps);
  mlp(c, layer, {LoraModule::kGate, LoraModule::kUp, LoraModule::kDown}, L.w_gate, L.w_up, L.w_down, h, n, out);
  if (tensor_ != nullptr) tensor_->allreduce_sum(out, n * d);  // every rank's share of the columns
  c.ops.add(x, out, n * d);
}

// The normalised rows, each token's experts (HF's MoEGate) and the shared experts' output.
void Deepseek2Model::moe_feed_forward(int64_t layer, PartContext& c) const {
  const Ds2Layer& L = layers_[static_cast<size_t>(layer)];
  const int64_t n = c.batch.num_tokens(), d = config_.hidden_size;
  float* h = c.buffer<float>(h_);
  c.ops.rms_norm(c.buffer<float>(x_), f32(L.ffn_norm), h, n, d, config_.rms_norm_eps);
  float* logits = c.scratch.f32(kRouter, n * p_.num_experts);
  c.ops.matmul(L.router, h, n, logits);
  MoeRouting r;
  r.gating = p_.gating == Gating::kSoftmax ? MoeRouting::Gating::kSoftmax : MoeRouting::Gating::kSigmoid;
  r.num_experts = p_.num_experts;
  r.num_used = p_.num_experts_used;
  r.num_groups = p_.num_groups;
  r.num_groups_used = p_.num_groups_used;
  r.norm_topk = p_.norm_topk;
  r.routed_scaling = p_.routed_scaling;
  r.bias = L.router_bias.data != nullptr ? f32(L.router_bias) : nullptr;
  c.ops.moe_route(logits, n, r, c.buffer<int32_t>(ids_), c.buffer<float>(weights_of_));
  if (p_.num_shared_experts > 0) {
    mlp(c, layer, {LoraModule::kShGate, LoraModule::kShUp, LoraModule::kShDown}, L.gate_shexp, L.up_shexp, L.down_shexp,
        h, n, c.buffer<float>(shared_));
  }
}

void Deepseek2Model::experts(int64_t layer, PartContext& c) const {
  const Ds2Layer& L = layers_[static_cast<size_t>(layer)];
  const MoeExperts w{L.gate_exps, L.up_exps, L.down_exps, experts_, p_.expert_ff};
  const int32_t* ids = c.buffer<int32_t>(ids_);
  const int64_t n = c.batch.num_tokens(), k = p_.num_experts_used;
  if (tensor_ != nullptr) {
    // Expert parallelism: this rank's experts, numbered from 0; the others' picks are skipped.
    int32_t* mine = c.scratch.i32(kRouter, n * k);
    for (int64_t i = 0; i < n * k; ++i) {
      const int64_t e = ids[i] - expert0_;
      mine[i] = e >= 0 && e < experts_ ? static_cast<int32_t>(e) : -1;
    }
    ids = mine;
  }
  // Rows run with an adapter that updates this layer's experts go their own way; the fused kernels
  // skip their picks.
  std::vector<const BatchInput::LoraRun*> runs;
  for (const BatchInput::LoraRun& run : c.batch.lora_runs) {
    const LoraAdapter* adapter = lora_adapter(run.adapter);
    if (adapter != nullptr && layer < adapter->num_layers() && adapter->has_experts(layer)) runs.push_back(&run);
  }
  if (runs.empty()) {
    c.ops.moe_experts(w, c.buffer<float>(h_), ids, c.buffer<float>(weights_of_), n, k, c.buffer<float>(moe_));
    return;
  }
  int32_t* rest = c.scratch.i32(kLoraIds, n * k);
  std::copy_n(ids, n * k, rest);
  for (const BatchInput::LoraRun* run : runs) std::fill_n(rest + run->row0 * k, run->rows * k, -1);
  c.ops.moe_experts(w, c.buffer<float>(h_), rest, c.buffer<float>(weights_of_), n, k, c.buffer<float>(moe_));
  for (const BatchInput::LoraRun* run : runs) {
    lora_experts(c, layer, *lora_adapter(run->adapter), run->row0, run->rows, ids, c.buffer<float>(moe_));
  }
}

// Expert by expert, the run's rows that chose it (gathered): out_t += weight * (down_e + B A)(silu(
// (gate_e + B A) x) * (up_e + B A) x), with the expert's own rows of the stacked matrices, each read
// once for all its rows (on a host-accessible device: Model::add_lora_adapter checks it).
void Deepseek2Model::lora_experts(PartContext& c, int64_t layer, const LoraAdapter& adapter, int64_t row0, int64_t rows,
                                  const int32_t* ids, float* out) const {
  const Ds2Layer& L = layers_[static_cast<size_t>(layer)];
  Backend& ops = c.ops;
  const int64_t d = config_.hidden_size, ff = p_.expert_ff, k = p_.num_experts_used;
  const float* h = c.buffer<float>(h_);
  const float* weights = c.buffer<float>(weights_of_);
  // Each (local) expert's picks among the run's rows: the index into ids and weights, t * k + j.
  std::vector<std::vector<int64_t>> picks(static_cast<size_t>(experts_));
  for (int64_t i = row0 * k; i < (row0 + rows) * k; ++i) {
    if (ids[i] >= 0) picks[static_cast<size_t>(ids[i])].push_back(i);
  }
  float* x = c.scratch.f32(kLoraX, rows * d);
  float* gate = c.scratch.f32(kLoraGate, rows * ff);
  float* up = c.scratch.f32(kLoraUp, rows * ff);
  float* down = c.scratch.f32(kLoraDown, rows * d);
  float* mid = c.scratch.f32(kLoraMid, rows * adapter.rank());
  float* delta = c.scratch.f32(kLoraOut, rows * std::max(ff, d));
  // y += B (A x) for m rows, when the expert's matrix has an update.
  const auto update = [&](const LoraPair& p, const float* in, int64_t m, float* y, int64_t dim) {
    if (!p.present()) return;
    ops.matmul(p.a, in, m, mid);
    ops.matmul(p.b, mid, m, delta);
    ops.add(y, delta, m * dim);
  };
  for (int64_t e = 0; e < experts_; ++e) {
    const std::vector<int64_t>& chose = picks[static_cast<size_t>(e)];
    if (chose.empty()) continue;
    const auto m = static_cast<int64_t>(chose.size());
    for (int64_t r = 0; r < m; ++r) std::copy_n(h + chose[static_cast<size_t>(r)] / k * d, d, x + r * d);
    const Backend::MatmulPart gate_up[] = {{L.gate_exps.rows_from(e * ff, ff), gate}, {L.up_exps.rows_from(e * ff, ff), up}};
    ops.matmul_shared(gate_up, x, m);
    const int64_t global = e + expert0_;
    const bool updated = global < adapter.num_experts(layer);
    if (updated) {
      update(adapter.expert_pair(layer, global, 0), x, m, gate, ff);
      update(adapter.expert_pair(layer, global, 1), x, m, up, ff);
    }
    ops.silu_mul(gate, up, gate, m * ff);
    ops.matmul(L.down_exps.rows_from(e * d, d), gate, m, down);
    if (updated) update(adapter.expert_pair(layer, global, 2), gate, m, down, d);
    for (int64_t r = 0; r < m; ++r) {
      const int64_t i = chose[static_cast<size_t>(r)];
      const float w = weights[i];
      float* o = out + i / k * d;
      const float* y = down + r * d;
      for (int64_t col = 0; col < d; ++col) o[col] += w * y[col];
    }
  }
}

void Deepseek2Model::combine(int64_t layer, PartContext& c) const {
  (void)layer;
  const int64_t n = c.batch.num_tokens(), d = config_.hidden_size;
  float* sum = c.buffer<float>(moe_);
  if (p_.num_shared_experts > 0) c.ops.add(sum, c.buffer<float>(shared_), n * d);
  // Every rank's experts and share of the shared ones.
  if (tensor_ != nullptr) tensor_->allreduce_sum(sum, n * d);
  c.ops.add(c.buffer<float>(x_), sum, n * d);
}

// The MTP module of DeepSeek-V3 (its paper, section 2.2, as vLLM and SGLang run it): for a row
// with the model's final normalised hidden state h at position i and the token t(i+1) after it,
//   x = eh_proj([enorm(embed(t(i+1))), hnorm(h)]),  x = block(x) (MLA over its own KV, MoE),
// and the logits of t(i+2) are head(shared_head.norm(x)). Drafting K tokens chains the layer on
// its own output x at i+1, i+2, ... (V3 trained one module; chaining is what vLLM and SGLang do).
void Deepseek2Model::mtp_forward(const BatchInput& batch, const float* hidden, PagedKvCache& cache, float* logits,
                                 float* hidden_out) {
  if (mtp_layers_ == 0) Model::mtp_forward(batch, hidden, cache, logits, hidden_out);
  batch.validate(config_.num_vocab, cache.num_slots());
  const PartId head_part{PartKind::kHead, -1};
  Device& device = placement_.device(head_part);
  const std::unique_lock<std::mutex> held = device.hold();
  Backend& ops = device.backend();
  const int64_t n = batch.num_tokens(), d = config_.hidden_size, layer = config_.num_layers;
  const float eps = config_.rms_norm_eps;
  const std::vector<CarriedBuffer>& buffers = carried();
  std::vector<void*> pointers(buffers.size(), nullptr);
  for (size_t b = 0; b < buffers.size(); ++b) {
    pointers[b] = mtp_carried_->f32(static_cast<int>(b), (n * buffers[b].bytes_per_token + 3) / 4);
  }
  PartContext c{batch, device, ops, *mtp_scratch_, pointers, cache, logits};
  float* in = c.scratch.f32(kMtpIn, n * 2 * d);
  float* row = c.scratch.f32(kMtpRow, n * d);
  ops.get_rows(mtp_.embed, batch.token_ids.data(), n, row);
  ops.rms_norm(row, f32(mtp_.enorm), row, n, d, eps);
  ops.copy_2d(row, d, in, 2 * d, n, d);
  ops.rms_norm(hidden, f32(mtp_.hnorm), row, n, d, eps);
  ops.copy_2d(row, d, in + d, 2 * d, n, d);
  float* x = c.buffer<float>(x_);
  ops.matmul(mtp_.eh_proj, in, n, x);
  attention(layer, c);
  if (layers_.back().moe) {
    moe_feed_forward(layer, c);
    experts(layer, c);
    combine(layer, c);
  } else {
    dense_feed_forward(layer, c);
  }
  ops.copy_2d(x, d, hidden_out, d, n, d);
  const int64_t rows = static_cast<int64_t>(batch.logits_rows.size());
  if (rows == 0) return;
  float* h = c.scratch.f32(kH, rows * d);
  for (int64_t r = 0; r < rows; ++r) {
    ops.rms_norm(x + batch.logits_rows[static_cast<size_t>(r)] * d, f32(mtp_.head_norm), h + r * d, 1, d, eps);
  }
  ops.matmul(mtp_.head, h, rows, logits);
}

}  // namespace

std::unique_ptr<Model> make_deepseek2_model(std::shared_ptr<const GgufFile> file, Placement placement) {
  return std::make_unique<Deepseek2Model>(std::move(file), std::move(placement));
}

std::pair<int64_t, int64_t> deepseek2_cache_dims(const GgufFile& file) {
  const std::string arch = file.get_string("general.architecture");
  const HParams hp(file, arch);
  // deepseek32: the indexer's keys as the V rows.
  return {hp.positive("attention.kv_lora_rank") + hp.positive("rope.dimension_count"),
          arch == "deepseek32" ? hp.positive("attention.indexer.key_length") : 0};
}

}  // namespace duet
