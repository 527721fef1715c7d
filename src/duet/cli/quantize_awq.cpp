// `duet quantize IN OUT --type awq4`: activation-aware int4 (AWQ) for the llama-like architectures
// (llama, qwen2, qwen3), written as a GGUF file of Q4_1 tensors (int4 with a scale and a minimum per 32
// weights: AWQ's group-wise int4 with zero point, in a type that duet computes with and llama.cpp
// reads, so the result needs no new kernel and no AWQ-specific loader).
//
// 1. Calibration: the unquantized model runs over the calibration text (the model's tokenizer;
//    the built-in corpus when no --calibration file is given) on a backend that records, for each
//    weight matrix, the mean |x| of every input channel and the first activation rows.
// 2. Search, per layer and group of matrices that read one input: s = mean|x|^alpha, normalised,
//    for alpha in 0, 1/grid, ..., and the alpha whose Q4_1(W diag(s)) (x / s) is closest to W x on
//    the recorded rows wins (model/awq.h). alpha 0 is round-to-nearest, so no group gets worse.
//    Only one layer's group is held in f32 at a time; what is kept are the scales.
// 3. Folding: x / s has to come from the op before the matrices, so the file stays a plain model:
//      attn_q, attn_k, attn_v  <- attn_norm.weight / s
//      ffn_gate, ffn_up        <- ffn_norm.weight / s
//      attn_output             <- attn_v rows (and bias) / s; with grouped-query attention one
//                                 s per kv channel, from the mean over the query heads that share it
//      ffn_down                <- ffn_up rows / s (silu(gate) * up is linear in up)
// 4. Every weight matrix is written in Q4_1, like `--type q4_1`: the scaled ones from their scaled
//    f32 values, the token embedding and output head by round-to-nearest. The norms and biases
//    that absorbed 1/s are written in f32. Each row is rescaled from the input file as it is
//    written. (--awq-weights f32 writes the scaled matrices unrounded: the same function as the
//    input model, which is how the folding is tested.)
// AutoAWQ's weight clipping search is not done (only the scales), and deepseek2 (MLA, experts) is
// not supported yet.
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include <fmt/format.h>

#include "duet/cli/progress.h"
#include "duet/cli/quantize.h"
#include "duet/core/error.h"
#include "duet/core/quant.h"
#include "duet/engine/model_path.h"
#include "duet/model/awq.h"
#include "duet/model/model.h"
#include "duet/tokenizer/bpe_trainer.h"
#include "duet/tokenizer/tokenizer.h"

namespace duet::cli {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCode::kNotFound, "cannot open calibration file '{}'", path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A tensor of the file as f32, for the time one group is searched.
struct F32Tensor {
  std::vector<float> values;
  int64_t rows = 0;
  int64_t cols = 0;
};

// What folding the scales does to one tensor, applied row by row when the file is written (so
// only the scales are kept, not a copy of the model): element (r, c) of a matrix becomes
// w * col_mul[c] / row_div[r]; element c of a vector (a norm weight, a bias) becomes v / col_div[c].
struct Rescale {
  std::vector<float> col_mul;
  std::vector<float> row_div;
  std::vector<float> col_div;

  void apply(float* row, int64_t r, int64_t cols) const {
    for (int64_t c = 0; c < cols; ++c) {
      if (!col_mul.empty()) row[c] *= col_mul[static_cast<size_t>(c)];
      if (!row_div.empty()) row[c] /= row_div[static_cast<size_t>(r)];
      if (!col_div.empty()) row[c] /= col_div[static_cast<size_t>(c)];
    }
  }
};

struct WeightChoice {
  DType type;
  uint32_t file_type;
};

WeightChoice weight_choice(const std::string& name) {
  if (name == "q4_1") return {DType::kQ4_1, kFileTypeQ4_1};
  if (name == "f32") return {DType::kF32, 0};
  if (name == "f16") return {DType::kF16, 1};
  fail(ErrorCode::kInvalidArgument, "--awq-weights is '{}', expected q4_1, f32 or f16", name);
}

// The matrices whose recorded rows the search measures errors on: one per input (q for q/k/v,
// gate for gate/up).
bool searched_input(std::string_view name) {
  for (std::string_view suffix : {".attn_q.weight", ".attn_output.weight", ".ffn_gate.weight", ".ffn_down.weight"}) {
    if (name.ends_with(suffix)) return true;
  }
  return false;
}

class AwqQuantizer {
 public:
  AwqQuantizer(const QuantizeOptions& o, std::shared_ptr<const GgufFile> file)
      : o_(o), file_(std::move(file)), backend_(make_cpu_backend(o.threads, MatmulMode::kExact)),
        recorder_(*backend_, o.awq_samples, &searched_input), model_(load_model(file_, recorder_)) {}

