// AVX-512 row-lane tiles of weights interleaved by 16 rows for the types with a block layout of
// their own (kernels/matmul.h): Q4_K / Q5_K, Q4_1 / Q5_0 / Q5_1 (Q32xLayout), Q2_K / Q3_K and
// TQ1_0 / TQ2_0. A row per int32 lane of a zmm, as in rowlanes_avx512.cpp, which has the Q4_0 /
// Q8_0 / MXFP4 tiles and the reasoning behind the row lanes.
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/x86/avx512_tiles.h"

namespace tern::kern::avx512 {
namespace {

constexpr int kRowLanes = 16;  // weight rows per zmm, one per int32 lane

// Q4_K interleaved by 16 rows (kernels/matmul.h): one zmm per 64-byte piece, a row per lane,
// as the AVX2 tiles read it with two ymm. A sub-block's 8 vpdpbusd steps (nibbles against 4
// broadcast activation bytes) sum in int32, which vpmulld scales by the rows' 6-bit scales;
// the mins meet Q8_K's bsums (two sums of 16 per sub-block, one broadcast) in one vpdpwssd.
// The same exact integer sums and float steps as the AVX2 tiles, so the same bits.
// Q5_K (kQ5): the same tile, each piece's fifth bits (the qh piece of its k: sub-block j's in
// bit j of each byte) shifted to bit 4 and or-ed into the nibbles.
constexpr int64_t kGroupBlkQ4K = 16 * int64_t(sizeof(BlockQ4_K));
constexpr int64_t kGroupBlkQ5K = 16 * int64_t(sizeof(BlockQ5_K));

// Bit `bit` of every byte moved to bit 4 (other bits are garbage: the caller masks 0x10). A
// 16-bit shift by at most 4 brings bit 4 of a byte from within the same byte.
inline __m512i hshift(__m512i h, int bit) {
  return bit <= 4 ? _mm512_sll_epi16(h, _mm_cvtsi32_si128(4 - bit)) : _mm512_srl_epi16(h, _mm_cvtsi32_si128(bit - 4));
}

template <bool kQ5, int TC>
__attribute__((noinline)) void rowlane_q4_k_tile(const RowsView& v, const uint8_t* group, int64_t nsb, __mmask16 keep,
                                                 const uint8_t* pf, int64_t t, float* y, int64_t ldy) {
  constexpr int64_t kGroupBlk = kQ5 ? kGroupBlkQ5K : kGroupBlkQ4K;
  const __m512i sixteen = _mm512_set1_epi8(16);
  const ActPtrs<TC> x(v, t);
  __m512 acc[TC];
  for (auto& e : acc) e = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i m6 = _mm512_set1_epi32(63), low4 = _mm512_set1_epi32(15);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = group + sb * kGroupBlk;
    if (pf) prefetch_step<int(kGroupBlk)>(pf + sb * kGroupBlk);
    __m512i S[TC], M[TC];
    for (int i = 0; i < TC; ++i) S[i] = M[i] = _mm512_setzero_si512();
    __m512i m_high = _mm512_loadu_si512(blk + 192);
#pragma GCC unroll 1
    for (int c = 0; c < 4; ++c) {
      __m512i slo[TC], shi[TC];
      for (int i = 0; i < TC; ++i) slo[i] = shi[i] = _mm512_setzero_si512();
#pragma GCC unroll 1
      for (int k = 0; k < 8; ++k) {
        const __m512i d = _mm512_loadu_si512(blk + (kQ5 ? (c == 0 ? 256 + 128 * k : 768 + 512 * c + 64 * k) : 256 + 64 * (8 * c + k)));
        __m512i lo = _mm512_and_si512(d, m4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(d, 4), m4);
        if constexpr (kQ5) {
          const __m512i h = _mm512_loadu_si512(blk + 320 + 128 * k);
          // bit 2c (2c + 1) of each byte to bit 4, or-ed in: (a & b) | c
          lo = _mm512_ternarylogic_epi32(_mm512_and_si512(hshift(h, 2 * c), sixteen), lo, lo, 0xFC);
          hi = _mm512_ternarylogic_epi32(_mm512_and_si512(hshift(h, 2 * c + 1), sixteen), hi, hi, 0xFC);
        }
        for (int i = 0; i < TC; ++i) {
          const int8_t* xp = x.q[i] + kQK_K * sb + 64 * c + 4 * k;
          int32_t x0, x1;
          std::memcpy(&x0, xp, 4);
          std::memcpy(&x1, xp + 32, 4);
          slo[i] = _mm512_dpbusd_epi32(slo[i], lo, _mm512_set1_epi32(x0));
          shi[i] = _mm512_dpbusd_epi32(shi[i], hi, _mm512_set1_epi32(x1));
        }
      }
      for (int jj = 0; jj < 2; ++jj) {
        const int j = 2 * c + jj;
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 64 + 16 * j)));
        const __m512i sc = _mm512_and_si512(b, m6);
        const __m512i m = _mm512_or_si512(_mm512_srli_epi32(b, 6), _mm512_slli_epi32(_mm512_and_si512(m_high, low4), 2));
        m_high = _mm512_srli_epi32(m_high, 4);  // sub-block j + 1's nibble next
        const __m512i m2 = _mm512_or_si512(m, _mm512_slli_epi32(m, 16));  // m in both int16 halves
        for (int i = 0; i < TC; ++i) {
          S[i] = _mm512_add_epi32(S[i], _mm512_mullo_epi32(jj ? shi[i] : slo[i], sc));
          int32_t bs;
          std::memcpy(&bs, x.bsums(i) + 16 * sb + 2 * j, 4);
          M[i] = _mm512_dpwssd_epi32(M[i], m2, _mm512_set1_epi32(bs));
        }
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    for (int i = 0; i < TC; ++i) {
      const __m512 dx = _mm512_set1_ps(x.d[i][sb]);
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[i]), _mm512_mul_ps(dw, dx), acc[i]);
      acc[i] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M[i]), _mm512_mul_ps(dmin, dx), acc[i]);
    }
  }
  for (int i = 0; i < TC; ++i) _mm512_mask_storeu_ps(y + i * ldy, keep, acc[i]);
}

