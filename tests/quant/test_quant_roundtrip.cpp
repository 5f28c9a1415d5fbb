// Round-trip error bounds of every quantizer on random data: what each format promises
// (half a quantization step where the rule guarantees it, RMSE bounds where the scale search
// trades max error for least squares), and sane behaviour on degenerate blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "core/error.h"
#include "quant/quant_codecs.h"
#include "quant/quant_traits.h"

namespace tern {
namespace {

std::vector<float> gaussian(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

struct RoundTrip {
  std::vector<uint8_t> blocks;
  std::vector<float> back;
};

RoundTrip round_trip(DType t, const std::vector<float>& x) {
  const QuantTraits& q = *quant_traits(t);
  RoundTrip r;
  r.blocks.resize(size_t(int64_t(x.size()) / q.block_size * q.block_bytes));
  r.back.resize(x.size());
  q.from_float(x.data(), r.blocks.data(), int64_t(x.size()));
  q.to_float(r.blocks.data(), r.back.data(), int64_t(x.size()));
  return r;
}

double rel_rmse(const std::vector<float>& x, const std::vector<float>& y) {
  double e = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e += double(x[i] - y[i]) * (x[i] - y[i]);
    s += double(x[i]) * x[i];
  }
  return std::sqrt(e / s);
}

float block_amax(const float* x, int n) {
  float a = 0;
  for (int i = 0; i < n; ++i) a = std::fmax(a, std::fabs(x[i]));
  return a;
}

constexpr int64_t kN = 256 * 64;

TEST(QuantRoundTrip, Q8_0WithinHalfStep) {
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    const auto x = gaussian(kN, seed, 0.1f * seed);
    const auto r = round_trip(DType::Q8_0, x);
    const auto* b = reinterpret_cast<const BlockQ8_0*>(r.blocks.data());
    for (int64_t ib = 0; ib < kN / 32; ++ib) {
      const float d32 = block_amax(&x[size_t(ib * 32)], 32) / 127.0f;
      const float d16 = fp16_to_f32(b[ib].d);
      // Half a step, plus what rounding the scale to f16 moves the largest quant.
      const float bound = 0.5f * d32 + 127.0f * std::fabs(d16 - d32) + 1e-6f * d32;
      for (int j = 0; j < 32; ++j) {
        const size_t i = size_t(ib * 32 + j);
        ASSERT_LE(std::fabs(x[i] - r.back[i]), bound) << "block " << ib;
      }
    }
    EXPECT_LT(rel_rmse(x, r.back), 0.006);
  }
}

// The quants are roundf(x / d) exactly, ties away from zero (llama.cpp's rule), including
// values a half apart from an integer and the floats either side of such halves.
TEST(QuantRoundTrip, Q8_0RoundsHalvesAwayFromZeroAsRoundf) {
  std::vector<float> x;
  std::mt19937 rng(7);
  for (int blk = 0; blk < 64; ++blk) {
    // amax 127 makes d = 1 and id = 1: each quant is roundf of the value itself.
    x.push_back(blk % 2 ? 127.0f : -127.0f);
    for (int j = 1; j < 32; ++j) {
      const float half = float(int(rng() % 253) - 126) + 0.5f;  // -125.5 .. 126.5
      const int pick = int(rng() % 3);
      x.push_back(pick == 0 ? half : std::nextafter(half, pick == 1 ? 200.0f : -200.0f));
    }
  }
  const auto r = round_trip(DType::Q8_0, x);
  const auto* b = reinterpret_cast<const BlockQ8_0*>(r.blocks.data());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(fp16_to_f32(b[i / 32].d), 1.0f);
    ASSERT_EQ(int(b[i / 32].qs[i % 32]), int(std::roundf(x[i]))) << "x = " << x[i];
  }
}

