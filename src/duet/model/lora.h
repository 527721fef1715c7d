// LoRA adapters: a low-rank update W + scale * B A of a model's linear layers, one adapter per
// request, many adapters over one copy of the base weights (vLLM's multi-LoRA serving). An adapter
// is read from a PEFT folder (adapter_config.json and adapter_model.safetensors, as PEFT's
// save_pretrained writes it) or a GGUF adapter (llama.cpp's convert_lora_to_gguf) into f32
// copies, with the scale folded into B and B's q/k rows in the base's order (llama.cpp's
// adjacent-pair layout for a llama GGUF, Hugging Face's halves otherwise).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "duet/backend/backend.h"

namespace duet {

// An adapter as the command line names it: --lora-modules NAME=PATH.
struct LoraSource {
  std::string name;
  std::string path;
};

// The projections an adapter may update (PEFT's target_modules names in comments): the llama-like
// ones, then deepseek2's MLA projections and its MoE layers' shared experts (a dense layer's
// feed-forward is gate/up/down as llama's).
enum class LoraModule {
  kQ,       // q_proj
  kK,       // k_proj
  kV,       // v_proj
  kO,       // o_proj
  kGate,    // gate_proj
  kUp,      // up_proj
  kDown,    // down_proj
  kQA,      // q_a_proj
  kQB,      // q_b_proj
  kKvA,     // kv_a_proj_with_mqa
  kKvB,     // kv_b_proj
  kShGate,  // shared_experts.gate_proj
  kShUp,    // shared_experts.up_proj
  kShDown,  // shared_experts.down_proj
};
inline constexpr int kNumLoraModules = 14;
// PEFT's name of a module ("q_proj", "shared_experts.gate_proj", ...).
const char* lora_module_name(LoraModule m);

// One projection's update: a is rank x in, b is out x rank with the scale folded in. Both unset
// (data null) when the adapter leaves the projection alone.
struct LoraPair {
  WeightView a;
  WeightView b;
  // Matrices a model derives from a and b for products of its own (LoraAdapter::set_derived),
  // loaded to its devices with them: deepseek2's kv_b, whose update goes through MLA's absorbed
  // form, keeps each head's key rows of B transposed and A transposed. No data when unused.
  std::array<WeightView, 2> derived{};
  bool present() const { return a.data != nullptr; }
};

// What of a projection's update one rank keeps under tensor parallelism: B's rows [b_row0, b_row0
// + b_rows) where the projection is split by its outputs (this rank's heads or feed-forward rows),
// A's columns [a_col0, a_col0 + a_cols) where it is split by its inputs (its partial sum is added
// up over the ranks with the base's, so B (A_r x_r) summed is B A x); -1: all of them.
struct LoraShard {
  int64_t b_row0 = 0, b_rows = -1;
  int64_t a_col0 = 0, a_cols = -1;
};

// The base model's projections, which an adapter's matrices must fit.
struct LoraShape {
  std::string architecture;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  // The base's q/k rows are in llama.cpp's adjacent-pair order (a llama GGUF file): Hugging
  // Face-ordered B rows of q and k are permuted to match.
  bool permuted_qk = false;
  // Each module's input and output sizes; 0 for a projection the architecture does not have.
  std::array<int64_t, kNumLoraModules> in_dims{};
  std::array<int64_t, kNumLoraModules> out_dims{};
  // Routed experts (deepseek2), 0 for none: each expert's gate and up are expert_ff x hidden, its
  // down hidden x expert_ff (PEFT's mlp.experts.E.{gate,up,down}_proj).
  int64_t num_experts = 0, expert_ff = 0, hidden = 0;

