#pragma once
// /metrics per rank for `tern serve` under a parallel layout (docs/distributed.md): every few
// seconds rank 0 collects the ranks' busy intervals (dist::collect_timeline, one turn at the
// ranks between steps) and keeps, for each rank, its forward time, micro-batches and tokens since
// start, and the share of the last interval it was busy (a pipeline's stage utilisation: with
// pipeline engines, the slowest stage's is near 1 under load), with what it holds (layers,
// weight bytes, K/V bytes per token). The server's /metrics appends render(): it never waits
// for the ranks.
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "dist/parallel_model.h"

namespace tern {

class RankMetrics {
 public:
  // Samples every `interval_s` on a thread of its own until destroyed.
  explicit RankMetrics(double interval_s = 2.0);
  ~RankMetrics();
  RankMetrics(const RankMetrics&) = delete;
  RankMetrics& operator=(const RankMetrics&) = delete;

  // Prometheus text: tern_rank_busy_seconds_total, tern_rank_micro_batches_total,
  // tern_rank_tokens_total, tern_rank_busy_ratio, tern_rank_weight_bytes,
  // tern_rank_kv_bytes_per_token, each labelled rank, stage, tp_rank (and layers).
  std::string render() const;
  // Collects now (what the thread does every interval). Rank 0 only.
  void sample();

  struct Totals {
    double busy_s = 0;
    int64_t micro_batches = 0, tokens = 0;
    double busy_ratio = 0;  // of the last sample's interval
  };
  std::map<int, Totals> totals() const;

 private:
  double interval_s_;
  mutable std::mutex mu_;
  std::map<int, Totals> totals_;  // by rank
  double last_sample_ = 0;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tern
