// Feature- and relation-based distillation (train/distill_hidden.h): each loss's gradient
// (the projection's too) against central finite differences in double, the gradient that
// ForwardBackward::set_hidden_loss injects into the backward against a directional finite
// difference of the whole model's loss, and the refusal of bad --loss / layer input.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "models/synth.h"
#include "test_util.h"
#include "train/distill_hidden.h"
#include "train/forward_backward.h"
#include "train/model.h"
#include "train/trainer.h"
#include "train_test_util.h"

namespace tern::train {
namespace {

namespace fs = std::filesystem;

using tern::testing::random_windows;
using tern::testing::test_model;
using tern::testing::tiny_shape;

std::vector<double> normal_vector(size_t n, uint32_t seed, double sd = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0.0, sd);
  std::vector<double> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Checks grad[i] (of grad_scale * f) against central differences of f in every element of x.
template <class F>
void expect_gradient(std::vector<double>& x, const std::vector<double>& grad, double grad_scale, F f, const char* what) {
  ASSERT_EQ(x.size(), grad.size());
  const double h = 1e-6;
  double max_g = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double lp = f();
    x[i] = keep - h;
    const double lm = f();
    x[i] = keep;
    const double fd = grad_scale * (lp - lm) / (2 * h);
    EXPECT_NEAR(grad[i], fd, 1e-7 + 1e-6 * std::abs(fd)) << what << " element " << i;
    max_g = std::max(max_g, std::abs(grad[i]));
  }
  EXPECT_GT(max_g, 1e-3) << what << ": the gradient vanishes; the test would not see a wrong one";
}

TEST(FeatureLoss, GradientsOfStatesAndProjectionMatchFiniteDifferences) {
  const int64_t n = 5, e_s = 3, e_t = 7;
  auto hs = normal_vector(size_t(n * e_s), 1), ht = normal_vector(size_t(n * e_t), 2);
  auto w = normal_vector(size_t(e_t * e_s), 3, 0.5), b = normal_vector(size_t(e_t), 4, 0.3);
  const double scale = 0.7;
  std::vector<double> d_hs(hs.size(), 0.0), d_w(w.size(), 0.0), d_b(b.size(), 0.0);
  const double loss = feature_mse<double>(nullptr, n, e_s, e_t, hs.data(), ht.data(), w.data(), b.data(), d_hs.data(),
                                          d_w.data(), d_b.data(), scale);
  auto f = [&] {
    return feature_mse<double>(nullptr, n, e_s, e_t, hs.data(), ht.data(), w.data(), b.data(), nullptr, nullptr,
                               nullptr, 1.0);
  };
  EXPECT_NEAR(loss, f(), 1e-12);
  // The definition: sum over rows of (1/e_t) |W h + b - h_t|^2.
  double want = 0.0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < e_t; ++o) {
      double y = b[size_t(o)] - ht[size_t(i * e_t + o)];
      for (int64_t k = 0; k < e_s; ++k) y += w[size_t(o * e_s + k)] * hs[size_t(i * e_s + k)];
      want += y * y / double(e_t);
    }
  EXPECT_NEAR(loss, want, 1e-12);
  expect_gradient(hs, d_hs, scale, f, "d hs");
  expect_gradient(w, d_w, scale, f, "d W");
  expect_gradient(b, d_b, scale, f, "d b");
}

TEST(FeatureLoss, EqualWidthsNeedNoProjectionAndUnequalOnesDo) {
  const int64_t n = 4, e = 6;
  auto hs = normal_vector(size_t(n * e), 5), ht = normal_vector(size_t(n * e), 6);
  std::vector<double> d_hs(hs.size(), 0.0);
  feature_mse<double>(nullptr, n, e, e, hs.data(), ht.data(), nullptr, nullptr, d_hs.data(), nullptr, nullptr, 1.0);
  expect_gradient(hs, d_hs, 1.0, [&] {
    return feature_mse<double>(nullptr, n, e, e, hs.data(), ht.data(), nullptr, nullptr, nullptr, nullptr, nullptr, 1.0);
  }, "d hs (no projection)");
  EXPECT_THROW(feature_mse<double>(nullptr, n, e, e + 1, hs.data(), ht.data(), nullptr, nullptr, nullptr, nullptr, nullptr, 1.0),
               Error);
}

