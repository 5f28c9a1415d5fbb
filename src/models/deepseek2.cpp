// DeepSeek-V2 / V3 ("deepseek2"): multi-head latent attention (MLA) as llama.cpp lays it out
// (attn_k_b / attn_v_b, current converters) and computes it (llm_build_deepseek2). Per layer, on
// xn = RMSNorm(x), with H heads, C = kv_lora_rank, rope = n_rot, nope = key_length_mla - rope,
// dv = value_length_mla:
//   q = attn_q xn, or attn_q_b RMSNorm(attn_q_a xn) (q_lora_rank > 0)    [H][nope | rope]
//   [c | k_pe] = attn_kv_a_mqa xn                     c: [C], k_pe: [rope], one for every head
//   c = RMSNorm(c) (attn_kv_a_norm);  q_pe, k_pe = RoPE (Norm layout, YaRN)
//   K_h = [k_b_h^T c | k_pe],  V_h = v_b_h c            (never formed on the absorbed path)
//   out_h = softmax(q_h . K_h * kq_scale) V_h;  x += attn_output [out_0 .. out_H-1]
// then the FFN: SwiGLU for the leading dense layers, else routed experts (softmax V2; sigmoid
// with the selection bias exp_probs_b V3; optionally group-limited) plus the shared experts.
//
// The absorbed path (what runs): q_nope is taken into the latent space through k_b per head,
//   Q_h = [k_b_h q_nope_h | q_pe_h]      (C + rope)
// so every head attends over the same cached row [c | k_pe] (MQA with one KV head of C + rope,
// the existing attention kernels, ops.h), whose first C columns are also the values: out_h's
// first C elements are the attention-weighted latent, which v_b_h takes to dv. The cache holds
// C + rope elements per token and layer (KvStore k_only), not H (nope + rope + dv).
//
// The non-absorbed path (TERN_MLA=full at load: the reference of the tests and the speed
// comparison in docs/models.md) decompresses K_h and V_h per head for the new tokens and
// caches them as such: H heads of key_length_mla (V padded to it) per token, the same kernels.
//
// kq_scale and the rotation's magnitude as llama.cpp computes them with YaRN (llama-context's
// yarn_attn_factor and deepseek2's mscale): the rotation unscaled, and
//   mscale = 1 + 0.1 * mscale_all_dim * ln(factor),  kq_scale = mscale^2 / sqrt(key_length_mla).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "models/linear.h"
#include "models/registry.h"
#include "models/tensor_names.h"
#include "models/weight_loader.h"
#include "ops/ops.h"
#include "quant/quant_traits.h"

