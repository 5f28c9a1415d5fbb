// Scheduler: continuous batching with fake requests (no model): budgets, chunked prefill,
// admission order, preemption and resumption, prefix hits, forks, aborts, no leaked blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <random>

#include "fake_engine.h"

namespace tern {
namespace {

using tern::testing::FakeEngine;
using tern::testing::fake_generate_alone;

std::vector<int32_t> prompt_of(int64_t n, int32_t seed) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int32_t((seed * 7919 + i * 31) % FakeEngine::kVocab);
  return v;
}

SchedulerConfig cfg(int64_t budget, int64_t max_running = 64, int64_t watermark = 0) {
  SchedulerConfig c;
  c.max_batch_tokens = budget;
  c.max_running = max_running;
  c.watermark_blocks = watermark;
  return c;
}

TEST(Scheduler, LongPromptIsPrefilledInChunksOfTheBudget) {
  FakeEngine e(64, 16, cfg(64));
  const auto prompt = prompt_of(200, 1);
  const SeqId id = e.add(prompt, 3);
  std::vector<int64_t> chunks;
  std::vector<bool> samples;
  while (e.step()) {
    ASSERT_EQ(e.last_plan().seqs.size(), 1u);
    chunks.push_back(e.last_plan().seqs[0].n_tokens);
    samples.push_back(e.last_plan().seqs[0].sample);
  }
  EXPECT_EQ(chunks, (std::vector<int64_t>{64, 64, 64, 8, 1, 1}));
  EXPECT_EQ(samples, (std::vector<bool>{false, false, false, true, true, true}));
  EXPECT_EQ(e.finished().at(id), fake_generate_alone(prompt, 3, FakeEngine::kVocab));
  EXPECT_EQ(e.kv().n_used_blocks(), 0);
}

TEST(Scheduler, DecodesAreNeverStalledByAnotherLongPrompt) {
  FakeEngine e(128, 16, cfg(32));
  const SeqId a = e.add(prompt_of(5, 1), 20);
  ASSERT_TRUE(e.step());  // a's prompt
  const SeqId b = e.add(prompt_of(300, 2), 2);
  int steps_with_both = 0;
  while (e.is_active(a)) {
    ASSERT_TRUE(e.step());
    const auto& seqs = e.last_plan().seqs;
    ASSERT_FALSE(seqs.empty());
    EXPECT_EQ(seqs[0].id, a);  // the decode goes first, every step
    EXPECT_EQ(seqs[0].n_tokens, 1);
    if (seqs.size() == 2) {
      ++steps_with_both;
      EXPECT_EQ(seqs[1].id, b);
      EXPECT_LE(seqs[1].n_tokens, 31);
    }
    EXPECT_LE(e.last_plan().n_tokens, 32);
  }
  e.run_to_completion();
  EXPECT_GE(steps_with_both, 9);  // b's 300-token prompt took ~10 steps beside a's decodes
  EXPECT_EQ(e.finished().at(a), fake_generate_alone(prompt_of(5, 1), 20, FakeEngine::kVocab));
  EXPECT_EQ(e.finished().at(b), fake_generate_alone(prompt_of(300, 2), 2, FakeEngine::kVocab));
}

TEST(Scheduler, OneStepMixesPrefillChunksAndDecodesUnderTheBudget) {
  FakeEngine e(256, 16, cfg(100));
  std::vector<SeqId> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(e.add(prompt_of(40 + i, i), 10));
  ASSERT_TRUE(e.step());
  // 100 tokens: 40 + 41 + 19 of the third prompt.
  const auto& p = e.last_plan();
  ASSERT_EQ(p.seqs.size(), 3u);
  EXPECT_EQ(p.seqs[0].n_tokens, 40);
  EXPECT_EQ(p.seqs[1].n_tokens, 41);
  EXPECT_EQ(p.seqs[2].n_tokens, 19);
  EXPECT_FALSE(p.seqs[2].sample);
  EXPECT_EQ(p.n_tokens, 100);
  ASSERT_TRUE(e.step());
  // Two decodes first, then the rest of the third prompt, then the next prompts.
  const auto& q = e.last_plan();
  EXPECT_EQ(q.seqs[0].n_tokens, 1);
  EXPECT_EQ(q.seqs[1].n_tokens, 1);
  EXPECT_EQ(q.seqs[2].id, ids[2]);
  EXPECT_EQ(q.seqs[2].n_tokens, 23);
  EXPECT_EQ(q.n_tokens, 100);
  e.run_to_completion();
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(e.finished().at(ids[size_t(i)]), fake_generate_alone(prompt_of(40 + i, i), 10, FakeEngine::kVocab));
  EXPECT_EQ(e.kv().n_used_blocks(), 0);
}

TEST(Scheduler, MaxRunningBoundsTheRunningSet) {
  FakeEngine e(256, 4, cfg(512, 3));
  for (int i = 0; i < 8; ++i) e.add(prompt_of(6, i), 4);
  e.step();
  EXPECT_EQ(e.sched().n_running(), 3);
  EXPECT_EQ(e.sched().n_waiting(), 5);
  e.run_to_completion();
  EXPECT_EQ(e.finished().size(), 8u);
}

TEST(Scheduler, PriorityThenFirstComeFirstServed) {
  FakeEngine e(256, 4, cfg(512, 1));
  const SeqId a = e.add(prompt_of(3, 1), 1, /*priority=*/5);
  const SeqId b = e.add(prompt_of(3, 2), 1, 0);
  const SeqId c = e.add(prompt_of(3, 3), 1, 5);
  const SeqId d = e.add(prompt_of(3, 4), 1, 0);
  std::vector<SeqId> order;
  while (e.step()) order.push_back(e.last_plan().seqs.at(0).id);
  EXPECT_EQ(order, (std::vector<SeqId>{b, d, a, c}));
}

TEST(Scheduler, SharedPromptPrefixIsServedFromTheCache) {
  FakeEngine e(64, 8, cfg(512));
  auto prompt = prompt_of(40, 9);
  const SeqId a = e.add(prompt, 2);
  e.run_to_completion();
  // Same first 35 tokens: 4 full blocks (32 tokens) come from the cache.
  auto other = prompt;
  for (size_t i = 35; i < other.size(); ++i) other[i] = 3;
  const SeqId b = e.add(other, 2);
  ASSERT_TRUE(e.step());
  ASSERT_EQ(e.last_plan().seqs.size(), 1u);
  EXPECT_EQ(e.last_plan().seqs[0].n_past, 32);
  EXPECT_EQ(e.last_plan().seqs[0].n_tokens, 8);
  e.run_to_completion();
  EXPECT_EQ(e.finished().at(a), fake_generate_alone(prompt, 2, FakeEngine::kVocab));
  EXPECT_EQ(e.finished().at(b), fake_generate_alone(other, 2, FakeEngine::kVocab));
  EXPECT_EQ(e.kv().n_hit_tokens(), 32);
}

TEST(Scheduler, ASequenceWithoutPrefixLookupComputesItsWholePromptAndStillPublishes) {
  FakeEngine e(64, 8, cfg(512));
  auto prompt = prompt_of(40, 9);
  const SeqId a = e.add(prompt, 2);
  e.run_to_completion();
  // The same prompt again, without lookup (an embedding request): nothing comes from the cache.
  const SeqId b = e.add(prompt, 2, 0, 1, /*prefix_lookup=*/false);
  ASSERT_TRUE(e.step());
  ASSERT_EQ(e.last_plan().seqs.size(), 1u);
  EXPECT_EQ(e.last_plan().seqs[0].n_past, 0);
  EXPECT_EQ(e.last_plan().seqs[0].n_tokens, 40);
  e.run_to_completion();
  EXPECT_EQ(e.finished().at(b), fake_generate_alone(prompt, 2, FakeEngine::kVocab));
  EXPECT_EQ(e.kv().n_hit_tokens(), 0);
  // A third with lookup still hits the blocks the first two published.
  const SeqId c = e.add(prompt, 2);
  ASSERT_TRUE(e.step());
  EXPECT_EQ(e.last_plan().seqs[0].n_past, 32);
  e.run_to_completion();
  EXPECT_EQ(e.finished().at(a), e.finished().at(c));
  EXPECT_EQ(e.kv().n_hit_tokens(), 32);
}

// limit_prefix (a request that scores its prompt from position `from` on): the cache may serve
// whole blocks within the first n tokens only, at admission and again after a preemption.
TEST(Scheduler, LimitPrefixCapsTheCachedPrefixToWholeBlocksWithinIt) {
  FakeEngine e(64, 8, cfg(512));
  auto prompt = prompt_of(40, 11);
  const SeqId a = e.add(prompt, 2);
  e.run_to_completion();
  for (const auto& [cap, want_past] : std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {7, 0}, {8, 8}, {20, 16}, {100, 32}}) {
    SCOPED_TRACE(cap);
    const SeqId b = e.add(prompt, 2);
    e.sched().limit_prefix(b, cap);
    ASSERT_TRUE(e.step());
    ASSERT_EQ(e.last_plan().seqs.size(), 1u);
    EXPECT_EQ(e.last_plan().seqs[0].n_past, want_past);
    EXPECT_EQ(e.last_plan().seqs[0].n_tokens, 40 - want_past);
    e.sched().check_invariants();
    e.run_to_completion();
    EXPECT_EQ(e.finished().at(b), e.finished().at(a));
  }
  EXPECT_EQ(e.kv().n_used_blocks(), 0);
}

