// Low-rank compression (compress/svd.h, compress/lowrank.h, `tern lowrank`): the eigensolver and
// SVD against independent checks, asvd against svd on correlated inputs, the budget's rank
// allocation, factored models running like their merged twins, and the CLI's errors.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "compress/linalg.h"
#include "compress/lowrank.h"
#include "compress/svd.h"
#include "core/error.h"
#include "compress_test_util.h"

namespace tern {
namespace {

using testing::kTern;
using testing::run_command;

std::vector<double> random_matrix(int64_t m, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> a(size_t(m * n));
  for (double& x : a) x = nd(rng);
  return a;
}

// A random orthogonal matrix [n, n]: Gram-Schmidt (twice) on a Gaussian matrix's rows.
std::vector<double> random_orthogonal(int64_t n, uint32_t seed) {
  std::vector<double> q = random_matrix(n, n, seed);
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t i = 0; i < n; ++i) {
      double* qi = q.data() + i * n;
      for (int64_t j = 0; j < i; ++j) {
        const double* qj = q.data() + j * n;
        double d = 0;
        for (int64_t k = 0; k < n; ++k) d += qi[k] * qj[k];
        for (int64_t k = 0; k < n; ++k) qi[k] -= d * qj[k];
      }
      double nn = 0;
      for (int64_t k = 0; k < n; ++k) nn += qi[k] * qi[k];
      for (int64_t k = 0; k < n; ++k) qi[k] /= std::sqrt(nn);
    }
  return q;
}

double frob2(const std::vector<double>& a) {
  double s = 0;
  for (double x : a) s += x * x;
  return s;
}

TEST(LowRankSvd, ThinSvdIsOrthonormalAndReconstructs) {
  ThreadPool pool(2);
  for (const auto& [m, n] : {std::pair<int64_t, int64_t>{40, 70}, {70, 40}, {33, 33}, {1, 9}}) {
    const std::vector<double> a = random_matrix(m, n, uint32_t(m * 100 + n));
    const Svd s = svd_thin(a, m, n, pool);
    const int64_t k = std::min(m, n);
    ASSERT_EQ(s.k, k);
    for (int64_t i = 1; i < k; ++i) EXPECT_GE(s.s[size_t(i - 1)], s.s[size_t(i)]);
    // U^T U = I, V^T V = I.
    for (const auto& [mat, rows] : {std::pair{&s.u, m}, std::pair{&s.v, n}})
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < k; ++j) {
          double d = 0;
          for (int64_t r = 0; r < rows; ++r) d += (*mat)[size_t(r * k + i)] * (*mat)[size_t(r * k + j)];
          EXPECT_NEAR(d, i == j ? 1.0 : 0.0, 1e-9) << m << "x" << n << " (" << i << ", " << j << ")";
        }
    // U diag(s) V^T = A, and the truncation's error is the discarded sigma^2 (Eckart-Young).
    for (int64_t r : {int64_t(1), k / 2, k}) {
      if (r < 1) continue;
      double err = 0;
      for (int64_t x = 0; x < m; ++x)
        for (int64_t y = 0; y < n; ++y) {
          double v = 0;
          for (int64_t i = 0; i < r; ++i) v += s.u[size_t(x * k + i)] * s.s[size_t(i)] * s.v[size_t(y * k + i)];
          const double d = a[size_t(x * n + y)] - v;
          err += d * d;
        }
      double discarded = 0;
      for (int64_t i = r; i < k; ++i) discarded += s.s[size_t(i)] * s.s[size_t(i)];
      EXPECT_NEAR(err, discarded, 1e-9 * frob2(a)) << m << "x" << n << " rank " << r;
    }
  }
}

