// train/gemm: every variant against a double-precision product, the untouched padding around
// C, NaN in C with accumulate=false, bit-identical results for any thread count, transpose.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "train/gemm.h"
#include "train/gemm_kernels.h"

namespace tern::train {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Written around C's block (the padding of each row and guard rows before and after): any
// change means a write outside the matrix.
constexpr float kSentinel = -12345.5f;
constexpr int64_t kGuard = 37;

std::vector<Isa> variants() {
  std::vector<Isa> v;
  for (Isa isa : {Isa::Ref, Isa::Avx2, Isa::Avx512})
    if (isa_supported(isa)) v.push_back(isa);
  return v;
}

// A rows x cols matrix with row stride ld, allocated to exactly its last element (ASan sees a
// read past it); the padding of each row is NaN, so a kernel that uses it poisons its result.
struct Matrix {
  int64_t rows = 0, cols = 0, ld = 0;
  std::vector<float> data;
  Matrix(int64_t r, int64_t c, int64_t pad, std::mt19937& rng) : rows(r), cols(c), ld(c + pad) {
    data.assign(size_t(rows > 0 ? (rows - 1) * ld + cols : 0), kNaN);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) data[size_t(i * ld + j)] = u(rng);
  }
  float at(int64_t i, int64_t j) const { return data[size_t(i * ld + j)]; }
};

// C inside guard rows; its row padding and the guards hold kSentinel.
struct Output {
  int64_t rows, cols, ld;
  std::vector<float> buf;
  Output(int64_t r, int64_t c, int64_t pad) : rows(r), cols(c), ld(c + pad) {
    buf.assign(size_t(2 * kGuard + r * ld), kSentinel);
  }
  float* c() { return buf.data() + kGuard; }
  float& at(int64_t i, int64_t j) { return c()[i * ld + j]; }
  bool inside(size_t pos) const {
    if (pos < size_t(kGuard)) return false;
    const int64_t off = int64_t(pos) - kGuard;
    return off < rows * ld && off % ld < cols;
  }
  // Count of elements outside the block that are no longer the sentinel.
  int64_t touched_outside() const {
    int64_t bad = 0;
    for (size_t p = 0; p < buf.size(); ++p)
      if (!inside(p) && std::memcmp(&buf[p], &kSentinel, sizeof(float)) != 0) ++bad;
    return bad;
  }
};

struct Case {
  int64_t M, N, K;
  bool trans_a, accumulate;
  int64_t pad_a, pad_b, pad_c;
};

std::string describe(Isa isa, const Case& t, int threads) {
  return std::string(isa_name(isa)) + " M=" + std::to_string(t.M) + " N=" + std::to_string(t.N) +
         " K=" + std::to_string(t.K) + (t.trans_a ? " trans_a" : "") + (t.accumulate ? " accumulate" : "") +
         " pads=" + std::to_string(t.pad_a) + "," + std::to_string(t.pad_b) + "," + std::to_string(t.pad_c) +
         " threads=" + std::to_string(threads);
}

