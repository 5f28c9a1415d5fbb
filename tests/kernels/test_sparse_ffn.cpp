// The sparse FFN kernels (kernels/sparse_ffn.h): every variant this CPU runs against the scalar
// reference (bit for bit: the integer block sums are exact and the float order is the one the
// header defines), the dots against the dense GEMV of the same rows (float order only), the
// axpy against a double-precision oracle, the fused ReGLU against the dense FFN and across
// thread counts, down_t's construction, and the argument checks. Shapes: odd float lengths,
// block counts that leave partial groups of 8, padded rows, empty / repeated / all indices.
// DISABLED_SparseFfnBench.TinyLlamaShape prints the dense-vs-sparse figures of issue #31.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "kernels/matmul.h"
#include "kernels/sparse_ffn.h"
#include "quant/quant_traits.h"
#include "quant_test_util.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_sparse_ffn {
namespace {

using testing::randn;
using testing::supported_isas;

constexpr DType kTypes[] = {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0};

ThreadPool& pool_of(int n_threads) {
  static ThreadPool* pools[3] = {nullptr, new ThreadPool(1), new ThreadPool(2)};
  return *pools[n_threads];
}

bool is_quant(DType t) { return t == DType::Q8_0 || t == DType::Q4_0; }

// One row of n values in type t into dst.
void encode_row(DType t, const float* v, int64_t n, uint8_t* dst) {
  if (t == DType::F32) {
    std::memcpy(dst, v, size_t(n) * 4);
  } else if (t == DType::F16) {
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = f32_to_fp16(v[i]);
      std::memcpy(dst + 2 * i, &h, 2);
    }
  } else {
    quant_traits(t)->from_float(v, dst, n);
  }
}

// n_rows random rows of n in type t, row_bytes = the row's bytes + pad (padding filled with 0xEE,
// which no kernel may read into a result).
struct Rows {
  DType type;
  int64_t n_rows, n, row_bytes;
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // dequantized [n_rows][n]
};

Rows make_rows(DType t, int64_t n_rows, int64_t n, uint64_t seed, int64_t pad = 0) {
  Rows r{t, n_rows, n, dtype_row_bytes(t, n) + pad, {}, {}};
  r.bytes.assign(size_t(n_rows * r.row_bytes), 0xEE);
  r.values.resize(size_t(n_rows * n));
  const std::vector<float> v = randn(size_t(n_rows * n), seed);
  for (int64_t i = 0; i < n_rows; ++i) {
    encode_row(t, v.data() + i * n, n, r.bytes.data() + i * r.row_bytes);
    quant_traits(t)->to_float(r.bytes.data() + i * r.row_bytes, r.values.data() + i * n, n);
  }
  return r;
}

// Index lists: empty, all rows in order, repeats, and a random sorted subset.
std::vector<std::vector<int32_t>> index_cases(int64_t n_rows, uint64_t seed) {
  std::vector<std::vector<int32_t>> cases;
  cases.push_back({});
  std::vector<int32_t> all(static_cast<size_t>(n_rows));
  std::iota(all.begin(), all.end(), 0);
  cases.push_back(all);
  cases.push_back({int32_t(n_rows - 1), 0, 3 % int32_t(n_rows), 3 % int32_t(n_rows), int32_t(n_rows - 1), 1 % int32_t(n_rows)});
  std::mt19937 rng{uint32_t(seed)};
  std::vector<int32_t> sub;
  for (int32_t j = 0; j < n_rows; ++j)
    if (rng() % 3 == 0) sub.push_back(j);
  cases.push_back(sub);
  return cases;
}

