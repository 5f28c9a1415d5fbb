// The distillation losses' gradients against finite differences (double), their known values,
// and `tern distill` end to end on small models.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "gguf/gguf.h"
#include "models/synth.h"
#include "test_util.h"
#include "train/distill.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::train::test_distill {
namespace {

namespace fs = std::filesystem;

struct Case {
  KdDivergence d;
  double temperature, hard_weight;
};

class KdLoss : public ::testing::TestWithParam<Case> {};

TEST_P(KdLoss, GradientMatchesFiniteDifferences) {
  const Case c = GetParam();
  KdConfig cfg;
  cfg.divergence = c.d;
  cfg.temperature = c.temperature;
  cfg.hard_weight = c.hard_weight;
  cfg.mix = 0.3;
  const int64_t n = 4, V = 9;
  std::mt19937 rng(static_cast<uint32_t>(int(c.d) * 31 + int(c.temperature * 10)));
  std::normal_distribution<double> nd(0.0, 2.0);
  std::vector<double> z(size_t(n * V)), zt(size_t(n * V));
  for (auto& v : z) v = nd(rng);
  for (auto& v : zt) v = nd(rng);
  std::vector<int32_t> targets = {3, -1, 0, 8};
  std::vector<double> g = z;
  const double fused = kd_loss_fused<double>(nullptr, cfg, n, V, g.data(), zt.data(), targets.data(), 0.5);
  EXPECT_NEAR(fused, kd_loss<double>(nullptr, cfg, n, V, z.data(), zt.data(), targets.data()), 1e-12);
  const double h = 1e-6;
  for (size_t i = 0; i < z.size(); ++i) {
    const double keep = z[i];
    z[i] = keep + h;
    const double lp = kd_loss<double>(nullptr, cfg, n, V, z.data(), zt.data(), targets.data());
    z[i] = keep - h;
    const double lm = kd_loss<double>(nullptr, cfg, n, V, z.data(), zt.data(), targets.data());
    z[i] = keep;
    EXPECT_NEAR(g[i], 0.5 * (lp - lm) / (2 * h), 1e-7) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(All, KdLoss,
                         ::testing::Values(Case{KdDivergence::Forward, 1.0, 0.0}, Case{KdDivergence::Forward, 2.0, 0.3},
                                           Case{KdDivergence::Reverse, 1.0, 0.0}, Case{KdDivergence::Reverse, 3.0, 0.5},
                                           Case{KdDivergence::Mix, 2.0, 0.1}, Case{KdDivergence::None, 2.0, 0.1}));

TEST(KdLossValues, KlIsZeroForTheSameDistributionAndCrossEntropyForNone) {
  KdConfig cfg;
  cfg.hard_weight = 0.0;
  std::vector<double> z = {0.5, -1.0, 2.0}, zt = z;
  std::vector<int32_t> t = {2};
  for (auto d : {KdDivergence::Forward, KdDivergence::Reverse, KdDivergence::Mix}) {
    cfg.divergence = d;
    EXPECT_NEAR(kd_loss<double>(nullptr, cfg, 1, 3, z.data(), zt.data(), t.data()), 0.0, 1e-12);
  }
  cfg.divergence = KdDivergence::None;
  const double lse = std::log(std::exp(0.5) + std::exp(-1.0) + std::exp(2.0));
  EXPECT_NEAR(kd_loss<double>(nullptr, cfg, 1, 3, z.data(), zt.data(), t.data()), lse - 2.0, 1e-12);
  // forward KL at T=1 of two known distributions
  cfg.divergence = KdDivergence::Forward;
  cfg.temperature = 1.0;
  std::vector<double> a = {0.0, 0.0}, b = {std::log(3.0), 0.0};  // s = (1/2, 1/2), t = (3/4, 1/4)
  const double want = 0.75 * std::log(1.5) + 0.25 * std::log(0.5);
  EXPECT_NEAR(kd_loss<double>(nullptr, cfg, 1, 2, a.data(), b.data(), t.data()), want, 1e-12);
  EXPECT_THROW(parse_kd_divergence("kl"), Error);
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("tern_distill_test_" + std::to_string(::getpid()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

TEST(DistillCli, TeacherWithAnotherVocabularyIsRefusedWithTheSequenceLevelHint) {
  TempDir dir;
  {
    GgufWriter w(3);
    add_generated_vocab(w, 300);
    w.write(dir.file("v300.gguf"));
  }
  { std::ofstream(dir.file("d.txt")) << "the cat sat on the mat and the dog ran home to the big red house.\n"; }
  SynthOptions o;
  o.shape = "stories260k";
  synth_model(o, dir.file("teacher.gguf"));  // a generated 512-token vocabulary
  std::string out, err;
  const std::string base = std::string(TERN_BINARY) + " distill --teacher " + dir.file("teacher.gguf") +
                           " --vocab-from " + dir.file("v300.gguf") +
                           " --n-embd 16 --n-layer 1 --n-head 2 --n-ff 32 --ctx 8 --batch 2 -t 1 -q --steps 2 --data " +
                           dir.file("d.txt") + " -o " + dir.file("s.gguf");
  EXPECT_EQ(testing::run_command(base, &out, &err), 1);
  EXPECT_NE(err.find("same vocabulary"), std::string::npos) << err;
  EXPECT_NE(err.find("--teacher-samples"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir.file("s.gguf")));
  // Sequence-level works across vocabularies.
  EXPECT_EQ(testing::run_command(base + " --kd none --teacher-samples 3 --sample-len 16 --save-samples " +
                                     dir.file("samples.txt"), &out, &err), 0) << err;
  EXPECT_TRUE(fs::exists(dir.file("s.gguf")));
  EXPECT_GT(fs::file_size(dir.file("samples.txt")), 0u);
}

TEST(DistillCli, TokenLevelFromStories260KLowersTheLossBelowHardLabels) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  TERN_REQUIRE_SHARED("data/tinystories/tinystories_val.txt");
  TempDir dir;
  const std::string val = testing::shared_path("data/tinystories/tinystories_val.txt");
  const std::string teacher = testing::shared_path("models/stories260K.gguf");
  // The student is the teacher itself, continued: its KL to itself starts at 0, so the loss
  // reported at step 1 is only the hard part.
  std::string out, err;
  const std::string cmd = std::string(TERN_BINARY) + " distill --teacher " + teacher + " -m " + teacher +
                          " --data " + val + " --ctx 32 --batch 2 --steps 1 --lr 1e-9 --hard-weight 0.25 --json -q -t 2 -o " +
                          dir.file("s.gguf");
  ASSERT_EQ(testing::run_command(cmd, &out, &err), 0) << err;
  const auto pos = out.find("\"loss\":");
  ASSERT_NE(pos, std::string::npos) << out;
  const double kd = std::stod(out.substr(pos + 7));
  const std::string ce_cmd = std::string(TERN_BINARY) + " train -m " + teacher + " --data " + val +
                             " --ctx 32 --batch 2 --steps 1 --lr 1e-9 --json -q -t 2 -o " + dir.file("c.gguf");
  ASSERT_EQ(testing::run_command(ce_cmd, &out, &err), 0) << err;
  const auto p2 = out.find("\"loss\":");
  const double ce = std::stod(out.substr(p2 + 7));
  EXPECT_NEAR(kd, 0.25 * ce, 1e-3 * ce) << "distilling a model into itself: only the hard term remains";
}

}  // namespace
}  // namespace tern::train::test_distill
