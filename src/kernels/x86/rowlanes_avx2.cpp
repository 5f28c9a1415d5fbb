// AVX2 row-lane tiles of weights interleaved by 16 rows (kernels/matmul.h): Q4_0, Q8_0, Q4_1,
// Q5_0, Q5_1, MXFP4, Q4_K, Q5_K and Q6_K, a row per 32-bit lane. The classic tiles of the rows as
// stored and the AVX2 table are in matmul_avx2.cpp.
#include "kernels/x86/rowlanes_avx2.h"

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/x86/tiles_int.h"

namespace tern::kern {
namespace {

// --- Q4_0 / Q8_0 interleaved by 16 rows: row-lane tiles ------------------------------------
//
// In the interleaved layout (kernels/matmul.h) the 32 bytes at 32 + 64k + 32h of a group's
// block hold quant bytes 4k..4k+3 of rows 8h..8h+7, one row per 32-bit lane: the AVX-512
// layout, whose 64-byte pieces are two AVX2 vectors. Against a broadcast of the token's 4
// matching activation bytes, pmaddubsw + pmaddwd leave each lane its own row's sum, so a block
// needs no horizontal folding (pair_q4_0 / quad_q8_0 spend a phaddw or three phaddd per 4 rows
// and token) and its float tail (convert, scale, FMA) runs once per 8 rows and token; the
// unpacked weights serve T tokens. One token (decode) runs the same tiles, so a token's
// results do not depend on its batch.
//
// No int16 step saturates. Q4_0 (nibbles 0..15, |x| <= 127): a pmaddubsw pair sum is <= 3810,
// and a lane's low- plus high-nibble sums over the block's 4 steps <= 8 * 3810 = 30480, kept in
// int16 until one pmaddwd. Q8_0: the sign trick (|w| unsigned, w's sign moved onto x), pair
// sums <= 2 * 128 * 127, widened by pmaddwd at every step.

template <bool kQ4>
constexpr int64_t kGroupBlk = 16 * (kQ4 ? int64_t(sizeof(BlockQ4_0)) : int64_t(sizeof(BlockQ8_0)));

// 4 activation bytes at p in every 32-bit lane (one broadcast load).
inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// A row-lane tile's results: halves [h0, h0 + H) of a group x T tokens into y (token i at
// y + i * ldy, the group's row 0 at y), only the rows whose bit is set in `keep` (16 bits).
template <int H, int T>
inline void store_halves(const __m256 (&acc)[H][T], int h0, float* y, int64_t ldy, uint32_t keep) {
  for (int h = 0; h < H; ++h) {
    const uint32_t k8 = (keep >> (8 * (h0 + h))) & 0xFFu;
    for (int i = 0; i < T; ++i) {
      float* yr = y + i * ldy + 8 * (h0 + h);
      if (k8 == 0xFFu) {
        _mm256_storeu_ps(yr, acc[h][i]);
      } else {
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, acc[h][i]);
        for (int r = 0; r < 8; ++r)
          if (k8 >> r & 1u) yr[r] = tmp[r];
      }
    }
  }
}

// Tokens [t, t + n) of one group in tiles of up to T tokens, halves [h0, h1): both halves in one
// tile up to K::kBothHalvesTokens tokens, else half by half. K::tile<H, T>(group, nb, v, t, h0,
// pf, y, ldy, keep) is the type's tile.
template <class K, int T>
void rowlane8_tokens(const uint8_t* group, int64_t nb, const RowsView& v, int64_t t, int64_t n, int h0,
                     int h1, const uint8_t* pf, float* y, int64_t ldy, uint32_t keep) {
  if constexpr (T > 1) {
    if (n < T) return rowlane8_tokens<K, T - 1>(group, nb, v, t, n, h0, h1, pf, y, ldy, keep);
  }
  if (h1 - h0 == 2 && T <= K::kBothHalvesTokens) return K::template tile<2, T>(group, nb, v, t, 0, pf, y, ldy, keep);
  for (int h = h0; h < h1; ++h) K::template tile<1, T>(group, nb, v, t, h, h == h0 ? pf : nullptr, y, ldy, keep);
}

// Rows [r0, r1) x all tokens of weights interleaved by 16, with K's tiles (K::kTokens tokens
// each, K::kBlock elements and K::kGroupBlock bytes per block of a group; a half of a group
// with no row in [r0, r1) is not computed).
template <class K>
void gemm_interleaved(const GemmArgs& a, int64_t r0, int64_t r1) {
  const RowsView v = rows_view(a);
  const int64_t nb = a.n_in / K::kBlock;
  for_each_interleaved_tile<K::kTokens>(
      a, v, r0, r1, nb * K::kGroupBlock,
      [&](const uint8_t* group, int64_t t, int64_t n, int lo, int hi, const uint8_t* pf, float* y) {
        rowlane8_tokens<K, K::kTokens>(group, nb, v, t, n, lo / 8, (hi + 7) / 8, pf, y, a.ldy, rows_mask(lo, hi));
      });
}

// Halves [h0, h0 + H) (8 rows each) of the group at `group` x tokens [t, t + T) of the Rows
// view; y points at (token t, the group's row 0); `keep` has a bit per row (16) to store.
// Not inlined: a tile runs a whole row of blocks, and inlined into its callers GCC allocated
// its registers worse (Q4_0 GEMM 380 instead of 420 GFLOP/s).
template <bool kQ4, int H, int T>
__attribute__((noinline)) void rowlane8_tile(const uint8_t* group, int64_t nb, const RowsView& v, int64_t t, int h0,
                   const uint8_t* pf, float* y, int64_t ldy, uint32_t keep) {
  const ActPtrs<T> x(v, t);
  __m256 acc[H][T];
  for (auto& a : acc)
    for (auto& s : a) s = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * kGroupBlk<kQ4>;
    if (pf) prefetch_step<int(kGroupBlk<kQ4>)>(pf + b * kGroupBlk<kQ4>);
    __m256i s[H][T];
    for (auto& a : s)
      for (auto& e : a) e = _mm256_setzero_si256();
    if constexpr (kQ4) {
#pragma GCC unroll 1
      for (int k = 0; k < 4; ++k)
        for (int h = 0; h < H; ++h) {
          const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 + 64 * k + 32 * (h0 + h)));
          const __m256i lo = _mm256_and_si256(d, m4);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(d, 4), m4);
          for (int i = 0; i < T; ++i) {
            const int8_t* xp = x.q[i] + 32 * b + 4 * k;
            s[h][i] = _mm256_add_epi16(s[h][i], _mm256_add_epi16(_mm256_maddubs_epi16(lo, broadcast4(xp)),
                                                                 _mm256_maddubs_epi16(hi, broadcast4(xp + 16))));
          }
        }
    } else {
#pragma GCC unroll 1
      for (int k = 0; k < 8; ++k)
        for (int h = 0; h < H; ++h) {
          const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 + 64 * k + 32 * (h0 + h)));
          const __m256i aw = _mm256_abs_epi8(w);
          for (int i = 0; i < T; ++i) {
            const __m256i xs = _mm256_sign_epi8(broadcast4(x.q[i] + 32 * b + 4 * k), w);
            s[h][i] = _mm256_add_epi32(s[h][i], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xs), ones));
          }
        }
    }
    for (int h = 0; h < H; ++h) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * (h0 + h))));
      for (int i = 0; i < T; ++i) {
        __m256i si = s[h][i];
        // Q4_0's nibbles are q + 8: add 8 * nsum = -8 * sum(x)
        if constexpr (kQ4) si = _mm256_add_epi32(_mm256_madd_epi16(si, ones), _mm256_slli_epi32(_mm256_set1_epi32(x.nsum(i)[b]), 3));
        acc[h][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_mul_ps(dw, _mm256_set1_ps(x.d[i][b])), acc[h][i]);
      }
    }
  }
  store_halves<H, T>(acc, h0, y, ldy, keep);
}

