// The packed integer GEMM alone (the kernel every quantized matmul of a prepared model runs), one
// thread: the median time of one call, and the weight bytes per second it reads. Under
// `valgrind --tool=callgrind` (with -r 1) its instruction count, which a shared machine does not
// blur, divided by the weight bytes gives the kernel's cost per byte.
//
//   qgemm_bench [--type q4_0|q8_0|q4_k|q6_k|q4_1|q5_0] [--rows 5504] [--cols 2048] [-m 1] [-r 20]
//               [--mib 256]
//
// The kernel is the one the selected ISA's table has (DUET_FORCE_ISA picks another). --mib is how
// much packed weight the calls cycle through (copies of the matrix), so that a timed call reads
// memory and not the cache; with -r 1 one copy is enough. Besides bytes per second it prints the
// call's integer products per second (m x rows x cols), for prefill, where the kernel computes
// rather than waits for memory.
//
//   qgemm_bench --peak
//
// x86 with AVX2: what the packed AVX2 kernels' innermost instruction mixes can reach on this core,
// one thread, operands in registers (no loads, no epilogue): the Q8_0 xor readers' (vpxor,
// vpmaddubsw, vpmaddwd, vpaddd for each 32 products, packed_avx2.inc) and the 4-bit tiles'
// (vpmaddubsw, vpaddw for each 32), in products per second, beside the two vector multiplies
// alone (vpmaddubsw; vfmadd231ps, 8 products each) and mixed (whether float products could run
// beside the integer ones), so that a prefill kernel's rate can be read against its instructions'
// ceiling.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "duet/backend/cpu/kernels.h"
#include "duet/backend/cpu/packed.h"
#include "duet/core/dtype.h"
#include "duet/core/memory.h"
#include "duet/core/quant.h"
#include "duet/core/random.h"

