// The engine: requests in, one step at a time, outputs back. A step is three calls: the
// scheduler picks what to compute, the model runner computes it, and the outputs are processed
// (sampling, detokenizing, stop checks, fan-out of n > 1 and beam search). Nothing here throws
// for one bad request once it is queued: it finishes with an error reason while the others go on.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "duet/backend/devices.h"
#include "duet/cache/kv_cache_manager.h"
#include "duet/engine/memory_plan.h"
#include "duet/engine/metrics.h"
#include "duet/engine/model_runner.h"
#include "duet/engine/remote_prefix_cache.h"
#include "duet/engine/request.h"
#include "duet/engine/sampler.h"
#include "duet/engine/scheduler.h"
#include "duet/engine/mtp_drafter.h"
#include "duet/engine/speculative.h"
#include "duet/engine/structured_output.h"
#include "duet/formats/gguf.h"
#include "duet/model/model.h"
#include "duet/tokenizer/tokenizer.h"

namespace duet {

// Where the prefix-cache chains of a request with this LoRA adapter (its fingerprint; 0 for the
// base model) and cache_salt start (chain_hashes' salt): 0 for neither, the same on every server.
uint64_t prefix_salt(uint64_t adapter, const std::string& cache_salt);

struct EngineConfig {
  int threads = 0;                   // threads of the `cpu` device (0: all)
  DeviceMapSpec device_map;          // where the model's parts run; empty: all on `cpu`
  int32_t block_size = 16;           // tokens per KV block
  KvDtype kv_cache_dtype = KvDtype::kF16;
  int64_t kv_cache_tokens = 0;       // KV pool size in tokens (rounded up to blocks); 0: by bytes
  int64_t kv_cache_bytes = 0;        // KV pool bytes per device; 0: memory_utilization of its free memory
  double memory_utilization = 0.3;   // share of each device's free memory for its KV when kv_cache_bytes is 0
  // KV blocks whose memory is committed at startup rather than at their first write (the blocks a
  // fresh pool hands out first); -1: what one full step can take (kv_commit_auto).
  int64_t kv_commit_blocks = -1;
  bool enable_prefix_caching = true;
  int32_t max_model_len = 0;         // longest prompt + output; 0: the model's context length
  // The most top logprobs a request may ask for per token (vLLM's --max-logprobs); -1: the whole
  // vocabulary (and logprobs -1 asks for all of it).
  int32_t max_logprobs = SamplingParams::kMaxLogprobs;
  SchedulerConfig scheduler;
  SpeculativeConfig speculative;
  // LoRA adapters served beside the base model (--lora-modules NAME=PATH): a request picks one
  // with SamplingParams::lora_adapter (its 1-based index here).
  std::vector<LoraSource> lora_adapters;
  // The ranks the model runs over (mpirun with --tensor-parallel-size / --pipeline-parallel-size);
  // null: this process alone. The engine runs on rank 0; the others run run_rank_worker.
  std::shared_ptr<ParallelGroup> parallel;
  // Health: every health_check_interval seconds each device of a model over several devices runs
  // a probe; a device whose probe or micro-batch makes no progress for health_check_timeout
  // seconds, or whose work fails, is failed, and its parts move to the first of spare_devices
  // still healthy (else to another device of the map). 0: no probes / no timeout.
  double health_check_interval = 5.0;
  double health_check_timeout = 10.0;
  std::vector<std::string> spare_devices;
  // Memory (engine/memory_plan.h): a cap on the process's memory (--memory-limit; 0: only the
  // cgroup's limit and the host's free memory), and whether running out of it degrades the model
  // (auto) or fails (off).
  int64_t memory_limit_bytes = 0;
  DegradeMode degrade_on_oom = DegradeMode::kAuto;
  // The Redis KV tier (--kv-cache-redis): full prefix-cache blocks kept in Redis; url empty: none.
  RedisKvConfig kv_cache_redis;
};

// The KV blocks one full step can newly take: a sequence's n new tokens open at most
// ceil(n / block_size) blocks, so a step of max_num_batched_tokens tokens over at most
// max_num_seqs sequences takes at most max_num_batched_tokens / block_size + max_num_seqs.
int64_t kv_commit_auto(const SchedulerConfig& scheduler, int32_t block_size);
// The KV blocks to commit at startup of a pool of `pool` blocks: config.kv_commit_blocks, or
// kv_commit_auto where it is -1, at most the pool. Rank 0 and the other ranks of a parallel
// group (run_rank_worker) take the same number for their layers.
int64_t kv_commit_count(const EngineConfig& config, int64_t pool);

// KV blocks the devices of this process can hold for their layers under `config`'s budget
// (--kv-cache-memory or --memory-utilization per device; the tightest device decides). Throws
// kResourceExhausted, naming the device and the sizes, when one holds no block.
int64_t kv_pool_blocks(const Model& model, const EngineConfig& config);

class LLMEngine {
 public:
  // Loads the model and tokenizer of a GGUF file and sizes the KV pool. Throws Error.
  static std::unique_ptr<LLMEngine> from_file(const std::string& path, const EngineConfig& config);
  LLMEngine(std::shared_ptr<const GgufFile> file, const EngineConfig& config);
  ~LLMEngine();
  // Health: probes the devices when due (the step loop calls it; an idle server too).
  void health_check() {
    check_devices();
    check_memory_pressure();
  }