// Tokens per tile, measured (2048 x 5632, 128 tokens, 2 threads, GFLOP/s): Q4_0 16 rows x 2
// tokens 420, 8 x 4 411, 8 x 5 418, 8 x 6 404; Q8_0 (more registers per step) 16 x 2 237,
// 8 x 4 250, 8 x 6 264.
template <bool kQ4>
struct RowLanesQ32 {
  static constexpr int kTokens = kQ4 ? 2 : 6, kBothHalvesTokens = 2;
  static constexpr int64_t kBlock = 32, kGroupBlock = kGroupBlk<kQ4>;
  template <int H, int T>
  static void tile(const uint8_t* group, int64_t nb, const RowsView& v, int64_t t, int h0, const uint8_t* pf, float* y,
                   int64_t ldy, uint32_t keep) {
    rowlane8_tile<kQ4, H, T>(group, nb, v, t, h0, pf, y, ldy, keep);
  }
};

// --- Q4_1 / Q5_0 / Q5_1 interleaved by 16 rows: row-lane tiles ------------------------------
//
// rowlane8_tile's Q4_0 path on Q32xLayout's group blocks, a row per 32-bit lane. The fifth bits
// of nibble group g come from the lane's permuted qh: one shift, an and with 0x10, an or (with
// qh as stored: a pshufb, and, compare, and, or per group; Q5_0 GEMM 244 instead of 298
// GFLOP/s). Quants reach 31, so each step's
// pmaddubsw pair (low + high nibbles <= 2 * 2 * 31 * 127) goes to int32 right away. Q5_0's -16
// offset is 16 * nsum; Q4_1 / Q5_1's m meets sum(x) = -nsum * dx in one more FMA per block.

