#include "duet/engine/scheduler.h"

#include <algorithm>

#include "duet/core/error.h"

namespace duet {

Scheduler::Scheduler(const SchedulerConfig& config, KvCacheManager& kv) : config_(config), kv_(kv) {
  if (config.max_num_batched_tokens < 1 || config.max_num_seqs < 1) {
    fail(ErrorCode::kInvalidArgument, "max_num_batched_tokens ({}) and max_num_seqs ({}) must be at least 1",
         config.max_num_batched_tokens, config.max_num_seqs);
  }
  if (!(config.batch_wait_ms >= 0.0 && config.batch_wait_ms <= 10000.0)) {
    fail(ErrorCode::kInvalidArgument, "batch_wait_ms is {}, expected 0 to 10000 milliseconds", config.batch_wait_ms);
  }
  if (config.batch_wait_tokens < 0) {
    fail(ErrorCode::kInvalidArgument, "batch_wait_tokens is {}, expected 0 or more", config.batch_wait_tokens);
  }
}

bool Scheduler::before(const Request& a, const Request& b) const {
  if (config_.policy == SchedulingPolicy::kPriority && a.priority != b.priority) return a.priority < b.priority;
  return a.arrival_order < b.arrival_order;
}

void Scheduler::add(std::unique_ptr<Request> request) {
  const std::string id = request->id;
  waiting_.push_back(std::move(request));
  auto [it, fresh] = by_id_.try_emplace(id, Entry{waiting_.back().get(), std::prev(waiting_.end())});
  if (!fresh) {
    waiting_.pop_back();
    fail(ErrorCode::kInvalidArgument, "request id '{}' is already in use", id);
  }
}

void Scheduler::start_first_waiting() {
  std::unique_ptr<Request> r = std::move(waiting_.front());
  waiting_.pop_front();
  by_id_.at(r->id).waiting.reset();
  r->running = true;
  running_.push_back(std::move(r));
}

void Scheduler::push_waiting_front(std::unique_ptr<Request> r) {
  r->running = false;
  Entry& e = by_id_.at(r->id);
  waiting_.push_front(std::move(r));
  e.waiting = waiting_.begin();
}

int32_t Scheduler::num_running_seqs() const {
  int32_t n = 0;
  for (const auto& r : running_) n += static_cast<int32_t>(r->live_seqs().size());
  return n;
}

std::optional<Clock::time_point> Scheduler::batch_window_end() const {
  if (!(config_.batch_wait_ms > 0.0)) return std::nullopt;
  const int64_t threshold = config_.batch_wait_tokens > 0 ? config_.batch_wait_tokens : config_.max_num_batched_tokens;
  int64_t tokens = 0;
  std::optional<Clock::time_point> first;
  for (const auto& r : waiting_) {
    if (r->times.first_scheduled) continue;  // preempted: it has had its turn
    tokens += static_cast<int64_t>(r->prompt_ids.size());
    if (tokens >= threshold) return std::nullopt;
    if (!first || r->times.arrival < *first) first = r->times.arrival;
  }
  if (!first) return std::nullopt;
  const Clock::time_point end =
      *first + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(config_.batch_wait_ms));
  if (Clock::now() >= end) return std::nullopt;
  return end;
}

std::vector<ScheduledSequence> Scheduler::plan(Request& r, int32_t budget) const {
  std::vector<ScheduledSequence> items;
  const std::vector<Sequence*> live = r.live_seqs();
  for (Sequence* seq : live) {
    if (budget <= 0) break;
    const int32_t remaining = static_cast<int32_t>(seq->tokens.size()) - seq->num_computed_tokens;
    if (remaining <= 0) continue;
    // A prompt whose logprobs are wanted has a row of logits per token: chunks of at most
    // kPromptLogitsChunk tokens bound that memory where chunks are allowed.
    const bool prompt_logits = r.params.prompt_logprobs &&
                               seq->num_computed_tokens + 1 < static_cast<int32_t>(r.prompt_ids.size());
    int32_t n = std::min(remaining, budget);
    if (prompt_logits && config_.enable_chunked_prefill) n = std::min(n, kPromptLogitsChunk);
    if (n < remaining && !config_.enable_chunked_prefill) break;
    // A decoding sequence with drafts computes them in the same pass, as far as the budget goes.
    const int32_t drafts =
        remaining == 1 ? std::min(static_cast<int32_t>(seq->draft.size()), budget - 1) : 0;
    items.push_back(ScheduledSequence{&r, seq, n + drafts, n == remaining, drafts, prompt_logits});
    budget -= n + drafts;
  }
  hold_unsynced(r, items);
  return items;
}

