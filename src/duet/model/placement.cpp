#include "duet/model/placement.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/core/regex.h"
#include "duet/model/hparams.h"

namespace duet {
namespace {

constexpr const char* kKeyForms =
    "transformer.layers.A-B, model.layers.A-B, layers.A-B (or a single layer A), embed or lm_head";

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

// Splits on `sep` outside brackets and braces (cpu[0-3,8], regex repeats {1,3}); a backslash
// escapes the next character (a regex's \[). An unclosed bracket is refused, naming `what`:
// the item it opened took the rest of the text, which was silently dropped.
std::vector<std::string> split_top(std::string_view text, char sep, std::string_view what) {
  std::vector<std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    const char c = i < text.size() ? text[i] : sep;
    if (c == '\\' && i + 1 < text.size()) {
      ++i;
      continue;
    }
    if (c == '[' || c == '{') ++depth;
    if (c == ']' || c == '}') --depth;
    if (c == sep && depth <= 0) {
      out.push_back(trim(text.substr(start, i - start)));
      start = i + 1;
    }
  }
  if (depth > 0) {
    fail(ErrorCode::kInvalidArgument, "{} '{}' has a '[' or '{{' that is not closed", what, trim(text.substr(start)));
  }
  return out;
}

std::optional<int64_t> to_int(std::string_view s) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < 0) return std::nullopt;
  return v;
}

struct LayerRange {
  int64_t first = 0, last = 0;
};

// `layers.A-B` with an optional `transformer.` or `model.` in front; nullopt for another key.
std::optional<LayerRange> parse_layer_key(std::string_view key) {
  for (std::string_view prefix : {"transformer.", "model."}) {
    if (key.rfind(prefix, 0) == 0) {
      key.remove_prefix(prefix.size());
      break;
    }
  }
  if (key.rfind("layers.", 0) != 0) return std::nullopt;
  key.remove_prefix(7);
  const size_t dash = key.find('-');
  const auto first = to_int(key.substr(0, dash));
  const auto last = dash == std::string_view::npos ? first : to_int(key.substr(dash + 1));
  if (!first || !last || *last < *first) return std::nullopt;
  return LayerRange{*first, *last};
}

std::string range_text(int64_t first, int64_t last) {
  return first == last ? std::to_string(first) : fmt::format("{}-{}", first, last);
}

// "0-11, 16-23" for the set bits of `mask`.
std::string ranges_of(const std::vector<bool>& mask) {
  std::string out;
  for (size_t i = 0; i < mask.size();) {
    if (!mask[i]) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j + 1 < mask.size() && mask[j + 1]) ++j;
    out += (out.empty() ? "" : ", ") + range_text(static_cast<int64_t>(i), static_cast<int64_t>(j));
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

std::string gib(int64_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1 << 30)); }

std::string size_text(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) return gib(bytes);
  if (bytes >= (1 << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
  return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / 1024);
}

bool is_cpu_kind(DeviceName::Kind k) {
  return k == DeviceName::Kind::kCpu || k == DeviceName::Kind::kNumaNode || k == DeviceName::Kind::kCores;
}

// Work per second of a device on a small f32 matmul, for `auto`.
double measure_speed(Device& device) {
  constexpr int64_t kRows = 512, kCols = 1024, kM = 8;
  std::vector<float> host(static_cast<size_t>(kRows * kCols), 0.5f);
  DeviceBuffer w = device.allocate(host.size() * sizeof(float), MemoryKind::kScratch);
  DeviceBuffer x = device.allocate(kM * kCols * sizeof(float), MemoryKind::kScratch);
  DeviceBuffer y = device.allocate(kM * kRows * sizeof(float), MemoryKind::kScratch);
  device.copy_from_host(w.data(), host.data(), host.size() * sizeof(float));
  device.copy_from_host(x.data(), host.data(), kM * kCols * sizeof(float));
  const WeightView view{"probe", DType::kF32, kRows, kCols, w.data()};
  const std::unique_lock<std::mutex> held = device.hold();
  device.backend().matmul(view, x.as<float>(), kM, y.as<float>());  // warm
  constexpr int kReps = 5;
  const auto start = Device::Clock::now();
  for (int i = 0; i < kReps; ++i) device.backend().matmul(view, x.as<float>(), kM, y.as<float>());
  const double s = std::chrono::duration<double>(Device::Clock::now() - start).count();
  return static_cast<double>(kReps * kM * kRows * kCols) / std::max(s, 1e-9);
}

