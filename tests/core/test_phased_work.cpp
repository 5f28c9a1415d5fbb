// PhasedWork: every unit of every phase runs exactly once, no unit starts before the previous
// phase is complete, with more threads than cores and with a thread that arrives late (its
// units are stolen, nobody waits for it).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace tern {
namespace {

// Returns how many units owned by `late_thread` (unit % threads) other threads ran.
int check_phases(ThreadPool& pool, const std::vector<int32_t>& units, int late_thread, int repeat) {
  std::atomic<int> stolen{0};
  PhasedWork work;
  const size_t n_phases = units.size();
  std::vector<std::vector<std::atomic<int>>> hits(n_phases);
  for (size_t p = 0; p < n_phases; ++p) hits[p] = std::vector<std::atomic<int>>(size_t(units[p]));
  std::vector<std::atomic<int>> finished(n_phases);
  for (int r = 0; r < repeat; ++r) {
    for (size_t p = 0; p < n_phases; ++p) {
      finished[p].store(0);
      for (auto& h : hits[p]) h.store(0);
    }
    std::atomic<int> order_errors{0};
    work.reset(units, pool.size());
    pool.run([&](int ith, int) {
      if (ith == late_thread) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      work.run(ith, [&](int phase, int unit) {
        if (unit % pool.size() == late_thread && ith != late_thread) stolen.fetch_add(1);
        if (phase > 0 && finished[size_t(phase - 1)].load() != units[size_t(phase - 1)]) order_errors.fetch_add(1);
        hits[size_t(phase)][size_t(unit)].fetch_add(1);
        finished[size_t(phase)].fetch_add(1);
      });
    });
    EXPECT_EQ(order_errors.load(), 0) << "a unit started before the previous phase was complete";
    for (size_t p = 0; p < n_phases; ++p)
      for (int32_t u = 0; u < units[p]; ++u) EXPECT_EQ(hits[p][size_t(u)].load(), 1) << "phase " << p << " unit " << u;
  }
  return stolen.load();
}

TEST(PhasedWork, EveryUnitOnceAndPhasesInOrder) {
  std::mt19937 rng(7);
  for (int n_threads : {1, 2, 3, 5}) {
    ThreadPool pool(n_threads);
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<int32_t> units(1 + rng() % 30);
      for (auto& u : units) u = int32_t(rng() % 9);  // zero-unit phases included
      check_phases(pool, units, -1, 20);
    }
  }
}

TEST(PhasedWork, ALateThreadsUnitsAreStolen) {
  for (int n_threads : {2, 3}) {
    ThreadPool pool(n_threads);
    // The late thread sleeps 200 ms before claiming anything; the others do not wait for it
    // but take its units (here: all the units it owns, unless they were descheduled for as
    // long as it slept).
    const int stolen = check_phases(pool, {4, 4, 4, 4, 8, 1}, n_threads - 1, 1);
    EXPECT_GT(stolen, 0);
  }
}

}  // namespace
}  // namespace tern
