// `duet bench bandwidth [-t N] [--size-mib 1024] [-r 7] [--model M]`: the memory-read bandwidth
// of this machine, STREAM-like (every thread reads its own slice of a buffer far larger than the
// caches, through the widest dot-product kernel the CPU has, as the matmul kernels read), and with
// --model the decode roofline it implies: generating one token reads every weight matrix once (of
// a MoE layer's routed experts, the ones the token picks), so tokens/s <= bandwidth / bytes of
// weights read per token.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>
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
#include "duet/model/placement.h"

namespace duet::cli {
namespace {

struct BandwidthOptions {
  int threads = 0;
  int64_t size_mib = 1024;
  int repetitions = 7;
  std::string model;
};

// Bytes of weights one decode step reads: every matrix of the layers it runs, of each layer's
// routed experts only the share a token uses (expert_used_count of expert_count), and of the token
// embedding one row (all of it when the output head shares it). Tensors outside the layers it runs
// (a multi-token-prediction layer past block_count) are not read.
struct TokenBytes {
  double bytes = 0;
  int64_t used = 0, experts = 0;  // routed experts a token uses, of how many (0 without experts)
};

TokenBytes weight_bytes_per_token(const GgufFile& f) {
  const std::string arch = f.get_string_or("general.architecture", "");
  const int64_t layers = f.get_int_or(arch + ".block_count", 0);
  TokenBytes out;
  out.experts = f.get_int_or(arch + ".expert_count", 0);
  out.used = f.get_int_or(arch + ".expert_used_count", 0);
  const bool tied = f.find_tensor("output.weight") == nullptr;
  for (const GgufTensorInfo& t : f.tensors()) {
    const std::optional<PartId> part = part_of_tensor(t.name, layers);
    if (!part || (part->kind == PartKind::kEmbed && !tied)) continue;
    double share = 1.0;
    if (part->kind == PartKind::kExperts && out.experts > 0) {
      share = static_cast<double>(std::min(out.used, out.experts)) / static_cast<double>(out.experts);
    }
    out.bytes += share * static_cast<double>(t.nbytes);
  }
  return out;
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
    const TokenBytes per_token = weight_bytes_per_token(f);
    const std::string experts =
        per_token.experts > 0 ? fmt::format(", {} of {} routed experts", per_token.used, per_token.experts) : "";
    fmt::print("Weights read per token: {} ({:.0f} bytes{}); decode roofline: {:.2f} tokens/s at the median bandwidth\n",
               human_bytes(per_token.bytes), per_token.bytes, experts, median * 1e9 / per_token.bytes);
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
