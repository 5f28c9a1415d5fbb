// find_stop / stop_holdback: what a streaming server needs to cut and hold back stop strings.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sampling/sampler.h"

namespace tern {
namespace {

constexpr size_t npos = std::string::npos;

TEST(FindStop, NoStopsOrNoMatch) {
  EXPECT_EQ(find_stop("hello world", {}), npos);
  EXPECT_EQ(find_stop("hello world", {"xyz", "worlds"}), npos);
  EXPECT_EQ(find_stop("", {"a"}), npos);
}

TEST(FindStop, EmptyStopStringsAreIgnored) {
  EXPECT_EQ(find_stop("hello", {""}), npos);
  EXPECT_EQ(find_stop("hello", {"", "llo"}), 2u);
}

TEST(FindStop, EarliestOccurrenceAcrossStops) {
  EXPECT_EQ(find_stop("abc STOP def END", {"END", "STOP"}), 4u);
  EXPECT_EQ(find_stop("a\n\nb\n\n", {"\n\n"}), 1u);  // first of several occurrences
}

TEST(FindStop, OverlappingStops) {
  // "ab" and "b" overlap; the earliest start wins even though "b" is listed first.
  EXPECT_EQ(find_stop("xxab", {"b", "ab"}), 2u);
  // One stop a prefix of another: both start at the same place.
  EXPECT_EQ(find_stop("x<end>", {"<end>", "<e"}), 1u);
}

TEST(FindStop, StopAtVeryEndAndWholeText) {
  EXPECT_EQ(find_stop("the end.</s>", {"</s>"}), 8u);
  EXPECT_EQ(find_stop("</s>", {"</s>"}), 0u);
  EXPECT_EQ(find_stop("</s", {"</s>"}), npos);  // incomplete: that is stop_holdback's job
}

TEST(StopHoldback, NothingToHold) {
  EXPECT_EQ(stop_holdback("hello", {}), 0u);
  EXPECT_EQ(stop_holdback("hello", {""}), 0u);
  EXPECT_EQ(stop_holdback("hello", {"xyz"}), 0u);
  EXPECT_EQ(stop_holdback("", {"abc"}), 0u);
}

TEST(StopHoldback, PartialStopAtTheEnd) {
  EXPECT_EQ(stop_holdback("hello wor", {"world"}), 3u);
  EXPECT_EQ(stop_holdback("hello w", {"world"}), 1u);
  EXPECT_EQ(stop_holdback("wor", {"world"}), 3u);  // the whole text may be held back
}

TEST(StopHoldback, OnlyProperPrefixesCount) {
  // A complete stop is find_stop's business; only its longest proper prefix can be a suffix.
  EXPECT_EQ(stop_holdback("x###", {"###"}), 2u);
  EXPECT_EQ(stop_holdback("end", {"end"}), 0u);
  EXPECT_EQ(stop_holdback("a", {"a"}), 0u);  // a one-byte stop has no proper prefix
}

TEST(StopHoldback, SelfOverlappingStop) {
  // "abab": suffix "aba" is the longest proper prefix, not "a".
  EXPECT_EQ(stop_holdback("xaba", {"abab"}), 3u);
  EXPECT_EQ(stop_holdback("xaab", {"aab"}), 0u);  // complete -> no proper prefix is a suffix
  EXPECT_EQ(stop_holdback("xaa", {"aab"}), 2u);
}

TEST(StopHoldback, LongestAcrossSeveralStops) {
  EXPECT_EQ(stop_holdback("text <|im", {"<|im_end|>", "<", "\n\n"}), 4u);
  EXPECT_EQ(stop_holdback("text\n", {"<|im_end|>", "\n\nUser:"}), 1u);
  EXPECT_EQ(stop_holdback("text\n\nUs", {"\n\nUser:", "s"}), 4u);
}

}  // namespace
}  // namespace tern
