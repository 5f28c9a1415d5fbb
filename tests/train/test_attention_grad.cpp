// Training attention (train/attention.h): the scalar references' gradients against central
// finite differences of a double-precision forward written here; every tiled variant this CPU
// runs (forced through train/attention_kernels.h) against the references, over shapes that cut
// key blocks anywhere (n_ctx around 16 / 32 / 64, the block widths of SSE2 / AVX2 / AVX-512),
// odd head_dim and GQA groups; lse against a double log-sum-exp; and bit-identical results for
// 1, 2 and 3 threads. Outputs start as NaN so that an element a kernel forgets stays visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "train/attention.h"
#include "train/attention_kernels.h"

namespace tern::train {
namespace {

struct Dims {
  int64_t n_seq, n_ctx, n_head, n_head_kv, head_dim;
};

std::string dims_name(const Dims& d) {
  return "n_seq " + std::to_string(d.n_seq) + " n_ctx " + std::to_string(d.n_ctx) + " heads " +
         std::to_string(d.n_head) + "/" + std::to_string(d.n_head_kv) + " head_dim " + std::to_string(d.head_dim);
}

AttentionShape shape_of(const Dims& d, float scale = 0.0f) {
  AttentionShape s;
  s.n_seq = d.n_seq;
  s.n_ctx = d.n_ctx;
  s.n_head = d.n_head;
  s.n_head_kv = d.n_head_kv;
  s.head_dim = d.head_dim;
  s.scale = scale != 0.0f ? scale : 1.0f / std::sqrt(float(d.head_dim));
  return s;
}

size_t q_elems(const AttentionShape& s) { return size_t(s.n_seq * s.n_ctx * s.n_head * s.head_dim); }
size_t kv_elems(const AttentionShape& s) { return size_t(s.n_seq * s.n_ctx * s.n_head_kv * s.head_dim); }
size_t lse_elems(const AttentionShape& s) { return size_t(s.n_seq * s.n_ctx * s.n_head); }

std::vector<float> random_vector(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& e : x) e = dist(rng);
  return x;
}

std::vector<float> nan_vector(size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }

struct Problem {
  AttentionShape s;
  std::vector<float> q, k, v, d_o;
  Problem(const Dims& d, uint32_t seed, float scale = 0.0f) : s(shape_of(d, scale)) {
    std::mt19937 rng(seed);
    q = random_vector(q_elems(s), rng);
    k = random_vector(kv_elems(s), rng);
    v = random_vector(kv_elems(s), rng);
    d_o = random_vector(q_elems(s), rng);
  }
};

// The oracle of the oracle: causal GQA attention written directly in double, o and lse.
void forward_double(const AttentionShape& s, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, std::vector<double>& o, std::vector<double>& lse) {
  const int64_t T = s.n_ctx, hd = s.head_dim, group = s.n_head / s.n_head_kv;
  o.assign(q_elems(s), 0.0);
  lse.assign(lse_elems(s), 0.0);
  std::vector<double> w(static_cast<size_t>(T));
  for (int64_t b = 0; b < s.n_seq; ++b)
    for (int64_t h = 0; h < s.n_head; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const size_t qi = size_t(((b * T + t) * s.n_head + h) * hd);
        double mx = -INFINITY;
        for (int64_t j = 0; j <= t; ++j) {
          const size_t ki = size_t(((b * T + j) * s.n_head_kv + h / group) * hd);
          double dot = 0.0;
          for (int64_t d = 0; d < hd; ++d) dot += q[qi + size_t(d)] * k[ki + size_t(d)];
          w[size_t(j)] = double(s.scale) * dot;
          mx = std::max(mx, w[size_t(j)]);
        }
        double z = 0.0;
        for (int64_t j = 0; j <= t; ++j) z += std::exp(w[size_t(j)] - mx);
        for (int64_t j = 0; j <= t; ++j) {
          const double p = std::exp(w[size_t(j)] - mx) / z;
          const size_t vi = size_t(((b * T + j) * s.n_head_kv + h / group) * hd);
          for (int64_t d = 0; d < hd; ++d) o[qi + size_t(d)] += p * v[vi + size_t(d)];
        }
        lse[size_t((b * T + t) * s.n_head + h)] = mx + std::log(z);
      }
}

std::vector<double> to_double(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

// max |a - b| over max(|b|) (floored at `floor`): one figure per tensor, robust to the tiny
// elements where an element-wise relative error means nothing.
double scaled_max_error(const std::vector<float>& a, const std::vector<float>& b, double floor = 1e-3) {
  EXPECT_EQ(a.size(), b.size());
  double err = 0.0, mag = floor;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    err = std::isnan(d) ? INFINITY : std::max(err, d);
    mag = std::max(mag, std::fabs(double(b[i])));
  }
  return err / mag;
}

std::vector<Isa> isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::Ref, Isa::Avx2, Isa::Avx512})
    if (isa_supported(isa)) out.push_back(isa);
  return out;
}