// Weight bytes and KV bytes per token of each device, and what crosses devices per token: x at
// each change of device along the forward pass; the normalised rows and routing to routed
// experts elsewhere, and their sum back.
void count_bytes(const GgufFile& file, int64_t L, int64_t kv_row_bytes, bool weights_as_q8_0, Placement& p) {
  const std::string arch = file.get_string_or("general.architecture", "");
  size_t n = 0;
  for (int v : {p.embed, p.head}) n = std::max(n, static_cast<size_t>(v) + 1);
  for (const std::vector<int>* per : {&p.attention, &p.feed_forward, &p.experts}) {
    for (int v : *per) n = std::max(n, static_cast<size_t>(std::max(v, 0)) + 1);
  }
  p.weight_bytes.assign(n, 0);
  p.kv_bytes_per_token.assign(n, 0);
  for (const GgufTensorInfo& t : file.tensors()) {
    const auto part = part_of_tensor(t.name, L);
    if (part) p.weight_bytes[static_cast<size_t>(p.device_of(*part))] += tensor_bytes_as_loaded(t, weights_as_q8_0);
  }
  for (int64_t l = 0; l < L; ++l) p.kv_bytes_per_token[static_cast<size_t>(p.attention[static_cast<size_t>(l)])] += kv_row_bytes;
  const int64_t d_model = file.get_int_or(arch + ".embedding_length", 0);
  const int64_t k = file.get_int_or(arch + ".expert_used_count", 0);
  p.num_copies = 0;
  p.copy_bytes_per_token = 0;
  int at = p.embed;
  const auto move_x = [&](int to) {
    if (to != at) {
      ++p.num_copies;
      p.copy_bytes_per_token += d_model * 4;
      at = to;
    }
  };
  for (int64_t l = 0; l < L; ++l) {
    move_x(p.attention[static_cast<size_t>(l)]);
    move_x(p.feed_forward[static_cast<size_t>(l)]);
    const int e = p.experts[static_cast<size_t>(l)];
    if (e >= 0 && e != at) {
      p.num_copies += 2;
      p.copy_bytes_per_token += d_model * 4 + k * 8 + d_model * 4;
    }
  }
  move_x(p.head);
}

}  // namespace

std::string part_label(PartId part) {
  switch (part.kind) {
    case PartKind::kEmbed: return "embed";
    case PartKind::kHead: return "lm_head";
    case PartKind::kAttention: return fmt::format("blk.{} attention", part.layer);
    case PartKind::kFeedForward: return fmt::format("blk.{} feed-forward", part.layer);
    case PartKind::kExperts: return fmt::format("blk.{} experts", part.layer);
  }
  return "?";
}

std::optional<PartId> part_of_tensor(std::string_view name, int64_t num_layers) {
  if (name.rfind("token_embd.", 0) == 0) return PartId{PartKind::kEmbed, -1};
  if (name.rfind("output_norm.", 0) == 0 || name.rfind("output.", 0) == 0) return PartId{PartKind::kHead, -1};
  if (name.rfind("blk.", 0) != 0) return std::nullopt;
  const std::string_view rest = name.substr(4);
  const size_t dot = rest.find('.');
  const auto layer = to_int(rest.substr(0, dot));
  if (!layer || dot == std::string_view::npos || *layer >= num_layers) return std::nullopt;
  const std::string_view tensor = rest.substr(dot + 1);
  if (tensor.rfind("attn_", 0) == 0) return PartId{PartKind::kAttention, *layer};
  if (tensor.find("_exps.") != std::string_view::npos) return PartId{PartKind::kExperts, *layer};
  return PartId{PartKind::kFeedForward, *layer};
}

