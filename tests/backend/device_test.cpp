// Devices: names, the machine's devices, memory accounting, the queue, utilization, the guarded
// test device (a host read of its memory crashes; its ops and copies work), and the ops the
// device work added (copy_2d, the MoE router and routed experts) against references.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "duet/backend/cuda_device.h"
#include "duet/backend/devices.h"
#include "duet/backend/moe.h"
#include "duet/core/error.h"
#include "duet/core/mapped_file.h"
#include "duet/core/quant.h"
#include "duet/core/random.h"

namespace duet {
namespace {

std::vector<float> random_vector(int64_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = scale * static_cast<float>(2.0 * rng.uniform() - 1.0);
  return v;
}

TEST(DeviceNames, ParseEveryFormAndRefuseTheRest) {
  EXPECT_EQ(parse_device_name("cpu").kind, DeviceName::Kind::kCpu);
  const DeviceName node = parse_device_name("cpu:3");
  EXPECT_EQ(node.kind, DeviceName::Kind::kNumaNode);
  EXPECT_EQ(node.index, 3);
  const DeviceName cores = parse_device_name("cpu[8,0-3,2]");
  EXPECT_EQ(cores.kind, DeviceName::Kind::kCores);
  EXPECT_EQ(cores.cpus, (std::vector<int>{0, 1, 2, 3, 8}));
  EXPECT_EQ(cores.text, "cpu[0,1,2,3,8]");
  EXPECT_EQ(parse_device_name("cuda:1").kind, DeviceName::Kind::kCuda);
  EXPECT_EQ(parse_device_name("guarded:0").kind, DeviceName::Kind::kGuarded);
  for (const char* bad : {"", "gpu", "cpu:", "cpu:x", "cpu:-1", "cpu[]", "cpu[3-1]", "cpu[a]", "cuda", "CPU"}) {
    EXPECT_THROW(parse_device_name(bad), Error) << bad;
  }
}

TEST(DeviceRegistry, ChecksNamesAgainstThisMachine) {
  DeviceRegistry r;
  EXPECT_NO_THROW(r.check("cpu"));
  EXPECT_NO_THROW(r.check("cpu:" + std::to_string(numa_topology().nodes.front())));
  EXPECT_NO_THROW(r.check("cpu[0]"));
  EXPECT_THROW(r.check("cpu:999"), Error);
  EXPECT_THROW(r.check("cpu[99999]"), Error);
  if (probe_cuda_devices().count == 0) {
    EXPECT_THROW(r.check("cuda:0"), Error);  // no backend, or no GPU
  }
  EXPECT_TRUE(r.made().empty());
  const std::shared_ptr<Device> a = r.get("cpu[0]");
  EXPECT_EQ(a, r.get("cpu[0]"));  // made once
  EXPECT_EQ(a->info().cpus, std::vector<int>{0});
  EXPECT_EQ(a->info().threads, 1);
  const MachineDevices m = machine_devices();
  EXPECT_TRUE(m.backends.at("cpu"));
  EXPECT_EQ(m.backends.at("cuda"), cuda_backend_built());
  ASSERT_GE(m.devices.size(), 2u);  // cpu, then each NUMA node
  EXPECT_EQ(m.devices[0].name, "cpu");
  EXPECT_GT(m.devices[0].memory_bytes, 0);
  EXPECT_EQ(m.devices[1].kind, "numa");
}

TEST(Device, CountsItsMemoryByKindAndGivesItBack) {
  const auto d = make_cpu_device("cpu[0]", "cores", {0}, MemoryPlacement{}, false);
  {
    DeviceBuffer kv = d->allocate(1 << 20, MemoryKind::kKv);
    DeviceBuffer s = d->allocate(4096, MemoryKind::kScratch);
    EXPECT_EQ(d->memory_used(MemoryKind::kKv), 1 << 20);
    EXPECT_EQ(d->memory_used(MemoryKind::kScratch), 4096);
    DeviceBuffer moved = std::move(s);
    EXPECT_EQ(d->memory_used(MemoryKind::kScratch), 4096);
  }
  EXPECT_EQ(d->memory_used(MemoryKind::kKv), 0);
  EXPECT_EQ(d->memory_used(MemoryKind::kScratch), 0);
}

TEST(Device, CopiesWeightsIntoItsMemoryWhenAsked) {
  // A node's device copies what its backend does not pack; the view then points at the copy.
  const auto d = make_cpu_device("cpu:0", "numa", {0}, MemoryPlacement{MemoryPlacement::Kind::kNode, 0}, true);
  const std::vector<float> norm = random_vector(64, 1);
  WeightView v{"norm", DType::kF32, 1, 64, norm.data()};
  std::unique_ptr<LoadedWeights> w = d->load_weights(std::vector<WeightRef>{{&v, false}});
  EXPECT_NE(v.data, norm.data());
  EXPECT_EQ(std::memcmp(v.data, norm.data(), 64 * sizeof(float)), 0);
  EXPECT_GE(d->memory_used(MemoryKind::kWeights), 64 * 4);
  w.reset();
  EXPECT_EQ(d->memory_used(MemoryKind::kWeights), 0);
}

// Weights read in place from a file's mapping come out of the free memory a host device reports
// (their pages sit in the page cache, which MemAvailable counts as free); anonymous weights and
// a packed matrix's original do not. The memory available is a cgroup's, written here (64 MiB of
// room), so that the figures are exact on a machine whose other processes come and go.
TEST(Device, WeightsReadInPlaceFromAFileAreNotFreeMemory) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("duet-device-test-" + std::to_string(::getpid()));
  fs::create_directories(dir / "cgroup" / "memory");
  std::ofstream(dir / "cgroup" / "cgroup.controllers") << "memory\n";
  std::ofstream(dir / "cgroup" / "memory.max") << (128 << 20) << "\n";
  std::ofstream(dir / "cgroup" / "memory.current") << (64 << 20) << "\n";
  std::ofstream(dir / "cgroup" / "memory" / "memory.limit_in_bytes") << (128 << 20) << "\n";
  std::ofstream(dir / "cgroup" / "memory" / "memory.usage_in_bytes") << (64 << 20) << "\n";
  const int64_t mib = 1 << 20;
  std::vector<uint8_t> bytes(static_cast<size_t>(2 * mib));
  const std::vector<float> values = random_vector(2 * mib / 4, 5);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  std::ofstream(dir / "weights.bin", std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  ::setenv("DUET_CGROUP_DIR", (dir / "cgroup").c_str(), 1);
  {
    const MappedFile file((dir / "weights.bin").string());
    const auto d = make_cpu_device(1, MatmulMode::kFast);
    const int64_t free = d->info().free_bytes;
    EXPECT_EQ(free, 64 * mib);
    // 1 MiB of f32 read in place (a norm, an embedding), 1 MiB of Q8_0 only multiplied (packed).
    WeightView f32{"f32", DType::kF32, 256, 1024, file.data()};
    const int64_t q8_rows = mib / static_cast<int64_t>(row_size(DType::kQ8_0, 1024));
    WeightView q8{"q8", DType::kQ8_0, q8_rows, 1024, file.data() + mib};
    const std::vector<float> anon_values = random_vector(1024, 6);
    WeightView anon{"anon", DType::kF32, 1, 1024, anon_values.data()};
    std::unique_ptr<LoadedWeights> w =
        d->load_weights(std::vector<WeightRef>{{&f32, false}, {&q8, true}, {&anon, false}});
    EXPECT_EQ(free - d->info().free_bytes, mib) << "the f32 rows are read from the file";
    w.reset();
    EXPECT_EQ(d->info().free_bytes, free);
  }
  ::unsetenv("DUET_CGROUP_DIR");
  fs::remove_all(dir);
}

TEST(Device, QueueRunsWorkInOrderOnItsOwnThread) {
  const auto d = make_cpu_device("cpu[0]", "cores", {0}, MemoryPlacement{}, false);
  std::vector<int> order;
  std::atomic<int> done{0};
  std::thread::id worker;
  for (int i = 0; i < 100; ++i) {
    d->submit([&, i] {
      order.push_back(i);
      worker = std::this_thread::get_id();
      done.fetch_add(1);
    });
  }
  while (done.load() < 100) std::this_thread::yield();
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
  EXPECT_NE(worker, std::this_thread::get_id());
}

TEST(Device, UtilizationIsBusyTimeOverWallTime) {
  const auto d = make_cpu_device("cpu[0]", "cores", {0}, MemoryPlacement{}, false);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(d->utilization(), 0.0);
  const auto now = Device::Clock::now();
  d->record_busy(now - std::chrono::milliseconds(100), now);
  const double u = d->utilization();
  EXPECT_GT(u, 0.2);  // 100 ms of some 200-300 ms since the device was made
  EXPECT_LE(u, 1.0);
  EXPECT_NEAR(d->busy_seconds_total(), 0.1, 1e-9);
}

TEST(GuardedDevice, OpsAndCopiesWorkOnItsMemory) {
  const auto g = make_guarded_device("guarded:0", MatmulMode::kExact);
  const auto cpu = make_cpu_device(1, MatmulMode::kExact);
  const int64_t rows = 48, cols = 64, m = 3;
  const std::vector<float> w = random_vector(rows * cols, 2), x = random_vector(m * cols, 3);
  DeviceBuffer gw = g->allocate(w.size() * 4, MemoryKind::kWeights);
  DeviceBuffer gx = g->allocate(x.size() * 4, MemoryKind::kScratch);
  DeviceBuffer gy = g->allocate(rows * m * 4, MemoryKind::kScratch);
  g->copy_from_host(gw.data(), w.data(), w.size() * 4);
  g->copy_from_host(gx.data(), x.data(), x.size() * 4);
  g->backend().matmul(WeightView{"w", DType::kF32, rows, cols, gw.data()}, gx.as<float>(), m, gy.as<float>());
  std::vector<float> got(static_cast<size_t>(rows * m)), want(got.size());
  g->copy_to_host(got.data(), gy.data(), got.size() * 4);
  cpu->backend().matmul(WeightView{"w", DType::kF32, rows, cols, w.data()}, x.data(), m, want.data());
  EXPECT_EQ(got, want);
  // A copy between two guarded devices goes through the host.
  const auto g2 = make_guarded_device("guarded:1", MatmulMode::kExact);
  DeviceBuffer other = g2->allocate(got.size() * 4, MemoryKind::kScratch);
  g2->copy_from_device(*g, other.data(), gy.data(), got.size() * 4);
  std::vector<float> back(got.size());
  g2->copy_to_host(back.data(), other.data(), back.size() * 4);
  EXPECT_EQ(back, want);
}

TEST(GuardedDeviceDeathTest, AHostReadOfItsMemoryCrashes) {
  // The mutation check of the discipline: host code that reads a device buffer directly, as a
  // model reading its router's logits would, dies here instead of passing unnoticed.
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_DEATH(
      {
        const auto g = make_guarded_device("guarded:0");
        DeviceBuffer b = g->allocate(256, MemoryKind::kScratch);
        const float one = 1.0f;
        g->copy_from_host(b.data(), &one, sizeof(one));
        volatile float seen = *static_cast<volatile float*>(b.data());
        (void)seen;
      },
      "");
}

TEST(CpuOps, Copy2dMovesASliceOfEveryRow) {
  const auto b = make_cpu_backend(1);
  const std::vector<float> src = random_vector(5 * 12, 4);
  std::vector<float> dst(5 * 7, -1.0f);
  b->copy_2d(src.data() + 3, 12, dst.data() + 2, 7, 5, 4);
  for (int r = 0; r < 5; ++r) {
    for (int c = 0; c < 7; ++c) {
      const float want = c >= 2 && c < 6 ? src[static_cast<size_t>(r * 12 + 3 + c - 2)] : -1.0f;
      EXPECT_EQ(dst[static_cast<size_t>(r * 7 + c)], want) << r << "," << c;
    }
  }
}

// The router against a plain restatement of HF's MoEGate for a few cases: V2 softmax top-k, V3
// sigmoid with bias, groups and normalisation.
TEST(CpuOps, MoeRouteMatchesMoeGate) {
  const int64_t E = 8, n = 5;
  const std::vector<float> logits = random_vector(n * E, 5, 3.0f);
  const std::vector<float> bias = random_vector(E, 6, 0.1f);
  for (int variant = 0; variant < 3; ++variant) {
    MoeRouting r;
    r.num_experts = E;
    r.num_used = 3;
    r.routed_scaling = 2.5;
    if (variant >= 1) {
      r.gating = MoeRouting::Gating::kSigmoid;
      r.bias = bias.data();
      r.norm_topk = true;
    }
    if (variant == 2) {
      r.num_groups = 4;
      r.num_groups_used = 2;
    }
    std::vector<int32_t> ids(static_cast<size_t>(n * 3));
    std::vector<float> w(ids.size());
    make_cpu_backend(1)->moe_route(logits.data(), n, r, ids.data(), w.data());
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> score(E), pick(E);
      for (int64_t e = 0; e < E; ++e) {
        const double l = logits[static_cast<size_t>(t * E + e)];
        score[e] = variant == 0 ? 0.0 : 1.0 / (1.0 + std::exp(-l));
      }
      if (variant == 0) {
        double sum = 0.0;
        for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(logits[static_cast<size_t>(t * E + e)]));
        for (int64_t e = 0; e < E; ++e) score[e] = std::exp(static_cast<double>(logits[static_cast<size_t>(t * E + e)])) / sum;
      }
      for (int64_t e = 0; e < E; ++e) pick[e] = score[e] + (variant >= 1 ? bias[static_cast<size_t>(e)] : 0.0);
      if (variant == 2) {  // keep the two groups (of two) with the best top-2 sums
        std::vector<std::pair<double, int>> groups;
        for (int g = 0; g < 4; ++g) groups.push_back({pick[2 * g] + pick[2 * g + 1], g});
        std::stable_sort(groups.begin(), groups.end(), [](auto a, auto b) { return a.first > b.first; });
        for (int g = 2; g < 4; ++g) pick[2 * groups[static_cast<size_t>(g)].second] = pick[2 * groups[static_cast<size_t>(g)].second + 1] = -1e30;
      }
      std::vector<int> order(E);
      for (int e = 0; e < E; ++e) order[static_cast<size_t>(e)] = e;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return pick[a] > pick[b]; });
      double total = 0.0;
      for (int i = 0; i < 3; ++i) total += score[order[static_cast<size_t>(i)]];
      for (int i = 0; i < 3; ++i) {
        const int e = order[static_cast<size_t>(i)];
        const double want = variant == 0 ? score[e] * 2.5 : score[e] / total * 2.5;
        EXPECT_EQ(ids[static_cast<size_t>(t * 3 + i)], e) << "variant " << variant << " token " << t;
        EXPECT_NEAR(w[static_cast<size_t>(t * 3 + i)], want, 1e-6) << "variant " << variant << " token " << t;
      }
    }
  }
}

