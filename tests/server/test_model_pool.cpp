// The model pool of a multi-model server (server/model_pool.h) with a fake loader: loads on
// demand, one load for concurrent requests, LRU eviction of idle models under a byte budget and
// a count limit, leased models never unloaded, keep_alive (0, forever, expiry), failures
// rolled back. The fake tracks what is alive so the budget is checked at every moment.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "server/model_pool.h"

namespace tern::server {
namespace {

using namespace std::chrono_literals;

// Live fake models and their bytes, across the pool's loads and unloads.
struct World {
  std::atomic<int64_t> alive_bytes{0};
  std::atomic<int64_t> peak_bytes{0};
  std::atomic<int> loads{0};
  std::atomic<int> unloads{0};
  std::atomic<bool> fail_next{false};
  std::chrono::milliseconds load_time{0};
};

class FakeModel final : public PooledModel {
 public:
  FakeModel(World& w, size_t index, int64_t bytes) : world(w), index(index), bytes(bytes) {
    const int64_t now = world.alive_bytes.fetch_add(bytes) + bytes;
    int64_t peak = world.peak_bytes.load();
    while (now > peak && !world.peak_bytes.compare_exchange_weak(peak, now)) {
    }
  }
  ~FakeModel() override {
    world.alive_bytes.fetch_sub(bytes);
    world.unloads.fetch_add(1);
  }
  World& world;
  size_t index;
  int64_t bytes;
};

ModelPool::Loader fake_loader(World& w, std::vector<int64_t> real_bytes) {
  return [&w, real_bytes](size_t i) {
    if (w.load_time.count() > 0) std::this_thread::sleep_for(w.load_time);
    if (w.fail_next.exchange(false)) throw std::runtime_error("disk on fire");
    w.loads.fetch_add(1);
    ModelPool::Loaded l;
    l.model = std::make_unique<FakeModel>(w, i, real_bytes[i]);
    l.bytes = real_bytes[i];
    return l;
  };
}

std::vector<PoolModelSpec> three(int64_t each) {
  return {{"a", each, std::nullopt}, {"b", each, std::nullopt}, {"c", each, std::nullopt}};
}

bool loaded(const ModelPool& p, size_t i) { return p.status()[i].loaded; }

TEST(ModelPool, LoadsOnDemandAndEvictsTheLeastRecentlyUsedIdleModel) {
  World w;
  ModelPoolConfig cfg;
  cfg.max_memory_bytes = 250;  // two of three 100-byte models
  ModelPool pool(three(100), fake_loader(w, {100, 100, 100}), cfg);
  EXPECT_FALSE(loaded(pool, 0));
  {
    auto a = pool.acquire(0);
    EXPECT_GE(a.load_ns(), 0);
    auto b = pool.acquire(1);
  }
  EXPECT_TRUE(loaded(pool, 0));
  EXPECT_TRUE(loaded(pool, 1));
  std::this_thread::sleep_for(2ms);
  { auto a = pool.acquire(0); }  // a is now more recent than b
  EXPECT_EQ(w.loads.load(), 2);   // already loaded: no second load
  { auto c = pool.acquire(2); }
  EXPECT_TRUE(loaded(pool, 0));
  EXPECT_FALSE(loaded(pool, 1)) << "b was the least recently used idle model";
  EXPECT_TRUE(loaded(pool, 2));
  EXPECT_EQ(w.loads.load(), 3);
  EXPECT_LE(w.peak_bytes.load(), 250);
  EXPECT_EQ(pool.held_bytes(), 200);
}

TEST(ModelPool, AModelInUseIsNeverUnloaded) {
  World w;
  ModelPoolConfig cfg;
  cfg.max_memory_bytes = 250;
  cfg.wait_for_room = 50ms;
  ModelPool pool(three(100), fake_loader(w, {100, 100, 100}), cfg);
  auto a = pool.acquire(0);  // a stream in flight on a and on b
  auto b = pool.acquire(1);
  try {
    pool.acquire(2);
    FAIL() << "c loaded beside two models in use";
  } catch (const PoolError& e) {
    EXPECT_EQ(e.kind(), PoolError::Kind::NoRoom);
    EXPECT_NE(std::string(e.what()).find("model 'c'"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(loaded(pool, 0));
  EXPECT_TRUE(loaded(pool, 1));
  // The load waits for a model to go idle, then takes its place.
  cfg.wait_for_room = 5s;
  ModelPool pool2(three(100), fake_loader(w, {100, 100, 100}), cfg);
  auto a2 = pool2.acquire(0);
  auto b2 = pool2.acquire(1);
  std::thread t([&] {
    std::this_thread::sleep_for(30ms);
    b2.release();
  });
  auto c2 = pool2.acquire(2);
  t.join();
  EXPECT_TRUE(loaded(pool2, 0));
  EXPECT_FALSE(loaded(pool2, 1));
  EXPECT_TRUE(loaded(pool2, 2));
}

TEST(ModelPool, AModelInUseExpiresNoSoonerThanItsKeepAlive) {
  World w;
  ModelPoolConfig cfg;
  cfg.default_keep_alive_s = 60;
  std::vector<PoolModelSpec> specs = three(10);
  specs[2].keep_alive_s = -1;
  ModelPool pool(specs, fake_loader(w, {10, 10, 10}), cfg);
  auto a = pool.acquire(0);
  auto c = pool.acquire(2);
  const auto before = ModelPool::Clock::now();
  const auto st = pool.status();
  const auto after = ModelPool::Clock::now();
  ASSERT_TRUE(st[0].expires.has_value()) << "in use: now + keep_alive, as Ollama's /api/ps shows";
  EXPECT_GE(*st[0].expires, before + 60s);
  EXPECT_LE(*st[0].expires, after + 60s);
  EXPECT_FALSE(st[1].expires.has_value()) << "not loaded";
  EXPECT_FALSE(st[2].expires.has_value()) << "kept forever";
}

TEST(ModelPool, KeepAliveZeroForeverAndExpiry) {
  World w;
  ModelPoolConfig cfg;
  cfg.default_keep_alive_s = 60;
  std::vector<PoolModelSpec> specs = three(10);
  specs[2].keep_alive_s = -1;  // models.json: keep c forever
  ModelPool pool(specs, fake_loader(w, {10, 10, 10}), cfg);
  {
    auto a = pool.acquire(0);
    a.set_keep_alive(0);
  }
  EXPECT_FALSE(loaded(pool, 0)) << "keep_alive 0 unloads after the request";
  { auto b = pool.acquire(1); }
  { auto c = pool.acquire(2); }
  const auto st = pool.status();
  ASSERT_TRUE(st[1].expires.has_value());
  EXPECT_FALSE(st[2].expires.has_value());
  pool.collect(ModelPool::Clock::now() + 30s);
  EXPECT_TRUE(loaded(pool, 1));
  pool.collect(ModelPool::Clock::now() + 61s);
  EXPECT_FALSE(loaded(pool, 1)) << "expired";
  pool.collect(ModelPool::Clock::now() + std::chrono::hours(24 * 365));
  EXPECT_TRUE(loaded(pool, 2)) << "forever";
  // The last request's keep_alive wins.
  {
    auto c = pool.acquire(2);
    c.set_keep_alive(1);
  }
  pool.collect(ModelPool::Clock::now() + 2s);
  EXPECT_FALSE(loaded(pool, 2));
  // A leased model asked to unload goes when its lease ends.
  auto b = pool.acquire(1);
  pool.unload(1);
  EXPECT_TRUE(loaded(pool, 1));
  b.release();
  EXPECT_FALSE(loaded(pool, 1));
  { auto a = pool.acquire(0); }
  pool.unload(0);
  EXPECT_FALSE(loaded(pool, 0));
}

TEST(ModelPool, ConcurrentRequestsShareOneLoad) {
  World w;
  w.load_time = 50ms;
  ModelPool pool(three(10), fake_loader(w, {10, 10, 10}), {});
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i)
    ts.emplace_back([&] {
      auto l = pool.acquire(1);
      if (dynamic_cast<FakeModel&>(l.model()).index == 1) ok.fetch_add(1);
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), 8);
  EXPECT_EQ(w.loads.load(), 1);
}

TEST(ModelPool, BudgetErrorsSayWhich) {
  World w;
  ModelPoolConfig cfg;
  cfg.max_memory_bytes = 50;
  try {
    ModelPool pool({{"big", 100, std::nullopt}, {"bigger", 200, std::nullopt}}, fake_loader(w, {100, 200}), cfg);
    FAIL() << "a budget below every model was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("smallest model, 'big'"), std::string::npos) << e.what();
  }
  cfg.max_memory_bytes = 150;
  ModelPool pool({{"big", 100, std::nullopt}, {"bigger", 200, std::nullopt}}, fake_loader(w, {100, 200}), cfg);
  try {
    pool.acquire(1);
    FAIL();
  } catch (const PoolError& e) {
    EXPECT_EQ(e.kind(), PoolError::Kind::TooLarge);
    EXPECT_NE(std::string(e.what()).find("'bigger'"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(pool.acquire(0));
}

TEST(ModelPool, AFailedLoadRollsBackAndALaterOneRetries) {
  World w;
  ModelPoolConfig cfg;
  cfg.max_memory_bytes = 100;
  ModelPool pool(three(100), fake_loader(w, {100, 100, 100}), cfg);
  w.fail_next = true;
  try {
    pool.acquire(0);
    FAIL();
  } catch (const PoolError& e) {
    EXPECT_EQ(e.kind(), PoolError::Kind::LoadFailed);
    EXPECT_NE(std::string(e.what()).find("disk on fire"), std::string::npos);
  }
  EXPECT_EQ(pool.held_bytes(), 0);  // the reservation was rolled back
  auto a = pool.acquire(0);
  EXPECT_TRUE(loaded(pool, 0));
}

TEST(ModelPool, CountLimitAndUnderestimatedModels) {
  World w;
  ModelPoolConfig cfg;
  cfg.max_loaded = 1;
  ModelPool pool(three(10), fake_loader(w, {10, 10, 10}), cfg);
  { auto a = pool.acquire(0); }
  { auto b = pool.acquire(1); }
  EXPECT_FALSE(loaded(pool, 0));
  EXPECT_TRUE(loaded(pool, 1));
  // A model that holds more than its estimate pushes idle ones out afterwards.
  World w2;
  ModelPoolConfig cfg2;
  cfg2.max_memory_bytes = 200;
  ModelPool pool2(three(80), fake_loader(w2, {80, 80, 150}), cfg2);
  { auto a = pool2.acquire(0); }
  { auto b = pool2.acquire(1); }
  { auto c = pool2.acquire(2); }  // estimated 80, really 150
  EXPECT_LE(pool2.held_bytes(), 200);
  EXPECT_TRUE(loaded(pool2, 2));
}

// Many threads over three models and a budget for two: every lease gets its own model, the
// live bytes never pass the budget, and nothing is left reserved.
TEST(ModelPool, StressKeepsTheBudget) {
  World w;
  w.load_time = 1ms;
  ModelPoolConfig cfg;
  cfg.max_memory_bytes = 200;
  cfg.default_keep_alive_s = 0.001;
  ModelPool pool(three(100), fake_loader(w, {100, 100, 100}), cfg);
  std::atomic<int> wrong{0}, done{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 12; ++t)
    ts.emplace_back([&, t] {
      std::mt19937 rng{uint32_t(t)};
      for (int i = 0; i < 40; ++i) {
        const size_t m = rng() % 3;
        auto l = pool.acquire(m);
        if (dynamic_cast<FakeModel&>(l.model()).index != m) wrong.fetch_add(1);
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 500));
        if (rng() % 4 == 0) pool.collect();
        done.fetch_add(1);
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(done.load(), 12 * 40);
  EXPECT_LE(w.peak_bytes.load(), 200);
  EXPECT_LE(pool.held_bytes(), 200);
  for (const auto& s : pool.status()) EXPECT_EQ(s.leases, 0);
}

}  // namespace
}  // namespace tern::server
