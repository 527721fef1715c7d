// Writes a GGUF model (llama, qwen2, qwen3, deepseek2 or deepseek32, in llama.cpp's layout) as a
// Hugging Face folder: config.json, generation_config.json and the weights as safetensors, the inverse of what
// hf_config and hf_folder read (the tokenizer files are the tokenizer library's: see
// tokenizer/hf_tokenizer_writer.h). What llama.cpp's converter does is undone: names
// (blk.N.attn_q.weight -> model.layers.N.self_attn.q_proj.weight), shapes in PyTorch's order,
// llama's q/k rows back to Hugging Face's order (the GGUF permutes them for adjacent-pair rope),
// deepseek2's stacked experts back to one tensor per expert, and the split MLA layout
// (attn_k_b/attn_v_b) joined back into kv_b_proj.
//
// Weight types: the matrices in f32, f16 or bf16; the tensors the GGUF keeps in f32 (norms,
// biases, the MoE router and its correction bias) stay f32, so a folder written in the GGUF's
// own type holds exactly its values. Or the layers' projections (every *_proj.weight inside
// model.layers, experts included) quantized as checkpoints publish them, the rest in bf16 (FP8)
// or f16 (AWQ):
//   fp8: DeepSeek-V3's e4m3 weights with weight_scale_inv per 128 x 128 block and its
//        quantization_config {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme":
//        "dynamic", "weight_block_size": [128, 128]};
//   awq: AutoAWQ's int4 GEMM layout (qweight, qzeros, scales; group_size inputs per scale, zero
//        points) with {"quant_method": "awq", "bits": 4, "group_size", "zero_point": true,
//        "version": "gemm"}.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "duet/core/dtype.h"
#include "duet/formats/gguf.h"

namespace duet {

enum class HfQuant { kNone, kFp8, kAwq };

struct HfWriteOptions {
  DType type = DType::kBF16;  // the matrices' type without quantization: F32, F16 or BF16
  HfQuant quant = HfQuant::kNone;
  int64_t awq_group = 128;
  // Shards of at most this many bytes (0: one model.safetensors whatever its size).
  uint64_t max_shard_bytes = 0;
};

// Writes config.json, generation_config.json and the safetensors into `dir` (created if needed).
// Returns the files written. Throws kUnsupported for an architecture or tensor it cannot map,
// kInvalidArgument for shapes the quantization cannot take (AWQ: outputs a multiple of 8, inputs
// of the group).
std::vector<std::string> write_hf_model(const GgufFile& gguf, const std::string& dir, const HfWriteOptions& options);

}  // namespace duet