  // Queues a request. Throws kInvalidArgument for bad sampling parameters, an empty prompt, a
  // prompt that leaves no room to generate within max_model_len (naming both numbers), a
  // request that can never fit in the KV pool, or an id already in use.
  void add_request(const std::string& id, std::vector<int32_t> prompt_ids, const SamplingParams& params,
                   int32_t priority = 0);
  // Aborts a queued or running request; its final output (finish reason abort) comes with the
  // next step() (for a request in a step still computing, with the step after that finishes).
  // Returns false when no such request is unfinished.
  bool abort_request(const std::string& id);

  // Runs one step and returns what it produced (possibly nothing).
  std::vector<RequestOutput> step();
  // Over several ranks, while no step is in flight: asks every other rank to answer within the
  // rank timeout. Throws kUnavailable naming a rank that did not (it died or hangs); then the
  // engine is no longer usable. Does nothing for one process.
  void check_ranks();
  bool parallel() const { return config_.parallel != nullptr && config_.parallel->world().size() > 1; }
  bool has_unfinished() const {
    return scheduler_->has_unfinished() || !aborted_.empty() || runner_->num_in_flight() > 0 || !fetching_.empty();
  }
  // The batching window (SchedulerConfig::batch_wait_ms): when the only unfinished requests are
  // new ones it holds back, the time it closes; step() does nothing before then, so a caller may
  // sleep until it (or until it adds a request, then ask again). Nothing otherwise.
  std::optional<Clock::time_point> batch_wait_deadline() const;

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const GgufFile& file() const { return *file_; }
  const ModelConfig& model_config() const { return model_->config(); }
  // The LoRA adapters a request may name (SamplingParams::lora_adapter): slot and name.
  std::vector<std::pair<int32_t, LoraSource>> lora_adapters() const;
  // Loads an adapter while the engine runs (Model::add_lora_adapter); returns its slot. Throws
  // as that does. Engine thread, between steps.
  int32_t load_lora_adapter(const LoraSource& source);
  // Unloads the adapter named `name`: no new request may name it, and its matrices are freed once
  // the steps in flight are done. Throws kNotFound for a name not loaded and kInvalidArgument
  // while unfinished requests run with it. Engine thread, between steps.
  void unload_lora_adapter(const std::string& name);
  const EngineConfig& config() const { return config_; }
  int32_t max_model_len() const { return max_model_len_; }
  int32_t max_logprobs() const { return config_.max_logprobs; }
  int64_t num_kv_blocks() const { return kv_->config().num_blocks; }
  // What is degraded to fit in memory (see memory_plan.h).
  bool weights_degraded() const { return weights_degraded_; }
  bool kv_degraded() const { return kv_degraded_; }
  const KvCacheManager& kv_cache() const { return *kv_; }
  // The KV blocks committed at startup (EngineConfig::kv_commit_blocks, at most the pool), and
  // the bytes of them this process committed (0 where the kernel could not).
  int64_t kv_committed_blocks() const { return kv_commit_count(config_, kv_->config().num_blocks); }
  int64_t kv_committed_bytes() const { return kv_committed_bytes_; }
  const Scheduler& scheduler() const { return *scheduler_; }
  // Where the model's parts run (its devices, in the order the forward pass reaches them).
  const Placement& placement() const { return model_->placement(); }
  // Counters, gauges and histograms, safe to read from any thread.
  // (with each device's utilization, busy time and memory read at the time of the call).
  EngineMetrics metrics() const;

