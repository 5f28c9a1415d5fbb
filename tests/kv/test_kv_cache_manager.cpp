// KvCacheManager: block tables, prepare-then-commit, prefix hits, copy-on-write forks, and
// evicted blocks (holes) of a streaming window.
#include <gtest/gtest.h>

#include <climits>
#include <numeric>
#include <random>
#include <vector>

#include "kv/kv_cache_manager.h"

namespace tern {
namespace {

std::vector<int32_t> iota_tokens(int64_t n, int32_t first = 100) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

// Runs one "step" of n tokens: reserve, commit.
void run(KvCacheManager& kv, BlockTable& t, int64_t n, const std::vector<int32_t>& tokens) {
  ASSERT_TRUE(kv.reserve(t, n));
  kv.commit(t, n, tokens);
  kv.clear_copies();
}

TEST(KvCacheManager, SlotsFollowTheBlockTable) {
  KvCacheManager kv(8, 4, true);
  BlockTable t;
  const auto tokens = iota_tokens(10);
  ASSERT_TRUE(kv.reserve(t, 10));
  EXPECT_EQ(t.blocks.size(), 3u);
  EXPECT_EQ(t.n_computed, 0);
  EXPECT_EQ(t.n_reserved, 10);
  std::vector<int32_t> slots;
  kv.slots(t, 10, slots);
  ASSERT_EQ(slots.size(), 10u);
  for (int64_t p = 0; p < 10; ++p)
    EXPECT_EQ(slots[size_t(p)], t.blocks[size_t(p / 4)] * 4 + int32_t(p % 4)) << "position " << p;
  kv.commit(t, 10, tokens);
  EXPECT_EQ(t.n_computed, 10);
  EXPECT_EQ(t.n_hashed, 2);
  EXPECT_EQ(kv.pool().n_cached(), 2);
  // 12 slots allocated, 10 filled.
  EXPECT_NEAR(kv.waste_pct(), 100.0 * 2 / 12, 1e-9);
  kv.free(t);
  EXPECT_EQ(kv.n_used_blocks(), 0);
}

// What recurrent models' state snapshots rely on (kv/state_slots.h): a truncated match gives
// back the blocks past the snapshot and chains on from the kept one; the published block of a
// private copy is found; a publication serial changes when a block is forgotten and reused.
TEST(KvCacheManager, TruncatedMatchesPublishedBlocksAndPublications) {
  KvCacheManager kv(8, 4, true);
  const auto tokens = iota_tokens(14);
  BlockTable a;
  run(kv, a, 14, tokens);  // blocks 0..2 full and published
  const BlockId a1 = a.blocks[1];
  const uint64_t pub1 = kv.pool().publication(a1);
  EXPECT_GT(pub1, 0u);
  EXPECT_NE(kv.pool().publication(a.blocks[0]), pub1);
  EXPECT_EQ(kv.pool().publication(a.blocks[3]), 0u);  // partly filled: never published
  EXPECT_EQ(kv.published_block(a, 1, tokens), a1);

  // b computes the same first 8 tokens privately (a already published them).
  BlockTable b;
  run(kv, b, 8, tokens);
  EXPECT_NE(b.blocks[1], a1);
  EXPECT_FALSE(kv.pool().is_published(b.blocks[1]));
  EXPECT_EQ(kv.published_block(b, 1, tokens), a1) << "the block that holds b's content in the cache";
  EXPECT_EQ(kv.published_block(b, 2, tokens), kNoBlock);  // not hashed yet
  kv.free(b);

  BlockTable c;
  EXPECT_EQ(kv.match_prefix(c, tokens), 12);
  const int64_t hits = kv.n_hit_tokens();
  const int64_t used = kv.n_used_blocks();
  kv.truncate_match(c, 1);
  EXPECT_EQ(c.blocks.size(), 1u);
  EXPECT_EQ(c.n_computed, 4);
  EXPECT_EQ(c.n_hashed, 1);
  EXPECT_EQ(kv.n_hit_tokens(), hits - 8);
  EXPECT_EQ(kv.n_used_blocks(), used);  // a still holds them all
  // c recomputes from 4 and its blocks chain on: its block 1 has a's content and key.
  run(kv, c, 10, tokens);
  EXPECT_EQ(kv.published_block(c, 1, tokens), a1);
  kv.free(a);
  kv.free(c);

  // Fill the pool with other content: a's blocks are forgotten and their publications change.
  BlockTable d;
  run(kv, d, 32, iota_tokens(32, 5000));
  EXPECT_NE(kv.pool().publication(a1), pub1);
  kv.free(d);
  kv.pool().check_invariants();
}

TEST(KvCacheManager, ReserveIsAllOrNothing) {
  KvCacheManager kv(3, 4, true);
  BlockTable a, b;
  ASSERT_TRUE(kv.reserve(a, 8));
  EXPECT_EQ(kv.blocks_needed(b, 5), 2);
  EXPECT_FALSE(kv.reserve(b, 5));  // needs 2, 1 free: nothing taken
  EXPECT_TRUE(b.blocks.empty());
  EXPECT_EQ(kv.n_free_blocks(), 1);
  EXPECT_TRUE(kv.reserve(b, 4));
  kv.rollback(a);  // a failed step: its blocks come back
  EXPECT_TRUE(a.blocks.empty());
  EXPECT_EQ(kv.n_free_blocks(), 2);
  kv.free(b);
  EXPECT_EQ(kv.n_used_blocks(), 0);
  kv.pool().check_invariants();
}

TEST(KvCacheManager, CommitOfFewerTokensReturnsTheRest) {
  KvCacheManager kv(8, 4, true);
  BlockTable t;
  const auto tokens = iota_tokens(12);
  ASSERT_TRUE(kv.reserve(t, 12));
  EXPECT_EQ(t.blocks.size(), 3u);
  kv.commit(t, 5, tokens);  // e.g. speculative tokens rejected
  EXPECT_EQ(t.n_computed, 5);
  EXPECT_EQ(t.n_reserved, 5);
  EXPECT_EQ(t.blocks.size(), 2u);
  EXPECT_EQ(kv.n_used_blocks(), 2);
  kv.free(t);
}

TEST(KvCacheManager, PrefixHitReusesFullBlocksAndLeavesOneTokenToCompute) {
  KvCacheManager kv(16, 4, true);
  const auto prompt = iota_tokens(10);
  BlockTable a;
  run(kv, a, 10, prompt);  // blocks 0..3, 4..7 published; 8..9 partial
  BlockTable b;
  auto other = prompt;
  other[9] = 7;  // differs only in the partial block
  EXPECT_EQ(kv.match_prefix(b, other), 8);
  EXPECT_EQ(b.blocks[0], a.blocks[0]);
  EXPECT_EQ(b.blocks[1], a.blocks[1]);
  EXPECT_EQ(kv.pool().ref_count(a.blocks[0]), 2);
  EXPECT_EQ(b.n_computed, 8);
  // A prompt that is exactly two blocks: the last block is recomputed so a token is left.
  BlockTable c;
  const std::vector<int32_t> exact(prompt.begin(), prompt.begin() + 8);
  EXPECT_EQ(kv.match_prefix(c, exact), 4);
  // A different first block: no hit, even though later blocks match.
  BlockTable d;
  auto shifted = prompt;
  shifted[0] = 1;
  EXPECT_EQ(kv.match_prefix(d, shifted), 0);
  EXPECT_EQ(kv.n_hit_tokens(), 12);
  for (BlockTable* t : {&a, &b, &c, &d}) kv.free(*t);
  EXPECT_EQ(kv.n_used_blocks(), 0);
  // Freed, the blocks stay cached: a new request still hits.
  BlockTable e;
  EXPECT_EQ(kv.match_prefix(e, prompt), 8);
  kv.free(e);
  kv.pool().check_invariants();
}

// Tables with another root (a LoRA adapter's requests) neither find nor give blocks of the
// root's tables, and a freed table keeps its root.
TEST(KvCacheManager, PrefixRootsKeepTheirBlocksApart) {
  KvCacheManager kv(32, 4, true);
  const auto prompt = iota_tokens(10);
  BlockTable base;
  run(kv, base, 10, prompt);
  BlockTable other = BlockTable::with_root(12345);
  EXPECT_EQ(kv.match_prefix(other, prompt), 0);
  run(kv, other, 10, prompt);  // publishes its own two blocks under its root
  EXPECT_NE(other.blocks[0], base.blocks[0]);
  BlockTable same = BlockTable::with_root(12345);
  EXPECT_EQ(kv.match_prefix(same, prompt), 8);
  EXPECT_EQ(same.blocks[0], other.blocks[0]);
  EXPECT_EQ(same.blocks[1], other.blocks[1]);
  BlockTable plain;
  EXPECT_EQ(kv.match_prefix(plain, prompt), 8);
  EXPECT_EQ(plain.blocks[0], base.blocks[0]);
  kv.free(same);
  EXPECT_EQ(same.root_key, 12345u);
  EXPECT_EQ(kv.match_prefix(same, prompt), 8);  // after free (a preemption): its own root still
  EXPECT_EQ(same.blocks[0], other.blocks[0]);
  for (BlockTable* t : {&base, &other, &same, &plain}) kv.free(*t);
  EXPECT_EQ(kv.n_used_blocks(), 0);
  kv.pool().check_invariants();
}

TEST(KvCacheManager, NoPrefixCachingMeansNoHits) {
  KvCacheManager kv(16, 4, false);
  const auto prompt = iota_tokens(10);
  BlockTable a, b;
  run(kv, a, 10, prompt);
  EXPECT_EQ(kv.match_prefix(b, prompt), 0);
  EXPECT_EQ(kv.pool().n_cached(), 0);
  kv.free(a);
  kv.free(b);
}

TEST(KvCacheManager, EvictionForgetsTheDeepestBlocksFirst) {
  KvCacheManager kv(4, 4, true);
  const auto prompt = iota_tokens(17);
  BlockTable a;
  run(kv, a, 16, prompt);  // 4 full blocks published
  kv.free(a);              // freed deepest first -> the first block is the most recently freed
  BlockTable b;
  const auto other = iota_tokens(4, 900);
  run(kv, b, 4, other);    // takes one free block: evicts the 4th block of the prefix
  BlockTable c;
  EXPECT_EQ(kv.match_prefix(c, prompt), 12);
  kv.free(b);
  kv.free(c);
  kv.pool().check_invariants();
}

TEST(KvCacheManager, ForkSharesBlocksAndCopiesThePartialBlockOnWrite) {
  KvCacheManager kv(16, 4, true);
  auto prompt = iota_tokens(6);
  BlockTable parent;
  run(kv, parent, 6, prompt);  // block0 full, block1 has 2 of 4
  std::vector<BlockTable> kids(3);
  for (auto& k : kids) kv.fork(parent, k);
  const BlockId shared = parent.blocks[1];
  EXPECT_EQ(kv.pool().ref_count(parent.blocks[0]), 4);
  EXPECT_EQ(kv.pool().ref_count(shared), 4);
  EXPECT_EQ(kv.n_used_blocks(), 2);
  // Each of the first three writers copies; the last holder writes in place.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(kv.blocks_needed(kids[size_t(i)], 1), 1);
    ASSERT_TRUE(kv.reserve(kids[size_t(i)], 1));
    ASSERT_EQ(kv.pending_copies().size(), size_t(i + 1));
    const BlockCopy& c = kv.pending_copies().back();
    EXPECT_EQ(c.src, shared);
    EXPECT_EQ(c.dst, kids[size_t(i)].blocks[1]);
    EXPECT_EQ(c.n_tokens, 2);
    EXPECT_EQ(kids[size_t(i)].blocks[0], parent.blocks[0]);
  }
  EXPECT_EQ(kv.pool().ref_count(shared), 1);
  EXPECT_EQ(kv.blocks_needed(parent, 1), 0);
  ASSERT_TRUE(kv.reserve(parent, 1));
  EXPECT_EQ(parent.blocks[1], shared);
  EXPECT_EQ(kv.pending_copies().size(), 3u);
  kv.clear_copies();
  prompt.push_back(5);
  kv.commit(parent, 1, prompt);
  for (auto& k : kids) {
    kv.commit(k, 1, prompt);
    kv.free(k);
  }
  kv.free(parent);
  EXPECT_EQ(kv.n_used_blocks(), 0);
  kv.pool().check_invariants();
}

TEST(KvCacheManager, FreeDropsCopiesIntoBlocksNobodyReads) {
  KvCacheManager kv(8, 4, true);
  const auto prompt = iota_tokens(6);
  BlockTable parent, kid;
  run(kv, parent, 6, prompt);
  kv.fork(parent, kid);
  ASSERT_TRUE(kv.reserve(kid, 1));
  EXPECT_EQ(kv.pending_copies().size(), 1u);
  kv.free(kid);  // preempted before the step ran
  EXPECT_TRUE(kv.pending_copies().empty());
  kv.free(parent);
  EXPECT_EQ(kv.n_used_blocks(), 0);
}

TEST(KvCacheManager, EvictBlocksReturnsThemToThePoolAndLeavesHoles) {
  KvCacheManager kv(8, 4, false);
  BlockTable t;
  const auto tokens = iota_tokens(17);
  run(kv, t, 16, tokens);
  ASSERT_EQ(t.blocks, (std::vector<BlockId>{0, 1, 2, 3}));  // the free list's order
  kv.evict_blocks(t, 1, 2);
  EXPECT_EQ(t.blocks, (std::vector<BlockId>{0, kNoBlock, kNoBlock, 3}));
  EXPECT_EQ(t.n_evicted_blocks, 2);
  EXPECT_EQ(t.n_computed, 16);  // positions keep their numbers
  EXPECT_EQ(kv.n_used_blocks(), 2);
  EXPECT_EQ(kv.n_free_blocks(), 6);
  EXPECT_EQ(kv.pool().n_filled_slots(), 8);
  kv.pool().check_invariants();
  std::vector<int32_t> slots;
  std::vector<int64_t> positions;
  kv.resident_slots(t, 16, slots, &positions);
  EXPECT_EQ(slots, (std::vector<int32_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(positions, (std::vector<int64_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  // Evicting a hole again changes nothing.
  kv.evict_blocks(t, 2, 1);
  EXPECT_EQ(t.n_evicted_blocks, 2);
  EXPECT_EQ(kv.n_used_blocks(), 2);
  // The next token takes a freed block (the most recently freed, at the front: block 2).
  ASSERT_TRUE(kv.reserve(t, 1));
  kv.commit(t, 1, tokens);
  EXPECT_EQ(t.blocks, (std::vector<BlockId>{0, kNoBlock, kNoBlock, 3, 2}));
  slots.clear();
  positions.clear();
  kv.resident_slots(t, 17, slots, &positions);
  EXPECT_EQ(slots, (std::vector<int32_t>{0, 1, 2, 3, 12, 13, 14, 15, 8}));
  EXPECT_EQ(positions, (std::vector<int64_t>{0, 1, 2, 3, 12, 13, 14, 15, 16}));
  // Only positions below n.
  slots.clear();
  kv.resident_slots(t, 14, slots);
  EXPECT_EQ(slots, (std::vector<int32_t>{0, 1, 2, 3, 12, 13}));
  // slots() of the resident part still works.
  slots.clear();
  kv.slots(t, 4, slots);
  EXPECT_EQ(slots, (std::vector<int32_t>{0, 1, 2, 3}));
  kv.free(t);  // skips the holes
  EXPECT_EQ(kv.n_used_blocks(), 0);
  EXPECT_EQ(t.n_evicted_blocks, 0);
  EXPECT_TRUE(t.blocks.empty());
  kv.pool().check_invariants();
}

TEST(KvCacheManagerDeathTest, SlotsOfAHoleAndEvictingUncomputedBlocksAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  KvCacheManager kv(8, 4, false);
  BlockTable t;
  run(kv, t, 10, iota_tokens(10));
  kv.evict_blocks(t, 1, 1);
  std::vector<int32_t> slots;
  EXPECT_DEATH(kv.slots(t, 8, slots), "use resident_slots");
  EXPECT_DEATH(kv.evict_blocks(t, 2, 1), "not fully computed");  // block 2 holds 2 of 4
}

// A block another table shares or the prefix cache holds is only released by the evicting
// table: the sharer keeps it, and once nobody holds it the cache still finds it.
TEST(KvCacheManager, EvictBlocksKeepsSharedAndCachedBlocksRight) {
  KvCacheManager kv(16, 4, true);
  const auto prompt = iota_tokens(13);
  BlockTable parent, kid;
  run(kv, parent, 13, prompt);  // 3 full blocks published, 1 partial
  kv.fork(parent, kid);
  const std::vector<BlockId> blocks = parent.blocks;
  kv.evict_blocks(kid, 1, 2);
  EXPECT_EQ(kv.pool().ref_count(blocks[1]), 1);
  EXPECT_EQ(kv.pool().ref_count(blocks[2]), 1);
  EXPECT_EQ(kv.pool().ref_count(blocks[0]), 2);
  EXPECT_EQ(kv.n_used_blocks(), 4);
  kv.pool().check_invariants();
  kv.evict_blocks(parent, 1, 2);
  EXPECT_EQ(kv.pool().ref_count(blocks[1]), 0);
  EXPECT_EQ(kv.n_used_blocks(), 2);
  EXPECT_EQ(kv.pool().n_cached(), 3);  // free but still cached
  kv.pool().check_invariants();
  BlockTable later;
  EXPECT_EQ(kv.match_prefix(later, prompt), 12);
  EXPECT_EQ(later.blocks, (std::vector<BlockId>{blocks[0], blocks[1], blocks[2]}));
  EXPECT_EQ(kv.n_used_blocks(), 4);
  // A fork of a table with holes: the holes stay holes, the rest is shared.
  BlockTable grandkid;
  kv.fork(kid, grandkid);
  EXPECT_EQ(grandkid.blocks, kid.blocks);
  EXPECT_EQ(grandkid.n_evicted_blocks, 2);
  EXPECT_EQ(kv.pool().ref_count(blocks[0]), 4);
  EXPECT_EQ(kv.pool().ref_count(blocks[3]), 3);
  for (BlockTable* t : {&parent, &kid, &grandkid, &later}) kv.free(*t);
  EXPECT_EQ(kv.n_used_blocks(), 0);
  kv.pool().check_invariants();
}

// K/V computed after an eviction attended to fewer tokens than their prefix: such a table stops
// publishing, and a later prompt only hits what was published before.
TEST(KvCacheManager, ATableThatEvictedStopsPublishing) {
  KvCacheManager kv(16, 4, true);
  const auto tokens = iota_tokens(17);
  BlockTable t;
  run(kv, t, 8, tokens);
  EXPECT_EQ(t.n_hashed, 2);
  EXPECT_EQ(kv.pool().n_cached(), 2);
  kv.evict_blocks(t, 1, 1);
  run(kv, t, 8, tokens);  // blocks 2 and 3 become full
  EXPECT_EQ(t.n_computed, 16);
  EXPECT_EQ(t.n_hashed, 2);
  EXPECT_EQ(kv.pool().n_cached(), 2);
  EXPECT_FALSE(kv.pool().is_published(t.blocks[2]));
  EXPECT_FALSE(kv.pool().is_published(t.blocks[3]));
  BlockTable other;
  EXPECT_EQ(kv.match_prefix(other, tokens), 8);
  kv.free(t);
  kv.free(other);
  EXPECT_EQ(kv.n_used_blocks(), 0);
  kv.pool().check_invariants();
}

// Random reserve / commit / rollback / fork / match / free over many tables, with a fake
// K/V arena: every slot remembers which (prefix hash, position) wrote it, and every step
// checks that each table's computed positions read back their own prefix's values. That is
// what paged attention needs from the bookkeeping: the right K/V behind every slot, through
// prefix hits, copy-on-write forks and evictions.
TEST(KvCacheManager, RandomOperationsKeepKvContentRight) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 10; ++round) {
    const int64_t bs = 1 + int64_t(rng() % 8), n_blocks = 4 + int64_t(rng() % 40);
    KvCacheManager kv(n_blocks, bs, round % 3 != 0);
    std::vector<uint64_t> arena(size_t(n_blocks * bs), 0);  // [n_slots] fake K/V
    struct Seq {
      BlockTable t;
      std::vector<int32_t> tokens;
      // K/V written after the table's first eviction differ (they attended to fewer tokens):
      // value ^ salt from position salted_from on. A prefix hit on such a block would fail.
      uint64_t salt = 0;
      int64_t salted_from = INT64_MAX;
    };
    std::vector<Seq> seqs;
    // Value K/V would have at position p: a function of tokens[0..p] only.
    auto value = [](const std::vector<int32_t>& tokens, int64_t p) {
      uint64_t h = 1469598103934665603ull;
      for (int64_t i = 0; i <= p; ++i) h = (h ^ uint64_t(tokens[size_t(i)] + 1)) * 1099511628211ull;
      return h;
    };
    auto expected = [&](const Seq& s, int64_t p) {
      return value(s.tokens, p) ^ (p >= s.salted_from ? s.salt : 0);
    };
    std::vector<int32_t> slots;
    std::vector<int64_t> positions;
    auto check = [&](const Seq& s) {
      slots.clear();
      positions.clear();
      kv.resident_slots(s.t, s.t.n_computed, slots, &positions);
      ASSERT_EQ(int64_t(slots.size()), s.t.n_computed - s.t.n_evicted_blocks * bs);
      for (size_t i = 0; i < slots.size(); ++i)
        ASSERT_EQ(arena[size_t(slots[i])], expected(s, positions[i])) << "position " << positions[i];
    };
    for (int op = 0; op < 3000; ++op) {
      const int kind = int(rng() % 12);
      if (kind == 0 || seqs.empty()) {
        Seq s;
        // Few distinct prompts so prefixes are shared.
        const int64_t n = 1 + int64_t(rng() % (3 * bs + 2));
        const int32_t base = int32_t(rng() % 3);
        for (int64_t i = 0; i < n; ++i) s.tokens.push_back(base + int32_t(i % 5));
        kv.match_prefix(s.t, s.tokens);
        seqs.push_back(std::move(s));
      } else {
        Seq& s = seqs[size_t(rng() % seqs.size())];
        if (kind <= 5) {
          // A step: compute some of the remaining tokens (or a new generated one).
          if (s.t.n_computed == int64_t(s.tokens.size())) s.tokens.push_back(int32_t(rng() % 5));
          const int64_t n = 1 + int64_t(rng() % (int64_t(s.tokens.size()) - s.t.n_computed));
          if (!kv.reserve(s.t, n)) continue;  // not now
          for (const BlockCopy& c : kv.pending_copies())
            for (int32_t i = 0; i < c.n_tokens; ++i)
              arena[size_t(c.dst * bs + i)] = arena[size_t(c.src * bs + i)];
          kv.clear_copies();
          if (rng() % 8 == 0) {  // the step failed
            kv.rollback(s.t);
          } else {
            slots.clear();
            positions.clear();
            kv.resident_slots(s.t, s.t.n_computed + n, slots, &positions);
            for (size_t i = 0; i < slots.size(); ++i)
              if (positions[i] >= s.t.n_computed) arena[size_t(slots[i])] = expected(s, positions[i]);
            kv.commit(s.t, n, s.tokens);
          }
        } else if (kind == 6 && s.t.n_computed == int64_t(s.tokens.size())) {
          Seq child;
          child.tokens = s.tokens;
          child.salt = s.salt;
          child.salted_from = s.salted_from;
          kv.fork(s.t, child.t);
          seqs.push_back(std::move(child));
        } else if (kind >= 10) {
          // A streaming window moved on: evict some full blocks after the sink block.
          const int64_t full = s.t.n_computed / bs;
          if (full < 2) continue;
          const int64_t first = 1 + int64_t(rng() % uint64_t(full - 1));
          kv.evict_blocks(s.t, first, 1 + int64_t(rng() % uint64_t(full - first)));
          if (s.salt == 0) {
            s.salt = rng() | 1;
            s.salted_from = s.t.n_computed;
          }
        } else if (kind >= 7) {
          kv.free(s.t);
          std::swap(s, seqs.back());
          seqs.pop_back();
        }
      }
      for (const Seq& s : seqs) ASSERT_NO_FATAL_FAILURE(check(s));
      kv.pool().check_invariants();
    }
    for (Seq& s : seqs) kv.free(s.t);
    EXPECT_EQ(kv.n_used_blocks(), 0);
    EXPECT_EQ(kv.n_free_blocks(), n_blocks);
    kv.pool().check_invariants();
  }
}

}  // namespace
}  // namespace tern
