// AVX-512 (F/BW/VL/DQ/VNNI) kernel table.
//  - quantized weights, decode: Q4_0 / Q8_0 in the wide tiles below (several rows per zmm, 8
//    rows); the K-quants in the classic tiles of x86_common.h with VNNI (vpdpbusd / vpdpwssd
//    on 256-bit vectors, 32 registers: 4 rows x 4 tokens);
//  - Q4_0 / Q8_0, 2 to 15 tokens (small decode batches, and the tokens after a batch's last
//    full 16-token group): the row-lane tiles, 16 weight rows per zmm;
//  - quantized weights, full 16-token groups (K-quants: from 12 tokens) up to prefill: the
//    token-lane GEMM below, 16 tokens per zmm; the K-quants' tokens of a last partial group
//    too small to pay for its padding go to the classic tiles;
//  - float weights: tiles_float.h (one FMA chain per output, vectors across outputs: 12-token
//    x 32-row panel tiles for prefill, groups read directly for decode; BF16 on CPUs with
//    AVX512-BF16 by vdpbf16ps on bf16-rounded activations, in the same tiles).
#include "kernels/x86/x86_common.h"
#include "kernels/x86/tiles_float.h"

namespace tern::kern {
namespace {

struct OpsAvx512 {
  static constexpr int kMaxTokens = 4;
  static __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
  static __m256i dot_s16(__m256i acc, __m256i a, __m256i b) { return _mm256_dpwssd_epi32(acc, a, b); }
};

// --- token-lane GEMM for quantized weights (batches and prefill) ----------------------------
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
//     nsum [16 t]          int32: -sum(x) of the block (the weights' offset term, see fused_q32)
//   Q8_KLanes, per group, per 256-element super-block (kLaneBlockQ8_K bytes):
//     xq  [64 k][16 t][4] u8 (x + 128)
//     d   [16 t]          f32
//     s32 [4 p][16 t][2]  int16: sums of x over 32-element sub-blocks 2p, 2p+1 (Q4_K mins)
//     s16 [8 p][16 t][2]  int16: sums of x over 16-element sub-blocks 2p, 2p+1 (Q6_K offset)
//
// K-quants: the +128 makes x unsigned; it is undone per (row, block) with the weights' sum:
//   sum (x + 128) w = sum x w + 128 sum w, so each block's accumulator starts at -128 sum w.
// Their weights are the signed (broadcast) operand, unpacked once per 4-row tile into the
// thread's scratch ("prep") and reused by every token group. Q4_0 / Q8_0 need no prep: see the
// fused tiles further down.

constexpr int kLanes = 16;
// A 16-token group pays for all 16 lanes: below this many tokens in a group the Rows tiles
// are faster. Measured on 2 threads with in-cache weights: the K-quants win from 12 tokens
// (single core) over the classic tiles; Q4_0 / Q8_0 lay out full groups only, the row-lane
// tiles being level with or faster than a padded group at any smaller count.
int64_t lanes_min_tokens(DType type) {
  // Q4_0 / Q8_0 / Q5_0: full groups only; the row-lane tiles (below) or the classic ones take
  // any smaller remainder.
  return type == DType::Q4_0 || type == DType::Q8_0 || type == DType::Q5_0 ? kLanes : 12;
}
constexpr int64_t kLaneBlockQ8_0 = 8 * 64 + 64 + 64;
constexpr int64_t kLaneOffNsum = 8 * 64 + 64;
constexpr int64_t kLaneOffS32 = 64 * 64 + 64;
constexpr int64_t kLaneOffS16 = kLaneOffS32 + 4 * 64;
constexpr int64_t kLaneBlockQ8_K = kLaneOffS16 + 8 * 64;
constexpr int kTileRows = 4;

int64_t round_up64(int64_t v) { return (v + 63) / 64 * 64; }

// Stores the 8 dwords of v (4 bytes of elements 4k..4k+3) at dst + 64 k, each byte xor-ed with
// flip (0x80: x + 128, for the K-quants; 0: x as is, for Q8_0Lanes).
inline void store_lane_dwords(uint8_t* dst, __m256i v, char flip) {
  alignas(32) uint32_t u[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(u), _mm256_xor_si256(v, _mm256_set1_epi8(flip)));
  for (int k = 0; k < 8; ++k) std::memcpy(dst + 64 * k, &u[k], 4);
}

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

void prep_q4_k(const uint8_t* wrow, int64_t nsb, uint8_t* prep) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const BlockQ4_K* blk = reinterpret_cast<const BlockQ4_K*>(wrow) + sb;
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

void prep_q6_k(const uint8_t* wrow, int64_t nsb, uint8_t* prep) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const BlockQ6_K* blk = reinterpret_cast<const BlockQ6_K*>(wrow) + sb;
    uint8_t* p = prep + sb * kPrepK;
    auto* corr = reinterpret_cast<int32_t*>(p + kPrepCorr);
    auto* sc = reinterpret_cast<int32_t*>(p + kPrepSc);
    auto* pair = reinterpret_cast<int32_t*>(p + kPrepPair);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->ql + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->ql + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qh + 32 * h));
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
      q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
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
void prep_q3_k(const uint8_t* wrow, int64_t nsb, uint8_t* prep) {
  const __m256i m3 = _mm256_set1_epi8(0x03), one = _mm256_set1_epi8(1), four = _mm256_set1_epi8(4);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const BlockQ3_K* blk = reinterpret_cast<const BlockQ3_K*>(wrow) + sb;
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

// Q3_K / Q4_K / Q6_K only (Q4_0 / Q8_0 / Q5_0 take the fused tiles).
int64_t lanes_prep_row_bytes(int64_t n_in) {
  return (n_in / kQK_K) * kPrepK;
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

void gemm_lanes(const GemmArgs& a, int64_t r0, int64_t r1, uint8_t* scratch) {
  const int64_t prep_bytes = lanes_prep_row_bytes(a.n_in);
  const int64_t n_groups = (a.act_layout.lane_tokens + kLanes - 1) / kLanes;
  // Groups per block: ~512 KB of activations stay in L2 while the chunk's rows pass over them.
  int64_t gpb = (512 << 10) / a.act_layout.stride;
  gpb = gpb < 1 ? 1 : gpb;
  const uint8_t* prep[kTileRows];
  for (int i = 0; i < kTileRows; ++i) prep[i] = scratch + i * prep_bytes;
  for (int64_t g0 = 0; g0 < n_groups; g0 += gpb) {
    const int64_t g1 = g0 + gpb < n_groups ? g0 + gpb : n_groups;
    for (int64_t r = r0; r < r1; r += kTileRows) {
      const int n_rows = r1 - r < kTileRows ? int(r1 - r) : kTileRows;
      for (int i = 0; i < n_rows; ++i) {
        const uint8_t* wrow = a.w + (r + i) * a.row_bytes;
        uint8_t* p = scratch + i * prep_bytes;
        switch (a.type) {
          case DType::Q4_K: prep_q4_k(wrow, a.n_in / kQK_K, p); break;
          case DType::Q6_K: prep_q6_k(wrow, a.n_in / kQK_K, p); break;
          case DType::Q3_K: prep_q3_k(wrow, a.n_in / kQK_K, p); break;
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

// --- wide classic tiles for Q4_0 / Q8_0 (decode and small batches) -------------------------
//
// The 256-bit tiles spend ~12 instructions per (row, 32-weight block) and, with 4-row tiles
// over rows of a few KB, leave the hardware prefetcher too little to train on: a GEMV ran at
// a third of the streaming bandwidth from DRAM. Here one zmm carries several rows of one
// block (Q4_0: four rows' 16 nibble bytes, one per 128-bit lane; Q8_0: two rows' 32 bytes,
// one per 256-bit half) against the block's activations broadcast to every lane, and each
// row's f16 scale is converted once per block for all tokens (8 at once). Tiles are 8 rows
// (4 at the end of a chunk): the 8 scales convert in one instruction, and more rows stream at
// once. Weights are prefetched as in x86_common.h's tiles. In-cache single-core speed went
// from ~34 to ~55 weights/ns for Q4_0 and from ~37 to ~46 for Q8_0; a row's result does not
// depend on whether it sits in an 8- or a 4-row tile.
//
// Q4_0: nibbles unsigned, the -8 offset through nsum as in tile_q32 (a row has 4 lanes here,
// so each starts at 2 * nsum).
// Q8_0: no 512-bit vpsignb, so the weights are made unsigned instead (w + 128, a sign-bit
// flip); the extra 128 * sum(x) = -128 * nsum is removed by starting each of a row's 8 lanes
// at 16 * nsum.

// The f16 scales of the R blocks (R = 4 or 8) at blk0 + r * rb, as f32. Packed in general-
// purpose registers (idle scalar ALUs) rather than by vpinsrw, which competes for the vector
// pipes.
template <int R>
inline __m256 wide_scales(const uint8_t* blk0, int64_t rb) {
  const auto d = [&](int r) { return uint64_t(*reinterpret_cast<const uint16_t*>(blk0 + r * rb)); };
  __m128i h = _mm_cvtsi64_si128(int64_t(d(0) | d(1) << 16 | d(2) << 32 | d(3) << 48));
  if constexpr (R == 8) h = _mm_insert_epi64(h, int64_t(d(4) | d(5) << 16 | d(6) << 32 | d(7) << 48), 1);
  return _mm256_cvtph_ps(h);
}

// R rows (4 or 8) x T tokens of Q4_0.
template <int R, int T>
void wide_q4_0(const Tile& c) {
  constexpr int G = R / 4;  // zmm per token
  __m512 acc[G][T];
  for (auto& a : acc)
    for (auto& v : a) v = _mm512_setzero_ps();
  const ActPtrs<T> x(c);
  const int64_t rb = c.row_bytes;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512i expand[G];  // 128-bit lane j of vector g <- scale of row 4g + j
  for (int g = 0; g < G; ++g)
    expand[g] = _mm512_setr_epi32(4 * g, 4 * g, 4 * g, 4 * g, 4 * g + 1, 4 * g + 1, 4 * g + 1, 4 * g + 1,
                                  4 * g + 2, 4 * g + 2, 4 * g + 2, 4 * g + 2, 4 * g + 3, 4 * g + 3, 4 * g + 3, 4 * g + 3);
  const uint8_t* pf = c.w + kPrefetchTiles * R * rb;
  for (int64_t b = 0; b < c.nb; ++b) {
    const uint8_t* blk = c.w + b * int64_t(sizeof(BlockQ4_0));
    prefetch_step<R * int(sizeof(BlockQ4_0))>(pf + b * R * int64_t(sizeof(BlockQ4_0)));
    __m512i lo[G], hi[G];
    for (int g = 0; g < G; ++g) {
      const uint8_t* q = blk + 4 * g * rb + 2;
      // two 256-bit inserts and one 512-bit: cheaper than three 512-bit inserts on Zen 4
      const __m256i v01 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))),
                                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + rb)), 1);
      const __m256i v23 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 2 * rb))),
                                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 3 * rb)), 1);
      const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(v01), v23, 1);
      lo[g] = _mm512_and_si512(v, m4);
      hi[g] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
    const __m256 dw = wide_scales<R>(blk, rb);
    for (int t = 0; t < T; ++t) {
      const int8_t* xq = x.q[t] + 32 * b;
      const __m512i xlo = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq)));
      const __m512i xhi = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq + 16)));
      // -8 * sum(x) over a row's 4 lanes
      const __m512i ns = _mm512_set1_epi32(2 * reinterpret_cast<const int32_t*>(x.sum[t])[b]);
      // dw * dx for all R rows at once, then spread to each row's lanes
      const __m512 sc = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_set1_ps(x.d[t][b])));
      for (int g = 0; g < G; ++g) {
        const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ns, lo[g], xlo), hi[g], xhi);
        acc[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(expand[g], sc), acc[g][t]);
      }
    }
  }
  for (int g = 0; g < G; ++g)
    for (int t = 0; t < T; ++t) {
      alignas(64) float tmp[16];
      _mm512_store_ps(tmp, acc[g][t]);
      for (int j = 0; j < 4; ++j)
        c.y[t * c.ldy + 4 * g + j] = (tmp[4 * j] + tmp[4 * j + 1]) + (tmp[4 * j + 2] + tmp[4 * j + 3]);
    }
}

