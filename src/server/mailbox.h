#pragma once
// Where the engine's callbacks (engine thread) leave items for a handler thread. Shared
// (shared_ptr) by the callbacks and the handler, so a callback that fires after the handler gave
// up (abort on disconnect) still has somewhere to write.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

namespace tern::server {

template <class T>
struct Mailbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<T> items;

  void push(T item) {
    {
      std::lock_guard lock(mu);
      items.push_back(std::move(item));
    }
    cv.notify_one();
  }
  // Moves whatever is queued into `out`, waiting up to `timeout` for the first.
  void take(std::deque<T>& out, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu);
    cv.wait_for(lock, timeout, [&] { return !items.empty(); });
    out.swap(items);
    items.clear();
  }
};

}  // namespace tern::server
