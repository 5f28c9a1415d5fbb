#pragma once
// A persistent pool of worker threads for the forward pass.
//
// A parallel region is split into chunks that threads *claim* from a shared counter, the
// caller included. Why claiming rather than a fixed slice per thread: on a loaded or
// oversubscribed machine a worker may be descheduled for a whole scheduler tick; with fixed
// slices every region then waits milliseconds for it (llama.cpp's 2-thread decode of a tiny
// model is slower than 1-thread for this reason). Here the caller simply takes the chunks
// nobody has claimed, so a region never waits on a thread that has not started.
//
// Why spin first: a decode step of a small model issues hundreds of regions of a few
// microseconds each; waking sleeping threads through the kernel per region costs more than the
// work. Workers spin on the region counter for a while, then sleep (futex via
// std::atomic::wait), so an idle pool costs no CPU.
//
// Thread-safety: one caller at a time (run()/for_chunks() are not re-entrant or concurrent).
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace tern {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(chunk, thread) once for every chunk in [0, n_chunks); `thread` in [0, size())
  // identifies the executing thread (for per-thread scratch). Returns when all are done.
  template <class Fn>
  void for_chunks(int64_t n_chunks, Fn&& fn) {
    if (n_chunks <= 0) return;
    if (n_threads_ == 1 || n_chunks == 1) {
      for (int64_t c = 0; c < n_chunks; ++c) fn(c, 0);
      return;
    }
    auto trampoline = [](void* ctx, int64_t chunk, int thread) { (*static_cast<Fn*>(ctx))(chunk, thread); };
    dispatch(trampoline, &fn, n_chunks);
  }

  // ggml-style: fn(ith, nth) once for each ith in [0, nth), nth = size(). Each ith is a
  // chunk, so any thread may run it (use thread_local or ith-indexed scratch, not both).
  template <class Fn>
  void run(Fn&& fn) {
    const int nth = n_threads_;
    for_chunks(nth, [&](int64_t chunk, int) { fn(int(chunk), nth); });
  }

  // Static split of [0, n) into contiguous ranges, one per chunk: fn(begin, end, chunk).
  template <class Fn>
  void parallel_for(int64_t n, Fn&& fn) {
    const int nth = n_threads_;
    const int64_t per = (n + nth - 1) / nth;
    for_chunks(nth, [&](int64_t c, int) {
      const int64_t begin = per * c;
      const int64_t end = begin + per < n ? begin + per : n;
      if (begin < end) fn(begin, end, int(c));
    });
  }

 private:
  using Trampoline = void (*)(void*, int64_t, int);
  void dispatch(Trampoline t, void* ctx, int64_t n_chunks);
  void work_on_region(uint64_t region, int thread);
  void worker_main(int thread);

  int n_threads_;
  std::vector<std::thread> workers_;
  Trampoline task_ = nullptr;
  void* task_ctx_ = nullptr;
  // Region state in one word, so a claim also proves which region it belongs to:
  //   [63..40] region id (24 bits) | [39..20] chunk count (20 bits) | [19..0] next chunk
  alignas(64) std::atomic<uint64_t> work_{0};
  alignas(64) std::atomic<uint32_t> wake_{0};  // bumped per region; workers futex-wait on it
  alignas(64) std::atomic<int64_t> completed_{0};
  alignas(64) std::atomic<int> n_sleeping_{0};
  std::atomic<bool> stop_{false};
  uint64_t region_ = 0;
};

// The work of one pool region in consecutive phases, each split into units; a phase's units
// start only when every unit of the previous phase is done. It replaces one region per
// operation (a fork/join each) by one region per pass.
//
// A phase's n units are split into contiguous ranges, one per thread (thread t owns units
// [n t / n_threads, n (t + 1) / n_threads)), which it claims through a counter of its own (a
// cache line no other thread touches unless it steals); a thread that has run out of its own
// units steals the others' unclaimed ones. So the common case costs about what a
// barrier does, and, as with for_chunks, nothing waits for a thread that is late or
// descheduled: its units are taken by the others.
//
//   PhasedWork w; w.reset({4, 4, 8}, pool.size());          // caller, before the region
//   pool.run([&](int ith, int nth) { w.run(ith, [&](int phase, int unit) { ... }); });
class PhasedWork {
 public:
  // Units per phase (each >= 0) and the region's thread count. Not thread-safe: call before
  // the region starts.
  void reset(const std::vector<int32_t>& units_per_phase, int n_threads);

  // Runs thread ith's units and any it can steal, phase by phase: fn(phase, unit).
  template <class Fn>
  void run(int ith, Fn&& fn) {
    for (int p = 0; p < n_phases_; ++p) {
      if (p > 0) wait_done(p - 1);
      int32_t completed = 0;
      for (int v = 0; v < n_threads_; ++v) {  // own units first (v == 0), then steal
        const int owner = (ith + v) % n_threads_;
        Counter& c = counter(p, owner);
        const int32_t n_own = own_units(p, owner);
        while (c.next.load(std::memory_order_relaxed) < n_own) {
          const int32_t k = c.next.fetch_add(1, std::memory_order_acq_rel);
          if (k >= n_own) break;
          fn(p, int(first_unit(p, owner) + k));
          ++completed;
        }
      }
      if (completed > 0) done_[size_t(p)].count.fetch_add(completed, std::memory_order_release);
    }
  }

 private:
  struct alignas(64) Counter {
    std::atomic<int32_t> next{0};
  };
  struct alignas(64) Done {
    std::atomic<int32_t> count{0};
    int32_t n_units = 0;
  };
  Counter& counter(int phase, int thread) { return counters_[size_t(phase) * size_t(n_threads_) + size_t(thread)]; }
  // Thread t owns the units [first_unit(t), first_unit(t + 1)): neighbouring units (which
  // write neighbouring data: a cache line is shared by two units less often) stay together.
  int32_t first_unit(int phase, int thread) const {
    return int32_t(int64_t(done_[size_t(phase)].n_units) * thread / n_threads_);
  }
  int32_t own_units(int phase, int thread) const { return first_unit(phase, thread + 1) - first_unit(phase, thread); }
  void wait_done(int phase) const;

  std::unique_ptr<Counter[]> counters_;  // [phase][thread]
  std::unique_ptr<Done[]> done_;         // [phase]
  size_t counters_capacity_ = 0, done_capacity_ = 0;
  int n_phases_ = 0;
  int n_threads_ = 1;
};

// Threads to use when the user does not say: the number of cores online (>= 1).
int default_thread_count();

}  // namespace tern