TEST(QuantRoundTrip, Q4_0WithinOneStep) {
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    const auto x = gaussian(kN, seed);
    const auto r = round_trip(DType::Q4_0, x);
    const auto* b = reinterpret_cast<const BlockQ4_0*>(r.blocks.data());
    for (int64_t ib = 0; ib < kN / 32; ++ib) {
      const float amax = block_amax(&x[size_t(ib * 32)], 32);
      const float d = std::fabs(fp16_to_f32(b[ib].d));
      // The extreme maps to -8 exactly; the opposite side clamps at +7, so the worst case
      // is one step there, half a step elsewhere. d is within f16 rounding of amax / 8.
      EXPECT_NEAR(d, amax / 8, amax / 8 * 1e-3);
      for (int j = 0; j < 32; ++j) {
        const size_t i = size_t(ib * 32 + j);
        const float err = std::fabs(x[i] - r.back[i]);
        ASSERT_LE(err, 1.01f * d) << "block " << ib;
        if (std::fabs(x[i]) < 7 * d) {
          ASSERT_LE(err, 0.51f * d + 8 * 1e-3f * d) << "block " << ib;
        }
      }
    }
    EXPECT_LT(rel_rmse(x, r.back), 0.10);
  }
}

TEST(QuantRoundTrip, Q8_KWithinHalfStep) {
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    const auto x = gaussian(kN, seed, 3.0f);
    const auto r = round_trip(DType::Q8_K, x);
    const auto* b = reinterpret_cast<const BlockQ8_K*>(r.blocks.data());
    for (int64_t ib = 0; ib < kN / kQK_K; ++ib) {
      const float d = std::fabs(b[ib].d);
      EXPECT_NEAR(d, block_amax(&x[size_t(ib * kQK_K)], kQK_K) / 127, d * 1e-6);
      int sum16 = 0;
      for (int j = 0; j < kQK_K; ++j) {
        const size_t i = size_t(ib * kQK_K + j);
        ASSERT_LE(std::fabs(x[i] - r.back[i]), 0.5f * d * (1 + 1e-5f)) << "block " << ib;
        sum16 += b[ib].qs[j];
        if (j % 16 == 15) {  // bsums hold the sum of each 16 quants
          ASSERT_EQ(b[ib].bsums[j / 16], sum16);
          sum16 = 0;
        }
      }
    }
  }
}

// Q5_0: d = max / -16, every element within half a step (plus d's f16 rounding, up to 16 steps
// of 2^-11 relative) but those opposite the largest one beyond 15.5 steps, which clamp to 15
// steps (as in llama.cpp's rule): within one step. Q4_1 / Q5_1: d = (max - min) / 15 or 31 and m = min, within half a step plus
// the f16 rounding of d (times q <= 31) and of m. Zeros, constants and spikes come back as such.
TEST(QuantRoundTrip, BlocksOf32WithinHalfStep) {
  for (DType t : {DType::Q4_1, DType::Q5_0, DType::Q5_1}) {
    SCOPED_TRACE(dtype_name(t));
    const int levels = t == DType::Q4_1 ? 15 : 31;
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      auto x = gaussian(kN, seed, 0.02f);
      x[40] = 0.5f;  // an outlier in block 1
      const auto r = round_trip(t, x);
      double err2 = 0, x2 = 0;
      for (int64_t ib = 0; ib < kN / 32; ++ib) {
        const float* xb = &x[size_t(ib * 32)];
        const float mn = *std::min_element(xb, xb + 32), mx = *std::max_element(xb, xb + 32);
        const float amax = block_amax(xb, 32);
        const float step = t == DType::Q5_0 ? amax / 16 : (mx - mn) / float(levels);
        const float slack = t == DType::Q5_0 ? 16 * amax / 16 * 0x1p-10f : float(levels) * step * 0x1p-10f + std::fabs(mn) * 0x1p-10f;
        for (int j = 0; j < 32; ++j) {
          const size_t i = size_t(ib * 32 + j);
          const float bound = (t == DType::Q5_0 && std::fabs(x[i]) > 15.5f * step ? step : 0.5f * step) + slack;
          ASSERT_LE(std::fabs(x[i] - r.back[i]), bound) << "block " << ib << " element " << j;
          err2 += double(x[i] - r.back[i]) * (x[i] - r.back[i]);
          x2 += double(x[i]) * x[i];
        }
      }
      EXPECT_LT(std::sqrt(err2 / x2), t == DType::Q4_1 ? 0.12 : 0.06);
    }
    std::vector<float> constant(64, -0.75f);
    for (float v : round_trip(t, constant).back) ASSERT_NEAR(v, -0.75f, 0.75f * 1e-3f);
    std::vector<float> zeros(64, 0.0f);
    for (float v : round_trip(t, zeros).back) ASSERT_EQ(v, 0.0f);
  }
}

