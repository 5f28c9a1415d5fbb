// AVX-512 wide classic tiles for Q4_0 / Q8_0 / MXFP4 (decode; avx512_tiles.h): several weight rows per
// zmm against one block of Rows activations broadcast to every lane.
//
// The 256-bit tiles spend ~12 instructions per (row, 32-weight block) and, with 4-row tiles
// over rows of a few KB, leave the hardware prefetcher too little to train on: a GEMV ran at
// a third of the streaming bandwidth from DRAM. Here one zmm carries several rows of one
// block (Q4_0: four rows' 16 nibble bytes, one per 128-bit lane; Q8_0: two rows' 32 bytes,
// one per 256-bit half) against the block's activations broadcast to every lane, and each
// row's f16 scale is converted once per block for all tokens (8 at once). Tiles are 8 rows
// (4 at the end of a chunk): the 8 scales convert in one instruction, and more rows stream at
// once. Weights are prefetched as in tiles_int.h's tiles. In-cache single-core speed went
// from ~34 to ~55 weights/ns for Q4_0 and from ~37 to ~46 for Q8_0; a row's result does not
// depend on whether it sits in an 8- or a 4-row tile.
//
// Q4_0: nibbles unsigned, the -8 offset through nsum as in tile_q32 (a row has 4 lanes here,
// so each starts at 2 * nsum).
// Q8_0: no 512-bit vpsignb, so the weights are made unsigned instead (w + 128, a sign-bit
// flip); the extra 128 * sum(x) = -128 * nsum is removed by starting each of a row's 8 lanes
// at 16 * nsum.
#include "kernels/x86/avx512_tiles.h"

namespace tern::kern::avx512 {
namespace {

// R rows (4 or 8) x T tokens of Q4_0.
template <int R, int T>
void wide_q4_0(const Tile& c) {
  constexpr int G = R / 4;  // zmm per token
  __m512 acc[G][T];
  for (auto& a : acc)
    for (auto& v : a) v = _mm512_setzero_ps();
  const ActPtrs<T> x(c);
  const int64_t rb = c.row_bytes;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512i expand[G];  // 128-bit lane j of vector g <- scale of row 4g + j
  for (int g = 0; g < G; ++g)
    expand[g] = _mm512_setr_epi32(4 * g, 4 * g, 4 * g, 4 * g, 4 * g + 1, 4 * g + 1, 4 * g + 1, 4 * g + 1,
                                  4 * g + 2, 4 * g + 2, 4 * g + 2, 4 * g + 2, 4 * g + 3, 4 * g + 3, 4 * g + 3, 4 * g + 3);
  const uint8_t* pf = c.w + kPrefetchTiles * R * rb;
  for (int64_t b = 0; b < c.nb; ++b) {
    const uint8_t* blk = c.w + b * int64_t(sizeof(BlockQ4_0));
    prefetch_step<R * int(sizeof(BlockQ4_0))>(pf + b * R * int64_t(sizeof(BlockQ4_0)));
    __m512i lo[G], hi[G];
    for (int g = 0; g < G; ++g) {
      const uint8_t* q = blk + 4 * g * rb + 2;
      // two 256-bit inserts and one 512-bit: cheaper than three 512-bit inserts on Zen 4
      const __m256i v01 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))),
                                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + rb)), 1);
      const __m256i v23 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 2 * rb))),
                                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 3 * rb)), 1);
      const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(v01), v23, 1);
      lo[g] = _mm512_and_si512(v, m4);
      hi[g] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
    const __m256 dw = wide_scales<R>(blk, rb);
    for (int t = 0; t < T; ++t) {
      const int8_t* xq = x.q[t] + 32 * b;
      const __m512i xlo = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq)));
      const __m512i xhi = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq + 16)));
      // -8 * sum(x) over a row's 4 lanes
      const __m512i ns = _mm512_set1_epi32(2 * reinterpret_cast<const int32_t*>(x.sum[t])[b]);
      // dw * dx for all R rows at once, then spread to each row's lanes
      const __m512 sc = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_set1_ps(x.d[t][b])));
      for (int g = 0; g < G; ++g) {
        const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ns, lo[g], xlo), hi[g], xhi);
        acc[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(expand[g], sc), acc[g][t]);
      }
    }
  }
  for (int g = 0; g < G; ++g)
    for (int t = 0; t < T; ++t) {
      alignas(64) float tmp[16];
      _mm512_store_ps(tmp, acc[g][t]);
      for (int j = 0; j < 4; ++j)
        c.y[t * c.ldy + 4 * g + j] = (tmp[4 * j] + tmp[4 * j + 1]) + (tmp[4 * j + 2] + tmp[4 * j + 3]);
    }
}

