// Paged attention alone: the time of one call (and, under `valgrind --tool=callgrind`, its
// instructions, which a shared machine does not blur), for a decode step or a prefill chunk at a
// given context.
//
//   attention_bench [--heads 16] [--kv-heads 16] [--dk 128] [--dv 128] [--latent]
//                   [--context 2048] [--tokens 1] [--seqs 1] [--dtype f16|q8_0|fp8|f32] [--layers 1]
//                   [-t 1] [-r 5]
//
// Each of --seqs sequences has --context positions after the step, the last --tokens of them new
// (1: decode). --latent is MLA's shape: one kv head whose cache row holds the key, the value being
// its first dv elements (DeepSeek-V2: --heads 16 --kv-heads 1 --dk 576 --dv 512 --latent).
// --layers N gives each of N layers its own cache and calls them in turn, as a model's step does,
// so that no call finds the last one's keys in the CPU's caches. The caches are allocated as the
// engine allocates its KV cache (huge pages where the kernel gives them).
// Prints the median seconds per call and the keys x heads per second it implies.
//
//   attention_bench --indexer K [--heads 64] [--dk 128] [--context 4096] [--tokens 1] [--dtype f16]
//                   [-t 1] [-r 5]
//
// times DeepSeek-V3.2's indexer choice instead (Backend::index_topk): --tokens queries of --heads
// heads over --context keys of --dk in a cache of --dtype, the last --tokens positions the
// queries' own, K chosen each.
//
//   attention_bench --load-kv ROWS [--dk 128] [--dtype f16] [-t 1] [-r 5]
//
// times reading ROWS cache rows back as f32 (Backend::load_kv: each row through the conversion
// attention applies to the keys it converts), per row.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "duet/backend/backend.h"
#include "duet/core/memory.h"
#include "duet/core/random.h"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: attention_bench [--heads N] [--kv-heads N] [--dk N] [--dv N] [--latent] [--context N]\n"
               "                       [--tokens N] [--seqs N] [--dtype f16|q8_0|fp8|f32] [--layers N] [-t THREADS]\n"
               "                       [-r RUNS]\n"
               "       attention_bench --indexer K [--heads N] [--dk N] [--context N] [--tokens N]\n"
               "                       [--dtype f16|q8_0|fp8|f32] [-t THREADS] [-r RUNS]\n"
               "       attention_bench --load-kv ROWS [--dk N] [--dtype f16|q8_0|fp8|f32] [-t THREADS] [-r RUNS]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace duet;
  int64_t heads = 16, kv_heads = 16, dk = 128, dv = 128, context = 2048, tokens = 1, seqs = 1, layers = 1;
  int64_t indexer_k = -1;  // -1: attention
  int64_t load_rows = -1;  // -1: attention
  int threads = 1, runs = 5;
  bool latent = false;
  std::string dtype_name = "f16";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--latent") {
      latent = true;
      continue;
    }
    if ((v = value()) == nullptr) return usage();
    if (a == "--heads") heads = std::atoll(v);
    else if (a == "--kv-heads") kv_heads = std::atoll(v);
    else if (a == "--dk") dk = std::atoll(v);
    else if (a == "--dv") dv = std::atoll(v);
    else if (a == "--context") context = std::atoll(v);
    else if (a == "--tokens") tokens = std::atoll(v);
    else if (a == "--seqs") seqs = std::atoll(v);
    else if (a == "--dtype") dtype_name = v;
    else if (a == "--layers") layers = std::atoll(v);
    else if (a == "--indexer") indexer_k = std::atoll(v);
    else if (a == "--load-kv") load_rows = std::atoll(v);
    else if (a == "-t") threads = std::atoi(v);
    else if (a == "-r") runs = std::atoi(v);
    else return usage();
  }
  if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 || dk <= 0 || dv <= 0 || tokens < 1 || tokens > context ||
      seqs < 1 || layers < 1 || runs < 1 || (latent && (kv_heads != 1 || dv > dk))) {
    return usage();
  }
  if (load_rows != -1) {
    // Rows of --dk in a cache of --dtype read back as f32 (Backend::load_kv: the conversion
    // attention applies to the keys it reads), rows in a shuffled order as a sequence's blocks are.
    if (load_rows < 1) return usage();
    const KvDtype dtype = parse_kv_dtype(dtype_name);
    const size_t row_bytes = kv_row_bytes(dtype, dk);
    Rng rng(1);
    std::vector<float> rows(static_cast<size_t>(load_rows * dk)), out(rows.size());
    for (float& x : rows) x = static_cast<float>(2.0 * rng.uniform() - 1.0);
    std::vector<uint8_t> cache(static_cast<size_t>(load_rows) * row_bytes);
    std::vector<int64_t> slots(static_cast<size_t>(load_rows));
    for (int64_t s = 0; s < load_rows; ++s) slots[static_cast<size_t>(s)] = s;
    auto backend = make_cpu_backend(threads);
    backend->store_kv(rows.data(), slots.data(), load_rows, dk, cache.data(), dtype);
    for (int64_t s = 0; s < load_rows; ++s) slots[static_cast<size_t>(s)] = (s * 7919) % load_rows;
    std::vector<double> seconds;
    for (int r = 0; r < runs; ++r) {
      const auto start = std::chrono::steady_clock::now();
      backend->load_kv(cache.data(), dtype, slots.data(), load_rows, dk, out.data());
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(seconds.begin(), seconds.end());
    std::printf("load_kv, %lld rows of %lld %s, %d threads: %.2f ns per row (%s)\n", static_cast<long long>(load_rows),
                static_cast<long long>(dk), dtype_name.c_str(), threads, seconds[seconds.size() / 2] / load_rows * 1e9,
                backend->name().c_str());
    return 0;
  }
  if (indexer_k != -1) {
    if (indexer_k < 1 || indexer_k > context - tokens + 1) return usage();
    Rng rng(1);
    auto values = [&](int64_t n) {
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = static_cast<float>(2.0 * rng.uniform() - 1.0);
      return v;
    };
    const std::vector<float> keys = values(context * dk), q = values(tokens * heads * dk), w = values(tokens * heads);
    // The keys in a cache of --dtype, position s in row s.
    const KvDtype dtype = parse_kv_dtype(dtype_name);
    const size_t row_bytes = kv_row_bytes(dtype, dk);
    std::vector<uint8_t> cache(static_cast<size_t>(context) * row_bytes);
    std::vector<int64_t> slots(static_cast<size_t>(context));
    for (int64_t s = 0; s < context; ++s) slots[static_cast<size_t>(s)] = s;
    std::vector<int32_t> chosen(static_cast<size_t>(tokens * indexer_k));
    auto backend = make_cpu_backend(threads);
    backend->store_kv(keys.data(), slots.data(), context, dk, cache.data(), dtype);
    std::vector<double> seconds;
    for (int r = 0; r < runs; ++r) {
      const auto start = std::chrono::steady_clock::now();
      backend->index_topk(q.data(), cache.data(), dtype, slots.data(), context, w.data(), tokens, heads, dk,
                          context - tokens, indexer_k, chosen.data());
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(seconds.begin(), seconds.end());
    std::printf("indexer, %s keys, %lld tokens at context %lld, %lld heads, d %lld, top %lld, %d threads: %.3f ms per "
                "call (%s)\n",
                dtype_name.c_str(), static_cast<long long>(tokens), static_cast<long long>(context),
                static_cast<long long>(heads),
                static_cast<long long>(dk), static_cast<long long>(indexer_k), threads,
                seconds[seconds.size() / 2] * 1e3, backend->name().c_str());
    return 0;
  }
  const KvDtype dtype = parse_kv_dtype(dtype_name);
  const int32_t bs = 16;
  const int64_t blocks_per_seq = (context + bs - 1) / bs;
  const int64_t k_stride = kv_heads * dk, v_stride = latent ? k_stride : kv_heads * dv;
  const int64_t slots = seqs * blocks_per_seq * bs;
  const size_t k_row = kv_row_bytes(dtype, k_stride), v_row = kv_row_bytes(dtype, v_stride);
  const size_t k_bytes = static_cast<size_t>(slots) * k_row, v_bytes = latent ? 0 : static_cast<size_t>(slots) * v_row;
  std::vector<AnonymousMemory> k_caches, v_caches;
  for (int64_t l = 0; l < layers; ++l) {
    k_caches.emplace_back(k_bytes, /*huge_pages=*/true);
    v_caches.emplace_back(std::max<size_t>(v_bytes, 1), /*huge_pages=*/true);
  }
  Rng rng(1);
  std::vector<float> row(static_cast<size_t>(std::max(k_stride, v_stride)));
  auto backend = make_cpu_backend(threads);
  auto fill = [&](AnonymousMemory& cache, int64_t width) {
    for (int64_t s = 0; s < slots; ++s) {
      for (int64_t c = 0; c < width; ++c) row[static_cast<size_t>(c)] = static_cast<float>(2.0 * rng.uniform() - 1.0);
      backend->store_kv(row.data(), &s, 1, width, cache.data(), dtype);
    }
  };
  for (int64_t l = 0; l < layers; ++l) {
    fill(k_caches[static_cast<size_t>(l)], k_stride);
    if (!latent) fill(v_caches[static_cast<size_t>(l)], v_stride);
  }
  // Sequence i's blocks are every seqs-th block from i: interleaved, as a busy cache holds them.
  std::vector<int32_t> tables(static_cast<size_t>(seqs * blocks_per_seq));
  PagedAttentionBatch batch;
  batch.block_size = bs;
  for (int64_t i = 0; i < seqs; ++i) {
    int32_t* table = tables.data() + i * blocks_per_seq;
    for (int64_t b = 0; b < blocks_per_seq; ++b) table[b] = static_cast<int32_t>(b * seqs + i);
    batch.seqs.push_back(PagedSequence{static_cast<int32_t>(i * tokens), static_cast<int32_t>(tokens),
                                       static_cast<int32_t>(context), table, static_cast<int32_t>(blocks_per_seq)});
  }
  batch.num_tokens = static_cast<int32_t>(seqs * tokens);
  std::vector<float> q(static_cast<size_t>(batch.num_tokens * heads * dk));
  for (float& x : q) x = static_cast<float>(2.0 * rng.uniform() - 1.0) * 0.2f;
  std::vector<float> out(static_cast<size_t>(batch.num_tokens * heads * dv));
  const Backend::AttentionShape shape{heads, kv_heads, dk, dv, k_stride, v_stride, dtype};
  std::vector<double> seconds;  // per call: a run calls every layer once
  for (int r = 0; r < runs; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t l = 0; l < layers; ++l) {
      const void* kc = k_caches[static_cast<size_t>(l)].data();
      const void* vc = latent ? kc : v_caches[static_cast<size_t>(l)].data();
      backend->paged_attention(q.data(), kc, vc, out.data(), batch, shape, 0.1f);
    }
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
                      static_cast<double>(layers));
  }
  std::sort(seconds.begin(), seconds.end());
  const double med = seconds[seconds.size() / 2];
  // Keys each query row sees, summed over the step's rows.
  double pairs = 0.0;
  for (int64_t t = 0; t < tokens; ++t) pairs += static_cast<double>(context - tokens + t + 1);
  pairs *= static_cast<double>(seqs * heads);
  std::printf("%s, %lld seqs x %lld tokens at context %lld, %lld heads / %lld kv, dk %lld dv %lld%s, %d threads: "
              "%.3f ms per call, %.1f M key-rows/s (%s)\n",
              dtype_name.c_str(), static_cast<long long>(seqs), static_cast<long long>(tokens),
              static_cast<long long>(context), static_cast<long long>(heads), static_cast<long long>(kv_heads),
              static_cast<long long>(dk), static_cast<long long>(dv), latent ? " latent" : "", threads, med * 1e3,
              pairs / med * 1e-6, backend->name().c_str());
  return 0;
}
