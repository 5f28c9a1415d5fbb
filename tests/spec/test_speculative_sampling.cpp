// Speculative sampling keeps the target's distribution: the next-two-token distribution of a toy
// model sampled through draft + verify (spec/speculative.h, Sampler::verify) is tested against
// the exact one by a chi-square goodness-of-fit test (fixed seeds), for a draft model's q and for
// a deterministic (lookup-style) drafter, with plain and filtered sampling parameters; the same
// test rejects a deliberately wrong rule (resampling from p instead of the residual).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "core/error.h"
#include "sampling/sampler.h"
#include "spec/speculative.h"

namespace tern {
namespace {

constexpr int32_t kVocab = 6;

// Toy target and draft "models": logits as a function of the context.
std::vector<float> target_logits(std::span<const int32_t> ctx) {
  std::vector<float> l(kVocab);
  const int32_t last = ctx.empty() ? 0 : ctx.back();
  for (int32_t i = 0; i < kVocab; ++i) l[size_t(i)] = 0.9f * float((i * 3 + last * 5) % 7) - 0.3f * float(i == last);
  return l;
}
std::vector<float> draft_logits(std::span<const int32_t> ctx) {
  std::vector<float> l(kVocab);
  const int32_t last = ctx.empty() ? 0 : ctx.back();
  for (int32_t i = 0; i < kVocab; ++i) l[size_t(i)] = 0.6f * float((i * 2 + last * 3) % 5);
  return l;
}

// The exact next-two-token distribution of plain sampling: p(a) p(b | a), through the sampler's
// own distribution() (so penalties and filters are those of sample()).
std::vector<double> exact_two(const SamplingParams& sp, const std::vector<int32_t>& ctx) {
  Sampler s(sp, kVocab);
  std::vector<double> out(kVocab * kVocab, 0.0);
  TokenDistribution d1, d2;
  s.distribution(target_logits(ctx).data(), ctx, d1);
  for (size_t i = 0; i < d1.ids.size(); ++i) {
    std::vector<int32_t> c2 = ctx;
    c2.push_back(d1.ids[i]);
    s.distribution(target_logits(c2).data(), c2, d2);
    for (size_t j = 0; j < d2.ids.size(); ++j) out[size_t(d1.ids[i] * kVocab + d2.ids[j])] += double(d1.probs[i]) * d2.probs[j];
  }
  return out;
}

enum class Rule { Exact, ResampleFromP };

// One draw of the next two tokens by speculative decoding with k drafts per step.
std::pair<int32_t, int32_t> spec_two(Sampler& target, Sampler& draft, const std::vector<int32_t>& ctx, int k,
                                     bool deterministic_draft, Rule rule) {
  std::vector<int32_t> seq = ctx;
  std::vector<float> masked;
  while (seq.size() < ctx.size() + 2) {
    std::vector<int32_t> drafts;
    std::vector<TokenDistribution> q;
    std::vector<int32_t> dctx = seq;
    for (int i = 0; i < k; ++i) {
      TokenDistribution d;
      draft.distribution(draft_logits(dctx).data(), dctx, d);
      int32_t x;
      if (deterministic_draft) {
        x = d.ids[0];  // a fixed guess (the draft's lowest-id candidate): no q
      } else {
        x = draft.draw(d);
        q.push_back(d);
      }
      drafts.push_back(x);
      dctx.push_back(x);
    }
    // The target's rows over [last, d1 .. dk].
    std::vector<float> rows;
    std::vector<int32_t> rctx = seq;
    for (int i = 0; i <= k; ++i) {
      const auto l = target_logits(rctx);
      rows.insert(rows.end(), l.begin(), l.end());
      if (i < k) rctx.push_back(drafts[size_t(i)]);
    }
    if (rule == Rule::Exact) {
      VerifyResult r;
      verify_drafts(target, rows.data(), kVocab, seq, drafts, q, nullptr, masked, r);
      seq.insert(seq.end(), r.tokens.begin(), r.tokens.end());
    } else {
      // The wrong rule: accept with min(1, p/q) but, on rejection, draw from p itself.
      for (int i = 0; i <= k; ++i) {
        TokenDistribution p;
        target.distribution(rows.data() + size_t(i) * kVocab, seq, p);
        if (i == k) {
          seq.push_back(target.draw(p));
          break;
        }
        const int32_t x = drafts[size_t(i)];
        const double qx = q.empty() ? 1.0 : q[size_t(i)].prob_of(x);
        if (target.uniform() * qx < p.prob_of(x)) {
          seq.push_back(x);
          continue;
        }
        seq.push_back(target.draw(p));
        break;
      }
    }
  }
  return {seq[ctx.size()], seq[ctx.size() + 1]};
}

// Pearson's chi-square of observed counts against expected probabilities over n draws (cells
// of zero probability must be empty: any draw there fails at once).
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n, int& df) {
  double chi = 0;
  df = -1;
  for (size_t c = 0; c < p.size(); ++c) {
    if (p[c] == 0) {
      if (counts[c] > 0) return INFINITY;
      continue;
    }
    const double e = p[c] * double(n);
    chi += (double(counts[c]) - e) * (double(counts[c]) - e) / e;
    ++df;
  }
  return chi;
}

// Upper 0.1% point of chi-square with df degrees of freedom (Wilson-Hilferty).
double chi_square_critical(int df) {
  const double z = 3.090;  // standard normal 0.999 quantile
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

struct Case {
  const char* name;
  SamplingParams sp;
  int k;
  bool deterministic;
};

SamplingParams params(float temp, int top_k, float top_p, float min_p, float repeat) {
  SamplingParams sp;
  sp.temperature = temp;
  sp.top_k = top_k;
  sp.top_p = top_p;
  sp.min_p = min_p;
  sp.repeat_penalty = repeat;
  sp.seed = 1234;
  return sp;
}

double run_case(const Case& c, Rule rule, int64_t n, int& df) {
  const std::vector<int32_t> ctx{2, 4};
  Sampler target(c.sp, kVocab);
  SamplingParams dsp = c.sp;
  dsp.seed ^= 0x5bd1e995;
  Sampler draft(dsp, kVocab);
  std::vector<int64_t> counts(kVocab * kVocab, 0);
  for (int64_t t = 0; t < n; ++t) {
    const auto [a, b] = spec_two(target, draft, ctx, c.k, c.deterministic, rule);
    ++counts[size_t(a * kVocab + b)];
  }
  return chi_square(counts, exact_two(c.sp, ctx), n, df);
}

const Case kCases[] = {
    {"softmax, draft model q, k=3", params(1.0f, 0, 1.0f, 0.0f, 1.0f), 3, false},
    {"softmax, deterministic draft, k=2", params(1.0f, 0, 1.0f, 0.0f, 1.0f), 2, true},
    {"temp 0.7 top-k 4 top-p 0.9 min-p 0.05 repeat 1.3, draft q, k=4",
     params(0.7f, 4, 0.9f, 0.05f, 1.3f), 4, false},
    {"temp 1.3 top-k 5 repeat 1.2, deterministic draft, k=3", params(1.3f, 5, 1.0f, 0.0f, 1.2f), 3, true},
};

TEST(SpeculativeSampling, TheTwoTokenDistributionIsTheTargetsForEveryDrafter) {
  const int64_t n = 24000;
  for (const Case& c : kCases) {
    int df = 0;
    const double chi = run_case(c, Rule::Exact, n, df);
    EXPECT_LT(chi, chi_square_critical(df)) << c.name << ": chi-square " << chi << " with " << df << " df";
  }
}

TEST(SpeculativeSampling, AWrongAcceptanceRuleIsCaught) {
  // Resampling from p after a rejection over-weights p where the draft already proposed: the
  // same test must tell it apart (this is what makes the test above able to fail).
  const int64_t n = 24000;
  for (const Case& c : kCases) {
    if (c.deterministic) continue;  // (a point mass q: resampling from p differs little on a 6-token toy)
    int df = 0;
    const double chi = run_case(c, Rule::ResampleFromP, n, df);
    EXPECT_GT(chi, chi_square_critical(df)) << c.name << ": chi-square " << chi << " with " << df << " df";
  }
}

TEST(SpeculativeSampling, GreedyVerificationAcceptsExactlyTheArgmaxPrefix) {
  SamplingParams sp;
  sp.temperature = 0;
  Sampler s(sp, 4);
  // Rows: argmax 2, then 1, then 3, then 0.
  const std::vector<float> rows{0, 1, 5, 2, /**/ 0, 9, 1, 1, /**/ 1, 0, 0, 4, /**/ 7, 1, 1, 1};
  std::vector<float> scratch;
  VerifyResult r;
  const std::vector<int32_t> hist{0};
  verify_drafts(s, rows.data(), 4, hist, std::vector<int32_t>{2, 1, 3}, {}, nullptr, scratch, r);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{2, 1, 3, 0}));  // all accepted + the bonus
  EXPECT_EQ(r.n_accepted, 3);
  verify_drafts(s, rows.data(), 4, hist, std::vector<int32_t>{2, 0, 3}, {}, nullptr, scratch, r);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{2, 1}));  // the second draft rejected, replaced by the argmax
  EXPECT_EQ(r.n_accepted, 1);
  verify_drafts(s, rows.data(), 4, hist, std::vector<int32_t>{}, {}, nullptr, scratch, r);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{2}));  // no drafts: a plain step
}

