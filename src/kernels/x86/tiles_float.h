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
// Include only from matmul_avx2.cpp / matmul_avx512.cpp, after x86_common.h.

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
      // group q / 16: per k its 16 elements, contiguous
      const uint8_t* g = a.w + q * a.row_bytes + k0 * kGroupRows * eb;
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
template <class P>
void pack_acts(const GemmArgs& a, int64_t t0, int64_t t1, int64_t k0, int64_t kc, float* xp) {
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
      pack_acts<P>(a, tb, te, k0, kc, xp);
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
  for (int64_t k = 0; k < a.n_in; ++k) {
    typename P::V wv[G * VG];
    for (int gg = 0; gg < G; ++gg) {
      const uint8_t* piece = w + gg * gstride + k * step;
      // One line ahead of each group's stream every 64 bytes: G streams in flight.
      if ((k * step) % 64 == 0) _mm_prefetch(reinterpret_cast<const char*>(piece) + 1024, _MM_HINT_T0);
      for (int v = 0; v < VG; ++v) wv[gg * VG + v] = load_w<P, T>(piece + v * P::kLanes * eb);
    }
    for (int tt = 0; tt < TN; ++tt) {
      const typename P::V xv = P::bcast(x + tt * a.ldx + k);
      for (int j = 0; j < G * VG; ++j) acc[tt][j] = P::fma(wv[j], xv, acc[tt][j]);
    }
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
// the register file (accumulators + the loaded weight vectors).
template <class P, int TN>
constexpr int direct_groups() {
  if constexpr (P::kLanes == 16) return TN == 1 ? 8 : TN == 2 ? 6 : 4;
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
