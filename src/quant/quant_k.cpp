// K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and their activation format Q8_K: 256-element
// super-blocks whose sub-blocks carry small integer scales, themselves scaled by one f16 per
// super-block.
//
// Dequantizers evaluate ggml's expressions in ggml's order (bit-exact values). Quantizers
// follow llama.cpp's reference, non-imatrix algorithms: a weighted least-squares search for
// each sub-block's scale (and min), then the sub-block scales are quantized and the elements
// re-quantized against the scales actually stored.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/fp16.h"
#include "quant/quant_codecs.h"
#include "quant/quant_traits.h"

namespace tern {

void q3_k_scales(const uint8_t* s, uint8_t* sc16) {
  for (int j = 0; j < kQK_K / 16; ++j) {
    const int low = j < 8 ? s[j] & 0x0F : s[j - 8] >> 4;
    const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    sc16[j] = static_cast<uint8_t>(low | high << 4);
  }
}

void q4_k_scale_min(int j, const uint8_t* s, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

void q4_k_pack_scales(const uint8_t* sc, const uint8_t* m, uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
    s[j + 4] = static_cast<uint8_t>((m[j] & 63) | (m[j + 4] >> 4) << 6);
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0F) | (m[j + 4] & 0x0F) << 4);
  }
}

}  // namespace tern

namespace tern::codec {
namespace {

constexpr float kGroupMaxEps = 1e-15f;

inline int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// How make_qkx2_quants ranks candidate grids: llama.cpp's Q4_K / Q5_K references by the
// weighted squared error, its Q2_K reference by the weighted absolute error (its `use_mad`).
// The choice changes which grid wins, so each type must use its own to stay byte-exact.
enum class FitError { kSquared, kAbsolute };

inline float fit_error_term(FitError metric, float weight, float diff) {
  return metric == FitError::kAbsolute ? weight * std::fabs(diff) : weight * (diff * diff);
}

// Asymmetric quantization of n values to 0..nmax: x ~= scale * L - the_min (the_min >= 0).
// Starts from the min/max grid, then tries nstep+1 scales around it and refits scale and min
// by weighted least squares for each candidate L, keeping the lowest weighted error (`metric`).
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep,
                       FitError metric) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;  // the min only ever lowers the grid: zero stays representable
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.0f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_err = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(clamp_int(l, 0, nmax));
    const float diff = scale * L[i] + min - x[i];
    best_err += fit_error_term(metric, weights[i], diff);
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float err = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * Laux[i] + this_min - x[i];
        err += fit_error_term(metric, weights[i], diff);
      }
      if (err < best_err) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_err = err;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// Symmetric quantization of n values to -nmax..nmax-1 (stored + nmax), weights x^2: the value
// of largest magnitude sets the sign of the grid; 18 grid stretches around nmax are tried and
// the one with the best least-squares fit (max sumlx^2 / suml2) wins.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  float amax;
  const float max = signed_absmax(x, n, &amax);
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = static_cast<int8_t>(l + nmax);
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Symmetric quantization of n values to -nmax..nmax-1 (stored + nmax), weights x^2, for Q3_K.
// Starts from the grid that maps the value of largest magnitude to -nmax, then sweeps the
// elements (at most 5 times): each moves to the level that fits it best under the
// least-squares scale of the others, and the move is kept when it raises sumlx^2 / suml2,
// i.e. lowers the weighted squared error at the best scale. Returns that scale.
float make_q3_quants(int n, int nmax, const float* x, int8_t* L) {
  float amax;
  const float max = signed_absmax(x, n, &amax);
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  const float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int sweep = 0; sweep < 5; ++sweep) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];  // the sums without element i
      if (!(slx > 0)) continue;             // no positive fit of the others to align with
      float sl2 = suml2 - w * L[i] * L[i];
      const int new_l = clamp_int(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
      if (new_l == L[i]) continue;
      slx += w * x[i] * new_l;
      sl2 += w * new_l * new_l;
      if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
        L[i] = static_cast<int8_t>(new_l);
        sumlx = slx;
        suml2 = sl2;
        ++n_changed;
      }
    }
    if (!n_changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0 ? sumlx / suml2 : 0.0f;
}

}  // namespace

namespace {

// Q2_K / Q3_K's low two bits of the 256 quants (see BlockQ2_K): byte 32n + l of qs holds
// element 128n + 32i + l in bits 2i..2i+1.
void pack_2bit_quants(const uint8_t* L, uint8_t* qs) {
  for (int half = 0; half < 2; ++half) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t* e = L + 128 * half + l;
      qs[32 * half + l] = static_cast<uint8_t>(e[0] | e[32] << 2 | e[64] << 4 | e[96] << 6);
    }
  }
}

}  // namespace