template <DType kType, int H, int T>
__attribute__((noinline)) void rowlane8_q32x_tile(const uint8_t* group, int64_t nb, const RowsView& v, int64_t t,
                                                  int h0, const uint8_t* pf, float* y, int64_t ldy, uint32_t keep) {
  using L = Q32xLayout<kType>;
  const ActPtrs<T> x(v, t);
  __m256 acc[H][T];
  for (auto& a : acc)
    for (auto& e : a) e = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * L::kBlk;
    if (pf) prefetch_step<int(L::kBlk)>(pf + b * L::kBlk);
    for (int h = 0; h < H; ++h) {
      const int half = h0 + h;
      __m256i s[T];
      for (auto& e : s) e = _mm256_setzero_si256();
      __m256i qh = _mm256_setzero_si256();
      if constexpr (L::kHigh) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + L::kH + 32 * half));
#pragma GCC unroll 1
      for (int k = 0; k < 4; ++k) {
        const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + L::kQ + 64 * k + 32 * half));
        __m256i lo = _mm256_and_si256(d, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(d, 4), m4);
        if constexpr (L::kHigh) {
          lo = _mm256_or_si256(lo, _mm256_and_si256(q5_group_bits(qh, k), sixteen));
          hi = _mm256_or_si256(hi, _mm256_and_si256(q5_group_bits(qh, k + 4), sixteen));
        }
        for (int i = 0; i < T; ++i) {
          const int8_t* xp = x.q[i] + 32 * b + 4 * k;
          const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, broadcast4(xp)), _mm256_maddubs_epi16(hi, broadcast4(xp + 16)));
          s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(p, ones));
        }
      }
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * half)));
      __m256 mw = _mm256_setzero_ps();
      if constexpr (L::kMin) mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32 + 16 * half)));
      for (int i = 0; i < T; ++i) {
        const int32_t ns = x.nsum(i)[b];
        const float dx = x.d[i][b];
        __m256i si = s[i];
        if constexpr (kType == DType::Q5_0) si = _mm256_add_epi32(si, _mm256_set1_epi32(16 * ns));
        acc[h][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_mul_ps(dw, _mm256_set1_ps(dx)), acc[h][i]);
        if constexpr (L::kMin) acc[h][i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(-float(ns) * dx), acc[h][i]);
      }
    }
  }
  store_halves<H, T>(acc, h0, y, ldy, keep);
}

