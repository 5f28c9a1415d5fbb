// AVX-512 token-lane GEMM with prep (avx512_tiles.h): Q3_K / Q4_K / Q6_K weights against
// 16-token groups of Q8_KLanes activations, for batches and prefill; and quantize_lanes, which
// writes both token-lane layouts (Q8_KLanes here, Q8_0Lanes for fused_avx512.cpp).
//
// K-quants: the +128 makes x unsigned; it is undone per (row, block) with the weights' sum:
//   sum (x + 128) w = sum x w + 128 sum w, so each block's accumulator starts at -128 sum w.
// Their weights are the signed (broadcast) operand, unpacked once per 4-row tile into the
// thread's scratch ("prep") and reused by every token group. Q4_0 / Q8_0 need no prep: see
// fused_avx512.cpp.
#include "kernels/x86/act_quant.h"
#include "kernels/x86/avx512_tiles.h"

namespace tern::kern::avx512 {
namespace {

// Stores the 8 dwords of v (4 bytes of elements 4k..4k+3) at dst + 64 k, each byte xor-ed with
// flip (0x80: x + 128, for the K-quants; 0: x as is, for Q8_0Lanes).
inline void store_lane_dwords(uint8_t* dst, __m256i v, char flip) {
  alignas(32) uint32_t u[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(u), _mm256_xor_si256(v, _mm256_set1_epi8(flip)));
  for (int k = 0; k < 8; ++k) std::memcpy(dst + 64 * k, &u[k], 4);
}

}  // namespace

void quantize_lanes(const ActLayout& lay, const float* x, int64_t ldx, int64_t n_in,
                    int64_t t0, int64_t t1, uint8_t* act) {
  const bool k_quant = lay.kind == ActKind::Q8_KLanes;
  const int64_t bs = k_quant ? kQK_K : 32;
  const int64_t blk_bytes = k_quant ? kLaneBlockQ8_K : kLaneBlockQ8_0;
  const int64_t nb = n_in / bs;
  const int64_t n_tokens = lay.lane_tokens;
  if (t1 > n_tokens) {  // the tail, in the Rows layout
    const int64_t tt0 = t0 > n_tokens ? t0 : n_tokens;
    ActLayout rows = lay;
    rows.kind = k_quant ? ActKind::Q8_KRows : ActKind::Q8_0Rows;
    rows.stride = lay.tail_stride;
    quantize_rows(rows, x + tt0 * ldx, ldx, n_in, 0, t1 - tt0,
                  act + lay.tail_offset + (tt0 - n_tokens) * lay.tail_stride);
    t1 = n_tokens;
  }
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * ldx;
    uint8_t* grp = act + (t / kLanes) * lay.stride;
    const int64_t lane = t % kLanes;
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = grp + b * blk_bytes;
      float d;
      if (!k_quant) {
        __m256i q;
        int32_t nsum;
        d = q8_0_block(xt + 32 * b, &q, &nsum);
        store_lane_dwords(blk + 4 * lane, q, 0);
        std::memcpy(blk + 8 * 64 + 4 * lane, &d, 4);
        std::memcpy(blk + kLaneOffNsum + 4 * lane, &nsum, 4);
        continue;
      }
      alignas(32) int8_t qs[kQK_K];
      int16_t bsums[16];
      d = q8_k_block(xt + kQK_K * b, qs, bsums);
      for (int c = 0; c < 8; ++c)
        store_lane_dwords(blk + 512 * c + 4 * lane, _mm256_load_si256(reinterpret_cast<const __m256i*>(qs + 32 * c)), char(0x80));
      std::memcpy(blk + 64 * 64 + 4 * lane, &d, 4);
      for (int p = 0; p < 4; ++p) {
        const int16_t pair[2] = {int16_t(bsums[4 * p] + bsums[4 * p + 1]), int16_t(bsums[4 * p + 2] + bsums[4 * p + 3])};
        std::memcpy(blk + kLaneOffS32 + 64 * p + 4 * lane, pair, 4);
      }
      for (int p = 0; p < 8; ++p) std::memcpy(blk + kLaneOffS16 + 64 * p + 4 * lane, &bsums[2 * p], 4);
    }
  }
  // Padding lanes of the last group: x = 0 (stored as 128 for the K-quants), d = 0, sums 0.
  const int64_t padded = (n_tokens + kLanes - 1) / kLanes * kLanes;
  if (t0 < n_tokens && t1 == n_tokens && padded > n_tokens) {
    uint8_t* grp = act + (n_tokens / kLanes) * lay.stride;
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = grp + b * blk_bytes;
      const int n_k = k_quant ? 64 : 8;
      for (int64_t lane = n_tokens % kLanes; lane < kLanes; ++lane) {
        for (int k = 0; k < n_k; ++k) std::memset(blk + 64 * k + 4 * lane, k_quant ? 0x80 : 0, 4);
        std::memset(blk + 64 * n_k + 4 * lane, 0, 4);
        if (!k_quant) std::memset(blk + kLaneOffNsum + 4 * lane, 0, 4);
        if (k_quant)
          for (int p = 0; p < 12; ++p) std::memset(blk + kLaneOffS32 + 64 * p + 4 * lane, 0, 4);
      }
    }
  }
}

