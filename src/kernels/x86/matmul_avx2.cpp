// AVX2 + FMA + F16C kernel table: the register tiles of tiles_int.h with pmaddubsw / pmaddwd
// integer dot products (4 rows x 2 tokens, 16 registers); for Q4_0 / Q8_0 / MXFP4 the 4-row
// tiles below, which fold the rows' integer sums together before the float work. Float weights:
// tiles_float.h. Weights interleaved by 16 rows: rowlanes_avx2.cpp.
#include "kernels/x86/act_quant.h"
#include "kernels/x86/rowlanes_avx2.h"
#include "kernels/x86/tiles_float.h"
#include "kernels/x86/tiles_int_k.h"

namespace tern::kern {
namespace {

struct OpsAvx2 {
  static constexpr int kMaxTokens = 2;  // 4 rows x 2 tokens: 8 accumulators of 16 registers
  // pmaddubsw saturates int16 pair sums: callers keep |u * s| pairs <= 32767.
  static __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  }
  static __m256i dot_s16(__m256i acc, __m256i a, __m256i b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
  }
};

// --- Q4_0 / MXFP4 decode tile: two rows per register ---------------------------------------
//
// tile_q32 (Q4_0) spends a 256-bit register on one row's 32 nibbles, and its float tail (convert,
// scalar scale multiply and broadcast, FMA) on 8 lanes per row and block. Here a register
// holds one block of two rows (16 nibble bytes each, one per 128-bit lane) against the block's
// activations in both lanes, which halves the unpacking; phaddw then folds the two registers
// of a 4-row tile into one, so that the float tail runs once for four rows, and their four
// scales are converted together. No int16 step can saturate: pmaddubsw's pair sums are
// <= 2 * 15 * 128 (MXFP4's biased values, tiles_int.h: 2 * 28 * 127), a lane's low- plus
// high-nibble sums <= 7680 (14224), phaddw's sums <= 15360 (28448).
// kMx: MXFP4 (17-byte blocks, the E8M0 byte first), each nibble looked up in the biased table.

// 4 rows x T tokens.
template <bool kMx, int T>
void pair_q4(const Tile& c) {
  constexpr int64_t kBlk = kMx ? int64_t(sizeof(BlockMXFP4)) : int64_t(sizeof(BlockQ4_0));
  constexpr int64_t kQs = kMx ? 1 : 2;  // offset of qs in the block
  // Q4_0: -8 * sum(x) = 8 * nsum, MXFP4: 16 * nsum, over a row's 2 lanes
  constexpr int32_t kNsum = kMx ? kMxfp4Bias / 2 : 4;
  __m256 acc[T];
  for (auto& v : acc) v = _mm256_setzero_ps();
  const ActPtrs<T> x(c);
  const int64_t rb = c.row_bytes;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i lut = _mm256_broadcastsi128_si256(mxfp4_lut128());
  const __m256i ones = _mm256_set1_epi16(1);
  // After the fold below, lanes hold rows 0 0 2 2 | 1 1 3 3.
  const __m256i expand = _mm256_setr_epi32(0, 0, 2, 2, 1, 1, 3, 3);
  const uint8_t* pf = c.w + kPrefetchTiles * 4 * rb;
  for (int64_t b = 0; b < c.nb; ++b) {
    const uint8_t* blk = c.w + b * kBlk;
    prefetch_step<4 * int(kBlk)>(pf + b * 4 * kBlk);
    __m256i lo[2], hi[2];
    for (int g = 0; g < 2; ++g) {  // rows 2g (low 128 bits), 2g + 1 (high)
      const uint8_t* q = blk + 2 * g * rb + kQs;
      const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))),
                                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + rb)), 1);
      lo[g] = _mm256_and_si256(v, m4);
      hi[g] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      if constexpr (kMx) {
        lo[g] = _mm256_shuffle_epi8(lut, lo[g]);
        hi[g] = _mm256_shuffle_epi8(lut, hi[g]);
      }
    }
    // The four scales packed in a general-purpose register, then converted at once.
    __m128 dw;
    if constexpr (kMx) {
      dw = mxfp4_scales(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(int(mxfp4_exponents<4>(blk, rb)))));
    } else {
      const auto d = [&](int r) { return uint64_t(*reinterpret_cast<const uint16_t*>(blk + r * rb)); };
      dw = _mm_cvtph_ps(_mm_cvtsi64_si128(int64_t(d(0) | d(1) << 16 | d(2) << 32 | d(3) << 48)));
    }
    for (int t = 0; t < T; ++t) {
      const int8_t* xq = x.q[t] + 32 * b;
      const __m256i xlo = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq)));
      const __m256i xhi = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq + 16)));
      __m256i p[2];
      for (int g = 0; g < 2; ++g)
        p[g] = _mm256_add_epi16(_mm256_maddubs_epi16(lo[g], xlo), _mm256_maddubs_epi16(hi[g], xhi));
      // int16 sums of 4 products fold both pairs into one register, then widen
      const __m256i s = _mm256_madd_epi16(_mm256_hadd_epi16(p[0], p[1]), ones);
      const __m256i ns = _mm256_set1_epi32(kNsum * x.nsum(t)[b]);
      const __m256 sc = _mm256_castps128_ps256(_mm_mul_ps(dw, _mm_set1_ps(x.d[t][b])));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s, ns)), _mm256_permutevar8x32_ps(sc, expand), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, acc[t]);
    float* y = c.y + t * c.ldy;
    y[0] = tmp[0] + tmp[1];
    y[2] = tmp[2] + tmp[3];
    y[1] = tmp[4] + tmp[5];
    y[3] = tmp[6] + tmp[7];
  }
}