TEST(RelationLoss, GradientMatchesFiniteDifferencesAndIsWidthIndependent) {
  const int64_t n_seq = 2, n_ctx = 5, e_s = 4, e_t = 9;
  auto hs = normal_vector(size_t(n_seq * n_ctx * e_s), 7), ht = normal_vector(size_t(n_seq * n_ctx * e_t), 8);
  const double scale = 1.3;
  std::vector<double> d_hs(hs.size(), 0.0);
  const double loss = relation_cos_mse<double>(nullptr, n_seq, n_ctx, e_s, e_t, hs.data(), ht.data(), d_hs.data(), scale);
  auto f = [&] { return relation_cos_mse<double>(nullptr, n_seq, n_ctx, e_s, e_t, hs.data(), ht.data(), nullptr, 1.0); };
  EXPECT_NEAR(loss, f(), 1e-12);
  expect_gradient(hs, d_hs, scale, f, "d hs");
  // Scaling a state (any norm) changes no cosine, and a model compared with itself has no loss.
  std::vector<double> scaled = hs;
  for (int64_t k = 0; k < e_s; ++k) scaled[size_t(3 * e_s + k)] *= 40.0;
  EXPECT_NEAR(relation_cos_mse<double>(nullptr, n_seq, n_ctx, e_s, e_t, scaled.data(), ht.data(), nullptr, 1.0), loss, 1e-6);
  EXPECT_NEAR(relation_cos_mse<double>(nullptr, n_seq, n_ctx, e_s, e_s, hs.data(), hs.data(), nullptr, 1.0), 0.0, 1e-12);
}

// Per head (equal head counts; the key heads and head_dim may differ) and head-averaged.
TEST(AttentionLoss, GradientsOfQueriesAndKeysMatchFiniteDifferences) {
  const int64_t n_seq = 2, n_ctx = 4, n = n_seq * n_ctx;
  for (const bool same_heads : {true, false}) {
    const HeadShape hs{4, 2, 3};
    const HeadShape ht = same_heads ? HeadShape{4, 1, 5} : HeadShape{2, 2, 4};
    auto qs = normal_vector(size_t(n * hs.n_head * hs.head_dim), 31), ks = normal_vector(size_t(n * hs.n_head_kv * hs.head_dim), 32);
    const auto qt = normal_vector(size_t(n * ht.n_head * ht.head_dim), 33);
    const auto kt = normal_vector(size_t(n * ht.n_head_kv * ht.head_dim), 34);
    std::vector<double> dq(qs.size(), 0.0), dk(ks.size(), 0.0);
    const double scale = 0.8;
    const double loss = attention_kl<double>(nullptr, n_seq, n_ctx, hs, qs.data(), ks.data(), ht, qt.data(), kt.data(),
                                             dq.data(), dk.data(), scale);
    auto f = [&] {
      return attention_kl<double>(nullptr, n_seq, n_ctx, hs, qs.data(), ks.data(), ht, qt.data(), kt.data(), nullptr,
                                  nullptr, 1.0);
    };
    EXPECT_NEAR(loss, f(), 1e-12);
    EXPECT_GT(loss, 0.0);
    expect_gradient(qs, dq, scale, f, same_heads ? "dq (per head)" : "dq (head-averaged)");
    expect_gradient(ks, dk, scale, f, same_heads ? "dk (per head)" : "dk (head-averaged)");
    // A model's attention against itself: no loss.
    EXPECT_NEAR(attention_kl<double>(nullptr, n_seq, n_ctx, hs, qs.data(), ks.data(), hs, qs.data(), ks.data(), nullptr,
                                     nullptr, 1.0), 0.0, 1e-12);
  }
}

