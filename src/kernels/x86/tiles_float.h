#pragma once
// Float weights (F32, F16, BF16) for the AVX2 and AVX-512 tables, written once over a vector
// policy P (Avx2Vec: 8 f32 lanes in ymm, 16 registers; Avx512Vec: 16 lanes in zmm, 32).
//
// The arithmetic every variant (kernels/ref too) performs: for each output o and token t,
//   acc = 0; for k = 0 .. n_in-1 in order: acc = fma(W[o][k], x[t][k], acc); y[t][o] = acc
// one f32 FMA per weight element, no split sums. So the bits do not depend on the ISA, the
// tile, the batch around a token, the thread count or the row range (all tested), and the
// scalar reference reproduces them exactly.
//
// Vectors therefore run across outputs, never along k: lane j of a register is output row
// o0 + j, and a step multiplies one weight vector (16 or 8 consecutive rows at one k) by one
// broadcast activation. That needs the rows' elements at one k side by side, which is the
// interleaved layout (kernels/matmul.h: per group of 16 rows, per k, the 16 rows' elements;
// rows past the last whole group as stored). Two paths:
//  - decode and small batches (n_tokens <= kDirectTokens): tiles of T tokens x G groups read
//    the interleaved weights directly over the whole row, converting as they load; G groups
//    are G independent FMA chains per token, enough to hide the FMA latency, and G streams.
//  - prefill: per K block of kKc elements, a panel of 2 vectors of rows (AVX-512: 32 rows,
//    AVX2: 16) is converted to f32 once into the thread's scratch and reused by every token
//    tile of MR tokens x 2 vectors (AVX-512 12 x 32 in 24 zmm accumulators, AVX2 6 x 16 in 12
//    ymm). A tile starts from y's partial sums of the previous K block (stored and reloaded:
//    exact), so the chain above is unbroken.
// Rows as stored (not interleaved, or the tail rows of an interleaved weight) are packed
// into the same panels by a scalar transposing copy: correct for any row range, and fast
// enough for the < 16 tail rows; a whole weight left as stored (TERN_REPACK=0) decodes slowly.
//
// Include only from matmul_avx2.cpp / matmul_avx512.cpp.
#include <cstdint>
#include <cstring>

#include "kernels/kernel_iface.h"
#include "kernels/x86/simd.h"