// Runs one case and checks every C element against the double product within a bound
// proportional to the magnitudes summed (f32 rounding grows with them), and the padding.
void check_case(Isa isa, const Case& t, ThreadPool* pool, std::mt19937& rng) {
  SCOPED_TRACE(describe(isa, t, pool ? pool->size() : 0));
  // A is stored M x K, or K x M when trans_a.
  const Matrix a = t.trans_a ? Matrix(t.K, t.M, t.pad_a, rng) : Matrix(t.M, t.K, t.pad_a, rng);
  const Matrix b(t.K, t.N, t.pad_b, rng);
  Output out(t.M, t.N, t.pad_c);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> c0(size_t(t.M * t.N));
  for (int64_t i = 0; i < t.M; ++i)
    for (int64_t j = 0; j < t.N; ++j) {
      c0[size_t(i * t.N + j)] = u(rng);
      // accumulate=false must not read C: NaN there would show in the result.
      out.at(i, j) = t.accumulate ? c0[size_t(i * t.N + j)] : kNaN;
    }
  // An empty matrix has no storage: pass a valid pointer anyway, it must not be read.
  const float dummy = 0.0f;
  const float* ap = a.data.empty() ? &dummy : a.data.data();
  const float* bp = b.data.empty() ? &dummy : b.data.data();
  detail::gemm_isa(isa, pool, t.trans_a, t.M, t.N, t.K, ap, a.ld, bp, b.ld, out.c(), out.ld, t.accumulate);

  int64_t wrong = 0;
  for (int64_t i = 0; i < t.M; ++i) {
    for (int64_t j = 0; j < t.N; ++j) {
      double exact = t.accumulate ? double(c0[size_t(i * t.N + j)]) : 0.0;
      double magnitude = std::fabs(exact);
      for (int64_t k = 0; k < t.K; ++k) {
        const double p = double(t.trans_a ? a.at(k, i) : a.at(i, k)) * double(b.at(k, j));
        exact += p;
        magnitude += std::fabs(p);
      }
      const double got = out.at(i, j);
      const double tol = 1e-5 * magnitude + 1e-30;
      if (!(std::fabs(got - exact) <= tol) && wrong++ < 5)
        ADD_FAILURE() << "C[" << i << "][" << j << "] = " << got << ", expected " << exact << " (tol " << tol << ")";
    }
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(out.touched_outside(), 0);
}

// Shapes around every edge: 1, below/at/above a register tile (AVX-512 12 x 32, AVX2 6 x 16)
// and a K block (256), both layouts of A, accumulate on and off, padded strides.
std::vector<Case> edge_cases() {
  std::vector<Case> cases;
  const int64_t dims[][3] = {{1, 1, 1},    {1, 17, 3},   {5, 1, 9},    {12, 32, 8},   {13, 33, 7},
                             {11, 31, 16}, {6, 16, 1},   {7, 8, 2},    {25, 48, 40},  {3, 70, 257},
                             {37, 9, 300}, {24, 64, 64}, {19, 47, 129}, {2, 100, 31}, {64, 172, 5}};
  int n = 0;
  for (const auto& d : dims) {
    for (bool trans : {false, true}) {
      for (bool acc : {false, true}) {
        const int64_t pad_a = n % 3 == 0 ? 0 : n % 5, pad_b = n % 4 == 1 ? 0 : 3 + n % 2, pad_c = n % 2 ? 0 : 1 + n % 7;
        cases.push_back({d[0], d[1], d[2], trans, acc, pad_a, pad_b, pad_c});
        ++n;
      }
    }
  }
  return cases;
}

TEST(Gemm, EveryVariantMatchesDoubleProductOnEdges) {
  std::mt19937 rng(1234);
  for (Isa isa : variants())
    for (const Case& t : edge_cases()) check_case(isa, t, nullptr, rng);
}

TEST(Gemm, RandomShapesThreaded) {
  std::mt19937 rng(99);
  ThreadPool pool(3);
  std::uniform_int_distribution<int64_t> dim(1, 90), kdim(1, 300), pad(0, 4), coin(0, 1);
  for (Isa isa : variants()) {
    for (int rep = 0; rep < 12; ++rep) {
      const Case t{dim(rng), dim(rng), kdim(rng), coin(rng) == 1, coin(rng) == 1, pad(rng), pad(rng), pad(rng)};
      check_case(isa, t, &pool, rng);
    }
  }
}

// Several thread tiles (serially: M > 192 and N > 256, the default tile; threaded: smaller
// tiles) and several K blocks (256 rows each).
TEST(Gemm, LargeShapeCrossesTilesAndKBlocks) {
  std::mt19937 rng(7);
  ThreadPool pool(2);
  for (Isa isa : variants()) {
    if (isa == Isa::Ref) continue;  // the reference is one loop: nothing to cross
    check_case(isa, {200, 264, 260, false, true, 1, 2, 3}, nullptr, rng);
    check_case(isa, {100, 130, 520, true, false, 0, 5, 0}, &pool, rng);
  }
}

TEST(Gemm, ZeroSizes) {
  for (Isa isa : variants()) {
    SCOPED_TRACE(isa_name(isa));
    const float a = 1.0f, b = 1.0f;
    // K == 0: accumulate=false zeroes C (NaN included), accumulate=true leaves it.
    Output out(3, 5, 2);
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 5; ++j) out.at(i, j) = kNaN;
    detail::gemm_isa(isa, nullptr, false, 3, 5, 0, &a, 1, &b, 5, out.c(), out.ld, false);
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(out.at(i, j), 0.0f);
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 5; ++j) out.at(i, j) = 2.0f;
    detail::gemm_isa(isa, nullptr, true, 3, 5, 0, &a, 3, &b, 5, out.c(), out.ld, true);
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(out.at(i, j), 2.0f);
    EXPECT_EQ(out.touched_outside(), 0);
    // M == 0 or N == 0: nothing at all.
    Output none(1, 1, 0);
    detail::gemm_isa(isa, nullptr, false, 0, 1, 4, &a, 4, &b, 1, none.c(), 1, false);
    detail::gemm_isa(isa, nullptr, false, 1, 0, 4, &a, 4, &b, 1, none.c(), 1, false);
    EXPECT_EQ(none.buf[size_t(kGuard)], kSentinel);
  }
}

