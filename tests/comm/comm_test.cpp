// The communicators between real MPI processes: run by CTest under `mpirun -np 2` and `-np 4`
// (see CMakeLists.txt), on loopback. Every collective is checked on every rank against what it
// must give, on MPI and on the shared-memory path, and a rank that does not come makes the
// others fail within the deadline instead of waiting.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "duet/comm/communicator.h"
#include "duet/comm/mpi.h"
#include "duet/comm/shm_communicator.h"
#include "duet/core/error.h"

namespace duet {
namespace {

Communicator* world = nullptr;

// A value whose sum in another order gives other bits: large and small magnitudes mixed.
float part(int rank, int64_t i) {
  const float big = (i % 3 == 0) ? 1e7f : 1.0f;
  return big * static_cast<float>((rank % 2 == 0) ? 1 : -1) * (1.0f + 0.37f * static_cast<float>(rank)) +
         0.001f * static_cast<float>(i % 17) + 1e-4f * static_cast<float>(rank);
}

enum class Path { kMpi, kShm };

std::unique_ptr<Communicator> make(Path path) {
  std::unique_ptr<Communicator> c = world->split(0, world->rank());
  c->set_timeout(std::chrono::seconds(20));
  if (path == Path::kShm) return make_shm_communicator(std::move(c), 1 << 16);
  return c;
}

class Collectives : public ::testing::TestWithParam<Path> {};

TEST_P(Collectives, AllreduceAddsInRankOrderOnEveryRank) {
  auto c = make(GetParam());
  // Sizes on both sides of the shared-memory path's limit (64 KiB here).
  for (int64_t count : {1, 7, 1000, 16384, 40000}) {
    std::vector<float> data(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) data[static_cast<size_t>(i)] = part(c->rank(), i);
    c->allreduce_sum(data.data(), count);
    for (int64_t i = 0; i < count; ++i) {
      float want = part(0, i);
      for (int r = 1; r < c->size(); ++r) want += part(r, i);
      ASSERT_EQ(std::memcmp(&want, &data[static_cast<size_t>(i)], sizeof(float)), 0)
          << "count " << count << " element " << i << ": " << data[static_cast<size_t>(i)] << " != " << want
          << " on rank " << c->rank();
    }
  }
}

TEST_P(Collectives, AllgatherAllToAllBroadcast) {
  auto c = make(GetParam());
  const int n = c->size(), me = c->rank();
  for (size_t bytes : {size_t{1}, size_t{1000}, size_t{70000}}) {
    std::vector<uint8_t> mine(bytes), all(bytes * static_cast<size_t>(n));
    for (size_t i = 0; i < bytes; ++i) mine[i] = static_cast<uint8_t>(me * 31 + i);
    c->allgather(mine.data(), all.data(), bytes);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(all[static_cast<size_t>(r) * bytes + i], static_cast<uint8_t>(r * 31 + i));
    }
    // Rank r sends (r, d, i) to d.
    std::vector<uint8_t> out(bytes * static_cast<size_t>(n)), in(bytes * static_cast<size_t>(n));
    for (int d = 0; d < n; ++d) {
      for (size_t i = 0; i < bytes; ++i) out[static_cast<size_t>(d) * bytes + i] = static_cast<uint8_t>(me * 16 + d + i);
    }
    c->all_to_all(out.data(), in.data(), bytes);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(in[static_cast<size_t>(r) * bytes + i], static_cast<uint8_t>(r * 16 + me + i));
    }
    const int root = n - 1;
    std::vector<uint8_t> b(bytes, me == root ? 7 : 0);
    if (me == root) b.back() = 99;
    c->broadcast(b.data(), bytes, root);
    ASSERT_EQ(b.front(), bytes == 1 ? 99 : 7);
    ASSERT_EQ(b.back(), 99);
  }
  c->barrier();
}

