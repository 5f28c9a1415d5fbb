// The state-space stack: Mamba ("mamba": state-spaces/mamba-130m ... 2.8b, FalconMamba). No
// attention and no FFN; per layer, on xn = RMSNorm(x):
//   [u | z] = ssm_in xn                                     u, z: [d_inner]
//   u = silu(conv1d(u) + conv_bias)    causal, d_conv taps per channel over the last inputs
//   [dt | B | C] = ssm_x u                                  dt: [dt_rank], B, C: [d_state]
//   (FalconMamba: dt, B and C each RMS-normalised, no weight)
//   dt = softplus(ssm_dt dt + dt_bias)                      [d_inner]
//   h[c][s] = h[c][s] exp(dt[c] A[c][s]) + dt[c] B[s] u[c]  the selective scan, per channel c
//   y[c] = (sum_s h[c][s] C[s] + D[c] u[c]) silu(z[c])
//   x += ssm_out y
// then the output norm and projection (tied to token_embd when `output` is absent).
//
// A sequence's state (the conv window's last d_conv - 1 inputs and h, per layer) lives in the
// KvStore's state slot SeqBatch::state_slot (kv/kv_store.h) and is zeroed when the sequence
// starts (n_past == 0). Decode and prefill run the same recurrence token by token, so a prompt
// in one step, in chunks or token by token gives the same bits. Matmuls run over every token of
// the step at once; the conv and the scan over channels in parallel.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "models/linear.h"
#include "models/recurrent_step.h"
#include "models/registry.h"
#include "models/tensor_names.h"
#include "models/weight_loader.h"
#include "ops/ops.h"

