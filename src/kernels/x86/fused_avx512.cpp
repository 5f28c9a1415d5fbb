// AVX-512 token-lane tiles without prep for Q4_0 / Q8_0, and Q5_0 rebuilt as Q8_0
// (avx512_tiles.h): the weight blocks as stored against 16-token groups of Q8_0Lanes
// activations, for batches and prefill.
//
// A prep as for the K-quants (a store and reload of every weight, a horizontal sum per block
// for the -128 * sum(w) offset) is amortised over too few tokens in decode batches: at 16
// tokens it cost about as much as the dot products. These tiles read the weight blocks as
// stored. Each 4-byte group of weights is broadcast from memory and made the unsigned side of
// vpdpbusd by one AND / XOR (Q4_0: low nibbles 0..15, high nibbles as 16 * (0..15), undone by a
// shift of their exact sum; Q8_0: w + 128). The activations are the signed side, and the
// offsets depend on the token only, -8 * sum(x) or -128 * sum(x), both from the layout's nsum:
// no per-row weight sums. Measured on 2 threads (2048 x 5632, in cache) against the prep
// version: 8 tokens 200 -> 380-395 GFLOP/s, 16 tokens 390 -> 575, 32 tokens 475 -> 585, and
// no slower at 128 or 512.
#include "kernels/x86/avx512_tiles.h"

