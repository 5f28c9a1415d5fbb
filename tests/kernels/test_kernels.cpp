// Every kernel variant this CPU can run against the references, over many shapes (ragged row
// lengths for float weights, every token-tile remainder, rows not a multiple of the row tile)
// with 1 and 2 threads:
//  - each variant (ref table included) vs matmul_ref, the dequantize + f32 oracle, within the
//    error that quantizing the activations to 8 bits can cause (a rigorous per-output bound);
//  - each SIMD variant vs the scalar ref table, which quantizes activations identically, within
//    float summation-order noise: this catches small errors the first bound would allow; the
//    ARM variants (and every variant for float weights) bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "kernels/kernel_iface.h"
#include "kernels/matmul.h"
#include "quant/quant_traits.h"

namespace tern {
namespace {

struct Weights {
  DType type;
  int64_t n_in, n_out;
  std::vector<uint8_t> data;
  std::vector<float> deq;  // [n_out][n_in], the values the weights stand for
  WeightView view() const { return {type, n_in, n_out, data.data()}; }
};

Weights make_weights(DType type, int64_t n_in, int64_t n_out, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const QuantTraits& q = *quant_traits(type);
  Weights w{type, n_in, n_out, {}, {}};
  const int64_t rb = dtype_row_bytes(type, n_in);
  w.data.resize(size_t(rb * n_out));
  w.deq.resize(size_t(n_in * n_out));
  std::vector<float> row(static_cast<size_t>(n_in));
  for (int64_t o = 0; o < n_out; ++o) {
    // Row scales spread over two decades so per-block scales matter.
    const float scale = std::pow(10.0f, float(o % 5) / 2.0f - 1.0f);
    for (auto& v : row) v = dist(rng) * scale;
    q.from_float(row.data(), w.data.data() + o * rb, n_in);
    q.to_float(w.data.data() + o * rb, w.deq.data() + o * n_in, n_in);
  }
  return w;
}

// x: [n_tokens][ldx]; blocks of 32 get different magnitudes, and one block of each token is
// all zeros (the quantizers' amax == 0 path).
std::vector<float> make_acts(int64_t n_in, int64_t n_tokens, int64_t ldx, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(size_t(ldx * n_tokens), 1e30f);  // padding must never be read
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t zero_block = n_in >= 64 ? (t * 7) % (n_in / 32) : -1;
    for (int64_t i = 0; i < n_in; ++i) {
      const float mag = std::pow(2.0f, float((i / 32 + t) % 7) - 3.0f);
      x[size_t(t * ldx + i)] = i / 32 == zero_block ? 0.0f : dist(rng) * mag;
    }
  }
  return x;
}

struct Case {
  DType type;
  int64_t n_in, n_out, n_tokens;
};

// Per-output error bound against the f32 oracle. Quantized weights see activations rounded to
// 8 bits per block: |x_i - x^_i| <= amax(block) / 254, so |y - y_ref| <= sum_i |w_i| * that.
// Both sides also carry f32 rounding, bounded loosely by 1e-5 * sum |w_i x_i|.
std::vector<double> oracle_bounds(const Weights& w, const std::vector<float>& x, int64_t ldx,
                                  int64_t n_tokens) {
  const QuantTraits& q = *quant_traits(w.type);
  const int64_t act_block = q.vec_dot_type == DType::Q8_K ? kQK_K : 32;
  const bool quantized = q.vec_dot_type != DType::F32;
  std::vector<double> bound(size_t(n_tokens * w.n_out));
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xt = x.data() + t * ldx;
    for (int64_t o = 0; o < w.n_out; ++o) {
      const float* wr = w.deq.data() + o * w.n_in;
      double mag = 0, qerr = 0;
      for (int64_t b = 0; b < w.n_in; b += act_block) {
        double amax = 0, wsum = 0;
        for (int64_t i = b; i < b + act_block && i < w.n_in; ++i) {
          amax = std::fmax(amax, std::fabs(xt[i]));
          wsum += std::fabs(wr[i]);
          mag += std::fabs(double(wr[i]) * xt[i]);
        }
        qerr += wsum * amax / 254.0;
      }
      bound[size_t(t * w.n_out + o)] = (quantized ? qerr * 1.001 : 0.0) + 1e-5 * mag + 1e-30;
    }
  }
  return bound;
}

// Summation-order noise between two variants with identical quantized inputs.
std::vector<double> reorder_bounds(const Weights& w, const std::vector<float>& x, int64_t ldx,
                                   int64_t n_tokens) {
  std::vector<double> bound(size_t(n_tokens * w.n_out));
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t o = 0; o < w.n_out; ++o) {
      double mag = 0;
      for (int64_t i = 0; i < w.n_in; ++i)
        mag += std::fabs(double(w.deq[size_t(o * w.n_in + i)]) * x[size_t(t * ldx + i)]);
      bound[size_t(t * w.n_out + o)] = 1.05 * 1e-5 * mag + 1e-30;
    }
  return bound;
}

// One pool per thread count for the whole binary (never destroyed): starting threads per test
// would dominate the small cases.
ThreadPool& shared_pool(int n_threads) {
  static ThreadPool* pools[3] = {nullptr, new ThreadPool(1), new ThreadPool(2)};
  return *pools[n_threads];
}

std::vector<Isa> isas_to_test() {
  std::vector<Isa> v;
  for (Isa i : kAllIsas)
    if (isa_supported(i)) v.push_back(i);
  return v;
}

// The ARM variants compute the reference's integer sums and float steps (kernels/arm).
bool is_arm(Isa isa) { return isa == Isa::Neon || isa == Isa::Dotprod || isa == Isa::I8mm; }

