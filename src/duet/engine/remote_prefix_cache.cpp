#include "duet/engine/remote_prefix_cache.h"

#include <algorithm>
#include <cstring>

#include "duet/core/error.h"
#include "duet/core/log.h"

namespace duet {
namespace {

uint64_t hash_string(uint64_t seed, std::string_view s) { return checksum64(s.data(), s.size(), seed); }

}  // namespace

uint64_t model_fingerprint(const GgufFile& file) {
  uint64_t h = hash_string(0x6475657466707231ull, file.get_string_or("general.architecture", ""));
  for (const auto& [key, value] : file.metadata()) {
    h = hash_string(h, key);
    h = hash_string(h, value.to_string(64));
  }
  for (const GgufTensorInfo& t : file.tensors()) {
    h = hash_string(h, t.name);
    const int64_t fields[2] = {static_cast<int64_t>(t.type), static_cast<int64_t>(t.nbytes)};
    h = checksum64(fields, sizeof(fields), h);
    h = checksum64(t.shape.data(), t.shape.size() * sizeof(int64_t), h);
    if (t.data == nullptr || t.nbytes == 0) continue;
    const size_t n = std::min<size_t>(64, t.nbytes);
    for (const size_t offset : {size_t{0}, (t.nbytes - n) / 2, t.nbytes - n}) h = checksum64(t.data + offset, n, h);
  }
  return h;
}

RemotePrefixCache::RemotePrefixCache(const RedisKvConfig& config, uint64_t fingerprint, KvDtype dtype,
                                     const PagedKvCache& cache, int32_t max_fetch_blocks)
    : max_fetch_blocks_(max_fetch_blocks) {
  if (config.ttl_seconds < 1) {
    fail(ErrorCode::kInvalidArgument, "--kv-cache-redis-ttl is {} seconds, expected 1 or more", config.ttl_seconds);
  }
  if (config.max_memory_bytes < 0) {
    fail(ErrorCode::kInvalidArgument, "--kv-cache-redis-max-memory is {} bytes, expected 0 (leave Redis' own) or more",
         config.max_memory_bytes);
  }
  if (!(config.timeout_ms >= 0.0 && config.timeout_ms <= 60000.0)) {
    fail(ErrorCode::kInvalidArgument, "--kv-cache-redis-timeout-ms is {}, expected 0 to 60000 milliseconds",
         config.timeout_ms);
  }
  layout_.block_size = cache.block_size();
  layout_.num_layers = static_cast<int32_t>(cache.num_layers());
  layout_.k_bytes = cache.k_block_bytes();
  layout_.v_bytes = cache.v_block_bytes();
  identity_ = kv_tier_identity(fingerprint, kv_dtype_name(dtype), layout_);
  RedisStoreConfig sc;
  sc.url = parse_redis_url(config.url);
  sc.ttl_seconds = config.ttl_seconds;
  sc.max_memory_bytes = config.max_memory_bytes;
  payload_.resize(static_cast<size_t>(layout_.payload_bytes()));
  store_ = std::make_unique<RedisBlockStore>(std::move(sc));
}

void RemotePrefixCache::export_blocks(KvCacheManager& kv, PagedKvCache& cache) {
  const std::vector<NewCachedBlock> blocks = kv.take_new_cached_blocks();
  if (blocks.empty() || !store_->connected()) return;  // down: nothing is copied for nothing
  for (const NewCachedBlock& b : blocks) {
    uint8_t* out = payload_.data();
    for (int64_t l = 0; l < cache.num_layers(); ++l) {
      Device& d = cache.device(l);
      d.copy_to_host(out, static_cast<const uint8_t*>(cache.k(l)) + b.block * layout_.k_bytes,
                     static_cast<size_t>(layout_.k_bytes));
      out += layout_.k_bytes;
      if (layout_.v_bytes > 0) {
        d.copy_to_host(out, static_cast<const uint8_t*>(cache.v(l)) + b.block * layout_.v_bytes,
                       static_cast<size_t>(layout_.v_bytes));
        out += layout_.v_bytes;
      }
    }
    const BlockMeta meta{identity_, b.hash, b.parent, layout_};
    store_->put(block_key(identity_, b.hash), encode_block(meta, kv.pool().cached_tokens(b.block), payload_));
  }
}

uint64_t RemotePrefixCache::start_fetch(const std::vector<int32_t>& prompt, const KvCacheManager& kv, BlockHash salt) {
  const int32_t bs = layout_.block_size;
  // The reusable blocks: whole blocks before the last token (as the local prefix lookup caps them).
  const auto reusable = static_cast<int32_t>(prompt.empty() ? 0 : (prompt.size() - 1) / static_cast<size_t>(bs));
  const int32_t first = kv.num_cached_prefix_blocks(std::span<const int32_t>(prompt).first(static_cast<size_t>(reusable) * bs), salt);
  const int32_t count = std::min(reusable - first, max_fetch_blocks_);
  if (count <= 0) return 0;
  auto tokens = std::make_shared<const std::vector<int32_t>>(prompt.begin(), prompt.begin() + static_cast<ptrdiff_t>(first + count) * bs);
  auto hashes = std::make_shared<const std::vector<BlockHash>>(chain_hashes(*tokens, first + count, bs, salt));
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(count));
  for (int32_t i = first; i < first + count; ++i) keys.push_back(block_key(identity_, (*hashes)[static_cast<size_t>(i)]));
  // Each value is checked on the reader thread against what this prompt expects there.
  RedisBlockStore::Check check = [tokens, hashes, first, salt, identity = identity_,
                                  layout = layout_](size_t index, const std::string& value) {
    const size_t i = static_cast<size_t>(first) + index;
    const BlockMeta expected{identity, (*hashes)[i], i == 0 ? salt : (*hashes)[i - 1], layout};
    const auto block_tokens = std::span<const int32_t>(*tokens).subspan(i * static_cast<size_t>(layout.block_size),
                                                                         static_cast<size_t>(layout.block_size));
    return decode_block(value, expected, block_tokens).has_value();
  };
  const uint64_t ticket = store_->fetch(std::move(keys), std::move(check));
  pending_.emplace(ticket, Pending{std::move(tokens), first, count, Clock::now(), salt});
  return ticket;
}