TEST(LowRankSvd, RecoversTheSingularValuesOfAConstructedMatrix) {
  ThreadPool pool(2);
  const int64_t m = 48, n = 30;
  // A = Q1[:, :n] diag(s) Q2^T with known s (some repeated, one zero).
  const std::vector<double> q1 = random_orthogonal(m, 7), q2 = random_orthogonal(n, 8);
  std::vector<double> want(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) want[size_t(i)] = i == n - 1 ? 0.0 : double(n - i) * (i % 5 == 1 ? 1.0 : 0.5) + (i == 3 ? 0.0 : 0.1);
  std::vector<double> a(size_t(m * n), 0.0);
  for (int64_t x = 0; x < m; ++x)
    for (int64_t y = 0; y < n; ++y)
      for (int64_t i = 0; i < n; ++i) a[size_t(x * n + y)] += q1[size_t(i * m + x)] * want[size_t(i)] * q2[size_t(i * n + y)];
  std::sort(want.begin(), want.end(), std::greater<>());
  const Svd s = svd_thin(a, m, n, pool);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(s.s[size_t(i)], want[size_t(i)], 1e-7) << i;
  // The values-only eigensolver gives the same spectrum as the one with vectors.
  std::vector<double> with, without, vec;
  sym_eigen(gram_cols(a.data(), m, n, pool), n, with, &vec, pool);
  sym_eigen(gram_cols(a.data(), m, n, pool), n, without, nullptr, pool);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(with[size_t(i)], without[size_t(i)], 1e-9 * with[0]);
}

TEST(LowRankSvd, InverseIterationVectorsMatchTheQlOnes) {
  // n above the inverse-iteration threshold, a few of the vectors: the same eigenpairs as the
  // QL rotations give for all of them (up to sign), orthonormal, with small residuals. Two
  // spectra: a random Gram matrix (well separated) and one with a cluster of equal values.
  ThreadPool pool(2);
  const int64_t n = 300, nv = 120;
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<double> g;
    if (kind == 0) {
      const std::vector<double> a = random_matrix(n, 400, 31);
      g = gram_rows(a.data(), n, 400, pool);
    } else {
      const std::vector<double> q = random_orthogonal(n, 32);
      std::vector<double> lam(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) lam[size_t(i)] = i >= 10 && i < 30 ? 5.0 : 10.0 / double(1 + i);
      g.assign(size_t(n * n), 0.0);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t x = 0; x < n; ++x)
          for (int64_t y = 0; y < n; ++y) g[size_t(x * n + y)] += lam[size_t(i)] * q[size_t(i * n + x)] * q[size_t(i * n + y)];
    }
    std::vector<double> all_values, all, some_values, some;
    sym_eigen(g, n, all_values, &all, pool);
    sym_eigen(g, n, some_values, &some, pool, nv);
    ASSERT_EQ(int64_t(some.size()), nv * n);
    for (int64_t i = 0; i < nv; ++i) {
      EXPECT_NEAR(some_values[size_t(i)], all_values[size_t(i)], 1e-10 * all_values[0]);
      double res = 0;
      for (int64_t x = 0; x < n; ++x) {
        double gx = 0;
        for (int64_t y = 0; y < n; ++y) gx += g[size_t(x * n + y)] * some[size_t(i * n + y)];
        res = std::max(res, std::fabs(gx - some_values[size_t(i)] * some[size_t(i * n + x)]));
      }
      EXPECT_LT(res, 1e-9 * all_values[0]) << kind << ": vector " << i;
      for (int64_t j = 0; j <= i; ++j) {
        double d = 0;
        for (int64_t x = 0; x < n; ++x) d += some[size_t(i * n + x)] * some[size_t(j * n + x)];
        EXPECT_NEAR(d, i == j ? 1.0 : 0.0, 1e-9) << kind << ": vectors " << i << ", " << j;
      }
      if (kind == 0) {  // distinct values: the same vector up to sign
        double d = 0;
        for (int64_t x = 0; x < n; ++x) d += some[size_t(i * n + x)] * all[size_t(i * n + x)];
        EXPECT_NEAR(std::fabs(d), 1.0, 1e-8) << i;
      }
    }
  }
}

