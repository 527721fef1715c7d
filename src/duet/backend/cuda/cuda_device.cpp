// `cuda:N`: a GPU as a device. Its memory comes from cudaMalloc, each allocation counted by kind
// (DeviceBuffer); its ops run on one stream; copies with the host go through two pinned staging
// halves, so the host fills (or drains) one while the GPU copies the other, each half's reuse
// waiting on an event. Decode steps run as CUDA graphs (cuda_graphs.cpp) unless DUET_CUDA_GRAPHS=0.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "duet/backend/cuda/context.h"
#include "duet/backend/cuda/cuda_graphs.h"
#include "duet/backend/cuda_device.h"
#include "duet/core/env.h"
#include "duet/core/error.h"
#include <spdlog/spdlog.h>

namespace duet {
namespace {

using cuda::CudaContext;

constexpr size_t kStagingHalf = size_t{8} << 20;
constexpr size_t kMetaBytes = size_t{16} << 20;
constexpr size_t kWeightAlign = 256;
// The metadata of a decode step captured as a graph (block tables padded to a power of two of
// blocks: 128 sequences of up to 8,192 blocks, 128 Ki tokens at 16 a block, take 4 MiB), and
// cuBLAS's workspace (fixed, so its calls can be captured; 32 MiB is what cuBLAS asks for on Hopper).
constexpr size_t kGraphMetaBytes = size_t{16} << 20;
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// DUET_CUDA_GRAPHS=0 runs decode steps as plain launches; 1 (the default) as graphs.
bool graphs_enabled() { return env_choice("DUET_CUDA_GRAPHS", {"1", "0"}) == 0; }

// DUET_CUDA_SCRATCH_MB (default 256): the scratch arena of each CUDA device.
size_t scratch_bytes() {
  const char* v = std::getenv("DUET_CUDA_SCRATCH_MB");
  if (v == nullptr || *v == '\0') return size_t{256} << 20;
  char* end = nullptr;
  const long mb = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || mb < 16 || mb > (1 << 20)) {
    fail(ErrorCode::kInvalidArgument, "DUET_CUDA_SCRATCH_MB is '{}', expected a number of MiB from 16", v);
  }
  return static_cast<size_t>(mb) << 20;
}

class CudaDevice;

class CudaMemory final : public DeviceBuffer::Owner {
 public:
  CudaMemory(int index, void* p) : index_(index), p_(p) {}
  ~CudaMemory() override {
    // cudaFree waits for work using the memory; an error here has nowhere to go.
    if (cudaSetDevice(index_) == cudaSuccess) (void)cudaFree(p_);
  }

