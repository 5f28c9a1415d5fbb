// RWKV-7 "Goose" ("rwkv7": RWKV7-Goose-World, fla-hub/rwkv7-*), llama.cpp's layout and arithmetic
// (llm_build_rwkv7). No attention; x = LayerNorm(token_embd_norm)(embedding), then per layer,
// with LN the LayerNorm (weight and bias, eps attention.layer_norm_epsilon), H = n_embd / N heads
// of N = wkv.head_size channels:
//   time mix, on xn = LN(x) (attn_norm) and its shifted copy p (the previous token's xn; the
//   sequence's state before its first token):
//     x? = xn + (p - xn) lerp_fused[?]            for ? in r w k v a g
//     r = receptance x_r, k = key x_k, v = value x_v
//     w = exp(-0.606531 sigmoid(w0 + w2 tanh(w1 x_w)))             (the decay, in (0.545, 1))
//     v = v + (v_first - v) sigmoid(v0 + v2 v1 x_v)                 (layers > 0; v_first: layer 0's v)
//     a = sigmoid(a0 + a2 a1 x_a), g = g2 sigmoid(g1 x_g)
//     kk = L2-normalise per head(k k_k); k = k + (a - 1) (k k_a)
//     y = WKV-7(r, w, k, v, -kk, kk a)                              (ops.h wkv7: the state per head)
//     y = GroupNorm per head (eps 64e-5) times ln_x + ln_x bias, + v sum_head(r k r_k), times g
//     x += time_mix_output y
//   channel mix, on fn = LN(x) (attn_norm_2) and its shifted copy q:
//     x += channel_mix_value relu(channel_mix_key (fn + (q - fn) lerp_k))^2
// then LN(output_norm) and the output projection.
//
// A sequence's state per layer (HParams::state_floats): xn and fn of its last token, then the
// heads' [N][N] WKV states; it lives in the KvStore's state slot SeqBatch::state_slot and is
// zeroed when the sequence starts (n_past == 0). Every token runs the same arithmetic whatever
// the step's size (matmuls over the step's tokens, the recurrence token by token, heads in
// parallel), so a prompt in one step, in chunks or token by token gives the same bits.
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

constexpr int kRwkvMixes = 6;  // r w k v a g, lerp_fused's order

struct Rwkv7Layer {
  const float *att_norm = nullptr, *att_norm_b = nullptr;
  const float *ffn_norm = nullptr, *ffn_norm_b = nullptr;
  const float* lerp = nullptr;  // [6][n_embd]
  const float *w0 = nullptr, *a0 = nullptr, *v0 = nullptr;
  Linear w1, w2, a1, a2, v1, v2, g1, g2;
  const float *k_k = nullptr, *k_a = nullptr, *r_k = nullptr;
  Linear key, value, receptance, output;
  const float *ln_x = nullptr, *ln_x_b = nullptr;
  const float* cm_lerp_k = nullptr;
  Linear cm_key, cm_value;
};

inline float rwkv7_sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

class Rwkv7Model final : public Model {
 public:
  Rwkv7Model(const ArchSpec& spec, std::shared_ptr<const GgufFile> file) : file_(std::move(file)) {
    (void)spec;
    hp_ = read_hparams(*file_);
    WeightLoader ld(file_);
    bind(ld);
    ld.start_loading();
    bind(ld);
    arena_ = ld.take_arena();
    extra_ = ld.take_extra();
    for (const auto& t : file_->tensors()) weight_bytes_ += int64_t(t.n_bytes);
    for (const Rwkv7Layer& L : layers_)
      for (const Linear* l : {&L.receptance, &L.w1, &L.w2, &L.key, &L.value, &L.v1, &L.v2, &L.g1, &L.g2, &L.a1,
                              &L.a2, &L.output, &L.cm_key, &L.cm_value})
        if (l->w.data)
          decode_weight_memory_.emplace_back(static_cast<const uint8_t*>(l->w.data),
                                             size_t(l->w.n_out * l->w.row_bytes()));
    decode_weight_memory_.emplace_back(static_cast<const uint8_t*>(output_.w.data),
                                       size_t(output_.w.n_out * output_.w.row_bytes()));
  }