TEST(LowRankSvd, FactorsAreTheTruncatedSvdOnBothSides) {
  ThreadPool pool(2);
  for (const auto& [n_out, n_in] : {std::pair<int64_t, int64_t>{24, 56}, {56, 24}}) {
    const std::vector<double> ad = random_matrix(n_out, n_in, 11);
    const std::vector<float> w(ad.begin(), ad.end());
    const Svd s = svd_thin(std::vector<double>(w.begin(), w.end()), n_out, n_in, pool);
    const int64_t r = 7;
    const LowRankFactors f = lowrank_factor(w.data(), n_out, n_in, r, nullptr, 0.0, pool);
    const std::vector<float> m = lowrank_merge(f);
    double err = 0, discarded = 0;
    for (int64_t i = 0; i < n_out * n_in; ++i) err += (double(w[size_t(i)]) - m[size_t(i)]) * (double(w[size_t(i)]) - m[size_t(i)]);
    for (int64_t i = r; i < s.k; ++i) discarded += s.s[size_t(i)] * s.s[size_t(i)];
    EXPECT_NEAR(err, discarded, 1e-5 * discarded) << n_out << "x" << n_in;
    ASSERT_EQ(int64_t(f.energy.size()), s.k);
    for (int64_t i = 0; i < s.k; ++i) EXPECT_NEAR(f.energy[size_t(i)], s.s[size_t(i)] * s.s[size_t(i)], 1e-8 * f.energy[0]);
  }
}

TEST(LowRankAsvd, LowerOutputErrorThanSvdOnCorrelatedInputs) {
  ThreadPool pool(2);
  for (const auto& [n_out, n_in] : {std::pair<int64_t, int64_t>{24, 48}, {64, 32}}) {
    // Inputs x = L z with a random L and per-channel scales spread over 100x: strongly correlated
    // and anisotropic, as real activations are.
    const int64_t n_t = 400;
    const std::vector<double> l = random_matrix(n_in, n_in, 21), z = random_matrix(n_t, n_in, 22);
    std::vector<float> x(size_t(n_t * n_in));
    for (int64_t t = 0; t < n_t; ++t)
      for (int64_t i = 0; i < n_in; ++i) {
        double v = 0;
        for (int64_t j = 0; j <= i; ++j) v += l[size_t(i * n_in + j)] * z[size_t(t * n_in + j)];
        x[size_t(t * n_in + i)] = float(v * std::pow(100.0, double(i % 7) / 6.0));
      }
    std::vector<double> h(size_t(n_in * n_in), 0.0);
    for (int64_t t = 0; t < n_t; ++t)
      for (int64_t i = 0; i < n_in; ++i)
        for (int64_t j = 0; j < n_in; ++j) h[size_t(i * n_in + j)] += double(x[size_t(t * n_in + i)]) * x[size_t(t * n_in + j)];
    const std::vector<double> wd = random_matrix(n_out, n_in, 23);
    const std::vector<float> w(wd.begin(), wd.end());
    for (int64_t r : {4, 12}) {
      const std::vector<float> ms = lowrank_merge(lowrank_factor(w.data(), n_out, n_in, r, nullptr, 0.0, pool));
      const std::vector<float> ma = lowrank_merge(lowrank_factor(w.data(), n_out, n_in, r, &h, 1e-6, pool));
      const double es = output_error_samples(w.data(), ms.data(), n_out, n_in, x.data(), n_t, pool);
      const double ea = output_error_samples(w.data(), ma.data(), n_out, n_in, x.data(), n_t, pool);
      EXPECT_LT(ea, es) << n_out << "x" << n_in << " rank " << r;
      // asvd's output error is its discarded whitened energy (Eckart-Young on W S).
      const std::vector<double> spec = lowrank_spectrum(w.data(), n_out, n_in, &h, 1e-6, pool);
      double discarded = 0;
      for (size_t i = size_t(r); i < spec.size(); ++i) discarded += spec[i];
      EXPECT_NEAR(ea, discarded, 1e-3 * discarded) << n_out << "x" << n_in << " rank " << r;
      std::printf("%lldx%lld rank %lld: output error svd %.4g, asvd %.4g (%.2fx lower)\n", (long long)n_out,
                  (long long)n_in, (long long)r, es, ea, es / ea);
    }
  }
}