// MXFP4 (quant_traits.h): per block e = floor(log2(amax)) + 125, so that amax lies in [8, 16) times
// the scale d = 2^(e - 128) (the largest value, 12 d, clips the top of that range), and every
// element comes back as the value of kMxfp4Values * d nearest it, the first index on a tie.
// Checked against a restatement of the rule: e from frexp (exact, where log2f's rounding cannot
// move floor() across an integer), the nearest value by its own search.
TEST(QuantRoundTrip, Mxfp4NearestValueOfTheBlockScale) {
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    auto x = gaussian(kN, seed, std::ldexp(1.0f, int(seed) * 9 - 20));  // 2^-11 .. 2^16
    x[33] = 0.0f;
    for (int j = 64; j < 96; ++j) x[size_t(j)] = 0.0f;                    // an all-zero block
    for (int j = 96; j < 128; ++j) x[size_t(j)] = std::fabs(x[size_t(j)]);  // one sign only
    for (int j = 128; j < 160; ++j) x[size_t(j)] = 1e-3f * x[size_t(j)];    // a quiet block
    x[200] = 1000.0f * x[201];                                              // a spike
    const auto r = round_trip(DType::MXFP4, x);
    const auto* b = reinterpret_cast<const BlockMXFP4*>(r.blocks.data());
    double err2 = 0, x2 = 0;
    for (int64_t ib = 0; ib < kN / 32; ++ib) {
      const float* xb = &x[size_t(ib * 32)];
      const float amax = block_amax(xb, 32);
      if (amax == 0.0f) {
        ASSERT_EQ(b[ib].e, 0) << "block " << ib;
      } else {
        int k;
        const double m = std::frexp(double(amax), &k);  // amax = m 2^k, m in [0.5, 1)
        if (m < 1.0 - 1e-6) {
          ASSERT_EQ(int(b[ib].e), k - 1 + 125) << "block " << ib;
        }
      }
      const float d = float(std::ldexp(1.0, int(b[ib].e) - 128));
      for (int j = 0; j < 32; ++j) {
        const size_t i = size_t(ib * 32 + j);
        // the distances in f32, as the rule computes them (the products are exact)
        int best = 0;
        for (int v = 1; v < 16; ++v)
          if (std::fabs(float(kMxfp4Values[v]) * d - xb[j]) < std::fabs(float(kMxfp4Values[best]) * d - xb[j])) best = v;
        const int q = j < 16 ? b[ib].qs[j] & 0x0F : b[ib].qs[j - 16] >> 4;
        ASSERT_EQ(q, best) << "block " << ib << " element " << j << ": " << xb[j] << " at d " << d;
        ASSERT_EQ(r.back[i], float(kMxfp4Values[q] * d));
        if (ib == 200 / 32) continue;  // the spike, clipped by up to a quarter, would dominate
        err2 += double(x[i] - r.back[i]) * (x[i] - r.back[i]);
        x2 += double(x[i]) * x[i];
      }
    }
    EXPECT_LT(std::sqrt(err2 / x2), 0.13);  // the rule gives 0.115 on Gaussian blocks
  }
}

// Blocks on the grid of every exponent that the rule can pick without wrapping (e = 0..252: 12 d
// below FLT_MAX) come back exactly: values v / 2 * 2^m with v in kMxfp4Values, one of them +-12
// (so amax = 6 * 2^m and e = m + 127); below 2^-125 a block's values are denormal, which the
// rule's log2 and the scale 2^(e - 128) handle exactly as well.
TEST(QuantRoundTrip, Mxfp4GridBlocksAtEveryExponentAreExact) {
  std::mt19937 rng(5);
  for (int m = -127; m <= 125; ++m) {
    std::vector<float> x(64);
    for (size_t j = 0; j < x.size(); ++j) x[j] = std::ldexp(float(kMxfp4Values[rng() % 16]) / 2.0f, m);
    x[3] = std::ldexp(6.0f, m);
    x[40] = std::ldexp(-6.0f, m);
    const auto r = round_trip(DType::MXFP4, x);
    const auto* b = reinterpret_cast<const BlockMXFP4*>(r.blocks.data());
    ASSERT_EQ(int(b[0].e), m + 127) << "m " << m;
    ASSERT_EQ(int(b[1].e), m + 127) << "m " << m;
    for (size_t j = 0; j < x.size(); ++j) ASSERT_EQ(r.back[j], x[j]) << "m " << m << " element " << j;
  }
}