void parse_device_map(std::string_view text, DeviceMapSpec& spec) {
  const std::string t = trim(text);
  if (t.empty()) fail(ErrorCode::kInvalidArgument, "--device-map is empty (expected auto, JSON or KEY=DEVICE,...)");
  if (t == "auto") {
    spec.automatic = true;
    return;
  }
  if (t.find('=') == std::string::npos && t.front() != '{') {  // one device for everything
    try {
      spec.device = parse_device_name(t).text;
    } catch (const Error& e) {
      fail(ErrorCode::kInvalidArgument, "--device-map '{}' does not parse: not auto, JSON, KEY=DEVICE,... nor a "
           "device ({})", t, e.what());
    }
    return;
  }
  if (t.front() == '{') {
    nlohmann::ordered_json j;
    // A key given twice is refused, as in the KEY=DEVICE form (the parse keeps only its last value).
    std::set<std::string> keys;
    const nlohmann::ordered_json::parser_callback_t once = [&](int depth, nlohmann::ordered_json::parse_event_t event,
                                                               nlohmann::ordered_json& parsed) {
      if (depth == 1 && event == nlohmann::ordered_json::parse_event_t::key &&
          !keys.insert(parsed.get<std::string>()).second) {
        fail(ErrorCode::kInvalidArgument, "--device-map JSON gives key '{}' twice", parsed.get<std::string>());
      }
      return true;
    };
    try {
      j = nlohmann::ordered_json::parse(t, once);
    } catch (const nlohmann::json::exception& e) {  // parse errors, and numbers beyond double's range
      fail(ErrorCode::kInvalidArgument, "--device-map is not valid JSON: {}", e.what());
    }
    if (!j.is_object()) fail(ErrorCode::kInvalidArgument, "--device-map JSON must be an object of KEY: DEVICE");
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!it.value().is_string()) {
        fail(ErrorCode::kInvalidArgument, "--device-map key '{}' must name a device as a string, not {}", it.key(),
             it.value().dump());
      }
      spec.rules.push_back({it.key(), it.value().get<std::string>()});
    }
    return;
  }
  for (const std::string& item : split_top(t, ',', "--device-map entry")) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || trim(item.substr(0, eq)).empty() || trim(item.substr(eq + 1)).empty()) {
      fail(ErrorCode::kInvalidArgument, "--device-map entry '{}' does not parse (expected KEY=DEVICE, KEY one of {})",
           item, kKeyForms);
    }
    spec.rules.push_back({trim(item.substr(0, eq)), trim(item.substr(eq + 1))});
  }
}

void parse_override_tensor(std::string_view text, DeviceMapSpec& spec) {
  for (const std::string& item : split_top(text, ',', "--override-tensor entry")) {
    const size_t eq = item.rfind('=');
    if (eq == std::string::npos || trim(item.substr(0, eq)).empty() || trim(item.substr(eq + 1)).empty()) {
      fail(ErrorCode::kInvalidArgument, "--override-tensor entry '{}' does not parse (expected PATTERN=DEVICE)", item);
    }
    const std::string pattern = trim(item.substr(0, eq));
    static_cast<void>(Regex(pattern, "--override-tensor pattern"));  // refused now if it does not compile
    spec.tensor_rules.push_back({pattern, trim(item.substr(eq + 1))});
  }
}

int Placement::device_of(PartId part) const {
  switch (part.kind) {
    case PartKind::kEmbed: return embed;
    case PartKind::kHead: return head;
    case PartKind::kAttention: return attention.at(static_cast<size_t>(part.layer));
    case PartKind::kFeedForward: return feed_forward.at(static_cast<size_t>(part.layer));
    case PartKind::kExperts: return experts.at(static_cast<size_t>(part.layer));
  }
  return 0;
}