// tile.template operator()<N>() for the tile of N = n tokens (1 <= n <= TC).
template <int TC, class Tile>
inline void tokens_tile(int64_t n, Tile&& tile) {
  if constexpr (TC > 1) {
    if (n < TC) return tokens_tile<TC - 1>(n, tile);
  }
  tile.template operator()<TC>();
}

template <bool kQ5>
void gemm_interleaved_q4_k(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  const int64_t nsb = a.n_in / kQK_K;
  for_each_interleaved_tile<4>(
      a, v, r0, r1, nsb * (kQ5 ? kGroupBlkQ5K : kGroupBlkQ4K),
      [&](const uint8_t* group, int64_t t, int64_t n, int lo, int hi, const uint8_t* pf, float* y) {
        tokens_tile<4>(n, [&]<int TC>() {
          rowlane_q4_k_tile<kQ5, TC>(v, group, nsb, __mmask16(rows_mask(lo, hi)), pf, t, y, a.ldy);
        });
      });
}

// Q4_1 / Q5_0 / Q5_1 interleaved by 16 rows (Q32xLayout): rowlane_tile's Q4_0 path, a row per
// lane, with the fifth bits of nibble group g shifted from the lane's permuted qh to bit 4 and
// or-ed in (a shift and a vpternlogd);
// Q5_0's offset starts the integer sum at 16 * nsum, Q4_1 / Q5_1's m meets sum(x) = -nsum * dx
// in one more FMA per block and token.
template <DType kType, int TC>
__attribute__((noinline)) void rowlane_q32x_tile(const RowsView& v, const uint8_t* group, int64_t nb, __mmask16 keep,
                                                 const uint8_t* pf, int64_t t, float* y, int64_t ldy) {
  using L = Q32xLayout<kType>;
  const ActPtrs<TC> x(v, t);
  __m512 acc[TC];
  for (auto& e : acc) e = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * L::kBlk;
    if (pf) prefetch_step<int(L::kBlk)>(pf + b * L::kBlk);
    __m512i w[8];
    for (int k = 0; k < 4; ++k) {
      const __m512i d = load_piece(blk + L::kQ + 64 * k);
      w[k] = _mm512_and_si512(d, m4);
      w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(d, 4), m4);
    }
    if constexpr (L::kHigh) {
      const __m512i qh = load_piece(blk + L::kH);
      for (int g = 0; g < 8; ++g) {  // (shifted qh & 0x10) | w: one vpternlogd
        const __m512i sh = g <= 4 ? _mm512_slli_epi32(qh, unsigned(4 - g)) : _mm512_srli_epi32(qh, unsigned(g - 4));
        w[g] = _mm512_ternarylogic_epi32(sh, sixteen, w[g], 0xEA);
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    __m512 mw = _mm512_setzero_ps();
    if constexpr (L::kMin) mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
#pragma GCC unroll 16
    for (int i = 0; i < TC; ++i) {
      const int8_t* xq = x.q[i] + 32 * b;
      // Q5_0: 16 * nsum as a broadcast load and a shift (from a general-purpose register a
      // broadcast costs two vector operations on Zen 4)
      __m512i s = kType == DType::Q5_0 ? _mm512_slli_epi32(_mm512_set1_epi32(x.nsum(i)[b]), 4) : _mm512_setzero_si512();
      // w[k] holds elements 4k..4k+3 (k >= 4: the high nibbles, 16 + 4(k - 4))
      s = dot_block32(s, w, xq);
      const float dx = x.d[i][b];
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(_mm512_set1_ps(dx), dw), acc[i]);
      if constexpr (L::kMin) acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(-float(x.nsum(i)[b]) * dx), acc[i]);
    }
  }
  for (int i = 0; i < TC; ++i) _mm512_mask_storeu_ps(y + i * ldy, keep, acc[i]);
}

