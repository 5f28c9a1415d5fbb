#pragma once
// Picks the faster of two interchangeable ways to run the same step (ways that give the same
// bits, so switching never changes a result) by timing both: a few steps of each at the start
// and again every `reexplore_every` steps (the machine changes: other load, where the OS puts
// the threads), and in between the one with the lower median cost.
//
// Used by small models' forward pass: the whole pass as one multi-threaded region in phases
// versus the same pass on the calling thread alone. Which wins depends on how fast two cores of
// this machine can hand work to each other, which only a measurement tells. One caller at a time.
#include <array>
#include <cstdint>

namespace tern {

class PathChooser {
 public:
  static constexpr int kSamples = 5;  // per path; the median of these decides

  explicit PathChooser(int64_t reexplore_every = 1024) : reexplore_every_(reexplore_every) {}

  // The path (0 or 1) to run this step.
  int pick();
  // The cost of the step just run on `path` (e.g. seconds per token).
  void record(int path, double cost);
  // The path exploitation currently favours (for tests and reports).
  int best() const;

 private:
  double median(int path) const;

  int64_t reexplore_every_;
  int64_t step_ = 0;
  std::array<std::array<double, kSamples>, 2> costs_{};
  std::array<int, 2> n_costs_{};  // samples held, up to kSamples
  std::array<int, 2> next_{};     // ring position
};

}  // namespace tern
