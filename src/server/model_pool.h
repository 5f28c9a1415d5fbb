#pragma once
// Which models a multi-model server holds in memory (`tern serve --models DIR`, as Ollama
// does): a request leases a model, loading it when it is not loaded (concurrent requests for one
// model wait for one load); under a memory budget and a count limit the least recently used
// idle model is unloaded to make room; a leased model is never unloaded (when every loaded one
// is in use, the least recently used takes no new leases until it goes idle and out, so a
// waiting load is not starved by a stream of requests); an idle one stays for
// its keep_alive (the last request's, else the model's, else the pool's default), 0 unloading
// it when its last lease ends and a negative value keeping it forever.
//
// Pure logic over a loader callback: what a loaded model is (an engine, a fake in tests) is
// the loader's business, so the rules are tested without a model (tests/server/test_model_pool.cpp).
// Loads and unloads run outside the pool's lock; the bytes of a load in progress count
// against the budget from its start (reserve, then commit the real size or roll back).
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace tern::server {

// A loaded model; its destructor unloads it.
class PooledModel {
 public:
  virtual ~PooledModel() = default;
};

struct PoolModelSpec {
  std::string name;
  int64_t estimated_bytes = 0;         // what a load is expected to hold (weights + KV + buffers)
  std::optional<double> keep_alive_s;  // the model's default (models.json); unset: the pool's
};

struct ModelPoolConfig {
  int64_t max_memory_bytes = 0;        // 0: no budget
  int max_loaded = 0;                  // 0: no limit on the count
  double default_keep_alive_s = 300;   // Ollama's 5 minutes
  // How long a load waits for leased models to go idle when they leave it no room.
  std::chrono::milliseconds wait_for_room{120000};
};

// Why a lease could not be given. `what()` is a sentence for the client.
class PoolError : public std::runtime_error {
 public:
  enum class Kind { TooLarge, NoRoom, LoadFailed };
  PoolError(Kind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

class ModelPool {
 public:
  using Clock = std::chrono::steady_clock;
  struct Loaded {
    std::unique_ptr<PooledModel> model;
    int64_t bytes = 0;  // what it really holds (replaces the estimate)
  };
  // Loads models[index]. Throws (any std::exception) when it cannot: the lease fails with
  // PoolError LoadFailed carrying the message, and a later request tries again.
  using Loader = std::function<Loaded(size_t index)>;

  // A model in use. Move-only; releasing (or destroying) it ends the use.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept;
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { release(); }

    explicit operator bool() const { return pool_ != nullptr; }
    PooledModel& model() const { return *model_; }
    size_t index() const { return index_; }
    int64_t load_ns() const { return load_ns_; }  // time this acquire spent loading (0: was loaded)
    // The request's keep_alive (seconds; < 0 forever, 0 unload when idle); unset: the default.
    void set_keep_alive(std::optional<double> s) { keep_alive_s_ = s; }
    void release();

   private:
    friend class ModelPool;
    ModelPool* pool_ = nullptr;
    PooledModel* model_ = nullptr;
    size_t index_ = 0;
    int64_t load_ns_ = 0;
    std::optional<double> keep_alive_s_;
  };

  // Throws std::invalid_argument when the budget is below the smallest model (naming it and
  // both sizes), as nothing could ever be served.
  ModelPool(std::vector<PoolModelSpec> models, Loader loader, ModelPoolConfig config);
  ~ModelPool();  // unloads everything; leases must have ended
  ModelPool(const ModelPool&) = delete;
  ModelPool& operator=(const ModelPool&) = delete;

  // Leases models[index], loading it (and unloading idle ones) when needed. Throws PoolError:
  // TooLarge (it alone is over the budget), NoRoom (the models in use leave it no room within
  // wait_for_room), LoadFailed.
  Lease acquire(size_t index);
  // Unloads an idle model now (Ollama's keep_alive 0 with nothing to generate); a leased one
  // unloads when its last lease ends. No-op when not loaded.
  void unload(size_t index);
  // Unloads the idle models whose keep_alive ran out by `now`. The server calls it from a timer.
  void collect(Clock::time_point now = Clock::now());

  struct Status {
    std::string name;
    bool loaded = false;
    bool loading = false;
    int leases = 0;
    int64_t bytes = 0;                      // loaded: real; loading: the estimate
    // Loaded: when it unloads if no new request comes (in use: now + its keep_alive, the
    // earliest it can); nullopt: never (keep_alive < 0) or not loaded.
    std::optional<Clock::time_point> expires;
    Clock::time_point last_used{};
  };
  std::vector<Status> status() const;
  int64_t held_bytes() const;  // loaded + reserved by loads in progress
  const std::vector<PoolModelSpec>& models() const { return specs_; }
  const ModelPoolConfig& config() const { return config_; }

 private:
  enum class State { Unloaded, Loading, Loaded, Unloading };
  struct Slot {
    State state = State::Unloaded;
    std::unique_ptr<PooledModel> model;
    int64_t bytes = 0;
    int leases = 0;
    Clock::time_point last_used{};
    std::optional<double> keep_alive_s;  // of the last request that set one
    std::optional<Clock::time_point> expires;
    bool unload_when_idle = false;
    bool draining = false;  // a waiting load needs its room: no new leases, unloads when idle
  };

  void release(size_t index, std::optional<double> keep_alive_s);
  bool fits(size_t index, int64_t bytes) const;       // under mu_
  long victim() const;                                // LRU idle loaded model, -1 none (under mu_)
  long busy_victim() const;                           // LRU loaded model, leased or not
  void unload_locked(size_t index, std::unique_lock<std::mutex>& lock);  // drops the lock while destroying
  double keep_alive_of(size_t index) const;

  std::vector<PoolModelSpec> specs_;
  Loader loader_;
  ModelPoolConfig config_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  int64_t loaded_bytes_ = 0;
  int64_t reserved_bytes_ = 0;
  int n_busy_slots_ = 0;  // Loading + Loaded + Unloading
};

}  // namespace tern::server
