#include "ops/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tern {

void rms_norm(const float* x, const float* weight, float* out, int64_t n_tokens, int64_t n,
              float eps, ThreadPool& pool) {
  auto body = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* xt = x + t * n;
      float* ot = out + t * n;
      float ss = 0.0f;
      for (int64_t i = 0; i < n; ++i) ss += xt[i] * xt[i];
      const float scale = 1.0f / std::sqrt(ss / float(n) + eps);
      for (int64_t i = 0; i < n; ++i) ot[i] = xt[i] * scale * weight[i];
    }
  };
  // Small row counts: the pool's fork/join costs more than the work.
  if (n_tokens * n < 16384) {
    body(0, n_tokens);
    return;
  }
  pool.parallel_for(n_tokens, [&](int64_t b, int64_t e, int) { body(b, e); });
}

void rope_norm(float* x, const int32_t* positions, int64_t n_tokens, int64_t n_heads,
               int64_t head_dim, int64_t n_rot, float freq_base) {
  const float theta_scale = std::pow(freq_base, -2.0f / float(n_rot));
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float pos = float(positions[t]);
    for (int64_t h = 0; h < n_heads; ++h) {
      float* xh = x + t * n_heads * head_dim + h * head_dim;
      float theta = pos;
      for (int64_t i = 0; i < n_rot; i += 2) {
        const float c = std::cos(theta), s = std::sin(theta);
        const float x0 = xh[i], x1 = xh[i + 1];
        xh[i] = x0 * c - x1 * s;
        xh[i + 1] = x0 * s + x1 * c;
        theta *= theta_scale;
      }
    }
  }
}

void swiglu(const float* gate, const float* up, float* out, int64_t n, ThreadPool& pool) {
  auto body = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  };
  if (n < 32768) {
    body(0, n);
    return;
  }
  pool.parallel_for(n, [&](int64_t b, int64_t e, int) { body(b, e); });
}

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

namespace {

// One query row of one head: online softmax over positions 0..n_ctx-1.
void attend_row(const AttentionArgs& a, int64_t i, int64_t h, float* acc) {
  const int64_t hd = a.head_dim;
  const int64_t kvh = h / (a.n_head / a.n_head_kv);
  const float* q = a.q + i * a.ldq + h * hd;
  float* out = a.out + i * a.ldo + h * hd;
  const int64_t n_ctx = a.n_past + i + 1;
  float m = -INFINITY, l = 0.0f;
  std::fill(acc, acc + hd, 0.0f);
  for (int64_t p = 0; p < n_ctx; ++p) {
    const int64_t slot = a.slots[p];
    const float* k = a.k_base + slot * a.kv_row + kvh * hd;
    float s = 0.0f;
    for (int64_t d = 0; d < hd; ++d) s += q[d] * k[d];
    s *= a.scale;
    const float* v = a.v_base + slot * a.kv_row + kvh * hd;
    if (s > m) {
      // New maximum: rescale what was accumulated so far.
      const float r = std::exp(m - s);
      l = l * r + 1.0f;
      for (int64_t d = 0; d < hd; ++d) acc[d] = acc[d] * r + v[d];
      m = s;
    } else {
      const float w = std::exp(s - m);
      l += w;
      for (int64_t d = 0; d < hd; ++d) acc[d] += w * v[d];
    }
  }
  const float inv = 1.0f / l;
  for (int64_t d = 0; d < hd; ++d) out[d] = acc[d] * inv;
}

}  // namespace

void attention(std::span<const AttentionArgs> seqs, ThreadPool& pool) {
  int64_t n_items = 0;
  for (const auto& a : seqs) n_items += a.n_tokens * a.n_head;
  pool.run([&](int ith, int nth) {
    thread_local std::vector<float> acc;
    int64_t max_hd = 0;
    for (const auto& a : seqs) max_hd = std::max(max_hd, a.head_dim);
    acc.resize(size_t(max_hd));
    // Items are interleaved across threads (item % nth) so that long and short rows of a
    // causal prefill are spread evenly.
    int64_t item = 0;
    for (const auto& a : seqs) {
      for (int64_t i = 0; i < a.n_tokens; ++i)
        for (int64_t h = 0; h < a.n_head; ++h, ++item)
          if (item % nth == ith) attend_row(a, i, h, acc.data());
    }
  });
  (void)n_items;
}

}  // namespace tern
