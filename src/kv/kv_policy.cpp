#include "kv/kv_policy.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace tern {

namespace {

// "N" tokens or "P%" of the context; {0, 0} when empty.
struct KvBudget {
  int64_t tokens = 0;
  double frac = 0.0;
};

KvBudget parse_kv_budget(const std::string& s) {
  if (s.empty()) return {};
  const bool percent = s.back() == '%';
  const std::string num = percent ? s.substr(0, s.size() - 1) : s;
  // Digits (and for a percent one '.'): no sign, exponent, inf or spaces, which from_chars takes.
  const auto n_digits = std::count_if(num.begin(), num.end(), [](char c) { return c >= '0' && c <= '9'; });
  const auto n_dots = std::count(num.begin(), num.end(), '.');
  const bool ok_chars = n_digits > 0 && n_digits + n_dots == int64_t(num.size()) && n_dots <= (percent ? 1 : 0);
  if (!ok_chars)
    fail("--kv-budget '", s, "' is not a number of tokens (N) or a percent of the context (P%)");
  const char* first = num.data();
  const char* last = num.data() + num.size();
  KvBudget b;
  if (percent) {
    double p = 0.0;
    const auto r = std::from_chars(first, last, p);
    if (r.ec != std::errc() || r.ptr != last) fail("--kv-budget '", s, "' is not a percent");
    if (p == 0.0) fail("--kv-budget ", s, " is a budget of zero: nothing could stay resident");
    if (!(p > 0.0 && p <= 100.0)) fail("--kv-budget ", s, ": a percent must be in (0, 100]");
    b.frac = p / 100.0;
  } else {
    const auto r = std::from_chars(first, last, b.tokens);
    if (r.ec == std::errc::result_out_of_range) fail("--kv-budget ", s, " is too large");
    if (r.ec != std::errc() || r.ptr != last) fail("--kv-budget '", s, "' is not a number of tokens");
    if (b.tokens == 0) fail("--kv-budget ", s, " is a budget of zero: nothing could stay resident");
  }
  return b;
}

}  // namespace

int64_t KvPolicy::capacity(int64_t n_ctx) const {
  switch (kind) {
    case KvPolicyKind::None:
      return n_ctx;
    case KvPolicyKind::Streaming:
      return std::min(sinks + window, n_ctx);
    case KvPolicyKind::H2O: {
      // The epsilon keeps 7% of 100 at 7 (0.07 * 100 is 7.000000000000001 in doubles).
      const int64_t raw = budget > 0 ? budget
                                     : int64_t(std::ceil(budget_frac * double(n_ctx) - 1e-6));
      return std::min(std::max(raw, sinks + window + 1), n_ctx);
    }
  }
  return n_ctx;
}

int64_t KvPolicy::recent_of(int64_t capacity) const {
  switch (kind) {
    case KvPolicyKind::None:
      return 0;
    case KvPolicyKind::Streaming:
      return window;
    case KvPolicyKind::H2O:
      return std::max<int64_t>(0, std::min(window > 0 ? window : capacity / 2, capacity - sinks - 1));
  }
  return 0;
}

void KvPolicy::check_fits(int64_t n_ctx) const {
  if (n_ctx <= 0) fail("kv policy ", describe(), ": a context of ", n_ctx, " tokens");
  if (!evicts()) return;
  if (sinks < 0 || window < 0) fail("kv policy ", describe(), ": negative --sinks or --window");
  if (kind == KvPolicyKind::Streaming && sinks + window < 2)
    fail("--sinks ", sinks, " + --window ", window, " keep fewer than 2 tokens: nothing to attend to");
  // h2o needs one place beyond its protected tokens for a heavy hitter.
  const int64_t kept = sinks + window + (kind == KvPolicyKind::H2O ? 1 : 0);
  if (kept > n_ctx)
    fail("--sinks ", sinks, " + --window ", window, " do not fit a context of ", n_ctx, " tokens (",
         describe(), " needs ", kept, ")");
  const int64_t cap = capacity(n_ctx);
  if (cap <= sinks)
    fail("--sinks ", sinks, " leave no room in a context of ", n_ctx, " tokens (", describe(),
         " keeps at most ", cap, ")");
}

std::string KvPolicy::describe() const {
  switch (kind) {
    case KvPolicyKind::None:
      return "none";
    case KvPolicyKind::Streaming:
      return str_cat("streaming (", sinks, " sinks + ", window, " window", sinks_follow ? "" : ", original positions", ")");
    case KvPolicyKind::H2O: {
      const std::string b = budget > 0 ? str_cat(budget) : str_cat(budget_frac * 100.0, "%");
      // With a percent and no --window, the recent count depends on the context.
      const std::string r = window > 0 ? str_cat(window, " recent")
                            : budget > 0 ? str_cat(recent_of(budget), " recent")
                                         : std::string("half recent");
      return str_cat("h2o (budget ", b, ", ", sinks, " sinks, ", r, ")");
    }
  }
  return "?";
}