// Runs one case through every variant and both thread counts; y carries a guard band (ldy >
// n_out, and NaN-filled) to catch writes outside the [n_tokens][n_out] window.
// x_scale multiplies the activations (a power of two: exact).
void check_weights(const Weights& w, const Case& c, ThreadPool& pool, uint32_t seed, float x_scale = 1.0f) {
  const int64_t ldx = c.n_in + 3, ldy = c.n_out + 5;
  auto x = make_acts(c.n_in, c.n_tokens, ldx, seed + 1);
  for (int64_t t = 0; t < c.n_tokens; ++t)
    for (int64_t i = 0; i < c.n_in; ++i) x[size_t(t * ldx + i)] *= x_scale;
  std::vector<float> y_oracle(size_t(ldy * c.n_tokens), NAN);
  matmul_ref(w.view(), x.data(), ldx, c.n_tokens, y_oracle.data(), ldy, pool);
  const auto ob = oracle_bounds(w, x, ldx, c.n_tokens);
  const auto rb = reorder_bounds(w, x, ldx, c.n_tokens);

  std::vector<float> y_ref_isa;
  // BF16 by the BF16 dot (kernels/matmul.h: isa_bf16_dot) rounds each activation to bf16, a
  // relative error <= 2^-9: <= 2^-9 * sum |w_i x_i| per output (bounded here by 2^-8).
  std::vector<double> act_round(size_t(c.n_tokens * c.n_out));
  for (int64_t t = 0; t < c.n_tokens; ++t)
    for (int64_t o = 0; o < c.n_out; ++o) {
      double mag = 0;
      for (int64_t i = 0; i < c.n_in; ++i) mag += std::fabs(double(w.deq[size_t(o * c.n_in + i)]) * x[size_t(t * ldx + i)]);
      act_round[size_t(t * c.n_out + o)] = mag / 256.0;
    }
  // Compares a variant's y with the oracle and (but for the reference kernels' own) with theirs.
  // Float weights: one FMA per element in k order on every variant (kernels/matmul.h), so the
  // reference kernels' bits exactly, but for the BF16 dot.
  // exact_ref: a variant that gives the reference kernels' bits (TQ1_0 / TQ2_0 interleaved on AVX-512).
  const auto check = [&](const std::vector<float>& y, bool is_ref, Isa isa, bool exact_ref = false) {
    const bool dot = isa_bf16_dot(isa, c.type, c.n_in);
    const bool exact = (dtype_is_float(c.type) && !dot) || is_arm(isa) || exact_ref;
    int n_bad = 0;
    for (int64_t t = 0; t < c.n_tokens; ++t) {
      for (int64_t o = 0; o < ldy; ++o) {
        const size_t k = size_t(t * ldy + o);
        if (o >= c.n_out) {
          if (!std::isnan(y[k]) && n_bad++ < 3) ADD_FAILURE() << "wrote outside y at t " << t << " o " << o;
          continue;
        }
        const size_t kb = size_t(t * c.n_out + o);
        const double extra = dot ? act_round[kb] : 0.0;
        if (!(std::fabs(double(y[k]) - y_oracle[k]) <= ob[kb] + extra) && n_bad++ < 3)
          ADD_FAILURE() << "vs oracle at t " << t << " o " << o << ": " << y[k] << " vs "
                        << y_oracle[k] << " (bound " << ob[kb] << ")";
        if (!is_ref && exact && !(y[k] == y_ref_isa[k]) && n_bad++ < 3)
          ADD_FAILURE() << "vs ref kernels (bit for bit) at t " << t << " o " << o << ": " << y[k] << " vs "
                        << y_ref_isa[k];
        if (!is_ref && !(std::fabs(double(y[k]) - y_ref_isa[k]) <= rb[kb] + extra) && n_bad++ < 3)
          ADD_FAILURE() << "vs ref kernels at t " << t << " o " << o << ": " << y[k] << " vs "
                        << y_ref_isa[k] << " (bound " << rb[kb] << ")";
      }
    }
    return n_bad == 0;
  };
  for (Isa isa : isas_to_test()) {
    SCOPED_TRACE(::testing::Message() << dtype_name(c.type) << " isa " << isa_name(isa) << " n_in "
                                      << c.n_in << " n_out " << c.n_out << " n_tokens "
                                      << c.n_tokens << " threads " << pool.size());
    std::vector<float> y(size_t(ldy * c.n_tokens), NAN);
    matmul_isa(isa, w.view(), x.data(), ldx, c.n_tokens, y.data(), ldy, pool);
    const bool ok = check(y, isa == Isa::Ref, isa);
    if (isa == Isa::Ref) y_ref_isa = y;
    if (!ok) return;
  }
  // As models load them for the SIMD variants where those read them so (Q4_0, Q8_0, Q4_K, the
  // float types; Q6_K for AVX2; Q2_K, Q3_K, TQ1_0, TQ2_0 for AVX-512; only the float types for
  // ARM): interleaved by 16 rows.
  bool any_interleaved = false;
  for (Isa isa : kAllIsas) any_interleaved = any_interleaved || interleave16_for(isa, w.view());
  if (any_interleaved) {
    std::vector<uint8_t> packed(w.data.size());
    interleave16(w.view(), packed.data());
    WeightView wi = w.view();
    wi.data = packed.data();
    wi.interleaved16 = true;
    for (Isa isa : kAllIsas) {
      if (!isa_supported(isa) || !interleave16_for(isa, w.view())) continue;
      SCOPED_TRACE(::testing::Message() << dtype_name(c.type) << " isa " << isa_name(isa) << " interleaved, n_in "
                                        << c.n_in << " n_out " << c.n_out << " n_tokens " << c.n_tokens
                                        << " threads " << pool.size());
      std::vector<float> y(size_t(ldy * c.n_tokens), NAN);
      matmul_isa(isa, wi, x.data(), ldx, c.n_tokens, y.data(), ldy, pool);
      // TQ1_0 / TQ2_0's interleaved tiles: exact integer sums, then the reference's float steps
      if (!check(y, false, isa, c.type == DType::TQ1_0 || c.type == DType::TQ2_0)) return;
    }
  }
}

void check_case(const Case& c, ThreadPool& pool, uint32_t seed) {
  check_weights(make_weights(c.type, c.n_in, c.n_out, seed), c, pool, seed);
}

const DType kFloatTypes[] = {DType::F32, DType::F16, DType::BF16};
const DType kQ32Types[] = {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::MXFP4};
// (and llama.cpp's ternary types: super-blocks of 256 against Q8_K activations, as the K-quants)
const DType kKTypes[] = {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::TQ1_0, DType::TQ2_0};
const int64_t kOuts[] = {1, 3, 13, 17, 64};
// 9 and 28 leave a partial 16-token group big enough for the AVX-512 lanes (padded), 33 and
// 70 one that goes to the classic tiles. 6, 7, 8, 22 and 24 end in a group of at most 8 (Q8_0
// from 6, Q4_0 from 8 take it in 256-bit lanes); 15, 17 and 31 sit next to the group
// boundaries (decode batches).
const int64_t kTokens[] = {1, 2, 5, 6, 7, 8, 9, 15, 16, 17, 22, 24, 28, 31, 32, 33};

