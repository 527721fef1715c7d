// `duet inspect FILE|FOLDER`: what a GGUF file (or a Hugging Face folder read as one) holds: architecture, hyper-parameters, tokenizer summary,
// every tensor (name, type, shape, bytes) and the parameter count.
#include <map>

#include <fmt/format.h>

#include "duet/cli/commands.h"
#include "duet/cli/engine_options.h"
#include "duet/cli/units.h"
#include "duet/engine/model_path.h"
#include "duet/formats/gguf.h"

namespace duet::cli {
namespace {

bool is_tokenizer_array(const std::string& key) {
  return key == "tokenizer.ggml.tokens" || key == "tokenizer.ggml.scores" || key == "tokenizer.ggml.token_type" ||
         key == "tokenizer.ggml.merges";
}

void print_tokenizer(const GgufFile& f) {
  if (!f.has("tokenizer.ggml.model")) {
    fmt::print("tokenizer: none in this file\n");
    return;
  }
  const std::string model = f.get_string("tokenizer.ggml.model");
  const std::vector<std::string> tokens =
      f.has("tokenizer.ggml.tokens") ? f.get_string_array("tokenizer.ggml.tokens") : std::vector<std::string>{};
  fmt::print("tokenizer: {} (pre-tokenizer {}), {} tokens", model, f.get_string_or("tokenizer.ggml.pre", "default"),
             tokens.size());
  if (const GgufValue* merges = f.find("tokenizer.ggml.merges")) {
    if (const auto* arr = std::get_if<GgufArray>(&merges->value)) fmt::print(", {} merges", arr->items.size());
  }
  if (f.has("tokenizer.ggml.token_type")) {
    std::map<int32_t, int64_t> counts;
    for (int32_t t : f.get_int_array("tokenizer.ggml.token_type")) ++counts[t];
    const char* names[] = {"undefined", "normal", "unknown", "control", "user-defined", "unused", "byte"};
    std::vector<std::string> parts;
    for (const auto& [type, count] : counts) {
      parts.push_back(fmt::format("{} {}", count, type >= 0 && type <= 6 ? names[type] : "other"));
    }
    fmt::print(" ({})", fmt::join(parts, ", "));
  }
  fmt::print("\n");
  auto describe = [&](const char* key, const char* label) {
    if (!f.has(key)) return;
    const int64_t id = f.get_int(key);
    const std::string text = id >= 0 && id < static_cast<int64_t>(tokens.size()) ? tokens[static_cast<size_t>(id)] : "?";
    fmt::print("  {}: {} '{}'\n", label, id, text);
  };
  describe("tokenizer.ggml.bos_token_id", "bos");
  describe("tokenizer.ggml.eos_token_id", "eos");
  describe("tokenizer.ggml.eot_token_id", "eot");
  describe("tokenizer.ggml.unknown_token_id", "unk");
  describe("tokenizer.ggml.padding_token_id", "pad");
  fmt::print("  add bos: {}, add eos: {}\n", f.get_bool_or("tokenizer.ggml.add_bos_token", model == "llama"),
             f.get_bool_or("tokenizer.ggml.add_eos_token", false));
  if (f.has("tokenizer.chat_template")) {
    fmt::print("  chat template: {} characters\n", f.get_string("tokenizer.chat_template").size());
  }
}

struct InspectOptions {
  std::string path;
  bool all_metadata = false;
  PlacementOptions placement;
  KvDtype kv_dtype = KvDtype::kF16;
  int threads = 0;
};

// The plan of a device map: each device's parts, weight bytes and KV bytes per token, and the
// copies a step makes. Nothing is loaded.
void print_plan(const GgufFile& f, const InspectOptions& o) {
  DeviceRegistry devices(DeviceRegistry::Options{o.threads, default_matmul_mode()});
  const Placement p = plan_model_placement(f, o.placement.spec(), devices, KvBudget{}, o.kv_dtype);
  fmt::print("device plan ({} KV cache):\n{}", kv_dtype_name(o.kv_dtype), p.describe());
}

int run_inspect(const InspectOptions& o) {
  const std::string& path = o.path;
  const bool all_metadata = o.all_metadata;
  const GgufFile f = open_model_path(path);
  const std::string arch = f.get_string_or("general.architecture", "");
  if (f.assembled()) {
    fmt::print("folder: {} (Hugging Face safetensors, {} in {} shard{}, {} tensors, {} metadata keys)\n", path,
               human_bytes(static_cast<double>(f.file_size())), f.get_int_or("duet.hf.num_shards", 0),
               f.get_int_or("duet.hf.num_shards", 0) == 1 ? "" : "s", f.tensors().size(), f.metadata().size());
  } else {
    fmt::print("file: {} (GGUF v{}, {}, {} tensors, {} metadata keys, alignment {})\n", path, f.version(),
               human_bytes(static_cast<double>(f.file_size())), f.tensors().size(), f.metadata().size(), f.alignment());
  }
  fmt::print("architecture: {}\n", arch.empty() ? "(none)" : arch);
  if (f.has("general.name")) fmt::print("name: {}\n", f.get_string("general.name"));

  const std::string prefix = arch + ".";
  fmt::print("hyper-parameters:\n");
  for (const auto& [key, value] : f.metadata()) {
    if (!arch.empty() && key.rfind(prefix, 0) == 0) fmt::print("  {} = {}\n", key, value.to_string());
  }
  print_tokenizer(f);
  fmt::print("other metadata:\n");
  for (const auto& [key, value] : f.metadata()) {
    if (!arch.empty() && key.rfind(prefix, 0) == 0) continue;
    if (!all_metadata && (is_tokenizer_array(key) || key == "tokenizer.chat_template")) continue;
    fmt::print("  {} = {}\n", key, value.to_string());
  }

  if (f.tensors().empty()) {
    fmt::print("tensors: none (a vocabulary-only file)\n");
    return 0;
  }
  size_t name_width = 4;
  for (const GgufTensorInfo& t : f.tensors()) name_width = std::max(name_width, t.name.size());
  fmt::print("tensors:\n  {:<{}}  {:<7}  {:<20}  {:>14}\n", "name", name_width, "type", "shape", "bytes");
  int64_t params = 0;
  size_t bytes = 0;
  std::map<std::string, std::pair<int64_t, size_t>> by_type;
  for (const GgufTensorInfo& t : f.tensors()) {
    fmt::print("  {:<{}}  {:<7}  {:<20}  {:>14}\n", t.name, name_width, dtype_name(t.type), t.shape_string(), t.nbytes);
    params += t.num_elements();
    bytes += t.nbytes;
    auto& entry = by_type[std::string(dtype_name(t.type))];
    ++entry.first;
    entry.second += t.nbytes;
  }
  std::vector<std::string> parts;
  for (const auto& [type, entry] : by_type) parts.push_back(fmt::format("{} {} ({})", entry.first, type, human_bytes(static_cast<double>(entry.second))));
  fmt::print("parameters: {} ({}), tensor data {}, {:.2f} bits per weight\n", human_count(params), params,
             human_bytes(static_cast<double>(bytes)), params > 0 ? 8.0 * static_cast<double>(bytes) / static_cast<double>(params) : 0.0);
  fmt::print("tensor types: {}\n", fmt::join(parts, ", "));
  if (!o.placement.device_map.empty() || !o.placement.override_tensor.empty() || !o.placement.moe_experts.empty()) {
    print_plan(f, o);
  }
  return 0;
}

}  // namespace

void add_inspect_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("inspect", "Show a GGUF file's (or Hugging Face folder's) architecture, hyper-parameters, tokenizer and tensors");
  auto o = std::make_shared<InspectOptions>();
  cmd->add_option("file", o->path, "GGUF file or Hugging Face model folder")->required();
  cmd->add_flag("--all-metadata", o->all_metadata, "Also print the tokenizer's arrays and chat template (abbreviated)");
  add_placement_options(cmd, o->placement);
  add_kv_dtype_option(cmd, o->kv_dtype);
  cmd->add_option("-t,--threads", o->threads, "Threads of the cpu device (for auto's speed probe)");
  cmd->callback([o, &exit_code] { exit_code = run_inspect(*o); });
}

}  // namespace duet::cli
