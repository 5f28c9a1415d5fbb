#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "core/thread_pool.h"

namespace tern {
namespace {

// Every chunk of every region runs exactly once, also with more threads than cores (workers
// descheduled mid-region) and with regions of very different sizes back to back.
TEST(ThreadPool, EveryChunkRunsExactlyOnce) {
  for (int n_threads : {1, 2, 3, 8}) {
    ThreadPool pool(n_threads);
    std::vector<std::atomic<int>> hits(1000);
    for (int region = 0; region < 2000; ++region) {
      const int64_t n = 1 + (region * 7919) % 1000;
      for (int64_t i = 0; i < n; ++i) hits[size_t(i)].store(0);
      pool.for_chunks(n, [&](int64_t c, int thread) {
        ASSERT_GE(thread, 0);
        ASSERT_LT(thread, n_threads);
        hits[size_t(c)].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "region " << region << " chunk " << i;
    }
  }
}

TEST(ThreadPool, RunAndParallelForCoverEverything) {
  ThreadPool pool(3);
  std::vector<int> seen(3, 0);
  pool.run([&](int ith, int nth) {
    EXPECT_EQ(nth, 3);
    seen[size_t(ith)]++;
  });
  EXPECT_EQ(seen, (std::vector<int>{1, 1, 1}));
  std::vector<std::atomic<int>> cover(1001);
  pool.parallel_for(1001, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) cover[size_t(i)]++;
  });
  for (auto& c : cover) EXPECT_EQ(c.load(), 1);
}

}  // namespace
}  // namespace tern

namespace tern {
namespace {

// Pools built and destroyed back to back, with and without work, never hang in the
// destructor (a worker that starts late must still see the stop signal).
TEST(ThreadPool, CreateDestroyNeverHangs) {
  for (int i = 0; i < 3000; ++i) {
    ThreadPool pool(1 + i % 4);
    if (i % 3 == 0) {
      std::atomic<int> n{0};
      pool.for_chunks(5, [&](int64_t, int) { n++; });
      ASSERT_EQ(n.load(), 5);
    }
  }
}

}  // namespace
}  // namespace tern
