// `duet quantize IN OUT --type T`: converts a model's weight matrices to a block-quantized type
// the way llama-quantize does without an importance matrix, so that the tensor data is
// byte-identical to llama.cpp's for the same input. IN is a GGUF file or a Hugging Face folder
// (read through open_model_path, so the output carries the folder's config, tokenizer and
// generation defaults as GGUF keys); OUT is always one GGUF file.
//
// Which tensors: names ending in "weight" with two or more dimensions, except norms
// ("_norm.weight") and MoE routers ("ffn_gate_inp.weight") (llama-quantize's rules for the
// architectures duet runs). Everything else (norms, biases, 1-D tensors) is copied unchanged, and
// so is a tensor already in its target type. Every metadata key is copied;
// general.quantization_version becomes 2 and general.file_type llama.cpp's ftype number.
//
// Types: q8_0, q4_0, q4_1, q4_k, q5_k, q6_k quantize every such tensor to that one type (what
// `llama-quantize --pure` writes for Q8_0, Q4_0, Q4_1, Q4_K_S, Q5_K_S, Q6_K). q4_k_m is llama.cpp's
// Q4_K_M mix (llama_tensor_get_type in llama.cpp's src/llama-quant.cpp), with every other
// weight in Q4_K:
//   - output.weight (or token_embd.weight when the output is tied to it): Q6_K; Q8_0 when its
//     rows are not a multiple of 256;
//   - attn_v.weight: Q6_K when use_more_bits(i, n), where i counts attn_v tensors in layer order
//     and n counts attn_v + attn_qkv + attn_kv_b tensors; Q5_K instead of Q4_K in 80-layer llama
//     (GQA) and qwen2 models ("70B"); Q8_0 in 8-expert models;
//   - ffn_down* : Q6_K when use_more_bits(layer, number of layers);
//   - attn_k.weight: Q8_0 in 8-expert models; attn_output.weight: Q5_K in 8-expert models;
//     attn_qkv.weight: Q5_K;
//   use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2: the first and last eighth
//   of the layers and every third layer in between.
// Rows that are not a multiple of the block size (256 for K-quants) fall back to q8_0, or to f16
// when not a multiple of 32. (llama.cpp falls back to q5_0 for Q4_K and q5_1 for Q5_K; duet does
// not write those types, so q4_k_m files differ there, e.g. DeepSeek-Coder's ffn_down, rows of
// 5504.)
// awq4 is activation-aware int4 (quantize_awq.cpp): the q4_1 tensors, with the block matrices'
// input channels scaled by a search on calibration activations first.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "duet/cli/commands.h"
#include "duet/cli/progress.h"
#include "duet/cli/quantize.h"
#include "duet/cli/units.h"
#include "duet/core/error.h"
#include "duet/core/quant.h"
#include "duet/core/thread_pool.h"
#include "duet/engine/model_path.h"
#include "duet/formats/gguf_writer.h"

