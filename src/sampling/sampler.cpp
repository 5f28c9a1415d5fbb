#include "sampling/sampler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace tern {

namespace {

constexpr float k_neg_inf = -std::numeric_limits<float>::infinity();

// The strict total order every filter works in: higher logit first, lower id on ties. Because
// it is total, "the top k", "the top-p prefix" and "the min-p set" are unique sets whatever
// std::nth_element / std::sort implementation runs, which keeps draws identical across
// standard libraries.
struct Better {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    const float la = logits[a];
    const float lb = logits[b];
    return la > lb || (la == lb && a < b);
  }
};

// Uniform double in [0, 1) from the top 53 bits of one 64-bit draw. std::uniform_real_distribution
// is implementation-defined, so it would break seed reproducibility across platforms.
double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// Numerically stable log(sum(exp(logits))) over the whole row; -inf when every logit is -inf.
double log_sum_exp(const float* logits, int32_t n_vocab) {
  float lmax = k_neg_inf;
  for (int32_t i = 0; i < n_vocab; ++i) lmax = std::max(lmax, logits[i]);
  if (lmax == k_neg_inf) return -std::numeric_limits<double>::infinity();
  if (lmax == std::numeric_limits<float>::infinity()) return lmax;
  double sum = 0.0;
  for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - lmax);
  return lmax + std::log(sum);
}

// Rewrites cand[0, n) as {id in [0, n_vocab) : !better(pivot, id)} in ascending id order and
// returns its size: by the prefix invariant that is exactly the current set. One O(n_vocab)
// scan, cheaper than sorting a large set by id.
size_t rebuild_up_to(const float* work, size_t n_vocab, int32_t pivot, int32_t* cand) {
  const Better better{work};
  size_t j = 0;
  for (size_t i = 0; i < n_vocab; ++i)
    if (!better(pivot, static_cast<int32_t>(i))) cand[j++] = static_cast<int32_t>(i);
  return j;
}

// top-k over all of work[0, n_vocab); leaves the k best in cand[0, k) in id order, returns k.
size_t select_top_k(const float* work, size_t n_vocab, size_t k, int32_t* cand) {
  const Better better{work};
  if (k <= 256) {
    // The usual case (k = 40): one pass against a k-heap whose front is its worst member.
    // Logits rarely beat the front, so this is ~one compare per token, several times faster
    // than nth_element's indirect partitioning over 150k ids.
    for (size_t i = 0; i < k; ++i) cand[i] = static_cast<int32_t>(i);
    std::make_heap(cand, cand + k, better);
    for (size_t i = k; i < n_vocab; ++i) {
      if (!better(static_cast<int32_t>(i), cand[0])) continue;
      std::pop_heap(cand, cand + k, better);
      cand[k - 1] = static_cast<int32_t>(i);
      std::push_heap(cand, cand + k, better);
    }
    std::sort(cand, cand + k);
    return k;
  }
  for (size_t i = 0; i < n_vocab; ++i) cand[i] = static_cast<int32_t>(i);
  std::nth_element(cand, cand + (k - 1), cand + n_vocab, better);
  return rebuild_up_to(work, n_vocab, cand[k - 1], cand);
}

