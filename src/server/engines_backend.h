#pragma once
// Several engines over one model behind one Backend: `tern serve --pp P`'s pipeline engines
// (docs/distributed.md), vLLM's virtual engines. Each engine has its own scheduler and K/V arena
// and runs its steps through its own view of the model (dist::share_parallel_model), so one
// engine's step enters the pipeline while another's is still in the later stages: consecutive
// steps overlap as a step's micro-batches do.
//
// A request goes to the engine with the fewest unfinished requests (ties: the one after the
// engine chosen last; a full queue: the next engine) and stays there; its ids are this backend's
// (engine e's request i is (i - 1) * n + e + 1), and its outputs carry them.
//
// Prefix affinity (with prefix caching on): a request whose prompt begins with the same first
// K/V blocks (up to kAffinityBlocks of them) and runs the same adapters as an earlier one goes to
// the engine that ran that one, whose cache may hold those blocks, unless that engine has more
// than kAffinitySlack unfinished requests beyond the least loaded one (the replica router's rule,
// tools/replica_router.h). A prompt shorter than a block cannot hit a cache: load alone routes it.
#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "server/backend.h"

namespace tern::server {

class EnginesBackend final : public Backend {
 public:
  // The engines (the caller owns, starts and stops them) serve one model: same tokenizer and
  // context. At least one.
  explicit EnginesBackend(std::vector<Engine*> engines);
  uint64_t add_request(RequestParams params, OutputCallback on_output) override;
  void abort(uint64_t request_id) override;
  EngineMetrics metrics() const override;  // summed over the engines (engine/metrics_sum.h)
  int64_t n_ctx() const override;
  const Tokenizer& tokenizer() const override;
  bool evicts_by_default() const override;
  // Unfinished requests on each engine (the routing's measure).
  std::vector<int64_t> load() const;
  // Requests sent to the engine that ran their prompt's beginning before.
  int64_t affinity_hits() const { return affinity_hits_.load(); }

  static constexpr int64_t kAffinityBlocks = 4;
  static constexpr int64_t kAffinitySlack = 2;

 private:
  std::vector<Engine*> engines_;
  // [engine] requests added and not yet finished (every completion's final output seen). Shared
  // with the requests' callbacks, which may run after this backend is gone (an engine destroyed
  // with requests in it ends them).
  std::shared_ptr<std::vector<std::atomic<int64_t>>> unfinished_;
  std::mutex route_mu_;
  size_t last_ = 0;
  std::unordered_map<uint64_t, size_t> affinity_;  // prompt-prefix key -> the engine that took it (route_mu_)
  std::atomic<int64_t> affinity_hits_{0};
};

}  // namespace tern::server
