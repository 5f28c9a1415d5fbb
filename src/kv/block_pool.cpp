#include "kv/block_pool.h"

#include <algorithm>

#include "core/error.h"

namespace tern {

namespace {

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t block_key(uint64_t parent_key, std::span<const int32_t> tokens) {
  uint64_t h = mix64(parent_key + 0x9E3779B97F4A7C15ull);
  for (int32_t t : tokens) h = mix64(h ^ (uint64_t(uint32_t(t)) + 0x9E3779B97F4A7C15ull));
  return h;
}

BlockPool::BlockPool(int64_t n_blocks, int64_t block_size)
    : n_blocks_(n_blocks), block_size_(block_size) {
  TERN_ASSERT(n_blocks > 0 && n_blocks < (int64_t(1) << 31));
  TERN_ASSERT(block_size > 0 && block_size <= (1 << 16));
  blocks_.resize(size_t(n_blocks));
  tokens_.assign(size_t(n_blocks) * size_t(block_size), 0);
  for (BlockId b = 0; b < BlockId(n_blocks); ++b) push_back(b);
  n_free_ = n_blocks;
  index_.reserve(size_t(n_blocks));
}

void BlockPool::unlink(BlockId b) {
  Block& k = blocks_[size_t(b)];
  if (k.prev != kNoBlock) blocks_[size_t(k.prev)].next = k.next; else head_ = k.next;
  if (k.next != kNoBlock) blocks_[size_t(k.next)].prev = k.prev; else tail_ = k.prev;
  k.prev = k.next = kNoBlock;
}

void BlockPool::push_front(BlockId b) {
  Block& k = blocks_[size_t(b)];
  k.prev = kNoBlock;
  k.next = head_;
  if (head_ != kNoBlock) blocks_[size_t(head_)].prev = b; else tail_ = b;
  head_ = b;
}

void BlockPool::push_back(BlockId b) {
  Block& k = blocks_[size_t(b)];
  k.next = kNoBlock;
  k.prev = tail_;
  if (tail_ != kNoBlock) blocks_[size_t(tail_)].next = b; else head_ = b;
  tail_ = b;
}

void BlockPool::unpublish(BlockId b) {
  Block& k = blocks_[size_t(b)];
  if (!k.published) return;
  auto it = index_.find(k.key);
  TERN_ASSERT(it != index_.end() && it->second == b);
  index_.erase(it);
  k.published = false;
  k.publication = 0;
}

BlockId BlockPool::allocate() {
  if (head_ == kNoBlock) return kNoBlock;
  const BlockId b = head_;
  unlink(b);
  Block& k = blocks_[size_t(b)];
  TERN_ASSERT(k.ref == 0);
  if (k.published) {
    unpublish(b);
    ++n_evictions_;
  }
  k.ref = 1;
  k.filled = 0;
  --n_free_;
  return b;
}

void BlockPool::retain(BlockId b) {
  TERN_ASSERT(b >= 0 && b < BlockId(n_blocks_));
  Block& k = blocks_[size_t(b)];
  if (k.ref == 0) {
    // Only a published block is worth taking back from the free list: its content is known.
    TERN_ASSERT_MSG(k.published, "retaining a free block that holds nothing");
    unlink(b);
    --n_free_;
    n_filled_used_ += k.filled;
  }
  ++k.ref;
}

void BlockPool::release(BlockId b) {
  TERN_ASSERT(b >= 0 && b < BlockId(n_blocks_));
  Block& k = blocks_[size_t(b)];
  TERN_ASSERT_MSG(k.ref > 0, "releasing a free block");
  if (--k.ref > 0) return;
  n_filled_used_ -= k.filled;
  ++n_free_;
  // A cached block waits at the back (evicted last, least recently freed first); a block with
  // nothing reusable goes to the front so it is reused before any cached content is lost.
  if (k.published) push_back(b); else push_front(b);
}

void BlockPool::set_filled(BlockId b, int32_t n) {
  Block& k = blocks_[size_t(b)];
  TERN_ASSERT(k.ref > 0 && n >= 0 && n <= block_size_);
  if (n <= k.filled) return;
  n_filled_used_ += n - k.filled;
  k.filled = n;
}

BlockId BlockPool::lookup(uint64_t key, uint64_t parent_key, std::span<const int32_t> tokens) const {
  auto it = index_.find(key);
  if (it == index_.end()) return kNoBlock;
  const BlockId b = it->second;
  const Block& k = blocks_[size_t(b)];
  if (k.parent_key != parent_key || int64_t(tokens.size()) != block_size_) return kNoBlock;
  const auto stored = tokens_of(b);
  if (!std::equal(tokens.begin(), tokens.end(), stored.begin())) return kNoBlock;
  return b;
}

bool BlockPool::publish(BlockId b, uint64_t key, uint64_t parent_key, std::span<const int32_t> tokens) {
  Block& k = blocks_[size_t(b)];
  TERN_ASSERT(k.ref > 0 && int64_t(tokens.size()) == block_size_);
  if (k.published) return k.key == key;
  if (index_.count(key)) return false;
  index_.emplace(key, b);
  k.published = true;
  k.publication = ++n_publications_;
  k.key = key;
  k.parent_key = parent_key;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + ptrdiff_t(size_t(b) * size_t(block_size_)));
  return true;
}

void BlockPool::check_invariants() const {
  // Walk the free list both ways and compare with the reference counts.
  int64_t n = 0;
  BlockId prev = kNoBlock;
  std::vector<char> on_list(size_t(n_blocks_), 0);
  for (BlockId b = head_; b != kNoBlock; b = blocks_[size_t(b)].next) {
    TERN_ASSERT(blocks_[size_t(b)].ref == 0);
    TERN_ASSERT(blocks_[size_t(b)].prev == prev);
    TERN_ASSERT(!on_list[size_t(b)]);
    on_list[size_t(b)] = 1;
    prev = b;
    ++n;
    TERN_ASSERT(n <= n_blocks_);
  }
  TERN_ASSERT(prev == tail_);
  TERN_ASSERT(n == n_free_);
  int64_t filled = 0, published = 0;
  for (BlockId b = 0; b < BlockId(n_blocks_); ++b) {
    const Block& k = blocks_[size_t(b)];
    TERN_ASSERT(k.ref >= 0);
    TERN_ASSERT((k.ref == 0) == bool(on_list[size_t(b)]));
    TERN_ASSERT(k.filled >= 0 && k.filled <= block_size_);
    if (k.ref > 0) filled += k.filled;
    if (k.published) {
      ++published;
      auto it = index_.find(k.key);
      TERN_ASSERT(it != index_.end() && it->second == b);
    }
  }
  TERN_ASSERT(published == int64_t(index_.size()));
  TERN_ASSERT(filled == n_filled_used_);
}

}  // namespace tern
