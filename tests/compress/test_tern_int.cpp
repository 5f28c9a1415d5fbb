// tern's integer kernels (TI8 for LLM.int8()/SmoothQuant, TQ for GPTQ/AWQ) against a float
// reference over ragged shapes, every ISA variant against the scalar reference, and LLM.int8()
// with every column routed to 16 bits against the float result.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "quant/quant_tern.h"
#include "kernels/tern_int.h"
#include "core/fp16.h"
#include "quant_test_util.h"

namespace tern {
namespace {

using namespace tern::testing;

struct Encoded {
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // [n_out, n_in] the values the format stores
};

Encoded encode(DType t, const std::vector<float>& w, int64_t n_in, int64_t n_out, const std::vector<int32_t>& cols) {
  Encoded e;
  const int64_t rb = dtype_row_bytes(t, n_in);
  e.bytes.resize(size_t(rb * n_out));
  e.deq.resize(size_t(n_in * n_out));
  for (int64_t r = 0; r < n_out; ++r) {
    if (is_ti8(t)) ti8_pack_row(t, w.data() + r * n_in, n_in, cols.data(), int64_t(cols.size()), e.bytes.data() + r * rb);
    else tern_type_from_float(t, w.data() + r * n_in, e.bytes.data() + r * rb, n_in);
    tern_type_to_float(t, e.bytes.data() + r * rb, e.deq.data() + r * n_in, n_in);
  }
  return e;
}

// |y - sum_j wq[j] x[j]| is bounded by the activation rounding: half a quantization step of the
// scale that covers x[j] (per token for TI8's int8 columns, per 32 for TQ), times |wq[j]|; TI8's
// 16-bit columns add f16 rounding of x.
double error_bound(DType t, const float* wq, const float* x, int64_t n_in, const std::vector<int32_t>& cols) {
  std::vector<bool> out(size_t(n_in), false);
  for (int32_t c : cols) out[size_t(c)] = true;
  double bound = 0;
  if (is_ti8(t)) {
    float amax = 0;
    for (int64_t j = 0; j < n_in; ++j)
      if (!out[size_t(j)]) amax = std::max(amax, std::fabs(x[j]));
    for (int64_t j = 0; j < n_in; ++j)
      bound += std::fabs(wq[j]) * (out[size_t(j)] ? std::fabs(x[j]) * 1e-3 : amax / 127.0 * 0.5);
  } else {
    for (int64_t b = 0; b < n_in / 32; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * b + j]));
      for (int j = 0; j < 32; ++j) bound += std::fabs(wq[32 * b + j]) * amax / 127.0 * 0.5;
    }
  }
  return bound * 1.001 + 1e-4;
}

struct Case {
  DType type;
  int64_t n_in;
  int n_outliers;
};

class TernIntKernel : public ::testing::TestWithParam<Case> {};

