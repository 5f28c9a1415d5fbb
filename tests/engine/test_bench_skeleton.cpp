// `tern bench-serve --organize skeleton`: Skeleton-of-Thought against the same tokens decoded one
// after another, on stories260K (ChatML as an explicit template: the model declares none).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"
#include "tools/bench_skeleton.h"

namespace tern {
namespace {

using tern::testing::make_temp_dir;
using tern::testing::remove_temp_dir;
using tern::testing::run_tern;
using tern::testing::shared_path;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t count_of(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

class BenchSkeletonCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_temp_dir("tern_bench_skeleton");
    points_ = dir_ + "/points.txt";
    std::ofstream(points_) << "1. The cat\n2. The dog\n\n3. The park\n";
  }
  void TearDown() override { remove_temp_dir(dir_); }
  std::string bench(const std::string& args) const {
    return "bench-serve -m " + shared_path("models/stories260K.gguf") + " -t 2 --num-prompts 2 --input-len 20 " + args;
  }
  std::string dir_, points_;
};

TEST_F(BenchSkeletonCli, GivenPointsEqualTheirSequentialDecodeAndTheReportHasItsFields) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string chart = dir_ + "/e2e.svg";
  const auto r = run_tern(bench("--organize skeleton --skeleton " + points_ +
                                " --point-tokens 8 --temp 0 --chat-template chatml --json --chart " + chart));
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out;
  for (const char* key : {"organize", "questions", "concurrency", "points_mean", "skeleton", "sequential", "speedup_e2e",
                          "batch_decode_ratio", "speedup_bound", "mismatched_points", "compared_points"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j.value("organize", ""), "skeleton");
  EXPECT_EQ(j.value("questions", 0), 2);
  EXPECT_EQ(j.value("concurrency", 0), 1);  // one question at a time unless --concurrency
  EXPECT_EQ(j.value("points_mean", 0.0), 3.0);
  EXPECT_EQ(j.value("compared_points", 0), 2 * 3);
  EXPECT_EQ(j.value("mismatched_points", -1), 0);
  EXPECT_EQ(j.value("failed", -1), 0);
  for (const char* phase : {"skeleton", "sequential"}) {
    const auto& p = j[phase];
    for (const char* key : {"e2e_ms_p50", "e2e_ms_p90", "e2e_ms", "first_point_ms_p50", "output_tok_s",
                            "occupancy_mean", "occupancy_max", "points_mean", "fallbacks", "prefix_hit_rate",
                            "decode_batch", "decode_step_ms"})
      EXPECT_TRUE(p.contains(key)) << phase << "." << key;
    // EOS is ignored (bench-serve's default): every point runs to --point-tokens.
    EXPECT_EQ(p.value("output_tokens", 0), 2 * 3 * 8) << phase;
    EXPECT_EQ(p.value("fallbacks", -1), 0) << phase;
    EXPECT_EQ(p["e2e_ms"].size(), 2u) << phase;
  }
  // The three points decode together; one after another, one at a time.
  EXPECT_EQ(j["skeleton"].value("occupancy_max", 0), 3);
  EXPECT_EQ(j["skeleton"].value("decode_batch", 0), 3);
  EXPECT_EQ(j["sequential"].value("occupancy_max", 0), 1);
  EXPECT_EQ(j["sequential"].value("decode_batch", 0), 1);
  // The siblings share the question and the skeleton through the prefix cache.
  EXPECT_GT(j["skeleton"].value("prefix_hit_rate", 0.0), 0.0);
  EXPECT_GT(j.value("speedup_e2e", 0.0), 0.0);
  const std::string svg = read_text(chart);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u) << svg.substr(0, 80);
  EXPECT_EQ(count_of(svg, "<title>question "), 2u * 2u);  // a bar per question and run
}

TEST_F(BenchSkeletonCli, TheTableNamesBothRunsAndTheBound) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  const auto r = run_tern(bench("--organize skeleton --skeleton " + points_ + " --point-tokens 4 --chat-template chatml"));
  ASSERT_EQ(r.rc, 0) << r.err;
  for (const char* text : {"skeleton ", "sequential ", "speedup", "speedup bound", "6 of 6"})
    EXPECT_NE(r.out.find(text), std::string::npos) << text << "\n" << r.out;
}

TEST_F(BenchSkeletonCli, AModelWithoutAChatTemplateNeedsOne) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  const auto r = run_tern(bench("--organize skeleton --skeleton " + points_));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--chat-template"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("chat template"), std::string::npos) << r.err;
}

TEST_F(BenchSkeletonCli, BadArgumentsNameTheirFlag) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  auto r = run_tern(bench("--organize bogus"));
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("--organize"), std::string::npos) << r.err;
  r = run_tern(bench("--organize skeleton --chat-template chatml --skeleton " + dir_ + "/missing.txt"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--skeleton"), std::string::npos) << r.err;
  const std::string empty = dir_ + "/empty.txt";
  std::ofstream(empty) << "\n  \n";
  r = run_tern(bench("--organize skeleton --chat-template chatml --skeleton " + empty));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("no point"), std::string::npos) << r.err;
  // The SoT options mean nothing to a plain benchmark.
  r = run_tern(bench("--skeleton " + points_));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--skeleton needs --organize skeleton"), std::string::npos) << r.err;
  r = run_tern(bench("--organize skeleton --chat-template chatml --skeleton " + points_ + " --request-rate 2"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--request-rate"), std::string::npos) << r.err;
}

TEST_F(BenchSkeletonCli, TheChartNeverOverwritesAnInput) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string before = read_text(points_);
  const auto r = run_tern(bench("--organize skeleton --chat-template chatml --point-tokens 4 --skeleton " + points_ +
                                " --chart " + points_));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("is the input file"), std::string::npos) << r.err;
  EXPECT_EQ(read_text(points_), before);
}

TEST(BenchSkeleton, DecodeBatchIsTheMostFrequentTokensPerStep) {
  // A prefill step (3 tokens, slow), six steps of 3 and a tail of 1s: the batch is 3, its time
  // the median of those steps alone.
  const DecodeBatch d = decode_batch({3, 3, 3, 3, 3, 3, 3, 1, 1, 0}, {50, 10, 11, 12, 10, 11, 12, 4, 4, 0.1});
  EXPECT_EQ(d.batch, 3);
  EXPECT_EQ(d.steps, 7);
  EXPECT_DOUBLE_EQ(d.step_ms, 11);
  // A tie goes to the larger batch; steps that generated nothing never count.
  EXPECT_EQ(decode_batch({2, 2, 4, 4, 0, 0, 0}, {1, 1, 2, 2, 9, 9, 9}).batch, 4);
  EXPECT_EQ(decode_batch({}, {}).batch, 0);
}

TEST(BenchSkeleton, ChartHasABarPerQuestionAndRun) {
  const std::string svg = skeleton_chart_svg({100, 200, 150}, {300, 500, 400}, "SoT <vs> sequential");
  EXPECT_EQ(count_of(svg, "<title>question "), 6u);
  EXPECT_NE(svg.find("SoT &lt;vs&gt; sequential"), std::string::npos);
  EXPECT_NE(svg.find("skeleton-of-thought"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

}  // namespace
}  // namespace tern
