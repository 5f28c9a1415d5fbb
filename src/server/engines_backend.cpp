#include "server/engines_backend.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "engine/metrics_sum.h"
#include "models/lora.h"

namespace tern::server {

EnginesBackend::EnginesBackend(std::vector<Engine*> engines)
    : engines_(std::move(engines)), unfinished_(std::make_shared<std::vector<std::atomic<int64_t>>>(engines_.size())) {
  if (engines_.empty()) fail("EnginesBackend: no engine");
}

namespace {

// What keys a request's prefix affinity: its prompt's first whole K/V blocks (at most `max_blocks`)
// and its adapters; 0 (none) for a prompt shorter than a block.
uint64_t prompt_affinity_key(const RequestParams& p, int64_t block_size, int64_t max_blocks) {
  const int64_t n = std::min<int64_t>(int64_t(p.prompt_ids.size()) / block_size, max_blocks) * block_size;
  if (n == 0) return 0;
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the 32-bit words
  auto mix = [&h](uint64_t v) {
    for (int b = 0; b < 8; ++b) {
      h ^= (v >> (8 * b)) & 0xFF;
      h *= 1099511628211ull;
    }
  };
  for (int64_t i = 0; i < n; ++i) mix(uint32_t(p.prompt_ids[size_t(i)]));
  for (const LoraUse& u : p.lora) {
    uint32_t scale_bits;
    std::memcpy(&scale_bits, &u.scale, sizeof scale_bits);
    mix(u.adapter ? u.adapter->uid() : 0);
    mix(scale_bits);
  }
  return h == 0 ? 1 : h;
}

}  // namespace

uint64_t EnginesBackend::add_request(RequestParams params, OutputCallback on_output) {
  const size_t n = engines_.size();
  const EngineConfig& cfg = engines_[0]->config();
  const uint64_t key = n > 1 && cfg.prefix_caching ? prompt_affinity_key(params, cfg.kv_block_size, kAffinityBlocks) : 0;
  // The engines from the least loaded; among equals, the first after the last one chosen (so that
  // a burst of requests arriving together spreads over the engines). The engine that took the
  // same prompt beginning goes first while it is within the slack.
  std::vector<size_t> order;
  size_t preferred = n;  // the engine of the same prompt beginning, when within the slack
  {
    std::lock_guard lock(route_mu_);
    for (size_t k = 1; k <= n; ++k) order.push_back((last_ + k) % n);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return (*unfinished_)[a].load() < (*unfinished_)[b].load(); });
    if (const auto it = key != 0 ? affinity_.find(key) : affinity_.end();
        it != affinity_.end() && (*unfinished_)[it->second].load() <= (*unfinished_)[order[0]].load() + kAffinitySlack) {
      preferred = it->second;
      order.erase(std::find(order.begin(), order.end(), preferred));
      order.insert(order.begin(), preferred);
    }
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
    if (id != 0) {
      if (key != 0) {
        std::lock_guard lock(route_mu_);
        if (affinity_.size() > 100000) affinity_.clear();  // a bound, not an LRU: it refills as requests come
        affinity_[key] = e;
      }
      if (e == preferred) affinity_hits_.fetch_add(1);
      return (id - 1) * stride + offset;
    }
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
