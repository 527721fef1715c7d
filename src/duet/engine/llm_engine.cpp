#include "duet/engine/llm_engine.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>
#include <new>
#include <set>

#include "duet/backend/fault.h"
#include "duet/core/error.h"
#include "duet/core/log.h"
#include "duet/core/random.h"
#include "duet/core/sysinfo.h"
#include "duet/engine/generation_config.h"
#include "duet/engine/model_path.h"

namespace duet {
namespace {

// Runs fn. Memory that runs out in it (while a step is prepared or computed) is returned as a
// message, empty when none did; any other fault of the forward pass is the engine's and leaves.
template <typename Fn>
std::string out_of_memory_in(Fn&& fn) {
  try {
    fn();
  } catch (const std::bad_alloc&) {
    return "out of memory while computing the step";
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kResourceExhausted) throw;
    return e.what();
  }
  return {};
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

bool contains(const std::vector<int32_t>& ids, int32_t id) { return std::find(ids.begin(), ids.end(), id) != ids.end(); }

}  // namespace

std::unique_ptr<LLMEngine> LLMEngine::from_file(const std::string& path, const EngineConfig& config) {
  // The engine alone reads the file it opens: converted weights are freed once packed.
  return std::make_unique<LLMEngine>(
      std::make_shared<const GgufFile>(open_model_path(path, ConvertedCopies::kDiscardable,
                                                       config.speculative.method == SpeculativeMethod::kMtp)),
      config);
}

LLMEngine::LLMEngine(std::shared_ptr<const GgufFile> file, const EngineConfig& config)
    : config_(config),
      file_(std::move(file)),
      devices_(DeviceRegistry::Options{config.threads, default_matmul_mode()}),
      seed_source_(std::random_device{}()) {
  if (config.block_size < 1) fail(ErrorCode::kInvalidArgument, "block size is {}, expected >= 1", config.block_size);
  if (config.max_logprobs < -1) {
    fail(ErrorCode::kInvalidArgument, "--max-logprobs is {}, expected -1 (the whole vocabulary) or an integer >= 0",
         config.max_logprobs);
  }
  validate_speculative_config(config.speculative);
  // Past a pebibyte no machine has it, and sums of it with the weights would overflow (2^63 - 1
  // bytes once planned as a negative need and ended in std::bad_alloc).
  constexpr int64_t kMaxKvCacheBytes = int64_t{1} << 50;
  if (config.kv_cache_bytes > kMaxKvCacheBytes) {
    fail(ErrorCode::kInvalidArgument, "--kv-cache-memory is {} bytes, more than any machine has (at most {})",
         config.kv_cache_bytes, kMaxKvCacheBytes);
  }
  if (config.kv_cache_tokens <= 0 && config.kv_cache_bytes <= 0 &&
      !(config.memory_utilization > 0.0 && config.memory_utilization <= 1.0)) {
    fail(ErrorCode::kInvalidArgument, "memory utilization is {}, expected a fraction in (0, 1]",
         config.memory_utilization);
  }
  // Spares are checked now (not made): a misspelt name or a GPU this machine lacks is refused at
  // start, not found out at the failover it was there for.
  for (const std::string& name : config.spare_devices) {
    try {
      devices_.check(name);
    } catch (const Error& e) {
      fail(ErrorCode::kInvalidArgument, "--spare-devices: {}", e.what());
    }
  }
  arm_fault_from_env();  // DUET_FAULT: a device fault for tests
  const bool redis = !config.kv_cache_redis.url.empty();
  if (redis && config.parallel != nullptr && config.parallel->world().size() > 1) {
    fail(ErrorCode::kInvalidArgument, "--kv-cache-redis is not supported over several ranks (each rank holds a share "
         "of the KV): drop it or --tensor-parallel-size/--pipeline-parallel-size");
  }
  if (redis && !config.enable_prefix_caching) {
    fail(ErrorCode::kInvalidArgument, "--kv-cache-redis keeps prefix-cache blocks, and prefix caching is off: drop "
         "--no-prefix-caching or --kv-cache-redis");
  }
  // Before the model loads: a folder's converted tensors may be released once packed.
  const uint64_t fingerprint = redis ? model_fingerprint(*file_) : 0;
  if (config.memory_limit_bytes > 0) set_memory_limit(config.memory_limit_bytes);
  KvBudget budget{config.kv_cache_bytes, config.memory_utilization};
  // The placement's check of each device's memory counts float weights as Q8_0 (what they take if
  // the plan below re-quantizes them): the plan decides, and names the numbers when nothing fits.
  budget.weights_as_q8_0 = !parallel();
  Placement placement = plan_model_placement(*file_, config.device_map, devices_, budget, config.kv_cache_dtype,
                                             config.parallel);
  const bool mtp = config.speculative.method == SpeculativeMethod::kMtp;
  if (mtp) {
    // The drafter runs the MTP layer on the engine's thread between steps, on the model's device.
    if (parallel() || placement.devices.size() != 1 || !placement.devices.front()->host_accessible()) {
      fail(ErrorCode::kUnsupported, "--speculative-method mtp runs the model on one CPU device for now (this map "
           "places it on {} device(s){}): drop the device map or use ngram", placement.devices.size(),
           parallel() ? " over several ranks" : "");
    }
    placement.mtp = true;
  }
  placement.lora_adapters = config.lora_adapters;
  const MemoryPlan plan = plan_load_memory(placement);
  model_ = load_model(file_, std::move(placement));
  if (mtp && model_->num_mtp_layers() == 0) {
    fail(ErrorCode::kUnsupported, "'{}' ({}) has no multi-token-prediction layer: --speculative-method mtp needs "
         "DeepSeek-V3's MTP weights (a deepseek2 model with num_nextn_predict_layers > 0; make-model --mtp-layers 1 "
         "writes one); use --speculative-method ngram", file_->path(), model_->config().architecture);
  }
  if (mtp) mtp_ = std::make_unique<MtpDrafter>(config.speculative.num_speculative_tokens);
  if (plan.kv_dtype != config_.kv_cache_dtype) {
    try {
      (void)model_->kv_bytes_per_token(plan.kv_dtype);
    } catch (const Error& e) {
      fail(ErrorCode::kResourceExhausted, "{}; but the KV cache cannot be q8_0: {}", plan.summary, e.what());
    }
    config_.kv_cache_dtype = plan.kv_dtype;
    kv_degraded_ = true;
  }
  weights_degraded_ = plan.requantize_weights;
  tokenizer_ = Tokenizer::from_gguf(*file_);
  const ModelConfig& mc = model_->config();
  if (tokenizer_->vocab_size() > mc.num_vocab) {
    fail(ErrorCode::kInvalidArgument, "'{}': the tokenizer has {} tokens but the model only {} rows of logits",
         file_->path(), tokenizer_->vocab_size(), mc.num_vocab);
  }
  eos_ids_ = model_stop_ids(*file_, *tokenizer_);
  structured_ = std::make_unique<StructuredOutputs>(*tokenizer_, static_cast<int32_t>(mc.num_vocab), eos_ids_);
  max_model_len_ = config.max_model_len > 0 ? config.max_model_len : static_cast<int32_t>(mc.context_length);

  // The KV pool: as many blocks as the tightest device of every rank holds.
  const Placement& placed = model_->placement();
  const int64_t num_blocks = std::min(kv_pool_blocks(*model_, config_), model_->rank_kv_blocks());
  KvCacheConfig kv_config;
  kv_config.block_size = config.block_size;
  kv_config.num_blocks = static_cast<int32_t>(std::min<int64_t>(num_blocks, 1 << 30));
  kv_config.enable_prefix_caching = config.enable_prefix_caching;
  kv_config.record_new_cached_blocks = redis;
  kv_ = std::make_unique<KvCacheManager>(kv_config);
  SchedulerConfig sc = config.scheduler;
  if (!sc.enable_chunked_prefill) sc.max_num_batched_tokens = std::max(sc.max_num_batched_tokens, max_model_len_);
  scheduler_ = std::make_unique<Scheduler>(sc, *kv_);
  make_runner();
  commit_first_blocks();
  if (redis) {
    remote_ = std::make_unique<RemotePrefixCache>(config.kv_cache_redis, fingerprint, config_.kv_cache_dtype,
                                                  runner_->cache(), kv_config.num_blocks);
    spdlog::info("engine: KV blocks kept in {} (keys {}, {} KiB per block, TTL {} s)",
                 parse_redis_url(config.kv_cache_redis.url).display(), block_key(remote_->identity(), 0).substr(0, 28) + "*",
                 block_value_size(remote_->layout()) / 1024, config.kv_cache_redis.ttl_seconds);
  }
  metrics_.update([&](EngineMetrics& m) {
    m.kv_blocks_total = kv_config.num_blocks;
    if (parallel()) {
      m.parallel = true;
      m.rank_step_seconds.assign(static_cast<size_t>(config.parallel->world().size()), rank_step_histogram());
    }
    for (const auto& d : placed.devices) m.devices.emplace_back(d->name());
  });
  publish_memory_state();
  spdlog::info("engine: devices\n{}", placed.describe());
  spdlog::info("engine: {} KV blocks of {} tokens ({:.1f} MiB, {}, {} KiB per token), max model length {}",
               kv_config.num_blocks, config.block_size, static_cast<double>(runner_->cache().bytes()) / (1 << 20),
               kv_dtype_name(config_.kv_cache_dtype),
               model_->kv_bytes_per_token(config_.kv_cache_dtype) / 1024, max_model_len_);
  // What the process holds now, measured: its own memory (packed and converted weights, the
  // tokenizer, buffers; of the KV pool, the blocks committed or written) and the files' pages it
  // has mapped in.
  const ProcessMemory held = process_memory();
  int64_t weights = 0;
  for (const auto& d : placed.devices) weights += d->memory_used(MemoryKind::kWeights);
  spdlog::info("engine: resident {:.1f} MiB after loading ({:.1f} MiB the process's own, {:.1f} MiB of mapped files; "
               "the weights take {:.1f} MiB)", static_cast<double>(held.resident_bytes) / (1 << 20),
               static_cast<double>(held.anonymous_bytes) / (1 << 20), static_cast<double>(held.file_bytes) / (1 << 20),
               static_cast<double>(weights) / (1 << 20));
}

int64_t kv_commit_auto(const SchedulerConfig& scheduler, int32_t block_size) {
  return scheduler.max_num_batched_tokens / std::max(block_size, 1) + scheduler.max_num_seqs;
}

int64_t kv_commit_count(const EngineConfig& config, int64_t pool) {
  const int64_t want =
      config.kv_commit_blocks >= 0 ? config.kv_commit_blocks : kv_commit_auto(config.scheduler, config.block_size);
  return std::clamp<int64_t>(want, 0, pool);
}

void LLMEngine::commit_first_blocks() {
  // A fresh pool hands its blocks out in id order (BlockPool), so these are the ones the first
  // steps write. Committing them here, where the process loads, keeps the page faults of their
  // first writes (on virtual machines, where the host also has to back each page on first
  // touch, seconds per GiB) out of the first requests' steps; llama.cpp clears its whole cache
  // at startup and vLLM allocates its cache before serving. The rest of the pool is committed
  // as it is written, as before.
  const int64_t blocks = kv_committed_blocks();
  if (blocks <= 0) return;
  const auto t0 = Clock::now();
  kv_committed_bytes_ = runner_->cache().commit_blocks(0, blocks);
  spdlog::info("engine: committed the first {} KV blocks ({:.1f} MiB) in {:.2f} s{}", blocks,
               static_cast<double>(kv_committed_bytes_) / (1 << 20), seconds(Clock::now() - t0),
               kv_committed_bytes_ == 0
                   ? " (none here: the kernel cannot, or the cache is not in this process's memory)"
                   : "");
}

int64_t kv_pool_blocks(const Model& model, const EngineConfig& config) {
  // Each device holding attention layers gets its budget over its layers' bytes per block.
  const Placement& placement = model.placement();
  const int64_t layer_row_bytes = model.kv_bytes_per_token(config.kv_cache_dtype) / model.num_cache_layers();
  int64_t num_blocks = std::numeric_limits<int64_t>::max();
  std::string tightest;
  int64_t tightest_pool = 0, tightest_block = 0;
  for (size_t d = 0; d < placement.devices.size(); ++d) {
    if (placement.devices[d]->remote_rank() >= 0) continue;  // another rank's: it sizes its own
    int64_t layers = std::count(placement.attention.begin(), placement.attention.end(), static_cast<int>(d));
    if (static_cast<int>(d) == placement.head) layers += model.num_mtp_layers();  // its KV is beside the head
    if (layers == 0) continue;
    const int64_t block_bytes = layers * layer_row_bytes * config.block_size;
    int64_t pool_bytes = config.kv_cache_bytes;
    if (config.kv_cache_tokens > 0) {
      pool_bytes = (config.kv_cache_tokens + config.block_size - 1) / config.block_size * block_bytes;
    } else if (pool_bytes <= 0) {
      const int64_t free = placement.devices[d]->info().free_bytes;
      pool_bytes = static_cast<int64_t>(static_cast<double>(free) * config.memory_utilization);
    }
    if (pool_bytes / block_bytes < num_blocks) {
      num_blocks = pool_bytes / block_bytes;
      tightest = placement.devices[d]->name();
      tightest_pool = pool_bytes;
      tightest_block = block_bytes;
    }
  }
  if (num_blocks < 1) {
    fail(ErrorCode::kResourceExhausted, "a KV pool of {} bytes on {} holds no block ({} bytes per block of {} tokens)",
         tightest_pool, tightest, tightest_block, config.block_size);
  }
  return num_blocks;
}

LLMEngine::~LLMEngine() {
  // The steps in flight first; then the other ranks may stop.
  runner_.reset();
  remote_.reset();  // the writer stores what is queued (up to a second)
  if (parallel()) stop_other_ranks(*config_.parallel);
}

void LLMEngine::check_ranks() {
  if (!parallel() || runner_->num_in_flight() > 0) return;
  Communicator& world = config_.parallel->world();
  const uint32_t ping = kPingMessage;
  for (int r = 1; r < world.size(); ++r) world.send(&ping, 4, r, kStepTag);
  for (int r = 1; r < world.size(); ++r) {
    uint32_t pong = 0;
    world.recv(&pong, 4, r, kPongTag);
  }
}

EngineMetrics LLMEngine::metrics() const {
  EngineMetrics m = metrics_.snapshot();
  if (remote_) {
    const RedisStoreCounters c = remote_->counters();
    m.kv_redis_hits_total = c.hits;
    m.kv_redis_misses_total = c.misses;
    m.kv_redis_read_bytes_total = c.bytes_read;
    m.kv_redis_written_bytes_total = c.bytes_written;
    m.kv_redis_errors_total = c.errors;
  }
  const std::lock_guard<std::mutex> lock(model_mutex_);  // a failover may replace the model
  if (m.parallel) m.collectives = collective_stats();
  const Placement& p = model_->placement();
  const auto now = Clock::now();
  for (const auto& device : p.devices) {
    const Device& dev = *device;
    const auto it = std::find_if(m.devices.begin(), m.devices.end(), [&](const auto& d) { return d.name == dev.name(); });
    if (it == m.devices.end()) continue;
    it->utilization = dev.utilization();
    it->busy_seconds_total = dev.busy_seconds_total();
    it->copy_seconds_total = dev.copy_seconds_total();
    it->copy_bytes_total = dev.copy_bytes_total();
    for (int k = 0; k < kNumMemoryKinds; ++k) it->memory_bytes[k] = dev.memory_used(static_cast<MemoryKind>(k));
    const Device::ProbeState probe = dev.probe_state();
    it->probes = probe.probes;
    it->probe_failures = probe.failures;
    if (probe.probes > 0) it->last_probe_age_seconds = seconds(now - probe.finished);
  }
  return m;
}

uint64_t prefix_salt(uint64_t adapter, const std::string& cache_salt) {
  if (adapter == 0 && cache_salt.empty()) return 0;
  // The adapter's fingerprint and the salt with its length, mixed byte by byte: the same on every
  // server (the Redis tier shares chains between them); never 0, the base model's.
  uint64_t h = mix64(mix64(adapter + kGolden) ^ (static_cast<uint64_t>(cache_salt.size()) * kGolden));
  for (unsigned char ch : cache_salt) h = mix64((h + kGolden) ^ ch);
  return h == 0 ? 1 : h;
}

std::vector<std::pair<int32_t, LoraSource>> LLMEngine::lora_adapters() const {
  std::vector<std::pair<int32_t, LoraSource>> out;
  for (int32_t i = 1; i <= Model::kMaxLoraAdapters; ++i) {
    const LoraAdapter* a = model_->lora_adapter(i);
    if (a != nullptr && !model_->lora_adapter_retired(i)) out.emplace_back(i, LoraSource{a->name(), a->path()});
  }
  return out;
}

int32_t LLMEngine::load_lora_adapter(const LoraSource& source) {
  const int32_t slot = model_->add_lora_adapter(source);
  if (!parallel()) return slot;
  // The other ranks load it into the same slot (each reads the path itself, and keeps its share)
  // before any step uses it; one that cannot undoes it everywhere.
  Communicator& world = config_.parallel->world();
  std::vector<uint8_t> message;
  encode_lora_message(LoraMessage{true, slot, source}, message);
  for (int r = 1; r < world.size(); ++r) world.send(message.data(), message.size(), r, kStepTag);
  std::string refused;
  for (int r = 1; r < world.size(); ++r) {
    std::vector<uint8_t> answer;
    if (!world.recv_message(answer, r, kPongTag, world.timeout())) {
      fail(ErrorCode::kUnavailable, "rank {} did not answer the load of LoRA adapter '{}' within {:.0f} s", r,
           source.name, std::chrono::duration<double>(world.timeout()).count());
    }
    if (answer.size() > 4 && refused.empty()) refused = fmt::format("rank {}: {}", r, std::string(answer.begin() + 4, answer.end()));
  }
  if (!refused.empty()) {
    model_->remove_lora_adapter(slot);
    tell_ranks_lora_removed(slot);
    fail(ErrorCode::kInvalidArgument, "LoRA adapter '{}' was not loaded on every rank: {}", source.name, refused);
  }
  return slot;
}

void LLMEngine::tell_ranks_lora_removed(int32_t slot) {
  if (!parallel()) return;
  Communicator& world = config_.parallel->world();
  std::vector<uint8_t> message;
  encode_lora_message(LoraMessage{false, slot, {}}, message);
  for (int r = 1; r < world.size(); ++r) world.send(message.data(), message.size(), r, kStepTag);
}

void LLMEngine::unload_lora_adapter(const std::string& name) {
  int32_t index = 0;
  for (const auto& [i, source] : lora_adapters()) {
    if (source.name == name) index = i;
  }
  if (index == 0) fail(ErrorCode::kNotFound, "no LoRA adapter named '{}' is loaded", name);
  int64_t users = 0;
  const auto count = [&](const Request& r) { users += r.params.lora_adapter == index && !r.finished() ? 1 : 0; };
  for (const auto& r : scheduler_->running()) count(*r);
  for (const auto& r : scheduler_->waiting()) count(*r);
  for (const Fetching& f : fetching_) count(*f.request);
  if (users > 0) {
    fail(ErrorCode::kInvalidArgument, "the LoRA adapter '{}' has {} unfinished request{}: unload it when they are done",
         name, users, users == 1 ? "" : "s");
  }
  model_->retire_lora_adapter(index);
  retired_loras_.emplace_back(index, steps_launched_);
  free_retired_loras();
  spdlog::info("LoRA adapter '{}' unloaded (slot {})", name, index);
}

void LLMEngine::free_retired_loras() {
  std::erase_if(retired_loras_, [&](const std::pair<int32_t, uint64_t>& r) {
    if (steps_finished_ < r.second) return false;
    model_->remove_lora_adapter(r.first);
    tell_ranks_lora_removed(r.first);
    return true;
  });
}

uint64_t LLMEngine::next_seed(const SamplingParams& p, int32_t index) {
  if (!p.seed) return seed_source_();
  // Each choice of a seeded request has its own stream, fixed by (seed, index).
  return *p.seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(index);
}

void LLMEngine::add_request(const std::string& id, std::vector<int32_t> prompt_ids, const SamplingParams& params,
                            int32_t priority) {
  params.validate(model_->config().num_vocab, config_.max_logprobs);
  if (prompt_ids.empty()) fail(ErrorCode::kInvalidArgument, "request '{}' has an empty prompt", id);
  for (int32_t t : prompt_ids) {
    if (t < 0 || t >= model_->config().num_vocab) {
      fail(ErrorCode::kInvalidArgument, "prompt token id {} is outside the vocabulary [0, {})", t,
           model_->config().num_vocab);
    }
  }
  const int64_t n_prompt = static_cast<int64_t>(prompt_ids.size());
  if (n_prompt > max_model_len_ || (n_prompt == max_model_len_ && !params.embedding)) {
    fail(ErrorCode::kInvalidArgument,
         "the prompt has {} tokens, but the maximum context length is {}: no room to generate", n_prompt,
         max_model_len_);
  }
  const int64_t blocks = (n_prompt + config_.block_size) / config_.block_size;
  if (blocks > kv_->num_usable_blocks()) {
    fail(ErrorCode::kInvalidArgument, "the prompt has {} tokens and needs {} KV blocks, the KV pool has {}", n_prompt,
         blocks, kv_->num_usable_blocks());
  }
  if (scheduler_->find(id) != nullptr ||
      std::any_of(fetching_.begin(), fetching_.end(), [&](const Fetching& f) { return f.request->id == id; })) {
    fail(ErrorCode::kInvalidArgument, "request id '{}' is already in use", id);
  }
  if (params.lora_adapter != 0 &&
      (model_->lora_adapter(params.lora_adapter) == nullptr || model_->lora_adapter_retired(params.lora_adapter))) {
    fail(ErrorCode::kInvalidArgument, "LoRA adapter {} is not loaded", params.lora_adapter);
  }
  if (params.embedding && model_->config().hidden_size > model_->config().num_vocab) {
    fail(ErrorCode::kInvalidArgument, "this model's hidden states ({} values) are wider than its vocabulary ({}): "
         "its embeddings are not served", model_->config().hidden_size, model_->config().num_vocab);
  }
  const SchedulerConfig& sc = scheduler_->config();
  if (params.candidates() > sc.max_num_seqs || params.candidates() > sc.max_num_batched_tokens) {
    fail(ErrorCode::kInvalidArgument, "{} is {}, more than the engine runs at once (max_num_seqs {}, "
         "max_num_batched_tokens {})", params.ranks_candidates() ? "best_of" : "n", params.candidates(),
         sc.max_num_seqs, sc.max_num_batched_tokens);
  }

  auto r = std::make_unique<Request>();
  r->id = id;
  r->arrival_order = next_arrival_++;
  r->priority = priority;
  r->params = params;
  r->params.resolve_logprobs(model_->config().num_vocab);
  r->prefix_salt = prefix_salt(params.lora_adapter == 0 ? 0 : model_->lora_adapter(params.lora_adapter)->fingerprint(),
                               params.cache_salt);
  r->prompt_ids = prompt_ids;
  r->times.arrival = Clock::now();
  auto seq = std::make_unique<Sequence>(next_seq_id_++, 0, std::move(prompt_ids), static_cast<int32_t>(n_prompt),
                                        next_seed(params, 0));
  if (!params.use_beam_search) {
    seq->detokenizer = std::make_unique<IncrementalDetokenizer>(*tokenizer_, !params.skip_special_tokens);
    if (!params.stop.empty()) {
      seq->stop_matcher = std::make_unique<StopStringMatcher>(params.stop, params.include_stop_str_in_output);
    }
  }
  if (params.grammar) {
    seq->matcher = structured_->matcher(params.grammar);
    seq->grammar_active = params.grammar_after.empty();
  }
  r->seqs.push_back(std::move(seq));
  // With the Redis tier, a prompt with full blocks the local cache lacks waits for them first.
  const uint64_t ticket = remote_ ? remote_->start_fetch(r->prompt_ids, *kv_, r->prefix_salt) : 0;
  if (ticket != 0) {
    const auto wait = std::chrono::duration<double, std::milli>(config_.kv_cache_redis.timeout_ms);
    fetching_.push_back(Fetching{std::move(r), ticket, Clock::now() + std::chrono::duration_cast<Clock::duration>(wait)});
  } else {
    scheduler_->add(std::move(r));
  }
  update_gauges();
}

void LLMEngine::admit_fetched() {
  if (!remote_) return;
  const std::vector<uint64_t> done = remote_->poll(*kv_, runner_->cache());
  if (fetching_.empty()) return;
  const auto now = Clock::now();
  // In arrival order, so that the scheduler's queue keeps it.
  for (auto it = fetching_.begin(); it != fetching_.end();) {
    const bool fetched = std::find(done.begin(), done.end(), it->ticket) != done.end();
    if (!fetched && now < it->deadline) {
      ++it;
      continue;
    }
    if (!fetched) remote_->abandon(it->ticket);  // it computes its prompt as without Redis
    scheduler_->add(std::move(it->request));
    it = fetching_.erase(it);
  }
}

std::optional<Clock::time_point> LLMEngine::batch_wait_deadline() const {
  if (!aborted_.empty() || !in_flight_.empty() || !scheduler_->running().empty()) return std::nullopt;
  std::optional<Clock::time_point> until = scheduler_->batch_window_end();
  // Paused admission (memory pressure) holds them too, until the pause ends (step() then admits).
  if (admission_paused_until_ && *admission_paused_until_ > Clock::now() &&
      (!until || *admission_paused_until_ < *until)) {
    until = admission_paused_until_;
  }
  return until;
  if (!fetching_.empty() && scheduler_->waiting().empty()) {
    // Only fetches from Redis are outstanding: step once one is done or its wait is over, else
    // look again in a millisecond.
    if (remote_->has_results()) return std::nullopt;
    const auto now = Clock::now();
    Clock::time_point next = now + std::chrono::milliseconds(1);
    for (const Fetching& f : fetching_) {
      if (f.deadline <= now) return std::nullopt;
      next = std::min(next, f.deadline);
    }
    return next;
  }
  return scheduler_->batch_window_end();
}

bool LLMEngine::abort_request(const std::string& id) {
  for (auto it = fetching_.begin(); it != fetching_.end(); ++it) {
    if (it->request->id != id) continue;
    remote_->abandon(it->ticket);
    std::unique_ptr<Request> r = std::move(it->request);
    fetching_.erase(it);
    for (auto& seq : r->seqs) seq->finish_reason = FinishReason::kAbort;
    r->times.finished = Clock::now();
    aborted_.push_back(std::move(r));
    return true;
  }
  if (const Request* in = scheduler_->find(id); in != nullptr && in->in_flight) {
    // Its blocks are in use by a step still computing: abort once that step is processed.
    if (std::find(abort_after_step_.begin(), abort_after_step_.end(), id) == abort_after_step_.end()) {
      abort_after_step_.push_back(id);
    }
    return true;
  }
  std::unique_ptr<Request> r = scheduler_->remove(id);
  if (!r) return false;
  for (auto& seq : r->seqs) {
    if (!seq->finished()) seq->finish_reason = FinishReason::kAbort;
  }
  r->times.finished = Clock::now();
  aborted_.push_back(std::move(r));
  return true;
}

std::vector<RequestOutput> LLMEngine::step() {
  std::vector<RequestOutput> outputs;
  for (auto& r : aborted_) {
    outputs.push_back(collect(*r));
    record_finished(*r);
  }
  aborted_.clear();
  check_devices();
  check_memory_pressure();
  if (admission_paused_until_ && Clock::now() >= *admission_paused_until_) {
    admission_paused_until_.reset();
    scheduler_->pause_admission(false);
    spdlog::info("memory: admitting new requests again");
  }
  admit_fetched();

  const auto start = Clock::now();
  launch_steps(outputs);
  if (!in_flight_.empty()) {
    finish_step(outputs);
    metrics_.update([&](EngineMetrics& m) { m.busy_seconds_total += seconds(Clock::now() - start); });
  }
  update_gauges();
  return outputs;
}

void LLMEngine::launch_steps(std::vector<RequestOutput>& outputs) {
  const int depth = runner_->depth();
  while (static_cast<int>(in_flight_.size()) < depth) {
    int32_t max_seqs = std::numeric_limits<int32_t>::max();
    if (depth > 1) {
      // An equal share of the sequences for each step in flight, so that every device has work.
      const int64_t total = scheduler_->num_running_seqs() + static_cast<int64_t>(scheduler_->waiting().size());
      max_seqs = static_cast<int32_t>(std::max<int64_t>(1, (total + depth - 1) / depth));
    }
    propose_drafts();
    SchedulerOutput out = scheduler_->schedule(max_seqs);
    // The sequences of each LoRA adapter side by side (a request's stay together and in order):
    // each adapter's rows are then one run of the batch, two small matmuls per projection.
    const auto adapter_of = [](const ScheduledSequence& item) { return item.request->params.lora_adapter; };
    if (std::any_of(out.scheduled.begin(), out.scheduled.end(), adapter_of)) {
      std::stable_sort(out.scheduled.begin(), out.scheduled.end(),
                       [&](const ScheduledSequence& a, const ScheduledSequence& b) { return adapter_of(a) < adapter_of(b); });
    }
    if (out.num_preempted > 0) metrics_.update([&](EngineMetrics& m) { m.preemptions_total += out.num_preempted; });
    if (out.empty()) {
      // Nothing runs and yet requests wait: the first one cannot fit in the KV pool even alone.
      if (!out.held_new && in_flight_.empty() && scheduler_->running().empty() && !scheduler_->waiting().empty()) {
        Request* head = scheduler_->waiting().front().get();
        std::unique_ptr<Request> r = scheduler_->remove(head->id);
        r->error = fmt::format("request '{}' needs more KV blocks than the pool's {} (prompt {} tokens, block size {})",
                               r->id, kv_->num_usable_blocks(), r->prompt_ids.size(), config_.block_size);
        r->error_code = ErrorCode::kResourceExhausted;
        for (auto& seq : r->seqs) {
          if (!seq->finished()) seq->finish_reason = FinishReason::kError;
        }
        r->times.finished = Clock::now();
        outputs.push_back(collect(*r));
        record_finished(*r);
      }
      return;
    }
    const auto now = Clock::now();
    for (const ScheduledSequence& item : out.scheduled) {
      item.request->in_flight = true;
      if (!item.request->times.first_scheduled) item.request->times.first_scheduled = now;
    }
    const std::string out_of_memory = out_of_memory_in([&] { runner_->launch(out, *kv_); });
    if (!out_of_memory.empty()) {
      for (const ScheduledSequence& item : out.scheduled) item.request->in_flight = false;
      on_out_of_memory(out, out_of_memory, outputs);
      return;
    }
    in_flight_.push_back(std::move(out));
    ++steps_launched_;
  }
}

void LLMEngine::finish_step(std::vector<RequestOutput>& outputs) {
  const SchedulerOutput out = std::move(in_flight_.front());
  in_flight_.pop_front();
  ++steps_finished_;
  if (!retired_loras_.empty()) free_retired_loras();
  const float* logits = nullptr;
  std::string out_of_memory;
  try {
    out_of_memory = out_of_memory_in([&] { logits = runner_->finish(); });
  } catch (const DeviceFailure& e) {
    for (const ScheduledSequence& item : out.scheduled) item.request->in_flight = false;
    fail_over(e.device(), e.what());  // this step's requests are recomputed with the others
    return;
  }
  for (const ScheduledSequence& item : out.scheduled) item.request->in_flight = false;
  if (!out_of_memory.empty()) {
    on_out_of_memory(out, out_of_memory, outputs);
    finish_aborts();
    return;
  }
  const auto done = Clock::now();
  scheduler_->on_step_done(out);

  // Sampled rows grouped by request, in the order the requests were scheduled.
  const size_t vocab = static_cast<size_t>(model_->config().num_vocab);
  std::vector<std::pair<Request*, std::vector<SampleRow>>> groups;
  size_t row = 0;
  for (const ScheduledSequence& item : out.scheduled) {
    if (groups.empty() || groups.back().first != item.request) groups.push_back({item.request, {}});
    if (item.prompt_logits) {
      // A row per token of the chunk (computed from where on_step_done left the sequence).
      const int32_t n = item.num_new_tokens;
      record_prompt_logprobs(*item.request, logits + row * vocab, item.seq->num_computed_tokens - n, n);
      if (item.sample) groups.back().second.push_back(SampleRow{item.seq, logits + (row + static_cast<size_t>(n) - 1) * vocab, 0});
      row += static_cast<size_t>(n);
    } else if (item.sample) {
      groups.back().second.push_back(SampleRow{item.seq, logits + row * vocab, item.num_draft_tokens});
      row += 1 + static_cast<size_t>(item.num_draft_tokens);
    }
  }
  for (auto& [r, rows] : groups) {
    // What goes wrong while one request's output is made (sampling, detokenizing, stop strings,
    // fan-out) is that request's failure alone: it ends with the error, the others go on.
    try {
      if (!rows.empty()) process_request(*r, rows, done);
      RequestOutput o = collect(*r);
      if (!o.outputs.empty() || o.finished || o.has_prompt_logprobs) outputs.push_back(std::move(o));
    } catch (const std::exception& e) {
      outputs.push_back(fail_request(*r, e.what(), ErrorCode::kInternal));
    }
  }
  if (mtp_) draft_with_mtp(out);
  for (auto& [r, rows] : groups) {
    if (r->finished()) {
      r->times.finished = done;
      std::unique_ptr<Request> removed = scheduler_->remove(r->id);
      record_finished(*removed);
    }
  }
  finish_aborts();
  if (remote_) remote_->export_blocks(*kv_, runner_->cache());
  const std::vector<double>& stage = runner_->executor().last_seconds();
  // Over several ranks: this rank's stage time, and what the others reported of theirs so far.
  std::vector<std::pair<int, double>> rank_seconds;
  if (parallel()) {
    const ParallelGroup& g = *config_.parallel;
    rank_seconds.emplace_back(0, stage[static_cast<size_t>(g.stage())]);
    std::vector<uint8_t> msg;
    for (int r = 1; r < g.world().size(); ++r) {
      while (g.world().recv_message(msg, r, kStatsTag, Communicator::Duration::zero())) {
        double s = 0.0;
        if (msg.size() == sizeof(s)) std::memcpy(&s, msg.data(), sizeof(s));
        rank_seconds.emplace_back(r, s);
      }
    }
  }
  const Placement& p = model_->placement();
  metrics_.update([&](EngineMetrics& m) {
    for (size_t d = 0; d < stage.size() && d < p.devices.size(); ++d) {
      for (DeviceMetrics& dm : m.devices) {
        if (dm.name == p.devices[d]->name()) dm.step_seconds.observe(stage[d]);
      }
    }
    m.iteration_tokens.observe(static_cast<double>(out.num_batched_tokens));
    for (const auto& [r, s] : rank_seconds) m.rank_step_seconds[static_cast<size_t>(r)].observe(s);
  });
}

void LLMEngine::make_runner() { runner_ = new_runner(*model_, config_.kv_cache_dtype); }

std::unique_ptr<ModelRunner> LLMEngine::new_runner(Model& model, KvDtype kv_dtype) const {
  auto runner = std::make_unique<ModelRunner>(model, kv_->config().num_blocks, config_.block_size, kv_dtype);
  // Over several ranks the communicators' deadlines (--rank-timeout) watch the other ranks.
  if (config_.health_check_timeout > 0.0 && !parallel()) {
    runner->set_hang_timeout(std::chrono::milliseconds(static_cast<int64_t>(config_.health_check_timeout * 1000)));
  }
  return runner;
}

void LLMEngine::check_devices() {
  // Retired models go once their devices are done with them.
  std::erase_if(retired_, [](const Retired& r) { return r.runner->idle(); });
  const Placement& p = model_->placement();
  if (p.devices.size() < 2 || config_.health_check_interval <= 0.0) return;  // one device runs inline
  if (parallel()) return;  // other ranks' stages are watched by check_ranks and the deadlines
  const auto now = Clock::now();
  for (const auto& device : p.devices) {
    const Device::ProbeState probe = device->probe_state();
    std::string problem;
    if (device->failed()) {
      problem = device->failure();
    } else if (probe.outstanding && config_.health_check_timeout > 0.0 &&
               seconds(now - probe.started) > config_.health_check_timeout &&
               seconds(now - device->last_progress()) > config_.health_check_timeout) {
      problem = fmt::format("its health probe got no answer in {:.1f} s", seconds(now - probe.started));
    } else if (!probe.outstanding && probe.last_failed) {
      problem = "its health probe failed: " + probe.last_error;
    }
    if (!problem.empty()) {
      fail_over(device->name(), problem);
      return;  // the placement changed; the others are probed next time
    }
  }
  if (seconds(now - last_health_check_) < config_.health_check_interval) return;
  last_health_check_ = now;
  for (const auto& device : p.devices) device->start_probe();
}

std::shared_ptr<Device> LLMEngine::choose_spare(const Placement& p, int failed) {
  for (const std::string& name : config_.spare_devices) {
    if (name == p.devices[static_cast<size_t>(failed)]->name()) continue;
    try {
      std::shared_ptr<Device> d = devices_.get(name);
      if (!d->failed()) return d;
    } catch (const Error& e) {
      spdlog::warn("spare device {} cannot be used: {}", name, e.what());
    }
  }
  for (size_t d = 0; d < p.devices.size(); ++d) {
    if (static_cast<int>(d) != failed && !p.devices[d]->failed()) return p.devices[d];
  }
  fail(ErrorCode::kUnavailable, "device {} failed and no healthy device is left to take its parts (--spare-devices)",
       p.devices[static_cast<size_t>(failed)]->name());
}

void LLMEngine::fail_over(const std::string& device, const std::string& reason) {
  const auto start = Clock::now();
  const Placement& old = model_->placement();
  int failed = -1;
  for (size_t d = 0; d < old.devices.size(); ++d) {
    if (old.devices[d]->name() == device) failed = static_cast<int>(d);
  }
  if (failed < 0) fail(ErrorCode::kInternal, "device {} failed ({}) but the model does not run on it", device, reason);
  old.devices[static_cast<size_t>(failed)]->mark_failed(reason);
  spdlog::error("device {} failed: {}; moving its parts to a spare", device, reason);
  std::shared_ptr<Device> spare = choose_spare(old, failed);
  Placement placement = replace_device(*file_, old, failed, spare);
  if (weights_degraded_) spare->backend().set_requantize_weights(true);  // the spare's weights as Q8_0 too
  // Load the parts again (weights from the mapped file) before anything is given up.
  std::unique_ptr<Model> model = load_model(file_, std::move(placement));

  // Every request that ran is recomputed: its KV lived partly on the failed device.
  for (const SchedulerOutput& out : in_flight_) {
    for (const ScheduledSequence& item : out.scheduled) item.request->in_flight = false;
  }
  in_flight_.clear();
  steps_finished_ = steps_launched_;  // the cleared steps read nothing any more
  const int32_t recomputed = scheduler_->preempt_all();
  kv_->reset_prefix_cache();
  {
    const std::lock_guard<std::mutex> lock(model_mutex_);
    retired_.push_back(Retired{std::move(model_), std::move(runner_)});
    model_ = std::move(model);
    make_runner();
  }
  finish_aborts();
  const double took = seconds(Clock::now() - start);
  metrics_.update([&](EngineMetrics& m) {
    ++m.device_failovers_total;
    m.preemptions_total += recomputed;
    for (DeviceMetrics& dm : m.devices) {
      if (dm.name == device) {
        dm.failed = true;
        dm.failure = reason;
      }
    }
    for (const auto& d : model_->placement().devices) {
      const bool known = std::any_of(m.devices.begin(), m.devices.end(), [&](const auto& x) { return x.name == d->name(); });
      if (!known) m.devices.emplace_back(d->name());
    }
  });
  spdlog::warn("device {} failed over to {} in {:.3f} s ({} requests recomputed); devices now\n{}", device,
               spare->name(), took, recomputed, model_->placement().describe());
}

void LLMEngine::finish_aborts() {
  // Aborts that waited for their step: done now (their final output comes with the next step).
  std::vector<std::string> pending;
  for (const std::string& id : abort_after_step_) {
    const Request* r = scheduler_->find(id);
    if (r == nullptr) continue;  // finished or failed in the meantime
    if (r->in_flight) {
      pending.push_back(id);
    } else {
      abort_request(id);
    }
  }
  abort_after_step_ = std::move(pending);
}

void LLMEngine::fail_step(const SchedulerOutput& out, const std::string& what, std::vector<RequestOutput>& outputs) {
  // Nothing of the step is kept: its requests fail and their blocks are freed; the others go on.
  spdlog::error("a step of {} tokens failed, its requests fail: {}", out.num_batched_tokens, what);
  Request* last = nullptr;
  for (const ScheduledSequence& item : out.scheduled) {
    if (item.request == last) continue;
    last = item.request;
    outputs.push_back(fail_request(*item.request, what, ErrorCode::kUnavailable));
    item.request->times.finished = Clock::now();
    std::unique_ptr<Request> removed = scheduler_->remove(item.request->id);
    record_finished(*removed);
  }
}

void LLMEngine::process_request(Request& r, std::vector<SampleRow>& rows, Clock::time_point now) {
  const bool first = !r.times.first_token;
  if (first) r.times.first_token = now;
  if (r.params.embedding) {
    // The prompt is computed: its last token's hidden state (in its logits row) is the output.
    const float* hidden = rows.front().logits;
    r.embedding.assign(hidden, hidden + model_->config().hidden_size);
    finish_sequence(r, *rows.front().seq, FinishReason::kStop);
    return;
  }
  int64_t new_tokens = 0;
  if (r.params.use_beam_search) {
    beam_step(r, rows);
    new_tokens = static_cast<int64_t>(rows.size());
  } else {
    if (r.width() > 1 && !r.fanned_out) {
      fan_out(r);
      // Every choice samples its first token from the prompt's logits.
      const float* logits = rows.front().logits;
      rows.clear();
      for (auto& seq : r.seqs) rows.push_back(SampleRow{seq.get(), logits});
    }
    for (SampleRow& s : rows) {
      const int32_t before = s.seq->num_output_tokens();
      if (s.num_drafts > 0) {
        verify_drafts(r, *s.seq, s.logits, s.num_drafts);
      } else {
        sample_and_append(r, *s.seq, s.logits);
      }
      new_tokens += s.seq->num_output_tokens() - before;
    }
  }
  metrics_.update([&](EngineMetrics& m) {
    m.generation_tokens_total += new_tokens;
    if (first) {
      m.time_to_first_token.observe(seconds(now - r.times.arrival));
    } else if (r.times.last_token) {
      m.inter_token_latency.observe(seconds(now - *r.times.last_token));
    }
  });
  r.times.last_token = now;
}

int32_t LLMEngine::draft_room(const Request& r, const Sequence& seq) const {
  // Only a sequence that decodes: its last token is all it has left to compute.
  if (seq.finished() || seq.num_computed_tokens + 1 != static_cast<int32_t>(seq.tokens.size()) ||
      seq.num_output_tokens() == 0) {
    return 0;
  }
  // Room for the drafts and the token after them, within max_tokens and the context.
  return std::max(0, std::min({config_.speculative.num_speculative_tokens,
                               r.params.max_tokens - seq.num_output_tokens() - 1,
                               max_model_len_ - static_cast<int32_t>(seq.tokens.size()) - 1}));
}

void LLMEngine::propose_drafts() {
  const SpeculativeConfig& sc = config_.speculative;
  if (sc.method == SpeculativeMethod::kNone) return;
  for (const auto& r : scheduler_->running()) {
    if (r->in_flight || r->params.use_beam_search) continue;
    for (Sequence* seq : r->live_seqs()) {
      const int32_t room = draft_room(*r, *seq);
      if (sc.method == SpeculativeMethod::kMtp) {
        // The MTP drafter's, made after the step that computed this sequence's last tokens, if
        // they still fit (draft_with_mtp).
        if (static_cast<int32_t>(seq->draft.size()) > room) seq->draft.resize(static_cast<size_t>(room));
        continue;
      }
      seq->draft.clear();
      if (room > 0) seq->draft = propose_ngram(seq->tokens, room, sc.prompt_lookup_min, sc.prompt_lookup_max);
    }
  }
}

void LLMEngine::draft_with_mtp(const SchedulerOutput& out) {
  const float* hidden = runner_->finished_hidden();
  if (hidden == nullptr) return;
  std::vector<MtpDrafter::Item> items;
  int32_t row = 0;
  const BatchInput& batch = runner_->finished_batch();
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    const ScheduledSequence& item = out.scheduled[i];
    const int32_t first = row;
    row += item.num_new_tokens;
    const Request& r = *item.request;
    // Requests of one sequence (forked ones share blocks whose MTP rows would differ per fork).
    if (r.finished() || item.seq->finished() || r.width() != 1 || r.params.use_beam_search) continue;
    items.push_back(MtpDrafter::Item{item.seq, first, item.num_new_tokens, draft_room(r, *item.seq)});
  }
  if (row != batch.num_tokens()) {
    fail(ErrorCode::kInternal, "MTP drafting: the step's {} scheduled tokens are not its batch's {}", row,
         batch.num_tokens());
  }
  if (items.empty()) return;
  try {
    mtp_->run(items, batch, hidden, *model_, runner_->cache(), *kv_);
  } catch (const std::exception& e) {
    // Drafts are optional: these sequences decode without them (and their MTP rows may be stale,
    // which only makes later drafts worse).
    spdlog::warn("MTP drafting failed, the step's sequences go on without drafts: {}", e.what());
    for (const MtpDrafter::Item& it : items) it.seq->draft.clear();
  }
}

