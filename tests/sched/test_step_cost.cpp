// The step-cost model (online least squares, coefficients >= 0) and the scheduler's step-time
// target (Sarathi-Serve's stall-free batching) driven by a fake cost model, without a model.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "fake_engine.h"
#include "sched/step_cost.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_step_cost {
namespace {

using tern::testing::FakeEngine;
using tern::testing::fake_generate_alone;

// ---- StepShape --------------------------------------------------------------------------

TEST(StepShape, CountsCausalQueryKeyPairs) {
  StepShape s;
  s.add(/*n_past=*/0, /*n=*/4, /*sampled=*/true);  // 1 + 2 + 3 + 4 = 10 pairs
  s.add(/*n_past=*/100, /*n=*/1, /*sampled=*/true);  // 101
  EXPECT_EQ(s.n_seqs, 2);
  EXPECT_EQ(s.n_tokens, 5);
  EXPECT_EQ(s.n_sampled, 2);
  EXPECT_DOUBLE_EQ(s.attn_kpairs, 0.111);
  s.remove(0, 4, true);
  EXPECT_EQ(s.n_seqs, 1);
  EXPECT_EQ(s.n_tokens, 1);
  EXPECT_DOUBLE_EQ(s.attn_kpairs, 0.101);
}

// ---- StepCostModel ----------------------------------------------------------------------

StepShape random_shape(std::mt19937& rng) {
  StepShape s;
  const int n_dec = int(rng() % 17);
  for (int i = 0; i < n_dec; ++i) s.add(int64_t(rng() % 2000), 1, true);
  if (rng() % 2 || n_dec == 0) {
    const int64_t chunk = 1 + int64_t(rng() % 256);
    s.add(int64_t(rng() % 1000), chunk, rng() % 3 == 0);
  }
  return s;
}

double true_ms(const StepShape& s, double scale = 1.0) {
  return scale * (12.0 + 0.9 * double(s.n_tokens) + 2.5 * double(s.n_sampled) + 0.004 * s.attn_kpairs);
}

TEST(StepCostModel, RecoversTheCoefficientsOfALinearMachine) {
  StepCostModel m(128);
  std::mt19937 rng(7);
  EXPECT_FALSE(m.ready());
  for (int i = 0; i < 200; ++i) {
    const StepShape s = random_shape(rng);
    m.observe(s, true_ms(s));
  }
  ASSERT_TRUE(m.ready());
  EXPECT_NEAR(m.coefs()[0], 12.0, 1e-4);
  EXPECT_NEAR(m.coefs()[1], 0.9, 1e-6);
  EXPECT_NEAR(m.coefs()[2], 2.5, 1e-5);
  EXPECT_NEAR(m.coefs()[3], 0.004, 1e-7);
  for (int i = 0; i < 20; ++i) {
    const StepShape s = random_shape(rng);
    EXPECT_NEAR(m.predict_ms(s), true_ms(s), 1e-3);
  }
  EXPECT_LT(m.rel_error_p90(), 1e-4);
}

TEST(StepCostModel, OneStepSizeIsNotEnoughToPredict) {
  StepCostModel m;
  StepShape decode;
  decode.add(10, 1, true);
  for (int i = 0; i < 50; ++i) m.observe(decode, 20.0);
  EXPECT_FALSE(m.ready());
  EXPECT_EQ(m.predict_ms(decode), 0.0);
  StepShape prefill;
  prefill.add(0, 64, true);
  m.observe_anchor(prefill, 80.0);
  EXPECT_TRUE(m.ready());
  EXPECT_NEAR(m.predict_ms(decode), 20.0, 0.5);
  EXPECT_NEAR(m.predict_ms(prefill), 80.0, 0.5);
}

TEST(StepCostModel, CoefficientsStayNonNegativeSoPredictionsNeverDecrease) {
  // A machine whose time goes *down* with attention (noise, caches): a plain least-squares fit
  // would give attention a negative coefficient, and a longer step could be predicted shorter.
  StepCostModel m(64);
  std::mt19937 rng(3);
  for (int i = 0; i < 64; ++i) {
    const StepShape s = random_shape(rng);
    m.observe(s, std::max(1.0, 10.0 + 1.0 * double(s.n_tokens) - 0.05 * s.attn_kpairs));
  }
  ASSERT_TRUE(m.ready());
  for (double c : m.coefs()) EXPECT_GE(c, 0.0);
  StepShape a;
  a.add(0, 8, true);
  StepShape b = a;
  b.add(4000, 1, true);
  EXPECT_GE(m.predict_ms(b), m.predict_ms(a));
}

TEST(StepCostModel, FollowsAMachineThatSlowsDown) {
  StepCostModel m(64);
  std::mt19937 rng(11);
  for (int i = 0; i < 64; ++i) {
    const StepShape s = random_shape(rng);
    m.observe(s, true_ms(s));
  }
  StepShape probe;
  probe.add(0, 100, true);
  EXPECT_NEAR(m.predict_ms(probe), true_ms(probe), 1e-3);
  for (int i = 0; i < 64; ++i) {  // the window turns over: another process now shares the cores
    const StepShape s = random_shape(rng);
    m.observe(s, true_ms(s, 2.0));
  }
  EXPECT_NEAR(m.predict_ms(probe), true_ms(probe, 2.0), 1e-3);
}

TEST(StepCostModel, AFewDisturbedStepsDoNotMoveTheFit) {
  // 10% of the steps took 5x longer (another process took the cores): the trimmed fit still
  // gives the machine's own cost.
  StepCostModel m(200);
  std::mt19937 rng(17);
  for (int i = 0; i < 200; ++i) {
    const StepShape s = random_shape(rng);
    m.observe(s, true_ms(s) * (i % 10 == 3 ? 5.0 : 1.0));
  }
  StepShape probe;
  probe.add(300, 40, true);
  probe.add(100, 1, true);
  EXPECT_NEAR(m.predict_ms(probe), true_ms(probe), 0.01 * true_ms(probe));
}

TEST(StepCostModel, IgnoresNonFiniteAndNegativeTimes) {
  StepCostModel m;
  StepShape s;
  s.add(0, 4, true);
  m.observe(s, std::nan(""));
  m.observe(s, -1.0);
  m.observe(s, INFINITY);
  EXPECT_EQ(m.n_observed(), 0);
}

// ---- the scheduler under a step-time target ---------------------------------------------

// t = 10 + 1 per token + 2 per sampled row (+ attention) ms: a decode of 16 sequences
// costs 58 ms; a target of 80 ms leaves room for ~22 prefill tokens beside them.
struct FakeCost final : StepCostPredictor {
  double fixed = 10, per_token = 1, per_sampled = 2, per_kpair = 0.001;
  double predict_ms(const StepShape& s) const override {
    return fixed + per_token * double(s.n_tokens) + per_sampled * double(s.n_sampled) + per_kpair * s.attn_kpairs;
  }
};

std::vector<int32_t> prompt_of(int64_t n, int32_t seed) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int32_t((seed * 7919 + i * 31) % FakeEngine::kVocab);
  return v;
}

