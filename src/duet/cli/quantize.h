// What `duet quantize` (quantize.cpp) and its AWQ path (quantize_awq.cpp) share.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "duet/core/thread_pool.h"
#include "duet/formats/gguf.h"
#include "duet/formats/gguf_writer.h"

namespace duet::cli {

struct QuantizeOptions {
  std::string input;
  std::string output;
  std::string type;
  int threads = 0;
  // awq4
  std::string calibration;          // plain text; empty: the built-in corpus
  int64_t calibration_tokens = 512;  // at most this many tokens of it
  int64_t calibration_ctx = 256;     // run as sequences of at most this many tokens
  int64_t awq_samples = 512;        // activation rows kept per matrix to measure output errors on
  int awq_grid = 20;                // alphas 0, 1/grid, ..., (grid - 1)/grid
  std::string awq_weights = "q4_1";  // the type the scaled matrices are written in (f32, f16: checks)
  bool verbose = false;
};

// llama.cpp's file type number for Q4_1 (LLAMA_FTYPE_MOSTLY_Q4_1).
constexpr uint32_t kFileTypeQ4_1 = 3;

// Weight matrices llama-quantize converts: names ending in "weight" with two or more dimensions,
// except norms and MoE routers.
bool is_quantizable(const GgufTensorInfo& t);
// Rows of a tensor: every dimension but the first.
int64_t num_rows(const GgufTensorInfo& t);
// The type a quantizable tensor gets when its rows do not fit `type`'s blocks: q8_0, or f16 when
// not a multiple of 32; `type` itself when they fit.
DType fitting_type(const GgufTensorInfo& t, DType type);
// A row of f32 values on its way to the output, given the input row it came from.
using RowTransform = std::function<void(float* row, int64_t input_row, int64_t cols)>;
// Fills the tensor's bytes with `t`'s rows in `type`, rows spread over the pool: output row r is
// input row order[r] (every row in place when `order` is empty), passed through `transform` when
// one is given. Rows already in `type` and not transformed are copied as they are.
GgufWriter::Fill convert_fill(const GgufTensorInfo& t, DType type, ThreadPool& pool, std::vector<int64_t> order = {},
                              RowTransform transform = nullptr);

// A llama Hugging Face folder keeps q/k rows in Hugging Face's order and says
// duet.rope.layout = "neox"; a llama GGUF file stores them permuted for adjacent-pair rope, as
// llama.cpp's converter does (within each head, row j * d/2 + i becomes row 2i + j). For such an
// input, the input row of every output row of attn_q/attn_k (q over the heads, k over the kv
// heads); empty for any other tensor or input. So the output is the GGUF file llama.cpp reads.
std::vector<int64_t> gguf_row_order(const GgufFile& f, const GgufTensorInfo& t);
// Every metadata key of `f` but the split ones (and duet.rope.layout when the rows are put in GGUF
// order), with the quantization version and file type set.
void copy_metadata(GgufWriter& w, const GgufFile& f, uint32_t file_type);
// Writes `w` to `path` under a progress bar labelled `label`; returns the seconds it took.
double write_with_progress(GgufWriter& w, const std::string& path, const std::string& label);

// `--type awq4`: calibration, the scale search, and the Q4_1 file (quantize_awq.cpp).
int run_quantize_awq(const QuantizeOptions& o);

}  // namespace duet::cli