// R rows (4 or 8) x T tokens of MXFP4: wide_q4_0 with each nibble looked up in the biased E2M1
// table (tiles_int.h; one vpshufb per 64 nibbles, the table in every 128-bit lane) and the rows'
// E8M0 scales rebuilt from their bytes, 8 at once. The bias, 16 * nsum a row, starts each of its
// 4 lanes at 4 * nsum.
template <int R, int T>
void wide_mxfp4(const Tile& c) {
  constexpr int G = R / 4;  // zmm per token
  constexpr int64_t kBlk = int64_t(sizeof(BlockMXFP4));
  __m512 acc[G][T];
  for (auto& a : acc)
    for (auto& v : a) v = _mm512_setzero_ps();
  const ActPtrs<T> x(c);
  const int64_t rb = c.row_bytes;
  const __m512i m4 = _mm512_set1_epi8(0x0F), lut = _mm512_broadcast_i32x4(mxfp4_lut128());
  __m512i expand[G];  // 128-bit lane j of vector g <- scale of row 4g + j
  for (int g = 0; g < G; ++g)
    expand[g] = _mm512_setr_epi32(4 * g, 4 * g, 4 * g, 4 * g, 4 * g + 1, 4 * g + 1, 4 * g + 1, 4 * g + 1,
                                  4 * g + 2, 4 * g + 2, 4 * g + 2, 4 * g + 2, 4 * g + 3, 4 * g + 3, 4 * g + 3, 4 * g + 3);
  const uint8_t* pf = c.w + kPrefetchTiles * R * rb;
  for (int64_t b = 0; b < c.nb; ++b) {
    const uint8_t* blk = c.w + b * kBlk;
    prefetch_step<R * int(kBlk)>(pf + b * R * kBlk);
    __m512i lo[G], hi[G];
    for (int g = 0; g < G; ++g) {
      const uint8_t* q = blk + 4 * g * rb + 1;
      const __m256i v01 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))),
                                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + rb)), 1);
      const __m256i v23 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 2 * rb))),
                                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 3 * rb)), 1);
      const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(v01), v23, 1);
      lo[g] = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, m4));
      hi[g] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
    }
    const __m256 dw = mxfp4_scales(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(mxfp4_exponents<R>(blk, rb)))));
    for (int t = 0; t < T; ++t) {
      const int8_t* xq = x.q[t] + 32 * b;
      const __m512i xlo = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq)));
      const __m512i xhi = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq + 16)));
      const __m512i ns = _mm512_set1_epi32(kMxfp4Bias / 4 * x.nsum(t)[b]);
      const __m512 sc = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_set1_ps(x.d[t][b])));
      for (int g = 0; g < G; ++g) {
        const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ns, lo[g], xlo), hi[g], xhi);
        acc[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(expand[g], sc), acc[g][t]);
      }
    }
  }
  for (int g = 0; g < G; ++g)
    for (int t = 0; t < T; ++t) {
      alignas(64) float tmp[16];
      _mm512_store_ps(tmp, acc[g][t]);
      for (int j = 0; j < 4; ++j)
        c.y[t * c.ldy + 4 * g + j] = (tmp[4 * j] + tmp[4 * j + 1]) + (tmp[4 * j + 2] + tmp[4 * j + 3]);
    }
}