namespace tern::kern {
namespace {

struct Avx2Vec {
  using V = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kMr = 6;  // token rows of a prefill tile
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_load_ps(p); }
  static V bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static void store(float* p, V v) { _mm256_store_ps(p, v); }
  static V from_f32(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  static V from_f16(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static V from_bf16(const uint8_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  // kLanes dwords of bf16 pairs: the low halves (element 2p) / the high ones (2p + 1) as f32.
  static V pair_lo(const uint8_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), 16));
  }
  static V pair_hi(const uint8_t* p) {
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
                                                _mm256_set1_epi32(int(0xFFFF0000u))));
  }
  // Lanes [lo, hi) of y (the others untouched, never read or written).
  static __m256i mask(int lo, int hi) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i a = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(lo - 1));
    const __m256i b = _mm256_cmpgt_epi32(_mm256_set1_epi32(hi), idx);
    return _mm256_and_si256(a, b);
  }
  using Mask = __m256i;
  static V load_y(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
  static void store_y(float* p, V v, Mask m) { _mm256_maskstore_ps(p, m, v); }
  static V loadu_y(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu_y(float* p, V v) { _mm256_storeu_ps(p, v); }
};

#ifdef __AVX512F__
struct Avx512Vec {
  using V = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kMr = 12;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_load_ps(p); }
  static V bcast(const float* p) { return _mm512_set1_ps(*p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static void store(float* p, V v) { _mm512_store_ps(p, v); }
  static V from_f32(const uint8_t* p) { return _mm512_loadu_ps(p); }
  static V from_f16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static V from_bf16(const uint8_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static V pair_lo(const uint8_t* p) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(p), 16)); }
  static V pair_hi(const uint8_t* p) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_loadu_si512(p), _mm512_set1_epi32(int(0xFFFF0000u))));
  }
  using Mask = __mmask16;
  static Mask mask(int lo, int hi) {
    const uint32_t all = hi >= 16 ? 0xFFFFu : (1u << (hi > 0 ? hi : 0)) - 1u;
    const uint32_t below = lo <= 0 ? 0u : (1u << lo) - 1u;
    return Mask(all & ~below);
  }
  static V load_y(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store_y(float* p, V v, Mask m) { _mm512_mask_storeu_ps(p, m, v); }
  static V loadu_y(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu_y(float* p, V v) { _mm512_storeu_ps(p, v); }
};
#endif

constexpr int kGroupRows = 16;     // rows per interleaved group (matmul.h)
constexpr int64_t kKc = 256;       // K block of the prefill panels
constexpr int64_t kDirectTokens = 8;
constexpr int64_t kTokenBlock = 256;  // prefill tokens whose activation rows one K block reuses from L2

template <DType T>
constexpr int64_t elem_bytes() { return T == DType::F32 ? 4 : 2; }

template <class P, DType T>
typename P::V load_w(const uint8_t* p) {
  if constexpr (T == DType::F32) return P::from_f32(p);
  else if constexpr (T == DType::F16) return P::from_f16(p);
  else return P::from_bf16(p);
}

// One element as stored (no inline functions of shared headers in ISA code: matmul.h).
template <DType T>
float load1(const uint8_t* p) {
  if constexpr (T == DType::F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  } else if constexpr (T == DType::F16) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
  } else {
    uint16_t h;
    std::memcpy(&h, p, 2);
    const uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
}

// Output columns [lo, hi) of a 2-vector-wide tile, as the two vectors' masks.
template <class P>
struct TileMask {
  typename P::Mask m[2];
  bool full;
  TileMask(int lo, int hi) : full(lo == 0 && hi == 2 * P::kLanes) {
    m[0] = P::mask(lo, hi);
    m[1] = P::mask(lo - P::kLanes, hi - P::kLanes);
  }
};

// --- prefill: packed panels --------------------------------------------------------------

// panel[k][j] (2 * kLanes floats per k, 64-aligned) = W[p + j][k0 + k] for k < kc, for rows
// p + j < n_out; 0 for rows past n_out (computed, never stored).
template <class P, DType T>
void pack_panel(const GemmArgs& a, int64_t p, int64_t k0, int64_t kc, float* panel) {
  constexpr int NR = 2 * P::kLanes;
  constexpr int64_t eb = elem_bytes<T>();
  const int64_t whole_groups = a.interleaved16 ? a.n_out / kGroupRows : 0;
  for (int s = 0; s < NR / kGroupRows; ++s) {
    const int64_t q = p + s * kGroupRows;  // the slot's first row
    if (q % kGroupRows == 0 && q / kGroupRows < whole_groups) {
      // group q / 16: per k its 16 elements, contiguous (BF16, even n_in: per pair of k, whose
      // byte offsets are the same; k0 and kc are then even)
      const uint8_t* g = a.w + q * a.row_bytes + k0 * kGroupRows * eb;
      if (T == DType::BF16 && a.n_in % 2 == 0) {
        for (int64_t k = 0; k < kc; k += 2)
          for (int v = 0; v < kGroupRows / P::kLanes; ++v) {
            const uint8_t* pv = g + (k * kGroupRows + 2 * v * P::kLanes) * eb;
            P::store(panel + k * NR + s * kGroupRows + v * P::kLanes, P::pair_lo(pv));
            P::store(panel + (k + 1) * NR + s * kGroupRows + v * P::kLanes, P::pair_hi(pv));
          }
        continue;
      }
      for (int64_t k = 0; k < kc; ++k)
        for (int v = 0; v < kGroupRows / P::kLanes; ++v)
          P::store(panel + k * NR + s * kGroupRows + v * P::kLanes, load_w<P, T>(g + (k * kGroupRows + v * P::kLanes) * eb));
      continue;
    }
    for (int j = 0; j < kGroupRows; ++j) {
      const int64_t row = q + j;
      float* col = panel + s * kGroupRows + j;
      if (row >= a.n_out) {
        for (int64_t k = 0; k < kc; ++k) col[k * NR] = 0.0f;
        continue;
      }
      const uint8_t* src = a.w + row * a.row_bytes + k0 * eb;  // a stored row (tail rows sit where rows would)
      for (int64_t k = 0; k < kc; ++k) col[k * NR] = load1<T>(src + k * eb);
    }
  }
}

// The activations of tokens [t0, t1) over K block [k0, k0 + kc), copied row by row at a
// stride of kXStride floats: the rows themselves are usually a power of two of bytes apart
// (2048 floats), so a tile's 12 broadcast streams would all fall into the same few L1 sets.
constexpr int64_t kXStride = kKc + 16;
inline void pack_acts(const GemmArgs& a, int64_t t0, int64_t t1, int64_t k0, int64_t kc, float* xp) {
  for (int64_t t = t0; t < t1; ++t) std::memcpy(xp + (t - t0) * kXStride, a.x + t * a.ldx + k0, size_t(kc) * sizeof(float));
}

// y[t][o0 + j] for M tokens and the panel's 2 vectors of rows over one K block; xp: the
// tokens' activations (pack_acts).
template <class P, int M>
void panel_tile(const float* panel, int64_t kc, const float* xp, float* y, int64_t ldy, bool load_c,
                const TileMask<P>& tm) {
  constexpr int NR = 2 * P::kLanes;
  typename P::V acc[M][2];
  for (int i = 0; i < M; ++i)
    for (int v = 0; v < 2; ++v) {
      if (!load_c) acc[i][v] = P::zero();
      else if (tm.full) acc[i][v] = P::loadu_y(y + i * ldy + v * P::kLanes);
      else acc[i][v] = P::load_y(y + i * ldy + v * P::kLanes, tm.m[v]);
    }
  for (int64_t k = 0; k < kc; ++k) {
    const typename P::V b0 = P::load(panel + k * NR), b1 = P::load(panel + k * NR + P::kLanes);
    for (int i = 0; i < M; ++i) {
      const typename P::V xv = P::bcast(xp + i * kXStride + k);
      acc[i][0] = P::fma(b0, xv, acc[i][0]);
      acc[i][1] = P::fma(b1, xv, acc[i][1]);
    }
  }
  for (int i = 0; i < M; ++i)
    for (int v = 0; v < 2; ++v) {
      if (tm.full) P::storeu_y(y + i * ldy + v * P::kLanes, acc[i][v]);
      else P::store_y(y + i * ldy + v * P::kLanes, acc[i][v], tm.m[v]);
    }
}

template <class P, int M = P::kMr>
void panel_tile_n(int m, const float* panel, int64_t kc, const float* xp, float* y, int64_t ldy, bool load_c,
                  const TileMask<P>& tm) {
  if (m == M) return panel_tile<P, M>(panel, kc, xp, y, ldy, load_c, tm);
  if constexpr (M > 1) return panel_tile_n<P, M - 1>(m, panel, kc, xp, y, ldy, load_c, tm);
}

// Floats of one token block's packed activations.
template <class P>
constexpr int64_t packed_acts_floats() { return kTokenBlock * kXStride; }

// Rows [r0, r1) of the output from panels starting at p0 (p0 <= r0; columns outside [r0, r1)
// computed but never stored), tokens [t0, t1). scratch: a panel, then the packed activations.
template <class P, DType T>
void gemm_panels(const GemmArgs& a, int64_t p0, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float* scratch) {
  constexpr int NR = 2 * P::kLanes;
  float* panel = scratch;
  float* xp = scratch + NR * kKc;
  for (int64_t tb = t0; tb < t1; tb += kTokenBlock) {
    const int64_t te = tb + kTokenBlock < t1 ? tb + kTokenBlock : t1;
    for (int64_t k0 = 0; k0 < a.n_in; k0 += kKc) {
      const int64_t kc = a.n_in - k0 < kKc ? a.n_in - k0 : kKc;
      pack_acts(a, tb, te, k0, kc, xp);
      for (int64_t p = p0; p < r1; p += NR) {
        pack_panel<P, T>(a, p, k0, kc, panel);
        const int lo = r0 > p ? int(r0 - p) : 0;
        const int hi = r1 - p < NR ? int(r1 - p) : NR;
        const TileMask<P> tm(lo, hi);
        for (int64_t t = tb; t < te; t += P::kMr) {
          const int m = te - t < P::kMr ? int(te - t) : P::kMr;
          panel_tile_n<P>(m, panel, kc, xp + (t - tb) * kXStride, a.y + t * a.ldy + p, a.ldy, k0 > 0, tm);
        }
      }
    }
  }
}

// --- decode and small batches: the interleaved groups read directly -----------------------

// Tokens [t, t + TN) x groups [g, g + G), the whole row; rows outside [r0, r1) not stored.
template <class P, DType T, int TN, int G>
void direct_tile(const GemmArgs& a, int64_t g, int64_t t, int64_t r0, int64_t r1) {
  constexpr int VG = kGroupRows / P::kLanes;  // vectors per group
  constexpr int64_t eb = elem_bytes<T>();
  constexpr int64_t step = kGroupRows * eb;   // bytes of one k across a group
  typename P::V acc[TN][G * VG];
  for (auto& at : acc)
    for (auto& v : at) v = P::zero();
  const uint8_t* w = a.w + g * kGroupRows * a.row_bytes;
  const int64_t gstride = kGroupRows * a.row_bytes;
  const float* x = a.x + t * a.ldx;
  if (T == DType::BF16 && a.n_in % 2 == 0) {  // pairs of k: each dword split by a shift and a mask
    for (int64_t k = 0; k < a.n_in; k += 2) {
      for (int gg = 0; gg < G; ++gg) {
        const uint8_t* piece = w + gg * gstride + k * step;
        _mm_prefetch(reinterpret_cast<const char*>(piece) + 1024, _MM_HINT_T0);
        for (int v = 0; v < VG; ++v) {
          const uint8_t* pv = piece + 2 * v * P::kLanes * eb;
          const typename P::V lo = P::pair_lo(pv), hi = P::pair_hi(pv);
          for (int tt = 0; tt < TN; ++tt) {
            typename P::V& ac = acc[tt][gg * VG + v];
            ac = P::fma(lo, P::bcast(x + tt * a.ldx + k), ac);
            ac = P::fma(hi, P::bcast(x + tt * a.ldx + k + 1), ac);
          }
        }
      }
    }
  } else {
    // The k steps of one 64-byte line of each group (F16 / BF16 2, F32 1) per iteration, with one
    // prefetch a line ahead of each group's stream (G streams in flight); the rest after.
    constexpr int64_t kPerLine = 64 / step > 0 ? 64 / step : 1;
    const auto one_k = [&](int64_t k) {
      typename P::V wv[G * VG];
      for (int gg = 0; gg < G; ++gg)
        for (int v = 0; v < VG; ++v) wv[gg * VG + v] = load_w<P, T>(w + gg * gstride + k * step + v * P::kLanes * eb);
      for (int tt = 0; tt < TN; ++tt) {
        const typename P::V xv = P::bcast(x + tt * a.ldx + k);
        for (int j = 0; j < G * VG; ++j) acc[tt][j] = P::fma(wv[j], xv, acc[tt][j]);
      }
    };
    int64_t k = 0;
    for (; k + kPerLine <= a.n_in; k += kPerLine) {
      for (int gg = 0; gg < G; ++gg)
        _mm_prefetch(reinterpret_cast<const char*>(w + gg * gstride + k * step) + 1024, _MM_HINT_T0);
      for (int64_t u = 0; u < kPerLine; ++u) one_k(k + u);
    }
    for (; k < a.n_in; ++k) one_k(k);
  }
  for (int gg = 0; gg < G; ++gg)
    for (int v = 0; v < VG; ++v) {
      const int64_t o = (g + gg) * kGroupRows + v * P::kLanes;  // first row of the vector
      const int lo = r0 > o ? int(r0 - o) : 0;
      const int hi = r1 - o < P::kLanes ? int(r1 - o) : P::kLanes;
      if (hi <= 0 || lo >= P::kLanes) continue;
      for (int tt = 0; tt < TN; ++tt) {
        float* yp = a.y + (t + tt) * a.ldy + o;
        if (lo == 0 && hi == P::kLanes) P::storeu_y(yp, acc[tt][gg * VG + v]);
        else P::store_y(yp, acc[tt][gg * VG + v], P::mask(lo, hi));
      }
    }
}

// Groups per tile for TN tokens: enough independent chains to cover the FMA latency within
// the register file (accumulators + the loaded weight vectors), and, for one token, few
// enough streams for the L1: a group's stream is 16 rows below the last one's, a multiple of
// 4 KiB for any n_in that is a multiple of 128, so every stream of a tile and the lines
// prefetched ahead of it fall into the same L1 sets. With 8 streams Zen 4's 8-way L1 thrashed:
// `bench_matmul --sweep 22` read F16 decode at 37 GB/s where plain sums read 57 (BF16 36 of
// 55); 2 to 5 streams read 48-52. 4 chains of 16 lanes still cover the FMA latency for a
// one-token decode, which the memory bounds.
template <class P, int TN>
constexpr int direct_groups() {
  if constexpr (P::kLanes == 16) return TN == 1 ? 4 : TN == 2 ? 6 : 4;
  else return TN == 1 ? 4 : TN <= 3 ? 2 : 1;
}

template <class P, DType T, int TN, int G = direct_groups<P, TN>()>
void direct_tile_n(int n_groups, const GemmArgs& a, int64_t g, int64_t t, int64_t r0, int64_t r1) {
  if (n_groups == G) return direct_tile<P, T, TN, G>(a, g, t, r0, r1);
  if constexpr (G > 1) return direct_tile_n<P, T, TN, G - 1>(n_groups, a, g, t, r0, r1);
}

template <class P, DType T, int TN>
void direct_tokens(const GemmArgs& a, int64_t g0, int64_t g1, int64_t t, int64_t r0, int64_t r1) {
  constexpr int G = direct_groups<P, TN>();
  for (int64_t g = g0; g < g1; g += G) direct_tile_n<P, T, TN>(g1 - g < G ? int(g1 - g) : G, a, g, t, r0, r1);
}

// --- BF16 weights by the BF16 dot (AVX512-BF16: vdpbf16ps) ------------------------------
//
// With activations rounded to bf16 (ActKind::BF16Pairs, converted once per matmul by the
// table's quantize), one vdpbf16ps multiplies 16 rows' pairs of weights (the pair-interleaved
// groups, matmul.h) by one token's broadcast pair and adds both exact products into the 16
// rows' f32 sums: 32 multiply-adds per instruction, twice the FMA tiles' rate. Every tile
// (decode groups, prefill panels, rows as stored packed into pairs) runs the same instruction
// on the same pairs in the same order, so a token's bits do not depend on its batch, the thread
// count or the row range either.
#ifdef __AVX512BF16__

inline __m512 dot_pairs(__m512 acc, __m512i w, __m512i x) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh&>(w), reinterpret_cast<__m512bh&>(x));
}
inline __m512i bcast_pair(const uint8_t* p) {
  int32_t d;
  std::memcpy(&d, p, 4);
  return _mm512_set1_epi32(d);
}

