#pragma once
// The classic integer tiles of the K-quants (Q2_K..Q6_K) and the ternary types (TQ1_0, TQ2_0),
// with the unpacking of Q4_K / Q3_K scales that the AVX-512 token-lane tiles share; the classic
// driver over every type (int_tile, gemm_int_classic); and the weight types the x86 tables cover
// (x86_has_kernel). The tiles' conventions, the Ops policy and the Q8_0 / Q4_0 / Q5 / MXFP4
// tiles: tiles_int.h. Include only from *_avx2.cpp / *_avx512.cpp (unnamed namespace, as there).
#include "kernels/x86/tiles_int.h"

namespace tern::kern {
namespace {

// Unpacks Q4_K's twelve scale bytes into sc[0..7] (bytes 0..7) and m[0..7] (bytes 8..15),
// four bytes at a time (layout in quant_traits.h).
inline __m128i q4_k_scales_mins(const uint8_t* s) {
  uint32_t a, b, c;
  std::memcpy(&a, s, 4);
  std::memcpy(&b, s + 4, 4);
  std::memcpy(&c, s + 8, 4);
  const uint32_t sc_lo = a & 0x3F3F3F3Fu;
  const uint32_t sc_hi = (c & 0x0F0F0F0Fu) | ((a >> 2) & 0x30303030u);  // top bits of a -> bits 4,5
  const uint32_t m_lo = b & 0x3F3F3F3Fu;
  const uint32_t m_hi = ((c >> 4) & 0x0F0F0F0Fu) | ((b >> 2) & 0x30303030u);
  return _mm_setr_epi32(int(sc_lo), int(sc_hi), int(m_lo), int(m_hi));
}

// Q4_K x Q8_K per super-block: pmaddubsw (nibble x int8, no saturation: 2 * 15 * 127) then
// a multiply-add by the sub-block's scale into int32; the mins meet Q8_K's bsums (sums of
// 16 activations) in one pmaddwd. Q5_K (Block = BlockQ5_K): the same with each sub-block's
// fifth bits (bit j of qh[l] for sub-block j) or-ed into the nibbles as 16 (pairs <= 2 * 31 * 127).
template <class Ops, class Block, int R, int T>
void tile_q4_k(const Tile& c) {
  constexpr bool kQ5 = std::is_same_v<Block, BlockQ5_K>;
  __m256 acc[R][T];
  for (auto& a : acc)
    for (auto& v : a) v = _mm256_setzero_ps();
  const ActPtrs<T> x(c);
  const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  const uint8_t* pf = c.w + kPrefetchTiles * R * c.row_bytes;
  for (int64_t sb = 0; sb < c.nb; ++sb) {
    prefetch_step<R * int(sizeof(Block))>(pf + sb * R * int64_t(sizeof(Block)));
    for (int r = 0; r < R; ++r) {
      const Block* blk = reinterpret_cast<const Block*>(c.w + r * c.row_bytes) + sb;
      const __m128i sm = q4_k_scales_mins(blk->scales);
      const __m128i s16 = _mm_cvtepu8_epi16(sm);                     // sc0..sc7
      const __m128i m16 = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));  // m0..m7
      // bsums come per 16 elements: sub-block j covers bsums 2j and 2j+1.
      const __m256i mins = _mm256_set_m128i(_mm_unpackhi_epi16(m16, m16), _mm_unpacklo_epi16(m16, m16));
      const __m256i s16x2 = _mm256_set_m128i(s16, s16);
      // Two accumulators per token: vpdpwssd's latency would otherwise serialise the chain.
      __m256i S[T], S2[T];
      for (int t = 0; t < T; ++t) S[t] = S2[t] = _mm256_setzero_si256();
      __m256i qh = _mm256_setzero_si256();
      if constexpr (kQ5) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qh));
      for (int g = 0; g < 4; ++g) {  // 32 bytes of qs: sub-blocks 2g (low), 2g+1 (high nibbles)
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qs + 32 * g));
        __m256i lo = _mm256_and_si256(q, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if constexpr (kQ5) {  // (bit & 1) << 4 stays within its byte under the 16-bit shifts
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), one), 4));
          hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g + 1), one), 4));
        }
        const __m256i sc_lo = _mm256_shuffle_epi8(s16x2, _mm256_set1_epi16(short(0x0100 + 0x0202 * (2 * g))));
        const __m256i sc_hi = _mm256_shuffle_epi8(s16x2, _mm256_set1_epi16(short(0x0100 + 0x0202 * (2 * g + 1))));
        for (int t = 0; t < T; ++t) {
          const int8_t* xq = x.q[t] + kQK_K * sb + 64 * g;
          const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
          const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32));
          S[t] = Ops::dot_s16(S[t], _mm256_maddubs_epi16(lo, x0), sc_lo);
          S2[t] = Ops::dot_s16(S2[t], _mm256_maddubs_epi16(hi, x1), sc_hi);
        }
      }
      const float d = f16_to_f32(blk->d), dmin = f16_to_f32(blk->dmin);
      for (int t = 0; t < T; ++t) {
        const int16_t* bs = reinterpret_cast<const int16_t*>(x.sum[t]) + 16 * sb;
        const __m256i M = _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs)), mins);
        const float dx = x.d[t][sb];
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(S[t], S2[t])), _mm256_set1_ps(d * dx), acc[r][t]);
        acc[r][t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(M), _mm256_set1_ps(dmin * dx), acc[r][t]);
      }
    }
  }
  store_tile<R, T>(c, acc);
}