// Tokens per tile (2048 x 5632, 128 tokens, 2 threads, GFLOP/s): Q5_0 8 rows x 2 tokens 221,
// x 4 282, x 6 298; Q5_1 212, 261, 270 (their fifth bits cost more to unpack, shared by more
// tokens); Q4_1 keeps Q4_0's 16 x 2 (293).
template <DType kType>
struct RowLanesQ32x {
  static constexpr int kTokens = Q32xLayout<kType>::kHigh ? 6 : 2, kBothHalvesTokens = 2;
  static constexpr int64_t kBlock = 32, kGroupBlock = Q32xLayout<kType>::kBlk;
  template <int H, int T>
  static void tile(const uint8_t* group, int64_t nb, const RowsView& v, int64_t t, int h0, const uint8_t* pf, float* y,
                   int64_t ldy, uint32_t keep) {
    rowlane8_q32x_tile<kType, H, T>(group, nb, v, t, h0, pf, y, ldy, keep);
  }
};

// --- MXFP4 interleaved by 16 rows: row-lane tiles --------------------------------------------
//
// The group block of a block of 32 (kernels/matmul.h): the 16 rows' E8M0 bytes, then Q4_0's 4
// nibble pieces at 16 + 64k, a row per 32-bit lane. rowlane8_tile's Q4_0 path with each nibble
// looked up in the biased table (tiles_int.h): its values reach 28, so a step's pmaddubsw pairs
// (low + high nibbles <= 2 * 2 * 28 * 127 = 14224) sum in int16 for two steps, not four, before
// pmaddwd takes them to int32. The bias comes back as 16 * nsum; the float steps per block are
// those of AVX-512's interleaved tiles (rowlanes_avx512.cpp: fma(cvt(s), dw * dx, acc)), so both
// give the same bits.

constexpr int64_t kGroupBlkMxfp4 = 16 * int64_t(sizeof(BlockMXFP4));

template <int H, int T>
__attribute__((noinline)) void rowlane8_mxfp4_tile(const uint8_t* group, int64_t nb, const RowsView& v, int64_t t,
                                                   int h0, const uint8_t* pf, float* y, int64_t ldy, uint32_t keep) {
  const ActPtrs<T> x(v, t);
  __m256 acc[H][T];
  for (auto& a : acc)
    for (auto& e : a) e = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0x0F);
  const __m256i lut = _mm256_broadcastsi128_si256(mxfp4_lut128());
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * kGroupBlkMxfp4;
    if (pf) prefetch_step<int(kGroupBlkMxfp4)>(pf + b * kGroupBlkMxfp4);
    for (int h = 0; h < H; ++h) {
      const int half = h0 + h;
      __m256i s[T];
      for (auto& e : s) e = _mm256_setzero_si256();
#pragma GCC unroll 1
      for (int k0 = 0; k0 < 4; k0 += 2) {
        __m256i s16[T];  // two steps' sums: <= 2 * 14224, still int16
        for (auto& e : s16) e = _mm256_setzero_si256();
        for (int k = k0; k < k0 + 2; ++k) {
          const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 64 * k + 32 * half));
          const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(d, m4));
          const __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(d, 4), m4));
          for (int i = 0; i < T; ++i) {
            const int8_t* xp = x.q[i] + 32 * b + 4 * k;
            s16[i] = _mm256_add_epi16(s16[i], _mm256_add_epi16(_mm256_maddubs_epi16(lo, broadcast4(xp)),
                                                               _mm256_maddubs_epi16(hi, broadcast4(xp + 16))));
          }
        }
        for (int i = 0; i < T; ++i) s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(s16[i], ones));
      }
      const __m256 dw = mxfp4_scales(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 8 * half))));
      for (int i = 0; i < T; ++i) {
        const __m256i si = _mm256_add_epi32(s[i], _mm256_slli_epi32(_mm256_set1_epi32(x.nsum(i)[b]), 4));
        acc[h][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_mul_ps(dw, _mm256_set1_ps(x.d[i][b])), acc[h][i]);
      }
    }
  }
  store_halves<H, T>(acc, h0, y, ldy, keep);
}

