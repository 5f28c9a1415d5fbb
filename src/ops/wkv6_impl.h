#pragma once
// RWKV-6's WKV recurrence (attention_iface.h, Wkv6Args) for one ISA, on the vector type of
// attention_tile_impl.h (16 floats), in ggml's SIMD order: per head and token, a strip of up to
// 64 value channels keeps its outputs in registers while the state's rows (key channels) go by
// one at a time, each row's k, r, u and w broadcast; kv = v k, y += (kv u + S) r and
// S = S w + kv as fused multiply-adds. Each output is summed over the rows in order, as in the
// scalar reference; value channels past the last whole vector (a head size that is not a
// multiple of 16) run the same fused operations one lane at a time (fmaf: the instruction, as
// every file including this one is built with FMA; a C function, no inline std:: copy, see
// attention_iface.h). Included by the per-ISA attention_*.cpp files only.
#include <math.h>

#include <cstdint>

#include "ops/attention_tile_impl.h"

namespace tern::attn {

inline void wkv6_impl(const Wkv6Args& a, int64_t h0, int64_t h1) {
  const int64_t N = a.head_size, N16 = N - N % 16;
  for (int64_t h = h0; h < h1; ++h) {
    float* S = a.s + h * N * N;
    const float* u = a.u + h * N;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const int64_t o = t * a.ld + h * N;
      const float *r = a.r + o, *k = a.k + o, *v = a.v + o, *w = a.w + o;
      float* y = a.y + t * a.ldy + h * N;
      for (int64_t j0 = 0; j0 < N16; j0 += 64) {
        const int64_t nv = N16 - j0 >= 64 ? 4 : (N16 - j0) / 16;
        V vv[4], acc[4];
        for (int64_t q = 0; q < nv; ++q) {
          vv[q] = vload(v + j0 + 16 * q);
          acc[q] = vzero();
        }
        for (int64_t i = 0; i < N; ++i) {
          const V ki = vset1(k[i]), ri = vset1(r[i]), ui = vset1(u[i]), wi = vset1(w[i]);
          float* row = S + i * N + j0;
          for (int64_t q = 0; q < nv; ++q) {
            const V kv = vmul(vv[q], ki);
            const V prev = vload(row + 16 * q);
            acc[q] = vfma(vfma(kv, ui, prev), ri, acc[q]);
            vstore(row + 16 * q, vfma(prev, wi, kv));
          }
        }
        for (int64_t q = 0; q < nv; ++q) vstore(y + j0 + 16 * q, acc[q]);
      }
      for (int64_t j = N16; j < N; ++j) {
        float acc = 0.0f;
        for (int64_t i = 0; i < N; ++i) {
          float& s = S[i * N + j];
          const float kv = v[j] * k[i];
          const float prev = s;
          acc = fmaf(fmaf(kv, u[i], prev), r[i], acc);
          s = fmaf(prev, w[i], kv);
        }
        y[j] = acc;
      }
    }
  }
}

}  // namespace tern::attn