std::vector<int64_t> lengths(DType t) {
  if (is_quant(t)) return {32, 96, 288, 544, 2048};
  return {1, 7, 16, 17, 45, 100, 2048};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(SparseFfnKernels, DotEveryVariantMatchesReferenceBitForBit) {
  for (DType t : kTypes)
    for (int64_t n : lengths(t)) {
      const int64_t n_rows = 37;
      const Rows r = make_rows(t, n_rows, n, uint64_t(n) * 7 + uint64_t(t), n % 2 == 0 ? 64 : 0);
      const std::vector<float> x = randn(size_t(n), 99 + uint64_t(n), 0.7f);
      for (const auto& idx : index_cases(n_rows, uint64_t(n))) {
        std::vector<float> ref(idx.size(), -1.0f);
        sparse_rows_dot_isa(Isa::Ref, t, r.bytes.data(), r.row_bytes, n_rows, n, idx.data(), int64_t(idx.size()),
                            x.data(), ref.data());
        for (Isa isa : supported_isas()) {
          std::vector<float> out(idx.size(), -2.0f);
          sparse_rows_dot_isa(isa, t, r.bytes.data(), r.row_bytes, n_rows, n, idx.data(), int64_t(idx.size()),
                              x.data(), out.data());
          EXPECT_TRUE(same_bits(out, ref)) << dtype_name(t) << " n=" << n << " " << isa_name(isa)
                                           << " n_idx=" << idx.size();
        }
      }
    }
}

// Against the dense GEMV of the whole matrix (matmul_isa: the same quantized x, the same
// integer block sums): only the float summation order differs, so a bound of a few ulps of the
// sum of |terms| (the terms' magnitudes from the dequantized rows and x).
TEST(SparseFfnKernels, DotMatchesDenseGemvRows) {
  for (DType t : kTypes)
    for (int64_t n : {int64_t(96), int64_t(2048)}) {
      const int64_t n_rows = 40;
      const Rows r = make_rows(t, n_rows, n, 5 + uint64_t(n));
      const std::vector<float> x = randn(size_t(n), 6 + uint64_t(n));
      std::vector<int32_t> idx = {39, 2, 2, 17, 0, 33};
      for (Isa isa : supported_isas()) {
        const WeightView wv{t, n, n_rows, r.bytes.data()};
        std::vector<float> dense(static_cast<size_t>(n_rows));
        matmul_isa(isa, wv, x.data(), n, 1, dense.data(), n_rows, pool_of(1));
        std::vector<float> out(idx.size());
        sparse_rows_dot_isa(isa, t, r.bytes.data(), r.row_bytes, n_rows, n, idx.data(), int64_t(idx.size()), x.data(),
                            out.data());
        for (size_t k = 0; k < idx.size(); ++k) {
          double l1 = 0;
          for (int64_t i = 0; i < n; ++i) l1 += std::fabs(double(r.values[size_t(idx[k] * n + i)]) * x[size_t(i)]);
          EXPECT_NEAR(out[k], dense[size_t(idx[k])], 1e-5 * l1 + 1e-6)
              << dtype_name(t) << " n=" << n << " " << isa_name(isa) << " k=" << k;
        }
      }
    }
}

TEST(SparseFfnKernels, AxpyEveryVariantMatchesReferenceAndOracle) {
  for (DType t : kTypes)
    for (int64_t n : lengths(t)) {
      const int64_t n_rows = 29;
      const Rows r = make_rows(t, n_rows, n, 11 + uint64_t(n) + uint64_t(t), 32);
      const std::vector<float> y0 = randn(size_t(n), 12 + uint64_t(n));
      for (const auto& idx : index_cases(n_rows, uint64_t(n) + 1)) {
        const std::vector<float> coef = randn(idx.size(), 13 + idx.size(), 0.5f);
        std::vector<float> ref = y0;
        sparse_rows_axpy_isa(Isa::Ref, t, r.bytes.data(), r.row_bytes, n_rows, n, idx.data(), coef.data(),
                             int64_t(idx.size()), ref.data());
        for (int64_t i = 0; i < n; ++i) {
          double want = y0[size_t(i)], l1 = std::fabs(want);
          for (size_t k = 0; k < idx.size(); ++k) {
            const double term = double(coef[k]) * r.values[size_t(idx[k] * n + i)];
            want += term;
            l1 += std::fabs(term);
          }
          ASSERT_NEAR(ref[size_t(i)], want, 1e-6 * l1 + 1e-7) << dtype_name(t) << " n=" << n << " i=" << i;
        }
        for (Isa isa : supported_isas()) {
          std::vector<float> y = y0;
          sparse_rows_axpy_isa(isa, t, r.bytes.data(), r.row_bytes, n_rows, n, idx.data(), coef.data(),
                               int64_t(idx.size()), y.data());
          EXPECT_TRUE(same_bits(y, ref)) << dtype_name(t) << " n=" << n << " " << isa_name(isa)
                                         << " n_idx=" << idx.size();
        }
      }
    }
}

// The dense ReGLU FFN in f64 from the dequantized weights, with the activations' rounding left
// out: the oracle the sparse result approaches within the Q8_0 activation rounding.
std::vector<double> dense_ffn(const Rows& gate, const Rows& up, const std::vector<float>& down_t,
                              const std::vector<float>& x, const std::vector<int32_t>& idx) {
  const int64_t n = gate.n;
  std::vector<double> y(size_t(n), 0.0);
  for (int32_t j : idx) {
    double g = 0, u = 0;
    for (int64_t i = 0; i < n; ++i) {
      g += double(gate.values[size_t(j * n + i)]) * x[size_t(i)];
      u += double(up.values[size_t(j * n + i)]) * x[size_t(i)];
    }
    const double a = std::max(g, 0.0) * u;
    for (int64_t i = 0; i < n; ++i) y[size_t(i)] += a * down_t[size_t(j * n + i)];
  }
  return y;
}

TEST(SparseFfnReglu, MatchesOracleAndIsTheSameForEveryThreadCountAndVariant) {
  for (DType t : kTypes)
    for (DType dt : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0}) {
      const int64_t n_embd = 96, n_ff = 300;
      const Rows gate = make_rows(t, n_ff, n_embd, 21), up = make_rows(t, n_ff, n_embd, 22);
      const Rows down_t = make_rows(dt, n_ff, n_embd, 23);
      const std::vector<float> x = randn(size_t(n_embd), 24);
      const SparseFfnWeights w{t, n_embd, n_ff, gate.bytes.data(), up.bytes.data(), dt, down_t.bytes.data()};
      for (const auto& idx : index_cases(n_ff, 25)) {
        std::vector<float> ref(size_t(n_embd), 7.0f);  // overwritten, also for empty idx
        sparse_ffn_reglu_isa(Isa::Ref, w, x.data(), idx.data(), int64_t(idx.size()), ref.data(), pool_of(1));
        const std::vector<double> want = dense_ffn(gate, up, down_t.values, x, idx);
        double scale = 1e-6;
        for (double v : want) scale = std::max(scale, std::fabs(v));
        // Quantized gate/up: x rounded to 8 bits per block (~0.4% of each dot, both dots).
        const double tol = is_quant(t) ? 0.03 * scale : 1e-4 * scale;
        for (int64_t i = 0; i < n_embd; ++i)
          EXPECT_NEAR(ref[size_t(i)], want[size_t(i)], tol) << dtype_name(t) << "/" << dtype_name(dt) << " i=" << i;
        for (Isa isa : supported_isas())
          for (int th : {1, 2}) {
            std::vector<float> y(size_t(n_embd), -3.0f);
            sparse_ffn_reglu_isa(isa, w, x.data(), idx.data(), int64_t(idx.size()), y.data(), pool_of(th));
            EXPECT_TRUE(same_bits(y, ref)) << dtype_name(t) << "/" << dtype_name(dt) << " " << isa_name(isa)
                                           << " threads=" << th << " n_idx=" << idx.size();
          }
      }
    }
}