namespace tern {
namespace {

struct SsmLayer {
  const float* norm = nullptr;       // [n_embd]
  Linear in;                         // [n_embd -> 2 d_inner]
  const float* conv = nullptr;       // [d_inner][d_conv], tap 0 the oldest input
  const float* conv_bias = nullptr;  // [d_inner]
  Linear x;                          // [d_inner -> dt_rank + 2 d_state]
  Linear dt;                         // [dt_rank -> d_inner] (+ bias)
  const float* a = nullptr;          // [d_inner][d_state]
  const float* d = nullptr;          // [d_inner]
  Linear out;                        // [d_inner -> n_embd]
};

inline float silu(float v) { return v / (1.0f + std::exp(-v)); }

// x / sqrt(mean(x^2) + eps), no weight (FalconMamba's dt, B, C).
void rms_normalize(float* x, int64_t n, float eps) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float s = 1.0f / std::sqrt(ss / float(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

class MambaModel final : public Model {
 public:
  MambaModel(const ArchSpec& spec, std::shared_ptr<const GgufFile> file) : file_(std::move(file)) {
    (void)spec;
    hp_ = read_hparams(*file_);
    WeightLoader ld(file_);
    bind(ld);
    ld.start_loading();
    bind(ld);
    arena_ = ld.take_arena();
    extra_ = ld.take_extra();
    for (const auto& t : file_->tensors()) weight_bytes_ += int64_t(t.n_bytes);
    for (const SsmLayer& L : layers_)
      for (const Linear* l : {&L.in, &L.x, &L.dt, &L.out})
        decode_weight_memory_.emplace_back(static_cast<const uint8_t*>(l->w.data), size_t(l->w.n_out * l->w.row_bytes()));
    decode_weight_memory_.emplace_back(static_cast<const uint8_t*>(output_.w.data),
                                       size_t(output_.w.n_out * output_.w.row_bytes()));
  }

  void check_lora(const LoraAdapter& adapter) const override {
    fail(adapter.path(), ": LoRA adapters on ", hp_.arch, " (state-space) models are not supported yet");
  }
  // Evicting keys means nothing to a recurrent state; and a pipeline / tensor split is refused.
  bool can_evict_kv() const override { return false; }

  void reserve(int64_t n_tokens) override {
    if (n_tokens <= max_tokens_) return;
    max_tokens_ = n_tokens;
    const size_t T = size_t(n_tokens), E = size_t(hp_.n_embd), DI = size_t(hp_.ssm.d_inner);
    x_.assign(T * E, 0.0f);
    xn_.assign(T * E, 0.0f);
    xz_.assign(T * 2 * DI, 0.0f);
    u_.assign(T * DI, 0.0f);
    dbc_.assign(T * size_t(hp_.ssm.dt_rank + 2 * hp_.ssm.d_state), 0.0f);
    dt_.assign(T * DI, 0.0f);
    y_.assign(T * DI, 0.0f);
    out_rows_.assign(T * E, 0.0f);
  }
  int64_t max_step_tokens() const override { return max_tokens_; }

  void forward(std::span<const SeqBatch> seqs, KvStore& kv, float* logits, ThreadPool& pool) override;

 private:
  void bind(WeightLoader& ld);
  void ssm_layer(const SsmLayer& L, int64_t il, std::span<const SeqBatch> seqs, KvStore& kv, int64_t T, ThreadPool& pool);

  std::shared_ptr<const GgufFile> file_;
  HugeBuffer arena_;
  std::vector<HugeBuffer> extra_;
  WeightView tok_embd_;
  Linear output_;
  const float* output_norm_ = nullptr;
  std::vector<SsmLayer> layers_;
  int64_t max_tokens_ = 0;
  LinearHooks hooks_;
  // Scratch sized by reserve(); T = the step's tokens.
  std::vector<float> x_;         // [T, n_embd] residual stream
  std::vector<float> xn_;        // [T, n_embd] a layer's normalised input, then its output
  std::vector<float> xz_;        // [T, 2 d_inner] u then z
  std::vector<float> u_;         // [T, d_inner] the conv's output
  std::vector<float> dbc_;       // [T, dt_rank + 2 d_state]
  std::vector<float> dt_;        // [T, d_inner]
  std::vector<float> y_;         // [T, d_inner]
  std::vector<float> out_rows_;  // [rows needing logits, n_embd]
};

void MambaModel::bind(WeightLoader& ld) {
  const int64_t E = hp_.n_embd, V = hp_.n_vocab;
  const HParams::Ssm& s = hp_.ssm;
  output_norm_ = ld.vector(tensor_name(Tensor::OutputNorm), E, "norm weights");
  if (ld.has(tensor_name(Tensor::Output))) {
    tok_embd_ = ld.rows(tensor_name(Tensor::TokenEmbd), E, V);
    output_ = Linear{tensor_name(Tensor::Output), ld.matmul(tensor_name(Tensor::Output), E, V)};
  } else {
    tok_embd_ = ld.matmul(tensor_name(Tensor::TokenEmbd), E, V);  // tied (see decoder.cpp)
    output_ = Linear{tensor_name(Tensor::TokenEmbd), tok_embd_};
  }
  layers_.assign(size_t(hp_.n_layer), SsmLayer{});
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    SsmLayer& L = layers_[size_t(il)];
    auto lin = [&](Tensor t, int64_t n_in, int64_t n_out) {
      return Linear{tensor_name(t, il), ld.matmul(tensor_name(t, il), n_in, n_out)};
    };
    L.norm = ld.vector(tensor_name(Tensor::AttnNorm, il), E, "norm weights");
    L.in = lin(Tensor::SsmIn, E, 2 * s.d_inner);
    L.conv = ld.vectors(tensor_name(Tensor::SsmConv1d, il), s.d_conv, s.d_inner, "conv1d weights");
    L.conv_bias = ld.vector(tensor_name(Tensor::SsmConv1d, il, "bias"), s.d_inner, "conv1d biases");
    L.x = lin(Tensor::SsmX, s.d_inner, s.dt_rank + 2 * s.d_state);
    L.dt = lin(Tensor::SsmDt, s.dt_rank, s.d_inner);
    L.dt.bias = ld.vector(tensor_name(Tensor::SsmDt, il, "bias"), s.d_inner, "time-step biases");
    L.a = ld.vectors(tensor_name(Tensor::SsmA, il, ""), s.d_state, s.d_inner, "SSM A");
    for (int64_t i = 0; i < s.d_state * s.d_inner; ++i)
      if (!(L.a[i] <= 0.0f))  // (a decaying state; the scan's exp is for non-positive arguments)
        fail(file_->path(), ": ", tensor_name(Tensor::SsmA, il, ""), " holds ", L.a[i], " at element ", i,
             ": Mamba's A must be <= 0 (converters store -exp(A_log))");
    L.d = ld.vector(tensor_name(Tensor::SsmD, il, ""), s.d_inner, "SSM D");
    L.out = lin(Tensor::SsmOut, s.d_inner, E);
  }
}

void MambaModel::forward(std::span<const SeqBatch> seqs, KvStore& kv, float* logits, ThreadPool& pool) {
  const int64_t E = hp_.n_embd, V = hp_.n_vocab;
  const int64_t T = begin_recurrent_step(seqs, kv, tok_embd_, V, E, max_tokens_, x_.data());
  if (T == 0) return;
  hooks_ = LinearHooks{observer_, nullptr};
  for (int64_t il = 0; il < hp_.n_layer; ++il) ssm_layer(layers_[size_t(il)], il, seqs, kv, T, pool);

  // The rows that need logits (every token's, or each sequence's last), through the output norm.
  const int64_t rows = gather_logit_rows(seqs, x_.data(), E, out_rows_.data(), [&](const float* in, float* out,
                                                                                    int64_t n) {
    rms_norm(in, output_norm_, out, n, E, hp_.rms_eps, pool);
  });
  rms_norm(out_rows_.data(), output_norm_, out_rows_.data(), rows, E, hp_.rms_eps, pool);
  apply_linear(output_, out_rows_.data(), E, rows, logits, V, pool, hooks_);
}

void MambaModel::ssm_layer(const SsmLayer& L, int64_t il, std::span<const SeqBatch> seqs, KvStore& kv, int64_t T,
                           ThreadPool& pool) {
  const int64_t E = hp_.n_embd;
  const HParams::Ssm& s = hp_.ssm;
  const int64_t DI = s.d_inner, DS = s.d_state, R = s.dt_rank, K = s.d_conv, NX = R + 2 * DS;
  rms_norm(x_.data(), L.norm, xn_.data(), T, E, hp_.rms_eps, pool);
  apply_linear(L.in, xn_.data(), E, T, xz_.data(), 2 * DI, pool, hooks_);

  // The causal conv per channel, each sequence from its window state (then left holding its
  // last K - 1 inputs).
  pool.parallel_for(DI, [&](int64_t c0, int64_t c1, int) {
    int64_t t0 = 0;
    for (const auto& sq : seqs) {
      const int64_t n = int64_t(sq.tokens.size());
      float* win = kv.state(il, sq.state_slot);  // [K - 1][d_inner], oldest first
      for (int64_t c = c0; c < c1; ++c) {
        const float* w = L.conv + c * K;
        for (int64_t i = 0; i < n; ++i) {
          const float in = xz_[size_t((t0 + i) * 2 * DI + c)];
          float acc = 0.0f;  // taps oldest first, as ggml's ssm_conv sums them
          for (int64_t k = 0; k < K - 1; ++k) acc += w[k] * win[k * DI + c];
          acc += w[K - 1] * in;
          // Slide the window: drop the oldest, append this input.
          for (int64_t k = 0; k + 1 < K - 1; ++k) win[k * DI + c] = win[(k + 1) * DI + c];
          if (K > 1) win[(K - 2) * DI + c] = in;
          u_[size_t((t0 + i) * DI + c)] = silu(acc + L.conv_bias[c]);
        }
      }
      t0 += n;
    }
  });

  apply_linear(L.x, u_.data(), DI, T, dbc_.data(), NX, pool, hooks_);
  if (s.dt_b_c_rms)
    for (int64_t t = 0; t < T; ++t) {
      float* r = dbc_.data() + t * NX;
      rms_normalize(r, R, hp_.rms_eps);
      rms_normalize(r + R, DS, hp_.rms_eps);
      rms_normalize(r + R + DS, DS, hp_.rms_eps);
    }
  // dt_proj reads the first R columns of each row (ldx = NX), its bias added by apply_linear.
  apply_linear(L.dt, dbc_.data(), NX, T, dt_.data(), DI, pool, hooks_);

  // The selective scan (ops.h ssm_scan), channels in parallel, each sequence from its state.
  pool.parallel_for(DI, [&](int64_t c0, int64_t c1, int) {
    int64_t t0 = 0;
    for (const auto& sq : seqs) {
      const int64_t n = int64_t(sq.tokens.size());
      SsmScanArgs a{u_.data() + t0 * DI,  DI,  dt_.data() + t0 * DI, DI, dbc_.data() + t0 * NX + R,
                    dbc_.data() + t0 * NX + R + DS, NX, xz_.data() + t0 * 2 * DI + DI, 2 * DI, L.a, L.d,
                    kv.state(il, sq.state_slot) + (K - 1) * DI, y_.data() + t0 * DI, DI, n, DS};
      ssm_scan(a, c0, c1);
      t0 += n;
    }
  });

  apply_linear(L.out, y_.data(), DI, T, xn_.data(), E, pool, hooks_);
  add_inplace(x_.data(), xn_.data(), T * E);
}

}  // namespace

std::unique_ptr<Model> make_mamba(const ArchSpec& spec, std::shared_ptr<const GgufFile> file) {
  return std::make_unique<MambaModel>(spec, std::move(file));
}

}  // namespace tern
