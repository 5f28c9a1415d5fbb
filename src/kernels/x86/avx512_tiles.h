#pragma once
// What the AVX-512 kernel table (matmul_avx512.cpp) and its tile families share: the families'
// entry points, the token-lane activation layouts, and a few helpers. One translation unit per
// family:
//   lanes_avx512.cpp     token-lane GEMM with prep: Q3_K / Q4_K / Q6_K batches and prefill; also
//                        the quantizer of both token-lane layouts
//   fused_avx512.cpp     token-lane tiles without prep: Q4_0 / Q8_0 / Q5_0 batches and prefill
//   wide_avx512.cpp      wide classic tiles: Q4_0 / Q8_0 decode, MXFP4 at any batch
//   rowlanes_avx512.cpp  row-lane tiles (Q4_0 / Q8_0 small batches, a batch's last tokens) and
//                        the tiles of Q4_0 / Q8_0 / MXFP4 weights interleaved by 16 rows
//   rowlanes_kquant_avx512.cpp  the interleaved tiles of the other types (Q4_1, Q5_0, Q5_1,
//                        Q2_K..Q5_K, TQ1_0, TQ2_0)
// The classic tiles (tiles_int.h) and the float ones (tiles_float.h) are compiled in the table's
// file, which also holds the choice among all of them and its thresholds.
//
// The entry points are ordinary functions with external linkage and names unique to this
// namespace (tern::kern::avx512), each defined in its family's file and called only from AVX-512
// code. Everything else here is in an unnamed namespace, as in tiles_int.h, so each translation
// unit has its own copy. Include only from *_avx512.cpp.
#include <cstdint>

#include "kernels/kernel_iface.h"
#include "kernels/x86/tiles_int_k.h"