TEST(HiddenLosses, FloatAgreesWithDoubleAndThreadCountsGiveTheSameBits) {
  const int64_t n_seq = 3, n_ctx = 37, e_s = 20, e_t = 33, n = n_seq * n_ctx;
  const auto hs = normal_vector(size_t(n * e_s), 9), ht = normal_vector(size_t(n * e_t), 10);
  const auto w = normal_vector(size_t(e_t * e_s), 11, 0.3), b = normal_vector(size_t(e_t), 12, 0.1);
  auto to_f = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  const auto hsf = to_f(hs), htf = to_f(ht), wf = to_f(w), bf = to_f(b);
  std::vector<double> dd(hs.size(), 0.0), dwd(w.size(), 0.0);
  const double ld = feature_mse<double>(nullptr, n, e_s, e_t, hs.data(), ht.data(), w.data(), b.data(), dd.data(),
                                        dwd.data(), nullptr, 1.0) +
                    relation_cos_mse<double>(nullptr, n_seq, n_ctx, e_s, e_t, hs.data(), ht.data(), dd.data(), 1.0);
  std::vector<std::vector<float>> grads;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::vector<float> d(hs.size(), 0.0f), dw(w.size(), 0.0f);
    const double lf = feature_mse<float>(&pool, n, e_s, e_t, hsf.data(), htf.data(), wf.data(), bf.data(), d.data(),
                                         dw.data(), nullptr, 1.0f) +
                      relation_cos_mse<float>(&pool, n_seq, n_ctx, e_s, e_t, hsf.data(), htf.data(), d.data(), 1.0f);
    EXPECT_NEAR(lf, ld, 1e-4 * ld);
    for (size_t i = 0; i < d.size(); ++i) ASSERT_NEAR(d[i], dd[i], 1e-4 + 1e-4 * std::abs(dd[i])) << i;
    for (size_t i = 0; i < dw.size(); ++i) ASSERT_NEAR(dw[i], dwd[i], 1e-3 + 1e-4 * std::abs(dwd[i])) << i;
    d.insert(d.end(), dw.begin(), dw.end());
    grads.push_back(std::move(d));
  }
  EXPECT_TRUE(grads[0] == grads[1]);
  EXPECT_TRUE(grads[0] == grads[2]);
}

// The whole model's loss (mean cross-entropy + the hidden losses / scored targets) along a
// random direction inside each tensor, against the gradient forward_backward writes with the
// injected hidden-state gradients: (L(w + h d) - L(w - h d)) / 2h = g . d.
void expect_model_gradient(TrainModel& m, ForwardBackward& fb, const std::vector<int32_t>& windows,
                           const std::function<double()>& hidden_loss_of_last_forward, const char* what) {
  fb.prepare(m);
  std::vector<float> g(size_t(m.n_params()), 0.0f);
  const double loss = fb.forward_backward(m, windows.data(), g.data(), 1.0f);
  auto full_loss = [&] {
    fb.prepare(m);
    const double ce = fb.forward_loss(m, windows.data());
    return ce + hidden_loss_of_last_forward() / double(fb.n_scored());
  };
  EXPECT_NEAR(full_loss(), loss, 1e-5 * std::abs(loss)) << what;
  std::mt19937 rng(11);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (const auto& p : m.params) {
    const std::vector<double> dir = testing::unit_direction(rng, nd, p.size);
    const double gd = testing::along(dir, g.data() + p.offset);
    const std::vector<float> keep(m.data.begin() + p.offset, m.data.begin() + p.offset + p.size);
    auto loss_at = [&](double h) {
      for (int64_t i = 0; i < p.size; ++i) m.data[size_t(p.offset + i)] = float(keep[size_t(i)] + h * dir[size_t(i)]);
      return full_loss();
    };
    const double h = 1e-2;
    const double fd = (loss_at(h) - loss_at(-h)) / (2 * h);
    std::copy(keep.begin(), keep.end(), m.data.begin() + p.offset);
    EXPECT_NEAR(gd, fd, 2e-3 + 1e-2 * std::abs(fd)) << what << ": " << p.name;
  }
  fb.prepare(m);
}