KvPolicy make_kv_policy(const std::string& kind, int64_t sinks, int64_t window,
                        const std::string& budget) {
  KvPolicy p;
  if (kind == "none") p.kind = KvPolicyKind::None;
  else if (kind == "streaming") p.kind = KvPolicyKind::Streaming;
  else if (kind == "h2o") p.kind = KvPolicyKind::H2O;
  else fail("--kv-policy '", kind, "' is unknown (accepted: none, streaming, h2o)");
  if (sinks < 0) fail("--sinks ", sinks, " is negative");
  if (window < 0) fail("--window ", window, " is negative");
  p.sinks = sinks;
  p.window = window;
  if (!budget.empty() && p.kind != KvPolicyKind::H2O)
    fail("--kv-budget applies to --kv-policy h2o only (not ", kind, ")");
  switch (p.kind) {
    case KvPolicyKind::None:
      if (window != 0) fail("--window applies to --kv-policy streaming or h2o only (not none)");
      break;
    case KvPolicyKind::Streaming:
      if (window == 0) fail("--kv-policy streaming needs --window (the recent positions kept)");
      if (window < sinks)
        fail("--window ", window, " is a window smaller than the sinks (--sinks ", sinks,
             "): streaming keeps the sinks and at least as many recent positions");
      if (sinks + window < 2)
        fail("--sinks ", sinks, " + --window ", window, " keep fewer than 2 tokens");
      break;
    case KvPolicyKind::H2O: {
      if (budget.empty())
        fail("--kv-policy h2o needs --kv-budget (N tokens or P% of the context)");
      const KvBudget b = parse_kv_budget(budget);
      p.budget = b.tokens;
      p.budget_frac = b.frac;
      // A percent is checked against the context later (check_fits): capacity() raises it to
      // sinks + window + 1. An absolute budget is known now.
      if (p.budget > 0 && p.budget <= sinks + window)
        fail("--kv-budget ", budget, " leaves no room for heavy hitters beyond --sinks ", sinks,
             window > 0 ? str_cat(" + --window ", window) : std::string());
      break;
    }
  }
  return p;
}

KvResidency::KvResidency(const KvPolicy& p) : policy_(p) {}

void KvResidency::append(int64_t pos, int32_t slot) {
  TERN_ASSERT_MSG(pos >= next_pos_, "positions must increase");
  TERN_ASSERT(slot >= 0);
  positions_.push_back(pos);
  slots_.push_back(slot);
  mass_.push_back(0.0);
  next_pos_ = pos + 1;
}

void KvResidency::add_mass(std::span<const float> mass) {
  TERN_ASSERT_MSG(int64_t(mass.size()) == size(), "one mass per resident token");
  if (policy_.kind != KvPolicyKind::H2O) return;
  for (size_t i = 0; i < mass.size(); ++i) mass_[i] += double(mass[i]);
}

std::vector<int32_t> KvResidency::make_room(int64_t n_new, int64_t capacity) {
  TERN_ASSERT(n_new >= 0);
  const int64_t n = size();
  std::vector<int32_t> freed;
  if (!policy_.evicts()) {
    if (n + n_new > capacity)
      fail("kv: ", n_new, " new tokens do not fit: ", n, " of ", capacity,
           " resident and --kv-policy none evicts nothing");
    return freed;
  }
  if (n_new > capacity - policy_.sinks)
    fail("kv: a step of ", n_new, " tokens does not fit a capacity of ", capacity, " beside ",
         policy_.sinks, " sinks (chunk it)");
  const int64_t k = n + n_new - capacity;  // <= n - sinks by the check above
  if (k <= 0) return freed;
  const int64_t first = policy_.sinks;
  evict_.assign(size_t(n), 0);
  const int64_t end = policy_.kind == KvPolicyKind::H2O
                          ? std::max(first, n - policy_.recent_of(capacity)) : first;
  if (end - first > k) {
    // H2O: the k lightest candidates, O(n) by selection.
    order_.resize(size_t(end - first));
    std::iota(order_.begin(), order_.end(), first);
    // The score: accumulated mass, or (h2o_mean) that mass over the queries that could see the
    // token (the tokens since it): a plain sum favours old tokens, which had more queries.
    const auto score = [this](int64_t a) {
      const double m = mass_[size_t(a)];
      return policy_.h2o_mean ? m / double(next_pos_ - positions_[size_t(a)]) : m;
    };
    const auto lighter = [&](int64_t a, int64_t b) {
      const double sa = score(a), sb = score(b);
      return sa != sb ? sa < sb : a < b;
    };
    std::nth_element(order_.begin(), order_.begin() + k, order_.end(), lighter);
    for (int64_t i = 0; i < k; ++i) evict_[size_t(order_[size_t(i)])] = 1;
  } else {
    // Streaming's oldest; or H2O's candidates all, then the oldest protected recent ones
    // (they follow the candidates).
    for (int64_t i = first; i < first + k; ++i) evict_[size_t(i)] = 1;
  }
  compact(freed);
  n_evicted_ += k;
  return freed;
}

void KvResidency::compact(std::vector<int32_t>& freed) {
  size_t w = 0;
  for (size_t i = 0; i < positions_.size(); ++i) {
    if (evict_[i]) {
      freed.push_back(slots_[i]);
      continue;
    }
    positions_[w] = positions_[i];
    slots_[w] = slots_[i];
    mass_[w] = mass_[i];
    ++w;
  }
  positions_.resize(w);
  slots_.resize(w);
  mass_.resize(w);
}

std::vector<int32_t> KvResidency::truncate(int64_t n) {
  TERN_ASSERT(n >= 0 && n <= size());
  std::vector<int32_t> dropped(slots_.begin() + n, slots_.end());
  if (n < size()) next_pos_ = positions_[size_t(n)];
  positions_.resize(size_t(n));
  slots_.resize(size_t(n));
  mass_.resize(size_t(n));
  return dropped;
}

void KvResidency::clear() {
  positions_.clear();
  slots_.clear();
  mass_.clear();
  next_pos_ = 0;
  n_evicted_ = 0;
}

}  // namespace tern