 private:
  int index_;
  void* p_;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int index, MatmulMode mode) : Device("cuda:" + std::to_string(index)) {
    c_.index = index;
    c_.name = name();
    c_.rows_alone = mode == MatmulMode::kExact;
    const bool graphs = graphs_enabled();
    try {
      c_.activate();
      DUET_CUDA_CHECK(cudaStreamCreateWithFlags(&c_.stream, cudaStreamNonBlocking));
      for (int h = 0; h < 2; ++h) {
        DUET_CUDA_CHECK(cudaEventCreateWithFlags(&staged_[h], cudaEventDisableTiming));
        DUET_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&staging_[h]), kStagingHalf, cudaHostAllocDefault));
      }
      DUET_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&c_.meta_host), kMetaBytes, cudaHostAllocDefault));
      meta_ = allocate(kMetaBytes, MemoryKind::kScratch);
      c_.meta_device = meta_.as<unsigned char>();
      c_.meta_ring = std::make_unique<cuda::StagingRing>(kMetaBytes);
      c_.scratch = cuda::scratch_layout(scratch_bytes());
      scratch_ = allocate(c_.scratch.total, MemoryKind::kScratch);
      c_.scratch_base = scratch_.as<unsigned char>();
      c_.blas = &cuda::CublasApi::get();
      DUET_CUBLAS_CHECK(*c_.blas, c_.blas->create(&c_.cublas));
      DUET_CUBLAS_CHECK(*c_.blas, c_.blas->set_stream(c_.cublas, c_.stream));
      cublas_workspace_ = allocate(kCublasWorkspaceBytes, MemoryKind::kScratch);
      DUET_CUBLAS_CHECK(*c_.blas, c_.blas->set_workspace(c_.cublas, cublas_workspace_.data(), kCublasWorkspaceBytes));
      if (graphs) {
        DUET_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&graph_meta_host_), kGraphMetaBytes, cudaHostAllocDefault));
        graph_meta_ = allocate(kGraphMetaBytes, MemoryKind::kScratch);
        graphs_ = cuda::make_step_graphs(c_, copy_mutex_, graph_meta_host_, graph_meta_.as<unsigned char>(),
                                         kGraphMetaBytes);
      }
    } catch (...) {
      release();
      throw;
    }
    backend_ = cuda::make_cuda_backend(c_);
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, index) == cudaSuccess) gpu_name_ = prop.name;
    spdlog::info("{}: {} ({} MiB scratch, cuBLAS from {}, decode graphs {}{})", name(), gpu_name_,
                 c_.scratch.total >> 20, c_.blas->library, graphs ? "on" : "off (DUET_CUDA_GRAPHS=0)",
                 c_.rows_alone ? ", matmuls row by row (DUET_MATMUL=exact)" : "");
  }
  ~CudaDevice() override { release(); }

  DeviceInfo info() const override { return describe_cuda_device(c_.index); }
  Backend& backend() override { return *backend_; }
  bool host_accessible() const override { return false; }
  StepGraphs* step_graphs() override { return graphs_.get(); }

  DeviceBuffer allocate(size_t bytes, MemoryKind kind) override {
    c_.activate();
    void* p = nullptr;
    const cudaError_t rc = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      size_t free = 0, total = 0;
      (void)cudaMemGetInfo(&free, &total);
      fail(ErrorCode::kResourceExhausted, "{}: cannot allocate {} bytes of {} memory ({}; {} of {} bytes free)", name(),
           bytes, memory_kind_name(kind), cudaGetErrorString(rc), free, total);
    }
    return DeviceBuffer(this, p, bytes, kind, std::make_unique<CudaMemory>(c_.index, p));
  }

  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    const std::lock_guard<std::mutex> lock(copy_mutex_);
    c_.activate();
    int last = -1;
    for (size_t off = 0, chunk = 0; off < bytes; ++chunk) {
      const int h = static_cast<int>(chunk % 2);
      const size_t n = std::min(kStagingHalf, bytes - off);
      DUET_CUDA_CHECK(cudaEventSynchronize(staged_[h]));  // this half's previous copy is done
      std::memcpy(staging_[h], static_cast<const unsigned char*>(src) + off, n);
      DUET_CUDA_CHECK(cudaMemcpyAsync(static_cast<unsigned char*>(dst) + off, staging_[h], n, cudaMemcpyHostToDevice,
                                      c_.stream));
      DUET_CUDA_CHECK(cudaEventRecord(staged_[h], c_.stream));
      last = h;
      off += n;
    }
    if (last >= 0) DUET_CUDA_CHECK(cudaEventSynchronize(staged_[last]));
  }

  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    const std::lock_guard<std::mutex> lock(copy_mutex_);
    c_.activate();
    // Chunk i is copied into half i % 2 while the host drains chunk i - 1 from the other half.
    size_t prev_off = 0, prev_n = 0;
    int prev = -1;
    for (size_t off = 0, chunk = 0; off < bytes; ++chunk) {
      const int h = static_cast<int>(chunk % 2);
      const size_t n = std::min(kStagingHalf, bytes - off);
      DUET_CUDA_CHECK(cudaMemcpyAsync(staging_[h], static_cast<const unsigned char*>(src) + off, n,
                                      cudaMemcpyDeviceToHost, c_.stream));
      DUET_CUDA_CHECK(cudaEventRecord(staged_[h], c_.stream));
      if (prev >= 0) drain(prev, static_cast<unsigned char*>(dst) + prev_off, prev_n);
      prev = h;
      prev_off = off;
      prev_n = n;
      off += n;
    }
    if (prev >= 0) drain(prev, static_cast<unsigned char*>(dst) + prev_off, prev_n);
  }

  void copy_from_device(Device& from, void* dst, const void* src, size_t bytes) override {
    if (from.host_accessible()) return copy_from_host(dst, src, bytes);
    if (&from == this) {
      c_.activate();
      DUET_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c_.stream));
      DUET_CUDA_CHECK(cudaStreamSynchronize(c_.stream));
      return;
    }
    Device::copy_from_device(from, dst, src, bytes);  // another GPU or device: through the host
  }

  // Every tensor copied into one weights allocation (the views repointed); the GPU's matmuls read
  // the blocks in place, so nothing is repacked or converted: FP8 weights (a Hugging Face folder's
  // block FP8) stay one byte per weight, e4m3 decoded exactly in the kernels (dequant.cuh), which
  // read rows in chunks of 32.
  std::unique_ptr<LoadedWeights> load_weights(std::span<const WeightRef> tensors) override {
    auto loaded = std::make_unique<Loaded>();
    for (const WeightRef& r : tensors) {
      if (r.view->data != nullptr && r.view->type == DType::kFP8_E4M3_B128 && r.view->cols % 32 != 0) {
        fail(ErrorCode::kUnsupported, "{}: FP8 tensor '{}' has rows of {}, which the GPU's kernels do not read (a "
             "multiple of 32)", name(), r.view->name, r.view->cols);
      }
    }
    loaded->copies = copy_weights_in(tensors, kWeightAlign);
    return loaded;
  }

 private:
  struct Loaded final : LoadedWeights {
    DeviceBuffer copies;
  };

  void drain(int h, unsigned char* dst, size_t n) {
    DUET_CUDA_CHECK(cudaEventSynchronize(staged_[h]));
    std::memcpy(dst, staging_[h], n);
  }

  void release() {
    (void)cudaSetDevice(c_.index);
    if (c_.stream != nullptr) (void)cudaStreamSynchronize(c_.stream);
    backend_.reset();
    graphs_.reset();
    graph_meta_ = DeviceBuffer();
    if (graph_meta_host_ != nullptr) (void)cudaFreeHost(graph_meta_host_);
    graph_meta_host_ = nullptr;
    if (c_.cublas != nullptr) (void)c_.blas->destroy(c_.cublas);
    c_.cublas = nullptr;
    cublas_workspace_ = DeviceBuffer();
    scratch_ = DeviceBuffer();
    meta_ = DeviceBuffer();
    if (c_.meta_host != nullptr) (void)cudaFreeHost(c_.meta_host);
    c_.meta_host = nullptr;
    for (int h = 0; h < 2; ++h) {
      if (staging_[h] != nullptr) (void)cudaFreeHost(staging_[h]);
      if (staged_[h] != nullptr) (void)cudaEventDestroy(staged_[h]);
      staging_[h] = nullptr;
      staged_[h] = nullptr;
    }
    if (c_.stream != nullptr) (void)cudaStreamDestroy(c_.stream);
    c_.stream = nullptr;
  }

  CudaContext c_;
  std::string gpu_name_;
  std::unique_ptr<Backend> backend_;
  DeviceBuffer meta_, scratch_, cublas_workspace_, graph_meta_;
  unsigned char* graph_meta_host_ = nullptr;
  std::unique_ptr<StepGraphs> graphs_;
  // Held by the host copies, and by a graph's capture (so no copy joins it).
  std::mutex copy_mutex_;
  unsigned char* staging_[2] = {nullptr, nullptr};
  cudaEvent_t staged_[2] = {nullptr, nullptr};
};

}  // namespace

bool cuda_backend_built() { return true; }

CudaDeviceCount probe_cuda_devices() {
  CudaDeviceCount r;
  const cudaError_t rc = cudaGetDeviceCount(&r.count);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    r.count = 0;
    r.error = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(rc);
  } else if (r.count == 0) {
    r.error = "cudaGetDeviceCount: no CUDA-capable device";
  }
  return r;
}

DeviceInfo describe_cuda_device(int index) {
  DeviceInfo info;
  info.name = "cuda:" + std::to_string(index);
  info.kind = "cuda";
  DUET_CUDA_CHECK(cudaSetDevice(index));
  size_t free = 0, total = 0;
  DUET_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  info.memory_bytes = static_cast<int64_t>(total);
  info.free_bytes = static_cast<int64_t>(free);
  return info;
}

std::shared_ptr<Device> make_cuda_device(int index, MatmulMode mode) {
  const CudaDeviceCount gpus = probe_cuda_devices();
  if (index < 0 || index >= gpus.count) {
    fail(ErrorCode::kUnavailable, "cuda:{}: {}", index,
         gpus.count == 0 ? gpus.error : fmt::format("this machine has {} GPUs", gpus.count));
  }
  return std::make_shared<CudaDevice>(index, mode);
}

}  // namespace duet
