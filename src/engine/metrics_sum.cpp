#include "engine/metrics_sum.h"

#include <algorithm>

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
  to.slo_good += m.slo_good;
  to.slo_ttft_missed += m.slo_ttft_missed;
  to.slo_tbt_missed += m.slo_tbt_missed;
  to.requests_refused_queue += m.requests_refused_queue;
  for (size_t b = 0; b < to.step_ms_counts.size(); ++b) to.step_ms_counts[b] += m.step_ms_counts[b];
  to.step_ms_sum += m.step_ms_sum;
  to.steps_over_target += m.steps_over_target;
  to.steps_prefill_cut += m.steps_prefill_cut;
  to.spec_drafted += m.spec_drafted;
  to.spec_accepted += m.spec_accepted;
  to.spec_steps += m.spec_steps;
  to.spec_draft_ms += m.spec_draft_ms;
  to.sparse_visits += m.sparse_visits;
  to.sparse_sparse_visits += m.sparse_sparse_visits;
  to.sparse_neurons += m.sparse_neurons;
  to.sparse_selected += m.sparse_selected;
  to.store_lookups += m.store_lookups;
  to.store_hits += m.store_hits;
  to.store_bytes_read += m.store_bytes_read;
}

}  // namespace

void EngineMetricsSum::retire(const EngineMetrics& m) {
  add_counters(retired_, m);
  retired_cached_prompt_tokens_ += m.prefix_hit_rate * double(m.prompt_tokens_total);
}

EngineMetrics EngineMetricsSum::total(const std::vector<EngineMetrics>& live) const {
  EngineMetrics sum = retired_;
  sum.tbt_target_ms = sum.decode_step_ms = sum.step_cost_error_p50 = sum.step_cost_error_p90 = 0;
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
    // Latency gauges: the strictest live engine's (the one a dashboard should look at).
    sum.tbt_target_ms = std::max(sum.tbt_target_ms, e.tbt_target_ms);
    sum.decode_step_ms = std::max(sum.decode_step_ms, e.decode_step_ms);
    sum.step_cost_error_p50 = std::max(sum.step_cost_error_p50, e.step_cost_error_p50);
    sum.step_cost_error_p90 = std::max(sum.step_cost_error_p90, e.step_cost_error_p90);
    cached += e.prefix_hit_rate * double(e.prompt_tokens_total);
    waste += e.kv_waste_pct * double(e.kv_blocks_used);
    weighed_blocks += e.kv_blocks_used;
  }
  sum.prefix_hit_rate = sum.prompt_tokens_total > 0 ? cached / double(sum.prompt_tokens_total) : 0;
  sum.kv_waste_pct = weighed_blocks > 0 ? waste / double(weighed_blocks) : 0;
  return sum;
}

}  // namespace tern
