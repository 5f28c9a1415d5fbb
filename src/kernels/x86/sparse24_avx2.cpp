// AVX2 row kernels of the 2:4 sparse formats (see sparse24.h for the maths and
// quant/quant_sparse.h for the blocks). Compiled with -mavx2 -mfma -mf16c (file name); calls
// only intrinsics and its own static functions.
//
// ts24_q8: the AVX-512 kernel's scheme in two 256-bit halves per 4 blocks (128 columns): per
// half, vpshufb gathers the kept activations of two blocks (one into bytes 0-7 of each 128-bit
// lane, the other into bytes 8-15, merged by vpblendd), with controls from the idx words
// (broadcast, vpsrlvd, AND, add). AVX2 has no u8 x s8 dot with 32-bit sums, so the activations
// go back to s8 (top bit flipped) and through the sign trick: pmaddubsw(|w|, sign(x, w)),
// pmaddwd: exact. The lanes' order is the dxv layout's, so a scale vector is one load.
// ts24_f16: per 8 values (16 columns), two vpermps gather from the two 8-float halves and a
// blend keeps each value's own; one FMA with the values.
#include <immintrin.h>

#include <cstring>

#include "kernels/sparse24.h"

namespace tern::kern {
namespace {

constexpr int64_t kQ8Bytes = 22, kQ8Idx = 18, kF16Bytes = 36, kF16Idx = 32;

// Decode streams rows one after another; the hardware prefetcher alone leaves bandwidth unused
// on short rows (see wide_avx512.cpp), so the single-token loops prefetch the same place
// kPrefetchRows rows on into L2 (tiles_int.h's measure: L1 prefetches ran out of miss buffers).
// Past the matrix's end they are harmless (prefetches never fault).
constexpr int64_t kPrefetchRows = 2;
inline void prefetch_l2(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T2); }

inline float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// One half of a prepared quad: blocks (0, 2) or (1, 3).
struct Q8Half {
  __m256i w_abs, w, ctrl;
  __m256 dw;
};
struct Q8Quad {
  Q8Half h[2];
};

inline Q8Quad prep_q8_quad(const uint8_t* blk) {
  // dwords 0,1,4,5: the first block of the half, 2,3,6,7: the second (the dxv lane order).
  const __m256i pick_lo = _mm256_setr_epi32(0, 0, 2, 2, 0, 0, 2, 2);
  const __m256i pick_hi = _mm256_setr_epi32(1, 1, 3, 3, 1, 1, 3, 3);
  const __m256i shifts = _mm256_setr_epi32(0, 2, 0, 2, 4, 6, 4, 6);
  const __m256i offs = _mm256_setr_epi32(0x04040000, 0x0C0C0808, 0x04040000, 0x0C0C0808, 0x04040000, 0x0C0C0808,
                                         0x04040000, 0x0C0C0808);
  uint32_t idx[4];
  uint16_t dh[4];
  __m128i v[4];
  for (int i = 0; i < 4; ++i) {
    std::memcpy(&idx[i], blk + i * kQ8Bytes + kQ8Idx, 4);
    std::memcpy(&dh[i], blk + i * kQ8Bytes, 2);
    v[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + i * kQ8Bytes + 2));
  }
  const __m256i words = _mm256_castsi128_si256(_mm_setr_epi32(int(idx[0]), int(idx[1]), int(idx[2]), int(idx[3])));
  const __m256 d4 = _mm256_castps128_ps256(
      _mm_cvtph_ps(_mm_setr_epi16(short(dh[0]), short(dh[1]), short(dh[2]), short(dh[3]), 0, 0, 0, 0)));
  Q8Quad q;
  for (int h = 0; h < 2; ++h) {
    const __m256i pick = h == 0 ? pick_lo : pick_hi;
    const __m256i ws = _mm256_permutevar8x32_epi32(words, pick);
    q.h[h].ctrl = _mm256_add_epi8(_mm256_and_si256(_mm256_srlv_epi32(ws, shifts), _mm256_set1_epi8(3)), offs);
    // qwords [a.lo a.hi b.lo b.hi] -> [a.lo b.lo | a.hi b.hi] (a, b: blocks h, h + 2)
    q.h[h].w = _mm256_permute4x64_epi64(_mm256_setr_m128i(v[h], v[h + 2]), 0xD8);
    q.h[h].w_abs = _mm256_sign_epi8(q.h[h].w, q.h[h].w);
    q.h[h].dw = _mm256_permutevar8x32_ps(d4, pick);
  }
  return q;
}