// Tokens [t, t + TN) x groups [g, g + G), the whole row.
template <int TN, int G>
void dot_direct_tile(const GemmArgs& a, int64_t g, int64_t t, int64_t r0, int64_t r1) {
  __m512 acc[TN][G];
  for (auto& at : acc)
    for (auto& v : at) v = _mm512_setzero_ps();
  const uint8_t* w = a.w + g * kGroupRows * a.row_bytes;
  const int64_t gstride = kGroupRows * a.row_bytes, xs = a.act_layout.stride;
  const uint8_t* x = a.act + t * xs;
  const int64_t n_pairs = a.n_in / 2;
  for (int64_t p = 0; p < n_pairs; ++p) {
    __m512i wv[G];
    for (int gg = 0; gg < G; ++gg) {
      const uint8_t* piece = w + gg * gstride + p * 64;
      _mm_prefetch(reinterpret_cast<const char*>(piece) + 1024, _MM_HINT_T0);
      wv[gg] = _mm512_loadu_si512(piece);
    }
    for (int tt = 0; tt < TN; ++tt) {
      const __m512i xv = bcast_pair(x + tt * xs + 4 * p);
      for (int gg = 0; gg < G; ++gg) acc[tt][gg] = dot_pairs(acc[tt][gg], wv[gg], xv);
    }
  }
  for (int gg = 0; gg < G; ++gg) {
    const int64_t o = (g + gg) * kGroupRows;
    const int lo = r0 > o ? int(r0 - o) : 0;
    const int hi = r1 - o < kGroupRows ? int(r1 - o) : kGroupRows;
    if (hi <= 0 || lo >= kGroupRows) continue;
    for (int tt = 0; tt < TN; ++tt) {
      float* yp = a.y + (t + tt) * a.ldy + o;
      if (lo == 0 && hi == kGroupRows) _mm512_storeu_ps(yp, acc[tt][gg]);
      else _mm512_mask_storeu_ps(yp, Avx512Vec::mask(lo, hi), acc[tt][gg]);
    }
  }
}