namespace tern {
namespace {

struct MlaLayer {
  const float* attn_norm = nullptr;    // [n_embd]
  Linear q;                            // [n_embd -> H dk] (q_lora_rank = 0)
  Linear q_a;                          // [n_embd -> R]
  const float* q_a_norm = nullptr;     // [R]
  Linear q_b;                          // [R -> H dk]
  Linear kv_a;                         // [n_embd -> C + rope]
  const float* kv_a_norm = nullptr;    // [C]
  std::vector<Linear> k_b;             // [H] each [nope -> C]
  std::vector<Linear> v_b;             // [H] each [C -> dv]
  std::vector<float> k_b_f32, v_b_f32; // full-KV path only: [H][C][nope], [H][dv][C]
  Linear o;                            // [H dv -> n_embd]
  const float* ffn_norm = nullptr;     // [n_embd]
  Linear gate, up, down;               // dense FFN (leading layers)
  Linear router;                       // [n_embd -> n_expert]
  const float* probs_bias = nullptr;   // [n_expert] exp_probs_b (V3) or nullptr
  std::vector<Linear> eg, eu, ed;      // [n_expert] views of ffn_{gate,up,down}_exps
  Linear sh_gate, sh_up, sh_down;      // the shared experts as one SwiGLU of n_shared * n_ff_exp
  bool moe = false;
};

// TERN_MLA=full: the non-absorbed reference path (see the top of the file).
bool mla_full_from_env() {
  const char* v = std::getenv("TERN_MLA");
  return v && std::string(v) == "full";
}

// RoPE (Norm layout: pairs (2i, 2i+1)) of n_rot elements at x with one token's table row.
void mla_rope(float* x, const float* cs, int64_t n_rot) {
  for (int64_t i = 0; i < n_rot / 2; ++i) {
    const float c = cs[2 * i], s = cs[2 * i + 1];
    const float x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = x0 * c - x1 * s;
    x[2 * i + 1] = x0 * s + x1 * c;
  }
}

class MlaModel final : public Model {
 public:
  MlaModel(const ArchSpec& spec, std::shared_ptr<const GgufFile> file) : file_(std::move(file)) {
    (void)spec;
    hp_ = read_hparams(*file_);
    const HParams::Mla& m = hp_.mla;
    H_ = hp_.n_head;
    C_ = m.kv_lora_rank;
    R_ = hp_.n_rot;
    dk_ = m.head_dim_k;
    nope_ = dk_ - R_;
    dv_ = m.head_dim_v;
    D_ = C_ + R_;
    if (!hp_.uniform_layers()) fail(file_->path(), ": ", hp_.arch, " layers with different head counts are not supported");
    full_ = mla_full_from_env();
    if (full_) {
      if (dv_ > dk_)
        fail(file_->path(), ": TERN_MLA=full caches V padded to key_length_mla ", dk_, ", less than value_length_mla ", dv_);
      // The KV store the caller makes from hparams(): H heads of dk for K and for V.
      hp_.mla.full_kv = true;
      hp_.head_dim = dk_;
      hp_.n_head_kv = H_;
      hp_.n_head_kv_per_layer.assign(size_t(hp_.n_layer), H_);
    }
    set_rope();
    WeightLoader ld(file_);
    bind(ld);
    ld.start_loading();
    bind(ld);
    arena_ = ld.take_arena();
    extra_ = ld.take_extra();
    for (const auto& t : file_->tensors()) weight_bytes_ += int64_t(t.n_bytes);
    const auto stream = [&](const Linear& l) {
      if (l.present())
        decode_weight_memory_.emplace_back(static_cast<const uint8_t*>(l.w.data), size_t(l.w.n_out * l.w.row_bytes()));
    };
    for (const MlaLayer& L : layers_) {
      for (const Linear* l : {&L.q, &L.q_a, &L.q_b, &L.kv_a}) stream(*l);
      for (const Linear& l : L.k_b) stream(l);
      for (const Linear& l : L.v_b) stream(l);
      for (const Linear* l : {&L.o, &L.gate, &L.up, &L.down, &L.router, &L.sh_gate, &L.sh_up, &L.sh_down}) stream(*l);
      for (size_t e = 0; e < L.eg.size(); ++e)
        for (const Linear* l : {&L.eg[e], &L.eu[e], &L.ed[e]}) stream(*l);
    }
    stream(output_);
  }

  void check_lora(const LoraAdapter& adapter) const override {
    fail(adapter.path(), ": LoRA adapters on ", hp_.arch, " (latent-attention) models are not supported yet");
  }
  // (KV eviction: the cache holds latents, not per-head keys, so evicting policies are refused by
  // check_policy_for_model, runtime/evicting_seq.cpp, naming the reason.)

  void reserve(int64_t n_tokens) override {
    if (n_tokens <= max_tokens_) return;
    max_tokens_ = n_tokens;
    const size_t T = size_t(n_tokens), E = size_t(hp_.n_embd);
    const size_t row = size_t(full_ ? H_ * dk_ : D_);
    x_.assign(T * E, 0.0f);
    xn_.assign(T * E, 0.0f);
    qa_.assign(T * size_t(std::max<int64_t>(1, hp_.mla.q_lora_rank)), 0.0f);
    q_.assign(T * size_t(H_ * dk_), 0.0f);
    kva_.assign(T * size_t(D_), 0.0f);
    lat_.assign(T * size_t(C_), 0.0f);
    kq_.assign(T * size_t(H_ * std::max(D_, dk_)), 0.0f);
    o_.assign(T * size_t(H_ * std::max(D_, dk_)), 0.0f);
    krow_.assign(T * row, 0.0f);
    vrow_.assign(full_ ? T * row : 0, 0.0f);
    attn_.assign(T * size_t(H_ * dv_), 0.0f);
    const size_t F = size_t(std::max({hp_.n_ff, hp_.n_ff_exp, hp_.n_ff_shexp}));
    gate_.assign(T * F, 0.0f);
    up_.assign(T * F, 0.0f);
    y_.assign(T * E, 0.0f);
    moe_out_.assign(T * E, 0.0f);
    moe_x_.assign(T * E, 0.0f);
    router_.assign(T * size_t(std::max<int64_t>(1, hp_.n_expert)), 0.0f);
    chosen_.assign(T * size_t(std::max<int64_t>(1, hp_.n_expert_used)), 0);
    chosen_w_.assign(T * size_t(std::max<int64_t>(1, hp_.n_expert_used)), 0.0f);
    positions_.assign(T, 0);
    rope_cs_.assign(T * size_t(R_), 0.0f);
    out_rows_.assign(T * E, 0.0f);
  }
  int64_t max_step_tokens() const override { return max_tokens_; }

