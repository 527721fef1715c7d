#include <atomic>
#include <vector>

#include <gtest/gtest.h>

#include "duet/core/thread_pool.h"

namespace duet {
namespace {

TEST(ThreadPool, RunsEveryThreadOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    std::vector<std::atomic<int>> hits(static_cast<size_t>(threads));
    for (int round = 0; round < 100; ++round) {
      pool.run([&](int tid, int nth) {
        EXPECT_EQ(nth, threads);
        hits[static_cast<size_t>(tid)].fetch_add(1);
      });
    }
    for (auto& h : hits) EXPECT_EQ(h.load(), 100);
  }
}

TEST(ThreadPool, ParallelForCoversTheRangeExactlyOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 7, 31, 32, 33, 1000, 4097}) {
    for (int64_t grain : {1, 16, 5000}) {
      std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
      pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
        EXPECT_LE(0, b);
        EXPECT_LE(e, n);
        for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

}  // namespace
}  // namespace duet