// Every exponent byte (0..255) and every nibble decodes to kMxfp4Values[q] * 2^(e - 128) exactly:
// denormal scales for e = 0, 1, infinity where 12 * 2^127 overflows, never NaN.
TEST(QuantRoundTrip, Mxfp4EveryExponentDecodes) {
  const QuantTraits& q = *quant_traits(DType::MXFP4);
  std::vector<uint8_t> blocks(256 * 17);
  for (int e = 0; e < 256; ++e) {
    blocks[size_t(e * 17)] = uint8_t(e);
    for (int j = 0; j < 16; ++j) blocks[size_t(e * 17 + 1 + j)] = uint8_t(j | (15 - j) << 4);
  }
  std::vector<float> back(256 * 32);
  q.to_float(blocks.data(), back.data(), int64_t(back.size()));
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(e8m0_half(uint8_t(e)), float(std::ldexp(1.0, e - 128))) << "e " << e;
    for (int j = 0; j < 32; ++j) {
      const int nib = j < 16 ? j : 15 - (j - 16);
      const float want = float(std::ldexp(double(kMxfp4Values[nib]), e - 128));
      const float got = back[size_t(e * 32 + j)];
      ASSERT_FALSE(std::isnan(got));
      ASSERT_EQ(std::memcmp(&got, &want, 4), 0) << "e " << e << " nibble " << nib << ": " << got << " vs " << want;
    }
  }
}

// TQ1_0 / TQ2_0 (quant_traits.h): per super-block d = amax (stored as f16), each element the
// trit nearest x / amax with ties away from zero, so it comes back as t * f16(amax): exactly, the
// trit restated here by comparing |x| with amax / 2 in the rule's own float arithmetic (x * (1 /
// amax) rounded to f32, then against 0.5).
TEST(QuantRoundTrip, TernaryNearestTritOfTheBlockAmax) {
  for (DType t : {DType::TQ1_0, DType::TQ2_0}) {
    SCOPED_TRACE(dtype_name(t));
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      auto x = gaussian(kN, seed, std::ldexp(1.0f, int(seed) * 4 - 10));
      for (int j = 256; j < 512; ++j) x[size_t(j)] = 0.0f;                      // an all-zero block
      for (int j = 512; j < 768; ++j) x[size_t(j)] = std::fabs(x[size_t(j)]);  // one sign only
      for (int j = 768; j < 1024; j += 2) x[size_t(j)] = x[768] * 0.5f;         // exact halves of one element
      x[800] = std::fabs(x[800]) * 100.0f;                                      // a spike: amax
      const auto r = round_trip(t, x);
      for (int64_t ib = 0; ib < kN / kQK_K; ++ib) {
        const float* xb = &x[size_t(ib * kQK_K)];
        const float amax = block_amax(xb, kQK_K);
        const float d = fp16_to_f32(f32_to_fp16(amax));
        const float id = amax != 0.0f ? 1.0f / amax : 0.0f;
        for (int j = 0; j < kQK_K; ++j) {
          const float v = std::fabs(xb[j] * id);
          const int trit = v >= 0.5f ? (xb[j] < 0 ? -1 : 1) : 0;
          ASSERT_EQ(r.back[size_t(ib * kQK_K + j)], float(trit) * d) << "block " << ib << " element " << j;
        }
      }
    }
  }
}

