// The device map: where each part of a model runs. Written as text (--device-map, the YAML
// config's device_map:, --override-tensor, --moe-experts, or `auto`), parsed into a
// DeviceMapSpec, and resolved against a model file's metadata into a Placement before any weight
// is read. Every problem (a device unknown or missing on this machine, ranges that overlap or
// leave a layer out, a layer the model lacks, a part's tensors split across devices, more than
// a device's memory) is refused there, naming the key and the numbers.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "duet/backend/devices.h"
#include "duet/formats/gguf.h"
#include "duet/model/lora.h"
#include "duet/model/parallel.h"

namespace duet {

// The parts of a model's forward pass. A layer has attention (with its KV cache), a
// feed-forward (dense, or a MoE router with shared experts) and, in a MoE layer, routed experts.
enum class PartKind { kEmbed, kAttention, kFeedForward, kExperts, kHead };
struct PartId {
  PartKind kind = PartKind::kEmbed;
  int64_t layer = -1;
};
// "embed", "blk.3 attention", "blk.3 feed-forward", "blk.3 experts", "lm_head".
std::string part_label(PartId part);
// The part a GGUF tensor belongs to (by llama.cpp's names); nullopt for tensors outside the
// parts (rope_freqs, layers past num_layers such as V3's multi-token prediction).
std::optional<PartId> part_of_tensor(std::string_view name, int64_t num_layers);

struct DeviceMapSpec {
  // A key (`layers.A-B` and its `transformer.`/`model.` spellings, `embed`, `lm_head`) and the
  // device it goes to, with where it was written (for errors).
  struct Rule {
    std::string key;
    std::string device;
  };
  struct TensorRule {
    std::string pattern;  // ECMAScript regex, searched in the tensor name
    std::string device;
  };
  bool automatic = false;
  std::string device;  // one device for every part (--device-map cpu:1), when no rule places layers
  std::vector<Rule> rules;
  std::vector<TensorRule> tensor_rules;  // the first that matches a tensor wins
  std::string moe_experts;               // device of every routed expert, if given

  bool empty() const {
    return !automatic && device.empty() && rules.empty() && tensor_rules.empty() && moe_experts.empty();
  }
};

// --device-map TEXT: `auto`, one device for everything (`cpu:1`), a JSON object ({"layers.0-11":
// "cpu:0", "layers.12-23": "cpu:1"}) or the short form (`layers.0-11=cpu:0,layers.12-23=cpu:1`).
// Adds to `spec`; throws kInvalidArgument naming what does not parse.
void parse_device_map(std::string_view text, DeviceMapSpec& spec);
// --override-tensor TEXT: `PATTERN=DEVICE[,PATTERN=DEVICE...]`; may be given more than once.
void parse_override_tensor(std::string_view text, DeviceMapSpec& spec);

// What the placement must leave room for on each device holding attention layers.
struct KvBudget {
  int64_t bytes = 0;                 // --kv-cache-memory per device (0: a share of free memory)
  double memory_utilization = 0.3;  // that share
  int64_t bytes_per_token_hint = 0;  // unused by the check; for the plan's text
  // The weights are re-quantized as they load (memory degradation): float matrices count as Q8_0.
  bool weights_as_q8_0 = false;
};

// Memory degradation: whether the engine re-quantizes this tensor to Q8_0 when memory is short
// (an f32, f16 or bf16 tensor of two or more dimensions, rows a multiple of 32 wide, that is not
// the token embedding, which is read by rows), and its bytes as loaded either way.
bool requantizable_tensor(const GgufTensorInfo& t);
int64_t tensor_bytes_as_loaded(const GgufTensorInfo& t, bool weights_as_q8_0);
// A model's weights in bytes: as stored, and with every requantizable tensor as Q8_0 (plus a
// packed Q8_0 copy of a float token embedding that is also the output head, for a tied model).
struct WeightBytes {
  int64_t stored = 0;
  int64_t as_q8_0 = 0;
};
WeightBytes weight_bytes(const GgufFile& file);

struct Placement {
  // The devices used, in the order the forward pass first reaches them.
  std::vector<std::shared_ptr<Device>> devices;
  int embed = 0;
  int head = 0;
  std::vector<int> attention, feed_forward, experts;  // per layer; experts -1 in a dense layer

  int device_of(PartId part) const;
  Device& device(PartId part) const { return *devices[static_cast<size_t>(device_of(part))]; }
  int64_t num_layers() const { return static_cast<int64_t>(attention.size()); }

  // Per device (same order): bytes of the weights placed there, and of KV per token (K and V of
  // its attention layers, in the cache's element type).
  std::vector<int64_t> weight_bytes;
  std::vector<int64_t> kv_bytes_per_token;
  // The hidden state crossing devices per token of a step (bytes), and how many crossings.
  int64_t copy_bytes_per_token = 0;
  int num_copies = 0;

  // Whether the model's multi-token-prediction layer (DeepSeek-V3's MTP, for speculative decoding
  // with --speculative-method mtp) is loaded: its weights and KV go to the head's device.
  bool mtp = false;
  // LoRA adapters to load beside the weights (lora.h), in the order requests number them (1..).
  std::vector<LoraSource> lora_adapters;

  // The ranks the model runs over, when several processes run it (null: this process alone).
  // Parts of other stages are on rank devices (Device::remote_rank()).
  std::shared_ptr<ParallelGroup> parallel;
  int tensor_size() const { return parallel ? parallel->tensor_size() : 1; }

  // The plan, one line per device: its parts, weight bytes, KV per token; then the copies.
  std::string describe() const;
};

// Resolves `spec` against the model in `file` (its metadata only): every part gets a device from
// `devices` (made here once the map is valid). Without layer rules, the layers go to spec.device
// (default `cpu`). kv_row_bytes: bytes of one layer's K and V rows per token (for the plan and
// the memory check).
Placement plan_placement(const GgufFile& file, const DeviceMapSpec& spec, DeviceRegistry& devices,
                         const KvBudget& budget, int64_t kv_row_bytes);

// Every part of the model in `file` on `device` (no map to check).
Placement place_all_on(const GgufFile& file, std::shared_ptr<Device> device, int64_t kv_row_bytes);

// `local` (every part on one device of this process) cut into the pipeline stages of `group`:
// this rank's stage keeps its layers (stage_layers) on that device, every other stage's parts go
// to a rank device of the same tensor rank; embed is on the first stage, lm_head on the last.
// Throws kInvalidArgument when `local` spans several devices (a device map inside a stage) or
// the model has fewer layers than stages.
Placement place_stages(const GgufFile& file, Placement local, std::shared_ptr<ParallelGroup> group,
                       int64_t kv_row_bytes);

// `p` with the parts of p.devices[index] moved to `spare` (a failover): the spare takes the
// failed device's place, or, when it already runs other parts, those parts join it. The sizes and
// copies are counted again.
Placement replace_device(const GgufFile& file, const Placement& p, int index, std::shared_ptr<Device> spare);

// `auto`'s split: layer counts per device, in proportion to `speeds` (work per second), each
// device holding at most capacity[i] / layer_bytes layers; throws kInvalidArgument when the
// layers do not fit. Exposed for tests.
std::vector<int64_t> split_layers(int64_t num_layers, const std::vector<double>& speeds,
                                  const std::vector<int64_t>& capacity, int64_t layer_bytes);

}  // namespace duet
