#include "duet/model/weights.h"

#include <fmt/format.h>

#include "duet/core/error.h"
#include "duet/core/quant.h"

namespace duet {

const GgufTensorInfo* WeightBinder::lookup(const std::string& name, const std::vector<int64_t>& shape,
                                           const std::string& what) {
  const GgufTensorInfo* t = file_.find_tensor(name);
  if (t == nullptr) {
    problems_.push_back(fmt::format("tensor '{}' is missing ({} of shape [{}])", name, what, fmt::join(shape, ", ")));
    return nullptr;
  }
  if (t->shape != shape) {
    problems_.push_back(
        fmt::format("tensor '{}' has shape {}, expected [{}] ({})", name, t->shape_string(), fmt::join(shape, ", "), what));
    return nullptr;
  }
  if (!traits(t->type).can_compute) {
    problems_.push_back(fmt::format("tensor '{}' has type {}, which this build cannot compute with yet", name,
                                    dtype_name(t->type)));
    return nullptr;
  }
  return t;
}

WeightView WeightBinder::matrix(const std::string& name, int64_t rows, int64_t cols) {
  const GgufTensorInfo* t = lookup(name, {cols, rows}, fmt::format("{} x {} matrix", rows, cols));
  if (t == nullptr) return WeightView{};
  return WeightView{t->name, t->type, rows, cols, t->data};
}

WeightView WeightBinder::experts(const std::string& name, int64_t num_experts, int64_t rows, int64_t cols) {
  const GgufTensorInfo* t =
      lookup(name, {cols, rows, num_experts}, fmt::format("{} experts of {} x {}", num_experts, rows, cols));
  if (t == nullptr) return WeightView{};
  return WeightView{t->name, t->type, rows * num_experts, cols, t->data};
}

WeightView WeightBinder::vector(const std::string& name, int64_t n) {
  const GgufTensorInfo* t = lookup(name, {n}, fmt::format("vector of {}", n));
  if (t == nullptr) return WeightView{};
  if (t->type == DType::kF32) return WeightView{t->name, DType::kF32, 1, n, t->data};
  std::vector<float>& out = converted_.emplace_back(static_cast<size_t>(n));
  dequantize_row_ref(t->type, t->data, out.data(), n);
  return WeightView{t->name, DType::kF32, 1, n, out.data()};
}

void WeightBinder::finish() const {
  if (problems_.empty()) return;
  // A Hugging Face folder is read under GGUF names; say how they map.
  const char* note = file_.assembled() ? "\n(the folder's tensors go by their GGUF names: model.layers.N.self_attn.q_proj.weight "
                                         "is blk.N.attn_q.weight, model.embed_tokens.weight is token_embd.weight, ...)"
                                       : "";
  fail(ErrorCode::kInvalidArgument, "'{}': {} problem{} with the model's tensors:\n  {}{}", file_.path(), problems_.size(),
       problems_.size() == 1 ? "" : "s", fmt::join(problems_, "\n  "), note);
}

}  // namespace duet
