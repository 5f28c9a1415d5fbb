#include "server/engines_backend.h"

#include <algorithm>

#include "core/error.h"
#include "engine/metrics_sum.h"

namespace tern::server {

EnginesBackend::EnginesBackend(std::vector<Engine*> engines)
    : engines_(std::move(engines)), unfinished_(std::make_shared<std::vector<std::atomic<int64_t>>>(engines_.size())) {
  if (engines_.empty()) fail("EnginesBackend: no engine");
}

uint64_t EnginesBackend::add_request(RequestParams params, OutputCallback on_output) {
  const size_t n = engines_.size();
  // The engines from the least loaded; among equals, the first after the last one chosen (so that
  // a burst of requests arriving together spreads over the engines).
  std::vector<size_t> order;
  {
    std::lock_guard lock(route_mu_);
    for (size_t k = 1; k <= n; ++k) order.push_back((last_ + k) % n);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return (*unfinished_)[a].load() < (*unfinished_)[b].load(); });
    last_ = order[0];
  }
  // Each completion of the request ends with one finished output; the request is done with the
  // last of them. A full queue ("not now") sends it to the next engine.
  for (const size_t e : order) {
    auto remaining = std::make_shared<std::atomic<int>>(std::max(1, params.n));
    std::atomic<int64_t>* unfinished = &(*unfinished_)[e];
    const uint64_t stride = n, offset = e + 1;
    OutputCallback forward = [on_output, remaining, counters = unfinished_, unfinished, stride,
                              offset](const RequestOutput& o) {
      if (o.finished && remaining->fetch_sub(1) == 1) unfinished->fetch_sub(1);
      if (!on_output) return;
      RequestOutput mine = o;
      mine.request_id = (o.request_id - 1) * stride + offset;
      on_output(mine);
    };
    unfinished->fetch_add(1);
    uint64_t id = 0;
    try {
      id = engines_[e]->add_request(params, std::move(forward));
    } catch (...) {
      unfinished->fetch_sub(1);
      throw;
    }
    if (id != 0) return (id - 1) * stride + offset;
    unfinished->fetch_sub(1);
  }
  return 0;
}

void EnginesBackend::abort(uint64_t request_id) {
  if (request_id == 0) return;
  const uint64_t n = engines_.size();
  engines_[(request_id - 1) % n]->abort((request_id - 1) / n + 1);
}

EngineMetrics EnginesBackend::metrics() const {
  std::vector<EngineMetrics> live;
  for (const Engine* e : engines_) live.push_back(e->metrics());
  return EngineMetricsSum().total(live);
}

int64_t EnginesBackend::n_ctx() const { return engines_[0]->n_ctx(); }
const Tokenizer& EnginesBackend::tokenizer() const { return engines_[0]->tokenizer(); }
bool EnginesBackend::evicts_by_default() const { return engines_[0]->config().kv_policy.evicts(); }

std::vector<int64_t> EnginesBackend::load() const {
  std::vector<int64_t> out;
  for (const std::atomic<int64_t>& u : *unfinished_) out.push_back(u.load());
  return out;
}

}  // namespace tern::server
