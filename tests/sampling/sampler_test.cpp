// Sampler: greedy, each filter on hand-made distributions, penalties, seeding, empirical
// frequencies against an independent brute-force reference, logprobs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "core/error.h"
#include "sampling/sampler.h"

namespace tern {
namespace {

// Every filter off, plain softmax at temperature 1: the baseline the tests switch filters on from.
SamplingParams plain() {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  return p;
}

SamplingParams greedy() {
  SamplingParams p = plain();
  p.temperature = 0.0f;
  return p;
}

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

// Counts of each id over n draws with an empty history.
std::vector<int> draw_counts(const SamplingParams& params, const std::vector<float>& logits, int n) {
  Sampler s(params, static_cast<int32_t>(logits.size()));
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < n; ++i) {
    const int32_t id = s.sample(logits.data(), {});
    EXPECT_GE(id, 0);
    EXPECT_LT(id, static_cast<int32_t>(logits.size()));
    ++counts[static_cast<size_t>(id)];
  }
  return counts;
}

std::set<int32_t> drawn_ids(const SamplingParams& params, const std::vector<float>& logits, int n) {
  const std::vector<int> counts = draw_counts(params, logits, n);
  std::set<int32_t> ids;
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i] > 0) ids.insert(static_cast<int32_t>(i));
  return ids;
}

// Independent oracle: full sort, then the chain exactly as documented, step by step with
// renormalisation in between. Returns the final distribution (0 for filtered ids).
std::vector<double> reference_distribution(const SamplingParams& p, const std::vector<float>& logits) {
  const size_t n = logits.size();
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t keep = n;
  if (p.top_k > 0) keep = std::min(keep, static_cast<size_t>(p.top_k));
  auto softmax_prefix = [&](size_t m, double temp) {
    std::vector<double> pr(m);
    double sum = 0.0;
    for (size_t i = 0; i < m; ++i) sum += pr[i] = std::exp((logits[order[i]] - logits[order[0]]) / temp);
    for (double& x : pr) x /= sum;
    return pr;
  };
  if (p.top_p < 1.0f) {
    const std::vector<double> pr = softmax_prefix(keep, 1.0);
    double cum = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      cum += pr[i];
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    const std::vector<double> pr = softmax_prefix(keep, 1.0);
    size_t m = 0;
    while (m < keep && pr[m] >= p.min_p * pr[0]) ++m;
    keep = m;
  }
  const std::vector<double> pr = softmax_prefix(keep, p.temperature);
  std::vector<double> dist(n, 0.0);
  for (size_t i = 0; i < keep; ++i) dist[static_cast<size_t>(order[i])] = pr[i];
  return dist;
}

// Pearson chi-square of observed counts against expected probabilities (bins with p > 0).
// Also fails if any draw landed on a probability-0 id.
double chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int n, int* dof) {
  double chi = 0.0;
  *dof = -1;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (probs[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "id " << i << " has probability 0";
      continue;
    }
    const double e = probs[i] * n;
    chi += (counts[i] - e) * (counts[i] - e) / e;
    ++*dof;
  }
  return chi;
}

// --- greedy ---------------------------------------------------------------------------------

TEST(SamplerGreedy, PicksArgmax) {
  const std::vector<float> l = {0.1f, 2.5f, -1.0f, 2.4f};
  Sampler s(greedy(), 4);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(s.sample(l.data(), {}), 1);
}

TEST(SamplerGreedy, TiesGoToLowestId) {
  const std::vector<float> l = {1.0f, 3.0f, 0.0f, 3.0f, 3.0f};
  Sampler s(greedy(), 5);
  EXPECT_EQ(s.sample(l.data(), {}), 1);
  const std::vector<float> all_equal(7, -2.0f);
  Sampler s7(greedy(), 7);
  EXPECT_EQ(s7.sample(all_equal.data(), {}), 0);
}

TEST(SamplerGreedy, TopK1EqualsGreedyAtAnyTemperature) {
  std::mt19937 gen(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> l(1000);
  for (float& x : l) x = nd(gen);
  const int32_t argmax = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  SamplingParams p = plain();
  p.top_k = 1;
  p.temperature = 5.0f;
  Sampler s(p, 1000);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.sample(l.data(), {}), argmax);
}

