#include "server/model_pool.h"

#include <algorithm>

#include "core/error.h"
#include "runtime/context_fit.h"

namespace tern::server {

ModelPool::Lease::Lease(Lease&& o) noexcept
    : pool_(o.pool_), model_(o.model_), index_(o.index_), load_ns_(o.load_ns_), keep_alive_s_(o.keep_alive_s_) {
  o.pool_ = nullptr;
}

ModelPool::Lease& ModelPool::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = o.pool_;
    model_ = o.model_;
    index_ = o.index_;
    load_ns_ = o.load_ns_;
    keep_alive_s_ = o.keep_alive_s_;
    o.pool_ = nullptr;
  }
  return *this;
}

void ModelPool::Lease::release() {
  if (!pool_) return;
  ModelPool* p = pool_;
  pool_ = nullptr;
  model_ = nullptr;
  p->release(index_, keep_alive_s_);
}

ModelPool::ModelPool(std::vector<PoolModelSpec> models, Loader loader, ModelPoolConfig config)
    : specs_(std::move(models)), loader_(std::move(loader)), config_(config), slots_(specs_.size()) {
  if (config_.max_memory_bytes > 0 && !specs_.empty()) {
    const auto smallest = std::min_element(specs_.begin(), specs_.end(), [](const auto& a, const auto& b) {
      return a.estimated_bytes < b.estimated_bytes;
    });
    if (smallest->estimated_bytes > config_.max_memory_bytes)
      throw std::invalid_argument(str_cat("the memory budget (", format_bytes(config_.max_memory_bytes),
                                          ") is below the smallest model, '", smallest->name, "' (",
                                          format_bytes(smallest->estimated_bytes), "): no model could be loaded"));
  }
}

ModelPool::~ModelPool() {
  std::vector<std::unique_ptr<PooledModel>> models;
  {
    std::lock_guard lock(mu_);
    for (auto& s : slots_) models.push_back(std::move(s.model));
  }
  models.clear();  // outside the lock: an engine's destructor joins its thread
}

double ModelPool::keep_alive_of(size_t index) const {
  const Slot& s = slots_[index];
  if (s.keep_alive_s) return *s.keep_alive_s;
  if (specs_[index].keep_alive_s) return *specs_[index].keep_alive_s;
  return config_.default_keep_alive_s;
}

bool ModelPool::fits(size_t /*index*/, int64_t bytes) const {
  if (config_.max_memory_bytes > 0 && loaded_bytes_ + reserved_bytes_ + bytes > config_.max_memory_bytes) return false;
  if (config_.max_loaded > 0 && n_busy_slots_ + 1 > config_.max_loaded) return false;
  return true;
}

long ModelPool::victim() const {
  long best = -1;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.state != State::Loaded || s.leases > 0) continue;
    if (best < 0 || s.last_used < slots_[size_t(best)].last_used) best = long(i);
  }
  return best;
}

long ModelPool::busy_victim() const {
  long best = -1;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.state != State::Loaded) continue;
    if (best < 0 || s.last_used < slots_[size_t(best)].last_used) best = long(i);
  }
  return best;
}

void ModelPool::unload_locked(size_t index, std::unique_lock<std::mutex>& lock) {
  Slot& s = slots_[index];
  s.state = State::Unloading;
  std::unique_ptr<PooledModel> model = std::move(s.model);
  lock.unlock();
  model.reset();  // the memory is free once this returns: only then does the budget see it free
  lock.lock();
  loaded_bytes_ -= s.bytes;
  s.bytes = 0;
  s.state = State::Unloaded;
  s.expires.reset();
  s.keep_alive_s.reset();
  s.unload_when_idle = false;
  s.draining = false;
  --n_busy_slots_;
  cv_.notify_all();
}

