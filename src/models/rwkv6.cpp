// RWKV-6 "Finch" ("rwkv6": RWKV-6-World, RWKV/v6-Finch-*-HF), llama.cpp's layout and arithmetic
// (llm_build_rwkv6, build_rwkv6_time_mix / _channel_mix). No attention; x = LayerNorm
// (token_embd_norm)(embedding), then per layer, with LN the LayerNorm (weight and bias, eps
// attention.layer_norm_epsilon), H = n_embd / N heads of N = wkv.head_size channels, D =
// time_mix_extra_dim, Dd = time_decay_extra_dim:
//   time mix, on xn = LN(x) (attn_norm) and sx = p - xn, p its shifted copy (the previous
//   token's xn; the sequence's state before its first token):
//     xx = xn + sx lerp_x
//     m? = time_mix_w2[?] tanh(time_mix_w1 xx)[? slice of D]          for ? in w k v r g
//     x? = xn + sx (m? + lerp_fused[?])                                (data-dependent token shift)
//     r = receptance x_r, k = key x_k, v = value x_v, g = silu(gate x_g)
//     w = exp(-exp(decay + decay_w2 tanh(decay_w1 x_w)))               (the decay, per channel, in (0, 1))
//     y = WKV-6(r, k, v, w, u = time_mix_first)                        (ops.h wkv6: the state per head)
//     y = (GroupNorm per head (eps 64e-5) times ln_x + ln_x bias) g
//     x += time_mix_output y
//   channel mix, on fn = LN(x) (attn_norm_2) and its shifted copy q:
//     x += sigmoid(receptance (fn + (q - fn) lerp_r)) value relu(key (fn + (q - fn) lerp_k))^2
//   and x *= 0.5 after every rescale_every_n_layers-th layer (0: never);
// then LN(output_norm) and the output projection.
//
// A sequence's state per layer (HParams::state_floats, as RWKV-7's): xn and fn of its last token,
// then the heads' [N][N] WKV states; it lives in the KvStore's state slot SeqBatch::state_slot and
// is zeroed when the sequence starts (n_past == 0). Every token runs the same arithmetic whatever
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
#include "models/weight_check.h"
#include "models/weight_loader.h"
#include "ops/ops.h"

namespace tern {
namespace {

constexpr int kMixes = 5;  // w k v r g: time_mix_lerp_fused's and time_mix_w2's order

struct Rwkv6Layer {
  const float *att_norm = nullptr, *att_norm_b = nullptr;
  const float *ffn_norm = nullptr, *ffn_norm_b = nullptr;
  const float* lerp_x = nullptr;  // [E]
  const float* lerp = nullptr;    // [5][E] (w k v r g)
  std::vector<float> lerp_own;    // the five parts of a file without time_mix_lerp_fused, stacked
  Linear mix_w1;                  // E -> 5 D
  Linear mix_w2[kMixes];          // D -> E each (time_mix_w2's slices)
  const float* first = nullptr;   // [E] the bonus u
  const float* decay = nullptr;   // [E]
  Linear decay_w1, decay_w2;      // E -> Dd -> E
  Linear key, value, receptance, gate, output;
  const float *ln_x = nullptr, *ln_x_b = nullptr;
  std::vector<float> cm_lerp;     // [2][E]: channel_mix_lerp_k, channel_mix_lerp_r
  Linear cm_key, cm_value, cm_receptance;
};

inline float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// ne without its trailing 1s (ggml's shapes carry them; llama.cpp compares shapes with them).
std::vector<int64_t> trimmed(std::vector<int64_t> ne) {
  while (ne.size() > 1 && ne.back() == 1) ne.pop_back();
  return ne;
}

std::string shape_text(const std::vector<int64_t>& ne) {
  std::string s;
  for (int64_t d : ne) s += (s.empty() ? "" : " x ") + std::to_string(d);
  return s;
}

class Rwkv6Model final : public Model {
 public:
  Rwkv6Model(const ArchSpec& spec, std::shared_ptr<const GgufFile> file) : file_(std::move(file)) {
    (void)spec;
    hp_ = read_hparams(*file_);
    WeightLoader ld(file_);
    bind(ld);
    ld.start_loading();
    bind(ld);
    arena_ = ld.take_arena();
    extra_ = ld.take_extra();
    for (const auto& t : file_->tensors()) weight_bytes_ += int64_t(t.n_bytes);
    for (const Rwkv6Layer& L : layers_) {
      std::vector<const Linear*> ls = {&L.mix_w1};
      for (const Linear& l : L.mix_w2) ls.push_back(&l);
      for (const Linear* l : {&L.receptance, &L.key, &L.value, &L.gate, &L.decay_w1, &L.decay_w2, &L.output,
                              &L.cm_key, &L.cm_value, &L.cm_receptance})
        ls.push_back(l);
      for (const Linear* l : ls)
        if (l->w.data)
          decode_weight_memory_.emplace_back(static_cast<const uint8_t*>(l->w.data),
                                             size_t(l->w.n_out * l->w.row_bytes()));
    }
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
    for (auto* b : {&x_, &xn_, &sx_, &xx_, &r_, &k_, &v_, &w_, &g_, &y_, &tmp_}) b->assign(T * E, 0.0f);
    mix_.assign(kMixes * T * E, 0.0f);
    mix_lo_.assign(T * size_t(kMixes * rw.mix_extra_dim), 0.0f);
    decay_lo_.assign(T * size_t(rw.decay_extra_dim), 0.0f);
    ffn_.assign(T * size_t(hp_.n_ff), 0.0f);
    out_rows_.assign(T * E, 0.0f);
  }
  int64_t max_step_tokens() const override { return max_tokens_; }