template <int TN, int G = direct_groups<Avx512Vec, TN>()>
void dot_direct_tile_n(int n_groups, const GemmArgs& a, int64_t g, int64_t t, int64_t r0, int64_t r1) {
  if (n_groups == G) return dot_direct_tile<TN, G>(a, g, t, r0, r1);
  if constexpr (G > 1) return dot_direct_tile_n<TN, G - 1>(n_groups, a, g, t, r0, r1);
}

template <int TN>
void dot_direct_tokens(const GemmArgs& a, int64_t g0, int64_t g1, int64_t t, int64_t r0, int64_t r1) {
  constexpr int G = direct_groups<Avx512Vec, TN>();
  for (int64_t g = g0; g < g1; g += G) dot_direct_tile_n<TN>(g1 - g < G ? int(g1 - g) : G, a, g, t, r0, r1);
}

// M tokens x 32 rows over n_pairs pairs: the two 16-row slots' pairs at b[0] / b[1], bs bytes
// from one pair to the next; the tokens' pairs at x, xs bytes apart.
template <int M>
void dot_panel_tile(const uint8_t* const b[2], int64_t bs, int64_t n_pairs, const uint8_t* x, int64_t xs, float* y,
                    int64_t ldy, bool load_c, const TileMask<Avx512Vec>& tm) {
  __m512 acc[M][2];
  for (int i = 0; i < M; ++i)
    for (int v = 0; v < 2; ++v) {
      if (!load_c) acc[i][v] = _mm512_setzero_ps();
      else if (tm.full) acc[i][v] = _mm512_loadu_ps(y + i * ldy + 16 * v);
      else acc[i][v] = _mm512_maskz_loadu_ps(tm.m[v], y + i * ldy + 16 * v);
    }
  for (int64_t p = 0; p < n_pairs; ++p) {
    const __m512i b0 = _mm512_loadu_si512(b[0] + p * bs), b1 = _mm512_loadu_si512(b[1] + p * bs);
    for (int i = 0; i < M; ++i) {
      const __m512i xv = bcast_pair(x + i * xs + 4 * p);
      acc[i][0] = dot_pairs(acc[i][0], b0, xv);
      acc[i][1] = dot_pairs(acc[i][1], b1, xv);
    }
  }
  for (int i = 0; i < M; ++i)
    for (int v = 0; v < 2; ++v) {
      if (tm.full) _mm512_storeu_ps(y + i * ldy + 16 * v, acc[i][v]);
      else _mm512_mask_storeu_ps(y + i * ldy + 16 * v, tm.m[v], acc[i][v]);
    }
}