template <DType kType>
void gemm_interleaved_q32x(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  const int64_t nb = a.n_in / 32;
  for_each_interleaved_tile<kRowLanes>(
      a, v, r0, r1, nb * Q32xLayout<kType>::kBlk,
      [&](const uint8_t* group, int64_t t, int64_t n, int lo, int hi, const uint8_t* pf, float* y) {
        tokens_tile<kRowLanes>(n, [&]<int TC>() {
          rowlane_q32x_tile<kType, TC>(v, group, nb, __mmask16(rows_mask(lo, hi)), pf, t, y, a.ldy);
        });
      });
}

// Q3_K and Q2_K interleaved by 16 rows (kernels/matmul.h), a row per lane. Per 16-element
// sub-block j, 4 vpdpbusd of the quants against broadcast activation bytes, scaled by the rows'
// sub-block scale (vpmulld). Q3_K (kQ3): quants q3 = q + 4h (0..7), scales sc_j - 32 decoded
// from the rows' three packed dwords (sc_4q..4q+3 in the bytes of s[q]); the -4 offset is
// -4 * sum_j (sc_j - 32) * bsum_j, 8 vpdpwssd of the rows' scale pairs against Q8_K's bsums
// pairs. Q2_K: 2-bit quants, scales and mins the nibbles of the rows' 16 scale bytes (4
// dwords); the mins' term -dmin * sum_j m_j * bsum_j the same 8 vpdpwssd. Every first touch of a
// super-block's bytes is in address order (Q3_K's hmask pieces sit beside the qs pieces that
// first need them).
constexpr int64_t kGroupBlkQ3K = 16 * int64_t(sizeof(BlockQ3_K));
constexpr int64_t kGroupBlkQ2K = 16 * int64_t(sizeof(BlockQ2_K));

