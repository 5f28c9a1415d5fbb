#pragma once
// Picks the faster of two interchangeable ways to run the same step (ways that give the same
// bits, so switching never changes a result) by timing both: a burst of steps on each at
// first, then the one with the lower median cost, with a burst of the other one every
// `reexplore_every` steps so that its median follows the machine (other load, where the OS
// puts the threads).
//
// Per size class: which path wins depends on the step's size (for a decode step, the context
// it attends to: the threaded path's fixed hand-off cost is paid back by a long context's
// attention, not by a short one's), so costs are kept per power-of-two class of the size the
// caller gives (from 64 on), and each class chooses on its own.
//
// Bursts, and the first step after a switch not counted: a step's cost depends on what ran
// before it. The first multi-threaded step after single-threaded ones wakes sleeping workers
// (~0.4 ms on a VM) and finds its share of the weights out of its core's cache; alternating
// single steps measured the multi-threaded path 1.3x slower than its steady state.
//
// Used by small models' forward pass: the whole pass as one multi-threaded region in phases
// versus the same pass on the calling thread alone. Which wins depends on how fast two cores of
// this machine can hand work to each other, which only a measurement tells. One caller at a time.
#include <array>
#include <cstdint>

namespace tern {

class PathChooser {
 public:
  static constexpr int kSamples = 5;            // per path; the median of these decides
  static constexpr int kBurst = kSamples + 1;   // steps per burst: a cold one, then the samples
  // Size classes: [0, 64), [64, 128), [128, 256), ..., the last open-ended. Not finer at the
  // bottom: each class pays for its own exploration, which a short run (a 32-token
  // generation) could spend most of its steps on.
  static constexpr int64_t kFirstClassSize = 64;
  static constexpr int kClasses = 20;

  explicit PathChooser(int64_t reexplore_every = 1024) : reexplore_every_(reexplore_every) {}

  // The path (0 or 1) to run this step, of `size` (>= 0; e.g. the positions it attends to).
  int pick(int64_t size = 0);
  // The cost of the step just picked, run on `path` (e.g. seconds per token).
  void record(int path, double cost);
  // A step that ran on `path` without pick() (the caller knew the answer): not a sample, but a
  // switch all the same, so the next recorded step after it on the other path counts as cold.
  void note(int path);
  // The path exploitation currently favours for steps of `size` (for tests and reports).
  int best(int64_t size = 0) const;

 private:
  struct Class {
    int64_t step = 0;
    int probe_path = 0;  // the path of the current re-exploration burst
    std::array<std::array<double, kSamples>, 2> costs{};
    std::array<int, 2> n_costs{};  // samples held, up to kSamples
    std::array<int, 2> next{};     // ring position
    int best() const;
    double median(int path) const;
  };
  static int class_of(int64_t size);

  int64_t reexplore_every_;
  std::array<Class, kClasses> classes_{};
  int last_class_ = 0;  // of the last pick()
  int last_path_ = -1;  // of the previous record(): a switch makes a cold step
};

}  // namespace tern