TEST(Scheduler, BlockExhaustionPreemptsTheNewestAndResumesIt) {
  // 12 blocks of 4 = 48 slots; three sequences of 8 + 16 tokens need 72: someone must wait.
  FakeEngine e(12, 4, cfg(64));
  std::vector<SeqId> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(e.add(prompt_of(8, i), 16));
  int64_t total_preempted = 0;
  for (int guard = 0; guard < 1000 && e.step(); ++guard) {
    for (SeqId p : e.last_plan().preempted) {
      ++total_preempted;
      EXPECT_EQ(p, ids.back()) << "the newest is preempted first";
    }
    e.sched().check_invariants();
  }
  EXPECT_GT(total_preempted, 0);
  EXPECT_EQ(e.sched().n_preempted_total(), total_preempted);
  ASSERT_EQ(e.finished().size(), 3u);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(e.finished().at(ids[size_t(i)]), fake_generate_alone(prompt_of(8, i), 16, FakeEngine::kVocab))
        << "request " << i;
  EXPECT_EQ(e.kv().n_used_blocks(), 0);
}

// blocks_per_running (a kivi2 cache's fp16 stage per running sequence): every step, the blocks
// the running sequences hold plus what each holds outside its table never exceed the pool, so
// fewer run at once than without it; outputs stay exact, and one sequence alone still runs.
TEST(Scheduler, MemoryHeldOutsideTheTablesCountsAgainstTheFreeBlocks) {
  int64_t most_running[2] = {0, 0};
  for (int64_t extra : {0, 3}) {
    SchedulerConfig c = cfg(64);
    c.blocks_per_running = extra;
    FakeEngine e(24, 4, c);  // 24 blocks of 4
    std::vector<SeqId> ids;
    for (int i = 0; i < 6; ++i) ids.push_back(e.add(prompt_of(6 + i, i), 10));
    for (int guard = 0; guard < 2000 && e.step(); ++guard) {
      e.sched().check_invariants();
      const int64_t n = e.sched().n_running();
      most_running[extra > 0] = std::max(most_running[extra > 0], n);
      EXPECT_LE(e.kv().n_used_blocks() + extra * n, 24) << "extra " << extra;
    }
    ASSERT_EQ(e.finished().size(), 6u);
    for (int i = 0; i < 6; ++i)
      EXPECT_EQ(e.finished().at(ids[size_t(i)]), fake_generate_alone(prompt_of(6 + i, i), 10, FakeEngine::kVocab));
    EXPECT_EQ(e.kv().n_used_blocks(), 0);
  }
  EXPECT_LT(most_running[1], most_running[0]);
  // A pool that holds one sequence and its outside share: it still runs, alone.
  SchedulerConfig c = cfg(64);
  c.blocks_per_running = 5;
  FakeEngine e(10, 4, c);
  const SeqId a = e.add(prompt_of(8, 1), 12), b = e.add(prompt_of(8, 2), 12);
  e.run_to_completion();
  EXPECT_EQ(e.finished().at(a), fake_generate_alone(prompt_of(8, 1), 12, FakeEngine::kVocab));
  EXPECT_EQ(e.finished().at(b), fake_generate_alone(prompt_of(8, 2), 12, FakeEngine::kVocab));
}