TEST(HiddenLossHook, InjectedGradientMatchesADirectionalFiniteDifferenceOfTheModelLoss) {
  ModelShape s = tiny_shape();
  s.n_layer = 3;
  TrainModel m = test_model(s, 7);
  // The residual stream of test_model is large: scale the targets to it so neither loss is negligible.
  const int64_t n_seq = 2, n_ctx = 5, N = n_seq * n_ctx, E = s.n_embd, e_t = 5;
  const auto windows = random_windows(n_seq, n_ctx, s.n_vocab, 3);
  ForwardBackward fb(s, n_seq, n_ctx, nullptr);
  const auto t0d = normal_vector(size_t(N * E), 21, 3.0), t2d = normal_vector(size_t(N * e_t), 22, 3.0);
  const auto wd = normal_vector(size_t(e_t * E), 23, 0.3);
  const std::vector<float> target0(t0d.begin(), t0d.end()), target2(t2d.begin(), t2d.end()), w(wd.begin(), wd.end());
  // Layer 0: feature (no projection); layer 2 (the last, the output norm's input): feature through
  // a projection and relation; layer 2 named twice, so both requests' gradients add there.
  const std::vector<int64_t> layers = {0, 2, 2};
  auto hidden = [&](const std::vector<const float*>& st, const std::vector<float*>& gr, float scale) {
    double l = feature_mse<float>(nullptr, N, E, E, st[0], target0.data(), nullptr, nullptr, gr.empty() ? nullptr : gr[0],
                                  nullptr, nullptr, 0.5f * scale) * 0.5;
    l += feature_mse<float>(nullptr, N, E, e_t, st[1], target2.data(), w.data(), nullptr, gr.empty() ? nullptr : gr[1],
                            nullptr, nullptr, scale);
    l += 2.0 * relation_cos_mse<float>(nullptr, n_seq, n_ctx, E, e_t, st[2], target2.data(),
                                       gr.empty() ? nullptr : gr[2], 2.0f * scale);
    return l;
  };
  fb.set_hidden_loss(layers, [&](const std::vector<const float*>& st, const std::vector<float*>& gr, int64_t n_tok,
                                 int64_t n_embd, float scale) {
    EXPECT_EQ(n_tok, N);
    EXPECT_EQ(n_embd, E);
    return hidden(st, gr, scale);
  });
  expect_model_gradient(m, fb, windows, [&] {
    std::vector<const float*> st;
    for (int64_t il : layers) st.push_back(fb.layer_output(il));
    return hidden(st, {}, 1.0f);
  }, "hook");
  // Off again: forward_backward is plain cross-entropy.
  fb.set_hidden_loss({}, nullptr);
  fb.prepare(m);
  std::vector<float> g(size_t(m.n_params()), 0.0f);
  EXPECT_NEAR(fb.forward_backward(m, windows.data(), g.data(), 1.0f), fb.forward_loss(m, windows.data()), 1e-6);
}

// HiddenDistill end to end: a teacher of another width and depth (a projection), the student's
// gradient (through the hook) against the directional finite difference of its whole loss.
TEST(HiddenDistill, StudentGradientMatchesADirectionalFiniteDifference) {
  ModelShape ss = tiny_shape();
  ModelShape ts = tiny_shape();
  ts.n_embd = 16;
  ts.n_head = 4;
  ts.n_head_kv = 2;
  ts.n_layer = 3;
  TrainModel student = test_model(ss, 7);
  TrainModel teacher = test_model(ts, 8);
  const int64_t n_seq = 2, n_ctx = 6;
  const auto windows = random_windows(n_seq, n_ctx, ss.n_vocab, 4);
  HiddenDistillConfig c;
  c.feature_weight = 0.7;
  c.relation_weight = 1.5;
  c.feature_pairs = default_feature_pairs(ss.n_layer, ts.n_layer);
  c.relation_pairs = {{1, 2}, {0, 1}};
  c.attention_weight = 0.9;
  c.attention_pairs = {{1, 2}, {1, 0}};  // 3 student heads, 4 teacher heads: head-averaged
  c.grad_accum = 1 << 20;  // no projection update inside the test
  HiddenDistill hd(c, teacher, ss, n_seq, n_ctx, nullptr);
  ASSERT_EQ(hd.projection_params().size(), 2 * c.feature_pairs.size());
  EXPECT_EQ(hd.projection_params()[0].name, "distill.proj.0_1.weight");
  hd.teacher_forward(windows.data());
  ForwardBackward fb(ss, n_seq, n_ctx, nullptr);
  hd.attach(fb);
  std::vector<float> scratch(size_t(n_seq * n_ctx * ss.n_embd)), sq(size_t(n_seq * n_ctx * ss.q_width(1))),
      sk(size_t(n_seq * n_ctx * ss.kv_width(1)));
  expect_model_gradient(student, fb, windows, [&] {
    // The losses' values without their gradients (scratch receives them; grad_scale 0).
    std::vector<const float*> st = {fb.layer_output(0), fb.layer_output(1)};
    return hd.loss(st, {scratch.data(), scratch.data()}, n_seq * n_ctx, ss.n_embd, 0.0f) +
           hd.attention_loss({fb.layer_q(1)}, {fb.layer_k(1)}, {sq.data()}, {sk.data()}, 0.0f);
  }, "HiddenDistill");
  EXPECT_GT(hd.last_feature(), 0.0);
  EXPECT_GT(hd.last_relation(), 0.0);
  EXPECT_GT(hd.last_attention(), 0.0);
}

