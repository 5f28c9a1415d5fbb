// The 2:4 sparse formats (quant/quant_sparse.h) and their kernels (kernels/sparse24.h): the
// codec (exact storage of 2:4 rows, magnitude selection of dense ones, the documented bit
// layout, bad row lengths), and every kernel variant this CPU runs against the scalar
// reference (summation-order noise only) and against the dense dequantized matmul (the
// activation rounding of ts24_q8), over shapes with partial 4-block quads, odd n_out, token
// counts 1, 3, 17, 64, 1 and 2 threads, strided x and y, and arbitrary block bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "kernels/matmul.h"
#include "kernels/sparse24.h"
#include "quant/quant_sparse.h"
#include "quant/quant_traits.h"

namespace tern {
namespace {

constexpr DType kTypes[] = {DType::TS24_Q8, DType::TS24_F16};

ThreadPool& pool_of(int n_threads) {
  static ThreadPool* pools[3] = {nullptr, new ThreadPool(1), new ThreadPool(2)};
  return *pools[n_threads];
}

// A row pruned to 2:4: in each group of 4 the columns (g * 5 + r) % 4 and one more hold
// f16-representable values, one group in 5 keeps a single nonzero, one in 7 none.
std::vector<float> pruned_row(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> w(size_t(n), 0.0f);
  for (int64_t g = 0; g < n / 4; ++g) {
    if (g % 7 == 3) continue;
    const int a = int(rng() % 4), b = (a + 1 + int(rng() % 3)) % 4;
    w[size_t(4 * g + a)] = fp16_to_f32(f32_to_fp16(dist(rng)));
    if (g % 5 != 1) w[size_t(4 * g + b)] = fp16_to_f32(f32_to_fp16(dist(rng)));
  }
  return w;
}

std::vector<float> decode(DType t, const std::vector<uint8_t>& row, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  quant_traits(t)->to_float(row.data(), out.data(), n);
  return out;
}

std::vector<uint8_t> encode(DType t, const std::vector<float>& w) {
  const int64_t n = int64_t(w.size());
  std::vector<uint8_t> row(size_t(dtype_row_bytes(t, n)));
  quant_traits(t)->from_float(w.data(), row.data(), n);
  return row;
}

TEST(Sparse24Codec, TypesAreRegistered) {
  for (DType t : kTypes) {
    const QuantTraits* q = quant_traits(t);
    ASSERT_NE(q, nullptr);
    EXPECT_TRUE(q->to_float && q->from_float);
    EXPECT_EQ(q->block_size, 32);
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
  }
  EXPECT_EQ(uint32_t(DType::TS24_Q8), 1020u);
  EXPECT_EQ(uint32_t(DType::TS24_F16), 1021u);
  EXPECT_STREQ(dtype_name(DType::TS24_Q8), "ts24_q8");
  EXPECT_STREQ(dtype_name(DType::TS24_F16), "ts24_f16");
  EXPECT_EQ(dtype_row_bytes(DType::TS24_Q8, 2048), 2048 / 32 * 22);
  EXPECT_EQ(dtype_row_bytes(DType::TS24_F16, 2048), 2048 / 32 * 36);
  EXPECT_EQ(quant_traits(DType::TS24_Q8)->vec_dot_type, DType::Q8_0);
}

TEST(Sparse24Codec, PrunedRowIsExactInF16) {
  std::mt19937 rng(1);
  for (int64_t n : {32, 96, 2048}) {
    const std::vector<float> w = pruned_row(n, rng);
    const std::vector<float> back = decode(DType::TS24_F16, encode(DType::TS24_F16, w), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(back[size_t(i)], w[size_t(i)]) << "n " << n << " column " << i;
  }
}

TEST(Sparse24Codec, PrunedRowInQ8IsWithinRounding) {
  std::mt19937 rng(2);
  const int64_t n = 1024;
  const std::vector<float> w = pruned_row(n, rng);
  const std::vector<float> back = decode(DType::TS24_Q8, encode(DType::TS24_Q8, w), n);
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0.0f;
    for (int64_t i = 32 * b; i < 32 * b + 32; ++i) amax = std::max(amax, std::fabs(w[size_t(i)]));
    const float d = amax / 127.0f;
    for (int64_t i = 32 * b; i < 32 * b + 32; ++i) {
      if (w[size_t(i)] == 0.0f) {
        ASSERT_EQ(back[size_t(i)], 0.0f) << "column " << i;  // the pattern is kept
      }
      ASSERT_LE(std::fabs(back[size_t(i)] - w[size_t(i)]), 0.5f * d * 1.002f + 1e-12f) << "column " << i;
    }
  }
}

TEST(Sparse24Codec, DenseRowKeepsTheTwoLargestOfEachGroup) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t n = 512;
  std::vector<float> w(static_cast<size_t>(n));
  for (auto& v : w) v = fp16_to_f32(f32_to_fp16(dist(rng)));
  // Ties: |1| three times -> the two lower columns; equal magnitudes of opposite signs too.
  const float tie[8] = {1.0f, -1.0f, 1.0f, 0.5f, 0.25f, 2.0f, -2.0f, 2.0f};
  std::copy(tie, tie + 8, w.begin());
  const std::vector<float> back = decode(DType::TS24_F16, encode(DType::TS24_F16, w), n);
  for (int64_t g = 0; g < n / 4; ++g) {
    int order[4] = {0, 1, 2, 3};
    std::stable_sort(order, order + 4,
                     [&](int a, int b) { return std::fabs(w[size_t(4 * g + a)]) > std::fabs(w[size_t(4 * g + b)]); });
    for (int j = 0; j < 4; ++j) {
      const bool kept = j == order[0] || j == order[1];
      EXPECT_EQ(back[size_t(4 * g + j)], kept ? w[size_t(4 * g + j)] : 0.0f) << "group " << g << " column " << j;
    }
  }
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -1.0f);
  EXPECT_EQ(back[2], 0.0f);
  EXPECT_EQ(back[4], 0.0f);
  EXPECT_EQ(back[5], 2.0f);
  EXPECT_EQ(back[6], -2.0f);
  EXPECT_EQ(back[7], 0.0f);
  // The q8 encoding keeps the same columns.
  const std::vector<float> back8 = decode(DType::TS24_Q8, encode(DType::TS24_Q8, w), n);
  for (int64_t i = 0; i < n; ++i)
    if (back[size_t(i)] == 0.0f) {
      EXPECT_EQ(back8[size_t(i)], 0.0f) << "column " << i;
    }
}

