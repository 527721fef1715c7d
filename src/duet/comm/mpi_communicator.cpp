#include <mpi.h>
#include <sched.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "duet/comm/mpi.h"
#include "duet/core/error.h"

namespace duet {
namespace {

using Clock = std::chrono::steady_clock;

int checked_count(size_t bytes, const char* what) {
  if (bytes > static_cast<size_t>(INT_MAX)) {
    fail(ErrorCode::kInvalidArgument, "{} of {} bytes: MPI counts stop at {}", what, bytes, INT_MAX);
  }
  return static_cast<int>(bytes);
}

std::string mpi_error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm node;
    MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int node_size = 0;
    MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);
    same_host_ = node_size == size_;
  }
  ~MpiCommunicator() override {
    if (owned_ && !broken_) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  bool same_host() const override { return same_host_; }

  void allreduce_sum(float* data, int64_t count) override {
    const auto start = Clock::now();
    const size_t bytes = float_bytes(count);
    gathered_.resize(static_cast<size_t>(count) * static_cast<size_t>(size_));
    start_collective("allreduce");
    MPI_Request req;
    check(MPI_Iallgather(data, checked_count(bytes, "allreduce"), MPI_BYTE, gathered_.data(),
                         checked_count(bytes, "allreduce"), MPI_BYTE, comm_, &req),
          "allreduce");
    wait(req, "allreduce", -1);
    // In rank order, the same additions on every rank.
    const float* g = gathered_.data();
    std::memcpy(data, g, bytes);
    for (int r = 1; r < size_; ++r) {
      const float* part = g + static_cast<size_t>(r) * static_cast<size_t>(count);
      for (int64_t i = 0; i < count; ++i) data[i] += part[i];
    }
    record_collective(CollectiveOp::kAllreduce, seconds_since(start));
  }

  void allgather(const void* send, void* recv, size_t bytes) override {
    const auto start = Clock::now();
    start_collective("allgather");
    MPI_Request req;
    const int n = checked_count(bytes, "allgather");
    check(MPI_Iallgather(send == recv ? MPI_IN_PLACE : send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, &req),
          "allgather");
    wait(req, "allgather", -1);
    record_collective(CollectiveOp::kAllgather, seconds_since(start));
  }

  void all_to_all(const void* send, void* recv, size_t bytes) override {
    const auto start = Clock::now();
    start_collective("all_to_all");
    MPI_Request req;
    const int n = checked_count(bytes, "all_to_all");
    check(MPI_Ialltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, &req), "all_to_all");
    wait(req, "all_to_all", -1);
    record_collective(CollectiveOp::kAllToAll, seconds_since(start));
  }

  void broadcast(void* data, size_t bytes, int root) override {
    const auto start = Clock::now();
    start_collective("broadcast");
    MPI_Request req;
    check(MPI_Ibcast(data, checked_count(bytes, "broadcast"), MPI_BYTE, root, comm_, &req), "broadcast");
    wait(req, "broadcast", rank_ == root ? -1 : root);
    record_collective(CollectiveOp::kBroadcast, seconds_since(start));
  }

  void barrier() override {
    const auto start = Clock::now();
    start_collective("barrier");
    MPI_Request req;
    check(MPI_Ibarrier(comm_, &req), "barrier");
    wait(req, "barrier", -1);
    record_collective(CollectiveOp::kBarrier, seconds_since(start));
  }

  void send(const void* data, size_t bytes, int dst, int tag) override {
    const auto start = Clock::now();
    check_usable("send");
    MPI_Request req;
    check(MPI_Isend(data, checked_count(bytes, "send"), MPI_BYTE, dst, tag, comm_, &req), "send");
    wait(req, "send", dst);
    record_collective(CollectiveOp::kSend, seconds_since(start));
  }

  void recv(void* data, size_t bytes, int src, int tag) override {
    const auto start = Clock::now();
    check_usable("recv");
    MPI_Request req;
    check(MPI_Irecv(data, checked_count(bytes, "recv"), MPI_BYTE, src, tag, comm_, &req), "recv");
    wait(req, "recv", src);
    record_collective(CollectiveOp::kRecv, seconds_since(start));
  }

  bool recv_message(std::vector<uint8_t>& out, int src, int tag, Duration timeout) override {
    check_usable("recv");
    const auto deadline = Clock::now() + timeout;
    MPI_Message msg;
    MPI_Status status;
    for (int spins = 0;; ++spins) {
      int found = 0;
      check(MPI_Improbe(src, tag, comm_, &found, &msg, &status), "recv");
      if (found) break;
      if (Clock::now() >= deadline) return false;
      pause(spins);
    }
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    out.resize(static_cast<size_t>(count));
    MPI_Request req;
    check(MPI_Imrecv(out.data(), count, MPI_BYTE, &msg, &req), "recv");
    wait(req, "recv", src);
    return true;
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    start_collective("split");
    MPI_Comm sub;
    check(MPI_Comm_split(comm_, color, key, &sub), "split");
    auto c = std::make_unique<MpiCommunicator>(sub, true);
    c->set_timeout(timeout());
    return c;
  }

 private:
  static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

  // Polls without hogging a core: ranks may share cores with each other (--oversubscribe).
  static void pause(int spins) {
    if (spins < 64) return;
    if (spins < 4096) {
      sched_yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

  void start_collective(const char* what) { check_usable(what); }

  void check(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    broken_ = true;
    fail(ErrorCode::kUnavailable, "{} on rank {} of {} (mpi): {}", what, rank_, size_, mpi_error_text(rc));
  }

  void wait(MPI_Request& req, const char* what, int peer) {
    const auto start = Clock::now();
    const auto deadline = start + timeout();
    for (int spins = 0;; ++spins) {
      int done = 0;
      MPI_Status status;
      const int rc = MPI_Test(&req, &done, &status);
      if (rc != MPI_SUCCESS) check(rc, what);
      if (done) return;
      if ((spins & 63) == 0 && Clock::now() >= deadline) {
        // A point-to-point request can be withdrawn; a collective cannot, and the communicator
        // is broken from here on either way.
        if (peer >= 0) {
          MPI_Cancel(&req);
        }
        timed_out(what, peer, Clock::now() - start);
      }
      pause(spins);
    }
  }

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0;
  int size_ = 1;
  bool same_host_ = true;
  std::vector<float> gathered_;
};

std::once_flag init_once;
bool initialized = false;

}  // namespace

bool mpi_built() { return true; }

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

std::unique_ptr<Communicator> init_mpi_world() {
  std::call_once(init_once, [] {
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) fail(ErrorCode::kUnavailable, "MPI_Init_thread failed: {}", mpi_error_text(rc));
    initialized = true;
    if (provided < MPI_THREAD_MULTIPLE) {
      fail(ErrorCode::kUnsupported, "the MPI library gives thread level {}, duet needs MPI_THREAD_MULTIPLE ({})",
           provided, MPI_THREAD_MULTIPLE);
    }
  });
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, false);
}

void mpi_abort(int code) {
  if (initialized) MPI_Abort(MPI_COMM_WORLD, code);
}

void mpi_finalize() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
}

}  // namespace duet
