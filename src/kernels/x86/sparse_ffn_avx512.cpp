// AVX-512 row kernels of the sparse FFN (see sparse_ffn.h for the arithmetic, which this file
// reproduces bit for bit: the reference is sparse_ffn.cpp). Compiled with AVX-512 F/BW/VL/DQ
// and VNNI (file name); calls only intrinsics, simd.h's helpers and its own static functions.
//
// Dots: float rows in one 16-lane accumulator (p[0..16)); Q8_0 / Q4_0 rows two blocks at a
// time into 16 int32 lanes by one vpdpbusd (u8 x s8: |w| and x negated where w < 0 for Q8_0,
// the unsigned nibbles and x for Q4_0; exact), 8 blocks reduced to one vector of block sums
// (unpacks, then the 128-bit lanes' pairs), scaled and added into p[b % 8] by one FMA. The
// row's last 1-7 blocks go one at a time through 256-bit vpdpbusd.
// Axpy: 4 rows per pass over y's slice, 16 floats per vector, each element updated by the
// rows' FMAs in index order; Q4_0's nibbles become floats by one vpermps lookup each.
// The 8 blocks' f16 scales come from one masked vpgatherdd (the dword at each block's start).
#include "kernels/sparse_ffn.h"
#include "kernels/x86/sparse_ffn_rows.h"
#include "kernels/x86/simd.h"

#include <cstring>

namespace tern::kern {
namespace {

using namespace sparse_ffn_rows;  // block sizes, prefetch, used_bytes

// ---- dots ------------------------------------------------------------------------------------

template <bool kF16>
inline __m512 load16(const uint8_t* w, int64_t i) {
  if constexpr (kF16) return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2 * i)));
  else return _mm512_loadu_ps(reinterpret_cast<const float*>(w + 4 * i));
}

template <bool kF16>
inline float load1(const uint8_t* w, int64_t i) {
  if constexpr (kF16) {
    uint16_t h;
    std::memcpy(&h, w + 2 * i, 2);
    return f16_to_f32(h);
  } else {
    float v;
    std::memcpy(&v, w + 4 * i, 4);
    return v;
  }
}

template <bool kF16>
float dot_float_row(const uint8_t* w, int64_t n, const float* x) {
  __m512 acc = _mm512_setzero_ps();
  const int64_t n16 = n / 16 * 16;
  for (int64_t i = 0; i < n16; i += 16) acc = _mm512_fmadd_ps(load16<kF16>(w, i), _mm512_loadu_ps(x + i), acc);
  float s = hsum256(_mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1)));
  for (int64_t i = n16; i < n; ++i) s = __builtin_fmaf(load1<kF16>(w, i), x[i], s);
  return s;
}

// 8 vectors of 8 int32 -> one vector, lane j = the sum of v[j]'s lanes (integer: any order).
inline __m256i reduce8(const __m256i* v) {
  const __m256i t0 = _mm256_hadd_epi32(v[0], v[1]), t1 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i t2 = _mm256_hadd_epi32(v[4], v[5]), t3 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);  // per 128: v0..3, v4..7
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}

// 4 vectors of 16 int32, v[i] = blocks 2i (lanes 0-7) and 2i + 1 (lanes 8-15) -> one vector,
// lane j = block j's sum: unpacks within 128-bit lanes, then the 128-bit lanes' pairs added.
inline __m256i reduce_pairs(__m512i v0, __m512i v1, __m512i v2, __m512i v3) {
  const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(v0, v1), _mm512_unpackhi_epi32(v0, v1));
  const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(v2, v3), _mm512_unpackhi_epi32(v2, v3));
  // 128-bit lane k of u: the lane-k sums of v0..v3 (k = 0, 1: blocks 0 2 4 6; k = 2, 3: 1 3 5 7)
  const __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
  const __m512i s = _mm512_shuffle_i32x4(u, u, _MM_SHUFFLE(3, 1, 2, 0));
  const __m256i r = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));  // 0 2 4 6 1 3 5 7
  return _mm256_permutevar8x32_epi32(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// One block's products with the activations, 8 int32 lanes summing to the block's integer dot
// (Q4_0: without the 8 * nsum term). The tail of a row (< 8 blocks).
template <bool kQ4>
inline __m256i block_isum(const uint8_t* blk, const int8_t* xq) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  if constexpr (kQ4) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m128i m = _mm_set1_epi8(0x0F);
    const __m256i nib = _mm256_setr_m128i(_mm_and_si128(q, m), _mm_and_si128(_mm_srli_epi16(q, 4), m));
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), nib, x);
  }
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