// The determinism contract: the same bits whatever the pool, including no pool.
TEST(Gemm, BitIdenticalForAnyThreadCount) {
  std::mt19937 rng(5);
  ThreadPool p1(1), p2(2), p3(3);
  for (Isa isa : variants()) {
    for (bool trans : {false, true}) {
      SCOPED_TRACE(std::string(isa_name(isa)) + (trans ? " trans_a" : ""));
      const int64_t M = 150, N = 170, K = 300;  // threaded: well above the serial threshold
      const Matrix a = trans ? Matrix(K, M, 1, rng) : Matrix(M, K, 1, rng);
      const Matrix b(K, N, 0, rng);
      Matrix c_init(M, N, 0, rng);
      std::vector<std::vector<float>> results;
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &p1, &p2, &p3}) {
        std::vector<float> c = c_init.data;
        detail::gemm_isa(isa, pool, trans, M, N, K, a.data.data(), a.ld, b.data.data(), b.ld, c.data(), N, true);
        results.push_back(std::move(c));
      }
      for (size_t r = 1; r < results.size(); ++r)
        EXPECT_EQ(std::memcmp(results[0].data(), results[r].data(), results[0].size() * sizeof(float)), 0)
            << "run " << r << " differs from the serial run";
    }
  }
}

// gemm() is the selected variant: the same bits as calling it by name.
TEST(Gemm, DispatchUsesSelectedVariant) {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  const int64_t M = 40, N = 50, K = 60;
  const Matrix a(M, K, 0, rng), b(K, N, 0, rng);
  std::vector<float> c1(size_t(M * N)), c2(size_t(M * N));
  gemm(&pool, false, M, N, K, a.data.data(), K, b.data.data(), N, c1.data(), N, false);
  detail::gemm_isa(selected_isa(), nullptr, false, M, N, K, a.data.data(), K, b.data.data(), N, c2.data(), N, false);
  EXPECT_EQ(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)), 0);
}

// gemm_ref is the plain f32 loop: bit-exact against the same loop written here.
TEST(Gemm, ReferenceIsThePlainLoop) {
  std::mt19937 rng(3);
  const int64_t M = 9, N = 11, K = 37;
  const Matrix a(K, M, 2, rng), b(K, N, 1, rng);
  Matrix c(M, N, 3, rng);
  std::vector<float> expect = c.data;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float acc = expect[size_t(i * c.ld + j)];
      for (int64_t k = 0; k < K; ++k) {
        const volatile float p = a.at(k, i) * b.at(k, j);  // no FMA contraction
        acc += p;
      }
      expect[size_t(i * c.ld + j)] = acc;
    }
  gemm_ref(true, M, N, K, a.data.data(), a.ld, b.data.data(), b.ld, c.data.data(), c.ld, true);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) EXPECT_EQ(c.at(i, j), expect[size_t(i * c.ld + j)]) << i << "," << j;
}

TEST(Gemm, UnsupportedVariantThrows) {
  if (isa_supported(Isa::Avx512)) GTEST_SKIP() << "every variant runs here";
  float x = 0.0f;
  EXPECT_ANY_THROW(detail::gemm_isa(Isa::Avx512, nullptr, false, 1, 1, 1, &x, 1, &x, 1, &x, 1, false));
}

TEST(GemmTranspose, MatchesElementwise) {
  std::mt19937 rng(21);
  ThreadPool pool(3);
  const int64_t shapes[][2] = {{1, 1}, {1, 40}, {33, 1}, {31, 33}, {64, 64}, {100, 37}, {300, 290}, {40, 1500}};
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    for (const auto& s : shapes) {
      const int64_t R = s[0], C = s[1];
      SCOPED_TRACE(std::to_string(R) + "x" + std::to_string(C));
      const Matrix in(R, C, 3, rng);
      Output out(C, R, 2);
      transpose(p, R, C, in.data.data(), in.ld, out.c(), out.ld);
      int64_t wrong = 0;
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) wrong += out.at(c, r) != in.at(r, c);
      EXPECT_EQ(wrong, 0);
      EXPECT_EQ(out.touched_outside(), 0);
    }
  }
}

}  // namespace
}  // namespace tern::train