template <bool kQ3, int TC>
__attribute__((noinline)) void rowlane_q23_k_tile(const RowsView& v, const uint8_t* group, int64_t nsb, __mmask16 keep,
                                                  const uint8_t* pf, int64_t t, float* y, int64_t ldy) {
  constexpr int64_t kGroupBlk = kQ3 ? kGroupBlkQ3K : kGroupBlkQ2K;
  const ActPtrs<TC> x(v, t);
  __m512 acc[TC];
  for (auto& e : acc) e = _mm512_setzero_ps();
  const __m512i lo4 = _mm512_set1_epi32(0x0F0F0F0F), hi2 = _mm512_set1_epi32(0x03030303);
  const __m512i m3 = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1), byte = _mm512_set1_epi32(0xFF);
  const __m512i nib = _mm512_set1_epi32(0x0F), thirty2 = _mm512_set1_epi32(32), low16 = _mm512_set1_epi32(0xFFFF);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = group + sb * kGroupBlk;
    if (pf) prefetch_step<int(kGroupBlk)>(pf + sb * kGroupBlk);
    __m512i s[4];  // bytes of s[q]: sub-blocks 4q..4q+3's scale (Q3_K, 0..63) or scale | min << 4 (Q2_K)
    if constexpr (kQ3) {
      const __m512i A = _mm512_loadu_si512(blk + 32), B = _mm512_loadu_si512(blk + 96), C = _mm512_loadu_si512(blk + 160);
      s[0] = _mm512_or_si512(_mm512_and_si512(A, lo4), _mm512_slli_epi32(_mm512_and_si512(C, hi2), 4));
      s[1] = _mm512_or_si512(_mm512_and_si512(B, lo4), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(C, 2), hi2), 4));
      s[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(A, 4), lo4),
                             _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(C, 4), hi2), 4));
      s[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(B, 4), lo4),
                             _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(C, 6), hi2), 4));
    } else {
      for (int q = 0; q < 4; ++q) s[q] = _mm512_loadu_si512(blk + 64 + 64 * q);
    }
    const auto field = [&](int j) { return _mm512_and_si512(_mm512_srli_epi32(s[j / 4], unsigned(8 * (j % 4))), byte); };
    // the multiplier of sub-block j's dot: sc_j - 32 (Q3_K) or the scale nibble (Q2_K)
    const auto scale = [&](int j) { return kQ3 ? _mm512_sub_epi32(field(j), thirty2) : _mm512_and_si512(field(j), nib); };
    // the bsums' multiplier: Q3_K's scale again, Q2_K's min
    const auto offset = [&](int j) { return kQ3 ? scale(j) : _mm512_srli_epi32(field(j), 4); };
    __m512i S[TC];
    for (int i = 0; i < TC; ++i) S[i] = _mm512_setzero_si512();
    for (int p = 0; p < 8; ++p) {  // pairs (offset_2p, offset_2p+1) as int16 against bsums 2p, 2p+1
      const __m512i pair = _mm512_or_si512(_mm512_and_si512(offset(2 * p), low16), _mm512_slli_epi32(offset(2 * p + 1), 16));
      for (int i = 0; i < TC; ++i) {
        int32_t bs;
        std::memcpy(&bs, x.bsums(i) + 16 * sb + 2 * p, 4);
        S[i] = _mm512_dpwssd_epi32(S[i], pair, _mm512_set1_epi32(bs));
      }
    }
    __m512i M[TC];  // Q2_K: the mins' sum; Q3_K: S starts at -4 times the offsets' sum
    for (int i = 0; i < TC; ++i) {
      M[i] = S[i];
      S[i] = kQ3 ? _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(S[i], 2)) : _mm512_setzero_si512();
    }
