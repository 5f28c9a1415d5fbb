// ReLU-fied models (issue #31): the ReGLU FFN (max(gate, 0) * up) in training and inference.
// Every tensor's gradient against a directional finite difference, the activation L1 penalty's
// gradient against the finite difference of its value, the checkpoint's tern.ffn_activation key
// read back by training and inference, the inference engine's logits equal to training's
// forward, and `tern sparsify` end to end (its sparsity against a count of exact zeros).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "compress/activation_sparsity.h"
#include "gguf/gguf.h"
#include "models/hparams.h"
#include "test_util.h"
#include "train/forward_backward.h"
#include "train/model.h"
#include "train_test_util.h"

namespace tern::train {
namespace {

using tern::testing::random_windows;
using tern::testing::test_model;

ModelShape relu_shape(int64_t n_vocab = 11) {
  ModelShape s = tern::testing::tiny_shape(n_vocab);
  s.ffn_relu = true;
  return s;
}

// A wrong mask or a SwiGLU derivative left in the backward fails here. The step is small: a
// finite difference that moves a gate across 0 sees the kink.
TEST(ReluFfn, EveryTensorsGradientMatchesADirectionalFiniteDifference) {
  const ModelShape s = relu_shape();
  TrainModel m = test_model(s, 5);
  const int64_t n_seq = 2, n_ctx = 6;
  const auto windows = random_windows(n_seq, n_ctx, s.n_vocab, 8);
  ForwardBackward fb(s, n_seq, n_ctx, nullptr);
  fb.prepare(m);
  std::vector<float> g(size_t(m.n_params()), 0.0f);
  fb.forward_backward(m, windows.data(), g.data(), 1.0f);
  std::mt19937 rng(17);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (const auto& p : m.params) {
    const std::vector<double> dir = tern::testing::unit_direction(rng, nd, p.size);
    const double gd = tern::testing::along(dir, g.data() + p.offset);
    const std::vector<float> keep(m.data.begin() + p.offset, m.data.begin() + p.offset + p.size);
    auto loss_at = [&](double h) {
      for (int64_t i = 0; i < p.size; ++i) m.data[size_t(p.offset + i)] = float(keep[size_t(i)] + h * dir[size_t(i)]);
      fb.prepare(m);
      return fb.forward_loss(m, windows.data());
    };
    const double h = 3e-3;
    const double fd = (loss_at(h) - loss_at(-h)) / (2 * h);
    std::copy(keep.begin(), keep.end(), m.data.begin() + p.offset);
    EXPECT_NEAR(gd, fd, 3e-3 + 2e-2 * std::abs(fd)) << p.name;
  }
}

// The penalty's gradient is the gradient of activation_l1_penalty's value: g(lambda) - g(0).
TEST(ReluFfn, ActivationL1GradientMatchesItsValuesFiniteDifference) {
  const ModelShape s = relu_shape();
  TrainModel m = test_model(s, 6);
  const int64_t n_seq = 2, n_ctx = 6;
  const auto windows = random_windows(n_seq, n_ctx, s.n_vocab, 9);
  ForwardBackward fb(s, n_seq, n_ctx, nullptr);
  EXPECT_THROW(fb.set_activation_l1(-1.0f), Error);
  EXPECT_THROW(fb.set_activation_l1(NAN), Error);
  std::vector<float> g0(size_t(m.n_params()), 0.0f), g1(size_t(m.n_params()), 0.0f);
  fb.prepare(m);
  const double ce0 = fb.forward_backward(m, windows.data(), g0.data(), 1.0f);
  const float lambda = 0.5f;
  fb.set_activation_l1(lambda);
  fb.prepare(m);
  const double ce1 = fb.forward_backward(m, windows.data(), g1.data(), 1.0f);
  EXPECT_EQ(ce0, ce1);  // the returned loss stays the cross-entropy
  EXPECT_GT(fb.activation_l1_penalty(m, windows.data()), 0.0);
  std::mt19937 rng(3);
  std::normal_distribution<double> nd(0.0, 1.0);
  int checked = 0;
  for (const auto& p : m.params) {
    if (p.name.find("ffn_") == std::string::npos && p.name.find("attn_q") == std::string::npos) continue;
    const std::vector<double> dir = tern::testing::unit_direction(rng, nd, p.size);
    double gd = 0;
    for (int64_t i = 0; i < p.size; ++i)
      gd += dir[size_t(i)] * (double(g1[size_t(p.offset + i)]) - double(g0[size_t(p.offset + i)]));
    const std::vector<float> keep(m.data.begin() + p.offset, m.data.begin() + p.offset + p.size);
    auto penalty_at = [&](double h) {
      for (int64_t i = 0; i < p.size; ++i) m.data[size_t(p.offset + i)] = float(keep[size_t(i)] + h * dir[size_t(i)]);
      fb.prepare(m);
      return fb.activation_l1_penalty(m, windows.data());
    };
    const double h = 3e-3;
    const double fd = (penalty_at(h) - penalty_at(-h)) / (2 * h);
    std::copy(keep.begin(), keep.end(), m.data.begin() + p.offset);
    EXPECT_NEAR(gd, fd, 2e-3 + 2e-2 * std::abs(fd)) << p.name;
    // The last layer's ffn_down feeds no activation: its penalty gradient is 0, as its difference.
    if (p.name != "blk.1.ffn_down.weight") {
      EXPECT_GT(std::abs(gd), 1e-5) << p.name << ": the penalty's gradient vanishes";
    }
    ++checked;
  }
  EXPECT_GE(checked, 4);
}


// Written with tern.ffn_activation "relu", read back as ReGLU by training and by inference, and
// `tern logits` on the file gives training's logits (a SwiGLU inference would not).
TEST(ReluFfn, CheckpointKeyAndInferenceLogitsMatchTraining) {
  tern::testing::TrainTempDir dir;
  const GgufFile vocab = GgufFile::open(tern::testing::write_train_vocab(dir));
  const ModelShape s = relu_shape(300);
  const TrainModel m = test_model(s, 9);
  save_model(m, vocab, dir.file("r.gguf"));
  const GgufFile f = GgufFile::open(dir.file("r.gguf"));
  EXPECT_EQ(f.get_string(kFfnActivationKey), "relu");
  const TrainModel back = load_model(f);
  EXPECT_TRUE(back.shape.ffn_relu);
  ModelShape silu = s;
  silu.ffn_relu = false;
  EXPECT_FALSE(back.shape.same_architecture(silu));
  ASSERT_TRUE(read_hparams(f).ffn_activation.has_value());
  EXPECT_EQ(*read_hparams(f).ffn_activation, FfnActivation::Relu);

  const int64_t n = 7;
  const std::vector<int32_t> window = random_windows(1, n, s.n_vocab, 4);
  ForwardBackward fb(s, 1, n, nullptr);
  fb.prepare(m);
  fb.forward_loss(m, window.data());
  tern::testing::expect_tern_logits_match(dir.file("r.gguf"), window, size_t(n), fb, s.n_vocab, dir.file("l.f32"));
}

TEST(ReluFfn, UnknownActivationKeyIsAClearError) {
  tern::testing::TrainTempDir dir;
  const GgufFile vocab = GgufFile::open(tern::testing::write_train_vocab(dir));
  const TrainModel m = test_model(tern::testing::tiny_shape(300), 2);
  save_model(m, vocab, dir.file("g.gguf"), {{kFfnActivationKey, GgufValue::string("gelu")}});
  const GgufFile f = GgufFile::open(dir.file("g.gguf"));
  try {
    read_hparams(f);
    FAIL() << "an unknown tern.ffn_activation was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tern.ffn_activation is 'gelu'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_model(f), Error);
}

}  // namespace
}  // namespace tern::train