void Scheduler::hold_unsynced(const Request& r, std::vector<ScheduledSequence>& items) const {
  // Beam search advances all its beams in the same step: if not every beam reaches its last
  // token now, none samples (the last token of each is left for a later step).
  const size_t live = r.live_seqs().size();
  if (!r.params.use_beam_search || live <= 1) return;
  const bool all_sample = items.size() == live &&
                          std::all_of(items.begin(), items.end(), [](const auto& i) { return i.sample; });
  if (all_sample) return;
  std::vector<ScheduledSequence> held;
  for (ScheduledSequence item : items) {
    if (item.sample) {
      --item.num_new_tokens;
      item.sample = false;
    }
    if (item.num_new_tokens > 0) held.push_back(item);
  }
  items = std::move(held);
}

void Scheduler::prepare(Request& r) {
  // Sequences the cache manager does not know yet (new, or preempted) start from their cached
  // prefix, whose tokens count as computed.
  for (Sequence* seq : r.live_seqs()) {
    if (kv_.has(seq->id) || hits_.count(seq->id) != 0) continue;
    // A request for prompt logprobs computes its whole prompt: nothing of it is taken from the cache.
    PrefixHit hit = r.params.prompt_logprobs ? PrefixHit{} : kv_.find_cached_prefix(seq->tokens, r.prefix_salt);
    seq->num_computed_tokens = hit.num_tokens;
    hits_.emplace(seq->id, std::move(hit));
  }
}

void Scheduler::unprepare(Request& r) {
  for (Sequence* seq : r.live_seqs()) {
    if (hits_.erase(seq->id) != 0) seq->num_computed_tokens = 0;
  }
}

void Scheduler::unprepare_unallocated(Request& r) {
  for (Sequence* seq : r.live_seqs()) {
    if (!kv_.has(seq->id) && hits_.erase(seq->id) != 0) seq->num_computed_tokens = 0;
  }
}

bool Scheduler::allocate(Request& r, std::vector<ScheduledSequence>& plan) {
  std::vector<SeqId> added;
  for (ScheduledSequence& item : plan) {
    Sequence& seq = *item.seq;
    auto hit = hits_.find(seq.id);
    if (hit != hits_.end() && !kv_.prefix_hit_is_current(hit->second)) {
      // A block of the hit was reused since the lookup (by a sibling allocated just now): look
      // again; fewer cached tokens leave more to compute, so this step computes no further.
      hit->second = kv_.find_cached_prefix(seq.tokens, r.prefix_salt);
      seq.num_computed_tokens = hit->second.num_tokens;
      const int32_t remaining = static_cast<int32_t>(seq.tokens.size()) - seq.num_computed_tokens;
      item.num_new_tokens = std::min(item.num_new_tokens - item.num_draft_tokens, remaining);
      item.num_draft_tokens = 0;
      item.sample = item.num_new_tokens == remaining;
    }
    const PrefixHit* h = hit == hits_.end() ? nullptr : &hit->second;
    if (!kv_.allocate_slots(seq.id, seq.num_computed_tokens, item.num_new_tokens, h, r.prefix_salt)) {
      for (SeqId id : added) kv_.free(id);
      unprepare(r);
      return false;
    }
    if (h != nullptr) added.push_back(seq.id);
  }
  // Hits are only good for the step they were looked up in.
  unprepare_unallocated(r);
  for (SeqId id : added) hits_.erase(id);
  hold_unsynced(r, plan);
  return true;
}

