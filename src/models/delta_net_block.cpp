#include "models/delta_net_block.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/norm.h"
#include "models/tensor_names.h"
#include "ops/ops.h"

namespace tern {

namespace {

struct Dims {
  int64_t S, Hk, Hv, r, C, DV, K;
};
Dims dims(const HParams& hp) {
  const HParams::Ssm& s = hp.ssm;
  Dims d;
  d.S = s.d_state;
  d.Hk = s.n_group;
  d.Hv = s.dt_rank;
  d.r = d.Hv / d.Hk;
  d.DV = s.d_inner;
  d.C = s.conv_channels();  // 2 Hk S + Hv S
  d.K = s.d_conv;
  return d;
}

inline float dn_silu(float v) { return v / (1.0f + std::exp(-v)); }
inline float dn_softplus(float v) { return v > 20.0f ? v : std::log(1.0f + std::exp(v)); }  // ggml's

}  // namespace

DeltaNetWeights bind_delta_net(WeightLoader& ld, const HParams& hp, int64_t il, const std::string& path) {
  const Dims d = dims(hp);
  const int64_t E = hp.n_embd;
  DeltaNetWeights L;
  const std::string qkv = tensor_name(Tensor::AttnQkv, il), ssm_in = tensor_name(Tensor::SsmIn, il);
  if (ld.has(qkv) || !ld.has(ssm_in)) {
    if (!ld.has(qkv))
      fail(path, ": layer ", il, " is a gated delta-net layer but the file has neither ", qkv, " (with ",
           tensor_name(Tensor::AttnGate, il), ") nor ", ssm_in);
    L.qkv = Linear{qkv, ld.matmul(qkv, E, d.C)};
    const std::string gate = tensor_name(Tensor::AttnGate, il);
    L.gate = Linear{gate, ld.matmul(gate, E, d.DV)};
  } else {
    L.qkvz = Linear{ssm_in, ld.matmul(ssm_in, E, d.C + d.DV)};
  }
  const std::string ba = tensor_name(Tensor::SsmBetaAlpha, il);
  L.ba = Linear{ba, ld.matmul(ba, E, 2 * d.Hv)};
  L.conv = ld.vectors(tensor_name(Tensor::SsmConv1d, il), d.K, d.C, "conv1d weights");
  L.dt_bias = ld.vector(tensor_name(Tensor::SsmDt, il, "bias"), d.Hv, "time-step biases");
  const std::string a = tensor_name(Tensor::SsmA, il, "");
  L.a = ld.vector(a, d.Hv, "ssm_a");
  if (L.a)
    for (int64_t h = 0; h < d.Hv; ++h)
      if (!(L.a[h] <= 0.0f))  // (a decaying state)
        fail(path, ": ", a, " holds ", L.a[h], " at value head ", h,
             ": the gated delta-net's ssm_a must be <= 0 (converters store -exp(A_log))");
  L.norm = ld.vector(tensor_name(Tensor::SsmNorm, il), d.S, "norm weights");
  const std::string out = tensor_name(Tensor::SsmOut, il);
  L.out = Linear{out, ld.matmul(out, d.DV, E)};
  return L;
}

void DeltaNetBlock::reserve(const HParams& hp, int64_t n_tokens) {
  const Dims d = dims(hp);
  const size_t T = size_t(n_tokens);
  qkv_.assign(T * size_t(d.C), 0.0f);
  z_.assign(T * size_t(d.DV), 0.0f);
  ba_.assign(T * size_t(2 * d.Hv), 0.0f);
  qkvz_.clear();  // (older files only: sized at their first pass)
  conv_.assign(T * size_t(d.C), 0.0f);
  g_.assign(T * size_t(d.Hv), 0.0f);
  beta_.assign(T * size_t(d.Hv), 0.0f);
  y_.assign(T * size_t(d.DV), 0.0f);
}

void DeltaNetBlock::run(const DeltaNetWeights& L, const HParams& hp, int64_t il, std::span<const SeqBatch> seqs,
                        KvStore& kv, const float* xn, float* out, int64_t T, ThreadPool& pool,
                        const LinearHooks& hooks) {
  const int64_t E = hp.n_embd;
  const Dims d = dims(hp);
  const int64_t S = d.S, Hk = d.Hk, Hv = d.Hv, r = d.r, C = d.C, DV = d.DV, K = d.K;
  TERN_ASSERT_MSG(int64_t(qkv_.size()) >= T * C, "DeltaNetBlock step larger than reserve()");

  // The projections from one quantized copy of xn: q/k/v, z and b/a.
  if (L.qkv.present()) {
    const Linear* ls[] = {&L.qkv, &L.gate, &L.ba};
    float* const ys[] = {qkv_.data(), z_.data(), ba_.data()};
    const int64_t lds[] = {C, DV, 2 * Hv};
    apply_linears_shared(ls, ys, lds, xn, E, T, pool, RowsDone{}, InputRmsNorm{}, hooks);
  } else {
    // ssm_in's rows per key head: q (S), k (S), v (r S), z (r S); regrouped as attn_qkv's
    // (every q, every k, every v) and attn_gate's (every z), value heads in the same order.
    const int64_t W = C + DV, G = 2 * S + 2 * r * S;
    if (int64_t(qkvz_.size()) < T * W) qkvz_.assign(size_t(int64_t(qkv_.size()) / C * W), 0.0f);
    const Linear* ls[] = {&L.qkvz, &L.ba};
    float* const ys[] = {qkvz_.data(), ba_.data()};
    const int64_t lds[] = {W, 2 * Hv};
    apply_linears_shared(ls, ys, lds, xn, E, T, pool, RowsDone{}, InputRmsNorm{}, hooks);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < Hk; ++g) {
        const float* src = qkvz_.data() + t * W + g * G;
        float* row = qkv_.data() + t * C;
        std::copy_n(src, S, row + g * S);
        std::copy_n(src + S, S, row + Hk * S + g * S);
        std::copy_n(src + 2 * S, r * S, row + 2 * Hk * S + g * r * S);
        std::copy_n(src + 2 * S + r * S, r * S, z_.data() + t * DV + g * r * S);
      }
  }