void LLMEngine::record_prompt_logprobs(Request& r, const float* rows, int32_t first_position, int32_t num_rows) {
  // Row j follows the token at first_position + j: it gives the next prompt token's logprob.
  const size_t vocab = static_cast<size_t>(model_->config().num_vocab);
  const int32_t prompt_len = static_cast<int32_t>(r.prompt_ids.size());
  const int32_t k = r.params.prompt_logprobs.value_or(0);
  for (int32_t j = 0; j < num_rows; ++j) {
    const int32_t target = first_position + j + 1;
    if (target >= prompt_len || target != r.num_prompt_logprobs + 1) continue;  // past the prompt, or recorded
    const std::span<const float> x(rows + static_cast<size_t>(j) * vocab, vocab);
    const int32_t token = r.prompt_ids[static_cast<size_t>(target)];  // in the vocabulary (add_request checks)
    const float v = x[static_cast<size_t>(token)];
    PromptLogprob p;
    p.token_id = token;
    p.logprob = static_cast<float>(static_cast<double>(v) - Sampler::log_normalizer(x));
    p.rank = 1 + static_cast<int32_t>(std::count_if(x.begin(), x.end(), [v](float y) { return y > v; }));
    if (k > 0) p.top = Sampler::top_logprobs(x, k);
    r.prompt_logprobs.push_back(std::move(p));
    ++r.num_prompt_logprobs;
  }
}

