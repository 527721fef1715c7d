#include "duet/comm/communicator.h"

#include <cstring>
#include <mutex>

#include "duet/core/error.h"

namespace duet {

const char* collective_op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllreduce: return "allreduce";
    case CollectiveOp::kAllgather: return "allgather";
    case CollectiveOp::kAllToAll: return "all_to_all";
    case CollectiveOp::kBroadcast: return "broadcast";
    case CollectiveOp::kBarrier: return "barrier";
    case CollectiveOp::kSend: return "send";
    case CollectiveOp::kRecv: return "recv";
  }
  return "?";
}

const double CollectiveStats::kBounds[CollectiveStats::kNumBuckets] = {
    1e-5, 2.5e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2, 0.1, 1.0, 10.0};

namespace {
std::mutex stats_mutex;
CollectiveStats stats;
}  // namespace

CollectiveStats collective_stats() {
  const std::lock_guard<std::mutex> lock(stats_mutex);
  return stats;
}

void record_collective(CollectiveOp op, double seconds) {
  const std::lock_guard<std::mutex> lock(stats_mutex);
  CollectiveStats::Histogram& h = stats.ops[static_cast<int>(op)];
  int b = 0;
  while (b < CollectiveStats::kNumBuckets && seconds > CollectiveStats::kBounds[b]) ++b;
  ++h.buckets[b];
  ++h.count;
  h.sum += seconds;
}

void Communicator::check_usable(const char* what) const {
  if (broken_) {
    fail(ErrorCode::kUnavailable, "{}: the {} communicator failed earlier (a rank died or hung)", what, name());
  }
}

void Communicator::timed_out(const char* what, int peer, Duration waited) {
  broken_ = true;
  const double s = std::chrono::duration<double>(waited).count();
  if (peer >= 0) {
    fail(ErrorCode::kUnavailable, "{} on rank {} of {} ({}): rank {} did not answer within {:.1f} s", what, rank(),
         size(), name(), peer, s);
  }
  fail(ErrorCode::kUnavailable, "{} on rank {} of {} ({}): the other ranks did not answer within {:.1f} s", what,
       rank(), size(), name(), s);
}

namespace {

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single"; }
  bool same_host() const override { return true; }
  void allreduce_sum(float*, int64_t) override {}
  void allgather(const void* send, void* recv, size_t bytes) override {
    if (send != recv) std::memmove(recv, send, bytes);
  }
  void all_to_all(const void* send, void* recv, size_t bytes) override {
    if (send != recv) std::memmove(recv, send, bytes);
  }
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
  void send(const void*, size_t, int dst, int) override {
    fail(ErrorCode::kInvalidArgument, "send to rank {}: a single process has no other rank", dst);
  }
  void recv(void*, size_t, int src, int) override {
    fail(ErrorCode::kInvalidArgument, "recv from rank {}: a single process has no other rank", src);
  }
  bool recv_message(std::vector<uint8_t>&, int src, int, Duration) override {
    fail(ErrorCode::kInvalidArgument, "recv from rank {}: a single process has no other rank", src);
  }
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<SingleCommunicator>(); }
};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() { return std::make_unique<SingleCommunicator>(); }

}  // namespace duet
