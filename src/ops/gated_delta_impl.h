#pragma once
// Qwen3-Next's gated delta rule (attention_iface.h, GatedDeltaArgs) for one ISA, on the vector
// type of attention_tile_impl.h (16 floats). Per value head and token, four state rows at a time
// share the loads of k and q, and each row is read twice and written once:
//   pass 1: s_j = sum_i M[j][i] k[i] (the decay applied to the sum: exp(g) s_j)
//           d_j = (v[j] - exp(g) s_j) beta
//   pass 2: M[j][i] = M[j][i] exp(g) + k[i] d_j, and o[j] = scale sum_i M[j][i] q[i]
// The same arithmetic as the scalar reference (ops.cpp, gated_delta_ref, ggml's order) but for
// where the decay multiplies and the order of the sums (16-lane partial sums, reduced at the end;
// a row's length not a multiple of 16: the tail one lane at a time). Included by the per-ISA
// attention_*.cpp files only.
#include <cmath>
#include <cstdint>

#include "ops/attention_tile_impl.h"

namespace tern::attn {

inline void gated_delta_rows(float* M, int64_t S, const float* q, const float* k, const float* v, float decay,
                             float beta, float scale, float* o, int64_t j0, int64_t n_rows) {
  const int64_t S16 = S - S % 16;
  float* row[4];
  V acc[4];
  for (int64_t r = 0; r < n_rows; ++r) {
    row[r] = M + (j0 + r) * S;
    acc[r] = vzero();
  }
  for (int64_t i = 0; i < S16; i += 16) {
    const V vk = vload(k + i);
    for (int64_t r = 0; r < n_rows; ++r) acc[r] = vfma(vload(row[r] + i), vk, acc[r]);
  }
  float d[4];
  V vd[4];
  for (int64_t r = 0; r < n_rows; ++r) {
    float sum = vhsum(acc[r]);
    for (int64_t i = S16; i < S; ++i) sum += row[r][i] * k[i];
    d[r] = (v[j0 + r] - decay * sum) * beta;
    vd[r] = vset1(d[r]);
    acc[r] = vzero();
  }
  const V vdecay = vset1(decay);
  for (int64_t i = 0; i < S16; i += 16) {
    const V vk = vload(k + i), vq = vload(q + i);
    for (int64_t r = 0; r < n_rows; ++r) {
      const V m = vfma(vk, vd[r], vmul(vload(row[r] + i), vdecay));
      vstore(row[r] + i, m);
      acc[r] = vfma(m, vq, acc[r]);
    }
  }
  for (int64_t r = 0; r < n_rows; ++r) {
    float out = vhsum(acc[r]);
    for (int64_t i = S16; i < S; ++i) {
      row[r][i] = row[r][i] * decay + k[i] * d[r];
      out += row[r][i] * q[i];
    }
    o[j0 + r] = out * scale;
  }
}

inline void gated_delta_impl(const GatedDeltaArgs& a, int64_t h0, int64_t h1) {
  const int64_t S = a.head_dim;
  for (int64_t h = h0; h < h1; ++h) {
    float* M = a.s + h * S * S;
    const int64_t kh = h / a.heads_per_key;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const float* q = a.q + t * a.ldqk + kh * S;
      const float* k = a.k + t * a.ldqk + kh * S;
      const float* v = a.v + t * a.ldv + h * S;
      const float decay = std::exp(a.g[t * a.ldgb + h]), beta = a.beta[t * a.ldgb + h];
      float* o = a.o + t * a.ldo + h * S;
      int64_t j = 0;
      for (; j + 4 <= S; j += 4) gated_delta_rows(M, S, q, k, v, decay, beta, a.scale, o, j, 4);
      if (j < S) gated_delta_rows(M, S, q, k, v, decay, beta, a.scale, o, j, S - j);
    }
  }
}

}  // namespace tern::attn
