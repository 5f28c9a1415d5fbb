#pragma once
// The pool of fixed-size KV blocks behind the paged cache: reference counts, an LRU free list
// and the content-addressed prefix cache. Pure bookkeeping: no tensors, no model. The K/V
// rows themselves live in the engine's arena at slot = block * block_size + offset.
//
//   free list (ref 0):   front -> [uncached ... | cached, least recently freed ... most recent] <- back
//   allocate() pops the front: blocks holding nothing reusable go first, then the cached block
//   that was freed longest ago (its content is forgotten: an eviction).
//
// A *full* block can be published under a key = hash(parent block's key, its tokens). A later
// sequence whose prompt starts with the same tokens finds the chain of keys and retains those
// blocks instead of recomputing them (a hit on a free cached block takes it off the free list).
// Keys are 64-bit hashes, but each published block also stores its parent key and tokens and a
// lookup compares them, so a hash collision can never alias two different prefixes.
//
// Not thread-safe (owned by the engine thread).
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace tern {

using BlockId = int32_t;
constexpr BlockId kNoBlock = -1;

// Key of the empty prefix: the parent of a sequence's first block.
constexpr uint64_t kRootBlockKey = 0x6b76726f6f74ull;  // "kvroot"

// Key of a full block: its tokens chained with its parent's key.
uint64_t block_key(uint64_t parent_key, std::span<const int32_t> tokens);

class BlockPool {
 public:
  BlockPool(int64_t n_blocks, int64_t block_size);

  int64_t n_blocks() const { return n_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t n_free() const { return n_free_; }           // ref 0, cached ones included
  int64_t n_used() const { return n_blocks_ - n_free_; }
  int64_t n_cached() const { return int64_t(index_.size()); }  // published, held or free
  int64_t n_filled_slots() const { return n_filled_used_; }  // filled slots of used blocks
  uint64_t n_evictions() const { return n_evictions_; }

  // Takes a block off the front of the free list (ref 0 -> 1), forgetting any cached content.
  // Returns kNoBlock when every block is held ("not now", never an error).
  BlockId allocate();
  // Another holder for a held block (fork), or a prefix hit on a free cached one.
  void retain(BlockId b);
  // Drops a holder; at ref 0 the block joins the free list (cached: back, else: front).
  void release(BlockId b);
  int32_t ref_count(BlockId b) const { return blocks_[size_t(b)].ref; }

  // Records that the first n slots of held block b hold K/V (only grows; for the waste figure).
  void set_filled(BlockId b, int32_t n);
  int32_t filled(BlockId b) const { return blocks_[size_t(b)].filled; }

  // The block published with exactly this content, or kNoBlock.
  BlockId lookup(uint64_t key, uint64_t parent_key, std::span<const int32_t> tokens) const;
  // Publishes held, full block b under `key`. Returns false when the content is already
  // published by another block (two sequences computed the same block): b stays private.
  bool publish(BlockId b, uint64_t key, uint64_t parent_key, std::span<const int32_t> tokens);
  bool is_published(BlockId b) const { return blocks_[size_t(b)].published; }
  // A serial number of b's current publication, unique over the pool's life (0: not
  // published): what a snapshot keyed by the block (kv/state_slots.h) compares to tell the
  // content it was taken for from whatever the block holds later.
  uint64_t publication(BlockId b) const { return blocks_[size_t(b)].publication; }
  uint64_t key(BlockId b) const { return blocks_[size_t(b)].key; }  // valid while published

  // Aborts (TERN_ASSERT) when the free list, counts or index disagree. O(n_blocks); for tests.
  void check_invariants() const;

 private:
  struct Block {
    int32_t ref = 0;
    int32_t filled = 0;       // slots holding K/V (0..block_size)
    bool published = false;
    uint64_t publication = 0;  // publication(): 0 while unpublished
    uint64_t key = 0, parent_key = 0;
    BlockId prev = kNoBlock, next = kNoBlock;  // free-list links (valid while ref == 0)
  };
  void unlink(BlockId b);
  void push_front(BlockId b);
  void push_back(BlockId b);
  void unpublish(BlockId b);
  std::span<const int32_t> tokens_of(BlockId b) const {
    return {tokens_.data() + size_t(b) * size_t(block_size_), size_t(block_size_)};
  }

  int64_t n_blocks_, block_size_;
  std::vector<Block> blocks_;        // [n_blocks]
  std::vector<int32_t> tokens_;      // [n_blocks, block_size] content of published blocks
  BlockId head_ = kNoBlock, tail_ = kNoBlock;
  int64_t n_free_ = 0;
  int64_t n_filled_used_ = 0;        // sum of `filled` over blocks with ref > 0
  uint64_t n_evictions_ = 0;
  uint64_t n_publications_ = 0;
  std::unordered_map<uint64_t, BlockId> index_;  // key -> published block
};

}  // namespace tern
