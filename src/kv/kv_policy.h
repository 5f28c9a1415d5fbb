#pragma once
// KV-cache eviction (issue #20): which tokens of a sequence stay resident when its cache is
// bounded. Pure logic: no tensors, no model.
//
//   streaming (StreamingLLM): [sinks][ .. evicted .. ][ most recent window ]
//   h2o (Heavy-Hitter Oracle): [sinks][ heaviest accumulated attention ][ most recent ]
//
// Evicted tokens keep their original positions: a new token's RoPE position is next_pos(), not
// the number of resident tokens.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tern {

enum class KvPolicyKind { None, Streaming, H2O };

struct KvPolicy {
  KvPolicyKind kind = KvPolicyKind::None;
  int64_t sinks = 4;         // first positions always kept (streaming and h2o)
  int64_t window = 0;        // streaming: recent positions kept; h2o: recent positions never
                             // evicted, 0 = half the capacity (recent_of())
  int64_t budget = 0;        // h2o: most tokens resident (absolute), 0 when budget_frac is used
  double budget_frac = 0.0;  // h2o: budget as a fraction of the context (from "50%")
  // streaming: the sinks' keys are re-rotated to sit just before the window, so every distance
  // a query sees is one it saw in training (StreamingLLM's positions within the cache); false:
  // every key keeps its original position.
  bool sinks_follow = true;
  // h2o: rank by mean attention (accumulated mass / queries since the token arrived) instead of
  // the paper's plain sum, which keeps old tokens for having been seen more often (docs/kv.md:
  // the mean is closer to the full cache on every model measured).
  bool h2o_mean = true;

  bool evicts() const { return kind != KvPolicyKind::None; }
  // Most tokens resident at once for a context of n_ctx, never more than n_ctx: streaming
  // sinks + window; h2o budget or ceil(budget_frac * n_ctx), at least sinks + window + 1;
  // None: n_ctx.
  int64_t capacity(int64_t n_ctx) const;
  // H2O's protected recent tokens under `capacity`: window, or by default half the capacity
  // (the H2O paper's split: half heavy hitters, the sinks among them, half recent); at most
  // capacity - sinks - 1 so one heavy-hitter place remains. Streaming: window. None: 0.
  int64_t recent_of(int64_t capacity) const;
  // Throws tern::Error when the policy cannot run in a context of n_ctx: no room beyond the
  // sinks, or a streaming / explicit h2o window that does not fit.
  void check_fits(int64_t n_ctx) const;
  // "none", "streaming (4 sinks + 252 window)", "h2o (budget 50%, 4 sinks, 32 recent)".
  std::string describe() const;
};

// From the CLI's values: kind "none" | "streaming" | "h2o"; sinks; window (0 = not given);
// budget "" (not given), "N" tokens or "P%" of the context (h2o only). Throws tern::Error naming
// the flag (--kv-policy, --sinks, --window, --kv-budget) for anything it cannot run: an unknown
// kind, negative numbers, streaming without a window or with a window smaller than the sinks,
// h2o without a budget, a zero budget, a percent outside (0, 100], junk, an absolute h2o budget
// with no room beyond sinks + window, and --kv-budget / --window with a policy that ignores them.
KvPolicy make_kv_policy(const std::string& kind, int64_t sinks, int64_t window,
                        const std::string& budget);

// One sequence's resident tokens under a policy: which positions are in the cache and in which
// slot, in position order (positions, slots and H2O's accumulated mass are parallel vectors).
// The caller owns the slots: make_room() / truncate() return the ones it may reuse. Each call
// is O(size()).
class KvResidency {
 public:
  explicit KvResidency(const KvPolicy& p = {});

  const KvPolicy& policy() const { return policy_; }
  // A new token at `pos` (> every earlier one) had its K/V written into `slot`.
  void append(int64_t pos, int32_t slot);
  int64_t size() const { return int64_t(positions_.size()); }
  std::span<const int32_t> slots() const { return slots_; }          // in position order
  std::span<const int64_t> positions() const { return positions_; }  // original, ascending
  // A new token's RoPE position: 1 + the last appended position (0 when none).
  int64_t next_pos() const { return next_pos_; }
  // H2O: adds mass[i] (e.g. the sum over layers and heads of its softmax probability) to
  // resident token i's accumulated attention. Ignored by the other policies.
  void add_mass(std::span<const float> mass);
  std::span<const double> mass() const { return mass_; }
  // Before a step of n_new tokens: evicts until size() + n_new <= capacity and returns the freed
  // slots, in position order (their K/V may be overwritten). The first `sinks` resident tokens
  // are never evicted. Streaming: the oldest after the sinks go first. H2O: among the tokens that
  // are neither sinks nor among the last recent_of(capacity) resident ones, the lowest
  // accumulated mass goes first (ties: the older); when those are not enough, the oldest
  // protected recent ones follow. Throws tern::Error when n_new > capacity - sinks (the step
  // itself cannot fit: the caller chunks it), or for None when the tokens exceed the capacity.
  std::vector<int32_t> make_room(int64_t n_new, int64_t capacity);
  // Keeps the first n resident tokens (a conversation truncated, a speculation rejected) and
  // returns the dropped slots. next_pos() becomes the first dropped position: tokens evicted
  // before it stay part of the sequence. Not counted in n_evicted().
  std::vector<int32_t> truncate(int64_t n);
  // Forgets everything (n_evicted() and next_pos() included): a new sequence.
  void clear();
  int64_t n_evicted() const { return n_evicted_; }  // tokens evicted by make_room so far

 private:
  void compact(std::vector<int32_t>& freed);  // drops the tokens marked in evict_

  KvPolicy policy_;
  std::vector<int64_t> positions_;
  std::vector<int32_t> slots_;
  std::vector<double> mass_;  // double: a sum over many steps
  int64_t next_pos_ = 0;
  int64_t n_evicted_ = 0;
  std::vector<char> evict_;       // scratch: marks of one make_room
  std::vector<int64_t> order_;    // scratch: H2O candidates
};

}  // namespace tern