void Scheduler::preempt(size_t running_index) {
  std::unique_ptr<Request> r = std::move(running_[running_index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(running_index));
  for (auto& seq : r->seqs) {
    kv_.free(seq->id);
    hits_.erase(seq->id);
    seq->num_computed_tokens = 0;
    seq->draft.clear();
  }
  ++r->num_preemptions;
  ++num_preemptions_;
  push_waiting_front(std::move(r));
}

int32_t Scheduler::preempt_all() {
  const auto n = static_cast<int32_t>(running_.size());
  std::stable_sort(running_.begin(), running_.end(), [this](const auto& a, const auto& b) { return before(*a, *b); });
  while (!running_.empty()) preempt(running_.size() - 1);  // each goes to the front of the queue
  return n;
}

bool Scheduler::preempt_last() {
  if (running_.size() < 2) return false;
  std::stable_sort(running_.begin(), running_.end(), [this](const auto& a, const auto& b) { return before(*a, *b); });
  for (size_t i = running_.size(); i-- > 0;) {
    if (running_[i]->in_flight) continue;
    preempt(i);
    return true;
  }
  return false;
}

SchedulerOutput Scheduler::schedule(int32_t max_seqs) {
  SchedulerOutput out;
  int32_t budget = config_.max_num_batched_tokens;
  int32_t seqs = 0;  // scheduled this step
  std::stable_sort(running_.begin(), running_.end(), [this](const auto& a, const auto& b) { return before(*a, *b); });

  size_t i = 0;
  while (i < running_.size() && budget > 0) {
    Request& r = *running_[i];
    if (r.in_flight) {
      ++i;
      continue;
    }
    if (seqs > 0 && seqs + static_cast<int32_t>(r.live_seqs().size()) > max_seqs) break;
    prepare(r);
    std::vector<ScheduledSequence> items = plan(r, budget);
    if (items.empty()) {
      ++i;
      continue;
    }
    if (allocate(r, items)) {
      for (const ScheduledSequence& item : items) budget -= item.num_new_tokens;
      seqs += static_cast<int32_t>(items.size());
      out.scheduled.insert(out.scheduled.end(), items.begin(), items.end());
      ++i;
      continue;
    }
    // Out of blocks: preempt the request that runs last and is not in flight, which may be this
    // one.
    size_t victim = running_.size() - 1;
    while (running_[victim]->in_flight) --victim;
    preempt(victim);
    ++out.num_preempted;
    if (victim == i) break;
  }

  const bool hold_new = admission_paused_ || batch_window_end().has_value();
  if (out.num_preempted == 0) {
    // A list's sort is stable and keeps every element where it is, so the entries stay valid.
    waiting_.sort([this](const auto& a, const auto& b) { return before(*a, *b); });
    int32_t running_seqs = num_running_seqs();
    while (!waiting_.empty() && budget > 0) {
      Request& r = *waiting_.front();
      if (hold_new && !r.times.first_scheduled) {
        out.held_new = true;
        break;
      }
      const int32_t width = static_cast<int32_t>(r.live_seqs().size());
      if (running_seqs + std::max(width, r.fanned_out ? width : r.width()) > config_.max_num_seqs) break;
      if (seqs > 0 && seqs + width > max_seqs) break;
      prepare(r);
      std::vector<ScheduledSequence> items = plan(r, budget);
      if (items.empty()) {
        unprepare(r);
        break;
      }
      if (!allocate(r, items)) break;
      if (!r.times.first_scheduled) {
        r.times.first_scheduled = Clock::now();
        r.num_cached_tokens = r.seqs.front()->num_computed_tokens;
      }
      for (const ScheduledSequence& item : items) budget -= item.num_new_tokens;
      seqs += static_cast<int32_t>(items.size());
      out.scheduled.insert(out.scheduled.end(), items.begin(), items.end());
      running_seqs += width;
      start_first_waiting();
    }
  }
  for (const ScheduledSequence& item : out.scheduled) out.num_batched_tokens += item.num_new_tokens;
  out.block_copies = kv_.take_pending_copies();
  return out;
}

void Scheduler::on_step_done(const SchedulerOutput& out) {
  for (const ScheduledSequence& item : out.scheduled) {
    Sequence& seq = *item.seq;
    seq.num_computed_tokens += item.num_new_tokens - item.num_draft_tokens;
    kv_.cache_full_blocks(seq.id, seq.tokens, seq.num_computed_tokens);
  }
}

void Scheduler::accept_drafts(Sequence& seq, int32_t accepted) {
  if (accepted <= 0) return;
  seq.num_computed_tokens += accepted;
  kv_.cache_full_blocks(seq.id, seq.tokens, seq.num_computed_tokens);
}

void Scheduler::free_sequence(Sequence& seq) { kv_.free(seq.id); }

std::unique_ptr<Request> Scheduler::remove(const std::string& request_id) {
  auto found = by_id_.find(request_id);
  if (found == by_id_.end()) return nullptr;
  std::unique_ptr<Request> r;
  if (found->second.waiting) {
    r = std::move(**found->second.waiting);
    waiting_.erase(*found->second.waiting);
  } else {
    for (size_t i = 0; i < running_.size(); ++i) {
      if (running_[i].get() == found->second.request) {
        r = std::move(running_[i]);
        running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    }
  }
  by_id_.erase(found);
  if (r) {
    for (auto& seq : r->seqs) {
      kv_.free(seq->id);
      hits_.erase(seq->id);
    }
    r->running = false;
  }
  return r;
}

Request* Scheduler::find(const std::string& request_id) const {
  auto found = by_id_.find(request_id);
  return found == by_id_.end() ? nullptr : found->second.request;
}

}  // namespace duet