  void check_lora(const LoraAdapter& adapter) const override {
    fail(adapter.path(), ": LoRA adapters on ", hp_.arch, " (recurrent) models are not supported yet");
  }
  bool can_evict_kv() const override { return false; }

  void reserve(int64_t n_tokens) override {
    if (n_tokens <= max_tokens_) return;
    max_tokens_ = n_tokens;
    const size_t T = size_t(n_tokens), E = size_t(hp_.n_embd);
    const HParams::Rwkv& rw = hp_.rwkv;
    const int64_t R = std::max({rw.lora_decay, rw.lora_iclr, rw.lora_value_res, rw.lora_gate});
    x_.assign(T * E, 0.0f);
    xn_.assign(T * E, 0.0f);
    mix_.assign(kRwkvMixes * T * E, 0.0f);
    for (auto* b : {&r_, &w_, &k_, &v_, &a_, &g_, &kk_, &bb_, &vfirst_, &y_, &tmp_}) b->assign(T * E, 0.0f);
    lo_.assign(T * size_t(R), 0.0f);
    ffn_.assign(T * size_t(hp_.n_ff), 0.0f);
    out_rows_.assign(T * E, 0.0f);
  }
  int64_t max_step_tokens() const override { return max_tokens_; }

  void forward(std::span<const SeqBatch> seqs, KvStore& kv, float* logits, ThreadPool& pool) override;

 private:
  void bind(WeightLoader& ld);
  const float* lerp_fused(const std::string& name) const;
  // y = base + up(down x) over T rows of E (the LoRA-shaped projections: w, a, v), act between.
  template <class Act>
  void lora(const Linear& down, const Linear& up, const float* x, int64_t T, float* y, Act act, ThreadPool& pool);
  void time_mix(const Rwkv7Layer& L, int64_t il, std::span<const SeqBatch> seqs, KvStore& kv, int64_t T,
                ThreadPool& pool);
  void channel_mix(const Rwkv7Layer& L, int64_t il, std::span<const SeqBatch> seqs, KvStore& kv, int64_t T,
                   ThreadPool& pool);

  std::shared_ptr<const GgufFile> file_;
  HugeBuffer arena_;
  std::vector<HugeBuffer> extra_;
  WeightView tok_embd_;
  const float *tok_norm_ = nullptr, *tok_norm_b_ = nullptr;
  const float *output_norm_ = nullptr, *output_norm_b_ = nullptr;
  Linear output_;
  std::vector<Rwkv7Layer> layers_;
  int64_t max_tokens_ = 0;
  LinearHooks hooks_;
  // Scratch sized by reserve(); T = the step's tokens, E = n_embd.
  std::vector<float> x_;      // [T, E] residual stream
  std::vector<float> xn_;     // [T, E] a layer's normalised input (attn_norm, then attn_norm_2)
  std::vector<float> mix_;    // [6][T, E] the token-shift mixes x_r ... x_g (channel mix: x_k)
  std::vector<float> r_, w_, k_, v_, a_, g_, kk_, bb_, vfirst_, y_, tmp_;  // [T, E]
  std::vector<float> lo_;     // [T, largest LoRA rank]
  std::vector<float> ffn_;    // [T, n_ff]
  std::vector<float> out_rows_;
};

const float* Rwkv7Model::lerp_fused(const std::string& name) const {
  const GgufTensorInfo* t = file_->find_tensor(name);
  if (!t) fail(file_->path(), ": missing tensor ", name);
  const int64_t E = hp_.n_embd;
  const bool fits = (t->ne.size() == 4 && t->ne[0] == E && t->ne[1] == 1 && t->ne[2] == 1 && t->ne[3] == kRwkvMixes) ||
                    (t->ne.size() == 2 && t->ne[0] == E && t->ne[1] == kRwkvMixes);
  if (!fits)
    fail(file_->path(), ": loading ", name, ": expected ", E, " x 1 x 1 x ", kRwkvMixes,
         " (the r w k v a g token-shift mixes; files without the gate's are not supported), file has ",
         t->shape_string());
  if (t->type != DType::F32)
    fail(file_->path(), ": loading ", name, ": token-shift mixes must be f32, file has ", dtype_name(t->type));
  if (reinterpret_cast<uintptr_t>(t->data) % alignof(float) != 0) fail(file_->path(), ": tensor ", name, " data is misaligned");
  const float* f = reinterpret_cast<const float*>(t->data);
  for (int64_t i = 0; i < kRwkvMixes * E; ++i)
    if (!std::isfinite(f[i])) fail(file_->path(), ": tensor ", name, " holds a non-finite value at ", i);
  return f;
}