TEST(SamplerGreedy, TinyTemperatureIsEffectivelyGreedy) {
  const std::vector<float> l = {1.0f, 1.5f, 1.4f};
  // 1e-45 is denormal: 1 / T overflows float, which must not turn the weights into NaN.
  for (float temp : {1e-4f, 1e-30f, 1e-45f}) {
    SamplingParams p = plain();
    p.temperature = temp;
    Sampler s(p, 3);
    for (int i = 0; i < 1000; ++i) EXPECT_EQ(s.sample(l.data(), {}), 1) << "temperature " << temp;
  }
}

// --- filters in isolation -------------------------------------------------------------------

TEST(SamplerFilters, TopKNeverDrawsOutsideTheTopK) {
  // Nearly flat so every id would be drawn often without the filter.
  const std::vector<float> l = {0.0f, 0.3f, 0.1f, 0.25f, 0.2f, 0.05f};
  SamplingParams p = plain();
  p.top_k = 2;
  EXPECT_EQ(drawn_ids(p, l, 20000), (std::set<int32_t>{1, 3}));
}

TEST(SamplerFilters, TopKTieAtTheBoundaryKeepsLowerId) {
  const std::vector<float> l = {1.0f, 2.0f, 1.0f, 1.0f};
  SamplingParams p = plain();
  p.top_k = 2;
  EXPECT_EQ(drawn_ids(p, l, 5000), (std::set<int32_t>{0, 1}));
}

TEST(SamplerFilters, TopKLargerThanVocabIsOff) {
  const std::vector<float> l = {0.0f, 0.1f, 0.2f};
  SamplingParams p = plain();
  p.top_k = 100;
  EXPECT_EQ(drawn_ids(p, l, 5000), (std::set<int32_t>{0, 1, 2}));
}

TEST(SamplerFilters, TopPKeepsSmallestPrefixReachingP) {
  // Sorted mass: 0.5, 0.8, 0.95, 1.0 (ids listed out of order on purpose).
  const std::vector<float> l = logits_of({0.15, 0.5, 0.05, 0.3});
  SamplingParams p = plain();
  p.top_p = 0.49f;
  EXPECT_EQ(drawn_ids(p, l, 5000), (std::set<int32_t>{1}));
  p.top_p = 0.51f;
  EXPECT_EQ(drawn_ids(p, l, 5000), (std::set<int32_t>{1, 3}));
  p.top_p = 0.79f;
  EXPECT_EQ(drawn_ids(p, l, 5000), (std::set<int32_t>{1, 3}));
  p.top_p = 0.81f;
  EXPECT_EQ(drawn_ids(p, l, 5000), (std::set<int32_t>{0, 1, 3}));
  p.top_p = 0.96f;
  EXPECT_EQ(drawn_ids(p, l, 20000), (std::set<int32_t>{0, 1, 2, 3}));
}

TEST(SamplerFilters, TopPZeroKeepsOnlyTheBest) {
  const std::vector<float> l = {0.0f, 0.01f, 0.02f};
  SamplingParams p = plain();
  p.top_p = 0.0f;
  EXPECT_EQ(drawn_ids(p, l, 2000), (std::set<int32_t>{2}));
}

TEST(SamplerFilters, TopPIsNormalisedOverTheTopKSet) {
  // Over all four tokens id 0 has mass 0.4 < 0.5; over top-2 it has 0.4/0.7 = 0.57 >= 0.5.
  const std::vector<float> l = logits_of({0.4, 0.3, 0.2, 0.1});
  SamplingParams p = plain();
  p.top_p = 0.5f;
  EXPECT_EQ(drawn_ids(p, l, 5000), (std::set<int32_t>{0, 1}));
  p.top_k = 2;
  EXPECT_EQ(drawn_ids(p, l, 5000), (std::set<int32_t>{0}));
}

TEST(SamplerFilters, MinPKeepsTokensAboveFractionOfMax) {
  const std::vector<float> l = logits_of({0.1, 0.4, 0.2, 0.3});
  SamplingParams p = plain();
  p.min_p = 0.6f;  // threshold 0.24
  EXPECT_EQ(drawn_ids(p, l, 5000), (std::set<int32_t>{1, 3}));
  p.min_p = 0.45f;  // threshold 0.18
  EXPECT_EQ(drawn_ids(p, l, 5000), (std::set<int32_t>{1, 2, 3}));
  p.min_p = 1.0f;
  EXPECT_EQ(drawn_ids(p, l, 5000), (std::set<int32_t>{1}));
}

