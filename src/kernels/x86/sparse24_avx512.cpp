// AVX-512 VNNI row kernels of the 2:4 sparse formats (see sparse24.h for the maths and
// quant/quant_sparse.h for the blocks). Compiled with -mavx512f/bw/vl/dq/vnni (file name); calls
// only intrinsics and its own static functions.
//
// ts24_q8, per 4 blocks (128 columns): one vector of 64 shuffle controls comes out of the four
// idx words (broadcast per lane, vpsrlvd, AND, add: the layout puts a lane's four positions at
// one shift); vpshufb on the activations of blocks 0-1 fills bytes 0-7 of each 128-bit lane, a
// masked vpshufb on blocks 2-3 bytes 8-15, so 64 gathered activations meet the 64 values
// (reordered once per row to match) in one vpdpbusd. The activations are u8 (q + 128); the
// 128 * sum(w) that adds is taken off by starting the sums at -128 * sum(w) per lane.
// ts24_f16, per block: vpermt2ps gathers the 16 kept columns' activations out of 32 by
// controls from the idx word (same shift trick), and one FMA multiplies them by the 16 values.
//
// Controls, values and scales are prepared once per row and call: in registers for a few
// tokens, in the scratch for more (reused by every group of 4 tokens).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

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

// One quad (4 blocks) of a ts24_q8 row, prepared: values in the gathered order, -128 * their
// sums per 32-bit lane, the shuffle controls and the weight scales in the dxv lane order.
struct Q8Quad {
  __m512i w, neg_corr, ctrl;
  __m512 dw;
};

inline Q8Quad prep_q8_quad(const uint8_t* blk) {
  // The quad's 88 bytes as two overlapping vectors (bytes 0-63 and 24-87: no read past the
  // quad), whose 16-bit words vpermt2w picks: every field of a block starts at an even offset
  // (d at 0, q at 2, idx at 18; blocks 22 bytes apart). Word i of the pair: i < 32 byte 2i,
  // else byte 24 + 2 (i - 32).
  const __m512i lo = _mm512_loadu_si512(blk), hi = _mm512_loadu_si512(blk + 24);
  // Values in the gathered order, qwords [b0.lo b2.lo | b0.hi b2.hi | b1.lo b3.lo | b1.hi b3.hi].
  alignas(64) static const int16_t k_pick_w[32] = {1,  2,  3,  4,  23, 24, 25, 26, 5,  6,  7,  8,  27, 28, 29, 30,
                                                   12, 13, 14, 15, 54, 55, 56, 57, 16, 17, 18, 19, 58, 59, 60, 61};
  const __m512i pick_w = _mm512_load_si512(k_pick_w);
  // Lane order of the 32-bit sums (and of dxv): dwords 0,1,4,5 block 0; 2,3,6,7 block 2;
  // 8,9,12,13 block 1; 10,11,14,15 block 3. Each dword gets its block's idx word (words
  // 9-10, 20-21, 31 + 52, 62-63 for blocks 0-3) ...
  alignas(64) static const int16_t k_pick_idx[32] = {9,  10, 9,  10, 31, 52, 31, 52, 9,  10, 9,  10, 31, 52, 31, 52,
                                                     20, 21, 20, 21, 62, 63, 62, 63, 20, 21, 20, 21, 62, 63, 62, 63};
  const __m512i pick_idx = _mm512_load_si512(k_pick_idx);
  // ... and its block's scale d (words 0, 11, 22, 53), 16 words for vcvtph2ps.
  alignas(64) static const int16_t k_pick_d[32] = {0, 0, 22, 22, 0, 0, 22, 22, 11, 11, 53, 53, 11, 11, 53, 53,
                                                   0, 0, 0,  0,  0, 0, 0,  0,  0,  0,  0,  0,  0,  0,  0,  0};
  const __m512i pick_d = _mm512_load_si512(k_pick_d);
  // Lane m (of 4 per 128 bits) holds values 4m'..4m'+3 of its block with m' = 0,1 in the low
  // 64 bits, 2,3 in the high: positions at shift 2m'.
  const __m512i shifts = _mm512_setr_epi32(0, 2, 0, 2, 4, 6, 4, 6, 0, 2, 0, 2, 4, 6, 4, 6);
  // Column of the value within its 16-column half: 4 * (group % 4) + position (an OR: the
  // offsets have their low 2 bits clear).
  const __m512i offs = _mm512_set4_epi32(0x0C0C0808, 0x04040000, 0x0C0C0808, 0x04040000);
  Q8Quad q;
  q.w = _mm512_permutex2var_epi16(lo, pick_w, hi);
  q.neg_corr = _mm512_sub_epi32(_mm512_setzero_si512(),
                                _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(char(0x80)), q.w));
  const __m512i words = _mm512_permutex2var_epi16(lo, pick_idx, hi);
  // (words >> shift) & 3 | offs
  q.ctrl = _mm512_ternarylogic_epi32(_mm512_srlv_epi32(words, shifts), _mm512_set1_epi8(3), offs, 0xEA);
  q.dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(lo, pick_d, hi)));
  return q;
}

