// The CUDA devices (`cuda:N`), as every build sees them: a build without the CUDA backend
// (no nvcc, or -DDUET_CUDA=OFF) answers that it has none. See docs/ARCHITECTURE.md, "CUDA backend".
#pragma once

#include <memory>
#include <string>

#include "duet/backend/device.h"

namespace duet {

// Whether this build has the CUDA backend.
bool cuda_backend_built();

// The GPUs the CUDA runtime sees. When it sees none, `error` says why in the runtime's words
// (cudaGetDeviceCount's error string: no driver, no device, ...); empty when count > 0.
struct CudaDeviceCount {
  int count = 0;
  std::string error;
};
CudaDeviceCount probe_cuda_devices();

// What `duet devices` lists of GPU `index` (name, memory); index < probe_cuda_devices().count.
DeviceInfo describe_cuda_device(int index);

// GPU `index` as a device: its memory (counted by kind), a stream, pinned staging buffers for
// copies with the host, and the CUDA backend's ops; decode steps as graphs unless
// DUET_CUDA_GRAPHS=0. MatmulMode::kExact: every matmul one activation row at a time (batch
// invariant, slower prefill). Throws kUnavailable naming the GPU and the runtime's error when it
// cannot be used, kUnsupported in a build without CUDA.
std::shared_ptr<Device> make_cuda_device(int index, MatmulMode mode = MatmulMode::kFast);

}  // namespace duet
