#include "core/path_chooser.h"

#include <algorithm>
#include <bit>
#include <utility>

namespace tern {

int PathChooser::class_of(int64_t size) {
  const int c = size > 0 ? int(std::bit_width(uint64_t(size) / kFirstClassSize)) : 0;
  return c < kClasses ? c : kClasses - 1;
}

int PathChooser::pick(int64_t size) {
  last_class_ = class_of(size);
  Class& c = classes_[size_t(last_class_)];
  const int64_t step = c.step++;
  // Exploration: a burst of path 0, then one of path 1.
  if (step < 2 * kBurst) return step < kBurst ? 0 : 1;
  // Then the cheaper path, and at the end of every period a burst of the other one.
  const int64_t period = reexplore_every_ > 2 * kBurst ? reexplore_every_ : 2 * kBurst;
  const int64_t phase = (step - 2 * kBurst) % period, burst_start = period - kBurst;
  if (phase == burst_start) c.probe_path = 1 - c.best();
  return phase >= burst_start ? c.probe_path : c.best();
}

void PathChooser::record(int path, double cost) {
  const int p = path & 1;
  const bool cold = p != last_path_;  // the first step after a switch (see the header)
  last_path_ = p;
  if (cold) return;
  Class& c = classes_[size_t(last_class_)];
  c.costs[size_t(p)][size_t(c.next[size_t(p)])] = cost;
  c.next[size_t(p)] = (c.next[size_t(p)] + 1) % kSamples;
  c.n_costs[size_t(p)] = std::min(c.n_costs[size_t(p)] + 1, kSamples);
}

void PathChooser::note(int path) { last_path_ = path & 1; }

double PathChooser::Class::median(int path) const {
  const auto p = size_t(path);
  std::array<double, kSamples> v = costs[p];
  const int n = n_costs[p];
  for (int i = 1; i < n; ++i)  // insertion sort of at most kSamples values
    for (int j = i; j > 0 && v[size_t(j)] < v[size_t(j - 1)]; --j) std::swap(v[size_t(j)], v[size_t(j - 1)]);
  return v[size_t(n / 2)];
}

int PathChooser::Class::best() const {
  if (n_costs[0] == 0 || n_costs[1] == 0) return n_costs[0] == 0 ? 1 : 0;
  return median(1) < median(0) ? 1 : 0;
}

int PathChooser::best(int64_t size) const { return classes_[size_t(class_of(size))].best(); }

}  // namespace tern