 private:
  struct SampleRow {
    Sequence* seq;
    const float* logits;
    int32_t num_drafts = 0;  // speculative decoding: the drafts' rows follow this one
  };

  // Drafts for the running sequences that decode (speculative decoding), before scheduling.
  void propose_drafts();
  // How many drafts a sequence may get for its next step (0 unless it decodes).
  int32_t draft_room(const Request& r, const Sequence& seq) const;
  // After a step (--speculative-method mtp): the MTP layer's catch-up and drafts for the step's
  // sequences (MtpDrafter), before finished requests are removed.
  void draft_with_mtp(const SchedulerOutput& out);
  // Keeps the drafts the model agrees with: samples row by row while the sampled token equals
  // the draft; the first other token is kept in its place and ends the run.
  void verify_drafts(Request& r, Sequence& seq, const float* logits, int32_t num_drafts);
  // SamplingParams::prompt_logprobs: the logprobs of the prompt tokens that `num_rows` rows of
  // logits (those after positions first_position onwards) give, each position once.
  void record_prompt_logprobs(Request& r, const float* rows, int32_t first_position, int32_t num_rows);

  void process_request(Request& r, std::vector<SampleRow>& rows, Clock::time_point now);
  void fan_out(Request& r);
  void sample_and_append(Request& r, Sequence& seq, const float* logits);
  // Moves the sequence's grammar over its newest token; false when the grammar has ended (or,
  // which cannot happen for a token its mask allowed, refuses the token).
  bool advance_grammar(Request& r, Sequence& seq, int32_t token);
  void beam_step(Request& r, const std::vector<SampleRow>& rows);
  void finish_sequence(Request& r, Sequence& seq, FinishReason reason, std::string stop_reason = {});
  RequestOutput collect(Request& r);
  // Ends every live sequence of `r` with FinishReason::kError (freeing their blocks) and returns
  // the request's final output carrying `what` and `code`.
  RequestOutput fail_request(Request& r, const std::string& what, ErrorCode code);
  void record_finished(const Request& r);
  void update_gauges();
  uint64_t next_seed(const SamplingParams& p, int32_t index);
  // Launches steps until the pipeline is full or nothing more can be scheduled.
  void launch_steps(std::vector<RequestOutput>& outputs);
  // Processes the oldest step in flight: samples, detokenizes, stops, finishes.
  void finish_step(std::vector<RequestOutput>& outputs);
  // The aborts that waited for their requests' step, once that step is done.
  void finish_aborts();
  // A step that could not be computed (memory ran out): its requests fail, the others go on.
  void fail_step(const SchedulerOutput& out, const std::string& what, std::vector<RequestOutput>& outputs);
  // Memory ran out in a step: with --degrade-on-oom auto, one rung of the pressure ladder is
  // climbed and the step's requests are computed again (each at most kMaxOomRetries times);
  // otherwise, or past the last rung, the step fails.
  void on_out_of_memory(const SchedulerOutput& out, const std::string& what, std::vector<RequestOutput>& outputs);
  // The load-time plan: which degradation lets the model fit (throws kResourceExhausted when
  // none does); it sets the devices' re-quantization and the budget's weight sizes.
  MemoryPlan plan_load_memory(const Placement& placement);
  // Memory under the low watermark (less than 5% of the limit left, checked every 200 ms from
  // step() and, idle, from health_check()): a pressure event without a failed step, at most one
  // a second.
  void check_memory_pressure();
  PressureState pressure_state() const;
  // Pauses admission and does what the rung says (the retries are the caller's).
  void climb(PressureRung rung);
  // The fewest blocks the pool keeps: one request of max_model_len.
  int32_t min_kv_blocks() const;
  // Rungs of the ladder: false when it could not be done (the next event tries the next rung).
  bool shrink_kv_pool();
  bool degrade_kv();
  bool degrade_weights();
  // Drops every step in flight and preempts every request (their KV is to be remade).
  int32_t recompute_all();
  bool kv_degradable() const;
  bool weights_degradable() const;
  void publish_memory_state();
  // Probes the devices when the interval has passed; a device that failed its probe, or did not
  // answer within the timeout, is failed over.
  void check_devices();
  // Moves the parts of the failed device to a spare, reloading their weights from the file; every
  // running request is recomputed through preemption (its KV is gone with the device).
  void fail_over(const std::string& device, const std::string& reason);
  std::shared_ptr<Device> choose_spare(const Placement& p, int failed);
  void make_runner();
  // Commits the memory of the KV blocks the first steps take (EngineConfig::kv_commit_blocks).
  void commit_first_blocks();
  std::unique_ptr<ModelRunner> new_runner(Model& model, KvDtype kv_dtype) const;
  // The Redis KV tier: requests whose blocks were fetched (or whose wait is over) join the scheduler.
  void admit_fetched();