template <int M = Avx512Vec::kMr>
void dot_panel_tile_n(int m, const uint8_t* const b[2], int64_t bs, int64_t n_pairs, const uint8_t* x, int64_t xs,
                      float* y, int64_t ldy, bool load_c, const TileMask<Avx512Vec>& tm) {
  if (m == M) return dot_panel_tile<M>(b, bs, n_pairs, x, xs, y, ldy, load_c, tm);
  if constexpr (M > 1) return dot_panel_tile_n<M - 1>(m, b, bs, n_pairs, x, xs, y, ldy, load_c, tm);
}

// Rows [r0, r1) from 32-row panels starting at p0, all tokens. A slot that is a whole
// interleaved group is read where it is; other rows (as stored) are packed into pairs in the
// scratch (32 dwords per pair; rows past n_out zero).
void dot_panels(const GemmArgs& a, int64_t p0, int64_t r0, int64_t r1, uint8_t* scratch) {
  constexpr int NR = 32;
  const int64_t whole_groups = a.interleaved16 ? a.n_out / kGroupRows : 0;
  const int64_t xs = a.act_layout.stride;
  for (int64_t tb = 0; tb < a.n_tokens; tb += kTokenBlock) {
    const int64_t te = tb + kTokenBlock < a.n_tokens ? tb + kTokenBlock : a.n_tokens;
    for (int64_t k0 = 0; k0 < a.n_in; k0 += kKc) {
      const int64_t n_pairs = (a.n_in - k0 < kKc ? a.n_in - k0 : kKc) / 2;
      for (int64_t p = p0; p < r1; p += NR) {
        const uint8_t* b[2];
        int64_t bs = 64;
        bool packed = false;
        for (int s = 0; s < 2; ++s) {
          const int64_t q = p + s * kGroupRows;
          if (q % kGroupRows == 0 && q / kGroupRows < whole_groups) {
            b[s] = a.w + q * a.row_bytes + k0 * kGroupRows * 2;
            continue;
          }
          packed = true;
          for (int j = 0; j < kGroupRows; ++j) {
            const int64_t row = q + j;
            uint8_t* col = scratch + 4 * (s * kGroupRows + j);
            for (int64_t pp = 0; pp < n_pairs; ++pp) {
              if (row < a.n_out) std::memcpy(col + pp * 4 * NR, a.w + row * a.row_bytes + (k0 + 2 * pp) * 2, 4);
              else std::memset(col + pp * 4 * NR, 0, 4);
            }
          }
          b[s] = scratch + 4 * s * kGroupRows;
        }
        if (packed) {  // one stride for both slots: a group slot beside a packed one is copied too
          for (int s = 0; s < 2; ++s) {
            if (b[s] == scratch + 4 * s * kGroupRows) continue;
            for (int64_t pp = 0; pp < n_pairs; ++pp) std::memcpy(scratch + pp * 4 * NR + 4 * s * kGroupRows, b[s] + pp * 64, 64);
            b[s] = scratch + 4 * s * kGroupRows;
          }
          bs = 4 * NR;
        }
        const int lo = r0 > p ? int(r0 - p) : 0;
        const int hi = r1 - p < NR ? int(r1 - p) : NR;
        const TileMask<Avx512Vec> tm(lo, hi);
        for (int64_t t = tb; t < te; t += Avx512Vec::kMr) {
          const int m = te - t < Avx512Vec::kMr ? int(te - t) : Avx512Vec::kMr;
          dot_panel_tile_n(m, b, bs, n_pairs, a.act + t * xs + k0 * 2, xs, a.y + t * a.ldy + p, a.ldy, k0 > 0, tm);
        }
      }
    }
  }
}