namespace {

inline int32_t hsum_epu8(__m256i v) {  // sum of 32 unsigned bytes
  const __m256i s = _mm256_sad_epu8(v, _mm256_setzero_si256());
  return int32_t(_mm256_extract_epi64(s, 0) + _mm256_extract_epi64(s, 1) +
                 _mm256_extract_epi64(s, 2) + _mm256_extract_epi64(s, 3));
}

// Prep of Q4_K / Q6_K rows, per super-block (kPrepK bytes):
//   q [256] int8 (unpacked quants, element order) | corr [16] int32 (-128 * sum of q per
//   sub-block: 8 for Q4_K, 16 for Q6_K) | sc [16] int32 | pair [8] int32 (two int16 for
//   vpdpwssd: Q4_K mins m_2p, m_2p+1; Q6_K scales sc_2p, sc_2p+1) | d, dmin f32
constexpr int64_t kPrepK = 256 + 64 + 64 + 32 + 64;
constexpr int64_t kPrepCorr = 256, kPrepSc = 320, kPrepPair = 384, kPrepD = 416;

void prep_q4_k(const uint8_t* wrow, int64_t nsb, uint8_t* prep, const uint8_t* pf) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const BlockQ4_K* blk = reinterpret_cast<const BlockQ4_K*>(wrow) + sb;
    prefetch_step<int(sizeof(BlockQ4_K))>(pf + sb * int64_t(sizeof(BlockQ4_K)));
    uint8_t* p = prep + sb * kPrepK;
    auto* corr = reinterpret_cast<int32_t*>(p + kPrepCorr);
    auto* sc = reinterpret_cast<int32_t*>(p + kPrepSc);
    auto* pair = reinterpret_cast<int32_t*>(p + kPrepPair);
    for (int g = 0; g < 4; ++g) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qs + 32 * g));
      const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      _mm256_store_si256(reinterpret_cast<__m256i*>(p + 64 * g), lo);
      _mm256_store_si256(reinterpret_cast<__m256i*>(p + 64 * g + 32), hi);
      corr[2 * g] = -128 * hsum_epu8(lo);
      corr[2 * g + 1] = -128 * hsum_epu8(hi);
    }
    alignas(16) uint8_t sm[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(sm), q4_k_scales_mins(blk->scales));
    for (int j = 0; j < 8; ++j) sc[j] = sm[j];
    for (int q = 0; q < 4; ++q) pair[q] = int32_t(uint32_t(sm[8 + 2 * q]) | uint32_t(sm[9 + 2 * q]) << 16);
    const float dd[2] = {f16_to_f32(blk->d), f16_to_f32(blk->dmin)};
    std::memcpy(p + kPrepD, dd, 8);
  }
}