  void calibrate();
  void search();
  int write();

 private:
  const GgufTensorInfo& info(const std::string& name) const;
  F32Tensor load(const std::string& name) const;
  const ActivationStats& input_of(const std::string& name) const { return recorder_.stats(name); }
  // Searches one group (on the file's weights as they are) and records its line of the report.
  AwqResult search_group(const std::string& label, const std::vector<std::string>& names, const ActivationStats& input);

  const QuantizeOptions& o_;
  std::shared_ptr<const GgufFile> file_;
  std::unique_ptr<Backend> backend_;
  ActivationRecorder recorder_;
  std::unique_ptr<Model> model_;
  std::map<std::string, Rescale> rescales_;
  int64_t num_calibration_tokens_ = 0;
  std::vector<std::string> report_;
  std::vector<double> ratios_;  // searched error / round-to-nearest error per group
  std::vector<float> alphas_;
};

const GgufTensorInfo& AwqQuantizer::info(const std::string& name) const {
  const GgufTensorInfo* t = file_->find_tensor(name);
  if (t == nullptr) fail(ErrorCode::kInternal, "'{}' has no tensor '{}'", file_->path(), name);
  return *t;
}

F32Tensor AwqQuantizer::load(const std::string& name) const {
  const GgufTensorInfo& t = info(name);
  F32Tensor out;
  out.cols = t.shape[0];
  out.rows = num_rows(t);
  out.values.resize(static_cast<size_t>(out.rows * out.cols));
  const size_t rb = row_size(t.type, out.cols);
  for (int64_t r = 0; r < out.rows; ++r) {
    dequantize_row_ref(t.type, t.data + static_cast<size_t>(r) * rb, out.values.data() + r * out.cols, out.cols);
  }
  return out;
}

void AwqQuantizer::calibrate() {
  const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_gguf(*file_);
  const std::string text = o_.calibration.empty() ? std::string(builtin_corpus()) : read_text(o_.calibration);
  std::vector<int32_t> ids = tokenizer->encode(text, true, false);
  if (static_cast<int64_t>(ids.size()) > o_.calibration_tokens) ids.resize(static_cast<size_t>(o_.calibration_tokens));
  if (ids.size() < 2) {
    fail(ErrorCode::kInvalidArgument, "the calibration text {} gives {} token(s); AWQ needs some text to calibrate on",
         o_.calibration.empty() ? "(built-in)" : "'" + o_.calibration + "'", ids.size());
  }
  const int64_t ctx = std::min<int64_t>(o_.calibration_ctx, model_->config().context_length);
  SequenceRunner runner(*model_, ctx, 16, KvDtype::kF32);  // the unquantized model, exactly as computed
  std::vector<float> logits(static_cast<size_t>(model_->config().num_vocab));
  Progress progress(fmt::format("calibrating on {} tokens", ids.size()));
  for (size_t begin = 0; begin < ids.size(); begin += static_cast<size_t>(ctx)) {
    const size_t end = std::min(ids.size(), begin + static_cast<size_t>(ctx));
    runner.forward(std::span<const int32_t>(ids.data() + begin, end - begin), 0, logits.data(), false);
    progress.update(end, ids.size());
  }
  progress.finish();
  num_calibration_tokens_ = static_cast<int64_t>(ids.size());
}

AwqResult AwqQuantizer::search_group(const std::string& label, const std::vector<std::string>& names,
                                     const ActivationStats& input) {
  std::vector<F32Tensor> weights;
  for (const std::string& name : names) weights.push_back(load(name));
  std::vector<AwqMatrix> group;
  for (const F32Tensor& t : weights) group.push_back({t.values.data(), t.rows});
  const int64_t cols = weights.front().cols;
  if (cols % kQK8_0 != 0) {  // Q4_1 rounding needs blocks of 32: such matrices fall back unscaled
    AwqResult none;
    none.scales.assign(static_cast<size_t>(cols), 1.0f);
    report_.push_back(fmt::format("{}: {} columns are not a multiple of 32, not scaled", label, cols));
    return none;
  }
  AwqResult r = awq_search(*backend_, group, cols, input, o_.awq_grid, DType::kQ4_1);
  const double ratio = r.rtn_error > 0.0 ? r.error / r.rtn_error : 1.0;
  ratios_.push_back(ratio);
  alphas_.push_back(r.alpha);
  report_.push_back(fmt::format("{}: alpha {:.2f}, output error {:.4g} (round-to-nearest {:.4g}, x{:.3f})", label,
                                r.alpha, r.error, r.rtn_error, ratio));
  return r;
}

void AwqQuantizer::search() {
  const ModelConfig& c = model_->config();
  const int64_t group_size = c.num_heads / c.num_kv_heads;
  Progress progress("searching AWQ scales");
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("blk.{}.", l);
    // The o_proj search runs on the original v; each search sees the weights as they are
    // before any scale of this layer is applied, as the activations were recorded.
    const AwqResult qkv = search_group(p + "attn_qkv", {p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"},
                                       input_of(p + "attn_q.weight"));
    // o_proj's input channel (head h, j) is v's channel (kv head h / group_size, j): one mean per
    // kv channel (over the query heads that read it), so that one s can be folded into v.
    ActivationStats o_input = input_of(p + "attn_output.weight");
    if (group_size > 1) {
      std::vector<double> kv_sum(static_cast<size_t>(c.kv_dim()), 0.0);
      for (int64_t h = 0; h < c.num_heads; ++h) {
        for (int64_t j = 0; j < c.head_dim; ++j) {
          const size_t kv_channel = static_cast<size_t>((h / group_size) * c.head_dim + j);
          kv_sum[kv_channel] += o_input.sum_abs[static_cast<size_t>(h * c.head_dim + j)];
        }
      }
      for (int64_t h = 0; h < c.num_heads; ++h) {
        for (int64_t j = 0; j < c.head_dim; ++j) {
          o_input.sum_abs[static_cast<size_t>(h * c.head_dim + j)] =
              kv_sum[static_cast<size_t>((h / group_size) * c.head_dim + j)] / static_cast<double>(group_size);
        }
      }
    }
    const AwqResult o = search_group(p + "attn_output", {p + "attn_output.weight"}, o_input);
    const AwqResult ffn =
        search_group(p + "ffn_gate_up", {p + "ffn_gate.weight", p + "ffn_up.weight"}, input_of(p + "ffn_gate.weight"));
    const AwqResult down = search_group(p + "ffn_down", {p + "ffn_down.weight"}, input_of(p + "ffn_down.weight"));

    for (const char* name : {"attn_q.weight", "attn_k.weight", "attn_v.weight"}) rescales_[p + name].col_mul = qkv.scales;
    rescales_[p + "attn_norm.weight"].col_div = qkv.scales;
    std::vector<float> o_kv(static_cast<size_t>(c.kv_dim()));
    for (int64_t i = 0; i < c.kv_dim(); ++i) {
      const int64_t h = (i / c.head_dim) * group_size;  // the first query head reading kv channel i
      o_kv[static_cast<size_t>(i)] = o.scales[static_cast<size_t>(h * c.head_dim + i % c.head_dim)];
    }
    rescales_[p + "attn_output.weight"].col_mul = o.scales;
    rescales_[p + "attn_v.weight"].row_div = o_kv;
    if (file_->find_tensor(p + "attn_v.bias") != nullptr) rescales_[p + "attn_v.bias"].col_div = o_kv;
    for (const char* name : {"ffn_gate.weight", "ffn_up.weight"}) rescales_[p + name].col_mul = ffn.scales;
    rescales_[p + "ffn_norm.weight"].col_div = ffn.scales;
    rescales_[p + "ffn_down.weight"].col_mul = down.scales;
    rescales_[p + "ffn_up.weight"].row_div = down.scales;
    progress.update(static_cast<size_t>(l + 1), static_cast<size_t>(c.num_layers));
  }
  progress.finish();
}

int AwqQuantizer::write() {
  const WeightChoice weights = weight_choice(o_.awq_weights);
  ThreadPool pool(o_.threads);
  GgufWriter w;
  copy_metadata(w, *file_, weights.file_type);
  std::map<std::string, int> counts;
  for (const GgufTensorInfo& t : file_->tensors()) {
    const auto rescale = rescales_.find(t.name);
    DType type = t.type;
    if (is_quantizable(t)) {
      type = fitting_type(t, weights.type);
    } else if (rescale != rescales_.end()) {
      type = DType::kF32;  // a norm weight or bias that absorbed 1/s
    }
    ++counts[std::string(dtype_name(type))];
    std::vector<int64_t> order = gguf_row_order(*file_, t);
    if (rescale != rescales_.end()) {
      const Rescale* rs = &rescale->second;
      w.add_tensor(t.name, type, t.shape,
                   convert_fill(t, type, pool, std::move(order),
                                [rs](float* row, int64_t input_row, int64_t cols) { rs->apply(row, input_row, cols); }));
    } else if (type != t.type || !order.empty()) {
      w.add_tensor(t.name, type, t.shape, convert_fill(t, type, pool, std::move(order)));
    } else {
      w.add_tensor(t.name, t.type, t.shape, [&t](uint8_t* dst, size_t nbytes) { std::memcpy(dst, t.data, nbytes); });
    }
  }
  const double secs = write_with_progress(w, o_.output, fmt::format("writing awq4 ({})", o_.awq_weights));

  if (o_.verbose) {
    for (const std::string& line : report_) fmt::print(stderr, "{}\n", line);
  }
  double log_sum = 0.0, worst = 0.0, alpha_sum = 0.0;
  for (double r : ratios_) {
    log_sum += std::log(std::max(r, 1e-30));
    worst = std::max(worst, r);
  }
  for (float a : alphas_) alpha_sum += a;
  const double n = static_cast<double>(std::max<size_t>(ratios_.size(), 1));
  std::vector<std::string> parts;
  for (const auto& [name, count] : counts) parts.push_back(fmt::format("{} {}", name, count));
  fmt::print(stderr,
             "wrote {} (awq4: {}, file type {}): {} tensors ({}) in {:.1f} s\n"
             "AWQ: {} calibration tokens, {} groups searched over {} alphas: output error x{:.3f} of round-to-nearest "
             "(geometric mean; worst x{:.3f}), mean alpha {:.2f}\n",
             o_.output, o_.awq_weights, weights.file_type, file_->tensors().size(), fmt::join(parts, ", "), secs,
             num_calibration_tokens_,
             ratios_.size(), o_.awq_grid, std::exp(log_sum / n), worst, alpha_sum / n);
  return 0;
}

}  // namespace

int run_quantize_awq(const QuantizeOptions& o) {
  (void)weight_choice(o.awq_weights);
  if (o.awq_grid < 1) fail(ErrorCode::kInvalidArgument, "--awq-grid is {}, expected at least 1", o.awq_grid);
  if (o.awq_samples < 1) fail(ErrorCode::kInvalidArgument, "--awq-samples is {}, expected at least 1", o.awq_samples);
  if (o.calibration_tokens < 2) {
    fail(ErrorCode::kInvalidArgument, "--calibration-tokens is {}, expected at least 2", o.calibration_tokens);
  }
  if (o.calibration_ctx < 1) fail(ErrorCode::kInvalidArgument, "--calibration-ctx is {}, expected at least 1", o.calibration_ctx);
  auto file = std::make_shared<const GgufFile>(open_model_path(o.input));
  const std::string arch = file->get_string_or("general.architecture", "");
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3") {
    fail(ErrorCode::kUnsupported, "--type awq4 supports the llama, qwen2 and qwen3 architectures; '{}' is {}", o.input,
         arch.empty() ? "of no architecture" : "'" + arch + "'");
  }
  AwqQuantizer q(o, std::move(file));
  q.calibrate();
  q.search();
  return q.write();
}

}  // namespace duet::cli
