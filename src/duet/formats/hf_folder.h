// A Hugging Face model folder (config.json, *.safetensors shards with
// model.safetensors.index.json or one model.safetensors, generation_config.json) read as an
// in-memory GgufFile: the metadata translated to GGUF keys (hf_config.h), the tensors renamed to
// GGUF names and used in place from the mapped shards. Shapes are reversed (GGUF lists the
// innermost dimension first). Two things cannot be used in place:
//   - the routed experts, one tensor per expert in the checkpoint, are stacked into one owned
//     buffer per layer and kind (blk.N.ffn_{gate,up,down}_exps.weight), as the GGUF layout
//     the models bind has them;
//   - nothing else: llama's q/k rows stay in Hugging Face's order and the file says so with
//     duet.rope.layout = "neox" (llama GGUF files permute those rows for adjacent-pair rope).
// DeepSeek-V3's multi-token-prediction layers (model.layers.N for N >= num_hidden_layers) are
// skipped, and duet.hf.mtp_layers_skipped says how many, unless `with_mtp`: then they are read
// as blk.N.* (the decoder block under the usual names, enorm/hnorm/eh_proj/shared_head under
// llama.cpp's blk.N.nextn.* names) and <arch>.nextn_predict_layers counts them. The tokenizer's metadata comes from the caller (tokenizer/hf_tokenizer.h), since
// the pre-tokenizer is the tokenizer library's to name.
#pragma once

#include <string>

#include "duet/formats/gguf.h"
#include "duet/formats/hf_config.h"

namespace duet {

// What becomes of the weights converted at load (FP8 and AWQ weights, stacked experts): kept, or
// discardable once a backend serves them from a packed copy of its own (Model frees them then,
// see discard_copy). Discardable only for a caller that reads the weights through the model it
// loads and nothing else (a server, a generator), never one that reads the file's tensors again
// afterwards (a quantizer, a second model over the same file).
enum class ConvertedCopies { kKeep, kDiscardable };

// True when `path` is a directory holding a config.json.
bool is_hf_folder(const std::string& path);

// Reads the folder. `tokenizer_metadata` is appended to the translated metadata. Throws Error:
// kNotFound naming a missing file (config.json, a shard listed in the index), kDataLoss for a
// corrupt shard or index, kInvalidArgument listing every missing or mismatched tensor,
// kUnsupported for an unknown architecture or a weight type duet cannot compute with yet
// (FP8, AWQ/GPTQ int4), naming the tensors.
GgufFile open_hf_folder(const std::string& dir, GgufMetadata tokenizer_metadata = {},
                        ConvertedCopies copies = ConvertedCopies::kKeep, bool with_mtp = false);

}  // namespace duet
