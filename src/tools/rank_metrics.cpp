#include "tools/rank_metrics.h"

#include <chrono>

#include "core/error.h"
#include "core/stats.h"

namespace tern {
namespace {

double now_s() { return double(now_ns()) * 1e-9; }  // the clock of dist::BusyInterval

}  // namespace

RankMetrics::RankMetrics(double interval_s) : interval_s_(interval_s), last_sample_(now_s()) {
  dist::collect_timeline();  // what came before (the engines' start-up calibration) is not served work
  thread_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::duration<double>(interval_s_), [this] { return stop_; })) {
      lock.unlock();
      try {
        sample();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "tern serve: per-rank metrics: %s\n", e.what());
      }
      lock.lock();
    }
  });
}

RankMetrics::~RankMetrics() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void RankMetrics::sample() {
  const std::vector<dist::BusyInterval> iv = dist::collect_timeline();
  const double t = now_s();
  std::map<int, double> busy;
  std::lock_guard lock(mu_);
  for (const dist::BusyInterval& b : iv) {
    Totals& r = totals_[b.rank];
    r.busy_s += b.t1 - b.t0;
    r.micro_batches += 1;
    r.tokens += b.n_tokens;
    busy[b.rank] += b.t1 - b.t0;
  }
  const double window = t - last_sample_;
  for (const dist::RankInfo& info : dist::rank_infos()) {
    Totals& r = totals_[info.rank];
    r.busy_ratio = window > 0 ? std::min(1.0, busy[info.rank] / window) : 0;
  }
  last_sample_ = t;
}

std::map<int, RankMetrics::Totals> RankMetrics::totals() const {
  std::lock_guard lock(mu_);
  return totals_;
}

std::string RankMetrics::render() const {
  const std::vector<dist::RankInfo> infos = dist::rank_infos();
  const std::map<int, Totals> t = totals();
  std::string out;
  const auto labels = [](const dist::RankInfo& i) {
    return str_cat("{rank=\"", i.rank, "\",stage=\"", i.stage, "\",tp_rank=\"", i.tp_rank, "\"}");
  };
  const auto family = [&](const char* name, const char* type, const char* help, auto value) {
    out += str_cat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
    for (const dist::RankInfo& i : infos) {
      const auto it = t.find(i.rank);
      const Totals none;
      out += str_cat(name, labels(i), " ", value(i, it == t.end() ? none : it->second), "\n");
    }
  };
  family("tern_rank_busy_seconds_total", "counter", "Seconds each rank spent running its part of the steps.",
         [](const dist::RankInfo&, const Totals& x) { return x.busy_s; });
  family("tern_rank_micro_batches_total", "counter", "Micro-batches each rank ran (a step is one without a pipeline).",
         [](const dist::RankInfo&, const Totals& x) { return x.micro_batches; });
  family("tern_rank_tokens_total", "counter", "Tokens through each rank's layers.",
         [](const dist::RankInfo&, const Totals& x) { return x.tokens; });
  family("tern_rank_busy_ratio", "gauge",
         "Share of the last sampling interval (about 2 s) each rank was busy: a pipeline stage's utilisation.",
         [](const dist::RankInfo&, const Totals& x) { return x.busy_ratio; });
  family("tern_rank_weight_bytes", "gauge", "Weight bytes each rank holds (its layers, heads and embedding rows).",
         [](const dist::RankInfo& i, const Totals&) { return i.weight_bytes; });
  family("tern_rank_kv_bytes_per_token", "gauge", "K/V bytes (f32) one token takes on each rank.",
         [](const dist::RankInfo& i, const Totals&) { return i.kv_bytes_per_token; });
  family("tern_rank_layer_begin", "gauge", "First layer of each rank's stage.",
         [](const dist::RankInfo& i, const Totals&) { return i.layer_begin; });
  family("tern_rank_layer_end", "gauge", "One past the last layer of each rank's stage.",
         [](const dist::RankInfo& i, const Totals&) { return i.layer_end; });
  return out;
}

}  // namespace tern