std::vector<uint64_t> RemotePrefixCache::poll(KvCacheManager& kv, PagedKvCache& cache) {
  std::vector<uint64_t> done;
  for (RedisBlockStore::Fetched& f : store_->take_fetched()) {
    auto it = pending_.find(f.ticket);
    if (it == pending_.end()) continue;
    const Pending p = std::move(it->second);
    pending_.erase(it);
    const auto found = static_cast<int32_t>(f.values.size());
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - p.started).count();
    if (p.abandoned) {
      spdlog::info("kv-cache-redis: {} of {} blocks came {:.0f} ms after their request went on; kept for later "
                   "requests", found, p.count, ms);
    } else {
      done.push_back(f.ticket);
      store_->count_misses(p.count - found);
      spdlog::debug("kv-cache-redis: {} of {} blocks fetched in {:.1f} ms", found, p.count, ms);
    }
    if (found == 0) continue;
    std::optional<BlockImport> import = kv.begin_import(*p.tokens, p.first, found, p.salt);
    if (!import) continue;  // the local cache has them meanwhile, or no block is free
    int32_t filled = 0;
    try {
      for (size_t j = 0; j < import->blocks.size(); ++j) {
        const std::string& value = f.values[static_cast<size_t>(import->first - p.first) + j];
        const uint8_t* in = block_payload(value, layout_).data();
        const BlockId block = import->blocks[j];
        for (int64_t l = 0; l < cache.num_layers(); ++l) {
          Device& d = cache.device(l);
          d.copy_from_host(static_cast<uint8_t*>(cache.k(l)) + block * layout_.k_bytes, in,
                           static_cast<size_t>(layout_.k_bytes));
          in += layout_.k_bytes;
          if (layout_.v_bytes > 0) {
            d.copy_from_host(static_cast<uint8_t*>(cache.v(l)) + block * layout_.v_bytes, in,
                             static_cast<size_t>(layout_.v_bytes));
            in += layout_.v_bytes;
          }
        }
        ++filled;
      }
    } catch (const std::exception&) {
      store_->count_error();  // a copy into a device failed: what was filled is kept
    }
    kv.end_import(*import, *p.tokens, filled);
    if (!p.abandoned) store_->count_hits(filled);
  }
  return done;
}

void RemotePrefixCache::abandon(uint64_t ticket) {
  auto it = pending_.find(ticket);
  if (it == pending_.end() || it->second.abandoned) return;
  store_->count_misses(it->second.count);
  it->second.abandoned = true;
}

}  // namespace duet