// TERN_KERNEL_TESTS=quick (the ARM64 stage of scripts/test.sh, where the tests run under
// qemu-user): a subset of the shapes that keeps a ragged row length, rows that are not a multiple
// of the row tiles, and odd and even token counts on both sides of 16.
bool quick_shapes() {
  const char* e = std::getenv("TERN_KERNEL_TESTS");
  return e && std::string(e) == "quick";
}
std::vector<int64_t> shapes(std::initializer_list<int64_t> all, std::initializer_list<int64_t> quick) {
  return quick_shapes() ? std::vector<int64_t>(quick) : std::vector<int64_t>(all);
}
std::vector<int64_t> token_counts() {
  return quick_shapes() ? std::vector<int64_t>{1, 2, 5, 17, 33} : std::vector<int64_t>(std::begin(kTokens), std::end(kTokens));
}
std::vector<int64_t> out_counts() {
  return quick_shapes() ? std::vector<int64_t>{3, 17, 64} : std::vector<int64_t>(std::begin(kOuts), std::end(kOuts));
}

class KernelsVsReference : public ::testing::TestWithParam<int> {};

TEST_P(KernelsVsReference, FloatTypes) {
  ThreadPool& pool = shared_pool(GetParam());
  uint32_t seed = 100;
  for (DType t : kFloatTypes)
    for (int64_t n_in : shapes({1, 7, 32, 64, 96, 172, 256, 512, 4096 + 32}, {7, 64, 172, 4096 + 32}))
      for (int64_t n_out : out_counts())
        for (int64_t n_tok : token_counts()) check_case({t, n_in, n_out, n_tok}, pool, seed++);
}

TEST_P(KernelsVsReference, BlocksOf32) {
  ThreadPool& pool = shared_pool(GetParam());
  uint32_t seed = 200;
  for (DType t : kQ32Types)
    for (int64_t n_in : shapes({32, 64, 96, 256, 512, 4096 + 32}, {32, 96, 4096 + 32}))
      for (int64_t n_out : out_counts())
        for (int64_t n_tok : token_counts()) check_case({t, n_in, n_out, n_tok}, pool, seed++);
}

TEST_P(KernelsVsReference, KQuants) {
  ThreadPool& pool = shared_pool(GetParam());
  uint32_t seed = 300;
  for (DType t : kKTypes)
    for (int64_t n_in : shapes({256, 512, 4096 + 256}, {256, 512}))
      for (int64_t n_out : out_counts())
        for (int64_t n_tok : token_counts()) check_case({t, n_in, n_out, n_tok}, pool, seed++);
}

// MXFP4 blocks of random bytes: every nibble, and exponents from the denormal scales (e = 0, 1:
// 2^-128, 2^-127) through 2^12, mixed within rows (the biased table and the scales rebuilt from
// their bits in the SIMD tiles, tiles_int.h); every fifth row all at e = 0..2. The activations are
// scaled by 2^90 so that those rows' results are normal floats, far above the bounds' 1e-30
// floor, and a wrong denormal scale shows.
TEST_P(KernelsVsReference, Mxfp4RawBlocks) {
  ThreadPool& pool = shared_pool(GetParam());
  uint32_t seed = 250;
  for (int64_t n_in : shapes({32, 96, 512, 4096 + 32}, {96, 512}))
    for (int64_t n_out : out_counts())
      for (int64_t n_tok : shapes({1, 2, 3, 5, 17}, {1, 5})) {
        std::mt19937 rng(seed);
        Weights w{DType::MXFP4, n_in, n_out, {}, {}};
        w.data.resize(size_t(n_in / 32 * 17 * n_out));
        for (auto& byte : w.data) byte = uint8_t(rng());
        const int64_t nb = n_in / 32;
        for (int64_t o = 0; o < n_out; ++o)
          for (int64_t b = 0; b < nb; ++b) {
            const uint32_t r = rng();
            // a row in 5 all tiny; else 1 block in 8 tiny, the others 2^-20 .. 2^12
            const bool tiny = o % 5 == 4 || r % 8 == 0;
            w.data[size_t((o * nb + b) * 17)] = uint8_t(tiny ? r / 8 % 3 : 108 + r / 8 % 33);
          }
        w.deq.resize(size_t(n_in * n_out));
        quant_traits(DType::MXFP4)->to_float(w.data.data(), w.deq.data(), n_in * n_out);
        check_weights(w, {DType::MXFP4, n_in, n_out, n_tok}, pool, seed++, 0x1p90f);
      }
}

// TQ1_0 / TQ2_0 blocks of random bytes: every byte value in every position, so TQ1_0's bytes
// that its packing never writes (they decode to trits all the same: quant_traits.h) and TQ2_0's
// code 3 (read as 2, ggml's way) included; the SIMD tiles' byte arithmetic (x86's byte multiply
// in 16-bit lanes, NEON's byte multiply and compares) must decode each as the reference does.
// Scales: random f16 of either sign between 2^-14 and 2^2, one block in 8 zero.
TEST_P(KernelsVsReference, TernaryRawBlocks) {
  ThreadPool& pool = shared_pool(GetParam());
  uint32_t seed = 270;
  for (DType t : {DType::TQ1_0, DType::TQ2_0})
    for (int64_t n_in : shapes({256, 768, 4096 + 256}, {256, 768}))
      for (int64_t n_out : out_counts())
        for (int64_t n_tok : shapes({1, 2, 3, 5, 17}, {1, 5})) {
          std::mt19937 rng(seed);
          const int64_t bb = t == DType::TQ1_0 ? 54 : 66, nb = n_in / kQK_K;
          Weights w{t, n_in, n_out, {}, {}};
          w.data.resize(size_t(nb * bb * n_out));
          for (auto& byte : w.data) byte = uint8_t(rng());
          for (int64_t b = 0; b < nb * n_out; ++b) {
            const uint32_t r = rng();
            const float d = r % 8 == 0 ? 0.0f : std::ldexp(r & 8 ? -1.0f : 1.0f, int(r / 16 % 17) - 14) * (1 + float(r >> 24) / 256);
            const uint16_t h = f32_to_fp16(d);
            std::memcpy(w.data.data() + (b + 1) * bb - 2, &h, 2);
          }
          w.deq.resize(size_t(n_in * n_out));
          quant_traits(t)->to_float(w.data.data(), w.deq.data(), n_in * n_out);
          check_weights(w, {t, n_in, n_out, n_tok}, pool, seed++);
        }
}

