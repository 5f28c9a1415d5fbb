// AVX2 tiles of 8 TQ rows, 4 or 8 bits (GPTQ / AWQ / RTN, quant/quant_tern.h), times up to 16
// tokens, a row per 32-bit lane: the AVX2 row-lane tiles of the GGUF types (rowlanes_avx2.cpp)
// for tern's group format, on the rows as stored.
//
// tq_dots (tern_int_avx2.cpp) spends a lane on 4 columns of one row and reduces each row and
// token horizontally. Here a group's bytes of 8 rows are transposed once (8 x 8 dwords per 32
// bytes: lane i = row i's bytes 4k..4k+3) into a buffer, and every token of the tile reads them
// from there: pmaddubsw of the unsigned nibbles against the token's 4 activation bytes
// broadcast, the sums of a 32-column block kept in int16 (a lane's 8 pair sums <= 8 * 2 * 15 *
// 127 = 30480), then one pmaddwd, one convert, one multiply and one FMA per block for all 8 rows:
//   acc += cvt(isum_b) * (d_x[b] * d_g),   per group acc -= (d_g * z_g) * sum_{b in g} xs[b]
// as tern_int_rows16_avx512.cpp does. The accumulators of the tile's tokens live in a buffer
// between groups (16 registers hold one token pair's work). The integer sums are the reference's
// exactly; the float steps associate differently, within tests/compress's bound.
#include <cstring>

#include "kernels/tern_int.h"
#include "kernels/tern_int_rows.h"
#include "kernels/x86/tiles_int.h"

namespace tern::kern {
namespace {

constexpr int kRows = 8;     // weight rows per tile, one per 32-bit lane
constexpr int kTokens = 16;  // most tokens per tile


// The 32 bytes at rows[i] + off of 8 rows, transposed: lane i of d[k] = bytes 4k..4k+3 of row i.
inline void transpose_rows8(const uint8_t* const* rows, int64_t off, __m256i* d) {
  __m256i r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[i] + off));
  // 8 x 8 dwords: unpack pairs, then quads, then swap 128-bit halves.
  __m256i a[8], b[8];
  for (int i = 0; i < 4; ++i) {
    a[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      b[4 * i + 2 * j] = _mm256_unpacklo_epi64(a[4 * i + j], a[4 * i + j + 2]);
      b[4 * i + 2 * j + 1] = _mm256_unpackhi_epi64(a[4 * i + j], a[4 * i + j + 2]);
    }
  // b[0..3]: rows 0-3, dwords (0,1,2,3 | 4,5,6,7) in halves; b[4..7]: rows 4-7.
  for (int k = 0; k < 4; ++k) {
    d[k] = _mm256_permute2x128_si256(b[k], b[k + 4], 0x20);
    d[k + 4] = _mm256_permute2x128_si256(b[k], b[k + 4], 0x31);
  }
}

// The 8 rows' f16 scales and u8 zero points at byte `off` of each row, as f32.
inline void group_scales8(const uint8_t* const* rows, int64_t off, __m256& d, __m256& z) {
  uint64_t h[2] = {0, 0}, zb = 0;
  for (int i = 0; i < 8; ++i) {
    uint16_t v;
    std::memcpy(&v, rows[i] + off, 2);
    h[i / 4] |= uint64_t(v) << (16 * (i % 4));
    zb |= uint64_t(rows[i][off + 2]) << (8 * i);
  }
  d = _mm256_cvtph_ps(_mm_insert_epi64(_mm_cvtsi64_si128(int64_t(h[0])), int64_t(h[1]), 1));
  z = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(zb))));
}

inline __m256i broadcast4(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Tokens i0, i0 + 1 (T of them) of the tile over one group's transposed weights w (G/64 halves of
// 8 vectors: half h holds blocks h (low nibbles) and h + G/64 (high)).
template <int G, int T>
inline void group_tokens(const TqView& v, const uint8_t* const* xrow, const __m256i (*w)[8], int64_t g, __m256 dg,
                         __m256* acc) {
  constexpr int kNb = G / 32;
  const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int h = 0; h < G / 64; ++h) {
    const int64_t blo = g * kNb + h, bhi = g * kNb + h + G / 64;
    __m256i slo[T], shi[T];
    for (int i = 0; i < T; ++i) slo[i] = shi[i] = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      const __m256i d = _mm256_load_si256(&w[h][k]);
      const __m256i lo = _mm256_and_si256(d, m4), hi = _mm256_and_si256(_mm256_srli_epi16(d, 4), m4);
      for (int i = 0; i < T; ++i) {
        slo[i] = _mm256_add_epi16(slo[i], _mm256_maddubs_epi16(lo, broadcast4(xrow[i] + 32 * blo + 4 * k)));
        shi[i] = _mm256_add_epi16(shi[i], _mm256_maddubs_epi16(hi, broadcast4(xrow[i] + 32 * bhi + 4 * k)));
      }
    }
    for (int i = 0; i < T; ++i) {
      const auto* dxv = reinterpret_cast<const float*>(xrow[i] + v.off_dxv);
      const float dlo = dxv[(blo / 2) * 16 + (blo % 2) * 8], dhi = dxv[(bhi / 2) * 16 + (bhi % 2) * 8];
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(slo[i], ones)), _mm256_mul_ps(_mm256_set1_ps(dlo), dg),
                               acc[i]);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(shi[i], ones)), _mm256_mul_ps(_mm256_set1_ps(dhi), dg),
                               acc[i]);
    }
  }
}