// R rows (4 or 8) x T tokens of Q8_0.
template <int R, int T>
void wide_q8_0(const Tile& c) {
  constexpr int G = R / 2;  // zmm per token
  __m512 acc[G][T];
  for (auto& a : acc)
    for (auto& v : a) v = _mm512_setzero_ps();
  const ActPtrs<T> x(c);
  const int64_t rb = c.row_bytes;
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  __m512i expand[G];  // 256-bit half j of vector g <- scale of row 2g + j
  for (int g = 0; g < G; ++g) expand[g] = _mm512_inserti64x4(_mm512_set1_epi32(2 * g), _mm256_set1_epi32(2 * g + 1), 1);
  const uint8_t* pf = c.w + kPrefetchTiles * R * rb;
  for (int64_t b = 0; b < c.nb; ++b) {
    const uint8_t* blk = c.w + b * int64_t(sizeof(BlockQ8_0));
    prefetch_step<R * int(sizeof(BlockQ8_0))>(pf + b * R * int64_t(sizeof(BlockQ8_0)));
    __m512i u[G];
    for (int g = 0; g < G; ++g) {
      const uint8_t* q = blk + 2 * g * rb + 2;
      const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q))),
                                           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + rb)), 1);
      u[g] = _mm512_xor_si512(v, flip);
    }
    const __m256 dw = wide_scales<R>(blk, rb);
    for (int t = 0; t < T; ++t) {
      const int8_t* xq = x.q[t] + 32 * b;
      const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq)));
      // -128 * sum(x) over a row's 8 lanes
      const __m512i init = _mm512_set1_epi32(16 * reinterpret_cast<const int32_t*>(x.sum[t])[b]);
      const __m512 sc = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_set1_ps(x.d[t][b])));
      for (int g = 0; g < G; ++g) {
        const __m512i s = _mm512_dpbusd_epi32(init, u[g], xv);
        acc[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(expand[g], sc), acc[g][t]);
      }
    }
  }
  for (int g = 0; g < G; ++g)
    for (int t = 0; t < T; ++t) {
      alignas(64) float tmp[16];
      _mm512_store_ps(tmp, acc[g][t]);
      for (int j = 0; j < 2; ++j) {
        const float* p = tmp + 8 * j;
        c.y[t * c.ldy + 2 * g + j] = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
      }
    }
}