TEST(SamplerFilters, MinPAfterTopPMatchesTheChain) {
  // top-p 0.6 keeps {0,1}; min-p 0.8 then drops id 1 (0.3 < 0.8 * 0.4).
  const std::vector<float> l = logits_of({0.4, 0.3, 0.2, 0.1});
  SamplingParams p = plain();
  p.top_p = 0.6f;
  p.min_p = 0.8f;
  EXPECT_EQ(drawn_ids(p, l, 5000), (std::set<int32_t>{0}));
}

TEST(SamplerFilters, MaskedLogitsAreNeverDrawn) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const std::vector<float> l = {ninf, 0.0f, ninf, 0.5f, ninf};
  EXPECT_EQ(drawn_ids(plain(), l, 5000), (std::set<int32_t>{1, 3}));
  const std::vector<float> all_masked(4, ninf);
  EXPECT_EQ(drawn_ids(plain(), all_masked, 10), (std::set<int32_t>{0}));
}

TEST(SamplerFilters, NanAndInfLogitsDoNotBreakSampling) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(drawn_ids(plain(), {nan, 1.0f, nan}, 1000), (std::set<int32_t>{1}));
  EXPECT_EQ(drawn_ids(plain(), {0.0f, inf, 3.0f}, 1000), (std::set<int32_t>{1}));
}

// --- penalties --------------------------------------------------------------------------------
// Greedy probes: each pair of cases sits on either side of the penalised value, so a wrong
// formula flips the pick.

int32_t greedy_pick(SamplingParams p, const std::vector<float>& l, const std::vector<int32_t>& history) {
  p.temperature = 0.0f;
  Sampler s(p, static_cast<int32_t>(l.size()));
  return s.sample(l.data(), history);
}

TEST(SamplerPenalties, RepeatPenaltyDividesPositiveLogits) {
  const std::vector<float> l = {2.0f, 1.5f};
  SamplingParams p = plain();
  p.repeat_penalty = 1.5f;  // 2 / 1.5 = 1.33 < 1.5
  EXPECT_EQ(greedy_pick(p, l, {0}), 1);
  p.repeat_penalty = 1.2f;  // 2 / 1.2 = 1.67 > 1.5
  EXPECT_EQ(greedy_pick(p, l, {0}), 0);
  // Counted once however often it occurs.
  EXPECT_EQ(greedy_pick(p, l, {0, 0, 0, 0}), 0);
}

TEST(SamplerPenalties, RepeatPenaltyMultipliesNegativeLogits) {
  const std::vector<float> l = {-1.0f, -1.1f};
  SamplingParams p = plain();
  p.repeat_penalty = 1.2f;  // -1.2 < -1.1 (dividing would give -0.83 and keep id 0)
  EXPECT_EQ(greedy_pick(p, l, {0}), 1);
  p.repeat_penalty = 1.05f;  // -1.05 > -1.1
  EXPECT_EQ(greedy_pick(p, l, {0}), 0);
}

TEST(SamplerPenalties, FrequencyPenaltyScalesWithCount) {
  const std::vector<float> l = {3.0f, 2.0f};
  SamplingParams p = plain();
  p.frequency_penalty = 0.3f;  // 3 - 3 * 0.3 = 2.1
  EXPECT_EQ(greedy_pick(p, l, {0, 0, 0}), 0);
  p.frequency_penalty = 0.4f;  // 3 - 3 * 0.4 = 1.8
  EXPECT_EQ(greedy_pick(p, l, {0, 0, 0}), 1);
  EXPECT_EQ(greedy_pick(p, l, {0, 0}), 0);  // 3 - 0.8 = 2.2
}

TEST(SamplerPenalties, PresencePenaltyIgnoresCount) {
  const std::vector<float> l = {3.0f, 2.0f};
  SamplingParams p = plain();
  p.presence_penalty = 0.9f;
  EXPECT_EQ(greedy_pick(p, l, {0, 0, 0, 0, 0}), 0);  // 2.1
  p.presence_penalty = 1.1f;
  EXPECT_EQ(greedy_pick(p, l, {0}), 1);  // 1.9
}

