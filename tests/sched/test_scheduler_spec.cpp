// Scheduler with speculative drafts (fake model, no tensors): drafts ride along a decode, take
// only what the decodes leave, never preempt, and only accepted ones become tokens (and prefix
// cache blocks); outputs equal each request run alone, with preemption, prefix hits and forks.
#include <gtest/gtest.h>

#include "fake_engine.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_scheduler_spec {
namespace {

using tern::testing::FakeEngine;
using tern::testing::fake_generate_alone;

std::vector<int32_t> prompt_of(int64_t n, int32_t seed) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int32_t((seed * 7919 + i * 31) % FakeEngine::kVocab);
  return v;
}

SchedulerConfig cfg(int64_t budget, int64_t max_running = 64) {
  SchedulerConfig c;
  c.max_batch_tokens = budget;
  c.max_running = max_running;
  return c;
}

// Drafts k tokens: the fake model's true continuation, with a token made wrong where a hash
// of (sequence, position) says so (about one in `wrong_every`), so acceptance is partial.
auto oracle_drafter(int64_t k, int wrong_every) {
  return [k, wrong_every](SeqId id, std::span<const int32_t> toks) {
    std::vector<int32_t> d = fake_generate_alone(std::vector<int32_t>(toks.begin(), toks.end()), k, FakeEngine::kVocab);
    for (size_t i = 0; i < d.size(); ++i) {
      const uint64_t h = (id * 1000003ull + toks.size() * 7919ull + i * 104729ull) * 0x9e3779b97f4a7c15ull;
      if (wrong_every > 0 && (h >> 40) % uint64_t(wrong_every) == 0) d[i] = (d[i] + 1) % FakeEngine::kVocab;
    }
    return d;
  };
}

TEST(SchedulerSpec, DraftedDecodingGivesEveryRequestItsAloneOutput) {
  // 16 requests, shared prompt prefixes (prefix hits), an arena too small for all of them
  // (preemption), two forked requests: with drafts every output equals the request alone.
  FakeEngine e(40, 8, cfg(64));
  e.drafter = oracle_drafter(6, 4);
  std::vector<std::pair<SeqId, std::vector<int32_t>>> reqs;
  const auto common = prompt_of(20, 99);
  for (int i = 0; i < 16; ++i) {
    std::vector<int32_t> p = common;
    const auto tail = prompt_of(3 + i % 5, i);
    p.insert(p.end(), tail.begin(), tail.end());
    reqs.emplace_back(e.add(p, 30 + i, 0, i % 7 == 0 ? 2 : 1), p);
  }
  e.run_to_completion();
  for (const auto& [id, p] : reqs) EXPECT_EQ(e.finished().at(id), fake_generate_alone(p, 30 + int64_t(id) - 1, FakeEngine::kVocab)) << id << " preempted " << e.preemptions(id);
  for (const auto& [child, parent] : e.fork_parent()) EXPECT_EQ(e.finished().at(child), e.finished().at(parent)) << child << " of " << parent;
  EXPECT_GT(e.n_accepted, 0);
  EXPECT_LT(e.n_accepted, e.n_drafted);  // some were wrong and rejected
  EXPECT_GT(e.sched().n_preempted_total(), 0);
  EXPECT_GT(e.kv().n_hit_tokens(), 0);
  EXPECT_EQ(e.kv().n_used_blocks(), 0);
}

TEST(SchedulerSpec, AcceptedDraftsCutTheStepsNeeded) {
  const auto p = prompt_of(10, 3);
  FakeEngine plain(64, 16, cfg(64));
  plain.add(p, 64);
  int64_t plain_steps = 0;
  while (plain.step()) ++plain_steps;
  FakeEngine spec(64, 16, cfg(64));
  spec.drafter = oracle_drafter(7, 0);  // always right
  const SeqId id = spec.add(p, 64);
  int64_t spec_steps = 0;
  while (spec.step()) ++spec_steps;
  EXPECT_EQ(spec.finished().at(id), fake_generate_alone(p, 64, FakeEngine::kVocab));
  // 1 prompt step, then 8 tokens per step: 1 + ceil(63 / 8).
  EXPECT_EQ(plain_steps, 64);
  EXPECT_EQ(spec_steps, 1 + 8);
  EXPECT_EQ(spec.n_accepted, spec.n_drafted - 0);
}

TEST(SchedulerSpec, DraftsTakeOnlyTheBudgetTheDecodesLeave) {
  // 6 decoding sequences, budget 10: every step schedules all six decodes and at most 4 drafts.
  FakeEngine e(256, 16, cfg(10));
  e.drafter = oracle_drafter(8, 3);
  for (int i = 0; i < 6; ++i) e.add(prompt_of(1, i), 40);
  while (e.step()) {
    const StepPlan& plan = e.last_plan();
    EXPECT_LE(plan.n_tokens, 10);
    int64_t drafts = 0, decodes = 0;
    for (const ScheduledSeq& s : plan.seqs) {
      drafts += s.n_draft;
      decodes += s.prefill ? 0 : 1;
      EXPECT_EQ(s.n_tokens, s.prefill ? s.n_tokens : 1 + s.n_draft);
    }
    EXPECT_EQ(decodes + drafts + 0, plan.n_tokens - [&] {
      int64_t pf = 0;
      for (const ScheduledSeq& s : plan.seqs) pf += s.prefill ? s.n_tokens : 0;
      return pf;
    }());
    EXPECT_LE(drafts, 10 - int64_t(e.sched().n_running()));
    e.sched().check_invariants();
  }
  EXPECT_EQ(e.kv().n_used_blocks(), 0);
}

