// `duet bench bandwidth [-t N] [--size-mib 1024] [-r 7] [--model M]`: the memory-read bandwidth
// of this machine, STREAM-like (every thread reads its own slice of a buffer far larger than the
// caches, through the widest dot-product kernel the CPU has, as the matmul kernels read), and with --model the decode roofline it implies: generating one token reads every
// weight matrix once, so tokens/s <= bandwidth / bytes of weights read per token.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "duet/backend/cpu/kernels.h"
#include "duet/cli/bench_commands.h"
#include "duet/cli/units.h"
#include "duet/core/error.h"
#include "duet/core/memory.h"
#include "duet/core/thread_pool.h"
#include "duet/engine/model_path.h"
#include "duet/formats/gguf.h"

namespace duet::cli {
namespace {

struct BandwidthOptions {
  int threads = 0;
  int64_t size_mib = 1024;
  int repetitions = 7;
  std::string model;
};

// Bytes of weights one decode step reads: every tensor but the token embedding, of which it
// reads one row (unless the output head shares it).
size_t weight_bytes_per_token(const GgufFile& f) {
  size_t bytes = 0;
  const bool tied = f.find_tensor("output.weight") == nullptr;
  for (const GgufTensorInfo& t : f.tensors()) {
    if (t.name != "token_embd.weight" || tied) bytes += t.nbytes;
  }
  return bytes;
}

int run_bandwidth(const BandwidthOptions& o) {
  if (o.size_mib < 64) fail(ErrorCode::kInvalidArgument, "--size-mib is {}, expected at least 64", o.size_mib);
  if (o.repetitions < 1) fail(ErrorCode::kInvalidArgument, "-r is {}, expected at least 1", o.repetitions);
  ThreadPool pool(o.threads);
  const size_t bytes = static_cast<size_t>(o.size_mib) << 20;
  const size_t words = bytes / sizeof(float);
  AnonymousMemory mem(bytes);
  auto* data = static_cast<float*>(mem.data());
  const int nt = pool.num_threads();
  const cpu::Kernels& k = cpu::kernels();
  // Each thread writes (first touch) and later reads the same slice.
  pool.run([&](int t, int n) {
    const size_t begin = words * static_cast<size_t>(t) / static_cast<size_t>(n);
    const size_t end = words * static_cast<size_t>(t + 1) / static_cast<size_t>(n);
    for (size_t i = begin; i < end; ++i) data[i] = (i % 2 == 0) ? 0.5f : -0.5f;
  });
  std::vector<float> sums(static_cast<size_t>(nt) * 16);  // a cache line apart
  std::vector<double> rates;
  for (int r = 0; r < o.repetitions + 1; ++r) {
    const auto start = std::chrono::steady_clock::now();
    pool.run([&](int t, int n) {
      const size_t begin = words * static_cast<size_t>(t) / static_cast<size_t>(n);
      const size_t end = words * static_cast<size_t>(t + 1) / static_cast<size_t>(n);
      // dot(x, x) reads each element from memory once (the second operand hits the same line).
      sums[static_cast<size_t>(t) * 16] = k.dot_f32(data + begin, data + begin, static_cast<int64_t>(end - begin));
    });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (r > 0) rates.push_back(static_cast<double>(bytes) / secs / 1e9);  // the first run warms up
  }
  double check = 0.0;
  for (float s : sums) check += s;
  if (std::abs(check - 0.25 * static_cast<double>(words)) > 1e-3 * static_cast<double>(words)) {
    fail(ErrorCode::kInternal, "the bandwidth probe read wrong data");
  }
  std::vector<double> sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  fmt::print("Memory read: {:.2f} GB/s median, {:.2f} GB/s best ({} threads, {} buffer, {} runs)\n", median,
             sorted.back(), nt, human_bytes(static_cast<double>(bytes)), rates.size());
  if (!o.model.empty()) {
    const GgufFile f = open_model_path(o.model);
    const size_t per_token = weight_bytes_per_token(f);
    fmt::print("Weights read per token: {}; decode roofline: {:.2f} tokens/s at the median bandwidth\n",
               human_bytes(static_cast<double>(per_token)), median * 1e9 / static_cast<double>(per_token));
  }
  return 0;
}

}  // namespace

void add_bench_bandwidth_command(CLI::App* bench, int& exit_code) {
  auto* cmd = bench->add_subcommand("bandwidth", "Measure memory read bandwidth and a model's decode roofline");
  auto o = std::make_shared<BandwidthOptions>();
  cmd->add_option("-t,--threads", o->threads, "Threads (default: all)");
  cmd->add_option("--size-mib", o->size_mib, "Buffer size in MiB (far larger than the caches)")->capture_default_str();
  cmd->add_option("-r,--repetitions", o->repetitions, "Timed runs after one warm-up")->capture_default_str();
  cmd->add_option("-m,--model", o->model, "GGUF model or Hugging Face folder: also print its decode roofline");
  cmd->callback([o, &exit_code] { exit_code = run_bandwidth(*o); });
}

}  // namespace duet::cli