void Rwkv7Model::bind(WeightLoader& ld) {
  const int64_t E = hp_.n_embd, V = hp_.n_vocab, F = hp_.n_ff;
  const HParams::Rwkv& rw = hp_.rwkv;
  auto vec = [&](Tensor t, int64_t il, const char* suffix = "weight") {
    return ld.vector(tensor_name(t, il, suffix), E, suffix[0] == 'b' ? "biases" : "vectors");
  };
  auto lin = [&](Tensor t, int64_t il, int64_t n_in, int64_t n_out) {
    const std::string n = tensor_name(t, il);
    return Linear{n, ld.matmul(n, n_in, n_out)};
  };
  tok_embd_ = ld.rows(tensor_name(Tensor::TokenEmbd), E, V);
  tok_norm_ = ld.vector(tensor_name(Tensor::TokenEmbdNorm), E, "norm weights");
  tok_norm_b_ = ld.vector(tensor_name(Tensor::TokenEmbdNorm, -1, "bias"), E, "norm biases");
  output_norm_ = ld.vector(tensor_name(Tensor::OutputNorm), E, "norm weights");
  output_norm_b_ = ld.vector(tensor_name(Tensor::OutputNorm, -1, "bias"), E, "norm biases");
  output_ = Linear{tensor_name(Tensor::Output), ld.matmul(tensor_name(Tensor::Output), E, V)};
  layers_.assign(size_t(hp_.n_layer), Rwkv7Layer{});
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    Rwkv7Layer& L = layers_[size_t(il)];
    L.att_norm = vec(Tensor::AttnNorm, il);
    L.att_norm_b = vec(Tensor::AttnNorm, il, "bias");
    L.ffn_norm = vec(Tensor::AttnNorm2, il);
    L.ffn_norm_b = vec(Tensor::AttnNorm2, il, "bias");
    L.lerp = lerp_fused(tensor_name(Tensor::TimeMixLerpFused, il));
    L.w0 = vec(Tensor::TimeMixW0, il);
    L.w1 = lin(Tensor::TimeMixW1, il, E, rw.lora_decay);
    L.w2 = lin(Tensor::TimeMixW2, il, rw.lora_decay, E);
    L.a0 = vec(Tensor::TimeMixA0, il);
    L.a1 = lin(Tensor::TimeMixA1, il, E, rw.lora_iclr);
    L.a2 = lin(Tensor::TimeMixA2, il, rw.lora_iclr, E);
    if (il > 0) {  // (layer 0's v0 / v1 / v2 are unused copies of a0 / a1 / a2: not read)
      L.v0 = vec(Tensor::TimeMixV0, il);
      L.v1 = lin(Tensor::TimeMixV1, il, E, rw.lora_value_res);
      L.v2 = lin(Tensor::TimeMixV2, il, rw.lora_value_res, E);
    }
    L.g1 = lin(Tensor::TimeMixG1, il, E, rw.lora_gate);
    L.g2 = lin(Tensor::TimeMixG2, il, rw.lora_gate, E);
    L.k_k = vec(Tensor::TimeMixKK, il);
    L.k_a = vec(Tensor::TimeMixKA, il);
    L.r_k = vec(Tensor::TimeMixRK, il);
    L.key = lin(Tensor::TimeMixKey, il, E, E);
    L.value = lin(Tensor::TimeMixValue, il, E, E);
    L.receptance = lin(Tensor::TimeMixReceptance, il, E, E);
    L.ln_x = vec(Tensor::TimeMixLn, il);
    L.ln_x_b = vec(Tensor::TimeMixLn, il, "bias");
    L.output = lin(Tensor::TimeMixOutput, il, E, E);
    L.cm_lerp_k = vec(Tensor::ChannelMixLerpK, il);
    L.cm_key = lin(Tensor::ChannelMixKey, il, E, F);
    L.cm_value = lin(Tensor::ChannelMixValue, il, F, E);
  }
}

