// K-quants (Q4_K, Q5_K, Q6_K) and their activation format Q8_K: 256-element super-blocks whose
// sub-blocks carry small integer scales, themselves scaled by one f16 per super-block.
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

// Asymmetric quantization of n values to 0..nmax: x ~= scale * L - the_min (the_min >= 0).
// Starts from the min/max grid, then tries nstep+1 scales around it and refits scale and min
// by weighted least squares for each candidate L, keeping the lowest weighted squared error.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep) {
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
    best_err += weights[i] * (diff * diff);
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
        err += weights[i] * (diff * diff);
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
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
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

}  // namespace

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
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, rdelta, nstep);
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
    float max = 0, amax = 0;
    for (int j = 0; j < kQK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
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