namespace duet::cli {
namespace {

struct Scheme {
  std::string_view name;
  DType type;          // the type of every quantized tensor (the default one for a mix)
  uint32_t file_type;  // llama.cpp's llama_ftype
  bool mixed;          // Q4_K_M's per-tensor choice
};

constexpr Scheme kSchemes[] = {
    {"q8_0", DType::kQ8_0, 7, false},  {"q4_0", DType::kQ4_0, 2, false},  {"q4_1", DType::kQ4_1, kFileTypeQ4_1, false},
    {"q4_k", DType::kQ4_K, 14, false}, {"q5_k", DType::kQ5_K, 16, false}, {"q6_k", DType::kQ6_K, 18, false},
    {"q4_k_m", DType::kQ4_K, 15, true},
};

const Scheme& parse_scheme(const std::string& name) {
  std::string lower = name;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const Scheme& s : kSchemes) {
    if (s.name == lower) return s;
  }
  fail(ErrorCode::kInvalidArgument, "unknown --type '{}' (expected q8_0, q4_0, q4_1, q4_k, q5_k, q6_k, q4_k_m or awq4)",
       name);
}

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// Dimensions after dropping trailing ones, as ggml_n_dims counts them.
int num_dims(const GgufTensorInfo& t) {
  int n = static_cast<int>(t.shape.size());
  while (n > 1 && t.shape[static_cast<size_t>(n - 1)] == 1) --n;
  return n;
}

// The layer of "blk.N.*", or -1.
int layer_of(const std::string& name) {
  int layer = -1;
  if (std::sscanf(name.c_str(), "blk.%d.", &layer) != 1) return -1;
  return layer;
}

bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// Q4_K_M's choice for every quantizable tensor, indexed like f.tensors(). Tensors are visited in
// llama.cpp's order (layer, then name), which its attn_v and ffn_down counters depend on.
std::vector<DType> q4_k_m_types(const GgufFile& f, const std::vector<size_t>& quantizable) {
  const std::string arch = f.get_string_or("general.architecture", "llama");
  const int num_layers = static_cast<int>(f.get_int_or(arch + ".block_count", 0));
  const int num_experts = static_cast<int>(f.get_int_or(arch + ".expert_count", 0));
  const int64_t num_heads = f.get_int_or(arch + ".attention.head_count", 0);
  const int64_t num_kv_heads = f.get_int_or(arch + ".attention.head_count_kv", num_heads);
  const bool is_70b = num_layers == 80 && num_experts != 8 &&
                      ((arch == "llama" && num_heads != num_kv_heads) || arch == "qwen2" || arch == "qwen2vl");

  std::vector<size_t> order = quantizable;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const std::string& na = f.tensors()[a].name;
    const std::string& nb = f.tensors()[b].name;
    const int la = layer_of(na), lb = layer_of(nb);
    return la != lb ? la < lb : na < nb;
  });
  bool has_output = false;
  int num_attention_wv = 0;
  for (const GgufTensorInfo& t : f.tensors()) {
    if (contains(t.name, "attn_v.weight") || contains(t.name, "attn_qkv.weight") || contains(t.name, "attn_kv_b.weight")) {
      ++num_attention_wv;
    } else if (t.name == "output.weight") {
      has_output = true;
    }
  }

  std::vector<DType> types(f.tensors().size(), DType::kQ4_K);
  int attn_v_index = 0, ffn_down_index = 0;
  for (size_t index : order) {
    const GgufTensorInfo& t = f.tensors()[index];
    const std::string& name = t.name;
    DType type = DType::kQ4_K;
    if (name == "output.weight" || (!has_output && name == "token_embd.weight")) {
      type = t.shape[0] % kQK_K != 0 ? DType::kQ8_0 : DType::kQ6_K;
    } else if (name == "token_embd.weight") {
      // stays Q4_K
    } else if (contains(name, "attn_v.weight")) {
      if (use_more_bits(attn_v_index, num_attention_wv)) type = DType::kQ6_K;
      if (is_70b && type == DType::kQ4_K) type = DType::kQ5_K;
      if (num_experts == 8) type = DType::kQ8_0;
      ++attn_v_index;
    } else if (contains(name, "attn_k.weight")) {
      if (num_experts == 8) type = DType::kQ8_0;
    } else if (contains(name, "ffn_down")) {
      // With experts llama.cpp reads the layer from the name; otherwise it counts.
      const int layer = num_experts > 1 ? layer_of(name) : ffn_down_index;
      if (use_more_bits(layer, num_layers)) type = DType::kQ6_K;
      ++ffn_down_index;
    } else if (contains(name, "attn_output.weight")) {
      if (num_experts == 8) type = DType::kQ5_K;
    } else if (contains(name, "attn_qkv.weight")) {
      type = DType::kQ5_K;
    }
    types[index] = type;
  }
  return types;
}

// What happens to one tensor.
struct TensorPlan {
  DType type;
  bool convert;   // false: copied unchanged
  bool fallback;  // rows did not fit the chosen block size
};

std::vector<TensorPlan> plan_tensors(const GgufFile& f, const Scheme& scheme) {
  std::vector<size_t> quantizable;
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    if (is_quantizable(f.tensors()[i])) quantizable.push_back(i);
  }
  const std::vector<DType> mix = scheme.mixed ? q4_k_m_types(f, quantizable) : std::vector<DType>{};
  std::vector<TensorPlan> plans;
  std::vector<std::string> not_convertible;
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const GgufTensorInfo& t = f.tensors()[i];
    if (!is_quantizable(t)) {
      plans.push_back({t.type, false, false});
      continue;
    }
    const DType wanted = scheme.mixed ? mix[i] : scheme.type;
    const DType type = fitting_type(t, wanted);
    const bool fallback = type != wanted;
    const bool convert = type != t.type;
    if (convert && !traits(t.type).can_compute) {
      not_convertible.push_back(fmt::format("'{}' ({})", t.name, dtype_name(t.type)));
    }
    plans.push_back({type, convert, fallback});
  }
  if (!not_convertible.empty()) {
    fail(ErrorCode::kUnsupported, "{}: cannot convert from the type of {} tensor(s): {}", f.path(),
         not_convertible.size(), fmt::join(not_convertible, ", "));
  }
  return plans;
}