std::string Placement::describe() const {
  std::string out;
  for (size_t d = 0; d < devices.size(); ++d) {
    const int di = static_cast<int>(d);
    std::vector<std::string> parts;
    if (embed == di) parts.push_back("embed");
    // Runs of layers with the same parts here.
    const int64_t L = num_layers();
    for (int64_t l = 0; l < L;) {
      const auto what = [&](int64_t i) {
        std::string w;
        const auto add = [&](const char* s) {
          if (!w.empty()) w += '+';
          w += s;
        };
        if (attention[static_cast<size_t>(i)] == di) add("attention");
        if (feed_forward[static_cast<size_t>(i)] == di) add("feed-forward");
        if (experts[static_cast<size_t>(i)] == di) add("experts");
        return w;
      };
      const std::string w = what(l);
      int64_t j = l;
      while (j + 1 < L && what(j + 1) == w) ++j;
      if (!w.empty()) {
        const bool whole = w == "attention+feed-forward" || w == "attention+feed-forward+experts";
        parts.push_back(fmt::format("{} {}{}", l == j ? "layer" : "layers", range_text(l, j), whole ? "" : " (" + w + ")"));
      }
      l = j + 1;
    }
    if (head == di) parts.push_back("lm_head");
    std::string joined;
    for (const std::string& p : parts) joined += (joined.empty() ? "" : ", ") + p;
    out += fmt::format("  {}: {}; weights {}, KV {} per token\n", devices[d]->name(), joined, size_text(weight_bytes[d]),
                       size_text(kv_bytes_per_token[d]));
  }
  out += num_copies == 0 ? "  copies per step: none (one device)\n"
                         : fmt::format("  copies per step: {} per micro-batch, {} per token\n", num_copies,
                                       size_text(copy_bytes_per_token));
  return out;
}

std::vector<int64_t> split_layers(int64_t num_layers, const std::vector<double>& speeds,
                                  const std::vector<int64_t>& capacity, int64_t layer_bytes) {
  const size_t n = speeds.size();
  std::vector<int64_t> max_layers(n), count(n, 0);
  int64_t room = 0;
  for (size_t i = 0; i < n; ++i) {
    max_layers[i] = layer_bytes > 0 ? std::max<int64_t>(0, capacity[i] / layer_bytes) : num_layers;
    room += max_layers[i];
  }
  if (room < num_layers) {
    fail(ErrorCode::kInvalidArgument, "auto device map: {} layers of {} do not fit; the devices hold {} in all",
         num_layers, size_text(layer_bytes), room);
  }
  // Largest remainder in proportion to speed, then capped, and what a cap frees goes to the rest.
  int64_t left = num_layers;
  std::vector<bool> capped(n, false);
  while (left > 0) {
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) {
      if (!capped[i]) total += std::max(speeds[i], 1e-12);
    }
    std::vector<double> share(n, 0.0);
    int64_t given = 0;
    for (size_t i = 0; i < n; ++i) {
      if (capped[i]) continue;
      share[i] = static_cast<double>(left) * std::max(speeds[i], 1e-12) / total;
      const int64_t take = std::min(static_cast<int64_t>(std::floor(share[i])), max_layers[i] - count[i]);
      count[i] += take;
      given += take;
    }
    // The remainder one at a time, largest fractional share first, where there is room.
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return share[a] - std::floor(share[a]) > share[b] - std::floor(share[b]);
    });
    for (size_t i : order) {
      if (given == left) break;
      if (!capped[i] && count[i] < max_layers[i]) {
        ++count[i];
        ++given;
      }
    }
    left -= given;
    for (size_t i = 0; i < n; ++i) capped[i] = capped[i] || count[i] >= max_layers[i];
  }
  return count;
}