TEST(Scheduler, TheOlderSequenceGrowsAndTheNewerStepsAside) {
  // Two prompts fill the pool; the older one's next decode needs a block: the newer one is
  // preempted, and later resumed (its first block comes back from the prefix cache).
  FakeEngine e(4, 4, cfg(64));
  const SeqId a = e.add(prompt_of(8, 1), 6);
  const SeqId b = e.add(prompt_of(7, 2), 3);
  ASSERT_TRUE(e.step());  // both prompts: 4 blocks
  EXPECT_EQ(e.kv().n_free_blocks(), 0);
  ASSERT_TRUE(e.step());  // a's first decode needs a fifth block
  EXPECT_EQ(e.last_plan().preempted, (std::vector<SeqId>{b}));
  ASSERT_EQ(e.last_plan().seqs.size(), 1u);
  EXPECT_EQ(e.last_plan().seqs[0].id, a);
  EXPECT_FALSE(e.sched().is_running(b));
  e.run_to_completion();
  EXPECT_GE(e.preemptions(b), 1);
  EXPECT_EQ(e.preemptions(a), 0);
  EXPECT_EQ(e.finished().at(a), fake_generate_alone(prompt_of(8, 1), 6, FakeEngine::kVocab));
  EXPECT_EQ(e.finished().at(b), fake_generate_alone(prompt_of(7, 2), 3, FakeEngine::kVocab));
  EXPECT_EQ(e.kv().n_used_blocks(), 0);
}

