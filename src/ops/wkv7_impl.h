#pragma once
// RWKV-7's WKV recurrence (attention_iface.h, Wkv7Args) for one ISA, on the vector type of
// attention_tile_impl.h (16 floats): per head and token, four state rows at a time share the
// loads of a, w, k, b and r; each row's two dot products are 16-lane partial sums reduced at
// the end (a row's length not a multiple of 16: the tail one lane at a time, in the same order
// as the reference). Included by the per-ISA attention_*.cpp files only.
#include <cstdint>

#include "ops/attention_tile_impl.h"

namespace tern::attn {

inline void wkv7_rows(const Wkv7Args& a, float* S, const float* r, const float* w, const float* k, const float* v,
                      const float* aa, const float* b, float* y, int64_t i0, int64_t n_rows) {
  const int64_t N = a.head_size, N16 = N - N % 16;
  float* row[4];
  V sacc[4], acc[4];
  for (int64_t q = 0; q < n_rows; ++q) {
    row[q] = S + (i0 + q) * N;
    sacc[q] = vzero();
    acc[q] = vzero();
  }
  for (int64_t j = 0; j < N16; j += 16) {
    const V va = vload(aa + j);
    for (int64_t q = 0; q < n_rows; ++q) sacc[q] = vfma(va, vload(row[q] + j), sacc[q]);
  }
  float sa[4];
  for (int64_t q = 0; q < n_rows; ++q) {
    sa[q] = vhsum(sacc[q]);
    for (int64_t j = N16; j < N; ++j) sa[q] += aa[j] * row[q][j];
  }
  V vsa[4], vv[4];
  for (int64_t q = 0; q < n_rows; ++q) {
    vsa[q] = vset1(sa[q]);
    vv[q] = vset1(v[i0 + q]);
  }
  for (int64_t j = 0; j < N16; j += 16) {
    const V vw = vload(w + j), vk = vload(k + j), vb = vload(b + j), vr = vload(r + j);
    for (int64_t q = 0; q < n_rows; ++q) {
      const V s = vfma(vload(row[q] + j), vw, vfma(vv[q], vk, vmul(vsa[q], vb)));
      vstore(row[q] + j, s);
      acc[q] = vfma(s, vr, acc[q]);
    }
  }
  for (int64_t q = 0; q < n_rows; ++q) {
    float out = vhsum(acc[q]);
    for (int64_t j = N16; j < N; ++j) {
      row[q][j] = row[q][j] * w[j] + v[i0 + q] * k[j] + sa[q] * b[j];
      out += row[q][j] * r[j];
    }
    y[i0 + q] = out;
  }
}

inline void wkv7_impl(const Wkv7Args& a, int64_t h0, int64_t h1) {
  const int64_t N = a.head_size;
  for (int64_t h = h0; h < h1; ++h) {
    float* S = a.s + h * N * N;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const int64_t o = t * a.ld + h * N;
      float* y = a.y + t * a.ldy + h * N;
      int64_t i = 0;
      for (; i + 4 <= N; i += 4) wkv7_rows(a, S, a.r + o, a.w + o, a.k + o, a.v + o, a.a + o, a.b + o, y, i, 4);
      if (i < N) wkv7_rows(a, S, a.r + o, a.w + o, a.k + o, a.v + o, a.a + o, a.b + o, y, i, N - i);
    }
  }
}

}  // namespace tern::attn