// acc + one half's products with one token (xa, xb: the 32 activation bytes of its two blocks;
// dxv: its 8 lanes).
inline __m256 q8_half_dot(const Q8Half& h, const uint8_t* xa, const uint8_t* xb, const float* dxv, __m256 acc) {
  const __m256i ga = _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa)), h.ctrl);
  const __m256i gb = _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb)), h.ctrl);
  const __m256i x = _mm256_xor_si256(_mm256_blend_epi32(ga, gb, 0xCC), _mm256_set1_epi8(char(0x80)));
  const __m256i p = _mm256_maddubs_epi16(h.w_abs, _mm256_sign_epi8(x, h.w));
  const __m256i isum = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(h.dw, _mm256_load_ps(dxv)), acc);
}

inline __m256 q8_quad_dot(const Q8Quad& q, const uint8_t* xu, const float* dxv, __m256 acc) {
  acc = q8_half_dot(q.h[0], xu, xu + 64, dxv, acc);
  return q8_half_dot(q.h[1], xu + 32, xu + 96, dxv + 8, acc);
}

inline const uint8_t* quad_src(const uint8_t* w, int64_t n_blocks, int64_t c, uint8_t* pad) {
  if (4 * c + 4 <= n_blocks) return w + 4 * c * kQ8Bytes;
  std::memset(pad, 0, 4 * kQ8Bytes);
  std::memcpy(pad, w + 4 * c * kQ8Bytes, size_t((n_blocks - 4 * c) * kQ8Bytes));
  return pad;
}

template <int NT>
void q8_dots_fused(const uint8_t* w, int64_t n_in, const uint8_t* act, int64_t stride, int64_t off_dxv, float* out) {
  const int64_t n_blocks = n_in / 32, n_quads = (n_blocks + 3) / 4;
  __m256 acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = _mm256_setzero_ps();
  uint8_t pad[4 * kQ8Bytes];
  const uint8_t* pf = w + kPrefetchRows * n_blocks * kQ8Bytes;
  for (int64_t c = 0; c < n_quads; ++c) {
    prefetch_l2(pf + 4 * c * kQ8Bytes);
    prefetch_l2(pf + 4 * c * kQ8Bytes + 64);
    const Q8Quad q = prep_q8_quad(quad_src(w, n_blocks, c, pad));
    for (int i = 0; i < NT; ++i) {
      const uint8_t* a = act + i * stride;
      acc[i] = q8_quad_dot(q, a + 128 * c, reinterpret_cast<const float*>(a + off_dxv) + 16 * c, acc[i]);
    }
  }
  for (int i = 0; i < NT; ++i) out[i] = hsum_ps(acc[i]);
}

template <int NT>
void q8_dots_prepared(const Q8Quad* qs, int64_t n_quads, const uint8_t* act, int64_t stride, int64_t off_dxv,
                      float* out) {
  __m256 acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t c = 0; c < n_quads; ++c) {
    for (int i = 0; i < NT; ++i) {
      const uint8_t* a = act + i * stride;
      acc[i] = q8_quad_dot(qs[c], a + 128 * c, reinterpret_cast<const float*>(a + off_dxv) + 16 * c, acc[i]);
    }
  }
  for (int i = 0; i < NT; ++i) out[i] = hsum_ps(acc[i]);
}

void q8_dots(const uint8_t* w, int64_t n_in, const uint8_t* act, int64_t stride, int64_t off_dxv, int64_t n_tok,
             float* out, uint8_t* scratch) {
  if (n_tok <= 2) {
    if (n_tok == 2) q8_dots_fused<2>(w, n_in, act, stride, off_dxv, out);
    else q8_dots_fused<1>(w, n_in, act, stride, off_dxv, out);
    return;
  }
  // More tokens: the row's quads prepared once into the scratch (256 bytes per 128 columns).
  const int64_t n_blocks = n_in / 32, n_quads = (n_blocks + 3) / 4;
  auto* qs = reinterpret_cast<Q8Quad*>(scratch);
  uint8_t pad[4 * kQ8Bytes];
  for (int64_t c = 0; c < n_quads; ++c) qs[c] = prep_q8_quad(quad_src(w, n_blocks, c, pad));
  for (int64_t t = 0; t < n_tok; t += 4) {
    const uint8_t* a = act + t * stride;
    switch (n_tok - t >= 4 ? 4 : n_tok - t) {
      case 4: q8_dots_prepared<4>(qs, n_quads, a, stride, off_dxv, out + t); break;
      case 3: q8_dots_prepared<3>(qs, n_quads, a, stride, off_dxv, out + t); break;
      case 2: q8_dots_prepared<2>(qs, n_quads, a, stride, off_dxv, out + t); break;
      default: q8_dots_prepared<1>(qs, n_quads, a, stride, off_dxv, out + t); break;
    }
  }
}