template <class Act>
void Rwkv7Model::lora(const Linear& down, const Linear& up, const float* x, int64_t T, float* y, Act act,
                      ThreadPool& pool) {
  const int64_t E = hp_.n_embd, R = down.w.n_out;
  apply_linear(down, x, E, T, lo_.data(), R, pool, hooks_);
  for (int64_t i = 0; i < T * R; ++i) lo_[size_t(i)] = act(lo_[size_t(i)]);
  apply_linear(up, lo_.data(), R, T, y, E, pool, hooks_);
}

void Rwkv7Model::forward(std::span<const SeqBatch> seqs, KvStore& kv, float* logits, ThreadPool& pool) {
  const int64_t E = hp_.n_embd, V = hp_.n_vocab;
  const float eps = hp_.rwkv.norm_eps;
  const int64_t T = begin_recurrent_step(seqs, kv, tok_embd_, V, E, max_tokens_, x_.data());
  if (T == 0) return;
  rwkv_layer_norm(x_.data(), tok_norm_, tok_norm_b_, x_.data(), T, E, eps, pool);
  hooks_ = LinearHooks{observer_, nullptr};
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    time_mix(layers_[size_t(il)], il, seqs, kv, T, pool);
    channel_mix(layers_[size_t(il)], il, seqs, kv, T, pool);
  }

  const int64_t rows = gather_logit_rows(seqs, x_.data(), E, out_rows_.data(), [&](const float* in, float* out,
                                                                                    int64_t n) {
    rwkv_layer_norm(in, output_norm_, output_norm_b_, out, n, E, eps, pool);
  });
  rwkv_layer_norm(out_rows_.data(), output_norm_, output_norm_b_, out_rows_.data(), rows, E, eps, pool);
  apply_linear(output_, out_rows_.data(), E, rows, logits, V, pool, hooks_);
}

