// Quantization-aware training (train/qat.h): the fake-quantized forward weights are the codec's
// own round trip, the straight-through estimator clips exactly the saturated weights, ternary is
// BitNet's absmean rule, and a QAT run trains, checkpoints its latent weights and resumes only
// under the same quantizers. tests/py/test_qat_torch_oracle.py checks the gradients against
// PyTorch and the export against numpy's quantizers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "quant/quant_traits.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "train/data.h"
#include "train/forward_backward.h"
#include "train/qat.h"
#include "train/trainer.h"
#include "train_test_util.h"

namespace tern::train {
namespace {

std::vector<float> random_row(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

// The 32-wide model at 16 tokens of context.
ModelShape qat_shape(int64_t n_vocab) { return testing::shape32(n_vocab, 16); }

using testing::all_matrices;

TEST(Qat, ForwardWeightsAreTheCodecsRoundTripBitForBit) {
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q2_K, DType::Q3_K, DType::Q4_K,
                  DType::Q5_K, DType::Q6_K, DType::MXFP4, DType::F16, DType::BF16}) {
    const QuantTraits* q = quant_traits(t);
    ASSERT_NE(q, nullptr) << dtype_name(t);
    const int64_t n = 512;
    const std::vector<float> w = random_row(n, 11, 0.05f);
    std::vector<uint8_t> bytes(size_t(n / q->block_size * q->block_bytes));
    q->from_float(w.data(), bytes.data(), n);
    std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    q->to_float(bytes.data(), want.data(), n);
    std::vector<uint8_t> pass(static_cast<size_t>(n));
    qat_fake_quantize_row(t, w.data(), got.data(), pass.data(), n);
    EXPECT_EQ(std::memcmp(want.data(), got.data(), size_t(n) * sizeof(float)), 0) << dtype_name(t);
    // Gaussian weights: only a few saturate (none for the absmax q8_0, f16 and bf16).
    int64_t clipped = 0;
    for (uint8_t b : pass) clipped += b == 0;
    EXPECT_LT(clipped, n / 20) << dtype_name(t);
    if (t == DType::Q8_0 || t == DType::F16 || t == DType::BF16) {
      EXPECT_EQ(clipped, 0) << dtype_name(t);
    }
  }
}

TEST(Qat, OnlySaturatedWeightsAreClipped) {
  // q4_0 stores the block's largest magnitude as -8 d: with the maximum negative, a positive weight
  // of the same size needs +8, which does not exist, and saturates at +7 d.
  std::vector<float> w(32, 0.01f);
  w[3] = -1.0f;
  w[7] = 1.0f;    // 8 steps: clamped to 7
  w[9] = 0.9f;    // 7.2 steps: rounds to 7
  std::vector<float> v(32);
  std::vector<uint8_t> pass(32);
  qat_fake_quantize_row(DType::Q4_0, w.data(), v.data(), pass.data(), 32);
  EXPECT_FLOAT_EQ(v[7], 0.875f);
  EXPECT_EQ(pass[7], 0);
  EXPECT_EQ(pass[3], 1);
  EXPECT_EQ(pass[9], 1);
  for (int j : {0, 1, 2, 31}) EXPECT_EQ(pass[size_t(j)], 1) << j;
}

TEST(Qat, TernaryIsAbsmeanPerBlockOf256) {
  const std::vector<float> w = random_row(512, 5, 0.02f);
  std::vector<float> v(512);
  std::vector<uint8_t> pass(512);
  qat_fake_quantize_row(DType::TQ2_0, w.data(), v.data(), pass.data(), 512);
  for (int b = 0; b < 2; ++b) {
    double sum = 0.0;
    for (int j = 0; j < 256; ++j) sum += std::fabs(double(w[size_t(b * 256 + j)]));
    const float d = fp16_to_f32(f32_to_fp16(float(sum / 256.0)));
    int n_zero = 0, n_clipped = 0;
    for (int j = 0; j < 256; ++j) {
      const size_t i = size_t(b * 256 + j);
      const float r = std::clamp(std::nearbyint(w[i] / d), -1.0f, 1.0f);
      EXPECT_EQ(v[i], d * r) << i;
      EXPECT_EQ(pass[i], std::fabs(w[i]) <= 1.5f * d ? 1 : 0) << i;
      n_zero += r == 0.0f;
      n_clipped += pass[i] == 0;
    }
    // Gaussian weights: |w| < d / 2 for about 31% of them, |w| > 1.5 d for about 23%.
    EXPECT_GT(n_zero, 40);
    EXPECT_GT(n_clipped, 20);
  }
  EXPECT_THROW(qat_fake_quantize_row(DType::TQ1_0, w.data(), v.data(), nullptr, 128), Error);
}

TEST(Qat, StraightThroughGradientIsTheQuantizedModelsGradientMasked) {
  ThreadPool pool(2);
  const ModelShape s = qat_shape(13);
  const TrainModel m = testing::test_model(s, 3);
  QatModel qat(m, all_matrices(m, DType::Q4_0), &pool);
  EXPECT_GT(qat.n_clipped(), 0);
  EXPECT_EQ(qat.describe(), "q4_0 x 16 (f32: 5 tensors)");
  const std::vector<int32_t> windows = testing::random_windows(2, 8, s.n_vocab, 4);
  ForwardBackward fb(s, 2, 8, &pool);
  fb.prepare(qat.quantized());
  std::vector<float> g(size_t(m.n_params()), 0.0f);
  fb.forward_backward(qat.quantized(), windows.data(), g.data(), 1.0f);
  const std::vector<float> g_quantized = g;
  qat.straight_through(g.data());
  // Recompute the mask independently: every quantized weight is clipped exactly where the row
  // quantizer says so, and the rest of the gradient is untouched.
  int64_t zeroed = 0;
  for (size_t i = 0; i < m.params.size(); ++i) {
    const ParamInfo& p = m.params[i];
    if (p.ne.size() != 2) {
      for (int64_t k = 0; k < p.size; ++k) ASSERT_EQ(g[size_t(p.offset + k)], g_quantized[size_t(p.offset + k)]);
      continue;
    }
    std::vector<float> v(static_cast<size_t>(p.ne[0]));
    std::vector<uint8_t> pass(static_cast<size_t>(p.ne[0]));
    for (int64_t r = 0; r < p.size / p.ne[0]; ++r) {
      const int64_t o = p.offset + r * p.ne[0];
      qat_fake_quantize_row(DType::Q4_0, m.data.data() + o, v.data(), pass.data(), p.ne[0]);
      for (int64_t k = 0; k < p.ne[0]; ++k) {
        ASSERT_EQ(qat.quantized().data[size_t(o + k)], v[size_t(k)]);
        ASSERT_EQ(g[size_t(o + k)], pass[size_t(k)] ? g_quantized[size_t(o + k)] : 0.0f) << p.name;
        zeroed += pass[size_t(k)] == 0;
      }
    }
  }
  EXPECT_EQ(zeroed, qat.n_clipped());
}

TEST(Qat, RefusesWhatItCannotQuantize) {
  ThreadPool pool(1);
  ModelShape s = qat_shape(13);
  s.n_ff = 40;  // ffn_down rows of 40: not q4_0's blocks of 32
  const TrainModel m = init_model(s, 1);
  try {
    QatModel q(m, all_matrices(m, DType::Q4_0), &pool);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.0.ffn_down.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("40"), std::string::npos) << e.what();
  }
  std::vector<DType> norms_too = all_matrices(m, DType::Q8_0);
  norms_too[1] = DType::Q8_0;  // a norm
  EXPECT_THROW(QatModel(m, norms_too, &pool), Error);
  EXPECT_THROW(QatModel(m, std::vector<DType>(3, DType::Q8_0), &pool), Error);
}