TEST_P(TernIntKernel, MatchesFloatReferenceOverRaggedShapes) {
  const Case c = GetParam();
  ThreadPool pool(2);
  // n_out 40 and 17 tokens: the 16-row tiles (AVX-512) with a partial last tile and a token
  // chunk past the first 16.
  for (int64_t n_out : {1, 3, 17, 40, 64}) {
    for (int64_t n_tok : {1, 2, 3, 5, 9, 17}) {
      const uint64_t seed = uint64_t(c.n_in * 1000 + n_out * 10 + n_tok);
      const std::vector<float> w = randn(size_t(c.n_in * n_out), seed, 0.05f);
      std::vector<float> x = randn(size_t(c.n_in * n_tok), seed + 1);
      std::vector<int32_t> cols;
      for (int i = 0; i < c.n_outliers; ++i) cols.push_back(int32_t((i * 7 + 3) % c.n_in));
      std::sort(cols.begin(), cols.end());
      cols.erase(std::unique(cols.begin(), cols.end()), cols.end());
      for (int32_t col : cols)
        for (int64_t t = 0; t < n_tok; ++t) x[size_t(t * c.n_in + col)] *= 40.0f;  // outlier features
      const Encoded e = encode(c.type, w, c.n_in, n_out, cols);
      const WeightView wv{c.type, c.n_in, n_out, e.bytes.data()};
      std::vector<float> y_ref_isa;
      for (Isa isa : supported_isas()) {
        // Output rows padded (ldy > n_out) to check strides.
        const int64_t ldy = n_out + 3;
        std::vector<float> y(size_t(ldy * n_tok), -7.0f);
        tern_int_matmul(isa, wv, x.data(), c.n_in, n_tok, y.data(), ldy, pool);
        for (int64_t t = 0; t < n_tok; ++t)
          for (int64_t r = 0; r < n_out; ++r) {
            const float* wr = e.deq.data() + r * c.n_in;
            const float* xt = x.data() + t * c.n_in;
            double ref = 0;
            for (int64_t j = 0; j < c.n_in; ++j) ref += double(wr[j]) * xt[j];
            const double got = y[size_t(t * ldy + r)];
            ASSERT_NEAR(got, ref, error_bound(c.type, wr, xt, c.n_in, cols))
                << dtype_name(c.type) << " isa " << isa_name(isa) << " n_in " << c.n_in << " n_out " << n_out
                << " tokens " << n_tok << " t " << t << " r " << r;
            if (isa == Isa::Ref) y_ref_isa.push_back(float(got));
          }
        if (isa != Isa::Ref) {
          // Integer sums are exact in both: only the float accumulation order differs.
          size_t i = 0;
          for (int64_t t = 0; t < n_tok; ++t)
            for (int64_t r = 0; r < n_out; ++r, ++i)
              ASSERT_NEAR(y[size_t(t * ldy + r)], y_ref_isa[i], 1e-4 * (1 + std::fabs(y_ref_isa[i])))
                  << dtype_name(c.type) << " " << isa_name(isa) << " vs ref";
        }
        for (int64_t t = 0; t < n_tok; ++t)
          for (int64_t r = n_out; r < ldy; ++r) ASSERT_EQ(y[size_t(t * ldy + r)], -7.0f) << "wrote past n_out";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, TernIntKernel,
    ::testing::Values(Case{DType::TI8, 32, 0}, Case{DType::TI8, 64, 1}, Case{DType::TI8, 96, 0},
                      Case{DType::TI8, 320, 9}, Case{DType::TI8_O10, 64, 7}, Case{DType::TI8_O16, 160, 40},
                      Case{DType::TI8_O24, 64, 64}, Case{DType::TI8_O12, 2048, 100}, Case{DType::TQ4_G64, 64, 0},
                      Case{DType::TQ4_G64, 192, 0}, Case{DType::TQ4_G128, 128, 0}, Case{DType::TQ4_G128, 384, 0},
                      Case{DType::TQ3_G64, 64, 0}, Case{DType::TQ3_G128, 256, 0}, Case{DType::TQ8_G64, 192, 0},
                      Case{DType::TQ8_G128, 128, 0}),
    [](const ::testing::TestParamInfo<Case>& i) {
      return std::string(dtype_name(i.param.type)) + "_" + std::to_string(i.param.n_in) + "_o" +
             std::to_string(i.param.n_outliers);
    });

// With every column an outlier, LLM.int8() computes in 16 bits only: the result is the float
// product of f16-rounded weights and activations (f32 accumulation), i.e. the float result up
// to 16-bit rounding.
TEST(LlmInt8, AllColumnsIn16BitEqualsFloatUpTo16BitRounding) {
  ThreadPool pool(2);
  for (int64_t n_in : {32, 96, 256}) {
    const int64_t n_out = 11, n_tok = 5;
    const std::vector<float> w = randn(size_t(n_in * n_out), 7 + n_in, 0.1f);
    const std::vector<float> x = randn(size_t(n_in * n_tok), 8 + n_in, 3.0f);
    std::vector<int32_t> cols(static_cast<size_t>(n_in));
    for (int64_t j = 0; j < n_in; ++j) cols[size_t(j)] = int32_t(j);
    std::vector<uint16_t> wo(static_cast<size_t>(n_in * n_out));
    for (size_t i = 0; i < wo.size(); ++i) wo[i] = f32_to_fp16(w[i]);
    std::vector<int8_t> wi8(size_t(n_in * n_out), 99);  // ignored: every column is 16-bit
    std::vector<float> dw(size_t(n_out), 0.5f);
    for (Isa isa : supported_isas()) {
      std::vector<float> y(static_cast<size_t>(n_out * n_tok));
      llm_int8_matmul(isa, wi8.data(), dw.data(), cols.data(), n_in, wo.data(), n_in, n_out, x.data(), n_in, n_tok,
                      y.data(), n_out, pool);
      for (int64_t t = 0; t < n_tok; ++t)
        for (int64_t r = 0; r < n_out; ++r) {
          double exact16 = 0, exact = 0, mag = 0;
          for (int64_t j = 0; j < n_in; ++j) {
            const double a = fp16_to_f32(f32_to_fp16(w[size_t(r * n_in + j)]));
            const double b = fp16_to_f32(f32_to_fp16(x[size_t(t * n_in + j)]));
            exact16 += a * b;
            exact += double(w[size_t(r * n_in + j)]) * x[size_t(t * n_in + j)];
            mag += std::fabs(a * b);
          }
          const double got = y[size_t(t * n_out + r)];
          // f32 accumulation of the f16 products...
          EXPECT_NEAR(got, exact16, mag * 1e-6 + 1e-6) << isa_name(isa);
          // ...which is the float result up to the two 16-bit roundings (2^-11 relative each).
          EXPECT_NEAR(got, exact, mag * 2.0 * std::ldexp(1.0, -11) + 1e-6) << isa_name(isa);
        }
    }
    // The stored form (TI8_O24 holds every column) gives the same numbers.
    const int64_t rb = dtype_row_bytes(DType::TI8_O24, n_in);
    std::vector<uint8_t> bytes(static_cast<size_t>(rb * n_out));
    for (int64_t r = 0; r < n_out; ++r)
      ti8_pack_row(DType::TI8_O24, w.data() + r * n_in, n_in, cols.data(), n_in, bytes.data() + r * rb);
    std::vector<float> y1(static_cast<size_t>(n_out * n_tok)), y2(size_t(n_out * n_tok));
    llm_int8_matmul(Isa::Ref, wi8.data(), dw.data(), cols.data(), n_in, wo.data(), n_in, n_out, x.data(), n_in, n_tok,
                    y1.data(), n_out, pool);
    tern_int_matmul(Isa::Ref, WeightView{DType::TI8_O24, n_in, n_out, bytes.data()}, x.data(), n_in, n_tok, y2.data(),
                    n_out, pool);
    EXPECT_EQ(y1, y2);
  }
}

TEST(TernFormats, PackUnpackRoundTrip) {
  for (DType t : {DType::TQ4_G64, DType::TQ4_G128, DType::TQ3_G64, DType::TQ3_G128, DType::TQ8_G64, DType::TQ8_G128}) {
    const TqFormat f = tq_format(t);
    EXPECT_EQ(f.block_bytes(), dtype_info(t).block_bytes) << dtype_name(t);
    std::vector<uint8_t> q(static_cast<size_t>(f.group)), back(size_t(f.group)), blk(size_t(f.block_bytes()));
    for (int j = 0; j < f.group; ++j) q[size_t(j)] = uint8_t((j * 5 + 3) % (f.maxq() + 1));
    tq_pack_group(f, q.data(), 0.125f, f.maxq() / 2, blk.data());
    float d;
    int z;
    tq_unpack_group(f, blk.data(), back.data(), &d, &z);
    EXPECT_EQ(q, back) << dtype_name(t);
    EXPECT_EQ(d, 0.125f);
    EXPECT_EQ(z, f.maxq() / 2);
  }
  // TI8 capacities: TI8 holds n_in/32 - 1 outlier columns, TI8_O24 every column.
  EXPECT_EQ(ti8_capacity(DType::TI8, 64), 1);
  EXPECT_EQ(ti8_capacity(DType::TI8, 4096), 127);
  EXPECT_GE(ti8_capacity(DType::TI8_O24, 32), 32);
  EXPECT_EQ(ti8_type_for(64, 6), DType::TI8_O10);
  EXPECT_EQ(ti8_type_for(64, 0), DType::TI8);
  EXPECT_FALSE(ti8_type_for(172, 0).has_value());
  for (DType t : {DType::TI8, DType::TI8_O9, DType::TI8_O10, DType::TI8_O12, DType::TI8_O16, DType::TI8_O24})
    EXPECT_EQ(dtype_row_bytes(t, 64), 64 + 2 * ti8_tail(t)) << dtype_name(t);
}

}  // namespace
}  // namespace tern