// --- Q8_0 decode tile: four rows' sums folded into one register ------------------------------
//
// tile_q8_0 converts, scales and accumulates 8 lanes per row and block, with a scalar f16
// conversion, multiply and broadcast for each row's scale. Here the four rows' integer sums
// are folded by two levels of phaddd into one register (row r in lanes r and r + 4) and meet
// their scales, converted together, in one convert and one FMA.

// 4 rows x T tokens.
template <int T>
void quad_q8_0(const Tile& c) {
  __m256 acc[T];
  for (auto& v : acc) v = _mm256_setzero_ps();
  const ActPtrs<T> x(c);
  const int64_t rb = c.row_bytes;
  const __m256i ones = _mm256_set1_epi16(1);
  const uint8_t* pf = c.w + kPrefetchTiles * 4 * rb;
  for (int64_t b = 0; b < c.nb; ++b) {
    const uint8_t* blk = c.w + b * int64_t(sizeof(BlockQ8_0));
    prefetch_step<4 * int(sizeof(BlockQ8_0))>(pf + b * 4 * int64_t(sizeof(BlockQ8_0)));
    const auto d = [&](int r) { return uint64_t(*reinterpret_cast<const uint16_t*>(blk + r * rb)); };
    const __m128 dw = _mm_cvtph_ps(_mm_cvtsi64_si128(int64_t(d(0) | d(1) << 16 | d(2) << 32 | d(3) << 48)));
    for (int t = 0; t < T; ++t) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[t] + 32 * b));
      // The sign trick of tile_q8_0, row by row so that few of the 16 registers stay live.
      __m256i s[4];
      for (int r = 0; r < 4; ++r) {
        const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + r * rb + 2));
        s[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(wq), _mm256_sign_epi8(xv, wq)), ones);
      }
      const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
      const __m128 sc = _mm_mul_ps(dw, _mm_set1_ps(x.d[t][b]));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), _mm256_set_m128(sc, sc), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    const __m128 y = _mm_add_ps(_mm256_castps256_ps128(acc[t]), _mm256_extractf128_ps(acc[t], 1));
    _mm_storeu_ps(c.y + t * c.ldy, y);
  }
}

