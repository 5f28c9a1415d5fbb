#include "engine/metrics_sum.h"

namespace tern {
namespace {

void add_counters(EngineMetrics& to, const EngineMetrics& m) {
  to.n_preempted_total += m.n_preempted_total;
  to.prompt_tokens_total += m.prompt_tokens_total;
  to.generated_tokens_total += m.generated_tokens_total;
  to.requests_finished += m.requests_finished;
  to.requests_aborted += m.requests_aborted;
  to.requests_failed += m.requests_failed;
  to.steps += m.steps;
}

}  // namespace

void EngineMetricsSum::retire(const EngineMetrics& m) {
  add_counters(retired_, m);
  retired_cached_prompt_tokens_ += m.prefix_hit_rate * double(m.prompt_tokens_total);
}

EngineMetrics EngineMetricsSum::total(const std::vector<EngineMetrics>& live) const {
  EngineMetrics sum = retired_;
  double cached = retired_cached_prompt_tokens_, waste = 0;
  int64_t weighed_blocks = 0;
  for (const EngineMetrics& e : live) {
    add_counters(sum, e);
    sum.n_running += e.n_running;
    sum.n_waiting += e.n_waiting;
    sum.kv_blocks_total += e.kv_blocks_total;
    sum.kv_blocks_used += e.kv_blocks_used;
    sum.kv_blocks_free += e.kv_blocks_free;
    sum.kv_bytes += e.kv_bytes;
    cached += e.prefix_hit_rate * double(e.prompt_tokens_total);
    waste += e.kv_waste_pct * double(e.kv_blocks_used);
    weighed_blocks += e.kv_blocks_used;
  }
  sum.prefix_hit_rate = sum.prompt_tokens_total > 0 ? cached / double(sum.prompt_tokens_total) : 0;
  sum.kv_waste_pct = weighed_blocks > 0 ? waste / double(weighed_blocks) : 0;
  return sum;
}

}  // namespace tern
