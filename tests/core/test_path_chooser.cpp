// PathChooser: explores both paths in bursts at the start (the first step after a switch not
// counted), then follows the cheaper one by median cost (one outlier does not flip it), with a
// burst of the other at the end of every period, so that it notices when the costs change.
#include <gtest/gtest.h>

#include "core/path_chooser.h"

namespace tern {
namespace {

constexpr int B = PathChooser::kBurst;

TEST(PathChooser, ExploresInBurstsAndDoesNotCountColdSteps) {
  PathChooser c(100);
  // A cold step (the first of each burst) costs 1000: it must not count, or path 1 would lose.
  for (int s = 0; s < 2 * B; ++s) {
    const int want = s < B ? 0 : 1;
    ASSERT_EQ(c.pick(), want) << "step " << s;
    c.record(want, s % B == 0 ? 1000.0 : (want == 0 ? 2.0 : 1.0));
  }
  EXPECT_EQ(c.best(), 1);
  EXPECT_EQ(c.pick(), 1);
}

// A step its caller ran without asking (note) is no sample, and the next step on the other path
// after it is cold: here path 0's steps after each noted path-1 step cost 1000 and must not count.
TEST(PathChooser, NotedStepsAreNoSamplesButMakeTheNextStepCold) {
  PathChooser c(100);
  for (int s = 0; s < 2 * B; ++s) {
    const int p = c.pick();
    ASSERT_EQ(p, s < B ? 0 : 1) << "step " << s;
    c.record(p, s % B == 0 ? 1000.0 : (p == 0 ? 1.0 : 2.0));  // path 0 cheaper
  }
  ASSERT_EQ(c.best(), 0);
  for (int s = 0; s < 20; ++s) {
    c.note(1);  // e.g. a large step, run threaded without a trial
    const int p = c.pick();
    c.record(p, p == 0 ? 1000.0 : 2.0);  // cold: not counted
  }
  EXPECT_EQ(c.best(), 0);
  // Without the note the same costs are samples, and path 0 loses.
  for (int s = 0; s < 20; ++s) {
    const int p = c.pick();
    c.record(p, p == 0 ? 1000.0 : 2.0);
  }
  EXPECT_EQ(c.best(), 1);
}

TEST(PathChooser, FollowsTheCheaperProbesTheOtherAndAdapts) {
  const int64_t period = 100;
  PathChooser c(period);
  double cost[2] = {2.0, 1.0};  // path 1 cheaper
  int counts[2] = {0, 0};
  for (int s = 0; s < 2 * B + 3 * period; ++s) {
    const int p = c.pick();
    ++counts[p];
    // One outlier on the cheap path must not flip the choice.
    c.record(p, s == 40 && p == 1 ? 50.0 : cost[p]);
  }
  EXPECT_EQ(c.best(), 1);
  EXPECT_EQ(counts[0], 4 * B);  // its exploration burst and one burst per period
  // The machine changes: path 0 becomes cheaper; the next burst of it sees that.
  cost[0] = 0.5;
  for (int s = 0; s < period; ++s) {
    const int p = c.pick();
    c.record(p, cost[p]);
  }
  EXPECT_EQ(c.best(), 0);
  counts[0] = counts[1] = 0;
  for (int s = 0; s < period; ++s) {
    const int p = c.pick();
    ++counts[p];
    c.record(p, cost[p]);
  }
  EXPECT_EQ(counts[1], B);  // only path 1's burst
}

// Sizes of different classes choose on their own: here path 1 wins on long steps only (a
// threaded path whose fixed cost a long context pays back), and each class follows its own.
TEST(PathChooser, EachSizeClassChoosesOnItsOwn) {
  PathChooser c(1 << 20);
  auto cost = [](int path, int64_t size) { return path == 0 ? 1.0 + 0.01 * double(size) : 1.5 + 0.002 * double(size); };
  int counts[2][2] = {{0, 0}, {0, 0}};  // [short/long][path]
  for (int s = 0; s < 400; ++s) {
    const int64_t size = (s / 50) % 2 == 0 ? 5 : 300;  // runs of short and of long steps
    const int p = c.pick(size);
    if (s >= 200) ++counts[size > 100][p];
    c.record(p, cost(p, size));
  }
  EXPECT_EQ(c.best(5), 0);
  EXPECT_EQ(c.best(300), 1);
  EXPECT_EQ(counts[0][1], 0);
  EXPECT_EQ(counts[1][0], 0);
  EXPECT_EQ(c.best(63), 0);   // the same class as 5
  EXPECT_EQ(c.best(257), 1);  // the same class as 300
}

}  // namespace
}  // namespace tern