// --- (1) the references against finite differences -----------------------------------

TEST(TrainAttentionRef, GradientsEqualFiniteDifferences) {
  const Dims cases[] = {{1, 1, 1, 1, 5},  {2, 7, 4, 2, 5},  {1, 17, 6, 3, 8}, {3, 9, 8, 8, 12},
                        {2, 13, 4, 2, 8}, {1, 5, 2, 1, 3},  {3, 4, 6, 3, 12}, {1, 16, 8, 8, 5}};
  uint32_t seed = 100;
  for (const Dims& dims : cases) {
    SCOPED_TRACE(dims_name(dims));
    Problem pb(dims, seed++);
    const AttentionShape& s = pb.s;
    // loss = sum(o * R), so dL/do = R: the problem's d_o plays R.
    std::vector<float> o = nan_vector(q_elems(s)), lse = nan_vector(lse_elems(s));
    attention_forward_ref(s, pb.q.data(), pb.k.data(), pb.v.data(), o.data(), lse.data());
    std::vector<float> dq = nan_vector(q_elems(s)), dk = nan_vector(kv_elems(s)), dv = nan_vector(kv_elems(s));
    attention_backward_ref(s, pb.q.data(), pb.k.data(), pb.v.data(), o.data(), lse.data(), pb.d_o.data(), dq.data(),
                           dk.data(), dv.data());

    std::vector<double> q = to_double(pb.q), k = to_double(pb.k), v = to_double(pb.v), r = to_double(pb.d_o);
    std::vector<double> od, lsed;
    auto loss = [&] {
      forward_double(s, q, k, v, od, lsed);
      double sum = 0.0;
      for (size_t i = 0; i < od.size(); ++i) sum += od[i] * r[i];
      return sum;
    };
    std::mt19937 pick(seed);
    struct Wrt {
      const char* name;
      std::vector<double>* x;
      const std::vector<float>* grad;
    };
    for (const Wrt& w : {Wrt{"q", &q, &dq}, Wrt{"k", &k, &dk}, Wrt{"v", &v, &dv}}) {
      const size_t n = w.x->size();
      // All elements of small tensors, 40 random ones of larger.
      const size_t n_checks = std::min<size_t>(n, 40);
      for (size_t c = 0; c < n_checks; ++c) {
        const size_t i = n <= 40 ? c : size_t(pick() % n);
        const double h = 1e-3, x0 = (*w.x)[i];
        (*w.x)[i] = x0 + h;
        const double up = loss();
        (*w.x)[i] = x0 - h;
        const double down = loss();
        (*w.x)[i] = x0;
        const double fd = (up - down) / (2 * h);
        const double got = (*w.grad)[i];
        EXPECT_NEAR(got, fd, 2e-5 + 2e-4 * std::fabs(fd)) << "d" << w.name << "[" << i << "]";
      }
    }
  }
}