SchedulerConfig cfg(int64_t budget) {
  SchedulerConfig c;
  c.max_batch_tokens = budget;
  c.max_running = 64;
  return c;
}

struct StepStats {
  int64_t steps = 0, with_decodes = 0, over_target = 0, floor_steps = 0, stalled_prefill = 0;
};

// Runs everything, checking on each step: a step with decodes stays under the target unless
// it is the smallest step that makes progress (its prefill is one token); whenever prefill is
// pending (a running prompt or a waiting request), the step advances some prefill.
StepStats run_checked(FakeEngine& e, const FakeCost& cost, double target) {
  StepStats st;
  for (int guard = 0; guard < 200000 && e.sched().n_running() + e.sched().n_waiting() > 0; ++guard) {
    // Prefill pending before the step?
    bool pending = e.sched().n_waiting() > 0;
    for (SeqId id : e.active())
      if (e.sched().contains(id) && e.sched().is_running(id) &&
          int64_t(e.sched().tokens(id).size()) - e.sched().block_table(id).n_computed > 1)
        pending = true;
    if (!e.step()) break;
    e.sched().check_invariants();
    const StepPlan& p = e.last_plan();
    ++st.steps;
    int64_t decodes = 0, prefill = 0;
    for (const ScheduledSeq& s : p.seqs) (s.prefill ? prefill : decodes) += s.prefill ? s.n_tokens : 1;
    EXPECT_DOUBLE_EQ(p.predicted_ms, cost.predict_ms(p.shape));
    if (decodes > 0) {
      ++st.with_decodes;
      if (p.predicted_ms > target) {
        ++st.over_target;
        // Only the smallest step that makes progress: the decodes (never starved) and one
        // prompt token if any prompt is pending.
        EXPECT_EQ(prefill, pending ? 1 : 0) << "a step over the target that is not the smallest progressing one";
        if (prefill == 1) ++st.floor_steps;
      }
    }
    if (pending && prefill == 0) ++st.stalled_prefill;
  }
  return st;
}