// The feature projections (student width 12, teacher 16) are checkpointed with OUT.optim: 3 + 3
// steps resume to the losses, student and projections of 6, bit for bit; a run whose projections
// differ is refused naming the tensor and both shapes.
TEST(HiddenDistill, ProjectionsResumeBitForBit) {
  testing::TrainTempDir dir;
  const GgufFile vocab = GgufFile::open(testing::write_train_vocab(dir));
  const std::vector<int32_t> tokens = random_windows(1, 400, 300, 17);
  ModelShape ss = tiny_shape(300), ts = tiny_shape(300);
  ts.n_embd = 16;
  ts.n_head = 4;
  ts.n_head_kv = 2;
  ts.n_layer = 3;
  const TrainModel teacher = init_model(ts, 8);
  ThreadPool pool(2);
  TrainConfig cfg;
  cfg.n_seq = 2;
  cfg.n_ctx = 8;
  cfg.grad_accum = 2;
  cfg.steps = 6;
  cfg.seed = 5;
  cfg.opt.lr = 1e-2f;
  cfg.opt.warmup = 1;
  struct Result {
    std::vector<double> losses;
    std::vector<float> student, proj;
  };
  auto config = [&](int64_t first_step, std::vector<LayerPair> pairs) {
    HiddenDistillConfig c;
    c.feature_weight = 0.5;
    c.feature_pairs = std::move(pairs);
    c.opt = cfg.opt;
    c.opt.total_steps = cfg.steps;
    c.grad_accum = cfg.grad_accum;
    c.first_step = first_step;
    c.seed = cfg.seed;
    return c;
  };
  auto run = [&](const TrainConfig& c, bool resume, Result& out) {
    TrainModel student = resume ? load_model(GgufFile::open(c.out_path)) : init_model(ss, c.seed);
    Trainer t(student, vocab, c, &pool);
    if (resume) t.resume(GgufFile::open(optimizer_state_path(c.out_path)), 3);
    HiddenDistill hd(config(t.step(), {{0, 1}, {1, 2}}), teacher, ss, c.n_seq, c.n_ctx, &pool);
    ASSERT_EQ(hd.projection_params().size(), 4u);
    hd.attach(t.forward_backward());
    t.set_before_batch([&](const int32_t* w, int64_t, int64_t) { hd.teacher_forward(w); });
    t.set_checkpoint_extra([&](GgufWriter& w) { hd.save_state(w); });
    if (resume) hd.restore_state(GgufFile::open(optimizer_state_path(c.out_path)));
    WindowSampler d(&tokens, c.n_ctx, true, c.seed, "data");
    t.run(d, nullptr, [&](const StepLog& l) { out.losses.push_back(l.loss); }, nullptr);
    out.student = student.data;
    out.proj = hd.projection_data();
  };
  Result whole, first, second;
  cfg.out_path = dir.file("whole.gguf");
  run(cfg, false, whole);
  TrainConfig c2 = cfg;
  c2.out_path = dir.file("part.gguf");
  c2.stop_after = 3;
  run(c2, false, first);
  EXPECT_NE(first.proj, whole.proj);  // the projections moved on after step 3
  c2.stop_after = 0;
  run(c2, true, second);
  ASSERT_EQ(whole.losses.size(), 6u);
  ASSERT_EQ(first.losses.size() + second.losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i)
    EXPECT_EQ(i < 3 ? first.losses[i] : second.losses[i - 3], whole.losses[i]) << "step " << i + 1;
  EXPECT_TRUE(second.student == whole.student);
  EXPECT_TRUE(second.proj == whole.proj);

  // Other pairs: the checkpoint's projection 1_2 is not this run's, and 1_1 is missing.
  const GgufFile st = GgufFile::open(optimizer_state_path(cfg.out_path));
  auto message = [&](std::vector<LayerPair> pairs, const ModelShape& tshape) {
    HiddenDistill hd(config(6, std::move(pairs)), init_model(tshape, 8), ss, cfg.n_seq, cfg.n_ctx, &pool);
    try {
      hd.restore_state(st);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{0, 1}, {1, 1}}, ts).find("distill.proj.1_2.weight [12, 16] which this run does not have"),
            std::string::npos) << message({{0, 1}, {1, 1}}, ts);
  EXPECT_NE(message({{0, 1}}, ts).find("distill.proj.1_2"), std::string::npos);
  // A wider teacher: the same names, other shapes.
  ModelShape wide = ts;
  wide.n_embd = 20;
  wide.n_head = 5;
  wide.n_head_kv = 1;
  EXPECT_NE(message({{0, 1}, {1, 2}}, wide).find("distill.proj.0_1.weight is [12, 16] f32, this run's is [12, 20]"),
            std::string::npos) << message({{0, 1}, {1, 2}}, wide);
  // A checkpoint without projections (an older tern's): refused, naming the first one.
  testing::TrainTempDir d2;
  GgufWriter w(3);
  w.set("general.architecture", GgufValue::string("tern-optimizer-state"));
  w.write(d2.file("old.optim"));
  HiddenDistill hd(config(6, {{0, 1}, {1, 2}}), teacher, ss, cfg.n_seq, cfg.n_ctx, &pool);
  try {
    hd.restore_state(GgufFile::open(d2.file("old.optim")));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no distill.proj.0_1.weight [12, 16]"), std::string::npos) << e.what();
  }
}