// Sub-block j (elements 16j..16j+15) = group (j % 8) / 2 of half j / 8, first or second 16
// bytes of the half's 32 by j % 2.
void q2_k_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ2_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_f32(b[i].d);
    const float dmin = fp16_to_f32(b[i].dmin);
    float* y = dst + i * kQK_K;
    for (int j = 0; j < kQK_K / 16; ++j) {
      const uint8_t* q = b[i].qs + 32 * (j / 8) + 16 * (j % 2);
      const int shift = 2 * ((j % 8) / 2);
      const uint8_t sc = b[i].scales[j];
      const float dl = d * (sc & 0x0F), ml = dmin * (sc >> 4);
      for (int l = 0; l < 16; ++l) y[16 * j + l] = dl * ((q[l] >> shift) & 3) - ml;
    }
  }
}

// llama.cpp's Q2_K reference: each sub-block of 16 fitted to 0..3 by make_qkx2_quants with
// weights |x| and the absolute error (search range -0.5 + 0.1 * is, 16 steps); scales and mins
// quantized to 4 bits against d = max scale / 15 and dmin = max min / 15; the elements
// re-quantized against the scales as stored.
void q2_k_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ2_K*>(dst);
  uint8_t L[kQK_K], Laux[16];
  float weights[16], scales[kQK_K / 16], mins[kQK_K / 16];
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    BlockQ2_K& y = b[i];
    float max_scale = 0, max_min = 0;  // scales are >= 0 since the min is subtracted
    for (int j = 0; j < kQK_K / 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15,
                                   FitError::kAbsolute);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    // Nibbles are nearest_int truncated to a byte, as llama.cpp (0..15 here anyway).
    if (max_scale > 0) {
      const float iscale = 15.0f / max_scale;
      for (int j = 0; j < kQK_K / 16; ++j) y.scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      y.d = f32_to_fp16(max_scale / 15.0f);
    } else {
      std::memset(y.scales, 0, sizeof(y.scales));
      y.d = f32_to_fp16(0.0f);
    }
    if (max_min > 0) {
      const float iscale = 15.0f / max_min;
      for (int j = 0; j < kQK_K / 16; ++j)
        y.scales[j] = static_cast<uint8_t>(y.scales[j] | nearest_int(iscale * mins[j]) << 4);
      y.dmin = f32_to_fp16(max_min / 15.0f);
    } else {
      y.dmin = f32_to_fp16(0.0f);
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      const float d = fp16_to_f32(y.d) * (y.scales[j] & 0x0F);
      if (!d) continue;  // keeps the search's L, as llama.cpp
      const float dm = fp16_to_f32(y.dmin) * (y.scales[j] >> 4);
      for (int l = 0; l < 16; ++l)
        L[16 * j + l] = static_cast<uint8_t>(clamp_int(nearest_int((x[16 * j + l] + dm) / d), 0, 3));
    }
    pack_2bit_quants(L, y.qs);
  }
}

// Q2_K's element order; the third bit of element 128n + 32i + l is bit 4n + i of hmask[l], and
// a clear bit means q - 4.
void q3_k_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ3_K*>(src);
  uint8_t sc[kQK_K / 16];
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_f32(b[i].d);
    q3_k_scales(b[i].scales, sc);
    float* y = dst + i * kQK_K;
    for (int j = 0; j < kQK_K / 16; ++j) {
      const uint8_t* q = b[i].qs + 32 * (j / 8) + 16 * (j % 2);
      const uint8_t* hm = b[i].hmask + 16 * (j % 2);
      const int group = (j % 8) / 2;
      const uint8_t high_bit = static_cast<uint8_t>(1u << (4 * (j / 8) + group));
      const float dl = d * (sc[j] - 32);
      for (int l = 0; l < 16; ++l) y[16 * j + l] = dl * (((q[l] >> (2 * group)) & 3) - (hm[l] & high_bit ? 0 : 4));
    }
  }
}