TEST(Qat, TrainsTheQuantizedModelKeepsLatentWeightsAndResumesOnlyUnderTheSameQuantizer) {
  testing::TrainTempDir dir;
  const GgufFile vocab = GgufFile::open(testing::write_train_vocab(dir));
  const auto tok = Tokenizer::from_gguf(vocab);
  const TokenStream data =
      tokenize_text(testing::read_file_bytes(testing::write_train_text(dir, "data.txt", 12, 12)), *tok, false);
  const ModelShape s = qat_shape(tok->n_vocab());
  TrainConfig cfg;
  cfg.n_seq = 2;
  cfg.n_ctx = 16;
  cfg.steps = 12;
  cfg.seed = 3;
  cfg.opt.lr = 2e-2f;
  cfg.opt.warmup = 1;
  cfg.out_path = dir.file("qat.gguf");
  ThreadPool pool(2);
  TrainModel m = init_model(s, cfg.seed);
  QatModel qat(m, all_matrices(m, DType::Q4_0), &pool);
  std::vector<double> losses;
  {
    Trainer t(m, vocab, cfg, &pool);
    t.set_qat(&qat);
    WindowSampler d(&data.tokens, cfg.n_ctx, true, cfg.seed, "data");
    t.run(d, nullptr, [&](const StepLog& l) { losses.push_back(l.loss); }, nullptr);
  }
  ASSERT_EQ(losses.size(), 12u);
  EXPECT_LT(losses.back(), losses.front());
  // The checkpoint holds the latent weights (not their quantized values).
  const GgufFile ck = GgufFile::open(cfg.out_path);
  const TrainModel back = load_model(ck);
  EXPECT_TRUE(back.data == m.data);
  qat.update(m);
  EXPECT_FALSE(qat.quantized().data == m.data);

  // Resuming needs the same quantizers: none, or another type, is refused naming both.
  TrainConfig c2 = cfg;
  c2.steps = 14;
  TrainModel m2 = load_model(ck);
  {
    Trainer t(m2, ck, c2, &pool);
    try {
      t.resume(GgufFile::open(optimizer_state_path(cfg.out_path)), 12);
      FAIL() << "resumed a QAT run without QAT";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("q4_0"), std::string::npos) << e.what();
    }
  }
  QatModel other(m2, all_matrices(m2, DType::Q8_0), &pool);
  {
    Trainer t(m2, ck, c2, &pool);
    t.set_qat(&other);
    EXPECT_THROW(t.resume(GgufFile::open(optimizer_state_path(cfg.out_path)), 12), Error);
  }
  QatModel same(m2, all_matrices(m2, DType::Q4_0), &pool);
  Trainer t(m2, ck, c2, &pool);
  t.set_qat(&same);
  t.resume(GgufFile::open(optimizer_state_path(cfg.out_path)), 12);
  EXPECT_EQ(t.step(), 12);
}