#pragma GCC unroll 1
    for (int j = 0; j < 16; ++j) {  // sub-block j: half n, group g, first or second 16 of the 32
      const int n = j / 8, g = (j % 8) / 2, h16 = j % 2;
      __m512i d[TC];
      for (int i = 0; i < TC; ++i) d[i] = _mm512_setzero_si512();
      for (int st = 0; st < 4; ++st) {
        const int pq = 8 * n + 4 * h16 + st;
        // 32-bit shifts by <= 7, then a mask: each kept bit comes from its own byte
        __m512i q;
        if constexpr (kQ3) {
          const __m512i qs = _mm512_loadu_si512(blk + (pq < 8 ? 224 + 128 * pq : 736 + 64 * pq));
          const __m512i hm = _mm512_loadu_si512(blk + 288 + 128 * (4 * h16 + st));
          q = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(qs, unsigned(2 * g)), m3),
                              _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hm, unsigned(4 * n + g)), one), 2));
        } else {
          q = _mm512_and_si512(_mm512_srli_epi32(_mm512_loadu_si512(blk + 320 + 64 * pq), unsigned(2 * g)), m3);
        }
        for (int i = 0; i < TC; ++i) {
          int32_t xk;
          std::memcpy(&xk, x.q[i] + kQK_K * sb + 16 * j + 4 * st, 4);
          d[i] = _mm512_dpbusd_epi32(d[i], q, _mm512_set1_epi32(xk));
        }
      }
      const __m512i sc = scale(j);
      for (int i = 0; i < TC; ++i) S[i] = _mm512_add_epi32(S[i], _mm512_mullo_epi32(d[i], sc));
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    __m512 dmin = _mm512_setzero_ps();
    if constexpr (!kQ3) dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    for (int i = 0; i < TC; ++i) {
      const __m512 dx = _mm512_set1_ps(x.d[i][sb]);
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[i]), _mm512_mul_ps(dw, dx), acc[i]);
      if constexpr (!kQ3) acc[i] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M[i]), _mm512_mul_ps(dmin, dx), acc[i]);
    }
  }
  for (int i = 0; i < TC; ++i) _mm512_mask_storeu_ps(y + i * ldy, keep, acc[i]);
}

template <bool kQ3>
void gemm_interleaved_q23_k(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  const int64_t nsb = a.n_in / kQK_K;
  for_each_interleaved_tile<8>(
      a, v, r0, r1, nsb * (kQ3 ? kGroupBlkQ3K : kGroupBlkQ2K),
      [&](const uint8_t* group, int64_t t, int64_t n, int lo, int hi, const uint8_t* pf, float* y) {
        tokens_tile<8>(n, [&]<int TC>() {
          rowlane_q23_k_tile<kQ3, TC>(v, group, nsb, __mmask16(rows_mask(lo, hi)), pf, t, y, a.ldy);
        });
      });
}

// TQ2_0 and TQ1_0 interleaved by 16 rows (kernels/matmul.h: the rows' f16 d at 0, then the
// block's quant bytes 4 at a time, piece p at 32 + 64p), a row per lane. The weights as their
// unsigned codes c = t + 1 against Q8_K's int8 activations in vpdpbusd; a super-block's integer
// sum is sum c x - sum x, exact, the token's sum x from its 16 bsums. Then the reference's float
// steps, acc + cvt(S) * (d * dx) without an fma (kernels/ref: dot_tq1_0 / dot_tq2_0), so the
// reference's bits for every batch size and row range.
constexpr int64_t kGroupBlkTQ1 = 16 * int64_t(sizeof(BlockTQ1_0));
constexpr int64_t kGroupBlkTQ2 = 16 * int64_t(sizeof(BlockTQ2_0));

// -(sum of a token's 256 activations of a super-block), from its 16 bsums.
inline int32_t tq_neg_sum(const int16_t* bs) {
  int32_t s = 0;
  for (int j = 0; j < 16; ++j) s -= bs[j];
  return s;
}

