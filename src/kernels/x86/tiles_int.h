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
// over rows interleaved by 16 (for_each_interleaved_tile) and the unpacking of Q5 fifth bits.
// The K-quant and ternary classic tiles, the classic driver (gemm_int_classic) and the weight
// types the x86 tables cover (x86_has_kernel) are in tiles_int_k.h, which includes this.
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
// Tokens per block of a GEMM pass: as many as keep ~256 KB of activations (stride bytes each)
// in L2 while every row of the chunk passes over them, a multiple of the tile's `granule`.
inline int64_t l2_token_block(int64_t stride, int64_t granule) {
  const int64_t tb = (256 << 10) / (stride > 0 ? stride : 1);
  return tb < granule ? granule : tb / granule * granule;
}

template <int TM, class Fn>
void for_each_interleaved_tile(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1, int64_t group_bytes,
                               Fn&& fn) {
  const int64_t tb = l2_token_block(v.stride, TM);
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

}  // namespace
}  // namespace tern::kern