TEST(SamplerPenalties, AllThreeCombine) {
  // 4 / 2 - 2 * 0.25 - 0.4 = 1.1 vs 1.0 and 1.2.
  SamplingParams p = plain();
  p.repeat_penalty = 2.0f;
  p.frequency_penalty = 0.25f;
  p.presence_penalty = 0.4f;
  EXPECT_EQ(greedy_pick(p, {4.0f, 1.0f}, {0, 0}), 0);
  EXPECT_EQ(greedy_pick(p, {4.0f, 1.2f}, {0, 0}), 1);
}

TEST(SamplerPenalties, WindowLimitsWhichTokensCount) {
  const std::vector<float> l = {3.0f, 2.0f, 0.0f};
  SamplingParams p = plain();
  p.presence_penalty = 2.0f;
  p.penalty_last_n = 2;
  EXPECT_EQ(greedy_pick(p, l, {0, 2, 2}), 0);  // id 0 is outside the last 2
  EXPECT_EQ(greedy_pick(p, l, {2, 0, 2}), 1);
  p.penalty_last_n = 0;
  EXPECT_EQ(greedy_pick(p, l, {0, 0, 0}), 0);  // 0: penalties off
  p.penalty_last_n = -1;
  std::vector<int32_t> long_history(1000, 2);
  long_history[0] = 0;
  EXPECT_EQ(greedy_pick(p, l, long_history), 1);  // -1: the whole history
  p.penalty_last_n = 64;
  EXPECT_EQ(greedy_pick(p, l, long_history), 0);
}

TEST(SamplerPenalties, OutOfVocabHistoryIdsAreIgnored) {
  SamplingParams p = plain();
  p.presence_penalty = 5.0f;
  EXPECT_EQ(greedy_pick(p, {3.0f, 2.0f}, {-1, 2, 100000}), 0);
}

TEST(SamplerPenalties, PenalisedDistributionMatchesSoftmax) {
  // [1, 1] with id 0 seen and repeat 2 -> [0.5, 1]: p0 = 1 / (1 + e^0.5).
  SamplingParams p = plain();
  p.repeat_penalty = 2.0f;
  const std::vector<float> l = {1.0f, 1.0f};
  const std::vector<int32_t> history = {0};
  Sampler s(p, 2);
  const int n = 100000;
  int zeros = 0;
  for (int i = 0; i < n; ++i) zeros += s.sample(l.data(), history) == 0;
  EXPECT_NEAR(static_cast<double>(zeros) / n, 1.0 / (1.0 + std::exp(0.5)), 0.006);
}

TEST(SamplerPenalties, PenaltiesApplyBeforeTopK) {
  // Penalised id 0 falls below id 2, so top-2 is {1, 2}.
  SamplingParams p = plain();
  p.top_k = 2;
  p.presence_penalty = 1.0f;
  Sampler s(p, 3);
  const std::vector<float> l = {3.0f, 2.9f, 2.5f};
  const std::vector<int32_t> history = {0};
  std::set<int32_t> seen;
  for (int i = 0; i < 5000; ++i) seen.insert(s.sample(l.data(), history));
  EXPECT_EQ(seen, (std::set<int32_t>{1, 2}));
}

// --- seeding ----------------------------------------------------------------------------------

std::vector<int32_t> draw_sequence(const SamplingParams& p, const std::vector<float>& l, int n) {
  Sampler s(p, static_cast<int32_t>(l.size()));
  std::vector<int32_t> history;
  for (int i = 0; i < n; ++i) history.push_back(s.sample(l.data(), history));
  return history;
}

TEST(SamplerSeed, SameSeedSameSequenceDifferentSeedDifferent) {
  std::mt19937 gen(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> l(500);
  for (float& x : l) x = nd(gen);
  SamplingParams p;  // defaults: every filter on, plus penalties to exercise the history path
  p.temperature = 1.2f;
  p.top_k = 100;
  p.top_p = 0.9f;
  p.min_p = 0.01f;
  p.repeat_penalty = 1.1f;
  p.frequency_penalty = 0.1f;
  p.seed = 1234;
  const std::vector<int32_t> a = draw_sequence(p, l, 1000);
  const std::vector<int32_t> b = draw_sequence(p, l, 1000);
  EXPECT_EQ(a, b);
  p.seed = 1235;
  const std::vector<int32_t> c = draw_sequence(p, l, 1000);
  EXPECT_NE(a, c);
  // Not a degenerate sequence.
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 20u);
}