ModelPool::Lease ModelPool::acquire(size_t index) {
  if (index >= slots_.size()) throw std::out_of_range("ModelPool::acquire: no such model");
  const PoolModelSpec& spec = specs_[index];
  if (config_.max_memory_bytes > 0 && spec.estimated_bytes > config_.max_memory_bytes)
    throw PoolError(PoolError::Kind::TooLarge,
                    str_cat("model '", spec.name, "' needs about ", format_bytes(spec.estimated_bytes),
                            ", more than the server's memory budget (", format_bytes(config_.max_memory_bytes), ")"));
  std::unique_lock lock(mu_);
  const auto deadline = Clock::now() + config_.wait_for_room;
  int64_t load_ns = 0;
  long drained = -1;  // the model this request asked to go out, if any
  for (;;) {
    Slot& s = slots_[index];
    if (s.state == State::Loaded && s.draining) {
      cv_.wait(lock);  // it goes out for a waiting load; this request loads it again after
      continue;
    }
    if (s.state == State::Loaded) {
      ++s.leases;
      s.last_used = Clock::now();
      s.expires.reset();
      s.unload_when_idle = false;  // the latest request's wish wins
      Lease l;
      l.pool_ = this;
      l.model_ = s.model.get();
      l.index_ = index;
      l.load_ns_ = load_ns;
      return l;
    }
    if (s.state == State::Loading || s.state == State::Unloading) {
      cv_.wait(lock);  // another request's load (or an unload) of this model: wait for its end
      continue;
    }
    // Unloaded: make room, then load.
    if (!fits(index, spec.estimated_bytes)) {
      const long v = victim();
      if (v >= 0) {
        unload_locked(size_t(v), lock);
        continue;
      }
      // Every loaded model is in use. New requests would keep them so forever: the least
      // recently used one takes no new leases (they wait) and unloads when its last ends.
      if (drained >= 0 && slots_[size_t(drained)].state != State::Loaded) drained = -1;  // it went out
      if (drained < 0 && !std::any_of(slots_.begin(), slots_.end(), [](const Slot& x) { return x.draining; })) {
        drained = busy_victim();
        if (drained >= 0) slots_[size_t(drained)].draining = true;
      }
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !fits(index, spec.estimated_bytes) &&
          victim() < 0) {
        if (drained >= 0 && slots_[size_t(drained)].state == State::Loaded) {
          slots_[size_t(drained)].draining = false;  // giving up: it serves again
          cv_.notify_all();
        }
        std::string in_use;
        for (size_t i = 0; i < slots_.size(); ++i)
          if (slots_[i].state != State::Unloaded)
            in_use += str_cat(in_use.empty() ? "" : ", ", specs_[i].name, " (", format_bytes(slots_[i].bytes), ")");
        throw PoolError(PoolError::Kind::NoRoom,
                        str_cat("model '", spec.name, "' (", format_bytes(spec.estimated_bytes),
                                ") does not fit beside the models in use: ", in_use, "; budget ",
                                config_.max_memory_bytes > 0 ? format_bytes(config_.max_memory_bytes) : "unlimited",
                                config_.max_loaded > 0 ? str_cat(", at most ", config_.max_loaded, " loaded") : ""));
      }
      continue;
    }
    // Room was found another way: the model asked to go out serves again.
    if (drained >= 0 && slots_[size_t(drained)].state == State::Loaded && slots_[size_t(drained)].draining) {
      slots_[size_t(drained)].draining = false;
      cv_.notify_all();
    }
    drained = -1;
    // Reserve the estimate, load outside the lock, then commit the real size or roll back.
    s.state = State::Loading;
    reserved_bytes_ += spec.estimated_bytes;
    ++n_busy_slots_;
    lock.unlock();
    Loaded loaded;
    std::string failure;
    const auto t0 = Clock::now();
    try {
      loaded = loader_(index);
      if (!loaded.model) failure = "the loader returned nothing";
    } catch (const std::exception& e) {
      failure = e.what();
    }
    load_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    lock.lock();
    Slot& t = slots_[index];
    reserved_bytes_ -= spec.estimated_bytes;
    if (!failure.empty()) {
      t.state = State::Unloaded;
      --n_busy_slots_;
      cv_.notify_all();
      throw PoolError(PoolError::Kind::LoadFailed, str_cat("model '", spec.name, "' failed to load: ", failure));
    }
    t.model = std::move(loaded.model);
    t.bytes = loaded.bytes;
    loaded_bytes_ += loaded.bytes;
    t.state = State::Loaded;
    t.last_used = Clock::now();
    // A model bigger than its estimate: idle ones make up the difference where they can.
    while (config_.max_memory_bytes > 0 && loaded_bytes_ + reserved_bytes_ > config_.max_memory_bytes) {
      const long v = victim();
      if (v < 0 || size_t(v) == index) break;
      unload_locked(size_t(v), lock);
    }
    cv_.notify_all();
  }
}

void ModelPool::release(size_t index, std::optional<double> keep_alive_s) {
  std::unique_lock lock(mu_);
  Slot& s = slots_[index];
  if (keep_alive_s) s.keep_alive_s = keep_alive_s;  // the last request's keep_alive wins, as in Ollama
  s.last_used = Clock::now();
  if (--s.leases > 0) return;
  const double keep = keep_alive_of(index);
  if (keep == 0 || s.unload_when_idle || s.draining) {
    unload_locked(index, lock);
    return;
  }
  if (keep > 0) s.expires = s.last_used + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(keep));
  else s.expires.reset();  // forever
  cv_.notify_all();        // an idle model is a possible victim for a waiting load
}

void ModelPool::unload(size_t index) {
  std::unique_lock lock(mu_);
  Slot& s = slots_.at(index);
  if (s.state != State::Loaded) return;
  if (s.leases > 0) {
    s.unload_when_idle = true;
    return;
  }
  unload_locked(index, lock);
}

void ModelPool::collect(Clock::time_point now) {
  std::unique_lock lock(mu_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.state == State::Loaded && s.leases == 0 && s.expires && *s.expires <= now) unload_locked(i, lock);
  }
}

std::vector<ModelPool::Status> ModelPool::status() const {
  std::lock_guard lock(mu_);
  const Clock::time_point now = Clock::now();
  std::vector<Status> out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    Status st;
    st.name = specs_[i].name;
    st.loaded = s.state == State::Loaded;
    st.loading = s.state == State::Loading;
    st.leases = s.leases;
    st.bytes = s.state == State::Loading ? specs_[i].estimated_bytes : s.bytes;
    st.expires = s.expires;
    if (st.loaded && s.leases > 0) {
      // In use: it stays at least until now + its keep_alive (Ollama's /api/ps shows that too).
      const double keep = keep_alive_of(i);
      if (keep >= 0) st.expires = now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(keep));
      else st.expires.reset();
    }
    st.last_used = s.last_used;
    out.push_back(std::move(st));
  }
  return out;
}

int64_t ModelPool::held_bytes() const {
  std::lock_guard lock(mu_);
  return loaded_bytes_ + reserved_bytes_;
}

}  // namespace tern::server
