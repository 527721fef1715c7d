// A build without the CUDA backend: there are no CUDA devices.
#include "duet/backend/cuda_device.h"
#include "duet/core/error.h"

namespace duet {

bool cuda_backend_built() { return false; }

CudaDeviceCount probe_cuda_devices() { return {0, "this build has no CUDA backend"}; }

DeviceInfo describe_cuda_device(int index) {
  fail(ErrorCode::kUnsupported, "cuda:{}: this build has no CUDA backend", index);
}

std::shared_ptr<Device> make_cuda_device(int index, MatmulMode) {
  fail(ErrorCode::kUnsupported, "cuda:{}: this build has no CUDA backend", index);
}

}  // namespace duet
