#include "duet/backend/cuda/graph_plan.h"

#include <algorithm>
#include <cstring>

#include "duet/core/error.h"

namespace duet::cuda {
namespace {

constexpr size_t kAlign = 256;

}  // namespace

int64_t graph_table_stride(int64_t max_blocks) {
  int64_t s = 16;
  while (s < max_blocks) s *= 2;
  return s;
}

void StepRecorder::begin(Mode mode) {
  mode_ = mode;
  head_ = 0;
  trace_.clear();
  staged_.clear();
}

size_t StepRecorder::stage(Upload kind, const void* data, size_t bytes) {
  // A step has few distinct uploads of a kind (the tables of full and windowed attention, say),
  // each repeated by every layer: compared byte for byte, the most recent first.
  for (auto it = staged_.rbegin(); it != staged_.rend(); ++it) {
    if (it->kind == kind && it->bytes == bytes && (bytes == 0 || std::memcmp(staging_ + it->offset, data, bytes) == 0)) {
      trace(0, static_cast<int>(kind), bytes, it->offset);
      return it->offset;
    }
  }
  const size_t size = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  if (head_ + size > capacity_) {
    fail(ErrorCode::kResourceExhausted, "{} bytes of a step's metadata do not fit the {} byte CUDA graph staging area "
         "({} used)", bytes, capacity_, head_);
  }
  const size_t offset = head_;
  if (bytes > 0) std::memcpy(staging_ + offset, data, bytes);
  head_ += size;
  staged_.push_back(Staged{kind, bytes, offset});
  trace(0, static_cast<int>(kind), bytes, offset);
  return offset;
}

GraphPolicy::Action GraphPolicy::next(const GraphKey& key) {
  Entry& e = entries_[key];
  e.last_used = ++clock_;
  if (!e.refused.empty()) {
    ++stats_.plain;
    return Action::kPlain;
  }
  if (e.graph != nullptr) return Action::kReplay;
  if (e.seen++ == 0) {
    ++stats_.plain;
    return Action::kPlain;  // the warm-up
  }
  return Action::kCapture;
}

void GraphPolicy::captured(const GraphKey& key, std::shared_ptr<void> graph, std::vector<int64_t> trace) {
  Entry& e = entries_[key];
  e.graph = std::move(graph);
  e.trace = std::move(trace);
  e.failures = 0;
  e.replays = 0;
  e.last_used = ++clock_;
  ++stats_.captures;
  evict();
}

void GraphPolicy::capture_failed(const GraphKey& key, const std::string& why) {
  Entry& e = entries_[key];
  e.graph.reset();
  e.trace.clear();
  ++stats_.capture_failures;
  ++stats_.plain;
  if (++e.failures >= kMaxCaptureFailures) e.refused = "its capture failed: " + why;
}

void GraphPolicy::mismatched(const GraphKey& key) {
  Entry& e = entries_[key];
  e.graph.reset();
  e.trace.clear();
  ++stats_.mismatches;
  ++stats_.plain;
  if (e.replays > 0) {
    e.mismatches = 0;
  } else if (++e.mismatches >= kMaxMismatches) {
    e.refused = "its launches changed right after each of " + std::to_string(kMaxMismatches) + " captures";
  }
  e.replays = 0;
}

void GraphPolicy::replayed(const GraphKey& key) {
  Entry& e = entries_[key];
  ++e.replays;
  ++stats_.replays;
}

const std::vector<int64_t>* GraphPolicy::trace(const GraphKey& key) const {
  const auto it = entries_.find(key);
  return it == entries_.end() || it->second.graph == nullptr ? nullptr : &it->second.trace;
}

void* GraphPolicy::graph(const GraphKey& key) const {
  const auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : it->second.graph.get();
}

std::string GraphPolicy::refused(const GraphKey& key) const {
  const auto it = entries_.find(key);
  return it == entries_.end() ? std::string() : it->second.refused;
}

void GraphPolicy::clear() { entries_.clear(); }

size_t GraphPolicy::num_graphs() const {
  size_t n = 0;
  for (const auto& [key, e] : entries_) n += e.graph != nullptr ? 1 : 0;
  return n;
}

void GraphPolicy::evict() {
  while (num_graphs() > kMaxGraphs) {
    Entry* oldest = nullptr;
    for (auto& [key, e] : entries_) {
      if (e.graph != nullptr && (oldest == nullptr || e.last_used < oldest->last_used)) oldest = &e;
    }
    oldest->graph.reset();
    oldest->trace.clear();
    ++stats_.evictions;
  }
}

}  // namespace duet::cuda