void LLMEngine::verify_drafts(Request& r, Sequence& seq, const float* logits, int32_t num_drafts) {
  // Row i holds the logits after the i-th draft: the token sampled there is the one decoding
  // without drafts would sample, as long as every draft before it was kept.
  const size_t vocab = static_cast<size_t>(model_->config().num_vocab);
  const std::vector<int32_t> draft(seq.draft.begin(), seq.draft.begin() + num_drafts);
  seq.draft.clear();
  int32_t accepted = 0;
  for (int32_t i = 0; i <= num_drafts; ++i) {
    sample_and_append(r, seq, logits + static_cast<size_t>(i) * vocab);
    if (seq.finished() || i == num_drafts || seq.tokens.back() != draft[static_cast<size_t>(i)]) break;
    ++accepted;
  }
  if (!seq.finished()) scheduler_->accept_drafts(seq, accepted);
  metrics_.update([&](EngineMetrics& m) {
    ++m.spec_decode_num_drafts_total;
    m.spec_decode_num_draft_tokens_total += num_drafts;
    m.spec_decode_num_accepted_tokens_total += accepted;
    if (m.spec_decode_num_accepted_tokens_per_pos.size() < static_cast<size_t>(num_drafts)) {
      m.spec_decode_num_accepted_tokens_per_pos.resize(static_cast<size_t>(num_drafts), 0);
    }
    for (int32_t i = 0; i < accepted; ++i) ++m.spec_decode_num_accepted_tokens_per_pos[static_cast<size_t>(i)];
  });
}

