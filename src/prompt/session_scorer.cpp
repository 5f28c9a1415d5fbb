// SessionScorer: prompt compression's log-probabilities from a Session (session_scorer.h).
#include "prompt/session_scorer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "runtime/session.h"

namespace tern::prompt {

std::vector<double> SessionScorer::logprobs(std::span<const int32_t> context, std::span<const int32_t> tokens) {
  TERN_ASSERT_MSG(!context.empty(), "SessionScorer: empty context");
  if (tokens.empty()) return {};
  const int64_t total = int64_t(context.size() + tokens.size());
  if (total > session_.n_ctx() && !session_.unbounded())
    fail("prompt compression: the scorer would need ", total, " tokens of context (", context.size(),
         " before the ", tokens.size(), " it scores), more than its --ctx ", session_.n_ctx());
  // Keep the cached prefix this call shares, but at least the last context token must run
  // forward: its logits predict tokens[0].
  const std::vector<int32_t>& cached = session_.tokens();
  size_t common = 0;
  while (common < cached.size() && common + 1 < context.size() && cached[common] == context[common]) ++common;
  session_.truncate(int64_t(common));
  std::vector<int32_t> step(context.begin() + std::ptrdiff_t(common), context.end());
  step.insert(step.end(), tokens.begin(), tokens.end() - 1);  // the last token predicts nothing
  const float* logits = session_.eval(step, true);
  evaluated_ += int64_t(step.size());
  const int64_t V = session_.hparams().n_vocab;
  const size_t first_row = context.size() - 1 - common;  // the row of the last context token
  for (size_t k = 0; k < tokens.size(); ++k)
    if (tokens[k] < 0 || tokens[k] >= V)
      fail("prompt compression: token id ", tokens[k], " is outside the scorer's vocabulary of ", V);
  // log-softmax at each token, rows split over the session's threads: with a 32,000-token
  // vocabulary the exponentials, not the scorer's forward, are most of a small scorer's time
  // (float exponentials in 8 partial sums: a ranking needs no more).
  std::vector<double> out(tokens.size());
  session_.pool().parallel_for(int64_t(tokens.size()), [&](int64_t begin, int64_t end, int) {
    for (int64_t k = begin; k < end; ++k) {
      const float* row = logits + (int64_t(first_row) + k) * V;
      float mx = row[0];
      for (int64_t v = 1; v < V; ++v) mx = std::max(mx, row[v]);
      float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t v = 0;
      for (; v + 8 <= V; v += 8)
        for (int j = 0; j < 8; ++j) part[j] += std::exp(row[v + j] - mx);
      double sum = 0;
      for (; v < V; ++v) sum += std::exp(double(row[v] - mx));
      for (float x : part) sum += double(x);
      out[size_t(k)] = double(row[tokens[size_t(k)]] - mx) - std::log(sum);
    }
  });
  for (size_t k = 0; k < out.size(); ++k)
    if (!std::isfinite(out[k])) fail("prompt compression: the scorer gave non-finite logits at token ", k);
  return out;
}

}  // namespace tern::prompt
