#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "core/error.h"

namespace tern {

KvCacheManager::KvCacheManager(int64_t n_blocks, int64_t block_size, bool prefix_caching)
    : pool_(n_blocks, block_size), prefix_caching_(prefix_caching) {
  // Slots are int32 in SeqBatch.
  TERN_ASSERT(n_blocks * block_size < (int64_t(1) << 31));
}

int64_t KvCacheManager::blocks_for(const BlockTable& t, int64_t n) const {
  const int64_t bs = block_size();
  const int64_t blocks = (n + bs - 1) / bs;
  return t.cap_blocks > 0 ? std::min(blocks, t.cap_blocks) : blocks;
}

int64_t KvCacheManager::match_prefix(BlockTable& t, std::span<const int32_t> tokens) {
  TERN_ASSERT(t.blocks.empty() && t.n_computed == 0 && t.n_reserved == 0);
  if (!prefix_caching_ || tokens.empty() || t.cap_blocks > 0) return 0;
  const int64_t bs = block_size();
  // Leave the last token to compute: its logits are needed, and a block is never written twice.
  const int64_t max_blocks = (int64_t(tokens.size()) - 1) / bs;
  uint64_t parent = t.root_key;
  int64_t n = 0;
  for (; n < max_blocks; ++n) {
    const auto toks = tokens.subspan(size_t(n * bs), size_t(bs));
    const uint64_t key = block_key(parent, toks);
    const BlockId b = pool_.lookup(key, parent, toks);
    if (b == kNoBlock) break;
    pool_.retain(b);
    t.blocks.push_back(b);
    parent = key;
  }
  t.n_computed = t.n_reserved = n * bs;
  t.n_hashed = n;
  t.last_key = parent;
  n_lookup_tokens_ += int64_t(tokens.size());
  n_hit_tokens_ += n * bs;
  return n * bs;
}

void KvCacheManager::truncate_match(BlockTable& t, int64_t n_blocks) {
  const int64_t bs = block_size();
  TERN_ASSERT(t.n_reserved == t.n_computed && t.n_computed == int64_t(t.blocks.size()) * bs);
  TERN_ASSERT(n_blocks >= 0 && n_blocks <= int64_t(t.blocks.size()) && t.n_hashed == int64_t(t.blocks.size()));
  const int64_t dropped = int64_t(t.blocks.size()) - n_blocks;
  for (int64_t i = int64_t(t.blocks.size()) - 1; i >= n_blocks; --i) pool_.release(t.blocks[size_t(i)]);
  t.blocks.resize(size_t(n_blocks));
  t.n_computed = t.n_reserved = n_blocks * bs;
  t.n_hashed = n_blocks;
  t.last_key = n_blocks > 0 ? pool_.key(t.blocks.back()) : t.root_key;
  n_hit_tokens_ -= dropped * bs;
}

BlockId KvCacheManager::published_block(const BlockTable& t, int64_t i, std::span<const int32_t> tokens) const {
  if (!prefix_caching_ || t.cap_blocks > 0 || t.n_evicted_blocks > 0 || i < 0 || i >= t.n_hashed) return kNoBlock;
  const BlockId own = t.blocks[size_t(i)];
  if (own != kNoBlock && pool_.is_published(own)) return own;  // matched or published by t: its chain
  const int64_t bs = block_size();
  TERN_ASSERT(int64_t(tokens.size()) >= (i + 1) * bs);
  uint64_t parent = t.root_key;
  for (int64_t k = 0; k < i; ++k) parent = block_key(parent, tokens.subspan(size_t(k * bs), size_t(bs)));
  const auto toks = tokens.subspan(size_t(i * bs), size_t(bs));
  return pool_.lookup(block_key(parent, toks), parent, toks);
}

int64_t KvCacheManager::blocks_needed(const BlockTable& t, int64_t n) const {
  if (n <= 0) return 0;
  const int64_t bs = block_size();
  const int64_t have = int64_t(t.blocks.size());
  const int64_t want = blocks_for(t, t.n_computed + n);
  int64_t need = std::max<int64_t>(0, want - have);
  // Writing into a partly filled block that another sequence shares: copy it first.
  const int64_t bi = t.n_computed / bs;
  if (t.cap_blocks == 0 && t.n_computed % bs != 0 && bi < have && pool_.ref_count(t.blocks[size_t(bi)]) > 1) ++need;
  return need;
}

bool KvCacheManager::reserve(BlockTable& t, int64_t n) {
  TERN_ASSERT_MSG(t.n_reserved == t.n_computed, "a reservation is already outstanding");
  TERN_ASSERT(n >= 0);
  if (n == 0) return true;
  if (blocks_needed(t, n) > pool_.n_free()) return false;
  const int64_t bs = block_size();
  const int64_t bi = t.n_computed / bs;
  if (t.cap_blocks == 0 && t.n_computed % bs != 0 && bi < int64_t(t.blocks.size()) &&
      pool_.ref_count(t.blocks[size_t(bi)]) > 1) {
    const BlockId src = t.blocks[size_t(bi)];
    const BlockId dst = pool_.allocate();
    TERN_ASSERT(dst != kNoBlock);
    const int32_t n_copy = int32_t(t.n_computed % bs);
    copies_.push_back(BlockCopy{src, dst, n_copy});
    pool_.set_filled(dst, n_copy);
    pool_.release(src);  // still held by the other sharers
    t.blocks[size_t(bi)] = dst;
  }
  const int64_t want = blocks_for(t, t.n_computed + n);
  while (int64_t(t.blocks.size()) < want) {
    const BlockId b = pool_.allocate();
    TERN_ASSERT(b != kNoBlock);
    t.blocks.push_back(b);
  }
  t.n_reserved = t.n_computed + n;
  return true;
}

void KvCacheManager::commit(BlockTable& t, int64_t n, std::span<const int32_t> tokens) {
  TERN_ASSERT(n >= 0 && t.n_computed + n <= t.n_reserved);
  TERN_ASSERT(int64_t(tokens.size()) >= t.n_computed + n);
  const int64_t bs = block_size();
  const int64_t begin = t.n_computed, end = t.n_computed + n;
  if (t.cap_blocks > 0) {
    // A bounded table reuses its slots: a block is as full as the positions that reached it.
    for (int64_t bi = 0; bi < int64_t(t.blocks.size()); ++bi)
      pool_.set_filled(t.blocks[size_t(bi)], int32_t(std::clamp<int64_t>(end - bi * bs, 0, bs)));
    t.n_computed = end;
    rollback(t);
    return;  // never published: its K/V saw only what its policy kept
  }
  for (int64_t bi = begin / bs; bi * bs < end; ++bi)
    pool_.set_filled(t.blocks[size_t(bi)], int32_t(std::min(bs, end - bi * bs)));
  t.n_computed = end;
  rollback(t);  // slots reserved but not used by this step go back
  if (t.n_evicted_blocks > 0) return;  // n_hashed / last_key stop where the eviction found them
  while ((t.n_hashed + 1) * bs <= t.n_computed) {
    if (prefix_caching_) {
      const auto toks = tokens.subspan(size_t(t.n_hashed * bs), size_t(bs));
      const uint64_t key = block_key(t.last_key, toks);
      pool_.publish(t.blocks[size_t(t.n_hashed)], key, t.last_key, toks);
      t.last_key = key;
    }
    ++t.n_hashed;
  }
}

void KvCacheManager::rollback(BlockTable& t) {
  const size_t keep = size_t(blocks_for(t, t.n_computed));
  while (t.blocks.size() > keep) {
    const BlockId b = t.blocks.back();
    t.blocks.pop_back();
    std::erase_if(copies_, [b](const BlockCopy& c) { return c.dst == b; });
    pool_.release(b);
  }
  t.n_reserved = t.n_computed;
}

void KvCacheManager::fork(const BlockTable& parent, BlockTable& child) {
  TERN_ASSERT(child.blocks.empty() && child.n_computed == 0);
  TERN_ASSERT_MSG(parent.n_reserved == parent.n_computed, "fork with a reservation outstanding");
  TERN_ASSERT_MSG(parent.cap_blocks == 0, "fork of a bounded table (its slots are its policy's)");
  for (BlockId b : parent.blocks)
    if (b != kNoBlock) pool_.retain(b);
  child = parent;
}

void KvCacheManager::free(BlockTable& t) {
  for (auto it = t.blocks.rbegin(); it != t.blocks.rend(); ++it) {
    const BlockId b = *it;
    if (b == kNoBlock) continue;
    // A copy into a block nobody will read is dropped (its destination may be reused).
    if (pool_.ref_count(b) == 1) std::erase_if(copies_, [b](const BlockCopy& c) { return c.dst == b; });
    pool_.release(b);
  }
  const int64_t cap = t.cap_blocks;
  t = BlockTable::with_root(t.root_key);
  t.cap_blocks = cap;
}

void KvCacheManager::slots(const BlockTable& t, int64_t n, std::vector<int32_t>& out) const {
  TERN_ASSERT(n <= int64_t(t.blocks.size()) * block_size());
  TERN_ASSERT_MSG(t.cap_blocks == 0, "slots() of a bounded table: its owner hands out its slots");
  const int64_t bs = block_size();
  for (int64_t p = 0; p < n; p += bs) {
    const BlockId b = t.blocks[size_t(p / bs)];
    TERN_ASSERT_MSG(b != kNoBlock, "slots() of an evicted block: use resident_slots()");
    const int32_t base = int32_t(int64_t(b) * bs);
    const int64_t m = std::min(bs, n - p);
    for (int64_t i = 0; i < m; ++i) out.push_back(base + int32_t(i));
  }
}

void KvCacheManager::resident_slots(const BlockTable& t, int64_t n, std::vector<int32_t>& out,
                                    std::vector<int64_t>* positions) const {
  TERN_ASSERT(n >= 0 && n <= int64_t(t.blocks.size()) * block_size());
  const int64_t bs = block_size();
  for (int64_t p = 0; p < n; p += bs) {
    const BlockId b = t.blocks[size_t(p / bs)];
    if (b == kNoBlock) continue;
    const int32_t base = int32_t(int64_t(b) * bs);
    const int64_t m = std::min(bs, n - p);
    for (int64_t i = 0; i < m; ++i) {
      out.push_back(base + int32_t(i));
      if (positions) positions->push_back(p + i);
    }
  }
}

void KvCacheManager::evict_blocks(BlockTable& t, int64_t first_block, int64_t n_blocks) {
  TERN_ASSERT(first_block >= 0 && n_blocks >= 0);
  TERN_ASSERT_MSG((first_block + n_blocks) * block_size() <= t.n_computed,
                  "evicting a block that is not fully computed");
  for (int64_t i = first_block; i < first_block + n_blocks; ++i) {
    BlockId& b = t.blocks[size_t(i)];
    if (b == kNoBlock) continue;
    if (pool_.ref_count(b) == 1) {
      const BlockId dst = b;
      std::erase_if(copies_, [dst](const BlockCopy& c) { return c.dst == dst; });
    }
    pool_.release(b);
    b = kNoBlock;
    ++t.n_evicted_blocks;
  }
}

double KvCacheManager::waste_pct() const {
  const int64_t allocated = pool_.n_used() * block_size();
  if (allocated == 0) return 0.0;
  return 100.0 * double(allocated - pool_.n_filled_slots()) / double(allocated);
}

}  // namespace tern