  void forward(std::span<const SeqBatch> seqs, KvStore& kv, float* logits, ThreadPool& pool) override;

 private:
  void set_rope();
  void bind(WeightLoader& ld);
  void attention_layer(const MlaLayer& L, int64_t il, std::span<const SeqBatch> seqs, KvStore& kv, int64_t T,
                       ThreadPool& pool);
  void ffn_layer(const MlaLayer& L, int64_t T, ThreadPool& pool);
  void route(const MlaLayer& L, int64_t T);
  void swiglu_ffn(const Linear& g, const Linear& u, const Linear& d, const float* x, int64_t n, float* y,
                  ThreadPool& pool);
  // f32 copy of a 3-D [n_in, n_out, H] tensor, per head [n_out][n_in] (the full-KV path).
  std::vector<float> f32_copy(const std::string& name) const;

  std::shared_ptr<const GgufFile> file_;
  HugeBuffer arena_;
  std::vector<HugeBuffer> extra_;
  WeightView tok_embd_;
  Linear output_;
  const float* output_norm_ = nullptr;
  std::vector<MlaLayer> layers_;
  int64_t H_ = 0, C_ = 0, R_ = 0, dk_ = 0, nope_ = 0, dv_ = 0, D_ = 0;
  bool full_ = false;
  RopeParams rope_;
  float kq_scale_ = 1.0f;
  int64_t max_tokens_ = 0;
  LinearHooks hooks_;
  // Scratch sized by reserve(); T = the step's tokens.
  std::vector<float> x_, xn_;   // [T, n_embd] residual stream; a block's normalised input / output
  std::vector<float> qa_;       // [T, R] the compressed query
  std::vector<float> q_;        // [T, H dk] queries, [nope | rope] per head
  std::vector<float> kva_;      // [T, C + rope] attn_kv_a_mqa's output
  std::vector<float> lat_;      // [T, C] the normalised latent
  std::vector<float> kq_;       // [T, H (C + rope)] absorbed queries (full: [T, H dk])
  std::vector<float> o_;        // [T, H (C + rope)] attention output (full: [T, H dk])
  std::vector<float> krow_, vrow_;  // [T, cache row] new K (and full: V) rows
  std::vector<float> attn_;     // [T, H dv] per-head values before attn_output
  std::vector<float> gate_, up_;    // [T, F]
  std::vector<float> y_, moe_out_, moe_x_;  // [T, n_embd]
  std::vector<float> router_;   // [T, n_expert]
  std::vector<int32_t> chosen_; // [T, n_expert_used]
  std::vector<float> chosen_w_; // [T, n_expert_used]
  std::vector<int32_t> positions_;
  std::vector<float> rope_cs_;  // [T][rope / 2][2]
  std::vector<float> out_rows_; // [rows needing logits, n_embd]
  std::vector<AttentionArgs> attn_args_;
};

void MlaModel::set_rope() {
  const RopeScaling& rs = hp_.rope_scaling;
  rope_.n_rot = R_;
  rope_.freq_base = hp_.rope_freq_base;
  float factor = 1.0f;
  if (rs.kind != RopeScaling::Kind::None) {
    factor = rs.factor;
    rope_.freq_scale = 1.0f / rs.factor;
    rope_.ext_factor = rs.ext_factor;
    rope_.beta_fast = rs.beta_fast;
    rope_.beta_slow = rs.beta_slow;
    rope_.n_ctx_orig = rs.n_ctx_orig;
  }
  // llama-context's yarn_attn_factor: get_mscale(f, mscale) / get_mscale(f, mscale_all_dim) with
  // mscale = mscale_all_dim for deepseek2 (so 1), or get_mscale(f, 1) without yarn_log_multiplier;
  // then the factor ggml's rope multiplies in (1 + 0.1 ln f) is cancelled.
  const float lnf = std::log(factor);
  const auto get_mscale = [&](float m) { return factor <= 1.0f ? 1.0f : 0.1f * m * lnf + 1.0f; };
  float attn_factor = rs.attn_factor;
  if (rope_.ext_factor != 0.0f) {
    attn_factor = hp_.mla.yarn_log_mul != 0.0f ? 1.0f : get_mscale(1.0f);
    attn_factor *= 1.0f / (1.0f + 0.1f * lnf);
  }
  rope_.attn_factor = attn_factor;
  // deepseek2's kq_scale, from the attn_factor before that cancellation.
  const float attn_factor_org = attn_factor * (1.0f + 0.1f * lnf);
  const float mscale = attn_factor_org * (1.0f + 0.1f * hp_.mla.yarn_log_mul * lnf);
  kq_scale_ = mscale * mscale / std::sqrt(float(dk_));
}

std::vector<float> MlaModel::f32_copy(const std::string& name) const {
  const GgufTensorInfo* t = file_->find_tensor(name);
  const QuantTraits& q = require_quant_traits(t->type, name.c_str());
  const int64_t n_in = t->ne[0], rows = t->n_rows(), rb = dtype_row_bytes(t->type, n_in);
  std::vector<float> out(size_t(n_in * rows));
  for (int64_t r = 0; r < rows; ++r) q.to_float(t->data + r * rb, out.data() + r * n_in, n_in);
  return out;
}

void MlaModel::bind(WeightLoader& ld) {
  const int64_t E = hp_.n_embd, V = hp_.n_vocab, NE = hp_.n_expert, FX = hp_.n_ff_exp;
  const int64_t QR = hp_.mla.q_lora_rank;
  const std::string& p = file_->path();
  output_norm_ = ld.vector(tensor_name(Tensor::OutputNorm), E, "norm weights");
  if (ld.has(tensor_name(Tensor::Output))) {
    tok_embd_ = ld.rows(tensor_name(Tensor::TokenEmbd), E, V);
    output_ = Linear{tensor_name(Tensor::Output), ld.matmul(tensor_name(Tensor::Output), E, V)};
  } else {
    tok_embd_ = ld.matmul(tensor_name(Tensor::TokenEmbd), E, V);  // tied (see decoder.cpp)
    output_ = Linear{tensor_name(Tensor::TokenEmbd), tok_embd_};
  }
  const auto lin = [&](Tensor t, int64_t il, int64_t n_in, int64_t n_out) {
    const std::string n = tensor_name(t, il);
    return Linear{n, ld.matmul(n, n_in, n_out)};
  };
  layers_.assign(size_t(hp_.n_layer), MlaLayer{});
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    MlaLayer& L = layers_[size_t(il)];
    L.attn_norm = ld.vector(tensor_name(Tensor::AttnNorm, il), E, "norm weights");
    if (QR > 0) {
      if (!ld.has(tensor_name(Tensor::AttnQA, il)))
        fail(p, ": ", hp_.arch, ".attention.q_lora_rank is ", QR, " but ", tensor_name(Tensor::AttnQA, il),
             " is missing");
      L.q_a = lin(Tensor::AttnQA, il, E, QR);
      L.q_a_norm = ld.vector(tensor_name(Tensor::AttnQANorm, il), QR, "norm weights");
      L.q_b = lin(Tensor::AttnQB, il, QR, H_ * dk_);
    } else {
      if (!ld.has(tensor_name(Tensor::AttnQ, il)))
        fail(p, ": ", tensor_name(Tensor::AttnQ, il), " is missing (", hp_.arch,
             ".attention.q_lora_rank is absent: queries straight from attn_q, as in DeepSeek-V2-Lite)");
      L.q = lin(Tensor::AttnQ, il, E, H_ * dk_);
    }
    L.kv_a = lin(Tensor::AttnKvAMqa, il, E, D_);
    L.kv_a_norm = ld.vector(tensor_name(Tensor::AttnKvANorm, il), C_, "norm weights");
    const std::string kb = tensor_name(Tensor::AttnKB, il), vb = tensor_name(Tensor::AttnVB, il);
    if (!ld.has(kb) || !ld.has(vb)) {
      if (ld.has(tensor_name(Tensor::AttnKvB, il)))
        fail(p, ": ", tensor_name(Tensor::AttnKvB, il), " is the older layout; tern needs ", kb, " and ", vb,
             " (reconvert with a current llama.cpp convert_hf_to_gguf.py)");
      fail(p, ": ", ld.has(kb) ? vb : kb, " is missing");
    }
    L.k_b.clear();
    L.v_b.clear();
    for (int64_t h = 0; h < H_; ++h) {
      L.k_b.push_back(Linear{kb, ld.matmul(kb, nope_, C_, 0, C_, h, H_), nullptr, h == 0, h * C_});
      L.v_b.push_back(Linear{vb, ld.matmul(vb, C_, dv_, 0, dv_, h, H_), nullptr, h == 0, h * dv_});
    }
    if (full_ && L.k_b_f32.empty()) {
      L.k_b_f32 = f32_copy(kb);
      L.v_b_f32 = f32_copy(vb);
    }
    L.o = lin(Tensor::AttnOutput, il, H_ * dv_, E);
    L.ffn_norm = ld.vector(tensor_name(Tensor::FfnNorm, il), E, "norm weights");
    L.moe = il >= hp_.mla.n_dense_lead;
    if (!L.moe) {
      const int64_t F = hp_.ff_length(il);
      L.gate = lin(Tensor::FfnGate, il, E, F);
      L.up = lin(Tensor::FfnUp, il, E, F);
      L.down = lin(Tensor::FfnDown, il, F, E);
      continue;
    }
    L.router = lin(Tensor::FfnGateInp, il, E, NE);
    L.probs_bias = ld.optional_vector(tensor_name(Tensor::FfnExpProbsB, il, "bias"), NE, "expert selection biases");
    L.eg.clear();
    L.eu.clear();
    L.ed.clear();
    const std::string g = tensor_name(Tensor::FfnGateExps, il), u = tensor_name(Tensor::FfnUpExps, il),
                      d = tensor_name(Tensor::FfnDownExps, il);
    for (int64_t e = 0; e < NE; ++e) {
      L.eg.push_back(Linear{g, ld.matmul(g, E, FX, 0, FX, e, NE), nullptr, false});
      L.eu.push_back(Linear{u, ld.matmul(u, E, FX, 0, FX, e, NE), nullptr, false});
      L.ed.push_back(Linear{d, ld.matmul(d, FX, E, 0, E, e, NE), nullptr, false});
    }
    if (hp_.n_ff_shexp > 0) {
      L.sh_gate = lin(Tensor::FfnGateShexp, il, E, hp_.n_ff_shexp);
      L.sh_up = lin(Tensor::FfnUpShexp, il, E, hp_.n_ff_shexp);
      L.sh_down = lin(Tensor::FfnDownShexp, il, hp_.n_ff_shexp, E);
    }
  }
}

void MlaModel::forward(std::span<const SeqBatch> seqs, KvStore& kv, float* logits, ThreadPool& pool) {
  const int64_t E = hp_.n_embd, V = hp_.n_vocab;
  int64_t T = 0;
  for (const auto& s : seqs) {
    TERN_ASSERT(int64_t(s.slots.size()) >= s.n_past + int64_t(s.tokens.size()));
    T += int64_t(s.tokens.size());
  }
  if (T == 0) return;
  TERN_ASSERT_MSG(T <= max_tokens_, "step larger than reserve()");
  TERN_ASSERT_MSG(kv.k_only() == !full_, "the KV store does not match the model's cache layout (make_kv_store)");
  int64_t t = 0;
  for (const auto& s : seqs)
    for (int64_t i = 0; i < int64_t(s.tokens.size()); ++i) {
      const int32_t id = s.tokens[size_t(i)];
      TERN_ASSERT_MSG(id >= 0 && id < V, "token id out of range");
      dequantize_row(tok_embd_, id, x_.data() + t * E);
      positions_[size_t(t++)] = int32_t(s.first_pos() + i);
    }
  rope_table_ext(positions_.data(), T, rope_, rope_cs_.data());
  hooks_ = LinearHooks{observer_, nullptr};
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    attention_layer(layers_[size_t(il)], il, seqs, kv, T, pool);
    ffn_layer(layers_[size_t(il)], T, pool);
  }