TEST(SchedulerSpec, DraftsNeverPreemptAndShrinkToTheFreeBlocks) {
  // Two sequences fill the arena but for one free block: drafts must fit in it (and in the
  // slots left in each sequence's last block) rather than push anyone out.
  FakeEngine e(6, 4, cfg(64));
  e.drafter = oracle_drafter(12, 0);
  const SeqId a = e.add(prompt_of(7, 1), 3);
  const SeqId b = e.add(prompt_of(7, 2), 3);
  ASSERT_TRUE(e.step());  // both prompts: 2 blocks each, 2 free
  EXPECT_EQ(e.kv().n_free_blocks(), 2);
  ASSERT_TRUE(e.step());
  EXPECT_TRUE(e.last_plan().preempted.empty());
  int64_t drafts = 0;
  for (const ScheduledSeq& s : e.last_plan().seqs) drafts += s.n_draft;
  // a: 1 slot left in its block + the spare blocks after b's token: every draft fits in free room.
  EXPECT_GT(drafts, 0);
  EXPECT_LE(drafts, 2 + 2 * 4 - 2);
  e.run_to_completion();
  EXPECT_EQ(e.sched().n_preempted_total(), 0);
  EXPECT_EQ(e.finished().at(a), fake_generate_alone(prompt_of(7, 1), 3, FakeEngine::kVocab));
  EXPECT_EQ(e.finished().at(b), fake_generate_alone(prompt_of(7, 2), 3, FakeEngine::kVocab));
}

TEST(SchedulerSpec, RejectedDraftsNeverReachThePrefixCache) {
  // A drafts 8 wrong tokens that would fill its second block; the block must not be published
  // with them: a later prompt made of A's tokens plus those drafts finds only the verified block.
  KvCacheManager kv(16, 4, true);
  Scheduler s(cfg(64), kv);
  const std::vector<int32_t> prompt{1, 2, 3, 4, 5};
  s.add(1, prompt);
  s.schedule();
  s.commit();
  s.append_token(1, 6);  // the sampled token: tokens 1..6, 5 computed
  const std::vector<int32_t> drafts{7, 8, 9, 10, 11, 12, 13, 14};
  s.set_draft(1, drafts);
  const StepPlan& plan = s.schedule();
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_EQ(plan.seqs[0].n_draft, 8);
  EXPECT_EQ(plan.seqs[0].n_tokens, 9);
  EXPECT_EQ(s.tokens(1).size(), 14u);  // the drafts are the step's tokens
  s.accept_drafts(1, 1);  // 7 accepted, 8 rejected
  s.commit();
  EXPECT_EQ(std::vector<int32_t>(s.tokens(1).begin(), s.tokens(1).end()), (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(s.block_table(1).n_computed, 7);
  EXPECT_EQ(s.block_table(1).blocks.size(), 2u);  // the third block (drafts only) went back
  s.check_invariants();
  // A prompt continuing with the rejected drafts: only the first block (1..4) is cached.
  std::vector<int32_t> probe{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
  s.add(2, probe);
  const StepPlan& p2 = s.schedule();
  ASSERT_EQ(p2.seqs.size(), 1u);  // seq 1 has no token to compute: all of it was committed
  EXPECT_EQ(p2.seqs[0].id, 2u);
  EXPECT_EQ(p2.seqs[0].n_past, 4);
  s.commit();
  s.check_invariants();
}

TEST(SchedulerSpec, RollbackDropsTheDraftsAndTheirBlocks) {
  KvCacheManager kv(16, 4, true);
  Scheduler s(cfg(64), kv);
  s.add(1, std::vector<int32_t>{1, 2, 3});
  s.schedule();
  s.commit();
  s.append_token(1, 4);
  const int64_t free_before = kv.n_free_blocks();
  s.set_draft(1, std::vector<int32_t>{5, 6, 7, 8, 9, 10});
  const StepPlan& plan = s.schedule();
  ASSERT_EQ(plan.seqs[0].n_draft, 6);
  s.rollback();
  EXPECT_EQ(s.tokens(1).size(), 4u);
  EXPECT_EQ(kv.n_free_blocks(), free_before);
  s.check_invariants();
  // The drafts were for that step only: the next plan is a plain decode.
  const StepPlan& again = s.schedule();
  EXPECT_EQ(again.seqs[0].n_draft, 0);
  EXPECT_EQ(again.seqs[0].n_tokens, 1);
  s.commit();
  s.check_invariants();
}

TEST(SchedulerSpec, DraftsOfASequenceStillPrefillingAreIgnored) {
  KvCacheManager kv(16, 4, true);
  Scheduler s(cfg(64), kv);
  s.add(1, std::vector<int32_t>{1, 2, 3});
  s.set_draft(1, std::vector<int32_t>{4, 5});  // waiting: ignored
  const StepPlan& plan = s.schedule();
  EXPECT_EQ(plan.seqs[0].n_draft, 0);
  EXPECT_EQ(plan.seqs[0].n_tokens, 3);
  s.commit();
}

}  // namespace
}  // namespace tern::test_scheduler_spec