Placement plan_placement(const GgufFile& file, const DeviceMapSpec& spec, DeviceRegistry& registry,
                         const KvBudget& budget, int64_t kv_row_bytes) {
  const std::string arch = file.get_string_or("general.architecture", "");
  const int64_t L = HParams(file, arch).layer_count("block_count");

  // Checks a device name in the context of the key that names it.
  const auto check = [&](const std::string& device, const std::string& where) {
    try {
      return registry.check(device).text;
    } catch (const Error& e) {
      fail(ErrorCode::kInvalidArgument, "{}: {}", where, e.what());
    }
  };

  // Layers, embed and lm_head from the rules (or auto, or the default).
  std::vector<std::string> layer_device(static_cast<size_t>(L));
  std::vector<std::string> layer_key(static_cast<size_t>(L));
  std::string embed_device, head_device;
  bool any_layer_rule = false;
  for (const DeviceMapSpec::Rule& rule : spec.rules) {
    const std::string where = fmt::format("device map key '{}'", rule.key);
    const std::string device = check(rule.device, where);
    if (rule.key == "embed" || rule.key == "lm_head") {
      std::string& slot = rule.key == "embed" ? embed_device : head_device;
      if (!slot.empty()) fail(ErrorCode::kInvalidArgument, "the device map places {} twice", rule.key);
      slot = device;
      continue;
    }
    const auto range = parse_layer_key(rule.key);
    if (!range) fail(ErrorCode::kInvalidArgument, "{} does not parse (expected {})", where, kKeyForms);
    if (range->last >= L) {
      fail(ErrorCode::kInvalidArgument, "{} names layer {}, but the model has {} layers (0-{})", where, range->last, L,
           L - 1);
    }
    for (int64_t l = range->first; l <= range->last; ++l) {
      std::string& slot = layer_device[static_cast<size_t>(l)];
      if (!slot.empty()) {
        // The whole overlap with that key, for the message.
        const std::string other = layer_key[static_cast<size_t>(l)];
        int64_t last = l;
        while (last < range->last && layer_key[static_cast<size_t>(last + 1)] == other) ++last;
        fail(ErrorCode::kInvalidArgument, "device map keys '{}' and '{}' both place layers {}", other, rule.key,
             range_text(l, last));
      }
      slot = device;
      layer_key[static_cast<size_t>(l)] = rule.key;
    }
    any_layer_rule = true;
  }
  if ((spec.automatic || !spec.device.empty()) && any_layer_rule) {
    fail(ErrorCode::kInvalidArgument, "--device-map {} cannot be combined with layer keys",
         spec.automatic ? "auto" : spec.device);
  }
  if (any_layer_rule) {
    std::vector<bool> missing(static_cast<size_t>(L)), placed(static_cast<size_t>(L));
    bool any_missing = false;
    for (int64_t l = 0; l < L; ++l) {
      missing[static_cast<size_t>(l)] = layer_device[static_cast<size_t>(l)].empty();
      placed[static_cast<size_t>(l)] = !missing[static_cast<size_t>(l)];
      any_missing = any_missing || missing[static_cast<size_t>(l)];
    }
    if (any_missing) {
      fail(ErrorCode::kInvalidArgument, "the device map leaves layers {} out (it places {} of the model's {} layers, 0-{})",
           ranges_of(missing), ranges_of(placed), L, L - 1);
    }
  } else if (spec.automatic) {
    // Every NUMA node as a device when there are several (GPUs join here when built), else cpu.
    std::vector<std::string> names;
    const NumaTopology topo = numa_topology();
    if (topo.nodes.size() > 1) {
      for (int node : topo.nodes) names.push_back("cpu:" + std::to_string(node));
    } else {
      names.push_back("cpu");
    }
    std::vector<int64_t> counts(1, L);
    if (names.size() > 1) {
      std::vector<double> speeds;
      std::vector<int64_t> capacity;
      int64_t layer_bytes = 0;
      for (const GgufTensorInfo& t : file.tensors()) {
        const auto part = part_of_tensor(t.name, L);
        if (part && part->layer >= 0) layer_bytes += static_cast<int64_t>(t.nbytes);
      }
      layer_bytes = layer_bytes / L;
      for (const std::string& name : names) {
        speeds.push_back(measure_speed(*registry.get(name)));
        const DeviceInfo info = registry.describe(name);
        const int64_t kv = budget.bytes > 0 ? budget.bytes
                                            : static_cast<int64_t>(budget.memory_utilization *
                                                                   static_cast<double>(info.free_bytes));
        capacity.push_back(std::max<int64_t>(0, info.free_bytes - kv));
      }
      counts = split_layers(L, speeds, capacity, layer_bytes);
    }
    int64_t l = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      for (int64_t c = 0; c < counts[i]; ++c) layer_device[static_cast<size_t>(l++)] = names[i];
    }
  } else {
    const std::string device = check(spec.device.empty() ? "cpu" : spec.device, "--device-map");
    for (std::string& d : layer_device) d = device;
  }
  if (embed_device.empty()) embed_device = layer_device.front();
  if (head_device.empty()) head_device = layer_device.back();

  // Parts, then the per-tensor rules.
  std::vector<std::string> attention(layer_device), feed_forward(layer_device);
  std::vector<std::string> experts(static_cast<size_t>(L));
  bool has_experts = false;
  for (const GgufTensorInfo& t : file.tensors()) {
    const auto part = part_of_tensor(t.name, L);
    if (part && part->kind == PartKind::kExperts) {
      experts[static_cast<size_t>(part->layer)] = layer_device[static_cast<size_t>(part->layer)];
      has_experts = true;
    }
  }
  if (!spec.moe_experts.empty()) {
    const std::string device = check(spec.moe_experts, "--moe-experts");
    if (!has_experts) {
      fail(ErrorCode::kInvalidArgument, "--moe-experts {}: '{}' has no routed experts (no blk.N.ffn_*_exps tensors)",
           spec.moe_experts, file.path());
    }
    for (std::string& e : experts) {
      if (!e.empty()) e = device;
    }
  }
  const auto slot_of = [&](PartId p) -> std::string& {
    switch (p.kind) {
      case PartKind::kEmbed: return embed_device;
      case PartKind::kHead: return head_device;
      case PartKind::kAttention: return attention[static_cast<size_t>(p.layer)];
      case PartKind::kFeedForward: return feed_forward[static_cast<size_t>(p.layer)];
      case PartKind::kExperts: return experts[static_cast<size_t>(p.layer)];
    }
    return embed_device;
  };
  if (!spec.tensor_rules.empty()) {
    std::vector<std::unique_ptr<Regex>> patterns;
    std::vector<std::string> devices;
    for (const auto& r : spec.tensor_rules) {
      patterns.push_back(std::make_unique<Regex>(r.pattern, "--override-tensor pattern"));
      devices.push_back(check(r.device, fmt::format("--override-tensor '{}={}'", r.pattern, r.device)));
    }
    std::vector<int> matches(patterns.size(), 0);
    // Each part's device from its tensors: the first matching rule, else the part's own.
    std::map<std::string, std::pair<std::string, std::string>> chosen;  // part label -> (device, tensor)
    std::map<std::string, PartId> parts;
    for (const GgufTensorInfo& t : file.tensors()) {
      const auto part = part_of_tensor(t.name, L);
      if (!part) continue;
      std::string device = slot_of(*part);
      for (size_t i = 0; i < patterns.size(); ++i) {
        if (patterns[i]->search(t.name)) {
          device = devices[i];
          ++matches[i];
          break;
        }
      }
      const std::string label = part_label(*part);
      auto [it, fresh] = chosen.emplace(label, std::make_pair(device, t.name));
      if (!fresh && it->second.first != device) {
        fail(ErrorCode::kInvalidArgument,
             "--override-tensor puts '{}' on {} but '{}' on {}: both are {}, whose tensors stay on one device (a "
             "layer's parts are its attention, its feed-forward and its routed experts)",
             it->second.second, it->second.first, t.name, device, label);
      }
      parts.emplace(label, *part);
    }
    for (size_t i = 0; i < patterns.size(); ++i) {
      if (matches[i] == 0) {
        fail(ErrorCode::kInvalidArgument, "--override-tensor pattern '{}' matches no tensor of '{}'",
             spec.tensor_rules[i].pattern, file.path());
      }
    }
    for (const auto& [label, choice] : chosen) slot_of(parts.at(label)) = choice.first;
  }

  // Devices in the order the forward pass reaches them.
  Placement p;
  std::vector<std::string> names;
  const auto index_of = [&](const std::string& name) {
    const auto it = std::find(names.begin(), names.end(), name);
    if (it != names.end()) return static_cast<int>(it - names.begin());
    names.push_back(name);
    return static_cast<int>(names.size() - 1);
  };
  p.embed = index_of(embed_device);
  for (int64_t l = 0; l < L; ++l) {
    p.attention.push_back(index_of(attention[static_cast<size_t>(l)]));
    p.feed_forward.push_back(index_of(feed_forward[static_cast<size_t>(l)]));
    p.experts.push_back(experts[static_cast<size_t>(l)].empty() ? -1 : index_of(experts[static_cast<size_t>(l)]));
  }
  p.head = index_of(head_device);

  // CPU devices may not share cores (each pins its own threads).
  std::vector<DeviceInfo> infos;
  for (const std::string& name : names) infos.push_back(registry.describe(name));
  for (size_t a = 0; a < names.size(); ++a) {
    for (size_t b = a + 1; b < names.size(); ++b) {
      if (!is_cpu_kind(parse_device_name(names[a]).kind) || !is_cpu_kind(parse_device_name(names[b]).kind)) continue;
      std::vector<int> shared;
      std::set_intersection(infos[a].cpus.begin(), infos[a].cpus.end(), infos[b].cpus.begin(), infos[b].cpus.end(),
                            std::back_inserter(shared));
      if (!shared.empty()) {
        fail(ErrorCode::kInvalidArgument,
             "the device map uses {} and {}, which share core {}: CPU devices in one map must not overlap ({} is every "
             "core; use cpu:N or cpu[...] devices instead)",
             names[a], names[b], shared.front(), "cpu");
      }
    }
  }

  count_bytes(file, L, kv_row_bytes, budget.weights_as_q8_0, p);
  for (size_t d = 0; d < names.size(); ++d) {
    const bool holds_kv = p.kv_bytes_per_token[d] > 0;
    const int64_t kv = holds_kv && budget.bytes > 0 ? budget.bytes : 0;
    if (infos[d].memory_bytes > 0 && p.weight_bytes[d] + kv > infos[d].memory_bytes) {
      fail(ErrorCode::kInvalidArgument, "the device map does not fit {}: it has {} of memory, and would hold {} of "
           "weights{}", names[d], gib(infos[d].memory_bytes), gib(p.weight_bytes[d]),
           kv > 0 ? fmt::format(" and a {} KV cache (--kv-cache-memory)", gib(kv)) : std::string());
    }
  }

  for (const std::string& name : names) p.devices.push_back(registry.get(name));
  return p;
}