// Two consecutive blocks (at blk) with their 64 activations: lanes 0-7 the first block's sums,
// 8-15 the second's. Q4_0: [lo | hi] nibbles of each block put in element order by one
// two-source qword permute; Q8_0: |w| and x negated where w < 0 (AVX-512 has no vpsignb).
template <bool kQ4>
inline __m512i pair_isum(const uint8_t* blk, const int8_t* xq) {
  const __m512i x = _mm512_loadu_si512(xq);
  if constexpr (kQ4) {
    const __m256i q = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQ4Bytes + 2)), 1);
    const __m256i m = _mm256_set1_epi8(0x0F);
    const __m256i lo = _mm256_and_si256(q, m), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m);
    const __m512i nib = _mm512_permutex2var_epi64(_mm512_castsi256_si512(lo), _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11),
                                                  _mm512_castsi256_si512(hi));
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), nib, x);
  }
  const __m512i w = _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQ8Bytes + 2)), 1);
  const __m512i sx = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w), sx);
}

// The f16 scales of blocks b0 .. b0 + nb - 1 (nb <= 8; the other lanes 0) as f32: a masked
// gather of the dword at each block's start, whose low half is d.
template <int64_t kB>
inline __m256 block_scales(const uint8_t* w, int64_t b0, int nb) {
  const __m256i offs = _mm256_setr_epi32(0, kB, 2 * kB, 3 * kB, 4 * kB, 5 * kB, 6 * kB, 7 * kB);
  const __m256i g = _mm256_mmask_i32gather_epi32(_mm256_setzero_si256(), __mmask8((1u << nb) - 1), offs,
                                                 w + b0 * kB, 1);
  return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(g));
}

template <bool kQ4>
float dot_quant_row(const uint8_t* w, int64_t n_in, const int8_t* xq, const float* xd, const int32_t* nsum,
                    const uint8_t* pf) {
  constexpr int64_t kB = kQ4 ? kQ4Bytes : kQ8Bytes;
  const int64_t n_blocks = n_in / 32;
  __m256 acc = _mm256_setzero_ps();
  int64_t b0 = 0;
  for (; b0 + 8 <= n_blocks; b0 += 8) {
    for (int64_t o = 0; o < 8 * kB; o += 64) prefetch(pf + b0 * kB + o);
    const uint8_t* g = w + b0 * kB;
    const int8_t* xg = xq + 32 * b0;
    __m256i isum = reduce_pairs(pair_isum<kQ4>(g, xg), pair_isum<kQ4>(g + 2 * kB, xg + 64),
                                pair_isum<kQ4>(g + 4 * kB, xg + 128), pair_isum<kQ4>(g + 6 * kB, xg + 192));
    if constexpr (kQ4)
      isum = _mm256_add_epi32(isum, _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(nsum + b0)), 3));
    const __m256 dw = block_scales<kB>(w, b0, 8);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_loadu_ps(xd + b0)), acc);
  }
  if (b0 < n_blocks) {  // the last 1-7 blocks; a missing block adds fma(0, 0, p) = p
    const int nb = int(n_blocks - b0);
    for (int64_t o = 0; o < nb * kB; o += 64) prefetch(pf + b0 * kB + o);
    const __mmask8 m = __mmask8((1u << nb) - 1);
    __m256i v[8];
    for (int j = 0; j < 8; ++j) v[j] = j < nb ? block_isum<kQ4>(w + (b0 + j) * kB, xq + 32 * (b0 + j)) : _mm256_setzero_si256();
    __m256i isum = reduce8(v);
    if constexpr (kQ4) isum = _mm256_add_epi32(isum, _mm256_slli_epi32(_mm256_maskz_loadu_epi32(m, nsum + b0), 3));
    const __m256 dw = block_scales<kB>(w, b0, nb);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_maskz_loadu_ps(m, xd + b0)), acc);
  }
  return hsum256(acc);
}

void dot(const SparseDotArgs& a) {
  const int64_t used = used_bytes(a.type, a.n_in);
  for (int64_t k = 0; k < a.n_idx; ++k) {
    const uint8_t* w = a.rows + int64_t(a.idx[k]) * a.row_bytes;
    const uint8_t* pf = k + kPrefetchAhead < a.n_idx ? a.rows + int64_t(a.idx[k + kPrefetchAhead]) * a.row_bytes : w;
    if (a.type == DType::F32 || a.type == DType::F16) prefetch_row(pf, used);
    switch (a.type) {
      case DType::F32: a.out[k] = dot_float_row<false>(w, a.n_in, a.x); break;
      case DType::F16: a.out[k] = dot_float_row<true>(w, a.n_in, a.x); break;
      case DType::Q8_0: a.out[k] = dot_quant_row<false>(w, a.n_in, a.xq, a.xd, a.nsum, pf); break;
      default: a.out[k] = dot_quant_row<true>(w, a.n_in, a.xq, a.xd, a.nsum, pf); break;
    }
  }
}

// ---- axpy ------------------------------------------------------------------------------------

// y[c0, c1) += sum_r c[r] * w[r][c0, c1) for NR float rows, each element's FMAs in row order.
template <bool kF16, int NR>
void axpy_float_rows(const uint8_t* const* w, const float* c, int64_t c0, int64_t c1, float* y) {
  __m512 cv[NR];
  for (int r = 0; r < NR; ++r) cv[r] = _mm512_set1_ps(c[r]);
  int64_t i = c0;
  for (; i + 16 <= c1; i += 16) {
    __m512 acc = _mm512_loadu_ps(y + i);
    for (int r = 0; r < NR; ++r) acc = _mm512_fmadd_ps(cv[r], load16<kF16>(w[r], i), acc);
    _mm512_storeu_ps(y + i, acc);
  }
  for (; i < c1; ++i) {
    float v = y[i];
    for (int r = 0; r < NR; ++r) v = __builtin_fmaf(c[r], load1<kF16>(w[r], i), v);
    y[i] = v;
  }
}