struct RowLanesMxfp4 {
  static constexpr int kTokens = 2, kBothHalvesTokens = 2;
  static constexpr int64_t kBlock = 32, kGroupBlock = kGroupBlkMxfp4;
  template <int H, int T>
  static void tile(const uint8_t* group, int64_t nb, const RowsView& v, int64_t t, int h0, const uint8_t* pf, float* y,
                   int64_t ldy, uint32_t keep) {
    rowlane8_mxfp4_tile<H, T>(group, nb, v, t, h0, pf, y, ldy, keep);
  }
};

// --- Q4_K interleaved by 16 rows: row-lane tiles ---------------------------------------------
//
// The group block of a super-block (kernels/matmul.h): d[16] and dmin[16] (f16) at 0 and 32;
// at 64 + 16j, row i's byte sc_j | (m_j & 3) << 6 of sub-block j; at 192 + 4i, row i's m_j >> 2
// in nibble j; at 256 + 64p, piece p = 8c + k: bytes 32c + 4k..+3 of the 16 rows' qs. A piece's
// low nibbles are elements 64c + 4k..+3 of sub-block 2c, its high nibbles the same of 2c + 1.
// Per sub-block, 8 pmaddubsw steps against broadcast activation bytes sum in int16 (pairs <=
// 2 * 15 * 128, 8 steps <= 30720), then one pmaddwd by the rows' 6-bit scales (each lane holding
// sc twice) takes them to int32; the mins meet Q8_K's bsums (two sums of 16 per sub-block, one
// broadcast) in one pmaddwd per sub-block. The float tail runs once per super-block.

constexpr int64_t kGroupBlkQ4K = 16 * int64_t(sizeof(BlockQ4_K));
// Q5_K (kQ5): Q4_K's group block with its qh pieces (matmul.h); each piece's fifth bits are
// shifted to bit 4 and or-ed into the nibbles. Its quants reach 31,
// so pmaddubsw pairs reach 2 * 31 * 127 and only 4 steps may sum in int16 (31496) before the
// pmaddwd by the scales: two rounds per sub-block pair.
constexpr int64_t kGroupBlkQ5K = 16 * int64_t(sizeof(BlockQ5_K));

template <bool kQ5, int H, int T>
__attribute__((noinline)) void rowlane8_q4_k_tile(const uint8_t* group, int64_t nsb, const RowsView& v, int64_t t,
                                                  int h0, const uint8_t* pf, float* y, int64_t ldy, uint32_t keep) {
  constexpr int64_t kGroupBlk = kQ5 ? kGroupBlkQ5K : kGroupBlkQ4K;
  constexpr int kSteps = kQ5 ? 4 : 8;  // pmaddubsw steps summed in int16
  const ActPtrs<T> x(v, t);
  __m256 acc[H][T];
  for (auto& a : acc)
    for (auto& e : a) e = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
  const __m256i m6 = _mm256_set1_epi32(63), low4 = _mm256_set1_epi32(15);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = group + sb * kGroupBlk;
    if (pf) prefetch_step<int(kGroupBlk)>(pf + sb * kGroupBlk);
    for (int h = 0; h < H; ++h) {
      const int half = h0 + h;
      __m256i S[T], M[T];
      for (int i = 0; i < T; ++i) S[i] = M[i] = _mm256_setzero_si256();
      __m256i m_high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 192 + 32 * half));