Placement place_stages(const GgufFile& file, Placement p, std::shared_ptr<ParallelGroup> group,
                       int64_t kv_row_bytes) {
  const int64_t L = p.num_layers();
  if (p.devices.size() != 1) {
    fail(ErrorCode::kInvalidArgument,
         "with several ranks each rank runs its share on one device; the device map places parts on {} devices",
         p.devices.size());
  }
  const int P = group->num_stages();
  if (L < P) {
    fail(ErrorCode::kInvalidArgument, "--pipeline-parallel-size {} needs at least one layer per stage; '{}' has {} layers",
         P, file.path(), L);
  }
  std::vector<std::shared_ptr<Device>> devices(static_cast<size_t>(P));
  for (int s = 0; s < P; ++s) {
    devices[static_cast<size_t>(s)] =
        s == group->stage() ? p.devices[0] : make_rank_device(s, group->rank_of(s, group->tensor_rank()));
  }
  for (int s = 0; s < P; ++s) {
    const auto [first, end] = ParallelGroup::stage_layers(L, s, P);
    for (int64_t l = first; l < end; ++l) {
      const auto i = static_cast<size_t>(l);
      p.attention[i] = s;
      p.feed_forward[i] = s;
      if (p.experts[i] >= 0) p.experts[i] = s;
    }
  }
  p.embed = 0;
  p.head = P - 1;
  p.devices = std::move(devices);
  p.parallel = std::move(group);
  count_bytes(file, L, kv_row_bytes, false, p);
  return p;
}

