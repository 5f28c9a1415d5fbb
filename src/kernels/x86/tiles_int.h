#pragma once
// The "classic" integer tiles of the AVX2 and AVX-512 tables, written once with 256-bit vectors
// and parameterised by an `Ops` policy for the integer dot-product primitives:
//
//   Ops::dot_u8s8(acc, u, s)  acc[i] += sum of 4 products u8 * s8      (vpdpbusd / pmaddubsw)
//   Ops::dot_s16(acc, a, b)   acc[i] += a[2i] * b[2i] + a[2i+1] * b[2i+1]  (vpdpwssd / pmaddwd)
//   Ops::kMaxTokens           tokens per register tile (16 ymm registers for AVX2, 32 for AVX-512)
//
// The "classic" path tiles R weight rows x T tokens: each weight block is loaded and unpacked
// once per tile and reused for T tokens; accumulators are 8 f32 lanes per (row, token), reduced
// horizontally once per tile.
//
// Also what the other integer tiles (matmul_avx2.cpp, the AVX-512 families) build on: the weight
// prefetch step, the Tile / RowsView / ActPtrs views of weights and Rows activations, the walk
// over rows interleaved by 16 (for_each_interleaved_tile), the unpacking of Q4_K / Q3_K scales
// and of Q5 fifth bits; and the weight types the x86 tables cover (x86_has_kernel).
//
// Include only from *_avx2.cpp / *_avx512.cpp. Everything but RowsView is in an unnamed
// namespace so each ISA's translation unit has its own copy (no ODR mixing of differently
// compiled code).
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/kernel_iface.h"
#include "kernels/x86/simd.h"
#include "quant/quant_traits.h"

namespace tern::kern {

// Where the Rows-layout activations of tokens [t_begin, n_tokens) live: the whole buffer for
// Rows layouts, the tail section after the token groups for Lanes layouts.
// Outside the unnamed namespace: the AVX-512 tile families take it from one translation unit
// to another (avx512_tiles.h). Plain data, no code: nothing of it is compiled per ISA.
struct RowsView {
  const uint8_t* act;  // row of token t_begin
  int64_t stride, off_d, off_sum, t_begin;
  int64_t block;       // 32 (Q8_0) or 256 (Q8_K)
};

namespace {

// --- classic integer tiles ---------------------------------------------------------------

// Weight prefetch for the integer tiles. A tile walks R rows side by side, a few hundred bytes
// to a few KB each: streams too short for the hardware prefetcher, which left a GEMV at a
// third of the DRAM bandwidth or less. So each block step of a tile prefetches the next R block
// sizes of the bytes kPrefetchTiles tiles on (the tiles are contiguous): over a tile, exactly
// the tile that far ahead, in address order. Two tiles, not one: the last row of the next tile
// would be prefetched only 1/R of a tile before its use. Into L2: prefetching into L1 (T0, or
// NTA) measured about 2/3 of the bandwidth (L1's miss buffers run out, presumably).
// Prefetches past the matrix's end are harmless (they never fault).
constexpr int kPrefetchTiles = 2;

// Prefetches the Bytes bytes at p, which one block step of a tile consumes from the next rows.
template <int Bytes>
inline void prefetch_step(const uint8_t* p) {
  for (int i = 0; i < (Bytes + 63) / 64; ++i) _mm_prefetch(reinterpret_cast<const char*>(p) + 64 * i, _MM_HINT_T2);
}

struct Tile {
  const uint8_t* w;      // weight row of the tile's first row
  int64_t row_bytes;
  const uint8_t* act;    // activation row of the tile's first token (Rows layout)
  int64_t act_stride;
  int64_t off_d, off_sum;
  int64_t nb;            // blocks (32 or 256 elements) per row
  float* y;              // y of (first token, first row)
  int64_t ldy;
};

template <int R, int T>
inline void store_tile(const Tile& c, __m256 (&acc)[R][T]) {
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) c.y[t * c.ldy + r] = hsum256(acc[r][t]);
}

// The RowsView of a's activations (RowsView above).
inline RowsView rows_view(const GemmArgs& a) {
  const ActLayout& l = a.act_layout;
  const bool q8_0 = l.kind == ActKind::Q8_0Rows || l.kind == ActKind::Q8_0Lanes;
  if (l.kind == ActKind::Q8_0Rows || l.kind == ActKind::Q8_KRows)
    return {a.act, l.stride, l.off_d, l.off_sum, 0, q8_0 ? 32 : kQK_K};
  return {a.act + l.tail_offset, l.tail_stride, l.off_d, l.off_sum, l.lane_tokens, q8_0 ? 32 : kQK_K};
}

template <int T>
struct ActPtrs {
  const int8_t* q[T];
  const float* d[T];
  const uint8_t* sum[T];  // nsum (int32) or bsums (int16)
  explicit ActPtrs(const Tile& c) {
    for (int t = 0; t < T; ++t) set(t, c.act + t * c.act_stride, c.off_d, c.off_sum);
  }
  // Tokens [t0, t0 + T) of a Rows view.
  ActPtrs(const RowsView& v, int64_t t0) {
    for (int t = 0; t < T; ++t) set(t, v.act + (t0 + t - v.t_begin) * v.stride, v.off_d, v.off_sum);
  }
  const int32_t* nsum(int t) const { return reinterpret_cast<const int32_t*>(sum[t]); }
  const int16_t* bsums(int t) const { return reinterpret_cast<const int16_t*>(sum[t]); }

