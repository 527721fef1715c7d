// What a CUDA device's backend works with: the GPU's number, its stream and cuBLAS handle, the
// scratch arena (allocated when the device is made) and the ring that stages each op's host
// metadata (token ids, positions, slots, block tables) into device memory; while a decode step is
// captured or dry-run for a graph (cuda_graphs.cpp), the recorder instead. Internal to backend/cuda.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <string>

#include "duet/backend/backend.h"
#include "duet/backend/cuda/check.h"
#include "duet/backend/cuda/cublas_api.h"
#include "duet/backend/cuda/graph_plan.h"
#include "duet/backend/cuda/plan.h"

namespace duet::cuda {

struct CudaContext {
  int index = 0;
  std::string name;  // cuda:N
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  const CublasApi* blas = nullptr;
  // Scratch arena on the device, laid out by `scratch`.
  unsigned char* scratch_base = nullptr;
  ScratchLayout scratch;
  // Metadata: pinned host ring mirrored by a device region of the same size.
  unsigned char* meta_host = nullptr;
  unsigned char* meta_device = nullptr;
  std::unique_ptr<StagingRing> meta_ring;
  // Set while a step is captured or dry-run for a graph: uploads are staged by the recorder (its
  // staging area is copied to graph_meta_device before each launch of the graph) and every op
  // records its arguments; in a dry run nothing is launched.
  StepRecorder* recorder = nullptr;
  unsigned char* graph_meta_device = nullptr;
  // Matmuls one activation row at a time (MatmulMode::kExact): a row's result does not depend on
  // the rows beside it (batch invariance), at the cost of prefill speed.
  bool rows_alone = false;

  // Whether ops launch their kernels (not in a dry run).
  bool launching() const { return recorder == nullptr || recorder->launching(); }
  // An op's arguments, for the recorder's trace.
  template <typename... Args>
  void trace(int op, const Args&... args) {
    if (recorder != nullptr) recorder->trace(op, args...);
  }

  // Makes this GPU current on the calling thread (each op may come from another thread).
  void activate() const { DUET_CUDA_CHECK(cudaSetDevice(index)); }

  // Copies `count` values from host memory into the metadata ring; the device copy is valid for
  // the work queued after it on the stream.
  template <typename T>
  const T* upload(StepRecorder::Upload kind, const T* host, size_t count) {
    const size_t bytes = count * sizeof(T);
    if (recorder != nullptr) return reinterpret_cast<const T*>(graph_meta_device + recorder->stage(kind, host, bytes));
    const StagingRing::Range r = meta_ring->reserve(bytes);
    // Everything staged in the previous lap has been copied and read once the stream is idle.
    if (r.wrapped) DUET_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (bytes > 0) {
      std::memcpy(meta_host + r.offset, host, bytes);
      DUET_CUDA_CHECK(cudaMemcpyAsync(meta_device + r.offset, meta_host + r.offset, bytes, cudaMemcpyHostToDevice, stream));
    }
    return reinterpret_cast<const T*>(meta_device + r.offset);
  }
};

// The backend's ops on a context that outlives it.
std::unique_ptr<Backend> make_cuda_backend(CudaContext& context);

}  // namespace duet::cuda
