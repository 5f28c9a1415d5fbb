#include "core/thread_pool.h"

#include <unistd.h>

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#define TERN_CPU_RELAX() _mm_pause()
#else
#define TERN_CPU_RELAX() std::this_thread::yield()
#endif

namespace tern {
namespace {
// About 20-50 microseconds of spinning: longer than the gap between two parallel regions of
// one forward pass, much shorter than the gap between two user requests.
constexpr int kSpinIterations = 1 << 14;
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  epoch_.fetch_add(1);
  epoch_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::dispatch(Trampoline t, void* ctx) {
  task_ = t;
  task_ctx_ = ctx;
  n_done_.store(0, std::memory_order_relaxed);
  epoch_.fetch_add(1, std::memory_order_seq_cst);  // publishes task_ / task_ctx_
  if (n_sleeping_.load(std::memory_order_seq_cst) > 0) epoch_.notify_all();
  t(ctx, 0, n_threads_);
  const int others = n_threads_ - 1;
  int spins = 0;
  while (n_done_.load(std::memory_order_acquire) != others) {
    if (++spins < kSpinIterations) {
      TERN_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::worker_main(int ith) {
  uint32_t seen = epoch_.load();
  for (;;) {
    int spins = 0;
    uint32_t cur;
    while ((cur = epoch_.load(std::memory_order_acquire)) == seen) {
      if (++spins < kSpinIterations) {
        TERN_CPU_RELAX();
        continue;
      }
      n_sleeping_.fetch_add(1, std::memory_order_seq_cst);
      if (epoch_.load(std::memory_order_seq_cst) == seen) epoch_.wait(seen);
      n_sleeping_.fetch_sub(1, std::memory_order_seq_cst);
      spins = 0;
    }
    seen = cur;
    if (stop_.load()) return;
    task_(task_ctx_, ith, n_threads_);
    n_done_.fetch_add(1, std::memory_order_release);
  }
}

int default_thread_count() {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace tern