// Routed experts: each token's experts run on its row alone, summed in increasing id, give the
// op's bits (rows alone or together compute the same), in f32 and in q8_0.
TEST(CpuOps, MoeExpertsEqualEachTokenAlone) {
  const int64_t E = 6, d = 64, ff = 96, n = 7, k = 2;
  for (DType type : {DType::kF32, DType::kQ8_0}) {
    const auto b = make_cpu_backend(2);
    const auto stack = [&](int64_t rows, int64_t cols, uint64_t seed) {
      const std::vector<float> f = random_vector(rows * cols, seed, 0.2f);
      std::vector<uint8_t> out(row_size(type, cols) * static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) quantize_row_ref(type, f.data() + r * cols, out.data() + r * row_size(type, cols), cols);
      return out;
    };
    const std::vector<uint8_t> gate = stack(E * ff, d, 7), up = stack(E * ff, d, 8), down = stack(E * d, ff, 9);
    const MoeExperts w{WeightView{"gate", type, E * ff, d, gate.data()}, WeightView{"up", type, E * ff, d, up.data()},
                       WeightView{"down", type, E * d, ff, down.data()}, E, ff};
    const std::vector<float> x = random_vector(n * d, 10);
    const std::vector<int32_t> ids = {0, 3, 5, 3, 3, 1, 2, 0, 4, 5, 0, 1, 2, 5};
    const std::vector<float> wts = random_vector(n * k, 11);
    std::vector<float> got(static_cast<size_t>(n * d));
    b->moe_experts(w, x.data(), ids.data(), wts.data(), n, k, got.data());
    const auto rows = [&](const WeightView& v, int64_t first, int64_t count) {
      return WeightView{v.name, v.type, count, v.cols, v.row(first)};
    };
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> want(static_cast<size_t>(d), 0.0f), g(static_cast<size_t>(ff)), u(g.size()), o(want.size());
      std::vector<int64_t> mine = {0, 1};
      if (ids[static_cast<size_t>(t * k + 1)] < ids[static_cast<size_t>(t * k)]) std::swap(mine[0], mine[1]);
      for (int64_t i : mine) {
        const int64_t e = ids[static_cast<size_t>(t * k + i)];
        b->matmul(rows(w.gate, e * ff, ff), x.data() + t * d, 1, g.data());
        b->matmul(rows(w.up, e * ff, ff), x.data() + t * d, 1, u.data());
        b->silu_mul(g.data(), u.data(), g.data(), ff);
        b->matmul(rows(w.down, e * d, d), g.data(), 1, o.data());
        for (int64_t j = 0; j < d; ++j) want[static_cast<size_t>(j)] += wts[static_cast<size_t>(t * k + i)] * o[static_cast<size_t>(j)];
      }
      EXPECT_EQ(std::memcmp(got.data() + t * d, want.data(), static_cast<size_t>(d) * 4), 0)
          << dtype_name(type) << " token " << t;
    }
    const std::vector<int32_t> bad = {0, 6};
    EXPECT_THROW(b->moe_experts(w, x.data(), bad.data(), wts.data(), 1, k, got.data()), Error);
  }
}

}  // namespace
}  // namespace duet
