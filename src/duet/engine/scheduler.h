// Continuous batching: each step takes the running requests first, then waiting ones, under a
// token budget and a sequence limit. A request catches up on its uncomputed tokens (no separate
// prefill and decode phases), so long prompts are chunked across steps and prefix-cache hits
// need no special path. Running out of KV blocks is met by preempting the lowest-priority,
// newest running request (its blocks are freed and it is recomputed later).
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "duet/cache/kv_cache_manager.h"
#include "duet/engine/request.h"

namespace duet {

enum class SchedulingPolicy { kFcfs, kPriority };

struct SchedulerConfig {
  int32_t max_num_batched_tokens = 2048;  // tokens computed per step, all sequences together
  int32_t max_num_seqs = 256;             // sequences running at once
  bool enable_chunked_prefill = true;     // split prompts longer than the remaining budget
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  // The batching window: while the new requests (never scheduled yet) hold fewer than
  // batch_wait_tokens prompt tokens (0: max_num_batched_tokens), they are held back for up to
  // batch_wait_ms after the first of them arrived, so that more can join them and their prompts
  // are computed in fewer, fuller steps. Running and preempted requests are never held. 0: off.
  double batch_wait_ms = 0.0;
  int32_t batch_wait_tokens = 0;
};

// A prompt whose logprobs are wanted (SamplingParams::prompt_logprobs) has a row of logits per
// token; with chunked prefill its chunks are at most this many tokens, to bound that memory.
inline constexpr int32_t kPromptLogitsChunk = 512;

struct ScheduledSequence {
  Request* request = nullptr;
  Sequence* seq = nullptr;
  int32_t num_new_tokens = 0;
  bool sample = false;  // this step computes the sequence's last token: its logits are wanted
  // Speculative decoding: the last num_draft_tokens of num_new_tokens are seq->draft's first
  // ones; their logits are wanted too (1 + num_draft_tokens rows), and they count as computed
  // only once verified (Scheduler::accept_drafts).
  int32_t num_draft_tokens = 0;
  // SamplingParams::prompt_logprobs: every row's logits are wanted (num_new_tokens rows, the last
  // the sampled one when `sample`).
  bool prompt_logits = false;
};

struct SchedulerOutput {
  std::vector<ScheduledSequence> scheduled;
  int32_t num_batched_tokens = 0;
  std::vector<std::pair<BlockId, BlockId>> block_copies;  // copy-on-write, before the forward
  int32_t num_preempted = 0;
  bool held_new = false;  // new requests were held back by the batching window
  bool empty() const { return scheduled.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KvCacheManager& kv);

  const SchedulerConfig& config() const { return config_; }
  void add(std::unique_ptr<Request> request);
  // One step: at most `max_seqs` sequences (beyond max_num_seqs, for splitting the running
  // requests into micro-batches), none of a request that is in flight (scheduled in a step whose
  // results are not processed yet: its tokens are not known and its blocks are in use). Such a
  // request is never preempted.
  SchedulerOutput schedule(int32_t max_seqs = std::numeric_limits<int32_t>::max());
  // Preempts every running request (their blocks freed, to be recomputed from their tokens), in
  // an order that keeps them ahead of the waiting ones and in their order. Returns how many.
  int32_t preempt_all();
  // Preempts the running request that runs last and is not in flight (memory pressure: a smaller
  // next step); false when there is none, or it is the only one running.
  bool preempt_last();
  // Memory pressure: while paused, requests never scheduled wait (as in the batching window);
  // running and preempted requests go on.
  void pause_admission(bool paused) { admission_paused_ = paused; }
  bool admission_paused() const { return admission_paused_; }

  // After a step computed the scheduled tokens: advances num_computed_tokens and registers the
  // blocks that became full in the prefix cache.
  void on_step_done(const SchedulerOutput& out);
  // After verification: the first `accepted` drafts the step computed for `seq` are the tokens
  // it kept, so their K/V in the cache are right and they count as computed.
  void accept_drafts(Sequence& seq, int32_t accepted);
  // Releases the KV blocks of a finished sequence (its request stays until finish_request).
  void free_sequence(Sequence& seq);
  // Removes a finished or aborted request, freeing whatever its sequences still hold, and
  // returns it to the caller.
  std::unique_ptr<Request> remove(const std::string& request_id);

  using WaitingList = std::list<std::unique_ptr<Request>>;

  // Finding a request by id takes constant time, and so does removing a waiting one (removing a
  // running one is linear in the few that run).
  Request* find(const std::string& request_id) const;
  const std::vector<std::unique_ptr<Request>>& running() const { return running_; }
  const WaitingList& waiting() const { return waiting_; }
  int32_t num_running_seqs() const;
  // The batching window: while it holds new requests back, the time it closes (the first of them
  // arrived plus batch_wait_ms); nothing when it is off, closed, or they hold enough tokens.
  std::optional<Clock::time_point> batch_window_end() const;
  int64_t num_preemptions() const { return num_preemptions_; }
  bool has_unfinished() const { return !running_.empty() || !waiting_.empty(); }

 private:
  // The tokens each live sequence of `r` computes this step within `budget`; empty when none.
  std::vector<ScheduledSequence> plan(Request& r, int32_t budget) const;
  // Sets num_computed_tokens of sequences new to the cache manager from their cached prefix.
  void prepare(Request& r);
  // Undoes prepare() for the request's sequences (all, or those that got no blocks).
  void unprepare(Request& r);
  void unprepare_unallocated(Request& r);
  // Beam search: unless every beam computes its last token this step, none does.
  void hold_unsynced(const Request& r, std::vector<ScheduledSequence>& items) const;
  // Reserves KV slots for a plan; false (with nothing of this plan kept) when blocks run out.
  bool allocate(Request& r, std::vector<ScheduledSequence>& plan);
  void preempt(size_t running_index);
  bool before(const Request& a, const Request& b) const;  // a runs before b

  // Moves the first waiting request to the end of the running list.
  void start_first_waiting();
  void push_waiting_front(std::unique_ptr<Request> r);

  struct Entry {
    Request* request;
    std::optional<WaitingList::iterator> waiting;  // where it waits; empty while it runs
  };

  SchedulerConfig config_;
  KvCacheManager& kv_;
  std::vector<std::unique_ptr<Request>> running_;
  WaitingList waiting_;
  std::unordered_map<std::string, Entry> by_id_;  // every request, running or waiting
  int64_t num_preemptions_ = 0;
  bool admission_paused_ = false;
  std::unordered_map<SeqId, PrefixHit> hits_;  // prefix hits looked up for the request being scheduled
};

}  // namespace duet