void prep_q6_k(const uint8_t* wrow, int64_t nsb, uint8_t* prep, const uint8_t* pf) {
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const BlockQ6_K* blk = reinterpret_cast<const BlockQ6_K*>(wrow) + sb;
    prefetch_step<int(sizeof(BlockQ6_K))>(pf + sb * int64_t(sizeof(BlockQ6_K)));
    uint8_t* p = prep + sb * kPrepK;
    auto* corr = reinterpret_cast<int32_t*>(p + kPrepCorr);
    auto* sc = reinterpret_cast<int32_t*>(p + kPrepSc);
    auto* pair = reinterpret_cast<int32_t*>(p + kPrepPair);
    for (int h = 0; h < 2; ++h) {
      __m256i q[4];
      q6_k_quants(blk, h, q);
      for (int i = 0; i < 4; ++i) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(p + 128 * h + 32 * i), q[i]);
        // sums of 8 bytes per qword: qwords 0,1 = first 16 elements, 2,3 = next 16
        const __m256i s = _mm256_sad_epu8(q[i], _mm256_setzero_si256());
        const int j = 8 * h + 2 * i;
        corr[j] = -128 * int32_t(_mm256_extract_epi64(s, 0) + _mm256_extract_epi64(s, 1));
        corr[j + 1] = -128 * int32_t(_mm256_extract_epi64(s, 2) + _mm256_extract_epi64(s, 3));
      }
    }
    for (int j = 0; j < 16; ++j) sc[j] = blk->scales[j];
    for (int q = 0; q < 8; ++q)
      pair[q] = int32_t(uint32_t(uint16_t(int16_t(blk->scales[2 * q]))) |
                        uint32_t(uint16_t(int16_t(blk->scales[2 * q + 1]))) << 16);
    const float dd[2] = {f16_to_f32(blk->d), 0.0f};
    std::memcpy(p + kPrepD, dd, 8);
  }
}

// Q3_K in Q6_K's prep (and lanes_q6_k): the weights stored signed as q3 - 4 (-4..3, the values
// themselves), the scales as sc - 32, no offset term (pairs 0): lanes_q6_k's sum is then
// sum_j sc_j * (w . x)_j exactly.
void prep_q3_k(const uint8_t* wrow, int64_t nsb, uint8_t* prep, const uint8_t* pf) {
  const __m256i m3 = _mm256_set1_epi8(0x03), one = _mm256_set1_epi8(1), four = _mm256_set1_epi8(4);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const BlockQ3_K* blk = reinterpret_cast<const BlockQ3_K*>(wrow) + sb;
    prefetch_step<int(sizeof(BlockQ3_K))>(pf + sb * int64_t(sizeof(BlockQ3_K)));
    uint8_t* p = prep + sb * kPrepK;
    auto* corr = reinterpret_cast<int32_t*>(p + kPrepCorr);
    auto* sc = reinterpret_cast<int32_t*>(p + kPrepSc);
    auto* pair = reinterpret_cast<int32_t*>(p + kPrepPair);
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->hmask));
    for (int h = 0; h < 2; ++h) {
      const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qs + 32 * h));
      for (int i = 0; i < 4; ++i) {
        const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 2 * i), m3),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + i), one), 2));
        _mm256_store_si256(reinterpret_cast<__m256i*>(p + 128 * h + 32 * i), _mm256_sub_epi8(q3, four));
        // sums of 8 bytes per qword: qwords 0,1 = first 16 elements, 2,3 = next 16; w = q3 - 4
        const __m256i s = _mm256_sad_epu8(q3, _mm256_setzero_si256());
        const int j = 8 * h + 2 * i;
        corr[j] = -128 * (int32_t(_mm256_extract_epi64(s, 0) + _mm256_extract_epi64(s, 1)) - 4 * 16);
        corr[j + 1] = -128 * (int32_t(_mm256_extract_epi64(s, 2) + _mm256_extract_epi64(s, 3)) - 4 * 16);
      }
    }
    alignas(32) int16_t sc16[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sc16), q3_k_scales16(blk->scales));
    for (int j = 0; j < 16; ++j) sc[j] = sc16[j];
    for (int q = 0; q < 8; ++q) pair[q] = 0;
    const float dd[2] = {f16_to_f32(blk->d), 0.0f};
    std::memcpy(p + kPrepD, dd, 8);
  }
}