// 8 bits: T tokens over one group's transposed weights w (G/32 blocks of 8 vectors, the bytes
// made signed, q - 128). pmaddubsw needs an unsigned side: |q - 128| against x carrying q - 128's
// sign (the sign trick of the Q8_0 tiles), pair sums <= 2 * 128 * 127, widened by pmaddwd at
// every step.
template <int G, int T>
inline void group_tokens8(const TqView& v, const uint8_t* const* xrow, const __m256i (*w)[8], int64_t g, __m256 dg,
                          __m256* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int b = 0; b < G / 32; ++b) {
    const int64_t blk = g * (G / 32) + b;
    __m256i s[T];
    for (int i = 0; i < T; ++i) s[i] = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      const __m256i q = _mm256_load_si256(&w[b][k]), aq = _mm256_abs_epi8(q);
      for (int i = 0; i < T; ++i) {
        const __m256i xq = _mm256_sign_epi8(broadcast4(xrow[i] + 32 * blk + 4 * k), q);
        s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(_mm256_maddubs_epi16(aq, xq), ones));
      }
    }
    for (int i = 0; i < T; ++i) {
      const auto* dxv = reinterpret_cast<const float*>(xrow[i] + v.off_dxv);
      const float dx = dxv[(blk / 2) * 16 + (blk % 2) * 8];
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i]), _mm256_mul_ps(_mm256_set1_ps(dx), dg), acc[i]);
    }
  }
}

// The 8 rows at rows[] x n (<= 16) tokens from token t into y, rows set in `keep`.
template <int BITS, int G>
__attribute__((noinline)) void tq_tile(const TqView& v, const uint8_t* const* rows, uint32_t keep, const uint8_t* pf,
                                        int64_t t, int64_t n, float* y, int64_t ldy) {
  constexpr int64_t kBlk = 3 + BITS * G / 8;  // f16 d | u8 z | the packed weights
  constexpr int kNb = G / 32;
  alignas(32) __m256 acc[kTokens];
  for (int64_t i = 0; i < n; ++i) acc[i] = _mm256_setzero_ps();
  // 4 bits: G/64 halves of 32 bytes, each both nibbles of two blocks; 8 bits: G/32 blocks.
  alignas(32) __m256i w[BITS == 8 ? G / 32 : G / 64][8];
  for (int64_t g = 0; g < v.n_in / G; ++g) {
    const int64_t off = g * kBlk;
    if (pf) prefetch_step<kRows * int(kBlk)>(pf + g * kRows * kBlk);
    __m256 dg, zg;
    group_scales8(rows, off, dg, zg);
    __m256 zd;
    if constexpr (BITS == 8) {
      const __m256i flip = _mm256_set1_epi8(char(0x80));
      for (int b = 0; b < G / 32; ++b) {
        transpose_rows8(rows, off + 3 + 32 * b, w[b]);
        for (int k = 0; k < 8; ++k) w[b][k] = _mm256_xor_si256(w[b][k], flip);
      }
      zd = _mm256_mul_ps(dg, _mm256_sub_ps(zg, _mm256_set1_ps(128.0f)));  // q - z = (q - 128) - (z - 128)
    } else {
      for (int h = 0; h < G / 64; ++h) transpose_rows8(rows, off + 3 + 32 * h, w[h]);
      zd = _mm256_mul_ps(dg, zg);
    }
    const auto tokens = [&]<int T>(int64_t i) {
      const uint8_t* xrow[T];
      for (int j = 0; j < T; ++j) xrow[j] = v.act + (t + i + j) * v.stride;
      if constexpr (BITS == 8) group_tokens8<G, T>(v, xrow, w, g, dg, acc + i);
      else group_tokens<G, T>(v, xrow, w, g, dg, acc + i);
    };
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) tokens.template operator()<2>(i);
    if (i < n) tokens.template operator()<1>(i);
    for (int64_t j = 0; j < n; ++j) {
      const auto* xs = reinterpret_cast<const float*>(v.act + (t + j) * v.stride + v.off_xs) + g * kNb;
      float xsum = 0.0f;
      for (int b = 0; b < kNb; ++b) xsum += xs[b];
      acc[j] = _mm256_fnmadd_ps(zd, _mm256_set1_ps(xsum), acc[j]);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    float* yr = y + i * ldy;
    if (keep == 0xFFu) {
      _mm256_storeu_ps(yr, acc[i]);
    } else {
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, acc[i]);
      for (int r = 0; r < 8; ++r)
        if (keep >> r & 1u) yr[r] = tmp[r];
    }
  }
}

// Rows [r0, r1) x n_tok tokens in tiles of 8 rows by up to 16 tokens (each_row_tile).
template <int BITS, int G>
void tq_rows(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, const TqView& v, int64_t n_tok, float* y,
             int64_t ldy) {
  each_row_tile<kRows, kTokens>(w, row_bytes, r0, r1, v.stride, n_tok, y, ldy, kPrefetchTiles,
                                [&](const uint8_t* const* rows, uint32_t keep, const uint8_t* pf, int64_t t, int64_t n,
                                    float* yt) { tq_tile<BITS, G>(v, rows, keep, pf, t, n, yt, ldy); });
}

}  // namespace

bool tq_rows8_avx2(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, int bits, int group, int64_t n_in,
                   const uint8_t* act, int64_t stride, int64_t off_dxv, int64_t off_xs, int64_t n_tok, float* y,
                   int64_t ldy) {
  const TqView v{act, stride, off_dxv, off_xs, n_in};
  return tq_tiles_by_format(bits, group, [&](auto b, auto g) {
    tq_rows<decltype(b)::value, decltype(g)::value>(w, row_bytes, r0, r1, v, n_tok, y, ldy);
  });
}

}  // namespace tern::kern