// top-p over the set cand[0, n) (id order): keeps the smallest best-first prefix whose mass
// sum(e[id]) reaches `target` (top_p times the top-k set's normaliser), where e[id] =
// exp(l - lmax) was computed once by the caller. Returns the new size, cand[0, size) again in
// id order.
size_t select_top_p(const float* work, const float* e, size_t n_vocab, float lmax, double target,
                    int32_t* cand, size_t n) {
  const Better better{work};
  if (n <= 1024) {
    // Small sets (top-k on): sorting them outright is cheapest.
    std::sort(cand, cand + n, better);
    double cum = 0.0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += e[cand[i]];
      if (cum >= target) {
        keep = i + 1;
        break;
      }
    }
    std::sort(cand, cand + keep);
    return keep;
  }

  // Large sets (top-k off, up to all of n_vocab): a full sort costs ~10 ms at 150k. Instead a
  // histogram of logits in k_buckets equal-width bins below lmax finds the bin where the
  // cumulative mass crosses the target; only that bin is sorted.
  //   bin 0: (lmax - width, lmax]  ...  bin k_buckets-1: everything below, including -inf
  // The bin is a monotone function of the logit, so bins respect the `Better` order. The range
  // is capped at 32 nats: beyond that a token weighs < 1e-14 of the max, and lumping the tail
  // into the last bin keeps the bins fine where the mass is.
  constexpr int k_buckets = 1024;
  constexpr float k_max_range = 32.0f;
  float lmin = lmax;
  for (size_t i = 0; i < n; ++i) {
    const float l = work[cand[i]];
    if (l != k_neg_inf) lmin = std::min(lmin, l);
  }
  const float range = std::min(lmax - lmin, k_max_range);
  const float inv_width = range > 0.0f ? static_cast<float>(k_buckets) / range : 0.0f;
  auto bucket_of = [&](float l) {
    // Clamped in float first so -inf (and far tails) never reach an out-of-range int cast.
    return static_cast<int>(std::min((lmax - l) * inv_width, static_cast<float>(k_buckets - 1)));
  };
  std::array<double, k_buckets> mass{};  // on the stack: no per-token allocation
  for (size_t i = 0; i < n; ++i) mass[static_cast<size_t>(bucket_of(work[cand[i]]))] += e[cand[i]];
  double cum = 0.0;
  int cut = -1;
  for (int b = 0; b < k_buckets; ++b) {
    if (cum + mass[static_cast<size_t>(b)] >= target) {
      cut = b;
      break;
    }
    cum += mass[static_cast<size_t>(b)];
  }
  // Rounding kept the total just under the target: top-p keeps everything.
  if (cut < 0) return n;

  size_t m = 0;
  for (size_t i = 0; i < n; ++i)
    if (bucket_of(work[cand[i]]) == cut) cand[m++] = cand[i];
  std::sort(cand, cand + m, better);
  int32_t pivot = cand[m - 1];  // summation order can differ from the bin total by rounding
  for (size_t i = 0; i < m; ++i) {
    cum += e[cand[i]];
    if (cum >= target) {
      pivot = cand[i];
      break;
    }
  }
  return rebuild_up_to(work, n_vocab, pivot, cand);
}

}  // namespace

void SamplingParams::validate() const {
  // Written as !(x >= lo) so NaN is rejected too.
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    fail("sampling: temperature must be a finite value >= 0, got ", temperature);
  if (!(top_p >= 0.0f && top_p <= 1.0f)) fail("sampling: top_p must be in [0, 1], got ", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) fail("sampling: min_p must be in [0, 1], got ", min_p);
  if (!(repeat_penalty > 0.0f) || !std::isfinite(repeat_penalty))
    fail("sampling: repeat_penalty must be a finite value > 0, got ", repeat_penalty);
  if (!std::isfinite(frequency_penalty))
    fail("sampling: frequency_penalty must be finite, got ", frequency_penalty);
  if (!std::isfinite(presence_penalty))
    fail("sampling: presence_penalty must be finite, got ", presence_penalty);
  if (penalty_last_n < -1)
    fail("sampling: penalty_last_n must be >= -1 (-1 = whole history), got ", penalty_last_n);
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) fail("sampling: logit_bias token id must be >= 0, got ", id);
    if (!(bias >= -100.0f && bias <= 100.0f)) fail("sampling: logit_bias of token ", id, " must be in [-100, 100], got ", bias);
  }
}

Sampler::Sampler(const SamplingParams& params, int32_t n_vocab)
    : params_(params), n_vocab_(n_vocab), rng_(params.seed) {
  params_.validate();
  if (n_vocab <= 0) fail("sampling: n_vocab must be > 0, got ", n_vocab);
  for (const auto& [id, bias] : params_.logit_bias)
    if (id >= n_vocab) fail("sampling: logit_bias token id ", id, " is outside the vocabulary [0, ", n_vocab, ")");
  // Sized once here so sample() never allocates, not even on its first call.
  work_.resize(static_cast<size_t>(n_vocab));
  candidates_.resize(static_cast<size_t>(n_vocab));
  probs_.resize(static_cast<size_t>(n_vocab));
}