  void set(LoraModule m, int64_t in, int64_t out) {
    in_dims[static_cast<size_t>(m)] = in;
    out_dims[static_cast<size_t>(m)] = out;
  }
  int64_t in(LoraModule m) const { return in_dims[static_cast<size_t>(m)]; }
  int64_t out(LoraModule m) const { return out_dims[static_cast<size_t>(m)]; }
};

class LoraAdapter {
 public:
  // Reads `source.path` (a PEFT folder, or a GGUF adapter file). Throws Error naming the path:
  // kNotFound for a missing folder or file, kInvalidArgument for a GGUF file that is not a LoRA
  // adapter or is another architecture's, kInvalidArgument listing every tensor that does not fit `shape` or is not a
  // LoRA matrix of a supported projection, kUnsupported for PEFT features duet does not apply
  // (DoRA, fan_in_fan_out, biases, rank or alpha patterns, modules_to_save).
  static std::unique_ptr<LoraAdapter> read(const LoraSource& source, const LoraShape& shape);

  const std::string& name() const { return name_; }
  const std::string& path() const { return path_; }
  int64_t rank() const { return rank_; }
  double scale() const { return scale_; }
  // The projections it updates, in PEFT's names ("q_proj", ...), in module order.
  std::vector<std::string> modules() const;
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  LoraPair& pair(int64_t layer, LoraModule m) { return layers_[static_cast<size_t>(layer)][static_cast<size_t>(m)]; }
  const LoraPair& pair(int64_t layer, LoraModule m) const {
    return layers_[static_cast<size_t>(layer)][static_cast<size_t>(m)];
  }
  // Routed expert `expert`'s update of its gate (which 0), up (1) or down (2) in `layer`; none when
  // the adapter leaves the layer's experts alone.
  bool has_experts(int64_t layer) const { return !experts_[static_cast<size_t>(layer)].empty(); }
  int64_t num_experts(int64_t layer) const { return static_cast<int64_t>(experts_[static_cast<size_t>(layer)].size()) / 3; }
  LoraPair& expert_pair(int64_t layer, int64_t expert, int which) {
    return experts_[static_cast<size_t>(layer)][static_cast<size_t>(expert * 3 + which)];
  }
  const LoraPair& expert_pair(int64_t layer, int64_t expert, int which) const {
    return experts_[static_cast<size_t>(layer)][static_cast<size_t>(expert * 3 + which)];
  }
  // Forgets a routed expert's update (another rank's expert, under expert parallelism).
  void drop_expert_pair(int64_t layer, int64_t expert, int which);
  int64_t bytes() const;
  // Replaces the pair's f32 matrices with Q8_0 copies, the rank padded with zeros to whole
  // blocks of 32 (A's extra rows and B's extra columns are zero, so the product is the same up to
  // Q8_0's rounding): for a device whose fast path packs Q8_0 matrices into int8 kernels.
  void quantize_pair_q8_0(int64_t layer, LoraModule module);
  // Keeps only a rank's share of the pair's f32 matrices (before quantize_pair_q8_0), or none of it
  // (drop_pair: a layer another rank runs).
  void shard_pair(int64_t layer, LoraModule module, const LoraShard& shard);
  void drop_pair(int64_t layer, LoraModule module);
  // Keeps `values` (rows x cols, f32) as the pair's derived matrix `which` (0 or 1).
  void set_derived(int64_t layer, LoraModule module, int which, std::vector<float> values, int64_t rows, int64_t cols);
  // A hash of its name, scale and every matrix's values: the same adapter gives the same number
  // on every server, another adapter (or the same name with other weights) another.
  uint64_t fingerprint() const { return fingerprint_; }

 private:
  std::string name_;
  std::string path_;
  int64_t rank_ = 0;
  double scale_ = 1.0;
  uint64_t fingerprint_ = 0;
  std::vector<std::array<LoraPair, kNumLoraModules>> layers_;
  std::vector<std::vector<LoraPair>> experts_;  // [layer][expert * 3 + which], empty for a layer without
  std::deque<std::vector<float>> storage_;
  std::deque<std::vector<uint8_t>> quantized_;  // Q8_0 copies (quantize_pair_q8_0)
  std::deque<std::string> names_;  // the views' names
};

// "NAME=PATH" as --lora-modules takes it (PATH a PEFT folder or a GGUF adapter), or vLLM's {"name": NAME, "path": PATH} (other keys
// ignored); throws kInvalidArgument for anything else.
LoraSource parse_lora_source(const std::string& text);

}  // namespace duet
