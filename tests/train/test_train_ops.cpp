// The training ops' backward passes against central finite differences of their forwards, in
// double (train/ops.h), and the float instantiation against the double one.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "train/ops.h"

namespace tern::train {
namespace {

std::vector<double> randn(size_t n, std::mt19937& rng, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// loss(x) = sum(f(x) * R): checks grad (the backward applied to R) against central differences
// of every element of x.
void expect_matches_finite_differences(std::vector<double>& x, const std::function<double()>& loss,
                                       const std::vector<double>& grad, const char* what) {
  ASSERT_EQ(x.size(), grad.size());
  const double h = 1e-6;
  double max_err = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double lp = loss();
    x[i] = keep - h;
    const double lm = loss();
    x[i] = keep;
    const double fd = (lp - lm) / (2 * h);
    const double err = std::abs(fd - grad[i]) / std::max(1.0, std::abs(fd));
    max_err = std::max(max_err, err);
    EXPECT_LT(err, 1e-6) << what << " element " << i << ": finite difference " << fd << ", backward " << grad[i];
  }
  ::testing::Test::RecordProperty(what, std::to_string(max_err));
}

struct Shape {
  int64_t n, width;
};

class TrainOps : public ::testing::TestWithParam<Shape> {};

TEST_P(TrainOps, RmsNormBackwardMatchesFiniteDifferences) {
  const auto [n, width] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(n * 131 + width));
  auto x = randn(size_t(n * width), rng), w = randn(size_t(width), rng), r = randn(size_t(n * width), rng);
  const double eps = 1e-5;
  std::vector<double> y(x.size()), rstd(static_cast<size_t>(n));
  auto loss = [&] {
    rmsnorm_forward<double>(nullptr, n, width, x.data(), w.data(), eps, y.data(), rstd.data());
    return dot(y, r);
  };
  loss();
  std::vector<double> dx(x.size(), 7.0), dw(static_cast<size_t>(width), 0.0);
  rmsnorm_backward<double>(nullptr, n, width, x.data(), w.data(), rstd.data(), r.data(), dx.data(), dw.data(), false);
  expect_matches_finite_differences(x, loss, dx, "rmsnorm dx");
  expect_matches_finite_differences(w, loss, dw, "rmsnorm dw");
  // accumulate adds to what dx held
  std::vector<double> dx2(x.size(), 1.0), dw2(static_cast<size_t>(width), 0.0);
  rmsnorm_backward<double>(nullptr, n, width, x.data(), w.data(), rstd.data(), r.data(), dx2.data(), dw2.data(), true);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(dx2[i], dx[i] + 1.0, 1e-12);
}

// A gated unit s = f(a) * b (SwiGLU, ReGLU): its backward against finite differences of
// loss = s . r. `side` is what the forward keeps for the backward (sigmoid(a), the on mask).
using GluForward = void (*)(ThreadPool*, int64_t, const double*, const double*, double*, double*);
using GluBackward = void (*)(ThreadPool*, int64_t, const double*, const double*, const double*, const double*, double*,
                             double*);
void expect_glu_backward_matches(int64_t n, int64_t width, uint32_t seed, GluForward fwd, GluBackward bwd,
                                 const std::string& name, std::vector<double>* a_out = nullptr,
                                 std::vector<double>* s_out = nullptr) {
  std::mt19937 rng(seed);
  const size_t c = size_t(n * width);
  auto a = randn(c, rng, 2.0), b = randn(c, rng), r = randn(c, rng);
  std::vector<double> s(c), side(c);
  auto loss = [&] {
    fwd(nullptr, int64_t(c), a.data(), b.data(), s.data(), side.data());
    return dot(s, r);
  };
  loss();
  std::vector<double> da(c), db(c);
  bwd(nullptr, int64_t(c), a.data(), b.data(), side.data(), r.data(), da.data(), db.data());
  expect_matches_finite_differences(a, loss, da, (name + " da").c_str());
  expect_matches_finite_differences(b, loss, db, (name + " db").c_str());
  if (a_out) *a_out = a;
  if (s_out) *s_out = s;
}

TEST_P(TrainOps, SwigluBackwardMatchesFiniteDifferences) {
  const auto [n, width] = GetParam();
  expect_glu_backward_matches(n, width, static_cast<uint32_t>(n * 7 + width), swiglu_forward<double>,
                              swiglu_backward<double>, "swiglu");
}

TEST_P(TrainOps, RegluBackwardMatchesFiniteDifferences) {
  const auto [n, width] = GetParam();
  std::vector<double> a, s;
  expect_glu_backward_matches(n, width, static_cast<uint32_t>(n * 11 + width), reglu_forward<double>,
                              reglu_backward<double>, "reglu", &a, &s);
  // The forward: max(a, 0) * b, exactly 0 where a <= 0 (and the test covers neurons that are off).
  size_t n_off = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] <= 0) {
      EXPECT_EQ(s[i], 0.0);
      ++n_off;
    }
  }
  if (a.size() >= 8) {
    EXPECT_GT(n_off, 0u);
  }
}

