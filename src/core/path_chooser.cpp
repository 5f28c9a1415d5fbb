#include "core/path_chooser.h"

#include <algorithm>
#include <utility>

namespace tern {

int PathChooser::pick() {
  const int64_t phase = step_++ % reexplore_every_;
  // Exploration: alternate until each path has its samples (at the start and periodically).
  if (phase < 2 * kSamples) return int(phase % 2);
  if (n_costs_[0] == 0) return 0;
  if (n_costs_[1] == 0) return 1;
  return best();
}

void PathChooser::record(int path, double cost) {
  const auto p = size_t(path & 1);
  costs_[p][size_t(next_[p])] = cost;
  next_[p] = (next_[p] + 1) % kSamples;
  n_costs_[p] = std::min(n_costs_[p] + 1, kSamples);
}

double PathChooser::median(int path) const {
  const auto p = size_t(path);
  std::array<double, kSamples> c = costs_[p];
  const int n = n_costs_[p];
  for (int i = 1; i < n; ++i)  // insertion sort of at most kSamples values
    for (int j = i; j > 0 && c[size_t(j)] < c[size_t(j - 1)]; --j) std::swap(c[size_t(j)], c[size_t(j - 1)]);
  return c[size_t(n / 2)];
}

int PathChooser::best() const {
  if (n_costs_[0] == 0 || n_costs_[1] == 0) return n_costs_[0] == 0 ? 1 : 0;
  return median(1) < median(0) ? 1 : 0;
}

}  // namespace tern
