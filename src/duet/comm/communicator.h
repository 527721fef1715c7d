// The communicator seam: how ranks (processes, on one machine or several) exchange data. Tensor
// parallelism calls allreduce/allgather inside a model's parts, pipeline parallelism sends the
// carried buffers between stages, and rank 0 sends each step's metadata to the others. Every
// operation has a deadline (timeout()): a peer that died or hangs turns into an Error with code
// kUnavailable naming the operation, the peer and the time waited, never into a wait forever;
// after one such failure the communicator is broken and every later operation fails at once.
//
// Implementations: MPI (any transport OpenMPI has: shared memory, TCP), a shared-memory path for
// the collectives of ranks on one machine (over an MPI communicator for the rest), and NCCL for
// GPU buffers (built when CUDA and NCCL are found). A single process has a trivial one.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace duet {

// Collective operations, for metrics and messages.
enum class CollectiveOp { kAllreduce, kAllgather, kAllToAll, kBroadcast, kBarrier, kSend, kRecv };
inline constexpr int kNumCollectiveOps = 7;
// "allreduce", "allgather", "all_to_all", "broadcast", "barrier", "send", "recv".
const char* collective_op_name(CollectiveOp op);

// Latency of each operation since the process started, as a histogram (for
// duet:collective_latency_seconds{op}); every communicator of the process records into it.
struct CollectiveStats {
  static constexpr int kNumBuckets = 14;
  static const double kBounds[kNumBuckets];  // seconds: 10us .. 10s
  struct Histogram {
    uint64_t buckets[kNumBuckets + 1] = {};  // last: above every bound
    uint64_t count = 0;
    double sum = 0.0;
  };
  Histogram ops[kNumCollectiveOps];
};
CollectiveStats collective_stats();
void record_collective(CollectiveOp op, double seconds);

class Communicator {
 public:
  using Duration = std::chrono::steady_clock::duration;
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "single", "mpi", "shm+mpi", "nccl".
  virtual std::string name() const = 0;
  // Whether every rank of this communicator runs on this machine.
  virtual bool same_host() const = 0;

  // Every rank gets the element-wise sum of every rank's `data`, added in rank order
  // (rank 0's + rank 1's + ...), so every rank has the same bits, the same in every run.
  virtual void allreduce_sum(float* data, int64_t count) = 0;
  // recv[r * bytes .. (r + 1) * bytes) = rank r's send, on every rank.
  virtual void allgather(const void* send, void* recv, size_t bytes) = 0;
  // Rank r's send[d * bytes ..] goes to rank d's recv[r * bytes ..].
  virtual void all_to_all(const void* send, void* recv, size_t bytes_per_rank) = 0;
  // `root`'s data to every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Point to point, matched by (source, tag) in order; tag in [0, 1 << 20).
  virtual void send(const void* data, size_t bytes, int dst, int tag) = 0;
  virtual void recv(void* data, size_t bytes, int src, int tag) = 0;
  // A message of any size from `src` with `tag`, waiting at most `timeout` (not timeout()):
  // false when none came in that time (the communicator stays usable).
  virtual bool recv_message(std::vector<uint8_t>& out, int src, int tag, Duration timeout) = 0;
  // The ranks with the same color, ordered by key (then by rank), as a communicator of their own.
  // Collective over every rank of this one.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // How long an operation may wait for the other ranks.
  Duration timeout() const { return timeout_; }
  void set_timeout(Duration t) { timeout_ = t; }
  bool broken() const { return broken_; }

 protected:
  // Throws kUnavailable when broken.
  void check_usable(const char* what) const;
  // Marks the communicator broken and throws kUnavailable: `what` waited `waited` for `peer`.
  [[noreturn]] void timed_out(const char* what, int peer, Duration waited);
  bool broken_ = false;

 private:
  Duration timeout_ = std::chrono::seconds(60);
};

// One process alone: collectives copy, point to point is refused.
std::unique_ptr<Communicator> make_single_communicator();

// Bytes a message of `count` floats takes, for size-based choices.
inline size_t float_bytes(int64_t count) { return static_cast<size_t>(count) * sizeof(float); }

}  // namespace duet