// All neurons selected: the dense FFN through matmul (gate, up, ReGLU, down) within float order.
TEST(SparseFfnReglu, AllIndicesEqualDenseMatmulFfn) {
  const int64_t n_embd = 256, n_ff = 160;
  for (DType t : {DType::F16, DType::Q4_0}) {
    const Rows gate = make_rows(t, n_ff, n_embd, 31), up = make_rows(t, n_ff, n_embd, 32);
    const Rows down = make_rows(DType::F32, n_embd, n_ff, 33);  // [n_embd][n_ff]
    const std::vector<uint8_t> down_t = build_down_t(WeightView{DType::F32, n_ff, n_embd, down.bytes.data()}, DType::F32);
    const std::vector<float> x = randn(size_t(n_embd), 34);
    std::vector<float> g(static_cast<size_t>(n_ff)), u(static_cast<size_t>(n_ff)), yd(static_cast<size_t>(n_embd));
    matmul(WeightView{t, n_embd, n_ff, gate.bytes.data()}, x.data(), n_embd, 1, g.data(), n_ff, pool_of(1));
    matmul(WeightView{t, n_embd, n_ff, up.bytes.data()}, x.data(), n_embd, 1, u.data(), n_ff, pool_of(1));
    for (int64_t j = 0; j < n_ff; ++j) g[size_t(j)] = std::max(g[size_t(j)], 0.0f) * u[size_t(j)];
    matmul(WeightView{DType::F32, n_ff, n_embd, down.bytes.data()}, g.data(), n_ff, 1, yd.data(), n_embd, pool_of(1));
    std::vector<int32_t> idx(static_cast<size_t>(n_ff));
    std::iota(idx.begin(), idx.end(), 0);
    std::vector<float> y(static_cast<size_t>(n_embd));
    const SparseFfnWeights w{t, n_embd, n_ff, gate.bytes.data(), up.bytes.data(), DType::F32, down_t.data()};
    sparse_ffn_reglu(w, x.data(), idx.data(), n_ff, y.data(), pool_of(2));
    double scale = 0;
    for (float v : yd) scale = std::max(scale, double(std::fabs(v)));
    for (int64_t i = 0; i < n_embd; ++i) EXPECT_NEAR(y[size_t(i)], yd[size_t(i)], 2e-5 * scale) << dtype_name(t);
  }
}

