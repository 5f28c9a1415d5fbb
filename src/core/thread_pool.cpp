#include "core/thread_pool.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "core/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TERN_CPU_RELAX() _mm_pause()
#else
#define TERN_CPU_RELAX() std::this_thread::yield()
#endif

namespace tern {
namespace {

// Roughly 50-100 microseconds of spinning: longer than the gap between two regions of one
// forward pass, much shorter than the gap between two user requests.
constexpr int kSpinIterations = 1 << 14;
constexpr uint64_t kChunkBits = 20;
constexpr uint64_t kChunkMask = (uint64_t(1) << kChunkBits) - 1;
constexpr int64_t kMaxChunks = int64_t(kChunkMask);

inline uint64_t region_of(uint64_t w) { return w >> (2 * kChunkBits); }
inline uint64_t count_of(uint64_t w) { return (w >> kChunkBits) & kChunkMask; }
inline uint64_t next_of(uint64_t w) { return w & kChunkMask; }

// Raw futex calls: libstdc++ 12's std::atomic::wait/notify can miss a wake-up (seen here as
// a hang joining the workers), so the pool talks to the kernel directly.
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  workers_.reserve(size_t(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  wake_.fetch_add(1);
  futex_wake_all(wake_);
  for (auto& w : workers_) w.join();
}

// Claims and runs chunks of `region` until none are left or the region changed.
void ThreadPool::work_on_region(uint64_t region, int thread) {
  uint64_t w = work_.load(std::memory_order_acquire);
  for (;;) {
    if (region_of(w) != region || next_of(w) >= count_of(w)) return;
    if (!work_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    // The successful claim proves `region` is unfinished, so task_ is still its task.
    task_(task_ctx_, int64_t(next_of(w)), thread);
    completed_.fetch_add(1, std::memory_order_acq_rel);
    w = work_.load(std::memory_order_acquire);
  }
}

void ThreadPool::dispatch(Trampoline t, void* ctx, int64_t n_chunks) {
  TERN_ASSERT(n_chunks <= kMaxChunks);
  task_ = t;
  task_ctx_ = ctx;
  completed_.store(0, std::memory_order_relaxed);
  region_ = (region_ + 1) & ((uint64_t(1) << 24) - 1);
  work_.store((region_ << (2 * kChunkBits)) | (uint64_t(n_chunks) << kChunkBits), std::memory_order_seq_cst);
  wake_.fetch_add(1, std::memory_order_seq_cst);
  if (n_sleeping_.load(std::memory_order_seq_cst) > 0) futex_wake_all(wake_);
  work_on_region(region_, 0);
  // Only chunks already claimed by other threads remain; wait for them.
  int spins = 0;
  while (completed_.load(std::memory_order_acquire) != n_chunks) {
    if (++spins < kSpinIterations) {
      TERN_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::worker_main(int thread) {
  // Not wake_.load(): a thread that starts late must still see the increments made since the
  // pool was built (the destructor's included), or it could wait for ever.
  uint32_t seen = 0;
  for (;;) {
    int spins = 0;
    uint32_t cur;
    while ((cur = wake_.load(std::memory_order_acquire)) == seen) {
      if (++spins < kSpinIterations) {
        TERN_CPU_RELAX();
        continue;
      }
      n_sleeping_.fetch_add(1, std::memory_order_seq_cst);
      if (wake_.load(std::memory_order_seq_cst) == seen) futex_wait(wake_, seen);
      n_sleeping_.fetch_sub(1, std::memory_order_seq_cst);
      spins = 0;
    }
    seen = cur;
    if (stop_.load()) return;
    work_on_region(region_of(work_.load(std::memory_order_acquire)), thread);
  }
}

void PhasedWork::reset(const std::vector<int32_t>& units_per_phase, int n_threads) {
  TERN_ASSERT(n_threads >= 1);
  const size_t n_phases = units_per_phase.size();
  if (n_phases > done_capacity_) {
    done_ = std::make_unique<Done[]>(n_phases);
    done_capacity_ = n_phases;
  }
  if (n_phases * size_t(n_threads) > counters_capacity_) {
    counters_ = std::make_unique<Counter[]>(n_phases * size_t(n_threads));
    counters_capacity_ = n_phases * size_t(n_threads);
  }
  n_phases_ = int(n_phases);
  n_threads_ = n_threads;
  for (size_t p = 0; p < n_phases; ++p) {
    TERN_ASSERT(units_per_phase[p] >= 0);
    done_[p].count.store(0, std::memory_order_relaxed);
    done_[p].n_units = units_per_phase[p];
    for (int t = 0; t < n_threads; ++t) counter(int(p), t).next.store(0, std::memory_order_relaxed);
  }
  // The region's start (the pool's dispatch) publishes these stores to the workers.
}

void PhasedWork::wait_done(int phase) const {
  const Done& d = done_[size_t(phase)];
  int spins = 0;
  while (d.count.load(std::memory_order_acquire) < d.n_units) {
    if (++spins < kSpinIterations) {
      TERN_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
}

int default_thread_count() {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace tern