void gemm_bf16_dot(const GemmArgs& a, int64_t r0, int64_t r1, uint8_t* scratch) {
  const int64_t grouped = a.interleaved16 ? a.n_out / kGroupRows * kGroupRows : 0;
  if (a.n_tokens > kDirectTokens || r0 >= grouped)
    return dot_panels(a, r0 < grouped ? r0 / kGroupRows * kGroupRows : r0, r0, r1, scratch);
  const int64_t g0 = r0 / kGroupRows;
  const int64_t g1 = (r1 < grouped ? r1 + kGroupRows - 1 : grouped) / kGroupRows;
  int64_t t = 0;
  for (; t + 4 <= a.n_tokens; t += 4) dot_direct_tokens<4>(a, g0, g1, t, r0, r1);
  switch (a.n_tokens - t) {
    case 3: dot_direct_tokens<3>(a, g0, g1, t, r0, r1); break;
    case 2: dot_direct_tokens<2>(a, g0, g1, t, r0, r1); break;
    case 1: dot_direct_tokens<1>(a, g0, g1, t, r0, r1); break;
    default: break;
  }
  if (r1 > grouped) dot_panels(a, grouped, grouped, r1, scratch);
}

// Tokens [t0, t1) of x rounded to bf16 pairs (vcvtne2ps2bf16: nearest even, denormals as zero).
void quantize_bf16_pairs(const ActLayout& lay, const float* x, int64_t ldx, int64_t n_in, int64_t t0, int64_t t1,
                         uint8_t* act) {
  for (int64_t t = t0; t < t1; ++t) {
    const float* xr = x + t * ldx;
    uint8_t* row = act + t * lay.stride;
    for (int64_t i = 0; i < n_in; i += 32) {
      const int64_t n = n_in - i < 32 ? n_in - i : 32;
      const __mmask16 m0 = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
      const __mmask16 m1 = n >= 32 ? __mmask16(0xFFFF) : n <= 16 ? __mmask16(0) : __mmask16((1u << (n - 16)) - 1);
      const __m512 lo = _mm512_maskz_loadu_ps(m0, xr + i), hi = _mm512_maskz_loadu_ps(m1, xr + i + 16);
      const __m512bh h = _mm512_cvtne2ps_pbh(hi, lo);
      const __mmask32 mb = n >= 32 ? __mmask32(0xFFFFFFFFu) : __mmask32((1u << n) - 1);
      _mm512_mask_storeu_epi16(row + 2 * i, mb, reinterpret_cast<const __m512i&>(h));
    }
  }
}