TEST(SparseFfnDownT, TransposesAndRequantizes) {
  const int64_t n_embd = 64, n_ff = 96;
  for (DType src : kTypes) {
    const Rows down = make_rows(src, n_embd, n_ff, 41);
    const WeightView wv{src, n_ff, n_embd, down.bytes.data()};
    const std::vector<uint8_t> f32 = build_down_t(wv, DType::F32);
    ASSERT_EQ(f32.size(), size_t(n_ff * n_embd * 4));
    std::vector<float> col(static_cast<size_t>(n_embd));
    for (int64_t j = 0; j < n_ff; ++j) {
      for (int64_t i = 0; i < n_embd; ++i) col[size_t(i)] = down.values[size_t(i * n_ff + j)];
      EXPECT_EQ(std::memcmp(f32.data() + j * n_embd * 4, col.data(), size_t(n_embd) * 4), 0) << dtype_name(src);
      for (DType out : {DType::F16, DType::Q8_0, DType::Q4_0}) {
        const std::vector<uint8_t> t = build_down_t(wv, out);  // (rebuilt per column: small)
        const int64_t rb = dtype_row_bytes(out, n_embd);
        std::vector<uint8_t> want(static_cast<size_t>(rb));
        encode_row(out, col.data(), n_embd, want.data());
        EXPECT_EQ(std::memcmp(t.data() + j * rb, want.data(), size_t(rb)), 0) << dtype_name(src) << "->" << dtype_name(out);
      }
      if (j == 2) break;  // three columns per pair of types keep the test short
    }
  }
  EXPECT_THROW(build_down_t(WeightView{DType::F32, 64, 33, nullptr}, DType::Q8_0), Error);  // 33 not whole blocks
}