TEST_P(Collectives, PointToPointAndMessagesOfAnySize) {
  auto c = make(GetParam());
  const int n = c->size(), me = c->rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  // A ring: even ranks send first, so nothing waits in a circle.
  std::vector<int32_t> out(5000, me), in(5000, -1);
  if (me % 2 == 0) {
    c->send(out.data(), out.size() * 4, next, 3);
    c->recv(in.data(), in.size() * 4, prev, 3);
  } else {
    c->recv(in.data(), in.size() * 4, prev, 3);
    c->send(out.data(), out.size() * 4, next, 3);
  }
  EXPECT_EQ(in.front(), prev);
  EXPECT_EQ(in.back(), prev);
  // Rank 0 sends each rank a message of its own length; nothing comes with another tag.
  std::vector<uint8_t> msg;
  if (me == 0) {
    for (int r = 1; r < n; ++r) {
      std::vector<uint8_t> m(static_cast<size_t>(100 * r + 1), static_cast<uint8_t>(r));
      c->send(m.data(), m.size(), r, 9);
    }
  } else {
    EXPECT_FALSE(c->recv_message(msg, 0, 10, std::chrono::milliseconds(50)));
    ASSERT_TRUE(c->recv_message(msg, 0, 9, std::chrono::seconds(10)));
    EXPECT_EQ(msg.size(), static_cast<size_t>(100 * me + 1));
    EXPECT_EQ(msg.back(), static_cast<uint8_t>(me));
  }
  c->barrier();
}

TEST_P(Collectives, SplitGroupsWorkApart) {
  auto c = make(GetParam());
  // Two groups (even and odd ranks), each numbered by world rank.
  auto g = c->split(c->rank() % 2, c->rank());
  EXPECT_EQ(g->rank(), c->rank() / 2);
  EXPECT_EQ(g->size(), (c->size() + 1 - c->rank() % 2) / 2);
  float x = static_cast<float>(c->rank());
  g->allreduce_sum(&x, 1);
  float want = 0;
  for (int r = c->rank() % 2; r < c->size(); r += 2) want += static_cast<float>(r);
  EXPECT_EQ(x, want);
}

TEST_P(Collectives, AMissingRankIsATimeoutNotAHang) {
  auto c = make(GetParam());
  c->set_timeout(std::chrono::milliseconds(500));
  if (c->rank() == 0) {
    const auto start = std::chrono::steady_clock::now();
    try {
      c->barrier();
      ADD_FAILURE() << "a barrier without the other ranks returned";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
      EXPECT_NE(std::string(e.what()).find("did not answer within"), std::string::npos) << e.what();
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(waited, 5.0);
    // Broken from now on: the next operation fails at once.
    EXPECT_TRUE(c->broken());
    EXPECT_THROW(c->allreduce_sum(nullptr, 0), Error);
    std::vector<int> x(1);
    c->set_timeout(std::chrono::milliseconds(200));
    auto w = world->split(0, world->rank());
    w->set_timeout(std::chrono::milliseconds(300));
    EXPECT_THROW(w->recv(x.data(), 4, 1, 77), Error);  // nobody sends this
  } else {
    auto w = world->split(0, world->rank());
    (void)w;
  }
  world->barrier();
}

INSTANTIATE_TEST_SUITE_P(Paths, Collectives, ::testing::Values(Path::kMpi, Path::kShm),
                         [](const auto& info) { return info.param == Path::kMpi ? "mpi" : "shm"; });

}  // namespace
}  // namespace duet

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!duet::launched_by_mpi() || !duet::mpi_built()) {
    std::fprintf(stderr, "comm_test runs under mpirun with 2 or more ranks (and a build with MPI)\n");
    return 77;
  }
  std::unique_ptr<duet::Communicator> world = duet::init_mpi_world();
  if (world->size() < 2) {
    std::fprintf(stderr, "comm_test needs 2 or more ranks, mpirun gave %d\n", world->size());
    return 77;
  }
  world->set_timeout(std::chrono::seconds(30));
  duet::world = world.get();
  int rc = RUN_ALL_TESTS();
  // Every rank's verdict: the job fails when any rank failed.
  float failed = rc != 0 ? 1.0f : 0.0f;
  world->allreduce_sum(&failed, 1);
  world.reset();
  duet::mpi_finalize();
  return failed > 0 ? 1 : 0;
}