#endif  // __AVX512BF16__

// --- the driver ----------------------------------------------------------------------------

template <class P, DType T>
void gemm_float_rows(const GemmArgs& a, int64_t r0, int64_t r1, uint8_t* scratch) {
  float* panel = reinterpret_cast<float*>(scratch);
  const int64_t grouped = a.interleaved16 ? a.n_out / kGroupRows * kGroupRows : 0;  // rows in whole groups
  if (a.n_tokens > kDirectTokens || r0 >= grouped) {
    // Panels start on a group boundary where groups are read (a slot must be a whole group).
    const int64_t p0 = r0 < grouped ? r0 / kGroupRows * kGroupRows : r0;
    return gemm_panels<P, T>(a, p0, r0, r1, 0, a.n_tokens, panel);
  }
  const int64_t g0 = r0 / kGroupRows;
  const int64_t g1 = (r1 < grouped ? r1 + kGroupRows - 1 : grouped) / kGroupRows;
  int64_t t = 0;
  for (; t + 4 <= a.n_tokens; t += 4) direct_tokens<P, T, 4>(a, g0, g1, t, r0, r1);
  switch (a.n_tokens - t) {
    case 3: direct_tokens<P, T, 3>(a, g0, g1, t, r0, r1); break;
    case 2: direct_tokens<P, T, 2>(a, g0, g1, t, r0, r1); break;
    case 1: direct_tokens<P, T, 1>(a, g0, g1, t, r0, r1); break;
    default: break;
  }
  if (r1 > grouped) {  // tail rows, as stored
    gemm_panels<P, T>(a, grouped, grouped, r1, 0, a.n_tokens, panel);
  }
}

template <class P>
void gemm_float(const GemmArgs& a, int64_t r0, int64_t r1, uint8_t* scratch) {
#ifdef __AVX512BF16__
  if (a.act_layout.kind == ActKind::BF16Pairs) return gemm_bf16_dot(a, r0, r1, scratch);
#endif
  switch (a.type) {
    case DType::F32: return gemm_float_rows<P, DType::F32>(a, r0, r1, scratch);
    case DType::F16: return gemm_float_rows<P, DType::F16>(a, r0, r1, scratch);
    default: return gemm_float_rows<P, DType::BF16>(a, r0, r1, scratch);
  }
}

// Scratch one thread needs: one panel (2 vectors x kKc floats), then one token block's packed
// activations.
template <class P>
constexpr int64_t float_scratch_bytes() { return (2 * P::kLanes * kKc + packed_acts_floats<P>()) * int64_t(sizeof(float)); }

}  // namespace
}  // namespace tern::kern