// The float step of the reference, per token: acc + cvt(S) * (d * dx), rounded twice. The
// product by an explicitly rounded multiply (round to nearest, MXCSR's mode): GCC contracts a
// plain mul and add of intrinsics into an fma here, as it may in these translation units, not
// in the baseline reference.
template <int TC, class ActP>
inline void tq_scale(__m512 (&acc)[TC], const __m512i (&S)[TC], __m512 dw, const ActP& x, int64_t sb) {
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int i = 0; i < TC; ++i) {
    const __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(x.d[i][sb]));
    acc[i] = _mm512_add_ps(acc[i], _mm512_mul_round_ps(_mm512_cvtepi32_ps(S[i]), dd, kNearest));
  }
}

// TQ2_0: piece p holds qs bytes 4p..4p+3 (h = p / 8, m = 4 (p % 8)..), whose 2-bit field l is the
// code of elements 128h + 32l + m... Up to 4 tokens (decode, small batches) each field is masked
// in place, not shifted down (one vpandd where a shift and a mask take two): its codes times 4^l,
// summed in a chain of its own and divided out exactly (an arithmetic shift of a multiple of 4^l)
// at the super-block's end; the 4 chains per token also hide vpdpbusd's latency. From 5 tokens
// on the tokens' own chains do that, and the fields are shifted down once for all of them.
template <int TC>
__attribute__((noinline)) void rowlane_tq2_0_tile(const RowsView& v, const uint8_t* group, int64_t nsb, __mmask16 keep,
                                                  const uint8_t* pf, int64_t t, float* y, int64_t ldy) {
  constexpr bool kInPlace = TC <= 4;
  constexpr int kChains = kInPlace ? 4 : 1;
  const ActPtrs<TC> x(v, t);
  __m512 acc[TC];
  for (auto& e : acc) e = _mm512_setzero_ps();
  const __m512i m3 = _mm512_set1_epi8(3);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = group + sb * kGroupBlkTQ2;
    if (pf) prefetch_step<int(kGroupBlkTQ2)>(pf + sb * kGroupBlkTQ2);
    __m512i S[TC][kChains];
    for (int i = 0; i < TC; ++i) {
      S[i][0] = _mm512_set1_epi32(tq_neg_sum(x.bsums(i) + 16 * sb));
      for (int c = 1; c < kChains; ++c) S[i][c] = _mm512_setzero_si512();
    }
    const int8_t* xs[TC];
    for (int i = 0; i < TC; ++i) xs[i] = x.q[i] + kQK_K * sb;
#pragma GCC unroll 16
    for (int p = 0; p < 16; ++p) {
      const __m512i d = _mm512_loadu_si512(blk + 32 + 64 * p);
      const int e0 = 128 * (p / 8) + 4 * (p % 8);
      for (int l = 0; l < 4; ++l) {
        // 16-bit shifts: every bit kept is masked to its own byte afterwards
        const __m512i q = kInPlace ? _mm512_and_si512(d, _mm512_set1_epi8(char(3 << (2 * l))))
                                   : _mm512_and_si512(l == 0 ? d : _mm512_srli_epi16(d, unsigned(2 * l)), m3);
        for (int i = 0; i < TC; ++i) {
          int32_t xk;
          std::memcpy(&xk, xs[i] + e0 + 32 * l, 4);
          __m512i& s = S[i][kInPlace ? l : 0];
          s = _mm512_dpbusd_epi32(s, q, _mm512_set1_epi32(xk));
        }
      }
    }
    __m512i tot[TC];
    for (int i = 0; i < TC; ++i) {
      tot[i] = S[i][0];
      for (int c = 1; c < kChains; ++c) tot[i] = _mm512_add_epi32(tot[i], _mm512_srai_epi32(S[i][c], unsigned(2 * c)));
    }
    tq_scale<TC>(acc, tot, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk))), x, sb);
  }
  for (int i = 0; i < TC; ++i) _mm512_mask_storeu_ps(y + i * ldy, keep, acc[i]);
}