TEST(SchedulerStepTarget, NoStepWithDecodesExceedsTheTargetAndPrefillNeverStops) {
  FakeCost cost;
  const double target = 80;
  FakeEngine e(4096, 16, cfg(512));
  e.sched().set_step_target(&cost, target);
  std::mt19937 rng(5);
  std::vector<std::pair<SeqId, std::pair<std::vector<int32_t>, int64_t>>> reqs;
  // 16 streams decoding, then long prompts arriving while they run.
  for (int i = 0; i < 16; ++i) {
    auto p = prompt_of(8 + int64_t(rng() % 40), i);
    const int64_t n_gen = 30 + int64_t(rng() % 60);
    reqs.push_back({e.add(p, n_gen), {p, n_gen}});
  }
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(e.step());
  for (int i = 0; i < 8; ++i) {
    auto p = prompt_of(100 + int64_t(rng() % 300), 100 + i);
    reqs.push_back({e.add(p, 5), {p, 5}});
  }
  const StepStats st = run_checked(e, cost, target);
  EXPECT_GT(st.with_decodes, 50);
  EXPECT_EQ(st.over_target, 0);  // 16 decodes (58 ms) leave room: never needs the floor
  EXPECT_EQ(st.stalled_prefill, 0);
  for (auto& [id, pr] : reqs) EXPECT_EQ(e.finished().at(id), fake_generate_alone(pr.first, pr.second, FakeEngine::kVocab));
  EXPECT_EQ(e.kv().n_used_blocks(), 0);
}

TEST(SchedulerStepTarget, WithoutATargetTheBudgetAloneLimits) {
  FakeCost cost;
  FakeEngine e(4096, 16, cfg(512));
  const SeqId a = e.add(prompt_of(4, 1), 40);
  ASSERT_TRUE(e.step());
  e.add(prompt_of(400, 2), 2);
  ASSERT_TRUE(e.step());
  EXPECT_EQ(e.last_plan().n_tokens, 401);  // a's decode + the whole prompt
  EXPECT_EQ(e.last_plan().predicted_ms, 0.0);
  e.sched().set_step_target(&cost, 80);
  e.sched().set_step_target(nullptr, 80);  // off again
  e.run_to_completion();
  EXPECT_TRUE(e.finished().count(a));
}

TEST(SchedulerStepTarget, ALongPromptIsSpreadAcrossStepsBesideTheDecodes) {
  FakeCost cost;
  FakeEngine e(4096, 16, cfg(512));
  e.sched().set_step_target(&cost, 40);
  const SeqId a = e.add(prompt_of(4, 1), 100);
  ASSERT_TRUE(e.step());  // no decode yet: the prompt goes in whole
  EXPECT_FALSE(e.last_plan().time_limited);
  const SeqId b = e.add(prompt_of(300, 2), 3);
  std::vector<int64_t> chunks;
  while (e.is_active(b)) {
    ASSERT_TRUE(e.step());
    const auto& p = e.last_plan();
    ASSERT_EQ(p.seqs[0].id, a);
    EXPECT_LE(p.predicted_ms, 40.0 + 1e-9);
    if (p.seqs.size() > 1 && p.seqs[1].prefill) chunks.push_back(p.seqs[1].n_tokens);
  }
  // 40 ms - (10 fixed + 1 + 2 for a's decode) = 27 ms: 26 prompt tokens a step (27 would
  // exceed the target by the attention's 0.0004 ms), the rest in the last chunk.
  ASSERT_GE(chunks.size(), 11u);
  EXPECT_EQ(chunks[0], 26);
  int64_t sum = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    sum += chunks[i];
    if (i + 1 < chunks.size()) {
      EXPECT_GE(chunks[i], 24);
    }
  }
  EXPECT_EQ(sum, 300);
  e.run_to_completion();
  EXPECT_EQ(e.finished().at(b), fake_generate_alone(prompt_of(300, 2), 3, FakeEngine::kVocab));
}