template <int R, int T>
void wide_tile(DType type, const Tile& c) {
  if (type == DType::Q4_0) wide_q4_0<R, T>(c);
  else wide_q8_0<R, T>(c);
}

// Rows [r, r+R) x tokens [t0, t1), as int_rows.
template <int R>
void wide_rows(const GemmArgs& a, const RowsView& v, int64_t r, int64_t t0, int64_t t1) {
  constexpr int TM = OpsAvx512::kMaxTokens;
  Tile c = rows_tile(a, v);  // Q8_0 activation rows: 32-element blocks
  c.w = a.w + r * a.row_bytes;
  for (int64_t t = t0; t < t1; t += TM) {
    c.act = v.act + (t - v.t_begin) * v.stride;
    c.y = a.y + t * a.ldy + r;
    switch (t1 - t < TM ? t1 - t : TM) {
      case 1: wide_tile<R, 1>(a.type, c); break;
      case 2: wide_tile<R, 2>(a.type, c); break;
      case 3: wide_tile<R, 3>(a.type, c); break;
      default: wide_tile<R, 4>(a.type, c); break;
    }
  }
}

// gemm_int_classic for Q4_0 / Q8_0: 8-row tiles, then one of 4, then single rows.
void gemm_wide(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  int64_t tb = (256 << 10) / (v.stride > 0 ? v.stride : 1);
  tb = tb < OpsAvx512::kMaxTokens ? OpsAvx512::kMaxTokens : tb / OpsAvx512::kMaxTokens * OpsAvx512::kMaxTokens;
  for (int64_t t0 = v.t_begin; t0 < a.n_tokens; t0 += tb) {
    const int64_t t1 = t0 + tb < a.n_tokens ? t0 + tb : a.n_tokens;
    int64_t r = r0;
    for (; r + 8 <= r1; r += 8) wide_rows<8>(a, v, r, t0, t1);
    for (; r + 4 <= r1; r += 4) wide_rows<4>(a, v, r, t0, t1);
    for (; r < r1; ++r) int_rows<OpsAvx512, 1>(a, v, r, t0, t1);
  }
}

// --- token-lane tiles for Q4_0 / Q8_0, without prep ----------------------------------------
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
//
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

// Rows per fused tile: 8, then 4, then single rows at a chunk's end. 8 rows share each block's
// activation loads twice as widely as 4 (measured 5-12% faster at 8 and 16 tokens). A row's
// result does not depend on its tile: every row runs the same operations.
constexpr int kFusedRows = 8;
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
  const uint8_t* pf = w + kPrefetchTiles * R * rb;  // as the classic tiles (x86_common.h)
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

// scratch holds the kFusedRows * n_in / 32 floats of fused_scales (then, for Q5_0, its
// kFusedRows rows rebuilt as Q8_0).
void gemm_fused(const GemmArgs& a, int64_t r0, int64_t r1, uint8_t* scratch) {
  float* dw = reinterpret_cast<float*>(scratch);
  if (a.type == DType::Q4_0) gemm_fused_t<true>(a, r0, r1, dw);
  else if (a.type == DType::Q5_0) gemm_fused_q5_0(a, r0, r1, dw, scratch + round_up64(int64_t(sizeof(float)) * kFusedRows * (a.n_in / 32)));
  else gemm_fused_t<false>(a, r0, r1, dw);
}

// --- row-lane tiles for Q4_0 / Q8_0: 16 weight rows per zmm --------------------------------
//
// The token-lane tiles above broadcast each 4-byte weight group to 16 token lanes and must
// make it unsigned there (an AND or XOR per vpdpbusd), then pay a cvt, a multiply and an FMA
// per (row, block): about 25 vector operations per 8 vpdpbusd. Here a lane is a weight row
// instead: the tile transposes block b of 16 rows into 8 vectors, w[k] lane i = the unsigned
// bytes of row i's 4-byte group k (Q4_0: nibbles 0..15, k < 4 the low ones = elements
// 4k..4k+3, k >= 4 the high ones = elements 16+4(k-4)..; Q8_0: w + 128), once per block for
// up to 16 tokens. Each token then needs 8 vpdpbusd whose signed side is its own 4 activation
// bytes, broadcast straight from the Rows layout (an embedded {1to16} memory operand: no ALU
// operation), plus one cvt, one multiply and one FMA for all 16 rows; the weights' offset
// (-8 or +128) folds into the integer accumulator's start value through the token's nsum
// (8 * nsum or 128 * nsum), as in the tiles above. A token's 16 results are then one vector
// store into y, with no horizontal sums. Every (row, token) runs the same operations in the
// same order whatever the tile, the token count or the row chunk, so a row's result does not
// depend on the batch it is in; the integer sums equal the other tiles' exactly, and the
// float steps are those of the token-lane tiles (fma(cvt(s), dx * dw, acc), blocks in order).
constexpr int kRowLanes = 16;