void LLMEngine::fan_out(Request& r) {
  Sequence& parent = *r.seqs.front();
  for (int32_t i = 1; i < r.width(); ++i) {
    auto child = std::make_unique<Sequence>(parent, next_seq_id_++, i, next_seed(r.params, i));
    child->detokenizer = std::make_unique<IncrementalDetokenizer>(*tokenizer_, !r.params.skip_special_tokens);
    if (!r.params.stop.empty()) {
      child->stop_matcher = std::make_unique<StopStringMatcher>(r.params.stop, r.params.include_stop_str_in_output);
    }
    kv_->fork(parent.id, child->id);
    r.seqs.push_back(std::move(child));
  }
  r.fanned_out = true;
}

void LLMEngine::sample_and_append(Request& r, Sequence& seq, const float* logits) {
  const SamplingParams& p = r.params;
  SequenceContext ctx{std::span<const int32_t>(seq.tokens).first(static_cast<size_t>(seq.num_prompt_tokens)),
                      seq.output_ids(), eos_ids_};
  if (seq.matcher && seq.grammar_active) {
    // So that the output still ends as a complete match, the last tokens of the budget may only
    // go where the rest of it can finish the grammar.
    const int32_t left = std::min(p.max_tokens - seq.num_output_tokens(),
                                  max_model_len_ - static_cast<int32_t>(seq.tokens.size())) - 1;
    bool restricted = false;
    ctx.allowed_tokens = seq.matcher->mask_within(left, grammar_scratch_, restricted);
    seq.grammar_steered = seq.grammar_steered || restricted;
  }
  SampledToken st = sampler_.sample(std::span<const float>(logits, model_->config().num_vocab), p, ctx, seq.rng);
  const int32_t t = st.token_id;
  seq.tokens.push_back(t);
  // The chosen token's logprob is computed only when asked for (vLLM reports none otherwise) or
  // when best_of ranks the candidates by it.
  if (p.logprobs || p.ranks_candidates()) seq.cumulative_logprob += st.logprob;
  if (p.logprobs) seq.logprobs.push_back(std::move(st));

  const bool is_eos = !p.ignore_eos && contains(eos_ids_, t);
  const bool is_stop_id = contains(p.stop_token_ids, t);
  if (is_eos || is_stop_id) {
    finish_sequence(r, seq, seq.grammar_steered ? FinishReason::kLength : FinishReason::kStop,
                    is_stop_id ? std::to_string(t) : std::string());
    return;
  }
  const std::string piece = seq.detokenizer->push(t);
  if (seq.stop_matcher) {
    StopStringMatcher::Result res = seq.stop_matcher->push(piece);
    seq.text += res.text;
    if (res.stopped) {
      finish_sequence(r, seq, FinishReason::kStop, res.matched);
      return;
    }
  } else {
    seq.text += piece;
  }
  if (seq.matcher && !advance_grammar(r, seq, t)) return;
  if (seq.num_output_tokens() >= p.max_tokens || static_cast<int32_t>(seq.tokens.size()) >= max_model_len_) {
    finish_sequence(r, seq, FinishReason::kLength);
  }
}