// Half h (128 weights) of a Q6_K block as unsigned 6-bit bytes: q[i] = weights 128h + 32i ..
// + 31 (ql's nibbles with qh's 2-bit pairs above them). The 16-bit shifts cannot leak bits
// across bytes: everything shifted is masked first. For tile_q6_k and the AVX-512 prep
// (lanes_avx512.cpp).
__attribute__((always_inline)) inline void q6_k_quants(const BlockQ6_K* blk, int h, __m256i (&q)[4]) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
  const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->ql + 64 * h));
  const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->ql + 64 * h + 32));
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qh + 32 * h));
  q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
  q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
  q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
  q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
}

// Q6_K x Q8_K: 6-bit quants rebuilt unsigned (0..63: pmaddubsw pairs <= 2 * 63 * 127 fit
// int16), multiplied by each 16-element sub-block's int8 scale in pmaddwd; the -32 offset is
// -32 * sum_j sc_j * bsums_j, one more pmaddwd per token.
template <class Ops, int R, int T>
void tile_q6_k(const Tile& c) {
  __m256 acc[R][T];
  for (auto& a : acc)
    for (auto& v : a) v = _mm256_setzero_ps();
  const ActPtrs<T> x(c);
  // pmaddubsw output int16 lanes 0..7 come from elements 0..15 (sub-block j), lanes 8..15 from
  // elements 16..31 (sub-block j+1): a pair vector holds sc_j in the low 128 bits, sc_j+1 in
  // the high. With the 8 scales of a half in both lanes, pair i picks int16 2i / 2i+1.
  __m256i pair_ctrl[4];
  for (int i = 0; i < 4; ++i)
    pair_ctrl[i] = _mm256_set_m128i(_mm_set1_epi16(short(0x0100 + 0x0202 * (2 * i + 1))),
                                    _mm_set1_epi16(short(0x0100 + 0x0202 * (2 * i))));
  const uint8_t* pf = c.w + kPrefetchTiles * R * c.row_bytes;
  for (int64_t sb = 0; sb < c.nb; ++sb) {
    prefetch_step<R * int(sizeof(BlockQ6_K))>(pf + sb * R * int64_t(sizeof(BlockQ6_K)));
    for (int r = 0; r < R; ++r) {
      const BlockQ6_K* blk = reinterpret_cast<const BlockQ6_K*>(c.w + r * c.row_bytes) + sb;
      const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->scales)));
      // One accumulator per half and token (latency of the vpdpwssd chain); the half-0 one
      // starts at the -32 offset term.
      __m256i S[2][T];
      for (int t = 0; t < T; ++t) {
        const int16_t* bs = reinterpret_cast<const int16_t*>(x.sum[t]) + 16 * sb;
        const __m256i M = _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs)), sc16);
        S[0][t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(M, 5));
        S[1][t] = _mm256_setzero_si256();
      }
      for (int h = 0; h < 2; ++h) {
        const __m256i L = h == 0 ? _mm256_permute2x128_si256(sc16, sc16, 0x00)
                                 : _mm256_permute2x128_si256(sc16, sc16, 0x11);
        __m256i q[4];
        q6_k_quants(blk, h, q);
        for (int i = 0; i < 4; ++i) {
          const __m256i scp = _mm256_shuffle_epi8(L, pair_ctrl[i]);
          for (int t = 0; t < T; ++t) {
            const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[t] + kQK_K * sb + 128 * h + 32 * i));
            S[h][t] = Ops::dot_s16(S[h][t], _mm256_maddubs_epi16(q[i], xv), scp);
          }
        }
      }
      const float d = f16_to_f32(blk->d);
      for (int t = 0; t < T; ++t)
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(S[0][t], S[1][t])),
                                    _mm256_set1_ps(d * x.d[t][sb]), acc[r][t]);
    }
  }
  store_tile<R, T>(c, acc);
}