TEST(SamplerSeed, GoldenSequenceIsStable) {
  // Pins the draw to the documented recipe (mt19937_64, top 53 bits, id-order cumulative
  // walk): with uniform logits over 2^k ids the pick is simply floor(u * 2^k), so the expected
  // ids come straight from the raw engine.
  SamplingParams p = plain();
  p.seed = 42;
  const std::vector<float> l(1024, 0.5f);
  Sampler s(p, 1024);
  std::mt19937_64 ref(42);
  for (int i = 0; i < 200; ++i) {
    const double u = static_cast<double>(ref() >> 11) * 0x1.0p-53;
    EXPECT_EQ(s.sample(l.data(), {}), static_cast<int32_t>(u * 1024)) << "draw " << i;
  }
}

// --- empirical frequencies -----------------------------------------------------------------

TEST(SamplerDistribution, PlainSoftmaxFrequenciesMatch) {
  const std::vector<float> l = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, -3.0f, 1.5f, 0.2f};
  const std::vector<double> probs = reference_distribution(plain(), l);
  const int n = 200000;
  const std::vector<int> counts = draw_counts(plain(), l, n);
  for (size_t i = 0; i < l.size(); ++i)
    EXPECT_NEAR(static_cast<double>(counts[i]) / n, probs[i], 0.005) << "id " << i;
  int dof = 0;
  const double chi = chi_square(counts, probs, n, &dof);
  EXPECT_EQ(dof, 7);
  EXPECT_LT(chi, 24.3);  // 99.9th percentile of chi-square with 7 degrees of freedom
}

TEST(SamplerDistribution, FullChainMatchesReference) {
  // Each case: top_k, top_p, min_p, temperature.
  struct Case {
    int32_t top_k;
    float top_p, min_p, temperature;
  };
  const Case cases[] = {
      {5, 1.0f, 0.0f, 1.0f},   {0, 0.8f, 0.0f, 1.0f},  {0, 1.0f, 0.1f, 1.0f},
      {0, 1.0f, 0.0f, 0.5f},   {0, 1.0f, 0.0f, 2.0f},  {8, 0.9f, 0.05f, 0.7f},
      {12, 0.95f, 0.02f, 1.5f}};
  std::mt19937 gen(3);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  std::vector<float> l(16);
  for (float& x : l) x = nd(gen);
  for (const Case& c : cases) {
    SamplingParams p = plain();
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.temperature = c.temperature;
    const std::vector<double> probs = reference_distribution(p, l);
    const int n = 100000;
    const std::vector<int> counts = draw_counts(p, l, n);
    int dof = 0;
    const double chi = chi_square(counts, probs, n, &dof);
    // Loose bound (> 99.9th percentile for dof <= 15) so the test checks the shape, not luck.
    EXPECT_LT(chi, 40.0) << "top_k=" << c.top_k << " top_p=" << c.top_p << " min_p=" << c.min_p
                         << " temp=" << c.temperature;
    for (size_t i = 0; i < l.size(); ++i)
      EXPECT_NEAR(static_cast<double>(counts[i]) / n, probs[i], 0.007) << "id " << i;
  }
}