  // The rows that need logits (every token's, or each sequence's last), through the output norm.
  int64_t rows = 0;
  t = 0;
  for (const auto& s : seqs) {
    const int64_t n = int64_t(s.tokens.size());
    if (s.hidden && n > 0) rms_norm(x_.data() + t * E, output_norm_, s.hidden, n, E, hp_.rms_eps, pool);
    const int64_t first = s.all_logits ? t : t + n - 1;
    for (int64_t r = first; r < t + n; ++r) std::copy_n(x_.data() + r * E, E, out_rows_.data() + (rows++) * E);
    t += n;
  }
  rms_norm(out_rows_.data(), output_norm_, out_rows_.data(), rows, E, hp_.rms_eps, pool);
  apply_linear(output_, out_rows_.data(), E, rows, logits, V, pool, hooks_);
}

void MlaModel::attention_layer(const MlaLayer& L, int64_t il, std::span<const SeqBatch> seqs, KvStore& kv,
                               int64_t T, ThreadPool& pool) {
  const int64_t E = hp_.n_embd, QW = H_ * dk_;
  rms_norm(x_.data(), L.attn_norm, xn_.data(), T, E, hp_.rms_eps, pool);
  if (L.q_a.present()) {
    const int64_t QR = hp_.mla.q_lora_rank;
    apply_linear(L.q_a, xn_.data(), E, T, qa_.data(), QR, pool, hooks_);
    rms_norm(qa_.data(), L.q_a_norm, qa_.data(), T, QR, hp_.rms_eps, pool);
    apply_linear(L.q_b, qa_.data(), QR, T, q_.data(), QW, pool, hooks_);
  } else {
    apply_linear(L.q, xn_.data(), E, T, q_.data(), QW, pool, hooks_);
  }
  apply_linear(L.kv_a, xn_.data(), E, T, kva_.data(), D_, pool, hooks_);
  // The latent through attn_kv_a_norm; the shared key's and every head's rope part rotated.
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(kva_.data() + t * D_, C_, lat_.data() + t * C_);
    const float* cs = rope_cs_.data() + t * R_;
    mla_rope(kva_.data() + t * D_ + C_, cs, R_);
    for (int64_t h = 0; h < H_; ++h) mla_rope(q_.data() + t * QW + h * dk_ + nope_, cs, R_);
  }
  rms_norm(lat_.data(), L.kv_a_norm, lat_.data(), T, C_, hp_.rms_eps, pool);

  int64_t ldq = 0, head_dim = 0, n_head_kv = 0;
  if (!full_) {
    // Absorbed: Q_h = [k_b_h q_nope_h | q_pe_h]; the cache row [c | k_pe].
    ldq = H_ * D_;
    head_dim = D_;
    n_head_kv = 1;
    for (int64_t h = 0; h < H_; ++h)
      apply_linear(L.k_b[size_t(h)], q_.data() + h * dk_, QW, T, kq_.data() + h * D_, ldq, pool, hooks_);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H_; ++h)
        std::copy_n(q_.data() + t * QW + h * dk_ + nope_, R_, kq_.data() + t * ldq + h * D_ + C_);
      float* row = krow_.data() + t * D_;
      std::copy_n(lat_.data() + t * C_, C_, row);
      std::copy_n(kva_.data() + t * D_ + C_, R_, row + C_);
    }
  } else {
    // Non-absorbed: K_h = [k_b_h^T c | k_pe], V_h = [v_b_h c | 0] for the new tokens, cached.
    ldq = QW;
    head_dim = dk_;
    n_head_kv = H_;
    std::copy_n(q_.data(), T * QW, kq_.data());
    pool.parallel_for(T * H_, [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t t = r / H_, h = r % H_;
        const float* c = lat_.data() + t * C_;
        float* k = krow_.data() + t * QW + h * dk_;
        float* v = vrow_.data() + t * QW + h * dk_;
        const float* kb = L.k_b_f32.data() + h * C_ * nope_;  // [C][nope]
        for (int64_t d = 0; d < nope_; ++d) k[d] = 0.0f;
        for (int64_t ci = 0; ci < C_; ++ci)
          for (int64_t d = 0; d < nope_; ++d) k[d] += kb[ci * nope_ + d] * c[ci];
        std::copy_n(kva_.data() + t * D_ + C_, R_, k + nope_);
        const float* vb = L.v_b_f32.data() + h * dv_ * C_;  // [dv][C]
        for (int64_t j = 0; j < dv_; ++j) {
          float acc = 0.0f;
          for (int64_t ci = 0; ci < C_; ++ci) acc += vb[j * C_ + ci] * c[ci];
          v[j] = acc;
        }
        std::fill(v + dv_, v + dk_, 0.0f);
      }
    });
  }
  const int64_t row = n_head_kv * head_dim;
  attn_args_.clear();
  int64_t t = 0;
  for (const auto& s : seqs) {
    const int64_t n = int64_t(s.tokens.size());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t slot = s.slots[size_t(s.n_past + i)];
      const float* k = krow_.data() + (t + i) * row;
      kv.store(il, slot, 0, k, full_ ? vrow_.data() + (t + i) * row : k, row);
    }
    attn_args_.push_back(AttentionArgs{kq_.data() + t * ldq, ldq, o_.data() + t * ldq, ldq, kv.k(il), kv.v(il), row,
                                       s.slots.data(), s.n_past, n, H_, n_head_kv, head_dim, kq_scale_, kv.type()});
    t += n;
  }
  attention(attn_args_, pool);
  kv.seal_due(il);  // kivi2: the groups this step completed (KvStore::seal_due)
  if (!full_) {
    for (int64_t h = 0; h < H_; ++h)
      apply_linear(L.v_b[size_t(h)], o_.data() + h * D_, ldq, T, attn_.data() + h * dv_, H_ * dv_, pool, hooks_);
  } else {
    for (int64_t tt = 0; tt < T; ++tt)
      for (int64_t h = 0; h < H_; ++h)
        std::copy_n(o_.data() + tt * ldq + h * dk_, dv_, attn_.data() + tt * H_ * dv_ + h * dv_);
  }
  apply_linear(L.o, attn_.data(), H_ * dv_, T, xn_.data(), E, pool, hooks_);
  add_inplace(x_.data(), xn_.data(), T * E);
}

