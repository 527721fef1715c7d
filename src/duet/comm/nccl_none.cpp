// The NCCL entry points of a build without CUDA and NCCL.
#include "duet/comm/nccl.h"
#include "duet/core/error.h"

namespace duet {

bool nccl_built() { return false; }
int cuda_device_count() { return 0; }
std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, int) {
  fail(ErrorCode::kUnsupported, "this duet was built without NCCL (it needs the CUDA toolkit and NCCL)");
}

}  // namespace duet