// Large vocabularies take the chunked top-p path and the scan-based rebuild; the kept set must
// equal the brute-force reference exactly.
TEST(SamplerDistribution, LargeVocabKeepsExactlyTheReferenceSet) {
  const int32_t n_vocab = 150000;
  std::mt19937 gen(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct Case {
    int32_t top_k;
    float top_p, min_p, sigma;
  };
  // sigma 0.05 is nearly flat, so top-p keeps most of the vocab; sigma 6 is peaked.
  const Case cases[] = {{40, 0.95f, 0.05f, 6.0f}, {0, 0.5f, 0.0f, 6.0f},
                        {0, 0.3f, 0.0f, 0.05f},   {0, 0.9f, 0.0f, 0.05f},
                        {20000, 0.9f, 0.0f, 0.05f}, {0, 1.0f, 0.9f, 0.05f}};
  for (const Case& c : cases) {
    std::vector<float> l(n_vocab);
    for (float& x : l) x = nd(gen) * c.sigma;
    SamplingParams p = plain();
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    const std::vector<double> probs = reference_distribution(p, l);
    Sampler s(p, n_vocab);
    for (int i = 0; i < 100; ++i) {
      const int32_t id = s.sample(l.data(), {});
      ASSERT_GE(id, 0);
      ASSERT_LT(id, n_vocab);
      ASSERT_GT(probs[static_cast<size_t>(id)], 0.0) << "drew filtered id " << id;
    }
  }
}

// Over 1024 candidates top-p takes the histogram path; every id of the reference set must be
// drawn and no other, so a cut one token early or late fails.
TEST(SamplerDistribution, BucketedTopPKeepsExactlyTheReferenceSet) {
  const int32_t n_vocab = 3000;
  std::vector<float> l(n_vocab);
  std::vector<int32_t> rank(n_vocab);
  std::iota(rank.begin(), rank.end(), 0);
  std::shuffle(rank.begin(), rank.end(), std::mt19937(4));
  for (int32_t i = 0; i < n_vocab; ++i) l[i] = -0.0005f * static_cast<float>(rank[i]);
  SamplingParams p = plain();
  p.top_p = 0.56f;  // keeps ~1150 ids; the rarest expects ~38 draws
  const std::vector<double> probs = reference_distribution(p, l);
  const std::vector<int> counts = draw_counts(p, l, 60000);
  size_t kept = 0;
  for (int32_t i = 0; i < n_vocab; ++i) {
    if (probs[i] > 0.0) {
      ++kept;
      EXPECT_GT(counts[i], 0) << "id " << i << " is in the top-p set but never drawn";
    } else {
      EXPECT_EQ(counts[i], 0) << "id " << i << " is outside the top-p set";
    }
  }
  EXPECT_GT(kept, 1024u);  // really the histogram path, not the small-set sort
  EXPECT_LT(kept, 1300u);
}

// --- validation -----------------------------------------------------------------------------

void expect_invalid(const SamplingParams& p, const std::string& field) {
  try {
    p.validate();
    ADD_FAILURE() << "no error for " << field;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
  EXPECT_THROW(Sampler(p, 10), Error) << field;
}

TEST(SamplerValidate, DefaultsAreValid) {
  EXPECT_NO_THROW(SamplingParams{}.validate());
  SamplingParams edge;
  edge.temperature = 0.0f;
  edge.top_p = 0.0f;
  edge.min_p = 1.0f;
  edge.penalty_last_n = -1;
  edge.top_k = -5;
  edge.frequency_penalty = -1.0f;
  EXPECT_NO_THROW(edge.validate());
}

TEST(SamplerValidate, OutOfRangeFieldsAreNamed) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  SamplingParams p;
  p.temperature = -0.1f;
  expect_invalid(p, "temperature");
  p = {};
  p.temperature = nan;
  expect_invalid(p, "temperature");
  p = {};
  p.top_p = -0.01f;
  expect_invalid(p, "top_p");
  p = {};
  p.top_p = 1.01f;
  expect_invalid(p, "top_p");
  p = {};
  p.min_p = -0.5f;
  expect_invalid(p, "min_p");
  p = {};
  p.min_p = 2.0f;
  expect_invalid(p, "min_p");
  p = {};
  p.min_p = nan;
  expect_invalid(p, "min_p");
  p = {};
  p.repeat_penalty = 0.0f;
  expect_invalid(p, "repeat_penalty");
  p = {};
  p.repeat_penalty = -1.0f;
  expect_invalid(p, "repeat_penalty");
  p = {};
  p.penalty_last_n = -2;
  expect_invalid(p, "penalty_last_n");
  p = {};
  p.frequency_penalty = std::numeric_limits<float>::infinity();
  expect_invalid(p, "frequency_penalty");
}

TEST(SamplerValidate, BadVocabSizeThrows) {
  EXPECT_THROW(Sampler(SamplingParams{}, 0), Error);
}

// --- logprobs -------------------------------------------------------------------------------

TEST(SamplerLogprobs, ExpSumsToOne) {
  std::mt19937 gen(5);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  std::vector<float> l(5000);
  for (float& x : l) x = nd(gen);
  double sum = 0.0;
  for (int32_t i = 0; i < 5000; ++i) {
    const float lp = Sampler::logprob_of(l.data(), 5000, i);
    EXPECT_LE(lp, 0.0f);
    sum += std::exp(static_cast<double>(lp));
  }
  EXPECT_NEAR(sum, 1.0, 1e-4);
}

TEST(SamplerLogprobs, StableForHugeLogitsAndIgnoresSamplingParams) {
  const std::vector<float> l = {1000.0f, 999.0f, -1000.0f};
  const float lp0 = Sampler::logprob_of(l.data(), 3, 0);
  const float lp1 = Sampler::logprob_of(l.data(), 3, 1);
  EXPECT_TRUE(std::isfinite(lp0));
  EXPECT_NEAR(lp0, -std::log1p(std::exp(-1.0)), 1e-5);
  EXPECT_NEAR(lp1, -1.0 - std::log1p(std::exp(-1.0)), 1e-5);
  const float ninf = -std::numeric_limits<float>::infinity();
  const std::vector<float> masked = {0.0f, ninf};
  EXPECT_EQ(Sampler::logprob_of(masked.data(), 2, 1), ninf);
  EXPECT_NEAR(Sampler::logprob_of(masked.data(), 2, 0), 0.0f, 1e-7);
  EXPECT_THROW(Sampler::logprob_of(l.data(), 3, 3), Error);
  EXPECT_THROW(Sampler::logprob_of(l.data(), 3, -1), Error);
}

TEST(SamplerLogprobs, TopLogprobsSortedWithTiesByIdAndConsistent) {
  const std::vector<float> l = {0.5f, 2.0f, 1.0f, 2.0f, -1.0f};
  const std::vector<TokenLogprob> top = Sampler::top_logprobs(l.data(), 5, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].id, 1);
  EXPECT_EQ(top[1].id, 3);
  EXPECT_EQ(top[2].id, 2);
  for (const TokenLogprob& t : top)
    EXPECT_FLOAT_EQ(t.logprob, Sampler::logprob_of(l.data(), 5, t.id));
  EXPECT_EQ(Sampler::top_logprobs(l.data(), 5, 0).size(), 0u);
  EXPECT_EQ(Sampler::top_logprobs(l.data(), 5, 99).size(), 5u);
  double sum = 0.0;
  for (const TokenLogprob& t : Sampler::top_logprobs(l.data(), 5, 5)) sum += std::exp(t.logprob);
  EXPECT_NEAR(sum, 1.0, 1e-6);
}

