// Decode steps as CUDA graphs on one device (StepGraphs, backend/device.h): captured per key and
// replayed while the step's ops trace the same (graph_plan.h). Internal to backend/cuda.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>

#include "duet/backend/cuda/context.h"
#include "duet/backend/device.h"

namespace duet::cuda {

// `stream_mutex` is held while a step is captured, so nothing else queues work on the stream then;
// `staging_host` (pinned) and `staging_device` are `bytes` each and outlive the result: the
// metadata of a graph's step, copied host to device before each launch.
std::unique_ptr<StepGraphs> make_step_graphs(CudaContext& context, std::mutex& stream_mutex,
                                             unsigned char* staging_host, unsigned char* staging_device, size_t bytes);

}  // namespace duet::cuda
