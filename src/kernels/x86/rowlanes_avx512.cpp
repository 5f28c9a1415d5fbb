// AVX-512 row-lane tiles (avx512_tiles.h), a weight row per int32 lane of a zmm: Q4_0 / Q8_0
// rows as stored, for small batches and a batch's tokens after its last full 16-token group; and
// the tiles of weights interleaved by 16 rows (Q4_0, Q8_0, Q4_1, Q5_0, Q5_1, Q2_K..Q5_K, MXFP4,
// TQ1_0, TQ2_0), which read a group's block in place, for every batch size.
//
// Row-lane tiles for Q4_0 / Q8_0, 16 weight rows per zmm. The token-lane tiles
// (fused_avx512.cpp) broadcast each 4-byte weight group to 16 token lanes and must
// make it unsigned there (an AND or XOR per vpdpbusd), then pay a cvt, a multiply and an FMA
// per (row, block): about 25 vector operations per 8 vpdpbusd. Here a lane is a weight row
// instead: the tile transposes block b of 16 rows into 8 vectors, w[k] lane i = the unsigned
// bytes of row i's 4-byte group k (Q4_0: nibbles 0..15, k < 4 the low ones = elements
// 4k..4k+3, k >= 4 the high ones = elements 16+4(k-4)..; Q8_0: w + 128), once per block for
// up to 16 tokens. Each token then needs 8 vpdpbusd whose signed side is its own 4 activation
// bytes, broadcast straight from the Rows layout (an embedded {1to16} memory operand: no ALU
// operation), plus one cvt, one multiply and one FMA for all 16 rows; the weights' offset
// (-8 or +128) folds into the integer accumulator's start value through the token's nsum
// (8 * nsum or 128 * nsum), as in the token-lane tiles. A token's 16 results are then one vector
// store into y, with no horizontal sums. Every (row, token) runs the same operations in the
// same order whatever the tile, the token count or the row chunk, so a row's result does not
// depend on the batch it is in; the integer sums equal the other tiles' exactly, and the
// float steps are those of the token-lane tiles (fma(cvt(s), dx * dw, acc), blocks in order).
#include "kernels/x86/avx512_tiles.h"

namespace tern::kern::avx512 {
namespace {

constexpr int kRowLanes = 16;  // weight rows per zmm, one per int32 lane

// Block b of the 16 rows at rows[i] + b * kBlk, transposed and made unsigned (see above).
template <bool kQ4>
inline void rowlane_unpack(const uint8_t* const* rows, int64_t off, __m512i (&w)[8]) {
  if constexpr (kQ4) {
    __m512i d[4];
    transpose_rows16(rows, off + 2, d);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int k = 0; k < 4; ++k) {
      w[k] = _mm512_and_si512(d[k], m4);
      w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(d[k], 4), m4);
    }
  } else {
    transpose_rows16(rows, off + 2, w);
    transpose_rows16(rows, off + 2 + 16, w + 4);
    const __m512i flip = _mm512_set1_epi8(char(0x80));
    for (int k = 0; k < 8; ++k) w[k] = _mm512_xor_si512(w[k], flip);
  }
}

// Block b of Q4_0 / Q8_0 / MXFP4 rows interleaved by 16 (kernels/matmul.h): Q4_0 / Q8_0 the same 8
// vectors and scales as rowlane_unpack / rows_f16 give for the rows as stored, read in
// place; MXFP4 (interleaved only) its nibbles looked up in the biased table (tiles_int.h).
template <DType kType>
constexpr int64_t kRowLaneBlk = kType == DType::Q4_0   ? int64_t(sizeof(BlockQ4_0))
                                : kType == DType::Q8_0 ? int64_t(sizeof(BlockQ8_0))
                                                       : int64_t(sizeof(BlockMXFP4));