  // The causal conv over q, k and v per channel, each sequence from its window state (then left
  // holding its last K - 1 inputs), the taps oldest first (as ggml's ssm_conv sums them), then
  // silu.
  pool.parallel_for(C, [&](int64_t c0, int64_t c1, int) {
    int64_t t0 = 0;
    const float* src[64];  // the K inputs of a token, oldest first (d_conv <= 64, hparams.cpp)
    for (const auto& sq : seqs) {
      const int64_t n = int64_t(sq.tokens.size());
      float* win = kv.state(il, sq.state_slot);  // [K - 1][C], oldest first
      const float* in = qkv_.data() + t0 * C;
      auto input = [&](int64_t j) { return j < 0 ? win + (K - 1 + j) * C : in + j * C; };
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t k = 0; k < K; ++k) src[k] = input(i - (K - 1) + k);
        float* o = conv_.data() + (t0 + i) * C;
        for (int64_t c = c0; c < c1; ++c) {
          const float* w = L.conv + c * K;
          float acc = 0.0f;
          for (int64_t k = 0; k < K; ++k) acc += src[k][c] * w[k];
          o[c] = dn_silu(acc);
        }
      }
      for (int64_t k = 0; k + 1 < K; ++k) {
        const float* from = input(n - (K - 1) + k);
        if (from != win + k * C) std::copy(from + c0, from + c1, win + k * C + c0);
      }
      t0 += n;
    }
  });

  // q and k L2-normalised per head (ggml's l2_norm: the squares summed in double, divided by
  // max(norm, eps)); beta = sigmoid(b); g = softplus(a + dt_bias) ssm_a.
  for (int64_t t = 0; t < T; ++t) {
    float* row = conv_.data() + t * C;
    for (int64_t h = 0; h < 2 * Hk; ++h) {
      float* x = row + h * S;
      double sum = 0.0;
      for (int64_t i = 0; i < S; ++i) sum += double(x[i] * x[i]);
      const float scale = 1.0f / std::max(std::sqrt(float(sum)), hp.rms_eps);
      for (int64_t i = 0; i < S; ++i) x[i] *= scale;
    }
    const float* ba = ba_.data() + t * 2 * Hv;
    for (int64_t h = 0; h < Hv; ++h) {
      const int64_t g = h / r, j = h % r;
      const float b = ba[g * 2 * r + j], a = ba[g * 2 * r + r + j];
      beta_[size_t(t * Hv + h)] = 1.0f / (1.0f + std::exp(-b));
      g_[size_t(t * Hv + h)] = dn_softplus(a + L.dt_bias[h]) * L.a[h];
    }
  }

  // The gated delta rule, value heads in parallel, each sequence from its state.
  const float qscale = 1.0f / std::sqrt(float(S));
  pool.parallel_for(Hv, [&](int64_t h0, int64_t h1, int) {
    int64_t t0 = 0;
    for (const auto& sq : seqs) {
      const int64_t n = int64_t(sq.tokens.size());
      const float* row = conv_.data() + t0 * C;
      GatedDeltaArgs a{row,
                       row + Hk * S,
                       C,
                       row + 2 * Hk * S,
                       C,
                       g_.data() + t0 * Hv,
                       beta_.data() + t0 * Hv,
                       Hv,
                       kv.state(il, sq.state_slot) + (K - 1) * C,
                       y_.data() + t0 * DV,
                       DV,
                       n,
                       S,
                       r,
                       qscale};
      gated_delta(a, h0, h1);
      t0 += n;
    }
  });

  // The output norm per value head, gated by silu(z).
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hv; ++h) {
      float* y = y_.data() + t * DV + h * S;
      const float* z = z_.data() + t * DV + h * S;
      rms_norm_row(y, L.norm, y, S, hp.rms_eps);
      for (int64_t i = 0; i < S; ++i) y[i] *= dn_silu(z[i]);
    }

  apply_linear(L.out, y_.data(), DV, T, out, E, pool, hooks);
}

}  // namespace tern