// A kv head's gradient must collect every query head of its group: with GQA the reference's
// dk/dv equal the sums of the same problem with the kv heads repeated per query head.
TEST(TrainAttentionRef, GroupedHeadsSumIntoTheirKvHead) {
  const Dims gqa{2, 11, 6, 2, 5}, mha{2, 11, 6, 6, 5};
  Problem pb(gqa, 7);
  const AttentionShape s = pb.s, sm = shape_of(mha);
  const int64_t T = s.n_ctx, hd = s.head_dim, group = s.n_head / s.n_head_kv;
  std::vector<float> k_rep(kv_elems(sm)), v_rep(kv_elems(sm));
  for (int64_t row = 0; row < s.n_seq * T; ++row)
    for (int64_t h = 0; h < s.n_head; ++h)
      for (int64_t d = 0; d < hd; ++d) {
        k_rep[size_t((row * s.n_head + h) * hd + d)] = pb.k[size_t((row * s.n_head_kv + h / group) * hd + d)];
        v_rep[size_t((row * s.n_head + h) * hd + d)] = pb.v[size_t((row * s.n_head_kv + h / group) * hd + d)];
      }
  std::vector<float> o(q_elems(s)), lse(lse_elems(s)), dq(q_elems(s)), dk(kv_elems(s)), dv(kv_elems(s));
  attention_forward_ref(s, pb.q.data(), pb.k.data(), pb.v.data(), o.data(), lse.data());
  attention_backward_ref(s, pb.q.data(), pb.k.data(), pb.v.data(), o.data(), lse.data(), pb.d_o.data(), dq.data(),
                         dk.data(), dv.data());
  std::vector<float> om(q_elems(sm)), lsem(lse_elems(sm)), dqm(q_elems(sm)), dkm(kv_elems(sm)), dvm(kv_elems(sm));
  attention_forward_ref(sm, pb.q.data(), k_rep.data(), v_rep.data(), om.data(), lsem.data());
  attention_backward_ref(sm, pb.q.data(), k_rep.data(), v_rep.data(), om.data(), lsem.data(), pb.d_o.data(),
                         dqm.data(), dkm.data(), dvm.data());
  EXPECT_LT(scaled_max_error(o, om), 1e-6);
  EXPECT_LT(scaled_max_error(dq, dqm), 1e-6);
  for (int64_t row = 0; row < s.n_seq * T; ++row)
    for (int64_t kvh = 0; kvh < s.n_head_kv; ++kvh)
      for (int64_t d = 0; d < hd; ++d) {
        double sk = 0.0, sv = 0.0;
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          sk += dkm[size_t((row * s.n_head + h) * hd + d)];
          sv += dvm[size_t((row * s.n_head + h) * hd + d)];
        }
        const size_t at = size_t((row * s.n_head_kv + kvh) * hd + d);
        EXPECT_NEAR(dk[at], sk, 1e-5 * (1 + std::fabs(sk)));
        EXPECT_NEAR(dv[at], sv, 1e-5 * (1 + std::fabs(sv)));
      }
}

// --- (2) + (4) the tiled variants against the references ------------------------------

struct TiledCase {
  Dims dims;
  float scale;  // 0: 1 / sqrt(head_dim)
};

const TiledCase kTiledCases[] = {
    {{1, 1, 1, 1, 5}, 0},      {{1, 1, 4, 2, 8}, 0},       {{2, 2, 2, 1, 1}, 0},      {{3, 17, 6, 3, 12}, 0},
    {{1, 15, 4, 2, 3}, 0},     {{1, 16, 8, 8, 5}, 0},      {{2, 33, 4, 4, 8}, 0},     {{1, 63, 8, 2, 32}, 0},
    {{1, 64, 4, 2, 8}, 0},     {{2, 65, 6, 3, 7}, 0},      {{1, 130, 8, 8, 16}, 0},   {{1, 97, 2, 1, 64}, 0},
    {{1, 40, 2, 2, 128}, 0},   {{2, 70, 4, 1, 9}, 1.5f},  // large scores: the running max moves
    {{1, 129, 3, 3, 8}, 0.05f},
};