 private:
  void set(int t, const uint8_t* row, int64_t off_d, int64_t off_sum) {
    q[t] = reinterpret_cast<const int8_t*>(row);
    d[t] = reinterpret_cast<const float*>(row + off_d);
    sum[t] = row + off_sum;
  }
};

// Rows [r0, r1) x all tokens of weights interleaved by 16 rows (kernels/matmul.h; groups of
// group_bytes), tile by tile: fn(group, t, n, lo, hi, pf, y) for tokens [t, t + n), n <= TM, of
// rows [lo, hi) of the group (rows [r0, r1) may start and end inside one: its other rows are
// computed, not stored), y at (token t, the group's row 0). Token blocks whose activations
// (~256 KB) stay in L2 while the rows pass over them.
// A lone token (decode) on AMD streams the groups without software prefetch (pf null): a
// thread's groups are one contiguous stream, which the hardware prefetchers follow, and
// prefetching two groups ahead cost bandwidth. Side by side on 2 threads (AVX-512, Zen 4) in
// minutes when the probe read 45-50 GB/s: GEMV 45 vs 38.5 GB/s (Q8_0) and 41.6 vs 37.6 (Q4_0),
// medians of 5; TinyLlama tg32 59-77 vs 53-58 tok/s (Q4_0) and 32-44 vs 28-32 (Q8_0); equal when
// bandwidth is scarce. Intel cores are the other way round: without the prefetch a core's
// stream had too few misses in flight. bench_matmul --sweep (TinyLlama's decode weights, medians
// of alternating sweeps, a Xeon with AVX-512 VNNI, busy with 2 compilers): 1 thread, 8 layers,
// TQ2_0 8.5 -> 12.9 and 7.7 -> 12.5 GB/s, Q4_0 8.8 -> 14.0 and 7.0 -> 13.7; 2 threads, 22 layers,
// TQ2_0 6.2 -> 9.6, Q4_0 7.3 -> 10.4 (the stored rows' prefetching wide tiles: 10.0 / 9.6);
// TinyLlama Q4_0 tg32 7.3 / 7.8 / 8.0 -> 10.3 / 11.1 / 11.3 tok/s, on AVX2 (TERN_FORCE_ISA=avx2)
// 6.2 / 6.5 -> 10.1 / 9.3 (docs/performance.md, ternary types). A
// batch does more work per byte and prefetches two groups on while its first token tile reads
// this one: without it, 16 sequences decoding together (bench-serve C=16) ran 12% slower.
inline bool decode_prefetch() {
  static const bool intel = __builtin_cpu_is("intel");
  return intel;
}
template <int TM, class Fn>
void for_each_interleaved_tile(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1, int64_t group_bytes,
                               Fn&& fn) {
  int64_t tb = (256 << 10) / (v.stride > 0 ? v.stride : 1);
  tb = tb < TM ? TM : tb / TM * TM;
  for (int64_t t0 = v.t_begin; t0 < a.n_tokens; t0 += tb) {
    const int64_t t1 = t0 + tb < a.n_tokens ? t0 + tb : a.n_tokens;
    for (int64_t g = r0 / 16; g * 16 < r1; ++g) {
      const uint8_t* group = a.w + g * group_bytes;
      const int lo = r0 > g * 16 ? int(r0 - g * 16) : 0, hi = r1 < g * 16 + 16 ? int(r1 - g * 16) : 16;
      const uint8_t* pf = a.n_tokens > 1 || decode_prefetch() ? group + 2 * group_bytes : nullptr;
      for (int64_t t = t0; t < t1; t += TM)
        fn(group, t, t1 - t < TM ? t1 - t : TM, lo, hi, t == t0 ? pf : nullptr, a.y + t * a.ldy + g * 16);
    }
  }
}

// Bit i set for each row i in [lo, hi) of a 16-row group.
inline uint32_t rows_mask(int lo, int hi) { return ((1u << hi) - 1u) & ~((1u << lo) - 1u); }

// Q8_0 x Q8_0: the sign trick makes one operand unsigned (|w|) and moves w's sign onto x, so
// that pmaddubsw's int16 pair sums (<= 2 * 127 * 127) cannot saturate.
template <class Ops, int R, int T>
void tile_q8_0(const Tile& c) {
  __m256 acc[R][T];
  for (auto& a : acc)
    for (auto& v : a) v = _mm256_setzero_ps();
  const ActPtrs<T> x(c);
  const uint8_t* pf = c.w + kPrefetchTiles * R * c.row_bytes;  // the rows kPrefetchTiles tiles on
  for (int64_t b = 0; b < c.nb; ++b) {
    prefetch_step<R * int(sizeof(BlockQ8_0))>(pf + b * R * int64_t(sizeof(BlockQ8_0)));
    __m256i xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[t] + 32 * b));
    for (int r = 0; r < R; ++r) {
      const BlockQ8_0* blk = reinterpret_cast<const BlockQ8_0*>(c.w + r * c.row_bytes) + b;
      const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qs));
      const __m256i aw = _mm256_abs_epi8(wq);
      const float dw = f16_to_f32(blk->d);
      for (int t = 0; t < T; ++t) {
        const __m256i s = Ops::dot_u8s8(_mm256_setzero_si256(), aw, _mm256_sign_epi8(xv[t], wq));
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * x.d[t][b]), acc[r][t]);
      }
    }
  }
  store_tile<R, T>(c, acc);
}