// Below this many tokens a Q4_0 / Q8_0 batch runs whole in the row-lane tiles; from it on, its
// full 16-token groups take the token-lane tiles. Measured side by side on 2 threads (2048 x
// 5632, in cache), row-lane vs token-lane: 16 tokens 555 vs 508 GFLOP/s (Q4_0), 530 vs 495
// (Q8_0); 32 tokens 560-580 vs 526 (Q4_0), level for Q8_0 (530 / 535: its row-lane unpack is
// twice as long); 128 tokens level for Q4_0, token-lane ahead for Q8_0 (555-580 vs 525-530).
int64_t rowlane_below_tokens(DType type) {
  if (type == DType::Q4_0) return 64;
  // Q5_0: its rows are rebuilt per call (gemm_fused_q5_0); below 32 tokens the classic tiles.
  return type == DType::Q8_0 || type == DType::Q5_0 ? 32 : 0;
}

// Block b of the 16 rows at rows[i] + b * kBlk, transposed and made unsigned (see above).
template <bool kQ4>
inline void rowlane_unpack(const uint8_t* const* rows, int64_t off, __m512i (&w)[8]) {
  const auto ld = [&](int i, int part) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i] + off + 2 + 16 * part));
  };
  // 4x4 dword transposes within 128-bit lanes: lane L of A_j holds row 4L + j, so that after
  // them lane 4L + j of every output vector is row 4L + j.
  const auto transpose = [&](int part, __m512i* d) {
    __m512i A[4];
    for (int j = 0; j < 4; ++j) {
      __m512i v = _mm512_castsi128_si512(ld(j, part));
      v = _mm512_inserti32x4(v, ld(j + 4, part), 1);
      v = _mm512_inserti32x4(v, ld(j + 8, part), 2);
      A[j] = _mm512_inserti32x4(v, ld(j + 12, part), 3);
    }
    const __m512i t0 = _mm512_unpacklo_epi32(A[0], A[1]), t1 = _mm512_unpackhi_epi32(A[0], A[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(A[2], A[3]), t3 = _mm512_unpackhi_epi32(A[2], A[3]);
    d[0] = _mm512_unpacklo_epi64(t0, t2);
    d[1] = _mm512_unpackhi_epi64(t0, t2);
    d[2] = _mm512_unpacklo_epi64(t1, t3);
    d[3] = _mm512_unpackhi_epi64(t1, t3);
  };
  if constexpr (kQ4) {
    __m512i d[4];
    transpose(0, d);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int k = 0; k < 4; ++k) {
      w[k] = _mm512_and_si512(d[k], m4);
      w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(d[k], 4), m4);
    }
  } else {
    transpose(0, w);
    transpose(1, w + 4);
    const __m512i flip = _mm512_set1_epi8(char(0x80));
    for (int k = 0; k < 8; ++k) w[k] = _mm512_xor_si512(w[k], flip);
  }
}

// The f16 scales of block b of the 16 rows, as f32 (packed in general-purpose registers, as
// wide_scales does).
inline __m512 rowlane_scales(const uint8_t* const* rows, int64_t off) {
  const auto d = [&](int i) { return uint64_t(*reinterpret_cast<const uint16_t*>(rows[i] + off)); };
  const auto q = [&](int i) { return int64_t(d(i) | d(i + 1) << 16 | d(i + 2) << 32 | d(i + 3) << 48); };
  const __m128i lo = _mm_insert_epi64(_mm_cvtsi64_si128(q(0)), q(4), 1);
  const __m128i hi = _mm_insert_epi64(_mm_cvtsi64_si128(q(8)), q(12), 1);
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

// Block b of Q4_0 / Q8_0 rows interleaved by 16 (kernels/matmul.h): the same 8 vectors and
// scales as rowlane_unpack / rowlane_scales give for the rows as stored, read in place.
template <bool kQ4>
constexpr int64_t kInterleavedBlk = 16 * (kQ4 ? int64_t(sizeof(BlockQ4_0)) : int64_t(sizeof(BlockQ8_0)));
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

template <bool kQ4>
inline __m512 interleaved_unpack(const uint8_t* blk, __m512i (&w)[8]) {
  if constexpr (kQ4) {
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

// The 16 rows at rows[] x TC tokens of the Rows view from token t, into y for the rows (lanes)
// set in `keep`. With `group` (rows interleaved by 16), the 16 rows are that group, read in
// place of rows[].
template <bool kQ4, int TC>
void rowlane_tile(const GemmArgs& a, const RowsView& v, const uint8_t* const* rows, __mmask16 keep,
                  const uint8_t* pf, int64_t t, float* y, const uint8_t* group = nullptr) {
  constexpr int64_t kBlk = kQ4 ? int64_t(sizeof(BlockQ4_0)) : int64_t(sizeof(BlockQ8_0));
  const int64_t nb = a.n_in / 32;
  const uint8_t* xrow[TC];
  for (int i = 0; i < TC; ++i) xrow[i] = v.act + (t + i - v.t_begin) * v.stride;
  __m512 acc[TC];
  for (int i = 0; i < TC; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    if (pf) prefetch_step<kRowLanes * int(kBlk)>(pf + b * kRowLanes * kBlk);
    __m512i w[8];
    __m512 dw;
    if (group) {
      dw = interleaved_unpack<kQ4>(group + b * kInterleavedBlk<kQ4>, w);
    } else {
      rowlane_unpack<kQ4>(rows, b * kBlk, w);
      dw = rowlane_scales(rows, b * kBlk);
    }
#pragma GCC unroll 16
    for (int i = 0; i < TC; ++i) {
      const uint8_t* xq = xrow[i] + 32 * b;
      // 8 * nsum or 128 * nsum: a broadcast load and a shift (a broadcast from a general-
      // purpose register costs two vector operations on Zen 4)
      const __m512i ns = _mm512_set1_epi32(reinterpret_cast<const int32_t*>(xrow[i] + v.off_sum)[b]);
      __m512i s = kQ4 ? _mm512_slli_epi32(ns, 3) : _mm512_slli_epi32(ns, 7);
      for (int k = 0; k < 8; ++k) {
        int32_t xk;
        std::memcpy(&xk, xq + 4 * k, 4);
        s = _mm512_dpbusd_epi32(s, w[k], _mm512_set1_epi32(xk));
      }
      const float dx = reinterpret_cast<const float*>(xrow[i] + v.off_d)[b];
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(_mm512_set1_ps(dx), dw), acc[i]);
    }
  }
  for (int i = 0; i < TC; ++i) _mm512_mask_storeu_ps(y + i * a.ldy, keep, acc[i]);
}

template <bool kQ4, int TC = kRowLanes>
void rowlane_tokens(const GemmArgs& a, const RowsView& v, const uint8_t* const* rows, __mmask16 keep,
                    const uint8_t* pf, int64_t t, int64_t n, float* y, const uint8_t* group = nullptr) {
  if constexpr (TC > 1) {
    if (n < TC) return rowlane_tokens<kQ4, TC - 1>(a, v, rows, keep, pf, t, n, y, group);
  }
  rowlane_tile<kQ4, TC>(a, v, rows, keep, pf, t, y, group);
}

// Rows [r0, r1) x all tokens of a Rows layout.
template <bool kQ4>
void gemm_rowlanes_t(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  // Token blocks whose activations (~256 KB) stay in L2 while the chunk's rows pass over them.
  int64_t tb = (256 << 10) / (v.stride > 0 ? v.stride : 1);
  tb = tb < kRowLanes ? kRowLanes : tb / kRowLanes * kRowLanes;
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
        rowlane_tokens<kQ4>(a, v, rows, __mmask16((1u << n_rows) - 1u), t == t0 ? pf : nullptr, t, n,
                            a.y + t * a.ldy + r);
      }
    }
  }
}

