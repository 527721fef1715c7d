// What `duet quantize` (quantize.cpp) and its AWQ path (quantize_awq.cpp) share.
#pragma once

#include <cstdint>
#include <string>

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
// Fills the tensor's bytes with `t` converted to `type`, rows spread over the pool.
GgufWriter::Fill convert_fill(const GgufTensorInfo& t, DType type, ThreadPool& pool);
// Every metadata key of `f` but the split ones, with the quantization version and file type set.
void copy_metadata(GgufWriter& w, const GgufFile& f, uint32_t file_type);
// Writes `w` to `path` under a progress bar labelled `label`; returns the seconds it took.
double write_with_progress(GgufWriter& w, const std::string& path, const std::string& label);

// `--type awq4`: calibration, the scale search, and the Q4_1 file (quantize_awq.cpp).
int run_quantize_awq(const QuantizeOptions& o);

}  // namespace duet::cli
