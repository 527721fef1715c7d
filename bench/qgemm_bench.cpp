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
// memory and not the cache; with -r 1 one copy is enough.
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

int usage() {
  std::fprintf(stderr,
               "usage: qgemm_bench [--type q4_0|q8_0|q4_k|q6_k|q4_1|q5_0] [--rows N] [--cols N] [-m N] [-r RUNS] "
               "[--mib N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace duet;
  using namespace duet::cpu;
  std::string type_name = "q4_0";
  int64_t rows = 5504, cols = 2048, m = 1, mib = 256;
  int runs = 20;
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
  std::printf("%s %lld x %lld, m %lld, %s: %.3f ms per call (best %.3f), %.2f GB/s of weights (%.2f MB), "
              "checksum %.6g\n",
              type_name.c_str(), static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(m),
              std::string(isa_name(k.isa)).c_str(), med * 1e3, seconds.front() * 1e3, bytes / med * 1e-9,
              bytes * 1e-6, check);
  return 0;
}