// Q2_K / Q3_K x Q8_K: tile_q6_k's shape (16 sub-blocks of 16; a pmaddubsw of 32 elements is two
// sub-blocks, scaled in one pmaddwd by [sc_j x8 | sc_j+1 x8]). Q2_K: 2-bit quants, 4-bit scales,
// the mins' term one pmaddwd of Q8_K's bsums by the 4-bit mins. Q3_K: q3 = q + 4h (0..7), 6-bit
// scales - 32, the -4 offset -4 * sum_j sc_j * bsum_j (one pmaddwd).

// Q3_K's sixteen 6-bit scales (layout in quant_traits.h), minus 32, as int16.
inline __m256i q3_k_scales16(const uint8_t* s) {
  uint32_t a, b, c;
  std::memcpy(&a, s, 4);
  std::memcpy(&b, s + 4, 4);
  std::memcpy(&c, s + 8, 4);
  const uint32_t lo4 = 0x0F0F0F0Fu, hi2 = 0x03030303u;
  const __m128i sc = _mm_setr_epi32(int((a & lo4) | (c & hi2) << 4), int((b & lo4) | (c >> 2 & hi2) << 4),
                                    int((a >> 4 & lo4) | (c >> 4 & hi2) << 4), int((b >> 4 & lo4) | (c >> 6 & hi2) << 4));
  return _mm256_sub_epi16(_mm256_cvtepu8_epi16(sc), _mm256_set1_epi16(32));
}