#pragma GCC unroll 1
      for (int c = 0; c < 4; ++c) {
        __m256i sc2[2];
        for (int jj = 0; jj < 2; ++jj) {
          const int j = 2 * c + jj;
          const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 64 + 16 * j + 8 * half)));
          const __m256i sc = _mm256_and_si256(b, m6);
          const __m256i m = _mm256_or_si256(_mm256_srli_epi32(b, 6), _mm256_slli_epi32(_mm256_and_si256(m_high, low4), 2));
          m_high = _mm256_srli_epi32(m_high, 4);  // sub-block j + 1's nibble next
          sc2[jj] = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));  // sc in both int16 halves
          const __m256i m2 = _mm256_or_si256(m, _mm256_slli_epi32(m, 16));
          for (int i = 0; i < T; ++i)
            M[i] = _mm256_add_epi32(M[i], _mm256_madd_epi16(m2, broadcast4(reinterpret_cast<const int8_t*>(x.bsums(i) + 16 * sb + 2 * j))));
        }
#pragma GCC unroll 1
        for (int k0 = 0; k0 < 8; k0 += kSteps) {
          __m256i slo[T], shi[T];
          for (int i = 0; i < T; ++i) slo[i] = shi[i] = _mm256_setzero_si256();
#pragma GCC unroll 1
          for (int k = k0; k < k0 + kSteps; ++k) {
            const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + (kQ5 ? (c == 0 ? 256 + 128 * k : 768 + 512 * c + 64 * k) : 256 + 64 * (8 * c + k)) + 32 * half));
            __m256i lo = _mm256_and_si256(d, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(d, 4), m4);
            if constexpr (kQ5) {  // bits 2c and 2c + 1 of each qh byte to bit 4 (16-bit shifts by <= 4 stay in the byte)
              const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 320 + 128 * k + 32 * half));
              const auto to_bit4 = [&](int bit) {
                return bit <= 4 ? _mm256_sll_epi16(q, _mm_cvtsi32_si128(4 - bit)) : _mm256_srl_epi16(q, _mm_cvtsi32_si128(bit - 4));
              };
              lo = _mm256_or_si256(lo, _mm256_and_si256(to_bit4(2 * c), sixteen));
              hi = _mm256_or_si256(hi, _mm256_and_si256(to_bit4(2 * c + 1), sixteen));
            }
            for (int i = 0; i < T; ++i) {
              const int8_t* xp = x.q[i] + kQK_K * sb + 64 * c + 4 * k;
              slo[i] = _mm256_add_epi16(slo[i], _mm256_maddubs_epi16(lo, broadcast4(xp)));
              shi[i] = _mm256_add_epi16(shi[i], _mm256_maddubs_epi16(hi, broadcast4(xp + 32)));
            }
          }
          for (int i = 0; i < T; ++i) {
            S[i] = _mm256_add_epi32(S[i], _mm256_madd_epi16(slo[i], sc2[0]));
            S[i] = _mm256_add_epi32(S[i], _mm256_madd_epi16(shi[i], sc2[1]));
          }
        }
      }
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * half)));
      const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32 + 16 * half)));
      for (int i = 0; i < T; ++i) {
        const __m256 dx = _mm256_set1_ps(x.d[i][sb]);
        acc[h][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S[i]), _mm256_mul_ps(dw, dx), acc[h][i]);
        acc[h][i] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(M[i]), _mm256_mul_ps(dmin, dx), acc[h][i]);
      }
    }
  }
  store_halves<H, T>(acc, h0, y, ldy, keep);
}