// acc += the quad's products with one token's activations (xu: its 128 columns, dxv: its 16 lanes).
inline __m512 q8_quad_dot(const Q8Quad& q, const uint8_t* xu, const float* dxv, __m512 acc) {
  const __mmask64 hi8 = 0xFF00FF00FF00FF00ull;  // bytes 8-15 of every 128-bit lane
  __m512i g = _mm512_shuffle_epi8(_mm512_loadu_si512(xu), q.ctrl);
  g = _mm512_mask_shuffle_epi8(g, hi8, _mm512_loadu_si512(xu + 64), q.ctrl);
  const __m512i isum = _mm512_dpbusd_epi32(q.neg_corr, g, q.w);
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(q.dw, _mm512_load_ps(dxv)), acc);
}

// The quad at c of a row: straight from the row, or a zero-padded copy of the last, partial one.
inline const uint8_t* quad_src(const uint8_t* w, int64_t n_blocks, int64_t c, uint8_t* pad) {
  if (4 * c + 4 <= n_blocks) return w + 4 * c * kQ8Bytes;
  std::memset(pad, 0, 4 * kQ8Bytes);
  std::memcpy(pad, w + 4 * c * kQ8Bytes, size_t((n_blocks - 4 * c) * kQ8Bytes));
  return pad;
}

template <int NT>
void q8_dots_fused(const uint8_t* w, int64_t n_in, const uint8_t* act, int64_t stride, int64_t off_dxv, float* out) {
  const int64_t n_blocks = n_in / 32, n_quads = (n_blocks + 3) / 4;
  __m512 acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = _mm512_setzero_ps();
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
  for (int i = 0; i < NT; ++i) out[i] = _mm512_reduce_add_ps(acc[i]);
}

template <int NT>
void q8_dots_prepared(const Q8Quad* qs, int64_t n_quads, const uint8_t* act, int64_t stride, int64_t off_dxv,
                      float* out) {
  __m512 acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < n_quads; ++c) {
    const Q8Quad q = qs[c];
    for (int i = 0; i < NT; ++i) {
      const uint8_t* a = act + i * stride;
      acc[i] = q8_quad_dot(q, a + 128 * c, reinterpret_cast<const float*>(a + off_dxv) + 16 * c, acc[i]);
    }
  }
  for (int i = 0; i < NT; ++i) out[i] = _mm512_reduce_add_ps(acc[i]);
}

void q8_dots(const uint8_t* w, int64_t n_in, const uint8_t* act, int64_t stride, int64_t off_dxv, int64_t n_tok,
             float* out, uint8_t* scratch) {
  if (n_tok <= 4) {
    switch (n_tok) {
      case 4: q8_dots_fused<4>(w, n_in, act, stride, off_dxv, out); break;
      case 3: q8_dots_fused<3>(w, n_in, act, stride, off_dxv, out); break;
      case 2: q8_dots_fused<2>(w, n_in, act, stride, off_dxv, out); break;
      default: q8_dots_fused<1>(w, n_in, act, stride, off_dxv, out); break;
    }
    return;
  }
  // Many tokens: the row's quads prepared once into the scratch (256 bytes per 128 columns).
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
  __m512 v;       // the 16 values in f32
  __m512i ctrl;   // vpermt2ps controls: column of value k (0..31)
};