template <class Ops, class Block, int R, int T>
void tile_q23_k(const Tile& c) {
  constexpr bool kQ3 = std::is_same_v<Block, BlockQ3_K>;
  __m256 acc[R][T];
  for (auto& a : acc)
    for (auto& v : a) v = _mm256_setzero_ps();
  const ActPtrs<T> x(c);
  const __m256i m3 = _mm256_set1_epi8(0x03), one = _mm256_set1_epi8(1);
  __m256i pair_ctrl[4];  // as in tile_q6_k
  for (int i = 0; i < 4; ++i)
    pair_ctrl[i] = _mm256_set_m128i(_mm_set1_epi16(short(0x0100 + 0x0202 * (2 * i + 1))),
                                    _mm_set1_epi16(short(0x0100 + 0x0202 * (2 * i))));
  const uint8_t* pf = c.w + kPrefetchTiles * R * c.row_bytes;
  for (int64_t sb = 0; sb < c.nb; ++sb) {
    prefetch_step<R * int(sizeof(Block))>(pf + sb * R * int64_t(sizeof(Block)));
    for (int r = 0; r < R; ++r) {
      const Block* blk = reinterpret_cast<const Block*>(c.w + r * c.row_bytes) + sb;
      __m256i sc16, m16 = _mm256_setzero_si256();
      if constexpr (kQ3) {
        sc16 = q3_k_scales16(blk->scales);
      } else {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->scales));
        sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(b, _mm_set1_epi8(0x0F)));
        m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F)));
      }
      // S[0] starts at Q3_K's offset term; M collects Q2_K's mins term
      __m256i S[2][T], M[T];
      for (int t = 0; t < T; ++t) {
        const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(reinterpret_cast<const int16_t*>(x.sum[t]) + 16 * sb));
        S[0][t] = kQ3 ? _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 2))
                      : _mm256_setzero_si256();
        S[1][t] = _mm256_setzero_si256();
        M[t] = kQ3 ? _mm256_setzero_si256() : _mm256_madd_epi16(bs, m16);
      }
      __m256i hm = _mm256_setzero_si256();
      if constexpr (kQ3) hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->hmask));
      for (int h = 0; h < 2; ++h) {
        const __m256i L = h == 0 ? _mm256_permute2x128_si256(sc16, sc16, 0x00) : _mm256_permute2x128_si256(sc16, sc16, 0x11);
        const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qs + 32 * h));
        for (int i = 0; i < 4; ++i) {
          // 16-bit shifts: every bit kept is masked to its own byte afterwards
          __m256i q = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * i), m3);
          if constexpr (kQ3) q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + i), one), 2));
          const __m256i scp = _mm256_shuffle_epi8(L, pair_ctrl[i]);
          for (int t = 0; t < T; ++t) {
            const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[t] + kQK_K * sb + 128 * h + 32 * i));
            S[h][t] = Ops::dot_s16(S[h][t], _mm256_maddubs_epi16(q, xv), scp);
          }
        }
      }
      const float d = f16_to_f32(blk->d);
      for (int t = 0; t < T; ++t) {
        const float dx = x.d[t][sb];
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(S[0][t], S[1][t])), _mm256_set1_ps(d * dx), acc[r][t]);
        if constexpr (!kQ3)
          acc[r][t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(M[t]), _mm256_set1_ps(f16_to_f32(blk->dmin) * dx), acc[r][t]);
      }
    }
  }
  store_tile<R, T>(c, acc);
}

// --- TQ1_0 / TQ2_0: ternary super-blocks of 256 -------------------------------------------
//
// The weights as their unsigned codes c = t + 1 (0..2; TQ2_0's 3, no trit, as ggml reads it:
// 3 - 1), pmaddubsw pairs <= 2 * 3 * 127; a super-block's sum is then sum c x - sum x. The sum x
// is formed per token by the same dot products with ones in place of c, so that its 8 lanes hold
// the very elements the weights' lanes do: each lane is sum (c - 1) x over its own elements,
// bounded by sum |t x|. (Q8_K's bsums give sum x in other lanes: lanes of size sum |x|, which far
// exceeds sum |t x| when most trits are 0, so their fma rounding grew past the reorder noise
// tests/kernels allows.) Integer sums exact, so equal to dot_tq1_0 / dot_tq2_0 of kernels/ref;
// then one fma per super-block into 8 float lanes, as the K-quant tiles.
//
// TQ1_0's code n of a byte b (quant_traits.h) is floor(3 q / 256), q = b 3^n mod 256. x86 has no
// byte multiply, so 16-bit lanes do it for their two bytes apart: the low byte from the low byte of
// the product (masked), the high one from the product of the lane with its low byte cleared (whose
// low byte is then 0 and no carry reaches the high one); pmulhuw by 768 (low: (q 768) >> 16 =
// 3q >> 8) and by 3 (high, q in bits 8..15: (q 256 3) >> 16), shifted back up a byte, give the
// codes. k16: the multiplier of each 16-bit lane (both its bytes get it). (Tried: q + q + q in
// wrapping byte adds and signed compares of the top-bit-flipped bytes, no multiplies: 6.8 against
// 6.0 ns per super-block on Zen 4, the triplings being a serial chain.)
inline __m256i tq1_codes(__m256i v, __m256i k16) {
  const __m256i lo_mask = _mm256_set1_epi16(0x00FF);
  const __m256i lo = _mm256_and_si256(_mm256_mullo_epi16(v, k16), lo_mask);
  const __m256i hi = _mm256_mullo_epi16(_mm256_andnot_si256(lo_mask, v), k16);
  return _mm256_or_si256(_mm256_mulhi_epu16(lo, _mm256_set1_epi16(768)),
                         _mm256_slli_epi16(_mm256_mulhi_epu16(hi, _mm256_set1_epi16(3)), 8));
}