// R rows (4 or 8) x T tokens of Q8_0.
template <int R, int T>
void wide_q8_0(const Tile& c) {
  constexpr int G = R / 2;  // zmm per token
  __m512 acc[G][T];
  for (auto& a : acc)
    for (auto& v : a) v = _mm512_setzero_ps();
  const ActPtrs<T> x(c);
  const int64_t rb = c.row_bytes;
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  __m512i expand[G];  // 256-bit half j of vector g <- scale of row 2g + j
  for (int g = 0; g < G; ++g) expand[g] = _mm512_inserti64x4(_mm512_set1_epi32(2 * g), _mm256_set1_epi32(2 * g + 1), 1);
  const uint8_t* pf = c.w + kPrefetchTiles * R * rb;
  for (int64_t b = 0; b < c.nb; ++b) {
    const uint8_t* blk = c.w + b * int64_t(sizeof(BlockQ8_0));
    prefetch_step<R * int(sizeof(BlockQ8_0))>(pf + b * R * int64_t(sizeof(BlockQ8_0)));
    __m512i u[G];
    for (int g = 0; g < G; ++g) {
      const uint8_t* q = blk + 2 * g * rb + 2;
      const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q))),
                                           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + rb)), 1);
      u[g] = _mm512_xor_si512(v, flip);
    }
    const __m256 dw = wide_scales<R>(blk, rb);
    for (int t = 0; t < T; ++t) {
      const int8_t* xq = x.q[t] + 32 * b;
      const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq)));
      // -128 * sum(x) over a row's 8 lanes
      const __m512i init = _mm512_set1_epi32(16 * reinterpret_cast<const int32_t*>(x.sum[t])[b]);
      const __m512 sc = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_set1_ps(x.d[t][b])));
      for (int g = 0; g < G; ++g) {
        const __m512i s = _mm512_dpbusd_epi32(init, u[g], xv);
        acc[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(expand[g], sc), acc[g][t]);
      }
    }
  }
  for (int g = 0; g < G; ++g)
    for (int t = 0; t < T; ++t) {
      alignas(64) float tmp[16];
      _mm512_store_ps(tmp, acc[g][t]);
      for (int j = 0; j < 2; ++j) {
        const float* p = tmp + 8 * j;
        c.y[t * c.ldy + 2 * g + j] = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
      }
    }
}

template <int R, int T>
void wide_tile(DType type, const Tile& c) {
  if (type == DType::Q4_0) wide_q4_0<R, T>(c);
  else if (type == DType::MXFP4) wide_mxfp4<R, T>(c);
  else wide_q8_0<R, T>(c);
}

// Rows [r, r+R) x tokens [t0, t1), as int_rows.
template <int R>
void wide_rows(const GemmArgs& a, const RowsView& v, int64_t r, int64_t t0, int64_t t1) {
  constexpr int TM = OpsAvx512::kMaxTokens;
  Tile c = rows_tile(a, v);  // Q8_0 activation rows: 32-element blocks
  c.w = a.w + r * a.row_bytes;
  for (int64_t t = t0; t < t1; t += TM) {
    c.act = v.act + (t - v.t_begin) * v.stride;
    c.y = a.y + t * a.ldy + r;
    switch (t1 - t < TM ? t1 - t : TM) {
      case 1: wide_tile<R, 1>(a.type, c); break;
      case 2: wide_tile<R, 2>(a.type, c); break;
      case 3: wide_tile<R, 3>(a.type, c); break;
      default: wide_tile<R, 4>(a.type, c); break;
    }
  }
}

}  // namespace

// gemm_int_classic for Q4_0 / Q8_0 / MXFP4: 8-row tiles, then one of 4, then single rows.
void gemm_wide(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  const int64_t tb = l2_token_block(v.stride, OpsAvx512::kMaxTokens);
  for (int64_t t0 = v.t_begin; t0 < a.n_tokens; t0 += tb) {
    const int64_t t1 = t0 + tb < a.n_tokens ? t0 + tb : a.n_tokens;
    int64_t r = r0;
    for (; r + 8 <= r1; r += 8) wide_rows<8>(a, v, r, t0, t1);
    for (; r + 4 <= r1; r += 4) wide_rows<4>(a, v, r, t0, t1);
    for (; r < r1; ++r) int_rows<OpsAvx512, 1>(a, v, r, t0, t1);
  }
}

}  // namespace tern::kern::avx512