TEST(Qat, LsqLearnsScalesResumesBitForBitAndPacksWhatTheForwardUsed) {
  testing::TrainTempDir dir;
  const GgufFile vocab = GgufFile::open(testing::write_train_vocab(dir));
  const auto tok = Tokenizer::from_gguf(vocab);
  const TokenStream data =
      tokenize_text(testing::read_file_bytes(testing::write_train_text(dir, "data.txt", 12, 5)), *tok, false);
  ModelShape s = qat_shape(tok->n_vocab());
  s.n_embd = 256;  // ternary blocks of 256
  s.n_ff = 256;
  s.n_head = 8;
  s.n_head_kv = 4;
  s.n_layer = 1;
  ThreadPool pool(2);
  for (DType type : {DType::Q4_0, DType::TQ2_0}) {
    TrainConfig cfg;
    cfg.n_seq = 2;
    cfg.n_ctx = 8;
    cfg.steps = 6;
    cfg.seed = 9;
    cfg.opt.lr = 1e-2f;
    cfg.opt.warmup = 1;
    std::vector<double> whole, first, second;
    auto train = [&](TrainModel& m, QatModel& q, const TrainConfig& c, const GgufFile* resume, std::vector<double>& out) {
      Trainer t(m, vocab, c, &pool);
      t.set_qat(&q);
      if (resume) t.resume(*resume, 3);
      WindowSampler d(&data.tokens, c.n_ctx, true, c.seed, "data");
      t.run(d, nullptr, [&](const StepLog& l) { out.push_back(l.loss); }, nullptr);
    };
    TrainModel m1 = init_model(s, cfg.seed);
    QatModel q1(m1, all_matrices(m1, type), &pool, /*lsq=*/true);
    const std::vector<float> scales0 = q1.scales();
    cfg.out_path = dir.file("whole.gguf");
    train(m1, q1, cfg, nullptr, whole);
    EXPECT_NE(q1.scales(), scales0) << "the scales did not move";
    EXPECT_NE(q1.describe().find("+lsq"), std::string::npos);

    TrainModel m2 = init_model(s, cfg.seed);
    QatModel q2(m2, all_matrices(m2, type), &pool, true);
    TrainConfig c2 = cfg;
    c2.out_path = dir.file("part.gguf");
    c2.stop_after = 3;
    train(m2, q2, c2, nullptr, first);
    const GgufFile ck = GgufFile::open(c2.out_path);
    TrainModel m3 = load_model(ck);
    QatModel q3(m3, all_matrices(m3, type), &pool, true);
    c2.stop_after = 0;
    const GgufFile st = GgufFile::open(optimizer_state_path(c2.out_path));
    train(m3, q3, c2, &st, second);
    ASSERT_EQ(whole.size(), 6u);
    ASSERT_EQ(first.size() + second.size(), 6u);
    for (size_t i = 0; i < 6; ++i) EXPECT_EQ(i < 3 ? first[i] : second[i - 3], whole[i]) << dtype_name(type) << " step " << i + 1;
    EXPECT_EQ(q3.scales(), q1.scales());

    // Every learned row, packed, decodes to the forward's weights bit for bit.
    q1.update(m1);
    for (size_t i = 0; i < m1.params.size(); ++i) {
      if (q1.scale_offset(i) < 0) continue;
      const ParamInfo& p = m1.params[i];
      const QuantTraits& qt = require_quant_traits(type, p.name.c_str());
      std::vector<uint8_t> bytes(static_cast<size_t>(dtype_row_bytes(type, p.ne[0])));
      std::vector<float> back(static_cast<size_t>(p.ne[0]));
      for (int64_t r = 0; r < p.size / p.ne[0]; ++r) {
        q1.encode_lsq_row(i, r, bytes.data());
        qt.to_float(bytes.data(), back.data(), p.ne[0]);
        ASSERT_EQ(std::memcmp(back.data(), q1.quantized().data.data() + p.offset + r * p.ne[0], back.size() * 4), 0)
            << p.name << " row " << r;
      }
    }
  }
  // LSQ needs a type with one scale per block.
  TrainModel m = init_model(s, 1);
  EXPECT_THROW(QatModel(m, all_matrices(m, DType::Q4_K), &pool, true), Error);
}

}  // namespace
}  // namespace tern::train