void Sampler::apply_penalties(std::span<const int32_t> history) {
  const SamplingParams& p = params_;
  if (p.repeat_penalty == 1.0f && p.frequency_penalty == 0.0f && p.presence_penalty == 0.0f)
    return;
  size_t n_window = history.size();
  if (p.penalty_last_n >= 0) n_window = std::min(n_window, static_cast<size_t>(p.penalty_last_n));
  if (n_window == 0) return;
  const std::span<const int32_t> window = history.last(n_window);

  // candidates_ doubles as the per-token count table: it is rebuilt before the filters read
  // it, and touching only the window's ids keeps this O(window), not O(n_vocab).
  int32_t* counts = candidates_.data();
  // Ids outside the vocabulary (e.g. a tokenizer special token past the output row) cannot be
  // sampled, so they have nothing to penalise.
  auto in_vocab = [&](int32_t t) { return t >= 0 && t < n_vocab_; };
  for (int32_t t : window)
    if (in_vocab(t)) counts[t] = 0;
  for (int32_t t : window)
    if (in_vocab(t)) ++counts[t];
  for (int32_t t : window) {
    if (!in_vocab(t) || counts[t] == 0) continue;  // 0: already penalised once
    float& l = work_[static_cast<size_t>(t)];
    l = l > 0.0f ? l / p.repeat_penalty : l * p.repeat_penalty;
    l -= static_cast<float>(counts[t]) * p.frequency_penalty + p.presence_penalty;
    l = std::min(l, std::numeric_limits<float>::max());  // negative penalties may overflow
    counts[t] = 0;
  }
}

size_t Sampler::filter(const float* logits, std::span<const int32_t> history, double& sum) {
  const size_t n_vocab = static_cast<size_t>(n_vocab_);
  float* work = work_.data();
  // NaN would poison every comparison and sum below; +inf would make (l - lmax) NaN. Map them
  // to "never" and "largest finite" so one bad logit cannot wedge a request.
  size_t n_nan = 0;
  for (size_t i = 0; i < n_vocab; ++i) {
    const float l = logits[i];
    n_nan += std::isnan(l);
    work[i] = std::isnan(l) ? k_neg_inf : std::min(l, std::numeric_limits<float>::max());
  }
  // A row of nothing but NaN is a broken forward pass (non-finite weights or an overflow), not
  // a distribution: drawing from it would return token 0 as if it were the model's answer.
  if (n_nan == n_vocab)
    fail("the model produced NaN for every logit: its weights or activations are not finite, nothing to sample");
  for (const auto& [id, bias] : params_.logit_bias)
    work[size_t(id)] = bias <= -100.0f ? k_neg_inf : work[size_t(id)] + bias;
  apply_penalties(history);

  if (params_.temperature <= 0.0f) {
    size_t best = 0;
    for (size_t i = 1; i < n_vocab; ++i)
      if (work[i] > work[best]) best = i;  // strict: ties keep the lowest id
    candidates_[0] = static_cast<int32_t>(best);
    probs_[0] = 1.0f;
    sum = 0.0;  // deterministic: no draw
    return 1;
  }

  // Invariant from here on: every filter keeps a prefix of the total order `Better`, so the
  // current set is always {id : !better(pivot, id)} for its worst member `pivot`, and after
  // each step cand[0, n) holds it in ascending id order (the order the draw walks).
  int32_t* cand = candidates_.data();
  size_t n = n_vocab;
  const int32_t top_k = params_.top_k;
  if (top_k > 0 && static_cast<size_t>(top_k) < n_vocab) {
    n = select_top_k(work, n_vocab, static_cast<size_t>(top_k), cand);
  } else {
    for (size_t i = 0; i < n_vocab; ++i) cand[i] = static_cast<int32_t>(i);
  }

  float lmax = k_neg_inf;
  for (size_t i = 0; i < n; ++i) lmax = std::max(lmax, work[cand[i]]);
  // Every candidate masked: nothing has probability, so fall back to the first (lowest id).
  if (lmax == k_neg_inf) {
    probs_[0] = 1.0f;
    sum = 0.0;
    return 1;
  }

  // top-p's probabilities are normalised over the top-k set, before min-p narrows it. The
  // unnormalised probabilities are kept by id in probs_ so top-p needs no second exp pass.
  const bool use_top_p = params_.top_p < 1.0f;
  float* e = probs_.data();
  double z = 0.0;
  if (use_top_p) {
    for (size_t i = 0; i < n; ++i) {
      const int32_t id = cand[i];
      e[id] = std::exp(work[id] - lmax);
      z += e[id];
    }
  }

  // min-p runs after top-p in the chain, but p / p_max does not change when top-p renormalises
  // and both keep a prefix of the same order, so filtering first gives the same set and hands
  // top-p fewer tokens. p >= min_p * p_max  <=>  l - lmax >= log(min_p); comparing logits
  // avoids an exp per token.
  if (params_.min_p > 0.0f) {
    const float threshold = lmax + std::log(params_.min_p);
    size_t j = 0;
    for (size_t i = 0; i < n; ++i)
      if (work[cand[i]] >= threshold) cand[j++] = cand[i];  // stable: keeps id order
    n = j;
  }

  if (use_top_p)
    n = select_top_p(work, e, n_vocab, lmax, static_cast<double>(params_.top_p) * z, cand, n);

  // Temperature, then the draw: weights relative to the max (so the max weighs exactly 1 and
  // the sum is never 0), accumulated in double in id order so a seed maps to the same token on
  // every platform. probs_ is reused by position now; e[] is no longer needed.
  // The scaling is done in double and clamped because 1 / temperature overflows float for a
  // denormal temperature (0 * inf would be NaN), and a double past float's range must not be
  // narrowed; exp(-1000) is 0 in float either way.
  const double inv_temp = 1.0 / static_cast<double>(params_.temperature);
  float* w = probs_.data();
  sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double x = std::max(static_cast<double>(work[cand[i]] - lmax) * inv_temp, -1000.0);
    w[i] = std::exp(static_cast<float>(x));
    sum += w[i];
  }
  return n;
}

