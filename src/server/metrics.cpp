#include "server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace tern::server {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size(), 0) {
  std::sort(bounds_.begin(), bounds_.end());
}

void Histogram::observe(double x) {
  // Buckets are cumulative: x counts in every bucket whose bound is >= x.
  const auto first = std::lower_bound(bounds_.begin(), bounds_.end(), x);
  for (auto i = size_t(first - bounds_.begin()); i < counts_.size(); ++i) ++counts_[i];
  ++count_;
  sum_ += x;
}

std::string PrometheusWriter::escape_label(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string PrometheusWriter::format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

void PrometheusWriter::family(const std::string& name, const std::string& type, const std::string& help) {
  out_ += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void PrometheusWriter::sample(const std::string& name, const Labels& labels, double value) {
  // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on the chained
  // operator+ version of the same thing.
  out_ += name;
  if (!labels.empty()) {
    out_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i) out_ += ',';
      out_ += labels[i].first;
      out_ += "=\"";
      out_ += escape_label(labels[i].second);
      out_ += '"';
    }
    out_ += '}';
  }
  out_ += ' ';
  out_ += format_value(value);
  out_ += '\n';
}

void PrometheusWriter::histogram(const std::string& name, const std::string& help, const Histogram& h) {
  family(name, "histogram", help);
  for (size_t i = 0; i < h.bounds().size(); ++i)
    sample(name + "_bucket", {{"le", format_value(h.bounds()[i])}}, double(h.counts()[i]));
  sample(name + "_bucket", {{"le", "+Inf"}}, double(h.count()));
  sample(name + "_sum", {}, h.sum());
  sample(name + "_count", {}, double(h.count()));
}

// Bucket bounds in seconds, chosen for CPU serving: a first token takes milliseconds on a
// tiny model and tens of seconds on a 7B prompt; one decode step 1 ms .. 1 s.
ServerMetrics::ServerMetrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80}),
      tbt_({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5}),
      e2e_({0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640}),
      queue_({0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80}) {}

void ServerMetrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{endpoint, status}];
}

void ServerMetrics::observe_completion(const RequestMetrics& m) {
  std::lock_guard lock(mu_);
  ttft_.observe(m.ttft_ms / 1000.0);
  e2e_.observe(m.e2e_ms / 1000.0);
  queue_.observe(m.queue_ms / 1000.0);
  for (double t : m.tbt_ms) tbt_.observe(t / 1000.0);
}

void ServerMetrics::add_tokens(int64_t prompt, int64_t generated) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}

void ServerMetrics::count_model_request(const std::string& model, int status, int64_t prompt, int64_t generated) {
  std::lock_guard lock(mu_);
  ModelCounts& c = per_model_[model];
  ++c.requests[status];
  c.prompt_tokens += prompt;
  c.generated_tokens += generated;
}

void ServerMetrics::request_started() {
  std::lock_guard lock(mu_);
  ++in_flight_;
}

void ServerMetrics::request_ended() {
  std::lock_guard lock(mu_);
  --in_flight_;
}

uint64_t ServerMetrics::requests(const std::string& endpoint, int status) const {
  std::lock_guard lock(mu_);
  auto it = requests_.find({endpoint, status});
  return it == requests_.end() ? 0 : it->second;
}

