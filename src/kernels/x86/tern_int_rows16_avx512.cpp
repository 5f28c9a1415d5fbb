// AVX-512 VNNI tiles of 16 TQ rows (4 or 8 bits; GPTQ / AWQ / RTN, quant/quant_tern.h) times up
// to 16 tokens, a row per int32 lane: the row-lane tiles of the GGUF types
// (rowlanes_avx512.cpp) for tern's group format.
//
// tq_dots (tern_int_avx512.cpp) spends a vector lane on 4 columns of one row, so each token pays
// a convert, a multiply and an FMA per 64 columns and a horizontal sum per row; a 128-token
// prompt of the TinyLlama shape in rtn-int4 ran at a quarter of Q4_0's rate. Here a 32-column
// block of 16 rows is transposed into 8 vectors (lane i = row i's 4 weights k, unsigned), once
// for up to 16 tokens; each token then needs 8 vpdpbusd against its own 4 activation bytes
// broadcast, and one multiply and one FMA for all 16 rows:
//   acc += cvt(isum_b) * (d_x[b] * d_g)             per 32-column block b of group g
//   acc -= (d_g * z_g) * sum_{b in g} xs[b]          per group (the zero points; xs: tern_int.cpp)
// The integer sums are the reference's exactly; the float steps associate differently (the
// reference scales by d_g once per group), within tests/compress's bound for the variants.
//
// TI8 (LLM.int8(), SmoothQuant W8A8) the same way: a row's scale and a token's are one each, so
// a token's 8 vpdpbusd per block accumulate in int32 over the whole row (no float step per
// block, where i8_dots reduces each row and token horizontally), and the outlier columns' f16
// weights meet the token's f16-rounded values in one FMA per column for all 16 rows.
#include "kernels/tern_int.h"
#include "kernels/tern_int_rows.h"
#include "kernels/x86/avx512_tiles.h"

namespace tern::kern {
namespace {

using avx512::dot_block32;
using avx512::rows_f16;
using avx512::transpose_rows16;

constexpr int kRows = 16;    // weight rows per tile, one per int32 lane
constexpr int kTokens = 16;  // most tokens per tile

// each_row_tile (tern_int_rows.h) with this file's tiles: 16 rows by up to 16 tokens.
template <class Tile>
void each_tile(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t stride, int64_t n_tok, float* y,
               int64_t ldy, Tile&& tile) {
  each_row_tile<kRows, kTokens>(w, row_bytes, r0, r1, stride, n_tok, y, ldy, kPrefetchTiles,
                                [&](const uint8_t* const* rows, uint32_t keep, const uint8_t* pf, int64_t t, int64_t n,
                                    float* yt) { tile(rows, __mmask16(keep), pf, t, n, yt); });
}

// The 16 rows' f16 scales and u8 zero points at byte `off` of each row, as f32.
// (Always inlined, as rows_f16: a call would spill the tile's accumulators.)
__attribute__((always_inline)) inline void group_scales(const uint8_t* const* rows, int64_t off, __m512& d,
                                                        __m512& z) {
  d = rows_f16(rows, off);
  uint64_t z8[2] = {0, 0};
  for (int i = 0; i < 8; ++i) {
    z8[0] |= uint64_t(rows[i][off + 2]) << (8 * i);
    z8[1] |= uint64_t(rows[i + 8][off + 2]) << (8 * i);
  }
  const __m128i zv = _mm_insert_epi64(_mm_cvtsi64_si128(int64_t(z8[0])), int64_t(z8[1]), 1);
  z = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(zv));
}

// Group g's 32-column blocks of the 16 rows, transposed and unpacked: w[b][k] lane i = row i's
// weights 4k..4k+3 of block b (unsigned, 0..15 or 0..255). 4 bits: byte j of a group holds
// column j (low nibble) and column j + G/2 (high), so block b reads the 32 bytes from
// 32 * (b % (G/64)), low nibbles for b < G/64.
template <int BITS, int G>
inline void group_weights(const uint8_t* const* rows, int64_t qs, __m512i (*w)[8]) {
  if constexpr (BITS == 8) {
    for (int b = 0; b < G / 32; ++b) {
      transpose_rows16(rows, qs + 32 * b, w[b]);
      transpose_rows16(rows, qs + 32 * b + 16, w[b] + 4);
    }
  } else {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int h = 0; h < G / 64; ++h) {
      __m512i d[8];
      transpose_rows16(rows, qs + 32 * h, d);
      transpose_rows16(rows, qs + 32 * h + 16, d + 4);
      for (int k = 0; k < 8; ++k) {
        w[h][k] = _mm512_and_si512(d[k], m4);
        w[h + G / 64][k] = _mm512_and_si512(_mm512_srli_epi16(d[k], 4), m4);
      }
    }
  }
}