namespace tern::kern::avx512 {
namespace {

// The classic tiles' dot products (tiles_int.h) with VNNI on 256-bit vectors.
struct OpsAvx512 {
  static constexpr int kMaxTokens = 4;
  static __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
  static __m256i dot_s16(__m256i acc, __m256i a, __m256i b) { return _mm256_dpwssd_epi32(acc, a, b); }
};

// --- token-lane layouts (Q8_0Lanes, Q8_KLanes; kernels/kernel_iface.h) ----------------------
//
// With 16 tokens in the 16 int32 lanes of a zmm register, one vpdpbusd multiplies 4 weight
// bytes (broadcast) by 4 activation bytes of each of 16 tokens. A block's 32
// products per token then need 8 vpdpbusd, and its scale is applied once per block for all 16
// tokens (one cvt + one FMA), where the classic tiles spend a cvt, a multiply and an FMA per
// (row, token, block). Activations are quantized exactly as in the Rows layouts, then stored
// interleaved by token group:
//
//   Q8_0Lanes, per group of 16 tokens, per 32-element block b (kLaneBlockQ8_0 bytes):
//     xq   [8 k][16 t][4]  int8: x of elements 4k..4k+3 of token t (vpdpbusd's signed side)
//     d    [16 t]          f32
//     nsum [16 t]          int32: -sum(x) of the block (the weights' offset term, see fused_q32 in
//                          fused_avx512.cpp)
//   Q8_KLanes, per group, per 256-element super-block (kLaneBlockQ8_K bytes):
//     xq  [64 k][16 t][4] u8 (x + 128)
//     d   [16 t]          f32
//     s32 [4 p][16 t][2]  int16: sums of x over 32-element sub-blocks 2p, 2p+1 (Q4_K mins)
//     s16 [8 p][16 t][2]  int16: sums of x over 16-element sub-blocks 2p, 2p+1 (Q6_K offset)
//
// K-quants: lanes_avx512.cpp; Q4_0 / Q8_0 / Q5_0: fused_avx512.cpp.
constexpr int kLanes = 16;
constexpr int64_t kLaneBlockQ8_0 = 8 * 64 + 64 + 64;
constexpr int64_t kLaneOffNsum = 8 * 64 + 64;
constexpr int64_t kLaneOffS32 = 64 * 64 + 64;
constexpr int64_t kLaneOffS16 = kLaneOffS32 + 4 * 64;
constexpr int64_t kLaneBlockQ8_K = kLaneOffS16 + 8 * 64;

// Rows per tile of the token-lane GEMM with prep (gemm_lanes); its scratch holds that many
// prepared rows.
constexpr int kLanesRows = 4;

// Rows per fused tile: 8, then 4, then single rows at a chunk's end. 8 rows share each block's
// activation loads twice as widely as 4 (measured 5-12% faster at 8 and 16 tokens). A row's
// result does not depend on its tile: every row runs the same operations.
constexpr int kFusedRows = 8;

inline int64_t round_up64(int64_t v) { return (v + 63) / 64 * 64; }

// The f16 scales of the R blocks (R = 4 or 8) at blk0 + r * rb, as f32. Packed in general-
// purpose registers (idle scalar ALUs) rather than by vpinsrw, which competes for the vector
// pipes. For the wide tiles (wide_avx512.cpp) and the fused ones' fused_scales.
template <int R>
inline __m256 wide_scales(const uint8_t* blk0, int64_t rb) {
  const auto d = [&](int r) { return uint64_t(*reinterpret_cast<const uint16_t*>(blk0 + r * rb)); };
  __m128i h = _mm_cvtsi64_si128(int64_t(d(0) | d(1) << 16 | d(2) << 32 | d(3) << 48));
  if constexpr (R == 8) h = _mm_insert_epi64(h, int64_t(d(4) | d(5) << 16 | d(6) << 32 | d(7) << 48), 1);
  return _mm256_cvtph_ps(h);
}

// A 64-byte piece as two 32-byte loads: streaming from DRAM, Zen 4 reads 256-bit loads faster
// than 512-bit ones. bench_matmul --sweep (TinyLlama's decode weights, 1 GB of Q8_0, 2 threads,
// alternating sweeps): a loop of 64-byte loads alone 36.7 GB/s against 43.6 for 32-byte loads
// and 44.4 for plain 8-byte sums; this Q8_0 tile 30.3 -> 32.0 and 32.0 -> 33.6 GB/s in slow
// minutes (medians of 63-70 sweeps), 40.7 -> 42.8 best; Q4_0 (half the loads) level.
// GCC keeps the pair as a load and a vinserti64x4 from memory.
inline __m512i load_piece(const uint8_t* p) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// The 16 bytes at rows[i] + off of 16 rows, transposed: lane i of d[k] = bytes 4k..4k+3 of row i
// (16 loads, 12 inserts, 8 unpacks). For the row-lane tiles of rows as stored.
inline void transpose_rows16(const uint8_t* const* rows, int64_t off, __m512i* d) {
  const auto ld = [&](int i) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i] + off)); };
  // 4x4 dword transposes within 128-bit lanes: lane L of A_j holds row 4L + j, so that after
  // them lane 4L + j of every output vector is row 4L + j.
  __m512i A[4];
  for (int j = 0; j < 4; ++j) {
    __m512i v = _mm512_castsi128_si512(ld(j));
    v = _mm512_inserti32x4(v, ld(j + 4), 1);
    v = _mm512_inserti32x4(v, ld(j + 8), 2);
    A[j] = _mm512_inserti32x4(v, ld(j + 12), 3);
  }
  const __m512i t0 = _mm512_unpacklo_epi32(A[0], A[1]), t1 = _mm512_unpackhi_epi32(A[0], A[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(A[2], A[3]), t3 = _mm512_unpackhi_epi32(A[2], A[3]);
  d[0] = _mm512_unpacklo_epi64(t0, t2);
  d[1] = _mm512_unpackhi_epi64(t0, t2);
  d[2] = _mm512_unpacklo_epi64(t1, t3);
  d[3] = _mm512_unpackhi_epi64(t1, t3);
}

// s plus the 32 products of a row-lane block (w[k] lane i: row i's unsigned weights 4k..4k+3)
// with one token's 32 signed activation bytes at xq, each 4 broadcast: 8 vpdpbusd as two chains
// of 4 joined by an add (the same integer sum: one chain of 8 per token left too few independent
// operations in flight to keep the dot unit busy; Q4_0 16-token GEMM 645 -> 705 GFLOP/s).
inline __m512i dot_block32(__m512i s, const __m512i* w, const void* xq) {
  const auto* x = static_cast<const uint8_t*>(xq);
  __m512i s_hi = _mm512_setzero_si512();
  for (int k = 0; k < 4; ++k) {
    int32_t xl, xh;
    std::memcpy(&xl, x + 4 * k, 4);
    std::memcpy(&xh, x + 16 + 4 * k, 4);
    s = _mm512_dpbusd_epi32(s, w[k], _mm512_set1_epi32(xl));
    s_hi = _mm512_dpbusd_epi32(s_hi, w[k + 4], _mm512_set1_epi32(xh));
  }
  return _mm512_add_epi32(s, s_hi);
}

// The f16 values at rows[i] + off of 16 rows, as f32 (packed in general-purpose registers, as
// wide_scales does): the row-lane tiles' scales. Always inlined: a call inside a tile makes
// the caller spill its accumulators (every zmm register is caller-saved), which cost the TQ
// tiles ~7% of a prompt's rate when GCC left this out of line.
__attribute__((always_inline)) inline __m512 rows_f16(const uint8_t* const* rows, int64_t off) {
  uint64_t q[4] = {0, 0, 0, 0};  // rows 4j..4j+3 in q[j]
  for (int i = 0; i < 16; ++i) {
    uint16_t v;
    std::memcpy(&v, rows[i] + off, 2);
    q[i / 4] |= uint64_t(v) << (16 * (i % 4));
  }
  const __m128i lo = _mm_insert_epi64(_mm_cvtsi64_si128(int64_t(q[0])), int64_t(q[1]), 1);
  const __m128i hi = _mm_insert_epi64(_mm_cvtsi64_si128(int64_t(q[2])), int64_t(q[3]), 1);
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

}  // namespace

// --- the families' entry points -------------------------------------------------------------
// Each computes output rows [r0, r1) (y[t][r] for its tokens t).

// lanes_avx512.cpp. Tokens [t0, t1) of x (ldx floats apart) quantized into a token-lane layout
// (Q8_0Lanes or Q8_KLanes), the tokens from lay.lane_tokens on into its Rows tail.
void quantize_lanes(const ActLayout& lay, const float* x, int64_t ldx, int64_t n_in,
                    int64_t t0, int64_t t1, uint8_t* act);
// The bytes of one prepared row of n_in elements; gemm_lanes' scratch holds kLanesRows of them.
int64_t lanes_prep_row_bytes(int64_t n_in);
// Q3_K / Q4_K / Q6_K x the tokens of a Q8_KLanes layout's groups.
void gemm_lanes(const GemmArgs& a, int64_t r0, int64_t r1, uint8_t* scratch);

// fused_avx512.cpp. Q4_0 / Q8_0 / Q5_0 x the tokens of a Q8_0Lanes layout's groups; scratch as
// avx512_scratch_bytes (matmul_avx512.cpp) gives it.
void gemm_fused(const GemmArgs& a, int64_t r0, int64_t r1, uint8_t* scratch);

// wide_avx512.cpp. Q4_0 / Q8_0 / MXFP4 x the tokens of the Rows view v.
void gemm_wide(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1);

// rowlanes_avx512.cpp. Q4_0 / Q8_0 rows as stored x the tokens of v, in the row-lane tiles.
void gemm_rowlanes_q4_0(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1);
void gemm_rowlanes_q8_0(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1);
// Weights interleaved by 16 rows (kernels/matmul.h: Q4_0, Q8_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K,
// Q4_K, Q5_K, MXFP4, TQ1_0, TQ2_0) x the tokens of v. Each file's tiles are a table by type.
void gemm_interleaved(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1);
// rowlanes_kquant_avx512.cpp: the interleaved types with block layouts of their own (Q4_1, Q5_0,
// Q5_1, Q2_K..Q5_K, TQ1_0, TQ2_0); gemm_interleaved passes them on.
void gemm_interleaved_kquant(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1);

}  // namespace tern::kern::avx512