// The packers (quant_codecs.h) for quantization-aware training: random trits and a scale give
// blocks whose unpacking is those trits and f16(d), whose dequantization is trit * f16(d), and
// which are byte for byte what the quantizer writes for the values trit * D (amax D, so each
// x / amax is the trit, up to a rounding that lroundf absorbs). Out-of-range trits are refused.
TEST(QuantRoundTrip, TernaryPackBlocksAreTheQuantizersBlocks) {
  std::mt19937 rng(11);
  for (DType t : {DType::TQ1_0, DType::TQ2_0}) {
    SCOPED_TRACE(dtype_name(t));
    const bool tq1 = t == DType::TQ1_0;
    const QuantTraits& q = *quant_traits(t);
    for (int it = 0; it < 200; ++it) {
      int8_t trits[kQK_K];
      const int zero_share = it % 4;  // 0, 1/3, 2/3, all zero but one
      for (auto& v : trits) v = int8_t(int(rng() % 3) - 1);
      for (int e = 0; e < kQK_K; ++e)
        if (zero_share == 3 || int(rng() % 3) < zero_share) trits[e] = 0;
      trits[rng() % kQK_K] = rng() % 2 ? 1 : -1;  // amax is D
      const float D = std::ldexp(1.0f + float(rng() % 1000) / 1000.0f, int(rng() % 30) - 20);
      std::vector<uint8_t> packed(size_t(q.block_bytes)), quantized(size_t(q.block_bytes));
      if (tq1) codec::tq1_0_pack_block(trits, D, packed.data());
      else codec::tq2_0_pack_block(trits, D, packed.data());
      std::vector<float> x(kQK_K), back(kQK_K);
      for (int e = 0; e < kQK_K; ++e) x[size_t(e)] = float(trits[e]) * D;
      q.from_float(x.data(), quantized.data(), kQK_K);
      ASSERT_EQ(packed, quantized) << "iteration " << it;
      int8_t got[kQK_K];
      const float d = tq1 ? codec::tq1_0_unpack_block(packed.data(), got) : codec::tq2_0_unpack_block(packed.data(), got);
      ASSERT_EQ(d, fp16_to_f32(f32_to_fp16(D)));
      ASSERT_EQ(std::memcmp(got, trits, kQK_K), 0) << "iteration " << it;
      q.to_float(packed.data(), back.data(), kQK_K);
      for (int e = 0; e < kQK_K; ++e) ASSERT_EQ(back[size_t(e)], float(trits[e]) * d);
    }
    int8_t bad[kQK_K] = {};
    bad[17] = 2;
    std::vector<uint8_t> out(size_t(q.block_bytes));
    EXPECT_THROW(tq1 ? codec::tq1_0_pack_block(bad, 1.0f, out.data()) : codec::tq2_0_pack_block(bad, 1.0f, out.data()),
                 Error);
  }
}

// TQ1_0's bytes: the 243 five-trit numbers pack to 243 distinct bytes that unpack to them; the 13
// other byte values of qs (and the 175 of qh that are not four trits and a zero) are not canonical
// yet decode, like every byte, to trits: those of the canonical byte one below. TQ2_0's code 3 (no
// trit) decodes as 2, ggml's way.
TEST(QuantRoundTrip, TernaryEveryByteDecodes) {
  int canonical = 0, canonical_qh = 0;
  for (int b = 0; b < 256; ++b) {
    canonical += codec::tq1_0_byte_is_canonical(uint8_t(b), false);
    canonical_qh += codec::tq1_0_byte_is_canonical(uint8_t(b), true);
    // the byte in every qs and qh position of a block, unpacked and dequantized
    BlockTQ1_0 blk;
    std::memset(blk.qs, b, sizeof blk.qs);
    std::memset(blk.qh, b, sizeof blk.qh);
    blk.d = f32_to_fp16(1.0f);
    int8_t trits[kQK_K];
    codec::tq1_0_unpack_block(&blk, trits);
    for (int n = 0; n < 5; ++n) {
      // the n-th base-3 digit of the byte read as a fraction of 256 / 243, by integer arithmetic
      const int want = int(((b * int(kTq1Pow3[n])) % 256) * 3 / 256) - 1;
      ASSERT_EQ(trits[32 * n], want) << "byte " << b << " trit " << n;
      ASSERT_EQ(trits[160 + 16 * n + 15], want) << "byte " << b << " trit " << n;
      if (n < 4) {
        ASSERT_EQ(trits[240 + 4 * n + 3], want) << "byte " << b << " trit " << n;
      }
    }
    if (!codec::tq1_0_byte_is_canonical(uint8_t(b), false)) {
      ASSERT_GT(b, 0);
      ASSERT_TRUE(codec::tq1_0_byte_is_canonical(uint8_t(b - 1), false)) << b;
      int8_t below[kQK_K];
      std::memset(blk.qs, b - 1, sizeof blk.qs);
      codec::tq1_0_unpack_block(&blk, below);
      ASSERT_EQ(std::memcmp(below, trits, 240), 0) << "byte " << b;
    }
  }
  EXPECT_EQ(canonical, 243);
  EXPECT_EQ(canonical_qh, 81);
  // every 5-trit combination packs and unpacks (through whole blocks of it)
  for (int v = 0; v < 243; ++v) {
    int8_t trits[kQK_K];
    for (int e = 0; e < kQK_K; ++e) {
      const int n = e < 160 ? e / 32 : e < 240 ? (e - 160) / 16 : (e - 240) / 4;
      int digit = v;
      for (int k = n; k < 4; ++k) digit /= 3;
      trits[e] = int8_t(e >= 240 && v % 3 != 0 ? 0 : digit % 3 - 1);  // qh: four trits and a zero
    }
    uint8_t blk[54];
    codec::tq1_0_pack_block(trits, 0.5f, blk);
    int8_t back[kQK_K];
    ASSERT_EQ(codec::tq1_0_unpack_block(blk, back), 0.5f);
    ASSERT_EQ(std::memcmp(back, trits, kQK_K), 0) << "value " << v;
    ASSERT_TRUE(codec::tq1_0_byte_is_canonical(blk[0], false));
    ASSERT_TRUE(codec::tq1_0_byte_is_canonical(blk[48], true));
  }
  BlockTQ2_0 b2;
  std::memset(b2.qs, 0xFF, sizeof b2.qs);  // code 3 everywhere
  b2.d = f32_to_fp16(0.25f);
  std::vector<float> back(kQK_K);
  quant_traits(DType::TQ2_0)->to_float(&b2, back.data(), kQK_K);
  for (float v : back) ASSERT_EQ(v, 0.5f);
}