void MlaModel::swiglu_ffn(const Linear& g, const Linear& u, const Linear& d, const float* x, int64_t n, float* y,
                          ThreadPool& pool) {
  const int64_t E = hp_.n_embd, F = g.w.n_out;
  apply_linear(g, x, E, n, gate_.data(), F, pool, hooks_);
  apply_linear(u, x, E, n, up_.data(), F, pool, hooks_);
  swiglu(gate_.data(), up_.data(), gate_.data(), n * F, pool);
  apply_linear(d, gate_.data(), F, n, y, E, pool, hooks_);
}

// llama.cpp's build_moe_ffn for deepseek2: probabilities (softmax / sigmoid) of the router's
// logits; the selection adds exp_probs_b (V3) and, with expert groups, keeps the n_group_used
// groups whose two best experts score highest; the top n_expert_used by selection score, weighted
// by their probabilities (renormalised when expert_weights_norm, times expert_weights_scale).
void MlaModel::route(const MlaLayer& L, int64_t T) {
  const int64_t NE = hp_.n_expert, K = hp_.n_expert_used;
  const int64_t G = hp_.mla.n_expert_groups, GU = hp_.mla.n_group_used;
  std::vector<float> sel(static_cast<size_t>(NE));
  std::vector<int32_t> order(static_cast<size_t>(NE));
  std::vector<float> gscore(size_t(std::max<int64_t>(G, 1)));
  std::vector<int32_t> gorder(size_t(std::max<int64_t>(G, 1)));
  for (int64_t t = 0; t < T; ++t) {
    float* p = router_.data() + t * NE;
    if (hp_.expert_gating == ExpertGating::Softmax) {
      const float mx = *std::max_element(p, p + NE);
      float sum = 0.0f;
      for (int64_t e = 0; e < NE; ++e) sum += (p[e] = std::exp(p[e] - mx));
      for (int64_t e = 0; e < NE; ++e) p[e] /= sum;
    } else if (hp_.expert_gating == ExpertGating::Sigmoid) {
      for (int64_t e = 0; e < NE; ++e) p[e] = 1.0f / (1.0f + std::exp(-p[e]));
    }
    for (int64_t e = 0; e < NE; ++e) sel[size_t(e)] = p[e] + (L.probs_bias ? L.probs_bias[e] : 0.0f);
    if (G > 1) {
      const int64_t per = NE / G;
      for (int64_t g = 0; g < G; ++g) {
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int64_t e = g * per; e < (g + 1) * per; ++e) {
          const float v = sel[size_t(e)];
          if (v > b1) b2 = b1, b1 = v;
          else if (v > b2) b2 = v;
        }
        gscore[size_t(g)] = b1 + b2;
      }
      std::iota(gorder.begin(), gorder.end(), 0);
      std::partial_sort(gorder.begin(), gorder.begin() + GU, gorder.end(), [&](int32_t a, int32_t b) {
        return gscore[size_t(a)] > gscore[size_t(b)] || (gscore[size_t(a)] == gscore[size_t(b)] && a < b);
      });
      std::vector<uint8_t> keep(size_t(G), 0);
      for (int64_t j = 0; j < GU; ++j) keep[size_t(gorder[size_t(j)])] = 1;
      for (int64_t e = 0; e < NE; ++e)
        if (!keep[size_t(e / per)]) sel[size_t(e)] = -INFINITY;
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t b) {
      return sel[size_t(a)] > sel[size_t(b)] || (sel[size_t(a)] == sel[size_t(b)] && a < b);
    });
    float* w = chosen_w_.data() + t * K;
    for (int64_t j = 0; j < K; ++j) {
      chosen_[size_t(t * K + j)] = order[size_t(j)];
      w[j] = p[order[size_t(j)]];
    }
    if (hp_.expert_gating == ExpertGating::SoftmaxWeight) {
      const float mx = *std::max_element(w, w + K);
      float sum = 0.0f;
      for (int64_t j = 0; j < K; ++j) sum += (w[j] = std::exp(w[j] - mx));
      for (int64_t j = 0; j < K; ++j) w[j] /= sum;
    }
    if (hp_.expert_norm_topk) {
      float sum = 0.0f;
      for (int64_t j = 0; j < K; ++j) sum += w[j];
      sum = std::max(sum, 6.103515625e-5f);  // (llama.cpp's clamp)
      for (int64_t j = 0; j < K; ++j) w[j] /= sum;
    }
    if (hp_.mla.expert_weights_scale != 0.0f)
      for (int64_t j = 0; j < K; ++j) w[j] *= hp_.mla.expert_weights_scale;
  }
}

