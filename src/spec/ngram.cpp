#include "spec/ngram.h"

#include <algorithm>
#include <cstddef>

namespace tern {

void ngram_propose(std::span<const int32_t> tokens, int n_max, const NgramParams& params, std::vector<int32_t>& out) {
  const int64_t len = int64_t(tokens.size());
  if (n_max <= 0 || len < 2) return;
  const int hi = std::max(1, params.ngram_max), lo = std::clamp(params.ngram_min, 1, hi);
  for (int n = int(std::min<int64_t>(hi, len - 1)); n >= lo; --n) {
    const std::span<const int32_t> key = tokens.last(size_t(n));
    // The most recent earlier occurrence: an occurrence starting at i (i + n <= len - 1, so at
    // least one token follows it), scanned from the end.
    for (int64_t i = len - 1 - n; i >= 0; --i) {
      if (tokens[size_t(i + n - 1)] != key[size_t(n - 1)]) continue;
      if (!std::equal(key.begin(), key.end(), tokens.begin() + i)) continue;
      // The text is guessed to go on as it went on after the occurrence: token len + j is
      // token i + n + j, which may itself be a guess (a loop keeps its period).
      const size_t base = out.size();
      for (int64_t j = 0; j < n_max; ++j) {
        const int64_t src = i + n + j;
        out.push_back(src < len ? tokens[size_t(src)] : out[base + size_t(src - len)]);
      }
      return;
    }
  }
}

}  // namespace tern