// The 16 rows at rows[] x TC tokens from token t, into y (row r of token t + i at y[i * ldy + r])
// for the rows (lanes) set in `keep`; pf: the bytes to prefetch as the groups go (or nullptr).
template <int BITS, int G, int TC>
void tq_tile(const TqView& v, const uint8_t* const* rows, __mmask16 keep, const uint8_t* pf, int64_t t, float* y,
             int64_t ldy) {
  constexpr int64_t kBlk = 3 + BITS * G / 8;  // f16 d | u8 z | packed q
  constexpr int kNb = G / 32;
  const uint8_t* xrow[TC];
  for (int i = 0; i < TC; ++i) xrow[i] = v.act + (t + i) * v.stride;
  __m512 acc[TC];
  for (int i = 0; i < TC; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t g = 0; g < v.n_in / G; ++g) {
    const int64_t off = g * kBlk;
    if (pf) prefetch_step<kRows * int(kBlk)>(pf + g * kRows * kBlk);
    __m512 dg, zg;
    group_scales(rows, off, dg, zg);
    alignas(64) __m512i w[kNb][8];
    group_weights<BITS, G>(rows, off + 3, w);
    for (int b = 0; b < kNb; ++b) {
      const int64_t blk = g * kNb + b;  // the 32-column block within the row
      const int64_t xq = 32 * blk;
      const int64_t dxo = v.off_dxv + 4 * ((blk / 2) * 16 + (blk % 2) * 8);
      __m512i wb[8];
      for (int k = 0; k < 8; ++k) wb[k] = w[b][k];
#pragma GCC unroll 16
      for (int i = 0; i < TC; ++i) {
        const __m512i s = dot_block32(_mm512_setzero_si512(), wb, xrow[i] + xq);
        float dx;
        std::memcpy(&dx, xrow[i] + dxo, 4);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(_mm512_set1_ps(dx), dg), acc[i]);
      }
    }
    const __m512 zd = _mm512_mul_ps(dg, zg);
    for (int i = 0; i < TC; ++i) {
      const auto* xs = reinterpret_cast<const float*>(xrow[i] + v.off_xs) + g * kNb;
      float xsum = 0.0f;
      for (int b = 0; b < kNb; ++b) xsum += xs[b];
      acc[i] = _mm512_fnmadd_ps(zd, _mm512_set1_ps(xsum), acc[i]);
    }
  }
  for (int i = 0; i < TC; ++i) _mm512_mask_storeu_ps(y + i * ldy, keep, acc[i]);
}

template <int BITS, int G, int TC = kTokens>
void tq_tokens(const TqView& v, const uint8_t* const* rows, __mmask16 keep, const uint8_t* pf, int64_t t, int64_t n,
               float* y, int64_t ldy) {
  if constexpr (TC > 1) {
    if (n < TC) return tq_tokens<BITS, G, TC - 1>(v, rows, keep, pf, t, n, y, ldy);
  }
  tq_tile<BITS, G, TC>(v, rows, keep, pf, t, y, ldy);
}

template <int BITS, int G>
void tq_rows(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, const TqView& v, int64_t n_tok, float* y,
             int64_t ldy) {
  each_tile(w, row_bytes, r0, r1, v.stride, n_tok, y, ldy,
            [&](const uint8_t* const* rows, __mmask16 keep, const uint8_t* pf, int64_t t, int64_t n, float* yt) {
              tq_tokens<BITS, G>(v, rows, keep, pf, t, n, yt, ldy);
            });
}

// ---- TI8 ------------------------------------------------------------------------------------

struct I8View {
  const uint8_t* act;  // token t's row at act + t * stride (I8Layout, tern_int.cpp): xu u8 | dx | xo
  int64_t stride, off_dx, off_xo, n_in, k, row_bytes;
};