// Big enough for several row chunks per thread and full 16-token groups plus remainders.
TEST_P(KernelsVsReference, LargerShapes) {
  ThreadPool& pool = shared_pool(GetParam());
  uint32_t seed = 400;
  // quick: one type of each kernel family
  const bool quick = quick_shapes();
  auto in_quick = [](DType t) {
    return t == DType::F16 || t == DType::Q4_0 || t == DType::Q5_1 || t == DType::Q4_K || t == DType::Q6_K ||
           t == DType::MXFP4 || t == DType::TQ1_0;
  };
  for (DType t : {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                 DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::MXFP4, DType::TQ1_0,
                 DType::TQ2_0})
    if (!quick || in_quick(t)) check_case({t, 1024, 200, 70}, pool, seed++);
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K, DType::MXFP4})
    if (!quick || t == DType::F32) check_case({t, 1024, 208, 70}, pool, seed++);  // interleaved too
  // Float prefill: K blocks of 256 with a ragged last one, more than one 256-token block,
  // interleaved groups followed by tail rows (53 = 3 x 16 + 5).
  for (DType t : kFloatTypes)
    if (!quick || t == DType::BF16) check_case({t, 600, 53, 300}, pool, seed++);
}

INSTANTIATE_TEST_SUITE_P(Threads, KernelsVsReference, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "thread"; });

// The engine computes row ranges that start at multiples of 4 separately (matmul_rows) and
// relies on each row's result not depending on which rows share its tile.
TEST(KernelsDispatch, RowRangesMatchWholeMatrixBitForBit) {
  ThreadPool& pool = shared_pool(1);
  uint32_t seed = 500;
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::MXFP4,
                 DType::TQ1_0, DType::TQ2_0})
    for (int64_t n_tok : {1, 6, 8, 16, 24, 33}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " n_tokens " << n_tok);
      const int64_t n_in = 512, n_out = 29;
      const Weights w = make_weights(t, n_in, n_out, seed++);
      const auto x = make_acts(n_in, n_tok, n_in, seed++);
      std::vector<float> whole(size_t(n_out * n_tok)), parts(size_t(n_out * n_tok), NAN);
      matmul(w.view(), x.data(), n_in, n_tok, whole.data(), n_out, pool);
      for (const auto& [r0, r1] : {std::pair<int64_t, int64_t>{0, 4}, {4, 12}, {12, 16}, {16, 28},
                                   {28, 29}})
        matmul_rows(w.view(), x.data(), n_in, n_tok, parts.data(), n_out, r0, r1);
      for (size_t i = 0; i < whole.size(); ++i)
        ASSERT_EQ(whole[i], parts[i]) << "token " << i / size_t(n_out) << " row " << i % size_t(n_out);
    }
}

// From two tokens on, a token's Q4_0 / Q8_0 results do not depend on the batch around it: the
// AVX-512 table runs the full 16-token groups of large batches in its token-lane tiles and any
// other tokens in its row-lane tiles, whose float steps are the same (exact integer sums, then
// fma(cvt(s), dx * dw, acc) block by block); the other tables run every (row, token) alike. So
// a sequence decoding in a batch of 5 gets the bits it would get in a batch of 16 or 72. (A
// single token takes the wide GEMV tiles, whose lanes split each row's sum.) MXFP4 runs one tile
// family at every batch size (AVX-512's wide tiles, AVX2's 4-row ones), each token alike.
TEST(KernelsDispatch, Q32ResultsDoNotDependOnTheBatchFromTwoTokens) {
  ThreadPool& pool = shared_pool(2);
  uint32_t seed = 900;
  for (Isa isa : kAllIsas) {
    if (!isa_supported(isa)) continue;
    for (DType t : {DType::Q8_0, DType::Q4_0, DType::MXFP4}) {
      SCOPED_TRACE(::testing::Message() << isa_name(isa) << " " << dtype_name(t));
      // AVX-512 at 72 tokens: 4 token-lane groups + 8 row-lane tokens; smaller batches cross
      // both tables' thresholds (all row-lane below 64 tokens for Q4_0, below 32 for Q8_0).
      const int64_t n_in = 512, n_out = 37, n_all = 72;
      const Weights w = make_weights(t, n_in, n_out, seed++);
      const auto x = make_acts(n_in, n_all, n_in, seed++);
      std::vector<float> all(size_t(n_out * n_all));
      matmul_isa(isa, w.view(), x.data(), n_in, n_all, all.data(), n_out, pool);
      for (int64_t n_tok : {2, 3, 7, 15, 16, 17, 31, 33, 64, 65}) {
        for (int64_t t0 : {int64_t(0), n_all - n_tok}) {
          std::vector<float> part(size_t(n_out * n_tok), NAN);
          matmul_isa(isa, w.view(), x.data() + t0 * n_in, n_in, n_tok, part.data(), n_out, pool);
          for (int64_t i = 0; i < n_tok * n_out; ++i)
            ASSERT_EQ(part[size_t(i)], all[size_t(t0 * n_out + i)])
                << "batch " << n_tok << " from " << t0 << ": token " << t0 + i / n_out << " row " << i % n_out;
        }
      }
    }
  }
}

// interleave16 lays each group of 16 rows out over the byte range the group occupies as stored,
// independently of the others: interleaving a matrix in pieces of whole groups (the last piece
// with a float matrix's tail rows) gives the whole matrix's bytes. The model loader relies on it
// to return each piece's file pages as soon as it is copied (models/weight_loader.cpp).
TEST(KernelsDispatch, InterleavingInPiecesOfGroupsEqualsTheWhole) {
  uint32_t seed = 1700;
  for (DType type : {DType::Q4_0, DType::Q8_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K,
                     DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::MXFP4, DType::TQ1_0, DType::TQ2_0, DType::F16,
                     DType::BF16, DType::F32}) {
    const bool is_float = type == DType::F16 || type == DType::BF16 || type == DType::F32;
    const int64_t n_in = 512, n_out = is_float ? 16 * 7 + 5 : 16 * 7;
    SCOPED_TRACE(dtype_name(type));
    const Weights w = make_weights(type, n_in, n_out, seed++);
    std::vector<uint8_t> whole(w.data.size()), pieces(w.data.size(), 0xAB);
    interleave16(w.view(), whole.data());
    const int64_t rb = w.view().row_bytes();
    for (int64_t r0 : {int64_t(0), int64_t(32), int64_t(48)}) {
      const int64_t r1 = r0 == 0 ? 32 : r0 == 32 ? 48 : n_out;  // pieces of 2, 1 and the remaining groups (+ tail)
      WeightView piece = w.view();
      piece.n_out = r1 - r0;
      piece.data = w.data.data() + r0 * rb;
      interleave16(piece, pieces.data() + r0 * rb);
    }
    EXPECT_EQ(pieces, whole);
  }
}