template <DType kType>
constexpr int64_t kInterleavedBlk = 16 * kRowLaneBlk<kType>;
// The 16 rows' MXFP4 scales 2^(e - 128) from their E8M0 bytes at blk, by vscalefps: 2^-64 *
// 2^(e - 64), exact for every e (a denormal result for e < 2 only, as the reference's). Not
// 2^-128 * 2^e: a denormal operand in every block costs Intel cores a microcode assist per
// instruction (MXCSR's DAZ is off), which made the decode tile 3.6x slower than Q4_0's there
// (bench_matmul --sweep 22 on a Xeon: 4.9 against 17.7 GB/s); Zen runs both alike.
inline __m512 mxfp4_scales16(const uint8_t* blk) {
  const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
  return _mm512_scalef_ps(_mm512_set1_ps(0x1p-64f), _mm512_cvtepi32_ps(_mm512_sub_epi32(e, _mm512_set1_epi32(64))));
}

template <DType kType>
inline __m512 interleaved_unpack(const uint8_t* blk, __m512i (&w)[8]) {
  if constexpr (kType == DType::MXFP4) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), lut = _mm512_broadcast_i32x4(mxfp4_lut128());
    for (int k = 0; k < 4; ++k) {
      const __m512i d = load_piece(blk + 16 + 64 * k);
      w[k] = _mm512_shuffle_epi8(lut, _mm512_and_si512(d, m4));
      w[k + 4] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(d, 4), m4));
    }
    // 4 operations where the bit recipe of mxfp4_scales takes 6.
    return mxfp4_scales16(blk);
  } else if constexpr (kType == DType::Q4_0) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int k = 0; k < 4; ++k) {
      const __m512i d = load_piece(blk + 32 + 64 * k);
      w[k] = _mm512_and_si512(d, m4);
      w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(d, 4), m4);
    }
  } else {
    const __m512i flip = _mm512_set1_epi8(char(0x80));
    for (int k = 0; k < 8; ++k) w[k] = _mm512_xor_si512(load_piece(blk + 32 + 64 * k), flip);
  }
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
}

// MXFP4 interleaved, one token (decode): rowlane_tile's integer sums in 256-bit halves of the
// group (8 rows each; vpdpbusd on ymm), joined into one zmm for its float steps, so the same bits.
// A lone token shares no unpacked weights with others, and its lookups (2 vpshufb per 64 nibbles)
// make the tile's work per byte the largest of the 4-bit formats: Zen 4 runs a zmm operation
// as two 256-bit halves, and the halves save the zmm inserts and cross-lane moves. bench_matmul
// --sweep 22 (TinyLlama's decode weights, 2 threads, alternating sweeps): 78-85% of the plain sums'
// read rate with rowlane_tile's zmm unpack, 85-96% with this (Q4_0: 86-101%).
inline void rowlane_mxfp4_one(const GemmArgs& a, const RowsView& v, __mmask16 keep, const uint8_t* pf, int64_t t,
                              float* y, const uint8_t* group) {
  const int64_t nb = a.n_in / 32;
  const uint8_t* xrow = v.act + (t - v.t_begin) * v.stride;
  const __m256i m4 = _mm256_set1_epi8(0x0F), lut = _mm256_broadcastsi128_si256(mxfp4_lut128());
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * kInterleavedBlk<DType::MXFP4>;
    if (pf) prefetch_step<int(kInterleavedBlk<DType::MXFP4>)>(pf + b * kInterleavedBlk<DType::MXFP4>);
    const uint8_t* xq = xrow + 32 * b;
    const __m256i ns = _mm256_slli_epi32(_mm256_set1_epi32(reinterpret_cast<const int32_t*>(xrow + v.off_sum)[b]), 4);
    __m256i s[2] = {ns, ns};
    for (int k = 0; k < 4; ++k) {
      int32_t xl, xh;
      std::memcpy(&xl, xq + 4 * k, 4);
      std::memcpy(&xh, xq + 16 + 4 * k, 4);
      for (int h = 0; h < 2; ++h) {
        const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 64 * k + 32 * h));
        const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(d, m4));
        const __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(d, 4), m4));
        s[h] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(s[h], lo, _mm256_set1_epi32(xl)), hi, _mm256_set1_epi32(xh));
      }
    }
    const __m512i si = _mm512_inserti64x4(_mm512_castsi256_si512(s[0]), s[1], 1);
    const __m512 dw = mxfp4_scales16(blk);
    const float dx = reinterpret_cast<const float*>(xrow + v.off_d)[b];
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), _mm512_mul_ps(_mm512_set1_ps(dx), dw), acc);
  }
  _mm512_mask_storeu_ps(y, keep, acc);
}