TEST(Scheduler, RollbackReturnsTheStepsBlocks) {
  KvCacheManager kv(16, 4, true);
  Scheduler s(cfg(64), kv);
  const auto prompt = prompt_of(10, 3);
  s.add(1, prompt);
  const StepPlan& p = s.schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(kv.n_used_blocks(), 3);
  s.rollback();
  EXPECT_EQ(kv.n_used_blocks(), 0);
  EXPECT_EQ(s.block_table(1).n_computed, 0);
  EXPECT_TRUE(s.is_running(1));
  const StepPlan& q = s.schedule();  // the step is simply planned again
  ASSERT_EQ(q.seqs.size(), 1u);
  EXPECT_EQ(q.seqs[0].n_tokens, 10);
  s.commit();
  EXPECT_EQ(s.block_table(1).n_computed, 10);
  s.remove(1);
  EXPECT_EQ(kv.n_used_blocks(), 0);
  s.check_invariants();
}

TEST(Scheduler, ForkedCompletionsShareThePromptCopyOnWrite) {
  FakeEngine e(64, 8, cfg(512));
  const auto prompt = prompt_of(13, 4);  // 1 full block + a partial one
  const SeqId id = e.add(prompt, 5, 0, /*n=*/4);
  ASSERT_TRUE(e.step());  // prompt, then fork into 4
  EXPECT_EQ(e.sched().n_running(), 4);
  EXPECT_EQ(e.kv().n_used_blocks(), 2);  // shared
  ASSERT_TRUE(e.step());                 // 3 copies of the partial block, one in place
  EXPECT_EQ(e.kv().n_used_blocks(), 5);
  e.run_to_completion();
  const auto expected = fake_generate_alone(prompt, 5, FakeEngine::kVocab);
  EXPECT_EQ(e.finished().at(id), expected);
  int n_children = 0;
  for (const auto& [child, parent] : e.fork_parent()) {
    EXPECT_EQ(parent, id);
    EXPECT_EQ(e.finished().at(child), expected);
    ++n_children;
  }
  EXPECT_EQ(n_children, 3);
  EXPECT_EQ(e.kv().n_used_blocks(), 0);
}