// llama.cpp's Q3_K reference: each sub-block of 16 fitted to -4..3 by make_q3_quants; the
// scale of largest magnitude maps to -32 (so d = 1 / iscale carries its sign) and all sixteen
// are stored as 6-bit sc = scale + 32; the elements re-quantized against the scales as stored.
void q3_k_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ3_K*>(dst);
  int8_t L[kQK_K];
  uint8_t low2[kQK_K], sc[kQK_K / 16];
  float scales[kQK_K / 16];
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    BlockQ3_K& y = b[i];
    float max_scale = 0, max_abs_scale = 0;
    for (int j = 0; j < kQK_K / 16; ++j) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    std::memset(y.scales, 0, sizeof(y.scales));
    if (max_scale != 0) {
      const float iscale = -32.0f / max_scale;
      for (int j = 0; j < kQK_K / 16; ++j) {
        // nearest_int truncated to int8 before clamping, as llama.cpp (within -32..32 anyway).
        const int8_t rounded = static_cast<int8_t>(nearest_int(iscale * scales[j]));
        const int stored = clamp_int(rounded, -32, 31) + 32;
        y.scales[j % 8] = static_cast<uint8_t>(y.scales[j % 8] | (stored & 0x0F) << (4 * (j / 8)));
        y.scales[8 + j % 4] = static_cast<uint8_t>(y.scales[8 + j % 4] | (stored >> 4) << (2 * (j / 4)));
      }
      y.d = f32_to_fp16(1 / iscale);
    } else {
      y.d = f32_to_fp16(0.0f);
    }
    q3_k_scales(y.scales, sc);
    for (int j = 0; j < kQK_K / 16; ++j) {
      const float d = fp16_to_f32(y.d) * (sc[j] - 32);
      if (!d) continue;  // keeps the search's L, as llama.cpp
      for (int l = 0; l < 16; ++l)
        L[16 * j + l] = static_cast<int8_t>(clamp_int(nearest_int(x[16 * j + l] / d), -4, 3) + 4);
    }
    std::memset(y.hmask, 0, sizeof(y.hmask));
    for (int k = 0; k < kQK_K; ++k) {  // L is 0..7 here
      if (L[k] > 3) y.hmask[k % 32] = static_cast<uint8_t>(y.hmask[k % 32] | 1u << (k / 32));
      low2[k] = static_cast<uint8_t>(L[k] & 3);
    }
    pack_2bit_quants(low2, y.qs);
  }
}

namespace {

// Q4_K, and Q5_K (Block = BlockQ5_K) whose bit 4 of element l of sub-block j is bit j of qh[l].
template <class Block>
void k4_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const Block*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_f32(b[i].d);
    const float dmin = fp16_to_f32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    float* y = dst + i * kQK_K;
    for (int j = 0; j < kQK_K / 64; ++j) {  // 32 bytes of qs = sub-blocks 2j (lo), 2j+1 (hi)
      uint8_t sc, m;
      q4_k_scale_min(2 * j, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      q4_k_scale_min(2 * j + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      if constexpr (std::is_same_v<Block, BlockQ5_K>) {
        const uint8_t u1 = uint8_t(1u << (2 * j)), u2 = uint8_t(2u << (2 * j));
        for (int l = 0; l < 32; ++l) y[l] = d1 * ((q[l] & 0x0F) + (b[i].qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; ++l) y[32 + l] = d2 * ((q[l] >> 4) + (b[i].qh[l] & u2 ? 16 : 0)) - m2;
      } else {
        for (int l = 0; l < 32; ++l) y[l] = d1 * (q[l] & 0x0F) - m1;
        for (int l = 0; l < 32; ++l) y[32 + l] = d2 * (q[l] >> 4) - m2;
      }
      q += 32;
      y += 64;
    }
  }
}

}  // namespace

void q4_k_to_float(const void* src, float* dst, int64_t n) { k4_to_float<BlockQ4_K>(src, dst, n); }
void q5_k_to_float(const void* src, float* dst, int64_t n) { k4_to_float<BlockQ5_K>(src, dst, n); }

namespace {

// Q4_K / Q5_K's scales: each sub-block's scale and min by make_qkx2_quants to 0..nmax (weights
// rms(sub-block) + |x|: large values matter more; llama.cpp's search range rmin + rdelta * is,
// is = 0..nstep), quantized to 6 bits against the super-block's d / dmin, then L re-quantized
// against the scales as stored (6-bit, times f16 super-scales).
void k_quant_scales(const float* x, int nmax, float rmin, float rdelta, int nstep, uint8_t* L, uint8_t* scales12,
                    uint16_t* d_out, uint16_t* dmin_out) {
  uint8_t Laux[32];
  float weights[32], mins[kQK_K / 32], scales[kQK_K / 32];
  float max_scale = 0, max_min = 0;  // scales are >= 0 since the min is subtracted
  for (int j = 0; j < kQK_K / 32; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, rdelta, nstep,
                                 FitError::kSquared);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  uint8_t sc6[kQK_K / 32], m6[kQK_K / 32];
  for (int j = 0; j < kQK_K / 32; ++j) {
    // nearest_int then uint8 truncation, as llama.cpp (values are 0..63 here anyway).
    uint8_t ls = static_cast<uint8_t>(nearest_int(inv_scale * scales[j]));
    uint8_t lm = static_cast<uint8_t>(nearest_int(inv_min * mins[j]));
    sc6[j] = ls > 63 ? 63 : ls;
    m6[j] = lm > 63 ? 63 : lm;
  }
  q4_k_pack_scales(sc6, m6, scales12);
  *d_out = f32_to_fp16(max_scale / 63.0f);
  *dmin_out = f32_to_fp16(max_min / 63.0f);
  for (int j = 0; j < kQK_K / 32; ++j) {
    uint8_t sc, m;
    q4_k_scale_min(j, scales12, &sc, &m);
    const float d = fp16_to_f32(*d_out) * sc;
    if (!d) continue;
    const float dm = fp16_to_f32(*dmin_out) * m;
    for (int l = 0; l < 32; ++l)
      L[32 * j + l] = static_cast<uint8_t>(clamp_int(nearest_int((x[32 * j + l] + dm) / d), 0, nmax));
  }
}

}  // namespace

void q4_k_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_K*>(dst);
  uint8_t L[kQK_K];
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    BlockQ4_K& y = b[i];
    k_quant_scales(src + i * kQK_K, 15, -1.0f, 0.1f, 20, L, y.scales, &y.d, &y.dmin);
    uint8_t* q = y.qs;
    for (int j = 0; j < kQK_K; j += 64) {
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
      q += 32;
    }
  }
}

