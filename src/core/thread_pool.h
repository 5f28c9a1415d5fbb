#pragma once
// A persistent pool of worker threads for the forward pass.
//
// run(fn) calls fn(ith, nth) once on each of the nth threads (the caller is thread 0) and
// returns when all have finished: the ggml-style "each thread takes its slice" model, so a
// kernel splits its own work and no task objects are allocated per call.
//
// Why spin first: a decode step of a small model issues hundreds of parallel regions of a few
// microseconds each; waking sleeping threads through the kernel per region costs more than the
// work itself (llama.cpp's 2-thread decode of stories260K is slower than 1-thread for this
// reason). Workers spin on an epoch counter for a while, then sleep on it (futex via
// std::atomic::wait), so an idle pool costs no CPU.
//
// Thread-safety: one caller at a time (run() is not re-entrant and not concurrent).
#include <atomic>
#include <cstdint>
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

  template <class Fn>
  void run(Fn&& fn) {
    if (n_threads_ == 1) {
      fn(0, 1);
      return;
    }
    auto trampoline = [](void* ctx, int ith, int nth) { (*static_cast<Fn*>(ctx))(ith, nth); };
    dispatch(trampoline, &fn);
  }

  // Static split of [0, n) into contiguous ranges, one per thread: fn(begin, end, ith).
  template <class Fn>
  void parallel_for(int64_t n, Fn&& fn) {
    run([&](int ith, int nth) {
      const int64_t per = (n + nth - 1) / nth;
      const int64_t begin = per * ith;
      const int64_t end = begin + per < n ? begin + per : n;
      if (begin < end) fn(begin, end, ith);
    });
  }

 private:
  using Trampoline = void (*)(void*, int, int);
  void dispatch(Trampoline t, void* ctx);
  void worker_main(int ith);

  int n_threads_;
  std::vector<std::thread> workers_;
  Trampoline task_ = nullptr;
  void* task_ctx_ = nullptr;
  alignas(64) std::atomic<uint32_t> epoch_{0};
  alignas(64) std::atomic<int> n_done_{0};
  alignas(64) std::atomic<int> n_sleeping_{0};
  std::atomic<bool> stop_{false};
};

// Threads to use when the user does not say: the number of physical cores seen (>= 1).
int default_thread_count();

}  // namespace tern
