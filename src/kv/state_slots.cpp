#include "kv/state_slots.h"

#include <algorithm>
#include <functional>

#include "core/error.h"

namespace tern {

StateSlots::StateSlots(int64_t n_seq_slots, int64_t n_snapshot_slots) {
  TERN_ASSERT(n_seq_slots >= 0 && n_snapshot_slots >= 0 && n_seq_slots + n_snapshot_slots < (int64_t(1) << 30));
  seq_used_.assign(size_t(n_seq_slots), 0);
  snaps_.assign(size_t(n_snapshot_slots), Snapshot{});
  for (int64_t s = n_seq_slots - 1; s >= 0; --s) free_.push_back(int32_t(s));
}

int32_t StateSlots::acquire() {
  if (free_.empty()) return -1;
  const int32_t s = free_.back();
  free_.pop_back();
  seq_used_[size_t(s)] = 1;
  return s;
}

void StateSlots::release(int32_t slot) {
  TERN_ASSERT(slot >= 0 && slot < n_seq_slots() && seq_used_[size_t(slot)]);
  seq_used_[size_t(slot)] = 0;
  // Kept sorted highest first, so that the lowest free slot is reused first (a steady state
  // touches few slots).
  free_.insert(std::upper_bound(free_.begin(), free_.end(), slot, std::greater<int32_t>()), slot);
}

int32_t StateSlots::find_snapshot(BlockId b, uint64_t pub) {
  if (pub == 0) return -1;
  for (size_t i = 0; i < snaps_.size(); ++i)
    if (snaps_[i].pub == pub && snaps_[i].block == b) {
      snaps_[i].last_use = ++clock_;
      return int32_t(n_seq_slots() + int64_t(i));
    }
  return -1;
}

int32_t StateSlots::snapshot_slot_for(BlockId b, uint64_t pub) {
  if (snaps_.empty() || pub == 0) return -1;
  size_t victim = 0;
  for (size_t i = 0; i < snaps_.size(); ++i) {
    if (snaps_[i].pub == pub && snaps_[i].block == b) return -1;  // saved already
    if (snaps_[i].last_use < snaps_[victim].last_use) victim = i;  // empty ones have 0
  }
  snaps_[victim] = Snapshot{b, pub, ++clock_};
  return int32_t(n_seq_slots() + int64_t(victim));
}

int32_t StateSlots::replace_snapshot(int32_t slot, BlockId old_b, uint64_t old_pub, BlockId b, uint64_t pub) {
  const int64_t i = int64_t(slot) - n_seq_slots();
  if (pub == 0 || i < 0 || i >= n_snapshot_slots() || snaps_[size_t(i)].block != old_b ||
      snaps_[size_t(i)].pub != old_pub || old_pub == 0)
    return snapshot_slot_for(b, pub);
  for (const Snapshot& sn : snaps_)
    if (sn.pub == pub && sn.block == b) return -1;  // saved already
  snaps_[size_t(i)] = Snapshot{b, pub, ++clock_};
  return slot;
}

int64_t StateSlots::n_snapshots() const {
  return int64_t(std::count_if(snaps_.begin(), snaps_.end(), [](const Snapshot& s) { return s.pub != 0; }));
}

void StateSlots::check_invariants() const {
  TERN_ASSERT(std::is_sorted(free_.begin(), free_.end(), std::greater<int32_t>()));
  TERN_ASSERT(std::adjacent_find(free_.begin(), free_.end()) == free_.end());
  int64_t n_used = 0;
  for (uint8_t u : seq_used_) n_used += u;
  TERN_ASSERT(n_used + int64_t(free_.size()) == n_seq_slots());
  for (int32_t s : free_) TERN_ASSERT(s >= 0 && s < n_seq_slots() && !seq_used_[size_t(s)]);
}

}  // namespace tern