TEST(SchedulerStepTarget, AnImpossibleTargetStillRunsTheSmallestProgressingStep) {
  FakeCost cost;
  const double target = 20;  // 16 decodes alone take 58 ms
  FakeEngine e(4096, 16, cfg(512));
  std::vector<std::pair<SeqId, std::vector<int32_t>>> reqs;
  for (int i = 0; i < 16; ++i) {
    auto p = prompt_of(6, i);
    reqs.push_back({e.add(p, 40), p});
  }
  ASSERT_TRUE(e.step());
  e.sched().set_step_target(&cost, target);
  auto p = prompt_of(30, 99);
  const SeqId late = e.add(p, 4);
  reqs.push_back({late, p});
  const StepStats st = run_checked(e, cost, target);
  EXPECT_GT(st.floor_steps, 20);  // one prompt token per step while the 16 decode
  EXPECT_EQ(st.stalled_prefill, 0);
  for (auto& [id, pr] : reqs)
    EXPECT_EQ(e.finished().at(id), fake_generate_alone(pr, id == late ? 4 : 40, FakeEngine::kVocab));
}

TEST(SchedulerStepTarget, PrioritiesOrderAdmission) {
  FakeCost cost;
  FakeEngine e(4096, 16, cfg(512));
  e.sched().set_step_target(&cost, 30);
  e.add(prompt_of(4, 1), 200);
  ASSERT_TRUE(e.step());
  // Three waiting: the most urgent (lowest value) is admitted first although it came last.
  const SeqId low = e.add(prompt_of(50, 2), 2, /*priority=*/5);
  const SeqId mid = e.add(prompt_of(50, 3), 2, /*priority=*/1);
  const SeqId high = e.add(prompt_of(50, 4), 2, /*priority=*/-3);
  std::vector<SeqId> admitted;
  while (admitted.size() < 3) {
    ASSERT_TRUE(e.step());
    for (const ScheduledSeq& s : e.last_plan().seqs)
      if (s.prefill && s.n_past == 0 && std::find(admitted.begin(), admitted.end(), s.id) == admitted.end())
        admitted.push_back(s.id);
  }
  EXPECT_EQ(admitted, (std::vector<SeqId>{high, mid, low}));
  e.run_to_completion();
}

TEST(SchedulerStepTarget, ChunkingUnderATargetChangesNoToken) {
  // Random mixes with preemption (a small arena), prefix hits and forks, under tight and loose
  // targets: every output equals the sequence run alone.
  for (double target : {15.0, 45.0, 200.0}) {
    FakeCost cost;
    FakeEngine e(40, 8, cfg(96));
    e.sched().set_step_target(&cost, target);
    std::mt19937 rng{uint32_t(target)};
    std::vector<std::tuple<SeqId, std::vector<int32_t>, int64_t>> reqs;
    for (int i = 0; i < 24; ++i) {
      auto p = prompt_of(1 + int64_t(rng() % 60), int32_t(i % 5));  // repeats: prefix hits
      const int64_t n_gen = 1 + int64_t(rng() % 20);
      reqs.emplace_back(e.add(p, n_gen, int(rng() % 3)), p, n_gen);
      if (i % 3 == 0) {
        ASSERT_TRUE(e.step());
      }
    }
    e.run_to_completion();
    for (auto& [id, p, n] : reqs) EXPECT_EQ(e.finished().at(id), fake_generate_alone(p, n, FakeEngine::kVocab)) << target;
    EXPECT_EQ(e.kv().n_used_blocks(), 0);
  }
}

}  // namespace
}  // namespace tern::test_step_cost