int run_quantize(const QuantizeOptions& o) {
  if (o.type == "awq4" || o.type == "AWQ4") return run_quantize_awq(o);
  const Scheme& scheme = parse_scheme(o.type);
  const GgufFile f = open_model_path(o.input);
  const std::vector<TensorPlan> plans = plan_tensors(f, scheme);

  ThreadPool pool(o.threads);
  GgufWriter w;
  copy_metadata(w, f, scheme.file_type);

  std::map<std::string, int> counts;  // "q4_k" -> tensors written in it
  std::vector<std::string> fallbacks;
  size_t bytes_in = 0, bytes_out = 0;
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const GgufTensorInfo& t = f.tensors()[i];
    const TensorPlan& p = plans[i];
    ++counts[std::string(dtype_name(p.type))];
    if (p.fallback) fallbacks.push_back(fmt::format("{} ({} per row)", t.name, t.shape[0]));
    bytes_in += t.nbytes;
    bytes_out += row_size(p.type, t.shape[0]) * static_cast<size_t>(num_rows(t));
    std::vector<int64_t> order = gguf_row_order(f, t);
    if (p.convert || !order.empty()) {
      w.add_tensor(t.name, p.type, t.shape, convert_fill(t, p.type, pool, std::move(order)));
    } else {
      w.add_tensor(t.name, t.type, t.shape, [&t](uint8_t* dst, size_t nbytes) { std::memcpy(dst, t.data, nbytes); });
    }
  }

  const double secs = write_with_progress(w, o.output, fmt::format("quantizing to {}", scheme.name));

  std::vector<std::string> parts;
  for (const auto& [name, count] : counts) parts.push_back(fmt::format("{} {}", name, count));
  fmt::print(stderr, "wrote {} ({}, file type {}): {} tensors ({}), {} -> {} in {:.1f} s\n", o.output, scheme.name,
             scheme.file_type, f.tensors().size(), fmt::join(parts, ", "), human_bytes(static_cast<double>(bytes_in)),
             human_bytes(static_cast<double>(bytes_out)), secs);
  if (!fallbacks.empty()) {
    const size_t shown = std::min<size_t>(fallbacks.size(), 4);
    fmt::print(stderr, "{} tensor(s) with rows that do not fit the block size fell back to q8_0 (f16 if not a "
               "multiple of 32): {}{}\n", fallbacks.size(),
               fmt::join(fallbacks.begin(), fallbacks.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
               fallbacks.size() > shown ? ", ..." : "");
  }
  return 0;
}

}  // namespace

bool is_quantizable(const GgufTensorInfo& t) {
  const std::string_view name = t.name;
  return name.size() >= 6 && name.substr(name.size() - 6) == "weight" && num_dims(t) >= 2 &&
         !contains(name, "_norm.weight") && !contains(name, "ffn_gate_inp.weight");
}

int64_t num_rows(const GgufTensorInfo& t) { return t.shape[0] > 0 ? t.num_elements() / t.shape[0] : 0; }

DType fitting_type(const GgufTensorInfo& t, DType type) {
  if (t.shape[0] % traits(type).block_size == 0) return type;
  return t.shape[0] % kQK8_0 == 0 ? DType::kQ8_0 : DType::kF16;
}

GgufWriter::Fill convert_fill(const GgufTensorInfo& t, DType type, ThreadPool& pool, std::vector<int64_t> order,
                              RowTransform transform) {
  return [&t, type, &pool, order = std::move(order), transform = std::move(transform)](uint8_t* dst, size_t nbytes) {
    const int64_t n = t.shape[0];
    const int64_t rows = num_rows(t);
    const size_t src_row = row_size(t.type, n);
    const size_t dst_row = row_size(type, n);
    if (dst_row * static_cast<size_t>(rows) != nbytes) fail(ErrorCode::kInternal, "'{}': size mismatch", t.name);
    if (!order.empty() && static_cast<int64_t>(order.size()) != rows) {
      fail(ErrorCode::kInternal, "'{}': a row order of {} for {} rows", t.name, order.size(), rows);
    }
    const bool copy = type == t.type && !transform;
    pool.parallel_for(rows, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> row(static_cast<size_t>(n));
      for (int64_t r = begin; r < end; ++r) {
        const int64_t in = order.empty() ? r : order[static_cast<size_t>(r)];
        const uint8_t* src = t.data + static_cast<size_t>(in) * src_row;
        uint8_t* out = dst + static_cast<size_t>(r) * dst_row;
        if (copy) {
          std::memcpy(out, src, dst_row);
          continue;
        }
        dequantize_row_ref(t.type, src, row.data(), n);
        if (transform) transform(row.data(), in, n);
        quantize_row_ref(type, row.data(), out, n);
      }
    });
  };
}