// Q4_K 16 rows x 2 tokens: 335 GFLOP/s, 8 x 4 325; Q5_K (costlier unpack, shared by more
// tokens) 16 x 2 195-217, 8 x 3 226, 8 x 4 253.
template <bool kQ5>
struct RowLanesQ4K {
  static constexpr int kTokens = kQ5 ? 4 : 2, kBothHalvesTokens = 2;
  static constexpr int64_t kBlock = kQK_K, kGroupBlock = kQ5 ? kGroupBlkQ5K : kGroupBlkQ4K;
  template <int H, int T>
  static void tile(const uint8_t* group, int64_t nb, const RowsView& v, int64_t t, int h0, const uint8_t* pf, float* y,
                   int64_t ldy, uint32_t keep) {
    rowlane8_q4_k_tile<kQ5, H, T>(group, nb, v, t, h0, pf, y, ldy, keep);
  }
};

// --- Q6_K interleaved by 16 rows: row-lane tiles ---------------------------------------------
//
// The group block of a super-block (kernels/matmul.h): d[16] (f16) at 0; at 32 + 32p + 2i row
// i's int8 scales (sc_2p, sc_2p+1); then, for half n of the super-block and l = 4k..4k+3, a step
// of 192 bytes at 288 + 192 (8n + k): the rows' ql bytes 64n + l, ql bytes 64n + 32 + l and qh
// bytes 32n + l (4 bytes a row), in the order the tiles read them. They rebuild the 6-bit quants
// (0..63) of elements 128n + 32qt + l, qt = 0..3, which lie in sub-block j = 8n + 2qt + k / 4.
// (With the ql and qh pieces in separate runs, a lone token's tiles, three streams per block,
// read DRAM at half the speed.) A scale pair, sign-extended to int16, is one row
// per 32-bit lane: the pmaddwd operand of the -32 offset (-32 * sum_j sc_j * bsum_j, bsums of
// Q8_K) as it is, and, with one half copied into both, the scale a sub-block's sums are
// multiplied by. pmaddubsw pair sums reach 2 * 63 * 128 = 16128, so two steps sum in int16
// before each pmaddwd.

constexpr int64_t kGroupBlkQ6K = 16 * int64_t(sizeof(BlockQ6_K));
constexpr int64_t kQ6KScales = 32, kQ6KSteps = 288;  // a step: 192 bytes, ql a | ql b | qh