  void forward(std::span<const SeqBatch> seqs, KvStore& kv, float* logits, ThreadPool& pool) override;

 private:
  void bind(WeightLoader& ld);
  // An f32 tensor of the shape `want` (trailing 1s aside, as llama.cpp compares shapes), values
  // checked finite.
  const float* f32_tensor(const std::string& name, const std::vector<int64_t>& want, const char* what) const;
  void time_mix(const Rwkv6Layer& L, int64_t il, std::span<const SeqBatch> seqs, KvStore& kv, int64_t T,
                ThreadPool& pool);
  void channel_mix(const Rwkv6Layer& L, int64_t il, std::span<const SeqBatch> seqs, KvStore& kv, int64_t T,
                   ThreadPool& pool);

  std::shared_ptr<const GgufFile> file_;
  HugeBuffer arena_;
  std::vector<HugeBuffer> extra_;
  WeightView tok_embd_;
  const float *tok_norm_ = nullptr, *tok_norm_b_ = nullptr;
  const float *output_norm_ = nullptr, *output_norm_b_ = nullptr;
  Linear output_;
  std::vector<Rwkv6Layer> layers_;
  int64_t max_tokens_ = 0;
  LinearHooks hooks_;
  // Scratch sized by reserve(); T = the step's tokens, E = n_embd.
  std::vector<float> x_;       // [T, E] residual stream
  std::vector<float> xn_;      // [T, E] a layer's normalised input (attn_norm, then attn_norm_2)
  std::vector<float> sx_;      // [T, E] the shifted input minus the input
  std::vector<float> xx_;      // [T, E] the mixes' LoRA input (lerp_x)
  std::vector<float> mix_;     // [5][T, E] x_w ... x_g (channel mix: x_k, x_r)
  std::vector<float> mix_lo_;  // [T, 5 D]
  std::vector<float> decay_lo_;  // [T, Dd]
  std::vector<float> r_, k_, v_, w_, g_, y_, tmp_;  // [T, E]
  std::vector<float> ffn_;     // [T, n_ff]
  std::vector<float> out_rows_;
};

const float* Rwkv6Model::f32_tensor(const std::string& name, const std::vector<int64_t>& want, const char* what) const {
  const GgufTensorInfo* t = file_->find_tensor(name);
  if (!t) fail(file_->path(), ": missing tensor ", name);
  if (trimmed(t->ne) != trimmed(want))
    fail(file_->path(), ": loading ", name, ": expected ", shape_text(want), " (", what, "), file has ",
         t->shape_string());
  if (t->type != DType::F32)
    fail(file_->path(), ": loading ", name, ": ", what, " must be f32, file has ", dtype_name(t->type));
  if (reinterpret_cast<uintptr_t>(t->data) % alignof(float) != 0) fail(file_->path(), ": tensor ", name, " data is misaligned");
  check_weights_finite(file_->path(), *t);
  return reinterpret_cast<const float*>(t->data);
}

void Rwkv6Model::bind(WeightLoader& ld) {
  const int64_t E = hp_.n_embd, V = hp_.n_vocab, F = hp_.n_ff, N = hp_.rwkv.head_size, H = E / N;
  const int64_t D = hp_.rwkv.mix_extra_dim, DD = hp_.rwkv.decay_extra_dim;
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
  layers_.assign(size_t(hp_.n_layer), Rwkv6Layer{});
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    Rwkv6Layer& L = layers_[size_t(il)];
    L.att_norm = vec(Tensor::AttnNorm, il);
    L.att_norm_b = vec(Tensor::AttnNorm, il, "bias");
    L.ffn_norm = vec(Tensor::AttnNorm2, il);
    L.ffn_norm_b = vec(Tensor::AttnNorm2, il, "bias");
    L.lerp_x = f32_tensor(tensor_name(Tensor::TimeMixLerpX, il), {E, 1, 1}, "a token-shift mix");
    const std::string fused = tensor_name(Tensor::TimeMixLerpFused, il);
    if (ld.has(fused) || !ld.has(tensor_name(Tensor::TimeMixLerpW, il))) {
      L.lerp = f32_tensor(fused, {E, 1, 1, kMixes}, "the w k v r g token-shift mixes");
    } else {  // an older file: the five mixes as time_mix_lerp_{w,k,v,r,g} (llama.cpp reads both)
      L.lerp_own.resize(size_t(kMixes * E));
      const Tensor parts[kMixes] = {Tensor::TimeMixLerpW, Tensor::TimeMixLerpK, Tensor::TimeMixLerpV,
                                    Tensor::TimeMixLerpR, Tensor::TimeMixLerpG};
      for (int m = 0; m < kMixes; ++m)
        std::copy_n(f32_tensor(tensor_name(parts[m], il), {E, 1, 1}, "a token-shift mix"), E,
                    L.lerp_own.data() + m * E);
      L.lerp = L.lerp_own.data();
    }
    L.mix_w1 = lin(Tensor::TimeMixW1, il, E, kMixes * D);
    const std::string w2 = tensor_name(Tensor::TimeMixW2, il);
    for (int m = 0; m < kMixes; ++m) L.mix_w2[m] = Linear{w2, ld.matmul(w2, D, E, 0, E, m, kMixes)};
    L.first = f32_tensor(tensor_name(Tensor::TimeMixFirst, il), {N, H}, "the bonus u per head");
    L.decay = f32_tensor(tensor_name(Tensor::TimeMixDecay, il), {E}, "the decay");
    L.decay_w1 = lin(Tensor::TimeMixDecayW1, il, E, DD);
    L.decay_w2 = lin(Tensor::TimeMixDecayW2, il, DD, E);
    L.key = lin(Tensor::TimeMixKey, il, E, E);
    L.value = lin(Tensor::TimeMixValue, il, E, E);
    L.receptance = lin(Tensor::TimeMixReceptance, il, E, E);
    L.gate = lin(Tensor::TimeMixGate, il, E, E);
    L.ln_x = vec(Tensor::TimeMixLn, il);
    L.ln_x_b = vec(Tensor::TimeMixLn, il, "bias");
    L.output = lin(Tensor::TimeMixOutput, il, E, E);
    L.cm_lerp.resize(size_t(2 * E));
    std::copy_n(f32_tensor(tensor_name(Tensor::ChannelMixLerpK, il), {E, 1, 1}, "a token-shift mix"), E,
                L.cm_lerp.data());
    std::copy_n(f32_tensor(tensor_name(Tensor::ChannelMixLerpR, il), {E, 1, 1}, "a token-shift mix"), E,
                L.cm_lerp.data() + E);
    L.cm_key = lin(Tensor::ChannelMixKey, il, E, F);
    L.cm_value = lin(Tensor::ChannelMixValue, il, F, E);
    L.cm_receptance = lin(Tensor::ChannelMixReceptance, il, E, E);
  }
}

void Rwkv6Model::forward(std::span<const SeqBatch> seqs, KvStore& kv, float* logits, ThreadPool& pool) {
  const int64_t E = hp_.n_embd, V = hp_.n_vocab;
  const float eps = hp_.rwkv.norm_eps;
  const int64_t T = begin_recurrent_step(seqs, kv, tok_embd_, V, E, max_tokens_, x_.data());
  if (T == 0) return;
  rwkv_layer_norm(x_.data(), tok_norm_, tok_norm_b_, x_.data(), T, E, eps, pool);
  hooks_ = LinearHooks{observer_, nullptr};
  const int64_t every = hp_.rwkv.rescale_every;
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    time_mix(layers_[size_t(il)], il, seqs, kv, T, pool);
    channel_mix(layers_[size_t(il)], il, seqs, kv, T, pool);
    if (every > 0 && (il + 1) % every == 0)
      for (int64_t i = 0; i < T * E; ++i) x_[size_t(i)] *= 0.5f;
  }