Placement replace_device(const GgufFile& file, const Placement& p, int index, std::shared_ptr<Device> spare) {
  Placement out = p;
  int at = -1;
  for (size_t d = 0; d < p.devices.size(); ++d) {
    if (p.devices[d] == spare) at = static_cast<int>(d);
  }
  if (at < 0) {
    out.devices[static_cast<size_t>(index)] = std::move(spare);
  } else {
    // The failed device's parts go to `at`; the devices after the failed one move down by one.
    const auto remap = [&](int d) {
      if (d < 0) return d;
      if (d == index) d = at;
      return d > index ? d - 1 : d;
    };
    out.embed = remap(out.embed);
    out.head = remap(out.head);
    for (std::vector<int>* per : {&out.attention, &out.feed_forward, &out.experts}) {
      for (int& v : *per) v = remap(v);
    }
    out.devices.erase(out.devices.begin() + index);
  }
  int64_t kv_bytes = 0;
  for (int64_t b : p.kv_bytes_per_token) kv_bytes += b;
  const int64_t L = p.num_layers();
  count_bytes(file, L, L > 0 ? kv_bytes / L : 0, false, out);
  return out;
}

Placement place_all_on(const GgufFile& file, std::shared_ptr<Device> device, int64_t kv_row_bytes) {
  const std::string arch = file.get_string_or("general.architecture", "");
  const int64_t L = HParams(file, arch).layer_count("block_count");
  Placement p;
  p.devices.push_back(std::move(device));
  p.attention.assign(static_cast<size_t>(L), 0);
  p.feed_forward.assign(static_cast<size_t>(L), 0);
  p.experts.assign(static_cast<size_t>(L), -1);
  for (const GgufTensorInfo& t : file.tensors()) {
    const auto part = part_of_tensor(t.name, L);
    if (part && part->kind == PartKind::kExperts) p.experts[static_cast<size_t>(part->layer)] = 0;
  }
  count_bytes(file, L, kv_row_bytes, false, p);
  return p;
}

}  // namespace duet

