// One mixture-of-experts layer's routed experts alone (Backend::moe_experts): the CPU backend's
// fused path against one expert after another, timed in alternation in one process.
//
//   moe_bench [--experts 64] [--used 6] [--d 2048] [--ff 1408] [--type q4_0|q8_0|q4_k|q6_k]
//             [--tokens 1] [-t 2] [-r 20] [--path both|fused|per-expert] [--fresh]
//
// Defaults are DeepSeek-V2-Lite's MoE layer (64 routed experts of 2048 -> 1408 -> 2048, 6 used
// per token). Tokens pick their experts at random (weights random too). Prints, for each path,
// the median and best milliseconds per call, and the fused path's speed-up on the medians.
// --path runs one of them alone (for `valgrind --tool=callgrind`'s instruction counts). --fresh
// draws new picks for every call, as each layer of a model picks its own, so that a call finds
// few of its experts in the CPU's caches (without it every call reads the same experts, from cache
// where they fit).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "duet/backend/backend.h"
#include "duet/core/dtype.h"
#include "duet/core/quant.h"
#include "duet/core/random.h"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: moe_bench [--experts N] [--used N] [--d N] [--ff N] [--type q4_0|q8_0|q4_k|q6_k]\n"
               "                 [--tokens N] [-t THREADS] [-r RUNS] [--path both|fused|per-expert] [--fresh]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace duet;
  int64_t experts = 64, used = 6, d = 2048, ff = 1408, tokens = 1;
  int threads = 2, runs = 20;
  std::string type_name = "q4_0", path = "both";
  bool fresh = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--fresh") {
      fresh = true;
      continue;
    }
    if (i + 1 >= argc) return usage();
    const char* v = argv[++i];
    if (a == "--experts") experts = std::atoll(v);
    else if (a == "--used") used = std::atoll(v);
    else if (a == "--d") d = std::atoll(v);
    else if (a == "--ff") ff = std::atoll(v);
    else if (a == "--type") type_name = v;
    else if (a == "--tokens") tokens = std::atoll(v);
    else if (a == "-t") threads = std::atoi(v);
    else if (a == "-r") runs = std::atoi(v);
    else if (a == "--path") path = v;
    else return usage();
  }
  DType type;
  if (type_name == "q4_0") type = DType::kQ4_0;
  else if (type_name == "q8_0") type = DType::kQ8_0;
  else if (type_name == "q4_k") type = DType::kQ4_K;
  else if (type_name == "q6_k") type = DType::kQ6_K;
  else return usage();
  if (path != "both" && path != "fused" && path != "per-expert") return usage();
  const bool run[2] = {path != "per-expert", path != "fused"};
  if (experts < 1 || used < 1 || used > experts || tokens < 1 || threads < 1 || runs < 1) return usage();

  Rng rng(1);
  auto quantized = [&](int64_t rows, int64_t cols) {
    std::vector<float> row(static_cast<size_t>(cols));
    const size_t rb = row_size(type, cols);
    std::vector<uint8_t> q(rb * static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      for (float& x : row) x = static_cast<float>(rng.uniform() - 0.5);
      quantize_row_ref(type, row.data(), q.data() + static_cast<size_t>(r) * rb, cols);
    }
    return q;
  };
  const std::vector<uint8_t> gate = quantized(experts * ff, d), up = quantized(experts * ff, d);
  const std::vector<uint8_t> down = quantized(experts * d, ff);
  const MoeExperts w{{"gate", type, experts * ff, d, gate.data()},
                     {"up", type, experts * ff, d, up.data()},
                     {"down", type, experts * d, ff, down.data()},
                     experts,
                     ff};
  std::vector<float> x(static_cast<size_t>(tokens * d));
  for (float& v : x) v = static_cast<float>(rng.uniform() - 0.5);
  std::vector<int32_t> ids(static_cast<size_t>(tokens * used));
  std::vector<float> weights(ids.size());
  auto draw = [&] {
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<int32_t> all(static_cast<size_t>(experts));
      for (int64_t e = 0; e < experts; ++e) all[static_cast<size_t>(e)] = static_cast<int32_t>(e);
      for (int64_t j = 0; j < used; ++j) {  // a partial shuffle: `used` distinct experts
        const auto pick = j + static_cast<int64_t>(rng.uniform() * static_cast<double>(experts - j));
        std::swap(all[static_cast<size_t>(j)], all[static_cast<size_t>(pick)]);
        ids[static_cast<size_t>(t * used + j)] = all[static_cast<size_t>(j)];
        weights[static_cast<size_t>(t * used + j)] = static_cast<float>(rng.uniform());
      }
    }
  };
  draw();

  CpuBackendOptions options[2];
  for (auto& o : options) {
    o.cpus.assign(static_cast<size_t>(threads), -1);
    o.mode = MatmulMode::kFast;
  }
  options[1].fused_moe = false;
  std::unique_ptr<Backend> backends[2] = {make_cpu_backend(options[0]), make_cpu_backend(options[1])};
  std::unique_ptr<PreparedWeights> prepared[2];
  for (int b = 0; b < 2; ++b) prepared[b] = backends[b]->prepare_weights({w.gate, w.up, w.down});
  std::vector<float> out[2] = {std::vector<float>(x.size()), std::vector<float>(x.size())};
  std::vector<double> seconds[2];
  for (int r = 0; r < runs + 1; ++r) {  // the first round warms up, uncounted
    if (fresh && r > 0) draw();
    for (int b = 0; b < 2; ++b) {
      if (!run[b]) continue;
      const auto start = std::chrono::steady_clock::now();
      backends[b]->moe_experts(w, x.data(), ids.data(), weights.data(), tokens, used, out[b].data());
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (r > 0) seconds[b].push_back(s);
    }
  }
  if (run[0] && run[1] && out[0] != out[1]) {  // the last call's, the same picks for both
    std::fprintf(stderr, "moe_bench: the fused path's output differs from one expert after another\n");
    return 1;
  }
  double median[2];
  const char* names[2] = {"fused", "per-expert"};
  std::printf("%lld experts (%lld used) of %lld -> %lld -> %lld, %s, %lld tokens, %d threads, %d runs\n",
              static_cast<long long>(experts), static_cast<long long>(used), static_cast<long long>(d),
              static_cast<long long>(ff), static_cast<long long>(d), type_name.c_str(), static_cast<long long>(tokens),
              threads, runs);
  for (int b = 0; b < 2; ++b) {
    if (!run[b]) continue;
    std::sort(seconds[b].begin(), seconds[b].end());
    median[b] = seconds[b][seconds[b].size() / 2];
    std::printf("%-10s median %.3f ms, best %.3f ms\n", names[b], 1e3 * median[b], 1e3 * seconds[b].front());
  }
  if (run[0] && run[1]) std::printf("fused / per-expert: %.2fx faster\n", median[1] / median[0]);
  return 0;
}
