#pragma once
// Recurrent states in the serving engine: which KvStore state slots (kv/kv_store.h) hold a
// running sequence's state and which hold snapshots for prefix reuse. Pure logic: no tensors.
//
// A state-space model (models/mamba.cpp) keeps one fixed-size state per sequence instead of a
// K/V row per token. The store has n_seq + n_snapshot state slots:
//
//   [0, n_seq)                  one per running sequence (acquire / release); a sequence that
//                               is preempted gives its slot back and is recomputed from its
//                               tokens later (its state restarts at position 0)
//   [n_seq, n_seq + n_snapshot) snapshots: the state of some sequence right after the last
//                               token of a full, published prefix-cache block, keyed by that
//                               block and its publication (BlockPool::publication)
//
// A snapshot is only as good as the block it ends: when the pool evicts the block (or publishes
// other content in it), the publication changes and the snapshot is never matched again. A
// new sequence whose prompt starts with cached blocks resumes from the deepest of them that
// has a snapshot (the scheduler copies it into the sequence's slot); K/V blocks past it are
// given back. Snapshots are replaced least recently used first.
//
// Not thread-safe (owned by the engine thread, through the scheduler).
#include <cstdint>
#include <vector>

#include "kv/block_pool.h"

namespace tern {

// A state copy the engine must do before the next forward (or right after a commit, for a
// snapshot being saved): every layer's state of slot src into slot dst.
struct StateCopy {
  int32_t src = -1, dst = -1;
};

class StateSlots {
 public:
  StateSlots(int64_t n_seq_slots, int64_t n_snapshot_slots);

  int64_t n_seq_slots() const { return int64_t(seq_used_.size()); }
  int64_t n_snapshot_slots() const { return int64_t(snaps_.size()); }
  int64_t n_slots() const { return n_seq_slots() + n_snapshot_slots(); }  // what the store holds
  int64_t n_free() const { return int64_t(free_.size()); }

  // A free sequence slot (the lowest), or -1 when every one is held ("not now").
  int32_t acquire();
  void release(int32_t slot);
  bool held(int32_t slot) const { return seq_used_[size_t(slot)] != 0; }

  // The snapshot slot holding the state at the end of block b as published now (publication
  // `pub`, > 0), or -1. A hit makes it the most recently used.
  int32_t find_snapshot(BlockId b, uint64_t pub);
  // A slot to save the state at the end of block b (publication pub) into: -1 when it is saved
  // already or there are no snapshot slots; else a never used slot or the least recently used
  // one (its old snapshot is forgotten), now recorded as b's.
  int32_t snapshot_slot_for(BlockId b, uint64_t pub);
  // Like snapshot_slot_for, but replaces the snapshot in `slot` when it still holds block
  // old_b's publication old_pub (a decoding sequence keeps one snapshot, its deepest, instead
  // of one per block it generates); else as snapshot_slot_for.
  int32_t replace_snapshot(int32_t slot, BlockId old_b, uint64_t old_pub, BlockId b, uint64_t pub);
  int64_t n_snapshots() const;  // slots holding some snapshot (valid or stale)

  // Aborts (TERN_ASSERT) when the free list and the held flags disagree. For tests.
  void check_invariants() const;

 private:
  struct Snapshot {
    BlockId block = kNoBlock;
    uint64_t pub = 0;       // 0: empty
    uint64_t last_use = 0;
  };
  std::vector<uint8_t> seq_used_;  // [n_seq]
  std::vector<int32_t> free_;      // free sequence slots, highest first (acquire pops the lowest)
  std::vector<Snapshot> snaps_;    // [n_snapshot]
  uint64_t clock_ = 0;
};

}  // namespace tern