// The 16 rows at rows[] x TC tokens of the Rows view from token t, into y for the rows (lanes)
// set in `keep`. With `group` (rows interleaved by 16), the 16 rows are that group, read in
// place of rows[] (MXFP4: always).
template <DType kType, int TC>
void rowlane_tile(const GemmArgs& a, const RowsView& v, const uint8_t* const* rows, __mmask16 keep,
                  const uint8_t* pf, int64_t t, float* y, const uint8_t* group = nullptr) {
  if constexpr (kType == DType::MXFP4 && TC == 1) return rowlane_mxfp4_one(a, v, keep, pf, t, y, group);
  constexpr int64_t kBlk = kRowLaneBlk<kType>;
  // the weights' offset through nsum (Q4_0: 8 nsum, Q8_0: 128 nsum, MXFP4: 16 nsum), as a shift
  constexpr int kNsumShift = kType == DType::Q4_0 ? 3 : kType == DType::Q8_0 ? 7 : 4;
  const int64_t nb = a.n_in / 32;
  const uint8_t* xrow[TC];
  for (int i = 0; i < TC; ++i) xrow[i] = v.act + (t + i - v.t_begin) * v.stride;
  __m512 acc[TC];
  for (int i = 0; i < TC; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    if (pf) prefetch_step<kRowLanes * int(kBlk)>(pf + b * kRowLanes * kBlk);
    __m512i w[8];
    __m512 dw;
    if constexpr (kType == DType::MXFP4) {  // interleaved only
      dw = interleaved_unpack<kType>(group + b * kInterleavedBlk<kType>, w);
    } else if (group) {
      dw = interleaved_unpack<kType>(group + b * kInterleavedBlk<kType>, w);
    } else {
      rowlane_unpack<kType == DType::Q4_0>(rows, b * kBlk, w);
      dw = rows_f16(rows, b * kBlk);  // the blocks' f16 scales
    }
#pragma GCC unroll 16
    for (int i = 0; i < TC; ++i) {
      const uint8_t* xq = xrow[i] + 32 * b;
      // 8 * nsum, 128 * nsum or 16 * nsum: a broadcast load and a shift (a broadcast from a
      // general-purpose register costs two vector operations on Zen 4)
      const __m512i ns = _mm512_set1_epi32(reinterpret_cast<const int32_t*>(xrow[i] + v.off_sum)[b]);
      const __m512i s = dot_block32(_mm512_slli_epi32(ns, kNsumShift), w, xq);
      const float dx = reinterpret_cast<const float*>(xrow[i] + v.off_d)[b];
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(_mm512_set1_ps(dx), dw), acc[i]);
    }
  }
  for (int i = 0; i < TC; ++i) _mm512_mask_storeu_ps(y + i * a.ldy, keep, acc[i]);
}

template <DType kType, int TC = kRowLanes>
void rowlane_tokens(const GemmArgs& a, const RowsView& v, const uint8_t* const* rows, __mmask16 keep,
                    const uint8_t* pf, int64_t t, int64_t n, float* y, const uint8_t* group = nullptr) {
  if constexpr (TC > 1) {
    if (n < TC) return rowlane_tokens<kType, TC - 1>(a, v, rows, keep, pf, t, n, y, group);
  }
  rowlane_tile<kType, TC>(a, v, rows, keep, pf, t, y, group);
}

