#include "models/ssm2_block.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "models/tensor_names.h"
#include "ops/ops.h"

namespace tern {

Ssm2Weights bind_ssm2(WeightLoader& ld, const HParams& hp, int64_t il, const std::string& path) {
  const HParams::Ssm& s = hp.ssm;
  const int64_t E = hp.n_embd, H = s.dt_rank, G = s.n_group, CC = s.conv_channels();
  Ssm2Weights L;
  L.in = Linear{tensor_name(Tensor::SsmIn, il), ld.matmul(tensor_name(Tensor::SsmIn, il), E, Ssm2Block::in_width(hp))};
  L.conv = ld.vectors(tensor_name(Tensor::SsmConv1d, il), s.d_conv, CC, "conv1d weights");
  L.conv_bias = ld.vector(tensor_name(Tensor::SsmConv1d, il, "bias"), CC, "conv1d biases");
  L.dt_bias = ld.vector(tensor_name(Tensor::SsmDt, il, "bias"), H, "time-step biases");
  // ssm_a and ssm_d are [1, H], as the converter stores them (one value per head).
  L.a = ld.vectors(tensor_name(Tensor::SsmA, il, ""), 1, H, "SSM A");
  if (L.a)
    for (int64_t i = 0; i < H; ++i)
      if (!(L.a[i] <= 0.0f))  // (a decaying state)
        fail(path, ": ", tensor_name(Tensor::SsmA, il, ""), " holds ", L.a[i], " at head ", i,
             ": Mamba-2's A must be <= 0 (converters store -exp(A_log))");
  L.d = ld.vectors(tensor_name(Tensor::SsmD, il, ""), 1, H, "SSM D");
  L.group_norm = ld.vectors(tensor_name(Tensor::SsmNorm, il), s.d_inner / G, G, "norm weights");
  L.out = Linear{tensor_name(Tensor::SsmOut, il), ld.matmul(tensor_name(Tensor::SsmOut, il), s.d_inner, E)};
  return L;
}

void Ssm2Block::reserve(const HParams& hp, int64_t n_tokens) {
  const size_t T = size_t(n_tokens);
  proj_.assign(T * size_t(in_width(hp)), 0.0f);
  xbc_.assign(T * size_t(hp.ssm.conv_channels()), 0.0f);
  dt_.assign(T * size_t(hp.ssm.dt_rank), 0.0f);
  y_.assign(T * size_t(hp.ssm.d_inner), 0.0f);
}

namespace {
inline float ssm2_block_silu(float v) { return v / (1.0f + std::exp(-v)); }
}  // namespace

Ssm2ScanMode ssm2_scan_mode_from_env() {
  const char* v = std::getenv("TERN_SSM_SCAN");
  if (!v || !*v || std::strcmp(v, "auto") == 0) return Ssm2ScanMode::Auto;
  if (std::strcmp(v, "recurrent") == 0) return Ssm2ScanMode::Recurrent;
  if (std::strcmp(v, "chunked") == 0) return Ssm2ScanMode::Chunked;
  fail("TERN_SSM_SCAN=", v, ": expected recurrent, chunked or auto (Mamba-2's scan, docs/models.md)");
}

void Ssm2Block::run(const Ssm2Weights& L, const HParams& hp, int64_t il, std::span<const SeqBatch> seqs, KvStore& kv,
                    const float* xn, float* out, int64_t T, ThreadPool& pool, const LinearHooks& hooks) {
  const int64_t E = hp.n_embd;
  const HParams::Ssm& s = hp.ssm;
  const int64_t DI = s.d_inner, DS = s.d_state, K = s.d_conv, H = s.dt_rank, G = s.n_group;
  const int64_t CC = s.conv_channels(), NIN = in_width(hp), P = DI / H, GW = DI / G;
  TERN_ASSERT_MSG(int64_t(proj_.size()) >= T * NIN, "Ssm2Block step larger than reserve()");
  apply_linear(L.in, xn, E, T, proj_.data(), NIN, pool, hooks);

  // The causal conv over x, B and C per channel, each sequence from its window state (then left
  // holding its last K - 1 inputs); token by token over a range of contiguous channels, the taps
  // oldest first (as ggml's ssm_conv sums them); and dt + dt_bias.
  pool.parallel_for(CC, [&](int64_t c0, int64_t c1, int) {
    int64_t t0 = 0;
    const float* src[64];  // the K inputs of a token, oldest first (d_conv <= 64, hparams.cpp)
    for (const auto& sq : seqs) {
      const int64_t n = int64_t(sq.tokens.size());
      float* win = kv.state(il, sq.state_slot);  // [K - 1][CC], oldest first
      const float* in = proj_.data() + t0 * NIN + DI;  // token i's inputs at in + i NIN
      auto input = [&](int64_t j) { return j < 0 ? win + (K - 1 + j) * CC : in + j * NIN; };  // token j of the step
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t k = 0; k < K; ++k) src[k] = input(i - (K - 1) + k);
        float* o = xbc_.data() + (t0 + i) * CC;
        for (int64_t c = c0; c < c1; ++c) {
          const float* w = L.conv + c * K;
          float acc = 0.0f;
          for (int64_t k = 0; k < K; ++k) acc += w[k] * src[k][c];
          o[c] = ssm2_block_silu(acc + L.conv_bias[c]);
        }
      }
      // The window keeps the last K - 1 inputs (rows read are at or after the row written).
      for (int64_t k = 0; k + 1 < K; ++k) {
        const float* from = input(n - (K - 1) + k);
        if (from != win + k * CC) std::copy(from + c0, from + c1, win + k * CC + c0);
      }
      t0 += n;
    }
  });
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) dt_[size_t(t * H + h)] = proj_[size_t(t * NIN + DI + CC + h)] + L.dt_bias[h];

  // The scan, heads in parallel, each sequence from its state: the chunked form for a prefill's
  // tokens, the recurrence for decode (chunked()); then the grouped RMSNorm of y (gated by
  // silu(z) in the scan).
  pool.parallel_for(H, [&](int64_t h0, int64_t h1, int) {
    int64_t t0 = 0;
    for (const auto& sq : seqs) {
      const int64_t n = int64_t(sq.tokens.size());
      const float* xbc = xbc_.data() + t0 * CC;
      Ssm2ScanArgs a{xbc,        CC,  dt_.data() + t0 * H, H, xbc + DI, xbc + DI + G * DS, CC, proj_.data() + t0 * NIN,
                     NIN,        L.a, L.d, kv.state(il, sq.state_slot) + (K - 1) * CC, y_.data() + t0 * DI, DI, n, DS,
                     P,          H / G};
      if (chunked(n)) ssm2_scan_chunked(a, h0, h1, kSsm2Chunk);
      else ssm2_scan(a, h0, h1);
      t0 += n;
    }
  });
  pool.parallel_for(T * G, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      float* y = y_.data() + r * GW;  // token r / G, group r % G
      const float* w = L.group_norm + (r % G) * GW;
      double ss = 0.0;  // (ggml sums the squares in double)
      for (int64_t i = 0; i < GW; ++i) ss += double(y[i] * y[i]);
      const float scale = 1.0f / std::sqrt(float(ss / double(GW)) + hp.rms_eps);
      for (int64_t i = 0; i < GW; ++i) y[i] = y[i] * scale * w[i];
    }
  });

  apply_linear(L.out, y_.data(), DI, T, out, E, pool, hooks);
}

}  // namespace tern