bool LLMEngine::advance_grammar(Request& r, Sequence& seq, int32_t token) {
  grammar::GrammarMatcher& m = *seq.matcher;
  if (!seq.grammar_active) {
    // Waiting for the marker (the end of the reasoning): the grammar takes what follows it.
    seq.grammar_pending += structured_->vocabulary().bytes(token);
    const size_t at = seq.grammar_pending.find(r.params.grammar_after);
    if (at == std::string::npos) return true;
    seq.grammar_active = true;
    const std::string rest = seq.grammar_pending.substr(at + r.params.grammar_after.size());
    seq.grammar_pending.clear();
    if (!rest.empty() && !m.accept_bytes(rest)) {
      spdlog::warn("request '{}': the text after '{}' in the same token does not start the grammar", r.id,
                   r.params.grammar_after);
    }
  } else if (!m.accept_token(token)) {
    r.error = fmt::format("token {} was sampled although the grammar does not allow it", token);
    finish_sequence(r, seq, FinishReason::kError);
    return false;
  }
  if (seq.grammar_active && m.finished()) {
    finish_sequence(r, seq, seq.grammar_steered ? FinishReason::kLength : FinishReason::kStop);
    return false;
  }
  return true;
}

void LLMEngine::finish_sequence(Request& r, Sequence& seq, FinishReason reason, std::string stop_reason) {
  // Whatever the detokenizer and the stop matcher held back belongs to the output, unless a
  // stop string ended it.
  const bool stopped_by_string = seq.stop_matcher && seq.stop_matcher->stopped();
  if (seq.detokenizer && !stopped_by_string) {
    std::string tail = seq.detokenizer->flush();
    if (seq.stop_matcher) {
      StopStringMatcher::Result res = seq.stop_matcher->push(tail);
      seq.text += res.text;
      if (res.stopped) {
        reason = FinishReason::kStop;
        stop_reason = res.matched;
      } else {
        seq.text += seq.stop_matcher->flush();
      }
    } else {
      seq.text += tail;
    }
  }
  seq.finish_reason = reason;
  seq.stop_reason = std::move(stop_reason);
  scheduler_->free_sequence(seq);
  (void)r;
}