  // A model and its runner replaced after a failure, kept until their devices let go of the
  // work still queued (a hung device may never: then they are left to the process's end).
  struct Retired {
    std::unique_ptr<Model> model;
    std::unique_ptr<ModelRunner> runner;  // destroyed first
  };

  EngineConfig config_;
  std::shared_ptr<const GgufFile> file_;
  DeviceRegistry devices_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<MtpDrafter> mtp_;  // --speculative-method mtp
  Sampler sampler_;
  std::unique_ptr<StructuredOutputs> structured_;
  grammar::TokenMask grammar_scratch_;  // a mask narrowed for the end of max_tokens
  std::vector<int32_t> eos_ids_;
  int32_t max_model_len_ = 0;
  int64_t next_arrival_ = 0;
  SeqId next_seq_id_ = 0;
  std::mt19937_64 seed_source_;
  std::vector<std::unique_ptr<Request>> aborted_;  // removed, final output pending
  std::deque<SchedulerOutput> in_flight_;          // launched steps, oldest first
  uint64_t steps_launched_ = 0;
  uint64_t steps_finished_ = 0;
  // Unloaded LoRA adapters' slots and the steps_launched_ count when they were unloaded: freed
  // once steps_finished_ reaches it (no step in flight reads them any more).
  std::vector<std::pair<int32_t, uint64_t>> retired_loras_;
  void free_retired_loras();
  // Over several ranks: the others drop the adapter in `slot` too (after their steps in flight).
  void tell_ranks_lora_removed(int32_t slot);
  std::vector<std::string> abort_after_step_;      // aborts of requests in flight
  MetricsRegistry metrics_;
  std::vector<Retired> retired_;
  mutable std::mutex model_mutex_;  // metrics() reads the placement while a failover replaces it
  Clock::time_point last_health_check_ = Clock::now();
  // Memory pressure.
  static constexpr int32_t kMaxOomRetries = 2;
  int64_t kv_committed_bytes_ = 0;
  bool weights_degraded_ = false;
  bool kv_degraded_ = false;
  bool has_float_weights_ = false;  // matrices re-quantization would shrink
  int32_t oom_events_ = 0;
  int32_t low_memory_events_ = 0;
  Clock::time_point last_memory_check_{};
  Clock::time_point last_low_memory_event_{};
  std::optional<Clock::time_point> admission_paused_until_;
  // The Redis KV tier, and the new requests waiting for their blocks from it (not scheduled yet).
  std::unique_ptr<RemotePrefixCache> remote_;
  struct Fetching {
    std::unique_ptr<Request> request;
    uint64_t ticket = 0;
    Clock::time_point deadline;
  };
  std::vector<Fetching> fetching_;
};

}  // namespace duet