// Bit j of the 32-bit qh at p (Q5_0 / Q5_1's fifth bits) as 0x10 or 0 in byte j.
inline __m256i q5_high_bytes(const uint8_t* p) {
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  // byte j takes byte j / 8 of qh, then keeps bit j % 8
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(int(qh)),
                                             _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                              2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

// Q4_0, Q4_1, Q5_0 and Q5_1 x Q8_0 (Block: the block type): nibbles stay unsigned (0..15; Q5's
// fifth bit or-ed in as 16), so pmaddubsw pairs stay <= 2 * 31 * 128. Q4_0's -8 offset is
// -8 * sum(x) = 8 * nsum, preloaded into the integer accumulator as nsum in each of the 8 lanes
// (Q5_0's -16 as 2 * nsum); Q4_1 / Q5_1's offset m meets sum(x) = -nsum in a scalar per (row,
// token), added when the tile is stored.
template <class Ops, class Block, int R, int T>
void tile_q32(const Tile& c) {
  constexpr bool kQ4_0 = std::is_same_v<Block, BlockQ4_0>;
  constexpr bool kHasMin = std::is_same_v<Block, BlockQ4_1> || std::is_same_v<Block, BlockQ5_1>;
  constexpr bool kFive = std::is_same_v<Block, BlockQ5_0> || std::is_same_v<Block, BlockQ5_1>;
  __m256 acc[R][T];
  float off[R][T] = {};
  for (auto& a : acc)
    for (auto& v : a) v = _mm256_setzero_ps();
  const ActPtrs<T> x(c);
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const uint8_t* pf = c.w + kPrefetchTiles * R * c.row_bytes;
  for (int64_t b = 0; b < c.nb; ++b) {
    prefetch_step<R * int(sizeof(Block))>(pf + b * R * int64_t(sizeof(Block)));
    __m256i xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[t] + 32 * b));
    for (int r = 0; r < R; ++r) {
      const Block* blk = reinterpret_cast<const Block*>(c.w + r * c.row_bytes) + b;
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->qs));
      __m256i wq = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
      if constexpr (kFive) wq = _mm256_or_si256(wq, q5_high_bytes(blk->qh));
      const float dw = f16_to_f32(blk->d);
      for (int t = 0; t < T; ++t) {
        const int32_t nsum = reinterpret_cast<const int32_t*>(x.sum[t])[b];
        const __m256i s = Ops::dot_u8s8(_mm256_set1_epi32(kHasMin ? 0 : kQ4_0 ? nsum : 2 * nsum), wq, xv[t]);
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * x.d[t][b]), acc[r][t]);
        if constexpr (kHasMin) off[r][t] -= float(nsum) * (f16_to_f32(blk->m) * x.d[t][b]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) c.y[t * c.ldy + r] = hsum256(acc[r][t]) + off[r][t];
}