void LLMEngine::beam_step(Request& r, const std::vector<SampleRow>& rows) {
  const SamplingParams& p = r.params;
  const int32_t width = p.n;
  const size_t vocab = static_cast<size_t>(model_->config().num_vocab);
  auto score = [&](double cum, int64_t len) { return cum / std::pow(static_cast<double>(std::max<int64_t>(1, len)), p.length_penalty); };

  struct Candidate {
    Sequence* parent;
    int32_t token;
    float logprob;
    double cumulative;
    std::vector<TokenLogprob> top;
  };
  std::vector<Candidate> candidates;
  for (const SampleRow& row : rows) {
    const std::vector<TokenLogprob> top = Sampler::top_logprobs(std::span<const float>(row.logits, vocab), 2 * width);
    std::vector<TokenLogprob> shown;
    if (p.logprobs) shown.assign(top.begin(), top.begin() + std::min<size_t>(top.size(), *p.logprobs));
    for (const TokenLogprob& c : top) {
      candidates.push_back(Candidate{row.seq, c.token_id, c.logprob, row.seq->cumulative_logprob + c.logprob, shown});
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.cumulative > b.cumulative; });

  const int32_t out_len = rows.front().seq->num_output_tokens() + 1;  // every beam has the same length
  std::vector<const Candidate*> next;
  for (size_t rank = 0; rank < candidates.size() && static_cast<int32_t>(next.size()) < width; ++rank) {
    const Candidate& c = candidates[rank];
    const bool ends = (!p.ignore_eos && contains(eos_ids_, c.token)) || contains(p.stop_token_ids, c.token);
    if (ends) {
      if (out_len < p.min_tokens) continue;
      if (static_cast<int32_t>(rank) < width) {
        BeamHypothesis h;
        h.output_ids.assign(c.parent->output_ids().begin(), c.parent->output_ids().end());
        h.output_ids.push_back(c.token);
        h.logprobs = c.parent->logprobs;
        if (p.logprobs) h.logprobs.push_back(SampledToken{c.token, c.logprob, c.top});
        h.cumulative_logprob = c.cumulative;
        h.score = score(c.cumulative, out_len);
        h.finish_reason = FinishReason::kStop;
        h.stop_reason = contains(p.stop_token_ids, c.token) ? std::to_string(c.token) : std::string();
        r.beam_hypotheses.push_back(std::move(h));
      }
      continue;
    }
    next.push_back(&c);
  }
  std::stable_sort(r.beam_hypotheses.begin(), r.beam_hypotheses.end(),
                   [](const BeamHypothesis& a, const BeamHypothesis& b) { return a.score > b.score; });

  const int64_t total_len = static_cast<int64_t>(rows.front().seq->tokens.size()) + 1;
  bool done = next.empty() || out_len >= p.max_tokens || total_len >= max_model_len_;
  if (!done && static_cast<int32_t>(r.beam_hypotheses.size()) >= width) {
    // No live beam can overtake the worst of the best `width` finished ones any more.
    const double worst_kept = r.beam_hypotheses[static_cast<size_t>(width) - 1].score;
    double best_live = -INFINITY;
    for (const Candidate* c : next) best_live = std::max(best_live, score(c->cumulative, out_len));
    done = best_live <= worst_kept;
  }
  if (done && (out_len >= p.max_tokens || total_len >= max_model_len_)) {
    for (const Candidate* c : next) {
      BeamHypothesis h;
      h.output_ids.assign(c->parent->output_ids().begin(), c->parent->output_ids().end());
      h.output_ids.push_back(c->token);
      h.logprobs = c->parent->logprobs;
      if (p.logprobs) h.logprobs.push_back(SampledToken{c->token, c->logprob, c->top});
      h.cumulative_logprob = c->cumulative;
      h.score = score(c->cumulative, out_len);
      h.finish_reason = FinishReason::kLength;
      r.beam_hypotheses.push_back(std::move(h));
    }
    std::stable_sort(r.beam_hypotheses.begin(), r.beam_hypotheses.end(),
                     [](const BeamHypothesis& a, const BeamHypothesis& b) { return a.score > b.score; });
  }
  if (done) {
    for (auto& seq : r.seqs) {
      if (!seq->finished()) finish_sequence(r, *seq, FinishReason::kStop);
    }
    r.fanned_out = true;
    return;
  }

  // The next beams: a parent chosen once continues itself; chosen again, it is forked first.
  std::vector<std::unique_ptr<Sequence>> next_seqs;
  std::vector<Sequence*> used;
  std::vector<std::pair<Sequence*, const Candidate*>> extend;
  for (const Candidate* c : next) {
    Sequence* parent = c->parent;
    if (std::find(used.begin(), used.end(), parent) == used.end()) {
      used.push_back(parent);
      extend.push_back({parent, c});
    } else {
      auto child = std::make_unique<Sequence>(*parent, next_seq_id_++, 0, 0);
      kv_->fork(parent->id, child->id);
      extend.push_back({child.get(), c});
      next_seqs.push_back(std::move(child));
    }
  }
  for (auto& [seq, c] : extend) {
    seq->tokens.push_back(c->token);
    seq->cumulative_logprob = c->cumulative;
    if (p.logprobs) seq->logprobs.push_back(SampledToken{c->token, c->logprob, c->top});
  }
  for (auto& seq : r.seqs) {
    if (!seq->finished() && std::find(used.begin(), used.end(), seq.get()) == used.end()) {
      finish_sequence(r, *seq, FinishReason::kStop);
    }
  }
  // Keep only the live beams (dropped ones hold nothing any more) plus the new forks.
  std::vector<std::unique_ptr<Sequence>> kept;
  for (auto& seq : r.seqs) {
    if (!seq->finished()) kept.push_back(std::move(seq));
  }
  for (auto& seq : next_seqs) kept.push_back(std::move(seq));
  for (size_t i = 0; i < kept.size(); ++i) kept[i]->index = static_cast<int32_t>(i);
  r.seqs = std::move(kept);
  r.fanned_out = true;
}