// deinterleave16_row inverts interleave16 byte for byte (what matmul_ref and dequantize_row read
// interleaved weights through): every row of every interleavable type comes back as stored, on
// the quantizer's blocks and, for TQ1_0 / TQ2_0 (whose layout only moves bytes), on random bytes.
TEST(KernelsDispatch, InterleaveRoundTripsEveryRow) {
  uint32_t seed = 1750;
  for (DType type : {DType::Q4_0, DType::Q8_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K,
                     DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::MXFP4, DType::TQ1_0, DType::TQ2_0, DType::F16,
                     DType::BF16, DType::F32})
    for (bool random_bytes : {false, true}) {
      const bool ternary = type == DType::TQ1_0 || type == DType::TQ2_0;
      if (random_bytes && !ternary) continue;
      SCOPED_TRACE(::testing::Message() << dtype_name(type) << (random_bytes ? " random bytes" : ""));
      const bool is_float = type == DType::F16 || type == DType::BF16 || type == DType::F32;
      const int64_t n_in = 512, n_out = is_float ? 16 * 3 + 5 : 16 * 3;
      Weights w = make_weights(type, n_in, n_out, seed++);
      if (random_bytes) {
        std::mt19937 rng(seed++);
        for (auto& byte : w.data) byte = uint8_t(rng());
      }
      std::vector<uint8_t> packed(w.data.size());
      interleave16(w.view(), packed.data());
      WeightView wi = w.view();
      wi.data = packed.data();
      wi.interleaved16 = true;
      const int64_t rb = w.view().row_bytes();
      std::vector<uint8_t> row(static_cast<size_t>(rb));
      for (int64_t r = 0; r < n_out; ++r) {
        deinterleave16_row(wi, r, row.data());
        ASSERT_TRUE(std::equal(row.begin(), row.end(), w.data.begin() + r * rb)) << "row " << r;
      }
    }
}

// Float rows interleaved per 16-row group and element (kernels/matmul.h) give the bits of the rows as stored on either
// ISA (the same FMAs in the same order), for rows ranges that start anywhere as well. Q4_0 /
// Q8_0 rows interleaved by 16 give the bits of the rows as stored on AVX-512 (the K-quants' and
// Q4_1 / Q5_0 / Q5_1 / MXFP4's interleaved tiles differ from their stored rows' in float order:
// KernelsVsReference checks them against the reference kernels, and here the AVX2 and AVX-512
// tiles against each other; Q6_K is interleaved for AVX2 only; TQ1_0 / TQ2_0 for AVX-512 only,
// whose tiles give the reference kernels' bits): at two tokens and more those of the row-lane / token-lane tiles, for one token those of
// the same token in a batch of two. The AVX2 row-lane tiles on the interleaved rows compute the
// same exact integer block sums and the same float operations, so the same bits as well; and
// their results do not depend on the batch (one token alone equals the same token in a batch).
// By row ranges that start or end inside a 16-row group as well (for the selected variant: run
// with TERN_FORCE_ISA=avx2 for AVX2's, see tests/CMakeLists.txt); dequantize_row reads the same
// values back; the reference kernels refuse interleaved rows with a clear error.
TEST(KernelsDispatch, InterleavedEqualsRowsAsStored) {
  if (!isa_supported(Isa::Avx2)) GTEST_SKIP() << "no AVX2";
  const bool avx512 = isa_supported(Isa::Avx512);
  ThreadPool& pool = shared_pool(2);
  uint32_t seed = 1300;
  for (DType type : {DType::Q4_0, DType::Q8_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K,
                     DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::MXFP4, DType::TQ1_0, DType::TQ2_0, DType::F16,
                     DType::BF16, DType::F32})
  for (int64_t n_in : {40, 64, 512, 4096 + 32})
    for (int64_t n_out : {16, 48, 208}) {
      // TQ1_0 / TQ2_0 (interleaved for AVX-512 only): the reference kernels' bits on the stored rows
      const bool ternary = type == DType::TQ1_0 || type == DType::TQ2_0;
      const bool k_quant = type == DType::Q2_K || type == DType::Q3_K || type == DType::Q4_K || type == DType::Q5_K ||
                           type == DType::Q6_K || ternary;
      // interleaved tiles whose float steps differ from the stored rows' (checked against the
      // reference kernels in KernelsVsReference), equal between AVX2 and AVX-512
      const bool cross_isa = (k_quant && !ternary) || type == DType::Q4_1 || type == DType::Q5_0 || type == DType::Q5_1 ||
                             type == DType::MXFP4;
      const bool is_float = type == DType::F16 || type == DType::BF16 || type == DType::F32;
      if (k_quant && n_in % kQK_K != 0) continue;
      if (!is_float && n_in % 32 != 0) continue;
      SCOPED_TRACE(dtype_name(type));
      const Weights w = make_weights(type, n_in, n_out, seed++);
      std::vector<uint8_t> packed(w.data.size());
      interleave16(w.view(), packed.data());
      WeightView wi = w.view();
      wi.data = packed.data();
      wi.interleaved16 = true;
      for (int64_t r : {int64_t(0), n_out / 2 + 1, n_out - 1}) {
        std::vector<float> a(static_cast<size_t>(n_in)), b(static_cast<size_t>(n_in));
        dequantize_row(w.view(), r, a.data());
        dequantize_row(wi, r, b.data());
        ASSERT_EQ(a, b) << "dequantized row " << r;
      }
      for (int64_t n_tok : {1, 2, 3, 7, 16, 17, 33, 64, 72}) {
        SCOPED_TRACE(::testing::Message() << "n_in " << n_in << " n_out " << n_out << " tokens " << n_tok);
        // one token: compared with the first of a batch of two equal tokens
        const int64_t n_ref = n_tok == 1 ? 2 : n_tok;
        auto x = make_acts(n_in, n_ref, n_in, seed++);
        if (n_tok == 1) std::copy_n(x.begin(), n_in, x.begin() + n_in);
        std::vector<float> rows(size_t(n_out * n_ref)), k_quant_avx2;
        if (avx512) matmul_isa(ternary ? Isa::Ref : Isa::Avx512, w.view(), x.data(), n_in, n_ref, rows.data(), n_out, pool);
        for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
          if (!isa_supported(isa)) continue;
          SCOPED_TRACE(isa_name(isa));
          std::vector<float> inter(size_t(n_out * n_tok), NAN);
          if (!interleave16_for(isa, w.view())) {  // AVX-512 keeps Q6_K's stored rows, AVX2 Q3_K's
            EXPECT_THROW(matmul_isa(isa, wi, x.data(), n_in, n_tok, inter.data(), n_out, pool), Error);
            continue;
          }
          matmul_isa(isa, wi, x.data(), n_in, n_tok, inter.data(), n_out, pool);
          if (is_float) {  // the stored rows on the same ISA
            matmul_isa(isa, w.view(), x.data(), n_in, n_ref, rows.data(), n_out, pool);
            for (int64_t i = 0; i < n_tok * n_out; ++i)
              ASSERT_EQ(inter[size_t(i)], rows[size_t(i)]) << "token " << i / n_out << " row " << i % n_out;
          } else if (avx512 && !cross_isa) {
            for (int64_t i = 0; i < n_tok * n_out; ++i)
              ASSERT_EQ(inter[size_t(i)], rows[size_t(i)]) << "token " << i / n_out << " row " << i % n_out;
          }
          if (cross_isa && isa == Isa::Avx512 && !k_quant_avx2.empty()) {  // AVX2 and AVX-512 interleaved tiles agree
            for (int64_t i = 0; i < n_tok * n_out; ++i)
              ASSERT_EQ(inter[size_t(i)], k_quant_avx2[size_t(i)]) << "token " << i / n_out << " row " << i % n_out;
          }
          if (cross_isa && isa == Isa::Avx2) k_quant_avx2 = inter;
          for (int64_t t : {int64_t(0), n_tok - 1}) {  // a token alone, as in its batch
            std::vector<float> one(size_t(n_out), NAN);
            matmul_isa(isa, wi, x.data() + t * n_in, n_in, 1, one.data(), n_out, pool);
            for (int64_t r = 0; r < n_out; ++r)
              ASSERT_EQ(one[size_t(r)], inter[size_t(t * n_out + r)]) << "token " << t << " alone, row " << r;
          }
          if (selected_isa() != isa) continue;
          const int64_t step = is_float ? 10 : 12;  // floats: ranges inside 16-row groups too
          for (int64_t r0 = 0; r0 < n_out; r0 += step) {  // ranges across group boundaries
            const int64_t r1 = std::min(n_out, r0 + step);
            std::vector<float> part(inter.size(), NAN);
            matmul_rows(wi, x.data(), n_in, n_tok, part.data(), n_out, r0, r1);
            for (int64_t i = 0; i < n_tok * n_out; ++i) {
              const int64_t r = i % n_out;
              if (r >= r0 && r < r1) ASSERT_EQ(part[size_t(i)], inter[size_t(i)]) << "rows " << r0 << ".." << r1 << " at " << i;
              else ASSERT_TRUE(std::isnan(part[size_t(i)])) << "rows " << r0 << ".." << r1 << " wrote row " << r;
            }
          }
        }
      }
      const std::vector<float> x1 = make_acts(n_in, 1, n_in, seed++);
      std::vector<float> y1(static_cast<size_t>(n_out));
      EXPECT_THROW(matmul_isa(Isa::Ref, wi, x1.data(), n_in, 1, y1.data(), n_out, pool), Error);
    }
}