// --- MXFP4 ---------------------------------------------------------------------------------
//
// A nibble indexes the E2M1 values doubled (kMxfp4Values, -12..12); one pshufb looks 16 of them
// up at once. The table here holds them plus kMxfp4Bias (4..28): unsigned, as pmaddubsw and
// vpdpbusd want their first operand, with pair sums <= 2 * 28 * 127. The bias comes back through
// the activations' block sums: sum (v + 16) x = sum v x - 16 nsum (nsum = -sum(x)), so
// 16 nsum is preloaded into the integer accumulator (16 divides evenly over the 2, 4 or 8 lanes a
// row's sum spreads over). The integer sums are exact, so they equal the reference's (dot_mxfp4
// in kernels/ref).
constexpr int32_t kMxfp4Bias = 16;
inline __m128i mxfp4_lut128() { return _mm_setr_epi8(16, 17, 18, 19, 20, 22, 24, 28, 16, 15, 14, 13, 12, 10, 8, 4); }

// 2^(e - 128) for an E8M0 byte e (quant_traits.h's e8m0_half, of which this translation unit
// keeps its own copy): exponent field e - 1, or for e < 2 the denormals 2^-128 and 2^-127.
inline float mxfp4_scale(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : uint32_t(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// The same for 4 or 8 exponents in int32 lanes.
inline __m128 mxfp4_scales(__m128i e) {
  const __m128i normal = _mm_slli_epi32(_mm_sub_epi32(e, _mm_set1_epi32(1)), 23);
  const __m128i denormal = _mm_sllv_epi32(_mm_set1_epi32(0x00200000), e);
  return _mm_castsi128_ps(_mm_blendv_epi8(normal, denormal, _mm_cmplt_epi32(e, _mm_set1_epi32(2))));
}
inline __m256 mxfp4_scales(__m256i e) {
  const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
  const __m256i denormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
  return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, denormal, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
}
// The exponent bytes of R rows' blocks (R <= 8; bytes at blk0 + r * rb) packed in a 64-bit
// register, byte r = row r's: general-purpose loads and shifts, as wide_scales does for f16.
template <int R>
inline uint64_t mxfp4_exponents(const uint8_t* blk0, int64_t rb) {
  uint64_t e = 0;
  for (int r = 0; r < R; ++r) e |= uint64_t(blk0[r * rb]) << (8 * r);
  return e;
}

// MXFP4 x Q8_0, tile_q32's shape: a row's 32 values per register, looked up in both 128-bit lanes.
template <class Ops, int R, int T>
void tile_mxfp4(const Tile& c) {
  __m256 acc[R][T];
  for (auto& a : acc)
    for (auto& v : a) v = _mm256_setzero_ps();
  const ActPtrs<T> x(c);
  const __m128i m4 = _mm_set1_epi8(0x0F), lut = mxfp4_lut128();
  const uint8_t* pf = c.w + kPrefetchTiles * R * c.row_bytes;
  for (int64_t b = 0; b < c.nb; ++b) {
    prefetch_step<R * int(sizeof(BlockMXFP4))>(pf + b * R * int64_t(sizeof(BlockMXFP4)));
    __m256i xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[t] + 32 * b));
    for (int r = 0; r < R; ++r) {
      const BlockMXFP4* blk = reinterpret_cast<const BlockMXFP4*>(c.w + r * c.row_bytes) + b;
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->qs));
      const __m256i wq = _mm256_set_m128i(_mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(v, 4), m4)),
                                          _mm_shuffle_epi8(lut, _mm_and_si128(v, m4)));
      const float dw = mxfp4_scale(blk->e);
      for (int t = 0; t < T; ++t) {
        const int32_t nsum = x.nsum(t)[b];
        const __m256i s = Ops::dot_u8s8(_mm256_set1_epi32(kMxfp4Bias / 8 * nsum), wq, xv[t]);
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * x.d[t][b]), acc[r][t]);
      }
    }
  }
  store_tile<R, T>(c, acc);
}

