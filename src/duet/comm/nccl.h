// NCCL as a Communicator, for ranks whose buffers are on NVIDIA GPUs: every pointer given to its
// collectives and point-to-point operations is device memory of the rank's GPU. Built when CMake
// finds CUDA and NCCL (DUET_HAVE_NCCL). Each operation runs on the communicator's own stream and
// is waited for with the deadline; a timeout aborts the NCCL communicator. allreduce_sum is
// NCCL's (ring or tree): one order of additions for every rank, the same every run for the same
// ranks and sizes, but not rank order. recv_message goes through the bootstrap communicator
// (host memory).
#pragma once

#include <memory>

#include "duet/comm/communicator.h"

namespace duet {

// Whether this build has NCCL.
bool nccl_built();
// GPUs this process can use (0 without a driver or a GPU, or without CUDA in the build).
int cuda_device_count();
// A communicator over the same ranks as `bootstrap`, each on GPU `cuda_device`; `bootstrap`
// carries NCCL's id and must outlive it. Throws kUnsupported without NCCL or without a GPU.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int cuda_device);

}  // namespace duet