  const int64_t rows = gather_logit_rows(seqs, x_.data(), E, out_rows_.data(), [&](const float* in, float* out,
                                                                                    int64_t n) {
    rwkv_layer_norm(in, output_norm_, output_norm_b_, out, n, E, eps, pool);
  });
  rwkv_layer_norm(out_rows_.data(), output_norm_, output_norm_b_, out_rows_.data(), rows, E, eps, pool);
  apply_linear(output_, out_rows_.data(), E, rows, logits, V, pool, hooks_);
}

void Rwkv6Model::time_mix(const Rwkv6Layer& L, int64_t il, std::span<const SeqBatch> seqs, KvStore& kv, int64_t T,
                          ThreadPool& pool) {
  const int64_t E = hp_.n_embd, N = hp_.rwkv.head_size, H = E / N;
  const int64_t D = hp_.rwkv.mix_extra_dim, DD = hp_.rwkv.decay_extra_dim;
  const size_t TE = size_t(T * E);
  rwkv_layer_norm(x_.data(), L.att_norm, L.att_norm_b, xn_.data(), T, E, hp_.rwkv.norm_eps, pool);
  rwkv_token_shift(seqs, kv, il, 0, E, xn_.data(), L.lerp_x, 1, xx_.data(), T, sx_.data(), pool);

  // The data-dependent token shift: five LoRA outputs (one down-projection, five up-projections).
  apply_linear(L.mix_w1, xx_.data(), E, T, mix_lo_.data(), kMixes * D, pool, hooks_);
  for (float& v : std::span<float>(mix_lo_.data(), size_t(T * kMixes * D))) v = std::tanh(v);
  for (int m = 0; m < kMixes; ++m)
    apply_linear(L.mix_w2[m], mix_lo_.data() + m * D, kMixes * D, T, mix_.data() + m * TE, E, pool, hooks_);
  pool.parallel_for(T, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      const float *sx = sx_.data() + t * E, *xn = xn_.data() + t * E;
      for (int m = 0; m < kMixes; ++m) {
        float* o = mix_.data() + m * TE + t * E;
        const float* lerp = L.lerp + m * E;
        for (int64_t c = 0; c < E; ++c) o[c] = (o[c] + lerp[c]) * sx[c] + xn[c];
      }
    }
  });
  const float* xw = mix_.data();
  const float *xk = xw + TE, *xv = xw + 2 * TE, *xr = xw + 3 * TE, *xg = xw + 4 * TE;

  apply_linear(L.receptance, xr, E, T, r_.data(), E, pool, hooks_);
  apply_linear(L.key, xk, E, T, k_.data(), E, pool, hooks_);
  apply_linear(L.value, xv, E, T, v_.data(), E, pool, hooks_);
  apply_linear(L.gate, xg, E, T, g_.data(), E, pool, hooks_);
  apply_linear(L.decay_w1, xw, E, T, decay_lo_.data(), DD, pool, hooks_);
  for (float& v : std::span<float>(decay_lo_.data(), size_t(T * DD))) v = std::tanh(v);
  apply_linear(L.decay_w2, decay_lo_.data(), DD, T, w_.data(), E, pool, hooks_);
  pool.parallel_for(T, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t c = 0; c < E; ++c) {
        const size_t i = size_t(t * E + c);
        w_[i] = std::exp(-std::exp(w_[i] + L.decay[c]));
        const float g = g_[i];
        g_[i] = g / (1.0f + std::exp(-g));  // silu
      }
  });

  // The recurrence, heads in parallel, each sequence from its state.
  pool.parallel_for(H, [&](int64_t h0, int64_t h1, int) {
    int64_t t0 = 0;
    for (const auto& sq : seqs) {
      const int64_t n = int64_t(sq.tokens.size());
      const int64_t o = t0 * E;
      Wkv6Args a{r_.data() + o, k_.data() + o, v_.data() + o, w_.data() + o, E, L.first,
                 kv.state(il, sq.state_slot) + 2 * E, y_.data() + o, E, n, N};
      wkv6(a, h0, h1);
      t0 += n;
    }
  });
  // Group norm per head, then ln_x and the gate.
  pool.parallel_for(T, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t o = t * E + h * N;
        float* y = y_.data() + o;
        rwkv_group_norm_head(y, N);
        const float* g = g_.data() + o;
        for (int64_t j = 0; j < N; ++j) {
          const int64_t c = h * N + j;
          y[j] = (y[j] * L.ln_x[c] + L.ln_x_b[c]) * g[j];
        }
      }
  });
  apply_linear(L.output, y_.data(), E, T, tmp_.data(), E, pool, hooks_);
  add_inplace(x_.data(), tmp_.data(), T * E);
}