TEST(SpeculativeSampling, SamplerSampleIsUnchangedByTheRefactor) {
  // distribution() is what sample() draws from: the empirical frequencies of sample() match it.
  SamplingParams sp = params(0.8f, 3, 0.95f, 0.02f, 1.1f);
  Sampler s(sp, kVocab), s2(sp, kVocab);
  const std::vector<int32_t> ctx{1, 3, 3};
  const auto l = target_logits(ctx);
  TokenDistribution d;
  s2.distribution(l.data(), ctx, d);
  std::vector<int64_t> counts(kVocab, 0);
  const int64_t n = 20000;
  for (int64_t i = 0; i < n; ++i) ++counts[size_t(s.sample(l.data(), ctx))];
  std::vector<double> p(kVocab, 0.0);
  for (size_t i = 0; i < d.ids.size(); ++i) p[size_t(d.ids[i])] = d.probs[i];
  int df = 0;
  const double chi = chi_square(counts, p, n, df);
  EXPECT_LT(chi, chi_square_critical(df));
}

TEST(DraftLength, FollowsTheAcceptanceRate) {
  SpecConfig cfg;
  cfg.n_draft_max = 8;
  cfg.n_draft_min = 1;
  DraftLength len(cfg);
  const int start = len.next(0.1);
  EXPECT_GE(start, 5);  // optimistic start: 0.8^i >= 0.1 up to i = 10, capped at 8
  for (int i = 0; i < 20; ++i) len.observe(8, 0);
  EXPECT_EQ(len.next(0.1), 1);  // nothing accepted: the minimum
  EXPECT_LT(len.acceptance_rate(), 0.2);
  for (int i = 0; i < 40; ++i) len.observe(4, 4);
  EXPECT_EQ(len.next(0.1), 8);
  // A step where one more token costs 35% (a tiny model) and a third of drafts are accepted:
  // drafting does not pay, so no drafts, except a one-token probe every 16th step.
  cfg.n_draft_min = 0;
  DraftLength lazy(cfg);
  for (int i = 0; i < 40; ++i) lazy.observe(3, i % 3 == 0 ? 1 : 0);
  int probes = 0, zeros = 0;
  for (int i = 0; i < 32; ++i) {
    const int k = lazy.next(0.35);
    probes += k == 1;
    zeros += k == 0;
  }
  EXPECT_EQ(probes, 2);
  EXPECT_EQ(zeros, 30);
  cfg.adaptive = false;
  EXPECT_EQ(DraftLength(cfg).next(0.9), 8);
}

TEST(SpecConfig, OutOfRangeValuesAreErrorsNamingTheFlag) {
  SpecConfig c;
  c.source = DraftSource::Lookup;
  c.n_draft_max = 0;
  EXPECT_THROW(c.validate(), Error);
  c.n_draft_max = 33;
  EXPECT_THROW(c.validate(), Error);
  c.n_draft_max = 8;
  c.n_draft_min = 9;
  EXPECT_THROW(c.validate(), Error);
  c.n_draft_min = 1;
  c.ngram.ngram_max = 0;
  try {
    c.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--lookup"), std::string::npos);
  }
  c.ngram.ngram_max = 3;
  EXPECT_NO_THROW(c.validate());
  c.source = DraftSource::DraftModel;
  EXPECT_THROW(c.validate(), Error);  // no file
}

}  // namespace
}  // namespace tern
