// Decode steps as graphs, the executor's side (the device's is StepGraphs, backend/device.h): which
// steps qualify, the bucket of batch sizes a step is padded to, and the padded batch. A step
// qualifies when it is pure decode (one new token per sequence, in order, every row's logits
// wanted, no hidden states wanted) of at most the largest bucket; the executor also needs the model wholly on one device
// of this process that has graphs.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "duet/model/model.h"

namespace duet {

// Batch sizes captured as graphs (a step of 5 sequences runs as the graph of 8, three rows padded).
inline constexpr std::array<int64_t, 11> kDecodeGraphBuckets = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128};

// The bucket `batch` is padded to, or 0 when it does not qualify (then `why`, when given, says why).
int64_t decode_graph_bucket(const BatchInput& batch, std::string* why = nullptr);

// The context class of a step (part of the graph's key): the next power of two of its longest
// context, at least 256, so that a captured layout is reused while the sequences grow inside it.
int64_t decode_graph_context(const BatchInput& batch);

// `batch` padded to `bucket` sequences into `out`: the real rows first, unchanged; each padding row
// reads token 0 at position 0, stores its K/V nowhere (slot -1), attends to nothing (a sequence of
// context 0, which the CUDA attention writes as 0) and has its logits computed after the real
// rows' (the executor returns only the real rows'). Only a device with graphs runs such a batch.
void pad_decode_batch(const BatchInput& batch, int64_t bucket, BatchInput& out);

}  // namespace duet