TEST(Sparse24Codec, BlockLayoutIsTheDocumentedOne) {
  // Value k at column 4 * (k / 2) + p_k, p_k at bit 8 * (k % 4) + 2 * (k / 4) of idx.
  std::vector<uint8_t> blk(36, 0);
  uint8_t pos[16];
  uint32_t idx = 0;
  for (int k = 0; k < 16; ++k) {
    pos[k] = uint8_t((k * 7 + k / 3) % 4);
    idx |= uint32_t(pos[k]) << (8 * (k % 4) + 2 * (k / 4));
    const uint16_t h = f32_to_fp16(float(k + 1));
    std::memcpy(blk.data() + 2 * k, &h, 2);
  }
  EXPECT_EQ(ts24_pack_idx(pos), idx);
  std::memcpy(blk.data() + 32, &idx, 4);
  std::vector<float> want(32, 0.0f);
  for (int k = 0; k < 16; ++k) want[size_t(4 * (k / 2) + pos[k])] += float(k + 1);
  EXPECT_EQ(decode(DType::TS24_F16, blk, 32), want);
  // ts24_q8: d at 0, q at 2, idx at 18.
  std::vector<uint8_t> q8(22, 0);
  const uint16_t d = f32_to_fp16(0.5f);
  std::memcpy(q8.data(), &d, 2);
  for (int k = 0; k < 16; ++k) q8[size_t(2 + k)] = uint8_t(int8_t(k - 8));
  std::memcpy(q8.data() + 18, &idx, 4);
  std::fill(want.begin(), want.end(), 0.0f);
  for (int k = 0; k < 16; ++k) want[size_t(4 * (k / 2) + pos[k])] += 0.5f * float(k - 8);
  EXPECT_EQ(decode(DType::TS24_Q8, q8, 32), want);
}

TEST(Sparse24Codec, RowsNotAMultipleOf32FailClearly) {
  for (DType t : kTypes) {
    std::vector<float> w(48, 1.0f);
    std::vector<uint8_t> row(256);
    try {
      ts24_encode_row(t, w.data(), 48, row.data(), "blk.0.ffn_up.weight");
      FAIL() << "no error for n_in 48";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("blk.0.ffn_up.weight"), std::string::npos) << msg;
      EXPECT_NE(msg.find("multiple of 32"), std::string::npos) << msg;
      EXPECT_NE(msg.find("48"), std::string::npos) << msg;
    }
    EXPECT_THROW(quant_traits(t)->to_float(row.data(), w.data(), 48), Error);
    EXPECT_EQ(dtype_row_bytes(t, 48), -1);
    // The kernels refuse such a weight before reading it.
    const WeightView v{t, 48, 4, row.data()};
    std::vector<float> x(48, 1.0f), y(4);
    for (Isa isa : kAllIsas) {
      if (!isa_supported(isa)) continue;
      try {
        matmul_isa(isa, v, x.data(), 48, 1, y.data(), 4, pool_of(1));
        FAIL() << "no error for n_in 48 on " << isa_name(isa);
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("[4, 48]"), std::string::npos) << e.what();
      }
    }
  }
}