TEST(TrainAttention, TiledMatchesReferenceForEveryIsa) {
  uint32_t seed = 500;
  for (const TiledCase& tc : kTiledCases) {
    SCOPED_TRACE(dims_name(tc.dims));
    Problem pb(tc.dims, seed++, tc.scale);
    const AttentionShape& s = pb.s;
    std::vector<float> o_ref(q_elems(s)), lse_ref(lse_elems(s));
    attention_forward_ref(s, pb.q.data(), pb.k.data(), pb.v.data(), o_ref.data(), lse_ref.data());
    std::vector<float> dq_ref(q_elems(s)), dk_ref(kv_elems(s)), dv_ref(kv_elems(s));
    attention_backward_ref(s, pb.q.data(), pb.k.data(), pb.v.data(), o_ref.data(), lse_ref.data(), pb.d_o.data(),
                           dq_ref.data(), dk_ref.data(), dv_ref.data());
    for (Isa isa : isas()) {
      SCOPED_TRACE(isa_name(isa));
      std::vector<float> o = nan_vector(q_elems(s)), lse = nan_vector(lse_elems(s));
      detail::attention_forward_isa(isa, nullptr, s, pb.q.data(), pb.k.data(), pb.v.data(), o.data(), lse.data());
      EXPECT_LT(scaled_max_error(o, o_ref), 5e-6);
      for (size_t i = 0; i < lse.size(); ++i)
        ASSERT_NEAR(lse[i], lse_ref[i], 2e-6 * (1 + std::fabs(lse_ref[i]))) << "lse[" << i << "]";
      // The backward from the reference's forward, so that only the backward is measured.
      std::vector<float> dq = nan_vector(q_elems(s)), dk = nan_vector(kv_elems(s)), dv = nan_vector(kv_elems(s));
      detail::attention_backward_isa(isa, nullptr, s, pb.q.data(), pb.k.data(), pb.v.data(), o_ref.data(),
                                     lse_ref.data(), pb.d_o.data(), dq.data(), dk.data(), dv.data());
      // Floor 1e-2: with one visible key dq and dk are 0 up to the rounding of dP - D, which
      // cancels; everywhere else gradients are of order 0.1 to 10.
      EXPECT_LT(scaled_max_error(dq, dq_ref, 1e-2), 1e-5);
      EXPECT_LT(scaled_max_error(dk, dk_ref, 1e-2), 1e-5);
      EXPECT_LT(scaled_max_error(dv, dv_ref, 1e-2), 1e-5);
    }
  }
}

// lse is the natural log of the sum of exp(scale * q.k) over the visible keys: against a
// double computation, for the reference and the selected variant.
TEST(TrainAttention, LseIsTheLogSumExpOfTheScaledScores) {
  const Dims dims{2, 70, 4, 2, 12};
  Problem pb(dims, 77, 0.7f);
  const AttentionShape& s = pb.s;
  std::vector<double> od, lsed;
  forward_double(s, to_double(pb.q), to_double(pb.k), to_double(pb.v), od, lsed);
  // The first row of every head sees only key 0: lse = scale * q0.k0 exactly in double.
  for (int64_t h = 0; h < s.n_head; ++h) {
    double dot = 0.0;
    for (int64_t d = 0; d < s.head_dim; ++d)
      dot += double(pb.q[size_t(h * s.head_dim + d)]) * double(pb.k[size_t((h / 2) * s.head_dim + d)]);
    ASSERT_NEAR(lsed[size_t(h)], double(s.scale) * dot, 1e-12);
  }
  std::vector<float> o(q_elems(s)), lse = nan_vector(lse_elems(s));
  attention_forward_ref(s, pb.q.data(), pb.k.data(), pb.v.data(), o.data(), lse.data());
  for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], lsed[i], 1e-6 * (1 + std::fabs(lsed[i]))) << i;
  std::vector<float> o_fast = nan_vector(q_elems(s)), lse_fast = nan_vector(lse_elems(s));
  attention_forward(nullptr, s, pb.q.data(), pb.k.data(), pb.v.data(), o_fast.data(), lse_fast.data());
  for (size_t i = 0; i < lse.size(); ++i)
    ASSERT_NEAR(lse_fast[i], lsed[i], 2e-6 * (1 + std::fabs(lsed[i]))) << i;
  std::vector<float> od_f(od.begin(), od.end());
  EXPECT_LT(scaled_max_error(o_fast, od_f), 2e-6);
}