// K-quants pick scales by least squares, so there is no per-element half-step promise; the
// bounds are a margin above what llama.cpp's algorithm achieves on Gaussian data (measured:
// Q4_K ~0.072, Q6_K ~0.018 relative RMSE, worst element ~0.11 and ~0.023 of the sub-block amax;
// Q2_K 0.30 / 0.42, Q3_K 0.15 / 0.24, Q5_K 0.037 / 0.05-0.07: llama.cpp's own functions on the same
// kind of data give the same, as the codecs are byte-exact with them).
// Relative RMSE below max_rmse and every element within elem_frac of its sub-block's amax.
void check_k_quant_bounds(DType t, double max_rmse, int64_t sub, float elem_frac) {
  SCOPED_TRACE(dtype_name(t));
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    const auto x = gaussian(kN, seed, 0.02f);
    const auto r = round_trip(t, x);
    EXPECT_LT(rel_rmse(x, r.back), max_rmse);
    for (int64_t ib = 0; ib < kN / sub; ++ib) {
      const float amax = block_amax(&x[size_t(ib * sub)], int(sub));
      for (int64_t j = 0; j < sub; ++j) {
        const size_t i = size_t(ib * sub + j);
        ASSERT_LE(std::fabs(x[i] - r.back[i]), elem_frac * amax) << "sub-block " << ib;
      }
    }
  }
}

TEST(QuantRoundTrip, KQuantErrorBounds) {
  check_k_quant_bounds(DType::Q2_K, 0.33, 16, 0.55f);
  check_k_quant_bounds(DType::Q3_K, 0.17, 16, 0.32f);
  check_k_quant_bounds(DType::Q4_K, 0.085, 32, 0.15f);
  check_k_quant_bounds(DType::Q5_K, 0.042, 32, 0.08f);
  check_k_quant_bounds(DType::Q6_K, 0.022, 16, 0.05f);
}

// Zeros, constants, a single spike and mixed magnitudes: no NaN, zeros stay zero, and a block
// whose values are all equal comes back close.
TEST(QuantRoundTrip, DegenerateBlocks) {
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_K,
                 DType::TQ1_0, DType::TQ2_0}) {
    SCOPED_TRACE(dtype_name(t));
    const bool ternary = t == DType::TQ1_0 || t == DType::TQ2_0;
    std::vector<float> zeros(512, 0.0f);
    for (float v : round_trip(t, zeros).back) ASSERT_EQ(v, 0.0f);

    std::vector<float> constant(512, -0.75f);
    for (float v : round_trip(t, constant).back) {
      ASSERT_FALSE(std::isnan(v));
      ASSERT_NEAR(v, -0.75f, 0.75f * 0.07f);
    }

    std::vector<float> spike(512, 0.0f);
    spike[7] = 5.0f;
    spike[300] = -3.0f;
    const auto back = round_trip(t, spike).back;
    ASSERT_NEAR(back[7], 5.0f, 5.0f * 0.02f);
    // (the ternary types: -3 is the second super-block's amax, so exact up to f16)
    ASSERT_NEAR(back[300], -3.0f, 3.0f * 0.02f);
    if (ternary) {
      ASSERT_EQ(back[7], 5.0f);
    }
    // Q5_K's grid search for the sub-block holding -3 lands zero 0.04% of the spike off a grid
    // point (llama.cpp's values: the quantizer is byte-exact with its); the others hit zero.
    const float zero_tol = t == DType::Q5_K ? 3.0f * 1e-3f : 1e-6f;
    for (size_t i = 0; i < back.size(); ++i)
      if (i != 7 && i != 300) {
        ASSERT_NEAR(back[i], 0.0f, zero_tol) << i;
      }
  }
}