struct Mat {
  DType type;
  int64_t n_in, n_out;
  std::vector<uint8_t> data;
  std::vector<float> deq;  // [n_out][n_in]
  WeightView view() const { return {type, n_in, n_out, data.data()}; }
};

// Dense random rows (the encoder prunes them), row scales over two decades. With `raw`, random
// block bytes instead (any positions, repeated ones included; q8 values down to -128), with
// sane f16 scales.
Mat make_mat(DType t, int64_t n_in, int64_t n_out, uint32_t seed, bool raw = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Mat m{t, n_in, n_out, {}, {}};
  const int64_t rb = dtype_row_bytes(t, n_in);
  m.data.resize(size_t(rb * n_out));
  m.deq.resize(size_t(n_in * n_out));
  std::vector<float> row(static_cast<size_t>(n_in));
  for (int64_t o = 0; o < n_out; ++o) {
    uint8_t* dst = m.data.data() + o * rb;
    if (raw) {
      for (int64_t i = 0; i < rb; ++i) dst[i] = uint8_t(rng());
      const int64_t bb = dtype_info(t).block_bytes;
      for (int64_t b = 0; b < n_in / 32; ++b) {
        if (t == DType::TS24_Q8) {
          const uint16_t d = f32_to_fp16(0.01f * float(1 + b % 5));
          std::memcpy(dst + b * bb, &d, 2);
        } else {
          for (int k = 0; k < 16; ++k) {
            const uint16_t h = f32_to_fp16(dist(rng));
            std::memcpy(dst + b * bb + 2 * k, &h, 2);
          }
        }
      }
    } else {
      const float scale = std::pow(10.0f, float(o % 5) / 2.0f - 1.0f);
      for (auto& v : row) v = dist(rng) * scale;
      quant_traits(t)->from_float(row.data(), dst, n_in);
    }
    quant_traits(t)->to_float(dst, m.deq.data() + o * n_in, n_in);
  }
  return m;
}

std::vector<float> make_x(int64_t n_in, int64_t n_tokens, int64_t ldx, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(ldx * n_tokens), 1e30f);  // padding must never be read
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t zero_block = n_in >= 64 ? (t * 7) % (n_in / 32) : -1;
    for (int64_t i = 0; i < n_in; ++i) {
      const float mag = std::pow(2.0f, float((i / 32 + t) % 7) - 3.0f);
      x[size_t(t * ldx + i)] = i / 32 == zero_block ? 0.0f : dist(rng) * mag;
    }
  }
  return x;
}

// Per output: mag = sum |w_i x_i| (summation-order noise scales with it) and, for ts24_q8, the
// bound of the activations' 8-bit rounding: sum over blocks of sum |w_i| * amax / 254.
void bounds(const Mat& m, const std::vector<float>& x, int64_t ldx, int64_t n_tokens, std::vector<double>& mag,
            std::vector<double>& qerr) {
  mag.assign(size_t(n_tokens * m.n_out), 0.0);
  qerr.assign(size_t(n_tokens * m.n_out), 0.0);
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t o = 0; o < m.n_out; ++o) {
      const float* w = m.deq.data() + o * m.n_in;
      const float* xt = x.data() + t * ldx;
      double s = 0, q = 0;
      for (int64_t b = 0; b < m.n_in; b += 32) {
        double amax = 0, wsum = 0;
        for (int64_t i = b; i < b + 32; ++i) {
          amax = std::fmax(amax, std::fabs(xt[i]));
          wsum += std::fabs(w[i]);
          s += std::fabs(double(w[i]) * xt[i]);
        }
        q += wsum * amax / 254.0;
      }
      mag[size_t(t * m.n_out + o)] = s;
      qerr[size_t(t * m.n_out + o)] = q;
    }
}

