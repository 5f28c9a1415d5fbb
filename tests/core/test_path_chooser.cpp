// PathChooser: explores both paths at the start and periodically, then follows the cheaper
// one by median cost (one outlier does not flip it), and notices when the costs change.
#include <gtest/gtest.h>

#include "core/path_chooser.h"

namespace tern {
namespace {

TEST(PathChooser, ExploresBothThenFollowsTheCheaperAndAdapts) {
  PathChooser c(100);
  double cost[2] = {2.0, 1.0};  // path 1 cheaper
  int counts[2] = {0, 0};
  for (int s = 0; s < 100; ++s) {
    const int p = c.pick();
    ++counts[p];
    // One outlier on the cheap path must not flip the choice.
    c.record(p, s == 40 && p == 1 ? 50.0 : cost[p]);
  }
  EXPECT_EQ(c.best(), 1);
  EXPECT_EQ(counts[0], PathChooser::kSamples);  // path 0 only while exploring
  // The machine changes: path 0 becomes cheaper; the next exploration round sees it.
  cost[0] = 0.5;
  counts[0] = counts[1] = 0;
  for (int s = 0; s < 100; ++s) {
    const int p = c.pick();
    ++counts[p];
    c.record(p, cost[p]);
  }
  EXPECT_EQ(c.best(), 0);
  EXPECT_GT(counts[0], 80);
}

TEST(PathChooser, AlternatesWhileExploring) {
  PathChooser c(1000);
  for (int s = 0; s < 2 * PathChooser::kSamples; ++s) {
    EXPECT_EQ(c.pick(), s % 2);
    c.record(s % 2, 1.0);
  }
}

}  // namespace
}  // namespace tern
