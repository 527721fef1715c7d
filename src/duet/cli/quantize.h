// What `duet quantize` (quantize.cpp) shares with the quantizers that build on it.
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

}  // namespace duet::cli