TEST(SparseFfnKernels, BadArgumentsThrow) {
  const Rows r = make_rows(DType::Q4_0, 8, 64, 51);
  const std::vector<float> x(64, 1.0f);
  std::vector<float> out(4), y(64);
  const float coef[4] = {1, 1, 1, 1};
  const int32_t hi[] = {0, 8}, neg[] = {-1}, ok[] = {7, 0};
  for (Isa isa : supported_isas()) {
    EXPECT_THROW(sparse_rows_dot_isa(isa, DType::Q4_0, r.bytes.data(), r.row_bytes, 8, 64, hi, 2, x.data(), out.data()), Error);
    EXPECT_THROW(sparse_rows_dot_isa(isa, DType::Q4_0, r.bytes.data(), r.row_bytes, 8, 64, neg, 1, x.data(), out.data()), Error);
    EXPECT_THROW(sparse_rows_axpy_isa(isa, DType::Q4_0, r.bytes.data(), r.row_bytes, 8, 64, hi, coef, 2, y.data()), Error);
    EXPECT_NO_THROW(sparse_rows_dot_isa(isa, DType::Q4_0, r.bytes.data(), r.row_bytes, 8, 64, ok, 2, x.data(), out.data()));
  }
  EXPECT_THROW(sparse_rows_dot(DType::Q4_0, r.bytes.data(), r.row_bytes, 8, 48, ok, 2, x.data(), out.data()), Error);
  EXPECT_THROW(sparse_rows_dot(DType::Q4_0, r.bytes.data(), 10, 8, 64, ok, 2, x.data(), out.data()), Error);
  EXPECT_THROW(sparse_rows_dot(DType::Q4_K, r.bytes.data(), r.row_bytes, 8, 256, ok, 2, x.data(), out.data()), Error);
  const SparseFfnWeights w{DType::Q4_0, 64, 8, r.bytes.data(), r.bytes.data(), DType::Q4_0, r.bytes.data()};
  EXPECT_THROW(sparse_ffn_reglu(w, x.data(), hi, 2, y.data(), pool_of(2)), Error);
  EXPECT_NO_THROW(sparse_ffn_reglu(w, x.data(), ok, 2, y.data(), pool_of(2)));
}

// ---- benchmark (issue #31): run with --gtest_also_run_disabled_tests -----------------------------
//
// TinyLlama-1.1B's FFN (n_embd 2048, n_ff 5632), one token, 22 layers' copies visited in turn
// (as a decode step does: no layer's weights are still in cache from the last visit; the 22
// layers' dense copies alone exceed this machine's 300 MiB L3). Dense:
// matmul() on gate and up (rows interleaved where the engine would interleave them), ReGLU,
// matmul() on down. Sparse: sparse_ffn_reglu on a random sorted idx. The gate rows' signs are
// flipped so that every gate output is positive: no neuron takes the ReLU's shortcut (a perfect
// predictor, the sparse path's worst case). Prints medians; asserts nothing about time.
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Negates row j's values (the f16 scale of every block, or every element).
void negate_row(DType t, uint8_t* row, int64_t n) {
  const int64_t bb = t == DType::Q8_0 ? 34 : 18;
  for (int64_t b = 0; b < n / 32; ++b) row[b * bb + 1] ^= 0x80;
}

