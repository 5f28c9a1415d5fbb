// Prompt lookup (spec/ngram.h): the longest recurring suffix, its most recent occurrence, and
// loops continued with their period.
#include <gtest/gtest.h>

#include "spec/ngram.h"

namespace tern {
namespace {

std::vector<int32_t> propose(const std::vector<int32_t>& t, int n, int ngram_max = 3, int ngram_min = 1) {
  std::vector<int32_t> out;
  ngram_propose(t, n, NgramParams{ngram_max, ngram_min}, out);
  return out;
}

TEST(Ngram, ProposesWhatFollowedTheLongestRecurringSuffix) {
  // "5 6 7" occurs earlier followed by 8 9; "6 7" alone also occurs followed by 1.
  const std::vector<int32_t> t{5, 6, 7, 8, 9, 4, 6, 7, 1, 2, 5, 6, 7};
  EXPECT_EQ(propose(t, 2), (std::vector<int32_t>{8, 9}));
  // With trigrams off, the most recent bigram "6 7" wins: followed by 1 2.
  EXPECT_EQ(propose(t, 2, 2), (std::vector<int32_t>{1, 2}));
}

TEST(Ngram, NothingWhenNoSuffixRecurs) {
  EXPECT_TRUE(propose({1, 2, 3, 4}, 4).empty());
  EXPECT_TRUE(propose({1}, 4).empty());
  EXPECT_TRUE(propose({}, 4).empty());
  EXPECT_TRUE(propose({1, 2, 1}, 0).empty());
  // ngram_min 2: a recurring single token is not enough.
  EXPECT_TRUE(propose({3, 1, 4, 1}, 3, 3, 2).empty());
  EXPECT_EQ(propose({3, 1, 4, 1}, 1, 3, 1), (std::vector<int32_t>{4}));
}

TEST(Ngram, ALoopIsContinuedWithItsPeriod) {
  // ... 1 2 3 1 2 3 1 2: the text loops with period 3, so the guess goes on 3 1 2 3 1.
  EXPECT_EQ(propose({9, 1, 2, 3, 1, 2, 3, 1, 2}, 5), (std::vector<int32_t>{3, 1, 2, 3, 1}));
  // A repeated token: all of the proposal is that token.
  EXPECT_EQ(propose({4, 7, 7, 7}, 6), (std::vector<int32_t>(6, 7)));
}

TEST(Ngram, CopiesAQuotedPassage) {
  // The prompt holds a passage; the output so far started copying it.
  std::vector<int32_t> t{100, 101, 10, 11, 12, 13, 14, 15, 16, 17, 102, 103, 10, 11};
  EXPECT_EQ(propose(t, 5), (std::vector<int32_t>{12, 13, 14, 15, 16}));
}

}  // namespace
}  // namespace tern