namespace {

#if defined(__x86_64__)
// 8 independent sums, each one instruction sequence per iteration; ymm12-15 hold the operands.
#define DUET_PEAK8(seq) seq(1) seq(2) seq(3) seq(4) seq(5) seq(6) seq(7) seq(8)
#define DUET_Q8_XOR(r)                                            \
  "vpxor %%ymm12, %%ymm13, %%ymm0\n"                             \
  "vpmaddubsw %%ymm0, %%ymm14, %%ymm0\n"                         \
  "vpmaddwd %%ymm15, %%ymm0, %%ymm0\n"                           \
  "vpaddd %%ymm0, %%ymm" #r ", %%ymm" #r "\n"
#define DUET_Q4(r)                                                \
  "vpmaddubsw %%ymm13, %%ymm14, %%ymm0\n"                        \
  "vpaddw %%ymm0, %%ymm" #r ", %%ymm" #r "\n"
#define DUET_MADDUBS(r) "vpmaddubsw %%ymm13, %%ymm14, %%ymm" #r "\n"
#define DUET_FMA(r) "vfmadd231ps %%ymm13, %%ymm14, %%ymm" #r "\n"
// Sums 1-4 through vpmaddubsw, 5-8 through vfmadd231ps: faster than either alone only where the
// integer and the float multiplies have pipes of their own.
#define DUET_MIXED(r) DUET_MIXED_##r
#define DUET_MIXED_1 DUET_MADDUBS(1)
#define DUET_MIXED_2 DUET_MADDUBS(2)
#define DUET_MIXED_3 DUET_MADDUBS(3)
#define DUET_MIXED_4 DUET_MADDUBS(4)
#define DUET_MIXED_5 DUET_FMA(5)
#define DUET_MIXED_6 DUET_FMA(6)
#define DUET_MIXED_7 DUET_FMA(7)
#define DUET_MIXED_8 DUET_FMA(8)
#define DUET_PEAK_LOOP(name, seq)                                                                          \
  __attribute__((target("avx2,fma"))) void name(int64_t iters) {                                          \
    __asm__ volatile("vpxor %%ymm13, %%ymm13, %%ymm13\nvpxor %%ymm14, %%ymm14, %%ymm14\n"                   \
                     "vpxor %%ymm12, %%ymm12, %%ymm12\nvpxor %%ymm15, %%ymm15, %%ymm15\n"                   \
                     "1:\n" DUET_PEAK8(seq) "dec %0\njnz 1b\nvzeroupper\n"                                 \
                     : "+r"(iters)                                                                           \
                     :                                                                                       \
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm12", "xmm13", \
                       "xmm14", "xmm15", "cc");                                                              \
  }
DUET_PEAK_LOOP(peak_q8_xor, DUET_Q8_XOR)
DUET_PEAK_LOOP(peak_q4, DUET_Q4)
DUET_PEAK_LOOP(peak_maddubs, DUET_MADDUBS)
DUET_PEAK_LOOP(peak_fma, DUET_FMA)
DUET_PEAK_LOOP(peak_mixed, DUET_MIXED)

// The best of five runs of `loop`, in products per second (products per iteration given).
double peak_rate(void (*loop)(int64_t), double products_per_iteration) {
  constexpr int64_t kIters = 20'000'000;
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto start = std::chrono::steady_clock::now();
    loop(kIters);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return kIters * products_per_iteration / best;
}

int peak() {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::fprintf(stderr, "qgemm_bench --peak: this CPU has no AVX2 and FMA\n");
    return 1;
  }
  // Each loop iteration: 8 sequences of 32 products (vpmaddubsw) or 8 (vfmadd231ps).
  std::printf("one thread, operands in registers, G integer products per second:\n");
  std::printf("  Q8_0 xor reader (vpxor, vpmaddubsw, vpmaddwd, vpaddd per 32): %.1f\n", peak_rate(peak_q8_xor, 256) * 1e-9);
  std::printf("  4-bit tiles (vpmaddubsw, vpaddw per 32):                      %.1f\n", peak_rate(peak_q4, 256) * 1e-9);
  std::printf("  vpmaddubsw alone (32 each):                                   %.1f\n", peak_rate(peak_maddubs, 256) * 1e-9);
  std::printf("  vfmadd231ps alone (8 each):                                   %.1f\n", peak_rate(peak_fma, 64) * 1e-9);
  std::printf("  4 vpmaddubsw and 4 vfmadd231ps:                               %.1f\n",
              peak_rate(peak_mixed, 4 * 32 + 4 * 8) * 1e-9);
  return 0;
}
#endif

int usage() {
  std::fprintf(stderr,
               "usage: qgemm_bench [--type q4_0|q8_0|q4_k|q6_k|q4_1|q5_0] [--rows N] [--cols N] [-m N] [-r RUNS] "
               "[--mib N]\n       qgemm_bench --peak (x86 with AVX2)\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace duet;
  using namespace duet::cpu;
  std::string type_name = "q4_0";
  int64_t rows = 5504, cols = 2048, m = 1, mib = 256;
  int runs = 20;
  if (argc == 2 && std::string(argv[1]) == "--peak") {
#if defined(__x86_64__)
    return peak();
#else
    std::fprintf(stderr, "qgemm_bench --peak: x86 only\n");
    return 1;
#endif
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--type") type_name = v;
    else if (a == "--rows") rows = std::atoll(v);
    else if (a == "--cols") cols = std::atoll(v);
    else if (a == "-m") m = std::atoll(v);
    else if (a == "-r") runs = std::atoi(v);
    else if (a == "--mib") mib = std::atoll(v);
    else return usage();
  }
  if (argc % 2 == 0) return usage();
  const std::optional<DType> parsed = parse_dtype(type_name);
  if (!parsed || !packable(*parsed) || rows < 1 || m < 1 || runs < 1 || cols % 256 != 0) {
    return usage();
  }
  const DType type = *parsed;
  const Kernels& k = kernels();
  const PackedGemmFn fn = packed_gemm_fn(k, type);
  if (fn == nullptr) {
    std::fprintf(stderr, "qgemm_bench: the %s table has no packed %s kernel\n", std::string(isa_name(k.isa)).c_str(),
                 type_name.c_str());
    return 1;
  }
  const int64_t nb = cols / kQK8A;
  Rng rng(7);
  std::vector<float> wf(static_cast<size_t>(rows * cols)), x(static_cast<size_t>(m * cols));
  for (float& v : wf) v = static_cast<float>(2.0 * rng.uniform() - 1.0);
  for (float& v : x) v = static_cast<float>(2.0 * rng.uniform() - 1.0);
  const size_t rb = row_size(type, cols);
  std::vector<uint8_t> w(rb * static_cast<size_t>(rows));
  if (type == DType::kQ5_0) {
    // No reference quantizer for Q5_0: random values under a small scale, block by block.
    for (size_t b = 0; b < w.size(); b += sizeof(BlockQ5_0)) {
      for (size_t i = 2; i < sizeof(BlockQ5_0); ++i) w[b + i] = static_cast<uint8_t>(rng.next() >> 24);
      const uint16_t d = fp32_to_fp16(0.01f);
      std::memcpy(w.data() + b, &d, sizeof(d));
    }
  } else {
    for (int64_t j = 0; j < rows; ++j) quantize_row_ref(type, wf.data() + j * cols, w.data() + j * rb, cols);
  }
  const size_t bytes = packed_bytes(type, rows, nb);
  const int64_t copies = runs == 1 ? 1 : std::max<int64_t>(1, (mib << 20) / static_cast<int64_t>(bytes));
  // In huge pages, as a loaded model's packed weights are (the arena of core/memory.h): with 4 KiB
  // pages a stream of weights from memory also pays for the page walks.
  AnonymousMemory arena(bytes * static_cast<size_t>(copies), /*huge_pages=*/true);
  auto* packed = static_cast<uint8_t*>(arena.data());
  for (int64_t c = 0; c < copies; ++c) {
    pack_rows16(type, w.data(), rb, rows, nb, packed + c * bytes, 0, (rows + kPackRows - 1) / kPackRows);
  }
  std::vector<BlockQ8A> a(static_cast<size_t>(m * nb));
  for (int64_t i = 0; i < m; ++i) k.quantize_q8a(x.data() + i * cols, a.data() + i * nb, cols);
  std::vector<int32_t> half(static_cast<size_t>(2 * m * nb));
  half_sums(a.data(), m * nb, half.data());
  std::vector<float> y(static_cast<size_t>(m * rows));
  std::vector<double> seconds;
  for (int r = 0; r < runs; ++r) {
    const uint8_t* p = packed + static_cast<size_t>(r % copies) * bytes;
    const auto start = std::chrono::steady_clock::now();
    fn(p, rows, a.data(), half.data(), m, nb, y.data(), rows);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  const double med = seconds[seconds.size() / 2];
  double check = 0.0;
  for (float v : y) check += v;
  const double products = static_cast<double>(m) * static_cast<double>(rows) * static_cast<double>(cols);
  std::printf("%s %lld x %lld, m %lld, %s: %.3f ms per call (best %.3f), %.2f GB/s of weights (%.2f MB), "
              "%.1f G products/s (best %.1f), checksum %.6g\n",
              type_name.c_str(), static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(m),
              std::string(isa_name(k.isa)).c_str(), med * 1e3, seconds.front() * 1e3, bytes / med * 1e-9,
              bytes * 1e-6, products / med * 1e-9, products / seconds.front() * 1e-9, check);
  return 0;
}