TEST(HiddenDistill, DefaultPairsAreEvenlySpacedAndEndAtTheLastLayers) {
  auto d = default_feature_pairs(4, 6);
  EXPECT_EQ(describe_pairs(d), "0:1,1:2,2:4,3:5");
  EXPECT_EQ(describe_pairs(default_feature_pairs(6, 3)), "1:0,3:1,5:2");
  EXPECT_EQ(describe_pairs(default_feature_pairs(2, 2)), "0:0,1:1");
}

TEST(HiddenDistillInput, BadLossTermsAndLayersAreRefusedClearly) {
  auto message = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const auto w = parse_distill_loss("response=1,feature=0.5,relation=0.25");
  EXPECT_EQ(w.response, 1.0);
  EXPECT_EQ(w.feature, 0.5);
  EXPECT_EQ(w.relation, 0.25);
  EXPECT_EQ(parse_distill_loss("feature=1").response, 0.0);
  EXPECT_EQ(parse_distill_loss("attention=2").attention, 2.0);
  EXPECT_NE(message([] { parse_distill_loss("response=1,atention=1"); }).find("unknown term 'atention'"), std::string::npos);
  EXPECT_NE(message([] { parse_distill_loss("feature"); }).find("give the term's weight"), std::string::npos);
  EXPECT_NE(message([] { parse_distill_loss("feature=-1"); }).find(">= 0"), std::string::npos);
  EXPECT_NE(message([] { parse_distill_loss("feature=x"); }).find("finite number"), std::string::npos);
  EXPECT_NE(message([] { parse_distill_loss("feature=1,feature=2"); }).find("twice"), std::string::npos);
  EXPECT_NE(message([] { parse_distill_loss("response=0"); }).find("every weight is 0"), std::string::npos);
  EXPECT_NE(message([] { parse_distill_loss("response=1,,feature=1"); }).find("empty term"), std::string::npos);

  const auto p = parse_layer_pairs("0:1,-1:-1", 4, 6, "--feature-layers");
  EXPECT_EQ(describe_pairs(p), "0:1,3:5");
  EXPECT_NE(message([] { parse_layer_pairs("4:1", 4, 6, "--feature-layers"); })
                .find("--feature-layers 4:1: student layer 4 is out of range (the student has 4 layers: 0..3"),
            std::string::npos);
  EXPECT_NE(message([] { parse_layer_pairs("1:6", 4, 6, "--relation-layers"); }).find("teacher layer 6 is out of range"),
            std::string::npos);
  EXPECT_NE(message([] { parse_layer_pairs("1-2", 4, 6, "--feature-layers"); }).find("STUDENT:TEACHER"), std::string::npos);
  EXPECT_NE(message([] { parse_layer_pairs("a:2", 4, 6, "--feature-layers"); }).find("not a layer number"),
            std::string::npos);

  ForwardBackward fb(tiny_shape(), 1, 4, nullptr);
  EXPECT_NE(message([&] { fb.set_hidden_loss({2}, [](auto&, auto&, int64_t, int64_t, float) { return 0.0; }); })
                .find("layer 2 is out of range (the model has 2 layers: 0..1)"),
            std::string::npos);
  HiddenDistillConfig c;
  c.feature_weight = 1.0;
  c.feature_pairs = {{0, 5}};
  EXPECT_NE(message([&] { HiddenDistill hd(c, test_model(tiny_shape(), 1), tiny_shape(), 1, 4, nullptr); })
                .find("teacher layer 5 is out of range"),
            std::string::npos);
}

