#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <new>
#include <stdexcept>
#include <thread>
#include <utility>
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

// Ranges start on whole chunks of the grain, carry a valid thread index, and are claimed as the
// threads go: a thread that is held up gets less of the work instead of making the others wait
// for its fixed share.
TEST(ThreadPool, ParallelRangesAreWholeChunksSharedByWhoeverIsFree) {
  ThreadPool pool(2);
  const int64_t n = 6400, grain = 16;
  std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
  std::atomic<int64_t> by_thread[2] = {0, 0};
  pool.parallel_ranges(n, grain, [&](int tid, int64_t b, int64_t e) {
    ASSERT_TRUE(tid == 0 || tid == 1) << tid;
    EXPECT_EQ(b % grain, 0);
    EXPECT_TRUE(e == n || e % grain == 0) << e;
    if (tid == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a slow core
    by_thread[tid] += e - b;
    for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)].load(), 1) << i;
  // A static split gives each thread half; here the held-up thread takes one range of at most a
  // third (a share of what was left when it claimed) while the other does the rest.
  EXPECT_LE(by_thread[1].load(), n / 3) << by_thread[0].load() << " / " << by_thread[1].load();
}

// Each claim is a share of what is left: in the order of the range they cover (the order they
// were claimed), claims never grow, the first is a third of the work for two threads, and the
// last ones are single chunks, so no thread is left holding a large range at the end.
TEST(ThreadPool, ClaimsShrinkToSingleChunksAtTheEnd) {
  ThreadPool pool(2);
  const int64_t n = 1000 * 16 + 5, grain = 16;
  std::mutex mutex;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  pool.parallel_ranges(n, grain, [&](int, int64_t b, int64_t e) {
    const std::lock_guard<std::mutex> lock(mutex);
    ranges.emplace_back(b, e);
  });
  std::sort(ranges.begin(), ranges.end());
  ASSERT_GE(ranges.size(), 3u);
  EXPECT_EQ(ranges.front().first, 0);
  EXPECT_EQ(ranges.front().second, 1001 / 3 * grain);
  for (size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_EQ(ranges[i].first, ranges[i - 1].second);
    EXPECT_LE(ranges[i].second - ranges[i].first, ranges[i - 1].second - ranges[i - 1].first) << i;
  }
  EXPECT_EQ(ranges.back().second, n);
  EXPECT_EQ(ranges.back().second - ranges.back().first, 5);  // the short last chunk
  EXPECT_EQ(ranges[ranges.size() - 2].second - ranges[ranges.size() - 2].first, grain);
  EXPECT_LT(ranges.size(), 60u);  // a few dozen atomics, not one per chunk
}

// A job that throws on a worker: run() waits for every thread to finish the job, then rethrows
// the exception to its caller; the pool takes the next job as before. (A worker's exception once
// left its thread, and std::terminate ended the process.)
TEST(ThreadPool, AWorkersExceptionReachesTheCaller) {
  ThreadPool pool(3);
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> finished{0};
    try {
      pool.run([&](int tid, int) {
        if (tid == 2) throw std::runtime_error("worker 2 failed");
        finished.fetch_add(1);
      });
      FAIL() << "run() returned normally";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "worker 2 failed");
    }
    EXPECT_EQ(finished.load(), 2);
  }
  std::atomic<int> ran{0};
  pool.run([&](int, int) { ran.fetch_add(1); });
  EXPECT_EQ(ran.load(), 3);
}

// An exception in the caller's own share does not leave run() while workers still run the job
// (they may use what the caller's frame holds): the workers finish first.
TEST(ThreadPool, TheCallersExceptionWaitsForTheWorkers) {
  ThreadPool pool(3);
  for (int round = 0; round < 5; ++round) {
    std::atomic<int> finished{0};
    try {
      pool.run([&](int tid, int) {
        if (tid == 0) throw std::runtime_error("caller failed");
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        finished.fetch_add(1);
      });
      FAIL() << "run() returned normally";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "caller failed");
    }
    EXPECT_EQ(finished.load(), 2) << "run() let the exception go before the workers were done";
  }
  // Errors in several threads: one of them comes back (the caller's first), never a crash.
  EXPECT_THROW(pool.run([](int, int) { throw std::length_error("all"); }), std::length_error);
  EXPECT_THROW(pool.parallel_for(1000, 1, [](int64_t b, int64_t) {
                 if (b > 0) throw std::bad_alloc();
               }),
               std::bad_alloc);
}

}  // namespace
}  // namespace duet