// TQ1_0: trit n of a byte b has the code c_n = floor(3 q_n / 256), q_n = b 3^n mod 256
// (quant_traits.h). Piece p's bytes (p < 8: qs 4p.., 8..11: qs 32 + 4(p - 8).., 12: qh) hold trit n
// of elements 32n + 4p.., 160 + 16n + 4(p - 8).. and 240 + 4n.. (qh: trits 0..3, its fifth trit
// is no element). Two ways to the codes' dot with x, by token count:
//  - up to 3 tokens (decode, small batches), without decoding: 3 q_n = 256 c_n + q_(n+1), so
//    sum c_n x = (3 sum q_n x - sum q_(n+1) x) / 256 exactly, with q_(n+1) = q_n + q_n + q_n in
//    wrapping byte adds: per trit vector two byte adds and two vpdpbusd (A against q_n, B against
//    q_(n+1)), where decoding the codes takes 6 operations. B starts at 256 sum x, so that
//    (3A - B) / 256 is the super-block's sum c x - sum x. Bounds: |A|, |B| <= 65 * 4 * 255 * 128 +
//    2^23 < 2^24. Two chains per token, split by piece kChains ways to hide vpdpbusd's latency.
//  - from 4 tokens on, the codes once for all of them: q_n of the even and the odd bytes apart in
//    16-bit lanes (l, h: the byte in the low half), 3 q_n by vpmullw, whose bits 8..9 are c_n and
//    low byte q_(n+1); the odd bytes' codes are then in place (bits 8..15), the even ones' shifted
//    down: 6 operations per trit vector and one vpdpbusd per token, one chain per token.
// The decode from 4 tokens on against the adds at every size, bench_matmul (2048 x 5632, 2
// threads, 3 alternating pairs on a shared Xeon): 128 tokens 209 / 227 / 240 -> 215 / 265 / 261
// GFLOP/s, 8 tokens 501 / 254 / 255 -> 542 / 289 / 251.
template <int TC>
__attribute__((noinline)) void rowlane_tq1_0_tile(const RowsView& v, const uint8_t* group, int64_t nsb, __mmask16 keep,
                                                  const uint8_t* pf, int64_t t, float* y, int64_t ldy) {
  constexpr bool kDecode = TC >= 4;
  constexpr int kChains = TC == 1 ? 4 : TC == 2 ? 2 : 1;
  const ActPtrs<TC> x(v, t);
  __m512 acc[TC];
  for (auto& e : acc) e = _mm512_setzero_ps();
  const __m512i low8 = _mm512_set1_epi16(0x00FF), high8 = _mm512_set1_epi16(short(0xFF00)), three = _mm512_set1_epi16(3);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = group + sb * kGroupBlkTQ1;
    if (pf) prefetch_step<int(kGroupBlkTQ1)>(pf + sb * kGroupBlkTQ1);
    // kDecode: A[i][0] the token's sum c x - sum x; else A and B as above
    __m512i A[TC][kChains], B[TC][kChains];
    for (int i = 0; i < TC; ++i)
      for (int c = 0; c < kChains; ++c) {
        const int32_t neg_sum = c == 0 ? tq_neg_sum(x.bsums(i) + 16 * sb) : 0;
        A[i][c] = kDecode ? _mm512_set1_epi32(neg_sum) : _mm512_setzero_si512();
        B[i][c] = _mm512_set1_epi32(-256 * neg_sum);
      }
    const int8_t* xs[TC];
    for (int i = 0; i < TC; ++i) xs[i] = x.q[i] + kQK_K * sb;
#pragma GCC unroll 13
    for (int p = 0; p < 13; ++p) {
      __m512i q = _mm512_loadu_si512(blk + 32 + 64 * p);
      __m512i l = _mm512_and_si512(q, low8), h = _mm512_srli_epi16(q, 8);
      const int n_trits = p < 12 ? 5 : 4;
      for (int n = 0; n < n_trits; ++n) {
        const int e = p < 8 ? 32 * n + 4 * p : p < 12 ? 160 + 16 * n + 4 * (p - 8) : 240 + 4 * n;
        if constexpr (kDecode) {
          const __m512i tl = _mm512_mullo_epi16(l, three), th = _mm512_mullo_epi16(h, three);
          const __m512i codes = _mm512_ternarylogic_epi32(th, high8, _mm512_srli_epi16(tl, 8), 0xEA);  // (th & high8) | tl >> 8
          l = _mm512_and_si512(tl, low8);
          h = _mm512_and_si512(th, low8);
          for (int i = 0; i < TC; ++i) {
            int32_t xk;
            std::memcpy(&xk, xs[i] + e, 4);
            A[i][0] = _mm512_dpbusd_epi32(A[i][0], codes, _mm512_set1_epi32(xk));
          }
        } else {
          const __m512i q_next = _mm512_add_epi8(_mm512_add_epi8(q, q), q);
          for (int i = 0; i < TC; ++i) {
            int32_t xk;
            std::memcpy(&xk, xs[i] + e, 4);
            const __m512i xb = _mm512_set1_epi32(xk);
            A[i][p % kChains] = _mm512_dpbusd_epi32(A[i][p % kChains], q, xb);
            B[i][p % kChains] = _mm512_dpbusd_epi32(B[i][p % kChains], q_next, xb);
          }
          q = q_next;
        }
      }
    }
    __m512i tot[TC];
    for (int i = 0; i < TC; ++i) {
      if constexpr (kDecode) {
        tot[i] = A[i][0];
        continue;
      }
      __m512i a = A[i][0], b = B[i][0];
      for (int c = 1; c < kChains; ++c) {
        a = _mm512_add_epi32(a, A[i][c]);
        b = _mm512_add_epi32(b, B[i][c]);
      }
      tot[i] = _mm512_srai_epi32(_mm512_sub_epi32(_mm512_add_epi32(_mm512_add_epi32(a, a), a), b), 8);
    }
    tq_scale<TC>(acc, tot, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk))), x, sb);
  }
  for (int i = 0; i < TC; ++i) _mm512_mask_storeu_ps(y + i * ldy, keep, acc[i]);
}

