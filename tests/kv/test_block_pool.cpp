// BlockPool: reference counts, the LRU free list, and the content-addressed prefix cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "kv/block_pool.h"

namespace tern {
namespace {

std::vector<int32_t> toks(int32_t first, int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = first + int32_t(i);
  return v;
}

TEST(BlockPool, AllocatesEveryBlockOnceThenSaysNotNow) {
  BlockPool pool(8, 4);
  std::vector<BlockId> got;
  for (int i = 0; i < 8; ++i) {
    const BlockId b = pool.allocate();
    ASSERT_NE(b, kNoBlock);
    EXPECT_EQ(pool.ref_count(b), 1);
    got.push_back(b);
  }
  std::sort(got.begin(), got.end());
  EXPECT_EQ(std::unique(got.begin(), got.end()), got.end());
  EXPECT_EQ(pool.n_free(), 0);
  EXPECT_EQ(pool.allocate(), kNoBlock);  // "not now" is a value, not an error
  for (BlockId b : got) pool.release(b);
  EXPECT_EQ(pool.n_free(), 8);
  EXPECT_EQ(pool.n_used(), 0);
  pool.check_invariants();
}

TEST(BlockPool, RefCountsKeepSharedBlocksAlive) {
  BlockPool pool(4, 4);
  const BlockId b = pool.allocate();
  pool.retain(b);
  pool.retain(b);
  EXPECT_EQ(pool.ref_count(b), 3);
  pool.release(b);
  pool.release(b);
  EXPECT_EQ(pool.n_free(), 3);
  pool.release(b);
  EXPECT_EQ(pool.n_free(), 4);
  pool.check_invariants();
}

TEST(BlockPool, PublishedContentIsFoundOnlyWithTheSameParentAndTokens) {
  BlockPool pool(4, 4);
  const BlockId b = pool.allocate();
  const auto t = toks(10, 4);
  const uint64_t key = block_key(kRootBlockKey, t);
  ASSERT_TRUE(pool.publish(b, key, kRootBlockKey, t));
  EXPECT_EQ(pool.lookup(key, kRootBlockKey, t), b);
  // Same key but other content (what a 64-bit collision would look like): no alias.
  EXPECT_EQ(pool.lookup(key, kRootBlockKey, toks(11, 4)), kNoBlock);
  EXPECT_EQ(pool.lookup(key, 12345, t), kNoBlock);
  EXPECT_EQ(pool.lookup(block_key(kRootBlockKey, toks(11, 4)), kRootBlockKey, toks(11, 4)), kNoBlock);
  // A second block with the same content stays private.
  const BlockId c = pool.allocate();
  EXPECT_FALSE(pool.publish(c, key, kRootBlockKey, t));
  EXPECT_FALSE(pool.is_published(c));
  pool.check_invariants();
}

TEST(BlockPool, KeysChainTheParent) {
  const auto t = toks(1, 16);
  EXPECT_NE(block_key(kRootBlockKey, t), block_key(block_key(kRootBlockKey, t), t));
  EXPECT_EQ(block_key(7, t), block_key(7, t));
  EXPECT_NE(block_key(7, toks(1, 16)), block_key(7, toks(2, 16)));
}

TEST(BlockPool, FreedCachedBlockIsHitUntilEvictedLeastRecentlyFreedFirst) {
  BlockPool pool(3, 2);
  const BlockId a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
  const auto ta = toks(0, 2), tb = toks(2, 2);
  const uint64_t ka = block_key(kRootBlockKey, ta), kb = block_key(kRootBlockKey, tb);
  pool.publish(a, ka, kRootBlockKey, ta);
  pool.publish(b, kb, kRootBlockKey, tb);
  pool.release(a);  // cached, freed first -> evicted first
  pool.release(b);  // cached
  pool.release(c);  // holds nothing -> reused before any cached block
  EXPECT_EQ(pool.n_free(), 3);
  EXPECT_EQ(pool.n_cached(), 2);
  // A hit takes a free cached block back.
  EXPECT_EQ(pool.lookup(kb, kRootBlockKey, tb), b);
  pool.retain(b);
  EXPECT_EQ(pool.n_free(), 2);
  pool.release(b);  // now the most recently freed
  EXPECT_EQ(pool.allocate(), c);
  EXPECT_EQ(pool.n_evictions(), 0u);
  EXPECT_EQ(pool.allocate(), a);  // least recently freed cached block
  EXPECT_EQ(pool.n_evictions(), 1u);
  EXPECT_EQ(pool.lookup(ka, kRootBlockKey, ta), kNoBlock);
  EXPECT_EQ(pool.lookup(kb, kRootBlockKey, tb), b);
  pool.check_invariants();
}

TEST(BlockPool, FilledSlotsCountOnlyHeldBlocks) {
  BlockPool pool(4, 8);
  const BlockId a = pool.allocate(), b = pool.allocate();
  pool.set_filled(a, 8);
  pool.set_filled(b, 3);
  EXPECT_EQ(pool.n_filled_slots(), 11);
  const auto t = toks(0, 8);
  pool.publish(a, block_key(kRootBlockKey, t), kRootBlockKey, t);
  pool.release(a);
  EXPECT_EQ(pool.n_filled_slots(), 3);
  pool.retain(a);  // prefix hit: its slots are filled again
  EXPECT_EQ(pool.n_filled_slots(), 11);
  pool.check_invariants();
}

// Random allocate / retain / release / publish / hit sequences against a simple model of the
// reference counts; invariants checked after every operation.
TEST(BlockPool, RandomOperationSequencesKeepInvariants) {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 20; ++round) {
    const int64_t n_blocks = 1 + int64_t(rng() % 40), bs = 1 + int64_t(rng() % 8);
    BlockPool pool(n_blocks, bs);
    std::map<BlockId, int> held;  // block -> references we hold
    std::vector<std::vector<int32_t>> contents;
    for (int op = 0; op < 2000; ++op) {
      const int kind = int(rng() % 5);
      if (kind == 0 || held.empty()) {
        const BlockId b = pool.allocate();
        if (int64_t(held.size()) == n_blocks) {
          EXPECT_EQ(b, kNoBlock);
        } else {
          ASSERT_NE(b, kNoBlock);
          ASSERT_EQ(held.count(b), 0u);
          held[b] = 1;
        }
      } else {
        auto it = held.begin();
        std::advance(it, ptrdiff_t(rng() % held.size()));
        const BlockId b = it->first;
        if (kind == 1) {
          pool.retain(b);
          ++it->second;
        } else if (kind == 2 || kind == 3) {
          pool.release(b);
          if (--it->second == 0) held.erase(it);
        } else {
          std::vector<int32_t> t(static_cast<size_t>(bs));
          for (auto& x : t) x = int32_t(rng() % 3);  // few distinct contents: duplicates happen
          pool.set_filled(b, int32_t(bs));
          pool.publish(b, block_key(kRootBlockKey, t), kRootBlockKey, t);
          contents.push_back(t);
        }
      }
      // Any content ever published is either found (and has the right tokens) or evicted.
      if (!contents.empty()) {
        const auto& t = contents[size_t(rng() % contents.size())];
        const BlockId hit = pool.lookup(block_key(kRootBlockKey, t), kRootBlockKey, t);
        if (hit != kNoBlock && rng() % 2) {
          pool.retain(hit);
          ++held[hit];
        }
      }
      for (const auto& [b, n] : held) ASSERT_EQ(pool.ref_count(b), n);
      ASSERT_EQ(pool.n_used(), int64_t(held.size()));
      pool.check_invariants();
    }
    for (const auto& [b, n] : held)
      for (int i = 0; i < n; ++i) pool.release(b);
    EXPECT_EQ(pool.n_used(), 0);
    EXPECT_EQ(pool.n_filled_slots(), 0);
    pool.check_invariants();
  }
}

}  // namespace
}  // namespace tern
