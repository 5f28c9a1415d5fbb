#pragma once
// Several engines' metrics as one, for a server whose engines come and go (a model pool that
// unloads, a live base swap): the counters of engines already gone stay in the totals, so that
// no counter of /metrics ever goes back; the gauges (running, waiting, KV blocks and bytes) are
// the live engines'; the prefix hit rate and the KV waste are means weighted by prompt tokens
// and by used blocks. Speculative decoding's counts (drafted, accepted, verify steps, drafting
// time) are counters: summed, so the acceptance of the sum is the token-weighted mean.
#include <vector>

#include "engine/engine.h"

namespace tern {

class EngineMetricsSum {
 public:
  // An engine is gone: its counters (and its share of the prefix hits) stay in the totals.
  void retire(const EngineMetrics& m);
  // The totals over the retired engines and these live ones.
  EngineMetrics total(const std::vector<EngineMetrics>& live) const;

 private:
  EngineMetrics retired_;
  double retired_cached_prompt_tokens_ = 0;
};

}  // namespace tern