// --- the choice of tile family: one row per weight type ------------------------------------

using QuadTile = void (*)(const Tile&);

struct TileChoice {
  DType type;
  bool float_tiles;      // tiles_float.h at every batch size (interleaved or not)
  QuadTile quad1, quad2;  // the 4-row tiles above for 1 and 2 tokens (nullptr: tiles_int.h's)
};

// Float weights run tiles_float.h; Q4_0 / Q8_0 / MXFP4 rows as stored the 4-row tiles above,
// then single rows with tiles_int.h's; weights interleaved by 16 rows (interleave.cpp's table)
// rowlanes_avx2.cpp at every size; a type without a row the classic tiles of tiles_int_k.h.
constexpr TileChoice kTileChoices[] = {
    {DType::F32, true, nullptr, nullptr},
    {DType::F16, true, nullptr, nullptr},
    {DType::BF16, true, nullptr, nullptr},
    {DType::Q4_0, false, pair_q4<false, 1>, pair_q4<false, 2>},
    {DType::MXFP4, false, pair_q4<true, 1>, pair_q4<true, 2>},
    {DType::Q8_0, false, quad_q8_0<1>, quad_q8_0<2>},
};

// The one function that chooses: the type's row, or the classic tiles'.
TileChoice tile_choice(DType type) {
  for (const TileChoice& c : kTileChoices)
    if (c.type == type) return c;
  return {type, false, nullptr, nullptr};
}

// gemm_int_classic with the 4-row tiles of c (Q4_0 / Q8_0 / MXFP4), then single rows with the
// tiles of tiles_int.h.
void gemm_q32(const GemmArgs& a, const TileChoice& c, int64_t r0, int64_t r1) {
  constexpr int TM = OpsAvx2::kMaxTokens;
  const RowsView v = rows_view(a);
  const int64_t tb = l2_token_block(v.stride, TM);
  Tile tile = rows_tile(a, v);  // Q8_0 activation rows: 32-element blocks
  for (int64_t t0 = 0; t0 < a.n_tokens; t0 += tb) {
    const int64_t t1 = t0 + tb < a.n_tokens ? t0 + tb : a.n_tokens;
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
      tile.w = a.w + r * a.row_bytes;
      for (int64_t t = t0; t < t1; t += TM) {
        tile.act = v.act + t * v.stride;
        tile.y = a.y + t * a.ldy + r;
        (t1 - t >= 2 ? c.quad2 : c.quad1)(tile);
      }
    }
    for (; r < r1; ++r) int_rows<OpsAvx2, 1>(a, v, r, t0, t1);
  }
}

// --- the table ---------------------------------------------------------------------------

void avx2_quantize(const ActLayout& lay, DType, const float* x, int64_t ldx, int64_t n_in,
                   int64_t, int64_t t0, int64_t t1, uint8_t* act) {
  quantize_rows(lay, x, ldx, n_in, t0, t1, act);
}

int64_t avx2_scratch_bytes(DType type, int64_t) {
  return tile_choice(type).float_tiles ? float_scratch_bytes<Avx2Vec>() : 0;
}

void avx2_gemm(const GemmArgs& a, int64_t r0, int64_t r1, uint8_t* scratch) {
  const TileChoice c = tile_choice(a.type);
  if (c.float_tiles) return gemm_float<Avx2Vec>(a, r0, r1, scratch);
  if (a.interleaved16) return gemm_interleaved_avx2(a, r0, r1);
  if (c.quad1) return gemm_q32(a, c, r0, r1);
  gemm_int_classic<OpsAvx2>(a, rows_view(a), r0, r1);
}

const KernelTable kAvx2Table = {"avx2", x86_has_kernel, act_rows_layout, avx2_quantize,
                                avx2_scratch_bytes, avx2_gemm};

}  // namespace

const KernelTable& table_avx2() { return kAvx2Table; }

}  // namespace tern::kern
