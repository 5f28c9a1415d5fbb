#pragma once
// Per-sequence block tables over a BlockPool: the paged KV cache's bookkeeping. Pure logic.
//
// Position p of a sequence lives in KV slot
//
//     slot(p) = blocks[p / block_size] * block_size + p % block_size
//
//   blocks:  [ 7 ][ 2 ][ 9 ]          block_size 4, n_computed 10, n_hashed 2
//   tokens:  0..3  4..7  8 9 . .      <- 2 slots of block 9 allocated but unfilled (waste)
//
// A step follows prepare-then-commit: reserve() makes room for the step's tokens (allocating
// blocks, copying a shared partial block), the forward pass writes K/V, and only then commit()
// advances n_computed and publishes the newly full blocks to the prefix cache. rollback()
// returns what reserve() took, so a failed step or a preemption leaves the pool as it was.
//
// Eviction (kv/kv_policy.h's streaming window over blocks): evict_blocks() releases whole blocks
// that left the window and leaves kNoBlock holes; positions keep their numbers (n_computed does
// not shrink, RoPE positions stay the original ones). resident_slots() maps what is left.
//
//   blocks:  [ 7 ][ -1 ][ -1 ][ 4 ][ 5 ]     sink block 7, two evicted, the window in 4 and 5
//
// A table that evicted stops publishing to the prefix cache: K/V computed after an eviction
// attended to fewer tokens than their prefix, so they are not what a prefix hit needs. Its
// blocks published before the eviction stay valid and cached.
//
// Not thread-safe (owned by the engine thread, through the scheduler).
#include <cstdint>
#include <span>
#include <vector>

#include "kv/block_pool.h"

namespace tern {

// One sequence's share of the cache. Owned by the caller (the scheduler's sequence); every
// mutation goes through KvCacheManager.
struct BlockTable {
  std::vector<BlockId> blocks;        // [ceil(n_reserved / block_size)] block of each position range
  int64_t n_computed = 0;             // positions whose K/V are in the cache (committed)
  int64_t n_reserved = 0;             // positions with a slot (>= n_computed)
  int64_t n_hashed = 0;               // leading full blocks whose key is known (published or not)
  uint64_t last_key = kRootBlockKey;  // key of block n_hashed - 1 (root_key when none)
  // The prefix cache's namespace: blocks chain from this key, so tables with different roots
  // (sequences running different LoRA adapters: same tokens, other K/V) never share a block.
  // Set before the first match_prefix / commit (BlockTable::with_root); kept by free().
  uint64_t root_key = kRootBlockKey;
  int64_t n_evicted_blocks = 0;       // kNoBlock holes left by evict_blocks (no more publishing)
  // > 0: a bounded sequence, whose eviction policy reuses its slots (runtime/evicting_seq.h): it
  // never holds more than cap_blocks blocks however long it grows, its positions map to no block
  // (its owner hands out the slots of `blocks`), and it never shares, matches or publishes a
  // block. Kept by free().
  int64_t cap_blocks = 0;
  static BlockTable with_root(uint64_t root) {
    BlockTable t;
    t.last_key = t.root_key = root;
    return t;
  }
};

// A K/V copy the engine must do before the next forward: the first n_tokens slots of block
// src into block dst, in every layer (copy-on-write of a shared, partially filled block).
struct BlockCopy {
  BlockId src = kNoBlock, dst = kNoBlock;
  int32_t n_tokens = 0;
};

class KvCacheManager {
 public:
  KvCacheManager(int64_t n_blocks, int64_t block_size, bool prefix_caching);

  int64_t block_size() const { return pool_.block_size(); }
  int64_t n_blocks() const { return pool_.n_blocks(); }
  int64_t n_free_blocks() const { return pool_.n_free(); }
  int64_t n_used_blocks() const { return pool_.n_used(); }
  bool prefix_caching() const { return prefix_caching_; }
  const BlockPool& pool() const { return pool_; }