// The scalar integer paths are exact arithmetic on the dequantized values: dot_ref equals the
// f64 dot of the dequantized weight row and the dequantized activation row.
TEST(KernelsRef, IntegerDotIsDotOfDequantizedValues) {
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K,
                 DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::MXFP4, DType::TQ1_0, DType::TQ2_0}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t n_in = 1024;
    const Weights w = make_weights(t, n_in, 4, 7);
    const auto x = make_acts(n_in, 1, n_in, 8);
    const kern::ActLayout lay = kern::act_rows_layout(t, n_in, 1);
    std::vector<uint8_t> act(size_t(lay.bytes));
    kern::quantize_row_ref(lay, x.data(), n_in, act.data());
    const int bs = lay.kind == kern::ActKind::Q8_0Rows ? 32 : kQK_K;
    const auto* qs = reinterpret_cast<const int8_t*>(act.data());
    const auto* d = reinterpret_cast<const float*>(act.data() + lay.off_d);
    for (int64_t o = 0; o < 4; ++o) {
      double want = 0, mag = 0;
      for (int64_t i = 0; i < n_in; ++i) {
        const double xi = double(d[i / bs]) * qs[i];
        EXPECT_LE(std::fabs(xi - x[size_t(i)]), std::fabs(d[i / bs]) * 0.5 * (1 + 1e-6));
        want += double(w.deq[size_t(o * n_in + i)]) * xi;
        mag += std::fabs(double(w.deq[size_t(o * n_in + i)]) * xi);
      }
      const float got = kern::dot_ref(t, w.data.data() + o * dtype_row_bytes(t, n_in), n_in,
                                      act.data(), lay);
      EXPECT_NEAR(got, want, 1e-5 * mag) << "row " << o;
    }
  }
}