// y[c0, c1) += sum_r c[r] * w[r][c0, c1) for NR quantized rows, a block of 32 elements at a
// time, each element's FMAs in row order. Per chunk of blocks the scales c[r] * d first (8
// gathered at a time), so the inner loop broadcasts each from memory.
template <bool kQ4, int NR>
void axpy_quant_rows(const uint8_t* const* w, const uint8_t* const* pf, const float* c, int64_t c0, int64_t c1,
                     float* y) {
  constexpr int64_t kB = kQ4 ? kQ4Bytes : kQ8Bytes, kChunk = 64;
  // Q4_0's values nibble - 8, looked up by the nibble (vpermps reads the low 4 bits of an index).
  const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  alignas(64) float sc[NR][kChunk];
  for (int64_t bs = c0 / 32; bs < c1 / 32; bs += kChunk) {
    const int64_t be = bs + kChunk < c1 / 32 ? bs + kChunk : c1 / 32;
    for (int r = 0; r < NR; ++r)
      for (int64_t b = bs; b < be; b += 8) {
        const int nb = be - b < 8 ? int(be - b) : 8;
        _mm256_store_ps(&sc[r][b - bs], _mm256_mul_ps(_mm256_set1_ps(c[r]), block_scales<kB>(w[r], b, nb)));
      }
    for (int64_t b = bs; b < be; ++b) {
      float* yb = y + 32 * b;
      __m512 acc0 = _mm512_loadu_ps(yb), acc1 = _mm512_loadu_ps(yb + 16);
      for (int r = 0; r < NR; ++r) {
        prefetch(pf[r] + b * kB);
        const uint8_t* blk = w[r] + b * kB;
        const __m512 s = _mm512_set1_ps(sc[r][b - bs]);
        __m512 q0, q1;
        if constexpr (kQ4) {
          const __m512i t = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
          q0 = _mm512_permutexvar_ps(t, table);                          // low nibbles: elements 0-15
          q1 = _mm512_permutexvar_ps(_mm512_srli_epi32(t, 4), table);  // high: 16-31
        } else {
          q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2))));
          q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18))));
        }
        acc0 = _mm512_fmadd_ps(s, q0, acc0);
        acc1 = _mm512_fmadd_ps(s, q1, acc1);
      }
      _mm512_storeu_ps(yb, acc0);
      _mm512_storeu_ps(yb + 16, acc1);
    }
  }
}

template <int NR>
void axpy_rows(DType t, const uint8_t* const* w, const uint8_t* const* pf, const float* c, int64_t c0, int64_t c1,
               float* y) {
  switch (t) {
    case DType::F32: axpy_float_rows<false, NR>(w, c, c0, c1, y); break;
    case DType::F16: axpy_float_rows<true, NR>(w, c, c0, c1, y); break;
    case DType::Q8_0: axpy_quant_rows<false, NR>(w, pf, c, c0, c1, y); break;
    default: axpy_quant_rows<true, NR>(w, pf, c, c0, c1, y); break;
  }
}

void axpy(const SparseAxpyArgs& a) {
  constexpr int kRows = 4;
  // The slice [c0, c1) of each row: its bytes from the first block / element on.
  const int64_t off = used_bytes(a.type, a.c0), len = used_bytes(a.type, a.c1) - off;
  const bool quant = a.type == DType::Q8_0 || a.type == DType::Q4_0;
  int64_t k = 0;
  for (; k + kRows <= a.n_idx; k += kRows) {
    const uint8_t* w[kRows];
    const uint8_t* pf[kRows];  // the rows kPrefetchAhead groups on (past the end: these rows)
    for (int r = 0; r < kRows; ++r) {
      w[r] = a.rows + int64_t(a.idx[k + r]) * a.row_bytes;
      const int64_t kp = k + r + kRows * kPrefetchAhead;
      pf[r] = kp < a.n_idx ? a.rows + int64_t(a.idx[kp]) * a.row_bytes : w[r];
      if (!quant) prefetch_row(pf[r] + off, len);
    }
    axpy_rows<kRows>(a.type, w, pf, a.coef + k, a.c0, a.c1, a.y);
  }
  for (; k < a.n_idx; ++k) {
    const uint8_t* w = a.rows + int64_t(a.idx[k]) * a.row_bytes;
    axpy_rows<1>(a.type, &w, &w, a.coef + k, a.c0, a.c1, a.y);
  }
}

}  // namespace

const SparseFfnRows& sparse_ffn_rows_avx512() {
  static const SparseFfnRows t{dot, axpy};
  return t;
}

}  // namespace tern::kern