// ---- ts24_f16 ---------------------------------------------------------------------------------

struct F16Block {
  __m256 v[2];      // values 0-7, 8-15 in f32
  __m256i ctrl[2];  // vpermps controls: column of the value within its 8-column quarter
};

inline F16Block prep_f16_block(const uint8_t* blk) {
  // Value k's position is at bit 8 * (k % 4) + 2 * (k / 4) of idx.
  const __m256i shifts0 = _mm256_setr_epi32(0, 8, 16, 24, 2, 10, 18, 26);
  const __m256i shifts1 = _mm256_setr_epi32(4, 12, 20, 28, 6, 14, 22, 30);
  const __m256i offs = _mm256_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4);
  uint32_t idx;
  std::memcpy(&idx, blk + kF16Idx, 4);
  const __m256i word = _mm256_set1_epi32(int(idx));
  const __m256i three = _mm256_set1_epi32(3);
  F16Block b;
  b.v[0] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
  b.v[1] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16)));
  b.ctrl[0] = _mm256_add_epi32(_mm256_and_si256(_mm256_srlv_epi32(word, shifts0), three), offs);
  b.ctrl[1] = _mm256_add_epi32(_mm256_and_si256(_mm256_srlv_epi32(word, shifts1), three), offs);
  return b;
}

// Values 0-3 of each 8 take columns 0-7 of their 16, values 4-7 columns 8-15.
inline __m256 f16_block_dot(const F16Block& b, const float* x, __m256 acc) {
  for (int h = 0; h < 2; ++h) {
    const __m256 lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(x + 16 * h), b.ctrl[h]);
    const __m256 hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(x + 16 * h + 8), b.ctrl[h]);
    acc = _mm256_fmadd_ps(b.v[h], _mm256_blend_ps(lo, hi, 0xF0), acc);
  }
  return acc;
}

template <int NT>
void f16_dots_fused(const uint8_t* w, int64_t n_in, const float* x, int64_t ldx, float* out) {
  __m256 acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = _mm256_setzero_ps();
  const uint8_t* pf = w + kPrefetchRows * (n_in / 32) * kF16Bytes;
  for (int64_t b = 0; b < n_in / 32; ++b) {
    prefetch_l2(pf + b * kF16Bytes);
    const F16Block blk = prep_f16_block(w + b * kF16Bytes);
    for (int i = 0; i < NT; ++i) acc[i] = f16_block_dot(blk, x + i * ldx + 32 * b, acc[i]);
  }
  for (int i = 0; i < NT; ++i) out[i] = hsum_ps(acc[i]);
}

template <int NT>
void f16_dots_prepared(const F16Block* bs, int64_t n_blocks, const float* x, int64_t ldx, float* out) {
  __m256 acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b)
    for (int i = 0; i < NT; ++i) acc[i] = f16_block_dot(bs[b], x + i * ldx + 32 * b, acc[i]);
  for (int i = 0; i < NT; ++i) out[i] = hsum_ps(acc[i]);
}

void f16_dots(const uint8_t* w, int64_t n_in, const float* x, int64_t ldx, int64_t n_tok, float* out,
              uint8_t* scratch) {
  if (n_tok <= 2) {
    if (n_tok == 2) f16_dots_fused<2>(w, n_in, x, ldx, out);
    else f16_dots_fused<1>(w, n_in, x, ldx, out);
    return;
  }
  // More tokens: the row's blocks prepared once into the scratch (128 bytes per 32 columns).
  const int64_t n_blocks = n_in / 32;
  auto* bs = reinterpret_cast<F16Block*>(scratch);
  for (int64_t b = 0; b < n_blocks; ++b) bs[b] = prep_f16_block(w + b * kF16Bytes);
  for (int64_t t = 0; t < n_tok; t += 4) {
    const float* xt = x + t * ldx;
    switch (n_tok - t >= 4 ? 4 : n_tok - t) {
      case 4: f16_dots_prepared<4>(bs, n_blocks, xt, ldx, out + t); break;
      case 3: f16_dots_prepared<3>(bs, n_blocks, xt, ldx, out + t); break;
      case 2: f16_dots_prepared<2>(bs, n_blocks, xt, ldx, out + t); break;
      default: f16_dots_prepared<1>(bs, n_blocks, xt, ldx, out + t); break;
    }
  }
}

}  // namespace

const Sparse24Rows& sparse24_rows_avx2() {
  static const Sparse24Rows t{q8_dots, f16_dots};
  return t;
}

}  // namespace tern::kern