// The 8 code vectors of a TQ1_0 super-block, code vector i against activations 32i..32i+31:
// qs[0..31]'s codes 0..4 (elements 32n + m); qs[32..47] in both 128-bit lanes with codes n and n + 1
// (elements 160 + 16n + m: two runs of 16 that join); then qs[32..47]'s code 4 (elements 224..239)
// beside qh[0..3] repeated four times, the repeat k at code k (elements 240 + 4k + j).
inline void tq1_0_unpack(const BlockTQ1_0* blk, __m256i (&c)[8]) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qs));
  for (int n = 0; n < 5; ++n) c[n] = tq1_codes(v, _mm256_set1_epi16(short(kTq1Pow3[n])));
  const __m128i v16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->qs + 32));
  const __m256i w = _mm256_set_m128i(v16, v16);
  c[5] = tq1_codes(w, _mm256_set_m128i(_mm_set1_epi16(3), _mm_set1_epi16(1)));
  c[6] = tq1_codes(w, _mm256_set_m128i(_mm_set1_epi16(27), _mm_set1_epi16(9)));
  uint32_t qh;
  std::memcpy(&qh, blk->qh, 4);
  const __m256i last = _mm256_set_m128i(_mm_set1_epi32(int(qh)), v16);
  c[7] = tq1_codes(last, _mm256_setr_epi16(81, 81, 81, 81, 81, 81, 81, 81, 1, 1, 3, 3, 9, 9, 27, 27));
}

// TQ2_0's codes as Q2_K's quants: element 128h + 32l + m in bits 2l of qs[32h + m].
inline void tq2_0_unpack(const BlockTQ2_0* blk, __m256i (&c)[8]) {
  const __m256i m3 = _mm256_set1_epi8(0x03);
  for (int h = 0; h < 2; ++h) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qs + 32 * h));
    // 16-bit shifts: every bit kept is masked to its own byte afterwards
    for (int l = 0; l < 4; ++l) c[4 * h + l] = _mm256_and_si256(l == 0 ? v : _mm256_srli_epi16(v, 2 * l), m3);
  }
}

template <class Ops, class Block, int R, int T>
void tile_tq(const Tile& c) {
  __m256 acc[R][T];
  for (auto& a : acc)
    for (auto& v : a) v = _mm256_setzero_ps();
  const ActPtrs<T> x(c);
  const __m256i ones = _mm256_set1_epi8(1);
  const uint8_t* pf = c.w + kPrefetchTiles * R * c.row_bytes;
  for (int64_t sb = 0; sb < c.nb; ++sb) {
    prefetch_step<R * int(sizeof(Block))>(pf + sb * R * int64_t(sizeof(Block)));
    __m256i neg_sum[T];  // -sum x, in the weights' lanes
    for (int t = 0; t < T; ++t) {
      __m256i s = _mm256_setzero_si256();
      for (int i = 0; i < 8; ++i)
        s = Ops::dot_u8s8(s, ones, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[t] + kQK_K * sb + 32 * i)));
      neg_sum[t] = _mm256_sub_epi32(_mm256_setzero_si256(), s);
    }
    for (int r = 0; r < R; ++r) {
      const Block* blk = reinterpret_cast<const Block*>(c.w + r * c.row_bytes) + sb;
      __m256i q[8];
      if constexpr (std::is_same_v<Block, BlockTQ1_0>) tq1_0_unpack(blk, q);
      else tq2_0_unpack(blk, q);
      const float d = f16_to_f32(blk->d);
      for (int t = 0; t < T; ++t) {
        // two chains: the dot products' latency would otherwise serialise them
        __m256i S = neg_sum[t], S2 = _mm256_setzero_si256();
        const int8_t* xq = x.q[t] + kQK_K * sb;
        for (int i = 0; i < 8; i += 2) {
          S = Ops::dot_u8s8(S, q[i], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * i)));
          S2 = Ops::dot_u8s8(S2, q[i + 1], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * i + 32)));
        }
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(S, S2)), _mm256_set1_ps(d * x.d[t][sb]), acc[r][t]);
      }
    }
  }
  store_tile<R, T>(c, acc);
}

// --- classic driver ------------------------------------------------------------------------