namespace {

bool rope_rows_to_gguf_order(const GgufFile& f) {
  return f.get_string_or("general.architecture", "") == "llama" && f.get_string_or("duet.rope.layout", "") == "neox";
}

}  // namespace

std::vector<int64_t> gguf_row_order(const GgufFile& f, const GgufTensorInfo& t) {
  if (!rope_rows_to_gguf_order(f) || t.shape.size() != 2) return {};
  const bool q = t.name.ends_with(".attn_q.weight");
  if (!q && !t.name.ends_with(".attn_k.weight")) return {};
  const int64_t heads = f.get_int_or(q ? "llama.attention.head_count" : "llama.attention.head_count_kv",
                                     f.get_int_or("llama.attention.head_count", 0));
  const int64_t rows = num_rows(t);
  if (heads <= 0 || rows % (2 * heads) != 0) {
    fail(ErrorCode::kInvalidArgument, "'{}': {} rows do not split into {} heads of an even size", t.name, rows, heads);
  }
  const int64_t d = rows / heads;
  std::vector<int64_t> order(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t h = r / d, i = (r % d) / 2, j = r % 2;
    order[static_cast<size_t>(r)] = h * d + j * (d / 2) + i;
  }
  return order;
}

void copy_metadata(GgufWriter& w, const GgufFile& f, uint32_t file_type) {
  const bool reorder = rope_rows_to_gguf_order(f);
  for (const auto& [key, value] : f.metadata()) {
    if (key == "split.no" || key == "split.count" || key == "split.tensors.count") continue;
    if (reorder && key == "duet.rope.layout") continue;
    w.set(key, value);
  }
  w.set("general.quantization_version", GgufValue::u32(2));
  w.set("general.file_type", GgufValue::u32(file_type));
}

double write_with_progress(GgufWriter& w, const std::string& path, const std::string& label) {
  const auto start = std::chrono::steady_clock::now();
  Progress progress(label);
  w.write(path, 3, [&](size_t done, size_t total) { progress.update(done, total); });
  progress.finish();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void add_quantize_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("quantize", "Convert a model's weights to a block-quantized type (as llama-quantize) "
                                             "or to activation-aware int4 (AWQ)");
  auto o = std::make_shared<QuantizeOptions>();
  cmd->add_option("input", o->input, "GGUF model file or Hugging Face model folder (any type duet can read)")->required();
  cmd->add_option("output", o->output, "Output GGUF file")->required();
  cmd->add_option("--type", o->type, "q8_0, q4_0, q4_1, q4_k, q5_k, q6_k (one type for every weight matrix), q4_k_m "
                                     "(llama.cpp's Q4_K_M mix) or awq4 (q4_1 after an activation-aware scale search)")
      ->required();
  cmd->add_option("-t,--threads", o->threads, "Threads (default: all)");
  cmd->add_option("--calibration", o->calibration, "awq4: plain-text file to calibrate on (default: the built-in corpus)");
  cmd->add_option("--calibration-tokens", o->calibration_tokens, "awq4: tokens of calibration text to run")
      ->capture_default_str();
  cmd->add_option("--calibration-ctx", o->calibration_ctx, "awq4: longest sequence the calibration text is cut into")
      ->capture_default_str();
  cmd->add_option("--awq-samples", o->awq_samples, "awq4: activation rows per matrix the output error is measured on")
      ->capture_default_str();
  cmd->add_option("--awq-grid", o->awq_grid, "awq4: alphas tried, 0, 1/N, ..., (N-1)/N (1: round-to-nearest only)")
      ->capture_default_str();
  cmd->add_option("--awq-weights", o->awq_weights, "awq4: write the weight matrices in q4_1, or scaled but unrounded "
                                                   "in f32 or f16 (to check the folding, or for another quantizer)")
      ->capture_default_str();
  cmd->add_flag("-v,--verbose", o->verbose, "awq4: print every group's alpha and output errors");
  cmd->callback([o, &exit_code] { exit_code = run_quantize(*o); });
}

}  // namespace duet::cli
