// Decode steps as CUDA graphs, the host side (plain C++, built and tested on every machine; the
// capture and replay themselves are in cuda_graphs.cpp). A step's ops are captured once per key
// (the executor's batch-size bucket and context class) and replayed as one launch. What makes a
// replay safe is checked on every step rather than assumed: the ops run on the host without
// launching anything (a dry run), recording a trace of every argument they would launch with (device
// pointers, sizes, plan results) and staging the host metadata they would upload (token ids,
// positions, slots, block tables) at the offsets the capture used. The graph replays only when the
// trace equals the captured one; otherwise the step runs as plain launches and the graph is dropped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace duet::cuda {

// Block-table stride of an attention plan whose tables are padded for a graph: the next power of
// two of the blocks a sequence needs, at least 16, so a captured plan's layout changes only when a
// sequence's context crosses a power of two.
int64_t graph_table_stride(int64_t max_blocks);

// What a dry run (or the capture) records: every op's arguments, and where its uploads landed.
// The host metadata itself goes into a staging area (pinned host memory, copied to the device in
// one piece before the graph is launched); an upload of the same kind and bytes as an earlier one
// of the step (every layer's block tables, positions) shares its copy.
class StepRecorder {
 public:
  enum class Mode { kCapture, kDry };
  // Kinds of uploads: only uploads of one kind share a copy.
  enum class Upload : int { kIds = 1, kPositions, kFreq, kSlots, kAttention };

  // `staging`: host memory of `capacity` bytes that stays valid (not owned).
  StepRecorder(unsigned char* staging, size_t capacity) : staging_(staging), capacity_(capacity) {}

  void begin(Mode mode);
  Mode mode() const { return mode_; }
  // Whether the ops launch (capture) or only record (dry run).
  bool launching() const { return mode_ == Mode::kCapture; }

  // Stages `bytes` of host data; returns its offset in the staging area (256-byte aligned). Throws
  // kResourceExhausted when the step's metadata outgrows the area.
  size_t stage(Upload kind, const void* data, size_t bytes);

  // Appends an op's arguments to the trace (integers, enums, pointers, floating point by bits).
  template <typename... Args>
  void trace(int op, const Args&... args) {
    trace_.push_back(static_cast<int64_t>(op) << 32 | static_cast<int64_t>(sizeof...(Args)));
    (push(args), ...);
  }

  const std::vector<int64_t>& recorded() const { return trace_; }
  // Bytes staged so far (the extent to copy to the device).
  size_t staged_bytes() const { return head_; }
  size_t capacity() const { return capacity_; }

 private:
  template <typename T>
  void push(const T& v) {
    if constexpr (std::is_pointer_v<T>) {
      trace_.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(v)));
    } else if constexpr (std::is_floating_point_v<T>) {
      const double d = static_cast<double>(v);
      int64_t bits = 0;
      static_assert(sizeof(bits) == sizeof(d));
      __builtin_memcpy(&bits, &d, sizeof(d));
      trace_.push_back(bits);
    } else {
      trace_.push_back(static_cast<int64_t>(v));
    }
  }

  unsigned char* staging_;
  size_t capacity_;
  size_t head_ = 0;
  Mode mode_ = Mode::kDry;
  std::vector<int64_t> trace_;
  struct Staged {
    Upload kind;
    size_t bytes, offset;
  };
  std::vector<Staged> staged_;  // this step's distinct uploads, in order
};

// When each key is captured, replayed or run plain. A key seen for the first time runs plain once
// (a warm-up: workspaces reach their size and kernels load outside the capture), then is captured;
// later steps replay it while their trace matches. A mismatch drops the graph (the next step of the
// key captures again); a graph that replayed before its trace changed (a buffer it used grew and
// moved, say) is not held against the key, but one whose very next step differs is: after
// kMaxMismatches such captures in a row, or kMaxCaptureFailures failed captures, the key is refused
// and its steps run plain from then on. At most kMaxGraphs graphs are kept; the least recently used
// goes first.
struct GraphKey {
  int64_t num_seqs = 0;
  int64_t context = 0;
  auto operator<=>(const GraphKey&) const = default;
};

class GraphPolicy {
 public:
  static constexpr int kMaxMismatches = 3;
  static constexpr int kMaxCaptureFailures = 2;
  static constexpr size_t kMaxGraphs = 48;

  enum class Action { kPlain, kCapture, kReplay };
  struct Stats {
    int64_t plain = 0, captures = 0, replays = 0, mismatches = 0, capture_failures = 0, evictions = 0;
  };

  // What to do with a step of `key` now.
  Action next(const GraphKey& key);
  // The capture of `key` gave `graph` (opaque: whatever frees it when dropped) for `trace`.
  void captured(const GraphKey& key, std::shared_ptr<void> graph, std::vector<int64_t> trace);
  // The capture failed (`why` is kept for refused()).
  void capture_failed(const GraphKey& key, const std::string& why);
  // A dry run's trace differed from the captured one: the graph is dropped.
  void mismatched(const GraphKey& key);
  // A replay happened (counted).
  void replayed(const GraphKey& key);
  // The captured graph and trace of `key` (null when none).
  const std::vector<int64_t>* trace(const GraphKey& key) const;
  void* graph(const GraphKey& key) const;
  // Why `key` runs plain for good ("" when it does not).
  std::string refused(const GraphKey& key) const;
  // Drops every graph and forgets every key (what they captured changed).
  void clear();
  size_t num_graphs() const;
  const Stats& stats() const { return stats_; }

 private:
  struct Entry {
    int64_t seen = 0;
    int mismatches = 0, failures = 0;
    int64_t replays = 0;  // of the current graph
    std::string refused;
    std::shared_ptr<void> graph;
    std::vector<int64_t> trace;
    uint64_t last_used = 0;
  };
  void evict();

  std::map<GraphKey, Entry> entries_;
  uint64_t clock_ = 0;
  Stats stats_;
};

}  // namespace duet::cuda