// Q4_0 / Q8_0 interleaved by 16 rows, every batch size: the row-lane tiles reading each block
// of 16 rows in place (4 or 8 vector loads and one of scales instead of 16 or 32 row loads, 12
// or 24 inserts and 8 or 16 unpacks). The same operations on the same values, so the same bits
// as the row-lane tiles on the rows as stored; a lone token too (the stored rows' wide GEMV
// tiles differ there). Rows [r0, r1) may start and end inside a group: its other rows are
// computed, not stored.
template <bool kQ4>
void gemm_interleaved_t(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  for_each_interleaved_tile<kRowLanes>(
      a, v, r0, r1, a.n_in / 32 * kInterleavedBlk<kQ4>,
      [&](const uint8_t* group, int64_t t, int64_t n, int lo, int hi, const uint8_t* pf, float* y) {
        rowlane_tokens<kQ4>(a, v, nullptr, __mmask16(rows_mask(lo, hi)), pf, t, n, y, group);
      });
}

// Q4_K interleaved by 16 rows (kernels/matmul.h): one zmm per 64-byte piece, a row per lane,
// as the AVX2 tiles read it with two ymm. A sub-block's 8 vpdpbusd steps (nibbles against 4
// broadcast activation bytes) sum in int32, which vpmulld scales by the rows' 6-bit scales;
// the mins meet Q8_K's bsums (two sums of 16 per sub-block, one broadcast) in one vpdpwssd.
// The same exact integer sums and float steps as the AVX2 tiles, so the same bits.
// Q5_K (kQ5): the same tile, each piece's fifth bits (the qh piece of its k: sub-block j's in
// bit j of each byte) shifted to bit 4 and or-ed into the nibbles.
constexpr int64_t kGroupBlkQ4K = 16 * int64_t(sizeof(BlockQ4_K));
constexpr int64_t kGroupBlkQ5K = 16 * int64_t(sizeof(BlockQ5_K));

// Bit `bit` of every byte moved to bit 4 (other bits are garbage: the caller masks 0x10). A
// 16-bit shift by at most 4 brings bit 4 of a byte from within the same byte.
inline __m512i hshift(__m512i h, int bit) {
  return bit <= 4 ? _mm512_sll_epi16(h, _mm_cvtsi32_si128(4 - bit)) : _mm512_srl_epi16(h, _mm_cvtsi32_si128(bit - 4));
}

template <bool kQ5, int TC>
__attribute__((noinline)) void rowlane_q4_k_tile(const RowsView& v, const uint8_t* group, int64_t nsb, __mmask16 keep,
                                                 const uint8_t* pf, int64_t t, float* y, int64_t ldy) {
  constexpr int64_t kGroupBlk = kQ5 ? kGroupBlkQ5K : kGroupBlkQ4K;
  const __m512i sixteen = _mm512_set1_epi8(16);
  const ActPtrs<TC> x(v, t);
  __m512 acc[TC];
  for (auto& e : acc) e = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i m6 = _mm512_set1_epi32(63), low4 = _mm512_set1_epi32(15);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = group + sb * kGroupBlk;
    if (pf) prefetch_step<int(kGroupBlk)>(pf + sb * kGroupBlk);
    __m512i S[TC], M[TC];
    for (int i = 0; i < TC; ++i) S[i] = M[i] = _mm512_setzero_si512();
    __m512i m_high = _mm512_loadu_si512(blk + 192);
#pragma GCC unroll 1
    for (int c = 0; c < 4; ++c) {
      __m512i slo[TC], shi[TC];
      for (int i = 0; i < TC; ++i) slo[i] = shi[i] = _mm512_setzero_si512();
#pragma GCC unroll 1
      for (int k = 0; k < 8; ++k) {
        const __m512i d = _mm512_loadu_si512(blk + (kQ5 ? (c == 0 ? 256 + 128 * k : 768 + 512 * c + 64 * k) : 256 + 64 * (8 * c + k)));
        __m512i lo = _mm512_and_si512(d, m4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(d, 4), m4);
        if constexpr (kQ5) {
          const __m512i h = _mm512_loadu_si512(blk + 320 + 128 * k);
          // bit 2c (2c + 1) of each byte to bit 4, or-ed in: (a & b) | c
          lo = _mm512_ternarylogic_epi32(_mm512_and_si512(hshift(h, 2 * c), sixteen), lo, lo, 0xFC);
          hi = _mm512_ternarylogic_epi32(_mm512_and_si512(hshift(h, 2 * c + 1), sixteen), hi, hi, 0xFC);
        }
        for (int i = 0; i < TC; ++i) {
          const int8_t* xp = x.q[i] + kQK_K * sb + 64 * c + 4 * k;
          int32_t x0, x1;
          std::memcpy(&x0, xp, 4);
          std::memcpy(&x1, xp + 32, 4);
          slo[i] = _mm512_dpbusd_epi32(slo[i], lo, _mm512_set1_epi32(x0));
          shi[i] = _mm512_dpbusd_epi32(shi[i], hi, _mm512_set1_epi32(x1));
        }
      }
      for (int jj = 0; jj < 2; ++jj) {
        const int j = 2 * c + jj;
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 64 + 16 * j)));
        const __m512i sc = _mm512_and_si512(b, m6);
        const __m512i m = _mm512_or_si512(_mm512_srli_epi32(b, 6), _mm512_slli_epi32(_mm512_and_si512(m_high, low4), 2));
        m_high = _mm512_srli_epi32(m_high, 4);  // sub-block j + 1's nibble next
        const __m512i m2 = _mm512_or_si512(m, _mm512_slli_epi32(m, 16));  // m in both int16 halves
        for (int i = 0; i < TC; ++i) {
          S[i] = _mm512_add_epi32(S[i], _mm512_mullo_epi32(jj ? shi[i] : slo[i], sc));
          int32_t bs;
          std::memcpy(&bs, x.bsums(i) + 16 * sb + 2 * j, 4);
          M[i] = _mm512_dpwssd_epi32(M[i], m2, _mm512_set1_epi32(bs));
        }
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    for (int i = 0; i < TC; ++i) {
      const __m512 dx = _mm512_set1_ps(x.d[i][sb]);
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[i]), _mm512_mul_ps(dw, dx), acc[i]);
      acc[i] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M[i]), _mm512_mul_ps(dmin, dx), acc[i]);
    }
  }
  for (int i = 0; i < TC; ++i) _mm512_mask_storeu_ps(y + i * ldy, keep, acc[i]);
}