// Q4_K: per sub-block j (32 elements, 8 vpdpbusd) an int32 dot per token, times sc_j
// (vpmulld) into S; the mins term is 4 vpdpwssd of the sub-block sums against (m_2p, m_2p+1).
template <int R>
void lanes_q4_k(const uint8_t* const* prep, int64_t nsb, const uint8_t* grp, __m512* out) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* xb = grp + sb * kLaneBlockQ8_K;
    __m512i S[R], M[R];
    for (int r = 0; r < R; ++r) S[r] = M[r] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      __m512i xk[8];
      for (int k = 0; k < 8; ++k) xk[k] = _mm512_load_si512(xb + 64 * (8 * j + k));
      for (int r = 0; r < R; ++r) {
        const uint8_t* p = prep[r] + sb * kPrepK;
        const auto* w = reinterpret_cast<const int32_t*>(p + 32 * j);
        __m512i a0 = _mm512_set1_epi32(reinterpret_cast<const int32_t*>(p + kPrepCorr)[j]);
        __m512i a1 = _mm512_setzero_si512();
        for (int k = 0; k < 8; k += 2) {
          a0 = _mm512_dpbusd_epi32(a0, xk[k], _mm512_set1_epi32(w[k]));
          a1 = _mm512_dpbusd_epi32(a1, xk[k + 1], _mm512_set1_epi32(w[k + 1]));
        }
        const __m512i scj = _mm512_set1_epi32(reinterpret_cast<const int32_t*>(p + kPrepSc)[j]);
        S[r] = _mm512_add_epi32(S[r], _mm512_mullo_epi32(_mm512_add_epi32(a0, a1), scj));
      }
    }
    const __m512 dx = _mm512_load_ps(xb + 64 * 64);
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = prep[r] + sb * kPrepK;
      const auto* pair = reinterpret_cast<const int32_t*>(p + kPrepPair);
      for (int q = 0; q < 4; ++q)
        M[r] = _mm512_dpwssd_epi32(M[r], _mm512_load_si512(xb + kLaneOffS32 + 64 * q), _mm512_set1_epi32(pair[q]));
      const float* dd = reinterpret_cast<const float*>(p + kPrepD);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[r]), _mm512_mul_ps(dx, _mm512_set1_ps(dd[0])), acc[r]);
      acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M[r]), _mm512_mul_ps(dx, _mm512_set1_ps(dd[1])), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

// Q6_K: per 16-element sub-block 4 vpdpbusd times sc_j; the -32 offset is
// -32 * sum_j sc_j * sum16_j, 8 vpdpwssd against (sc_2p, sc_2p+1).
template <int R>
void lanes_q6_k(const uint8_t* const* prep, int64_t nsb, const uint8_t* grp, __m512* out) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* xb = grp + sb * kLaneBlockQ8_K;
    __m512i S[R];
    for (int r = 0; r < R; ++r) S[r] = _mm512_setzero_si512();
    for (int j2 = 0; j2 < 8; ++j2) {  // two sub-blocks of 16 per step
      __m512i xk[8];
      for (int k = 0; k < 8; ++k) xk[k] = _mm512_load_si512(xb + 64 * (8 * j2 + k));
      for (int r = 0; r < R; ++r) {
        const uint8_t* p = prep[r] + sb * kPrepK;
        const auto* w = reinterpret_cast<const int32_t*>(p + 32 * j2);
        const auto* corr = reinterpret_cast<const int32_t*>(p + kPrepCorr) + 2 * j2;
        const auto* sc = reinterpret_cast<const int32_t*>(p + kPrepSc) + 2 * j2;
        __m512i a0 = _mm512_set1_epi32(corr[0]), a1 = _mm512_set1_epi32(corr[1]);
        for (int k = 0; k < 4; ++k) {
          a0 = _mm512_dpbusd_epi32(a0, xk[k], _mm512_set1_epi32(w[k]));
          a1 = _mm512_dpbusd_epi32(a1, xk[k + 4], _mm512_set1_epi32(w[k + 4]));
        }
        S[r] = _mm512_add_epi32(S[r], _mm512_add_epi32(_mm512_mullo_epi32(a0, _mm512_set1_epi32(sc[0])),
                                                       _mm512_mullo_epi32(a1, _mm512_set1_epi32(sc[1]))));
      }
    }
    const __m512 dx = _mm512_load_ps(xb + 64 * 64);
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = prep[r] + sb * kPrepK;
      const auto* pair = reinterpret_cast<const int32_t*>(p + kPrepPair);
      __m512i M = _mm512_setzero_si512();
      for (int q = 0; q < 8; ++q)
        M = _mm512_dpwssd_epi32(M, _mm512_load_si512(xb + kLaneOffS16 + 64 * q), _mm512_set1_epi32(pair[q]));
      const __m512i total = _mm512_sub_epi32(S[r], _mm512_slli_epi32(M, 5));
      const float d = reinterpret_cast<const float*>(p + kPrepD)[0];
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_mul_ps(dx, _mm512_set1_ps(d)), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

