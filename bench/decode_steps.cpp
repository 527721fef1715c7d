// A model's forward alone, without the engine: one prefill of --prompt tokens, then --decode
// steps of one token each (the greedy token of the last step), on a CPU backend of -t threads.
// Built for this machine (bench/CMakeLists.txt) and for aarch64 (tests/arm, -DDUET_ARM_DECODE=ON),
// where bench/arm_insns.sh runs it under qemu with an instruction counter: the difference between
// two runs that decode different numbers of tokens is the instructions of a decode step, which no
// shared machine blurs (`--x86` counts this build the same way under qemu-x86_64, with AVX2).
//
//   decode_steps MODEL.gguf [--prompt 16] [--decode 8] [-t 1] [--seed 1]
//
// Prints the backend, the prompt's two best tokens and their logits, the tokens it decoded (the same
// on every ISA up to a near-tie, where the kernels' rounding may pick the other), and the times of
// the prefill and of the decode steps.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "duet/backend/backend.h"
#include "duet/core/error.h"
#include "duet/core/random.h"
#include "duet/formats/gguf.h"
#include "duet/model/model.h"

namespace {

int usage() {
  std::fprintf(stderr, "usage: decode_steps MODEL.gguf [--prompt N] [--decode N] [-t THREADS] [--seed N]\n");
  return 2;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  int64_t prompt = 16;
  int64_t decode = 8;
  int threads = 1;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--prompt" && has_value) {
      prompt = std::atoll(argv[++i]);
    } else if (a == "--decode" && has_value) {
      decode = std::atoll(argv[++i]);
    } else if (a == "-t" && has_value) {
      threads = std::atoi(argv[++i]);
    } else if (a == "--seed" && has_value) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (!a.empty() && a[0] != '-' && path.empty()) {
      path = a;
    } else {
      return usage();
    }
  }
  if (path.empty() || prompt < 1 || decode < 0 || threads < 1) return usage();

  try {
    std::unique_ptr<duet::Backend> backend = duet::make_cpu_backend(threads);
    auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<duet::Model> model =
        duet::load_model(std::make_shared<const duet::GgufFile>(duet::GgufFile::open(path)), *backend);
    const double load_s = seconds_since(t0);
    const int64_t vocab = model->config().num_vocab;

    duet::Rng rng(seed);
    std::vector<int32_t> tokens(static_cast<size_t>(prompt));
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab));
    std::vector<float> logits(static_cast<size_t>(vocab));
    duet::SequenceRunner runner(*model, prompt + decode);

    t0 = std::chrono::steady_clock::now();
    runner.forward(tokens, 0, logits.data(), false);
    const double prefill_s = seconds_since(t0);
    std::printf("backend %s\n", backend->name().c_str());
    std::printf("load %.3f s, prefill of %lld tokens %.3f s\n", load_s, static_cast<long long>(prompt), prefill_s);
    // The prompt's two best tokens: where ISAs decode differently, whether it was a near-tie.
    std::vector<int32_t> order(logits.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                      [&](int32_t a, int32_t b) { return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)]; });
    std::printf("prompt's best tokens: %d (%.6f), %d (%.6f)\n", order[0], logits[static_cast<size_t>(order[0])], order[1],
                logits[static_cast<size_t>(order[1])]);

    std::printf("decoded:");
    std::vector<double> step_s;
    for (int64_t i = 0; i < decode; ++i) {
      const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      std::printf(" %d", next);
      const int32_t one[1] = {next};
      t0 = std::chrono::steady_clock::now();
      runner.forward(one, prompt + i, logits.data(), false);
      step_s.push_back(seconds_since(t0));
    }
    std::printf("\n");
    if (!step_s.empty()) {
      std::sort(step_s.begin(), step_s.end());
      std::printf("decode step: median %.4f s over %zu\n", step_s[step_s.size() / 2], step_s.size());
    }
  } catch (const duet::Error& e) {
    std::fprintf(stderr, "decode_steps: %s\n", e.what());
    return 1;
  }
  return 0;
}