namespace tern::kern::avx512 {
namespace {

// V is the vector: 16 token lanes in a zmm (Q4_0 / Q8_0 lay out full 16-token groups only).
struct Vec512 {
  using I = __m512i;
  using F = __m512;
  static constexpr int kN = 16;
  static I load(const uint8_t* p) { return _mm512_load_si512(p); }
  static F loadf(const uint8_t* p) { return _mm512_load_ps(p); }
  static I set1(int32_t v) { return _mm512_set1_epi32(v); }
  static I bcast(const uint8_t* p) {  // a broadcast load (or an operand's embedded broadcast)
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
  }
  static I zero() { return _mm512_setzero_si512(); }
  static I and_(I a, I b) { return _mm512_and_si512(a, b); }
  static I xor_(I a, I b) { return _mm512_xor_si512(a, b); }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static I sra4(I a) { return _mm512_srai_epi32(a, 4); }
  static I sll3(I a) { return _mm512_slli_epi32(a, 3); }
  static I sll7(I a) { return _mm512_slli_epi32(a, 7); }
  static I dot(I acc, I u, I s) { return _mm512_dpbusd_epi32(acc, u, s); }
  static F zerof() { return _mm512_setzero_ps(); }
  static F set1f(float v) { return _mm512_set1_ps(v); }
  static F fma(I s, F sc, F acc) { return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sc, acc); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static void storef(float* p, F v) { _mm512_store_ps(p, v); }
};

template <int R>
constexpr int64_t fused_dw_stride() { return R > 4 ? 8 : 4; }

// The f16 scales of rows [r, r+R) as f32, dw[S b + i] for row r+i and block b (S =
// fused_dw_stride): converted once per tile, not per token group, and read back as the
// broadcast operand of a vmulps. Converted per block inside the tile, the scales had to be
// spread to the rows by shuffles, which competed with the dot products.
template <int R, bool kQ4>
void fused_scales(const GemmArgs& a, int64_t r, float* dw) {
  constexpr int64_t S = fused_dw_stride<R>();
  constexpr int64_t kBlk = kQ4 ? int64_t(sizeof(BlockQ4_0)) : int64_t(sizeof(BlockQ8_0));
  const int64_t nb = a.n_in / 32, rb = a.row_bytes;
  const uint8_t* w = a.w + r * rb;
  for (int64_t b = 0; b < nb; ++b) {
    if constexpr (R == 8) {
      _mm256_store_ps(dw + S * b, wide_scales<8>(w + b * kBlk, rb));
    } else if constexpr (R == 4) {
      _mm_store_ps(dw + S * b, _mm256_castps256_ps128(wide_scales<4>(w + b * kBlk, rb)));
    } else {
      for (int i = 0; i < R; ++i) dw[S * b + i] = f16_to_f32(*reinterpret_cast<const uint16_t*>(w + i * rb + b * kBlk));
    }
  }
}

// R rows (1..8) from row r x one token group, written to y for the group's n_valid tokens;
// dw from fused_scales.
template <class V, int R, bool kQ4>
void fused_q32(const GemmArgs& a, const uint8_t* grp, int64_t g, int64_t n_valid, int64_t r, const float* dw) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr int64_t kBlk = kQ4 ? int64_t(sizeof(BlockQ4_0)) : int64_t(sizeof(BlockQ8_0));
  const int64_t nb = a.n_in / 32, rb = a.row_bytes;
  const uint8_t* w = a.w + r * rb;
  const I flip = V::set1(int32_t(0x80808080u));
  const I m_lo = V::set1(0x0F0F0F0F), m_hi = V::set1(int32_t(0xF0F0F0F0u));
  F acc[R];
  for (int rr = 0; rr < R; ++rr) acc[rr] = V::zerof();
  const uint8_t* pf = w + kPrefetchTiles * R * rb;  // as the classic tiles (tiles_int.h)
  for (int64_t b = 0; b < nb; ++b) {
    prefetch_step<R * int(kBlk)>(pf + b * R * kBlk);
    const uint8_t* xb = grp + b * kLaneBlockQ8_0;
    I xs[8];
    for (int k = 0; k < 8; ++k) xs[k] = V::load(xb + 64 * k);
    const F dx = V::loadf(xb + 8 * 64);
    const I nsum = V::load(xb + kLaneOffNsum);
    const I off = kQ4 ? V::sll3(nsum) : V::sll7(nsum);
    const uint8_t* blk = w + b * kBlk;
    // Unrolled so that acc[] stays in registers (GCC otherwise keeps it on the stack for R = 8).
#pragma GCC unroll 8
    for (int rr = 0; rr < R; ++rr) {
      const uint8_t* q = blk + rr * rb + 2;
      I s;
      if constexpr (kQ4) {
        // raw dword j: low nibbles are elements 4j..4j+3 (xs[j]), high ones 16+4j.. (xs[j+4])
        I lo = off, hi = V::zero();
        for (int j = 0; j < 4; ++j) {
          const I v = V::bcast(q + 4 * j);
          lo = V::dot(lo, V::and_(v, m_lo), xs[j]);
          hi = V::dot(hi, V::and_(v, m_hi), xs[j + 4]);
        }
        s = V::add(lo, V::sra4(hi));  // hi is 16 * the high nibbles' dot, exactly
      } else {
        I a0 = off, a1 = V::zero();  // two chains so that vpdpbusd's latency overlaps
        for (int j = 0; j < 8; j += 2) {
          a0 = V::dot(a0, V::xor_(V::bcast(q + 4 * j), flip), xs[j]);
          a1 = V::dot(a1, V::xor_(V::bcast(q + 4 * j + 4), flip), xs[j + 1]);
        }
        s = V::add(a0, a1);
      }
      acc[rr] = V::fma(s, V::mul(dx, V::set1f(dw[fused_dw_stride<R>() * b + rr])), acc[rr]);
    }
  }
  alignas(64) float tmp[V::kN];
  for (int rr = 0; rr < R; ++rr) {
    V::storef(tmp, acc[rr]);
    for (int64_t l = 0; l < n_valid; ++l) a.y[(g * kLanes + l) * a.ldy + r + rr] = tmp[l];
  }
}

// Token groups [g0, g1) for rows [r, r+R); dw: scratch for fused_scales.
template <int R, bool kQ4>
void fused_rows(const GemmArgs& a, int64_t r, int64_t g0, int64_t g1, float* dw) {
  fused_scales<R, kQ4>(a, r, dw);
  const int64_t n_lane = a.act_layout.lane_tokens;
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* grp = a.act + g * a.act_layout.stride;
    const int64_t n_valid = n_lane - g * kLanes < kLanes ? n_lane - g * kLanes : kLanes;
    fused_q32<Vec512, R, kQ4>(a, grp, g, n_valid, r, dw);
  }
}