template <class Ops, int R, int T>
void int_tile(DType type, const Tile& c) {
  switch (type) {
    case DType::Q8_0: tile_q8_0<Ops, R, T>(c); break;
    case DType::Q4_0: tile_q32<Ops, BlockQ4_0, R, T>(c); break;
    case DType::Q4_1: tile_q32<Ops, BlockQ4_1, R, T>(c); break;
    case DType::Q5_0: tile_q32<Ops, BlockQ5_0, R, T>(c); break;
    case DType::Q5_1: tile_q32<Ops, BlockQ5_1, R, T>(c); break;
    case DType::Q2_K: tile_q23_k<Ops, BlockQ2_K, R, T>(c); break;
    case DType::Q3_K: tile_q23_k<Ops, BlockQ3_K, R, T>(c); break;
    case DType::Q4_K: tile_q4_k<Ops, BlockQ4_K, R, T>(c); break;
    case DType::Q5_K: tile_q4_k<Ops, BlockQ5_K, R, T>(c); break;
    case DType::Q6_K: tile_q6_k<Ops, R, T>(c); break;
    case DType::MXFP4: tile_mxfp4<Ops, R, T>(c); break;
    case DType::TQ1_0: tile_tq<Ops, BlockTQ1_0, R, T>(c); break;
    case DType::TQ2_0: tile_tq<Ops, BlockTQ2_0, R, T>(c); break;
    default: break;
  }
}

// A tile over a's weights and the Rows activations v; w, act and y are set per use.
inline Tile rows_tile(const GemmArgs& a, const RowsView& v) {
  Tile c;
  c.row_bytes = a.row_bytes;
  c.act_stride = v.stride;
  c.off_d = v.off_d;
  c.off_sum = v.off_sum;
  c.nb = a.n_in / v.block;
  c.ldy = a.ldy;
  return c;
}

// Rows [r, r+R) x tokens [t0, t1) of a quantized weight, Rows activations.
template <class Ops, int R>
void int_rows(const GemmArgs& a, const RowsView& v, int64_t r, int64_t t0, int64_t t1) {
  constexpr int TM = Ops::kMaxTokens;
  Tile c = rows_tile(a, v);
  c.w = a.w + r * a.row_bytes;
  for (int64_t t = t0; t < t1; t += TM) {
    c.act = v.act + (t - v.t_begin) * v.stride;
    c.y = a.y + t * a.ldy + r;
    const int64_t n = t1 - t < TM ? t1 - t : TM;
    if (n == TM) int_tile<Ops, R, TM>(a.type, c);
    else if (n == 1) int_tile<Ops, R, 1>(a.type, c);
    else if constexpr (TM > 2) {
      if (n == 2) int_tile<Ops, R, 2>(a.type, c);
      else if constexpr (TM > 3) {
        if (n == 3) int_tile<Ops, R, 3>(a.type, c);
      }
    }
  }
}

// Tokens [v.t_begin, n_tokens) are taken in blocks whose activations stay in L2 while every
// row of the chunk passes over them; within a block, 4-row x TM-token tiles.
template <class Ops>
void gemm_int_classic(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  const int64_t tb = l2_token_block(v.stride, Ops::kMaxTokens);
  for (int64_t t0 = v.t_begin; t0 < a.n_tokens; t0 += tb) {
    const int64_t t1 = t0 + tb < a.n_tokens ? t0 + tb : a.n_tokens;
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) int_rows<Ops, 4>(a, v, r, t0, t1);
    for (; r < r1; ++r) int_rows<Ops, 1>(a, v, r, t0, t1);
  }
}

// The weight types the x86 tables run: the integer tiles here, the float ones in tiles_float.h
// (each table's choice of tiles: its kTileChoices).
constexpr DType kX86KernelTypes[] = {
    DType::F32,  DType::F16,  DType::BF16, DType::Q8_0, DType::Q4_0,  DType::Q4_1,  DType::Q5_0,  DType::Q5_1,
    DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::MXFP4, DType::TQ1_0, DType::TQ2_0,
};
inline bool x86_has_kernel(DType t) {
  for (DType k : kX86KernelTypes)
    if (k == t) return true;
  return false;
}

}  // namespace
}  // namespace tern::kern