// Q4_1 / Q5_0 / Q5_1 interleaved by 16 rows (kernels/matmul.h): offsets in a group's block.
template <DType kType>
struct Q32xLayout {
  static constexpr bool kMin = kType != DType::Q5_0;   // m[16] (f16) at 32
  static constexpr bool kHigh = kType != DType::Q4_1;  // the rows' 32-bit qh at kH + 4i
  static constexpr int64_t kH = kMin ? 64 : 32;
  static constexpr int64_t kQ = kH + (kHigh ? 64 : 0);  // the 4 nibble pieces
  static constexpr int64_t kBlk = kQ + 4 * 64;
};

// For row-lane tiles of those: the fifth bits of nibble group g (elements 4g..4g+3; g >= 4 the
// high nibbles) at bit 4 of each byte of every 32-bit lane holding a row's permuted qh (bit g of
// byte j, matmul.h); the other bits are garbage, masked by the caller.
inline __m256i q5_group_bits(__m256i qh, int g) {
  return g <= 4 ? _mm256_sll_epi32(qh, _mm_cvtsi32_si128(4 - g)) : _mm256_srl_epi32(qh, _mm_cvtsi32_si128(g - 4));
}

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

// Q6_K x Q8_K: 6-bit quants rebuilt unsigned (0..63: pmaddubsw pairs <= 2 * 63 * 127 fit
// int16), multiplied by each 16-element sub-block's int8 scale in pmaddwd; the -32 offset is
// -32 * sum_j sc_j * bsums_j, one more pmaddwd per token.
template <class Ops, int R, int T>
void tile_q6_k(const Tile& c) {
  __m256 acc[R][T];
  for (auto& a : acc)
    for (auto& v : a) v = _mm256_setzero_ps();
  const ActPtrs<T> x(c);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m2 = _mm256_set1_epi8(0x03);
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
        const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->ql + 64 * h));
        const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->ql + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qh + 32 * h));
        // The 16-bit shifts cannot leak bits across bytes: everything shifted is masked first.
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
        q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
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
  int64_t tb = (256 << 10) / (v.stride > 0 ? v.stride : 1);
  tb = tb < Ops::kMaxTokens ? Ops::kMaxTokens : tb / Ops::kMaxTokens * Ops::kMaxTokens;
  for (int64_t t0 = v.t_begin; t0 < a.n_tokens; t0 += tb) {
    const int64_t t1 = t0 + tb < a.n_tokens ? t0 + tb : a.n_tokens;
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) int_rows<Ops, 4>(a, v, r, t0, t1);
    for (; r < r1; ++r) int_rows<Ops, 1>(a, v, r, t0, t1);
  }
}

// The weight types the x86 tables run: the integer tiles here, the float ones in tiles_float.h.
inline bool x86_has_kernel(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q8_0: case DType::Q4_0:
    case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q2_K: case DType::Q3_K:
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::MXFP4: case DType::TQ1_0:
    case DType::TQ2_0:
      return true;
    default:
      return false;
  }
}

}  // namespace
}  // namespace tern::kern