int32_t Sampler::draw_weighted(const int32_t* ids, const float* w, size_t n, double sum) {
  const double u = uniform01(rng_) * sum;
  double cum = 0.0;
  size_t last_positive = 0;
  for (size_t i = 0; i < n; ++i) {
    if (w[i] <= 0.0f) continue;
    cum += w[i];
    last_positive = i;
    if (u < cum) return ids[i];
  }
  // Unreachable in exact arithmetic (u < sum); kept so rounding can never pick a 0-weight id.
  return ids[last_positive];
}

int32_t Sampler::sample(const float* logits, std::span<const int32_t> history) {
  double sum = 0;
  const size_t n = filter(logits, history, sum);
  if (sum == 0.0) return candidates_[0];  // greedy, or nothing left to draw from
  return draw_weighted(candidates_.data(), probs_.data(), n, sum);
}

void Sampler::distribution(const float* logits, std::span<const int32_t> history, TokenDistribution& out) {
  double sum = 0;
  const size_t n = filter(logits, history, sum);
  out.ids.assign(candidates_.begin(), candidates_.begin() + ptrdiff_t(n));
  out.probs.resize(n);
  if (sum == 0.0) {
    out.probs[0] = 1.0f;
    return;
  }
  for (size_t i = 0; i < n; ++i) out.probs[i] = float(double(probs_[i]) / sum);
}

int32_t Sampler::draw(const TokenDistribution& d) {
  if (d.ids.empty()) fail("sampling: drawing from an empty distribution");
  double sum = 0;
  for (float p : d.probs) sum += p;
  if (d.ids.size() == 1 || !(sum > 0)) return d.ids[0];
  return draw_weighted(d.ids.data(), d.probs.data(), d.ids.size(), sum);
}

double Sampler::uniform() { return uniform01(rng_); }

