#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>

#include <cstring>
#include <thread>

#include "duet/comm/nccl.h"
#include "duet/core/error.h"

namespace duet {
namespace {

using Clock = std::chrono::steady_clock;

#define DUET_CUDA_CHECK(call)                                                                              \
  do {                                                                                                     \
    const cudaError_t duet_rc_ = (call);                                                                   \
    if (duet_rc_ != cudaSuccess) {                                                                         \
      fail(ErrorCode::kUnavailable, "{} failed at {}:{}: {}", #call, __FILE__, __LINE__,                   \
           cudaGetErrorString(duet_rc_));                                                                  \
    }                                                                                                      \
  } while (0)

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, int device, ncclComm_t comm) : bootstrap_(bootstrap), device_(device), comm_(comm) {
    set_timeout(bootstrap.timeout());
    DUET_CUDA_CHECK(cudaSetDevice(device_));
    DUET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ncclCommCount(comm_, &size_);
    ncclCommUserRank(comm_, &rank_);
  }
  ~NcclCommunicator() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (broken_) {
      ncclCommAbort(comm_);
    } else {
      ncclCommDestroy(comm_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  bool same_host() const override { return bootstrap_.same_host(); }

  void allreduce_sum(float* data, int64_t count) override {
    run("allreduce", CollectiveOp::kAllreduce, -1, [&] {
      return ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat32, ncclSum, comm_, stream_);
    });
  }
  void allgather(const void* send, void* recv, size_t bytes) override {
    run("allgather", CollectiveOp::kAllgather, -1,
        [&] { return ncclAllGather(send, recv, bytes, ncclUint8, comm_, stream_); });
  }
  void all_to_all(const void* send, void* recv, size_t bytes) override {
    run("all_to_all", CollectiveOp::kAllToAll, -1, [&] {
      ncclGroupStart();
      for (int r = 0; r < size_; ++r) {
        ncclSend(static_cast<const uint8_t*>(send) + static_cast<size_t>(r) * bytes, bytes, ncclUint8, r, comm_, stream_);
        ncclRecv(static_cast<uint8_t*>(recv) + static_cast<size_t>(r) * bytes, bytes, ncclUint8, r, comm_, stream_);
      }
      return ncclGroupEnd();
    });
  }
  void broadcast(void* data, size_t bytes, int root) override {
    run("broadcast", CollectiveOp::kBroadcast, root,
        [&] { return ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_); });
  }
  void barrier() override {
    // A one-element allreduce on the device, as NCCL has no barrier.
    if (barrier_ == nullptr) DUET_CUDA_CHECK(cudaMalloc(&barrier_, sizeof(float)));
    run("barrier", CollectiveOp::kBarrier, -1,
        [&] { return ncclAllReduce(barrier_, barrier_, 1, ncclFloat32, ncclSum, comm_, stream_); });
  }
  // NCCL has no tags: messages between two ranks match in order.
  void send(const void* data, size_t bytes, int dst, int) override {
    run("send", CollectiveOp::kSend, dst, [&] { return ncclSend(data, bytes, ncclUint8, dst, comm_, stream_); });
  }
  void recv(void* data, size_t bytes, int src, int) override {
    run("recv", CollectiveOp::kRecv, src, [&] { return ncclRecv(data, bytes, ncclUint8, src, comm_, stream_); });
  }
  bool recv_message(std::vector<uint8_t>& out, int src, int tag, Duration timeout) override {
    return bootstrap_.recv_message(out, src, tag, timeout);
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    check_usable("split");
    ncclComm_t sub = nullptr;
    const ncclResult_t rc = ncclCommSplit(comm_, color, key, &sub, nullptr);
    if (rc != ncclSuccess) fail(ErrorCode::kUnavailable, "ncclCommSplit: {}", ncclGetErrorString(rc));
    // The bootstrap of a split stays the parent's (recv_message is between world ranks there).
    auto c = std::make_unique<NcclCommunicator>(bootstrap_, device_, sub);
    c->set_timeout(timeout());
    return c;
  }

 private:
  template <typename Fn>
  void run(const char* what, CollectiveOp op, int peer, Fn&& enqueue) {
    check_usable(what);
    DUET_CUDA_CHECK(cudaSetDevice(device_));
    const auto start = Clock::now();
    const ncclResult_t rc = enqueue();
    if (rc != ncclSuccess && rc != ncclInProgress) {
      broken_ = true;
      fail(ErrorCode::kUnavailable, "{} on rank {} of {} (nccl): {}", what, rank_, size_, ncclGetErrorString(rc));
    }
    const auto deadline = start + timeout();
    for (int spins = 0;; ++spins) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) DUET_CUDA_CHECK(q);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        broken_ = true;
        fail(ErrorCode::kUnavailable, "{} on rank {} of {} (nccl): {}", what, rank_, size_, ncclGetErrorString(async));
      }
      if (Clock::now() >= deadline) timed_out(what, peer, Clock::now() - start);
      if (spins > 64) sched_yield();
    }
    record_collective(op, std::chrono::duration<double>(Clock::now() - start).count());
  }

  Communicator& bootstrap_;
  int device_;
  ncclComm_t comm_;
  cudaStream_t stream_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  void* barrier_ = nullptr;
};

}  // namespace

bool nccl_built() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int cuda_device) {
  const int gpus = cuda_device_count();
  if (cuda_device < 0 || cuda_device >= gpus) {
    fail(ErrorCode::kUnsupported, "NCCL on GPU {}: this process sees {} GPUs", cuda_device, gpus);
  }
  DUET_CUDA_CHECK(cudaSetDevice(cuda_device));
  ncclUniqueId id;
  if (bootstrap.rank() == 0) {
    const ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) fail(ErrorCode::kUnavailable, "ncclGetUniqueId: {}", ncclGetErrorString(rc));
  }
  bootstrap.broadcast(&id, sizeof(id), 0);
  // Non-blocking initialisation, so that a rank that never comes meets the deadline.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, bootstrap.size(), id, bootstrap.rank(), &config);
  const auto start = Clock::now();
  while (rc == ncclInProgress || rc == ncclSuccess) {
    ncclResult_t state = ncclInProgress;
    ncclCommGetAsyncError(comm, &state);
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      rc = state;
      break;
    }
    if (Clock::now() - start > bootstrap.timeout()) {
      ncclCommAbort(comm);
      fail(ErrorCode::kUnavailable, "NCCL initialisation on rank {} of {}: the other ranks did not join within {:.1f} s",
           bootstrap.rank(), bootstrap.size(), std::chrono::duration<double>(bootstrap.timeout()).count());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (rc != ncclSuccess && rc != ncclInProgress) {
    fail(ErrorCode::kUnavailable, "ncclCommInitRankConfig on rank {}: {}", bootstrap.rank(), ncclGetErrorString(rc));
  }
  return std::make_unique<NcclCommunicator>(bootstrap, cuda_device, comm);
}

}  // namespace duet