RequestOutput LLMEngine::fail_request(Request& r, const std::string& what, ErrorCode code) {
  spdlog::warn("request '{}' failed: {}", r.id, what);
  r.error = fmt::format("request '{}' failed: {}", r.id, what);
  r.error_code = code;
  RequestOutput o;
  o.request_id = r.id;
  o.num_prompt_tokens = static_cast<int32_t>(r.prompt_ids.size());
  o.num_cached_tokens = r.num_cached_tokens;
  o.finished = true;
  o.error = r.error;
  o.error_code = r.error_code;
  for (auto& seq : r.seqs) {
    if (seq->finished() && seq->finish_reported) continue;
    if (!seq->finished()) {
      seq->finish_reason = FinishReason::kError;
      scheduler_->free_sequence(*seq);
    }
    seq->finish_reported = true;
    CompletionDelta d;
    d.index = seq->index;
    d.finish_reason = seq->finish_reason;
    o.outputs.push_back(std::move(d));
  }
  if (r.params.ranks_candidates()) {
    // best_of: the candidates' ends as n choices (none of their text was reported).
    std::erase_if(o.outputs, [&](const CompletionDelta& d) { return d.index >= r.params.n; });
  }
  if (r.params.use_beam_search) {
    // Whatever the hypotheses were, none is reported: the request failed.
    r.beam_hypotheses.clear();
    o.outputs.resize(1);
    o.outputs[0] = CompletionDelta{};
    o.outputs[0].finish_reason = FinishReason::kError;
  }
  return o;
}