// Q4_K's algorithm with 5-bit quants (llama.cpp's search range for Q5_K: -0.5 + 0.1 * is, 16
// steps); bit 4 of each quant goes to qh.
void q5_k_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_K*>(dst);
  uint8_t L[kQK_K];
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    BlockQ5_K& y = b[i];
    k_quant_scales(src + i * kQK_K, 31, -0.5f, 0.1f, 15, L, y.scales, &y.d, &y.dmin);
    std::memset(y.qh, 0, sizeof(y.qh));
    uint8_t* ql = y.qs;
    for (int j = 0; j < kQK_K / 64; ++j) {
      const uint8_t u1 = uint8_t(1u << (2 * j)), u2 = uint8_t(2u << (2 * j));
      for (int l = 0; l < 32; ++l) {
        int l1 = L[64 * j + l], l2 = L[64 * j + 32 + l];
        if (l1 > 15) {
          l1 -= 16;
          y.qh[l] |= u1;
        }
        if (l2 > 15) {
          l2 -= 16;
          y.qh[l] |= u2;
        }
        ql[l] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
      ql += 32;
    }
  }
}

void q6_k_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ6_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_f32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    float* y = dst + i * kQK_K;
    for (int half = 0; half < 2; ++half) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

void q6_k_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ6_K*>(dst);
  int8_t L[kQK_K];
  float scales[kQK_K / 16];
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    BlockQ6_K& y = b[i];
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < kQK_K / 16; ++ib) {
      const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
      scales[ib] = scale;
      if (std::fabs(scale) > max_abs_scale) {
        max_abs_scale = std::fabs(scale);
        max_scale = scale;
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y, 0, sizeof(y));
      continue;
    }
    const float iscale = -128.0f / max_scale;
    y.d = f32_to_fp16(1 / iscale);
    for (int ib = 0; ib < kQK_K / 16; ++ib) {
      const int s = nearest_int(iscale * scales[ib]);
      y.scales[ib] = static_cast<int8_t>(s < 127 ? s : 127);
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      const float d = fp16_to_f32(y.d) * y.scales[j];
      if (!d) continue;
      for (int l = 0; l < 16; ++l)
        L[16 * j + l] = static_cast<int8_t>(clamp_int(nearest_int(x[16 * j + l] / d), -32, 31) + 32);
    }
    uint8_t* ql = y.ql;
    uint8_t* qh = y.qh;
    for (int j = 0; j < kQK_K; j += 128) {
      for (int l = 0; l < 32; ++l) {
        const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
        ql[l] = static_cast<uint8_t>((q1 & 0x0F) | ((q3 & 0x0F) << 4));
        ql[l + 32] = static_cast<uint8_t>((q2 & 0x0F) | ((q4 & 0x0F) << 4));
        qh[l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
      }
      ql += 64;
      qh += 32;
    }
  }
}

void q8_k_to_float(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i)
    for (int j = 0; j < kQK_K; ++j) dst[i * kQK_K + j] = b[i].d * b[i].qs[j];
}

// The value of largest magnitude maps to -127 (sign taken from the first such element), so
// q = nearest(x * -127 / max) stays within -127..127 and d = 1 / iscale carries the sign.
void q8_k_from_float(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    BlockQ8_K& y = b[i];
    float amax;
    const float max = signed_absmax(x, kQK_K, &amax);
    if (!amax) {
      std::memset(&y, 0, sizeof(y));
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < kQK_K; ++j) {
      const int v = nearest_int(iscale * x[j]);
      y.qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += y.qs[16 * j + l];
      y.bsums[j] = static_cast<int16_t>(sum);
    }
    y.d = 1 / iscale;
  }
}

}  // namespace tern::codec