// F32 round-trips exactly, F16/BF16 within their rounding (half an ulp of 11 / 8 bits).
TEST(QuantRoundTrip, FloatTypes) {
  const auto x = gaussian(1000, 7);
  EXPECT_EQ(round_trip(DType::F32, x).back, x);
  const auto h = round_trip(DType::F16, x).back;
  const auto b = round_trip(DType::BF16, x).back;
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(h[i], x[i], std::fabs(x[i]) * 1e-3 + 1e-7);
    EXPECT_NEAR(b[i], x[i], std::fabs(x[i]) * 8e-3 + 1e-30);
  }
}

TEST(QuantTraits, TableMatchesDtypeSizes) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                  DType::Q5_1, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_K,
                  DType::MXFP4, DType::TQ1_0, DType::TQ2_0}) {
    const QuantTraits* q = quant_traits(t);
    ASSERT_NE(q, nullptr) << dtype_name(t);
    EXPECT_EQ(q->block_size, dtype_info(t).block_size) << dtype_name(t);
    EXPECT_EQ(q->block_bytes, dtype_info(t).block_bytes) << dtype_name(t);
    EXPECT_STREQ(q->name, dtype_name(t));
    EXPECT_NE(q->from_float, nullptr);
  }
  EXPECT_EQ(quant_traits(DType::Q4_K)->vec_dot_type, DType::Q8_K);
  EXPECT_EQ(quant_traits(DType::Q6_K)->vec_dot_type, DType::Q8_K);
  EXPECT_EQ(quant_traits(DType::Q5_K)->vec_dot_type, DType::Q8_K);
  EXPECT_EQ(quant_traits(DType::Q4_0)->vec_dot_type, DType::Q8_0);
  for (DType t : {DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::MXFP4}) EXPECT_EQ(quant_traits(t)->vec_dot_type, DType::Q8_0);
  EXPECT_EQ(llama_file_type(DType::MXFP4), 38u);  // LLAMA_FTYPE_MOSTLY_MXFP4_MOE
  EXPECT_EQ(static_cast<uint32_t>(DType::MXFP4), 39u);
  EXPECT_EQ(dtype_from_name("MXFP4"), DType::MXFP4);
  EXPECT_EQ(fit_row_type(DType::MXFP4, 2880), DType::MXFP4);  // gpt-oss's rows
  EXPECT_EQ(fit_row_type(DType::MXFP4, 100), DType::F16);
  for (DType t : {DType::Q2_K, DType::Q3_K, DType::TQ1_0, DType::TQ2_0}) EXPECT_EQ(quant_traits(t)->vec_dot_type, DType::Q8_K);
  EXPECT_EQ(llama_file_type(DType::TQ1_0), 36u);  // LLAMA_FTYPE_MOSTLY_TQ1_0
  EXPECT_EQ(llama_file_type(DType::TQ2_0), 37u);
  EXPECT_EQ(static_cast<uint32_t>(DType::TQ1_0), 34u);
  EXPECT_EQ(static_cast<uint32_t>(DType::TQ2_0), 35u);
  EXPECT_EQ(fit_row_type(DType::TQ1_0, 2048), DType::TQ1_0);
  EXPECT_EQ(fit_row_type(DType::TQ2_0, 64), DType::Q4_0);  // llama.cpp's substitute
  EXPECT_EQ(fit_row_type(DType::TQ1_0, 100), DType::F16);
  EXPECT_EQ(quant_traits(DType::IQ4_NL), nullptr);
  EXPECT_THROW(require_quant_traits(DType::IQ4_NL, "blk.0.ffn_up.weight"), Error);
}

}  // namespace
}  // namespace tern