int32_t Sampler::verify(const float* logits, std::span<const int32_t> history, int32_t draft,
                        const TokenDistribution* q, bool& accepted) {
  double sum = 0;
  const size_t n = filter(logits, history, sum);
  int32_t* ids = candidates_.data();
  float* w = probs_.data();
  if (sum == 0.0) {
    // Greedy (or a single candidate): the target's choice is certain; no draw is made, so a
    // greedy run consumes the RNG exactly as plain decoding does (it does not at all).
    accepted = ids[0] == draft;
    return ids[0];
  }
  // p(draft): the candidates are in ascending id order.
  const auto it = std::lower_bound(ids, ids + n, draft);
  const size_t at = size_t(it - ids);
  const double p_draft = (it != ids + n && *it == draft) ? double(w[at]) / sum : 0.0;
  const double q_draft = q ? double(q->prob_of(draft)) : 1.0;
  // Accept with probability min(1, p / q) (Leviathan et al. 2023; Chen et al. 2023).
  if (p_draft > 0 && q_draft > 0) {
    const double u = uniform01(rng_);
    if (u * q_draft < p_draft) {
      accepted = true;
      return draft;
    }
  }
  accepted = false;
  // Rejected: draw from the residual norm(max(0, p - q)), in the candidates' id order. A point
  // mass q removes the draft alone. When the residual is empty (p == q up to rounding), p itself.
  double rsum = 0;
  for (size_t i = 0; i < n; ++i) {
    const double p = double(w[i]) / sum;
    const double qi = q ? double(q->prob_of(ids[i])) : (ids[i] == draft ? 1.0 : 0.0);
    const double r = std::max(0.0, p - qi);
    w[i] = float(r);
    rsum += float(r);
  }
  if (!(rsum > 0)) {
    // Cannot happen for a point mass (p(draft) = 1 is always accepted) or a q != p; kept so a
    // rounding tie never leaves nothing to draw from.
    filter(logits, history, sum);
    return draw_weighted(ids, w, n, sum);
  }
  return draw_weighted(ids, w, n, rsum);
}

float TokenDistribution::prob_of(int32_t id) const {
  const auto it = std::lower_bound(ids.begin(), ids.end(), id);
  return it != ids.end() && *it == id ? probs[size_t(it - ids.begin())] : 0.0f;
}

float Sampler::logprob_of(const float* logits, int32_t n_vocab, int32_t id) {
  if (id < 0 || id >= n_vocab) fail("logprob_of: token id ", id, " out of range [0, ", n_vocab, ")");
  const double lse = log_sum_exp(logits, n_vocab);
  return static_cast<float>(static_cast<double>(logits[id]) - lse);
}

std::vector<TokenLogprob> Sampler::top_logprobs(const float* logits, int32_t n_vocab, int n) {
  const size_t count = static_cast<size_t>(std::clamp(n, 0, std::max(n_vocab, 0)));
  std::vector<TokenLogprob> out;
  if (count == 0) return out;
  std::vector<int32_t> ids(static_cast<size_t>(n_vocab));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(count), ids.end(),
                    Better{logits});
  const double lse = log_sum_exp(logits, n_vocab);
  out.reserve(count);
  for (size_t i = 0; i < count; ++i)
    out.push_back({ids[i], static_cast<float>(static_cast<double>(logits[ids[i]]) - lse)});
  return out;
}

size_t find_stop(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = std::string::npos;
  for (const std::string& s : stops) {
    if (s.empty()) continue;  // an empty stop would match everywhere and end every reply at once
    const size_t pos = text.find(s);
    if (pos < best) best = pos;
  }
  return best;
}

size_t stop_holdback(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& s : stops) {
    if (s.empty()) continue;
    // Longest first, so the first match is this stop's answer; only lengths that could beat
    // the best so far are worth checking.
    for (size_t len = std::min(text.size(), s.size() - 1); len > best; --len) {
      if (text.compare(text.size() - len, len, s, 0, len) == 0) {
        best = len;
        break;
      }
    }
  }
  return best;
}

}  // namespace tern