// Thousands of fake requests (random prompts from a few shared stems, random lengths,
// priorities and n), a pool small enough to preempt, and aborts at random points: every step
// checks the invariants and the K/V read back; every completed request equals its run alone;
// at the end no block is in use.
TEST(Scheduler, RandomTrafficWithAbortsLeavesNoBlocksAndExactOutputs) {
  std::mt19937_64 rng(1234);
  int64_t total_preempted = 0;
  for (int round = 0; round < 6; ++round) {
    const int64_t bs = std::array<int64_t, 6>{1, 2, 4, 8, 16, 3}[size_t(round)];
    // Just enough for the longest request alone (40 + 24 tokens), up to twice that.
    const int64_t n_blocks = (64 + bs - 1) / bs + 1 + int64_t(rng() % uint64_t(64 / bs + 1));
    FakeEngine e(n_blocks, bs, cfg(16 + int64_t(rng() % 64), 2 + int64_t(rng() % 16), int64_t(rng() % 3)),
                 round % 2 == 0);
    std::map<SeqId, std::pair<std::vector<int32_t>, int64_t>> requests;
    std::vector<SeqId> aborted;
    int64_t added = 0;
    const int64_t n_requests = 700;
    for (int64_t stepn = 0; stepn < 200000 && (added < n_requests || !e.active().empty()); ++stepn) {
      // Arrivals.
      while (added < n_requests && rng() % 3 == 0) {
        auto prompt = prompt_of(1 + int64_t(rng() % 40), int32_t(rng() % 4));
        for (auto& t : prompt)
          if (rng() % 8 == 0) t = int32_t(rng() % FakeEngine::kVocab);
        const int64_t n_gen = 1 + int64_t(rng() % 24);
        const int n = rng() % 6 == 0 ? 2 + int(rng() % 3) : 1;
        const SeqId id = e.add(prompt, n_gen, int(rng() % 2), n);
        requests[id] = {prompt, n_gen};
        ++added;
      }
      // Aborts at random points (waiting, prefilling, decoding, forked).
      if (rng() % 10 == 0) {
        const auto act = e.active();
        if (!act.empty()) {
          const SeqId victim = act[size_t(rng() % act.size())];
          e.abort(victim);
          aborted.push_back(victim);
        }
      }
      e.step();
      e.sched().check_invariants();
    }
    EXPECT_TRUE(e.active().empty());
    EXPECT_EQ(e.sched().n_running() + e.sched().n_waiting(), 0);
    EXPECT_EQ(e.kv().n_used_blocks(), 0) << "leaked blocks";
    EXPECT_EQ(e.kv().n_free_blocks(), n_blocks);
    // Every completion that finished equals its prompt run alone.
    int64_t checked = 0;
    for (const auto& [id, out] : e.finished()) {
      SeqId root = id;
      if (auto it = e.fork_parent().find(id); it != e.fork_parent().end()) root = it->second;
      const auto& [prompt, n_gen] = requests.at(root);
      EXPECT_EQ(out, fake_generate_alone(prompt, n_gen, FakeEngine::kVocab)) << "request " << id;
      ++checked;
    }
    EXPECT_GT(checked, n_requests / 2);
    EXPECT_FALSE(aborted.empty());
    total_preempted += e.sched().n_preempted_total();
  }
  EXPECT_GT(total_preempted, 100) << "the pools should be small enough to preempt";
}

}  // namespace
}  // namespace tern