// Rows [r0, r1) x all tokens of a Rows layout (Q4_0 / Q8_0).
template <DType kType>
void gemm_rowlanes_t(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  // Token blocks whose activations (~256 KB) stay in L2 while the chunk's rows pass over them.
  const int64_t tb = l2_token_block(v.stride, kRowLanes);
  const int64_t rb = a.row_bytes;
  for (int64_t t0 = v.t_begin; t0 < a.n_tokens; t0 += tb) {
    const int64_t t1 = t0 + tb < a.n_tokens ? t0 + tb : a.n_tokens;
    for (int64_t r = r0; r < r1; r += kRowLanes) {
      const int n_rows = r1 - r < kRowLanes ? int(r1 - r) : kRowLanes;
      const uint8_t* rows[kRowLanes];
      for (int i = 0; i < kRowLanes; ++i) rows[i] = a.w + (r + (i < n_rows ? i : n_rows - 1)) * rb;
      // Prefetch the tile kPrefetchTiles on while the first token chunk streams this one.
      const uint8_t* pf = a.w + (r + kPrefetchTiles * kRowLanes) * rb;
      for (int64_t t = t0; t < t1; t += kRowLanes) {
        const int64_t n = t1 - t < kRowLanes ? t1 - t : kRowLanes;
        rowlane_tokens<kType>(a, v, rows, __mmask16((1u << n_rows) - 1u), t == t0 ? pf : nullptr, t, n,
                              a.y + t * a.ldy + r);
      }
    }
  }
}

// Q4_0 / Q8_0 / MXFP4 interleaved by 16 rows, every batch size: the row-lane tiles reading each
// block of 16 rows in place (4 or 8 vector loads and one of scales instead of 16 or 32 row loads,
// 12 or 24 inserts and 8 or 16 unpacks). Q4_0 / Q8_0: the same operations on the same values, so
// the same bits as the row-lane tiles on the rows as stored; a lone token too (the stored rows'
// wide GEMV tiles differ there). MXFP4: the float steps of AVX2's interleaved tiles
// (matmul_avx2.cpp), so the same bits. Rows [r0, r1) may start and end inside a group: its other
// rows are computed, not stored.
template <DType kType>
void gemm_interleaved_t(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  for_each_interleaved_tile<kRowLanes>(
      a, v, r0, r1, a.n_in / 32 * kInterleavedBlk<kType>,
      [&](const uint8_t* group, int64_t t, int64_t n, int lo, int hi, const uint8_t* pf, float* y) {
        rowlane_tokens<kType>(a, v, nullptr, __mmask16(rows_mask(lo, hi)), pf, t, n, y, group);
      });
}


}  // namespace

void gemm_rowlanes_q4_0(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  gemm_rowlanes_t<DType::Q4_0>(a, v, r0, r1);
}
void gemm_rowlanes_q8_0(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  gemm_rowlanes_t<DType::Q8_0>(a, v, r0, r1);
}

// The interleaved types this file's tiles read; the others' are in rowlanes_kquant_avx512.cpp.
void gemm_interleaved(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  using Gemm = void (*)(const GemmArgs&, const RowsView&, int64_t, int64_t);
  static constexpr struct {
    DType type;
    Gemm gemm;
  } kTiles[] = {{DType::Q4_0, gemm_interleaved_t<DType::Q4_0>},
                {DType::Q8_0, gemm_interleaved_t<DType::Q8_0>},
                {DType::MXFP4, gemm_interleaved_t<DType::MXFP4>}};
  for (const auto& t : kTiles)
    if (t.type == a.type) return t.gemm(a, v, r0, r1);
  gemm_interleaved_kquant(a, v, r0, r1);
}

}  // namespace tern::kern::avx512