void Rwkv6Model::channel_mix(const Rwkv6Layer& L, int64_t il, std::span<const SeqBatch> seqs, KvStore& kv, int64_t T,
                             ThreadPool& pool) {
  const int64_t E = hp_.n_embd, F = hp_.n_ff;
  const size_t TE = size_t(T * E);
  rwkv_layer_norm(x_.data(), L.ffn_norm, L.ffn_norm_b, xn_.data(), T, E, hp_.rwkv.norm_eps, pool);
  rwkv_token_shift(seqs, kv, il, E, E, xn_.data(), L.cm_lerp.data(), 2, mix_.data(), T, nullptr, pool);
  apply_linear(L.cm_key, mix_.data(), E, T, ffn_.data(), F, pool, hooks_);
  pool.parallel_for(T, [&](int64_t t0, int64_t t1, int) {
    for (float& f : std::span<float>(ffn_.data() + t0 * F, size_t((t1 - t0) * F))) {
      const float v = std::max(f, 0.0f);
      f = v * v;
    }
  });
  apply_linear(L.cm_value, ffn_.data(), F, T, tmp_.data(), E, pool, hooks_);
  apply_linear(L.cm_receptance, mix_.data() + TE, E, T, r_.data(), E, pool, hooks_);
  pool.parallel_for(T, [&](int64_t t0, int64_t t1, int) {
    for (size_t i = size_t(t0 * E); i < size_t(t1 * E); ++i) x_[i] += sigmoid(r_[i]) * tmp_[i];
  });
}

}  // namespace

std::unique_ptr<Model> make_rwkv6(const ArchSpec& spec, std::shared_ptr<const GgufFile> file) {
  return std::make_unique<Rwkv6Model>(spec, std::move(file));
}

}  // namespace tern