// Rows [r0, r1) x the token groups in blocks: rows.template operator()<R>(r, g0, g1) for tiles
// of kFusedRows, then 4, then single rows.
template <class RowsFn>
void fused_blocks(const GemmArgs& a, int64_t r0, int64_t r1, RowsFn&& rows) {
  const int64_t n_groups = (a.act_layout.lane_tokens + kLanes - 1) / kLanes;
  // Groups per block: ~512 KB of activations stay in L2 while the chunk's rows pass over them.
  int64_t gpb = (512 << 10) / a.act_layout.stride;
  gpb = gpb < 1 ? 1 : gpb;
  for (int64_t g0 = 0; g0 < n_groups; g0 += gpb) {
    const int64_t g1 = g0 + gpb < n_groups ? g0 + gpb : n_groups;
    int64_t r = r0;
    for (; r + kFusedRows <= r1; r += kFusedRows) rows.template operator()<kFusedRows>(r, g0, g1);
    for (; r + 4 <= r1; r += 4) rows.template operator()<4>(r, g0, g1);
    for (; r < r1; ++r) rows.template operator()<1>(r, g0, g1);
  }
}

template <bool kQ4>
void gemm_fused_t(const GemmArgs& a, int64_t r0, int64_t r1, float* dw) {
  fused_blocks(a, r0, r1, [&]<int R>(int64_t r, int64_t g0, int64_t g1) { fused_rows<R, kQ4>(a, r, g0, g1, dw); });
}

// Q5_0 in the token-lane tiles: each tile's rows are rebuilt as Q8_0 blocks (q - 16 in int8,
// the same f16 d: the same values) in the thread's scratch, once per block of token groups, and
// the Q8_0 tile runs on them, so the integer sums and float steps are those of Q8_0 weights
// holding those values. A prompt's hundreds of tokens share each rebuilt row; the fifth bits cost
// a vpshufb, a compare and two logic operations per block and row, instead of per block, row and
// token tile in the classic tiles (pp128 of a 1.1B Q5_0 model: 84 tok/s there).
inline void q5_0_rows_as_q8_0(const uint8_t* w, int64_t rb, int rows, int64_t nb, uint8_t* dst) {
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const __m256i sixteen = _mm256_set1_epi8(16);
  for (int r = 0; r < rows; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      const auto* src = reinterpret_cast<const BlockQ5_0*>(w + r * rb) + b;
      uint8_t* out = dst + (r * nb + b) * int64_t(sizeof(BlockQ8_0));
      std::memcpy(out, &src->d, 2);
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src->qs));
      const __m256i q = _mm256_or_si256(_mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4)),
                                        q5_high_bytes(src->qh));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2), _mm256_sub_epi8(q, sixteen));
    }
}

template <int R>
void fused_rows_q5_0(const GemmArgs& a, int64_t r, int64_t g0, int64_t g1, float* dw, uint8_t* rows8) {
  const int64_t nb = a.n_in / 32;
  q5_0_rows_as_q8_0(a.w + r * a.row_bytes, a.row_bytes, R, nb, rows8);
  GemmArgs a8 = a;
  a8.type = DType::Q8_0;
  a8.w = rows8;
  a8.row_bytes = nb * int64_t(sizeof(BlockQ8_0));
  a8.y = a.y + r;  // row 0 of the rebuilt rows is row r of y
  fused_rows<R, false>(a8, 0, g0, g1, dw);
}

void gemm_fused_q5_0(const GemmArgs& a, int64_t r0, int64_t r1, float* dw, uint8_t* rows8) {
  fused_blocks(a, r0, r1,
               [&]<int R>(int64_t r, int64_t g0, int64_t g1) { fused_rows_q5_0<R>(a, r, g0, g1, dw, rows8); });
}

}  // namespace

// scratch holds the kFusedRows * n_in / 32 floats of fused_scales (then, for Q5_0, its
// kFusedRows rows rebuilt as Q8_0).
void gemm_fused(const GemmArgs& a, int64_t r0, int64_t r1, uint8_t* scratch) {
  float* dw = reinterpret_cast<float*>(scratch);
  if (a.type == DType::Q4_0) gemm_fused_t<true>(a, r0, r1, dw);
  else if (a.type == DType::Q5_0) gemm_fused_q5_0(a, r0, r1, dw, scratch + round_up64(int64_t(sizeof(float)) * kFusedRows * (a.n_in / 32)));
  else gemm_fused_t<false>(a, r0, r1, dw);
}

}  // namespace tern::kern::avx512