// tile.template operator()<N>() for the tile of N = n tokens (1 <= n <= TC).
template <int TC, class Tile>
inline void tokens_tile(int64_t n, Tile&& tile) {
  if constexpr (TC > 1) {
    if (n < TC) return tokens_tile<TC - 1>(n, tile);
  }
  tile.template operator()<TC>();
}

template <bool kQ5>
void gemm_interleaved_q4_k(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  const int64_t nsb = a.n_in / kQK_K;
  for_each_interleaved_tile<4>(
      a, v, r0, r1, nsb * (kQ5 ? kGroupBlkQ5K : kGroupBlkQ4K),
      [&](const uint8_t* group, int64_t t, int64_t n, int lo, int hi, const uint8_t* pf, float* y) {
        tokens_tile<4>(n, [&]<int TC>() {
          rowlane_q4_k_tile<kQ5, TC>(v, group, nsb, __mmask16(rows_mask(lo, hi)), pf, t, y, a.ldy);
        });
      });
}

// Q4_1 / Q5_0 / Q5_1 interleaved by 16 rows (Q32xLayout): rowlane_tile's Q4_0 path, a row per
// lane, with the fifth bits of nibble group g shifted from the lane's permuted qh to bit 4 and
// or-ed in (a shift and a vpternlogd);
// Q5_0's offset starts the integer sum at 16 * nsum, Q4_1 / Q5_1's m meets sum(x) = -nsum * dx
// in one more FMA per block and token.
template <DType kType, int TC>
__attribute__((noinline)) void rowlane_q32x_tile(const RowsView& v, const uint8_t* group, int64_t nb, __mmask16 keep,
                                                 const uint8_t* pf, int64_t t, float* y, int64_t ldy) {
  using L = Q32xLayout<kType>;
  const ActPtrs<TC> x(v, t);
  __m512 acc[TC];
  for (auto& e : acc) e = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * L::kBlk;
    if (pf) prefetch_step<int(L::kBlk)>(pf + b * L::kBlk);
    __m512i w[8];
    for (int k = 0; k < 4; ++k) {
      const __m512i d = load_piece(blk + L::kQ + 64 * k);
      w[k] = _mm512_and_si512(d, m4);
      w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(d, 4), m4);
    }
    if constexpr (L::kHigh) {
      const __m512i qh = load_piece(blk + L::kH);
      for (int g = 0; g < 8; ++g) {  // (shifted qh & 0x10) | w: one vpternlogd
        const __m512i sh = g <= 4 ? _mm512_slli_epi32(qh, unsigned(4 - g)) : _mm512_srli_epi32(qh, unsigned(g - 4));
        w[g] = _mm512_ternarylogic_epi32(sh, sixteen, w[g], 0xEA);
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    __m512 mw = _mm512_setzero_ps();
    if constexpr (L::kMin) mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
#pragma GCC unroll 16
    for (int i = 0; i < TC; ++i) {
      const int8_t* xq = x.q[i] + 32 * b;
      // Q5_0: 16 * nsum as a broadcast load and a shift (from a general-purpose register a
      // broadcast costs two vector operations on Zen 4)
      __m512i s = kType == DType::Q5_0 ? _mm512_slli_epi32(_mm512_set1_epi32(x.nsum(i)[b]), 4) : _mm512_setzero_si512();
      for (int k = 0; k < 8; ++k) {  // w[k] holds elements 4k..4k+3 (k >= 4: the high nibbles, 16 + 4(k - 4))
        int32_t xk;
        std::memcpy(&xk, xq + 4 * k, 4);
        s = _mm512_dpbusd_epi32(s, w[k], _mm512_set1_epi32(xk));
      }
      const float dx = x.d[i][b];
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(_mm512_set1_ps(dx), dw), acc[i]);
      if constexpr (L::kMin) acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(-float(x.nsum(i)[b]) * dx), acc[i]);
    }
  }
  for (int i = 0; i < TC; ++i) _mm512_mask_storeu_ps(y + i * ldy, keep, acc[i]);
}

template <DType kType>
void gemm_interleaved_q32x(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  const int64_t nb = a.n_in / 32;
  for_each_interleaved_tile<kRowLanes>(
      a, v, r0, r1, nb * Q32xLayout<kType>::kBlk,
      [&](const uint8_t* group, int64_t t, int64_t n, int lo, int hi, const uint8_t* pf, float* y) {
        tokens_tile<kRowLanes>(n, [&]<int TC>() {
          rowlane_q32x_tile<kType, TC>(v, group, nb, __mmask16(rows_mask(lo, hi)), pf, t, y, a.ldy);
        });
      });
}

// Q3_K and Q2_K interleaved by 16 rows (kernels/matmul.h), a row per lane. Per 16-element
// sub-block j, 4 vpdpbusd of the quants against broadcast activation bytes, scaled by the rows'
// sub-block scale (vpmulld). Q3_K (kQ3): quants q3 = q + 4h (0..7), scales sc_j - 32 decoded
// from the rows' three packed dwords (sc_4q..4q+3 in the bytes of s[q]); the -4 offset is
// -4 * sum_j (sc_j - 32) * bsum_j, 8 vpdpwssd of the rows' scale pairs against Q8_K's bsums
// pairs. Q2_K: 2-bit quants, scales and mins the nibbles of the rows' 16 scale bytes (4
// dwords); the mins' term -dmin * sum_j m_j * bsum_j the same 8 vpdpwssd. Every first touch of a
// super-block's bytes is in address order (Q3_K's hmask pieces sit beside the qs pieces that
// first need them).
constexpr int64_t kGroupBlkQ3K = 16 * int64_t(sizeof(BlockQ3_K));
constexpr int64_t kGroupBlkQ2K = 16 * int64_t(sizeof(BlockQ2_K));