namespace duet {

bool requantizable_tensor(const GgufTensorInfo& t) {
  const bool is_float = t.type == DType::kF32 || t.type == DType::kF16 || t.type == DType::kBF16;
  return is_float && t.shape.size() >= 2 && t.shape[0] % 32 == 0 && t.name != "token_embd.weight";
}

int64_t tensor_bytes_as_loaded(const GgufTensorInfo& t, bool weights_as_q8_0) {
  if (!weights_as_q8_0 || !requantizable_tensor(t)) return static_cast<int64_t>(t.nbytes);
  return static_cast<int64_t>(row_size(DType::kQ8_0, t.shape[0])) * (t.num_elements() / t.shape[0]);
}

WeightBytes weight_bytes(const GgufFile& file) {
  WeightBytes w;
  bool has_head = false;
  const GgufTensorInfo* embedding = nullptr;
  for (const GgufTensorInfo& t : file.tensors()) {
    w.stored += static_cast<int64_t>(t.nbytes);
    w.as_q8_0 += tensor_bytes_as_loaded(t, true);
    has_head = has_head || t.name == "output.weight";
    if (t.name == "token_embd.weight") embedding = &t;
  }
  if (!has_head && embedding != nullptr && embedding->shape.size() == 2 && embedding->shape[0] % 32 == 0 &&
      (embedding->type == DType::kF32 || embedding->type == DType::kF16 || embedding->type == DType::kBF16)) {
    w.as_q8_0 += static_cast<int64_t>(row_size(DType::kQ8_0, embedding->shape[0])) * embedding->shape[1];
  }
  return w;
}

}  // namespace duet