std::string ServerMetrics::render(const EngineMetrics& em, const ConnectionCounts& conns,
                                  const std::vector<ModelGauges>& models) const {
  std::lock_guard lock(mu_);
  PrometheusWriter w;
  w.family("tern_requests_total", "counter",
           "HTTP requests answered, by endpoint and status (499: the client disconnected first).");
  for (const auto& [key, n] : requests_)
    w.sample("tern_requests_total", {{"endpoint", key.first}, {"status", std::to_string(key.second)}}, double(n));
  w.family("tern_http_requests_in_flight", "gauge", "Generation requests being served over HTTP now.");
  w.sample("tern_http_requests_in_flight", {}, double(in_flight_));
  w.family("tern_prompt_tokens_total", "counter", "Prompt tokens of the requests served (as in their usage).");
  w.sample("tern_prompt_tokens_total", {}, double(prompt_tokens_));
  w.family("tern_generation_tokens_total", "counter", "Tokens generated for the requests served, aborted ones included.");
  w.sample("tern_generation_tokens_total", {}, double(generated_tokens_));
  w.histogram("tern_time_to_first_token_seconds", "Arrival to first token (TTFT), per completion.", ttft_);
  w.histogram("tern_time_per_output_token_seconds", "Gap between consecutive tokens (TBT).", tbt_);
  w.histogram("tern_e2e_request_latency_seconds", "Arrival to last token, per completion.", e2e_);
  w.histogram("tern_request_queue_time_seconds", "Arrival to first scheduled, per completion.", queue_);

  auto gauge = [&](const char* name, const char* help, double v) {
    w.family(name, "gauge", help);
    w.sample(name, {}, v);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    w.family(name, "counter", help);
    w.sample(name, {}, v);
  };
  gauge("tern_num_requests_running", "Requests (sequences) in the running batch.", double(em.n_running));
  gauge("tern_num_requests_waiting", "Requests waiting to be scheduled.", double(em.n_waiting));
  gauge("tern_kv_blocks_total", "KV cache blocks in the arena.", double(em.kv_blocks_total));
  gauge("tern_kv_blocks_used", "KV cache blocks in use.", double(em.kv_blocks_used));
  gauge("tern_kv_blocks_free", "KV cache blocks free (cached prefix blocks count as free).", double(em.kv_blocks_free));
  gauge("tern_kv_cache_usage_ratio", "Used / total KV blocks.",
        em.kv_blocks_total > 0 ? double(em.kv_blocks_used) / double(em.kv_blocks_total) : 0.0);
  gauge("tern_kv_cache_bytes", "Bytes of the KV arena.", double(em.kv_bytes));
  if (em.state_slots_total > 0) {  // a recurrent (state-space) model: one state per running request
    gauge("tern_state_slots_total", "Recurrent state slots (the most requests running at once).", double(em.state_slots_total));
    gauge("tern_state_slots_used", "Recurrent state slots held by running requests.", double(em.state_slots_used));
    gauge("tern_state_snapshots", "Recurrent states kept at block boundaries for prefix reuse.", double(em.state_snapshots));
  }
  gauge("tern_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache / prompt tokens, since start.",
        em.prefix_hit_rate);
  counter("tern_engine_prompt_tokens_total", "Prompt tokens the engine processed.", double(em.prompt_tokens_total));
  counter("tern_engine_generation_tokens_total", "Tokens the engine generated.", double(em.generated_tokens_total));
  counter("tern_engine_requests_finished_total", "Engine requests finished (stop/length).", double(em.requests_finished));
  counter("tern_engine_requests_aborted_total", "Engine requests aborted.", double(em.requests_aborted));
  counter("tern_engine_requests_failed_total", "Engine requests failed.", double(em.requests_failed));
  counter("tern_engine_preemptions_total", "Times a running request was preempted.", double(em.n_preempted_total));
  counter("tern_engine_steps_total", "Engine steps run.", double(em.steps));
  // Latency objectives (docs/serving.md, "Latency targets").
  {
    const char* name = "tern_engine_step_duration_seconds";
    w.family(name, "histogram", "Wall time of one engine step (what every decoding request waits per token).");
    int64_t cumulative = 0;
    for (size_t b = 0; b < EngineMetrics::kStepMsBounds.size(); ++b) {
      cumulative += em.step_ms_counts[b];
      w.sample(std::string(name) + "_bucket", {{"le", PrometheusWriter::format_value(EngineMetrics::kStepMsBounds[b] / 1000.0)}},
               double(cumulative));
    }
    cumulative += em.step_ms_counts.back();
    w.sample(std::string(name) + "_bucket", {{"le", "+Inf"}}, double(cumulative));
    w.sample(std::string(name) + "_sum", {}, em.step_ms_sum / 1000.0);
    w.sample(std::string(name) + "_count", {}, double(cumulative));
  }
  if (em.sparse_visits > 0) {  // --sparse-ffn (docs/sparsity.md)
    counter("tern_sparse_ffn_visits_total", "Token-layer visits of the dense FFN layers with a predictor.",
            double(em.sparse_visits));
    counter("tern_sparse_ffn_sparse_visits_total", "Of those, the visits that ran the sparse FFN.",
            double(em.sparse_sparse_visits));
    counter("tern_sparse_ffn_neurons_total", "FFN neurons over the sparse visits.", double(em.sparse_neurons));
    counter("tern_sparse_ffn_selected_total", "Neurons the predictor selected over the sparse visits.",
            double(em.sparse_selected));
  }
  if (em.store_lookups > 0) {  // --ram-budget
    counter("tern_neuron_store_lookups_total", "Selected neurons looked up in the neuron store (--ram-budget).",
            double(em.store_lookups));
    counter("tern_neuron_store_hits_total", "Of those, the neurons already in memory.", double(em.store_hits));
    counter("tern_neuron_store_read_bytes_total", "Bytes of neuron bundles read from the model file.",
            double(em.store_bytes_read));
  }
  gauge("tern_tbt_target_seconds", "The step-time (time between tokens) target in force; 0: none.", em.tbt_target_ms / 1000.0);
  gauge("tern_decode_step_seconds", "A one-sequence decode step, as calibrated at start (0: not calibrated).",
        em.decode_step_ms / 1000.0);
  w.family("tern_step_cost_relative_error", "gauge",
           "|predicted - measured| / measured step time of the recent steps (the step-cost model's accuracy).");
  w.sample("tern_step_cost_relative_error", {{"quantile", "0.5"}}, em.step_cost_error_p50);
  w.sample("tern_step_cost_relative_error", {{"quantile", "0.9"}}, em.step_cost_error_p90);
  counter("tern_engine_steps_over_tbt_target_total", "Steps with a decoding request that took longer than the TBT target.",
          double(em.steps_over_target));
  counter("tern_engine_steps_prefill_cut_total", "Steps whose prefill the TBT target cut short.",
          double(em.steps_prefill_cut));
  counter("tern_requests_slo_good_total",
          "Completions that met their TTFT and TBT (mean time per output token) objectives: the goodput.",
          double(em.slo_good));
  counter("tern_requests_ttft_missed_total", "Completions whose first token came later than the TTFT objective.",
          double(em.slo_ttft_missed));
  counter("tern_requests_tbt_missed_total", "Completions whose mean time per output token exceeded the TBT target.",
          double(em.slo_tbt_missed));
  counter("tern_requests_refused_queue_total", "Requests refused (503) because the queue would hold them past --max-queue-ms.",
          double(em.requests_refused_queue));
  // Speculative decoding (docs/speculative.md): zeros when no drafter is configured. The two
  // gauges are derived from the counters since start, so a dashboard needs no rate() to show
  // whether drafting pays.
  counter("tern_spec_draft_tokens_total", "Tokens drafted for verification (prompt lookup or draft model).",
          double(em.spec_drafted));
  counter("tern_spec_accepted_tokens_total", "Drafted tokens the target model accepted.", double(em.spec_accepted));
  counter("tern_spec_verify_steps_total", "Per-sequence decode steps that verified drafts.", double(em.spec_steps));
  gauge("tern_spec_acceptance_rate", "Accepted / drafted tokens since start (0: nothing drafted).",
        em.spec_drafted > 0 ? double(em.spec_accepted) / double(em.spec_drafted) : 0.0);
  gauge("tern_spec_mean_accepted_length",
        "Tokens emitted per verify step, (accepted + steps) / steps, since start (0: no verify step).",
        em.spec_steps > 0 ? double(em.spec_accepted + em.spec_steps) / double(em.spec_steps) : 0.0);
  gauge("tern_http_connections_open", "Client connections open now.", double(conns.open));
  counter("tern_http_connections_accepted_total", "Client connections accepted.", double(conns.accepted));
  counter("tern_http_connections_refused_total", "Connections answered 503 and closed at a connection cap.",
          double(conns.refused));
  counter("tern_http_connections_evicted_total", "Idle or slow connections closed at a cap to admit a new one.",
          double(conns.evicted));
  counter("tern_http_requests_timed_out_total", "Requests answered 408: the client was too slow to send them.",
          double(conns.timed_out));
  // Per model: generation requests and tokens by the model that answered, and each served
  // model's state (so a dashboard sees loads, unloads and who holds memory).
  w.family("tern_model_requests_total", "counter", "Generation requests answered, by model and status.");
  for (const auto& [model, c] : per_model_)
    for (const auto& [status, n] : c.requests)
      w.sample("tern_model_requests_total", {{"model", model}, {"status", std::to_string(status)}}, double(n));
  w.family("tern_model_prompt_tokens_total", "counter", "Prompt tokens of the requests served, by model.");
  for (const auto& [model, c] : per_model_) w.sample("tern_model_prompt_tokens_total", {{"model", model}}, double(c.prompt_tokens));
  w.family("tern_model_generation_tokens_total", "counter", "Tokens generated for the requests served, by model.");
  for (const auto& [model, c] : per_model_)
    w.sample("tern_model_generation_tokens_total", {{"model", model}}, double(c.generated_tokens));
  w.family("tern_model_loaded", "gauge", "1 while the model is loaded, else 0.");
  for (const auto& m : models) w.sample("tern_model_loaded", {{"model", m.model}}, m.loaded ? 1.0 : 0.0);
  w.family("tern_model_memory_bytes", "gauge", "Bytes a loaded model holds (weights, KV cache, buffers).");
  for (const auto& m : models) w.sample("tern_model_memory_bytes", {{"model", m.model}}, double(m.bytes));
  w.family("tern_model_requests_active", "gauge", "Requests holding the model now.");
  for (const auto& m : models) w.sample("tern_model_requests_active", {{"model", m.model}}, double(m.leases));
  return w.text();
}

}  // namespace tern::server