template <bool kQ3, int TC>
__attribute__((noinline)) void rowlane_q23_k_tile(const RowsView& v, const uint8_t* group, int64_t nsb, __mmask16 keep,
                                                  const uint8_t* pf, int64_t t, float* y, int64_t ldy) {
  constexpr int64_t kGroupBlk = kQ3 ? kGroupBlkQ3K : kGroupBlkQ2K;
  const ActPtrs<TC> x(v, t);
  __m512 acc[TC];
  for (auto& e : acc) e = _mm512_setzero_ps();
  const __m512i lo4 = _mm512_set1_epi32(0x0F0F0F0F), hi2 = _mm512_set1_epi32(0x03030303);
  const __m512i m3 = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1), byte = _mm512_set1_epi32(0xFF);
  const __m512i nib = _mm512_set1_epi32(0x0F), thirty2 = _mm512_set1_epi32(32), low16 = _mm512_set1_epi32(0xFFFF);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = group + sb * kGroupBlk;
    if (pf) prefetch_step<int(kGroupBlk)>(pf + sb * kGroupBlk);
    __m512i s[4];  // bytes of s[q]: sub-blocks 4q..4q+3's scale (Q3_K, 0..63) or scale | min << 4 (Q2_K)
    if constexpr (kQ3) {
      const __m512i A = _mm512_loadu_si512(blk + 32), B = _mm512_loadu_si512(blk + 96), C = _mm512_loadu_si512(blk + 160);
      s[0] = _mm512_or_si512(_mm512_and_si512(A, lo4), _mm512_slli_epi32(_mm512_and_si512(C, hi2), 4));
      s[1] = _mm512_or_si512(_mm512_and_si512(B, lo4), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(C, 2), hi2), 4));
      s[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(A, 4), lo4),
                             _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(C, 4), hi2), 4));
      s[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(B, 4), lo4),
                             _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(C, 6), hi2), 4));
    } else {
      for (int q = 0; q < 4; ++q) s[q] = _mm512_loadu_si512(blk + 64 + 64 * q);
    }
    const auto field = [&](int j) { return _mm512_and_si512(_mm512_srli_epi32(s[j / 4], unsigned(8 * (j % 4))), byte); };
    // the multiplier of sub-block j's dot: sc_j - 32 (Q3_K) or the scale nibble (Q2_K)
    const auto scale = [&](int j) { return kQ3 ? _mm512_sub_epi32(field(j), thirty2) : _mm512_and_si512(field(j), nib); };
    // the bsums' multiplier: Q3_K's scale again, Q2_K's min
    const auto offset = [&](int j) { return kQ3 ? scale(j) : _mm512_srli_epi32(field(j), 4); };
    __m512i S[TC];
    for (int i = 0; i < TC; ++i) S[i] = _mm512_setzero_si512();
    for (int p = 0; p < 8; ++p) {  // pairs (offset_2p, offset_2p+1) as int16 against bsums 2p, 2p+1
      const __m512i pair = _mm512_or_si512(_mm512_and_si512(offset(2 * p), low16), _mm512_slli_epi32(offset(2 * p + 1), 16));
      for (int i = 0; i < TC; ++i) {
        int32_t bs;
        std::memcpy(&bs, x.bsums(i) + 16 * sb + 2 * p, 4);
        S[i] = _mm512_dpwssd_epi32(S[i], pair, _mm512_set1_epi32(bs));
      }
    }
    __m512i M[TC];  // Q2_K: the mins' sum; Q3_K: S starts at -4 times the offsets' sum
    for (int i = 0; i < TC; ++i) {
      M[i] = S[i];
      S[i] = kQ3 ? _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(S[i], 2)) : _mm512_setzero_si512();
    }
#pragma GCC unroll 1
    for (int j = 0; j < 16; ++j) {  // sub-block j: half n, group g, first or second 16 of the 32
      const int n = j / 8, g = (j % 8) / 2, h16 = j % 2;
      __m512i d[TC];
      for (int i = 0; i < TC; ++i) d[i] = _mm512_setzero_si512();
      for (int st = 0; st < 4; ++st) {
        const int pq = 8 * n + 4 * h16 + st;
        // 32-bit shifts by <= 7, then a mask: each kept bit comes from its own byte
        __m512i q;
        if constexpr (kQ3) {
          const __m512i qs = _mm512_loadu_si512(blk + (pq < 8 ? 224 + 128 * pq : 736 + 64 * pq));
          const __m512i hm = _mm512_loadu_si512(blk + 288 + 128 * (4 * h16 + st));
          q = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(qs, unsigned(2 * g)), m3),
                              _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hm, unsigned(4 * n + g)), one), 2));
        } else {
          q = _mm512_and_si512(_mm512_srli_epi32(_mm512_loadu_si512(blk + 320 + 64 * pq), unsigned(2 * g)), m3);
        }
        for (int i = 0; i < TC; ++i) {
          int32_t xk;
          std::memcpy(&xk, x.q[i] + kQK_K * sb + 16 * j + 4 * st, 4);
          d[i] = _mm512_dpbusd_epi32(d[i], q, _mm512_set1_epi32(xk));
        }
      }
      const __m512i sc = scale(j);
      for (int i = 0; i < TC; ++i) S[i] = _mm512_add_epi32(S[i], _mm512_mullo_epi32(d[i], sc));
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    __m512 dmin = _mm512_setzero_ps();
    if constexpr (!kQ3) dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    for (int i = 0; i < TC; ++i) {
      const __m512 dx = _mm512_set1_ps(x.d[i][sb]);
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[i]), _mm512_mul_ps(dw, dx), acc[i]);
      if constexpr (!kQ3) acc[i] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M[i]), _mm512_mul_ps(dmin, dx), acc[i]);
    }
  }
  for (int i = 0; i < TC; ++i) _mm512_mask_storeu_ps(y + i * ldy, keep, acc[i]);
}

template <bool kQ3>
void gemm_interleaved_q23_k(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  const int64_t nsb = a.n_in / kQK_K;
  for_each_interleaved_tile<8>(
      a, v, r0, r1, nsb * (kQ3 ? kGroupBlkQ3K : kGroupBlkQ2K),
      [&](const uint8_t* group, int64_t t, int64_t n, int lo, int hi, const uint8_t* pf, float* y) {
        tokens_tile<8>(n, [&]<int TC>() {
          rowlane_q23_k_tile<kQ3, TC>(v, group, nsb, __mmask16(rows_mask(lo, hi)), pf, t, y, a.ldy);
        });
      });
}