template <int R>
void lanes_tile(const GemmArgs& a, const uint8_t* const* prep, const uint8_t* grp, int64_t g,
                int64_t r) {
  __m512 out[R];
  switch (a.type) {
    case DType::Q4_K: lanes_q4_k<R>(prep, a.n_in / kQK_K, grp, out); break;
    case DType::Q3_K:  // prepared as Q6_K (prep_q3_k)
    case DType::Q6_K: lanes_q6_k<R>(prep, a.n_in / kQK_K, grp, out); break;
    default: return;
  }
  const int64_t n_lane = a.act_layout.lane_tokens;
  const int64_t n_valid = n_lane - g * kLanes < kLanes ? n_lane - g * kLanes : kLanes;
  alignas(64) float tmp[kLanes];
  for (int rr = 0; rr < R; ++rr) {
    _mm512_store_ps(tmp, out[rr]);
    for (int64_t l = 0; l < n_valid; ++l) a.y[(g * kLanes + l) * a.ldy + r + rr] = tmp[l];
  }
}

}  // namespace

// Q3_K / Q4_K / Q6_K only (Q4_0 / Q8_0 / Q5_0 take the fused tiles).
int64_t lanes_prep_row_bytes(int64_t n_in) {
  return (n_in / kQK_K) * kPrepK;
}

void gemm_lanes(const GemmArgs& a, int64_t r0, int64_t r1, uint8_t* scratch) {
  const int64_t prep_bytes = lanes_prep_row_bytes(a.n_in);
  const int64_t n_groups = (a.act_layout.lane_tokens + kLanes - 1) / kLanes;
  // Groups per block: ~512 KB of activations stay in L2 while the chunk's rows pass over them.
  int64_t gpb = (512 << 10) / a.act_layout.stride;
  gpb = gpb < 1 ? 1 : gpb;
  const uint8_t* prep[kLanesRows];
  for (int i = 0; i < kLanesRows; ++i) prep[i] = scratch + i * prep_bytes;
  for (int64_t g0 = 0; g0 < n_groups; g0 += gpb) {
    const int64_t g1 = g0 + gpb < n_groups ? g0 + gpb : n_groups;
    for (int64_t r = r0; r < r1; r += kLanesRows) {
      const int n_rows = r1 - r < kLanesRows ? int(r1 - r) : kLanesRows;
      for (int i = 0; i < n_rows; ++i) {
        const uint8_t* wrow = a.w + (r + i) * a.row_bytes;
        uint8_t* p = scratch + i * prep_bytes;
        // Each super-block step prefetches the same bytes of the row kPrefetchTiles chunks on
        // (tiles_int.h): a prep reads its rows straight from DRAM, and with one 16-token group
        // (batched decode) it was waiting on them (perf: 15% of gemm_lanes on one load).
        const uint8_t* pf = wrow + kPrefetchTiles * kLanesRows * a.row_bytes;
        switch (a.type) {
          case DType::Q4_K: prep_q4_k(wrow, a.n_in / kQK_K, p, pf); break;
          case DType::Q6_K: prep_q6_k(wrow, a.n_in / kQK_K, p, pf); break;
          case DType::Q3_K: prep_q3_k(wrow, a.n_in / kQK_K, p, pf); break;
          default: break;
        }
      }
      for (int64_t g = g0; g < g1; ++g) {
        const uint8_t* grp = a.act + g * a.act_layout.stride;
        switch (n_rows) {
          case 4: lanes_tile<4>(a, prep, grp, g, r); break;
          case 3: lanes_tile<3>(a, prep, grp, g, r); break;
          case 2: lanes_tile<2>(a, prep, grp, g, r); break;
          default: lanes_tile<1>(a, prep, grp, g, r); break;
        }
      }
    }
  }
}

}  // namespace tern::kern::avx512