inline F16Block prep_f16_block(const uint8_t* blk) {
  // Value k's position is at bit 8 * (k % 4) + 2 * (k / 4) of idx; its column 4 * (k / 2) + p.
  const __m512i shifts = _mm512_setr_epi32(0, 8, 16, 24, 2, 10, 18, 26, 4, 12, 20, 28, 6, 14, 22, 30);
  const __m512i offs = _mm512_setr_epi32(0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28);
  uint32_t idx;
  std::memcpy(&idx, blk + kF16Idx, 4);
  F16Block b;
  b.v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
  // (idx >> shift) & 3 | offs (the offsets have their low 2 bits clear)
  b.ctrl = _mm512_ternarylogic_epi32(_mm512_srlv_epi32(_mm512_set1_epi32(int(idx)), shifts), _mm512_set1_epi32(3), offs,
                                     0xEA);
  return b;
}

inline __m512 f16_block_dot(const F16Block& b, const float* x, __m512 acc) {
  const __m512 g = _mm512_permutex2var_ps(_mm512_loadu_ps(x), b.ctrl, _mm512_loadu_ps(x + 16));
  return _mm512_fmadd_ps(b.v, g, acc);
}

// One token: two blocks per step into two sums, so that the FMA latency does not bound a row.
void f16_dot_one(const uint8_t* w, int64_t n_in, const float* x, float* out) {
  const int64_t n_blocks = n_in / 32;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t b = 0;
  const uint8_t* pf = w + kPrefetchRows * n_blocks * kF16Bytes;
  for (; b + 2 <= n_blocks; b += 2) {
    prefetch_l2(pf + b * kF16Bytes);
    prefetch_l2(pf + b * kF16Bytes + 64);
    acc0 = f16_block_dot(prep_f16_block(w + b * kF16Bytes), x + 32 * b, acc0);
    acc1 = f16_block_dot(prep_f16_block(w + (b + 1) * kF16Bytes), x + 32 * b + 32, acc1);
  }
  if (b < n_blocks) acc0 = f16_block_dot(prep_f16_block(w + b * kF16Bytes), x + 32 * b, acc0);
  *out = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

template <int NT>
void f16_dots_fused(const uint8_t* w, int64_t n_in, const float* x, int64_t ldx, float* out) {
  __m512 acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < n_in / 32; ++b) {
    const F16Block blk = prep_f16_block(w + b * kF16Bytes);
    for (int i = 0; i < NT; ++i) acc[i] = f16_block_dot(blk, x + i * ldx + 32 * b, acc[i]);
  }
  for (int i = 0; i < NT; ++i) out[i] = _mm512_reduce_add_ps(acc[i]);
}

template <int NT>
void f16_dots_prepared(const F16Block* bs, int64_t n_blocks, const float* x, int64_t ldx, float* out) {
  __m512 acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const F16Block blk = bs[b];
    for (int i = 0; i < NT; ++i) acc[i] = f16_block_dot(blk, x + i * ldx + 32 * b, acc[i]);
  }
  for (int i = 0; i < NT; ++i) out[i] = _mm512_reduce_add_ps(acc[i]);
}

void f16_dots(const uint8_t* w, int64_t n_in, const float* x, int64_t ldx, int64_t n_tok, float* out,
              uint8_t* scratch) {
  if (n_tok <= 4) {
    switch (n_tok) {
      case 4: f16_dots_fused<4>(w, n_in, x, ldx, out); break;
      case 3: f16_dots_fused<3>(w, n_in, x, ldx, out); break;
      case 2: f16_dots_fused<2>(w, n_in, x, ldx, out); break;
      default: f16_dot_one(w, n_in, x, out); break;
    }
    return;
  }
  // Many tokens: the row's blocks prepared once into the scratch (128 bytes per 32 columns).
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

const Sparse24Rows& sparse24_rows_avx512() {
  static const Sparse24Rows t{q8_dots, f16_dots};
  return t;
}

}  // namespace tern::kern
