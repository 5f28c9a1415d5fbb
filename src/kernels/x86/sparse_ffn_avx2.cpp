// AVX2 row kernels of the sparse FFN (see sparse_ffn.h for the arithmetic, which this file
// reproduces bit for bit: the reference is sparse_ffn.cpp). Compiled with -mavx2 -mfma -mf16c
// (file name); calls only intrinsics, simd.h's helpers and its own static functions.
//
// Dots: float rows in two 8-lane accumulators (p[0..8), p[8..16)); Q8_0 / Q4_0 rows a block
// at a time into 8 int32 lanes (pmaddubsw on |w| and sign(x, w) for Q8_0, on the unsigned
// nibbles and x for Q4_0, then pmaddwd: exact, |pairs| <= 2 * 127 * 127 < 2^15), 8 blocks
// reduced to one vector of block sums, scaled and added into p[b % 8] by one FMA.
// Axpy: 4 rows per pass over y's slice (a quarter of the loads and stores of y), each element
// updated by the rows' FMAs in index order.
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
inline __m256 load8(const uint8_t* w, int64_t i) {
  if constexpr (kF16) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * i)));
  else return _mm256_loadu_ps(reinterpret_cast<const float*>(w + 4 * i));
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
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  const int64_t n16 = n / 16 * 16;
  for (int64_t i = 0; i < n16; i += 16) {
    a0 = _mm256_fmadd_ps(load8<kF16>(w, i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(load8<kF16>(w, i + 8), _mm256_loadu_ps(x + i + 8), a1);
  }
  float s = hsum256(_mm256_add_ps(a0, a1));
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

// One block's products with the activations, 8 int32 lanes summing to the block's integer dot
// (Q4_0: without the 8 * nsum term).
template <bool kQ4>
inline __m256i block_isum(const uint8_t* blk, const int8_t* xq) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  __m256i p;
  if constexpr (kQ4) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m128i m = _mm_set1_epi8(0x0F);
    const __m256i nib = _mm256_setr_m128i(_mm_and_si128(q, m), _mm_and_si128(_mm_srli_epi16(q, 4), m));
    p = _mm256_maddubs_epi16(nib, x);
  } else {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  }
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

// The f16 scales of blocks b0 .. b0 + nb - 1 (nb <= 8; the other lanes 0) as f32: a masked
// gather of the dword at each block's start, whose low half is d.
template <int64_t kB>
inline __m256 block_scales(const uint8_t* w, int64_t b0, int nb) {
  const __m256i offs = _mm256_setr_epi32(0, kB, 2 * kB, 3 * kB, 4 * kB, 5 * kB, 6 * kB, 7 * kB);
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(nb), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i g = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), reinterpret_cast<const int*>(w + b0 * kB),
                                                offs, mask, 1);
  // d in the low halves: packed to 8 x 16 bits (per 128-bit lane, then the lanes' low qwords).
  const __m256i h = _mm256_packus_epi32(_mm256_and_si256(g, _mm256_set1_epi32(0xFFFF)), _mm256_setzero_si256());
  return _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(h, 0x08)));
}