template <int H, int T>
__attribute__((noinline)) void rowlane8_q6_k_tile(const uint8_t* group, int64_t nsb, const RowsView& v, int64_t t,
                                                  int h0, const uint8_t* pf, float* y, int64_t ldy, uint32_t keep) {
  const ActPtrs<T> x(v, t);
  __m256 acc[H][T];
  for (auto& a : acc)
    for (auto& e : a) e = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
  // (a, b) int16 pairs -> (a, a) or (b, b)
  const __m256i dup[2] = {_mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4, 5, 8,
                                           9, 8, 9, 12, 13, 12, 13),
                          _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15, 2, 3, 2, 3, 6, 7, 6,
                                           7, 10, 11, 10, 11, 14, 15, 14, 15)};
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = group + sb * kGroupBlkQ6K;
    if (pf) prefetch_step<int(kGroupBlkQ6K)>(pf + sb * kGroupBlkQ6K);
    for (int h = 0; h < H; ++h) {
      const int half = h0 + h;
      const auto pair = [&](int p) {
        return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQ6KScales + 32 * p + 16 * half)));
      };
      __m256i S[T];
      for (int i = 0; i < T; ++i) {
        __m256i o = _mm256_setzero_si256();
        for (int p = 0; p < 8; ++p)
          o = _mm256_add_epi32(o, _mm256_madd_epi16(pair(p), broadcast4(reinterpret_cast<const int8_t*>(x.bsums(i) + 16 * sb + 2 * p))));
        S[i] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(o, 5));
      }
      for (int n = 0; n < 2; ++n)
        for (int kk = 0; kk < 2; ++kk) {
          __m256i sc2[4];
          for (int qt = 0; qt < 4; ++qt) sc2[qt] = _mm256_shuffle_epi8(pair(4 * n + qt), dup[kk]);
#pragma GCC unroll 1
          for (int k2 = 0; k2 < 2; ++k2) {
            __m256i s16[4][T];
            for (auto& a : s16)
              for (auto& e : a) e = _mm256_setzero_si256();
            for (int ks = 0; ks < 2; ++ks) {
              const int k = 4 * kk + 2 * k2 + ks;
              const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQ6KSteps + 192 * (8 * n + k) + 32 * half));
              const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQ6KSteps + 192 * (8 * n + k) + 64 + 32 * half));
              const __m256i hq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQ6KSteps + 192 * (8 * n + k) + 128 + 32 * half));
              for (int qt = 0; qt < 4; ++qt) {
                // low nibble (qt 0, 1) or high (2, 3) of ql piece a (qt even) or b, and the 2 bits
                // 2qt..2qt+1 of qh; the 16-bit shifts move only masked bits within their byte
                const __m256i l = qt & 1 ? b : a;
                const __m256i lo = qt < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
                const __m256i hb = _mm256_and_si256(qt == 0 ? hq : _mm256_srli_epi16(hq, 2 * qt), m2);
                const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4));
                for (int i = 0; i < T; ++i)
                  s16[qt][i] = _mm256_add_epi16(s16[qt][i],
                                                _mm256_maddubs_epi16(q, broadcast4(x.q[i] + kQK_K * sb + 128 * n + 32 * qt + 4 * k)));
              }
            }
            for (int i = 0; i < T; ++i)
              for (int qt = 0; qt < 4; ++qt) S[i] = _mm256_add_epi32(S[i], _mm256_madd_epi16(s16[qt][i], sc2[qt]));
          }
        }
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * half)));
      for (int i = 0; i < T; ++i)
        acc[h][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S[i]), _mm256_mul_ps(dw, _mm256_set1_ps(x.d[i][sb])), acc[h][i]);
    }
  }
  store_halves<H, T>(acc, h0, y, ldy, keep);
}

struct RowLanesQ6K {
  static constexpr int kTokens = 2, kBothHalvesTokens = 1;
  static constexpr int64_t kBlock = kQK_K, kGroupBlock = kGroupBlkQ6K;
  template <int H, int T>
  static void tile(const uint8_t* group, int64_t nb, const RowsView& v, int64_t t, int h0, const uint8_t* pf, float* y,
                   int64_t ldy, uint32_t keep) {
    rowlane8_q6_k_tile<H, T>(group, nb, v, t, h0, pf, y, ldy, keep);
  }
};

}  // namespace

void gemm_interleaved_avx2(const GemmArgs& a, int64_t r0, int64_t r1) {
  using Gemm = void (*)(const GemmArgs&, int64_t, int64_t);
  static constexpr struct {
    DType type;
    Gemm gemm;
  } kTiles[] = {{DType::Q4_0, gemm_interleaved<RowLanesQ32<true>>},
                {DType::Q8_0, gemm_interleaved<RowLanesQ32<false>>},
                {DType::Q4_1, gemm_interleaved<RowLanesQ32x<DType::Q4_1>>},
                {DType::Q5_0, gemm_interleaved<RowLanesQ32x<DType::Q5_0>>},
                {DType::Q5_1, gemm_interleaved<RowLanesQ32x<DType::Q5_1>>},
                {DType::Q4_K, gemm_interleaved<RowLanesQ4K<false>>},
                {DType::Q5_K, gemm_interleaved<RowLanesQ4K<true>>},
                {DType::MXFP4, gemm_interleaved<RowLanesMxfp4>},
                {DType::Q6_K, gemm_interleaved<RowLanesQ6K>}};
  for (const auto& t : kTiles)
    if (t.type == a.type) return t.gemm(a, r0, r1);
  fail("gemm_interleaved: no AVX2 interleaved tile reads ", dtype_name(a.type));
}

}  // namespace tern::kern