TEST(LowRankAllocate, HonoursTheBudgetAndPrefersEnergyPerParameter) {
  // Three 100x100 matrices (200 parameters per rank, dense 10000; crossover rank 49).
  std::vector<std::pair<int64_t, int64_t>> shapes(3, {100, 100});
  std::vector<std::vector<double>> spectra(3);
  for (int i = 0; i < 100; ++i) {
    spectra[0].push_back(std::pow(0.5, i));          // fast decay: few ranks needed
    spectra[1].push_back(1.0);                       // flat: every rank as good
    spectra[2].push_back(100.0 * std::pow(0.9, i));  // large, slower decay
  }
  for (double budget : {0.1, 0.3, 0.5, 0.7, 1.0}) {
    const std::vector<int64_t> r = allocate_ranks(spectra, shapes, budget);
    int64_t used = 0;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_LE(r[i] * 200, 10000 - 1) << "a factored matrix must cost less than dense";
      used += r[i] == 0 ? 10000 : r[i] * 200;
    }
    EXPECT_LE(double(used), budget * 30000.0 + 1e-9) << budget;
    EXPECT_GT(double(used), budget * 30000.0 - 10000.0 - 200.0) << budget << ": the budget is barely used";
    if (budget <= 0.5) {
      EXPECT_GT(r[2], r[0]) << budget;  // more energy per parameter goes first
    }
  }
  // Budget 1: going dense beats any rank for the flat spectrum (its crossover leaves half of it).
  EXPECT_EQ(allocate_ranks(spectra, shapes, 1.0)[1], 0);
  EXPECT_THROW(allocate_ranks(spectra, shapes, 0.0), Error);
  EXPECT_THROW(allocate_ranks(spectra, shapes, 1.5), Error);
  EXPECT_THROW(allocate_ranks(spectra, shapes, 0.005), Error);  // rank 1 everywhere does not fit
}