template <bool kQ4>
float dot_quant_row(const uint8_t* w, int64_t n_in, const int8_t* xq, const float* xd, const int32_t* nsum,
                    const uint8_t* pf) {
  constexpr int64_t kB = kQ4 ? kQ4Bytes : kQ8Bytes;
  const int64_t n_blocks = n_in / 32;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b0 = 0; b0 < n_blocks; b0 += 8) {
    const int nb = n_blocks - b0 < 8 ? int(n_blocks - b0) : 8;
    for (int64_t o = 0; o < nb * kB; o += 64) prefetch(pf + b0 * kB + o);
    __m256i v[8];
    for (int j = 0; j < 8; ++j)  // a missing block (the row's last group) adds fma(0, 0, p) = p
      v[j] = j < nb ? block_isum<kQ4>(w + (b0 + j) * kB, xq + 32 * (b0 + j)) : _mm256_setzero_si256();
    __m256i isum = reduce8(v);
    __m256 dx;
    if (nb == 8) {
      if constexpr (kQ4)
        isum = _mm256_add_epi32(isum, _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(nsum + b0)), 3));
      dx = _mm256_loadu_ps(xd + b0);
    } else {
      const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(nb), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      if constexpr (kQ4) isum = _mm256_add_epi32(isum, _mm256_slli_epi32(_mm256_maskload_epi32(nsum + b0, m), 3));
      dx = _mm256_maskload_ps(xd + b0, m);
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(block_scales<kB>(w, b0, nb), dx), acc);
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
  __m256 cv[NR];
  for (int r = 0; r < NR; ++r) cv[r] = _mm256_set1_ps(c[r]);
  int64_t i = c0;
  for (; i + 8 <= c1; i += 8) {
    __m256 acc = _mm256_loadu_ps(y + i);
    for (int r = 0; r < NR; ++r) acc = _mm256_fmadd_ps(cv[r], load8<kF16>(w[r], i), acc);
    _mm256_storeu_ps(y + i, acc);
  }
  for (; i < c1; ++i) {
    float v = y[i];
    for (int r = 0; r < NR; ++r) v = __builtin_fmaf(c[r], load1<kF16>(w[r], i), v);
    y[i] = v;
  }
}

// The 32 quants of a block as 4 x 8 f32 (Q4_0: nibble - 8, elements 0-15 the low nibbles).
template <bool kQ4>
inline void block_values(const uint8_t* blk, __m256* q) {
  __m128i lo, hi;  // elements 0-15, 16-31 as int8
  if constexpr (kQ4) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m128i m = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    lo = _mm_sub_epi8(_mm_and_si128(b, m), eight);
    hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), m), eight);
  } else {
    lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18));
  }
  q[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
  q[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
  q[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
  q[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
}

// y[c0, c1) += sum_r c[r] * w[r][c0, c1) for NR quantized rows, a block of 32 elements at a
// time, each element's FMAs in row order. Per chunk of blocks the scales c[r] * d first (8
// gathered at a time), so the inner loop broadcasts each from memory.
template <bool kQ4, int NR>
void axpy_quant_rows(const uint8_t* const* w, const uint8_t* const* pf, const float* c, int64_t c0, int64_t c1,
                     float* y) {
  constexpr int64_t kB = kQ4 ? kQ4Bytes : kQ8Bytes, kChunk = 64;
  alignas(32) float sc[NR][kChunk];
  for (int64_t bs = c0 / 32; bs < c1 / 32; bs += kChunk) {
    const int64_t be = bs + kChunk < c1 / 32 ? bs + kChunk : c1 / 32;
    for (int r = 0; r < NR; ++r)
      for (int64_t b = bs; b < be; b += 8) {
        const int nb = be - b < 8 ? int(be - b) : 8;
        _mm256_store_ps(&sc[r][b - bs], _mm256_mul_ps(_mm256_set1_ps(c[r]), block_scales<kB>(w[r], b, nb)));
      }
    for (int64_t b = bs; b < be; ++b) {
      float* yb = y + 32 * b;
      __m256 acc[4];
      for (int g = 0; g < 4; ++g) acc[g] = _mm256_loadu_ps(yb + 8 * g);
      for (int r = 0; r < NR; ++r) {
        prefetch(pf[r] + b * kB);
        const __m256 s = _mm256_broadcast_ss(&sc[r][b - bs]);
        __m256 q[4];
        block_values<kQ4>(w[r] + b * kB, q);
        for (int g = 0; g < 4; ++g) acc[g] = _mm256_fmadd_ps(s, q[g], acc[g]);
      }
      for (int g = 0; g < 4; ++g) _mm256_storeu_ps(yb + 8 * g, acc[g]);
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

const SparseFfnRows& sparse_ffn_rows_avx2() {
  static const SparseFfnRows t{dot, axpy};
  return t;
}

}  // namespace tern::kern