TEST(Sampler, LogitBiasBansAndForces) {
  const std::vector<float> logits = logits_of({0.1, 0.6, 0.3});
  const std::vector<int32_t> none;
  SamplingParams g = greedy();
  EXPECT_EQ(Sampler(g, 3).sample(logits.data(), none), 1);
  g.logit_bias = {{1, -100.0f}};  // banned: the next best
  EXPECT_EQ(Sampler(g, 3).sample(logits.data(), none), 2);
  g.logit_bias = {{0, 5.0f}};  // log(0.1) + 5 > log(0.6)
  EXPECT_EQ(Sampler(g, 3).sample(logits.data(), none), 0);
  // At temperature 1, +100 leaves no room for any other token; -100 never draws the token.
  SamplingParams t = plain();
  t.logit_bias = {{0, 100.0f}};
  Sampler forced(t, 3);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(forced.sample(logits.data(), none), 0);
  t.logit_bias = {{1, -100.0f}, {2, -100.0f}};
  Sampler banned(t, 3);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(banned.sample(logits.data(), none), 0);
  // Out of range: the bias and the id.
  SamplingParams bad = plain();
  bad.logit_bias = {{0, 100.5f}};
  EXPECT_THROW(bad.validate(), Error);
  bad.logit_bias = {{3, 1.0f}};
  EXPECT_THROW(Sampler(bad, 3), Error);
}

}  // namespace
}  // namespace tern