// `tern logits` of a model over fixed ids.
std::vector<float> logits_of(const std::string& model) {
  const std::string out = testing::temp_path(std::filesystem::path(model).filename().string() + ".logits");
  std::string o, e;
  EXPECT_EQ(run_command(kTern + " logits -m " + model + " --ids \"1 403 407 261 378 432 10 300 77 5 511\" -t 2 -o " + out,
                        &o, &e),
            0)
      << e;
  std::ifstream f(out, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<float> v(bytes.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

nlohmann::json lowrank_json(const std::string& args) {
  std::string o, e;
  const int rc = run_command(kTern + " lowrank " + args + " -t 2 --json", &o, &e);
  EXPECT_EQ(rc, 0) << e;
  return rc == 0 ? nlohmann::json::parse(o) : nlohmann::json{};
}

TEST(LowRankStories, FactoredModelRunsLikeTheMergedOne) {
  if (!std::filesystem::exists(testing::stories())) GTEST_SKIP() << "../shared not present";
  for (const std::string method : {"svd", "asvd"}) {
    // asvd with the relative criterion (docs/lowrank.md), so both allocations run here.
    const std::string calib =
        method == "asvd" ? " --calib " + testing::tinystories_val() + " --calib-tokens 2048 --alloc relative" : "";
    const std::string fac = testing::temp_path("lr_" + method + ".gguf"), mer = testing::temp_path("lr_" + method + "_m.gguf");
    const nlohmann::json rf = lowrank_json(testing::stories() + " " + fac + " --method " + method + " --budget 0.7" + calib);
    const nlohmann::json rm = lowrank_json(testing::stories() + " " + mer + " --method " + method + " --budget 0.7 --merge" + calib);
    ASSERT_FALSE(rf.is_null());
    ASSERT_FALSE(rm.is_null());
    EXPECT_LE(rf["params_after"].get<double>(), 0.7 * rf["params_before"].get<double>());
    EXPECT_GT(rf["params_after"].get<double>(), 0.65 * rf["params_before"].get<double>());
    EXPECT_LT(rf["bytes"].get<int64_t>(), rf["src_bytes"].get<int64_t>());
    EXPECT_EQ(rm["bytes"].get<int64_t>(), rm["src_bytes"].get<int64_t>());
    const std::vector<float> lf = logits_of(fac), lm = logits_of(mer);
    ASSERT_EQ(lf.size(), lm.size());
    ASSERT_FALSE(lf.empty());
    float scale = 0, diff = 0;
    for (size_t i = 0; i < lf.size(); ++i) {
      scale = std::max(scale, std::fabs(lm[i]));
      diff = std::max(diff, std::fabs(lf[i] - lm[i]));
    }
    EXPECT_LT(diff, 1e-3f * scale) << method << ": factored and merged logits differ by " << diff << " of " << scale;
    // A quantized factored model runs too (q8_0 factors; 64-wide rows fit, others fall back).
    if (method == "svd") {
      const std::string q = testing::temp_path("lr_q8.gguf");
      const nlohmann::json rq = lowrank_json(testing::stories() + " " + q + " --rank 32 --type q8_0");
      ASSERT_FALSE(rq.is_null());
      EXPECT_EQ(rq["matrices"][0]["type_a"], "q8_0");
      const std::vector<float> lq = logits_of(q);
      EXPECT_EQ(lq.size(), lm.size());
    }
  }
}

TEST(LowRankStories, BadInputIsAClearError) {
  if (!std::filesystem::exists(testing::stories())) GTEST_SKIP() << "../shared not present";
  const std::string m = testing::stories(), out = testing::temp_path("lr_bad.gguf");
  const auto err_of = [&](const std::string& args) {
    std::string o, e;
    EXPECT_NE(run_command(kTern + " lowrank " + args, &o, &e), 0) << args;
    return e;
  };
  EXPECT_NE(err_of(m + " " + out + " --budget 1.5").find("outside (0, 1]"), std::string::npos);
  EXPECT_NE(err_of(m + " " + out + " --budget 0").find("outside (0, 1]"), std::string::npos);
  EXPECT_NE(err_of(m + " " + out).find("--budget"), std::string::npos);
  EXPECT_NE(err_of(m + " " + out + " --rank 40").find("rank 40 exceeds tensor blk.0.attn_k.weight's shape 32 x 64"),
            std::string::npos);
  EXPECT_NE(err_of(m + " " + out + " --method asvd --budget 0.5").find("--calib"), std::string::npos);
  EXPECT_NE(err_of(m + " " + out + " --rank 4 --alloc relative").find("--alloc"), std::string::npos);
  EXPECT_NE(err_of(m + " " + out + " --method asvd --budget 0.5 --calib " + testing::tinystories_val() +
                   " --calib-tokens 100000000")
                .find("too short"),
            std::string::npos);
  EXPECT_NE(err_of(m + " " + m + " --rank 4").find(m), std::string::npos);  // output = input
  const std::string q = testing::temp_path("lr_src_q8.gguf");
  std::string o, e;
  ASSERT_EQ(run_command(kTern + " quantize " + m + " " + q + " --type q8_0", &o, &e), 0) << e;
  EXPECT_NE(err_of(q + " " + out + " --rank 4").find("low-rank starts from float weights; dequantize with tern quantize"),
            std::string::npos);
}

}  // namespace
}  // namespace tern

namespace tern {
namespace {

// Timing of one TinyLlama-sized factorization (2048 x 5632, ffn_down's shape) and one
// 2048 x 2048: run with --gtest_also_run_disabled_tests (docs/lowrank.md has the figures).
TEST(LowRankSvd, DISABLED_TimeTinyLlamaShapes) {
  ThreadPool pool(2);
  for (const auto& [n_out, n_in] : {std::pair<int64_t, int64_t>{2048, 2048}, {2048, 5632}}) {
    const std::vector<double> wd = random_matrix(n_out, n_in, 5);
    const std::vector<float> w(wd.begin(), wd.end());
    const auto t0 = std::chrono::steady_clock::now();
    // As a --budget run does it: the basis up to the crossover rank, then the factors.
    const int64_t r_max = (n_out * n_in - 1) / (n_out + n_in);
    const LowRankBasis basis = lowrank_basis(w.data(), n_out, n_in, r_max, nullptr, 0.0, pool);
    const auto t1 = std::chrono::steady_clock::now();
    const LowRankFactors f = lowrank_factor(w.data(), basis, 700, nullptr, 0.0, pool);
    const auto t2 = std::chrono::steady_clock::now();
    std::printf("%lldx%lld: basis (%lld vectors) %.2f s, rank-700 factors %.2f s\n", (long long)n_out, (long long)n_in,
                (long long)r_max,
                std::chrono::duration<double>(t1 - t0).count(), std::chrono::duration<double>(t2 - t1).count());
    EXPECT_EQ(f.rank, 700);
  }
}

}  // namespace
}  // namespace tern