void Rwkv7Model::time_mix(const Rwkv7Layer& L, int64_t il, std::span<const SeqBatch> seqs, KvStore& kv, int64_t T,
                          ThreadPool& pool) {
  const int64_t E = hp_.n_embd, N = hp_.rwkv.head_size, H = E / N;
  const size_t TE = size_t(T * E);
  rwkv_layer_norm(x_.data(), L.att_norm, L.att_norm_b, xn_.data(), T, E, hp_.rwkv.norm_eps, pool);
  rwkv_token_shift(seqs, kv, il, 0, E, xn_.data(), L.lerp, kRwkvMixes, mix_.data(), T, nullptr, pool);
  const float* xr = mix_.data();
  const float *xw = xr + TE, *xk = xr + 2 * TE, *xv = xr + 3 * TE, *xa = xr + 4 * TE, *xg = xr + 5 * TE;

  apply_linear(L.receptance, xr, E, T, r_.data(), E, pool, hooks_);
  lora(L.w1, L.w2, xw, T, w_.data(), [](float v) { return std::tanh(v); }, pool);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < E; ++c) {
      float& w = w_[size_t(t * E + c)];
      w = std::exp(rwkv7_sigmoid(w + L.w0[c]) * -0.606531f);
    }
  apply_linear(L.key, xk, E, T, k_.data(), E, pool, hooks_);
  apply_linear(L.value, xv, E, T, v_.data(), E, pool, hooks_);
  if (il == 0) {
    std::copy_n(v_.data(), TE, vfirst_.data());
  } else {
    lora(L.v1, L.v2, xv, T, tmp_.data(), [](float v) { return v; }, pool);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < E; ++c) {
        const size_t i = size_t(t * E + c);
        v_[i] = v_[i] + (vfirst_[i] - v_[i]) * rwkv7_sigmoid(tmp_[i] + L.v0[c]);
      }
  }
  lora(L.g1, L.g2, xg, T, g_.data(), [](float v) { return rwkv7_sigmoid(v); }, pool);
  lora(L.a1, L.a2, xa, T, a_.data(), [](float v) { return v; }, pool);
  // a, kk (L2-normalised per head), k's in-context learning rate mix, and the WKV's a / b inputs
  // (-kk and kk a, kept in kk_ and bb_).
  pool.parallel_for(T, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t c = 0; c < E; ++c) {
        const size_t i = size_t(t * E + c);
        a_[i] = rwkv7_sigmoid(a_[i] + L.a0[c]);
        kk_[i] = k_[i] * L.k_k[c];
        const float ka = k_[i] * L.k_a[c];
        k_[i] = k_[i] + (a_[i] * ka - ka);
      }
      for (int64_t h = 0; h < H; ++h) {
        float* kk = kk_.data() + t * E + h * N;
        double ss = 0.0;
        for (int64_t j = 0; j < N; ++j) ss += double(kk[j] * kk[j]);
        const float scale = 1.0f / std::max(std::sqrt(float(ss)), 1e-12f);
        const float* a = a_.data() + t * E + h * N;
        float* b = bb_.data() + t * E + h * N;
        for (int64_t j = 0; j < N; ++j) {
          kk[j] = kk[j] * scale;
          b[j] = kk[j] * a[j];
          kk[j] = -kk[j];
        }
      }
    }
  });
  // The recurrence, heads in parallel, each sequence from its state.
  pool.parallel_for(H, [&](int64_t h0, int64_t h1, int) {
    int64_t t0 = 0;
    for (const auto& sq : seqs) {
      const int64_t n = int64_t(sq.tokens.size());
      const int64_t o = t0 * E;
      Wkv7Args a{r_.data() + o, w_.data() + o, k_.data() + o, v_.data() + o, kk_.data() + o, bb_.data() + o, E,
                 kv.state(il, sq.state_slot) + 2 * E, y_.data() + o, E, n, N};
      wkv7(a, h0, h1);
      t0 += n;
    }
  });
  // Group norm per head, the bonus v sum(r k r_k) per head, the gate.
  pool.parallel_for(T, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t o = t * E + h * N;
        float* y = y_.data() + o;
        rwkv_group_norm_head(y, N);
        const float *r = r_.data() + o, *k = k_.data() + o, *v = v_.data() + o, *g = g_.data() + o;
        float rk = 0.0f;
        for (int64_t j = 0; j < N; ++j) rk += k[j] * r[j] * L.r_k[h * N + j];
        for (int64_t j = 0; j < N; ++j) {
          const int64_t c = h * N + j;
          y[j] = ((y[j] * L.ln_x[c] + L.ln_x_b[c]) + v[j] * rk) * g[j];
        }
      }
  });
  apply_linear(L.output, y_.data(), E, T, tmp_.data(), E, pool, hooks_);
  add_inplace(x_.data(), tmp_.data(), T * E);
}

void Rwkv7Model::channel_mix(const Rwkv7Layer& L, int64_t il, std::span<const SeqBatch> seqs, KvStore& kv, int64_t T,
                             ThreadPool& pool) {
  const int64_t E = hp_.n_embd, F = hp_.n_ff;
  rwkv_layer_norm(x_.data(), L.ffn_norm, L.ffn_norm_b, xn_.data(), T, E, hp_.rwkv.norm_eps, pool);
  rwkv_token_shift(seqs, kv, il, E, E, xn_.data(), L.cm_lerp_k, 1, mix_.data(), T, nullptr, pool);
  apply_linear(L.cm_key, mix_.data(), E, T, ffn_.data(), F, pool, hooks_);
  for (int64_t i = 0; i < T * F; ++i) {
    const float v = std::max(ffn_[size_t(i)], 0.0f);
    ffn_[size_t(i)] = v * v;
  }
  apply_linear(L.cm_value, ffn_.data(), F, T, tmp_.data(), E, pool, hooks_);
  add_inplace(x_.data(), tmp_.data(), T * E);
}

}  // namespace

std::unique_ptr<Model> make_rwkv7(const ArchSpec& spec, std::shared_ptr<const GgufFile> file) {
  return std::make_unique<Rwkv7Model>(spec, std::move(file));
}

}  // namespace tern