void check_variants(const Mat& m, int64_t n_tokens, uint32_t seed) {
  const int64_t ldx = m.n_in + 5, ldy = m.n_out + 3;
  const std::vector<float> x = make_x(m.n_in, n_tokens, ldx, seed);
  std::vector<double> mag, qerr;
  bounds(m, x, ldx, n_tokens, mag, qerr);
  const bool q8 = m.type == DType::TS24_Q8;
  // The dense oracle: the dequantized rows in f32.
  std::vector<float> oracle(size_t(n_tokens * ldy), 0.0f);
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t o = 0; o < m.n_out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < m.n_in; ++i) s += double(m.deq[size_t(o * m.n_in + i)]) * x[size_t(t * ldx + i)];
      oracle[size_t(t * ldy + o)] = float(s);
    }
  std::vector<float> ref(size_t(n_tokens * ldy), -7.0f);
  matmul_isa(Isa::Ref, m.view(), x.data(), ldx, n_tokens, ref.data(), ldy, pool_of(1));
  const std::string what = std::string(dtype_name(m.type)) + " [" + std::to_string(m.n_out) + ", " +
                           std::to_string(m.n_in) + "] x " + std::to_string(n_tokens) + " tokens";
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t o = 0; o < m.n_out; ++o) {
      const size_t i = size_t(t * m.n_out + o);
      const double tol = (q8 ? qerr[i] * 1.001 : 0.0) + 2e-5 * mag[i] + 1e-30;
      ASSERT_NEAR(ref[size_t(t * ldy + o)], oracle[size_t(t * ldy + o)], tol) << what << ", ref vs dense, token " << t
                                                                              << " row " << o;
    }
  for (Isa isa : kAllIsas) {
    if (isa == Isa::Ref || !isa_supported(isa)) continue;
    for (int n_threads : {1, 2}) {
      std::vector<float> y(size_t(n_tokens * ldy), -7.0f);
      matmul_isa(isa, m.view(), x.data(), ldx, n_tokens, y.data(), ldy, pool_of(n_threads));
      for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t o = 0; o < m.n_out; ++o) {
          const double tol = 2e-5 * mag[size_t(t * m.n_out + o)] + 1e-30;
          ASSERT_NEAR(y[size_t(t * ldy + o)], ref[size_t(t * ldy + o)], tol)
              << what << ", " << isa_name(isa) << " vs ref, " << n_threads << " threads, token " << t << " row " << o;
        }
        for (int64_t o = m.n_out; o < ldy; ++o)
          ASSERT_EQ(y[size_t(t * ldy + o)], -7.0f) << what << ": y written past n_out";
      }
    }
  }
}

struct Shape {
  int64_t n_in, n_out;
};
// n_in: one block, partial quads (3, 5, 13 blocks), whole quads, TinyLlama's widths; odd n_out.
constexpr Shape kShapes[] = {{32, 5}, {96, 7}, {128, 16}, {160, 33}, {416, 9}, {512, 19}, {2048, 6}, {5632, 3}};

TEST(Sparse24Kernels, EveryVariantMatchesReferenceAndDenseMatmul) {
  uint32_t seed = 10;
  for (DType t : kTypes)
    for (const Shape& s : kShapes) {
      const Mat m = make_mat(t, s.n_in, s.n_out, seed++);
      for (int64_t n_tokens : {1, 3, 17, 64}) check_variants(m, n_tokens, seed++);
    }
}

TEST(Sparse24Kernels, ArbitraryBlockBytesAgreeWithTheDecoder) {
  // Positions the encoder never writes (repeats within a group), q8 values of -128.
  uint32_t seed = 100;
  for (DType t : kTypes)
    for (const Shape& s : {Shape{96, 5}, Shape{256, 8}, Shape{1056, 3}}) {
      const Mat m = make_mat(t, s.n_in, s.n_out, seed++, /*raw=*/true);
      for (int64_t n_tokens : {1, 3, 17}) check_variants(m, n_tokens, seed++);
    }
}

TEST(Sparse24Kernels, MatmulAndRowRangesUseTheSparseKernels) {
  for (DType t : kTypes) {
    const Mat m = make_mat(t, 256, 40, 7);
    const int64_t n_tokens = 5;
    const std::vector<float> x = make_x(256, n_tokens, 256, 8);
    std::vector<float> whole(size_t(n_tokens * 40)), rows(size_t(n_tokens * 40), -1.0f), want(size_t(n_tokens * 40));
    matmul(m.view(), x.data(), 256, n_tokens, whole.data(), 40, pool_of(2));
    matmul_isa(selected_isa(), m.view(), x.data(), 256, n_tokens, want.data(), 40, pool_of(1));
    EXPECT_EQ(whole, want) << dtype_name(t);
    matmul_rows(m.view(), x.data(), 256, n_tokens, rows.data(), 40, 0, 12);
    matmul_rows(m.view(), x.data(), 256, n_tokens, rows.data(), 40, 12, 40);
    EXPECT_EQ(rows, want) << dtype_name(t);
    // Shared-input matmuls (q/k/v, gate/up) take each weight on its own.
    std::vector<float> y2(size_t(n_tokens * 40));
    const MatmulTarget ts[2] = {{m.view(), rows.data(), 40}, {m.view(), y2.data(), 40}};
    matmul_shared_input(ts, x.data(), 256, n_tokens, pool_of(2));
    EXPECT_EQ(rows, want) << dtype_name(t);
    EXPECT_EQ(y2, want) << dtype_name(t);
  }
}

}  // namespace
}  // namespace tern
