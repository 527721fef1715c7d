// Decode steps as CUDA graphs on one device: the policy and the trace (graph_plan.h) decide, this
// file captures and replays. A capture runs the step's ops under stream capture with the recorder
// on (their uploads staged at fixed offsets of one area, their arguments traced); a replay first
// runs the ops dry (traced and staged again, nothing launched), then, when the trace is the
// captured one, copies the staging area to the device and launches the graph: one copy and one
// launch for the whole step.
#include "duet/backend/cuda/cuda_graphs.h"

#include <chrono>

#include <spdlog/spdlog.h>

#include "duet/core/error.h"

namespace duet::cuda {
namespace {

class CudaStepGraphs final : public StepGraphs {
 public:
  CudaStepGraphs(CudaContext& c, std::mutex& stream_mutex, unsigned char* staging_host, unsigned char* staging_device,
                 size_t bytes)
      : c_(c),
        stream_mutex_(stream_mutex),
        staging_device_(staging_device),
        staging_host_(staging_host),
        recorder_(staging_host, bytes) {
    c_.activate();
    DUET_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
  }
  ~CudaStepGraphs() override {
    policy_.clear();
    if (copied_ != nullptr) (void)cudaEventDestroy(copied_);
  }

  Ran run(const Key& k, const std::function<void()>& ops) override {
    const GraphKey key{k.num_seqs, k.context};
    switch (policy_.next(key)) {
      case GraphPolicy::Action::kPlain: ops(); return Ran::kPlain;
      case GraphPolicy::Action::kReplay: return replay(key, ops);
      case GraphPolicy::Action::kCapture: return capture(key, ops);
    }
    return Ran::kPlain;
  }

  void clear() override { policy_.clear(); }

  Stats stats() const override {
    const GraphPolicy::Stats& s = policy_.stats();
    return Stats{s.plain, s.captures, s.replays, s.mismatches, s.capture_failures};
  }

 private:
  // Runs `ops` with the recorder on in `mode`; the recorder is off again however it ends. The
  // staging area's last copy to the device must be done (the caller waited for copied_).
  void record(StepRecorder::Mode mode, const std::function<void()>& ops) {
    recorder_.begin(mode);
    c_.recorder = &recorder_;
    c_.graph_meta_device = staging_device_;
    try {
      ops();
    } catch (...) {
      c_.recorder = nullptr;
      throw;
    }
    c_.recorder = nullptr;
  }

  // The staged metadata to the device, then the graph, on the stream.
  void launch(cudaGraphExec_t exec) {
    if (recorder_.staged_bytes() > 0) {
      DUET_CUDA_CHECK(cudaMemcpyAsync(staging_device_, staging_host_, recorder_.staged_bytes(),
                                      cudaMemcpyHostToDevice, c_.stream));
    }
    DUET_CUDA_CHECK(cudaEventRecord(copied_, c_.stream));
    DUET_CUDA_CHECK(cudaGraphLaunch(exec, c_.stream));
  }

  Ran replay(const GraphKey& key, const std::function<void()>& ops) {
    try {
      c_.activate();
      DUET_CUDA_CHECK(cudaEventSynchronize(copied_));
      record(StepRecorder::Mode::kDry, ops);
    } catch (const std::exception& e) {
      // The plain run below says what was wrong, if something still is.
      spdlog::debug("{}: the dry run of a decode graph ({} sequences) stopped: {}", c_.name, key.num_seqs, e.what());
      policy_.mismatched(key);
      ops();
      return Ran::kPlain;
    }
    const std::vector<int64_t>* captured = policy_.trace(key);
    if (captured == nullptr || *captured != recorder_.recorded()) {
      policy_.mismatched(key);
      if (!policy_.refused(key).empty()) {
        spdlog::info("{}: decode steps of {} sequences (context class {}) run without a graph: {}", c_.name,
                     key.num_seqs, key.context, policy_.refused(key));
      }
      ops();
      return Ran::kPlain;
    }
    c_.activate();
    launch(static_cast<cudaGraphExec_t>(policy_.graph(key)));
    policy_.replayed(key);
    return Ran::kReplayed;
  }

  Ran capture(const GraphKey& key, const std::function<void()>& ops) {
    const auto start = std::chrono::steady_clock::now();
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    std::string error;
    {
      // Nothing else may queue work on the stream while it is captured (a health probe's copies).
      const std::lock_guard<std::mutex> lock(stream_mutex_);
      c_.activate();
      DUET_CUDA_CHECK(cudaEventSynchronize(copied_));
      DUET_CUDA_CHECK(cudaStreamBeginCapture(c_.stream, cudaStreamCaptureModeThreadLocal));
      try {
        record(StepRecorder::Mode::kCapture, ops);
      } catch (const std::exception& e) {
        error = e.what();
      }
      const cudaError_t ended = cudaStreamEndCapture(c_.stream, &graph);
      if (ended != cudaSuccess && error.empty()) error = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(ended);
      if (error.empty()) {
        const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
        if (made != cudaSuccess) error = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(made);
      }
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
      (void)cudaGetLastError();  // a failed capture leaves nothing sticky behind
    }
    if (!error.empty()) {
      if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
      policy_.capture_failed(key, error);
      spdlog::warn("{}: capturing a decode step of {} sequences as a graph failed{}: {}", c_.name, key.num_seqs,
                   policy_.refused(key).empty() ? "" : " (it runs without one from now on)", error);
      ops();  // throws again when the ops themselves were at fault
      return Ran::kPlain;
    }
    const int index = c_.index;
    policy_.captured(key,
                     std::shared_ptr<void>(exec,
                                           [index](void* p) {
                                             if (cudaSetDevice(index) == cudaSuccess) {
                                               (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(p));
                                             }
                                           }),
                     recorder_.recorded());
    spdlog::info("{}: captured a decode step of {} sequences (context class {}) as a graph in {:.1f} ms ({} trace entries)",
                 c_.name, key.num_seqs, key.context,
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count(),
                 policy_.trace(key)->size());
    launch(exec);
    return Ran::kCaptured;
  }

  CudaContext& c_;
  std::mutex& stream_mutex_;
  unsigned char* staging_device_;
  unsigned char* staging_host_;
  StepRecorder recorder_;
  GraphPolicy policy_;
  cudaEvent_t copied_ = nullptr;
};

}  // namespace

std::unique_ptr<StepGraphs> make_step_graphs(CudaContext& context, std::mutex& stream_mutex,
                                             unsigned char* staging_host, unsigned char* staging_device, size_t bytes) {
  return std::make_unique<CudaStepGraphs>(context, stream_mutex, staging_host, staging_device, bytes);
}

}  // namespace duet::cuda