TEST_P(TrainOps, RopeBackwardIsTheInverseRotation) {
  const auto [n, param_width] = GetParam();
  const int64_t width = param_width + param_width % 2;  // RoPE turns pairs: an even head_dim
  const int64_t n_head = width % 4 == 0 ? 2 : 1, head_dim = width / n_head, n_ctx = 3;
  std::mt19937 rng(static_cast<uint32_t>(n + width * 3));
  auto x = randn(size_t(n * width), rng), r = randn(size_t(n * width), rng);
  std::vector<double> y(x.size());
  auto loss = [&] {
    y = x;
    rope_rotate<double>(nullptr, n, n_ctx, n_head, head_dim, 10000.0f, y.data(), false);
    return dot(y, r);
  };
  std::vector<double> dx = r;
  rope_rotate<double>(nullptr, n, n_ctx, n_head, head_dim, 10000.0f, dx.data(), true);
  expect_matches_finite_differences(x, loss, dx, "rope dx");
  // position 0 does not turn; rotation keeps each pair's length
  y = x;
  rope_rotate<double>(nullptr, n, n_ctx, n_head, head_dim, 10000.0f, y.data(), false);
  for (int64_t j = 0; j < width; ++j) EXPECT_DOUBLE_EQ(y[size_t(j)], x[size_t(j)]);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < width; j += 2) {
      const size_t k = size_t(i * width + j);
      EXPECT_NEAR(y[k] * y[k] + y[k + 1] * y[k + 1], x[k] * x[k] + x[k + 1] * x[k + 1], 1e-12);
    }
}

TEST_P(TrainOps, CrossEntropyGradientMatchesFiniteDifferences) {
  const auto [n, width] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(n * 17 + width));
  auto logits = randn(size_t(n * width), rng, 3.0);
  std::vector<int32_t> targets(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) targets[size_t(i)] = int32_t(rng() % uint32_t(width));
  if (n > 1) targets[1] = -1;  // ignored row
  auto loss = [&] { return cross_entropy_loss<double>(nullptr, n, width, logits.data(), targets.data()); };
  const double l0 = loss();
  std::vector<double> g = logits;
  const double fused = cross_entropy_fused<double>(nullptr, n, width, g.data(), targets.data(), 1.0);
  EXPECT_NEAR(fused, l0, 1e-12);
  expect_matches_finite_differences(logits, loss, g, "cross-entropy dlogits");
}

TEST_P(TrainOps, EmbeddingBackwardSumsRowsOfTheSameToken) {
  const auto [n, width] = GetParam();
  const int64_t n_vocab = 5;
  std::mt19937 rng(static_cast<uint32_t>(n + 99 * width));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = int32_t(rng() % n_vocab);
  auto table = randn(size_t(n_vocab * width), rng), r = randn(size_t(n * width), rng);
  std::vector<double> y(static_cast<size_t>(n * width));
  auto loss = [&] {
    embedding_forward<double>(nullptr, n, width, ids.data(), table.data(), y.data());
    return dot(y, r);
  };
  std::vector<double> dt(table.size(), 0.0);
  embedding_backward<double>(nullptr, n, width, n_vocab, ids.data(), r.data(), dt.data());
  expect_matches_finite_differences(table, loss, dt, "embedding dtable");
}

INSTANTIATE_TEST_SUITE_P(Shapes, TrainOps,
                         ::testing::Values(Shape{1, 2}, Shape{3, 6}, Shape{5, 8}, Shape{7, 13}, Shape{4, 12}));

// The float instantiation (what training runs) against the double one, and the same bits for
// any thread count.
TEST(TrainOpsFloat, AgreeWithDoubleAndAcrossThreadCounts) {
  const int64_t n = 37, width = 24;
  std::mt19937 rng(5);
  auto xd = randn(size_t(n * width), rng), wd = randn(size_t(width), rng), dyd = randn(size_t(n * width), rng);
  std::vector<float> x(xd.begin(), xd.end()), w(wd.begin(), wd.end()), dy(dyd.begin(), dyd.end());
  std::vector<double> yd(xd.size()), rd(static_cast<size_t>(n)), dxd(xd.size()), dwd(static_cast<size_t>(width), 0.0);
  rmsnorm_forward<double>(nullptr, n, width, xd.data(), wd.data(), 1e-5, yd.data(), rd.data());
  rmsnorm_backward<double>(nullptr, n, width, xd.data(), wd.data(), rd.data(), dyd.data(), dxd.data(), dwd.data(), false);
  std::vector<std::vector<float>> dw_by_threads;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::vector<float> y(x.size()), r(static_cast<size_t>(n)), dx(x.size()), dw(static_cast<size_t>(width), 0.0f);
    rmsnorm_forward<float>(&pool, n, width, x.data(), w.data(), 1e-5f, y.data(), r.data());
    rmsnorm_backward<float>(&pool, n, width, x.data(), w.data(), r.data(), dy.data(), dx.data(), dw.data(), false);
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_NEAR(y[i], yd[i], 1e-5 * (1 + std::abs(yd[i])));
      EXPECT_NEAR(dx[i], dxd[i], 1e-5 * (1 + std::abs(dxd[i])));
    }
    for (int64_t j = 0; j < width; ++j) EXPECT_NEAR(dw[size_t(j)], dwd[size_t(j)], 1e-4 * (1 + std::abs(dwd[size_t(j)])));
    dw_by_threads.push_back(dw);
  }
  EXPECT_EQ(dw_by_threads[0], dw_by_threads[1]);
  EXPECT_EQ(dw_by_threads[0], dw_by_threads[2]);
}

TEST(TrainOpsFloat, CrossEntropyStaysFiniteForExtremeLogits) {
  std::vector<float> logits = {1000.0f, -1000.0f, 0.0f, -1000.0f, 1000.0f, 0.0f};
  std::vector<int32_t> targets = {1, 1};
  const double loss = cross_entropy_fused<float>(nullptr, 2, 3, logits.data(), targets.data(), 0.5f);
  EXPECT_NEAR(loss, 2000.0, 1e-3);  // row 0 misses by 2000, row 1 hits (0)
  for (float g : logits) EXPECT_TRUE(std::isfinite(g));
  EXPECT_NEAR(logits[1], -0.5f, 1e-6);
  EXPECT_NEAR(logits[0], 0.5f, 1e-6);
}

}  // namespace
}  // namespace tern::train
