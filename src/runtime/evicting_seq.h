#pragma once
// One sequence whose KV cache an eviction policy bounds (kv/kv_policy.h), over slots it owns: what
// runtime::Session (every slot of its arena) and the engine (the slots of a sequence's private
// blocks) drive. Each step:
//
//   begin_step(n)  evicts to make room (KvResidency::make_room), places the sinks, hands the new
//                  tokens free slots, and fills the SeqBatch: n_past = the resident keys, pos =
//                  the new tokens' first position, slots = resident slots + new ones, key_mass
//                  (H2O) = a buffer the forward adds each key's attention into
//   forward        Model::forward with that SeqBatch
//   end_step()     records the new tokens (and H2O's masses) and keeps copies of new sinks
//
// Sinks that follow the window (KvPolicy::sinks_follow, StreamingLLM's positions within the
// cache): before a step, the sinks' keys are rewritten rotated to sit just before the window's
// oldest token, from copies of the keys as first stored, so rounding never accumulates. The
// model keeps the copies (Model::keep_sink_keys, in the KvStore: a model spread over processes
// keeps each rank's part on that rank); truncate, clear and release let go of them.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_policy.h"
#include "models/model.h"

namespace tern {

// Throws tern::Error naming `what` (the model file) when the model cannot run `policy`: sliding-
// window layers (their masks measure distances in the cache, which eviction changes), or sinks
// that follow the window in a model whose rotary embedding is not a pure rotation.
void check_policy_for_model(const KvPolicy& policy, const Model& model, const std::string& what);
// Throws tern::Error naming `what` when a cache of `type` cannot run `policy`: kivi2 quantizes
// keys per channel over groups of 32 slots, and an eviction policy refills single slots of
// sealed groups (every new token would requantize its group).
void check_policy_for_kv_type(const KvPolicy& policy, KvType type, const std::string& what);

class EvictingSequence {
 public:
  // capacity: most resident tokens (KvPolicy::capacity); policy.evicts() must hold.
  EvictingSequence(const KvPolicy& policy, int64_t capacity);

  // Slots this sequence may use (its arena, or the blocks it was given). At most `capacity`.
  void add_slots(std::span<const int32_t> slots);
  int64_t n_slots() const { return n_slots_; }

  // Before a forward of `tokens` at positions pos .. pos + n - 1 (pos = every token so far):
  // evicts, places the sinks, and fills sb's n_past, pos, tokens, slots and key_mass. The
  // SeqBatch's spans point into this object until end_step(). tern::Error when the step does
  // not fit beside the sinks (n > capacity - sinks) or there are not enough slots.
  void begin_step(SeqBatch& sb, int64_t pos, std::span<const int32_t> tokens, const Model& model, KvStore& kv);
  // After the forward wrote the step's K/V: records the tokens and H2O's masses.
  void end_step(KvStore& kv, const Model& model);

  // Keeps the tokens before position `pos` (their K/V stay); the rest's slots become free.
  void truncate(int64_t pos, const Model& model, KvStore& kv);
  // Forgets every token (a new sequence, or a recompute); the slots stay this sequence's.
  void clear(const Model& model, KvStore& kv);
  // Forgets the slots too (the engine freed the sequence's blocks, or is about to).
  void release(const Model& model, KvStore& kv);

  int64_t n_resident() const { return residency_.size(); }
  int64_t n_evicted() const { return residency_.n_evicted(); }
  int64_t capacity() const { return capacity_; }
  const KvPolicy& policy() const { return policy_; }

 private:
  void place_sinks(int64_t pos, const Model& model, KvStore& kv);
  void capture_sinks(KvStore& kv, const Model& model);
  void drop_sinks_from(size_t first, const Model& model, KvStore& kv);

  KvPolicy policy_;
  int64_t capacity_;
  KvResidency residency_;
  int64_t n_slots_ = 0;
  std::vector<int32_t> free_slots_;  // a stack: the next slot handed out is at the back
  std::vector<int32_t> step_slots_;  // [n_resident + n] the step's SeqBatch::slots
  std::vector<float> key_mass_;      // [n_resident + n] H2O: the step's key masses
  int64_t step_pos_ = 0, step_n_ = 0, step_keys_ = 0;
  bool in_step_ = false;
  // Sinks that follow the window: the slots of the sinks whose keys the model keeps as first
  // stored (Model::keep_sink_keys), and the shift their stored copies are rotated by now.
  std::vector<int32_t> sink_slots_;
  int64_t sink_shift_ = 0;
};

}  // namespace tern