void MlaModel::ffn_layer(const MlaLayer& L, int64_t T, ThreadPool& pool) {
  const int64_t E = hp_.n_embd, NE = hp_.n_expert, K = hp_.n_expert_used;
  rms_norm(x_.data(), L.ffn_norm, xn_.data(), T, E, hp_.rms_eps, pool);
  if (!L.moe) {
    swiglu_ffn(L.gate, L.up, L.down, xn_.data(), T, y_.data(), pool);
    add_inplace(x_.data(), y_.data(), T * E);
    return;
  }
  apply_linear(L.router, xn_.data(), E, T, router_.data(), NE, pool, hooks_);
  route(L, T);
  std::fill_n(moe_out_.begin(), T * E, 0.0f);
  std::vector<int32_t> rows;
  std::vector<float> weights;
  for (int64_t e = 0; e < NE; ++e) {
    rows.clear();
    weights.clear();
    for (int64_t i = 0; i < T * K; ++i)
      if (chosen_[size_t(i)] == e) {
        rows.push_back(int32_t(i / K));
        weights.push_back(chosen_w_[size_t(i)]);
      }
    if (rows.empty()) continue;
    const int64_t n = int64_t(rows.size());
    for (int64_t r = 0; r < n; ++r) std::copy_n(xn_.data() + rows[size_t(r)] * E, E, moe_x_.data() + r * E);
    swiglu_ffn(L.eg[size_t(e)], L.eu[size_t(e)], L.ed[size_t(e)], moe_x_.data(), n, y_.data(), pool);
    for (int64_t r = 0; r < n; ++r) {
      float* out = moe_out_.data() + rows[size_t(r)] * E;
      const float* y = y_.data() + r * E;
      const float w = weights[size_t(r)];
      for (int64_t c = 0; c < E; ++c) out[c] += w * y[c];
    }
  }
  if (L.sh_gate.present()) {
    swiglu_ffn(L.sh_gate, L.sh_up, L.sh_down, xn_.data(), T, y_.data(), pool);
    add_inplace(moe_out_.data(), y_.data(), T * E);
  }
  add_inplace(x_.data(), moe_out_.data(), T * E);
}

}  // namespace

std::unique_ptr<Model> make_deepseek2(const ArchSpec& spec, std::shared_ptr<const GgufFile> file) {
  return std::make_unique<MlaModel>(spec, std::move(file));
}

}  // namespace tern