template <DType kType>
void gemm_interleaved_tq(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  const int64_t nsb = a.n_in / kQK_K;
  constexpr bool kTq1 = kType == DType::TQ1_0;
  for_each_interleaved_tile<8>(
      a, v, r0, r1, nsb * (kTq1 ? kGroupBlkTQ1 : kGroupBlkTQ2),
      [&](const uint8_t* group, int64_t t, int64_t n, int lo, int hi, const uint8_t* pf, float* y) {
        tokens_tile<8>(n, [&]<int TC>() {
          if constexpr (kTq1) rowlane_tq1_0_tile<TC>(v, group, nsb, __mmask16(rows_mask(lo, hi)), pf, t, y, a.ldy);
          else rowlane_tq2_0_tile<TC>(v, group, nsb, __mmask16(rows_mask(lo, hi)), pf, t, y, a.ldy);
        });
      });
}

}  // namespace

void gemm_interleaved_kquant(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  using Gemm = void (*)(const GemmArgs&, const RowsView&, int64_t, int64_t);
  static constexpr struct {
    DType type;
    Gemm gemm;
  } kTiles[] = {{DType::Q4_K, gemm_interleaved_q4_k<false>},      {DType::Q5_K, gemm_interleaved_q4_k<true>},
                {DType::Q4_1, gemm_interleaved_q32x<DType::Q4_1>}, {DType::Q5_0, gemm_interleaved_q32x<DType::Q5_0>},
                {DType::Q5_1, gemm_interleaved_q32x<DType::Q5_1>}, {DType::Q2_K, gemm_interleaved_q23_k<false>},
                {DType::Q3_K, gemm_interleaved_q23_k<true>},       {DType::TQ1_0, gemm_interleaved_tq<DType::TQ1_0>},
                {DType::TQ2_0, gemm_interleaved_tq<DType::TQ2_0>}};
  for (const auto& t : kTiles)
    if (t.type == a.type) return t.gemm(a, v, r0, r1);
  fail("gemm_interleaved: no AVX-512 interleaved tile reads ", dtype_name(a.type));
}

}  // namespace tern::kern::avx512
