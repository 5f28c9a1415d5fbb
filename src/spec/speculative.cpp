#include "spec/speculative.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tern {

const char* draft_source_name(DraftSource s) {
  switch (s) {
    case DraftSource::None: return "none";
    case DraftSource::Lookup: return "lookup";
    case DraftSource::DraftModel: return "draft";
  }
  return "?";
}

void SpecConfig::validate() const {
  if (source == DraftSource::None) return;
  if (n_draft_max < 1 || n_draft_max > 32)
    fail("--draft-max must be in [1, 32] (tokens drafted per step), got ", n_draft_max);
  if (n_draft_min < 0 || n_draft_min > n_draft_max)
    fail("--draft-min must be in [0, --draft-max = ", n_draft_max, "], got ", n_draft_min);
  if (source == DraftSource::Lookup) {
    if (ngram.ngram_max < 1 || ngram.ngram_max > 16)
      fail("--lookup N: the n-gram length must be in [1, 16], got ", ngram.ngram_max);
    if (ngram.ngram_min < 1 || ngram.ngram_min > ngram.ngram_max)
      fail("the shortest n-gram looked up must be in [1, ", ngram.ngram_max, "], got ", ngram.ngram_min);
  }
  if (source == DraftSource::DraftModel && draft_path.empty() && !draft_file && self_draft.empty())
    fail("--draft needs a model file");
}

DraftLength::DraftLength(const SpecConfig& cfg)
    : min_(cfg.n_draft_min), max_(cfg.n_draft_max), adaptive_(cfg.adaptive) {}

int DraftLength::next(double marginal_cost) {
  if (!adaptive_) return max_;
  const double c = std::clamp(marginal_cost, 1e-3, 2.0);
  int best = 0;
  double best_gain = 1.0, expected = 1.0, reach = 1.0;
  for (int k = 1; k <= max_; ++k) {
    reach *= rate_;
    expected += reach;
    const double gain = expected / (1.0 + c * k);
    if (gain > best_gain * (1 + 1e-9)) {
      best_gain = gain;
      best = k;
    }
  }
  int k = std::clamp(best, min_, max_);
  if (k == 0 && ++skipped_ >= 16) k = 1;  // a probe, so a rate that was unlucky can recover
  if (k > 0) skipped_ = 0;
  return k;
}

void DraftLength::observe(int n_drafted, int n_accepted) {
  if (n_drafted <= 0) return;
  // The per-token acceptance rate a such that a step's expected accepted prefix matches: a
  // prefix of n_accepted out of n_drafted tokens is one observation per verified token (the
  // accepted ones, plus the rejection if any), as in a geometric model.
  const int n_obs = std::min(n_drafted, n_accepted + 1);
  const double alpha = 0.1;  // per observation: a running average over the last ~10 tokens
  for (int i = 0; i < n_obs; ++i) {
    const double x = i < n_accepted ? 1.0 : 0.0;
    rate_ += alpha * (x - rate_);
  }
}

void verify_drafts(Sampler& sampler, const float* rows, int32_t n_vocab, std::span<const int32_t> history,
                   std::span<const int32_t> drafts, std::span<const TokenDistribution> q, TokenConstraint* constraint,
                   std::vector<float>& masked, VerifyResult& out) {
  TERN_ASSERT(q.empty() || q.size() == drafts.size());
  out.tokens.clear();
  out.n_accepted = 0;
  // The penalties see history + the drafts accepted so far: one buffer, grown as they are.
  std::vector<int32_t> seen(history.begin(), history.end());
  const auto row_of = [&](size_t i) -> const float* {
    const float* row = rows + i * size_t(n_vocab);
    if (!constraint) return row;
    masked.assign(row, row + n_vocab);
    constraint->apply(masked.data(), n_vocab);
    return masked.data();
  };
  for (size_t i = 0; i < drafts.size(); ++i) {
    bool accepted = false;
    const int32_t id = sampler.verify(row_of(i), seen, drafts[i], q.empty() ? nullptr : &q[i], accepted);
    if (constraint) constraint->accept(id);
    out.tokens.push_back(id);
    if (!accepted) return;
    ++out.n_accepted;
    seen.push_back(id);
    // A constraint that allows nothing more ends the sequence here: the rest is not needed.
    if (constraint && constraint->is_dead()) return;
  }
  const int32_t id = sampler.sample(row_of(drafts.size()), seen);
  if (constraint) constraint->accept(id);
  out.tokens.push_back(id);
}

}  // namespace tern
