// RoPE beyond the plain rotation (frequency factors, linear scaling, YaRN), the NeoX pair
// layout, and the small row-wise ops newer architectures add (head norms, biases, GeGLU,
// soft-capping). Scalar: each is a small fraction of a layer's time next to its matmuls.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/norm.h"
#include "ops/ops.h"

namespace tern {
namespace {

// YaRN's correction dimension for `n_rotations` full turns over the original context.
float yarn_corr_dim(int64_t n_rot, int64_t n_ctx_orig, float n_rotations, float base) {
  return float(n_rot) * std::log(float(n_ctx_orig) / (n_rotations * 2.0f * float(M_PI))) / (2.0f * std::log(base));
}

}  // namespace

void rope_table_ext(const int32_t* positions, int64_t n_tokens, const RopeParams& p, float* cs) {
  const int64_t n_rot = p.n_rot;
  if (!p.freq_factors && p.freq_scale == 1.0f && p.ext_factor == 0.0f && p.attn_factor == 1.0f) {
    rope_table(positions, n_tokens, n_rot, p.freq_base, cs);
    return;
  }
  float corr_lo = 0.0f, corr_hi = 0.0f;
  if (p.ext_factor != 0.0f) {
    const int64_t n_orig = p.n_ctx_orig > 0 ? p.n_ctx_orig : 1;
    corr_lo = std::max(0.0f, std::floor(yarn_corr_dim(n_rot, n_orig, p.beta_fast, p.freq_base)));
    corr_hi = std::min(float(n_rot - 1), std::ceil(yarn_corr_dim(n_rot, n_orig, p.beta_slow, p.freq_base)));
  }
  const float theta_scale = std::pow(p.freq_base, -2.0f / float(n_rot));
  for (int64_t t = 0; t < n_tokens; ++t) {
    float theta_base = float(positions[t]);  // pos * theta_scale^i, by repeated multiplication
    float* ct = cs + t * n_rot;
    for (int64_t i = 0; i < n_rot / 2; ++i) {
      const float extrap = p.freq_factors ? theta_base / p.freq_factors[i] : theta_base;
      const float interp = p.freq_scale * extrap;
      float theta = interp, mscale = p.attn_factor;
      if (p.ext_factor != 0.0f) {
        const float y = (float(i) - corr_lo) / std::max(0.001f, corr_hi - corr_lo);
        const float ramp = (1.0f - std::min(1.0f, std::max(0.0f, y))) * p.ext_factor;
        theta = interp * (1.0f - ramp) + extrap * ramp;
        mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
      }
      ct[2 * i] = std::cos(theta) * mscale;
      ct[2 * i + 1] = std::sin(theta) * mscale;
      theta_base *= theta_scale;
    }
  }
}

void rope_neox_table(float* x, int64_t ldx, const float* cs, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                     int64_t n_rot) {
  TERN_ASSERT(n_rot % 2 == 0 && n_rot <= head_dim);
  const int64_t half = n_rot / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* ct = cs + t * n_rot;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* xh = x + t * ldx + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float c = ct[2 * i], s = ct[2 * i + 1];
        const float x0 = xh[i], x1 = xh[i + half];
        xh[i] = x0 * c - x1 * s;
        xh[i + half] = x0 * s + x1 * c;
      }
    }
  }
}

void rms_norm_heads(float* x, int64_t ldx, const float* weight, int64_t n_tokens, int64_t n_heads,
                    int64_t head_dim, float eps) {
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      float* xh = x + t * ldx + h * head_dim;
      rms_norm_row(xh, weight, xh, head_dim, eps);
    }
}

void add_bias_cols(float* y, int64_t ldy, const float* bias, int64_t n_tokens, int64_t c0, int64_t c1) {
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t c = c0; c < c1; ++c) y[t * ldy + c] += bias[c];
}

void geglu(const float* gate, const float* up, float* out, int64_t n) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float gelu = 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * g * (1.0f + 0.044715f * g * g)));
    out[i] = gelu * up[i];
  }
}

void swiglu_oai(const float* gate, const float* up, float* out, int64_t n) {
  constexpr float kAlpha = 1.702f, kLimit = 7.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], kLimit);
    const float u = std::clamp(up[i], -kLimit, kLimit);
    out[i] = g / (1.0f + std::exp(-kAlpha * g)) * (u + 1.0f);
  }
}

void reglu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] > 0.0f ? gate[i] * up[i] : 0.0f;
}

void softcap_inplace(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

}  // namespace tern