// The public entry points run the selected variant: the same bits as forcing it.
TEST(TrainAttention, PublicEntryPointsRunTheSelectedIsa) {
  Problem pb({2, 21, 4, 2, 8}, 9);
  const AttentionShape& s = pb.s;
  std::vector<float> o1(q_elems(s)), l1(lse_elems(s)), o2(q_elems(s)), l2(lse_elems(s));
  attention_forward(nullptr, s, pb.q.data(), pb.k.data(), pb.v.data(), o1.data(), l1.data());
  detail::attention_forward_isa(selected_isa(), nullptr, s, pb.q.data(), pb.k.data(), pb.v.data(), o2.data(),
                                l2.data());
  EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float)));
  std::vector<float> dq1(q_elems(s)), dk1(kv_elems(s)), dv1(kv_elems(s));
  std::vector<float> dq2(q_elems(s)), dk2(kv_elems(s)), dv2(kv_elems(s));
  attention_backward(nullptr, s, pb.q.data(), pb.k.data(), pb.v.data(), o1.data(), l1.data(), pb.d_o.data(),
                     dq1.data(), dk1.data(), dv1.data());
  detail::attention_backward_isa(selected_isa(), nullptr, s, pb.q.data(), pb.k.data(), pb.v.data(), o1.data(),
                                 l1.data(), pb.d_o.data(), dq2.data(), dk2.data(), dv2.data());
  EXPECT_EQ(0, std::memcmp(dq1.data(), dq2.data(), dq1.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dk1.data(), dk2.data(), dk1.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dv1.data(), dv2.data(), dv1.size() * sizeof(float)));
}

// --- (3) thread counts ---------------------------------------------------------------

TEST(TrainAttention, BitIdenticalForOneTwoAndThreeThreads) {
  Problem pb({3, 70, 6, 3, 12}, 31);  // 9 units: uneven over 2 and 3 threads
  const AttentionShape& s = pb.s;
  ThreadPool pool1(1), pool2(2), pool3(3);
  for (Isa isa : isas()) {
    SCOPED_TRACE(isa_name(isa));
    std::vector<float> o0(q_elems(s)), l0(lse_elems(s)), dq0(q_elems(s)), dk0(kv_elems(s)), dv0(kv_elems(s));
    detail::attention_forward_isa(isa, nullptr, s, pb.q.data(), pb.k.data(), pb.v.data(), o0.data(), l0.data());
    detail::attention_backward_isa(isa, nullptr, s, pb.q.data(), pb.k.data(), pb.v.data(), o0.data(), l0.data(),
                                   pb.d_o.data(), dq0.data(), dk0.data(), dv0.data());
    for (ThreadPool* pool : {&pool1, &pool2, &pool3}) {
      SCOPED_TRACE("threads " + std::to_string(pool->size()));
      std::vector<float> o = nan_vector(q_elems(s)), l = nan_vector(lse_elems(s));
      std::vector<float> dq = nan_vector(q_elems(s)), dk = nan_vector(kv_elems(s)), dv = nan_vector(kv_elems(s));
      detail::attention_forward_isa(isa, pool, s, pb.q.data(), pb.k.data(), pb.v.data(), o.data(), l.data());
      detail::attention_backward_isa(isa, pool, s, pb.q.data(), pb.k.data(), pb.v.data(), o0.data(), l0.data(),
                                     pb.d_o.data(), dq.data(), dk.data(), dv.data());
      EXPECT_EQ(0, std::memcmp(o.data(), o0.data(), o.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(l.data(), l0.data(), l.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(dq.data(), dq0.data(), dq.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(dk.data(), dk0.data(), dk.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(dv.data(), dv0.data(), dv.size() * sizeof(float)));
    }
  }
}

// Sizes where nothing is computed leave the inputs alone and give zero dk / dv.
TEST(TrainAttention, EmptyShapesAreNoOps) {
  AttentionShape s = shape_of({0, 5, 4, 2, 8});
  detail::attention_forward_isa(selected_isa(), nullptr, s, nullptr, nullptr, nullptr, nullptr, nullptr);
  s = shape_of({2, 3, 0, 2, 4});
  std::vector<float> dk = nan_vector(kv_elems(s)), dv = nan_vector(kv_elems(s));
  attention_backward(nullptr, s, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, dk.data(),
                     dv.data());
  for (float x : dk) EXPECT_EQ(x, 0.0f);
  for (float x : dv) EXPECT_EQ(x, 0.0f);
}

}  // namespace
}  // namespace tern::train