void gemm_interleaved(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  if (a.type == DType::Q2_K) return gemm_interleaved_q23_k<false>(a, v, r0, r1);
  if (a.type == DType::Q3_K) return gemm_interleaved_q23_k<true>(a, v, r0, r1);
  if (a.type == DType::Q4_1) return gemm_interleaved_q32x<DType::Q4_1>(a, v, r0, r1);
  if (a.type == DType::Q5_0) return gemm_interleaved_q32x<DType::Q5_0>(a, v, r0, r1);
  if (a.type == DType::Q5_1) return gemm_interleaved_q32x<DType::Q5_1>(a, v, r0, r1);
  if (a.type == DType::Q4_K) gemm_interleaved_q4_k<false>(a, v, r0, r1);
  else if (a.type == DType::Q5_K) gemm_interleaved_q4_k<true>(a, v, r0, r1);
  else if (a.type == DType::Q4_0) gemm_interleaved_t<true>(a, v, r0, r1);
  else gemm_interleaved_t<false>(a, v, r0, r1);
}

// Q4_0 / Q8_0 tokens in a Rows layout (a whole batch below rowlane_below_tokens, else the
// tokens after its last full 16-token group): a batch of one token (decode) in the wide tiles,
// which stream a GEMV's weights ~4% faster; any other in the row-lane tiles, so that from two
// tokens on a token's results never depend on its batch (the token-lane tiles give the same
// bits). Measured on 2 threads (2048 x 5632, in cache), row-lane against the wide tiles: 2
// tokens 268 -> 318 GFLOP/s (Q4_0) and 213 -> 258 (Q8_0), 3 tokens 296 -> 384 and 239 -> 323,
// 8 tokens 425 -> 534 and 380 -> 480.
void gemm_q32_rows(const GemmArgs& a, const RowsView& v, int64_t r0, int64_t r1) {
  if (a.n_tokens == 1) return gemm_wide(a, v, r0, r1);
  if (a.type == DType::Q4_0) gemm_rowlanes_t<true>(a, v, r0, r1);
  else gemm_rowlanes_t<false>(a, v, r0, r1);
}

// --- the table ---------------------------------------------------------------------------

// Full groups go to lanes; a last partial group too when it has enough tokens, else its tokens
// form a Rows tail for the classic tiles.
ActLayout avx512_act_layout(DType type, int64_t n_in, int64_t n_tokens) {
  if (type == DType::BF16 && n_in % 2 == 0 && bf16_dot_enabled()) return bf16_pairs_layout(n_in, n_tokens);
  ActLayout l = act_rows_layout(type, n_in, n_tokens);
  if (l.kind == ActKind::None) return l;
  // Token-lane kernels exist for Q4_0 / Q8_0 / Q5_0 / Q3_K / Q4_K / Q6_K; the other formats run
  // the classic tiles on Rows at every size.
  if (type != DType::Q4_0 && type != DType::Q8_0 && type != DType::Q5_0 && type != DType::Q3_K && type != DType::Q4_K &&
      type != DType::Q6_K)
    return l;
  if (n_tokens < rowlane_below_tokens(type)) return l;
  const int64_t rem = n_tokens % kLanes;
  const int64_t lane_tokens = rem >= lanes_min_tokens(type) ? n_tokens : n_tokens - rem;
  if (lane_tokens == 0) return l;
  const bool k_quant = l.kind == ActKind::Q8_KRows;
  l.kind = k_quant ? ActKind::Q8_KLanes : ActKind::Q8_0Lanes;
  l.tail_stride = l.stride;  // Rows offsets off_d / off_sum stay valid for the tail
  l.stride = k_quant ? (n_in / kQK_K) * kLaneBlockQ8_K : (n_in / 32) * kLaneBlockQ8_0;
  l.lane_tokens = lane_tokens;
  l.tail_offset = l.stride * ((lane_tokens + kLanes - 1) / kLanes);
  l.bytes = l.tail_offset + l.tail_stride * (n_tokens - lane_tokens);
  l.token_granule = kLanes;
  return l;
}

void avx512_quantize(const ActLayout& lay, DType, const float* x, int64_t ldx, int64_t n_in,
                     int64_t, int64_t t0, int64_t t1, uint8_t* act) {
  if (lay.kind == ActKind::BF16Pairs)
    quantize_bf16_pairs(lay, x, ldx, n_in, t0, t1, act);
  else if (lay.kind == ActKind::Q8_0Lanes || lay.kind == ActKind::Q8_KLanes)
    quantize_lanes(lay, x, ldx, n_in, t0, t1, act);
  else
    quantize_rows(lay, x, ldx, n_in, t0, t1, act);
}

int64_t avx512_scratch_bytes(DType type, int64_t n_in) {
  switch (type) {
    case DType::Q8_0: case DType::Q4_0:
      return round_up64(int64_t(sizeof(float)) * kFusedRows * (n_in / 32));  // fused_scales
    case DType::Q5_0:  // fused_scales, then the rows rebuilt as Q8_0
      return round_up64(int64_t(sizeof(float)) * kFusedRows * (n_in / 32)) +
             round_up64(kFusedRows * (n_in / 32) * int64_t(sizeof(BlockQ8_0)));
    case DType::Q3_K: case DType::Q4_K: case DType::Q6_K:
      return kTileRows * lanes_prep_row_bytes(n_in);
    case DType::F32: case DType::F16: case DType::BF16:
      return float_scratch_bytes<Avx512Vec>();
    default:
      return 0;
  }
}

void avx512_gemm(const GemmArgs& a, int64_t r0, int64_t r1, uint8_t* scratch) {
  if (a.act_layout.kind == ActKind::Q8_0Lanes || a.act_layout.kind == ActKind::Q8_KLanes) {
    if (a.act_layout.kind == ActKind::Q8_0Lanes)
      gemm_fused(a, r0, r1, scratch);
    else
      gemm_lanes(a, r0, r1, scratch);
    if (a.act_layout.lane_tokens < a.n_tokens) {
      if (a.type == DType::Q4_0 || a.type == DType::Q8_0) gemm_q32_rows(a, rows_view(a), r0, r1);
      else gemm_int_classic<OpsAvx512>(a, rows_view(a), r0, r1);
    }
    return;
  }
  if (a.type == DType::F32 || a.type == DType::F16 || a.type == DType::BF16) return gemm_float<Avx512Vec>(a, r0, r1, scratch);
  if (a.interleaved16) return gemm_interleaved(a, rows_view(a), r0, r1);
  switch (a.type) {
    case DType::Q4_0:
    case DType::Q8_0:
      gemm_q32_rows(a, rows_view(a), r0, r1);
      break;
    default: gemm_int_classic<OpsAvx512>(a, rows_view(a), r0, r1); break;
  }
}

const KernelTable kAvx512Table = {"avx512", x86_has_kernel, avx512_act_layout, avx512_quantize,
                                  avx512_scratch_bytes, avx512_gemm};

}  // namespace

const KernelTable& table_avx512() { return kAvx512Table; }

}  // namespace tern::kern