// The BF16 dot equals the exact FMA chain run on the activations rounded as its quantizer
// rounds them (the reference's quantize_row_ref of the BF16Pairs layout), within f32
// summation-order noise (vdpbf16ps adds two products per step, in an order of its own): a bound
// that a wrong pair, a wrong row or a missed K block far exceeds. Stored rows, interleaved
// rows, decode and prefill tiles, tail rows, ragged K blocks; one token alone gets its bits in
// any batch.
TEST(KernelsDispatch, Bf16DotEqualsTheFmaChainOnRoundedActivations) {
  if (!isa_bf16_dot(Isa::Avx512, DType::BF16, 64)) GTEST_SKIP() << "the BF16 dot is off here (no AVX512-BF16, an Intel CPU without TERN_BF16_DOT=1, or TERN_BF16_DOT=0; CTest kernels_bf16_dot_on sets 1)";
  ThreadPool& pool = shared_pool(2);
  uint32_t seed = 1700;
  for (int64_t n_in : {2, 62, 256, 600, 4096 + 2})
    for (int64_t n_out : {1, 16, 53, 208})
      for (int64_t n_tok : {1, 2, 5, 9, 13, 40}) {
        SCOPED_TRACE(::testing::Message() << "n_in " << n_in << " n_out " << n_out << " tokens " << n_tok);
        const Weights w = make_weights(DType::BF16, n_in, n_out, seed++);
        auto x = make_acts(n_in, n_tok, n_in, seed++);
        x[0] = 1e-40f;  // a denormal: the conversion treats it as zero
        const kern::ActLayout lay = kern::bf16_pairs_layout(n_in, 1);
        std::vector<float> xr(x.size());
        std::vector<uint8_t> row(size_t(lay.bytes));
        for (int64_t t = 0; t < n_tok; ++t) {
          kern::quantize_row_ref(lay, x.data() + t * n_in, n_in, row.data());
          for (int64_t i = 0; i < n_in; ++i) {
            uint16_t h;
            std::memcpy(&h, row.data() + 2 * i, 2);
            xr[size_t(t * n_in + i)] = bf16_to_f32(h);
          }
        }
        std::vector<float> want(size_t(n_out * n_tok));
        matmul_isa(Isa::Ref, w.view(), xr.data(), n_in, n_tok, want.data(), n_out, pool);
        std::vector<uint8_t> packed(w.data.size());
        WeightView wi = w.view();
        if (interleave16_for(Isa::Avx512, w.view())) {
          interleave16(w.view(), packed.data());
          wi.data = packed.data();
          wi.interleaved16 = true;
        }
        std::vector<float> first;
        for (const WeightView& v : {w.view(), wi}) {
          std::vector<float> got(size_t(n_out * n_tok), NAN);
          matmul_isa(Isa::Avx512, v, x.data(), n_in, n_tok, got.data(), n_out, pool);
          for (int64_t t = 0; t < n_tok; ++t)
            for (int64_t o = 0; o < n_out; ++o) {
              double mag = 0;
              for (int64_t i = 0; i < n_in; ++i)
                mag += std::fabs(double(w.deq[size_t(o * n_in + i)]) * xr[size_t(t * n_in + i)]);
              const size_t k = size_t(t * n_out + o);
              ASSERT_LE(std::fabs(double(got[k]) - want[k]), 1e-5 * mag + 1e-30)
                  << (v.interleaved16 ? "interleaved" : "stored") << " t " << t << " o " << o << ": " << got[k]
                  << " vs " << want[k];
            }
          if (first.empty()) first = got;
          else
            for (size_t k = 0; k < got.size(); ++k) ASSERT_EQ(got[k], first[k]) << "interleaved vs stored at " << k;
          std::vector<float> one(size_t(n_out), NAN);  // the last token alone
          matmul_isa(Isa::Avx512, v, x.data() + (n_tok - 1) * n_in, n_in, 1, one.data(), n_out, pool);
          for (int64_t o = 0; o < n_out; ++o) ASSERT_EQ(one[size_t(o)], got[size_t((n_tok - 1) * n_out + o)]) << "alone, row " << o;
        }
      }
}

// Every SIMD table quantizes activations into the Rows layouts bit for bit like the reference.
TEST(KernelsRef, SimdActivationQuantizersMatchReference) {
  for (Isa isa : kAllIsas) {
    if (isa == Isa::Ref || !isa_supported(isa)) continue;
    const kern::KernelTable& kt = isa == Isa::Avx2     ? kern::table_avx2()
                                  : isa == Isa::Avx512 ? kern::table_avx512()
                                  : isa == Isa::Neon   ? kern::table_neon()
                                  : isa == Isa::Dotprod ? kern::table_dotprod()
                                                        : kern::table_i8mm();
    for (DType t : {DType::Q8_0, DType::Q4_K}) {
      SCOPED_TRACE(::testing::Message() << isa_name(isa) << " " << dtype_name(t));
      const int64_t n_in = 2048;
      // Values with exact .5 ties after scaling and repeated maxima of both signs.
      auto x = make_acts(n_in, 1, n_in, 9);
      x[5] = 3.0f;
      x[6] = -3.0f;
      x[300] = -8.0f;
      x[301] = 8.0f;
      const kern::ActLayout lay = kern::act_rows_layout(t, n_in, 1);
      std::vector<uint8_t> want(size_t(lay.bytes)), got(size_t(lay.bytes));
      kern::quantize_row_ref(lay, x.data(), n_in, want.data());
      kt.quantize(lay, t, x.data(), n_in, n_in, 1, 0, 1, got.data());
      EXPECT_EQ(want, got);
    }
  }
  // The BF16 dot's activations: nearest even (ties both ways), denormals as zero, NaN quiet.
  if (isa_bf16_dot(Isa::Avx512, DType::BF16, 64)) {
    for (int64_t n_in : {2, 30, 64, 1000}) {
      auto x = make_acts(n_in, 1, n_in, 11);
      const uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0x00000001u, 0x80400000u, 0x7fc00001u, 0xff800000u};
      for (size_t i = 0; i < std::size(specials) && int64_t(i) < n_in; ++i) std::memcpy(&x[i], &specials[i], 4);
      const kern::ActLayout lay = kern::bf16_pairs_layout(n_in, 1);
      std::vector<uint8_t> want(size_t(lay.bytes), 0), got(size_t(lay.bytes), 0);
      kern::quantize_row_ref(lay, x.data(), n_in, want.data());
      kern::table_avx512().quantize(lay, DType::BF16, x.data(), n_in, n_in, 1, 0, 1, got.data());
      EXPECT_TRUE(std::equal(want.begin(), want.begin() + 2 * n_in, got.begin())) << "n_in " << n_in;
    }
  }
}

TEST(KernelsDispatch, SelectedIsaIsSupported) {
  const std::string name = active_isa();
  EXPECT_TRUE(name == "ref" || name == "avx2" || name == "avx512" || name == "neon" || name == "dotprod" ||
              name == "i8mm")
      << name;
  EXPECT_TRUE(isa_supported(selected_isa()));
  EXPECT_STREQ(active_isa(), isa_name(selected_isa()));
  // One family per CPU, each level implying the one below.
#if defined(__aarch64__)
  EXPECT_TRUE(isa_supported(Isa::Neon));
  EXPECT_FALSE(isa_supported(Isa::Avx2) || isa_supported(Isa::Avx512));
#else
  EXPECT_FALSE(isa_supported(Isa::Neon) || isa_supported(Isa::Dotprod) || isa_supported(Isa::I8mm));
#endif
  EXPECT_TRUE(!isa_supported(Isa::I8mm) || isa_supported(Isa::Dotprod));
  EXPECT_TRUE(!isa_supported(Isa::Avx512) || isa_supported(Isa::Avx2));
  if (!std::getenv("TERN_FORCE_ISA")) {
    // Without an override the best variant wins.
    const Isa best = isa_supported(Isa::Avx512) ? Isa::Avx512
                     : isa_supported(Isa::Avx2) ? Isa::Avx2
                     : isa_supported(Isa::I8mm) ? Isa::I8mm
                     : isa_supported(Isa::Dotprod) ? Isa::Dotprod
                     : isa_supported(Isa::Neon) ? Isa::Neon : Isa::Ref;
    EXPECT_EQ(selected_isa(), best);
  }
}