  // For an empty table: retains the cached blocks that hold a prefix of `tokens` and returns
  // how many tokens they cover (a multiple of block_size). At least one token is always left
  // to compute (its logits are what the sequence samples from). 0 without prefix caching.
  int64_t match_prefix(BlockTable& t, std::span<const int32_t> tokens);
  // Keeps only the first n_blocks of the blocks match_prefix() just found (a recurrent model
  // resumes at the deepest one with a state snapshot, kv/state_slots.h): the rest are released,
  // deepest first, and no longer count as prefix-cache hits.
  void truncate_match(BlockTable& t, int64_t n_blocks);
  // The block the prefix cache publishes with the content of t's full, hashed block i (its own,
  // or the one another sequence published first: t's copy then stays private), or kNoBlock.
  // tokens: the sequence's tokens. A state snapshot for position (i + 1) * block_size is keyed
  // by it (kv/state_slots.h).
  BlockId published_block(const BlockTable& t, int64_t i, std::span<const int32_t> tokens) const;

  // Blocks a table holds for its first n positions: ceil(n / block_size), at most cap_blocks.
  int64_t blocks_for(const BlockTable& t, int64_t n) const;
  // Blocks reserve(t, n) would take from the free list (0 when it already has room).
  int64_t blocks_needed(const BlockTable& t, int64_t n) const;
  // Gives positions [n_computed, n_computed + n) a slot: allocates blocks and, when the block
  // being written is shared (after fork()) and partly filled, replaces it by a private copy
  // (appended to pending_copies()). All or nothing: returns false and changes nothing when the
  // pool is short ("not now"). A table has at most one reservation outstanding.
  bool reserve(BlockTable& t, int64_t n);
  // The step's forward pass wrote K/V for positions [n_computed, n_computed + n): advance, and
  // publish blocks that became full. `tokens` are the sequence's tokens (at least n_computed + n).
  void commit(BlockTable& t, int64_t n, std::span<const int32_t> tokens);
  // Returns the slots reserved past n_computed (blocks wholly beyond it go back to the pool).
  void rollback(BlockTable& t);
  // child (empty) shares every block of parent: the n completions of one prompt. Holes stay
  // holes (and the child does not publish either).
  void fork(const BlockTable& parent, BlockTable& child);
  // Releases every block (last block first, so a prefix's deepest blocks are evicted first),
  // skipping holes.
  void free(BlockTable& t);

  // Copies that reservations since the last take_copies() require, in order.
  const std::vector<BlockCopy>& pending_copies() const { return copies_; }
  void clear_copies() { copies_.clear(); }

  // Slot of every position 0 .. n - 1 (n <= n_reserved) appended to `out`. None of them may
  // be evicted (TERN_ASSERT): a table with holes maps through resident_slots().
  void slots(const BlockTable& t, int64_t n, std::vector<int32_t>& out) const;
  // Slots of the positions < n whose block is resident appended to `out`, and their positions
  // to `*positions` when given.
  void resident_slots(const BlockTable& t, int64_t n, std::vector<int32_t>& out,
                      std::vector<int64_t>* positions = nullptr) const;

  // Releases blocks [first_block, first_block + n_blocks) of t, which must be fully computed
  // (a streaming window moved past them), and leaves kNoBlock in their place; holes already
  // there are skipped. A block another table shares or the prefix cache holds stays with them.
  void evict_blocks(BlockTable& t, int64_t first_block, int64_t n_blocks);

  // Allocated-but-unfilled slots over allocated slots of held blocks, in percent.
  double waste_pct() const;
  // Prefix-cache counters since start: tokens looked up, tokens found.
  int64_t n_lookup_tokens() const { return n_lookup_tokens_; }
  int64_t n_hit_tokens() const { return n_hit_tokens_; }

 private:
  BlockPool pool_;
  bool prefix_caching_;
  std::vector<BlockCopy> copies_;
  int64_t n_lookup_tokens_ = 0, n_hit_tokens_ = 0;
};

}  // namespace tern