RequestOutput LLMEngine::collect(Request& r) {
  RequestOutput o;
  o.request_id = r.id;
  o.num_prompt_tokens = static_cast<int32_t>(r.prompt_ids.size());
  o.num_cached_tokens = r.num_cached_tokens;
  o.error = r.error;
  o.error_code = r.error_code;
  o.finished = r.finished();
  if (o.finished) {
    if (r.times.first_scheduled) o.queue_seconds = seconds(*r.times.first_scheduled - r.times.arrival);
    if (r.times.first_token) o.ttft_seconds = seconds(*r.times.first_token - r.times.arrival);
  }
  if (r.params.prompt_logprobs && !r.prompt_logprobs_sent &&
      r.num_prompt_logprobs + 1 >= static_cast<int32_t>(r.prompt_ids.size())) {
    o.prompt_logprobs = std::move(r.prompt_logprobs);
    o.has_prompt_logprobs = true;
    r.prompt_logprobs_sent = true;
  }
  if (r.params.use_beam_search) {
    if (!o.finished) return o;
    const bool aborted = !r.seqs.empty() && r.seqs.front()->finish_reason == FinishReason::kAbort;
    for (int32_t i = 0; i < r.params.n && i < static_cast<int32_t>(r.beam_hypotheses.size()); ++i) {
      const BeamHypothesis& h = r.beam_hypotheses[static_cast<size_t>(i)];
      CompletionDelta d;
      d.index = i;
      d.token_ids = h.output_ids;
      std::vector<int32_t> visible;
      for (int32_t t : h.output_ids) {
        if (!contains(eos_ids_, t) && !contains(r.params.stop_token_ids, t)) visible.push_back(t);
      }
      d.text = tokenizer_->decode(visible, !r.params.skip_special_tokens);
      d.logprobs = h.logprobs;
      d.cumulative_logprob = h.cumulative_logprob;
      d.finish_reason = h.finish_reason;
      d.stop_reason = h.stop_reason;
      o.outputs.push_back(std::move(d));
    }
    if (o.outputs.empty() && (aborted || !r.error.empty())) {
      CompletionDelta d;
      d.finish_reason = aborted ? FinishReason::kAbort : FinishReason::kError;
      o.outputs.push_back(std::move(d));
    }
    return o;
  }
  if (o.finished && !r.embedding.empty()) o.embedding = std::move(r.embedding);
  if (r.params.ranks_candidates()) {
    // best_of: nothing until every candidate has finished, then the n with the highest log
    // probability per token (OpenAI's rule; the earlier candidate on a tie), whole.
    if (!o.finished) return o;
    std::vector<Sequence*> ranked;
    for (auto& seq : r.seqs) ranked.push_back(seq.get());
    const auto per_token = [](const Sequence* s) {
      const int32_t n = s->num_output_tokens();
      return n > 0 ? s->cumulative_logprob / n : -std::numeric_limits<double>::infinity();
    };
    std::stable_sort(ranked.begin(), ranked.end(), [&](const Sequence* a, const Sequence* b) {
      return per_token(a) > per_token(b);
    });
    for (int32_t i = 0; i < r.params.n && i < static_cast<int32_t>(ranked.size()); ++i) {
      Sequence& seq = *ranked[static_cast<size_t>(i)];
      CompletionDelta d;
      d.index = i;
      d.text = seq.text;
      const std::span<const int32_t> ids = seq.output_ids();
      d.token_ids.assign(ids.begin(), ids.end());
      if (r.params.logprobs) d.logprobs = seq.logprobs;
      d.cumulative_logprob = seq.cumulative_logprob;
      d.finish_reason = seq.finish_reason;
      d.stop_reason = seq.stop_reason;
      o.outputs.push_back(std::move(d));
    }
    for (auto& seq : r.seqs) {
      seq->text_reported = seq->text.size();
      seq->tokens_reported = static_cast<size_t>(seq->num_output_tokens());
      seq->finish_reported = true;
    }
    return o;
  }
  for (auto& seq : r.seqs) {
    const size_t n_out = static_cast<size_t>(seq->num_output_tokens());
    const bool has_new = seq->tokens_reported < n_out || seq->text_reported < seq->text.size();
    const bool ends_now = seq->finished() && !seq->finish_reported;
    if (!has_new && !ends_now) continue;
    CompletionDelta d;
    d.index = seq->index;
    d.text = seq->text.substr(seq->text_reported);
    d.token_ids.assign(seq->tokens.begin() + seq->num_prompt_tokens + static_cast<std::ptrdiff_t>(seq->tokens_reported),
                       seq->tokens.end());
    if (r.params.logprobs) {
      d.logprobs.assign(seq->logprobs.begin() + static_cast<std::ptrdiff_t>(seq->tokens_reported), seq->logprobs.end());
    }
    d.cumulative_logprob = seq->cumulative_logprob;
    d.finish_reason = seq->finish_reason;
    d.stop_reason = seq->stop_reason;
    seq->text_reported = seq->text.size();
    seq->tokens_reported = n_out;
    seq->finish_reported = seq->finished();
    o.outputs.push_back(std::move(d));
  }
  return o;
}

void LLMEngine::record_finished(const Request& r) {
  const auto end = r.times.finished.value_or(Clock::now());
  int64_t generated = 0;
  std::string reason = "stop";
  if (r.params.use_beam_search) {
    for (const BeamHypothesis& h : r.beam_hypotheses) generated = std::max<int64_t>(generated, static_cast<int64_t>(h.output_ids.size()));
    if (!r.beam_hypotheses.empty()) reason = std::string(finish_reason_name(r.beam_hypotheses.front().finish_reason));
  } else {
    for (const auto& seq : r.seqs) generated += seq->num_output_tokens();
    if (!r.seqs.empty() && r.seqs.front()->finish_reason) reason = std::string(finish_reason_name(*r.seqs.front()->finish_reason));
  }
  if (!r.seqs.empty() && r.seqs.front()->finish_reason == FinishReason::kAbort) reason = "abort";
  if (!r.error.empty()) reason = "error";
  metrics_.update([&](EngineMetrics& m) {
    ++m.requests_finished_total[reason];
    m.prompt_tokens_total += static_cast<int64_t>(r.prompt_ids.size());
    m.request_prompt_tokens.observe(static_cast<double>(r.prompt_ids.size()));
    m.request_generation_tokens.observe(static_cast<double>(generated));
    m.e2e_request_latency.observe(seconds(end - r.times.arrival));
    if (r.times.first_scheduled) m.request_queue_time.observe(seconds(*r.times.first_scheduled - r.times.arrival));
    if (r.times.first_token && r.times.last_token && generated > 1) {
      const int64_t per_seq = r.params.use_beam_search ? generated : generated / std::max<int64_t>(1, r.width());
      if (per_seq > 1) {
        m.time_per_output_token.observe(seconds(*r.times.last_token - *r.times.first_token) /
                                        static_cast<double>(per_seq - 1));
      }
    }
  });
}

void LLMEngine::update_gauges() {
  const KvCacheStats kv = kv_->stats();
  int32_t running = static_cast<int32_t>(scheduler_->running().size());
  int32_t waiting = static_cast<int32_t>(scheduler_->waiting().size() + fetching_.size());
  const int64_t preemptions = scheduler_->num_preemptions();
  // The adapters requests use, by name (only where any is loaded: a model without adapters skips
  // the walk over the requests).
  const int32_t adapters_loaded = model_->num_lora_adapters();
  std::set<std::string> running_loras, waiting_loras;
  if (adapters_loaded > 0 || !retired_loras_.empty()) {
    const auto note = [&](std::set<std::string>& names, const Request& r) {
      if (const LoraAdapter* a = model_->lora_adapter(r.params.lora_adapter)) names.insert(a->name());
    };
    for (const auto& r : scheduler_->running()) note(running_loras, *r);
    for (const auto& r : scheduler_->waiting()) note(waiting_loras, *r);
    for (const Fetching& f : fetching_) note(waiting_loras, *f.request);
  }
  metrics_.update([&](EngineMetrics& m) {
    m.num_requests_running = running;
    m.num_requests_waiting = waiting;
    m.lora_adapters_loaded = adapters_loaded;
    m.max_loras = Model::kMaxLoraAdapters;
    m.running_lora_adapters.assign(running_loras.begin(), running_loras.end());
    m.waiting_lora_adapters.assign(waiting_loras.begin(), waiting_loras.end());
    m.kv_blocks_used = kv.num_used_blocks;
    m.kv_cache_usage = kv.usage();
    m.kv_fragmentation = kv.fragmentation;
    m.prefix_cache_queries_total = kv.prefix_queries;
    m.prefix_cache_hits_total = kv.prefix_hits;
    (void)preemptions;
  });
}

}  // namespace duet