// The ARM tables read float weights interleaved by 16 rows (any row range, bit for bit the
// rows as stored) and quantized weights as stored; for the selected variant, matmul_rows over
// ranges that start and end inside 16-row groups gives matmul's bits.
TEST(KernelsDispatch, ArmFloatInterleavedRowRanges) {
  if (!is_arm(selected_isa())) GTEST_SKIP() << "not an ARM64 variant";
  const Isa isa = selected_isa();
  ThreadPool& pool = shared_pool(2);
  uint32_t seed = 2100;
  for (DType type : {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q4_K})
    for (int64_t n_in : {64, 256, 1024 + 256}) {
      if (!dtype_is_float(type) && n_in % kQK_K != 0) continue;
      SCOPED_TRACE(::testing::Message() << dtype_name(type) << " n_in " << n_in);
      const int64_t n_out = 53, n_tok = 5;
      const Weights w = make_weights(type, n_in, n_out, seed++);
      EXPECT_EQ(interleave16_for(isa, w.view()), dtype_is_float(type));
      if (!dtype_is_float(type)) continue;
      std::vector<uint8_t> packed(w.data.size());
      interleave16(w.view(), packed.data());
      WeightView wi = w.view();
      wi.data = packed.data();
      wi.interleaved16 = true;
      const auto x = make_acts(n_in, n_tok, n_in, seed++);
      std::vector<float> stored(size_t(n_out * n_tok)), inter(size_t(n_out * n_tok));
      matmul_isa(isa, w.view(), x.data(), n_in, n_tok, stored.data(), n_out, pool);
      matmul_isa(isa, wi, x.data(), n_in, n_tok, inter.data(), n_out, pool);
      ASSERT_EQ(stored, inter);
      for (int64_t r0 = 0; r0 < n_out; r0 += 10) {
        const int64_t r1 = std::min(n_out, r0 + 10);
        std::vector<float> part(inter.size(), NAN);
        matmul_rows(wi, x.data(), n_in, n_tok, part.data(), n_out, r0, r1);
        for (int64_t i = 0; i < n_tok * n_out; ++i) {
          const int64_t r = i % n_out;
          if (r >= r0 && r < r1) ASSERT_EQ(part[size_t(i)], inter[size_t(i)]) << "rows " << r0 << ".." << r1;
          else ASSERT_TRUE(std::isnan(part[size_t(i)])) << "rows " << r0 << ".." << r1 << " wrote row " << r;
        }
      }
    }
}

TEST(KernelsDispatch, MatmulUsesAKernelAndMatchesOracle) {
  ThreadPool& pool = shared_pool(2);
  const Weights w = make_weights(DType::Q4_K, 512, 40, 11);
  const auto x = make_acts(512, 3, 512, 12);
  std::vector<float> y(3 * 40), yr(3 * 40);
  matmul(w.view(), x.data(), 512, 3, y.data(), 40, pool);
  matmul_ref(w.view(), x.data(), 512, 3, yr.data(), 40, pool);
  const auto ob = oracle_bounds(w, x, 512, 3);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_LE(std::fabs(double(y[i]) - yr[i]), ob[i]) << i;
}

// Types without a fast kernel (Q8_K as a weight) still work through the reference.
TEST(KernelsDispatch, TypesWithoutKernelFallBackToReference) {
  ThreadPool& pool = shared_pool(2);
  const Weights w = make_weights(DType::Q8_K, 256, 5, 13);
  const auto x = make_acts(256, 2, 256, 14);
  std::vector<float> yr(10);
  matmul_ref(w.view(), x.data(), 256, 2, yr.data(), 5, pool);
  for (Isa isa : isas_to_test()) {
    EXPECT_FALSE(isa_has_kernel(isa, DType::Q8_K));
    std::vector<float> y(10);
    matmul_isa(isa, w.view(), x.data(), 256, 2, y.data(), 5, pool);
    EXPECT_EQ(y, yr) << isa_name(isa);
  }
}

TEST(KernelsDispatch, DequantizeRowMatchesTraits) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                 DType::Q5_1, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::MXFP4,
                 DType::TQ1_0, DType::TQ2_0}) {
    const Weights w = make_weights(t, 512, 3, 15);
    std::vector<float> row(512);
    dequantize_row(w.view(), 2, row.data());
    EXPECT_EQ(row, std::vector<float>(w.deq.begin() + 1024, w.deq.begin() + 1536)) << dtype_name(t);
  }
}

TEST(KernelsDispatch, RejectsRowsNotMultipleOfBlock) {
  ThreadPool& pool = shared_pool(1);
  std::vector<uint8_t> data(1000);
  std::vector<float> x(100), y(4);
  const WeightView w{DType::Q4_0, 48, 2, data.data()};
  EXPECT_THROW(matmul(w, x.data(), 48, 1, y.data(), 2, pool), Error);
}

// The override is read once per process, so these run in a fresh child (threadsafe death test
// style re-executes the binary for just this test).
TEST(KernelsDispatchDeathTest, ForceIsaOverrideAndErrors) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("TERN_FORCE_ISA", "ref", 1);
        std::exit(std::string(active_isa()) == "ref" ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  // In the child: `var` set to `value`, the variant chosen; exit 3 with the error's text.
  const auto choose_with = [](const char* var, const char* value) {
    setenv(var, value, 1);
    try {
      active_isa();
    } catch (const Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      std::exit(3);
    }
    std::exit(0);
  };
  EXPECT_EXIT(choose_with("TERN_FORCE_ISA", "sse9"), ::testing::ExitedWithCode(3),
              "TERN_FORCE_ISA=sse9: unknown kernel variant");
  EXPECT_EXIT(choose_with("TERN_BF16_DOT", "yes"), ::testing::ExitedWithCode(3),
              "TERN_BF16_DOT=yes: expected 0 .* or 1");
  for (Isa isa : kAllIsas) {
    if (isa_supported(isa)) continue;  // only testable on a CPU that lacks it
    EXPECT_THROW(matmul_isa(isa, WeightView{DType::F32, 4, 1, nullptr}, nullptr, 4, 1, nullptr, 1,
                            shared_pool(1)),
                 Error);
  }
}

}  // namespace
}  // namespace tern