// y = d_w * d_x * (sum_j w_j xu_j - 128 * sum_j w_j) + sum_i o_i * xo_i (tern_int.h), 16 rows x TC
// tokens from token t. xu is unsigned (vpdpbusd's u8 side, broadcast), the weights signed.
template <int TC>
void i8_tile(const I8View& v, const uint8_t* const* rows, __mmask16 keep, const uint8_t* pf, int64_t t, float* y,
             int64_t ldy) {
  const uint8_t* xrow[TC];
  for (int i = 0; i < TC; ++i) xrow[i] = v.act + (t + i) * v.stride;
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i s[TC];
  for (int i = 0; i < TC; ++i) s[i] = _mm512_setzero_si512();
  __m512i row_sum = _mm512_setzero_si512();
  const int64_t nb = v.n_in / 32;
  // A row is n_in bytes and its tail: each block step prefetches a block's share of the tile.
  const int64_t pf_step = (kRows * v.row_bytes + nb - 1) / nb;
  for (int64_t b = 0; b < nb; ++b) {
    if (pf)
      for (int64_t o = b * pf_step; o < (b + 1) * pf_step; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(pf) + o, _MM_HINT_T2);
    __m512i w[8];
    transpose_rows16(rows, 32 * b, w);
    transpose_rows16(rows, 32 * b + 16, w + 4);
    for (int k = 0; k < 8; ++k) row_sum = _mm512_dpbusd_epi32(row_sum, ones, w[k]);
#pragma GCC unroll 16
    for (int i = 0; i < TC; ++i) {
      const uint8_t* xq = xrow[i] + 32 * b;
      // Two chains of 4 joined by an add: the same integer sum.
      __m512i lo = s[i], hi = _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k) {
        int32_t xl, xh;
        std::memcpy(&xl, xq + 4 * k, 4);
        std::memcpy(&xh, xq + 16 + 4 * k, 4);
        lo = _mm512_dpbusd_epi32(lo, _mm512_set1_epi32(xl), w[k]);
        hi = _mm512_dpbusd_epi32(hi, _mm512_set1_epi32(xh), w[k + 4]);
      }
      s[i] = _mm512_add_epi32(lo, hi);
    }
  }
  const __m512 dw = rows_f16(rows, v.n_in);
  const __m512i corr = _mm512_slli_epi32(row_sum, 7);  // 128 * sum_j w_j
  for (int i = 0; i < TC; ++i) {
    float dx;
    std::memcpy(&dx, xrow[i] + v.off_dx, 4);
    __m512 acc = _mm512_mul_ps(dw, _mm512_mul_ps(_mm512_set1_ps(dx), _mm512_cvtepi32_ps(_mm512_sub_epi32(s[i], corr))));
    const auto* xo = reinterpret_cast<const float*>(xrow[i] + v.off_xo);
    for (int64_t j = 0; j < v.k; ++j) acc = _mm512_fmadd_ps(rows_f16(rows, v.n_in + 2 + 2 * j), _mm512_set1_ps(xo[j]), acc);
    _mm512_mask_storeu_ps(y + i * ldy, keep, acc);
  }
}

template <int TC = kTokens>
void i8_tokens(const I8View& v, const uint8_t* const* rows, __mmask16 keep, const uint8_t* pf, int64_t t, int64_t n,
               float* y, int64_t ldy) {
  if constexpr (TC > 1) {
    if (n < TC) return i8_tokens<TC - 1>(v, rows, keep, pf, t, n, y, ldy);
  }
  i8_tile<TC>(v, rows, keep, pf, t, y, ldy);
}

}  // namespace

void i8_rows16_avx512(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t n_in, int64_t k,
                      const uint8_t* act, int64_t stride, int64_t off_dx, int64_t off_xo, int64_t n_tok, float* y,
                      int64_t ldy) {
  const I8View v{act, stride, off_dx, off_xo, n_in, k, row_bytes};
  each_tile(w, row_bytes, r0, r1, stride, n_tok, y, ldy,
            [&](const uint8_t* const* rows, __mmask16 keep, const uint8_t* pf, int64_t t, int64_t n, float* yt) {
              i8_tokens(v, rows, keep, pf, t, n, yt, ldy);
            });
}

bool tq_rows16_avx512(const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, int bits, int group, int64_t n_in,
                      const uint8_t* act, int64_t stride, int64_t off_dxv, int64_t off_xs, int64_t n_tok, float* y,
                      int64_t ldy) {
  const TqView v{act, stride, off_dxv, off_xs, n_in};
  return tq_tiles_by_format(bits, group, [&](auto b, auto g) {
    tq_rows<decltype(b)::value, decltype(g)::value>(w, row_bytes, r0, r1, v, n_tok, y, ldy);
  });
}

}  // namespace tern::kern