TEST(DISABLED_SparseFfnBench, TinyLlamaShape) {
  const int64_t n_embd = 2048, n_ff = 5632, n_layers = 22;
  // Visits of each layer per figure (the reference kernels are slow: fewer).
  const int reps = std::strcmp(active_isa(), "ref") == 0 ? 1 : 4;
  std::printf("isa %s; %lld layers visited in turn, median of %lld sparse runs each (dense: all cases' rotations)\n",
              active_isa(), (long long)n_layers, (long long)(n_layers * reps));
  std::printf("%-5s %-4s %-3s %-7s %9s %9s %7s %9s %9s\n", "type", "down", "thr", "sparse", "dense_ms", "sparse_ms",
              "ratio", "dense_MB", "sparse_MB");
  for (DType t : {DType::Q4_0, DType::Q8_0}) {
    const int64_t rb = dtype_row_bytes(t, n_embd), drb_n = dtype_row_bytes(t, n_ff);
    const std::vector<float> x = randn(size_t(n_embd), 61);
    // One layer's weights, copied n_layers times.
    const Rows gate = make_rows(t, n_ff, n_embd, 62), up = make_rows(t, n_ff, n_embd, 63);
    const Rows down = make_rows(t, n_embd, n_ff, 64);  // [n_embd][n_ff]
    std::vector<uint8_t> gate_b = gate.bytes;
    {
      std::vector<float> g(static_cast<size_t>(n_ff));
      matmul_isa(Isa::Ref, WeightView{t, n_embd, n_ff, gate_b.data()}, x.data(), n_embd, 1, g.data(), n_ff, pool_of(2));
      for (int64_t j = 0; j < n_ff; ++j)
        if (g[size_t(j)] <= 0.0f) negate_row(t, gate_b.data() + j * rb, n_embd);
    }
    const WeightView down_v{t, n_ff, n_embd, down.bytes.data()};
    const std::vector<uint8_t> down_t_same = build_down_t(down_v, t), down_t_f16 = build_down_t(down_v, DType::F16);
    auto inter = [&](const WeightView& v) {
      if (!want_interleave16(v)) return std::vector<uint8_t>(static_cast<const uint8_t*>(v.data),
                                                              static_cast<const uint8_t*>(v.data) + v.n_out * v.row_bytes());
      std::vector<uint8_t> o(size_t(v.n_out * v.row_bytes()));
      interleave16(v, o.data());
      return o;
    };
    const bool il_gu = want_interleave16(WeightView{t, n_embd, n_ff, gate_b.data()});
    const bool il_d = want_interleave16(down_v);
    const std::vector<uint8_t> gate_i = inter(WeightView{t, n_embd, n_ff, gate_b.data()});
    const std::vector<uint8_t> up_i = inter(WeightView{t, n_embd, n_ff, up.bytes.data()});
    const std::vector<uint8_t> down_i = inter(down_v);
    struct Layer {
      std::vector<uint8_t> gate_i, up_i, down_i, gate, up, down_t_same, down_t_f16;
    };
    std::vector<Layer> layers(static_cast<size_t>(n_layers));
    for (Layer& l : layers)
      l = Layer{gate_i, up_i, down_i, gate_b, up.bytes, down_t_same, down_t_f16};
    const double dense_mb = double(2 * n_ff * rb + n_embd * drb_n) / 1e6;
    std::vector<float> g(static_cast<size_t>(n_ff)), u(static_cast<size_t>(n_ff));
    std::vector<float> yd(static_cast<size_t>(n_embd)), ys(static_cast<size_t>(n_embd));
    std::vector<int32_t> all(static_cast<size_t>(n_ff));
    std::iota(all.begin(), all.end(), 0);
    std::mt19937 rng(65);
    const double sparsities[] = {0.5, 0.8, 0.9, 0.95};
    const DType down_types[] = {t, DType::F16};
    auto now = [] { return std::chrono::steady_clock::now(); };
    auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    for (int th : {1, 2}) {
      ThreadPool& pool = pool_of(th);
      // Cases 0-7: sparse_ffn_reglu at (sparsity k / 2, down_t type k % 2); 8-11 (1 thread): the
      // gate dots and the down axpy alone at sparsity k - 8. Each case's rotation over the layers
      // follows a dense rotation (larger than the L3 cache), so every run reads its rows cold,
      // and dense and sparse alternate under the same load from the machine's other users.
      const int n_cases = th == 1 ? 12 : 8;
      std::vector<double> dt, st[12], st2[12];
      for (int r = 0; r < reps + 1; ++r)
        for (int c = 0; c < n_cases; ++c) {
          for (Layer& l : layers) {
            const auto t0 = now();
            matmul(WeightView{t, n_embd, n_ff, l.gate_i.data(), il_gu}, x.data(), n_embd, 1, g.data(), n_ff, pool);
            matmul(WeightView{t, n_embd, n_ff, l.up_i.data(), il_gu}, x.data(), n_embd, 1, u.data(), n_ff, pool);
            for (int64_t j = 0; j < n_ff; ++j) g[size_t(j)] = std::max(g[size_t(j)], 0.0f) * u[size_t(j)];
            matmul(WeightView{t, n_ff, n_embd, l.down_i.data(), il_d}, g.data(), n_ff, 1, yd.data(), n_embd, pool);
            if (r > 0) dt.push_back(ms(t0, now()));
          }
          const int si = c < 8 ? c / 2 : c - 8, di = c < 8 ? c % 2 : 0;
          const int64_t n_idx = int64_t(std::lround(double(n_ff) * (1.0 - sparsities[si])));
          for (Layer& l : layers) {
            std::shuffle(all.begin(), all.end(), rng);
            std::vector<int32_t> idx(all.begin(), all.begin() + n_idx);
            std::sort(idx.begin(), idx.end());
            if (c < 8) {
              const SparseFfnWeights w{t, n_embd, n_ff, l.gate.data(), l.up.data(), down_types[di],
                                       di == 0 ? l.down_t_same.data() : l.down_t_f16.data()};
              const auto s0 = now();
              sparse_ffn_reglu(w, x.data(), idx.data(), n_idx, ys.data(), pool);
              if (r > 0) st[c].push_back(ms(s0, now()));
            } else {
              std::vector<float> out(static_cast<size_t>(n_idx)), coef(static_cast<size_t>(n_idx), 0.01f);
              const auto a0 = now();
              sparse_rows_dot(t, l.gate.data(), rb, n_ff, n_embd, idx.data(), n_idx, x.data(), out.data());
              const auto a1 = now();
              sparse_rows_axpy(t, l.down_t_same.data(), rb, n_ff, n_embd, idx.data(), coef.data(), n_idx, ys.data());
              if (r > 0) {
                st[c].push_back(ms(a0, a1));
                st2[c].push_back(ms(a1, now()));
              }
            }
          }
        }
      const double dense_ms = median(dt);
      for (int c = 0; c < n_cases; ++c) {
        const int si = c < 8 ? c / 2 : c - 8, di = c < 8 ? c % 2 : 0;
        const int64_t n_idx = int64_t(std::lround(double(n_ff) * (1.0 - sparsities[si])));
        if (c < 8) {
          const double sparse_ms = median(st[c]);
          const double sparse_mb = double(n_idx * (2 * rb + dtype_row_bytes(down_types[di], n_embd))) / 1e6;
          std::printf("%-5s %-4s %-3d %-7.2f %9.3f %9.3f %7.2f %9.2f %9.2f\n", dtype_name(t), dtype_name(down_types[di]),
                      th, sparsities[si], dense_ms, sparse_ms, dense_ms / sparse_ms, dense_mb, sparse_mb);
        } else {
          std::printf("      (1 thread, %.2f: gate dots alone %.3f ms = %.1f GB/s, down axpy alone %.3f ms = %.1f GB/s; dense %.1f GB/s)\n",
                      sparsities[si], median(st[c]), double(n_idx * rb) / median(st[c]) / 1e6, median(st2[c]),
                      double(n_idx * rb) / median(st2[c]) / 1e6, dense_mb / dense_ms);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tern::test_sparse_ffn
