#include "runtime/evicting_seq.h"

#include <algorithm>

#include "core/error.h"

namespace tern {

void check_policy_for_model(const KvPolicy& policy, const Model& model, const std::string& what) {
  if (!policy.evicts()) return;
  if (model.hparams().hybrid())
    fail(what, ": --kv-policy ", policy.describe(), " cannot be honoured by this model: ", model.hparams().arch,
         " is a hybrid whose ", model.hparams().ssm.gated_delta ? "gated delta-net" : "Mamba-2",
         " layers keep a fixed-size state per sequence, which has taken in every token "
         "and cannot drop one as its attention layers' K/V would (use --kv-policy none)");
  if (model.hparams().recurrent())
    fail(what, ": --kv-policy ", policy.describe(), " has nothing to evict: ", model.hparams().arch,
         " is a state-space model whose memory is a fixed-size state per sequence, with no K/V cache "
         "(use --kv-policy none; its context is unbounded already)");
  if (model.hparams().is_mla())
    fail(what, ": --kv-policy ", policy.describe(), " is not supported for ", model.hparams().arch,
         ": its cache holds one compressed latent per token shared by every head (multi-head latent attention), "
         "with no per-head keys to weigh or re-rotate (use --kv-policy none)");
  if (model.hparams().n_swa > 0)
    fail(what, ": --kv-policy ", policy.describe(), " cannot be honoured by this model: its sliding-window ",
         "layers mask keys by their distance in the cache, which eviction changes (use --kv-policy none)");
  if (policy.kind == KvPolicyKind::Streaming && policy.sinks_follow && policy.sinks > 0 &&
      !model.rotate_keys(0, nullptr, 0, 0))
    fail(what, ": streaming's sinks cannot follow the window in this model (its rotary embedding is not a ",
         "pure rotation): use --sink-positions original");
}

void check_policy_for_kv_type(const KvPolicy& policy, KvType type, const std::string& what) {
  if (policy.evicts() && type == KvType::Kivi2)
    fail(what, ": --kv-policy ", policy.describe(), " cannot run over a kivi2 cache: KIVI quantizes keys per channel "
         "over groups of 32 slots, and eviction refills single slots of sealed groups, so every new token would "
         "requantize its group (use --kv-type q8_0 or q4_0 with a policy)");
}

EvictingSequence::EvictingSequence(const KvPolicy& policy, int64_t capacity)
    : policy_(policy), capacity_(capacity), residency_(policy) {
  TERN_ASSERT(policy_.evicts() && capacity_ > policy_.sinks);
}

void EvictingSequence::add_slots(std::span<const int32_t> slots) {
  TERN_ASSERT(n_slots_ + int64_t(slots.size()) <= capacity_);
  // Pushed in reverse, so the lowest of them is handed out first.
  for (auto it = slots.rbegin(); it != slots.rend(); ++it) free_slots_.push_back(*it);
  n_slots_ += int64_t(slots.size());
}

void EvictingSequence::begin_step(SeqBatch& sb, int64_t pos, std::span<const int32_t> tokens, const Model& model,
                                  KvStore& kv) {
  TERN_ASSERT(!in_step_);
  const int64_t n = int64_t(tokens.size());
  for (int32_t slot : residency_.make_room(n, capacity_)) free_slots_.push_back(slot);
  if (int64_t(free_slots_.size()) < n)
    fail("kv policy ", policy_.describe(), ": ", n, " new tokens but ", free_slots_.size(), " free slots");
  place_sinks(pos, model, kv);
  step_keys_ = residency_.size();
  step_slots_.assign(residency_.slots().begin(), residency_.slots().end());
  for (int64_t j = 0; j < n; ++j) {
    step_slots_.push_back(free_slots_.back());
    free_slots_.pop_back();
  }
  sb.n_past = step_keys_;
  sb.pos = pos;
  sb.tokens = tokens;
  sb.slots = step_slots_;
  sb.key_mass = nullptr;
  if (policy_.kind == KvPolicyKind::H2O) {
    key_mass_.assign(size_t(step_keys_ + n), 0.0f);
    sb.key_mass = key_mass_.data();
  }
  step_pos_ = pos;
  step_n_ = n;
  in_step_ = true;
}

void EvictingSequence::end_step(KvStore& kv, const Model& model) {
  TERN_ASSERT(in_step_);
  in_step_ = false;
  for (int64_t j = 0; j < step_n_; ++j) residency_.append(step_pos_ + j, step_slots_[size_t(step_keys_ + j)]);
  if (policy_.kind == KvPolicyKind::H2O) residency_.add_mass(key_mass_);
  capture_sinks(kv, model);
}

void EvictingSequence::truncate(int64_t pos, const Model& model, KvStore& kv) {
  TERN_ASSERT(!in_step_);
  const auto p = residency_.positions();
  const int64_t keep = std::lower_bound(p.begin(), p.end(), pos) - p.begin();
  // Sinks past the cut are gone (before their slots are handed out again); the kept ones are
  // placed again at the next step (a token that becomes a sink later is captured at its own
  // rotation).
  if (int64_t(sink_slots_.size()) > keep) drop_sinks_from(size_t(keep), model, kv);
  for (int32_t slot : residency_.truncate(keep)) free_slots_.push_back(slot);
  sink_shift_ = -1;
  if (pos == 0) clear(model, kv);
}

void EvictingSequence::clear(const Model& model, KvStore& kv) {
  TERN_ASSERT(!in_step_);
  drop_sinks_from(0, model, kv);
  for (int32_t slot : residency_.truncate(0)) free_slots_.push_back(slot);
  residency_.clear();
  sink_shift_ = 0;
}

void EvictingSequence::release(const Model& model, KvStore& kv) {
  clear(model, kv);
  free_slots_.clear();
  n_slots_ = 0;
}

void EvictingSequence::drop_sinks_from(size_t first, const Model& model, KvStore& kv) {
  for (size_t i = first; i < sink_slots_.size(); ++i) model.drop_sink_keys(kv, sink_slots_[i]);
  if (sink_slots_.size() > first) sink_slots_.resize(first);
}

// Copies of the sinks' keys as first stored (at their own positions), before anything is evicted:
// every later placement rotates these, so rounding never accumulates.
void EvictingSequence::capture_sinks(KvStore& kv, const Model& model) {
  if (policy_.kind != KvPolicyKind::Streaming || !policy_.sinks_follow) return;
  const int64_t n_sinks = std::min(policy_.sinks, residency_.size());
  while (int64_t(sink_slots_.size()) < n_sinks) {
    const int32_t slot = residency_.slots()[sink_slots_.size()];
    model.keep_sink_keys(kv, slot);
    sink_slots_.push_back(slot);
  }
}

// StreamingLLM's positions within the cache: the sinks sit right before the oldest token of the
// window, so their distance to a query is what it would be had nothing been evicted between
// them (the window's own keys already have those distances).
void EvictingSequence::place_sinks(int64_t pos, const Model& model, KvStore& kv) {
  if (policy_.kind != KvPolicyKind::Streaming || !policy_.sinks_follow || sink_slots_.empty()) return;
  const int64_t n_sinks = int64_t(sink_slots_.size());
  const auto p = residency_.positions();
  if (int64_t(p.size()) < n_sinks) return;
  const int64_t after = int64_t(p.size()) > n_sinks ? p[size_t(n_sinks)] : pos;
  const int64_t shift = after - p[size_t(n_sinks - 1)] - 1;  // positions evicted after the sinks
  if (shift == sink_shift_) return;
  for (int64_t i = 0; i < n_sinks; ++i) {
    TERN_ASSERT(sink_slots_[size_t(i)] == residency_.slots()[size_t(i)]);  // (sinks are never evicted)
    model.place_sink_keys(kv, sink_slots_[size_t(i)], shift);
  }
  sink_shift_ = shift;
}

}  // namespace tern