TEST(DistillHiddenCli, TrainsWithEveryTermAndRefusesBadInput) {
  testing::TrainTempDir dir;
  {
    std::ofstream f(dir.file("d.txt"));
    for (int i = 0; i < 20; ++i) f << "the cat sat on the mat and the dog ran home to the big red house.\n\n";
  }
  SynthOptions o;
  o.shape = "stories260k";
  synth_model(o, dir.file("teacher.gguf"));
  std::string out, err;
  const std::string base = std::string(TERN_BINARY) + " distill --teacher " + dir.file("teacher.gguf") +
                           " --vocab-from " + dir.file("teacher.gguf") +
                           " --n-embd 16 --n-layer 2 --n-head 2 --n-ff 32 --ctx 8 --batch 2 -t 1 -q --steps 2 --data " +
                           dir.file("d.txt") + " -o " + dir.file("s.gguf");
  ASSERT_EQ(testing::run_command(base + " --loss response=1,feature=0.5,relation=0.5,attention=0.5 --feature-layers "
                                        "0:2,1:-1 --attention-layers 0:0,1:4",
                                 &out, &err), 0) << err;
  EXPECT_NE(err.find("attention=0.5 (layers 0:0,1:4)"), std::string::npos) << err;
  EXPECT_NE(err.find("feature=0.5 (layers 0:2,1:4, projection 16 -> 64)"), std::string::npos) << err;
  EXPECT_NE(err.find("relation=0.5 (layers 1:4)"), std::string::npos) << err;
  EXPECT_TRUE(fs::exists(dir.file("s.gguf")));
  // The student file is the student alone: no projection tensor in it.
  EXPECT_EQ(GgufFile::open(dir.file("s.gguf")).find_tensor("distill.proj.0_2.weight"), nullptr);
  fs::remove(dir.file("s.gguf"));

  EXPECT_EQ(testing::run_command(base + " --loss response=1,feature=0.5 --feature-layers 2:0", &out, &err), 1);
  EXPECT_NE(err.find("--feature-layers 2:0: student layer 2 is out of range (the student has 2 layers: 0..1"),
            std::string::npos) << err;
  EXPECT_EQ(testing::run_command(base + " --loss response=1,fetaure=0.5", &out, &err), 1);
  EXPECT_NE(err.find("unknown term 'fetaure'"), std::string::npos) << err;
  EXPECT_EQ(testing::run_command(base + " --feature-layers 0:0", &out, &err), 1);
  EXPECT_NE(err.find("--feature-layers needs the feature term"), std::string::npos) << err;
  EXPECT_EQ(testing::run_command(base + " --loss attention=1 --attention-layers 0:5", &out, &err), 1);
  EXPECT_NE(err.find("teacher layer 5 is out of range (the teacher has 5 layers: 0..4"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir.file("s.gguf")));
}

}  // namespace
}  // namespace tern::train
